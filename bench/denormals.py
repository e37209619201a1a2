#!/usr/bin/python3
"""Does birkhoff's speed depend on the caller's floating-point mode?

Soft-sort ESP at a small SoftSort temperature (t = 1e-3) makes many entries of its soft
permutations tiny; computed without flush-to-zero they are subnormal floats, which cost ~100
cycles per operation on x86. The library sets flush-to-zero / denormals-are-zero inside its own
parallel regions and restores the caller's mode afterwards, so its speed (and its results) must
be the same whether the caller flushes subnormals (torch.set_flush_denormal(True)) or not.

Times forward + backward of birkhoff.esp(sort="soft", t=1e-3) under both caller modes,
alternating, median of --reps, and checks that the outputs are bitwise equal. The upstream
gradient is subnormal by default (--dout-scale 1e-39), so that the backward meets subnormals
whatever the CPU's exp does. How much a subnormal costs depends on the CPU (large on Intel
cores, small on AMD Zen): compare the ratio, and run the old library (--lib) on the same machine.

  /usr/bin/python3 bench/denormals.py [--lib build/libbirkhoff.so] [--n 512] [--threads 2]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--lib", default=None, help="libbirkhoff.so to load (default: the source tree's build)")
ap.add_argument("--n", type=int, default=512)
ap.add_argument("--bh", type=int, default=4, help="problems (B*H)")
ap.add_argument("--d", type=int, default=32)
ap.add_argument("--t", type=float, default=1e-3, help="SoftSort temperature")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--reps", type=int, default=7)
ap.add_argument("--dout-scale", type=float, default=1e-39,
                help="scale of the upstream gradient (default 1e-39: subnormal, as tiny gradients late in "
                     "training are; 1 for ordinary values)")
a = ap.parse_args()
if a.lib:
    os.environ["BIRKHOFF_LIB"] = os.path.abspath(a.lib)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch  # noqa: E402
import birkhoff as bk  # noqa: E402

bk.set_num_threads(a.threads)
rng = np.random.default_rng(0)
f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
q, k, v = f(1, a.bh, a.n, a.d), f(1, a.bh, a.n, a.d), f(1, a.bh, a.n, a.d)
do = f(1, a.bh, a.n, a.d) * np.float32(a.dout_scale)
kw = {"sort": "soft", "t": a.t}


def step():
    fw = bk.esp(q, k, v, **kw)
    g = bk.esp_backward(q, k, v, do, fw.tape, **kw)
    return fw.out, g


times = {True: [], False: []}
outs = {}
for ftz in (True, False):  # warm-up
    torch.set_flush_denormal(ftz)
    outs[ftz] = step()
for _ in range(a.reps):
    for ftz in (True, False):
        torch.set_flush_denormal(ftz)
        t0 = time.perf_counter()
        step()
        times[ftz].append(time.perf_counter() - t0)
torch.set_flush_denormal(False)
same = outs[True][0].tobytes() == outs[False][0].tobytes() and all(
    x.tobytes() == y.tobytes() for x, y in zip(outs[True][1], outs[False][1]) if isinstance(x, np.ndarray))
m_on, m_off = statistics.median(times[True]), statistics.median(times[False])
print(f"library: {bk.LIBRARY_PATH} ({bk.isa()}, {a.threads} threads)")
print(f"soft ESP t={a.t:g}, B*H={a.bh}, N={a.n}, d={a.d}, dout scale {a.dout_scale:g}, forward+backward, "
      f"median of {a.reps}:")
print(f"  caller flushes subnormals (torch.set_flush_denormal(True)):  {1e3 * m_on:8.2f} ms")
print(f"  caller does not (the default):                              {1e3 * m_off:8.2f} ms")
print(f"  ratio not-flushed / flushed: {m_off / m_on:.2f}   outputs bitwise equal: {same}")
