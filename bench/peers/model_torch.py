#!/usr/bin/python3
"""model_torch: the PyTorch twin of the training engine (docs/MODEL.md), now the package module birkhoff.models
(python/birkhoff/models.py); this name is that module (see _twin.py), kept for
the tests, benchmarks and scripts that import it from bench/peers.

  /usr/bin/python3 bench/peers/model_torch.py --self-check | --bench ...  (birkhoff.models.main)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _twin  # noqa: E402

_twin.alias(__name__, "models")
