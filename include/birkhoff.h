/*
 * birkhoff.h -- doubly-stochastic (optimal-transport) attention in C.
 *
 * One public header. Every function returns a bk_status; on failure
 * bk_last_error() gives a readable reason (thread-local) and nothing has been
 * written to any output.
 *
 * ----------------------------------------------------------------------------
 * TENSORS AND LAYOUT
 * ----------------------------------------------------------------------------
 * All tensors are float32. An attention operand is a 4-D array indexed
 * [b][h][n][c] (batch, head, sequence position, channel). The channel index is
 * contiguous; the other three have explicit strides, counted in floats:
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
 * Tapes are opaque; they are deterministic for softmax/Sinkhorn but may hold
 * unspecified padding for other operators.
 * Thread count: bk_set_num_threads(n) (n <= 0: back to the default), else the
 * environment variable BIRKHOFF_NUM_THREADS, else the CPUs this process may
 * run on (its affinity mask). OpenMP's own setting (OMP_NUM_THREADS,
 * omp_set_num_threads, torch.set_num_threads) is not used.
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
#ifndef BIRKHOFF_H
#define BIRKHOFF_H

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
#define BK_VERSION_MINOR 1
#define BK_VERSION_PATCH 0
BK_API const char *bk_version(void);
/* sizeof the public struct named (e.g. "bk_esp_params"), 0 for an unknown
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
    BK_ERR_UNSUPPORTED  /* feature not available in this build               */
} bk_status;

/* Static string naming the status ("ok", "null pointer", ...). */
BK_API const char *bk_status_str(bk_status s);
/* Detailed message of the last failing call on this thread ("" if none). */
BK_API const char *bk_last_error(void);

/* ------------------------------------------------------------------------ */
/* Threads and CPU                                                          */
/* ------------------------------------------------------------------------ */
/* n >= 1 threads; n <= 0 restores the default (BIRKHOFF_NUM_THREADS, else
 * the CPUs of the process's affinity mask). Results do not depend on it. */
BK_API void bk_set_num_threads(int n);
BK_API int  bk_get_num_threads(void);
/* Instruction set used by the kernels: "avx512" or "avx2". Chosen once from
 * the CPU; the environment variable BK_ISA=avx2 forces the AVX2 kernels. */
BK_API const char *bk_isa(void);

/* ------------------------------------------------------------------------ */
/* Tensors                                                                  */
/* ------------------------------------------------------------------------ */
typedef struct {
    float  *data;
    int64_t stride_b, stride_h, stride_n;   /* in floats; channel stride 1 */
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
/* Sinkhorn attention (and softmax, its S = 1 case)                         */
/* ------------------------------------------------------------------------ */
typedef enum {
    BK_GRAD_UNROLLED = 0, /* exact VJP of the S-step forward (default)      */
    BK_GRAD_IMPLICIT = 1  /* implicit differentiation of the fixed point:
                             the gradient of the converged plan; only right
                             when the forward has converged (large S or a
                             tolerance). O(Nk^3) per problem in double.     */
} bk_grad_mode;

typedef struct {
    float scale;          /* score scale s; 0 selects 1/sqrt(d)            */
    float eps;            /* temperature, > 0 (default 1)                  */
    int   iters;          /* S >= 1 half-steps, row first (default 5)      */
    float tol;            /* >= 0; 0 runs all S half-steps. Otherwise a
                             problem stops after the first row step whose
                             max relative column-marginal error is < tol
                             (checked for free inside the pass; a stopped
                             problem has exact rows).                       */
    bk_grad_mode grad;    /* backward mode                                  */
} bk_sinkhorn_params;

BK_API bk_sinkhorn_params bk_sinkhorn_params_default(void);

/* Per-problem diagnostics (relative marginal errors of the final plan). */
typedef struct {
    int32_t iters;        /* half-steps actually run                        */
    float   row_err;      /* max_i |sum_j P_ij / a_i - 1| (= |rowsum A - 1|) */
    float   col_err;      /* max_j |sum_i P_ij / b_j - 1|                   */
} bk_sinkhorn_diag;

/* Optional forward outputs; any member may be NULL / have data NULL. */
typedef struct {
    bk_tensor attn;           /* [B,H,Nq,Nk] attention A (padding: zeros)  */
    float *f;                 /* [B*H*Nq] row potential (logit units; 0 on
                                 padded rows)                              */
    float *g;                 /* [B*H*Nk] column potential (0 if S = 1)    */
    bk_sinkhorn_diag *diag;   /* [B*H]                                      */
} bk_sinkhorn_extras;

/* Bytes of workspace for forward and backward with the current thread
 * count. */
BK_API size_t bk_sinkhorn_workspace_size(const bk_attn_desc *desc,
                                         const bk_sinkhorn_params *p);
/* Bytes of tape a forward writes for its backward. */
BK_API size_t bk_sinkhorn_tape_size(const bk_attn_desc *desc,
                                    const bk_sinkhorn_params *p);

/* O = A V. q:[B,H,Nq,d] k:[B,H,Nk,d] v:[B,H,Nk,dv] out:[B,H,Nq,dv].
 * tape (nullable) receives what the backward needs; extras (nullable) the
 * optional outputs; ws/ws_size as described above. */
BK_API bk_status bk_sinkhorn_forward(const bk_attn_desc *desc,
                                     const bk_sinkhorn_params *p,
                                     const bk_tensor *q, const bk_tensor *k,
                                     const bk_tensor *v, const bk_tensor *out,
                                     void *tape,
                                     const bk_sinkhorn_extras *extras,
                                     void *ws, size_t ws_size);

/* Vector-Jacobian product: given dout = dL/dO, writes dq, dk, dv (each
 * overwritten, zero in padded rows). tape from the forward with the same
 * desc/params/inputs, or NULL to recompute the forward internally. With
 * p->grad == BK_GRAD_IMPLICIT the tape's final potentials are used. */
BK_API bk_status bk_sinkhorn_backward(const bk_attn_desc *desc,
                                      const bk_sinkhorn_params *p,
                                      const bk_tensor *q, const bk_tensor *k,
                                      const bk_tensor *v, const bk_tensor *dout,
                                      const void *tape,
                                      const bk_tensor *dq, const bk_tensor *dk,
                                      const bk_tensor *dv,
                                      void *ws, size_t ws_size);

/* Softmax attention: A = row-softmax(scale * Q K^T) on the valid block.
 * Same descriptor, layouts and padding as Sinkhorn; it is the S = 1 case of
 * the same engine (p.iters = 1, eps = 1). Tape: the row log-normalisers. */
typedef struct {
    float scale;          /* 0 selects 1/sqrt(d) */
} bk_softmax_params;

BK_API size_t bk_softmax_workspace_size(const bk_attn_desc *desc);
BK_API size_t bk_softmax_tape_size(const bk_attn_desc *desc);
BK_API bk_status bk_softmax_forward(const bk_attn_desc *desc,
                                    const bk_softmax_params *p,
                                    const bk_tensor *q, const bk_tensor *k,
                                    const bk_tensor *v, const bk_tensor *out,
                                    void *tape, const bk_tensor *attn,
                                    void *ws, size_t ws_size);
BK_API bk_status bk_softmax_backward(const bk_attn_desc *desc,
                                     const bk_softmax_params *p,
                                     const bk_tensor *q, const bk_tensor *k,
                                     const bk_tensor *v, const bk_tensor *dout,
                                     const void *tape,
                                     const bk_tensor *dq, const bk_tensor *dk,
                                     const bk_tensor *dv,
                                     void *ws, size_t ws_size);

/* ------------------------------------------------------------------------ */
/* ESP attention (ESPFormer; docs/ALGORITHMS.md section 4)                   */
/* ------------------------------------------------------------------------ */
/* Per problem (n = Lq queries, m = Lk keys), with q~ = s q, k~ = s k
 * (s = scale, 0 selecting 1/sqrt(d)) and slices theta_l (rows of Theta):
 *   a^l = q~ theta_l, b^l = k~ theta_l; P_l, R_l the sort matrices of a^l, b^l
 *   (hard: exact stable ascending argsort; soft: SoftSort rows
 *   P[r,i] = softmax_i(-(a_i - sort(a)_r)^2 / t)); W the 1-D OT plan between
 *   uniform measures on n and m ranks (north-west corner; I/n when n = m);
 *   U_l = P_l^T W R_l (n x m); D_l = sum_ij c(q~_i, k~_j) U_l[i,j] with
 *   c = squared (default) or plain Euclidean distance;
 *   sigma = softmax(-tau (D - min D)); G = sum_l sigma_l U_l;
 *   A = n G (rows sum to 1; hard ESP is exactly doubly stochastic: columns
 *   sum to n/m) or A = G (the paper's scaling); O = A V.
 * Hard sort never forms an n x m matrix: O(L (n+m) log + L (n+m)(d+dv)) time,
 * O(L (n+m)) memory. Soft sort streams the slices: one slice's n x n and
 * m x m soft permutations at a time; O(L (n^2+m^2)(d+dv)) for the squared
 * cost, O(L n m (n+m)) for the Euclidean cost (it needs U_l densely).
 * Under hard sort, Q and K get gradient only through D and sigma, so none at
 * tau = 0; the permutations are locally constant. Soft sort gives the full
 * gradient to Q, K, V and Theta. SoftSort entries below 1e-30 are flushed to
 * zero (below float rounding of the result) and the soft path runs with the
 * FPU's flush-to-zero mode, so subnormals never slow it down.
 * The reference code (Anon4142/ESPFormer) uses Euclidean cost, no 1/N in the
 * plans and a temperature T: its output equals ours with cost = EUCLID,
 * out_scale = ROWS and tau = T * N. */
typedef enum { BK_ESP_HARD = 0, BK_ESP_SOFT = 1 } bk_esp_sort;
typedef enum { BK_ESP_COST_SQ = 0, BK_ESP_COST_EUCLID = 1 } bk_esp_cost;
typedef enum { BK_ESP_SCALE_ROWS = 0, BK_ESP_SCALE_PAPER = 1 } bk_esp_scale;

typedef struct {
    bk_esp_sort sort;       /* hard (inference) or soft (training)            */
    float t;                /* SoftSort temperature, > 0 (soft only)          */
    float tau;              /* slice-mixing inverse temperature, finite, >= 0 */
    float scale;            /* q, k scale; 0 selects 1/sqrt(d)                */
    bk_esp_cost cost;       /* squared (paper) or Euclidean (reference code)  */
    bk_esp_scale out_scale; /* rows sum to 1 (default) or the paper's 1/n     */
    int L;                  /* 0: axis-aligned slices (L = d, Theta = I);
                               > 0: L slices from theta, or random unit
                               directions from seed when theta is NULL       */
    const float *theta;     /* [L x d] row-major slice matrix or NULL. Rows
                               are used as given (not normalised).           */
    uint64_t seed;          /* for random slices                              */
} bk_esp_params;

/* hard sort, t = 1e-3, tau = 1, scale = 1/sqrt(d), squared cost, rows, L = d */
BK_API bk_esp_params bk_esp_params_default(void);
/* Number of slices the parameters give for head dim d (0 if invalid). */
BK_API int bk_esp_num_slices(const bk_esp_params *p, int d);
/* Fills theta [L x d] with the slices the operator uses (identity, the
 * caller's, or the seeded random unit directions). */
BK_API bk_status bk_esp_slices(const bk_esp_params *p, int d, float *theta);
/* The paper's annealing: t0 * factor^epoch (factor 0.8 in the paper).
 * "initial soft" = soft with t0; "sharp soft" = soft with the annealed t;
 * "hard" = sort = BK_ESP_HARD. */
BK_API float bk_esp_anneal(float t0, float factor, int epoch);

typedef struct {
    float row_err;  /* max_i |n rowsum_i(G) - 1| (0 for hard sort)              */
    float col_err;  /* max_j |m colsum_j(G) - 1|: soft plans are only
                       row-stochastic per slice, so this measures the gap     */
} bk_esp_diag;

typedef struct {
    bk_tensor attn;     /* [B,H,Nq,Nk] dense attention A (small N: it is formed
                           only when asked for)                               */
    float *sigma;       /* [B*H*L] slice weights                              */
    float *D;           /* [B*H*L] slice costs                                */
    bk_esp_diag *diag;  /* [B*H]                                              */
} bk_esp_extras;

BK_API size_t bk_esp_workspace_size(const bk_attn_desc *desc, const bk_esp_params *p);
BK_API size_t bk_esp_tape_size(const bk_attn_desc *desc, const bk_esp_params *p);
BK_API bk_status bk_esp_forward(const bk_attn_desc *desc, const bk_esp_params *p,
                                const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                                const bk_tensor *out, void *tape, const bk_esp_extras *extras,
                                void *ws, size_t ws_size);
/* dq, dk, dv overwritten; dtheta [L x d] (nullable) receives the gradient
 * w.r.t. the slices summed over all problems (zero under hard sort). tape
 * from the forward, or NULL to recompute it. */
BK_API bk_status bk_esp_backward(const bk_attn_desc *desc, const bk_esp_params *p,
                                 const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                                 const bk_tensor *dout, const void *tape, const bk_tensor *dq,
                                 const bk_tensor *dk, const bk_tensor *dv, float *dtheta,
                                 void *ws, size_t ws_size);

/* ------------------------------------------------------------------------ */
/* LOT attention (LOTFormer; docs/ALGORITHMS.md section 5)                   */
/* ------------------------------------------------------------------------ */
/* Per problem (n = Lq queries, m = Lk keys) and head h, with r pivots Z_h
 * (r x d) and pivot masses p0 = softmax(theta_h / temp):
 *   Gamma1 = Sinkhorn(s Q Z^T / eps; marginals 1/n, p0)      (n x r)
 *   Gamma2 = Sinkhorn(s Z K^T / eps; marginals p0, 1/m)      (r x m)
 * each T log-domain half-steps, row first (the same engine as Sinkhorn
 * attention), and A = n Gamma1 diag(1/p0) Gamma2 (rows sum to 1 for odd T,
 * columns to n/m for even T, doubly stochastic at convergence; rank <= r).
 * O = A V is computed as n Gamma1 (diag(1/p0) (Gamma2 V)): O((n + m) r (d +
 * dv) + T (n + m) r) time and O((n + m) r) memory; no n x m matrix (unless
 * the attention is exported). Padding: padded queries and keys get zero mass
 * (the problem runs on the valid prefix), padded rows are zero. r may exceed
 * n. The paper omits the factor n (digest 1.5); the reference LRA variant's
 * 1/r^2 glue and +1e6 key masks are bugs and are not reproduced. */
typedef struct {
    int r;               /* pivots, >= 1                                    */
    const float *Z;      /* [H, r, d] pivot locations (shared over batch)   */
    const float *theta;  /* [H, r] pivot-mass logits                        */
    float temp;          /* > 0: p0 = softmax(theta / temp)                 */
    int iters;           /* T >= 1 half-steps per inner problem             */
    float eps;           /* > 0                                             */
    float scale;         /* s; 0 selects 1/sqrt(d)                          */
    float tol;           /* >= 0; > 0: per-problem early stop of each inner
                            problem (as bk_sinkhorn_params.tol)             */
} bk_lot_params;

typedef struct {
    int32_t iters1, iters2; /* half-steps run by the two inner problems     */
    float row_err, col_err; /* max |rowsum(A) - 1|, max |colsum(A) m/n - 1|  */
} bk_lot_diag;

typedef struct {
    bk_tensor attn;      /* [B,H,Nq,Nk] dense A (small problems only)        */
    bk_lot_diag *diag;   /* [B*H]                                            */
} bk_lot_extras;

/* r = 1, temp = 1, T = 5, eps = 1, scale = 1/sqrt(d); Z, theta to be set */
BK_API bk_lot_params bk_lot_params_default(void);
BK_API size_t bk_lot_workspace_size(const bk_attn_desc *desc, const bk_lot_params *p);
BK_API size_t bk_lot_tape_size(const bk_attn_desc *desc, const bk_lot_params *p);
BK_API bk_status bk_lot_forward(const bk_attn_desc *desc, const bk_lot_params *p, const bk_tensor *q,
                                const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                                const bk_lot_extras *extras, void *ws, size_t ws_size);
/* Exact VJP of the T-step forward (replayed from the tape's potentials).
 * dq, dk, dv overwritten; dZ [H, r, d] and dtheta [H, r] (nullable) receive
 * the gradients summed over the batch. tape NULL recomputes the forward. */
BK_API bk_status bk_lot_backward(const bk_attn_desc *desc, const bk_lot_params *p, const bk_tensor *q,
                                 const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout, const void *tape,
                                 const bk_tensor *dq, const bk_tensor *dk, const bk_tensor *dv, float *dZ,
                                 float *dtheta, void *ws, size_t ws_size);

/* ------------------------------------------------------------------------ */
/* OTK embedding (Mialon et al. 2021; docs/ALGORITHMS.md section 6)          */
/* ------------------------------------------------------------------------ */
/* Pools each set x_b (n_b valid elements of dimension d) onto q trainable
 * references z^h (p supports of dimension k each) through an entropic OT plan,
 * after a Nystrom kernel map psi: R^d -> R^k.
 *
 * Feature map. With anchors W [k, d] (unit rows expected; alpha = 1/sigma^2):
 *   r_i = sqrt(max(|x_i|^2, 1e-4)),  xh_i = x_i / r_i,
 *   b_il = r_i exp(alpha (<w_l, xh_i> - 1)),          (homogeneous Gaussian)
 *   G = exp(alpha (W W^T - 1)) = V diag(e) V^T         (LAPACK, double),
 *   M = V diag(1 / (sqrt(max(e, 0)) + eta)) V^T,      psi_i = M b_i.
 * eta = 1e-2 is the reference code's regularisation; eta = 0 makes <psi(x),
 * psi(x')> reproduce the kernel exactly on the anchors. Without anchors (W =
 * NULL) psi is the identity (k must equal d).
 *
 * Plan, per set b and reference h: K_ij = <psi_i, z_j> (times S_ij when
 * pe_double), then L Sinkhorn iterations on K / eps with marginals 1/n_b
 * (valid elements; padded ones get zero mass) and 1/p, each a row step then
 * a column step from a zero column potential (the reference's u-then-v
 * order); the plan P (n_b x p) ends on a column step: columns sum to 1/p
 * exactly, rows to 1/n_b at convergence.
 *   domain LOG: log-domain half-steps on the shared Sinkhorn engine (any eps);
 *   domain SCALING: u = a / (E v), v = b / (E^T u) with E = exp(K / eps)
 *     computed once (row-max shifted, which leaves the iterates' plan
 *     unchanged); faster, fails with BK_ERR_NUMERIC when E underflows
 *     (small eps): use LOG there.
 * Embedding: out[b, j, h, :] = c * sum_i P_ij S_ij psi_i  (S = 1 without PE),
 *   convention PAPER:     c = sqrt(p / q)  (Phi = sqrt(p) P^T psi, heads
 *                         scaled by 1/sqrt(q));
 *   convention REFERENCE: c = p (the reference code's scaling: T = p P has
 *                         unit column sums, no 1/sqrt(q)).
 * Output layout [B, p, q*k] (support-major, then reference, then feature), as
 * the reference code; flatten it to B x (p q k) for a classifier.
 *
 * Positional encoding (pe): S_ij = exp(-((u_i - v_j) / sigma_pos)^2),
 *   PE_1D: PAPER u_i = i / n_b, v_j = j / p (i, j 1-based, valid length);
 *          REFERENCE u_i = i / n, v_j = j / p (0-based, padded length n).
 *   PE_2D: elements form a grid_h x grid_w grid (row-major, n = grid_h *
 *          grid_w, no padding), supports a s x s grid (p = s^2); S is the
 *          product of the per-axis Gaussians of 1-based positions, each
 *          divided by its axis length.
 * The paper multiplies the plan by S; pe_double = 1 also multiplies K by S
 * before the exponential, as the reference code does.
 *
 * Backward: the exact gradient of the L-iteration forward with respect to x,
 * z and W, replayed from the tape (psi and the potentials of every half-step:
 * memory independent of L beyond O(L (n + p)) per problem). The gradient
 * through M = h(G), h(e) = 1/(sqrt(max(e,0)) + eta), is the Daleckii-Krein
 * formula of h itself (isqrt_grad EXACT) or the reference code's formula
 * F_ab = 1/((t_a + t_b) t_a t_b), t = sqrt(e) + eta (REFERENCE), which is exact
 * only at eta = 0. Anchors are not renormalised inside: the caller renormalises
 * after an update, as the reference does.
 *
 * Errors: sizes < 1, n_b outside [1, n] (empty sets are refused), eps, sigma
 * <= 0, eta < 0, L < 1, k != d without anchors, grid or p inconsistent with
 * PE_2D, non-finite inputs. Accuracy: outputs 1e-5 and gradients 1e-4
 * relative to the largest entry against a double reference, for |K|/eps <= 20. */
typedef enum { BK_OTK_LOG = 0, BK_OTK_SCALING = 1 } bk_otk_domain;
typedef enum { BK_OTK_PAPER = 0, BK_OTK_REFERENCE = 1 } bk_otk_convention;
typedef enum { BK_OTK_PE_NONE = 0, BK_OTK_PE_1D = 1, BK_OTK_PE_2D = 2 } bk_otk_pe;
typedef enum { BK_OTK_ISQRT_EXACT = 0, BK_OTK_ISQRT_REFERENCE = 1 } bk_otk_isqrt_grad;

typedef struct {
    int B, n, d;           /* sets: x viewed as [B, 1, n, d] (stride_h unused) */
    int q, p, k;           /* references z [q, p, k] (dense)                  */
    const int32_t *len;    /* [B] valid elements per set in [1, n]; NULL = n  */
} bk_otk_desc;

typedef struct {
    const float *W;        /* [k, d] anchors (dense); NULL = identity map     */
    float sigma;           /* > 0 kernel bandwidth, alpha = 1 / sigma^2        */
    float eta;             /* >= 0 inverse square root regulariser            */
    float eps;             /* > 0 entropic temperature                        */
    int iters;             /* L >= 1 Sinkhorn iterations (u then v)           */
    bk_otk_domain domain;
    bk_otk_convention convention;
    bk_otk_pe pe;
    float sigma_pos;       /* > 0 with PE                                     */
    int pe_double;         /* 1: S also multiplies K (reference code)         */
    int grid_h, grid_w;    /* PE_2D input grid                                */
    bk_otk_isqrt_grad isqrt_grad;
} bk_otk_params;

typedef struct {
    float row_err;         /* max_i |n_b * rowsum_i(P) - 1|                   */
    float col_err;         /* max_j |p * colsum_j(P) - 1| (0 up to rounding)  */
} bk_otk_diag;

typedef struct {
    float *plan;           /* [B, q, n, p] the pooling weights c P (x) S (rows
                              of padded elements zero); NULL = not wanted      */
    bk_otk_diag *diag;     /* [B*q], NULL = not wanted                        */
} bk_otk_extras;

/* eps = 0.5, L = 10, sigma = 0.5, eta = 1e-2, LOG, PAPER, no PE; W = NULL */
BK_API bk_otk_params bk_otk_params_default(void);
BK_API size_t bk_otk_workspace_size(const bk_otk_desc *desc, const bk_otk_params *p);
BK_API size_t bk_otk_tape_size(const bk_otk_desc *desc, const bk_otk_params *p);
/* psi for every valid element: psi [B, 1, n, k] (padded rows zero). */
BK_API bk_status bk_otk_features(const bk_otk_desc *desc, const bk_otk_params *p, const bk_tensor *x,
                                 const bk_tensor *psi);
/* x [B,1,n,d] view, z [q,p,k] dense, out [B,1,p,q*k] view (row stride
 * stride_n >= q*k). tape (nullable) receives what the backward needs. */
BK_API bk_status bk_otk_forward(const bk_otk_desc *desc, const bk_otk_params *p, const bk_tensor *x,
                                const float *z, const bk_tensor *out, void *tape, const bk_otk_extras *extras,
                                void *ws, size_t ws_size);
/* dout [B,1,p,q*k]; dx [B,1,n,d] overwritten (padded rows zero), dz [q,p,k]
 * and dW [k,d] overwritten with sums over the batch; any of them may be
 * NULL (dW needs anchors). tape NULL recomputes the forward. */
BK_API bk_status bk_otk_backward(const bk_otk_desc *desc, const bk_otk_params *p, const bk_tensor *x,
                                 const float *z, const bk_tensor *dout, const void *tape, const bk_tensor *dx,
                                 float *dz, float *dW, void *ws, size_t ws_size);

/* ---- unsupervised learning of anchors and references (OTK section 5) ----
 * Spherical K-means (the reference's): rows normalised (zero rows ignored),
 * K initial centres by k-means++ seeding on the distance 1 - cos (init
 * PLUSPLUS, default) or drawn uniformly without replacement as the reference
 * code does (init RANDOM), from a seeded generator, assignment by maximum
 * cosine, centre = normalised mean, an empty cluster takes the worst-fitting
 * point; stops after `iters` iterations or when the mean similarity changes by
 * less than tol relatively. Results are reproducible for a seed and do not
 * depend on the thread count. */
typedef enum { BK_KMEANS_PLUSPLUS = 0, BK_KMEANS_RANDOM = 1 } bk_kmeans_init;

typedef struct {
    int iters;             /* >= 1 (100)                                      */
    float tol;             /* >= 0 (1e-6)                                     */
    uint64_t seed;
    int64_t max_samples;   /* fit_anchors/fit_refs: elements sampled (0 = all) */
    bk_kmeans_init init;
} bk_kmeans_params;

typedef struct {
    int iters;             /* iterations run                                  */
    int converged;         /* 1 when the tolerance was met                    */
    double objective;      /* mean cosine (K-means) or mean OT similarity     */
} bk_kmeans_report;

BK_API bk_kmeans_params bk_kmeans_params_default(void);
/* x [N, dim] row-major; centres [K, dim] unit rows. K > (non-zero rows) is
 * BK_ERR_PARAM. */
BK_API bk_status bk_spherical_kmeans(const float *x, int64_t N, int dim, int K, const bk_kmeans_params *kp,
                                     float *centres, bk_kmeans_report *rep);
/* Anchors W [k, d] by spherical K-means on (up to max_samples, uniformly
 * sampled) valid elements of x [B,1,n,d]; desc->k is the number of anchors. */
BK_API bk_status bk_otk_fit_anchors(const bk_otk_desc *desc, const bk_tensor *x, const bk_kmeans_params *kp,
                                    float *W, bk_kmeans_report *rep);
/* References z [q, p, k] on psi features (p->W, sigma, eta; identity without
 * anchors), normalised. q = 1: spherical K-means of all features (p
 * centres). q > 1: Wasserstein K-means over sets: z^h starts as the first p
 * features of q distinct sets (drawn among sets with n_b >= p), each set goes
 * to the reference of largest OT similarity sum_ij P_ij <psi_i, z_j> (p->eps,
 * p->iters, LOG), and z^h becomes the spherical K-means of the features of
 * its sets (an empty reference takes the worst-fitting set); kp->iters outer
 * iterations at most. barycenter > 0 adds that many damped barycentric steps
 * z <- normalise(z/2 + mean_b (p P^T psi_b)/2) after each K-means. */
BK_API bk_status bk_otk_fit_refs(const bk_otk_desc *desc, const bk_otk_params *p, const bk_tensor *x,
                                 const bk_kmeans_params *kp, int barycenter, float *z, bk_kmeans_report *rep);

/* ------------------------------------------------------------------------ */
/* ASAP: a trained Sinkhorn layer compiled into a loop-free operator         */
/* (Tran, Milkert, Hyde 2026; docs/ALGORITHMS.md section 7)                   */
/* ------------------------------------------------------------------------ */
/* Problem (b, h) with valid Lq queries and Lk keys, s = scale (> 0; 0 selects
 * 1/sqrt(d)), logits Z_ij = (s / eps) q_i . k_j, marginals a = 1/Lq, b = 1/Lk.
 *
 * Teacher: Sinkhorn attention with S half-steps (bk_sinkhorn_forward, same
 * eps and scale). Its closure-ready source dual, in logit units, is the row
 * potential f in force after half-step S - 1, i.e. the one the teacher's last
 * column step acts on (even S: f of step S - 1, column-ending teacher; odd S
 * >= 3: f of step S - 2, row-ending teacher; not the f of the final row step).
 * S = 1 (softmax) cannot be compiled.
 * Fit target in cost units (cost C_ij = s |q_i - k_j|^2 / 2):
 *     y_i = eps f_i + rho_i - mean over valid i,     rho_i = s |q_i|^2 / 2.
 *
 * Sliced potentials X [Lq x L]: for each unit direction theta_l of the slice
 * bank, a_i = sqrt(s) theta_l . q_i and b_j = sqrt(s) theta_l . k_j; the exact
 * 1-D Kantorovich potential of the uniform measures on {a_i} and {b_j} for the
 * cost (a - b)^2 / 2 (both sorted; with r-th smallest a_(r)):
 *     phi_0 = 0,  phi_r = phi_{r-1} + b_(sigma(r-1)) (a_(r) - a_(r-1)),
 *     f_(r) = a_(r)^2 / 2 - phi_r,   sigma(r) = floor(((r+1) Lk - 1) / Lq)
 * (the last key the monotone plan sends query rank r to; sigma(r) = r when
 * Lq = Lk), in double, returned to token order and centred over valid rows.
 *
 * Online operator, with predicted dual fhat = X omega (cost units) and
 * u_i = (fhat_i - rho_i) / eps (logit units), c-transforms as LSE half-steps:
 *     T_K(u)_j = log b - LSE_i (Z_ij + u_i),   T_Q(g)_i = log a - LSE_j (Z_ij + g_j)
 *   ASAP-0 (BK_ASAP_ZERO):      g0 = T_K(u),  P = exp(Z + u + g0)      (columns exact)
 *   row-ending (BK_ASAP_ROW):   f1 = T_Q(g0), P = exp(Z + f1 + g0)     (rows exact)
 *   column-ending (BK_ASAP_COLUMN): g1 = T_K(f1), P = exp(Z + f1 + g1) (columns exact)
 * BK_ASAP_AUTO picks the teacher's ending (even S: column, odd S: row).
 * A = Lq P, O = A V, as Sinkhorn attention (columns of A sum to Lq/Lk when
 * they are exact). With the teacher's exact dual: for even S, ASAP-0
 * reproduces the teacher and the column-ending form (AUTO) equals Sinkhorn
 * with S + 2 half-steps (the paper's finite-correction bias); for odd S, the
 * row-ending form (AUTO) reproduces the teacher and ASAP-0 gives S - 1.
 * Padding: padded keys get zero mass; padded query rows have zero features,
 * zero output, and are outside the centring, the fit and the marginals. The
 * half-steps are the shared LSE engine's (on the transposed scores, starting
 * from u); cost O(Lq Lk (d + dv) + L (Lq + Lk) (d + log N) + 2 Lq Lk exps).
 *
 * Calibration (offline): bk_asap_calib_add streams problems (Q, K) through
 * the teacher and accumulates, in double, G = sum X^T X, c = sum X^T y and
 * sum y^2 (constant memory; per-problem blocks summed in problem order, so
 * the fit does not depend on the thread count). bk_asap_calib_fit solves
 *   LS: omega = (G + lambda I)^-1 c            (Cholesky, LAPACK)
 *   KL: the convex one-sided objective
 *       J(omega) = sum_m [eps sum_j b LSE_i(Z_ij + u_i) - <r_m, X_m omega>] + lambda/2 |omega|^2
 *       (r_m: row sums of the one-sided plan of the teacher's dual) by damped
 *       Newton with Armijo backtracking from the LS solution; analytic gradient
 *       sum X^T (rhat - r) + lambda omega and Hessian
 *       (1/eps) sum [X^T diag(rhat) X - W diag(b) W^T] + lambda I, W = X^T Pi.
 *       KL keeps X, r, rho, Q, K of every problem: O(Lq (L + d + 2) + Lk d)
 *       floats each (LS keeps O(L^2)).
 * The ridge lambda is added to the raw sums (the paper's scaling; 1e-3). */
typedef enum { BK_ASAP_AUTO = 0, BK_ASAP_ZERO = 1, BK_ASAP_COLUMN = 2, BK_ASAP_ROW = 3 } bk_asap_variant;
typedef enum { BK_ASAP_FIT_LS = 0, BK_ASAP_FIT_KL = 1 } bk_asap_fit;

/* A compiled layer: the slice bank and the coefficients, with the teacher's
 * conventions. Owned arrays are released by bk_asap_layer_free. */
typedef struct {
    int d;                 /* head dim of Q and K                            */
    int slices;            /* L >= 1                                          */
    float scale;           /* score scale s > 0 (resolved: never 0)           */
    float eps;             /* temperature > 0                                 */
    int teacher_iters;     /* S >= 2 of the teacher                           */
    float *theta;          /* [L x d] unit rows                               */
    double *omega;         /* [L]                                             */
    /* provenance (recorded in the file; informative) */
    bk_asap_fit fit;
    double lambda;
    uint64_t seed;         /* slice-bank seed (0 with theta_given)            */
    int theta_given;       /* 1: the bank was supplied by the caller          */
    int64_t calib_problems, calib_rows;
} bk_asap_layer;

typedef struct {
    int d;                 /* head dim                                        */
    int slices;            /* L >= 1 (default 32)                             */
    const float *theta;    /* [L x d] supplied bank (rows normalised on use),
                              or NULL: L directions uniform on the sphere
                              from seed (normalised Gaussians, splitmix64)    */
    uint64_t seed;         /* default 1                                       */
    float scale;           /* 0 selects 1/sqrt(d); else > 0                   */
    float eps;             /* default 1                                       */
    int teacher_iters;     /* S >= 2 (default 20)                             */
    double lambda;         /* ridge >= 0 (default 1e-3)                       */
} bk_asap_config;

/* Newton options of the KL fit. */
typedef struct {
    int max_iters;         /* default 50                                      */
    double tol;            /* stop when the Newton decrement^2/2 < tol max(1,|J|)
                              (default 1e-13: omega to ~1e-6 relative)        */
} bk_asap_kl_opts;

typedef struct {
    int64_t problems, rows;/* calibration problems and valid query rows      */
    double ls_rmse;        /* LS fit: sqrt(mean squared residual) (cost units) */
    double ls_r2;          /* 1 - residual / sum of squared targets           */
    double kl_j0, kl_j;    /* KL objective at the LS start and at the end     */
    double kl_grad;        /* final max |grad J|                               */
    int kl_iters;          /* Newton steps taken                              */
    int kl_converged;      /* 1 when the decrement fell below tol             */
} bk_asap_fit_report;

typedef struct bk_asap_calib bk_asap_calib; /* opaque accumulator */

BK_API bk_asap_config bk_asap_config_default(int d);
BK_API bk_asap_kl_opts bk_asap_kl_opts_default(void);
/* keep_kl = 1 keeps what the KL fit needs (else only the LS sums). */
BK_API bk_status bk_asap_calib_create(const bk_asap_config *cfg, int keep_kl, bk_asap_calib **out);
BK_API void bk_asap_calib_free(bk_asap_calib *c);
/* Adds the B*H problems (q [B,H,Nq,d], k [B,H,Nk,d], lengths as in
 * bk_attn_desc; dv is ignored). Problems with Lq = 0 or Lk = 0 are skipped. */
BK_API bk_status bk_asap_calib_add(bk_asap_calib *c, const bk_attn_desc *desc, const bk_tensor *q,
                                   const bk_tensor *k);
/* Fits omega (KL needs keep_kl) and fills *layer (free with
 * bk_asap_layer_free); report nullable. BK_ERR_PARAM when no problem was
 * added, BK_ERR_NUMERIC when the system is singular (lambda = 0). */
BK_API bk_status bk_asap_calib_fit(bk_asap_calib *c, bk_asap_fit fit, const bk_asap_kl_opts *kl,
                                   bk_asap_layer *layer, bk_asap_fit_report *report);
BK_API void bk_asap_layer_free(bk_asap_layer *layer);

/* Compiled-layer file: magic "BKASAP", format version, the layer, and an
 * FNV-1a 64-bit checksum of everything before it. Written atomically (temp
 * file, rename). Loading checks magic, version (BK_ERR_FORMAT naming both
 * versions), size, checksum, unit rows of theta and finite omega. */
#define BK_ASAP_FILE_VERSION 1
BK_API bk_status bk_asap_save(const char *path, const bk_asap_layer *layer);
BK_API bk_status bk_asap_load(const char *path, bk_asap_layer *layer);

/* Fit target y [B*H*Nq] (cost units, centred, 0 on padded rows) of the
 * teacher in cfg (scale, eps, teacher_iters; d from desc). */
BK_API bk_status bk_asap_teacher_dual(const bk_attn_desc *desc, const bk_asap_config *cfg,
                                      const bk_tensor *q, const bk_tensor *k, float *y);
/* Sliced features X [B*H*Nq*L] (row-major per problem; 0 on padded rows). */
BK_API bk_status bk_asap_features(const bk_attn_desc *desc, const bk_asap_layer *layer,
                                  const bk_tensor *q, const bk_tensor *k, float *X);

typedef struct {
    bk_tensor attn;            /* [B,H,Nq,Nk] attention A (padding: zeros)  */
    float *fhat;               /* [B*H*Nq] predicted dual X omega (cost units) */
    bk_sinkhorn_diag *diag;    /* [B*H]: iters = half-steps (1, 2 or 3),
                                  max row / column errors of A               */
} bk_asap_extras;

BK_API size_t bk_asap_workspace_size(const bk_attn_desc *desc, const bk_asap_layer *layer);
/* Forward only (inference: ASAP has no backward here). desc->d must equal
 * layer->d. Threads and determinism as Sinkhorn attention. */
BK_API bk_status bk_asap_forward(const bk_attn_desc *desc, const bk_asap_layer *layer, bk_asap_variant variant,
                                 const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                                 const bk_tensor *out, const bk_asap_extras *extras, void *ws, size_t ws_size);
/* The same closure from a given dual fhat [B*H*Nq] (cost units; padded rows
 * ignored) instead of X omega: the layer supplies scale, eps and, for
 * BK_ASAP_AUTO, the ending (its slices and omega are not used). With the
 * teacher's target (bk_asap_teacher_dual) it reproduces the teacher. */
BK_API bk_status bk_asap_close(const bk_attn_desc *desc, const bk_asap_layer *layer, bk_asap_variant variant,
                               const float *fhat, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                               const bk_tensor *out, const bk_asap_extras *extras, void *ws, size_t ws_size);

/* ---- fidelity of an attention against a reference (e.g. the teacher) ----
 * Per problem over its valid block, then averaged over problems with Lq, Lk
 * >= 1:  out_rmse = sqrt(mean (O - O_ref)^2), out_rms = sqrt(mean O_ref^2),
 * attn_rel_l2 = |A - A_ref|_F / |A_ref|_F, row_err = mean_i |sum_j A_ij - 1|,
 * col_err = mean_j |(Lk/Lq) sum_i A_ij - 1| (the ASAP paper's Delta_row,
 * Delta_col). attn / attn_ref may be NULL (attention metrics then NaN). */
typedef struct {
    double out_rmse, out_rms, attn_rel_l2, row_err, col_err;
    int problems;
} bk_attn_fidelity;
BK_API bk_status bk_attn_compare(const bk_attn_desc *desc, const bk_tensor *out, const bk_tensor *out_ref,
                                 const bk_tensor *attn, const bk_tensor *attn_ref, bk_attn_fidelity *res);

/* ------------------------------------------------------------------------ */
/* Training engine: transformer models (docs/MODEL.md)                      */
/* ------------------------------------------------------------------------ */
/* A pre-LN encoder classifier whose attention normaliser is chosen per model:
 *
 *   embed:  image  NCHW [B,C,H,W] -> patches (p1 p2 c order) -> Linear(P*P*C, D)
 *           tokens int32 [B, max_len] -> table [vocab, D]
 *           points [B, max_points, point_dim] -> Linear -> GELU -> Linear (D)
 *           [+ CLS token prepended] [+ learned positional embedding] [dropout]
 *   block:  x += proj(Attn(LN1(x) Wqkv^T [+ bqkv]))  [dropout]
 *           x += fc2(GELU(fc1(LN2(x))))               [dropout]  (mlp_dim > 0)
 *   head:   [LN] -> pool (CLS | MEAN | MAX over valid tokens | OTK layer)
 *           -> Linear(features, classes)
 *   loss:   cross-entropy with label smoothing ls (PyTorch's definition),
 *           averaged over the batch.
 *
 * Parameters live in one float buffer, gradients in another, each tensor
 * named as a PyTorch state_dict would name it (Linear weights [out, in]);
 * bk_model_param() lists them. Activations, tapes and operator workspaces are
 * planned once for max_batch at creation: a training step allocates nothing.
 * Valid lengths (tokens, points) reach the operators through their marginals:
 * padded tokens are never attended to, never pooled, and get zero gradient.
 *
 * Threads: attention runs over the B*H problems, linears are single GEMMs over
 * all B*N rows (OpenBLAS splits over rows and columns, never the inner
 * dimension), row-wise layers split rows in fixed blocks, and every
 * parameter-gradient reduction over rows runs in row order: losses, gradients
 * and trained weights are bitwise identical for any thread count. */
typedef enum { BK_INPUT_IMAGE = 0, BK_INPUT_TOKENS = 1, BK_INPUT_POINTS = 2 } bk_input_kind;
typedef enum {
    BK_ATTN_SOFTMAX = 0, BK_ATTN_SINKHORN = 1, BK_ATTN_ESP = 2, BK_ATTN_LOT = 3,
    BK_ATTN_ASAP = 4       /* compiled layers (bk_model_set_asap); inference only */
} bk_attn_kind;
typedef enum { BK_POOL_CLS = 0, BK_POOL_MEAN = 1, BK_POOL_MAX = 2, BK_POOL_OTK = 3 } bk_pool_kind;

typedef struct {
    bk_input_kind input;
    int channels, image_h, image_w, patch;  /* image (patch divides both sides) */
    int vocab, max_len;                     /* tokens                          */
    int point_dim, max_points;              /* points                          */
    int dim, depth, heads, head_dim;        /* head_dim 0: dim / heads (heads
                                               must then divide dim)           */
    int mlp_dim;                            /* 0: no MLP sub-block             */
    int cls, pos_embed, final_norm, qkv_bias;  /* 0/1 switches                */
    bk_pool_kind pool;                      /* CLS needs cls = 1               */
    int classes;                            /* >= 2                            */
    float dropout;                          /* [0, 1): embedding, attention
                                               output and MLP output          */
    float ln_eps;                           /* LayerNorm epsilon (1e-5)        */
    bk_attn_kind attn;
    float attn_scale;                       /* 0: 1/sqrt(head_dim)             */
    int sk_iters; float sk_eps;             /* Sinkhorn: S half-steps, eps     */
    int esp_soft; float esp_t, esp_tau; int esp_slices;   /* ESP: soft sort
                                               (training) or hard; SoftSort t,
                                               mixing tau, slices (0: axes)   */
    int lot_r, lot_iters; float lot_eps, lot_temp;        /* LOT: pivots (the
                                               pivots and mass logits are
                                               parameters of each layer)      */
    int otk_refs, otk_supports, otk_iters; float otk_eps; /* OTK pooling     */
} bk_model_config;

/* A ViT-like default: 28x28x1 images, patch 4, dim 64, depth 2, 4 heads,
 * mlp 128, CLS, positional embedding, final LN, CLS pooling, 10 classes,
 * softmax attention, S = 5 / eps = 1, ESP soft t = 1e-3 tau = 1, LOT r = 8
 * T = 5 eps = 1 temp = 1, OTK 1 reference of 4 supports, 10 iterations, eps 0.5. */
BK_API bk_model_config bk_model_config_default(void);
/* One "key=value" assignment (keys are the field names above; enum values by
 * name: input=image|tokens|points, attn=softmax|sinkhorn|esp|lot|asap,
 * pool=cls|mean|max|otk). Unknown keys or malformed values: BK_ERR_PARAM. */
BK_API bk_status bk_model_config_set(bk_model_config *c, const char *key, const char *value);
/* Assignments separated by commas, newlines or spaces ("dim=128,depth=4"). */
BK_API bk_status bk_model_config_parse(bk_model_config *c, const char *text);
/* Writes every field as "key=value\n" lines (NUL-terminated; returns the
 * length needed, excluding the NUL, like snprintf). */
BK_API size_t bk_model_config_format(const bk_model_config *c, char *buf, size_t cap);
/* Full validation with a message naming the problem (patch not dividing the
 * image, heads not dividing dim, CLS pooling without a CLS token, ...). */
BK_API bk_status bk_model_config_check(const bk_model_config *c);

typedef struct bk_model bk_model;

/* One batch. Exactly the input of the model's kind is read:
 *   image:  x [B, channels, image_h, image_w]
 *   tokens: tokens [B, max_len] in [0, vocab), len [B] in [1, max_len] or NULL
 *   points: x [B, max_points, point_dim],  len [B] in [1, max_points] or NULL
 * labels [B] in [0, classes) (needed for the loss and the backward). */
typedef struct {
    int B;
    const float *x;
    const int32_t *tokens;
    const int32_t *len;
    const int32_t *labels;
} bk_batch;

/* Creates a model with parameters initialised from seed (Linear weights and
 * biases U(-1/sqrt(in), 1/sqrt(in)) as PyTorch; LN 1/0; CLS, positions and
 * token table N(0, 0.02^2); LOT pivots N(0,1), mass logits 0; OTK references
 * N(0, 1/dim)) and its activations planned for batches of up to max_batch.
 * Everything is allocated here, once (bk_model_memory says how much); a model
 * needing more than the machine's physical memory is refused (BK_ERR_NOMEM,
 * with both figures) rather than left to the kernel's OOM killer. */
BK_API bk_status bk_model_create(const bk_model_config *c, uint64_t seed, int max_batch, bk_model **out);
/* Without allocating: the trainable floats (num_params, nullable) and the
 * heap bytes bk_model_create would allocate (bytes, nullable): parameters,
 * gradients, activations, tapes and the operator workspace at the current
 * thread count. Errors as bk_model_create (a bad config, max_batch < 1,
 * sizes beyond 2^60 bytes: BK_ERR_SHAPE). */
BK_API bk_status bk_model_memory(const bk_model_config *c, int max_batch, int64_t *num_params, size_t *bytes);
BK_API void bk_model_free(bk_model *m);
BK_API const bk_model_config *bk_model_get_config(const bk_model *m);
/* Total trainable floats, and the named tensors: i in [0, count). */
BK_API int64_t bk_model_num_params(const bk_model *m);
BK_API int bk_model_param_count(const bk_model *m);
typedef struct {
    const char *name;      /* e.g. "blocks.0.attn.qkv.weight"                 */
    int ndim;
    int64_t shape[4];
    int64_t offset, count; /* in floats, into the parameter/gradient buffers  */
    int decay;             /* 1: weight decay applies (Linear weights, token
                              table); 0: biases, norms, CLS, positions, LOT
                              pivots/masses, OTK references                   */
    float *data, *grad;
} bk_param_info;
BK_API bk_status bk_model_param(const bk_model *m, int i, bk_param_info *info);
BK_API float *bk_model_params(bk_model *m);
BK_API float *bk_model_grads(bk_model *m);

/* Forward. train = 1 applies dropout and keeps what the backward needs;
 * train = 0 is inference. logits [B, classes] (nullable); loss (nullable,
 * needs labels): mean cross-entropy with label smoothing ls in [0, 1).
 * ASAP models refuse train = 1. */
BK_API bk_status bk_model_forward(bk_model *m, const bk_batch *b, int train, float ls, float *logits, double *loss);
/* Backward of the last train = 1 forward: ADDS grad_scale * dloss/dparams
 * to the gradient buffer (grad_scale = B / B_total accumulates micro-batches
 * of one effective batch). */
BK_API bk_status bk_model_backward(bk_model *m, float grad_scale);
BK_API void bk_model_zero_grad(bk_model *m);
/* Attach a compiled ASAP layer to block `layer` (copied; the model's
 * attention must be BK_ATTN_ASAP and every block needs one before use). */
BK_API bk_status bk_model_set_asap(bk_model *m, int layer, const bk_asap_layer *asap);
/* The attention of block `layer` in the last forward: [B, H, N, N] (N =
 * tokens incl. CLS; padded rows/columns zero). Recomputed from the stored
 * activations; attn must hold B*H*N*N floats. */
BK_API bk_status bk_model_attention(bk_model *m, int layer, float *attn);
/* Compiling a trained Sinkhorn model into ASAP (birkhoff asap compile):
 * bk_model_asap_config gives the ASAP configuration whose teacher is this
 * model's Sinkhorn attention (d = head_dim, scale = attn_scale, eps = sk_eps,
 * teacher_iters = sk_iters; slices, seed and lambda at their defaults: set
 * them before bk_asap_calib_create). bk_model_calib_add adds the B*H
 * problems of block `layer` in the last forward (its Q, K and valid lengths)
 * to a calibrator. The compiled model is a copy with attn = asap and
 * bk_model_set_asap on every block; checkpoints carry its layers. */
BK_API bk_asap_config bk_model_asap_config(const bk_model *m);
BK_API bk_status bk_model_calib_add(bk_model *m, int layer, bk_asap_calib *calib);
/* Tokens per sample (incl. CLS), and heads. */
BK_API int bk_model_tokens(const bk_model *m);

/* ---- optimisers and schedules ---- */
typedef enum { BK_OPT_ADAMW = 0, BK_OPT_ADAM = 1, BK_OPT_SGD = 2 } bk_opt_kind;
typedef enum { BK_SCHED_CONSTANT = 0, BK_SCHED_STEP = 1, BK_SCHED_COSINE = 2 } bk_sched_kind;
typedef struct {
    bk_opt_kind kind;
    float lr, beta1, beta2, eps;   /* Adam(W) (PyTorch's formulas)            */
    float weight_decay;            /* AdamW: decoupled; Adam/SGD: L2 added to
                                      the gradient; only tensors with decay=1 */
    float momentum; int nesterov;  /* SGD                                     */
    float clip;                    /* > 0: clip the global L2 gradient norm   */
    bk_sched_kind sched;
    int warmup;                    /* linear warm-up steps from lr/warmup     */
    int64_t total_steps;           /* cosine: decay to lr_min at total_steps  */
    float lr_min;
    float gamma; int milestones[8];/* step: lr *= gamma at each step >= m (0 ends) */
} bk_optim_config;

/* AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0.01, no clip, constant. */
BK_API bk_optim_config bk_optim_config_default(void);
BK_API bk_status bk_optim_config_set(bk_optim_config *c, const char *key, const char *value);
BK_API bk_status bk_optim_config_parse(bk_optim_config *c, const char *text);
BK_API size_t bk_optim_config_format(const bk_optim_config *c, char *buf, size_t cap);
/* Learning rate at (0-based) step under the schedule. */
BK_API float bk_optim_lr(const bk_optim_config *c, int64_t step);

typedef struct bk_optim bk_optim;
BK_API bk_status bk_optim_create(const bk_optim_config *c, const bk_model *m, bk_optim **out);
BK_API void bk_optim_free(bk_optim *o);
BK_API int64_t bk_optim_step_count(const bk_optim *o);
BK_API const bk_optim_config *bk_optim_get_config(const bk_optim *o);
/* Clips (if asked), applies one update from the model's gradients and
 * advances the step. gnorm (nullable) receives the pre-clip global norm.
 * A non-finite gradient norm refuses the update (BK_ERR_NONFINITE). */
BK_API bk_status bk_optim_step(bk_optim *o, bk_model *m, double *gnorm);

/* One training step on an effective batch: zero grads, forward/backward over
 * micro-batches of at most `micro` samples (0: all at once), accumulate, step.
 * loss receives the mean loss of the effective batch. */
BK_API bk_status bk_train_step(bk_model *m, bk_optim *o, const bk_batch *b, int micro, float ls,
                               double *loss, double *gnorm);

/* ---- checkpoints (safetensors) ----
 * Tensors: every parameter by name (float32, little-endian), then, when an
 * optimiser is given, its state as "optim.<slot>.<name>". Metadata (strings):
 * format "birkhoff", model config (bk_model_config_format), optimiser config
 * and step, the model's RNG seed and step counter, a FNV-1a-64 checksum of the
 * data section, and up to `extra` (caller's "key=value\n" lines, nullable).
 * Written to a temporary file and renamed. Loading verifies the header, the
 * offsets, the size and the checksum: a truncated or corrupt file is refused
 * (BK_ERR_FORMAT) and nothing is returned. A resumed model and optimiser
 * continue bit for bit as the uninterrupted run. */
BK_API bk_status bk_checkpoint_save(const char *path, const bk_model *m, const bk_optim *o, const char *extra);
/* Creates the model (max_batch as bk_model_create) and, when o is not NULL
 * and the file holds optimiser state, the optimiser. extra (nullable)
 * receives a malloc'd copy of the caller's metadata (free()). */
BK_API bk_status bk_checkpoint_load(const char *path, int max_batch, bk_model **m, bk_optim **o, char **extra);
/* Reads and verifies a checkpoint as bk_checkpoint_load does (header,
 * offsets, size, checksum, config) and returns its model config only,
 * creating nothing: with bk_model_memory, what loading it would cost. */
BK_API bk_status bk_checkpoint_config(const char *path, bk_model_config *c);

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
/* .npy files (little-endian float32 '<f4' or int32 '<i4', C order)         */
/* ------------------------------------------------------------------------ */
typedef enum { BK_F32 = 0, BK_I32 = 1 } bk_dtype;

typedef struct {
    bk_dtype dtype;
    int      ndim;            /* 0..8 */
    int64_t  shape[8];
    void    *data;            /* malloc'd; release with bk_npy_free */
} bk_npy;

/* Reads a whole .npy file. Rejects bad magic/header, other dtypes, Fortran
 * order, sizes that overflow and truncated data. */
BK_API bk_status bk_npy_read(const char *path, bk_npy *out);
/* Writes atomically (temporary file in the same directory, then rename). */
BK_API bk_status bk_npy_write(const char *path, bk_dtype dtype, int ndim,
                              const int64_t *shape, const void *data);
BK_API void bk_npy_free(bk_npy *a);
/* Elements of an array (the product of its shape; saturates at INT64_MAX). */
BK_API int64_t bk_npy_count(const bk_npy *a);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_H */
