/*
 * ref_asap.c -- naive double-precision reference for ASAP. See ref_asap.h.
 * Log-domain and matrix-scaling teachers, cost-coordinate online operator
 * with explicit duals, prefix-sum and north-west-corner 1-D potentials, own
 * Cholesky. Clarity over speed.
 */
#include "ref_asap.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static void asap_die(const char *msg)
{
    fprintf(stderr, "ref_asap: %s\n", msg);
    abort();
}

/* Zeroed array of count doubles (count may be 0), aborting on failure. */
static double *asap_alloc(size_t count)
{
    if (count > SIZE_MAX / sizeof(double))
        asap_die("allocation size overflow");
    double *p = calloc(count > 0 ? count : 1, sizeof(double));
    if (p == NULL)
        asap_die("out of memory");
    return p;
}

static int *asap_ialloc(size_t count)
{
    if (count > SIZE_MAX / sizeof(int))
        asap_die("allocation size overflow");
    int *p = calloc(count > 0 ? count : 1, sizeof(int));
    if (p == NULL)
        asap_die("out of memory");
    return p;
}

static double asap_dot(const double *x, const double *y, int len)
{
    double acc = 0.0;
    for (int i = 0; i < len; i++)
        acc += x[i] * y[i];
    return acc;
}

/* log sum_k exp(x[k]) over len >= 1 entries. */
static double asap_lse(const double *x, int len)
{
    double mx = -INFINITY;
    for (int k = 0; k < len; k++)
        if (x[k] > mx)
            mx = x[k];
    if (!isfinite(mx))
        asap_die("non-finite log-sum-exp argument");
    double acc = 0.0;
    for (int k = 0; k < len; k++)
        acc += exp(x[k] - mx);
    return mx + log(acc);
}

static void asap_check_problem(int n, int m, int d, double s, double eps)
{
    if (n < 1 || m < 1 || d < 1)
        asap_die("sizes must be >= 1");
    if (!(s > 0.0) || !isfinite(s))
        asap_die("scale must be > 0");
    if (!(eps > 0.0) || !isfinite(eps))
        asap_die("eps must be > 0");
}

/* Z [n x m] = (s / eps) q_i . k_j. */
static void asap_logits(int n, int m, int d, const double *Q, const double *K, double s, double eps,
                        double *Z)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++)
            Z[(size_t)i * m + j] = (s / eps) * asap_dot(Q + (size_t)i * d, K + (size_t)j * d, d);
}

static void asap_centre(int n, double *x)
{
    double mean = 0.0;
    for (int i = 0; i < n; i++)
        mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++)
        x[i] -= mean;
}

/* ------------------------------------------------------------------------ */
/* Teacher                                                                  */
/* ------------------------------------------------------------------------ */

void ref_asap_rho(int n, int d, const double *Q, double s, double *rho)
{
    for (int i = 0; i < n; i++)
        rho[i] = 0.5 * s * asap_dot(Q + (size_t)i * d, Q + (size_t)i * d, d);
}

void ref_asap_teacher(int n, int m, int d, const double *Q, const double *K, double s, double eps,
                      int S, double *f_hist, double *g_hist, double *P, double *A)
{
    asap_check_problem(n, m, d, s, eps);
    if (S < 1)
        asap_die("teacher needs S >= 1");
    double *Z = asap_alloc((size_t)n * m);
    double *f = asap_alloc((size_t)n);
    double *g = asap_alloc((size_t)m);
    double *row = asap_alloc((size_t)(n > m ? n : m));
    asap_logits(n, m, d, Q, K, s, eps, Z);
    const double loga = -log((double)n), logb = -log((double)m);
    for (int t = 1; t <= S; t++) {
        if (t % 2 == 1) {
            for (int i = 0; i < n; i++) {
                for (int j = 0; j < m; j++)
                    row[j] = Z[(size_t)i * m + j] + g[j];
                f[i] = loga - asap_lse(row, m);
            }
        } else {
            for (int j = 0; j < m; j++) {
                for (int i = 0; i < n; i++)
                    row[i] = Z[(size_t)i * m + j] + f[i];
                g[j] = logb - asap_lse(row, n);
            }
        }
        if (f_hist != NULL)
            memcpy(f_hist + (size_t)(t - 1) * n, f, (size_t)n * sizeof(double));
        if (g_hist != NULL)
            memcpy(g_hist + (size_t)(t - 1) * m, g, (size_t)m * sizeof(double));
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            const double p = exp(Z[(size_t)i * m + j] + f[i] + g[j]);
            if (P != NULL)
                P[(size_t)i * m + j] = p;
            if (A != NULL)
                A[(size_t)i * m + j] = n * p;
        }
    free(Z); free(f); free(g); free(row);
}

void ref_asap_teacher_mult(int n, int m, int d, const double *Q, const double *K, double s,
                           double eps, int S, double *A)
{
    asap_check_problem(n, m, d, s, eps);
    if (S < 1)
        asap_die("teacher needs S >= 1");
    double *M = asap_alloc((size_t)n * m);
    asap_logits(n, m, d, Q, K, s, eps, M);
    double mx = -INFINITY;
    for (size_t k = 0; k < (size_t)n * m; k++)
        if (M[k] > mx)
            mx = M[k];
    for (size_t k = 0; k < (size_t)n * m; k++)
        M[k] = exp(M[k] - mx);
    for (int t = 1; t <= S; t++) {
        if (t % 2 == 1) {
            for (int i = 0; i < n; i++) {
                double sum = 0.0;
                for (int j = 0; j < m; j++)
                    sum += M[(size_t)i * m + j];
                if (!(sum > 0.0) || !isfinite(sum))
                    asap_die("zero or non-finite row sum");
                for (int j = 0; j < m; j++)
                    M[(size_t)i * m + j] /= n * sum;
            }
        } else {
            for (int j = 0; j < m; j++) {
                double sum = 0.0;
                for (int i = 0; i < n; i++)
                    sum += M[(size_t)i * m + j];
                if (!(sum > 0.0) || !isfinite(sum))
                    asap_die("zero or non-finite column sum");
                for (int i = 0; i < n; i++)
                    M[(size_t)i * m + j] /= m * sum;
            }
        }
    }
    for (size_t k = 0; k < (size_t)n * m; k++)
        A[k] = n * M[k];
    free(M);
}

void ref_asap_teacher_dual(int n, int m, int d, const double *Q, const double *K, double s,
                           double eps, int S, double *y, double *f)
{
    if (S < 2)
        asap_die("the teacher dual needs S >= 2");
    double *fh = asap_alloc((size_t)S * n);
    ref_asap_teacher(n, m, d, Q, K, s, eps, S, fh, NULL, NULL, NULL);
    const int t = S % 2 == 0 ? S - 1 : S - 2; /* 1-based half-step */
    const double *fc = fh + (size_t)(t - 1) * n;
    ref_asap_rho(n, d, Q, s, y);
    for (int i = 0; i < n; i++)
        y[i] += eps * fc[i];
    asap_centre(n, y);
    if (f != NULL)
        memcpy(f, fc, (size_t)n * sizeof(double));
    free(fh);
}

/* ------------------------------------------------------------------------ */
/* Sliced potentials                                                        */
/* ------------------------------------------------------------------------ */

int ref_asap_sigma(int r, int n, int m)
{
    return (int)(((long long)(r + 1) * m - 1) / n);
}

void ref_asap_argsort(int len, const double *x, int *idx)
{
    for (int i = 0; i < len; i++) {
        int k = i;
        /* shift strictly larger entries right: equal keys keep index order */
        while (k > 0 && x[idx[k - 1]] > x[i]) {
            idx[k] = idx[k - 1];
            k--;
        }
        idx[k] = i;
    }
}

void ref_asap_potential_1d(int n, const double *a, int m, const double *b, int bug, double *f)
{
    if (n < 1 || m < 1)
        asap_die("1-D potential needs n, m >= 1");
    int *ia = asap_ialloc((size_t)n), *ib = asap_ialloc((size_t)m);
    ref_asap_argsort(n, a, ia);
    ref_asap_argsort(m, b, ib);
    double phi = 0.0;
    f[ia[0]] = 0.5 * a[ia[0]] * a[ia[0]];
    for (int r = 1; r < n; r++) {
        int sg = ref_asap_sigma(r - 1, n, m);
        if (bug & REF_ASAP_BUG_SIGMA) {
            sg = ref_asap_sigma(r, n, m);
            if (sg > m - 1)
                sg = m - 1;
        }
        phi += b[ib[sg]] * (a[ia[r]] - a[ia[r - 1]]);
        f[ia[r]] = 0.5 * a[ia[r]] * a[ia[r]] - phi;
    }
    free(ia); free(ib);
}

void ref_asap_ctransform_1d(int n, const double *a, const double *f, int m, const double *b,
                            double *h)
{
    for (int j = 0; j < m; j++) {
        double best = INFINITY;
        for (int i = 0; i < n; i++) {
            const double v = 0.5 * (a[i] - b[j]) * (a[i] - b[j]) - f[i];
            if (v < best)
                best = v;
        }
        h[j] = best;
    }
}

static double asap_c1(double x, double y)
{
    return 0.5 * (x - y) * (x - y);
}

double ref_asap_nw_1d(int n, const double *a, int m, const double *b, double *f, double *h,
                      int *er, int *et, double *ew, int *ne)
{
    if (n < 1 || m < 1)
        asap_die("1-D plan needs n, m >= 1");
    int *ia = asap_ialloc((size_t)n), *ib = asap_ialloc((size_t)m);
    ref_asap_argsort(n, a, ia);
    ref_asap_argsort(m, b, ib);
    double *fs = asap_alloc((size_t)n), *hs = asap_alloc((size_t)m);
    int *fk = asap_ialloc((size_t)n), *hk = asap_ialloc((size_t)m);
    /* integer masses: each query m units, each key n units (total n m) */
    long long ra = m, rb = n;
    int r = 0, t = 0, cnt = 0;
    double cost = 0.0;
    fs[0] = 0.5 * a[ia[0]] * a[ia[0]];
    fk[0] = 1;
    while (r < n && t < m) {
        const double ar = a[ia[r]], bt = b[ib[t]];
        if (fk[r] && !hk[t]) {
            hs[t] = asap_c1(ar, bt) - fs[r];
            hk[t] = 1;
        } else if (hk[t] && !fk[r]) {
            fs[r] = asap_c1(ar, bt) - hs[t];
            fk[r] = 1;
        } else if (!fk[r] && !hk[t]) {
            asap_die("north-west corner: disconnected support (internal error)");
        }
        const long long fl = ra < rb ? ra : rb;
        const double w = (double)fl / ((double)n * (double)m);
        if (er != NULL) er[cnt] = ia[r];
        if (et != NULL) et[cnt] = ib[t];
        if (ew != NULL) ew[cnt] = w;
        cnt++;
        cost += w * asap_c1(ar, bt);
        ra -= fl;
        rb -= fl;
        if (ra == 0 && rb == 0) {
            /* degenerate: link the next query through key t (zero flow) */
            if (r + 1 < n) {
                fs[r + 1] = asap_c1(a[ia[r + 1]], bt) - hs[t];
                fk[r + 1] = 1;
            }
            r++;
            t++;
            ra = m;
            rb = n;
        } else if (ra == 0) {
            r++;
            ra = m;
        } else {
            t++;
            rb = n;
        }
    }
    if (r != n || t != m)
        asap_die("north-west corner: masses not exhausted (internal error)");
    if (f != NULL)
        for (int k = 0; k < n; k++) f[ia[k]] = fs[k];
    if (h != NULL)
        for (int k = 0; k < m; k++) h[ib[k]] = hs[k];
    if (ne != NULL)
        *ne = cnt;
    free(ia); free(ib); free(fs); free(hs); free(fk); free(hk);
    return cost;
}

void ref_asap_features(int n, int m, int d, const double *Q, const double *K, double s, int L,
                       const double *theta, int bug, double *X)
{
    if (n < 1 || m < 1 || d < 1 || L < 1)
        asap_die("features need n, m, d, L >= 1");
    if (!(s > 0.0))
        asap_die("scale must be > 0");
    double *a = asap_alloc((size_t)n), *b = asap_alloc((size_t)m), *f = asap_alloc((size_t)n);
    const double rs = sqrt(s);
    for (int l = 0; l < L; l++) {
        const double *th = theta + (size_t)l * d;
        for (int i = 0; i < n; i++)
            a[i] = rs * asap_dot(th, Q + (size_t)i * d, d);
        for (int j = 0; j < m; j++)
            b[j] = rs * asap_dot(th, K + (size_t)j * d, d);
        ref_asap_potential_1d(n, a, m, b, bug & REF_ASAP_BUG_SIGMA, f);
        if (!(bug & REF_ASAP_BUG_NOCENTRE))
            asap_centre(n, f);
        for (int i = 0; i < n; i++)
            X[(size_t)i * L + l] = f[i];
    }
    free(a); free(b); free(f);
}

/* ------------------------------------------------------------------------ */
/* Online operator, cost coordinates                                        */
/* ------------------------------------------------------------------------ */

void ref_asap_cost(int n, int m, int d, const double *Q, const double *K, double s, double *C)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double acc = 0.0;
            for (int k = 0; k < d; k++) {
                const double df = Q[(size_t)i * d + k] - K[(size_t)j * d + k];
                acc += df * df;
            }
            C[(size_t)i * m + j] = 0.5 * s * acc;
        }
}

void ref_asap_tk(int n, int m, const double *C, double eps, const double *F, double *G)
{
    double *col = asap_alloc((size_t)n);
    for (int j = 0; j < m; j++) {
        for (int i = 0; i < n; i++)
            col[i] = (-C[(size_t)i * m + j] + F[i]) / eps;
        G[j] = eps * log(1.0 / m) - eps * asap_lse(col, n);
    }
    free(col);
}

void ref_asap_tq(int n, int m, const double *C, double eps, const double *G, double *F)
{
    double *row = asap_alloc((size_t)m);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m; j++)
            row[j] = (-C[(size_t)i * m + j] + G[j]) / eps;
        F[i] = eps * log(1.0 / n) - eps * asap_lse(row, m);
    }
    free(row);
}

void ref_asap_plan(int n, int m, const double *C, double eps, const double *F, const double *G,
                   double *P)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++)
            P[(size_t)i * m + j] = exp((-C[(size_t)i * m + j] + F[i] + G[j]) / eps);
}

void ref_asap_apply(int n, int m, int d, int dv, const double *Q, const double *K, const double *V,
                    double s, double eps, const double *fhat, int variant, double *A, double *O,
                    double *G0, double *F1, double *G1)
{
    asap_check_problem(n, m, d, s, eps);
    if (variant != REF_ASAP_ZERO && variant != REF_ASAP_COLUMN && variant != REF_ASAP_ROW)
        asap_die("unknown variant");
    double *C = asap_alloc((size_t)n * m), *P = asap_alloc((size_t)n * m);
    double *g0 = asap_alloc((size_t)m), *f1 = asap_alloc((size_t)n), *g1 = asap_alloc((size_t)m);
    ref_asap_cost(n, m, d, Q, K, s, C);
    ref_asap_tk(n, m, C, eps, fhat, g0);
    ref_asap_tq(n, m, C, eps, g0, f1);
    ref_asap_tk(n, m, C, eps, f1, g1);
    if (variant == REF_ASAP_ZERO)
        ref_asap_plan(n, m, C, eps, fhat, g0, P);
    else if (variant == REF_ASAP_ROW)
        ref_asap_plan(n, m, C, eps, f1, g0, P);
    else
        ref_asap_plan(n, m, C, eps, f1, g1, P);
    if (A != NULL)
        for (size_t k = 0; k < (size_t)n * m; k++)
            A[k] = n * P[k];
    if (O != NULL && V != NULL) {
        if (dv < 1)
            asap_die("dv must be >= 1");
        for (int i = 0; i < n; i++)
            for (int c = 0; c < dv; c++) {
                double acc = 0.0;
                for (int j = 0; j < m; j++)
                    acc += n * P[(size_t)i * m + j] * V[(size_t)j * dv + c];
                O[(size_t)i * dv + c] = acc;
            }
    }
    if (G0 != NULL) memcpy(G0, g0, (size_t)m * sizeof(double));
    if (F1 != NULL) memcpy(F1, f1, (size_t)n * sizeof(double));
    if (G1 != NULL) memcpy(G1, g1, (size_t)m * sizeof(double));
    free(C); free(P); free(g0); free(f1); free(g1);
}

/* ------------------------------------------------------------------------ */
/* Fidelity                                                                 */
/* ------------------------------------------------------------------------ */

void ref_asap_fidelity(int n, int m, int dv, const double *O, const double *Oref, const double *A,
                       const double *Aref, ref_asap_fid *res)
{
    res->out_rmse = res->out_rms = res->attn_rel_l2 = res->row_err = res->col_err = NAN;
    if (O != NULL && Oref != NULL) {
        double se = 0.0, sr = 0.0;
        const size_t no = (size_t)n * dv;
        for (size_t k = 0; k < no; k++) {
            se += (O[k] - Oref[k]) * (O[k] - Oref[k]);
            sr += Oref[k] * Oref[k];
        }
        res->out_rmse = sqrt(se / (double)no);
        res->out_rms = sqrt(sr / (double)no);
    }
    if (A == NULL)
        return;
    if (Aref != NULL) {
        double se = 0.0, sr = 0.0;
        for (size_t k = 0; k < (size_t)n * m; k++) {
            se += (A[k] - Aref[k]) * (A[k] - Aref[k]);
            sr += Aref[k] * Aref[k];
        }
        res->attn_rel_l2 = sqrt(se) / sqrt(sr);
    }
    double re = 0.0, ce = 0.0;
    for (int i = 0; i < n; i++) {
        double sum = 0.0;
        for (int j = 0; j < m; j++)
            sum += A[(size_t)i * m + j];
        re += fabs(sum - 1.0);
    }
    for (int j = 0; j < m; j++) {
        double sum = 0.0;
        for (int i = 0; i < n; i++)
            sum += A[(size_t)i * m + j];
        ce += fabs((double)m / n * sum - 1.0);
    }
    res->row_err = re / n;
    res->col_err = ce / m;
}

/* ------------------------------------------------------------------------ */
/* Cholesky                                                                 */
/* ------------------------------------------------------------------------ */

int ref_asap_chol(int k, double *A)
{
    double dmax = 0.0;
    for (int i = 0; i < k; i++)
        if (fabs(A[(size_t)i * k + i]) > dmax)
            dmax = fabs(A[(size_t)i * k + i]);
    for (int j = 0; j < k; j++) {
        double dj = A[(size_t)j * k + j];
        for (int p = 0; p < j; p++)
            dj -= A[(size_t)j * k + p] * A[(size_t)j * k + p];
        if (!isfinite(dj) || !(dj > 1e-14 * dmax))
            return -1;
        const double ljj = sqrt(dj);
        A[(size_t)j * k + j] = ljj;
        for (int i = j + 1; i < k; i++) {
            double v = A[(size_t)i * k + j];
            for (int p = 0; p < j; p++)
                v -= A[(size_t)i * k + p] * A[(size_t)j * k + p];
            A[(size_t)i * k + j] = v / ljj;
        }
    }
    return 0;
}

void ref_asap_chol_solve(int k, const double *Lf, double *x)
{
    for (int i = 0; i < k; i++) { /* L z = x */
        double v = x[i];
        for (int p = 0; p < i; p++)
            v -= Lf[(size_t)i * k + p] * x[p];
        x[i] = v / Lf[(size_t)i * k + i];
    }
    for (int i = k - 1; i >= 0; i--) { /* L^T x = z */
        double v = x[i];
        for (int p = i + 1; p < k; p++)
            v -= Lf[(size_t)p * k + i] * x[p];
        x[i] = v / Lf[(size_t)i * k + i];
    }
}

/* ------------------------------------------------------------------------ */
/* Calibration                                                              */
/* ------------------------------------------------------------------------ */

int ref_asap_fit_ls(int M, const ref_asap_prob *pr, int L, double lambda, double *omega,
                    double *rmse, double *r2)
{
    if (M < 1 || L < 1 || !(lambda >= 0.0))
        asap_die("LS fit needs M, L >= 1 and lambda >= 0");
    double *G = asap_alloc((size_t)L * L), *c = asap_alloc((size_t)L);
    long long rows = 0;
    double syy = 0.0;
    for (int p = 0; p < M; p++) {
        const int n = pr[p].n;
        const double *X = pr[p].X, *y = pr[p].y;
        for (int i = 0; i < n; i++) {
            const double *xi = X + (size_t)i * L;
            for (int a = 0; a < L; a++) {
                c[a] += xi[a] * y[i];
                for (int b = 0; b < L; b++)
                    G[(size_t)a * L + b] += xi[a] * xi[b];
            }
            syy += y[i] * y[i];
        }
        rows += n;
    }
    for (int a = 0; a < L; a++)
        G[(size_t)a * L + a] += lambda;
    int rc = ref_asap_chol(L, G);
    if (rc == 0) {
        memcpy(omega, c, (size_t)L * sizeof(double));
        ref_asap_chol_solve(L, G, omega);
        double rss = 0.0;
        for (int p = 0; p < M; p++)
            for (int i = 0; i < pr[p].n; i++) {
                const double e = pr[p].y[i] - asap_dot(pr[p].X + (size_t)i * L, omega, L);
                rss += e * e;
            }
        if (rmse != NULL)
            *rmse = sqrt(rss / (double)rows);
        if (r2 != NULL)
            *r2 = 1.0 - rss / syy;
    }
    free(G); free(c);
    return rc;
}

/* One problem's part of J (without the ridge), adding X^T (rhat - r) to
 * grad and the (1/eps) [...] term to hess when non-NULL. */
static double asap_kl_problem(const ref_asap_prob *p, int d, int L, double s, double eps,
                              const double *w, double *grad, double *hess)
{
    const int n = p->n, m = p->m;
    asap_check_problem(n, m, d, s, eps);
    double *C = asap_alloc((size_t)n * m), *P = asap_alloc((size_t)n * m);
    double *fh = asap_alloc((size_t)n), *G = asap_alloc((size_t)m);
    double *r = asap_alloc((size_t)n), *rh = asap_alloc((size_t)n);
    double *col = asap_alloc((size_t)n);
    ref_asap_cost(n, m, d, p->Q, p->K, s, C);
    /* teacher one-sided plan at y: row sums r */
    ref_asap_tk(n, m, C, eps, p->y, G);
    ref_asap_plan(n, m, C, eps, p->y, G, P);
    for (int i = 0; i < n; i++) {
        r[i] = 0.0;
        for (int j = 0; j < m; j++)
            r[i] += P[(size_t)i * m + j];
    }
    /* model: fhat = X w, Phat = P_C(fhat, T_K fhat) */
    for (int i = 0; i < n; i++)
        fh[i] = asap_dot(p->X + (size_t)i * L, w, L);
    ref_asap_tk(n, m, C, eps, fh, G);
    ref_asap_plan(n, m, C, eps, fh, G, P);
    for (int i = 0; i < n; i++) {
        rh[i] = 0.0;
        for (int j = 0; j < m; j++)
            rh[i] += P[(size_t)i * m + j];
    }
    /* J_m = eps sum_j b LSE_i(Z_ij + u_i) - <r, fhat>, with
     * Z_ij + u_i = (-C_ij + fhat_i)/eps + kappa_j/eps */
    const double b = 1.0 / m;
    double J = 0.0;
    for (int j = 0; j < m; j++) {
        const double kap = 0.5 * s * asap_dot(p->K + (size_t)j * d, p->K + (size_t)j * d, d);
        for (int i = 0; i < n; i++)
            col[i] = (-C[(size_t)i * m + j] + fh[i]) / eps;
        J += eps * b * (asap_lse(col, n) + kap / eps);
    }
    J -= asap_dot(r, fh, n);
    if (grad != NULL)
        for (int a = 0; a < L; a++)
            for (int i = 0; i < n; i++)
                grad[a] += p->X[(size_t)i * L + a] * (rh[i] - r[i]);
    if (hess != NULL) {
        double *wj = asap_alloc((size_t)L);
        for (int a = 0; a < L; a++)
            for (int c = 0; c < L; c++) {
                double acc = 0.0;
                for (int i = 0; i < n; i++)
                    acc += p->X[(size_t)i * L + a] * rh[i] * p->X[(size_t)i * L + c];
                hess[(size_t)a * L + c] += acc / eps;
            }
        for (int j = 0; j < m; j++) {
            /* column j of W = X^T Pi, Pi_ij = Phat_ij / b */
            for (int a = 0; a < L; a++) {
                double acc = 0.0;
                for (int i = 0; i < n; i++)
                    acc += p->X[(size_t)i * L + a] * P[(size_t)i * m + j] / b;
                wj[a] = acc;
            }
            for (int a = 0; a < L; a++)
                for (int c = 0; c < L; c++)
                    hess[(size_t)a * L + c] -= b * wj[a] * wj[c] / eps;
        }
        free(wj);
    }
    free(C); free(P); free(fh); free(G); free(r); free(rh); free(col);
    return J;
}

double ref_asap_kl_eval(int M, const ref_asap_prob *pr, int d, int L, double s, double eps,
                        double lambda, const double *w, double *grad, double *hess)
{
    if (M < 1 || L < 1 || !(lambda >= 0.0))
        asap_die("KL objective needs M, L >= 1 and lambda >= 0");
    if (grad != NULL)
        memset(grad, 0, (size_t)L * sizeof(double));
    if (hess != NULL)
        memset(hess, 0, (size_t)L * L * sizeof(double));
    double J = 0.0;
    for (int p = 0; p < M; p++)
        J += asap_kl_problem(&pr[p], d, L, s, eps, w, grad, hess);
    J += 0.5 * lambda * asap_dot(w, w, L);
    if (grad != NULL)
        for (int a = 0; a < L; a++)
            grad[a] += lambda * w[a];
    if (hess != NULL)
        for (int a = 0; a < L; a++)
            hess[(size_t)a * L + a] += lambda;
    return J;
}

int ref_asap_fit_kl(int M, const ref_asap_prob *pr, int d, int L, double s, double eps,
                    double lambda, const double *w0, int max_iters, double tol, double *w,
                    int *iters, double *J0, double *J)
{
    double *g = asap_alloc((size_t)L), *H = asap_alloc((size_t)L * L);
    double *dir = asap_alloc((size_t)L), *wt = asap_alloc((size_t)L);
    if (w0 != NULL)
        memcpy(w, w0, (size_t)L * sizeof(double));
    else if (ref_asap_fit_ls(M, pr, L, lambda, w, NULL, NULL) != 0)
        memset(w, 0, (size_t)L * sizeof(double));
    int it = 0, conv = 0;
    double Jc = ref_asap_kl_eval(M, pr, d, L, s, eps, lambda, w, g, H);
    if (J0 != NULL)
        *J0 = Jc;
    for (;;) {
        if (ref_asap_chol(L, H) != 0)
            break;
        for (int a = 0; a < L; a++)
            dir[a] = -g[a];
        ref_asap_chol_solve(L, H, dir);
        const double gd = asap_dot(g, dir, L); /* = -decrement^2 */
        if (-gd / 2.0 < tol) {
            conv = 1;
            break;
        }
        if (it >= max_iters)
            break;
        double t = 1.0, Jt = 0.0;
        int ok = 0;
        for (int h = 0; h <= 60; h++) {
            for (int a = 0; a < L; a++)
                wt[a] = w[a] + t * dir[a];
            Jt = ref_asap_kl_eval(M, pr, d, L, s, eps, lambda, wt, NULL, NULL);
            if (Jt <= Jc + 1e-4 * t * gd) {
                ok = 1;
                break;
            }
            t *= 0.5;
        }
        if (!ok)
            break;
        memcpy(w, wt, (size_t)L * sizeof(double));
        it++;
        Jc = ref_asap_kl_eval(M, pr, d, L, s, eps, lambda, w, g, H);
    }
    if (iters != NULL)
        *iters = it;
    if (J != NULL)
        *J = Jc;
    free(g); free(H); free(dir); free(wt);
    return conv;
}
