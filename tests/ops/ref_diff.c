/*
 * ref_diff.c -- naive double-precision reference for differential attention
 * (see ref_diff.h): two separate softmax attentions, their outputs
 * subtracted, reverse mode by hand. Clarity over speed.
 */
#include "ref_diff.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *msg)
{
    fprintf(stderr, "ref_diff: %s\n", msg);
    abort();
}

static double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    if (!p) die("out of memory");
    return p;
}

static void sizes_ok(int n, int m, int d, int dv)
{
    if (n < 1 || m < 1 || d < 2 || d % 2 || dv < 1) die("bad sizes (d must be even)");
}

/* A_r = softmax over j of alpha sum_{k < dh} Q[i][off + k] K[j][off + k] */
static void softmax_half(int n, int m, int d, int off, const double *Q, const double *K, double alpha, double *A)
{
    const int dh = d / 2;
    for (int i = 0; i < n; i++) {
        double *Ai = A + (size_t)i * m, mx = -INFINITY, z = 0.0;
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int k = 0; k < dh; k++) s += Q[(size_t)i * d + off + k] * K[(size_t)j * d + off + k];
            Ai[j] = alpha * s;
            if (Ai[j] > mx) mx = Ai[j];
        }
        for (int j = 0; j < m; j++) {
            Ai[j] = exp(Ai[j] - mx);
            z += Ai[j];
        }
        if (!(z > 0.0) || !isfinite(z)) die("softmax normaliser out of range");
        for (int j = 0; j < m; j++) Ai[j] /= z;
    }
}

/* Y = A V (n x dv) */
static void apply(int n, int m, int dv, const double *A, const double *V, double *Y)
{
    for (int i = 0; i < n; i++)
        for (int c = 0; c < dv; c++) {
            double s = 0.0;
            for (int j = 0; j < m; j++) s += A[(size_t)i * m + j] * V[(size_t)j * dv + c];
            Y[(size_t)i * dv + c] = s;
        }
}

void ref_diff_forward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V, double alpha,
                      double lambda, double *A, double *O)
{
    sizes_ok(n, m, d, dv);
    double *A1 = dalloc((size_t)n * m), *A2 = dalloc((size_t)n * m);
    double *O1 = dalloc((size_t)n * dv), *O2 = dalloc((size_t)n * dv);
    softmax_half(n, m, d, 0, Q, K, alpha, A1);
    softmax_half(n, m, d, d / 2, Q, K, alpha, A2);
    apply(n, m, dv, A1, V, O1);
    apply(n, m, dv, A2, V, O2);
    for (size_t x = 0; x < (size_t)n * dv; x++) O[x] = O1[x] - lambda * O2[x];
    if (A)
        for (size_t x = 0; x < (size_t)n * m; x++) A[x] = A1[x] - lambda * A2[x];
    free(A1); free(A2); free(O1); free(O2);
}

/* the softmax's reverse mode, entry by entry: Cbar from Abar (n x m) */
static void softmax_vjp(int n, int m, const double *A, const double *Abar, double *Cbar)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int k = 0; k < m; k++) {
                const double jac = A[(size_t)i * m + k] * ((j == k ? 1.0 : 0.0) - A[(size_t)i * m + j]);
                s += Abar[(size_t)i * m + k] * jac;
            }
            Cbar[(size_t)i * m + j] = s;
        }
}

void ref_diff_backward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V, double alpha,
                       double lambda, const double *dO, double *dQ, double *dK, double *dV, double *dlambda)
{
    sizes_ok(n, m, d, dv);
    const int dh = d / 2;
    double *A1 = dalloc((size_t)n * m), *A2 = dalloc((size_t)n * m), *O2 = dalloc((size_t)n * dv);
    double *B1 = dalloc((size_t)n * m), *B2 = dalloc((size_t)n * m), *C1 = dalloc((size_t)n * m),
           *C2 = dalloc((size_t)n * m);
    softmax_half(n, m, d, 0, Q, K, alpha, A1);
    softmax_half(n, m, d, dh, Q, K, alpha, A2);
    apply(n, m, dv, A2, V, O2);
    /* O = O1 - lambda O2: O1bar = dO, O2bar = -lambda dO, lambdabar = -<dO, O2> */
    double dl = 0.0;
    for (size_t x = 0; x < (size_t)n * dv; x++) dl -= dO[x] * O2[x];
    *dlambda = dl;
    /* O_r = A_r V: A_rbar = O_rbar V^T, V gets A1^T O1bar + A2^T O2bar */
    for (int j = 0; j < m; j++)
        for (int c = 0; c < dv; c++) {
            double s1 = 0.0, s2 = 0.0;
            for (int i = 0; i < n; i++) {
                s1 += A1[(size_t)i * m + j] * dO[(size_t)i * dv + c];
                s2 += A2[(size_t)i * m + j] * dO[(size_t)i * dv + c];
            }
            dV[(size_t)j * dv + c] = s1 - lambda * s2;
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int c = 0; c < dv; c++) s += dO[(size_t)i * dv + c] * V[(size_t)j * dv + c];
            B1[(size_t)i * m + j] = s;
            B2[(size_t)i * m + j] = -lambda * s;
        }
    softmax_vjp(n, m, A1, B1, C1);
    softmax_vjp(n, m, A2, B2, C2);
    /* C_r = alpha Q_r K_r^T */
    memset(dQ, 0, sizeof(double) * (size_t)n * d);
    memset(dK, 0, sizeof(double) * (size_t)m * d);
    for (int r = 0; r < 2; r++) {
        const double *Cb = r ? C2 : C1;
        const int off = r * dh;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) {
                const double g = alpha * Cb[(size_t)i * m + j];
                for (int k = 0; k < dh; k++) {
                    dQ[(size_t)i * d + off + k] += g * K[(size_t)j * d + off + k];
                    dK[(size_t)j * d + off + k] += g * Q[(size_t)i * d + off + k];
                }
            }
    }
    free(A1); free(A2); free(O2); free(B1); free(B2); free(C1); free(C2);
}

static void lens(int b, int Nq, int Nk, const int *ql, const int *kl, int *Lq, int *Lk)
{
    *Lq = ql ? ql[b] : Nq;
    *Lk = kl ? kl[b] : Nk;
    if (*Lq < 0 || *Lq > Nq || *Lk < 0 || *Lk > Nk) die("length out of range");
}

void ref_diff_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                              const double *Q, const double *K, const double *V, double alpha, const double *lambda,
                              double *A, double *O)
{
    double *Ab = dalloc((size_t)Nq * Nk);
    for (int b = 0; b < B; b++) {
        int Lq, Lk;
        lens(b, Nq, Nk, ql, kl, &Lq, &Lk);
        for (int hh = 0; hh < H; hh++) {
            const size_t p = (size_t)b * H + hh;
            double *Op = O + p * Nq * dv, *Ap = A ? A + p * Nq * Nk : NULL;
            memset(Op, 0, sizeof(double) * (size_t)Nq * dv);
            if (Ap) memset(Ap, 0, sizeof(double) * (size_t)Nq * Nk);
            if (Lq == 0 || Lk == 0) continue;
            ref_diff_forward(Lq, Lk, d, dv, Q + p * Nq * d, K + p * Nk * d, V + p * Nk * dv, alpha, lambda[hh], Ab, Op);
            if (Ap)
                for (int i = 0; i < Lq; i++) memcpy(Ap + (size_t)i * Nk, Ab + (size_t)i * Lk, sizeof(double) * Lk);
        }
    }
    free(Ab);
}

void ref_diff_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                               const double *Q, const double *K, const double *V, double alpha, const double *lambda,
                               const double *dO, double *dQ, double *dK, double *dV, double *dlambda)
{
    for (int hh = 0; hh < H; hh++) dlambda[hh] = 0.0;
    for (int b = 0; b < B; b++) {
        int Lq, Lk;
        lens(b, Nq, Nk, ql, kl, &Lq, &Lk);
        for (int hh = 0; hh < H; hh++) {
            const size_t p = (size_t)b * H + hh;
            double *dQp = dQ + p * Nq * d, *dKp = dK + p * Nk * d, *dVp = dV + p * Nk * dv, dl = 0.0;
            memset(dQp, 0, sizeof(double) * (size_t)Nq * d);
            memset(dKp, 0, sizeof(double) * (size_t)Nk * d);
            memset(dVp, 0, sizeof(double) * (size_t)Nk * dv);
            if (Lq == 0 || Lk == 0) continue;
            ref_diff_backward(Lq, Lk, d, dv, Q + p * Nq * d, K + p * Nk * d, V + p * Nk * dv, alpha, lambda[hh],
                              dO + p * Nq * dv, dQp, dKp, dVp, &dl);
            dlambda[hh] += dl;
        }
    }
}

double ref_diff_lambda_init(int layer)
{
    if (layer < 1) die("layers count from 1");
    return 0.8 - 0.6 * exp(-0.3 * (layer - 1));
}

static double dot(int n, const double *a, const double *b)
{
    double s = 0.0;
    for (int k = 0; k < n; k++) s += a[k] * b[k];
    return s;
}

double ref_diff_lambda(int dh, const double *lq1, const double *lk1, const double *lq2, const double *lk2,
                       double lambda_init)
{
    return exp(dot(dh, lq1, lk1)) - exp(dot(dh, lq2, lk2)) + lambda_init;
}

void ref_diff_lambda_backward(int dh, const double *lq1, const double *lk1, const double *lq2, const double *lk2,
                              double dlambda, double *dlq1, double *dlk1, double *dlq2, double *dlk2)
{
    const double e1 = exp(dot(dh, lq1, lk1)), e2 = exp(dot(dh, lq2, lk2));
    for (int k = 0; k < dh; k++) {
        if (dlq1) dlq1[k] = dlambda * e1 * lk1[k];
        if (dlk1) dlk1[k] = dlambda * e1 * lq1[k];
        if (dlq2) dlq2[k] = -dlambda * e2 * lk2[k];
        if (dlk2) dlk2[k] = -dlambda * e2 * lq2[k];
    }
}
