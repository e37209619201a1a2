/* implicit.c -- implicit-differentiation backward of the converged Sinkhorn
 * plan (docs/ALGORITHMS.md, "Implicit gradient").
 *
 * At the fixed point P = exp(C + f (+) g) with P 1 = a, P^T 1 = b, and for an
 * upstream Abar (A = diag(1/a) P):  E = Abar .* A,  r = E 1,  c = E^T 1,
 *     (diag b - A^T diag(a) A + (1/m) 1 1^T) beta = c - A^T r
 *     alpha = r / a - A beta
 *     Cbar  = E - diag(a) A .* (alpha 1^T + 1 beta^T).
 * The rank-one term removes the gauge null vector 1 (the right-hand side sums
 * to zero when rows are exact, so the solution is unchanged). Solved in
 * double with LAPACK's symmetric indefinite solver. */
#include "internal.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <string.h>

#define BK_LWORK_PER_COL 64

size_t bki_sk_implicit_scratch(int n, int m)
{
    return (size_t)n * m + (size_t)m * m + (size_t)BK_LWORK_PER_COL * m + 4 * (size_t)m + 2 * (size_t)n + 16;
}

bk_status bki_sk_backward_implicit(const bki_sk_problem *pb, const float *A, ptrdiff_t lda, float *G,
                                   ptrdiff_t ldg, double *ds)
{
    const int n = pb->n, m = pb->m;
    double *Ad = ds;                          /* n x m: sqrt(a_i) A_ij      */
    double *Mx = Ad + (size_t)n * m;          /* m x m                      */
    double *work = Mx + (size_t)m * m;        /* lwork                      */
    double *beta = work + (size_t)BK_LWORK_PER_COL * m;
    double *cvec = beta + m, *bvec = cvec + m;
    lapack_int *ipiv = (lapack_int *)(bvec + m); /* m ints fit in m doubles */
    double *r = (double *)(bvec + 2 * (size_t)m), *av = r + n;
    const double la_u = -log((double)n), lb_u = -log((double)m);

    for (int i = 0; i < n; i++) av[i] = exp(pb->la ? (double)pb->la[i] : la_u);
    for (int j = 0; j < m; j++) {
        bvec[j] = exp(pb->lb ? (double)pb->lb[j] : lb_u);
        cvec[j] = 0.0;
    }
    for (int i = 0; i < n; i++) {
        const float *Ai = A + (ptrdiff_t)i * lda;
        float *Gi = G + (ptrdiff_t)i * ldg;
        double ri = 0.0, sa = sqrt(av[i]);
        for (int j = 0; j < m; j++) {
            Gi[j] *= Ai[j]; /* E */
            ri += Gi[j];
            cvec[j] += Gi[j];
            Ad[(size_t)i * m + j] = sa * Ai[j];
        }
        r[i] = ri;
    }
    /* Mx = diag(b) + 1/m 11^T - Ad^T Ad  (lower triangle used) */
    for (int j = 0; j < m; j++)
        for (int l = 0; l < m; l++) Mx[(size_t)j * m + l] = 1.0 / m + (j == l ? bvec[j] : 0.0);
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasTrans, m, n, -1.0, Ad, m, 1.0, Mx, m);
    /* rhs = c - A^T r */
    for (int j = 0; j < m; j++) beta[j] = cvec[j];
    for (int i = 0; i < n; i++) {
        const float *Ai = A + (ptrdiff_t)i * lda;
        for (int j = 0; j < m; j++) beta[j] -= (double)Ai[j] * r[i];
    }
    lapack_int info = LAPACKE_dsysv_work(LAPACK_ROW_MAJOR, 'L', m, 1, Mx, m, ipiv, beta, 1, work,
                                         (lapack_int)BK_LWORK_PER_COL * m);
    if (info != 0) return bki_fail(BK_ERR_NUMERIC, "implicit backward: linear solve failed (info=%d)", (int)info);
    for (int i = 0; i < n; i++) {
        const float *Ai = A + (ptrdiff_t)i * lda;
        float *Gi = G + (ptrdiff_t)i * ldg;
        double ab = 0.0;
        for (int j = 0; j < m; j++) ab += (double)Ai[j] * beta[j];
        double alpha = r[i] / av[i] - ab;
        for (int j = 0; j < m; j++) Gi[j] = (float)(Gi[j] - av[i] * Ai[j] * (alpha + beta[j]));
    }
    return BK_OK;
}
