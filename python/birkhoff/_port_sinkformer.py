"""PyTorch port of the Sinkformer attention of Sander et al. (AISTATS 2022).

Module birkhoff._port_sinkformer (pure PyTorch, no libbirkhoff call; used by
birkhoff.models); bench/peers/sinkformer_torch.py is the same module under its old
name (and runs the self-check).

Reference conventions: the authors' repository `michaelsdr/sinkformers`
(`vit-pytorch/vit_pytorch/sinkhorn.py` and `vit.py`), as digested in
docs/specs (sinkformers.md section 1-3, anchors.md section 1.1). Written from
that description; the solver follows the reference algorithm step by step:

* input: a score (similarity) tensor c of shape (batch, n_q, n_k), with
  batch = B*H flattened; the solver works on the cost C = -c;
* log potentials u (batch, n_q) and v (batch, n_k), both starting at zero;
* uniform marginals mu = 1/n_q, nu = 1/n_k, created in float32 whatever the
  input dtype (reference behaviour; `marginal_dtype` can change it);
* `max_iter` counts *half-steps*, row first: even i updates u, odd i updates v,
  in the additive "increment" form
      u <- eps * (log mu - LSE_j M) + u,   M = (-C + u_i + v_j) / eps,
  which is algebraically Sinkhorn on c/eps;
* global early stop when mean_batch sum_i |u - u_prev| < thresh (1e-12 by
  default, i.e. practically never in float64);
* result pi = exp(M(C, u, v)): rows sum to 1/n_q after a row step.

The attention wrapper multiplies by n_q (rows of the attention sum to 1), so
one half-step (n_it = 1) is exactly softmax(scores / eps).

Padding is handled the sound way (spec section 3.4), not with the reference's
-1e9 fill: each batch entry is solved on its valid Lq x Lk block only.

This module is used as a benchmark peer (bench/peers/torch_peer.py) and as the
test oracle (tests/oracle/oracle.py); run it directly for a self-check.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class SinkhornDistance(nn.Module):
    """Log-domain Sinkhorn on a score tensor, reference algorithm.

    Args:
        eps: temperature; the plan is Sinkhorn(c / eps).
        max_iter: number of half-steps (1 = row softmax / n_q).
        thresh: global early-stop threshold on mean_batch sum_i |du_i|.
        marginal_dtype: dtype of mu/nu. The reference uses float32 always
            (torch.float); pass None to use the input's dtype (float64 runs).
        update: "increment" (reference: u <- eps*(log mu - LSE M) + u) or
            "direct" (textbook: u <- eps*log mu - eps*LSE((c + v)/eps)); equal
            in exact arithmetic, they differ only in rounding.

    forward(c) returns pi of shape (batch, n_q, n_k). (The reference returns
    the tuple (pi, C, U, V); only pi is ever used by the attention wrappers.)
    The number of half-steps actually run is left in `self.last_iters`.
    """

    def __init__(self, eps, max_iter, thresh=1e-12, marginal_dtype=torch.float32,
                 update="increment", rho=None):
        super().__init__()
        if max_iter < 1:
            raise ValueError("max_iter must be >= 1")
        if eps <= 0:
            raise ValueError("eps must be > 0")
        if update not in ("increment", "direct"):
            raise ValueError("update must be 'increment' or 'direct'")
        self.eps = eps
        self.max_iter = max_iter
        self.thresh = thresh
        self.marginal_dtype = marginal_dtype
        self.update = update
        # rho: the reference's SinkhornUnbalanced (vit_pytorch/unbalanced.py,
        # its `q`): every column step is damped by rho / (rho + eps); None is
        # the balanced solver
        self.kappa = 1.0 if rho is None else rho / (rho + eps)
        self.last_iters = 0

    def M(self, C, u, v):
        """Modified cost M_ij = (-C_ij + u_i + v_j) / eps."""
        return (-C + u.unsqueeze(-1) + v.unsqueeze(-2)) / self.eps

    def forward(self, c):
        if c.dim() != 3:
            raise ValueError("expected scores of shape (batch, n_q, n_k)")
        C = -c
        batch, n_q, n_k = C.shape
        mdt = self.marginal_dtype if self.marginal_dtype is not None else c.dtype
        # Marginals are built directly as (batch, n) tensors. The reference
        # builds them with .squeeze() and then .view(-1, 1) when the result is
        # 1-D; for batch == 1 that gives mu the shape (n_q, 1) instead of
        # (1, n_q), which broadcasts wrongly. That bug is deliberately not
        # reproduced here: batch == 1 behaves like any other batch size.
        mu = torch.full((batch, n_q), 1.0 / n_q, dtype=mdt, device=c.device)
        nu = torch.full((batch, n_k), 1.0 / n_k, dtype=mdt, device=c.device)
        log_mu, log_nu = torch.log(mu), torch.log(nu)

        u = torch.zeros_like(mu)
        v = torch.zeros_like(nu)
        eps = self.eps
        self.last_iters = 0
        for i in range(self.max_iter):
            self.last_iters = i + 1
            if i % 2 == 0:
                # Row step (first, third, ... half-step).
                u_prev = u
                if self.update == "increment":
                    u = eps * (log_mu - torch.logsumexp(self.M(C, u, v), dim=-1)) + u
                else:
                    u = eps * log_mu - eps * torch.logsumexp(
                        self.M(C, torch.zeros_like(u), v), dim=-1)
                # err only changes on row steps. The reference compares the
                # (possibly stale) err after every half-step, which is the
                # same as checking right after each row step.
                err = (u - u_prev).abs().sum(-1).mean()
                if err.item() < self.thresh:
                    break
            else:
                # Column step: the same update over dim -2.
                if self.update == "increment":
                    v = eps * (log_nu - torch.logsumexp(self.M(C, u, v), dim=-2)) + v
                else:
                    v = eps * log_nu - eps * torch.logsumexp(
                        self.M(C, u, torch.zeros_like(v)), dim=-2)
                if self.kappa != 1.0:
                    v = self.kappa * v
        return torch.exp(self.M(C, u, v))


def _lengths(lens, B, N, name):
    """Per-batch valid lengths as a list of Python ints (None = all N)."""
    if lens is None:
        return [N] * B
    if torch.is_tensor(lens):
        lens = lens.detach().cpu().reshape(-1).tolist()
    else:
        lens = [int(x) for x in list(lens)]
    if len(lens) != B:
        raise ValueError(f"{name} must have length B={B}")
    for x in lens:
        if not 0 <= x <= N:
            raise ValueError(f"{name} entry {x} outside [0, {N}]")
    return [int(x) for x in lens]


def _check_qkv(q, k, v):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be [B, H, N, d]")
    B, H, _, d = q.shape
    if k.shape[0] != B or k.shape[1] != H or k.shape[3] != d:
        raise ValueError("k must be [B, H, Nk, d] matching q")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError("v must be [B, H, Nk, dv] matching k")


def _padded_apply(q, k, v, q_len, k_len, block_fn):
    """Run block_fn on each batch entry's valid block and zero-pad back.

    block_fn(dots_b) maps the (H, Lq, Lk) valid scores of one batch entry to
    its (H, Lq, Lk) attention. Padded query rows of the output are zero and the
    attention is zero outside the block; padded positions are never read
    (q/k/v there may hold anything), so their gradients are exactly zero.
    """
    B, H, Nq, _ = q.shape
    Nk, dv = k.shape[2], v.shape[3]
    lq = _lengths(q_len, B, Nq, "q_len")
    lk = _lengths(k_len, B, Nk, "k_len")
    outs, attns = [], []
    for b in range(B):
        Lq, Lk = lq[b], lk[b]
        if Lq == 0 or Lk == 0:
            # Empty problem: zero output and attention (nothing is read).
            outs.append(q.new_zeros(H, Nq, dv))
            attns.append(q.new_zeros(H, Nq, Nk))
            continue
        a = block_fn(q[b, :, :Lq], k[b, :, :Lk])          # (H, Lq, Lk)
        o = a @ v[b, :, :Lk]                              # (H, Lq, dv)
        outs.append(F.pad(o, (0, 0, 0, Nq - Lq)))
        attns.append(F.pad(a, (0, Nk - Lk, 0, Nq - Lq)))
    return torch.stack(outs), torch.stack(attns)


def attention(q, k, v, n_it, eps=1.0, scale=None, q_len=None, k_len=None, *,
              thresh=1e-12, marginal_dtype=torch.float32, update="increment", rho=None):
    """Sinkformer attention (reference ViT `Attention`, plus sound padding).

    q: [B,H,Nq,d], k: [B,H,Nk,d], v: [B,H,Nk,dv]. Returns (out, attn) with
    out [B,H,Nq,dv] and attn [B,H,Nq,Nk].

    dots = scale * q k^T (scale defaults to d^-1/2, as in the reference);
    pi = SinkhornDistance(eps, n_it)(dots), i.e. pi = exp((dots + u + v)/eps);
    attn = n_q * pi. The reference writes `pi * pi.shape[-1]` (n_k): identical
    for self-attention (n_q = n_k). For rectangular problems n_q is the factor
    that makes the rows sum to 1 (columns then sum to n_q/n_k at convergence),
    so n_it = 1 is exactly softmax(dots / eps) for every shape.

    Padding (q_len/k_len: per-batch valid lengths, ints): each batch entry is
    solved on its valid Lq x Lk block with marginals 1/Lq, 1/Lk, attn = Lq*P
    there and 0 elsewhere, padded query rows of out are 0. This replaces the
    reference's -1e9 key fill, which leaves the problem infeasible (spec 3.3).
    The early stop is then global over the H heads of each batch entry rather
    than over all B*H problems (irrelevant with the default thresh).

    Keyword-only extras select the numerics: marginal_dtype=None computes
    the marginals in the input dtype (all-float64 runs); update="direct" uses
    the textbook potential update instead of the reference increment form;
    rho (> 0) damps every column step by rho / (rho + eps): the reference's
    SinkhornUnbalanced (the semi-unbalanced problem, KL penalty rho on the
    column marginal).
    """
    _check_qkv(q, k, v)
    if n_it < 1:
        raise ValueError("n_it must be >= 1")
    d = q.shape[-1]
    if scale is None:
        scale = d ** -0.5
    sink = SinkhornDistance(eps, n_it, thresh=thresh,
                            marginal_dtype=marginal_dtype, update=update, rho=rho)

    def block(qb, kb):
        # qb: (..., Lq, d), kb: (..., Lk, d) -> attention (..., Lq, Lk)
        dots = torch.matmul(qb, kb.transpose(-1, -2)) * scale
        lead, (nq, nk) = dots.shape[:-2], dots.shape[-2:]
        pi = sink(dots.reshape(-1, nq, nk)).reshape(*lead, nq, nk)
        return pi * nq

    if q_len is None and k_len is None:
        attn = block(q, k)
        return torch.matmul(attn, v), attn
    return _padded_apply(q, k, v, q_len, k_len, block)


def softmax_attention(q, k, v, scale=None, q_len=None, k_len=None):
    """Plain softmax attention, same shapes and padding semantics as attention()."""
    _check_qkv(q, k, v)
    d = q.shape[-1]
    if scale is None:
        scale = d ** -0.5

    def block(qb, kb):
        return torch.softmax(torch.matmul(qb, kb.transpose(-1, -2)) * scale, dim=-1)

    if q_len is None and k_len is None:
        attn = block(q, k)
        return torch.matmul(attn, v), attn
    return _padded_apply(q, k, v, q_len, k_len, block)


# ---------------------------------------------------------------------------
# Self-check: python3 bench/peers/sinkformer_torch.py
# ---------------------------------------------------------------------------
def _self_check():
    torch.manual_seed(0)
    f64 = dict(marginal_dtype=None)
    worst = {}

    def note(key, val):
        worst[key] = max(worst.get(key, 0.0), float(val))

    for (B, H, Nq, Nk, d, dv) in [(1, 1, 6, 6, 4, 4), (2, 3, 7, 7, 8, 5),
                                  (2, 2, 5, 9, 8, 8), (1, 2, 12, 4, 16, 3),
                                  (1, 1, 1, 1, 4, 4)]:
        q = torch.randn(B, H, Nq, d, dtype=torch.float64)
        k = torch.randn(B, H, Nk, d, dtype=torch.float64)
        v = torch.randn(B, H, Nk, dv, dtype=torch.float64)
        for eps in (1.0, 0.5):
            # S = 1 is softmax(dots / eps).
            o1, a1 = attention(q, k, v, 1, eps=eps, **f64)
            dots = q @ k.transpose(-1, -2) * d ** -0.5
            a_ref = torch.softmax(dots / eps, dim=-1)
            note("S=1 vs softmax (attn)", (a1 - a_ref).abs().max())
            note("S=1 vs softmax (out)", (o1 - a_ref @ v).abs().max())
            for S in (2, 3, 4, 5, 8, 9):
                _, a = attention(q, k, v, S, eps=eps, **f64)
                if S % 2:
                    note("odd S: |rowsum - 1|", (a.sum(-1) - 1).abs().max())
                else:
                    note("even S: |colsum - Nq/Nk|", (a.sum(-2) - Nq / Nk).abs().max())
            # Direct vs increment update, float64.
            _, ai = attention(q, k, v, 5, eps=eps, **f64)
            _, ad = attention(q, k, v, 5, eps=eps, update="direct", **f64)
            note("increment vs direct (f64, S=5)", (ai - ad).abs().max())
        # Padding equals truncation, whatever sits in the padded slots.
        lq = torch.randint(1, Nq + 1, (B,))
        lk = torch.randint(1, Nk + 1, (B,))
        qg, kg, vg = q.clone(), k.clone(), v.clone()
        for b in range(B):
            qg[b, :, lq[b]:] = 1e6
            kg[b, :, lk[b]:] = -1e6
            vg[b, :, lk[b]:] = 1e6
        for S in (1, 2, 3):
            fn = (lambda *a, **kw: attention(*a, S, **kw, **f64)) if S > 1 else \
                (lambda *a, **kw: softmax_attention(*a, **kw))
            o, a = fn(qg, kg, vg, q_len=lq, k_len=lk)
            for b in range(B):
                L, M = int(lq[b]), int(lk[b])
                ot, at = fn(q[b:b + 1, :, :L], k[b:b + 1, :, :M], v[b:b + 1, :, :M])
                note("padding vs truncation", (o[b:b + 1, :, :L] - ot).abs().max())
                note("padding vs truncation", (a[b:b + 1, :, :L, :M] - at).abs().max())
                note("padding: zeros outside block", o[b, :, L:].abs().max() if L < Nq else 0)
                note("padding: zeros outside block", a[b, :, :, M:].abs().max() if M < Nk else 0)
    # batch == 1 versus the same problem inside a larger batch.
    c = torch.randn(4, 5, 6, dtype=torch.float64)
    pb = SinkhornDistance(1.0, 4, marginal_dtype=None)(c)
    p1 = SinkhornDistance(1.0, 4, marginal_dtype=None)(c[2:3])
    note("batch 1 vs batched", (pb[2:3] - p1).abs().max())
    for key, val in worst.items():
        print(f"{key:34s} {val:.3e}")
    return max(worst.values())


def main():
    """The self-check; returns the exit status."""
    m = _self_check()
    print("self-check", "ok" if m < 1e-12 else "FAIL")
    return 0 if m < 1e-12 else 1


if __name__ == "__main__":
    raise SystemExit(main())
