#!/usr/bin/python3
"""The PyTorch API on CUDA tensors (birkhoff.torch over libbirkhoff's CUDA backend).

Run from anywhere:  python3 tests/python/test_cuda.py [-v] [SECTION...]
(-v prints every comparison's relative error; SECTION: f32, low, port,
determinism, fd, refusals, autocast, mha: only those sections.)
Without a CUDA device (torch.cuda.is_available() false) it prints
"SKIP: no CUDA device" and exits 0; with a device but a library that cannot
run on it (built without the CUDA backend) it prints "SKIP: ..." with the
library's reason and exits 0, unless BK_REQUIRE_CUDA=1 (then that is a
failure). Otherwise it prints "FAIL name: detail" for every failing check,
then "N passed, M failed"; exit status 1 if any failed.

What is checked (sections below), on cuda:0:
  1. float32 on CUDA == the CPU library (softmax, Sinkhorn at odd/even S,
     eps, scale; layouts bhnd, bnhd as transposed views and as fused QKV
     views; padding with NaN in the padded positions: padded rows exactly
     zero; cross-attention Nq != Nk; head dims up to 128), forward and the
     gradients of autograd; the registry's generic call; Sinkhorn's exported
     attention and potentials; tol > 0; causal softmax (fp32, bf16);
  2. bfloat16 / float16 on CUDA == the CPU library on the same (rounded)
     values;
  3. against the PyTorch port of the reference code (bench/peers/
     sinkformer_torch.py) run eagerly on the same GPU in float64;
  4. determinism: two runs bitwise equal, a problem alone == inside a batch,
     another stream == the default stream;
  5. directional finite differences of the float32 CUDA operator;
  6. refusals before any C call (mixed devices, mixed dtypes, unsupported
     dtypes, CPU-only operators) and by the library (operators the CUDA
     backend lacks, head dims over 128);
  7. torch.autocast("cuda", bfloat16 / float16);
  8. MultiheadAttention on CUDA: == the CPU module (float32), == torch.nn.
     MultiheadAttention (softmax), under autocast bf16 (forward, backward,
     padding masks, exported weights), bf16 parameters.

Tolerances, relative to the largest |entry| of the reference (for the
gradients dq, dk, dv: the largest of the three; Sinkhorn's dq and dk are
zero in exact arithmetic for one query and S >= 2):
  float32 vs the CPU library     1e-5 outputs, 1e-4 gradients (the accuracy
                                 contract of include/birkhoff/core.h)
  float32 vs the float64 port    1e-4 outputs, 1e-3 gradients (as
                                 tests/python/test_bindings.py: the contract
                                 times a factor ~S for Sinkhorn)
  bfloat16 / float16             3e-2 outputs and gradients (storage
                                 rounding 2^-8 / 2^-11 of every input and
                                 output, fp32 accumulation inside)
  MultiheadAttention float32     1e-4 outputs, 1e-3 gradients (cuBLAS vs
                                 OpenBLAS projections around the operator)
  MultiheadAttention autocast    5e-2 (bf16 projections and attention);
                                 1e-1 for in_proj_bias's gradient: a sum
                                 over all tokens of bf16 values whose k part
                                 cancels (zero for softmax in exact
                                 arithmetic): 2.7e-2 seen with an exact
                                 attention on bf16 inputs
  finite differences (float32)   2e-2 of the directional derivative, step 1e-2
"""
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench", "peers"))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests"))
from checklib import Checks, Spy  # noqa: E402
sys.dont_write_bytecode = True

import numpy as np  # noqa: E402
import torch  # noqa: E402

import birkhoff as bk  # noqa: E402
import birkhoff.torch as bt  # noqa: E402
from birkhoff import _core, _lib  # noqa: E402
from birkhoff import ops as bk_ops  # noqa: E402

import sinkformer_torch as sink_ref  # noqa: E402

warnings.filterwarnings("ignore", message=".*double precision.*")

TOL_OUT32, TOL_GRAD32 = 1e-5, 1e-4      # float32 CUDA vs float32 CPU library
TOL_OUT_REF, TOL_GRAD_REF = 1e-4, 1e-3  # float32 CUDA vs the float64 port
TOL_LOW = 3e-2                          # bfloat16 / float16 vs float32 on the same values
TOL_MHA_OUT, TOL_MHA_GRAD = 1e-4, 1e-3  # MultiheadAttention float32, CUDA vs CPU
TOL_MHA_AMP = 5e-2                      # MultiheadAttention under autocast bf16 vs CPU float32
TOL_MHA_BIAS = 1e-1                     # its in_proj_bias gradient (see the docstring)
TOL_FD = 2e-2                           # directional finite differences in float32

check = Checks(limit=100000)
WORST = {}
DEV = torch.device("cuda", 0)
GEN = torch.Generator().manual_seed(20241126)
LOW = (torch.bfloat16, torch.float16)
T0 = time.time()


def section(name):
    print("-- %s (%.1fs)" % (name, time.time() - T0), flush=True)


def rel(got, want, floor=0.0):
    """max |got - want| / max(max |want|, floor) (in float64 on the CPU; inf
    on a shape mismatch or a non-finite difference)"""
    a, b = got.detach().double().cpu(), want.detach().double().cpu()
    if a.shape != b.shape:
        return float("inf")
    if b.numel() == 0:
        return 0.0
    err = float((a - b).abs().max())
    den = max(float(b.abs().max()), floor)
    if not np.isfinite(err):
        return float("inf")
    return err / den if den > 0 else err


VERBOSE = False


def close(got, want, tol, name):
    r = rel(got, want)
    WORST[tol] = max(WORST.get(tol, 0.0), r)
    if VERBOSE:
        print("  %.2e (tol %.0e) %s" % (r, tol, name))
    return check(r <= tol, name, "relative error %.3e > %.1e" % (r, tol))


def close_grads(got, want, tol, name):
    """(dq, dk, dv) against the reference's, each relative to the largest
    |entry| of the three reference gradients (the gradients' scale: dq and
    dk of Sinkhorn with one query and S >= 2 are zero in exact arithmetic,
    rounding noise in both implementations, which a per-tensor relative
    error would compare with itself); name(gn) names each check"""
    scale = max(float(w.detach().double().abs().max()) if w.numel() else 0.0 for w in want)
    for gn, a, b in zip(("dq", "dk", "dv"), got, want):
        r = rel(a, b, scale)
        WORST[tol] = max(WORST.get(tol, 0.0), r)
        if VERBOSE:
            print("  %.2e (tol %.0e) %s" % (r, tol, name(gn)))
        check(r <= tol, name(gn), "relative error %.3e > %.1e (to the gradients' largest entry)" % (r, tol))


def raises(exc, fn, name, contains=None):
    try:
        fn()
    except exc as e:
        if contains is not None and contains not in str(e):
            return check(False, name, "%s raised but message %r lacks %r" % (exc.__name__, str(e), contains))
        return check(True, name)
    except Exception as e:  # noqa: BLE001
        return check(False, name, "expected %s, got %s: %s" % (exc.__name__, type(e).__name__, e))
    return check(False, name, "expected %s, nothing raised" % exc.__name__)


def c_refuses(fn, name, status=None):
    """fn raises BirkhoffError (with the status named, if given) and a message"""
    try:
        fn()
        torch.cuda.synchronize()
    except bk.BirkhoffError as e:
        ok = bool(str(e)) and (status is None or e.status == status)
        return check(ok, name, "status %r, message %r" % (e.status, str(e)))
    except Exception as e:  # noqa: BLE001
        return check(False, name, "expected BirkhoffError, got %s: %s" % (type(e).__name__, e))
    return check(False, name, "expected BirkhoffError, nothing raised")


def randn(*shape):
    return torch.randn(*shape, generator=GEN, dtype=torch.float32)


def rounded(x, dtype):
    """x (CPU float32) rounded to dtype and back: the values a dtype operand holds"""
    return x.to(dtype).float()


# ---------------------------------------------------------------------------
# one call: leaves -> operands (a layout's views) -> out -> grads of <dout, out>
# ---------------------------------------------------------------------------
def make_leaves(q, k, v, layout, device, dtype):
    """(leaves, operands): q, k, v [B, H, N, C] (CPU float32) as leaves on
    device in dtype, and the operands in `layout`: "bhnd" (the leaves),
    "bnhd" (transposed views of bhnd leaves: strided, no copy) or "fused"
    (slices of one [B, N, 3, H, d] leaf, layout bnhd; d == dv, Nq == Nk)"""
    if layout == "fused":
        base = torch.stack([x.transpose(1, 2) for x in (q, k, v)], dim=2).to(device, dtype).contiguous()
        base.requires_grad_(True)
        return [base], [base[:, :, i] for i in range(3)]
    leaves = [x.to(device, dtype).clone().requires_grad_(True) for x in (q, k, v)]
    if layout == "bnhd":
        return leaves, [x.transpose(1, 2) for x in leaves]
    return leaves, leaves


def run(fn, q, k, v, dout, layout="bhnd", device=DEV, dtype=torch.float32, **kw):
    """out and (dq, dk, dv) of fn on q, k, v [B, H, N, C] given in CPU
    float32, computed on `device` in `dtype` with the operands in `layout`;
    results as [B, H, N, C] tensors on their device"""
    leaves, ops = make_leaves(q, k, v, layout, device, dtype)
    lay = "bhnd" if layout == "bhnd" else "bnhd"
    out = fn(*ops, layout=lay, **kw)
    o = out if lay == "bhnd" else out.transpose(1, 2)
    g = torch.autograd.grad(o, leaves, dout.to(device, o.dtype))
    if layout == "fused":
        grads = [g[0][:, :, i].transpose(1, 2) for i in range(3)]
    else:
        grads = list(g)
    return o.detach(), grads


def softmax_fn(**p):
    return lambda q, k, v, **kw: bt.softmax_attention(q, k, v, **p, **kw)


def sinkhorn_fn(**p):
    return lambda q, k, v, **kw: bt.sinkhorn_attention(q, k, v, **p, **kw)


def nan_padded(x, lens):
    x = x.clone()
    for b, L in enumerate(lens):
        x[b, :, L:] = float("nan")
    return x


def check_padding(tag, o, grads, ql, kl):
    ok = bool(torch.isfinite(o).all()) and all(bool(torch.isfinite(g).all()) for g in grads)
    for b in range(o.shape[0]):
        ok &= not bool(o[b, :, ql[b]:].any()) and not bool(grads[0][b, :, ql[b]:].any())
        ok &= not bool(grads[1][b, :, kl[b]:].any()) and not bool(grads[2][b, :, kl[b]:].any())
    check(ok, tag + ": padded rows of out and grads exactly zero, all finite (NaN in the padding)")


SHAPES = [  # B, H, Nq, Nk, d, dv
    (2, 3, 17, 17, 16, 16),
    (2, 2, 13, 29, 32, 24),     # cross-attention, Nq < Nk, dv != d
    (1, 2, 40, 9, 8, 8),        # Nq > Nk
    (1, 4, 64, 64, 64, 64),
    (2, 1, 33, 70, 128, 128),   # the largest head dims on CUDA
    (3, 1, 1, 7, 8, 8),         # one query
]
SINKHORN = [dict(iters=1), dict(iters=2), dict(iters=3, eps=0.5), dict(iters=5), dict(iters=8, eps=0.7, scale=0.3)]


def lens_for(B, Nq, Nk):
    ql = [max(1, Nq - 3 * b) for b in range(B)]
    kl = [max(1, Nk - 1 - 2 * b) for b in range(B)]
    return ql, kl


# ===========================================================================
# 1. float32 on CUDA vs the CPU library
# ===========================================================================
def test_f32_vs_cpu():
    section("1. float32 CUDA == CPU library (forward and gradients)")
    for si, (B, H, Nq, Nk, d, dv) in enumerate(SHAPES):
        q, k, v, dout = randn(B, H, Nq, d), randn(B, H, Nk, d), randn(B, H, Nk, dv), randn(B, H, Nq, dv)
        cases = [("softmax", softmax_fn()), ("softmax scale=0.4", softmax_fn(scale=0.4))]
        cases += [("sinkhorn %s" % ",".join("%s=%g" % kv for kv in sorted(p.items())), sinkhorn_fn(**p))
                  for p in SINKHORN]
        layouts = ["bhnd", "bnhd"] + (["fused"] if d == dv and Nq == Nk else [])
        for name, fn in cases:
            ref = run(fn, q, k, v, dout, device="cpu")
            for layout in layouts if si < 2 else ["bhnd"]:
                tag = "f32 %s B%dH%d %dx%d d=%d dv=%d %s" % (name, B, H, Nq, Nk, d, dv, layout)
                o, g = run(fn, q, k, v, dout, layout)
                close(o, ref[0], TOL_OUT32, tag + ": out")
                close_grads(g, ref[1], TOL_GRAD32, lambda gn: "%s: %s" % (tag, gn))
            # padding: NaN in the padded positions, lengths as lists and as a CUDA int tensor
            ql, kl = lens_for(B, Nq, Nk)
            qn, kn, vn = nan_padded(q, ql), nan_padded(k, kl), nan_padded(v, kl)
            ref = run(fn, qn, kn, vn, dout, device="cpu", q_len=ql, k_len=kl)
            tag = "f32 %s B%dH%d %dx%d d=%d pad %s/%s" % (name, B, H, Nq, Nk, d, ql, kl)
            o, g = run(fn, qn, kn, vn, dout, q_len=ql, k_len=torch.tensor(kl, device=DEV))
            close(o, ref[0], TOL_OUT32, tag + ": out")
            close_grads(g, ref[1], TOL_GRAD32, lambda gn: "%s: %s" % (tag, gn))
            check_padding(tag, o, g, ql, kl)

    # backward of out.sum(): an expanded (zero-stride) dout is copied dense first
    q, k, v = randn(2, 2, 9, 8), randn(2, 2, 11, 8), randn(2, 2, 11, 8)
    for name, fn in (("softmax", softmax_fn()), ("sinkhorn", sinkhorn_fn(iters=3))):
        leaves = [x.to(DEV).requires_grad_(True) for x in (q, k, v)]
        fn(*leaves).sum().backward()
        _, g = run(fn, q, k, v, torch.ones(2, 2, 9, 8))
        check(all(torch.equal(a.grad, b) for a, b in zip(leaves, g)), "f32 %s: out.sum().backward() == "
              "explicit ones (broadcast dout copied)" % name)

    # the registry's generic call == the typed functions, bitwise
    q, k, v, dout = randn(2, 3, 12, 16), randn(2, 3, 15, 16), randn(2, 3, 15, 8), randn(2, 3, 12, 8)
    for name, typed, p in (("softmax", softmax_fn(scale=0.3), dict(scale=0.3)),
                           ("sinkhorn", sinkhorn_fn(iters=4, eps=0.8), dict(iters=4, eps=0.8))):
        a = run(typed, q, k, v, dout, q_len=[12, 7], k_len=[15, 10])
        b = run(lambda *x, **kw: bt.attention(name, *x, **p, **kw), q, k, v, dout, q_len=[12, 7], k_len=[15, 10])
        check(torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1])),
              "f32 attention(%r) == %s_attention on CUDA (bitwise)" % (name, name))

    # Sinkhorn's exported attention and potentials on the device (the bindings' extras path)
    for dtype in (torch.float32, torch.bfloat16):
        ql, kl = [12, 7], [15, 10]
        qd, kd, vd = (x.to(DEV, dtype) for x in (q, k, v))
        pr = _core.Problem(bt.TorchAdapter, qd, kd, vd, ql, kl, "bhnd")
        res = _core.sinkhorn_op(iters=5, outputs=("f", "g")).forward(pr, False, True)
        ref = bk.sinkhorn(*(rounded(x, dtype).numpy() for x in (q, k, v)), q_len=ql, k_len=kl, iters=5, attn=True,
                          potentials=True)
        tol = TOL_OUT32 if dtype == torch.float32 else TOL_LOW
        tag = "sinkhorn extras %s" % str(dtype).replace("torch.", "")
        check(res["attn"].device == DEV and res["attn"].dtype == dtype and res["f"].dtype == torch.float32
              and res["f"].device == DEV, tag + ": attn in the operands' dtype, f and g float32, on the device")
        close(res["attn"], torch.from_numpy(ref.attn), tol, tag + ": attn")
        close(res["f"], torch.from_numpy(ref.f), tol, tag + ": f")
        close(res["g"], torch.from_numpy(ref.g), tol, tag + ": g")
        raises(ValueError, lambda: _core.sinkhorn_op(outputs=("diag",)).forward(pr, False, False),
               tag + ": diag on a device -> ValueError")
        res = _core.softmax_op().forward(pr, True)
        check(isinstance(res["tape"], torch.Tensor) and res["tape"].device == DEV and res["tape"].dtype == torch.uint8,
              tag + ": the tape is a uint8 tensor on the device")

    # tol > 0: early stop per problem
    q, k, v, dout = randn(2, 2, 20, 16), randn(2, 2, 24, 16), randn(2, 2, 24, 16), randn(2, 2, 20, 16)
    fn = sinkhorn_fn(iters=60, tol=1e-4)
    ref = run(fn, q, k, v, dout, device="cpu")
    o, g = run(fn, q, k, v, dout)
    close(o, ref[0], 1e-3, "f32 sinkhorn tol=1e-4: out (stops may differ by rounding: 1e-3)")
    close_grads(g, ref[1], 1e-2, lambda gn: "f32 sinkhorn tol=1e-4: %s" % gn)

    # causal softmax (queries are the last Lq positions of the keys'), with and without padding
    fn = softmax_fn(causal=True)
    for Nq, Nk, lens in ((9, 12, None), (10, 10, ([10, 6], [10, 8])), (1, 5, None)):
        q, k, v, dout = randn(2, 2, Nq, 8), randn(2, 2, Nk, 8), randn(2, 2, Nk, 8), randn(2, 2, Nq, 8)
        kw = {} if lens is None else dict(q_len=lens[0], k_len=lens[1])
        for dtype, tol_o, tol_g in ((torch.float32, TOL_OUT32, TOL_GRAD32), (torch.bfloat16, TOL_LOW, TOL_LOW)):
            tag = "%s causal softmax %dx%d pad=%s" % (str(dtype).replace("torch.", ""), Nq, Nk, lens is not None)
            ref = run(fn, *(rounded(x, dtype) for x in (q, k, v, dout)), device="cpu", **kw)
            o, g = run(fn, *(rounded(x, dtype) for x in (q, k, v, dout)), dtype=dtype, **kw)
            close(o, ref[0], tol_o, tag + ": out")
            close_grads(g, ref[1], tol_g, lambda gn: "%s: %s" % (tag, gn))


# ===========================================================================
# 2. bfloat16 / float16
# ===========================================================================
def test_low_precision():
    section("2. bfloat16 / float16 CUDA == CPU library on the same values")
    for (B, H, Nq, Nk, d, dv) in [(2, 3, 17, 17, 16, 16), (2, 2, 13, 29, 64, 32), (1, 2, 70, 33, 128, 128)]:
        q, k, v, dout = randn(B, H, Nq, d), randn(B, H, Nk, d), randn(B, H, Nk, dv), randn(B, H, Nq, dv)
        for dtype in LOW:
            dn = str(dtype).replace("torch.", "")
            qr, kr, vr, dr = (rounded(x, dtype) for x in (q, k, v, dout))
            for name, fn in (("softmax", softmax_fn()), ("sinkhorn S=3", sinkhorn_fn(iters=3)),
                             ("sinkhorn S=4 eps=0.5", sinkhorn_fn(iters=4, eps=0.5))):
                ref = run(fn, qr, kr, vr, dr, device="cpu")
                for layout in ("bhnd", "bnhd") + (("fused",) if d == dv and Nq == Nk else ()):
                    tag = "%s %s B%dH%d %dx%d d=%d dv=%d %s" % (dn, name, B, H, Nq, Nk, d, dv, layout)
                    o, g = run(fn, qr, kr, vr, dr, layout, dtype=dtype)
                    check(o.dtype == dtype and all(x.dtype == dtype for x in g),
                          tag + ": out and grads in the operands' dtype")
                    close(o, ref[0], TOL_LOW, tag + ": out")
                    close_grads(g, ref[1], TOL_LOW, lambda gn: "%s: %s" % (tag, gn))
                ql, kl = lens_for(B, Nq, Nk)
                qn, kn, vn = nan_padded(qr, ql), nan_padded(kr, kl), nan_padded(vr, kl)
                ref = run(fn, qn, kn, vn, dr, device="cpu", q_len=ql, k_len=kl)
                tag = "%s %s B%dH%d %dx%d pad" % (dn, name, B, H, Nq, Nk)
                o, g = run(fn, qn, kn, vn, dr, dtype=dtype, q_len=ql, k_len=kl)
                close(o, ref[0], TOL_LOW, tag + ": out")
                close_grads(g, ref[1], TOL_LOW, lambda gn: "%s: %s" % (tag, gn))
                check_padding(tag, o, g, ql, kl)


# ===========================================================================
# 3. the reference port on the same GPU
# ===========================================================================
def port_fn(S, eps=1.0, scale=None):
    """the port in float64 (marginals too, no early stop) with our call signature"""
    def f(q, k, v, layout="bhnd", q_len=None, k_len=None):
        assert layout == "bhnd"
        if S is None:
            return sink_ref.softmax_attention(q, k, v, scale=scale, q_len=q_len, k_len=k_len)[0]
        return sink_ref.attention(q, k, v, S, eps=eps, scale=scale, q_len=q_len, k_len=k_len, thresh=-1.0,
                                  marginal_dtype=None)[0]
    return f


def test_port():
    section("3. == the reference port (bench/peers/sinkformer_torch.py, float64) on the same GPU")
    for (B, H, Nq, Nk, d, dv) in [(2, 3, 17, 17, 16, 16), (2, 2, 13, 29, 32, 24), (1, 2, 64, 48, 64, 64)]:
        q, k, v, dout = randn(B, H, Nq, d), randn(B, H, Nk, d), randn(B, H, Nk, dv), randn(B, H, Nq, dv)
        ql, kl = lens_for(B, Nq, Nk)
        for name, ours, port in (("softmax", softmax_fn(), port_fn(None)),
                                 ("sinkhorn S=1", sinkhorn_fn(iters=1), port_fn(1)),
                                 ("sinkhorn S=3 eps=0.5", sinkhorn_fn(iters=3, eps=0.5), port_fn(3, 0.5)),
                                 ("sinkhorn S=5", sinkhorn_fn(iters=5), port_fn(5)),
                                 ("sinkhorn S=6 scale=0.3", sinkhorn_fn(iters=6, scale=0.3), port_fn(6, 1.0, 0.3))):
            for lens in (None, (ql, kl)):
                kw = {} if lens is None else dict(q_len=lens[0], k_len=lens[1])
                ref = run(port, q, k, v, dout, dtype=torch.float64, **kw)
                tag = "port %s B%dH%d %dx%d d=%d pad=%s" % (name, B, H, Nq, Nk, d, lens is not None)
                o, g = run(ours, q, k, v, dout, **kw)
                close(o, ref[0], TOL_OUT_REF, tag + ": f32 out")
                close_grads(g, ref[1], TOL_GRAD_REF, lambda gn: "%s: f32 %s" % (tag, gn))
                o, g = run(ours, q, k, v, dout, dtype=torch.bfloat16, **kw)
                close(o, ref[0], 2 * TOL_LOW, tag + ": bf16 out (inputs rounded too: 6e-2)")
                close_grads(g, ref[1], 2 * TOL_LOW, lambda gn: "%s: bf16 %s" % (tag, gn))


# ===========================================================================
# 4. determinism
# ===========================================================================
def same(a, b):
    return torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def test_determinism():
    section("4. determinism: repeated runs, batch shape, streams")
    B, H, Nq, Nk, d = 4, 3, 50, 37, 32
    q, k, v, dout = randn(B, H, Nq, d), randn(B, H, Nk, d), randn(B, H, Nk, d), randn(B, H, Nq, d)
    ql, kl = [50, 31, 7, 50], [37, 37, 20, 5]
    for dtype in (torch.float32,) + LOW:
        dn = str(dtype).replace("torch.", "")
        for name, fn in (("softmax", softmax_fn()), ("sinkhorn S=5", sinkhorn_fn(iters=5))):
            a = run(fn, q, k, v, dout, dtype=dtype, q_len=ql, k_len=kl)
            b = run(fn, q, k, v, dout, dtype=dtype, q_len=ql, k_len=kl)
            check(same(a, b), "%s %s: two runs bitwise equal (out, grads)" % (dn, name))
            alone = True
            for i in (1, 2):
                s = slice(i, i + 1)
                c = run(fn, q[s], k[s], v[s], dout[s], dtype=dtype, q_len=ql[s], k_len=kl[s])
                alone &= torch.equal(c[0], a[0][s]) and all(torch.equal(x, y[s]) for x, y in zip(c[1], a[1]))
            check(alone, "%s %s: a problem alone == inside the batch (bitwise)" % (dn, name))
            # another stream: its own context, the same bits
            n_ctx = len(_core._CONTEXTS)
            s = torch.cuda.Stream(device=DEV)
            s.wait_stream(torch.cuda.current_stream(DEV))
            with torch.cuda.stream(s):
                c = run(fn, q, k, v, dout, dtype=dtype, q_len=ql, k_len=kl)
            torch.cuda.current_stream(DEV).wait_stream(s)
            check(same(a, c), "%s %s: on a side stream == on the default stream (bitwise)" % (dn, name))
            check((0, s.cuda_stream) in _core._CONTEXTS and len(_core._CONTEXTS) <= n_ctx + 1,
                  "%s %s: a cached context for the side stream (torch's pooled streams come back)" % (dn, name))
    # many calls queued without a synchronisation, then read: the same as one at a time
    outs = []
    qd, kd, vd = (x.to(DEV) for x in (q, k, v))
    for i in range(20):
        outs.append(bt.sinkhorn_attention(qd * (1 + i / 20), kd, vd, iters=3))
    torch.cuda.synchronize()
    ok = True
    for i, o in enumerate(outs):
        again = bt.sinkhorn_attention(qd * (1 + i / 20), kd, vd, iters=3)
        torch.cuda.synchronize()
        ok &= torch.equal(o, again)
    check(ok, "20 asynchronous calls in a row == the same calls one by one")


def test_graphs():
    """CUDA graphs: a forward, and a forward + backward, captured by torch.cuda.graph
    (the library then launches without programmatic dependencies and without its second
    stream) replay bitwise as the eager calls, and again after the inputs change in place"""
    section("4b. CUDA graph capture")
    torch.manual_seed(11)
    for dtype in (torch.float32,) + LOW:
        dn = str(dtype).replace("torch.", "")
        for name, fn in (("softmax", lambda q, k, v: bt.softmax_attention(q, k, v)),
                         ("sinkhorn S=5", lambda q, k, v: bt.sinkhorn_attention(q, k, v, iters=5))):
            q, k, v = (torch.randn(2, 4, 256, 64, device=DEV, dtype=dtype) for _ in range(3))
            s = torch.cuda.Stream(device=DEV)
            s.wait_stream(torch.cuda.current_stream(DEV))
            with torch.cuda.stream(s):  # warm-up on the capture stream: its context exists before capture
                for _ in range(2):
                    ref = fn(q, k, v)
            torch.cuda.current_stream(DEV).wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(g, stream=s):
                out = fn(q, k, v)
            g.replay()
            torch.cuda.synchronize()
            ok = torch.equal(out, ref)
            q.mul_(1.5)
            g.replay()
            ref2 = fn(q, k, v)
            torch.cuda.synchronize()
            check(ok and torch.equal(out, ref2), "%s %s: a captured forward replays bitwise as the eager one, "
                  "also after the inputs change in place" % (dn, name))
            ql, kl, vl = (x.clone().requires_grad_(True) for x in (q, k, v))
            go = torch.randn_like(ref)
            with torch.cuda.stream(s):
                for _ in range(2):
                    o = fn(ql, kl, vl)
                    gr = torch.autograd.grad(o, (ql, kl, vl), go)
            torch.cuda.current_stream(DEV).wait_stream(s)
            g2 = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g2, stream=s):
                o2 = fn(ql, kl, vl)
                gr2 = torch.autograd.grad(o2, (ql, kl, vl), go)
            g2.replay()
            torch.cuda.synchronize()
            check(torch.equal(o2, o) and all(torch.equal(a, b) for a, b in zip(gr2, gr)),
                  "%s %s: a captured forward + backward replays bitwise as the eager one" % (dn, name))


# ===========================================================================
# 5. finite differences
# ===========================================================================
def test_finite_differences():
    section("5. directional finite differences (float32 on CUDA)")
    B, H, Nq, Nk, d, dv = 2, 2, 11, 13, 8, 6
    q, k, v, dout = randn(B, H, Nq, d), randn(B, H, Nk, d), randn(B, H, Nk, dv), randn(B, H, Nq, dv)
    ql, kl = [11, 6], [13, 9]
    h = 1e-2
    for name, fn in (("softmax", softmax_fn()), ("sinkhorn S=3", sinkhorn_fn(iters=3)),
                     ("sinkhorn S=6 eps=0.5", sinkhorn_fn(iters=6, eps=0.5))):
        _, g = run(fn, q, k, v, dout, q_len=ql, k_len=kl)
        for trial in range(3):
            u = [randn(*x.shape) for x in (q, k, v)]

            def f(t):
                ins = [(x + t * du).to(DEV) for x, du in zip((q, k, v), u)]
                return float((fn(*ins, q_len=ql, k_len=kl).double().cpu() * dout.double()).sum())
            fd = (f(h) - f(-h)) / (2 * h)
            an = sum(float((gi.double().cpu() * du.double()).sum()) for gi, du in zip(g, u))
            err = abs(fd - an) / max(abs(an), 1e-3)
            check(err <= TOL_FD, "FD %s direction %d" % (name, trial),
                  "finite difference %.6e, gradient %.6e, relative %.2e > %.0e" % (fd, an, err, TOL_FD))


# ===========================================================================
# 6. refusals
# ===========================================================================
def test_refusals():
    section("6. refusals")
    q, k, v = randn(1, 2, 5, 4), randn(1, 2, 6, 4), randn(1, 2, 6, 4)
    qd, kd, vd = (x.to(DEV) for x in (q, k, v))
    spy = Spy(_lib.lib)
    saved = (_core.lib, bk_ops.lib)
    _core.lib = bk_ops.lib = spy
    try:
        raises(ValueError, lambda: bt.sinkhorn_attention(qd, k, vd), "q on cuda:0, k on the CPU -> ValueError",
               "one device")
        raises(ValueError, lambda: bt.softmax_attention(q, kd, v), "k on cuda:0, q on the CPU -> ValueError")
        raises(TypeError, lambda: bt.sinkhorn_attention(qd, kd.bfloat16(), vd), "f32 q, bf16 k -> TypeError",
               "one dtype")
        raises(TypeError, lambda: bt.softmax_attention(qd.half(), kd.half(), vd.bfloat16()),
               "f16 q, k, bf16 v -> TypeError")
        raises(TypeError, lambda: bt.sinkhorn_attention(qd.double(), kd.double(), vd.double()),
               "CUDA float64 -> TypeError")
        raises(TypeError, lambda: bt.softmax_attention(qd.int(), kd.int(), vd.int()), "CUDA int32 -> TypeError")
        raises(TypeError, lambda: bt.sinkhorn_attention(q.bfloat16(), k.bfloat16(), v.bfloat16()),
               "CPU bfloat16 -> TypeError (the CPU is float32 only)")
        raises(ValueError, lambda: bt.esp_attention(qd, kd, vd), "esp on CUDA -> ValueError", "CPU only")
        raises(ValueError, lambda: bt.lot_attention(qd, kd, vd, randn(2, 3, 4), randn(2, 3)),
               "lot on CUDA -> ValueError")
        raises(ValueError, lambda: bt.lot_attention(q, k, v, randn(2, 3, 4).to(DEV), randn(2, 3)),
               "lot with pivots on CUDA -> ValueError")
        raises(ValueError, lambda: bt.diff_attention(qd, kd, vd, 0.5), "diff on CUDA -> ValueError")
        raises(ValueError, lambda: bt.otk_embedding(randn(2, 4, 3).to(DEV), randn(1, 2, 3)),
               "otk on CUDA -> ValueError")
        raises(ValueError, lambda: bt.MultiheadAttention(8, 2, device="meta"), "MHA on meta -> ValueError")
        raises(TypeError, lambda: bt.MultiheadAttention(8, 2, dtype=torch.bfloat16),
               "MHA bf16 on the CPU -> TypeError")
        raises(TypeError, lambda: bt.MultiheadAttention(8, 2, device=DEV, dtype=torch.float64),
               "MHA float64 on CUDA -> TypeError")
        if torch.cuda.device_count() > 1:
            raises(ValueError, lambda: bt.softmax_attention(qd, k.to("cuda:1"), vd), "cuda:0 and cuda:1 -> ValueError")
        bad = [c for c in spy.calls if not c.endswith("_config_default")]
        check(not bad, "argument errors raised before any C call", "C called: %s" % bad)
    finally:
        _core.lib, bk_ops.lib = saved
    # what the library refuses on CUDA
    c_refuses(lambda: bt.unbalanced_attention(qd, kd, vd), "unbalanced on CUDA -> BirkhoffError unsupported",
              "unsupported")
    c_refuses(lambda: bt.attention("esp", qd, kd, vd), "attention('esp') on CUDA -> BirkhoffError unsupported",
              "unsupported")
    c_refuses(lambda: bt.attention("lot", qd, kd, vd), "attention('lot') on CUDA -> BirkhoffError")
    big = randn(1, 1, 4, 129).to(DEV)
    c_refuses(lambda: bt.sinkhorn_attention(big, big, big), "head dim 129 on CUDA -> BirkhoffError unsupported",
              "unsupported")
    c_refuses(lambda: bt.softmax_attention(big, big, big), "softmax head dim 129 on CUDA -> BirkhoffError unsupported",
              "unsupported")
    c_refuses(lambda: bt.sinkhorn_attention(qd, kd, vd, eps=-1.0), "eps < 0 on CUDA -> BirkhoffError",
              "parameter out of range")
    c_refuses(lambda: bt.sinkhorn_attention(qd, kd, vd, q_len=[6]), "q_len > Nq on CUDA -> BirkhoffError")
    c_refuses(lambda: run(sinkhorn_fn(iters=41, grad="implicit"), q, k, v, randn(1, 2, 5, 4)),
              "sinkhorn grad=implicit on CUDA -> BirkhoffError unsupported", "unsupported")
    # the library still works after its refusals
    dout = randn(1, 2, 5, 4)
    o, _ = run(softmax_fn(), q, k, v, dout)
    close(o, run(softmax_fn(), q, k, v, dout, device="cpu")[0], TOL_OUT32, "CUDA calls work after refusals")


# ===========================================================================
# 7. autocast
# ===========================================================================
def test_autocast():
    section("7. torch.autocast('cuda')")
    B, H, Nq, Nk, d = 2, 2, 16, 20, 32
    q, k, v, dout = randn(B, H, Nq, d), randn(B, H, Nk, d), randn(B, H, Nk, d), randn(B, H, Nq, d)
    for dtype in LOW:
        dn = str(dtype).replace("torch.", "")
        for name, fn in (("softmax", softmax_fn()), ("sinkhorn S=3", sinkhorn_fn(iters=3))):
            ref = run(fn, *(rounded(x, dtype) for x in (q, k, v)), dout, device="cpu")
            leaves = [x.to(DEV).requires_grad_(True) for x in (q, k, v)]
            with torch.autocast("cuda", dtype=dtype):
                o = fn(*leaves)
            g = torch.autograd.grad(o, leaves, dout.to(DEV, o.dtype))
            tag = "autocast %s %s" % (dn, name)
            check(o.dtype == dtype, tag + ": out in the autocast dtype", str(o.dtype))
            check(all(x.dtype == torch.float32 for x in g), tag + ": float32 leaves get float32 gradients")
            close(o, ref[0], TOL_LOW, tag + ": out")
            close_grads(g, ref[1], TOL_LOW, lambda gn: "%s: %s" % (tag, gn))
            # mixed dtypes are cast to the autocast dtype
            with torch.autocast("cuda", dtype=dtype):
                o2 = fn(leaves[0], leaves[1].to(torch.bfloat16 if dtype == torch.float16 else torch.float16),
                        leaves[2].to(dtype))
            check(o2.dtype == dtype, tag + ": mixed float32 / float16 / bfloat16 operands cast to the autocast dtype")
            with torch.autocast("cuda", dtype=dtype, enabled=False):
                o3 = fn(*leaves)
            check(o3.dtype == torch.float32, tag + ": autocast(enabled=False) inside: float32")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        raises(TypeError, lambda: bt.softmax_attention(*(x.to(DEV, torch.float64) for x in (q, k, v))),
               "autocast: float64 operands are not cast (as autocast) -> TypeError")
        o = bt.sinkhorn_attention(q, k, v)
        check(o.dtype == torch.float32 and o.device.type == "cpu", "autocast('cuda'): CPU operands stay float32 on the CPU")


# ===========================================================================
# 8. MultiheadAttention
# ===========================================================================
def mha_pair(normaliser, E=64, H=4, **opts):
    torch.manual_seed(3)
    cpu = bt.MultiheadAttention(E, H, normaliser=normaliser, batch_first=True, **opts)
    with torch.no_grad():
        cpu.in_proj_bias.normal_(0, 0.1)
        cpu.out_proj.bias.normal_(0, 0.1)
    gpu = bt.MultiheadAttention(E, H, normaliser=normaliser, batch_first=True, device=DEV, **opts)
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu


def mha_step(m, x, amp=None, **kw):
    """(out, weights, {name: grad}, dx) of one forward + backward of <w, out>"""
    x = x.clone().requires_grad_(True)
    m.zero_grad(set_to_none=True)
    if amp is not None:
        with torch.autocast("cuda", dtype=amp):
            out, w = m(x, x, x, **kw)
    else:
        out, w = m(x, x, x, **kw)
    wt = torch.linspace(-1, 1, out.numel(), dtype=torch.float32).reshape(out.shape).to(out.device, out.dtype)
    (out * wt).float().sum().backward()
    return out.detach(), w, {n: p.grad for n, p in m.named_parameters()}, x.grad


def test_mha():
    section("8. MultiheadAttention on CUDA")
    B, N, E = 3, 21, 64
    x = randn(B, N, E)
    mask = torch.zeros(B, N, dtype=torch.bool)
    mask[1, 15:] = True
    mask[2, 4:] = True
    for normaliser, opts in (("softmax", {}), ("sinkhorn", dict(iters=3, eps=1.0))):
        cpu, gpu = mha_pair(normaliser, **opts)
        for kw_name, kwc, kwg in (("", {}, {}), ("key_padding_mask", dict(key_padding_mask=mask),
                                                 dict(key_padding_mask=mask.to(DEV))),
                                  ("lengths", dict(lengths=[21, 15, 4]), dict(lengths=torch.tensor([21, 15, 4])))):
            tag = "MHA %s %s" % (normaliser, kw_name)
            rc = mha_step(cpu, x, **kwc)
            rg = mha_step(gpu, x.to(DEV), **kwg)
            check(rg[0].device == DEV and rg[0].dtype == torch.float32, tag + ": out float32 on the device")
            close(rg[0], rc[0], TOL_MHA_OUT, tag + ": f32 out")
            close(rg[1], rc[1], TOL_MHA_OUT, tag + ": f32 exported weights")
            for n, gc in rc[2].items():
                close(rg[2][n], gc, TOL_MHA_GRAD, "%s: f32 grad %s" % (tag, n))
            close(rg[3], rc[3], TOL_MHA_GRAD, tag + ": f32 grad of the input")
            ra = mha_step(gpu, x.to(DEV), amp=torch.bfloat16, **kwg)
            check(ra[0].dtype == torch.bfloat16, tag + ": autocast bf16: out bf16", str(ra[0].dtype))
            close(ra[0], rc[0], TOL_MHA_AMP, tag + ": autocast bf16 out")
            close(ra[1], rc[1], TOL_MHA_AMP, tag + ": autocast bf16 exported weights")
            for n, gc in rc[2].items():
                check(ra[2][n].dtype == torch.float32, "%s: autocast bf16: grad %s float32" % (tag, n))
                close(ra[2][n], gc, TOL_MHA_BIAS if n == "in_proj_bias" else TOL_MHA_AMP,
                      "%s: autocast bf16 grad %s" % (tag, n))
            close(ra[3], rc[3], TOL_MHA_AMP, tag + ": autocast bf16 grad of the input")
        # cross-attention, Nq != Nk
        xq, xk = randn(2, 7, E), randn(2, 12, E)
        kmask = torch.zeros(2, 12, dtype=torch.bool)
        kmask[1, 9:] = True
        oc = cpu(xq, xk, xk, key_padding_mask=kmask)
        og = gpu(xq.to(DEV), xk.to(DEV), xk.to(DEV), key_padding_mask=kmask.to(DEV))
        close(og[0], oc[0], TOL_MHA_OUT, "MHA %s cross-attention 7 x 12: out" % normaliser)
        close(og[1], oc[1], TOL_MHA_OUT, "MHA %s cross-attention 7 x 12: weights" % normaliser)
        # a module built in bf16 on the device
        torch.manual_seed(5)
        mb = bt.MultiheadAttention(E, 4, normaliser=normaliser, batch_first=True, device=DEV, dtype=torch.bfloat16,
                                   **opts)
        out, _, grads, _ = mha_step(mb, x.to(DEV, torch.bfloat16))
        check(out.dtype == torch.bfloat16 and all(g is not None and g.dtype == torch.bfloat16 and bool(torch.isfinite(
            g).all()) for g in grads.values()), "MHA %s built in bfloat16 on CUDA: bf16 out, finite bf16 grads"
              % normaliser)
    # softmax == torch.nn.MultiheadAttention on the same device
    torch.manual_seed(7)
    ours = bt.MultiheadAttention(E, 4, normaliser="softmax", batch_first=True, device=DEV)
    theirs = torch.nn.MultiheadAttention(E, 4, batch_first=True, device=DEV)
    theirs.load_state_dict(ours.state_dict())
    xd = x.to(DEV)
    a, b = mha_step(ours, xd, need_weights=False), mha_step(theirs, xd, need_weights=False)
    close(a[0], b[0], TOL_OUT_REF, "MHA softmax on CUDA == torch.nn.MultiheadAttention: out")
    for n, g in b[2].items():
        close(a[2][n], g, TOL_GRAD_REF, "MHA softmax on CUDA == torch.nn.MultiheadAttention: grad %s" % n)


SECTIONS = {"f32": test_f32_vs_cpu, "low": test_low_precision, "port": test_port, "determinism": test_determinism,
            "graphs": test_graphs, "fd": test_finite_differences, "refusals": test_refusals, "autocast": test_autocast, "mha": test_mha}


def main():
    global VERBOSE
    args = sys.argv[1:]
    VERBOSE = "-v" in args
    names = [a for a in args if a != "-v"]
    bad = [a for a in names if a not in SECTIONS]
    if bad:
        print("unknown section(s) %s; sections: %s" % (", ".join(bad), ", ".join(SECTIONS)))
        return 2
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (torch.cuda.is_available() is false)")
        return 0
    ok, why = _core.cuda_status(0)
    if not ok:
        if os.environ.get("BK_REQUIRE_CUDA") == "1":
            check(False, "libbirkhoff runs on CUDA (BK_REQUIRE_CUDA=1)", why)
            return check.summary()
        print("SKIP: libbirkhoff cannot run on CUDA here (%s); build it with its CUDA backend" % why)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False    # the port and the projections in true float32
    torch.backends.cudnn.allow_tf32 = False
    print("birkhoff %s from %s; torch %s; %s" % (bk.version(), bk.LIBRARY_PATH, torch.__version__,
                                                 torch.cuda.get_device_name(DEV)), flush=True)
    for t in [SECTIONS[n] for n in names] or list(SECTIONS.values()):
        try:
            t()
        except Exception as e:  # noqa: BLE001  a crash of one section is a failure, the others still run
            import traceback
            check(False, "%s raised" % t.__name__, "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()))
    for tol in sorted(WORST):
        print("worst relative error against tolerance %.0e: %.2e" % (tol, WORST[tol]))
    return check.summary(" (%.1fs)" % (time.time() - T0))


if __name__ == "__main__":
    sys.exit(main())
