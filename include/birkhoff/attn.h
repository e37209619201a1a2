/* birkhoff/attn.h -- softmax, Sinkhorn and unbalanced Sinkhorn attention
 * (the attention descriptor bk_attn_desc is in core.h).
 * Part of the public API; include <birkhoff.h> (all of it) or this file. The
 * conventions every function follows (layouts, padding, accuracy, threads and
 * determinism, workspace and tape) are at the top of birkhoff/core.h. */
#ifndef BIRKHOFF_ATTN_H
#define BIRKHOFF_ATTN_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Sinkhorn attention (and softmax, its S = 1 case)                         */
/* ------------------------------------------------------------------------ */
typedef enum {
    BK_GRAD_UNROLLED = 0, /* exact VJP of the S-step forward (default)      */
    BK_GRAD_IMPLICIT = 1  /* implicit differentiation of the fixed point:
                             the gradient of the converged plan; only right
                             when the forward has converged (large S or a
                             tolerance). O(Nk^3) per problem in double.     */
} bk_grad_mode;

typedef struct {
    float scale;          /* score scale s; 0 selects 1/sqrt(d)            */
    float eps;            /* temperature, > 0 (default 1)                  */
    int   iters;          /* S >= 1 half-steps, row first (default 5)      */
    float tol;            /* >= 0; 0 runs all S half-steps. Otherwise a
                             problem stops after the first row step whose
                             max relative column-marginal error is < tol
                             (checked for free inside the pass; a stopped
                             problem has exact rows).                       */
    bk_grad_mode grad;    /* backward mode                                  */
} bk_sinkhorn_config;

BK_API bk_sinkhorn_config bk_sinkhorn_config_default(void);

/* Per-problem diagnostics (relative marginal errors of the final plan). */
typedef struct {
    int32_t iters;        /* half-steps actually run                        */
    float   row_err;      /* max_i |sum_j P_ij / a_i - 1| (= |rowsum A - 1|) */
    float   col_err;      /* max_j |sum_i P_ij / b_j - 1|                   */
} bk_sinkhorn_diag;

/* Optional forward outputs; any member may be NULL / have data NULL. */
typedef struct {
    bk_tensor attn;           /* [B,H,Nq,Nk] attention A (padding: zeros)  */
    float *f;                 /* [B*H*Nq] row potential (logit units; 0 on
                                 padded rows)                              */
    float *g;                 /* [B*H*Nk] column potential (0 if S = 1)    */
    bk_sinkhorn_diag *diag;   /* [B*H]                                      */
} bk_sinkhorn_extras;

/* Bytes of workspace for forward and backward with the current thread
 * count. */
BK_API size_t bk_sinkhorn_workspace_size(const bk_attn_desc *desc,
                                         const bk_sinkhorn_config *p);
/* Bytes of tape a forward writes for its backward. */
BK_API size_t bk_sinkhorn_tape_size(const bk_attn_desc *desc,
                                    const bk_sinkhorn_config *p);

/* O = A V. q:[B,H,Nq,d] k:[B,H,Nk,d] v:[B,H,Nk,dv] out:[B,H,Nq,dv].
 * tape (nullable) receives what the backward needs; extras (nullable) the
 * optional outputs; ws/ws_size as described above. */
BK_API bk_status bk_sinkhorn_forward(const bk_attn_desc *desc,
                                     const bk_sinkhorn_config *p,
                                     const bk_tensor *q, const bk_tensor *k,
                                     const bk_tensor *v, const bk_tensor *out,
                                     void *tape,
                                     const bk_sinkhorn_extras *extras,
                                     void *ws, size_t ws_size);

/* Vector-Jacobian product: given dout = dL/dO, writes dq, dk, dv (each
 * overwritten, zero in padded rows). tape from the forward with the same
 * desc/params/inputs, or NULL to recompute the forward internally. With
 * p->grad == BK_GRAD_IMPLICIT the tape's final potentials are used. */
BK_API bk_status bk_sinkhorn_backward(const bk_attn_desc *desc,
                                      const bk_sinkhorn_config *p,
                                      const bk_tensor *q, const bk_tensor *k,
                                      const bk_tensor *v, const bk_tensor *dout,
                                      const void *tape,
                                      const bk_tensor *dq, const bk_tensor *dk,
                                      const bk_tensor *dv,
                                      void *ws, size_t ws_size);

/* Softmax attention: A = row-softmax(scale * Q K^T) on the valid block.
 * Same descriptor, layouts and padding as Sinkhorn; it is the S = 1 case of
 * the same engine (p.iters = 1, eps = 1). Tape: the row log-normalisers.
 * Causal (causal = 1): on a problem's valid Lq x Lk block, query i sees the
 * keys j <= i + (Lk - Lq), i.e. the queries are the LAST Lq positions of the
 * key sequence (Lq = Lk: the usual lower triangle; Lk > Lq: decoding with a
 * key/value cache); masked entries of A are exactly 0 and get no gradient.
 * A problem with Lk < Lq is refused (BK_ERR_LENGTH). Softmax is the only
 * causal normaliser: under a causal mask the only doubly-stochastic matrix
 * is the identity (docs/ALGORITHMS.md, section 3), so the Sinkhorn family,
 * ESP, LOT and ASAP have no causal mode. */
typedef struct {
    float scale;          /* 0 selects 1/sqrt(d)                             */
    int causal;           /* 0 or 1 (see above)                              */
} bk_softmax_config;

/* scale 0 (1/sqrt(d)), not causal; a NULL parameter pointer means the same */
BK_API bk_softmax_config bk_softmax_config_default(void);

BK_API size_t bk_softmax_workspace_size(const bk_attn_desc *desc);
BK_API size_t bk_softmax_tape_size(const bk_attn_desc *desc);
BK_API bk_status bk_softmax_forward(const bk_attn_desc *desc,
                                    const bk_softmax_config *p,
                                    const bk_tensor *q, const bk_tensor *k,
                                    const bk_tensor *v, const bk_tensor *out,
                                    void *tape, const bk_tensor *attn,
                                    void *ws, size_t ws_size);
BK_API bk_status bk_softmax_backward(const bk_attn_desc *desc,
                                     const bk_softmax_config *p,
                                     const bk_tensor *q, const bk_tensor *k,
                                     const bk_tensor *v, const bk_tensor *dout,
                                     const void *tape,
                                     const bk_tensor *dq, const bk_tensor *dk,
                                     const bk_tensor *dv,
                                     void *ws, size_t ws_size);

/* Unbalanced Sinkhorn attention (the Sinkformers code's SinkhornUnbalanced):
 * the same row half-steps as Sinkhorn attention, and DAMPED column
 * half-steps
 *     g_j = kappa (log b_j - LSE_i (C_ij + f_i)),   kappa = rho / (rho + eps),
 * i.e. in the reference's units v <- rho/(rho+eps) (eps log nu - eps LSE_i
 * ((c_ij + u_i)/eps)): the semi-unbalanced problem whose column marginal is
 * only penalised (KL, strength rho) instead of imposed. rho -> inf is
 * Sinkhorn attention. Output convention as Sinkhorn: A = P / a (rows sum to
 * 1 after a row half-step; after a column half-step neither marginal is
 * exact), O = A V; padding, layouts, tol, extras (attn, f, g, diag) and
 * tapes as bk_sinkhorn_*. The backward is the exact unrolled VJP (no
 * implicit mode). Accuracy as Sinkhorn's (tested against an independent
 * double reference, tests/ops/ref_unbalanced.c). */
typedef struct {
    float scale;          /* score scale s; 0 selects 1/sqrt(d)            */
    float eps;            /* temperature, > 0 (default 1)                  */
    int   iters;          /* S >= 1 half-steps, row first (default 5)      */
    float tol;            /* >= 0: early stop as in bk_sinkhorn_config      */
    float rho;            /* > 0: KL penalty on the column marginal (10)   */
} bk_unbalanced_config;

BK_API bk_unbalanced_config bk_unbalanced_config_default(void);
BK_API size_t bk_unbalanced_workspace_size(const bk_attn_desc *desc, const bk_unbalanced_config *p);
BK_API size_t bk_unbalanced_tape_size(const bk_attn_desc *desc, const bk_unbalanced_config *p);
BK_API bk_status bk_unbalanced_forward(const bk_attn_desc *desc, const bk_unbalanced_config *p, const bk_tensor *q,
                                       const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                                       const bk_sinkhorn_extras *extras, void *ws, size_t ws_size);
BK_API bk_status bk_unbalanced_backward(const bk_attn_desc *desc, const bk_unbalanced_config *p, const bk_tensor *q,
                                        const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout,
                                        const void *tape, const bk_tensor *dq, const bk_tensor *dk,
                                        const bk_tensor *dv, void *ws, size_t ws_size);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_ATTN_H */
