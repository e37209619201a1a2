#!/usr/bin/python3
"""Compare birkhoff's Nystrom attention with the PyTorch oracle (float64).

Usage:
  /usr/bin/python3 tests/oracle/test_nystrom.py [--lib build/libbirkhoff.so] [--quick]

The library is driven through the Python ctypes package (python/birkhoff:
birkhoff.ops.attention / attention_backward, the registry's generic call;
BIRKHOFF_LIB points it at the build's libbirkhoff.so). For every case of a
fixed grid (shape with Nq != Nk, padding, landmarks l below, at and above the
lengths, segment lengths that do not divide, iterations 0..8) the float32
library's O, the dense attention and the gradients dq, dk, dv of
sum(O * dO) are compared with nystrom_semantics (tests/oracle/nystrom_torch.py)
in float64 with autograd: forward 1e-5, gradients 1e-4, relative to
max(1, max |oracle|).

Relation checks (oracle only, float64): the port of the reference,
nystrom_reference (the mlpen/Nystromformer module: padded-length landmarks,
equal segments), equals nystrom_semantics when there is no padding and N is a
multiple of l, with either start of the pseudo-inverse (per problem, or the
reference's batch-wide "original"); with the reference's
"original" start (one max over the whole batch) a sample's output changes
when another sample of its batch changes, which is why birkhoff starts per
problem: the test shows that dependence, and that the per-problem start has
none.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def setup(lib):
    sys.path.insert(0, HERE)
    from torch_guard import require_torch
    require_torch()
    os.environ["BIRKHOFF_LIB"] = os.path.abspath(lib)
    sys.path.insert(0, os.path.join(ROOT, "python"))


def rel_err(x, ref):
    import numpy as np
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if x.shape != ref.shape or not np.all(np.isfinite(x)):
        return float("inf")
    return float(np.max(np.abs(x - ref)) / max(1.0, float(np.max(np.abs(ref)))) if x.size else 0.0)


# (B, H, Nq, Nk, d, dv), landmarks, iters, padding
CASES = [
    ((1, 1, 8, 8, 4, 4), 4, 6, False),        # equal segments of 2
    ((2, 3, 12, 12, 8, 8), 4, 6, False),
    ((2, 2, 13, 11, 6, 5), 4, 6, True),       # uneven segments, cross, padded
    ((2, 3, 5, 9, 8, 12), 3, 2, True),        # Nq < Nk, dv != d
    ((2, 2, 12, 4, 16, 8), 8, 6, False),      # fewer keys than landmarks: r = 4
    ((1, 2, 1, 7, 16, 16), 4, 6, False),      # a single query: r = 1
    ((3, 1, 16, 16, 8, 4), 16, 8, True),      # l = N: one landmark per token
    ((2, 2, 20, 17, 8, 8), 5, 0, True),       # no iteration: Z = A^T / c
    ((1, 4, 32, 32, 16, 8), 8, 6, False),
]


def run_case(torch, np, bk, nys, case, seed):
    (B, H, Nq, Nk, d, dv), l, T, pad = case
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, Nq, d)).astype(np.float32)
    k = rng.standard_normal((B, H, Nk, d)).astype(np.float32)
    v = rng.standard_normal((B, H, Nk, dv)).astype(np.float32)
    dout = rng.standard_normal((B, H, Nq, dv)).astype(np.float32)
    ql = kl = None
    if pad:
        ql = rng.integers(1, Nq + 1, size=B).astype(np.int32)
        kl = rng.integers(1, Nk + 1, size=B).astype(np.int32)
        ql[-1], kl[-1] = Nq, Nk
        if B > 1:
            ql[0] = 0  # a problem without queries
    res = bk.ops.attention("nystrom", q, k, v, q_len=ql, k_len=kl, attn=True, landmarks=l, iters=T)
    dq, dk, dv_ = bk.ops.attention_backward("nystrom", q, k, v, dout, res.tape, q_len=ql, k_len=kl,
                                            landmarks=l, iters=T)
    t = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v)]
    O, A = nys.nystrom_semantics(t[0], t[1], t[2], ql, kl, landmarks=l, iters=T)
    (O * torch.tensor(dout, dtype=torch.float64)).sum().backward()
    errs = {"O": rel_err(res.out, O.detach().numpy()), "A": rel_err(res.attn, A.detach().numpy()),
            "dq": rel_err(dq, t[0].grad.numpy()), "dk": rel_err(dk, t[1].grad.numpy()),
            "dv": rel_err(dv_, t[2].grad.numpy())}
    ok = errs["O"] <= 1e-5 and errs["A"] <= 1e-5 and max(errs["dq"], errs["dk"], errs["dv"]) <= 1e-4
    name = f"nystrom B{B}H{H} Nq{Nq} Nk{Nk} d{d} dv{dv} l{l} T{T}" + (" pad" if pad else "")
    print(("ok  " if ok else "FAIL") + f" {name}: " + " ".join(f"{n} {e:.1e}" for n, e in errs.items()), flush=True)
    return ok


def relations(torch, np, nys):
    """the reference port vs the semantics; the batch dependence of the
    reference's original start"""
    ok_all = True
    rng = np.random.default_rng(7)
    for (B, H, N, d, l, T) in [(2, 3, 12, 8, 4, 6), (1, 2, 64, 16, 8, 6), (3, 1, 20, 4, 5, 3)]:
        q, k, v = (torch.tensor(rng.standard_normal((B, H, N, d)), dtype=torch.float64) for _ in range(3))
        mask = torch.ones(B, N, dtype=torch.float64)
        for opt in ("per_problem", "original"):
            ref = nys.nystrom_reference(q, k, v, mask, l, T, init_option=opt)
            sem, _ = nys.nystrom_semantics(q, k, v, landmarks=l, iters=T, init_option=opt)
            e = float((ref - sem).abs().max())
            ok = e < 1e-12
            ok_all &= ok
            print(("ok  " if ok else "FAIL") + f" nystrom reference port == semantics (B{B}H{H} N{N} d{d} l{l} T{T}, "
                  f"{opt} start): {e:.1e}", flush=True)
    # the original start: sample 0's output depends on sample 1
    B, H, N, d, l = 2, 2, 16, 8, 4
    q, k, v = (torch.tensor(rng.standard_normal((B, H, N, d)), dtype=torch.float64) for _ in range(3))
    mask = torch.ones(B, N, dtype=torch.float64)
    q2 = q.clone()
    q2[1] *= 3.0  # change sample 1 only
    outs = {}
    for opt in ("original", "per_problem"):
        a = nys.nystrom_reference(q, k, v, mask, l, 6, init_option=opt)[0]
        b = nys.nystrom_reference(q2, k, v, mask, l, 6, init_option=opt)[0]
        outs[opt] = float((a - b).abs().max())
    ok = outs["original"] > 1e-9 and outs["per_problem"] == 0.0
    ok_all &= ok
    print(("ok  " if ok else "FAIL") + " nystrom: with the reference's original start sample 0 changes when sample 1 "
          f"does ({outs['original']:.1e}); with the per-problem start it does not ({outs['per_problem']:.1e})",
          flush=True)
    return ok_all


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libbirkhoff.so"))
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    setup(a.lib)
    import numpy as np
    import torch
    import birkhoff as bk
    import birkhoff.ops  # noqa: F401
    import nystrom_torch as nys
    torch.set_num_threads(1)
    passed = failed = 0
    for i, case in enumerate(CASES):
        if a.quick and i % 2:
            continue
        if run_case(torch, np, bk, nys, case, 100 + i):
            passed += 1
        else:
            failed += 1
    if relations(torch, np, nys):
        passed += 1
    else:
        failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
