/* ref_diff_selftest.c -- self-test of the differential attention reference
 * (tests/ops/ref_diff.c): lambda = 0 and the second map are softmax
 * attention of the Sinkhorn reference (another formulation: matrix
 * normalisation, tests/ops/ref_attn.c) on the halves; central finite
 * differences of every gradient (Q, K, V, lambda) and of the lambda
 * re-parameterisation; rows of the combined map sum to 1 - lambda; the
 * batched wrapper's padding and its batch sum of dlambda. */
#include "ref_attn.h"
#include "ref_diff.h"
#include "ref_selftest_util.h"

#include <string.h>

typedef struct {
    int n, m, d, dv;
    double alpha, lambda;
    double *Q, *K, *V, *dO;
} prob;

static prob make(int n, int m, int d, int dv, double lambda, uint64_t seed)
{
    prob p = {n, m, d, dv, 0.7, lambda, dalloc((size_t)n * d), dalloc((size_t)m * d), dalloc((size_t)m * dv),
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
    ref_diff_forward(p->n, p->m, p->d, p->dv, p->Q, p->K, p->V, p->alpha, p->lambda, NULL, O);
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

/* columns [off, off + d/2) of an N x d matrix */
static double *half(const double *X, int N, int d, int off)
{
    double *Y = dalloc((size_t)N * (d / 2));
    for (int i = 0; i < N; i++) memcpy(Y + (size_t)i * (d / 2), X + (size_t)i * d + off, sizeof(double) * (d / 2));
    return Y;
}

int main(void)
{
    TH.verbose = 1; /* one line per check, as before */
    char name[128], det[200];
    /* lambda = 0 is softmax attention on the first halves; the map's
     * dependence on lambda is linear, its slope minus softmax attention on the
     * second halves */
    {
        const int n = 5, m = 7, d = 6, dv = 3, dh = 3;
        prob p = make(n, m, d, dv, 0.0, 11);
        double *Q1 = half(p.Q, n, d, 0), *K1 = half(p.K, m, d, 0), *Q2 = half(p.Q, n, d, dh), *K2 = half(p.K, m, d, dh);
        double *A = dalloc(35), *O = dalloc(15), *As = dalloc(35), *Os = dalloc(15), *A2 = dalloc(35), *O2 = dalloc(15);
        double *dQ = dalloc(30), *dK = dalloc(42), *dV = dalloc(21), *sQ = dalloc(15), *sK = dalloc(21), *sV = dalloc(21);
        double dl;
        ref_diff_forward(n, m, d, dv, p.Q, p.K, p.V, p.alpha, 0.0, A, O);
        ref_sinkhorn_forward(n, m, dh, dv, Q1, K1, p.V, p.alpha, 1, As, Os);
        ref_diff_backward(n, m, d, dv, p.Q, p.K, p.V, p.alpha, 0.0, p.dO, dQ, dK, dV, &dl);
        ref_sinkhorn_backward(n, m, dh, dv, Q1, K1, p.V, p.alpha, 1, p.dO, sQ, sK, sV);
        double e = fmax(max_abs_diff(A, As, 35), fmax(max_abs_diff(O, Os, 15), max_abs_diff(dV, sV, 21))), z = 0.0;
        for (int i = 0; i < n; i++)
            for (int k = 0; k < dh; k++) {
                e = fmax(e, fabs(dQ[i * d + k] - sQ[i * dh + k]));
                z = fmax(z, fabs(dQ[i * d + dh + k]));
            }
        for (int j = 0; j < m; j++)
            for (int k = 0; k < dh; k++) {
                e = fmax(e, fabs(dK[j * d + k] - sK[j * dh + k]));
                z = fmax(z, fabs(dK[j * d + dh + k]));
            }
        ref_sinkhorn_forward(n, m, dh, dv, Q2, K2, p.V, p.alpha, 1, A2, O2);
        double dl2 = 0.0;
        for (int x = 0; x < 15; x++) dl2 -= p.dO[x] * O2[x];
        snprintf(det, sizeof det, "max diff %.2e, second-half gradients %.2e (tol 1e-12)", e, z);
        th_report(e < 1e-12 && z == 0.0, "lambda = 0 is softmax attention on the first halves", det);
        double lin = 0.0;
        const double lams[3] = {0.3, -0.8, 1.7};
        for (int k = 0; k < 3; k++) {
            ref_diff_forward(n, m, d, dv, p.Q, p.K, p.V, p.alpha, lams[k], A, O);
            for (int x = 0; x < 15; x++) lin = fmax(lin, fabs(O[x] - (Os[x] - lams[k] * O2[x])));
            for (int x = 0; x < 35; x++) lin = fmax(lin, fabs(A[x] - (As[x] - lams[k] * A2[x])));
        }
        snprintf(det, sizeof det, "max diff %.2e; dlambda vs -<dO, softmax(Q2 K2^T) V> %.2e (tol 1e-12)", lin,
                 fabs(dl - dl2));
        th_report(lin < 1e-12 && fabs(dl - dl2) < 1e-12, "O = softmax1 V - lambda softmax2 V (linear in lambda)", det);
        free(Q1); free(K1); free(Q2); free(K2); free(A); free(O); free(As); free(Os); free(A2); free(O2);
        free(dQ); free(dK); free(dV); free(sQ); free(sK); free(sV);
        drop(&p);
    }
    /* finite differences of every gradient */
    const int shapes[4][4] = {{4, 6, 4, 2}, {6, 3, 2, 3}, {1, 5, 6, 2}, {5, 1, 4, 4}};
    const double lams[4] = {0.5, -0.7, 0.0, 1.3};
    for (int s = 0; s < 4; s++)
        for (int l = 0; l < 4; l++) {
            const int n = shapes[s][0], m = shapes[s][1], d = shapes[s][2], dv = shapes[s][3];
            prob p = make(n, m, d, dv, lams[l], 100 + (uint64_t)(10 * s + l));
            double *dQ = dalloc((size_t)n * d), *dK = dalloc((size_t)m * d), *dV = dalloc((size_t)m * dv), dl;
            ref_diff_backward(n, m, d, dv, p.Q, p.K, p.V, p.alpha, p.lambda, p.dO, dQ, dK, dV, &dl);
            double r = fmax(fd_rel(&p, p.Q, (size_t)n * d, dQ),
                            fmax(fd_rel(&p, p.K, (size_t)m * d, dK), fd_rel(&p, p.V, (size_t)m * dv, dV)));
            const double rl = fd_rel(&p, &p.lambda, 1, &dl);
            snprintf(name, sizeof name, "finite differences n=%d m=%d d=%d dv=%d lambda=%.1f", n, m, d, dv, lams[l]);
            snprintf(det, sizeof det, "relative error Q/K/V %.2e, lambda %.2e (tol 1e-6)", r, rl);
            th_report(r < 1e-6 && rl < 1e-6, name, det);
            free(dQ); free(dK); free(dV);
            drop(&p);
        }
    /* rows of the combined map sum to 1 - lambda; a row shift of either
     * map's scores (an extra channel pair with k = 1) changes nothing */
    {
        const int n = 5, m = 7, d = 4, dv = 2;
        prob p = make(n, m, d, dv, 0.6, 7);
        double *A = dalloc(35), *O = dalloc(10), *A2 = dalloc(48), *O2 = dalloc(10), rowdev = 0.0;
        ref_diff_forward(n, m, d, dv, p.Q, p.K, p.V, p.alpha, 0.6, A, O);
        for (int i = 0; i < n; i++) {
            double r = 0.0;
            for (int j = 0; j < m; j++) r += A[m * i + j];
            rowdev = fmax(rowdev, fabs(r - 0.4));
        }
        snprintf(det, sizeof det, "max |rowsum - (1 - lambda)| %.2e (tol 1e-12)", rowdev);
        th_report(rowdev < 1e-12, "rows of A1 - lambda A2 sum to 1 - lambda", det);
        /* q' = (q1, x, q2, y), k' = (k1, 1, k2, 1): adds alpha x_i and alpha y_i to the two maps' rows */
        double *Qs = dalloc((size_t)n * (d + 2)), *Ks = dalloc((size_t)m * (d + 2));
        for (int i = 0; i < n; i++) {
            memcpy(Qs + (d + 2) * i, p.Q + d * i, 2 * sizeof(double));
            Qs[(d + 2) * i + 2] = 0.3 * i - 0.5;
            memcpy(Qs + (d + 2) * i + 3, p.Q + d * i + 2, 2 * sizeof(double));
            Qs[(d + 2) * i + 5] = 1.1 - 0.4 * i;
        }
        for (int j = 0; j < m; j++) {
            memcpy(Ks + (d + 2) * j, p.K + d * j, 2 * sizeof(double));
            Ks[(d + 2) * j + 2] = 1.0;
            memcpy(Ks + (d + 2) * j + 3, p.K + d * j + 2, 2 * sizeof(double));
            Ks[(d + 2) * j + 5] = 1.0;
        }
        ref_diff_forward(n, m, d + 2, dv, Qs, Ks, p.V, p.alpha, 0.6, A2, O2);
        const double e = fmax(max_abs_diff(A, A2, 35), max_abs_diff(O, O2, 10));
        snprintf(det, sizeof det, "max diff %.2e (tol 1e-12)", e);
        th_report(e < 1e-12, "a score shift by row in either map is absorbed", det);
        free(A); free(O); free(A2); free(O2); free(Qs); free(Ks);
        drop(&p);
    }
    /* the batched wrapper: padding == truncation, dlambda summed over the batch */
    {
        const int B = 3, H = 2, Nq = 6, Nk = 5, d = 4, dv = 3;
        const int ql[3] = {4, 6, 0}, kl[3] = {5, 2, 3};
        const double lam[2] = {0.4, -0.9};
        const size_t nq = (size_t)B * H * Nq, nk = (size_t)B * H * Nk;
        double *Q = dalloc(nq * d), *K = dalloc(nk * d), *V = dalloc(nk * dv), *dO = dalloc(nq * dv);
        lcg g = {99};
        fill(&g, Q, nq * d, -1, 1);
        fill(&g, K, nk * d, -1, 1);
        fill(&g, V, nk * dv, -1, 1);
        fill(&g, dO, nq * dv, -1, 1);
        for (int b = 0; b < B; b++) /* NaN in the padding: never read */
            for (int h = 0; h < H; h++) {
                const size_t pq = (size_t)b * H + h;
                for (int i = ql[b]; i < Nq; i++) {
                    for (int k = 0; k < d; k++) Q[(pq * Nq + i) * d + k] = NAN;
                    for (int k = 0; k < dv; k++) dO[(pq * Nq + i) * dv + k] = NAN;
                }
                for (int j = kl[b]; j < Nk; j++) {
                    for (int k = 0; k < d; k++) K[(pq * Nk + j) * d + k] = NAN;
                    for (int k = 0; k < dv; k++) V[(pq * Nk + j) * dv + k] = NAN;
                }
            }
        double *A = dalloc(nq * Nk), *O = dalloc(nq * dv), *dQ = dalloc(nq * d), *dK = dalloc(nk * d),
               *dV = dalloc(nk * dv), dl[2];
        ref_diff_forward_batched(B, H, Nq, Nk, d, dv, ql, kl, Q, K, V, 0.7, lam, A, O);
        ref_diff_backward_batched(B, H, Nq, Nk, d, dv, ql, kl, Q, K, V, 0.7, lam, dO, dQ, dK, dV, dl);
        double e = 0.0, pad = 0.0, sum[2] = {0.0, 0.0};
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                const size_t pq = (size_t)b * H + h;
                const int n = ql[b], m = kl[b];
                for (int i = n; i < Nq; i++)
                    for (int k = 0; k < dv; k++) pad = fmax(pad, fabs(O[(pq * Nq + i) * dv + k]));
                if (n == 0 || m == 0) continue;
                double *a = dalloc((size_t)n * m), *o = dalloc((size_t)n * dv), *gq = dalloc((size_t)n * d),
                       *gk = dalloc((size_t)m * d), *gv = dalloc((size_t)m * dv), l1;
                ref_diff_forward(n, m, d, dv, Q + pq * Nq * d, K + pq * Nk * d, V + pq * Nk * dv, 0.7, lam[h], a, o);
                ref_diff_backward(n, m, d, dv, Q + pq * Nq * d, K + pq * Nk * d, V + pq * Nk * dv, 0.7, lam[h],
                                  dO + pq * Nq * dv, gq, gk, gv, &l1);
                sum[h] += l1;
                for (int i = 0; i < n; i++) {
                    for (int j = 0; j < m; j++) e = fmax(e, fabs(a[i * m + j] - A[(pq * Nq + i) * Nk + j]));
                    for (int k = 0; k < dv; k++) e = fmax(e, fabs(o[i * dv + k] - O[(pq * Nq + i) * dv + k]));
                    for (int k = 0; k < d; k++) e = fmax(e, fabs(gq[i * d + k] - dQ[(pq * Nq + i) * d + k]));
                }
                for (int j = 0; j < m; j++) {
                    for (int k = 0; k < d; k++) e = fmax(e, fabs(gk[j * d + k] - dK[(pq * Nk + j) * d + k]));
                    for (int k = 0; k < dv; k++) e = fmax(e, fabs(gv[j * dv + k] - dV[(pq * Nk + j) * dv + k]));
                }
                free(a); free(o); free(gq); free(gk); free(gv);
            }
        e = fmax(e, fmax(fabs(sum[0] - dl[0]), fabs(sum[1] - dl[1])));
        snprintf(det, sizeof det, "max diff %.2e, padded rows %.2e (tol 1e-12, 0)", e, pad);
        th_report(e < 1e-12 && pad == 0.0 && isfinite(e), "batched: padding == truncation, dlambda summed over b",
               det);
        free(Q); free(K); free(V); free(dO); free(A); free(O); free(dQ); free(dK); free(dV);
    }
    /* the re-parameterisation: lambda_init, and finite differences */
    {
        const double li1 = ref_diff_lambda_init(1), li12 = ref_diff_lambda_init(12);
        snprintf(det, sizeof det, "lambda_init(1) = %.6f (0.2), lambda_init(12) = %.6f (0.8 - 0.6 e^-3.3)", li1, li12);
        th_report(fabs(li1 - 0.2) < 1e-15 && fabs(li12 - (0.8 - 0.6 * exp(-3.3))) < 1e-15,
               "lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1))", det);
        const int dh = 4;
        double v[4][4], gr[4][4], emax = 0.0, gmax = 0.0;
        lcg g = {5};
        for (int r = 0; r < 4; r++) fill(&g, v[r], dh, -0.5, 0.5);
        const double li = ref_diff_lambda_init(3), dlam = 0.7;
        ref_diff_lambda_backward(dh, v[0], v[1], v[2], v[3], dlam, gr[0], gr[1], gr[2], gr[3]);
        for (int r = 0; r < 4; r++)
            for (int k = 0; k < dh; k++) {
                const double x0 = v[r][k], h = 1e-6;
                v[r][k] = x0 + h;
                const double lp = ref_diff_lambda(dh, v[0], v[1], v[2], v[3], li);
                v[r][k] = x0 - h;
                const double lm = ref_diff_lambda(dh, v[0], v[1], v[2], v[3], li);
                v[r][k] = x0;
                const double fd = dlam * (lp - lm) / (2 * h);
                emax = fmax(emax, fabs(fd - gr[r][k]));
                gmax = fmax(gmax, fabs(fd));
            }
        snprintf(det, sizeof det, "relative error %.2e (tol 1e-7)", emax / gmax);
        th_report(emax / gmax < 1e-7, "finite differences of the lambda re-parameterisation", det);
    }
    return th_summary();
}
