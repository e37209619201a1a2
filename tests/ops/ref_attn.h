/*
 * ref_attn.h -- naive double-precision reference for Sinkhorn attention.
 *
 * Test-suite only. Deliberately independent of the library's formulation:
 * the library works with log-domain potentials and replays the forward in its
 * backward; this reference uses the plain matrix-normalisation form of the
 * paper (eq. 3), stores every intermediate matrix K^0..K^S, and differentiates
 * by hand-written reverse mode through those stored matrices.
 *
 * Forward for one problem (n queries, m keys):
 *     C   = alpha * Q K^T                         (n x m)
 *     K^0 = exp(C - max_ij C_ij)                  (the global shift cancels)
 *     t odd : K^t = N_R(K^{t-1}), rows sum to 1
 *     t even: K^t = N_C(K^{t-1}), columns sum to n/m
 *     A   = K^S,  O = A V
 * i.e. A = n*P with P the plan of marginals 1/n (rows) and 1/m (columns).
 * S = 1 is softmax attention.
 *
 * Limits: the matrix form needs exp(C - max C) not to underflow to a zero
 * row or column, i.e. a logit spread of less than about 700 within every row
 * and column. A zero (or non-finite) normaliser aborts with a message.
 * Allocation failures abort with a message. Sizes must satisfy n, m, d,
 * dv >= 1 and S >= 1 for the single-problem calls (abort otherwise).
 *
 * All arrays are contiguous row-major double arrays; outputs are overwritten.
 */
#ifndef REF_ATTN_H
#define REF_ATTN_H

/* A: n*m, O: n*dv. Q: n*d, K: m*d, V: m*dv. */
void ref_sinkhorn_forward(int n, int m, int d, int dv, const double *Q, const double *K,
                          const double *V, double alpha, int S, double *A, double *O);

/* Gradients of L = sum(dO .* O) w.r.t. Q (n*d), K (m*d), V (m*dv). dO: n*dv. */
void ref_sinkhorn_backward(int n, int m, int d, int dv, const double *Q, const double *K,
                           const double *V, double alpha, int S, const double *dO,
                           double *dQ, double *dK, double *dV);

/* Absolute marginal errors of A (n x m):
 * row_err = max_i |rowsum_i - 1|, col_err = max_j |colsum_j - n/m|.
 * Either output pointer may be NULL. */
void ref_marginal_errors(int n, int m, const double *A, double *row_err, double *col_err);

/* Converged Sinkhorn: half-steps (row first) until, right after a row step,
 * both marginal errors are < tol, or until the last odd step <= max_steps
 * (max_steps >= 1). Returns the number of half-steps used (always odd);
 * A and O are those of ref_sinkhorn_forward with that S. */
int ref_sinkhorn_converge(int n, int m, int d, int dv, const double *Q, const double *K,
                          const double *V, double alpha, double tol, int max_steps,
                          double *A, double *O);

/* Batched + padded wrappers with the library's semantics. Tensors are
 * contiguous [B][H][N][c]: Q [B][H][Nq][d], K [B][H][Nk][d], V [B][H][Nk][dv],
 * O/dO [B][H][Nq][dv], A [B][H][Nq][Nk]. ql[b] in [0,Nq], kl[b] in [0,Nk]
 * are the valid lengths (NULL = full). Problem (b,h) is solved on its valid
 * Lq x Lk block (marginals 1/Lq, 1/Lk, A = Lq*P); padded query rows of A and O
 * are zero, A is zero on padded keys, padded input entries are never read
 * (they may hold NaN). Lq = 0 or Lk = 0 gives zeros. A may be NULL.
 * Gradients are zero in padded rows (and everywhere when Lq = 0 or Lk = 0). */
void ref_attn_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql,
                              const int *kl, const double *Q, const double *K, const double *V,
                              double alpha, int S, double *A, double *O);
void ref_attn_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql,
                               const int *kl, const double *Q, const double *K, const double *V,
                               double alpha, int S, const double *dO, double *dQ, double *dK,
                               double *dV);

#endif /* REF_ATTN_H */
