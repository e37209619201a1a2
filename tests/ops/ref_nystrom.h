/*
 * ref_nystrom.h -- naive double-precision reference for Nystrom attention
 * (Nystromformer). Test-suite only.
 *
 * Independent of the library's formulation: the library runs the reverse
 * mode by hand through the products, the pseudo-inverse iterations and its
 * LSE engine's softmaxes; this reference evaluates the forward with plain
 * loops over dual numbers (value, tangent) and gets each gradient entry by
 * FORWARD-mode differentiation: the tangent of one input entry set to 1, the
 * whole forward run, dL/dx = sum(dO .* dO/dx). No transposed product, no
 * softmax Jacobian and no adjoint of the iteration is written here, so a
 * wrong reverse-mode derivation in the library cannot be repeated.
 *
 * The forward, per problem (n queries, m keys, r = min(l, n, m)):
 *     Ql_j = mean of Q rows [floor(j n / r), floor((j + 1) n / r)), Kl_j alike
 *     F = softmax_rows(a Q Kl^T), A = softmax_rows(a Ql Kl^T),
 *     B = softmax_rows(a Ql K^T)
 *     Z_0 = A^T / max_j sum_i A_ij,
 *     Z_{t+1} = 1/4 Z_t (13 I - A Z_t (15 I - A Z_t (7 I - A Z_t)))
 *     O = F Z_T B V        (and the dense attention F Z_T B)
 *
 * Arrays are contiguous row-major doubles; outputs are overwritten. n, m, d,
 * dv, l >= 1, iters >= 0 (abort otherwise).
 */
#ifndef REF_NYSTROM_H
#define REF_NYSTROM_H

/* Att (n*m, nullable): the dense attention F Z_T B; O: n*dv. */
void ref_nystrom_forward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V, int l,
                         int iters, double alpha, double *Att, double *O);
/* Gradients of L = sum(dO .* O) w.r.t. Q, K, V (forward mode, one input
 * entry at a time: small problems only). */
void ref_nystrom_backward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V, int l,
                          int iters, double alpha, const double *dO, double *dQ, double *dK, double *dV);

/* Batched, padded: [B][H][N][c] contiguous, lengths ql/kl (NULL = full);
 * problem (b, h) on its valid Lq x Lk block; padded rows of Att, O and the
 * gradients are zero, Att is zero on padded keys; padded inputs are never
 * read; Lq = 0 or Lk = 0 gives zeros. */
void ref_nystrom_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                                 const double *Q, const double *K, const double *V, int l, int iters, double alpha,
                                 double *Att, double *O);
void ref_nystrom_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                                  const double *Q, const double *K, const double *V, int l, int iters, double alpha,
                                  const double *dO, double *dQ, double *dK, double *dV);
#endif
