/* internal.h -- declarations shared inside the library (not installed).
 * Internal functions that cross files are named bki_* and hidden from the
 * shared library (-fvisibility=hidden); everything else is static. */
#ifndef BK_INTERNAL_H
#define BK_INTERNAL_H

#include "birkhoff.h"
#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- errors (status.c) -------------------------------------------------- */
/* Records a formatted message for bk_last_error() and returns s. */
bk_status bki_fail(bk_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void bki_clear_error(void);

/* ---- the parallel model (threads.c; docs/ARCHITECTURE.md "Parallel model") ----
 * birkhoff owns every partition of its work: problems, row blocks, column
 * ranges and GEMM tiles are chosen here with sizes that depend on the shape
 * only, never on the thread count; every GEMM runs single-threaded BLAS on
 * one tile; every cross-block reduction is summed in block order. So results
 * are bitwise identical for any thread count and any batch shape. */
int  bki_threads(void);            /* the current context's thread count (its
                                      own, else bki_default_threads)         */
int  bki_cpus(void);               /* the CPUs of the affinity mask (read once) */
int  bki_default_threads(void);    /* BIRKHOFF_NUM_THREADS, else the CPUs the
                                      process may use: the affinity mask,
                                      bounded by a cgroup CPU quota          */
/* A cgroup CPU quota in CPUs (rounded up; 0: none) from /proc/self/cgroup's
 * text and the cgroup file system's root: cgroup v2's cpu.max or v1's
 * cpu.cfs_quota_us / cpu.cfs_period_us of the process's cgroup and of every
 * ancestor, the tightest. */
int  bki_cpu_quota_from(const char *proc_cgroup, const char *root);
int  bki_ctx_threads(const bk_context *ctx); /* src/backend/context.c */
/* The calling thread's current context as the core sees it, told by
 * bk_context_use and bk_context_free (src/backend/context.c), so that the
 * core calls nothing above it: the context's thread-count cell (NULL: the
 * default context's) and the memory it computes in (BK_DEVICE_*). */
void bki_core_use(const _Atomic int *threads, int device);
/* the default context's thread count (bk_set_num_threads; <= 0: the
 * default), the library's one process-wide mutable value */
_Atomic int *bki_default_threads_cell(void);
/* Work threads for `problems` independent problems run one per thread:
 * min(threads, problems). */
int bki_work_threads(int problems);
/* index of the calling thread inside a parallel region (0 outside), and the
 * number of threads of that region (1 outside) */
int bki_thread_id(void);
int bki_region_size(void);

/* How a call runs its P problems: `lanes` problems at a time, each by one
 * thread (team = 0), or one problem at a time by all `nt` threads together
 * (team = 1, lanes = 1). cost: work of one problem (about the entries of its
 * largest matrix): small problems never run as a team (barriers would cost
 * more than they save). Depends on (P, cost, thread count): results do not. */
typedef struct { int nt, lanes, team; } bki_plan;
bki_plan bki_plan_problems(int P, double cost);

/* A team: the threads of one parallel region working on ONE problem (nt > 1)
 * or one thread working alone (nt = 1, every sync a no-op). Every member
 * calls the same functions with the same arguments; work is shared by fixed
 * blocks (bki_team_share), shared results are read after bki_team_sync. */
typedef struct { int tid, nt; } bki_team;
#define BKI_SOLO ((bki_team){0, 1})
/* the static share [*lo, *hi) of n blocks for this member */
static inline void bki_team_share(const bki_team *tm, int n, int *lo, int *hi)
{
    *lo = (int)((int64_t)n * tm->tid / tm->nt);
    *hi = (int)((int64_t)n * (tm->tid + 1) / tm->nt);
}
/* the static share [*lo, *hi) of n floats for this member, in whole 64-byte
 * lines of 16 floats (contiguous, so no two members write one line) */
static inline void bki_team_share_floats(const bki_team *tm, size_t n, size_t *lo, size_t *hi)
{
    const size_t per = ((n + (size_t)tm->nt - 1) / (size_t)tm->nt + 15) / 16 * 16;
    *lo = (size_t)tm->tid * per < n ? (size_t)tm->tid * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}
/* the members of the enclosing parallel region as one team */
static inline bki_team bki_region_team(void) { return (bki_team){bki_thread_id(), bki_region_size()}; }
/* Every member of tm waits here until all have arrived (a no-op for a team
 * of one). The region's barrier (pool.c): members spin a few microseconds,
 * then sleep in the kernel, so a member never burns a core that another
 * process or a descheduled member could use. A part of a region's members
 * (a half-team) syncs the whole region: every member of the region calls it. */
void bki_region_barrier(void);
static inline void bki_team_sync(const bki_team *tm)
{
    if (tm->nt > 1) bki_region_barrier();
}

/* ---- the library's threads (pool.c; docs/ARCHITECTURE.md "Threads") ------
 * A parallel region: fn(arg) run by nt members at once, the caller being
 * member 0; it returns when every member has returned. Inside, bki_thread_id()
 * is the member's index and bki_region_size() nt. The runner sets each
 * member's floating-point mode (FTZ/DAZ) and BLAS threads for the region and
 * restores the caller's afterwards (bki_region_enter/leave). A region opened
 * inside a region runs on the calling thread alone (nt = 1), as OpenMP's
 * nested regions did; regions opened by different threads of the caller at
 * once each get threads of their own (a process-wide set of pools, the
 * library's only process-wide state beside the default thread count). */
typedef void (*bki_region_fn)(void *arg);
void bki_parallel(int nt, bki_region_fn fn, void *arg);
/* The same for a region whose members share all of its work through
 * claimed blocks (BKI_FOR, bki_claims_*, bki_gemm on the region's team) and
 * that has no barrier and no static share: when the caller has run fn,
 * every block is taken, so a member that has not started yet (a worker the
 * kernel has not scheduled since it was signalled) is skipped instead of
 * waited for. Only the members that started are joined. */
void bki_parallel_claimed(int nt, bki_region_fn fn, void *arg);

/* Blocks claimed at run time. Every member of a team calls bki_claims_open
 * with the same n (every member runs the same sequence of loops), then takes
 * block indices from bki_claims_next until it returns 0. Over a whole
 * region's team each member first takes the blocks of its static share, in
 * order (the locality of a static schedule), then takes the blocks that
 * other members have not started, so a member that the kernel descheduled
 * holds no work but the block it is in, and a member that arrives late
 * finds the loop done and goes on. What a block
 * computes must not depend on which member computes it (no accumulation
 * across blocks in member-private memory): the partition stays a function of
 * the problem, so results stay bitwise the same. A team of one takes every
 * block in order; a part of a region (a half-team) its static share. No sync
 * at the end: bki_team_sync where results are read by others. */
typedef struct {
    int64_t base, n, lo, hi; /* tickets before this loop, blocks, own range */
    int64_t chunk, total;    /* ranges: indices a block, indices           */
    int shared, tid, nt, v;  /* shared: claimed at run time; v: the member
                                whose share is being taken                 */
} bki_claims;
bki_claims bki_claims_open(const bki_team *tm, int64_t n);
int bki_claims_next(bki_claims *cl, int64_t *blk);
/* An ordered section inside a claimed loop (opened with
 * bki_claims_open_ordered): bki_ordered_begin(cl, k) waits until every block
 * before k has passed its section, bki_ordered_end(cl, k) lets block k + 1
 * in. Every block of the loop must pass its section exactly once. */
bki_claims bki_claims_open_ordered(const bki_team *tm, int64_t n);
void bki_ordered_begin(const bki_claims *cl, int64_t k);
void bki_ordered_end(const bki_claims *cl, int64_t k);

/* The loop of a region's members over i in [0, n), in chunks claimed at run
 * time (OpenMP's `omp for`, without its barrier: bki_team_sync after it
 * where other members read its results). Every member of the region runs it;
 * an iteration must not depend on which member runs it. `continue` skips an
 * iteration; `break` leaves only the current chunk. */
bki_claims bki_for_open(int64_t n);
#define BKI_FOR(i, n)                                                                                     \
    for (bki_claims bki_cl_ = bki_for_open(n); bki_cl_.total >= 0; bki_cl_.total = -1)                    \
        for (int64_t bki_i0_, bki_i1_; bki_ranges_next(&bki_cl_, &bki_i0_, &bki_i1_);)                     \
            for (int64_t i = bki_i0_; i < bki_i1_; i++)

/* Ranges [i0, i1) of `width` indices of [0, n) (the last one shorter),
 * claimed by tm's members as blocks are (BKI_FOR's chunks are such ranges,
 * of a width it chooses). BKI_RANGES(tm, n, width, i0, i1) { ... } declares
 * int i0, i1 for each range the member takes. */
bki_claims bki_ranges_open(const bki_team *tm, int64_t n, int64_t width);
int bki_ranges_next(bki_claims *cl, int64_t *i0, int64_t *i1);
static inline int bki_ranges_next_int(bki_claims *cl, int *i0, int *i1)
{
    int64_t a, b;
    if (!bki_ranges_next(cl, &a, &b)) return 0;
    *i0 = (int)a, *i1 = (int)b;
    return 1;
}
#define BKI_RANGES(tm, n, width, i0, i1)                                                                  \
    for (bki_claims bki_rg_ = bki_ranges_open((tm), (n), (width)); bki_rg_.total >= 0; bki_rg_.total = -1) \
        for (int i0, i1; bki_ranges_next_int(&bki_rg_, &i0, &i1);)

/* Every parallel region of the library goes through bki_parallel, which
 * brackets each member with these: the calling thread's floating-point state
 * is saved, flush-to-zero and denormals-are-zero are set for the region
 * (subnormals cost ~100 cycles per operation on x86 and are far below
 * float32 rounding here), BLAS is kept on one thread, and the caller's state
 * is restored when the region ends (torch and numpy must not inherit our
 * mode). */
unsigned bki_region_enter(void);
void bki_region_leave(const unsigned *saved);

/* The one problem runner: fn(tm, p, lane, ctx) for p = 0..P-1 as the plan
 * says: a team of all the region's threads on one problem after another
 * (lane 0; the team syncs after each problem), or one problem per thread
 * (problems claimed at run time; member t uses lane t). Lanes are
 * lane_bytes apart from an aligned base. Opens the region (bki_parallel). */
typedef void (*bki_problem_fn)(const bki_team *tm, int p, char *lane, void *ctx);
void bki_run_problems(bki_plan pl, int P, char *lanes, size_t lane_bytes, bki_problem_fn fn, void *ctx);

/* Rows per block of the engine's row passes for an n-row problem: at most
 * BKI_MAX_BLOCKS blocks of at least 4 rows (a function of n only). */
#define BKI_MAX_BLOCKS 64
static inline int bki_row_block(int n)
{
    int rb = (n + BKI_MAX_BLOCKS - 1) / BKI_MAX_BLOCKS;
    return rb < 4 ? 4 : rb;
}
/* Rows per GEMM tile for an output of n rows: at most 8 row tiles, a
 * multiple of 16, at least 128 rows (a function of n only; bki_gemm_tiles
 * then cuts columns so that an output has up to ~16 tiles). Each tile is one
 * BLAS call that packs its operands again, so few large tiles: 16 tiles of 64
 * rows made a batched 1024-token Sinkhorn forward+backward 29 % slower on one
 * thread than whole-matrix calls; 8 of 128 rows, 4 %. */
static inline int bki_gemm_block(int n)
{
    int rb = (n + 7) / 8;
    rb = (rb + 15) & ~15;
    return rb < 128 ? 128 : rb;
}
static inline int bki_nblocks(int n, int rb) { return (n + rb - 1) / rb; }

/* C (M x N) = alpha op(A) op(B) + beta C, row-major (ta/tb: op = transpose),
 * in fixed tiles of rows x columns (bki_gemm_tiles: a function of M and N
 * only), each tile one single-threaded BLAS call over the whole inner
 * dimension K; the tiles are shared over the team. No sync (gemm.c). */
void bki_gemm(const bki_team *tm, int ta, int tb, int M, int N, int K, float alpha, const float *A,
              ptrdiff_t lda, const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc);
/* the same, with an epilogue: ep(arg, i0, j0, mi, nj, Ct, ldc) on each tile
 * (rows [i0, i0 + mi), columns [j0, j0 + nj) of C at Ct) right after its
 * call, by the member that computed it (ep nullable: bki_gemm) */
typedef void (*bki_tile_fn)(void *arg, int i0, int j0, int mi, int nj, float *Ct, ptrdiff_t ldc);
void bki_gemm_ep(const bki_team *tm, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                 ptrdiff_t lda, const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc, bki_tile_fn ep,
                 void *arg);
void bki_gemm_tiles(int M, int N, int *rb, int *cb);
/* A product's tiles as blocks of a caller's own claimed loop (several
 * products, or a product and other work, in one loop): bki_gemm_ntiles
 * tiles, numbered as bki_gemm numbers them (0 for an empty output);
 * bki_gemm_tile computes tile t as bki_gemm does, with the same bits (its
 * packed operand is packed again for each call). beta = 0 never streams. */
int bki_gemm_ntiles(int ta, int tb, int M, int N, int K);
void bki_gemm_tile(int t, int ta, int tb, int M, int N, int K, float alpha, const float *A, ptrdiff_t lda,
                   const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc);

/* ---- aligned scratch ---------------------------------------------------- */
#define BK_ALIGN 64
static inline size_t bki_round_up(size_t x) { return (x + BK_ALIGN - 1) & ~(size_t)(BK_ALIGN - 1); }

/* Carves aligned sub-buffers out of one workspace block. */
typedef struct { char *base; size_t used, cap; } bki_arena;
static inline void *bki_take(bki_arena *a, size_t bytes)
{
    size_t off = bki_round_up(a->used);
    if (off + bytes > a->cap) return NULL;
    a->used = off + bytes;
    return a->base + off;
}

/* Like bki_take, for a layout that one function both measures and carves:
 * with a NULL base it only adds the (aligned) bytes to a->used and returns
 * NULL; the capacity is the caller's (it sized the block by measuring). */
static inline void *bki_carve(bki_arena *a, size_t bytes)
{
    size_t off = bki_round_up(a->used);
    a->used = off + bytes;
    return a->base ? a->base + off : NULL;
}

/* ---- tensor validation (tensor.c) --------------------------------------- */
/* Checks a tensor view of logical shape [B,H,N,C]: non-NULL data, strides
 * >= 0, no self-overlap. name is used in the message. */
bk_status bki_check_tensor(const char *name, const bk_tensor *t, int B, int H, int N, int C);
/* Address range [lo, hi) touched by the view. */
void bki_tensor_range(const bk_tensor *t, int B, int H, int N, int C, uintptr_t *lo, uintptr_t *hi);
/* Fails if the ranges of outputs overlap each other or any input. */
bk_status bki_check_aliasing(int nin, const bk_tensor *const *in, const int (*in_shape)[4],
                             int nout, const bk_tensor *const *out, const int (*out_shape)[4],
                             const char *const *out_names);
/* Valid part of [B,H,N,C] (rows below len[b]) must be finite; a tensor in
 * device memory is not scanned (BK_OK). */
bk_status bki_check_finite(const char *name, const bk_tensor *t, int B, int H, int N, int C,
                           const int32_t *len);
/* index (b * H + h) of the first head with a non-finite value in the valid
 * rows of [B,H,N,C], or B * H when none (or the data is NULL or in device
 * memory); large tensors on the library's threads. The operators' results
 * (driver.c, otk.c): O(the tensor), not O(N^2). */
int bki_first_nonfinite(const bk_tensor *t, int B, int H, int N, int C, const int32_t *len);
bk_status bki_check_desc(const bk_attn_desc *d);
/* calloc's contract through bk_alloc (64-byte aligned; from 2 MiB, 2 MiB
 * aligned with huge pages advised); released by free() or bk_free. The
 * training engine's activations and optimiser state: a ViT step 6 % faster
 * than with calloc's 4 KiB pages (docs/PERFORMANCE.md, "LOT from memory,
 * the training step from huge pages"). */
void *bki_calloc(size_t n, size_t size);
/* 1 if the L rows (C floats each, row stride sn) are all finite */
int bki_rows_finite(const float *base, int64_t sn, int L, int C);
/* the index of the first non-finite value of a[0..n), or n (a NULL: n);
 * small arrays (parameter gradients), scanned in vector blocks */
size_t bki_first_nonfinite_array(const float *a, size_t n);
/* the valid rows of each non-NULL one of q, k, v, dout are finite (in that
 * order; the error names the tensor and its first bad row) */
bk_status bki_check_values(const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                           const bk_tensor *dout);
/* q [B,H,Nq,d], k [B,H,Nk,d], v [B,H,Nk,dv]: views valid, valid rows finite */
bk_status bki_check_qkv(const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v);
/* the shapes and strides part of it alone (calls on the library's own
 * activations: bki_call.trusted) */
bk_status bki_check_qkv_shape(const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v);
/* out [B,H,Nq,dv] and optional attn [B,H,Nq,Nk] (data may be NULL): valid
 * views not overlapping q, k, v or each other */
bk_status bki_check_fwd_outputs(const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                                const bk_tensor *out, const bk_tensor *attn);
/* dout, dq, dk, dv: valid views, outputs not overlapping inputs (dout's
 * values: bki_check_values) */
bk_status bki_check_bwd_views(const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                              const bk_tensor *dout, const bk_tensor *dq, const bk_tensor *dk, const bk_tensor *dv);
/* zero rows [from, N) of a [N, C] slice with row stride sn */
void bki_zero_rows(float *base, int64_t sn, int from, int N, int C);
/* The workspace of one call: the caller's (checked against need) or one the
 * call gets from the current context (its allocator or its cache: *owned,
 * released with bki_workspace_release; src/backend/context.c). */
bk_status bki_workspace(void *ws, size_t ws_size, size_t need, const char *query_fn, void **owned, char **base);
/* the memory the current context computes in: BK_DEVICE_HOST or
 * BK_DEVICE_CUDA(i) (as bk_context_use told the core: threads.c) */
int bki_ctx_device(void);
void bki_workspace_release(void *owned);
static inline char *bki_align_ptr(char *p)
{
    return (char *)(((uintptr_t)p + BK_ALIGN - 1) & ~(uintptr_t)(BK_ALIGN - 1));
}
static inline int bki_len(const int32_t *len, int b, int N) { return len ? (int)len[b] : N; }
static inline float *bki_at(const bk_tensor *t, int b, int h)
{
    return t->data + (int64_t)b * t->stride_b + (int64_t)h * t->stride_h;
}

/* The score scale of every attention operator: the caller's s, or 1/sqrt(d)
 * when s is 0. */
static inline float bki_scale(float s, int d) { return s != 0.0f ? s : 1.0f / __builtin_sqrtf((float)d); }

/* ---- the log-domain Sinkhorn / LSE engine (lse_engine.c) ----------------
 * One dense problem: logits C (n x m, row stride ldc), log marginals la (n)
 * and lb (m) (NULL = uniform -log n / -log m). S half-steps, row first, from
 * g = g0 (NULL = 0; a warm start: ASAP's c-transforms are half-steps from a
 * predicted potential). Potentials of every half-step are stored in hist (may be NULL when
 * no backward follows): h_t has n floats for odd t and m for even t, laid out
 * back to back in order t = 1..S (bki_hist_len gives the total). */
typedef struct {
    int n, m;
    const float *C; ptrdiff_t ldc;
    const float *la, *lb;      /* NULL = uniform                            */
    int S;                     /* >= 1 half-steps                           */
    float tol;                 /* 0 = none; else stop after a row step whose
                                  column error < tol                        */
    const float *g0;           /* initial column potential (m) or NULL = 0;
                                  the backward treats it as a constant      */
    float kappa;               /* column steps damped: g = kappa (log b -
                                  LSE_i(C + f)), kappa = rho / (rho + eps)
                                  (semi-unbalanced OT, a KL penalty rho on
                                  the column marginal); 0 or 1: balanced    */
    int quiet;                 /* 1: the caller reads neither row_err nor
                                  col_err: the checks that only feed them
                                  (each row's sum of A, the column sums
                                  after an odd final step) are skipped; the
                                  same A, f and g. 0: computed            */
} bki_sk_problem;

typedef struct {
    float *hist;               /* [bki_hist_len(n,m,S)], required           */
    float *A; ptrdiff_t lda;   /* n x m attention, A = P / a_i (required)   */
    const float *f, *g;        /* out: final potentials, pointers into hist
                                  (g NULL when only one half-step ran)      */
    int   iters;               /* out: half-steps run                       */
    float row_err, col_err;    /* out: relative marginal errors of A        */
} bki_sk_result;

size_t bki_hist_len(int n, int m, int S);
/* Offset of h_t (1-based t) inside hist. */
size_t bki_hist_off(int n, int m, int t);

/* ---- kernels compiled per instruction set (lse_engine.c), chosen at run
 * time (threads.c, bki_kern) ----------------------------------------------
 * The engine's entry points are called by every member of a team with the
 * same arguments (a solo caller passes &BKI_SOLO); the problem's matrices and
 * the scratch are shared by the team; results (hist, A, G, dla, dlb) are
 * complete on return in every member; the scratch may be reused after a
 * bki_team_sync. */
/* The thin-product GEMM kernel (gemm_kern.c), compiled per instruction set:
 * thin(trans, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pk) is
 * C = alpha op(A) op(B) + beta C on one thread (beta == 0: C not read), each
 * element one fused multiply-add chain over k in order, then alpha * sum
 * (+ beta * C). trans == 0 streams the rows of op(A) against op(B) (packed
 * into pk when tb); trans == 1 streams the columns of op(B) against op(A)^T
 * (packed into pk unless ta). pk holds pack_floats(K, N) floats (trans 0) or
 * pack_floats(K, M) (trans 1); with packed, pk holds the packed operand
 * already (a previous call's, with the same operand, K and short side).
 * stream: store C's whole cache lines with non-temporal stores (trans 0,
 * beta == 0; lines of C 64-byte aligned, the others stored as usual), for
 * an output too large to stay in cache: no read of each line before it is
 * written; the same values, ordered by an sfence before the call returns. */
typedef struct {
    int mr, nr; /* micro-tile rows and columns */
    size_t (*pack_floats)(int rows, int cols);
    void (*thin)(int trans, int ta, int tb, int M, int N, int K, float alpha, const float *A, ptrdiff_t lda,
                 const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc, float *pk, int packed,
                 int stream);
} bki_gemm_kernels;
extern const bki_gemm_kernels bki_gemm_kernels_avx2;
extern const bki_gemm_kernels bki_gemm_kernels_avx512;

/* Order-preserving map float -> uint32 (-0 and +0 map to the same key): the
 * sort keys of sort1d.c and of the kernels' small sort. */
static inline uint32_t bki_sort_key(float x)
{
    x += 0.0f; /* -0 -> +0 */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

typedef struct {
    const char *name;
    const bki_gemm_kernels *gemm;
    /* floats of scratch an engine call needs for an n x m problem run by a
     * team of nt members (nt = 1 for a solo caller) */
    size_t (*sk_scratch)(int n, int m, int nt);
    /* forward: fills res (hist, A, f, g, iters, errors); res is the member's
     * own struct (its buffers are shared) */
    void (*sk_forward)(const bki_team *tm, const bki_sk_problem *pb, bki_sk_result *res, float *scratch);
    /* recomputes the forward's A from its potentials (bitwise the same) */
    void (*sk_attention)(const bki_team *tm, const bki_sk_problem *pb, int iters, const float *hist, float *A,
                         ptrdiff_t lda, float *scratch);
    /* unrolled VJP of the iters-step forward. A: the forward's attention
     * (destroyed). G: Abar = dL/dA on entry, Cbar = dL/dC on exit. dla (n),
     * dlb (m): gradients w.r.t. the log marginals, or NULL. */
    void (*sk_backward)(const bki_team *tm, const bki_sk_problem *pb, int iters, const float *hist, float *A,
                        ptrdiff_t lda, float *G, ptrdiff_t ldg, float *scratch, float *dla, float *dlb);
    /* machine-peak probes for the benchmark: flops / exps done */
    double (*fma_probe)(long iters);
    double (*exp_probe)(long reps, float *buf4096);
    void (*vexp)(float *x, size_t n);
    /* the exact GELU (src/core/vgelu.h): y = gelu(z); dz = dy gelu'(z) (dz
     * may be dy); the same bits on every instruction set */
    void (*gelu)(size_t n, const float *z, float *y);
    void (*gelu_grad)(size_t n, const float *z, const float *dy, float *dz);
    /* g = gelu(z) and z := gelu'(z), from one evaluation (the same bits as
     * gelu, and as gelu_grad with dy = 1) */
    void (*gelu_keep_slope)(size_t n, float *z, float *g);
    /* ESP's SoftSort: one row p = softmax_i(-(a_i - s)^2 / t) (entries below
     * 1e-30 flushed to 0), and its backward (adds to da, returns sum g). */
    void (*softsort_row)(int n, const float *a, float s, float inv_t, float *p);
    float (*softsort_row_bwd)(int n, const float *a, float s, float inv_t, const float *p,
                              const float *dp, float *da);
    /* bki_argsort's order for n <= small_sort_max keys (no scratch): AVX-512
     * 128, a sorting network from 17 keys, ranks below; AVX2 96, by rank */
    int small_sort_max;
    void (*small_argsort)(int n, const float *x, ptrdiff_t stride, int32_t *idx);
    /* BKI_LANES independent sorts at once, one in each lane: key[r *
     * BKI_LANES + l] is the r-th key of sort l; the network's ncmp
     * comparators (bki_sort_net) leave every lane ascending. idx (same
     * layout, or NULL) moves with its key, pairs ordered by (key, index):
     * indices 0..n-1 on entry give bki_argsort's stable order (-0 and +0
     * tie, as there). Keys must not be NaN. */
    void (*lanes_sort)(int ncmp, const uint16_t *pairs, float *key, int32_t *idx);
    /* bki_potential1d for BKI_LANES problems in lanes, from the lanes'
     * sorted values: sa (n x BKI_LANES) with the query indices ia, sb (m x
     * BKI_LANES); lane l's potential goes to f[l * fs + ia[r]] (l < lanes),
     * its mean to mean[l]. Bitwise bki_potential1d's (the same double
     * operations in the same order). */
    void (*potential1d_lanes)(int n, int m, const float *sa, const int32_t *ia, const float *sb, int lanes,
                              double *f, size_t fs, double *mean);
} bki_kernels;
/* the lanes of bki_kernels.lanes_sort and potential1d_lanes */
#define BKI_LANES 16
/* ASAP's and ESP's slices are sorted BKI_LANES at a time by the network up
 * to this many keys a side, each slice alone above. The network's
 * comparators grow as n log^2 n against the radix sort's n: measured (2
 * threads), the lanes took ASAP at N = 512 (8 heads) from 4.5 to 4.2 ms and
 * at N = 1024 (2 heads) from 4.0-4.2 to 3.8-4.0 ms; at N = 2048 they gained
 * nothing. */
#define BKI_LANES_SORT_MAX 1024
/* whether two sides of n and m keys take the lanes sort */
static inline int bki_lanes_fit(int n, int m) { return n <= BKI_LANES_SORT_MAX && m <= BKI_LANES_SORT_MAX; }

const bki_kernels *bki_kern(void);
extern const bki_kernels bki_kernels_avx2;
extern const bki_kernels bki_kernels_avx512;

/* Implicit-differentiation backward at the fixed point (implicit.c; double
 * precision, LAPACK). A: n x m attention; G: Abar in, Cbar out. */
size_t bki_sk_implicit_scratch(int n, int m);   /* doubles */
bk_status bki_sk_backward_implicit(const bki_sk_problem *pb, const float *A, ptrdiff_t lda,
                                   float *G, ptrdiff_t ldg, double *dscratch);

/* ---- sort / 1-D transport engine (sort1d.c) ----------------------------- */
size_t bki_argsort_scratch(int n); /* bytes */
/* stable ascending argsort of x[i*stride], i < n (no NaN) */
void bki_argsort(int n, const float *x, ptrdiff_t stride, int32_t *idx, void *scratch);
/* the same order by a team (every member calls it; bitwise bki_argsort's for
 * any team); scratch: bki_argsort_scratch(n) bytes, counts:
 * bki_argsort_team_counts(n) bytes, both shared by the team. Ends synced. */
size_t bki_argsort_team_counts(int n); /* bytes */
void bki_argsort_team(const bki_team *tm, int n, const float *x, ptrdiff_t stride, int32_t *idx, void *scratch,
                      void *counts);
/* Batcher's odd-even merge sorting network on n keys (n <= 65536): its
 * comparators (i < j: the smaller key to i) in order into pairs (2 per
 * comparator), pruned at n; returns their count, at most
 * bki_sort_net_bound(n) */
int bki_sort_net_bound(int n);
int bki_sort_net(int n, uint16_t *pairs);
/* A member's scratch for sorting groups of BKI_LANES slices in lanes (ASAP's
 * and ESP's): keys ka with their indices ix for up to max(n, m) keys a lane,
 * keys kb for up to m, and the networks of n and m keys (net_m == net_n when
 * m == n). bki_lanes_bytes(n, m) bytes; bki_lanes_init carves them from scr
 * and makes the networks (n, m at most those it was sized for). */
typedef struct {
    float *ka, *kb;
    int32_t *ix;
    const uint16_t *net_n, *net_m;
    int cmp_n, cmp_m; /* the networks' comparator counts */
} bki_lanes;
size_t bki_lanes_bytes(int n, int m);
bki_lanes bki_lanes_init(void *scr, int n, int m);
/* a group's keys in lanes: key[r][l] = x[r * ldr + l * ldl] for r < len,
 * l < nl (lanes past nl: 0, sorted along and never read): a slice-major
 * source has ldr = 1, a token-major one ldl = 1 (rows copied whole); with
 * idx, idx[r][l] = r (the start of a stable sort) */
void bki_lanes_load(int len, int nl, const float *x, size_t ldr, size_t ldl, float *key, int32_t *idx);
/* north-west-corner pairs between uniform n and m sorted atoms, mass =
 * cells / (n m); arrays of n + m - 1 entries; returns the count */
int bki_nw_pairs(int n, int m, int32_t *pr, int32_t *ps, double *cells);
/* query-side Kantorovich potential of the 1-D uniform problem (cost
 * (a-b)^2/2) from both sort orders, in token order; returns its mean */
double bki_potential1d(int n, int m, const float *a, ptrdiff_t sa, const int32_t *ia, const float *b,
                       ptrdiff_t sb, const int32_t *ib, double *f);
/* L unit directions in R^d from a seed (normalised Gaussians) */
void bki_unit_directions(uint64_t seed, int L, int d, float *theta);

/* 8-lane float dot product with a fixed summation order (vectorises without
 * -ffast-math; the result does not depend on alignment or threads) */
static inline float bki_dotf(int m, const float *a, const float *b)
{
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = 0;
    for (; j + 8 <= m; j += 8)
        for (int l = 0; l < 8; l++) acc[l] = __builtin_fmaf(a[j + l], b[j + l], acc[l]);
    for (; j < m; j++) acc[0] = __builtin_fmaf(a[j], b[j], acc[0]);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* r <- r / |r| (the norm accumulated in double); returns 0, r untouched, for
 * a zero row: spherical K-means and the OTK anchors' unit rows */
static inline int bki_unit_row(float *r, int dim)
{
    double s = 0.0;
    for (int c = 0; c < dim; c++) s += (double)r[c] * r[c];
    if (!(s > 0.0)) return 0;
    const float inv = (float)(1.0 / sqrt(s));
    for (int c = 0; c < dim; c++) r[c] *= inv;
    return 1;
}

/* ---- seeded random numbers (splitmix64): ESP slices, K-means sampling ----
 * THE definition of the library's generator; its public face is
 * bk_splitmix64 (birkhoff/core.h, status.c), which the CLI and the tests
 * call. */
#define BKI_GOLDEN 0x9E3779B97F4A7C15ull /* splitmix64's increment */
/* splitmix64's output function (a bijective mix of one word) */
static inline uint64_t bki_mix64_fin(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* the next number of the stream *s */
static inline uint64_t bki_mix64(uint64_t *s) { return bki_mix64_fin(*s += BKI_GOLDEN); }
/* uniform integer in [0, n) (n >= 1; modulo bias below 2^-40 for n < 2^24) */
static inline uint64_t bki_rand_below(uint64_t *s, uint64_t n) { return bki_mix64(s) % n; }
/* a standard normal draw by Box-Muller from two draws of the splitmix64
 * stream s (u in (0, 1), never 0): the slice banks' (bki_unit_directions)
 * and Performer's projection */
static inline double bki_gauss(uint64_t *s)
{
    const double u = ((double)(bki_mix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    const double w = (double)(bki_mix64(s) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w);
}

/* UTF-8 (status.c): the length of the sequence at s (n bytes available),
 * 1..4 when whole and well-formed (*cp its code point; no overlong form,
 * surrogate or value above U+10FFFF), 0 when malformed, -1 when the n bytes
 * are a valid but unfinished start. */
int bki_utf8_seq(const unsigned char *s, size_t n, uint32_t *cp);
/* the offset of the first byte of s that is not well-formed UTF-8, or -1 */
long bki_bad_utf8(const char *s);

/* Output files (outfile.c; the rules in bk_outset_add, birkhoff/core.h). */
/* One file of nparts parts, committed at once (flags: bk_outset_add's). */
bk_status bki_write_file(const char *path, unsigned flags, int nparts, const void *const *parts, const size_t *sizes);
/* The end of a one-shot set: commits set when st (its staging) is BK_OK,
 * frees it, returns the status; set NULL (bk_outset_create failed): st. */
bk_status bki_outset_done(bk_outset *set, bk_status st);
/* An append-only log of a run directory, never through a symlink: fresh, a
 * new file (whatever the name held is removed first; created exclusively,
 * 0666 less the umask); else the existing regular file, appended (a symlink,
 * FIFO or device there is refused without blocking). NULL after bki_fail
 * (BK_ERR_IO naming the path). */
FILE *bki_open_log(const char *path, int fresh);
/* Removes, in dir, the temporaries of bk_outset_add left by processes that no
 * longer exist: of the file named base, or of every file when base is NULL.
 * Returns how many were removed. */
int bki_clean_stale(const char *dir, const char *base);

/* ---- .npy headers and .npz archives (npy.c, npz.c) ----------------------
 * The one parser of .npy headers: bk_npy_read and the dataset readers
 * (src/data/arrays.c, over mapped files and .npz members) use it. */
typedef enum { BKI_NPY_F32, BKI_NPY_I32, BKI_NPY_I64, BKI_NPY_U8 } bki_npy_dtype;
#define BKI_NPY_MAX_COUNT ((int64_t)1 << 40) /* elements of one array */
typedef struct {
    bki_npy_dtype dtype;  /* '<f4', '<i4', '<i8', '|u1' (or '<u1')       */
    int esize;            /* bytes per element                           */
    int ndim;             /* 0..8                                        */
    int64_t shape[8];     /* each in [0, 2^40]                           */
    int64_t count;        /* elements (product of shape; <= 2^40)        */
    uint64_t bytes;       /* count * esize                               */
    size_t offset;        /* where the data start: preamble + header     */
} bki_npy_head;
/* Parses the preamble and header of a .npy file held at buf[0..n) (n may
 * stop anywhere after the header: the data are not looked at). path is what
 * the messages name. BK_ERR_FORMAT for an empty buffer, a bad magic, a
 * version other than 1..3, a header over 1 MiB or cut short, a dtype other
 * than the four above (the message names it), Fortran order, a malformed
 * shape, a dimension over 2^40 or more than 2^40 elements; BK_ERR_NOMEM.
 * *out is zeroed on failure. */
bk_status bki_npy_header(const char *path, const void *buf, size_t n, bki_npy_head *out);
/* "float32", "int32", "int64", "uint8" */
const char *bki_npy_dtype_name(bki_npy_dtype t);

/* A member of a .npz (zip) archive, from its central directory. */
typedef struct {
    char name[64];        /* the member's name (NUL-terminated; "" for a
                             name over 63 bytes)                          */
    int method;           /* 0 stored, 8 deflated                         */
    uint64_t offset;      /* of the member's data in the archive          */
    uint64_t csize, usize;/* compressed and uncompressed sizes            */
    uint32_t crc;         /* CRC-32 of the uncompressed data              */
} bki_zip_member;
#define BKI_ZIP_MAX_MEMBERS 256
/* Lists the members of a zip archive held at buf[0..n) (memory-mapped or
 * read): the end of central directory record (zip64 too), then every
 * central directory entry and its local header, checked against the
 * archive's bounds. Writes up to BKI_ZIP_MAX_MEMBERS members and *count.
 * Refuses (BK_ERR_FORMAT, naming path and the byte offset): no end record,
 * a multi-disk archive, an entry or local header outside the file or cut
 * short, encrypted members, a method other than stored or deflated, a
 * stored member whose sizes differ, a data range outside the file, two
 * members of one name, more than 256 members. A name over 63 bytes is
 * listed as "" (no reader asks for it). */
bk_status bki_zip_list(const char *path, const uint8_t *buf, size_t n, bki_zip_member *m, int *count);
/* The uncompressed data of member m of buf: stored: *data points into buf
 * (*owned NULL); deflated: inflated (raw deflate) into a malloc'd buffer
 * (*data = *owned, free it) of at most max_bytes bytes. Checks the size and
 * the CRC-32 (BK_ERR_FORMAT naming path and member); BK_ERR_NOMEM. */
bk_status bki_zip_data(const char *path, const uint8_t *buf, const bki_zip_member *m, uint64_t max_bytes,
                       const uint8_t **data, void **owned);

#define BKI_FNV_OFFSET 0xcbf29ce484222325ull /* FNV-1a 64's start */
/* FNV-1a 64 over n bytes, continuing from h (start: BKI_FNV_OFFSET):
 * the checksum of ASAP layer files and checkpoints */
static inline uint64_t bki_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* ---- key=value configuration tables (config.c) -------------------------- */
/* BKI_F_U64: a uint64_t (seeds), decimal 0..2^64-1 (no sign) */
typedef enum { BKI_F_INT, BKI_F_I64, BKI_F_FLOAT, BKI_F_ENUM, BKI_F_LIST, BKI_F_U64 } bki_field_type;
typedef struct {
    const char *name;
    bki_field_type type;
    size_t offset;
    const char *const *names;  /* ENUM: value names, NULL-terminated       */
    int list_len;              /* LIST: int array length (0-terminated)    */
    /* the schema (optional; a table written before it has zeros here):
     * doc, one line for --help, docstrings and the docs' tables; lo..hi
     * the accepted range of an INT, I64 or FLOAT (checked by bki_cfg_set
     * and bki_cfg_parse when lo < hi; BKI_FR_OPEN_LO makes lo exclusive:
     * "> 0"); the default is the owner's default struct's value */
    const char *doc;
    double lo, hi;
    unsigned rflags;
    const char *alias;         /* an older CLI flag of the key, without
                                  "--" (`attn --softsort-t`), or NULL      */
} bki_field;
#define BKI_FR_OPEN_LO 1u
/* "[lo, hi]" or "(lo, hi]" of a field with a range, "" without */
void bki_cfg_range(const bki_field *f, char *buf, size_t cap);
/* every ranged scalar field of obj inside its range (BK_ERR_PARAM naming
 * the first outside, as bki_cfg_set would) */
bk_status bki_cfg_check(const void *obj, const bki_field *tab, int n, const char *what);
bk_status bki_cfg_set(void *obj, const bki_field *tab, int n, const char *what, const char *key,
                      const char *value);
bk_status bki_cfg_parse(void *obj, const bki_field *tab, int n, const char *what, const char *text);
size_t bki_cfg_format(const void *obj, const bki_field *tab, int n, char *buf, size_t cap);

#define BK_STR2(x) #x
#define BK_STR(x) BK_STR2(x)

/* Files compiled once per instruction set (lse_engine.c, gemm_kern.c: the
 * Makefile defines BK_ISA as avx2 or avx512) name their functions ISA(f) ->
 * f_avx2 / f_avx512. */
#ifdef BK_ISA
#define BK_CAT2(a, b) a##_##b
#define BK_CAT(a, b) BK_CAT2(a, b)
#define ISA(name) BK_CAT(name, BK_ISA)
#endif

#endif
