/* gemm.c -- the library's one GEMM entry: a row-major product cut into fixed
 * tiles (a function of the shape only), each tile one single-threaded BLAS
 * call, the tiles shared over a team. Every output element is computed by
 * exactly one call over the whole inner dimension, so the result does not
 * depend on the thread count or on which member computed which tile. */
#include "internal.h"

#include <cblas.h>

/* the width of N columns cut in `parts` tiles as even as multiples of 16 allow */
static int even_cols(int N, int parts) { return ((N + parts - 1) / parts + 15) & ~15; }

void bki_gemm_tiles(int M, int N, int *rb, int *cb)
{
    *rb = bki_gemm_block(M);
    const int nr = bki_nblocks(M, *rb);
    /* at most 8 row tiles: cut the columns too, to about 16 tiles in all
     * (team sharing; columns of at least 64) */
    const int c = even_cols(N, (16 + nr - 1) / nr);
    *cb = c < 64 ? 64 : c;
    if (*cb > N) *cb = N;
}

void bki_gemm(const bki_team *tm, int ta, int tb, int M, int N, int K, float alpha, const float *A,
              ptrdiff_t lda, const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc)
{
    bki_gemm_ep(tm, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL, NULL);
}

/* The thin path (gemm_kern.c) takes a product with a short side of at most
 * THIN_SIDE (its tiles' columns when the rows of op(A) stream, the whole of M
 * when the columns of op(B) do): the long operand streams through
 * unpacked, against the short one read in place or packed (THIN_PACK floats,
 * a buffer on the stack), in K chunks whose share of the short operand stays
 * in L1; C is written once, without BLAS's copies of both operands and its
 * zeroing pass. Returns the orientation (0: rows of op(A) streamed; 1:
 * columns of op(B)) or -1 for BLAS. A function of the shape and transposes
 * only, so every tile of a product takes the same path. Measured per tile
 * shape in docs/PERFORMANCE.md ("Thin GEMMs", "K in chunks"): with the K
 * chunks every tile shape with a short side up to 128 ran faster than BLAS
 * (the long-K weight gradients and dK = dS^T Q included); a 192-column tile
 * ran even, wider ones slower. */
#define THIN_SIDE 128
#define THIN_PACK 16384
static int thin_fits(const bki_gemm_kernels *gk, int side, int K, int packed)
{
    return side <= THIN_SIDE && (!packed || gk->pack_floats(K, side) <= THIN_PACK);
}
/* cb: the product's tile columns. The columns of op(B) stream only when the
 * whole of M is short: its transposed stores cost more than BLAS on a square
 * product's 128-row tiles (QK^T at N = 1024: +15 % on the softmax forward) */
static int thin_orientation(const bki_gemm_kernels *gk, int ta, int tb, int M, int N, int K, int cb)
{
    const int rows_ok = thin_fits(gk, cb, K, tb), cols_ok = thin_fits(gk, M, K, !ta);
    if (rows_ok && (!cols_ok || M >= N)) return 0;
    return cols_ok ? 1 : -1;
}

/* A product's tiles (bki_gemm_tiles) and its route: the thin orientation,
 * or -1 for BLAS. Columns too wide for the thin kernel, with a short inner
 * dimension, are cut to at most THIN_SIDE where that makes the rows stream:
 * the QKV projection's 192-column BLAS tiles (M = 3200, N = 384, K = 128):
 * the training step 2 % faster; QK^T at N = 1024 (512-column tiles, K =
 * 64): softmax forward 9 %, Sinkhorn f+b 7 % faster. With K >= 512
 * OpenBLAS's blocking wins (3200 x 2048 x 512: 17-26 % slower thin), so a
 * longer K keeps BLAS (docs/PERFORMANCE.md, "Thin column tiles"). A function
 * of the shape and transposes only. */
static int route(const bki_gemm_kernels *gk, int ta, int tb, int M, int N, int K, int *rb, int *cb)
{
    bki_gemm_tiles(M, N, rb, cb);
    if (K < 1) return -1;
    const int thin = thin_orientation(gk, ta, tb, M, N, K, *cb);
    if (thin >= 0 || K > THIN_SIDE || *cb <= THIN_SIDE) return thin;
    const int c = even_cols(N, (N + THIN_SIDE - 1) / THIN_SIDE);
    if (thin_orientation(gk, ta, tb, M, N, K, c) != 0) return -1;
    *cb = c;
    return 0;
}

/* An output of at least STREAM_FLOATS floats (16 MiB) is written with
 * non-temporal stores where the thin kernel writes whole aligned lines
 * (beta == 0 and no epilogue, which would read the tile back): it will not
 * be in cache when it is read, so reading each line before writing it (what
 * an ordinary store does) is wasted. LOT's 64 MiB outputs at N = 262144: the
 * products 25-45 % faster, LOT f+b 6 % faster; no change below 16 MiB
 * (docs/PERFORMANCE.md, "LOT from memory, the training step from huge pages"). */
#define STREAM_FLOATS (4.0 * 1024 * 1024)

/* one product: its operands, its route and its tiles */
typedef struct {
    const bki_gemm_kernels *gk;
    int ta, tb, M, N, K, thin, rb, cb, nc, packs, stream;
    float alpha, beta;
    const float *A, *B;
    float *C;
    ptrdiff_t lda, ldb, ldc;
} product;

static product plan(int ta, int tb, int M, int N, int K, float alpha, const float *A, ptrdiff_t lda, const float *B,
                    ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc, int ep)
{
    product g = {bki_kern()->gemm, ta, tb, M, N, K, 0, 0, 0, 0, 0, 0, alpha, beta, A, B, C, lda, ldb, ldc};
    g.thin = route(g.gk, ta, tb, M, N, K, &g.rb, &g.cb);
    g.nc = bki_nblocks(N, g.cb);
    g.packs = g.thin == 0 ? tb : g.thin == 1 ? !ta : 0;
    g.stream = !ep && beta == 0.0f && (double)M * N >= STREAM_FLOATS;
    return g;
}

static int ntiles(const product *g) { return g->M < 1 || g->N < 1 ? 0 : bki_nblocks(g->M, g->rb) * g->nc; }

/* tile t (row-major); pk holds the packed short operand of tile side
 * *packed_at (-1: none), reused when the next tile has the same side */
static void tile(const product *g, int t, float *pk, int *packed_at, bki_tile_fn ep, void *arg)
{
    const int ti = t / g->nc, tj = t % g->nc, M = g->M, N = g->N, K = g->K, ta = g->ta, tb = g->tb;
    const int i0 = ti * g->rb, j0 = tj * g->cb;
    const int mi = M - i0 < g->rb ? M - i0 : g->rb, nj = N - j0 < g->cb ? N - j0 : g->cb;
    const ptrdiff_t lda = g->lda, ldb = g->ldb, ldc = g->ldc;
    const float beta = g->beta;
    float *Ct = g->C + (ptrdiff_t)i0 * ldc + j0;
    const float *At = ta ? g->A + i0 : g->A + (ptrdiff_t)i0 * lda;
    const float *Bt = tb ? g->B + (ptrdiff_t)j0 * ldb : g->B + j0;
    if (K < 1) { /* C = beta C (BLAS would do the same; some refuse K = 0) */
        for (int i = 0; i < mi; i++)
            for (int j = 0; j < nj; j++) Ct[(ptrdiff_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * Ct[(ptrdiff_t)i * ldc + j];
    } else if (g->thin >= 0) {
        const int side = g->thin == 0 ? tj : ti;
        g->gk->thin(g->thin, ta, tb, mi, nj, K, g->alpha, At, lda, Bt, ldb, beta, Ct, ldc, pk,
                    g->packs && side == *packed_at, g->stream);
        *packed_at = side;
    } else {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, mi, nj, K, g->alpha,
                    At, (int)lda, Bt, (int)ldb, beta, Ct, (int)ldc);
    }
    if (ep) ep(arg, i0, j0, mi, nj, Ct, ldc); /* while the tile is in cache */
}

void bki_gemm_ep(const bki_team *tm, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                 ptrdiff_t lda, const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc, bki_tile_fn ep,
                 void *arg)
{
    if (M < 1 || N < 1) return;
    const product g = plan(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ep != NULL);
    bki_claims cl = bki_claims_open(tm, ntiles(&g));
    /* tiles in row-major order, claimed at run time (each member's static
     * share first): a member's consecutive tiles share a row
     * tile of the streamed operand, read again from L2. (Numbered along the
     * rows, so that they shared the packed short operand instead, each of two
     * members streamed the whole long operand from L3: the training step was
     * 4 % slower on 2 threads, docs/PERFORMANCE.md "K in chunks".) */
    _Alignas(64) float pk[THIN_PACK]; /* whole lines: the packed rows are NR floats apart, so every vector load of the panel is aligned */
    int packed_at = -1; /* the short-side tile whose operand pk holds */
    for (int64_t tk; bki_claims_next(&cl, &tk);) tile(&g, (int)tk, pk, &packed_at, ep, arg);
}

int bki_gemm_ntiles(int ta, int tb, int M, int N, int K)
{
    const product g = plan(ta, tb, M, N, K, 1.0f, NULL, 0, NULL, 0, 0.0f, NULL, 0, 0);
    return ntiles(&g);
}

void bki_gemm_tile(int t, int ta, int tb, int M, int N, int K, float alpha, const float *A, ptrdiff_t lda,
                   const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc)
{
    const product g = plan(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 0);
    _Alignas(64) float pk[THIN_PACK];
    int packed_at = -1;
    if (t >= 0 && t < ntiles(&g)) tile(&g, t, pk, &packed_at, NULL, NULL);
}
