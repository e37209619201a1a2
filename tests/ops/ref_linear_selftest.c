/* ref_linear_selftest.c -- self-test of the kernelised attention reference
 * (tests/ops/ref_linear.c): central finite differences of every gradient
 * (Q, K, V) of the Linear Transformer (eps 1e-6 and 0) and of FAVOR+
 * (eps 0, where the detached stabilisers cancel exactly); the linear
 * reference's kernel form against the factorised sums S = sum phi(k) v^T,
 * z = sum phi(k) computed here; FAVOR+ with many i.i.d. Gaussian features
 * against softmax attention (the Sinkhorn reference with S = 1, another
 * formulation); the batched wrapper's padding. */
#include "ref_attn.h"
#include "ref_linear.h"
#include "ref_selftest_util.h"

#include <string.h>

typedef struct {
    int n, m, d, dv;
    ref_linear_cfg g;
    double *Q, *K, *V, *dO;
} prob;

static prob make(int n, int m, int d, int dv, ref_linear_cfg g, uint64_t seed)
{
    prob p = {n, m, d, dv, g, dalloc((size_t)n * d), dalloc((size_t)m * d), dalloc((size_t)m * dv),
              dalloc((size_t)n * dv)};
    lcg r = {seed};
    fill(&r, p.Q, (size_t)n * d, -1.2, 1.2);
    fill(&r, p.K, (size_t)m * d, -1.2, 1.2);
    fill(&r, p.V, (size_t)m * dv, -1.0, 1.0);
    fill(&r, p.dO, (size_t)n * dv, -1.0, 1.0);
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
    ref_linear_forward(p->n, p->m, p->d, p->dv, p->Q, p->K, p->V, &p->g, NULL, O);
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

/* a random F x d matrix of i.i.d. N(0, 1) entries */
static double *gaussian(int F, int d, uint64_t seed)
{
    lcg r = {seed};
    double *W = dalloc((size_t)F * d);
    for (int i = 0; i < F * d; i++) {
        const double u = lcg_uniform(&r, 1e-12, 1.0), w = lcg_uniform(&r, 0.0, 1.0);
        W[i] = sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w);
    }
    return W;
}

int main(void)
{
    TH.verbose = 1; /* one line per check */
    char name[128], det[200];
    double *W = gaussian(9, 4, 5);
    const ref_linear_cfg cfgs[4] = {{0, 1e-6, 0, NULL, 0}, {0, 0.0, 0, NULL, 0}, {1, 0.0, 9, W, 0.7},
                                    {1, 0.0, 9, W, 1.1}};
    for (int ci = 0; ci < 4; ci++) {
        prob p = make(5, 6, 4, 3, cfgs[ci], 100 + ci);
        double *dQ = dalloc(20), *dK = dalloc(24), *dV = dalloc(18);
        ref_linear_backward(p.n, p.m, p.d, p.dv, p.Q, p.K, p.V, &p.g, p.dO, dQ, dK, dV);
        const double eq = fd_rel(&p, p.Q, 20, dQ), ek = fd_rel(&p, p.K, 24, dK), ev = fd_rel(&p, p.V, 18, dV);
        snprintf(name, sizeof name, "finite differences (%s, eps %g, c %g)", cfgs[ci].performer ? "performer" : "linear",
                 cfgs[ci].eps, cfgs[ci].c);
        snprintf(det, sizeof det, "dQ %.2e dK %.2e dV %.2e (tol 1e-6)", eq, ek, ev);
        th_report(eq < 1e-6 && ek < 1e-6 && ev < 1e-6, name, det);
        free(dQ); free(dK); free(dV);
        drop(&p);
    }
    /* the kernel form == the factorised sums */
    {
        const int n = 6, m = 8, d = 5, dv = 3;
        prob p = make(n, m, d, dv, cfgs[0], 7);
        double *O = dalloc((size_t)n * dv), *A = dalloc((size_t)n * m), S[5 * 3] = {0}, z[5] = {0}, e = 0.0, rs = 0.0;
        ref_linear_forward(n, m, d, dv, p.Q, p.K, p.V, &p.g, A, O);
        for (int j = 0; j < m; j++)
            for (int x = 0; x < d; x++) {
                const double kx = p.K[j * d + x], ph = kx > 0 ? kx + 1 : exp(kx);
                z[x] += ph;
                for (int y = 0; y < dv; y++) S[x * dv + y] += ph * p.V[j * dv + y];
            }
        for (int i = 0; i < n; i++) {
            double num[3] = {0, 0, 0}, den = 1e-6, sum = 0;
            for (int x = 0; x < d; x++) {
                const double qx = p.Q[i * d + x], ph = qx > 0 ? qx + 1 : exp(qx);
                den += ph * z[x];
                for (int y = 0; y < dv; y++) num[y] += ph * S[x * dv + y];
            }
            for (int y = 0; y < dv; y++) e = fmax(e, fabs(num[y] / den - O[i * dv + y]));
            for (int j = 0; j < m; j++) sum += A[i * m + j];
            rs = fmax(rs, fabs(sum - 1.0));
        }
        snprintf(det, sizeof det, "max diff %.2e, |row sum - 1| %.2e (tol 1e-12, 1e-6)", e, rs);
        th_report(e < 1e-12 && rs < 1e-6, "linear: the kernel form == phi(q)^T S / (phi(q)^T z + eps)", det);
        free(O); free(A);
        drop(&p);
    }
    /* FAVOR+ with many i.i.d. features estimates softmax attention */
    {
        const int n = 6, m = 7, d = 4, dv = 3, F = 200000;
        double *Wb = gaussian(F, d, 9);
        const ref_linear_cfg g = {1, 0.0, F, Wb, sqrt(1.0 / sqrt((double)d))};
        prob p = make(n, m, d, dv, g, 8);
        double *A = dalloc((size_t)n * m), *O = dalloc((size_t)n * dv), *As = dalloc((size_t)n * m),
               *Os = dalloc((size_t)n * dv);
        ref_linear_forward(n, m, d, dv, p.Q, p.K, p.V, &p.g, A, O);
        ref_sinkhorn_forward(n, m, d, dv, p.Q, p.K, p.V, 1.0 / sqrt((double)d), 1, As, Os);
        const double e = max_abs_diff(A, As, (size_t)n * m);
        snprintf(det, sizeof det, "max |A - softmax| %.2e with %d features (tol 1e-2)", e, F);
        th_report(e < 1e-2, "performer estimates softmax attention", det);
        free(A); free(O); free(As); free(Os); free(Wb);
        drop(&p);
    }
    /* the batched wrapper: padded rows zero, valid blocks == the problem alone */
    {
        const int B = 2, H = 1, Nq = 4, Nk = 5, d = 3, dv = 2, ql[2] = {2, 4}, kl[2] = {3, 5};
        double Q[2 * 4 * 3], K[2 * 5 * 3], V[2 * 5 * 2], O[2 * 4 * 2], O1[2 * 2];
        lcg r = {3};
        fill(&r, Q, 24, -1, 1);
        fill(&r, K, 30, -1, 1);
        fill(&r, V, 20, -1, 1);
        ref_linear_forward_batched(B, H, Nq, Nk, d, dv, ql, kl, Q, K, V, &cfgs[0], NULL, O);
        ref_linear_forward(2, 3, d, dv, Q, K, V, &cfgs[0], NULL, O1);
        int ok = !memcmp(O1, O, sizeof O1);
        for (int i = 2 * dv; i < Nq * dv; i++) ok &= O[i] == 0.0;
        th_report(ok, "batched: padded rows zero, the valid block == the problem alone", ok ? "ok" : "differs");
    }
    free(W);
    return th_summary();
}
