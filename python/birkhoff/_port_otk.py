"""PyTorch OTK embedding (Mialon et al., ICLR 2021): a reference port and the birkhoff oracle.

Module birkhoff._port_otk (pure PyTorch, no libbirkhoff call; used by
birkhoff.models); bench/peers/otk_torch.py is the same module under its old
name (and runs the self-check).

Two functions, both on sets x [B, n, d] (batch of n elements of dimension d),
references z [q, p, k] (q references of p supports in R^k) and optional
Nystrom anchors W [k, d] (W = None: psi is the identity, k = d):

* otk_reference(): the forward of the reference code claying/OTK, as digested
  in docs/specs (otk.md sections 2-4 and 9), written from that description
  and the code's structure (`ckn/layers.py` CKNLayer with filter size 1 and
  the "exp" kernel, `ckn/ops.py` MatrixInverseSqrt, `otk/layers.py` OTKernel,
  `otk/sinkhorn.py` multihead_attn / sinkhorn / log_sinkhorn). It is the PEER
  BENCHMARK (bench/peers/torch_peer.py --op otk). Autograd gives its backward,
  except through the anchor Gram matrix's inverse square root, which uses the
  code's own backward formula. Step by step:

    r_i = sqrt(clamp(|x_i|^2, 1e-4))                       (CKN patch norm)
    b_il = r_i exp(alpha (<w_l, x_i> / r_i - 1)),  alpha = 1 / sigma^2
    M = MatrixInverseSqrt(exp(alpha (W W^T - 1)), eta)
        forward  V diag(1 / (sqrt(max(e, 0)) + eta)) V^T   (torch.linalg.eigh)
        backward -V (F .* (V^T dM V)) V^T,  F_ab = 1/((s_a + s_b) s_a s_b),
                 s = sqrt(max(e, 0)) + eta                  (the code's formula)
    psi_i = M b_i              (psi = x when W is None)
    K = psi z^T per reference (no scale)         -> [B, q, n, p]
    K = S .* K                 (with a position filter S)
    T = sinkhorn(exp(K / eps)) (scaling domain: u = v = 1, then per iteration
          u = a / (E v) (times the mask), v = 1 / (E^T u), a = p / n_valid;
          T = diag(u) E diag(v): columns sum to 1)
     or log_sinkhorn(K)        (log domain, eps-scaled potentials f = g = 0,
          f <- eps (log a - LSE_j Z) + f, padded f_i = -1e8,
          g <- eps (-LSE_i Z) + g, Z = (K + f + g) / eps; T = exp(Z))
    T = S .* T                 (the filter is applied twice)
    Y = bmm(T as [B, p*q, n], psi) reshaped to [B, p, q*k]   (no 1/sqrt(q))

  Position filters: "gaussian" S_ij = exp(-((i/n - j/p) / sigma_pos)^2) with
  0-based i, j and n the PADDED length; "hard" 1[|i/n - j/p| < sigma_pos]; with
  grid = (gh, gw) the 2-D gaussian filter of the code's 4-D input path
  (elements row-major on a gh x gw grid, supports on an s x s grid, p = s^2,
  1-based positions divided by each axis length; the code returns [B, s, s,
  q*k], here flattened to [B, p, q*k]). The mask (bool [B, n], True = valid)
  gives padded rows zero mass. Two deliberate deviations, both invisible in
  float32: the position filter and the mask's row target p / n_valid are built
  in the inputs' dtype (the code builds them in float32, so a float64 run of
  the code carries ~1e-8 relative errors), and float64 runs are allowed.

* otk_semantics(): birkhoff's documented OTK semantics (include/birkhoff.h,
  "OTK embedding"), in any float dtype with autograd everywhere. It is the TEST
  ORACLE (tests/oracle/oracle.py). Per set b (its n_b valid elements only:
  padded storage never enters any computation, so it may hold NaN) and
  reference h:

    psi: as above (r_i, b_i, M = h(G), G = exp(alpha (W W^T - 1)),
         h(e) = 1 / (sqrt(max(e, 0)) + eta)); the gradient through h(G) is
         isqrt_grad "exact" (Daleckii-Krein of h: F_ab = (h_a - h_b) /
         (e_a - e_b), h'(e_a) on the diagonal, closed form
         -1 / (s_a s_b (sqrt e_a + sqrt e_b)) for positive e, s = sqrt(e) + eta)
         or "reference" (the code's formula above; exact only at eta = 0)
    K_ij = <psi_i, z^h_j>  (times S_ij when pe_double)
    L iterations from g = 0, each a row step then a column step, on K / eps
    with marginals a = 1 / n_b, b = 1 / p:
      domain "log":     f = log a - LSE_j(K/eps + g), g = log b - LSE_i(K/eps + f)
      domain "scaling": E = exp(K/eps - rowmax) once, u = a / (E v),
                        v = b / (E^T u), v = 1 at the start
    P = plan of the last (f, g) / (u, v): columns sum to 1/p exactly
    out[b, j, h, :] = c sum_i P_ij S_ij psi_i,   c = sqrt(p / q) (convention
      "paper") or p ("reference"); layout [B, p, q*k]
    plan[b, h, i, j] = c P_ij S_ij  ([B, q, n, p], padded rows zero)

  PE (S = 1 without): "1d" S_ij = exp(-((u_i - v_j) / sigma_pos)^2) with
  paper positions u_i = i / n_b, v_j = j / p (1-based, valid length) or
  reference positions u_i = i / n, v_j = j / p (0-based, padded length n);
  "2d" as the code's 2-D filter (grid (gh, gw) with gh * gw = n, p = s^2, no
  padding), for both conventions.

Relation (checked by the self-check below and by tests/oracle/test_oracle.py):

    otk_reference(x, z, mask, W, sigma, eta, eps, iters, log_domain,
                  pe="gaussian"|None, sigma_pos, grid)
        == otk_semantics(x, z, lengths, W, sigma, eta, eps, iters,
                         domain="log" if log_domain else "scaling",
                         convention="reference", pe="1d"|"2d"|None,
                         sigma_pos, pe_double=True, grid,
                         isqrt_grad="reference")[0]

forward and gradients w.r.t. x, z, W, to float64 rounding (padded inputs:
the reference with zero padding and a mask, the semantics with lengths).

Run this file directly for a self-check:
    /usr/bin/python3 bench/peers/otk_torch.py
It checks, in float64: the relation above on ten cases (identity and
Nystrom maps, both domains, q = 1..3, 1-D and 2-D PE, eta = 0 and 1e-2,
padding), plan included; torch.autograd.gradcheck of otk_semantics with the
exact isqrt gradient (both domains, both conventions, PE, padding) and of the
isqrt on clamped eigenvalues; the exact isqrt gradient against finite
differences, the code's formula equal to it at eta = 0 (and ~2e-2 away at
eta = 1e-2); padding == truncation with NaN padding, zero padded plan rows,
column sums c/p, log == scaling domain, reference = sqrt(p q) x paper
(no PE), permutation invariance, mean pooling as eps -> infinity, and the
Nystrom map reproducing the kernel on the anchors at eta = 0. It also prints
the distance of the float32 reference port to the float64 semantics.
"""

import math

import torch
import torch.nn.functional as F

from ._port_sinkformer import _lengths  # one helper for the valid lengths of every port

_NORM_EPS = 1e-4  # ckn/utils.py EPS: clamp of the squared patch norm and of the norm


# ---------------------------------------------------------------------------
# Peer: port of the reference code (claying/OTK)
# ---------------------------------------------------------------------------
class _RefMatrixInverseSqrt(torch.autograd.Function):
    """A^-1/2 of a symmetric PSD matrix, the reference code's way.

    Eigenvalues are clamped at 0, square-rooted and shifted by eta; the
    backward is the code's closed formula (not the derivative of the forward
    when eta > 0). Like the code, the factors live on ctx attributes.
    """

    @staticmethod
    def forward(ctx, A, eta):
        e, V = torch.linalg.eigh(A)
        s = e.clamp(min=0).sqrt() + eta
        ctx.s, ctx.V = s, V
        return V.mm(torch.diag(s.reciprocal()).mm(V.t()))

    @staticmethod
    def backward(ctx, grad):
        s, V = ctx.s, ctx.V
        s_col = s.expand_as(V)               # [a, b] -> s_b
        s_row = s.view(-1, 1).expand_as(V)   # [a, b] -> s_a
        f = torch.reciprocal((s_col + s_row) * s_col * s_row)
        return -V.mm((f * (V.t().mm(grad.mm(V)))).mm(V.t())), None


def _ckn_features_reference(x, W, sigma, eta):
    """One CKN layer (filter size 1, "exp" kernel) on x [B, n, d] -> [B, n, k]."""
    B, n, d = x.shape
    k = W.shape[0]
    alpha = 1.0 / sigma ** 2
    x_in = x.transpose(1, 2)                                     # [B, d, n], channels first
    ones = x.new_ones(1, d, 1)
    patch_norm = torch.sqrt(F.conv1d(x_in.pow(2), ones).clamp(min=_NORM_EPS))   # [B, 1, n]
    out = F.conv1d(x_in, W.view(k, d, 1))                        # <w_l, x_i>, [B, k, n]
    out = out / patch_norm.clamp(min=_NORM_EPS)
    out = torch.exp(alpha * (out - 1.0))
    out = patch_norm * out
    lintrans = torch.exp(alpha * (W.mm(W.t()) - 1.0))            # anchor Gram, kappa(W W^T)
    lintrans = _RefMatrixInverseSqrt.apply(lintrans, eta)
    out = torch.bmm(lintrans.expand(B, k, k), out)
    return out.permute(0, 2, 1).contiguous()


def _position_filter_reference(n, p, pe, sigma_pos, grid, dtype, device):
    """OTKernel.get_position_filter: [1, 1, n, p] (None without PE)."""
    if pe is None:
        return None
    if grid is not None:
        gh, gw = grid
        s = int(math.sqrt(p))
        if pe != "gaussian":
            # The code leaves the filter undefined here (UnboundLocalError).
            raise ValueError("2-D position filter: only 'gaussian' exists")
        if s * s != p or gh * gw != n:
            raise ValueError("2-D position filter: need p = s^2 and n = gh * gw")
        a1 = torch.arange(1.0, gh + 1.0, dtype=dtype, device=device).view(-1, 1) / gh
        a2 = torch.arange(1.0, gw + 1.0, dtype=dtype, device=device).view(-1, 1) / gw
        b = torch.arange(1.0, s + 1.0, dtype=dtype, device=device).view(1, -1) / s
        f1 = torch.exp(-((a1 - b) / sigma_pos) ** 2)
        f2 = torch.exp(-((a2 - b) / sigma_pos) ** 2)
        filt = f1.view(gh, 1, s, 1) * f2.view(1, gw, 1, s)
        return filt.reshape(1, 1, n, p)
    a = torch.arange(0.0, n, dtype=dtype, device=device).view(-1, 1) / n
    b = torch.arange(0.0, p, dtype=dtype, device=device).view(1, -1) / p
    if pe == "gaussian":
        filt = torch.exp(-((a - b) / sigma_pos) ** 2)
    elif pe == "hard":
        filt = (torch.abs(a - b) < sigma_pos).to(dtype)
    else:
        raise ValueError("pe must be None, 'gaussian' or 'hard'")
    return filt.view(1, 1, n, p)


def _sinkhorn_reference(E, mask, iters):
    """otk/sinkhorn.py sinkhorn() on E = exp(K / eps) [nb, n, p]."""
    nb, n, p = E.shape
    u = E.new_ones((nb, n))
    v = E.new_ones((nb, p))
    a = float(p / n)
    if mask is not None:
        mask = mask.to(E.dtype)
        a = p / mask.sum(1, keepdim=True)
    for _ in range(iters):
        u = a / torch.bmm(E, v.view(nb, p, 1)).view(nb, n)
        if mask is not None:
            u = u * mask
        v = 1.0 / torch.bmm(u.view(nb, 1, n), E).view(nb, p)
    return u.view(nb, n, 1) * (E * v.view(nb, 1, p))


def _log_sinkhorn_reference(K, mask, eps, iters):
    """otk/sinkhorn.py log_sinkhorn() on K [nb, n, p] (eps-scaled potentials)."""
    nb, n, p = K.shape

    def min_eps(u, v, dim):
        Z = (K + u.view(nb, n, 1) + v.view(nb, 1, p)) / eps
        return -torch.logsumexp(Z, dim=dim)

    u = K.new_zeros((nb, n))
    v = K.new_zeros((nb, p))
    a = torch.ones_like(u).fill_(p / n)
    if mask is not None:
        a = p / mask.to(K.dtype).sum(1, keepdim=True)
    a = torch.log(a)
    for _ in range(iters):
        u = eps * (a + min_eps(u, v, dim=-1)) + u
        if mask is not None:
            u = u.masked_fill(~mask, -1e8)
        v = eps * min_eps(u, v, dim=1) + v
    return torch.exp((K + u.view(nb, n, 1) + v.view(nb, 1, p)) / eps)


def _multihead_attn_reference(psi, z, mask, eps, iters, log_domain, pf):
    """otk/sinkhorn.py multihead_attn(): weights [B, p, q, n]."""
    B, n, _ = psi.shape
    q, p = z.shape[:-1]
    K = torch.tensordot(psi, z, dims=[[-1], [-1]])      # [B, n, q, p]
    K = K.permute(0, 2, 1, 3)                           # [B, q, n, p]
    if pf is not None:
        K = pf * K
    K = K.reshape(-1, n, p)                             # row b*q + h
    if mask is not None:
        mask = mask.repeat_interleave(q, dim=0)
    if log_domain:
        K = _log_sinkhorn_reference(K, mask, eps, iters)
    else:
        K = _sinkhorn_reference(torch.exp(K / eps), mask, iters)
    K = K.reshape(B, q, n, p)
    if pf is not None:
        K = pf * K
    return K.permute(0, 3, 1, 2).contiguous()


def otk_reference(x, z, mask=None, W=None, sigma=0.5, eta=1e-2, eps=0.1, iters=10,
                  log_domain=False, pe=None, sigma_pos=0.1, grid=None, return_plan=False):
    """Reference OTK embedding (CKN Nystrom layer + OTKernel), forward only.

    x [B, n, d]; z [q, p, k]; mask bool [B, n] (True = valid) or None; W [k, d]
    anchors (unit rows expected) or None (psi = x, k = d); pe None, "gaussian"
    or "hard" (1-D), or "gaussian" with grid = (gh, gw) (2-D); "1d" and "2d"
    are accepted for the gaussian ones (the semantics' names). Returns
    Y [B, p, q*k]; with return_plan also the weights [B, p, q, n] (T .* S).
    Padded elements must hold finite values (zeros in the reference's data):
    they enter psi and K, only their mass is zero.
    """
    if x.dim() != 3 or z.dim() != 3:
        raise ValueError("otk_reference: x must be [B, n, d] and z [q, p, k]")
    B, n, d = x.shape
    q, p, k = z.shape
    if W is None:
        if k != d:
            raise ValueError("otk_reference: without anchors z must be [q, p, d]")
        psi = x
    else:
        if tuple(W.shape) != (k, d):
            raise ValueError("otk_reference: W must be [k, d]")
        psi = _ckn_features_reference(x, W, sigma, eta)
    if mask is not None:
        mask = torch.as_tensor(mask, dtype=torch.bool, device=x.device).reshape(B, n)
    if pe == "1d":                  # aliases of the semantics' names
        pe, grid = "gaussian", None
    elif pe == "2d":
        if grid is None:
            raise ValueError("otk_reference: pe '2d' needs grid = (gh, gw)")
        pe = "gaussian"
    elif pe == "none":
        pe = None
    pf = _position_filter_reference(n, p, pe, sigma_pos, grid, x.dtype, x.device)
    attn = _multihead_attn_reference(psi, z, mask, eps, iters, log_domain, pf)
    out = torch.bmm(attn.view(B, p * q, n), psi).reshape(B, p, -1)
    return (out, attn) if return_plan else out


# ---------------------------------------------------------------------------
# Oracle: birkhoff's semantics
# ---------------------------------------------------------------------------
def _isqrt_dk_matrix(e, eta):
    """Divided differences F_ab of h(e) = 1/(sqrt(max(e, 0)) + eta) (h' on ties)."""
    t = torch.sqrt(torch.clamp(e, min=0))
    s = t + eta
    h = 1.0 / s
    ea, eb = e.view(-1, 1), e.view(1, -1)
    sa, sb = s.view(-1, 1), s.view(1, -1)
    ta, tb = t.view(-1, 1), t.view(1, -1)
    both_pos = (ea > 0) & (eb > 0)
    # Both positive: the closed form, stable for close eigenvalues (and h' on
    # the diagonal: -1 / (2 sqrt(e) s^2)).
    closed = -1.0 / (sa * sb * torch.where(both_pos, ta + tb, torch.ones_like(ta)))
    # Otherwise a plain divided difference; h is constant (1/eta) for e <= 0,
    # so two non-positive eigenvalues give 0 (also for equal ones).
    diff = ea - eb
    same = diff == 0
    divided = (h.view(-1, 1) - h.view(1, -1)) / torch.where(same, torch.ones_like(diff), diff)
    divided = torch.where(same, torch.zeros_like(divided), divided)
    return torch.where(both_pos, closed, divided)


class _IsqrtH(torch.autograd.Function):
    """M = h(A), h(e) = 1/(sqrt(max(e, 0)) + eta), A symmetric (birkhoff semantics).

    mode "exact": the Daleckii-Krein adjoint V (F .* (V^T G V)) V^T with the
    divided differences of h; "reference": the code's F_ab = -1/((s_a + s_b)
    s_a s_b), s = sqrt(max(e, 0)) + eta.
    """

    @staticmethod
    def forward(ctx, A, eta, mode):
        e, V = torch.linalg.eigh(A)
        h = 1.0 / (torch.sqrt(torch.clamp(e, min=0)) + eta)
        ctx.save_for_backward(e, V)
        ctx.eta, ctx.mode = eta, mode
        return (V * h) @ V.t()

    @staticmethod
    def backward(ctx, grad):
        e, V = ctx.saved_tensors
        if ctx.mode == "exact":
            f = _isqrt_dk_matrix(e, ctx.eta)
        else:
            s = torch.sqrt(torch.clamp(e, min=0)) + ctx.eta
            sa, sb = s.view(-1, 1), s.view(1, -1)
            f = -1.0 / ((sa + sb) * sa * sb)
        return V @ (f * (V.t() @ grad @ V)) @ V.t(), None, None


def anchor_transform(W, sigma, eta, isqrt_grad="exact"):
    """M = h(exp(alpha (W W^T - 1))) [k, k], alpha = 1/sigma^2 (semantics)."""
    if isqrt_grad not in ("exact", "reference"):
        raise ValueError("isqrt_grad must be 'exact' or 'reference'")
    G = torch.exp((W @ W.t() - 1.0) / sigma ** 2)
    return _IsqrtH.apply(G, float(eta), isqrt_grad)


def otk_features(x, W, sigma, M):
    """psi = M b(x) for x [..., d] (semantics; W None: psi = x)."""
    if W is None:
        return x
    r = torch.sqrt(torch.clamp((x * x).sum(-1, keepdim=True), min=_NORM_EPS))
    b = r * torch.exp((((x / r) @ W.t()) - 1.0) / sigma ** 2)
    return b @ M.t()


def _positions(count, total, one_based, dtype, device):
    i = torch.arange(count, dtype=torch.float64, device=device)
    return ((i + 1.0) if one_based else i).div(total).to(dtype)


def _pe_filter(pe, convention, n_b, n, p, sigma_pos, grid, dtype, device):
    """S [n_b, p] for one set (None without PE)."""
    if pe is None:
        return None
    if pe == "1d":
        if convention == "paper":
            u = _positions(n_b, n_b, True, dtype, device)
            v = _positions(p, p, True, dtype, device)
        else:
            u = _positions(n_b, n, False, dtype, device)
            v = _positions(p, p, False, dtype, device)
        return torch.exp(-((u.view(-1, 1) - v.view(1, -1)) / sigma_pos) ** 2)
    gh, gw = grid
    s = math.isqrt(p)
    idx = torch.arange(n_b, device=device)
    ur = _positions(gh, gh, True, dtype, device)[idx // gw]
    uc = _positions(gw, gw, True, dtype, device)[idx % gw]
    jdx = torch.arange(p, device=device)
    vr = _positions(s, s, True, dtype, device)[jdx // s]
    vc = _positions(s, s, True, dtype, device)[jdx % s]
    return (torch.exp(-((ur.view(-1, 1) - vr.view(1, -1)) / sigma_pos) ** 2)
            * torch.exp(-((uc.view(-1, 1) - vc.view(1, -1)) / sigma_pos) ** 2))


def _plan_log(L, n_b, p, iters):
    """L iterations (row, column) in the log domain on L = K/eps [q, n_b, p]."""
    la = -math.log(n_b)
    lb = -math.log(p)
    g = torch.zeros_like(L[..., 0, :])
    for _ in range(iters):
        f = la - torch.logsumexp(L + g.unsqueeze(-2), dim=-1)
        g = lb - torch.logsumexp(L + f.unsqueeze(-1), dim=-2)
    return torch.exp(L + f.unsqueeze(-1) + g.unsqueeze(-2))


def _plan_scaling(L, n_b, p, iters):
    """The same iterations with scalings u, v on E = exp(L - rowmax L)."""
    E = torch.exp(L - L.detach().amax(dim=-1, keepdim=True))
    a, b = 1.0 / n_b, 1.0 / p
    v = torch.ones_like(L[..., 0, :])
    for _ in range(iters):
        u = a / (E @ v.unsqueeze(-1)).squeeze(-1)
        v = b / (E.transpose(-1, -2) @ u.unsqueeze(-1)).squeeze(-1)
    return u.unsqueeze(-1) * E * v.unsqueeze(-2)


def otk_semantics(x, z, lengths=None, W=None, sigma=0.5, eta=1e-2, eps=0.5, iters=20,
                  domain="log", convention="paper", pe=None, sigma_pos=0.1,
                  pe_double=False, grid=None, isqrt_grad="exact"):
    """birkhoff OTK embedding (see the module docstring for the definition).

    x [B, n, d]; z [q, p, k]; lengths: per-set valid lengths in [1, n] (None =
    n); W [k, d] or None (identity map, k = d); pe None/"none", "1d" or "2d"
    (grid = (gh, gw)). iters counts Sinkhorn half-steps as birkhoff does (even:
    iters / 2 row-then-column iterations; otk_reference's iters counts the
    iterations). Returns (out [B, p, q*k], plan [B, q, n, p] = c P .* S,
    padded rows zero); gradients flow to x, z and W.
    """
    if x.dim() != 3 or z.dim() != 3:
        raise ValueError("x must be [B, n, d] and z [q, p, k]")
    B, n, d = x.shape
    q, p, k = z.shape
    if min(B, n, d, q, p, k) < 1:
        raise ValueError("all sizes must be >= 1")
    if domain not in ("log", "scaling"):
        raise ValueError("domain must be 'log' or 'scaling'")
    if convention not in ("paper", "reference"):
        raise ValueError("convention must be 'paper' or 'reference'")
    if pe == "none":
        pe = None
    if pe not in (None, "1d", "2d"):
        raise ValueError("pe must be None, 'none', '1d' or '2d'")
    if not (eps > 0) or iters < 2 or iters % 2:
        raise ValueError("need eps > 0 and iters (half-steps, as birkhoff counts them) even and >= 2")
    if pe is not None and not (sigma_pos > 0):
        raise ValueError("need sigma_pos > 0 with PE")
    lens = _lengths(lengths, B, n, "lengths")
    if min(lens) < 1:
        raise ValueError("empty sets are refused (lengths must be in [1, n])")
    if pe == "2d":
        if grid is None or len(grid) != 2 or grid[0] * grid[1] != n:
            raise ValueError("pe '2d' needs grid = (gh, gw) with gh * gw = n")
        if math.isqrt(p) ** 2 != p:
            raise ValueError("pe '2d' needs p = s^2")
        if any(m != n for m in lens):
            raise ValueError("pe '2d' does not allow padding")
    if W is None:
        if k != d:
            raise ValueError("without anchors k must equal d")
        M = None
    else:
        if tuple(W.shape) != (k, d):
            raise ValueError("W must be [k, d]")
        if not (sigma > 0) or eta < 0:
            raise ValueError("need sigma > 0 and eta >= 0")
        M = anchor_transform(W, sigma, eta, isqrt_grad)
    c = math.sqrt(p / q) if convention == "paper" else float(p)
    outs, plans = [], []
    for bi in range(B):
        n_b = lens[bi]
        xb = x[bi, :n_b]                                  # padded rows never read
        psi = otk_features(xb, W, sigma, M)               # [n_b, k]
        K = torch.einsum("ik,hjk->hij", psi, z)           # [q, n_b, p]
        S = _pe_filter(pe, convention, n_b, n, p, sigma_pos, grid, x.dtype, x.device)
        if S is not None and pe_double:
            K = K * S
        L = K / eps
        P = (_plan_log if domain == "log" else _plan_scaling)(L, n_b, p, iters // 2)
        Pw = c * (P if S is None else P * S)              # [q, n_b, p]
        o = torch.einsum("hij,ik->jhk", Pw, psi).reshape(p, q * k)
        outs.append(o)
        plans.append(torch.nn.functional.pad(Pw, (0, 0, 0, n - n_b)))
    return torch.stack(outs), torch.stack(plans)


# ---------------------------------------------------------------------------
# Self-check: /usr/bin/python3 bench/peers/otk_torch.py
# ---------------------------------------------------------------------------
def _unit_rows(t):
    return t / t.norm(dim=-1, keepdim=True)


def _inputs(B, n, d, k, q, p, anchors, gen, dtype=torch.float64):
    """Unit-norm-ish x (norms in [0.5, 1.2]), unit references and anchors."""
    x = _unit_rows(torch.randn(B, n, d, generator=gen, dtype=dtype))
    x = x * (0.5 + 0.7 * torch.rand(B, n, 1, generator=gen, dtype=dtype))
    kk = k if anchors else d
    z = _unit_rows(torch.randn(q, p, kk, generator=gen, dtype=dtype))
    W = _unit_rows(torch.randn(k, d, generator=gen, dtype=dtype)) if anchors else None
    return x, z, W


def _rel(a, b):
    a, b = a.detach(), b.detach()
    den = float(b.abs().max())
    return float((a - b).abs().max()) / (den if den > 0 else 1.0)


def _self_check():
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    worst = {}     # key -> (worst value, tolerance)
    ok = True

    def note(key, val, tol=1e-9):
        worst[key] = (max(worst.get(key, (0.0, tol))[0], float(val)), tol)

    # 1. Reference port == semantics (reference convention, PE twice, code's
    #    isqrt gradient), forward, plan and gradients w.r.t. x, z, W; unpadded
    #    and padded (the reference with zero padding and a mask).
    # (B, n, d, k, q, p, anchors, sigma, eta, eps, iters, log, pe, grid, pad)
    rel_cases = [
        (2, 7, 5, 4, 1, 3, True, 0.5, 1e-2, 0.1, 10, False, None, None, False),
        (2, 7, 5, 4, 3, 3, True, 0.5, 1e-2, 0.1, 10, True, None, None, False),
        (1, 9, 6, 6, 3, 4, False, 0.5, 1e-2, 0.5, 3, False, "gaussian", None, False),
        (2, 8, 4, 6, 2, 5, True, 1.0, 0.0, 1.0, 1, True, "gaussian", None, False),
        (2, 12, 4, 5, 3, 4, True, 0.7, 1e-2, 0.5, 10, False, "gaussian", (3, 4), False),
        (1, 16, 6, 6, 1, 9, False, 0.5, 1e-2, 0.1, 10, True, "gaussian", (4, 4), False),
        (3, 8, 5, 4, 3, 3, True, 0.5, 1e-2, 0.1, 10, False, None, None, True),
        (3, 8, 5, 4, 2, 3, True, 0.6, 1e-2, 0.5, 10, True, "gaussian", None, True),
        (3, 6, 4, 4, 3, 4, False, 0.5, 1e-2, 1.0, 3, False, "gaussian", None, True),
        (2, 10, 6, 5, 1, 6, True, 1.0, 0.0, 0.1, 10, True, None, None, True),
    ]
    for (B, n, d, k, q, p, anch, sg, et, ep, L, logd, pe, grid, pad) in rel_cases:
        x, z, W = _inputs(B, n, d, k, q, p, anch, gen)
        lens = None
        mask = None
        xr, xs = x.clone(), x.clone()
        if pad:
            lens = torch.randint(1, n + 1, (B,), generator=gen).tolist()
            lens[0] = max(1, n - 2)
            mask = torch.zeros(B, n, dtype=torch.bool)
            for bi, m in enumerate(lens):
                mask[bi, :m] = True
                xr[bi, m:] = 0.0                 # the reference's data: zero padding
                xs[bi, m:] = float("nan")        # the semantics never reads it
        dout = torch.randn(B, p, q * z.shape[2], generator=gen, dtype=torch.float64)
        leaves_r = [t.clone().requires_grad_(True) for t in (xr, z) + ((W,) if anch else ())]
        leaves_s = [t.clone().requires_grad_(True) for t in (xs, z) + ((W,) if anch else ())]
        o1, a1 = otk_reference(leaves_r[0], leaves_r[1], mask=mask,
                               W=leaves_r[2] if anch else None, sigma=sg, eta=et, eps=ep,
                               iters=L, log_domain=logd, pe=pe, sigma_pos=0.3, grid=grid,
                               return_plan=True)
        g1 = torch.autograd.grad((o1 * dout).sum(), leaves_r)
        o2, pl2 = otk_semantics(leaves_s[0], leaves_s[1], lengths=lens,
                                W=leaves_s[2] if anch else None, sigma=sg, eta=et, eps=ep,
                                iters=2 * L, domain="log" if logd else "scaling",
                                convention="reference",
                                pe=None if pe is None else ("2d" if grid else "1d"),
                                sigma_pos=0.3, pe_double=True, grid=grid,
                                isqrt_grad="reference")
        g2 = torch.autograd.grad((o2 * dout).sum(), leaves_s)
        note("reference vs semantics: out", _rel(o1, o2))
        note("reference vs semantics: plan", _rel(a1.permute(0, 2, 3, 1), pl2))
        for name, a, b in zip(("dx", "dz", "dW"), g1, g2):
            note("reference vs semantics: " + name, _rel(a, b))
        # For information: the reference in float32 (its own numerics).
        o3 = otk_reference(xr.float(), z.float(), mask=mask,
                           W=W.float() if anch else None, sigma=sg, eta=et, eps=ep,
                           iters=L, log_domain=logd, pe=pe, sigma_pos=0.3, grid=grid)
        print(f"reference float32 vs semantics float64 (out), B{B} n{n} q{q} p{p} "
              f"{'log' if logd else 'scaling'}{' pe' if pe else ''}{' pad' if pad else ''}: "
              f"{_rel(o3.double(), o2):.2e}")

    # 2. gradcheck of the semantics (float64, exact isqrt gradient).
    gc_cases = [
        dict(domain="log", convention="paper", pe=None, W=True, eta=1e-2, lens=None),
        dict(domain="scaling", convention="reference", pe="1d", pe_double=True, W=True,
             eta=0.0, lens=[4, 2]),
        dict(domain="log", convention="paper", pe="1d", W=True, eta=1e-2, lens=[3, 4]),
        dict(domain="scaling", convention="paper", pe="2d", grid=(2, 2), W=True, eta=1e-2,
             lens=None),
        dict(domain="log", convention="reference", pe=None, W=False, lens=[1, 3]),
    ]
    for cfg in gc_cases:
        cfg = dict(cfg)
        useW = cfg.pop("W")
        lens = cfg.pop("lens")
        eta = cfg.pop("eta", 1e-2)
        B, n, d, k, q, p = 2, 4, 3, 3, 2, 4
        x, z, W = _inputs(B, n, d, k, q, p, useW, gen)
        if lens is not None:
            for bi, m in enumerate(lens):
                x[bi, m:] = 30.0                        # finite junk (never read)
        ins = [t.clone().requires_grad_(True) for t in (x, z) + ((W,) if useW else ())]

        def fn(*t, cfg=cfg, lens=lens, eta=eta, useW=useW):
            return otk_semantics(t[0], t[1], lengths=lens, W=t[2] if useW else None,
                                 sigma=0.7, eta=eta, eps=0.3, iters=6, sigma_pos=0.5,
                                 isqrt_grad="exact", **cfg)

        res = torch.autograd.gradcheck(lambda *t: fn(*t)[0], ins, eps=1e-6, atol=1e-7,
                                       rtol=1e-6)
        res2 = torch.autograd.gradcheck(lambda *t: fn(*t)[1], ins, eps=1e-6, atol=1e-7,
                                        rtol=1e-6)
        print(f"gradcheck {cfg} W={useW} eta={eta} lens={lens}: {res and res2}")
        ok = ok and res and res2

    # 3. The isqrt backward: exact == finite differences; the code's formula
    #    equals it at eta = 0 and differs at eta = 1e-2.
    k, d = 6, 4
    W = _unit_rows(torch.randn(k, d, generator=gen, dtype=torch.float64))
    G = torch.randn(k, k, generator=gen, dtype=torch.float64)
    for eta in (0.0, 1e-2):
        grads = {}
        for mode in ("exact", "reference"):
            Wl = W.clone().requires_grad_(True)
            grads[mode] = torch.autograd.grad((anchor_transform(Wl, 0.8, eta, mode) * G).sum(),
                                              Wl)[0]
        # central finite differences of the forward
        fd = torch.zeros_like(W)
        h = 1e-6
        for i in range(k):
            for j in range(d):
                Wp, Wm = W.clone(), W.clone()
                Wp[i, j] += h
                Wm[i, j] -= h
                fd[i, j] = ((anchor_transform(Wp, 0.8, eta) * G).sum()
                            - (anchor_transform(Wm, 0.8, eta) * G).sum()) / (2 * h)
        note("isqrt exact vs finite differences", _rel(grads["exact"], fd), 1e-6)
        if eta == 0.0:
            note("isqrt reference == exact at eta = 0", _rel(grads["reference"], grads["exact"]))
        else:
            print(f"isqrt: the code's gradient vs the exact one at eta = 1e-2: "
                  f"{_rel(grads['reference'], grads['exact']):.2e} (expected > 0)")

    # The clamped branch (e <= 0, where h = 1/eta is flat): gradcheck of h(A)
    # on a symmetric A with eigenvalues (-0.5, -0.2, 0.3, 1, 2).
    Q, _ = torch.linalg.qr(torch.randn(5, 5, generator=gen, dtype=torch.float64))
    A0 = (Q * torch.tensor([-0.5, -0.2, 0.3, 1.0, 2.0], dtype=torch.float64)) @ Q.t()
    A0 = A0.requires_grad_(True)
    res = torch.autograd.gradcheck(lambda A: _IsqrtH.apply((A + A.t()) / 2, 0.1, "exact"),
                                   (A0,), eps=1e-6, atol=1e-7, rtol=1e-6)
    print(f"gradcheck isqrt with clamped eigenvalues: {res}")
    ok = ok and res

    # 4. Properties of the semantics (float64).
    B, n, d, k, q, p = 3, 9, 5, 6, 3, 4
    x, z, W = _inputs(B, n, d, k, q, p, True, gen)
    lens = [9, 4, 1]
    xn = x.clone()
    for bi, m in enumerate(lens):
        xn[bi, m:] = float("nan")
    for dom in ("log", "scaling"):
        for conv in ("paper", "reference"):
            for pe, dbl in ((None, False), ("1d", False), ("1d", True)):
                kw = dict(W=W, sigma=0.6, eta=1e-2, eps=0.2, iters=10, domain=dom,
                          convention=conv, pe=pe, sigma_pos=0.4, pe_double=dbl)
                o, pl = otk_semantics(xn, z, lengths=lens, **kw)
                note("padding: finite output", 0.0 if torch.isfinite(o).all() else 1.0)
                for bi, m in enumerate(lens):
                    note("padded plan rows are zero", pl[bi, :, m:].abs().max() if m < n else 0)
                    if conv == "reference" and pe is not None:
                        continue   # positions over the padded n: truncation differs
                    ot, pt = otk_semantics(x[bi:bi + 1, :m], z, **kw)
                    note("padding vs truncation", max(_rel(o[bi:bi + 1], ot),
                                                      _rel(pl[bi:bi + 1, :, :m], pt)))
                if pe is None:
                    c = math.sqrt(p / q) if conv == "paper" else p
                    # columns of P sum to 1/p exactly after the column step
                    note("column sums of the plan", (pl.sum(-2) - c / p).abs().max())
    # log == scaling domain; paper and reference scale; permutation invariance
    kw = dict(W=W, sigma=0.6, eta=1e-2, eps=0.2, iters=14)
    o_log, _ = otk_semantics(x, z, domain="log", **kw)
    o_sc, _ = otk_semantics(x, z, domain="scaling", **kw)
    note("log vs scaling domain", _rel(o_sc, o_log))
    o_ref, _ = otk_semantics(x, z, convention="reference", **kw)
    note("reference = sqrt(p q) x paper", _rel(o_ref, math.sqrt(p * q) * o_log))
    perm = torch.randperm(n, generator=gen)
    o_perm, _ = otk_semantics(x[:, perm], z, **kw)
    note("permutation invariance (no PE)", _rel(o_perm, o_log))
    # eps -> infinity: every bucket is the mean of psi (times c / 1)
    o_inf, _ = otk_semantics(x, z, W=W, sigma=0.6, eta=1e-2, eps=1e9, iters=4,
                             convention="reference")
    M = anchor_transform(W, 0.6, 1e-2)
    mean_psi = otk_features(x, W, 0.6, M).mean(1)                  # [B, k]
    note("eps -> inf: mean pooling",
         _rel(o_inf, mean_psi.repeat(1, q).unsqueeze(1).expand(B, p, q * k)), 1e-7)
    # Nystrom with eta = 0 reproduces the kernel on the anchors
    M0 = anchor_transform(W, 0.6, 0.0)
    psi_w = otk_features(W, W, 0.6, M0)
    kap = torch.exp((W @ W.t() - 1.0) / 0.36)
    note("Nystrom eta=0: <psi(w), psi(w')> = kappa", _rel(psi_w @ psi_w.t(), kap))

    for key, (val, tol) in worst.items():
        good = val <= tol
        ok = ok and good
        print(f"{'ok  ' if good else 'FAIL'} {key:44s} {val:.3e} (tol {tol:.0e})")
    return ok


def main():
    """The self-check; returns the exit status."""
    good = _self_check()
    print("self-check", "ok" if good else "FAIL")
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
