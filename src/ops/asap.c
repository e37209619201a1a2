/* asap.c -- ASAP (Tran, Milkert, Hyde 2026): a trained Sinkhorn attention
 * layer compiled into a loop-free operator. Semantics in include/birkhoff.h
 * ("ASAP") and docs/ALGORITHMS.md section 7.
 *
 * Mechanisms used, not re-implemented here:
 *   - sorting and the 1-D Kantorovich potential: sort1d.c (bki_argsort,
 *     bki_potential1d), the slice bank: bki_unit_directions;
 *   - every c-transform and the teacher's half-steps: the LSE engine. A
 *     key-side c-transform T_K(u) is a row step of the TRANSPOSED logits
 *     (keys x queries) from the column potential u, so ASAP is the engine on
 *     Z^T warm-started from u with 1 (ASAP-0), 2 (row-ending) or 3
 *     (column-ending) half-steps; the engine's A is then Lk P^T.
 * Calibration accumulates per-problem blocks in parallel and sums them in
 * problem order (results independent of the thread count). */
#include "ops.h"

#include <cblas.h>
#include <errno.h>
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* defaults and checks                                                      */
/* ------------------------------------------------------------------------ */
bk_asap_config bk_asap_config_default(int d)
{
    bk_asap_config c;
    memset(&c, 0, sizeof c);
    c.d = d;
    c.slices = 32;
    c.seed = 1;
    c.eps = 1.0f;
    c.teacher_iters = 20;
    c.lambda = 1e-3;
    return c;
}

bk_asap_kl_opts bk_asap_kl_opts_default(void)
{
    bk_asap_kl_opts o = {50, 1e-13};
    return o;
}

#define ASAP_MAX_SLICES (1 << 16)
#define ASAP_MAX_ITERS 1000000

static bk_status check_common(int d, int L, float scale, float eps, int S)
{
    if (d < 1 || d > (1 << 24)) return bki_fail(BK_ERR_SHAPE, "ASAP head dim d must be in [1, 2^24], got %d", d);
    if (L < 1 || L > ASAP_MAX_SLICES)
        return bki_fail(BK_ERR_PARAM, "ASAP slices L must be in [1, %d], got %d", ASAP_MAX_SLICES, L);
    if (!(scale >= 0.0f) || !isfinite(scale)) return bki_fail(BK_ERR_PARAM, "ASAP scale must be finite and > 0 (0 = 1/sqrt(d)), got %g", (double)scale);
    if (!(eps > 0.0f) || !isfinite(eps)) return bki_fail(BK_ERR_PARAM, "ASAP eps must be finite and > 0, got %g", (double)eps);
    if (S < 2 || S > ASAP_MAX_ITERS)
        return bki_fail(BK_ERR_PARAM, "ASAP teacher half-steps S must be in [2, %d] (S = 1 is softmax: nothing to compile), got %d",
                        ASAP_MAX_ITERS, S);
    return BK_OK;
}

static bk_status check_layer(const bk_asap_layer *ly)
{
    if (!ly) return bki_fail(BK_ERR_NULL, "ASAP layer is NULL");
    bk_status s = check_common(ly->d, ly->slices, ly->scale, ly->eps, ly->teacher_iters);
    if (s) return s;
    if (!(ly->scale > 0.0f)) return bki_fail(BK_ERR_PARAM, "ASAP layer scale must be > 0 (resolved), got %g", (double)ly->scale);
    if (!ly->theta || !ly->omega) return bki_fail(BK_ERR_NULL, "ASAP layer has no slice bank or coefficients");
    return BK_OK;
}

static float resolve_scale(float scale, int d) { return scale != 0.0f ? scale : 1.0f / sqrtf((float)d); }

/* ------------------------------------------------------------------------ */
/* per-problem pieces                                                       */
/* ------------------------------------------------------------------------ */
/* Scratch for the sliced features of one problem up to Nq x Nk. */
typedef struct {
    float *pa, *pb;       /* projections [L x Nq], [L x Nk]   */
    int32_t *ia, *ib;     /* sort orders                       */
    void *sort_scr;
    double *fcol;         /* one slice's potential [Nq]        */
} feat_scr;

static size_t feat_bytes(int Nq, int Nk, int L)
{
    int nn = Nq > Nk ? Nq : Nk;
    return bki_round_up(sizeof(float) * (size_t)Nq * L) + bki_round_up(sizeof(float) * (size_t)Nk * L) +
           bki_round_up(sizeof(int32_t) * (size_t)Nq) + bki_round_up(sizeof(int32_t) * (size_t)Nk) +
           bki_round_up(bki_argsort_scratch(nn)) + bki_round_up(sizeof(double) * (size_t)Nq) + 6 * BK_ALIGN;
}

static feat_scr feat_take(bki_arena *ar, int Nq, int Nk, int L)
{
    int nn = Nq > Nk ? Nq : Nk;
    feat_scr f;
    f.pa = bki_take(ar, sizeof(float) * (size_t)Nq * L);
    f.pb = bki_take(ar, sizeof(float) * (size_t)Nk * L);
    f.ia = bki_take(ar, sizeof(int32_t) * (size_t)Nq);
    f.ib = bki_take(ar, sizeof(int32_t) * (size_t)Nk);
    f.sort_scr = bki_take(ar, bki_argsort_scratch(nn));
    f.fcol = bki_take(ar, sizeof(double) * (size_t)Nq);
    return f;
}

/* X [Lq x L] (double, row-major): the centred sliced potentials. */
static void sliced_features(const feat_scr *w, int Lq, int Lk, int d, int L, const float *theta, float s,
                            const float *Q, int64_t sq, const float *K, int64_t sk, double *X)
{
    const float rs = sqrtf(s);
    /* projections slice-major (L x Lq, L x Lk): each slice contiguous */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, Lq, d, rs, theta, d, Q, (int)sq, 0.0f, w->pa, Lq);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, Lk, d, rs, theta, d, K, (int)sk, 0.0f, w->pb, Lk);
    for (int l = 0; l < L; l++) {
        const float *a = w->pa + (size_t)l * Lq, *b = w->pb + (size_t)l * Lk;
        bki_argsort(Lq, a, 1, w->ia, w->sort_scr);
        bki_argsort(Lk, b, 1, w->ib, w->sort_scr);
        double mean = bki_potential1d(Lq, Lk, a, 1, w->ia, b, 1, w->ib, w->fcol);
        for (int i = 0; i < Lq; i++) X[(size_t)i * L + l] = w->fcol[i] - mean;
    }
}

/* rho_i = s |q_i|^2 / 2 (double) */
static void rho_of(int Lq, int d, float s, const float *Q, int64_t sq, double *rho)
{
    for (int i = 0; i < Lq; i++) {
        const float *qi = Q + (int64_t)i * sq;
        double a = 0.0;
        for (int c = 0; c < d; c++) a += (double)qi[c] * qi[c];
        rho[i] = 0.5 * (double)s * a;
    }
}

/* The engine on the transposed logits Ct = (s/eps) K Q^T (Lk x Lq, filled by
 * the caller) warm-started from u (Lq): `steps` half-steps; At (Lk x Lq)
 * receives Lk P^T. */
static void transposed_steps(int Lq, int Lk, const float *Ct, const float *u, int steps, float *At, float *hist,
                             float *scr, bki_sk_result *res)
{
    bki_sk_problem pb = {Lk, Lq, Ct, Lq, NULL, NULL, steps, 0.0f, u};
    bki_sk_result r = {hist, At, Lq, NULL, NULL, 0, 0.0f, 0.0f};
    bki_kern()->sk_forward(&BKI_SOLO, &pb, &r, scr);
    *res = r;
}

/* The teacher on C = (s/eps) Q K^T (Lq x Lk, filled by the caller) and its
 * closure-ready dual as the centred cost-unit target y (double). */
static void teacher_target(int Lq, int Lk, const float *C, int S, float eps, const double *rho, float *A,
                           float *hist, float *scr, double *y)
{
    bki_sk_problem pb = {Lq, Lk, C, Lk, NULL, NULL, S, 0.0f, NULL};
    bki_sk_result r = {hist, A, Lk, NULL, NULL, 0, 0.0f, 0.0f};
    bki_kern()->sk_forward(&BKI_SOLO, &pb, &r, scr);
    const int t = (S % 2 == 0) ? S - 1 : S - 2; /* the row step the teacher's closure acts on */
    const float *f = hist + bki_hist_off(Lq, Lk, t);
    double mean = 0.0;
    for (int i = 0; i < Lq; i++) {
        y[i] = (double)eps * f[i] + rho[i];
        mean += y[i];
    }
    mean /= Lq;
    for (int i = 0; i < Lq; i++) y[i] -= mean;
}

static int steps_of(bk_asap_variant v, int S)
{
    switch (v) {
    case BK_ASAP_ZERO: return 1;
    case BK_ASAP_ROW: return 2;
    case BK_ASAP_COLUMN: return 3;
    default: return S % 2 == 0 ? 3 : 2;
    }
}

/* ------------------------------------------------------------------------ */
/* online operator                                                          */
/* ------------------------------------------------------------------------ */
static size_t fwd_thread_bytes(const bk_attn_desc *d, int L)
{
    const int Nq = d->Nq, Nk = d->Nk;
    size_t nm = (size_t)Nq * Nk;
    return 2 * bki_round_up(nm * sizeof(float)) + bki_round_up(bki_kern()->sk_scratch(Nk, Nq, 1) * sizeof(float)) +
           bki_round_up(bki_hist_len(Nk, Nq, 3) * sizeof(float)) + feat_bytes(Nq, Nk, L) +
           bki_round_up(sizeof(double) * (size_t)Nq * L) + 2 * bki_round_up(sizeof(double) * (size_t)Nq) +
           bki_round_up(sizeof(float) * (size_t)Nq) + 8 * BK_ALIGN;
}

size_t bk_asap_workspace_size(const bk_attn_desc *desc, const bk_asap_layer *layer)
{
    if (!desc || !layer || desc->B < 1 || desc->H < 1 || desc->Nq < 1 || desc->Nk < 1 || layer->slices < 1) return 0;
    return (size_t)bki_work_threads(desc->B * desc->H) * fwd_thread_bytes(desc, layer->slices) + BK_ALIGN;
}

typedef struct {
    float *Ct, *At, *scr, *hist, *u;
    double *X, *fhat, *rho;
    feat_scr fs;
} fwd_slab;

static fwd_slab fwd_take(char *base, size_t pt, const bk_attn_desc *d, int L)
{
    bki_arena ar = {bki_align_ptr(base + (size_t)bki_thread_id() * pt), 0, pt - BK_ALIGN};
    const size_t nm = (size_t)d->Nq * d->Nk;
    fwd_slab s;
    s.Ct = bki_take(&ar, nm * sizeof(float));
    s.At = bki_take(&ar, nm * sizeof(float));
    s.scr = bki_take(&ar, bki_kern()->sk_scratch(d->Nk, d->Nq, 1) * sizeof(float));
    s.hist = bki_take(&ar, bki_hist_len(d->Nk, d->Nq, 3) * sizeof(float));
    s.fs = feat_take(&ar, d->Nq, d->Nk, L);
    s.X = bki_take(&ar, sizeof(double) * (size_t)d->Nq * L);
    s.fhat = bki_take(&ar, sizeof(double) * (size_t)d->Nq);
    s.rho = bki_take(&ar, sizeof(double) * (size_t)d->Nq);
    s.u = bki_take(&ar, sizeof(float) * (size_t)d->Nq);
    return s;
}

/* The forward, with the dual predicted from the features (fin NULL) or given
 * (fin [B*H*Nq], cost units: bk_asap_close). */
static bk_status forward_impl(const bk_attn_desc *d, const bk_asap_layer *ly, bk_asap_variant variant,
                              const float *fin, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                              const bk_tensor *out, const bk_asap_extras *ex, void *ws, size_t ws_size)
{
    bk_status s;
    if ((s = bki_check_desc(d))) return s;
    if ((s = check_layer(ly))) return s;
    if (d->d != ly->d) return bki_fail(BK_ERR_SHAPE, "head dim d=%d does not match the layer's d=%d", d->d, ly->d);
    if (variant < BK_ASAP_AUTO || variant > BK_ASAP_ROW) return bki_fail(BK_ERR_PARAM, "unknown ASAP variant %d", (int)variant);
    if ((s = bki_check_qkv(d, q, k, v))) return s;
    if ((s = bki_check_fwd_outputs(d, q, k, v, out, ex ? &ex->attn : NULL))) return s;
    const int L = ly->slices, P = d->B * d->H;
    const float sc = ly->scale, alpha = sc / ly->eps, eps = ly->eps;
    if (!isfinite(alpha)) return bki_fail(BK_ERR_PARAM, "scale/eps overflows");
    const int steps = steps_of(variant, ly->teacher_iters);
    const int nt = bki_work_threads(P);
    const size_t pt = fwd_thread_bytes(d, L);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(ws, ws_size, (size_t)nt * pt + BK_ALIGN, "bk_asap_workspace_size", &owned, &base))) return s;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
        const fwd_slab w = fwd_take(base, pt, d, L);
#pragma omp for schedule(static)
        for (int p = 0; p < P; p++) {
            const int b = p / d->H, h = p % d->H;
            const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
            const int live = Lq > 0 && Lk > 0;
            bki_sk_result res = {0};
            if (live) {
                const float *Qb = bki_at(q, b, h), *Kb = bki_at(k, b, h), *Vb = bki_at(v, b, h);
                if (!fin)
                    sliced_features(&w.fs, Lq, Lk, d->d, L, ly->theta, sc, Qb, q->stride_n, Kb, k->stride_n, w.X);
                rho_of(Lq, d->d, sc, Qb, q->stride_n, w.rho);
                for (int i = 0; i < Lq; i++) {
                    const double *xi = w.X + (size_t)i * L;
                    double f = 0.0;
                    if (fin) f = fin[(size_t)p * d->Nq + i];
                    else
                        for (int l = 0; l < L; l++) f += xi[l] * ly->omega[l];
                    w.fhat[i] = f;
                    w.u[i] = (float)((f - w.rho[i]) / eps);
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Lk, Lq, d->d, alpha, Kb, (int)k->stride_n, Qb,
                            (int)q->stride_n, 0.0f, w.Ct, Lq);
                transposed_steps(Lq, Lk, w.Ct, w.u, steps, w.At, w.hist, w.scr, &res);
                if (out) /* O = A V = (Lq/Lk) At^T V */
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Lq, d->dv, Lk, (float)Lq / (float)Lk, w.At,
                                Lq, Vb, (int)v->stride_n, 0.0f, bki_at(out, b, h), (int)out->stride_n);
            }
            if (out) bki_zero_rows(bki_at(out, b, h), out->stride_n, live ? Lq : 0, d->Nq, d->dv);
            if (!ex) continue;
            if (ex->attn.data) {
                float *Ab = bki_at(&ex->attn, b, h);
                const float r = live ? (float)Lq / (float)Lk : 0.0f;
                for (int i = 0; i < d->Nq; i++) {
                    float *row = Ab + (int64_t)i * ex->attn.stride_n;
                    memset(row, 0, sizeof(float) * (size_t)d->Nk);
                    if (live && i < Lq)
                        for (int j = 0; j < Lk; j++) row[j] = r * w.At[(size_t)j * Lq + i];
                }
            }
            if (ex->fhat) {
                float *fo = ex->fhat + (size_t)p * d->Nq;
                memset(fo, 0, sizeof(float) * (size_t)d->Nq);
                if (live)
                    for (int i = 0; i < Lq; i++) fo[i] = (float)w.fhat[i];
            }
            if (ex->diag) { /* the transposed problem's rows are our columns */
                ex->diag[p].iters = res.iters;
                ex->diag[p].row_err = res.col_err;
                ex->diag[p].col_err = res.row_err;
            }
        }
    }
    free(owned);
    bki_clear_error();
    return BK_OK;
}

bk_status bk_asap_forward(const bk_attn_desc *d, const bk_asap_layer *ly, bk_asap_variant variant,
                          const bk_tensor *q, const bk_tensor *k, const bk_tensor *v, const bk_tensor *out,
                          const bk_asap_extras *ex, void *ws, size_t ws_size)
{
    return forward_impl(d, ly, variant, NULL, q, k, v, out, ex, ws, ws_size);
}

bk_status bk_asap_close(const bk_attn_desc *d, const bk_asap_layer *ly, bk_asap_variant variant, const float *fhat,
                        const bk_tensor *q, const bk_tensor *k, const bk_tensor *v, const bk_tensor *out,
                        const bk_asap_extras *ex, void *ws, size_t ws_size)
{
    if (!fhat) return bki_fail(BK_ERR_NULL, "the dual fhat is NULL");
    bk_status s;
    if ((s = bki_check_desc(d))) return s;
    for (int p = 0; p < d->B * d->H; p++) {
        const int Lq = bki_len(d->q_len, p / d->H, d->Nq);
        for (int i = 0; i < Lq; i++)
            if (!isfinite(fhat[(size_t)p * d->Nq + i]))
                return bki_fail(BK_ERR_NONFINITE, "fhat is not finite at problem %d row %d", p, i);
    }
    return forward_impl(d, ly, variant, fhat, q, k, v, out, ex, ws, ws_size);
}

/* ------------------------------------------------------------------------ */
/* features and teacher targets (public, for inspection and tests)          */
/* ------------------------------------------------------------------------ */
static bk_status check_qk(const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k)
{
    bk_status s;
    if ((s = bki_check_desc(d))) return s;
    if ((s = bki_check_tensor("q", q, d->B, d->H, d->Nq, d->d))) return s;
    if ((s = bki_check_tensor("k", k, d->B, d->H, d->Nk, d->d))) return s;
    if ((s = bki_check_finite("q", q, d->B, d->H, d->Nq, d->d, d->q_len))) return s;
    return bki_check_finite("k", k, d->B, d->H, d->Nk, d->d, d->k_len);
}

/* Per-thread scratch of the teacher + features for problems up to Nq x Nk. */
static size_t calib_thread_bytes(int Nq, int Nk, int d, int L, int S, int kl)
{
    size_t nm = (size_t)Nq * Nk;
    size_t hl = bki_hist_len(Nq, Nk, S), ht = bki_hist_len(Nk, Nq, 1);
    size_t sc = bki_kern()->sk_scratch(Nq, Nk, 1);
    (void)d;
    return 2 * bki_round_up(nm * sizeof(float)) + bki_round_up((hl > ht ? hl : ht) * sizeof(float)) +
           bki_round_up(sc * sizeof(float)) + feat_bytes(Nq, Nk, L) + bki_round_up(sizeof(double) * (size_t)Nq * L) +
           3 * bki_round_up(sizeof(double) * (size_t)Nq) + (kl ? bki_round_up(sizeof(float) * (size_t)Nq) : 0) +
           8 * BK_ALIGN;
}

typedef struct {
    float *C, *A, *hist, *scr, *u;
    double *X, *y, *rho, *r;
    feat_scr fs;
} calib_slab;

static calib_slab calib_take(char *base, size_t pt, int Nq, int Nk, int L, int S, int kl)
{
    bki_arena ar = {bki_align_ptr(base + (size_t)bki_thread_id() * pt), 0, pt - BK_ALIGN};
    size_t nm = (size_t)Nq * Nk, hl = bki_hist_len(Nq, Nk, S), ht = bki_hist_len(Nk, Nq, 1);
    calib_slab w;
    w.C = bki_take(&ar, nm * sizeof(float));
    w.A = bki_take(&ar, nm * sizeof(float));
    w.hist = bki_take(&ar, (hl > ht ? hl : ht) * sizeof(float));
    w.scr = bki_take(&ar, bki_kern()->sk_scratch(Nq, Nk, 1) * sizeof(float));
    w.fs = feat_take(&ar, Nq, Nk, L);
    w.X = bki_take(&ar, sizeof(double) * (size_t)Nq * L);
    w.y = bki_take(&ar, sizeof(double) * (size_t)Nq);
    w.rho = bki_take(&ar, sizeof(double) * (size_t)Nq);
    w.r = bki_take(&ar, sizeof(double) * (size_t)Nq);
    w.u = kl ? bki_take(&ar, sizeof(float) * (size_t)Nq) : NULL;
    return w;
}

/* Row sums r_i of the one-sided (key-normalised) plan from the score-space
 * logit potential u: the engine's single half-step on the transposed logits
 * Ct gives At = Pi^T (column-stochastic Pi), r_i = (1/Lk) sum_j At[j][i].
 * Returns sum_j (1/Lk) LSE_i(Z_ij + u_i) in *F (nullable). */
static void one_sided_rows(int Lq, int Lk, const float *Ct, const float *u, float *At, float *hist, float *scr,
                           double *r, double *F)
{
    bki_sk_result res;
    transposed_steps(Lq, Lk, Ct, u, 1, At, hist, scr, &res);
    for (int i = 0; i < Lq; i++) r[i] = 0.0;
    for (int j = 0; j < Lk; j++) {
        const float *a = At + (size_t)j * Lq;
        for (int i = 0; i < Lq; i++) r[i] += a[i];
    }
    for (int i = 0; i < Lq; i++) r[i] /= Lk;
    if (F) { /* row potential of the transposed problem: -log Lk - LSE_j */
        double acc = 0.0;
        for (int j = 0; j < Lk; j++) acc += -log((double)Lk) - (double)res.f[j];
        *F = acc / Lk;
    }
}

bk_status bk_asap_features(const bk_attn_desc *d, const bk_asap_layer *ly, const bk_tensor *q, const bk_tensor *k,
                           float *Xout)
{
    bk_status s;
    if ((s = check_qk(d, q, k))) return s;
    if ((s = check_layer(ly))) return s;
    if (d->d != ly->d) return bki_fail(BK_ERR_SHAPE, "head dim d=%d does not match the layer's d=%d", d->d, ly->d);
    if (!Xout) return bki_fail(BK_ERR_NULL, "feature output is NULL");
    const int P = d->B * d->H, L = ly->slices, nt = bki_work_threads(P);
    const size_t pt = feat_bytes(d->Nq, d->Nk, L) + bki_round_up(sizeof(double) * (size_t)d->Nq * L) + 2 * BK_ALIGN;
    char *base = malloc((size_t)nt * pt + BK_ALIGN);
    if (!base) return bki_fail(BK_ERR_NOMEM, "out of memory (ASAP features)");
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
        bki_arena ar = {bki_align_ptr(base + (size_t)bki_thread_id() * pt), 0, pt - BK_ALIGN};
        feat_scr fs = feat_take(&ar, d->Nq, d->Nk, L);
        double *X = bki_take(&ar, sizeof(double) * (size_t)d->Nq * L);
#pragma omp for schedule(static)
        for (int p = 0; p < P; p++) {
            const int b = p / d->H, h = p % d->H;
            const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
            float *o = Xout + (size_t)p * d->Nq * L;
            memset(o, 0, sizeof(float) * (size_t)d->Nq * L);
            if (Lq == 0 || Lk == 0) continue;
            sliced_features(&fs, Lq, Lk, d->d, L, ly->theta, ly->scale, bki_at(q, b, h), q->stride_n, bki_at(k, b, h),
                            k->stride_n, X);
            for (size_t i = 0; i < (size_t)Lq * L; i++) o[i] = (float)X[i];
        }
    }
    free(base);
    bki_clear_error();
    return BK_OK;
}

bk_status bk_asap_teacher_dual(const bk_attn_desc *d, const bk_asap_config *cfg, const bk_tensor *q,
                               const bk_tensor *k, float *y)
{
    bk_status s;
    if ((s = check_qk(d, q, k))) return s;
    if (!cfg) return bki_fail(BK_ERR_NULL, "ASAP configuration is NULL");
    if ((s = check_common(d->d, 1, cfg->scale, cfg->eps, cfg->teacher_iters))) return s;
    if (!y) return bki_fail(BK_ERR_NULL, "target output is NULL");
    const float sc = resolve_scale(cfg->scale, d->d), alpha = sc / cfg->eps;
    if (!isfinite(alpha)) return bki_fail(BK_ERR_PARAM, "scale/eps overflows");
    const int P = d->B * d->H, nt = bki_work_threads(P), S = cfg->teacher_iters;
    const size_t pt = calib_thread_bytes(d->Nq, d->Nk, d->d, 1, S, 0);
    char *base = malloc((size_t)nt * pt + BK_ALIGN);
    if (!base) return bki_fail(BK_ERR_NOMEM, "out of memory (ASAP teacher)");
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
        calib_slab w = calib_take(base, pt, d->Nq, d->Nk, 1, S, 0);
#pragma omp for schedule(static)
        for (int p = 0; p < P; p++) {
            const int b = p / d->H, h = p % d->H;
            const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
            float *o = y + (size_t)p * d->Nq;
            memset(o, 0, sizeof(float) * (size_t)d->Nq);
            if (Lq == 0 || Lk == 0) continue;
            const float *Qb = bki_at(q, b, h), *Kb = bki_at(k, b, h);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Lq, Lk, d->d, alpha, Qb, (int)q->stride_n, Kb,
                        (int)k->stride_n, 0.0f, w.C, Lk);
            rho_of(Lq, d->d, sc, Qb, q->stride_n, w.rho);
            teacher_target(Lq, Lk, w.C, S, cfg->eps, w.rho, w.A, w.hist, w.scr, w.y);
            for (int i = 0; i < Lq; i++) o[i] = (float)w.y[i];
        }
    }
    free(base);
    bki_clear_error();
    return BK_OK;
}

/* ------------------------------------------------------------------------ */
/* calibration                                                              */
/* ------------------------------------------------------------------------ */
typedef struct { /* what the KL fit keeps of one problem */
    int Lq, Lk;
    float *X;       /* [Lq x L] */
    double *r, *rho;/* [Lq]     */
    float *Q, *K;   /* [Lq x d], [Lk x d] */
} kl_rec;

struct bk_asap_calib {
    bk_asap_config cfg;  /* scale resolved, theta pointing at own copy */
    float *theta;
    int keep_kl, theta_given;
    double *G, *c, yy;
    int64_t problems, rows;
    kl_rec *rec;
    int64_t nrec, caprec;
    int maxq, maxk;
};

bk_status bk_asap_calib_create(const bk_asap_config *cfg, int keep_kl, bk_asap_calib **out)
{
    if (!out) return bki_fail(BK_ERR_NULL, "output pointer is NULL");
    *out = NULL;
    if (!cfg) return bki_fail(BK_ERR_NULL, "ASAP configuration is NULL");
    bk_status s = check_common(cfg->d, cfg->slices, cfg->scale, cfg->eps, cfg->teacher_iters);
    if (s) return s;
    if (!(cfg->lambda >= 0.0) || !isfinite(cfg->lambda))
        return bki_fail(BK_ERR_PARAM, "ASAP ridge lambda must be finite and >= 0, got %g", cfg->lambda);
    const int L = cfg->slices, d = cfg->d;
    if ((int64_t)L * d > ((int64_t)1 << 28)) return bki_fail(BK_ERR_SHAPE, "slice bank too large (L=%d d=%d)", L, d);
    bk_asap_calib *c = calloc(1, sizeof *c);
    if (!c) return bki_fail(BK_ERR_NOMEM, "out of memory");
    c->cfg = *cfg;
    c->cfg.scale = resolve_scale(cfg->scale, d);
    c->keep_kl = keep_kl ? 1 : 0;
    c->theta = malloc(sizeof(float) * (size_t)L * d);
    c->G = calloc((size_t)L * L, sizeof(double));
    c->c = calloc((size_t)L, sizeof(double));
    if (!c->theta || !c->G || !c->c) {
        bk_asap_calib_free(c);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    if (cfg->theta) {
        for (int l = 0; l < L; l++) {
            double nrm = 0.0;
            for (int x = 0; x < d; x++) {
                float t = cfg->theta[(size_t)l * d + x];
                if (!isfinite(t)) {
                    bk_asap_calib_free(c);
                    return bki_fail(BK_ERR_NONFINITE, "slice bank row %d is not finite", l);
                }
                nrm += (double)t * t;
            }
            if (!(nrm > 0.0)) {
                bk_asap_calib_free(c);
                return bki_fail(BK_ERR_PARAM, "slice bank row %d is zero", l);
            }
            for (int x = 0; x < d; x++) c->theta[(size_t)l * d + x] = (float)(cfg->theta[(size_t)l * d + x] / sqrt(nrm));
        }
        c->cfg.seed = 0;
        c->theta_given = 1;
    } else {
        bki_unit_directions(cfg->seed, L, d, c->theta);
    }
    c->cfg.theta = c->theta;
    *out = c;
    bki_clear_error();
    return BK_OK;
}

static void rec_free(kl_rec *r)
{
    free(r->X);
    free(r->r);
    free(r->rho);
    free(r->Q);
    free(r->K);
}

void bk_asap_calib_free(bk_asap_calib *c)
{
    if (!c) return;
    for (int64_t i = 0; i < c->nrec; i++) rec_free(&c->rec[i]);
    free(c->rec);
    free(c->theta);
    free(c->G);
    free(c->c);
    free(c);
}

static void copy_rows(float *dst, const float *src, int64_t stride, int rows, int d)
{
    for (int i = 0; i < rows; i++) memcpy(dst + (size_t)i * d, src + (int64_t)i * stride, sizeof(float) * (size_t)d);
}

bk_status bk_asap_calib_add(bk_asap_calib *c, const bk_attn_desc *d0, const bk_tensor *q, const bk_tensor *k)
{
    if (!c) return bki_fail(BK_ERR_NULL, "ASAP calibration is NULL");
    if (!d0) return bki_fail(BK_ERR_NULL, "attention descriptor is NULL");
    bk_attn_desc dd = *d0;
    dd.dv = 1; /* values are not used */
    const bk_attn_desc *d = &dd;
    if (d->d != c->cfg.d) return bki_fail(BK_ERR_SHAPE, "head dim d=%d does not match the calibration's d=%d", d->d, c->cfg.d);
    bk_status s;
    if ((s = check_qk(d, q, k))) return s;
    const int P = d->B * d->H, L = c->cfg.slices, S = c->cfg.teacher_iters, kl = c->keep_kl;
    const float sc = c->cfg.scale, eps = c->cfg.eps, alpha = sc / eps;
    if (!isfinite(alpha)) return bki_fail(BK_ERR_PARAM, "scale/eps overflows");
    const size_t blk = (size_t)L * L + L + 1;
    double *part = malloc(sizeof(double) * blk * (size_t)P);
    kl_rec *recs = kl ? calloc((size_t)P, sizeof(kl_rec)) : NULL;
    const int nt = bki_work_threads(P);
    const size_t pt = calib_thread_bytes(d->Nq, d->Nk, d->d, L, S, kl);
    char *base = malloc((size_t)nt * pt + BK_ALIGN);
    int nomem = 0;
    if (!part || !base || (kl && !recs)) nomem = 1;
    if (kl && !nomem) /* allocate the records before the parallel region */
        for (int p = 0; p < P && !nomem; p++) {
            const int b = p / d->H;
            const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
            if (Lq == 0 || Lk == 0) continue;
            kl_rec *r = &recs[p];
            r->Lq = Lq;
            r->Lk = Lk;
            r->X = malloc(sizeof(float) * (size_t)Lq * L);
            r->r = malloc(sizeof(double) * (size_t)Lq);
            r->rho = malloc(sizeof(double) * (size_t)Lq);
            r->Q = malloc(sizeof(float) * (size_t)Lq * d->d);
            r->K = malloc(sizeof(float) * (size_t)Lk * d->d);
            if (!r->X || !r->r || !r->rho || !r->Q || !r->K) nomem = 1;
        }
    if (nomem) {
        if (recs)
            for (int p = 0; p < P; p++) rec_free(&recs[p]);
        free(recs);
        free(part);
        free(base);
        return bki_fail(BK_ERR_NOMEM, "out of memory (ASAP calibration)");
    }
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
        calib_slab w = calib_take(base, pt, d->Nq, d->Nk, L, S, kl);
#pragma omp for schedule(static)
        for (int p = 0; p < P; p++) {
            const int b = p / d->H, h = p % d->H;
            const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
            double *pp = part + blk * (size_t)p;
            memset(pp, 0, sizeof(double) * blk);
            if (Lq <= 0 || Lk <= 0) continue;
            const float *Qb = bki_at(q, b, h), *Kb = bki_at(k, b, h);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Lq, Lk, d->d, alpha, Qb, (int)q->stride_n, Kb,
                        (int)k->stride_n, 0.0f, w.C, Lk);
            rho_of(Lq, d->d, sc, Qb, q->stride_n, w.rho);
            teacher_target(Lq, Lk, w.C, S, eps, w.rho, w.A, w.hist, w.scr, w.y);
            sliced_features(&w.fs, Lq, Lk, d->d, L, c->theta, sc, Qb, q->stride_n, Kb, k->stride_n, w.X);
            /* G_p = X^T X, c_p = X^T y, yy_p = y^T y */
            cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L, L, Lq, 1.0, w.X, L, w.X, L, 0.0, pp, L);
            cblas_dgemv(CblasRowMajor, CblasTrans, Lq, L, 1.0, w.X, L, w.y, 1, 0.0, pp + (size_t)L * L, 1);
            double yy = 0.0;
            for (int i = 0; i < Lq; i++) yy += w.y[i] * w.y[i];
            pp[(size_t)L * L + L] = yy;
            if (kl) {
                kl_rec *r = &recs[p];
                for (int i = 0; i < Lq; i++) w.u[i] = (float)((w.y[i] - w.rho[i]) / eps);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Lk, Lq, d->d, alpha, Kb, (int)k->stride_n, Qb,
                            (int)q->stride_n, 0.0f, w.C, Lq);
                one_sided_rows(Lq, Lk, w.C, w.u, w.A, w.hist, w.scr, r->r, NULL);
                for (size_t i = 0; i < (size_t)Lq * L; i++) r->X[i] = (float)w.X[i];
                memcpy(r->rho, w.rho, sizeof(double) * (size_t)Lq);
                copy_rows(r->Q, Qb, q->stride_n, Lq, d->d);
                copy_rows(r->K, Kb, k->stride_n, Lk, d->d);
            }
        }
    }
    free(base);
    /* sum the blocks in problem order */
    int64_t added = 0, rows = 0;
    for (int p = 0; p < P; p++) {
        const int b = p / d->H;
        const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
        if (Lq == 0 || Lk == 0) continue;
        const double *pp = part + blk * (size_t)p;
        for (size_t i = 0; i < (size_t)L * L; i++) c->G[i] += pp[i];
        for (int l = 0; l < L; l++) c->c[l] += pp[(size_t)L * L + l];
        c->yy += pp[(size_t)L * L + L];
        added++;
        rows += Lq;
    }
    free(part);
    if (kl) {
        if (c->nrec + added > c->caprec) {
            int64_t cap = c->caprec ? c->caprec : 64;
            while (cap < c->nrec + added) cap *= 2;
            kl_rec *nr = realloc(c->rec, sizeof(kl_rec) * (size_t)cap);
            if (!nr) {
                for (int p = 0; p < P; p++) rec_free(&recs[p]);
                free(recs);
                /* the LS sums were updated: undo nothing, but report */
                return bki_fail(BK_ERR_NOMEM, "out of memory (ASAP KL records)");
            }
            c->rec = nr;
            c->caprec = cap;
        }
        for (int p = 0; p < P; p++) {
            if (recs[p].Lq == 0) continue;
            c->rec[c->nrec++] = recs[p];
            if (recs[p].Lq > c->maxq) c->maxq = recs[p].Lq;
            if (recs[p].Lk > c->maxk) c->maxk = recs[p].Lk;
        }
        free(recs);
    }
    c->problems += added;
    c->rows += rows;
    bki_clear_error();
    return BK_OK;
}

/* Cholesky solve of (A) x = rhs, A L x L symmetric positive definite (copied). */
static int chol_solve(int L, const double *A, const double *rhs, double *x, double *work)
{
    memcpy(work, A, sizeof(double) * (size_t)L * L);
    memcpy(x, rhs, sizeof(double) * (size_t)L);
    if (LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', L, work, L) != 0) return 0;
    if (LAPACKE_dpotrs(LAPACK_ROW_MAJOR, 'L', L, 1, work, L, x, 1) != 0) return 0;
    for (int l = 0; l < L; l++)
        if (!isfinite(x[l])) return 0;
    return 1;
}

/* KL objective over the records at w: J, gradient and (if H) Hessian, all
 * without the ridge. Per-record blocks in parallel, summed in record order. */
static bk_status kl_eval(const bk_asap_calib *c, const double *w, double *J, double *g, double *H, double *part,
                         char *base, size_t pt)
{
    const int L = c->cfg.slices, d = c->cfg.d;
    const float eps = c->cfg.eps, alpha = c->cfg.scale / eps;
    const int64_t R = c->nrec;
    const size_t blk = (size_t)L * L + L + 1;
    const int nt = bki_work_threads(R > 1 << 30 ? 1 << 30 : (int)R);
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
        bki_arena ar = {bki_align_ptr(base + (size_t)bki_thread_id() * pt), 0, pt - BK_ALIGN};
        const size_t nm = (size_t)c->maxq * c->maxk;
        float *Ct = bki_take(&ar, nm * sizeof(float));
        float *At = bki_take(&ar, nm * sizeof(float));
        float *scr = bki_take(&ar, bki_kern()->sk_scratch(c->maxk, c->maxq, 1) * sizeof(float));
        float *hist = bki_take(&ar, bki_hist_len(c->maxk, c->maxq, 1) * sizeof(float));
        float *u = bki_take(&ar, sizeof(float) * (size_t)c->maxq);
        double *f = bki_take(&ar, sizeof(double) * (size_t)c->maxq);
        double *rh = bki_take(&ar, sizeof(double) * (size_t)c->maxq);
        float *WT = bki_take(&ar, sizeof(float) * (size_t)c->maxk * L);
        float *XD = bki_take(&ar, sizeof(float) * (size_t)c->maxq * L);
#pragma omp for schedule(static)
        for (int64_t m = 0; m < R; m++) {
            const kl_rec *r = &c->rec[m];
            const int Lq = r->Lq, Lk = r->Lk;
            double *pp = part + blk * (size_t)m;
            double lin = 0.0, F = 0.0;
            for (int i = 0; i < Lq; i++) {
                const float *xi = r->X + (size_t)i * L;
                double v = 0.0;
                for (int l = 0; l < L; l++) v += (double)xi[l] * w[l];
                f[i] = v;
                lin += r->r[i] * v;
                u[i] = (float)((v - r->rho[i]) / eps);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Lk, Lq, d, alpha, r->K, d, r->Q, d, 0.0f, Ct, Lq);
            one_sided_rows(Lq, Lk, Ct, u, At, hist, scr, rh, &F);
            pp[(size_t)L * L + L] = (double)eps * F - lin;
            /* gradient X^T (rhat - r) */
            double *gp = pp + (size_t)L * L;
            for (int l = 0; l < L; l++) gp[l] = 0.0;
            for (int i = 0; i < Lq; i++) {
                const float *xi = r->X + (size_t)i * L;
                const double e = rh[i] - r->r[i];
                for (int l = 0; l < L; l++) gp[l] += (double)xi[l] * e;
            }
            if (H) { /* (1/eps) [X^T diag(rhat) X - (1/Lk) W W^T], W^T = At X */
                for (int i = 0; i < Lq; i++)
                    for (int l = 0; l < L; l++) XD[(size_t)i * L + l] = r->X[(size_t)i * L + l] * (float)rh[i];
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Lk, L, Lq, 1.0f, At, Lq, r->X, L, 0.0f, WT, L);
                for (int a = 0; a < L; a++)
                    for (int bb = 0; bb < L; bb++) {
                        double s1 = 0.0, s2 = 0.0;
                        for (int i = 0; i < Lq; i++) s1 += (double)XD[(size_t)i * L + a] * r->X[(size_t)i * L + bb];
                        for (int j = 0; j < Lk; j++) s2 += (double)WT[(size_t)j * L + a] * WT[(size_t)j * L + bb];
                        pp[(size_t)a * L + bb] = (s1 - s2 / Lk) / eps;
                    }
            }
        }
    }
    *J = 0.0;
    for (int l = 0; l < L; l++) g[l] = 0.0;
    if (H) memset(H, 0, sizeof(double) * (size_t)L * L);
    for (int64_t m = 0; m < R; m++) {
        const double *pp = part + blk * (size_t)m;
        *J += pp[(size_t)L * L + L];
        for (int l = 0; l < L; l++) g[l] += pp[(size_t)L * L + l];
        if (H)
            for (size_t i = 0; i < (size_t)L * L; i++) H[i] += pp[i];
    }
    return BK_OK;
}

static bk_status kl_fit(const bk_asap_calib *c, const bk_asap_kl_opts *o, double *w, bk_asap_fit_report *rep)
{
    const int L = c->cfg.slices, d = c->cfg.d;
    const double lam = c->cfg.lambda;
    const int64_t R = c->nrec;
    const size_t blk = (size_t)L * L + L + 1;
    const int nt = bki_work_threads(R > 1 << 30 ? 1 << 30 : (int)R);
    const size_t nm = (size_t)c->maxq * c->maxk;
    const size_t pt = 2 * bki_round_up(nm * sizeof(float)) +
                      bki_round_up(bki_kern()->sk_scratch(c->maxk, c->maxq, 1) * sizeof(float)) +
                      bki_round_up(bki_hist_len(c->maxk, c->maxq, 1) * sizeof(float)) +
                      bki_round_up(sizeof(float) * (size_t)c->maxq) + 2 * bki_round_up(sizeof(double) * (size_t)c->maxq) +
                      bki_round_up(sizeof(float) * (size_t)c->maxk * L) + bki_round_up(sizeof(float) * (size_t)c->maxq * L) +
                      12 * BK_ALIGN;
    (void)d;
    double *part = malloc(sizeof(double) * blk * (size_t)R);
    char *base = malloc((size_t)nt * pt + BK_ALIGN);
    double *buf = malloc(sizeof(double) * (size_t)(3 * L * L + 6 * L));
    if (!part || !base || !buf) {
        free(part);
        free(base);
        free(buf);
        return bki_fail(BK_ERR_NOMEM, "out of memory (ASAP KL fit)");
    }
    double *H = buf, *work = H + (size_t)L * L, *g = work + (size_t)L * L, *dw = g + L, *wt = dw + L, *gt = wt + L;
    double J, Jt;
    kl_eval(c, w, &J, g, H, part, base, pt);
    double wn = 0.0;
    for (int l = 0; l < L; l++) wn += w[l] * w[l];
    J += 0.5 * lam * wn;
    rep->kl_j0 = J;
    int it = 0, conv = 0;
    bk_status st = BK_OK;
    for (;;) {
        for (int l = 0; l < L; l++) {
            g[l] += lam * w[l];
            H[(size_t)l * L + l] += lam;
        }
        double gmax = 0.0;
        for (int l = 0; l < L; l++) gmax = fabs(g[l]) > gmax ? fabs(g[l]) : gmax;
        rep->kl_grad = gmax;
        if (!chol_solve(L, H, g, dw, work)) {
            st = bki_fail(BK_ERR_NUMERIC, "ASAP KL fit: the Hessian is not positive definite (lambda = 0 with "
                                          "degenerate features?)");
            break;
        }
        double dec = 0.0; /* Newton decrement squared: g^T H^-1 g */
        for (int l = 0; l < L; l++) dec += g[l] * dw[l];
        if (dec / 2 < o->tol * (fabs(J) > 1.0 ? fabs(J) : 1.0)) {
            conv = 1;
            break;
        }
        if (it >= o->max_iters) break;
        /* Armijo backtracking (the full step near the optimum, where float
         * noise in J would make the sufficient-decrease test meaningless) */
        double t = 1.0;
        int accepted = 0;
        for (int bt = 0; bt < 40; bt++) {
            for (int l = 0; l < L; l++) wt[l] = w[l] - t * dw[l];
            kl_eval(c, wt, &Jt, gt, NULL, part, base, pt);
            double wn2 = 0.0;
            for (int l = 0; l < L; l++) wn2 += wt[l] * wt[l];
            Jt += 0.5 * lam * wn2;
            if (dec < 1e-6 * (1.0 + fabs(J)) || Jt <= J - 0.25 * t * dec) {
                accepted = 1;
                break;
            }
            t *= 0.5;
        }
        if (!accepted) break; /* no decrease possible at float precision */
        memcpy(w, wt, sizeof(double) * (size_t)L);
        J = Jt;
        it++;
        kl_eval(c, w, &J, g, H, part, base, pt);
        wn = 0.0;
        for (int l = 0; l < L; l++) wn += w[l] * w[l];
        J += 0.5 * lam * wn;
    }
    rep->kl_j = J;
    rep->kl_iters = it;
    rep->kl_converged = conv;
    free(part);
    free(base);
    free(buf);
    return st;
}

bk_status bk_asap_calib_fit(bk_asap_calib *c, bk_asap_fit fit, const bk_asap_kl_opts *kl, bk_asap_layer *ly,
                            bk_asap_fit_report *report)
{
    if (!c || !ly) return bki_fail(BK_ERR_NULL, "ASAP calibration or layer is NULL");
    memset(ly, 0, sizeof *ly);
    if (fit != BK_ASAP_FIT_LS && fit != BK_ASAP_FIT_KL) return bki_fail(BK_ERR_PARAM, "unknown ASAP fit %d", (int)fit);
    if (c->problems == 0)
        return bki_fail(BK_ERR_PARAM, "ASAP calibration set is empty (no problem with a valid query and key)");
    if (fit == BK_ASAP_FIT_KL && !c->keep_kl)
        return bki_fail(BK_ERR_PARAM, "the KL fit needs a calibration created with keep_kl = 1");
    bk_asap_kl_opts ko = kl ? *kl : bk_asap_kl_opts_default();
    if (ko.max_iters < 0 || !(ko.tol >= 0.0)) return bki_fail(BK_ERR_PARAM, "KL options: max_iters >= 0 and tol >= 0");
    const int L = c->cfg.slices, d = c->cfg.d;
    bk_asap_fit_report rep;
    memset(&rep, 0, sizeof rep);
    rep.problems = c->problems;
    rep.rows = c->rows;
    double *Gl = malloc(sizeof(double) * (size_t)L * L), *work = malloc(sizeof(double) * (size_t)L * L);
    double *w = malloc(sizeof(double) * (size_t)L);
    float *theta = malloc(sizeof(float) * (size_t)L * d);
    if (!Gl || !work || !w || !theta) {
        free(Gl);
        free(work);
        free(w);
        free(theta);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    memcpy(Gl, c->G, sizeof(double) * (size_t)L * L);
    for (int l = 0; l < L; l++) Gl[(size_t)l * L + l] += c->cfg.lambda;
    bk_status s = BK_OK;
    if (!chol_solve(L, Gl, c->c, w, work)) {
        s = bki_fail(BK_ERR_NUMERIC, "ASAP LS fit: X^T X + lambda I is singular (lambda = %g); use lambda > 0",
                     c->cfg.lambda);
    } else {
        double rss = c->yy, wc = 0.0, wGw = 0.0;
        for (int a = 0; a < L; a++) {
            wc += w[a] * c->c[a];
            double t = 0.0;
            for (int b = 0; b < L; b++) t += c->G[(size_t)a * L + b] * w[b];
            wGw += w[a] * t;
        }
        rss += wGw - 2 * wc;
        if (rss < 0) rss = 0;
        rep.ls_rmse = sqrt(rss / (double)c->rows);
        rep.ls_r2 = c->yy > 0 ? 1.0 - rss / c->yy : 1.0;
        if (fit == BK_ASAP_FIT_KL) s = kl_fit(c, &ko, w, &rep);
    }
    free(Gl);
    free(work);
    if (s) {
        free(w);
        free(theta);
        return s;
    }
    memcpy(theta, c->theta, sizeof(float) * (size_t)L * d);
    ly->d = d;
    ly->slices = L;
    ly->scale = c->cfg.scale;
    ly->eps = c->cfg.eps;
    ly->teacher_iters = c->cfg.teacher_iters;
    ly->theta = theta;
    ly->omega = w;
    ly->fit = fit;
    ly->lambda = c->cfg.lambda;
    ly->seed = c->cfg.seed;
    ly->theta_given = c->theta_given;
    ly->calib_problems = c->problems;
    ly->calib_rows = c->rows;
    if (report) *report = rep;
    bki_clear_error();
    return BK_OK;
}

void bk_asap_layer_free(bk_asap_layer *ly)
{
    if (!ly) return;
    free(ly->theta);
    free(ly->omega);
    ly->theta = NULL;
    ly->omega = NULL;
}

/* ------------------------------------------------------------------------ */
/* compiled-layer file                                                      */
/* ------------------------------------------------------------------------ */
/* Little-endian layout (x86):
 *   0  char[8]  "BKASAP\0\n"
 *   8  u32      format version          12 u32 header bytes (= 96)
 *   16 i32 d, i32 L, i32 S, i32 fit     32 f32 scale, f32 eps
 *   40 f64 lambda                       48 u64 seed
 *   56 i32 theta_given, i32 0           64 i64 problems, i64 rows
 *   80 u8[16] zero
 *   96 f32 theta[L*d], then f64 omega[L], then u64 FNV-1a 64 of all before. */
#define ASAP_MAGIC "BKASAP\0\n"
#define ASAP_HDR 96

static uint64_t fnv1a(const unsigned char *p, size_t n) { return bki_fnv1a(0xcbf29ce484222325ull, p, n); }

static size_t file_bytes(int L, int d) { return ASAP_HDR + sizeof(float) * (size_t)L * d + sizeof(double) * (size_t)L + 8; }

bk_status bk_asap_save(const char *path, const bk_asap_layer *ly)
{
    if (!path) return bki_fail(BK_ERR_NULL, "path is NULL");
    bk_status s = check_layer(ly);
    if (s) return s;
    const int L = ly->slices, d = ly->d;
    const size_t n = file_bytes(L, d);
    unsigned char *buf = calloc(1, n);
    if (!buf) return bki_fail(BK_ERR_NOMEM, "out of memory");
    uint32_t ver = BK_ASAP_FILE_VERSION, hb = ASAP_HDR;
    int32_t iv[4] = {d, L, ly->teacher_iters, (int32_t)ly->fit};
    float fv[2] = {ly->scale, ly->eps};
    int32_t tg[2] = {ly->theta_given, 0};
    int64_t cnt[2] = {ly->calib_problems, ly->calib_rows};
    memcpy(buf, ASAP_MAGIC, 8);
    memcpy(buf + 8, &ver, 4);
    memcpy(buf + 12, &hb, 4);
    memcpy(buf + 16, iv, 16);
    memcpy(buf + 32, fv, 8);
    memcpy(buf + 40, &ly->lambda, 8);
    memcpy(buf + 48, &ly->seed, 8);
    memcpy(buf + 56, tg, 8);
    memcpy(buf + 64, cnt, 16);
    memcpy(buf + ASAP_HDR, ly->theta, sizeof(float) * (size_t)L * d);
    memcpy(buf + ASAP_HDR + sizeof(float) * (size_t)L * d, ly->omega, sizeof(double) * (size_t)L);
    uint64_t h = fnv1a(buf, n - 8);
    memcpy(buf + n - 8, &h, 8);
    const void *parts[1] = {buf};
    const size_t sizes[1] = {n};
    s = bki_write_atomic(path, 1, parts, sizes);
    free(buf);
    if (s) return s;
    bki_clear_error();
    return BK_OK;
}

bk_status bk_asap_load(const char *path, bk_asap_layer *ly)
{
    if (!path || !ly) return bki_fail(BK_ERR_NULL, "path or layer is NULL");
    memset(ly, 0, sizeof *ly);
    FILE *fp = fopen(path, "rb");
    if (!fp) return bki_fail(BK_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    unsigned char hdr[ASAP_HDR];
    size_t got = fread(hdr, 1, ASAP_HDR, fp);
    if (got < 16 || memcmp(hdr, ASAP_MAGIC, 8) != 0) {
        fclose(fp);
        return bki_fail(BK_ERR_FORMAT, "%s: not an ASAP compiled-layer file (bad magic)", path);
    }
    uint32_t ver, hb;
    memcpy(&ver, hdr + 8, 4);
    memcpy(&hb, hdr + 12, 4);
    if (ver != BK_ASAP_FILE_VERSION) {
        fclose(fp);
        return bki_fail(BK_ERR_FORMAT, "%s: ASAP layer format version %u, this build reads version %d", path, ver,
                        BK_ASAP_FILE_VERSION);
    }
    if (got < ASAP_HDR || hb != ASAP_HDR) {
        fclose(fp);
        return bki_fail(BK_ERR_FORMAT, "%s: truncated or malformed ASAP header", path);
    }
    int32_t iv[4], tg[2];
    float fv[2];
    int64_t cnt[2];
    double lam;
    uint64_t seed;
    memcpy(iv, hdr + 16, 16);
    memcpy(fv, hdr + 32, 8);
    memcpy(&lam, hdr + 40, 8);
    memcpy(&seed, hdr + 48, 8);
    memcpy(tg, hdr + 56, 8);
    memcpy(cnt, hdr + 64, 16);
    const int d = iv[0], L = iv[1];
    if (d < 1 || d > (1 << 24) || L < 1 || L > ASAP_MAX_SLICES || (int64_t)L * d > ((int64_t)1 << 28)) {
        fclose(fp);
        return bki_fail(BK_ERR_FORMAT, "%s: bad sizes in the ASAP header (d=%d L=%d)", path, d, L);
    }
    const size_t n = file_bytes(L, d);
    unsigned char *buf = malloc(n + 1);
    if (!buf) {
        fclose(fp);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    memcpy(buf, hdr, ASAP_HDR);
    size_t rest = fread(buf + ASAP_HDR, 1, n + 1 - ASAP_HDR, fp);
    fclose(fp);
    if (rest != n - ASAP_HDR) {
        free(buf);
        return bki_fail(BK_ERR_FORMAT, "%s: file is %s than its header says (%zu bytes expected)", path,
                        rest < n - ASAP_HDR ? "shorter" : "longer", n);
    }
    uint64_t h, want = fnv1a(buf, n - 8);
    memcpy(&h, buf + n - 8, 8);
    if (h != want) {
        free(buf);
        return bki_fail(BK_ERR_FORMAT, "%s: checksum mismatch (the file is corrupt)", path);
    }
    float *theta = malloc(sizeof(float) * (size_t)L * d);
    double *omega = malloc(sizeof(double) * (size_t)L);
    if (!theta || !omega) {
        free(buf);
        free(theta);
        free(omega);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    memcpy(theta, buf + ASAP_HDR, sizeof(float) * (size_t)L * d);
    memcpy(omega, buf + ASAP_HDR + sizeof(float) * (size_t)L * d, sizeof(double) * (size_t)L);
    free(buf);
    bk_asap_layer t = {d, L, fv[0], fv[1], iv[2], theta, omega, (bk_asap_fit)iv[3], lam, seed, tg[0], cnt[0], cnt[1]};
    bk_status s = check_layer(&t);
    if (!s && !(t.scale > 0.0f)) s = bki_fail(BK_ERR_FORMAT, "scale must be > 0");
    if (!s && iv[3] != BK_ASAP_FIT_LS && iv[3] != BK_ASAP_FIT_KL) s = bki_fail(BK_ERR_FORMAT, "unknown fit %d", iv[3]);
    for (int l = 0; l < L && !s; l++) {
        double nrm = 0.0;
        for (int x = 0; x < d; x++) nrm += (double)theta[(size_t)l * d + x] * theta[(size_t)l * d + x];
        if (!(fabs(nrm - 1.0) < 1e-4)) s = bki_fail(BK_ERR_FORMAT, "slice %d is not a unit vector", l);
        if (!isfinite(omega[l])) s = bki_fail(BK_ERR_FORMAT, "omega[%d] is not finite", l);
    }
    if (s) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", bk_last_error());
        free(theta);
        free(omega);
        return bki_fail(BK_ERR_FORMAT, "%s: invalid ASAP layer (%s)", path, msg);
    }
    *ly = t;
    bki_clear_error();
    return BK_OK;
}

/* ------------------------------------------------------------------------ */
/* fidelity metrics                                                         */
/* ------------------------------------------------------------------------ */
bk_status bk_attn_compare(const bk_attn_desc *d, const bk_tensor *out, const bk_tensor *out_ref,
                          const bk_tensor *attn, const bk_tensor *attn_ref, bk_attn_fidelity *res)
{
    bk_status s;
    if ((s = bki_check_desc(d))) return s;
    if (!res) return bki_fail(BK_ERR_NULL, "result is NULL");
    if ((s = bki_check_tensor("out", out, d->B, d->H, d->Nq, d->dv))) return s;
    if ((s = bki_check_tensor("out_ref", out_ref, d->B, d->H, d->Nq, d->dv))) return s;
    const int with_a = attn && attn->data && attn_ref && attn_ref->data;
    if (with_a) {
        if ((s = bki_check_tensor("attn", attn, d->B, d->H, d->Nq, d->Nk))) return s;
        if ((s = bki_check_tensor("attn_ref", attn_ref, d->B, d->H, d->Nq, d->Nk))) return s;
    }
    double se = 0, sr = 0, sa = 0, srow = 0, scol = 0;
    int np = 0;
    double *col = with_a ? malloc(sizeof(double) * (size_t)d->Nk) : NULL;
    if (with_a && !col) return bki_fail(BK_ERR_NOMEM, "out of memory");
    for (int b = 0; b < d->B; b++)
        for (int h = 0; h < d->H; h++) {
            const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
            if (Lq == 0 || Lk == 0) continue;
            np++;
            const float *O = bki_at(out, b, h), *Or = bki_at(out_ref, b, h);
            double e2 = 0, r2 = 0;
            for (int i = 0; i < Lq; i++)
                for (int c = 0; c < d->dv; c++) {
                    double x = O[(int64_t)i * out->stride_n + c], y = Or[(int64_t)i * out_ref->stride_n + c];
                    e2 += (x - y) * (x - y);
                    r2 += y * y;
                }
            se += sqrt(e2 / ((double)Lq * d->dv));
            sr += sqrt(r2 / ((double)Lq * d->dv));
            if (!with_a) continue;
            const float *A = bki_at(attn, b, h), *Ar = bki_at(attn_ref, b, h);
            double da = 0, na = 0, rowe = 0;
            for (int j = 0; j < Lk; j++) col[j] = 0;
            for (int i = 0; i < Lq; i++) {
                double rs = 0;
                for (int j = 0; j < Lk; j++) {
                    double x = A[(int64_t)i * attn->stride_n + j], y = Ar[(int64_t)i * attn_ref->stride_n + j];
                    da += (x - y) * (x - y);
                    na += y * y;
                    rs += x;
                    col[j] += x;
                }
                rowe += fabs(rs - 1.0);
            }
            double cole = 0;
            for (int j = 0; j < Lk; j++) cole += fabs(col[j] * Lk / Lq - 1.0);
            sa += na > 0 ? sqrt(da / na) : sqrt(da);
            srow += rowe / Lq;
            scol += cole / Lk;
        }
    free(col);
    res->problems = np;
    const double inv = np ? 1.0 / np : NAN;
    res->out_rmse = se * inv;
    res->out_rms = sr * inv;
    res->attn_rel_l2 = with_a ? sa * inv : NAN;
    res->row_err = with_a ? srow * inv : NAN;
    res->col_err = with_a ? scol * inv : NAN;
    bki_clear_error();
    return BK_OK;
}
