/*
 * ref_attn.c -- naive double-precision reference for Sinkhorn attention.
 * See ref_attn.h. Matrix (not log-domain) form, every K^t stored, reverse
 * mode written out by hand. Clarity over speed.
 */
#include "ref_attn.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static void ref_die(const char *msg)
{
    fprintf(stderr, "ref_attn: %s\n", msg);
    abort();
}

/* malloc of count doubles (count may be 0), aborting on failure. */
static double *ref_alloc(size_t count)
{
    if (count > SIZE_MAX / sizeof(double))
        ref_die("allocation size overflow");
    double *p = malloc(count > 0 ? count * sizeof(double) : 1);
    if (p == NULL)
        ref_die("out of memory");
    return p;
}

static void ref_check_problem(int n, int m, int d, int dv, int S)
{
    if (n < 1 || m < 1 || d < 1 || dv < 1)
        ref_die("single-problem sizes must be >= 1");
    if (S < 1)
        ref_die("S must be >= 1");
}

/* C = alpha * Q K^T, then K0 = exp(C - max C). K0: n*m. */
static void ref_kernel0(int n, int m, int d, const double *Q, const double *K, double alpha,
                        double *K0)
{
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int k = 0; k < d; k++)
                s += Q[(size_t)i * d + k] * K[(size_t)j * d + k];
            K0[(size_t)i * m + j] = alpha * s;
        }
    }
    double cmax = K0[0];
    for (size_t idx = 0; idx < (size_t)n * m; idx++) {
        if (!isfinite(K0[idx]))
            ref_die("non-finite score");
        if (K0[idx] > cmax)
            cmax = K0[idx];
    }
    for (size_t idx = 0; idx < (size_t)n * m; idx++)
        K0[idx] = exp(K0[idx] - cmax);
}

/* Y = N_R(X): Y_ij = X_ij / sum_l X_il. Y may alias X. */
static void ref_row_normalise(int n, int m, const double *X, double *Y)
{
    for (int i = 0; i < n; i++) {
        double r = 0.0;
        for (int j = 0; j < m; j++)
            r += X[(size_t)i * m + j];
        if (!(r > 0.0) || !isfinite(r))
            ref_die("row normaliser is zero or non-finite (logit spread too large)");
        for (int j = 0; j < m; j++)
            Y[(size_t)i * m + j] = X[(size_t)i * m + j] / r;
    }
}

/* Y = (n/m) N_C(X): Y_ij = (n/m) X_ij / sum_l X_lj. Y may alias X. */
static void ref_col_normalise(int n, int m, const double *X, double *Y)
{
    const double target = (double)n / (double)m;
    double *colsum = ref_alloc((size_t)m);
    for (int j = 0; j < m; j++)
        colsum[j] = 0.0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++)
            colsum[j] += X[(size_t)i * m + j];
    for (int j = 0; j < m; j++)
        if (!(colsum[j] > 0.0) || !isfinite(colsum[j]))
            ref_die("column normaliser is zero or non-finite (logit spread too large)");
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++)
            Y[(size_t)i * m + j] = target * X[(size_t)i * m + j] / colsum[j];
    free(colsum);
}

/* Half-step t (1-based): odd = row step, even = column step. */
static void ref_half_step(int t, int n, int m, const double *X, double *Y)
{
    if (t % 2 == 1)
        ref_row_normalise(n, m, X, Y);
    else
        ref_col_normalise(n, m, X, Y);
}

/* All matrices K^0..K^S in one block: K^t = block + t*n*m. Caller frees. */
static double *ref_sinkhorn_store(int n, int m, int d, const double *Q, const double *K,
                                  double alpha, int S)
{
    const size_t nm = (size_t)n * m;
    if ((size_t)S + 1 > SIZE_MAX / (nm > 0 ? nm : 1))
        ref_die("allocation size overflow");
    double *Kt = ref_alloc(((size_t)S + 1) * nm);
    ref_kernel0(n, m, d, Q, K, alpha, Kt);
    for (int t = 1; t <= S; t++)
        ref_half_step(t, n, m, Kt + (size_t)(t - 1) * nm, Kt + (size_t)t * nm);
    return Kt;
}

/* O = A V; A: n*m, V: m*dv, O: n*dv. */
static void ref_matmul_AV(int n, int m, int dv, const double *A, const double *V, double *O)
{
    for (int i = 0; i < n; i++) {
        for (int c = 0; c < dv; c++) {
            double s = 0.0;
            for (int j = 0; j < m; j++)
                s += A[(size_t)i * m + j] * V[(size_t)j * dv + c];
            O[(size_t)i * dv + c] = s;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Single problem                                                           */
/* ------------------------------------------------------------------------ */

void ref_sinkhorn_forward(int n, int m, int d, int dv, const double *Q, const double *K,
                          const double *V, double alpha, int S, double *A, double *O)
{
    ref_check_problem(n, m, d, dv, S);
    const size_t nm = (size_t)n * m;
    double *Kt = ref_sinkhorn_store(n, m, d, Q, K, alpha, S);
    const double *AS = Kt + (size_t)S * nm;
    memcpy(A, AS, nm * sizeof(double));
    ref_matmul_AV(n, m, dv, AS, V, O);
    free(Kt);
}

void ref_sinkhorn_backward(int n, int m, int d, int dv, const double *Q, const double *K,
                           const double *V, double alpha, int S, const double *dO,
                           double *dQ, double *dK, double *dV)
{
    ref_check_problem(n, m, d, dv, S);
    const size_t nm = (size_t)n * m;
    double *Kt = ref_sinkhorn_store(n, m, d, Q, K, alpha, S);
    const double *A = Kt + (size_t)S * nm;

    /* dV = A^T dO (m x dv). */
    for (int j = 0; j < m; j++) {
        for (int c = 0; c < dv; c++) {
            double s = 0.0;
            for (int i = 0; i < n; i++)
                s += A[(size_t)i * m + j] * dO[(size_t)i * dv + c];
            dV[(size_t)j * dv + c] = s;
        }
    }

    /* dY = dA = dO V^T (n x m). */
    double *dY = ref_alloc(nm);
    double *dX = ref_alloc(nm);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int c = 0; c < dv; c++)
                s += dO[(size_t)i * dv + c] * V[(size_t)j * dv + c];
            dY[(size_t)i * m + j] = s;
        }
    }

    /* Reverse through K^t = N(K^{t-1}), t = S..1. */
    const double target = (double)n / (double)m;
    for (int t = S; t >= 1; t--) {
        const double *X = Kt + (size_t)(t - 1) * nm;
        const double *Y = Kt + (size_t)t * nm;
        if (t % 2 == 1) {
            /* Y_ij = X_ij / r_i:  dX_ij = (dY_ij - sum_l dY_il Y_il) / r_i. */
            for (int i = 0; i < n; i++) {
                double r = 0.0, dot = 0.0;
                for (int l = 0; l < m; l++) {
                    r += X[(size_t)i * m + l];
                    dot += dY[(size_t)i * m + l] * Y[(size_t)i * m + l];
                }
                for (int j = 0; j < m; j++)
                    dX[(size_t)i * m + j] = (dY[(size_t)i * m + j] - dot) / r;
            }
        } else {
            /* Y_ij = c X_ij / s_j (c = n/m):
             * dX_ij = (c dY_ij - sum_l dY_lj Y_lj) / s_j. */
            for (int j = 0; j < m; j++) {
                double s = 0.0, dot = 0.0;
                for (int l = 0; l < n; l++) {
                    s += X[(size_t)l * m + j];
                    dot += dY[(size_t)l * m + j] * Y[(size_t)l * m + j];
                }
                for (int i = 0; i < n; i++)
                    dX[(size_t)i * m + j] = (target * dY[(size_t)i * m + j] - dot) / s;
            }
        }
        double *tmp = dY;
        dY = dX;
        dX = tmp;
    }

    /* dY now holds dL/dK^0. K^0 = exp(C - const): dC = dK0 .* K0. */
    const double *K0 = Kt;
    for (size_t idx = 0; idx < nm; idx++)
        dY[idx] *= K0[idx];
    const double *dC = dY;

    /* dQ = alpha dC K (n x d), dK = alpha dC^T Q (m x d). */
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < d; k++) {
            double s = 0.0;
            for (int j = 0; j < m; j++)
                s += dC[(size_t)i * m + j] * K[(size_t)j * d + k];
            dQ[(size_t)i * d + k] = alpha * s;
        }
    }
    for (int j = 0; j < m; j++) {
        for (int k = 0; k < d; k++) {
            double s = 0.0;
            for (int i = 0; i < n; i++)
                s += dC[(size_t)i * m + j] * Q[(size_t)i * d + k];
            dK[(size_t)j * d + k] = alpha * s;
        }
    }

    free(dY);
    free(dX);
    free(Kt);
}

void ref_marginal_errors(int n, int m, const double *A, double *row_err, double *col_err)
{
    double re = 0.0, ce = 0.0;
    if (n >= 1 && m >= 1) {
        const double target = (double)n / (double)m;
        for (int i = 0; i < n; i++) {
            double r = 0.0;
            for (int j = 0; j < m; j++)
                r += A[(size_t)i * m + j];
            if (fabs(r - 1.0) > re || isnan(r))
                re = isnan(r) ? NAN : fabs(r - 1.0);
        }
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int i = 0; i < n; i++)
                s += A[(size_t)i * m + j];
            if (fabs(s - target) > ce || isnan(s))
                ce = isnan(s) ? NAN : fabs(s - target);
        }
    }
    if (row_err != NULL)
        *row_err = re;
    if (col_err != NULL)
        *col_err = ce;
}

int ref_sinkhorn_converge(int n, int m, int d, int dv, const double *Q, const double *K,
                          const double *V, double alpha, double tol, int max_steps,
                          double *A, double *O)
{
    ref_check_problem(n, m, d, dv, max_steps);
    /* Stop only after row steps, so the last allowed step is odd. */
    const int last = (max_steps % 2 == 1) ? max_steps : max_steps - 1;
    ref_kernel0(n, m, d, Q, K, alpha, A);
    int used = last;
    for (int t = 1; t <= last; t++) {
        ref_half_step(t, n, m, A, A); /* in place; same arithmetic as stored form */
        if (t % 2 == 1) {
            double re, ce;
            ref_marginal_errors(n, m, A, &re, &ce);
            if (re < tol && ce < tol) {
                used = t;
                break;
            }
        }
    }
    ref_matmul_AV(n, m, dv, A, V, O);
    return used;
}

/* ------------------------------------------------------------------------ */
/* Batched + padded                                                         */
/* ------------------------------------------------------------------------ */

static void ref_check_batched(int B, int H, int Nq, int Nk, int d, int dv, int S)
{
    if (B < 0 || H < 0)
        ref_die("B and H must be >= 0");
    if (Nq < 1 || Nk < 1 || d < 1 || dv < 1)
        ref_die("Nq, Nk, d, dv must be >= 1");
    if (S < 1)
        ref_die("S must be >= 1");
}

static void ref_lengths(int b, int Nq, int Nk, const int *ql, const int *kl, int *Lq, int *Lk)
{
    *Lq = (ql != NULL) ? ql[b] : Nq;
    *Lk = (kl != NULL) ? kl[b] : Nk;
    if (*Lq < 0 || *Lq > Nq || *Lk < 0 || *Lk > Nk)
        ref_die("valid length out of range");
}

static void ref_zero(double *p, size_t count)
{
    for (size_t i = 0; i < count; i++)
        p[i] = 0.0;
}

void ref_attn_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql,
                              const int *kl, const double *Q, const double *K, const double *V,
                              double alpha, int S, double *A, double *O)
{
    ref_check_batched(B, H, Nq, Nk, d, dv, S);
    double *Ablk = ref_alloc((size_t)Nq * Nk);
    for (int b = 0; b < B; b++) {
        int Lq, Lk;
        ref_lengths(b, Nq, Nk, ql, kl, &Lq, &Lk);
        for (int h = 0; h < H; h++) {
            const size_t p = (size_t)b * H + h;
            const double *Qp = Q + p * Nq * d;
            const double *Kp = K + p * Nk * d;
            const double *Vp = V + p * Nk * dv;
            double *Op = O + p * Nq * dv;
            double *Ap = (A != NULL) ? A + p * Nq * Nk : NULL;
            ref_zero(Op, (size_t)Nq * dv);
            if (Ap != NULL)
                ref_zero(Ap, (size_t)Nq * Nk);
            if (Lq == 0 || Lk == 0)
                continue;
            /* Valid rows are the leading Lq (Lk) rows: contiguous. */
            ref_sinkhorn_forward(Lq, Lk, d, dv, Qp, Kp, Vp, alpha, S, Ablk, Op);
            if (Ap != NULL)
                for (int i = 0; i < Lq; i++)
                    for (int j = 0; j < Lk; j++)
                        Ap[(size_t)i * Nk + j] = Ablk[(size_t)i * Lk + j];
        }
    }
    free(Ablk);
}

void ref_attn_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql,
                               const int *kl, const double *Q, const double *K, const double *V,
                               double alpha, int S, const double *dO, double *dQ, double *dK,
                               double *dV)
{
    ref_check_batched(B, H, Nq, Nk, d, dv, S);
    for (int b = 0; b < B; b++) {
        int Lq, Lk;
        ref_lengths(b, Nq, Nk, ql, kl, &Lq, &Lk);
        for (int h = 0; h < H; h++) {
            const size_t p = (size_t)b * H + h;
            double *dQp = dQ + p * Nq * d;
            double *dKp = dK + p * Nk * d;
            double *dVp = dV + p * Nk * dv;
            ref_zero(dQp, (size_t)Nq * d);
            ref_zero(dKp, (size_t)Nk * d);
            ref_zero(dVp, (size_t)Nk * dv);
            if (Lq == 0 || Lk == 0)
                continue;
            ref_sinkhorn_backward(Lq, Lk, d, dv, Q + p * Nq * d, K + p * Nk * d,
                                  V + p * Nk * dv, alpha, S, dO + p * Nq * dv, dQp, dKp, dVp);
        }
    }
}
