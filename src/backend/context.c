/* context.c -- execution contexts (include/birkhoff/context.h): the list of
 * backends, the default context, the calling thread's current context (told
 * to the core: bki_core_use), a backend's entry for an operator
 * (bki_backend_kernel), the tape header check every backend shares
 * (bki_tape_check), the workspaces the library allocates for a call
 * (allocator and cache). Includes nothing above the backend layer. */
#include "backend.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct bk_context {
    bk_context_config cfg;
    const bki_backend *be;
    _Atomic int threads;   /* (the default context's is the core's cell,
                              bki_default_threads_cell: bk_set_num_threads) */
    void *cache;           /* the cached workspace (cfg.cache_workspace)          */
    size_t cache_cap;
    int is_default;
    /* the headers of the last tapes this context's forwards wrote (a device
     * backend's backward checks a tape against them without reading device
     * memory); a ring, newest at tape_next - 1, under tape_lock */
    struct {
        const void *tape;
        unsigned char hdr[BKI_TAPE_NOTE_MAX];
    } tapes[BKI_TAPE_NOTES];
    unsigned tape_next, tape_count;
    _Atomic int tape_lock;
};

/* THE list of backends a context may name (index: bk_backend). A build with
 * a device backend adds its table here. */
static const bki_backend *backend_of(bk_backend kind)
{
    switch (kind) {
    case BK_BACKEND_CPU: return &bki_backend_cpu;
#ifdef BK_HAVE_CUDA
    case BK_BACKEND_CUDA: return &bki_backend_cuda;
#else
    case BK_BACKEND_CUDA: return NULL; /* not in this build */
#endif
    }
    return NULL;
}

int bk_backend_built(bk_backend backend) { return backend_of(backend) != NULL; }

/* the default context (its thread count, the library's only process-wide
 * mutable state, is the core's: bki_default_threads_cell, threads.c) */
static bk_context g_default = {.cfg = {BK_BACKEND_CPU, 0, 0, {NULL, NULL, NULL}, NULL, 0, 0},
                               .be = &bki_backend_cpu,
                               .is_default = 1};
static _Thread_local bk_context *tl_current;

/* the core's view of this thread's current context (NULL: the default):
 * its thread count's cell and where it computes (bki_core_use, threads.c) */
static void tell_core(const bk_context *c)
{
    if (!c) bki_core_use(NULL, BK_DEVICE_HOST);
    else bki_core_use(&c->threads, c->be->kind == BK_BACKEND_CPU ? BK_DEVICE_HOST : BK_DEVICE_CUDA(c->cfg.device));
}

bk_context_config bk_context_config_default(void)
{
    bk_context_config c = {BK_BACKEND_CPU, 0, 0, {NULL, NULL, NULL}, NULL, 0, 0};
    return c;
}

static bk_status make(const bk_context_config *cfg, const bki_backend *be, bk_context **out)
{
    bk_context *c = calloc(1, sizeof *c);
    if (!c) return bki_fail(BK_ERR_NOMEM, "bk_context_create: out of memory");
    c->cfg = *cfg;
    c->be = be;
    c->threads = cfg->threads > 0 ? cfg->threads : 0;
    *out = c;
    bki_clear_error();
    return BK_OK;
}

bk_status bk_context_create(const bk_context_config *cfg, bk_context **out)
{
    if (!cfg || !out) return bki_fail(BK_ERR_NULL, "bk_context_create: NULL config or output");
    *out = NULL;
    if (cfg->threads < 0 || cfg->threads > 4096)
        return bki_fail(BK_ERR_PARAM, "bk_context_create: threads must be in [0, 4096], got %d", cfg->threads);
    if (cfg->device < 0) return bki_fail(BK_ERR_PARAM, "bk_context_create: device must be >= 0, got %d", cfg->device);
    if ((cfg->allocator.alloc == NULL) != (cfg->allocator.free == NULL))
        return bki_fail(BK_ERR_PARAM, "bk_context_create: give both allocator functions or neither");
    const bki_backend *be = backend_of(cfg->backend);
    if (!be)
        return bki_fail(BK_ERR_UNSUPPORTED, "bk_context_create: backend %d is not in this build (see docs/BACKENDS.md)",
                        (int)cfg->backend);
    char why[256] = "";
    if (be->available && !be->available(cfg->device, why, sizeof why))
        return bki_fail(BK_ERR_UNSUPPORTED, "bk_context_create: %s device %d is not usable: %s", be->name, cfg->device,
                        why);
    return make(cfg, be, out);
}

bk_status bki_context_with_backend(const bki_backend *be, bk_context **out)
{
    const bk_context_config cfg = bk_context_config_default();
    return make(&cfg, be, out);
}

static void release_cache(bk_context *c)
{
    if (!c->cache) return;
    if (c->cfg.allocator.free) c->cfg.allocator.free(c->cache, c->cfg.allocator.user);
    else c->be->free(c, c->cache);
    c->cache = NULL;
    c->cache_cap = 0;
}

void bk_context_free(bk_context *ctx)
{
    if (!ctx || ctx->is_default) return;
    if (tl_current == ctx) {
        tl_current = NULL;
        tell_core(NULL);
    }
    release_cache(ctx);
    free(ctx);
}

bk_context *bk_context_default(void) { return &g_default; }

bk_context *bk_context_use(bk_context *ctx)
{
    bk_context *prev = bki_ctx();
    tl_current = ctx == &g_default ? NULL : ctx;
    tell_core(tl_current);
    return prev;
}

bk_context *bki_ctx(void) { return tl_current ? tl_current : &g_default; }
bk_context *bk_context_current(void) { return bki_ctx(); }
const bki_backend *bki_ctx_backend(const bk_context *ctx) { return ctx->be; }
const bk_context_config *bki_ctx_config(const bk_context *ctx) { return &ctx->cfg; }
bk_backend bk_context_backend(const bk_context *ctx) { return ctx ? ctx->be->kind : BK_BACKEND_CPU; }
const char *bk_context_backend_name(const bk_context *ctx) { return ctx ? ctx->be->name : "cpu"; }

/* ---- threads: the current context's, else the default ---- */
int bki_default_threads(void);

int bki_ctx_threads(const bk_context *ctx)
{
    const int n = ctx->is_default ? *bki_default_threads_cell() : ctx->threads;
    return n > 0 ? n : bki_default_threads();
}

int bk_context_threads(const bk_context *ctx) { return bki_ctx_threads(ctx ? ctx : bki_ctx()); }

bk_status bk_set_num_threads(int n)
{
    if (n > 4096)
        return bki_fail(BK_ERR_PARAM, "bk_set_num_threads: n must be in [1, 4096] (or <= 0: the default), got %d", n);
    *bki_default_threads_cell() = n > 0 ? n : 0;
    bki_clear_error();
    return BK_OK;
}

/* ---- a backend's kernels (bk_context_supports is the registry's: it knows
 * the operators' names, src/ops/registry.c) ---- */
const bki_kernel *bki_backend_kernel(const bki_backend *be, const char *op_name)
{
    for (int i = 0; i < be->nkernels; i++)
        if (!be->kernels[i].op || (op_name && !strcmp(be->kernels[i].op, op_name))) return &be->kernels[i];
    return NULL;
}

/* ---- the tape format's header check (call.h) ---- */
bk_status bki_tape_check(const bki_tape_header *want, const bki_tape_header *th, const char *op_name)
{
    if (th->magic != BKI_TAPE_MAGIC || th->version != BKI_TAPE_VERSION)
        return bki_fail(BK_ERR_TAPE, "tape has a bad magic number or version (not written by a forward?)");
    if (th->op != want->op)
        return bki_fail(BK_ERR_TAPE, "tape was written by another operator (id %u, not %s)", th->op, op_name);
    if (th->B != want->B || th->H != want->H || th->Nq != want->Nq || th->Nk != want->Nk || th->d != want->d ||
        th->dv != want->dv)
        return bki_fail(BK_ERR_TAPE, "tape was written for another problem (B=%d H=%d Nq=%d Nk=%d d=%d dv=%d)", th->B,
                        th->H, th->Nq, th->Nk, th->d, th->dv);
    if (th->key != want->key || th->block_bytes != want->block_bytes || th->call_lines != want->call_lines)
        return bki_fail(BK_ERR_TAPE, "tape was written with other %s parameters", op_name);
    return BK_OK;
}

/* ---- the tapes a context wrote ---- */
static void tape_lock(bk_context *c)
{
    int expect = 0;
    while (!atomic_compare_exchange_weak(&c->tape_lock, &expect, 1)) expect = 0;
}
static void tape_unlock(bk_context *c) { atomic_store(&c->tape_lock, 0); }

void bki_ctx_tape_note(bk_context *ctx, const void *tape, const void *hdr, size_t n)
{
    if (!tape || n > BKI_TAPE_NOTE_MAX) return;
    tape_lock(ctx);
    const unsigned i = ctx->tape_next % BKI_TAPE_NOTES;
    ctx->tapes[i].tape = tape;
    memset(ctx->tapes[i].hdr, 0, sizeof ctx->tapes[i].hdr);
    memcpy(ctx->tapes[i].hdr, hdr, n);
    ctx->tape_next = (i + 1) % BKI_TAPE_NOTES;
    if (ctx->tape_count < BKI_TAPE_NOTES) ctx->tape_count++;
    tape_unlock(ctx);
}

int bki_ctx_tape_known(bk_context *ctx, const void *tape, void *hdr, size_t n)
{
    int found = 0;
    if (!tape || n > BKI_TAPE_NOTE_MAX) return 0;
    tape_lock(ctx);
    for (unsigned k = 1; k <= ctx->tape_count && !found; k++) { /* newest first */
        const unsigned i = (ctx->tape_next + BKI_TAPE_NOTES - k) % BKI_TAPE_NOTES;
        if (ctx->tapes[i].tape == tape) {
            memcpy(hdr, ctx->tapes[i].hdr, n);
            found = 1;
        }
    }
    tape_unlock(ctx);
    return found;
}

/* ---- workspaces the library allocates for a call ---- */
#define CACHED ((void *)&g_default.cache) /* marks the cache in *owned */

bk_status bki_workspace(void *ws, size_t ws_size, size_t need, const char *query_fn, void **owned, char **base)
{
    *owned = NULL;
    if (ws) {
        if (ws_size < need)
            return bki_fail(BK_ERR_WORKSPACE, "workspace has %zu bytes, needs %zu (query it with %s under the current "
                                              "thread count)", ws_size, need, query_fn);
        *base = (char *)ws;
        return BK_OK;
    }
    bk_context *c = bki_ctx();
    const bk_allocator *a = &c->cfg.allocator;
    if (c->cfg.cache_workspace) {
        if (c->cache_cap < need) {
            release_cache(c);
            c->cache = a->alloc ? a->alloc(need, a->user) : c->be->alloc(c, need);
            if (!c->cache) return bki_fail(BK_ERR_NOMEM, "cannot allocate %zu bytes of workspace", need);
            c->cache_cap = need;
        }
        *owned = CACHED;
        *base = c->cache;
        return BK_OK;
    }
    void *p = a->alloc ? a->alloc(need, a->user) : c->be->alloc(c, need);
    if (!p) return bki_fail(BK_ERR_NOMEM, "cannot allocate %zu bytes of workspace", need);
    *owned = p;
    *base = p;
    return BK_OK;
}

void bki_workspace_release(void *owned)
{
    if (!owned || owned == CACHED) return;
    bk_context *c = bki_ctx();
    if (c->cfg.allocator.free) c->cfg.allocator.free(owned, c->cfg.allocator.user);
    else c->be->free(c, owned);
}
