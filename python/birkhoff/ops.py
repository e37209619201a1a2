"""numpy API: every operator's forward and backward on float32 arrays.

Attention operands q [B, H, Nq, d], k [B, H, Nk, d], v [B, H, Nk, dv] in
layout "bhnd" (default), or [B, N, H, C] with layout="bnhd"; any strides
with a unit-stride last axis are used in place (others are copied). q_len,
k_len: optional [B] integer valid lengths (padding at the end of each
sequence; padded output rows and gradients are zero). Outputs come back
dense in the operands' layout. Parameters left at None take the C library's
defaults (include/birkhoff/*.h documents each; e.g. Sinkhorn eps = 1,
iters = 5, scale = 1/sqrt(d)).

A forward returns a Result (a dict with attribute access): `out`, `tape`
(an opaque uint8 array for the backward; tape=False skips it) and the
optional extras asked for. A backward takes the same operands and
parameters, the output gradient and the forward's tape (None recomputes the
forward), and returns the input gradients.

Errors: wrong types, dtypes, ranks or shapes raise TypeError/ValueError
before any C call; everything the C library refuses raises
birkhoff.BirkhoffError carrying the C message.
"""
import ctypes as C

import numpy as np

from . import _core as K
from . import _lib
from ._lib import check, lib

__all__ = ["Result", "operators", "describe", "attention", "attention_backward", "softmax", "softmax_backward", "sinkhorn", "sinkhorn_backward", "unbalanced",
           "unbalanced_backward", "esp", "esp_backward",
           "esp_slices", "lot", "lot_backward", "diff", "diff_backward", "otk", "otk_backward", "otk_features", "spherical_kmeans",
           "otk_fit_anchors", "otk_fit_refs", "AsapCalibration", "AsapLayer", "asap_teacher_dual"]

NP = K.NP


class Result(dict):
    """A forward's outputs: out, tape and the extras asked for (as keys and
    as attributes)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _problem(q, k, v, q_len, k_len, layout):
    return K.Problem(NP, q, k, v, q_len, k_len, layout)


# ---- any registered operator, by name (the C registry, birkhoff/ops.h) ----

def operators():
    """The names of the registered attention operators (softmax, sinkhorn,
    unbalanced, esp, asap, lot, diff, ...: the C library's list)."""
    return K.operator_names()


def describe(name):
    """What operator `name` computes and its keywords (parameters with type,
    default, range and meaning; its arrays), from the C registry's schema."""
    return K.describe(name)


def attention(name, q, k, v, *, q_len=None, k_len=None, layout="bhnd", attn=False, tape=True, **params):
    """Any registered operator by name (operators(); a preset such as
    "asap0" too), its keywords checked against the operator's schema (the
    C registry's; describe(name) lists them):
      - parameters by key (the C struct's field names, e.g. iters=5,
        eps=0.5, rho=2, sort="soft"; an older CLI alias too; the library's
        defaults for the others), set through the C setter, which checks
        each key's range;
      - input arrays by name (lot: pivots=Z, pivot_logits=theta; diff:
        lambda=lam; esp: slices=theta; asap: layer="F.asap");
      - extra outputs by name=True (diag=True, sigma=True, f=True, ...),
        returned in the Result under their names.
    An unknown name lists the registry; an unknown key or a bad value raises
    BirkhoffError naming it; an input array of the wrong shape ValueError.
    The docstring's end lists every operator's keywords."""
    op = K.Registered(name, params)
    pr = _problem(q, k, v, q_len, k_len, layout)
    return Result(op.forward(pr, tape, attn))


def attention_backward(name, q, k, v, dout, tape=None, *, q_len=None, k_len=None, layout="bhnd", **params):
    """(dq, dk, dv) of attention(name, ...) with the same keywords; tape
    None recomputes the forward. The backward's outputs asked for by
    name=True (dlambda=True, dpivots=True, dslices=True) come as a fourth
    element, a dict by name."""
    op = K.Registered(name, params)
    pr = _problem(q, k, v, q_len, k_len, layout)
    any_bwd = any(op.sc["arrays"][j]["kind"] & _lib.OP_ARRAY_BWD for j in op.want)
    return op.backward(pr, dout, tape, outputs=any_bwd)


def _schema_doc():
    return "\n\n".join(K.describe(n) for n in K.operator_names())


attention.__doc__ += "\n\n" + _schema_doc()


# ---- the typed functions: thin wrappers over the generic path ----

def softmax(q, k, v, *, q_len=None, k_len=None, layout="bhnd", scale=None, causal=False, attn=False, tape=True):
    """Softmax attention O = softmax(scale q k^T) v; attn=True adds the
    [B, H, Nq, Nk] attention. causal=True: query i sees keys j <= i +
    (Lk - Lq) (the queries are the last positions; Lk >= Lq required)."""
    pr = _problem(q, k, v, q_len, k_len, layout)
    return Result(K.softmax_op(scale, causal).forward(pr, tape, attn))


def softmax_backward(q, k, v, dout, tape=None, *, q_len=None, k_len=None, layout="bhnd", scale=None, causal=False):
    """(dq, dk, dv)"""
    pr = _problem(q, k, v, q_len, k_len, layout)
    return K.softmax_op(scale, causal).backward(pr, dout, tape)


# ---- Sinkhorn ----

def _sk_result(res, B, H, diag):
    if "f" in res:
        res["f"], res["g"] = res["f"].reshape(B, H, -1), res["g"].reshape(B, H, -1)
    if diag:
        res["diag"] = K.diag_dict(res["diag"], B, H, ("iters", "row_err", "col_err"))
    return Result(res)


def _sk_outputs(potentials, diag):
    return (("f", "g") if potentials else ()) + (("diag",) if diag else ())


def sinkhorn(q, k, v, *, q_len=None, k_len=None, layout="bhnd", scale=None, eps=None, iters=None, tol=None,
             grad=None, attn=False, potentials=False, diag=False, tape=True):
    """Sinkhorn attention (Sinkformers): `iters` log-domain half-steps, row
    first, from the scores scale q k^T / eps; A = Nq P. Extras: attn
    [B, H, Nq, Nk]; potentials: f [B, H, Nq], g [B, H, Nk] (logit units);
    diag: {iters, row_err, col_err} arrays [B, H]. grad: "unrolled"
    (default, exact VJP of the iterations) or "implicit" (fixed point)."""
    pr = _problem(q, k, v, q_len, k_len, layout)
    op = K.sinkhorn_op(scale, eps, iters, tol, grad, _sk_outputs(potentials, diag))
    return _sk_result(op.forward(pr, tape, attn), pr.desc.B, pr.desc.H, diag)


def sinkhorn_backward(q, k, v, dout, tape=None, *, q_len=None, k_len=None, layout="bhnd", scale=None, eps=None,
                      iters=None, tol=None, grad=None):
    """(dq, dk, dv)"""
    pr = _problem(q, k, v, q_len, k_len, layout)
    return K.sinkhorn_op(scale, eps, iters, tol, grad).backward(pr, dout, tape)


# ---- unbalanced Sinkhorn ----

def unbalanced(q, k, v, *, q_len=None, k_len=None, layout="bhnd", scale=None, eps=None, iters=None, tol=None,
               rho=None, attn=False, potentials=False, diag=False, tape=True):
    """Unbalanced Sinkhorn attention (the Sinkformers code's
    SinkhornUnbalanced): Sinkhorn's row half-steps, column half-steps damped
    by rho / (rho + eps) (a KL penalty rho on the column marginal; default
    10). Extras as sinkhorn()."""
    pr = _problem(q, k, v, q_len, k_len, layout)
    op = K.unbalanced_op(scale, eps, iters, tol, rho, _sk_outputs(potentials, diag))
    return _sk_result(op.forward(pr, tape, attn), pr.desc.B, pr.desc.H, diag)


def unbalanced_backward(q, k, v, dout, tape=None, *, q_len=None, k_len=None, layout="bhnd", scale=None, eps=None,
                        iters=None, tol=None, rho=None):
    """(dq, dk, dv)"""
    pr = _problem(q, k, v, q_len, k_len, layout)
    return K.unbalanced_op(scale, eps, iters, tol, rho).backward(pr, dout, tape)


# ---- ESP ----

def esp(q, k, v, *, q_len=None, k_len=None, layout="bhnd", sort=None, t=None, tau=None, scale=None, cost=None,
        out_scale=None, slices=None, theta=None, seed=None, attn=False, weights=False, diag=False, tape=True):
    """ESP attention (ESPFormer). sort "hard" (default; exactly doubly
    stochastic) or "soft" (SoftSort temperature t; rows and columns of the
    attention sum to 1 only approximately, see diag); tau: slice-mixing
    inverse temperature; t and tau in the C library's units, not the
    paper's (docs/ALGORITHMS.md section 4.3: the reference's temperature T
    is tau = T * N with cost "euclid"); cost "sq" or "euclid"; out_scale
    "rows" (A = n G: rows sum to 1 under hard sort) or "paper"; slices: 0 =
    axis-aligned (L = d), L > 0 random unit directions from seed, or theta
    [L, d] given. Extras: attn; weights: sigma and D [B, H, L]; diag."""
    pr = _problem(q, k, v, q_len, k_len, layout)
    pr.host_only("ESP attention")
    outs = (("sigma", "costs") if weights else ()) + (("diag",) if diag else ())
    res = K.esp_op(sort, t, tau, scale, cost, out_scale, slices, theta, seed, outs).forward(pr, tape, attn)
    if weights:
        res["D"] = res.pop("costs")
    if diag:
        res["diag"] = K.diag_dict(res["diag"], pr.desc.B, pr.desc.H, ("row_err", "col_err"))
    return Result(res)


def esp_backward(q, k, v, dout, tape=None, *, q_len=None, k_len=None, layout="bhnd", sort=None, t=None, tau=None,
                 scale=None, cost=None, out_scale=None, slices=None, theta=None, seed=None):
    """(dq, dk, dv, dtheta): dtheta [L, d] summed over problems (zero under
    hard sort)"""
    pr = _problem(q, k, v, q_len, k_len, layout)
    pr.host_only("ESP attention")
    op = K.esp_op(sort, t, tau, scale, cost, out_scale, slices, theta, seed, ("dslices",))
    dq, dk, dv, g = op.backward(pr, dout, tape, outputs=True)
    return dq, dk, dv, g["dslices"]


def esp_slices(d, *, slices=None, theta=None, seed=None):
    """The [L, d] slice matrix ESP uses for head dim d."""
    return K.esp_slices(K.esp_op(slices=slices, theta=theta, seed=seed), _lib.check_int(d, C.c_int, "d", lo=1))


# ---- LOT ----

def lot(q, k, v, Z, theta, *, q_len=None, k_len=None, layout="bhnd", temp=None, iters=None, eps=None, scale=None,
        tol=None, attn=False, diag=False, tape=True):
    """LOT attention (LOTFormer, linear time): r pivots Z [H, r, d] with
    mass logits theta [H, r] (p0 = softmax(theta / temp)); two `iters`-step
    Sinkhorn problems through the pivots. Extras: attn (dense, small
    problems), diag {iters1, iters2, row_err, col_err}."""
    pr = _problem(q, k, v, q_len, k_len, layout)
    pr.host_only("LOT attention")
    op = K.lot_op(Z, theta, temp, iters, eps, scale, tol, ("diag",) if diag else ())
    res = op.forward(pr, tape, attn)
    if diag:
        res["diag"] = K.diag_dict(res["diag"], pr.desc.B, pr.desc.H, ("iters1", "iters2", "row_err", "col_err"))
    return Result(res)


def lot_backward(q, k, v, Z, theta, dout, tape=None, *, q_len=None, k_len=None, layout="bhnd", temp=None,
                 iters=None, eps=None, scale=None, tol=None):
    """(dq, dk, dv, dZ, dtheta): dZ [H, r, d], dtheta [H, r] summed over the
    batch"""
    pr = _problem(q, k, v, q_len, k_len, layout)
    pr.host_only("LOT attention")
    op = K.lot_op(Z, theta, temp, iters, eps, scale, tol, ("dpivots", "dpivot_logits"))
    dq, dk, dv, g = op.backward(pr, dout, tape, outputs=True)
    return dq, dk, dv, g["dpivots"], g["dpivot_logits"]


# ---- differential attention ----

def diff(q, k, v, lam, *, q_len=None, k_len=None, layout="bhnd", scale=None, attn=False, tape=True):
    """Differential attention (DiffTransformer): O = (softmax(s Q1 K1^T) -
    lam_h softmax(s Q2 K2^T)) V, q = [q1, q2] and k = [k1, k2] split in two
    halves of the (even) head dimension d; lam [H] per head (a number: the
    same for every head); scale None: 1/sqrt(d/2). The paper's lambda
    re-parameterisation, per-head normalisation and (1 - lambda_init) are the
    caller's (birkhoff/diff.h). Extras: attn (the combined map A1 - lam A2,
    dense, small problems)."""
    pr = _problem(q, k, v, q_len, k_len, layout)
    pr.host_only("differential attention")
    return Result(K.diff_op(lam, pr.desc.H, scale).forward(pr, tape, attn))


def diff_backward(q, k, v, lam, dout, tape=None, *, q_len=None, k_len=None, layout="bhnd", scale=None):
    """(dq, dk, dv, dlambda): dlambda [H] summed over the batch"""
    pr = _problem(q, k, v, q_len, k_len, layout)
    pr.host_only("differential attention")
    dq, dk, dv, g = K.diff_op(lam, pr.desc.H, scale, ("dlambda",)).backward(pr, dout, tape, outputs=True)
    return dq, dk, dv, g["dlambda"]


# ---- OTK ----

def _otk_setup(x, z, lengths, W, kw):
    z = np.ascontiguousarray(np.asarray(z, dtype=np.float32))
    if W is not None:
        W = np.ascontiguousarray(np.asarray(W, dtype=np.float32))
    op, prm = K.otk_setup(NP, x, z, W, lengths, kw)
    return op, prm, z, W


def otk(x, z, *, lengths=None, W=None, plan=False, diag=False, tape=True, **params):
    """OTK embedding of sets x [B, n, d] onto references z [q, p, k]:
    out [B, p, q*k]. W [k, d]: Nystrom anchors (None: identity, k = d).
    params: sigma, eta, eps, iters (Sinkhorn half-steps, even: iters/2
    iterations; default 20), domain ("log"/"scaling"), convention
    ("paper"/"reference"), pe ("none"/"1d"/"2d"), sigma_pos, pe_double,
    grid (h, w), isqrt_grad ("exact"/"reference"). Extras: plan
    [B, q, n, p]; diag {row_err, col_err} [B, q]."""
    op, prm, z, W = _otk_setup(x, z, lengths, W, params)
    return Result(K.otk_forward(op, prm, z, tape, plan, diag))


def otk_backward(x, z, dout, tape=None, *, lengths=None, W=None, **params):
    """(dx [B, n, d], dz [q, p, k], dW [k, d] or None without anchors)"""
    op, prm, z, W = _otk_setup(x, z, lengths, W, params)
    return K.otk_backward(op, prm, z, dout, tape, True, True, W is not None)


def otk_features(x, W=None, *, lengths=None, sigma=None, eta=None):
    """psi [B, n, k] (padded rows zero): the Nystrom feature map of the OTK
    embedding (identity without anchors)."""
    k = W.shape[0] if W is not None else np.asarray(x).shape[-1]
    op, prm, _, W = _otk_setup(x, np.zeros((1, 1, k), np.float32), lengths, W, {"sigma": sigma, "eta": eta})
    psi, tpsi = op.new((op.B, op.n, k))
    check(lib.bk_otk_features(C.byref(op.desc), C.byref(prm), C.byref(op.tx), C.byref(tpsi)))
    return psi


def _kmeans(iters, tol, seed, max_samples, init):
    kp = K.setp(lib.bk_kmeans_config_default(), iters=iters, tol=tol, seed=seed, max_samples=max_samples)
    if init is not None:
        kp.init = K.choice(K.KMEANS_INIT, init, "init")
    return kp


def _report(rep):
    return {"iters": rep.iters, "converged": bool(rep.converged), "objective": rep.objective}


def spherical_kmeans(x, K_, *, iters=None, tol=None, seed=None, init=None):
    """(centres [K, dim] unit rows, report) of the rows of x [N, dim]"""
    x = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    if x.ndim != 2:
        raise ValueError("x: [N, dim] expected, got shape %s" % (x.shape,))
    K_ = _lib.check_int(K_, C.c_int, "K", lo=1)
    out = np.zeros((K_, x.shape[1]), np.float32)
    rep = _lib.KmeansReport()
    kp = _kmeans(iters, tol, seed, None, init)
    check(lib.bk_spherical_kmeans(K.f32_np(x), x.shape[0], x.shape[1], K_, C.byref(kp), K.f32_np(out),
                                  C.byref(rep)))
    return out, _report(rep)


def otk_fit_anchors(x, k, *, lengths=None, iters=None, tol=None, seed=None, max_samples=None, init=None):
    """(W [k, d], report): anchors by spherical K-means of the valid elements"""
    k = _lib.check_int(k, C.c_int, "k", lo=1)
    op = K.OtkProblem(NP, x, 1, 1, k, lengths)
    W = np.zeros((k, op.d), np.float32)
    rep = _lib.KmeansReport()
    kp = _kmeans(iters, tol, seed, max_samples, init)
    check(lib.bk_otk_fit_anchors(C.byref(op.desc), C.byref(op.tx), C.byref(kp), K.f32_np(W), C.byref(rep)))
    return W, _report(rep)


def otk_fit_refs(x, q, p, *, lengths=None, W=None, barycenter=0, iters=None, tol=None, seed=None,
                 max_samples=None, init=None, **params):
    """(z [q, p, k], report): references by (Wasserstein) K-means of the
    features (see bk_otk_fit_refs)."""
    k = W.shape[0] if W is not None else np.asarray(x).shape[-1]
    q, p = _lib.check_int(q, C.c_int, "q", lo=1), _lib.check_int(p, C.c_int, "p", lo=1)
    barycenter = _lib.check_int(barycenter, C.c_int, "barycenter")
    op, prm, _, W = _otk_setup(x, np.zeros((q, p, k), np.float32), lengths, W, params)
    z = np.zeros((q, p, k), np.float32)
    rep = _lib.KmeansReport()
    kp = _kmeans(iters, tol, seed, max_samples, init)
    check(lib.bk_otk_fit_refs(C.byref(op.desc), C.byref(prm), C.byref(op.tx), C.byref(kp), barycenter,
                              K.f32_np(z), C.byref(rep)))
    return z, _report(rep)


# ---- ASAP ----

def _asap_config(d, slices, theta, seed, scale, eps, teacher_iters, lam):
    d = _lib.check_int(d, C.c_int, "d", lo=1)
    cfg = K.setp(lib.bk_asap_config_default(d), slices=slices, seed=seed, scale=scale, eps=eps,
                 teacher_iters=teacher_iters, lambda_=lam)
    th = None
    if theta is not None:
        th = np.ascontiguousarray(np.asarray(theta, dtype=np.float32))
        if th.ndim != 2 or th.shape[1] != int(d):
            raise ValueError("theta: [L, d=%d] expected, got shape %s" % (int(d), th.shape))
        cfg.slices, cfg.theta = th.shape[0], K.f32_np(th)
    return cfg, th


class AsapLayer:
    """A compiled ASAP layer (a trained Sinkhorn layer made loop-free): its
    slice bank theta [L, d], coefficients omega [L] and the teacher's scale,
    eps and S. Load one with AsapLayer.load(path) or get one from
    AsapCalibration.fit()."""

    def __init__(self):
        self._c = _lib.AsapLayer()
        self._owned = False

    def __del__(self):
        if getattr(self, "_owned", False):
            lib.bk_asap_layer_free(C.byref(self._c))
            self._owned = False

    @classmethod
    def load(cls, path):
        lay = cls()
        check(lib.bk_asap_load(str(path).encode(), C.byref(lay._c)))
        lay._owned = True
        return lay

    def save(self, path):
        check(lib.bk_asap_save(str(path).encode(), C.byref(self._c)))

    d = property(lambda s: s._c.d)
    slices = property(lambda s: s._c.slices)
    scale = property(lambda s: s._c.scale)
    eps = property(lambda s: s._c.eps)
    teacher_iters = property(lambda s: s._c.teacher_iters)
    theta = property(lambda s: np.ctypeslib.as_array(s._c.theta, (s._c.slices, s._c.d)).copy())
    omega = property(lambda s: np.ctypeslib.as_array(s._c.omega, (s._c.slices,)).copy())

    def forward(self, q, k, v, *, q_len=None, k_len=None, layout="bhnd", variant="auto", attn=False, fhat=False,
                diag=False):
        """O = A v with the compiled closure (inference only). variant:
        "auto" (the teacher's ending), "zero", "column", "row"."""
        return self._run(None, q, k, v, q_len, k_len, layout, variant, attn, fhat, diag)

    def close(self, dual, q, k, v, *, q_len=None, k_len=None, layout="bhnd", variant="auto", attn=False,
              diag=False):
        """The same closure from a given dual [B, H, Nq] (cost units)."""
        return self._run(dual, q, k, v, q_len, k_len, layout, variant, attn, False, diag)

    def _run(self, dual, q, k, v, q_len, k_len, layout, variant, want_attn, want_fhat, want_diag):
        pr = _problem(q, k, v, q_len, k_len, layout)
        d = pr.desc
        if d.d != self._c.d:
            raise ValueError("q, k: head dim %d expected by this layer, got %d" % (self._c.d, d.d))
        var = K.choice(K.ASAP_VARIANT, variant, "variant")
        out = pr.out()
        at = pr.attn() if want_attn else None
        fh = np.zeros(d.B * d.H * d.Nq, np.float32) if want_fhat else None
        dg = (_lib.SinkhornDiag * (d.B * d.H))() if want_diag else None
        ex = _lib.AsapExtras(at.tensor() if at else _lib.Tensor(), K.f32_np(fh), dg)
        tq, tk, tv = pr.tensors()
        if dual is None:
            check(lib.bk_asap_forward(C.byref(d), C.byref(self._c), var, C.byref(tq), C.byref(tk), C.byref(tv),
                                      C.byref(out.tensor()), C.byref(ex), None, 0))
        else:
            du = np.ascontiguousarray(np.asarray(dual, dtype=np.float32))
            if du.size != d.B * d.H * d.Nq:
                raise ValueError("dual: [B=%d, H=%d, Nq=%d] expected, got shape %s" % (d.B, d.H, d.Nq, du.shape))
            check(lib.bk_asap_close(C.byref(d), C.byref(self._c), var, K.f32_np(du), C.byref(tq), C.byref(tk),
                                    C.byref(tv), C.byref(out.tensor()), C.byref(ex), None, 0))
        res = Result(out=out.obj)
        if want_attn:
            res["attn"] = at.obj
        if want_fhat:
            res["fhat"] = fh.reshape(d.B, d.H, d.Nq)
        if want_diag:
            res["diag"] = K.diag_dict(dg, d.B, d.H, ("iters", "row_err", "col_err"))
        return res

    def features(self, q, k, *, q_len=None, k_len=None, layout="bhnd"):
        """sliced potentials X [B, H, Nq, L]"""
        pr = K.Problem(NP, q, k, None, q_len, k_len, layout)
        d = pr.desc
        X = np.zeros((d.B, d.H, d.Nq, self._c.slices), np.float32)
        check(lib.bk_asap_features(C.byref(d), C.byref(self._c), C.byref(pr.q.tensor()), C.byref(pr.k.tensor()),
                                   K.f32_np(X)))
        return X


class AsapCalibration:
    """Streams (q, k) problems through a Sinkhorn teacher and fits an ASAP
    layer: AsapCalibration(d, teacher_iters=S, eps=..., scale=...), then
    add(q, k) as often as wanted, then fit("ls" or "kl")."""

    def __init__(self, d, *, slices=None, theta=None, seed=None, scale=None, eps=None, teacher_iters=None,
                 lam=None, keep_kl=False):
        self._cfg, self._theta = _asap_config(d, slices, theta, seed, scale, eps, teacher_iters, lam)
        h = C.c_void_p()
        check(lib.bk_asap_calib_create(C.byref(self._cfg), int(bool(keep_kl)), C.byref(h)))
        self._h = h

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            lib.bk_asap_calib_free(h)
            self._h = None

    def add(self, q, k, *, q_len=None, k_len=None, layout="bhnd"):
        pr = K.Problem(NP, q, k, None, q_len, k_len, layout)
        check(lib.bk_asap_calib_add(self._h, C.byref(pr.desc), C.byref(pr.q.tensor()), C.byref(pr.k.tensor())))

    def fit(self, method="ls", *, max_iters=None, tol=None):
        """(AsapLayer, report dict)"""
        kl = K.setp(lib.bk_asap_kl_config_default(), max_iters=max_iters, tol=tol)
        lay = AsapLayer()
        rep = _lib.AsapFitReport()
        check(lib.bk_asap_calib_fit(self._h, K.choice(K.ASAP_FIT, method, "method"), C.byref(kl),
                                    C.byref(lay._c), C.byref(rep)))
        lay._owned = True
        return lay, {f: getattr(rep, f) for f, _ in _lib.AsapFitReport._fields_}


def asap_teacher_dual(q, k, *, q_len=None, k_len=None, layout="bhnd", scale=None, eps=None, teacher_iters=None):
    """The teacher's fit target y [B, H, Nq] (cost units, centred)."""
    pr = K.Problem(NP, q, k, None, q_len, k_len, layout)
    d = pr.desc
    cfg, _ = _asap_config(d.d, None, None, None, scale, eps, teacher_iters, None)
    y = np.zeros((d.B, d.H, d.Nq), np.float32)
    check(lib.bk_asap_teacher_dual(C.byref(d), C.byref(cfg), C.byref(pr.q.tensor()), C.byref(pr.k.tensor()),
                                   K.f32_np(y)))
    return y
