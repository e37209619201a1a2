/*
 * ref_lot.h -- naive double-precision reference for LOT (LOTFormer) attention.
 *
 * Test-suite only. Deliberately independent of the library's formulation:
 * the library works with log-domain potentials and a factored glue; this
 * reference uses the plain matrix-scaling form of Sinkhorn, stores every
 * intermediate matrix of both problems, forms the dense n x m attention
 * matrix, and differentiates by hand-written reverse mode through the stored
 * matrices (spec: docs lotformer.md sections 1-2).
 *
 * Forward for one problem (n queries, m keys, r pivots):
 *     p0  = softmax(theta / temp)                           (r)
 *     K1  = exp(s Q Z^T / eps - max)                        (n x r)
 *     K2  = exp(s Z K^T / eps - max)                        (r x m)
 *     Sinkhorn on K1 with row marginal 1/n, column marginal p0,
 *     Sinkhorn on K2 with row marginal p0,  column marginal 1/m;
 *     each T half-steps, half-step t (1-based) odd = row scaling
 *     (M <- diag(target / rowsum M) M), even = column scaling.
 *     G1, G2 = the results;  A = n G1 diag(1/p0) G2  (n x m);  O = A V.
 * For odd T the rows of A sum to 1 exactly; for even T the columns sum to
 * n/m exactly; both hold in the limit T -> infinity.
 *
 * Limits: the matrix form needs exp(. - max) not to underflow to a zero row
 * or column (a logit spread below about 700 within every row and column of
 * each kernel). A zero or non-finite normaliser aborts with a message, as do
 * allocation failures and invalid sizes (n, m, d, dv, r, T >= 1; temp, eps
 * > 0 for the single-problem calls).
 *
 * All arrays are contiguous row-major double arrays; outputs are overwritten.
 */
#ifndef REF_LOT_H
#define REF_LOT_H

/* Q: n*d, K: m*d, V: m*dv, Z: r*d, theta: r. A: n*m (may be NULL), O: n*dv. */
void ref_lot_forward(int n, int m, int d, int dv, int r, const double *Q, const double *K,
                     const double *V, const double *Z, const double *theta, double temp, int T,
                     double eps, double s, double *A, double *O);

/* Gradients of L = sum(dO .* O) (dO: n*dv) w.r.t. Q (n*d), K (m*d), V (m*dv),
 * Z (r*d) and theta (r). Reverse mode through every stored scaling step and
 * through p0 as marginal of both problems and in the glue diag(1/p0). */
void ref_lot_backward(int n, int m, int d, int dv, int r, const double *Q, const double *K,
                      const double *V, const double *Z, const double *theta, double temp, int T,
                      double eps, double s, const double *dO, double *dQ, double *dK,
                      double *dV, double *dZ, double *dtheta);

/* Batched + padded wrappers. Q [B][H][Nq][d], K [B][H][Nk][d], V [B][H][Nk][dv],
 * O/dO [B][H][Nq][dv], A [B][H][Nq][Nk] (may be NULL), Z [H][r][d],
 * theta [H][r] (shared over the batch). ql[b] in [0,Nq], kl[b] in [0,Nk] are
 * the valid lengths (NULL = full). Problem (b,h) is solved on its valid
 * prefix (n = ql[b], m = kl[b]); padded rows of A and O are zero, A is zero
 * on padded keys, padded input entries are never read (may hold NaN);
 * n = 0 or m = 0 gives zeros. Gradients: dQ/dK/dV zero in padded rows (and
 * everywhere for an empty problem); dZ [H][r][d] and dtheta [H][r] are
 * summed over the batch. */
void ref_lot_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, int r, const int *ql,
                             const int *kl, const double *Q, const double *K, const double *V,
                             const double *Z, const double *theta, double temp, int T,
                             double eps, double s, double *A, double *O);
void ref_lot_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, int r, const int *ql,
                              const int *kl, const double *Q, const double *K, const double *V,
                              const double *Z, const double *theta, double temp, int T,
                              double eps, double s, const double *dO, double *dQ, double *dK,
                              double *dV, double *dZ, double *dtheta);

#endif /* REF_LOT_H */
