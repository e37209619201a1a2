/*
 * ref_lot_selftest.c -- checks the naive LOT reference (ref_lot.c):
 *   1. Analytic dQ, dK, dV, dZ, dtheta equal central finite differences of
 *      L = sum(dO .* O) (h = 1e-6), T in {1,2,3,5,6}, 6x6 and 5x8, r in {1,3}.
 *   2. T = 1: A does not depend on p0 (theta), dtheta = 0, and A equals the
 *      independently coded two-hop softmax sum_t softmax_t(L1) softmax_j(L2).
 *   3. Margins (spec 1.6): rows of A sum to 1 exactly for odd T, columns to
 *      n/m exactly for even T; the other margin is not exact for small T.
 *   4. r = 1: O_i = mean of V for T >= 2 (spec 1.9 claims every T; at
 *      T = 1 it is softmax_j(s z.k_j / eps) V, checked as such).
 *   5. rank(A) <= r (Gaussian elimination with full pivoting).
 *   6. Converged (T = 401): A doubly stochastic (rows 1, columns n/m).
 *   7. Batched + padded results equal the truncated problems, NaN in padding;
 *      padding zero; dZ / dtheta summed over the batch; empty problems zero.
 * One line per check, then "N passed, N failed"; exit 1 on any failure.
 */
#include "ref_lot.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_selftest_util.h"

/* ------------------------------------------------------------------------ */
/* Harness                                                                  */
/* ------------------------------------------------------------------------ */







/* Max |rowsum - 1| and max |colsum - n/m| of A (n x m). */
static void margins(int n, int m, const double *A, double *re, double *ce)
{
    *re = 0.0;
    *ce = 0.0;
    for (int i = 0; i < n; i++) {
        double acc = 0.0;
        for (int j = 0; j < m; j++)
            acc += A[(size_t)i * m + j];
        if (!(fabs(acc - 1.0) <= *re))
            *re = fabs(acc - 1.0);
    }
    for (int j = 0; j < m; j++) {
        double acc = 0.0;
        for (int i = 0; i < n; i++)
            acc += A[(size_t)i * m + j];
        if (!(fabs(acc - (double)n / m) <= *ce))
            *ce = fabs(acc - (double)n / m);
    }
}

/* One problem's inputs. */
typedef struct {
    int n, m, d, dv, r, T;
    double temp, eps, s;
    double *Q, *K, *V, *Z, *th, *dO;
} prob;

static void prob_init(prob *P, lcg *g, int n, int m, int d, int dv, int r, int T)
{
    P->n = n;
    P->m = m;
    P->d = d;
    P->dv = dv;
    P->r = r;
    P->T = T;
    P->temp = 0.5;
    P->eps = 0.7;
    P->s = 0.8;
    P->Q = dalloc((size_t)n * d);
    P->K = dalloc((size_t)m * d);
    P->V = dalloc((size_t)m * dv);
    P->Z = dalloc((size_t)r * d);
    P->th = dalloc((size_t)r);
    P->dO = dalloc((size_t)n * dv);
    fill(g, P->Q, (size_t)n * d, -1.0, 1.0);
    fill(g, P->K, (size_t)m * d, -1.0, 1.0);
    fill(g, P->V, (size_t)m * dv, -1.0, 1.0);
    fill(g, P->Z, (size_t)r * d, -1.0, 1.0);
    fill(g, P->th, (size_t)r, -1.0, 1.0);
    fill(g, P->dO, (size_t)n * dv, -1.0, 1.0);
}

static void prob_free(prob *P)
{
    free(P->Q);
    free(P->K);
    free(P->V);
    free(P->Z);
    free(P->th);
    free(P->dO);
}

static void prob_forward(const prob *P, double *A, double *O)
{
    ref_lot_forward(P->n, P->m, P->d, P->dv, P->r, P->Q, P->K, P->V, P->Z, P->th, P->temp, P->T,
                    P->eps, P->s, A, O);
}

static double prob_loss(const prob *P)
{
    double *O = dalloc((size_t)P->n * P->dv);
    prob_forward(P, NULL, O);
    double L = 0.0;
    for (size_t i = 0; i < (size_t)P->n * P->dv; i++)
        L += P->dO[i] * O[i];
    free(O);
    return L;
}

/* Central differences of prob_loss w.r.t. every entry of x (count). */
static void fd_grad(prob *P, double *x, size_t count, double *g)
{
    const double h = 1e-6;
    for (size_t i = 0; i < count; i++) {
        const double x0 = x[i];
        x[i] = x0 + h;
        double lp = prob_loss(P);
        x[i] = x0 - h;
        double lm = prob_loss(P);
        x[i] = x0;
        g[i] = (lp - lm) / (2.0 * h);
    }
}

/* ------------------------------------------------------------------------ */
/* 1. Finite differences                                                    */
/* ------------------------------------------------------------------------ */

static void check_fd(lcg *g, double *worst)
{
    static const int Ts[] = {1, 2, 3, 5, 6};
    static const int shapes[][2] = {{6, 6}, {5, 8}};
    static const int rs[] = {1, 3};
    const int d = 3, dv = 2;
    for (size_t si = 0; si < 2; si++) {
        for (size_t ri = 0; ri < 2; ri++) {
            for (size_t ti = 0; ti < 5; ti++) {
                prob P;
                const int n = shapes[si][0], m = shapes[si][1], r = rs[ri], T = Ts[ti];
                prob_init(&P, g, n, m, d, dv, r, T);
                const size_t cnt[5] = {(size_t)n * d, (size_t)m * d, (size_t)m * dv,
                                       (size_t)r * d, (size_t)r};
                double *xs[5] = {P.Q, P.K, P.V, P.Z, P.th};
                double *an[5], *fd[5];
                for (int k = 0; k < 5; k++) {
                    an[k] = dalloc(cnt[k]);
                    fd[k] = dalloc(cnt[k]);
                }
                ref_lot_backward(n, m, d, dv, r, P.Q, P.K, P.V, P.Z, P.th, P.temp, T, P.eps,
                                 P.s, P.dO, an[0], an[1], an[2], an[3], an[4]);
                for (int k = 0; k < 5; k++)
                    fd_grad(&P, xs[k], cnt[k], fd[k]);
                /* Relative to the largest FD gradient entry of this problem
                 * (per-tensor scales can be exactly 0, e.g. r = 1). */
                double scale = 0.0;
                for (int k = 0; k < 5; k++)
                    if (max_abs(fd[k], cnt[k]) > scale)
                        scale = max_abs(fd[k], cnt[k]);
                double e[5], emax = 0.0;
                for (int k = 0; k < 5; k++) {
                    e[k] = max_abs_diff(an[k], fd[k], cnt[k]) / scale;
                    if (!(e[k] <= emax))
                        emax = e[k];
                }
                if (!(emax <= *worst))
                    *worst = emax;
                char name[96], det[256];
                snprintf(name, sizeof name, "fd grads n=%d m=%d r=%d T=%d", n, m, r, T);
                snprintf(det, sizeof det,
                         "rel err Q %.1e K %.1e V %.1e Z %.1e theta %.1e (scale %.2e)", e[0],
                         e[1], e[2], e[3], e[4], scale);
                th_report(emax < 1e-6 && scale > 0.0, name, det);
                for (int k = 0; k < 5; k++) {
                    free(an[k]);
                    free(fd[k]);
                }
                prob_free(&P);
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* 2. T = 1                                                                 */
/* ------------------------------------------------------------------------ */

static void check_T1(lcg *g)
{
    const int n = 5, m = 7, d = 3, dv = 2, r = 3;
    prob P;
    prob_init(&P, g, n, m, d, dv, r, 1);
    double *A1 = dalloc((size_t)n * m), *A2 = dalloc((size_t)n * m);
    double *O = dalloc((size_t)n * dv);
    prob_forward(&P, A1, O);
    /* Very different masses. */
    double *th0 = dalloc((size_t)r);
    memcpy(th0, P.th, (size_t)r * sizeof(double));
    P.th[0] = 3.0;
    P.th[1] = -2.0;
    P.th[2] = 0.5;
    prob_forward(&P, A2, O);
    memcpy(P.th, th0, (size_t)r * sizeof(double));
    double dA = max_abs_diff(A1, A2, (size_t)n * m);
    char det[160];
    snprintf(det, sizeof det, "max |A(theta) - A(theta')| = %.1e", dA);
    th_report(dA < 1e-14, "T=1 A independent of p0", det);

    double *dQ = dalloc((size_t)n * d), *dK = dalloc((size_t)m * d);
    double *dV = dalloc((size_t)m * dv), *dZ = dalloc((size_t)r * d);
    double *dth = dalloc((size_t)r), *fdth = dalloc((size_t)r);
    ref_lot_backward(n, m, d, dv, r, P.Q, P.K, P.V, P.Z, P.th, P.temp, 1, P.eps, P.s, P.dO, dQ,
                     dK, dV, dZ, dth);
    fd_grad(&P, P.th, (size_t)r, fdth);
    double gth = max_abs(dth, (size_t)r), gq = max_abs(dQ, (size_t)n * d);
    double gfd = max_abs(fdth, (size_t)r);
    snprintf(det, sizeof det, "max |dtheta| = %.1e (|dQ| ~ %.1e), max |FD dtheta| = %.1e", gth,
             gq, gfd);
    th_report(gth < 1e-15 && gfd < 1e-9 && gq > 1e-3, "T=1 dtheta = 0", det);

    /* Two-hop softmax, coded independently. */
    double *S1 = dalloc((size_t)n * r), *S2 = dalloc((size_t)r * m);
    const double cs = P.s / P.eps;
    for (int i = 0; i < n; i++) {
        double z = 0.0;
        for (int t = 0; t < r; t++) {
            double l = 0.0;
            for (int k = 0; k < d; k++)
                l += P.Q[i * d + k] * P.Z[t * d + k];
            S1[i * r + t] = exp(cs * l);
            z += S1[i * r + t];
        }
        for (int t = 0; t < r; t++)
            S1[i * r + t] /= z;
    }
    for (int t = 0; t < r; t++) {
        double z = 0.0;
        for (int j = 0; j < m; j++) {
            double l = 0.0;
            for (int k = 0; k < d; k++)
                l += P.Z[t * d + k] * P.K[j * d + k];
            S2[t * m + j] = exp(cs * l);
            z += S2[t * m + j];
        }
        for (int j = 0; j < m; j++)
            S2[t * m + j] /= z;
    }
    double e = 0.0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double a = 0.0;
            for (int t = 0; t < r; t++)
                a += S1[i * r + t] * S2[t * m + j];
            if (!(fabs(a - A1[i * m + j]) <= e))
                e = fabs(a - A1[i * m + j]);
        }
    snprintf(det, sizeof det, "max |A - two-hop softmax| = %.1e", e);
    th_report(e < 1e-14, "T=1 equals two-hop softmax", det);

    free(S1);
    free(S2);
    free(dQ);
    free(dK);
    free(dV);
    free(dZ);
    free(dth);
    free(fdth);
    free(th0);
    free(A1);
    free(A2);
    free(O);
    prob_free(&P);
}

/* ------------------------------------------------------------------------ */
/* 3. Margins for finite T; 6. convergence                                  */
/* ------------------------------------------------------------------------ */

static void check_margins(lcg *g)
{
    static const int shapes[][2] = {{7, 7}, {5, 8}, {9, 4}};
    for (size_t si = 0; si < 3; si++) {
        const int n = shapes[si][0], m = shapes[si][1], r = 3;
        double exact = 0.0, other_min = INFINITY;
        for (int T = 1; T <= 8; T++) {
            prob P;
            prob_init(&P, g, n, m, 3, 2, r, T);
            double *A = dalloc((size_t)n * m), *O = dalloc((size_t)n * 2);
            prob_forward(&P, A, O);
            double re, ce;
            margins(n, m, A, &re, &ce);
            double ex = (T % 2 == 1) ? re : ce;
            double ot = (T % 2 == 1) ? ce : re;
            if (!(ex <= exact))
                exact = ex;
            if (T <= 4 && ot < other_min)
                other_min = ot;
            free(A);
            free(O);
            prob_free(&P);
        }
        char name[96], det[200];
        snprintf(name, sizeof name, "margins n=%d m=%d (odd T rows, even T cols)", n, m);
        snprintf(det, sizeof det,
                 "T=1..8 max exact-margin err %.1e; other margin err (T<=4) >= %.1e", exact,
                 other_min);
        th_report(exact < 1e-13 && other_min > 1e-6, name, det);
    }

    static const int cshapes[][2] = {{6, 6}, {5, 8}};
    for (size_t si = 0; si < 2; si++) {
        const int n = cshapes[si][0], m = cshapes[si][1];
        prob P;
        prob_init(&P, g, n, m, 3, 2, 3, 401);
        double *A = dalloc((size_t)n * m), *O = dalloc((size_t)n * 2);
        prob_forward(&P, A, O);
        double re, ce;
        margins(n, m, A, &re, &ce);
        double mn = INFINITY;
        for (size_t i = 0; i < (size_t)n * m; i++)
            if (A[i] < mn)
                mn = A[i];
        char name[96], det[160];
        snprintf(name, sizeof name, "converged T=401 n=%d m=%d doubly stochastic", n, m);
        snprintf(det, sizeof det, "row err %.1e, col err %.1e (target n/m), min entry %.2e", re,
                 ce, mn);
        th_report(re < 1e-12 && ce < 1e-12 && mn > 0.0, name, det);
        free(A);
        free(O);
        prob_free(&P);
    }
}

/* ------------------------------------------------------------------------ */
/* 4. r = 1                                                                 */
/* ------------------------------------------------------------------------ */

static void check_r1(lcg *g)
{
    /* Spec 1.9 says "O_i = mean of V for every T"; that holds for T >= 2
     * only. With T = 1 (one row step) G1 = 1/n but G2 is only row-scaled to
     * p0 = 1, i.e. G2 = softmax_j(s z.k_j / eps), so O_i = softmax V for all
     * i. From T = 2 on the column step makes G2 = 1/m and it stays there. */
    const int n = 5, m = 8, d = 3, dv = 3;
    double e = 0.0, e1 = 0.0;
    for (int T = 1; T <= 6; T++) {
        prob P;
        prob_init(&P, g, n, m, d, dv, 1, T);
        double *O = dalloc((size_t)n * dv), *w = dalloc((size_t)m);
        prob_forward(&P, NULL, O);
        double z = 0.0;
        for (int j = 0; j < m; j++) {
            double l = 0.0;
            for (int k = 0; k < d; k++)
                l += P.Z[k] * P.K[j * d + k];
            w[j] = (T == 1) ? exp(P.s / P.eps * l) : 1.0;
            z += w[j];
        }
        for (int cc = 0; cc < dv; cc++) {
            double want = 0.0;
            for (int j = 0; j < m; j++)
                want += w[j] / z * P.V[j * dv + cc];
            for (int i = 0; i < n; i++) {
                double t = fabs(O[i * dv + cc] - want);
                if (T == 1 && !(t <= e1))
                    e1 = t;
                if (T > 1 && !(t <= e))
                    e = t;
            }
        }
        free(w);
        free(O);
        prob_free(&P);
    }
    char det[120];
    snprintf(det, sizeof det, "T=2..6 max |O_i - mean(V)| = %.1e", e);
    th_report(e < 1e-14, "r=1 gives mean of V (T >= 2)", det);
    snprintf(det, sizeof det, "max |O_i - softmax_j(s z.k_j/eps) V| = %.1e", e1);
    th_report(e1 < 1e-14, "r=1 T=1 gives single-pivot softmax", det);
}

/* ------------------------------------------------------------------------ */
/* 5. rank                                                                  */
/* ------------------------------------------------------------------------ */

/* Numerical rank of X (n x m, destroyed): full-pivot elimination, pivots
 * below tol * max|X| count as zero. */
static int num_rank(int n, int m, double *X, double tol)
{
    const double thr = tol * max_abs(X, (size_t)n * m);
    int rank = 0;
    for (int k = 0; k < n && k < m; k++) {
        int pi = k, pj = k;
        double best = 0.0;
        for (int i = k; i < n; i++)
            for (int j = k; j < m; j++)
                if (fabs(X[i * m + j]) > best) {
                    best = fabs(X[i * m + j]);
                    pi = i;
                    pj = j;
                }
        if (!(best > thr))
            break;
        for (int j = 0; j < m; j++) { /* swap rows k, pi */
            double t = X[k * m + j];
            X[k * m + j] = X[pi * m + j];
            X[pi * m + j] = t;
        }
        for (int i = 0; i < n; i++) { /* swap cols k, pj */
            double t = X[i * m + k];
            X[i * m + k] = X[i * m + pj];
            X[i * m + pj] = t;
        }
        for (int i = k + 1; i < n; i++) {
            double f = X[i * m + k] / X[k * m + k];
            for (int j = k; j < m; j++)
                X[i * m + j] -= f * X[k * m + j];
        }
        rank++;
    }
    return rank;
}

static void check_rank(lcg *g)
{
    static const int rs[] = {1, 2, 3, 5};
    static const int Ts[] = {1, 4, 5};
    const int n = 9, m = 8;
    int ok = 1;
    char det[200];
    int pos = 0;
    for (size_t ri = 0; ri < 4; ri++)
        for (size_t ti = 0; ti < 3; ti++) {
            prob P;
            prob_init(&P, g, n, m, 6, 2, rs[ri], Ts[ti]);
            P.eps = 0.3; /* sharper kernels: a well-conditioned rank-r matrix */
            double *A = dalloc((size_t)n * m), *O = dalloc((size_t)n * 2);
            prob_forward(&P, A, O);
            int rk = num_rank(n, m, A, 1e-10);
            if (rk > rs[ri])
                ok = 0;
            if (ti == 0 && pos < (int)sizeof det - 20)
                pos += snprintf(det + pos, sizeof det - (size_t)pos, "r=%d rank %d; ", rs[ri],
                                rk);
            free(A);
            free(O);
            prob_free(&P);
        }
    th_report(ok, "rank(A) <= r (9x8, T in {1,4,5})", det);
}

/* ------------------------------------------------------------------------ */
/* 7. Batched + padded                                                      */
/* ------------------------------------------------------------------------ */

static void check_batched(lcg *g)
{
    const int B = 3, H = 2, Nq = 6, Nk = 7, d = 3, dv = 2, r = 3;
    const int ql[3] = {6, 4, 0}, kl[3] = {5, 7, 3};
    const double temp = 0.5, eps = 0.7, s = 0.8;
    const size_t nQ = (size_t)B * H * Nq * d, nK = (size_t)B * H * Nk * d;
    const size_t nV = (size_t)B * H * Nk * dv, nO = (size_t)B * H * Nq * dv;
    const size_t nA = (size_t)B * H * Nq * Nk;
    double *Q = dalloc(nQ), *K = dalloc(nK), *V = dalloc(nV), *dO = dalloc(nO);
    double *Z = dalloc((size_t)H * r * d), *th = dalloc((size_t)H * r);
    fill(g, Z, (size_t)H * r * d, -1.0, 1.0);
    fill(g, th, (size_t)H * r, -1.0, 1.0);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const size_t p = (size_t)b * H + h;
            for (int i = 0; i < Nq; i++)
                for (int k = 0; k < d; k++)
                    Q[(p * Nq + i) * d + k] = i < ql[b] ? lcg_uniform(g, -1, 1) : NAN;
            for (int i = 0; i < Nq; i++)
                for (int k = 0; k < dv; k++)
                    dO[(p * Nq + i) * dv + k] = i < ql[b] ? lcg_uniform(g, -1, 1) : NAN;
            for (int j = 0; j < Nk; j++) {
                for (int k = 0; k < d; k++)
                    K[(p * Nk + j) * d + k] = j < kl[b] ? lcg_uniform(g, -1, 1) : NAN;
                for (int k = 0; k < dv; k++)
                    V[(p * Nk + j) * dv + k] = j < kl[b] ? lcg_uniform(g, -1, 1) : NAN;
            }
        }
    for (int T = 1; T <= 4; T++) {
        double *A = dalloc(nA), *O = dalloc(nO), *dQ = dalloc(nQ), *dK = dalloc(nK);
        double *dV = dalloc(nV), *dZ = dalloc((size_t)H * r * d), *dth = dalloc((size_t)H * r);
        ref_lot_forward_batched(B, H, Nq, Nk, d, dv, r, ql, kl, Q, K, V, Z, th, temp, T, eps, s,
                                A, O);
        ref_lot_backward_batched(B, H, Nq, Nk, d, dv, r, ql, kl, Q, K, V, Z, th, temp, T, eps,
                                 s, dO, dQ, dK, dV, dZ, dth);
        /* Expected: truncated problems, padding zero, dZ/dtheta summed. */
        double *eA = dalloc(nA), *eO = dalloc(nO), *edQ = dalloc(nQ), *edK = dalloc(nK);
        double *edV = dalloc(nV), *edZ = dalloc((size_t)H * r * d);
        double *edth = dalloc((size_t)H * r);
        memset(eA, 0, nA * sizeof(double));
        memset(eO, 0, nO * sizeof(double));
        memset(edQ, 0, nQ * sizeof(double));
        memset(edK, 0, nK * sizeof(double));
        memset(edV, 0, nV * sizeof(double));
        memset(edZ, 0, (size_t)H * r * d * sizeof(double));
        memset(edth, 0, (size_t)H * r * sizeof(double));
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                const int n = ql[b], m = kl[b];
                if (n == 0 || m == 0)
                    continue;
                const size_t p = (size_t)b * H + h;
                /* Fresh truncated copies (no padding at all). */
                double *tQ = dalloc((size_t)n * d), *tK = dalloc((size_t)m * d);
                double *tV = dalloc((size_t)m * dv), *tdO = dalloc((size_t)n * dv);
                memcpy(tQ, Q + p * Nq * d, (size_t)n * d * sizeof(double));
                memcpy(tK, K + p * Nk * d, (size_t)m * d * sizeof(double));
                memcpy(tV, V + p * Nk * dv, (size_t)m * dv * sizeof(double));
                memcpy(tdO, dO + p * Nq * dv, (size_t)n * dv * sizeof(double));
                double *tA = dalloc((size_t)n * m), *tO = dalloc((size_t)n * dv);
                double *tdZ = dalloc((size_t)r * d), *tdth = dalloc((size_t)r);
                ref_lot_forward(n, m, d, dv, r, tQ, tK, tV, Z + (size_t)h * r * d,
                                th + (size_t)h * r, temp, T, eps, s, tA, tO);
                ref_lot_backward(n, m, d, dv, r, tQ, tK, tV, Z + (size_t)h * r * d,
                                 th + (size_t)h * r, temp, T, eps, s, tdO, edQ + p * Nq * d,
                                 edK + p * Nk * d, edV + p * Nk * dv, tdZ, tdth);
                for (int i = 0; i < n; i++) {
                    for (int j = 0; j < m; j++)
                        eA[(p * Nq + i) * Nk + j] = tA[(size_t)i * m + j];
                    for (int k = 0; k < dv; k++)
                        eO[(p * Nq + i) * dv + k] = tO[(size_t)i * dv + k];
                }
                for (int k = 0; k < r * d; k++)
                    edZ[(size_t)h * r * d + k] += tdZ[k];
                for (int t = 0; t < r; t++)
                    edth[(size_t)h * r + t] += tdth[t];
                free(tQ);
                free(tK);
                free(tV);
                free(tdO);
                free(tA);
                free(tO);
                free(tdZ);
                free(tdth);
            }
        double e = 0.0, t;
        t = max_abs_diff(A, eA, nA); e = t > e || isnan(t) ? t : e;
        t = max_abs_diff(O, eO, nO); e = t > e || isnan(t) ? t : e;
        t = max_abs_diff(dQ, edQ, nQ); e = t > e || isnan(t) ? t : e;
        t = max_abs_diff(dK, edK, nK); e = t > e || isnan(t) ? t : e;
        t = max_abs_diff(dV, edV, nV); e = t > e || isnan(t) ? t : e;
        t = max_abs_diff(dZ, edZ, (size_t)H * r * d); e = t > e || isnan(t) ? t : e;
        t = max_abs_diff(dth, edth, (size_t)H * r); e = t > e || isnan(t) ? t : e;
        char name[80], det[160];
        snprintf(name, sizeof name, "batched padded == truncated T=%d", T);
        snprintf(det, sizeof det,
                 "B=3 H=2 ql={6,4,0} kl={5,7,3}, NaN padding; max diff (A,O,dQ,dK,dV,dZ,dth) "
                 "%.1e",
                 e);
        th_report(e == 0.0, name, det);
        free(A);
        free(O);
        free(dQ);
        free(dK);
        free(dV);
        free(dZ);
        free(dth);
        free(eA);
        free(eO);
        free(edQ);
        free(edK);
        free(edV);
        free(edZ);
        free(edth);
    }
    /* NULL lengths = full. */
    {
        double *A = dalloc((size_t)1 * H * Nq * Nk), *O = dalloc((size_t)H * Nq * dv);
        double *tA = dalloc((size_t)Nq * Nk), *tO = dalloc((size_t)Nq * dv);
        double e = 0.0;
        /* Fully valid inputs. */
        double *fQ = dalloc((size_t)H * Nq * d), *fK = dalloc((size_t)H * Nk * d);
        double *fV = dalloc((size_t)H * Nk * dv);
        fill(g, fQ, (size_t)H * Nq * d, -1, 1);
        fill(g, fK, (size_t)H * Nk * d, -1, 1);
        fill(g, fV, (size_t)H * Nk * dv, -1, 1);
        ref_lot_forward_batched(1, H, Nq, Nk, d, dv, r, NULL, NULL, fQ, fK, fV, Z, th, temp, 3,
                                eps, s, A, O);
        for (int h = 0; h < H; h++) {
            ref_lot_forward(Nq, Nk, d, dv, r, fQ + (size_t)h * Nq * d, fK + (size_t)h * Nk * d,
                            fV + (size_t)h * Nk * dv, Z + (size_t)h * r * d, th + (size_t)h * r,
                            temp, 3, eps, s, tA, tO);
            double t1 = max_abs_diff(A + (size_t)h * Nq * Nk, tA, (size_t)Nq * Nk);
            double t2 = max_abs_diff(O + (size_t)h * Nq * dv, tO, (size_t)Nq * dv);
            if (!(t1 <= e))
                e = t1;
            if (!(t2 <= e))
                e = t2;
        }
        char det[100];
        snprintf(det, sizeof det, "max diff %.1e", e);
        th_report(e == 0.0, "batched NULL lengths == full problems", det);
        free(fQ);
        free(fK);
        free(fV);
        free(A);
        free(O);
        free(tA);
        free(tO);
    }
    free(Q);
    free(K);
    free(V);
    free(dO);
    free(Z);
    free(th);
}

int main(void)
{
    TH.verbose = 1; /* one line per check, as before */
    lcg g = {0x5eed1ab5c0ffee01ULL};
    double worst = 0.0;
    check_fd(&g, &worst);
    char det[80];
    snprintf(det, sizeof det, "worst relative error over all 20 configs %.2e", worst);
    th_report(worst < 1e-6, "fd grads summary", det);
    check_T1(&g);
    check_margins(&g);
    check_r1(&g);
    check_rank(&g);
    check_batched(&g);
    return th_summary();
}
