"""PyTorch LOTFormer attention: a reference-faithful port and the birkhoff oracle.

Module birkhoff._port_lotformer (pure PyTorch, no libbirkhoff call; used by
birkhoff.models); bench/peers/lotformer_torch.py is the same module under its old
name (and runs the self-check).

Two functions, both on q, k [B, H, N, d], v [B, H, Nk, dv], pivots
Z [H, r, d] and pivot-mass logits theta [H, r] (per head, shared over the
batch):

* lot_reference(): the algorithm of the reference DeiT/Swin LOT attention
  (the anonymous LOTFormer snapshot, `deit-imagenet/models/lot_deit.py` and
  `imagenet_swin/models/lot_swin.py`), as digested in docs/specs
  (lotformer.md sections 1, 2 and 7), written from that description. It is the
  PEER BENCHMARK: q and k are multiplied by d^-1/2, the pivot masses are
  p0 = softmax(theta / temp), both problems are solved by the reference's
  log-domain Sinkhorn on the batch of B*H problems (cost C = -scores,
  potentials u, v starting at 0, float32 marginals, increment updates
  u <- eps (log mu - LSE_j M) + u with M = (-C + u_i + v_j) / eps, max_iter
  half-steps, row step first, early stop on mean sum |du| < 1e-12 checked with
  .item()), and the output is n Phi_Q (Phi_K V) with
  Phi_Q = P_QZ diag(p0)^-1/2, Phi_K = diag(p0)^-1/2 P_ZK: the n x n matrix is
  never formed, autograd differentiates through the unrolled loop (O(T n r)
  saved memory). Unlike the reference, entry b*H + h uses the masses of head h
  (the reference's head-major repeat_interleave mixes heads when B > 1 and
  H > 1, a bug: lotformer.md addendum), and B*H = 1 works.
  No masking (the DeiT/Swin patch path has none).

* lot_semantics(): birkhoff's documented LOT semantics, in any float dtype
  with autograd everywhere. It is the TEST ORACLE (tests/oracle/oracle.py).
  Per (batch, head) problem with n queries and m keys (the valid prefixes
  when padded), s = scale (default d^-1/2):

    p0 = softmax(theta / temp)                      (r pivot masses)
    L1 = s Q Z^T / eps        (n x r),  marginals (1/n, p0)
    L2 = s Z K^T / eps        (r x m),  marginals (p0, 1/m)
    each problem: T half-steps, row step first, f = g = 0 initially,
      row:    f_i = log a_i - LSE_j(L_ij + g_j)
      column: g_j = log b_j - LSE_i(L_ij + f_i)
    Gamma = exp(L + f (+) g)
    A = n Gamma1 diag(1/p0) Gamma2                  (n x m)
    O = A V = n Gamma1 (diag(1/p0) (Gamma2 V))

  Padding: batch entry b uses its valid prefix (n = q_len[b], m = k_len[b]);
  padded rows of O and A are zero, A is zero on padded keys, and padded
  storage is never read (it may hold NaN).

Relation (checked by the self-check below and tests/oracle/test_oracle.py):

    lot_reference(q, k, v, Z, theta, temp, n_iter, eps, marginal_dtype=None)
        == lot_semantics(q, k, v, Z, theta, temp=temp, iters=n_iter, eps=eps)

(outputs and gradients, to rounding; the reference's float32 marginals make
it differ by about 1e-7 in float64).

Run this file directly for a self-check.
"""

import torch

from ._port_sinkformer import _lengths  # one helper for the valid lengths of every port


# ---------------------------------------------------------------------------
# Peer: port of the reference DeiT/Swin LOT attention
# ---------------------------------------------------------------------------
def _sinkhorn_reference(scores, mu, nu, eps, max_iter, thresh=1e-12):
    """Reference log-domain Sinkhorn on a batch of score matrices.

    scores: [batch, m, k] similarities; mu [batch, m], nu [batch, k] marginals
    (entries of zero mass are masked with -inf in the kernel, as the
    reference does; none occur here). Returns pi = exp(M) [batch, m, k].
    """
    C = -scores
    log_mu, log_nu = torch.log(mu), torch.log(nu)
    u = torch.zeros_like(mu)
    v = torch.zeros_like(nu)

    def M(u, v):
        return (-C + u.unsqueeze(-1) + v.unsqueeze(-2)) / eps

    for i in range(max_iter):
        if i % 2 == 0:
            u_prev = u
            u = eps * (log_mu - torch.logsumexp(M(u, v), dim=-1)) + u
            err = (u - u_prev).abs().sum(-1).mean()
            if err.item() < thresh:
                break
        else:
            v = eps * (log_nu - torch.logsumexp(M(u, v), dim=-2)) + v
    return torch.exp(M(u, v))


def lot_reference(q, k, v, Z, theta, temp=0.5, n_iter=5, eps=1.0,
                  marginal_dtype=torch.float32, return_plans=False):
    """Reference DeiT/Swin LOT attention (without projections, DWC or [CLS]).

    q: [B,H,Nq,d], k: [B,H,Nk,d], v: [B,H,Nk,dv], Z: [H,r,d], theta: [H,r].
    marginal_dtype: dtype of the uniform marginals (the reference: float32;
    None: the input's dtype). Returns out [B,H,Nq,dv]; with return_plans also
    (P_QZ [B,H,Nq,r], P_ZK [B,H,r,Nk], p0 [H,r]).
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("lot_reference: q, k, v must be [B, H, N, d]")
    B, H, Nq, d = q.shape
    Nk = k.shape[2]
    r = Z.shape[1]
    if Z.shape != (H, r, d) or theta.shape != (H, r):
        raise ValueError("lot_reference: Z must be [H, r, d] and theta [H, r]")
    s = d ** -0.5
    qs, ks = q * s, k * s
    p0 = torch.softmax(theta / temp, dim=-1)                        # [H, r]
    mdt = marginal_dtype if marginal_dtype is not None else q.dtype
    bh = B * H
    pz = p0.unsqueeze(0).expand(B, H, r).reshape(bh, r).to(mdt)    # batch-major
    a = torch.full((bh, Nq), 1.0 / Nq, dtype=mdt, device=q.device)
    b = torch.full((bh, Nk), 1.0 / Nk, dtype=mdt, device=q.device)
    c_qz = (qs @ Z.transpose(-1, -2).unsqueeze(0)).reshape(bh, Nq, r)
    c_zk = (Z.unsqueeze(0) @ ks.transpose(-1, -2)).reshape(bh, r, Nk)
    P_QZ = _sinkhorn_reference(c_qz, a, pz, eps, n_iter)             # [bh, Nq, r]
    P_ZK = _sinkhorn_reference(c_zk, pz, b, eps, n_iter)             # [bh, r, Nk]
    zs = pz.to(q.dtype).sqrt().reciprocal()                          # diag(p0)^-1/2
    phi_q = P_QZ * zs.unsqueeze(-2)
    phi_k = P_ZK * zs.unsqueeze(-1)
    out = Nq * (phi_q @ (phi_k @ v.reshape(bh, Nk, -1)))
    out = out.reshape(B, H, Nq, -1)
    if return_plans:
        return out, (P_QZ.reshape(B, H, Nq, r), P_ZK.reshape(B, H, r, Nk), p0)
    return out


# ---------------------------------------------------------------------------
# Oracle: birkhoff's semantics
# ---------------------------------------------------------------------------


def _sinkhorn(L, log_a, log_b, iters):
    """T half-steps (row first) on log-kernel L [..., m, k]; returns the plan."""
    f = torch.zeros_like(L[..., :, 0])
    g = torch.zeros_like(L[..., 0, :])
    for i in range(iters):
        if i % 2 == 0:
            f = log_a - torch.logsumexp(L + g.unsqueeze(-2), dim=-1)
        else:
            g = log_b - torch.logsumexp(L + f.unsqueeze(-1), dim=-2)
    return torch.exp(L + f.unsqueeze(-1) + g.unsqueeze(-2))


def lot_semantics(q, k, v, Z, theta, *, temp, iters, eps, scale=None,
                  q_len=None, k_len=None, return_attn=False):
    """birkhoff LOT attention (see the module docstring for the definition).

    q: [B,H,Nq,d], k: [B,H,Nk,d], v: [B,H,Nk,dv], Z: [H,r,d], theta: [H,r];
    q_len/k_len: optional per-batch valid lengths. Returns (O [B,H,Nq,dv],
    A [B,H,Nq,Nk] or None); gradients flow to q, k, v, Z and theta.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be [B, H, N, d]")
    B, H, Nq, d = q.shape
    Nk, dv = k.shape[2], v.shape[3]
    if k.shape[0] != B or k.shape[1] != H or k.shape[3] != d:
        raise ValueError("k must be [B, H, Nk, d] matching q")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError("v must be [B, H, Nk, dv] matching k")
    if Z.dim() != 3 or Z.shape[0] != H or Z.shape[2] != d or Z.shape[1] < 1:
        raise ValueError("Z must be [H, r, d] with r >= 1")
    r = Z.shape[1]
    if tuple(theta.shape) != (H, r):
        raise ValueError("theta must be [H, r]")
    if not (temp > 0 and eps > 0) or iters < 1:
        raise ValueError("need temp > 0, eps > 0, iters >= 1")
    if scale is None:
        scale = d ** -0.5
    lq = _lengths(q_len, B, Nq, "q_len")
    lk = _lengths(k_len, B, Nk, "k_len")
    p0 = torch.softmax(theta / temp, dim=-1)                         # [H, r]
    logp = torch.log(p0)
    outs, attns = [], []
    for bi in range(B):
        n, m = lq[bi], lk[bi]
        if n == 0 or m == 0:
            outs.append(q.new_zeros(H, Nq, dv))
            attns.append(q.new_zeros(H, Nq, Nk))
            continue
        # Slicing first: padded storage never enters any computation.
        qb, kb, vb = q[bi, :, :n], k[bi, :, :m], v[bi, :, :m]
        L1 = (scale / eps) * (qb @ Z.transpose(-1, -2))              # [H, n, r]
        L2 = (scale / eps) * (Z @ kb.transpose(-1, -2))              # [H, r, m]
        la = torch.full((H, n), -float(torch.log(torch.tensor(float(n), dtype=torch.float64))),
                        dtype=q.dtype, device=q.device)
        lb = torch.full((H, m), -float(torch.log(torch.tensor(float(m), dtype=torch.float64))),
                        dtype=q.dtype, device=q.device)
        G1 = _sinkhorn(L1, la, logp, iters)                          # [H, n, r]
        G2 = _sinkhorn(L2, logp, lb, iters)                          # [H, r, m]
        W = (G2 @ vb) / p0.unsqueeze(-1)                             # [H, r, dv]
        o = n * (G1 @ W)
        outs.append(torch.nn.functional.pad(o, (0, 0, 0, Nq - n)))
        if return_attn:
            A = n * ((G1 / p0.unsqueeze(-2)) @ G2)
            attns.append(torch.nn.functional.pad(A, (0, Nk - m, 0, Nq - n)))
    return torch.stack(outs), (torch.stack(attns) if return_attn else None)


# ---------------------------------------------------------------------------
# The ViT ingredients of LOTFormer's section 4.2 (birkhoff's semantics:
# docs/MODEL.md "The [CLS] row and DWC"; the engine's src/nn/vit.c)
# ---------------------------------------------------------------------------
def cls_row_semantics(q0, k, v, *, mode, scale, ps=2.0, po=1.0, k_len=None):
    """The [CLS] token's own attention row.

    q0: [B, H, d] ([CLS]'s queries), k: [B, H, N, d], v: [B, H, N, dv] (every
    token, [CLS] first); k_len: valid keys per sample (None: all N). Over the
    valid keys j, the logits are s q0 . k_j (mode "softmax": the paper's
    [CLS]-softmax, beta = s) or (mode "pol": Pol-[CLS])

        u_j^ps + w_j^po,  u_j = s (q0+ . k_j+ + q0- . k_j-),
                          w_j = s (q0+ . k_j- + q0- . k_j+),   x+- = relu(+-x)

    and alpha = softmax_j(logits). Returns (o0 [B, H, dv] = sum_j alpha_j v_j,
    alpha [B, H, N], zero on padded keys)."""
    B, H, N, _ = k.shape
    lk = _lengths(k_len, B, N, "k_len")
    outs, alphas = [], []
    for bi in range(B):
        m = lk[bi]
        qb, kb, vb = q0[bi], k[bi, :, :m], v[bi, :, :m]              # [H, d], [H, m, d]
        if mode == "softmax":
            lg = scale * torch.einsum("hd,hjd->hj", qb, kb)
        elif mode == "pol":
            qp, qn = torch.relu(qb), torch.relu(-qb)
            kp, kn = torch.relu(kb), torch.relu(-kb)
            u = scale * (torch.einsum("hd,hjd->hj", qp, kp) + torch.einsum("hd,hjd->hj", qn, kn))
            w = scale * (torch.einsum("hd,hjd->hj", qp, kn) + torch.einsum("hd,hjd->hj", qn, kp))
            lg = u ** ps + w ** po
        else:
            raise ValueError(f"mode={mode!r}: softmax or pol")
        a = torch.softmax(lg, dim=-1)                                # [H, m]
        outs.append(torch.einsum("hj,hjc->hc", a, vb))
        alphas.append(torch.nn.functional.pad(a, (0, N - m)))
    return torch.stack(outs), torch.stack(alphas)


def dwc_semantics(v, weight, bias, gh, gw):
    """The depthwise-convolution branch over the patch grid: v [B, H, gh*gw,
    dv] (the patch tokens in row-major grid order, no [CLS]), weight [dv, k,
    k] and bias [dv] shared by the heads; returns DWConv_k(v) [B, H, gh*gw,
    dv]: per head channel c, cross-correlation with weight[c] (zero padding
    k // 2) plus bias[c] (torch's Conv2d(dv, dv, k, padding=k // 2,
    groups=dv) with weight[:, None])."""
    B, H, n, dv = v.shape
    k = weight.shape[-1]
    x = v.permute(0, 1, 3, 2).reshape(B * H, dv, gh, gw)
    y = torch.nn.functional.conv2d(x, weight.unsqueeze(1), bias, padding=k // 2, groups=dv)
    return y.reshape(B, H, dv, n).permute(0, 1, 3, 2)


# ---------------------------------------------------------------------------
# Self-check: python3 bench/peers/lotformer_torch.py
# ---------------------------------------------------------------------------
def _self_check():
    torch.manual_seed(0)
    f64 = torch.float64
    worst = {}
    ok = True

    def note(key, val):
        worst[key] = max(worst.get(key, 0.0), float(val))

    def rnd(*shape):
        return torch.randn(*shape, dtype=f64)

    # 1. Reference port vs semantics (float64 marginals), outputs + gradients.
    for (B, H, N, d, dv, r, T, eps, temp) in [
            (1, 1, 6, 4, 4, 3, 5, 1.0, 0.5), (2, 2, 9, 8, 5, 4, 6, 0.5, 2.0),
            (2, 3, 7, 4, 3, 1, 2, 1.0, 0.5), (1, 2, 12, 8, 8, 8, 1, 0.7, 0.5)]:
        q, k, v, Z, th = rnd(B, H, N, d), rnd(B, H, N, d), rnd(B, H, N, dv), rnd(H, r, d), rnd(H, r)
        do = rnd(B, H, N, dv)
        ins = [x.clone().requires_grad_(True) for x in (q, k, v, Z, th)]
        o1 = lot_reference(*ins, temp=temp, n_iter=T, eps=eps, marginal_dtype=None)
        g1 = torch.autograd.grad((o1 * do).sum(), ins)
        o2, _ = lot_semantics(*ins, temp=temp, iters=T, eps=eps)
        g2 = torch.autograd.grad((o2 * do).sum(), ins)
        note("reference vs semantics (out)", (o1 - o2).abs().max())
        note("reference vs semantics (grads)",
             max(float((x - y).abs().max()) / max(1.0, float(y.abs().max()))
                 for x, y in zip(g1, g2)))
        o3 = lot_reference(*[x.float() for x in (q, k, v, Z, th)], temp=temp, n_iter=T, eps=eps)
        print(f"reference float32 vs semantics float64 (out), case B{B}H{H}N{N}: "
              f"{float((o3.double() - o2).abs().max()):.2e}")

    # 2. A @ V == O; r = 1 gives the mean of V; T = 1 gives dtheta = 0;
    #    rows of A sum to 1 for odd T, columns (times n/m) for even T.
    for (B, H, Nq, Nk, d, dv, r) in [(2, 2, 5, 9, 4, 3, 3), (1, 1, 7, 7, 8, 2, 1),
                                     (2, 1, 1, 4, 4, 4, 5)]:
        q, k, v, Z, th = rnd(B, H, Nq, d), rnd(B, H, Nk, d), rnd(B, H, Nk, dv), rnd(H, r, d), rnd(H, r)
        for T in (1, 2, 5, 6):
            o, A = lot_semantics(q, k, v, Z, th, temp=0.5, iters=T, eps=0.5, return_attn=True)
            note("O - A V", (o - A @ v).abs().max())
            if T % 2:
                note("odd T: |row sums - 1|", (A.sum(-1) - 1).abs().max())
            else:
                note("even T: |col sums - n/m|", (A.sum(-2) - Nq / Nk).abs().max())
            if r == 1 and T >= 2:
                # (T = 1: Gamma2 is one row step, softmax over the keys, so
                # O_i = softmax_j(s z.k_j / eps) V for every i, not the mean.)
                note("r=1, T>=2: O - mean(V)", (o - v.mean(-2, keepdim=True)).abs().max())
            if r == 1 and T == 1:
                w = torch.softmax(d ** -0.5 * (Z[:, 0].unsqueeze(0).unsqueeze(-2) * k).sum(-1)
                                  / 0.5, dim=-1)
                note("r=1, T=1: O - softmax_j(s z.k_j/eps) V",
                     (o - (w.unsqueeze(-2) @ v)).abs().max())
        tt = th.clone().requires_grad_(True)
        o, _ = lot_semantics(q, k, v, Z, tt, temp=0.5, iters=1, eps=0.5)
        note("T=1: |dtheta|", torch.autograd.grad((o * rnd(*o.shape)).sum(), tt)[0].abs().max())

    # 3. Padding == truncation, with NaN in the padded storage.
    B, H, Nq, Nk, d, dv, r = 3, 2, 8, 6, 4, 3, 3
    q, k, v, Z, th = rnd(B, H, Nq, d), rnd(B, H, Nk, d), rnd(B, H, Nk, dv), rnd(H, r, d), rnd(H, r)
    ql, kl = [8, 3, 1], [2, 6, 4]
    qp, kp, vp = q.clone(), k.clone(), v.clone()
    for bi in range(B):
        qp[bi, :, ql[bi]:] = float("nan")
        kp[bi, :, kl[bi]:] = float("nan")
        vp[bi, :, kl[bi]:] = float("nan")
    o, A = lot_semantics(qp, kp, vp, Z, th, temp=2.0, iters=5, eps=1.0, q_len=ql, k_len=kl,
                         return_attn=True)
    for bi in range(B):
        n, m = ql[bi], kl[bi]
        ot, At = lot_semantics(q[bi:bi + 1, :, :n], k[bi:bi + 1, :, :m], v[bi:bi + 1, :, :m],
                               Z, th, temp=2.0, iters=5, eps=1.0, return_attn=True)
        note("padding vs truncation", max((o[bi, :, :n] - ot[0]).abs().max(),
                                          (A[bi, :, :n, :m] - At[0]).abs().max()))
        note("padded entries", max(o[bi, :, n:].abs().max() if n < Nq else 0.0,
                                   A[bi, :, n:].abs().max() if n < Nq else 0.0,
                                   A[bi, :, :, m:].abs().max() if m < Nk else 0.0))

    # 4. gradcheck (float64) through q, k, v, Z, theta, with padding.
    B, H, Nq, Nk, d, dv, r = 2, 2, 4, 5, 3, 2, 3
    ins = [rnd(*s).requires_grad_(True) for s in
           ((B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, dv), (H, r, d), (H, r))]
    for T, ql, kl in ((1, None, None), (4, None, None), (5, [4, 2], [3, 5])):
        res = torch.autograd.gradcheck(
            lambda *x: lot_semantics(*x, temp=0.7, iters=T, eps=0.8, q_len=ql, k_len=kl)[0],
            ins, eps=1e-6, atol=1e-7, rtol=1e-6)
        print(f"gradcheck T={T} pad={ql is not None}: {res}")
        ok = ok and res

    for key, val in worst.items():
        print(f"{key:40s} {val:.3e}")
    return max(worst.values()), ok


def main():
    """The self-check; returns the exit status."""
    m, gc_ok = _self_check()
    good = m < 1e-9 and gc_ok
    print("self-check", "ok" if good else "FAIL")
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
