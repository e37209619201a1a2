/* otk.c -- the OTK embedding (Mialon et al. 2021): pool a set onto q
 * trainable references through an entropic OT plan, after a Nystrom kernel
 * map. Semantics in include/birkhoff.h, derivations in docs/ALGORITHMS.md
 * section 6.
 *
 * Per set b (the parallel unit): psi = Nystrom(x_b) (n_b x k), then for each
 * reference h the n_b x p plan, on the shared LSE/Sinkhorn engine (LOG: 2L
 * half-steps, row first; the engine returns A = n_b P) or on the scaling-form
 * iteration below (SCALING), and out_h = (c / n_b) (A (x) S)^T psi.
 * The backward replays each plan from its potentials (the tape), so memory
 * does not grow with L beyond O(L (n + p)) per problem; psi is recomputed.
 * Gradients shared over the batch (z, W and the Nystrom matrix M) are
 * accumulated per set and summed in set order: results do not depend on the
 * thread count. */
#include "ops.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define OTK_MAGIC 0x4b544f42u /* "BOTK" */
#define OTK_VERSION 1u
#define OTK_NORM2_MIN 1e-4f    /* the reference's clamp of |x|^2 */

bk_otk_params bk_otk_params_default(void)
{
    bk_otk_params p;
    memset(&p, 0, sizeof p);
    p.sigma = 0.5f;
    p.eta = 1e-2f;
    p.eps = 0.5f;
    p.iters = 10;
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

static bk_status check_params(const bk_otk_desc *d, const bk_otk_params *p)
{
    if (!p) return bki_fail(BK_ERR_NULL, "OTK parameters are NULL");
    if (!(p->eps > 0.0f) || !isfinite(p->eps)) return bki_fail(BK_ERR_PARAM, "eps must be finite and > 0, got %g", (double)p->eps);
    if (p->iters < 1 || p->iters > 1000000) return bki_fail(BK_ERR_PARAM, "iters (L) must be in [1, 1e6], got %d", p->iters);
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
    bk_tensor t = {(float *)a, (int64_t)rows * cols, (int64_t)rows * cols, cols};
    return t;
}

/* ---- Nystrom matrix M = h(G), G = exp(alpha (W W^T - 1)) --------------------- */
typedef struct {
    double *G, *V, *e;         /* k x k Gram, eigenvectors (columns), eigenvalues */
    float *M;                  /* k x k, float                                    */
} nys_global;

static size_t nys_bytes(int k)
{
    return 2 * bki_round_up((size_t)k * k * sizeof(double)) + bki_round_up((size_t)k * sizeof(double)) + fl((size_t)k * k) +
           4 * BK_ALIGN;
}

static nys_global nys_carve(int k, char *base)
{
    bki_arena ar = {bki_align_ptr(base), 0, nys_bytes(k)};
    nys_global g;
    g.G = bki_take(&ar, (size_t)k * k * sizeof(double));
    g.V = bki_take(&ar, (size_t)k * k * sizeof(double));
    g.e = bki_take(&ar, (size_t)k * sizeof(double));
    g.M = bki_take(&ar, (size_t)k * k * sizeof(float));
    return g;
}

static bk_status nys_setup(const bk_otk_desc *d, const bk_otk_params *p, nys_global *g)
{
    const int k = d->k, dd = d->d;
    const double alpha = 1.0 / ((double)p->sigma * p->sigma);
    for (int a = 0; a < k; a++)
        for (int b = 0; b <= a; b++) {
            double s = 0.0;
            for (int c = 0; c < dd; c++) s += (double)p->W[(size_t)a * dd + c] * p->W[(size_t)b * dd + c];
            g->G[(size_t)a * k + b] = g->G[(size_t)b * k + a] = exp(alpha * (s - 1.0));
        }
    memcpy(g->V, g->G, sizeof(double) * (size_t)k * k);
    lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', k, g->V, k, g->e);
    if (info != 0) return bki_fail(BK_ERR_NUMERIC, "eigendecomposition of the anchor Gram matrix failed (LAPACK info %d)", (int)info);
    for (int a = 0; a < k; a++)
        for (int b = 0; b <= a; b++) {
            double s = 0.0;
            for (int m = 0; m < k; m++) {
                const double t = sqrt(g->e[m] > 0.0 ? g->e[m] : 0.0) + p->eta;
                s += g->V[(size_t)a * k + m] * g->V[(size_t)b * k + m] / t;
            }
            if (!isfinite(s)) return bki_fail(BK_ERR_NUMERIC, "anchor Gram matrix is singular and eta = 0: set eta > 0");
            g->M[(size_t)a * k + b] = g->M[(size_t)b * k + a] = (float)s;
        }
    return BK_OK;
}

/* dW += (D + D^T) W with D = dG (x) alpha G, dG the gradient through h. */
static void nys_backward_global(const bk_otk_desc *d, const bk_otk_params *p, const nys_global *g, const double *dM,
                                double *tmp, double *tmp2, float *dW)
{
    const int k = d->k, dd = d->d;
    const double alpha = 1.0 / ((double)p->sigma * p->sigma), eta = p->eta;
    /* tmp = V^T dM V */
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, k, k, 1.0, g->V, k, dM, k, 0.0, tmp2, k);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, k, k, k, 1.0, tmp2, k, g->V, k, 0.0, tmp, k);
    for (int a = 0; a < k; a++)
        for (int b = 0; b < k; b++) {
            const double ea = g->e[a], eb = g->e[b];
            const double sa = sqrt(ea > 0 ? ea : 0), sb = sqrt(eb > 0 ? eb : 0), ta = sa + eta, tb = sb + eta;
            double F;
            if (p->isqrt_grad == BK_OTK_ISQRT_REFERENCE) F = -1.0 / ((ta + tb) * ta * tb);
            else if (ea > 0 && eb > 0) F = -1.0 / (ta * tb * (sa + sb));
            else if (ea <= 0 && eb <= 0) F = 0.0;
            else F = (1.0 / ta - 1.0 / tb) / (ea - eb);
            tmp[(size_t)a * k + b] *= F;
        }
    /* dG = V tmp V^T, then D = dG (x) alpha G */
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, k, k, k, 1.0, g->V, k, tmp, k, 0.0, tmp2, k);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, k, k, k, 1.0, tmp2, k, g->V, k, 0.0, tmp, k);
    for (int a = 0; a < k; a++)
        for (int b = 0; b < k; b++) tmp2[(size_t)a * k + b] = alpha * g->G[(size_t)a * k + b] * tmp[(size_t)a * k + b];
    for (int a = 0; a < k; a++)
        for (int c = 0; c < dd; c++) {
            double s = 0.0;
            for (int b = 0; b < k; b++)
                s += (tmp2[(size_t)a * k + b] + tmp2[(size_t)b * k + a]) * p->W[(size_t)b * dd + c];
            dW[(size_t)a * dd + c] += (float)s;
        }
}

/* ---- per-thread slab --------------------------------------------------------- */
typedef struct {
    float *xh, *r, *Bm, *psi, *dpsi;   /* n x d, n, n x k (x3)                */
    float *Ex;                         /* n x k: alpha (<w_l, xh_i> - 1)       */
    float *Lg, *A, *G, *S;             /* n x p logits, plan, adjoint, PE      */
    float *hist;                       /* potentials when no tape is kept      */
    float *aux;                        /* scaling domain: row shifts and
                                          adjoint iterates                     */
    float *scr;                        /* engine scratch                       */
} otk_slab;

static size_t hist_len(const bk_otk_desc *d, const bk_otk_params *p) { return bki_hist_len(d->n, d->p, 2 * p->iters); }

static size_t slab_bytes(const bk_otk_desc *d, const bk_otk_params *p)
{
    const size_t n = (size_t)d->n, k = (size_t)d->k, P = (size_t)d->p;
    return fl(n * d->d) + fl(n) + 4 * fl(n * k) + 4 * fl(n * P) + fl(hist_len(d, p)) +
           fl(n + 2 * (size_t)p->iters * (n + P) + P) + fl(bki_kern()->sk_scratch(d->n, d->p, 1)) + 16 * BK_ALIGN;
}

static otk_slab carve(const bk_otk_desc *d, const bk_otk_params *p, char *base)
{
    const size_t n = (size_t)d->n, k = (size_t)d->k, P = (size_t)d->p;
    bki_arena ar = {base, 0, slab_bytes(d, p)};
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
    w.aux = bki_take(&ar, (n + 2 * (size_t)p->iters * (n + P) + P) * sizeof(float));
    w.scr = bki_take(&ar, bki_kern()->sk_scratch(d->n, d->p, 1) * sizeof(float));
    return w;
}

static otk_slab thread_slab(const bk_otk_desc *d, const bk_otk_params *p, char *base)
{
    const int tid = bki_thread_id();
    return carve(d, p, bki_align_ptr(base + (size_t)tid * slab_bytes(d, p)));
}

/* ---- tape ------------------------------------------------------------------- */
typedef struct {
    uint32_t magic, version;
    int32_t B, n, d, q, p, k, L, domain, convention, pe, pe_double, anchors;
    float eps, sigma, eta, sigma_pos;
} otk_tape_header;

static size_t tape_block_floats(const bk_otk_desc *d, const bk_otk_params *p) { return bki_round_up(hist_len(d, p) * sizeof(float)) / sizeof(float); }

size_t bk_otk_tape_size(const bk_otk_desc *d, const bk_otk_params *p)
{
    if (!d || !p || d->B < 1 || d->q < 1 || d->n < 1 || d->p < 1 || p->iters < 1) return 0;
    return bki_round_up(sizeof(otk_tape_header)) + (size_t)d->B * d->q * tape_block_floats(d, p) * sizeof(float);
}

static float *tape_block(const void *tape, const bk_otk_desc *d, const bk_otk_params *p, int b, int h)
{
    return (float *)((char *)tape + bki_round_up(sizeof(otk_tape_header))) + ((size_t)b * d->q + h) * tape_block_floats(d, p);
}

static void tape_header_fill(otk_tape_header *t, const bk_otk_desc *d, const bk_otk_params *p)
{
    memset(t, 0, sizeof *t);
    t->magic = OTK_MAGIC; t->version = OTK_VERSION;
    t->B = d->B; t->n = d->n; t->d = d->d; t->q = d->q; t->p = d->p; t->k = d->k; t->L = p->iters;
    t->domain = p->domain; t->convention = p->convention; t->pe = p->pe; t->pe_double = p->pe_double;
    t->anchors = p->W != NULL;
    t->eps = p->eps; t->sigma = p->sigma; t->eta = p->eta; t->sigma_pos = p->sigma_pos;
}

/* ---- workspace ---------------------------------------------------------------- */
/* global part: Nystrom matrices, per-set gradient blocks (z, M, W), and a tape
 * when the backward recomputes the forward */
static size_t grad_block_floats(const bk_otk_desc *d, const bk_otk_params *p)
{
    size_t f = (size_t)d->q * d->p * d->k;
    if (p->W) f += (size_t)d->k * d->k + (size_t)d->k * d->d;
    return bki_round_up(f * sizeof(float)) / sizeof(float);
}

static size_t ws_need(const bk_otk_desc *d, const bk_otk_params *p, int nt, int backward, int own_tape)
{
    size_t b = (size_t)nt * slab_bytes(d, p) + BK_ALIGN;
    if (p->W) b += nys_bytes(d->k) + 3 * bki_round_up((size_t)d->k * d->k * sizeof(double)) + BK_ALIGN;
    if (backward) b += (size_t)d->B * grad_block_floats(d, p) * sizeof(float) + BK_ALIGN;
    if (own_tape) b += bk_otk_tape_size(d, p) + BK_ALIGN;
    return b;
}

size_t bk_otk_workspace_size(const bk_otk_desc *d, const bk_otk_params *p)
{
    if (!d || !p || d->B < 1 || d->n < 1 || d->d < 1 || d->q < 1 || d->p < 1 || d->k < 1 || p->iters < 1) return 0;
    return ws_need(d, p, bki_work_threads(d->B), 1, 1);
}

typedef struct {
    char *slabs;
    nys_global nys;
    double *dtmp[3];          /* k x k double scratch for the global backward */
    float *grads;             /* [B][grad_block]                              */
    void *own_tape;
} otk_ws;

static otk_ws ws_layout(const bk_otk_desc *d, const bk_otk_params *p, int nt, int backward, int own_tape, char *base)
{
    otk_ws w;
    memset(&w, 0, sizeof w);
    w.slabs = base;
    char *c = base + (size_t)nt * slab_bytes(d, p) + BK_ALIGN;
    if (p->W) {
        w.nys = nys_carve(d->k, c);
        c += nys_bytes(d->k);
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
/* psi (n_b x k, row stride k) of one set; keeps xh, r and Bm for the backward */
static void set_features(const bk_otk_desc *d, const bk_otk_params *p, const float *M, int nb, const float *x,
                         int64_t ldx, otk_slab *w)
{
    const int dd = d->d, k = d->k;
    if (!p->W) {
        for (int i = 0; i < nb; i++) memcpy(w->psi + (size_t)i * k, x + i * ldx, sizeof(float) * k);
        return;
    }
    const float alpha = 1.0f / (p->sigma * p->sigma);
    for (int i = 0; i < nb; i++) {
        const float *xi = x + i * ldx;
        double s2 = 0.0;
        for (int c = 0; c < dd; c++) s2 += (double)xi[c] * xi[c];
        const float r = sqrtf(fmaxf((float)s2, OTK_NORM2_MIN));
        w->r[i] = (float)s2 >= OTK_NORM2_MIN ? r : -r; /* sign marks a clamped norm */
        const float inv = 1.0f / r;
        for (int c = 0; c < dd; c++) w->xh[(size_t)i * dd + c] = xi[c] * inv;
    }
    /* s = xh W^T, then Bm = r exp(alpha (s - 1)) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, k, dd, alpha, w->xh, dd, p->W, dd, 0.0f, w->Ex, k);
    for (size_t i = 0; i < (size_t)nb * k; i++) w->Bm[i] = w->Ex[i] -= alpha;
    bki_kern()->vexp(w->Bm, (size_t)nb * k);
    for (int i = 0; i < nb; i++) {
        const float r = fabsf(w->r[i]);
        for (int l = 0; l < k; l++) w->Bm[(size_t)i * k + l] *= r;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, k, k, 1.0f, w->Bm, k, M, k, 0.0f, w->psi, k);
}

/* ---- positional encoding --------------------------------------------------------- */
static void pe_matrix(const bk_otk_desc *d, const bk_otk_params *p, int nb, float *S)
{
    const int P = d->p;
    const double isg = 1.0 / p->sigma_pos;
    if (p->pe == BK_OTK_PE_1D) {
        const int ref = p->convention == BK_OTK_REFERENCE;
        const double nn = ref ? d->n : nb, off = ref ? 0.0 : 1.0;
        for (int i = 0; i < nb; i++)
            for (int j = 0; j < P; j++) {
                const double t = ((i + off) / nn - (j + off) / P) * isg;
                S[(size_t)i * P + j] = (float)exp(-t * t);
            }
    } else {
        const int s = (int)lround(sqrt((double)P)), gh = p->grid_h, gw = p->grid_w;
        for (int i = 0; i < nb; i++)
            for (int j = 0; j < P; j++) {
                const double t1 = ((double)(i / gw + 1) / gh - (double)(j / s + 1) / s) * isg;
                const double t2 = ((double)(i % gw + 1) / gw - (double)(j % s + 1) / s) * isg;
                S[(size_t)i * P + j] = (float)(exp(-t1 * t1) * exp(-t2 * t2));
            }
    }
}

/* logits Lg = (psi z_h^T) / eps, times S when pe_double; psi: nb x k */
static void plan_logits(const bk_otk_desc *d, const bk_otk_params *p, int nb, const float *psi, const float *zh,
                        otk_slab *w)
{
    const int P = d->p, k = d->k;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, P, k, 1.0f / p->eps, psi, k, zh, k, 0.0f, w->Lg, P);
    if (p->pe != BK_OTK_PE_NONE && p->pe_double)
        for (size_t i = 0; i < (size_t)nb * P; i++) w->Lg[i] *= w->S[i];
}

/* ---- scaling domain ---------------------------------------------------------------
 * E = exp(Lg - rowmax) (kept in A), v_0 = 1, L times u = (1/n)/(E v),
 * v = (1/p)/(E^T u); u_t, v_t stored as the potentials (hist layout: u_1, v_1,
 * ..., u_L, v_L). A = n diag(u_L) E diag(v_L). Returns 0 when an iterate is not
 * finite and positive (E underflowed: eps too small for this domain). */
static void scaling_kernel(int n, int m, const float *Lg, float *E)
{
    for (int i = 0; i < n; i++) {
        const float *row = Lg + (size_t)i * m;
        float mx = row[0];
        for (int j = 1; j < m; j++) mx = fmaxf(mx, row[j]);
        for (int j = 0; j < m; j++) E[(size_t)i * m + j] = row[j] - mx;
    }
    bki_kern()->vexp(E, (size_t)n * m);
}

static int scaling_forward(int n, int m, int L, const float *Lg, float *E, float *hist, float *cs)
{
    scaling_kernel(n, m, Lg, E);
    const float a = 1.0f / n, bm = 1.0f / m;
    const float *v = NULL;
    for (int t = 1; t <= L; t++) {
        float *u = hist + bki_hist_off(n, m, 2 * t - 1), *vn = hist + bki_hist_off(n, m, 2 * t);
        for (int i = 0; i < n; i++) {
            float s = 0.0f;
            if (v) s = bki_dotf(m, E + (size_t)i * m, v);
            else
                for (int j = 0; j < m; j++) s += E[(size_t)i * m + j];
            u[i] = a / s;
            if (!(u[i] > 0.0f) || !isfinite(u[i])) return 0;
        }
        memset(cs, 0, sizeof(float) * m);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) cs[j] = fmaf(u[i], E[(size_t)i * m + j], cs[j]);
        for (int j = 0; j < m; j++) {
            vn[j] = bm / cs[j];
            if (!(vn[j] > 0.0f) || !isfinite(vn[j])) return 0;
        }
        v = vn;
    }
    const float *u = hist + bki_hist_off(n, m, 2 * L - 1);
    for (int i = 0; i < n; i++) {
        const float ui = u[i] * n;
        for (int j = 0; j < m; j++) E[(size_t)i * m + j] *= ui * v[j];
    }
    return 1;
}

/* Plan A = n P recomputed from stored iterates (bitwise the forward's). */
static void scaling_attention(int n, int m, int L, const float *Lg, const float *hist, float *A)
{
    scaling_kernel(n, m, Lg, A);
    const float *u = hist + bki_hist_off(n, m, 2 * L - 1), *v = hist + bki_hist_off(n, m, 2 * L);
    for (int i = 0; i < n; i++) {
        const float ui = u[i] * n;
        for (int j = 0; j < m; j++) A[(size_t)i * m + j] *= ui * v[j];
    }
}

/* VJP of the scaling iteration. G: dL/dA on entry, dL/dLg on exit. A holds
 * the plan (destroyed: E recomputed into it). aux: n + 2 L (n + m) + m. */
static void scaling_backward(int n, int m, int L, const float *Lg, const float *hist, float *A, float *G, float *aux)
{
    const float *uL = hist + bki_hist_off(n, m, 2 * L - 1), *vL = hist + bki_hist_off(n, m, 2 * L);
    float *ub = aux, *vb = aux + n;            /* adjoints of u and v           */
    float *UR = vb + m;                        /* n x 2L: [u_t | rho_t]          */
    float *DV = UR + (size_t)n * 2 * L;        /* m x 2L: [delta_t | v_{t-1}]    */
    const float a = 1.0f / n, bm = 1.0f / m;
    scaling_kernel(n, m, Lg, A);               /* A = E */
    /* A = n diag(u) E diag(v): Pbar = n G */
    memset(vb, 0, sizeof(float) * m);
    for (int i = 0; i < n; i++) {
        float s = 0.0f;
        for (int j = 0; j < m; j++) {
            const float g = G[(size_t)i * m + j] * n, e = A[(size_t)i * m + j];
            s = fmaf(g * e, vL[j], s);
            vb[j] = fmaf(g * e, uL[i], vb[j]);
            G[(size_t)i * m + j] = g * uL[i] * vL[j]; /* Ebar, direct term */
        }
        ub[i] = s;
    }
    for (int t = L; t >= 1; t--) {
        const float *ut = hist + bki_hist_off(n, m, 2 * t - 1), *vt = hist + bki_hist_off(n, m, 2 * t);
        const float *vp = t > 1 ? hist + bki_hist_off(n, m, 2 * t - 2) : NULL;
        const int c = t - 1;
        /* v_t = b / (E^T u_t): delta = -vbar v_t^2 / b; ubar += E delta */
        for (int j = 0; j < m; j++) {
            const float dl = -vb[j] * vt[j] * vt[j] / bm;
            DV[(size_t)j * 2 * L + c] = dl;
            DV[(size_t)j * 2 * L + L + c] = vp ? vp[j] : 1.0f;
            vb[j] = dl;                        /* reuse vb as delta             */
        }
        for (int i = 0; i < n; i++) {
            ub[i] += bki_dotf(m, A + (size_t)i * m, vb);
            UR[(size_t)i * 2 * L + c] = ut[i];
        }
        /* u_t = a / (E v_{t-1}): rho = -ubar u_t^2 / a; vbar = E^T rho */
        memset(vb, 0, sizeof(float) * m);
        for (int i = 0; i < n; i++) {
            const float rho = -ub[i] * ut[i] * ut[i] / a;
            UR[(size_t)i * 2 * L + L + c] = rho;
            for (int j = 0; j < m; j++) vb[j] = fmaf(rho, A[(size_t)i * m + j], vb[j]);
            ub[i] = 0.0f;
        }
    }
    /* Ebar += [U R] [D V']^T, then dLg = Ebar (x) E */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, 2 * L, 1.0f, UR, 2 * L, DV, 2 * L, 1.0f, G, m);
    for (size_t i = 0; i < (size_t)n * m; i++) G[i] *= A[i];
}

/* ---- one plan (forward) ------------------------------------------------------------ */
/* A = n_b P into w->A; potentials into hist. Returns 0 on scaling underflow. */
static int plan_forward(const bk_otk_desc *d, const bk_otk_params *p, int nb, float *hist, otk_slab *w)
{
    const int P = d->p;
    if (p->domain == BK_OTK_SCALING) return scaling_forward(nb, P, p->iters, w->Lg, w->A, hist, w->aux);
    bki_sk_problem pb = {nb, P, w->Lg, P, NULL, NULL, 2 * p->iters, 0.0f, NULL};
    bki_sk_result res = {hist, w->A, P, NULL, NULL, 0, 0.0f, 0.0f};
    bki_kern()->sk_forward(&BKI_SOLO, &pb, &res, w->scr);
    return 1;
}

static float out_coef(const bk_otk_desc *d, const bk_otk_params *p)
{
    return p->convention == BK_OTK_REFERENCE ? (float)d->p : sqrtf((float)d->p / (float)d->q);
}

/* A -> pooling weights c/n_b A (x) S in place */
static void pool_weights(const bk_otk_desc *d, const bk_otk_params *p, int nb, float *A, const float *S)
{
    const float c = out_coef(d, p) / (float)nb;
    const size_t np = (size_t)nb * d->p;
    if (p->pe != BK_OTK_PE_NONE)
        for (size_t i = 0; i < np; i++) A[i] *= c * S[i];
    else
        for (size_t i = 0; i < np; i++) A[i] *= c;
}

static void plan_diag(int nb, int P, const float *A, bk_otk_diag *dg)
{
    float re = 0.0f, ce = 0.0f;
    for (int i = 0; i < nb; i++) {
        double s = 0.0;
        for (int j = 0; j < P; j++) s += A[(size_t)i * P + j];
        re = fmaxf(re, (float)fabs(s - 1.0));
    }
    for (int j = 0; j < P; j++) {
        double s = 0.0;
        for (int i = 0; i < nb; i++) s += A[(size_t)i * P + j];
        ce = fmaxf(ce, (float)fabs(s * P / nb - 1.0));
    }
    dg->row_err = re;
    dg->col_err = ce;
}

/* ---- forward ---------------------------------------------------------------------- */
static bk_status check_inputs(const bk_otk_desc *d, const bk_otk_params *p, const bk_tensor *x, const float *z)
{
    bk_status s;
    if ((s = bki_otk_check_desc(d)) || (s = check_params(d, p))) return s;
    if ((s = bki_check_tensor("x", x, d->B, 1, d->n, d->d))) return s;
    if ((s = bki_check_finite("x", x, d->B, 1, d->n, d->d, d->len))) return s;
    if ((s = check_dense("references z", z, (size_t)d->q * d->p * d->k))) return s;
    return BK_OK;
}

/* Runs every set; out / tape / extras may be NULL. Returns the first set
 * whose scaling iteration failed, or -1. */
static int forward_core(const bk_otk_desc *d, const bk_otk_params *p, const bk_tensor *x, const float *z,
                        const bk_tensor *out, void *tape, const bk_otk_extras *ex, const otk_ws *ws, int nt)
{
    const int P = d->p, k = d->k;
    int bad = -1;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
        otk_slab w = thread_slab(d, p, ws->slabs);
#pragma omp for schedule(static)
        for (int b = 0; b < d->B; b++) {
            const int nb = bki_len(d->len, b, d->n);
            set_features(d, p, ws->nys.M, nb, bki_at(x, b, 0), x->stride_n, &w);
            if (p->pe != BK_OTK_PE_NONE) pe_matrix(d, p, nb, w.S);
            for (int h = 0; h < d->q; h++) {
                const float *zh = z + (size_t)h * P * k;
                float *hist = tape ? tape_block(tape, d, p, b, h) : w.hist;
                plan_logits(d, p, nb, w.psi, zh, &w);
                if (!plan_forward(d, p, nb, hist, &w)) {
#pragma omp critical(bk_otk_bad)
                    if (bad < 0 || b < bad) bad = b;
                    continue;
                }
                if (ex && ex->diag) plan_diag(nb, P, w.A, &ex->diag[(size_t)b * d->q + h]);
                pool_weights(d, p, nb, w.A, w.S);
                if (out)
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, P, k, nb, 1.0f, w.A, P, w.psi, k, 0.0f,
                                bki_at(out, b, 0) + (size_t)h * k, (int)out->stride_n);
                if (ex && ex->plan) {
                    float *pl = ex->plan + ((size_t)b * d->q + h) * d->n * P;
                    memcpy(pl, w.A, sizeof(float) * (size_t)nb * P);
                    memset(pl + (size_t)nb * P, 0, sizeof(float) * (size_t)(d->n - nb) * P);
                }
            }
        }
    }
    return bad;
}

static bk_status nys_prepare(const bk_otk_desc *d, const bk_otk_params *p, otk_ws *w)
{
    return p->W ? nys_setup(d, p, &w->nys) : BK_OK;
}

bk_status bk_otk_forward(const bk_otk_desc *d, const bk_otk_params *p, const bk_tensor *x, const float *z,
                         const bk_tensor *out, void *tape, const bk_otk_extras *ex, void *wsp, size_t ws_size)
{
    bk_status s;
    if ((s = check_inputs(d, p, x, z))) return s;
    if ((s = bki_check_tensor("out", out, d->B, 1, d->p, d->q * d->k))) return s;
    if (out->stride_n < (int64_t)d->q * d->k) return bki_fail(BK_ERR_STRIDE, "out row stride must be >= q*k");
    bk_tensor zt = dense_view(z, d->q * d->p, d->k), pt = {0, 0, 0, 0};
    const bk_tensor *in[2] = {x, &zt};
    const int ish[2][4] = {{d->B, 1, d->n, d->d}, {1, 1, d->q * d->p, d->k}};
    if (ex && ex->plan) pt = dense_view(ex->plan, d->B * d->q, d->n * d->p);
    const bk_tensor *o[2] = {out, &pt};
    const int osh[2][4] = {{d->B, 1, d->p, d->q * d->k}, {1, 1, d->B * d->q, d->n * d->p}};
    const char *on[2] = {"out", "plan"};
    if ((s = bki_check_aliasing(2, in, ish, 2, o, osh, on))) return s;
    const int nt = bki_work_threads(d->B);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(wsp, ws_size, ws_need(d, p, nt, 0, 0), "bk_otk_workspace_size", &owned, &base))) return s;
    otk_ws ws = ws_layout(d, p, nt, 0, 0, base);
    if ((s = nys_prepare(d, p, &ws))) goto done;
    if (tape) tape_header_fill(tape, d, p);
    int bad = forward_core(d, p, x, z, out, tape, ex, &ws, nt);
    if (bad >= 0) {
        if (tape) ((otk_tape_header *)tape)->magic = 0;
        s = bki_fail(BK_ERR_NUMERIC, "scaling-domain Sinkhorn underflowed on set %d (eps = %g too small for "
                     "exp(K/eps) in float32): use the log domain", bad, (double)p->eps);
        goto done;
    }
    bki_clear_error();
done:
    free(owned);
    return s;
}

bk_status bk_otk_features(const bk_otk_desc *d, const bk_otk_params *p, const bk_tensor *x, const bk_tensor *psi)
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
    const int nt = bki_work_threads(d->B);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(NULL, 0, ws_need(d, p, nt, 0, 0), "bk_otk_workspace_size", &owned, &base))) return s;
    otk_ws ws = ws_layout(d, p, nt, 0, 0, base);
    if ((s = nys_prepare(d, p, &ws))) goto done;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
        otk_slab w = thread_slab(d, p, ws.slabs);
#pragma omp for schedule(static)
        for (int b = 0; b < d->B; b++) {
            const int nb = bki_len(d->len, b, d->n);
            set_features(d, p, ws.nys.M, nb, bki_at(x, b, 0), x->stride_n, &w);
            float *dst = bki_at(psi, b, 0);
            for (int i = 0; i < nb; i++) memcpy(dst + i * psi->stride_n, w.psi + (size_t)i * d->k, sizeof(float) * d->k);
            bki_zero_rows(dst, psi->stride_n, nb, d->n, d->k);
        }
    }
    bki_clear_error();
done:
    free(owned);
    return s;
}

/* ---- backward --------------------------------------------------------------------- */
static bk_status check_tape(const void *tape, const bk_otk_desc *d, const bk_otk_params *p)
{
    otk_tape_header t;
    tape_header_fill(&t, d, p);
    const otk_tape_header *h = tape;
    if (h->magic != OTK_MAGIC || h->version != OTK_VERSION)
        return bki_fail(BK_ERR_TAPE, "tape has a bad magic number or version (not written by a successful bk_otk_forward?)");
    if (memcmp(h, &t, sizeof t) != 0) return bki_fail(BK_ERR_TAPE, "tape was written for another problem or other parameters");
    return BK_OK;
}

/* Nystrom backward of one set: dpsi -> dx rows, dM_b, dW_b (direct term) */
static void set_features_backward(const bk_otk_desc *d, const bk_otk_params *p, const float *M, int nb,
                                  const float *x, int64_t ldx, otk_slab *w, float *dxb, int64_t lddx, float *dMb,
                                  float *dWb)
{
    const int dd = d->d, k = d->k;
    if (!p->W) {
        if (dxb)
            for (int i = 0; i < nb; i++) memcpy(dxb + i * lddx, w->dpsi + (size_t)i * k, sizeof(float) * k);
        return;
    }
    const float alpha = 1.0f / (p->sigma * p->sigma);
    /* dM = Bm^T dpsi; dBm = dpsi M (into psi, no longer needed) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, k, nb, 1.0f, w->Bm, k, w->dpsi, k, 0.0f, dMb, k);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, k, k, 1.0f, w->dpsi, k, M, k, 0.0f, w->psi, k);
    /* g = dBm (x) kappa, kappa = Bm / r; coefficient of xh: sum_l g (1 - alpha s),
     * 1 - alpha s = 1 - alpha - Ex */
    float *g = w->psi;
    for (int i = 0; i < nb; i++) {
        const float ir = 1.0f / fabsf(w->r[i]), c1 = 1.0f - alpha;
        float cx = 0.0f;
        float *gi = g + (size_t)i * k;
        const float *bi = w->Bm + (size_t)i * k, *ei = w->Ex + (size_t)i * k;
        for (int l = 0; l < k; l++) {
            gi[l] *= bi[l] * ir;
            cx = fmaf(gi[l], c1 - ei[l], cx);
        }
        w->dpsi[(size_t)i * k] = w->r[i] > 0.0f ? cx : 0.0f; /* reuse: per-row coefficient */
    }
    /* dW_b = alpha g^T x */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, dd, nb, alpha, g, k, x, (int)ldx, 0.0f, dWb, dd);
    if (!dxb) return;
    /* dx = cx xh + alpha g W */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, dd, k, alpha, g, k, p->W, dd, 0.0f, dxb, (int)lddx);
    for (int i = 0; i < nb; i++) {
        if (!(w->r[i] > 0.0f)) continue;
        const float cx = w->dpsi[(size_t)i * k];
        for (int c = 0; c < dd; c++) dxb[i * lddx + c] = fmaf(cx, w->xh[(size_t)i * dd + c], dxb[i * lddx + c]);
    }
}

bk_status bk_otk_backward(const bk_otk_desc *d, const bk_otk_params *p, const bk_tensor *x, const float *z,
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
    bk_tensor zt = dense_view(z, d->q * d->p, d->k), dzt = {dz, 0, 0, 0}, dWt = {dW, 0, 0, 0}, Wt = {0, 0, 0, 0};
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
    const int nt = bki_work_threads(d->B);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(wsp, ws_size, ws_need(d, p, nt, 1, tape_in == NULL), "bk_otk_workspace_size", &owned, &base)))
        return s;
    otk_ws ws = ws_layout(d, p, nt, 1, tape_in == NULL, base);
    if ((s = nys_prepare(d, p, &ws))) goto done;
    const void *tape = tape_in;
    if (!tape) {
        tape_header_fill(ws.own_tape, d, p);
        int bad = forward_core(d, p, x, z, NULL, ws.own_tape, NULL, &ws, nt);
        if (bad >= 0) {
            s = bki_fail(BK_ERR_NUMERIC, "scaling-domain Sinkhorn underflowed on set %d: use the log domain", bad);
            goto done;
        }
        tape = ws.own_tape;
    }
    const int P = d->p, k = d->k, L = p->iters;
    const size_t gbf = grad_block_floats(d, p);
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
        otk_slab w = thread_slab(d, p, ws.slabs);
#pragma omp for schedule(static)
        for (int b = 0; b < d->B; b++) {
            const int nb = bki_len(d->len, b, d->n);
            const float *xb = bki_at(x, b, 0);
            float *gz = ws.grads + (size_t)b * gbf, *gM = NULL, *gW = NULL;
            if (p->W) {
                gM = gz + (size_t)d->q * P * k;
                gW = gM + (size_t)k * k;
            }
            set_features(d, p, ws.nys.M, nb, xb, x->stride_n, &w);
            if (p->pe != BK_OTK_PE_NONE) pe_matrix(d, p, nb, w.S);
            memset(w.dpsi, 0, sizeof(float) * (size_t)nb * k);
            const float cn = out_coef(d, p) / (float)nb;
            for (int h = 0; h < d->q; h++) {
                const float *zh = z + (size_t)h * P * k, *hist = tape_block(tape, d, p, b, h);
                const float *Gh = bki_at(dout, b, 0) + (size_t)h * k;
                const int ldg = (int)dout->stride_n;
                plan_logits(d, p, nb, w.psi, zh, &w);
                if (p->domain == BK_OTK_SCALING) scaling_attention(nb, P, L, w.Lg, hist, w.A);
                else {
                    bki_sk_problem pb = {nb, P, w.Lg, P, NULL, NULL, 2 * L, 0.0f, NULL};
                    bki_kern()->sk_attention(&BKI_SOLO, &pb, 2 * L, hist, w.A, P, w.scr);
                }
                /* the forward's pooling weights (in G for now): dpsi += Wt Gh */
                memcpy(w.G, w.A, sizeof(float) * (size_t)nb * P);
                pool_weights(d, p, nb, w.G, w.S);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, k, P, 1.0f, w.G, P, Gh, ldg, 1.0f, w.dpsi, k);
                /* Abar = cn S (x) (psi Gh^T) */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, P, k, cn, w.psi, k, Gh, ldg, 0.0f, w.G, P);
                if (p->pe != BK_OTK_PE_NONE)
                    for (size_t i = 0; i < (size_t)nb * P; i++) w.G[i] *= w.S[i];
                if (p->domain == BK_OTK_SCALING) scaling_backward(nb, P, L, w.Lg, hist, w.A, w.G, w.aux);
                else {
                    bki_sk_problem pb = {nb, P, w.Lg, P, NULL, NULL, 2 * L, 0.0f, NULL};
                    bki_kern()->sk_backward(&BKI_SOLO, &pb, 2 * L, hist, w.A, P, w.G, P, w.scr, NULL, NULL);
                }
                /* dK = dLg / eps (x S when pe_double) */
                if (p->pe != BK_OTK_PE_NONE && p->pe_double)
                    for (size_t i = 0; i < (size_t)nb * P; i++) w.G[i] *= w.S[i];
                const float ie = 1.0f / p->eps;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, k, P, ie, w.G, P, zh, k, 1.0f, w.dpsi, k);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, P, k, nb, ie, w.G, P, w.psi, k, 0.0f,
                            gz + (size_t)h * P * k, k);
            }
            float *dxb = dx ? bki_at(dx, b, 0) : NULL;
            set_features_backward(d, p, ws.nys.M, nb, xb, x->stride_n, &w, dxb, dx ? dx->stride_n : 0, gM, gW);
            if (dxb) bki_zero_rows(dxb, dx->stride_n, nb, d->n, d->d);
        }
    }
    /* batch sums in set order */
    if (dz) {
        memset(dz, 0, sizeof(float) * (size_t)d->q * P * k);
        for (int b = 0; b < d->B; b++) {
            const float *gz = ws.grads + (size_t)b * gbf;
            for (size_t i = 0; i < (size_t)d->q * P * k; i++) dz[i] += gz[i];
        }
    }
    if (dW) {
        double *dM = ws.dtmp[0];
        memset(dM, 0, sizeof(double) * (size_t)k * k);
        memset(dW, 0, sizeof(float) * (size_t)k * d->d);
        for (int b = 0; b < d->B; b++) {
            const float *gM = ws.grads + (size_t)b * gbf + (size_t)d->q * P * k, *gW = gM + (size_t)k * k;
            for (size_t i = 0; i < (size_t)k * k; i++) dM[i] += gM[i];
            for (size_t i = 0; i < (size_t)k * d->d; i++) dW[i] += gW[i];
        }
        nys_backward_global(d, p, &ws.nys, dM, ws.dtmp[1], ws.dtmp[2], dW);
    }
    bki_clear_error();
done:
    free(owned);
    return s;
}

/* ---- transport statistics for the unsupervised fits (otk_fit.c) ---------------------
 * F: features [B][n][k] (dense; rows below len[b] valid). For every set b:
 * sim[b*q+h] = sum_ij P_ij <F_i, z^h_j> for each h (LOG plan, p->eps,
 * p->iters; sim may be NULL), and when bary != NULL the sum over sets with
 * ref[b] = h of p P^T F_b is added to bary[h] ([q][p][k]) in set order. */
bk_status bki_otk_transport(const bk_otk_desc *d, const bk_otk_params *p0, const float *F, const float *z,
                            double *sim, const int *ref, float *bary)
{
    bk_otk_params p = *p0;
    p.W = NULL;
    p.domain = BK_OTK_LOG;
    p.pe = BK_OTK_PE_NONE;
    bk_otk_desc dd = *d;
    dd.d = d->k;
    const int nt = bki_work_threads(d->B), P = d->p, k = d->k;
    const int chunk = 8 * nt;
    const size_t slab = slab_bytes(&dd, &p);
    char *base = malloc((size_t)nt * slab + BK_ALIGN + (bary ? (size_t)chunk * P * k * sizeof(float) : 0));
    if (!base) return bki_fail(BK_ERR_NOMEM, "out of memory (OTK transport statistics)");
    float *part = (float *)(base + (size_t)nt * slab + BK_ALIGN);
    for (int b0 = 0; b0 < d->B; b0 += chunk) {
        const int b1 = b0 + chunk < d->B ? b0 + chunk : d->B;
#pragma omp parallel num_threads(nt)
        {
            BKI_REGION;
            otk_slab w = thread_slab(&dd, &p, base);
#pragma omp for schedule(static)
            for (int b = b0; b < b1; b++) {
                const int nb = bki_len(d->len, b, d->n);
                const float *Fb = F + (size_t)b * d->n * k;
                for (int h = 0; h < d->q; h++) {
                    if (!sim && ref[b] != h) continue;
                    const float *zh = z + (size_t)h * P * k;
                    plan_logits(&dd, &p, nb, Fb, zh, &w);
                    plan_forward(&dd, &p, nb, w.hist, &w);
                    if (sim) {
                        double s = 0.0;
                        for (size_t i = 0; i < (size_t)nb * P; i++) s += (double)w.A[i] * w.Lg[i];
                        sim[(size_t)b * d->q + h] = s * p.eps / nb;
                    }
                    if (bary && ref[b] == h)
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, P, k, nb, (float)P / nb, w.A, P, Fb, k,
                                    0.0f, part + (size_t)(b - b0) * P * k, k);
                }
            }
        }
        if (bary)
            for (int b = b0; b < b1; b++) {
                float *dst = bary + (size_t)ref[b] * P * k;
                const float *src = part + (size_t)(b - b0) * P * k;
                for (size_t i = 0; i < (size_t)P * k; i++) dst[i] += src[i];
            }
    }
    free(base);
    return BK_OK;
}
