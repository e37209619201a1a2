/* lot.c -- LOT attention (LOTFormer): queries -> learnable pivots -> keys,
 * two small entropic OT problems glued, linear in the sequence length.
 * Semantics in include/birkhoff/lot.h, derivations in docs/ALGORITHMS.md
 * section 5.
 *
 * Both inner problems run on the one LSE/Sinkhorn engine (lse_engine.c) with
 * the pivot masses as marginals. The engine returns A = P / a (its plan with
 * rows divided by their marginal), so A1 = n Gamma1 and A2 = diag(1/p0)
 * Gamma2, and the glued attention is simply A = A1 A2: O = A1 (A2 V). The
 * engine's backward also returns the gradients w.r.t. the log marginals,
 * which carry the gradient to the pivot-mass logits.
 *
 * Parallel model (internal.h): the B*H problems run one per thread, or one
 * at a time by a team of all threads (bki_plan), through the same
 * per-problem code: the two thin inner problems on the team-aware engine,
 * the GEMMs through bki_gemm, the thin products with a long inner dimension
 * (A2 V, A1^T dO, the pivot gradient) in fixed chunks of that dimension
 * summed in chunk order, the diagnostics in fixed blocks; the members claim
 * the blocks of these loops at run time (bki_claims), each block computed
 * whole by whoever takes it. dZ and dtheta are kept per problem and summed
 * in problem order. So results are bitwise the same for any thread count
 * and any batch shape. */
#include "op.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

bk_lot_config bk_lot_config_default(void)
{
    bk_lot_config p = {1, NULL, NULL, 1.0f, 5, 1.0f, 0.0f, 0.0f};
    return p;
}

static void lot_default(void *p) { *(bk_lot_config *)p = bk_lot_config_default(); }

/* the scalar parameters by key (Z and theta are arrays: the arrays below);
 * the ranges are those check_params enforces on each value alone */
static const bki_field lot_fields[] = {
    {.name = "r", .type = BKI_F_INT, .offset = offsetof(bk_lot_config, r),
     .doc = "pivots (set from the pivots array's rows)", .lo = 1, .hi = 1 << 20},
    {.name = "temp", .type = BKI_F_FLOAT, .offset = offsetof(bk_lot_config, temp), .alias = "pivot-temp",
     .doc = "pivot-mass temperature: p0 = softmax(theta / temp)", .lo = 0.0, .hi = INFINITY,
     .rflags = BKI_FR_OPEN_LO},
    {.name = "iters", .type = BKI_F_INT, .offset = offsetof(bk_lot_config, iters),
     .doc = "half-steps T of each inner Sinkhorn problem", .lo = 1, .hi = 1e6},
    {.name = "eps", .type = BKI_F_FLOAT, .offset = offsetof(bk_lot_config, eps), .doc = "temperature",
     .lo = 0.0, .hi = INFINITY, .rflags = BKI_FR_OPEN_LO},
    {.name = "scale", .type = BKI_F_FLOAT, .offset = offsetof(bk_lot_config, scale),
     .doc = "score scale s (0: 1/sqrt(d)); finite"},
    {.name = "tol", .type = BKI_F_FLOAT, .offset = offsetof(bk_lot_config, tol),
     .doc = "per-problem early stop of each inner problem (0: off)", .lo = 0.0, .hi = INFINITY},
};

static bk_status check_params(const bk_attn_desc *d, const bk_lot_config *p, int size_query)
{
    if (!p) return bki_fail(BK_ERR_NULL, "LOT parameters are NULL");
    if (p->r < 1 || p->r > (1 << 20)) return bki_fail(BK_ERR_PARAM, "number of pivots r must be in [1, 2^20], got %d", p->r);
    if (size_query) return BK_OK; /* a workspace size needs the scalars only */
    if (!p->Z || !p->theta) return bki_fail(BK_ERR_NULL, "LOT pivots Z and logits theta are required");
    if (!(p->temp > 0.0f) || !isfinite(p->temp)) return bki_fail(BK_ERR_PARAM, "pivot temperature must be finite and > 0, got %g", (double)p->temp);
    if (!(p->iters >= 1 && p->iters <= 1000000)) return bki_fail(BK_ERR_PARAM, "iters (T) must be in [1, 1e6], got %d", p->iters);
    if (!(p->eps > 0.0f) || !isfinite(p->eps)) return bki_fail(BK_ERR_PARAM, "eps must be finite and > 0, got %g", (double)p->eps);
    if (!isfinite(p->scale)) return bki_fail(BK_ERR_PARAM, "scale must be finite, got %g", (double)p->scale);
    if (!(p->tol >= 0.0f) || !isfinite(p->tol)) return bki_fail(BK_ERR_PARAM, "tol must be finite and >= 0, got %g", (double)p->tol);
    if (!isfinite(bki_scale(p->scale, d->d) / p->eps)) return bki_fail(BK_ERR_PARAM, "scale/eps overflows");
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

static size_t fl(size_t n) { return bki_round_up(n * sizeof(float)); }

/* Chunks of a long inner dimension K of a thin product (few GEMM tiles):
 * 16 of at least 256 and at most 4096 (a function of K only). The cap keeps a
 * chunk's operand panels in L2 (bki_gemm's thin path; r x 4096 and 4096 x d
 * floats at d, r <= 64). */
static int kchunk(int K)
{
    int c = (K + 15) / 16;
    c = (c + 15) & ~15;
    return c < 256 ? 256 : c > 4096 ? 4096 : c;
}

/* floats of the partial products of a thin M x N output over inner
 * dimensions up to K1 and K2 (gemm_ksum; a shorter K never has more chunks:
 * ceil(K / 256) up to 4096, then 16, then ceil(K / 4096) from 65536) */
static size_t ksum_floats(int M, int N, int K1, int K2)
{
    return (size_t)(bki_nblocks(K1, kchunk(K1)) + bki_nblocks(K2, kchunk(K2))) * M * N;
}

/* ---- the operator's tables ------------------------------------------------
 * Tape block: the two inner problems' potential histories, h1 (Nq x r
 * problem) then h2 (r x Nk); steps[0], steps[1]: the half-steps each ran. */
static const bk_lot_config *par(const bki_call *c) { return c->par; }

static bk_status check(const bki_call *c)
{
    bk_status s = check_params(c->d, par(c), c->ws_mode);
    return s;
}

/* Work of one problem: the entries of its n x (r + d + dv) and m x (r + d +
 * dv) operands. */
static double cost(const bki_call *c)
{
    return (double)(c->d->Nq + c->d->Nk) * (par(c)->r + c->d->d + c->d->dv);
}

/* One lane: a problem in flight, run by one thread or by a team of
 * `members` (the engine's scratch is sized for them; one scratch per inner
 * problem, so the two can follow each other without a sync). */
typedef struct {
    float *L1, *A1, *G1, *L2, *A2, *G2, *Y, *X, *logp, *p0, *g1, *g2, *kpart, *emax, *scr1, *scr2;
    float *hist; /* both histories, for a forward without a tape */
} lot_lane;

/* carves a lane from base (NULL: measures it into *used) */
static lot_lane carve(const bki_call *c, int members, char *base, size_t *used)
{
    const bk_attn_desc *d = c->d;
    const bk_lot_config *p = par(c);
    bki_arena ar = {base, 0, (size_t)-1};
    const size_t n = (size_t)d->Nq, m = (size_t)d->Nk, r = (size_t)p->r, dv = (size_t)d->dv;
    const int dmax = d->d > d->dv ? d->d : d->dv;
    lot_lane w;
#define TAKE(ptr, cnt) ptr = bki_carve(&ar, (cnt) * sizeof(float))
    TAKE(w.L1, n * r); TAKE(w.A1, n * r); TAKE(w.G1, n * r);
    TAKE(w.L2, r * m); TAKE(w.A2, r * m); TAKE(w.G2, r * m);
    TAKE(w.Y, r * dv); TAKE(w.X, r * dv);
    TAKE(w.logp, r); TAKE(w.p0, r); TAKE(w.g1, r); TAKE(w.g2, r);
    TAKE(w.kpart, ksum_floats(p->r, dmax, d->Nq, d->Nk));
    TAKE(w.emax, 2 * BKI_MAX_BLOCKS);
    TAKE(w.scr1, bki_kern()->sk_scratch(d->Nq, p->r, members));
    TAKE(w.scr2, bki_kern()->sk_scratch(p->r, d->Nk, members));
    TAKE(w.hist, bki_hist_len(d->Nq, p->r, p->iters) + bki_hist_len(p->r, d->Nk, p->iters));
#undef TAKE
    if (used) *used = ar.used;
    return w;
}

static size_t lane_bytes(const bki_call *c, int members)
{
    size_t used;
    (void)carve(c, members, NULL, &used);
    return used + BK_ALIGN;
}

static size_t block_bytes(const bki_call *c)
{
    const bk_lot_config *p = par(c);
    return (bki_hist_len(c->d->Nq, p->r, p->iters) + bki_hist_len(p->r, c->d->Nk, p->iters)) * sizeof(float);
}

static float alpha_of(const bk_attn_desc *d, const bk_lot_config *p)
{
    return bki_scale(p->scale, d->d) / p->eps;
}

static uint32_t key(const bki_call *c)
{
    const bk_lot_config *p = par(c);
    const float v[4] = {alpha_of(c->d, p), p->temp, p->tol, 0.0f};
    const int32_t n[2] = {p->r, p->iters};
    uint64_t h = bki_fnv1a(BKI_FNV_OFFSET, v, sizeof v);
    h = bki_fnv1a(h, n, sizeof n);
    return (uint32_t)(h ^ (h >> 32));
}

static int steps_ok(const bki_call *c, const bki_block_header *h)
{
    const int T = par(c)->iters;
    if (h->Lq > 0 && h->Lk > 0) return h->steps[0] >= 1 && h->steps[0] <= T && h->steps[1] >= 1 && h->steps[1] <= T;
    return h->steps[0] == 0 && h->steps[1] == 0;
}

/* per-problem dZ [r][d] and dtheta [r], summed over problems in order */
static size_t pgrad_bytes(const bki_call *c) { return fl((size_t)par(c)->r * (c->d->d + 1)); }

static void reduce(bki_call *c)
{
    const bk_attn_desc *d = c->d;
    const int P = d->B * d->H, r = par(c)->r;
    const bki_lot_grads *g = c->pg;
    if (!g) return;
    const size_t slab = bki_round_up(pgrad_bytes(c));
    if (g->dZ) memset(g->dZ, 0, sizeof(float) * (size_t)d->H * r * d->d);
    if (g->dtheta) memset(g->dtheta, 0, sizeof(float) * (size_t)d->H * r);
    for (int pi = 0; pi < P; pi++) {
        const int h = pi % d->H;
        const float *gZ = (const float *)(c->pgrad + (size_t)pi * slab), *gth = gZ + (size_t)r * d->d;
        if (g->dZ)
            for (size_t i = 0; i < (size_t)r * d->d; i++) g->dZ[(size_t)h * r * d->d + i] += gZ[i];
        if (g->dtheta)
            for (int t = 0; t < r; t++) g->dtheta[(size_t)h * r + t] += gth[t];
    }
}

/* dZ [H, r, d] and dtheta [H, r] for the driver's check of the results */
static int pg_arrays(const bki_call *c, bki_farray out[2])
{
    const bki_lot_grads *g = c->pg;
    const size_t hr = (size_t)c->d->H * par(c)->r;
    out[0] = (bki_farray){"dZ (pivots)", g->dZ, hr * c->d->d};
    out[1] = (bki_farray){"dtheta (pivot logits)", g->dtheta, hr};
    return 2;
}

/* ---- per problem ----------------------------------------------------------- */

/* One term op(A) B of a thin product (K x N B, no transpose). */
typedef struct {
    int ta, K;
    const float *A, *B;
    ptrdiff_t lda, ldb;
} kterm;

/* C (M x N, thin: few GEMM tiles) = alpha sum_s op(A_s) B_s over long inner
 * dimensions: each term's K is cut into fixed chunks (kchunk), each chunk
 * one single-threaded product into its own partial (part), the chunks
 * claimed by the team at run time (bki_claims); then the partials are summed
 * in chunk order, the output's rows claimed likewise. A function of the
 * shapes only, like every partition here.
 * Ends with the team in sync. (The training engine's weight gradients use
 * a two-half variant on sub-teams: src/nn/layers.c, grads_member.) */
static void gemm_ksum(const bki_team *tm, int M, int N, float alpha, const kterm *t, int nterms, float *C,
                      ptrdiff_t ldc, float *part)
{
    int nc = 0;
    for (int s = 0; s < nterms; s++) nc += bki_nblocks(t[s].K, kchunk(t[s].K));
    const size_t mn = (size_t)M * N;
    bki_claims cl = bki_claims_open(tm, nc);
    for (int64_t c; bki_claims_next(&cl, &c);) { /* chunk c: chunk j of term s */
        int s = 0, j = (int)c;
        while (j >= bki_nblocks(t[s].K, kchunk(t[s].K))) j -= bki_nblocks(t[s].K, kchunk(t[s].K)), s++;
        const int kc = kchunk(t[s].K), k0 = j * kc, kk = t[s].K - k0 < kc ? t[s].K - k0 : kc;
        const float *Ak = t[s].ta ? t[s].A + (ptrdiff_t)k0 * t[s].lda : t[s].A + k0;
        bki_gemm(&BKI_SOLO, t[s].ta, 0, M, N, kk, alpha, Ak, t[s].lda, t[s].B + (ptrdiff_t)k0 * t[s].ldb, t[s].ldb,
                 0.0f, part + (size_t)c * mn, N);
    }
    bki_team_sync(tm);
    cl = bki_claims_open(tm, M);
    for (int64_t i; bki_claims_next(&cl, &i);) {
        float *Ci = C + (ptrdiff_t)i * ldc;
        memcpy(Ci, part + (size_t)i * N, sizeof(float) * (size_t)N);
        for (int c = 1; c < nc; c++) {
            const float *pc = part + (size_t)c * mn + (size_t)i * N;
            for (int j = 0; j < N; j++) Ci[j] += pc[j];
        }
    }
    bki_team_sync(tm);
}

/* Non-finite inputs (bki_op.finds_nonfinite): a NaN or Inf in a valid row
 * of Q, K, V or dO makes a whole row or column of a product LOT computes
 * from it non-finite: L1 = Q Z^T (row i), L2 = Z K^T (column j), Y = A2 V
 * and X = A1^T dO (column c), since every term of those sums multiplies it
 * by a finite factor (Z, A1, A2; a zero one gives NaN) and NaN and Inf
 * survive every finite add. (The products run in bki_gemm's own kernel or
 * in OpenBLAS: neither skips a zero factor.) So LOT checks those products,
 * half the size of Q and K (r <= d) or tiny (Y, X), L1 and L2 tile by tile
 * while in cache, instead of the driver reading every input once more. */
static void check_tile(void *arg, int i0, int j0, int mi, int nj, float *Ct, ptrdiff_t ldc)
{
    (void)i0;
    (void)j0;
    if (!bki_rows_finite(Ct, ldc, mi, nj)) *(int *)arg = 1;
}
/* after a gemm_ksum into C (r x cols, in sync): member 0 checks it */
static void check_small(const bki_team *tm, bki_call *x, const float *C, int r, int cols)
{
    if (tm->tid == 0 && !bki_rows_finite(C, cols, r, cols)) bki_op_suspect(x);
}

/* Y = A2 V (r x dv, the forward's and the backward's), checked for
 * non-finite values unless v is trusted; ends in sync */
static void y_of(const bki_team *tm, bki_call *x, const lot_lane *w, int r, int m, const float *Vb)
{
    const int dv = x->d->dv;
    const kterm y = {0, m, w->A2, Vb, m, x->v->stride_n};
    gemm_ksum(tm, r, dv, 1.0f, &y, 1, w->Y, dv, w->kpart);
    if (!x->trusted) check_small(tm, x, w->Y, r, dv);
}

/* The inner problems of problem pi: pivot masses, logits L1 = (s/eps) Q Z^T
 * (n x r) and L2 = (s/eps) Z K^T (r x m), checked for non-finite values
 * unless q and k are trusted; ends in sync. */
static void inner_setup(const bki_team *tm, bki_call *x, const bk_lot_config *p, int n, int m, const float *Q,
                        int64_t ldq, const float *Kb, int64_t ldk, int h, const lot_lane *w, bki_sk_problem *pb1,
                        bki_sk_problem *pb2)
{
    const bk_attn_desc *d = x->d;
    const int r = p->r;
    const float al = alpha_of(d, p);
    const float *Zh = p->Z + (size_t)h * r * d->d;
    if (tm->tid == 0) pivot_masses(r, p->theta + (size_t)h * r, p->temp, w->logp, w->p0);
    int bad = 0; /* this member's tiles */
    const bki_tile_fn ck = x->trusted ? NULL : check_tile;
    bki_gemm_ep(tm, 0, 1, n, r, d->d, al, Q, ldq, Zh, d->d, 0.0f, w->L1, r, ck, &bad);
    bki_gemm_ep(tm, 0, 1, r, m, d->d, al, Zh, d->d, Kb, ldk, 0.0f, w->L2, m, ck, &bad);
    if (bad) bki_op_suspect(x);
    bki_team_sync(tm);
    const bki_sk_problem a = {n, r, w->L1, r, NULL, w->logp, p->iters, p->tol, NULL, 1.0f, 0};
    const bki_sk_problem b = {r, m, w->L2, m, w->logp, NULL, p->iters, p->tol, NULL, 1.0f, 0};
    *pb1 = a;
    *pb2 = b;
}

/* Diagnostics of the glued A = A1 A2: rows A1 (A2 1), columns (1^T A1) A2,
 * in fixed row and column blocks (the maximum of each block, then of the
 * blocks). Ends in sync. */
static void glue_diag(const bki_team *tm, int n, int m, int r, const lot_lane *w, bk_lot_diag *dg)
{
    bki_claims cl = bki_claims_open(tm, r);
    for (int64_t t; bki_claims_next(&cl, &t);) {
        double rs = 0.0, cs = 0.0;
        for (int j = 0; j < m; j++) rs += w->A2[(size_t)t * m + j];
        for (int i = 0; i < n; i++) cs += w->A1[(size_t)i * r + t];
        w->g1[t] = (float)rs;
        w->g2[t] = (float)cs;
    }
    bki_team_sync(tm);
    const int rbn = bki_row_block(n), nbn = bki_nblocks(n, rbn), rbm = bki_row_block(m), nbm = bki_nblocks(m, rbm);
    cl = bki_claims_open(tm, nbn + nbm);
    for (int64_t bb; bki_claims_next(&cl, &bb);) {
        const int b = (int)bb;
        float e = 0.0f;
        if (b < nbn) {
            const int i1 = (b + 1) * rbn < n ? (b + 1) * rbn : n;
            for (int i = b * rbn; i < i1; i++) {
                double s = 0.0;
                for (int t = 0; t < r; t++) s += (double)w->A1[(size_t)i * r + t] * w->g1[t];
                e = fmaxf(e, (float)fabs(s - 1.0));
            }
        } else {
            const int j0 = (b - nbn) * rbm, j1 = j0 + rbm < m ? j0 + rbm : m;
            for (int j = j0; j < j1; j++) {
                double s = 0.0;
                for (int t = 0; t < r; t++) s += (double)w->g2[t] * w->A2[(size_t)t * m + j];
                e = fmaxf(e, (float)fabs(s * m / n - 1.0));
            }
        }
        w->emax[b] = e;
    }
    bki_team_sync(tm);
    for (int b = 0; b < nbn; b++) dg->row_err = fmaxf(dg->row_err, w->emax[b]);
    for (int b = nbn; b < nbn + nbm; b++) dg->col_err = fmaxf(dg->col_err, w->emax[b]);
}

static void forward(const bki_team *tm, bki_call *x, int pi, char *base)
{
    const bk_attn_desc *d = x->d;
    const bk_lot_config *p = par(x);
    const bk_lot_extras *ex = x->ex;
    const lot_lane ln = carve(x, x->pl.team ? x->pl.nt : 1, base, NULL), *w = &ln;
    const bki_kernels *K = bki_kern();
    const int r = p->r, b = pi / d->H, h = pi % d->H;
    const int n = bki_op_lq(x, pi), m = bki_op_lk(x, pi), live = n > 0 && m > 0;
    bki_block_header *blk = x->tape ? bki_op_block(x, pi) : NULL;
    float *h1 = blk ? (float *)(blk + 1) : w->hist, *h2 = h1 + bki_hist_len(d->Nq, r, p->iters);
    const bk_tensor *out = x->out;
    float *Ob = out ? bki_at(out, b, h) : NULL;
    /* the attention output: the call's (the extras' for bk_lot_forward, the
     * generic entry point's argument for bk_op_forward) */
    const bk_tensor *at = x->attn && x->attn->data ? x->attn : NULL;
    float *Ab = at ? bki_at(at, b, h) : NULL;
    bk_lot_diag dg = {0, 0, 0.0f, 0.0f};
    if (live) {
        bki_sk_problem pb1, pb2;
        inner_setup(tm, x, p, n, m, bki_at(x->q, b, h), x->q->stride_n, bki_at(x->k, b, h), x->k->stride_n, h, w,
                    &pb1, &pb2);
        bki_sk_result r1 = {h1, w->A1, r, NULL, NULL, 0, 0.0f, 0.0f}, r2 = {h2, w->A2, m, NULL, NULL, 0, 0.0f, 0.0f};
        K->sk_forward(tm, &pb1, &r1, w->scr1);
        K->sk_forward(tm, &pb2, &r2, w->scr2);
        dg.iters1 = r1.iters;
        dg.iters2 = r2.iters;
        if (Ob) { /* O = A1 (A2 V) */
            y_of(tm, x, w, r, m, bki_at(x->v, b, h));
            bki_gemm(tm, 0, 0, n, d->dv, r, 1.0f, w->A1, r, w->Y, d->dv, 0.0f, Ob, out->stride_n);
        }
        if (ex && ex->diag) glue_diag(tm, n, m, r, w, &dg);
        if (Ab) bki_gemm(tm, 0, 0, n, m, r, 1.0f, w->A1, r, w->A2, m, 0.0f, Ab, at->stride_n);
    }
    if (Ab) { /* padding of A: columns [m, Nk) of valid rows, then whole rows; blocks of 64 rows claimed */
        bki_claims cl = bki_claims_open(tm, bki_nblocks(d->Nq, 64));
        for (int64_t bi; bki_claims_next(&cl, &bi);)
            for (int i = (int)bi * 64; i < d->Nq && i < (int)bi * 64 + 64; i++) {
                float *row = Ab + (int64_t)i * at->stride_n;
                if (live && i < n) memset(row + m, 0, sizeof(float) * (size_t)(d->Nk - m));
                else memset(row, 0, sizeof(float) * (size_t)d->Nk);
            }
    }
    if (tm->tid != 0) return;
    if (blk) {
        blk->steps[0] = dg.iters1;
        blk->steps[1] = dg.iters2;
    }
    if (Ob) bki_zero_rows(Ob, out->stride_n, live ? n : 0, d->Nq, d->dv);
    if (ex && ex->diag) ex->diag[pi] = dg;
}

static void backward(const bki_team *tm, bki_call *x, int pi, char *base)
{
    const bk_attn_desc *d = x->d;
    const bk_lot_config *p = par(x);
    const lot_lane ln = carve(x, x->pl.team ? x->pl.nt : 1, base, NULL), *w = &ln;
    const bki_kernels *K = bki_kern();
    const int r = p->r, b = pi / d->H, h = pi % d->H, dvd = d->dv;
    const bki_block_header *blk = bki_op_block(x, pi);
    const int steps1 = blk->steps[0], steps2 = blk->steps[1];
    const int n = blk->Lq, m = blk->Lk, live = n > 0 && m > 0;
    const float *h1 = (const float *)(blk + 1), *h2 = h1 + bki_hist_len(d->Nq, r, p->iters);
    float *dQb = bki_at(x->dq, b, h), *dKb = bki_at(x->dk, b, h), *dVb = bki_at(x->dv, b, h);
    float *gZ = (float *)(x->pgrad + (size_t)pi * bki_round_up(pgrad_bytes(x))), *gth = gZ + (size_t)r * d->d;
    if (live) {
        const bk_tensor *q = x->q, *k = x->k, *v = x->v, *dout = x->dout;
        const float *Qb = bki_at(q, b, h), *Kb = bki_at(k, b, h), *Vb = bki_at(v, b, h), *dOb = bki_at(dout, b, h);
        const float *Zh = p->Z + (size_t)h * r * d->d;
        const float al = alpha_of(d, p);
        bki_sk_problem pb1, pb2;
        inner_setup(tm, x, p, n, m, Qb, q->stride_n, Kb, k->stride_n, h, w, &pb1, &pb2);
        K->sk_attention(tm, &pb1, steps1, h1, w->A1, r, w->scr1);
        K->sk_attention(tm, &pb2, steps2, h2, w->A2, m, w->scr2);
        /* Y = A2 V, X = A1^T dO; dV = A2^T X; dA1 = dO Y^T; dA2 = X V^T */
        const kterm xt = {1, n, w->A1, dOb, r, dout->stride_n};
        y_of(tm, x, w, r, m, Vb);
        gemm_ksum(tm, r, dvd, 1.0f, &xt, 1, w->X, dvd, w->kpart);
        check_small(tm, x, w->X, r, dvd); /* dout: scanned for trusted calls too */
        bki_gemm(tm, 1, 0, m, dvd, r, 1.0f, w->A2, m, w->X, dvd, 0.0f, dVb, x->dv->stride_n);
        bki_gemm(tm, 0, 1, n, r, dvd, 1.0f, dOb, dout->stride_n, w->Y, dvd, 0.0f, w->G1, r);
        bki_gemm(tm, 0, 1, r, m, dvd, 1.0f, w->X, dvd, Vb, v->stride_n, 0.0f, w->G2, m);
        bki_team_sync(tm);
        /* through the two Sinkhorn problems: logits and log pivot masses */
        K->sk_backward(tm, &pb1, steps1, h1, w->A1, r, w->G1, r, w->scr1, NULL, w->g1);
        K->sk_backward(tm, &pb2, steps2, h2, w->A2, m, w->G2, m, w->scr2, w->g2, NULL);
        /* dQ = al G1 Z ; dK = al G2^T Z ; dZ = al (G1^T Q + G2 K) */
        bki_gemm(tm, 0, 0, n, d->d, r, al, w->G1, r, Zh, d->d, 0.0f, dQb, x->dq->stride_n);
        bki_gemm(tm, 1, 0, m, d->d, r, al, w->G2, m, Zh, d->d, 0.0f, dKb, x->dk->stride_n);
        const kterm z[2] = {{1, n, w->G1, Qb, r, q->stride_n}, {0, m, w->G2, Kb, m, k->stride_n}};
        gemm_ksum(tm, r, d->d, al, z, 2, gZ, d->d, w->kpart);
    }
    if (tm->tid != 0) return;
    if (live) { /* log p0 = theta/temp - LSE: dtheta = (g - p0 sum g) / temp */
        double gs = 0.0;
        for (int t = 0; t < r; t++) gs += (double)w->g1[t] + w->g2[t];
        for (int t = 0; t < r; t++) gth[t] = (float)(((double)w->g1[t] + w->g2[t] - w->p0[t] * gs) / p->temp);
    } else {
        memset(gZ, 0, sizeof(float) * (size_t)r * (d->d + 1));
    }
    bki_zero_rows(dQb, x->dq->stride_n, live ? n : 0, d->Nq, d->d);
    bki_zero_rows(dKb, x->dk->stride_n, live ? m : 0, d->Nk, d->d);
    bki_zero_rows(dVb, x->dv->stride_n, live ? m : 0, d->Nk, d->dv);
}

/* ---- the arrays: pivots [H, r, d] and their logits [H, r] in; diag
 * [B, H, 4] out; the pivots' gradients from the backward ---- */
static int z_shape(const void *par, const bk_attn_desc *d, int64_t dims[4])
{
    dims[0] = d->H; dims[1] = ((const bk_lot_config *)par)->r; dims[2] = d->d;
    return 3;
}

static int theta_shape(const void *par, const bk_attn_desc *d, int64_t dims[4])
{
    dims[0] = d->H; dims[1] = ((const bk_lot_config *)par)->r;
    return 2;
}

static int diag_shape(const void *par, const bk_attn_desc *d, int64_t dims[4])
{
    (void)par;
    dims[0] = d->B; dims[1] = d->H; dims[2] = 4;
    return 3;
}

enum { A_PIVOTS, A_LOGITS, A_DIAG, A_DPIVOTS, A_DLOGITS }; /* the arrays' indices */
static const bki_array lot_arrays[] = {
    [A_PIVOTS] = {.name = "pivots", .doc = "pivot locations Z (shared over the batch); sets r",
     .kind = BKI_ARR_IN | BKI_ARR_REQUIRED,
     .shape_text = "[H, r, d]", .offset = offsetof(bk_lot_config, Z), .dim_key = "r", .dim_at = 1, .shape = z_shape},
    [A_LOGITS] = {.name = "pivot_logits", .doc = "pivot-mass logits theta", .kind = BKI_ARR_IN | BKI_ARR_REQUIRED,
     .shape_text = "[H, r]", .offset = offsetof(bk_lot_config, theta), .shape = theta_shape},
    [A_DIAG] = {.name = "diag", .doc = "per problem: half-steps of the two inner problems, max |row sum - 1|, "
                            "max |col sum m/n - 1|",
     .kind = BKI_ARR_FWD | BKI_ARR_HOST, .shape_text = "[B, H, 4]", .shape = diag_shape},
    [A_DPIVOTS] = {.name = "dpivots", .doc = "gradient w.r.t. the pivots, summed over the batch", .kind = BKI_ARR_BWD,
     .shape_text = "[H, r, d]", .shape = z_shape},
    [A_DLOGITS] = {.name = "dpivot_logits", .doc = "gradient w.r.t. the pivot logits, summed over the batch",
     .kind = BKI_ARR_BWD,
     .shape_text = "[H, r]", .shape = theta_shape},
};

static bk_status lot_run_arrays(bki_call *c, float *const *a, void *tape, void *ws, size_t ws_size)
{
    if (c->dout) {
        bki_lot_grads g = {a[A_DPIVOTS], a[A_DLOGITS]};
        c->pg = &g;
        bk_status s = bki_op_backward(c, tape, ws, ws_size);
        c->pg = NULL;
        return s;
    }
    const int P = c->d ? c->d->B * c->d->H : 0;
    bk_lot_diag *dg = a[A_DIAG] && P > 0 ? malloc(sizeof *dg * (size_t)P) : NULL;
    if (a[A_DIAG] && P > 0 && !dg) return bki_fail(BK_ERR_NOMEM, "lot: no memory for the diagnostics");
    bk_lot_extras ex = {.diag = dg};
    c->ex = &ex;
    bk_status s = bki_op_forward(c, tape, ws, ws_size);
    c->ex = NULL;
    for (int p = 0; s == BK_OK && dg && p < P; p++) {
        a[A_DIAG][4 * p] = (float)dg[p].iters1;
        a[A_DIAG][4 * p + 1] = (float)dg[p].iters2;
        a[A_DIAG][4 * p + 2] = dg[p].row_err;
        a[A_DIAG][4 * p + 3] = dg[p].col_err;
    }
    free(dg);
    return s;
}

/* the bench's cases: r = 32 pivots, T = 5, eps = 1, temp = 0.5 (the
 * PyTorch peer's settings) */
#define LOT_CASE(H_, N) \
    {.name = "", .B = 1, .H = H_, .Nq = N, .Nk = N, .d = 64, .dv = 64, .params = "r=32,temp=0.5", .backward = 1}
static const bki_bench_case lot_bench[] = {
    LOT_CASE(8, 512),    LOT_CASE(8, 4096),   LOT_CASE(1, 4096),   LOT_CASE(1, 8192),    LOT_CASE(1, 16384),
    LOT_CASE(1, 32768),  LOT_CASE(1, 65536),  LOT_CASE(1, 131072), LOT_CASE(1, 262144),
};
#undef LOT_CASE

/* ---- the learned arrays (a model's): the pivots Z [H, r, d] (N(0, 1)) and
 * the mass logits theta [H, r] (0: uniform masses); their gradients in a
 * bki_lot_grads ---- */
static int learned_z_shape(const void *p, int H, int d, int64_t dims[4])
{
    dims[0] = H, dims[1] = ((const bk_lot_config *)p)->r, dims[2] = d;
    return 3;
}
static int learned_theta_shape(const void *p, int H, int d, int64_t dims[4])
{
    (void)d;
    dims[0] = H, dims[1] = ((const bk_lot_config *)p)->r;
    return 2;
}
static const bki_learned lot_learned[] = {
    {.name = "lot_z", .doc = "pivots Z [H, r, d]", .offset = offsetof(bk_lot_config, Z), .shape = learned_z_shape,
     .init = BKI_INIT_NORMAL, .init_sd = 1.0f},
    {.name = "lot_theta", .doc = "pivot-mass logits theta [H, r]", .offset = offsetof(bk_lot_config, theta),
     .shape = learned_theta_shape, .init = BKI_INIT_ZERO, .init_sd = 0.0f},
};

const bki_op bki_op_lot = {
    .name = "lot", .id = 4, .par_name = "bk_lot_config", .fields = lot_fields, .nfields = BKI_NB(lot_fields),
    .par_size = sizeof(bk_lot_config), .par_default = lot_default, .check = check, .cost = cost,
    .lane_bytes = lane_bytes, .block_bytes = block_bytes, .key = key, .pgrad_bytes = pgrad_bytes, .reduce = reduce,
    .forward = forward, .backward = backward, .steps_ok = steps_ok, .finds_nonfinite = 1, .pg_arrays = pg_arrays,
    .doc = "low-rank transport through r learned pivots: two small Sinkhorn problems glued (LOTFormer, "
           "Shahbazi et al. 2025)",
    .caps = BKI_CAP_CROSS | BKI_CAP_PAD | BKI_CAP_ATTN | BKI_CAP_MODEL, .bench = lot_bench, .nbench = BKI_NB(lot_bench),
    .arrays = lot_arrays, .narrays = BKI_NB(lot_arrays), .run_arrays = lot_run_arrays,
    .learned = lot_learned, .nlearned = BKI_NB(lot_learned),
};

/* ---- public entry points: one line each over the call helpers (op.h) ---- */
size_t bk_lot_tape_size(const bk_attn_desc *d, const bk_lot_config *p) { return bki_call_tape(&bki_op_lot, d, p); }

size_t bk_lot_workspace_size(const bk_attn_desc *desc, const bk_lot_config *p)
{
    return bki_call_workspace(&bki_op_lot, desc, p);
}

bk_status bk_lot_forward(const bk_attn_desc *d, const bk_lot_config *p, const bk_tensor *q, const bk_tensor *k,
                         const bk_tensor *v, const bk_tensor *out, void *tape, const bk_lot_extras *ex, void *ws,
                         size_t ws_size)
{
    return bki_call_forward(&bki_op_lot, d, p, q, k, v, out, tape, ex, ex ? &ex->attn : NULL, ws, ws_size);
}

bk_status bk_lot_backward(const bk_attn_desc *d, const bk_lot_config *p, const bk_tensor *q, const bk_tensor *k,
                          const bk_tensor *v, const bk_tensor *dout, const void *tape, const bk_tensor *dq,
                          const bk_tensor *dk, const bk_tensor *dv, float *dZ, float *dtheta, void *ws, size_t ws_size)
{
    bki_lot_grads g = {dZ, dtheta};
    return bki_call_backward(&bki_op_lot, d, p, q, k, v, dout, tape, dq, dk, dv, &g, ws, ws_size);
}
