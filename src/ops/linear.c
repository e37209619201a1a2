/* linear.c -- kernelised attention on the operator framework (op.h): the
 * Linear Transformer ("linear", phi = elu + 1) and Performer's FAVOR+
 * ("performer", positive orthogonal random features). Semantics in
 * include/birkhoff/linear.h, derivation in docs/ALGORITHMS.md "Kernelised
 * attention".
 *
 * One core for both: the operators differ only in their feature maps
 * (features(): P = phi(X) and D, the derivative factor the backward needs;
 * features_bwd(): dX from dL/dP). With V' = [V, 1] (the values and a column
 * of ones) the core is four products by bki_gemm:
 *     S' = Pk^T V'                  (F x (dv+1): S and z at once; the tape)
 *     Y  = Pq S'                    (n x (dv+1): numerators and denominators)
 *     out_i = Y_i[:dv] / (Y_i[dv] + eps_den)
 * and the backward, with G_i = [dO_i / den_i, -(dO_i . out_i) / den_i]:
 *     dS' = Pq^T G,   dPq = G S'^T,   dPk = V' dS'^T,   dV = Pk dS'[:, :dv].
 * Nothing of size n x m exists (but the optional attention output, Pq Pk^T
 * written straight into the caller's tensor).
 *
 * On the framework: Performer's projection W (F x d) is drawn from the seed
 * into the per-call area (prepare, before each region; read-only in it). A
 * tape block holds S' ((dv+1) F floats); the backward recomputes the
 * features and Y (the same products on the same inputs: the same bits).
 * The driver scans the inputs (finds_nonfinite = 0) and the results.
 *
 * Parallel model (internal.h): one problem per thread or a team per problem,
 * the same per-problem code: products through bki_gemm (fixed tiles), row
 * passes in fixed row blocks (bki_row_block) claimed at run time, the keys'
 * stabiliser as a maximum of per-block maxima. So results are bitwise the
 * same for any thread count and batch shape. */
#include "op.h"
#include "../core/vexp.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

/* ---- parameters ------------------------------------------------------------ */
bk_linear_config bk_linear_config_default(void)
{
    bk_linear_config p = {1e-6f};
    return p;
}

bk_performer_config bk_performer_config_default(void)
{
    bk_performer_config p = {256, BK_PERFORMER_NORMS, 0, 0.0f, 0.0f};
    return p;
}

static void linear_default(void *p) { *(bk_linear_config *)p = bk_linear_config_default(); }
static void performer_default(void *p) { *(bk_performer_config *)p = bk_performer_config_default(); }

static const bki_field linear_fields[] = {
    {.name = "eps", .type = BKI_F_FLOAT, .offset = offsetof(bk_linear_config, eps), .names = NULL, .list_len = 0,
     .doc = "denominator stabiliser: out = num / (den + eps) (fast-transformers' 1e-6)", .lo = 0.0, .hi = 1.0,
     .rflags = 0},
};
#define NLINEAR_FIELDS ((int)(sizeof linear_fields / sizeof linear_fields[0]))

static const char *const scaling_names[] = {"norms", "sqrt_d", NULL};
static const bki_field performer_fields[] = {
    {.name = "features", .type = BKI_F_INT, .offset = offsetof(bk_performer_config, features), .names = NULL,
     .list_len = 0, .doc = "random features F (the estimate's error falls as F grows)", .lo = 1.0, .hi = 65536.0,
     .rflags = 0},
    {.name = "scaling", .type = BKI_F_ENUM, .offset = offsetof(bk_performer_config, scaling), .names = scaling_names,
     .list_len = 0, .doc = "projection row norms: chi(d) draws (norms) or sqrt(d) (sqrt_d)", .lo = 0.0, .hi = 0.0,
     .rflags = 0},
    {.name = "seed", .type = BKI_F_I64, .offset = offsetof(bk_performer_config, seed), .names = NULL, .list_len = 0,
     .doc = "seed of the random projection (the same W on every machine)", .lo = 0.0, .hi = 0.0, .rflags = 0},
    {.name = "scale", .type = BKI_F_FLOAT, .offset = offsetof(bk_performer_config, scale), .names = NULL,
     .list_len = 0, .doc = "score scale s of the estimated softmax(s q k^T); 0 selects 1/sqrt(d)", .lo = 0.0,
     .hi = (double)FLT_MAX, .rflags = 0},
    {.name = "eps", .type = BKI_F_FLOAT, .offset = offsetof(bk_performer_config, eps), .names = NULL, .list_len = 0,
     .doc = "feature stabiliser added after the max subtraction (reference: 1e-4; 0 = unbiased)", .lo = 0.0,
     .hi = 1.0, .rflags = 0},
};
#define NPERFORMER_FIELDS ((int)(sizeof performer_fields / sizeof performer_fields[0]))

extern const bki_op bki_op_performer; /* defined at the end of this file */
static int is_performer(const bki_call *c) { return c->op == &bki_op_performer; }
static const bk_linear_config *lin(const bki_call *c) { return c->par; }
static const bk_performer_config *perf(const bki_call *c) { return c->par; }

/* F: the features of a row */
static int nfeat(const bki_call *c) { return is_performer(c) ? perf(c)->features : c->d->d; }
/* eps_den */
static float den_eps(const bki_call *c) { return is_performer(c) ? 0.0f : lin(c)->eps; }
/* Performer's c = sqrt(s) (the data's scale on each side) */
static float data_scale(const bki_call *c)
{
    return sqrtf(bki_scale(perf(c)->scale, c->d->d));
}

static bk_status check(const bki_call *c)
{
    if (is_performer(c)) {
        bk_status s = bki_cfg_check(c->par, performer_fields, NPERFORMER_FIELDS, "performer");
        if (s) return s;
        const int sc = perf(c)->scaling;
        if (sc != BK_PERFORMER_NORMS && sc != BK_PERFORMER_SQRT_D)
            return bki_fail(BK_ERR_PARAM, "performer: unknown scaling %d (0 norms, 1 sqrt_d)", sc);
        /* without shapes (bk_op_config_check) only an explicit scale is known */
        if ((c->d || perf(c)->scale != 0.0f) && (!(data_scale(c) > 0.0f) || !isfinite(data_scale(c))))
            return bki_fail(BK_ERR_PARAM, "performer: scale %g gives no usable data scale", (double)perf(c)->scale);
        return BK_OK;
    }
    return bki_cfg_check(c->par, linear_fields, NLINEAR_FIELDS, "linear");
}

/* ---- Performer's projection --------------------------------------------------
 * Standard normal draws (bki_gauss) from one splitmix64 stream. */
/* one block: `rows` <= d orthonormal rows of R^d, Gram-Schmidt (twice, in
 * double) on Gaussian rows; a row that vanishes is drawn again */
static void orthonormal_block(uint64_t *st, int d, int rows, double *blk, float *W)
{
    for (int r = 0; r < rows; r++) {
        double *x = blk + (size_t)r * d;
        for (int tries = 0;; tries++) {
            for (int i = 0; i < d; i++) x[i] = bki_gauss(st);
            for (int pass = 0; pass < 2; pass++)
                for (int p = 0; p < r; p++) {
                    const double *y = blk + (size_t)p * d;
                    double dot = 0.0;
                    for (int i = 0; i < d; i++) dot += x[i] * y[i];
                    for (int i = 0; i < d; i++) x[i] -= dot * y[i];
                }
            double nrm = 0.0;
            for (int i = 0; i < d; i++) nrm += x[i] * x[i];
            nrm = sqrt(nrm);
            if (nrm > 1e-6 || tries > 64) {
                for (int i = 0; i < d; i++) x[i] /= nrm;
                break;
            }
        }
        for (int i = 0; i < d; i++) W[(size_t)r * d + i] = (float)x[i];
    }
}

/* W (F x d) from the parameters; scratch: d * d doubles */
static void draw_projection(const bk_performer_config *p, int d, float *W, double *scratch)
{
    uint64_t st = (uint64_t)p->seed;
    const int F = p->features;
    for (int r0 = 0; r0 < F; r0 += d)
        orthonormal_block(&st, d, F - r0 < d ? F - r0 : d, scratch, W + (size_t)r0 * d);
    for (int r = 0; r < F; r++) {
        double mult = sqrt((double)d);
        if (p->scaling == BK_PERFORMER_NORMS) {
            double s = 0.0;
            for (int i = 0; i < d; i++) {
                const double g = bki_gauss(&st);
                s += g * g;
            }
            mult = sqrt(s);
        }
        for (int i = 0; i < d; i++) W[(size_t)r * d + i] = (float)(mult * W[(size_t)r * d + i]);
    }
}

/* the per-call area: W (F x d floats) then the draw's d x d doubles */
static size_t prep_bytes(const bki_call *c)
{
    if (!is_performer(c)) return 0;
    const size_t d = (size_t)c->d->d;
    return bki_round_up(sizeof(float) * (size_t)perf(c)->features * d) + sizeof(double) * d * d;
}

static bk_status prepare(bki_call *c)
{
    if (!is_performer(c)) return BK_OK;
    const size_t wb = bki_round_up(sizeof(float) * (size_t)perf(c)->features * c->d->d);
    draw_projection(perf(c), c->d->d, c->prep, (double *)((char *)c->prep + wb));
    return BK_OK;
}

bk_status bk_performer_projection(const bk_performer_config *p, int d, float *W)
{
    if (!p || !W) return bki_fail(BK_ERR_NULL, "bk_performer_projection: NULL parameters or W");
    if (d < 1) return bki_fail(BK_ERR_SHAPE, "bk_performer_projection: d must be >= 1, got %d", d);
    bk_attn_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.B = desc.H = desc.Nq = desc.Nk = 1;
    desc.d = desc.dv = d;
    bki_call c;
    memset(&c, 0, sizeof c);
    c.op = &bki_op_performer;
    c.d = &desc;
    c.par = p;
    bk_status s = check(&c);
    if (s) return s;
    double *scratch = bk_alloc(sizeof(double) * (size_t)d * d);
    if (!scratch) return bki_fail(BK_ERR_NOMEM, "bk_performer_projection: out of memory (%d x %d doubles)", d, d);
    draw_projection(p, d, W, scratch);
    bk_free(scratch);
    bki_clear_error();
    return BK_OK;
}

/* ---- sizes --------------------------------------------------------------- */
/* about the products' multiply-adds over d (the scale of an N x N operator's
 * N^2 for its N^2 d work): a problem runs as a team when it is large */
static double cost(const bki_call *c)
{
    const bk_attn_desc *d = c->d;
    return (double)(d->Nq + d->Nk) * nfeat(c) * (double)(d->d + d->dv + 1) / d->d;
}

/* a lane: Pq, Dq (Nq x F), Pk, Dk (Nk x F), V' (Nk x E), Y (Nq x E), S' and
 * dS' (F x E), a row vector (max(Nq, Nk)), the blocks' maxima; E = dv + 1 */
typedef struct {
    float *Pq, *Dq, *Pk, *Dk, *Vx, *Y, *S, *dS, *rs, *part;
} lane;

static lane carve(const bki_call *c, char *base, size_t *used)
{
    const bk_attn_desc *d = c->d;
    const size_t F = (size_t)nfeat(c), E = (size_t)d->dv + 1, N = (size_t)(d->Nq > d->Nk ? d->Nq : d->Nk);
    bki_arena ar = {base, 0, (size_t)-1};
    lane s;
    s.Pq = bki_carve(&ar, sizeof(float) * d->Nq * F);
    s.Dq = bki_carve(&ar, sizeof(float) * d->Nq * F);
    s.Pk = bki_carve(&ar, sizeof(float) * d->Nk * F);
    s.Dk = bki_carve(&ar, sizeof(float) * d->Nk * F);
    s.Vx = bki_carve(&ar, sizeof(float) * d->Nk * E);
    s.Y = bki_carve(&ar, sizeof(float) * d->Nq * E);
    s.S = bki_carve(&ar, sizeof(float) * F * E);
    s.dS = bki_carve(&ar, sizeof(float) * F * E);
    s.rs = bki_carve(&ar, sizeof(float) * N);
    s.part = bki_carve(&ar, sizeof(float) * BKI_MAX_BLOCKS);
    if (used) *used = ar.used;
    return s;
}

static size_t lane_bytes(const bki_call *c, int members)
{
    (void)members;
    size_t used;
    (void)carve(c, NULL, &used);
    return used + BK_ALIGN;
}

/* tape block: S' (F x (dv + 1)) */
static size_t block_bytes(const bki_call *c) { return sizeof(float) * (size_t)nfeat(c) * (c->d->dv + 1); }

/* everything that decides the forward's values */
static uint32_t key(const bki_call *c)
{
    uint64_t h = bki_fnv1a(BKI_FNV_OFFSET, &c->op->id, sizeof c->op->id);
    if (is_performer(c)) {
        const bk_performer_config *p = perf(c);
        const float s = data_scale(c);
        h = bki_fnv1a(h, &p->features, sizeof p->features);
        h = bki_fnv1a(h, &p->scaling, sizeof p->scaling);
        h = bki_fnv1a(h, &p->seed, sizeof p->seed);
        h = bki_fnv1a(h, &s, sizeof s);
        h = bki_fnv1a(h, &p->eps, sizeof p->eps);
    } else {
        h = bki_fnv1a(h, &lin(c)->eps, sizeof lin(c)->eps);
    }
    return (uint32_t)(h ^ (h >> 32));
}

static int steps_ok(const bki_call *c, const bki_block_header *h)
{
    (void)c;
    return h->steps[0] == 0 && h->steps[1] == 0 && h->steps[2] == 0 && h->steps[3] == 0;
}

/* ---- feature maps ------------------------------------------------------------
 * features(): P = phi(X) and D (n x F, row stride F) of the n rows of X (row
 * stride ldx): linear: D = phi'(x); Performer: D = ratio exp(u - a), the
 * derivative of phi with respect to u. Ends in sync. */
#define ROWS(tm, n, i0, i1) BKI_RANGES(tm, n, bki_row_block(n), i0, i1)

static void linear_features(const bki_team *tm, int n, int F, const float *X, ptrdiff_t ldx, float *P, float *D)
{
    ROWS(tm, n, i0, i1)
    for (int i = i0; i < i1; i++) {
        const float *x = X + (ptrdiff_t)i * ldx;
        float *p = P + (size_t)i * F, *dd = D + (size_t)i * F;
        for (int f = 0; f < F; f++) {
            const float e = bki_expf(x[f] < 0.0f ? x[f] : 0.0f);
            p[f] = x[f] > 0.0f ? x[f] + 1.0f : e;
            dd[f] = x[f] > 0.0f ? 1.0f : e;
        }
    }
    bki_team_sync(tm);
}

/* u - a in P's row (its dash c w.x on entry) into P and D; the row's
 * diagonal term c^2 |x|^2 / 2 */
static void performer_row(int F, const float *x, int d, float c2h, float a, float ratio, float eps, float *p, float *dd)
{
    const float diag = c2h * bki_dotf(d, x, x);
    for (int f = 0; f < F; f++) {
        const float e = ratio * bki_expf(p[f] - diag - a);
        dd[f] = e;
        p[f] = e + ratio * eps;
    }
}

static float row_max(int F, const float *p)
{
    float m = p[0];
    for (int f = 1; f < F; f++) m = p[f] > m ? p[f] : m;
    return m;
}

static void performer_features(const bki_team *tm, const bki_call *c, int key_side, int n, const float *X,
                               ptrdiff_t ldx, float *P, float *D, float *part)
{
    const int F = nfeat(c), d = c->d->d;
    const float cs = data_scale(c), c2h = 0.5f * cs * cs, ratio = 1.0f / sqrtf((float)F), eps = perf(c)->eps;
    const float *W = c->prep;
    bki_gemm(tm, 0, 1, n, F, d, cs, X, ldx, W, d, 0.0f, P, F);
    bki_team_sync(tm);
    float a = 0.0f;
    if (key_side) { /* a = the maximum over the valid keys: of the blocks' maxima */
        const int rb = bki_row_block(n);
        ROWS(tm, n, i0, i1)
        {
            float m = row_max(F, P + (size_t)i0 * F);
            for (int i = i0 + 1; i < i1; i++) {
                const float r = row_max(F, P + (size_t)i * F);
                m = r > m ? r : m;
            }
            part[i0 / rb] = m;
        }
        bki_team_sync(tm);
        a = part[0];
        for (int b = 1; b < bki_nblocks(n, rb); b++) a = part[b] > a ? part[b] : a;
    }
    ROWS(tm, n, i0, i1)
    for (int i = i0; i < i1; i++) {
        float *p = P + (size_t)i * F;
        performer_row(F, X + (ptrdiff_t)i * ldx, d, c2h, key_side ? a : row_max(F, p), ratio, eps, p,
                      D + (size_t)i * F);
    }
    bki_team_sync(tm);
}

static void features(const bki_team *tm, const bki_call *c, int key_side, int n, const float *X, ptrdiff_t ldx,
                     float *P, float *D, float *part)
{
    if (is_performer(c)) performer_features(tm, c, key_side, n, X, ldx, P, D, part);
    else linear_features(tm, n, nfeat(c), X, ldx, P, D);
}

/* dX (n x d, row stride lddx) from G = dL/dP (n x F; destroyed) and D.
 * linear: dX = G o D. Performer: with G' = G o D (dL/du),
 * dX = c G' W - c^2 rowsum(G') o X. rs: n floats. Ends in sync. */
static void features_bwd(const bki_team *tm, const bki_call *c, int n, const float *X, ptrdiff_t ldx, float *G,
                         const float *D, float *dX, ptrdiff_t lddx, float *rs)
{
    const int F = nfeat(c), d = c->d->d;
    if (!is_performer(c)) {
        ROWS(tm, n, i0, i1)
        for (int i = i0; i < i1; i++)
            for (int f = 0; f < F; f++) dX[(ptrdiff_t)i * lddx + f] = G[(size_t)i * F + f] * D[(size_t)i * F + f];
        bki_team_sync(tm);
        return;
    }
    const float cs = data_scale(c);
    ROWS(tm, n, i0, i1)
    for (int i = i0; i < i1; i++) {
        float *g = G + (size_t)i * F;
        const float *dd = D + (size_t)i * F;
        for (int f = 0; f < F; f++) g[f] *= dd[f];
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int f = 0;
        for (; f + 8 <= F; f += 8)
            for (int l = 0; l < 8; l++) acc[l] += g[f + l];
        for (; f < F; f++) acc[0] += g[f];
        rs[i] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
    bki_team_sync(tm);
    bki_gemm(tm, 0, 0, n, d, F, cs, G, F, c->prep, d, 0.0f, dX, lddx);
    bki_team_sync(tm);
    const float c2 = cs * cs;
    ROWS(tm, n, i0, i1)
    for (int i = i0; i < i1; i++) {
        const float w = c2 * rs[i];
        const float *x = X + (ptrdiff_t)i * ldx;
        float *o = dX + (ptrdiff_t)i * lddx;
        for (int x0 = 0; x0 < d; x0++) o[x0] = __builtin_fmaf(-w, x[x0], o[x0]);
    }
    bki_team_sync(tm);
}

/* ---- the core ---------------------------------------------------------------- */
/* Pq, Dq, Pk, Dk and V' = [V, 1] of problem p (n, m valid rows). Ends in sync. */
static void inputs(const bki_team *tm, const bki_call *c, int p, int n, int m, const lane *ln)
{
    const bk_attn_desc *d = c->d;
    const int b = p / d->H, h = p % d->H, E = d->dv + 1;
    features(tm, c, 0, n, bki_at(c->q, b, h), c->q->stride_n, ln->Pq, ln->Dq, ln->part);
    features(tm, c, 1, m, bki_at(c->k, b, h), c->k->stride_n, ln->Pk, ln->Dk, ln->part);
    const float *Vb = bki_at(c->v, b, h);
    ROWS(tm, m, j0, j1)
    for (int j = j0; j < j1; j++) {
        memcpy(ln->Vx + (size_t)j * E, Vb + (ptrdiff_t)j * c->v->stride_n, sizeof(float) * (size_t)d->dv);
        ln->Vx[(size_t)j * E + d->dv] = 1.0f;
    }
    bki_team_sync(tm);
}

/* the optional attention output: A = Pq Pk^T / (den + eps) straight into the
 * caller's tensor, its padding zero; Y's last column holds den */
static void export_attn(const bki_team *tm, const bki_call *c, int p, int n, int m, const lane *ln)
{
    if (!c->attn || !c->attn->data) return;
    const bk_attn_desc *d = c->d;
    const int F = nfeat(c), E = d->dv + 1;
    const ptrdiff_t la = c->attn->stride_n;
    float *A = bki_at(c->attn, p / d->H, p % d->H);
    const float eps = den_eps(c);
    if (n > 0 && m > 0) bki_gemm(tm, 0, 1, n, m, F, 1.0f, ln->Pq, F, ln->Pk, F, 0.0f, A, la);
    bki_team_sync(tm);
    ROWS(tm, d->Nq, i0, i1)
    for (int i = i0; i < i1; i++) {
        float *row = A + (ptrdiff_t)i * la;
        const int live = i < n && m > 0;
        if (live) {
            const float inv = 1.0f / (ln->Y[(size_t)i * E + d->dv] + eps);
            for (int j = 0; j < m; j++) row[j] *= inv;
        }
        memset(row + (live ? m : 0), 0, sizeof(float) * (size_t)(d->Nk - (live ? m : 0)));
    }
    bki_team_sync(tm);
}

static void forward(const bki_team *tm, bki_call *c, int p, char *base)
{
    const bk_attn_desc *d = c->d;
    const lane ln = carve(c, base, NULL);
    const int b = p / d->H, h = p % d->H, n = bki_op_lq(c, p), m = bki_op_lk(c, p), F = nfeat(c), E = d->dv + 1;
    const int live = n > 0 && m > 0;
    float *S = c->tape ? (float *)bki_op_block_data(c, p) : ln.S;
    if (live) {
        inputs(tm, c, p, n, m, &ln);
        bki_gemm(tm, 1, 0, F, E, m, 1.0f, ln.Pk, F, ln.Vx, E, 0.0f, S, E);
        bki_team_sync(tm);
        if (c->out || c->attn) {
            bki_gemm(tm, 0, 0, n, E, F, 1.0f, ln.Pq, F, S, E, 0.0f, ln.Y, E);
            bki_team_sync(tm);
        }
        if (c->out) {
            const float eps = den_eps(c);
            float *O = bki_at(c->out, b, h);
            ROWS(tm, n, i0, i1)
            for (int i = i0; i < i1; i++) {
                const float *y = ln.Y + (size_t)i * E;
                const float den = y[d->dv] + eps;
                float *o = O + (ptrdiff_t)i * c->out->stride_n;
                for (int x = 0; x < d->dv; x++) o[x] = y[x] / den;
            }
            bki_team_sync(tm);
        }
    }
    export_attn(tm, c, p, n, m, &ln);
    if (tm->tid == 0 && c->out) bki_zero_rows(bki_at(c->out, b, h), c->out->stride_n, live ? n : 0, d->Nq, d->dv);
}

/* G (in Y's place) from Y = Pq S' and dO: G_i = [dO_i / den_i,
 * -(dO_i . out_i) / den_i]. Ends in sync. */
static void output_grad(const bki_team *tm, const bki_call *c, int p, int n, const lane *ln)
{
    const bk_attn_desc *d = c->d;
    const int E = d->dv + 1, dv = d->dv;
    const float eps = den_eps(c);
    const float *dO = bki_at(c->dout, p / d->H, p % d->H);
    ROWS(tm, n, i0, i1)
    for (int i = i0; i < i1; i++) {
        float *y = ln->Y + (size_t)i * E;
        const float *g = dO + (ptrdiff_t)i * c->dout->stride_n;
        const float inv = 1.0f / (y[dv] + eps);
        double dot = 0.0;
        for (int x = 0; x < dv; x++) {
            dot += (double)g[x] * (y[x] * inv);
            y[x] = g[x] * inv;
        }
        y[dv] = (float)(-dot) * inv;
    }
    bki_team_sync(tm);
}

static void backward(const bki_team *tm, bki_call *c, int p, char *base)
{
    const bk_attn_desc *d = c->d;
    const lane ln = carve(c, base, NULL);
    const int b = p / d->H, h = p % d->H, F = nfeat(c), E = d->dv + 1;
    const bki_block_header *blk = bki_op_block(c, p);
    const int n = blk->Lq, m = blk->Lk, live = n > 0 && m > 0;
    float *dQb = bki_at(c->dq, b, h), *dKb = bki_at(c->dk, b, h), *dVb = bki_at(c->dv, b, h);
    if (live) {
        const float *S = (const float *)(blk + 1);
        inputs(tm, c, p, n, m, &ln);
        bki_gemm(tm, 0, 0, n, E, F, 1.0f, ln.Pq, F, S, E, 0.0f, ln.Y, E);
        bki_team_sync(tm);
        output_grad(tm, c, p, n, &ln); /* Y := G */
        bki_gemm(tm, 1, 0, F, E, n, 1.0f, ln.Pq, F, ln.Y, E, 0.0f, ln.dS, E);
        bki_team_sync(tm);
        /* dPq = G S'^T into Pq's place; dV = Pk dS */
        bki_gemm(tm, 0, 1, n, F, E, 1.0f, ln.Y, E, S, E, 0.0f, ln.Pq, F);
        bki_gemm(tm, 0, 0, m, d->dv, F, 1.0f, ln.Pk, F, ln.dS, E, 0.0f, dVb, c->dv->stride_n);
        bki_team_sync(tm);
        /* dPk = V' dS'^T into Pk's place */
        bki_gemm(tm, 0, 1, m, F, E, 1.0f, ln.Vx, E, ln.dS, E, 0.0f, ln.Pk, F);
        bki_team_sync(tm);
        features_bwd(tm, c, n, bki_at(c->q, b, h), c->q->stride_n, ln.Pq, ln.Dq, dQb, c->dq->stride_n, ln.rs);
        features_bwd(tm, c, m, bki_at(c->k, b, h), c->k->stride_n, ln.Pk, ln.Dk, dKb, c->dk->stride_n, ln.rs);
    }
    if (tm->tid != 0) return;
    bki_zero_rows(dQb, c->dq->stride_n, live ? n : 0, d->Nq, d->d);
    bki_zero_rows(dKb, c->dk->stride_n, live ? m : 0, d->Nk, d->d);
    bki_zero_rows(dVb, c->dv->stride_n, live ? m : 0, d->Nk, d->dv);
}

/* ---- the operators -------------------------------------------------------- */
static const bki_bench_case bench_cases[] = {
    {.name = "", .B = 1, .H = 8, .Nq = 1024, .Nk = 1024, .d = 64, .dv = 64, .params = "", .backward = 1},
    {.name = "", .B = 1, .H = 8, .Nq = 4096, .Nk = 4096, .d = 64, .dv = 64, .params = "", .backward = 1},
    {.name = "", .B = 1, .H = 8, .Nq = 16384, .Nk = 16384, .d = 64, .dv = 64, .params = "", .backward = 1},
};
#define NBENCH ((int)(sizeof bench_cases / sizeof bench_cases[0]))

const bki_op bki_op_linear = {
    .name = "linear", .id = 8, .par_name = "bk_linear_config", .fields = linear_fields, .nfields = NLINEAR_FIELDS,
    .par_size = sizeof(bk_linear_config), .par_default = linear_default, .check = check, .cost = cost,
    .lane_bytes = lane_bytes, .block_bytes = block_bytes, .key = key, .prep_bytes = NULL, .prepare = NULL,
    .pgrad_bytes = NULL, .reduce = NULL, .forward = forward, .backward = backward, .steps_ok = steps_ok,
    .finds_nonfinite = 0, .pg_arrays = NULL,
    .doc = "Linear Transformer (Katharopoulos et al. 2020): kernel attention with phi = elu + 1, O(N d dv)",
    .caps = BKI_CAP_CROSS | BKI_CAP_PAD | BKI_CAP_ATTN | BKI_CAP_MODEL, .learned = NULL, .nlearned = 0,
    .bench = bench_cases, .nbench = NBENCH,
};

const bki_op bki_op_performer = {
    .name = "performer", .id = 9, .par_name = "bk_performer_config", .fields = performer_fields,
    .nfields = NPERFORMER_FIELDS, .par_size = sizeof(bk_performer_config), .par_default = performer_default,
    .check = check, .cost = cost, .lane_bytes = lane_bytes, .block_bytes = block_bytes, .key = key,
    .prep_bytes = prep_bytes, .prepare = prepare, .pgrad_bytes = NULL, .reduce = NULL, .forward = forward,
    .backward = backward, .steps_ok = steps_ok, .finds_nonfinite = 0, .pg_arrays = NULL,
    .doc = "Performer FAVOR+ (Choromanski et al. 2021): positive orthogonal random features estimating softmax",
    .caps = BKI_CAP_CROSS | BKI_CAP_PAD | BKI_CAP_ATTN | BKI_CAP_MODEL, .learned = NULL, .nlearned = 0,
    .bench = bench_cases, .nbench = NBENCH,
};
