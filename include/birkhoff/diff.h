/* birkhoff/diff.h -- differential attention (Differential Transformer).
 * Part of the public API; include <birkhoff.h> (all of it) or this file. The
 * conventions every function follows (layouts, padding, accuracy, threads and
 * determinism, workspace and tape) are at the top of birkhoff/core.h. */
#ifndef BIRKHOFF_DIFF_H
#define BIRKHOFF_DIFF_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Differential attention (DiffTransformer, Ye et al., ICLR 2025;            */
/* docs/ALGORITHMS.md "Differential attention")                              */
/* ------------------------------------------------------------------------ */
/* q [B,H,Nq,d], k [B,H,Nk,d] with d EVEN, each row split in two halves of
 * dh = d/2 channels: q = [q1, q2], k = [k1, k2]; v [B,H,Nk,dv]. Per problem
 * (batch b, head h; n = Lq valid queries, m = Lk valid keys):
 *     A1 = row-softmax(s Q1 K1^T)          (n x m, over the valid keys)
 *     A2 = row-softmax(s Q2 K2^T)
 *     A  = A1 - lambda_h A2                 (the combined map)
 *     O  = A V
 * s = scale, or 1/sqrt(dh) = 1/sqrt(d/2) when scale is 0 (the half head
 * dimension, as in the paper). Both softmaxes are the S = 1 case of the
 * library's LSE engine (bk_softmax_*): with lambda_h = 0 the output and the
 * gradients dq[..., :dh], dk[..., :dh], dv are bitwise those of
 * bk_softmax_* on the first halves (dq, dk of the second halves are then
 * zero).
 *
 * WHAT IS IN THE OPERATOR: the two-map difference only. lambda is an input,
 * one value per head ([H], shared over the batch), and its gradient is the
 * operator's parameter gradient. The paper's re-parameterisation
 *     lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,
 *     lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1))        (layer l, 1-based)
 * the per-head normalisation (RMSNorm of each head's output) and the factor
 * (1 - lambda_init) belong to the model layer around the operator: they are
 * cheap, elementwise or per row, and their gradients compose with dlambda by
 * the chain rule (dlq1 = dlambda exp(lq1 . lk1) lk1, ...). Keeping them out
 * keeps the operator a map O = (A1 - lambda A2) V with an exact VJP.
 *
 * Padding: both softmaxes run over the valid keys only; padded query rows of
 * O, padded rows of the gradients and padded entries of the attention output
 * are zero; padded inputs are never read. A problem with no valid query or
 * key has O = 0 and contributes nothing to dlambda.
 * Tape: the two row log-normalisers per problem (2 Nq floats); it does not
 * depend on lambda (a backward may be given other lambda values than its
 * forward: it differentiates at the lambda it is given). */
typedef struct {
    float scale;          /* s; 0 selects 1/sqrt(d/2)                       */
    const float *lambda;  /* [H] per-head lambda (required; finite). May be
                             any sign; the paper's lambda is a difference of
                             exponentials plus lambda_init.                 */
} bk_diff_config;

/* Optional forward outputs (attn.data may be NULL). */
typedef struct {
    bk_tensor attn;       /* [B,H,Nq,Nk] the combined map A1 - lambda A2
                             (padding: zeros; small problems only)          */
} bk_diff_extras;

/* scale 0 (1/sqrt(d/2)); lambda NULL: to be set */
BK_API bk_diff_config bk_diff_config_default(void);
/* Bytes of workspace for forward and backward with the current thread
 * count; bytes of tape. 0 when d is odd or scale is not finite. */
BK_API size_t bk_diff_workspace_size(const bk_attn_desc *desc, const bk_diff_config *p);
BK_API size_t bk_diff_tape_size(const bk_attn_desc *desc, const bk_diff_config *p);
BK_API bk_status bk_diff_forward(const bk_attn_desc *desc, const bk_diff_config *p, const bk_tensor *q,
                                 const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                                 const bk_diff_extras *extras, void *ws, size_t ws_size);
/* Exact VJP. dq, dk, dv overwritten (zero in padded rows); dlambda [H]
 * (nullable) is OVERWRITTEN with dL/dlambda summed over the batch, in batch
 * order: dlambda_h = -sum_b sum_ij (dO V^T)_ij A2_ij. tape NULL recomputes
 * the forward. */
BK_API bk_status bk_diff_backward(const bk_attn_desc *desc, const bk_diff_config *p, const bk_tensor *q,
                                  const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout, const void *tape,
                                  const bk_tensor *dq, const bk_tensor *dk, const bk_tensor *dv, float *dlambda,
                                  void *ws, size_t ws_size);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_DIFF_H */
