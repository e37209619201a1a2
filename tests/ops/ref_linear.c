/*
 * ref_linear.c -- naive double-precision references for the Linear
 * Transformer and FAVOR+ (see ref_linear.h): explicit features, the explicit
 * n x m implied attention, reverse mode by hand. Clarity over speed.
 */
#include "ref_linear.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *msg)
{
    fprintf(stderr, "ref_linear: %s\n", msg);
    abort();
}

static double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    if (!p) die("out of memory");
    return p;
}

static int nfeat(const ref_linear_cfg *g, int d) { return g->performer ? g->F : d; }

/* Features of the `rows` rows of X (rows x d): P (rows x F) and dP/du
 * (performer) or dphi/dx (linear) in Dv; key: the keys' common stabiliser */
static void feats(const ref_linear_cfg *g, int rows, int d, const double *X, int key, double *P, double *Dv)
{
    const int F = nfeat(g, d);
    if (!g->performer) {
        for (int i = 0; i < rows * d; i++) {
            const double x = X[i];
            P[i] = x > 0 ? x + 1.0 : exp(x); /* elu(x) + 1 */
            Dv[i] = x > 0 ? 1.0 : exp(x);
        }
        return;
    }
    const double ratio = 1.0 / sqrt((double)F);
    double *dash = dalloc((size_t)rows * F);
    double a = -INFINITY;
    for (int i = 0; i < rows; i++)
        for (int f = 0; f < F; f++) {
            double s = 0;
            for (int x = 0; x < d; x++) s += g->W[(size_t)f * d + x] * X[(size_t)i * d + x];
            dash[(size_t)i * F + f] = g->c * s;
            if (dash[(size_t)i * F + f] > a) a = dash[(size_t)i * F + f];
        }
    for (int i = 0; i < rows; i++) {
        double nx = 0, ai = -INFINITY;
        for (int x = 0; x < d; x++) nx += X[(size_t)i * d + x] * X[(size_t)i * d + x];
        for (int f = 0; f < F; f++) ai = fmax(ai, dash[(size_t)i * F + f]);
        const double stab = key ? a : ai;
        for (int f = 0; f < F; f++) {
            const double e = ratio * exp(dash[(size_t)i * F + f] - g->c * g->c * nx / 2 - stab);
            Dv[(size_t)i * F + f] = e;
            P[(size_t)i * F + f] = e + ratio * g->eps;
        }
    }
    free(dash);
}

/* dX from dP through the features */
static void feats_bwd(const ref_linear_cfg *g, int rows, int d, const double *X, const double *Dv, const double *dP,
                      double *dX)
{
    const int F = nfeat(g, d);
    if (!g->performer) {
        for (int i = 0; i < rows * d; i++) dX[i] = dP[i] * Dv[i];
        return;
    }
    for (int i = 0; i < rows; i++)
        for (int x = 0; x < d; x++) {
            double s = 0;
            for (int f = 0; f < F; f++) {
                const double du = dP[(size_t)i * F + f] * Dv[(size_t)i * F + f];
                s += du * (g->c * g->W[(size_t)f * d + x] - g->c * g->c * X[(size_t)i * d + x]);
            }
            dX[(size_t)i * d + x] = s;
        }
}

static double eps_den(const ref_linear_cfg *g) { return g->performer ? 0.0 : g->eps; }

/* Kx (n x m) and r (n): the kernel matrix and its row sums + eps_den */
static void kernel(int n, int m, int F, const double *Pq, const double *Pk, double e, double *Kx, double *r)
{
    for (int i = 0; i < n; i++) {
        r[i] = e;
        for (int j = 0; j < m; j++) {
            double s = 0;
            for (int f = 0; f < F; f++) s += Pq[(size_t)i * F + f] * Pk[(size_t)j * F + f];
            Kx[(size_t)i * m + j] = s;
            r[i] += s;
        }
    }
}

void ref_linear_forward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V,
                        const ref_linear_cfg *g, double *A, double *O)
{
    if (n < 1 || m < 1 || d < 1 || dv < 1) die("bad sizes");
    const int F = nfeat(g, d);
    double *Pq = dalloc((size_t)n * F), *Dq = dalloc((size_t)n * F), *Pk = dalloc((size_t)m * F),
           *Dk = dalloc((size_t)m * F), *Kx = dalloc((size_t)n * m), *r = dalloc((size_t)n);
    feats(g, n, d, Q, 0, Pq, Dq);
    feats(g, m, d, K, 1, Pk, Dk);
    kernel(n, m, F, Pq, Pk, eps_den(g), Kx, r);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m; j++) Kx[(size_t)i * m + j] /= r[i];
        for (int c = 0; c < dv; c++) {
            double s = 0;
            for (int j = 0; j < m; j++) s += Kx[(size_t)i * m + j] * V[(size_t)j * dv + c];
            O[(size_t)i * dv + c] = s;
        }
    }
    if (A) memcpy(A, Kx, sizeof(double) * (size_t)n * m);
    free(Pq); free(Dq); free(Pk); free(Dk); free(Kx); free(r);
}

void ref_linear_backward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V,
                         const ref_linear_cfg *g, const double *dO, double *dQ, double *dK, double *dV)
{
    if (n < 1 || m < 1 || d < 1 || dv < 1) die("bad sizes");
    const int F = nfeat(g, d);
    double *Pq = dalloc((size_t)n * F), *Dq = dalloc((size_t)n * F), *Pk = dalloc((size_t)m * F),
           *Dk = dalloc((size_t)m * F), *Kx = dalloc((size_t)n * m), *r = dalloc((size_t)n);
    double *dA = dalloc((size_t)n * m), *dPq = dalloc((size_t)n * F), *dPk = dalloc((size_t)m * F);
    feats(g, n, d, Q, 0, Pq, Dq);
    feats(g, m, d, K, 1, Pk, Dk);
    kernel(n, m, F, Pq, Pk, eps_den(g), Kx, r);
    /* A = Kx / r; dV = A^T dO; dA = dO V^T */
    for (int j = 0; j < m; j++)
        for (int c = 0; c < dv; c++) {
            double s = 0;
            for (int i = 0; i < n; i++) s += Kx[(size_t)i * m + j] / r[i] * dO[(size_t)i * dv + c];
            dV[(size_t)j * dv + c] = s;
        }
    for (int i = 0; i < n; i++) {
        double t = 0;
        for (int j = 0; j < m; j++) {
            double s = 0;
            for (int c = 0; c < dv; c++) s += dO[(size_t)i * dv + c] * V[(size_t)j * dv + c];
            dA[(size_t)i * m + j] = s;
            t += s * Kx[(size_t)i * m + j] / r[i];
        }
        /* dKx_ij = (dA_ij - sum_j' dA_ij' A_ij') / r_i, in place */
        for (int j = 0; j < m; j++) dA[(size_t)i * m + j] = (dA[(size_t)i * m + j] - t) / r[i];
    }
    for (int i = 0; i < n; i++)
        for (int f = 0; f < F; f++) {
            double s = 0;
            for (int j = 0; j < m; j++) s += dA[(size_t)i * m + j] * Pk[(size_t)j * F + f];
            dPq[(size_t)i * F + f] = s;
        }
    for (int j = 0; j < m; j++)
        for (int f = 0; f < F; f++) {
            double s = 0;
            for (int i = 0; i < n; i++) s += dA[(size_t)i * m + j] * Pq[(size_t)i * F + f];
            dPk[(size_t)j * F + f] = s;
        }
    feats_bwd(g, n, d, Q, Dq, dPq, dQ);
    feats_bwd(g, m, d, K, Dk, dPk, dK);
    free(Pq); free(Dq); free(Pk); free(Dk); free(Kx); free(r); free(dA); free(dPq); free(dPk);
}

/* ---- batched, padded -------------------------------------------------------- */
static int len_of(const int *l, int b, int N) { return l ? l[b] : N; }

static double *take(const double *src, int rows, int C)
{
    double *p = dalloc((size_t)rows * C);
    memcpy(p, src, sizeof(double) * (size_t)rows * C);
    return p;
}

void ref_linear_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                                const double *Q, const double *K, const double *V, const ref_linear_cfg *g,
                                double *A, double *O)
{
    const size_t P = (size_t)B * H;
    if (A) memset(A, 0, sizeof(double) * P * Nq * Nk);
    memset(O, 0, sizeof(double) * P * Nq * dv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int n = len_of(ql, b, Nq), m = len_of(kl, b, Nk);
            if (n == 0 || m == 0) continue;
            const size_t p = (size_t)b * H + h;
            double *q = take(Q + p * Nq * d, n, d), *k = take(K + p * Nk * d, m, d), *v = take(V + p * Nk * dv, m, dv);
            double *a = dalloc((size_t)n * m), *o = dalloc((size_t)n * dv);
            ref_linear_forward(n, m, d, dv, q, k, v, g, a, o);
            for (int i = 0; i < n; i++) {
                if (A) memcpy(A + (p * Nq + i) * Nk, a + (size_t)i * m, sizeof(double) * m);
                memcpy(O + (p * Nq + i) * dv, o + (size_t)i * dv, sizeof(double) * dv);
            }
            free(q); free(k); free(v); free(a); free(o);
        }
}

void ref_linear_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                                 const double *Q, const double *K, const double *V, const ref_linear_cfg *g,
                                 const double *dO, double *dQ, double *dK, double *dV)
{
    const size_t P = (size_t)B * H;
    memset(dQ, 0, sizeof(double) * P * Nq * d);
    memset(dK, 0, sizeof(double) * P * Nk * d);
    memset(dV, 0, sizeof(double) * P * Nk * dv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int n = len_of(ql, b, Nq), m = len_of(kl, b, Nk);
            if (n == 0 || m == 0) continue;
            const size_t p = (size_t)b * H + h;
            double *q = take(Q + p * Nq * d, n, d), *k = take(K + p * Nk * d, m, d), *v = take(V + p * Nk * dv, m, dv);
            double *go = take(dO + p * Nq * dv, n, dv);
            ref_linear_backward(n, m, d, dv, q, k, v, g, go, dQ + p * Nq * d, dK + p * Nk * d, dV + p * Nk * dv);
            free(q); free(k); free(v); free(go);
        }
}
