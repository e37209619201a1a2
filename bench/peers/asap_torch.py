#!/usr/bin/python3
"""PyTorch port of ASAP (Tran, Milkert, Hyde 2026): a Sinkhorn attention layer
compiled into a loop-free operator. Semantics as include/birkhoff.h states them
("ASAP: a trained Sinkhorn layer ..."), digested in docs/specs/asap.md.

One problem = one (batch, head) pair with n valid queries and m valid keys;
every function here works on the *valid* (truncated) problem, batched over any
leading dimensions (Q [..., n, d], K [..., m, d]). Padding is obtained by
calling these on the truncated problem and zero-padding the result
(`padded_apply` does that for [B, H, N, d] tensors with per-batch lengths).

Conventions (s = scale, 1/sqrt(d) when None; eps > 0):
  logits     Z_ij = (s / eps) q_i . k_j,  marginals a = 1/n (rows), b = 1/m (cols)
  teacher    Sinkformer: log domain, f = g = 0, S half-steps, row first
               row:  f_i = log a - LSE_j (Z_ij + g_j)
               col:  g_j = log b - LSE_i (Z_ij + f_i)
             P = exp(Z + f + g), A = n P (the Sinkformer port's n_q factor)
  closure-ready dual (logit units): f after half-step S - 1 (even S) or
             S - 2 (odd S >= 3), i.e. the f fed into the last column step
  cost       C_ij = s |q_i - k_j|^2 / 2,  rho_i = s |q_i|^2 / 2
  target     y = centre(eps f + rho)           (cost units)
  features   X [..., n, L]: exact 1-D Kantorovich potentials of the uniform
             measures on a = sqrt(s) theta_l . q and b = sqrt(s) theta_l . k
             (monotone plan, sigma(r) = floor(((r + 1) m - 1) / n)), centred
  online     u = (X omega - rho) / eps, T_K(u)_j = log b - LSE_i (Z_ij + u_i),
             T_Q(g)_i = log a - LSE_j (Z_ij + g_j)
               zero:   g0 = T_K(u),  P = exp(Z + u + g0)
               row:    f1 = T_Q(g0), P = exp(Z + f1 + g0)
               column: g1 = T_K(f1), P = exp(Z + f1 + g1)
             A = n P, O = A V
  fits       LS: omega = (sum X^T X + lam I)^-1 sum X^T y
             KL: argmin J(w) = sum_m [eps sum_j b LSE_i (Z_ij + u_i) - <r_m, X_m w>]
                 + lam/2 |w|^2, r_m = row sums of the one-sided (zero) plan at
                 the teacher's dual; solved here by damped Newton with the
                 gradient and Hessian from torch.autograd (independent of the
                 analytic formulas of the C library).

Run directly for the self-test (float64): python3 bench/peers/asap_torch.py
"""

import math
import os
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

import torch
import torch.nn.functional as F

VARIANTS = ("zero", "row", "column")


# ---------------------------------------------------------------------------
# Basic pieces
# ---------------------------------------------------------------------------
def _scale(Q, scale):
    return Q.shape[-1] ** -0.5 if scale is None else float(scale)


def logits(Q, K, eps=1.0, scale=None):
    """Z = (s / eps) Q K^T, [..., n, m] (the factor is applied to Q: O(n d))."""
    return torch.matmul(Q * (_scale(Q, scale) / eps), K.transpose(-1, -2))


def rho(Q, scale=None):
    """rho_i = s |q_i|^2 / 2 (cost units), [..., n]."""
    return 0.5 * _scale(Q, scale) * (Q * Q).sum(-1)


def centre(x, dim=-1):
    return x - x.mean(dim, keepdim=True)


def t_k(Z, u):
    """Key-side c-transform (column half-step): log(1/m) - LSE_i (Z_ij + u_i)."""
    m = Z.shape[-1]
    return -math.log(m) - torch.logsumexp(Z + u.unsqueeze(-1), dim=-2)


def t_q(Z, g):
    """Query-side c-transform (row half-step): log(1/n) - LSE_j (Z_ij + g_j)."""
    n = Z.shape[-2]
    return -math.log(n) - torch.logsumexp(Z + g.unsqueeze(-2), dim=-1)


def plan(Z, f, g):
    """P = exp(Z + f_i + g_j) (one temporary, updated in place)."""
    return (Z + f.unsqueeze(-1)).add_(g.unsqueeze(-2)).exp_()


# ---------------------------------------------------------------------------
# Teacher
# ---------------------------------------------------------------------------
def sinkhorn_state(Q, K, S, eps=1.0, scale=None):
    """S half-steps from f = g = 0, row first. Returns (P, f, g, fs) where fs
    lists the row potential after every row step (logit units)."""
    if S < 1:
        raise ValueError("S must be >= 1")
    Z = logits(Q, K, eps, scale)
    f = Z.new_zeros(Z.shape[:-1])
    g = Z.new_zeros(Z.shape[:-2] + Z.shape[-1:])
    fs = []
    for step in range(S):
        if step % 2 == 0:
            f = t_q(Z, g)
            fs.append(f)
        else:
            g = t_k(Z, f)
    return plan(Z, f, g), f, g, fs


def teacher(Q, K, S, eps=1.0, scale=None):
    """Sinkformer teacher: (A = n P, [row potential after each row step])."""
    P, _, _, fs = sinkhorn_state(Q, K, S, eps, scale)
    return P * Q.shape[-2], fs


def closure_dual(fs, S):
    """The closure-ready source dual (logit units) from teacher()'s list:
    f after half-step S - 1 (even S) or S - 2 (odd S >= 3)."""
    if S < 2:
        raise ValueError("S = 1 (softmax) has no closure-ready dual")
    # row steps are half-steps 1, 3, 5, ...: fs[i] is f after half-step 2 i + 1
    idx = (S - 2) // 2 if S % 2 == 0 else (S - 3) // 2
    return fs[idx]


def teacher_dual(Q, K, S, eps=1.0, scale=None):
    """Closure-ready dual f (logit units) of the S-step teacher."""
    _, fs = teacher(Q, K, S, eps, scale)
    return closure_dual(fs, S)


def target(Q, K, S, eps=1.0, scale=None):
    """Fit target y = centre(eps f + rho) (cost units), [..., n]."""
    f = teacher_dual(Q, K, S, eps, scale)
    return centre(eps * f + rho(Q, scale))


# ---------------------------------------------------------------------------
# Sliced potentials
# ---------------------------------------------------------------------------
def unit_rows(theta):
    return theta / theta.norm(dim=-1, keepdim=True)


def sigma_index(n, m, device=None):
    """sigma(r) = floor(((r + 1) m - 1) / n), r = 0..n-1: the last key rank the
    monotone plan of uniform measures sends query rank r to."""
    r = torch.arange(n, dtype=torch.int64, device=device)
    return torch.div((r + 1) * m - 1, n, rounding_mode="floor")


def features(Q, K, theta, scale=None):
    """Sliced potentials X [..., n, L] (theta [L, d] used as given).

    Projections in the input dtype; the prefix sum phi and the potentials in
    float64; the result is returned in the input dtype."""
    # work in the [..., L, n] layout: sorts and prefix sums along the last,
    # contiguous dimension
    s = _scale(Q, scale)
    n, m = Q.shape[-2], K.shape[-2]
    th = theta.to(Q.dtype) * math.sqrt(s)
    a = torch.matmul(th, Q.transpose(-1, -2))                     # [..., L, n]
    b = torch.matmul(th, K.transpose(-1, -2))                     # [..., L, m]
    a_s, order = torch.sort(a, dim=-1)
    b_s = torch.sort(b, dim=-1).values
    a64, b64 = a_s.double(), b_s.double()
    if n > 1:
        sig = sigma_index(n, m, Q.device)[:-1]                    # sigma(r - 1), r = 1..n-1
        inc = b64.index_select(-1, sig) * (a64[..., 1:] - a64[..., :-1])
        phi = torch.cat([torch.zeros_like(a64[..., :1]), torch.cumsum(inc, dim=-1)], dim=-1)
    else:
        phi = torch.zeros_like(a64)
    f_sorted = 0.5 * a64 * a64 - phi
    f = torch.empty_like(f_sorted).scatter_(-1, order, f_sorted)
    return centre(f, dim=-1).transpose(-1, -2).to(Q.dtype)


# ---------------------------------------------------------------------------
# Online operator
# ---------------------------------------------------------------------------
def close(Z, u, variant):
    """Plan P from the predicted dual u (logit units) by the variant's passes."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}")
    g0 = t_k(Z, u)
    if variant == "zero":
        return plan(Z, u, g0)
    f1 = t_q(Z, g0)
    if variant == "row":
        return plan(Z, f1, g0)
    return plan(Z, f1, t_k(Z, f1))


def asap_from_dual(Q, K, V, fhat, eps=1.0, scale=None, variant="column"):
    """ASAP with a given predicted dual fhat (cost units): (O, A)."""
    Z = logits(Q, K, eps, scale)
    u = (fhat - rho(Q, scale)) / eps
    A = close(Z, u, variant) * Q.shape[-2]
    return torch.matmul(A, V), A


def asap(Q, K, V, theta, omega, scale=None, eps=1.0, variant="column"):
    """ASAP attention on valid problems: (O, A, fhat), fhat = X omega."""
    X = features(Q, K, theta, scale)
    fhat = torch.matmul(X, omega.to(X.dtype))
    O, A = asap_from_dual(Q, K, V, fhat, eps, scale, variant)
    return O, A, fhat


def padded_apply(q, k, v, q_len, k_len, fn):
    """fn(qb, kb, vb) -> (O [H, Lq, dv], A [H, Lq, Lk]) on each batch entry's
    valid block; zero-padded back to [B, H, Nq, dv] and [B, H, Nq, Nk]."""
    B, H, Nq, _ = q.shape
    Nk, dv = k.shape[2], v.shape[3]
    lq = [Nq] * B if q_len is None else [int(x) for x in q_len]
    lk = [Nk] * B if k_len is None else [int(x) for x in k_len]
    outs, attns = [], []
    for b in range(B):
        Lq, Lk = lq[b], lk[b]
        if Lq == 0 or Lk == 0:
            outs.append(q.new_zeros(H, Nq, dv))
            attns.append(q.new_zeros(H, Nq, Nk))
            continue
        o, a = fn(q[b, :, :Lq], k[b, :, :Lk], v[b, :, :Lk])
        outs.append(F.pad(o, (0, 0, 0, Nq - Lq)))
        attns.append(F.pad(a, (0, Nk - Lk, 0, Nq - Lq)))
    return torch.stack(outs), torch.stack(attns)


def asap_padded(q, k, v, theta, omega, scale=None, eps=1.0, variant="column",
                q_len=None, k_len=None):
    """ASAP on [B, H, N, d] tensors with per-batch valid lengths: (O, A)."""
    return padded_apply(q, k, v, q_len, k_len, lambda qb, kb, vb: asap(
        qb, kb, vb, theta, omega, scale, eps, variant)[:2])


def auto_variant(S):
    """The teacher's ending: column for even S, row for odd S."""
    return "column" if S % 2 == 0 else "row"


# ---------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------
def _problems(problems):
    """Flatten [(Q, K)] with leading batch dims into a list of 2-D pairs."""
    out = []
    for Q, K in problems:
        Q2 = Q.reshape(-1, *Q.shape[-2:])
        K2 = K.reshape(-1, *K.shape[-2:])
        if Q2.shape[0] != K2.shape[0]:
            raise ValueError("Q and K must have the same leading dimensions")
        for i in range(Q2.shape[0]):
            if Q2.shape[1] and K2.shape[1]:
                out.append((Q2[i], K2[i]))
    return out


def calib_data(problems, theta, S, eps=1.0, scale=None):
    """Per problem, in float64: dict(X, y, rho, Z, r) with r the row sums of
    the one-sided plan of the teacher's dual."""
    data = []
    th = theta.double()
    for Q, K in _problems(problems):
        Q, K = Q.double(), K.double()
        f = teacher_dual(Q, K, S, eps, scale)
        rh = rho(Q, scale)
        Z = logits(Q, K, eps, scale)
        r = close(Z, f, "zero").sum(-1)
        data.append(dict(X=features(Q, K, th, scale), y=centre(eps * f + rh), rho=rh, Z=Z, r=r))
    return data


def fit_ls(problems, theta, S, eps=1.0, scale=None, lam=1e-3, data=None):
    """LS fit: (omega [L] float64, report dict(rows, rmse, r2))."""
    data = calib_data(problems, theta, S, eps, scale) if data is None else data
    L = theta.shape[0]
    G = torch.zeros(L, L, dtype=torch.float64)
    c = torch.zeros(L, dtype=torch.float64)
    yy, rows = 0.0, 0
    for p in data:
        G += p["X"].T @ p["X"]
        c += p["X"].T @ p["y"]
        yy += float(p["y"] @ p["y"])
        rows += p["X"].shape[0]
    if rows == 0:
        raise ValueError("no calibration problem")
    omega = torch.linalg.solve(G + lam * torch.eye(L, dtype=torch.float64), c)
    res = sum(float(((p["X"] @ omega - p["y"]) ** 2).sum()) for p in data)
    return omega, dict(rows=rows, problems=len(data), rmse=math.sqrt(res / rows),
                       r2=1.0 - res / yy if yy > 0 else float("nan"))


def kl_objective(omega, data, eps=1.0, lam=1e-3):
    """J(omega) (a differentiable torch scalar)."""
    J = 0.5 * lam * (omega * omega).sum()
    for p in data:
        Xw = p["X"] @ omega
        u = (Xw - p["rho"]) / eps
        m = p["Z"].shape[-1]
        J = J + eps * torch.logsumexp(p["Z"] + u.unsqueeze(-1), dim=-2).sum() / m \
            - (p["r"] * Xw).sum()
    return J


def kl_grad_analytic(omega, data, eps=1.0, lam=1e-3):
    """The paper's gradient sum X^T (rhat - r) + lam omega (for the self-test)."""
    g = lam * omega
    for p in data:
        u = (p["X"] @ omega - p["rho"]) / eps
        rhat = close(p["Z"], u, "zero").sum(-1)
        g = g + p["X"].T @ (rhat - p["r"])
    return g


def fit_kl(problems, theta, S, eps=1.0, scale=None, lam=1e-3, iters=100, tol=1e-24,
           data=None, omega0=None):
    """KL fit by damped Newton from the LS solution, the gradient and Hessian
    by torch.autograd. Armijo backtracking while the Newton decrement
    lambda^2 / 2 is above 1e-10 max(1, |J|); below that (the quadratic region,
    where a decrease of J is under its rounding) full Newton steps. Stops when
    lambda^2 / 2 < tol max(1, |J|), when the step is below 1e-14 max(1,
    max|omega|), or when a full step no longer halves lambda^2 (rounding
    floor). Returns (omega, report)."""
    data = calib_data(problems, theta, S, eps, scale) if data is None else data
    if omega0 is None:
        omega0, _ = fit_ls(None, theta, S, eps, scale, lam, data=data)
    w = omega0.detach().clone().double()

    def J(x):
        return kl_objective(x, data, eps, lam)

    j0 = float(J(w))
    it, conv, dec2, prev_full = 0, False, float("inf"), float("inf")
    for it in range(1, iters + 1):
        x = w.clone().requires_grad_(True)
        Jx = J(x)
        (g,) = torch.autograd.grad(Jx, x)
        H = torch.autograd.functional.hessian(J, w)
        step = torch.linalg.solve(H, g)
        dec2 = float(g @ step)
        jscale = max(1.0, abs(float(Jx)))
        if (dec2 / 2 < tol * jscale
                or float(step.abs().max()) < 1e-14 * max(1.0, float(w.abs().max()))
                or dec2 > 0.5 * prev_full):
            conv = True
            it -= 1
            break
        if dec2 / 2 < 1e-10 * jscale:
            prev_full = dec2
            w = w - step
            continue
        t, Jw = 1.0, float(Jx)
        while t > 1e-12:
            wn = w - t * step
            if float(J(wn)) <= Jw - 1e-4 * t * dec2:
                break
            t *= 0.5
        else:
            conv = True          # no decrease representable
            break
        w = wn
    x = w.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(J(x), x)
    return w, dict(j0=j0, j=float(J(w)), grad=float(g.abs().max()), iters=it,
                   converged=conv, decrement2=dec2)


def fit(problems, theta, S, eps=1.0, scale=None, lam=1e-3, kind="ls", **kw):
    if kind == "ls":
        return fit_ls(problems, theta, S, eps, scale, lam)
    if kind == "kl":
        return fit_kl(problems, theta, S, eps, scale, lam, **kw)
    raise ValueError("kind must be ls or kl")


# ---------------------------------------------------------------------------
# Fidelity (bk_attn_compare's definitions, one valid problem)
# ---------------------------------------------------------------------------
def fidelity(O, O_ref, A, A_ref):
    """dict(out_rmse, out_rms, attn_rel_l2, row_err, col_err) of one problem
    (2-D tensors of the valid block)."""
    n, m = A.shape[-2:]
    return dict(out_rmse=float(((O - O_ref) ** 2).mean().sqrt()),
                out_rms=float((O_ref ** 2).mean().sqrt()),
                attn_rel_l2=float((A - A_ref).norm() / A_ref.norm()),
                row_err=float((A.sum(-1) - 1).abs().mean()),
                col_err=float((A.sum(-2) * (m / n) - 1).abs().mean()))


# ---------------------------------------------------------------------------
# Reference relations and self-test
# ---------------------------------------------------------------------------
def _max_abs(x, y):
    return float((x - y).abs().max())


def _random_problem(gen, n, m, d, dtype=torch.float64, clusters=3):
    """Clustered Q, K (cluster centres plus noise, shared projections)."""
    cen = torch.randn(clusters, d, generator=gen, dtype=dtype) * 1.2
    Wq = torch.eye(d, dtype=dtype) + 0.3 * torch.randn(d, d, generator=gen, dtype=dtype)
    Wk = torch.eye(d, dtype=dtype) + 0.3 * torch.randn(d, d, generator=gen, dtype=dtype)

    def draw(cnt):
        lab = torch.randint(0, clusters, (cnt,), generator=gen)
        return cen[lab] + 0.4 * torch.randn(cnt, d, generator=gen, dtype=dtype)

    return draw(n) @ Wq, draw(m) @ Wk


def one_d_primal(a, b):
    """Exact 1-D OT cost of uniform measures on a [n], b [m], cost (x-y)^2/2."""
    a_s, _ = torch.sort(a)
    b_s, _ = torch.sort(b)
    n, m = a.shape[0], b.shape[0]
    ts = sorted(set([i / n for i in range(n + 1)] + [j / m for j in range(m + 1)]))
    tot = 0.0
    for t0, t1 in zip(ts[:-1], ts[1:]):
        if t1 <= t0:
            continue
        tm = 0.5 * (t0 + t1)
        i, j = min(int(tm * n), n - 1), min(int(tm * m), m - 1)
        tot += (t1 - t0) * 0.5 * float(a_s[i] - b_s[j]) ** 2
    return tot


def reference_relation(dtype=torch.float64, seed=0):
    """Float64 identities of the semantics. Returns [(name, error)], each
    error expected <= 1e-10 (relative to the quantities' size, O(1) here)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []

    def note(name, err):
        rows.append((name, float(err)))

    for (n, m, d, eps, scale) in [(7, 7, 4, 1.0, None), (9, 5, 8, 0.5, 0.3),
                                  (6, 11, 8, 2.0, None), (1, 4, 4, 1.0, None),
                                  (16, 16, 16, 0.7, 0.2)]:
        Q, K = _random_problem(gen, n, m, d, dtype)
        V = torch.randn(m, 5, generator=gen, dtype=dtype)
        tag = f"n{n} m{m} d{d} eps={eps:g}"
        rh = rho(Q, scale)
        for S in (2, 4, 10):
            A_T, fs = teacher(Q, K, S, eps, scale)
            y = target(Q, K, S, eps, scale)
            _, A0 = asap_from_dual(Q, K, V, y, eps, scale, "zero")
            note(f"even S={S} {tag}: zero(target) = teacher S", _max_abs(A0, A_T))
            _, Ac = asap_from_dual(Q, K, V, y, eps, scale, "column")
            A_T2, _ = teacher(Q, K, S + 2, eps, scale)
            note(f"even S={S} {tag}: column(target) = teacher S+2", _max_abs(Ac, A_T2))
            # shift invariance: un-centred dual gives the same plans
            yc = eps * closure_dual(fs, S) + rh + 3.7
            _, A0s = asap_from_dual(Q, K, V, yc, eps, scale, "zero")
            note(f"even S={S} {tag}: zero shift invariance", _max_abs(A0s, A0))
            note(f"even S={S} {tag}: columns of A sum to n/m",
                 (A_T.sum(-2) - n / m).abs().max())
        for S in (3, 5, 9):
            A_T, fs = teacher(Q, K, S, eps, scale)
            y = target(Q, K, S, eps, scale)
            _, Ar = asap_from_dual(Q, K, V, y, eps, scale, "row")
            note(f"odd S={S} {tag}: row(S-2 dual) = teacher S", _max_abs(Ar, A_T))
            _, A0 = asap_from_dual(Q, K, V, y, eps, scale, "zero")
            A_Tm, _ = teacher(Q, K, S - 1, eps, scale)
            note(f"odd S={S} {tag}: zero(S-2 dual) = teacher S-1", _max_abs(A0, A_Tm))
            note(f"odd S={S} {tag}: rows of A sum to 1", (A_T.sum(-1) - 1).abs().max())
        # multiplicative Sinkhorn (N_R / N_C on exp(Z)) equals the log loop
        Z = logits(Q, K, eps, scale)
        M = torch.exp(Z - Z.max())
        for S in (1, 2, 3, 6):
            Mi = M.clone()
            for step in range(S):
                if step % 2 == 0:
                    Mi = Mi / Mi.sum(-1, keepdim=True) / n
                else:
                    Mi = Mi / Mi.sum(-2, keepdim=True) / m
            A_T, _ = teacher(Q, K, S, eps, scale)
            note(f"S={S} {tag}: multiplicative loop = log loop", _max_abs(Mi * n, A_T))

        # 1-D potentials: optimal (dual value = primal cost, feasible)
        th = unit_rows(torch.randn(6, d, generator=gen, dtype=dtype))
        X = features(Q, K, th, scale)
        s = _scale(Q, scale)
        worst_gap, worst_feas = 0.0, 0.0
        for l in range(th.shape[0]):
            a = (Q @ th[l]) * math.sqrt(s)
            b = (K @ th[l]) * math.sqrt(s)
            f = X[:, l]
            cost = 0.5 * (a.unsqueeze(1) - b.unsqueeze(0)) ** 2
            h = (cost - f.unsqueeze(1)).min(0).values
            dual = float(f.mean() + h.mean())
            worst_gap = max(worst_gap, abs(dual - one_d_primal(a, b)))
            worst_feas = max(worst_feas, float((f.unsqueeze(1) + h.unsqueeze(0) - cost).max()))
        note(f"{tag}: 1-D potential dual value = primal", worst_gap)
        note(f"{tag}: 1-D potential feasibility (max violation, <= 0)", max(worst_feas, 0.0))
        note(f"{tag}: features centred", X.mean(0).abs().max())
        # permutation equivariance (features and operator)
        pq, pk = torch.randperm(n, generator=gen), torch.randperm(m, generator=gen)
        Xp = features(Q[pq], K[pk], th, scale)
        note(f"{tag}: features permutation-equivariant", _max_abs(Xp, X[pq]))
        w = torch.randn(th.shape[0], generator=gen, dtype=dtype) * 0.3
        for var in VARIANTS:
            O, A, _ = asap(Q, K, V, th, w, scale, eps, var)
            Op, Ap, _ = asap(Q[pq], K[pk], V[pk], th, w, scale, eps, var)
            note(f"{tag}: {var} permutation-equivariant",
                 max(_max_abs(Op, O[pq]), _max_abs(Ap, A[pq][:, pk])))
        O0, A0, _ = asap(Q, K, V, th, w, scale, eps, "zero")
        note(f"{tag}: zero: columns of A sum to n/m", (A0.sum(-2) - n / m).abs().max())
        _, Ar, _ = asap(Q, K, V, th, w, scale, eps, "row")
        note(f"{tag}: row: rows of A sum to 1", (Ar.sum(-1) - 1).abs().max())

    # ties: tied queries get equal potentials
    Q, K = _random_problem(gen, 8, 8, 4, dtype)
    Q[3] = Q[5]
    Q[1] = Q[5]
    th = unit_rows(torch.randn(5, 4, generator=gen, dtype=dtype))
    X = features(Q, K, th)
    note("ties: tied queries get equal features", max(_max_abs(X[3], X[5]), _max_abs(X[1], X[5])))

    # regression sanity: exact linear targets are recovered by LS (lam ~ 0)
    th = unit_rows(torch.randn(4, 8, generator=gen, dtype=dtype))
    w_true = torch.randn(4, generator=gen, dtype=dtype)
    probs = [_random_problem(gen, 12, 12, 8, dtype) for _ in range(5)]
    data = []
    for Qp, Kp in probs:
        Xp = features(Qp, Kp, th)
        data.append(dict(X=Xp, y=Xp @ w_true))
    w_fit, _ = fit_ls(None, th, 2, data=data, lam=0.0)
    note("LS recovers exact linear targets (lam = 0)", _max_abs(w_fit, w_true))

    # KL: autograd gradient = the paper's analytic gradient, optimum
    # stationary, J - eps KL(P_T || P_hat0) constant in omega
    for eps in (1.0, 0.5):
        th = unit_rows(torch.randn(6, 8, generator=gen, dtype=dtype))
        probs = [_random_problem(gen, 10, 10, 8, dtype) for _ in range(3)]
        data = calib_data(probs, th, 4, eps)
        w = torch.randn(6, generator=gen, dtype=dtype) * 0.2
        x = w.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(kl_objective(x, data, eps, 1e-3), x)
        note(f"KL eps={eps:g}: autograd gradient = analytic",
             _max_abs(g, kl_grad_analytic(w, data, eps, 1e-3)))
        w_kl, rep = fit_kl(None, th, 4, eps, lam=1e-3, data=data)
        note(f"KL eps={eps:g}: gradient at the optimum", rep["grad"])
        consts = []
        for ww in (w, w * -2.0, w_kl):
            kl = 0.0
            for p in data:
                PT = close(p["Z"], (p["y"] - p["rho"]) / eps, "zero")
                Ph = close(p["Z"], (p["X"] @ ww - p["rho"]) / eps, "zero")
                kl += float((PT * (torch.log(PT) - torch.log(Ph)) - PT + Ph).sum())
            consts.append(float(kl_objective(ww, data, eps, 0.0)) - eps * kl)
        note(f"KL eps={eps:g}: J - eps KL(P_T | P_hat) constant",
             max(abs(c - consts[0]) for c in consts))
    return rows


def _sinkformer_cross_check(seed=1):
    """teacher() against the Sinkformer port (sinkformer_torch.py), float64
    marginals: square (its reference convention) and, as the port allows,
    eps != 1, other scales and rectangular problems."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sinkformer_torch as sk
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for (B, H, n, m, d, eps, scale) in [(1, 1, 6, 6, 4, 1.0, None), (2, 3, 9, 9, 8, 1.0, None),
                                        (1, 2, 16, 16, 16, 1.0, None), (2, 2, 7, 7, 8, 0.5, 0.4),
                                        (1, 2, 5, 9, 8, 2.0, None)]:
        q = torch.randn(B, H, n, d, generator=gen, dtype=torch.float64)
        k = torch.randn(B, H, m, d, generator=gen, dtype=torch.float64)
        v = torch.randn(B, H, m, 3, generator=gen, dtype=torch.float64)
        for S in (1, 2, 3, 5, 10):
            _, a_ref = sk.attention(q, k, v, S, eps=eps, scale=scale, marginal_dtype=None)
            a, _ = teacher(q, k, S, eps, scale)
            rows.append((f"teacher = Sinkformer port B{B}H{H} n{n} m{m} d{d} eps={eps:g} S={S}",
                         _max_abs(a, a_ref)))
    return rows


def _padding_check(seed=2):
    gen = torch.Generator().manual_seed(seed)
    B, H, N, M, d = 3, 2, 9, 7, 8
    q = torch.randn(B, H, N, d, generator=gen, dtype=torch.float64)
    k = torch.randn(B, H, M, d, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, M, 4, generator=gen, dtype=torch.float64)
    ql, kl = [9, 1, 4], [3, 7, 1]
    th = unit_rows(torch.randn(5, d, generator=gen, dtype=torch.float64))
    w = torch.randn(5, generator=gen, dtype=torch.float64) * 0.3
    qg, kg, vg = q.clone(), k.clone(), v.clone()
    for b in range(B):
        qg[b, :, ql[b]:] = 1e3
        kg[b, :, kl[b]:] = -1e3
        vg[b, :, kl[b]:] = 1e3
    worst = 0.0
    for var in VARIANTS:
        O, A = asap_padded(qg, kg, vg, th, w, None, 1.0, var, ql, kl)
        for b in range(B):
            Ot, At, _ = asap(q[b, :, :ql[b]], k[b, :, :kl[b]], v[b, :, :kl[b]], th, w,
                             None, 1.0, var)
            worst = max(worst, _max_abs(O[b, :, :ql[b]], Ot), _max_abs(A[b, :, :ql[b], :kl[b]], At),
                        float(O[b, :, ql[b]:].abs().max()) if ql[b] < N else 0.0,
                        float(A[b, :, :, kl[b]:].abs().max()) if kl[b] < M else 0.0)
    return [("padding = truncation, zeros outside", worst)]


def self_test(verbose=True):
    torch.set_num_threads(min(4, torch.get_num_threads()))
    rows = reference_relation() + _sinkformer_cross_check() + _padding_check()
    # float32 runs (works, close to float64)
    gen = torch.Generator().manual_seed(3)
    Q, K = _random_problem(gen, 12, 10, 8)
    V = torch.randn(10, 4, generator=gen, dtype=torch.float64)
    th = unit_rows(torch.randn(6, 8, generator=gen, dtype=torch.float64))
    w = torch.randn(6, generator=gen, dtype=torch.float64) * 0.3
    for var in VARIANTS:
        O64, A64, _ = asap(Q, K, V, th, w, None, 1.0, var)
        O32, A32, _ = asap(Q.float(), K.float(), V.float(), th.float(), w.float(), None, 1.0, var)
        rows.append((f"float32 {var} vs float64 [tolerance 1e-5]",
                     max(_max_abs(O32.double(), O64), _max_abs(A32.double(), A64)), 1e-5))
    worst, bad = 0.0, 0
    for row in rows:
        name, err = row[:2]
        tol = row[2] if len(row) > 2 else 1e-10
        ok = err <= tol
        bad += not ok
        if len(row) == 2:
            worst = max(worst, err)
        if verbose or not ok:
            print(f"{'ok  ' if ok else 'FAIL'} {name:66s} {err:.2e}")
    print(f"{len(rows)} checks, {bad} failed; worst float64 error {worst:.2e} (tolerance 1e-10)")
    return bad == 0


if __name__ == "__main__":
    raise SystemExit(0 if self_test(verbose="-q" not in sys.argv) else 1)
