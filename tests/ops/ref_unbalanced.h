/*
 * ref_unbalanced.h -- naive double-precision reference for unbalanced
 * (column-damped) Sinkhorn attention. Test-suite only.
 *
 * Independent of the library's log-domain engine: the scaling form with the
 * kernel K = exp(C), explicit scaling vectors u (rows) and v (columns)
 * stored for every half-step, and hand-written reverse mode through them.
 *
 * One problem (n queries, m keys), a = 1/n, b = 1/m, kappa in (0, 1]:
 *     C = alpha Q K^T,  K = exp(C),  v^0 = 1
 *     t odd : u = a ./ (K v)                   (row step, exact rows)
 *     t even: v = (b ./ (K^T u))^kappa         (damped column step)
 *     A_ij = u_i K_ij v_j / a_i  (rows sum to 1 after a row step),  O = A V
 * kappa = 1 is Sinkhorn attention; kappa = rho / (rho + eps) is the
 * semi-unbalanced problem with a KL penalty rho on the column marginal.
 * Needs exp(C) finite and non-zero sums (|C| below ~700). Aborts on misuse.
 * Arrays are contiguous row-major doubles; outputs are overwritten.
 */
#ifndef REF_UNBALANCED_H
#define REF_UNBALANCED_H

/* A: n*m (may be NULL), O: n*dv. */
void ref_unb_forward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V, double alpha,
                     int S, double kappa, double *A, double *O);
/* Gradients of L = sum(dO .* O) w.r.t. Q, K, V. */
void ref_unb_backward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V, double alpha,
                      int S, double kappa, const double *dO, double *dQ, double *dK, double *dV);
/* Batched, padded: [B][H][N][c] contiguous, lengths ql/kl (NULL = full);
 * problem (b, h) on its valid Lq x Lk block; padded rows of A, O and the
 * gradients are zero, A is zero on padded keys; padded inputs never read. */
void ref_unb_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                             const double *Q, const double *K, const double *V, double alpha, int S, double kappa,
                             double *A, double *O);
void ref_unb_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                              const double *Q, const double *K, const double *V, double alpha, int S, double kappa,
                              const double *dO, double *dQ, double *dK, double *dV);
#endif
