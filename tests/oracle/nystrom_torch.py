"""PyTorch Nystrom attention (Nystromformer): a port of the reference and the birkhoff oracle.

Pure PyTorch, no libbirkhoff call. Nystromformer (Xiong et al., "Nystromformer:
A Nystrom-Based Algorithm for Approximating Self-Attention", AAAI 2021)
points to its code, mlpen/Nystromformer, whose NystromAttention module is
ported here from reading it (not copied):

* nystrom_reference(Q, K, V, mask, num_landmarks, n_iter, init_option): the
  reference's forward. Q, K, V [B, H, N, d]; mask [B, N] (1 valid, 0 padded).
  Q and K are multiplied by the mask and by d^-1/4 each; the landmarks are
  the means of l equal segments of the N (padded) rows (N must be a
  multiple of l: the reference's reshape); kernel_1 = softmax(Q Kl^T),
  kernel_2 = softmax(Ql Kl^T), kernel_3 = softmax(Ql K^T - 1e9 (1 - mask));
  X = (kernel_1 iterative_inv(kernel_2)) (kernel_3 V). When l == N the
  reference computes plain softmax attention instead (kept here as it is).
  Its optional depthwise convolution of V (conv_kernel_size) is not ported:
  it is a residual path outside the attention operator.

* iterative_inv(mat, n_iter, init_option): the reference's Moore-Penrose
  iteration (Razavi et al. 2014) from V_0 = K^T / c:
      V <- 1/4 V (13 I - K V (15 I - K V (7 I - K V)))
  with c the largest column sum of K: init_option "original" takes ONE max
  over the whole tensor (all batch entries and heads: a sample's result then
  depends on its batch), "per_problem" the max per (batch, head) (the
  reference's other option, its 1/||K||_1). birkhoff takes it per problem.

* nystrom_semantics(q, k, v, q_len, k_len, landmarks, iters, scale,
  init_option): birkhoff's documented operator (include/birkhoff/nystrom.h),
  any float dtype, autograd everywhere: the TEST ORACLE. Per (batch, head)
  problem on the valid prefixes (n = q_len[b] queries, m = k_len[b] keys),
  r = min(l, n, m) landmarks, segment j = rows [floor(j n / r),
  floor((j + 1) n / r)); the three kernels and iterative_inv on that
  problem alone; padded rows of O and of the attention are zero. Returns (O
  [B, H, Nq, dv], attention [B, H, Nq, Nk] = F Z B). init_option="original"
  reproduces the reference's batch-wide start on these semantics (the
  largest column sum over every problem of the batch).

With no padding, Nq = Nk = N a multiple of l and scale d^-1/2,
nystrom_semantics == nystrom_reference for either init_option (checked by
tests/oracle/test_nystrom.py).
"""
import math

import torch


def iterative_inv(mat, n_iter=6, init_option="original", c=None):
    """The reference's iterative pseudo-inverse of mat [..., r, r]; c (a
    tensor) overrides the start's divisor (nystrom_semantics' batch-wide
    start over problems of different sizes)."""
    eye = torch.eye(mat.size(-1), dtype=mat.dtype, device=mat.device)
    K = mat
    colsum = torch.sum(K, dim=-2)                     # [..., r]
    if c is not None:
        V = 1 / c * K.transpose(-1, -2)
    elif init_option == "original":
        c = torch.max(colsum)                          # one max over everything
        V = 1 / c * K.transpose(-1, -2)
    elif init_option == "per_problem":
        c = torch.max(colsum, dim=-1).values[..., None, None]
        V = 1 / c * K.transpose(-1, -2)
    else:
        raise ValueError("init_option: original or per_problem, not %r" % (init_option,))
    for _ in range(n_iter):
        KV = torch.matmul(K, V)
        V = torch.matmul(0.25 * V, 13 * eye - torch.matmul(KV, 15 * eye - torch.matmul(KV, 7 * eye - KV)))
    return V


def nystrom_reference(Q, K, V, mask, num_landmarks, n_iter=6, init_option="original"):
    """The reference's NystromAttention.forward (no convolution)."""
    B, H, N, d = Q.shape
    mk = mask.to(Q.dtype)
    Q = Q * mk[:, None, :, None] / math.sqrt(math.sqrt(d))
    K = K * mk[:, None, :, None] / math.sqrt(math.sqrt(d))
    if num_landmarks == N:
        attn = torch.softmax(torch.matmul(Q, K.transpose(-1, -2)) - 1e9 * (1 - mk[:, None, None, :]), dim=-1)
        return torch.matmul(attn, V)
    if N % num_landmarks:
        raise ValueError("the reference needs N a multiple of num_landmarks")
    seg = N // num_landmarks
    Ql = Q.reshape(B, H, num_landmarks, seg, d).mean(dim=-2)
    Kl = K.reshape(B, H, num_landmarks, seg, d).mean(dim=-2)
    k1 = torch.softmax(torch.matmul(Q, Kl.transpose(-1, -2)), dim=-1)
    k2 = torch.softmax(torch.matmul(Ql, Kl.transpose(-1, -2)), dim=-1)
    k3 = torch.softmax(torch.matmul(Ql, K.transpose(-1, -2)) - 1e9 * (1 - mk[:, None, None, :]), dim=-1)
    return torch.matmul(torch.matmul(k1, iterative_inv(k2, n_iter, init_option)), torch.matmul(k3, V))


def segment_means(X, r):
    """[r, d]: the means of r contiguous segments of the rows of X [n, d],
    segment j = rows [floor(j n / r), floor((j + 1) n / r))."""
    n = X.shape[0]
    cuts = [(j * n) // r for j in range(r + 1)]
    return torch.stack([X[cuts[j]:cuts[j + 1]].mean(dim=0) for j in range(r)])


def nystrom_semantics(q, k, v, q_len=None, k_len=None, landmarks=64, iters=6, scale=None,
                      init_option="per_problem"):
    """birkhoff's Nystrom attention: (O, attention). init_option
    "per_problem" (birkhoff's) solves each problem alone; "original" starts
    every problem's pseudo-inverse from the largest column sum over ALL the
    problems of the batch, as the reference's default does."""
    B, H, Nq, d = q.shape
    Nk, dv = k.shape[2], v.shape[3]
    s = scale if scale else d ** -0.5
    kern = {}
    for b in range(B):
        n = int(q_len[b]) if q_len is not None else Nq
        m = int(k_len[b]) if k_len is not None else Nk
        for h in range(H):
            if n > 0 and m > 0:
                r = min(landmarks, n, m)
                Q, K = q[b, h, :n], k[b, h, :m]
                Ql, Kl = segment_means(Q, r), segment_means(K, r)
                kern[b, h] = (torch.softmax(s * Q @ Kl.T, dim=-1), torch.softmax(s * Ql @ Kl.T, dim=-1),
                              torch.softmax(s * Ql @ K.T, dim=-1), n, m)
    c = None
    if init_option == "original" and kern:
        c = torch.max(torch.stack([torch.max(torch.sum(A, dim=-2)) for (_, A, _, _, _) in kern.values()]))
    elif init_option != "per_problem":
        raise ValueError("init_option: original or per_problem, not %r" % (init_option,))
    outs, atts = [], []
    for b in range(B):
        ob, ab = [], []
        for h in range(H):
            o, a = q.new_zeros(Nq, dv), q.new_zeros(Nq, Nk)
            if (b, h) in kern:
                F, A, Bk, n, m = kern[b, h]
                Z = iterative_inv(A, iters, "per_problem", c)
                o = torch.cat([F @ (Z @ (Bk @ v[b, h, :m])), q.new_zeros(Nq - n, dv)])
                att = F @ Z @ Bk
                a = torch.cat([torch.cat([att, q.new_zeros(n, Nk - m)], dim=1), q.new_zeros(Nq - n, Nk)])
            ob.append(o)
            ab.append(a)
        outs.append(torch.stack(ob))
        atts.append(torch.stack(ab))
    return torch.stack(outs), torch.stack(atts)
