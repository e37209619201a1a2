/* attn.c -- the batched driver shared by Sinkhorn and softmax attention:
 * validation, the B*H problems over threads (one per thread, or all threads
 * on one problem: bki_plan), the tiled GEMMs (bki_gemm), padding, optional
 * outputs and the tape. The per-problem normalisation is the LSE engine
 * (src/core/lse_engine.c). */
#include "ops.h"

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

/* ---- workspace ------------------------------------------------------------
 * One lane per problem in flight: C, A, G (Nq x Nk each), the potential
 * history, the engine's scratch for a team of `members`, and the implicit
 * backward's double scratch. A call runs `lanes` problems at a time, each by
 * one thread, or one problem at a time by a team of all threads (bki_plan). */
static bki_plan plan_of(const bk_attn_desc *d)
{
    return bki_plan_problems(d->B * d->H, (double)d->Nq * d->Nk);
}

static size_t lane_bytes(const bk_attn_desc *d, const bki_attn_cfg *c, int members)
{
    size_t nm = (size_t)d->Nq * d->Nk;
    size_t b = 3 * bki_round_up(nm * sizeof(float)); /* C, A, G */
    b += bki_round_up(bki_kern()->sk_scratch(d->Nq, d->Nk, members) * sizeof(float));
    b += bki_round_up(bki_hist_len(d->Nq, d->Nk, c->S) * sizeof(float));
    if (c->grad == BK_GRAD_IMPLICIT) b += bki_round_up(bki_sk_implicit_scratch(d->Nq, d->Nk) * sizeof(double));
    return b + BK_ALIGN;
}

static size_t lanes_bytes(const bk_attn_desc *d, const bki_attn_cfg *c, bki_plan pl)
{
    return (size_t)pl.lanes * lane_bytes(d, c, pl.team ? pl.nt : 1) + BK_ALIGN;
}

size_t bki_attn_workspace_size(const bk_attn_desc *d, const bki_attn_cfg *c)
{
    if (!d || d->B < 1 || d->H < 1 || d->Nq < 1 || d->Nk < 1 || !c || c->S < 1) return 0;
    /* a backward without a tape keeps a temporary tape inside the workspace */
    return lanes_bytes(d, c, plan_of(d)) + bki_attn_tape_size(d, c->S) + BK_ALIGN;
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

/* A lane of the workspace, laid out as lane_bytes sized it. */
typedef struct {
    float *C, *A, *G, *scr, *hist;
    double *dscr;
} lane;

static lane lane_at(char *wsbase, const bk_attn_desc *d, const bki_attn_cfg *c, bki_plan pl, int li)
{
    const int members = pl.team ? pl.nt : 1;
    const size_t lb = lane_bytes(d, c, members);
    bki_arena ar = {bki_align_ptr(wsbase + (size_t)li * lb), 0, lb - BK_ALIGN};
    const size_t nm = (size_t)d->Nq * d->Nk;
    lane s;
    s.C = bki_take(&ar, nm * sizeof(float));
    s.A = bki_take(&ar, nm * sizeof(float));
    s.G = bki_take(&ar, nm * sizeof(float));
    s.scr = bki_take(&ar, bki_kern()->sk_scratch(d->Nq, d->Nk, members) * sizeof(float));
    s.hist = bki_take(&ar, bki_hist_len(d->Nq, d->Nk, c->S) * sizeof(float));
    s.dscr = c->grad == BK_GRAD_IMPLICIT ? bki_take(&ar, bki_sk_implicit_scratch(d->Nq, d->Nk) * sizeof(double))
                                         : NULL;
    return s;
}

/* Runs prob(tm, p, lane, ctx) for p = 0..P-1 as the plan says: a team of all
 * region threads on one problem after another, or one problem per thread
 * (static partition). Every problem ends with its team in sync. */
typedef void (*problem_fn)(const bki_team *tm, int p, const lane *ln, void *ctx);

static void run_problems(const bk_attn_desc *d, const bki_attn_cfg *c, bki_plan pl, char *wsbase, problem_fn prob,
                         void *ctx)
{
    const int P = d->B * d->H;
#pragma omp parallel num_threads(pl.nt)
    {
        BKI_REGION;
        const int tid = bki_thread_id();
        if (pl.team) {
            bki_team tm = {tid, bki_region_size()};
            const lane ln = lane_at(wsbase, d, c, pl, 0);
            for (int p = 0; p < P; p++) {
                prob(&tm, p, &ln, ctx);
                bki_team_sync(&tm);
            }
        } else {
            const bki_team tm = BKI_SOLO;
            const lane ln = lane_at(wsbase, d, c, pl, tid);
#pragma omp for schedule(static)
            for (int p = 0; p < P; p++) prob(&tm, p, &ln, ctx);
        }
    }
}

/* ---- forward -------------------------------------------------------------- */
typedef struct {
    const bk_attn_desc *d;
    const bki_attn_cfg *c;
    const bk_tensor *q, *k, *v, *out;
    void *tape;
    const bk_sinkhorn_extras *ex;
    float alpha;
} fwd_ctx;

static void fwd_problem(const bki_team *tm, int p, const lane *ln, void *vctx)
{
    const fwd_ctx *x = vctx;
    const bk_attn_desc *d = x->d;
    const bki_attn_cfg *c = x->c;
    const bk_tensor *out = x->out;
    const bk_sinkhorn_extras *ex = x->ex;
    const int b = p / d->H, h = p % d->H;
    const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
    const int live = Lq > 0 && Lk > 0;
    float *blk = x->tape ? tape_block(x->tape, d, c->S, p) : NULL;
    float *hist = blk ? blk + 16 : ln->hist;
    bki_sk_result res = {hist, ln->A, Lk, NULL, NULL, 0, 0.0f, 0.0f};
    if (live) {
        const float *Qb = bki_at(x->q, b, h), *Kb = bki_at(x->k, b, h), *Vb = bki_at(x->v, b, h);
        bki_gemm(tm, 0, 1, Lq, Lk, d->d, x->alpha, Qb, x->q->stride_n, Kb, x->k->stride_n, 0.0f, ln->C, Lk);
        bki_team_sync(tm);
        bki_sk_problem pb = {Lq, Lk, ln->C, Lk, NULL, NULL, c->S, c->tol, NULL, c->kappa};
        bki_kern()->sk_forward(tm, &pb, &res, ln->scr);
        if (out)
            bki_gemm(tm, 0, 0, Lq, d->dv, Lk, 1.0f, ln->A, Lk, Vb, x->v->stride_n, 0.0f, bki_at(out, b, h),
                     out->stride_n);
    }
    if (ex && ex->attn.data) { /* rows shared over the team */
        float *Ab = bki_at(&ex->attn, b, h);
        int i0, i1;
        bki_team_share(tm, d->Nq, &i0, &i1);
        for (int i = i0; i < i1; i++) {
            float *row = Ab + (int64_t)i * ex->attn.stride_n;
            if (i < Lq && live) {
                memcpy(row, ln->A + (size_t)i * Lk, sizeof(float) * (size_t)Lk);
                memset(row + Lk, 0, sizeof(float) * (size_t)(d->Nk - Lk));
            } else {
                memset(row, 0, sizeof(float) * (size_t)d->Nk);
            }
        }
    }
    if (tm->tid != 0) return;
    if (out) bki_zero_rows(bki_at(out, b, h), out->stride_n, live ? Lq : 0, d->Nq, d->dv);
    if (blk) {
        int32_t hdr[16] = {res.iters, Lq, Lk};
        memcpy(blk, hdr, sizeof hdr);
    }
    if (ex) {
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

static void forward_core(const bk_attn_desc *d, const bki_attn_cfg *c, const bk_tensor *q, const bk_tensor *k,
                         const bk_tensor *v, const bk_tensor *out, void *tape, const bk_sinkhorn_extras *ex,
                         char *wsbase, bki_plan pl)
{
    const float alpha = alpha_of(d, c);
    if (tape) { /* zeroed first: padded rows leave parts of the history unwritten */
        memset(tape, 0, bki_attn_tape_size(d, c->S));
        tape_header *th = (tape_header *)tape;
        th->magic = TAPE_MAGIC;
        th->version = TAPE_VERSION;
        th->B = d->B; th->H = d->H; th->Nq = d->Nq; th->Nk = d->Nk; th->S = c->S;
        th->kind = c->kind;
        th->alpha = alpha;
    }
    fwd_ctx x = {d, c, q, k, v, out, tape, ex, alpha};
    run_problems(d, c, pl, wsbase, fwd_problem, &x);
}

bk_status bki_attn_forward(const bk_attn_desc *d, const bki_attn_cfg *c, const bk_tensor *q,
                           const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                           const bk_sinkhorn_extras *ex, void *ws, size_t ws_size)
{
    bk_status s;
    if ((s = check_inputs(d, c, q, k, v))) return s;
    if ((s = bki_check_fwd_outputs(d, q, k, v, out, ex ? &ex->attn : NULL))) return s;
    const bki_plan pl = plan_of(d);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(ws, ws_size, lanes_bytes(d, c, pl), "bk_sinkhorn_workspace_size", &owned, &base)))
        return s;
    forward_core(d, c, q, k, v, out, tape, ex, base, pl);
    free(owned);
    bki_clear_error();
    return BK_OK;
}

/* ---- backward ------------------------------------------------------------- */
typedef struct {
    const bk_attn_desc *d;
    const bki_attn_cfg *c;
    const bk_tensor *q, *k, *v, *dout, *dq, *dk, *dv;
    const void *tape;
    float alpha;
    int bad;             /* lowest failing problem index (P: none)        */
    bk_status bad_s;
    bk_status team_s;    /* a team's implicit solve, set by its member 0  */
} bwd_ctx;

static void bwd_problem(const bki_team *tm, int p, const lane *ln, void *vctx)
{
    bwd_ctx *x = vctx;
    const bk_attn_desc *d = x->d;
    const bki_attn_cfg *c = x->c;
    const int b = p / d->H, h = p % d->H;
    const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
    float *dQb = bki_at(x->dq, b, h), *dKb = bki_at(x->dk, b, h), *dVb = bki_at(x->dv, b, h);
    if (Lq == 0 || Lk == 0) {
        if (tm->tid == 0) {
            bki_zero_rows(dQb, x->dq->stride_n, 0, d->Nq, d->d);
            bki_zero_rows(dKb, x->dk->stride_n, 0, d->Nk, d->d);
            bki_zero_rows(dVb, x->dv->stride_n, 0, d->Nk, d->dv);
        }
        return;
    }
    const float *blk = tape_block((void *)x->tape, d, c->S, p);
    const int iters = ((const int32_t *)blk)[0];
    const float *hist = blk + 16;
    const float *Qb = bki_at(x->q, b, h), *Kb = bki_at(x->k, b, h), *Vb = bki_at(x->v, b, h);
    const float *dOb = bki_at(x->dout, b, h);
    const bki_kernels *K = bki_kern();
    float *C = ln->C, *A = ln->A, *G = ln->G;
    bki_gemm(tm, 0, 1, Lq, Lk, d->d, x->alpha, Qb, x->q->stride_n, Kb, x->k->stride_n, 0.0f, C, Lk);
    bki_team_sync(tm);
    bki_sk_problem pb = {Lq, Lk, C, Lk, NULL, NULL, c->S, c->tol, NULL, c->kappa};
    K->sk_attention(tm, &pb, iters, hist, A, Lk, ln->scr);
    /* dV = A^T dO ; Abar = dO V^T */
    bki_gemm(tm, 1, 0, Lk, d->dv, Lq, 1.0f, A, Lk, dOb, x->dout->stride_n, 0.0f, dVb, x->dv->stride_n);
    bki_gemm(tm, 0, 1, Lq, Lk, d->dv, 1.0f, dOb, x->dout->stride_n, Vb, x->v->stride_n, 0.0f, G, Lk);
    bki_team_sync(tm);
    bk_status ps = BK_OK;
    if (c->grad == BK_GRAD_IMPLICIT) { /* one solve in double (LAPACK), by member 0 */
        if (tm->tid == 0) {
            ps = bki_sk_backward_implicit(&pb, A, Lk, G, Lk, ln->dscr);
            if (tm->nt > 1) x->team_s = ps;
        }
        bki_team_sync(tm);
        if (tm->nt > 1) ps = x->team_s;
    } else {
        K->sk_backward(tm, &pb, iters, hist, A, Lk, G, Lk, ln->scr, NULL, NULL);
    }
    if (ps != BK_OK) {
        if (tm->tid == 0) {
#pragma omp critical(bk_bwd_err)
            if (p < x->bad) {
                x->bad = p;
                x->bad_s = ps;
            }
        }
        return;
    }
    /* dQ = alpha G K ; dK = alpha G^T Q */
    bki_gemm(tm, 0, 0, Lq, d->d, Lk, x->alpha, G, Lk, Kb, x->k->stride_n, 0.0f, dQb, x->dq->stride_n);
    bki_gemm(tm, 1, 0, Lk, d->d, Lq, x->alpha, G, Lk, Qb, x->q->stride_n, 0.0f, dKb, x->dk->stride_n);
    if (tm->tid == 0) {
        bki_zero_rows(dQb, x->dq->stride_n, Lq, d->Nq, d->d);
        bki_zero_rows(dKb, x->dk->stride_n, Lk, d->Nk, d->d);
        bki_zero_rows(dVb, x->dv->stride_n, Lk, d->Nk, d->dv);
    }
}

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
    const bki_plan pl = plan_of(d);
    const size_t lb = lanes_bytes(d, c, pl);
    size_t need = lb + (tape_in ? 0 : bki_attn_tape_size(d, c->S) + BK_ALIGN);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(ws, ws_size, need, "bk_sinkhorn_workspace_size", &owned, &base))) return s;
    const void *tape = tape_in;
    if (!tape) { /* recompute the forward's potentials */
        void *tmp = bki_align_ptr(base + lb);
        forward_core(d, c, q, k, v, NULL, tmp, NULL, base, pl);
        tape = tmp;
    }
    const int P = d->B * d->H;
    bwd_ctx x = {d, c, q, k, v, dout, dq, dk, dv, tape, alpha, P, BK_OK, BK_OK};
    run_problems(d, c, pl, base, bwd_problem, &x);
    free(owned);
    if (x.bad < P)
        return bki_fail(x.bad_s, "backward failed on problem %d (b=%d, h=%d): the implicit system could not be "
                                 "solved (is the forward converged?)", x.bad, x.bad / d->H, x.bad % d->H);
    bki_clear_error();
    return BK_OK;
}
