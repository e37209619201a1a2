/* otk.c -- the OTK embedding (Mialon et al. 2021): pool a set onto q
 * trainable references through an entropic OT plan, after a Nystrom kernel
 * map. Semantics in include/birkhoff/otk.h, derivations in docs/ALGORITHMS.md
 * section 6.
 *
 * Per set b (the parallel unit): psi = Nystrom(x_b) (n_b x k), then for each
 * reference h the n_b x p plan, on the shared LSE/Sinkhorn engine (LOG: 2L
 * half-steps, row first; the engine returns A = n_b P) or on the scaling-form
 * iteration below (SCALING), and out_h = (c / n_b) (A (x) S)^T psi.
 * The backward replays each plan from its potentials (the tape), so memory
 * does not grow with L beyond O(L (n + p)) per problem; psi is recomputed.
 * Gradients shared over the batch (z, W and the Nystrom matrix M) are
 * accumulated per set and summed in set order.
 *
 * Parallel model (internal.h): the B sets run one per thread, or one at a
 * time by a team of all threads (bki_plan), through the same per-set code:
 * rows in fixed row blocks (bki_row_block of the set's valid length), the
 * GEMMs through bki_gemm, the plans on the team-aware engine or on the
 * scaling iteration with per-block partial column sums added in block order.
 * So results are bitwise the same for any thread count and batch shape. The
 * anchor Gram's eigendecomposition (once per call) stays serial. */
#include "ops.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define OTK_MAGIC 0x4b544f42u /* "BOTK" */
#define OTK_VERSION 2u /* 2: the Nystrom section after the potentials */
#define OTK_NORM2_MIN 1e-4f    /* the reference's clamp of |x|^2 */

bk_otk_config bk_otk_config_default(void)
{
    bk_otk_config p;
    memset(&p, 0, sizeof p);
    p.sigma = 0.5f;
    p.eta = 1e-2f;
    p.eps = 0.5f;
    p.iters = 20; /* half-steps: 10 iterations */
    p.sigma_pos = 0.1f;
    return p;
}

static size_t fl(size_t n) { return bki_round_up(n * sizeof(float)); }

/* ---- validation ------------------------------------------------------------ */
bk_status bki_otk_check_desc(const bk_otk_desc *d)
{
    if (!d) return bki_fail(BK_ERR_NULL, "OTK descriptor is NULL");
    if (d->B < 1 || d->n < 1 || d->d < 1 || d->q < 1 || d->p < 1 || d->k < 1)
        return bki_fail(BK_ERR_SHAPE, "OTK sizes must be >= 1 (B=%d n=%d d=%d q=%d p=%d k=%d)", d->B, d->n, d->d,
                        d->q, d->p, d->k);
    if ((int64_t)d->n * d->p > ((int64_t)1 << 36) || (int64_t)d->n * d->k > ((int64_t)1 << 36) ||
        d->d > (1 << 24) || d->k > (1 << 16) || (int64_t)d->q * d->k > (1 << 26))
        return bki_fail(BK_ERR_SHAPE, "OTK problem too large (n=%d p=%d k=%d)", d->n, d->p, d->k);
    if (d->len)
        for (int b = 0; b < d->B; b++)
            if (d->len[b] < 1 || d->len[b] > d->n)
                return bki_fail(BK_ERR_LENGTH, "set %d has %d valid elements, outside [1, n=%d] (empty sets are refused)",
                                b, (int)d->len[b], d->n);
    return BK_OK;
}

static bk_status check_params(const bk_otk_desc *d, const bk_otk_config *p)
{
    if (!p) return bki_fail(BK_ERR_NULL, "OTK parameters are NULL");
    if (!(p->eps > 0.0f) || !isfinite(p->eps)) return bki_fail(BK_ERR_PARAM, "eps must be finite and > 0, got %g", (double)p->eps);
    if (p->iters < 2 || p->iters > 2000000 || p->iters % 2)
        return bki_fail(BK_ERR_PARAM,
                        "iters counts half-steps and OTK runs whole (row, column) iterations: it must be even, in "
                        "[2, 2e6] (2 L for L iterations), got %d",
                        p->iters);
    if (p->domain != BK_OTK_LOG && p->domain != BK_OTK_SCALING) return bki_fail(BK_ERR_PARAM, "unknown OTK domain %d", (int)p->domain);
    if (p->convention != BK_OTK_PAPER && p->convention != BK_OTK_REFERENCE)
        return bki_fail(BK_ERR_PARAM, "unknown OTK convention %d", (int)p->convention);
    if (p->isqrt_grad != BK_OTK_ISQRT_EXACT && p->isqrt_grad != BK_OTK_ISQRT_REFERENCE)
        return bki_fail(BK_ERR_PARAM, "unknown isqrt_grad mode %d", (int)p->isqrt_grad);
    if (p->W) {
        if (!(p->sigma > 0.0f) || !isfinite(p->sigma) || !isfinite(1.0f / (p->sigma * p->sigma)))
            return bki_fail(BK_ERR_PARAM, "sigma must be finite and > 0 (with 1/sigma^2 finite), got %g", (double)p->sigma);
        if (!(p->eta >= 0.0f) || !isfinite(p->eta)) return bki_fail(BK_ERR_PARAM, "eta must be finite and >= 0, got %g", (double)p->eta);
        for (size_t i = 0; i < (size_t)d->k * d->d; i++)
            if (!isfinite(p->W[i])) return bki_fail(BK_ERR_NONFINITE, "anchors W have a non-finite value at %zu", i);
    } else if (d->k != d->d) {
        return bki_fail(BK_ERR_SHAPE, "without anchors psi is the identity: k (%d) must equal d (%d)", d->k, d->d);
    }
    if (p->pe == BK_OTK_PE_NONE) return BK_OK;
    if (p->pe != BK_OTK_PE_1D && p->pe != BK_OTK_PE_2D) return bki_fail(BK_ERR_PARAM, "unknown OTK positional encoding %d", (int)p->pe);
    if (!(p->sigma_pos > 0.0f) || !isfinite(p->sigma_pos)) return bki_fail(BK_ERR_PARAM, "sigma_pos must be finite and > 0, got %g", (double)p->sigma_pos);
    if (p->pe == BK_OTK_PE_2D) {
        const int s = (int)lround(sqrt((double)d->p));
        if (s * s != d->p) return bki_fail(BK_ERR_SHAPE, "2-D positional encoding needs p to be a square, got p=%d", d->p);
        if (p->grid_h < 1 || p->grid_w < 1 || (int64_t)p->grid_h * p->grid_w != d->n)
            return bki_fail(BK_ERR_SHAPE, "2-D positional encoding needs grid_h * grid_w = n (%d x %d vs n=%d)", p->grid_h,
                            p->grid_w, d->n);
        if (d->len)
            for (int b = 0; b < d->B; b++)
                if (d->len[b] != d->n) return bki_fail(BK_ERR_LENGTH, "2-D positional encoding does not take padded sets (set %d)", b);
    }
    return BK_OK;
}

static bk_status check_dense(const char *name, const float *a, size_t count)
{
    if (!a) return bki_fail(BK_ERR_NULL, "%s is NULL", name);
    for (size_t i = 0; i < count; i++)
        if (!isfinite(a[i])) return bki_fail(BK_ERR_NONFINITE, "%s has a non-finite value at %zu", name, i);
    return BK_OK;
}

static bk_tensor dense_view(const float *a, int rows, int cols)
{
    bk_tensor t = {(float *)a, (int64_t)rows * cols, (int64_t)rows * cols, cols, BK_DEVICE_HOST, BK_F32};
    return t;
}

/* ---- Nystrom matrix M = h(G), G = exp(alpha (W W^T - 1)) --------------------- */
typedef struct {
    double *G, *V, *e;         /* k x k Gram, eigenvectors (columns), eigenvalues */
    double *Wd;                /* k x d: W in double                              */
    double *acc;               /* 2 d: a row of the backward's dW, per row half   */
    float *M;                  /* k x k, float                                    */
} nys_global;

static size_t nys_bytes(int k, int d)
{
    return 2 * bki_round_up((size_t)k * k * sizeof(double)) + bki_round_up((size_t)k * sizeof(double)) +
           bki_round_up((size_t)k * d * sizeof(double)) + bki_round_up(2 * (size_t)d * sizeof(double)) + fl((size_t)k * k) +
           6 * BK_ALIGN;
}

static nys_global nys_carve(int k, int d, char *base)
{
    bki_arena ar = {bki_align_ptr(base), 0, nys_bytes(k, d)};
    nys_global g;
    g.G = bki_take(&ar, (size_t)k * k * sizeof(double));
    g.V = bki_take(&ar, (size_t)k * k * sizeof(double));
    g.e = bki_take(&ar, (size_t)k * sizeof(double));
    g.Wd = bki_take(&ar, (size_t)k * d * sizeof(double));
    g.acc = bki_take(&ar, 2 * (size_t)d * sizeof(double));
    g.M = bki_take(&ar, (size_t)k * k * sizeof(float));
    return g;
}

/* G, its eigendecomposition and M = V diag(h(e)) V^T; s1, s2: k x k scratch */
static bk_status nys_setup(const bk_otk_desc *d, const bk_otk_config *p, nys_global *g, double *s1, double *s2)
{
    const int k = d->k, dd = d->d;
    const double alpha = 1.0 / ((double)p->sigma * p->sigma);
    /* W W^T in double (one BLAS call, its lower triangle), then G mirrored */
    for (size_t i = 0; i < (size_t)k * dd; i++) g->Wd[i] = p->W[i];
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, k, dd, 1.0, g->Wd, dd, 0.0, g->G, k);
    for (int a = 0; a < k; a++)
        for (int b = 0; b <= a; b++) {
            const double s = g->G[(size_t)a * k + b];
            g->G[(size_t)a * k + b] = g->G[(size_t)b * k + a] = exp(alpha * (s - 1.0));
        }
    memcpy(g->V, g->G, sizeof(double) * (size_t)k * k);
    lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', k, g->V, k, g->e);
    if (info != 0) return bki_fail(BK_ERR_NUMERIC, "eigendecomposition of the anchor Gram matrix failed (LAPACK info %d)", (int)info);
    /* M = (V diag(h)) V^T, one GEMM (single-threaded: the caller's region);
     * its lower triangle, mirrored */
    double *h = s2;
    for (int m = 0; m < k; m++) h[m] = 1.0 / (sqrt(g->e[m] > 0.0 ? g->e[m] : 0.0) + p->eta);
    for (int a = 0; a < k; a++)
        for (int m = 0; m < k; m++) s1[(size_t)a * k + m] = g->V[(size_t)a * k + m] * h[m];
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, k, k, k, 1.0, s1, k, g->V, k, 0.0, s2, k);
    for (int a = 0; a < k; a++)
        for (int b = 0; b <= a; b++) {
            const double s = s2[(size_t)a * k + b];
            if (!isfinite(s)) return bki_fail(BK_ERR_NUMERIC, "anchor Gram matrix is singular and eta = 0: set eta > 0");
            g->M[(size_t)a * k + b] = g->M[(size_t)b * k + a] = (float)s;
        }
    return BK_OK;
}

/* half h (0 or 1) of k rows: [*a0, *a1), the first (k + 1) / 2 rows, then the rest */
static void half_rows(int k, int h, int *a0, int *a1)
{
    *a0 = h ? (k + 1) / 2 : 0;
    *a1 = h ? k : (k + 1) / 2;
}

/* dW += (D + D^T) W with D = dG (x) alpha G, dG the gradient through h,
 * by a team: every stage in two fixed halves of the k rows (a function of k
 * only, so the bits do not depend on the thread count), a member per half
 * where there are two. dM, tmp, tmp2: k x k; dM is overwritten (it is
 * read only before the first sync). (On one thread this was 1.2 % of OTK's
 * forward + backward at the benchmark's shape, with the other core idle.) */
static void nys_backward_global(const bki_team *tm, const bk_otk_desc *d, const bk_otk_config *p, const nys_global *g,
                                double *dM, double *tmp, double *tmp2, float *dW)
{
    const int k = d->k, dd = d->d;
    const double alpha = 1.0 / ((double)p->sigma * p->sigma), eta = p->eta;
    const double *V = g->V;
    int h0, h1;
    bki_team_share(tm, 2, &h0, &h1);
    /* rows [a0, a1) of tmp = (V^T dM V) (x) F */
    for (int h = h0; h < h1; h++) {
        int a0, a1;
        half_rows(k, h, &a0, &a1);
        const int m = a1 - a0;
        if (m < 1) continue;
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, k, k, 1.0, V + a0, k, dM, k, 0.0, tmp2 + (size_t)a0 * k, k);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, k, 1.0, tmp2 + (size_t)a0 * k, k, V, k, 0.0,
                    tmp + (size_t)a0 * k, k);
        for (int a = a0; a < a1; a++) {
            const double ea = g->e[a], sa = sqrt(ea > 0 ? ea : 0), ta = sa + eta;
            for (int b = 0; b < k; b++) {
                const double eb = g->e[b], sb = sqrt(eb > 0 ? eb : 0), tb = sb + eta;
                double F;
                if (p->isqrt_grad == BK_OTK_ISQRT_REFERENCE) F = -1.0 / ((ta + tb) * ta * tb);
                else if (ea > 0 && eb > 0) F = -1.0 / (ta * tb * (sa + sb));
                else if (ea <= 0 && eb <= 0) F = 0.0;
                else F = (1.0 / ta - 1.0 / tb) / (ea - eb);
                tmp[(size_t)a * k + b] *= F;
            }
        }
    }
    bki_team_sync(tm);
    /* rows of dG = V tmp V^T (into dM's place), then D = dG (x) alpha G */
    for (int h = h0; h < h1; h++) {
        int a0, a1;
        half_rows(k, h, &a0, &a1);
        const int m = a1 - a0;
        if (m < 1) continue;
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, k, 1.0, V + (size_t)a0 * k, k, tmp, k, 0.0,
                    tmp2 + (size_t)a0 * k, k);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, k, k, 1.0, tmp2 + (size_t)a0 * k, k, V, k, 0.0,
                    dM + (size_t)a0 * k, k);
        for (size_t e = (size_t)a0 * k; e < (size_t)a1 * k; e++) dM[e] *= alpha * g->G[e];
    }
    bki_team_sync(tm);
    /* row a of (D + D^T) W, the terms added in b order for every column */
    for (int h = h0; h < h1; h++) {
        double *acc = g->acc + (size_t)h * dd;
        int a0, a1;
        half_rows(k, h, &a0, &a1);
        for (int a = a0; a < a1; a++) {
            memset(acc, 0, sizeof(double) * (size_t)dd);
            for (int b = 0; b < k; b++) {
                const double D = dM[(size_t)a * k + b] + dM[(size_t)b * k + a];
                const float *Wb = p->W + (size_t)b * dd;
                for (int c = 0; c < dd; c++) acc[c] += D * Wb[c];
            }
            for (int c = 0; c < dd; c++) dW[(size_t)a * dd + c] += (float)acc[c];
        }
    }
}

/* ---- the parallel model: sets over threads, rows in fixed blocks -------------------- */
/* How a call runs its B sets (bki_plan). Work of one set: the entries of its
 * n x p plan and n x k features. */
static bki_plan plan_of(const bk_otk_desc *d)
{
    return bki_plan_problems(d->B, (double)d->n * (d->p + d->k));
}

/* The fixed row blocks of an n-row matrix (those of the engine: a function of
 * n only) and this member's share [b0, b1) of them. */
typedef struct { int n, rb, nb, b0, b1; } rblocks;

static rblocks team_blocks(const bki_team *tm, int n)
{
    rblocks r = {n, bki_row_block(n), 0, 0, 0};
    r.nb = bki_nblocks(n, r.rb);
    bki_team_share(tm, r.nb, &r.b0, &r.b1);
    return r;
}
static int blk_lo(const rblocks *r, int b) { return b * r->rb; }
static int blk_hi(const rblocks *r, int b) { return (b + 1) * r->rb < r->n ? (b + 1) * r->rb : r->n; }
/* this member's rows [*i0, *i1): its blocks, contiguous */
static void team_rows(const bki_team *tm, int n, int *i0, int *i1)
{
    const rblocks r = team_blocks(tm, n);
    *i0 = r.b0 < r.b1 ? blk_lo(&r, r.b0) : 0;
    *i1 = r.b0 < r.b1 ? blk_hi(&r, r.b1 - 1) : 0;
}

/* ---- the buffers of one set in flight (a lane) ---------------------------------- */
typedef struct {
    float *xh, *r, *Bm, *psi, *dpsi;   /* n x d, n, n x k (x3)                */
    float *Ex;                         /* n x k: alpha (<w_l, xh_i> - 1)       */
    float *Lg, *A, *G, *S;             /* n x p logits, plan, adjoint, PE      */
    float *hist;                       /* potentials when no tape is kept      */
    float *aux;                        /* scaling domain: adjoint iterates     */
    float *part;                       /* BKI_MAX_BLOCKS x part_stride(p):
                                          per-block partial column sums       */
    float *emax;                       /* 2 BKI_MAX_BLOCKS block maxima        */
    double *dsum;                      /* BKI_MAX_BLOCKS block sums            */
    int *flag;                         /* 2 BKI_MAX_BLOCKS block flags         */
    float *scr;                        /* engine scratch for the team          */
} otk_slab;

/* the number of (row, column) iterations L: iters counts half-steps (even) */
static int full_iters(const bk_otk_config *p) { return p->iters / 2; }

static size_t hist_len(const bk_otk_desc *d, const bk_otk_config *p) { return bki_hist_len(d->n, d->p, p->iters); }
static size_t part_stride(int m) { return bki_round_up(sizeof(float) * (size_t)m) / sizeof(float); }

static size_t slab_bytes(const bk_otk_desc *d, const bk_otk_config *p, int members)
{
    const size_t n = (size_t)d->n, k = (size_t)d->k, P = (size_t)d->p;
    return fl(n * d->d) + fl(n) + 4 * fl(n * k) + 4 * fl(n * P) + fl(hist_len(d, p)) +
           fl(n + (size_t)p->iters * (n + P) + P) + fl(BKI_MAX_BLOCKS * part_stride(d->p)) +
           fl(2 * BKI_MAX_BLOCKS) + bki_round_up(BKI_MAX_BLOCKS * sizeof(double)) +
           bki_round_up(2 * BKI_MAX_BLOCKS * sizeof(int)) + fl(bki_kern()->sk_scratch(d->n, d->p, members)) +
           16 * BK_ALIGN;
}

/* lane li of the slabs of a call run as pl says */
static otk_slab slab_at(const bk_otk_desc *d, const bk_otk_config *p, bki_plan pl, char *slabs, int li)
{
    const int members = pl.team ? pl.nt : 1;
    const size_t n = (size_t)d->n, k = (size_t)d->k, P = (size_t)d->p, sb = slab_bytes(d, p, members);
    bki_arena ar = {bki_align_ptr(slabs + (size_t)li * sb), 0, sb - BK_ALIGN};
    otk_slab w;
    w.xh = bki_take(&ar, n * d->d * sizeof(float));
    w.r = bki_take(&ar, n * sizeof(float));
    w.Bm = bki_take(&ar, n * k * sizeof(float));
    w.psi = bki_take(&ar, n * k * sizeof(float));
    w.dpsi = bki_take(&ar, n * k * sizeof(float));
    w.Ex = bki_take(&ar, n * k * sizeof(float));
    w.Lg = bki_take(&ar, n * P * sizeof(float));
    w.A = bki_take(&ar, n * P * sizeof(float));
    w.G = bki_take(&ar, n * P * sizeof(float));
    w.S = bki_take(&ar, n * P * sizeof(float));
    w.hist = bki_take(&ar, hist_len(d, p) * sizeof(float));
    w.aux = bki_take(&ar, (n + (size_t)p->iters * (n + P) + P) * sizeof(float));
    w.part = bki_take(&ar, BKI_MAX_BLOCKS * part_stride(d->p) * sizeof(float));
    w.emax = bki_take(&ar, 2 * BKI_MAX_BLOCKS * sizeof(float));
    w.dsum = bki_take(&ar, BKI_MAX_BLOCKS * sizeof(double));
    w.flag = bki_take(&ar, 2 * BKI_MAX_BLOCKS * sizeof(int));
    w.scr = bki_take(&ar, bki_kern()->sk_scratch(d->n, d->p, members) * sizeof(float));
    return w;
}

static size_t slabs_bytes(const bk_otk_desc *d, const bk_otk_config *p, bki_plan pl)
{
    return (size_t)pl.lanes * slab_bytes(d, p, pl.team ? pl.nt : 1) + BK_ALIGN;
}

/* Runs fn(tm, b, slab, ctx) for the sets b0..b1-1 on the one problem runner
 * (bki_run_problems: a team of all region threads on one set after
 * another, or sets claimed by members working alone, each in its own slab;
 * a set's results do not depend on the slab it ran in). Every set ends
 * with its team in sync. */
typedef void (*otk_set_fn)(const bki_team *tm, int b, const otk_slab *w, void *ctx);

typedef struct {
    const bk_otk_desc *d;
    const bk_otk_config *p;
    bki_plan pl;
    int b0;
    otk_set_fn fn;
    void *ctx;
} run_sets_args;

static void one_set(const bki_team *tm, int i, char *lane, void *arg)
{
    const run_sets_args *r = arg;
    const otk_slab w = slab_at(r->d, r->p, r->pl, lane, 0);
    r->fn(tm, r->b0 + i, &w, r->ctx);
}

static void run_sets(const bk_otk_desc *d, const bk_otk_config *p, bki_plan pl, char *slabs, int b0, int b1,
                     otk_set_fn fn, void *ctx)
{
    run_sets_args r = {d, p, pl, b0, fn, ctx};
    bki_run_problems(pl, b1 - b0, slabs, slab_bytes(d, p, pl.team ? pl.nt : 1), one_set, &r);
}

/* ---- tape ------------------------------------------------------------------- */
typedef struct {
    uint32_t magic, version;
    int32_t B, n, d, q, p, k, L, domain, convention, pe, pe_double, anchors;
    float eps, sigma, eta, sigma_pos;
} otk_tape_header;

static size_t tape_block_floats(const bk_otk_desc *d, const bk_otk_config *p) { return bki_round_up(hist_len(d, p) * sizeof(float)) / sizeof(float); }

/* With anchors, the tape ends with the Nystrom section: the forward's
 * anchor Gram matrix G, its eigenvectors V and eigenvalues e (double), M
 * (float) and a checksum of the W they came from. The backward takes them
 * from there instead of decomposing G again (a LAPACK call on one thread
 * while the others wait: 2 % of an OTK forward + backward at k = 128), unless
 * its W differs from the forward's (then it decomposes its own). */
/* the section's parts: 0 G, 1 V (k x k double), 2 e (k double), 3 M (k x k
 * float), 4 the checksum of W, each on a 64-byte boundary: part i's byte
 * offset from the section's start (i = 5: the section's size) and length */
static size_t tape_nys_at(const bk_otk_desc *d, int i, size_t *len)
{
    const size_t kk = (size_t)d->k * d->k;
    const size_t l[6] = {kk * sizeof(double), kk * sizeof(double), (size_t)d->k * sizeof(double), kk * sizeof(float),
                         sizeof(uint64_t), 0};
    size_t at = 0;
    for (int j = 0; j < i; j++) at += bki_round_up(l[j]);
    if (len) *len = l[i];
    return at;
}

static size_t tape_nys_offset(const bk_otk_desc *d, const bk_otk_config *p)
{
    return bki_round_up(sizeof(otk_tape_header)) + (size_t)d->B * d->q * tape_block_floats(d, p) * sizeof(float);
}

size_t bk_otk_tape_size(const bk_otk_desc *d, const bk_otk_config *p)
{
    if (!d || !p || d->B < 1 || d->q < 1 || d->n < 1 || d->p < 1 || d->k < 1 || p->iters < 2 || p->iters % 2)
        return 0;
    return tape_nys_offset(d, p) + (p->W ? tape_nys_at(d, 5, NULL) : 0);
}

/* the Nystrom section's parts (dir 1: ws -> tape, with the checksum of W;
 * 0: tape -> ws) */
static uint64_t anchors_sum(const bk_otk_desc *d, const bk_otk_config *p)
{
    return bki_fnv1a(BKI_FNV_OFFSET, p->W, sizeof(float) * (size_t)d->k * d->d);
}
static void tape_nys_copy(const void *tape, const bk_otk_desc *d, const bk_otk_config *p, nys_global *g, int dir)
{
    char *t = (char *)tape + tape_nys_offset(d, p);
    void *part[4] = {g->G, g->V, g->e, g->M};
    for (int i = 0; i < 4; i++) {
        size_t len;
        const size_t at = tape_nys_at(d, i, &len);
        if (dir) memcpy(t + at, part[i], len);
        else memcpy(part[i], t + at, len);
    }
    if (dir) {
        const uint64_t sum = anchors_sum(d, p);
        memcpy(t + tape_nys_at(d, 4, NULL), &sum, sizeof sum);
    }
}
static int tape_nys_matches(const void *tape, const bk_otk_desc *d, const bk_otk_config *p)
{
    uint64_t sum;
    memcpy(&sum, (const char *)tape + tape_nys_offset(d, p) + tape_nys_at(d, 4, NULL), sizeof sum);
    return sum == anchors_sum(d, p);
}

static float *tape_block(const void *tape, const bk_otk_desc *d, const bk_otk_config *p, int b, int h)
{
    return (float *)((char *)tape + bki_round_up(sizeof(otk_tape_header))) + ((size_t)b * d->q + h) * tape_block_floats(d, p);
}

static void tape_header_fill(otk_tape_header *t, const bk_otk_desc *d, const bk_otk_config *p)
{
    memset(t, 0, sizeof *t);
    t->magic = OTK_MAGIC; t->version = OTK_VERSION;
    t->B = d->B; t->n = d->n; t->d = d->d; t->q = d->q; t->p = d->p; t->k = d->k; t->L = full_iters(p);
    t->domain = p->domain; t->convention = p->convention; t->pe = p->pe; t->pe_double = p->pe_double;
    t->anchors = p->W != NULL;
    t->eps = p->eps; t->sigma = p->sigma; t->eta = p->eta; t->sigma_pos = p->sigma_pos;
}

/* ---- workspace ---------------------------------------------------------------- */
/* global part: Nystrom matrices, per-set gradient blocks (z, M, W), and a tape
 * when the backward recomputes the forward */
static size_t grad_block_floats(const bk_otk_desc *d, const bk_otk_config *p)
{
    size_t f = (size_t)d->q * d->p * d->k;
    if (p->W) f += (size_t)d->k * d->k + (size_t)d->k * d->d;
    return bki_round_up(f * sizeof(float)) / sizeof(float);
}

static size_t ws_need(const bk_otk_desc *d, const bk_otk_config *p, bki_plan pl, int backward, int own_tape)
{
    size_t b = slabs_bytes(d, p, pl);
    if (p->W) b += nys_bytes(d->k, d->d) + 3 * bki_round_up((size_t)d->k * d->k * sizeof(double)) + BK_ALIGN;
    if (backward) b += (size_t)d->B * grad_block_floats(d, p) * sizeof(float) + BK_ALIGN;
    if (own_tape) b += bk_otk_tape_size(d, p) + BK_ALIGN;
    return b;
}

size_t bk_otk_workspace_size(const bk_otk_desc *d, const bk_otk_config *p)
{
    if (!d || !p || d->B < 1 || d->n < 1 || d->d < 1 || d->q < 1 || d->p < 1 || d->k < 1 || p->iters < 2 || p->iters % 2) return 0;
    return ws_need(d, p, plan_of(d), 1, 1);
}

typedef struct {
    char *slabs;
    nys_global nys;
    double *dtmp[3];          /* k x k double scratch for the global backward */
    float *grads;             /* [B][grad_block]                              */
    void *own_tape;
} otk_ws;

static otk_ws ws_layout(const bk_otk_desc *d, const bk_otk_config *p, bki_plan pl, int backward, int own_tape, char *base)
{
    otk_ws w;
    memset(&w, 0, sizeof w);
    w.slabs = base;
    char *c = base + slabs_bytes(d, p, pl);
    if (p->W) {
        w.nys = nys_carve(d->k, d->d, c);
        c += nys_bytes(d->k, d->d);
        const size_t kk = bki_round_up((size_t)d->k * d->k * sizeof(double)) / sizeof(double);
        w.dtmp[0] = (double *)bki_align_ptr(c);
        w.dtmp[1] = w.dtmp[0] + kk;
        w.dtmp[2] = w.dtmp[1] + kk;
        c += 3 * kk * sizeof(double) + BK_ALIGN;
    }
    if (backward) {
        w.grads = (float *)bki_align_ptr(c);
        c += (size_t)d->B * grad_block_floats(d, p) * sizeof(float) + BK_ALIGN;
    }
    if (own_tape) w.own_tape = bki_align_ptr(c);
    return w;
}

/* ---- features ----------------------------------------------------------------- */
/* psi (n_b x k, row stride k) of one set; keeps xh, r and Bm for the backward.
 * Ends in sync. */
static void set_features(const bki_team *tm, const bk_otk_desc *d, const bk_otk_config *p, const float *M, int nb,
                         const float *x, int64_t ldx, const otk_slab *w)
{
    const int dd = d->d, k = d->k;
    int i0, i1;
    team_rows(tm, nb, &i0, &i1);
    if (!p->W) {
        for (int i = i0; i < i1; i++) memcpy(w->psi + (size_t)i * k, x + i * ldx, sizeof(float) * k);
        bki_team_sync(tm);
        return;
    }
    const float alpha = 1.0f / (p->sigma * p->sigma);
    for (int i = i0; i < i1; i++) {
        const float *xi = x + i * ldx;
        double s2 = 0.0; /* in vector lanes: a serial chain of d double adds cost 7 % of the forward */
#pragma omp simd reduction(+ : s2)
        for (int c = 0; c < dd; c++) s2 += (double)xi[c] * xi[c];
        const float r = sqrtf(fmaxf((float)s2, OTK_NORM2_MIN));
        w->r[i] = (float)s2 >= OTK_NORM2_MIN ? r : -r; /* sign marks a clamped norm */
        const float inv = 1.0f / r;
        for (int c = 0; c < dd; c++) w->xh[(size_t)i * dd + c] = xi[c] * inv;
    }
    bki_team_sync(tm);
    /* s = xh W^T, then Bm = r exp(alpha (s - 1)) */
    bki_gemm(tm, 0, 1, nb, k, dd, alpha, w->xh, dd, p->W, dd, 0.0f, w->Ex, k);
    bki_team_sync(tm);
    const rblocks R = team_blocks(tm, nb);
    for (int b = R.b0; b < R.b1; b++) {
        const size_t e0 = (size_t)blk_lo(&R, b) * k, e1 = (size_t)blk_hi(&R, b) * k;
        for (size_t e = e0; e < e1; e++) w->Bm[e] = w->Ex[e] -= alpha;
        bki_kern()->vexp(w->Bm + e0, e1 - e0);
        for (int i = blk_lo(&R, b); i < blk_hi(&R, b); i++) {
            const float r = fabsf(w->r[i]);
            for (int l = 0; l < k; l++) w->Bm[(size_t)i * k + l] *= r;
        }
    }
    bki_team_sync(tm);
    bki_gemm(tm, 0, 0, nb, k, k, 1.0f, w->Bm, k, M, k, 0.0f, w->psi, k);
    bki_team_sync(tm);
}

/* ---- positional encoding --------------------------------------------------------- */
/* this member's rows of S (no sync) */
static void pe_matrix(const bki_team *tm, const bk_otk_desc *d, const bk_otk_config *p, int nb, float *S)
{
    const int P = d->p;
    const double isg = 1.0 / p->sigma_pos;
    int i0, i1;
    team_rows(tm, nb, &i0, &i1);
    if (p->pe == BK_OTK_PE_1D) {
        const int ref = p->convention == BK_OTK_REFERENCE;
        const double nn = ref ? d->n : nb, off = ref ? 0.0 : 1.0;
        for (int i = i0; i < i1; i++)
            for (int j = 0; j < P; j++) {
                const double t = ((i + off) / nn - (j + off) / P) * isg;
                S[(size_t)i * P + j] = (float)exp(-t * t);
            }
    } else {
        const int s = (int)lround(sqrt((double)P)), gh = p->grid_h, gw = p->grid_w;
        for (int i = i0; i < i1; i++)
            for (int j = 0; j < P; j++) {
                const double t1 = ((double)(i / gw + 1) / gh - (double)(j / s + 1) / s) * isg;
                const double t2 = ((double)(i % gw + 1) / gw - (double)(j % s + 1) / s) * isg;
                S[(size_t)i * P + j] = (float)(exp(-t1 * t1) * exp(-t2 * t2));
            }
    }
}

/* rows of X (nb x P) times S, elementwise (no sync) */
static void times_pe(const bki_team *tm, int nb, int P, float *X, const float *S)
{
    int i0, i1;
    team_rows(tm, nb, &i0, &i1);
    for (size_t e = (size_t)i0 * P; e < (size_t)i1 * P; e++) X[e] *= S[e];
}

/* logits Lg = (psi z_h^T) / eps, times S when pe_double; psi: nb x k. Ends in
 * sync. */
static void plan_logits(const bki_team *tm, const bk_otk_desc *d, const bk_otk_config *p, int nb, const float *psi,
                        const float *zh, const otk_slab *w)
{
    const int P = d->p, k = d->k;
    bki_gemm(tm, 0, 1, nb, P, k, 1.0f / p->eps, psi, k, zh, k, 0.0f, w->Lg, P);
    bki_team_sync(tm);
    if (p->pe != BK_OTK_PE_NONE && p->pe_double) {
        times_pe(tm, nb, P, w->Lg, w->S);
        bki_team_sync(tm);
    }
}

/* ---- scaling domain ---------------------------------------------------------------
 * Why this is a kernel of its own and not a mode of the LSE engine
 * (src/core/lse_engine.c): the engine's half-step is a log-sum-exp over the
 * scores, one exp per entry per half-step (fused to one per pair), valid for
 * any eps. The scaling iteration exponentiates ONCE and then only multiplies
 * (two matrix-vector products per iteration, no exp): that is the whole point
 * of the option (the reference code's numerics, and faster when n p is large
 * and L is long), and it is exact only while E does not underflow, which the
 * engine's callers never have to think about. Its backward is different too:
 * the adjoints of the scalings accumulate into one rank-2L update of the
 * plan's gradient (one GEMM below), where the engine replays half-steps.
 * Making it an engine mode would give the engine a second state
 * representation and a second backward used by one caller; it shares the
 * engine's fixed row blocks and block-ordered column sums instead, so it
 * follows the same parallel model and determinism contract.
 *
 * E = exp(Lg - rowmax) (kept in A), v_0 = 1, L times u = (1/n)/(E v),
 * v = (1/p)/(E^T u); u_t, v_t stored as the potentials (hist layout: u_1, v_1,
 * ..., u_L, v_L). A = n diag(u_L) E diag(v_L). Rows run in the engine's fixed
 * row blocks; the column sums E^T u are per-block partials (part) summed in
 * block order, columns in fixed column blocks: the same arithmetic for any
 * team. Returns 0 when an iterate is not finite and positive (E underflowed:
 * eps too small for this domain), the same in every member. Every function
 * here ends in sync. */
static void scaling_rows(int i0, int i1, int m, const float *Lg, float *E)
{
    for (int i = i0; i < i1; i++) {
        const float *row = Lg + (size_t)i * m;
        float mx = row[0];
        for (int j = 1; j < m; j++) mx = row[j] > mx ? row[j] : mx; /* finite: no libm call */
        for (int j = 0; j < m; j++) E[(size_t)i * m + j] = row[j] - mx;
    }
    bki_kern()->vexp(E + (size_t)i0 * m, (size_t)(i1 - i0) * m);
}

/* out[j] = sum_b part[b][j] in block order, for this member's column blocks */
static void sum_parts(const rblocks *R, const rblocks *Cb, const float *part, size_t ps, float *out)
{
    for (int cb = Cb->b0; cb < Cb->b1; cb++)
        for (int j = blk_lo(Cb, cb); j < blk_hi(Cb, cb); j++) {
            float c = part[j];
            for (int b = 1; b < R->nb; b++) c += part[(size_t)b * ps + j];
            out[j] = c;
        }
}

/* A = n diag(u) E diag(v) on this member's row blocks, E computed in place */
static void scaling_plan_rows(const rblocks *R, int m, const float *Lg, const float *u, const float *v, float *A)
{
    for (int b = R->b0; b < R->b1; b++) {
        scaling_rows(blk_lo(R, b), blk_hi(R, b), m, Lg, A);
        for (int i = blk_lo(R, b); i < blk_hi(R, b); i++) {
            const float ui = u[i] * R->n;
            for (int j = 0; j < m; j++) A[(size_t)i * m + j] *= ui * v[j];
        }
    }
}

static int scaling_forward(const bki_team *tm, int n, int m, int L, const float *Lg, float *E, float *hist,
                           const otk_slab *w)
{
    const rblocks R = team_blocks(tm, n), Cb = team_blocks(tm, m);
    const size_t ps = part_stride(m);
    const float a = 1.0f / n, bm = 1.0f / m;
    const float *v = NULL;
    for (int b = R.b0; b < R.b1; b++) scaling_rows(blk_lo(&R, b), blk_hi(&R, b), m, Lg, E);
    for (int t = 1; t <= L; t++) {
        float *u = hist + bki_hist_off(n, m, 2 * t - 1), *vn = hist + bki_hist_off(n, m, 2 * t);
        for (int b = R.b0; b < R.b1; b++) { /* u on the block's rows, its partial E^T u */
            float *cs = w->part + (size_t)b * ps;
            int ok = 1;
            memset(cs, 0, sizeof(float) * m);
            for (int i = blk_lo(&R, b); i < blk_hi(&R, b); i++) {
                const float *Ei = E + (size_t)i * m;
                float s = 0.0f;
                if (v) s = bki_dotf(m, Ei, v);
                else
                    for (int j = 0; j < m; j++) s += Ei[j];
                u[i] = a / s;
                ok &= u[i] > 0.0f && isfinite(u[i]);
                for (int j = 0; j < m; j++) cs[j] = fmaf(u[i], Ei[j], cs[j]);
            }
            w->flag[b] = ok;
        }
        bki_team_sync(tm);
        int ok = 1;
        for (int b = 0; b < R.nb; b++) ok &= w->flag[b];
        if (ok) {
            sum_parts(&R, &Cb, w->part, ps, vn);
            for (int cb = Cb.b0; cb < Cb.b1; cb++) {
                int okc = 1;
                for (int j = blk_lo(&Cb, cb); j < blk_hi(&Cb, cb); j++) {
                    vn[j] = bm / vn[j];
                    okc &= vn[j] > 0.0f && isfinite(vn[j]);
                }
                w->flag[BKI_MAX_BLOCKS + cb] = okc;
            }
        }
        bki_team_sync(tm);
        for (int cb = 0; ok && cb < Cb.nb; cb++) ok &= w->flag[BKI_MAX_BLOCKS + cb];
        if (!ok) {
            bki_team_sync(tm); /* every member has read the flags */
            return 0;
        }
        v = vn;
    }
    scaling_plan_rows(&R, m, Lg, hist + bki_hist_off(n, m, 2 * L - 1), v, E);
    bki_team_sync(tm);
    return 1;
}

/* Plan A = n P recomputed from stored iterates (bitwise the forward's). */
static void scaling_attention(const bki_team *tm, int n, int m, int L, const float *Lg, const float *hist, float *A)
{
    const rblocks R = team_blocks(tm, n);
    scaling_plan_rows(&R, m, Lg, hist + bki_hist_off(n, m, 2 * L - 1), hist + bki_hist_off(n, m, 2 * L), A);
    bki_team_sync(tm);
}

/* VJP of the scaling iteration. G: dL/dA on entry, dL/dLg on exit. A holds
 * the plan (destroyed: E recomputed into it). aux: n + 2 L (n + m) + m. */
static void scaling_backward(const bki_team *tm, int n, int m, int L, const float *Lg, const float *hist, float *A,
                             float *G, const otk_slab *w)
{
    const float *uL = hist + bki_hist_off(n, m, 2 * L - 1), *vL = hist + bki_hist_off(n, m, 2 * L);
    float *ub = w->aux, *vb = w->aux + n;      /* adjoints of u and v           */
    float *UR = vb + m;                        /* n x 2L: [u_t | rho_t]          */
    float *DV = UR + (size_t)n * 2 * L;        /* m x 2L: [delta_t | v_{t-1}]    */
    const float a = 1.0f / n, bm = 1.0f / m;
    const rblocks R = team_blocks(tm, n), Cb = team_blocks(tm, m);
    const size_t ps = part_stride(m);
    /* A = E; A = n diag(u) E diag(v): Pbar = n G */
    for (int b = R.b0; b < R.b1; b++) {
        scaling_rows(blk_lo(&R, b), blk_hi(&R, b), m, Lg, A);
        float *pv = w->part + (size_t)b * ps;
        memset(pv, 0, sizeof(float) * m);
        for (int i = blk_lo(&R, b); i < blk_hi(&R, b); i++) {
            float s = 0.0f;
            for (int j = 0; j < m; j++) {
                const float g = G[(size_t)i * m + j] * n, e = A[(size_t)i * m + j];
                s = fmaf(g * e, vL[j], s);
                pv[j] = fmaf(g * e, uL[i], pv[j]);
                G[(size_t)i * m + j] = g * uL[i] * vL[j]; /* Ebar, direct term */
            }
            ub[i] = s;
        }
    }
    bki_team_sync(tm);
    sum_parts(&R, &Cb, w->part, ps, vb); /* columns: the same member below */
    for (int t = L; t >= 1; t--) {
        const float *ut = hist + bki_hist_off(n, m, 2 * t - 1), *vt = hist + bki_hist_off(n, m, 2 * t);
        const float *vp = t > 1 ? hist + bki_hist_off(n, m, 2 * t - 2) : NULL;
        const int c = t - 1;
        /* v_t = b / (E^T u_t): delta = -vbar v_t^2 / b; ubar += E delta */
        for (int cb = Cb.b0; cb < Cb.b1; cb++)
            for (int j = blk_lo(&Cb, cb); j < blk_hi(&Cb, cb); j++) {
                const float dl = -vb[j] * vt[j] * vt[j] / bm;
                DV[(size_t)j * 2 * L + c] = dl;
                DV[(size_t)j * 2 * L + L + c] = vp ? vp[j] : 1.0f;
                vb[j] = dl;                    /* reuse vb as delta             */
            }
        bki_team_sync(tm);
        /* u_t = a / (E v_{t-1}): rho = -ubar u_t^2 / a; vbar = E^T rho */
        for (int b = R.b0; b < R.b1; b++) {
            float *pv = w->part + (size_t)b * ps;
            memset(pv, 0, sizeof(float) * m);
            for (int i = blk_lo(&R, b); i < blk_hi(&R, b); i++) {
                const float *Ai = A + (size_t)i * m;
                ub[i] += bki_dotf(m, Ai, vb);
                UR[(size_t)i * 2 * L + c] = ut[i];
                const float rho = -ub[i] * ut[i] * ut[i] / a;
                UR[(size_t)i * 2 * L + L + c] = rho;
                for (int j = 0; j < m; j++) pv[j] = fmaf(rho, Ai[j], pv[j]);
                ub[i] = 0.0f;
            }
        }
        bki_team_sync(tm);
        if (t > 1) sum_parts(&R, &Cb, w->part, ps, vb);
    }
    /* Ebar += [U R] [D V']^T, then dLg = Ebar (x) E */
    bki_gemm(tm, 0, 1, n, m, 2 * L, 1.0f, UR, 2 * L, DV, 2 * L, 1.0f, G, m);
    bki_team_sync(tm);
    int i0, i1;
    team_rows(tm, n, &i0, &i1);
    for (size_t e = (size_t)i0 * m; e < (size_t)i1 * m; e++) G[e] *= A[e];
    bki_team_sync(tm);
}

/* ---- one plan ---------------------------------------------------------------------- */
/* A = n_b P into w->A; potentials into hist. Returns 0 on scaling underflow
 * (in every member). Ends in sync. */
static int plan_forward(const bki_team *tm, const bk_otk_desc *d, const bk_otk_config *p, int nb, float *hist,
                        const otk_slab *w)
{
    const int P = d->p;
    if (p->domain == BK_OTK_SCALING) return scaling_forward(tm, nb, P, full_iters(p), w->Lg, w->A, hist, w);
    bki_sk_problem pb = {nb, P, w->Lg, P, NULL, NULL, p->iters, 0.0f, NULL, 1.0f, 1};
    bki_sk_result res = {hist, w->A, P, NULL, NULL, 0, 0.0f, 0.0f};
    bki_kern()->sk_forward(tm, &pb, &res, w->scr);
    return 1;
}

static float out_coef(const bk_otk_desc *d, const bk_otk_config *p)
{
    return p->convention == BK_OTK_REFERENCE ? (float)d->p : sqrtf((float)d->p / (float)d->q);
}

/* pooling weights Wt = c/n_b A (x) S on this member's rows (Wt may be A; no
 * sync) */
static void pool_weights(const bki_team *tm, const bk_otk_desc *d, const bk_otk_config *p, int nb, const float *A,
                         float *Wt, const float *S)
{
    const float c = out_coef(d, p) / (float)nb;
    int i0, i1;
    team_rows(tm, nb, &i0, &i1);
    const size_t e0 = (size_t)i0 * d->p, e1 = (size_t)i1 * d->p;
    if (p->pe != BK_OTK_PE_NONE)
        for (size_t e = e0; e < e1; e++) Wt[e] = A[e] * (c * S[e]);
    else
        for (size_t e = e0; e < e1; e++) Wt[e] = A[e] * c;
}

/* row and column errors of the plan A (nb x P), maxima of fixed row and
 * column blocks; member 0 writes dg. Ends in sync. */
static void plan_diag(const bki_team *tm, int nb, int P, const float *A, const otk_slab *w, bk_otk_diag *dg)
{
    const rblocks R = team_blocks(tm, nb), Cb = team_blocks(tm, P);
    for (int b = R.b0; b < R.b1; b++) {
        float re = 0.0f;
        for (int i = blk_lo(&R, b); i < blk_hi(&R, b); i++) {
            double s = 0.0;
            for (int j = 0; j < P; j++) s += A[(size_t)i * P + j];
            re = fmaxf(re, (float)fabs(s - 1.0));
        }
        w->emax[b] = re;
    }
    for (int cb = Cb.b0; cb < Cb.b1; cb++) {
        float ce = 0.0f;
        for (int j = blk_lo(&Cb, cb); j < blk_hi(&Cb, cb); j++) {
            double s = 0.0;
            for (int i = 0; i < nb; i++) s += A[(size_t)i * P + j];
            ce = fmaxf(ce, (float)fabs(s * P / nb - 1.0));
        }
        w->emax[BKI_MAX_BLOCKS + cb] = ce;
    }
    bki_team_sync(tm);
    if (tm->tid == 0) {
        float re = 0.0f, ce = 0.0f;
        for (int b = 0; b < R.nb; b++) re = fmaxf(re, w->emax[b]);
        for (int cb = 0; cb < Cb.nb; cb++) ce = fmaxf(ce, w->emax[BKI_MAX_BLOCKS + cb]);
        dg->row_err = re;
        dg->col_err = ce;
    }
    bki_team_sync(tm);
}

/* ---- forward ---------------------------------------------------------------------- */
static bk_status check_inputs(const bk_otk_desc *d, const bk_otk_config *p, const bk_tensor *x, const float *z)
{
    bk_status s;
    if ((s = bki_otk_check_desc(d)) || (s = check_params(d, p))) return s;
    if ((s = bki_check_tensor("x", x, d->B, 1, d->n, d->d))) return s;
    if ((s = bki_check_finite("x", x, d->B, 1, d->n, d->d, d->len))) return s;
    if ((s = check_dense("references z", z, (size_t)d->q * d->p * d->k))) return s;
    return BK_OK;
}

/* ---- forward of one set: features, then q plans and their pooling ---------------- */
typedef struct {
    const bk_otk_desc *d;
    const bk_otk_config *p;
    const bk_tensor *x, *out;
    const float *z;
    void *tape;
    const bk_otk_extras *ex;
    const otk_ws *ws;
    _Atomic int bad; /* the least set whose scaling iteration failed, or -1 */
} fwd_ctx;

static void fwd_set(const bki_team *tm, int b, const otk_slab *w, void *vctx)
{
    fwd_ctx *x = vctx;
    const bk_otk_desc *d = x->d;
    const bk_otk_config *p = x->p;
    const bk_otk_extras *ex = x->ex;
    const int P = d->p, k = d->k, nb = bki_len(d->len, b, d->n);
    set_features(tm, d, p, x->ws->nys.M, nb, bki_at(x->x, b, 0), x->x->stride_n, w);
    if (p->pe != BK_OTK_PE_NONE) pe_matrix(tm, d, p, nb, w->S); /* read after plan_logits' sync */
    for (int h = 0; h < d->q; h++) {
        const float *zh = x->z + (size_t)h * P * k;
        float *hist = x->tape ? tape_block(x->tape, d, p, b, h) : w->hist;
        plan_logits(tm, d, p, nb, w->psi, zh, w);
        if (!plan_forward(tm, d, p, nb, hist, w)) {
            if (tm->tid == 0) {
                int cur = atomic_load(&x->bad);
                while ((cur < 0 || b < cur) && !atomic_compare_exchange_weak(&x->bad, &cur, b)) {}
            }
            continue;
        }
        if (ex && ex->diag) plan_diag(tm, nb, P, w->A, w, &ex->diag[(size_t)b * d->q + h]);
        pool_weights(tm, d, p, nb, w->A, w->A, w->S);
        bki_team_sync(tm);
        if (x->out)
            bki_gemm(tm, 1, 0, P, k, nb, 1.0f, w->A, P, w->psi, k, 0.0f, bki_at(x->out, b, 0) + (size_t)h * k,
                     x->out->stride_n);
        if (ex && ex->plan) {
            float *pl = ex->plan + ((size_t)b * d->q + h) * d->n * P;
            int i0, i1;
            team_rows(tm, nb, &i0, &i1);
            memcpy(pl + (size_t)i0 * P, w->A + (size_t)i0 * P, sizeof(float) * (size_t)(i1 - i0) * P);
            if (tm->tid == 0) memset(pl + (size_t)nb * P, 0, sizeof(float) * (size_t)(d->n - nb) * P);
        }
        bki_team_sync(tm); /* A and Lg are reused by the next plan */
    }
}

/* Runs every set; out / tape / extras may be NULL. Returns the first set
 * whose scaling iteration failed, or -1. */
static int forward_core(const bk_otk_desc *d, const bk_otk_config *p, const bk_tensor *x, const float *z,
                        const bk_tensor *out, void *tape, const bk_otk_extras *ex, const otk_ws *ws, bki_plan pl)
{
    fwd_ctx c = {d, p, x, out, z, tape, ex, ws, -1};
    run_sets(d, p, pl, ws->slabs, 0, d->B, fwd_set, &c);
    return atomic_load(&c.bad);
}

typedef struct {
    const bk_otk_desc *d;
    const bk_otk_config *p;
    otk_ws *w;
    bk_status s;
} nys_prepare_args;

static void nys_prepare_member(void *arg)
{
    nys_prepare_args *r = arg;
    r->s = nys_setup(r->d, r->p, &r->w->nys, r->w->dtmp[1], r->w->dtmp[2]);
}

/* The Nystrom matrix, once per call, serially: in a one-thread region, so
 * that LAPACK's BLAS runs on one thread in the library's floating-point mode
 * like every other part of the call. */
static bk_status nys_prepare(const bk_otk_desc *d, const bk_otk_config *p, otk_ws *w)
{
    if (!p->W) return BK_OK;
    nys_prepare_args r = {d, p, w, BK_OK};
    bki_parallel(1, nys_prepare_member, &r);
    return r.s;
}

/* x and z are finite (checked): a non-finite result means a value overflowed
 * float32 (as driver.c's check of the attention operators' results; O(the
 * result), once after the sets) */
static bk_status overflow_check(const char *what, const bk_tensor *t, int B, int N, int C, const int32_t *len)
{
    const int b = bki_first_nonfinite(t, B, 1, N, C, len);
    if (b == B) return BK_OK;
    return bki_fail(BK_ERR_OVERFLOW,
                    "otk: %s of set %d is not finite although every input is: a value overflowed float32 (the "
                    "features, the plan's costs or their sums): reduce |x|, |z| or the anchors' scale", what, b);
}

static bk_status overflow_check_dense(const char *what, const float *a, size_t n)
{
    const size_t i = bki_first_nonfinite_array(a, n);
    if (i < n)
        return bki_fail(BK_ERR_OVERFLOW,
                        "otk: %s is not finite at %zu although every input is: a value overflowed float32 "
                        "(the features, the plan's costs or their sums over the sets): reduce |x|, |z|, |dout|",
                        what, i);
    return BK_OK;
}

bk_status bk_otk_forward(const bk_otk_desc *d, const bk_otk_config *p, const bk_tensor *x, const float *z,
                         const bk_tensor *out, void *tape, const bk_otk_extras *ex, void *wsp, size_t ws_size)
{
    bk_status s;
    if ((s = check_inputs(d, p, x, z))) return s;
    if ((s = bki_check_tensor("out", out, d->B, 1, d->p, d->q * d->k))) return s;
    if (out->stride_n < (int64_t)d->q * d->k) return bki_fail(BK_ERR_STRIDE, "out row stride must be >= q*k");
    bk_tensor zt = dense_view(z, d->q * d->p, d->k), pt = {0, 0, 0, 0, BK_DEVICE_HOST, BK_F32};
    const bk_tensor *in[2] = {x, &zt};
    const int ish[2][4] = {{d->B, 1, d->n, d->d}, {1, 1, d->q * d->p, d->k}};
    if (ex && ex->plan) pt = dense_view(ex->plan, d->B * d->q, d->n * d->p);
    const bk_tensor *o[2] = {out, &pt};
    const int osh[2][4] = {{d->B, 1, d->p, d->q * d->k}, {1, 1, d->B * d->q, d->n * d->p}};
    const char *on[2] = {"out", "plan"};
    if ((s = bki_check_aliasing(2, in, ish, 2, o, osh, on))) return s;
    const bki_plan pl = plan_of(d);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(wsp, ws_size, ws_need(d, p, pl, 0, 0), "bk_otk_workspace_size", &owned, &base))) return s;
    otk_ws ws = ws_layout(d, p, pl, 0, 0, base);
    if ((s = nys_prepare(d, p, &ws))) goto done;
    if (tape) {
        tape_header_fill(tape, d, p);
        if (p->W) tape_nys_copy(tape, d, p, &ws.nys, 1);
    }
    int bad = forward_core(d, p, x, z, out, tape, ex, &ws, pl);
    if (bad >= 0) {
        if (tape) ((otk_tape_header *)tape)->magic = 0;
        s = bki_fail(BK_ERR_NUMERIC, "scaling-domain Sinkhorn underflowed on set %d (eps = %g too small for "
                     "exp(K/eps) in float32): use the log domain", bad, (double)p->eps);
        goto done;
    }
    if ((s = overflow_check("the output", out, d->B, d->p, d->q * d->k, NULL))) {
        if (tape) ((otk_tape_header *)tape)->magic = 0;
        goto done;
    }
    bki_clear_error();
done:
    bki_workspace_release(owned);
    return s;
}

typedef struct {
    const bk_otk_desc *d;
    const bk_otk_config *p;
    const bk_tensor *x, *psi;
    const float *M;
} feat_ctx;

static void features_set(const bki_team *tm, int b, const otk_slab *w, void *vctx)
{
    const feat_ctx *c = vctx;
    const bk_otk_desc *d = c->d;
    const int nb = bki_len(d->len, b, d->n);
    set_features(tm, d, c->p, c->M, nb, bki_at(c->x, b, 0), c->x->stride_n, w);
    float *dst = bki_at(c->psi, b, 0);
    int i0, i1;
    team_rows(tm, nb, &i0, &i1);
    for (int i = i0; i < i1; i++) memcpy(dst + i * c->psi->stride_n, w->psi + (size_t)i * d->k, sizeof(float) * d->k);
    if (tm->tid == 0) bki_zero_rows(dst, c->psi->stride_n, nb, d->n, d->k);
}

bk_status bk_otk_features(const bk_otk_desc *d, const bk_otk_config *p, const bk_tensor *x, const bk_tensor *psi)
{
    bk_status s;
    if ((s = bki_otk_check_desc(d)) || (s = check_params(d, p))) return s;
    if ((s = bki_check_tensor("x", x, d->B, 1, d->n, d->d))) return s;
    if ((s = bki_check_finite("x", x, d->B, 1, d->n, d->d, d->len))) return s;
    if ((s = bki_check_tensor("psi", psi, d->B, 1, d->n, d->k))) return s;
    const bk_tensor *in[1] = {x};
    const int ish[1][4] = {{d->B, 1, d->n, d->d}};
    const bk_tensor *o[1] = {psi};
    const int osh[1][4] = {{d->B, 1, d->n, d->k}};
    const char *on[1] = {"psi"};
    if ((s = bki_check_aliasing(1, in, ish, 1, o, osh, on))) return s;
    const bki_plan pl = plan_of(d);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(NULL, 0, ws_need(d, p, pl, 0, 0), "bk_otk_workspace_size", &owned, &base))) return s;
    otk_ws ws = ws_layout(d, p, pl, 0, 0, base);
    if ((s = nys_prepare(d, p, &ws))) goto done;
    feat_ctx c = {d, p, x, psi, ws.nys.M};
    run_sets(d, p, pl, ws.slabs, 0, d->B, features_set, &c);
    if ((s = overflow_check("the features psi", psi, d->B, d->n, d->k, d->len))) goto done;
    bki_clear_error();
done:
    bki_workspace_release(owned);
    return s;
}

/* ---- backward --------------------------------------------------------------------- */
static bk_status check_tape(const void *tape, const bk_otk_desc *d, const bk_otk_config *p)
{
    otk_tape_header t;
    tape_header_fill(&t, d, p);
    const otk_tape_header *h = tape;
    if (h->magic != OTK_MAGIC || h->version != OTK_VERSION)
        return bki_fail(BK_ERR_TAPE, "tape has a bad magic number or version (not written by a successful bk_otk_forward?)");
    if (memcmp(h, &t, sizeof t) != 0) return bki_fail(BK_ERR_TAPE, "tape was written for another problem or other parameters");
    return BK_OK;
}

/* Nystrom backward of one set: dpsi -> dx rows, dM_b, dW_b (direct term).
 * Called with dpsi complete; ends in sync. */
static void set_features_backward(const bki_team *tm, const bk_otk_desc *d, const bk_otk_config *p, const float *M,
                                  int nb, const float *x, int64_t ldx, const otk_slab *w, float *dxb, int64_t lddx,
                                  float *dMb, float *dWb)
{
    const int dd = d->d, k = d->k;
    int i0, i1;
    team_rows(tm, nb, &i0, &i1);
    if (!p->W) {
        if (dxb)
            for (int i = i0; i < i1; i++) memcpy(dxb + i * lddx, w->dpsi + (size_t)i * k, sizeof(float) * k);
        bki_team_sync(tm);
        return;
    }
    const float alpha = 1.0f / (p->sigma * p->sigma);
    /* dM = Bm^T dpsi; dBm = dpsi M (into psi, no longer needed) */
    bki_gemm(tm, 1, 0, k, k, nb, 1.0f, w->Bm, k, w->dpsi, k, 0.0f, dMb, k);
    bki_gemm(tm, 0, 0, nb, k, k, 1.0f, w->dpsi, k, M, k, 0.0f, w->psi, k);
    bki_team_sync(tm);
    /* g = dBm (x) kappa, kappa = Bm / r; coefficient of xh: sum_l g (1 - alpha s),
     * 1 - alpha s = 1 - alpha - Ex */
    float *g = w->psi;
    for (int i = i0; i < i1; i++) {
        const float ir = 1.0f / fabsf(w->r[i]), c1 = 1.0f - alpha;
        float cx = 0.0f;
        float *gi = g + (size_t)i * k;
        const float *bi = w->Bm + (size_t)i * k, *ei = w->Ex + (size_t)i * k;
        for (int l = 0; l < k; l++) gi[l] *= bi[l] * ir;
        /* in vector lanes (a serial chain of k fused multiply-adds per row
         * cost 4 % of the backward) */
#pragma omp simd reduction(+ : cx)
        for (int l = 0; l < k; l++) cx += gi[l] * (c1 - ei[l]);
        w->dpsi[(size_t)i * k] = w->r[i] > 0.0f ? cx : 0.0f; /* reuse: per-row coefficient */
    }
    bki_team_sync(tm);
    /* dW_b = alpha g^T x */
    bki_gemm(tm, 1, 0, k, dd, nb, alpha, g, k, x, ldx, 0.0f, dWb, dd);
    if (dxb) { /* dx = cx xh + alpha g W */
        bki_gemm(tm, 0, 0, nb, dd, k, alpha, g, k, p->W, dd, 0.0f, dxb, lddx);
        bki_team_sync(tm);
        for (int i = i0; i < i1; i++) {
            if (!(w->r[i] > 0.0f)) continue;
            const float cx = w->dpsi[(size_t)i * k];
            for (int c = 0; c < dd; c++) dxb[i * lddx + c] = fmaf(cx, w->xh[(size_t)i * dd + c], dxb[i * lddx + c]);
        }
    }
    bki_team_sync(tm);
}

typedef struct {
    const bk_otk_desc *d;
    const bk_otk_config *p;
    const bk_tensor *x, *dout, *dx;
    const float *z;
    const void *tape;
    const otk_ws *ws;
} bwd_ctx;

static void bwd_set(const bki_team *tm, int b, const otk_slab *w, void *vctx)
{
    const bwd_ctx *x = vctx;
    const bk_otk_desc *d = x->d;
    const bk_otk_config *p = x->p;
    const int P = d->p, k = d->k, L = full_iters(p), nb = bki_len(d->len, b, d->n), pe = p->pe != BK_OTK_PE_NONE;
    const float *xb = bki_at(x->x, b, 0);
    float *gz = x->ws->grads + (size_t)b * grad_block_floats(d, p), *gM = NULL, *gW = NULL;
    if (p->W) {
        gM = gz + (size_t)d->q * P * k;
        gW = gM + (size_t)k * k;
    }
    set_features(tm, d, p, x->ws->nys.M, nb, xb, x->x->stride_n, w);
    if (pe) pe_matrix(tm, d, p, nb, w->S);
    int i0, i1;
    team_rows(tm, nb, &i0, &i1);
    memset(w->dpsi + (size_t)i0 * k, 0, sizeof(float) * (size_t)(i1 - i0) * k);
    const float cn = out_coef(d, p) / (float)nb, ie = 1.0f / p->eps;
    for (int h = 0; h < d->q; h++) {
        const float *zh = x->z + (size_t)h * P * k, *hist = tape_block(x->tape, d, p, b, h);
        const float *Gh = bki_at(x->dout, b, 0) + (size_t)h * k;
        const int64_t ldg = x->dout->stride_n;
        bki_sk_problem pb = {nb, P, w->Lg, P, NULL, NULL, 2 * L, 0.0f, NULL, 1.0f, 1};
        plan_logits(tm, d, p, nb, w->psi, zh, w);
        if (p->domain == BK_OTK_SCALING) scaling_attention(tm, nb, P, L, w->Lg, hist, w->A);
        else bki_kern()->sk_attention(tm, &pb, 2 * L, hist, w->A, P, w->scr);
        /* the forward's pooling weights (in G for now): dpsi += Wt Gh */
        pool_weights(tm, d, p, nb, w->A, w->G, w->S);
        bki_team_sync(tm);
        bki_gemm(tm, 0, 0, nb, k, P, 1.0f, w->G, P, Gh, ldg, 1.0f, w->dpsi, k);
        bki_team_sync(tm);
        /* Abar = cn S (x) (psi Gh^T) */
        bki_gemm(tm, 0, 1, nb, P, k, cn, w->psi, k, Gh, ldg, 0.0f, w->G, P);
        bki_team_sync(tm);
        if (pe) {
            times_pe(tm, nb, P, w->G, w->S);
            bki_team_sync(tm);
        }
        if (p->domain == BK_OTK_SCALING) scaling_backward(tm, nb, P, L, w->Lg, hist, w->A, w->G, w);
        else bki_kern()->sk_backward(tm, &pb, 2 * L, hist, w->A, P, w->G, P, w->scr, NULL, NULL);
        /* dK = dLg / eps (x S when pe_double) */
        if (pe && p->pe_double) {
            times_pe(tm, nb, P, w->G, w->S);
            bki_team_sync(tm);
        }
        /* the same tiles of dpsi as above: the same member accumulates them */
        bki_gemm(tm, 0, 0, nb, k, P, ie, w->G, P, zh, k, 1.0f, w->dpsi, k);
        bki_gemm(tm, 1, 0, P, k, nb, ie, w->G, P, w->psi, k, 0.0f, gz + (size_t)h * P * k, k);
        bki_team_sync(tm);
    }
    float *dxb = x->dx ? bki_at(x->dx, b, 0) : NULL;
    set_features_backward(tm, d, p, x->ws->nys.M, nb, xb, x->x->stride_n, w, dxb, x->dx ? x->dx->stride_n : 0, gM, gW);
    if (dxb && tm->tid == 0) bki_zero_rows(dxb, x->dx->stride_n, nb, d->n, d->d);
}

/* out[e] = the sum over sets b in order of grads[b gbf + off + e], for e in
 * [e0, min(e0 + SUM_CHUNK, n)) */
#define SUM_CHUNK 4096
static void set_sum_f(const float *grads, size_t gbf, int B, size_t off, size_t e0, size_t n, float *out)
{
    const size_t e1 = e0 + SUM_CHUNK < n ? e0 + SUM_CHUNK : n;
    for (size_t e = e0; e < e1; e++) out[e] = 0.0f;
    for (int b = 0; b < B; b++) {
        const float *g = grads + (size_t)b * gbf + off;
        for (size_t e = e0; e < e1; e++) out[e] += g[e];
    }
}

typedef struct {
    const bk_otk_desc *d;
    const bk_otk_config *p;
    const otk_ws *ws;
    size_t gbf, nz, nm, nw, om, ow; /* om, ow: dM's and dW's places in a set's gradient block */
    float *dz, *dW;
} grad_sums_args;

/* batch sums in set order, element by element (dz and dW in float, dM in
 * double): each output's elements in fixed chunks claimed by the members
 * (an element's sum is the same chain whoever adds it; on one thread the
 * sums were 1 % of the backward); then the global Nystrom backward (dW) */
static void grad_sums_member(void *arg)
{
    const grad_sums_args *r = arg;
    const bk_otk_desc *d = r->d;
    const otk_ws *ws = r->ws;
    const size_t gbf = r->gbf, nz = r->nz, nm = r->nm, nw = r->nw, om = r->om, ow = r->ow;
    double *dM = ws->dtmp[0];
    const int64_t cz = (int64_t)((nz + SUM_CHUNK - 1) / SUM_CHUNK), cm = (int64_t)((nm + SUM_CHUNK - 1) / SUM_CHUNK),
                  cw = (int64_t)((nw + SUM_CHUNK - 1) / SUM_CHUNK);
    if (r->dz) {
        BKI_FOR(c, cz) set_sum_f(ws->grads, gbf, d->B, 0, (size_t)c * SUM_CHUNK, nz, r->dz);
    }
    if (r->dW) {
        BKI_FOR(c, cm)
        {
            const size_t e0 = (size_t)c * SUM_CHUNK, e1 = e0 + SUM_CHUNK < nm ? e0 + SUM_CHUNK : nm;
            for (size_t e = e0; e < e1; e++) dM[e] = 0.0;
            for (int b = 0; b < d->B; b++) {
                const float *g = ws->grads + (size_t)b * gbf + om;
                for (size_t e = e0; e < e1; e++) dM[e] += g[e];
            }
        }
        BKI_FOR(c, cw) set_sum_f(ws->grads, gbf, d->B, ow, (size_t)c * SUM_CHUNK, nw, r->dW);
        const bki_team tm = bki_region_team();
        bki_team_sync(&tm); /* nys_backward_global reads all of dM and dW */
        nys_backward_global(&tm, d, r->p, &ws->nys, dM, ws->dtmp[1], ws->dtmp[2], r->dW);
    }
}

bk_status bk_otk_backward(const bk_otk_desc *d, const bk_otk_config *p, const bk_tensor *x, const float *z,
                          const bk_tensor *dout, const void *tape_in, const bk_tensor *dx, float *dz, float *dW,
                          void *wsp, size_t ws_size)
{
    bk_status s;
    if ((s = check_inputs(d, p, x, z))) return s;
    if ((s = bki_check_tensor("dout", dout, d->B, 1, d->p, d->q * d->k))) return s;
    if (dout->stride_n < (int64_t)d->q * d->k) return bki_fail(BK_ERR_STRIDE, "dout row stride must be >= q*k");
    if ((s = bki_check_finite("dout", dout, d->B, 1, d->p, d->q * d->k, NULL))) return s;
    if (dW && !p->W) return bki_fail(BK_ERR_PARAM, "dW requested but there are no anchors (identity map)");
    if (dx && (s = bki_check_tensor("dx", dx, d->B, 1, d->n, d->d))) return s;
    bk_tensor zt = dense_view(z, d->q * d->p, d->k), dzt = {dz, 0, 0, 0, BK_DEVICE_HOST, BK_F32}, dWt = {dW, 0, 0, 0, BK_DEVICE_HOST, BK_F32},
              Wt = {0, 0, 0, 0, BK_DEVICE_HOST, BK_F32};
    if (dz) dzt = dense_view(dz, d->q * d->p, d->k);
    if (dW) dWt = dense_view(dW, d->k, d->d);
    if (p->W) Wt = dense_view(p->W, d->k, d->d);
    const bk_tensor *in[4] = {x, &zt, dout, &Wt};
    const int ish[4][4] = {{d->B, 1, d->n, d->d}, {1, 1, d->q * d->p, d->k}, {d->B, 1, d->p, d->q * d->k}, {1, 1, d->k, d->d}};
    const bk_tensor *o[3] = {dx, &dzt, &dWt};
    const int osh[3][4] = {{d->B, 1, d->n, d->d}, {1, 1, d->q * d->p, d->k}, {1, 1, d->k, d->d}};
    const char *on[3] = {"dx", "dz", "dW"};
    if ((s = bki_check_aliasing(4, in, ish, 3, o, osh, on))) return s;
    if (tape_in && (s = check_tape(tape_in, d, p))) return s;
    const bki_plan pl = plan_of(d);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(wsp, ws_size, ws_need(d, p, pl, 1, tape_in == NULL), "bk_otk_workspace_size", &owned, &base)))
        return s;
    otk_ws ws = ws_layout(d, p, pl, 1, tape_in == NULL, base);
    if (tape_in && p->W && tape_nys_matches(tape_in, d, p)) tape_nys_copy(tape_in, d, p, &ws.nys, 0);
    else if ((s = nys_prepare(d, p, &ws))) goto done;
    const void *tape = tape_in;
    if (!tape) {
        tape_header_fill(ws.own_tape, d, p);
        int bad = forward_core(d, p, x, z, NULL, ws.own_tape, NULL, &ws, pl);
        if (bad >= 0) {
            s = bki_fail(BK_ERR_NUMERIC, "scaling-domain Sinkhorn underflowed on set %d: use the log domain", bad);
            goto done;
        }
        tape = ws.own_tape;
    }
    const int P = d->p, k = d->k;
    const size_t gbf = grad_block_floats(d, p);
    bwd_ctx c = {d, p, x, dout, dx, z, tape, &ws};
    run_sets(d, p, pl, ws.slabs, 0, d->B, bwd_set, &c);
    const size_t nz = (size_t)d->q * P * k, nm = (size_t)k * k, nw = (size_t)k * d->d;
    const size_t om = nz, ow = nz + nm; /* dM's and dW's places in a set's gradient block */
    grad_sums_args r = {d, p, &ws, gbf, nz, nm, nw, om, ow, dz, dW};
    bki_parallel((size_t)d->B * (nz + nm + nw) > 65536 ? bki_threads() : 1, grad_sums_member, &r);
    if ((dx && (s = overflow_check("the gradient dx", dx, d->B, d->n, d->d, d->len))) ||
        (s = overflow_check_dense("the gradient dz", dz, nz)) || (s = overflow_check_dense("the gradient dW", dW, nw)))
        goto done;
    bki_clear_error();
done:
    bki_workspace_release(owned);
    return s;
}

/* ---- transport statistics for the unsupervised fits (otk_fit.c) ---------------------
 * F: features [B][n][k] (dense; rows below len[b] valid). For every set b:
 * sim[b*q+h] = sum_ij P_ij <F_i, z^h_j> for each h (LOG plan, p->eps,
 * p->iters; sim may be NULL), and when bary != NULL the sum over sets with
 * ref[b] = h of p P^T F_b is added to bary[h] ([q][p][k]) in set order. */
typedef struct {
    const bk_otk_desc *d;
    const bk_otk_config *p;
    const float *F, *z;
    double *sim;
    const int *ref;
    float *part;   /* [chunk][p][k]: p P^T F_b of the chunk's sets */
    int b0;        /* first set of the chunk */
} tr_ctx;

static void transport_set(const bki_team *tm, int b, const otk_slab *w, void *vctx)
{
    const tr_ctx *c = vctx;
    const bk_otk_desc *d = c->d;
    const int nb = bki_len(d->len, b, d->n), P = d->p, k = d->k;
    const float *Fb = c->F + (size_t)b * d->n * k;
    for (int h = 0; h < d->q; h++) {
        if (!c->sim && c->ref[b] != h) continue;
        plan_logits(tm, d, c->p, nb, Fb, c->z + (size_t)h * P * k, w);
        plan_forward(tm, d, c->p, nb, w->hist, w);
        if (c->sim) { /* sum_ij A_ij Lg_ij: per row block in double, blocks in order */
            const rblocks R = team_blocks(tm, nb);
            for (int rb = R.b0; rb < R.b1; rb++) {
                double s = 0.0;
                for (size_t e = (size_t)blk_lo(&R, rb) * P; e < (size_t)blk_hi(&R, rb) * P; e++)
                    s += (double)w->A[e] * w->Lg[e];
                w->dsum[rb] = s;
            }
            bki_team_sync(tm);
            if (tm->tid == 0) {
                double s = 0.0;
                for (int rb = 0; rb < R.nb; rb++) s += w->dsum[rb];
                c->sim[(size_t)b * d->q + h] = s * c->p->eps / nb;
            }
        }
        if (c->part && c->ref[b] == h)
            bki_gemm(tm, 1, 0, P, k, nb, (float)P / nb, w->A, P, Fb, k, 0.0f, c->part + (size_t)(b - c->b0) * P * k, k);
        bki_team_sync(tm);
    }
}

bk_status bki_otk_transport(const bk_otk_desc *d, const bk_otk_config *p0, const float *F, const float *z,
                            double *sim, const int *ref, float *bary)
{
    bk_otk_config p = *p0;
    p.W = NULL;
    p.domain = BK_OTK_LOG;
    p.pe = BK_OTK_PE_NONE;
    bk_otk_desc dd = *d;
    dd.d = d->k;
    const bki_plan pl = plan_of(&dd);
    const int P = d->p, k = d->k, chunk = 8 * pl.nt;
    const size_t sb = slabs_bytes(&dd, &p, pl);
    char *base = malloc(sb + (bary ? (size_t)chunk * P * k * sizeof(float) : 0));
    if (!base) return bki_fail(BK_ERR_NOMEM, "out of memory (OTK transport statistics)");
    tr_ctx c = {&dd, &p, F, z, sim, ref, bary ? (float *)(base + sb) : NULL, 0};
    for (int b0 = 0; b0 < d->B; b0 += chunk) {
        const int b1 = b0 + chunk < d->B ? b0 + chunk : d->B;
        c.b0 = b0;
        run_sets(&dd, &p, pl, base, b0, b1, transport_set, &c);
        if (bary)
            for (int b = b0; b < b1; b++) {
                float *dst = bary + (size_t)ref[b] * P * k;
                const float *src = c.part + (size_t)(b - b0) * P * k;
                for (size_t i = 0; i < (size_t)P * k; i++) dst[i] += src[i];
            }
    }
    free(base);
    return BK_OK;
}
