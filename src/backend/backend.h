/* backend.h -- the backend seam (internal; docs/BACKENDS.md).
 *
 * A backend is this table: its memory primitives and the per-operator
 * kernels it registers. The library reaches a backend only through the
 * calling thread's current context (bk_context, context.c). The operator
 * driver (src/ops/driver.c) picks the (operator, backend) entry
 * (bki_backend_kernel): an entry with its own forward/backward runs the
 * whole call (a device backend: the tensors, tape and workspace in its
 * memory); an entry without them is the host path, the operator's own
 * per-problem kernels (bki_op.forward/backward) run by the driver over the
 * library's problem runner (bki_run_problems) -- the CPU backend registers
 * one such entry for every operator. A backend without an entry for an
 * operator makes the call fail with BK_ERR_UNSUPPORTED; nothing is copied
 * between devices behind the caller's back. A device backend is one more
 * folder (src/backend/<name>/) with its table and one line in context.c.
 *
 * The seam includes only src/core/internal.h and call.h (the call and the
 * tape format, shared with src/ops/op.h): nothing of the framework above. */
#ifndef BK_BACKEND_H
#define BK_BACKEND_H
#include "../core/internal.h"
#include "call.h"

/* one operator's kernels on a backend */
typedef struct {
    const char *op;  /* the operator's registry name; NULL: every operator  */
    /* the whole call (validation of its own, workspace and tape in the
     * backend's memory, the kernels); the driver has run the common and the
     * operator's parameter checks and filled c->tape_hdr, c->tape_bytes.
     * NULL: the host path (the driver runs the operator's kernels). */
    bk_status (*forward)(bk_context *ctx, bki_call *c, void *tape, void *ws, size_t ws_size);
    bk_status (*backward)(bk_context *ctx, bki_call *c, const void *tape, void *ws, size_t ws_size);
    /* its workspace for a call, bytes of its memory (NULL: the host path's
     * layout, the driver's) */
    size_t (*workspace_size)(bk_context *ctx, bki_call *c);
    /* bytes its forward keeps after the operator's tape (NULL: none); the
     * tape size queries add them with the context current */
    size_t (*tape_extra)(bk_context *ctx, bki_call *c);
} bki_kernel;

typedef struct bki_backend {
    const char *name;   /* "cpu", "cuda"                                     */
    bk_backend kind;
    /* the device exists and can be used (message in err otherwise) */
    int (*available)(int device, char *err, size_t cap);
    /* memory where the backend computes (workspaces, tapes of its own) */
    void *(*alloc)(bk_context *ctx, size_t bytes);
    void (*free)(bk_context *ctx, void *ptr);
    /* dir 0: host to device, 1: device to host, 2: device to device (only on
     * a caller's request: the bindings and tests moving data) */
    bk_status (*copy)(bk_context *ctx, void *dst, const void *src, size_t bytes, int dir);
    /* the operators it runs: nkernels entries, the first that matches wins */
    const bki_kernel *kernels;
    int nkernels;
} bki_backend;

extern const bki_backend bki_backend_cpu;
#ifdef BK_HAVE_CUDA
extern const bki_backend bki_backend_cuda; /* src/backend/cuda/backend.c */
#endif

/* the backend's entry for the operator named op_name (its registry name), or
 * NULL when the backend lacks it */
const bki_kernel *bki_backend_kernel(const bki_backend *be, const char *op_name);

/* the calling thread's current context (never NULL) and its backend */
bk_context *bki_ctx(void);
const bki_backend *bki_ctx_backend(const bk_context *ctx);
/* the context's configuration (device ordinal, stream, allocator) */
const bk_context_config *bki_ctx_config(const bk_context *ctx);
/* a context on a given backend table (tests of the seam: a backend that
 * lacks operators); free with bk_context_free */
bk_status bki_context_with_backend(const bki_backend *be, bk_context **out);
/* The tapes a context's forwards wrote: a forward notes the header it wrote
 * at `tape` (n <= BKI_TAPE_NOTE_MAX bytes); a backward asks for the header
 * noted at `tape` (1: found, copied to hdr; 0: not among the last
 * BKI_TAPE_NOTES), so that a device backend checks a tape of its own forward
 * without reading device memory (no synchronisation). Thread-safe. */
#define BKI_TAPE_NOTES 64
#define BKI_TAPE_NOTE_MAX 64
void bki_ctx_tape_note(bk_context *ctx, const void *tape, const void *hdr, size_t n);
int bki_ctx_tape_known(bk_context *ctx, const void *tape, void *hdr, size_t n);
#endif
