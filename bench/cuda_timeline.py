#!/usr/bin/env python3
"""Where the time of one forward + backward goes, at full clocks (unlike
Nsight Compute, which locks them): torch.profiler's CUDA activity over 5
forward + backward calls of Sinkhorn attention (S = 5) and softmax through
birkhoff.torch, B*H = 32, d = 64, bf16, N = 1024 and 4096, after 3 warm-ups
(Sinkhorn also with BK_CUDA_FORK=0: dQ after dK on one stream; and with
BK_CUDA_PDL=0 BK_CUDA_DV_BLOCKS=3 BK_CUDA_GRAD_BLOCKS=3: ordinary launches and
the dV, dQ and dK passes at 3 blocks an SM, the kernels as of 2026-11-26).
Prints, per case, every kernel's name with its calls and mean time per
call, the GPU busy time per iteration and the wall time per iteration
(CUDA events around the 5 calls queued behind a GPU sleep, as
bench/cuda_bench.py times). Writes the same as JSON to --out.

  python3 bench/cuda_timeline.py --out $OUT/timeline.json
Without a CUDA device it prints 'SKIP: no CUDA device' and exits 0."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch  # noqa: E402


def one(bt, name, N, iters=5):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(4, 8, N, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
               for _ in range(3))
    go = torch.randn(4, 8, N, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    f = (lambda: bt.sinkhorn_attention(q, k, v, iters=5, eps=1.0)) if name == "sinkhorn" else \
        (lambda: bt.softmax_attention(q, k, v))

    def call():
        out = f()
        return torch.autograd.grad(out, (q, k, v), go)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(5e7))
    a.record()
    for _ in range(iters):
        call()
    b.record()
    torch.cuda.synchronize()
    wall = a.elapsed_time(b) / iters
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        dev = getattr(e, "device_type", None)
        if dev is None or "CUDA" not in str(dev):
            continue
        t = getattr(e, "device_time", None)
        if t is None:
            t = getattr(e, "cuda_time", 0.0)
        key = e.name[:110]
        r = rows.setdefault(key, [0, 0.0])
        r[0] += 1
        r[1] += t
    ks = sorted(rows.items(), key=lambda kv: -kv[1][1])
    busy = sum(r[1] for _, r in ks) / iters / 1e3
    return {"case": name, "N": N, "wall_ms_per_iter": wall, "gpu_busy_ms_per_iter": busy,
            "kernels": [{"name": n, "calls_per_iter": c / iters, "ms_per_iter": t / iters / 1e3,
                         "us_per_call": t / c} for n, (c, t) in ks]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    import birkhoff.torch as bt
    res = []
    keys = ("BK_CUDA_FORK", "BK_CUDA_PDL", "BK_CUDA_DV_BLOCKS", "BK_CUDA_GRAD_BLOCKS")
    prev = {"BK_CUDA_PDL": "0", "BK_CUDA_DV_BLOCKS": "3", "BK_CUDA_GRAD_BLOCKS": "3"}
    for name, env, label in (("sinkhorn", {}, ""),
                             ("sinkhorn", {"BK_CUDA_FORK": "0"}, " (BK_CUDA_FORK=0: dQ after dK on one stream)"),
                             ("sinkhorn", prev, " (BK_CUDA_PDL=0, blocks an SM as before)"),
                             ("softmax", {}, "")):
        for key in keys:
            os.environ.pop(key, None)
        os.environ.update(env)
        for N in (1024, 4096):
            r = one(bt, name, N)
            r["env"] = env
            res.append(r)
            print("== %s bf16 N=%d%s: fwd+bwd wall %.3f ms/iter, GPU busy %.3f ms/iter" %
                  (name, N, label, r["wall_ms_per_iter"], r["gpu_busy_ms_per_iter"]))
            for kr in r["kernels"][:14]:
                print("   %7.3f ms  %4.1f x %8.1f us  %s" % (kr["ms_per_iter"], kr["calls_per_iter"],
                                                          kr["us_per_call"], kr["name"]))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "cases": res}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
