/*
 * ref_otk.c -- naive double-precision reference for the OTK embedding.
 * See ref_otk.h. Own Jacobi eigensolver, matrix-scaling Sinkhorn with every
 * u_t and v_t stored, reverse mode written out by hand. Clarity over speed.
 */
#include "ref_otk.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static void otk_die(const char *msg)
{
    fprintf(stderr, "ref_otk: %s\n", msg);
    abort();
}

/* Zeroed array of count doubles (count may be 0), aborting on failure. */
static double *otk_alloc(size_t count)
{
    if (count > SIZE_MAX / sizeof(double))
        otk_die("allocation size overflow");
    double *p = calloc(count > 0 ? count : 1, sizeof(double));
    if (p == NULL)
        otk_die("out of memory");
    return p;
}

static double otk_dot(const double *a, const double *b, size_t len)
{
    double acc = 0.0;
    for (size_t i = 0; i < len; i++)
        acc += a[i] * b[i];
    return acc;
}

/* s with s * s == p, or -1. */
static int otk_isqrt_int(int p)
{
    for (int s = 1; s <= p / s; s++)
        if (s * s == p)
            return s;
    return -1;
}

static int otk_finite_pos(double v)
{
    return v > 0.0 && isfinite(v);
}

static void otk_check(const ref_otk_cfg *c)
{
    if (c->n < 1 || c->d < 1 || c->q < 1 || c->p < 1 || c->k < 1)
        otk_die("sizes n, d, q, p, k must be >= 1");
    if (c->L < 1)
        otk_die("L must be >= 1");
    if (!otk_finite_pos(c->eps))
        otk_die("eps must be finite and > 0");
    if (c->W == NULL && c->k != c->d)
        otk_die("the identity map (W == NULL) needs k == d");
    if (c->W != NULL && !otk_finite_pos(c->sigma))
        otk_die("sigma must be finite and > 0");
    if (c->W != NULL && !(c->eta >= 0.0 && isfinite(c->eta)))
        otk_die("eta must be finite and >= 0");
    if (c->convention != 0 && c->convention != 1)
        otk_die("convention must be 0 (PAPER) or 1 (REFERENCE)");
    if (c->isqrt_grad != 0 && c->isqrt_grad != 1)
        otk_die("isqrt_grad must be 0 (EXACT) or 1 (REFERENCE)");
    if (c->pe < 0 || c->pe > 2)
        otk_die("pe must be 0, 1 or 2");
    if (c->pe != 0 && !otk_finite_pos(c->sigma_pos))
        otk_die("sigma_pos must be finite and > 0 with a positional encoding");
    if (c->pe == 1 && c->convention == 1 && c->n_pad < c->n)
        otk_die("n_pad must be >= n for the REFERENCE 1-D PE");
    if (c->pe == 2 && (c->gh < 1 || c->gw < 1 || c->gh > c->n / c->gw || c->gh * c->gw != c->n))
        otk_die("pe = 2 needs gh, gw >= 1 and gh * gw == n");
    if (c->pe == 2 && otk_isqrt_int(c->p) < 0)
        otk_die("pe = 2 needs p to be a perfect square");
}

/* The output scale c. */
static double otk_scale(const ref_otk_cfg *c)
{
    return c->convention == 0 ? sqrt((double)c->p / (double)c->q) : (double)c->p;
}

/* S (n*p): the positional weights (all ones for pe = 0). */
static void otk_pe(const ref_otk_cfg *c, double *S)
{
    const int n = c->n, p = c->p, s = c->pe == 2 ? otk_isqrt_int(p) : 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < p; j++) {
            double w = 1.0;
            if (c->pe == 1) {
                const double t = c->convention == 0
                                     ? ((double)(i + 1) / n - (double)(j + 1) / p) / c->sigma_pos
                                     : ((double)i / c->n_pad - (double)j / p) / c->sigma_pos;
                w = exp(-t * t);
            } else if (c->pe == 2) {
                const double tr =
                    ((double)(i / c->gw + 1) / c->gh - (double)(j / s + 1) / s) / c->sigma_pos;
                const double tc =
                    ((double)(i % c->gw + 1) / c->gw - (double)(j % s + 1) / s) / c->sigma_pos;
                w = exp(-tr * tr) * exp(-tc * tc);
            }
            S[(size_t)i * p + j] = w;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Anchors: Gram matrix, Jacobi eigendecomposition, inverse square root     */
/* ------------------------------------------------------------------------ */

/* Cyclic Jacobi: A (k*k symmetric, destroyed) = V diag(e) V^T, V
 * orthogonal with the eigenvectors in its columns. */
static void otk_jacobi(size_t k, double *A, double *V, double *e)
{
    for (size_t a = 0; a < k * k; a++)
        V[a] = a % (k + 1) == 0 ? 1.0 : 0.0;
    for (int sweep = 0;; sweep++) {
        double off = 0.0, tot = 0.0;
        for (size_t a = 0; a < k * k; a++) {
            tot += A[a] * A[a];
            off += a % (k + 1) == 0 ? 0.0 : A[a] * A[a];
        }
        if (!isfinite(tot))
            otk_die("non-finite anchor Gram matrix");
        if (off <= 1e-32 * tot)
            break;
        if (sweep >= 100)
            otk_die("Jacobi eigensolver did not converge");
        for (size_t a = 0; a + 1 < k; a++) {
            for (size_t b = a + 1; b < k; b++) {
                const double apq = A[a * k + b];
                if (apq == 0.0)
                    continue;
                /* Rotation J (J_aa = J_bb = c, J_ab = s, J_ba = -s) with
                 * (J^T A J)_ab = 0: t = s/c solves t^2 - 2 th t - 1 = 0, th =
                 * (A_aa - A_bb) / (2 A_ab); the root of smaller magnitude. */
                const double th = (A[a * k + a] - A[b * k + b]) / (2.0 * apq);
                const double t = fabs(th) > 1e150
                                     ? -0.5 / th
                                     : (th >= 0.0 ? -1.0 : 1.0) / (fabs(th) + sqrt(th * th + 1.0));
                const double cs = 1.0 / sqrt(t * t + 1.0), sn = t * cs;
                for (size_t r = 0; r < k; r++) { /* A <- A J, V <- V J */
                    double x = A[r * k + a], y = A[r * k + b];
                    A[r * k + a] = cs * x - sn * y;
                    A[r * k + b] = sn * x + cs * y;
                    x = V[r * k + a];
                    y = V[r * k + b];
                    V[r * k + a] = cs * x - sn * y;
                    V[r * k + b] = sn * x + cs * y;
                }
                for (size_t r = 0; r < k; r++) { /* A <- J^T A */
                    const double x = A[a * k + r], y = A[b * k + r];
                    A[a * k + r] = cs * x - sn * y;
                    A[b * k + r] = sn * x + cs * y;
                }
                A[a * k + b] = A[b * k + a] = 0.0;
            }
        }
    }
    for (size_t a = 0; a < k; a++)
        e[a] = A[a * k + a];
}

/* Everything of the feature map kept for the backward. */
typedef struct {
    double *psi;          /* n*k */
    double *r, *s, *kap;  /* n; n*k <w_l, xh_i>; n*k exp(alpha (s - 1)) (anchors only) */
    double *b;            /* n*k */
    double *G, *V, *e, *t, *M; /* k*k, k*k, k, k, k*k */
} otk_feat;

/* G, V, e, t, M of the anchors (allocated by the caller). */
static void otk_anchor_isqrt(const ref_otk_cfg *c, double *G, double *V, double *e, double *t,
                             double *M)
{
    const size_t k = (size_t)c->k, d = (size_t)c->d;
    const double alpha = 1.0 / (c->sigma * c->sigma);
    double *A = otk_alloc(k * k);
    for (size_t a = 0; a < k; a++)
        for (size_t b = 0; b < k; b++)
            A[a * k + b] = G[a * k + b] =
                exp(alpha * (otk_dot(c->W + a * d, c->W + b * d, d) - 1.0));
    otk_jacobi(k, A, V, e);
    for (size_t m = 0; m < k; m++) {
        t[m] = sqrt(e[m] > 0.0 ? e[m] : 0.0) + c->eta;
        if (!(t[m] > 0.0))
            otk_die("zero t_m: eta = 0 and a non-positive anchor Gram eigenvalue");
    }
    for (size_t a = 0; a < k; a++)
        for (size_t b = 0; b < k; b++) {
            double acc = 0.0;
            for (size_t m = 0; m < k; m++)
                acc += V[a * k + m] * V[b * k + m] / t[m];
            M[a * k + b] = acc;
        }
    free(A);
}

static void otk_feat_build(const ref_otk_cfg *c, const double *x, otk_feat *f)
{
    const size_t n = (size_t)c->n, d = (size_t)c->d, k = (size_t)c->k;
    memset(f, 0, sizeof *f);
    f->psi = otk_alloc(n * k);
    for (size_t i = 0; i < n * d; i++)
        if (!isfinite(x[i]))
            otk_die("non-finite input x");
    if (c->W == NULL) {
        memcpy(f->psi, x, n * d * sizeof(double));
        return;
    }
    const double alpha = 1.0 / (c->sigma * c->sigma);
    f->r = otk_alloc(n);
    f->s = otk_alloc(n * k);
    f->kap = otk_alloc(n * k);
    f->b = otk_alloc(n * k);
    f->G = otk_alloc(k * k);
    f->V = otk_alloc(k * k);
    f->e = otk_alloc(k);
    f->t = otk_alloc(k);
    f->M = otk_alloc(k * k);
    otk_anchor_isqrt(c, f->G, f->V, f->e, f->t, f->M);
    for (size_t i = 0; i < n; i++) {
        const double *xi = x + i * d, nrm2 = otk_dot(xi, xi, d);
        f->r[i] = sqrt(nrm2 > 1e-4 ? nrm2 : 1e-4);
        for (size_t l = 0; l < k; l++) {
            f->s[i * k + l] = otk_dot(c->W + l * d, xi, d) / f->r[i];
            f->kap[i * k + l] = exp(alpha * (f->s[i * k + l] - 1.0));
            f->b[i * k + l] = f->r[i] * f->kap[i * k + l];
        }
        for (size_t a = 0; a < k; a++)
            f->psi[i * k + a] = otk_dot(f->M + a * k, f->b + i * k, k);
    }
}

static void otk_feat_free(otk_feat *f)
{
    double *all[] = {f->psi, f->r, f->s, f->kap, f->b, f->G, f->V, f->e, f->t, f->M};
    for (size_t a = 0; a < sizeof all / sizeof all[0]; a++)
        free(all[a]);
}

/* ------------------------------------------------------------------------ */
/* Plan for one reference                                                   */
/* ------------------------------------------------------------------------ */

typedef struct {
    double *E;   /* n*p, exp(K/eps - rowmax) */
    double *U;   /* L*n: u_1..u_L */
    double *Vs;  /* (L+1)*p: v_0 = 1, v_1..v_L */
    double *P;   /* n*p */
} otk_plan;

static void otk_plan_build(const ref_otk_cfg *c, const double *psi, const double *zh,
                           const double *S, otk_plan *pl)
{
    const size_t n = (size_t)c->n, p = (size_t)c->p, k = (size_t)c->k, L = (size_t)c->L;
    double *E = pl->E = otk_alloc(n * p);
    pl->U = otk_alloc(L * n);
    pl->Vs = otk_alloc((L + 1) * p);
    pl->P = otk_alloc(n * p);
    for (size_t i = 0; i < n; i++) {
        double mx = -INFINITY;
        for (size_t j = 0; j < p; j++) {
            double K = otk_dot(psi + i * k, zh + j * k, k);
            K = (c->pe_double ? K * S[i * p + j] : K) / c->eps;
            if (!isfinite(K))
                otk_die("non-finite score K / eps");
            E[i * p + j] = K;
            mx = K > mx ? K : mx;
        }
        for (size_t j = 0; j < p; j++)
            E[i * p + j] = exp(E[i * p + j] - mx);
    }
    for (size_t j = 0; j < p; j++)
        pl->Vs[j] = 1.0;
    for (size_t t = 1; t <= L; t++) {
        const double *vp = pl->Vs + (t - 1) * p;
        double *u = pl->U + (t - 1) * n, *v = pl->Vs + t * p;
        for (size_t i = 0; i < n; i++) {
            const double acc = otk_dot(E + i * p, vp, p);
            if (!otk_finite_pos(acc))
                otk_die("row normaliser (E v)_i is zero or non-finite");
            u[i] = (1.0 / (double)n) / acc;
        }
        for (size_t j = 0; j < p; j++) {
            double acc = 0.0;
            for (size_t i = 0; i < n; i++)
                acc += E[i * p + j] * u[i];
            if (!otk_finite_pos(acc))
                otk_die("column normaliser (E^T u)_j is zero or non-finite");
            v[j] = (1.0 / (double)p) / acc;
        }
    }
    const double *u = pl->U + (L - 1) * n, *v = pl->Vs + L * p;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < p; j++)
            pl->P[i * p + j] = u[i] * E[i * p + j] * v[j];
}

static void otk_plan_free(otk_plan *pl)
{
    free(pl->E); free(pl->U); free(pl->Vs); free(pl->P);
}

/*
 * Reverse through one reference's plan. dP (n*p) = dL/dP on entry
 * (destroyed); accumulates dpsi (n*k) and dzh (p*k, may be NULL).
 */
static void otk_plan_back(const ref_otk_cfg *c, const otk_plan *pl, const double *psi,
                          const double *zh, const double *S, double *dP, double *dpsi,
                          double *dzh)
{
    const size_t n = (size_t)c->n, p = (size_t)c->p, k = (size_t)c->k, L = (size_t)c->L;
    const double *E = pl->E;
    double *Eb = dP; /* dL/dE, built in place of dP */
    double *ub = otk_alloc(n), *vb = otk_alloc(p), *dl = otk_alloc(p), *rho = otk_alloc(n);
    /* P = diag(u_L) E diag(v_L). */
    const double *uL = pl->U + (L - 1) * n, *vL = pl->Vs + L * p;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < p; j++) {
            const double g = dP[i * p + j];
            ub[i] += g * E[i * p + j] * vL[j];
            vb[j] += g * uL[i] * E[i * p + j];
            Eb[i * p + j] = g * uL[i] * vL[j];
        }
    for (size_t t = L; t >= 1; t--) {
        const double *ut = pl->U + (t - 1) * n, *vt = pl->Vs + t * p, *vp = pl->Vs + (t - 1) * p;
        /* v_t = (1/p) / (E^T u_t): dl_j = -vb_j v_j^2 p. */
        for (size_t j = 0; j < p; j++)
            dl[j] = -vb[j] * vt[j] * vt[j] * (double)p;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < p; j++) {
                ub[i] += E[i * p + j] * dl[j];
                Eb[i * p + j] += ut[i] * dl[j];
            }
        /* u_t = (1/n) / (E v_{t-1}): rho_i = -ub_i u_i^2 n. */
        for (size_t i = 0; i < n; i++) {
            rho[i] = -ub[i] * ut[i] * ut[i] * (double)n;
            ub[i] = 0.0;
        }
        for (size_t j = 0; j < p; j++) {
            vb[j] = 0.0; /* for v_{t-1}; v_0 is constant, its gradient unused */
            for (size_t i = 0; i < n; i++) {
                vb[j] += E[i * p + j] * rho[i];
                Eb[i * p + j] += rho[i] * vp[j];
            }
        }
    }
    /* E = exp(K'/eps - rowmax) (the shift leaves P unchanged), K' = K S
     * with pe_double: dK_ij = Eb_ij E_ij / eps (times S_ij). */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < p; j++) {
            const double sij = c->pe_double ? S[i * p + j] : 1.0;
            const double dK = Eb[i * p + j] * E[i * p + j] / c->eps * sij;
            for (size_t a = 0; a < k; a++) {
                dpsi[i * k + a] += dK * zh[j * k + a];
                if (dzh != NULL)
                    dzh[j * k + a] += dK * psi[i * k + a];
            }
        }
    free(ub); free(vb); free(dl); free(rho);
}

/* Daleckii-Krein divided difference of h(e) = 1/(sqrt(max(e,0)) + eta). */
static double otk_divdiff(double ea, double eb, double ta, double tb)
{
    if (ea > 0.0 && eb > 0.0)
        return -1.0 / (ta * tb * (sqrt(ea) + sqrt(eb)));
    if (ea <= 0.0 && eb <= 0.0)
        return 0.0; /* h is the constant 1/eta there */
    return (1.0 / ta - 1.0 / tb) / (ea - eb);
}

/* Reverse through the Nystrom map: dx (n*d, may be NULL) and dW (k*d, may
 * be NULL) from dpsi (n*k). */
static void otk_feat_back(const ref_otk_cfg *c, const otk_feat *f, const double *x,
                          const double *dpsi, double *dx, double *dW)
{
    const size_t n = (size_t)c->n, d = (size_t)c->d, k = (size_t)c->k;
    const double alpha = 1.0 / (c->sigma * c->sigma), *W = c->W;
    double *dWa = otk_alloc(k * d), *dM = otk_alloc(k * k);
    double *T1 = otk_alloc(k * k), *D = otk_alloc(k * k);
    if (dx != NULL)
        memset(dx, 0, n * d * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        const double *xi = x + i * d, *dpi = dpsi + i * k;
        const int clamped = otk_dot(xi, xi, d) < 1e-4; /* r_i = 0.01 constant */
        /* psi_i = M b_i: dM += dpsi_i b_i^T, db_i = M^T dpsi_i. */
        for (size_t a = 0; a < k; a++)
            for (size_t l = 0; l < k; l++)
                dM[a * k + l] += dpi[a] * f->b[i * k + l];
        for (size_t l = 0; l < k; l++) {
            double db = 0.0;
            for (size_t a = 0; a < k; a++)
                db += f->M[a * k + l] * dpi[a];
            /* b_il = r_i exp(alpha (<w_l, x_i> / r_i - 1)), g = db kap. */
            const double g = db * f->kap[i * k + l], sl = f->s[i * k + l];
            for (size_t m = 0; m < d; m++) {
                const double xh = xi[m] / f->r[i], wlm = W[l * d + m];
                if (dx != NULL)
                    dx[i * d + m] += clamped ? alpha * g * wlm : g * (xh + alpha * (wlm - sl * xh));
                dWa[l * d + m] += alpha * g * xi[m];
            }
        }
    }
    /* M = V diag(h(e)) V^T: dG = V (F .* (V^T dM V)) V^T. */
    for (size_t a = 0; a < k; a++)
        for (size_t b = 0; b < k; b++) {
            double acc = 0.0;
            for (size_t l = 0; l < k; l++)
                for (size_t m = 0; m < k; m++)
                    acc += f->V[l * k + a] * dM[l * k + m] * f->V[m * k + b];
            const double ta = f->t[a], tb = f->t[b];
            T1[a * k + b] = acc * (c->isqrt_grad == 0 ? otk_divdiff(f->e[a], f->e[b], ta, tb)
                                                      : -1.0 / ((ta + tb) * ta * tb));
        }
    /* G = exp(alpha (W W^T - 1)): D = dG .* alpha G, dW += (D + D^T) W. */
    for (size_t l = 0; l < k; l++)
        for (size_t m = 0; m < k; m++) {
            double acc = 0.0;
            for (size_t a = 0; a < k; a++)
                for (size_t b = 0; b < k; b++)
                    acc += f->V[l * k + a] * T1[a * k + b] * f->V[m * k + b];
            D[l * k + m] = acc * alpha * f->G[l * k + m];
        }
    for (size_t l = 0; l < k; l++)
        for (size_t m = 0; m < k; m++)
            for (size_t r = 0; r < d; r++)
                dWa[l * d + r] += (D[l * k + m] + D[m * k + l]) * W[m * d + r];
    if (dW != NULL)
        memcpy(dW, dWa, k * d * sizeof(double));
    free(dWa); free(dM); free(T1); free(D);
}

/* ------------------------------------------------------------------------ */
/* Single set                                                               */
/* ------------------------------------------------------------------------ */

void ref_otk_features(const ref_otk_cfg *c, const double *x, double *psi)
{
    otk_check(c);
    otk_feat f;
    otk_feat_build(c, x, &f);
    memcpy(psi, f.psi, (size_t)c->n * (size_t)c->k * sizeof(double));
    otk_feat_free(&f);
}

void ref_otk_isqrt(const ref_otk_cfg *c, double *G, double *M)
{
    otk_check(c);
    if (c->W == NULL)
        otk_die("ref_otk_isqrt needs anchors");
    const size_t k = (size_t)c->k;
    double *Gb = otk_alloc(k * k), *V = otk_alloc(k * k), *e = otk_alloc(k), *t = otk_alloc(k);
    otk_anchor_isqrt(c, Gb, V, e, t, M);
    if (G != NULL)
        memcpy(G, Gb, k * k * sizeof(double));
    free(Gb); free(V); free(e); free(t);
}

void ref_otk_forward(const ref_otk_cfg *c, const double *x, const double *z, double *out,
                     double *plan)
{
    otk_check(c);
    const size_t n = (size_t)c->n, p = (size_t)c->p, q = (size_t)c->q, k = (size_t)c->k;
    const double cc = otk_scale(c);
    otk_feat f;
    otk_feat_build(c, x, &f);
    double *S = otk_alloc(n * p);
    otk_pe(c, S);
    for (size_t h = 0; h < q; h++) {
        otk_plan pl;
        otk_plan_build(c, f.psi, z + h * p * k, S, &pl);
        for (size_t j = 0; j < p; j++) {
            double *o = out + (j * q + h) * k;
            memset(o, 0, k * sizeof(double));
            for (size_t i = 0; i < n; i++) {
                const double w = cc * pl.P[i * p + j] * S[i * p + j];
                for (size_t a = 0; a < k; a++)
                    o[a] += w * f.psi[i * k + a];
                if (plan != NULL)
                    plan[(h * n + i) * p + j] = w;
            }
        }
        otk_plan_free(&pl);
    }
    free(S);
    otk_feat_free(&f);
}

void ref_otk_backward(const ref_otk_cfg *c, const double *x, const double *z, const double *dout,
                      double *dx, double *dz, double *dW)
{
    otk_check(c);
    const size_t n = (size_t)c->n, p = (size_t)c->p, q = (size_t)c->q, k = (size_t)c->k;
    const double cc = otk_scale(c);
    otk_feat f;
    otk_feat_build(c, x, &f);
    double *S = otk_alloc(n * p), *dpsi = otk_alloc(n * k), *dP = otk_alloc(n * p);
    otk_pe(c, S);
    if (dz != NULL)
        memset(dz, 0, q * p * k * sizeof(double));
    for (size_t h = 0; h < q; h++) {
        otk_plan pl;
        otk_plan_build(c, f.psi, z + h * p * k, S, &pl);
        /* out_j = sum_i c P_ij S_ij psi_i with g_j = dout[j][h]:
         *   dpsi_i += sum_j c P_ij S_ij g_j,  dP_ij = c S_ij <psi_i, g_j>. */
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < p; j++) {
                const double *g = dout + (j * q + h) * k, cs = cc * S[i * p + j];
                for (size_t a = 0; a < k; a++)
                    dpsi[i * k + a] += cs * pl.P[i * p + j] * g[a];
                dP[i * p + j] = cs * otk_dot(f.psi + i * k, g, k);
            }
        otk_plan_back(c, &pl, f.psi, z + h * p * k, S, dP, dpsi,
                      dz != NULL ? dz + h * p * k : NULL);
        otk_plan_free(&pl);
    }
    if (c->W == NULL && dx != NULL)
        memcpy(dx, dpsi, n * k * sizeof(double));
    else if (c->W != NULL)
        otk_feat_back(c, &f, x, dpsi, dx, dW);
    free(S); free(dpsi); free(dP);
    otk_feat_free(&f);
}

/* ------------------------------------------------------------------------ */
/* Batched + padded                                                         */
/* ------------------------------------------------------------------------ */

/* The single-set configuration of set b. */
static ref_otk_cfg otk_set_cfg(const ref_otk_cfg *c, const int *len, int b)
{
    if (c->n < 1)
        otk_die("the padded length N must be >= 1");
    ref_otk_cfg s = *c;
    s.n = len != NULL ? len[b] : c->n;
    if (s.n < 1 || s.n > c->n)
        otk_die("valid length out of range [1, N]");
    s.n_pad = c->n;
    return s;
}

void ref_otk_forward_batched(const ref_otk_cfg *c, int B, const int *len, const double *x,
                             const double *z, double *out, double *plan)
{
    if (B < 0)
        otk_die("B must be >= 0");
    const size_t N = (size_t)c->n, d = (size_t)c->d, q = (size_t)c->q, p = (size_t)c->p;
    const size_t k = (size_t)c->k;
    for (size_t b = 0; b < (size_t)B; b++) {
        const ref_otk_cfg s = otk_set_cfg(c, len, (int)b);
        const size_t n = (size_t)s.n;
        double *pl = plan != NULL ? otk_alloc(q * n * p) : NULL;
        ref_otk_forward(&s, x + b * N * d, z, out + b * p * q * k, pl);
        if (plan != NULL) {
            double *pb = plan + b * q * N * p;
            for (size_t h = 0; h < q; h++)
                for (size_t i = 0; i < N; i++)
                    for (size_t j = 0; j < p; j++)
                        pb[(h * N + i) * p + j] = i < n ? pl[(h * n + i) * p + j] : 0.0;
        }
        free(pl);
    }
}

void ref_otk_backward_batched(const ref_otk_cfg *c, int B, const int *len, const double *x,
                              const double *z, const double *dout, double *dx, double *dz,
                              double *dW)
{
    if (B < 0)
        otk_die("B must be >= 0");
    const size_t N = (size_t)c->n, d = (size_t)c->d, q = (size_t)c->q, p = (size_t)c->p;
    const size_t k = (size_t)c->k, nz = q * p * k, nw = k * d;
    double *dzb = otk_alloc(nz), *dWb = otk_alloc(nw);
    if (dz != NULL)
        memset(dz, 0, nz * sizeof(double));
    if (dW != NULL && c->W != NULL)
        memset(dW, 0, nw * sizeof(double));
    for (size_t b = 0; b < (size_t)B; b++) {
        const ref_otk_cfg s = otk_set_cfg(c, len, (int)b);
        const size_t n = (size_t)s.n;
        double *dxb = dx != NULL ? dx + b * N * d : NULL;
        ref_otk_backward(&s, x + b * N * d, z, dout + b * p * q * k, dxb, dzb, dWb);
        if (dxb != NULL)
            memset(dxb + n * d, 0, (N - n) * d * sizeof(double));
        for (size_t a = 0; dz != NULL && a < nz; a++)
            dz[a] += dzb[a];
        for (size_t a = 0; dW != NULL && c->W != NULL && a < nw; a++)
            dW[a] += dWb[a];
    }
    free(dzb); free(dWb);
}
