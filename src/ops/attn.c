/* attn.c -- the batched driver shared by Sinkhorn and softmax attention:
 * validation, the B*H problem loop over threads, the GEMMs (CBLAS), padding,
 * optional outputs and the tape. The per-problem normalisation is the LSE
 * engine (src/core/lse_engine.c). */
#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- tape ---------------------------------------------------------------
 * [header 64 B][problem 0 block][problem 1 block]...
 * block: int32 {iters, Lq, Lk, 0...} (64 B) then the potentials history. */
#define TAPE_MAGIC 0x50544b42u /* "BKTP" */
#define TAPE_VERSION 1u

typedef struct {
    uint32_t magic, version;
    int32_t B, H, Nq, Nk, S;
    uint32_t kind;
    float alpha;
    int32_t reserved[7];
} tape_header;

static size_t tape_block_floats(int Nq, int Nk, int S)
{
    return 16 + ((bki_hist_len(Nq, Nk, S) + 15) & ~(size_t)15);
}

size_t bki_attn_tape_size(const bk_attn_desc *d, int S)
{
    if (!d || d->B < 1 || d->H < 1 || d->Nq < 1 || d->Nk < 1 || S < 1) return 0;
    return sizeof(tape_header) + (size_t)d->B * d->H * tape_block_floats(d->Nq, d->Nk, S) * sizeof(float);
}

static float *tape_block(void *tape, const bk_attn_desc *d, int S, int p)
{
    return (float *)((char *)tape + sizeof(tape_header)) + (size_t)p * tape_block_floats(d->Nq, d->Nk, S);
}

/* ---- workspace ------------------------------------------------------------ */
static size_t per_thread_bytes(const bk_attn_desc *d, const bki_attn_cfg *c, int with_hist)
{
    size_t nm = (size_t)d->Nq * d->Nk;
    size_t b = 3 * bki_round_up(nm * sizeof(float)); /* C, A, G */
    b += bki_round_up(bki_kern()->sk_scratch(d->Nq, d->Nk) * sizeof(float));
    if (with_hist) b += bki_round_up(bki_hist_len(d->Nq, d->Nk, c->S) * sizeof(float));
    if (c->grad == BK_GRAD_IMPLICIT) b += bki_round_up(bki_sk_implicit_scratch(d->Nq, d->Nk) * sizeof(double));
    return b + BK_ALIGN;
}

size_t bki_attn_workspace_size(const bk_attn_desc *d, const bki_attn_cfg *c)
{
    if (!d || d->B < 1 || d->H < 1 || d->Nq < 1 || d->Nk < 1 || !c || c->S < 1) return 0;
    /* a backward without a tape keeps a temporary tape inside the workspace */
    return (size_t)bki_work_threads(d->B * d->H) * per_thread_bytes(d, c, 1) + bki_attn_tape_size(d, c->S) + 2 * BK_ALIGN;
}

/* ---- validation ----------------------------------------------------------- */
static bk_status check_cfg(const bki_attn_cfg *c)
{
    if (!(c->S >= 1 && c->S <= 1000000)) return bki_fail(BK_ERR_PARAM, "iters (S) must be in [1, 1e6], got %d", c->S);
    if (!(c->eps > 0.0f) || !isfinite(c->eps)) return bki_fail(BK_ERR_PARAM, "eps must be finite and > 0, got %g", (double)c->eps);
    if (!isfinite(c->scale)) return bki_fail(BK_ERR_PARAM, "scale must be finite, got %g", (double)c->scale);
    if (!(c->tol >= 0.0f) || !isfinite(c->tol)) return bki_fail(BK_ERR_PARAM, "tol must be finite and >= 0, got %g", (double)c->tol);
    if (c->grad != BK_GRAD_UNROLLED && c->grad != BK_GRAD_IMPLICIT)
        return bki_fail(BK_ERR_PARAM, "unknown gradient mode %d", (int)c->grad);
    return BK_OK;
}

static float alpha_of(const bk_attn_desc *d, const bki_attn_cfg *c)
{
    float s = c->scale != 0.0f ? c->scale : 1.0f / sqrtf((float)d->d);
    return s / c->eps;
}

static bk_status check_inputs(const bk_attn_desc *d, const bki_attn_cfg *c, const bk_tensor *q,
                              const bk_tensor *k, const bk_tensor *v)
{
    bk_status s;
    if ((s = bki_check_desc(d))) return s;
    if ((s = check_cfg(c))) return s;
    float alpha = alpha_of(d, c);
    if (!isfinite(alpha)) return bki_fail(BK_ERR_PARAM, "scale/eps overflows (scale=%g eps=%g)", (double)c->scale, (double)c->eps);
    return bki_check_qkv(d, q, k, v);
}

/* One thread's slab of the workspace, laid out as per_thread_bytes sized it. */
typedef struct {
    float *C, *A, *G, *scr, *hist;
    double *dscr;
} slab;

static slab thread_slab(char *wsbase, size_t pt, const bk_attn_desc *d, const bki_attn_cfg *c)
{
    const int tid = bki_thread_id();
    bki_arena ar = {bki_align_ptr(wsbase + (size_t)tid * pt), 0, pt - BK_ALIGN};
    const size_t nm = (size_t)d->Nq * d->Nk;
    slab s;
    s.C = bki_take(&ar, nm * sizeof(float));
    s.A = bki_take(&ar, nm * sizeof(float));
    s.G = bki_take(&ar, nm * sizeof(float));
    s.scr = bki_take(&ar, bki_kern()->sk_scratch(d->Nq, d->Nk) * sizeof(float));
    s.hist = bki_take(&ar, bki_hist_len(d->Nq, d->Nk, c->S) * sizeof(float));
    s.dscr = c->grad == BK_GRAD_IMPLICIT ? bki_take(&ar, bki_sk_implicit_scratch(d->Nq, d->Nk) * sizeof(double))
                                         : NULL;
    return s;
}

/* ---- forward -------------------------------------------------------------- */
static bk_status forward_core(const bk_attn_desc *d, const bki_attn_cfg *c, const bk_tensor *q,
                              const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                              const bk_sinkhorn_extras *ex, char *wsbase, int nt)
{
    const float alpha = alpha_of(d, c);
    const size_t pt = per_thread_bytes(d, c, 1);
    const int P = d->B * d->H;
    const bki_kernels *K = bki_kern();
    if (tape) {
        tape_header *th = (tape_header *)tape;
        memset(th, 0, sizeof *th);
        th->magic = TAPE_MAGIC;
        th->version = TAPE_VERSION;
        th->B = d->B; th->H = d->H; th->Nq = d->Nq; th->Nk = d->Nk; th->S = c->S;
        th->kind = c->kind;
        th->alpha = alpha;
    }
    const int rt = bki_region_threads(P, nt);
#pragma omp parallel num_threads(rt)
    {
        const slab sl = thread_slab(wsbase, pt, d, c);
        float *C = sl.C, *A = sl.A, *scr = sl.scr, *hist_ws = sl.hist;
#pragma omp for schedule(static)
        for (int p = 0; p < P; p++) {
            const int b = p / d->H, h = p % d->H;
            const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
            float *blk = tape ? tape_block(tape, d, c->S, p) : NULL;
            float *hist = blk ? blk + 16 : hist_ws;
            bki_sk_result res = {hist, A, Lk, NULL, NULL, 0, 0.0f, 0.0f};
            if (Lq > 0 && Lk > 0) {
                const float *Qb = bki_at(q, b, h), *Kb = bki_at(k, b, h), *Vb = bki_at(v, b, h);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Lq, Lk, d->d, alpha, Qb,
                            (int)q->stride_n, Kb, (int)k->stride_n, 0.0f, C, Lk);
                bki_sk_problem pb = {Lq, Lk, C, Lk, NULL, NULL, c->S, c->tol, NULL};
                K->sk_forward(&pb, &res, scr);
                if (out)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Lq, d->dv, Lk, 1.0f, A, Lk,
                                Vb, (int)v->stride_n, 0.0f, bki_at(out, b, h), (int)out->stride_n);
            }
            if (out) bki_zero_rows(bki_at(out, b, h), out->stride_n, Lq > 0 && Lk > 0 ? Lq : 0, d->Nq, d->dv);
            if (blk) {
                int32_t hdr[16] = {res.iters, Lq, Lk};
                memcpy(blk, hdr, sizeof hdr);
            }
            if (ex) {
                if (ex->attn.data) {
                    float *Ab = bki_at(&ex->attn, b, h);
                    for (int i = 0; i < d->Nq; i++) {
                        float *row = Ab + (int64_t)i * ex->attn.stride_n;
                        if (i < Lq && Lk > 0) {
                            memcpy(row, A + (size_t)i * Lk, sizeof(float) * (size_t)Lk);
                            memset(row + Lk, 0, sizeof(float) * (size_t)(d->Nk - Lk));
                        } else {
                            memset(row, 0, sizeof(float) * (size_t)d->Nk);
                        }
                    }
                }
                if (ex->f) {
                    float *fo = ex->f + (size_t)p * d->Nq;
                    memset(fo, 0, sizeof(float) * (size_t)d->Nq);
                    if (res.f) memcpy(fo, res.f, sizeof(float) * (size_t)Lq);
                }
                if (ex->g) {
                    float *go = ex->g + (size_t)p * d->Nk;
                    memset(go, 0, sizeof(float) * (size_t)d->Nk);
                    if (res.g) memcpy(go, res.g, sizeof(float) * (size_t)Lk);
                }
                if (ex->diag) {
                    ex->diag[p].iters = res.iters;
                    ex->diag[p].row_err = res.row_err;
                    ex->diag[p].col_err = res.col_err;
                }
            }
        }
    }
    return BK_OK;
}

bk_status bki_attn_forward(const bk_attn_desc *d, const bki_attn_cfg *c, const bk_tensor *q,
                           const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                           const bk_sinkhorn_extras *ex, void *ws, size_t ws_size)
{
    bk_status s;
    if ((s = check_inputs(d, c, q, k, v))) return s;
    if ((s = bki_check_fwd_outputs(d, q, k, v, out, ex ? &ex->attn : NULL))) return s;
    const int nt = bki_work_threads(d->B * d->H);
    size_t need = (size_t)nt * per_thread_bytes(d, c, 1) + BK_ALIGN;
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(ws, ws_size, need, "bk_sinkhorn_workspace_size", &owned, &base))) return s;
    s = forward_core(d, c, q, k, v, out, tape, ex, base, nt);
    free(owned);
    if (s == BK_OK) bki_clear_error();
    return s;
}

/* ---- backward ------------------------------------------------------------- */
bk_status bki_attn_backward(const bk_attn_desc *d, const bki_attn_cfg *c, const bk_tensor *q,
                            const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout,
                            const void *tape_in, const bk_tensor *dq, const bk_tensor *dk,
                            const bk_tensor *dv, void *ws, size_t ws_size)
{
    bk_status s;
    if ((s = check_inputs(d, c, q, k, v))) return s;
    if ((s = bki_check_bwd_views(d, q, k, v, dout, dq, dk, dv))) return s;
    const float alpha = alpha_of(d, c);
    if (tape_in) {
        const tape_header *th = (const tape_header *)tape_in;
        if (th->magic != TAPE_MAGIC || th->version != TAPE_VERSION)
            return bki_fail(BK_ERR_TAPE, "tape has a bad magic number or version (not written by a forward?)");
        if (th->B != d->B || th->H != d->H || th->Nq != d->Nq || th->Nk != d->Nk || th->S != c->S ||
            th->kind != c->kind || th->alpha != alpha)
            return bki_fail(BK_ERR_TAPE, "tape was written for another problem (B=%d H=%d Nq=%d Nk=%d S=%d)",
                            th->B, th->H, th->Nq, th->Nk, th->S);
        for (int p = 0; p < d->B * d->H; p++) {
            const int32_t *hb = (const int32_t *)tape_block((void *)tape_in, d, c->S, p);
            int b = p / d->H;
            int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
            int ok = hb[1] == Lq && hb[2] == Lk &&
                     ((Lq == 0 || Lk == 0) ? hb[0] == 0 : (hb[0] >= 1 && hb[0] <= c->S));
            if (!ok) return bki_fail(BK_ERR_TAPE, "tape block %d does not match the lengths or is corrupt", p);
        }
    }
    const int nt = bki_work_threads(d->B * d->H);
    const size_t pt = per_thread_bytes(d, c, 1);
    size_t need = (size_t)nt * pt + BK_ALIGN + (tape_in ? 0 : bki_attn_tape_size(d, c->S) + BK_ALIGN);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(ws, ws_size, need, "bk_sinkhorn_workspace_size", &owned, &base))) return s;
    const void *tape = tape_in;
    if (!tape) { /* recompute the forward's potentials */
        void *tmp = bki_align_ptr(base + (size_t)nt * pt + BK_ALIGN);
        forward_core(d, c, q, k, v, NULL, tmp, NULL, base, nt);
        tape = tmp;
    }
    const bki_kernels *K = bki_kern();
    const int P = d->B * d->H;
    int bad = P; /* lowest failing problem index */
    bk_status bad_s = BK_OK;
    const int rt = bki_region_threads(P, nt);
#pragma omp parallel num_threads(rt)
    {
        const slab sl = thread_slab(base, pt, d, c);
        float *C = sl.C, *A = sl.A, *G = sl.G, *scr = sl.scr;
        double *dscr = sl.dscr;
#pragma omp for schedule(static)
        for (int p = 0; p < P; p++) {
            const int b = p / d->H, h = p % d->H;
            const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
            float *dQb = bki_at(dq, b, h), *dKb = bki_at(dk, b, h), *dVb = bki_at(dv, b, h);
            if (Lq == 0 || Lk == 0) {
                bki_zero_rows(dQb, dq->stride_n, 0, d->Nq, d->d);
                bki_zero_rows(dKb, dk->stride_n, 0, d->Nk, d->d);
                bki_zero_rows(dVb, dv->stride_n, 0, d->Nk, d->dv);
                continue;
            }
            const float *blk = tape_block((void *)tape, d, c->S, p);
            const int iters = ((const int32_t *)blk)[0];
            const float *hist = blk + 16;
            const float *Qb = bki_at(q, b, h), *Kb = bki_at(k, b, h), *Vb = bki_at(v, b, h);
            const float *dOb = bki_at(dout, b, h);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Lq, Lk, d->d, alpha, Qb, (int)q->stride_n,
                        Kb, (int)k->stride_n, 0.0f, C, Lk);
            bki_sk_problem pb = {Lq, Lk, C, Lk, NULL, NULL, c->S, c->tol, NULL};
            K->sk_attention(&pb, iters, hist, A, Lk, scr);
            /* dV = A^T dO ; Abar = dO V^T */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Lk, d->dv, Lq, 1.0f, A, Lk, dOb,
                        (int)dout->stride_n, 0.0f, dVb, (int)dv->stride_n);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Lq, Lk, d->dv, 1.0f, dOb, (int)dout->stride_n,
                        Vb, (int)v->stride_n, 0.0f, G, Lk);
            bk_status ps = BK_OK;
            if (c->grad == BK_GRAD_IMPLICIT) ps = bki_sk_backward_implicit(&pb, A, Lk, G, Lk, dscr);
            else K->sk_backward(&pb, iters, hist, A, Lk, G, Lk, scr, NULL, NULL);
            if (ps != BK_OK) {
#pragma omp critical(bk_bwd_err)
                if (p < bad) { bad = p; bad_s = ps; }
                continue;
            }
            /* dQ = alpha G K ; dK = alpha G^T Q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Lq, d->d, Lk, alpha, G, Lk, Kb,
                        (int)k->stride_n, 0.0f, dQb, (int)dq->stride_n);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Lk, d->d, Lq, alpha, G, Lk, Qb,
                        (int)q->stride_n, 0.0f, dKb, (int)dk->stride_n);
            bki_zero_rows(dQb, dq->stride_n, Lq, d->Nq, d->d);
            bki_zero_rows(dKb, dk->stride_n, Lk, d->Nk, d->d);
            bki_zero_rows(dVb, dv->stride_n, Lk, d->Nk, d->dv);
        }
    }
    free(owned);
    if (bad < P)
        return bki_fail(bad_s, "backward failed on problem %d (b=%d, h=%d): the implicit system could not be "
                               "solved (is the forward converged?)", bad, bad / d->H, bad % d->H);
    bki_clear_error();
    return BK_OK;
}
