/* sinkhorn.c -- the Sinkhorn family on the operator framework (op.h):
 * softmax attention (S = 1), Sinkhorn attention (Sinkformers) and unbalanced
 * Sinkhorn attention (damped column steps). One problem: C = alpha Q K^T
 * (a tiled GEMM), the LSE engine's half-steps (src/core/lse_engine.c),
 * O = A V; the backward replays the engine from the tape's potentials (or
 * solves the implicit system). Semantics in include/birkhoff/attn.h and
 * docs/ALGORITHMS.md. */
#include "op.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The family's parameters, resolved from any of the three public structs. */
typedef struct {
    float scale, eps;
    int S;
    float tol;
    bk_grad_mode grad;
    float kappa; /* 1: balanced */
    float rho;   /* unbalanced: the KL penalty (kappa = rho / (rho + eps)) */
    int causal;  /* softmax only: query i sees keys j <= i + (Lk - Lq)    */
} sk_cfg;

static sk_cfg cfg_of(const bki_call *c)
{
    sk_cfg k = {0.0f, 1.0f, 1, 0.0f, BK_GRAD_UNROLLED, 1.0f, 0.0f, 0};
    if (c->op == &bki_op_softmax) {
        const bk_softmax_config *p = c->par;
        k.scale = p->scale;
        k.causal = p->causal;
    } else if (c->op == &bki_op_sinkhorn) {
        const bk_sinkhorn_config *p = c->par;
        k.scale = p->scale; k.eps = p->eps; k.S = p->iters; k.tol = p->tol; k.grad = p->grad;
    } else {
        const bk_unbalanced_config *p = c->par;
        k.scale = p->scale; k.eps = p->eps; k.S = p->iters; k.tol = p->tol; k.rho = p->rho;
        k.kappa = p->rho / (p->rho + p->eps);
    }
    return k;
}

static float alpha_of(const bki_call *c, const sk_cfg *k)
{
    return bki_scale(k->scale, c->d->d) / k->eps;
}

static bk_status check(const bki_call *c)
{
    const sk_cfg k = cfg_of(c);
    if (!(k.S >= 1 && k.S <= 1000000)) return bki_fail(BK_ERR_PARAM, "iters (S) must be in [1, 1e6], got %d", k.S);
    if (!(k.eps > 0.0f) || !isfinite(k.eps)) return bki_fail(BK_ERR_PARAM, "eps must be finite and > 0, got %g", (double)k.eps);
    if (!isfinite(k.scale)) return bki_fail(BK_ERR_PARAM, "scale must be finite, got %g", (double)k.scale);
    if (!(k.tol >= 0.0f) || !isfinite(k.tol)) return bki_fail(BK_ERR_PARAM, "tol must be finite and >= 0, got %g", (double)k.tol);
    if (k.grad != BK_GRAD_UNROLLED && k.grad != BK_GRAD_IMPLICIT)
        return bki_fail(BK_ERR_PARAM, "unknown gradient mode %d", (int)k.grad);
    if (c->op == &bki_op_unbalanced && (!(k.rho > 0.0f) || !isfinite(k.rho) || !(k.kappa > 0.0f)))
        return bki_fail(BK_ERR_PARAM, "rho must be finite and > 0, got %g", (double)k.rho);
    if (c->d && c->d->d >= 1 && !isfinite(alpha_of(c, &k)))
        return bki_fail(BK_ERR_PARAM, "scale/eps overflows (scale=%g eps=%g)", (double)k.scale, (double)k.eps);
    if (k.causal != 0 && k.causal != 1) return bki_fail(BK_ERR_PARAM, "causal must be 0 or 1, got %d", k.causal);
    if (k.causal && !c->ws_mode)
        for (int b = 0; b < c->d->B; b++) {
            const int Lq = bki_len(c->d->q_len, b, c->d->Nq), Lk = bki_len(c->d->k_len, b, c->d->Nk);
            if (Lq > 0 && Lk < Lq)
                return bki_fail(BK_ERR_LENGTH,
                                "causal softmax needs at least as many keys as queries (the queries are the last "
                                "positions): batch %d has Lq=%d, Lk=%d",
                                b, Lq, Lk);
        }
    return BK_OK;
}

/* causal: C_ij = -inf for j > i + (Lk - Lq) on the valid block (rows shared
 * over the team); exp(-inf) is exactly 0 in the engine, so A_ij = 0 and the
 * replayed backward gives those entries no gradient */
static void mask_causal(const bki_team *tm, const sk_cfg *k, int Lq, int Lk, float *C)
{
    if (!k->causal) return;
    /* row blocks claimed at run time (internal.h) */
    const int rb = bki_row_block(Lq);
    bki_claims cl = bki_claims_open(tm, bki_nblocks(Lq, rb));
    for (int64_t blk; bki_claims_next(&cl, &blk);) {
        const int i0 = (int)blk * rb, i1 = i0 + rb < Lq ? i0 + rb : Lq;
        for (int i = i0; i < i1; i++)
            for (int j = i + (Lk - Lq) + 1; j < Lk; j++) C[(size_t)i * Lk + j] = -INFINITY;
    }
    bki_team_sync(tm);
}

static double cost(const bki_call *c) { return (double)c->d->Nq * c->d->Nk; }

/* ---- a lane: C, A, G (Nq x Nk), the engine's scratch, a history for a
 * forward without a tape, the implicit backward's double scratch ---- */
typedef struct {
    float *C, *A, *G, *scr, *hist;
    double *dscr;
} lane;

/* carves a lane from base (NULL: only measures it into *used) */
static lane carve(const bki_call *c, const sk_cfg *k, int members, char *base, size_t *used)
{
    const bk_attn_desc *d = c->d;
    bki_arena ar = {base, 0, (size_t)-1};
    const size_t nm = (size_t)d->Nq * d->Nk;
    lane s;
    s.C = bki_carve(&ar, nm * sizeof(float));
    s.A = bki_carve(&ar, nm * sizeof(float));
    s.G = bki_carve(&ar, nm * sizeof(float));
    s.scr = bki_carve(&ar, bki_kern()->sk_scratch(d->Nq, d->Nk, members) * sizeof(float));
    s.hist = bki_carve(&ar, bki_hist_len(d->Nq, d->Nk, k->S) * sizeof(float));
    s.dscr = k->grad == BK_GRAD_IMPLICIT ? bki_carve(&ar, bki_sk_implicit_scratch(d->Nq, d->Nk) * sizeof(double)) : NULL;
    if (used) *used = ar.used;
    return s;
}

static size_t lane_bytes(const bki_call *c, int members)
{
    size_t used;
    const sk_cfg k = cfg_of(c);
    (void)carve(c, &k, members, NULL, &used);
    return used + BK_ALIGN;
}

static size_t block_bytes(const bki_call *c)
{
    return bki_hist_len(c->d->Nq, c->d->Nk, cfg_of(c).S) * sizeof(float);
}

static uint32_t key(const bki_call *c)
{
    const sk_cfg k = cfg_of(c);
    const float a = alpha_of(c, &k);
    uint64_t h = bki_fnv1a(BKI_FNV_OFFSET, &c->op->id, sizeof c->op->id);
    h = bki_fnv1a(h, &a, sizeof a);
    h = bki_fnv1a(h, &k.S, sizeof k.S);
    h = bki_fnv1a(h, &k.kappa, sizeof k.kappa);
    h = bki_fnv1a(h, &k.causal, sizeof k.causal);
    return (uint32_t)(h ^ (h >> 32));
}

static int steps_ok(const bki_call *c, const bki_block_header *h)
{
    const int live = h->Lq > 0 && h->Lk > 0;
    return live ? (h->steps[0] >= 1 && h->steps[0] <= cfg_of(c).S) : h->steps[0] == 0;
}

/* ---- forward ------------------------------------------------------------- */
static void forward(const bki_team *tm, bki_call *c, int p, char *base)
{
    const bk_attn_desc *d = c->d;
    const sk_cfg k = cfg_of(c);
    const lane ln = carve(c, &k, c->pl.team ? c->pl.nt : 1, base, NULL);
    const bk_sinkhorn_extras *ex = c->op == &bki_op_softmax ? NULL : c->ex;
    const int b = p / d->H, h = p % d->H, Lq = bki_op_lq(c, p), Lk = bki_op_lk(c, p);
    const int live = Lq > 0 && Lk > 0;
    bki_block_header *blk = c->tape ? bki_op_block(c, p) : NULL;
    float *hist = blk ? (float *)(blk + 1) : ln.hist;
    bki_sk_result res = {hist, ln.A, Lk, NULL, NULL, 0, 0.0f, 0.0f};
    if (live) {
        bki_gemm(tm, 0, 1, Lq, Lk, d->d, alpha_of(c, &k), bki_at(c->q, b, h), c->q->stride_n, bki_at(c->k, b, h),
                 c->k->stride_n, 0.0f, ln.C, Lk);
        bki_team_sync(tm);
        mask_causal(tm, &k, Lq, Lk, ln.C);
        /* the errors are reported through the extras' diag only */
        bki_sk_problem pb = {Lq, Lk, ln.C, Lk, NULL, NULL, k.S, k.tol, NULL, k.kappa, !(ex && ex->diag)};
        bki_kern()->sk_forward(tm, &pb, &res, ln.scr);
        if (c->out)
            bki_gemm(tm, 0, 0, Lq, d->dv, Lk, 1.0f, ln.A, Lk, bki_at(c->v, b, h), c->v->stride_n, 0.0f,
                     bki_at(c->out, b, h), c->out->stride_n);
    }
    bki_op_export_attn(tm, c, p, ln.A, Lk, Lq, Lk);
    if (tm->tid != 0) return;
    if (c->out) bki_zero_rows(bki_at(c->out, b, h), c->out->stride_n, live ? Lq : 0, d->Nq, d->dv);
    if (blk) blk->steps[0] = res.iters;
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

/* ---- backward ------------------------------------------------------------ */
static void backward(const bki_team *tm, bki_call *c, int p, char *base)
{
    const bk_attn_desc *d = c->d;
    const sk_cfg k = cfg_of(c);
    const lane ln = carve(c, &k, c->pl.team ? c->pl.nt : 1, base, NULL);
    const int b = p / d->H, h = p % d->H, Lq = bki_op_lq(c, p), Lk = bki_op_lk(c, p);
    float *dQb = bki_at(c->dq, b, h), *dKb = bki_at(c->dk, b, h), *dVb = bki_at(c->dv, b, h);
    if (Lq == 0 || Lk == 0) {
        if (tm->tid == 0) {
            bki_zero_rows(dQb, c->dq->stride_n, 0, d->Nq, d->d);
            bki_zero_rows(dKb, c->dk->stride_n, 0, d->Nk, d->d);
            bki_zero_rows(dVb, c->dv->stride_n, 0, d->Nk, d->dv);
        }
        return;
    }
    const bki_block_header *blk = bki_op_block(c, p);
    const int iters = blk->steps[0];
    const float *hist = (const float *)(blk + 1);
    const float *Qb = bki_at(c->q, b, h), *Kb = bki_at(c->k, b, h), *Vb = bki_at(c->v, b, h);
    const float *dOb = bki_at(c->dout, b, h);
    const float alpha = alpha_of(c, &k);
    const bki_kernels *K = bki_kern();
    bki_gemm(tm, 0, 1, Lq, Lk, d->d, alpha, Qb, c->q->stride_n, Kb, c->k->stride_n, 0.0f, ln.C, Lk);
    bki_team_sync(tm);
    mask_causal(tm, &k, Lq, Lk, ln.C);
    bki_sk_problem pb = {Lq, Lk, ln.C, Lk, NULL, NULL, k.S, k.tol, NULL, k.kappa, 1};
    K->sk_attention(tm, &pb, iters, hist, ln.A, Lk, ln.scr);
    /* dV = A^T dO ; Abar = dO V^T */
    bki_gemm(tm, 1, 0, Lk, d->dv, Lq, 1.0f, ln.A, Lk, dOb, c->dout->stride_n, 0.0f, dVb, c->dv->stride_n);
    bki_gemm(tm, 0, 1, Lq, Lk, d->dv, 1.0f, dOb, c->dout->stride_n, Vb, c->v->stride_n, 0.0f, ln.G, Lk);
    bki_team_sync(tm);
    bk_status ps = BK_OK;
    if (k.grad == BK_GRAD_IMPLICIT) { /* one solve in double (LAPACK), by member 0 */
        if (tm->tid == 0) {
            ps = bki_sk_backward_implicit(&pb, ln.A, Lk, ln.G, Lk, ln.dscr);
            if (tm->nt > 1) c->team_s = ps;
        }
        bki_team_sync(tm);
        if (tm->nt > 1) ps = c->team_s;
    } else {
        K->sk_backward(tm, &pb, iters, hist, ln.A, Lk, ln.G, Lk, ln.scr, NULL, NULL);
    }
    if (ps != BK_OK) {
        if (tm->tid == 0) bki_op_fail(c, p, ps);
        return;
    }
    /* dQ = alpha G K ; dK = alpha G^T Q */
    bki_gemm(tm, 0, 0, Lq, d->d, Lk, alpha, ln.G, Lk, Kb, c->k->stride_n, 0.0f, dQb, c->dq->stride_n);
    bki_gemm(tm, 1, 0, Lk, d->d, Lq, alpha, ln.G, Lk, Qb, c->q->stride_n, 0.0f, dKb, c->dk->stride_n);
    if (tm->tid == 0) {
        bki_zero_rows(dQb, c->dq->stride_n, Lq, d->Nq, d->d);
        bki_zero_rows(dKb, c->dk->stride_n, Lk, d->Nk, d->d);
        bki_zero_rows(dVb, c->dv->stride_n, Lk, d->Nk, d->dv);
    }
}

/* ---- the three operators ------------------------------------------------- */
bk_softmax_config bk_softmax_config_default(void)
{
    bk_softmax_config p = {0.0f, 0};
    return p;
}

bk_sinkhorn_config bk_sinkhorn_config_default(void)
{
    bk_sinkhorn_config p = {0.0f, 1.0f, 5, 0.0f, BK_GRAD_UNROLLED};
    return p;
}

bk_unbalanced_config bk_unbalanced_config_default(void)
{
    bk_unbalanced_config p = {0.0f, 1.0f, 5, 0.0f, 10.0f};
    return p;
}

static void softmax_default(void *p) { *(bk_softmax_config *)p = bk_softmax_config_default(); }
static void sinkhorn_default(void *p) { *(bk_sinkhorn_config *)p = bk_sinkhorn_config_default(); }
static void unbalanced_default(void *p) { *(bk_unbalanced_config *)p = bk_unbalanced_config_default(); }

static const char *const grad_names[] = {"unrolled", "implicit", NULL};
/* the schema's ranges are those check() enforces on each value alone */
#define SK_SCALE(T)                                                                                                 \
    {.name = "scale", .type = BKI_F_FLOAT, .offset = offsetof(T, scale),                                            \
     .doc = "score scale s (0: 1/sqrt(d)); finite"}
#define SK_COMMON(T)                                                                                                \
    SK_SCALE(T),                                                                                                    \
    {.name = "eps", .type = BKI_F_FLOAT, .offset = offsetof(T, eps), .doc = "temperature (scores are s q.k / eps)", \
     .lo = 0.0, .hi = INFINITY, .rflags = BKI_FR_OPEN_LO},                                                          \
    {.name = "iters", .type = BKI_F_INT, .offset = offsetof(T, iters),                                              \
     .doc = "half-steps S, row first (S = 1 is softmax)", .lo = 1, .hi = 1e6},                                      \
    {.name = "tol", .type = BKI_F_FLOAT, .offset = offsetof(T, tol),                                                \
     .doc = "per-problem early stop on the column-marginal error (0: off)", .lo = 0.0, .hi = INFINITY}
static const bki_field softmax_fields[] = {
    SK_SCALE(bk_softmax_config),
    {.name = "causal", .type = BKI_F_INT, .offset = offsetof(bk_softmax_config, causal),
     .doc = "1: query i sees keys j <= i + (Lk - Lq) (the queries are the last positions)", .lo = 0, .hi = 1},
};
static const bki_field sinkhorn_fields[] = {
    SK_COMMON(bk_sinkhorn_config),
    {.name = "grad", .type = BKI_F_ENUM, .offset = offsetof(bk_sinkhorn_config, grad), .names = grad_names,
     .doc = "backward: unrolled (exact for the S steps run) or implicit (at convergence)"},
};
static const bki_field unbalanced_fields[] = {
    SK_COMMON(bk_unbalanced_config),
    {.name = "rho", .type = BKI_F_FLOAT, .offset = offsetof(bk_unbalanced_config, rho),
     .doc = "KL penalty on the column marginal: column half-steps damped by rho / (rho + eps)", .lo = 0.0,
     .hi = INFINITY, .rflags = BKI_FR_OPEN_LO},
};
#undef SK_COMMON
#undef SK_SCALE

/* ---- the extra outputs: diag [B, H, 3], the potentials f [B, H, Nq] and
 * g [B, H, Nk] ---- */
static int diag_shape(const void *par, const bk_attn_desc *d, int64_t dims[4])
{
    (void)par;
    dims[0] = d->B; dims[1] = d->H; dims[2] = 3;
    return 3;
}

static int f_shape(const void *par, const bk_attn_desc *d, int64_t dims[4])
{
    (void)par;
    dims[0] = d->B; dims[1] = d->H; dims[2] = d->Nq;
    return 3;
}

static int g_shape(const void *par, const bk_attn_desc *d, int64_t dims[4])
{
    (void)par;
    dims[0] = d->B; dims[1] = d->H; dims[2] = d->Nk;
    return 3;
}

enum { A_DIAG, A_F, A_G }; /* the arrays' indices */
static const bki_array sk_arrays[] = {
    [A_DIAG] = {.name = "diag", .doc = "per problem: half-steps run, max |row sum - 1|, max |col sum - 1| (relative)",
     .kind = BKI_ARR_FWD | BKI_ARR_HOST | BKI_ARR_SUMMARY, .shape_text = "[B, H, 3]", .shape = diag_shape,
     .cols = "#half-steps,|row sum - 1|,|col sum - 1|;(relative)"},
    [A_F] = {.name = "f", .doc = "row potential (logit units; 0 on padded rows)", .kind = BKI_ARR_FWD,
     .shape_text = "[B, H, Nq]", .shape = f_shape},
    [A_G] = {.name = "g", .doc = "column potential (logit units; 0 on padded keys, 0 if S = 1)", .kind = BKI_ARR_FWD,
     .shape_text = "[B, H, Nk]", .shape = g_shape},
};

/* the forward with its extras (the diagnostics as floats; the backward has
 * none) */
static bk_status sk_run_arrays(bki_call *c, float *const *a, void *tape, void *ws, size_t ws_size)
{
    if (c->dout) return bki_op_backward(c, tape, ws, ws_size);
    const int P = c->d ? c->d->B * c->d->H : 0;
    bk_sinkhorn_diag *dg = a[A_DIAG] && P > 0 ? malloc(sizeof *dg * (size_t)P) : NULL;
    if (a[A_DIAG] && P > 0 && !dg) return bki_fail(BK_ERR_NOMEM, "sinkhorn: no memory for the diagnostics");
    bk_sinkhorn_extras ex = {.f = a[A_F], .g = a[A_G], .diag = dg};
    c->ex = &ex;
    bk_status s = bki_op_forward(c, tape, ws, ws_size);
    c->ex = NULL;
    for (int p = 0; s == BK_OK && dg && p < P; p++) {
        a[A_DIAG][3 * p] = (float)dg[p].iters;
        a[A_DIAG][3 * p + 1] = dg[p].row_err;
        a[A_DIAG][3 * p + 2] = dg[p].col_err;
    }
    free(dg);
    return s;
}

#define SK_CAPS (BKI_CAP_CROSS | BKI_CAP_PAD | BKI_CAP_ATTN | BKI_CAP_MODEL)
/* the bench's cases (docs/PERFORMANCE.md's targets) */
static const bki_bench_case softmax_bench[] = {
    {.name = "", .B = 1, .H = 8, .Nq = 1024, .Nk = 1024, .d = 64, .dv = 64, .params = "", .backward = 1},
    {.name = "", .B = 1, .H = 16, .Nq = 256, .Nk = 256, .d = 64, .dv = 64, .params = "", .backward = 1},
};
static const bki_bench_case sinkhorn_bench[] = {
    {.name = "", .B = 1, .H = 16, .Nq = 256, .Nk = 256, .d = 64, .dv = 64, .params = "iters=5", .backward = 1},
    {.name = "", .B = 1, .H = 8, .Nq = 1024, .Nk = 1024, .d = 64, .dv = 64, .params = "iters=5", .backward = 1},
    {.name = "", .B = 1, .H = 16, .Nq = 256, .Nk = 256, .d = 64, .dv = 64, .params = "iters=3", .backward = 1},
    {.name = "", .B = 1, .H = 8, .Nq = 512, .Nk = 512, .d = 64, .dv = 64, .params = "iters=10", .backward = 1},
    {.name = "", .B = 1, .H = 8, .Nq = 512, .Nk = 512, .d = 64, .dv = 64, .params = "iters=5", .backward = 1},
};
static const bki_bench_case unbalanced_bench[] = {
    {.name = "", .B = 1, .H = 16, .Nq = 256, .Nk = 256, .d = 64, .dv = 64, .params = "iters=5", .backward = 1},
    {.name = "", .B = 1, .H = 8, .Nq = 1024, .Nk = 1024, .d = 64, .dv = 64, .params = "iters=5", .backward = 1},
};

const bki_op bki_op_softmax = {
    .name = "softmax", .id = 1, .par_name = "bk_softmax_config", .fields = softmax_fields,
    .nfields = BKI_NB(softmax_fields), .par_size = sizeof(bk_softmax_config), .par_default = softmax_default,
    .check = check, .cost = cost, .lane_bytes = lane_bytes, .block_bytes = block_bytes, .key = key,
    .forward = forward, .backward = backward, .steps_ok = steps_ok,
    .doc = "softmax attention softmax(s Q K^T) V (Vaswani et al. 2017); causal masking optional",
    .caps = SK_CAPS | BKI_CAP_CAUSAL, .bench = softmax_bench, .nbench = BKI_NB(softmax_bench),
};
const bki_op bki_op_sinkhorn = {
    .name = "sinkhorn", .id = 2, .par_name = "bk_sinkhorn_config", .fields = sinkhorn_fields,
    .nfields = BKI_NB(sinkhorn_fields), .par_size = sizeof(bk_sinkhorn_config), .par_default = sinkhorn_default,
    .check = check, .cost = cost, .lane_bytes = lane_bytes, .block_bytes = block_bytes, .key = key,
    .forward = forward, .backward = backward, .steps_ok = steps_ok,
    .doc = "Sinkhorn attention: S alternating normalisations of exp(s Q K^T / eps) (Sinkformers, Sander et al. 2022)",
    .caps = SK_CAPS, .bench = sinkhorn_bench, .nbench = BKI_NB(sinkhorn_bench), .arrays = sk_arrays,
    .narrays = BKI_NB(sk_arrays), .run_arrays = sk_run_arrays,
};
const bki_op bki_op_unbalanced = {
    .name = "unbalanced", .id = 6, .par_name = "bk_unbalanced_config", .fields = unbalanced_fields,
    .nfields = BKI_NB(unbalanced_fields), .par_size = sizeof(bk_unbalanced_config), .par_default = unbalanced_default,
    .check = check, .cost = cost, .lane_bytes = lane_bytes, .block_bytes = block_bytes, .key = key,
    .forward = forward, .backward = backward, .steps_ok = steps_ok,
    .doc = "unbalanced Sinkhorn attention: column half-steps damped by rho / (rho + eps) (KL-relaxed column marginal)",
    .caps = SK_CAPS, .bench = unbalanced_bench, .nbench = BKI_NB(unbalanced_bench), .arrays = sk_arrays,
    .narrays = BKI_NB(sk_arrays), .run_arrays = sk_run_arrays,
};
#undef SK_CAPS

/* ---- public entry points: one line each over the call helpers (op.h) ---- */
size_t bk_sinkhorn_workspace_size(const bk_attn_desc *desc, const bk_sinkhorn_config *p)
{
    return bki_call_workspace(&bki_op_sinkhorn, desc, p);
}

size_t bk_sinkhorn_tape_size(const bk_attn_desc *desc, const bk_sinkhorn_config *p)
{
    return bki_call_tape(&bki_op_sinkhorn, desc, p);
}

bk_status bk_sinkhorn_forward(const bk_attn_desc *desc, const bk_sinkhorn_config *p, const bk_tensor *q,
                              const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                              const bk_sinkhorn_extras *extras, void *ws, size_t ws_size)
{
    return bki_call_forward(&bki_op_sinkhorn, desc, p, q, k, v, out, tape, extras, extras ? &extras->attn : NULL, ws,
                            ws_size);
}

bk_status bk_sinkhorn_backward(const bk_attn_desc *desc, const bk_sinkhorn_config *p, const bk_tensor *q,
                               const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout, const void *tape,
                               const bk_tensor *dq, const bk_tensor *dk, const bk_tensor *dv, void *ws, size_t ws_size)
{
    return bki_call_backward(&bki_op_sinkhorn, desc, p, q, k, v, dout, tape, dq, dk, dv, NULL, ws, ws_size);
}

size_t bk_unbalanced_workspace_size(const bk_attn_desc *desc, const bk_unbalanced_config *p)
{
    return bki_call_workspace(&bki_op_unbalanced, desc, p);
}

size_t bk_unbalanced_tape_size(const bk_attn_desc *desc, const bk_unbalanced_config *p)
{
    return bki_call_tape(&bki_op_unbalanced, desc, p);
}

bk_status bk_unbalanced_forward(const bk_attn_desc *desc, const bk_unbalanced_config *p, const bk_tensor *q,
                                const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                                const bk_sinkhorn_extras *extras, void *ws, size_t ws_size)
{
    return bki_call_forward(&bki_op_unbalanced, desc, p, q, k, v, out, tape, extras, extras ? &extras->attn : NULL,
                            ws, ws_size);
}

bk_status bk_unbalanced_backward(const bk_attn_desc *desc, const bk_unbalanced_config *p, const bk_tensor *q,
                                 const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout, const void *tape,
                                 const bk_tensor *dq, const bk_tensor *dk, const bk_tensor *dv, void *ws,
                                 size_t ws_size)
{
    return bki_call_backward(&bki_op_unbalanced, desc, p, q, k, v, dout, tape, dq, dk, dv, NULL, ws, ws_size);
}

/* softmax: its size queries take no parameters (none changes them) */
size_t bk_softmax_workspace_size(const bk_attn_desc *desc)
{
    const bk_softmax_config p = bk_softmax_config_default();
    return bki_call_workspace(&bki_op_softmax, desc, &p);
}

size_t bk_softmax_tape_size(const bk_attn_desc *desc)
{
    const bk_softmax_config p = bk_softmax_config_default();
    return bki_call_tape(&bki_op_softmax, desc, &p);
}

bk_status bk_softmax_forward(const bk_attn_desc *desc, const bk_softmax_config *p, const bk_tensor *q,
                             const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                             const bk_tensor *attn, void *ws, size_t ws_size)
{
    const bk_softmax_config def = bk_softmax_config_default();
    return bki_call_forward(&bki_op_softmax, desc, p ? p : &def, q, k, v, out, tape, NULL, attn, ws, ws_size);
}

bk_status bk_softmax_backward(const bk_attn_desc *desc, const bk_softmax_config *p, const bk_tensor *q,
                              const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout, const void *tape,
                              const bk_tensor *dq, const bk_tensor *dk, const bk_tensor *dv, void *ws, size_t ws_size)
{
    const bk_softmax_config def = bk_softmax_config_default();
    return bki_call_backward(&bki_op_softmax, desc, p ? p : &def, q, k, v, dout, tape, dq, dk, dv, NULL, ws, ws_size);
}
