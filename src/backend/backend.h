/* backend.h -- the backend seam (internal; docs/BACKENDS.md).
 *
 * A backend is this table. The library reaches a backend only through the
 * calling thread's current context (bk_context, context.c): the operator
 * driver (src/ops/driver.c) asks supports_op, then runs the operator either
 * through the CPU path (the operator's own kernels, run_problems, the
 * library's tiled GEMMs) or through the backend's op_forward/op_backward.
 * A backend that lacks an operator makes the call fail with
 * BK_ERR_UNSUPPORTED; nothing is copied between devices behind the caller's
 * back. The CPU backend (cpu.c) is complete; a device backend is one more
 * folder (src/backend/<name>/) with its table and one line in context.c. */
#ifndef BK_BACKEND_H
#define BK_BACKEND_H
#include "../core/internal.h"

struct bki_op;
struct bki_call;

typedef struct bki_backend {
    const char *name;   /* "cpu", "cuda"                                     */
    bk_backend kind;
    /* the device exists and can be used (message in err otherwise) */
    int (*available)(int device, char *err, size_t cap);
    /* memory where the backend computes (workspaces, tapes of its own) */
    void *(*alloc)(bk_context *ctx, size_t bytes);
    void (*free)(bk_context *ctx, void *ptr);
    /* dir 0: host to device, 1: device to host, 2: device to device */
    bk_status (*copy)(bk_context *ctx, void *dst, const void *src, size_t bytes, int dir);
    bk_status (*fill)(bk_context *ctx, float *dst, float value, size_t n);
    /* C_b = alpha op(A_b) op(B_b) + beta C_b for b < batch, row-major, the
     * operands `stride` floats apart; fixed tiles, deterministic */
    bk_status (*gemm_batched)(bk_context *ctx, int batch, int ta, int tb, int M, int N, int K, float alpha,
                              const float *A, ptrdiff_t lda, ptrdiff_t sA, const float *B, ptrdiff_t ldb,
                              ptrdiff_t sB, float beta, float *C, ptrdiff_t ldc, ptrdiff_t sC);
    /* out[j] = sum over b < nb of parts[b * ld + j] in block order, j < n */
    bk_status (*sum_blocks)(bk_context *ctx, int nb, int n, const float *parts, ptrdiff_t ld, float *out);
    /* the parallel-for over fixed blocks: fn(tm, p, lane, arg) for every
     * problem as the plan says (bki_run_problems on the CPU) */
    void (*run_problems)(bk_context *ctx, bki_plan pl, int P, char *lanes, size_t lane_bytes, bki_problem_fn fn,
                         void *arg);
    /* which registered operators it runs */
    int (*supports_op)(const struct bki_op *op);
    /* a device backend's own operator driver; NULL on the CPU (the generic
     * driver runs the operator's kernels) */
    bk_status (*op_forward)(bk_context *ctx, struct bki_call *c, void *tape, void *ws, size_t ws_size);
    bk_status (*op_backward)(bk_context *ctx, struct bki_call *c, const void *tape, void *ws, size_t ws_size);
    /* a device backend's workspace size for a call (bytes of its memory);
     * NULL on the CPU (the generic driver's lanes) */
    size_t (*op_workspace_size)(bk_context *ctx, struct bki_call *c);
    /* bytes a device backend's forward adds after the operator's tape (NULL
     * or 0: none); the tape size queries add them with the context current */
    size_t (*op_tape_extra)(bk_context *ctx, struct bki_call *c);
} bki_backend;

extern const bki_backend bki_backend_cpu;
#ifdef BK_HAVE_CUDA
extern const bki_backend bki_backend_cuda; /* src/backend/cuda/backend.c */
#endif

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
