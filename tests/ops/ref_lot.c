/*
 * ref_lot.c -- naive double-precision reference for LOT attention.
 * See ref_lot.h. Matrix-scaling (not log-domain) Sinkhorn, every scaled
 * matrix stored, dense attention matrix, reverse mode written out by hand.
 * Clarity over speed.
 */
#include "ref_lot.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static void lot_die(const char *msg)
{
    fprintf(stderr, "ref_lot: %s\n", msg);
    abort();
}

/* malloc of count doubles (count may be 0), aborting on failure. */
static double *lot_alloc(size_t count)
{
    if (count > SIZE_MAX / sizeof(double))
        lot_die("allocation size overflow");
    double *p = malloc(count > 0 ? count * sizeof(double) : 1);
    if (p == NULL)
        lot_die("out of memory");
    return p;
}

static void lot_zero(double *p, size_t count)
{
    for (size_t i = 0; i < count; i++)
        p[i] = 0.0;
}

static void lot_check_problem(int n, int m, int d, int dv, int r, double temp, int T, double eps)
{
    if (n < 1 || m < 1 || d < 1 || dv < 1 || r < 1)
        lot_die("single-problem sizes must be >= 1");
    if (T < 1)
        lot_die("T must be >= 1");
    if (!(temp > 0.0) || !(eps > 0.0))
        lot_die("temp and eps must be > 0");
}

/* p0 = softmax(theta / temp), length r. */
static void lot_softmax(int r, const double *theta, double temp, double *p0)
{
    double mx = theta[0] / temp;
    for (int t = 1; t < r; t++)
        if (theta[t] / temp > mx)
            mx = theta[t] / temp;
    double z = 0.0;
    for (int t = 0; t < r; t++) {
        p0[t] = exp(theta[t] / temp - mx);
        z += p0[t];
    }
    for (int t = 0; t < r; t++)
        p0[t] /= z;
}

/* M = exp(c X Y^T - max), X: rows*d, Y: cols*d, M: rows*cols, c = s/eps. */
static void lot_kernel(int rows, int cols, int d, const double *X, const double *Y, double c,
                       double *M)
{
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) {
            double acc = 0.0;
            for (int k = 0; k < d; k++)
                acc += X[(size_t)i * d + k] * Y[(size_t)j * d + k];
            M[(size_t)i * cols + j] = c * acc;
        }
    }
    const size_t cnt = (size_t)rows * cols;
    double mx = M[0];
    for (size_t idx = 0; idx < cnt; idx++) {
        if (!isfinite(M[idx]))
            lot_die("non-finite score");
        if (M[idx] > mx)
            mx = M[idx];
    }
    for (size_t idx = 0; idx < cnt; idx++)
        M[idx] = exp(M[idx] - mx);
}

/* Row scaling: Y_ij = rt_i X_ij / sum_l X_il. */
static void lot_row_scale(int rows, int cols, const double *rt, const double *X, double *Y)
{
    for (int i = 0; i < rows; i++) {
        double rs = 0.0;
        for (int j = 0; j < cols; j++)
            rs += X[(size_t)i * cols + j];
        if (!(rs > 0.0) || !isfinite(rs))
            lot_die("row normaliser is zero or non-finite (logit spread too large)");
        for (int j = 0; j < cols; j++)
            Y[(size_t)i * cols + j] = rt[i] * X[(size_t)i * cols + j] / rs;
    }
}

/* Column scaling: Y_ij = ct_j X_ij / sum_l X_lj. */
static void lot_col_scale(int rows, int cols, const double *ct, const double *X, double *Y)
{
    for (int j = 0; j < cols; j++) {
        double cs = 0.0;
        for (int i = 0; i < rows; i++)
            cs += X[(size_t)i * cols + j];
        if (!(cs > 0.0) || !isfinite(cs))
            lot_die("column normaliser is zero or non-finite (logit spread too large)");
        for (int i = 0; i < rows; i++)
            Y[(size_t)i * cols + j] = ct[j] * X[(size_t)i * cols + j] / cs;
    }
}

/* Stack[0] holds the kernel; fills Stack[1..T] (each rows*cols). */
static void lot_sinkhorn(int rows, int cols, int T, const double *rt, const double *ct,
                         double *Stack)
{
    const size_t rc = (size_t)rows * cols;
    for (int t = 1; t <= T; t++) {
        const double *X = Stack + (size_t)(t - 1) * rc;
        double *Y = Stack + (size_t)t * rc;
        if (t % 2 == 1)
            lot_row_scale(rows, cols, rt, X, Y);
        else
            lot_col_scale(rows, cols, ct, X, Y);
    }
}

/*
 * Reverse through the stored scalings. On entry dM = dL/dStack[T]; on exit
 * dM = dL/dStack[0]. drt (rows) and dct (cols) are ACCUMULATED with the
 * gradients w.r.t. the row and column targets. scratch: rows*cols.
 */
static void lot_sinkhorn_back(int rows, int cols, int T, const double *rt, const double *ct,
                              const double *Stack, double *dM, double *scratch, double *drt,
                              double *dct)
{
    const size_t rc = (size_t)rows * cols;
    double *dY = dM, *dX = scratch;
    for (int t = T; t >= 1; t--) {
        const double *X = Stack + (size_t)(t - 1) * rc;
        const double *Y = Stack + (size_t)t * rc;
        if (t % 2 == 1) {
            /* Y_ij = rt_i X_ij / R_i, R_i = sum_l X_il:
             *   dX_ij = (rt_i dY_ij - sum_l dY_il Y_il) / R_i,
             *   drt_i += sum_l dY_il X_il / R_i. */
            for (int i = 0; i < rows; i++) {
                double R = 0.0, dot = 0.0, dtg = 0.0;
                for (int l = 0; l < cols; l++) {
                    R += X[(size_t)i * cols + l];
                    dot += dY[(size_t)i * cols + l] * Y[(size_t)i * cols + l];
                    dtg += dY[(size_t)i * cols + l] * X[(size_t)i * cols + l];
                }
                for (int j = 0; j < cols; j++)
                    dX[(size_t)i * cols + j] = (rt[i] * dY[(size_t)i * cols + j] - dot) / R;
                drt[i] += dtg / R;
            }
        } else {
            /* Y_ij = ct_j X_ij / C_j, C_j = sum_l X_lj:
             *   dX_ij = (ct_j dY_ij - sum_l dY_lj Y_lj) / C_j,
             *   dct_j += sum_l dY_lj X_lj / C_j. */
            for (int j = 0; j < cols; j++) {
                double C = 0.0, dot = 0.0, dtg = 0.0;
                for (int l = 0; l < rows; l++) {
                    C += X[(size_t)l * cols + j];
                    dot += dY[(size_t)l * cols + j] * Y[(size_t)l * cols + j];
                    dtg += dY[(size_t)l * cols + j] * X[(size_t)l * cols + j];
                }
                for (int i = 0; i < rows; i++)
                    dX[(size_t)i * cols + j] = (ct[j] * dY[(size_t)i * cols + j] - dot) / C;
                dct[j] += dtg / C;
            }
        }
        double *tmp = dY;
        dY = dX;
        dX = tmp;
    }
    if (dY != dM)
        memcpy(dM, dY, rc * sizeof(double));
}

/* Everything the forward computes, kept for the backward. */
typedef struct {
    double *p0;  /* r */
    double *a;   /* n, all 1/n */
    double *b;   /* m, all 1/m */
    double *S1;  /* (T+1) * n*r: K1, then each scaling of problem 1 */
    double *S2;  /* (T+1) * r*m: K2, then each scaling of problem 2 */
    double *A;   /* n*m */
} lot_state;

static void lot_state_build(int n, int m, int d, int r, const double *Q, const double *K,
                            const double *Z, const double *theta, double temp, int T,
                            double eps, double s, lot_state *st)
{
    const size_t nr = (size_t)n * r, rm = (size_t)r * m;
    const size_t big = nr > rm ? nr : rm;
    if ((size_t)T + 1 > SIZE_MAX / sizeof(double) / (big > 0 ? big : 1))
        lot_die("allocation size overflow");
    st->p0 = lot_alloc((size_t)r);
    st->a = lot_alloc((size_t)n);
    st->b = lot_alloc((size_t)m);
    st->S1 = lot_alloc(((size_t)T + 1) * nr);
    st->S2 = lot_alloc(((size_t)T + 1) * rm);
    st->A = lot_alloc((size_t)n * m);

    lot_softmax(r, theta, temp, st->p0);
    for (int i = 0; i < n; i++)
        st->a[i] = 1.0 / (double)n;
    for (int j = 0; j < m; j++)
        st->b[j] = 1.0 / (double)m;

    lot_kernel(n, r, d, Q, Z, s / eps, st->S1);
    lot_kernel(r, m, d, Z, K, s / eps, st->S2);
    lot_sinkhorn(n, r, T, st->a, st->p0, st->S1);
    lot_sinkhorn(r, m, T, st->p0, st->b, st->S2);

    /* A_ij = n sum_t G1_it G2_tj / p0_t. */
    const double *G1 = st->S1 + (size_t)T * nr;
    const double *G2 = st->S2 + (size_t)T * rm;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m; j++) {
            double acc = 0.0;
            for (int t = 0; t < r; t++)
                acc += G1[(size_t)i * r + t] * G2[(size_t)t * m + j] / st->p0[t];
            st->A[(size_t)i * m + j] = (double)n * acc;
        }
    }
}

static void lot_state_free(lot_state *st)
{
    free(st->p0);
    free(st->a);
    free(st->b);
    free(st->S1);
    free(st->S2);
    free(st->A);
}

/* ------------------------------------------------------------------------ */
/* Single problem                                                           */
/* ------------------------------------------------------------------------ */

void ref_lot_forward(int n, int m, int d, int dv, int r, const double *Q, const double *K,
                     const double *V, const double *Z, const double *theta, double temp, int T,
                     double eps, double s, double *A, double *O)
{
    lot_check_problem(n, m, d, dv, r, temp, T, eps);
    lot_state st;
    lot_state_build(n, m, d, r, Q, K, Z, theta, temp, T, eps, s, &st);
    if (A != NULL)
        memcpy(A, st.A, (size_t)n * m * sizeof(double));
    for (int i = 0; i < n; i++) {
        for (int c = 0; c < dv; c++) {
            double acc = 0.0;
            for (int j = 0; j < m; j++)
                acc += st.A[(size_t)i * m + j] * V[(size_t)j * dv + c];
            O[(size_t)i * dv + c] = acc;
        }
    }
    lot_state_free(&st);
}

void ref_lot_backward(int n, int m, int d, int dv, int r, const double *Q, const double *K,
                      const double *V, const double *Z, const double *theta, double temp, int T,
                      double eps, double s, const double *dO, double *dQ, double *dK,
                      double *dV, double *dZ, double *dtheta)
{
    lot_check_problem(n, m, d, dv, r, temp, T, eps);
    lot_state st;
    lot_state_build(n, m, d, r, Q, K, Z, theta, temp, T, eps, s, &st);
    const size_t nr = (size_t)n * r, rm = (size_t)r * m, nm = (size_t)n * m;
    const double *A = st.A, *p0 = st.p0;
    const double *G1 = st.S1 + (size_t)T * nr;
    const double *G2 = st.S2 + (size_t)T * rm;

    /* O = A V:  dV = A^T dO,  dA = dO V^T. */
    for (int j = 0; j < m; j++) {
        for (int c = 0; c < dv; c++) {
            double acc = 0.0;
            for (int i = 0; i < n; i++)
                acc += A[(size_t)i * m + j] * dO[(size_t)i * dv + c];
            dV[(size_t)j * dv + c] = acc;
        }
    }
    double *dA = lot_alloc(nm);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m; j++) {
            double acc = 0.0;
            for (int c = 0; c < dv; c++)
                acc += dO[(size_t)i * dv + c] * V[(size_t)j * dv + c];
            dA[(size_t)i * m + j] = acc;
        }
    }

    /* A_ij = n sum_t G1_it G2_tj / p0_t:
     *   dG1_it = (n/p0_t) sum_j dA_ij G2_tj
     *   dG2_tj = (n/p0_t) sum_i G1_it dA_ij
     *   dp0_t  = -(n/p0_t^2) sum_ij G1_it dA_ij G2_tj */
    double *dG1 = lot_alloc(nr), *dG2 = lot_alloc(rm);
    double *dp0 = lot_alloc((size_t)r);
    const double nd = (double)n;
    for (int t = 0; t < r; t++) {
        double glue = 0.0;
        for (int i = 0; i < n; i++) {
            double acc = 0.0;
            for (int j = 0; j < m; j++)
                acc += dA[(size_t)i * m + j] * G2[(size_t)t * m + j];
            dG1[(size_t)i * r + t] = nd / p0[t] * acc;
            glue += G1[(size_t)i * r + t] * acc;
        }
        for (int j = 0; j < m; j++) {
            double acc = 0.0;
            for (int i = 0; i < n; i++)
                acc += G1[(size_t)i * r + t] * dA[(size_t)i * m + j];
            dG2[(size_t)t * m + j] = nd / p0[t] * acc;
        }
        dp0[t] = -nd / (p0[t] * p0[t]) * glue;
    }

    /* Reverse through both Sinkhorn problems. p0 is the column target of
     * problem 1 and the row target of problem 2; the uniform targets' grads
     * are discarded. */
    double *da = lot_alloc((size_t)n), *db = lot_alloc((size_t)m);
    lot_zero(da, (size_t)n);
    lot_zero(db, (size_t)m);
    double *scr1 = lot_alloc(nr), *scr2 = lot_alloc(rm);
    lot_sinkhorn_back(n, r, T, st.a, p0, st.S1, dG1, scr1, da, dp0);
    lot_sinkhorn_back(r, m, T, p0, st.b, st.S2, dG2, scr2, dp0, db);

    /* K = exp(c L - const) with c = s/eps: dLogit = dK .* K (the global
     * shift's gradient cancels: the first scaling is scale invariant). */
    const double c = s / eps;
    for (size_t idx = 0; idx < nr; idx++)
        dG1[idx] *= st.S1[idx];
    for (size_t idx = 0; idx < rm; idx++)
        dG2[idx] *= st.S2[idx];
    const double *dL1 = dG1, *dL2 = dG2;

    /* L1 = c Q Z^T (n x r): dQ = c dL1 Z, dZ += c dL1^T Q.
     * L2 = c Z K^T (r x m): dK = c dL2^T Z, dZ += c dL2 K. */
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < d; k++) {
            double acc = 0.0;
            for (int t = 0; t < r; t++)
                acc += dL1[(size_t)i * r + t] * Z[(size_t)t * d + k];
            dQ[(size_t)i * d + k] = c * acc;
        }
    }
    for (int j = 0; j < m; j++) {
        for (int k = 0; k < d; k++) {
            double acc = 0.0;
            for (int t = 0; t < r; t++)
                acc += dL2[(size_t)t * m + j] * Z[(size_t)t * d + k];
            dK[(size_t)j * d + k] = c * acc;
        }
    }
    for (int t = 0; t < r; t++) {
        for (int k = 0; k < d; k++) {
            double acc = 0.0;
            for (int i = 0; i < n; i++)
                acc += dL1[(size_t)i * r + t] * Q[(size_t)i * d + k];
            for (int j = 0; j < m; j++)
                acc += dL2[(size_t)t * m + j] * K[(size_t)j * d + k];
            dZ[(size_t)t * d + k] = c * acc;
        }
    }

    /* p0 = softmax(theta/temp): dtheta = p0 .* (dp0 - <p0, dp0>) / temp. */
    double mean = 0.0;
    for (int t = 0; t < r; t++)
        mean += p0[t] * dp0[t];
    for (int t = 0; t < r; t++)
        dtheta[t] = p0[t] * (dp0[t] - mean) / temp;

    free(dA);
    free(dG1);
    free(dG2);
    free(dp0);
    free(da);
    free(db);
    free(scr1);
    free(scr2);
    lot_state_free(&st);
}

/* ------------------------------------------------------------------------ */
/* Batched + padded                                                         */
/* ------------------------------------------------------------------------ */

static void lot_check_batched(int B, int H, int Nq, int Nk, int d, int dv, int r, double temp,
                              int T, double eps)
{
    if (B < 0 || H < 0)
        lot_die("B and H must be >= 0");
    if (Nq < 1 || Nk < 1 || d < 1 || dv < 1 || r < 1)
        lot_die("Nq, Nk, d, dv, r must be >= 1");
    if (T < 1)
        lot_die("T must be >= 1");
    if (!(temp > 0.0) || !(eps > 0.0))
        lot_die("temp and eps must be > 0");
}

static void lot_lengths(int b, int Nq, int Nk, const int *ql, const int *kl, int *Lq, int *Lk)
{
    *Lq = (ql != NULL) ? ql[b] : Nq;
    *Lk = (kl != NULL) ? kl[b] : Nk;
    if (*Lq < 0 || *Lq > Nq || *Lk < 0 || *Lk > Nk)
        lot_die("valid length out of range");
}

void ref_lot_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, int r, const int *ql,
                             const int *kl, const double *Q, const double *K, const double *V,
                             const double *Z, const double *theta, double temp, int T,
                             double eps, double s, double *A, double *O)
{
    lot_check_batched(B, H, Nq, Nk, d, dv, r, temp, T, eps);
    double *Ablk = lot_alloc((size_t)Nq * Nk);
    for (int b = 0; b < B; b++) {
        int Lq, Lk;
        lot_lengths(b, Nq, Nk, ql, kl, &Lq, &Lk);
        for (int h = 0; h < H; h++) {
            const size_t p = (size_t)b * H + h;
            double *Op = O + p * Nq * dv;
            double *Ap = (A != NULL) ? A + p * Nq * Nk : NULL;
            lot_zero(Op, (size_t)Nq * dv);
            if (Ap != NULL)
                lot_zero(Ap, (size_t)Nq * Nk);
            if (Lq == 0 || Lk == 0)
                continue;
            /* Valid rows are the leading Lq (Lk) rows: contiguous. */
            ref_lot_forward(Lq, Lk, d, dv, r, Q + p * Nq * d, K + p * Nk * d, V + p * Nk * dv,
                            Z + (size_t)h * r * d, theta + (size_t)h * r, temp, T, eps, s, Ablk,
                            Op);
            if (Ap != NULL)
                for (int i = 0; i < Lq; i++)
                    for (int j = 0; j < Lk; j++)
                        Ap[(size_t)i * Nk + j] = Ablk[(size_t)i * Lk + j];
        }
    }
    free(Ablk);
}

void ref_lot_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, int r, const int *ql,
                              const int *kl, const double *Q, const double *K, const double *V,
                              const double *Z, const double *theta, double temp, int T,
                              double eps, double s, const double *dO, double *dQ, double *dK,
                              double *dV, double *dZ, double *dtheta)
{
    lot_check_batched(B, H, Nq, Nk, d, dv, r, temp, T, eps);
    lot_zero(dZ, (size_t)H * r * d);
    lot_zero(dtheta, (size_t)H * r);
    double *dZp = lot_alloc((size_t)r * d);
    double *dthp = lot_alloc((size_t)r);
    for (int b = 0; b < B; b++) {
        int Lq, Lk;
        lot_lengths(b, Nq, Nk, ql, kl, &Lq, &Lk);
        for (int h = 0; h < H; h++) {
            const size_t p = (size_t)b * H + h;
            double *dQp = dQ + p * Nq * d;
            double *dKp = dK + p * Nk * d;
            double *dVp = dV + p * Nk * dv;
            lot_zero(dQp, (size_t)Nq * d);
            lot_zero(dKp, (size_t)Nk * d);
            lot_zero(dVp, (size_t)Nk * dv);
            if (Lq == 0 || Lk == 0)
                continue;
            ref_lot_backward(Lq, Lk, d, dv, r, Q + p * Nq * d, K + p * Nk * d, V + p * Nk * dv,
                             Z + (size_t)h * r * d, theta + (size_t)h * r, temp, T, eps, s,
                             dO + p * Nq * dv, dQp, dKp, dVp, dZp, dthp);
            for (size_t idx = 0; idx < (size_t)r * d; idx++)
                dZ[(size_t)h * r * d + idx] += dZp[idx];
            for (int t = 0; t < r; t++)
                dtheta[(size_t)h * r + t] += dthp[t];
        }
    }
    free(dZp);
    free(dthp);
}
