/* cpu.c -- the CPU backend: host memory (bk_alloc) and one kernel entry, the
 * host path, for every operator (the operators' own kernels through the
 * library's parallel model: teams, fixed blocks, tiled single-threaded
 * GEMMs). */
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

/* every registered operator on the host path: the operator's own per-problem
 * kernels, run by the driver over the library's problem runner
 * (bki_run_problems: one problem per thread, or a team per problem) */
static const bki_kernel kernels[] = {{NULL, NULL, NULL, NULL, NULL}};

const bki_backend bki_backend_cpu = {"cpu", BK_BACKEND_CPU, available, alloc, release, copy, kernels, 1};
