/* gemm.c -- the library's one GEMM entry: a row-major product cut into fixed
 * tiles (a function of the shape only), each tile one single-threaded BLAS
 * call, the tiles shared over a team. Every output element is computed by
 * exactly one call over the whole inner dimension, so the result does not
 * depend on the thread count or on which member computed which tile. */
#include "internal.h"

#include <cblas.h>

void bki_gemm_tiles(int M, int N, int *rb, int *cb)
{
    *rb = bki_gemm_block(M);
    const int nr = bki_nblocks(M, *rb);
    /* at most 8 row tiles: cut the columns too, to about 16 tiles in all
     * (team sharing; columns of at least 64) */
    const int nc = (16 + nr - 1) / nr;
    int c = (N + nc - 1) / nc;
    c = (c + 15) & ~15;
    *cb = c < 64 ? 64 : c;
    if (*cb > N) *cb = N;
}

void bki_gemm(const bki_team *tm, int ta, int tb, int M, int N, int K, float alpha, const float *A,
              ptrdiff_t lda, const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc)
{
    bki_gemm_ep(tm, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL, NULL);
}

void bki_gemm_ep(const bki_team *tm, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                 ptrdiff_t lda, const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc, bki_tile_fn ep,
                 void *arg)
{
    if (M < 1 || N < 1) return;
    int rb, cb;
    bki_gemm_tiles(M, N, &rb, &cb);
    const int nr = bki_nblocks(M, rb), nc = bki_nblocks(N, cb);
    int lo, hi;
    bki_team_share(tm, nr * nc, &lo, &hi);
    for (int t = lo; t < hi; t++) {
        const int i0 = (t / nc) * rb, j0 = (t % nc) * cb;
        const int mi = M - i0 < rb ? M - i0 : rb, nj = N - j0 < cb ? N - j0 : cb;
        float *Ct = C + (ptrdiff_t)i0 * ldc + j0;
        if (K < 1) { /* C = beta C (BLAS would do the same; some refuse K = 0) */
            for (int i = 0; i < mi; i++)
                for (int j = 0; j < nj; j++) Ct[(ptrdiff_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * Ct[(ptrdiff_t)i * ldc + j];
            continue;
        }
        const float *At = ta ? A + i0 : A + (ptrdiff_t)i0 * lda;
        const float *Bt = tb ? B + (ptrdiff_t)j0 * ldb : B + j0;
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, mi, nj, K,
                    alpha, At, (int)lda, Bt, (int)ldb, beta, Ct, (int)ldc);
        if (ep) ep(arg, i0, j0, mi, nj, Ct, ldc); /* while the tile is in cache */
    }
}
