/*
 * ref_asap_selftest.c -- checks the naive ASAP reference (ref_asap.c) on
 * random problems (n != m, n or m in {1, 2, 3}, tied queries/keys/
 * projections), numbered as the digest's section 7 properties:
 *   1. log-domain teacher == matrix-scaling teacher (S = 1..8); S = 1 is the
 *      row softmax.
 *   2. parity: even S column sums of A = n/m, odd S row sums = 1.
 *   3. ZERO (and COLUMN) columns exact, ROW rows exact, for any fhat.
 *   4. shift invariance: T_K(F + c) = T_K(F) - c, T_Q(G - c) = T_Q(G) + c,
 *      plans of all variants unchanged by fhat + c.
 *   7. two-sided: intermediate R = P_C(F1, G0) rows exact, final columns
 *      exact, final rows not exact (generic problem).
 *   8. ||P1 - mu||_1 <= ||P - R||_1 <= e^{delta/eps} - 1.
 *   9. |fhat - f|_inf <= alpha: every dual moves <= alpha and
 *      e^{-2a/eps} <= Phat/P <= e^{2a/eps} (also a = inf_c |fhat - f - c|).
 *  11. KL objective: gradient and Hessian vs central differences,
 *      convexity (PSD Hessian, midpoint), J - eps KL(P^T || Phat^0) constant
 *      in w, Newton converges to a stationary point, recovers w on
 *      realisable targets.
 *  12. LS oracle inequality; normal equations; rmse / r2.
 *  15. permutation equivariance of X, y and the operator (ties included).
 *  16. 1-D potential: prefix-sum formula == north-west-corner tree
 *      potentials, c-transform == NW key potential, feasibility, tightness
 *      on the support, dual value == primal cost (== (1/2n) sum (a-b)^2 for
 *      n == m), sorted plan no worse than random matchings, sigma(r).
 *  17. exact-dual reproduction: even S: ZERO(y) == teacher(S), COLUMN(y) ==
 *      teacher(S + 2); odd S >= 3: ROW(y) == teacher(S).
 *  19. LS recovers omega exactly on synthetic linear targets (lambda = 0).
 *  Also: cost-coordinate operator == score-coordinate recipe (column / row
 *  normalisations of exp((s q.k + fhat - rho)/eps)) to 1e-12; fidelity
 *  metrics on hand-made inputs; planted bugs (sigma off by one, no
 *  centring, the final f instead of the closure-ready one, Hessian without
 *  the W term) are detected by the corresponding checks.
 * One line per check, then "N passed, N failed"; exit 1 on any failure.
 */
#include "ref_asap.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_selftest_util.h"

static double maxd(double a, double b)
{
    return (a > b || isnan(a)) ? a : b;
}

/* ------------------------------------------------------------------------ */
/* Problems                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct {
    int n, m, d, dv;
    double s, eps;
    double *Q, *K, *V;
} prob;

typedef struct {
    int n, m, d, dv;
    double s, eps, amp;
    int ties; /* quantised entries, duplicated first query/key rows */
} pcase;

static const pcase cases[] = {
    {1, 1, 2, 2, 0.7, 1.0, 1.0, 0},
    {1, 4, 3, 2, 0.57735, 1.0, 1.5, 0},
    {2, 2, 2, 1, 0.7, 0.5, 1.0, 0},
    {3, 2, 3, 2, 0.5, 1.0, 1.5, 0},
    {2, 5, 2, 3, 0.8, 2.0, 1.5, 0},
    {3, 3, 1, 1, 1.0, 1.0, 1.0, 1},
    {5, 5, 4, 3, 0.5, 1.0, 1.5, 0},
    {7, 4, 3, 2, 0.57735, 0.7, 1.5, 1},
    {4, 9, 3, 2, 0.6, 1.0, 1.2, 0},
    {8, 8, 4, 3, 0.5, 1.0, 2.0, 1},
    {12, 7, 5, 2, 0.45, 1.3, 1.5, 0},
    {6, 10, 2, 2, 1.0, 1.0, 1.0, 1},
    {30, 23, 8, 4, 0.35, 1.0, 1.5, 0},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static void prob_make(prob *p, lcg *g, const pcase *c)
{
    p->n = c->n; p->m = c->m; p->d = c->d; p->dv = c->dv;
    p->s = c->s; p->eps = c->eps;
    p->Q = dalloc((size_t)c->n * c->d);
    p->K = dalloc((size_t)c->m * c->d);
    p->V = dalloc((size_t)c->m * c->dv);
    fill(g, p->Q, (size_t)c->n * c->d, -c->amp, c->amp);
    fill(g, p->K, (size_t)c->m * c->d, -c->amp, c->amp);
    fill(g, p->V, (size_t)c->m * c->dv, -1.0, 1.0);
    if (c->ties) {
        for (int k = 0; k < c->n * c->d; k++) p->Q[k] = 0.5 * c->amp * round(2.0 * p->Q[k] / c->amp);
        for (int k = 0; k < c->m * c->d; k++) p->K[k] = 0.5 * c->amp * round(2.0 * p->K[k] / c->amp);
        if (c->n >= 3) memcpy(p->Q + (size_t)(c->n - 1) * c->d, p->Q, (size_t)c->d * sizeof(double));
        if (c->m >= 2) memcpy(p->K + (size_t)(c->m - 1) * c->d, p->K, (size_t)c->d * sizeof(double));
    }
}

static void prob_free(prob *p)
{
    free(p->Q); free(p->K); free(p->V);
}

static void unit_rows(lcg *g, double *W, int k, int d)
{
    for (int l = 0; l < k; l++) {
        double nr = 0.0;
        do {
            nr = 0.0;
            for (int c = 0; c < d; c++) {
                W[l * d + c] = lcg_uniform(g, -1.0, 1.0);
                nr += W[l * d + c] * W[l * d + c];
            }
        } while (nr < 1e-2);
        for (int c = 0; c < d; c++) W[l * d + c] /= sqrt(nr);
    }
}

/* Axis-aligned rows (cycling over the d axes) -- ties in projections. */
static void axis_rows(double *W, int k, int d)
{
    memset(W, 0, (size_t)k * d * sizeof(double));
    for (int l = 0; l < k; l++) W[l * d + (l % d)] = (l / d) % 2 ? -1.0 : 1.0;
}

static void perm(lcg *g, int *p, int len)
{
    for (int i = 0; i < len; i++) p[i] = i;
    for (int i = len - 1; i > 0; i--) {
        int j = (int)lcg_uniform(g, 0.0, (double)(i + 1));
        if (j > i) j = i;
        int t = p[i]; p[i] = p[j]; p[j] = t;
    }
}

/* dst row k = src row p[k] (rows of width w). */
static void permute_rows(const double *src, double *dst, const int *p, int len, int w)
{
    for (int k = 0; k < len; k++) memcpy(dst + (size_t)k * w, src + (size_t)p[k] * w, (size_t)w * sizeof(double));
}

static double colsum_err(const double *A, int n, int m, double target)
{
    double e = 0.0;
    for (int j = 0; j < m; j++) {
        double s = 0.0;
        for (int i = 0; i < n; i++) s += A[(size_t)i * m + j];
        e = maxd(e, fabs(s - target));
    }
    return e;
}

static double rowsum_err(const double *A, int n, int m, double target)
{
    double e = 0.0;
    for (int i = 0; i < n; i++) {
        double s = 0.0;
        for (int j = 0; j < m; j++) s += A[(size_t)i * m + j];
        e = maxd(e, fabs(s - target));
    }
    return e;
}

static double l1_rowdev(const double *P, int n, int m)
{
    double e = 0.0;
    for (int i = 0; i < n; i++) {
        double s = 0.0;
        for (int j = 0; j < m; j++) s += P[(size_t)i * m + j];
        e += fabs(s - 1.0 / n);
    }
    return e;
}

static double dotv(const double *x, const double *y, int len)
{
    double a = 0.0;
    for (int i = 0; i < len; i++) a += x[i] * y[i];
    return a;
}

/* ------------------------------------------------------------------------ */
/* Score-coordinate recipe (independent of the reference's cost route)      */
/* ------------------------------------------------------------------------ */

/* A = normalisations of exp((s q.k + fhat - rho)/eps): columns to n/m, then
 * (ROW, COLUMN) rows to 1, then (COLUMN) columns to n/m. O = A V. */
static void score_recipe(const prob *p, const double *fhat, int variant, double *A, double *O)
{
    const int n = p->n, m = p->m, d = p->d;
    double mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        const double rho = 0.5 * p->s * dotv(p->Q + i * d, p->Q + i * d, d);
        for (int j = 0; j < m; j++) {
            A[i * m + j] = (p->s * dotv(p->Q + i * d, p->K + j * d, d) + fhat[i] - rho) / p->eps;
            if (A[i * m + j] > mx) mx = A[i * m + j];
        }
    }
    for (int k = 0; k < n * m; k++) A[k] = exp(A[k] - mx);
    const int steps = variant == REF_ASAP_ZERO ? 1 : variant == REF_ASAP_ROW ? 2 : 3;
    for (int t = 0; t < steps; t++) {
        if (t % 2 == 0) {
            for (int j = 0; j < m; j++) {
                double s = 0.0;
                for (int i = 0; i < n; i++) s += A[i * m + j];
                for (int i = 0; i < n; i++) A[i * m + j] *= ((double)n / m) / s;
            }
        } else {
            for (int i = 0; i < n; i++) {
                double s = 0.0;
                for (int j = 0; j < m; j++) s += A[i * m + j];
                for (int j = 0; j < m; j++) A[i * m + j] /= s;
            }
        }
    }
    for (int i = 0; i < n; i++)
        for (int c = 0; c < p->dv; c++) {
            double acc = 0.0;
            for (int j = 0; j < m; j++) acc += A[i * m + j] * p->V[j * p->dv + c];
            O[i * p->dv + c] = acc;
        }
}

static void apply_A(const prob *p, const double *fhat, int variant, double *A)
{
    ref_asap_apply(p->n, p->m, p->d, p->dv, p->Q, p->K, p->V, p->s, p->eps, fhat, variant, A, NULL,
                   NULL, NULL, NULL);
}

static void teacher_A(const prob *p, int S, double *A)
{
    ref_asap_teacher(p->n, p->m, p->d, p->Q, p->K, p->s, p->eps, S, NULL, NULL, NULL, A);
}

/* ------------------------------------------------------------------------ */
/* 1, 2. Teacher                                                            */
/* ------------------------------------------------------------------------ */

static void check_teacher(lcg *g)
{
    double e_eq = 0.0, e_par = 0.0, e_soft = 0.0, e_hist = 0.0;
    for (int ci = 0; ci < NCASES; ci++) {
        prob p;
        prob_make(&p, g, &cases[ci]);
        const int n = p.n, m = p.m;
        double *A = dalloc((size_t)n * m), *B = dalloc((size_t)n * m), *P = dalloc((size_t)n * m);
        double *fh = dalloc((size_t)8 * n), *gh = dalloc((size_t)8 * m);
        for (int S = 1; S <= 8; S++) {
            ref_asap_teacher(n, m, p.d, p.Q, p.K, p.s, p.eps, S, fh, gh, P, A);
            ref_asap_teacher_mult(n, m, p.d, p.Q, p.K, p.s, p.eps, S, B);
            e_eq = maxd(e_eq, max_abs_diff(A, B, (size_t)n * m));
            for (int k = 0; k < n * m; k++) e_hist = maxd(e_hist, fabs(A[k] - n * P[k]));
            if (S % 2 == 0)
                e_par = maxd(e_par, colsum_err(A, n, m, (double)n / m));
            else
                e_par = maxd(e_par, rowsum_err(A, n, m, 1.0));
            /* the stored potentials reproduce the plan: P = exp(Z + f_S + g_S) */
            for (int i = 0; i < n; i++)
                for (int j = 0; j < m; j++) {
                    const double z = p.s / p.eps * dotv(p.Q + i * p.d, p.K + j * p.d, p.d);
                    e_hist = maxd(e_hist, fabs(P[i * m + j] -
                                               exp(z + fh[(S - 1) * n + i] + gh[(S - 1) * m + j])));
                }
            if (S == 1) {
                for (int i = 0; i < n; i++) {
                    double mx = -INFINITY, s = 0.0;
                    for (int j = 0; j < m; j++) {
                        B[i * m + j] = p.s / p.eps * dotv(p.Q + i * p.d, p.K + j * p.d, p.d);
                        mx = maxd(mx, B[i * m + j]);
                    }
                    for (int j = 0; j < m; j++) s += (B[i * m + j] = exp(B[i * m + j] - mx));
                    for (int j = 0; j < m; j++) B[i * m + j] /= s;
                }
                e_soft = maxd(e_soft, max_abs_diff(A, B, (size_t)n * m));
            }
        }
        free(A); free(B); free(P); free(fh); free(gh);
        prob_free(&p);
    }
    th_check(e_eq <= 1e-13, "1 teacher log-domain == matrix scaling (S=1..8, all cases)",
          "max |A_log - A_mult| %.2e", e_eq);
    th_check(e_soft <= 1e-14, "1 teacher S=1 == row softmax", "max diff %.2e", e_soft);
    th_check(e_hist <= 1e-14, "1 teacher A = n P = n exp(Z + f_S + g_S) (stored history)",
          "max diff %.2e", e_hist);
    th_check(e_par <= 1e-13, "2 parity: even S cols of A = n/m, odd S rows = 1",
          "max marginal error %.2e", e_par);
}

/* ------------------------------------------------------------------------ */
/* 3, 4, 7, 8, score recipe. Online operator for arbitrary fhat             */
/* ------------------------------------------------------------------------ */

static void check_operator(lcg *g)
{
    double e_col0 = 0.0, e_colC = 0.0, e_rowR = 0.0, e_tk = 0.0, e_tq = 0.0, e_plan = 0.0;
    double e_R = 0.0, e_fin = 0.0, rowerr_generic = 0.0, e_b1 = -INFINITY, e_b2 = -INFINITY;
    double e_rec = 0.0;
    for (int ci = 0; ci < NCASES; ci++) {
        prob p;
        prob_make(&p, g, &cases[ci]);
        const int n = p.n, m = p.m, nm = n * m;
        double *C = dalloc((size_t)nm), *A = dalloc((size_t)nm), *B = dalloc((size_t)nm);
        double *O = dalloc((size_t)n * p.dv), *O2 = dalloc((size_t)n * p.dv);
        double *fh = dalloc((size_t)n), *fc = dalloc((size_t)n);
        double *G0 = dalloc((size_t)m), *F1 = dalloc((size_t)n), *G1 = dalloc((size_t)m);
        double *H0 = dalloc((size_t)m), *E1 = dalloc((size_t)n), *H1 = dalloc((size_t)m);
        double *R = dalloc((size_t)nm), *P = dalloc((size_t)nm), *t1 = dalloc((size_t)n);
        ref_asap_cost(n, m, p.d, p.Q, p.K, p.s, C);
        for (int rep = 0; rep < 4; rep++) {
            const double amp = rep == 3 ? 6.0 : 1.5;
            fill(g, fh, (size_t)n, -amp, amp);
            /* 3: marginals per variant */
            apply_A(&p, fh, REF_ASAP_ZERO, A);
            e_col0 = maxd(e_col0, colsum_err(A, n, m, (double)n / m));
            apply_A(&p, fh, REF_ASAP_COLUMN, A);
            e_colC = maxd(e_colC, colsum_err(A, n, m, (double)n / m));
            apply_A(&p, fh, REF_ASAP_ROW, A);
            e_rowR = maxd(e_rowR, rowsum_err(A, n, m, 1.0));
            /* score recipe == cost route, A and O, every variant */
            for (int v = 1; v <= 3; v++) {
                ref_asap_apply(n, m, p.d, p.dv, p.Q, p.K, p.V, p.s, p.eps, fh, v, A, O, NULL, NULL, NULL);
                score_recipe(&p, fh, v, B, O2);
                e_rec = maxd(e_rec, max_abs_diff(A, B, (size_t)nm));
                e_rec = maxd(e_rec, max_abs_diff(O, O2, (size_t)n * p.dv));
            }
            /* 4: shift invariance */
            const double c = rep % 2 ? -3.1 : 0.731;
            for (int i = 0; i < n; i++) fc[i] = fh[i] + c;
            ref_asap_apply(n, m, p.d, p.dv, p.Q, p.K, NULL, p.s, p.eps, fh, REF_ASAP_ZERO, NULL, NULL, G0, F1, G1);
            ref_asap_apply(n, m, p.d, p.dv, p.Q, p.K, NULL, p.s, p.eps, fc, REF_ASAP_ZERO, NULL, NULL, H0, E1, H1);
            for (int j = 0; j < m; j++) e_tk = maxd(e_tk, fabs(H0[j] - (G0[j] - c)));
            for (int i = 0; i < n; i++) e_tk = maxd(e_tk, fabs(E1[i] - (F1[i] + c)));
            for (int j = 0; j < m; j++) e_tk = maxd(e_tk, fabs(H1[j] - (G1[j] - c)));
            for (int j = 0; j < m; j++) H0[j] = G0[j] - c;
            ref_asap_tq(n, m, C, p.eps, H0, t1);
            for (int i = 0; i < n; i++) e_tq = maxd(e_tq, fabs(t1[i] - (F1[i] + c)));
            for (int v = 1; v <= 3; v++) {
                apply_A(&p, fh, v, A);
                apply_A(&p, fc, v, B);
                e_plan = maxd(e_plan, max_abs_diff(A, B, (size_t)nm));
            }
            /* 7: two-sided structure */
            ref_asap_plan(n, m, C, p.eps, F1, G0, R);
            ref_asap_plan(n, m, C, p.eps, F1, G1, P);
            e_R = maxd(e_R, rowsum_err(R, n, m, 1.0 / n));
            e_fin = maxd(e_fin, colsum_err(P, n, m, 1.0 / m));
            if (ci == 6) rowerr_generic = maxd(rowerr_generic, rowsum_err(P, n, m, 1.0 / n));
            /* 8: row-error bound */
            double delta = 0.0, pr = 0.0;
            for (int j = 0; j < m; j++) delta = maxd(delta, fabs(G1[j] - G0[j]));
            for (int k = 0; k < nm; k++) pr += fabs(P[k] - R[k]);
            const double rowl1 = l1_rowdev(P, n, m), bound = expm1(delta / p.eps);
            e_b1 = maxd(e_b1, rowl1 - pr);
            e_b2 = maxd(e_b2, pr - bound);
        }
        free(C); free(A); free(B); free(O); free(O2); free(fh); free(fc); free(G0); free(F1); free(G1);
        free(H0); free(E1); free(H1); free(R); free(P); free(t1);
        prob_free(&p);
    }
    th_check(e_col0 <= 1e-13, "3 ZERO: columns of A = n/m for any fhat", "max error %.2e", e_col0);
    th_check(e_colC <= 1e-13, "3 COLUMN: columns of A = n/m", "max error %.2e", e_colC);
    th_check(e_rowR <= 1e-13, "3 ROW: rows of A = 1", "max error %.2e", e_rowR);
    th_check(e_rec <= 1e-12, "cost-coordinate operator == score recipe (A, O; 3 variants)",
          "max diff %.2e", e_rec);
    th_check(e_tk <= 1e-12, "4 T_K(F+c) = T_K(F)-c (G0, G1), F1 shifts by +c", "max error %.2e", e_tk);
    th_check(e_tq <= 1e-12, "4 T_Q(G-c) = T_Q(G)+c", "max error %.2e", e_tq);
    th_check(e_plan <= 1e-13, "4 plans unchanged by fhat + c (3 variants)", "max diff %.2e", e_plan);
    th_check(e_R <= 1e-14, "7 intermediate R = P_C(F1, G0) rows = 1/n", "max error %.2e", e_R);
    th_check(e_fin <= 1e-14, "7 final P_C(F1, G1) columns = 1/m", "max error %.2e", e_fin);
    th_check(rowerr_generic > 1e-6, "7 final rows not exact (generic 5x5)", "max row error %.2e",
          rowerr_generic);
    th_check(e_b1 <= 1e-14 && e_b2 <= 1e-14, "8 |P1-mu|_1 <= |P-R|_1 <= e^{delta/eps}-1",
          "max slack violations %.2e, %.2e (<= 0 is fine)", e_b1, e_b2);
}

/* ------------------------------------------------------------------------ */
/* 9. Stability                                                             */
/* ------------------------------------------------------------------------ */

static void check_stability(lcg *g)
{
    double e_dual = -INFINITY, e_ratio = -INFINITY, e_ratio2 = -INFINITY;
    for (int ci = 0; ci < NCASES; ci++) {
        prob p;
        prob_make(&p, g, &cases[ci]);
        const int n = p.n, m = p.m, nm = n * m;
        double *y = dalloc((size_t)n), *fh = dalloc((size_t)n);
        double *A = dalloc((size_t)nm), *B = dalloc((size_t)nm);
        double *d0[3], *d1[3];
        for (int k = 0; k < 3; k++) {
            d0[k] = dalloc((size_t)(n > m ? n : m));
            d1[k] = dalloc((size_t)(n > m ? n : m));
        }
        ref_asap_teacher_dual(n, m, p.d, p.Q, p.K, p.s, p.eps, 4 + ci % 2, y, NULL);
        for (int rep = 0; rep < 3; rep++) {
            const double alpha = rep == 0 ? 0.05 : rep == 1 ? 0.4 : 1.5;
            const double shift = rep == 2 ? 4.0 : 0.0; /* large constant: only the spread counts */
            double dmin = INFINITY, dmax = -INFINITY;
            for (int i = 0; i < n; i++) {
                const double dl = lcg_uniform(g, -alpha, alpha);
                fh[i] = y[i] + dl + shift;
                dmin = dl < dmin ? dl : dmin;
                dmax = dl > dmax ? dl : dmax;
            }
            const double a_inf = alpha + shift, a_spread = 0.5 * (dmax - dmin);
            ref_asap_apply(n, m, p.d, p.dv, p.Q, p.K, NULL, p.s, p.eps, y, REF_ASAP_ZERO, NULL, NULL, d0[0], d0[1], d0[2]);
            ref_asap_apply(n, m, p.d, p.dv, p.Q, p.K, NULL, p.s, p.eps, fh, REF_ASAP_ZERO, NULL, NULL, d1[0], d1[1], d1[2]);
            for (int k = 0; k < 3; k++) {
                const int len = k == 1 ? n : m;
                for (int t = 0; t < len; t++)
                    e_dual = maxd(e_dual, fabs(d1[k][t] - d0[k][t]) - a_inf);
            }
            for (int v = 1; v <= 3; v++) {
                apply_A(&p, y, v, A);
                apply_A(&p, fh, v, B);
                for (int k = 0; k < nm; k++) {
                    const double lr = fabs(log(B[k] / A[k]));
                    e_ratio = maxd(e_ratio, lr - 2.0 * a_inf / p.eps);
                    e_ratio2 = maxd(e_ratio2, lr - 2.0 * a_spread / p.eps);
                }
            }
        }
        for (int k = 0; k < 3; k++) { free(d0[k]); free(d1[k]); }
        free(y); free(fh); free(A); free(B);
        prob_free(&p);
    }
    th_check(e_dual <= 1e-12, "9 |fhat-f|_inf <= alpha: G0, F1, G1 move <= alpha",
          "max (|move| - alpha) %.2e", e_dual);
    th_check(e_ratio <= 1e-12, "9 e^{-2a/eps} <= Phat/P <= e^{2a/eps} (3 variants)",
          "max (|log ratio| - 2a/eps) %.2e", e_ratio);
    th_check(e_ratio2 <= 1e-12, "9 ratio bound with a = inf_c |fhat - f - c|_inf",
          "max (|log ratio| - 2a/eps) %.2e", e_ratio2);
}

/* ------------------------------------------------------------------------ */
/* 17. Exact-dual reproduction (+ planted wrong half-step)                  */
/* ------------------------------------------------------------------------ */

static void check_reproduction(lcg *g)
{
    double e_zero = 0.0, e_col = 0.0, e_row = 0.0, e_y = 0.0, e_cen = 0.0, e_zodd = 0.0;
    double d_col_vs_S = INFINITY, d_bug = 0.0;
    for (int ci = 0; ci < NCASES; ci++) {
        prob p;
        prob_make(&p, g, &cases[ci]);
        const int n = p.n, m = p.m, nm = n * m;
        const int generic = n >= 2 && m >= 2;
        double *y = dalloc((size_t)n), *f = dalloc((size_t)n), *A = dalloc((size_t)nm), *T = dalloc((size_t)nm);
        double *fh = dalloc((size_t)9 * n);
        for (int S = 2; S <= 7; S++) {
            ref_asap_teacher_dual(n, m, p.d, p.Q, p.K, p.s, p.eps, S, y, f);
            /* y = eps f + rho - mean, recomputed here */
            double mean = 0.0, sy = 0.0;
            for (int i = 0; i < n; i++) mean += p.eps * f[i] + 0.5 * p.s * dotv(p.Q + i * p.d, p.Q + i * p.d, p.d);
            mean /= n;
            for (int i = 0; i < n; i++) {
                e_y = maxd(e_y, fabs(y[i] - (p.eps * f[i] + 0.5 * p.s * dotv(p.Q + i * p.d, p.Q + i * p.d, p.d) - mean)));
                sy += y[i];
            }
            e_cen = maxd(e_cen, fabs(sy));
            ref_asap_teacher(n, m, p.d, p.Q, p.K, p.s, p.eps, S, fh, NULL, NULL, NULL);
            const double *fexp = fh + (size_t)(S % 2 == 0 ? S - 2 : S - 3) * n;
            e_y = maxd(e_y, max_abs_diff(f, fexp, (size_t)n));
            if (S % 2 == 0) {
                apply_A(&p, y, REF_ASAP_ZERO, A);
                teacher_A(&p, S, T);
                e_zero = maxd(e_zero, max_abs_diff(A, T, (size_t)nm));
                apply_A(&p, y, REF_ASAP_COLUMN, A);
                if (generic && S == 2) d_col_vs_S = fmin(d_col_vs_S, max_abs_diff(A, T, (size_t)nm));
                teacher_A(&p, S + 2, T);
                e_col = maxd(e_col, max_abs_diff(A, T, (size_t)nm));
            } else if (S >= 3) {
                apply_A(&p, y, REF_ASAP_ROW, A);
                teacher_A(&p, S, T);
                e_row = maxd(e_row, max_abs_diff(A, T, (size_t)nm));
                /* planted bug: the f left at the end of the loop (after half-step
                 * S) instead of after S-2 (note: f after S-1 equals f after S-2,
                 * a column step does not touch f) */
                if (generic) {
                    double *yb = dalloc((size_t)n), mb = 0.0;
                    for (int i = 0; i < n; i++) {
                        yb[i] = p.eps * fh[(size_t)(S - 1) * n + i] + 0.5 * p.s * dotv(p.Q + i * p.d, p.Q + i * p.d, p.d);
                        mb += yb[i] / n;
                    }
                    for (int i = 0; i < n; i++) yb[i] -= mb;
                    apply_A(&p, yb, REF_ASAP_ROW, A);
                    d_bug = maxd(d_bug, max_abs_diff(A, T, (size_t)nm));
                    free(yb);
                }
                /* ZERO on the odd teacher's dual: the (S-1)-step teacher */
                apply_A(&p, y, REF_ASAP_ZERO, A);
                teacher_A(&p, S - 1, T);
                e_zodd = maxd(e_zodd, max_abs_diff(A, T, (size_t)nm));
            }
        }
        free(y); free(f); free(A); free(T); free(fh);
        prob_free(&p);
    }
    th_check(e_y <= 1e-13, "17 y = eps f + rho - mean (f after half-step S-1 / S-2)", "max diff %.2e", e_y);
    th_check(e_cen <= 1e-13, "17 y centred", "max |sum y| %.2e", e_cen);
    th_check(e_zero <= 1e-12, "17 even S: ZERO(y) == teacher(S)", "max diff %.2e", e_zero);
    th_check(e_col <= 1e-12, "17 even S: COLUMN(y) == teacher(S+2)", "max diff %.2e", e_col);
    th_check(e_row <= 1e-12, "17 odd S>=3: ROW(y) == teacher(S)", "max diff %.2e", e_row);
    th_check(e_zodd <= 1e-12, "17 odd S>=3: ZERO(y) == teacher(S-1)", "max diff %.2e", e_zodd);
    th_check(d_col_vs_S > 1e-6, "17 S = 2: COLUMN(y) != teacher(S) (finite-correction bias)",
          "min diff over generic cases %.2e", d_col_vs_S);
    th_check(d_bug > 1e-6, "planted bug detected: odd S with the final f (after S) breaks ROW(y) == teacher(S)",
          "max diff (the check allows 1e-12) %.2e", d_bug);
}

/* ------------------------------------------------------------------------ */
/* 16. 1-D potentials                                                       */
/* ------------------------------------------------------------------------ */

typedef struct {
    double fdiff, hdiff, feas, tight, dual, dualc, sq, nwmin;
} oned_err;

/* All 1-D checks on one instance; errors relative to the cost scale. */
static void oned_instance(int n, const double *a, int m, const double *b, int bug, lcg *g, oned_err *e)
{
    double *f = dalloc((size_t)n), *fn = dalloc((size_t)n), *h = dalloc((size_t)m), *hn = dalloc((size_t)m);
    double *ew = dalloc((size_t)(n + m));
    int *er = malloc((size_t)(n + m) * sizeof(int)), *et = malloc((size_t)(n + m) * sizeof(int));
    if (er == NULL || et == NULL) exit(1);
    int ne = 0;
    double sc = 1.0;
    for (int i = 0; i < n; i++) sc = maxd(sc, a[i] * a[i]);
    for (int j = 0; j < m; j++) sc = maxd(sc, b[j] * b[j]);
    ref_asap_potential_1d(n, a, m, b, bug, f);
    ref_asap_ctransform_1d(n, a, f, m, b, h);
    const double primal = ref_asap_nw_1d(n, a, m, b, fn, hn, er, et, ew, &ne);
    e->fdiff = maxd(e->fdiff, max_abs_diff(f, fn, (size_t)n) / sc);
    e->hdiff = maxd(e->hdiff, max_abs_diff(h, hn, (size_t)m) / sc);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            const double c = 0.5 * (a[i] - b[j]) * (a[i] - b[j]);
            e->feas = maxd(e->feas, (f[i] + h[j] - c) / sc);
            e->feas = maxd(e->feas, (fn[i] + hn[j] - c) / sc);
        }
    double mass = 0.0;
    for (int k = 0; k < ne; k++) {
        const double c = 0.5 * (a[er[k]] - b[et[k]]) * (a[er[k]] - b[et[k]]);
        e->tight = maxd(e->tight, fabs(f[er[k]] + h[et[k]] - c) / sc);
        e->tight = maxd(e->tight, fabs(fn[er[k]] + hn[et[k]] - c) / sc);
        mass += ew[k];
    }
    e->tight = maxd(e->tight, fabs(mass - 1.0));
    double dual = 0.0, dualn = 0.0;
    for (int i = 0; i < n; i++) { dual += f[i] / n; dualn += fn[i] / n; }
    for (int j = 0; j < m; j++) { dual += h[j] / m; dualn += hn[j] / m; }
    e->dual = maxd(e->dual, fabs(dualn - primal) / sc);
    e->dualc = maxd(e->dualc, fabs(dual - primal) / sc);
    if (n == m) {
        int *ia = malloc((size_t)n * sizeof(int)), *ib = malloc((size_t)n * sizeof(int));
        int *pm = malloc((size_t)n * sizeof(int));
        if (ia == NULL || ib == NULL || pm == NULL) exit(1);
        ref_asap_argsort(n, a, ia);
        ref_asap_argsort(n, b, ib);
        double sq = 0.0;
        for (int r = 0; r < n; r++) sq += (a[ia[r]] - b[ib[r]]) * (a[ia[r]] - b[ib[r]]);
        e->sq = maxd(e->sq, fabs(sq / (2.0 * n) - primal) / sc);
        for (int t = 0; t < 20; t++) { /* any matching costs at least the sorted one */
            perm(g, pm, n);
            double cst = 0.0;
            for (int i = 0; i < n; i++) cst += 0.5 * (a[i] - b[pm[i]]) * (a[i] - b[pm[i]]) / n;
            e->nwmin = maxd(e->nwmin, (primal - cst) / sc);
        }
        free(ia); free(ib); free(pm);
    }
    free(f); free(fn); free(h); free(hn); free(ew); free(er); free(et);
}

static void check_1d(lcg *g)
{
    /* sigma */
    int sig_ok = 1;
    for (int n = 1; n <= 13; n++)
        for (int m = 1; m <= 13; m++) {
            int prev = -1;
            for (int r = 0; r < n; r++) {
                const int sg = ref_asap_sigma(r, n, m);
                int last = 0; /* largest t with t/m < (r+1)/n */
                for (int t = 0; t < m; t++) if ((long long)t * n < (long long)(r + 1) * m) last = t;
                if (sg != last || sg < prev || sg > m - 1 || (n == m && sg != r)) sig_ok = 0;
                prev = sg;
            }
            if (ref_asap_sigma(n - 1, n, m) != m - 1) sig_ok = 0;
        }
    th_check(sig_ok, "16 sigma(r) = last key of query rank r (n, m <= 13)", "brute force %s",
          sig_ok ? "agrees" : "DIFFERS");

    oned_err e = {0, 0, -INFINITY, 0, 0, 0, 0, -INFINITY};
    static const int sizes[][2] = {{1, 1}, {1, 3}, {3, 1}, {2, 2}, {2, 3}, {3, 2}, {3, 3}, {4, 6}, {6, 4},
                                   {5, 5}, {7, 3}, {3, 7}, {8, 12}, {12, 8}, {9, 9}, {16, 16}, {10, 15}};
    int ninst = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int kind = 0; kind < 4; kind++) {
            const int n = sizes[si][0], m = sizes[si][1];
            double *a = dalloc((size_t)n), *b = dalloc((size_t)m);
            fill(g, a, (size_t)n, -2.0, 2.0);
            fill(g, b, (size_t)m, -2.0, 2.0);
            if (kind == 1) { /* heavy ties */
                for (int i = 0; i < n; i++) a[i] = round(a[i]);
                for (int j = 0; j < m; j++) b[j] = round(b[j]);
            } else if (kind == 2) { /* all queries tied, keys shifted */
                for (int i = 0; i < n; i++) a[i] = 0.25;
                for (int j = 0; j < m; j++) b[j] += 3.0;
            } else if (kind == 3) { /* large offset: cancellation in a^2/2 - phi */
                for (int i = 0; i < n; i++) a[i] += 20.0;
                for (int j = 0; j < m; j++) b[j] += 19.0;
            }
            oned_instance(n, a, m, b, 0, g, &e);
            ninst++;
            free(a); free(b);
        }
    th_check(e.fdiff <= 1e-13, "16 prefix-sum f == north-west-corner tree f", "%d instances, max rel diff %.2e",
          ninst, e.fdiff);
    th_check(e.hdiff <= 1e-13, "16 c-transform h == NW key potential", "max rel diff %.2e", e.hdiff);
    th_check(e.feas <= 1e-13, "16 feasibility f_i + h_j <= c_ij (both routes, all pairs)",
          "max rel violation %.2e", e.feas);
    th_check(e.tight <= 1e-13, "16 tightness on the NW support; plan mass 1", "max rel error %.2e", e.tight);
    th_check(e.dual <= 1e-13 && e.dualc <= 1e-13, "16 dual value (1/n)sum f + (1/m)sum h == primal",
          "NW %.2e, formula+c-transform %.2e (rel)", e.dual, e.dualc);
    th_check(e.sq <= 1e-13, "16 n == m: primal == (1/2n) sum (a_(r) - b_(r))^2", "max rel diff %.2e", e.sq);
    th_check(e.nwmin <= 1e-13, "16 sorted plan no costlier than random matchings (n == m)",
          "max (sorted - random) %.2e", e.nwmin);

    /* planted bug: sigma(r) in place of sigma(r-1) */
    oned_err eb = {0, 0, -INFINITY, 0, 0, 0, 0, -INFINITY};
    for (int t = 0; t < 3; t++) {
        double a[7], b[5];
        fill(g, a, 7, -2.0, 2.0);
        fill(g, b, 5, -2.0, 2.0);
        oned_instance(7, a, 5, b, REF_ASAP_BUG_SIGMA, g, &eb);
        double c[6], dd[6];
        fill(g, c, 6, -2.0, 2.0);
        fill(g, dd, 6, -2.0, 2.0);
        oned_instance(6, c, 6, dd, REF_ASAP_BUG_SIGMA, g, &eb);
    }
    th_check(eb.fdiff > 1e-6 && eb.dualc > 1e-6,
          "planted bug detected: sigma(r) for sigma(r-1) breaks formula == NW and the dual value",
          "f diff %.2e, dual gap %.2e", eb.fdiff, eb.dualc);
}

/* ------------------------------------------------------------------------ */
/* Features, 15. permutation equivariance                                   */
/* ------------------------------------------------------------------------ */

static void check_features(lcg *g)
{
    const int L = 6;
    double e_cen = 0.0, e_pot = 0.0, e_px = 0.0, e_py = 0.0, e_pa = 0.0, e_po = 0.0, bug_cen = INFINITY;
    for (int ci = 0; ci < NCASES; ci++) {
        prob p;
        prob_make(&p, g, &cases[ci]);
        const int n = p.n, m = p.m, d = p.d, nm = n * m;
        double *th = dalloc((size_t)L * d), *X = dalloc((size_t)n * L), *X2 = dalloc((size_t)n * L);
        double *a = dalloc((size_t)n), *b = dalloc((size_t)m), *f = dalloc((size_t)n);
        if (cases[ci].ties) axis_rows(th, L, d); else unit_rows(g, th, L, d);
        ref_asap_features(n, m, d, p.Q, p.K, p.s, L, th, 0, X);
        for (int l = 0; l < L; l++) {
            double s = 0.0, mean = 0.0;
            for (int i = 0; i < n; i++) s += X[i * L + l];
            e_cen = maxd(e_cen, fabs(s));
            for (int i = 0; i < n; i++) a[i] = sqrt(p.s) * dotv(th + l * d, p.Q + i * d, d);
            for (int j = 0; j < m; j++) b[j] = sqrt(p.s) * dotv(th + l * d, p.K + j * d, d);
            ref_asap_potential_1d(n, a, m, b, 0, f);
            for (int i = 0; i < n; i++) mean += f[i] / n;
            for (int i = 0; i < n; i++) e_pot = maxd(e_pot, fabs(X[i * L + l] - (f[i] - mean)));
        }
        /* planted bug: no centring */
        if (n >= 2) {
            ref_asap_features(n, m, d, p.Q, p.K, p.s, L, th, REF_ASAP_BUG_NOCENTRE, X2);
            double worst = 0.0;
            for (int l = 0; l < L; l++) {
                double s = 0.0;
                for (int i = 0; i < n; i++) s += X2[i * L + l];
                worst = maxd(worst, fabs(s));
            }
            bug_cen = fmin(bug_cen, worst);
        }
        /* 15: permutations of queries (pq) and keys (pk) */
        int *pq = malloc((size_t)n * sizeof(int)), *pk = malloc((size_t)m * sizeof(int));
        if (pq == NULL || pk == NULL) exit(1);
        double *Qp = dalloc((size_t)n * d), *Kp = dalloc((size_t)m * d), *Vp = dalloc((size_t)m * p.dv);
        double *y = dalloc((size_t)n), *yp = dalloc((size_t)n), *w = dalloc((size_t)L);
        double *fh = dalloc((size_t)n), *fhp = dalloc((size_t)n);
        double *A = dalloc((size_t)nm), *Ap = dalloc((size_t)nm), *O = dalloc((size_t)n * p.dv), *Op = dalloc((size_t)n * p.dv);
        fill(g, w, (size_t)L, -0.6, 0.6);
        for (int rep = 0; rep < 3; rep++) {
            perm(g, pq, n);
            perm(g, pk, m);
            permute_rows(p.Q, Qp, pq, n, d);
            permute_rows(p.K, Kp, pk, m, d);
            permute_rows(p.V, Vp, pk, m, p.dv);
            ref_asap_features(n, m, d, Qp, Kp, p.s, L, th, 0, X2);
            for (int k = 0; k < n; k++)
                for (int l = 0; l < L; l++) e_px = maxd(e_px, fabs(X2[k * L + l] - X[pq[k] * L + l]));
            const int S = 4 + rep % 2;
            ref_asap_teacher_dual(n, m, d, p.Q, p.K, p.s, p.eps, S, y, NULL);
            ref_asap_teacher_dual(n, m, d, Qp, Kp, p.s, p.eps, S, yp, NULL);
            for (int k = 0; k < n; k++) e_py = maxd(e_py, fabs(yp[k] - y[pq[k]]));
            for (int i = 0; i < n; i++) fh[i] = dotv(X + i * L, w, L);
            for (int i = 0; i < n; i++) fhp[i] = dotv(X2 + i * L, w, L);
            for (int v = 1; v <= 3; v++) {
                ref_asap_apply(n, m, d, p.dv, p.Q, p.K, p.V, p.s, p.eps, fh, v, A, O, NULL, NULL, NULL);
                ref_asap_apply(n, m, d, p.dv, Qp, Kp, Vp, p.s, p.eps, fhp, v, Ap, Op, NULL, NULL, NULL);
                for (int k = 0; k < n; k++) {
                    for (int t = 0; t < m; t++) e_pa = maxd(e_pa, fabs(Ap[k * m + t] - A[pq[k] * m + pk[t]]));
                    for (int c = 0; c < p.dv; c++) e_po = maxd(e_po, fabs(Op[k * p.dv + c] - O[pq[k] * p.dv + c]));
                }
            }
        }
        free(pq); free(pk); free(Qp); free(Kp); free(Vp); free(y); free(yp); free(w); free(fh); free(fhp);
        free(A); free(Ap); free(O); free(Op);
        free(th); free(X); free(X2); free(a); free(b); free(f);
        prob_free(&p);
    }
    th_check(e_cen <= 1e-13, "features: columns of X centred", "max |column sum| %.2e", e_cen);
    th_check(e_pot <= 1e-14, "features: X[:,l] = centred 1-D potential of sqrt(s) theta_l . (q, k)",
          "max diff %.2e", e_pot);
    th_check(bug_cen > 1e-6, "planted bug detected: no centring breaks the centring check",
          "min |column sum| with the bug %.2e", bug_cen);
    th_check(e_px <= 1e-13, "15 X(Pi Q, Sigma K) = Pi X (ties included)", "max diff %.2e", e_px);
    th_check(e_py <= 1e-12, "15 teacher target y(Pi Q, Sigma K) = Pi y", "max diff %.2e", e_py);
    th_check(e_pa <= 1e-12 && e_po <= 1e-12, "15 operator equivariant: A -> Pi A Sigma^T, O -> Pi O",
          "max diff A %.2e, O %.2e", e_pa, e_po);
}

/* ------------------------------------------------------------------------ */
/* Calibration sets                                                         */
/* ------------------------------------------------------------------------ */

typedef struct {
    int M, L;
    prob *p;
    double **X, **y;
    ref_asap_prob *rp;
} calset;

/* Problems from cases[first..first+M-1], common s, eps, d. */
static void calset_make(calset *cs, lcg *g, int M, int L, int d, double s, double eps, int S, const double *theta)
{
    cs->M = M;
    cs->L = L;
    cs->p = malloc((size_t)M * sizeof(prob));
    cs->X = malloc((size_t)M * sizeof(double *));
    cs->y = malloc((size_t)M * sizeof(double *));
    cs->rp = malloc((size_t)M * sizeof(ref_asap_prob));
    if (!cs->p || !cs->X || !cs->y || !cs->rp) exit(1);
    for (int k = 0; k < M; k++) {
        pcase c = cases[k % NCASES];
        c.d = d;
        c.s = s;
        c.eps = eps;
        prob_make(&cs->p[k], g, &c);
        const int n = c.n, m = c.m;
        cs->X[k] = dalloc((size_t)n * L);
        cs->y[k] = dalloc((size_t)n);
        ref_asap_features(n, m, d, cs->p[k].Q, cs->p[k].K, s, L, theta, 0, cs->X[k]);
        ref_asap_teacher_dual(n, m, d, cs->p[k].Q, cs->p[k].K, s, eps, S, cs->y[k], NULL);
        cs->rp[k].n = n;
        cs->rp[k].m = m;
        cs->rp[k].Q = cs->p[k].Q;
        cs->rp[k].K = cs->p[k].K;
        cs->rp[k].X = cs->X[k];
        cs->rp[k].y = cs->y[k];
    }
}

static void calset_free(calset *cs)
{
    for (int k = 0; k < cs->M; k++) {
        prob_free(&cs->p[k]);
        free(cs->X[k]);
        free(cs->y[k]);
    }
    free(cs->p); free(cs->X); free(cs->y); free(cs->rp);
}

/* RSS and rows of w on the set. */
static double calset_rss(const calset *cs, const double *w, long *rows, double *syy)
{
    double rss = 0.0, s2 = 0.0;
    long r = 0;
    for (int k = 0; k < cs->M; k++)
        for (int i = 0; i < cs->rp[k].n; i++) {
            const double e = cs->rp[k].y[i] - dotv(cs->rp[k].X + (size_t)i * cs->L, w, cs->L);
            rss += e * e;
            s2 += cs->rp[k].y[i] * cs->rp[k].y[i];
            r++;
        }
    if (rows) *rows = r;
    if (syy) *syy = s2;
    return rss;
}

/* ------------------------------------------------------------------------ */
/* 12, 19. LS                                                               */
/* ------------------------------------------------------------------------ */

static void check_ls(lcg *g)
{
    const int L = 5, d = 4, M = 14;
    double th[5 * 4];
    unit_rows(g, th, L, d);
    calset cs;
    calset_make(&cs, g, M, L, d, 0.5, 1.0, 6, th);
    const double lambda = 1e-3;
    double w[5], rmse = 0.0, r2 = 0.0;
    int rc = ref_asap_fit_ls(M, cs.rp, L, lambda, w, &rmse, &r2);
    th_check(rc == 0, "12 LS fit solves (lambda = 1e-3, 14 problems, L = 5)", "rc %d", rc);
    /* normal equations */
    double G[25] = {0}, c[5] = {0};
    for (int k = 0; k < M; k++)
        for (int i = 0; i < cs.rp[k].n; i++)
            for (int a = 0; a < L; a++) {
                c[a] += cs.rp[k].X[i * L + a] * cs.rp[k].y[i];
                for (int b = 0; b < L; b++) G[a * L + b] += cs.rp[k].X[i * L + a] * cs.rp[k].X[i * L + b];
            }
    double ne = 0.0, cs_max = 0.0;
    for (int a = 0; a < L; a++) {
        double v = lambda * w[a] - c[a];
        for (int b = 0; b < L; b++) v += G[a * L + b] * w[b];
        ne = maxd(ne, fabs(v));
        cs_max = maxd(cs_max, fabs(c[a]));
    }
    th_check(ne <= 1e-12 * (1.0 + cs_max), "12 normal equations (G + lambda I) w = c", "max residual %.2e", ne);
    long rows = 0;
    double syy = 0.0;
    const double rss = calset_rss(&cs, w, &rows, &syy);
    const double erm = fabs(rmse - sqrt(rss / rows)), er2 = fabs(r2 - (1.0 - rss / syy));
    th_check(erm <= 1e-14 && er2 <= 1e-14, "12 rmse = sqrt(RSS/rows), r2 = 1 - RSS/sum y^2",
          "diffs %.2e, %.2e (rmse %.4f, r2 %.4f, %ld rows)", erm, er2, rmse, r2, rows);
    /* oracle inequality: RSS(w) + lambda|w|^2 <= RSS(wo) + lambda|wo|^2, hence
     * RSS(w) <= RSS(wo) + lambda |wo|^2 */
    const double phi = rss + lambda * dotv(w, w, L);
    double worst = -INFINITY;
    for (int t = 0; t < 300; t++) {
        double wo[5];
        const double sc = t < 100 ? 1e-3 : t < 200 ? 0.1 : 2.0;
        for (int a = 0; a < L; a++) wo[a] = (t % 3 == 0 ? 0.0 : w[a]) + lcg_uniform(g, -sc, sc);
        const double ro = calset_rss(&cs, wo, NULL, NULL) + lambda * dotv(wo, wo, L);
        worst = maxd(worst, phi - ro);
        worst = maxd(worst, rss - ro);
    }
    th_check(worst <= 1e-12 * (1.0 + phi), "12 oracle inequality RSS(w) <= RSS(wo) + lambda|wo|^2 (300 wo)",
          "max violation %.2e", worst);

    /* 19: synthetic linear targets, lambda = 0 */
    double wt[5] = {0.7, -1.3, 0.25, 2.0, -0.4};
    for (int k = 0; k < M; k++)
        for (int i = 0; i < cs.rp[k].n; i++) cs.y[k][i] = dotv(cs.X[k] + i * L, wt, L);
    rc = ref_asap_fit_ls(M, cs.rp, L, 0.0, w, &rmse, &r2);
    double ew = 0.0;
    for (int a = 0; a < L; a++) ew = maxd(ew, fabs(w[a] - wt[a]));
    th_check(rc == 0 && ew <= 1e-10 && rmse <= 1e-12 && fabs(r2 - 1.0) <= 1e-12,
          "19 LS recovers omega on linear targets (lambda = 0)", "max |w - w_true| %.2e, rmse %.2e, r2-1 %.2e",
          ew, rmse, r2 - 1.0);
    calset_free(&cs);

    /* singular: single-query problems (X = 0), lambda = 0 */
    calset cz;
    cz.M = 0;
    calset_make(&cz, g, 1, L, d, 0.5, 1.0, 4, th);
    rc = ref_asap_fit_ls(1, cz.rp, L, 0.0, w, NULL, NULL);
    th_check(rc == -1, "LS reports a singular system (n = 1, X = 0, lambda = 0)", "rc %d", rc);
    calset_free(&cz);
}

/* ------------------------------------------------------------------------ */
/* 11. KL objective                                                         */
/* ------------------------------------------------------------------------ */

/* sum_m KL(P^T_m || Phat_m(w)), plans mass 1. */
static double kl_sum(const calset *cs, double s, double eps, const double *w)
{
    double kl = 0.0;
    for (int k = 0; k < cs->M; k++) {
        const prob *p = &cs->p[k];
        const int n = p->n, m = p->m;
        double *PT = dalloc((size_t)n * m), *Ph = dalloc((size_t)n * m), *fh = dalloc((size_t)n);
        for (int i = 0; i < n; i++) fh[i] = dotv(cs->X[k] + i * cs->L, w, cs->L);
        ref_asap_apply(n, m, p->d, p->dv, p->Q, p->K, NULL, s, eps, cs->y[k], REF_ASAP_ZERO, PT, NULL, NULL, NULL, NULL);
        ref_asap_apply(n, m, p->d, p->dv, p->Q, p->K, NULL, s, eps, fh, REF_ASAP_ZERO, Ph, NULL, NULL, NULL, NULL);
        for (int t = 0; t < n * m; t++) {
            const double a = PT[t] / n, b = Ph[t] / n;
            kl += a * log(a / b) - a + b;
        }
        free(PT); free(Ph); free(fh);
    }
    return kl;
}

static void check_kl(lcg *g)
{
    const int L = 4, d = 3, M = 8;
    const double s = 0.6, eps = 0.8, lambda = 1e-2;
    double th[4 * 3];
    unit_rows(g, th, L, d);
    calset cs;
    calset_make(&cs, g, M, L, d, s, eps, 4, th);
    double w[4], gr[4], H[16], gp[4], gm[4], wt[4];
    double e_g = 0.0, e_h = 0.0, e_sym = 0.0, psd = INFINITY, kconst_lo = INFINITY, kconst_hi = -INFINITY;
    double gscale = 0.0, hscale = 0.0, mid = -INFINITY, e_hbug = INFINITY;
    int chol_ok = 1;
    for (int rep = 0; rep < 4; rep++) {
        fill(g, w, (size_t)L, -1.0, 1.0);
        const double J = ref_asap_kl_eval(M, cs.rp, d, L, s, eps, lambda, w, gr, H);
        const double h = 1e-5;
        for (int a = 0; a < L; a++) {
            memcpy(wt, w, sizeof w);
            wt[a] = w[a] + h;
            const double Jp = ref_asap_kl_eval(M, cs.rp, d, L, s, eps, lambda, wt, gp, NULL);
            wt[a] = w[a] - h;
            const double Jm = ref_asap_kl_eval(M, cs.rp, d, L, s, eps, lambda, wt, gm, NULL);
            e_g = maxd(e_g, fabs((Jp - Jm) / (2 * h) - gr[a]));
            gscale = maxd(gscale, fabs(gr[a]));
            for (int b = 0; b < L; b++) {
                e_h = maxd(e_h, fabs((gp[b] - gm[b]) / (2 * h) - H[b * L + a]));
                hscale = maxd(hscale, fabs(H[b * L + a]));
                e_sym = maxd(e_sym, fabs(H[a * L + b] - H[b * L + a]));
            }
        }
        /* planted bug: Hessian without the -W diag(b) W^T term, i.e. only
         * (1/eps) X^T diag(rhat) X + lambda I; rebuilt here from rhat */
        {
            double Hb[16] = {0};
            for (int k = 0; k < M; k++) {
                const prob *p = &cs.p[k];
                const int n = p->n, m = p->m;
                double *Ph = dalloc((size_t)n * m), *fh = dalloc((size_t)n);
                for (int i = 0; i < n; i++) fh[i] = dotv(cs.X[k] + i * L, w, L);
                ref_asap_apply(n, m, d, p->dv, p->Q, p->K, NULL, s, eps, fh, REF_ASAP_ZERO, Ph, NULL, NULL, NULL, NULL);
                for (int i = 0; i < n; i++) {
                    double rh = 0.0;
                    for (int j = 0; j < m; j++) rh += Ph[i * m + j] / n;
                    for (int a = 0; a < L; a++)
                        for (int b = 0; b < L; b++) Hb[a * L + b] += cs.X[k][i * L + a] * rh * cs.X[k][i * L + b] / eps;
                }
                free(Ph); free(fh);
            }
            for (int a = 0; a < L; a++) Hb[a * L + a] += lambda;
            e_hbug = fmin(e_hbug, max_abs_diff(Hb, H, 16));
        }
        /* PSD of H - lambda I: random directions and Cholesky with a tiny shift */
        for (int t = 0; t < 50; t++) {
            double v[4], Hv = 0.0;
            fill(g, v, 4, -1.0, 1.0);
            for (int a = 0; a < L; a++)
                for (int b = 0; b < L; b++) Hv += v[a] * (H[a * L + b] - (a == b ? lambda : 0.0)) * v[b];
            psd = fmin(psd, Hv / dotv(v, v, L));
        }
        double Hs[16];
        memcpy(Hs, H, sizeof Hs);
        for (int a = 0; a < L; a++) Hs[a * L + a] += -lambda + 1e-10 * (1.0 + hscale);
        if (ref_asap_chol(L, Hs) != 0) chol_ok = 0;
        /* J - eps KL - ridge constant in w */
        const double kc = J - eps * kl_sum(&cs, s, eps, w) - 0.5 * lambda * dotv(w, w, L);
        kconst_lo = fmin(kconst_lo, kc);
        kconst_hi = maxd(kconst_hi, kc);
        /* midpoint convexity */
        double w2[4], wm[4];
        fill(g, w2, (size_t)L, -1.5, 1.5);
        for (int a = 0; a < L; a++) wm[a] = 0.5 * (w[a] + w2[a]);
        const double J2 = ref_asap_kl_eval(M, cs.rp, d, L, s, eps, lambda, w2, NULL, NULL);
        const double Jmid = ref_asap_kl_eval(M, cs.rp, d, L, s, eps, lambda, wm, NULL, NULL);
        mid = maxd(mid, Jmid - 0.5 * (J + J2));
    }
    th_check(e_g <= 1e-7 * (1.0 + gscale), "11 KL gradient == central differences (h = 1e-5)",
          "max abs error %.2e (scale %.2e)", e_g, gscale);
    th_check(e_h <= 1e-7 * (1.0 + hscale) && e_sym <= 1e-14, "11 KL Hessian == central differences of grad; symmetric",
          "max abs error %.2e (scale %.2e), asym %.2e", e_h, hscale, e_sym);
    th_check(e_hbug > 1e3 * (e_h + 1e-12), "planted bug detected: Hessian without W diag(b) W^T fails the FD check",
          "bug deviation %.2e vs FD error %.2e", e_hbug, e_h);
    th_check(psd >= -1e-13 && chol_ok, "11 convexity: H - lambda I PSD (200 directions, Cholesky with 1e-10 shift)",
          "min Rayleigh quotient %.2e", psd);
    th_check(mid <= 1e-12, "11 convexity: J(midpoint) <= mean of ends", "max violation %.2e", mid);
    th_check(kconst_hi - kconst_lo <= 1e-12 * (1.0 + fabs(kconst_hi)), "11 J - eps KL(P^T || Phat^0) - ridge constant in w",
          "spread %.2e (value %.6f)", kconst_hi - kconst_lo, kconst_hi);

    /* Newton from the LS start */
    int iters = 0;
    double J0 = 0.0, Jf = 0.0;
    int conv = ref_asap_fit_kl(M, cs.rp, d, L, s, eps, lambda, NULL, 50, 1e-15, w, &iters, &J0, &Jf);
    ref_asap_kl_eval(M, cs.rp, d, L, s, eps, lambda, w, gr, NULL);
    double worse = INFINITY;
    for (int t = 0; t < 50; t++) {
        for (int a = 0; a < L; a++) wt[a] = w[a] + lcg_uniform(g, -0.1, 0.1);
        worse = fmin(worse, ref_asap_kl_eval(M, cs.rp, d, L, s, eps, lambda, wt, NULL, NULL) - Jf);
    }
    th_check(conv && Jf <= J0 && max_abs(gr, (size_t)L) <= 1e-6 && worse >= -1e-12,
          "11 Newton (LS start) converges to the minimiser: grad = 0, J <= J0, J <= J(w + noise)",
          "%d steps, J0 %.6f -> J %.6f, |grad| %.2e", iters, J0, Jf, max_abs(gr, (size_t)L));

    /* realisable targets: y = X w_true, lambda = 0: minimiser w_true */
    const double wtrue[4] = {0.5, -0.8, 0.3, 1.1};
    for (int k = 0; k < M; k++)
        for (int i = 0; i < cs.rp[k].n; i++) cs.y[k][i] = dotv(cs.X[k] + i * L, wtrue, L);
    const double zero[4] = {0, 0, 0, 0};
    conv = ref_asap_fit_kl(M, cs.rp, d, L, s, eps, 0.0, zero, 50, 1e-17, w, &iters, &J0, &Jf);
    double ew = 0.0;
    for (int a = 0; a < L; a++) ew = maxd(ew, fabs(w[a] - wtrue[a]));
    th_check(conv && ew <= 1e-9, "11 KL Newton (from 0, lambda = 0) recovers w on realisable targets",
          "%d steps, max |w - w_true| %.2e", iters, ew);
    calset_free(&cs);
}

/* ------------------------------------------------------------------------ */
/* Fidelity                                                                 */
/* ------------------------------------------------------------------------ */

static void check_fidelity(lcg *g)
{
    const int n = 3, m = 4, dv = 2;
    double A[12], Ar[12], O[6], Or[6];
    fill(g, Ar, 12, 0.1, 1.0);
    fill(g, Or, 6, -1.0, 1.0);
    ref_asap_fid r;
    ref_asap_fidelity(n, m, dv, Or, Or, Ar, Ar, &r);
    int ok = r.out_rmse == 0.0 && r.attn_rel_l2 == 0.0;
    double rms = 0.0;
    for (int k = 0; k < 6; k++) rms += Or[k] * Or[k];
    ok = ok && fabs(r.out_rms - sqrt(rms / 6)) <= 1e-15;
    for (int k = 0; k < 6; k++) O[k] = Or[k] + (k % 2 ? 0.5 : -0.5);
    for (int k = 0; k < 12; k++) A[k] = 2.0 * Ar[k];
    ref_asap_fidelity(n, m, dv, O, Or, A, Ar, &r);
    ok = ok && fabs(r.out_rmse - 0.5) <= 1e-15 && fabs(r.attn_rel_l2 - 1.0) <= 1e-15;
    /* uniform A with rows 1: columns n/m -> both errors 0; doubled -> 1 */
    for (int k = 0; k < 12; k++) A[k] = 1.0 / m;
    ref_asap_fidelity(n, m, dv, NULL, NULL, A, NULL, &r);
    ok = ok && fabs(r.row_err) <= 1e-15 && fabs(r.col_err) <= 1e-15 && isnan(r.out_rmse) && isnan(r.attn_rel_l2);
    for (int k = 0; k < 12; k++) A[k] = 2.0 / m;
    ref_asap_fidelity(n, m, dv, O, Or, A, NULL, &r);
    ok = ok && fabs(r.row_err - 1.0) <= 1e-15 && fabs(r.col_err - 1.0) <= 1e-15;
    /* one row off by +0.3, one by -0.3: row_err = 0.2 */
    for (int k = 0; k < 12; k++) A[k] = 1.0 / m;
    A[0] += 0.3;
    A[4 + 1] -= 0.3;
    ref_asap_fidelity(n, m, dv, NULL, NULL, A, NULL, &r);
    ok = ok && fabs(r.row_err - 0.2) <= 1e-15;
    ref_asap_fidelity(n, m, dv, O, Or, NULL, Ar, &r);
    ok = ok && isnan(r.row_err) && isnan(r.col_err) && isnan(r.attn_rel_l2) && !isnan(r.out_rmse);
    th_check(ok, "fidelity metrics on hand-made inputs (rmse, rms, rel l2, row/col errors, NULL -> NaN)",
          "%s", ok ? "all as expected" : "MISMATCH");
}

int main(void)
{
    TH.verbose = 1; /* one line per check, as before */
    lcg g = {0x45a5a9d0c0ffee11ULL};
    check_teacher(&g);
    check_operator(&g);
    check_stability(&g);
    check_reproduction(&g);
    check_1d(&g);
    check_features(&g);
    check_ls(&g);
    check_kl(&g);
    check_fidelity(&g);
    return th_summary();
}
