/* layers.c -- Linear, LayerNorm, GELU, dropout and column sums for the
 * training engine (see layers.h). Row loops take their rows in chunks
 * claimed at run time (BKI_FOR); each row's result is computed by the same
 * code whatever the member or the thread count. */
#include "layers.h"

#include <math.h>
#include <string.h>

/* Column sums (a bias gradient, LayerNorm's dg and db): the columns are cut
 * in blocks of whole COLBLK-column pieces, as many blocks as members (the
 * width a function of C and the member count), claimed at run time; a block
 * is swept over the rows once, SWEEP columns at a time, reading each row's
 * stretch contiguously. (A sweep per COLBLK piece read every row in 128-byte
 * pieces: LayerNorm's column pass was 55 % of its backward.) Each column's
 * sum runs over the rows in order, in double, whatever the block or member:
 * the same bits on any thread count. */
#define COLBLK 32
#define SWEEP 256

/* the columns of a column-sum block for nt members */
static int col_width(int C, int nt)
{
    const int pieces = (C + COLBLK - 1) / COLBLK;
    return (pieces + nt - 1) / nt * COLBLK;
}

/* sum[c - lo] = the column sum of rows [0, R) for c in [lo, hi): each
 * column's rows in order, in double, each row's stretch read contiguously */
static void colsum_cols(const float *a, int R, int lda, int lo, int hi, double *sum)
{
    for (int c = lo; c < hi; c++) sum[c - lo] = 0.0;
    for (int r = 0; r < R; r++) {
        const float *ar = a + (size_t)r * lda;
        for (int c = lo; c < hi; c++) sum[c - lo] += ar[c];
    }
}

/* this member's share of bki_colsum_add (inside a region): claimed blocks
 * of col_width columns, SWEEP at a time */
static void colsum_member(const float *a, int R, int C, int lda, float *out)
{
    const bki_team tm = bki_region_team();
    BKI_RANGES(&tm, C, col_width(C, tm.nt), lo, hi) {
        for (int c0 = lo; c0 < hi; c0 += SWEEP) {
            const int c1 = hi - c0 < SWEEP ? hi : c0 + SWEEP;
            _Alignas(64) double acc[SWEEP];
            colsum_cols(a, R, lda, c0, c1, acc);
            for (int c = c0; c < c1; c++) out[c] += (float)acc[c - c0];
        }
    }
}

typedef struct {
    const float *a;
    int R, C, lda;
    float *out;
} colsum_args;
static void colsum_add_member(void *arg)
{
    const colsum_args *r = arg;
    colsum_member(r->a, r->R, r->C, r->lda, r->out);
}

void bki_colsum_add(const float *a, int R, int C, int lda, float *out)
{
    colsum_args r = {a, R, C, lda, out};
    bki_parallel_claimed(bki_threads(), colsum_add_member, &r);
}

typedef struct {
    int R, C;
    const float *x, *g, *b;
    float eps;
    float *y, *mu, *rs;
} ln_fwd_args;
static void ln_fwd_member(void *arg)
{
    const ln_fwd_args *a = arg;
    const int C = a->C;
    const float *x = a->x, *g = a->g, *b = a->b;
    BKI_FOR(i, a->R) {
        const int r = (int)i;
        const float *xr = x + (size_t)r * C;
        float *yr = a->y + (size_t)r * C;
        /* sums in double, in vector lanes (the build's width: the order
         * is fixed by the code, not by the thread count) */
        double s = 0.0, s2 = 0.0;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < C; c++) s += xr[c];
        const double m = s / C;
#pragma omp simd reduction(+ : s2)
        for (int c = 0; c < C; c++) {
            const double t = xr[c] - m;
            s2 += t * t;
        }
        const float mf = (float)m, rf = (float)(1.0 / sqrt(s2 / C + (double)a->eps));
        a->mu[r] = mf;
        a->rs[r] = rf;
        for (int c = 0; c < C; c++) yr[c] = (xr[c] - mf) * rf * g[c] + b[c];
    }
}

void bki_layernorm_fwd(int R, int C, const float *x, const float *g, const float *b, float eps, float *y, float *mu,
                       float *rs)
{
    ln_fwd_args r = {R, C, x, g, b, eps, y, mu, rs};
    bki_parallel_claimed(bki_threads(), ln_fwd_member, &r);
}

/* LayerNorm backward in one pass over x and dy: the rows go in fixed blocks
 * (LN_BLOCK_FLOATS floats of x a block, a function of C only); a block's
 * member computes dx row by row and, in the same sweep, the block's partial
 * column sums of dy xhat and dy (double, rows in order), then adds them into
 * the shared sums in block order (an ordered section; block 0 first zeroes
 * them, the last block then adds them into dg and db): every column's dg and
 * db are the same chain of block partials whatever the thread count. The
 * ordered sections of one stretch all pass before those of the next, so the
 * shared sums need no barrier. Columns go LN_COLS at a time; past the first
 * stretch a row's later stretches read it again (rows wider than LN_COLS
 * only). The separate column sweep this replaces read x and dy twice:
 * docs/PERFORMANCE.md, "Thin column tiles". */
#define LN_BLOCK_FLOATS 8192
#define LN_COLS 512
typedef struct {
    int R, C, rb, nblk;
    const float *x, *mu, *rs, *g, *dy;
    float *dx, *dg, *db;
    double *sg, *sb; /* the shared sums of the current stretch (LN_COLS each) */
} ln_bwd_args;

/* block blk's partial sums pg, pb of columns [c0, c0 + cn) (and its rows'
 * dx in the first stretch) */
static void ln_bwd_block(const ln_bwd_args *a, int blk, int c0, int cn, double *pg, double *pb)
{
    const int R = a->R, C = a->C, rb = a->rb;
    const float *g = a->g;
    for (int c = 0; c < cn; c++) pg[c] = pb[c] = 0.0;
    const int r1 = (blk + 1) * rb < R ? (blk + 1) * rb : R;
    for (int r = blk * rb; r < r1; r++) {
        const float *xr = a->x + (size_t)r * C, *dr = a->dy + (size_t)r * C;
        const float mr = a->mu[r], rr = a->rs[r];
        if (c0 == 0) { /* dx, once a row */
            float *dxr = a->dx + (size_t)r * C;
            double s1 = 0.0, s2 = 0.0;
#pragma omp simd reduction(+ : s1, s2)
            for (int c = 0; c < C; c++) {
                const double dxh = (double)dr[c] * g[c];
                s1 += dxh;
                s2 += dxh * ((xr[c] - mr) * rr);
            }
            const float m1 = (float)(s1 / C), m2 = (float)(s2 / C);
            /* and the first stretch's partial sums from the same xhat */
            for (int c = 0; c < C; c++) {
                const float xh = (xr[c] - mr) * rr;
                dxr[c] += rr * (dr[c] * g[c] - m1 - xh * m2);
                if (c < cn) {
                    pg[c] += (double)dr[c] * xh;
                    pb[c] += dr[c];
                }
            }
        } else {
            for (int c = 0; c < cn; c++) {
                pg[c] += (double)dr[c0 + c] * ((xr[c0 + c] - mr) * rr);
                pb[c] += dr[c0 + c];
            }
        }
    }
}

static void ln_bwd_member(void *arg)
{
    const ln_bwd_args *a = arg;
    const bki_team tm = bki_region_team();
    double *sg = a->sg, *sb = a->sb;
    for (int c0 = 0; c0 < a->C; c0 += LN_COLS) {
        const int cn = a->C - c0 < LN_COLS ? a->C - c0 : LN_COLS;
        bki_claims cl = bki_claims_open_ordered(&tm, a->nblk);
        for (int64_t k; bki_claims_next(&cl, &k);) {
            const int blk = (int)k;
            _Alignas(64) double pg[LN_COLS], pb[LN_COLS];
            ln_bwd_block(a, blk, c0, cn, pg, pb);
            bki_ordered_begin(&cl, k);
            if (blk == 0)
                for (int c = 0; c < cn; c++) sg[c] = sb[c] = 0.0;
            for (int c = 0; c < cn; c++) {
                sg[c] += pg[c];
                sb[c] += pb[c];
            }
            if (blk == a->nblk - 1)
                for (int c = 0; c < cn; c++) {
                    a->dg[c0 + c] += (float)sg[c];
                    a->db[c0 + c] += (float)sb[c];
                }
            bki_ordered_end(&cl, k);
        }
    }
}

void bki_layernorm_bwd(int R, int C, const float *x, const float *mu, const float *rs, const float *g,
                       const float *dy, float *dx, float *dg, float *db)
{
    if (R < 1 || C < 1) return;
    const int rb = C >= LN_BLOCK_FLOATS ? 1 : (LN_BLOCK_FLOATS / C < 64 ? LN_BLOCK_FLOATS / C : 64);
    _Alignas(64) double sg[LN_COLS], sb[LN_COLS];
    ln_bwd_args r = {R, C, rb, (R + rb - 1) / rb, x, mu, rs, g, dy, dx, dg, db, sg, sb};
    bki_parallel_claimed(bki_threads(), ln_bwd_member, &r);
}

/* The GELU passes run the per-instruction-set kernels (src/core/vgelu.h,
 * bki_kern()->gelu and ->gelu_grad: AVX-512 vectors where the CPU has them;
 * the same bits either way) on fixed chunks of GELU_CHUNK elements claimed
 * at run time by the members. */
#define GELU_CHUNK 4096
typedef struct {
    size_t n;
    const float *z, *dy;
    float *out;
    const bki_kernels *K;
} gelu_args;
static void gelu_member(void *arg)
{
    const gelu_args *a = arg;
    const size_t n = a->n;
    BKI_FOR(c, (int64_t)((n + GELU_CHUNK - 1) / GELU_CHUNK)) {
        const size_t i = (size_t)c * GELU_CHUNK, len = n - i < GELU_CHUNK ? n - i : GELU_CHUNK;
        if (a->dy) a->K->gelu_grad(len, a->z + i, a->dy + i, a->out + i);
        else a->K->gelu(len, a->z + i, a->out + i);
    }
}

/* out = gelu(z) (dy NULL) or dy gelu'(z) */
static void gelu_pass(size_t n, const float *z, const float *dy, float *out)
{
    gelu_args a = {n, z, dy, out, bki_kern()};
    bki_parallel_claimed(n > 16384 ? bki_threads() : 1, gelu_member, &a);
}

void bki_gelu_fwd(size_t n, const float *z, float *y) { gelu_pass(n, z, NULL, y); }

void bki_gelu_bwd(size_t n, const float *z, const float *dy, float *dz) { gelu_pass(n, z, dy, dz); }

/* ---- Linear, with its epilogues fused into the GEMM tiles ---------------- */
/* GEMMs run single-threaded BLAS inside our own parallel region, in the
 * fixed tiles of bki_gemm (a function of the shape only: at most 8 row tiles,
 * about 16 in all), shared over a team of the region's threads: no thread
 * pool fights another (OpenBLAS's and OpenMP's spinning threads would share
 * the cores), each tile is the same call whatever the thread count, and few
 * large tiles keep OpenBLAS from packing the same weight panel again for
 * every 64 rows (it packs both operands of every call). The bias and the
 * GELU (forward), gelu' (backward, on dx) run on each tile right after its
 * call, while it is in cache, instead of as passes of their own. */

/* the forward's epilogue: + b (nullable), then + the residual res (nullable,
 * row stride ldr), then where asked g = gelu(y) and y := gelu'(y), the slope
 * the backward needs (g has y's row stride) */
typedef struct {
    const float *b, *res;
    ptrdiff_t ldr;
    float *g;
} fwd_ep;
static void fwd_tile(void *arg, int i0, int j0, int mi, int nj, float *Ct, ptrdiff_t ldc)
{
    const fwd_ep *e = arg;
    const bki_kernels *K = bki_kern();
    for (int i = 0; i < mi; i++) {
        float *y = Ct + (ptrdiff_t)i * ldc;
        if (e->b)
            for (int j = 0; j < nj; j++) y[j] += e->b[j0 + j];
        if (e->res) {
            const float *r = e->res + (ptrdiff_t)(i0 + i) * e->ldr + j0;
            for (int j = 0; j < nj; j++) y[j] += r[j];
        }
        if (e->g) K->gelu_keep_slope((size_t)nj, y, e->g + (ptrdiff_t)(i0 + i) * ldc + j0);
    }
}

typedef struct {
    int R, in, out;
    const float *x;
    int ldx;
    const float *W;
    float *y;
    int ldy;
    fwd_ep *e;
} linear_fwd_args;
static void linear_fwd_member(void *arg)
{
    const linear_fwd_args *a = arg;
    const fwd_ep *e = a->e;
    const int any = e->b || e->res || e->g;
    const bki_team tm = bki_region_team();
    bki_gemm_ep(&tm, 0, 1, a->R, a->out, a->in, 1.0f, a->x, a->ldx, a->W, a->in, 0.0f, a->y, a->ldy,
                any ? fwd_tile : NULL, a->e);
}

static void linear_fwd_ep(int R, int in, int out, const float *x, int ldx, const float *W, float *y, int ldy,
                          fwd_ep *e)
{
    linear_fwd_args a = {R, in, out, x, ldx, W, y, ldy, e};
    bki_parallel_claimed(bki_threads(), linear_fwd_member, &a);
}

void bki_linear_fwd_gelu(int R, int in, int out, const float *x, int ldx, const float *W, const float *b, float *y,
                         int ldy, float *g)
{
    fwd_ep e = {b, NULL, 0, g};
    linear_fwd_ep(R, in, out, x, ldx, W, y, ldy, &e);
}

void bki_linear_fwd_res(int R, int in, int out, const float *x, int ldx, const float *W, const float *b,
                        const float *res, int ldr, float *y, int ldy)
{
    fwd_ep e = {b, res, ldr, NULL};
    linear_fwd_ep(R, in, out, x, ldx, W, y, ldy, &e);
}

void bki_linear_fwd(int R, int in, int out, const float *x, int ldx, const float *W, const float *b, float *y,
                    int ldy)
{
    bki_linear_fwd_gelu(R, in, out, x, ldx, W, b, y, ldy, NULL);
}

/* the backward's epilogue on dx: dx *= s, s = gelu'(z) as the forward kept
 * it (arg: the address of s's pointer; s has dx's row stride) */
static void gelu_grad_tile(void *arg, int i0, int j0, int mi, int nj, float *Ct, ptrdiff_t ldc)
{
    const float *s0 = *(const float *const *)arg;
    for (int i = 0; i < mi; i++) {
        float *d = Ct + (ptrdiff_t)i * ldc;
        const float *s = s0 + (ptrdiff_t)(i0 + i) * ldc + j0;
        for (int j = 0; j < nj; j++) d[j] *= s[j];
    }
}

/* dW += dy^T x and db += colsum(dy), this member's share. With kbuf
 * (bki_linear_kbuf_floats(out, in) floats) and at least KSPLIT_MIN rows,
 * the rows go in two fixed halves (a function of R only): the first half's
 * product is added straight into dW and its rows of dy summed into s0, the
 * second half's product goes into kbuf and its sums into s1, and after a
 * team sync dW = (dW + P0) + P1, db += (float)(s0 + s1) on any thread count.
 * The four pieces are the blocks of one claimed loop, in the order P0's
 * tiles, s0's column blocks, P1's tiles, s1's column blocks: so a member's
 * own share is the half of the rows its threads wrote (the operations
 * before share rows the same way), which made a 128 x 128 weight gradient
 * over 3200 rows 0.49 -> 0.34 ms on 2 threads against column tiles over all
 * the rows, and a member the kernel descheduled leaves its half's blocks to
 * the others. (LOT's gemm_ksum, src/ops/lot.c, is the same idea for its
 * r x d outputs over K up to N: many fixed chunks, each into its own
 * partial. Here two halves, the first straight into dW, keep the scratch to
 * one out x in.) */
#define KSPLIT_MIN 1024
size_t bki_linear_kbuf_floats(int out, int in) { return (size_t)out * in + 16 + 4 * (size_t)out; }

static void grads_member(const bki_team *tm, int R, int in, int out, const float *x, int ldx, const float *dy,
                         int ldy, float *dW, float *db, float *kbuf)
{
    if (!kbuf || R < KSPLIT_MIN) {
        if (dW) bki_gemm(tm, 1, 0, out, in, R, 1.0f, dy, ldy, x, ldx, 1.0f, dW, in);
        if (db) colsum_member(dy, R, out, ldy, db);
        return;
    }
    const int R0 = (R / 2 + 7) & ~7, R1 = R - R0;
    const float *dy1 = dy + (size_t)R0 * ldy, *x1 = x + (size_t)R0 * ldx;
    double *s0 = (double *)(void *)(kbuf + (((size_t)out * in + 15) & ~(size_t)15)), *s1 = s0 + out;
    const int64_t nt0 = dW ? bki_gemm_ntiles(1, 0, out, in, R0) : 0, nt1 = dW ? bki_gemm_ntiles(1, 0, out, in, R1) : 0;
    const int w = col_width(out, tm->nt); /* s0's and s1's column blocks */
    const int64_t ncb = db ? (out + w - 1) / w : 0;
    bki_claims cl = bki_claims_open(tm, nt0 + ncb + nt1 + ncb);
    for (int64_t b; bki_claims_next(&cl, &b);) {
        const int half = b >= nt0 + ncb;
        const int64_t k = half ? b - nt0 - ncb : b, nt = half ? nt1 : nt0;
        const float *dyh = half ? dy1 : dy, *xh = half ? x1 : x;
        const int Rh = half ? R1 : R0;
        if (k < nt) {
            bki_gemm_tile((int)k, 1, 0, out, in, Rh, 1.0f, dyh, ldy, xh, ldx, half ? 0.0f : 1.0f, half ? kbuf : dW, in);
        } else {
            const int c0 = (int)(k - nt) * w, c1 = c0 + w < out ? c0 + w : out;
            colsum_cols(dyh, Rh, ldy, c0, c1, (half ? s1 : s0) + c0);
        }
    }
    bki_team_sync(tm);
    if (dW) /* 4096 floats (whole lines) a range */
        BKI_RANGES(tm, (int64_t)out * in, 4096, e0, e1) for (int e = e0; e < e1; e++) dW[e] += kbuf[e];
    if (db)
        BKI_RANGES(tm, out, w, c0, c1) for (int c = c0; c < c1; c++) db[c] += (float)(s0[c] + s1[c]);
}

typedef struct {
    int R, in, out;
    const float *x;
    int ldx;
    const float *W, *dy;
    int ldy;
    float *dx;
    float beta_dx;
    float *dW, *db;
    const float *s;
    float *kbuf;
} linear_bwd_args;
static void linear_bwd_member(void *arg)
{
    linear_bwd_args *a = arg; /* not const: &a->s is gelu_grad_tile's argument */
    const bki_team tm = bki_region_team();
    if (a->dx)
        bki_gemm_ep(&tm, 0, 0, a->R, a->in, a->out, 1.0f, a->dy, a->ldy, a->W, a->in, a->beta_dx, a->dx, a->in,
                    a->s ? gelu_grad_tile : NULL, &a->s);
    if (a->dW || a->db) grads_member(&tm, a->R, a->in, a->out, a->x, a->ldx, a->dy, a->ldy, a->dW, a->db, a->kbuf);
}

void bki_linear_bwd_gelu(int R, int in, int out, const float *x, int ldx, const float *W, const float *dy, int ldy,
                         float *dx, float beta_dx, float *dW, float *db, const float *s, float *kbuf)
{
    if (!dx && !dW && !db) return;
    /* one region: dx's tiles, dW's, then this member's columns of db (all
     * read dy only and write apart: no barrier between, except the K
     * split's) */
    linear_bwd_args a = {R, in, out, x, ldx, W, dy, ldy, dx, beta_dx, dW, db, s, kbuf};
    bki_parallel(bki_threads(), linear_bwd_member, &a);
}

void bki_linear_bwd(int R, int in, int out, const float *x, int ldx, const float *W, const float *dy, int ldy,
                    float *dx, float beta_dx, float *dW, float *db, float *kbuf)
{
    bki_linear_bwd_gelu(R, in, out, x, ldx, W, dy, ldy, dx, beta_dx, dW, db, NULL, kbuf);
}

uint64_t bki_dropout_key(uint64_t seed, uint64_t count, int site)
{
    return bki_mix64_fin(bki_mix64_fin(seed ^ 0x5DEECE66Dull) ^ bki_mix64_fin(count + BKI_GOLDEN) ^ ((uint64_t)site << 40));
}

typedef struct {
    float *a;
    int R, C, ld;
    float keep;
    uint64_t thr, key;
} dropout_args;
static void dropout_member(void *arg)
{
    const dropout_args *d = arg;
    const int C = d->C;
    const float keep = d->keep;
    const uint64_t thr = d->thr;
    BKI_FOR(i, d->R) {
        const int r = (int)i;
        float *ar = d->a + (size_t)r * d->ld;
        const uint64_t rk = bki_mix64_fin(d->key ^ ((uint64_t)r * 0xD1B54A32D192ED03ull));
        for (int c = 0; c < C; c++) ar[c] = bki_mix64_fin(rk + (uint64_t)c * BKI_GOLDEN) >= thr ? ar[c] * keep : 0.0f;
    }
}

void bki_dropout(float *a, int R, int C, int ld, float p, uint64_t key)
{
    if (p <= 0.0f) return;
    const float keep = 1.0f / (1.0f - p);
    const uint64_t thr = (uint64_t)ldexp((double)p, 64); /* p < 1 (a float): below 2^64 - 2^40 */
    dropout_args r = {a, R, C, ld, keep, thr, key};
    bki_parallel_claimed(bki_threads(), dropout_member, &r);
}
