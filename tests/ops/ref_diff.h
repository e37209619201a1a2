/*
 * ref_diff.h -- naive double-precision reference for differential attention
 * (DiffTransformer). Test-suite only.
 *
 * Independent of the library's formulation: the library builds the combined
 * map A = A1 - lambda A2 once, runs its LSE engine per map and gets dlambda
 * from <dO V^T, A2>; this reference keeps the two attentions apart,
 *     C_r = alpha Q_r K_r^T,  E_r = exp(C_r - rowmax),  A_r = E_r / rowsum(E_r)
 *     O1 = A1 V,  O2 = A2 V,  O = O1 - lambda O2           (r = 1, 2)
 * (Q_1 = Q[:, :d/2], Q_2 = Q[:, d/2:], the same for K), and differentiates
 * by hand through that graph with the softmax Jacobian written out entry by
 * entry: dC_r[i][j] = sum_k Abar_r[i][k] A_r[i][k] (delta_jk - A_r[i][j]),
 * dlambda = -<dO, O2>.
 *
 * Also the paper's re-parameterisation of lambda (the model layer's, not the
 * operator's), so that its derivative is checked here too:
 *     lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,
 *     lambda_init(l) = 0.8 - 0.6 exp(-0.3 (l - 1))   (layer l >= 1).
 *
 * Arrays are contiguous row-major doubles; outputs are overwritten. d must be
 * even, n, m, d, dv >= 1 (abort otherwise).
 */
#ifndef REF_DIFF_H
#define REF_DIFF_H

/* A (n*m, nullable): the combined map A1 - lambda A2; O: n*dv. */
void ref_diff_forward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V, double alpha,
                      double lambda, double *A, double *O);
/* Gradients of L = sum(dO .* O) w.r.t. Q, K, V and lambda (*dlambda). */
void ref_diff_backward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V, double alpha,
                       double lambda, const double *dO, double *dQ, double *dK, double *dV, double *dlambda);

/* Batched, padded: [B][H][N][c] contiguous, lengths ql/kl (NULL = full),
 * lambda [H]; problem (b, h) on its valid Lq x Lk block; padded rows of A, O
 * and the gradients are zero, A is zero on padded keys; padded inputs are
 * never read; Lq = 0 or Lk = 0 gives zeros. dlambda [H]: summed over b. */
void ref_diff_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                              const double *Q, const double *K, const double *V, double alpha, const double *lambda,
                              double *A, double *O);
void ref_diff_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                               const double *Q, const double *K, const double *V, double alpha, const double *lambda,
                               const double *dO, double *dQ, double *dK, double *dV, double *dlambda);

/* The re-parameterisation: lambda from the four vectors (length dh) and
 * lambda_init; its gradient w.r.t. them given dL/dlambda (outputs nullable). */
double ref_diff_lambda_init(int layer);
double ref_diff_lambda(int dh, const double *lq1, const double *lk1, const double *lq2, const double *lk2,
                       double lambda_init);
void ref_diff_lambda_backward(int dh, const double *lq1, const double *lk1, const double *lq2, const double *lk2,
                              double dlambda, double *dlq1, double *dlk1, double *dlq2, double *dlk2);
#endif
