/*
 * birkhoff/core.h -- doubly-stochastic (optimal-transport) attention in C:
 * the conventions of the whole API, status and errors, threads, tensors,
 * vector math, the text reader and .npy files.
 *
 * <birkhoff.h> includes every part of the API (birkhoff/core.h, context.h,
 * attn.h, ops.h, esp.h, lot.h, otk.h, asap.h, nn.h, data.h, train.h and the
 * deprecated names of compat.h). Every function returns a bk_status; on
 * failure bk_last_error() gives a readable reason (thread-local). Argument,
 * parameter, workspace and tape errors are found before anything is written;
 * the failures found while problems run (Sinkhorn's implicit backward, a
 * linear system that cannot be solved; BK_ERR_OVERFLOW, finite inputs whose
 * scores, output or gradients overflow float32) are reported for the lowest
 * failing problem after the call, when the outputs have been written (the
 * overflowing ones with NaN or Inf: never use them on a failure). No call
 * returns BK_OK with a non-finite output or gradient (host memory).
 *
 * ----------------------------------------------------------------------------
 * CONVENTIONS OF THE WHOLE API
 * ----------------------------------------------------------------------------
 * Names: public bk_*, one header per part; objects come in create/free pairs.
 * Options: every option struct is bk_<thing>_config, with a
 *   bk_<thing>_config_default() that gives its documented defaults (the
 *   operators' structs, models, optimisers, contexts, datasets, runs).
 *   Configurations with a key=value text form (bk_model_config, ...,
 *   and each registered operator's through bk_op_config_set) use the field
 *   names as keys.
 * Iterations: every Sinkhorn-type iteration count (Sinkhorn and unbalanced
 *   iters, LOT iters, ASAP teacher_iters, OTK iters, the model's sk_iters,
 *   lot_iters, otk_iters) counts HALF-STEPS: one row or one column
 *   normalisation. S = 1 is a single row step (softmax); OTK, which runs
 *   whole (row, column) iterations, takes an even count. (Outer loops that
 *   are not Sinkhorn steps, K-means and Newton iterations, count themselves.)
 * Gradients: every operator backward OVERWRITES its outputs: the input
 *   gradients (zero in padded rows) and the parameter gradients (LOT's dZ
 *   and dtheta, ESP's dtheta, OTK's dz and dW: the sums over the batch).
 *   The training engine is the one accumulator, by design:
 *   bk_model_backward ADDS to the model's gradient buffer (zeroed by
 *   bk_model_zero_grad), so micro-batches accumulate.
 * Arrays: attention operands are bk_tensor views (strided, below); the
 *   parameter arrays of an operator (LOT's pivots, ESP's slices, OTK's
 *   references and anchors, ASAP's layers) are dense row-major float
 *   arrays with the shapes their headers give.
 *
 * ----------------------------------------------------------------------------
 * TENSORS AND LAYOUT
 * ----------------------------------------------------------------------------
 * Tensors are float32 (dtype BK_F32, the zero value); the CUDA backend also
 * takes bfloat16 and float16 operands (BK_BF16, BK_F16: every tensor of one
 * call in the same dtype, outputs written in it, arithmetic in float32;
 * docs/CUDA.md). An attention operand is a 4-D array indexed
 * [b][h][n][c] (batch, head, sequence position, channel). The channel index is
 * contiguous; the other three have explicit strides, counted in elements of
 * the tensor's dtype (floats for BK_F32):
 *
 *     element(b, h, n, c) = data[b*stride_b + h*stride_h + n*stride_n + c]
 *
 * so both [B,H,N,d] (bk_tensor_bhnd) and PyTorch's [B,N,H,d] (bk_tensor_bnhd)
 * work without copies. Strides must be non-negative and the tensor must not
 * overlap itself; outputs must not overlap inputs or each other.
 *
 * ----------------------------------------------------------------------------
 * ATTENTION PROBLEM
 * ----------------------------------------------------------------------------
 * bk_attn_desc: B batches x H heads of independent problems, each with Nq
 * queries and Nk keys, head dims d (queries/keys) and dv (values). Optional
 * per-batch valid lengths q_len[b] in [0, Nq] and k_len[b] in [0, Nk]
 * (padding): problem (b, h) is solved on its valid Lq x Lk block only; padded
 * keys receive zero mass, padded query rows of the output are zero, and the
 * values stored in padded positions are never read (they may hold anything,
 * NaN included). A padded batch gives exactly the truncated problems' result.
 * A problem with Lq = 0 or Lk = 0 has a zero output and zero gradients.
 *
 * Scores are  C = (scale / eps) * Q K^T  (scale = 0 selects 1/sqrt(d)).
 *
 * ----------------------------------------------------------------------------
 * SINKHORN ATTENTION (Sinkformers; docs/ALGORITHMS.md)
 * ----------------------------------------------------------------------------
 * S log-domain half-steps on C, row first, with marginals a = 1/Lq (rows) and
 * b = 1/Lk (columns), starting from a zero column potential:
 *     t odd : f_i = log a - LSE_j (C_ij + g_j)        (row step)
 *     t even: g_j = log b - LSE_i (C_ij + f_i)        (column step)
 * Plan P_ij = exp(C_ij + f_i + g_j) (g = 0 when S = 1); attention A = Lq * P;
 * output O = A V. S = 1 is exactly softmax attention. Odd S: rows of A sum to
 * 1 exactly; even S: columns of A sum to Lq/Lk exactly; both at convergence.
 *
 * ----------------------------------------------------------------------------
 * ACCURACY CONTRACT (tested in tests/)
 * ----------------------------------------------------------------------------
 * float32 storage and arithmetic, potentials and LSEs max-shifted in float32,
 * exp by an inline polynomial with < 2 ulp error. Against a double-precision
 * reference, on inputs with |C| <= 20: outputs and attention agree to 1e-5
 * relative to the largest entry (times a factor growing like S for Sinkhorn),
 * gradients to 1e-4 relative. Rows of A for odd S sum to 1 within 1e-6.
 *
 * ----------------------------------------------------------------------------
 * THREADS AND DETERMINISM (docs/ARCHITECTURE.md, "Parallel model")
 * ----------------------------------------------------------------------------
 * The library partitions its work itself: problems, row blocks, column ranges
 * and GEMM tiles have sizes that depend on the shape only; every GEMM tile is
 * one single-threaded BLAS call; every cross-block sum is taken in block
 * order. A call runs several problems at once, one per thread, or, when there
 * are fewer problems than threads, each problem on all threads together. The
 * contract, on one machine and one kernel path (bk_isa, OpenBLAS core type):
 *   - outputs, extras and every gradient are bitwise identical for any thread
 *     count, and for any batch shape (a problem alone or inside a batch);
 *   - across kernel paths (AVX-512 vs AVX2, OpenBLAS's SkylakeX vs Haswell
 *     kernels) and machines, results agree within the accuracy contract
 *     above (1e-5 forward, 1e-4 gradients, relative to the largest entry).
 * Tapes are opaque and deterministic (padding and unused history zeroed).
 * Thread count: bk_set_num_threads(n) (n <= 0: back to the default), else the
 * environment variable BIRKHOFF_NUM_THREADS, else the CPUs this process may
 * use: its affinity mask (taskset, a container's cpuset), bounded by a
 * cgroup CPU quota rounded up (cgroup v2 cpu.max or v1 cpu.cfs_quota_us of
 * the process's cgroup and its ancestors: a container's --cpus, a systemd
 * CPUQuota). OpenMP's own setting (OMP_NUM_THREADS, omp_set_num_threads,
 * torch.set_num_threads) is not used: the library runs its own threads,
 * whose waits spin a few microseconds and then sleep, whatever
 * OMP_WAIT_POLICY says, and blocks of work move at run time from a member
 * the kernel descheduled to the others (the partition, and so every bit of
 * the results, stays the same). Calls from several threads of the caller at
 * once each get threads of their own.
 * BLAS: with OpenBLAS's pthreads build (Debian's default) the library sets
 * OpenBLAS to one thread the first time it runs (openblas_set_num_threads(1),
 * once; other users of the same OpenBLAS in the process, such as numpy, then
 * run single-threaded BLAS); with its OpenMP build nothing process-wide is
 * changed.
 * Floating point: inside its parallel regions the library sets flush-to-zero
 * and denormals-are-zero and restores the caller's mode on exit, so neither
 * speed nor results depend on the caller's mode.
 *
 * ----------------------------------------------------------------------------
 * WORKSPACE AND TAPE
 * ----------------------------------------------------------------------------
 * Each operator has a *_workspace_size() query. Pass a buffer of at least that
 * many bytes (64-byte alignment recommended), or NULL to let the call allocate
 * it once (freed before return). The size depends on the thread count in force
 * when queried; a smaller buffer gives BK_ERR_WORKSPACE. No allocation happens
 * inside the per-problem loops.
 * The tape is what a forward keeps for its backward: the potentials of every
 * half-step, O(S (Nq + Nk)) floats per problem, never an Nq x Nk matrix. Size it
 * with *_tape_size(); the backward replays the forward from it.
 */
#ifndef BIRKHOFF_CORE_H
#define BIRKHOFF_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define BK_API __attribute__((visibility("default")))
#else
#define BK_API
#endif

#define BK_VERSION_MAJOR 0
#define BK_VERSION_MINOR 2
#define BK_VERSION_PATCH 0
BK_API const char *bk_version(void);
/* sizeof the public struct named (e.g. "bk_esp_config"), 0 for an unknown
 * name: lets bindings without a compiler (python/birkhoff) check their
 * mirror of each struct when they load the library. */
BK_API size_t bk_abi_sizeof(const char *name);

/* ------------------------------------------------------------------------ */
/* Status and errors                                                        */
/* ------------------------------------------------------------------------ */
typedef enum {
    BK_OK = 0,
    BK_ERR_NULL,        /* a required pointer is NULL                        */
    BK_ERR_SHAPE,       /* a size is zero, negative or inconsistent          */
    BK_ERR_STRIDE,      /* strides negative, self-overlapping, or outputs
                           overlapping inputs/outputs                        */
    BK_ERR_LENGTH,      /* a valid length outside [0, N]                     */
    BK_ERR_PARAM,       /* a parameter out of range (eps <= 0, S < 1, ...)   */
    BK_ERR_NONFINITE,   /* NaN or Inf in the valid part of an input          */
    BK_ERR_NOMEM,       /* allocation failed                                 */
    BK_ERR_WORKSPACE,   /* workspace smaller than *_workspace_size()         */
    BK_ERR_TAPE,        /* tape missing, corrupt or from another problem     */
    BK_ERR_IO,          /* file could not be opened, read or written         */
    BK_ERR_FORMAT,      /* file content malformed (bad header, dtype, size)  */
    BK_ERR_NUMERIC,     /* a numerical failure (e.g. singular system)        */
    BK_ERR_UNSUPPORTED, /* feature not available in this build               */
    BK_ERR_OVERFLOW     /* finite inputs, but a result (scores, sums, an
                           output or a gradient) overflowed float32: the
                           call fails instead of returning NaN or Inf. Every
                           operator's forward and backward checks its
                           outputs and gradients (host memory; O(outputs),
                           not O(N^2)); the message names the problem and
                           the sizes that overflowed                         */
} bk_status;

/* Static string naming the status ("ok", "null pointer", ...). */
BK_API const char *bk_status_str(bk_status s);
/* Detailed message of the last failing call on this thread ("" if none),
 * escaped by bk_escape (flags 0): whatever it echoes (a path, a key, a line
 * of a file) holds no control character, ANSI escape or invalid UTF-8, so it
 * is safe to print on a terminal; at most 1023 bytes. */
BK_API const char *bk_last_error(void);

/* Text for a terminal or a log. bk_escape copies the n bytes of s into out
 * (cap bytes, always NUL-terminated when cap > 0) with
 *   - the control characters escaped: '\n', '\r', '\t' as the two
 *     characters "\n", "\r", "\t", the other C0 bytes and DEL as "\xNN"
 *     (ESC: "\x1b"), the C1 controls (U+0080-U+009F) and the bidirectional
 *     embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069) as
 *     "\uNNNN"; with BK_ESCAPE_KEEP_NL, '\n' and '\t' are kept (multi-line
 *     text);
 *   - every byte that is not part of a valid UTF-8 sequence (a stray
 *     continuation byte, an overlong or surrogate encoding, a sequence cut
 *     short, 0xC0, 0xC1, 0xF5-0xFF) as "\xNN";
 *   - everything else, valid UTF-8 included, as it is. A backslash is not
 *     escaped, so escaping escaped text changes nothing.
 * Returns the length of the whole escaped text, as snprintf: a value >= cap
 * means out was cut, at the end of a character or an escape (never inside
 * one). s may be NULL when n is 0. */
enum { BK_ESCAPE_KEEP_NL = 1 };
BK_API size_t bk_escape(char *out, size_t cap, const char *s, size_t n, unsigned flags);
/* For a stream escaped in pieces: how many bytes at the end of s (0 to 3)
 * start a UTF-8 sequence that the next piece may complete. Escape the rest
 * now and those with the next piece (at the end of the stream, on their
 * own: bk_escape then shows them as "\xNN"). */
BK_API size_t bk_escape_tail(const char *s, size_t n);

/* ------------------------------------------------------------------------ */
/* Threads and CPU                                                          */
/* ------------------------------------------------------------------------ */
/* n >= 1 threads; n <= 0 restores the default (BIRKHOFF_NUM_THREADS, else
 * the CPUs of the process's affinity mask). Results do not depend on it.
 * n > 4096 (the bound of bk_context_config.threads) is refused with
 * BK_ERR_PARAM and the count is left as it was. */
BK_API bk_status bk_set_num_threads(int n);
BK_API int  bk_get_num_threads(void);
/* Instruction set used by the kernels: "avx512" or "avx2". Chosen once from
 * the CPU; the environment variable BK_ISA=avx2 forces the AVX2 kernels. */
BK_API const char *bk_isa(void);

/* ------------------------------------------------------------------------ */
/* Tensors                                                                  */
/* ------------------------------------------------------------------------ */
/* Where a tensor's data lives: host memory (0, so a zeroed or
 * brace-initialised tensor is a host tensor) or the memory of CUDA device i.
 * Every entry point checks that each tensor lives where the current context
 * computes (birkhoff/context.h) and refuses it otherwise (BK_ERR_PARAM,
 * naming the tensor and both places): the library never copies between
 * host and device behind the caller's back. */
/* Element types: of tensors (BK_F32; BK_BF16 and BK_F16 on the CUDA backend
 * only) and of .npy files (BK_F32, BK_I32). */
typedef enum { BK_F32 = 0, BK_I32 = 1, BK_BF16 = 2, BK_F16 = 3 } bk_dtype;

#define BK_DEVICE_HOST 0
#define BK_DEVICE_CUDA(i) (1 + (i))

typedef struct {
    float  *data;                           /* the first element (of any dtype) */
    int64_t stride_b, stride_h, stride_n;   /* in elements; channel stride 1 */
    int32_t device;                         /* BK_DEVICE_HOST or BK_DEVICE_CUDA(i) */
    int32_t dtype;                          /* bk_dtype: BK_F32 (0, the zero value);
                                               BK_BF16 / BK_F16 on the CUDA backend */
} bk_tensor;

/* Contiguous [B,H,N,C] view. */
BK_API bk_tensor bk_tensor_bhnd(float *data, int H, int N, int C);
/* Contiguous [B,N,H,C] view (PyTorch's usual layout). */
BK_API bk_tensor bk_tensor_bnhd(float *data, int H, int N, int C);

typedef struct {
    int B, H;            /* batch and heads, >= 1                           */
    int Nq, Nk;          /* queries and keys, >= 1                          */
    int d, dv;           /* head dims of Q/K and of V, >= 1                 */
    const int32_t *q_len;/* [B] valid query lengths, or NULL (all Nq)       */
    const int32_t *k_len;/* [B] valid key lengths, or NULL (all Nk)         */
} bk_attn_desc;

/* ------------------------------------------------------------------------ */
/* Vector math and machine probes (used by the benchmark)                   */
/* ------------------------------------------------------------------------ */
/* x[i] = exp(x[i]) with the kernels' own exp (< 2 ulp; 0 below -87.3). */
BK_API void bk_vexp(float *x, size_t n);
/* Measures this core's float32 FMA throughput (GFLOP/s, one thread, the
 * selected instruction set) and the kernels' exp throughput (G exp/s), each
 * for about `seconds`. */
BK_API void bk_machine_peak(double seconds, double *gflops, double *gexps);

/* ------------------------------------------------------------------------ */
/* Seeded random numbers                                                    */
/* ------------------------------------------------------------------------ */
/* splitmix64 (Steele, Lea and Flood 2014), the library's one generator (ESP's
 * slices, K-means' sampling; the CLI's synthetic inputs and the tests' data
 * use it too): adds 0x9E3779B97F4A7C15 to *state and returns the new state
 * mixed (xor-shift-multiply by 0xBF58476D1CE4E5B9 and 0x94D049BB133111EB).
 * The same stream on every machine for a given seed; not cryptographic. */
BK_API uint64_t bk_splitmix64(uint64_t *state);

/* Host memory for workspaces, tapes and large tensors: `bytes` bytes, 64-byte
 * aligned; from 2 MiB on 2 MiB aligned and advised to be backed by huge pages
 * (Linux transparent huge pages, madvise: advice the kernel may ignore). The
 * library allocates its own workspaces this way; operators that gather rows
 * at random (ESP hard) run markedly faster from such memory. NULL when out of
 * memory. Release with bk_free (bk_free(NULL) does nothing). */
BK_API void *bk_alloc(size_t bytes);
BK_API void bk_free(void *p);

/* ------------------------------------------------------------------------ */
/* Text files: the one reader of every text input                           */
/* ------------------------------------------------------------------------ */
/* Every text the library and the birkhoff CLI read (run configurations,
 * metrics files, the sentence files of `bleu` and `translate`) is read line
 * by line through this reader, with three limits, so that an input that
 * never ends (/dev/zero, `yes |`, a FIFO nobody closes) stops with a message
 * instead of growing without bound:
 *   max_line   the longest line in bytes, its '\n' not counted
 *              (default BK_TEXT_MAX_LINE, 1 MiB)
 *   max_bytes  the whole input in bytes (default BK_TEXT_MAX_BYTES, 1 GiB; a
 *              regular file larger than that is refused at open)
 *   max_lines  the number of lines (default BK_TEXT_MAX_LINES, 2^24)
 * and, unless nul_ok, no NUL byte anywhere (a C string would end there). A
 * limit of 0 takes its default; a negative one is BK_ERR_PARAM (so is
 * max_line above 2^40). Each failure is BK_ERR_FORMAT naming the input and the limit,
 * e.g. "-: line 1 is longer than 1048576 bytes (the limit)", "F: line 3 holds
 * a NUL byte (not text)", "F: more than 1073741824 bytes (the limit)",
 * "F: more than 16777216 lines (the limit)"; it is found after reading at
 * most max_line + 64 KiB bytes past the last good line. A directory is
 * refused at open (BK_ERR_IO "D: is a directory, not a text file"); other
 * inputs that can be read (regular files, pipes, terminals, devices) are
 * read as streams. Lines end at '\n' (a '\r' before it is kept: callers that
 * accept CRLF strip it); a last line without '\n' is a line. */
#define BK_TEXT_MAX_LINE ((int64_t)1 << 20)
#define BK_TEXT_MAX_BYTES ((int64_t)1 << 30)
#define BK_TEXT_MAX_LINES ((int64_t)1 << 24)
typedef struct {
    int64_t max_line;   /* bytes of one line without its '\n' (0: BK_TEXT_MAX_LINE)  */
    int64_t max_bytes;  /* bytes of the whole input (0: BK_TEXT_MAX_BYTES)           */
    int64_t max_lines;  /* lines (0: BK_TEXT_MAX_LINES)                              */
    int     nul_ok;     /* 1: NUL bytes are kept in the lines; 0 (default): refused */
} bk_text_config;
/* the defaults above (nul_ok 0) */
BK_API bk_text_config bk_text_config_default(void);
typedef struct bk_text_reader bk_text_reader;
/* Opens path (c NULL: the defaults). BK_ERR_IO when it cannot be opened or
 * is a directory, BK_ERR_FORMAT for a regular file over max_bytes,
 * BK_ERR_PARAM for bad limits; *out is NULL then. */
BK_API bk_status bk_text_open(const char *path, const bk_text_config *c, bk_text_reader **out);
/* Reads the open descriptor fd (0: standard input) from where it stands;
 * name names it in messages (e.g. "-"). fd is not closed by bk_text_close. */
BK_API bk_status bk_text_open_fd(int fd, const char *name, const bk_text_config *c, bk_text_reader **out);
/* The next line: *line points at it, NUL-terminated and without its '\n'
 * (writable, valid until the next call or bk_text_close), *len (nullable)
 * receives its length in bytes. At the end of the input BK_OK with *line
 * NULL. A failure (a limit, a NUL byte, a read error: BK_ERR_IO) is final:
 * every later call returns it. */
BK_API bk_status bk_text_next(bk_text_reader *r, char **line, size_t *len);
/* The 1-based number of the last line bk_text_next returned (0 before the
 * first). */
BK_API int64_t bk_text_lineno(const bk_text_reader *r);
/* Closes what bk_text_open opened and frees r (NULL: nothing). */
BK_API void bk_text_close(bk_text_reader *r);

/* ------------------------------------------------------------------------ */
/* .npy files (little-endian float32 '<f4' or int32 '<i4', C order)         */
/* ------------------------------------------------------------------------ */
typedef struct {
    bk_dtype dtype;
    int      ndim;            /* 0..8 */
    int64_t  shape[8];
    void    *data;            /* malloc'd; release with bk_npy_free */
} bk_npy;

/* Reads a whole .npy file. Rejects bad magic/header, other dtypes, Fortran
 * order, sizes that overflow and truncated data. */
BK_API bk_status bk_npy_read(const char *path, bk_npy *out);
/* Writes one .npy file by the rules of bk_outset_add (atomic: a temporary
 * file beside it, then rename; a device or FIFO is written into). */
BK_API bk_status bk_npy_write(const char *path, bk_dtype dtype, int ndim,
                              const int64_t *shape, const void *data);
/* Stages a .npy file in an output set (bk_outset_add's rules and flags). */
typedef struct bk_outset bk_outset;
BK_API bk_status bk_outset_add_npy(bk_outset *s, const char *path, unsigned flags, bk_dtype dtype, int ndim,
                                   const int64_t *shape, const void *data);
BK_API void bk_npy_free(bk_npy *a);
/* Elements of an array (the product of its shape; saturates at INT64_MAX). */
BK_API int64_t bk_npy_count(const bk_npy *a);

/* ------------------------------------------------------------------------ */
/* Output files (docs/ARCHITECTURE.md, "Files")                             */
/* ------------------------------------------------------------------------ */
/* Every file the library and the CLI write goes through an output set: the
 * outputs of one command are committed together, all or none.
 *
 * bk_outset_add(s, path, flags, nparts, parts, sizes) writes the bytes
 * parts[0..nparts) (sizes[i] bytes each) for `path`:
 *  - a regular file or nothing at path: into a new temporary file in path's
 *    directory, created exclusively (an unnamed O_TMPFILE where the file
 *    system has it, else ".NAME.bk-PID-RANDOM.tmp" with O_EXCL|O_NOFOLLOW,
 *    a random name), with the mode of the file it replaces, else 0666 less
 *    the umask (what fopen gives); bk_outset_commit renames it onto path.
 *    Temporaries of the same path left by a writer that was killed (its
 *    process no longer exists) are removed first.
 *  - a symbolic link: followed (the file it names is replaced), unless flags
 *    holds BK_OUT_NOFOLLOW (then the link itself is replaced; files a program
 *    names itself, such as a run directory's, use it); a link to nothing is
 *    refused.
 *  - a character or block device or a FIFO (/dev/null, a terminal, a pipe),
 *    or a symlink to the file the process's standard output or error is
 *    (/dev/stdout redirected to a file: written through descriptor 1, after
 *    fflush(stdout), so it lands where the rest of the output goes): written
 *    into at once, never replaced (and so not undone if the set later
 *    fails); refused with BK_OUT_NOFOLLOW.
 *  - a directory, socket, or an empty path: refused.
 * BK_OUT_SYNC: fsync the file and its directory (checkpoints).
 * bk_outset_commit renames every staged file onto its path; if one rename
 * fails, the files already renamed are put back (through a hard link kept
 * to each replaced file until the set is in place) and the staged ones are
 * removed. bk_outset_free discards whatever was not committed.
 * Errors: BK_ERR_NULL, BK_ERR_NOMEM, BK_ERR_IO ("cannot write PATH
 * (reason)"); a failed add leaves the set as it was. */
enum { BK_OUT_NOFOLLOW = 1, BK_OUT_SYNC = 2 };
BK_API bk_outset *bk_outset_create(void); /* NULL when out of memory */
BK_API bk_status bk_outset_add(bk_outset *s, const char *path, unsigned flags, int nparts,
                               const void *const *parts, const size_t *sizes);
BK_API bk_status bk_outset_commit(bk_outset *s);
BK_API void bk_outset_free(bk_outset *s);
/* One file of n bytes, committed at once (the rules of bk_outset_add). */
BK_API bk_status bk_file_write(const char *path, unsigned flags, const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_CORE_H */
