/* birkhoff/linear.h -- kernelised ("linear") attention: the Linear
 * Transformer and Performer's FAVOR+. Part of the public API; include
 * <birkhoff.h> (all of it) or this file. The conventions every function
 * follows (layouts, padding, accuracy, threads and determinism, workspace and
 * tape) are at the top of birkhoff/core.h.
 *
 * Both operators are registered (birkhoff/ops.h) as "linear" and
 * "performer": run them with bk_op_find(NAME) and bk_op_forward /
 * bk_op_backward, their parameters set by key (bk_op_config_set) or directly
 * in the structs below. They have no typed entry points. */
#ifndef BIRKHOFF_LINEAR_H
#define BIRKHOFF_LINEAR_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Kernelised attention (docs/ALGORITHMS.md "Kernelised attention")          */
/* ------------------------------------------------------------------------ */
/* q [B,H,Nq,d], k [B,H,Nk,d], v [B,H,Nk,dv]. Per problem (batch b, head h;
 * n = Lq valid queries, m = Lk valid keys), with feature maps phi_q, phi_k
 * from R^d to R^F (F features, all positive):
 *     S = sum_{j<m} phi_k(k_j) v_j^T      (F x dv)
 *     z = sum_{j<m} phi_k(k_j)            (F)
 *     out_i = phi_q(q_i)^T S / (phi_q(q_i)^T z + eps_den)
 * i.e. out = A v with the implied attention
 *     A_ij = phi_q(q_i) . phi_k(k_j) / (sum_{j'<m} phi_q(q_i) . phi_k(k_j') + eps_den),
 * positive, rows summing to 1 (up to eps_den). Time and memory O((n + m)
 * F (d + dv)); the n x m matrix is never formed, except into the optional
 * attention output (the extras of bk_op_forward's attn argument: small
 * problems only).
 *
 * Backward: the exact VJP (dq, dk, dv) of the function the forward computes
 * (each operator's notes say what is held constant). Padding: padded keys
 * enter neither sum; padded query rows of out, padded rows of dq, dk, dv and
 * padded entries of the attention output are zero; padded inputs are never
 * read. A problem with no valid query or key has out = 0 and zero gradients.
 * Tape: per problem S and z ((dv + 1) F floats, independent of n and m); the
 * backward recomputes the features (and out) from q, k and the tape, so a
 * tape costs O(F dv) per problem, never O(N).
 * Inputs must be finite (BK_ERR_NONFINITE naming the tensor and row); a
 * result that is not finite although the inputs are (the features or their
 * sums overflowed float32, or every feature of a query underflowed so that
 * its denominator is 0) fails with BK_ERR_OVERFLOW. */

/* ---- the Linear Transformer (Katharopoulos et al., ICML 2020) ----------
 * phi_q = phi_k = phi(x) = elu(x) + 1, elementwise on q and k as given (no
 * score scale; F = d). phi(x) = x + 1 for x > 0 and exp(x) for x <= 0
 * (computed as exp(x), without the cancellation of (exp(x) - 1) + 1).
 * eps_den = eps. The reference (fast-transformers' LinearAttention) adds
 * eps = 1e-6 to every denominator; the default keeps it: against a
 * denominator phi(q_i) . z >= m d min(phi)^2 it changes nothing at float32
 * precision for inputs of ordinary size (a relative 1e-6 / den), and keeps a
 * denominator of underflowed features (all of q_i and every k_j below about
 * -43) finite: out_i -> 0 there instead of 0/0. eps = 0 is the exact kernel
 * form (rows of the implied attention sum to 1 exactly). */
typedef struct {
    float eps;            /* eps_den >= 0; default 1e-6 (the reference's)  */
} bk_linear_config;

/* eps 1e-6 */
BK_API bk_linear_config bk_linear_config_default(void);

/* ---- Performer, FAVOR+ (Choromanski et al., ICLR 2021) -----------------
 * Positive orthogonal random features estimating softmax attention
 * softmax(s q k^T) v (s = scale, or 1/sqrt(d) when scale is 0): with the
 * projection W (F x d, F = features), c = sqrt(s) (the reference's
 * d^-1/4 when s = 1/sqrt(d)), ratio = F^-1/2 and for a row x
 *     u_f(x) = c w_f . x - c^2 |x|^2 / 2            (f < F)
 *     phi_q(q_i)_f = ratio (exp(u_f(q_i) - a_i) + eps),   a_i = max_f c w_f . q_i
 *     phi_k(k_j)_f = ratio (exp(u_f(k_j) - a)   + eps),   a   = max_{j<m, f} c w_f . k_j
 * eps_den = 0. E[exp(u(q)) . exp(u(k))] = exp(s q . k) over Gaussian w, so
 * out estimates softmax attention, with an error falling as F grows. The
 * stabilisers a_i and a (the reference's max subtraction; a over the valid
 * keys only, per problem) are constants of the backward (the reference
 * detaches them); with eps = 0 (the default) they cancel exactly in the
 * ratio, the gradient is that of the estimator itself, and the estimator
 * is FAVOR+'s unbiased one (of the numerator and the denominator). eps > 0
 * is the reference's feature stabiliser (performer-pytorch: 1e-4,
 * google-research: 1e-6): added after the max subtraction, it biases the
 * estimate by an amount that depends on a_i and a. With eps = 0 a query
 * whose features all underflow (c^2 |q|^2 / 2 above about 87) has a zero
 * denominator and the call fails with BK_ERR_OVERFLOW.
 * The projection: ceil(F / d) blocks of d orthonormal rows (Gram-Schmidt in
 * double of d x d standard Gaussian draws; the last block's first rows),
 * row f then scaled by the norm of a fresh standard Gaussian d-vector
 * (scaling "norms", the reference's default scaling = 0) or by sqrt(d)
 * ("sqrt_d", the reference's scaling = 1), all drawn from `seed`
 * (splitmix64; the same W for the same (features, d, seed, scaling) on every
 * machine and thread count). bk_performer_projection writes it out. W is
 * drawn again (in the call's workspace) by every call; it is not learned and
 * has no gradient. */
typedef enum {
    BK_PERFORMER_NORMS = 0,   /* rows scaled by chi(d) norms (reference's 0)  */
    BK_PERFORMER_SQRT_D = 1   /* rows scaled by sqrt(d) (reference's 1)       */
} bk_performer_scaling;

typedef struct {
    int features;         /* F >= 1 random features; default 256           */
    int scaling;          /* bk_performer_scaling; default NORMS           */
    int64_t seed;         /* the projection's seed; default 0              */
    float scale;          /* s >= 0; 0 selects 1/sqrt(d)                   */
    float eps;            /* the features' additive stabiliser >= 0; 0     */
} bk_performer_config;

/* features 256, scaling NORMS, seed 0, scale 0 (1/sqrt(d)), eps 0 */
BK_API bk_performer_config bk_performer_config_default(void);
/* The projection W [features, d] (row-major float32) that every call with
 * these parameters and head dimension d uses. BK_ERR_NULL for NULL p or W,
 * BK_ERR_SHAPE for d < 1, BK_ERR_PARAM for parameters out of range. */
BK_API bk_status bk_performer_projection(const bk_performer_config *p, int d, float *W);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_LINEAR_H */
