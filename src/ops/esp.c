/* esp.c -- ESP attention (ESPFormer): hard-sort exact doubly-stochastic
 * attention without any n x m matrix, and soft-sort attention streamed one
 * slice at a time; forward and backward. Semantics in include/birkhoff.h,
 * derivations in docs/ALGORITHMS.md section 4.
 *
 * Mechanisms used from elsewhere: argsort and the 1-D OT plan (sort1d.c),
 * SoftSort rows (the per-ISA kernels in lse_engine.c), GEMMs (CBLAS),
 * validation and views (tensor.c). Each (batch, head) problem runs on one
 * thread with its own slab of the workspace, so results do not depend on
 * the thread count; the slice gradient is reduced over problems in a fixed
 * order. */
#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xmmintrin.h>

#define ESP_MAGIC 0x50534542u /* "BESP" */
#define ESP_VERSION 1u

/* ------------------------------------------------------------------------ */
/* parameters                                                                */
/* ------------------------------------------------------------------------ */
bk_esp_params bk_esp_params_default(void)
{
    bk_esp_params p = {BK_ESP_HARD, 1e-3f, 1.0f, 0.0f, BK_ESP_COST_SQ, BK_ESP_SCALE_ROWS, 0, NULL, 0};
    return p;
}

int bk_esp_num_slices(const bk_esp_params *p, int d)
{
    if (!p || d < 1 || p->L < 0) return 0;
    return p->L == 0 ? d : p->L;
}

float bk_esp_anneal(float t0, float factor, int epoch)
{
    return t0 * powf(factor, (float)(epoch > 0 ? epoch : 0));
}

/* identity, the caller's, or random unit directions from the seed (sort1d.c) */
static void fill_slices(const bk_esp_params *p, int d, int L, float *theta)
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

static bk_status check_params(const bk_esp_params *p, int d)
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
    if (p->theta)
        for (size_t i = 0; i < (size_t)p->L * d; i++)
            if (!isfinite(p->theta[i])) return bki_fail(BK_ERR_NONFINITE, "theta has a non-finite value at %zu", i);
    return BK_OK;
}

bk_status bk_esp_slices(const bk_esp_params *p, int d, float *theta)
{
    if (!theta) return bki_fail(BK_ERR_NULL, "theta output is NULL");
    if (d < 1) return bki_fail(BK_ERR_SHAPE, "d must be >= 1");
    bk_status s = check_params(p, d);
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

/* ------------------------------------------------------------------------ */
/* workspace and tape                                                        */
/* ------------------------------------------------------------------------ */
static size_t fl(size_t n) { return bki_round_up(n * sizeof(float)); }

/* per-thread bytes for problems up to n x m */
static size_t slab_bytes(int n, int m, int d, int dv, int L, int soft, int euclid)
{
    size_t nn = (size_t)(n > m ? n : m);
    size_t b = fl((size_t)n * d) + fl((size_t)m * d) + fl(n) + fl(m) + fl((size_t)L * n) + fl((size_t)L * m) +
               fl(n) + fl(m) + bki_round_up(bki_argsort_scratch((int)nn)) + 2 * fl(n + m) +
               bki_round_up(sizeof(double) * (size_t)(n + m)) + fl(L) * 3 + fl((size_t)L * n) + fl(n + 1) +
               bki_round_up(sizeof(double) * (size_t)L);
    if (soft) {
        b += fl((size_t)n * n) * 2 + fl((size_t)m * m) * 2;                   /* P, dP, R, dR */
        b += fl((size_t)m * d) * 2 + fl((size_t)m * dv) * 2;                  /* X, WTPQ, Y, WTZ */
        b += fl((size_t)n * d) * 4 + fl((size_t)n * dv) * 4;                  /* WX, PQ, dQt, -, WY, Z, Ol, Oacc */
        b += fl((size_t)m * d);                                               /* dKt */
        b += fl(n) * 4 + fl(m) * 4 + fl((size_t)L * n) + fl((size_t)L * m);  /* sums, da, db, Da, Db */
        if (euclid) b += fl((size_t)n * m) * 6;                               /* E, M, U, dU, dA, dE */
    }
    return b + BK_ALIGN;
}

typedef struct {
    float *Qt, *Kt, *qn, *kn, *Ap, *Bp, *sa, *sb;
    void *sortscr;
    int32_t *pr, *ps;
    double *pc;
    float *Dl, *sig, *dsig;
    int32_t *inv, *rowptr; /* hard: inverse query orders (L x n), pairs of each query rank (n + 1) */
    double *Dacc;          /* hard: per-slice cost accumulators (L) */
    /* soft */
    float *P, *dP, *R, *dR, *X, *WTPQ, *Y, *WTZ, *WX, *PQ, *dQt, *WY, *Z, *Ol, *Oacc, *dKt;
    float *csP, *csR, *rs, *cs, *da, *db, *Da, *Db;
    float *E, *M, *U, *dU, *dA, *dE;
} esp_slab;

static esp_slab carve(char *base, size_t bytes, int n, int m, int d, int dv, int L, int soft, int euclid)
{
    bki_arena ar = {base, 0, bytes};
    esp_slab w;
    memset(&w, 0, sizeof w);
    size_t nn = (size_t)(n > m ? n : m);
#define TAKE(ptr, cnt) ptr = bki_take(&ar, (cnt) * sizeof(float))
    TAKE(w.Qt, (size_t)n * d); TAKE(w.Kt, (size_t)m * d); TAKE(w.qn, n); TAKE(w.kn, m);
    TAKE(w.Ap, (size_t)L * n); TAKE(w.Bp, (size_t)L * m); TAKE(w.sa, n); TAKE(w.sb, m);
    w.sortscr = bki_take(&ar, bki_argsort_scratch((int)nn));
    w.pr = bki_take(&ar, sizeof(int32_t) * (size_t)(n + m));
    w.ps = bki_take(&ar, sizeof(int32_t) * (size_t)(n + m));
    w.pc = bki_take(&ar, sizeof(double) * (size_t)(n + m));
    TAKE(w.Dl, L); TAKE(w.sig, L); TAKE(w.dsig, L);
    w.inv = bki_take(&ar, sizeof(int32_t) * (size_t)L * n); /* query-major: [i][l] */
    w.rowptr = bki_take(&ar, sizeof(int32_t) * (size_t)(n + 1));
    w.Dacc = bki_take(&ar, sizeof(double) * (size_t)L);
    if (soft) {
        TAKE(w.P, (size_t)n * n); TAKE(w.dP, (size_t)n * n); TAKE(w.R, (size_t)m * m); TAKE(w.dR, (size_t)m * m);
        TAKE(w.X, (size_t)m * d); TAKE(w.WTPQ, (size_t)m * d); TAKE(w.Y, (size_t)m * dv); TAKE(w.WTZ, (size_t)m * dv);
        TAKE(w.WX, (size_t)n * d); TAKE(w.PQ, (size_t)n * d); TAKE(w.dQt, (size_t)n * d);
        (void)bki_take(&ar, (size_t)n * d * sizeof(float));
        TAKE(w.WY, (size_t)n * dv); TAKE(w.Z, (size_t)n * dv); TAKE(w.Ol, (size_t)n * dv); TAKE(w.Oacc, (size_t)n * dv);
        TAKE(w.dKt, (size_t)m * d);
        TAKE(w.csP, n); TAKE(w.rs, n); TAKE(w.da, n); (void)bki_take(&ar, n * sizeof(float));
        TAKE(w.csR, m); TAKE(w.cs, m); TAKE(w.db, m); (void)bki_take(&ar, m * sizeof(float));
        TAKE(w.Da, (size_t)L * n); TAKE(w.Db, (size_t)L * m);
        if (euclid) {
            TAKE(w.E, (size_t)n * m); TAKE(w.M, (size_t)n * m); TAKE(w.U, (size_t)n * m);
            TAKE(w.dU, (size_t)n * m); TAKE(w.dA, (size_t)n * m); TAKE(w.dE, (size_t)n * m);
        }
    }
#undef TAKE
    return w;
}

/* tape: [header 64 B] then per problem {int32 Lq, Lk, pad to 16 words;
 * float sigma[L], D[L]; int32 alpha[L*Nq], beta[L*Nk]} padded to 16 words */
typedef struct {
    uint32_t magic, version;
    int32_t B, H, Nq, Nk, d, L;
    int32_t sort, cost, out_scale;
    float tau, t, s;
    int32_t reserved[2];
} esp_tape_header;

static size_t tape_block_words(int Nq, int Nk, int L)
{
    size_t w = 16 + 2 * (size_t)L + (size_t)L * ((size_t)Nq + Nk);
    return (w + 15) & ~(size_t)15;
}

size_t bk_esp_tape_size(const bk_attn_desc *desc, const bk_esp_params *p)
{
    if (!desc || !p || desc->B < 1 || desc->H < 1 || desc->Nq < 1 || desc->Nk < 1 || desc->d < 1) return 0;
    int L = bk_esp_num_slices(p, desc->d);
    if (L < 1) return 0;
    return sizeof(esp_tape_header) + (size_t)desc->B * desc->H * tape_block_words(desc->Nq, desc->Nk, L) * 4;
}

static int32_t *tape_block(const void *tape, const bk_attn_desc *d, int L, int p)
{
    return (int32_t *)((char *)tape + sizeof(esp_tape_header)) + (size_t)p * tape_block_words(d->Nq, d->Nk, L);
}

static size_t ws_need(const bk_attn_desc *d, const bk_esp_params *p, int L, int nt, int with_tape, int backward)
{
    size_t b = (size_t)nt * slab_bytes(d->Nq, d->Nk, d->d, d->dv, L, p->sort == BK_ESP_SOFT, p->cost == BK_ESP_COST_EUCLID);
    b += fl((size_t)L * d->d) + BK_ALIGN;                                      /* theta */
    if (backward) b += fl((size_t)d->B * d->H * L * d->d) + BK_ALIGN;          /* per-problem dtheta */
    if (with_tape) b += bk_esp_tape_size(d, p) + BK_ALIGN;
    return b + BK_ALIGN;
}

size_t bk_esp_workspace_size(const bk_attn_desc *desc, const bk_esp_params *p)
{
    if (!desc || !p || desc->B < 1 || desc->H < 1 || desc->Nq < 1 || desc->Nk < 1 || desc->d < 1 || desc->dv < 1) return 0;
    int L = bk_esp_num_slices(p, desc->d);
    if (L < 1) return 0;
    return ws_need(desc, p, L, bki_work_threads(desc->B * desc->H), 1, 1);
}

/* ------------------------------------------------------------------------ */
/* shared per-problem pieces                                                 */
/* ------------------------------------------------------------------------ */
/* scaled contiguous copies of Q and K, squared norms, and the projections
 * Ap = Theta Qt^T (L x n), Bp = Theta Kt^T (L x m) */
/* out (rows x d, contiguous) = s * X; norms[i] = |out_i|^2 */
static void scaled_copy(int rows, int d, float s, const float *X, int64_t ldx, float *out, float *norms)
{
    for (int i = 0; i < rows; i++) {
        float acc = 0.0f;
        for (int x = 0; x < d; x++) {
            float v = s * X[(int64_t)i * ldx + x];
            out[(size_t)i * d + x] = v;
            acc += v * v;
        }
        norms[i] = acc;
    }
}

static void prepare(const esp_cfg *c, int n, int m, const float *Q, int64_t ldq, const float *K, int64_t ldk,
                    esp_slab *w)
{
    const int d = c->d;
    scaled_copy(n, d, c->s, Q, ldq, w->Qt, w->qn);
    scaled_copy(m, d, c->s, K, ldk, w->Kt, w->kn);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->L, n, d, 1.0f, c->theta, d, w->Qt, d, 0.0f, w->Ap, n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->L, m, d, 1.0f, c->theta, d, w->Kt, d, 0.0f, w->Bp, m);
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

/* out = W X (out row r = sum over pairs (r, s) of scale * cells * X[s]) or,
 * with transpose, W^T X (out row s gathers the rows r); W = cells / (n m). */
static void apply_plan(int transpose, int np, const int32_t *pr, const int32_t *ps, const double *pc, float scale,
                       const float *X, int ldx, float *out, int ldo, int cols, int nrows_out)
{
    const int32_t *src = transpose ? pr : ps, *dst = transpose ? ps : pr;
    for (int r = 0; r < nrows_out; r++) memset(out + (size_t)r * ldo, 0, sizeof(float) * (size_t)cols);
    for (int k = 0; k < np; k++) {
        float w = (float)(pc[k] * scale);
        const float *x = X + (size_t)src[k] * ldx;
        float *o = out + (size_t)dst[k] * ldo;
        for (int c = 0; c < cols; c++) o[c] += w * x[c];
    }
}
#define apply_W(...) apply_plan(0, __VA_ARGS__)
#define apply_WT(...) apply_plan(1, __VA_ARGS__)

/* SoftSort matrix of one slice: order idx (given), sorted values into sv,
 * rows of Pm (n x n, row r = rank r). Also its column sums. */
static void softsort_matrix(const bki_kernels *K, int n, const float *a, const int32_t *idx, float inv_t, float *sv,
                            float *Pm, float *colsum)
{
    for (int r = 0; r < n; r++) sv[r] = a[idx[r]];
    memset(colsum, 0, sizeof(float) * (size_t)n);
    for (int r = 0; r < n; r++) {
        float *row = Pm + (size_t)r * n;
        K->softsort_row(n, a, sv[r], inv_t, row);
        for (int i = 0; i < n; i++) colsum[i] += row[i];
    }
}

/* ------------------------------------------------------------------------ */
/* hard sort                                                                  */
/* ------------------------------------------------------------------------ */
/* Hard-sort layout shared by forward and backward: the pairs of the 1-D
 * plan grouped by query rank (rowptr), and for every slice each query's rank,
 * or directly its partner key when n == m (slice-major, L x n). Work runs over
 * blocks of HB queries in memory order and, inside a block, over slices, so
 * Q, O, dO and dQ rows stay in L1 across slices and only K and V rows are
 * gathered. */
#define HB 16
static void hard_layout(const esp_cfg *c, int n, int m, const int32_t *alpha, const int32_t *beta, esp_slab *w)
{
    const int L = c->L;
    const int np = bki_nw_pairs(n, m, w->pr, w->ps, w->pc);
    for (int r = 0, k = 0; r <= n; r++) {
        while (k < np && w->pr[k] < r) k++;
        w->rowptr[r] = k;
    }
    for (int l = 0; l < L; l++) {
        const int32_t *al = alpha + (size_t)l * n, *be = beta + (size_t)l * m;
        int32_t *pt = w->inv + (size_t)l * n;
        if (n == m)
            for (int r = 0; r < n; r++) pt[al[r]] = be[r]; /* partner key */
        else
            for (int r = 0; r < n; r++) pt[al[r]] = r;     /* rank */
    }
}

/* Prefetches the row of the partner of a query a few places ahead in the
 * same slice (n == m: rows are gathered at random, so the hardware prefetcher
 * cannot guess them). */
#define BK_PF_DIST 4
static inline void hard_prefetch(const int32_t *part, int i, int l, int n, const float *base, int64_t ld)
{
    size_t next = (size_t)l * n + i + BK_PF_DIST;
    if (i + BK_PF_DIST < n) {
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

static void hard_forward(const esp_cfg *c, int n, int m, const float *V, int64_t ldv, float *O, int64_t ldo,
                         int32_t *alpha, int32_t *beta, esp_slab *w, const bk_tensor *attn_b, bk_esp_diag *dg)
{
    const int L = c->L, dv = c->dv, d = c->d;
    for (int l = 0; l < L; l++) {
        bki_argsort(n, w->Ap + (size_t)l * n, 1, alpha + (size_t)l * n, w->sortscr);
        bki_argsort(m, w->Bp + (size_t)l * m, 1, beta + (size_t)l * m, w->sortscr);
    }
    hard_layout(c, n, m, alpha, beta, w);
    const double inv_nm = 1.0 / ((double)n * m);
    /* D_l = sum over pairs (mass cells/(nm)) of c(q_i, k_j), queries in order */
    for (int l = 0; l < L; l++) w->Dacc[l] = 0.0;
    for (int i0 = 0; i0 < n; i0 += HB)
        for (int l = 0; l < L; l++)
            for (int i = i0; i < n && i < i0 + HB; i++) {
                const float *q = w->Qt + (size_t)i * d;
                if (n == m) hard_prefetch(w->inv, i, l, n, w->Kt, d);
                HARD_PAIRS(i, l, w->Dacc[l] += cells * pair_cost(c, q, w->Kt + (size_t)j * d));
            }
    for (int l = 0; l < L; l++) w->Dl[l] = (float)(w->Dacc[l] * inv_nm);
    slice_weights(L, c->tau, w->Dl, w->sig);
    if (!O) return; /* a backward's recomputation needs only orders and weights */
    /* O_i = sum_l sigma_l sum_{pairs at i} (c * mass) V_j; rows scale: c * mass = cells / m */
    const double cw = c->paper ? inv_nm : 1.0 / m;
    for (int i = 0; i < n; i++) memset(O + (int64_t)i * ldo, 0, sizeof(float) * (size_t)dv);
    for (int i0 = 0; i0 < n; i0 += HB)
        for (int l = 0; l < L; l++)
            for (int i = i0; i < n && i < i0 + HB; i++) {
                float *oi = O + (int64_t)i * ldo;
                if (n == m) hard_prefetch(w->inv, i, l, n, V, ldv);
                HARD_PAIRS(i, l, {
                const float wt = (float)(w->sig[l] * cells * cw);
                const float *vj = V + (int64_t)j * ldv;
                for (int x = 0; x < dv; x++) oi[x] += wt * vj[x];
                if (attn_b) attn_b->data[(int64_t)i * attn_b->stride_n + j] += wt;
            });
            }
    if (dg) { /* the plan is exactly doubly stochastic: report the rounding of the weights */
        double tot = 0.0;
        for (int l = 0; l < L; l++) tot += w->sig[l];
        dg->row_err = dg->col_err = (float)fabs(tot - 1.0);
    }
}

static void hard_backward(const esp_cfg *c, int n, int m, const float *V, int64_t ldv, const float *dO, int64_t ldo,
                          const int32_t *alpha, const int32_t *beta, const float *sig, float *dQ, int64_t ldq, float *dK,
                          int64_t ldk, float *dV, int64_t lddv, esp_slab *w)
{
    const int L = c->L, dv = c->dv, d = c->d;
    hard_layout(c, n, m, alpha, beta, w);
    const double inv_nm = 1.0 / ((double)n * m), cw = c->paper ? inv_nm : 1.0 / m;
    for (int j = 0; j < m; j++) memset(dV + (int64_t)j * lddv, 0, sizeof(float) * (size_t)dv);
    for (int l = 0; l < L; l++) w->Dacc[l] = 0.0;
    /* dV_j += sigma_l (c mass) dO_i; dsigma_l = sum (c mass) <dO_i, V_j> */
    for (int i0 = 0; i0 < n; i0 += HB)
        for (int l = 0; l < L; l++)
            for (int i = i0; i < n && i < i0 + HB; i++) {
                const float *gi = dO + (int64_t)i * ldo;
                if (n == m) {
                    hard_prefetch(w->inv, i, l, n, V, ldv);
                    hard_prefetch(w->inv, i, l, n, dV, lddv);
                }
                HARD_PAIRS(i, l, {
                    const float wt = (float)(cells * cw), ws = wt * sig[l];
                    const float *vj = V + (int64_t)j * ldv;
                    w->Dacc[l] += (double)wt * dot_axpy(dv, gi, vj, dV + (int64_t)j * lddv, ws);
                });
            }
    double sd = 0.0;
    for (int l = 0; l < L; l++) {
        w->dsig[l] = (float)w->Dacc[l];
        sd += sig[l] * w->Dacc[l];
    }
    for (int i = 0; i < n; i++) memset(dQ + (int64_t)i * ldq, 0, sizeof(float) * (size_t)d);
    for (int j = 0; j < m; j++) memset(dK + (int64_t)j * ldk, 0, sizeof(float) * (size_t)d);
    if (c->tau == 0.0f) return; /* no gradient reaches Q, K under hard sort */
    /* dD_l = -tau sigma_l (dsigma_l - sum sigma dsigma); then the cost's gradient per pair */
    for (int l = 0; l < L; l++) w->Dacc[l] = -c->tau * sig[l] * (w->dsig[l] - sd) * inv_nm * c->s;
    for (int i0 = 0; i0 < n; i0 += HB)
        for (int l = 0; l < L; l++) {
            if (w->Dacc[l] == 0.0) continue;
            for (int i = i0; i < n && i < i0 + HB; i++) {
            const float *q = w->Qt + (size_t)i * d;
            float *gq = dQ + (int64_t)i * ldq;
            if (n == m) {
                hard_prefetch(w->inv, i, l, n, w->Kt, d);
                hard_prefetch(w->inv, i, l, n, dK, ldk);
            }
            HARD_PAIRS(i, l, {
                const float *kk = w->Kt + (size_t)j * d;
                float g = (float)(w->Dacc[l] * cells);
                int skip = 0;
                if (c->euclid) {
                    float nrm = sqrtf(sqdist(d, q, kk));
                    if (nrm == 0.0f) skip = 1;
                    else g /= nrm;
                } else {
                    g *= 2.0f;
                }
                if (!skip) {
                    float *gk = dK + (int64_t)j * ldk;
                    for (int x = 0; x < d; x++) {
                        float e = g * (q[x] - kk[x]);
                        gq[x] += e;
                        gk[x] -= e;
                    }
                }
            });
        }
    }
}

/* ------------------------------------------------------------------------ */
/* soft sort                                                                  */
/* ------------------------------------------------------------------------ */
/* Euclidean cost matrix E (n x m) of the scaled points */
static void cost_matrix(const esp_cfg *c, int n, int m, const esp_slab *w, float *E)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            const float *q = w->Qt + (size_t)i * c->d, *k = w->Kt + (size_t)j * c->d;
            float acc = 0.0f;
            for (int x = 0; x < c->d; x++) acc += (q[x] - k[x]) * (q[x] - k[x]);
            E[(size_t)i * m + j] = sqrtf(acc);
        }
}

static float dotf(size_t n, const float *a, const float *b)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* One slice's soft permutations (P: n x n, R: m x m), their column sums and
 * sorted values, from the stored orders. */
static void slice_sorts(const bki_kernels *K, const esp_cfg *c, int n, int m, int l, const int32_t *al,
                        const int32_t *be, esp_slab *w)
{
    softsort_matrix(K, n, w->Ap + (size_t)l * n, al, c->inv_t, w->sa, w->P, w->csP);
    softsort_matrix(K, m, w->Bp + (size_t)l * m, be, c->inv_t, w->sb, w->R, w->csR);
}

static void soft_forward(const bki_kernels *K, const esp_cfg *c, int n, int m, const float *V, int64_t ldv, float *O,
                         int64_t ldo, int32_t *alpha, int32_t *beta, esp_slab *w, const bk_tensor *attn_b,
                         bk_esp_diag *dg)
{
    const int L = c->L, d = c->d, dv = c->dv;
    const int np = bki_nw_pairs(n, m, w->pr, w->ps, w->pc);
    const float inv_nm = (float)(1.0 / ((double)n * m)), cs = c->paper ? 1.0f : (float)n;
    if (c->euclid) cost_matrix(c, n, m, w, w->E);
    float mx = -INFINITY;
    double z = 0.0;
    memset(w->Oacc, 0, sizeof(float) * (size_t)n * dv);
    memset(w->rs, 0, sizeof(float) * (size_t)n);
    memset(w->cs, 0, sizeof(float) * (size_t)m);
    for (int l = 0; l < L; l++) {
        int32_t *al = alpha + (size_t)l * n, *be = beta + (size_t)l * m;
        bki_argsort(n, w->Ap + (size_t)l * n, 1, al, w->sortscr);
        bki_argsort(m, w->Bp + (size_t)l * m, 1, be, w->sortscr);
        slice_sorts(K, c, n, m, l, al, be, w);
        double D;
        if (!c->euclid) {
            /* D = (1/n) sum_i |q_i|^2 csP_i + (1/m) sum_j |k_j|^2 csR_j - 2 <P Q, W R K> */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, d, m, 1.0f, w->R, m, w->Kt, d, 0.0f, w->X, d);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dv, m, 1.0f, w->R, m, V, (int)ldv, 0.0f, w->Y, dv);
            apply_W(np, w->pr, w->ps, w->pc, inv_nm, w->X, d, w->WX, d, d, n);
            apply_W(np, w->pr, w->ps, w->pc, inv_nm, w->Y, dv, w->WY, dv, dv, n);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, n, 1.0f, w->P, n, w->Qt, d, 0.0f, w->PQ, d);
            D = (double)dotf((size_t)n, w->qn, w->csP) / n + (double)dotf((size_t)m, w->kn, w->csR) / m -
                2.0 * dotf((size_t)n * d, w->PQ, w->WX);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, dv, n, cs, w->P, n, w->WY, dv, 0.0f, w->Ol, dv);
        } else {
            /* U = P^T (W R) formed densely; D = <E, U>; O_l = cs U V */
            apply_W(np, w->pr, w->ps, w->pc, inv_nm, w->R, m, w->M, m, m, n);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, m, n, 1.0f, w->P, n, w->M, m, 0.0f, w->U, m);
            D = dotf((size_t)n * m, w->E, w->U);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, dv, m, cs, w->U, m, V, (int)ldv, 0.0f, w->Ol, dv);
        }
        w->Dl[l] = (float)D;
        /* online softmax over slices: O = sum_l e^{x_l} O_l / sum_l e^{x_l} */
        float x = -c->tau * w->Dl[l];
        if (x > mx) {
            float f = mx == -INFINITY ? 0.0f : expf(mx - x);
            for (size_t i = 0; i < (size_t)n * dv; i++) w->Oacc[i] *= f;
            for (int i = 0; i < n; i++) w->rs[i] *= f;
            for (int j = 0; j < m; j++) w->cs[j] *= f;
            z *= f;
            mx = x;
        }
        float wt = expf(x - mx);
        for (size_t i = 0; i < (size_t)n * dv; i++) w->Oacc[i] += wt * w->Ol[i];
        for (int i = 0; i < n; i++) w->rs[i] += wt * w->csP[i];
        for (int j = 0; j < m; j++) w->cs[j] += wt * w->csR[j];
        z += wt;
    }
    slice_weights(L, c->tau, w->Dl, w->sig);
    const float iz = (float)(1.0 / z);
    for (int i = 0; i < n; i++)
        for (int x = 0; x < dv; x++) O[(int64_t)i * ldo + x] = w->Oacc[(size_t)i * dv + x] * iz;
    if (dg) {
        float re = 0.0f, ce = 0.0f;
        for (int i = 0; i < n; i++) re = fmaxf(re, fabsf(w->rs[i] * iz - 1.0f));
        for (int j = 0; j < m; j++) ce = fmaxf(ce, fabsf(w->cs[j] * iz - 1.0f));
        dg->row_err = re;
        dg->col_err = ce;
    }
    if (attn_b) { /* dense A = cs sum_l sigma_l P_l^T W R_l: small problems only */
        for (int l = 0; l < L; l++) {
            slice_sorts(K, c, n, m, l, alpha + (size_t)l * n, beta + (size_t)l * m, w);
            for (int k = 0; k < np; k++)
                cblas_sger(CblasRowMajor, n, m, (float)(cs * w->sig[l] * w->pc[k] * inv_nm), w->P + (size_t)w->pr[k] * n,
                           1, w->R + (size_t)w->ps[k] * m, 1, attn_b->data, (int)attn_b->stride_n);
        }
    }
}

static void soft_backward(const bki_kernels *K, const esp_cfg *c, int n, int m, const float *V, int64_t ldv,
                          const float *dO, int64_t lddo, const int32_t *alpha, const int32_t *beta, const float *sig,
                          float *dQ, int64_t ldq, float *dK, int64_t ldk, float *dV, int64_t lddv, float *dth,
                          esp_slab *w)
{
    const int L = c->L, d = c->d, dv = c->dv;
    const int np = bki_nw_pairs(n, m, w->pr, w->ps, w->pc);
    const float inv_nm = (float)(1.0 / ((double)n * m)), cs = c->paper ? 1.0f : (float)n;
    if (c->euclid) {
        cost_matrix(c, n, m, w, w->E);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, dv, 1.0f, dO, (int)lddo, V, (int)ldv, 0.0f, w->dA, m);
        memset(w->dE, 0, sizeof(float) * (size_t)n * m);
    }
    /* pass 1: dsigma_l = <dO, O_l> */
    double sd = 0.0;
    for (int l = 0; l < L; l++) {
        slice_sorts(K, c, n, m, l, alpha + (size_t)l * n, beta + (size_t)l * m, w);
        double ds;
        if (!c->euclid) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dv, m, 1.0f, w->R, m, V, (int)ldv, 0.0f, w->Y, dv);
            apply_W(np, w->pr, w->ps, w->pc, inv_nm, w->Y, dv, w->WY, dv, dv, n);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, dv, n, 1.0f, w->P, n, dO, (int)lddo, 0.0f, w->Z, dv);
            ds = (double)cs * dotf((size_t)n * dv, w->Z, w->WY);
        } else {
            apply_W(np, w->pr, w->ps, w->pc, inv_nm, w->R, m, w->M, m, m, n);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, m, n, 1.0f, w->P, n, w->M, m, 0.0f, w->U, m);
            ds = (double)cs * dotf((size_t)n * m, w->dA, w->U);
        }
        w->dsig[l] = (float)ds;
        sd += sig[l] * ds;
    }
    for (int j = 0; j < m; j++) memset(dV + (int64_t)j * lddv, 0, sizeof(float) * (size_t)dv);
    memset(w->dQt, 0, sizeof(float) * (size_t)n * d);
    memset(w->dKt, 0, sizeof(float) * (size_t)m * d);
    /* pass 2: per-slice gradients */
    for (int l = 0; l < L; l++) {
        const int32_t *al = alpha + (size_t)l * n, *be = beta + (size_t)l * m;
        const float dD = (float)(-c->tau * sig[l] * (w->dsig[l] - sd)), cws = cs * sig[l];
        slice_sorts(K, c, n, m, l, al, be, w);
        if (!c->euclid) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dv, m, 1.0f, w->R, m, V, (int)ldv, 0.0f, w->Y, dv);
            apply_W(np, w->pr, w->ps, w->pc, inv_nm, w->Y, dv, w->WY, dv, dv, n);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, dv, n, 1.0f, w->P, n, dO, (int)lddo, 0.0f, w->Z, dv);
            apply_WT(np, w->pr, w->ps, w->pc, inv_nm, w->Z, dv, w->WTZ, dv, dv, m);
            /* dV += cs sigma R^T W^T P dO */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, dv, m, cws, w->R, m, w->WTZ, dv, 1.0f, dV, (int)lddv);
            /* dP = cs sigma (W R V) dO^T ; dR = cs sigma (W^T P dO) V^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, dv, cws, w->WY, dv, dO, (int)lddo, 0.0f, w->dP, n);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, m, dv, cws, w->WTZ, dv, V, (int)ldv, 0.0f, w->dR, m);
            if (dD != 0.0f) { /* the squared cost's part */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, d, m, 1.0f, w->R, m, w->Kt, d, 0.0f, w->X, d);
                apply_W(np, w->pr, w->ps, w->pc, inv_nm, w->X, d, w->WX, d, d, n);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, n, 1.0f, w->P, n, w->Qt, d, 0.0f, w->PQ, d);
                apply_WT(np, w->pr, w->ps, w->pc, inv_nm, w->PQ, d, w->WTPQ, d, d, m);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, d, -2.0f * dD, w->WX, d, w->Qt, d, 1.0f, w->dP, n);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, m, d, -2.0f * dD, w->WTPQ, d, w->Kt, d, 1.0f, w->dR, m);
                const float an = dD / (float)n, am = dD / (float)m;
                for (int r = 0; r < n; r++)
                    for (int i = 0; i < n; i++) w->dP[(size_t)r * n + i] += an * w->qn[i];
                for (int s = 0; s < m; s++)
                    for (int j = 0; j < m; j++) w->dR[(size_t)s * m + j] += am * w->kn[j];
                /* dQ~ += dD ((2/n) csP_i q_i - 2 P^T W R K); dK~ likewise */
                for (int i = 0; i < n; i++)
                    for (int x = 0; x < d; x++) w->dQt[(size_t)i * d + x] += 2.0f * an * w->csP[i] * w->Qt[(size_t)i * d + x];
                for (int j = 0; j < m; j++)
                    for (int x = 0; x < d; x++) w->dKt[(size_t)j * d + x] += 2.0f * am * w->csR[j] * w->Kt[(size_t)j * d + x];
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, n, -2.0f * dD, w->P, n, w->WX, d, 1.0f, w->dQt, d);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, d, m, -2.0f * dD, w->R, m, w->WTPQ, d, 1.0f, w->dKt, d);
            }
        } else {
            apply_W(np, w->pr, w->ps, w->pc, inv_nm, w->R, m, w->M, m, m, n);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, m, n, 1.0f, w->P, n, w->M, m, 0.0f, w->U, m);
            /* dV += cs sigma U^T dO ; dE += dD U ; dU = cs sigma dA + dD E */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, dv, n, cws, w->U, m, dO, (int)lddo, 1.0f, dV, (int)lddv);
            for (size_t i = 0; i < (size_t)n * m; i++) {
                w->dE[i] += dD * w->U[i];
                w->dU[i] = cws * w->dA[i] + dD * w->E[i];
            }
            /* dP = (W R) dU^T ; dM = P dU (into U) ; dR = W^T dM */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, m, 1.0f, w->M, m, w->dU, m, 0.0f, w->dP, n);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, m, n, 1.0f, w->P, n, w->dU, m, 0.0f, w->U, m);
            apply_WT(np, w->pr, w->ps, w->pc, inv_nm, w->U, m, w->dR, m, m, m);
        }
        /* SoftSort backward, through the softmax and the sorted values */
        float *da = w->Da + (size_t)l * n, *db = w->Db + (size_t)l * m;
        memset(da, 0, sizeof(float) * (size_t)n);
        memset(db, 0, sizeof(float) * (size_t)m);
        const float *a = w->Ap + (size_t)l * n, *b = w->Bp + (size_t)l * m;
        for (int r = 0; r < n; r++)
            da[al[r]] -= K->softsort_row_bwd(n, a, w->sa[r], c->inv_t, w->P + (size_t)r * n, w->dP + (size_t)r * n, da);
        for (int s = 0; s < m; s++)
            db[be[s]] -= K->softsort_row_bwd(m, b, w->sb[s], c->inv_t, w->R + (size_t)s * m, w->dR + (size_t)s * m, db);
    }
    /* projections: dQ~ += Da^T Theta, dK~ += Db^T Theta, dTheta = Da Q~ + Db K~ */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, L, 1.0f, w->Da, n, c->theta, d, 1.0f, w->dQt, d);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, d, L, 1.0f, w->Db, m, c->theta, d, 1.0f, w->dKt, d);
    if (dth) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, d, n, 1.0f, w->Da, n, w->Qt, d, 0.0f, dth, d);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, d, m, 1.0f, w->Db, m, w->Kt, d, 1.0f, dth, d);
    }
    if (c->euclid) /* through the distances: d|q - k| = (q - k)/|q - k| (0 at 0) */
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) {
                float e = w->E[(size_t)i * m + j], g = w->dE[(size_t)i * m + j];
                if (e == 0.0f || g == 0.0f) continue;
                g /= e;
                for (int x = 0; x < d; x++) {
                    float t = g * (w->Qt[(size_t)i * d + x] - w->Kt[(size_t)j * d + x]);
                    w->dQt[(size_t)i * d + x] += t;
                    w->dKt[(size_t)j * d + x] -= t;
                }
            }
    for (int i = 0; i < n; i++)
        for (int x = 0; x < d; x++) dQ[(int64_t)i * ldq + x] = c->s * w->dQt[(size_t)i * d + x];
    for (int j = 0; j < m; j++)
        for (int x = 0; x < d; x++) dK[(int64_t)j * ldk + x] = c->s * w->dKt[(size_t)j * d + x];
}

/* ------------------------------------------------------------------------ */
/* drivers                                                                    */
/* ------------------------------------------------------------------------ */
static bk_status check_all(const bk_attn_desc *d, const bk_esp_params *p, const bk_tensor *q, const bk_tensor *k,
                           const bk_tensor *v)
{
    bk_status s;
    if ((s = bki_check_desc(d))) return s;
    if ((s = check_params(p, d->d))) return s;
    return bki_check_qkv(d, q, k, v);
}

static esp_cfg resolve(const bk_attn_desc *d, const bk_esp_params *p, const float *theta)
{
    esp_cfg c;
    c.L = bk_esp_num_slices(p, d->d);
    c.d = d->d;
    c.dv = d->dv;
    c.soft = p->sort == BK_ESP_SOFT;
    c.euclid = p->cost == BK_ESP_COST_EUCLID;
    c.paper = p->out_scale == BK_ESP_SCALE_PAPER;
    c.s = p->scale != 0.0f ? p->scale : 1.0f / sqrtf((float)d->d);
    c.inv_t = c.soft ? 1.0f / p->t : 0.0f;
    c.tau = p->tau;
    c.theta = theta;
    return c;
}

/* Inside a parallel region: this thread's slab of the workspace; the soft
 * path also switches the FPU to flush-to-zero / denormals-are-zero (the
 * previous control word is returned in *csr, restored by the caller). */
static esp_slab thread_slab(const bk_attn_desc *d, const esp_cfg *c, char *slabs, size_t sb, unsigned *csr)
{
    const int tid = bki_thread_id();
    *csr = _mm_getcsr();
    if (c->soft) _mm_setcsr(*csr | 0x8040);
    return carve(bki_align_ptr(slabs + (size_t)tid * sb), sb - BK_ALIGN, d->Nq, d->Nk, d->d, d->dv, c->L, c->soft,
                 c->euclid);
}

static void forward_core(const bk_attn_desc *d, const bk_esp_params *p, const esp_cfg *c, const bk_tensor *q,
                         const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                         const bk_esp_extras *ex, char *slabs, size_t sb, int nt)
{
    const int P = d->B * d->H, L = c->L;
    esp_tape_header *th = tape;
    memset(th, 0, sizeof *th);
    th->magic = ESP_MAGIC;
    th->version = ESP_VERSION;
    th->B = d->B; th->H = d->H; th->Nq = d->Nq; th->Nk = d->Nk; th->d = d->d; th->L = L;
    th->sort = p->sort; th->cost = p->cost; th->out_scale = p->out_scale;
    th->tau = p->tau; th->t = c->soft ? p->t : 0.0f; th->s = c->s;
    const bki_kernels *K = bki_kern();
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
        unsigned csr;
        esp_slab w = thread_slab(d, c, slabs, sb, &csr);
#pragma omp for schedule(static)
        for (int pi = 0; pi < P; pi++) {
            const int b = pi / d->H, h = pi % d->H;
            const int n = bki_len(d->q_len, b, d->Nq), m = bki_len(d->k_len, b, d->Nk);
            int32_t *blk = tape_block(tape, d, L, pi);
            float *sig_t = (float *)(blk + 16), *D_t = sig_t + L;
            int32_t *alpha = (int32_t *)(D_t + L), *beta = alpha + (size_t)L * d->Nq;
            blk[0] = n;
            blk[1] = m;
            float *Ob = out ? bki_at(out, b, h) : NULL;
            const bk_tensor *ab = NULL;
            bk_tensor abv;
            if (ex && ex->attn.data) {
                abv = ex->attn;
                abv.data = bki_at(&ex->attn, b, h);
                bki_zero_rows(abv.data, abv.stride_n, 0, d->Nq, d->Nk);
                ab = &abv;
            }
            bk_esp_diag dg = {0.0f, 0.0f};
            if (n > 0 && m > 0) {
                prepare(c, n, m, bki_at(q, b, h), q->stride_n, bki_at(k, b, h), k->stride_n, &w);
                /* a forward run only for its tape (by a backward) discards O */
                if (c->soft)
                    soft_forward(K, c, n, m, bki_at(v, b, h), v->stride_n, Ob ? Ob : w.Ol, Ob ? out->stride_n : d->dv,
                                 alpha, beta, &w, ab, &dg);
                else
                    hard_forward(c, n, m, bki_at(v, b, h), v->stride_n, Ob, Ob ? out->stride_n : 0, alpha, beta, &w, ab,
                                 &dg);
                memcpy(sig_t, w.sig, sizeof(float) * (size_t)L);
                memcpy(D_t, w.Dl, sizeof(float) * (size_t)L);
            } else {
                memset(sig_t, 0, sizeof(float) * 2 * (size_t)L);
            }
            if (Ob) bki_zero_rows(Ob, out->stride_n, n > 0 && m > 0 ? n : 0, d->Nq, d->dv);
            if (ex) {
                if (ex->sigma) memcpy(ex->sigma + (size_t)pi * L, sig_t, sizeof(float) * (size_t)L);
                if (ex->D) memcpy(ex->D + (size_t)pi * L, D_t, sizeof(float) * (size_t)L);
                if (ex->diag) ex->diag[pi] = dg;
            }
        }
        _mm_setcsr(csr);
    }
}

bk_status bk_esp_forward(const bk_attn_desc *desc, const bk_esp_params *p, const bk_tensor *q, const bk_tensor *k,
                         const bk_tensor *v, const bk_tensor *out, void *tape, const bk_esp_extras *extras, void *ws,
                         size_t ws_size)
{
    bk_status s;
    if ((s = check_all(desc, p, q, k, v))) return s;
    const bk_attn_desc *d = desc;
    if ((s = bki_check_fwd_outputs(d, q, k, v, out, extras ? &extras->attn : NULL))) return s;
    const int nt = bki_work_threads(d->B * d->H), L = bk_esp_num_slices(p, d->d);
    const size_t sb = slab_bytes(d->Nq, d->Nk, d->d, d->dv, L, p->sort == BK_ESP_SOFT, p->cost == BK_ESP_COST_EUCLID);
    const size_t need = ws_need(d, p, L, nt, tape == NULL, 0);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(ws, ws_size, need, "bk_esp_workspace_size", &owned, &base))) return s;
    char *thp = bki_align_ptr(base + (size_t)nt * sb + BK_ALIGN);
    float *theta = (float *)thp;
    fill_slices(p, d->d, L, theta);
    void *tp = tape ? tape : (void *)bki_align_ptr(thp + fl((size_t)L * d->d) + BK_ALIGN);
    esp_cfg c = resolve(d, p, theta);
    forward_core(d, p, &c, q, k, v, out, tp, extras, base, sb, nt);
    free(owned);
    bki_clear_error();
    return BK_OK;
}

bk_status bk_esp_backward(const bk_attn_desc *desc, const bk_esp_params *p, const bk_tensor *q, const bk_tensor *k,
                          const bk_tensor *v, const bk_tensor *dout, const void *tape_in, const bk_tensor *dq,
                          const bk_tensor *dk, const bk_tensor *dv, float *dtheta, void *ws, size_t ws_size)
{
    bk_status s;
    if ((s = check_all(desc, p, q, k, v))) return s;
    const bk_attn_desc *d = desc;
    if ((s = bki_check_bwd_views(d, q, k, v, dout, dq, dk, dv))) return s;
    const int nt = bki_work_threads(d->B * d->H), L = bk_esp_num_slices(p, d->d), P = d->B * d->H;
    const esp_cfg c0 = resolve(d, p, NULL);
    if (tape_in) {
        const esp_tape_header *th = tape_in;
        if (th->magic != ESP_MAGIC || th->version != ESP_VERSION)
            return bki_fail(BK_ERR_TAPE, "tape has a bad magic number or version (not written by bk_esp_forward?)");
        if (th->B != d->B || th->H != d->H || th->Nq != d->Nq || th->Nk != d->Nk || th->d != d->d || th->L != L ||
            th->sort != (int)p->sort || th->cost != (int)p->cost || th->out_scale != (int)p->out_scale ||
            th->tau != p->tau || th->t != (c0.soft ? p->t : 0.0f) || th->s != c0.s)
            return bki_fail(BK_ERR_TAPE, "tape was written for another problem or other parameters");
        for (int pi = 0; pi < P; pi++) {
            const int32_t *blk = tape_block(tape_in, d, L, pi);
            int b = pi / d->H;
            if (blk[0] != bki_len(d->q_len, b, d->Nq) || blk[1] != bki_len(d->k_len, b, d->Nk))
                return bki_fail(BK_ERR_TAPE, "tape block %d does not match the valid lengths", pi);
            /* orders (stored with the valid lengths as strides) must index valid rows */
            const int32_t *al = blk + 16 + 2 * L, *be = al + (size_t)L * d->Nq;
            const int n = blk[0], m = blk[1];
            for (int l = 0; l < L && n > 0 && m > 0; l++) {
                for (int r = 0; r < n; r++)
                    if (al[(size_t)l * n + r] < 0 || al[(size_t)l * n + r] >= n)
                        return bki_fail(BK_ERR_TAPE, "tape block %d holds an invalid sort order", pi);
                for (int r = 0; r < m; r++)
                    if (be[(size_t)l * m + r] < 0 || be[(size_t)l * m + r] >= m)
                        return bki_fail(BK_ERR_TAPE, "tape block %d holds an invalid sort order", pi);
            }
        }
    }
    const size_t sb = slab_bytes(d->Nq, d->Nk, d->d, d->dv, L, c0.soft, c0.euclid);
    const size_t need = ws_need(d, p, L, nt, tape_in == NULL, 1);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(ws, ws_size, need, "bk_esp_workspace_size", &owned, &base))) return s;
    char *thp = bki_align_ptr(base + (size_t)nt * sb + BK_ALIGN);
    float *theta = (float *)thp;
    fill_slices(p, d->d, L, theta);
    float *dth_all = (float *)bki_align_ptr(thp + fl((size_t)L * d->d) + BK_ALIGN);
    const void *tape = tape_in;
    esp_cfg c = resolve(d, p, theta);
    if (!tape) {
        void *tp = bki_align_ptr((char *)dth_all + fl((size_t)P * L * d->d) + BK_ALIGN);
        forward_core(d, p, &c, q, k, v, NULL, tp, NULL, base, sb, nt);
        tape = tp;
    }
    const bki_kernels *K = bki_kern();
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
        unsigned csr;
        esp_slab w = thread_slab(d, &c, base, sb, &csr);
#pragma omp for schedule(static)
        for (int pi = 0; pi < P; pi++) {
            const int b = pi / d->H, h = pi % d->H;
            const int32_t *blk = tape_block(tape, d, L, pi);
            const int n = blk[0], m = blk[1];
            const float *sig = (const float *)(blk + 16);
            const int32_t *alpha = blk + 16 + 2 * L, *beta = alpha + (size_t)L * d->Nq;
            float *dQb = bki_at(dq, b, h), *dKb = bki_at(dk, b, h), *dVb = bki_at(dv, b, h);
            float *dth = dth_all + (size_t)pi * L * d->d;
            memset(dth, 0, sizeof(float) * (size_t)L * d->d);
            if (n > 0 && m > 0) {
                prepare(&c, n, m, bki_at(q, b, h), q->stride_n, bki_at(k, b, h), k->stride_n, &w);
                if (c.soft)
                    soft_backward(K, &c, n, m, bki_at(v, b, h), v->stride_n, bki_at(dout, b, h), dout->stride_n, alpha,
                                  beta, sig, dQb, dq->stride_n, dKb, dk->stride_n, dVb, dv->stride_n, dth, &w);
                else
                    hard_backward(&c, n, m, bki_at(v, b, h), v->stride_n, bki_at(dout, b, h), dout->stride_n, alpha,
                                  beta, sig, dQb, dq->stride_n, dKb, dk->stride_n, dVb, dv->stride_n, &w);
            }
            const int live = n > 0 && m > 0;
            bki_zero_rows(dQb, dq->stride_n, live ? n : 0, d->Nq, d->d);
            bki_zero_rows(dKb, dk->stride_n, live ? m : 0, d->Nk, d->d);
            bki_zero_rows(dVb, dv->stride_n, live ? m : 0, d->Nk, d->dv);
        }
        _mm_setcsr(csr);
    }
    if (dtheta) { /* fixed problem order: independent of the thread count */
        memset(dtheta, 0, sizeof(float) * (size_t)L * d->d);
        if (c.soft)
            for (int pi = 0; pi < P; pi++)
                for (size_t i = 0; i < (size_t)L * d->d; i++) dtheta[i] += dth_all[(size_t)pi * L * d->d + i];
    }
    free(owned);
    bki_clear_error();
    return BK_OK;
}
