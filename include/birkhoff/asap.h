/* birkhoff/asap.h -- ASAP: a trained Sinkhorn layer compiled into a loop-free operator.
 * Part of the public API; include <birkhoff.h> (all of it) or this file. The
 * conventions every function follows (layouts, padding, accuracy, threads and
 * determinism, workspace and tape) are at the top of birkhoff/core.h. */
#ifndef BIRKHOFF_ASAP_H
#define BIRKHOFF_ASAP_H

#include "attn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* ASAP: a trained Sinkhorn layer compiled into a loop-free operator         */
/* (Tran, Milkert, Hyde 2026; docs/ALGORITHMS.md section 7)                   */
/* ------------------------------------------------------------------------ */
/* Problem (b, h) with valid Lq queries and Lk keys, s = scale (> 0; 0 selects
 * 1/sqrt(d)), logits Z_ij = (s / eps) q_i . k_j, marginals a = 1/Lq, b = 1/Lk.
 *
 * Teacher: Sinkhorn attention with S half-steps (bk_sinkhorn_forward, same
 * eps and scale). Its closure-ready source dual, in logit units, is the row
 * potential f in force after half-step S - 1, i.e. the one the teacher's last
 * column step acts on (even S: f of step S - 1, column-ending teacher; odd S
 * >= 3: f of step S - 2, row-ending teacher; not the f of the final row step).
 * S = 1 (softmax) cannot be compiled.
 * Fit target in cost units (cost C_ij = s |q_i - k_j|^2 / 2):
 *     y_i = eps f_i + rho_i - mean over valid i,     rho_i = s |q_i|^2 / 2.
 *
 * Sliced potentials X [Lq x L]: for each unit direction theta_l of the slice
 * bank, a_i = sqrt(s) theta_l . q_i and b_j = sqrt(s) theta_l . k_j; the exact
 * 1-D Kantorovich potential of the uniform measures on {a_i} and {b_j} for the
 * cost (a - b)^2 / 2 (both sorted; with r-th smallest a_(r)):
 *     phi_0 = 0,  phi_r = phi_{r-1} + b_(sigma(r-1)) (a_(r) - a_(r-1)),
 *     f_(r) = a_(r)^2 / 2 - phi_r,   sigma(r) = floor(((r+1) Lk - 1) / Lq)
 * (the last key the monotone plan sends query rank r to; sigma(r) = r when
 * Lq = Lk), in double, returned to token order and centred over valid rows.
 *
 * Online operator, with predicted dual fhat = X omega (cost units) and
 * u_i = (fhat_i - rho_i) / eps (logit units), c-transforms as LSE half-steps:
 *     T_K(u)_j = log b - LSE_i (Z_ij + u_i),   T_Q(g)_i = log a - LSE_j (Z_ij + g_j)
 *   ASAP-0 (BK_ASAP_ZERO):      g0 = T_K(u),  P = exp(Z + u + g0)      (columns exact)
 *   row-ending (BK_ASAP_ROW):   f1 = T_Q(g0), P = exp(Z + f1 + g0)     (rows exact)
 *   column-ending (BK_ASAP_COLUMN): g1 = T_K(f1), P = exp(Z + f1 + g1) (columns exact)
 * BK_ASAP_AUTO picks the teacher's ending (even S: column, odd S: row).
 * A = Lq P, O = A V, as Sinkhorn attention (columns of A sum to Lq/Lk when
 * they are exact). With the teacher's exact dual: for even S, ASAP-0
 * reproduces the teacher and the column-ending form (AUTO) equals Sinkhorn
 * with S + 2 half-steps (the paper's finite-correction bias); for odd S, the
 * row-ending form (AUTO) reproduces the teacher and ASAP-0 gives S - 1.
 * Padding: padded keys get zero mass; padded query rows have zero features,
 * zero output, and are outside the centring, the fit and the marginals. The
 * half-steps are the shared LSE engine's (on the transposed scores, starting
 * from u); cost O(Lq Lk (d + dv) + L (Lq + Lk) (d + log N) + 2 Lq Lk exps).
 *
 * Calibration (offline): bk_asap_calib_add streams problems (Q, K) through
 * the teacher and accumulates, in double, G = sum X^T X, c = sum X^T y and
 * sum y^2 (constant memory; per-problem blocks summed in problem order, so
 * the fit does not depend on the thread count). bk_asap_calib_fit solves
 *   LS: omega = (G + lambda I)^-1 c            (Cholesky, LAPACK)
 *   KL: the convex one-sided objective
 *       J(omega) = sum_m [eps sum_j b LSE_i(Z_ij + u_i) - <r_m, X_m omega>] + lambda/2 |omega|^2
 *       (r_m: row sums of the one-sided plan of the teacher's dual) by damped
 *       Newton with Armijo backtracking from the LS solution; analytic gradient
 *       sum X^T (rhat - r) + lambda omega and Hessian
 *       (1/eps) sum [X^T diag(rhat) X - W diag(b) W^T] + lambda I, W = X^T Pi.
 *       KL keeps X, r, rho, Q, K of every problem: O(Lq (L + d + 2) + Lk d)
 *       floats each (LS keeps O(L^2)).
 * The ridge lambda is added to the raw sums (the paper's scaling; 1e-3). */
typedef enum { BK_ASAP_AUTO = 0, BK_ASAP_ZERO = 1, BK_ASAP_COLUMN = 2, BK_ASAP_ROW = 3 } bk_asap_variant;
typedef enum { BK_ASAP_FIT_LS = 0, BK_ASAP_FIT_KL = 1 } bk_asap_fit;

/* A compiled layer: the slice bank and the coefficients, with the teacher's
 * conventions. Owned arrays are released by bk_asap_layer_free. */
typedef struct {
    int d;                 /* head dim of Q and K                            */
    int slices;            /* L >= 1                                          */
    float scale;           /* score scale s > 0 (resolved: never 0)           */
    float eps;             /* temperature > 0                                 */
    int teacher_iters;     /* S >= 2 of the teacher                           */
    float *theta;          /* [L x d] unit rows                               */
    double *omega;         /* [L]                                             */
    /* provenance (recorded in the file; informative) */
    bk_asap_fit fit;
    double lambda;
    uint64_t seed;         /* slice-bank seed (0 with theta_given)            */
    int theta_given;       /* 1: the bank was supplied by the caller          */
    int64_t calib_problems, calib_rows;
} bk_asap_layer;

typedef struct {
    int d;                 /* head dim                                        */
    int slices;            /* L >= 1 (default 32)                             */
    const float *theta;    /* [L x d] supplied bank (rows normalised on use),
                              or NULL: L directions uniform on the sphere
                              from seed (normalised Gaussians, splitmix64)    */
    uint64_t seed;         /* default 1                                       */
    float scale;           /* 0 selects 1/sqrt(d); else > 0                   */
    float eps;             /* default 1                                       */
    int teacher_iters;     /* S >= 2 (default 20)                             */
    double lambda;         /* ridge >= 0 (default 1e-3)                       */
} bk_asap_config;

/* Newton options of the KL fit. */
typedef struct {
    int max_iters;         /* default 50                                      */
    double tol;            /* stop when the Newton decrement^2/2 < tol max(1,|J|)
                              (default 1e-13: omega to ~1e-6 relative)        */
} bk_asap_kl_config;

typedef struct {
    int64_t problems, rows;/* calibration problems and valid query rows      */
    double ls_rmse;        /* LS fit: sqrt(mean squared residual) (cost units) */
    double ls_r2;          /* 1 - residual / sum of squared targets           */
    double kl_j0, kl_j;    /* KL objective at the LS start and at the end     */
    double kl_grad;        /* final max |grad J|                               */
    int kl_iters;          /* Newton steps taken                              */
    int kl_converged;      /* 1 when the decrement fell below tol             */
} bk_asap_fit_report;

typedef struct bk_asap_calib bk_asap_calib; /* opaque accumulator */

BK_API bk_asap_config bk_asap_config_default(int d);
BK_API bk_asap_kl_config bk_asap_kl_config_default(void);
/* keep_kl = 1 keeps what the KL fit needs (else only the LS sums). */
BK_API bk_status bk_asap_calib_create(const bk_asap_config *cfg, int keep_kl, bk_asap_calib **out);
BK_API void bk_asap_calib_free(bk_asap_calib *c);
/* Adds the B*H problems (q [B,H,Nq,d], k [B,H,Nk,d], lengths as in
 * bk_attn_desc; dv is ignored). Problems with Lq = 0 or Lk = 0 are skipped.
 * Finite q, k whose teacher scores overflow float32: BK_ERR_OVERFLOW naming
 * the problem, and nothing of the call is added. */
BK_API bk_status bk_asap_calib_add(bk_asap_calib *c, const bk_attn_desc *desc, const bk_tensor *q,
                                   const bk_tensor *k);
/* Fits omega (KL needs keep_kl) and fills *layer (free with
 * bk_asap_layer_free); report nullable. BK_ERR_PARAM when no problem was
 * added, BK_ERR_NUMERIC when the system is singular (lambda = 0). */
BK_API bk_status bk_asap_calib_fit(bk_asap_calib *c, bk_asap_fit fit, const bk_asap_kl_config *kl,
                                   bk_asap_layer *layer, bk_asap_fit_report *report);
BK_API void bk_asap_layer_free(bk_asap_layer *layer);

/* Compiled-layer file: magic "BKASAP", format version, the layer, and an
 * FNV-1a 64-bit checksum of everything before it. Written atomically (temp
 * file, rename). Loading checks magic, version (BK_ERR_FORMAT naming both
 * versions), size, checksum, unit rows of theta and finite omega. */
#define BK_ASAP_FILE_VERSION 1
BK_API bk_status bk_asap_save(const char *path, const bk_asap_layer *layer);
BK_API bk_status bk_asap_load(const char *path, bk_asap_layer *layer);

/* Fit target y [B*H*Nq] (cost units, centred, 0 on padded rows) of the
 * teacher in cfg (scale, eps, teacher_iters; d from desc). BK_ERR_OVERFLOW
 * when finite q, k give a non-finite target (scores beyond float32). */
BK_API bk_status bk_asap_teacher_dual(const bk_attn_desc *desc, const bk_asap_config *cfg,
                                      const bk_tensor *q, const bk_tensor *k, float *y);
/* Sliced features X [B*H*Nq*L] (row-major per problem; 0 on padded rows). */
BK_API bk_status bk_asap_features(const bk_attn_desc *desc, const bk_asap_layer *layer,
                                  const bk_tensor *q, const bk_tensor *k, float *X);

typedef struct {
    bk_tensor attn;            /* [B,H,Nq,Nk] attention A (padding: zeros)  */
    float *fhat;               /* [B*H*Nq] predicted dual X omega (cost units) */
    bk_sinkhorn_diag *diag;    /* [B*H]: iters = half-steps (1, 2 or 3),
                                  max row / column errors of A               */
} bk_asap_extras;

BK_API size_t bk_asap_workspace_size(const bk_attn_desc *desc, const bk_asap_layer *layer);
/* Forward only (inference: ASAP has no backward here). desc->d must equal
 * layer->d. Threads and determinism as Sinkhorn attention; an output that
 * overflows float32 from finite inputs is BK_ERR_OVERFLOW (birkhoff/core.h). */
BK_API bk_status bk_asap_forward(const bk_attn_desc *desc, const bk_asap_layer *layer, bk_asap_variant variant,
                                 const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                                 const bk_tensor *out, const bk_asap_extras *extras, void *ws, size_t ws_size);
/* The same closure from a given dual fhat [B*H*Nq] (cost units; padded rows
 * ignored) instead of X omega: the layer supplies scale, eps and, for
 * BK_ASAP_AUTO, the ending (its slices and omega are not used). With the
 * teacher's target (bk_asap_teacher_dual) it reproduces the teacher. */
BK_API bk_status bk_asap_close(const bk_attn_desc *desc, const bk_asap_layer *layer, bk_asap_variant variant,
                               const float *fhat, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                               const bk_tensor *out, const bk_asap_extras *extras, void *ws, size_t ws_size);

/* ASAP's parameters in the operator registry (birkhoff/ops.h, name "asap",
 * forward only): the compiled layer (set in the struct; not a key) and the
 * variant (key "variant": auto, zero, column or row). The registry's
 * forward with {layer, variant} is bk_asap_forward(desc, layer, variant, ...)
 * with the attention as the only extra. Defaults: no layer, BK_ASAP_AUTO. */
typedef struct {
    const bk_asap_layer *layer;
    bk_asap_variant variant;
} bk_asap_forward_config;
BK_API bk_asap_forward_config bk_asap_forward_config_default(void);

/* ---- fidelity of an attention against a reference (e.g. the teacher) ----
 * Per problem over its valid block, then averaged over problems with Lq, Lk
 * >= 1:  out_rmse = sqrt(mean (O - O_ref)^2), out_rms = sqrt(mean O_ref^2),
 * attn_rel_l2 = |A - A_ref|_F / |A_ref|_F, row_err = mean_i |sum_j A_ij - 1|,
 * col_err = mean_j |(Lk/Lq) sum_i A_ij - 1| (the ASAP paper's Delta_row,
 * Delta_col). attn / attn_ref may be NULL (attention metrics then NaN). */
typedef struct {
    double out_rmse, out_rms, attn_rel_l2, row_err, col_err;
    int problems;
} bk_attn_fidelity;
BK_API bk_status bk_attn_compare(const bk_attn_desc *desc, const bk_tensor *out, const bk_tensor *out_ref,
                                 const bk_tensor *attn, const bk_tensor *attn_ref, bk_attn_fidelity *res);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_ASAP_H */
