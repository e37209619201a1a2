/*
 * ref_unbalanced.c -- naive double-precision reference for unbalanced
 * Sinkhorn attention (see ref_unbalanced.h): scaling form, every u and v
 * stored, reverse mode by hand. Clarity over speed.
 */
#include "ref_unbalanced.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *msg)
{
    fprintf(stderr, "ref_unbalanced: %s\n", msg);
    abort();
}

static double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    if (!p) die("out of memory");
    return p;
}

/* K = exp(alpha Q K^T), n x m */
static double *kernel(int n, int m, int d, const double *Q, const double *Kx, double alpha)
{
    double *E = dalloc((size_t)n * m);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int k = 0; k < d; k++) s += Q[(size_t)i * d + k] * Kx[(size_t)j * d + k];
            E[(size_t)i * m + j] = exp(alpha * s);
            if (!isfinite(E[(size_t)i * m + j]) || E[(size_t)i * m + j] == 0.0) die("exp(C) out of range");
        }
    return E;
}

/* u[t] (n) for odd t and v[t] (m) for even t, t = 0..S; v[0] = 1. Returns
 * one block: slot t holds max(n, m) doubles. */
static double *iterate(int n, int m, const double *E, int S, double kappa)
{
    const int w = n > m ? n : m;
    double *h = dalloc((size_t)(S + 1) * w);
    for (int j = 0; j < m; j++) h[j] = 1.0;
    const double a = 1.0 / n, b = 1.0 / m;
    const double *u = NULL, *v = h; /* latest of each */
    for (int t = 1; t <= S; t++) {
        double *cur = h + (size_t)t * w;
        if (t % 2 == 1) {
            for (int i = 0; i < n; i++) {
                double s = 0.0;
                for (int j = 0; j < m; j++) s += E[(size_t)i * m + j] * v[j];
                cur[i] = a / s;
            }
            u = cur;
        } else {
            for (int j = 0; j < m; j++) {
                double r = 0.0;
                for (int i = 0; i < n; i++) r += E[(size_t)i * m + j] * u[i];
                cur[j] = pow(b / r, kappa);
            }
            v = cur;
        }
    }
    return h;
}

static const double *latest(const double *h, int w, int S, int odd)
{
    for (int t = S; t >= 0; t--)
        if ((t % 2 == 1) == odd || (!odd && t == 0)) return h + (size_t)t * w;
    return NULL;
}

void ref_unb_forward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V, double alpha,
                     int S, double kappa, double *A, double *O)
{
    if (n < 1 || m < 1 || d < 1 || dv < 1 || S < 1 || !(kappa > 0.0 && kappa <= 1.0)) die("bad sizes or kappa");
    double *E = kernel(n, m, d, Q, K, alpha);
    double *h = iterate(n, m, E, S, kappa);
    const int w = n > m ? n : m;
    const double *u = latest(h, w, S, 1), *v = latest(h, w, S, 0);
    for (int i = 0; i < n; i++) {
        for (int c = 0; c < dv; c++) O[(size_t)i * dv + c] = 0.0;
        for (int j = 0; j < m; j++) {
            const double aij = n * u[i] * E[(size_t)i * m + j] * v[j];
            if (A) A[(size_t)i * m + j] = aij;
            for (int c = 0; c < dv; c++) O[(size_t)i * dv + c] += aij * V[(size_t)j * dv + c];
        }
    }
    free(h);
    free(E);
}

void ref_unb_backward(int n, int m, int d, int dv, const double *Q, const double *K, const double *V, double alpha,
                      int S, double kappa, const double *dO, double *dQ, double *dK, double *dV)
{
    if (n < 1 || m < 1 || d < 1 || dv < 1 || S < 1 || !(kappa > 0.0 && kappa <= 1.0)) die("bad sizes or kappa");
    double *E = kernel(n, m, d, Q, K, alpha);
    double *h = iterate(n, m, E, S, kappa);
    const int w = n > m ? n : m;
    const int tu = S % 2 == 1 ? S : S - 1, tv = S % 2 == 0 ? S : S - 1; /* slots of the latest u, v */
    double *Ebar = dalloc((size_t)n * m), *ubar = dalloc((size_t)n), *vbar = dalloc((size_t)m);
    /* O = A V, A_ij = n u_i E_ij v_j */
    for (int j = 0; j < m; j++)
        for (int c = 0; c < dv; c++) dV[(size_t)j * dv + c] = 0.0;
    const double *u = h + (size_t)tu * w, *v = h + (size_t)tv * w;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double abar = 0.0;
            const double aij = n * u[i] * E[(size_t)i * m + j] * v[j];
            for (int c = 0; c < dv; c++) {
                abar += dO[(size_t)i * dv + c] * V[(size_t)j * dv + c];
                dV[(size_t)j * dv + c] += aij * dO[(size_t)i * dv + c];
            }
            ubar[i] += abar * n * E[(size_t)i * m + j] * v[j];
            vbar[j] += abar * n * u[i] * E[(size_t)i * m + j];
            Ebar[(size_t)i * m + j] += abar * n * u[i] * v[j];
        }
    /* reverse through the half-steps; ubar/vbar are the adjoints of the
     * latest u and v at each point */
    for (int t = S; t >= 1; t--) {
        const double *cur = h + (size_t)t * w;
        if (t % 2 == 1) { /* u = a / s, s = E v_prev */
            const double *vp = latest(h, w, t - 1, 0);
            double *sbar = dalloc((size_t)n);
            for (int i = 0; i < n; i++) sbar[i] = -ubar[i] * cur[i] / (1.0 / n / cur[i]);
            for (int i = 0; i < n; i++) ubar[i] = 0.0;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < m; j++) {
                    Ebar[(size_t)i * m + j] += sbar[i] * vp[j];
                    vbar[j] += sbar[i] * E[(size_t)i * m + j];
                }
            free(sbar);
        } else { /* v = (b / r)^kappa, r = E^T u_prev */
            const double *up = latest(h, w, t - 1, 1);
            double *rbar = dalloc((size_t)m);
            for (int j = 0; j < m; j++) {
                double r = 0.0;
                for (int i = 0; i < n; i++) r += E[(size_t)i * m + j] * up[i];
                rbar[j] = -vbar[j] * kappa * cur[j] / r;
            }
            for (int j = 0; j < m; j++) vbar[j] = 0.0;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < m; j++) {
                    Ebar[(size_t)i * m + j] += up[i] * rbar[j];
                    ubar[i] += E[(size_t)i * m + j] * rbar[j];
                }
            free(rbar);
        }
    }
    /* C = alpha Q K^T: Cbar = Ebar .* E */
    for (size_t x = 0; x < (size_t)n * d; x++) dQ[x] = 0.0;
    for (size_t x = 0; x < (size_t)m * d; x++) dK[x] = 0.0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            const double cb = alpha * Ebar[(size_t)i * m + j] * E[(size_t)i * m + j];
            for (int k = 0; k < d; k++) {
                dQ[(size_t)i * d + k] += cb * K[(size_t)j * d + k];
                dK[(size_t)j * d + k] += cb * Q[(size_t)i * d + k];
            }
        }
    free(Ebar);
    free(ubar);
    free(vbar);
    free(h);
    free(E);
}

static void lens(int b, int Nq, int Nk, const int *ql, const int *kl, int *Lq, int *Lk)
{
    *Lq = ql ? ql[b] : Nq;
    *Lk = kl ? kl[b] : Nk;
    if (*Lq < 0 || *Lq > Nq || *Lk < 0 || *Lk > Nk) die("length out of range");
}

void ref_unb_forward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                             const double *Q, const double *K, const double *V, double alpha, int S, double kappa,
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
            ref_unb_forward(Lq, Lk, d, dv, Q + p * Nq * d, K + p * Nk * d, V + p * Nk * dv, alpha, S, kappa, Ab, Op);
            if (Ap)
                for (int i = 0; i < Lq; i++) memcpy(Ap + (size_t)i * Nk, Ab + (size_t)i * Lk, sizeof(double) * Lk);
        }
    }
    free(Ab);
}

void ref_unb_backward_batched(int B, int H, int Nq, int Nk, int d, int dv, const int *ql, const int *kl,
                              const double *Q, const double *K, const double *V, double alpha, int S, double kappa,
                              const double *dO, double *dQ, double *dK, double *dV)
{
    for (int b = 0; b < B; b++) {
        int Lq, Lk;
        lens(b, Nq, Nk, ql, kl, &Lq, &Lk);
        for (int hh = 0; hh < H; hh++) {
            const size_t p = (size_t)b * H + hh;
            double *dQp = dQ + p * Nq * d, *dKp = dK + p * Nk * d, *dVp = dV + p * Nk * dv;
            memset(dQp, 0, sizeof(double) * (size_t)Nq * d);
            memset(dKp, 0, sizeof(double) * (size_t)Nk * d);
            memset(dVp, 0, sizeof(double) * (size_t)Nk * dv);
            if (Lq == 0 || Lk == 0) continue;
            ref_unb_backward(Lq, Lk, d, dv, Q + p * Nq * d, K + p * Nk * d, V + p * Nk * dv, alpha, S, kappa,
                             dO + p * Nq * dv, dQp, dKp, dVp);
        }
    }
}
