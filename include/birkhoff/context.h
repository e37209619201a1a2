/* birkhoff/context.h -- execution contexts: which backend runs the library's
 * work, on how many threads, with which allocator.
 * Part of the public API; include <birkhoff.h> (all of it) or this file.
 *
 * Every entry point runs in the calling thread's CURRENT context: the one
 * set by bk_context_use on that thread, else the process's default context
 * (a CPU context whose thread count bk_set_num_threads changes). A context
 * names a backend (docs/BACKENDS.md): the CPU backend runs every operator;
 * a device backend runs the operators it implements and refuses the others
 * with BK_ERR_UNSUPPORTED, naming the operator and the backend (it never
 * copies data to the host behind the caller's back). Tensors passed to an
 * entry point must live where the current context's backend computes (host
 * memory for the CPU backend): each bk_tensor says where (its device field,
 * birkhoff/core.h), and one that lives elsewhere is refused.
 *
 * A context is not shared between threads while its workspace cache is on
 * (the cache is one buffer); without the cache a context may be current on
 * several threads at once. */
#ifndef BIRKHOFF_CONTEXT_H
#define BIRKHOFF_CONTEXT_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    BK_BACKEND_CPU = 0,   /* always available                                 */
    BK_BACKEND_CUDA = 1   /* NVIDIA GPUs, in builds with the CUDA backend:
                             softmax and Sinkhorn attention on device memory,
                             asynchronous on the context's stream
                             (docs/CUDA.md)                                   */
} bk_backend;

/* Allocation of the workspaces the library allocates itself (calls given
 * ws = NULL). NULL functions: the backend's own (CPU: bk_alloc and bk_free,
 * huge pages for large blocks). alloc may return NULL (the call then fails
 * with BK_ERR_NOMEM). */
typedef struct {
    void *(*alloc)(size_t bytes, void *user);
    void (*free)(void *ptr, void *user);
    void *user;
} bk_allocator;

typedef struct {
    bk_backend backend;      /* BK_BACKEND_CPU                                */
    int device;              /* device ordinal (device backends), 0           */
    int threads;             /* CPU threads; 0: BIRKHOFF_NUM_THREADS, else the
                                CPUs of the process's affinity mask           */
    bk_allocator allocator;  /* {NULL, NULL, NULL}: bk_alloc/bk_free (CPU)    */
    void *stream;            /* device stream (CUDA: a cudaStream_t), NULL:
                                the default stream                            */
    int cache_workspace;     /* 1: keep the largest workspace allocated for a
                                call and reuse it (freed by bk_context_free) */
    int tape_output;         /* CUDA, 1: a 16-bit softmax / Sinkhorn forward
                                keeps its output in the tape (Nq x dv floats a
                                problem more), so that the backward takes the
                                row sums D = rowsum(dO .* O) instead of a pass
                                over the score matrix. The tape size queries
                                then include those bytes when this context is
                                current: query them with it current. 0: off
                                (tape sizes as on the CPU)                    */
} bk_context_config;

typedef struct bk_context bk_context;

/* 1 when this build has the backend (BK_BACKEND_CUDA: built with nvcc; a
 * device may still be missing: bk_context_create says), else 0. */
BK_API int bk_backend_built(bk_backend backend);
/* CPU, device 0, default threads, bk_alloc/bk_free, no stream, no cache,
 * no tape output */
BK_API bk_context_config bk_context_config_default(void);
/* BK_ERR_UNSUPPORTED when the backend is not in this build or has no usable
 * device (the message says which); BK_ERR_PARAM for a bad field. */
BK_API bk_status bk_context_create(const bk_context_config *config, bk_context **out);
/* Frees the context and its cached workspace. The calling thread's current
 * context falls back to the default if it was this one; other threads must
 * not be using it. NULL is a no-op; the default context is never freed. */
BK_API void bk_context_free(bk_context *ctx);
/* The process's default context (CPU). */
BK_API bk_context *bk_context_default(void);
/* Makes ctx the calling thread's current context (NULL: the default) and
 * returns the previous one. */
BK_API bk_context *bk_context_use(bk_context *ctx);
BK_API bk_context *bk_context_current(void);
BK_API bk_backend bk_context_backend(const bk_context *ctx);
BK_API const char *bk_context_backend_name(const bk_context *ctx);
/* Threads the context runs on (>= 1). */
BK_API int bk_context_threads(const bk_context *ctx);
/* 1 when the context's backend runs the registered operator `op_name`
 * (bk_op_find names), 0 otherwise (unknown names included). */
BK_API int bk_context_supports(const bk_context *ctx, const char *op_name);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_CONTEXT_H */
