/*
 * ref_asap.h -- naive double-precision reference for ASAP, a trained
 * Sinkhorn attention layer compiled into a loop-free operator (Tran,
 * Milkert, Hyde 2026; digest shared/specs/asap.md sections 1-4 and 7,
 * header section "ASAP: a trained Sinkhorn layer" of include/birkhoff.h).
 *
 * Test-suite only. Deliberately independent of the library's formulation:
 * the library runs every half-step in logit (score) coordinates on the
 * shared LSE engine; this reference runs the teacher both in the log domain
 * and as plain matrix scaling, runs the online operator in COST coordinates
 * with explicit duals (C_ij = s |q_i - k_j|^2 / 2 formed from the
 * differences), computes the 1-D potentials both by the prefix-sum formula
 * and by a north-west-corner transport plan with tree potentials, and solves
 * every linear system with its own Cholesky factorisation (no BLAS/LAPACK).
 *
 * One problem: n valid queries, m valid keys (no padding here; the C tests
 * truncate), Q [n x d], K [m x d], V [m x dv], scale s > 0, eps > 0.
 *   Z_ij = (s / eps) q_i . k_j (logits),  a = 1/n,  b = 1/m,
 *   rho_i = s |q_i|^2 / 2,  kappa_j = s |k_j|^2 / 2,
 *   C_ij = s |q_i - k_j|^2 / 2 = rho_i + kappa_j - s q_i . k_j.
 *
 * Teacher (S >= 1 half-steps, row first, from f = g = 0, logit units):
 *   odd t:  f_i = log a - LSE_j (Z_ij + g_j);  even t: g_j = log b - LSE_i (Z_ij + f_i);
 *   P = exp(Z + f + g) (g = 0 when S = 1), A = n P.
 * Multiplicative form: M = exp(Z - max Z); odd t: M_ij /= n rowsum_i(M);
 *   even t: M_ij /= m colsum_j(M); A = n M (the same A).
 * Closure-ready source dual (S >= 2): the f after half-step S - 1 (even S)
 * or S - 2 (odd S). Fit target (cost units): y_i = eps f_i + rho_i, then
 * centred (minus its mean over the n queries).
 *
 * Sliced potentials: slice bank theta [L x d] used as given (the caller
 * supplies unit rows). Slice l: a_i = sqrt(s) theta_l . q_i,
 * b_j = sqrt(s) theta_l . k_j; a and b sorted ascending independently
 * (stable insertion sort of indices), a_(r) the r-th smallest (r = 0..n-1),
 * b_(t) the t-th smallest;
 *   sigma(r) = floor(((r + 1) m - 1) / n)   (last key of query rank r),
 *   phi_0 = 0,  phi_r = phi_{r-1} + b_(sigma(r-1)) (a_(r) - a_(r-1)),
 *   f_(r) = a_(r)^2 / 2 - phi_r,
 * scattered back to token order (the query of rank r gets f_(r)) and
 * centred over the n queries: X[i][l]. The 1-D c-transform is
 *   h_j = min_i [ (a_i - b_j)^2 / 2 - f_i ].
 * Second, independent 1-D route: the north-west-corner plan on the sorted
 * atoms (integer units: each query m units, each key n units, P = flow /
 * (n m)), which is optimal for a convex cost in 1-D, and tree potentials
 * with f_(0) = a_(0)^2 / 2, f_r + h_t = c(a_r, b_t) on every support edge,
 * and, where query r and key t are exhausted together (degenerate plan),
 * the next query is linked through key t (zero-flow edge): the same choice
 * as the formula above, so both routes give the same (uncentred) f.
 *
 * Online operator, predicted dual fhat (cost units), all in cost units:
 *   T_K(F)_j = eps log b - eps LSE_i ((-C_ij + F_i) / eps),
 *   T_Q(G)_i = eps log a - eps LSE_j ((-C_ij + G_j) / eps),
 *   G0 = T_K(fhat), F1 = T_Q(G0), G1 = T_K(F1),
 *   ZERO:   P = P_C(fhat, G0);  ROW: P = P_C(F1, G0);  COLUMN: P = P_C(F1, G1),
 *   P_C(F, G)_ij = exp((-C_ij + F_i + G_j) / eps),  A = n P,  O = A V.
 * (Equal to the header's logit recipe with u = (fhat - rho)/eps,
 * g = (G - kappa)/eps, f = (F - rho)/eps.)
 *
 * Calibration over M problems (each its own n, m, Q, K and given X, y):
 *   LS:  omega = (sum X^T X + lambda I)^-1 sum X^T y   (own Cholesky),
 *        rmse = sqrt(RSS / total rows),  r2 = 1 - RSS / sum y^2.
 *   KL:  J(w) = sum_m [ eps sum_j b LSE_i (Z_ij + u_i) - <r_m, X_m w> ] + lambda/2 |w|^2,
 *        u = (X w - rho)/eps, r_m = row sums of the one-sided plan
 *        P_C(y_m, T_K(y_m)); evaluated as the cost-space LSE plus
 *        sum_j b kappa_j / eps inside (the same value).
 *        grad = sum X^T (rhat - r) + lambda w  (rhat: row sums of
 *        Phat = P_C(Xw, T_K(Xw))),
 *        Hess = (1/eps) sum [X^T diag(rhat) X - W diag(b) W^T] + lambda I,
 *        W = X^T Pi, Pi_ij = Phat_ij / b.
 *        Damped Newton: from w0 (NULL: the LS solution with the same
 *        lambda; 0 if that system is singular), direction -H^-1 grad, stop
 *        when decrement^2/2 = -grad . dir / 2 < tol (checked before each
 *        step), Armijo backtracking (c1 = 1e-4, halving, at most 60 halvings).
 *
 * Fidelity of one problem: out_rmse = sqrt(mean (O - Oref)^2), out_rms =
 * sqrt(mean Oref^2), attn_rel_l2 = |A - Aref|_F / |Aref|_F, row_err =
 * mean_i |sum_j A_ij - 1|, col_err = mean_j |(m/n) sum_i A_ij - 1|.
 *
 * Limits: n, m, d, dv, L, M >= 1; s > 0; eps > 0; the teacher dual needs
 * S >= 2. Invalid arguments and allocation failures abort with a message;
 * a non-finite or zero normaliser also aborts (inputs are expected to be
 * moderate: |Z| well below 700).
 *
 * All arrays are contiguous row-major double arrays; outputs are overwritten.
 */
#ifndef REF_ASAP_H
#define REF_ASAP_H

/* Variants, numbered as bk_asap_variant. */
enum { REF_ASAP_ZERO = 1, REF_ASAP_COLUMN = 2, REF_ASAP_ROW = 3 };

/* Planted-bug flags (self-test sensitivity checks only; 0 = correct):
 * SIGMA uses b_(sigma(r)) instead of b_(sigma(r-1)) in the prefix sum
 * (clamped to m - 1); NOCENTRE skips the centring of the features. */
enum { REF_ASAP_BUG_SIGMA = 1, REF_ASAP_BUG_NOCENTRE = 2 };

/* ---- teacher ---- */

/* Log-domain teacher. f_hist [S x n] / g_hist [S x m]: f and g after each
 * half-step t = 1..S (row t-1); either may be NULL. P, A [n x m] (either may
 * be NULL). */
void ref_asap_teacher(int n, int m, int d, const double *Q, const double *K, double s, double eps,
                      int S, double *f_hist, double *g_hist, double *P, double *A);
/* Multiplicative (matrix scaling) teacher: A [n x m]. */
void ref_asap_teacher_mult(int n, int m, int d, const double *Q, const double *K, double s,
                           double eps, int S, double *A);
/* Closure-ready dual (S >= 2): y [n] the centred fit target (cost units);
 * f [n] (may be NULL) the raw closure-ready f in logit units. */
void ref_asap_teacher_dual(int n, int m, int d, const double *Q, const double *K, double s,
                           double eps, int S, double *y, double *f);
/* rho [n] = s |q_i|^2 / 2. */
void ref_asap_rho(int n, int d, const double *Q, double s, double *rho);

/* ---- sliced potentials ---- */

/* sigma(r) = floor(((r+1) m - 1) / n). */
int ref_asap_sigma(int r, int n, int m);
/* Stable ascending argsort of x [len] into idx (insertion sort). */
void ref_asap_argsort(int len, const double *x, int *idx);
/* 1-D potential f [n] in token order, NOT centred (bug: 0 or
 * REF_ASAP_BUG_SIGMA). */
void ref_asap_potential_1d(int n, const double *a, int m, const double *b, int bug, double *f);
/* c-transform h [m] (token order) of f [n]: h_j = min_i (a_i-b_j)^2/2 - f_i. */
void ref_asap_ctransform_1d(int n, const double *a, const double *f, int m, const double *b,
                            double *h);
/* North-west-corner route: f [n], h [m] (token order, tree potentials, f of
 * the smallest a = a^2/2), support edges (query token, key token, mass) in
 * er, et, ew (each of capacity n + m - 1, any may be NULL), their count in
 * *ne (may be NULL). Returns the primal cost sum P_rt (a_r - b_t)^2 / 2. */
double ref_asap_nw_1d(int n, const double *a, int m, const double *b, double *f, double *h,
                      int *er, int *et, double *ew, int *ne);
/* Sliced features X [n x L] (bug: 0 or REF_ASAP_BUG_* flags OR-ed). */
void ref_asap_features(int n, int m, int d, const double *Q, const double *K, double s, int L,
                       const double *theta, int bug, double *X);

/* ---- online operator (cost coordinates) ---- */

/* C [n x m] = s |q_i - k_j|^2 / 2. */
void ref_asap_cost(int n, int m, int d, const double *Q, const double *K, double s, double *C);
/* G [m] = T_K(F) on cost C. */
void ref_asap_tk(int n, int m, const double *C, double eps, const double *F, double *G);
/* F [n] = T_Q(G) on cost C. */
void ref_asap_tq(int n, int m, const double *C, double eps, const double *G, double *F);
/* P [n x m] = exp((-C + F + G) / eps). */
void ref_asap_plan(int n, int m, const double *C, double eps, const double *F, const double *G,
                   double *P);
/* The operator for fhat [n]: A [n x m] (may be NULL), O [n x dv] (NULL or
 * V NULL: skipped); G0 [m], F1 [n], G1 [m] (each may be NULL) the duals
 * (F1, G1 are computed for every variant). */
void ref_asap_apply(int n, int m, int d, int dv, const double *Q, const double *K, const double *V,
                    double s, double eps, const double *fhat, int variant, double *A, double *O,
                    double *G0, double *F1, double *G1);

/* ---- fidelity ---- */
typedef struct {
    double out_rmse, out_rms, attn_rel_l2, row_err, col_err;
} ref_asap_fid;
/* O, Oref [n x dv] (both NULL: out metrics NaN); A, Aref [n x m]: A NULL ->
 * attention metrics NaN; Aref NULL -> attn_rel_l2 NaN. */
void ref_asap_fidelity(int n, int m, int dv, const double *O, const double *Oref, const double *A,
                       const double *Aref, ref_asap_fid *res);

/* ---- dense linear algebra (own) ---- */

/* In-place lower Cholesky of the symmetric k x k A (upper triangle left
 * as is); 0 on success, -1 when a pivot is <= 1e-14 x the largest diagonal
 * entry (or not finite). */
int ref_asap_chol(int k, double *A);
/* Solves (L L^T) x = x in place with the factor from ref_asap_chol. */
void ref_asap_chol_solve(int k, const double *Lf, double *x);

/* ---- calibration ---- */
typedef struct {
    int n, m;             /* valid queries, keys */
    const double *Q, *K;  /* [n x d], [m x d] */
    const double *X;      /* [n x L] sliced features */
    const double *y;      /* [n] fit target (cost units) */
} ref_asap_prob;

/* omega [L]; rmse, r2 may be NULL. 0 on success, -1 singular. */
int ref_asap_fit_ls(int M, const ref_asap_prob *pr, int L, double lambda, double *omega,
                    double *rmse, double *r2);
/* J at w; grad [L] and hess [L x L] may be NULL. */
double ref_asap_kl_eval(int M, const ref_asap_prob *pr, int d, int L, double s, double eps,
                        double lambda, const double *w, double *grad, double *hess);
/* Damped Newton (see above): w [L]; iters, J0 (J at the start), J (final)
 * may be NULL. Returns 1 converged, 0 not (max_iters reached, a failed
 * line search or a non-positive-definite Hessian). */
int ref_asap_fit_kl(int M, const ref_asap_prob *pr, int d, int L, double s, double eps,
                    double lambda, const double *w0, int max_iters, double tol, double *w,
                    int *iters, double *J0, double *J);

#endif /* REF_ASAP_H */
