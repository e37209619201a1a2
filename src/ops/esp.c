/* esp.c -- ESP attention (ESPFormer) on the operator framework (op.h):
 * hard-sort exact doubly-stochastic attention without any n x m matrix, and
 * soft-sort attention streamed one slice at a time; forward and backward.
 * Semantics in include/birkhoff/esp.h, derivations in docs/ALGORITHMS.md
 * section 4.
 *
 * Mechanisms used from elsewhere: the driver (driver.c: checks, plan,
 * workspace, tape, region, errors), argsort and the 1-D OT plan (sort1d.c),
 * SoftSort rows (the per-ISA kernels in lse_engine.c), GEMMs (bki_gemm).
 *
 * On the framework: the slice bank Theta (identity, the caller's rows or the
 * seeded unit directions) is the per-call area (prepare, before each
 * region; read-only in it); the slice gradient dTheta is a per-problem
 * parameter-gradient slab, summed in problem order after the backward
 * region (reduce); a problem's tape block holds its slice weights, slice
 * costs and sort orders.
 *
 * Parallel model (docs/ARCHITECTURE.md): the B*H problems run one per
 * thread, or one at a time by a team of all threads, through the same
 * per-problem code. Inside a problem the work is shared by fixed blocks
 * (functions of the shape only): slices for the sorts (or, for a few long
 * slices, each sort by the whole team), query and key blocks for the
 * hard-sort walks (each output row written by one block, per-block partial
 * sums over slices reduced in block order), row blocks for the SoftSort rows
 * with per-block partial column sums reduced in block order, fixed row
 * blocks for the dot products, and bki_gemm's tiles. The members claim the
 * blocks of a loop at run time (bki_claims, TEAM_ROWS), each block computed
 * whole by whoever takes it. So results are bitwise the same for any thread
 * count and any batch shape. */
#include "op.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* parameters                                                                */
/* ------------------------------------------------------------------------ */
bk_esp_config bk_esp_config_default(void)
{
    bk_esp_config p = {BK_ESP_HARD, 1e-3f, 1.0f, 0.0f, BK_ESP_COST_SQ, BK_ESP_SCALE_ROWS, 0, NULL, 0};
    return p;
}

int bk_esp_num_slices(const bk_esp_config *p, int d)
{
    if (!p || d < 1 || p->L < 0) return 0;
    return p->L == 0 ? d : p->L;
}

float bk_esp_anneal(float t0, float factor, int epoch)
{
    return t0 * powf(factor, (float)(epoch > 0 ? epoch : 0));
}

/* identity, the caller's, or random unit directions from the seed (sort1d.c) */
static void fill_slices(const bk_esp_config *p, int d, int L, float *theta)
{
    if (p->L == 0) {
        memset(theta, 0, sizeof(float) * (size_t)L * d);
        for (int l = 0; l < L; l++) theta[(size_t)l * d + l] = 1.0f;
    } else if (p->theta) {
        memcpy(theta, p->theta, sizeof(float) * (size_t)L * d);
    } else {
        bki_unit_directions(p->seed, L, d, theta);
    }
}

/* the scalar parameters, and theta's values when scan_theta (d = head dim) */
static bk_status check_params(const bk_esp_config *p, int d, int scan_theta)
{
    if (!p) return bki_fail(BK_ERR_NULL, "ESP parameters are NULL");
    if (p->sort != BK_ESP_HARD && p->sort != BK_ESP_SOFT) return bki_fail(BK_ERR_PARAM, "unknown ESP sort mode %d", (int)p->sort);
    if (p->cost != BK_ESP_COST_SQ && p->cost != BK_ESP_COST_EUCLID) return bki_fail(BK_ERR_PARAM, "unknown ESP cost %d", (int)p->cost);
    if (p->out_scale != BK_ESP_SCALE_ROWS && p->out_scale != BK_ESP_SCALE_PAPER)
        return bki_fail(BK_ERR_PARAM, "unknown ESP output scale %d", (int)p->out_scale);
    if (!isfinite(p->tau) || p->tau < 0.0f) return bki_fail(BK_ERR_PARAM, "tau must be finite and >= 0, got %g", (double)p->tau);
    if (p->sort == BK_ESP_SOFT && (!(p->t > 0.0f) || !isfinite(p->t) || !isfinite(1.0f / p->t)))
        return bki_fail(BK_ERR_PARAM, "SoftSort temperature t must be finite and > 0 (and 1/t finite), got %g", (double)p->t);
    if (!isfinite(p->scale)) return bki_fail(BK_ERR_PARAM, "scale must be finite, got %g", (double)p->scale);
    if (p->L < 0 || p->L > 65536) return bki_fail(BK_ERR_PARAM, "number of slices L must be in [0, 65536], got %d", p->L);
    if (p->L == 0 && p->theta) return bki_fail(BK_ERR_PARAM, "theta given but L = 0 (axis-aligned); set L to its rows");
    if (p->theta && scan_theta)
        for (size_t i = 0; i < (size_t)p->L * d; i++)
            if (!isfinite(p->theta[i])) return bki_fail(BK_ERR_NONFINITE, "theta has a non-finite value at %zu", i);
    return BK_OK;
}

bk_status bk_esp_slices(const bk_esp_config *p, int d, float *theta)
{
    if (!theta) return bki_fail(BK_ERR_NULL, "theta output is NULL");
    if (d < 1) return bki_fail(BK_ERR_SHAPE, "d must be >= 1");
    bk_status s = check_params(p, d, 1);
    if (s) return s;
    fill_slices(p, d, bk_esp_num_slices(p, d), theta);
    return BK_OK;
}

/* resolved configuration */
typedef struct {
    int L, d, dv, soft, euclid, paper;
    float s, inv_t, tau;
    const float *theta;
} esp_cfg;

static const bk_esp_config *par_of(const bki_call *c) { return c->par; }

/* the call's configuration (theta: the per-call area, once prepared) */
static esp_cfg cfg_of(const bki_call *c)
{
    const bk_esp_config *p = par_of(c);
    const bk_attn_desc *d = c->d;
    esp_cfg k;
    k.L = bk_esp_num_slices(p, d->d);
    k.d = d->d;
    k.dv = d->dv;
    k.soft = p->sort == BK_ESP_SOFT;
    k.euclid = p->cost == BK_ESP_COST_EUCLID;
    k.paper = p->out_scale == BK_ESP_SCALE_PAPER;
    k.s = bki_scale(p->scale, d->d);
    k.inv_t = k.soft ? 1.0f / p->t : 0.0f;
    k.tau = p->tau;
    k.theta = c->prep;
    return k;
}

/* ------------------------------------------------------------------------ */
/* lanes: the scratch of one problem in flight                               */
/* ------------------------------------------------------------------------ */
/* Rows per block of a problem's row passes and walks over n rows: at most
 * BKI_MAX_BLOCKS blocks of at least 16 rows (a function of n only; fewer,
 * larger blocks keep the reductions of per-block partial sums cheap). */
static inline int rblk(int n)
{
    const int rb = bki_row_block(n);
    return rb < 16 ? 16 : rb;
}
static inline int nblk(int n) { return bki_nblocks(n, rblk(n)); }
static inline int imin(int a, int b) { return a < b ? a : b; }

/* A team's loop over the fixed blocks of TEAM_RB rows of [0, n), claimed at
 * run time (bki_claims: each member its static share first, then the blocks
 * others have not started): the body runs for the rows [r0, r1) of each
 * block the member takes. For loops whose rows are independent (each row
 * written by its block only), so which member takes a block changes no bit.
 * Every member of the team runs it (no sync at the end). */
#define TEAM_RB 64
#define TEAM_ROWS(tm, n, r0, r1) BKI_RANGES(tm, n, TEAM_RB, r0, r1)

/* Whether a team of nt sorts each slice together: when the 2L sorts cannot
 * occupy it and they are long (up to 8192 keys the team sort is member 0's) */
static inline int team_sorts(int nt, int L, int n, int m) { return nt > 1 && 2 * L < nt && (n > 8192 || m > 8192); }

/* a member's sort scratch: bki_argsort's, then (bki_lanes_fit: up to
 * BKI_LANES_SORT_MAX keys a side, the slices sorted BKI_LANES at a time, one
 * in each vector lane, by a sorting network with bki_argsort's stable order,
 * as ASAP's sliced features are) bki_lanes' */
static size_t sort_bytes(int n, int m)
{
    return bki_round_up(bki_argsort_scratch(n > m ? n : m)) + (bki_lanes_fit(n, m) ? bki_lanes_bytes(n, m) : 0);
}

/* One lane: the scratch of one problem in flight (run by one thread or by a
 * team of `members`: each member has its own sort scratch). */
typedef struct {
    float *Qt, *Kt, *qn, *kn, *Ap, *Bp, *sa, *sb;
    char *sortscr;        /* members x sortbytes                                 */
    size_t sortbytes;
    void *sortcnt;        /* a team's digit counts (bki_argsort_team)            */
    int32_t *pr, *ps;     /* the 1-D plan's pairs (n + m - 1 at most)            */
    double *pc;
    int32_t *rowptr, *colptr; /* pairs of each query rank (n + 1), key rank (m + 1) */
    float *Dl, *sig, *dsig;
    double *Dc;           /* hard backward: per-slice cost gradient coefficient */
    double *dpart;        /* dot-product partials: 3 x BKI_MAX_BLOCKS            */
    /* hard */
    int32_t *inv;         /* L x n: each query's rank, or its partner key (n == m) */
    int32_t *invk;        /* L x m: each key's rank, or its partner query (n == m) */
    double *part;         /* per-block partial sums over slices: blocks x L      */
    float *Gt;            /* the rows gathered by partner, copied contiguous into
                             the workspace (V forward, dO backward): max(n, m) x dv */
    /* soft */
    float *P, *dP, *R, *dR, *X, *WTPQ, *Y, *WTZ, *WX, *PQ, *dQt, *WY, *Z, *Ol, *Oacc, *dKt;
    float *csP, *csR, *rs, *cs, *Da, *Db;
    float *partP, *partR; /* per-row-block partial column sums (blocks x n, x m) */
    float *E, *M, *U, *dU, *dA, *dE;
} esp_slab;

/* Carves a lane for problems up to Nq x Nk from base (NULL: only measures it
 * into *used). */
static esp_slab carve(const bki_call *c, int members, char *base, size_t *used)
{
    const bk_esp_config *p = par_of(c);
    const int n = c->d->Nq, m = c->d->Nk, d = c->d->d, dv = c->d->dv, L = bk_esp_num_slices(p, d);
    const int soft = p->sort == BK_ESP_SOFT, euclid = p->cost == BK_ESP_COST_EUCLID;
    bki_arena ar = {base, 0, (size_t)-1};
    esp_slab w;
    memset(&w, 0, sizeof w);
#define TAKEB(ptr, bytes) ((ptr) = bki_carve(&ar, (bytes)))
#define TAKE(ptr, cnt) TAKEB(ptr, (size_t)(cnt) * sizeof(float))
    const size_t nn = (size_t)(n > m ? n : m);
    TAKE(w.Qt, (size_t)n * d); TAKE(w.Kt, (size_t)m * d); TAKE(w.qn, n); TAKE(w.kn, m);
    TAKE(w.Ap, (size_t)L * n); TAKE(w.Bp, (size_t)L * m); TAKE(w.sa, n); TAKE(w.sb, m);
    w.sortbytes = bki_round_up(sort_bytes(n, m));
    TAKEB(w.sortscr, w.sortbytes * (size_t)members);
    if (team_sorts(members, L, n, m)) TAKEB(w.sortcnt, bki_argsort_team_counts((int)nn));
    TAKEB(w.pr, sizeof(int32_t) * (size_t)(n + m));
    TAKEB(w.ps, sizeof(int32_t) * (size_t)(n + m));
    TAKEB(w.pc, sizeof(double) * (size_t)(n + m));
    TAKEB(w.rowptr, sizeof(int32_t) * (size_t)(n + 1));
    TAKEB(w.colptr, sizeof(int32_t) * (size_t)(m + 1));
    TAKE(w.Dl, L); TAKE(w.sig, L); TAKE(w.dsig, L);
    TAKEB(w.Dc, sizeof(double) * (size_t)L);
    TAKEB(w.dpart, sizeof(double) * 3 * BKI_MAX_BLOCKS);
    if (!soft) {
        const int nb = nblk(n) > nblk(m) ? nblk(n) : nblk(m);
        TAKEB(w.inv, sizeof(int32_t) * (size_t)L * n);
        TAKEB(w.invk, sizeof(int32_t) * (size_t)L * m);
        TAKEB(w.part, sizeof(double) * (size_t)nb * L);
        TAKE(w.Gt, nn * dv);
    } else {
        TAKE(w.P, (size_t)n * n); TAKE(w.dP, (size_t)n * n); TAKE(w.R, (size_t)m * m); TAKE(w.dR, (size_t)m * m);
        TAKE(w.X, (size_t)m * d); TAKE(w.WTPQ, (size_t)m * d); TAKE(w.Y, (size_t)m * dv); TAKE(w.WTZ, (size_t)m * dv);
        TAKE(w.WX, (size_t)n * d); TAKE(w.PQ, (size_t)n * d); TAKE(w.dQt, (size_t)n * d);
        TAKE(w.WY, (size_t)n * dv); TAKE(w.Z, (size_t)n * dv); TAKE(w.Ol, (size_t)n * dv); TAKE(w.Oacc, (size_t)n * dv);
        TAKE(w.dKt, (size_t)m * d);
        TAKE(w.csP, n); TAKE(w.rs, n); TAKE(w.csR, m); TAKE(w.cs, m);
        TAKE(w.Da, (size_t)L * n); TAKE(w.Db, (size_t)L * m);
        TAKE(w.partP, (size_t)nblk(n) * n); TAKE(w.partR, (size_t)nblk(m) * m);
        if (euclid) {
            TAKE(w.E, (size_t)n * m); TAKE(w.M, (size_t)n * m); TAKE(w.U, (size_t)n * m);
            TAKE(w.dU, (size_t)n * m); TAKE(w.dA, (size_t)n * m); TAKE(w.dE, (size_t)n * m);
        }
    }
#undef TAKE
#undef TAKEB
    if (used) *used = ar.used;
    return w;
}

static size_t lane_bytes(const bki_call *c, int members)
{
    size_t used;
    (void)carve(c, members, NULL, &used);
    return used + BK_ALIGN;
}

/* The work of one problem between two of its team's barriers, in the units
 * of bki_plan_problems (about the entries of an attention matrix): hard sort
 * walks L (n + m) pairs of d + dv floats in a handful of phases; soft sort
 * makes O((n^2 + m^2)(d + dv)) per slice in about a dozen phases (the
 * Euclidean cost adds the n x m x n product U = P^T W R). */
static double problem_cost(const bk_attn_desc *d, const bk_esp_config *p)
{
    const double n = d->Nq, m = d->Nk, w = (double)d->d + d->dv + 16;
    if (p->sort != BK_ESP_SOFT) return (double)bk_esp_num_slices(p, d->d) * (n + m) * w / 4;
    double c = (n * n + m * m) * w / 8;
    if (p->cost == BK_ESP_COST_EUCLID) c += n * m * n / 4;
    return c;
}

static double cost(const bki_call *c) { return problem_cost(c->d, par_of(c)); }

bki_plan bki_esp_plan(const bk_attn_desc *d, const bk_esp_config *p)
{
    return bki_plan_problems(d->B * d->H, problem_cost(d, p));
}

/* ------------------------------------------------------------------------ */
/* the operator's checks, tape and per-call pieces                           */
/* ------------------------------------------------------------------------ */
static bk_status check(const bki_call *c)
{
    /* theta's values are scanned by a call, not by a size query */
    return check_params(par_of(c), c->d ? c->d->d : 0, c->d && c->d->d >= 1 && !c->ws_mode);
}

/* A problem's tape block: float sigma[L], D[L]; int32 alpha[L x Nq],
 * beta[L x Nk] (the sort orders, stored with the valid lengths as strides). */
static size_t block_bytes(const bki_call *c)
{
    const size_t L = (size_t)bk_esp_num_slices(par_of(c), c->d->d);
    return sizeof(float) * 2 * L + sizeof(int32_t) * L * ((size_t)c->d->Nq + c->d->Nk);
}

static uint32_t key(const bki_call *c)
{
    const bk_esp_config *p = par_of(c);
    const esp_cfg k = cfg_of(c);
    const float t = k.soft ? p->t : 0.0f;
    const int32_t e[4] = {k.L, (int32_t)p->sort, (int32_t)p->cost, (int32_t)p->out_scale};
    uint64_t h = bki_fnv1a(BKI_FNV_OFFSET, &c->op->id, sizeof c->op->id);
    h = bki_fnv1a(h, e, sizeof e);
    h = bki_fnv1a(h, &k.tau, sizeof k.tau);
    h = bki_fnv1a(h, &t, sizeof t);
    h = bki_fnv1a(h, &k.s, sizeof k.s);
    return (uint32_t)(h ^ (h >> 32));
}

/* the orders of a block must index valid rows (steps are unused: zero) */
static int steps_ok(const bki_call *c, const bki_block_header *h)
{
    const int L = bk_esp_num_slices(par_of(c), c->d->d), n = h->Lq, m = h->Lk;
    for (int i = 0; i < 4; i++)
        if (h->steps[i] != 0) return 0;
    if (n == 0 || m == 0) return 1;
    const int32_t *al = (const int32_t *)((const float *)(h + 1) + 2 * (size_t)L), *be = al + (size_t)L * c->d->Nq;
    for (size_t r = 0; r < (size_t)L * n; r++)
        if (al[r] < 0 || al[r] >= n) return 0;
    for (size_t r = 0; r < (size_t)L * m; r++)
        if (be[r] < 0 || be[r] >= m) return 0;
    return 1;
}

/* the per-call area: the slice bank Theta (L x d) */
static size_t prep_bytes(const bki_call *c)
{
    return sizeof(float) * (size_t)bk_esp_num_slices(par_of(c), c->d->d) * c->d->d;
}

static bk_status prep_slices(bki_call *c)
{
    const bk_esp_config *p = par_of(c);
    fill_slices(p, c->d->d, bk_esp_num_slices(p, c->d->d), c->prep);
    return BK_OK;
}

/* a problem's slice gradient (soft sort; hard sort gives none) */
static size_t pgrad_bytes(const bki_call *c)
{
    const bk_esp_config *p = par_of(c);
    return p->sort == BK_ESP_SOFT ? sizeof(float) * (size_t)bk_esp_num_slices(p, c->d->d) * c->d->d : 0;
}

static float *pgrad_of(const bki_call *c, int pi)
{
    return (float *)(c->pgrad + (size_t)pi * bki_round_up(pgrad_bytes(c)));
}

/* dTheta = the problems' slabs summed in problem order (independent of the
 * thread count); zero under hard sort */
static void reduce(bki_call *c)
{
    float *dtheta = c->pg;
    if (!dtheta) return;
    const esp_cfg k = cfg_of(c);
    const size_t n = (size_t)k.L * k.d;
    const int P = c->d->B * c->d->H;
    memset(dtheta, 0, sizeof(float) * n);
    if (!k.soft) return;
    for (int pi = 0; pi < P; pi++) {
        const float *s = pgrad_of(c, pi);
        for (size_t i = 0; i < n; i++) dtheta[i] += s[i];
    }
}

/* dtheta [L, d] for the driver's check of the results */
static int pg_arrays(const bki_call *c, bki_farray out[2])
{
    const esp_cfg k = cfg_of(c);
    out[0] = (bki_farray){"dtheta", c->pg, (size_t)k.L * k.d};
    return 1;
}

/* ------------------------------------------------------------------------ */
/* shared per-problem pieces (every member of a team calls them)             */
/* ------------------------------------------------------------------------ */
/* row r of out (d, contiguous) = s * X_r; returns |out_r|^2 */
static float scaled_row(int d, float s, const float *x, float *out)
{
    float acc = 0.0f;
    for (int k = 0; k < d; k++) {
        float v = s * x[k];
        out[k] = v;
        acc += v * v;
    }
    return acc;
}

/* scaled contiguous copies Qt, Kt of Q and K, their squared norms, and, with
 * slices, the projections Ap = Theta Qt^T (L x n), Bp = Theta Kt^T (L x m)
 * (a hard-sort backward takes its orders from the tape and needs none). Ends
 * synced. */
static void project(const bki_team *tm, const esp_cfg *c, int n, int m, const float *Q, int64_t ldq,
                    const float *K, int64_t ldk, esp_slab *w, int slices)
{
    const int d = c->d;
    TEAM_ROWS(tm, n + m, lo, hi)
    for (int r = lo; r < hi; r++) {
        if (r < n) w->qn[r] = scaled_row(d, c->s, Q + (int64_t)r * ldq, w->Qt + (size_t)r * d);
        else w->kn[r - n] = scaled_row(d, c->s, K + (int64_t)(r - n) * ldk, w->Kt + (size_t)(r - n) * d);
    }
    bki_team_sync(tm);
    if (!slices) return;
    bki_gemm(tm, 0, 1, c->L, n, d, 1.0f, c->theta, d, w->Qt, d, 0.0f, w->Ap, n);
    bki_gemm(tm, 0, 1, c->L, m, d, 1.0f, c->theta, d, w->Kt, d, 0.0f, w->Bp, m);
    bki_team_sync(tm);
}

/* Both sort orders of every slice: 2L sorts shared over the team or, when
 * they are fewer than its members and long, each sorted by the whole team
 * (sort1d.c); the stable argsort is unique, whoever computes it. No sync. */
static void sort_slices(const bki_team *tm, const esp_cfg *c, int n, int m, const esp_slab *w, int32_t *alpha,
                        int32_t *beta)
{
    if (team_sorts(tm->nt, c->L, n, m)) {
        for (int l = 0; l < c->L; l++) {
            bki_argsort_team(tm, n, w->Ap + (size_t)l * n, 1, alpha + (size_t)l * n, w->sortscr, w->sortcnt);
            bki_argsort_team(tm, m, w->Bp + (size_t)l * m, 1, beta + (size_t)l * m, w->sortscr, w->sortcnt);
        }
        return;
    }
    char *scr = w->sortscr + (size_t)tm->tid * w->sortbytes;
    if (bki_lanes_fit(n, m)) { /* groups of BKI_LANES slices, each side one unit */
        bki_lanes z; /* the member's networks, built at its first unit (a function of n, m) */
        int ready = 0;
        memset(&z, 0, sizeof z);
        bki_claims cl = bki_claims_open(tm, 2 * ((c->L + BKI_LANES - 1) / BKI_LANES));
        for (int64_t tt; bki_claims_next(&cl, &tt);) {
            if (!ready) z = bki_lanes_init(scr + bki_round_up(bki_argsort_scratch(n > m ? n : m)), n, m), ready = 1;
            const int t = (int)tt, side = t % 2, l0 = (t / 2) * BKI_LANES, nl = c->L - l0 < BKI_LANES ? c->L - l0 : BKI_LANES;
            const int len = side ? m : n;
            int32_t *dst = (side ? beta : alpha) + (size_t)l0 * len;
            bki_lanes_load(len, nl, (side ? w->Bp : w->Ap) + (size_t)l0 * len, 1, (size_t)len, z.ka, z.ix);
            bki_kern()->lanes_sort(side ? z.cmp_m : z.cmp_n, side ? z.net_m : z.net_n, z.ka, z.ix);
            for (int l = 0; l < nl; l++)
                for (int r = 0; r < len; r++) dst[(size_t)l * len + r] = z.ix[(size_t)r * BKI_LANES + l];
        }
        return;
    }
    bki_claims cl = bki_claims_open(tm, 2 * c->L);
    for (int64_t t; bki_claims_next(&cl, &t);) {
        const int l = (int)(t / 2);
        if (t % 2 == 0) bki_argsort(n, w->Ap + (size_t)l * n, 1, alpha + (size_t)l * n, scr);
        else bki_argsort(m, w->Bp + (size_t)l * m, 1, beta + (size_t)l * m, scr);
    }
}

/* The 1-D plan's pairs and their grouping by query rank (rowptr) and key
 * rank (colptr: the walk is monotone in both). By member 0; no sync. */
static void plan_pairs(const bki_team *tm, int n, int m, esp_slab *w)
{
    if (tm->tid != 0) return;
    const int np = bki_nw_pairs(n, m, w->pr, w->ps, w->pc);
    for (int r = 0, k = 0; r <= n; r++) {
        while (k < np && w->pr[k] < r) k++;
        w->rowptr[r] = k;
    }
    for (int s = 0, k = 0; s <= m; s++) {
        while (k < np && w->ps[k] < s) k++;
        w->colptr[s] = k;
    }
}

static inline float sqdist(int d, const float *q, const float *k)
{
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int x = 0; x < d; x++) {
        float e = q[x] - k[x];
        acc += e * e;
    }
    return acc;
}

static inline float pair_cost(const esp_cfg *c, const float *q, const float *k)
{
    float acc = sqdist(c->d, q, k);
    return c->euclid ? sqrtf(acc) : acc;
}

/* returns <g, v> and adds w g to dv */
static inline float dot_axpy(int n, const float *g, const float *v, float *dv, float w)
{
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int x = 0; x < n; x++) {
        dot += g[x] * v[x];
        dv[x] += w * g[x];
    }
    return dot;
}

/* sigma = softmax(-tau (D - min D)) */
static void slice_weights(int L, float tau, const float *D, float *sig)
{
    float mn = D[0];
    for (int l = 1; l < L; l++) mn = D[l] < mn ? D[l] : mn;
    double z = 0.0;
    for (int l = 0; l < L; l++) {
        sig[l] = expf(-tau * (D[l] - mn));
        z += sig[l];
    }
    for (int l = 0; l < L; l++) sig[l] = (float)(sig[l] / z);
}

/* Rows [r0, r1) of out = W X (output rows are query ranks: the pairs of
 * rowptr) or, with transpose, of W^T X (key ranks: colptr); W = cells *
 * scale. Each row sums its pairs in walk order. */
static void plan_rows(int transpose, const esp_slab *w, float scale, const float *X, int ldx, float *out, int ldo,
                      int cols, int r0, int r1)
{
    const int32_t *ptr = transpose ? w->colptr : w->rowptr, *src = transpose ? w->pr : w->ps;
    for (int r = r0; r < r1; r++) {
        float *o = out + (size_t)r * ldo;
        memset(o, 0, sizeof(float) * (size_t)cols);
        for (int k = ptr[r]; k < ptr[r + 1]; k++) {
            const float wt = (float)(w->pc[k] * scale);
            const float *x = X + (size_t)src[k] * ldx;
            for (int j = 0; j < cols; j++) o[j] += wt * x[j];
        }
    }
}

/* out = W X (nrows = n) or W^T X (nrows = m), rows shared over the team. No sync. */
static void plan_apply(const bki_team *tm, int transpose, const esp_slab *w, float scale, const float *X, int ldx,
                       float *out, int ldo, int cols, int nrows)
{
    TEAM_ROWS(tm, nrows, lo, hi) plan_rows(transpose, w, scale, X, ldx, out, ldo, cols, lo, hi);
}

static float dotf(size_t n, const float *a, const float *b)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* the sum of nb partials in block order */
static double sum_parts(int nb, const double *part)
{
    double s = 0.0;
    for (int t = 0; t < nb; t++) s += part[t];
    return s;
}

/* part[t] = <a, b> over the rows of fixed row block t of an n-row, `cols`-wide
 * pair of contiguous matrices, blocks shared over the team. No sync. */
static void dot_blocks(const bki_team *tm, int n, int cols, const float *a, const float *b, double *part)
{
    const int rb = rblk(n), nb = nblk(n);
    bki_claims cl = bki_claims_open(tm, nb);
    for (int64_t t; bki_claims_next(&cl, &t);) {
        const int r0 = (int)t * rb, r1 = imin(n, r0 + rb);
        part[t] = dotf((size_t)(r1 - r0) * cols, a + (size_t)r0 * cols, b + (size_t)r0 * cols);
    }
}

/* ------------------------------------------------------------------------ */
/* hard sort                                                                  */
/* ------------------------------------------------------------------------ */
/* Hard-sort layout shared by forward and backward: the 1-D plan's pairs
 * grouped by query rank (rowptr) and key rank (colptr), and for every slice
 * each query's rank, or directly its partner key when n == m (inv, L x n);
 * with keys, each key's rank or partner query (invk, L x m). Work runs over
 * fixed blocks of queries (or keys) in memory order and, inside a block, in
 * runs of HB rows over the slices, so the walked side's rows stay in L1
 * across slices and only the partners' rows are gathered.
 * A forward without a tape keeps its orders in the lane: alpha in inv itself
 * (each slice's inv is built in the member's sort scratch, free after the
 * sorts, then copied over its alpha) and beta in invk (no keys). Ends synced. */
#define HB 16
static void hard_layout(const bki_team *tm, const esp_cfg *c, int n, int m, const int32_t *alpha,
                        const int32_t *beta, int keys, esp_slab *w)
{
    const int L = c->L, in_place = alpha == w->inv;
    plan_pairs(tm, n, m, w);
    bki_claims cl = bki_claims_open(tm, L);
    for (int64_t l; bki_claims_next(&cl, &l);) {
        const int32_t *al = alpha + (size_t)l * n, *be = beta + (size_t)l * m;
        int32_t *pt = in_place ? (int32_t *)(void *)(w->sortscr + (size_t)tm->tid * w->sortbytes) : w->inv + (size_t)l * n;
        int32_t *pk = w->invk + (size_t)l * m;
        if (n == m) {
            for (int r = 0; r < n; r++) pt[al[r]] = be[r]; /* partner key */
            if (keys)
                for (int r = 0; r < n; r++) pk[be[r]] = al[r]; /* partner query */
        } else {
            for (int r = 0; r < n; r++) pt[al[r]] = r;     /* rank */
            if (keys)
                for (int s = 0; s < m; s++) pk[be[s]] = s;
        }
        if (in_place) memcpy(w->inv + (size_t)l * n, pt, sizeof(int32_t) * (size_t)n);
    }
    bki_team_sync(tm);
}

/* G (rows x dv, contiguous) = the rows of X (row stride ldx), shared over
 * the team, then a sync. The gather passes read partner rows at random, L
 * times each: from the workspace (which the library allocates on huge pages,
 * bk_alloc) and contiguous, instead of the caller's tensor (any stride, any
 * pages); at N = 65536 this took a quarter off ESP hard (docs/PERFORMANCE.md). */
static void gather_copy(const bki_team *tm, int rows, int dv, const float *X, int64_t ldx, float *G)
{
    TEAM_ROWS(tm, rows, lo, hi)
    for (int r = lo; r < hi; r++) memcpy(G + (size_t)r * dv, X + (int64_t)r * ldx, sizeof(float) * (size_t)dv);
    bki_team_sync(tm);
}

/* Prefetches the row of the partner of row i a few places ahead in the same
 * slice (n == m: rows are gathered at random, so the hardware prefetcher
 * cannot guess them). part: L x cnt partners. */
#define BK_PF_DIST 4
static inline void hard_prefetch(const int32_t *part, int i, int l, int cnt, const float *base, int64_t ld)
{
    size_t next = (size_t)l * cnt + i + BK_PF_DIST;
    if (i + BK_PF_DIST < cnt) {
        const float *row = base + (int64_t)part[next] * ld;
        __builtin_prefetch(row);
        __builtin_prefetch(row + 16);
        __builtin_prefetch(row + 32);
        __builtin_prefetch(row + 48);
    }
}

/* Walks the pairs of query i in slice l: runs the body (the variadic
 * arguments) with j (key) and cells in scope. */
#define HARD_PAIRS(i, l, ...)                                                                                   \
    do {                                                                                                        \
        if (n == m) {                                                                                           \
            const int j = w->inv[(size_t)(l) * n + (i)];                                                        \
            const double cells = (double)n;                                                                     \
            __VA_ARGS__;                                                                                        \
        } else {                                                                                                \
            const int r_ = w->inv[(size_t)(l) * n + (i)];                                                       \
            const int32_t *be_ = beta + (size_t)(l) * m;                                                        \
            for (int k_ = w->rowptr[r_]; k_ < w->rowptr[r_ + 1]; k_++) {                                        \
                const int j = be_[w->ps[k_]];                                                                   \
                const double cells = w->pc[k_];                                                                 \
                __VA_ARGS__;                                                                                    \
            }                                                                                                   \
        }                                                                                                       \
    } while (0)

/* Walks the pairs of key j in slice l: the body sees i (query) and cells. */
#define HARD_KEY_PAIRS(j, l, ...)                                                                               \
    do {                                                                                                        \
        if (n == m) {                                                                                           \
            const int i = w->invk[(size_t)(l) * m + (j)];                                                       \
            const double cells = (double)n;                                                                     \
            __VA_ARGS__;                                                                                        \
        } else {                                                                                                \
            const int s_ = w->invk[(size_t)(l) * m + (j)];                                                      \
            const int32_t *al_ = alpha + (size_t)(l) * n;                                                       \
            for (int k_ = w->colptr[s_]; k_ < w->colptr[s_ + 1]; k_++) {                                        \
                const int i = al_[w->pr[k_]];                                                                   \
                const double cells = w->pc[k_];                                                                 \
                __VA_ARGS__;                                                                                    \
            }                                                                                                   \
        }                                                                                                       \
    } while (0)

/* Fills the orders alpha, beta (the tape's), the slice costs Dl and weights
 * sig (member 0) and, when O is given, O (and attn_b's rows, zeroed by the
 * caller). Ends synced, except after the O rows. */
static void hard_forward(const bki_team *tm, const esp_cfg *c, int n, int m, const float *V, int64_t ldv, float *O,
                         int64_t ldo, int32_t *alpha, int32_t *beta, esp_slab *w, const bk_tensor *attn_b,
                         bk_esp_diag *dg)
{
    const int L = c->L, dv = c->dv, d = c->d, rb = rblk(n), nb = nblk(n);
    sort_slices(tm, c, n, m, w, alpha, beta);
    bki_team_sync(tm);
    hard_layout(tm, c, n, m, alpha, beta, 0, w);
    const double inv_nm = 1.0 / ((double)n * m);
    /* D_l = sum over pairs (mass cells/(nm)) of c(q_i, k_j): per query block
     * partials (queries in order), summed in block order */
    bki_claims cl = bki_claims_open(tm, nb);
    for (int64_t tt; bki_claims_next(&cl, &tt);) {
        const int t = (int)tt;
        double *Dp = w->part + (size_t)t * L;
        for (int l = 0; l < L; l++) Dp[l] = 0.0;
        const int r1 = imin(n, (t + 1) * rb);
        for (int i0 = t * rb; i0 < r1; i0 += HB)
            for (int l = 0; l < L; l++)
                for (int i = i0; i < r1 && i < i0 + HB; i++) {
                    const float *q = w->Qt + (size_t)i * d;
                    if (n == m) hard_prefetch(w->inv, i, l, n, w->Kt, d);
                    HARD_PAIRS(i, l, Dp[l] += cells * pair_cost(c, q, w->Kt + (size_t)j * d));
                }
    }
    bki_team_sync(tm);
    if (tm->tid == 0) {
        for (int l = 0; l < L; l++) {
            double s = 0.0;
            for (int t = 0; t < nb; t++) s += w->part[(size_t)t * L + l];
            w->Dl[l] = (float)(s * inv_nm);
        }
        slice_weights(L, c->tau, w->Dl, w->sig);
        if (dg) { /* the plan is exactly doubly stochastic: report the rounding of the weights */
            double tot = 0.0;
            for (int l = 0; l < L; l++) tot += w->sig[l];
            dg->row_err = dg->col_err = (float)fabs(tot - 1.0);
        }
    }
    bki_team_sync(tm);
    if (!O) return; /* a backward's recomputation needs only orders and weights */
    gather_copy(tm, m, dv, V, ldv, w->Gt);
    /* O_i = sum_l sigma_l sum_{pairs at i} (c * mass) V_j; rows scale: c * mass = cells / m */
    const double cw = c->paper ? inv_nm : 1.0 / m;
    cl = bki_claims_open(tm, nb);
    for (int64_t tt; bki_claims_next(&cl, &tt);) {
        const int t = (int)tt, r1 = imin(n, (t + 1) * rb);
        for (int i = t * rb; i < r1; i++) memset(O + (int64_t)i * ldo, 0, sizeof(float) * (size_t)dv);
        for (int i0 = t * rb; i0 < r1; i0 += HB)
            for (int l = 0; l < L; l++)
                for (int i = i0; i < r1 && i < i0 + HB; i++) {
                    float *oi = O + (int64_t)i * ldo;
                    if (n == m) hard_prefetch(w->inv, i, l, n, w->Gt, dv);
                    HARD_PAIRS(i, l, {
                        const float wt = (float)(w->sig[l] * cells * cw);
                        const float *vj = w->Gt + (size_t)j * dv;
                        for (int x = 0; x < dv; x++) oi[x] += wt * vj[x];
                        if (attn_b) attn_b->data[(int64_t)i * attn_b->stride_n + j] += wt;
                    });
                }
    }
}

/* dV and dsigma over key blocks (each key gathers its partner queries' dO),
 * then dQ over query blocks and dK over key blocks (the cost's gradient,
 * walked from both sides so every output row has one writer). */
/* the weight of the pair (q, k) in the hard-sort cost gradient, from its
 * slice factor g: d/dq of |q - k|^2 is 2 (q - k); of |q - k|, (q - k) / |q - k|,
 * nothing at a zero distance (returns 0 then) */
static inline int pair_weight(const esp_cfg *c, int d, const float *q, const float *k, float *g)
{
    if (!c->euclid) {
        *g *= 2.0f;
        return 1;
    }
    const float nrm = sqrtf(sqdist(d, q, k));
    if (nrm == 0.0f) return 0;
    *g /= nrm;
    return 1;
}

static void hard_backward(const bki_team *tm, const esp_cfg *c, int n, int m, const float *V, int64_t ldv,
                          const float *dO, int64_t ldo, const int32_t *alpha, const int32_t *beta, const float *sig,
                          float *dQ, int64_t ldq, float *dK, int64_t ldk, float *dV, int64_t lddv, esp_slab *w)
{
    const int L = c->L, dv = c->dv, d = c->d;
    const int rbq = rblk(n), nbq = nblk(n), rbk = rblk(m), nbk = nblk(m);
    hard_layout(tm, c, n, m, alpha, beta, 1, w);
    gather_copy(tm, n, dv, dO, ldo, w->Gt);
    const double inv_nm = 1.0 / ((double)n * m), cw = c->paper ? inv_nm : 1.0 / m;
    /* dV_j += sigma_l (c mass) dO_i; dsigma_l = sum (c mass) <dO_i, V_j>:
     * per key block partials, summed in block order */
    bki_claims cl = bki_claims_open(tm, nbk);
    for (int64_t tt; bki_claims_next(&cl, &tt);) {
        const int t = (int)tt;
        double *Sp = w->part + (size_t)t * L;
        for (int l = 0; l < L; l++) Sp[l] = 0.0;
        const int j1 = imin(m, (t + 1) * rbk);
        for (int j = t * rbk; j < j1; j++) memset(dV + (int64_t)j * lddv, 0, sizeof(float) * (size_t)dv);
        for (int j0 = t * rbk; j0 < j1; j0 += HB)
            for (int l = 0; l < L; l++)
                for (int j = j0; j < j1 && j < j0 + HB; j++) {
                    const float *vj = V + (int64_t)j * ldv;
                    float *gj = dV + (int64_t)j * lddv;
                    if (n == m) hard_prefetch(w->invk, j, l, m, w->Gt, dv);
                    HARD_KEY_PAIRS(j, l, {
                        const float wt = (float)(cells * cw), ws = wt * sig[l];
                        Sp[l] += (double)wt * dot_axpy(dv, w->Gt + (size_t)i * dv, vj, gj, ws);
                    });
                }
    }
    bki_team_sync(tm);
    if (tm->tid == 0) {
        /* dD_l = -tau sigma_l (dsigma_l - sum sigma dsigma); then the cost's gradient per pair */
        double sd = 0.0;
        for (int l = 0; l < L; l++) {
            double s = 0.0;
            for (int t = 0; t < nbk; t++) s += w->part[(size_t)t * L + l];
            w->dsig[l] = (float)s;
            sd += sig[l] * s;
        }
        for (int l = 0; l < L; l++) w->Dc[l] = -c->tau * sig[l] * (w->dsig[l] - sd) * inv_nm * c->s;
    }
    bki_team_sync(tm);
    cl = bki_claims_open(tm, nbq + nbk);
    for (int64_t tt; bki_claims_next(&cl, &tt);) {
        const int t = (int)tt;
        if (t < nbq) { /* dQ_i += g (q_i - k_j) over the pairs of query i */
            const int i1 = imin(n, (t + 1) * rbq);
            for (int i = t * rbq; i < i1; i++) memset(dQ + (int64_t)i * ldq, 0, sizeof(float) * (size_t)d);
            if (c->tau == 0.0f) continue; /* no gradient reaches Q, K under hard sort */
            for (int i0 = t * rbq; i0 < i1; i0 += HB)
                for (int l = 0; l < L; l++) {
                    if (w->Dc[l] == 0.0) continue;
                    for (int i = i0; i < i1 && i < i0 + HB; i++) {
                        const float *q = w->Qt + (size_t)i * d;
                        float *gq = dQ + (int64_t)i * ldq;
                        if (n == m) hard_prefetch(w->inv, i, l, n, w->Kt, d);
                        HARD_PAIRS(i, l, {
                            const float *kk = w->Kt + (size_t)j * d;
                            float g = (float)(w->Dc[l] * cells);
                            if (pair_weight(c, d, q, kk, &g))
                                for (int x = 0; x < d; x++) gq[x] += g * (q[x] - kk[x]);
                        });
                    }
                }
        } else { /* dK_j -= g (q_i - k_j) over the pairs of key j */
            const int kb = t - nbq, j1 = imin(m, (kb + 1) * rbk);
            for (int j = kb * rbk; j < j1; j++) memset(dK + (int64_t)j * ldk, 0, sizeof(float) * (size_t)d);
            if (c->tau == 0.0f) continue;
            for (int j0 = kb * rbk; j0 < j1; j0 += HB)
                for (int l = 0; l < L; l++) {
                    if (w->Dc[l] == 0.0) continue;
                    for (int j = j0; j < j1 && j < j0 + HB; j++) {
                        const float *kk = w->Kt + (size_t)j * d;
                        float *gk = dK + (int64_t)j * ldk;
                        if (n == m) hard_prefetch(w->invk, j, l, m, w->Qt, d);
                        HARD_KEY_PAIRS(j, l, {
                            const float *q = w->Qt + (size_t)i * d;
                            float g = (float)(w->Dc[l] * cells);
                            if (pair_weight(c, d, q, kk, &g))
                                for (int x = 0; x < d; x++) gk[x] -= g * (q[x] - kk[x]);
                        });
                    }
                }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* soft sort                                                                  */
/* ------------------------------------------------------------------------ */
/* Euclidean cost matrix E (n x m) of the scaled points, rows shared. No sync. */
static void cost_matrix(const bki_team *tm, const esp_cfg *c, int n, int m, const esp_slab *w, float *E)
{
    TEAM_ROWS(tm, n, lo, hi)
    for (int i = lo; i < hi; i++)
        for (int j = 0; j < m; j++) {
            const float *q = w->Qt + (size_t)i * c->d, *k = w->Kt + (size_t)j * c->d;
            float acc = 0.0f;
            for (int x = 0; x < c->d; x++) acc += (q[x] - k[x]) * (q[x] - k[x]);
            E[(size_t)i * m + j] = sqrtf(acc);
        }
}

/* Rows [r0, r1) of one slice's SoftSort matrix Pm (n x n, row r = rank r)
 * and their sorted values sv; part (n) = the block's column sums. */
static void softsort_block(const bki_kernels *K, int n, const float *a, const int32_t *idx, float inv_t, int r0,
                           int r1, float *sv, float *Pm, float *part)
{
    memset(part, 0, sizeof(float) * (size_t)n);
    for (int r = r0; r < r1; r++) {
        float *row = Pm + (size_t)r * n;
        sv[r] = a[idx[r]];
        K->softsort_row(n, a, sv[r], inv_t, row);
        for (int i = 0; i < n; i++) part[i] += row[i];
    }
}

/* columns [c0, c1) of out = the sum of the nb block partials (n wide), in block order */
static void reduce_parts(int nb, int n, const float *part, int c0, int c1, float *out)
{
    for (int i = c0; i < c1; i++) out[i] = part[i];
    for (int t = 1; t < nb; t++) {
        const float *p = part + (size_t)t * n;
        for (int i = c0; i < c1; i++) out[i] += p[i];
    }
}

/* out (n) and outm (m) = the sums of the row blocks' partials, over fixed
 * column blocks shared by the team. No sync. */
static void reduce_both(const bki_team *tm, int n, int m, const float *partn, const float *partm, float *outn,
                        float *outm)
{
    const int nbn = nblk(n), nbm = nblk(m), rbn = rblk(n), rbm = rblk(m);
    bki_claims cl = bki_claims_open(tm, nbn + nbm);
    for (int64_t tt; bki_claims_next(&cl, &tt);) {
        const int t = (int)tt;
        if (t < nbn) reduce_parts(nbn, n, partn, t * rbn, imin(n, (t + 1) * rbn), outn);
        else reduce_parts(nbm, m, partm, (t - nbn) * rbm, imin(m, (t - nbn + 1) * rbm), outm);
    }
}

/* One slice's soft permutations (P: n x n, R: m x m), their column sums csP,
 * csR and sorted values, from the stored orders: row blocks shared, partial
 * column sums per block reduced in block order. Ends synced. */
static void slice_sorts(const bki_team *tm, const bki_kernels *K, const esp_cfg *c, int n, int m, int l,
                        const int32_t *al, const int32_t *be, esp_slab *w)
{
    const int nbn = nblk(n), nbm = nblk(m), rbn = rblk(n), rbm = rblk(m);
    bki_claims cl = bki_claims_open(tm, nbn + nbm);
    for (int64_t tt; bki_claims_next(&cl, &tt);) {
        const int t = (int)tt;
        if (t < nbn)
            softsort_block(K, n, w->Ap + (size_t)l * n, al, c->inv_t, t * rbn, imin(n, (t + 1) * rbn), w->sa, w->P,
                           w->partP + (size_t)t * n);
        else
            softsort_block(K, m, w->Bp + (size_t)l * m, be, c->inv_t, (t - nbn) * rbm, imin(m, (t - nbn + 1) * rbm),
                           w->sb, w->R, w->partR + (size_t)(t - nbn) * m);
    }
    bki_team_sync(tm);
    reduce_both(tm, n, m, w->partP, w->partR, w->csP, w->csR);
    bki_team_sync(tm);
}

/* Fills the orders (the tape's), Dl and sig (member 0), O when given, the
 * diagnostics (member 0) and attn_b (zeroed by the caller). */
static void soft_forward(const bki_team *tm, const bki_kernels *K, const esp_cfg *c, int n, int m, const float *V,
                         int64_t ldv, float *O, int64_t ldo, int32_t *alpha, int32_t *beta, esp_slab *w,
                         const bk_tensor *attn_b, bk_esp_diag *dg)
{
    const int L = c->L, d = c->d, dv = c->dv, nbn = nblk(n), nbm = nblk(m), rbn = rblk(n), rbm = rblk(m);
    const float inv_nm = (float)(1.0 / ((double)n * m)), cs = c->paper ? 1.0f : (float)n;
    double *dp = w->dpart;
    plan_pairs(tm, n, m, w);
    if (c->euclid) cost_matrix(tm, c, n, m, w, w->E);
    sort_slices(tm, c, n, m, w, alpha, beta);
    TEAM_ROWS(tm, n + m, lo, hi)
    for (int r = lo; r < hi; r++) {
        if (r < n) {
            if (O) memset(w->Oacc + (size_t)r * dv, 0, sizeof(float) * (size_t)dv);
            w->rs[r] = 0.0f;
        } else {
            w->cs[r - n] = 0.0f;
        }
    }
    bki_team_sync(tm);
    float mx = -INFINITY; /* every member keeps the same running maximum and sum */
    double z = 0.0;
    for (int l = 0; l < L; l++) {
        int32_t *al = alpha + (size_t)l * n, *be = beta + (size_t)l * m;
        slice_sorts(tm, K, c, n, m, l, al, be, w);
        double D;
        if (!c->euclid) {
            /* D = (1/n) sum_i |q_i|^2 csP_i + (1/m) sum_j |k_j|^2 csR_j - 2 <P Q, W R K> */
            bki_gemm(tm, 0, 0, m, d, m, 1.0f, w->R, m, w->Kt, d, 0.0f, w->X, d);
            if (O) bki_gemm(tm, 0, 0, m, dv, m, 1.0f, w->R, m, V, ldv, 0.0f, w->Y, dv);
            bki_gemm(tm, 0, 0, n, d, n, 1.0f, w->P, n, w->Qt, d, 0.0f, w->PQ, d);
            bki_team_sync(tm);
            /* W X and W Y by fixed row blocks, each block's dot products kept
             * (a static share, not claimed: in a claimed loop GCC vectorizes
             * the inlined dot products differently, 1 ulp off in D) */
            int tlo, thi;
            bki_team_share(tm, nbn + nbm, &tlo, &thi);
            for (int t = tlo; t < thi; t++) {
                if (t < nbn) {
                    const int r0 = t * rbn, r1 = imin(n, r0 + rbn);
                    plan_rows(0, w, inv_nm, w->X, d, w->WX, d, d, r0, r1);
                    if (O) plan_rows(0, w, inv_nm, w->Y, dv, w->WY, dv, dv, r0, r1);
                    dp[t] = dotf((size_t)(r1 - r0), w->qn + r0, w->csP + r0);
                    dp[2 * BKI_MAX_BLOCKS + t] =
                        dotf((size_t)(r1 - r0) * d, w->PQ + (size_t)r0 * d, w->WX + (size_t)r0 * d);
                } else {
                    const int s0 = (t - nbn) * rbm, s1 = imin(m, s0 + rbm);
                    dp[BKI_MAX_BLOCKS + t - nbn] = dotf((size_t)(s1 - s0), w->kn + s0, w->csR + s0);
                }
            }
            bki_team_sync(tm);
            D = sum_parts(nbn, dp) / n + sum_parts(nbm, dp + BKI_MAX_BLOCKS) / m -
                2.0 * sum_parts(nbn, dp + 2 * BKI_MAX_BLOCKS);
            if (O) {
                bki_gemm(tm, 1, 0, n, dv, n, cs, w->P, n, w->WY, dv, 0.0f, w->Ol, dv);
                bki_team_sync(tm);
            }
        } else {
            /* U = P^T (W R) formed densely; D = <E, U>; O_l = cs U V */
            plan_apply(tm, 0, w, inv_nm, w->R, m, w->M, m, m, n);
            bki_team_sync(tm);
            bki_gemm(tm, 1, 0, n, m, n, 1.0f, w->P, n, w->M, m, 0.0f, w->U, m);
            bki_team_sync(tm);
            dot_blocks(tm, n, m, w->E, w->U, dp);
            if (O) bki_gemm(tm, 0, 0, n, dv, m, cs, w->U, m, V, ldv, 0.0f, w->Ol, dv);
            bki_team_sync(tm);
            D = sum_parts(nbn, dp);
        }
        const float Dl = (float)D;
        if (tm->tid == 0) w->Dl[l] = Dl;
        /* online softmax over slices: O = sum_l e^{x_l} O_l / sum_l e^{x_l} */
        const float x = -c->tau * Dl;
        float f = 1.0f;
        if (x > mx) {
            f = mx == -INFINITY ? 0.0f : expf(mx - x);
            z *= f;
            mx = x;
        }
        const float wt = expf(x - mx);
        TEAM_ROWS(tm, n + m, lo, hi) /* each row's own running sums */
        for (int r = lo; r < hi; r++) {
            if (r < n) {
                if (O) {
                    float *oa = w->Oacc + (size_t)r * dv;
                    const float *ol = w->Ol + (size_t)r * dv;
                    if (f != 1.0f)
                        for (int k = 0; k < dv; k++) oa[k] *= f;
                    for (int k = 0; k < dv; k++) oa[k] += wt * ol[k];
                }
                if (f != 1.0f) w->rs[r] *= f;
                w->rs[r] += wt * w->csP[r];
            } else {
                if (f != 1.0f) w->cs[r - n] *= f;
                w->cs[r - n] += wt * w->csR[r - n];
            }
        }
        z += wt;
    }
    bki_team_sync(tm);
    if (tm->tid == 0) slice_weights(L, c->tau, w->Dl, w->sig);
    const float iz = (float)(1.0 / z);
    if (O)
        TEAM_ROWS(tm, n, lo, hi)
        for (int r = lo; r < hi; r++)
            for (int k = 0; k < dv; k++) O[(int64_t)r * ldo + k] = w->Oacc[(size_t)r * dv + k] * iz;
    if (dg && tm->tid == 0) {
        float re = 0.0f, ce = 0.0f;
        for (int i = 0; i < n; i++) re = fmaxf(re, fabsf(w->rs[i] * iz - 1.0f));
        for (int j = 0; j < m; j++) ce = fmaxf(ce, fabsf(w->cs[j] * iz - 1.0f));
        dg->row_err = re;
        dg->col_err = ce;
    }
    if (attn_b) { /* dense A = cs sum_l sigma_l P_l^T W R_l: small problems only; rows shared */
        bki_team_sync(tm); /* sig */
        const int np = w->rowptr[n];
        for (int l = 0; l < L; l++) {
            slice_sorts(tm, K, c, n, m, l, alpha + (size_t)l * n, beta + (size_t)l * m, w);
            TEAM_ROWS(tm, n, i0, i1) /* each row adds its pairs in order */
            for (int k = 0; k < np; k++) {
                const float s = (float)(cs * w->sig[l] * w->pc[k] * inv_nm);
                const float *pcol = w->P + (size_t)w->pr[k] * n, *rrow = w->R + (size_t)w->ps[k] * m;
                for (int i = i0; i < i1; i++) {
                    const float a = s * pcol[i];
                    float *arow = attn_b->data + (int64_t)i * attn_b->stride_n;
                    for (int j = 0; j < m; j++) arow[j] += a * rrow[j];
                }
            }
            bki_team_sync(tm);
        }
    }
}

/* soft_backward's pass 1: w->dsig[l] = dsigma_l = <dO, O_l> for every
 * slice; returns sum_l sigma_l dsigma_l (every member gets it) */
static double soft_dsigma(const bki_team *tm, const bki_kernels *K, const esp_cfg *c, int n, int m, const float *V,
                          int64_t ldv, const float *dO, int64_t lddo, const int32_t *alpha, const int32_t *beta,
                          const float *sig, esp_slab *w)
{
    const int L = c->L, dv = c->dv, nbn = nblk(n), rbn = rblk(n);
    const float inv_nm = (float)(1.0 / ((double)n * m)), cs = c->paper ? 1.0f : (float)n;
    double *dp = w->dpart;
    double sd = 0.0; /* every member's own copy */
    for (int l = 0; l < L; l++) {
        slice_sorts(tm, K, c, n, m, l, alpha + (size_t)l * n, beta + (size_t)l * m, w);
        double ds;
        if (!c->euclid) {
            bki_gemm(tm, 0, 0, m, dv, m, 1.0f, w->R, m, V, ldv, 0.0f, w->Y, dv);
            bki_gemm(tm, 0, 0, n, dv, n, 1.0f, w->P, n, dO, lddo, 0.0f, w->Z, dv);
            bki_team_sync(tm);
            /* W Y by fixed row blocks, each block's <Z, W Y> kept */
            bki_claims cl = bki_claims_open(tm, nbn);
            for (int64_t tt; bki_claims_next(&cl, &tt);) {
                const int t = (int)tt, r0 = t * rbn, r1 = imin(n, r0 + rbn);
                plan_rows(0, w, inv_nm, w->Y, dv, w->WY, dv, dv, r0, r1);
                dp[t] = dotf((size_t)(r1 - r0) * dv, w->Z + (size_t)r0 * dv, w->WY + (size_t)r0 * dv);
            }
        } else {
            plan_apply(tm, 0, w, inv_nm, w->R, m, w->M, m, m, n);
            bki_team_sync(tm);
            bki_gemm(tm, 1, 0, n, m, n, 1.0f, w->P, n, w->M, m, 0.0f, w->U, m);
            bki_team_sync(tm);
            dot_blocks(tm, n, m, w->dA, w->U, dp);
        }
        bki_team_sync(tm);
        ds = (double)cs * sum_parts(nbn, dp);
        if (tm->tid == 0) w->dsig[l] = (float)ds;
        sd += sig[l] * ds;
    }
    return sd;
}

/* SoftSort backward of slice l (soft_backward's pass 2), through the softmax
 * and the sorted values: per row block partials (the value's index gets
 * minus the row's sum), reduced in block order into Da[l], Db[l] */
static void softsort_bwd(const bki_team *tm, const bki_kernels *K, const esp_cfg *c, int n, int m, int l,
                         const int32_t *al, const int32_t *be, esp_slab *w)
{
    const int nbn = nblk(n), nbm = nblk(m), rbn = rblk(n), rbm = rblk(m);
        const float *a = w->Ap + (size_t)l * n, *b = w->Bp + (size_t)l * m;
        bki_claims cl = bki_claims_open(tm, nbn + nbm);
        for (int64_t tt; bki_claims_next(&cl, &tt);) {
            const int t = (int)tt;
            if (t < nbn) {
                float *pa = w->partP + (size_t)t * n;
                memset(pa, 0, sizeof(float) * (size_t)n);
                for (int r = t * rbn; r < imin(n, (t + 1) * rbn); r++)
                    pa[al[r]] -= K->softsort_row_bwd(n, a, w->sa[r], c->inv_t, w->P + (size_t)r * n,
                                                     w->dP + (size_t)r * n, pa);
            } else {
                const int u = t - nbn;
                float *pb = w->partR + (size_t)u * m;
                memset(pb, 0, sizeof(float) * (size_t)m);
                for (int s = u * rbm; s < imin(m, (u + 1) * rbm); s++)
                    pb[be[s]] -= K->softsort_row_bwd(m, b, w->sb[s], c->inv_t, w->R + (size_t)s * m,
                                                     w->dR + (size_t)s * m, pb);
            }
        }
        bki_team_sync(tm);
        reduce_both(tm, n, m, w->partP, w->partR, w->Da + (size_t)l * n, w->Db + (size_t)l * m);
        bki_team_sync(tm);
}

/* soft_backward through the distances of the Euclidean cost:
 * d|q - k| = (q - k)/|q - k| (0 at 0); queries: rows of dQ~ over the keys
 * in order; keys: fixed blocks of columns, each dK~ row over the queries in
 * order */
static void euclid_bwd(const bki_team *tm, int n, int m, int d, esp_slab *w)
{
    const int ncb = (m + HB - 1) / HB;
    bki_claims cl = bki_claims_open(tm, n + ncb);
    for (int64_t tt; bki_claims_next(&cl, &tt);) {
        const int t = (int)tt;
        if (t < n) {
            const int i = t;
            for (int j = 0; j < m; j++) {
                float e = w->E[(size_t)i * m + j], g = w->dE[(size_t)i * m + j];
                if (e == 0.0f || g == 0.0f) continue;
                g /= e;
                for (int x = 0; x < d; x++)
                    w->dQt[(size_t)i * d + x] += g * (w->Qt[(size_t)i * d + x] - w->Kt[(size_t)j * d + x]);
            }
        } else {
            const int j0 = (t - n) * HB, j1 = imin(m, j0 + HB);
            for (int i = 0; i < n; i++)
                for (int j = j0; j < j1; j++) {
                    float e = w->E[(size_t)i * m + j], g = w->dE[(size_t)i * m + j];
                    if (e == 0.0f || g == 0.0f) continue;
                    g /= e;
                    for (int x = 0; x < d; x++)
                        w->dKt[(size_t)j * d + x] -= g * (w->Qt[(size_t)i * d + x] - w->Kt[(size_t)j * d + x]);
                }
        }
    }
    bki_team_sync(tm);
}

/* The slice gradients: pass 1 dsigma, pass 2 everything else (see
 * docs/ALGORITHMS.md 4.2). dth (L x d) may be NULL. */
static void soft_backward(const bki_team *tm, const bki_kernels *K, const esp_cfg *c, int n, int m, const float *V,
                          int64_t ldv, const float *dO, int64_t lddo, const int32_t *alpha, const int32_t *beta,
                          const float *sig, float *dQ, int64_t ldq, float *dK, int64_t ldk, float *dV, int64_t lddv,
                          float *dth, esp_slab *w)
{
    const int L = c->L, d = c->d, dv = c->dv;
    const float inv_nm = (float)(1.0 / ((double)n * m)), cs = c->paper ? 1.0f : (float)n;
    plan_pairs(tm, n, m, w);
    if (c->euclid) {
        cost_matrix(tm, c, n, m, w, w->E);
        TEAM_ROWS(tm, n, qlo, qhi)
        for (int i = qlo; i < qhi; i++) memset(w->dE + (size_t)i * m, 0, sizeof(float) * (size_t)m);
        bki_gemm(tm, 0, 1, n, m, dv, 1.0f, dO, lddo, V, ldv, 0.0f, w->dA, m);
    }
    bki_team_sync(tm);
    /* pass 1: dsigma_l = <dO, O_l> */
    const double sd = soft_dsigma(tm, K, c, n, m, V, ldv, dO, lddo, alpha, beta, sig, w); /* every member's own */
    TEAM_ROWS(tm, n + m, lo, hi)
    for (int r = lo; r < hi; r++) {
        if (r < n) {
            memset(w->dQt + (size_t)r * d, 0, sizeof(float) * (size_t)d);
        } else {
            memset(dV + (int64_t)(r - n) * lddv, 0, sizeof(float) * (size_t)dv);
            memset(w->dKt + (size_t)(r - n) * d, 0, sizeof(float) * (size_t)d);
        }
    }
    bki_team_sync(tm); /* dsig */
    /* pass 2: per-slice gradients */
    for (int l = 0; l < L; l++) {
        const int32_t *al = alpha + (size_t)l * n, *be = beta + (size_t)l * m;
        const float dD = (float)(-c->tau * sig[l] * (w->dsig[l] - sd)), cws = cs * sig[l];
        slice_sorts(tm, K, c, n, m, l, al, be, w);
        if (!c->euclid) {
            bki_gemm(tm, 0, 0, m, dv, m, 1.0f, w->R, m, V, ldv, 0.0f, w->Y, dv);
            bki_gemm(tm, 0, 0, n, dv, n, 1.0f, w->P, n, dO, lddo, 0.0f, w->Z, dv);
            if (dD != 0.0f) {
                bki_gemm(tm, 0, 0, m, d, m, 1.0f, w->R, m, w->Kt, d, 0.0f, w->X, d);
                bki_gemm(tm, 0, 0, n, d, n, 1.0f, w->P, n, w->Qt, d, 0.0f, w->PQ, d);
            }
            bki_team_sync(tm);
            TEAM_ROWS(tm, n + m, lo, hi)
            for (int r = lo; r < hi; r++) {
                if (r < n) {
                    plan_rows(0, w, inv_nm, w->Y, dv, w->WY, dv, dv, r, r + 1);
                    if (dD != 0.0f) plan_rows(0, w, inv_nm, w->X, d, w->WX, d, d, r, r + 1);
                } else {
                    plan_rows(1, w, inv_nm, w->Z, dv, w->WTZ, dv, dv, r - n, r - n + 1);
                    if (dD != 0.0f) plan_rows(1, w, inv_nm, w->PQ, d, w->WTPQ, d, d, r - n, r - n + 1);
                }
            }
            bki_team_sync(tm);
            /* dV += cs sigma R^T W^T P dO */
            bki_gemm(tm, 1, 0, m, dv, m, cws, w->R, m, w->WTZ, dv, 1.0f, dV, lddv);
            /* dP = cs sigma (W R V) dO^T ; dR = cs sigma (W^T P dO) V^T */
            bki_gemm(tm, 0, 1, n, n, dv, cws, w->WY, dv, dO, lddo, 0.0f, w->dP, n);
            bki_gemm(tm, 0, 1, m, m, dv, cws, w->WTZ, dv, V, ldv, 0.0f, w->dR, m);
            bki_team_sync(tm);
            if (dD != 0.0f) { /* the squared cost's part */
                bki_gemm(tm, 0, 1, n, n, d, -2.0f * dD, w->WX, d, w->Qt, d, 1.0f, w->dP, n);
                bki_gemm(tm, 0, 1, m, m, d, -2.0f * dD, w->WTPQ, d, w->Kt, d, 1.0f, w->dR, m);
                bki_team_sync(tm);
                const float an = dD / (float)n, am = dD / (float)m;
                TEAM_ROWS(tm, n + m, lo, hi)
                for (int r = lo; r < hi; r++) {
                    if (r < n) {
                        float *dpr = w->dP + (size_t)r * n, *g = w->dQt + (size_t)r * d;
                        const float *q = w->Qt + (size_t)r * d;
                        for (int i = 0; i < n; i++) dpr[i] += an * w->qn[i];
                        /* dQ~ += dD ((2/n) csP_i q_i - 2 P^T W R K); dK~ likewise */
                        for (int x = 0; x < d; x++) g[x] += 2.0f * an * w->csP[r] * q[x];
                    } else {
                        const int s = r - n;
                        float *drs = w->dR + (size_t)s * m, *g = w->dKt + (size_t)s * d;
                        const float *k = w->Kt + (size_t)s * d;
                        for (int j = 0; j < m; j++) drs[j] += am * w->kn[j];
                        for (int x = 0; x < d; x++) g[x] += 2.0f * am * w->csR[s] * k[x];
                    }
                }
                bki_team_sync(tm);
                bki_gemm(tm, 1, 0, n, d, n, -2.0f * dD, w->P, n, w->WX, d, 1.0f, w->dQt, d);
                bki_gemm(tm, 1, 0, m, d, m, -2.0f * dD, w->R, m, w->WTPQ, d, 1.0f, w->dKt, d);
            }
        } else {
            plan_apply(tm, 0, w, inv_nm, w->R, m, w->M, m, m, n);
            bki_team_sync(tm);
            bki_gemm(tm, 1, 0, n, m, n, 1.0f, w->P, n, w->M, m, 0.0f, w->U, m);
            bki_team_sync(tm);
            /* dV += cs sigma U^T dO ; dE += dD U ; dU = cs sigma dA + dD E */
            bki_gemm(tm, 1, 0, m, dv, n, cws, w->U, m, dO, lddo, 1.0f, dV, lddv);
            TEAM_ROWS(tm, n, qlo, qhi)
            for (int i = qlo; i < qhi; i++)
                for (size_t e = (size_t)i * m; e < (size_t)(i + 1) * m; e++) {
                    w->dE[e] += dD * w->U[e];
                    w->dU[e] = cws * w->dA[e] + dD * w->E[e];
                }
            bki_team_sync(tm);
            /* dP = (W R) dU^T ; dM = P dU (into U) ; dR = W^T dM */
            bki_gemm(tm, 0, 1, n, n, m, 1.0f, w->M, m, w->dU, m, 0.0f, w->dP, n);
            bki_gemm(tm, 0, 0, n, m, n, 1.0f, w->P, n, w->dU, m, 0.0f, w->U, m);
            bki_team_sync(tm);
            plan_apply(tm, 1, w, inv_nm, w->U, m, w->dR, m, m, m);
        }
        bki_team_sync(tm);
        softsort_bwd(tm, K, c, n, m, l, al, be, w);
    }
    /* projections: dQ~ += Da^T Theta, dK~ += Db^T Theta, dTheta = Da Q~ + Db K~ */
    bki_gemm(tm, 1, 0, n, d, L, 1.0f, w->Da, n, c->theta, d, 1.0f, w->dQt, d);
    bki_gemm(tm, 1, 0, m, d, L, 1.0f, w->Db, m, c->theta, d, 1.0f, w->dKt, d);
    if (dth) bki_gemm(tm, 0, 0, L, d, n, 1.0f, w->Da, n, w->Qt, d, 0.0f, dth, d);
    bki_team_sync(tm);
    if (dth) bki_gemm(tm, 0, 0, L, d, m, 1.0f, w->Db, m, w->Kt, d, 1.0f, dth, d);
    if (c->euclid) euclid_bwd(tm, n, m, d, w); /* through the distances */
    TEAM_ROWS(tm, n + m, lo, hi)
    for (int r = lo; r < hi; r++) {
        if (r < n)
            for (int x = 0; x < d; x++) dQ[(int64_t)r * ldq + x] = c->s * w->dQt[(size_t)r * d + x];
        else
            for (int x = 0; x < d; x++) dK[(int64_t)(r - n) * ldk + x] = c->s * w->dKt[(size_t)(r - n) * d + x];
    }
}


/* ------------------------------------------------------------------------ */
/* one problem: the operator's kernels (every member of its team calls them) */
/* ------------------------------------------------------------------------ */
static int members_of(const bki_call *c) { return c->pl.team ? c->pl.nt : 1; }

/* the tape block's slice weights, costs and orders of problem pi */
typedef struct {
    float *sig, *D;
    int32_t *alpha, *beta;
} esp_block;

static esp_block block_of(const bki_call *c, int pi, int L)
{
    esp_block k;
    k.sig = bki_op_block_data(c, pi);
    k.D = k.sig + L;
    k.alpha = (int32_t *)(k.D + L);
    k.beta = k.alpha + (size_t)L * c->d->Nq;
    return k;
}

static void forward(const bki_team *tm, bki_call *c, int pi, char *lane)
{
    const bk_attn_desc *d = c->d;
    const esp_cfg k = cfg_of(c);
    esp_slab w = carve(c, members_of(c), lane, NULL);
    const bk_esp_extras *ex = c->ex;
    const int L = k.L, b = pi / d->H, h = pi % d->H;
    const int n = bki_op_lq(c, pi), m = bki_op_lk(c, pi);
    const int live = n > 0 && m > 0;
    /* the orders go to the tape or, without one, to lane memory the forward
     * does not use otherwise: soft sort's slice-gradient rows (Da, Db), hard
     * sort's inverse orders (inv: see hard_layout; invk) */
    esp_block blk = {NULL, NULL, NULL, NULL};
    if (c->tape) blk = block_of(c, pi, L);
    else if (k.soft) blk.alpha = (int32_t *)(void *)w.Da, blk.beta = (int32_t *)(void *)w.Db;
    else blk.alpha = w.inv, blk.beta = w.invk;
    float *Ob = c->out ? bki_at(c->out, b, h) : NULL;
    const bk_tensor *ab = NULL;
    bk_tensor abv;
    if (c->attn && c->attn->data) { /* zeroed by rows, then the passes add to it */
        abv = *c->attn;
        abv.data = bki_at(c->attn, b, h);
        ab = &abv;
        TEAM_ROWS(tm, d->Nq, lo, hi)
        for (int i = lo; i < hi; i++) memset(abv.data + (int64_t)i * abv.stride_n, 0, sizeof(float) * (size_t)d->Nk);
        bki_team_sync(tm);
    }
    bk_esp_diag dg = {0.0f, 0.0f};
    if (live) {
        project(tm, &k, n, m, bki_at(c->q, b, h), c->q->stride_n, bki_at(c->k, b, h), c->k->stride_n, &w, 1);
        /* a forward run only for its tape (by a backward) computes no O */
        if (k.soft)
            soft_forward(tm, bki_kern(), &k, n, m, bki_at(c->v, b, h), c->v->stride_n, Ob, Ob ? c->out->stride_n : 0,
                         blk.alpha, blk.beta, &w, ab, &dg);
        else
            hard_forward(tm, &k, n, m, bki_at(c->v, b, h), c->v->stride_n, Ob, Ob ? c->out->stride_n : 0, blk.alpha,
                         blk.beta, &w, ab, &dg);
    }
    if (tm->tid != 0) return; /* member 0 holds sig, Dl and the diagnostics */
    if (!live) {
        memset(w.sig, 0, sizeof(float) * (size_t)L);
        memset(w.Dl, 0, sizeof(float) * (size_t)L);
    }
    if (blk.sig) {
        memcpy(blk.sig, w.sig, sizeof(float) * (size_t)L);
        memcpy(blk.D, w.Dl, sizeof(float) * (size_t)L);
    }
    if (Ob) bki_zero_rows(Ob, c->out->stride_n, live ? n : 0, d->Nq, d->dv);
    if (ex) {
        if (ex->sigma) memcpy(ex->sigma + (size_t)pi * L, w.sig, sizeof(float) * (size_t)L);
        if (ex->D) memcpy(ex->D + (size_t)pi * L, w.Dl, sizeof(float) * (size_t)L);
        if (ex->diag) ex->diag[pi] = dg;
    }
}

static void backward(const bki_team *tm, bki_call *c, int pi, char *lane)
{
    const bk_attn_desc *d = c->d;
    const esp_cfg k = cfg_of(c);
    esp_slab w = carve(c, members_of(c), lane, NULL);
    const int L = k.L, b = pi / d->H, h = pi % d->H;
    const int n = bki_op_lq(c, pi), m = bki_op_lk(c, pi), live = n > 0 && m > 0;
    const esp_block blk = block_of(c, pi, L);
    float *dQb = bki_at(c->dq, b, h), *dKb = bki_at(c->dk, b, h), *dVb = bki_at(c->dv, b, h);
    float *dth = c->pg && k.soft ? pgrad_of(c, pi) : NULL;
    if (dth && !live && tm->tid == 0) memset(dth, 0, sizeof(float) * (size_t)L * d->d);
    if (live) {
        project(tm, &k, n, m, bki_at(c->q, b, h), c->q->stride_n, bki_at(c->k, b, h), c->k->stride_n, &w, k.soft);
        if (k.soft)
            soft_backward(tm, bki_kern(), &k, n, m, bki_at(c->v, b, h), c->v->stride_n, bki_at(c->dout, b, h),
                          c->dout->stride_n, blk.alpha, blk.beta, blk.sig, dQb, c->dq->stride_n, dKb, c->dk->stride_n,
                          dVb, c->dv->stride_n, dth, &w);
        else
            hard_backward(tm, &k, n, m, bki_at(c->v, b, h), c->v->stride_n, bki_at(c->dout, b, h), c->dout->stride_n,
                          blk.alpha, blk.beta, blk.sig, dQb, c->dq->stride_n, dKb, c->dk->stride_n, dVb,
                          c->dv->stride_n, &w);
    }
    if (tm->tid != 0) return;
    bki_zero_rows(dQb, c->dq->stride_n, live ? n : 0, d->Nq, d->d);
    bki_zero_rows(dKb, c->dk->stride_n, live ? m : 0, d->Nk, d->d);
    bki_zero_rows(dVb, c->dv->stride_n, live ? m : 0, d->Nk, d->dv);
}

/* ------------------------------------------------------------------------ */
/* the operator and its public entry points                                  */
/* ------------------------------------------------------------------------ */
static void par_default(void *p) { *(bk_esp_config *)p = bk_esp_config_default(); }

static const char *const sort_names[] = {"hard", "soft", NULL};
static const char *const cost_names[] = {"sq", "euclid", NULL};
static const char *const scale_names[] = {"rows", "paper", NULL};
/* the schema's ranges are those check_params enforces on each value alone
 * (t > 0 is checked under soft sort only: no range here) */
static const bki_field fields[] = {
    {.name = "sort", .type = BKI_F_ENUM, .offset = offsetof(bk_esp_config, sort), .names = sort_names,
     .doc = "hard: exact argsort (inference; exactly doubly stochastic) or soft: SoftSort (training)"},
    {.name = "t", .type = BKI_F_FLOAT, .offset = offsetof(bk_esp_config, t), .alias = "softsort-t",
     .doc = "SoftSort temperature, > 0 under soft sort (on the scaled projections)"},
    {.name = "tau", .type = BKI_F_FLOAT, .offset = offsetof(bk_esp_config, tau),
     .doc = "slice-mixing inverse temperature (multiplies each slice's mean matched cost)", .lo = 0.0,
     .hi = INFINITY},
    {.name = "scale", .type = BKI_F_FLOAT, .offset = offsetof(bk_esp_config, scale),
     .doc = "q, k scale (0: 1/sqrt(d)); finite"},
    {.name = "cost", .type = BKI_F_ENUM, .offset = offsetof(bk_esp_config, cost), .names = cost_names,
     .doc = "sq: squared distance (paper) or euclid: Euclidean (reference code)"},
    {.name = "out_scale", .type = BKI_F_ENUM, .offset = offsetof(bk_esp_config, out_scale), .names = scale_names,
     .alias = "esp-scale", .doc = "rows: A = n G (rows sum to 1 under hard sort) or paper: A = G"},
    {.name = "L", .type = BKI_F_INT, .offset = offsetof(bk_esp_config, L), .alias = "num-slices",
     .doc = "slices: 0 = axis-aligned (L = d); > 0 = L rows of the slices array, or random unit directions",
     .lo = 0, .hi = 65536},
    {.name = "seed", .type = BKI_F_U64, .offset = offsetof(bk_esp_config, seed),
     .doc = "seed of the random slices (L > 0 without a slices array)"},
};

/* ---- the arrays: slices [L, d] in; sigma, costs [B, H, L], diag [B, H, 2] out;
 * dslices [L, d] from the backward ---- */
static int slices_shape(const void *par, const bk_attn_desc *d, int64_t dims[4])
{
    dims[0] = bk_esp_num_slices(par, d->d); dims[1] = d->d;
    return 2;
}

static int sigma_shape(const void *par, const bk_attn_desc *d, int64_t dims[4])
{
    dims[0] = d->B; dims[1] = d->H; dims[2] = bk_esp_num_slices(par, d->d);
    return 3;
}

static int diag_shape(const void *par, const bk_attn_desc *d, int64_t dims[4])
{
    (void)par;
    dims[0] = d->B; dims[1] = d->H; dims[2] = 2;
    return 3;
}

enum { A_SLICES, A_SIGMA, A_COSTS, A_DIAG, A_DSLICES }; /* the arrays' indices */
static const bki_array arrays[] = {
    [A_SLICES] = {.name = "slices", .doc = "slice matrix theta (rows used as given); sets L", .kind = BKI_ARR_IN,
     .shape_text = "[L, d]", .offset = offsetof(bk_esp_config, theta), .dim_key = "L", .dim_at = 0,
     .shape = slices_shape},
    [A_SIGMA] = {.name = "sigma", .doc = "slice weights per problem", .kind = BKI_ARR_FWD, .shape_text = "[B, H, L]",
     .shape = sigma_shape},
    [A_COSTS] = {.name = "costs", .doc = "slice costs D per problem (the mean matched cost of each slice)",
     .kind = BKI_ARR_FWD,
     .shape_text = "[B, H, L]", .shape = sigma_shape},
    [A_DIAG] = {.name = "diag", .doc = "per problem: max |row sum - 1|, max |col sum - 1| of the plan (n, m scaled)",
     .kind = BKI_ARR_FWD | BKI_ARR_HOST, .shape_text = "[B, H, 2]", .shape = diag_shape},
    [A_DSLICES] = {.name = "dslices", .doc = "gradient w.r.t. the slices, summed over problems (zeros under hard sort)",
     .kind = BKI_ARR_BWD, .shape_text = "[L, d]", .shape = slices_shape},
};

static bk_status run_arrays(bki_call *c, float *const *a, void *tape, void *ws, size_t ws_size)
{
    if (c->dout) {
        c->pg = a[A_DSLICES];
        bk_status s = bki_op_backward(c, tape, ws, ws_size);
        c->pg = NULL;
        return s;
    }
    const int P = c->d ? c->d->B * c->d->H : 0;
    bk_esp_diag *dg = a[A_DIAG] && P > 0 ? malloc(sizeof *dg * (size_t)P) : NULL;
    if (a[A_DIAG] && P > 0 && !dg) return bki_fail(BK_ERR_NOMEM, "esp: no memory for the diagnostics");
    bk_esp_extras ex = {.sigma = a[A_SIGMA], .D = a[A_COSTS], .diag = dg};
    c->ex = &ex;
    bk_status s = bki_op_forward(c, tape, ws, ws_size);
    c->ex = NULL;
    for (int p = 0; s == BK_OK && dg && p < P; p++) {
        a[A_DIAG][2 * p] = dg[p].row_err;
        a[A_DIAG][2 * p + 1] = dg[p].col_err;
    }
    free(dg);
    return s;
}

/* the bench's cases: "" = soft sort with the reference module's semantics
 * (Euclidean cost, t = 1e-3, tau = 10 N), "sq" = soft sort with the paper's
 * squared cost, "hard" = exact sort (inference) */
#define ESP_CASE(tag, H_, N, par) \
    {.name = tag, .B = 1, .H = H_, .Nq = N, .Nk = N, .d = 64, .dv = 64, .params = par, .backward = 1}
static const bki_bench_case bench[] = {
    ESP_CASE("", 8, 128, "sort=soft,t=1e-3,cost=euclid,tau=1280"),
    ESP_CASE("", 8, 512, "sort=soft,t=1e-3,cost=euclid,tau=5120"),
    ESP_CASE("", 8, 1024, "sort=soft,t=1e-3,cost=euclid,tau=10240"),
    ESP_CASE("sq", 8, 512, "sort=soft,t=1e-3,tau=10"),
    ESP_CASE("hard", 8, 1024, "sort=hard,t=1e-3,tau=10"),
    ESP_CASE("hard", 8, 8192, "sort=hard,t=1e-3,tau=10"),
    ESP_CASE("hard", 8, 65536, "sort=hard,t=1e-3,tau=10"),
};
#undef ESP_CASE

const bki_op bki_op_esp = {
    .name = "esp", .id = 3, .par_name = "bk_esp_config", .fields = fields, .nfields = BKI_NB(fields),
    .par_size = sizeof(bk_esp_config), .par_default = par_default, .check = check, .cost = cost,
    .lane_bytes = lane_bytes, .block_bytes = block_bytes, .key = key, .prep_bytes = prep_bytes,
    .prepare = prep_slices, .pgrad_bytes = pgrad_bytes, .reduce = reduce, .forward = forward, .backward = backward,
    .steps_ok = steps_ok, .pg_arrays = pg_arrays,
    .doc = "expected sliced transport (ESPFormer, Shahbazi et al. 2025): plans of sorted 1-d projections mixed "
           "over slices",
    .caps = BKI_CAP_CROSS | BKI_CAP_PAD | BKI_CAP_ATTN | BKI_CAP_MODEL, .bench = bench, .nbench = BKI_NB(bench),
    .arrays = arrays, .narrays = BKI_NB(arrays), .run_arrays = run_arrays,
};

/* ---- public entry points: one line each over the call helpers (op.h) ---- */
size_t bk_esp_workspace_size(const bk_attn_desc *desc, const bk_esp_config *p)
{
    return bki_call_workspace(&bki_op_esp, desc, p);
}

size_t bk_esp_tape_size(const bk_attn_desc *desc, const bk_esp_config *p)
{
    return bki_call_tape(&bki_op_esp, desc, p);
}

bk_status bk_esp_forward(const bk_attn_desc *desc, const bk_esp_config *p, const bk_tensor *q, const bk_tensor *k,
                         const bk_tensor *v, const bk_tensor *out, void *tape, const bk_esp_extras *extras, void *ws,
                         size_t ws_size)
{
    return bki_call_forward(&bki_op_esp, desc, p, q, k, v, out, tape, extras, extras ? &extras->attn : NULL, ws,
                            ws_size);
}

bk_status bk_esp_backward(const bk_attn_desc *desc, const bk_esp_config *p, const bk_tensor *q, const bk_tensor *k,
                          const bk_tensor *v, const bk_tensor *dout, const void *tape, const bk_tensor *dq,
                          const bk_tensor *dk, const bk_tensor *dv, float *dtheta, void *ws, size_t ws_size)
{
    return bki_call_backward(&bki_op_esp, desc, p, q, k, v, dout, tape, dq, dk, dv, dtheta, ws, ws_size);
}
