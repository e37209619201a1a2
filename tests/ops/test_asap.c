/* test_asap.c -- ASAP: the online operator, features and teacher dual against
 * the independent double reference (tests/ops/ref_asap.c), the digest's section 7
 * properties on the float32 library, calibration (LS and KL) against the
 * reference's fits, determinism (thread counts and batch shapes, bitwise,
 * with a problem run by a team), padding == truncation, the compiled-layer
 * file and bad input. */
#include "birkhoff.h"
#include "../harness.h"
#include "ref_asap.h"
#include "../tutil.h"
#include "../../src/ops/ops.h" /* bki_asap_plan: the parallel model's plan, asserted below */
#include "../../src/core/internal.h" /* the sliced features' lanes kernels */

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A layer with a random unit slice bank and random omega (owned arrays). */
static bk_asap_layer make_layer(int d, int L, float scale, float eps, int S, th_rng *r, double wsd)
{
    bk_asap_layer ly;
    memset(&ly, 0, sizeof ly);
    ly.d = d;
    ly.slices = L;
    ly.scale = scale;
    ly.eps = eps;
    ly.teacher_iters = S;
    ly.theta = malloc(sizeof(float) * (size_t)L * d);
    ly.omega = malloc(sizeof(double) * (size_t)L);
    for (int l = 0; l < L; l++) {
        double n = 0;
        for (int x = 0; x < d; x++) {
            double g = th_normal(r);
            ly.theta[(size_t)l * d + x] = (float)g;
            n += g * g;
        }
        for (int x = 0; x < d; x++) ly.theta[(size_t)l * d + x] = (float)(ly.theta[(size_t)l * d + x] / sqrt(n));
        ly.omega[l] = wsd * th_normal(r);
    }
    ly.lambda = 1e-3;
    return ly;
}

static double *theta_d(const bk_asap_layer *ly)
{
    double *t = malloc(sizeof(double) * (size_t)ly->slices * ly->d);
    for (size_t i = 0; i < (size_t)ly->slices * ly->d; i++) t[i] = ly->theta[i];
    return t;
}

/* contiguous double copy of problem (b, h)'s valid rows */
static double *rows_of(const bk_tensor *t, int b, int h, int rows, int C)
{
    double *x = malloc(sizeof(double) * (size_t)(rows > 0 ? rows : 1) * C);
    const float *base = t->data + (int64_t)b * t->stride_b + (int64_t)h * t->stride_h;
    for (int i = 0; i < rows; i++)
        for (int c = 0; c < C; c++) x[(size_t)i * C + c] = base[(int64_t)i * t->stride_n + c];
    return x;
}

static double max_abs_d(const double *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* ---- grid against the reference -------------------------------------- */
typedef struct {
    int B, H, Nq, Nk, d, dv, L, S, layout, pad;
    float eps, scale;
} acase;

static void run_case(const acase *c, th_rng *r)
{
    char name[160];
    snprintf(name, sizeof name, "asap B%d H%d %dx%d d%d dv%d L%d S%d eps%g pad%d lay%d", c->B, c->H, c->Nq, c->Nk, c->d,
             c->dv, c->L, c->S, (double)c->eps, c->pad, c->layout);
    th_prob t;
    th_prob_init(&t, c->B, c->H, c->Nq, c->Nk, c->d, c->dv, c->layout, c->pad, 0.8, r);
    const float sc = c->scale != 0 ? c->scale : 1.0f / sqrtf((float)c->d);
    bk_asap_layer ly = make_layer(c->d, c->L, sc, c->eps, c->S, r, 1.0);
    double *th = theta_d(&ly);
    const int P = c->B * c->H;
    float *X = malloc(sizeof(float) * (size_t)P * c->Nq * c->L), *y = malloc(sizeof(float) * (size_t)P * c->Nq);
    float *fh = malloc(sizeof(float) * (size_t)P * c->Nq);
    bk_asap_config cfg = bk_asap_config_default(c->d);
    cfg.scale = c->scale;
    cfg.eps = c->eps;
    cfg.teacher_iters = c->S;
    int ok = bk_asap_features(&t.desc, &ly, &t.tq, &t.tk, X) == BK_OK &&
             bk_asap_teacher_dual(&t.desc, &cfg, &t.tq, &t.tk, y) == BK_OK;
    th_check(ok, name, "features / teacher dual failed: %s", bk_last_error());
    double ef = 0, ey = 0, eo[4] = {0}, ea[4] = {0}, ezero = 0;
    for (int v = 1; v <= 3 && ok; v++) {
        bk_asap_extras ex = {t.ta, fh, NULL};
        if (bk_asap_forward(&t.desc, &ly, (bk_asap_variant)v, &t.tq, &t.tk, &t.tv, &t.to, &ex, NULL, 0) != BK_OK) {
            th_check(0, name, "forward failed: %s", bk_last_error());
            ok = 0;
            break;
        }
        for (int p = 0; p < P; p++) {
            const int b = p / c->H, h = p % c->H;
            const int Lq = t.desc.q_len ? t.desc.q_len[b] : c->Nq, Lk = t.desc.k_len ? t.desc.k_len[b] : c->Nk;
            const float *Ob = t.to.data + (int64_t)b * t.to.stride_b + (int64_t)h * t.to.stride_h;
            const float *Ab = t.ta.data + (int64_t)b * t.ta.stride_b + (int64_t)h * t.ta.stride_h;
            if (Lq == 0 || Lk == 0) { /* zero output, zero attention */
                for (int i = 0; i < c->Nq; i++) {
                    for (int e = 0; e < c->dv; e++) ezero = fmax(ezero, fabs(Ob[(int64_t)i * t.to.stride_n + e]));
                    for (int j = 0; j < c->Nk; j++) ezero = fmax(ezero, fabs(Ab[(int64_t)i * t.ta.stride_n + j]));
                }
                continue;
            }
            double *Q = rows_of(&t.tq, b, h, Lq, c->d), *K = rows_of(&t.tk, b, h, Lk, c->d);
            double *V = rows_of(&t.tv, b, h, Lk, c->dv);
            double *Xr = malloc(sizeof(double) * (size_t)Lq * c->L), *yr = malloc(sizeof(double) * (size_t)Lq);
            double *f = malloc(sizeof(double) * (size_t)Lq), *A = malloc(sizeof(double) * (size_t)Lq * Lk);
            double *O = malloc(sizeof(double) * (size_t)Lq * c->dv);
            ref_asap_features(Lq, Lk, c->d, Q, K, sc, c->L, th, 0, Xr);
            for (int i = 0; i < Lq; i++) {
                double s = 0;
                for (int l = 0; l < c->L; l++) s += Xr[(size_t)i * c->L + l] * ly.omega[l];
                f[i] = s;
            }
            ref_asap_apply(Lq, Lk, c->d, c->dv, Q, K, V, sc, c->eps, f, v, A, O, NULL, NULL, NULL);
            if (v == 1) {
                ref_asap_teacher_dual(Lq, Lk, c->d, Q, K, sc, c->eps, c->S, yr, NULL);
                double sx = fmax(1.0, max_abs_d(Xr, (size_t)Lq * c->L)), sy = fmax(1.0, max_abs_d(yr, (size_t)Lq));
                for (int i = 0; i < Lq; i++) {
                    for (int l = 0; l < c->L; l++)
                        ef = fmax(ef, fabs(X[((size_t)p * c->Nq + i) * c->L + l] - Xr[(size_t)i * c->L + l]) / sx);
                    ey = fmax(ey, fabs(y[(size_t)p * c->Nq + i] - yr[i]) / sy);
                }
                for (int i = Lq; i < c->Nq; i++) {
                    ezero = fmax(ezero, fabs(y[(size_t)p * c->Nq + i]) + fabs(fh[(size_t)p * c->Nq + i]));
                    for (int l = 0; l < c->L; l++) ezero = fmax(ezero, fabs(X[((size_t)p * c->Nq + i) * c->L + l]));
                }
            }
            double so = fmax(1.0, max_abs_d(O, (size_t)Lq * c->dv)), sa = fmax(1.0, max_abs_d(A, (size_t)Lq * Lk));
            for (int i = 0; i < c->Nq; i++) {
                for (int e = 0; e < c->dv; e++) {
                    double x = Ob[(int64_t)i * t.to.stride_n + e];
                    if (i < Lq) eo[v] = fmax(eo[v], fabs(x - O[(size_t)i * c->dv + e]) / so);
                    else ezero = fmax(ezero, fabs(x));
                }
                for (int j = 0; j < c->Nk; j++) {
                    double x = Ab[(int64_t)i * t.ta.stride_n + j];
                    if (i < Lq && j < Lk) ea[v] = fmax(ea[v], fabs(x - A[(size_t)i * Lk + j]) / sa);
                    else ezero = fmax(ezero, fabs(x));
                }
            }
            free(Q); free(K); free(V); free(Xr); free(yr); free(f); free(A); free(O);
        }
    }
    if (ok) {
        /* the dual's scale: the features are O(s |q|^2), the plan's logits
         * (fhat - rho)/eps; float32 relative accuracy ~1e-6 of those */
        th_check(ef < 2e-5, name, "features vs reference: %.3g", ef);
        th_check(ey < 1e-4 * c->S, name, "teacher dual vs reference: %.3g", ey);
        for (int v = 1; v <= 3; v++) {
            char nv[200];
            snprintf(nv, sizeof nv, "%s variant %d", name, v);
            th_check(eo[v] < 1e-4 && ea[v] < 1e-4, nv, "O err %.3g, A err %.3g", eo[v], ea[v]);
        }
        th_check(ezero == 0, name, "padded rows/columns and empty problems must be exactly 0 (got %.3g)", ezero);
    }
    free(X); free(y); free(fh); free(th);
    bk_asap_layer_free(&ly);
    th_prob_free(&t);
}

static void test_asap_grid(void)
{
    th_rng r = {101};
    const acase cs[] = {
        {1, 1, 16, 16, 8, 8, 4, 20, 0, 0, 1.0f, 0},  {2, 2, 33, 33, 16, 8, 16, 10, 1, 1, 1.0f, 0},
        {1, 2, 12, 20, 8, 4, 8, 5, 0, 0, 0.5f, 0},   {2, 1, 20, 12, 4, 6, 1, 3, 0, 1, 2.0f, 0.3f},
        {3, 1, 9, 9, 8, 8, 32, 2, 1, 2, 1.0f, 0},    {1, 1, 1, 1, 4, 4, 4, 4, 0, 0, 1.0f, 0},
        {1, 1, 2, 3, 4, 4, 2, 7, 0, 0, 1.0f, 0},     {2, 3, 40, 40, 32, 16, 32, 20, 1, 1, 1.0f, 0},
    };
    const int n = TH.quick ? 4 : (int)(sizeof cs / sizeof cs[0]);
    for (int i = 0; i < n; i++) run_case(&cs[i], &r);
}

/* ---- properties on the float library ---------------------------------- */
static double colsum_err(const float *A, int64_t ld, int Lq, int Lk, double target)
{
    double e = 0;
    for (int j = 0; j < Lk; j++) {
        double s = 0;
        for (int i = 0; i < Lq; i++) s += A[(int64_t)i * ld + j];
        e = fmax(e, fabs(s - target));
    }
    return e;
}

static double rowsum_err(const float *A, int64_t ld, int Lq, int Lk)
{
    double e = 0;
    for (int i = 0; i < Lq; i++) {
        double s = 0;
        for (int j = 0; j < Lk; j++) s += A[(int64_t)i * ld + j];
        e = fmax(e, fabs(s - 1.0));
    }
    return e;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static void test_asap_properties(void)
{
    th_rng r = {202};
    const int H = 2, N = 24, M = 18, d = 8, dv = 5, L = 8, P = H;
    th_prob t;
    th_prob_init(&t, 1, H, N, M, d, dv, 0, 0, 0.9, &r);
    bk_asap_layer ly = make_layer(d, L, 1.0f / sqrtf((float)d), 1.0f, 10, &r, 1.0);
    const size_t na = (size_t)P * N * M, no = (size_t)P * N * dv;
    float *A1 = malloc(na * 4), *A2 = malloc(na * 4), *O1 = malloc(no * 4), *O2 = malloc(no * 4);
    float *f = malloc(sizeof(float) * P * N), *y = malloc(sizeof(float) * P * N);
    bk_tensor ta1 = bk_tensor_bhnd(A1, H, N, M), ta2 = bk_tensor_bhnd(A2, H, N, M);
    bk_tensor to1 = bk_tensor_bhnd(O1, H, N, dv), to2 = bk_tensor_bhnd(O2, H, N, dv);
    for (int i = 0; i < P * N; i++) f[i] = (float)(3.0 * th_normal(&r));
    /* 3, 7: column exactness of T_K for any f; rows exact for the row ending */
    double ce = 0, re = 0;
    for (int v = 1; v <= 3; v++) {
        bk_asap_extras ex = {ta1, NULL, NULL};
        bk_asap_close(&t.desc, &ly, (bk_asap_variant)v, f, &t.tq, &t.tk, &t.tv, &to1, &ex, NULL, 0);
        for (int p = 0; p < P; p++) {
            const float *Ab = A1 + (size_t)p * N * M;
            if (v != 3) ce = fmax(ce, colsum_err(Ab, M, N, M, (double)N / M));
            else re = fmax(re, rowsum_err(Ab, M, N, M));
        }
    }
    th_check(ce < 2e-5 && re < 2e-5, "asap column exactness (any f) / row ending rows exact", "col %.3g row %.3g", ce, re);
    /* 4: shift invariance */
    double sh = 0;
    for (int v = 1; v <= 3; v++) {
        bk_asap_extras e1 = {ta1, NULL, NULL}, e2 = {ta2, NULL, NULL};
        float *g = malloc(sizeof(float) * P * N);
        for (int i = 0; i < P * N; i++) g[i] = f[i] + 5.0f;
        bk_asap_close(&t.desc, &ly, (bk_asap_variant)v, f, &t.tq, &t.tk, &t.tv, &to1, &e1, NULL, 0);
        bk_asap_close(&t.desc, &ly, (bk_asap_variant)v, g, &t.tq, &t.tk, &t.tv, &to2, &e2, NULL, 0);
        sh = fmax(sh, max_diff(A1, A2, na));
        free(g);
    }
    th_check(sh < 1e-5, "asap shift invariance f -> f + c", "max |dA| %.3g", sh);
    /* 17: the teacher's exact dual reproduces the teacher (even S: ASAP-0 =
     * teacher(S), column-ending = Sinkhorn(S+2); odd S: row-ending = teacher) */
    for (int S = 2; S <= 7; S++) {
        bk_asap_config cfg = bk_asap_config_default(d);
        cfg.teacher_iters = S;
        ly.teacher_iters = S;
        bk_asap_teacher_dual(&t.desc, &cfg, &t.tq, &t.tk, y);
        bk_sinkhorn_config sp = bk_sinkhorn_config_default();
        sp.iters = S;
        bk_sinkhorn_extras sx = {ta2, NULL, NULL, NULL};
        bk_sinkhorn_forward(&t.desc, &sp, &t.tq, &t.tk, &t.tv, &to2, NULL, &sx, NULL, 0);
        bk_asap_extras ex = {ta1, NULL, NULL};
        bk_asap_close(&t.desc, &ly, S % 2 ? BK_ASAP_ROW : BK_ASAP_ZERO, y, &t.tq, &t.tk, &t.tv, &to1, &ex, NULL, 0);
        double e1 = max_diff(A1, A2, na), eo = max_diff(O1, O2, no);
        char nm[96];
        snprintf(nm, sizeof nm, "asap exact teacher dual reproduces the teacher (S=%d, %s)", S, S % 2 ? "row-ending" : "asap0");
        th_check(e1 < 5e-5 && eo < 5e-5, nm, "max |dA| %.3g |dO| %.3g", e1, eo);
        bk_asap_close(&t.desc, &ly, BK_ASAP_AUTO, y, &t.tq, &t.tk, &t.tv, &to1, &ex, NULL, 0);
        if (S % 2 == 0) {
            sp.iters = S + 2;
            bk_sinkhorn_forward(&t.desc, &sp, &t.tq, &t.tk, &t.tv, &to2, NULL, &sx, NULL, 0);
            snprintf(nm, sizeof nm, "asap column-ending on the exact dual = Sinkhorn S+2 (S=%d)", S);
        } else {
            snprintf(nm, sizeof nm, "asap auto = row ending for odd S (S=%d)", S);
        }
        e1 = max_diff(A1, A2, na);
        th_check(e1 < 5e-5, nm, "max |dA| %.3g", e1);
    }
    ly.teacher_iters = 10;
    /* 15: permutation equivariance (queries and keys permuted independently; keys with their values) */
    {
        int *pq = malloc(sizeof(int) * N), *pk = malloc(sizeof(int) * M);
        for (int i = 0; i < N; i++) pq[i] = i;
        for (int j = 0; j < M; j++) pk[j] = j;
        for (int i = N - 1; i > 0; i--) { int j = (int)(th_next(&r) % (uint64_t)(i + 1)), s = pq[i]; pq[i] = pq[j]; pq[j] = s; }
        for (int i = M - 1; i > 0; i--) { int j = (int)(th_next(&r) % (uint64_t)(i + 1)), s = pk[i]; pk[i] = pk[j]; pk[j] = s; }
        float *q2 = malloc(sizeof(float) * P * N * d), *k2 = malloc(sizeof(float) * P * M * d), *v2 = malloc(sizeof(float) * P * M * dv);
        for (int p = 0; p < P; p++) {
            for (int i = 0; i < N; i++) memcpy(q2 + ((size_t)p * N + i) * d, t.tq.data + p * t.tq.stride_h + (int64_t)pq[i] * t.tq.stride_n, sizeof(float) * d);
            for (int j = 0; j < M; j++) {
                memcpy(k2 + ((size_t)p * M + j) * d, t.tk.data + p * t.tk.stride_h + (int64_t)pk[j] * t.tk.stride_n, sizeof(float) * d);
                memcpy(v2 + ((size_t)p * M + j) * dv, t.tv.data + p * t.tv.stride_h + (int64_t)pk[j] * t.tv.stride_n, sizeof(float) * dv);
            }
        }
        /* a tie: query 1 duplicates query 0 (in both orders) */
        bk_tensor tq2 = bk_tensor_bhnd(q2, H, N, d), tk2 = bk_tensor_bhnd(k2, H, M, d), tv2 = bk_tensor_bhnd(v2, H, M, dv);
        double e = 0;
        for (int v = 1; v <= 3; v++) {
            bk_asap_extras e1 = {ta1, NULL, NULL}, e2 = {ta2, NULL, NULL};
            bk_asap_forward(&t.desc, &ly, (bk_asap_variant)v, &t.tq, &t.tk, &t.tv, &to1, &e1, NULL, 0);
            bk_asap_forward(&t.desc, &ly, (bk_asap_variant)v, &tq2, &tk2, &tv2, &to2, &e2, NULL, 0);
            for (int p = 0; p < P; p++)
                for (int i = 0; i < N; i++) {
                    for (int c = 0; c < dv; c++)
                        e = fmax(e, fabs(O2[((size_t)p * N + i) * dv + c] - O1[((size_t)p * N + pq[i]) * dv + c]));
                    for (int j = 0; j < M; j++)
                        e = fmax(e, fabs(A2[((size_t)p * N + i) * M + j] - A1[((size_t)p * N + pq[i]) * M + pk[j]]));
                }
        }
        th_check(e < 2e-5, "asap permutation equivariance (Q, K, V permuted)", "max err %.3g", e);
        /* ties: duplicated queries get equal features */
        for (int p = 0; p < P; p++) memcpy(q2 + ((size_t)p * N + 1) * d, q2 + (size_t)p * N * d, sizeof(float) * d);
        float *X = malloc(sizeof(float) * P * N * L);
        bk_asap_features(&t.desc, &ly, &tq2, &tk2, X);
        double et = 0;
        for (int p = 0; p < P; p++)
            for (int l = 0; l < L; l++) et = fmax(et, fabs(X[((size_t)p * N) * L + l] - X[((size_t)p * N + 1) * L + l]));
        th_check(et == 0, "asap tied queries get equal features", "max diff %.3g", et);
        free(X); free(pq); free(pk); free(q2); free(k2); free(v2);
    }
    /* features are centred over valid rows */
    {
        float *X = malloc(sizeof(float) * P * N * L);
        bk_asap_features(&t.desc, &ly, &t.tq, &t.tk, X);
        double m = 0;
        for (int p = 0; p < P; p++)
            for (int l = 0; l < L; l++) {
                double s = 0, a = 0;
                for (int i = 0; i < N; i++) { s += X[((size_t)p * N + i) * L + l]; a += fabs(X[((size_t)p * N + i) * L + l]); }
                m = fmax(m, fabs(s) / (a + 1e-30));
            }
        th_check(m < 1e-5, "asap feature columns are centred", "max |mean|/mean|x| %.3g", m);
        free(X);
    }
    free(A1); free(A2); free(O1); free(O2); free(f); free(y);
    bk_asap_layer_free(&ly);
    th_prob_free(&t);
}

/* ---- calibration vs the reference's fits -------------------------------- */
static void test_asap_calibration(void)
{
    th_rng r = {303};
    const int B = 3, H = 2, N = 20, d = 8, L = 6, S = 10;
    th_prob t;
    th_prob_init(&t, B, H, N, N, d, 4, 0, 1, 0.9, &r);
    bk_asap_config cfg = bk_asap_config_default(d);
    cfg.slices = L;
    cfg.teacher_iters = S;
    cfg.seed = 7;
    for (int fit = 0; fit <= 1; fit++) {
        bk_asap_calib *c = NULL;
        bk_asap_layer ly;
        bk_asap_fit_report rep;
        int ok = bk_asap_calib_create(&cfg, fit, &c) == BK_OK && bk_asap_calib_add(c, &t.desc, &t.tq, &t.tk) == BK_OK &&
                 bk_asap_calib_fit(c, (bk_asap_fit)fit, NULL, &ly, &rep) == BK_OK;
        if (!th_check(ok, "asap calibration runs", "%s", bk_last_error())) {
            bk_asap_calib_free(c);
            continue;
        }
        /* the reference fit on the same problems and bank */
        double *th = theta_d(&ly);
        ref_asap_prob pr[6];
        double *bufs[6][4];
        int M = 0;
        const float sc = 1.0f / sqrtf((float)d);
        for (int p = 0; p < B * H; p++) {
            const int b = p / H, h = p % H, Lq = t.desc.q_len[b], Lk = t.desc.k_len[b];
            if (Lq == 0 || Lk == 0) continue;
            double *Q = rows_of(&t.tq, b, h, Lq, d), *K = rows_of(&t.tk, b, h, Lk, d);
            double *X = malloc(sizeof(double) * (size_t)Lq * L), *y = malloc(sizeof(double) * (size_t)Lq);
            ref_asap_features(Lq, Lk, d, Q, K, sc, L, th, 0, X);
            ref_asap_teacher_dual(Lq, Lk, d, Q, K, sc, 1.0, S, y, NULL);
            pr[M] = (ref_asap_prob){Lq, Lk, Q, K, X, y};
            bufs[M][0] = Q; bufs[M][1] = K; bufs[M][2] = X; bufs[M][3] = y;
            M++;
        }
        double w[8], rmse, r2;
        ref_asap_fit_ls(M, pr, L, cfg.lambda, w, &rmse, &r2);
        if (fit) ref_asap_fit_kl(M, pr, d, L, sc, 1.0, cfg.lambda, NULL, 50, 1e-12, w, NULL, NULL, NULL);
        double e = 0, wn = 0;
        for (int l = 0; l < L; l++) {
            e = fmax(e, fabs(ly.omega[l] - w[l]));
            wn = fmax(wn, fabs(w[l]));
        }
        char nm[96];
        snprintf(nm, sizeof nm, "asap %s omega vs reference fit", fit ? "KL" : "LS");
        th_check(e / fmax(wn, 1e-3) < 2e-3, nm, "max |d omega| / max |omega| = %.3g", e / fmax(wn, 1e-3));
        if (!fit)
            th_check(fabs(rep.ls_rmse - rmse) < 1e-3 * (rmse + 1e-3) && fabs(rep.ls_r2 - r2) < 1e-4, "asap LS report",
                     "rmse %.6g vs %.6g, r2 %.6g vs %.6g", rep.ls_rmse, rmse, rep.ls_r2, r2);
        else {
            double g[8];
            ref_asap_kl_eval(M, pr, d, L, sc, 1.0, cfg.lambda, ly.omega, g, NULL);
            double gm = 0;
            for (int l = 0; l < L; l++) gm = fmax(gm, fabs(g[l]));
            th_check(rep.kl_converged && rep.kl_j <= rep.kl_j0 + 1e-9 && gm < 1e-4, "asap KL: converged, decreased J, "
                     "reference gradient ~ 0 at the fit", "conv %d J %.9g -> %.9g, |grad| %.3g", rep.kl_converged,
                     rep.kl_j0, rep.kl_j, gm);
        }
        for (int m = 0; m < M; m++)
            for (int z = 0; z < 4; z++) free(bufs[m][z]);
        free(th);
        bk_asap_calib_free(c);
        bk_asap_layer_free(&ly);
    }
    th_prob_free(&t);
}

/* ---- determinism, padding == truncation -------------------------------- */
static void fit_omega(const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k, int fit, double *w, int L)
{
    bk_asap_config cfg = bk_asap_config_default(d->d);
    cfg.slices = L;
    cfg.teacher_iters = 6;
    bk_asap_calib *c = NULL;
    bk_asap_layer ly;
    memset(&ly, 0, sizeof ly);
    bk_asap_calib_create(&cfg, fit, &c);
    bk_asap_calib_add(c, d, q, k);
    if (bk_asap_calib_fit(c, (bk_asap_fit)fit, NULL, &ly, NULL) == BK_OK) memcpy(w, ly.omega, sizeof(double) * L);
    else for (int l = 0; l < L; l++) w[l] = NAN;
    bk_asap_calib_free(c);
    bk_asap_layer_free(&ly);
}

static void test_asap_determinism(void)
{
    th_rng r = {404};
    const int B = 3, H = 2, N = 30, d = 8, dv = 4, L = 5;
    th_prob t;
    th_prob_init(&t, B, H, N, N, d, dv, 1, 1, 0.9, &r);
    bk_asap_layer ly = make_layer(d, L, 1.0f / sqrtf((float)d), 1.0f, 6, &r, 1.0);
    const size_t no = (size_t)B * H * N * dv;
    float *ref = malloc(no * 4);
    double w0[2][5], w1[5];
    int same = 1, wsame = 1;
    for (int nt = 1; nt <= 3; nt++) {
        bk_set_num_threads(nt);
        bk_asap_forward(&t.desc, &ly, BK_ASAP_AUTO, &t.tq, &t.tk, &t.tv, &t.to, NULL, NULL, 0);
        float *o = malloc(no * 4);
        for (int b = 0; b < B; b++)
            for (int n = 0; n < N; n++)
                for (int h = 0; h < H; h++)
                    memcpy(o + (((size_t)b * H + h) * N + n) * dv, t.to.data + b * t.to.stride_b + h * t.to.stride_h + n * t.to.stride_n, dv * 4);
        if (nt == 1) memcpy(ref, o, no * 4);
        else same &= memcmp(ref, o, no * 4) == 0;
        free(o);
        for (int fit = 0; fit <= 1; fit++) {
            fit_omega(&t.desc, &t.tq, &t.tk, fit, nt == 1 ? w0[fit] : w1, L);
            if (nt > 1) wsame &= memcmp(w0[fit], w1, sizeof w1) == 0;
        }
    }
    bk_set_num_threads(0);
    th_check(same, "asap forward bitwise identical for 1..3 threads", "%s", "");
    th_check(wsame, "asap LS and KL fits bitwise identical for 1..3 threads", "%s", "");
    /* padding == truncation: batch entry b alone, truncated to its lengths */
    int pad_ok = 1, fit_ok = 1;
    for (int b = 0; b < B; b++) {
        const int Lq = t.desc.q_len[b], Lk = t.desc.k_len[b];
        if (Lq == 0 || Lk == 0) continue;
        bk_attn_desc dt = {1, H, Lq, Lk, d, dv, NULL, NULL};
        bk_tensor q1 = t.tq, k1 = t.tk, v1 = t.tv;
        q1.data += b * t.tq.stride_b;
        k1.data += b * t.tk.stride_b;
        v1.data += b * t.tv.stride_b;
        float *o = malloc(sizeof(float) * H * Lq * dv);
        bk_tensor to = bk_tensor_bhnd(o, H, Lq, dv);
        bk_asap_forward(&dt, &ly, BK_ASAP_AUTO, &q1, &k1, &v1, &to, NULL, NULL, 0);
        for (int h = 0; h < H; h++)
            for (int i = 0; i < Lq; i++)
                pad_ok &= memcmp(o + ((size_t)h * Lq + i) * dv, ref + (((size_t)b * H + h) * N + i) * dv, dv * 4) == 0;
        free(o);
    }
    /* the fit on the padded batch equals the fit on the truncated problems added one by one */
    {
        bk_asap_config cfg = bk_asap_config_default(d);
        cfg.slices = L;
        cfg.teacher_iters = 6;
        bk_asap_calib *c = NULL;
        bk_asap_layer ly2;
        bk_asap_calib_create(&cfg, 0, &c);
        for (int b = 0; b < B; b++) {
            const int Lq = t.desc.q_len[b], Lk = t.desc.k_len[b];
            if (Lq == 0 || Lk == 0) continue;
            bk_attn_desc dt = {1, H, Lq, Lk, d, 1, NULL, NULL};
            bk_tensor q1 = t.tq, k1 = t.tk;
            q1.data += b * t.tq.stride_b;
            k1.data += b * t.tk.stride_b;
            bk_asap_calib_add(c, &dt, &q1, &k1);
        }
        bk_asap_calib_fit(c, BK_ASAP_FIT_LS, NULL, &ly2, NULL);
        fit_ok = memcmp(ly2.omega, w0[0], sizeof(double) * L) == 0;
        bk_asap_calib_free(c);
        bk_asap_layer_free(&ly2);
    }
    th_check(pad_ok, "asap padding == truncation (bitwise)", "%s", "");
    th_check(fit_ok, "asap LS fit: padded batch == truncated problems (bitwise)", "%s", "");
    free(ref);
    bk_asap_layer_free(&ly);
    th_prob_free(&t);
}

/* ---- the parallel model: thread counts and batch shapes (bitwise) -------- *
 * Every output of every ASAP entry point (the three forward variants, close,
 * the teacher dual, the features, the fidelity metrics, the LS and KL fits)
 * must be bitwise the same at 1, 2, 3, 5 and 8 threads, for one problem large
 * enough to run as a team and for a batch, and a problem must give the same
 * bytes alone, as one of 3 and as one of 16 problems (padded, with lengths). */

#define DA_L 8 /* slices          */
#define DA_S 6 /* teacher's steps */
#define DA_OUTS 4 /* ASAP-0, column-ending, row-ending (forward), close (auto) */

typedef struct {
    bk_attn_desc d;
    int32_t ql[16], kl[16];
    float *q, *k, *v, *fin;                      /* fin: the dual given to close     */
    float *o[DA_OUTS], *a[DA_OUTS], *fh[DA_OUTS];
    bk_sinkhorn_diag dg[DA_OUTS][16];
    float *y, *X;
    bk_attn_fidelity fid;
    double w[2][DA_L];                           /* LS and KL fits on this batch     */
    bk_status st[10];
    bk_asap_layer ly;                            /* the same layer for every batch   */
} aprob;

static size_t ap_P(const aprob *x) { return (size_t)x->d.B * x->d.H; }

/* B x H problems of Nq x Nk (head dims d, dv); entry 0 has lengths (Lq, Lk),
 * the others random lengths in [N/2, N]; inputs N(0, 0.8^2) everywhere
 * (padded rows too: they must not matter); outputs prefilled with -7. */
static void ap_init(aprob *x, int B, int H, int Nq, int Nk, int d, int dv, int Lq, int Lk, uint64_t seed)
{
    memset(x, 0, sizeof *x);
    th_rng r = {seed}, lr = {777};
    x->d = (bk_attn_desc){B, H, Nq, Nk, d, dv, x->ql, x->kl};
    for (int b = 0; b < B; b++) {
        x->ql[b] = b == 0 ? Lq : Nq / 2 + (int)(th_next(&r) % (uint64_t)(Nq - Nq / 2 + 1));
        x->kl[b] = b == 0 ? Lk : Nk / 2 + (int)(th_next(&r) % (uint64_t)(Nk - Nk / 2 + 1));
    }
    const size_t P = ap_P(x);
    x->q = malloc(sizeof(float) * P * Nq * d);
    x->k = malloc(sizeof(float) * P * Nk * d);
    x->v = malloc(sizeof(float) * P * Nk * dv);
    x->fin = malloc(sizeof(float) * P * Nq);
    for (size_t i = 0; i < P * Nq * d; i++) x->q[i] = (float)(0.8 * th_normal(&r));
    for (size_t i = 0; i < P * Nk * d; i++) x->k[i] = (float)(0.8 * th_normal(&r));
    for (size_t i = 0; i < P * Nk * dv; i++) x->v[i] = (float)th_normal(&r);
    for (size_t i = 0; i < P * Nq; i++) x->fin[i] = (float)(2.0 * th_normal(&r));
    for (int o = 0; o < DA_OUTS; o++) {
        x->o[o] = th_alloc_fill(P * Nq * dv, -7.0f);
        x->a[o] = th_alloc_fill(P * Nq * Nk, -7.0f);
        x->fh[o] = th_alloc_fill(P * Nq, -7.0f);
    }
    x->y = th_alloc_fill(P * Nq, -7.0f);
    x->X = th_alloc_fill(P * Nq * DA_L, -7.0f);
    x->ly = make_layer(d, DA_L, 1.0f / sqrtf((float)d), 1.0f, DA_S, &lr, 1.0);
}

static void ap_free(aprob *x)
{
    free(x->q); free(x->k); free(x->v); free(x->fin);
    for (int o = 0; o < DA_OUTS; o++) { free(x->o[o]); free(x->a[o]); free(x->fh[o]); }
    free(x->y); free(x->X);
    bk_asap_layer_free(&x->ly);
}

static bk_tensor ap_t(float *p, const aprob *x, int N, int C) { return bk_tensor_bhnd(p, x->d.H, N, C); }

/* LS and KL fits (keep_kl) on the problems of desc d, added in one call */
static bk_status ap_fit(const bk_attn_desc *d, const bk_tensor *tq, const bk_tensor *tk, int nadd, double w[2][DA_L])
{
    bk_asap_config cfg = bk_asap_config_default(d->d);
    cfg.slices = DA_L;
    cfg.teacher_iters = DA_S;
    cfg.seed = 5;
    bk_asap_calib *c = NULL;
    bk_status s = bk_asap_calib_create(&cfg, 1, &c);
    /* nadd > 0: the B x H problems added one at a time, each alone (B = H = 1) */
    for (int p = 0; p < (nadd ? nadd : 1) && !s; p++) {
        if (!nadd) {
            s = bk_asap_calib_add(c, d, tq, tk);
            continue;
        }
        const int b = p / d->H, h = p % d->H;
        bk_attn_desc d1 = {1, 1, d->Nq, d->Nk, d->d, d->dv, d->q_len + b, d->k_len + b};
        bk_tensor q1 = *tq, k1 = *tk;
        q1.data += b * tq->stride_b + h * tq->stride_h;
        k1.data += b * tk->stride_b + h * tk->stride_h;
        s = bk_asap_calib_add(c, &d1, &q1, &k1);
    }
    for (int f = 0; f <= 1 && !s; f++) {
        bk_asap_layer ly;
        if (!(s = bk_asap_calib_fit(c, (bk_asap_fit)f, NULL, &ly, NULL))) memcpy(w[f], ly.omega, sizeof(double) * DA_L);
        bk_asap_layer_free(&ly);
    }
    bk_asap_calib_free(c);
    return s;
}

static void ap_run(void *ctx)
{
    aprob *x = ctx;
    const bk_attn_desc *d = &x->d;
    bk_tensor tq = ap_t(x->q, x, d->Nq, d->d), tk = ap_t(x->k, x, d->Nk, d->d), tv = ap_t(x->v, x, d->Nk, d->dv);
    for (int o = 0; o < DA_OUTS; o++) {
        bk_tensor to = ap_t(x->o[o], x, d->Nq, d->dv);
        bk_asap_extras ex = {ap_t(x->a[o], x, d->Nq, d->Nk), x->fh[o], x->dg[o]};
        x->st[o] = o < 3 ? bk_asap_forward(d, &x->ly, (bk_asap_variant)(o + 1), &tq, &tk, &tv, &to, &ex, NULL, 0)
                         : bk_asap_close(d, &x->ly, BK_ASAP_AUTO, x->fin, &tq, &tk, &tv, &to, &ex, NULL, 0);
    }
    bk_asap_config cfg = bk_asap_config_default(d->d);
    cfg.teacher_iters = DA_S;
    x->st[4] = bk_asap_teacher_dual(d, &cfg, &tq, &tk, x->y);
    x->st[5] = bk_asap_features(d, &x->ly, &tq, &tk, x->X);
    bk_tensor o0 = ap_t(x->o[0], x, d->Nq, d->dv), o2 = ap_t(x->o[2], x, d->Nq, d->dv);
    bk_tensor a0 = ap_t(x->a[0], x, d->Nq, d->Nk), a2 = ap_t(x->a[2], x, d->Nq, d->Nk);
    x->st[6] = bk_attn_compare(d, &o0, &o2, &a0, &a2, &x->fid);
    x->st[7] = ap_fit(d, &tq, &tk, 0, x->w);
}

static int ap_ok(const aprob *x)
{
    for (int i = 0; i < 8; i++)
        if (x->st[i] != BK_OK) return 0;
    return 1;
}

/* problem (b, h) of y equals problem (0, 0) of x, bitwise, in every output */
static int ap_same_problem(const aprob *x, const aprob *y, int b, int h)
{
    const bk_attn_desc *d = &x->d;
    const size_t py = (size_t)b * y->d.H + h;
    int ok = 1;
    for (int o = 0; o < DA_OUTS; o++) {
        bk_tensor xo = ap_t(x->o[o], x, d->Nq, d->dv), yo = ap_t(y->o[o], y, d->Nq, d->dv);
        bk_tensor xa = ap_t(x->a[o], x, d->Nq, d->Nk), ya = ap_t(y->a[o], y, d->Nq, d->Nk);
        ok = ok && th_slice_same(&xo, 0, 0, &yo, b, h, d->Nq, d->dv) && th_slice_same(&xa, 0, 0, &ya, b, h, d->Nq, d->Nk);
        ok = ok && memcmp(x->fh[o], y->fh[o] + py * d->Nq, sizeof(float) * d->Nq) == 0;
        ok = ok && memcmp(&x->dg[o][0], &y->dg[o][py], sizeof(bk_sinkhorn_diag)) == 0;
    }
    ok = ok && memcmp(x->y, y->y + py * d->Nq, sizeof(float) * d->Nq) == 0;
    ok = ok && memcmp(x->X, y->X + py * d->Nq * DA_L, sizeof(float) * d->Nq * DA_L) == 0;
    return ok && ap_ok(x) && ap_ok(y);
}

/* copies problem (0, 0) of x into problem (b, h) of y: the valid rows of its
 * inputs and its dual, and the lengths of entry b (y's other heads of entry
 * b keep their data: every row of them is finite) */
static void ap_plant(const aprob *x, aprob *y, int b, int h)
{
    const bk_attn_desc *d = &x->d;
    const size_t py = (size_t)b * y->d.H + h;
    y->ql[b] = x->ql[0];
    y->kl[b] = x->kl[0];
    memcpy(y->q + py * d->Nq * d->d, x->q, sizeof(float) * (size_t)x->ql[0] * d->d);
    memcpy(y->k + py * d->Nk * d->d, x->k, sizeof(float) * (size_t)x->kl[0] * d->d);
    memcpy(y->v + py * d->Nk * d->dv, x->v, sizeof(float) * (size_t)x->kl[0] * d->dv);
    memcpy(y->fin + py * d->Nq, x->fin, sizeof(float) * (size_t)x->ql[0]);
}

static void test_asap_parallel(void)
{
    /* one problem large enough to run as a team (264 x 260), padded to valid lengths whose
     * engine row blocks are more numerous than the padded shape's (255 queries: 64 blocks of
     * 4, 264: 53 of 5; 251 keys: 63 of 4, 260: 52 of 5): the lanes must hold the larger
     * scratch, for the teacher (rows = queries) and for the closure (rows = keys) */
    const int Nq = 264, Nk = 260, d = 16, dv = 12, Lq = 255, Lk = 251;
    {
        const bk_attn_desc one = {1, 1, Nq, Nk, d, dv, NULL, NULL}, rec = {1, 1, Lq, Lk, d, 1, NULL, NULL};
        int team = 1;
        for (int t = 1; t < TH_NTHREADS; t++) {
            bk_set_num_threads(th_threads[t]);
            /* the operator, features and fits (L slices), the teacher alone (0),
             * the KL objective's one record, the fidelity metrics */
            team &= bki_asap_plan(&one, DA_L).team && bki_asap_plan(&one, 0).team && bki_asap_plan(&rec, DA_L).team &&
                    bki_plan_problems(1, (double)Nq * Nk).team;
        }
        bk_set_num_threads(0);
        th_check(team, "asap: a single 264 x 260 problem runs as a team at 2, 3, 5, 8 threads", "%s", "");
    }
    /* (a) thread counts: the single problem (a team), and a batch of 6 */
    const int shapes[2][2] = {{1, 1}, {3, 2}};
    for (int si = 0; si < 2; si++) {
        aprob x;
        ap_init(&x, shapes[si][0], shapes[si][1], Nq, Nk, d, dv, Lq, Lk, 41 + si);
        const size_t P = ap_P(&x);
        th_span sp[4 * DA_OUTS + 5];
        int n = 0;
        for (int o = 0; o < DA_OUTS; o++) {
            sp[n++] = (th_span){x.o[o], sizeof(float) * P * Nq * dv};
            sp[n++] = (th_span){x.a[o], sizeof(float) * P * Nq * Nk};
            sp[n++] = (th_span){x.fh[o], sizeof(float) * P * Nq};
            sp[n++] = (th_span){x.dg[o], sizeof(bk_sinkhorn_diag) * P};
        }
        sp[n++] = (th_span){x.y, sizeof(float) * P * Nq};
        sp[n++] = (th_span){x.X, sizeof(float) * P * Nq * DA_L};
        sp[n++] = (th_span){&x.fid, offsetof(bk_attn_fidelity, problems) + sizeof(int)};
        sp[n++] = (th_span){x.w, sizeof x.w};
        sp[n++] = (th_span){x.st, sizeof x.st};
        char name[200];
        snprintf(name, sizeof name, "asap: forward x3, close, teacher dual, features, compare, LS and KL fits bitwise "
                 "identical at 1, 2, 3, 5, 8 threads (B=%d H=%d)", shapes[si][0], shapes[si][1]);
        th_same_over_threads(name, ap_run, &x, sp, n);
        th_check(ap_ok(&x), name, "a call failed: %s", bk_last_error());
        ap_free(&x);
    }
    /* (b) batch shapes: the problem alone, as one of 3 and as one of 16 */
    aprob x;
    ap_init(&x, 1, 1, Nq, Nk, d, dv, Lq, Lk, 141);
    ap_run(&x);
    const int batches[2][4] = {{1, 3, 0, 2}, {4, 4, 2, 1}}; /* B, H, b, h of the planted problem */
    for (int bi = 0; bi < 2; bi++) {
        for (int nt = 1; nt <= 2; nt++) {
            aprob y;
            ap_init(&y, batches[bi][0], batches[bi][1], Nq, Nk, d, dv, Lq, Lk, 241 + bi);
            ap_plant(&x, &y, batches[bi][2], batches[bi][3]);
            if (bi == 1) y.ql[3] = 0; /* an empty problem in the batch too */
            bk_set_num_threads(nt);
            ap_run(&y);
            char name[160];
            snprintf(name, sizeof name, "asap: a problem alone == the same problem in a batch of %d (%d threads)",
                     batches[bi][0] * batches[bi][1], nt);
            th_check(ap_same_problem(&x, &y, batches[bi][2], batches[bi][3]), name, "outputs differ (%s)",
                     bk_last_error());
            /* the batch's fits == the fits of its problems added alone, in order */
            double w1[2][DA_L];
            bk_tensor tq = ap_t(y.q, &y, Nq, d), tk = ap_t(y.k, &y, Nk, d);
            bk_status s = ap_fit(&y.d, &tq, &tk, (int)ap_P(&y), w1);
            bk_set_num_threads(0);
            snprintf(name, sizeof name, "asap: LS and KL fits of a batch of %d == of its problems added alone (%d "
                     "threads)", batches[bi][0] * batches[bi][1], nt);
            th_check(s == BK_OK && memcmp(w1, y.w, sizeof w1) == 0, name, "%s", s ? bk_last_error() : "fits differ");
            ap_free(&y);
        }
    }
    ap_free(&x);
}

/* ---- layer file ---------------------------------------------------------- */
static int write_bytes(const char *path, const unsigned char *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(b, 1, n, f) == n;
    return (fclose(f) == 0) && ok;
}

static void test_asap_file(void)
{
    th_rng r = {505};
    bk_asap_layer ly = make_layer(6, 5, 0.4f, 0.7f, 12, &r, 2.0), back;
    ly.fit = BK_ASAP_FIT_KL;
    ly.seed = 99;
    ly.calib_problems = 17;
    ly.calib_rows = 300;
    char path[64], bad[64];
    snprintf(path, sizeof path, "/tmp/bk_test_asap_%ld.asap", (long)getpid());
    snprintf(bad, sizeof bad, "/tmp/bk_test_asap_%ld.bad", (long)getpid());
    int ok = bk_asap_save(path, &ly) == BK_OK && bk_asap_load(path, &back) == BK_OK;
    if (th_check(ok, "asap layer save/load", "%s", bk_last_error())) {
        int same = back.d == 6 && back.slices == 5 && back.scale == 0.4f && back.eps == 0.7f &&
                   back.teacher_iters == 12 && back.fit == BK_ASAP_FIT_KL && back.seed == 99 &&
                   back.calib_problems == 17 && back.calib_rows == 300 &&
                   !memcmp(back.theta, ly.theta, sizeof(float) * 30) && !memcmp(back.omega, ly.omega, sizeof(double) * 5);
        th_check(same, "asap layer round trip is exact", "%s", "");
        bk_asap_layer_free(&back);
    }
    FILE *f = fopen(path, "rb");
    unsigned char buf[4096];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    /* a flipped byte in the payload -> checksum */
    buf[120] ^= 0x40;
    write_bytes(bad, buf, n);
    bk_status s = bk_asap_load(bad, &back);
    th_check(s == BK_ERR_FORMAT && strstr(bk_last_error(), "checksum"), "asap corrupt layer refused", "%s", bk_last_error());
    buf[120] ^= 0x40;
    /* a truncated file */
    write_bytes(bad, buf, n - 9);
    s = bk_asap_load(bad, &back);
    th_check(s == BK_ERR_FORMAT && strstr(bk_last_error(), "shorter"), "asap truncated layer refused", "%s", bk_last_error());
    /* another format version */
    buf[8] = 2;
    write_bytes(bad, buf, n);
    s = bk_asap_load(bad, &back);
    th_check(s == BK_ERR_FORMAT && strstr(bk_last_error(), "version 2"), "asap layer version mismatch refused", "%s",
             bk_last_error());
    buf[8] = 1;
    /* not a layer */
    write_bytes(bad, (const unsigned char *)"\x93NUMPY....", 10);
    s = bk_asap_load(bad, &back);
    th_check(s == BK_ERR_FORMAT && strstr(bk_last_error(), "magic"), "asap foreign file refused", "%s", bk_last_error());
    s = bk_asap_load("/nonexistent/x.asap", &back);
    th_check(s == BK_ERR_IO, "asap missing file -> BK_ERR_IO", "%s", bk_last_error());
    remove(path);
    remove(bad);
    bk_asap_layer_free(&ly);
}

/* ---- bad input ------------------------------------------------------------ */
static void test_asap_bad_input(void)
{
    th_rng r = {606};
    th_prob t;
    th_prob_init(&t, 1, 1, 8, 8, 4, 4, 0, 0, 1.0, &r);
    bk_asap_calib *c = NULL;
    bk_asap_config cfg = bk_asap_config_default(4);
    cfg.slices = 0;
    th_check(bk_asap_calib_create(&cfg, 0, &c) == BK_ERR_PARAM, "asap L < 1 refused", "%s", bk_last_error());
    cfg = bk_asap_config_default(4);
    cfg.lambda = -1;
    th_check(bk_asap_calib_create(&cfg, 0, &c) == BK_ERR_PARAM, "asap lambda < 0 refused", "%s", bk_last_error());
    cfg = bk_asap_config_default(4);
    cfg.teacher_iters = 1;
    th_check(bk_asap_calib_create(&cfg, 0, &c) == BK_ERR_PARAM && strstr(bk_last_error(), "softmax"),
             "asap S = 1 refused", "%s", bk_last_error());
    cfg = bk_asap_config_default(4);
    cfg.eps = 0;
    th_check(bk_asap_calib_create(&cfg, 0, &c) == BK_ERR_PARAM, "asap eps = 0 refused", "%s", bk_last_error());
    cfg = bk_asap_config_default(4);
    bk_asap_layer ly;
    th_check(bk_asap_calib_create(&cfg, 0, &c) == BK_OK, "asap calib create", "%s", bk_last_error());
    th_check(bk_asap_calib_fit(c, BK_ASAP_FIT_LS, NULL, &ly, NULL) == BK_ERR_PARAM && strstr(bk_last_error(), "empty"),
             "asap empty calibration set refused", "%s", bk_last_error());
    bk_asap_calib_add(c, &t.desc, &t.tq, &t.tk);
    th_check(bk_asap_calib_fit(c, BK_ASAP_FIT_KL, NULL, &ly, NULL) == BK_ERR_PARAM, "asap KL without keep_kl refused",
             "%s", bk_last_error());
    bk_attn_desc d5 = t.desc;
    d5.d = 5;
    th_check(bk_asap_calib_add(c, &d5, &t.tq, &t.tk) == BK_ERR_SHAPE, "asap calibration d mismatch refused", "%s",
             bk_last_error());
    t.q[3] = NAN;
    th_check(bk_asap_calib_add(c, &t.desc, &t.tq, &t.tk) == BK_ERR_NONFINITE, "asap NaN in Q refused", "%s",
             bk_last_error());
    t.q[3] = 0.5f;
    bk_asap_calib_free(c);
    cfg.lambda = 0; /* L = 32 features from 8 rows: singular without ridge */
    bk_asap_calib_create(&cfg, 0, &c);
    bk_asap_calib_add(c, &t.desc, &t.tq, &t.tk);
    th_check(bk_asap_calib_fit(c, BK_ASAP_FIT_LS, NULL, &ly, NULL) == BK_ERR_NUMERIC, "asap singular LS -> BK_ERR_NUMERIC",
             "%s", bk_last_error());
    bk_asap_calib_free(c);
    bk_asap_layer l2 = make_layer(4, 3, 0.5f, 1.0f, 4, &r, 1.0);
    th_check(bk_asap_forward(&t.desc, &l2, (bk_asap_variant)9, &t.tq, &t.tk, &t.tv, &t.to, NULL, NULL, 0) == BK_ERR_PARAM,
             "asap unknown variant refused", "%s", bk_last_error());
    l2.d = 5;
    th_check(bk_asap_forward(&t.desc, &l2, BK_ASAP_AUTO, &t.tq, &t.tk, &t.tv, &t.to, NULL, NULL, 0) == BK_ERR_SHAPE,
             "asap layer d mismatch refused", "%s", bk_last_error());
    l2.d = 4;
    l2.teacher_iters = 1;
    th_check(bk_asap_forward(&t.desc, &l2, BK_ASAP_AUTO, &t.tq, &t.tk, &t.tv, &t.to, NULL, NULL, 0) == BK_ERR_PARAM,
             "asap layer with S = 1 refused", "%s", bk_last_error());
    l2.teacher_iters = 4;
    th_check(bk_asap_forward(&t.desc, &l2, BK_ASAP_AUTO, &t.tq, &t.tk, &t.tv, &t.tq, NULL, NULL, 0) != BK_OK,
             "asap output aliasing an input refused", "%s", bk_last_error());
    char small[16];
    th_check(bk_asap_forward(&t.desc, &l2, BK_ASAP_AUTO, &t.tq, &t.tk, &t.tv, &t.to, NULL, small, sizeof small) ==
                 BK_ERR_WORKSPACE, "asap small workspace refused", "%s", bk_last_error());
    float fbad[8] = {0, 0, NAN, 0, 0, 0, 0, 0};
    th_check(bk_asap_close(&t.desc, &l2, BK_ASAP_ZERO, fbad, &t.tq, &t.tk, &t.tv, &t.to, NULL, NULL, 0) == BK_ERR_NONFINITE,
             "asap close with a NaN dual refused", "%s", bk_last_error());
    bk_asap_layer_free(&l2);
    th_prob_free(&t);
    /* finite q, k whose teacher scores overflow float32 (issue 41): BK_ERR_OVERFLOW, the calibration left as
     * it was (a later fit sees only the good problems) */
    th_prob big;
    th_prob_init(&big, 1, 2, 8, 8, 4, 4, 0, 0, 1e20, &r);
    th_prob_init(&t, 1, 1, 8, 8, 4, 4, 0, 0, 1.0, &r);
    cfg = bk_asap_config_default(4);
    cfg.slices = 3;
    float y[16];
    bk_status s = bk_asap_teacher_dual(&big.desc, &cfg, &big.tq, &big.tk, y);
    th_check(s == BK_ERR_OVERFLOW && strstr(bk_last_error(), "overflow"), "asap teacher dual: overflow refused", "%s: %s",
             bk_status_str(s), bk_last_error());
    bk_asap_calib_create(&cfg, 1, &c);
    s = bk_asap_calib_add(c, &big.desc, &big.tq, &big.tk);
    th_check(s == BK_ERR_OVERFLOW && strstr(bk_last_error(), "overflow"), "asap calibration: overflow refused", "%s: %s",
             bk_status_str(s), bk_last_error());
    memset(&ly, 0, sizeof ly);
    s = bk_asap_calib_add(c, &t.desc, &t.tq, &t.tk);
    if (s == BK_OK) s = bk_asap_calib_fit(c, BK_ASAP_FIT_LS, NULL, &ly, NULL);
    th_check(s == BK_OK && ly.calib_problems == 1, "asap calibration: a refused batch leaves it as it was",
             "%s (%lld problems)", bk_last_error(), (long long)ly.calib_problems);
    bk_asap_layer_free(&ly);
    bk_asap_calib_free(c);
    th_prob_free(&t);
    th_prob_free(&big);
}

/* ---- the operator registry (birkhoff/ops.h) ------------------------------ */
static void test_asap_registry(void)
{
    const bk_op *op = bk_op_find("asap");
    int ok = op && !bk_op_has_backward(op) && bk_op_config_size(op) == sizeof(bk_asap_forward_config) &&
             !strcmp(bk_op_name(op), "asap") && bk_op_config_count(op) == 1 && !strcmp(bk_op_config_key(op, 0), "variant");
    th_check(ok, "registry: asap found by name, forward only, with bk_asap_forward_config {layer, variant}", "%p",
             (const void *)op);
    if (!ok) return;
    bk_asap_forward_config ap;
    memset(&ap, 0x5a, sizeof ap);
    bk_op_config_default(op, &ap);
    ok = ap.layer == NULL && ap.variant == BK_ASAP_AUTO;
    const char *names[4] = {"auto", "zero", "column", "row"};
    for (int v = 3; v >= 0; v--) ok &= bk_op_config_set(op, &ap, "variant", names[v]) == BK_OK && (int)ap.variant == v;
    ok &= bk_op_config_set(op, &ap, "variant", "row") == BK_OK;
    char buf[64];
    ok = ok && bk_op_config_format(op, &ap, buf, sizeof buf) < sizeof buf && !strcmp(buf, "variant=row\n");
    th_check(ok, "registry: asap variant set by key (by name) and formatted", "%s", bk_last_error());
    bk_status s1 = bk_op_config_set(op, &ap, "layer", "x.asap");
    int bad = s1 == BK_ERR_PARAM && strstr(bk_last_error(), "layer") != NULL;
    bk_status s2 = bk_op_config_set(op, &ap, "variant", "diagonal");
    bad &= s2 == BK_ERR_PARAM && strstr(bk_last_error(), "diagonal") != NULL && strstr(bk_last_error(), "variant");
    bad &= ap.variant == BK_ASAP_ROW && ap.layer == NULL;
    th_check(bad, "registry: asap refuses an unknown key and a bad value, naming them", "%s", bk_last_error());
    /* the generic forward == bk_asap_forward, bitwise, for every variant (padded batch) */
    th_rng r = {909};
    th_prob x, y;
    th_rng rx = {910}, ry = {910};
    th_prob_init(&x, 2, 2, 11, 9, 6, 5, 1, 1, 1.0, &rx);
    th_prob_init(&y, 2, 2, 11, 9, 6, 5, 1, 1, 1.0, &ry);
    bk_asap_layer ly = make_layer(6, 5, 1.0f / sqrtf(6.0f), 0.7f, 5, &r, 1.0);
    const bk_attn_desc *d = &y.desc;
    const size_t P = 4, no = P * 11 * 5, na = P * 11 * 9;
    int same = 1;
    bk_status st[2] = {BK_OK, BK_OK};
    for (int v = 0; v < 4; v++) {
        bk_asap_extras ex = {x.ta, NULL, NULL};
        st[0] = bk_asap_forward(&x.desc, &ly, (bk_asap_variant)v, &x.tq, &x.tk, &x.tv, &x.to, &ex, NULL, 0);
        ap.layer = &ly;
        ap.variant = (bk_asap_variant)v;
        st[1] = bk_op_forward(op, d, &ap, &y.tq, &y.tk, &y.tv, &y.to, NULL, &y.ta, NULL, 0);
        same &= st[0] == BK_OK && st[1] == BK_OK && !memcmp(x.o, y.o, 4 * no) && !memcmp(x.a, y.a, 4 * na);
        same &= bk_op_workspace_size(op, d, &ap) == bk_asap_workspace_size(d, &ly);
    }
    th_check(same, "registry: bk_op_forward == bk_asap_forward for every variant (bitwise)", "%s / %s: %s",
             bk_status_str(st[0]), bk_status_str(st[1]), bk_last_error());
    /* no backward; an ASAP tape (the generic forward writes its header) is refused by another operator */
    void *tape = calloc(1, bk_op_tape_size(op, d, &ap));
    bk_status sf = bk_op_forward(op, d, &ap, &y.tq, &y.tk, &y.tv, &y.to, tape, NULL, NULL, 0);
    bk_status sb = bk_op_backward(op, d, &ap, &y.tq, &y.tk, &y.tv, &y.tdo, tape, &y.tdq, &y.tdk, &y.tdv, NULL, 0);
    int refused = sf == BK_OK && sb == BK_ERR_PARAM && strstr(bk_last_error(), "no backward") != NULL;
    bk_sinkhorn_config sp = bk_sinkhorn_config_default();
    bk_status ss = bk_sinkhorn_backward(d, &sp, &y.tq, &y.tk, &y.tv, &y.tdo, tape, &y.tdq, &y.tdk, &y.tdv, NULL, 0);
    refused &= ss == BK_ERR_TAPE && strstr(bk_last_error(), "another operator") != NULL;
    th_check(refused, "registry: asap has no backward; its tape is refused by another operator", "%s / %s / %s: %s",
             bk_status_str(sf), bk_status_str(sb), bk_status_str(ss), bk_last_error());
    /* a layer whose head dim differs is refused by the generic forward too */
    ly.d = 5;
    th_check(bk_op_forward(op, d, &ap, &y.tq, &y.tk, &y.tv, &y.to, NULL, NULL, NULL, 0) == BK_ERR_SHAPE &&
                 bk_op_workspace_size(op, d, &ap) == 0,
             "registry: asap layer d mismatch refused (and sized 0)", "%s", bk_last_error());
    ly.d = 6;
    free(tape);
    bk_asap_layer_free(&ly);
    th_prob_free(&x);
    th_prob_free(&y);
}

/* the sliced features' lanes path (bki_kernels.lanes_sort, potential1d_lanes,
 * bki_sort_net) against the per-slice path (bki_argsort, bki_potential1d):
 * every lane's indices in bki_argsort's stable order, with their keys, the
 * potentials and means bitwise; sizes 1..140 and up to 1024, n != m, full and
 * partial groups of lanes; keys with ties, both zeros and a wide range */
static void test_asap_lanes_sort(void)
{
    const bki_kernels *kn = bki_kern();
    th_rng r = {9090};
    int bad_sort = 0, bad_pot = 0, bad_net = 0, count = 0;
    for (int n = 1; n <= 1024; n += n < 140 ? 1 : 127, count++) {
        const int m = n % 3 == 0 ? n : n % 3 == 1 ? (n + 7) / 2 : n + 5 > 1024 ? 1024 : n + 5;
        const int lanes = n % 2 ? BKI_LANES : 5;
        float *xa = malloc(sizeof(float) * BKI_LANES * (size_t)n), *xb = malloc(sizeof(float) * BKI_LANES * (size_t)m);
        float *ka = malloc(sizeof(float) * BKI_LANES * (size_t)n), *kb = malloc(sizeof(float) * BKI_LANES * (size_t)m);
        int32_t *ix = malloc(sizeof(int32_t) * BKI_LANES * (size_t)n);
        uint16_t *nq = malloc(4 * (size_t)bki_sort_net_bound(n)), *nk = malloc(4 * (size_t)bki_sort_net_bound(m));
        double *f = malloc(sizeof(double) * BKI_LANES * (size_t)n), *fr = malloc(sizeof(double) * (size_t)n), mean[BKI_LANES];
        float *ca = malloc(sizeof(float) * (size_t)n), *cb = malloc(sizeof(float) * (size_t)m);
        int32_t *ia = malloc(sizeof(int32_t) * (size_t)n), *ib = malloc(sizeof(int32_t) * (size_t)m);
        void *scr = malloc(bki_argsort_scratch(n > m ? n : m));
        for (size_t i = 0; i < (size_t)BKI_LANES * n + (size_t)BKI_LANES * m; i++) {
            const uint64_t u = th_next(&r) % 6;
            const float v = u == 0 ? 0.0f : u == 1 ? -0.0f : u == 2 ? (float)(th_next(&r) % 4) - 1.5f
                          : (float)th_normal(&r) * (u == 3 ? 1e3f : u == 4 ? 1e-3f : 1.0f);
            if (i < (size_t)BKI_LANES * n) xa[i] = v;
            else xb[i - (size_t)BKI_LANES * n] = v;
        }
        const int cq = bki_sort_net(n, nq), ck = bki_sort_net(m, nk);
        bad_net += cq > bki_sort_net_bound(n) || ck > bki_sort_net_bound(m);
        memcpy(ka, xa, sizeof(float) * BKI_LANES * (size_t)n);
        memcpy(kb, xb, sizeof(float) * BKI_LANES * (size_t)m);
        for (int i = 0; i < n; i++)
            for (int l = 0; l < BKI_LANES; l++) ix[i * BKI_LANES + l] = i;
        kn->lanes_sort(cq, nq, ka, ix);
        kn->lanes_sort(ck, nk, kb, NULL);
        kn->potential1d_lanes(n, m, ka, ix, kb, lanes, f, (size_t)n, mean);
        int sorted = 1, pot = 1;
        for (int l = 0; l < BKI_LANES; l++) {
            for (int i = 0; i < n; i++) ca[i] = xa[i * BKI_LANES + l];
            for (int j = 0; j < m; j++) cb[j] = xb[j * BKI_LANES + l];
            bki_argsort(n, ca, 1, ia, scr);
            bki_argsort(m, cb, 1, ib, scr);
            for (int i = 0; i < n; i++) /* the stable order itself, and its keys */
                sorted &= ix[i * BKI_LANES + l] == ia[i] && ca[ia[i]] == ka[i * BKI_LANES + l];
            for (int j = 0; j < m; j++) sorted &= cb[ib[j]] == kb[j * BKI_LANES + l];
            if (l < lanes) { /* the per-slice potential from the lane's own query order: bitwise */
                int32_t *il = malloc(sizeof(int32_t) * (size_t)n);
                for (int i = 0; i < n; i++) il[i] = ix[i * BKI_LANES + l];
                const double mr = bki_potential1d(n, m, ca, 1, il, cb, 1, ib, fr);
                pot &= !memcmp(fr, f + (size_t)l * n, sizeof(double) * (size_t)n) && !memcmp(&mr, &mean[l], sizeof mr);
                free(il);
            }
        }
        bad_sort += !sorted;
        bad_pot += !pot;
        if (!sorted && bad_sort == 1) printf("lanes sort differs at n = %d\n", n);
        if (!pot && bad_pot == 1) printf("lanes potential differs at n = %d, m = %d\n", n, m);
        free(xa); free(xb); free(ka); free(kb); free(ix); free(nq); free(nk); free(f); free(fr);
        free(ca); free(cb); free(ia); free(ib); free(scr);
    }
    th_check(!bad_net, "bki_sort_net: comparators within bki_sort_net_bound", "%d sizes over", bad_net);
    th_check(!bad_sort, "lanes sort (Batcher network, 16 lanes) == bki_argsort: the same stable order and keys",
             "%d of %d sizes differ", bad_sort, count);
    th_check(!bad_pot, "lanes 1-D potentials == bki_potential1d, bitwise (n != m too, partial lane groups)",
             "%d of %d sizes differ", bad_pot, count);
}

void test_asap(void)
{
    if (TH.filter && !strstr("asap", TH.filter)) return;
    test_asap_lanes_sort();
    test_asap_grid();
    test_asap_properties();
    test_asap_calibration();
    test_asap_determinism();
    test_asap_parallel();
    test_asap_file();
    test_asap_bad_input();
    test_asap_registry();
}
