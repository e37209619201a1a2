/* birkhoff/lot.h -- LOT attention (LOTFormer).
 * Part of the public API; include <birkhoff.h> (all of it) or this file. The
 * conventions every function follows (layouts, padding, accuracy, threads and
 * determinism, workspace and tape) are at the top of birkhoff/core.h. */
#ifndef BIRKHOFF_LOT_H
#define BIRKHOFF_LOT_H

#include "attn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* LOT attention (LOTFormer; docs/ALGORITHMS.md section 5)                   */
/* ------------------------------------------------------------------------ */
/* Per problem (n = Lq queries, m = Lk keys) and head h, with r pivots Z_h
 * (r x d) and pivot masses p0 = softmax(theta_h / temp):
 *   Gamma1 = Sinkhorn(s Q Z^T / eps; marginals 1/n, p0)      (n x r)
 *   Gamma2 = Sinkhorn(s Z K^T / eps; marginals p0, 1/m)      (r x m)
 * each T log-domain half-steps, row first (the same engine as Sinkhorn
 * attention), and A = n Gamma1 diag(1/p0) Gamma2 (rows sum to 1 for odd T,
 * columns to n/m for even T, doubly stochastic at convergence; rank <= r).
 * O = A V is computed as n Gamma1 (diag(1/p0) (Gamma2 V)): O((n + m) r (d +
 * dv) + T (n + m) r) time and O((n + m) r) memory; no n x m matrix (unless
 * the attention is exported). Padding: padded queries and keys get zero mass
 * (the problem runs on the valid prefix), padded rows are zero. r may exceed
 * n. The paper omits the factor n (digest 1.5); the reference LRA variant's
 * 1/r^2 glue and +1e6 key masks are bugs and are not reproduced.
 * Non-finite inputs: a NaN or Inf in a valid row of q, k, v (or the
 * backward's dout) fails with BK_ERR_NONFINITE naming the tensor and its
 * first bad row, as for every operator, but it is found in LOT's own
 * products from that input (no separate read of the inputs first), so on
 * that error the outputs have been written (with meaningless values).
 * Finite inputs whose products overflow float32 (pivots or q, k near 1e19
 * and beyond, a scale near 1e38): BK_ERR_OVERFLOW after the call, as for
 * every operator (birkhoff/core.h). */
typedef struct {
    int r;               /* pivots, >= 1                                    */
    const float *Z;      /* [H, r, d] pivot locations (shared over batch)   */
    const float *theta;  /* [H, r] pivot-mass logits                        */
    float temp;          /* > 0: p0 = softmax(theta / temp)                 */
    int iters;           /* T >= 1 half-steps per inner problem             */
    float eps;           /* > 0                                             */
    float scale;         /* s; 0 selects 1/sqrt(d)                          */
    float tol;           /* >= 0; > 0: per-problem early stop of each inner
                            problem (as bk_sinkhorn_config.tol)             */
} bk_lot_config;

typedef struct {
    int32_t iters1, iters2; /* half-steps run by the two inner problems     */
    float row_err, col_err; /* max |rowsum(A) - 1|, max |colsum(A) m/n - 1|  */
} bk_lot_diag;

typedef struct {
    bk_tensor attn;      /* [B,H,Nq,Nk] dense A (small problems only)        */
    bk_lot_diag *diag;   /* [B*H]                                            */
} bk_lot_extras;

/* r = 1, temp = 1, T = 5, eps = 1, scale = 1/sqrt(d); Z, theta to be set */
BK_API bk_lot_config bk_lot_config_default(void);
BK_API size_t bk_lot_workspace_size(const bk_attn_desc *desc, const bk_lot_config *p);
BK_API size_t bk_lot_tape_size(const bk_attn_desc *desc, const bk_lot_config *p);
BK_API bk_status bk_lot_forward(const bk_attn_desc *desc, const bk_lot_config *p, const bk_tensor *q,
                                const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                                const bk_lot_extras *extras, void *ws, size_t ws_size);
/* Exact VJP of the T-step forward (replayed from the tape's potentials).
 * dq, dk, dv overwritten; dZ [H, r, d] and dtheta [H, r] (nullable) are
 * overwritten with the gradients summed over the batch. tape NULL recomputes the forward. */
BK_API bk_status bk_lot_backward(const bk_attn_desc *desc, const bk_lot_config *p, const bk_tensor *q,
                                 const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout, const void *tape,
                                 const bk_tensor *dq, const bk_tensor *dk, const bk_tensor *dv, float *dZ,
                                 float *dtheta, void *ws, size_t ws_size);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_LOT_H */
