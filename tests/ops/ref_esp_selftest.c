/*
 * ref_esp_selftest.c -- checks the naive ESP reference (ref_esp.c) against
 * finite differences, independently coded formulas and the properties of
 * the ESPFormer digest (section 5):
 *   1. Soft sort: analytic dQ, dK, dV, dTheta equal central finite
 *      differences (h = 1e-6) over t, cost, output scale, shape, slices, tau.
 *   2. Hard sort: dV equals (exact, linear) differences; dQ, dK equal finite
 *      differences with steps that change no rank; dTheta = 0; tau = 0 gives
 *      dQ = dK = 0 exactly.
 *   3. Hard ESP is doubly stochastic (rows 1, columns n/m under 'rows' scale).
 *   4. tau = 0 is the mean of the single-slice plans; large tau selects the
 *      argmin slice; E_sigma[D] does not increase with tau.
 *   5. Soft sort tends to hard sort as t -> 0 (distinct values).
 *   6. Permutation equivariance (forward and backward).
 *   7. K = Q (or K = Q + shift): hard G = I/n and O = V ('rows' scale);
 *      Euclidean gradient at zero distance; stable tie-breaking.
 *   8. Batched + padded (NaN padding) equals the truncated problems.
 *   9. 1-D optimality: D equals brute-force assignment (n = m) and the
 *      quantile-function integral (n != m) for m = L = 1.
 * One line per check, then "N passed, N failed"; exit 1 on any failure.
 */
#include "ref_esp.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_selftest_util.h"

/* ------------------------------------------------------------------------ */
/* Harness                                                                  */
/* ------------------------------------------------------------------------ */


/* Keep the largest value seen; NaN wins. */
static void track(double *worst, double e)
{
    if (!(e <= *worst))
        *worst = e;
}



/* Fisher-Yates permutation of 0..n-1. */
static void random_perm(lcg *g, int n, int *perm)
{
    for (int i = 0; i < n; i++)
        perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)lcg_uniform(g, 0.0, (double)(i + 1));
        if (j > i)
            j = i;
        int tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
}




/* ------------------------------------------------------------------------ */
/* Problem set-up                                                           */
/* ------------------------------------------------------------------------ */

typedef struct {
    int n, m, d, dv, L;
    double *Q, *K, *V, *dO;
    double *theta; /* L x d unit rows, or NULL (axis-aligned, L = d) */
} problem;

/* L = 0: axis-aligned slices (L = d); otherwise L random unit slices. */
static problem make_problem(int n, int m, int d, int dv, int L, uint64_t seed)
{
    problem p;
    lcg g = {seed};
    p.n = n;
    p.m = m;
    p.d = d;
    p.dv = dv;
    p.Q = dalloc((size_t)n * d);
    p.K = dalloc((size_t)m * d);
    p.V = dalloc((size_t)m * dv);
    p.dO = dalloc((size_t)n * dv);
    fill(&g, p.Q, (size_t)n * d, -1.5, 1.5);
    fill(&g, p.K, (size_t)m * d, -1.5, 1.5);
    fill(&g, p.V, (size_t)m * dv, -1.0, 1.0);
    fill(&g, p.dO, (size_t)n * dv, -1.0, 1.0);
    if (L == 0) {
        p.L = d;
        p.theta = NULL;
    } else {
        p.L = L;
        p.theta = dalloc((size_t)L * d);
        fill(&g, p.theta, (size_t)L * d, -1.0, 1.0);
        for (int l = 0; l < L; l++) {
            double s = 0.0;
            for (int k = 0; k < d; k++)
                s += p.theta[l * d + k] * p.theta[l * d + k];
            s = sqrt(s);
            for (int k = 0; k < d; k++)
                p.theta[l * d + k] /= s;
        }
    }
    return p;
}

static void free_problem(problem *p)
{
    free(p->Q);
    free(p->K);
    free(p->V);
    free(p->dO);
    free(p->theta);
}

static ref_esp_cfg make_cfg(const problem *p, int sort, double t, double tau, double scale,
                            int cost, int out_scale)
{
    ref_esp_cfg c;
    c.sort = sort;
    c.t = t;
    c.tau = tau;
    c.scale = scale;
    c.cost = cost;
    c.out_scale = out_scale;
    c.L = (p->theta != NULL) ? p->L : 0;
    c.theta = p->theta;
    return c;
}

/* sum(dO .* O) at the problem's current arrays. */
static double loss(const problem *p, const ref_esp_cfg *c)
{
    double *O = dalloc((size_t)p->n * p->dv);
    ref_esp_forward(p->n, p->m, p->d, p->dv, p->Q, p->K, p->V, c, NULL, O, NULL, NULL);
    double L = 0.0;
    for (int i = 0; i < p->n * p->dv; i++)
        L += p->dO[i] * O[i];
    free(O);
    return L;
}

/* Central FD of loss() w.r.t. every entry of x (an array the loss reads);
 * returns max|analytic - fd| / max|fd| (normwise relative). */
static double fd_error(const problem *p, const ref_esp_cfg *c, double *x, size_t count,
                       const double *analytic, double h)
{
    double emax = 0.0, gmax = 0.0;
    for (size_t k = 0; k < count; k++) {
        double x0 = x[k];
        x[k] = x0 + h;
        double Lp = loss(p, c);
        x[k] = x0 - h;
        double Lm = loss(p, c);
        x[k] = x0;
        double fd = (Lp - Lm) / (2.0 * h);
        track(&emax, fabs(fd - analytic[k]));
        track(&gmax, fabs(fd));
    }
    return emax / (gmax > 0.0 ? gmax : 1.0);
}

/* Smallest gap between two projected values of X (N x d) on any slice,
 * with X scaled by scale. theta NULL = axis-aligned (L = d). */
static double proj_min_gap(int N, int d, const double *X, int L, const double *theta,
                           double scale)
{
    double gap = INFINITY;
    double *a = dalloc((size_t)N);
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < N; i++) {
            double s = 0.0;
            for (int k = 0; k < d; k++)
                s += scale * X[i * d + k] * (theta ? theta[l * d + k] : (double)(l == k));
            a[i] = s;
        }
        for (int i = 0; i < N; i++)
            for (int j = i + 1; j < N; j++)
                if (fabs(a[i] - a[j]) < gap)
                    gap = fabs(a[i] - a[j]);
    }
    free(a);
    return gap;
}

static double problem_min_gap(const problem *p, double scale)
{
    return fmin(proj_min_gap(p->n, p->d, p->Q, p->L, p->theta, scale),
                proj_min_gap(p->m, p->d, p->K, p->L, p->theta, scale));
}

static const int shapes[2][2] = {{5, 5}, {4, 7}};

/* Slice configurations: {d, L} with L = 0 meaning axis-aligned (L = d). */
static const int slicings[2][2] = {{4, 3}, {3, 0}};

static const char *cost_name(int cost)
{
    return cost == 0 ? "sq" : "euclid";
}

static const char *scale_name(int out)
{
    return out == 0 ? "rows" : "paper";
}

/* ------------------------------------------------------------------------ */
/* 1. Soft-sort gradients vs finite differences                             */
/* ------------------------------------------------------------------------ */

static void check_fd_soft(double *worst)
{
    const double h = 1e-6, scale = 0.8;
    const double tvals[2] = {0.1, 1.0}, tauvals[2] = {0.0, 2.0};
    int seed = 0;
    for (int ti = 0; ti < 2; ti++)
        for (int cost = 0; cost < 2; cost++)
            for (int out = 0; out < 2; out++)
                for (int s = 0; s < 2; s++)
                    for (int sl = 0; sl < 2; sl++)
                        for (int ui = 0; ui < 2; ui++) {
                            const int n = shapes[s][0], m = shapes[s][1];
                            const int d = slicings[sl][0], dv = 2;
                            problem p = make_problem(n, m, d, dv, slicings[sl][1],
                                                     100 + (uint64_t)seed++);
                            ref_esp_cfg c =
                                make_cfg(&p, 1, tvals[ti], tauvals[ui], scale, cost, out);
                            const int L = p.L;
                            double *dQ = dalloc((size_t)n * d), *dK = dalloc((size_t)m * d);
                            double *dV = dalloc((size_t)m * dv), *dT = dalloc((size_t)L * d);
                            ref_esp_backward(n, m, d, dv, p.Q, p.K, p.V, &c, p.dO, dQ, dK, dV,
                                             dT);
                            double rQ = fd_error(&p, &c, p.Q, (size_t)n * d, dQ, h);
                            double rK = fd_error(&p, &c, p.K, (size_t)m * d, dK, h);
                            double rV = fd_error(&p, &c, p.V, (size_t)m * dv, dV, h);
                            double rT;
                            if (p.theta != NULL) {
                                rT = fd_error(&p, &c, p.theta, (size_t)L * d, dT, h);
                            } else {
                                /* Gradient at Theta = I: differentiate an
                                 * explicit identity slice matrix. */
                                double *eye = dalloc((size_t)d * d);
                                for (int k = 0; k < d * d; k++)
                                    eye[k] = (k % (d + 1) == 0) ? 1.0 : 0.0;
                                ref_esp_cfg ce = c;
                                ce.theta = eye;
                                ce.L = d;
                                rT = fd_error(&p, &ce, eye, (size_t)d * d, dT, h);
                                free(eye);
                            }
                            double r = fmax(fmax(rQ, rK), fmax(rV, rT));
                            track(worst, r);
                            char name[128], det[200];
                            snprintf(name, sizeof name,
                                     "soft FD t=%g %s %s %dx%d %s tau=%g", tvals[ti],
                                     cost_name(cost), scale_name(out), n, m,
                                     p.theta ? "theta L=3" : "axis", tauvals[ui]);
                            snprintf(det, sizeof det,
                                     "rel err dQ %.1e dK %.1e dV %.1e dTheta %.1e "
                                     "(max|g| Q %.2g K %.2g) (tol 1e-6)",
                                     rQ, rK, rV, rT, max_abs(dQ, (size_t)n * d),
                                     max_abs(dK, (size_t)m * d));
                            th_report(r < 1e-6, name, det);
                            free(dQ);
                            free(dK);
                            free(dV);
                            free(dT);
                            free_problem(&p);
                        }
}

/* ------------------------------------------------------------------------ */
/* 2. Hard-sort gradients                                                   */
/* ------------------------------------------------------------------------ */

static void check_fd_hard(double *worst_v, double *worst_qk)
{
    const double scale = 0.8;
    int seed = 0;
    for (int cost = 0; cost < 2; cost++)
        for (int out = 0; out < 2; out++)
            for (int s = 0; s < 2; s++)
                for (int sl = 0; sl < 2; sl++) {
                    const int n = shapes[s][0], m = shapes[s][1];
                    const int d = slicings[sl][0], dv = 2;
                    problem p =
                        make_problem(n, m, d, dv, slicings[sl][1], 300 + (uint64_t)seed++);
                    const int L = p.L;
                    const double gap = problem_min_gap(&p, scale);
                    ref_esp_cfg c = make_cfg(&p, 0, 0.0, 2.0, scale, cost, out);
                    double *dQ = dalloc((size_t)n * d), *dK = dalloc((size_t)m * d);
                    double *dV = dalloc((size_t)m * dv), *dT = dalloc((size_t)L * d);
                    ref_esp_backward(n, m, d, dv, p.Q, p.K, p.V, &c, p.dO, dQ, dK, dV, dT);
                    /* O is linear in V: any step is exact up to rounding. */
                    double rV = fd_error(&p, &c, p.V, (size_t)m * dv, dV, 0.5);
                    /* Steps far below the smallest projection gap keep all ranks. */
                    double rQ = fd_error(&p, &c, p.Q, (size_t)n * d, dQ, 1e-6);
                    double rK = fd_error(&p, &c, p.K, (size_t)m * d, dK, 1e-6);
                    double tmax = max_abs(dT, (size_t)L * d);
                    double gq = max_abs(dQ, (size_t)n * d), gk = max_abs(dK, (size_t)m * d);
                    /* tau = 0: no gradient reaches Q and K at all. */
                    ref_esp_cfg c0 = make_cfg(&p, 0, 0.0, 0.0, scale, cost, out);
                    ref_esp_backward(n, m, d, dv, p.Q, p.K, p.V, &c0, p.dO, dQ, dK, dV, dT);
                    double z0 = fmax(max_abs(dQ, (size_t)n * d), max_abs(dK, (size_t)m * d));
                    double rV0 = fd_error(&p, &c0, p.V, (size_t)m * dv, dV, 0.5);
                    track(worst_v, fmax(rV, rV0));
                    track(worst_qk, fmax(rQ, rK));
                    char name[128], det[260];
                    snprintf(name, sizeof name, "hard FD %s %s %dx%d %s", cost_name(cost),
                             scale_name(out), n, m, p.theta ? "theta L=3" : "axis");
                    snprintf(det, sizeof det,
                             "tau=2: rel err dV %.1e (h=0.5, tol 1e-12) dQ %.1e dK %.1e "
                             "(h=1e-6, gap %.1e, tol 1e-6, max|g| %.2g), |dTheta| %g; "
                             "tau=0: |dQ|,|dK| %g, dV %.1e",
                             rV, rQ, rK, gap, fmax(gq, gk), tmax, z0, rV0);
                    th_report(rV < 1e-12 && rV0 < 1e-12 && rQ < 1e-6 && rK < 1e-6 && gap > 1e-3 &&
                               tmax == 0.0 && z0 == 0.0 && fmax(gq, gk) > 0.0,
                           name, det);
                    free(dQ);
                    free(dK);
                    free(dV);
                    free(dT);
                    free_problem(&p);
                }
}

/* ------------------------------------------------------------------------ */
/* 3. Hard ESP marginals                                                    */
/* ------------------------------------------------------------------------ */

/* Row-sum and column-sum errors of A (n x m) against targets; min entry. */
static void marginals(int n, int m, const double *A, double rt, double ct, double *re,
                      double *ce, double *amin)
{
    *re = 0.0;
    *ce = 0.0;
    *amin = INFINITY;
    for (int i = 0; i < n; i++) {
        double s = 0.0;
        for (int j = 0; j < m; j++) {
            s += A[i * m + j];
            if (!(A[i * m + j] >= *amin))
                *amin = A[i * m + j];
        }
        track(re, fabs(s - rt));
    }
    for (int j = 0; j < m; j++) {
        double s = 0.0;
        for (int i = 0; i < n; i++)
            s += A[i * m + j];
        track(ce, fabs(s - ct));
    }
}

static void check_marginals(double *worst)
{
    static const int mshapes[4][2] = {{6, 6}, {5, 5}, {4, 7}, {7, 3}};
    const double tauvals[3] = {0.0, 1.0, 100.0};
    int seed = 0;
    for (int s = 0; s < 4; s++)
        for (int sl = 0; sl < 2; sl++)
            for (int out = 0; out < 2; out++) {
                const int n = mshapes[s][0], m = mshapes[s][1], d = slicings[sl][0], dv = 2;
                problem p = make_problem(n, m, d, dv, slicings[sl][1], 500 + (uint64_t)seed++);
                double *A = dalloc((size_t)n * m), *O = dalloc((size_t)n * dv);
                double err = 0.0, amin = INFINITY;
                for (int ui = 0; ui < 3; ui++)
                    for (int cost = 0; cost < 2; cost++) {
                        ref_esp_cfg c = make_cfg(&p, 0, 0.0, tauvals[ui], 0.8, cost, out);
                        ref_esp_forward(n, m, d, dv, p.Q, p.K, p.V, &c, A, O, NULL, NULL);
                        const double rt = out == 0 ? 1.0 : 1.0 / n;
                        const double ct = out == 0 ? (double)n / m : 1.0 / m;
                        double re, ce, mn;
                        marginals(n, m, A, rt, ct, &re, &ce, &mn);
                        track(&err, fmax(re, ce));
                        if (!(mn >= amin))
                            amin = mn;
                    }
                track(worst, err);
                char name[128], det[200];
                snprintf(name, sizeof name, "hard marginals %dx%d %s %s", n, m,
                         p.theta ? "theta L=3" : "axis", scale_name(out));
                snprintf(det, sizeof det,
                         "tau in {0,1,100}, both costs: rows %s, cols %s: max err %.1e "
                         "(tol 1e-14), min entry %g",
                         out == 0 ? "1" : "1/n", out == 0 ? "n/m" : "1/m", err, amin);
                th_report(err < 1e-14 && amin >= 0.0, name, det);
                free(A);
                free(O);
                free_problem(&p);
            }
    /* Soft: rows of the sorting matrices are exact, so only the total mass is. */
    for (int s = 0; s < 2; s++) {
        const int n = shapes[s][0], m = shapes[s][1], d = 4, dv = 2;
        problem p = make_problem(n, m, d, dv, 3, 550 + (uint64_t)s);
        double *A = dalloc((size_t)n * m), *O = dalloc((size_t)n * dv);
        ref_esp_cfg c = make_cfg(&p, 1, 0.3, 1.0, 0.8, 0, 0);
        ref_esp_forward(n, m, d, dv, p.Q, p.K, p.V, &c, A, O, NULL, NULL);
        double tot = 0.0, re, ce, mn;
        for (int k = 0; k < n * m; k++)
            tot += A[k];
        marginals(n, m, A, 1.0, (double)n / m, &re, &ce, &mn);
        char name[64], det[160];
        snprintf(name, sizeof name, "soft total mass %dx%d", n, m);
        snprintf(det, sizeof det,
                 "sum A - n = %.1e (tol 1e-13); row err %.1e, col err %.1e (not exact)",
                 tot - n, re, ce);
        th_report(fabs(tot - n) < 1e-13 && re > 1e-6, name, det);
        free(A);
        free(O);
        free_problem(&p);
    }
}

/* ------------------------------------------------------------------------ */
/* 4. tau limits                                                            */
/* ------------------------------------------------------------------------ */

static void check_tau(double *worst)
{
    const double taus[7] = {0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 100.0};
    int seed = 0;
    for (int sort = 0; sort < 2; sort++)
        for (int s = 0; s < 2; s++)
            for (int sl = 0; sl < 2; sl++) {
                const int n = shapes[s][0], m = shapes[s][1], d = slicings[sl][0], dv = 2;
                problem p = make_problem(n, m, d, dv, slicings[sl][1], 700 + (uint64_t)seed++);
                const int L = p.L;
                const size_t nm = (size_t)n * m;
                /* Single-slice plans: theta = one row, L = 1 (sigma = 1). */
                double *Al = dalloc((size_t)L * nm), *Dl = dalloc((size_t)L);
                double *O = dalloc((size_t)n * dv), *A = dalloc(nm), *Am = dalloc(nm);
                double *sg = dalloc((size_t)L), *D = dalloc((size_t)L);
                double *row = dalloc((size_t)d);
                for (int l = 0; l < L; l++) {
                    for (int k = 0; k < d; k++)
                        row[k] = p.theta ? p.theta[l * d + k] : (double)(l == k);
                    ref_esp_cfg c1 = make_cfg(&p, sort, 0.2, 3.0, 0.8, 0, 0);
                    c1.theta = row;
                    c1.L = 1;
                    double s1;
                    ref_esp_forward(n, m, d, dv, p.Q, p.K, p.V, &c1, Al + l * nm, O, &s1,
                                    Dl + l);
                    if (s1 != 1.0)
                        Dl[l] = NAN; /* flags a broken single-slice weight */
                }
                /* tau = 0: uniform weights, mean of the lifted plans. */
                ref_esp_cfg c = make_cfg(&p, sort, 0.2, 0.0, 0.8, 0, 0);
                ref_esp_forward(n, m, d, dv, p.Q, p.K, p.V, &c, A, O, sg, D);
                for (size_t k = 0; k < nm; k++) {
                    double acc = 0.0;
                    for (int l = 0; l < L; l++)
                        acc += Al[l * nm + k];
                    Am[k] = acc / L;
                }
                double e_mean = max_abs_diff(A, Am, nm);
                double e_D = max_abs_diff(D, Dl, (size_t)L);
                double e_sg = 0.0;
                for (int l = 0; l < L; l++)
                    track(&e_sg, fabs(sg[l] - 1.0 / L));
                /* Large tau: all weight on argmin D. */
                int lmin = 0;
                for (int l = 1; l < L; l++)
                    if (Dl[l] < Dl[lmin])
                        lmin = l;
                double dgap = INFINITY;
                for (int l = 0; l < L; l++)
                    if (l != lmin)
                        dgap = fmin(dgap, Dl[l] - Dl[lmin]);
                c.tau = 1e5;
                ref_esp_forward(n, m, d, dv, p.Q, p.K, p.V, &c, A, O, sg, D);
                double e_big = max_abs_diff(A, Al + lmin * nm, nm);
                double e_sgbig = fabs(sg[lmin] - 1.0);
                /* E_sigma[D] is non-increasing in tau. */
                double prev = INFINITY, rise = 0.0;
                for (int k = 0; k < 7; k++) {
                    c.tau = taus[k];
                    ref_esp_forward(n, m, d, dv, p.Q, p.K, p.V, &c, A, O, sg, D);
                    double ed = 0.0;
                    for (int l = 0; l < L; l++)
                        ed += sg[l] * D[l];
                    if (ed - prev > rise)
                        rise = ed - prev;
                    prev = ed;
                }
                double e = fmax(fmax(e_mean, e_D), fmax(e_sg, fmax(e_big, e_sgbig)));
                track(worst, e);
                char name[128], det[300];
                snprintf(name, sizeof name, "tau limits %s %dx%d %s", sort ? "soft" : "hard", n,
                         m, p.theta ? "theta L=3" : "axis");
                snprintf(det, sizeof det,
                         "tau=0: |A-mean| %.1e |sigma-1/L| %.1e |D-D_single| %.1e; "
                         "tau=1e5: |A-A_argmin| %.1e |1-sigma_min| %.1e (D gap %.2g); "
                         "E[D] rise %.1e (tol 1e-14)",
                         e_mean, e_sg, e_D, e_big, e_sgbig, dgap, rise);
                th_report(e < 1e-14 && dgap * 1e5 > 50.0 && rise <= 1e-15, name, det);
                free(Al);
                free(Dl);
                free(O);
                free(A);
                free(Am);
                free(sg);
                free(D);
                free(row);
                free_problem(&p);
            }
    /* L = 1: G does not depend on tau. */
    {
        const int n = 5, m = 6, d = 3, dv = 2;
        problem p = make_problem(n, m, d, dv, 1, 790);
        double *A1 = dalloc((size_t)n * m), *A2 = dalloc((size_t)n * m);
        double *O = dalloc((size_t)n * dv);
        ref_esp_cfg c = make_cfg(&p, 1, 0.2, 0.0, 0.8, 0, 0);
        ref_esp_forward(n, m, d, dv, p.Q, p.K, p.V, &c, A1, O, NULL, NULL);
        c.tau = 37.0;
        ref_esp_forward(n, m, d, dv, p.Q, p.K, p.V, &c, A2, O, NULL, NULL);
        double e = max_abs_diff(A1, A2, (size_t)n * m);
        char det[80];
        snprintf(det, sizeof det, "max|A(tau=0) - A(tau=37)| %.1e (exact)", e);
        th_report(e == 0.0, "tau-independent at L=1", det);
        free(A1);
        free(A2);
        free(O);
        free_problem(&p);
    }
}

/* ------------------------------------------------------------------------ */
/* 5. Soft -> hard as t -> 0                                                */
/* ------------------------------------------------------------------------ */

static void check_soft_to_hard(double *worst)
{
    const double scale = 0.8, fac[4] = {0.5, 0.05, 0.005, 0.0005};
    int seed = 0;
    for (int s = 0; s < 2; s++)
        for (int sl = 0; sl < 2; sl++)
            for (int cost = 0; cost < 2; cost++) {
                const int n = shapes[s][0], m = shapes[s][1], d = slicings[sl][0], dv = 2;
                problem p = make_problem(n, m, d, dv, slicings[sl][1], 900 + (uint64_t)seed++);
                const size_t nm = (size_t)n * m;
                const double gap = problem_min_gap(&p, scale);
                double *Ah = dalloc(nm), *Oh = dalloc((size_t)n * dv);
                double *As = dalloc(nm), *Os = dalloc((size_t)n * dv);
                ref_esp_cfg c = make_cfg(&p, 0, 0.0, 2.0, scale, cost, 0);
                ref_esp_forward(n, m, d, dv, p.Q, p.K, p.V, &c, Ah, Oh, NULL, NULL);
                c.sort = 1;
                double err[4];
                int mono = 1;
                for (int k = 0; k < 4; k++) {
                    /* t = gap^2 * fac: the off-rank weights are <= exp(-1/fac). */
                    c.t = gap * gap * fac[k];
                    ref_esp_forward(n, m, d, dv, p.Q, p.K, p.V, &c, As, Os, NULL, NULL);
                    err[k] = fmax(max_abs_diff(As, Ah, nm), max_abs_diff(Os, Oh, (size_t)n * dv));
                    if (k > 0 && !(err[k] <= err[k - 1]))
                        mono = 0;
                }
                track(worst, err[3]);
                char name[128], det[220];
                snprintf(name, sizeof name, "soft -> hard %dx%d %s %s", n, m,
                         p.theta ? "theta L=3" : "axis", cost_name(cost));
                snprintf(det, sizeof det,
                         "gap %.2g; t = gap^2 x {0.5,0.05,0.005,0.0005}: max|soft-hard| "
                         "%.1e %.1e %.1e %.1e (last tol 1e-13, non-increasing)",
                         gap, err[0], err[1], err[2], err[3]);
                th_report(mono && err[3] < 1e-13 && err[0] > 1e-6, name, det);
                free(Ah);
                free(Oh);
                free(As);
                free(Os);
                free_problem(&p);
            }
}

/* ------------------------------------------------------------------------ */
/* 6. Permutation equivariance                                              */
/* ------------------------------------------------------------------------ */

/* Y[i] = X[perm[i]] for rows of width w. */
static void permute_rows(int N, int w, const int *perm, const double *X, double *Y)
{
    for (int i = 0; i < N; i++)
        memcpy(Y + (size_t)i * w, X + (size_t)perm[i] * w, (size_t)w * sizeof(double));
}

static void check_equivariance(double *worst)
{
    int seed = 0;
    for (int sort = 0; sort < 2; sort++)
        for (int s = 0; s < 2; s++)
            for (int cost = 0; cost < 2; cost++) {
                const int n = shapes[s][0], m = shapes[s][1], d = 4, dv = 3, L = 3;
                problem p = make_problem(n, m, d, dv, L, 1100 + (uint64_t)seed);
                lcg g = {1150 + (uint64_t)seed++};
                int *pq = malloc(sizeof(int) * (size_t)n), *pk = malloc(sizeof(int) * (size_t)m);
                if (pq == NULL || pk == NULL) {
                    fprintf(stderr, "selftest: out of memory\n");
                    exit(1);
                }
                random_perm(&g, n, pq);
                random_perm(&g, m, pk);
                problem pp = make_problem(n, m, d, dv, L, 1100 + (uint64_t)seed - 1);
                permute_rows(n, d, pq, p.Q, pp.Q);
                permute_rows(m, d, pk, p.K, pp.K);
                permute_rows(m, dv, pk, p.V, pp.V);
                permute_rows(n, dv, pq, p.dO, pp.dO);
                ref_esp_cfg c = make_cfg(&p, sort, 0.3, 2.0, 0.8, cost, 0);
                ref_esp_cfg cp = make_cfg(&pp, sort, 0.3, 2.0, 0.8, cost, 0);
                const size_t nm = (size_t)n * m;
                double *A = dalloc(nm), *Ap = dalloc(nm), *O = dalloc((size_t)n * dv);
                double *Op = dalloc((size_t)n * dv), *sg = dalloc(L), *sgp = dalloc(L);
                double *D = dalloc(L), *Dp = dalloc(L), *tmp = dalloc(nm);
                ref_esp_forward(n, m, d, dv, p.Q, p.K, p.V, &c, A, O, sg, D);
                ref_esp_forward(n, m, d, dv, pp.Q, pp.K, pp.V, &cp, Ap, Op, sgp, Dp);
                double e = 0.0;
                /* A' = Pi_q A Pi_k^T, O' = Pi_q O. */
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < m; j++)
                        tmp[i * m + j] = A[pq[i] * m + pk[j]];
                track(&e, max_abs_diff(Ap, tmp, nm));
                permute_rows(n, dv, pq, O, tmp);
                track(&e, max_abs_diff(Op, tmp, (size_t)n * dv));
                track(&e, max_abs_diff(sg, sgp, L));
                track(&e, max_abs_diff(D, Dp, L));
                double ef = e;
                /* Gradients permute the same way; dTheta is invariant. */
                double *dQ = dalloc((size_t)n * d), *dK = dalloc((size_t)m * d);
                double *dV = dalloc((size_t)m * dv), *dT = dalloc((size_t)L * d);
                double *dQp = dalloc((size_t)n * d), *dKp = dalloc((size_t)m * d);
                double *dVp = dalloc((size_t)m * dv), *dTp = dalloc((size_t)L * d);
                ref_esp_backward(n, m, d, dv, p.Q, p.K, p.V, &c, p.dO, dQ, dK, dV, dT);
                ref_esp_backward(n, m, d, dv, pp.Q, pp.K, pp.V, &cp, pp.dO, dQp, dKp, dVp, dTp);
                double eb = 0.0;
                permute_rows(n, d, pq, dQ, tmp);
                track(&eb, max_abs_diff(dQp, tmp, (size_t)n * d));
                permute_rows(m, d, pk, dK, tmp);
                track(&eb, max_abs_diff(dKp, tmp, (size_t)m * d));
                permute_rows(m, dv, pk, dV, tmp);
                track(&eb, max_abs_diff(dVp, tmp, (size_t)m * dv));
                track(&eb, max_abs_diff(dT, dTp, (size_t)L * d));
                track(worst, fmax(ef, eb));
                char name[128], det[160];
                snprintf(name, sizeof name, "permutation equivariance %s %dx%d %s",
                         sort ? "soft" : "hard", n, m, cost_name(cost));
                snprintf(det, sizeof det,
                         "forward (A, O, sigma, D) %.1e, backward (dQ, dK, dV, dTheta) %.1e "
                         "(tol 1e-12)",
                         ef, eb);
                th_report(ef < 1e-12 && eb < 1e-12, name, det);
                free(A); free(Ap); free(O); free(Op); free(sg); free(sgp); free(D); free(Dp);
                free(tmp); free(dQ); free(dK); free(dV); free(dT);
                free(dQp); free(dKp); free(dVp); free(dTp);
                free(pq);
                free(pk);
                free_problem(&p);
                free_problem(&pp);
            }
}

/* ------------------------------------------------------------------------ */
/* 7. K = Q (and K = Q + shift)                                             */
/* ------------------------------------------------------------------------ */

static void check_identity(double *worst)
{
    int seed = 0;
    for (int sl = 0; sl < 2; sl++)
        for (int cost = 0; cost < 2; cost++)
            for (int shift = 0; shift < 2; shift++) {
                const int n = 6, d = slicings[sl][0], dv = 3;
                problem p = make_problem(n, n, d, dv, slicings[sl][1], 1300 + (uint64_t)seed++);
                const int L = p.L;
                double sh[4] = {0.3, -0.7, 0.25, 1.1};
                double c2 = 0.0;
                for (int i = 0; i < n; i++)
                    for (int k = 0; k < d; k++)
                        p.K[i * d + k] = p.Q[i * d + k] + (shift ? sh[k] : 0.0);
                for (int k = 0; k < d; k++)
                    c2 += (shift ? 0.64 * sh[k] * sh[k] : 0.0); /* scale 0.8 */
                const double Dexp = cost == 0 ? c2 : sqrt(c2);
                double *A = dalloc((size_t)n * n), *O = dalloc((size_t)n * dv);
                double *sg = dalloc(L), *D = dalloc(L);
                ref_esp_cfg c = make_cfg(&p, 0, 0.0, 2.0, 0.8, cost, 0);
                ref_esp_forward(n, n, d, dv, p.Q, p.K, p.V, &c, A, O, sg, D);
                double eA = 0.0;
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < n; j++)
                        track(&eA, fabs(A[i * n + j] - (i == j ? 1.0 : 0.0)));
                double eO = max_abs_diff(O, p.V, (size_t)n * dv);
                double eD = 0.0;
                for (int l = 0; l < L; l++)
                    track(&eD, fabs(D[l] - Dexp));
                /* Paper scale: G = I/n. */
                c.out_scale = 1;
                ref_esp_forward(n, n, d, dv, p.Q, p.K, p.V, &c, A, O, NULL, NULL);
                double eG = 0.0;
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < n; j++)
                        track(&eG, fabs(A[i * n + j] - (i == j ? 1.0 / n : 0.0)));
                double e = fmax(fmax(eA, eO), fmax(eG, eD));
                track(worst, e);
                char name[128], det[200];
                snprintf(name, sizeof name, "hard K = Q%s %s %s", shift ? " + c" : "",
                         p.theta ? "theta L=3" : "axis", cost_name(cost));
                snprintf(det, sizeof det,
                         "|A - I| %.1e, |O - V| %.1e, |G - I/n| %.1e, |D - %s| %.1e (tol 1e-14%s)",
                         eA, eO, eG, shift ? "|sc|^p" : "0", eD, shift ? "" : ", D exact");
                th_report(e < 1e-14 && (shift || eD == 0.0), name, det);
                free(A);
                free(O);
                free(sg);
                free(D);
                free_problem(&p);
            }
}

/* Zero distance (K = Q, Euclidean cost): the gradient convention is 0 there.
 * Hard: every matched pair has distance 0, so dQ = dK = 0 exactly. Soft: the
 * central difference of |h| is 0 as well, so finite differences apply. */
static void check_zero_distance(double *worst)
{
    for (int sort = 0; sort < 2; sort++) {
        const int n = 5, d = 4, dv = 2, L = 3;
        problem p = make_problem(n, n, d, dv, L, 1400 + (uint64_t)sort);
        memcpy(p.K, p.Q, (size_t)n * d * sizeof(double));
        ref_esp_cfg c = make_cfg(&p, sort, 0.3, 2.0, 0.8, 1, 0);
        double *dQ = dalloc((size_t)n * d), *dK = dalloc((size_t)n * d);
        double *dV = dalloc((size_t)n * dv), *dT = dalloc((size_t)L * d);
        ref_esp_backward(n, n, d, dv, p.Q, p.K, p.V, &c, p.dO, dQ, dK, dV, dT);
        int finite = 1;
        for (int k = 0; k < n * d; k++)
            finite &= isfinite(dQ[k]) && isfinite(dK[k]);
        char det[200];
        if (sort == 0) {
            double z = fmax(max_abs(dQ, (size_t)n * d), max_abs(dK, (size_t)n * d));
            snprintf(det, sizeof det, "finite %d, max|dQ|,|dK| %g (exact 0)", finite, z);
            th_report(finite && z == 0.0, "hard K = Q euclid backward", det);
        } else {
            /* The kink leaves an O(h) term (C_ii = O(h) times the O(h)
             * change of U_ii), hence the smaller step for Q and K. */
            double rQ = fd_error(&p, &c, p.Q, (size_t)n * d, dQ, 1e-7);
            double rK = fd_error(&p, &c, p.K, (size_t)n * d, dK, 1e-7);
            double rT = fd_error(&p, &c, p.theta, (size_t)L * d, dT, 1e-6);
            double r = fmax(rQ, fmax(rK, rT));
            track(worst, r);
            snprintf(det, sizeof det, "finite %d, FD rel err dQ %.1e dK %.1e dTheta %.1e "
                     "(h 1e-7 for Q, K; tol 1e-6)", finite, rQ, rK, rT);
            th_report(finite && r < 1e-6, "soft K = Q euclid backward", det);
        }
        free(dQ);
        free(dK);
        free(dV);
        free(dT);
        free_problem(&p);
    }
}

/* Exact ties under hard sort: the stable ascending argsort orders equal
 * values by index. d = 1, n = m = 4, expected pairing worked out by hand:
 * a = (0.5, 0.1, 0.5, 0.3): order 1,3,0,2;  b = (0.2, 0.2, 0.9, 0.0): order
 * 3,0,1,2; so query 1 -> key 3, 3 -> 0, 0 -> 1, 2 -> 2. */
static void check_ties(void)
{
    const double Q[4] = {0.5, 0.1, 0.5, 0.3}, K[4] = {0.2, 0.2, 0.9, 0.0};
    const double V[4] = {10.0, 11.0, 12.0, 13.0};
    const int pi[4] = {1, 3, 2, 0};
    double A[16], O[4];
    ref_esp_cfg c;
    c.sort = 0;
    c.t = 0.0;
    c.tau = 1.0;
    c.scale = 1.0;
    c.cost = 0;
    c.out_scale = 0;
    c.L = 0;
    c.theta = NULL;
    ref_esp_forward(4, 4, 1, 1, Q, K, V, &c, A, O, NULL, NULL);
    double e = 0.0;
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 4; j++)
            track(&e, fabs(A[i * 4 + j] - (j == pi[i] ? 1.0 : 0.0)));
        track(&e, fabs(O[i] - V[pi[i]]));
    }
    char det[100];
    snprintf(det, sizeof det, "max|A - expected permutation|, |O - V[pi]| %.1e (exact)", e);
    th_report(e == 0.0, "hard ties: stable ascending argsort", det);
}

/* ------------------------------------------------------------------------ */
/* 8. Batched + padded == truncated                                         */
/* ------------------------------------------------------------------------ */

static void check_batched(double *worst)
{
    enum { B = 4, H = 2, Nq = 6, Nk = 7, d = 4, dv = 2, L = 3 };
    const int ql[B] = {6, 3, 0, 4};
    const int kl[B] = {7, 4, 5, 0};
    const size_t nQ = (size_t)B * H * Nq * d, nK = (size_t)B * H * Nk * d;
    const size_t nV = (size_t)B * H * Nk * dv, nO = (size_t)B * H * Nq * dv;
    const size_t nA = (size_t)B * H * Nq * Nk, nS = (size_t)B * H * L;
    double *Q = dalloc(nQ), *K = dalloc(nK), *V = dalloc(nV), *dO = dalloc(nO);
    double *A = dalloc(nA), *O = dalloc(nO), *sg = dalloc(nS);
    double *dQ = dalloc(nQ), *dK = dalloc(nK), *dV = dalloc(nV);
    double theta[L * d], dT[L * d], dTsum[L * d], dT1[L * d], sg1[L];
    lcg g = {1500};
    fill(&g, Q, nQ, -1.5, 1.5);
    fill(&g, K, nK, -1.5, 1.5);
    fill(&g, V, nV, -1.0, 1.0);
    fill(&g, dO, nO, -1.0, 1.0);
    fill(&g, theta, L * d, -1.0, 1.0);
    for (int l = 0; l < L; l++) {
        double s = 0.0;
        for (int k = 0; k < d; k++)
            s += theta[l * d + k] * theta[l * d + k];
        for (int k = 0; k < d; k++)
            theta[l * d + k] /= sqrt(s);
    }
    /* Poison the padding. */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const size_t pi = (size_t)b * H + h;
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
    for (int sort = 0; sort < 2; sort++)
        for (int cost = 0; cost < 2; cost++) {
            ref_esp_cfg c;
            c.sort = sort;
            c.t = 0.3;
            c.tau = 2.0;
            c.scale = 0.8;
            c.cost = cost;
            c.out_scale = 0;
            c.L = L;
            c.theta = theta;
            ref_esp_forward_batched(B, H, Nq, Nk, d, dv, ql, kl, Q, K, V, &c, A, O, sg);
            ref_esp_backward_batched(B, H, Nq, Nk, d, dv, ql, kl, Q, K, V, &c, dO, dQ, dK, dV,
                                     dT);
            for (int k = 0; k < L * d; k++)
                dTsum[k] = 0.0;
            double diff = 0.0, padmax = 0.0;
            for (int b = 0; b < B; b++)
                for (int h = 0; h < H; h++) {
                    const size_t pi = (size_t)b * H + h;
                    const int Lq = ql[b], Lk = kl[b];
                    const int valid = (Lq > 0 && Lk > 0);
                    double *At = dalloc((size_t)Nq * Nk), *Ot = dalloc((size_t)Nq * dv);
                    double *dQt = dalloc((size_t)Nq * d), *dKt = dalloc((size_t)Nk * d);
                    double *dVt = dalloc((size_t)Nk * dv);
                    if (valid) {
                        /* Truncated copies in fresh buffers (no NaN). */
                        double *Qt = dalloc((size_t)Lq * d), *Kt = dalloc((size_t)Lk * d);
                        double *Vt = dalloc((size_t)Lk * dv), *dOt = dalloc((size_t)Lq * dv);
                        memcpy(Qt, Q + pi * Nq * d, (size_t)Lq * d * sizeof(double));
                        memcpy(Kt, K + pi * Nk * d, (size_t)Lk * d * sizeof(double));
                        memcpy(Vt, V + pi * Nk * dv, (size_t)Lk * dv * sizeof(double));
                        memcpy(dOt, dO + pi * Nq * dv, (size_t)Lq * dv * sizeof(double));
                        ref_esp_forward(Lq, Lk, d, dv, Qt, Kt, Vt, &c, At, Ot, sg1, NULL);
                        ref_esp_backward(Lq, Lk, d, dv, Qt, Kt, Vt, &c, dOt, dQt, dKt, dVt,
                                         dT1);
                        for (int k = 0; k < L * d; k++)
                            dTsum[k] += dT1[k];
                        free(Qt);
                        free(Kt);
                        free(Vt);
                        free(dOt);
                    }
                    /* Compare one value against the truncated run or against 0. */
#define CMP(v, in_valid, ref)                                                                  \
    do {                                                                                       \
        double v_ = (v);                                                                       \
        if (valid && (in_valid))                                                               \
            track(&diff, fabs(v_ - (ref)));                                                    \
        else                                                                                   \
            track(&padmax, fabs(v_));                                                          \
    } while (0)
                    for (int i = 0; i < Nq; i++)
                        for (int j = 0; j < Nk; j++)
                            CMP(A[(pi * Nq + i) * Nk + j], i < Lq && j < Lk,
                                At[(size_t)i * (Lk > 0 ? Lk : 1) + j]);
                    for (int i = 0; i < Nq; i++) {
                        for (int k = 0; k < dv; k++)
                            CMP(O[(pi * Nq + i) * dv + k], i < Lq, Ot[i * dv + k]);
                        for (int k = 0; k < d; k++)
                            CMP(dQ[(pi * Nq + i) * d + k], i < Lq, dQt[i * d + k]);
                    }
                    for (int j = 0; j < Nk; j++) {
                        for (int k = 0; k < d; k++)
                            CMP(dK[(pi * Nk + j) * d + k], j < Lk, dKt[j * d + k]);
                        for (int k = 0; k < dv; k++)
                            CMP(dV[(pi * Nk + j) * dv + k], j < Lk, dVt[j * dv + k]);
                    }
                    for (int l = 0; l < L; l++)
                        CMP(sg[pi * L + l], 1, sg1[l]);
#undef CMP
                    free(At);
                    free(Ot);
                    free(dQt);
                    free(dKt);
                    free(dVt);
                }
            double eT = max_abs_diff(dT, dTsum, L * d);
            double e = fmax(fmax(diff, padmax), eT);
            track(worst, e);
            char name[128], det[200];
            snprintf(name, sizeof name, "batched padded == truncated %s %s",
                     sort ? "soft" : "hard", cost_name(cost));
            snprintf(det, sizeof det,
                     "B=%d H=%d Nq=%d Nk=%d, NaN padding: max|diff| %.1e, max|padded out| %.1e, "
                     "|dTheta - sum| %.1e (exact)",
                     B, H, Nq, Nk, diff, padmax, eT);
            th_report(diff == 0.0 && padmax == 0.0 && eT == 0.0, name, det);
        }
    /* NULL lengths == single problem; axis-aligned. */
    {
        const int n = 5, m = 6, dd = 3;
        problem p = make_problem(n, m, dd, dv, 0, 1600);
        ref_esp_cfg c = make_cfg(&p, 1, 0.3, 2.0, 0.8, 0, 0);
        double *A1 = dalloc((size_t)n * m), *O1 = dalloc((size_t)n * dv), s1[3];
        double *A2 = dalloc((size_t)n * m), *O2 = dalloc((size_t)n * dv), s2[3];
        ref_esp_forward(n, m, dd, dv, p.Q, p.K, p.V, &c, A1, O1, s1, NULL);
        ref_esp_forward_batched(1, 1, n, m, dd, dv, NULL, NULL, p.Q, p.K, p.V, &c, A2, O2, s2);
        double e = fmax(fmax(max_abs_diff(A1, A2, (size_t)n * m),
                             max_abs_diff(O1, O2, (size_t)n * dv)),
                        max_abs_diff(s1, s2, 3));
        char det[100];
        snprintf(det, sizeof det, "max diff %.1e (exact)", e);
        th_report(e == 0.0, "batched B=H=1 NULL lengths == single problem", det);
        free(A1);
        free(O1);
        free(A2);
        free(O2);
        free_problem(&p);
    }
    free(Q); free(K); free(V); free(dO); free(A); free(O); free(sg);
    free(dQ); free(dK); free(dV);
}

/* ------------------------------------------------------------------------ */
/* 9. 1-D optimality (d = L = 1, hard)                                      */
/* ------------------------------------------------------------------------ */

/* Minimum over all permutations of (1/n) sum_i c(a_i - b_perm(i)), by
 * recursive swapping (n <= 7). */
static double brute_min(int n, const double *a, const double *b, int cost, int *perm, int k)
{
    if (k == n) {
        double s = 0.0;
        for (int i = 0; i < n; i++) {
            double e = a[i] - b[perm[i]];
            s += cost == 0 ? e * e : fabs(e);
        }
        return s / n;
    }
    double best = INFINITY;
    for (int i = k; i < n; i++) {
        int t = perm[k];
        perm[k] = perm[i];
        perm[i] = t;
        best = fmin(best, brute_min(n, a, b, cost, perm, k + 1));
        t = perm[k];
        perm[k] = perm[i];
        perm[i] = t;
    }
    return best;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* integral_0^1 c(Fa^{-1}(u) - Fb^{-1}(u)) du for uniform empirical measures. */
static double quantile_cost(int n, const double *a, int m, const double *b, int cost)
{
    double *sa = dalloc((size_t)n), *sb = dalloc((size_t)m);
    memcpy(sa, a, (size_t)n * sizeof(double));
    memcpy(sb, b, (size_t)m * sizeof(double));
    qsort(sa, (size_t)n, sizeof(double), cmp_double);
    qsort(sb, (size_t)m, sizeof(double), cmp_double);
    double s = 0.0, u0 = 0.0;
    int r = 0, q = 0;
    while (r < n && q < m) {
        double ur = (double)(r + 1) / n, uq = (double)(q + 1) / m;
        double u1 = fmin(ur, uq);
        double e = sa[r] - sb[q];
        s += (u1 - u0) * (cost == 0 ? e * e : fabs(e));
        u0 = u1;
        /* Advance whichever quantile steps first (both when they coincide). */
        const long long xr = (long long)(r + 1) * m, xq = (long long)(q + 1) * n;
        if (xr <= xq)
            r++;
        if (xq <= xr)
            q++;
    }
    free(sa);
    free(sb);
    return s;
}

static void check_1d(double *worst)
{
    static const int dshapes[5][2] = {{5, 5}, {7, 7}, {4, 7}, {7, 3}, {6, 4}};
    for (int s = 0; s < 5; s++)
        for (int cost = 0; cost < 2; cost++) {
            const int n = dshapes[s][0], m = dshapes[s][1], dv = 1;
            problem p = make_problem(n, m, 1, dv, 0, 1700 + (uint64_t)(s * 2 + cost));
            const double scale = 0.8;
            double *a = dalloc((size_t)n), *b = dalloc((size_t)m), D, *O = dalloc((size_t)n);
            for (int i = 0; i < n; i++)
                a[i] = scale * p.Q[i];
            for (int j = 0; j < m; j++)
                b[j] = scale * p.K[j];
            ref_esp_cfg c = make_cfg(&p, 0, 0.0, 1.0, scale, cost, 0);
            ref_esp_forward(n, m, 1, dv, p.Q, p.K, p.V, &c, NULL, O, NULL, &D);
            double qc = quantile_cost(n, a, m, b, cost), bf = NAN;
            if (n == m) {
                int perm[8];
                for (int i = 0; i < n; i++)
                    perm[i] = i;
                bf = brute_min(n, a, b, cost, perm, 0);
            }
            double e = fabs(D - qc);
            if (n == m)
                e = fmax(e, fabs(D - bf));
            track(worst, e);
            char name[96], det[160];
            snprintf(name, sizeof name, "1-D optimality %dx%d %s", n, m, cost_name(cost));
            snprintf(det, sizeof det, "D %.6f, quantile integral %.6f, brute force %.6f: err %.1e "
                     "(tol 1e-14)", D, qc, bf, e);
            th_report(e < 1e-14, name, det);
            free(a);
            free(b);
            free(O);
            free_problem(&p);
        }
}

int main(void)
{
    TH.verbose = 1; /* one line per check, as before */
    double w_soft = 0, w_hv = 0, w_hqk = 0, w_marg = 0, w_tau = 0, w_s2h = 0, w_eq = 0,
           w_id = 0, w_zd = 0, w_bat = 0, w_1d = 0;
    check_fd_soft(&w_soft);
    check_fd_hard(&w_hv, &w_hqk);
    check_marginals(&w_marg);
    check_tau(&w_tau);
    check_soft_to_hard(&w_s2h);
    check_equivariance(&w_eq);
    check_identity(&w_id);
    check_zero_distance(&w_zd);
    check_ties();
    check_batched(&w_bat);
    check_1d(&w_1d);
    printf("worst: soft FD rel %.2e, hard FD dV rel %.2e, hard FD dQ/dK rel %.2e, "
           "hard marginals %.2e, tau limits %.2e, soft->hard %.2e, equivariance %.2e, "
           "K=Q %.2e, zero-distance FD rel %.2e, batched %.2e, 1-D %.2e\n",
           w_soft, w_hv, w_hqk, w_marg, w_tau, w_s2h, w_eq, w_id, w_zd, w_bat, w_1d);
    return th_summary();
}
