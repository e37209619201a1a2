#!/usr/bin/python3
"""PyTorch peer benchmark: softmax and Sinkformer attention on the CPU.

Usage:
  /usr/bin/python3 bench/peers/torch_peer.py --op softmax|sinkhorn \
      --cases "BH:N:d:S,BH:N:d:S,..." --threads T --reps R --warmup W [--json]

Each case is B=1, H=BH heads of N x N self-attention with head dim d (dv = d)
and S Sinkhorn half-steps (ignored for softmax). q, k, v are float32
[1, BH, N, d] N(0,1) tensors with requires_grad; the implementation is the
reference-faithful port in sinkformer_torch.py (scale d^-1/2, eps = 1,
float32 marginals, increment update, per-half-step early-stop check with
thresh 1e-12, autograd through the unrolled loop).

Measured per case, with time.perf_counter over R repetitions after W
warm-ups (median and 25/75 percentiles, seconds):
  * forward only, under torch.no_grad();
  * forward + backward (out.backward(dout)).
Also: the bytes autograd saves for backward, from saved_tensors_hooks (sum of
numel * element_size over saved tensors, each distinct storage counted once,
with and without the q/k/v inputs themselves), and the process peak RSS
(getrusage; cumulative over the cases run so far).

--json prints one JSON object per case per line; otherwise a table.
"""

import argparse
import json
import os
import platform
import resource
import sys
import time

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch attention peer benchmark")
    ap.add_argument("--op", required=True, choices=["softmax", "sinkhorn"])
    ap.add_argument("--cases", required=True, help='comma list of "BH:N:d:S"')
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    a = ap.parse_args(argv)
    if a.threads < 1 or a.reps < 1 or a.warmup < 0:
        ap.error("need --threads >= 1, --reps >= 1, --warmup >= 0")
    cases = []
    for item in a.cases.split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        if len(parts) != 4:
            ap.error(f"bad case {item!r}: expected BH:N:d:S")
        try:
            bh, n, d, s = (int(x) for x in parts)
        except ValueError:
            ap.error(f"bad case {item!r}: expected integers")
        if min(bh, n, d, s) < 1:
            ap.error(f"bad case {item!r}: all fields must be >= 1")
        cases.append((bh, n, d, s))
    if not cases:
        ap.error("no cases given")
    a.case_list = cases
    return a


ARGS = parse_args()
# Thread pools are sized when torch (and its OpenMP/BLAS) load: set the
# environment first, then import.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sinkformer_torch as port  # noqa: E402  (same directory as this script)

torch.set_num_threads(ARGS.threads)
try:
    torch.set_num_interop_threads(1)
except RuntimeError:
    pass  # already set (only possible before any parallel work)


def make_fn(op, S):
    """The timed callable: (q, k, v) -> out [1, BH, N, d]."""
    if op == "softmax":
        return lambda q, k, v: port.softmax_attention(q, k, v)[0]
    return lambda q, k, v: port.attention(q, k, v, S)[0]


def saved_bytes(fn, q, k, v):
    """Bytes autograd keeps for backward: (all saved, saved minus q/k/v).

    Every tensor packed by saved_tensors_hooks during one forward is recorded
    by its storage; a storage saved several times (or through several views)
    counts once, with the largest numel * element_size seen for it.
    """
    seen = {}

    def pack(t):
        key = t.storage().data_ptr()
        seen[key] = max(seen.get(key, 0), t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(q, k, v)
    del out
    total = sum(seen.values())
    inputs = {t.storage().data_ptr() for t in (q, k, v)}
    return total, total - sum(b for p, b in seen.items() if p in inputs)


def quartiles(ts):
    p25, med, p75 = np.percentile(np.asarray(ts), [25, 50, 75])
    return float(med), float(p25), float(p75)


def peak_rss_bytes():
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) * (1 if sys.platform == "darwin" else 1024)  # KiB on Linux


def run_case(op, bh, n, d, S, reps, warmup, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, bh, n, d, generator=g).requires_grad_(True)
               for _ in range(3))
    dout = torch.randn(1, bh, n, d, generator=g)
    fn = make_fn(op, S)

    def fwd():
        with torch.no_grad():
            fn(q, k, v)

    def fwd_bwd():
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).backward(dout)

    res = {}
    for name, f in (("fwd", fwd), ("fwdbwd", fwd_bwd)):
        for _ in range(warmup):
            f()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        res[name] = quartiles(ts)
    sb_all, sb_noinp = saved_bytes(fn, q, k, v)
    return {
        "peer": "torch", "op": op, "B": 1, "H": bh, "BH": bh, "N": n, "d": d,
        "S": S if op == "sinkhorn" else None,
        "threads": ARGS.threads, "reps": reps, "warmup": warmup,
        "fwd_median_s": res["fwd"][0], "fwd_p25_s": res["fwd"][1],
        "fwd_p75_s": res["fwd"][2],
        "fwdbwd_median_s": res["fwdbwd"][0], "fwdbwd_p25_s": res["fwdbwd"][1],
        "fwdbwd_p75_s": res["fwdbwd"][2],
        "saved_bytes": sb_all, "saved_bytes_excl_inputs": sb_noinp,
        "peak_rss_bytes": peak_rss_bytes(),
        "torch": torch.__version__, "python": platform.python_version(),
    }


def main():
    rows = []
    if not ARGS.json:
        print(f"torch {torch.__version__}, op {ARGS.op}, threads {ARGS.threads}, "
              f"reps {ARGS.reps}, warmup {ARGS.warmup}")
        print(f"{'BH':>5} {'N':>6} {'d':>4} {'S':>3} | {'fwd med ms':>10} "
              f"{'[p25, p75]':>19} | {'f+b med ms':>10} {'[p25, p75]':>19} | "
              f"{'saved MiB':>9} {'(no qkv)':>9} | {'peak RSS MiB':>12}")
    for bh, n, d, S in ARGS.case_list:
        r = run_case(ARGS.op, bh, n, d, S, ARGS.reps, ARGS.warmup, ARGS.seed)
        rows.append(r)
        if ARGS.json:
            print(json.dumps(r), flush=True)
        else:
            ms = 1e3
            mib = 1.0 / (1 << 20)
            print(f"{bh:>5} {n:>6} {d:>4} {(S if ARGS.op == 'sinkhorn' else '-'):>3} | "
                  f"{r['fwd_median_s'] * ms:10.3f} "
                  f"[{r['fwd_p25_s'] * ms:8.3f}, {r['fwd_p75_s'] * ms:8.3f}] | "
                  f"{r['fwdbwd_median_s'] * ms:10.3f} "
                  f"[{r['fwdbwd_p25_s'] * ms:8.3f}, {r['fwdbwd_p75_s'] * ms:8.3f}] | "
                  f"{r['saved_bytes'] * mib:9.2f} {r['saved_bytes_excl_inputs'] * mib:9.2f} | "
                  f"{r['peak_rss_bytes'] * mib:12.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
