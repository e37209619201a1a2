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
 * anchor Gram's eigendecomposition (once per call) stays serial.
 *
 * The forward and the backward are calls of the one operator driver (op.h,
 * driver.c; "the call on the operator driver" below): its checks, plan over
 * the sets, lanes, per-call area (the Nystrom matrices, prepare), tape format
 * (a per-call section for the Nystrom matrices, a block per set) and
 * per-set gradient slabs reduced in set order. OTK is not in the registry
 * (its problems are sets, not attention problems). */
#include "op.h"

#include <cblas.h>
#include <stdint.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* The per-call area of a call with anchors (the driver's, op->prep_bytes;
 * bk_otk_features' own): first the tape's Nystrom section, then scratch.
 * The section: 0 G, 1 V (k x k double), 2 e (k double), 3 M (k x k float),
 * 4 the checksum of the W they came from, each on a 64-byte boundary:
 * part i's byte offset from the section's start (i = 5: the section's size)
 * and length. A forward's prepare computes them (the driver copies the
 * section after the tape's header); a backward takes them from its tape's
 * section instead of decomposing G again (a LAPACK call on one thread while
 * the others wait: 2 % of an OTK forward + backward at k = 128), unless its
 * W differs from the forward's (then it decomposes its own). */
static size_t nys_at(const bk_otk_desc *d, int i, size_t *len)
{
    const size_t kk = (size_t)d->k * d->k;
    const size_t l[6] = {kk * sizeof(double), kk * sizeof(double), (size_t)d->k * sizeof(double), kk * sizeof(float),
                         sizeof(uint64_t), 0};
    size_t at = 0;
    for (int j = 0; j < i; j++) at += bki_round_up(l[j]);
    if (len) *len = l[i];
    return at;
}

typedef struct {
    nys_global g;
    double *dtmp[3];           /* k x k double scratch (setup, global backward) */
} nys_area;

/* bytes of the area (64-byte aligned): the section, W in double, acc, dtmp */
static size_t nys_area_bytes(const bk_otk_desc *d)
{
    const size_t kk = bki_round_up((size_t)d->k * d->k * sizeof(double));
    return nys_at(d, 5, NULL) + bki_round_up((size_t)d->k * d->d * sizeof(double)) +
           bki_round_up(2 * (size_t)d->d * sizeof(double)) + 3 * kk;
}

static nys_area nys_carve(const bk_otk_desc *d, char *base)
{
    const size_t kk = bki_round_up((size_t)d->k * d->k * sizeof(double));
    nys_area a;
    a.g.G = (double *)(base + nys_at(d, 0, NULL));
    a.g.V = (double *)(base + nys_at(d, 1, NULL));
    a.g.e = (double *)(base + nys_at(d, 2, NULL));
    a.g.M = (float *)(base + nys_at(d, 3, NULL));
    char *q = base + nys_at(d, 5, NULL);
    a.g.Wd = (double *)q;
    q += bki_round_up((size_t)d->k * d->d * sizeof(double));
    a.g.acc = (double *)q;
    q += bki_round_up(2 * (size_t)d->d * sizeof(double));
    for (int i = 0; i < 3; i++) a.dtmp[i] = (double *)(q + (size_t)i * kk);
    return a;
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

typedef struct {
    const bk_otk_desc *d;
    const bk_otk_config *p;
    nys_area *a;
    bk_status s;
} nys_prepare_args;

static void nys_prepare_member(void *arg)
{
    nys_prepare_args *r = arg;
    r->s = nys_setup(r->d, r->p, &r->a->g, r->a->dtmp[1], r->a->dtmp[2]);
}

/* The Nystrom matrix, once per call, serially: in a one-thread region, so
 * that LAPACK's BLAS runs on one thread in the library's floating-point mode
 * like every other part of the call. */
static bk_status nys_prepare(const bk_otk_desc *d, const bk_otk_config *p, nys_area *a)
{
    nys_prepare_args r = {d, p, a, BK_OK};
    bki_parallel(1, nys_prepare_member, &r);
    return r.s;
}

static uint64_t anchors_sum(const bk_otk_desc *d, const bk_otk_config *p)
{
    return bki_fnv1a(BKI_FNV_OFFSET, p->W, sizeof(float) * (size_t)d->k * d->d);
}

/* ---- the call on the operator driver (op.h) --------------------------------------
 * bk_otk_forward and bk_otk_backward are calls of the driver on otk_op, an
 * operator whose problems are not attention problems (op->check_io): problem
 * b is set b (one per thread, or a team per set: bki_plan_problems over the
 * B sets), its lane a slab, its tape block the potentials of its q plans,
 * its parameter-gradient slab its gradient block (z, M, W), summed in set
 * order by reduce. The call's descriptor maps the sets onto an attention
 * shape: B sets, H = 1, Nq = p supports, Nk = n elements (k_len = len),
 * d, dv = q k, so that out [B,1,p,q k] is the call's out and a block's Lq,
 * Lk are p and n_b. The arrays: c->k = x, c->out, c->dout, c->dk = dx,
 * c->ex = the bk_otk_extras, c->pg = an otk_grads; z in the parameters. */
typedef struct {
    const bk_otk_desc *d;
    const bk_otk_config *p;
    const float *z;
    bk_attn_desc ad;
} otk_par;

typedef struct {
    float *dz, *dW;
} otk_grads;

static const otk_par *par_of(const bki_call *c) { return c->par; }

/* ---- tape ---------------------------------------------------------------------
 * The driver's format (call.h): the header (its key: the parameters the
 * backward must agree on), with anchors the Nystrom section (nys_at), then a
 * block per set: the potentials of every half-step of its q plans, each on a
 * 64-byte boundary. */
static size_t tape_block_floats(const bk_otk_desc *d, const bk_otk_config *p) { return bki_round_up(hist_len(d, p) * sizeof(float)) / sizeof(float); }

static float *tape_hist(const bki_call *c, int b, int h)
{
    return (float *)bki_op_block_data(c, b) + (size_t)h * tape_block_floats(par_of(c)->d, par_of(c)->p);
}

static size_t block_bytes(const bki_call *c)
{
    const otk_par *o = par_of(c);
    return (size_t)o->d->q * tape_block_floats(o->d, o->p) * sizeof(float);
}

static uint32_t key(const bki_call *c)
{
    const bk_otk_config *p = par_of(c)->p;
    const int32_t n[8] = {par_of(c)->d->q, par_of(c)->d->k, full_iters(p), p->domain, p->convention, p->pe,
                          p->pe_double, p->W != NULL};
    const float v[4] = {p->eps, p->sigma, p->eta, p->sigma_pos};
    uint64_t h = bki_fnv1a(BKI_FNV_OFFSET, n, sizeof n);
    h = bki_fnv1a(h, v, sizeof v);
    return (uint32_t)(h ^ (h >> 32));
}

static size_t call_bytes(const bki_call *c)
{
    return par_of(c)->p->W ? nys_at(par_of(c)->d, 5, NULL) : 0;
}

/* ---- the per-call area, lanes and gradient slabs -------------------------------- */
static size_t prep_bytes(const bki_call *c)
{
    return par_of(c)->p->W ? nys_area_bytes(par_of(c)->d) : 0;
}

/* the Nystrom matrices: the tape's section when it holds those of this W
 * (a backward), else computed */
static bk_status prepare(bki_call *c)
{
    const otk_par *o = par_of(c);
    if (!o->p->W) return BK_OK;
    const size_t at = nys_at(o->d, 4, NULL);
    const uint64_t sum = anchors_sum(o->d, o->p);
    uint64_t got = 0;
    if (c->call_sec) memcpy(&got, c->call_sec + at, sizeof got);
    if (c->call_sec && got == sum) {
        memcpy(c->prep, c->call_sec, nys_at(o->d, 5, NULL));
        return BK_OK;
    }
    memset(c->prep, 0, nys_at(o->d, 5, NULL)); /* the section's padding: tapes are deterministic */
    nys_area a = nys_carve(o->d, c->prep);
    const bk_status s = nys_prepare(o->d, o->p, &a);
    memcpy((char *)c->prep + at, &sum, sizeof sum);
    return s;
}

static double cost(const bki_call *c)
{
    const bk_otk_desc *d = par_of(c)->d;
    return (double)d->n * (d->p + d->k);
}

static size_t lane_bytes(const bki_call *c, int members) { return slab_bytes(par_of(c)->d, par_of(c)->p, members); }

/* a set's gradient block: z, then with anchors M and W */
static size_t grad_block_floats(const bk_otk_desc *d, const bk_otk_config *p)
{
    size_t f = (size_t)d->q * d->p * d->k;
    if (p->W) f += (size_t)d->k * d->k + (size_t)d->k * d->d;
    return bki_round_up(f * sizeof(float)) / sizeof(float);
}

static size_t pgrad_bytes(const bki_call *c) { return grad_block_floats(par_of(c)->d, par_of(c)->p) * sizeof(float); }

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

/* ---- the call's checks ------------------------------------------------------------- */
/* a size query's check (ws_mode): the sizes and the iteration count */
static bk_status check(const bki_call *c)
{
    const otk_par *o = par_of(c);
    const bk_otk_desc *d = o->d;
    const bk_otk_config *p = o->p;
    bk_status s;
    if (!c->ws_mode) return (s = bki_otk_check_desc(d)) ? s : check_params(d, p);
    if (!d || !p || d->B < 1 || d->n < 1 || d->d < 1 || d->q < 1 || d->p < 1 || d->k < 1 || p->iters < 2 ||
        p->iters % 2 || (int64_t)d->n * d->p > ((int64_t)1 << 36) || (int64_t)d->n * d->k > ((int64_t)1 << 36) ||
        d->d > (1 << 24) || d->k > (1 << 16) || (int64_t)d->q * d->k > (1 << 26))
        return bki_fail(BK_ERR_PARAM, "OTK sizes or iters invalid");
    return BK_OK;
}

static bk_status check_fwd_arrays(const bki_call *c)
{
    const bk_otk_desc *d = par_of(c)->d;
    const bk_tensor *x = c->k, *out = c->out;
    const bk_otk_extras *ex = c->ex;
    bk_status s;
    if ((s = bki_check_tensor("out", out, d->B, 1, d->p, d->q * d->k))) return s;
    if (out->stride_n < (int64_t)d->q * d->k) return bki_fail(BK_ERR_STRIDE, "out row stride must be >= q*k");
    bk_tensor zt = dense_view(par_of(c)->z, d->q * d->p, d->k), pt = {0, 0, 0, 0, BK_DEVICE_HOST, BK_F32};
    const bk_tensor *in[2] = {x, &zt};
    const int ish[2][4] = {{d->B, 1, d->n, d->d}, {1, 1, d->q * d->p, d->k}};
    if (ex && ex->plan) pt = dense_view(ex->plan, d->B * d->q, d->n * d->p);
    const bk_tensor *o[2] = {out, &pt};
    const int osh[2][4] = {{d->B, 1, d->p, d->q * d->k}, {1, 1, d->B * d->q, d->n * d->p}};
    const char *on[2] = {"out", "plan"};
    return bki_check_aliasing(2, in, ish, 2, o, osh, on);
}

static bk_status check_bwd_arrays(const bki_call *c)
{
    const otk_par *op = par_of(c);
    const bk_otk_desc *d = op->d;
    const bk_otk_config *p = op->p;
    const bk_tensor *x = c->k, *dout = c->dout, *dx = c->dk;
    const otk_grads *g = c->pg;
    float *dz = g ? g->dz : NULL, *dW = g ? g->dW : NULL;
    bk_status s;
    if ((s = bki_check_tensor("dout", dout, d->B, 1, d->p, d->q * d->k))) return s;
    if (dout->stride_n < (int64_t)d->q * d->k) return bki_fail(BK_ERR_STRIDE, "dout row stride must be >= q*k");
    if ((s = bki_check_finite("dout", dout, d->B, 1, d->p, d->q * d->k, NULL))) return s;
    if (dW && !p->W) return bki_fail(BK_ERR_PARAM, "dW requested but there are no anchors (identity map)");
    if (dx && (s = bki_check_tensor("dx", dx, d->B, 1, d->n, d->d))) return s;
    bk_tensor zt = dense_view(op->z, d->q * d->p, d->k), dzt = {dz, 0, 0, 0, BK_DEVICE_HOST, BK_F32},
              dWt = {dW, 0, 0, 0, BK_DEVICE_HOST, BK_F32}, Wt = {0, 0, 0, 0, BK_DEVICE_HOST, BK_F32};
    if (dz) dzt = dense_view(dz, d->q * d->p, d->k);
    if (dW) dWt = dense_view(dW, d->k, d->d);
    if (p->W) Wt = dense_view(p->W, d->k, d->d);
    const bk_tensor *in[4] = {x, &zt, dout, &Wt};
    const int ish[4][4] = {{d->B, 1, d->n, d->d}, {1, 1, d->q * d->p, d->k}, {d->B, 1, d->p, d->q * d->k}, {1, 1, d->k, d->d}};
    const bk_tensor *o[3] = {dx, &dzt, &dWt};
    const int osh[3][4] = {{d->B, 1, d->n, d->d}, {1, 1, d->q * d->p, d->k}, {1, 1, d->k, d->d}};
    const char *on[3] = {"dx", "dz", "dW"};
    return bki_check_aliasing(4, in, ish, 3, o, osh, on);
}

/* x (c->k) and z, then a forward's or a backward's own arrays (the driver's
 * check_io; the descriptor and the parameters are checked) */
static bk_status check_io(const bki_call *c, int backward)
{
    const bk_otk_desc *d = par_of(c)->d;
    const bk_tensor *x = c->k;
    bk_status s;
    if ((s = bki_check_tensor("x", x, d->B, 1, d->n, d->d))) return s;
    if ((s = bki_check_finite("x", x, d->B, 1, d->n, d->d, d->len))) return s;
    if ((s = check_dense("references z", par_of(c)->z, (size_t)d->q * d->p * d->k))) return s;
    return backward ? check_bwd_arrays(c) : check_fwd_arrays(c);
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


/* The call's results (the driver's check_results): a forward's failed sets
 * (the scaling iteration, c->bad) or overflowed output, a backward's
 * overflowed gradients. A failed forward's tape is marked unusable. */
static bk_status check_results(bki_call *c, int backward)
{
    const bk_otk_desc *d = par_of(c)->d;
    bk_status s = BK_OK;
    if (!backward) {
        if (c->bad < d->B)
            s = bki_fail(BK_ERR_NUMERIC, "scaling-domain Sinkhorn underflowed on set %d (eps = %g too small for "
                         "exp(K/eps) in float32): use the log domain", c->bad, (double)par_of(c)->p->eps);
        else if (c->out)
            s = overflow_check("the output", c->out, d->B, d->p, d->q * d->k, NULL);
        if (s && c->tape) memset(c->tape, 0, sizeof(uint32_t)); /* the magic */
        return s;
    }
    const otk_grads *g = c->pg;
    if (c->dk && (s = overflow_check("the gradient dx", c->dk, d->B, d->n, d->d, d->len))) return s;
    if (g && (s = overflow_check_dense("the gradient dz", g->dz, (size_t)d->q * d->p * d->k))) return s;
    if (g && (s = overflow_check_dense("the gradient dW", g->dW, (size_t)d->k * d->d))) return s;
    return BK_OK;
}

/* ---- forward of one set: features, then q plans and their pooling ---------------- */
static void forward(const bki_team *tm, bki_call *c, int b, char *lane)
{
    const otk_par *o = par_of(c);
    const bk_otk_desc *d = o->d;
    const bk_otk_config *p = o->p;
    const bk_otk_extras *ex = c->ex;
    const otk_slab sl = slab_at(d, p, c->pl, lane, 0), *w = &sl;
    const float *M = p->W ? (const float *)((char *)c->prep + nys_at(d, 3, NULL)) : NULL;
    const int P = d->p, k = d->k, nb = bki_len(d->len, b, d->n);
    set_features(tm, d, p, M, nb, bki_at(c->k, b, 0), c->k->stride_n, w);
    if (p->pe != BK_OTK_PE_NONE) pe_matrix(tm, d, p, nb, w->S); /* read after plan_logits' sync */
    for (int h = 0; h < d->q; h++) {
        const float *zh = o->z + (size_t)h * P * k;
        float *hist = c->tape ? tape_hist(c, b, h) : w->hist;
        plan_logits(tm, d, p, nb, w->psi, zh, w);
        if (!plan_forward(tm, d, p, nb, hist, w)) {
            if (tm->tid == 0) bki_op_fail(c, b, BK_ERR_NUMERIC);
            continue;
        }
        if (ex && ex->diag) plan_diag(tm, nb, P, w->A, w, &ex->diag[(size_t)b * d->q + h]);
        pool_weights(tm, d, p, nb, w->A, w->A, w->S);
        bki_team_sync(tm);
        if (c->out)
            bki_gemm(tm, 1, 0, P, k, nb, 1.0f, w->A, P, w->psi, k, 0.0f, bki_at(c->out, b, 0) + (size_t)h * k,
                     c->out->stride_n);
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

/* (not a call of the driver: no tape, no backward; the sets on the same
 * per-set runner and lanes, the Nystrom matrices in the same area) */
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
    const size_t sb = slabs_bytes(d, p, pl);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(NULL, 0, sb + (p->W ? nys_area_bytes(d) + BK_ALIGN : 0), "bk_otk_features", &owned, &base)))
        return s;
    nys_area a;
    memset(&a, 0, sizeof a);
    if (p->W) {
        a = nys_carve(d, bki_align_ptr(base + sb));
        if ((s = nys_prepare(d, p, &a))) goto done;
    }
    feat_ctx c = {d, p, x, psi, p->W ? a.g.M : NULL};
    run_sets(d, p, pl, base, 0, d->B, features_set, &c);
    if ((s = overflow_check("the features psi", psi, d->B, d->n, d->k, d->len))) goto done;
    bki_clear_error();
done:
    bki_workspace_release(owned);
    return s;
}

/* ---- backward --------------------------------------------------------------------- */
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

static void backward(const bki_team *tm, bki_call *c, int b, char *lane)
{
    const otk_par *o = par_of(c);
    const bk_otk_desc *d = o->d;
    const bk_otk_config *p = o->p;
    const otk_slab sl = slab_at(d, p, c->pl, lane, 0), *w = &sl;
    const float *M = p->W ? (const float *)((char *)c->prep + nys_at(d, 3, NULL)) : NULL;
    const int P = d->p, k = d->k, L = full_iters(p), nb = bki_len(d->len, b, d->n), pe = p->pe != BK_OTK_PE_NONE;
    const float *xb = bki_at(c->k, b, 0);
    float *gz = (float *)(c->pgrad + (size_t)b * bki_round_up(pgrad_bytes(c))), *gM = NULL, *gW = NULL;
    if (p->W) {
        gM = gz + (size_t)d->q * P * k;
        gW = gM + (size_t)k * k;
    }
    set_features(tm, d, p, M, nb, xb, c->k->stride_n, w);
    if (pe) pe_matrix(tm, d, p, nb, w->S);
    int i0, i1;
    team_rows(tm, nb, &i0, &i1);
    memset(w->dpsi + (size_t)i0 * k, 0, sizeof(float) * (size_t)(i1 - i0) * k);
    const float cn = out_coef(d, p) / (float)nb, ie = 1.0f / p->eps;
    for (int h = 0; h < d->q; h++) {
        const float *zh = o->z + (size_t)h * P * k, *hist = tape_hist(c, b, h);
        const float *Gh = bki_at(c->dout, b, 0) + (size_t)h * k;
        const int64_t ldg = c->dout->stride_n;
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
    float *dxb = c->dk ? bki_at(c->dk, b, 0) : NULL;
    set_features_backward(tm, d, p, M, nb, xb, c->k->stride_n, w, dxb, c->dk ? c->dk->stride_n : 0, gM, gW);
    if (dxb && tm->tid == 0) bki_zero_rows(dxb, c->dk->stride_n, nb, d->n, d->d);
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
    const float *grads;   /* the sets' gradient blocks                   */
    nys_area a;
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
    const size_t gbf = r->gbf, nz = r->nz, nm = r->nm, nw = r->nw, om = r->om, ow = r->ow;
    double *dM = r->a.dtmp[0];
    const int64_t cz = (int64_t)((nz + SUM_CHUNK - 1) / SUM_CHUNK), cm = (int64_t)((nm + SUM_CHUNK - 1) / SUM_CHUNK),
                  cw = (int64_t)((nw + SUM_CHUNK - 1) / SUM_CHUNK);
    if (r->dz) {
        BKI_FOR(c, cz) set_sum_f(r->grads, gbf, d->B, 0, (size_t)c * SUM_CHUNK, nz, r->dz);
    }
    if (r->dW) {
        BKI_FOR(c, cm)
        {
            const size_t e0 = (size_t)c * SUM_CHUNK, e1 = e0 + SUM_CHUNK < nm ? e0 + SUM_CHUNK : nm;
            for (size_t e = e0; e < e1; e++) dM[e] = 0.0;
            for (int b = 0; b < d->B; b++) {
                const float *g = r->grads + (size_t)b * gbf + om;
                for (size_t e = e0; e < e1; e++) dM[e] += g[e];
            }
        }
        BKI_FOR(c, cw) set_sum_f(r->grads, gbf, d->B, ow, (size_t)c * SUM_CHUNK, nw, r->dW);
        const bki_team tm = bki_region_team();
        bki_team_sync(&tm); /* nys_backward_global reads all of dM and dW */
        nys_backward_global(&tm, d, r->p, &r->a.g, dM, r->a.dtmp[1], r->a.dtmp[2], r->dW);
    }
}

/* the driver's reduce: dz, dW (c->pg) from the sets' gradient blocks */
static void reduce(bki_call *c)
{
    const otk_par *o = par_of(c);
    const bk_otk_desc *d = o->d;
    const otk_grads *g = c->pg;
    if (!g) return;
    const size_t nz = (size_t)d->q * d->p * d->k, nm = (size_t)d->k * d->k, nw = (size_t)d->k * d->d;
    grad_sums_args r = {d, o->p, (const float *)c->pgrad, {{0}, {0}}, bki_round_up(pgrad_bytes(c)) / sizeof(float),
                        nz, nm, nw, nz, nz + nm, g->dz, g->dW};
    if (o->p->W) r.a = nys_carve(d, c->prep);
    bki_parallel((size_t)d->B * (nz + nm + nw) > 65536 ? bki_threads() : 1, grad_sums_member, &r);
}

static const bki_op otk_op = {
    .name = "otk", .id = 100, .par_name = "bk_otk_config", .check = check, .cost = cost, .lane_bytes = lane_bytes,
    .block_bytes = block_bytes, .key = key, .prep_bytes = prep_bytes, .prepare = prepare, .pgrad_bytes = pgrad_bytes,
    .reduce = reduce, .forward = forward, .backward = backward, .call_bytes = call_bytes, .check_io = check_io,
    .check_results = check_results,
    .doc = "the OTK embedding (Mialon et al. 2021): sets pooled onto references (not in the registry: its "
           "problems are sets, bk_otk_*)",
};

/* ---- the public calls ------------------------------------------------------------ */
static bki_call otk_call(otk_par *o, const bk_otk_desc *d, const bk_otk_config *p, const float *z)
{
    memset(o, 0, sizeof *o);
    o->d = d;
    o->p = p;
    o->z = z;
    if (d) {
        const int64_t dv = (int64_t)d->q * d->k;
        o->ad.B = d->B;
        o->ad.H = 1;
        o->ad.Nq = d->p;
        o->ad.Nk = d->n;
        o->ad.d = d->d;
        o->ad.dv = dv > INT32_MAX ? INT32_MAX : (int)dv;
        o->ad.k_len = d->len;
    }
    return bki_call_of(&otk_op, &o->ad, o);
}

size_t bk_otk_workspace_size(const bk_otk_desc *d, const bk_otk_config *p)
{
    otk_par o;
    bki_call c = otk_call(&o, d, p, NULL);
    return bki_op_workspace_size(&c);
}

size_t bk_otk_tape_size(const bk_otk_desc *d, const bk_otk_config *p)
{
    otk_par o;
    bki_call c = otk_call(&o, d, p, NULL);
    return bki_op_tape_size_query(&c);
}

bk_status bk_otk_forward(const bk_otk_desc *d, const bk_otk_config *p, const bk_tensor *x, const float *z,
                         const bk_tensor *out, void *tape, const bk_otk_extras *ex, void *ws, size_t ws_size)
{
    otk_par o;
    bki_call c = otk_call(&o, d, p, z);
    c.k = x;
    c.out = out;
    c.ex = ex;
    return bki_op_forward(&c, tape, ws, ws_size);
}

bk_status bk_otk_backward(const bk_otk_desc *d, const bk_otk_config *p, const bk_tensor *x, const float *z,
                          const bk_tensor *dout, const void *tape, const bk_tensor *dx, float *dz, float *dW, void *ws,
                          size_t ws_size)
{
    otk_par o;
    bki_call c = otk_call(&o, d, p, z);
    otk_grads g = {dz, dW};
    c.k = x;
    c.dout = dout;
    c.dk = dx;
    c.pg = &g;
    return bki_op_backward(&c, tape, ws, ws_size);
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
