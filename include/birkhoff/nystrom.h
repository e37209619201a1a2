/* birkhoff/nystrom.h -- Nystrom attention (Nystromformer).
 * Part of the public API; include <birkhoff.h> (all of it) or this file. The
 * conventions every function follows (layouts, padding, accuracy, threads and
 * determinism, workspace and tape) are at the top of birkhoff/core.h.
 *
 * The operator is registered as "nystrom" and run through the registry's
 * generic calls (birkhoff/ops.h): bk_op_find("nystrom"), bk_op_config_default
 * and bk_op_config_set (keys "landmarks", "iters", "scale") or the struct
 * below filled directly, bk_op_workspace_size, bk_op_tape_size, bk_op_forward
 * (optional attention output) and bk_op_backward. It has no typed entry
 * points of its own. */
#ifndef BIRKHOFF_NYSTROM_H
#define BIRKHOFF_NYSTROM_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Nystrom attention (Nystromformer, Xiong et al., AAAI 2021;               */
/* docs/ALGORITHMS.md "Nystrom attention")                                  */
/* ------------------------------------------------------------------------ */
/* q [B,H,Nq,d], k [B,H,Nk,d], v [B,H,Nk,dv] (Nq != Nk allowed: cross-
 * attention). Per problem (batch b, head h) on its valid rows, n = Lq
 * queries Q and m = Lk keys K, V:
 *
 *   Landmarks. r = min(l, n, m) landmarks (l = landmarks). The valid queries
 *   are cut into r contiguous segments, segment j holding the rows
 *   [floor(j n / r), floor((j + 1) n / r)), and the query landmark Ql_j is
 *   the mean of its rows; the key landmarks Kl_j likewise over the m valid
 *   keys. When n and m are multiples of l this is the reference's reshape
 *   into l equal segments; otherwise the segments differ in length by at
 *   most one row. With fewer valid rows than l (n < l or m < l) the
 *   problem uses r = min(n, m) landmarks (each a segment of at least one
 *   row), so no landmark is empty and none is repeated.
 *
 *   Kernels (s = scale, or 1/sqrt(d) when scale is 0):
 *     F = softmax_rows(s Q Kl^T)     n x r
 *     A = softmax_rows(s Ql Kl^T)    r x r
 *     B = softmax_rows(s Ql K^T)     r x m   (over the valid keys)
 *   Pseudo-inverse of A by `iters` steps of the iteration of Razavi et al.
 *   (2014), as the reference runs it:
 *     Z_0 = A^T / c,  c = max_j sum_i A_ij   (A's largest column sum),
 *     Z_{t+1} = 1/4 Z_t (13 I - A Z_t (15 I - A Z_t (7 I - A Z_t))).
 *   Output:  O = F Z_T (B V)                 n x dv
 *   The dense attention F Z_T B (n x m) is an optional output for small
 *   problems (bk_op_forward's attn).
 *
 * Where this differs from the reference (mlpen/Nystromformer's
 * NystromAttention):
 *   - Z_0's c is taken PER PROBLEM (the reference's "original" option takes
 *     the largest column sum over the whole batch and all heads, so a
 *     sample's result would depend on the other samples of its batch, which
 *     this library never does). The reference's other option
 *     (inv_init_coeff_option) is this one.
 *   - Padding: the reference zeroes padded q and k rows and still averages
 *     over l equal segments of the padded length N (padded rows count as
 *     zeros in the landmarks), and computes its padded query rows. Here
 *     landmarks are means of the valid rows only, padded rows of O are zero
 *     and padded inputs are never read: a padded problem is the same as the
 *     truncated one, bitwise.
 *   - The reference's special case l == N (plain softmax attention) is not
 *     taken: l >= n = m gives one landmark per token and O = S Z_T S V with
 *     S = softmax(s Q K^T), which approaches softmax attention S V as Z_T
 *     approaches pinv(S).
 *   - The reference's optional depthwise convolution of V added to the
 *     output (conv_kernel_size) is not part of the operator: it is a layer
 *     around it (a residual path of its own).
 *
 * Backward: the exact VJP of the above (float32), through the landmark
 * means, the three softmaxes, the T pseudo-inverse iterations (Z_0's c
 * included, its gradient going to A's largest column; the first such column
 * on a tie) and the products. Padded rows of dq, dk, dv are zero.
 *
 * Cost per problem: O((n + m) r (d + dv) + T r^3) time, O((n + m) r + T r^2)
 * workspace; never n x m (except the optional attention output).
 * Tape: the row log-normalisers of F, A and B (Nq + 2 l floats a problem);
 * the backward recomputes the landmarks, the kernels and the iterations. A
 * backward needs the forward's landmarks, iters and scale (another value:
 * BK_ERR_TAPE); tape NULL recomputes the forward.
 * A problem with no valid query or key has O = 0 and zero gradients.
 * Errors: BK_ERR_PARAM for landmarks outside [1, 4096], iters outside
 * [0, 100] or a non-finite scale (bk_op_config_set refuses them too, naming
 * the range); BK_ERR_NONFINITE for a non-finite q, k, v or dout in a valid
 * row; BK_ERR_OVERFLOW when finite inputs overflow float32 (the scores or
 * the products). */
typedef struct {
    int landmarks;  /* l >= 1 (default 64); a problem uses min(l, n, m)    */
    int iters;      /* T >= 0 pseudo-inverse iterations (default 6, the
                       reference's); 0: Z = A^T / c                        */
    float scale;    /* s; 0 selects 1/sqrt(d)                              */
} bk_nystrom_config;

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_NYSTROM_H */
