/* birkhoff/otk.h -- the OTK embedding and its unsupervised fits.
 * Part of the public API; include <birkhoff.h> (all of it) or this file. The
 * conventions every function follows (layouts, padding, accuracy, threads and
 * determinism, workspace and tape) are at the top of birkhoff/core.h. */
#ifndef BIRKHOFF_OTK_H
#define BIRKHOFF_OTK_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* OTK embedding (Mialon et al. 2021; docs/ALGORITHMS.md section 6)          */
/* ------------------------------------------------------------------------ */
/* Pools each set x_b (n_b valid elements of dimension d) onto q trainable
 * references z^h (p supports of dimension k each) through an entropic OT plan,
 * after a Nystrom kernel map psi: R^d -> R^k.
 *
 * Feature map. With anchors W [k, d] (unit rows expected; alpha = 1/sigma^2):
 *   r_i = sqrt(max(|x_i|^2, 1e-4)),  xh_i = x_i / r_i,
 *   b_il = r_i exp(alpha (<w_l, xh_i> - 1)),          (homogeneous Gaussian)
 *   G = exp(alpha (W W^T - 1)) = V diag(e) V^T         (LAPACK, double),
 *   M = V diag(1 / (sqrt(max(e, 0)) + eta)) V^T,      psi_i = M b_i.
 * eta = 1e-2 is the reference code's regularisation; eta = 0 makes <psi(x),
 * psi(x')> reproduce the kernel exactly on the anchors. Without anchors (W =
 * NULL) psi is the identity (k must equal d).
 *
 * Plan, per set b and reference h: K_ij = <psi_i, z_j> (times S_ij when
 * pe_double), then S = iters Sinkhorn half-steps on K / eps with marginals
 * 1/n_b (valid elements; padded ones get zero mass) and 1/p, row first from
 * a zero column potential: L = S / 2 iterations, each a row step then a
 * column step (the reference's u-then-v order). Like every iteration count
 * of the library, iters counts half-steps; OTK's is even, because the plan
 * P (n_b x p) ends on a column step: columns sum to 1/p exactly (the
 * references' weights), rows to 1/n_b at convergence. (Before 0.2.0 iters
 * counted the L iterations; checkpoints of that time are converted.)
 *   domain LOG: log-domain half-steps on the shared Sinkhorn engine (any eps);
 *   domain SCALING: u = a / (E v), v = b / (E^T u) with E = exp(K / eps)
 *     computed once (row-max shifted, which leaves the iterates' plan
 *     unchanged); faster, fails with BK_ERR_NUMERIC when E underflows
 *     (small eps): use LOG there.
 * Embedding: out[b, j, h, :] = c * sum_i P_ij S_ij psi_i  (S = 1 without PE),
 *   convention PAPER:     c = sqrt(p / q)  (Phi = sqrt(p) P^T psi, heads
 *                         scaled by 1/sqrt(q));
 *   convention REFERENCE: c = p (the reference code's scaling: T = p P has
 *                         unit column sums, no 1/sqrt(q)).
 * Output layout [B, p, q*k] (support-major, then reference, then feature), as
 * the reference code; flatten it to B x (p q k) for a classifier.
 *
 * Positional encoding (pe): S_ij = exp(-((u_i - v_j) / sigma_pos)^2),
 *   PE_1D: PAPER u_i = i / n_b, v_j = j / p (i, j 1-based, valid length);
 *          REFERENCE u_i = i / n, v_j = j / p (0-based, padded length n).
 *   PE_2D: elements form a grid_h x grid_w grid (row-major, n = grid_h *
 *          grid_w, no padding), supports a s x s grid (p = s^2); S is the
 *          product of the per-axis Gaussians of 1-based positions, each
 *          divided by its axis length.
 * The paper multiplies the plan by S; pe_double = 1 also multiplies K by S
 * before the exponential, as the reference code does.
 *
 * Backward: the exact gradient of the L-iteration forward with respect to x,
 * z and W, replayed from the tape (psi and the potentials of every half-step:
 * memory independent of L beyond O(L (n + p)) per problem). The gradient
 * through M = h(G), h(e) = 1/(sqrt(max(e,0)) + eta), is the Daleckii-Krein
 * formula of h itself (isqrt_grad EXACT) or the reference code's formula
 * F_ab = 1/((t_a + t_b) t_a t_b), t = sqrt(e) + eta (REFERENCE), which is exact
 * only at eta = 0. Anchors are not renormalised inside: the caller renormalises
 * after an update, as the reference does.
 *
 * Errors: sizes < 1, n_b outside [1, n] (empty sets are refused), eps, sigma
 * <= 0, eta < 0, iters odd or < 2, k != d without anchors, grid or p inconsistent with
 * PE_2D, non-finite inputs; finite inputs whose output, features or
 * gradients overflow float32 (|z| / eps beyond ~1e38): BK_ERR_OVERFLOW after
 * the call (the outputs written, not to be used). Accuracy: outputs 1e-5 and gradients 1e-4
 * relative to the largest entry against a double reference, for |K|/eps <= 20. */
typedef enum { BK_OTK_LOG = 0, BK_OTK_SCALING = 1 } bk_otk_domain;
typedef enum { BK_OTK_PAPER = 0, BK_OTK_REFERENCE = 1 } bk_otk_convention;
typedef enum { BK_OTK_PE_NONE = 0, BK_OTK_PE_1D = 1, BK_OTK_PE_2D = 2 } bk_otk_pe;
typedef enum { BK_OTK_ISQRT_EXACT = 0, BK_OTK_ISQRT_REFERENCE = 1 } bk_otk_isqrt_grad;

typedef struct {
    int B, n, d;           /* sets: x viewed as [B, 1, n, d] (stride_h unused) */
    int q, p, k;           /* references z [q, p, k] (dense)                  */
    const int32_t *len;    /* [B] valid elements per set in [1, n]; NULL = n  */
} bk_otk_desc;

typedef struct {
    const float *W;        /* [k, d] anchors (dense); NULL = identity map     */
    float sigma;           /* > 0 kernel bandwidth, alpha = 1 / sigma^2        */
    float eta;             /* >= 0 inverse square root regulariser            */
    float eps;             /* > 0 entropic temperature                        */
    int iters;             /* S half-steps, even, >= 2: S/2 iterations (u then
                              v); default 20                                  */
    bk_otk_domain domain;
    bk_otk_convention convention;
    bk_otk_pe pe;
    float sigma_pos;       /* > 0 with PE                                     */
    int pe_double;         /* 1: S also multiplies K (reference code)         */
    int grid_h, grid_w;    /* PE_2D input grid                                */
    bk_otk_isqrt_grad isqrt_grad;
} bk_otk_config;

typedef struct {
    float row_err;         /* max_i |n_b * rowsum_i(P) - 1|                   */
    float col_err;         /* max_j |p * colsum_j(P) - 1| (0 up to rounding)  */
} bk_otk_diag;

typedef struct {
    float *plan;           /* [B, q, n, p] the pooling weights c P (x) S (rows
                              of padded elements zero); NULL = not wanted      */
    bk_otk_diag *diag;     /* [B*q], NULL = not wanted                        */
} bk_otk_extras;

/* eps = 0.5, L = 10, sigma = 0.5, eta = 1e-2, LOG, PAPER, no PE; W = NULL */
BK_API bk_otk_config bk_otk_config_default(void);
BK_API size_t bk_otk_workspace_size(const bk_otk_desc *desc, const bk_otk_config *p);
BK_API size_t bk_otk_tape_size(const bk_otk_desc *desc, const bk_otk_config *p);
/* psi for every valid element: psi [B, 1, n, k] (padded rows zero). */
BK_API bk_status bk_otk_features(const bk_otk_desc *desc, const bk_otk_config *p, const bk_tensor *x,
                                 const bk_tensor *psi);
/* x [B,1,n,d] view, z [q,p,k] dense, out [B,1,p,q*k] view (row stride
 * stride_n >= q*k). tape (nullable, bk_otk_tape_size bytes) receives what the
 * backward needs: the potentials of every half-step and, with anchors, the
 * anchor Gram matrix's eigendecomposition and M with a checksum of W (a
 * backward given other anchors than the forward's decomposes their Gram
 * matrix itself instead of taking it from the tape). */
BK_API bk_status bk_otk_forward(const bk_otk_desc *desc, const bk_otk_config *p, const bk_tensor *x,
                                const float *z, const bk_tensor *out, void *tape, const bk_otk_extras *extras,
                                void *ws, size_t ws_size);
/* dout [B,1,p,q*k]; dx [B,1,n,d] overwritten (padded rows zero), dz [q,p,k]
 * and dW [k,d] overwritten with sums over the batch; any of them may be
 * NULL (dW needs anchors). tape NULL recomputes the forward. */
BK_API bk_status bk_otk_backward(const bk_otk_desc *desc, const bk_otk_config *p, const bk_tensor *x,
                                 const float *z, const bk_tensor *dout, const void *tape, const bk_tensor *dx,
                                 float *dz, float *dW, void *ws, size_t ws_size);

/* ---- unsupervised learning of anchors and references (OTK section 5) ----
 * Spherical K-means (the reference's): rows normalised (zero rows ignored),
 * K initial centres by k-means++ seeding on the distance 1 - cos (init
 * PLUSPLUS, default) or drawn uniformly without replacement as the reference
 * code does (init RANDOM), from a seeded generator, assignment by maximum
 * cosine, centre = normalised mean, an empty cluster takes the worst-fitting
 * point; stops after `iters` iterations or when the mean similarity changes by
 * less than tol relatively. Results are reproducible for a seed and do not
 * depend on the thread count. */
typedef enum { BK_KMEANS_PLUSPLUS = 0, BK_KMEANS_RANDOM = 1 } bk_kmeans_init;

typedef struct {
    int iters;             /* >= 1 (100)                                      */
    float tol;             /* >= 0 (1e-6)                                     */
    uint64_t seed;
    int64_t max_samples;   /* fit_anchors/fit_refs: elements sampled (0 = all) */
    bk_kmeans_init init;
} bk_kmeans_config;

typedef struct {
    int iters;             /* iterations run                                  */
    int converged;         /* 1 when the tolerance was met                    */
    double objective;      /* mean cosine (K-means) or mean OT similarity     */
} bk_kmeans_report;

BK_API bk_kmeans_config bk_kmeans_config_default(void);
/* x [N, dim] row-major; centres [K, dim] unit rows. K > (non-zero rows) is
 * BK_ERR_PARAM. */
BK_API bk_status bk_spherical_kmeans(const float *x, int64_t N, int dim, int K, const bk_kmeans_config *kp,
                                     float *centres, bk_kmeans_report *rep);
/* Anchors W [k, d] by spherical K-means on (up to max_samples, uniformly
 * sampled) valid elements of x [B,1,n,d]; desc->k is the number of anchors. */
BK_API bk_status bk_otk_fit_anchors(const bk_otk_desc *desc, const bk_tensor *x, const bk_kmeans_config *kp,
                                    float *W, bk_kmeans_report *rep);
/* References z [q, p, k] on psi features (p->W, sigma, eta; identity without
 * anchors), normalised. q = 1: spherical K-means of all features (p
 * centres). q > 1: Wasserstein K-means over sets: z^h starts as the first p
 * features of q distinct sets (drawn among sets with n_b >= p), each set goes
 * to the reference of largest OT similarity sum_ij P_ij <psi_i, z_j> (p->eps,
 * p->iters, LOG), and z^h becomes the spherical K-means of the features of
 * its sets (an empty reference takes the worst-fitting set); kp->iters outer
 * iterations at most. barycenter > 0 adds that many damped barycentric steps
 * z <- normalise(z/2 + mean_b (p P^T psi_b)/2) after each K-means. */
BK_API bk_status bk_otk_fit_refs(const bk_otk_desc *desc, const bk_otk_config *p, const bk_tensor *x,
                                 const bk_kmeans_config *kp, int barycenter, float *z, bk_kmeans_report *rep);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_OTK_H */
