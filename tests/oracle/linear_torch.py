"""PyTorch ports of the reference implementations of kernelised attention,
written for birkhoff's oracle from reading the references (not copied):

* fast-transformers (idiap), fast_transformers/attention/linear_attention.py,
  LinearAttention with its elu feature map: the Linear Transformer
  (Katharopoulos et al. 2020), layout [N, L, H, D], padded keys removed by
  zeroing their features (K * key_lengths mask), eps = 1e-6 added to every
  denominator.

* performer-pytorch (lucidrains), performer_pytorch.py: softmax_kernel (the
  FAVOR+ positive features: data scaled by d^-1/4, ratio = m^-1/2, the
  max-subtraction stabilisers detached, a query's over its features, the
  keys' over all keys and features of a (batch, head), eps = 1e-4 added
  after the subtraction), linear_attention (the non-causal product) and
  gaussian_orthogonal_random_matrix's conventions. The projection is NOT
  drawn here: the caller passes birkhoff's (bk_performer_projection), so both
  sides use the same W. performer-pytorch masks padded keys by zeroing v only
  (their features stay in the normaliser and the stabiliser); birkhoff drops
  padded keys from both sums, so the oracle runs the port on each batch
  entry's valid rows.
"""
import torch
import torch.nn.functional as F


# ---- fast-transformers: LinearAttention (non-causal) ----------------------

def elu_feature_map(x):
    return F.elu(x) + 1


def fast_transformers_linear(queries, keys, values, key_lengths=None, eps=1e-6):
    """queries [N, L, H, D], keys [N, S, H, D], values [N, S, H, M];
    key_lengths [N] (None: all valid) -> [N, L, H, M]"""
    Q = elu_feature_map(queries)
    K = elu_feature_map(keys)
    if key_lengths is not None:
        S = keys.shape[1]
        mask = (torch.arange(S)[None, :] < key_lengths[:, None]).to(K.dtype)
        K = K * mask[:, :, None, None]
    KV = torch.einsum("nshd,nshm->nhmd", K, values)
    Z = 1 / (torch.einsum("nlhd,nhd->nlh", Q, K.sum(dim=1)) + eps)
    return torch.einsum("nlhd,nhmd,nlh->nlhm", Q, KV, Z)


# ---- performer-pytorch: softmax_kernel + linear_attention -----------------

def softmax_kernel(data, projection_matrix, is_query, normalize_data=True, eps=1e-4):
    """data [b, h, n, d], projection_matrix [m, d] -> [b, h, n, m]"""
    b, h = data.shape[:2]
    data_normalizer = (data.shape[-1] ** -0.25) if normalize_data else 1.0
    ratio = projection_matrix.shape[0] ** -0.5
    projection = projection_matrix.expand(b, h, *projection_matrix.shape).type_as(data)
    data_dash = torch.einsum("...id,...jd->...ij", data_normalizer * data, projection)
    diag_data = (data ** 2).sum(dim=-1)
    diag_data = (diag_data / 2.0) * (data_normalizer ** 2)
    diag_data = diag_data.unsqueeze(-1)
    if is_query:
        stab = torch.amax(data_dash, dim=-1, keepdim=True).detach()
    else:
        stab = torch.amax(data_dash, dim=(-1, -2), keepdim=True).detach()
    return ratio * (torch.exp(data_dash - diag_data - stab) + eps)


def performer_linear_attention(q, k, v):
    """the non-causal product of performer-pytorch on features q, k"""
    k_cumsum = k.sum(dim=-2)
    D_inv = 1.0 / torch.einsum("...nd,...d->...n", q, k_cumsum.type_as(q))
    context = torch.einsum("...nd,...ne->...de", k, v)
    return torch.einsum("...de,...nd,...n->...ne", context, q, D_inv)


def favor_attention(q, k, v, projection_matrix, eps=1e-4, scale=None):
    """FAVOR+ softmax attention estimate, q [b, h, n, d]. scale (None: the
    reference's 1/sqrt(d)) enters as a rescaling of the data that makes the
    reference's d^-1/4 normaliser sqrt(scale)."""
    if scale is not None:
        d = q.shape[-1]
        f = (scale * d ** 0.5) ** 0.5
        q, k = q * f, k * f
    qf = softmax_kernel(q, projection_matrix, is_query=True, eps=eps)
    kf = softmax_kernel(k, projection_matrix, is_query=False, eps=eps)
    return performer_linear_attention(qf, kf, v)
