/* birkhoff/esp.h -- ESP attention (ESPFormer).
 * Part of the public API; include <birkhoff.h> (all of it) or this file. The
 * conventions every function follows (layouts, padding, accuracy, threads and
 * determinism, workspace and tape) are at the top of birkhoff/core.h. */
#ifndef BIRKHOFF_ESP_H
#define BIRKHOFF_ESP_H

#include "attn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* ESP attention (ESPFormer; docs/ALGORITHMS.md section 4)                   */
/* ------------------------------------------------------------------------ */
/* Per problem (n = Lq queries, m = Lk keys), with q~ = s q, k~ = s k
 * (s = scale, 0 selecting 1/sqrt(d)) and slices theta_l (rows of Theta):
 *   a^l = q~ theta_l, b^l = k~ theta_l; P_l, R_l the sort matrices of a^l, b^l
 *   (hard: exact stable ascending argsort; soft: SoftSort rows
 *   P[r,i] = softmax_i(-(a_i - sort(a)_r)^2 / t), row r a sorted position,
 *   column i a token: each row sums to 1, the columns are free); W the 1-D OT
 *   plan between uniform measures on n and m ranks (north-west corner; I/n
 *   when n = m); U_l = P_l^T W R_l (n x m); D_l = sum_ij c(q~_i, k~_j) U_l[i,j]
 *   with c = squared (default) or plain Euclidean distance;
 *   sigma = softmax(-tau (D - min D)); G = sum_l sigma_l U_l;
 *   A = n G or A = G (the paper's scaling); O = A V.
 * Margins of A = n G: under hard sort rows sum to 1 and columns to n/m
 * exactly (n = m: A is doubly stochastic, for any tau). Under soft sort
 * neither is exact: the row sums are sum_l sigma_l (column sums of P_l) and
 * the column sums n/m sum_l sigma_l (column sums of R_l); only the total mass
 * n is; they tend to the hard margins as t -> 0 (bk_esp_diag reports both).
 * Hard sort never forms an n x m matrix: O(L (n+m) log + L (n+m)(d+dv)) time,
 * O(L (n+m)) memory. Soft sort streams the slices: one slice's n x n and
 * m x m soft permutations at a time; O(L (n^2+m^2)(d+dv)) for the squared
 * cost, O(L n m (n+m)) for the Euclidean cost (it needs U_l densely).
 * Under hard sort, Q and K get gradient only through D and sigma, so none at
 * tau = 0; the permutations are locally constant. Soft sort gives the full
 * gradient to Q, K, V and Theta. SoftSort entries below 1e-30 are flushed to
 * zero (below float rounding of the result) and the soft path runs with the
 * FPU's flush-to-zero mode, so subnormals never slow it down.
 * Units of t and tau (docs/ALGORITHMS.md section 4.3 has the table): t and
 * tau act on the scaled q~, k~, and D_l is a mean over a plan of mass 1.
 * - The reference code (Anon4142/ESPFormer), whose values the paper's
 *   Tables 8-14 list, also scales q, k by 1/sqrt(d) and uses the SoftSort
 *   distance (x - y)^2: its t is our t (at scale = 0). Its cost is Euclidean
 *   and its plans have no 1/N (D summed over N pairs), so its temperature T
 *   is our tau = T * N with cost = EUCLID, out_scale = ROWS (then the outputs
 *   are equal). With the squared cost no tau reproduces it except tau = 0
 *   (uniform sigma: the cost then plays no part).
 * - Algorithm 1 as printed (raw q, k; squared cost; plans of mass 1) is ours
 *   with scale = 1; at scale s: tau = tau_paper / s^2, and t = t_paper s^2
 *   if its SoftSort distance is (x - y)^2 (the paper names none). */
typedef enum { BK_ESP_HARD = 0, BK_ESP_SOFT = 1 } bk_esp_sort;
typedef enum { BK_ESP_COST_SQ = 0, BK_ESP_COST_EUCLID = 1 } bk_esp_cost;
typedef enum { BK_ESP_SCALE_ROWS = 0, BK_ESP_SCALE_PAPER = 1 } bk_esp_scale;

typedef struct {
    bk_esp_sort sort;       /* hard (inference) or soft (training)            */
    float t;                /* SoftSort temperature, > 0 (soft only), on the
                               scaled projections (units: see above)         */
    float tau;              /* slice-mixing inverse temperature, finite, >= 0;
                               multiplies the mean matched cost of q~, k~    */
    float scale;            /* q, k scale; 0 selects 1/sqrt(d)                */
    bk_esp_cost cost;       /* squared (paper) or Euclidean (reference code)  */
    bk_esp_scale out_scale; /* A = n G (rows sum to 1 under hard sort; the
                               default) or the paper's A = G (1/n)           */
    int L;                  /* 0: axis-aligned slices (L = d, Theta = I);
                               > 0: L slices from theta, or random unit
                               directions from seed when theta is NULL       */
    const float *theta;     /* [L x d] row-major slice matrix or NULL. Rows
                               are used as given (not normalised).           */
    uint64_t seed;          /* for random slices                              */
} bk_esp_config;

/* hard sort, t = 1e-3, tau = 1, scale = 1/sqrt(d), squared cost, rows, L = d */
BK_API bk_esp_config bk_esp_config_default(void);
/* Number of slices the parameters give for head dim d (0 if invalid). */
BK_API int bk_esp_num_slices(const bk_esp_config *p, int d);
/* Fills theta [L x d] with the slices the operator uses (identity, the
 * caller's, or the seeded random unit directions). */
BK_API bk_status bk_esp_slices(const bk_esp_config *p, int d, float *theta);
/* The paper's annealing: t0 * factor^epoch (factor 0.8 in the paper).
 * "initial soft" = soft with t0; "sharp soft" = soft with the annealed t;
 * "hard" = sort = BK_ESP_HARD. */
BK_API float bk_esp_anneal(float t0, float factor, int epoch);

typedef struct {
    float row_err;  /* max_i |n rowsum_i(G) - 1|                             */
    float col_err;  /* max_j |m colsum_j(G) - 1|. Both 0 up to rounding for
                       hard sort; under soft sort neither margin is exact
                       (only the SoftSort factors are row-stochastic), so
                       they measure the gap to a doubly-stochastic plan      */
} bk_esp_diag;

typedef struct {
    bk_tensor attn;     /* [B,H,Nq,Nk] dense attention A (small N: it is formed
                           only when asked for)                               */
    float *sigma;       /* [B*H*L] slice weights                              */
    float *D;           /* [B*H*L] slice costs                                */
    bk_esp_diag *diag;  /* [B*H]                                              */
} bk_esp_extras;

BK_API size_t bk_esp_workspace_size(const bk_attn_desc *desc, const bk_esp_config *p);
BK_API size_t bk_esp_tape_size(const bk_attn_desc *desc, const bk_esp_config *p);
BK_API bk_status bk_esp_forward(const bk_attn_desc *desc, const bk_esp_config *p,
                                const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                                const bk_tensor *out, void *tape, const bk_esp_extras *extras,
                                void *ws, size_t ws_size);
/* dq, dk, dv overwritten; dtheta [L x d] (nullable) is overwritten with the
 * gradient w.r.t. the slices summed over all problems (zero under hard sort). tape
 * from the forward, or NULL to recompute it. */
BK_API bk_status bk_esp_backward(const bk_attn_desc *desc, const bk_esp_config *p,
                                 const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                                 const bk_tensor *dout, const void *tape, const bk_tensor *dq,
                                 const bk_tensor *dk, const bk_tensor *dv, float *dtheta,
                                 void *ws, size_t ws_size);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_ESP_H */
