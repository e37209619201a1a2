/*
 * ref_esp.c -- naive double-precision reference for ESP attention.
 * See ref_esp.h. Every matrix (P_l, R_l, U_l, C, G) is formed densely and kept
 * in a "tape"; the backward walks the tape in reverse by hand. Clarity over
 * speed: O(L N^3) time, O(L N^2) memory.
 */
#include "ref_esp.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static void esp_die(const char *msg)
{
    fprintf(stderr, "ref_esp: %s\n", msg);
    abort();
}

/* malloc of count doubles (count may be 0), aborting on failure. */
static double *esp_alloc(size_t count)
{
    if (count > SIZE_MAX / sizeof(double))
        esp_die("allocation size overflow");
    double *p = malloc(count > 0 ? count * sizeof(double) : 1);
    if (p == NULL)
        esp_die("out of memory");
    return p;
}

static int *esp_alloc_int(size_t count)
{
    if (count > SIZE_MAX / sizeof(int))
        esp_die("allocation size overflow");
    int *p = malloc(count > 0 ? count * sizeof(int) : 1);
    if (p == NULL)
        esp_die("out of memory");
    return p;
}

static void esp_zero(double *p, size_t count)
{
    for (size_t i = 0; i < count; i++)
        p[i] = 0.0;
}

int ref_esp_num_slices(int d, const ref_esp_cfg *c)
{
    if (c == NULL)
        esp_die("NULL configuration");
    if (c->theta == NULL) {
        if (c->L != 0 && c->L != d)
            esp_die("theta == NULL needs L == 0 or L == d");
        return d;
    }
    if (c->L < 1)
        esp_die("theta given with L < 1");
    return c->L;
}

static void esp_check_cfg(int d, const ref_esp_cfg *c)
{
    (void)ref_esp_num_slices(d, c);
    if (c->sort != 0 && c->sort != 1)
        esp_die("sort must be 0 (hard) or 1 (soft)");
    if (c->sort == 1 && !(c->t > 0.0 && isfinite(c->t)))
        esp_die("soft sort needs a finite temperature t > 0");
    if (!isfinite(c->tau) || !isfinite(c->scale))
        esp_die("tau and scale must be finite");
    if (c->cost != 0 && c->cost != 1)
        esp_die("cost must be 0 (squared) or 1 (Euclidean)");
    if (c->out_scale != 0 && c->out_scale != 1)
        esp_die("out_scale must be 0 (rows) or 1 (paper)");
}

static void esp_check_problem(int n, int m, int d, int dv, const ref_esp_cfg *c)
{
    if (n < 1 || m < 1 || d < 1 || dv < 1)
        esp_die("single-problem sizes must be >= 1");
    esp_check_cfg(d, c);
}

/* Stable ascending argsort by insertion: ord[r] = index of the r-th smallest;
 * equal values keep their index order. */
static void esp_argsort(int n, const double *a, int *ord)
{
    for (int i = 0; i < n; i++) {
        int j = i;
        while (j > 0 && a[ord[j - 1]] > a[i]) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = i;
    }
}

/* Sorting matrix S (n x n, row r = sorted position, column i = token) of the
 * values a, given their stable ascending order ord. Hard: one-hot at ord[r].
 * Soft: row r is softmax_i(-(a_i - a_ord[r])^2 / t). The largest exponent in
 * every row is exactly 0 (at i = ord[r]), so no shift is needed and the
 * normaliser is >= 1. */
static void esp_sort_matrix(int n, const double *a, const int *ord, int soft, double t,
                            double *S)
{
    for (int r = 0; r < n; r++) {
        double *row = S + (size_t)r * n;
        if (!soft) {
            for (int i = 0; i < n; i++)
                row[i] = 0.0;
            row[ord[r]] = 1.0;
            continue;
        }
        const double s = a[ord[r]];
        double z = 0.0;
        for (int i = 0; i < n; i++) {
            const double diff = a[i] - s;
            row[i] = exp(-(diff * diff) / t);
            z += row[i];
        }
        for (int i = 0; i < n; i++)
            row[i] /= z;
    }
}

/* North-west-corner plan W (n x m) between uniform measures of sizes n and
 * m: W[r,s] = |[r/n,(r+1)/n) cap [s/m,(s+1)/m)|. The overlap is computed in
 * integers on the common grid 1/(n m), then divided once. */
static void esp_nw_plan(int n, int m, double *W)
{
    const double denom = (double)n * (double)m;
    for (int r = 0; r < n; r++) {
        for (int s = 0; s < m; s++) {
            long long lo_r = (long long)r * m, hi_r = (long long)(r + 1) * m;
            long long lo_s = (long long)s * n, hi_s = (long long)(s + 1) * n;
            long long lo = lo_r > lo_s ? lo_r : lo_s;
            long long hi = hi_r < hi_s ? hi_r : hi_s;
            W[(size_t)r * m + s] = hi > lo ? (double)(hi - lo) / denom : 0.0;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Tape: every intermediate of the forward                                   */
/* ------------------------------------------------------------------------ */

typedef struct {
    int n, m, d, L;
    double cA;  /* A = cA * G */
    double *Th; /* L x d slices (identity when cfg->theta is NULL) */
    double *qs; /* n x d, scale * Q */
    double *ks; /* m x d, scale * K */
    double *a;  /* L x n projections */
    double *b;  /* L x m projections */
    int *oa;    /* L x n stable ascending order of a^l */
    int *ob;    /* L x m stable ascending order of b^l */
    double *P;  /* L x n x n */
    double *R;  /* L x m x m */
    double *W;  /* n x m */
    double *U;  /* L x n x m */
    double *C;  /* n x m */
    double *D;  /* L */
    double *sg; /* L, sigma */
    double *A;  /* n x m */
} esp_tape;

static void esp_tape_free(esp_tape *tp)
{
    free(tp->Th);
    free(tp->qs);
    free(tp->ks);
    free(tp->a);
    free(tp->b);
    free(tp->oa);
    free(tp->ob);
    free(tp->P);
    free(tp->R);
    free(tp->W);
    free(tp->U);
    free(tp->C);
    free(tp->D);
    free(tp->sg);
    free(tp->A);
}

static void esp_tape_build(int n, int m, int d, const double *Q, const double *K,
                           const ref_esp_cfg *c, esp_tape *tp)
{
    const int L = ref_esp_num_slices(d, c);
    const size_t nn = (size_t)n * n, mm = (size_t)m * m, nm = (size_t)n * m;
    tp->n = n;
    tp->m = m;
    tp->d = d;
    tp->L = L;
    tp->cA = (c->out_scale == 0) ? (double)n : 1.0;

    /* Slices. */
    tp->Th = esp_alloc((size_t)L * d);
    if (c->theta != NULL) {
        memcpy(tp->Th, c->theta, (size_t)L * d * sizeof(double));
    } else {
        for (int l = 0; l < L; l++)
            for (int k = 0; k < d; k++)
                tp->Th[(size_t)l * d + k] = (l == k) ? 1.0 : 0.0;
    }

    /* Scaled queries and keys. */
    tp->qs = esp_alloc((size_t)n * d);
    tp->ks = esp_alloc((size_t)m * d);
    for (size_t i = 0; i < (size_t)n * d; i++)
        tp->qs[i] = c->scale * Q[i];
    for (size_t j = 0; j < (size_t)m * d; j++)
        tp->ks[j] = c->scale * K[j];

    /* Projections and orders. */
    tp->a = esp_alloc((size_t)L * n);
    tp->b = esp_alloc((size_t)L * m);
    tp->oa = esp_alloc_int((size_t)L * n);
    tp->ob = esp_alloc_int((size_t)L * m);
    for (int l = 0; l < L; l++) {
        const double *th = tp->Th + (size_t)l * d;
        for (int i = 0; i < n; i++) {
            double s = 0.0;
            for (int k = 0; k < d; k++)
                s += tp->qs[(size_t)i * d + k] * th[k];
            if (!isfinite(s))
                esp_die("non-finite query projection");
            tp->a[(size_t)l * n + i] = s;
        }
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int k = 0; k < d; k++)
                s += tp->ks[(size_t)j * d + k] * th[k];
            if (!isfinite(s))
                esp_die("non-finite key projection");
            tp->b[(size_t)l * m + j] = s;
        }
        esp_argsort(n, tp->a + (size_t)l * n, tp->oa + (size_t)l * n);
        esp_argsort(m, tp->b + (size_t)l * m, tp->ob + (size_t)l * m);
    }

    /* Sorting matrices. */
    tp->P = esp_alloc((size_t)L * nn);
    tp->R = esp_alloc((size_t)L * mm);
    for (int l = 0; l < L; l++) {
        esp_sort_matrix(n, tp->a + (size_t)l * n, tp->oa + (size_t)l * n, c->sort, c->t,
                        tp->P + (size_t)l * nn);
        esp_sort_matrix(m, tp->b + (size_t)l * m, tp->ob + (size_t)l * m, c->sort, c->t,
                        tp->R + (size_t)l * mm);
    }

    /* Rank plan and lifted plans U_l = P^T W R. */
    tp->W = esp_alloc(nm);
    esp_nw_plan(n, m, tp->W);
    tp->U = esp_alloc((size_t)L * nm);
    double *WR = esp_alloc(nm);
    for (int l = 0; l < L; l++) {
        const double *P = tp->P + (size_t)l * nn;
        const double *R = tp->R + (size_t)l * mm;
        double *U = tp->U + (size_t)l * nm;
        for (int r = 0; r < n; r++)
            for (int j = 0; j < m; j++) {
                double s = 0.0;
                for (int q = 0; q < m; q++)
                    s += tp->W[(size_t)r * m + q] * R[(size_t)q * m + j];
                WR[(size_t)r * m + j] = s;
            }
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) {
                double s = 0.0;
                for (int r = 0; r < n; r++)
                    s += P[(size_t)r * n + i] * WR[(size_t)r * m + j];
                U[(size_t)i * m + j] = s;
            }
    }
    free(WR);

    /* Cost over the full d-dimensional scaled vectors. */
    tp->C = esp_alloc(nm);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int k = 0; k < d; k++) {
                const double e = tp->qs[(size_t)i * d + k] - tp->ks[(size_t)j * d + k];
                s += e * e;
            }
            tp->C[(size_t)i * m + j] = (c->cost == 0) ? s : sqrt(s);
        }

    /* Per-slice costs and slice weights. */
    tp->D = esp_alloc((size_t)L);
    tp->sg = esp_alloc((size_t)L);
    double dmin = INFINITY;
    for (int l = 0; l < L; l++) {
        const double *U = tp->U + (size_t)l * nm;
        double s = 0.0;
        for (size_t idx = 0; idx < nm; idx++)
            s += tp->C[idx] * U[idx];
        tp->D[l] = s;
        if (s < dmin)
            dmin = s;
    }
    double z = 0.0;
    for (int l = 0; l < L; l++) {
        tp->sg[l] = exp(-c->tau * (tp->D[l] - dmin));
        z += tp->sg[l];
    }
    if (!(z > 0.0) || !isfinite(z))
        esp_die("slice-weight normaliser is zero or non-finite");
    for (int l = 0; l < L; l++)
        tp->sg[l] /= z;

    /* A = cA sum_l sigma_l U_l. */
    tp->A = esp_alloc(nm);
    for (size_t idx = 0; idx < nm; idx++) {
        double s = 0.0;
        for (int l = 0; l < L; l++)
            s += tp->sg[l] * tp->U[(size_t)l * nm + idx];
        tp->A[idx] = tp->cA * s;
    }
}

/* ------------------------------------------------------------------------ */
/* Single problem                                                           */
/* ------------------------------------------------------------------------ */

void ref_esp_forward(int n, int m, int d, int dv, const double *Q, const double *K,
                     const double *V, const ref_esp_cfg *c, double *A, double *O,
                     double *sigma, double *D)
{
    esp_check_problem(n, m, d, dv, c);
    esp_tape tp;
    esp_tape_build(n, m, d, Q, K, c, &tp);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < dv; k++) {
            double s = 0.0;
            for (int j = 0; j < m; j++)
                s += tp.A[(size_t)i * m + j] * V[(size_t)j * dv + k];
            O[(size_t)i * dv + k] = s;
        }
    if (A != NULL)
        memcpy(A, tp.A, (size_t)n * m * sizeof(double));
    if (sigma != NULL)
        memcpy(sigma, tp.sg, (size_t)tp.L * sizeof(double));
    if (D != NULL)
        memcpy(D, tp.D, (size_t)tp.L * sizeof(double));
    esp_tape_free(&tp);
}

/* Reverse through one sorting matrix. Forward (soft): Z[r,i] = -(a_i - s_r)^2/t,
 * s_r = a_{ord[r]}, S = row softmax of Z. Adds dL/da to da given dS. */
static void esp_sort_backward(int n, const double *a, const int *ord, const double *S,
                              const double *dS, double t, double *da)
{
    for (int r = 0; r < n; r++) {
        const double *Sr = S + (size_t)r * n;
        const double *dSr = dS + (size_t)r * n;
        const double s = a[ord[r]];
        double dot = 0.0;
        for (int i = 0; i < n; i++)
            dot += Sr[i] * dSr[i];
        double gsum = 0.0;
        for (int i = 0; i < n; i++) {
            const double dZ = Sr[i] * (dSr[i] - dot);
            /* dZ/da_i = -2 (a_i - s_r)/t; dZ/ds_r = +2 (a_i - s_r)/t. */
            const double g = -2.0 * (a[i] - s) / t * dZ;
            da[i] += g;
            gsum += g;
        }
        da[ord[r]] -= gsum;
    }
}

void ref_esp_backward(int n, int m, int d, int dv, const double *Q, const double *K,
                      const double *V, const ref_esp_cfg *c, const double *dO, double *dQ,
                      double *dK, double *dV, double *dTheta)
{
    esp_check_problem(n, m, d, dv, c);
    esp_tape tp;
    esp_tape_build(n, m, d, Q, K, c, &tp);
    const int L = tp.L;
    const size_t nn = (size_t)n * n, mm = (size_t)m * m, nm = (size_t)n * m;

    /* dV = A^T dO (m x dv); dA = dO V^T (n x m). */
    for (int j = 0; j < m; j++)
        for (int k = 0; k < dv; k++) {
            double s = 0.0;
            for (int i = 0; i < n; i++)
                s += tp.A[(size_t)i * m + j] * dO[(size_t)i * dv + k];
            dV[(size_t)j * dv + k] = s;
        }
    double *dA = esp_alloc(nm);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int k = 0; k < dv; k++)
                s += dO[(size_t)i * dv + k] * V[(size_t)j * dv + k];
            dA[(size_t)i * m + j] = s;
        }

    /* A = cA sum sigma_l U_l: dsigma_l = cA <dA, U_l>. */
    double *dsg = esp_alloc((size_t)L);
    double *dD = esp_alloc((size_t)L);
    for (int l = 0; l < L; l++) {
        const double *U = tp.U + (size_t)l * nm;
        double s = 0.0;
        for (size_t idx = 0; idx < nm; idx++)
            s += dA[idx] * U[idx];
        dsg[l] = tp.cA * s;
    }
    /* sigma = softmax(-tau (D - min D)); the shift has zero gradient because
     * softmax is shift invariant. dD = -tau sigma (dsigma - <sigma, dsigma>). */
    double sdot = 0.0;
    for (int l = 0; l < L; l++)
        sdot += tp.sg[l] * dsg[l];
    for (int l = 0; l < L; l++)
        dD[l] = -c->tau * tp.sg[l] * (dsg[l] - sdot);

    /* D_l = <C, U_l>: dC = sum_l dD_l U_l. */
    double *dqs = esp_alloc((size_t)n * d);
    double *dks = esp_alloc((size_t)m * d);
    esp_zero(dqs, (size_t)n * d);
    esp_zero(dks, (size_t)m * d);
    double *dC = esp_alloc(nm);
    for (size_t idx = 0; idx < nm; idx++) {
        double s = 0.0;
        for (int l = 0; l < L; l++)
            s += dD[l] * tp.U[(size_t)l * nm + idx];
        dC[idx] = s;
    }
    /* Cost -> scaled queries and keys. */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            const double g = dC[(size_t)i * m + j];
            double coef;
            if (c->cost == 0) {
                coef = 2.0 * g;
            } else {
                const double dist = tp.C[(size_t)i * m + j];
                if (!(dist > 0.0))
                    continue; /* gradient 0 at zero distance */
                coef = g / dist;
            }
            for (int k = 0; k < d; k++) {
                const double e = tp.qs[(size_t)i * d + k] - tp.ks[(size_t)j * d + k];
                dqs[(size_t)i * d + k] += coef * e;
                dks[(size_t)j * d + k] -= coef * e;
            }
        }

    double *dTh = esp_alloc((size_t)L * d);
    esp_zero(dTh, (size_t)L * d);

    if (c->sort == 1) {
        double *dU = esp_alloc(nm);
        double *WR = esp_alloc(nm);             /* n x m */
        double *WtP = esp_alloc((size_t)m * n); /* m x n */
        double *dP = esp_alloc(nn);
        double *dR = esp_alloc(mm);
        double *da = esp_alloc((size_t)n);
        double *db = esp_alloc((size_t)m);
        for (int l = 0; l < L; l++) {
            const double *P = tp.P + (size_t)l * nn;
            const double *R = tp.R + (size_t)l * mm;
            const double *th = tp.Th + (size_t)l * d;
            /* dU_l = cA sigma_l dA + dD_l C. */
            for (size_t idx = 0; idx < nm; idx++)
                dU[idx] = tp.cA * tp.sg[l] * dA[idx] + dD[l] * tp.C[idx];
            /* U = P^T W R: dP = (W R) dU^T, dR = (W^T P) dU. */
            for (int r = 0; r < n; r++)
                for (int j = 0; j < m; j++) {
                    double s = 0.0;
                    for (int q = 0; q < m; q++)
                        s += tp.W[(size_t)r * m + q] * R[(size_t)q * m + j];
                    WR[(size_t)r * m + j] = s;
                }
            for (int q = 0; q < m; q++)
                for (int i = 0; i < n; i++) {
                    double s = 0.0;
                    for (int r = 0; r < n; r++)
                        s += tp.W[(size_t)r * m + q] * P[(size_t)r * n + i];
                    WtP[(size_t)q * n + i] = s;
                }
            for (int r = 0; r < n; r++)
                for (int i = 0; i < n; i++) {
                    double s = 0.0;
                    for (int j = 0; j < m; j++)
                        s += WR[(size_t)r * m + j] * dU[(size_t)i * m + j];
                    dP[(size_t)r * n + i] = s;
                }
            for (int q = 0; q < m; q++)
                for (int j = 0; j < m; j++) {
                    double s = 0.0;
                    for (int i = 0; i < n; i++)
                        s += WtP[(size_t)q * n + i] * dU[(size_t)i * m + j];
                    dR[(size_t)q * m + j] = s;
                }
            /* SoftSort backward to the projections. */
            esp_zero(da, (size_t)n);
            esp_zero(db, (size_t)m);
            esp_sort_backward(n, tp.a + (size_t)l * n, tp.oa + (size_t)l * n, P, dP, c->t, da);
            esp_sort_backward(m, tp.b + (size_t)l * m, tp.ob + (size_t)l * m, R, dR, c->t, db);
            /* a = qs theta_l, b = ks theta_l. */
            for (int i = 0; i < n; i++)
                for (int k = 0; k < d; k++) {
                    dqs[(size_t)i * d + k] += da[i] * th[k];
                    dTh[(size_t)l * d + k] += da[i] * tp.qs[(size_t)i * d + k];
                }
            for (int j = 0; j < m; j++)
                for (int k = 0; k < d; k++) {
                    dks[(size_t)j * d + k] += db[j] * th[k];
                    dTh[(size_t)l * d + k] += db[j] * tp.ks[(size_t)j * d + k];
                }
        }
        free(dU);
        free(WR);
        free(WtP);
        free(dP);
        free(dR);
        free(da);
        free(db);
    }

    /* q~ = scale Q, k~ = scale K. */
    for (size_t i = 0; i < (size_t)n * d; i++)
        dQ[i] = c->scale * dqs[i];
    for (size_t j = 0; j < (size_t)m * d; j++)
        dK[j] = c->scale * dks[j];
    if (dTheta != NULL)
        memcpy(dTheta, dTh, (size_t)L * d * sizeof(double));

    free(dA);
    free(dsg);
    free(dD);
    free(dqs);
    free(dks);
    free(dC);
    free(dTh);
    esp_tape_free(&tp);
}

/* ------------------------------------------------------------------------ */
/* Batched + padded                                                         */
/* ------------------------------------------------------------------------ */

static void esp_check_batched(int B, int H, int Nq, int Nk, int d, int dv, const ref_esp_cfg *c)
{
    if (B < 0 || H < 0)
        esp_die("B and H must be >= 0");
    if (Nq < 1 || Nk < 1 || d < 1 || dv < 1)
        esp_die("Nq, Nk, d, dv must be >= 1");
    esp_check_cfg(d, c);
}

static void esp_lengths(int b, int Nq, int Nk, const int *ql, const int *kl, int *Lq, int *Lk)
{
    *Lq = (ql != NULL) ? ql[b] : Nq;
    *Lk = (kl != NULL) ? kl[b] : Nk;
    if (*Lq < 0 || *Lq > Nq || *Lk < 0 || *Lk > Nk)
        esp_die("valid length out of range");
}

void ref_esp_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql,
                             const int *kl, const double *Q, const double *K, const double *V,
                             const ref_esp_cfg *c, double *A, double *O, double *sigma)
{
    esp_check_batched(B, H, Nq, Nk, d, dv, c);
    const int L = ref_esp_num_slices(d, c);
    double *Ablk = esp_alloc((size_t)Nq * Nk);
    for (int b = 0; b < B; b++) {
        int Lq, Lk;
        esp_lengths(b, Nq, Nk, ql, kl, &Lq, &Lk);
        for (int h = 0; h < H; h++) {
            const size_t p = (size_t)b * H + h;
            double *Op = O + p * Nq * dv;
            double *Ap = (A != NULL) ? A + p * Nq * Nk : NULL;
            double *sp = (sigma != NULL) ? sigma + p * L : NULL;
            esp_zero(Op, (size_t)Nq * dv);
            if (Ap != NULL)
                esp_zero(Ap, (size_t)Nq * Nk);
            if (sp != NULL)
                esp_zero(sp, (size_t)L);
            if (Lq == 0 || Lk == 0)
                continue;
            /* The valid rows are the leading Lq (Lk) rows: contiguous. */
            ref_esp_forward(Lq, Lk, d, dv, Q + p * Nq * d, K + p * Nk * d, V + p * Nk * dv, c,
                            Ablk, Op, sp, NULL);
            if (Ap != NULL)
                for (int i = 0; i < Lq; i++)
                    for (int j = 0; j < Lk; j++)
                        Ap[(size_t)i * Nk + j] = Ablk[(size_t)i * Lk + j];
        }
    }
    free(Ablk);
}

void ref_esp_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql,
                              const int *kl, const double *Q, const double *K, const double *V,
                              const ref_esp_cfg *c, const double *dO, double *dQ, double *dK,
                              double *dV, double *dTheta)
{
    esp_check_batched(B, H, Nq, Nk, d, dv, c);
    const int L = ref_esp_num_slices(d, c);
    double *dTh = esp_alloc((size_t)L * d);
    if (dTheta != NULL)
        esp_zero(dTheta, (size_t)L * d);
    for (int b = 0; b < B; b++) {
        int Lq, Lk;
        esp_lengths(b, Nq, Nk, ql, kl, &Lq, &Lk);
        for (int h = 0; h < H; h++) {
            const size_t p = (size_t)b * H + h;
            double *dQp = dQ + p * Nq * d;
            double *dKp = dK + p * Nk * d;
            double *dVp = dV + p * Nk * dv;
            esp_zero(dQp, (size_t)Nq * d);
            esp_zero(dKp, (size_t)Nk * d);
            esp_zero(dVp, (size_t)Nk * dv);
            if (Lq == 0 || Lk == 0)
                continue;
            ref_esp_backward(Lq, Lk, d, dv, Q + p * Nq * d, K + p * Nk * d, V + p * Nk * dv, c,
                             dO + p * Nq * dv, dQp, dKp, dVp, dTh);
            if (dTheta != NULL)
                for (size_t idx = 0; idx < (size_t)L * d; idx++)
                    dTheta[idx] += dTh[idx];
        }
    }
    free(dTh);
}
