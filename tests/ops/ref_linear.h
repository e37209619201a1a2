/*
 * ref_linear.h -- naive double-precision references for kernelised
 * attention: the Linear Transformer and Performer's FAVOR+. Test-suite only.
 *
 * Independent of the library's formulation: the library never forms the
 * n x m matrix (it sums S = Pk^T [V, 1] once and applies it); these
 * references build the implied attention explicitly,
 *     Kx_ij = phi_q(q_i) . phi_k(k_j),  A_ij = Kx_ij / (sum_j' Kx_ij' + eps_den),
 *     O = A V,
 * and differentiate by hand through that graph entry by entry:
 *     dA = dO V^T,  dKx_ij = (dA_ij - sum_j' dA_ij' A_ij') / (r_i + eps_den),
 *     dphi_q(q_i) = sum_j dKx_ij phi_k(k_j),  dphi_k(k_j) = sum_i dKx_ij phi_q(q_i),
 * then through the feature maps:
 *   linear:    phi(x) = elu(x) + 1 elementwise (F = d), eps_den = eps;
 *   performer: with the projection W (F x d, given), c the data scale,
 *              ratio = F^-1/2, u_f(x) = c w_f . x - c^2 |x|^2 / 2,
 *              phi_q(q_i)_f = ratio (exp(u_f(q_i) - a_i) + eps), a_i = max_f c w_f . q_i,
 *              phi_k(k_j)_f = ratio (exp(u_f(k_j) - a) + eps),   a = max_{j,f} c w_f . k_j,
 *              eps_den = 0, the stabilisers a_i, a constants of the backward.
 *
 * Arrays are contiguous row-major doubles; outputs are overwritten; n, m,
 * d, dv >= 1 (abort otherwise).
 */
#ifndef REF_LINEAR_H
#define REF_LINEAR_H

typedef struct {
    int performer;     /* 0: linear (phi = elu + 1), 1: FAVOR+           */
    double eps;        /* linear: eps_den; performer: the feature eps     */
    int F;             /* performer: features (rows of W)                 */
    const double *W;   /* performer: F x d projection                     */
    double c;          /* performer: the data scale (sqrt of the score scale) */
} ref_linear_cfg;

/* A (n*m, nullable): the implied attention; O: n*dv */
void ref_linear_forward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V,
                        const ref_linear_cfg *cfg, double *A, double *O);
/* gradients of L = sum(dO .* O) w.r.t. Q, K, V */
void ref_linear_backward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V,
                         const ref_linear_cfg *cfg, const double *dO, double *dQ, double *dK, double *dV);

/* Batched, padded: [B][H][N][c] contiguous, lengths ql/kl (NULL = full);
 * problem (b, h) on its valid Lq x Lk block; padded rows of A, O and the
 * gradients are zero, A is zero on padded keys; padded inputs are never
 * read; Lq = 0 or Lk = 0 gives zeros. */
void ref_linear_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                                const double *Q, const double *K, const double *V, const ref_linear_cfg *cfg,
                                double *A, double *O);
void ref_linear_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                                 const double *Q, const double *K, const double *V, const ref_linear_cfg *cfg,
                                 const double *dO, double *dQ, double *dK, double *dV);
#endif
