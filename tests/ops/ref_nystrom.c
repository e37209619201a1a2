/*
 * ref_nystrom.c -- naive double-precision reference for Nystrom attention
 * (see ref_nystrom.h): plain loops over dual numbers, gradients by forward
 * mode. Clarity over speed.
 */
#include "ref_nystrom.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a dual number: value and tangent (derivative along one input entry) */
typedef struct {
    double v, t;
} dual;

static void die(const char *msg)
{
    fprintf(stderr, "ref_nystrom: %s\n", msg);
    abort();
}

static dual *xalloc(size_t n)
{
    dual *p = calloc(n ? n : 1, sizeof(dual));
    if (!p) die("out of memory");
    return p;
}

static dual dadd(dual a, dual b) { return (dual){a.v + b.v, a.t + b.t}; }
static dual dmul(dual a, dual b) { return (dual){a.v * b.v, a.t * b.v + a.v * b.t}; }
static dual dscale(dual a, double s) { return (dual){a.v * s, a.t * s}; }
static dual ddiv(dual a, dual b) { return (dual){a.v / b.v, (a.t * b.v - a.v * b.t) / (b.v * b.v)}; }

/* Y (p x q) = X (p x k) W (k x q) */
static void matmul(int p, int k, int q, const dual *X, const dual *W, dual *Y)
{
    for (int i = 0; i < p; i++)
        for (int j = 0; j < q; j++) {
            dual s = {0.0, 0.0};
            for (int x = 0; x < k; x++) s = dadd(s, dmul(X[(size_t)i * k + x], W[(size_t)x * q + j]));
            Y[(size_t)i * q + j] = s;
        }
}

/* L (r x d): L_j = the mean of rows [floor(j n / r), floor((j + 1) n / r)) of X */
static void landmarks(int n, int r, int d, const dual *X, dual *L)
{
    for (int j = 0; j < r; j++) {
        const int i0 = (int)((long long)j * n / r), i1 = (int)((long long)(j + 1) * n / r);
        for (int x = 0; x < d; x++) {
            dual s = {0.0, 0.0};
            for (int i = i0; i < i1; i++) s = dadd(s, X[(size_t)i * d + x]);
            L[(size_t)j * d + x] = dscale(s, 1.0 / (i1 - i0));
        }
    }
}

/* S (p x q) = softmax over each row of alpha X Y^T (X p x d, Y q x d) */
static void softmax_kernel(int p, int q, int d, const dual *X, const dual *Y, double alpha, dual *S)
{
    for (int i = 0; i < p; i++) {
        dual *Si = S + (size_t)i * q;
        double mx = -INFINITY;
        for (int j = 0; j < q; j++) {
            dual s = {0.0, 0.0};
            for (int x = 0; x < d; x++) s = dadd(s, dmul(X[(size_t)i * d + x], Y[(size_t)j * d + x]));
            Si[j] = dscale(s, alpha);
            if (Si[j].v > mx) mx = Si[j].v;
        }
        dual z = {0.0, 0.0};
        for (int j = 0; j < q; j++) {
            const double e = exp(Si[j].v - mx);
            Si[j] = (dual){e, e * Si[j].t}; /* the shift is a constant: no tangent */
            z = dadd(z, Si[j]);
        }
        if (!(z.v > 0.0) || !isfinite(z.v)) die("softmax normaliser out of range");
        for (int j = 0; j < q; j++) Si[j] = ddiv(Si[j], z);
    }
}

/* Z (r x r): the iterative Moore-Penrose pseudo-inverse of A (Razavi et al.) */
static void pinv(int r, int iters, const dual *A, dual *Z)
{
    /* Z_0 = A^T / (largest column sum of A; the first on a tie) */
    int jm = 0;
    double best = -1.0;
    for (int j = 0; j < r; j++) {
        double s = 0.0;
        for (int i = 0; i < r; i++) s += A[(size_t)i * r + j].v;
        if (s > best) best = s, jm = j;
    }
    dual c = {0.0, 0.0};
    for (int i = 0; i < r; i++) c = dadd(c, A[(size_t)i * r + jm]);
    for (int i = 0; i < r; i++)
        for (int j = 0; j < r; j++) Z[(size_t)i * r + j] = ddiv(A[(size_t)j * r + i], c);
    const size_t rr = (size_t)r * r;
    dual *P = xalloc(rr), *T = xalloc(rr), *U = xalloc(rr);
    for (int t = 0; t < iters; t++) {
        matmul(r, r, r, A, Z, P); /* P = A Z */
        /* T = 7 I - P; U = P T; T = 15 I - U; U = P T; T = 13 I - U */
        const double cs[3] = {7.0, 15.0, 13.0};
        memcpy(U, P, sizeof(dual) * rr);
        for (int k = 0; k < 3; k++) {
            if (k) matmul(r, r, r, P, T, U);
            for (int i = 0; i < r; i++)
                for (int j = 0; j < r; j++) {
                    const dual u = U[(size_t)i * r + j];
                    T[(size_t)i * r + j] = (dual){(i == j ? cs[k] : 0.0) - u.v, -u.t};
                }
        }
        matmul(r, r, r, Z, T, U); /* Z <- 1/4 Z T */
        for (size_t x = 0; x < rr; x++) Z[x] = dscale(U[x], 0.25);
    }
    free(P);
    free(T);
    free(U);
}

/* the forward on dual numbers: O (n x dv) and, when Att, F Z B (n x m) */
static void forward_dual(int n, int m, int d, int dv, const dual *Q, const dual *K, const dual *V, int l, int iters,
                         double alpha, dual *Att, dual *O)
{
    const int r = l < n ? (l < m ? l : m) : (n < m ? n : m);
    dual *Ql = xalloc((size_t)r * d), *Kl = xalloc((size_t)r * d);
    dual *F = xalloc((size_t)n * r), *A = xalloc((size_t)r * r), *Bk = xalloc((size_t)r * m);
    dual *Z = xalloc((size_t)r * r), *ZB = xalloc((size_t)r * m), *M = xalloc((size_t)n * m);
    landmarks(n, r, d, Q, Ql);
    landmarks(m, r, d, K, Kl);
    softmax_kernel(n, r, d, Q, Kl, alpha, F);
    softmax_kernel(r, r, d, Ql, Kl, alpha, A);
    softmax_kernel(r, m, d, Ql, K, alpha, Bk);
    pinv(r, iters, A, Z);
    matmul(r, r, m, Z, Bk, ZB);
    matmul(n, r, m, F, ZB, M); /* the dense attention */
    matmul(n, m, dv, M, V, O);
    if (Att) memcpy(Att, M, sizeof(dual) * (size_t)n * m);
    free(Ql); free(Kl); free(F); free(A); free(Bk); free(Z); free(ZB); free(M);
}

static void sizes_ok(int n, int m, int d, int dv, int l, int iters)
{
    if (n < 1 || m < 1 || d < 1 || dv < 1 || l < 1 || iters < 0) die("bad sizes");
}

static dual *lift(const double *x, size_t cnt)
{
    dual *y = xalloc(cnt);
    for (size_t i = 0; i < cnt; i++) y[i] = (dual){x[i], 0.0};
    return y;
}

void ref_nystrom_forward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V, int l,
                         int iters, double alpha, double *Att, double *O)
{
    sizes_ok(n, m, d, dv, l, iters);
    dual *q = lift(Q, (size_t)n * d), *k = lift(K, (size_t)m * d), *v = lift(V, (size_t)m * dv);
    dual *o = xalloc((size_t)n * dv), *a = Att ? xalloc((size_t)n * m) : NULL;
    forward_dual(n, m, d, dv, q, k, v, l, iters, alpha, a, o);
    for (size_t x = 0; x < (size_t)n * dv; x++) O[x] = o[x].v;
    if (Att)
        for (size_t x = 0; x < (size_t)n * m; x++) Att[x] = a[x].v;
    free(q); free(k); free(v); free(o); free(a);
}

void ref_nystrom_backward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V, int l,
                          int iters, double alpha, const double *dO, double *dQ, double *dK, double *dV)
{
    sizes_ok(n, m, d, dv, l, iters);
    dual *in[3] = {lift(Q, (size_t)n * d), lift(K, (size_t)m * d), lift(V, (size_t)m * dv)};
    const size_t cnt[3] = {(size_t)n * d, (size_t)m * d, (size_t)m * dv};
    double *grad[3] = {dQ, dK, dV};
    dual *o = xalloc((size_t)n * dv);
    for (int w = 0; w < 3; w++)
        for (size_t x = 0; x < cnt[w]; x++) {
            in[w][x].t = 1.0;
            forward_dual(n, m, d, dv, in[0], in[1], in[2], l, iters, alpha, NULL, o);
            in[w][x].t = 0.0;
            double s = 0.0;
            for (size_t e = 0; e < (size_t)n * dv; e++) s += dO[e] * o[e].t;
            grad[w][x] = s;
        }
    free(in[0]); free(in[1]); free(in[2]); free(o);
}

/* ---- batched, padded ------------------------------------------------------ */
static size_t off(int b, int h, int H, int N, int C) { return (((size_t)b * H + h) * N) * C; }

void ref_nystrom_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                                 const double *Q, const double *K, const double *V, int l, int iters, double alpha,
                                 double *Att, double *O)
{
    if (Att) memset(Att, 0, sizeof(double) * (size_t)B * H * Nq * Nk);
    memset(O, 0, sizeof(double) * (size_t)B * H * Nq * dv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int n = ql ? ql[b] : Nq, m = kl ? kl[b] : Nk;
            if (n < 1 || m < 1) continue;
            double *a = Att ? malloc(sizeof(double) * (size_t)n * m) : NULL;
            ref_nystrom_forward(n, m, d, dv, Q + off(b, h, H, Nq, d), K + off(b, h, H, Nk, d), V + off(b, h, H, Nk, dv),
                                l, iters, alpha, a, O + off(b, h, H, Nq, dv));
            if (a) {
                for (int i = 0; i < n; i++)
                    memcpy(Att + off(b, h, H, Nq, Nk) + (size_t)i * Nk, a + (size_t)i * m, sizeof(double) * m);
                free(a);
            }
        }
}

void ref_nystrom_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                                  const double *Q, const double *K, const double *V, int l, int iters, double alpha,
                                  const double *dO, double *dQ, double *dK, double *dV)
{
    memset(dQ, 0, sizeof(double) * (size_t)B * H * Nq * d);
    memset(dK, 0, sizeof(double) * (size_t)B * H * Nk * d);
    memset(dV, 0, sizeof(double) * (size_t)B * H * Nk * dv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int n = ql ? ql[b] : Nq, m = kl ? kl[b] : Nk;
            if (n < 1 || m < 1) continue;
            ref_nystrom_backward(n, m, d, dv, Q + off(b, h, H, Nq, d), K + off(b, h, H, Nk, d),
                                 V + off(b, h, H, Nk, dv), l, iters, alpha, dO + off(b, h, H, Nq, dv),
                                 dQ + off(b, h, H, Nq, d), dK + off(b, h, H, Nk, d), dV + off(b, h, H, Nk, dv));
        }
}
