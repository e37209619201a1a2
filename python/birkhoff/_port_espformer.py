"""PyTorch ESPFormer attention: a reference-faithful port and the birkhoff oracle.

Module birkhoff._port_espformer (pure PyTorch, no libbirkhoff call; used by
birkhoff.models); bench/peers/espformer_torch.py is the same module under its old
name (and runs the self-check).

Two functions, both on q, k [B, H, N, d] and v [B, H, N, dv]:

* esp_reference(): the algorithm of the reference module (the anonymous
  ESPFormer snapshot, `attentions/esp.py`: SoftSort_p2, GammaAggregator,
  Esp, EspAttention), as digested in docs/specs (espformer.md section 1,
  anchors.md section 1.2), written from that description. It is the PEER
  BENCHMARK: it forms the same dense [B, H, L, N, N] tensors in the same order
  (soft permutations, pairwise logits, Gamma, cost * Gamma), so its speed and
  memory are those of the reference. Self-attention only, no masking.

* esp_semantics(): birkhoff's documented ESP semantics, dense and simple, in
  any float dtype with autograd everywhere. It is the TEST ORACLE
  (tests/oracle/oracle.py). Per (batch, head) problem with n queries and m
  keys (the valid prefixes when padded):

    q~ = scale q, k~ = scale k                  (scale defaults to d^-1/2)
    a^l = q~ theta_l, b^l = k~ theta_l            (theta: [L, d] slices, rows;
                                                 default identity, L = d)
    soft: P_l[r, i] = softmax_i(-(a_i - s_r)^2 / t), s = sort(a) ascending
          (the gradient flows through the sorted values, as in the reference);
          R_l likewise from b.
    hard: P_l[r, alpha(r)] = 1, alpha = stable ascending argsort of a^l;
          R_l likewise; the permutations carry no gradient.
    W[r, s] = max(0, min((r+1)/n, (s+1)/m) - max(r/n, s/m))   (0-indexed)
          the north-west-corner plan between uniform measures of sizes n and
          m (exact 1-D OT plan between sorted lists); I/n when n = m.
    U_l = P_l^T W R_l                                        (n x m)
    C_ij = ||q~_i - k~_j||^2 ("sq") or ||q~_i - k~_j|| ("euclid")
    D_l = sum_ij C_ij U_l[i, j]
    sigma = softmax_l(-tau (D - min_l D))
    G = sum_l sigma_l U_l
    A = n G ("rows": the rows sum to 1 when hard) or A = G ("paper")
    out = A v

  Padding: batch entry b uses its valid prefix (n = q_len[b], m = k_len[b]);
  padded rows of out and A are zero, A is zero on padded keys, sigma is zero
  for an empty problem, and padded storage is never read (it may hold NaN).

Relation between the two (checked by the self-check below and by
tests/oracle/test_oracle.py): for self-attention (n = m = N), cost "euclid"
and scale "rows",

    esp_reference(q, k, v, softsort_t=t, temperature=T)
        == esp_semantics(q, k, v, sort="soft", t=t, tau=T * N,
                         cost="euclid", out_scale="rows")

(outputs and gradients). Reasons: the reference's Gamma_l = P^T R has no 1/N
factor, so its per-slice cost is N times our D_l (hence tau = T N) and its
plan G is N times ours (our "rows" scaling); it sorts descending where we sort
ascending, which reverses the rows of both P and R and leaves P^T R unchanged.

Run this file directly for a self-check (gradchecks, exact marginals,
padding, the reference relation).
"""

import itertools

import torch

from ._port_sinkformer import _lengths  # one helper for the valid lengths of every port


# ---------------------------------------------------------------------------
# Peer: port of the reference module
# ---------------------------------------------------------------------------
def _softsort_p2_reference(x, t, hard):
    """Reference SoftSort_p2 on every slice at once.

    x: [B, H, N, L] (the slices are the last axis). Returns [B, H, L, N, N]
    with row r = rank (descending order) and column c = token:
    P[..., r, c] = softmax_c(-(x_c - sorted_r)^2 / t). hard=True is the
    reference's straight-through variant (one-hot at each row's argmax in the
    forward, soft Jacobian in the backward).
    """
    s = x.transpose(-1, -2).unsqueeze(-1)                       # [B,H,L,N,1]
    srt = torch.sort(s, dim=-2, descending=True).values         # [B,H,L,N,1]
    logits = -((s.transpose(-1, -2) - srt) ** 2) / t            # [B,H,L,N,N]
    p = torch.softmax(logits, dim=-1)
    if hard:
        one_hot = torch.zeros_like(p)
        one_hot.scatter_(-1, p.topk(1, dim=-1).indices, 1.0)
        p = (one_hot - p).detach() + p
    return p


def esp_reference(q, k, v, softsort_t=1e-3, temperature=10.0, hard=False,
                  return_weights=False):
    """Reference ESP attention (EspAttention without the projections).

    q, k: [B, H, N, d], v: [B, H, N, dv]; N_q must equal N_k. q and k are
    multiplied by d^-1/2; the slices are the d coordinate axes (L = d).
    Returns (out, attn) with out = attn @ v [B, H, N, dv] and attn = G
    [B, H, N, N] (rows sum to about 1); with return_weights=True also the
    slice weights w [B, H, L].
    """
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError("esp_reference: q, k [B,H,N,d] (same shape), v [B,H,N,dv]")
    scale = q.shape[-1] ** -0.5
    x, y = q * scale, k * scale
    pu = _softsort_p2_reference(x, softsort_t, hard)             # queries
    pv = _softsort_p2_reference(y, softsort_t, hard)             # keys
    gamma = pu.transpose(-1, -2) @ pv                            # [B,H,L,N,N]
    cost = torch.cdist(x, y, p=2)                                # [B,H,N,N]
    swd = (cost.unsqueeze(2) * gamma).sum(dim=(-1, -2))          # [B,H,L]
    e = torch.exp(-temperature * (swd - swd.min(dim=-1, keepdim=True).values))
    w = e / e.sum(dim=-1, keepdim=True)
    g = (gamma * w.unsqueeze(-1).unsqueeze(-1)).sum(dim=2)       # [B,H,N,N]
    out = g @ v
    return (out, g, w) if return_weights else (out, g)


# ---------------------------------------------------------------------------
# Oracle: birkhoff's semantics
# ---------------------------------------------------------------------------
def nw_corner(n, m, dtype=torch.float64, device=None):
    """North-west-corner plan between uniform measures of sizes n and m.

    W[r, s] = max(0, min((r+1)/n, (s+1)/m) - max(r/n, s/m)), evaluated on the
    common grid 1/(n m) with integers, so each entry is one rounding of an
    exact rational.
    """
    r = torch.arange(n, dtype=torch.int64, device=device).unsqueeze(1)
    s = torch.arange(m, dtype=torch.int64, device=device).unsqueeze(0)
    num = torch.minimum((r + 1) * m, (s + 1) * n) - torch.maximum(r * m, s * n)
    return num.clamp(min=0).to(dtype) / (n * m)


def _sort_matrices(a, sort, t):
    """Soft or hard sorting matrices of a: [..., n] -> [..., n, n] (rank x token)."""
    n = a.shape[-1]
    if sort == "hard":
        idx = torch.sort(a.detach(), dim=-1, stable=True).indices
        return torch.nn.functional.one_hot(idx, n).to(a.dtype)
    s = torch.sort(a, dim=-1).values                      # differentiable values
    logits = -((a.unsqueeze(-2) - s.unsqueeze(-1)) ** 2) / t
    return torch.softmax(logits, dim=-1)


def _cost(qs, ks, cost):
    """Pairwise cost [..., n, m]; 'euclid' has gradient 0 at zero distance."""
    sq = ((qs.unsqueeze(-2) - ks.unsqueeze(-3)) ** 2).sum(-1)
    if cost == "sq":
        return sq
    pos = sq > 0
    return torch.where(pos, torch.sqrt(torch.where(pos, sq, torch.ones_like(sq))),
                       torch.zeros_like(sq))


def _esp_block(qs, ks, vb, theta, sort, t, tau, cost, out_scale):
    """One batch entry's valid block. qs [H,n,d], ks [H,m,d] already scaled."""
    n, m = qs.shape[-2], ks.shape[-2]
    if theta is None:
        a, b = qs.transpose(-1, -2), ks.transpose(-1, -2)         # [H, L=d, n|m]
    else:
        a = (qs @ theta.transpose(0, 1)).transpose(-1, -2)        # [H, L, n]
        b = (ks @ theta.transpose(0, 1)).transpose(-1, -2)        # [H, L, m]
    P = _sort_matrices(a, sort, t)                                # [H, L, n, n]
    R = _sort_matrices(b, sort, t)                                # [H, L, m, m]
    W = nw_corner(n, m, dtype=qs.dtype, device=qs.device)
    U = P.transpose(-1, -2) @ W @ R                               # [H, L, n, m]
    C = _cost(qs, ks, cost)                                       # [H, n, m]
    D = (C.unsqueeze(1) * U).sum(dim=(-1, -2))                    # [H, L]
    sigma = torch.softmax(-tau * (D - D.min(dim=-1, keepdim=True).values), dim=-1)
    G = (sigma.unsqueeze(-1).unsqueeze(-1) * U).sum(dim=1)        # [H, n, m]
    A = G * n if out_scale == "rows" else G
    return A @ vb, A, sigma




def esp_semantics(q, k, v, *, sort="soft", t=None, tau=0.0, cost="sq",
                  out_scale="rows", scale=None, theta=None, q_len=None,
                  k_len=None):
    """birkhoff ESP attention (see the module docstring for the definition).

    q: [B,H,Nq,d], k: [B,H,Nk,d], v: [B,H,Nk,dv]; theta: optional [L,d]
    slices (used as given: rows are not renormalised here); q_len/k_len:
    optional per-batch valid lengths. t (SoftSort temperature, > 0) is needed
    for sort="soft" and ignored for "hard". Returns (out [B,H,Nq,dv],
    A [B,H,Nq,Nk], sigma [B,H,L]); gradients flow to q, k, v and theta.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be [B, H, N, d]")
    B, H, Nq, d = q.shape
    Nk, dv = k.shape[2], v.shape[3]
    if k.shape[0] != B or k.shape[1] != H or k.shape[3] != d:
        raise ValueError("k must be [B, H, Nk, d] matching q")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError("v must be [B, H, Nk, dv] matching k")
    if sort not in ("soft", "hard"):
        raise ValueError("sort must be 'soft' or 'hard'")
    if sort == "soft" and not (t is not None and t > 0):
        raise ValueError("soft sort needs t > 0")
    if cost not in ("sq", "euclid"):
        raise ValueError("cost must be 'sq' or 'euclid'")
    if out_scale not in ("rows", "paper"):
        raise ValueError("out_scale must be 'rows' or 'paper'")
    if theta is not None and (theta.dim() != 2 or theta.shape[1] != d or theta.shape[0] < 1):
        raise ValueError("theta must be [L, d] with L >= 1")
    L = d if theta is None else theta.shape[0]
    if scale is None:
        scale = d ** -0.5
    lq = _lengths(q_len, B, Nq, "q_len")
    lk = _lengths(k_len, B, Nk, "k_len")
    outs, attns, sigmas = [], [], []
    for b in range(B):
        n, m = lq[b], lk[b]
        if n == 0 or m == 0:
            outs.append(q.new_zeros(H, Nq, dv))
            attns.append(q.new_zeros(H, Nq, Nk))
            sigmas.append(q.new_zeros(H, L))
            continue
        # Slicing first: padded storage never enters any computation.
        o, a, s = _esp_block(q[b, :, :n] * scale, k[b, :, :m] * scale, v[b, :, :m],
                             theta, sort, t, tau, cost, out_scale)
        outs.append(torch.nn.functional.pad(o, (0, 0, 0, Nq - n)))
        attns.append(torch.nn.functional.pad(a, (0, Nk - m, 0, Nq - n)))
        sigmas.append(s)
    return torch.stack(outs), torch.stack(attns), torch.stack(sigmas)


# ---------------------------------------------------------------------------
# Self-check: python3 bench/peers/espformer_torch.py
# ---------------------------------------------------------------------------
def _explicit_plans(q, k, theta, sort, t, scale):
    """Per-slice plans U_l of one (n x m) problem with Python loops (float64)."""
    n, m = q.shape[0], k.shape[0]
    qs, ks = q * scale, k * scale
    th = torch.eye(q.shape[1], dtype=q.dtype) if theta is None else theta
    Us = []
    for l in range(th.shape[0]):
        a, b = qs @ th[l], ks @ th[l]
        if sort == "hard":
            al = sorted(range(n), key=lambda i: (float(a[i]), i))
            be = sorted(range(m), key=lambda j: (float(b[j]), j))
            U = torch.zeros(n, m, dtype=q.dtype)
            for r in range(n):
                for s in range(m):
                    lo = max(r / n, s / m)
                    hi = min((r + 1) / n, (s + 1) / m)
                    U[al[r], be[s]] = max(0.0, hi - lo)
        else:
            sa, sb = sorted(a.tolist()), sorted(b.tolist())
            P = torch.stack([torch.softmax(-(a - sa[r]) ** 2 / t, 0) for r in range(n)])
            R = torch.stack([torch.softmax(-(b - sb[r]) ** 2 / t, 0) for r in range(m)])
            U = P.T @ nw_corner(n, m) @ R
        Us.append(U)
    return Us


def _self_check():
    torch.manual_seed(0)
    f64 = torch.float64
    worst = {}

    def note(key, val):
        worst[key] = max(worst.get(key, 0.0), float(val))

    def rnd(*shape):
        return torch.randn(*shape, dtype=f64)

    def unit_rows(L, d):
        th = rnd(L, d)
        return th / th.norm(dim=1, keepdim=True)

    shapes = [(1, 1, 6, 6, 4, 4), (2, 2, 5, 9, 3, 2), (1, 2, 12, 4, 2, 3),
              (1, 1, 1, 1, 2, 2), (2, 1, 1, 5, 4, 3), (1, 1, 7, 1, 3, 2)]

    # 1. Semantics against explicit per-slice loops (all options, tau = 0 is
    #    the plain mean of the plans; tau > 0 checked against the softmax).
    for (B, H, Nq, Nk, d, dv) in shapes:
        q, k, v = rnd(B, H, Nq, d), rnd(B, H, Nk, d), rnd(B, H, Nk, dv)
        for sort, cost, osc, tau, th in itertools.product(
                ("soft", "hard"), ("sq", "euclid"), ("rows", "paper"),
                (0.0, 3.0), (None, unit_rows(3, d))):
            o, A, sg = esp_semantics(q, k, v, sort=sort, t=0.3, tau=tau, cost=cost,
                                     out_scale=osc, theta=th)
            for b in range(B):
                for h in range(H):
                    Us = _explicit_plans(q[b, h], k[b, h], th, sort, 0.3, d ** -0.5)
                    qs, ks = q[b, h] * d ** -0.5, k[b, h] * d ** -0.5
                    C = ((qs[:, None] - ks[None]) ** 2).sum(-1)
                    if cost == "euclid":
                        C = C.sqrt()
                    D = torch.stack([(C * U).sum() for U in Us])
                    w = torch.exp(-tau * D)
                    w = w / w.sum()
                    if tau == 0.0:
                        note("tau=0: sigma - 1/L", (sg[b, h] - 1.0 / len(Us)).abs().max())
                    G = sum(wl * U for wl, U in zip(w, Us))
                    Aref = G * Nq if osc == "rows" else G
                    note("dense vs explicit loops (A)", (A[b, h] - Aref).abs().max())
                    note("dense vs explicit loops (out)", (o[b, h] - Aref @ v[b, h]).abs().max())
                    note("dense vs explicit loops (sigma)", (sg[b, h] - w).abs().max())

    # 2. Exact marginals: W, hard plans (n = m: permutation / n; n != m: rows
    #    1/n, columns 1/m), soft total mass 1.
    for n, m in [(1, 1), (1, 7), (7, 3), (5, 9), (12, 4), (24, 24), (13, 20)]:
        W = nw_corner(n, m)
        note("NW corner |rowsum - 1/n|, |colsum - 1/m|",
             max((W.sum(1) - 1.0 / n).abs().max(), (W.sum(0) - 1.0 / m).abs().max()))
        assert int((W > 0).sum()) <= n + m - 1 and bool((W >= 0).all())
        q, k, v = rnd(2, 2, n, 4), rnd(2, 2, m, 4), rnd(2, 2, m, 3)
        _, A, _ = esp_semantics(q, k, v, sort="hard", tau=2.0, theta=unit_rows(5, 4))
        note("hard rows: |rowsum - 1|, |colsum - n/m|",
             max((A.sum(-1) - 1).abs().max(), (A.sum(-2) - n / m).abs().max()))
        _, G, _ = esp_semantics(q, k, v, sort="hard", tau=2.0, out_scale="paper")
        note("hard paper: marginals 1/n, 1/m",
             max((G.sum(-1) - 1.0 / n).abs().max(), (G.sum(-2) - 1.0 / m).abs().max()))
        if n == m:
            _, A1, _ = esp_semantics(q, k, v, sort="hard", tau=0.0, theta=unit_rows(1, 4))
            note("hard L=1 n=m: A is a permutation",
                 (A1 - A1.round()).abs().max() + (A1.sum(-1) - 1).abs().max())
        _, Gs, _ = esp_semantics(q, k, v, sort="soft", t=0.2, tau=2.0, out_scale="paper")
        note("soft paper: |total mass - 1|", (Gs.sum((-1, -2)) - 1).abs().max())
        # Hard is the t -> 0 limit of soft (distinct values).
        # t below (smallest gap between projected values)^2 / 60.
        gap = min([float(torch.diff(torch.sort(x * 0.5, dim=-2).values, dim=-2).min())
                   for x in (q, k) if x.shape[-2] > 1] + [1.0])
        _, At, _ = esp_semantics(q, k, v, sort="soft", t=gap * gap / 60, tau=2.0)
        _, Ah, _ = esp_semantics(q, k, v, sort="hard", tau=2.0)
        note("soft t -> 0 vs hard (A)", (At - Ah).abs().max())

    # 3. 1-D optimality: d = L = 1, hard sq cost is the optimal assignment.
    for n in (2, 3, 5, 6):
        q, k, v = rnd(1, 1, n, 1), rnd(1, 1, n, 1), rnd(1, 1, n, 1)
        _, A, _ = esp_semantics(q, k, v, sort="hard", scale=1.0)
        qq, kk = q[0, 0, :, 0], k[0, 0, :, 0]
        ours = float(((qq[:, None] - kk[None]) ** 2 * A[0, 0]).sum())
        best = min(float(((qq - kk[list(p)]) ** 2).sum())
                   for p in itertools.permutations(range(n)))
        note("1-D hard vs brute-force assignment", abs(ours - best))

    # 4. Shift / identity: k = q gives A = I (rows), out = v, D = 0.
    q, v = rnd(2, 2, 8, 4), rnd(2, 2, 8, 3)
    for sort in ("hard", "soft"):
        o, A, _ = esp_semantics(q, q.clone(), v, sort=sort, t=1e-10, tau=1.0)
        note("k = q: |A - I|", (A - torch.eye(8, dtype=f64)).abs().max())
    # Permutation equivariance (self-attention).
    q, k, v = rnd(1, 2, 9, 4), rnd(1, 2, 9, 4), rnd(1, 2, 9, 3)
    pi = torch.randperm(9)
    for sort in ("hard", "soft"):
        o, A, s = esp_semantics(q, k, v, sort=sort, t=0.2, tau=3.0, cost="euclid")
        op, Ap, sp = esp_semantics(q[:, :, pi], k[:, :, pi], v[:, :, pi], sort=sort,
                                   t=0.2, tau=3.0, cost="euclid")
        note("permutation equivariance",
             max((op - o[:, :, pi]).abs().max(), (Ap - A[:, :, pi][:, :, :, pi]).abs().max(),
                 (sp - s).abs().max()))

    # 5. Padding equals truncation, NaN in padded storage, zero gradients there.
    for (B, H, Nq, Nk, d, dv) in [(3, 2, 7, 9, 4, 3), (2, 1, 6, 6, 2, 5)]:
        q, k, v = rnd(B, H, Nq, d), rnd(B, H, Nk, d), rnd(B, H, Nk, dv)
        dO = rnd(B, H, Nq, dv)
        lq, lk = [Nq, 3, 0][:B], [4, Nk, 5][:B]
        for sort, th in (("soft", unit_rows(3, d)), ("hard", None), ("soft", None)):
            qg, kg, vg = q.clone(), k.clone(), v.clone()
            for b in range(B):
                qg[b, :, lq[b]:] = float("nan")
                kg[b, :, lk[b]:] = float("nan")
                vg[b, :, lk[b]:] = float("nan")
            leaves = [x.clone().requires_grad_(True) for x in (qg, kg, vg)]
            thl = None if th is None else th.clone().requires_grad_(True)
            o, A, s = esp_semantics(*leaves, sort=sort, t=0.3, tau=2.0, theta=thl,
                                    q_len=lq, k_len=lk)
            (o * dO).sum().backward()
            dth = 0.0
            for b in range(B):
                n, m = lq[b], lk[b]
                note("padding: zeros outside the block",
                     max(o[b, :, n:].abs().max() if n < Nq else 0,
                         A[b, :, :, m:].abs().max() if m < Nk else 0,
                         A[b, :, n:].abs().max() if n < Nq else 0))
                note("padding: zero gradients on padded slots",
                     max(leaves[0].grad[b, :, n:].abs().max() if n < Nq else 0,
                         leaves[1].grad[b, :, m:].abs().max() if m < Nk else 0,
                         leaves[2].grad[b, :, m:].abs().max() if m < Nk else 0))
                if n == 0 or m == 0:
                    note("padding: empty problem sigma = 0", s[b].abs().max())
                    continue
                tl = [x[b:b + 1, :, :ln].clone().requires_grad_(True)
                      for x, ln in ((q, n), (k, m), (v, m))]
                tth = None if th is None else th.clone().requires_grad_(True)
                ot, At, st = esp_semantics(*tl, sort=sort, t=0.3, tau=2.0, theta=tth)
                (ot * dO[b:b + 1, :, :n]).sum().backward()
                note("padding vs truncation (fwd)",
                     max((o[b:b + 1, :, :n] - ot).abs().max(),
                         (A[b:b + 1, :, :n, :m] - At).abs().max(), (s[b:b + 1] - st).abs().max()))
                note("padding vs truncation (grad)",
                     max((leaves[0].grad[b:b + 1, :, :n] - tl[0].grad).abs().max(),
                         (leaves[1].grad[b:b + 1, :, :m] - tl[1].grad).abs().max(),
                         (leaves[2].grad[b:b + 1, :, :m] - tl[2].grad).abs().max()))
                if th is not None:
                    dth = dth + tth.grad
            if th is not None:
                note("padding vs truncation (dTheta)", (thl.grad - dth).abs().max())

    # 6. Gradchecks (float64): soft everywhere; hard through D / sigma only.
    gc = {}
    for (B, H, Nq, Nk, d, dv) in [(1, 1, 5, 5, 3, 2), (2, 1, 4, 6, 2, 3), (1, 2, 6, 3, 4, 2)]:
        q, k, v = rnd(B, H, Nq, d), rnd(B, H, Nk, d), rnd(B, H, Nk, dv)
        th = unit_rows(3, d)
        for sort, cost, osc, tau, t, useth in [
                ("soft", "sq", "rows", 1.0, 0.5, False), ("soft", "euclid", "paper", 10.0, 0.1, True),
                ("soft", "sq", "rows", 0.0, 0.05, True), ("soft", "euclid", "rows", 3.0, 0.5, False),
                ("hard", "sq", "rows", 10.0, None, False), ("hard", "euclid", "paper", 1.0, None, True)]:
            inputs = [x.clone().requires_grad_(True) for x in (q, k, v)]
            if useth:
                inputs.append(th.clone().requires_grad_(sort == "soft"))

            def f(*xs, sort=sort, cost=cost, osc=osc, tau=tau, t=t, useth=useth):
                o, A, s = esp_semantics(xs[0], xs[1], xs[2], sort=sort, t=t, tau=tau,
                                        cost=cost, out_scale=osc,
                                        theta=xs[3] if useth else None)
                return o, s
            ok = torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)
            gc[sort] = gc.get(sort, True) and ok
        # Hard with tau = 0: no gradient to q, k at all.
        qq, kk = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
        o, _, _ = esp_semantics(qq, kk, v, sort="hard", tau=0.0, cost="euclid")
        o.sum().backward()
        note("hard tau=0: |dQ|, |dK|", max(qq.grad.abs().max(), kk.grad.abs().max()))
    print(f"gradcheck soft (q, k, v, theta; sigma too): {'ok' if gc['soft'] else 'FAIL'}")
    print(f"gradcheck hard (q, k, v through D/sigma): {'ok' if gc['hard'] else 'FAIL'}")

    # 7. The reference port against the semantics (tau = T N, euclid, rows).
    for (B, H, N, d, dv), t, T in itertools.product(
            [(1, 1, 6, 4, 4), (2, 3, 9, 8, 5), (1, 2, 1, 2, 3), (2, 2, 30, 4, 3)],
            (1e-3, 0.05, 0.5), (0.1, 10.0)):
        q, k, v = (rnd(B, H, N, d).requires_grad_(True), rnd(B, H, N, d).requires_grad_(True),
                   rnd(B, H, N, dv).requires_grad_(True))
        dO = rnd(B, H, N, dv)
        o1, g1, w1 = esp_reference(q, k, v, softsort_t=t, temperature=T, return_weights=True)
        gr1 = torch.autograd.grad((o1 * dO).sum(), (q, k, v))
        o2, g2, w2 = esp_semantics(q, k, v, sort="soft", t=t, tau=T * N, cost="euclid")
        gr2 = torch.autograd.grad((o2 * dO).sum(), (q, k, v))
        note("reference vs semantics (fwd)",
             max((o1 - o2).abs().max(), (g1 - g2).abs().max(), (w1 - w2).abs().max()))
        note("reference vs semantics (grad, rel)",
             max(float((x - y).abs().max() / max(1.0, float(y.abs().max())))
                 for x, y in zip(gr1, gr2)))
        if t == 1e-3 and N <= 9:
            # Straight-through hard forward == our hard forward (separated values).
            o3, g3 = esp_reference(q, k, v, softsort_t=1e-9, temperature=T, hard=True)
            o4, g4, _ = esp_semantics(q, k, v, sort="hard", tau=T * N, cost="euclid")
            note("reference hard=True vs hard (fwd)", max((o3 - o4).abs().max(),
                                                          (g3 - g4).abs().max()))

    for key, val in worst.items():
        print(f"{key:44s} {val:.3e}")
    return max(worst.values()), gc["soft"] and gc["hard"]


def main():
    """The self-check; returns the exit status."""
    m, gc_ok = _self_check()
    ok = m < 1e-9 and gc_ok
    print("self-check", "ok" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
