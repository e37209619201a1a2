/*
 * ref_otk.h -- naive double-precision reference for the OTK embedding
 * (Mialon et al. 2021; digest shared/specs/otk.md sections 2-4, header
 * section "OTK embedding" of include/birkhoff.h).
 *
 * Test-suite only. Deliberately independent of the library's formulation:
 * the library uses LAPACK for the anchor Gram matrix and log-domain (or
 * tape-replayed) Sinkhorn; this reference diagonalises the Gram matrix with
 * its own cyclic Jacobi solver, runs Sinkhorn in the plain matrix-scaling
 * form, stores E and every scaling vector u_t, v_t, and differentiates by
 * hand-written reverse mode through the stored quantities.
 *
 * Forward for one set (n valid elements x_i in R^d) and q references z^h
 * (p supports in R^k each):
 *   Feature map, anchors W (k x d), alpha = 1/sigma^2:
 *     r_i = sqrt(max(|x_i|^2, 1e-4)),  xh_i = x_i / r_i,
 *     b_il = r_i exp(alpha (<w_l, xh_i> - 1)),
 *     G = exp(alpha (W W^T - 1)) = V diag(e) V^T   (Jacobi),
 *     t_m = sqrt(max(e_m, 0)) + eta,  M = V diag(1/t) V^T,  psi_i = M b_i.
 *   W == NULL: psi_i = x_i (k == d).
 *   Per reference h:  K_ij = <psi_i, z^h_j>  (times S_ij when pe_double),
 *     E = exp(K/eps - rowmax),  v_0 = 1,  for t = 1..L:
 *       u_t = (1/n) / (E v_{t-1}),  v_t = (1/p) / (E^T u_t),
 *     P = diag(u_L) E diag(v_L)  (columns sum to 1/p exactly),
 *     weights c P_ij S_ij, c = sqrt(p/q) (convention 0, PAPER) or p
 *     (convention 1, REFERENCE);  out[j][h][:] = sum_i c P_ij S_ij psi_i.
 *   Positional encoding S_ij = exp(-((u_i - v_j)/sigma_pos)^2), S = 1 for
 *   pe = 0; pe = 1: PAPER u_i = i/n, v_j = j/p (1-based), REFERENCE
 *   u_i = i/n_pad, v_j = j/p (0-based); pe = 2: elements on a gh x gw grid
 *   (row-major, n = gh gw), supports on an s x s grid (p = s^2); S is the
 *   product over the two axes of the Gaussians of (1-based row / axis
 *   length) differences, for both conventions.
 *
 * Backward: gradients of L = sum(dout .* out) with respect to x, z and W,
 * through all L iterations. Through M = h(G), h(e) = 1/(sqrt(max(e,0)) +
 * eta): isqrt_grad 0 (EXACT) uses the Daleckii-Krein formula with the
 * divided differences of h; isqrt_grad 1 (the reference code's formula)
 * uses -1/((t_a + t_b) t_a t_b), which is the true gradient only at eta = 0.
 * A clamped element (|x_i|^2 < 1e-4) has the constant r_i = 0.01.
 *
 * Limits: sizes n, d, q, p, k, L >= 1; eps > 0; with anchors sigma > 0 and
 * eta >= 0; without anchors k == d; pe in {0,1,2} with sigma_pos > 0;
 * n_pad >= n for the REFERENCE 1-D PE; gh gw == n and p a perfect square
 * for pe = 2. A zero or non-finite Sinkhorn normaliser (E underflow: a
 * spread of K/eps above about 700 in a row), a zero t_m (eta = 0 with a
 * non-positive Gram eigenvalue), invalid sizes and allocation failures
 * abort with a message.
 *
 * All arrays are contiguous row-major double arrays; outputs are overwritten.
 */
#ifndef REF_OTK_H
#define REF_OTK_H

typedef struct {
    int n, d, q, p, k;   /* valid elements, input dim, references, supports, feature dim */
    const double *W;     /* [k][d] anchors; NULL = identity map (k == d) */
    double sigma, eta, eps;
    int L;               /* Sinkhorn iterations (u then v) */
    int convention;      /* 0 PAPER (c = sqrt(p/q)), 1 REFERENCE (c = p) */
    int pe;              /* 0 none, 1 1-D, 2 2-D */
    double sigma_pos;
    int pe_double;       /* 1: S also multiplies K before the exponential */
    int gh, gw;          /* pe = 2 element grid */
    int n_pad;           /* padded length, REFERENCE 1-D PE only (= n unpadded) */
    int isqrt_grad;      /* 0 EXACT, 1 REFERENCE formula */
} ref_otk_cfg;

/* psi (n*k) of the n elements of x (n*d). */
void ref_otk_features(const ref_otk_cfg *c, const double *x, double *psi);

/* The anchor Gram matrix G = exp(alpha (W W^T - 1)) (k*k, may be NULL) and
 * M = V diag(1/(sqrt(max(e,0)) + eta)) V^T (k*k). Needs W != NULL. */
void ref_otk_isqrt(const ref_otk_cfg *c, double *G, double *M);

/* x: n*d, z: q*p*k, out: p*q*k; plan (may be NULL): q*n*p, the weights
 * c P_ij S_ij. */
void ref_otk_forward(const ref_otk_cfg *c, const double *x, const double *z, double *out,
                     double *plan);

/* dout: p*q*k. dx: n*d, dz: q*p*k, dW: k*d (ignored when W is NULL); any
 * output may be NULL. */
void ref_otk_backward(const ref_otk_cfg *c, const double *x, const double *z, const double *dout,
                      double *dx, double *dz, double *dW);

/* Batched + padded: c->n is the padded length N; len[b] in [1, N] (NULL =
 * N). x [B][N][d] (rows >= len[b] never read; may hold NaN), z [q][p][k]
 * shared, out/dout [B][p][q][k], plan [B][q][N][p] (zero on padded rows,
 * may be NULL), dx [B][N][d] (zero on padded rows), dz [q][p][k] and dW
 * [k][d] summed over the batch. Set b is the single-set problem with n =
 * len[b]; the REFERENCE 1-D PE uses n_pad = N (c->n_pad is ignored). */
void ref_otk_forward_batched(const ref_otk_cfg *c, int B, const int *len, const double *x,
                             const double *z, double *out, double *plan);
void ref_otk_backward_batched(const ref_otk_cfg *c, int B, const int *len, const double *x,
                              const double *z, const double *dout, double *dx, double *dz,
                              double *dW);

#endif /* REF_OTK_H */
