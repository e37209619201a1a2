/*
 * ref_esp.h -- naive double-precision reference for ESP attention
 * (Expected Sliced transport Plans; ESPFormer digest, sections 1, 2 and 5).
 *
 * Test-suite only. Deliberately independent of the library's formulation:
 * the library never forms the N x N soft permutations or the lifted plans;
 * this reference builds every matrix densely (P_l, R_l, U_l, C, G: O(L N^3)),
 * stores them all, and differentiates by hand-written reverse mode through
 * the stored matrices.
 *
 * Forward for one problem (n queries, m keys, d head dim, dv value dim):
 *     q~ = scale Q, k~ = scale K
 *     Theta (L x d, one slice per row; NULL = axis-aligned, Theta = I, L = d)
 *     a^l = q~ theta_l (n), b^l = k~ theta_l (m)
 *     hard sort: P_l[r,i] = 1 iff i = alpha(r), alpha the stable ascending
 *                argsort of a^l; R_l (m x m) likewise from b^l
 *     soft sort: P_l[r,i] = exp(-(a_i - s_r)^2/t) / sum_i' exp(-(a_i' - s_r)^2/t),
 *                s_r = a_{alpha(r)} (a sorted ascending); R_l likewise
 *     W[r,s] = max(0, min((r+1)/n, (s+1)/m) - max(r/n, s/m))  (north-west
 *              corner plan between uniform measures; I/n when n = m)
 *     U_l = P_l^T W R_l (n x m)
 *     C_ij = ||q~_i - k~_j||^2 (cost 0) or ||q~_i - k~_j|| (cost 1)
 *     D_l = sum_ij C_ij U_l[i,j]
 *     sigma = softmax_l(-tau (D - min_l D))
 *     G = sum_l sigma_l U_l;  A = n G (out_scale 0, "rows") or G (1, "paper")
 *     O = A V
 *
 * Backward: gradients of L = sum(dO .* O). Hard sort treats the permutations
 * as constants (gradient reaches V, and Q, K only through the cost, i.e. via
 * D and sigma; dTheta = 0). Soft sort differentiates everything, including the
 * sorted values s_r = a_{alpha(r)} (the argsort itself is piecewise constant).
 * Euclidean cost has gradient 0 at zero distance.
 *
 * Limits: single-problem sizes n, m, d, dv >= 1 (abort otherwise); soft sort
 * needs t > 0; scale and tau finite; theta != NULL needs L >= 1; theta == NULL
 * needs L == 0 or L == d (the number of slices is then d). Non-finite
 * projections abort with a message, as do allocation failures.
 *
 * All arrays are contiguous row-major double arrays; outputs are overwritten.
 */
#ifndef REF_ESP_H
#define REF_ESP_H

typedef struct {
    int sort;            /* 0 hard, 1 soft */
    double t;            /* SoftSort temperature (soft only), > 0 */
    double tau;          /* slice-mixing inverse temperature */
    double scale;        /* q~ = scale Q, k~ = scale K */
    int cost;            /* 0 squared Euclidean, 1 Euclidean */
    int out_scale;       /* 0 rows (A = n G), 1 paper (A = G) */
    int L;               /* number of slices when theta != NULL */
    const double *theta; /* L x d, or NULL => identity (L = d) */
} ref_esp_cfg;

/* Number of slices the configuration uses for head dim d (d when theta is
 * NULL, c->L otherwise). */
int ref_esp_num_slices(int d, const ref_esp_cfg *c);

/* Q: n*d, K: m*d, V: m*dv. Outputs: A (n*m, may be NULL), O (n*dv),
 * sigma (L, may be NULL), D (L, may be NULL). */
void ref_esp_forward(int n, int m, int d, int dv, const double *Q, const double *K,
                     const double *V, const ref_esp_cfg *c, double *A, double *O,
                     double *sigma, double *D);

/* Gradients of L = sum(dO .* O): dQ (n*d), dK (m*d), dV (m*dv), and dTheta
 * (L*d, may be NULL). With theta == NULL, dTheta receives the gradient with
 * respect to Theta evaluated at Theta = I (d x d). Hard sort: dTheta = 0. */
void ref_esp_backward(int n, int m, int d, int dv, const double *Q, const double *K,
                      const double *V, const ref_esp_cfg *c, const double *dO, double *dQ,
                      double *dK, double *dV, double *dTheta);

/* Batched + padded wrappers. Tensors are contiguous [B][H][N][c]:
 * Q [B][H][Nq][d], K [B][H][Nk][d], V [B][H][Nk][dv], O/dO [B][H][Nq][dv],
 * A [B][H][Nq][Nk] (may be NULL), sigma [B][H][L] (may be NULL).
 * ql[b] in [0,Nq], kl[b] in [0,Nk] are the valid lengths (NULL = full).
 * Problem (b,h) is solved on its valid Lq x Lk prefix; padded query rows of
 * A and O are zero, A is zero on padded keys, padded input entries are never
 * read (they may hold NaN). Lq = 0 or Lk = 0 gives zeros (sigma zeros too).
 * Gradients are zero in padded rows (and everywhere when Lq = 0 or Lk = 0).
 * dTheta (L x d, may be NULL) is the sum over all problems. */
void ref_esp_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql,
                             const int *kl, const double *Q, const double *K, const double *V,
                             const ref_esp_cfg *c, double *A, double *O, double *sigma);
void ref_esp_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql,
                              const int *kl, const double *Q, const double *K, const double *V,
                              const ref_esp_cfg *c, const double *dO, double *dQ, double *dK,
                              double *dV, double *dTheta);

#endif /* REF_ESP_H */
