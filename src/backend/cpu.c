/* cpu.c -- the CPU backend: every operator, through the library's own
 * parallel model (teams, fixed blocks, tiled single-threaded GEMMs); host
 * memory (bk_alloc). */
#define _DEFAULT_SOURCE /* madvise's MADV_HUGEPAGE (Linux) */
#include "backend.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* From this size on, host buffers are 2 MiB aligned and asked for huge pages:
 * ESP hard's gathers (a partner row at random per slice and element) ran a
 * quarter faster from huge pages at N = 65536 (docs/PERFORMANCE.md). */
#define HUGE_BYTES ((size_t)2 << 20)

void *bk_alloc(size_t bytes)
{
    void *p = NULL;
    const size_t align = bytes >= HUGE_BYTES ? HUGE_BYTES : 64;
    if (posix_memalign(&p, align, bytes ? bytes : 1)) return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= HUGE_BYTES) (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice: refused or ignored is fine */
#endif
    return p;
}

void bk_free(void *p) { free(p); }

void *bki_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = bk_alloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

static int available(int device, char *err, size_t cap)
{
    if (device != 0 && err && cap) {
        strncpy(err, "the CPU backend has one device, 0", cap - 1);
        err[cap - 1] = 0;
    }
    return device == 0;
}

static void *alloc(bk_context *ctx, size_t bytes)
{
    (void)ctx;
    return bk_alloc(bytes);
}

static void release(bk_context *ctx, void *p)
{
    (void)ctx;
    bk_free(p);
}

static bk_status copy(bk_context *ctx, void *dst, const void *src, size_t bytes, int dir)
{
    (void)ctx;
    (void)dir; /* host memory only */
    memmove(dst, src, bytes);
    return BK_OK;
}

static bk_status fill(bk_context *ctx, float *dst, float value, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++) dst[i] = value;
    return BK_OK;
}

typedef struct {
    int ta, tb, M, N, K;
    float alpha, beta;
    const float *A, *B;
    float *C;
    ptrdiff_t lda, sA, ldb, sB, ldc, sC;
} gemm_args;

static void gemm_one(const bki_team *tm, int b, char *lane, void *arg)
{
    const gemm_args *g = arg;
    (void)lane;
    bki_gemm(tm, g->ta, g->tb, g->M, g->N, g->K, g->alpha, g->A + b * g->sA, g->lda, g->B + b * g->sB, g->ldb,
             g->beta, g->C + b * g->sC, g->ldc);
}

static bk_status gemm_batched(bk_context *ctx, int batch, int ta, int tb, int M, int N, int K, float alpha,
                              const float *A, ptrdiff_t lda, ptrdiff_t sA, const float *B, ptrdiff_t ldb, ptrdiff_t sB,
                              float beta, float *C, ptrdiff_t ldc, ptrdiff_t sC)
{
    (void)ctx;
    gemm_args g = {ta, tb, M, N, K, alpha, beta, A, B, C, lda, sA, ldb, sB, ldc, sC};
    bki_run_problems(bki_plan_problems(batch, (double)M * N), batch, NULL, 0, gemm_one, &g);
    return BK_OK;
}

static bk_status sum_blocks(bk_context *ctx, int nb, int n, const float *parts, ptrdiff_t ld, float *out)
{
    (void)ctx;
    for (int j = 0; j < n; j++) out[j] = nb > 0 ? parts[j] : 0.0f;
    for (int b = 1; b < nb; b++)
        for (int j = 0; j < n; j++) out[j] += parts[b * ld + j];
    return BK_OK;
}

static void run_problems(bk_context *ctx, bki_plan pl, int P, char *lanes, size_t lane_bytes, bki_problem_fn fn,
                         void *arg)
{
    (void)ctx;
    bki_run_problems(pl, P, lanes, lane_bytes, fn, arg);
}

static int supports_op(const struct bki_op *op)
{
    (void)op;
    return 1; /* every registered operator has CPU kernels */
}

const bki_backend bki_backend_cpu = {"cpu",      BK_BACKEND_CPU, available,    alloc,      release, copy, fill,
                                     gemm_batched, sum_blocks,   run_problems, supports_op, NULL,    NULL,
                                     NULL, NULL};
