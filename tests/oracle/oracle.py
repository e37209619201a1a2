#!/usr/bin/python3
"""Reference oracle for birkhoff attention, built on the PyTorch ports.

Usage (Debian's python, which has torch and numpy):

  /usr/bin/python3 tests/oracle/oracle.py --op softmax|sinkhorn \
      --q Q.npy --k K.npy --v V.npy --dout dO.npy \
      [--iters S] [--eps E] [--scale s] [--q-len ql.npy --k-len kl.npy] \
      [--dtype float32|float64] --outdir DIR

  /usr/bin/python3 tests/oracle/oracle.py --op esp --sort hard|soft --tau T \
      [--softsort-t t] [--cost sq|euclid] [--esp-scale rows|paper] \
      [--slices Theta.npy] --q Q.npy --k K.npy --v V.npy --dout dO.npy \
      [--scale s] [--q-len ql.npy --k-len kl.npy] [--dtype ...] --outdir DIR

Inputs: float32 .npy arrays Q [B,H,Nq,d], K [B,H,Nk,d], V [B,H,Nk,dv],
dO [B,H,Nq,dv]; optional int32 valid lengths [B]. Writes DIR/O.npy,
DIR/A.npy, DIR/dQ.npy, DIR/dK.npy, DIR/dV.npy (float32, C order), where the
gradients are those of sum(O * dO), computed by autograd through the unrolled
Sinkhorn loop (bench/peers/sinkformer_torch.py).

--dtype float64 (the default) runs everything in float64, marginals included:
this is the oracle the tests compare against. --dtype float32 is the
reference's own numerics (float32 tensors, float32 marginals, increment
update form). --iters is required for --op sinkhorn; --scale defaults to
d^-1/2; --eps (sinkhorn only) defaults to 1.

--op esp is birkhoff's ESP attention (bench/peers/espformer_torch.py,
esp_semantics): --sort and --tau are required, --softsort-t (t > 0) too when
--sort soft (it is ignored by hard); --cost defaults to sq and --esp-scale to
rows. --slices gives the slices Theta [L, d] (float32 .npy, used as given;
default: the d coordinate axes). Besides O, A, dQ, dK, dV it writes
DIR/sigma.npy (slice weights [B, H, L]) and, with --slices, DIR/dTheta.npy
(gradient of sum(O * dO) w.r.t. Theta, [L, d]; all zeros for hard sort).

  /usr/bin/python3 tests/oracle/oracle.py --op lot --pivots Z.npy \
      --pivot-logits theta.npy --pivot-temp t --iters T [--eps E] [--scale s] \
      --q Q.npy --k K.npy --v V.npy --dout dO.npy [--q-len ql.npy --k-len kl.npy] \
      [--dtype ...] --outdir DIR

--op lot is birkhoff's LOT attention (bench/peers/lotformer_torch.py,
lot_semantics): pivots Z [H, r, d], pivot-mass logits theta [H, r] (float32
.npy), masses p0 = softmax(theta / t); --iters T (>= 1) half-steps per
Sinkhorn problem, --eps defaults to 1. Besides O, A, dQ, dK, dV it writes
DIR/dZ.npy ([H, r, d]) and DIR/dtheta.npy ([H, r]), the gradients of
sum(O * dO) summed over the batch.

  /usr/bin/python3 tests/oracle/oracle.py --op diff --lambda L.npy [--scale s] \
      --q Q.npy --k K.npy --v V.npy --dout dO.npy [--q-len ql.npy --k-len kl.npy] \
      [--dtype ...] --outdir DIR

--op diff is birkhoff's differential attention (bench/peers/diff_torch.py,
diff_semantics): q, k with an even d (halves [:d/2], [d/2:]), lambda [H]
(float32 .npy); --scale defaults to (d/2)^-1/2. Besides O, A (the combined
map A1 - lambda A2), dQ, dK, dV it writes DIR/dlambda.npy ([H], summed over
the batch).

  /usr/bin/python3 tests/oracle/oracle.py --op otk --x X.npy --refs Z.npy \
      [--lengths L.npy] [--anchors W.npy --sigma s --eta e] --eps E --iters S \
      [--domain log|scaling] [--convention paper|reference] \
      [--pe none|1d|2d --sigma-pos s [--pe-double] [--grid HxW]] \
      [--isqrt-grad exact|reference] [--dout dPhi.npy] [--dtype ...] --outdir DIR

--op otk is birkhoff's OTK embedding (bench/peers/otk_torch.py,
otk_semantics; the flags mirror `birkhoff otk embed`): sets X [B, n, d],
references Z [q, p, k], optional anchors W [k, d] (float32 .npy; without
anchors psi is the identity and k = d) and valid lengths (int32 [B]).
Defaults: --sigma 0.5, --eta 1e-2, --domain log, --convention paper, --pe
none, --sigma-pos 0.1, --isqrt-grad exact; --iters (half-steps, even: S/2
iterations) is required and --eps
defaults to 1 as for the other ops. Writes DIR/Phi.npy ([B, p, q*k]) and
DIR/P.npy (the pooling weights c P .* S, [B, q, n, p]); with --dout (dPhi
[B, p, q*k]) also DIR/dX.npy, DIR/dZ.npy and, with anchors, DIR/dW.npy, the
gradients of sum(Phi * dPhi) (dZ and dW summed over the batch). --q, --k, --v
are not used by --op otk (they are required by the other ops).
"""

import argparse
import os
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

import numpy as np
import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_ROOT, "bench", "peers"))
import diff_torch as dif  # noqa: E402
import espformer_torch as esp  # noqa: E402
import lotformer_torch as lot  # noqa: E402
import otk_torch as otk  # noqa: E402
import sinkformer_torch as port  # noqa: E402

torch.set_num_threads(1)


def run_oracle(op, q, k, v, dout, iters=None, eps=1.0, scale=None,
               q_len=None, k_len=None, dtype="float64", update="increment", rho=None):
    """Forward + backward of the port on numpy inputs.

    Returns a dict of numpy arrays (in the compute dtype) with keys
    O, A, dQ, dK, dV; the gradients are d sum(O * dout) / d{q,k,v}.
    dtype "float64": all float64, marginals too; "float32": the reference's
    numerics (float32 everywhere, float32 marginals).
    """
    if dtype not in ("float32", "float64"):
        raise ValueError("dtype must be float32 or float64")
    tdt = torch.float64 if dtype == "float64" else torch.float32

    def leaf(a):
        return torch.tensor(np.asarray(a), dtype=tdt).requires_grad_(True)

    tq, tk, tv = leaf(q), leaf(k), leaf(v)
    tdo = torch.tensor(np.asarray(dout), dtype=tdt)
    ql = None if q_len is None else [int(x) for x in np.asarray(q_len).reshape(-1)]
    kl = None if k_len is None else [int(x) for x in np.asarray(k_len).reshape(-1)]

    if op == "softmax":
        out, attn = port.softmax_attention(tq, tk, tv, scale=scale, q_len=ql, k_len=kl)
    elif op in ("sinkhorn", "unbalanced"):
        if iters is None or iters < 1:
            raise ValueError("sinkhorn needs iters >= 1")
        if (op == "unbalanced") != (rho is not None):
            raise ValueError("rho is for op unbalanced (the reference's SinkhornUnbalanced) only")
        out, attn = port.attention(tq, tk, tv, iters, eps=eps, scale=scale,
                                   q_len=ql, k_len=kl, marginal_dtype=tdt,
                                   update=update, rho=rho)
    else:
        raise ValueError(f"unknown op {op!r}")
    if out.shape != tdo.shape:
        raise ValueError(f"dout shape {tuple(tdo.shape)} != output shape {tuple(out.shape)}")
    (out * tdo).sum().backward()

    def np_(t):
        return t.detach().numpy()

    return {"O": np_(out), "A": np_(attn), "dQ": np_(tq.grad),
            "dK": np_(tk.grad), "dV": np_(tv.grad)}


def run_esp_oracle(q, k, v, dout, sort, tau, t=None, cost="sq", out_scale="rows",
                   scale=None, theta=None, q_len=None, k_len=None, dtype="float64"):
    """Forward + backward of esp_semantics on numpy inputs.

    Returns a dict of numpy arrays (in the compute dtype) with keys O, A,
    sigma, dQ, dK, dV, and dTheta when theta is given; the gradients are those
    of sum(O * dout). dTheta is all zeros when nothing depends on Theta (hard
    sort: the permutations carry no gradient).
    """
    if dtype not in ("float32", "float64"):
        raise ValueError("dtype must be float32 or float64")
    tdt = torch.float64 if dtype == "float64" else torch.float32

    def leaf(a):
        return torch.tensor(np.asarray(a), dtype=tdt).requires_grad_(True)

    tq, tk, tv = leaf(q), leaf(k), leaf(v)
    tth = None if theta is None else leaf(theta)
    tdo = torch.tensor(np.asarray(dout), dtype=tdt)
    ql = None if q_len is None else [int(x) for x in np.asarray(q_len).reshape(-1)]
    kl = None if k_len is None else [int(x) for x in np.asarray(k_len).reshape(-1)]
    out, attn, sigma = esp.esp_semantics(tq, tk, tv, sort=sort, t=t, tau=tau, cost=cost,
                                         out_scale=out_scale, scale=scale, theta=tth,
                                         q_len=ql, k_len=kl)
    if out.shape != tdo.shape:
        raise ValueError(f"dout shape {tuple(tdo.shape)} != output shape {tuple(out.shape)}")
    (out * tdo).sum().backward()

    def grad(x):
        return (x.grad if x.grad is not None else torch.zeros_like(x)).detach().numpy()

    res = {"O": out.detach().numpy(), "A": attn.detach().numpy(),
           "sigma": sigma.detach().numpy(), "dQ": grad(tq), "dK": grad(tk), "dV": grad(tv)}
    if tth is not None:
        res["dTheta"] = grad(tth)
    return res


def run_lot_oracle(q, k, v, dout, Z, theta, temp, iters, eps=1.0, scale=None,
                   q_len=None, k_len=None, dtype="float64"):
    """Forward + backward of lot_semantics on numpy inputs.

    Returns a dict of numpy arrays (in the compute dtype) with keys O, A, dQ,
    dK, dV, dZ, dtheta; the gradients are those of sum(O * dout) (dZ and
    dtheta summed over the batch, as the parameters are shared).
    """
    if dtype not in ("float32", "float64"):
        raise ValueError("dtype must be float32 or float64")
    tdt = torch.float64 if dtype == "float64" else torch.float32

    def leaf(a):
        return torch.tensor(np.asarray(a), dtype=tdt).requires_grad_(True)

    tq, tk, tv, tz, tth = (leaf(x) for x in (q, k, v, Z, theta))
    tdo = torch.tensor(np.asarray(dout), dtype=tdt)
    ql = None if q_len is None else [int(x) for x in np.asarray(q_len).reshape(-1)]
    kl = None if k_len is None else [int(x) for x in np.asarray(k_len).reshape(-1)]
    out, attn = lot.lot_semantics(tq, tk, tv, tz, tth, temp=temp, iters=iters, eps=eps,
                                  scale=scale, q_len=ql, k_len=kl, return_attn=True)
    if out.shape != tdo.shape:
        raise ValueError(f"dout shape {tuple(tdo.shape)} != output shape {tuple(out.shape)}")
    (out * tdo).sum().backward()

    def grad(x):
        return (x.grad if x.grad is not None else torch.zeros_like(x)).detach().numpy()

    return {"O": out.detach().numpy(), "A": attn.detach().numpy(), "dQ": grad(tq),
            "dK": grad(tk), "dV": grad(tv), "dZ": grad(tz), "dtheta": grad(tth)}


def run_diff_oracle(q, k, v, dout, lam, scale=None, q_len=None, k_len=None, dtype="float64"):
    """Forward + backward of diff_semantics on numpy inputs.

    Returns a dict of numpy arrays (in the compute dtype) with keys O, A, dQ,
    dK, dV, dlambda; the gradients are those of sum(O * dout) (dlambda summed
    over the batch, as lambda is shared).
    """
    if dtype not in ("float32", "float64"):
        raise ValueError("dtype must be float32 or float64")
    tdt = torch.float64 if dtype == "float64" else torch.float32

    def leaf(a):
        return torch.tensor(np.asarray(a), dtype=tdt).requires_grad_(True)

    tq, tk, tv, tl = (leaf(x) for x in (q, k, v, lam))
    tdo = torch.tensor(np.asarray(dout), dtype=tdt)
    ql = None if q_len is None else [int(x) for x in np.asarray(q_len).reshape(-1)]
    kl = None if k_len is None else [int(x) for x in np.asarray(k_len).reshape(-1)]
    out, attn = dif.diff_semantics(tq, tk, tv, tl, scale=scale, q_len=ql, k_len=kl)
    if out.shape != tdo.shape:
        raise ValueError(f"dout shape {tuple(tdo.shape)} != output shape {tuple(out.shape)}")
    (out * tdo).sum().backward()

    def grad(x):
        return (x.grad if x.grad is not None else torch.zeros_like(x)).detach().numpy()

    return {"O": out.detach().numpy(), "A": attn.detach().numpy(), "dQ": grad(tq),
            "dK": grad(tk), "dV": grad(tv), "dlambda": grad(tl)}


def run_otk_oracle(x, z, dout=None, lengths=None, W=None, sigma=0.5, eta=1e-2, eps=0.5,
                   iters=20, domain="log", convention="paper", pe=None, sigma_pos=0.1,
                   pe_double=False, grid=None, isqrt_grad="exact", dtype="float64"):
    """Forward (+ backward with dout) of otk_semantics on numpy inputs.

    Returns a dict of numpy arrays (in the compute dtype) with keys Phi
    [B, p, q*k] and P [B, q, n, p] (c P .* S), and with dout also dX, dZ and,
    when W is given, dW: the gradients of sum(Phi * dout) (dZ, dW summed over
    the batch; dX zero on padded rows).
    """
    if dtype not in ("float32", "float64"):
        raise ValueError("dtype must be float32 or float64")
    tdt = torch.float64 if dtype == "float64" else torch.float32
    want_grad = dout is not None

    def leaf(a):
        return torch.tensor(np.asarray(a), dtype=tdt).requires_grad_(want_grad)

    tx, tz = leaf(x), leaf(z)
    tw = None if W is None else leaf(W)
    lens = None if lengths is None else [int(v) for v in np.asarray(lengths).reshape(-1)]
    with torch.set_grad_enabled(want_grad):
        out, plan = otk.otk_semantics(tx, tz, lengths=lens, W=tw, sigma=sigma, eta=eta,
                                      eps=eps, iters=iters, domain=domain,
                                      convention=convention, pe=pe, sigma_pos=sigma_pos,
                                      pe_double=pe_double, grid=grid,
                                      isqrt_grad=isqrt_grad)
    res = {"Phi": out.detach().numpy(), "P": plan.detach().numpy()}
    if not want_grad:
        return res
    tdo = torch.tensor(np.asarray(dout), dtype=tdt)
    if out.shape != tdo.shape:
        raise ValueError(f"dout shape {tuple(tdo.shape)} != output shape {tuple(out.shape)}")
    leaves = [tx, tz] + ([] if tw is None else [tw])
    grads = torch.autograd.grad((out * tdo).sum(), leaves, allow_unused=True)
    for name, t, g in zip(("dX", "dZ", "dW"), leaves, grads):
        res[name] = (torch.zeros_like(t) if g is None else g).detach().numpy()
    return res


def _parse_grid(text):
    try:
        gh, gw = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad grid {text!r}: expected HxW")
    if gh < 1 or gw < 1:
        raise argparse.ArgumentTypeError(f"bad grid {text!r}: sizes must be >= 1")
    return gh, gw


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", required=True, choices=["softmax", "sinkhorn", "esp", "lot", "diff", "otk"])
    ap.add_argument("--q", default=None, help="required except for --op otk")
    ap.add_argument("--k", default=None, help="required except for --op otk")
    ap.add_argument("--v", default=None, help="required except for --op otk")
    ap.add_argument("--dout", default=None, help="required except for --op otk (optional there)")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--scale", type=float, default=None)
    ap.add_argument("--q-len", default=None)
    ap.add_argument("--k-len", default=None)
    ap.add_argument("--sort", default=None, choices=["soft", "hard"], help="esp: sort kind")
    ap.add_argument("--tau", type=float, default=None, help="esp: slice-mixing inverse temperature")
    ap.add_argument("--softsort-t", type=float, default=None, help="esp: SoftSort temperature")
    ap.add_argument("--cost", default="sq", choices=["sq", "euclid"], help="esp: cost")
    ap.add_argument("--esp-scale", default="rows", choices=["rows", "paper"],
                    help="esp: A = n G (rows) or G (paper)")
    ap.add_argument("--slices", default=None, help="esp: Theta [L, d] .npy")
    ap.add_argument("--pivots", default=None, help="lot: pivots Z [H, r, d] .npy")
    ap.add_argument("--pivot-logits", default=None, help="lot: mass logits theta [H, r] .npy")
    ap.add_argument("--pivot-temp", type=float, default=None,
                    help="lot: mass temperature (p0 = softmax(theta / t))")
    ap.add_argument("--lambda", dest="lam", default=None, help="diff: lambda [H] .npy")
    ap.add_argument("--x", default=None, help="otk: sets X [B, n, d] .npy")
    ap.add_argument("--refs", default=None, help="otk: references Z [q, p, k] .npy")
    ap.add_argument("--lengths", default=None, help="otk: valid lengths int32 [B] .npy")
    ap.add_argument("--anchors", default=None, help="otk: Nystrom anchors W [k, d] .npy")
    ap.add_argument("--sigma", type=float, default=0.5, help="otk: kernel bandwidth")
    ap.add_argument("--eta", type=float, default=1e-2, help="otk: inverse sqrt regulariser")
    ap.add_argument("--domain", default="log", choices=["log", "scaling"], help="otk")
    ap.add_argument("--convention", default="paper", choices=["paper", "reference"],
                    help="otk")
    ap.add_argument("--pe", default="none", choices=["none", "1d", "2d"], help="otk")
    ap.add_argument("--sigma-pos", type=float, default=0.1, help="otk: PE bandwidth")
    ap.add_argument("--pe-double", action="store_true", help="otk: S also multiplies K")
    ap.add_argument("--grid", type=_parse_grid, default=None, help="otk: 2-D PE grid HxW")
    ap.add_argument("--isqrt-grad", default="exact", choices=["exact", "reference"],
                    help="otk")
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--outdir", required=True)
    a = ap.parse_args(argv)
    if a.op == "otk":
        if a.x is None or a.refs is None:
            ap.error("--op otk needs --x and --refs")
        if a.iters is None or a.iters < 2 or a.iters % 2:
            ap.error("--op otk needs --iters S, an even number of half-steps >= 2")
        if a.eps <= 0:
            ap.error("--eps must be > 0")
        try:
            res = run_otk_oracle(
                np.load(a.x), np.load(a.refs),
                dout=np.load(a.dout) if a.dout else None,
                lengths=np.load(a.lengths) if a.lengths else None,
                W=np.load(a.anchors) if a.anchors else None, sigma=a.sigma, eta=a.eta,
                eps=a.eps, iters=a.iters, domain=a.domain, convention=a.convention,
                pe=None if a.pe == "none" else a.pe, sigma_pos=a.sigma_pos,
                pe_double=a.pe_double, grid=a.grid, isqrt_grad=a.isqrt_grad, dtype=a.dtype)
        except ValueError as e:
            ap.error(str(e))
        os.makedirs(a.outdir, exist_ok=True)
        for name, arr in res.items():
            np.save(os.path.join(a.outdir, name + ".npy"),
                    np.ascontiguousarray(arr, dtype=np.float32))
        return 0
    if a.q is None or a.k is None or a.v is None or a.dout is None:
        ap.error(f"--op {a.op} needs --q, --k, --v and --dout")
    if a.op in ("sinkhorn", "lot") and (a.iters is None or a.iters < 1):
        ap.error(f"--op {a.op} needs --iters S with S >= 1")
    if a.op == "lot":
        if a.pivots is None or a.pivot_logits is None or a.pivot_temp is None:
            ap.error("--op lot needs --pivots, --pivot-logits and --pivot-temp")
        if not a.pivot_temp > 0:
            ap.error("--pivot-temp must be > 0")
    elif a.pivots is not None or a.pivot_logits is not None or a.pivot_temp is not None:
        ap.error("--pivots/--pivot-logits/--pivot-temp are only for --op lot")
    if a.eps <= 0:
        ap.error("--eps must be > 0")
    if (a.op == "diff") != (a.lam is not None):
        ap.error("--op diff needs --lambda, and --lambda is only for --op diff")

    if a.op == "esp":
        if a.sort is None or a.tau is None:
            ap.error("--op esp needs --sort and --tau")
        if a.sort == "soft" and not (a.softsort_t is not None and a.softsort_t > 0):
            ap.error("--sort soft needs --softsort-t t with t > 0")
    elif a.sort is not None or a.slices is not None:
        ap.error("--sort/--slices are only for --op esp")

    q, k, v, dout = (np.load(p) for p in (a.q, a.k, a.v, a.dout))
    ql = np.load(a.q_len) if a.q_len else None
    kl = np.load(a.k_len) if a.k_len else None
    if a.op == "esp":
        theta = np.load(a.slices) if a.slices else None
        res = run_esp_oracle(q, k, v, dout, a.sort, a.tau, t=a.softsort_t, cost=a.cost,
                             out_scale=a.esp_scale, scale=a.scale, theta=theta,
                             q_len=ql, k_len=kl, dtype=a.dtype)
    elif a.op == "diff":
        res = run_diff_oracle(q, k, v, dout, np.load(a.lam), scale=a.scale, q_len=ql, k_len=kl,
                              dtype=a.dtype)
    elif a.op == "lot":
        res = run_lot_oracle(q, k, v, dout, np.load(a.pivots), np.load(a.pivot_logits),
                             a.pivot_temp, a.iters, eps=a.eps, scale=a.scale,
                             q_len=ql, k_len=kl, dtype=a.dtype)
    else:
        res = run_oracle(a.op, q, k, v, dout, iters=a.iters, eps=a.eps, scale=a.scale,
                         q_len=ql, k_len=kl, dtype=a.dtype)
    os.makedirs(a.outdir, exist_ok=True)
    for name, arr in res.items():
        np.save(os.path.join(a.outdir, name + ".npy"),
                np.ascontiguousarray(arr, dtype=np.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
