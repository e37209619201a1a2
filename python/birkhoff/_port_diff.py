"""PyTorch differential attention (DiffTransformer): the paper's layer and the birkhoff oracle.

Module birkhoff._port_diff (pure PyTorch, no libbirkhoff call; used by
birkhoff.models); bench/peers/diff_torch.py is the same module under its old
name (and runs the self-check).

Differential attention (Ye et al., "Differential Transformer", ICLR 2025)
subtracts two softmax attention maps:

    DiffAttn(X) = (softmax(Q1 K1^T / sqrt(dh)) - lambda softmax(Q2 K2^T / sqrt(dh))) V

with Q = [Q1, Q2], K = [K1, K2] and a learnable, re-parameterised lambda

    lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,
    lambda_init(l) = 0.8 - 0.6 exp(-0.3 (l - 1))      (layer l, 1-based);

each head's output is normalised (RMSNorm over its channels) and multiplied
by (1 - lambda_init). Written from the paper's description:

* diff_semantics(): birkhoff's documented operator (include/birkhoff/diff.h),
  any float dtype, autograd everywhere: the TEST ORACLE
  (tests/oracle/oracle.py, tests/python/test_bindings.py). q, k [B, H, N, d]
  with d even (the two halves are the channels [:d/2] and [d/2:]), v
  [B, H, Nk, dv], lam [H] (a tensor: its gradient is dlambda). Per (batch,
  head) problem on the valid prefixes (n = q_len[b], m = k_len[b]):
      A1 = softmax_j(s Q[:, :dh] K[:, :dh]^T),  A2 = softmax_j(s Q[:, dh:] K[:, dh:]^T)
      A = A1 - lam_h A2,  O = A V,  s = scale or dh^-1/2.
  Padded rows of O and A are zero, A is zero on padded keys, padded storage
  is never read (it may hold NaN).

* diff_reference(): the paper's layout of the same map: 2H heads of
  dimension dh (heads 2h and 2h + 1 are the two maps of head h), one batched
  softmax over all 2H heads, the weights viewed as [B, H, 2, N, M] and
  subtracted, no padding. diff_reference(to_pair_heads(q), to_pair_heads(k),
  v, lam) == diff_semantics(q, k, v, lam) (checked below).

* DiffAttentionLayer: the whole layer of the paper around the operator
  (projections, the lambda re-parameterisation, per-head RMSNorm, the factor
  (1 - lambda_init), output projection), on x [B, N, E], for the model layer.

Run this file directly for a self-check.
"""

import math

import torch

from ._port_sinkformer import _lengths  # one helper for the valid lengths of every port


def lambda_init(layer):
    """lambda_init = 0.8 - 0.6 exp(-0.3 (layer - 1)), layers counted from 1."""
    if layer < 1:
        raise ValueError("layers are counted from 1")
    return 0.8 - 0.6 * math.exp(-0.3 * (layer - 1))


def reparam_lambda(lq1, lk1, lq2, lk2, lam_init):
    """lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init (last axis summed)."""
    return torch.exp((lq1 * lk1).sum(-1)) - torch.exp((lq2 * lk2).sum(-1)) + lam_init


def diff_semantics(q, k, v, lam, scale=None, q_len=None, k_len=None, return_attn=True):
    """birkhoff's differential attention: returns (O [B,H,Nq,dv], A [B,H,Nq,Nk])."""
    B, H, Nq, d = q.shape
    Nk, dv = k.shape[2], v.shape[3]
    if d % 2:
        raise ValueError(f"differential attention needs an even head dimension, got {d}")
    if k.shape != (B, H, Nk, d) or v.shape[:3] != (B, H, Nk):
        raise ValueError("q, k, v shapes do not match")
    lam = torch.as_tensor(lam, dtype=q.dtype)
    if lam.shape != (H,):
        raise ValueError(f"lambda must have shape [H] = [{H}]")
    dh = d // 2
    s = dh ** -0.5 if scale is None else scale
    ql, kl = _lengths(q_len, B, Nq, "q_len"), _lengths(k_len, B, Nk, "k_len")
    outs, attns = [], []
    for b in range(B):
        n, m = ql[b], kl[b]
        o_b = q.new_zeros(H, Nq, dv)
        a_b = q.new_zeros(H, Nq, Nk)
        if n > 0 and m > 0:
            qb, kb, vb = q[b, :, :n], k[b, :, :m], v[b, :, :m]
            a1 = torch.softmax(s * qb[..., :dh] @ kb[..., :dh].transpose(-1, -2), dim=-1)
            a2 = torch.softmax(s * qb[..., dh:] @ kb[..., dh:].transpose(-1, -2), dim=-1)
            a = a1 - lam[:, None, None] * a2
            o_b = torch.cat([a @ vb, q.new_zeros(H, Nq - n, dv)], dim=1)
            a_b = torch.nn.functional.pad(a, (0, Nk - m, 0, Nq - n))
        outs.append(o_b)
        attns.append(a_b)
    out = torch.stack(outs)
    return (out, torch.stack(attns)) if return_attn else out


def to_pair_heads(x):
    """[B, H, N, 2 dh] (halves) -> [B, 2H, N, dh] (heads 2h, 2h + 1)."""
    B, H, N, d = x.shape
    return x.reshape(B, H, N, 2, d // 2).transpose(2, 3).reshape(B, 2 * H, N, d // 2)


def diff_reference(q2, k2, v, lam, scale=None):
    """The paper's layout: q2, k2 [B, 2H, N, dh], v [B, H, Nk, dv], lam [H]."""
    B, H2, Nq, dh = q2.shape
    H = H2 // 2
    s = dh ** -0.5 if scale is None else scale
    w = torch.softmax(s * q2 @ k2.transpose(-1, -2), dim=-1)
    w = w.view(B, H, 2, Nq, k2.shape[2])
    a = w[:, :, 0] - torch.as_tensor(lam, dtype=q2.dtype).view(1, H, 1, 1) * w[:, :, 1]
    return a @ v, a


class RMSNorm(torch.nn.Module):
    """x / sqrt(mean(x^2) + eps) over the last axis (no learned gain: the
    paper's per-head sub-layer norm has none in its reference setting)."""

    def __init__(self, eps=1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class DiffAttentionLayer(torch.nn.Module):
    """The paper's multi-head differential attention on x [B, N, E]: H heads,
    q, k of 2 dh channels per head (dh = E / (2H)), v of 2 dh channels,
    lambda re-parameterised per layer (one lambda shared by the heads, as in
    the paper), per-head RMSNorm, times (1 - lambda_init), output projection.
    The attention itself is diff_semantics (with lam = lambda repeated)."""

    def __init__(self, embed, heads, layer, dtype=torch.float64):
        super().__init__()
        if embed % (2 * heads):
            raise ValueError("embed must be a multiple of 2 * heads")
        self.h, self.dh = heads, embed // (2 * heads)
        self.lam_init = lambda_init(layer)
        lin = lambda: torch.nn.Linear(embed, embed, bias=False, dtype=dtype)  # noqa: E731
        self.wq, self.wk, self.wv, self.wo = lin(), lin(), lin(), lin()
        self.lq1, self.lk1, self.lq2, self.lk2 = (
            torch.nn.Parameter(torch.randn(self.dh, dtype=dtype) * 0.1) for _ in range(4))
        self.norm = RMSNorm()

    def lam(self):
        return reparam_lambda(self.lq1, self.lk1, self.lq2, self.lk2, self.lam_init)

    def forward(self, x, lengths=None):
        B, N, E = x.shape
        split = lambda t: t.view(B, N, self.h, 2 * self.dh).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.wq(x)), split(self.wk(x)), split(self.wv(x))
        o = diff_semantics(q, k, v, self.lam().expand(self.h), q_len=lengths, k_len=lengths,
                           return_attn=False)
        o = self.norm(o) * (1.0 - self.lam_init)
        return self.wo(o.transpose(1, 2).reshape(B, N, E))


# ---------------------------------------------------------------------------
def _self_check():
    torch.manual_seed(0)
    dt = torch.float64
    worst = {}

    def note(key, x):
        worst[key] = max(worst.get(key, 0.0), float(x))

    def rnd(*s):
        return torch.randn(*s, dtype=dt)

    # 1. the paper's layout == the semantics
    B, H, Nq, Nk, d, dv = 2, 3, 5, 7, 8, 4
    q, k, v, lam = rnd(B, H, Nq, d), rnd(B, H, Nk, d), rnd(B, H, Nk, dv), rnd(H)
    o1, a1 = diff_semantics(q, k, v, lam)
    o2, a2 = diff_reference(to_pair_heads(q), to_pair_heads(k), v, lam)
    note("reference layout vs semantics", max((o1 - o2).abs().max(), (a1 - a2).abs().max()))
    # 2. lambda = 0 is softmax attention on the first halves; rows of A sum to 1 - lambda
    o0, a0 = diff_semantics(q, k, v, torch.zeros(H, dtype=dt))
    sm = torch.softmax(q[..., :d // 2] @ k[..., :d // 2].transpose(-1, -2) / math.sqrt(d // 2), -1)
    note("lambda = 0 is softmax", max((a0 - sm).abs().max(), (o0 - sm @ v).abs().max()))
    note("rows sum to 1 - lambda", (a1.sum(-1) - (1 - lam).view(1, H, 1)).abs().max())
    # 3. padding == truncation, NaN in the padding
    ql, kl = [3, 5], [7, 2]
    qp, kp, vp = q.clone(), k.clone(), v.clone()
    for bi in range(B):
        qp[bi, :, ql[bi]:] = float("nan")
        kp[bi, :, kl[bi]:] = float("nan")
        vp[bi, :, kl[bi]:] = float("nan")
    o, A = diff_semantics(qp, kp, vp, lam, q_len=ql, k_len=kl)
    for bi in range(B):
        n, m = ql[bi], kl[bi]
        ot, At = diff_semantics(q[bi:bi + 1, :, :n], k[bi:bi + 1, :, :m], v[bi:bi + 1, :, :m], lam)
        note("padding vs truncation", max((o[bi, :, :n] - ot[0]).abs().max(),
                                          (A[bi, :, :n, :m] - At[0]).abs().max()))
        note("padded entries", max(o[bi, :, n:].abs().max() if n < Nq else 0.0,
                                   A[bi, :, :, m:].abs().max() if m < Nk else 0.0))
    # 4. gradcheck through q, k, v, lambda (padded), and the re-parameterisation
    ok = True
    ins = [rnd(2, 2, 4, 4).requires_grad_(True), rnd(2, 2, 5, 4).requires_grad_(True),
           rnd(2, 2, 5, 3).requires_grad_(True), rnd(2).requires_grad_(True)]
    for lens in ((None, None), ([4, 2], [3, 5]), ([0, 3], [5, 5])):
        res = torch.autograd.gradcheck(
            lambda *x: diff_semantics(*x, scale=0.6, q_len=lens[0], k_len=lens[1])[0],
            ins, eps=1e-6, atol=1e-7, rtol=1e-6)
        print(f"gradcheck pad={lens[0] is not None}: {res}")
        ok = ok and res
    layer = DiffAttentionLayer(8, 2, layer=3)
    x = rnd(2, 5, 8).requires_grad_(True)
    res = torch.autograd.gradcheck(lambda t: layer(t, lengths=[5, 3]), (x,), eps=1e-6, atol=1e-7,
                                   rtol=1e-6)
    print(f"gradcheck DiffAttentionLayer: {res}")
    ok = ok and res
    note("lambda_init(1) = 0.2", abs(lambda_init(1) - 0.2))
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
