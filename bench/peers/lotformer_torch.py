#!/usr/bin/python3
"""lotformer_torch: a PyTorch operator port, now the package module birkhoff._port_lotformer
(python/birkhoff/_port_lotformer.py); this name is that module (see _twin.py), kept for
the tests, benchmarks and scripts that import it from bench/peers.

  /usr/bin/python3 bench/peers/lotformer_torch.py        (its self-check)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _twin  # noqa: E402

_twin.alias(__name__, "_port_lotformer")
