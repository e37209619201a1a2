/* lot.c -- LOT attention (LOTFormer): queries -> learnable pivots -> keys,
 * two small entropic OT problems glued, linear in the sequence length.
 * Semantics in include/birkhoff.h, derivations in docs/ALGORITHMS.md
 * section 5.
 *
 * Both inner problems run on the one LSE/Sinkhorn engine (lse_engine.c) with
 * the pivot masses as marginals. The engine returns A = P / a (its plan with
 * rows divided by their marginal), so A1 = n Gamma1 and A2 = diag(1/p0)
 * Gamma2, and the glued attention is simply A = A1 A2: O = A1 (A2 V). The
 * engine's backward also returns the gradients w.r.t. the log marginals,
 * which carry the gradient to the pivot-mass logits. */
#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LOT_MAGIC 0x544f4c42u /* "BLOT" */
#define LOT_VERSION 1u

bk_lot_params bk_lot_params_default(void)
{
    bk_lot_params p = {1, NULL, NULL, 1.0f, 5, 1.0f, 0.0f, 0.0f};
    return p;
}

static bk_status check_params(const bk_attn_desc *d, const bk_lot_params *p)
{
    if (!p) return bki_fail(BK_ERR_NULL, "LOT parameters are NULL");
    if (p->r < 1 || p->r > (1 << 20)) return bki_fail(BK_ERR_PARAM, "number of pivots r must be in [1, 2^20], got %d", p->r);
    if (!p->Z || !p->theta) return bki_fail(BK_ERR_NULL, "LOT pivots Z and logits theta are required");
    if (!(p->temp > 0.0f) || !isfinite(p->temp)) return bki_fail(BK_ERR_PARAM, "pivot temperature must be finite and > 0, got %g", (double)p->temp);
    if (!(p->iters >= 1 && p->iters <= 1000000)) return bki_fail(BK_ERR_PARAM, "iters (T) must be in [1, 1e6], got %d", p->iters);
    if (!(p->eps > 0.0f) || !isfinite(p->eps)) return bki_fail(BK_ERR_PARAM, "eps must be finite and > 0, got %g", (double)p->eps);
    if (!isfinite(p->scale)) return bki_fail(BK_ERR_PARAM, "scale must be finite, got %g", (double)p->scale);
    if (!(p->tol >= 0.0f) || !isfinite(p->tol)) return bki_fail(BK_ERR_PARAM, "tol must be finite and >= 0, got %g", (double)p->tol);
    const float s = p->scale != 0.0f ? p->scale : 1.0f / sqrtf((float)d->d);
    if (!isfinite(s / p->eps)) return bki_fail(BK_ERR_PARAM, "scale/eps overflows");
    for (size_t i = 0; i < (size_t)d->H * p->r * d->d; i++)
        if (!isfinite(p->Z[i])) return bki_fail(BK_ERR_NONFINITE, "pivots Z have a non-finite value at %zu", i);
    for (size_t i = 0; i < (size_t)d->H * p->r; i++) {
        if (!isfinite(p->theta[i])) return bki_fail(BK_ERR_NONFINITE, "pivot logits theta have a non-finite value at %zu", i);
        if (!isfinite(p->theta[i] / p->temp)) return bki_fail(BK_ERR_PARAM, "theta / temp overflows at %zu", i);
    }
    return BK_OK;
}

/* log p0 = log_softmax(theta / temp) and p0 */
static void pivot_masses(int r, const float *theta, float temp, float *logp, float *p)
{
    float mx = -INFINITY;
    for (int t = 0; t < r; t++) mx = fmaxf(mx, theta[t] / temp);
    double z = 0.0;
    for (int t = 0; t < r; t++) z += exp((double)(theta[t] / temp - mx));
    const float lz = mx + (float)log(z);
    for (int t = 0; t < r; t++) {
        logp[t] = theta[t] / temp - lz;
        p[t] = expf(logp[t]);
    }
}

/* ---- tape and workspace ---------------------------------------------------- */
typedef struct {
    uint32_t magic, version;
    int32_t B, H, Nq, Nk, d, r, T;
    float alpha, temp, tol;
    int32_t reserved[4];
} lot_tape_header;

static size_t block_floats(int Nq, int Nk, int r, int T)
{
    return 16 + ((bki_hist_len(Nq, r, T) + bki_hist_len(r, Nk, T) + 15) & ~(size_t)15);
}

size_t bk_lot_tape_size(const bk_attn_desc *d, const bk_lot_params *p)
{
    if (!d || !p || d->B < 1 || d->H < 1 || d->Nq < 1 || d->Nk < 1 || p->r < 1 || p->iters < 1) return 0;
    return sizeof(lot_tape_header) + (size_t)d->B * d->H * block_floats(d->Nq, d->Nk, p->r, p->iters) * sizeof(float);
}

static float *tape_block(const void *tape, const bk_attn_desc *d, const bk_lot_params *p, int pi)
{
    return (float *)((char *)tape + sizeof(lot_tape_header)) + (size_t)pi * block_floats(d->Nq, d->Nk, p->r, p->iters);
}

static size_t fl(size_t n) { return bki_round_up(n * sizeof(float)); }

static size_t slab_bytes(const bk_attn_desc *d, const bk_lot_params *p)
{
    const size_t n = (size_t)d->Nq, m = (size_t)d->Nk, r = (size_t)p->r, dv = (size_t)d->dv;
    const int big = (int)(n > r ? n : r) > (int)(m > r ? m : r) ? (int)(n > r ? n : r) : (int)(m > r ? m : r);
    size_t b = fl(n * r) * 3 + fl(r * m) * 3 + fl(r * dv) * 2 + fl(r) * 4 + fl((size_t)r * d->d);
    b += fl(bki_kern()->sk_scratch(big, big, 1));
    b += fl(bki_hist_len((int)n, (int)r, p->iters)) + fl(bki_hist_len((int)r, (int)m, p->iters));
    return b + BK_ALIGN;
}

typedef struct {
    float *L1, *A1, *G1, *L2, *A2, *G2, *Y, *X, *logp, *p0, *g1, *g2, *dZp, *scr, *h1, *h2;
} lot_slab;

static lot_slab carve(char *base, size_t bytes, const bk_attn_desc *d, const bk_lot_params *p)
{
    bki_arena ar = {base, 0, bytes};
    const size_t n = (size_t)d->Nq, m = (size_t)d->Nk, r = (size_t)p->r, dv = (size_t)d->dv;
    const int big = (int)(n > r ? n : r) > (int)(m > r ? m : r) ? (int)(n > r ? n : r) : (int)(m > r ? m : r);
    lot_slab w;
#define TAKE(ptr, cnt) ptr = bki_take(&ar, (cnt) * sizeof(float))
    TAKE(w.L1, n * r); TAKE(w.A1, n * r); TAKE(w.G1, n * r);
    TAKE(w.L2, r * m); TAKE(w.A2, r * m); TAKE(w.G2, r * m);
    TAKE(w.Y, r * dv); TAKE(w.X, r * dv);
    TAKE(w.logp, r); TAKE(w.p0, r); TAKE(w.g1, r); TAKE(w.g2, r);
    TAKE(w.dZp, r * d->d);
    TAKE(w.scr, bki_kern()->sk_scratch(big, big, 1));
    TAKE(w.h1, bki_hist_len((int)n, (int)r, p->iters));
    TAKE(w.h2, bki_hist_len((int)r, (int)m, p->iters));
#undef TAKE
    return w;
}

static size_t ws_need(const bk_attn_desc *d, const bk_lot_params *p, int nt, int with_tape, int backward)
{
    size_t b = (size_t)nt * slab_bytes(d, p) + BK_ALIGN;
    if (backward) b += fl((size_t)d->B * d->H * p->r * (d->d + 1)) + BK_ALIGN; /* per-problem dZ, dtheta */
    if (with_tape) b += bk_lot_tape_size(d, p) + BK_ALIGN;
    return b;
}

size_t bk_lot_workspace_size(const bk_attn_desc *desc, const bk_lot_params *p)
{
    if (!desc || !p || desc->B < 1 || desc->H < 1 || desc->Nq < 1 || desc->Nk < 1 || desc->d < 1 || desc->dv < 1 ||
        p->r < 1 || p->iters < 1)
        return 0;
    return ws_need(desc, p, bki_work_threads(desc->B * desc->H), 1, 1);
}

static lot_slab thread_slab(const bk_attn_desc *d, const bk_lot_params *p, char *base)
{
    const int tid = bki_thread_id();
    const size_t sb = slab_bytes(d, p);
    return carve(bki_align_ptr(base + (size_t)tid * sb), sb - BK_ALIGN, d, p);
}

/* ---- per problem ----------------------------------------------------------- */
static float alpha_of(const bk_attn_desc *d, const bk_lot_params *p)
{
    return (p->scale != 0.0f ? p->scale : 1.0f / sqrtf((float)d->d)) / p->eps;
}

/* The two inner problems' logits: L1 = (s/eps) Q Z^T (n x r), L2 = (s/eps) Z K^T (r x m). */
static void logits(const bk_attn_desc *d, const bk_lot_params *p, int n, int m, const float *Q, int64_t ldq,
                   const float *Kb, int64_t ldk, const float *Zh, lot_slab *w)
{
    const int r = p->r;
    const float al = alpha_of(d, p);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, r, d->d, al, Q, (int)ldq, Zh, d->d, 0.0f, w->L1, r);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r, m, d->d, al, Zh, d->d, Kb, (int)ldk, 0.0f, w->L2, m);
}

/* Logits, the two inner problems (A1, A2 and potentials) for one problem. */
static void inner_forward(const bki_kernels *K, const bk_attn_desc *d, const bk_lot_params *p, int n, int m,
                          const float *Q, int64_t ldq, const float *Kb, int64_t ldk, const float *Zh, lot_slab *w,
                          float *h1, float *h2, bki_sk_result *r1, bki_sk_result *r2)
{
    const int r = p->r;
    logits(d, p, n, m, Q, ldq, Kb, ldk, Zh, w);
    bki_sk_problem pb1 = {n, r, w->L1, r, NULL, w->logp, p->iters, p->tol, NULL};
    bki_sk_problem pb2 = {r, m, w->L2, m, w->logp, NULL, p->iters, p->tol, NULL};
    bki_sk_result a = {h1, w->A1, r, NULL, NULL, 0, 0.0f, 0.0f}, b = {h2, w->A2, m, NULL, NULL, 0, 0.0f, 0.0f};
    K->sk_forward(&BKI_SOLO, &pb1, &a, w->scr);
    K->sk_forward(&BKI_SOLO, &pb2, &b, w->scr);
    *r1 = a;
    *r2 = b;
}

static void forward_core(const bk_attn_desc *d, const bk_lot_params *p, const bk_tensor *q, const bk_tensor *k,
                         const bk_tensor *v, const bk_tensor *out, void *tape, const bk_lot_extras *ex, char *base,
                         int nt)
{
    lot_tape_header *th = tape;
    memset(th, 0, sizeof *th);
    th->magic = LOT_MAGIC;
    th->version = LOT_VERSION;
    th->B = d->B; th->H = d->H; th->Nq = d->Nq; th->Nk = d->Nk; th->d = d->d; th->r = p->r; th->T = p->iters;
    th->alpha = alpha_of(d, p); th->temp = p->temp; th->tol = p->tol;
    const bki_kernels *K = bki_kern();
    const int P = d->B * d->H, r = p->r;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
        lot_slab w = thread_slab(d, p, base);
#pragma omp for schedule(static)
        for (int pi = 0; pi < P; pi++) {
            const int b = pi / d->H, h = pi % d->H;
            const int n = bki_len(d->q_len, b, d->Nq), m = bki_len(d->k_len, b, d->Nk);
            float *blk = tape_block(tape, d, p, pi);
            int32_t *hdr = (int32_t *)blk;
            float *h1 = blk + 16, *h2 = h1 + bki_hist_len(d->Nq, r, p->iters);
            bk_lot_diag dg = {0, 0, 0.0f, 0.0f};
            hdr[0] = n; hdr[1] = m; hdr[2] = 0; hdr[3] = 0;
            float *Ob = out ? bki_at(out, b, h) : NULL;
            if (n > 0 && m > 0) {
                pivot_masses(r, p->theta + (size_t)h * r, p->temp, w.logp, w.p0);
                bki_sk_result r1, r2;
                inner_forward(K, d, p, n, m, bki_at(q, b, h), q->stride_n, bki_at(k, b, h), k->stride_n,
                              p->Z + (size_t)h * r * d->d, &w, h1, h2, &r1, &r2);
                hdr[2] = r1.iters;
                hdr[3] = r2.iters;
                dg.iters1 = r1.iters;
                dg.iters2 = r2.iters;
                if (Ob) { /* O = A1 (A2 V) */
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, d->dv, m, 1.0f, w.A2, m, bki_at(v, b, h),
                                (int)v->stride_n, 0.0f, w.Y, d->dv);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d->dv, r, 1.0f, w.A1, r, w.Y, d->dv, 0.0f,
                                Ob, (int)out->stride_n);
                }
                if (ex && ex->diag) { /* rows: A1 (A2 1); columns: (1^T A1) A2 */
                    for (int t = 0; t < r; t++) {
                        double rs = 0.0, cs = 0.0;
                        for (int j = 0; j < m; j++) rs += w.A2[(size_t)t * m + j];
                        for (int i = 0; i < n; i++) cs += w.A1[(size_t)i * r + t];
                        w.g1[t] = (float)rs;
                        w.g2[t] = (float)cs;
                    }
                    for (int i = 0; i < n; i++) {
                        double s = 0.0;
                        for (int t = 0; t < r; t++) s += (double)w.A1[(size_t)i * r + t] * w.g1[t];
                        dg.row_err = fmaxf(dg.row_err, (float)fabs(s - 1.0));
                    }
                    for (int j = 0; j < m; j++) {
                        double s = 0.0;
                        for (int t = 0; t < r; t++) s += (double)w.g2[t] * w.A2[(size_t)t * m + j];
                        dg.col_err = fmaxf(dg.col_err, (float)fabs(s * m / n - 1.0));
                    }
                }
                if (ex && ex->attn.data)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, m, r, 1.0f, w.A1, r, w.A2, m, 0.0f,
                                bki_at(&ex->attn, b, h), (int)ex->attn.stride_n);
            }
            if (Ob) bki_zero_rows(Ob, out->stride_n, n > 0 && m > 0 ? n : 0, d->Nq, d->dv);
            if (ex && ex->attn.data) {
                float *Ab = bki_at(&ex->attn, b, h);
                const int live = n > 0 && m > 0;
                for (int i = 0; i < (live ? n : 0); i++)
                    memset(Ab + (int64_t)i * ex->attn.stride_n + m, 0, sizeof(float) * (size_t)(d->Nk - m));
                bki_zero_rows(Ab, ex->attn.stride_n, live ? n : 0, d->Nq, d->Nk);
            }
            if (ex && ex->diag) ex->diag[pi] = dg;
        }
    }
}

static bk_status check_common(const bk_attn_desc *d, const bk_lot_params *p, const bk_tensor *q, const bk_tensor *k,
                              const bk_tensor *v)
{
    bk_status s;
    if ((s = bki_check_desc(d))) return s;
    if ((s = check_params(d, p))) return s;
    return bki_check_qkv(d, q, k, v);
}

bk_status bk_lot_forward(const bk_attn_desc *d, const bk_lot_params *p, const bk_tensor *q, const bk_tensor *k,
                         const bk_tensor *v, const bk_tensor *out, void *tape, const bk_lot_extras *ex, void *ws,
                         size_t ws_size)
{
    bk_status s;
    if ((s = check_common(d, p, q, k, v))) return s;
    if ((s = bki_check_fwd_outputs(d, q, k, v, out, ex ? &ex->attn : NULL))) return s;
    const int nt = bki_work_threads(d->B * d->H);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(ws, ws_size, ws_need(d, p, nt, tape == NULL, 0), "bk_lot_workspace_size", &owned, &base)))
        return s;
    void *tp = tape ? tape : bki_align_ptr(base + (size_t)nt * slab_bytes(d, p) + BK_ALIGN);
    forward_core(d, p, q, k, v, out, tp, ex, base, nt);
    free(owned);
    bki_clear_error();
    return BK_OK;
}

bk_status bk_lot_backward(const bk_attn_desc *d, const bk_lot_params *p, const bk_tensor *q, const bk_tensor *k,
                          const bk_tensor *v, const bk_tensor *dout, const void *tape_in, const bk_tensor *dq,
                          const bk_tensor *dk, const bk_tensor *dv, float *dZ, float *dtheta, void *ws, size_t ws_size)
{
    bk_status s;
    if ((s = check_common(d, p, q, k, v))) return s;
    if ((s = bki_check_bwd_views(d, q, k, v, dout, dq, dk, dv))) return s;
    const int P = d->B * d->H, r = p->r;
    if (tape_in) {
        const lot_tape_header *th = tape_in;
        if (th->magic != LOT_MAGIC || th->version != LOT_VERSION)
            return bki_fail(BK_ERR_TAPE, "tape has a bad magic number or version (not written by bk_lot_forward?)");
        if (th->B != d->B || th->H != d->H || th->Nq != d->Nq || th->Nk != d->Nk || th->d != d->d || th->r != r ||
            th->T != p->iters || th->alpha != alpha_of(d, p) || th->temp != p->temp || th->tol != p->tol)
            return bki_fail(BK_ERR_TAPE, "tape was written for another problem or other parameters");
        for (int pi = 0; pi < P; pi++) {
            const int32_t *hdr = (const int32_t *)tape_block(tape_in, d, p, pi);
            const int b = pi / d->H, n = bki_len(d->q_len, b, d->Nq), m = bki_len(d->k_len, b, d->Nk);
            const int live = n > 0 && m > 0;
            if (hdr[0] != n || hdr[1] != m ||
                (live ? (hdr[2] < 1 || hdr[2] > p->iters || hdr[3] < 1 || hdr[3] > p->iters) : (hdr[2] || hdr[3])))
                return bki_fail(BK_ERR_TAPE, "tape block %d does not match the lengths or is corrupt", pi);
        }
    }
    const int nt = bki_work_threads(d->B * d->H);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(ws, ws_size, ws_need(d, p, nt, tape_in == NULL, 1), "bk_lot_workspace_size", &owned, &base)))
        return s;
    float *grads = (float *)bki_align_ptr(base + (size_t)nt * slab_bytes(d, p) + BK_ALIGN); /* [P][r][d+1] */
    const void *tape = tape_in;
    if (!tape) {
        void *tp = bki_align_ptr((char *)grads + fl((size_t)P * r * (d->d + 1)) + BK_ALIGN);
        forward_core(d, p, q, k, v, NULL, tp, NULL, base, nt);
        tape = tp;
    }
    const bki_kernels *K = bki_kern();
    const float al = alpha_of(d, p);
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
        lot_slab w = thread_slab(d, p, base);
#pragma omp for schedule(static)
        for (int pi = 0; pi < P; pi++) {
            const int b = pi / d->H, h = pi % d->H;
            const float *blk = tape_block(tape, d, p, pi);
            const int32_t *hdr = (const int32_t *)blk;
            const int n = hdr[0], m = hdr[1];
            const float *h1 = blk + 16, *h2 = h1 + bki_hist_len(d->Nq, r, p->iters);
            float *dQb = bki_at(dq, b, h), *dKb = bki_at(dk, b, h), *dVb = bki_at(dv, b, h);
            float *gZ = grads + (size_t)pi * r * (d->d + 1), *gth = gZ + (size_t)r * d->d;
            memset(gZ, 0, sizeof(float) * (size_t)r * (d->d + 1));
            if (n > 0 && m > 0) {
                const float *Qb = bki_at(q, b, h), *Kb = bki_at(k, b, h), *Vb = bki_at(v, b, h), *dOb = bki_at(dout, b, h);
                const float *Zh = p->Z + (size_t)h * r * d->d;
                pivot_masses(r, p->theta + (size_t)h * r, p->temp, w.logp, w.p0);
                logits(d, p, n, m, Qb, q->stride_n, Kb, k->stride_n, Zh, &w);
                bki_sk_problem pb1 = {n, r, w.L1, r, NULL, w.logp, p->iters, p->tol, NULL};
                bki_sk_problem pb2 = {r, m, w.L2, m, w.logp, NULL, p->iters, p->tol, NULL};
                K->sk_attention(&BKI_SOLO, &pb1, hdr[2], h1, w.A1, r, w.scr);
                K->sk_attention(&BKI_SOLO, &pb2, hdr[3], h2, w.A2, m, w.scr);
                const int dvd = d->dv;
                /* Y = A2 V, X = A1^T dO; dV = A2^T X; dA1 = dO Y^T; dA2 = X V^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, dvd, m, 1.0f, w.A2, m, Vb, (int)v->stride_n, 0.0f,
                            w.Y, dvd);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, dvd, n, 1.0f, w.A1, r, dOb, (int)dout->stride_n,
                            0.0f, w.X, dvd);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, dvd, r, 1.0f, w.A2, m, w.X, dvd, 0.0f, dVb,
                            (int)dv->stride_n);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, r, dvd, 1.0f, dOb, (int)dout->stride_n, w.Y, dvd,
                            0.0f, w.G1, r);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r, m, dvd, 1.0f, w.X, dvd, Vb, (int)v->stride_n, 0.0f,
                            w.G2, m);
                /* through the two Sinkhorn problems: logits and log pivot masses */
                K->sk_backward(&BKI_SOLO, &pb1, hdr[2], h1, w.A1, r, w.G1, r, w.scr, NULL, w.g1);
                K->sk_backward(&BKI_SOLO, &pb2, hdr[3], h2, w.A2, m, w.G2, m, w.scr, w.g2, NULL);
                /* dQ = al G1 Z ; dK = al G2^T Z ; dZ = al (G1^T Q + G2 K) */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d->d, r, al, w.G1, r, Zh, d->d, 0.0f, dQb,
                            (int)dq->stride_n);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, d->d, r, al, w.G2, m, Zh, d->d, 0.0f, dKb,
                            (int)dk->stride_n);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, d->d, n, al, w.G1, r, Qb, (int)q->stride_n, 0.0f,
                            gZ, d->d);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, d->d, m, al, w.G2, m, Kb, (int)k->stride_n, 1.0f,
                            gZ, d->d);
                /* log p0 = theta/temp - LSE: dtheta = (g - p0 sum g) / temp */
                double gs = 0.0;
                for (int t = 0; t < r; t++) gs += (double)w.g1[t] + w.g2[t];
                for (int t = 0; t < r; t++) gth[t] = (float)(((double)w.g1[t] + w.g2[t] - w.p0[t] * gs) / p->temp);
            }
            const int live = n > 0 && m > 0;
            bki_zero_rows(dQb, dq->stride_n, live ? n : 0, d->Nq, d->d);
            bki_zero_rows(dKb, dk->stride_n, live ? m : 0, d->Nk, d->d);
            bki_zero_rows(dVb, dv->stride_n, live ? m : 0, d->Nk, d->dv);
        }
    }
    /* pivot gradients summed over the batch in a fixed order */
    if (dZ) memset(dZ, 0, sizeof(float) * (size_t)d->H * r * d->d);
    if (dtheta) memset(dtheta, 0, sizeof(float) * (size_t)d->H * r);
    for (int pi = 0; pi < P; pi++) {
        const int h = pi % d->H;
        const float *gZ = grads + (size_t)pi * r * (d->d + 1), *gth = gZ + (size_t)r * d->d;
        if (dZ)
            for (size_t i = 0; i < (size_t)r * d->d; i++) dZ[(size_t)h * r * d->d + i] += gZ[i];
        if (dtheta)
            for (int t = 0; t < r; t++) dtheta[(size_t)h * r + t] += gth[t];
    }
    free(owned);
    bki_clear_error();
    return BK_OK;
}
