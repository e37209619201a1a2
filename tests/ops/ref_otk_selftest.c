/*
 * ref_otk_selftest.c -- checks the naive OTK reference (ref_otk.c):
 *   1. Analytic dx, dz, dW equal central finite differences of
 *      L = sum(dout .* out) (h = 1e-6): identity and Nystrom maps, both
 *      conventions, no PE / 1-D PE (with and without pe_double) / 2-D PE,
 *      L in {1, 3, 20}, a clamped-norm element (|x| < 0.01), isqrt_grad
 *      EXACT (eta = 0.01 and 0) and REFERENCE (eta = 0, where it is exact).
 *   2. isqrt_grad REFERENCE at eta > 0: dx, dz still exact, dW differs from
 *      EXACT (and from FD); at eta = 0 both modes agree.
 *   3. Plan: columns sum to 1/p exactly for every L, rows -> 1/n as L grows;
 *      L = 1 equals an independently coded softmax-then-column-normalise.
 *   4. Permutation invariance over set elements (no PE); 1-D PE breaks it.
 *   5. eps -> infinity: every bucket is c/(n p) sum_i psi_i (mean pooling).
 *   6. REFERENCE output = sqrt(p q) x PAPER output (no PE, 2-D PE); the
 *      PE weights S (plan at eps -> infinity) against formulas coded from
 *      grid coordinates.
 *   7. Nystrom: eta = 0 and x on (scaled) anchors reproduce the kernel
 *      r r' exp(alpha(<xh, xh'> - 1)); |psi(x)| <= |x| for eta >= 0 (unit
 *      anchors); M G M = I at eta = 0 (and the Jacobi solver with it).
 *   8. Batched + padded (NaN padding) equals the per-set calls; padded rows
 *      of plan and dx are zero; dz, dW summed; len = NULL with 2-D PE.
 * One line per check, then "N passed, N failed"; exit 1 on any failure.
 */
#include "ref_otk.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_selftest_util.h"

static double maxd(double a, double b)
{
    return (a > b || isnan(a)) ? a : b;
}

/* One problem: configuration and owned inputs. */
typedef struct {
    ref_otk_cfg c;
    double *x, *z, *W, *dout;
} prob;

/* Unit rows (k*d). */
static void unit_rows(lcg *g, double *W, int k, int d)
{
    for (int l = 0; l < k; l++) {
        double nr = 0.0;
        for (int m = 0; m < d; m++) {
            W[l * d + m] = lcg_uniform(g, -1.0, 1.0);
            nr += W[l * d + m] * W[l * d + m];
        }
        for (int m = 0; m < d; m++)
            W[l * d + m] /= sqrt(nr);
    }
}

/* x rows with |x_i| >= 0.3, except row `clamp` (if >= 0): |x| < 0.01. */
static void fill_x(lcg *g, double *x, int n, int d, int clamp)
{
    for (int i = 0; i < n; i++) {
        double nr;
        do {
            nr = 0.0;
            for (int m = 0; m < d; m++) {
                x[i * d + m] = i == clamp ? lcg_uniform(g, -0.004, 0.004) : lcg_uniform(g, -1, 1);
                nr += x[i * d + m] * x[i * d + m];
            }
        } while (i != clamp && nr < 0.09);
    }
}

static void prob_init(prob *P, lcg *g, const ref_otk_cfg *c, int nystrom, int clamp)
{
    P->c = *c;
    P->x = dalloc((size_t)c->n * c->d);
    P->z = dalloc((size_t)c->q * c->p * c->k);
    P->W = dalloc((size_t)c->k * c->d);
    P->dout = dalloc((size_t)c->p * c->q * c->k);
    fill_x(g, P->x, c->n, c->d, clamp);
    fill(g, P->z, (size_t)c->q * c->p * c->k, -1.0, 1.0);
    fill(g, P->dout, (size_t)c->p * c->q * c->k, -1.0, 1.0);
    unit_rows(g, P->W, c->k, c->d);
    P->c.W = nystrom ? P->W : NULL;
}

static void prob_free(prob *P)
{
    free(P->x); free(P->z); free(P->W); free(P->dout);
}

static double prob_loss(const prob *P)
{
    const size_t no = (size_t)P->c.p * P->c.q * P->c.k;
    double *out = dalloc(no);
    ref_otk_forward(&P->c, P->x, P->z, out, NULL);
    double L = 0.0;
    for (size_t i = 0; i < no; i++)
        L += P->dout[i] * out[i];
    free(out);
    return L;
}

static void fd_grad(prob *P, double *v, size_t count, double *g)
{
    const double h = 1e-6;
    for (size_t i = 0; i < count; i++) {
        const double v0 = v[i];
        v[i] = v0 + h;
        double lp = prob_loss(P);
        v[i] = v0 - h;
        double lm = prob_loss(P);
        v[i] = v0;
        g[i] = (lp - lm) / (2.0 * h);
    }
}

/* Relative FD errors of dx, dz, dW (e[0..2]; e[2] = 0 without anchors),
 * scaled by the largest FD entry over the three. */
static double fd_errors(prob *P, double e[3])
{
    const ref_otk_cfg *c = &P->c;
    const size_t cnt[3] = {(size_t)c->n * c->d, (size_t)c->q * c->p * c->k, (size_t)c->k * c->d};
    double *vs[3] = {P->x, P->z, P->W};
    double *an[3], *fd[3];
    for (int t = 0; t < 3; t++) {
        an[t] = dalloc(cnt[t]);
        fd[t] = dalloc(cnt[t]);
        memset(an[t], 0, cnt[t] * sizeof(double));
        memset(fd[t], 0, cnt[t] * sizeof(double));
    }
    ref_otk_backward(c, P->x, P->z, P->dout, an[0], an[1], an[2]);
    const int nt = c->W != NULL ? 3 : 2;
    double scale = 0.0, emax = 0.0;
    for (int t = 0; t < nt; t++) {
        fd_grad(P, vs[t], cnt[t], fd[t]);
        scale = maxd(scale, max_abs(fd[t], cnt[t]));
    }
    for (int t = 0; t < 3; t++) {
        e[t] = t < nt ? max_abs_diff(an[t], fd[t], cnt[t]) / scale : 0.0;
        emax = maxd(emax, e[t]);
        free(an[t]); free(fd[t]);
    }
    return scale > 0.0 ? emax : NAN;
}

static ref_otk_cfg base_cfg(int n, int d, int q, int p, int k, int L)
{
    ref_otk_cfg c;
    memset(&c, 0, sizeof c);
    c.n = n;
    c.d = d;
    c.q = q;
    c.p = p;
    c.k = k;
    c.sigma = 0.6;
    c.eta = 0.01;
    c.eps = 0.5;
    c.L = L;
    c.sigma_pos = 0.5;
    c.n_pad = n;
    return c;
}

/* ------------------------------------------------------------------------ */
/* 1, 2. Finite differences                                                 */
/* ------------------------------------------------------------------------ */

/* n d q p k L nystrom conv pe pe_double gh gw n_pad isqrt clamp eta */
typedef struct {
    int n, d, q, p, k, L, nystrom, conv, pe, pe_double, gh, gw, n_pad, isqrt, clamp;
    double eta;
} fd_case;

static const fd_case fd_cases[] = {
    {5, 3, 2, 4, 3, 1, 0, 0, 0, 0, 0, 0, 5, 0, -1, 0.0},
    {6, 3, 2, 3, 3, 3, 0, 1, 1, 0, 0, 0, 8, 0, -1, 0.0},
    {5, 2, 1, 4, 2, 20, 0, 0, 1, 1, 0, 0, 5, 0, -1, 0.0},
    {6, 3, 2, 4, 3, 3, 0, 1, 2, 1, 2, 3, 6, 0, -1, 0.0},
    {5, 3, 2, 3, 4, 3, 1, 0, 0, 0, 0, 0, 5, 0, 2, 0.01},
    {6, 3, 2, 3, 5, 20, 1, 1, 1, 1, 0, 0, 9, 0, 0, 0.01},
    {4, 3, 1, 5, 4, 1, 1, 0, 1, 0, 0, 0, 4, 0, -1, 0.01},
    {6, 3, 2, 4, 4, 3, 1, 0, 2, 0, 3, 2, 6, 0, 4, 0.01},
    {4, 3, 1, 9, 3, 1, 1, 1, 2, 1, 2, 2, 4, 0, -1, 0.01},
    {5, 3, 2, 3, 4, 3, 1, 0, 0, 0, 0, 0, 5, 0, -1, 0.0},
    {5, 3, 2, 3, 4, 3, 1, 0, 1, 0, 0, 0, 5, 1, 1, 0.0},
    {6, 4, 2, 4, 6, 20, 1, 1, 0, 0, 0, 0, 6, 1, -1, 0.0},
};

static void check_fd(lcg *g, double *worst)
{
    static const char *pes[] = {"noPE", "1D-PE", "2D-PE"};
    for (size_t ci = 0; ci < sizeof fd_cases / sizeof fd_cases[0]; ci++) {
        const fd_case *f = &fd_cases[ci];
        ref_otk_cfg c = base_cfg(f->n, f->d, f->q, f->p, f->k, f->L);
        c.convention = f->conv;
        c.pe = f->pe;
        c.pe_double = f->pe_double;
        c.gh = f->gh;
        c.gw = f->gw;
        c.n_pad = f->n_pad;
        c.isqrt_grad = f->isqrt;
        c.eta = f->eta;
        prob P;
        prob_init(&P, g, &c, f->nystrom, f->clamp);
        double e[3];
        double emax = fd_errors(&P, e);
        *worst = maxd(*worst, emax);
        char name[160], det[160];
        snprintf(name, sizeof name, "fd %s%s %s %s%s n=%d p=%d q=%d L=%d%s",
                 f->nystrom ? "Nystrom " : "identity",
                 f->nystrom ? (f->isqrt ? "isqrtREF" : "EXACT") : "", f->conv ? "REF" : "PAPER",
                 pes[f->pe], f->pe_double ? " double" : "", f->n, f->p, f->q, f->L,
                 f->clamp >= 0 ? " clamped" : "");
        if (f->nystrom)
            snprintf(name + strlen(name), sizeof name - strlen(name), " eta=%g", f->eta);
        if (f->conv == 1 && f->pe == 1)
            snprintf(name + strlen(name), sizeof name - strlen(name), " n_pad=%d", f->n_pad);
        snprintf(det, sizeof det, "rel err x %.1e z %.1e W %.1e", e[0], e[1], e[2]);
        th_report(emax < 1e-7, name, det);
        prob_free(&P);
    }
}

static void check_isqrt_modes(lcg *g)
{
    ref_otk_cfg c = base_cfg(5, 3, 2, 3, 4, 3);
    c.pe = 1;
    prob P;
    prob_init(&P, g, &c, 1, 3);
    const size_t nx = 15, nz = 24, nw = 12;
    double *dx[2], *dz[2], *dW[2];
    double diff[2];
    for (int eta_i = 0; eta_i < 2; eta_i++) {
        P.c.eta = eta_i == 0 ? 0.05 : 0.0;
        for (int m = 0; m < 2; m++) {
            dx[m] = dalloc(nx);
            dz[m] = dalloc(nz);
            dW[m] = dalloc(nw);
            P.c.isqrt_grad = m;
            ref_otk_backward(&P.c, P.x, P.z, P.dout, dx[m], dz[m], dW[m]);
        }
        diff[eta_i] = max_abs_diff(dW[0], dW[1], nw) / max_abs(dW[0], nw);
        if (eta_i == 0) {
            /* REFERENCE mode at eta > 0: dx, dz exact, dW not. */
            double e[3];
            P.c.isqrt_grad = 1;
            fd_errors(&P, e);
            char det[200];
            snprintf(det, sizeof det,
                     "eta=0.05: FD rel err x %.1e z %.1e W %.1e; |dW_ref - dW_exact| / |dW| = %.1e",
                     e[0], e[1], e[2], diff[0]);
            th_report(e[0] < 1e-7 && e[1] < 1e-7 && e[2] > 1e-4 && diff[0] > 1e-3,
                   "isqrtREF eta>0: dx, dz exact, dW differs", det);
            double ex = max_abs_diff(dx[0], dx[1], nx), ez = max_abs_diff(dz[0], dz[1], nz);
            snprintf(det, sizeof det, "max |dx_ref - dx_exact| %.1e, |dz_ref - dz_exact| %.1e",
                     ex, ez);
            th_report(ex == 0.0 && ez == 0.0, "isqrt mode only affects dW", det);
        }
        for (int m = 0; m < 2; m++) {
            free(dx[m]); free(dz[m]); free(dW[m]);
        }
    }
    char det[120];
    snprintf(det, sizeof det, "eta=0: |dW_ref - dW_exact| / |dW| = %.1e", diff[1]);
    th_report(diff[1] < 1e-10, "isqrt modes agree at eta=0", det);
    prob_free(&P);
}

/* ------------------------------------------------------------------------ */
/* 3. Plan margins; L = 1 closed form                                       */
/* ------------------------------------------------------------------------ */

/* Plan of head 0 divided by c (no PE): P (n x p). */
static void plan_of(const prob *P, double *Pl)
{
    const ref_otk_cfg *c = &P->c;
    double *out = dalloc((size_t)c->p * c->q * c->k);
    double *pl = dalloc((size_t)c->q * c->n * c->p);
    ref_otk_forward(c, P->x, P->z, out, pl);
    const double cc = c->convention == 0 ? sqrt((double)c->p / c->q) : (double)c->p;
    for (int a = 0; a < c->n * c->p; a++)
        Pl[a] = pl[a] / cc;
    free(out); free(pl);
}

static void check_margins(lcg *g)
{
    static const int Ls[] = {1, 2, 4, 8, 400};
    ref_otk_cfg c = base_cfg(7, 3, 2, 4, 5, 1);
    c.eps = 0.3;
    prob P;
    prob_init(&P, g, &c, 1, -1);
    const int n = 7, p = 4;
    double *Pl = dalloc((size_t)n * p);
    double colmax = 0.0, rowerr[5];
    for (int li = 0; li < 5; li++) {
        P.c.L = Ls[li];
        P.c.convention = li % 2;
        plan_of(&P, Pl);
        rowerr[li] = 0.0;
        for (int j = 0; j < p; j++) {
            double s = 0.0;
            for (int i = 0; i < n; i++)
                s += Pl[i * p + j];
            colmax = maxd(colmax, fabs(p * s - 1.0));
        }
        for (int i = 0; i < n; i++) {
            double s = 0.0;
            for (int j = 0; j < p; j++)
                s += Pl[i * p + j];
            rowerr[li] = maxd(rowerr[li], fabs(n * s - 1.0));
        }
    }
    char det[200];
    snprintf(det, sizeof det, "max |p colsum - 1| over L in {1,2,4,8,400} = %.1e", colmax);
    th_report(colmax < 1e-14, "columns of P sum to 1/p exactly", det);
    snprintf(det, sizeof det, "max |n rowsum - 1|: L=1 %.1e, 2 %.1e, 4 %.1e, 8 %.1e, 400 %.1e",
             rowerr[0], rowerr[1], rowerr[2], rowerr[3], rowerr[4]);
    int mono = rowerr[0] > rowerr[1] && rowerr[1] > rowerr[2] && rowerr[2] > rowerr[3] &&
               rowerr[3] >= rowerr[4];
    th_report(mono && rowerr[0] > 1e-3 && rowerr[4] < 1e-12, "rows of P -> 1/n as L grows", det);

    /* L = 1: P_ij = (1/p) R_ij / sum_i' R_i'j, R = row softmax of K/eps. */
    P.c.L = 1;
    P.c.convention = 0;
    plan_of(&P, Pl);
    double *psi = dalloc((size_t)n * 5), *R = dalloc((size_t)n * p);
    ref_otk_features(&P.c, P.x, psi);
    for (int i = 0; i < n; i++) {
        double s = 0.0;
        for (int j = 0; j < p; j++) {
            double K = 0.0;
            for (int a = 0; a < 5; a++)
                K += psi[i * 5 + a] * P.z[j * 5 + a];
            R[i * p + j] = exp(K / P.c.eps);
            s += R[i * p + j];
        }
        for (int j = 0; j < p; j++)
            R[i * p + j] /= s;
    }
    double e = 0.0;
    for (int j = 0; j < p; j++) {
        double s = 0.0;
        for (int i = 0; i < n; i++)
            s += R[i * p + j];
        for (int i = 0; i < n; i++)
            e = maxd(e, fabs(R[i * p + j] / (p * s) - Pl[i * p + j]) * n * p);
    }
    snprintf(det, sizeof det, "max |P - softmax/colnorm| * n p = %.1e", e);
    th_report(e < 1e-13, "L=1 equals row softmax then column normalise", det);
    free(psi); free(R); free(Pl);
    prob_free(&P);
}

/* ------------------------------------------------------------------------ */
/* 4-6. Permutation invariance, eps -> infinity, convention scale           */
/* ------------------------------------------------------------------------ */

static void check_invariances(lcg *g)
{
    ref_otk_cfg c = base_cfg(6, 3, 2, 4, 5, 3);
    prob P;
    prob_init(&P, g, &c, 1, 1);
    const int n = 6, d = 3, q = 2, p = 4, k = 5;
    const int perm[6] = {3, 0, 5, 1, 4, 2};
    const size_t no = (size_t)p * q * k, npl = (size_t)q * n * p;
    double *o1 = dalloc(no), *o2 = dalloc(no), *pl1 = dalloc(npl), *pl2 = dalloc(npl);
    double *xp = dalloc((size_t)n * d);
    for (int i = 0; i < n; i++)
        memcpy(xp + i * d, P.x + perm[i] * d, (size_t)d * sizeof(double));
    double e = 0.0, ep = 0.0;
    for (int pe = 0; pe < 2; pe++) {
        P.c.pe = pe;
        ref_otk_forward(&P.c, P.x, P.z, o1, pl1);
        ref_otk_forward(&P.c, xp, P.z, o2, pl2);
        if (pe == 1) {
            ep = max_abs_diff(o1, o2, no) / max_abs(o1, no);
            break;
        }
        e = max_abs_diff(o1, o2, no) / max_abs(o1, no);
        for (int h = 0; h < q; h++)
            for (int i = 0; i < n; i++)
                for (int j = 0; j < p; j++)
                    e = maxd(e, fabs(pl2[(h * n + i) * p + j] - pl1[(h * n + perm[i]) * p + j]));
    }
    char det[160];
    snprintf(det, sizeof det, "no PE: rel out diff / plan diff %.1e; 1-D PE: rel out diff %.1e",
             e, ep);
    th_report(e < 1e-13 && ep > 1e-3, "permutation invariance (broken by PE)", det);

    /* eps -> infinity: out[j][h] = c/(n p) sum_i psi_i. */
    P.c.pe = 0;
    P.c.eps = 1e9;
    double *psi = dalloc((size_t)n * k);
    ref_otk_features(&P.c, P.x, psi);
    ref_otk_forward(&P.c, P.x, P.z, o1, NULL);
    const double cc = sqrt((double)p / q);
    double em = 0.0;
    for (int j = 0; j < p; j++)
        for (int h = 0; h < q; h++)
            for (int a = 0; a < k; a++) {
                double s = 0.0;
                for (int i = 0; i < n; i++)
                    s += psi[i * k + a];
                em = maxd(em, fabs(o1[(j * q + h) * k + a] - cc * s / (n * p)));
            }
    em /= max_abs(o1, no);
    snprintf(det, sizeof det, "eps=1e9: max rel |out - c/(np) sum psi| = %.1e", em);
    th_report(em < 1e-7, "eps -> infinity gives mean pooling", det);

    /* REFERENCE = sqrt(p q) PAPER for no PE and 2-D PE (same S). */
    P.c.eps = 0.5;
    double es = 0.0;
    for (int pe2 = 0; pe2 < 2; pe2++) {
        P.c.pe = pe2 ? 2 : 0;
        P.c.gh = 2;
        P.c.gw = 3;
        P.c.convention = 0;
        ref_otk_forward(&P.c, P.x, P.z, o1, NULL);
        P.c.convention = 1;
        ref_otk_forward(&P.c, P.x, P.z, o2, NULL);
        for (size_t a = 0; a < no; a++)
            es = maxd(es, fabs(o2[a] - sqrt((double)p * q) * o1[a]));
        es /= max_abs(o2, no);
    }
    snprintf(det, sizeof det, "max rel |out_ref - sqrt(pq) out_paper| = %.1e", es);
    th_report(es < 1e-14, "REFERENCE = sqrt(p q) x PAPER (no PE, 2-D PE)", det);
    free(o1); free(o2); free(pl1); free(pl2); free(xp); free(psi);
    prob_free(&P);
}

/* eps -> infinity: P -> 1/(n p), so the plan output n p / c is S itself;
 * S coded here from grid coordinates. */
static void check_pe_weights(lcg *g)
{
    const int n = 6, p = 4, q = 2, s = 2, gh = 3, gw = 2, npad = 9;
    const double sp = 0.7;
    ref_otk_cfg c = base_cfg(n, 3, q, p, 3, 2);
    prob P;
    prob_init(&P, g, &c, 0, -1);
    P.c.eps = 1e9;
    P.c.sigma_pos = sp;
    double *out = dalloc((size_t)p * q * 3), *pl = dalloc((size_t)q * n * p);
    double *S = dalloc((size_t)n * p);
    double e = 0.0;
    for (int mode = 0; mode < 6; mode++) { /* {1-D, 2-D} x {PAPER, REF} x pe_double */
        P.c.pe = mode < 4 ? 1 : 2;
        P.c.convention = mode % 2;
        P.c.pe_double = (mode / 2) % 2;
        P.c.gh = gh;
        P.c.gw = gw;
        P.c.n_pad = npad;
        if (P.c.pe == 1) {
            for (int i = 0; i < n; i++)
                for (int j = 0; j < p; j++) {
                    double pos = P.c.convention == 0 ? (i + 1.0) / n - (j + 1.0) / p
                                                     : (double)i / npad - (double)j / p;
                    S[i * p + j] = exp(-pos * pos / (sp * sp));
                }
        } else {
            for (int r = 1; r <= gh; r++)
                for (int cl = 1; cl <= gw; cl++)
                    for (int a = 1; a <= s; a++)
                        for (int b = 1; b <= s; b++) {
                            double dr = (double)r / gh - (double)a / s;
                            double dc = (double)cl / gw - (double)b / s;
                            S[((r - 1) * gw + cl - 1) * p + (a - 1) * s + b - 1] =
                                exp(-(dr * dr + dc * dc) / (sp * sp));
                        }
        }
        ref_otk_forward(&P.c, P.x, P.z, out, pl);
        const double cc = P.c.convention == 0 ? sqrt((double)p / q) : (double)p;
        for (int h = 0; h < q; h++)
            for (int a = 0; a < n * p; a++)
                e = maxd(e, fabs(pl[h * n * p + a] * n * p / cc - S[a]));
    }
    char det[120];
    snprintf(det, sizeof det, "eps=1e9: max |plan n p / c - S| = %.1e", e);
    th_report(e < 1e-7, "PE weights S (1-D PAPER/REF, 2-D; single and double)", det);
    free(out); free(pl); free(S);
    prob_free(&P);
}

/* ------------------------------------------------------------------------ */
/* 7. Nystrom properties                                                    */
/* ------------------------------------------------------------------------ */

static void check_nystrom(lcg *g)
{
    static const int ks[] = {3, 4, 6};
    const int d = 3;
    double ek = 0.0, ratio = 0.0, emgm = 0.0;
    for (int ki = 0; ki < 3; ki++) {
        const int k = ks[ki];
        ref_otk_cfg c = base_cfg(k, d, 1, 1, k, 1);
        double *W = dalloc((size_t)k * d), *x = dalloc((size_t)k * d);
        double *psi = dalloc((size_t)k * k), *G = dalloc((size_t)k * k), *M = dalloc((size_t)k * k);
        unit_rows(g, W, k, d);
        c.W = W;
        c.eta = 0.0;
        /* x_a = s_a w_a: kernel = s_a s_b exp(alpha(<w_a, w_b> - 1)). */
        double sc[6];
        for (int a = 0; a < k; a++) {
            sc[a] = lcg_uniform(g, 0.5, 2.0);
            for (int m = 0; m < d; m++)
                x[a * d + m] = sc[a] * W[a * d + m];
        }
        ref_otk_features(&c, x, psi);
        const double alpha = 1.0 / (c.sigma * c.sigma);
        for (int a = 0; a < k; a++)
            for (int b = 0; b < k; b++) {
                double ip = 0.0, ww = 0.0;
                for (int m = 0; m < k; m++)
                    ip += psi[a * k + m] * psi[b * k + m];
                for (int m = 0; m < d; m++)
                    ww += W[a * d + m] * W[b * d + m];
                ek = maxd(ek, fabs(ip - sc[a] * sc[b] * exp(alpha * (ww - 1.0))));
            }
        /* M G M = I at eta = 0. */
        ref_otk_isqrt(&c, G, M);
        for (int a = 0; a < k; a++)
            for (int b = 0; b < k; b++) {
                double acc = 0.0;
                for (int l = 0; l < k; l++)
                    for (int m = 0; m < k; m++)
                        acc += M[a * k + l] * G[l * k + m] * M[m * k + b];
                emgm = maxd(emgm, fabs(acc - (a == b ? 1.0 : 0.0)));
            }
        /* |psi(x)| <= |x| for eta in {0, 0.01, 0.1}, random x. */
        static const double etas[] = {0.0, 0.01, 0.1};
        double *xr = dalloc(40 * (size_t)d), *pr = dalloc(40 * (size_t)k);
        for (int ei = 0; ei < 3; ei++) {
            c.eta = etas[ei];
            c.n = 40;
            fill_x(g, xr, 40, d, -1);
            for (int i = 0; i < 8; i++) /* some points close to anchors */
                for (int m = 0; m < d; m++)
                    xr[i * d + m] =
                        (1.0 + 0.2 * i) * W[(i % k) * d + m] + lcg_uniform(g, -0.05, 0.05);
            ref_otk_features(&c, xr, pr);
            for (int i = 0; i < 40; i++) {
                double nx = 0.0, np2 = 0.0;
                for (int m = 0; m < d; m++)
                    nx += xr[i * d + m] * xr[i * d + m];
                for (int m = 0; m < k; m++)
                    np2 += pr[i * k + m] * pr[i * k + m];
                ratio = maxd(ratio, sqrt(np2 / nx));
            }
        }
        free(xr); free(pr); free(W); free(x); free(psi); free(G); free(M);
    }
    char det[120];
    snprintf(det, sizeof det, "k in {3,4,6}, scaled anchors: max |<psi,psi'> - kernel| = %.1e", ek);
    th_report(ek < 1e-11, "eta=0 Nystrom reproduces the kernel on anchors", det);
    snprintf(det, sizeof det, "max |psi(x)| / |x| = %.15f", ratio);
    th_report(ratio <= 1.0 + 1e-12 && ratio > 0.9, "|psi(x)| <= |x| (unit anchors, eta >= 0)",
           det);
    snprintf(det, sizeof det, "max |M G M - I| = %.1e", emgm);
    th_report(emgm < 1e-11, "isqrt: M G M = I at eta=0", det);
}

/* ------------------------------------------------------------------------ */
/* 8. Batched + padded                                                      */
/* ------------------------------------------------------------------------ */

static void check_batched(lcg *g)
{
    const int B = 3, N = 6, d = 3, q = 2, p = 4, k = 4;
    const int len[3] = {6, 4, 1};
    double *x = dalloc((size_t)B * N * d), *z = dalloc((size_t)q * p * k);
    double *W = dalloc((size_t)k * d), *dout = dalloc((size_t)B * p * q * k);
    fill(g, z, (size_t)q * p * k, -1, 1);
    fill(g, dout, (size_t)B * p * q * k, -1, 1);
    unit_rows(g, W, k, d);
    for (int b = 0; b < B; b++) {
        fill_x(g, x + (size_t)b * N * d, N, d, b == 0 ? 2 : -1);
        for (int i = len[b]; i < N; i++)
            for (int m = 0; m < d; m++)
                x[((size_t)b * N + i) * d + m] = NAN;
    }
    const size_t no = (size_t)B * p * q * k, npl = (size_t)B * q * N * p, nx = (size_t)B * N * d;
    const size_t nz = (size_t)q * p * k, nw = (size_t)k * d;
    double *out = dalloc(no), *pl = dalloc(npl), *dx = dalloc(nx), *dz = dalloc(nz);
    double *dW = dalloc(nw);
    double *eo = dalloc(no), *epl = dalloc(npl), *edx = dalloc(nx), *edz = dalloc(nz);
    double *edW = dalloc(nw), *tdz = dalloc(nz), *tdW = dalloc(nw);
    double *tx = dalloc((size_t)N * d), *tpl = dalloc((size_t)q * N * p);
    /* (nystrom, convention, pe, pe_double, lengths) */
    static const int cases[5][5] = {
        {1, 0, 1, 1, 1}, {1, 1, 1, 0, 1}, {0, 0, 0, 0, 1}, {1, 1, 2, 1, 0}, {0, 1, 0, 0, 0}};
    for (int ci = 0; ci < 5; ci++) {
        ref_otk_cfg c = base_cfg(N, d, q, p, k, 3);
        c.W = cases[ci][0] ? W : NULL;
        c.k = cases[ci][0] ? k : d;
        c.convention = cases[ci][1];
        c.pe = cases[ci][2];
        c.pe_double = cases[ci][3];
        c.gh = 2;
        c.gw = 3;
        c.n_pad = 1000; /* must be ignored: N is used */
        const int *ln = cases[ci][4] ? len : NULL;
        const size_t nzc = (size_t)q * p * c.k, noc = (size_t)B * p * q * c.k;
        double *xx = x;
        if (ln == NULL) { /* full lengths: fresh fully valid data */
            xx = dalloc(nx);
            fill_x(g, xx, B * N, d, -1);
        }
        ref_otk_forward_batched(&c, B, ln, xx, z, out, pl);
        ref_otk_backward_batched(&c, B, ln, xx, z, dout, dx, dz, dW);
        memset(epl, 0, npl * sizeof(double));
        memset(edx, 0, nx * sizeof(double));
        memset(edz, 0, nz * sizeof(double));
        memset(edW, 0, nw * sizeof(double));
        for (int b = 0; b < B; b++) {
            ref_otk_cfg s = c;
            s.n = ln != NULL ? ln[b] : N;
            s.n_pad = N;
            memcpy(tx, xx + (size_t)b * N * d, (size_t)s.n * d * sizeof(double));
            ref_otk_forward(&s, tx, z, eo + (size_t)b * p * q * c.k, tpl);
            for (int h = 0; h < q; h++)
                for (int i = 0; i < s.n; i++)
                    for (int j = 0; j < p; j++)
                        epl[(((size_t)b * q + h) * N + i) * p + j] =
                            tpl[((size_t)h * s.n + i) * p + j];
            ref_otk_backward(&s, tx, z, dout + (size_t)b * p * q * c.k, edx + (size_t)b * N * d,
                             tdz, tdW);
            for (size_t a = 0; a < nzc; a++)
                edz[a] += tdz[a];
            for (size_t a = 0; a < nw; a++)
                edW[a] += c.W != NULL ? tdW[a] : 0.0;
        }
        double e = max_abs_diff(out, eo, noc);
        e = maxd(e, max_abs_diff(pl, epl, npl));
        e = maxd(e, max_abs_diff(dx, edx, nx));
        e = maxd(e, max_abs_diff(dz, edz, nzc));
        if (c.W != NULL)
            e = maxd(e, max_abs_diff(dW, edW, nw));
        char name[96], det[120];
        snprintf(name, sizeof name, "batched == per-set (%s, %s, pe=%d%s, %s)",
                 c.W ? "Nystrom" : "identity", c.convention ? "REF" : "PAPER", c.pe,
                 c.pe_double ? " double" : "", ln ? "len {6,4,1}, NaN pad" : "len NULL");
        snprintf(det, sizeof det, "max diff (out, plan, dx, dz, dW) %.1e", e);
        th_report(e == 0.0, name, det);
        if (xx != x)
            free(xx);
    }
    free(x); free(z); free(W); free(dout); free(out); free(pl); free(dx); free(dz); free(dW);
    free(eo); free(epl); free(edx); free(edz); free(edW); free(tdz); free(tdW); free(tx); free(tpl);
}

int main(void)
{
    TH.verbose = 1; /* one line per check, as before */
    lcg g = {0x07c0ffee5eed0001ULL};
    double worst = 0.0;
    check_fd(&g, &worst);
    char det[80];
    snprintf(det, sizeof det, "worst relative error over all configs %.2e", worst);
    th_report(worst < 1e-7, "fd grads summary", det);
    check_isqrt_modes(&g);
    check_margins(&g);
    check_invariances(&g);
    check_pe_weights(&g);
    check_nystrom(&g);
    check_batched(&g);
    return th_summary();
}
