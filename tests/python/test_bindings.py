#!/usr/bin/python3
"""Tests of the Python binding (python/birkhoff) over build/libbirkhoff.so.

Run from anywhere with Debian's python (torch and numpy):
    /usr/bin/python3 tests/python/test_bindings.py
It finds the package in <repo>/python and the PyTorch references in
<repo>/bench/peers itself. Prints "FAIL name: detail" for every failing
check, then "N passed, M failed"; exit status 1 if any failed.

What is checked (sections below):
  1. numpy API vs the float64 PyTorch references (bench/peers), forward and
     gradients of <dout, out>, softmax / Sinkhorn / ESP / LOT / OTK, with
     padding (padded rows zero, padding == truncation);
  2. layouts: bhnd == bnhd (transposed view) == fused [B, N, 3, H, d] views,
     bitwise, without copies;
  3. torch.autograd.gradcheck of every torch Function and of
     MultiheadAttention for each normaliser;
  4. MultiheadAttention(normaliser="softmax") == torch.nn.MultiheadAttention;
  5. errors (TypeError / ValueError before C, BirkhoffError from C);
  6. ASAP calibration, compiled layers, save / load;
  7. OTK K-means fitting;
  8. thread-count independence (bitwise);
  9. leaks (RSS over many calls);
 10. regressions: broadcast operands, numpy parameters under autograd,
     Result attributes, ambiguous padding arguments.

Tolerances (relative to the largest |entry| of the reference):
  outputs   1e-4  (C contract: 1e-5, times a factor ~S for Sinkhorn, S <= 8)
  gradients 1e-3  (C contract: 1e-4; float32 against float64)
  gradcheck float32, eps 1e-3, atol = rtol = 5e-3 (finite differences in
            float32: rounding ~1e-7 / 1e-3 relative, truncation ~eps^2).
"""
import math
import os
import sys
import tempfile
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

import diff_torch as diff_ref  # noqa: E402
import espformer_torch as esp_ref  # noqa: E402
import lotformer_torch as lot_ref  # noqa: E402
import otk_torch as otk_ref  # noqa: E402
import sinkformer_torch as sink_ref  # noqa: E402

warnings.filterwarnings("ignore", message=".*double precision.*")
warnings.filterwarnings("ignore", message=".*float32.*")
torch.set_num_threads(1)

TOL_OUT = 1e-4     # outputs vs the float64 reference (relative to max |ref|)
TOL_GRAD = 1e-3    # gradients vs the float64 reference
TOL_TRUNC = 1e-6   # padded problem vs the truncated problem, both birkhoff float32
GC = dict(eps=1e-3, atol=5e-3, rtol=5e-3)   # gradcheck in float32

WORST = {}         # tolerance -> worst relative error seen by check_close


check = Checks(limit=100000)


def rel(a, b, floor=0.0):
    """max |a - b| / max(max |b|, floor) (b the reference)"""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    den = max(float(np.abs(b).max()) if b.size else 0.0, floor)
    err = float(np.abs(a - b).max()) if b.size else 0.0
    if not np.isfinite(err):
        return float("inf")
    return err / den if den > 0 else err


def check_close(got, want, tol, name, floor=1e-6):
    """max |got - want| <= tol * max(max |want|, floor): relative to the
    largest reference entry; the floor keeps a reference that is zero up to
    float64 rounding (e.g. LOT's dtheta at T = 1) from demanding exact zeros"""
    r = rel(got, want, floor)
    WORST[tol] = max(WORST.get(tol, 0.0), r)
    return check(r <= tol, name, "relative error %.3e > %.1e" % (r, tol))


def check_raises(exc, fn, name, contains=None):
    try:
        fn()
    except exc as e:
        if contains is not None and contains not in str(e):
            return check(False, name, "%s raised but message %r lacks %r" % (exc.__name__, str(e), contains))
        return check(True, name)
    except Exception as e:  # noqa: BLE001
        return check(False, name, "expected %s, got %s: %s" % (exc.__name__, type(e).__name__, e))
    return check(False, name, "expected %s, nothing raised" % exc.__name__)


RNG = np.random.default_rng(20240607)
torch.manual_seed(0)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def unit_rows(a):
    return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)


def t64(a, grad=True):
    t = torch.from_numpy(np.asarray(a, dtype=np.float64).copy())
    return t.requires_grad_(grad)


def ref_vjp(fn, arrays, dout, grad_mask=None):
    """(out, grads) of the float64 reference fn(*tensors) -> out, grads of
    <dout, out> for the arrays whose grad_mask entry is True (else None)."""
    if grad_mask is None:
        grad_mask = [True] * len(arrays)
    leaves = [None if a is None else t64(a, g) for a, g in zip(arrays, grad_mask)]
    out = fn(*leaves)
    want = [x for x, g in zip(leaves, grad_mask) if x is not None and g]
    gs = torch.autograd.grad((out * torch.from_numpy(dout.astype(np.float64))).sum(), want, allow_unused=True)
    it = iter(gs)
    res = []
    for x, g in zip(leaves, grad_mask):
        if x is not None and g:
            gx = next(it)
            res.append(np.zeros(x.shape) if gx is None else gx.numpy())
        else:
            res.append(None)
    return out.detach().numpy(), res


def pad_nan(a, lens):
    """copy of a [B, H, N, C] with NaN in the padded positions n >= lens[b]"""
    a = a.copy()
    for b, L in enumerate(lens):
        a[b, :, L:] = np.nan
    return a


def section(name):
    print("-- %s (%.1fs)" % (name, time.time() - T0))


T0 = time.time()


# ===========================================================================
# 1. numpy API vs the float64 references
# ===========================================================================
def attn_case(tag, fwd, bwd, ref, q, k, v, extras=(), extra_grad=(), q_len=None, k_len=None, names=()):
    """Compares birkhoff (fwd/bwd on float32) with the reference (float64
    autograd), outputs and gradients; with lengths also checks padded rows
    (exact zeros) and padding == truncation.
    fwd(q, k, v, *extras, q_len=, k_len=) -> Result
    bwd(q, k, v, *extras, dout, tape, q_len=, k_len=) -> tuple of grads
      (dq, dk, dv, then one per extra in extra_grad order)
    ref(q, k, v, *extras, q_len, k_len) -> out tensor (float64)"""
    B, H, Nq, _ = q.shape
    dv = v.shape[3]
    dout = randn(B, H, Nq, dv)
    if q_len is not None:
        qn, kn, vn = pad_nan(q, q_len), pad_nan(k, k_len), pad_nan(v, k_len)
    else:
        qn, kn, vn = q, k, v
    res = fwd(qn, kn, vn, *extras, q_len=q_len, k_len=k_len)
    grads = bwd(qn, kn, vn, *extras, dout, res.tape, q_len=q_len, k_len=k_len)
    mask = [True, True, True] + list(extra_grad)
    r_out, r_grads = ref_vjp(lambda *t: ref(*t, q_len, k_len), [qn, kn, vn] + list(extras), dout, mask)
    check_close(res.out, r_out, TOL_OUT, "%s: out" % tag)
    gnames = ["dq", "dk", "dv"] + list(names)
    gi = 0
    for i, m in enumerate(mask):
        if not m:
            continue
        check_close(grads[gi], r_grads[i], TOL_GRAD, "%s: %s" % (tag, gnames[gi]))
        gi += 1
    # backward without a tape (recomputes the forward): identical
    g2 = bwd(qn, kn, vn, *extras, dout, None, q_len=q_len, k_len=k_len)
    check(all(np.array_equal(a, b) for a, b in zip(grads, g2)), "%s: backward tape=None == with tape" % tag)
    if q_len is None:
        return res, grads
    zero = True
    for b in range(B):
        Lq, Lk = q_len[b], k_len[b]
        zero &= not np.any(res.out[b, :, Lq:]) and not np.any(grads[0][b, :, Lq:])
        zero &= not np.any(grads[1][b, :, Lk:]) and not np.any(grads[2][b, :, Lk:])
        zero &= bool(np.all(np.isfinite(res.out))) and all(bool(np.all(np.isfinite(g))) for g in grads)
    check(zero, "%s: padded rows of out and grads exactly zero (NaN in padding)" % tag)
    for b in range(B):
        Lq, Lk = q_len[b], k_len[b]
        if Lq == 0 or Lk == 0:
            check(not np.any(res.out[b]) and not np.any(grads[0][b]) and not np.any(grads[1][b])
                  and not np.any(grads[2][b]), "%s: empty problem b=%d gives zeros" % (tag, b))
            continue
        qt = np.ascontiguousarray(q[b:b + 1, :, :Lq])
        kt = np.ascontiguousarray(k[b:b + 1, :, :Lk])
        vt = np.ascontiguousarray(v[b:b + 1, :, :Lk])
        dt = np.ascontiguousarray(dout[b:b + 1, :, :Lq])
        rt = fwd(qt, kt, vt, *extras, q_len=None, k_len=None)
        gt = bwd(qt, kt, vt, *extras, dt, rt.tape, q_len=None, k_len=None)
        check_close(res.out[b:b + 1, :, :Lq], rt.out, TOL_TRUNC, "%s: padding == truncation (out, b=%d)" % (tag, b))
        for j, (g, gtr, L) in enumerate(zip(grads[:3], gt[:3], (Lq, Lk, Lk))):
            check_close(g[b:b + 1, :, :L], gtr, TOL_TRUNC,
                        "%s: padding == truncation (%s, b=%d)" % (tag, gnames[j], b))
    return res, grads


def test_softmax_sinkhorn():
    section("1. softmax / Sinkhorn vs sinkformer_torch")
    for (B, H, Nq, Nk, d, dv) in [(2, 2, 7, 9, 5, 4), (1, 3, 8, 8, 8, 3)]:
        q, k, v = randn(B, H, Nq, d), randn(B, H, Nk, d), randn(B, H, Nk, dv)
        for scale in (None, 0.4):
            for lens in (None, ([Nq, 3], [5, Nk]) if B == 2 else ([5], [6])):
                ql, kl = (None, None) if lens is None else lens
                tag = "softmax B%dH%d %dx%d scale=%s pad=%s" % (B, H, Nq, Nk, scale, lens is not None)
                res, _ = attn_case(
                    tag,
                    lambda q_, k_, v_, **kw: bk.softmax(q_, k_, v_, scale=scale, attn=True, **kw),
                    lambda q_, k_, v_, do, tp, **kw: bk.softmax_backward(q_, k_, v_, do, tp, scale=scale, **kw),
                    lambda q_, k_, v_, a, b_: sink_ref.softmax_attention(q_, k_, v_, scale=scale, q_len=a, k_len=b_)[0],
                    q, k, v, q_len=ql, k_len=kl)
                A_ref = sink_ref.softmax_attention(t64(q, False), t64(k, False), t64(v, False), scale=scale,
                                                   q_len=ql, k_len=kl)[1].numpy()
                check_close(res.attn, A_ref, TOL_OUT, tag + ": attn")
        # Sinkhorn: odd and even S, eps != 1, scale given, S = 1 (softmax)
        for S, eps, scale in [(1, 1.0, None), (2, 1.0, None), (3, 0.5, None), (4, 2.0, 0.3), (5, 0.7, None),
                              (8, 1.0, 0.5)]:
            for lens in (None, ([Nq, 4], [6, Nk]) if B == 2 else ([6], [5])):
                ql, kl = (None, None) if lens is None else lens
                tag = "sinkhorn B%dH%d %dx%d S=%d eps=%g scale=%s pad=%s" % (B, H, Nq, Nk, S, eps, scale,
                                                                          lens is not None)
                kw_s = dict(iters=S, eps=eps, scale=scale)
                res, _ = attn_case(
                    tag,
                    lambda q_, k_, v_, **kw: bk.sinkhorn(q_, k_, v_, attn=True, potentials=True, diag=True,
                                                         **kw_s, **kw),
                    lambda q_, k_, v_, do, tp, **kw: bk.sinkhorn_backward(q_, k_, v_, do, tp, **kw_s, **kw),
                    lambda q_, k_, v_, a, b_: sink_ref.attention(q_, k_, v_, S, eps=eps, scale=scale, q_len=a,
                                                                 k_len=b_, thresh=-1.0, marginal_dtype=None)[0],
                    q, k, v, q_len=ql, k_len=kl)
                A_ref = sink_ref.attention(t64(q, False), t64(k, False), t64(v, False), S, eps=eps, scale=scale,
                                           q_len=ql, k_len=kl, thresh=-1.0, marginal_dtype=None)[1].numpy()
                check_close(res.attn, A_ref, TOL_OUT, tag + ": attn")
                check(res.f.shape == (B, H, Nq) and res.g.shape == (B, H, Nk)
                      and res.diag["iters"].shape == (B, H) and bool(np.all(res.diag["iters"] == S)),
                      tag + ": potentials / diag shapes and iters", str(res.diag["iters"]))
                if S % 2 == 1:
                    rows = res.attn.sum(-1)
                    ok = True
                    for b in range(B):
                        Lq = Nq if ql is None else ql[b]
                        ok &= bool(np.abs(rows[b, :, :Lq] - 1).max() < 1e-5)
                    check(ok, tag + ": rows of A sum to 1 (odd S)")
                if S == 1:
                    rs = bk.softmax(q, k, v, scale=scale, q_len=ql, k_len=kl).out
                    check_close(res.out, rs, 1e-6, tag + ": S = 1 == softmax")
    # an empty problem (Lk = 0 for one batch entry) gives zeros
    q, k, v = randn(2, 2, 5, 4), randn(2, 2, 6, 4), randn(2, 2, 6, 3)
    attn_case("sinkhorn empty problem",
              lambda q_, k_, v_, **kw: bk.sinkhorn(q_, k_, v_, iters=3, **kw),
              lambda q_, k_, v_, do, tp, **kw: bk.sinkhorn_backward(q_, k_, v_, do, tp, iters=3, **kw),
              lambda q_, k_, v_, a, b_: sink_ref.attention(q_, k_, v_, 3, q_len=a, k_len=b_, thresh=-1.0,
                                                           marginal_dtype=None)[0],
              q, k, v, q_len=[5, 3], k_len=[4, 0])


def test_unbalanced():
    section("1b. unbalanced Sinkhorn vs sinkformer_torch (the reference's SinkhornUnbalanced)")
    for (B, H, Nq, Nk, d, dv) in [(2, 2, 7, 9, 5, 4), (1, 3, 8, 8, 8, 3)]:
        q, k, v = randn(B, H, Nq, d), randn(B, H, Nk, d), randn(B, H, Nk, dv)
        for S, eps, rho in [(1, 1.0, 10.0), (2, 1.0, 10.0), (3, 0.5, 1.0), (4, 0.7, 0.3), (5, 1.0, 2.0)]:
            for lens in (None, ([Nq, 4], [6, Nk]) if B == 2 else ([6], [5])):
                ql, kl = (None, None) if lens is None else lens
                tag = "unbalanced B%dH%d %dx%d S=%d eps=%g rho=%g pad=%s" % (B, H, Nq, Nk, S, eps, rho,
                                                                          lens is not None)
                kw_u = dict(iters=S, eps=eps, rho=rho)
                res, _ = attn_case(
                    tag,
                    lambda q_, k_, v_, **kw: bk.unbalanced(q_, k_, v_, attn=True, diag=True, **kw_u, **kw),
                    lambda q_, k_, v_, do, tp, **kw: bk.unbalanced_backward(q_, k_, v_, do, tp, **kw_u, **kw),
                    lambda q_, k_, v_, a, b_: sink_ref.attention(q_, k_, v_, S, eps=eps, q_len=a, k_len=b_,
                                                                 thresh=-1.0, marginal_dtype=None, rho=rho)[0],
                    q, k, v, q_len=ql, k_len=kl)
                A_ref = sink_ref.attention(t64(q, False), t64(k, False), t64(v, False), S, eps=eps, q_len=ql,
                                           k_len=kl, thresh=-1.0, marginal_dtype=None, rho=rho)[1].numpy()
                check_close(res.attn, A_ref, TOL_OUT, tag + ": attn")
    # rho -> infinity is Sinkhorn attention
    q, k, v = randn(1, 2, 6, 4), randn(1, 2, 7, 4), randn(1, 2, 7, 3)
    check(np.array_equal(bk.unbalanced(q, k, v, iters=4, rho=1e12).out, bk.sinkhorn(q, k, v, iters=4).out),
          "unbalanced rho=1e12 == sinkhorn (bitwise)")


def test_causal():
    section("1d. causal softmax vs a masked float64 softmax")
    for (B, H, Nq, Nk, d, dv, lens) in [(2, 2, 6, 6, 4, 3, None), (1, 3, 4, 9, 5, 2, None),
                                         (2, 1, 5, 7, 4, 4, ([3, 5], [6, 7]))]:
        q, k, v, do = randn(B, H, Nq, d), randn(B, H, Nk, d), randn(B, H, Nk, dv), randn(B, H, Nq, dv)
        ql, kl = (None, None) if lens is None else lens
        res = bk.softmax(q, k, v, q_len=ql, k_len=kl, causal=True, attn=True)
        dq, dk, dv_ = bk.softmax_backward(q, k, v, do, res.tape, q_len=ql, k_len=kl, causal=True)
        tq, tk, tv = (torch.from_numpy(x).double().requires_grad_(True) for x in (q, k, v))
        out = torch.zeros(B, H, Nq, dv, dtype=torch.float64)
        A = torch.zeros(B, H, Nq, Nk, dtype=torch.float64)
        for b in range(B):
            Lq, Lk = (Nq if ql is None else ql[b]), (Nk if kl is None else kl[b])
            s = torch.matmul(tq[b, :, :Lq], tk[b, :, :Lk].transpose(-1, -2)) / math.sqrt(d)
            keep = torch.arange(Lk)[None, :] <= torch.arange(Lq)[:, None] + (Lk - Lq)
            a = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1)
            out[b, :, :Lq] = torch.matmul(a, tv[b, :, :Lk])
            A[b, :, :Lq, :Lk] = a.detach()
        (out * torch.from_numpy(do).double()).sum().backward()
        tag = "causal softmax B%d H%d %dx%d lens=%s" % (B, H, Nq, Nk, lens)
        check_close(res.out, out.detach().numpy(), TOL_OUT, tag + ": out")
        check_close(res.attn, A.numpy(), TOL_OUT, tag + ": attn")
        for name, got, want in (("dq", dq, tq.grad), ("dk", dk, tk.grad), ("dv", dv_, tv.grad)):
            check_close(got, want.numpy(), TOL_GRAD, tag + ": " + name)
    qt, kt, vt = (torch.from_numpy(randn(1, 2, 4, 3)).requires_grad_(True) for _ in range(3))
    gradcheck(lambda *t: bt.softmax_attention(*t, causal=True), (qt, kt, vt), "gradcheck causal softmax_attention")
    try:
        bk.softmax(randn(1, 1, 5, 3), randn(1, 1, 4, 3), randn(1, 1, 4, 2), causal=True)
        check(False, "causal with fewer keys than queries refused")
    except bk.BirkhoffError as e:
        check("at least as many keys" in str(e), "causal with fewer keys than queries refused", str(e))


def test_registry():
    section("1c. any registered operator by name (birkhoff.attention, the C registry)")
    check(bk.operators()[:7] == ["softmax", "sinkhorn", "unbalanced", "esp", "asap", "lot", "diff"], "operators(): the registry",
          str(bk.operators()))
    B, H, Nq, Nk, d, dv = 2, 2, 6, 7, 4, 3
    q, k, v, do = randn(B, H, Nq, d), randn(B, H, Nk, d), randn(B, H, Nk, dv), randn(B, H, Nq, dv)
    lens = dict(q_len=[Nq, 4], k_len=[5, Nk])
    same = [
        ("softmax", {}, bk.softmax, bk.softmax_backward, {}),
        ("sinkhorn", dict(iters=4, eps=0.5), bk.sinkhorn, bk.sinkhorn_backward, dict(iters=4, eps=0.5)),
        ("unbalanced", dict(iters=5, rho=2), bk.unbalanced, bk.unbalanced_backward, dict(iters=5, rho=2)),
        ("esp", dict(sort="soft", t=0.2, tau=2), bk.esp, bk.esp_backward, dict(sort="soft", t=0.2, tau=2)),
    ]
    for name, kw, fwd, bwd, kw_t in same:
        a = bk.attention(name, q, k, v, attn=True, **lens, **kw)
        b = fwd(q, k, v, attn=True, **lens, **kw_t)
        g1 = bk.attention_backward(name, q, k, v, do, a.tape, **lens, **kw)
        g2 = bwd(q, k, v, do, b.tape, **lens, **kw_t)
        check(np.array_equal(a.out, b.out) and np.array_equal(a.attn, b.attn)
              and all(np.array_equal(x, y) for x, y in zip(g1, g2)),
              "attention(%r) == its typed function, forward and gradients, bitwise" % name)
    try:
        bk.attention("flash", q, k, v)
        check(False, "unknown operator refused")
    except ValueError as e:
        check("registry has: softmax, sinkhorn" in str(e), "unknown operator refused, naming the registry", str(e))
    try:
        bk.attention("sinkhorn", q, k, v, colour=1)
        check(False, "unknown key refused")
    except bk.BirkhoffError as e:
        check("unknown key 'colour'" in str(e), "unknown key refused by the C setter", str(e))
    try:
        bk.attention("sinkhorn", q, k, v, iters="many")
        check(False, "bad value refused")
    except bk.BirkhoffError as e:
        check("iters" in str(e), "a malformed value refused, naming the key", str(e))
    qt, kt, vt = (torch.from_numpy(x).requires_grad_(True) for x in (q, k, v))
    gradcheck(lambda *t: bt.attention("unbalanced", *t, iters=3, rho=0.5, **lens), (qt, kt, vt),
              "gradcheck birkhoff.torch.attention('unbalanced')")


def test_esp():
    section("1. ESP vs espformer_torch.esp_semantics")
    B, H, Nq, Nk, d, dv = 2, 2, 6, 8, 4, 3
    q, k, v = randn(B, H, Nq, d), randn(B, H, Nk, d), randn(B, H, Nk, dv)
    th3 = unit_rows(randn(3, d))
    th_seed = bk.esp_slices(d, slices=5, seed=11)
    check(th_seed.shape == (5, d) and np.allclose(np.linalg.norm(th_seed, axis=1), 1, atol=1e-5),
          "esp_slices(slices=5, seed): [5, d] unit rows", str(th_seed.shape))
    check(np.array_equal(bk.esp_slices(d), np.eye(d, dtype=np.float32)), "esp_slices(d) is the identity")
    check(np.array_equal(bk.esp_slices(d, theta=th3), th3), "esp_slices(theta=...) returns theta")
    cases = [
        # sort, t, tau, cost, out_scale, theta (None: axis-aligned), slices, seed, scale
        ("hard", None, 1.0, "sq", "rows", None, None, None, None),
        ("hard", None, 2.0, "euclid", "paper", th3, None, None, None),
        ("hard", None, 0.5, "sq", "paper", None, 5, 11, 0.6),
        ("soft", 0.5, 1.0, "sq", "rows", None, None, None, None),
        ("soft", 0.3, 3.0, "euclid", "paper", th3, None, None, None),
        ("soft", 0.8, 0.0, "sq", "rows", th3, None, None, 0.7),
        ("soft", 0.4, 2.0, "euclid", "rows", None, None, None, None),
    ]
    for sort, t, tau, cost, osc, theta, slices, seed, scale in cases:
        for lens in (None, ([Nq, 3], [5, Nk])):
            ql, kl = (None, None) if lens is None else lens
            tag = "esp %s t=%s tau=%g %s %s theta=%s slices=%s pad=%s" % (
                sort, t, tau, cost, osc, theta is not None, slices, lens is not None)
            kw_e = dict(sort=sort, t=t, tau=tau, cost=cost, out_scale=osc, scale=scale, slices=slices, seed=seed)
            th_ref = theta if theta is not None else (th_seed if slices else None)
            extras = (theta,) if theta is not None else ()
            soft_th = theta is not None and sort == "soft"

            def fwd(q_, k_, v_, *ex, **kw):
                return bk.esp(q_, k_, v_, theta=ex[0] if ex else None, attn=True, weights=True, diag=True,
                              **kw_e, **kw)

            def bwd(q_, k_, v_, *rest, **kw):
                ex, do, tp = rest[:-2], rest[-2], rest[-1]
                dq, dk, dv_, dth = bk.esp_backward(q_, k_, v_, do, tp, theta=ex[0] if ex else None, **kw_e, **kw)
                return (dq, dk, dv_, dth) if soft_th else (dq, dk, dv_)

            def ref(q_, k_, v_, *rest):
                ex, a, b_ = rest[:-2], rest[-2], rest[-1]
                th = ex[0] if ex else (None if th_ref is None else t64(th_ref, False))
                return esp_ref.esp_semantics(q_, k_, v_, sort=sort, t=t, tau=tau, cost=cost, out_scale=osc,
                                             scale=scale, theta=th, q_len=a, k_len=b_)[0]

            res, grads = attn_case(tag, fwd, bwd, ref, q, k, v, extras=extras, extra_grad=(soft_th,) * len(extras),
                                   q_len=ql, k_len=kl, names=("dtheta",))
            o, A, sg = esp_ref.esp_semantics(t64(q, False), t64(k, False), t64(v, False), sort=sort, t=t, tau=tau,
                                             cost=cost, out_scale=osc, scale=scale,
                                             theta=None if th_ref is None else t64(th_ref, False), q_len=ql, k_len=kl)
            check_close(res.attn, A.numpy(), TOL_OUT, tag + ": attn")
            check_close(res.sigma, sg.numpy(), TOL_OUT, tag + ": sigma")
            if sort == "hard":
                dth = bk.esp_backward(q, k, v, randn(B, H, Nq, dv), None, theta=theta, **kw_e)[3]
                check(not np.any(dth), tag + ": dtheta is zero under hard sort")
    # axis-aligned slices == theta = identity
    r1 = bk.esp(q, k, v, sort="soft", t=0.5, tau=1.0).out
    r2 = bk.esp(q, k, v, sort="soft", t=0.5, tau=1.0, theta=np.eye(d, dtype=np.float32)).out
    check_close(r1, r2, 1e-6, "esp: slices=0 == theta=I")


def test_lot():
    section("1. LOT vs lotformer_torch.lot_semantics")
    for (B, H, Nq, Nk, d, dv, r) in [(2, 2, 7, 9, 4, 3, 3), (1, 3, 4, 6, 5, 2, 6)]:
        q, k, v = randn(B, H, Nq, d), randn(B, H, Nk, d), randn(B, H, Nk, dv)
        Z, th = randn(H, r, d), randn(H, r)
        for T, eps, temp, scale in [(1, 1.0, 1.0, None), (4, 0.5, 2.0, None), (5, 1.0, 0.5, 0.4)]:
            for lens in (None, ([Nq, 3], [5, Nk]) if B == 2 else ([3], [4])):
                ql, kl = (None, None) if lens is None else lens
                tag = "lot B%dH%d %dx%d r=%d T=%d eps=%g temp=%g scale=%s pad=%s" % (
                    B, H, Nq, Nk, r, T, eps, temp, scale, lens is not None)
                kw_l = dict(iters=T, eps=eps, temp=temp, scale=scale)
                res, _ = attn_case(
                    tag,
                    lambda q_, k_, v_, Z_, t_, **kw: bk.lot(q_, k_, v_, Z_, t_, attn=True, diag=True, **kw_l, **kw),
                    lambda q_, k_, v_, Z_, t_, do, tp, **kw: bk.lot_backward(q_, k_, v_, Z_, t_, do, tp, **kw_l, **kw),
                    lambda q_, k_, v_, Z_, t_, a, b_: lot_ref.lot_semantics(q_, k_, v_, Z_, t_, temp=temp, iters=T,
                                                                            eps=eps, scale=scale, q_len=a,
                                                                            k_len=b_)[0],
                    q, k, v, extras=(Z, th), extra_grad=(True, True), q_len=ql, k_len=kl, names=("dZ", "dtheta"))
                _, A = lot_ref.lot_semantics(t64(q, False), t64(k, False), t64(v, False), t64(Z, False),
                                             t64(th, False), temp=temp, iters=T, eps=eps, scale=scale, q_len=ql,
                                             k_len=kl, return_attn=True)
                check_close(res.attn, A.numpy(), TOL_OUT, tag + ": attn")


def test_diff():
    section("1. differential attention vs diff_torch.diff_semantics")
    for (B, H, Nq, Nk, d, dv) in [(2, 3, 7, 9, 4, 3), (1, 2, 5, 4, 8, 6)]:
        q, k, v = randn(B, H, Nq, d), randn(B, H, Nk, d), randn(B, H, Nk, dv)
        lam = (0.8 * randn(H)).astype(np.float32)
        for scale in (None, 0.45):
            for lens in (None, ([Nq, 3], [5, Nk]) if B == 2 else ([3], [2])):
                ql, kl = (None, None) if lens is None else lens
                tag = "diff B%dH%d %dx%d d=%d scale=%s pad=%s" % (B, H, Nq, Nk, d, scale, lens is not None)
                res, _ = attn_case(
                    tag,
                    lambda q_, k_, v_, l_, **kw: bk.diff(q_, k_, v_, l_, attn=True, scale=scale, **kw),
                    lambda q_, k_, v_, l_, do, tp, **kw: bk.diff_backward(q_, k_, v_, l_, do, tp, scale=scale, **kw),
                    lambda q_, k_, v_, l_, a, b_: diff_ref.diff_semantics(q_, k_, v_, l_, scale=scale, q_len=a,
                                                                          k_len=b_)[0],
                    q, k, v, extras=(lam,), extra_grad=(True,), q_len=ql, k_len=kl, names=("dlambda",))
                _, A = diff_ref.diff_semantics(t64(q, False), t64(k, False), t64(v, False), t64(lam, False),
                                               scale=scale, q_len=ql, k_len=kl)
                check_close(res.attn, A.numpy(), TOL_OUT, tag + ": attn")
    # lambda = 0 is softmax on the first halves, bitwise; a number is every head's lambda
    q, k, v = randn(2, 2, 6, 8), randn(2, 2, 5, 8), randn(2, 2, 5, 3)
    o0 = bk.diff(q, k, v, 0.0).out
    o1 = bk.softmax(np.ascontiguousarray(q[..., :4]), np.ascontiguousarray(k[..., :4]), v).out
    check(np.array_equal(o0, o1), "diff: lambda = 0 == softmax on the first halves (bitwise)")
    check(np.array_equal(bk.diff(q, k, v, 0.3).out, bk.diff(q, k, v, np.full(2, 0.3, np.float32)).out),
          "diff: a number is every head's lambda")
    # torch: the Function == numpy bitwise, lambda's gradient, its re-parameterisation around it
    qt, kt, vt = (torch.from_numpy(x).requires_grad_(True) for x in (q, k, v))
    lt = torch.tensor([0.4, -0.2], requires_grad=True)
    y = bt.diff_attention(qt, kt, vt, lt, q_len=[6, 2], k_len=[3, 5])
    ref = bk.diff(q, k, v, lt.detach().numpy(), q_len=[6, 2], k_len=[3, 5]).out
    check(np.array_equal(y.detach().numpy(), ref), "diff_attention == birkhoff.diff (bitwise)")
    do = randn(*y.shape)
    (y * torch.from_numpy(do)).sum().backward()
    g = bk.diff_backward(q, k, v, lt.detach().numpy(), do, q_len=[6, 2], k_len=[3, 5])
    check(all(np.array_equal(a, b) for a, b in zip((qt.grad, kt.grad, vt.grad, lt.grad), g)),
          "diff_attention: autograd == birkhoff.diff_backward (bitwise, incl. dlambda)")
    lq1, lk1, lq2, lk2 = (torch.tensor(0.1 * randn(4), requires_grad=True) for _ in range(4))
    li = diff_ref.lambda_init(2)

    def layer(a, b, c, x1, y1, x2, y2):
        lam_ = diff_ref.reparam_lambda(x1, y1, x2, y2, li).expand(2)
        return bt.diff_attention(a, b, c, lam_, q_len=[4, 2], k_len=[3, 5]) * (1 - li)
    small = [torch.from_numpy(randn(*s)).requires_grad_(True) for s in ((2, 2, 4, 4), (2, 2, 5, 4), (2, 2, 5, 3))]
    gradcheck(layer, tuple(small) + (lq1, lk1, lq2, lk2),
              "gradcheck diff_attention with the re-parameterised lambda (padded)")
    gradcheck(lambda a, b, c, l_: bt.diff_attention(a, b, c, l_, scale=0.6), tuple(small) + (lt,),
              "gradcheck diff_attention (q, k, v, lambda)")
    # errors before C, and C's
    check_raises(ValueError, lambda: bk.diff(q, k, v, randn(3)), "diff: lambda of the wrong length -> ValueError")
    check_raises(ValueError, lambda: bk.diff(q, k, v, None), "diff: lambda None -> ValueError")
    check_raises(_lib.BirkhoffError, lambda: bk.diff(q[..., :3].copy(), k[..., :3].copy(), v, [0.1, 0.2]),
                 "diff: an odd head dimension -> BirkhoffError", "even")
    check_raises(_lib.BirkhoffError, lambda: bk.diff(q, k, v, [0.1, np.nan]),
                 "diff: non-finite lambda -> BirkhoffError", "non-finite")
    check_raises(_lib.BirkhoffError, lambda: bk.attention("diff", q, k, v),
                 "attention('diff') without lambda -> BirkhoffError", "lambda")


def otk_inputs(B, n, d, k, q, p, anchors):
    x = unit_rows(randn(B, n, d)) * (0.5 + 0.7 * RNG.random((B, n, 1))).astype(np.float32)
    z = unit_rows(randn(q, p, k if anchors else d))
    W = unit_rows(randn(k, d)) if anchors else None
    return x.astype(np.float32), z, W


def test_otk():
    section("1. OTK vs otk_torch.otk_semantics")
    B, n, d, k, q, p = 2, 7, 5, 4, 2, 3
    for anchors in (False, True):
        x, z, W = otk_inputs(B, n, d, k, q, p, anchors)
        for domain in ("log", "scaling"):
            for conv, lens, extra in [("paper", None, {}), ("reference", [7, 4], {}),
                                      ("paper", [5, 7], dict(pe="1d", sigma_pos=0.4))]:
                tag = "otk W=%s %s %s lens=%s %s" % (anchors, domain, conv, lens, extra)
                kw_o = dict(sigma=0.7, eta=1e-2, eps=0.5, iters=4, domain=domain, convention=conv, **extra)
                xn = x.copy()
                if lens is not None:
                    for b, L in enumerate(lens):
                        xn[b, L:] = np.nan
                res = bk.otk(xn, z, lengths=lens, W=W, plan=True, diag=True, **kw_o)
                dout = randn(*res.out.shape)
                dx, dz, dW = bk.otk_backward(xn, z, dout, res.tape, lengths=lens, W=W, **kw_o)
                arrays = [xn, z] + ([W] if anchors else [])

                def ref(*t):
                    return otk_ref.otk_semantics(t[0], t[1], lengths=lens, W=t[2] if anchors else None,
                                                 **kw_o)[0]
                r_out, r_g = ref_vjp(ref, arrays, dout)
                check_close(res.out, r_out, TOL_OUT, tag + ": out")
                check_close(dx, r_g[0], TOL_GRAD, tag + ": dx")
                check_close(dz, r_g[1], TOL_GRAD, tag + ": dz")
                if anchors:
                    check_close(dW, r_g[2], TOL_GRAD, tag + ": dW")
                else:
                    check(dW is None, tag + ": dW None without anchors")
                plan = otk_ref.otk_semantics(t64(xn, False), t64(z, False), lengths=lens,
                                             W=None if W is None else t64(W, False), **kw_o)[1].numpy()
                check_close(res.plan, plan, TOL_OUT, tag + ": plan")
                check(res.diag["row_err"].shape == (B, q), tag + ": diag shape")
                dx2, dz2, dW2 = bk.otk_backward(xn, z, dout, None, lengths=lens, W=W, **kw_o)
                check(np.array_equal(dx, dx2) and np.array_equal(dz, dz2)
                      and (dW is None or np.array_equal(dW, dW2)), tag + ": backward tape=None == with tape")
                if lens is not None:
                    zero = all(not np.any(dx[b, L:]) for b, L in enumerate(lens))
                    zero &= all(not np.any(res.plan[b, :, L:]) for b, L in enumerate(lens))
                    check(zero and bool(np.all(np.isfinite(res.out))) and bool(np.all(np.isfinite(dx))),
                          tag + ": padded rows of dx and plan exactly zero (NaN in padding)")
                    if "pe" not in extra or conv == "paper":
                        for b, L in enumerate(lens):
                            rt = bk.otk(np.ascontiguousarray(x[b:b + 1, :L]), z, W=W, **kw_o)
                            check_close(res.out[b:b + 1], rt.out, TOL_TRUNC,
                                        "%s: padding == truncation b=%d" % (tag, b))
    # features: psi of the identity map is x; with anchors compare the reference
    x, z, W = otk_inputs(B, n, d, k, q, p, True)
    psi = bk.otk_features(x, W, sigma=0.7, eta=1e-2, lengths=[7, 3])
    M = otk_ref.anchor_transform(t64(W, False), 0.7, 1e-2)
    psi_ref = otk_ref.otk_features(t64(x, False), t64(W, False), 0.7, M).numpy()
    psi_ref[1, 3:] = 0
    check_close(psi, psi_ref, TOL_OUT, "otk_features with anchors (padded rows zero)")
    check(np.array_equal(bk.otk_features(x), x), "otk_features without anchors is the identity")


# ===========================================================================
# 2. layouts
# ===========================================================================
def layout_ops():
    """(name, numpy fwd(q,k,v,layout,**lens) -> (out, grads...)) for every attention op"""
    d = 4
    Z, th = randn(3, 5, d), randn(3, 5)
    th3 = unit_rows(randn(3, d))

    def mk(f, b):
        def run(q, k, v, dout, layout, **kw):
            r = f(q, k, v, layout=layout, **kw)
            g = b(q, k, v, dout, r.tape, layout=layout, **kw)
            return [r.out] + [x for x in g if x is not None and x.ndim == 4]
        return run
    return [
        ("softmax", mk(lambda *a, **kw: bk.softmax(*a, **kw), lambda *a, **kw: bk.softmax_backward(*a, **kw))),
        ("sinkhorn S=3", mk(lambda *a, **kw: bk.sinkhorn(*a, iters=3, eps=0.7, **kw),
                            lambda *a, **kw: bk.sinkhorn_backward(*a, iters=3, eps=0.7, **kw))),
        ("sinkhorn S=4", mk(lambda *a, **kw: bk.sinkhorn(*a, iters=4, **kw),
                            lambda *a, **kw: bk.sinkhorn_backward(*a, iters=4, **kw))),
        ("esp hard", mk(lambda *a, **kw: bk.esp(*a, tau=2.0, **kw),
                        lambda *a, **kw: bk.esp_backward(*a, tau=2.0, **kw))),
        ("esp soft theta", mk(lambda *a, **kw: bk.esp(*a, sort="soft", t=0.5, theta=th3, cost="euclid", **kw),
                              lambda *a, **kw: bk.esp_backward(*a, sort="soft", t=0.5, theta=th3, cost="euclid",
                                                               **kw))),
        ("lot", mk(lambda q, k, v, **kw: bk.lot(q, k, v, Z, th, iters=5, **kw),
                   lambda q, k, v, do, tp, **kw: bk.lot_backward(q, k, v, Z, th, do, tp, iters=5, **kw))),
    ]


def test_layouts():
    section("2. layouts (bhnd / bnhd view / fused QKV view), bitwise")
    B, H, N, d = 2, 3, 6, 4
    for lens in (None, ([6, 4], [5, 6])):
        kw = {} if lens is None else dict(q_len=lens[0], k_len=lens[1])
        q, k, v = randn(B, H, N, d), randn(B, H, N, d), randn(B, H, N, d)
        dout = randn(B, H, N, d)
        qkv = np.empty((B, N, 3, H, d), np.float32)
        qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2] = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
        fq, fk, fv = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        for name, run in layout_ops():
            tag = "layout %s pad=%s" % (name, lens is not None)
            base = run(q, k, v, dout, "bhnd", **kw)
            tv = [x.transpose(0, 2, 1, 3) for x in (q, k, v, dout)]          # views, not copies
            r_view = run(*tv, "bnhd", **kw)
            r_dense = run(*[np.ascontiguousarray(x) for x in tv], "bnhd", **kw)
            r_fused = run(fq, fk, fv, dout.transpose(0, 2, 1, 3), "bnhd", **kw)
            for lab, r in (("bnhd view", r_view), ("bnhd dense", r_dense), ("fused view", r_fused)):
                same = len(r) == len(base) and all(
                    x.shape == (y.shape[0], y.shape[2], y.shape[1], y.shape[3])
                    and np.array_equal(x.transpose(0, 2, 1, 3), y) for x, y in zip(r, base))
                check(same, "%s: %s == bhnd (out and grads)" % (tag, lab))
            check(all(x.flags.c_contiguous for x in r_view), tag + ": outputs dense in the operands' layout")
    # no copies: the operand addresses are the views' own
    ok = all(_core.attn_operand(_core.NP, a, "bnhd", "q").addr == a.ctypes.data for a in (fq, fk, fv))
    ok &= _core.attn_operand(_core.NP, q.transpose(0, 2, 1, 3), "bnhd", "q").addr == q.ctypes.data
    check(ok, "layout: numpy views passed without copy (attn_operand.addr)")
    tq = torch.from_numpy(qkv.copy())
    views = [tq[:, :, i] for i in range(3)]
    ok = all(_core.attn_operand(bt.TorchAdapter, a, "bnhd", "q").addr == a.data_ptr() for a in views)
    check(ok, "layout: torch fused views passed without copy (attn_operand.addr == data_ptr)")
    op = _core.attn_operand(bt.TorchAdapter, views[1], "bnhd", "k")
    check((op.sb, op.sh, op.sn) == (N * 3 * H * d, d, 3 * H * d), "layout: fused view strides passed to C",
          str((op.sb, op.sh, op.sn)))
    # a non-unit channel stride is copied (and still correct)
    qs = np.ascontiguousarray(np.repeat(q, 2, axis=3))[..., ::2]
    check(np.array_equal(bk.softmax(qs, k, v).out, bk.softmax(q, k, v).out), "layout: strided channels copied")
    qr = q[:, :, ::-1]
    check(np.array_equal(bk.softmax(qr, k, v).out, bk.softmax(np.ascontiguousarray(qr), k, v).out),
          "layout: negative strides copied")

    # torch functions: bhnd vs bnhd views vs fused views, forward and autograd gradients
    Zt, tht = torch.from_numpy(randn(H, 3, d)), torch.from_numpy(randn(H, 3))
    th3 = torch.from_numpy(unit_rows(randn(2, d)))
    fns = [
        ("softmax", lambda q_, k_, v_, **kw: bt.softmax_attention(q_, k_, v_, **kw)),
        ("sinkhorn", lambda q_, k_, v_, **kw: bt.sinkhorn_attention(q_, k_, v_, iters=5, **kw)),
        ("esp hard", lambda q_, k_, v_, **kw: bt.esp_attention(q_, k_, v_, tau=1.0, **kw)),
        ("esp soft", lambda q_, k_, v_, **kw: bt.esp_attention(q_, k_, v_, sort="soft", t=0.5, theta=th3, **kw)),
        ("lot", lambda q_, k_, v_, **kw: bt.lot_attention(q_, k_, v_, Zt, tht, **kw)),
    ]
    q, k, v = randn(B, H, N, d), randn(B, H, N, d), randn(B, H, N, d)
    dout = torch.from_numpy(randn(B, H, N, d))
    kw = dict(q_len=[6, 4], k_len=[5, 6])
    for name, fn in fns:
        def run(layout, fused):
            if fused:
                base = torch.from_numpy(np.stack([x.transpose(0, 2, 1, 3) for x in (q, k, v)], axis=2).copy())
                base.requires_grad_(True)
                ins = [base[:, :, i] for i in range(3)]
                leaves = [base]
            else:
                leaves = [torch.from_numpy(x.copy()).requires_grad_(True) for x in (q, k, v)]
                ins = [x.transpose(1, 2) for x in leaves] if layout == "bnhd" else leaves
            out = fn(*ins, layout=layout, **kw)
            o = out.transpose(1, 2) if layout == "bnhd" else out
            (o * dout).sum().backward()
            if fused:
                g = [leaves[0].grad[:, :, i].transpose(1, 2) for i in range(3)]
            else:
                g = [x.grad for x in leaves]
            return [o.detach()] + g
        a, b_, c = run("bhnd", False), run("bnhd", False), run("bnhd", True)
        check(all(torch.equal(x, y) for x, y in zip(a, b_)), "torch %s: bnhd view == bhnd (out, grads)" % name)
        check(all(torch.equal(x, y) for x, y in zip(a, c)), "torch %s: fused view == bhnd (out, grads)" % name)
        r_np = {"softmax": lambda: bk.softmax(q, k, v, **kw).out,
                "sinkhorn": lambda: bk.sinkhorn(q, k, v, iters=5, **kw).out,
                "esp hard": lambda: bk.esp(q, k, v, tau=1.0, **kw).out,
                "esp soft": lambda: bk.esp(q, k, v, sort="soft", t=0.5, theta=th3.numpy(), **kw).out,
                "lot": lambda: bk.lot(q, k, v, Zt.numpy(), tht.numpy(), **kw).out}[name]()
        check(np.array_equal(a[0].numpy(), r_np), "torch %s == numpy API (bitwise)" % name)
    # lengths as torch integer tensors
    o1 = bt.sinkhorn_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                               q_len=torch.tensor([6, 4]), k_len=torch.tensor([5, 6], dtype=torch.int32))
    check(np.array_equal(o1.numpy(), bk.sinkhorn(q, k, v, **kw).out), "torch: lengths as int tensors")
    # backward twice through a retained graph (the tape is reused unchanged)
    qg, kg, vg = (torch.from_numpy(x.copy()).requires_grad_(True) for x in (q, k, v))
    o = bt.sinkhorn_attention(qg, kg, vg, iters=4, **kw)
    w = torch.from_numpy(randn(*o.shape))
    (o * w).sum().backward(retain_graph=True)
    g1 = qg.grad.clone()
    (o * w).sum().backward()
    check(torch.equal(qg.grad, 2 * g1), "torch: backward twice with retain_graph")
    # implicit gradient == unrolled gradient at convergence
    gs = []
    for mode in ("unrolled", "implicit"):
        qg.grad = None
        (bt.sinkhorn_attention(qg, kg, vg, iters=301, grad=mode, **kw) * w).sum().backward()
        gs.append(qg.grad.numpy().copy())
    check_close(gs[1], gs[0], TOL_GRAD, "torch: implicit gradient == unrolled at convergence (S=301)")
    # modules: OTKPooling and LOTAttention get parameter gradients; padded rows of x none
    torch.manual_seed(4)
    pool = bt.OTKPooling(5, refs=2, supports=3, anchors=4, eps=0.5)
    x = torch.from_numpy(randn(2, 6, 5)).requires_grad_(True)
    y = pool(x, lengths=[6, 4])
    y.pow(2).sum().backward()
    check(tuple(y.shape) == (2, 24) and tuple(pool.z.grad.shape) == (2, 3, 4) and tuple(pool.W.grad.shape) == (4, 5)
          and not torch.any(x.grad[1, 4:]) and bool(torch.any(x.grad[1, :4])), "OTKPooling: shapes and gradients")
    pool.W.data.mul_(3.0)
    pool.normalise_anchors()
    check(torch.allclose(pool.W.norm(dim=1), torch.ones(4)), "OTKPooling.normalise_anchors: unit rows")
    y2 = bt.otk_embedding(x, pool.z, pool.W, lengths=[6, 4], eps=0.5).reshape(2, -1)
    check(torch.equal(pool(x, lengths=[6, 4]), y2), "OTKPooling == otk_embedding")
    la = bt.LOTAttention(6, 2, r=4, iters=3, batch_first=True)
    yl = la(torch.from_numpy(randn(2, 5, 6)))[0]
    yl.sum().backward()
    check(tuple(la.Z.grad.shape) == (2, 4, 3) and tuple(la.theta.grad.shape) == (2, 4)
          and bool(torch.any(la.Z.grad != 0)), "LOTAttention: Z and theta get gradients")


# ===========================================================================
# 3. gradcheck
# ===========================================================================
def gradcheck(fn, inputs, name):
    try:
        ok = torch.autograd.gradcheck(fn, inputs, **GC)
        return check(ok, name)
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()
        return check(False, name, "%s: %s" % (type(e).__name__, " | ".join(msg[:6])))


def tt(*shape, grad=True):
    return torch.from_numpy(randn(*shape)).requires_grad_(grad)


def test_gradcheck():
    section("3. gradcheck of the torch Functions")
    B, H, Nq, Nk, d, dv = 2, 2, 4, 5, 3, 2
    for layout in ("bhnd", "bnhd"):
        def shp(N, C):
            return (B, H, N, C) if layout == "bhnd" else (B, N, H, C)
        for lens in (None, ([4, 2], [3, 5])):
            kw = dict(layout=layout)
            if lens is not None:
                kw.update(q_len=lens[0], k_len=lens[1])
            tag = "%s pad=%s" % (layout, lens is not None)
            q, k, v = tt(*shp(Nq, d)), tt(*shp(Nk, d)), tt(*shp(Nk, dv))
            gradcheck(lambda a, b, c: bt.softmax_attention(a, b, c, **kw), (q, k, v), "gradcheck softmax " + tag)
            gradcheck(lambda a, b, c: bt.softmax_attention(a, b, c, scale=0.7, **kw), (q, k, v),
                      "gradcheck softmax scale " + tag)
            for S, eps in ((2, 1.0), (3, 0.5), (6, 1.3)):
                gradcheck(lambda a, b, c: bt.sinkhorn_attention(a, b, c, iters=S, eps=eps, **kw), (q, k, v),
                          "gradcheck sinkhorn S=%d eps=%g %s" % (S, eps, tag))
                gradcheck(lambda a, b, c: bt.unbalanced_attention(a, b, c, iters=S, eps=eps, rho=0.8, **kw),
                          (q, k, v), "gradcheck unbalanced S=%d eps=%g rho=0.8 %s" % (S, eps, tag))
            gradcheck(lambda a, b, c: bt.sinkhorn_attention(a, b, c, iters=200, grad="implicit", **kw), (q, k, v),
                      "gradcheck sinkhorn implicit S=200 " + tag)
            gradcheck(lambda a, b, c: bt.sinkhorn_attention(a, b, c, iters=1001, tol=1e-6, grad="implicit", **kw),
                      (q, k, v), "gradcheck sinkhorn implicit tol=1e-6 " + tag)
            gradcheck(lambda a, b, c: bt.esp_attention(a, b, c, tau=2.0, **kw), (q, k, v),
                      "gradcheck esp hard tau=2 " + tag)
            gradcheck(lambda a, b, c: bt.esp_attention(a, b, c, tau=1.0, cost="euclid", out_scale="paper", **kw),
                      (q, k, v), "gradcheck esp hard euclid paper " + tag)
            th = torch.from_numpy(unit_rows(randn(3, d))).requires_grad_(True)
            gradcheck(lambda a, b, c, t: bt.esp_attention(a, b, c, theta=t, sort="soft", t=0.5, tau=1.0, **kw),
                      (q, k, v, th), "gradcheck esp soft theta " + tag)
            gradcheck(lambda a, b, c: bt.esp_attention(a, b, c, sort="soft", t=0.7, tau=2.0, cost="euclid", **kw),
                      (q, k, v), "gradcheck esp soft euclid axis " + tag)
            Z, tht = tt(H, 3, d), tt(H, 3)
            for T in (1, 4, 5):
                gradcheck(lambda a, b, c, z, t: bt.lot_attention(a, b, c, z, t, iters=T, eps=0.8, temp=0.7, **kw),
                          (q, k, v, Z, tht), "gradcheck lot T=%d %s" % (T, tag))
    # OTK: x, z, W with anchors; both domains; lengths
    B, n, dd, kk, qq, p = 2, 4, 3, 3, 2, 3
    for anchors in (False, True):
        for domain in ("log", "scaling"):
            for lens in (None, [4, 2]):
                x, z, W = otk_inputs(B, n, dd, kk, qq, p, anchors)
                ins = [torch.from_numpy(x).requires_grad_(True), torch.from_numpy(z).requires_grad_(True)]
                if anchors:
                    ins.append(torch.from_numpy(W).requires_grad_(True))
                kw = dict(sigma=0.7, eps=0.3, iters=6, domain=domain, lengths=lens)
                gradcheck(lambda *t: bt.otk_embedding(t[0], t[1], t[2] if anchors else None, **kw), tuple(ins),
                          "gradcheck otk W=%s %s lens=%s" % (anchors, domain, lens))
    x, z, W = otk_inputs(2, 4, 3, 3, 1, 4, True)
    gradcheck(lambda *t: bt.otk_embedding(*t, sigma=0.7, eps=0.3, iters=6, pe="1d", sigma_pos=0.5,
                                          convention="reference", lengths=[4, 3]),
              tuple(torch.from_numpy(a).requires_grad_(True) for a in (x, z, W)), "gradcheck otk pe 1d reference")

    section("3. gradcheck through MultiheadAttention")
    E, Hh, N, Nk2, Bb = 6, 2, 4, 3, 2
    opts = {"softmax": {}, "sinkhorn": dict(iters=3), "unbalanced": dict(iters=4, rho=0.5),
            "esp": dict(sort="soft", t=0.5, tau=1.0),
            "lot": dict(r=3, iters=4)}
    for norm, o in opts.items():
        torch.manual_seed(1)
        for batch_first in (True, False):
            mha = bt.MultiheadAttention(E, Hh, normaliser=norm, batch_first=batch_first, **o)
            with torch.no_grad():
                mha.in_proj_bias.normal_()
            def shp(N_):
                return (Bb, N_, E) if batch_first else (N_, Bb, E)
            x = tt(*shp(N))
            mask = torch.tensor([[False] * N, [False] * (N - 1) + [True]])
            tag = "%s batch_first=%s" % (norm, batch_first)
            gradcheck(lambda a: mha(a)[0], (x,), "gradcheck MHA self " + tag)
            gradcheck(lambda a: mha(a, a, a, key_padding_mask=mask)[0], (x,), "gradcheck MHA self kpm " + tag)
            kx, vx = tt(*shp(Nk2)), tt(*shp(Nk2))
            mask2 = torch.tensor([[False] * Nk2, [False] + [True] * (Nk2 - 1)])
            gradcheck(lambda a, b, c: mha(a, b, c, key_padding_mask=mask2)[0], (x, kx, vx),
                      "gradcheck MHA cross kpm " + tag)
        # parameter gradients (one normaliser configuration, batch_first): dL/dW vs finite differences
        mha = bt.MultiheadAttention(E, Hh, normaliser=norm, batch_first=True, **o)
        x = tt(Bb, N, E, grad=False)
        params = [p_ for p_ in mha.parameters()]

        # analytic parameter gradients vs central differences on a few entries
        out = mha(x)[0]
        w = torch.from_numpy(randn(*out.shape))
        gs = torch.autograd.grad((out * w).sum(), params)
        ok, worst = True, 0.0
        with torch.no_grad():
            for p_, g in zip(params, gs):
                flat = p_.view(-1)
                idx = torch.from_numpy(RNG.choice(flat.numel(), size=min(6, flat.numel()), replace=False))
                for i in idx.tolist():
                    old = float(flat[i])
                    flat[i] = old + 1e-3
                    fp = float((mha(x)[0] * w).sum())
                    flat[i] = old - 1e-3
                    fm = float((mha(x)[0] * w).sum())
                    flat[i] = old
                    num = (fp - fm) / 2e-3
                    err = abs(num - float(g.view(-1)[i]))
                    worst = max(worst, err)
                    ok &= err <= 5e-3 + 5e-3 * abs(num)
        check(ok, "MHA %s: parameter gradients vs finite differences" % norm, "worst abs err %.3e" % worst)


# ===========================================================================
# 4. module equivalence with torch.nn.MultiheadAttention
# ===========================================================================
def test_mha_equivalence():
    section("4. MultiheadAttention(softmax) == torch.nn.MultiheadAttention")
    E, H, B, N, Nk = 8, 2, 2, 5, 7
    torch.manual_seed(3)
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True)
    mine = bt.MultiheadAttention(E, H, normaliser="softmax", batch_first=True)
    with torch.no_grad():
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
        mine.in_proj_weight.copy_(ref.in_proj_weight)
        mine.in_proj_bias.copy_(ref.in_proj_bias)
        mine.out_proj.weight.copy_(ref.out_proj.weight)
        mine.out_proj.bias.copy_(ref.out_proj.bias)
    cases = [("self", N, None), ("self kpm", N, torch.tensor([[False] * N, [False] * 3 + [True] * 2])),
             ("cross", Nk, None), ("cross kpm", Nk, torch.tensor([[False] * 6 + [True], [False] * 2 + [True] * 5]))]
    for name, nk, mask in cases:
        xq = torch.from_numpy(randn(B, N, E))
        xk = xq if name.startswith("self") else torch.from_numpy(randn(B, nk, E))
        xv = xq if name.startswith("self") else torch.from_numpy(randn(B, nk, E))
        outs, grads = [], []
        for m in (ref, mine):
            m.zero_grad()
            a = xq.clone().requires_grad_(True)
            if name.startswith("self"):
                b = c = a
                leaves = [a]
            else:
                b, c = xk.clone().requires_grad_(True), xv.clone().requires_grad_(True)
                leaves = [a, b, c]
            o = m(a, b, c, key_padding_mask=mask, need_weights=False)[0]
            w = torch.from_numpy(np.random.default_rng(5).standard_normal(o.shape).astype(np.float32))
            (o * w).sum().backward()
            outs.append(o.detach())
            grads.append([x.grad for x in leaves] + [m.in_proj_weight.grad, m.in_proj_bias.grad,
                                                     m.out_proj.weight.grad, m.out_proj.bias.grad])
        check_close(outs[1].numpy(), outs[0].numpy(), 1e-5, "MHA %s: output == torch.nn" % name)
        labels = ["dquery", "dkey", "dvalue"][:len(grads[0]) - 4] + ["din_proj_weight", "din_proj_bias",
                                                                       "dout_proj.weight", "dout_proj.bias"]
        for lab, g1, g0 in zip(labels, grads[1], grads[0]):
            check_close(g1.numpy(), g0.numpy(), 1e-5, "MHA %s: %s == torch.nn" % (name, lab))
    # batch_first False, with the same weights
    mine.batch_first = False
    ref2 = torch.nn.MultiheadAttention(E, H, batch_first=False)
    ref2.load_state_dict(ref.state_dict())
    x = torch.from_numpy(randn(N, B, E))
    check_close(mine(x)[0].detach().numpy(), ref2(x, x, x, need_weights=False)[0].detach().numpy(), 1e-5,
                "MHA batch_first=False: output == torch.nn")
    mine.batch_first = True
    # lengths == key_padding_mask for self-attention keys... and queries: valid rows equal
    xq = torch.from_numpy(randn(B, N, E))
    mask = torch.tensor([[False] * N, [False] * 3 + [True] * 2])
    o1 = mine(xq, lengths=torch.tensor([N, 3]))[0].detach()
    o2 = mine(xq, key_padding_mask=mask)[0].detach()
    check_close(o1[1, :3].numpy(), o2[1, :3].numpy(), 1e-6, "MHA lengths: valid rows == key_padding_mask")
    check_close(o1[1, 3:].numpy(), mine.out_proj.bias.detach().expand(2, E).numpy(), 1e-6,
                "MHA lengths: padded query rows are out_proj(0) = bias")
    check(mine(xq, need_weights=False)[1] is None and mine(xq)[1] is not None,
          "MHA: weights None only with need_weights=False")


# ===========================================================================
# 5. errors
# ===========================================================================
def test_errors():
    section("5. errors")
    q, k, v = randn(1, 2, 4, 3), randn(1, 2, 5, 3), randn(1, 2, 5, 2)
    # TypeError before any C call: spy on the library used by the binding
    spy = Spy(_lib.lib)
    saved = (_core.lib, bk_ops.lib)
    _core.lib = bk_ops.lib = spy
    try:
        check_raises(TypeError, lambda: bk.sinkhorn(q.astype(np.float64), k, v), "float64 q -> TypeError")
        check_raises(TypeError, lambda: bk.softmax(q, k.astype(np.int32), v), "int32 k -> TypeError")
        check_raises(TypeError, lambda: bk.esp(q, k, v.astype(np.float16)), "float16 v -> TypeError")
        check_raises(TypeError, lambda: bk.lot(q, k, v, randn(2, 3, 3), randn(2, 3), q_len=[1.5]),
                     "float lengths -> TypeError")
        check_raises(TypeError, lambda: bk.sinkhorn(q.tolist(), k, v), "list q -> TypeError")
        check_raises(TypeError, lambda: bk.otk(randn(2, 4, 3).astype(np.float64), randn(1, 2, 3)),
                     "otk float64 x -> TypeError")
        check_raises(TypeError, lambda: bt.sinkhorn_attention(*(torch.from_numpy(a).double() for a in (q, k, v))),
                     "torch float64 -> TypeError")
        check_raises(ValueError, lambda: bt.softmax_attention(*(torch.from_numpy(a).to("meta") for a in (q, k, v))),
                     "torch meta device -> ValueError")
        check_raises(ValueError, lambda: bk.sinkhorn(q[0], k, v), "3-D q -> ValueError")
        check_raises(ValueError, lambda: bk.sinkhorn(q, randn(1, 2, 5, 4), v), "k head dim mismatch -> ValueError")
        check_raises(ValueError, lambda: bk.sinkhorn(q, k, randn(1, 2, 6, 2)), "v length mismatch -> ValueError")
        check_raises(ValueError, lambda: bk.sinkhorn(q, k, v, q_len=[1, 2]), "q_len of wrong size -> ValueError")
        check_raises(ValueError, lambda: bk.sinkhorn(q, k, v, layout="bnd"), "unknown layout -> ValueError")
        check_raises(ValueError, lambda: bk.sinkhorn(q, k, v, grad="exact"), "unknown grad mode -> ValueError")
        check_raises(ValueError, lambda: bk.esp(q, k, v, sort="quick"), "unknown sort -> ValueError")
        check_raises(ValueError, lambda: bk.esp(q, k, v, theta=randn(2, 4)), "theta of wrong d -> ValueError")
        check_raises(ValueError, lambda: bk.lot(q, k, v, randn(2, 3, 4), randn(2, 3)), "Z of wrong d -> ValueError")
        check_raises(ValueError, lambda: bk.lot(q, k, v, randn(2, 3, 3), randn(2, 4)),
                     "theta of wrong r -> ValueError")
        check_raises(ValueError, lambda: bk.sinkhorn_backward(q, k, v, randn(1, 2, 4, 3)),
                     "dout of wrong shape -> ValueError")
        check_raises(ValueError, lambda: bk.otk(randn(2, 4, 3), randn(1, 2, 5), W=randn(5, 4)),
                     "otk W of wrong d -> ValueError")
        check_raises(ValueError, lambda: bk.sinkhorn(np.zeros((1, 2, 0, 3), np.float32), k, v),
                     "empty dimension -> ValueError")
        check_raises(TypeError, lambda: bk.sinkhorn(q, k, v, foo=1), "unknown option sinkhorn(foo=) -> TypeError")
        check_raises(TypeError, lambda: bk.otk(randn(2, 4, 3), randn(1, 2, 3), foo=1),
                     "unknown option otk(foo=) -> TypeError")
        check_raises(TypeError, lambda: bt.sinkhorn_attention(*(torch.from_numpy(a) for a in (q, k, v)), foo=1),
                     "unknown option torch sinkhorn_attention(foo=) -> TypeError")
        check_raises(TypeError, lambda: bk.sinkhorn(q, k, v, iters="many"), "non-numeric iters -> TypeError")
        check_raises(TypeError, lambda: bt.MultiheadAttention(8, 2, normaliser="sinkhorn", tau=1.0),
                     "MHA unknown option -> TypeError")
        check_raises(ValueError, lambda: bt.MultiheadAttention(8, 2, normaliser="cosine"),
                     "MHA unknown normaliser -> ValueError")
        check_raises(ValueError, lambda: bt.MultiheadAttention(8, 3), "MHA heads not dividing -> ValueError")
        check_raises(ValueError, lambda: bt.MultiheadAttention(8, 2, dropout=0.1), "MHA dropout -> ValueError")
        mha = bt.MultiheadAttention(8, 2, normaliser="softmax", batch_first=True)
        x = torch.from_numpy(randn(2, 4, 8))
        check_raises(ValueError, lambda: mha(x, key_padding_mask=torch.tensor([[False, True, False, False]] * 2)),
                     "MHA non-suffix key_padding_mask -> ValueError")
        check_raises(ValueError, lambda: mha(x, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool)),
                     "MHA key_padding_mask of wrong shape -> ValueError")
        check_raises(ValueError, lambda: mha(x, key_padding_mask=torch.zeros(2, 4)),
                     "MHA float key_padding_mask -> ValueError")
        check_raises(ValueError, lambda: mha(x, attn_mask=torch.zeros(4, 4)), "MHA attn_mask -> ValueError")
        check_raises(ValueError, lambda: mha(torch.from_numpy(randn(2, 4, 6))), "MHA wrong embed dim -> ValueError")
        # allowed: filling parameter structs (the defaults; the registry's schema queries and setters, which
        # run no operator); not allowed: a size query, a forward or a backward
        runs = ("bk_op_forward", "bk_op_backward", "bk_op_forward_arrays", "bk_op_backward_arrays",
                "bk_op_tape_size", "bk_op_workspace_size")
        bad = [c for c in spy.calls if c not in ("bk_esp_config_default", "bk_sinkhorn_config_default",
                                                 "bk_lot_config_default", "bk_otk_config_default")
               and not (c.startswith("bk_op_") and c not in runs)]
        check(not bad, "argument errors raised before any C operator call", "C called: %s" % bad)
    finally:
        _core.lib, bk_ops.lib = saved

    # errors from C: BirkhoffError with the C message and a status string
    def c_err(fn, name, contains=None):
        try:
            fn()
        except bk.BirkhoffError as e:
            ok = isinstance(e.status, str) and e.status and isinstance(e.code, int) and str(e)
            if contains is not None:
                ok = ok and contains in str(e)
            return check(ok, name, "status=%r code=%r message=%r" % (e.status, e.code, str(e)))
        except Exception as e:  # noqa: BLE001
            return check(False, name, "expected BirkhoffError, got %s: %s" % (type(e).__name__, e))
        return check(False, name, "expected BirkhoffError, nothing raised")
    c_err(lambda: bk.sinkhorn(q, k, v, eps=-1), "eps=-1 -> BirkhoffError mentioning eps", "eps")
    c_err(lambda: bk.sinkhorn(q, k, v, iters=0), "iters=0 -> BirkhoffError")
    c_err(lambda: bk.sinkhorn(q, k, v, q_len=[5]), "q_len > Nq -> BirkhoffError")
    c_err(lambda: bk.softmax(q, k, v, k_len=[-1]), "k_len < 0 -> BirkhoffError")
    qn = q.copy()
    qn[0, 1, 2, 0] = np.nan
    c_err(lambda: bk.sinkhorn(qn, k, v), "NaN in q -> BirkhoffError")
    c_err(lambda: bt.sinkhorn_attention(torch.from_numpy(qn), torch.from_numpy(k), torch.from_numpy(v)),
          "torch: NaN in q -> BirkhoffError")
    c_err(lambda: bk.esp(q, k, v, sort="soft", t=0), "esp soft t=0 -> BirkhoffError")
    c_err(lambda: bk.lot(q, k, v, randn(2, 3, 3), randn(2, 3), temp=-1), "lot temp<0 -> BirkhoffError")
    c_err(lambda: bk.otk(randn(2, 4, 3), randn(1, 2, 3), lengths=[0, 4]), "otk empty set -> BirkhoffError")
    c_err(lambda: bk.otk(randn(2, 4, 3), randn(1, 2, 3), eps=0), "otk eps=0 -> BirkhoffError")
    c_err(lambda: bk.otk(randn(2, 4, 3), randn(1, 2, 5)), "otk k != d without anchors -> BirkhoffError")
    c_err(lambda: bk.spherical_kmeans(randn(3, 4), 5), "kmeans K > N -> BirkhoffError")
    try:
        bk.sinkhorn(q, k, v, eps=-1)
    except bk.BirkhoffError as e:
        check(e.status == _lib.lib.bk_status_str(e.code).decode() and isinstance(e, RuntimeError),
              "BirkhoffError.status is bk_status_str(code), a RuntimeError", repr(e.status))
        check(str(e) == _lib.lib.bk_last_error().decode() and e.status == "parameter out of range",
              "BirkhoffError message is bk_last_error()", "%r / %r" % (str(e), e.status))
    # a backward with another problem's tape
    r = bk.sinkhorn(q, k, v, iters=3)
    c_err(lambda: bk.sinkhorn_backward(q, k, v, randn(1, 2, 4, 2), r.tape, iters=5),
          "backward with a tape of other params -> BirkhoffError")


# ===========================================================================
# 6. ASAP
# ===========================================================================
def test_asap():
    section("6. ASAP")
    d, H, N, B = 8, 2, 12, 2
    amp = np.float32(0.7)     # q, k ~ N(0, 0.49): scores of a trained layer's size, |C| <~ 3

    def rms_rel(o, ref):
        """the C library's fidelity metric: out_rmse / out_rms"""
        return float(np.sqrt(np.mean((o.astype(np.float64) - ref) ** 2) / np.mean(ref.astype(np.float64) ** 2)))
    for S in (5, 6):
        cal = bk.AsapCalibration(d, teacher_iters=S, eps=1.0, slices=24, seed=3, keep_kl=True)
        for _ in range(12):
            cal.add(amp * randn(B, H, N, d), amp * randn(B, H, N, d))
        cal.add(amp * randn(B, H, N, d), amp * randn(B, H, N, d), q_len=[N, 7], k_len=[9, N])
        q, k, v = amp * randn(B, H, N, d), amp * randn(B, H, N, d), randn(B, H, N, d)
        teacher = bk.sinkhorn(q, k, v, iters=S, eps=1.0).out
        base = rms_rel(bk.softmax(q, k, v).out, teacher)
        for method in ("ls", "kl"):
            lay, rep = cal.fit(method)
            tag = "asap S=%d %s" % (S, method)
            check(lay.d == d and lay.slices == 24 and lay.teacher_iters == S and lay.eps == 1.0
                  and abs(lay.scale - 1 / math.sqrt(d)) < 1e-7, tag + ": layer fields")
            th = lay.theta
            check(th.shape == (24, d) and np.allclose(np.linalg.norm(th, axis=1), 1, atol=1e-5)
                  and lay.omega.shape == (24,) and bool(np.all(np.isfinite(lay.omega))),
                  tag + ": theta unit rows, omega finite")
            check(rep["problems"] == 13 * B * H and rep["rows"] == 12 * B * H * N + H * (N + 7),
                  tag + ": report counts", "%s %s" % (rep["problems"], rep["rows"]))
            if method == "kl":
                check(rep["kl_j"] <= rep["kl_j0"] + 1e-9, tag + ": KL objective decreased",
                      "%g -> %g" % (rep["kl_j0"], rep["kl_j"]))
            res = lay.forward(q, k, v, attn=True, fhat=True, diag=True)
            # relative RMS error < 0.1, and well below softmax's distance to the teacher
            r = rms_rel(res.out, teacher)
            check(r < 0.1 and r < 0.5 * base, tag + ": forward close to Sinkhorn(S)",
                  "relative RMS error %.3e (softmax: %.3e)" % (r, base))
            check(res.fhat.shape == (B, H, N) and res.attn.shape == (B, H, N, N), tag + ": extras shapes")
            X = lay.features(q, k)
            check_close(np.einsum("bhnl,l->bhn", X.astype(np.float64), lay.omega), res.fhat, 1e-4,
                        tag + ": fhat == X omega")
            # save / load: bitwise-identical forward
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "layer.bkasap")
                lay.save(path)
                lay2 = bk.AsapLayer.load(path)
                check(np.array_equal(lay2.forward(q, k, v).out, res.out) and np.array_equal(lay2.omega, lay.omega),
                      tag + ": save/load gives a bitwise-identical forward")
                raw = bytearray(open(path, "rb").read())
                for what, data in (("flipped byte", raw[:len(raw) // 2] + bytes([raw[len(raw) // 2] ^ 0x55])
                                    + raw[len(raw) // 2 + 1:]),
                                   ("truncated", raw[:len(raw) - 9]), ("empty", b""),
                                   ("bad magic", b"XXXXXX" + raw[6:])):
                    bad = os.path.join(tmp, "bad.bkasap")
                    with open(bad, "wb") as f:
                        f.write(bytes(data))
                    check_raises(bk.BirkhoffError, lambda: bk.AsapLayer.load(bad),
                                 tag + ": loading a corrupt file (%s) -> BirkhoffError" % what)
                check_raises(bk.BirkhoffError, lambda: bk.AsapLayer.load(os.path.join(tmp, "missing")),
                             tag + ": loading a missing file -> BirkhoffError")
        # closure from the teacher's own dual reproduces the teacher (odd S, auto = row-ending)
        y = bk.asap_teacher_dual(q, k, eps=1.0, teacher_iters=S)
        closed = lay.close(y, q, k, v, variant="auto").out
        if S % 2 == 1:
            check_close(closed, teacher, 1e-4, "asap S=%d: close(teacher dual, auto) == Sinkhorn(S)" % S)
        else:
            zero = lay.close(y, q, k, v, variant="zero").out
            check_close(zero, teacher, 1e-4, "asap S=%d: close(teacher dual, zero) == Sinkhorn(S)" % S)
            s2 = bk.sinkhorn(q, k, v, iters=S + 2, eps=1.0).out
            check_close(closed, s2, 1e-4, "asap S=%d: close(teacher dual, auto) == Sinkhorn(S+2)" % S)
        # padding: padded query rows zero
        rp = lay.forward(q, k, v, q_len=[N, 5], k_len=[7, N])
        check(not np.any(rp.out[1, :, 5:]), "asap S=%d: padded rows zero" % S)
        check_raises(ValueError, lambda: lay.forward(randn(1, 1, 4, d + 1), randn(1, 1, 4, d + 1),
                                                     randn(1, 1, 4, 2)), "asap: wrong head dim -> ValueError")
    empty = bk.AsapCalibration(4, teacher_iters=4)
    check_raises(bk.BirkhoffError, lambda: empty.fit("ls"), "asap: fit without problems -> BirkhoffError")
    check_raises(bk.BirkhoffError, lambda: empty.fit("kl"), "asap: kl fit without keep_kl -> BirkhoffError")
    check_raises(bk.BirkhoffError, lambda: bk.AsapCalibration(4, teacher_iters=1),
                 "asap: teacher_iters=1 -> BirkhoffError")


# ===========================================================================
# 7. OTK fitting
# ===========================================================================
def test_otk_fit():
    section("7. OTK fitting")
    x = randn(200, 6)
    c1, rep = bk.spherical_kmeans(x, 5, seed=3)
    c2, _ = bk.spherical_kmeans(x, 5, seed=3)
    c3, _ = bk.spherical_kmeans(x, 5, seed=4, init="random")
    check(c1.shape == (5, 6) and np.allclose(np.linalg.norm(c1, axis=1), 1, atol=1e-5),
          "spherical_kmeans: [K, dim] unit rows")
    check(np.array_equal(c1, c2), "spherical_kmeans: deterministic for a seed")
    check(np.allclose(np.linalg.norm(c3, axis=1), 1, atol=1e-5) and rep["iters"] >= 1
          and -1 <= rep["objective"] <= 1, "spherical_kmeans: random init, report", str(rep))
    xs, _, _ = otk_inputs(6, 10, 6, 4, 2, 3, False)
    lens = [10, 8, 6, 10, 4, 9]
    xn = xs.copy()
    for b, L in enumerate(lens):
        xn[b, L:] = np.nan
    W, rep = bk.otk_fit_anchors(xn, 4, lengths=lens, seed=1)
    check(W.shape == (4, 6) and np.allclose(np.linalg.norm(W, axis=1), 1, atol=1e-5),
          "otk_fit_anchors: [k, d] unit rows (NaN padding ignored)")
    W2, _ = bk.otk_fit_anchors(xn, 4, lengths=lens, seed=1)
    check(np.array_equal(W, W2), "otk_fit_anchors: deterministic")
    for qq, anchors in ((1, False), (2, True), (3, True)):
        z, rep = bk.otk_fit_refs(xn, qq, 3, lengths=lens, W=W if anchors else None, seed=2, sigma=0.7, eps=0.5,
                                 barycenter=1 if qq == 2 else 0)
        kk = 4 if anchors else 6
        check(z.shape == (qq, 3, kk) and np.allclose(np.linalg.norm(z, axis=-1), 1, atol=1e-5)
              and bool(np.all(np.isfinite(z))), "otk_fit_refs q=%d W=%s: [q, p, k] unit rows" % (qq, anchors),
              str(z.shape))
        out = bk.otk(xn, z, lengths=lens, W=W if anchors else None, sigma=0.7).out
        check(bool(np.all(np.isfinite(out))), "otk_fit_refs q=%d: usable references" % qq)
    bk.set_num_threads(1)
    z1, _ = bk.otk_fit_refs(xn, 2, 3, lengths=lens, W=W, seed=2, sigma=0.7)
    bk.set_num_threads(2)
    z2, _ = bk.otk_fit_refs(xn, 2, 3, lengths=lens, W=W, seed=2, sigma=0.7)
    check(np.array_equal(z1, z2), "otk_fit_refs: same for 1 and 2 threads")


# ===========================================================================
# 8. threads
# ===========================================================================
def test_threads():
    section("8. threads")
    for (B, H) in ((2, 3), (1, 1)):
        q, k, v = randn(B, H, 12, 8), randn(B, H, 11, 8), randn(B, H, 11, 5)
        dout = randn(B, H, 12, 5)
        res = []
        for nt in (1, 2):
            bk.set_num_threads(nt)
            check(bk.get_num_threads() == nt, "set_num_threads(%d) / get_num_threads" % nt)
            r = bk.sinkhorn(q, k, v, iters=7, eps=0.8, q_len=[12, 9][:B], k_len=[11, 6][:B])
            g = bk.sinkhorn_backward(q, k, v, dout, r.tape, iters=7, eps=0.8, q_len=[12, 9][:B], k_len=[11, 6][:B])
            e = bk.esp(q, k, v, sort="soft", t=0.5, tau=1.0).out
            res.append([r.out, *g, e])
        check(all(np.array_equal(a, b) for a, b in zip(*res)),
              "threads: 1 vs 2 bitwise (sinkhorn fwd/bwd, esp) B*H=%d" % (B * H))
    bk.set_num_threads(0)


# ===========================================================================
# 9. leaks
# ===========================================================================
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_leaks():
    section("9. leaks")
    q, k, v = (torch.from_numpy(randn(1, 2, 6, 4)).requires_grad_(True) for _ in range(3))
    dout = torch.from_numpy(randn(1, 2, 6, 4))
    qa, ka, va = randn(1, 2, 6, 4), randn(1, 2, 6, 4), randn(1, 2, 6, 4)

    def torch_call():
        o = bt.sinkhorn_attention(q, k, v, iters=3, q_len=[5], k_len=[6])
        o.backward(dout)
        q.grad = k.grad = v.grad = None

    def esp_call():
        bk.esp(qa, ka, va, sort="soft", t=0.5, tau=1.0, weights=True, diag=True)

    def asap_call():
        c = bk.AsapCalibration(4, teacher_iters=4, slices=4, keep_kl=True)
        c.add(qa, ka)
        lay, _ = c.fit("kl")
        del lay, c

    for name, fn, n in (("torch sinkhorn fwd+bwd", torch_call, 10000), ("numpy esp", esp_call, 10000),
                        ("asap calibration cycle", asap_call, 2000)):
        t = time.time()
        for _ in range(500):
            fn()
        before = rss_mb()
        for _ in range(n):
            fn()
        grow = rss_mb() - before
        check(grow < 8, "leak: %d x %s: RSS growth %.2f MB < 8 MB" % (n, name, grow), "%.2f MB" % grow)
        print("   %s: %d calls, %.1fs, RSS %+.2f MB" % (name, n, time.time() - t, grow))


def test_regressions():
    section("10. regressions (found in review)")
    # broadcast (zero-stride) operands are copied, not refused: dv = 1 makes
    # autograd hand over an expanded dout
    q = torch.randn(1, 2, 4, 3, requires_grad=True)
    k, v1 = torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 1)
    bt.softmax_attention(q, k, v1).sum().backward()
    check(q.grad is not None and torch.isfinite(q.grad).all(), "dv = 1: backward of sum() (expanded dout)")
    kshared = torch.randn(1, 1, 5, 3)
    a = bt.sinkhorn_attention(q, kshared.expand(1, 2, 5, 3), v1)
    b = bt.sinkhorn_attention(q, kshared.expand(1, 2, 5, 3).contiguous(), v1)
    check(torch.equal(a, b), "keys broadcast over heads == their dense copy")
    qn, kn, vn = randn(1, 2, 4, 3), randn(1, 2, 5, 3), randn(1, 2, 5, 3)
    dout = np.broadcast_to(np.arange(3, dtype=np.float32), (1, 2, 4, 3))
    g1 = bk.sinkhorn_backward(qn, kn, vn, dout)
    g2 = bk.sinkhorn_backward(qn, kn, vn, np.ascontiguousarray(dout))
    check(all(np.array_equal(x, y) for x, y in zip(g1, g2)), "numpy: broadcast dout == dense dout")
    # numpy parameters while autograd records
    Zn, thn = randn(2, 3, 3), np.zeros((2, 3), np.float32)
    y = bt.lot_attention(q, k, v1, Zn, thn)
    y.sum().backward()
    check(torch.equal(y, bt.lot_attention(q, k, v1, torch.from_numpy(Zn), torch.from_numpy(thn))),
          "lot_attention: numpy pivots under autograd")
    th = unit_rows(randn(4, 3))
    check(torch.equal(bt.esp_attention(q, k, v1, theta=th, sort="soft", t=0.3),
                      bt.esp_attention(q, k, v1, theta=torch.from_numpy(th), sort="soft", t=0.3)),
          "esp_attention: numpy theta under autograd")
    x = torch.randn(2, 5, 4, requires_grad=True)
    zn = randn(2, 3, 4)
    check(torch.equal(bt.otk_embedding(x, zn), bt.otk_embedding(x, torch.from_numpy(zn))),
          "otk_embedding: numpy references under autograd")
    check_raises(TypeError, lambda: bt.lot_attention(q, k, v1, Zn.astype(np.float64), thn), "float64 numpy pivots")
    # Result: attribute access of a missing extra is an AttributeError
    r = bk.softmax(qn, kn, vn)
    check(not hasattr(r, "attn") and getattr(r, "attn", None) is None, "Result: missing extra -> AttributeError")
    import copy
    check(np.array_equal(copy.deepcopy(r).out, r.out), "Result: deepcopy")
    # lengths and key_padding_mask together are ambiguous
    m = bt.MultiheadAttention(8, 2, normaliser="softmax", batch_first=True)
    X = torch.randn(2, 5, 8)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    check_raises(ValueError, lambda: m(X, key_padding_mask=pad, lengths=[5, 3]), "lengths + key_padding_mask")
    # drop-in: torch's defaults (sequence-first, need_weights=True with head-averaged weights)
    E, H = 8, 2
    mine = bt.MultiheadAttention(E, H, normaliser="softmax")
    ref = torch.nn.MultiheadAttention(E, H)
    ref.load_state_dict(mine.state_dict())
    xs = torch.randn(7, 3, E)
    o1, w1 = mine(xs, xs, xs)
    o2, w2 = ref(xs, xs, xs)
    check((o1 - o2).abs().max() < 1e-5 and w1 is not None and (w1 - w2).abs().max() < 1e-6,
          "drop-in defaults: sequence-first output and averaged weights == torch's")
    w1h = mine(xs, xs, xs, average_attn_weights=False)[1]
    w2h = ref(xs, xs, xs, average_attn_weights=False)[1]
    check(tuple(w1h.shape) == (3, H, 7, 7) and (w1h - w2h).abs().max() < 1e-6, "per-head weights == torch's")
    mk = bt.MultiheadAttention(E, H, normaliser="sinkhorn", iters=4)  # (even S: exact columns)
    Ws = mk(xs, xs, xs, average_attn_weights=False)[1]
    Wsm = mine(xs, xs, xs, average_attn_weights=False)[1]
    col_err = (Ws.sum(-1) - 1).abs().max().item()
    check(torch.allclose(Ws.sum(-2), torch.ones(3, H, 7), atol=1e-5) and col_err < (Wsm.sum(-2) - 1).abs().max(),
          "Sinkhorn weights: columns sum to 1, rows closer to 1 than softmax's columns", "row err %.3g" % col_err)
    mk.zero_grad()
    mk(xs, xs, xs, need_weights=False)[0].sum().backward()
    g1 = mk.in_proj_weight.grad.clone()
    mk.zero_grad()
    mk(xs, xs, xs)[0].sum().backward()
    check(torch.equal(g1, mk.in_proj_weight.grad), "need_weights does not change the gradients")
    check_raises(ValueError, lambda: bt.MultiheadAttention(E, H, normaliser="sinkhorn", iters=2.7),
                 "non-integer iters refused")
    check_raises(ValueError, lambda: bt.MultiheadAttention(E, H, kdim=4), "kdim != embed_dim refused")
    check_raises(ValueError, lambda: bt.MultiheadAttention(E, H, add_bias_kv=True), "add_bias_kv refused")
    check_raises(ValueError, lambda: mine(xs, xs, xs, None, False, torch.zeros(7, 7)), "positional attn_mask refused")
    check("r=5" in repr(bt.LOTAttention(E, H, r=5)), "LOTAttention repr shows r")


def test_hostile_numbers():
    """issue 41: values that cannot be represented, integers that would wrap,
    sparse tensors, second derivatives, raw bytes in messages"""
    section("11. hostile numbers and messages (issue 41)")
    rng = np.random.default_rng(41)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 2, 4, 4), (1, 2, 5, 4), (1, 2, 5, 4)))
    big = (q * 1e20, k * 1e20, v)

    # finite inputs whose scores overflow float32: BirkhoffError, never NaN with success
    def overflow(fn, name):
        try:
            out = fn()
        except bk.BirkhoffError as e:
            return check(e.status == "float32 overflow" and "overflow" in str(e), name, "%s: %s" % (e.status, e))
        except Exception as e:  # noqa: BLE001
            return check(False, name, "expected BirkhoffError, got %s: %s" % (type(e).__name__, e))
        return check(False, name, "no error; finite output: %s" % bool(np.all(np.isfinite(np.asarray(out)))))
    overflow(lambda: bk.softmax(*big).out, "overflow: softmax |q|,|k| ~ 1e20 -> BirkhoffError")
    overflow(lambda: bk.sinkhorn(*big).out, "overflow: sinkhorn |q|,|k| ~ 1e20 -> BirkhoffError")
    overflow(lambda: bk.sinkhorn(q * 10, k, v, scale=1e38).out, "overflow: sinkhorn scale=1e38 -> BirkhoffError")
    overflow(lambda: bk.unbalanced(*big).out, "overflow: unbalanced -> BirkhoffError")
    overflow(lambda: bk.esp(*big).out, "overflow: esp -> BirkhoffError")
    overflow(lambda: bk.diff(*big, 0.3).out, "overflow: diff -> BirkhoffError")
    overflow(lambda: bk.attention("sinkhorn", q * 10, k, v, scale=1e38).out, "overflow: attention('sinkhorn') -> BirkhoffError")
    overflow(lambda: bt.sinkhorn_attention(*(torch.from_numpy(a) for a in big)).detach().numpy(),
             "overflow: torch sinkhorn_attention -> BirkhoffError")
    overflow(lambda: bk.sinkhorn_backward(q, k, v, np.full((1, 2, 4, 4), 3e38, np.float32))[0],
             "overflow: sinkhorn backward with dout ~ 3e38 -> BirkhoffError")

    # integers that do not fit the C type: refused (ctypes would wrap 2**32 + 5 to 5), naming the argument
    n0 = bk.get_num_threads()
    check_raises(ValueError, lambda: bk.set_num_threads(2**32 + 2), "set_num_threads(2**32+2) -> ValueError",
                 "set_num_threads")
    check_raises(ValueError, lambda: bk.set_num_threads(5000), "set_num_threads(5000) -> ValueError", "4096")
    check(bk.get_num_threads() == n0, "a refused set_num_threads leaves the count", "%d != %d"
          % (bk.get_num_threads(), n0))
    check_raises(ValueError, lambda: bk.sinkhorn(q, k, v, iters=2**32 + 5), "sinkhorn(iters=2**32+5) -> ValueError",
                 "iters")
    check_raises(ValueError, lambda: bt.sinkhorn_attention(*(torch.from_numpy(a) for a in (q, k, v)),
                                                           iters=2**32 + 5),
                 "torch sinkhorn_attention(iters=2**32+5) -> ValueError", "iters")
    check_raises(ValueError, lambda: bk.esp(q, k, v, slices=2**32 + 3), "esp(slices=2**32+3) -> ValueError",
                 "slices")
    check_raises(ValueError, lambda: bk.esp(q, k, v, slices=3, seed=-1), "esp(seed=-1) -> ValueError", "seed")
    check_raises(ValueError, lambda: bk.esp(q, k, v, slices=3, seed=2**64), "esp(seed=2**64) -> ValueError",
                 "seed")
    check_raises(ValueError, lambda: bk.spherical_kmeans(rng.standard_normal((8, 3)), 2**32 + 2),
                 "spherical_kmeans(K=2**32+2) -> ValueError", "K")
    check_raises(ValueError, lambda: bk.esp_slices(2**32 + 4), "esp_slices(d=2**32+4) -> ValueError", "d")
    check_raises(ValueError, lambda: bk.otk_fit_anchors(rng.standard_normal((2, 6, 3)).astype(np.float32),
                                                        2**32 + 2), "otk_fit_anchors(k=2**32+2) -> ValueError", "k")
    # the ctypes layer itself: an integer argument outside its C type never wraps
    try:
        _lib.lib.bk_esp_num_slices(None, 2**32 + 4)
        check(False, "ctypes int argument 2**32+4 refused", "accepted")
    except Exception as e:  # noqa: BLE001 (ctypes.ArgumentError)
        check("2147483647" in str(e), "ctypes int argument 2**32+4 refused with the range", str(e))

    # messages from C are escaped: what they echo cannot drive a terminal
    try:
        bk.attention("sinkhorn", q, k, v, **{"it\x1b[2J\rers": 3})
        check(False, "BirkhoffError message escaped", "no error")
    except bk.BirkhoffError as e:
        check("\x1b" not in str(e) and "\r" not in str(e) and "it\\x1b[2J\\rers" in str(e),
              "BirkhoffError message escaped (bk_last_error)", repr(str(e)))

    # sparse tensors: TypeError naming the argument, before C
    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
    for name, args in (("q", (qt.to_sparse(), kt, vt)), ("k", (qt, kt.to_sparse(), vt)), ("v", (qt, kt, vt.to_sparse()))):
        check_raises(TypeError, lambda: bt.sinkhorn_attention(*args), "torch: sparse %s -> TypeError" % name,
                     "%s: a dense" % name)
    check_raises(TypeError, lambda: bt.esp_attention(qt, kt, vt, theta=torch.eye(4).to_sparse()),
                 "torch: sparse theta -> TypeError", "theta")
    check_raises(TypeError, lambda: bt.sinkhorn_attention(qt, kt, vt, k_len=torch.tensor([3]).to_sparse()),
                 "torch: sparse k_len -> TypeError", "k_len")

    # second derivatives: a clear error, not a gradient without a graph
    th = torch.randn(2, 3, 4)
    fns = (("softmax", lambda a, b, c: bt.softmax_attention(a, b, c)),
           ("sinkhorn", lambda a, b, c: bt.sinkhorn_attention(a, b, c)),
           ("attention", lambda a, b, c: bt.attention("unbalanced", a, b, c)),
           ("esp", lambda a, b, c: bt.esp_attention(a, b, c, sort="soft")),
           ("lot", lambda a, b, c: bt.lot_attention(a, b, c, th, torch.zeros(2, 3))),
           ("diff", lambda a, b, c: bt.diff_attention(a, b, c, torch.tensor([0.3, 0.2]))),
           ("otk", lambda a, b, c: bt.otk_embedding(a[0], torch.randn(1, 2, 4))))
    for name, fn in fns:
        a, b, c = (t.clone().requires_grad_() for t in (qt, kt, vt))
        g, = torch.autograd.grad(fn(a, b, c).pow(2).sum(), a, create_graph=True)
        check(g.requires_grad, "double backward %s: the gradient keeps a node (create_graph=True)" % name)
        check_raises(RuntimeError, lambda: g.pow(2).sum().backward(), "double backward %s -> RuntimeError" % name,
                     "differentiate twice")


def main():
    print("birkhoff %s (%s) from %s" % (bk.version(), bk.isa(), bk.LIBRARY_PATH))
    for fn in (test_softmax_sinkhorn, test_unbalanced, test_causal, test_registry, test_esp, test_lot, test_diff, test_otk, test_layouts, test_gradcheck,
               test_mha_equivalence, test_errors, test_asap, test_otk_fit, test_threads, test_leaks,
               test_regressions, test_hostile_numbers):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            check(False, fn.__name__, "raised %s: %s" % (type(e).__name__, e))
    for tol in sorted(WORST):
        print("worst relative error against tolerance %.0e: %.2e" % (tol, WORST[tol]))
    return check.summary(" (%.1fs)" % (time.time() - T0))


if __name__ == "__main__":
    sys.exit(main())
