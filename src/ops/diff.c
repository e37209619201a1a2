/* diff.c -- differential attention (DiffTransformer) on the operator
 * framework (op.h): O = (A1 - lambda_h A2) V with A1, A2 the row softmaxes
 * of the two halves of the head dimension. Semantics in
 * include/birkhoff/diff.h, derivation in docs/ALGORITHMS.md.
 *
 * Both softmaxes are the S = 1 case of the one LSE engine
 * (src/core/lse_engine.c), exactly as softmax attention runs it
 * (src/ops/sinkhorn.c): C = alpha Q_half K_half^T by bki_gemm, the engine's
 * row step (its potentials, the row log-normalisers, are the tape), its
 * replay (sk_attention) and its VJP (sk_backward). The backward:
 *     Abar = dO V^T,  dV = A^T dO  (A = A1 - lambda A2),
 *     A1bar = Abar,  A2bar = -lambda Abar,  dlambda = -<Abar, A2>,
 * then each softmax's VJP and dQ_half = alpha Cbar K_half, dK_half =
 * alpha Cbar^T Q_half.
 *
 * Parallel model (internal.h): one problem per thread or a team per problem,
 * the same per-problem code: GEMMs through bki_gemm (fixed tiles), the engine
 * team-aware, elementwise work by rows shared over the team, <Abar, A2> in
 * fixed row blocks (bki_row_block) summed in block order, dlambda kept per
 * problem and summed in problem order (reduce). So results are bitwise the
 * same for any thread count and batch shape. */
#include "op.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

bk_diff_config bk_diff_config_default(void)
{
    bk_diff_config p = {0.0f, NULL};
    return p;
}

static void diff_default(void *p) { *(bk_diff_config *)p = bk_diff_config_default(); }

/* the scalar parameters by key (lambda is an array: the arrays below) */
static const bki_field diff_fields[] = {
    {.name = "scale", .type = BKI_F_FLOAT, .offset = offsetof(bk_diff_config, scale),
     .doc = "score scale s (0: 1/sqrt(d/2)); finite"},
};

static const bk_diff_config *par(const bki_call *c) { return c->par; }

/* alpha = s, or 1/sqrt(d/2) */
static float alpha_of(const bki_call *c) { return bki_scale(par(c)->scale, c->d->d / 2); }

static bk_status check(const bki_call *c)
{
    const bk_diff_config *p = par(c);
    const bk_attn_desc *d = c->d;
    if (d->d % 2 != 0)
        return bki_fail(BK_ERR_SHAPE, "differential attention needs an even head dimension d (two halves), got %d",
                        d->d);
    if (!isfinite(p->scale)) return bki_fail(BK_ERR_PARAM, "scale must be finite, got %g", (double)p->scale);
    if (!isfinite(alpha_of(c))) return bki_fail(BK_ERR_PARAM, "scale overflows (scale=%g)", (double)p->scale);
    if (c->ws_mode) return BK_OK; /* a size query needs the scalars only */
    if (!p->lambda) return bki_fail(BK_ERR_NULL, "differential attention: lambda [H] is required (NULL)");
    for (int h = 0; h < d->H; h++)
        if (!isfinite(p->lambda[h]))
            return bki_fail(BK_ERR_NONFINITE, "lambda has a non-finite value at head %d (%g)", h, (double)p->lambda[h]);
    return BK_OK;
}

static double cost(const bki_call *c) { return 2.0 * c->d->Nq * c->d->Nk; }

/* ---- a lane: the two maps' logits, attentions and gradients (Nq x Nk
 * each), the engine's scratch (shared by the two maps, one after the other),
 * the potentials of a forward without a tape, the blocks' partial sums of
 * <Abar, A2> ---- */
typedef struct {
    float *C1, *C2, *A1, *A2, *G1, *G2, *scr, *hist;
    double *part;
} lane;

/* carves a lane from base (NULL: only measures it into *used) */
static lane carve(const bki_call *c, int members, char *base, size_t *used)
{
    const bk_attn_desc *d = c->d;
    bki_arena ar = {base, 0, (size_t)-1};
    const size_t nm = (size_t)d->Nq * d->Nk;
    lane s;
    s.C1 = bki_carve(&ar, nm * sizeof(float));
    s.C2 = bki_carve(&ar, nm * sizeof(float));
    s.A1 = bki_carve(&ar, nm * sizeof(float));
    s.A2 = bki_carve(&ar, nm * sizeof(float));
    s.G1 = bki_carve(&ar, nm * sizeof(float));
    s.G2 = bki_carve(&ar, nm * sizeof(float));
    s.scr = bki_carve(&ar, bki_kern()->sk_scratch(d->Nq, d->Nk, members) * sizeof(float));
    s.hist = bki_carve(&ar, 2 * bki_hist_len(d->Nq, d->Nk, 1) * sizeof(float));
    s.part = bki_carve(&ar, BKI_MAX_BLOCKS * sizeof(double));
    if (used) *used = ar.used;
    return s;
}

static size_t lane_bytes(const bki_call *c, int members)
{
    size_t used;
    (void)carve(c, members, NULL, &used);
    return used + BK_ALIGN;
}

/* tape block: the row log-normalisers of A1 (Nq) then of A2 (Nq) */
static size_t block_bytes(const bki_call *c) { return 2 * bki_hist_len(c->d->Nq, c->d->Nk, 1) * sizeof(float); }

/* the tape does not depend on lambda: only the scores' scale */
static uint32_t key(const bki_call *c)
{
    const float a = alpha_of(c);
    uint64_t h = bki_fnv1a(BKI_FNV_OFFSET, &c->op->id, sizeof c->op->id);
    h = bki_fnv1a(h, &a, sizeof a);
    return (uint32_t)(h ^ (h >> 32));
}

static int steps_ok(const bki_call *c, const bki_block_header *h)
{
    (void)c;
    if (h->Lq > 0 && h->Lk > 0) return h->steps[0] == 1 && h->steps[1] == 1;
    return h->steps[0] == 0 && h->steps[1] == 0;
}

/* per problem: dlambda of its head */
static size_t pgrad_bytes(const bki_call *c)
{
    (void)c;
    return sizeof(float);
}

static size_t slab_bytes(const bki_call *c) { return bki_round_up(pgrad_bytes(c)); }

/* dlambda[h] = the problems' slabs of head h, summed in problem order */
static void reduce(bki_call *c)
{
    float *dl = c->pg;
    if (!dl) return;
    const int P = c->d->B * c->d->H;
    memset(dl, 0, sizeof(float) * (size_t)c->d->H);
    for (int p = 0; p < P; p++) dl[p % c->d->H] += *(const float *)(c->pgrad + (size_t)p * slab_bytes(c));
}

/* dlambda [H] for the driver's check of the results */
static int pg_arrays(const bki_call *c, bki_farray out[2])
{
    out[0] = (bki_farray){"dlambda", c->pg, (size_t)c->d->H};
    return 1;
}

/* ---- per problem ----------------------------------------------------------
 * The two maps' logits C1 = alpha Q1 K1^T and C2 = alpha Q2 K2^T of problem
 * (b, h) on its valid n x m block, and their engine problems. Ends in sync. */
static void logits(const bki_team *tm, const bki_call *c, int b, int h, int n, int m, const lane *ln,
                   bki_sk_problem *pb1, bki_sk_problem *pb2)
{
    const int dh = c->d->d / 2;
    const float al = alpha_of(c);
    const float *Qb = bki_at(c->q, b, h), *Kb = bki_at(c->k, b, h);
    bki_gemm(tm, 0, 1, n, m, dh, al, Qb, c->q->stride_n, Kb, c->k->stride_n, 0.0f, ln->C1, m);
    bki_gemm(tm, 0, 1, n, m, dh, al, Qb + dh, c->q->stride_n, Kb + dh, c->k->stride_n, 0.0f, ln->C2, m);
    bki_team_sync(tm);
    const bki_sk_problem a = {n, m, ln->C1, m, NULL, NULL, 1, 0.0f, NULL, 1.0f, 1};
    const bki_sk_problem z = {n, m, ln->C2, m, NULL, NULL, 1, 0.0f, NULL, 1.0f, 1};
    *pb1 = a;
    *pb2 = z;
}

/* dst = A1 - lam A2 on the n x m block, by row blocks claimed at run time
 * (internal.h). Ends in sync. */
static void combine(const bki_team *tm, int n, int m, const float *A1, const float *A2, float lam, float *dst)
{
    const int rb = bki_row_block(n);
    bki_claims cl = bki_claims_open(tm, bki_nblocks(n, rb));
    for (int64_t blk; bki_claims_next(&cl, &blk);) {
        const int i0 = (int)blk * rb, i1 = i0 + rb < n ? i0 + rb : n;
        for (size_t x = (size_t)i0 * m; x < (size_t)i1 * m; x++) dst[x] = A1[x] - lam * A2[x];
    }
    bki_team_sync(tm);
}

static void forward(const bki_team *tm, bki_call *c, int p, char *base)
{
    const bk_attn_desc *d = c->d;
    const lane ln = carve(c, c->pl.team ? c->pl.nt : 1, base, NULL);
    const int b = p / d->H, h = p % d->H, n = bki_op_lq(c, p), m = bki_op_lk(c, p);
    const int live = n > 0 && m > 0;
    const bki_kernels *K = bki_kern();
    bki_block_header *blk = c->tape ? bki_op_block(c, p) : NULL;
    float *h1 = blk ? (float *)(blk + 1) : ln.hist, *h2 = h1 + bki_hist_len(d->Nq, d->Nk, 1);
    int it1 = 0, it2 = 0;
    if (live) {
        bki_sk_problem pb1, pb2;
        logits(tm, c, b, h, n, m, &ln, &pb1, &pb2);
        bki_sk_result r1 = {h1, ln.A1, m, NULL, NULL, 0, 0.0f, 0.0f}, r2 = {h2, ln.A2, m, NULL, NULL, 0, 0.0f, 0.0f};
        K->sk_forward(tm, &pb1, &r1, ln.scr);
        bki_team_sync(tm);
        K->sk_forward(tm, &pb2, &r2, ln.scr);
        bki_team_sync(tm);
        it1 = r1.iters;
        it2 = r2.iters;
        /* A = A1 - lambda A2 in place of A1 */
        combine(tm, n, m, ln.A1, ln.A2, par(c)->lambda[h], ln.A1);
        if (c->out)
            bki_gemm(tm, 0, 0, n, d->dv, m, 1.0f, ln.A1, m, bki_at(c->v, b, h), c->v->stride_n, 0.0f,
                     bki_at(c->out, b, h), c->out->stride_n);
    }
    bki_op_export_attn(tm, c, p, ln.A1, m, n, m);
    if (tm->tid != 0) return;
    if (c->out) bki_zero_rows(bki_at(c->out, b, h), c->out->stride_n, live ? n : 0, d->Nq, d->dv);
    if (blk) {
        blk->steps[0] = it1;
        blk->steps[1] = it2;
    }
}

static void backward(const bki_team *tm, bki_call *c, int p, char *base)
{
    const bk_attn_desc *d = c->d;
    const lane ln = carve(c, c->pl.team ? c->pl.nt : 1, base, NULL);
    const int b = p / d->H, h = p % d->H, dh = d->d / 2;
    const bki_block_header *blk = bki_op_block(c, p);
    const int n = blk->Lq, m = blk->Lk, live = n > 0 && m > 0;
    float *dQb = bki_at(c->dq, b, h), *dKb = bki_at(c->dk, b, h), *dVb = bki_at(c->dv, b, h);
    float *slab = (float *)(c->pgrad + (size_t)p * slab_bytes(c));
    double dlam = 0.0;
    if (live) {
        const bki_kernels *K = bki_kern();
        const float lam = par(c)->lambda[h], al = alpha_of(c);
        const float *h1 = (const float *)(blk + 1), *h2 = h1 + bki_hist_len(d->Nq, d->Nk, 1);
        const float *Qb = bki_at(c->q, b, h), *Kb = bki_at(c->k, b, h), *Vb = bki_at(c->v, b, h);
        const float *dOb = bki_at(c->dout, b, h);
        const ptrdiff_t lq = c->q->stride_n, lk = c->k->stride_n;
        bki_sk_problem pb1, pb2;
        logits(tm, c, b, h, n, m, &ln, &pb1, &pb2);
        K->sk_attention(tm, &pb1, blk->steps[0], h1, ln.A1, m, ln.scr);
        bki_team_sync(tm);
        K->sk_attention(tm, &pb2, blk->steps[1], h2, ln.A2, m, ln.scr);
        bki_team_sync(tm);
        /* dV = A^T dO with A = A1 - lambda A2 (in G2 for now); Abar = dO V^T */
        combine(tm, n, m, ln.A1, ln.A2, lam, ln.G2);
        bki_gemm(tm, 1, 0, m, d->dv, n, 1.0f, ln.G2, m, dOb, c->dout->stride_n, 0.0f, dVb, c->dv->stride_n);
        bki_gemm(tm, 0, 1, n, m, d->dv, 1.0f, dOb, c->dout->stride_n, Vb, c->v->stride_n, 0.0f, ln.G1, m);
        bki_team_sync(tm);
        /* A2bar = -lambda Abar; <Abar, A2> by fixed row blocks, claimed at
         * run time (a block's partial sum in part[block]) */
        const int rb = bki_row_block(n), nb = bki_nblocks(n, rb);
        bki_claims cl = bki_claims_open(tm, nb);
        for (int64_t bl; bki_claims_next(&cl, &bl);) {
            const int blkno = (int)bl;
            const int i1 = (blkno + 1) * rb < n ? (blkno + 1) * rb : n;
            double s = 0.0;
            for (size_t x = (size_t)blkno * rb * m; x < (size_t)i1 * m; x++) {
                s += (double)ln.G1[x] * ln.A2[x];
                ln.G2[x] = -lam * ln.G1[x];
            }
            ln.part[blkno] = s;
        }
        bki_team_sync(tm);
        for (int x = 0; x < nb; x++) dlam -= ln.part[x];
        /* through the two softmaxes: G1, G2 become dL/dC1, dL/dC2 */
        K->sk_backward(tm, &pb1, blk->steps[0], h1, ln.A1, m, ln.G1, m, ln.scr, NULL, NULL);
        bki_team_sync(tm);
        K->sk_backward(tm, &pb2, blk->steps[1], h2, ln.A2, m, ln.G2, m, ln.scr, NULL, NULL);
        bki_team_sync(tm);
        /* dQ_half = alpha G K_half ; dK_half = alpha G^T Q_half */
        bki_gemm(tm, 0, 0, n, dh, m, al, ln.G1, m, Kb, lk, 0.0f, dQb, c->dq->stride_n);
        bki_gemm(tm, 0, 0, n, dh, m, al, ln.G2, m, Kb + dh, lk, 0.0f, dQb + dh, c->dq->stride_n);
        bki_gemm(tm, 1, 0, m, dh, n, al, ln.G1, m, Qb, lq, 0.0f, dKb, c->dk->stride_n);
        bki_gemm(tm, 1, 0, m, dh, n, al, ln.G2, m, Qb + dh, lq, 0.0f, dKb + dh, c->dk->stride_n);
    }
    if (tm->tid != 0) return;
    *slab = (float)dlam;
    bki_zero_rows(dQb, c->dq->stride_n, live ? n : 0, d->Nq, d->d);
    bki_zero_rows(dKb, c->dk->stride_n, live ? m : 0, d->Nk, d->d);
    bki_zero_rows(dVb, c->dv->stride_n, live ? m : 0, d->Nk, d->dv);
}

/* ---- the arrays: lambda [H] in, dlambda [H] from the backward ---- */
static int lambda_shape(const void *par, const bk_attn_desc *d, int64_t dims[4])
{
    (void)par;
    dims[0] = d->H;
    return 1;
}

enum { A_LAMBDA, A_DLAMBDA }; /* the arrays' indices */
static const bki_array diff_arrays[] = {
    [A_LAMBDA] = {.name = "lambda",
     .doc = "per-head lambda (any sign): O = (softmax(s Q1 K1^T) - lambda softmax(s Q2 K2^T)) V",
     .kind = BKI_ARR_IN | BKI_ARR_REQUIRED, .shape_text = "[H]", .offset = offsetof(bk_diff_config, lambda),
     .shape = lambda_shape},
    [A_DLAMBDA] = {.name = "dlambda", .doc = "dL/dlambda, summed over the batch",
     .kind = BKI_ARR_BWD, .shape_text = "[H]",
     .shape = lambda_shape},
};

static bk_status diff_run_arrays(bki_call *c, float *const *a, void *tape, void *ws, size_t ws_size)
{
    if (!c->dout) return bki_op_forward(c, tape, ws, ws_size);
    c->pg = a[A_DLAMBDA];
    bk_status s = bki_op_backward(c, tape, ws, ws_size);
    c->pg = NULL;
    return s;
}

#define DIFF_CASE(H_, N) {.name = "", .B = 1, .H = H_, .Nq = N, .Nk = N, .d = 64, .dv = 64, .params = "", .backward = 1}
static const bki_bench_case diff_bench[] = {DIFF_CASE(16, 256), DIFF_CASE(8, 1024)};
#undef DIFF_CASE

const bki_op bki_op_diff = {
    .name = "diff", .id = 7, .par_name = "bk_diff_config", .fields = diff_fields, .nfields = BKI_NB(diff_fields),
    .par_size = sizeof(bk_diff_config), .par_default = diff_default, .check = check, .cost = cost,
    .lane_bytes = lane_bytes, .block_bytes = block_bytes, .key = key, .pgrad_bytes = pgrad_bytes, .reduce = reduce,
    .forward = forward, .backward = backward, .steps_ok = steps_ok, .pg_arrays = pg_arrays,
    .doc = "differential attention (Ye et al. 2025): softmax(s Q1 K1^T) - lambda softmax(s Q2 K2^T) on the two "
           "halves of d",
    .caps = BKI_CAP_CROSS | BKI_CAP_PAD | BKI_CAP_ATTN | BKI_CAP_MODEL, .bench = diff_bench, .nbench = BKI_NB(diff_bench),
    .arrays = diff_arrays, .narrays = BKI_NB(diff_arrays), .run_arrays = diff_run_arrays,
};

/* ---- public entry points: one line each over the call helpers (op.h) ---- */
size_t bk_diff_workspace_size(const bk_attn_desc *desc, const bk_diff_config *p)
{
    return bki_call_workspace(&bki_op_diff, desc, p);
}

size_t bk_diff_tape_size(const bk_attn_desc *desc, const bk_diff_config *p)
{
    return bki_call_tape(&bki_op_diff, desc, p);
}

bk_status bk_diff_forward(const bk_attn_desc *desc, const bk_diff_config *p, const bk_tensor *q, const bk_tensor *k,
                          const bk_tensor *v, const bk_tensor *out, void *tape, const bk_diff_extras *extras, void *ws,
                          size_t ws_size)
{
    return bki_call_forward(&bki_op_diff, desc, p, q, k, v, out, tape, extras, extras ? &extras->attn : NULL, ws,
                            ws_size);
}

bk_status bk_diff_backward(const bk_attn_desc *desc, const bk_diff_config *p, const bk_tensor *q, const bk_tensor *k,
                           const bk_tensor *v, const bk_tensor *dout, const void *tape, const bk_tensor *dq,
                           const bk_tensor *dk, const bk_tensor *dv, float *dlambda, void *ws, size_t ws_size)
{
    return bki_call_backward(&bki_op_diff, desc, p, q, k, v, dout, tape, dq, dk, dv, dlambda, ws, ws_size);
}
