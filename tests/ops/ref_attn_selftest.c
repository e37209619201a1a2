/*
 * ref_attn_selftest.c -- checks the naive reference (ref_attn.c) against
 * itself and against independently coded formulas:
 *   1. S = 1 equals plain softmax attention (forward and backward).
 *   2. Analytic dQ, dK, dV equal central finite differences of
 *      L = sum(dO .* O) (h = 1e-6), S in {1,2,3,4,5,9}, 5x5 and 4x7.
 *   3. Marginals: rows exact for odd S, columns (= n/m) exact for even S;
 *      ref_sinkhorn_converge reaches its tolerance and matches the forward.
 *   4. Batched + padded results equal the truncated problems; padding zero.
 *   5. The matrix-form forward equals a log-domain (potential) forward.
 * One line per check, then "N passed, N failed"; exit 1 on any failure.
 */
#include "ref_attn.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_selftest_util.h"

/* ------------------------------------------------------------------------ */
/* Harness                                                                  */
/* ------------------------------------------------------------------------ */







/* ------------------------------------------------------------------------ */
/* Independent softmax attention                                            */
/* ------------------------------------------------------------------------ */

/* Row-wise softmax of alpha Q K^T, then A V; and its backward. */
static void softmax_attn(int n, int m, int d, int dv, const double *Q, const double *K,
                         const double *V, double alpha, const double *dO, double *A, double *O,
                         double *dQ, double *dK, double *dV)
{
    double *P = dalloc((size_t)n * m);
    double *dS = dalloc((size_t)n * m);
    for (int i = 0; i < n; i++) {
        double rmax = -INFINITY;
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int k = 0; k < d; k++)
                s += Q[i * d + k] * K[j * d + k];
            P[i * m + j] = alpha * s;
            if (P[i * m + j] > rmax)
                rmax = P[i * m + j];
        }
        double z = 0.0;
        for (int j = 0; j < m; j++) {
            P[i * m + j] = exp(P[i * m + j] - rmax);
            z += P[i * m + j];
        }
        for (int j = 0; j < m; j++)
            P[i * m + j] /= z;
    }
    memcpy(A, P, (size_t)n * m * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int c = 0; c < dv; c++) {
            double s = 0.0;
            for (int j = 0; j < m; j++)
                s += P[i * m + j] * V[j * dv + c];
            O[i * dv + c] = s;
        }
    /* dV = P^T dO; dP = dO V^T; dS = P .* (dP - rowsum(P .* dP)). */
    for (int j = 0; j < m; j++)
        for (int c = 0; c < dv; c++) {
            double s = 0.0;
            for (int i = 0; i < n; i++)
                s += P[i * m + j] * dO[i * dv + c];
            dV[j * dv + c] = s;
        }
    for (int i = 0; i < n; i++) {
        double dot = 0.0;
        for (int j = 0; j < m; j++) {
            double dp = 0.0;
            for (int c = 0; c < dv; c++)
                dp += dO[i * dv + c] * V[j * dv + c];
            dS[i * m + j] = dp;
            dot += dp * P[i * m + j];
        }
        for (int j = 0; j < m; j++)
            dS[i * m + j] = P[i * m + j] * (dS[i * m + j] - dot);
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < d; k++) {
            double s = 0.0;
            for (int j = 0; j < m; j++)
                s += dS[i * m + j] * K[j * d + k];
            dQ[i * d + k] = alpha * s;
        }
    for (int j = 0; j < m; j++)
        for (int k = 0; k < d; k++) {
            double s = 0.0;
            for (int i = 0; i < n; i++)
                s += dS[i * m + j] * Q[i * d + k];
            dK[j * d + k] = alpha * s;
        }
    free(P);
    free(dS);
}

/* ------------------------------------------------------------------------ */
/* Independent log-domain forward (potentials), attention A = n P           */
/* ------------------------------------------------------------------------ */

static void logdomain_attn(int n, int m, int d, const double *Q, const double *K, double alpha,
                           int S, double *A)
{
    double *C = dalloc((size_t)n * m);
    double *f = dalloc((size_t)n);
    double *g = dalloc((size_t)m);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int k = 0; k < d; k++)
                s += Q[i * d + k] * K[j * d + k];
            C[i * m + j] = alpha * s;
        }
    const double la = -log((double)n), lb = -log((double)m);
    for (int j = 0; j < m; j++)
        g[j] = 0.0;
    for (int i = 0; i < n; i++)
        f[i] = 0.0;
    for (int t = 1; t <= S; t++) {
        if (t % 2 == 1) {
            for (int i = 0; i < n; i++) {
                double mx = -INFINITY, z = 0.0;
                for (int j = 0; j < m; j++)
                    if (C[i * m + j] + g[j] > mx)
                        mx = C[i * m + j] + g[j];
                for (int j = 0; j < m; j++)
                    z += exp(C[i * m + j] + g[j] - mx);
                f[i] = la - (mx + log(z));
            }
        } else {
            for (int j = 0; j < m; j++) {
                double mx = -INFINITY, z = 0.0;
                for (int i = 0; i < n; i++)
                    if (C[i * m + j] + f[i] > mx)
                        mx = C[i * m + j] + f[i];
                for (int i = 0; i < n; i++)
                    z += exp(C[i * m + j] + f[i] - mx);
                g[j] = lb - (mx + log(z));
            }
        }
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++)
            A[i * m + j] = exp(C[i * m + j] + f[i] + g[j] - la);
    free(C);
    free(f);
    free(g);
}

/* ------------------------------------------------------------------------ */
/* Problem set-up                                                           */
/* ------------------------------------------------------------------------ */

typedef struct {
    int n, m, d, dv;
    double alpha;
    double *Q, *K, *V, *dO;
} problem;

static problem make_problem(int n, int m, int d, int dv, double alpha, uint64_t seed)
{
    problem p;
    lcg g = {seed};
    p.n = n;
    p.m = m;
    p.d = d;
    p.dv = dv;
    p.alpha = alpha;
    p.Q = dalloc((size_t)n * d);
    p.K = dalloc((size_t)m * d);
    p.V = dalloc((size_t)m * dv);
    p.dO = dalloc((size_t)n * dv);
    fill(&g, p.Q, (size_t)n * d, -1.5, 1.5);
    fill(&g, p.K, (size_t)m * d, -1.5, 1.5);
    fill(&g, p.V, (size_t)m * dv, -1.0, 1.0);
    fill(&g, p.dO, (size_t)n * dv, -1.0, 1.0);
    return p;
}

static void free_problem(problem *p)
{
    free(p->Q);
    free(p->K);
    free(p->V);
    free(p->dO);
}

static double loss(const problem *p, int S)
{
    double *A = dalloc((size_t)p->n * p->m);
    double *O = dalloc((size_t)p->n * p->dv);
    ref_sinkhorn_forward(p->n, p->m, p->d, p->dv, p->Q, p->K, p->V, p->alpha, S, A, O);
    double L = 0.0;
    for (int i = 0; i < p->n * p->dv; i++)
        L += p->dO[i] * O[i];
    free(A);
    free(O);
    return L;
}

/* Central FD of loss() w.r.t. every entry of x (which is one of p's arrays);
 * returns max|analytic - fd| / max|fd| (normwise relative). */
static double fd_error(problem *p, int S, double *x, size_t count, const double *analytic,
                       double h, double *abs_err)
{
    double emax = 0.0, gmax = 0.0;
    for (size_t k = 0; k < count; k++) {
        double x0 = x[k];
        x[k] = x0 + h;
        double Lp = loss(p, S);
        x[k] = x0 - h;
        double Lm = loss(p, S);
        x[k] = x0;
        double fd = (Lp - Lm) / (2.0 * h);
        double e = fabs(fd - analytic[k]);
        if (!(e <= emax))
            emax = e;
        if (fabs(fd) > gmax)
            gmax = fabs(fd);
    }
    *abs_err = emax;
    return emax / (gmax > 0.0 ? gmax : 1e-300);
}

/* ------------------------------------------------------------------------ */
/* Checks                                                                   */
/* ------------------------------------------------------------------------ */

static const int shapes[2][2] = {{5, 5}, {4, 7}};
static const int Svals[6] = {1, 2, 3, 4, 5, 9};

static void check_softmax(double *worst)
{
    for (int s = 0; s < 2; s++) {
        const int n = shapes[s][0], m = shapes[s][1], d = 3, dv = 2;
        problem p = make_problem(n, m, d, dv, 0.8, 1000 + (uint64_t)s);
        double *A1 = dalloc((size_t)n * m), *O1 = dalloc((size_t)n * dv);
        double *A2 = dalloc((size_t)n * m), *O2 = dalloc((size_t)n * dv);
        double *dQ1 = dalloc((size_t)n * d), *dK1 = dalloc((size_t)m * d);
        double *dV1 = dalloc((size_t)m * dv);
        double *dQ2 = dalloc((size_t)n * d), *dK2 = dalloc((size_t)m * d);
        double *dV2 = dalloc((size_t)m * dv);
        ref_sinkhorn_forward(n, m, d, dv, p.Q, p.K, p.V, p.alpha, 1, A1, O1);
        ref_sinkhorn_backward(n, m, d, dv, p.Q, p.K, p.V, p.alpha, 1, p.dO, dQ1, dK1, dV1);
        softmax_attn(n, m, d, dv, p.Q, p.K, p.V, p.alpha, p.dO, A2, O2, dQ2, dK2, dV2);
        double eA = max_abs_diff(A1, A2, (size_t)n * m);
        double eO = max_abs_diff(O1, O2, (size_t)n * dv);
        double eg = fmax(max_abs_diff(dQ1, dQ2, (size_t)n * d),
                         fmax(max_abs_diff(dK1, dK2, (size_t)m * d),
                              max_abs_diff(dV1, dV2, (size_t)m * dv)));
        double e = fmax(eA, fmax(eO, eg));
        if (!(e <= worst[0]))
            worst[0] = e;
        char name[64], det[160];
        snprintf(name, sizeof name, "softmax S=1 %dx%d", n, m);
        snprintf(det, sizeof det, "max|dA|=%.2e max|dO|=%.2e max|dgrad|=%.2e (tol 1e-13)", eA, eO,
                 eg);
        th_report(e < 1e-13, name, det);
        free(A1); free(O1); free(A2); free(O2);
        free(dQ1); free(dK1); free(dV1); free(dQ2); free(dK2); free(dV2);
        free_problem(&p);
    }
}

static void check_fd(double *worst)
{
    const double h = 1e-6;
    for (int s = 0; s < 2; s++) {
        for (int k = 0; k < 6; k++) {
            const int n = shapes[s][0], m = shapes[s][1], d = 3, dv = 2, S = Svals[k];
            problem p = make_problem(n, m, d, dv, 0.9, 2000 + 17 * (uint64_t)s + (uint64_t)k);
            double *dQ = dalloc((size_t)n * d), *dK = dalloc((size_t)m * d);
            double *dV = dalloc((size_t)m * dv);
            ref_sinkhorn_backward(n, m, d, dv, p.Q, p.K, p.V, p.alpha, S, p.dO, dQ, dK, dV);
            double aQ, aK, aV;
            double rQ = fd_error(&p, S, p.Q, (size_t)n * d, dQ, h, &aQ);
            double rK = fd_error(&p, S, p.K, (size_t)m * d, dK, h, &aK);
            double rV = fd_error(&p, S, p.V, (size_t)m * dv, dV, h, &aV);
            double r = fmax(rQ, fmax(rK, rV));
            if (!(r <= worst[1]))
                worst[1] = r;
            char name[64], det[200];
            snprintf(name, sizeof name, "finite differences S=%d %dx%d", S, n, m);
            snprintf(det, sizeof det,
                     "rel err dQ=%.2e dK=%.2e dV=%.2e (max|grad| Q %.2f K %.2f) (tol 1e-6)", rQ,
                     rK, rV, max_abs(dQ, (size_t)n * d), max_abs(dK, (size_t)m * d));
            th_report(r < 1e-6, name, det);
            free(dQ); free(dK); free(dV);
            free_problem(&p);
        }
    }
}

static void check_marginals(double *worst)
{
    for (int s = 0; s < 2; s++) {
        for (int k = 0; k < 6; k++) {
            const int n = shapes[s][0], m = shapes[s][1], d = 3, dv = 2, S = Svals[k];
            problem p = make_problem(n, m, d, dv, 0.9, 3000 + 17 * (uint64_t)s + (uint64_t)k);
            double *A = dalloc((size_t)n * m), *O = dalloc((size_t)n * dv);
            ref_sinkhorn_forward(n, m, d, dv, p.Q, p.K, p.V, p.alpha, S, A, O);
            double re, ce;
            ref_marginal_errors(n, m, A, &re, &ce);
            double exact = (S % 2 == 1) ? re : ce;
            if (!(exact <= worst[2]))
                worst[2] = exact;
            char name[64], det[160];
            snprintf(name, sizeof name, "marginals S=%d %dx%d", S, n, m);
            snprintf(det, sizeof det, "%s exact: err %.2e (tol 1e-14); other marginal err %.2e",
                     (S % 2 == 1) ? "rows" : "cols", exact, (S % 2 == 1) ? ce : re);
            th_report(exact < 1e-14, name, det);
            free(A); free(O);
            free_problem(&p);
        }
    }
    /* Converged Sinkhorn. */
    for (int s = 0; s < 2; s++) {
        const int n = shapes[s][0], m = shapes[s][1], d = 3, dv = 2;
        const double tol = 1e-12;
        problem p = make_problem(n, m, d, dv, 0.9, 4000 + (uint64_t)s);
        double *A = dalloc((size_t)n * m), *O = dalloc((size_t)n * dv);
        double *A2 = dalloc((size_t)n * m), *O2 = dalloc((size_t)n * dv);
        int used = ref_sinkhorn_converge(n, m, d, dv, p.Q, p.K, p.V, p.alpha, tol, 2000, A, O);
        double re, ce;
        ref_marginal_errors(n, m, A, &re, &ce);
        ref_sinkhorn_forward(n, m, d, dv, p.Q, p.K, p.V, p.alpha, used, A2, O2);
        double diff = fmax(max_abs_diff(A, A2, (size_t)n * m), max_abs_diff(O, O2, (size_t)n * dv));
        /* Capped run: max_steps even -> last odd step, and exactly that many. */
        int capped = ref_sinkhorn_converge(n, m, d, dv, p.Q, p.K, p.V, p.alpha, 0.0, 6, A, O);
        char name[64], det[200];
        snprintf(name, sizeof name, "converge tol=1e-12 %dx%d", n, m);
        snprintf(det, sizeof det,
                 "steps %d, row err %.2e, col err %.2e, |conv - forward(S)| %.2e, capped(6) -> %d",
                 used, re, ce, diff, capped);
        th_report(used % 2 == 1 && used < 2000 && re < tol && ce < tol && diff == 0.0 &&
                      capped == 5,
               name, det);
        free(A); free(O); free(A2); free(O2);
        free_problem(&p);
    }
}

/* Batched padded vs truncated. Padded input entries hold NaN. */
static void check_batched(double *worst)
{
    enum { B = 4, H = 2, Nq = 6, Nk = 7, d = 3, dv = 2 };
    const int ql[B] = {6, 3, 0, 4};
    const int kl[B] = {7, 4, 5, 0};
    const int S_list[3] = {1, 4, 5};
    const double alpha = 0.7;
    const size_t nQ = (size_t)B * H * Nq * d, nK = (size_t)B * H * Nk * d;
    const size_t nV = (size_t)B * H * Nk * dv, nO = (size_t)B * H * Nq * dv;
    const size_t nA = (size_t)B * H * Nq * Nk;
    double *Q = dalloc(nQ), *K = dalloc(nK), *V = dalloc(nV), *dO = dalloc(nO);
    double *A = dalloc(nA), *O = dalloc(nO);
    double *dQ = dalloc(nQ), *dK = dalloc(nK), *dV = dalloc(nV);
    lcg g = {5000};
    fill(&g, Q, nQ, -1.5, 1.5);
    fill(&g, K, nK, -1.5, 1.5);
    fill(&g, V, nV, -1.0, 1.0);
    fill(&g, dO, nO, -1.0, 1.0);
    /* Poison the padding. */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t pi = (size_t)b * H + h;
            for (int i = ql[b]; i < Nq; i++) {
                for (int k = 0; k < d; k++)
                    Q[(pi * Nq + i) * d + k] = NAN;
                for (int k = 0; k < dv; k++)
                    dO[(pi * Nq + i) * dv + k] = NAN;
            }
            for (int j = kl[b]; j < Nk; j++) {
                for (int k = 0; k < d; k++)
                    K[(pi * Nk + j) * d + k] = NAN;
                for (int k = 0; k < dv; k++)
                    V[(pi * Nk + j) * dv + k] = NAN;
            }
        }
    for (int si = 0; si < 3; si++) {
        const int S = S_list[si];
        ref_attn_forward_batched(B, H, Nq, Nk, d, dv, ql, kl, Q, K, V, alpha, S, A, O);
        ref_attn_backward_batched(B, H, Nq, Nk, d, dv, ql, kl, Q, K, V, alpha, S, dO, dQ, dK,
                                  dV);
        double diff = 0.0;   /* valid block vs truncated run */
        double padmax = 0.0; /* largest |value| in padded positions */
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                const size_t pi = (size_t)b * H + h;
                const int Lq = ql[b], Lk = kl[b];
                const double *Ap = A + pi * Nq * Nk, *Op = O + pi * Nq * dv;
                const double *dQp = dQ + pi * Nq * d, *dKp = dK + pi * Nk * d;
                const double *dVp = dV + pi * Nk * dv;
                int valid = (Lq > 0 && Lk > 0);
                double *At = dalloc((size_t)Nq * Nk), *Ot = dalloc((size_t)Nq * dv);
                double *dQt = dalloc((size_t)Nq * d), *dKt = dalloc((size_t)Nk * d);
                double *dVt = dalloc((size_t)Nk * dv);
                if (valid) {
                    /* Truncated copies (fresh buffers, no NaN). */
                    double *Qt = dalloc((size_t)Lq * d), *Kt = dalloc((size_t)Lk * d);
                    double *Vt = dalloc((size_t)Lk * dv), *dOt = dalloc((size_t)Lq * dv);
                    memcpy(Qt, Q + pi * Nq * d, (size_t)Lq * d * sizeof(double));
                    memcpy(Kt, K + pi * Nk * d, (size_t)Lk * d * sizeof(double));
                    memcpy(Vt, V + pi * Nk * dv, (size_t)Lk * dv * sizeof(double));
                    memcpy(dOt, dO + pi * Nq * dv, (size_t)Lq * dv * sizeof(double));
                    ref_sinkhorn_forward(Lq, Lk, d, dv, Qt, Kt, Vt, alpha, S, At, Ot);
                    ref_sinkhorn_backward(Lq, Lk, d, dv, Qt, Kt, Vt, alpha, S, dOt, dQt, dKt,
                                          dVt);
                    free(Qt); free(Kt); free(Vt); free(dOt);
                }
                for (int i = 0; i < Nq; i++)
                    for (int j = 0; j < Nk; j++) {
                        double v = Ap[(size_t)i * Nk + j];
                        if (valid && i < Lq && j < Lk)
                            diff = fmax(diff, fabs(v - At[(size_t)i * Lk + j]) +
                                                  (isnan(v) ? INFINITY : 0.0));
                        else
                            padmax = fmax(padmax, isnan(v) ? INFINITY : fabs(v));
                    }
                for (int i = 0; i < Nq; i++) {
                    for (int k = 0; k < dv; k++) {
                        double v = Op[(size_t)i * dv + k];
                        if (valid && i < Lq)
                            diff = fmax(diff, isnan(v) ? INFINITY : fabs(v - Ot[i * dv + k]));
                        else
                            padmax = fmax(padmax, isnan(v) ? INFINITY : fabs(v));
                    }
                    for (int k = 0; k < d; k++) {
                        double v = dQp[(size_t)i * d + k];
                        if (valid && i < Lq)
                            diff = fmax(diff, isnan(v) ? INFINITY : fabs(v - dQt[i * d + k]));
                        else
                            padmax = fmax(padmax, isnan(v) ? INFINITY : fabs(v));
                    }
                }
                for (int j = 0; j < Nk; j++) {
                    for (int k = 0; k < d; k++) {
                        double v = dKp[(size_t)j * d + k];
                        if (valid && j < Lk)
                            diff = fmax(diff, isnan(v) ? INFINITY : fabs(v - dKt[j * d + k]));
                        else
                            padmax = fmax(padmax, isnan(v) ? INFINITY : fabs(v));
                    }
                    for (int k = 0; k < dv; k++) {
                        double v = dVp[(size_t)j * dv + k];
                        if (valid && j < Lk)
                            diff = fmax(diff, isnan(v) ? INFINITY : fabs(v - dVt[j * dv + k]));
                        else
                            padmax = fmax(padmax, isnan(v) ? INFINITY : fabs(v));
                    }
                }
                free(At); free(Ot); free(dQt); free(dKt); free(dVt);
            }
        double e = fmax(diff, padmax);
        if (!(e <= worst[3]))
            worst[3] = e;
        char name[64], det[160];
        snprintf(name, sizeof name, "batched padded == truncated S=%d", S);
        snprintf(det, sizeof det,
                 "B=%d H=%d Nq=%d Nk=%d, NaN padding: max|diff| %.2e, max|padded out| %.2e", B,
                 H, Nq, Nk, diff, padmax);
        th_report(diff == 0.0 && padmax == 0.0, name, det);
    }
    /* NULL lengths == full lengths, B*H = 1 like any other. */
    {
        const int n = 5, m = 6;
        problem p = make_problem(n, m, d, dv, 0.7, 6000);
        double *A1 = dalloc((size_t)n * m), *O1 = dalloc((size_t)n * dv);
        double *A2 = dalloc((size_t)n * m), *O2 = dalloc((size_t)n * dv);
        const int qf[1] = {n}, kf[1] = {m};
        ref_sinkhorn_forward(n, m, d, dv, p.Q, p.K, p.V, 0.7, 3, A1, O1);
        ref_attn_forward_batched(1, 1, n, m, d, dv, NULL, NULL, p.Q, p.K, p.V, 0.7, 3, A2, O2);
        double e1 = fmax(max_abs_diff(A1, A2, (size_t)n * m), max_abs_diff(O1, O2, (size_t)n * dv));
        ref_attn_forward_batched(1, 1, n, m, d, dv, qf, kf, p.Q, p.K, p.V, 0.7, 3, A2, O2);
        double e2 = fmax(max_abs_diff(A1, A2, (size_t)n * m), max_abs_diff(O1, O2, (size_t)n * dv));
        char det[120];
        snprintf(det, sizeof det, "NULL lengths diff %.2e, full lengths diff %.2e", e1, e2);
        th_report(e1 == 0.0 && e2 == 0.0, "batched B=H=1 == single problem", det);
        free(A1); free(O1); free(A2); free(O2);
        free_problem(&p);
    }
    free(Q); free(K); free(V); free(dO); free(A); free(O);
    free(dQ); free(dK); free(dV);
}

static void check_logdomain(double *worst)
{
    for (int s = 0; s < 2; s++) {
        for (int k = 0; k < 6; k++) {
            const int n = shapes[s][0], m = shapes[s][1], d = 3, dv = 2, S = Svals[k];
            problem p = make_problem(n, m, d, dv, 0.9, 7000 + 17 * (uint64_t)s + (uint64_t)k);
            double *A = dalloc((size_t)n * m), *O = dalloc((size_t)n * dv);
            double *A2 = dalloc((size_t)n * m);
            ref_sinkhorn_forward(n, m, d, dv, p.Q, p.K, p.V, p.alpha, S, A, O);
            logdomain_attn(n, m, d, p.Q, p.K, p.alpha, S, A2);
            double e = max_abs_diff(A, A2, (size_t)n * m);
            if (!(e <= worst[4]))
                worst[4] = e;
            char name[64], det[100];
            snprintf(name, sizeof name, "matrix form == log-domain S=%d %dx%d", S, n, m);
            snprintf(det, sizeof det, "max|dA| %.2e (tol 1e-13)", e);
            th_report(e < 1e-13, name, det);
            free(A); free(O); free(A2);
            free_problem(&p);
        }
    }
}

int main(void)
{
    TH.verbose = 1; /* one line per check, as before */
    double worst[5] = {0, 0, 0, 0, 0};
    check_softmax(worst);
    check_fd(worst);
    check_marginals(worst);
    check_batched(worst);
    check_logdomain(worst);
    printf("worst: softmax %.2e, FD rel %.2e, exact marginal %.2e, batched %.2e, "
           "log-domain %.2e\n",
           worst[0], worst[1], worst[2], worst[3], worst[4]);
    return th_summary();
}
