/* nystrom.c -- Nystrom attention (Nystromformer, Xiong et al. 2021) on the
 * operator framework (op.h). Semantics in include/birkhoff/nystrom.h,
 * derivation in docs/ALGORITHMS.md ("Nystrom attention").
 *
 * Per problem (n valid queries, m valid keys, r = min(l, n, m) landmarks):
 *     Ql, Kl   segment means of the valid queries and keys (r x d)
 *     F = softmax(s Q Kl^T), A = softmax(s Ql Kl^T), B = softmax(s Ql K^T)
 *     Z_0 = A^T / c (c: A's largest column sum, per problem),
 *     Z_{t+1} = 1/4 Z_t (13 I - P (15 I - P (7 I - P))), P = A Z_t
 *     O = F (Z_T (B V))
 * The three softmaxes are the S = 1 case of the one LSE engine
 * (src/core/lse_engine.c), as softmax attention runs it (sinkhorn.c, diff.c):
 * logits by bki_gemm, the engine's row step (its row log-normalisers are the
 * tape), its replay (sk_attention) and its VJP (sk_backward). Every product
 * is a bki_gemm. The backward recomputes the landmarks, the logits, the
 * kernels (replayed from the tape, bitwise the forward's) and the iterates
 * Z_0..Z_T, then runs the reverse mode: through O = F W, W = Z U, U = B V,
 * the iterations in reverse, Z_0's c, the softmaxes and the landmark means.
 *
 * Parallel model (internal.h): one problem per thread or a team per problem,
 * the same per-problem code: GEMMs through bki_gemm (fixed tiles), the
 * engine team-aware, the landmarks by segment (each segment's rows written
 * by one member), the r x r scalar work (c, Z_0 and its adjoint) by member 0
 * in a fixed order. So results are bitwise the same for any thread count and
 * any batch shape. Memory O((Nq + Nk) l + T l^2) a lane, never Nq x Nk. */
#include "op.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

static void nys_default(void *p)
{
    bk_nystrom_config *c = p;
    c->landmarks = 64;
    c->iters = 6;
    c->scale = 0.0f;
}

enum { MAX_LANDMARKS = 4096, MAX_ITERS = 100 };

static const bki_field nys_fields[] = {
    {.name = "landmarks", .type = BKI_F_INT, .offset = offsetof(bk_nystrom_config, landmarks), .names = NULL,
     .list_len = 0, .doc = "landmarks l (segment means of the valid queries and keys; a problem uses min(l, Lq, Lk))",
     .lo = 1, .hi = MAX_LANDMARKS, .rflags = 0},
    {.name = "iters", .type = BKI_F_INT, .offset = offsetof(bk_nystrom_config, iters), .names = NULL, .list_len = 0,
     .doc = "iterations of the Moore-Penrose pseudo-inverse (Razavi et al.; the reference's 6)", .lo = 0,
     .hi = MAX_ITERS, .rflags = 0},
    {.name = "scale", .type = BKI_F_FLOAT, .offset = offsetof(bk_nystrom_config, scale), .names = NULL, .list_len = 0,
     .doc = "score scale s (0: 1/sqrt(d))", .lo = 0, .hi = 0, .rflags = 0},
};
enum { NFIELDS = (int)(sizeof nys_fields / sizeof nys_fields[0]) };

static const bk_nystrom_config *par(const bki_call *c) { return c->par; }
static float alpha_of(const bki_call *c) { return bki_scale(par(c)->scale, c->d->d); }
/* the landmarks problem p uses: min(l, Lq, Lk) (0: an empty problem) */
static int landmarks_of(const bki_call *c, int n, int m)
{
    const int l = par(c)->landmarks;
    return n < 1 || m < 1 ? 0 : l < n ? (l < m ? l : m) : (n < m ? n : m);
}

static bk_status check(const bki_call *c)
{
    const bk_nystrom_config *p = par(c);
    bk_status s = bki_cfg_check(p, nys_fields, NFIELDS, "nystrom");
    if (s) return s;
    if (!isfinite(p->scale)) return bki_fail(BK_ERR_PARAM, "nystrom: scale must be finite, got %g", (double)p->scale);
    return BK_OK;
}

/* about the entries of its thin matrices and its iterations */
static double cost(const bki_call *c)
{
    const double l = par(c)->landmarks;
    return ((double)c->d->Nq + c->d->Nk) * l + (double)par(c)->iters * l * l;
}

/* ---- a lane ---------------------------------------------------------------
 * Sized for the padded shape (Nq, Nk) and l landmarks; a problem uses its
 * leading parts. Z holds the iterates Z_0..Z_T (T + 1 blocks of l x l). In
 * the backward the logits' buffers hold the kernels' gradients (the engine's
 * S = 1 VJP reads the kernel and its gradient, not the logits). */
typedef struct {
    float *Ql, *Kl, *dQl, *dKl;   /* l x d                                   */
    float *CF, *F;                /* Nq x l                                  */
    float *CA, *A;                /* l x l                                   */
    float *CB, *B;                /* l x Nk                                  */
    float *Z;                     /* (T + 1) l x l                           */
    float *t[8];                  /* l x l temporaries                       */
    float *U, *W, *dU, *dW;       /* l x dv                                  */
    float *scr, *hist;            /* the engine's scratch; a history when no tape */
} lane;

static size_t ll(const bki_call *c) { return (size_t)par(c)->landmarks * par(c)->landmarks; }

/* the tape block's floats: the row log-normalisers of F (Nq), A (l), B (l) */
static size_t hist_floats(const bki_call *c)
{
    const int l = par(c)->landmarks;
    return bki_hist_len(c->d->Nq, l, 1) + 2 * bki_hist_len(l, l, 1);
}

static size_t scratch_floats(const bki_call *c, int members)
{
    const bki_kernels *K = bki_kern();
    const int l = par(c)->landmarks, Nq = c->d->Nq, Nk = c->d->Nk;
    size_t s = K->sk_scratch(Nq, l, members), a = K->sk_scratch(l, l, members), b = K->sk_scratch(l, Nk, members);
    s = a > s ? a : s;
    return b > s ? b : s;
}

static lane carve(const bki_call *c, int members, char *base, size_t *used)
{
    const bk_attn_desc *d = c->d;
    const size_t l = (size_t)par(c)->landmarks, F4 = sizeof(float);
    bki_arena ar = {base, 0, (size_t)-1};
    lane s;
    s.Ql = bki_carve(&ar, l * d->d * F4);
    s.Kl = bki_carve(&ar, l * d->d * F4);
    s.dQl = bki_carve(&ar, l * d->d * F4);
    s.dKl = bki_carve(&ar, l * d->d * F4);
    s.CF = bki_carve(&ar, (size_t)d->Nq * l * F4);
    s.F = bki_carve(&ar, (size_t)d->Nq * l * F4);
    s.CA = bki_carve(&ar, ll(c) * F4);
    s.A = bki_carve(&ar, ll(c) * F4);
    s.CB = bki_carve(&ar, l * d->Nk * F4);
    s.B = bki_carve(&ar, l * d->Nk * F4);
    s.Z = bki_carve(&ar, (size_t)(par(c)->iters + 1) * ll(c) * F4);
    for (int i = 0; i < 8; i++) s.t[i] = bki_carve(&ar, ll(c) * F4);
    s.U = bki_carve(&ar, l * d->dv * F4);
    s.W = bki_carve(&ar, l * d->dv * F4);
    s.dU = bki_carve(&ar, l * d->dv * F4);
    s.dW = bki_carve(&ar, l * d->dv * F4);
    s.scr = bki_carve(&ar, scratch_floats(c, members) * F4);
    s.hist = bki_carve(&ar, hist_floats(c) * F4);
    if (used) *used = ar.used;
    return s;
}

static size_t lane_bytes(const bki_call *c, int members)
{
    size_t used;
    (void)carve(c, members, NULL, &used);
    return used + BK_ALIGN;
}

static size_t block_bytes(const bki_call *c) { return hist_floats(c) * sizeof(float); }

/* the tape's kernels depend on the scale and the landmarks; the backward
 * differentiates the forward's iteration count */
static uint32_t key(const bki_call *c)
{
    const float a = alpha_of(c);
    const int l = par(c)->landmarks, T = par(c)->iters;
    uint64_t h = bki_fnv1a(BKI_FNV_OFFSET, &c->op->id, sizeof c->op->id);
    h = bki_fnv1a(h, &a, sizeof a);
    h = bki_fnv1a(h, &l, sizeof l);
    h = bki_fnv1a(h, &T, sizeof T);
    return (uint32_t)(h ^ (h >> 32));
}

static int steps_ok(const bki_call *c, const bki_block_header *h)
{
    const int r = landmarks_of(c, h->Lq, h->Lk);
    return h->steps[0] == r && h->steps[1] == (r ? par(c)->iters : 0);
}

/* ---- per problem ----------------------------------------------------------- */
typedef struct {
    int b, h, n, m, r, T;
    float al;
    const float *Q, *K, *V;
    ptrdiff_t lq, lk, lv;
    float *hF, *hA, *hB;              /* the kernels' row log-normalisers */
} prob;

static prob prob_of(const bki_call *c, int p, int n, int m, float *hist)
{
    const bk_attn_desc *d = c->d;
    prob q;
    q.b = p / d->H;
    q.h = p % d->H;
    q.n = n;
    q.m = m;
    q.r = landmarks_of(c, n, m);
    q.T = par(c)->iters;
    q.al = alpha_of(c);
    q.Q = bki_at(c->q, q.b, q.h);
    q.K = bki_at(c->k, q.b, q.h);
    q.V = bki_at(c->v, q.b, q.h);
    q.lq = c->q->stride_n;
    q.lk = c->k->stride_n;
    q.lv = c->v->stride_n;
    const int l = par(c)->landmarks;
    q.hF = hist;
    q.hA = hist + bki_hist_len(d->Nq, l, 1);
    q.hB = q.hA + bki_hist_len(l, l, 1);
    return q;
}

/* segment j of n rows cut into r: [seg_lo(j), seg_lo(j + 1)) */
static int seg_lo(int j, int n, int r) { return (int)((int64_t)j * n / r); }

/* L_j = the mean of rows seg(j) of X (n rows, row stride ld), d columns,
 * summed in double in row order; segments shared over the team. No sync. */
static void segment_means(const bki_team *tm, int n, int r, int dim, const float *X, ptrdiff_t ld, float *L)
{
    BKI_RANGES(tm, r, 1, j0, j1)
    for (int j = j0; j < j1; j++) {
        const int i0 = seg_lo(j, n, r), i1 = seg_lo(j + 1, n, r);
        for (int x = 0; x < dim; x++) {
            double s = 0.0;
            for (int i = i0; i < i1; i++) s += X[(ptrdiff_t)i * ld + x];
            L[(size_t)j * dim + x] = (float)(s / (i1 - i0));
        }
    }
}

/* the adjoint of segment_means: dX rows of segment j += dL_j / |seg(j)|.
 * No sync. */
static void segment_means_vjp(const bki_team *tm, int n, int r, int dim, const float *dL, float *dX, ptrdiff_t ld)
{
    BKI_RANGES(tm, r, 1, j0, j1)
    for (int j = j0; j < j1; j++) {
        const int i0 = seg_lo(j, n, r), i1 = seg_lo(j + 1, n, r);
        const double inv = 1.0 / (i1 - i0);
        for (int i = i0; i < i1; i++)
            for (int x = 0; x < dim; x++) dX[(ptrdiff_t)i * ld + x] += (float)(dL[(size_t)j * dim + x] * inv);
    }
}

/* the engine's S = 1 problem on logits C (rows x cols) */
static bki_sk_problem softmax_problem(int rows, int cols, const float *C)
{
    const bki_sk_problem pb = {rows, cols, C, cols, NULL, NULL, 1, 0.0f, NULL, 1.0f, 1};
    return pb;
}

/* landmarks, logits and kernels of a problem. replay: the kernels from the
 * tape's log-normalisers (the backward); else the engine's forward writes
 * them. Ends in sync. */
static void kernels(const bki_team *tm, const prob *q, const lane *ln, int dim, int replay)
{
    const bki_kernels *Kn = bki_kern();
    const int n = q->n, m = q->m, r = q->r;
    segment_means(tm, n, r, dim, q->Q, q->lq, ln->Ql);
    segment_means(tm, m, r, dim, q->K, q->lk, ln->Kl);
    bki_team_sync(tm);
    bki_gemm(tm, 0, 1, n, r, dim, q->al, q->Q, q->lq, ln->Kl, dim, 0.0f, ln->CF, r);
    bki_gemm(tm, 0, 1, r, r, dim, q->al, ln->Ql, dim, ln->Kl, dim, 0.0f, ln->CA, r);
    bki_gemm(tm, 0, 1, r, m, dim, q->al, ln->Ql, dim, q->K, q->lk, 0.0f, ln->CB, m);
    bki_team_sync(tm);
    const bki_sk_problem pf = softmax_problem(n, r, ln->CF), pa = softmax_problem(r, r, ln->CA),
                         pbb = softmax_problem(r, m, ln->CB);
    const bki_sk_problem *pp[3] = {&pf, &pa, &pbb};
    float *out[3] = {ln->F, ln->A, ln->B}, *hist[3] = {q->hF, q->hA, q->hB};
    const int lda[3] = {r, r, m};
    for (int k = 0; k < 3; k++) {
        if (replay) {
            Kn->sk_attention(tm, pp[k], 1, hist[k], out[k], lda[k], ln->scr);
        } else {
            bki_sk_result res = {hist[k], out[k], lda[k], NULL, NULL, 0, 0.0f, 0.0f};
            Kn->sk_forward(tm, pp[k], &res, ln->scr);
        }
        bki_team_sync(tm);
    }
}

/* the tile epilogue adding a constant on the diagonal (15 I, 13 I) */
static void add_diag(void *arg, int i0, int j0, int mi, int nj, float *Ct, ptrdiff_t ldc)
{
    const float v = *(const float *)arg;
    for (int i = 0; i < mi; i++) {
        const int j = i0 + i - j0;
        if (j >= 0 && j < nj) Ct[(ptrdiff_t)i * ldc + j] += v;
    }
}

/* A's largest column sum (summed in double in row order) and its column
 * (the first on a tie) */
static float max_colsum(int r, const float *A, int *jmax)
{
    double best = -1.0;
    *jmax = 0;
    for (int j = 0; j < r; j++) {
        double s = 0.0;
        for (int i = 0; i < r; i++) s += A[(size_t)i * r + j];
        if (s > best) best = s, *jmax = j;
    }
    return (float)best;
}

/* P = A Z, T1 = 7 I - P, T2 = 15 I - P T1, T3 = 13 I - P T2 (r x r). Ends
 * in sync. */
static void iter_terms(const bki_team *tm, int r, const float *A, const float *Z, float *P, float *T1, float *T2,
                       float *T3)
{
    float c15 = 15.0f, c13 = 13.0f;
    bki_gemm(tm, 0, 0, r, r, r, 1.0f, A, r, Z, r, 0.0f, P, r);
    bki_team_sync(tm);
    BKI_RANGES(tm, r, 1, i0, i1) /* T1 from P: no second product A Z */
    for (int i = i0; i < i1; i++)
        for (int j = 0; j < r; j++) T1[(size_t)i * r + j] = (i == j ? 7.0f : 0.0f) - P[(size_t)i * r + j];
    bki_team_sync(tm);
    bki_gemm_ep(tm, 0, 0, r, r, r, -1.0f, P, r, T1, r, 0.0f, T2, r, add_diag, &c15);
    bki_team_sync(tm);
    bki_gemm_ep(tm, 0, 0, r, r, r, -1.0f, P, r, T2, r, 0.0f, T3, r, add_diag, &c13);
    bki_team_sync(tm);
}

/* Z_0 = A^T / c, then the T iterations into Z (T + 1 blocks of r x r,
 * packed r apart). Ends in sync. */
static void pinv(const bki_team *tm, const prob *q, const lane *ln)
{
    const int r = q->r;
    const size_t rr = (size_t)r * r;
    if (tm->tid == 0) {
        int jm;
        const float c = max_colsum(r, ln->A, &jm);
        for (int i = 0; i < r; i++)
            for (int j = 0; j < r; j++) ln->Z[(size_t)i * r + j] = ln->A[(size_t)j * r + i] / c;
    }
    bki_team_sync(tm);
    for (int t = 0; t < q->T; t++) {
        const float *Zt = ln->Z + (size_t)t * rr;
        iter_terms(tm, r, ln->A, Zt, ln->t[0], ln->t[1], ln->t[2], ln->t[3]);
        bki_gemm(tm, 0, 0, r, r, r, 0.25f, Zt, r, ln->t[3], r, 0.0f, ln->Z + (size_t)(t + 1) * rr, r);
        bki_team_sync(tm);
    }
}

/* U = B V, W = Z_T U (r x dv). Ends in sync. */
static void values(const bki_team *tm, const prob *q, const lane *ln, int dv)
{
    const int r = q->r;
    bki_gemm(tm, 0, 0, r, dv, q->m, 1.0f, ln->B, q->m, q->V, q->lv, 0.0f, ln->U, dv);
    bki_team_sync(tm);
    bki_gemm(tm, 0, 0, r, dv, r, 1.0f, ln->Z + (size_t)q->T * r * r, r, ln->U, dv, 0.0f, ln->W, dv);
    bki_team_sync(tm);
}

/* problem p's dense attention F Z B into c->attn (when asked): its valid
 * block, zeros elsewhere. M = Z B is kept in CB (the logits are spent). */
static void export_attn(const bki_team *tm, const bki_call *c, const prob *q, const lane *ln)
{
    if (!c->attn || !c->attn->data) return;
    const bk_attn_desc *d = c->d;
    float *At = bki_at(c->attn, q->b, q->h);
    const ptrdiff_t la = c->attn->stride_n;
    const int n = q->r ? q->n : 0, m = q->r ? q->m : 0;
    if (q->r) {
        const float *Zt = ln->Z + (size_t)q->T * q->r * q->r;
        bki_gemm(tm, 0, 0, q->r, m, q->r, 1.0f, Zt, q->r, ln->B, m, 0.0f, ln->CB, m);
        bki_team_sync(tm);
        bki_gemm(tm, 0, 0, n, m, q->r, 1.0f, ln->F, q->r, ln->CB, m, 0.0f, At, la);
    }
    const int rb = bki_row_block(d->Nq);
    bki_claims cl = bki_claims_open(tm, bki_nblocks(d->Nq, rb));
    for (int64_t blk; bki_claims_next(&cl, &blk);) {
        const int i0 = (int)blk * rb, i1 = i0 + rb < d->Nq ? i0 + rb : d->Nq;
        for (int i = i0; i < i1; i++) {
            float *row = At + (ptrdiff_t)i * la;
            const int from = i < n ? m : 0;
            memset(row + from, 0, sizeof(float) * (size_t)(d->Nk - from));
        }
    }
}

static void forward(const bki_team *tm, bki_call *c, int p, char *base)
{
    const bk_attn_desc *d = c->d;
    const lane ln = carve(c, c->pl.team ? c->pl.nt : 1, base, NULL);
    bki_block_header *blk = c->tape ? bki_op_block(c, p) : NULL;
    const prob q = prob_of(c, p, bki_op_lq(c, p), bki_op_lk(c, p), blk ? (float *)(blk + 1) : ln.hist);
    const int r = q.r;
    if (r) {
        kernels(tm, &q, &ln, d->d, 0);
        pinv(tm, &q, &ln);
        if (c->out) { /* O = F W, W = Z_T U, U = B V */
            values(tm, &q, &ln, d->dv);
            bki_gemm(tm, 0, 0, q.n, d->dv, r, 1.0f, ln.F, r, ln.W, d->dv, 0.0f, bki_at(c->out, q.b, q.h),
                     c->out->stride_n);
        }
    }
    export_attn(tm, c, &q, &ln);
    if (tm->tid != 0) return;
    if (c->out) bki_zero_rows(bki_at(c->out, q.b, q.h), c->out->stride_n, r ? q.n : 0, d->Nq, d->dv);
    if (blk) {
        blk->steps[0] = r;
        blk->steps[1] = r ? q.T : 0;
    }
}

/* The reverse mode through the iterations: dZ (the adjoint of Z_T) in t[4]
 * on entry; on return dA (r x r, accumulated from zero) in t[6], including
 * Z_0 = A^T / c's part. Temporaries t[0..7]. Ends in sync. */
static void pinv_vjp(const bki_team *tm, const prob *q, const lane *ln)
{
    const int r = q->r;
    const size_t rr = (size_t)r * r;
    float *P = ln->t[0], *T1 = ln->t[1], *T2 = ln->t[2], *T3 = ln->t[3], *dA = ln->t[6], *dP = ln->t[7];
    float *dZ = ln->t[4], *dZn = ln->t[5];
    if (tm->tid == 0) memset(dA, 0, sizeof(float) * rr);
    bki_team_sync(tm);
    for (int t = q->T - 1; t >= 0; t--) {
        const float *Zt = ln->Z + (size_t)t * rr;
        iter_terms(tm, r, ln->A, Zt, P, T1, T2, T3);
        /* Z_{t+1} = 1/4 Z_t T3: dZ_t = 1/4 dZ T3^T, dT3 = 1/4 Z_t^T dZ (in
         * T3's place once read) */
        bki_gemm(tm, 0, 1, r, r, r, 0.25f, dZ, r, T3, r, 0.0f, dZn, r);
        bki_team_sync(tm);
        float *dT3 = T3;
        bki_gemm(tm, 1, 0, r, r, r, 0.25f, Zt, r, dZ, r, 0.0f, dT3, r);
        bki_team_sync(tm);
        /* T3 = 13 I - P T2: dT2 = -P^T dT3 (in dZ's place: spent), dP =
         * -dT3 T2^T; T2 = 15 I - P T1: dT1 = -P^T dT2, dP -= dT2 T1^T;
         * T1 = 7 I - P: dP -= dT1 */
        float *dT2 = dZ;
        bki_gemm(tm, 1, 0, r, r, r, -1.0f, P, r, dT3, r, 0.0f, dT2, r);
        bki_gemm(tm, 0, 1, r, r, r, -1.0f, dT3, r, T2, r, 0.0f, dP, r);
        bki_team_sync(tm);
        bki_gemm(tm, 0, 1, r, r, r, -1.0f, dT2, r, T1, r, 1.0f, dP, r);
        bki_team_sync(tm);
        bki_gemm(tm, 1, 0, r, r, r, 1.0f, P, r, dT2, r, 1.0f, dP, r);
        bki_team_sync(tm);
        /* P = A Z_t: dA += dP Z_t^T, dZ_t += A^T dP */
        bki_gemm(tm, 0, 1, r, r, r, 1.0f, dP, r, Zt, r, 1.0f, dA, r);
        bki_gemm(tm, 1, 0, r, r, r, 1.0f, ln->A, r, dP, r, 1.0f, dZn, r);
        bki_team_sync(tm);
        float *sw = dZ;
        dZ = dZn;
        dZn = sw;
    }
    /* Z_0 = A^T / c, c = colsum_jm(A): dA += dZ_0^T / c, dA[:, jm] += dc,
     * dc = -<dZ_0, A^T> / c^2 */
    if (tm->tid == 0) {
        int jm;
        const float c = max_colsum(r, ln->A, &jm);
        double dc = 0.0;
        for (int i = 0; i < r; i++)
            for (int j = 0; j < r; j++) {
                dA[(size_t)j * r + i] += dZ[(size_t)i * r + j] / c;
                dc += (double)dZ[(size_t)i * r + j] * ln->A[(size_t)j * r + i];
            }
        dc = -dc / ((double)c * c);
        for (int i = 0; i < r; i++) dA[(size_t)i * r + jm] += (float)dc;
    }
    bki_team_sync(tm);
}

/* the adjoints of the products O = F W, W = Z_T U, U = B V from dO: dF (in
 * CF), dZ_T (in t[4]), dB (in CB) and dV (the caller's tensor). Ends in
 * sync. */
static void products_vjp(const bki_team *tm, const bki_call *c, const prob *q, const lane *ln)
{
    const int r = q->r, n = q->n, m = q->m, dv = c->d->dv;
    const float *dO = bki_at(c->dout, q->b, q->h);
    const ptrdiff_t ldo = c->dout->stride_n;
    bki_gemm(tm, 1, 0, r, dv, n, 1.0f, ln->F, r, dO, ldo, 0.0f, ln->dW, dv);
    bki_gemm(tm, 0, 1, n, r, dv, 1.0f, dO, ldo, ln->W, dv, 0.0f, ln->CF, r);
    bki_team_sync(tm);
    bki_gemm(tm, 0, 1, r, r, dv, 1.0f, ln->dW, dv, ln->U, dv, 0.0f, ln->t[4], r);
    bki_gemm(tm, 1, 0, r, dv, r, 1.0f, ln->Z + (size_t)q->T * r * r, r, ln->dW, dv, 0.0f, ln->dU, dv);
    bki_team_sync(tm);
    bki_gemm(tm, 0, 1, r, m, dv, 1.0f, ln->dU, dv, q->V, q->lv, 0.0f, ln->CB, m);
    bki_gemm(tm, 1, 0, m, dv, r, 1.0f, ln->B, m, ln->dU, dv, 0.0f, bki_at(c->dv, q->b, q->h), c->dv->stride_n);
    bki_team_sync(tm);
}

/* the logits' adjoints dCF (in CF), dCA (in t[6]), dCB (in CB) to dq, dk
 * through C = s X Y^T and the landmark means. No sync at the end. */
static void logits_vjp(const bki_team *tm, const bki_call *c, const prob *q, const lane *ln)
{
    const int r = q->r, n = q->n, m = q->m, dim = c->d->d;
    const float al = q->al, *dCA = ln->t[6];
    float *dQ = bki_at(c->dq, q->b, q->h), *dK = bki_at(c->dk, q->b, q->h);
    const ptrdiff_t ldq = c->dq->stride_n, ldk = c->dk->stride_n;
    /* CF = s Q Kl^T, CA = s Ql Kl^T, CB = s Ql K^T */
    bki_gemm(tm, 0, 0, n, dim, r, al, ln->CF, r, ln->Kl, dim, 0.0f, dQ, ldq);
    bki_gemm(tm, 1, 0, r, dim, n, al, ln->CF, r, q->Q, q->lq, 0.0f, ln->dKl, dim);
    bki_gemm(tm, 0, 0, r, dim, r, al, dCA, r, ln->Kl, dim, 0.0f, ln->dQl, dim);
    bki_gemm(tm, 1, 0, m, dim, r, al, ln->CB, m, ln->Ql, dim, 0.0f, dK, ldk);
    bki_team_sync(tm);
    bki_gemm(tm, 1, 0, r, dim, r, al, dCA, r, ln->Ql, dim, 1.0f, ln->dKl, dim);
    bki_gemm(tm, 0, 0, r, dim, m, al, ln->CB, m, q->K, q->lk, 1.0f, ln->dQl, dim);
    bki_team_sync(tm);
    /* Ql, Kl: segment means */
    segment_means_vjp(tm, n, r, dim, ln->dQl, dQ, ldq);
    segment_means_vjp(tm, m, r, dim, ln->dKl, dK, ldk);
}

static void backward(const bki_team *tm, bki_call *c, int p, char *base)
{
    const bk_attn_desc *d = c->d;
    const lane ln = carve(c, c->pl.team ? c->pl.nt : 1, base, NULL);
    bki_block_header *blk = bki_op_block(c, p);
    const prob q = prob_of(c, p, blk->Lq, blk->Lk, (float *)(blk + 1));
    const int r = q.r;
    if (r) {
        const bki_kernels *Kn = bki_kern();
        kernels(tm, &q, &ln, d->d, 1);
        pinv(tm, &q, &ln);
        values(tm, &q, &ln, d->dv);
        products_vjp(tm, c, &q, &ln);
        pinv_vjp(tm, &q, &ln);
        /* through the softmaxes (the S = 1 VJP reads each kernel and its
         * gradient, not the logits, whose buffers hold the gradients) */
        const bki_sk_problem pf = softmax_problem(q.n, r, ln.CF), pa = softmax_problem(r, r, ln.CA),
                             pbb = softmax_problem(r, q.m, ln.CB);
        Kn->sk_backward(tm, &pf, 1, q.hF, ln.F, r, ln.CF, r, ln.scr, NULL, NULL);
        bki_team_sync(tm);
        Kn->sk_backward(tm, &pa, 1, q.hA, ln.A, r, ln.t[6], r, ln.scr, NULL, NULL);
        bki_team_sync(tm);
        Kn->sk_backward(tm, &pbb, 1, q.hB, ln.B, q.m, ln.CB, q.m, ln.scr, NULL, NULL);
        bki_team_sync(tm);
        logits_vjp(tm, c, &q, &ln);
    }
    if (tm->tid != 0) return;
    float *dQb = bki_at(c->dq, q.b, q.h), *dKb = bki_at(c->dk, q.b, q.h), *dVb = bki_at(c->dv, q.b, q.h);
    bki_zero_rows(dQb, c->dq->stride_n, r ? q.n : 0, d->Nq, d->d);
    bki_zero_rows(dKb, c->dk->stride_n, r ? q.m : 0, d->Nk, d->d);
    bki_zero_rows(dVb, c->dv->stride_n, r ? q.m : 0, d->Nk, d->dv);
}

/* bench cases: the LOTFormer comparison's shapes (B 1, H 8, d 64, l 64) */
static const bki_bench_case nys_bench[] = {
    {"", 1, 8, 1024, 1024, 64, 64, "", 1},
    {"", 1, 8, 4096, 4096, 64, 64, "", 1},
    {"", 1, 8, 16384, 16384, 64, 64, "", 1},
};

const bki_op bki_op_nystrom = {
    .name = "nystrom",
    .id = 10,
    .par_name = "bk_nystrom_config",
    .fields = nys_fields,
    .nfields = NFIELDS,
    .par_size = sizeof(bk_nystrom_config),
    .par_default = nys_default,
    .check = check,
    .cost = cost,
    .lane_bytes = lane_bytes,
    .block_bytes = block_bytes,
    .key = key,
    .prep_bytes = NULL,
    .prepare = NULL,
    .pgrad_bytes = NULL,
    .reduce = NULL,
    .forward = forward,
    .backward = backward,
    .steps_ok = steps_ok,
    .finds_nonfinite = 0,
    .pg_arrays = NULL,
    .doc = "Nystrom attention (Nystromformer, Xiong et al. 2021): softmax attention through l segment-mean "
           "landmarks and an iterative pseudo-inverse, O(N l) memory",
    .caps = BKI_CAP_CROSS | BKI_CAP_PAD | BKI_CAP_ATTN | BKI_CAP_MODEL,
    .learned = NULL,
    .nlearned = 0,
    .bench = nys_bench,
    .nbench = (int)(sizeof nys_bench / sizeof nys_bench[0]),
};
