/* asap.c -- ASAP (Tran, Milkert, Hyde 2026): a trained Sinkhorn attention
 * layer compiled into a loop-free operator. Semantics in
 * include/birkhoff/asap.h and docs/ALGORITHMS.md section 7.
 *
 * Mechanisms used, not re-implemented here:
 *   - sorting and the 1-D Kantorovich potential: sort1d.c (bki_argsort,
 *     bki_potential1d), the slice bank: bki_unit_directions;
 *   - every c-transform and the teacher's half-steps: the (team-aware) LSE
 *     engine. A key-side c-transform T_K(u) is a row step of the TRANSPOSED logits
 *     (keys x queries) from the column potential u, so ASAP is the engine on
 *     Z^T warm-started from u with 1 (ASAP-0), 2 (row-ending) or 3
 *     (column-ending) half-steps; the engine's A is then Lk P^T.
 * The online operator is a registered operator (op.h: bki_op_asap, forward
 * only; its parameters bk_asap_forward_config are the compiled layer and the
 * variant): the driver runs it. The other entry points (teacher dual,
 * features, calibration and its KL objective, the fidelity metrics) are not
 * attention operators; they run their problems with the library's one
 * runner, bki_run_problems.
 * Parallel model (docs/ARCHITECTURE.md): every call plans its problems with
 * bki_plan_problems; a problem runs on one thread or on a team of all
 * threads through the same code, its work cut into blocks that depend on its
 * shape only (GEMM tiles, slices, row blocks, Gram tiles), claimed at run
 * time by the team's members (bki_claims), and summed in block order.
 * Calibration sums its per-problem blocks in problem order. So every
 * output is bitwise the same for any thread count and batch shape. */
#include "op.h"

#include <cblas.h>
#include <errno.h>
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

bk_asap_kl_config bk_asap_kl_config_default(void)
{
    bk_asap_kl_config o = {50, 1e-13};
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

/* ------------------------------------------------------------------------ */
/* the problems of a call over threads                                      */
/* ------------------------------------------------------------------------ *
 * Every ASAP call runs its problems as the attention operators do:
 * bki_plan_problems says whether `lanes` problems run at a time, one per
 * thread, or one problem at a time by a team of all threads, and
 * bki_run_problems runs them. A problem function is called by every member
 * of its team with the same arguments; its work is shared by blocks whose
 * sizes depend on the problem's shape only (GEMM tiles, slices, rows, row
 * blocks, Gram tiles), each block computed by one member (claimed at run
 * time: the member's static share first, then blocks that others have not
 * started) with the same arithmetic whatever the team and whoever takes it,
 * and every sum across blocks is taken in block order. So outputs are
 * bitwise the same for any thread count and batch shape. A problem's cost
 * for the plan: its logits' entries plus the sliced projections' entries (0
 * slices for the teacher alone). */
bki_plan bki_asap_plan(const bk_attn_desc *d, int L)
{
    return bki_plan_problems(d->B * d->H, (double)d->Nq * d->Nk + (double)L * (d->Nq + d->Nk));
}

static int plan_members(bki_plan pl) { return pl.team ? pl.nt : 1; }

/* The lanes of a plan whose lanes take lb bytes each (lane_round(lb): every
 * lane aligned), allocated by the caller as lanes_alloc bytes. */
static size_t lane_round(size_t lb) { return bki_round_up(lb); }
static size_t lanes_alloc(bki_plan pl, size_t lb) { return (size_t)pl.lanes * lane_round(lb) + BK_ALIGN; }
static void run_lanes(bki_plan pl, int P, char *base, size_t lb, bki_problem_fn fn, void *ctx)
{
    bki_run_problems(pl, P, bki_align_ptr(base), lane_round(lb), fn, ctx);
}

/* this member's block of `members` per-member blocks of `bytes` each */
static char *take_member(bki_arena *ar, const bki_team *tm, int members, size_t bytes)
{
    char *p = bki_carve(ar, (size_t)members * bki_round_up(bytes));
    return p ? p + (size_t)tm->tid * bki_round_up(bytes) : NULL;
}

/* Indices [0, n) (rows, keys, columns) in ranges of bki_row_block(n)
 * claimed at run time by the team's members (bki_ranges_open). Used where
 * each index's result depends on that index only and is written to its own
 * place: which member computes a range, and its width, change no bit. */
static bki_claims spans_open(const bki_team *tm, int n) { return bki_ranges_open(tm, n, bki_row_block(n)); }

/* Floats of the engine's scratch for any problem of at most n x m rows and
 * columns run by `members`: sk_scratch is not monotone in the row count (its
 * row blocks are a function of n: 260 rows make 52 blocks of 5, 251 rows 63
 * blocks of 4), and a padded problem runs the engine on its valid lengths,
 * so the lanes take the maximum over n' <= n (m enters monotonically). */
static size_t sk_scratch_upto(int n, int m, int members)
{
    const bki_kernels *K = bki_kern();
    size_t mx = 0;
    for (int i = 1; i <= n; i++) {
        const size_t f = K->sk_scratch(i, m, members);
        mx = f > mx ? f : mx;
    }
    return mx;
}

/* ------------------------------------------------------------------------ */
/* per-problem pieces                                                       */
/* ------------------------------------------------------------------------ */
/* Scratch for the sliced features of one problem up to Nq x Nk: the
 * projections (shared by the team) and each member's sort buffers. */
typedef struct {
    float *pa, *pb;       /* projections [L x Nq], [L x Nk] (shared; [Nq x L],
                             [Nk x L] on the lanes path)                     */
    int32_t *ia, *ib;     /* this member's sort orders                    */
    void *sort_scr;       /* this member's sort scratch                   */
    void *lanes;          /* this member's bki_lanes scratch (both sides <=
                             BKI_LANES_SORT_MAX: groups of BKI_LANES slices
                             sorted at once, one in each lane), else NULL  */
} feat_scr;

static size_t feat_member_bytes(int Nq, int Nk)
{
    int nn = Nq > Nk ? Nq : Nk;
    return bki_round_up(sizeof(int32_t) * (size_t)Nq) + bki_round_up(sizeof(int32_t) * (size_t)Nk) +
           bki_round_up(bki_argsort_scratch(nn)) + (bki_lanes_fit(Nq, Nk) ? bki_lanes_bytes(Nq, Nk) : 0);
}

static size_t feat_bytes(int Nq, int Nk, int L, int members)
{
    return bki_round_up(sizeof(float) * (size_t)Nq * L) + bki_round_up(sizeof(float) * (size_t)Nk * L) +
           (size_t)members * bki_round_up(feat_member_bytes(Nq, Nk)) + 4 * BK_ALIGN;
}

/* carves the features' scratch from ar (a NULL base: measures it) */
static feat_scr feat_take(bki_arena *ar, const bki_team *tm, int members, int Nq, int Nk, int L)
{
    feat_scr f;
    f.pa = bki_carve(ar, sizeof(float) * (size_t)Nq * L);
    f.pb = bki_carve(ar, sizeof(float) * (size_t)Nk * L);
    char *mb = take_member(ar, tm, members, feat_member_bytes(Nq, Nk));
    if (!mb) {
        f.ia = f.ib = NULL;
        f.sort_scr = NULL;
        return f;
    }
    f.ia = (int32_t *)mb;
    f.ib = (int32_t *)(mb + bki_round_up(sizeof(int32_t) * (size_t)Nq));
    f.sort_scr = mb + bki_round_up(sizeof(int32_t) * (size_t)Nq) + bki_round_up(sizeof(int32_t) * (size_t)Nk);
    f.lanes = bki_lanes_fit(Nq, Nk) ? (char *)f.sort_scr + bki_round_up(bki_argsort_scratch(Nq > Nk ? Nq : Nk)) : NULL;
    return f;
}

/* XT [L x Lq] (double, slice-major): the centred sliced potentials. The two
 * projections are tiled GEMMs; then the slices (or groups of BKI_LANES
 * slices) are claimed at run time by the team's members, each sorted and
 * integrated by one member (slices are independent: nothing is summed
 * across them). Starts and ends with a sync. */
static void sliced_features(const bki_team *tm, const feat_scr *w, int Lq, int Lk, int d, int L, const float *theta,
                            float s, const float *Q, int64_t sq, const float *K, int64_t sk, double *XT)
{
    const float rs = sqrtf(s);
    if (w->lanes) { /* groups of BKI_LANES slices, one in each vector lane */
        /* projections token-major (Lq x L, Lk x L): a group's keys are rows
         * of BKI_LANES contiguous floats */
        bki_gemm(tm, 0, 1, Lq, L, d, rs, Q, sq, theta, d, 0.0f, w->pa, L);
        bki_gemm(tm, 0, 1, Lk, L, d, rs, K, sk, theta, d, 0.0f, w->pb, L);
        bki_team_sync(tm);
        const bki_kernels *kn = bki_kern();
        /* groups claimed at run time: a group's keys, indices and networks
         * are this member's scratch, all loaded afresh for each group (the
         * networks, a function of Lq and Lk, on its first group) */
        bki_claims cl = bki_claims_open(tm, (L + BKI_LANES - 1) / BKI_LANES);
        bki_lanes z = {0};
        int have_z = 0;
        for (int64_t g; bki_claims_next(&cl, &g);) {
            if (!have_z) {
                z = bki_lanes_init(w->lanes, Lq, Lk);
                have_z = 1;
            }
            const int l0 = (int)g * BKI_LANES, nl = L - l0 < BKI_LANES ? L - l0 : BKI_LANES;
            bki_lanes_load(Lq, nl, w->pa + l0, (size_t)L, 1, z.ka, z.ix);
            bki_lanes_load(Lk, nl, w->pb + l0, (size_t)L, 1, z.kb, NULL);
            kn->lanes_sort(z.cmp_n, z.net_n, z.ka, z.ix);
            kn->lanes_sort(z.cmp_m, z.net_m, z.kb, NULL);
            double mean[BKI_LANES];
            double *x = XT + (size_t)l0 * Lq;
            kn->potential1d_lanes(Lq, Lk, z.ka, z.ix, z.kb, nl, x, (size_t)Lq, mean);
            for (int l = 0; l < nl; l++)
                for (int i = 0; i < Lq; i++) x[(size_t)l * Lq + i] -= mean[l];
        }
        bki_team_sync(tm);
        return;
    }
    /* projections slice-major (L x Lq, L x Lk): each slice contiguous */
    bki_gemm(tm, 0, 1, L, Lq, d, rs, theta, d, Q, sq, 0.0f, w->pa, Lq);
    bki_gemm(tm, 0, 1, L, Lk, d, rs, theta, d, K, sk, 0.0f, w->pb, Lk);
    bki_team_sync(tm);
    /* slices claimed at run time (the sort buffers are this member's, filled
     * afresh for each slice) */
    bki_claims cl = bki_claims_open(tm, L);
    for (int64_t l; bki_claims_next(&cl, &l);) {
        const float *a = w->pa + (size_t)l * Lq, *b = w->pb + (size_t)l * Lk;
        double *x = XT + (size_t)l * Lq;
        bki_argsort(Lq, a, 1, w->ia, w->sort_scr);
        bki_argsort(Lk, b, 1, w->ib, w->sort_scr);
        const double mean = bki_potential1d(Lq, Lk, a, 1, w->ia, b, 1, w->ib, x);
        for (int i = 0; i < Lq; i++) x[i] -= mean;
    }
    bki_team_sync(tm);
}

/* rho_i = s |q_i|^2 / 2 (double; the squares summed in 8 lanes, c mod 8,
 * then in a fixed tree: it vectorises, and the order is the same on every
 * machine and thread count) */
static double rho_row(int d, float s, const float *qi)
{
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int c = 0;
    for (; c + 8 <= d; c += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)qi[c + l] * qi[c + l];
    for (; c < d; c++) acc[0] += (double)qi[c] * qi[c];
    const double a = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    return 0.5 * (double)s * a;
}

/* rho of the rows, row blocks claimed at run time (no sync at the end) */
static void rho_rows(const bki_team *tm, int Lq, int d, float s, const float *Q, int64_t sq, double *rho)
{
    bki_claims sp = spans_open(tm, Lq);
    for (int i0, i1; bki_ranges_next_int(&sp, &i0, &i1);)
        for (int i = i0; i < i1; i++) rho[i] = rho_row(d, s, Q + (int64_t)i * sq);
}

/* The engine on the transposed logits Ct = (s/eps) K Q^T (Lk x Lq, filled by
 * the caller) warm-started from u (Lq): `steps` half-steps by the team; At
 * (Lk x Lq) receives Lk P^T; res is the member's own copy. */
static void transposed_steps(const bki_team *tm, int Lq, int Lk, const float *Ct, const float *u, int steps,
                             float *At, float *hist, float *scr, bki_sk_result *res)
{
    bki_sk_problem pb = {Lk, Lq, Ct, Lq, NULL, NULL, steps, 0.0f, u, 1.0f, 0};
    bki_sk_result r = {hist, At, Lq, NULL, NULL, 0, 0.0f, 0.0f};
    bki_kern()->sk_forward(tm, &pb, &r, scr);
    *res = r;
}

/* The teacher on C = (s/eps) Q K^T (Lq x Lk, filled by the caller, with rho
 * complete) and its closure-ready dual as the centred cost-unit target y
 * (double): every member computes the mean over all rows in row order, then
 * the rows of y (and of yf as float, nullable) are written in row blocks
 * claimed at run time (no sync at the end). */
static void teacher_target(const bki_team *tm, int Lq, int Lk, const float *C, int S, float eps, const double *rho,
                           float *A, float *hist, float *scr, double *y, float *yf)
{
    bki_sk_problem pb = {Lq, Lk, C, Lk, NULL, NULL, S, 0.0f, NULL, 1.0f, 0};
    bki_sk_result r = {hist, A, Lk, NULL, NULL, 0, 0.0f, 0.0f};
    bki_kern()->sk_forward(tm, &pb, &r, scr);
    const int t = (S % 2 == 0) ? S - 1 : S - 2; /* the row step the teacher's closure acts on */
    const float *f = hist + bki_hist_off(Lq, Lk, t);
    double mean = 0.0;
    for (int i = 0; i < Lq; i++) mean += (double)eps * f[i] + rho[i];
    mean /= Lq;
    bki_claims sp = spans_open(tm, Lq);
    for (int i0, i1; bki_ranges_next_int(&sp, &i0, &i1);)
        for (int i = i0; i < i1; i++) {
            y[i] = ((double)eps * f[i] + rho[i]) - mean;
            if (yf) yf[i] = (float)y[i];
        }
}

/* Row sums r_i of the one-sided (key-normalised) plan from the score-space
 * logit potential u: the engine's single half-step on the transposed logits
 * Ct gives At = Pi^T (column-stochastic Pi), r_i = (1/Lk) sum_j At[j][i] in
 * key order (row blocks claimed at run time; no sync at the end). Returns
 * sum_j (1/Lk) LSE_i(Z_ij + u_i) in *F (nullable; every member, the same
 * value). */
static void one_sided_rows(const bki_team *tm, int Lq, int Lk, const float *Ct, const float *u, float *At,
                           float *hist, float *scr, double *r, double *F)
{
    bki_sk_result res;
    transposed_steps(tm, Lq, Lk, Ct, u, 1, At, hist, scr, &res);
    bki_claims sp = spans_open(tm, Lq);
    for (int i0, i1; bki_ranges_next_int(&sp, &i0, &i1);) {
        for (int i = i0; i < i1; i++) r[i] = 0.0;
        for (int j = 0; j < Lk; j++) {
            const float *a = At + (size_t)j * Lq;
            for (int i = i0; i < i1; i++) r[i] += a[i];
        }
        for (int i = i0; i < i1; i++) r[i] /= Lk;
    }
    if (F) { /* row potential of the transposed problem: -log Lk - LSE_j */
        double acc = 0.0;
        for (int j = 0; j < Lk; j++) acc += -log((double)Lk) - (double)res.f[j];
        *F = acc / Lk;
    }
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
/* The operator (op.h): its parameters bk_asap_forward_config (the layer and the
 * variant), and its forward's extras: the public ones and, for bk_asap_close,
 * the given dual (NULL: predicted from the features). */
typedef struct {
    const bk_asap_extras *ex;
    const float *fin; /* [B*H*Nq], cost units */
} asap_ex;

static const bk_asap_forward_config *par_of(const bki_call *c) { return c->par; }

static bk_status check(const bki_call *c)
{
    const bk_asap_forward_config *ap = par_of(c);
    const bk_asap_layer *ly = ap->layer;
    if (c->ws_mode == BKI_WS_SCALARS) /* the scalars alone (bk_op_config_check): the layer comes later */
        return ap->variant < BK_ASAP_AUTO || ap->variant > BK_ASAP_ROW
                   ? bki_fail(BK_ERR_PARAM, "unknown ASAP variant %d", (int)ap->variant)
                   : BK_OK;
    bk_status s;
    if ((s = check_layer(ly))) return s;
    if (c->d && c->d->d != ly->d)
        return bki_fail(BK_ERR_SHAPE, "head dim d=%d does not match the layer's d=%d", c->d->d, ly->d);
    if (ap->variant < BK_ASAP_AUTO || ap->variant > BK_ASAP_ROW)
        return bki_fail(BK_ERR_PARAM, "unknown ASAP variant %d", (int)ap->variant);
    if (!isfinite(ly->scale / ly->eps)) return bki_fail(BK_ERR_PARAM, "scale/eps overflows");
    return BK_OK;
}

static double cost(const bki_call *c)
{
    const bk_attn_desc *d = c->d;
    return (double)d->Nq * d->Nk + (double)par_of(c)->layer->slices * (d->Nq + d->Nk);
}

/* One lane: the transposed logits and attention, the engine's scratch for
 * the team, the features and the predicted dual; carved from base for
 * member tm (NULL: only measured into *used). */
typedef struct {
    float *Ct, *At, *scr, *hist, *u;
    double *XT, *fhat;
    feat_scr fs;
} fwd_lane;

static fwd_lane fwd_carve(const bki_call *c, const bki_team *tm, int members, char *base, size_t *used)
{
    const bk_attn_desc *d = c->d;
    const int L = par_of(c)->layer->slices;
    bki_arena ar = {base, 0, (size_t)-1};
    const size_t nm = (size_t)d->Nq * d->Nk;
    fwd_lane s;
    s.Ct = bki_carve(&ar, nm * sizeof(float));
    s.At = bki_carve(&ar, nm * sizeof(float));
    s.scr = bki_carve(&ar, sk_scratch_upto(d->Nk, d->Nq, members) * sizeof(float));
    s.hist = bki_carve(&ar, bki_hist_len(d->Nk, d->Nq, 3) * sizeof(float));
    s.fs = feat_take(&ar, tm, members, d->Nq, d->Nk, L);
    s.XT = bki_carve(&ar, sizeof(double) * (size_t)d->Nq * L);
    s.fhat = bki_carve(&ar, sizeof(double) * (size_t)d->Nq);
    s.u = bki_carve(&ar, sizeof(float) * (size_t)d->Nq);
    if (used) *used = ar.used;
    return s;
}

static size_t lane_bytes(const bki_call *c, int members)
{
    size_t used;
    const bki_team solo = BKI_SOLO;
    (void)fwd_carve(c, &solo, members, NULL, &used);
    return used + BK_ALIGN;
}

/* no tape: ASAP has no backward */
static size_t block_bytes(const bki_call *c)
{
    (void)c;
    return 0;
}

static uint32_t key(const bki_call *c)
{
    const bk_asap_forward_config *ap = par_of(c);
    const int32_t e[2] = {ap->layer->slices, steps_of(ap->variant, ap->layer->teacher_iters)};
    uint64_t h = bki_fnv1a(BKI_FNV_OFFSET, &c->op->id, sizeof c->op->id);
    h = bki_fnv1a(h, e, sizeof e);
    h = bki_fnv1a(h, &ap->layer->scale, sizeof ap->layer->scale);
    h = bki_fnv1a(h, &ap->layer->eps, sizeof ap->layer->eps);
    return (uint32_t)(h ^ (h >> 32));
}

/* One problem of the forward: features (unless the dual is given), the
 * predicted dual and the warm start (row blocks claimed at run time), Z^T
 * (tiled GEMM), the engine's 1-3 half-steps (team-aware), O = (Lq/Lk) At^T V
 * (tiled GEMM); the attention's row blocks claimed at run time; member 0
 * writes padding, fhat and diag. */
static void forward(const bki_team *tm, bki_call *c, int p, char *lane)
{
    const bk_attn_desc *d = c->d;
    const bk_asap_forward_config *ap = par_of(c);
    const bk_asap_layer *ly = ap->layer;
    const bk_tensor *out = c->out, *attn = c->attn && c->attn->data ? c->attn : NULL;
    const asap_ex *ax = c->ex;
    const bk_asap_extras *ex = ax ? ax->ex : NULL;
    const float *fin = ax ? ax->fin : NULL;
    const int L = ly->slices;
    const fwd_lane w = fwd_carve(c, tm, c->pl.team ? c->pl.nt : 1, lane, NULL);
    const int b = p / d->H, h = p % d->H;
    const int Lq = bki_op_lq(c, p), Lk = bki_op_lk(c, p);
    const int live = Lq > 0 && Lk > 0;
    bki_sk_result res = {0};
    if (live) {
        const float *Qb = bki_at(c->q, b, h), *Kb = bki_at(c->k, b, h), *Vb = bki_at(c->v, b, h);
        if (!fin)
            sliced_features(tm, &w.fs, Lq, Lk, d->d, L, ly->theta, ly->scale, Qb, c->q->stride_n, Kb,
                            c->k->stride_n, w.XT);
        bki_claims sp = spans_open(tm, Lq); /* row blocks claimed at run time */
        for (int i0, i1; bki_ranges_next_int(&sp, &i0, &i1);) {
            if (fin) {
                for (int i = i0; i < i1; i++) w.fhat[i] = fin[(size_t)p * d->Nq + i];
            } else { /* fhat_i = sum_l X_il omega_l, in slice order */
                for (int i = i0; i < i1; i++) w.fhat[i] = 0.0;
                for (int l = 0; l < L; l++) {
                    const double *xl = w.XT + (size_t)l * Lq, wl = ly->omega[l];
                    for (int i = i0; i < i1; i++) w.fhat[i] += xl[i] * wl;
                }
            }
            for (int i = i0; i < i1; i++)
                w.u[i] = (float)((w.fhat[i] - rho_row(d->d, ly->scale, Qb + (int64_t)i * c->q->stride_n)) / ly->eps);
        }
        bki_gemm(tm, 0, 1, Lk, Lq, d->d, ly->scale / ly->eps, Kb, c->k->stride_n, Qb, c->q->stride_n, 0.0f, w.Ct,
                 Lq);
        bki_team_sync(tm); /* Ct and u complete (fhat too, for member 0 below) */
        transposed_steps(tm, Lq, Lk, w.Ct, w.u, steps_of(ap->variant, ly->teacher_iters), w.At, w.hist, w.scr,
                         &res);
        if (out) /* O = A V = (Lq/Lk) At^T V */
            bki_gemm(tm, 1, 0, Lq, d->dv, Lk, (float)Lq / (float)Lk, w.At, Lq, Vb, c->v->stride_n, 0.0f,
                     bki_at(out, b, h), out->stride_n);
    }
    if (attn) { /* row blocks claimed at run time */
        float *Ab = bki_at(attn, b, h);
        const float r = live ? (float)Lq / (float)Lk : 0.0f;
        bki_claims sp = spans_open(tm, d->Nq);
        for (int i0, i1; bki_ranges_next_int(&sp, &i0, &i1);)
            for (int i = i0; i < i1; i++) {
                float *row = Ab + (int64_t)i * attn->stride_n;
                if (live && i < Lq) {
                    for (int j = 0; j < Lk; j++) row[j] = r * w.At[(size_t)j * Lq + i];
                    memset(row + Lk, 0, sizeof(float) * (size_t)(d->Nk - Lk));
                } else {
                    memset(row, 0, sizeof(float) * (size_t)d->Nk);
                }
            }
    }
    if (tm->tid != 0) return;
    if (out) bki_zero_rows(bki_at(out, b, h), out->stride_n, live ? Lq : 0, d->Nq, d->dv);
    if (!ex) return;
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

bk_asap_forward_config bk_asap_forward_config_default(void)
{
    const bk_asap_forward_config d = {NULL, BK_ASAP_AUTO};
    return d;
}

static void par_default(void *p) { *(bk_asap_forward_config *)p = bk_asap_forward_config_default(); }

static const char *const variant_names[] = {"auto", "zero", "column", "row", NULL};
static const bki_field fields[] = {
    {.name = "variant", .type = BKI_F_ENUM, .offset = offsetof(bk_asap_forward_config, variant),
     .names = variant_names,
     .doc = "closure: auto (the teacher's ending) | zero (one row step) | column | row (exact marginal)"},
};

/* ---- the arrays: the compiled layer (a file) in, diag [B, H, 3] out ---- */
static bk_status layer_load(const char *path, void **obj)
{
    bk_asap_layer *ly = calloc(1, sizeof *ly);
    if (!ly) return bki_fail(BK_ERR_NOMEM, "asap: no memory for the layer");
    bk_status s = bk_asap_load(path, ly);
    if (s) {
        free(ly);
        return s;
    }
    *obj = ly;
    return BK_OK;
}

static void layer_release(void *obj)
{
    if (!obj) return;
    bk_asap_layer_free(obj);
    free(obj);
}

static int diag_shape(const void *par, const bk_attn_desc *d, int64_t dims[4])
{
    (void)par;
    dims[0] = d->B; dims[1] = d->H; dims[2] = 3;
    return 3;
}

enum { A_LAYER, A_DIAG }; /* the arrays' indices */
static const bki_array arrays[] = {
    [A_LAYER] = {.name = "layer",
     .doc = "compiled layer F.asap from `birkhoff asap calibrate` (it fixes scale, eps, the slices)",
     .kind = BKI_ARR_IN | BKI_ARR_FILE | BKI_ARR_REQUIRED, .shape_text = "F.asap",
     .offset = offsetof(bk_asap_forward_config, layer), .load = layer_load, .release = layer_release},
    [A_DIAG] = {.name = "diag", .doc = "per problem: half-steps (1, 2 or 3), max |row sum - 1|, max |col sum - 1|",
     .kind = BKI_ARR_FWD | BKI_ARR_HOST | BKI_ARR_SUMMARY, .shape_text = "[B, H, 3]", .shape = diag_shape,
     .cols = "#half-steps,|row sum - 1|,|col sum - 1|;(relative)"},
};

static bk_status run_arrays(bki_call *c, float *const *a, void *tape, void *ws, size_t ws_size)
{
    const int P = c->d ? c->d->B * c->d->H : 0;
    bk_sinkhorn_diag *dg = a[A_DIAG] && P > 0 ? malloc(sizeof *dg * (size_t)P) : NULL;
    if (a[A_DIAG] && P > 0 && !dg) return bki_fail(BK_ERR_NOMEM, "asap: no memory for the diagnostics");
    const bk_asap_extras ex = {.diag = dg};
    const asap_ex ax = {&ex, NULL};
    c->ex = &ax;
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

static const bki_preset presets[] = {
    {.name = "asap0", .params = "variant=zero", .doc = "asap with the zero closure (one row step)"},
};

const bki_op bki_op_asap = {
    .name = "asap", .id = 5, .par_name = "bk_asap_forward_config", .fields = fields, .nfields = BKI_NB(fields),
    .par_size = sizeof(bk_asap_forward_config), .par_default = par_default, .check = check, .cost = cost,
    .lane_bytes = lane_bytes, .block_bytes = block_bytes, .key = key, .forward = forward,
    .doc = "ASAP: Sinkhorn attention compiled to one closure step from a fitted sliced dual (Tran, Milkert, "
           "Hyde 2026; inference only)",
    .caps = BKI_CAP_CROSS | BKI_CAP_PAD | BKI_CAP_ATTN | BKI_CAP_MODEL, .arrays = arrays, .narrays = BKI_NB(arrays),
    .run_arrays = run_arrays, .presets = presets, .npresets = BKI_NB(presets),
};

/* ---- public entry points: the registry's forward with {layer, variant} ---- */
size_t bk_asap_workspace_size(const bk_attn_desc *desc, const bk_asap_layer *layer)
{
    const bk_asap_forward_config ap = {layer, BK_ASAP_AUTO};
    return bki_call_workspace(&bki_op_asap, desc, &ap);
}

/* The forward, with the dual predicted from the features (fin NULL) or given
 * (fin [B*H*Nq], cost units: bk_asap_close). */
static bk_status forward_impl(const bk_attn_desc *d, const bk_asap_layer *ly, bk_asap_variant variant,
                              const float *fin, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                              const bk_tensor *out, const bk_asap_extras *ex, void *ws, size_t ws_size)
{
    const bk_asap_forward_config ap = {ly, variant};
    const asap_ex ax = {ex, fin};
    return bki_call_forward(&bki_op_asap, d, &ap, q, k, v, out, NULL, &ax, ex ? &ex->attn : NULL, ws, ws_size);
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

typedef struct { /* what the KL fit keeps of one problem */
    int Lq, Lk;
    float *X;       /* [L x Lq], slice-major */
    double *r, *rho;/* [Lq]     */
    float *Q, *K;   /* [Lq x d], [Lk x d] */
} kl_rec;

/* One lane of the teacher + features for problems up to Nq x Nk (L = 0: the
 * teacher alone; S = 0: the features alone; kl: room for the one-sided step
 * on the transposed logits). */
static size_t calib_lane_bytes(int Nq, int Nk, int L, int S, int kl, int members)
{
    size_t b = (L > 0 ? feat_bytes(Nq, Nk, L, members) + bki_round_up(sizeof(double) * (size_t)Nq * L) : 0) +
               8 * BK_ALIGN;
    if (S < 1) return b;
    const size_t nm = (size_t)Nq * Nk, hl = bki_hist_len(Nq, Nk, S), ht = bki_hist_len(Nk, Nq, 1);
    const size_t sa = sk_scratch_upto(Nq, Nk, members), sb = kl ? sk_scratch_upto(Nk, Nq, members) : 0;
    return b + 2 * bki_round_up(nm * sizeof(float)) + bki_round_up((hl > ht ? hl : ht) * sizeof(float)) +
           bki_round_up((sa > sb ? sa : sb) * sizeof(float)) + 2 * bki_round_up(sizeof(double) * (size_t)Nq) +
           (kl ? bki_round_up(sizeof(float) * (size_t)Nq) : 0);
}

typedef struct {
    float *C, *A, *hist, *scr, *u;
    double *XT, *y, *rho;
    feat_scr fs;
} calib_lane;

static calib_lane calib_take(char *lane, size_t lb, const bki_team *tm, int members, int Nq, int Nk, int L, int S,
                             int kl)
{
    bki_arena ar = {lane, 0, lb - BK_ALIGN};
    calib_lane w;
    memset(&w, 0, sizeof w);
    if (L > 0) {
        w.fs = feat_take(&ar, tm, members, Nq, Nk, L);
        w.XT = bki_take(&ar, sizeof(double) * (size_t)Nq * L);
    }
    if (S < 1) return w;
    const size_t nm = (size_t)Nq * Nk, hl = bki_hist_len(Nq, Nk, S), ht = bki_hist_len(Nk, Nq, 1);
    const size_t sa = sk_scratch_upto(Nq, Nk, members), sb = kl ? sk_scratch_upto(Nk, Nq, members) : 0;
    w.C = bki_take(&ar, nm * sizeof(float));
    w.A = bki_take(&ar, nm * sizeof(float));
    w.hist = bki_take(&ar, (hl > ht ? hl : ht) * sizeof(float));
    w.scr = bki_take(&ar, (sa > sb ? sa : sb) * sizeof(float));
    w.y = bki_take(&ar, sizeof(double) * (size_t)Nq);
    w.rho = bki_take(&ar, sizeof(double) * (size_t)Nq);
    w.u = kl ? bki_take(&ar, sizeof(float) * (size_t)Nq) : NULL;
    return w;
}

/* The teacher's part of one problem: C = (s/eps) Q K^T (tiled GEMM) and rho
 * (row blocks), then the teacher and its target y, and yf = (float)y
 * (nullable) (row blocks; no sync at the end). */
static void teacher_problem(const bki_team *tm, const calib_lane *w, int Lq, int Lk, int d, float sc, float eps,
                            int S, const float *Qb, int64_t sq, const float *Kb, int64_t sk, float *yf)
{
    bki_gemm(tm, 0, 1, Lq, Lk, d, sc / eps, Qb, sq, Kb, sk, 0.0f, w->C, Lk);
    rho_rows(tm, Lq, d, sc, Qb, sq, w->rho);
    bki_team_sync(tm);
    teacher_target(tm, Lq, Lk, w->C, S, eps, w->rho, w->A, w->hist, w->scr, w->y, yf);
}

typedef struct {
    const bk_attn_desc *d;
    const bk_tensor *q, *k;
    const float *theta;
    float scale, eps;
    int L, S, kl, members;
    size_t lb;
    float *out;          /* features: [P][Nq][L]; teacher: [P][Nq]    */
    double *part;        /* calibration: [P][blk]                      */
    kl_rec *recs;        /* calibration with keep_kl: [P]              */
} calib_ctx;

/* One problem of bk_asap_features: the features (team), then X [Nq x L]
 * float out, row blocks claimed at run time (padded rows zero). */
static void features_problem(const bki_team *tm, int p, char *lane, void *vctx)
{
    const calib_ctx *x = vctx;
    const bk_attn_desc *d = x->d;
    const int L = x->L, b = p / d->H, h = p % d->H;
    const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
    const int live = Lq > 0 && Lk > 0;
    const calib_lane w = calib_take(lane, x->lb, tm, x->members, d->Nq, d->Nk, L, 0, 0);
    if (live)
        sliced_features(tm, &w.fs, Lq, Lk, d->d, L, x->theta, x->scale, bki_at(x->q, b, h), x->q->stride_n,
                        bki_at(x->k, b, h), x->k->stride_n, w.XT);
    float *o = x->out + (size_t)p * d->Nq * L;
    bki_claims sp = spans_open(tm, d->Nq);
    for (int i0, i1; bki_ranges_next_int(&sp, &i0, &i1);)
        for (int i = i0; i < i1; i++) {
            float *oi = o + (size_t)i * L;
            if (live && i < Lq)
                for (int l = 0; l < L; l++) oi[l] = (float)w.XT[(size_t)l * Lq + i];
            else
                memset(oi, 0, sizeof(float) * (size_t)L);
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
    const int P = d->B * d->H, L = ly->slices;
    const bki_plan pl = bki_asap_plan(d, L);
    const int members = plan_members(pl);
    const size_t lb = calib_lane_bytes(d->Nq, d->Nk, L, 0, 0, members);
    char *base = malloc(lanes_alloc(pl, lb));
    if (!base) return bki_fail(BK_ERR_NOMEM, "out of memory (ASAP features)");
    calib_ctx x = {d, q, k, ly->theta, ly->scale, ly->eps, L, 0, 0, members, lb, Xout, NULL, NULL};
    run_lanes(pl, P, base, lb, features_problem, &x);
    free(base);
    bki_clear_error();
    return BK_OK;
}

/* One problem of bk_asap_teacher_dual: the teacher (team) and its target y
 * out as float, written with y itself (row blocks claimed at run time;
 * member 0 the padded rows). */
static void teacher_dual_problem(const bki_team *tm, int p, char *lane, void *vctx)
{
    const calib_ctx *x = vctx;
    const bk_attn_desc *d = x->d;
    const int b = p / d->H, h = p % d->H;
    const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
    const int live = Lq > 0 && Lk > 0;
    float *o = x->out + (size_t)p * d->Nq;
    if (live) {
        const calib_lane w = calib_take(lane, x->lb, tm, x->members, d->Nq, d->Nk, 0, x->S, 0);
        teacher_problem(tm, &w, Lq, Lk, d->d, x->scale, x->eps, x->S, bki_at(x->q, b, h), x->q->stride_n,
                        bki_at(x->k, b, h), x->k->stride_n, o);
    }
    if (tm->tid == 0) memset(o + (live ? Lq : 0), 0, sizeof(float) * (size_t)(d->Nq - (live ? Lq : 0)));
}

/* q and k are finite (check_qk): a teacher whose dual or statistics are not
 * is a float32 overflow of its scores (as the operators' results, driver.c) */
static bk_status teacher_overflow(const bk_attn_desc *d, int p)
{
    return bki_fail(BK_ERR_OVERFLOW,
                    "ASAP teacher: problem %d (b=%d, h=%d) is not finite although q and k are: its scores (scale/eps) "
                    "q.k overflowed float32; reduce |q|, |k| or the scale, or raise eps",
                    p, p / d->H, p % d->H);
}

bk_status bk_asap_teacher_dual(const bk_attn_desc *d, const bk_asap_config *cfg, const bk_tensor *q,
                               const bk_tensor *k, float *y)
{
    bk_status s;
    if ((s = check_qk(d, q, k))) return s;
    if (!cfg) return bki_fail(BK_ERR_NULL, "ASAP configuration is NULL");
    if ((s = check_common(d->d, 1, cfg->scale, cfg->eps, cfg->teacher_iters))) return s;
    if (!y) return bki_fail(BK_ERR_NULL, "target output is NULL");
    const float sc = bki_scale(cfg->scale, d->d), alpha = sc / cfg->eps;
    if (!isfinite(alpha)) return bki_fail(BK_ERR_PARAM, "scale/eps overflows");
    const int P = d->B * d->H, S = cfg->teacher_iters;
    const bki_plan pl = bki_asap_plan(d, 0);
    const int members = plan_members(pl);
    const size_t lb = calib_lane_bytes(d->Nq, d->Nk, 0, S, 0, members);
    char *base = malloc(lanes_alloc(pl, lb));
    if (!base) return bki_fail(BK_ERR_NOMEM, "out of memory (ASAP teacher)");
    calib_ctx x = {d, q, k, NULL, sc, cfg->eps, 0, S, 0, members, lb, y, NULL, NULL};
    run_lanes(pl, P, base, lb, teacher_dual_problem, &x);
    free(base);
    for (int p = 0; p < P; p++) /* q, k are finite: a non-finite dual is an overflow */
        for (int i = 0; i < bki_len(d->q_len, p / d->H, d->Nq); i++)
            if (!isfinite(y[(size_t)p * d->Nq + i])) return teacher_overflow(d, p);
    bki_clear_error();
    return BK_OK;
}

/* ------------------------------------------------------------------------ */
/* calibration                                                              */
/* ------------------------------------------------------------------------ */
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
    c->cfg.scale = bki_scale(cfg->scale, d);
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

/* Rows of the Gram block per tile: the blocks X^T X and X^T y of a problem
 * are cut into tiles of this many rows (a constant: the partition depends on
 * L only), each tile one double BLAS call over all of the problem's rows. */
#define GRAM_TILE 8

/* One problem of bk_asap_calib_add: the teacher and its target, the features
 * (team), the per-problem blocks G_p = X^T X, c_p = X^T y (Gram tiles claimed
 * at run time) and yy_p = y^T y (member 0); with keep_kl, the one-sided row
 * sums of the teacher's dual and the problem's record (row, slice and key
 * blocks claimed at run time). Problems without a valid query or key get a
 * zero block. */
static void calib_problem(const bki_team *tm, int p, char *lane, void *vctx)
{
    const calib_ctx *x = vctx;
    const bk_attn_desc *d = x->d;
    const int L = x->L, b = p / d->H, h = p % d->H;
    const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
    const size_t blk = (size_t)L * L + L + 1;
    double *pp = x->part + blk * (size_t)p;
    if (Lq <= 0 || Lk <= 0) {
        if (tm->tid == 0) memset(pp, 0, sizeof(double) * blk);
        return;
    }
    const calib_lane w = calib_take(lane, x->lb, tm, x->members, d->Nq, d->Nk, L, x->S, x->kl);
    const float *Qb = bki_at(x->q, b, h), *Kb = bki_at(x->k, b, h);
    const int64_t sq = x->q->stride_n, sk = x->k->stride_n;
    teacher_problem(tm, &w, Lq, Lk, d->d, x->scale, x->eps, x->S, Qb, sq, Kb, sk, NULL);
    /* its syncs also complete y and free C, A, hist and the engine's scratch */
    sliced_features(tm, &w.fs, Lq, Lk, d->d, L, x->theta, x->scale, Qb, sq, Kb, sk, w.XT);
    /* G_p = X^T X, c_p = X^T y, yy_p = y^T y (X^T = XT is slice-major) */
    bki_claims cl = bki_claims_open(tm, (L + GRAM_TILE - 1) / GRAM_TILE); /* tiles claimed at run time */
    for (int64_t t; bki_claims_next(&cl, &t);) {
        const int a0 = (int)t * GRAM_TILE, na = L - a0 < GRAM_TILE ? L - a0 : GRAM_TILE;
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, na, L, Lq, 1.0, w.XT + (size_t)a0 * Lq, Lq, w.XT, Lq, 0.0,
                    pp + (size_t)a0 * L, L);
        cblas_dgemv(CblasRowMajor, CblasNoTrans, na, Lq, 1.0, w.XT + (size_t)a0 * Lq, Lq, w.y, 1, 0.0,
                    pp + (size_t)L * L + a0, 1);
    }
    if (tm->tid == 0) {
        double yy = 0.0;
        for (int i = 0; i < Lq; i++) yy += w.y[i] * w.y[i];
        pp[(size_t)L * L + L] = yy;
    }
    if (!x->kl) return;
    kl_rec *r = &x->recs[p];
    const float alpha = x->scale / x->eps;
    /* row, slice and key blocks claimed at run time */
    bki_claims sp = spans_open(tm, Lq);
    for (int i0, i1; bki_ranges_next_int(&sp, &i0, &i1);)
        for (int i = i0; i < i1; i++) w.u[i] = (float)((w.y[i] - w.rho[i]) / x->eps);
    bki_gemm(tm, 0, 1, Lk, Lq, d->d, alpha, Kb, sk, Qb, sq, 0.0f, w.C, Lq);
    bki_team_sync(tm);
    one_sided_rows(tm, Lq, Lk, w.C, w.u, w.A, w.hist, w.scr, r->r, NULL);
    bki_claims cs = bki_claims_open(tm, L);
    for (int64_t l; bki_claims_next(&cs, &l);)
        for (size_t i = (size_t)l * Lq; i < (size_t)(l + 1) * Lq; i++) r->X[i] = (float)w.XT[i];
    sp = spans_open(tm, Lq);
    for (int i0, i1; bki_ranges_next_int(&sp, &i0, &i1);)
        for (int i = i0; i < i1; i++) {
            r->rho[i] = w.rho[i];
            memcpy(r->Q + (size_t)i * d->d, Qb + (int64_t)i * sq, sizeof(float) * (size_t)d->d);
        }
    bki_claims kp = spans_open(tm, Lk);
    for (int j0, j1; bki_ranges_next_int(&kp, &j0, &j1);)
        for (int j = j0; j < j1; j++)
            memcpy(r->K + (size_t)j * d->d, Kb + (int64_t)j * sk, sizeof(float) * (size_t)d->d);
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
    const bki_plan pl = bki_asap_plan(d, L);
    const int members = plan_members(pl);
    const size_t lb = calib_lane_bytes(d->Nq, d->Nk, L, S, kl, members);
    char *base = malloc(lanes_alloc(pl, lb));
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
    calib_ctx x = {d, q, k, c->theta, sc, eps, L, S, kl, members, lb, NULL, part, recs};
    run_lanes(pl, P, base, lb, calib_problem, &x);
    free(base);
    for (int p = 0; p < P; p++) { /* an overflowing teacher: the calibration is left as it was */
        const int b = p / d->H;
        if (bki_len(d->q_len, b, d->Nq) == 0 || bki_len(d->k_len, b, d->Nk) == 0) continue;
        int fin = 1;
        for (size_t i = 0; i < blk; i++) fin &= isfinite(part[blk * (size_t)p + i]) != 0;
        if (!fin) {
            if (recs)
                for (int r = 0; r < P; r++) rec_free(&recs[r]);
            free(recs);
            free(part);
            return teacher_overflow(d, p);
        }
    }
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

/* ---- the KL objective: records run as problems --------------------------- */
typedef struct {
    float *Ct, *At, *scr, *hist, *u, *W, *XD;
    double *v, *rh;
} kl_lane;

static size_t kl_lane_bytes(int maxq, int maxk, int L, int members)
{
    const size_t nm = (size_t)maxq * maxk;
    return 2 * bki_round_up(nm * sizeof(float)) +
           bki_round_up(sk_scratch_upto(maxk, maxq, members) * sizeof(float)) +
           bki_round_up(bki_hist_len(maxk, maxq, 1) * sizeof(float)) + bki_round_up(sizeof(float) * (size_t)maxq) +
           bki_round_up(sizeof(float) * (size_t)maxk * L) + bki_round_up(sizeof(float) * (size_t)maxq * L) +
           2 * bki_round_up(sizeof(double) * (size_t)maxq) + 12 * BK_ALIGN;
}

static kl_lane kl_take(char *lane, size_t lb, int maxq, int maxk, int L, int members)
{
    bki_arena ar = {lane, 0, lb - BK_ALIGN};
    const size_t nm = (size_t)maxq * maxk;
    kl_lane w;
    w.Ct = bki_take(&ar, nm * sizeof(float));
    w.At = bki_take(&ar, nm * sizeof(float));
    w.scr = bki_take(&ar, sk_scratch_upto(maxk, maxq, members) * sizeof(float));
    w.hist = bki_take(&ar, bki_hist_len(maxk, maxq, 1) * sizeof(float));
    w.u = bki_take(&ar, sizeof(float) * (size_t)maxq);
    w.W = bki_take(&ar, sizeof(float) * (size_t)maxk * L);
    w.XD = bki_take(&ar, sizeof(float) * (size_t)maxq * L);
    w.v = bki_take(&ar, sizeof(double) * (size_t)maxq);
    w.rh = bki_take(&ar, sizeof(double) * (size_t)maxq);
    return w;
}

/* The plan of the KL objective's records (each a problem of at most maxq x
 * maxk); kl_fit sizes its lanes with it and passes it to every kl_eval. */
static bki_plan kl_plan(const bk_asap_calib *c)
{
    const bk_attn_desc d = {(int)c->nrec, 1, c->maxq, c->maxk, c->cfg.d, 1, NULL, NULL};
    return bki_asap_plan(&d, c->cfg.slices);
}

typedef struct {
    const bk_asap_calib *c;
    const double *w;
    double *part;
    int hess, members;
    size_t lb;
} kl_ctx;

/* One record's block: J_m = eps F - <r, X w> (member 0), gradient X^T (rhat -
 * r) (slices claimed at run time), and if hess the Hessian block (1/eps)
 * [X^T diag(rhat) X - (1/Lk) W W^T], W = X^T Pi (L x Lk, tiled GEMM; Hessian
 * rows claimed at run time). Every entry is one member's sum in row (or key)
 * order. */
static void kl_problem(const bki_team *tm, int m, char *lane, void *vctx)
{
    const kl_ctx *x = vctx;
    const bk_asap_calib *c = x->c;
    const int L = c->cfg.slices, d = c->cfg.d;
    const float eps = c->cfg.eps, alpha = c->cfg.scale / eps;
    const kl_rec *r = &c->rec[m];
    const int Lq = r->Lq, Lk = r->Lk;
    const kl_lane w = kl_take(lane, x->lb, c->maxq, c->maxk, L, x->members);
    double *pp = x->part + ((size_t)L * L + L + 1) * (size_t)m;
    bki_claims sp = spans_open(tm, Lq); /* row blocks claimed at run time */
    for (int i0, i1; bki_ranges_next_int(&sp, &i0, &i1);) {
        for (int i = i0; i < i1; i++) w.v[i] = 0.0;
        for (int l = 0; l < L; l++) { /* v = X w, in slice order */
            const float *xl = r->X + (size_t)l * Lq;
            const double wl = x->w[l];
            for (int i = i0; i < i1; i++) w.v[i] += (double)xl[i] * wl;
        }
        for (int i = i0; i < i1; i++) w.u[i] = (float)((w.v[i] - r->rho[i]) / eps);
    }
    bki_gemm(tm, 0, 1, Lk, Lq, d, alpha, r->K, d, r->Q, d, 0.0f, w.Ct, Lq);
    bki_team_sync(tm);
    double F = 0.0;
    one_sided_rows(tm, Lq, Lk, w.Ct, w.u, w.At, w.hist, w.scr, w.rh, &F);
    bki_team_sync(tm); /* v and rhat complete */
    if (tm->tid == 0) {
        double lin = 0.0;
        for (int i = 0; i < Lq; i++) lin += r->r[i] * w.v[i];
        pp[(size_t)L * L + L] = (double)eps * F - lin;
    }
    /* gradient X^T (rhat - r), then XD and the Hessian: slices claimed at run time */
    double *gp = pp + (size_t)L * L;
    bki_claims cl = bki_claims_open(tm, L);
    for (int64_t l; bki_claims_next(&cl, &l);) {
        const float *xl = r->X + (size_t)l * Lq;
        double s = 0.0;
        for (int i = 0; i < Lq; i++) s += (double)xl[i] * (w.rh[i] - r->r[i]);
        gp[l] = s;
    }
    if (!x->hess) return;
    cl = bki_claims_open(tm, L);
    for (int64_t l; bki_claims_next(&cl, &l);) { /* XD = X^T diag(rhat), slice-major */
        const float *xl = r->X + (size_t)l * Lq;
        float *dl = w.XD + (size_t)l * Lq;
        for (int i = 0; i < Lq; i++) dl[i] = xl[i] * (float)w.rh[i];
    }
    bki_gemm(tm, 0, 1, L, Lk, Lq, 1.0f, r->X, Lq, w.At, Lq, 0.0f, w.W, Lk);
    bki_team_sync(tm); /* XD and W complete */
    cl = bki_claims_open(tm, L);
    for (int64_t a; bki_claims_next(&cl, &a);) {
        const float *da = w.XD + (size_t)a * Lq, *wa = w.W + (size_t)a * Lk;
        for (int bb = 0; bb < L; bb++) {
            const float *xb = r->X + (size_t)bb * Lq, *wb = w.W + (size_t)bb * Lk;
            double s1 = 0.0, s2 = 0.0;
            for (int i = 0; i < Lq; i++) s1 += (double)da[i] * xb[i];
            for (int j = 0; j < Lk; j++) s2 += (double)wa[j] * wb[j];
            pp[(size_t)a * L + bb] = (s1 - s2 / Lk) / eps;
        }
    }
}

/* KL objective over the records at w: J, gradient and (if H) Hessian, all
 * without the ridge. Per-record blocks (each by a team or one thread, as pl
 * says), summed in record order. */
static void kl_eval(const bk_asap_calib *c, bki_plan pl, const double *w, double *J, double *g, double *H,
                    double *part, char *base, size_t lb)
{
    const int L = c->cfg.slices;
    const int64_t R = c->nrec;
    const size_t blk = (size_t)L * L + L + 1;
    kl_ctx x = {c, w, part, H != NULL, plan_members(pl), lb};
    run_lanes(pl, (int)R, base, lb, kl_problem, &x);
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
}

static bk_status kl_fit(const bk_asap_calib *c, const bk_asap_kl_config *o, double *w, bk_asap_fit_report *rep)
{
    const int L = c->cfg.slices;
    const double lam = c->cfg.lambda;
    const int64_t R = c->nrec;
    const size_t blk = (size_t)L * L + L + 1;
    const bki_plan pl = kl_plan(c);
    const size_t lb = kl_lane_bytes(c->maxq, c->maxk, L, plan_members(pl));
    double *part = malloc(sizeof(double) * blk * (size_t)R);
    char *base = malloc(lanes_alloc(pl, lb));
    double *buf = malloc(sizeof(double) * (3 * (size_t)L * L + 6 * (size_t)L)); /* (L <= 2^16: in size_t, not int) */
    if (!part || !base || !buf) {
        free(part);
        free(base);
        free(buf);
        return bki_fail(BK_ERR_NOMEM, "out of memory (ASAP KL fit)");
    }
    double *H = buf, *work = H + (size_t)L * L, *g = work + (size_t)L * L, *dw = g + L, *wt = dw + L, *gt = wt + L;
    double J, Jt;
    kl_eval(c, pl, w, &J, g, H, part, base, lb);
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
            kl_eval(c, pl, wt, &Jt, gt, NULL, part, base, lb);
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
        kl_eval(c, pl, w, &J, g, H, part, base, lb);
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

bk_status bk_asap_calib_fit(bk_asap_calib *c, bk_asap_fit fit, const bk_asap_kl_config *kl, bk_asap_layer *ly,
                            bk_asap_fit_report *report)
{
    if (!c || !ly) return bki_fail(BK_ERR_NULL, "ASAP calibration or layer is NULL");
    memset(ly, 0, sizeof *ly);
    if (fit != BK_ASAP_FIT_LS && fit != BK_ASAP_FIT_KL) return bki_fail(BK_ERR_PARAM, "unknown ASAP fit %d", (int)fit);
    if (c->problems == 0)
        return bki_fail(BK_ERR_PARAM, "ASAP calibration set is empty (no problem with a valid query and key)");
    if (fit == BK_ASAP_FIT_KL && !c->keep_kl)
        return bki_fail(BK_ERR_PARAM, "the KL fit needs a calibration created with keep_kl = 1");
    bk_asap_kl_config ko = kl ? *kl : bk_asap_kl_config_default();
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

static uint64_t fnv1a(const unsigned char *p, size_t n) { return bki_fnv1a(BKI_FNV_OFFSET, p, n); }

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
    s = bki_write_file(path, 0, 1, parts, sizes);
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
    struct stat fst; /* the file must hold what its header claims before anything is allocated for it */
    if (fstat(fileno(fp), &fst) == 0 && S_ISREG(fst.st_mode) && (uint64_t)fst.st_size != (uint64_t)n) {
        fclose(fp);
        return bki_fail(BK_ERR_FORMAT, "%s: file is %s than its header says (%zu bytes expected, %lld found)", path,
                        (uint64_t)fst.st_size < (uint64_t)n ? "shorter" : "longer", n, (long long)fst.st_size);
    }
    unsigned char *buf = malloc(n + 1);
    if (!buf) {
        fclose(fp);
        return bki_fail(BK_ERR_NOMEM, "%s: out of memory (%zu bytes for the layer)", path, n);
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
/* Per problem: rows in blocks of bki_row_block(Lq) (claimed at run time by
 * the team's members), each block's partial sums (and its partial column
 * sums of A) in row order, then the blocks summed in block order; the
 * problems' metrics are averaged in problem order. */
enum { CMP_E2, CMP_R2, CMP_DA, CMP_NA, CMP_ROW, CMP_N };

typedef struct {
    const bk_attn_desc *d;
    const bk_tensor *out, *out_ref, *attn, *attn_ref;
    int with_a;
    size_t lb;
    double *res; /* [P][5]: output RMSE, output RMS, attention rel. L2, row error, column error */
} cmp_ctx;

static size_t cmp_lane_bytes(const bk_attn_desc *d, int with_a)
{
    int nb = 1; /* the most row blocks of any valid length up to Nq (not monotone in it) */
    for (int n = 1; n <= d->Nq; n++) {
        const int b = bki_nblocks(n, bki_row_block(n));
        nb = b > nb ? b : nb;
    }
    return bki_round_up(sizeof(double) * (size_t)nb * CMP_N) +
           (with_a ? bki_round_up(sizeof(double) * (size_t)nb * d->Nk) + bki_round_up(sizeof(double) * (size_t)d->Nk)
                   : 0) +
           4 * BK_ALIGN;
}

static void cmp_problem(const bki_team *tm, int p, char *lane, void *vctx)
{
    const cmp_ctx *x = vctx;
    const bk_attn_desc *d = x->d;
    const int b = p / d->H, h = p % d->H;
    const int Lq = bki_len(d->q_len, b, d->Nq), Lk = bki_len(d->k_len, b, d->Nk);
    if (Lq == 0 || Lk == 0) return;
    bki_arena ar = {lane, 0, x->lb - BK_ALIGN};
    const int rb = bki_row_block(Lq), nb = bki_nblocks(Lq, rb);
    double *bs = bki_take(&ar, sizeof(double) * (size_t)nb * CMP_N);
    double *cpart = x->with_a ? bki_take(&ar, sizeof(double) * (size_t)nb * Lk) : NULL;
    double *col = x->with_a ? bki_take(&ar, sizeof(double) * (size_t)Lk) : NULL;
    const float *O = bki_at(x->out, b, h), *Or = bki_at(x->out_ref, b, h);
    const float *A = x->with_a ? bki_at(x->attn, b, h) : NULL, *Ar = x->with_a ? bki_at(x->attn_ref, b, h) : NULL;
    bki_claims cl = bki_claims_open(tm, nb); /* row blocks claimed at run time */
    for (int64_t blk; bki_claims_next(&cl, &blk);) {
        const int bl = (int)blk;
        double *s = bs + (size_t)bl * CMP_N, e2 = 0, r2 = 0, da = 0, na = 0, rowe = 0;
        const int i1 = (bl + 1) * rb < Lq ? (bl + 1) * rb : Lq;
        double *cp = x->with_a ? cpart + (size_t)bl * Lk : NULL;
        if (cp)
            for (int j = 0; j < Lk; j++) cp[j] = 0.0;
        for (int i = bl * rb; i < i1; i++) {
            for (int c = 0; c < d->dv; c++) {
                double u = O[(int64_t)i * x->out->stride_n + c], v = Or[(int64_t)i * x->out_ref->stride_n + c];
                e2 += (u - v) * (u - v);
                r2 += v * v;
            }
            if (!cp) continue;
            double rs = 0;
            for (int j = 0; j < Lk; j++) {
                double u = A[(int64_t)i * x->attn->stride_n + j], v = Ar[(int64_t)i * x->attn_ref->stride_n + j];
                da += (u - v) * (u - v);
                na += v * v;
                rs += u;
                cp[j] += u;
            }
            rowe += fabs(rs - 1.0);
        }
        s[CMP_E2] = e2;
        s[CMP_R2] = r2;
        s[CMP_DA] = da;
        s[CMP_NA] = na;
        s[CMP_ROW] = rowe;
    }
    bki_team_sync(tm);
    if (x->with_a) { /* column sums in block order, column blocks claimed at run time */
        bki_claims sp = spans_open(tm, Lk);
        for (int j0, j1; bki_ranges_next_int(&sp, &j0, &j1);)
            for (int j = j0; j < j1; j++) {
                double s = 0.0;
                for (int bl = 0; bl < nb; bl++) s += cpart[(size_t)bl * Lk + j];
                col[j] = s;
            }
        bki_team_sync(tm);
    }
    if (tm->tid != 0) return;
    double t[CMP_N] = {0, 0, 0, 0, 0};
    for (int bl = 0; bl < nb; bl++)
        for (int k = 0; k < CMP_N; k++) t[k] += bs[(size_t)bl * CMP_N + k];
    double *r = x->res + (size_t)p * 5;
    r[0] = sqrt(t[CMP_E2] / ((double)Lq * d->dv));
    r[1] = sqrt(t[CMP_R2] / ((double)Lq * d->dv));
    if (!x->with_a) return;
    double cole = 0;
    for (int j = 0; j < Lk; j++) cole += fabs(col[j] * Lk / Lq - 1.0);
    r[2] = t[CMP_NA] > 0 ? sqrt(t[CMP_DA] / t[CMP_NA]) : sqrt(t[CMP_DA]);
    r[3] = t[CMP_ROW] / Lq;
    r[4] = cole / Lk;
}

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
    const int P = d->B * d->H;
    const bki_plan pl = bki_plan_problems(P, with_a ? (double)d->Nq * d->Nk : (double)d->Nq * d->dv);
    const size_t lb = cmp_lane_bytes(d, with_a);
    char *base = malloc(lanes_alloc(pl, lb));
    double *pr = malloc(sizeof(double) * 5 * (size_t)P);
    if (!base || !pr) {
        free(base);
        free(pr);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    cmp_ctx x = {d, out, out_ref, attn, attn_ref, with_a, lb, pr};
    run_lanes(pl, P, base, lb, cmp_problem, &x);
    free(base);
    double se = 0, sr = 0, sa = 0, srow = 0, scol = 0;
    int np = 0;
    for (int p = 0; p < P; p++) {
        const int b = p / d->H;
        if (bki_len(d->q_len, b, d->Nq) == 0 || bki_len(d->k_len, b, d->Nk) == 0) continue;
        const double *r = pr + (size_t)p * 5;
        np++;
        se += r[0];
        sr += r[1];
        if (!with_a) continue;
        sa += r[2];
        srow += r[3];
        scol += r[4];
    }
    free(pr);
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
