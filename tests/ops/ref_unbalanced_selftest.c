/* ref_unbalanced_selftest.c -- self-test of the unbalanced Sinkhorn reference
 * (tests/ops/ref_unbalanced.c): kappa = 1 is the balanced reference (a different
 * formulation: matrix normalisation, tests/ops/ref_attn.c); central finite
 * differences of every gradient; the properties of the damped iteration. */
#include "ref_attn.h"
#include "ref_selftest_util.h"
#include "ref_unbalanced.h"

#include <string.h>

typedef struct {
    int n, m, d, dv, S;
    double alpha, kappa;
    double *Q, *K, *V, *dO;
} prob;

static prob make(int n, int m, int d, int dv, int S, double kappa, uint64_t seed)
{
    prob p = {n, m, d, dv, S, 0.8, kappa, dalloc((size_t)n * d), dalloc((size_t)m * d), dalloc((size_t)m * dv),
              dalloc((size_t)n * dv)};
    lcg g = {seed};
    fill(&g, p.Q, (size_t)n * d, -1.5, 1.5);
    fill(&g, p.K, (size_t)m * d, -1.5, 1.5);
    fill(&g, p.V, (size_t)m * dv, -1.0, 1.0);
    fill(&g, p.dO, (size_t)n * dv, -1.0, 1.0);
    return p;
}

static void drop(prob *p)
{
    free(p->Q);
    free(p->K);
    free(p->V);
    free(p->dO);
}

static double loss(const prob *p)
{
    double *O = dalloc((size_t)p->n * p->dv), L = 0.0;
    ref_unb_forward(p->n, p->m, p->d, p->dv, p->Q, p->K, p->V, p->alpha, p->S, p->kappa, NULL, O);
    for (int i = 0; i < p->n * p->dv; i++) L += p->dO[i] * O[i];
    free(O);
    return L;
}

static double fd_rel(prob *p, double *x, size_t cnt, const double *g)
{
    const double h = 1e-6;
    double emax = 0.0, gmax = 0.0;
    for (size_t k = 0; k < cnt; k++) {
        const double x0 = x[k];
        x[k] = x0 + h;
        const double Lp = loss(p);
        x[k] = x0 - h;
        const double Lm = loss(p);
        x[k] = x0;
        const double fd = (Lp - Lm) / (2 * h);
        if (!(fabs(fd - g[k]) <= emax)) emax = fabs(fd - g[k]);
        if (fabs(fd) > gmax) gmax = fabs(fd);
    }
    return emax / (gmax > 0 ? gmax : 1e-300);
}

int main(void)
{
    TH.verbose = 1; /* one line per check, as before */
    char name[96], det[160];
    /* kappa = 1: the balanced reference, another formulation */
    for (int S = 1; S <= 6; S++) {
        prob p = make(5, 7, 3, 2, S, 1.0, 10 + (uint64_t)S);
        double *A1 = dalloc(35), *O1 = dalloc(10), *A2 = dalloc(35), *O2 = dalloc(10);
        double *g1 = dalloc(15 + 21 + 14), *g2 = dalloc(15 + 21 + 14);
        ref_unb_forward(5, 7, 3, 2, p.Q, p.K, p.V, p.alpha, S, 1.0, A1, O1);
        ref_sinkhorn_forward(5, 7, 3, 2, p.Q, p.K, p.V, p.alpha, S, A2, O2);
        ref_unb_backward(5, 7, 3, 2, p.Q, p.K, p.V, p.alpha, S, 1.0, p.dO, g1, g1 + 15, g1 + 36);
        ref_sinkhorn_backward(5, 7, 3, 2, p.Q, p.K, p.V, p.alpha, S, p.dO, g2, g2 + 15, g2 + 36);
        const double e = fmax(max_abs_diff(A1, A2, 35), fmax(max_abs_diff(O1, O2, 10), max_abs_diff(g1, g2, 50)));
        snprintf(name, sizeof name, "kappa = 1 is balanced Sinkhorn, S=%d", S);
        snprintf(det, sizeof det, "max diff %.2e (tol 1e-12)", e);
        th_report(e < 1e-12, name, det);
        free(A1); free(O1); free(A2); free(O2); free(g1); free(g2);
        drop(&p);
    }
    /* finite differences of every gradient */
    const double kappas[3] = {0.9, 0.5, 0.2};
    for (int ki = 0; ki < 3; ki++)
        for (int S = 1; S <= 5; S++) {
            prob p = make(4, 6, 3, 2, S, kappas[ki], 100 + (uint64_t)(10 * ki + S));
            double *dQ = dalloc(12), *dK = dalloc(18), *dV = dalloc(12);
            ref_unb_backward(4, 6, 3, 2, p.Q, p.K, p.V, p.alpha, S, p.kappa, p.dO, dQ, dK, dV);
            const double r = fmax(fd_rel(&p, p.Q, 12, dQ), fmax(fd_rel(&p, p.K, 18, dK), fd_rel(&p, p.V, 12, dV)));
            snprintf(name, sizeof name, "finite differences kappa=%.1f S=%d", kappas[ki], S);
            snprintf(det, sizeof det, "relative error %.2e (tol 1e-6)", r);
            th_report(r < 1e-6, name, det);
            free(dQ); free(dK); free(dV);
            drop(&p);
        }
    /* rows sum to 1 after a row step; columns are not exact after a damped
     * column step; a score shift by row (C_ij + r_i) is absorbed at every S
     * (the first step is a row step); a shift by column (C_ij + c_j) is
     * absorbed at convergence by the balanced iteration only */
    {
        const int n = 5, m = 7, d = 3;
        prob p = make(n, m, d, 2, 4, 0.5, 7);
        double *A = dalloc(35), *O = dalloc(10), *A2 = dalloc(35), *O2 = dalloc(10);
        double *Qs = dalloc((size_t)n * (d + 1)), *Ks = dalloc((size_t)m * (d + 1));
        double rowdev = 0, coldev = 0, rowshift = 0, colshift_bal = 0, colshift_unb = 0;
        ref_unb_forward(n, m, d, 2, p.Q, p.K, p.V, p.alpha, 3, 0.5, A, O);
        for (int i = 0; i < n; i++) {
            double r = 0;
            for (int j = 0; j < m; j++) r += A[m * i + j];
            rowdev = fmax(rowdev, fabs(r - 1));
        }
        ref_unb_forward(n, m, d, 2, p.Q, p.K, p.V, p.alpha, 4, 0.5, A, O);
        for (int j = 0; j < m; j++) {
            double s = 0;
            for (int i = 0; i < n; i++) s += A[m * i + j];
            coldev = fmax(coldev, fabs(s - (double)n / m));
        }
        /* an extra feature: q_i' = (q_i, x_i), k_j' = (k_j, y_j) adds alpha x_i y_j;
         * y = 1 gives a row shift, x = 1 a column shift */
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < n; i++) {
                memcpy(Qs + (d + 1) * i, p.Q + d * i, d * sizeof(double));
                Qs[(d + 1) * i + d] = pass == 0 ? 0.3 * i - 0.5 : 1.0;
            }
            for (int j = 0; j < m; j++) {
                memcpy(Ks + (d + 1) * j, p.K + d * j, d * sizeof(double));
                Ks[(d + 1) * j + d] = pass == 0 ? 1.0 : 0.4 * j - 1.0;
            }
            if (pass == 0)
                for (int S = 1; S <= 6; S++) {
                    ref_unb_forward(n, m, d, 2, p.Q, p.K, p.V, p.alpha, S, 0.5, A, O);
                    ref_unb_forward(n, m, d + 1, 2, Qs, Ks, p.V, p.alpha, S, 0.5, A2, O2);
                    rowshift = fmax(rowshift, max_abs_diff(A, A2, 35));
                }
            else
                for (int k = 0; k < 2; k++) {
                    const double kap = k ? 0.5 : 1.0;
                    ref_unb_forward(n, m, d, 2, p.Q, p.K, p.V, p.alpha, 401, kap, A, O);
                    ref_unb_forward(n, m, d + 1, 2, Qs, Ks, p.V, p.alpha, 401, kap, A2, O2);
                    *(k ? &colshift_unb : &colshift_bal) = max_abs_diff(A, A2, 35);
                }
        }
        snprintf(det, sizeof det, "max |rowsum - 1| %.2e after S=3 (tol 1e-12)", rowdev);
        th_report(rowdev < 1e-12, "rows exact after a row step", det);
        snprintf(det, sizeof det, "max |colsum - n/m| %.2e after S=4, kappa 0.5 (> 1e-3)", coldev);
        th_report(coldev > 1e-3, "columns not exact after a damped column step", det);
        snprintf(det, sizeof det, "max diff over S = 1..6: %.2e (tol 1e-12)", rowshift);
        th_report(rowshift < 1e-12, "a score shift by row is absorbed at every S", det);
        snprintf(det, sizeof det, "S=401: balanced %.2e (tol 1e-9), kappa 0.5 %.2e (> 1e-3)", colshift_bal,
                 colshift_unb);
        th_report(colshift_bal < 1e-9 && colshift_unb > 1e-3,
               "a score shift by column is absorbed at convergence by the balanced iteration only", det);
        free(A); free(O); free(A2); free(O2); free(Qs); free(Ks);
        drop(&p);
    }
    return th_summary();
}
