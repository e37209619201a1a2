/* lse_engine.c -- the one log-domain Sinkhorn / LSE engine.
 *
 * Compiled once per instruction set (the Makefile builds it with -mavx2 and
 * with -mavx512*, defining BK_ISA); threads.c (bki_kern) picks the table at
 * run time. All loops are plain C that the compiler vectorises, exp included
 * (vexp.h). A problem is run by a team (one thread, or all threads of a
 * region): rows in fixed blocks, column sums from per-block partial sums
 * added in block order, so the result does not depend on the team's size.
 *
 * Every Sinkhorn-type iteration of the library runs here (softmax, Sinkhorn,
 * unbalanced Sinkhorn through kappa-damped column steps, LOT's inner
 * problems, OTK's log-domain plans, ASAP's c-transforms), except OTK's
 * scaling domain, a multiply-only iteration on a once-exponentiated kernel:
 * src/ops/otk.c, "scaling domain", says why it is a kernel of its own.
 *
 * Algorithm (docs/ALGORITHMS.md has the derivations):
 *
 * Forward. A row step followed by a column step costs ONE pass over C and one
 * exp per entry: the row step computes e_ij = exp(C_ij + g_j - M_i), s_i =
 * sum_j e_ij, f_i = log a_i - M_i - log s_i, and the row-normalised plan
 * P_ij = a_i e_ij / s_i; accumulating its column sums gives the next column
 * step without another exp, since
 *     g'_j = log b_j - LSE_i(C_ij + f_i) = log b_j + g_j - log(sum_i P_ij).
 * A column whose mass sum_i P_ij underflows (< BK_TINY) is recomputed exactly
 * with a max-shifted column LSE (a strided pass over that column only).
 *
 * Backward. Replay of the unrolled half-steps from the stored potentials.
 * A column step t and the row step t-1 before it share the column potential
 * h_{t-1}, so Q^t = R^{t+1} * exp(rl_i + h_{t-1,i} - lb_j) is derived from the
 * previous row softmax R^{t+1} without an exp; each (column, row) pair of
 * adjoint steps is one pass over C with one exp per entry, and the buffer that
 * held A holds R.
 */
#include "internal.h"
#include "vexp.h"
#include "vgelu.h"

#include <math.h>
#include <string.h>

#ifndef BK_ISA
#error "BK_ISA must be defined (avx2 or avx512)"
#endif

#include <immintrin.h> /* built with -mavx2 or -mavx512f (Makefile) */

/* Below this column mass the fused column update falls back to an exact,
 * max-shifted column LSE. Far above the float32 subnormal range, so the
 * accumulated sum is accurate whenever it is used. */
#define BK_TINY 1e-25f

/* ------------------------------------------------------------------------ */
/* small vector kernels                                                      */
/* ------------------------------------------------------------------------ */

/* One vector of RVL lanes (rvec): zero, load, add, its lanes' sum, set1, fma,
 * store, a load of
 * the first r lanes with the others set to fill (tail_load) and a store of
 * the first r lanes (tail_store); the row loops below use them so that a
 * row's last partial vector runs in lanes too. */
#if defined(__AVX512F__)
#define RVL 16
typedef __m512 rvec;
#define RV_ZERO() _mm512_setzero_ps()
#define RV_LOAD(p) _mm512_loadu_ps(p)
#define RV_ADD(a, b) _mm512_add_ps(a, b)
#define RV_HSUM(a) _mm512_reduce_add_ps(a)
#define RV_MAX(a, b) _mm512_max_ps(a, b)
#define RV_HMAX(a) _mm512_reduce_max_ps(a)
#define RV_SET1(x) _mm512_set1_ps(x)
#define RV_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define RV_STORE(p, v) _mm512_storeu_ps(p, v)
static inline rvec tail_load(const float *p, int r, float fill)
{
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), (__mmask16)((1u << r) - 1u), p);
}
static inline void tail_store(float *p, int r, rvec v) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << r) - 1u), v); }
#else
#define RVL 8
typedef __m256 rvec;
#define RV_ZERO() _mm256_setzero_ps()
#define RV_LOAD(p) _mm256_loadu_ps(p)
#define RV_ADD(a, b) _mm256_add_ps(a, b)
#define RV_SET1(x) _mm256_set1_ps(x)
#define RV_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define RV_STORE(p, v) _mm256_storeu_ps(p, v)
#define RV_MAX(a, b) _mm256_max_ps(a, b)
static inline float RV_HMAX(__m256 v)
{
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
static inline float RV_HSUM(__m256 v)
{
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
static inline __m256i tail_mask(int r)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline rvec tail_load(const float *p, int r, float fill)
{
    const __m256i k = tail_mask(r);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, k), _mm256_castsi256_ps(k));
}
static inline void tail_store(float *p, int r, rvec v) { _mm256_maskstore_ps(p, tail_mask(r), v); }
#endif

/* Sums with a fixed lane order, written with intrinsics: GCC ends an
 * `omp simd reduction(+)` by storing the vector and adding its lanes one at a
 * time (a chain of 16 dependent adds on AVX-512), which cost more than the
 * exps of a 32-entry row. vsum adds whole vectors (two accumulators, a masked
 * tail) and then reduces the lanes as a tree; the order is a function of m
 * only. */
static inline float vsum(const float *x, int m)
{
    rvec a0 = RV_ZERO(), a1 = RV_ZERO();
    int j = 0;
    for (; j + 2 * RVL <= m; j += 2 * RVL) {
        a0 = RV_ADD(a0, RV_LOAD(x + j));
        a1 = RV_ADD(a1, RV_LOAD(x + j + RVL));
    }
    if (j + RVL <= m) {
        a0 = RV_ADD(a0, RV_LOAD(x + j));
        j += RVL;
    }
    if (j < m) a1 = RV_ADD(a1, tail_load(x + j, m - j, 0.0f));
    return RV_HSUM(RV_ADD(a0, a1));
}

/* e = exp(c + bias - max) for G rows at once (G = 1, 2 or 4, a constant
 * after inlining; row r: logits c + r ldc, buffer e + r es); mx[r] = the
 * row's max(c + bias), sum[r] = sum(e). The maximum in vector lanes and a
 * tree (an `omp simd reduction(max)` ends in a chain of dependent lane
 * maxima, as the sums do); NaN entries are passed over, as a scalar
 * `x > M ? x : M` would (the max instruction returns its second operand when
 * either is NaN). The sum in vector lanes as the exps are made (a separate
 * summing pass costs a chain of dependent vector adds per row); a partial
 * last vector runs in a padded buffer (-inf pads give exp = 0). Each row's
 * arithmetic is the same whatever G, so the rows of a group get the bits of
 * one row alone; a group interleaves its rows so that one row's horizontal
 * maximum and sum, latency chains, overlap the other rows' loads and exps:
 * the engine's forward 12-20 % faster on thin rows with pairs, 8-10 % more
 * with 4 rows at m <= 64; 4-9 % at m = 256-1024 (docs/PERFORMANCE.md, "Two
 * rows at once"). Groups take rows of at most GROUP_MAX entries (their
 * buffer is on the stack), groups of 4 up to QUAD_MAX. */
#define GROUP_MAX 1024
#define QUAD_MAX 64
/* a group's rows in one stack buffer, a vector apart more than their length:
 * rows 4 KiB apart (m = 1024) made loads wait on the other row's stores
 * (4K aliasing), 8 % slower */
static inline ptrdiff_t group_stride(int m) { return (ptrdiff_t)((m + 15) & ~15) + 16; }
static inline __attribute__((always_inline)) void row_softmax_g(int G, int m, const float *restrict c, ptrdiff_t ldc,
                                                                 const float *restrict bias, float *restrict e,
                                                                 ptrdiff_t es, float *mx, float *sum)
{
    rvec vm[4], acc[4];
    for (int r = 0; r < G; r++) vm[r] = RV_SET1(-INFINITY);
    int j = 0;
    for (; j + RVL <= m; j += RVL) {
        const rvec b = bias ? RV_LOAD(bias + j) : RV_ZERO();
        for (int r = 0; r < G; r++) {
            rvec x = RV_LOAD(c + r * ldc + j);
            if (bias) x = RV_ADD(x, b);
            RV_STORE(e + r * es + j, x);
            vm[r] = RV_MAX(x, vm[r]);
        }
    }
    if (j < m) {
        const rvec b = bias ? tail_load(bias + j, m - j, 0.0f) : RV_ZERO();
        for (int r = 0; r < G; r++) {
            rvec x = tail_load(c + r * ldc + j, m - j, -INFINITY);
            if (bias) x = RV_ADD(x, b);
            tail_store(e + r * es + j, m - j, x);
            vm[r] = RV_MAX(x, vm[r]);
        }
    }
    for (int r = 0; r < G; r++) {
        mx[r] = RV_HMAX(vm[r]);
        acc[r] = RV_ZERO();
    }
    j = 0;
    for (; j + RVL <= m; j += RVL)
        for (int r = 0; r < G; r++) {
            float *er = e + r * es;
            const float M = mx[r];
#pragma omp simd
            for (int l = 0; l < RVL; l++) er[j + l] = bki_expf(er[j + l] - M);
            acc[r] = RV_ADD(acc[r], RV_LOAD(er + j));
        }
    if (j < m)
        for (int r = 0; r < G; r++) {
            _Alignas(64) float t[RVL];
            _Static_assert(sizeof(rvec) == sizeof t, "one vector");
            const rvec in = tail_load(e + r * es + j, m - j, -INFINITY);
            memcpy(t, &in, sizeof t);
            const float M = mx[r];
#pragma omp simd
            for (int l = 0; l < RVL; l++) t[l] = bki_expf(t[l] - M);
            rvec v;
            memcpy(&v, t, sizeof v);
            tail_store(e + r * es + j, m - j, v);
            acc[r] = RV_ADD(acc[r], v);
        }
    for (int r = 0; r < G; r++) sum[r] = RV_HSUM(acc[r]);
}

/* row_softmax_g for one row: returns sum(e), *mx = max(c + bias) */
static float row_softmax(int m, const float *restrict c, const float *restrict bias, float *restrict e, float *mx)
{
    float s;
    row_softmax_g(1, m, c, 0, bias, e, 0, mx, &s);
    return s;
}

static inline float la_at(const bki_sk_problem *pb, int i, float la_u)
{
    return pb->la ? pb->la[i] : la_u;
}
static inline float lb_at(const bki_sk_problem *pb, int j, float lb_u)
{
    return pb->lb ? pb->lb[j] : lb_u;
}

/* Exact column update for column j: log b_j - LSE_i(C_ij + f_i). */
static float col_lse_exact(const bki_sk_problem *pb, int j, const float *f)
{
    float M = -INFINITY;
    for (int i = 0; i < pb->n; i++) {
        float x = pb->C[(ptrdiff_t)i * pb->ldc + j] + f[i];
        M = x > M ? x : M;
    }
    float s = 0.0f;
    for (int i = 0; i < pb->n; i++)
        s += bki_expf(pb->C[(ptrdiff_t)i * pb->ldc + j] + f[i] - M);
    return M + logf(s);
}

/* the column damping in force (1: balanced) */
static inline float kappa_of(const bki_sk_problem *pb)
{
    return pb->kappa > 0.0f && pb->kappa < 1.0f ? pb->kappa : 1.0f;
}

/* ------------------------------------------------------------------------ */
/* the partition of one problem                                             */
/* ------------------------------------------------------------------------ *
 * Rows are cut into nb = ceil(n / rb) blocks of rb = bki_row_block(n) rows
 * (a function of n only). A row pass runs the blocks in any order on any
 * member (claimed at run time: a member's static share first, then the
 * blocks others have not started; internal.h); each block writes its rows
 * and its own partial column sums part[b][0..m) (rows summed in row order).
 * Column sums are then part[0] + part[1] + ... in block order, columns
 * shared over the team. So the arithmetic is the same whether one thread or
 * a team runs the problem.
 * Column work (updates, reductions) is shared by column ranges, claimed
 * too: a column's result never depends on the range it falls in. Every
 * member keeps its own copy of the scalars (errors, flags, step count). */
static size_t vec_floats(int m) { return bki_round_up(sizeof(float) * (size_t)m) / sizeof(float); }

typedef struct {
    int rb, nb;
    size_t mr, nr;      /* padded vector lengths for m and n               */
    float *part;        /* nb x mr partial column sums                     */
    float *colP, *factor, *cerr, *lamc, *lamc2, *wb; /* m each              */
    unsigned char *fb;  /* m fallback flags (mr floats of room)            */
    float *rerr;        /* nb row errors                                   */
    float *rl, *lamr;   /* n each                                          */
    float *e;           /* this member's row buffer (max(n, m))            */
    float *sv, *uv;     /* this member's per-row values of one row block   */
} eng_ws;

/* Sized for any problem of at most n rows: callers size the scratch from the
 * padded shape and run the valid part, and the block count is not monotonic
 * in n (260 rows make 52 blocks of 5, 251 rows 63 blocks of 4); rows per
 * block >= 4 and <= 64 blocks bound it. */
static size_t shared_floats(int n, int m)
{
    const int q = (n + 3) / 4, nb = q < BKI_MAX_BLOCKS ? q : BKI_MAX_BLOCKS;
    return (size_t)(nb + 8) * vec_floats(m) + vec_floats(nb) + 2 * vec_floats(n);
}

/* one member's buffers: a row (max(n, m)) and two values per row of a block
 * (rows per block grow with n, so this too bounds any problem of <= n rows) */
static size_t member_floats(int n, int m)
{
    return vec_floats(m > n ? m : n) + 2 * vec_floats(bki_row_block(n));
}

/* floats of scratch for a problem run by a team of nt: the shared part, then
 * one set of buffers per member */
static size_t ISA(sk_scratch)(int n, int m, int nt)
{
    return shared_floats(n, m) + (size_t)(nt < 1 ? 1 : nt) * member_floats(n, m);
}

static eng_ws carve(const bki_team *tm, int n, int m, float *scr)
{
    eng_ws w;
    w.rb = bki_row_block(n);
    w.nb = bki_nblocks(n, w.rb);
    w.mr = vec_floats(m);
    w.nr = vec_floats(n);
    w.part = scr;
    float *p = scr + (size_t)w.nb * w.mr;
    w.colP = p; p += w.mr;
    w.factor = p; p += w.mr;
    w.cerr = p; p += w.mr;
    w.lamc = p; p += w.mr;
    w.lamc2 = p; p += w.mr;
    w.wb = p; p += w.mr;
    w.fb = (unsigned char *)p; p += w.mr;
    p += w.mr; /* spare */
    w.rerr = p; p += vec_floats(w.nb);
    w.rl = p; p += w.nr;
    w.lamr = p; p += w.nr;
    w.e = scr + shared_floats(n, m) + (size_t)tm->tid * member_floats(n, m);
    w.sv = w.e + vec_floats(m > n ? m : n);
    w.uv = w.sv + vec_floats(w.rb);
    return w;
}

/* Column work is claimed at run time (internal.h, "Blocks claimed at run
 * time") in ranges of whole 64-byte lines, about 8 ranges a member: a
 * column's result never depends on the range it falls in, so the width may
 * follow the team's size. Every member opens the same column loops. */
static bki_claims cols_open(const bki_team *tm, int m)
{
    const int want = 8 * tm->nt, cw = ((m + want - 1) / want + 15) & ~15;
    return bki_ranges_open(tm, m, cw < 16 ? 16 : cw);
}

/* out[j] = sum_b part[b][j] in block order, for columns [j0, j1) */
static void reduce_range(const eng_ws *w, int j0, int j1, float *out)
{
    if (j0 >= j1) return;
    memcpy(out + j0, w->part + j0, sizeof(float) * (size_t)(j1 - j0));
    for (int b = 1; b < w->nb; b++) {
        const float *pb = w->part + (size_t)b * w->mr;
#pragma omp simd
        for (int j = j0; j < j1; j++) out[j] += pb[j];
    }
}

/* out[j] = sum_b part[b][j] in block order, the columns shared over the
 * team (no sync) */
static void reduce_cols(const bki_team *tm, const eng_ws *w, int m, float *out)
{
    bki_claims cc = cols_open(tm, m);
    for (int j0, j1; bki_ranges_next_int(&cc, &j0, &j1);) reduce_range(w, j0, j1, out);
}

static float max_of(int n, const float *x)
{
    float mx = 0.0f;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

/* ------------------------------------------------------------------------ */
/* forward                                                                   */
/* ------------------------------------------------------------------------ */

/* Row step from column potential g (NULL = 0) over the row blocks (claimed
 * at run time): writes f; if colsums, the block's partial column sums of
 * the row-normalised plan P = a_i e / s; if A != NULL writes
 * A = P / a_i = e / s and, if check, the block's max row-sum error of A
 * (else 0). Ends with a sync. */
static void row_pass(const bki_team *tm, const bki_sk_problem *pb, const eng_ws *w, const float *g, float *f,
                     int colsums, float *A, ptrdiff_t lda, int check)
{
    const int n = pb->n, m = pb->m;
    const float la_u = -logf((float)n), a_u = expf(la_u);
    /* blocks claimed at run time: a block writes its rows, part[b], rerr[b];
     * e and sv are this member's, used within a block */
    bki_claims cl = bki_claims_open(tm, w->nb);
    for (int64_t bl; bki_claims_next(&cl, &bl);) {
        const int b = (int)bl;
        float *colP = w->part + (size_t)b * w->mr, *e = w->e, *sv = w->sv;
        if (colsums) memset(colP, 0, sizeof(float) * (size_t)m);
        float worst = 0.0f;
        const int i0 = b * w->rb, i1 = (b + 1) * w->rb < n ? (b + 1) * w->rb : n;
        /* row i's results from e = exp(C_i + g - M), s = sum(e) */
#define ROW_DONE(i, e, M, s)                                                                                      \
    do {                                                                                                            \
        const float lai = la_at(pb, i, la_u), inv = 1.0f / (s);                                                     \
        f[i] = lai - (M); /* - log s, for the whole block below */                                                  \
        sv[(i) - i0] = (s);                                                                                         \
        if (colsums) {                                                                                              \
            const float wt = (pb->la ? expf(lai) : a_u) * inv;                                                      \
            _Pragma("omp simd") for (int j = 0; j < m; j++) colP[j] += wt * (e)[j];                                 \
        }                                                                                                           \
        if (A) {                                                                                                    \
            float *Ai = A + (ptrdiff_t)(i) * lda;                                                                   \
            _Pragma("omp simd") for (int j = 0; j < m; j++) Ai[j] = (e)[j] * inv;                                   \
            if (check) {                                                                                            \
                const float err = fabsf(vsum(Ai, m) - 1.0f);                                                        \
                worst = err > worst ? err : worst;                                                                  \
            }                                                                                                       \
        }                                                                                                           \
    } while (0)
        int i = i0;
        /* rows in groups of 4 (m <= QUAD_MAX) or 2 (row_softmax_g says why),
         * their buffers on the stack; a block's last odd row alone */
        _Alignas(64) float eg[2 * (GROUP_MAX + 16)];
        const ptrdiff_t es = group_stride(m);
        if (m <= QUAD_MAX)
            for (; i + 3 < i1; i += 4) {
                float M[4], sm[4];
                row_softmax_g(4, m, pb->C + (ptrdiff_t)i * pb->ldc, pb->ldc, g, eg, es, M, sm);
                for (int r = 0; r < 4; r++) ROW_DONE(i + r, eg + r * es, M[r], sm[r]);
            }
        if (m <= GROUP_MAX)
            for (; i + 1 < i1; i += 2) {
                float M[2], sm[2];
                row_softmax_g(2, m, pb->C + (ptrdiff_t)i * pb->ldc, pb->ldc, g, eg, es, M, sm);
                for (int r = 0; r < 2; r++) ROW_DONE(i + r, eg + r * es, M[r], sm[r]);
            }
        for (; i < i1; i++) {
            float M;
            const float s = row_softmax(m, pb->C + (ptrdiff_t)i * pb->ldc, g, e, &M);
            ROW_DONE(i, e, M, s);
        }
#undef ROW_DONE
        /* the block's logs in vector lanes: a libm call per row cost as much
         * as the exps of a 32-entry row */
#pragma omp simd
        for (int r = i0; r < i1; r++) f[r] -= bki_logf(sv[r - i0]);
        w->rerr[b] = worst;
    }
    bki_team_sync(tm);
}

/* Column step after a row step, on column ranges claimed at run time:
 * colP = the reduced column sums; cerr[j] = the relative column error of
 * the row-normalised plan; if gnew: gnew_j = log b_j + gold_j - log colP_j
 * (exact fallback for tiny columns, flagged in fb[j]). Ends with a sync. */
static void col_update(const bki_team *tm, const bki_sk_problem *pb, const eng_ws *w, const float *f,
                       const float *gold, float *gnew)
{
    const int m = pb->m;
    const float lb_u = -logf((float)m), kap = kappa_of(pb);
    /* a range's column sums, then its updates (by the member that summed them) */
    bki_claims cc = cols_open(tm, m);
    for (int j0, j1; bki_ranges_next_int(&cc, &j0, &j1);) {
        reduce_range(w, j0, j1, w->colP);
        for (int j = j0; j < j1; j++) {
            const float cP = w->colP[j], lbj = lb_at(pb, j, lb_u);
            w->cerr[j] = fabsf(cP / expf(lbj) - 1.0f);
            if (gnew) {
                if (cP > BK_TINY) {
                    gnew[j] = lbj + (gold ? gold[j] : 0.0f) - logf(cP);
                    w->fb[j] = 0;
                } else {
                    gnew[j] = lbj - col_lse_exact(pb, j, f);
                    w->fb[j] = 1;
                }
                if (kap != 1.0f) gnew[j] *= kap;
            }
        }
    }
    bki_team_sync(tm);
}

/* After an even final step: A (= P^{t}/a_i from the last row pass, under
 * column potential gold) gets the column factor exp(g_j - gold_j), which is
 * b_j / colP_j for a balanced step; exact recomputation for fallback columns
 * (fb). If check, returns row and column errors of the final A (else 0).
 * Ends with a sync. */
static void scale_columns(const bki_team *tm, const bki_sk_problem *pb, const eng_ws *w, const float *f,
                          const float *gold, const float *g, float *A, ptrdiff_t lda, float *rerr, float *cerr,
                          int check)
{
    const int n = pb->n, m = pb->m;
    const float la_u = -logf((float)n), lb_u = -logf((float)m), a_u = expf(la_u);
    int nfb = 0;
    bki_claims cc = cols_open(tm, m);
    for (int j0, j1; bki_ranges_next_int(&cc, &j0, &j1);) {
        if (kappa_of(pb) == 1.0f)
            for (int j = j0; j < j1; j++)
                w->factor[j] = w->fb[j] ? 0.0f : expf(lb_at(pb, j, lb_u)) / w->colP[j];
        else
            for (int j = j0; j < j1; j++)
                w->factor[j] = w->fb[j] ? 0.0f : expf(g[j] - (gold ? gold[j] : 0.0f));
    }
    for (int j = 0; j < m; j++) nfb += w->fb[j]; /* fb is complete: set before the last sync */
    bki_team_sync(tm);
    const float *factor = w->factor;
    /* blocks claimed at run time: a block writes its rows, part[b], rerr[b] */
    bki_claims cl = bki_claims_open(tm, w->nb);
    for (int64_t bl; bki_claims_next(&cl, &bl);) {
        const int b = (int)bl;
        float *colsum = w->part + (size_t)b * w->mr;
        if (check) memset(colsum, 0, sizeof(float) * (size_t)m);
        float worst = 0.0f;
        const int i1 = (b + 1) * w->rb < n ? (b + 1) * w->rb : n;
        for (int i = b * w->rb; i < i1; i++) {
            float *Ai = A + (ptrdiff_t)i * lda;
            float lai = la_at(pb, i, la_u), ai = pb->la ? expf(lai) : a_u;
            if (nfb) {
                for (int j = 0; j < m; j++)
                    if (w->fb[j]) Ai[j] = bki_expf(pb->C[(ptrdiff_t)i * pb->ldc + j] + f[i] + g[j] - lai);
                    else Ai[j] *= factor[j];
            } else {
#pragma omp simd
                for (int j = 0; j < m; j++) Ai[j] *= factor[j];
            }
            if (!check) continue;
#pragma omp simd
            for (int j = 0; j < m; j++) colsum[j] += ai * Ai[j];
            float err = fabsf(vsum(Ai, m) - 1.0f);
            worst = err > worst ? err : worst;
        }
        w->rerr[b] = worst;
    }
    bki_team_sync(tm);
    if (!check) {
        *rerr = *cerr = 0.0f;
        return;
    }
    cc = cols_open(tm, m);
    for (int j0, j1; bki_ranges_next_int(&cc, &j0, &j1);) {
        reduce_range(w, j0, j1, w->colP);
        for (int j = j0; j < j1; j++) w->cerr[j] = fabsf(w->colP[j] / expf(lb_at(pb, j, lb_u)) - 1.0f);
    }
    bki_team_sync(tm);
    *rerr = max_of(w->nb, w->rerr);
    *cerr = max_of(m, w->cerr);
}

static void ISA(sk_forward)(const bki_team *tm, const bki_sk_problem *pb, bki_sk_result *res, float *scratch)
{
    const int n = pb->n, m = pb->m, S = pb->S;
    const eng_ws w = carve(tm, n, m, scratch);
    const float *g = pb->g0; /* column potential in force (NULL = 0) */
    float rerr = 0.0f, cerr = 0.0f;
    res->iters = 0;
    res->f = res->g = NULL;
    for (int t = 1; t <= S; t += 2) {
        float *f = res->hist + bki_hist_off(n, m, t);
        int writeA = (t >= S - 1) || pb->tol > 0.0f;
        /* (quiet: the final odd step's column sums only feed col_err) */
        row_pass(tm, pb, &w, g, f, !(pb->quiet && t == S), writeA ? res->A : NULL, res->lda, !pb->quiet);
        rerr = max_of(w.nb, w.rerr);
        res->f = f;
        res->iters = t;
        if (t == S) { /* odd final step: rows exact; column error from colP */
            if (!pb->quiet) {
                col_update(tm, pb, &w, f, g, NULL);
                cerr = max_of(m, w.cerr);
            }
            break;
        }
        float *gn = res->hist + bki_hist_off(n, m, t + 1);
        const float *g_prev = g;
        col_update(tm, pb, &w, f, g, gn);
        const float cP = max_of(m, w.cerr);
        if (pb->tol > 0.0f && cP < pb->tol) { /* converged: stop on the row step */
            cerr = cP;
            break;
        }
        g = res->g = gn;
        res->iters = t + 1;
        if (t + 1 == S) /* even final step: columns exact */
            scale_columns(tm, pb, &w, f, g_prev, gn, res->A, res->lda, &rerr, &cerr, !pb->quiet);
    }
    res->row_err = rerr;
    res->col_err = cerr;
}

/* Recomputes the forward's A from its potentials, with the same arithmetic
 * as the forward's last pass (so bitwise the same A). */
static void ISA(sk_attention)(const bki_team *tm, const bki_sk_problem *pb, int iters, const float *hist, float *A,
                              ptrdiff_t lda, float *scratch)
{
    const int n = pb->n, m = pb->m;
    const eng_ws w = carve(tm, n, m, scratch);
    float *fdum = w.rl; /* f is recomputed into a throw-away buffer: the tape has it already */
    if (iters % 2 == 1) {
        const float *g = iters > 1 ? hist + bki_hist_off(n, m, iters - 1) : pb->g0;
        row_pass(tm, pb, &w, g, fdum, 0, A, lda, 0);
    } else {
        const float *gold = iters > 2 ? hist + bki_hist_off(n, m, iters - 2) : pb->g0;
        const float *f = hist + bki_hist_off(n, m, iters - 1);
        const float *g = hist + bki_hist_off(n, m, iters);
        row_pass(tm, pb, &w, gold, fdum, 1, A, lda, 0);
        /* the same column sums and fallback flags as the forward */
        bki_claims cc = cols_open(tm, m);
        for (int j0, j1; bki_ranges_next_int(&cc, &j0, &j1);) {
            reduce_range(&w, j0, j1, w.colP);
            for (int j = j0; j < j1; j++) w.fb[j] = w.colP[j] > BK_TINY ? 0 : 1;
        }
        bki_team_sync(tm);
        float rerr, cerr;
        scale_columns(tm, pb, &w, f, gold, g, A, lda, &rerr, &cerr, 0);
    }
}

/* ------------------------------------------------------------------------ */
/* backward (unrolled VJP, replayed)                                         */
/* The backward's column step t on one row (balanced masses): Q_j = R_j u
 * wb_j, G_j -= lamc_j Q_j; returns sum_j lamc_j Q_j, summed in vector lanes
 * (row_softmax_g says why). e: a row of scratch. */
static inline __attribute__((always_inline)) float bwd_col_row(int m, const float *restrict Ri, float *restrict Gi,
                                                               float u, const float *restrict wb,
                                                               const float *restrict lamc, float *restrict e)
{
    rvec va = RV_ZERO();
    int j = 0;
    for (; j + RVL <= m; j += RVL) {
#pragma omp simd
        for (int l = j; l < j + RVL; l++) {
            float q = Ri[l] * u * wb[l];
            Gi[l] -= lamc[l] * q;
            e[l] = q * lamc[l];
        }
        va = RV_ADD(va, RV_LOAD(e + j));
    }
    if (j < m) {
#pragma omp simd
        for (int l = j; l < m; l++) {
            float q = Ri[l] * u * wb[l];
            Gi[l] -= lamc[l] * q;
            e[l] = q * lamc[l];
        }
        va = RV_ADD(va, tail_load(e + j, m - j, 0.0f));
    }
    return RV_HSUM(va);
}

/* The backward's row step t-1 on one row, from e = exp(C_i + h - M) and s =
 * sum(e): R = e / s replaces A's row, G -= lr R, and (more) part -= lr R;
 * rl = M (its log s is added for the whole block), sv = s. */
static inline __attribute__((always_inline)) void bwd_row_update(int m, const float *restrict e, float M, float s,
                                                                 float lr, int more, float *restrict Ri,
                                                                 float *restrict Gi, float *restrict part,
                                                                 float *rl, float *sv)
{
    const float inv = 1.0f / s;
    *rl = M;
    *sv = s;
    if (more) {
#pragma omp simd
        for (int j = 0; j < m; j++) {
            float r = e[j] * inv;
            Ri[j] = r;
            Gi[j] -= lr * r;
            part[j] -= lr * r;
        }
    } else {
#pragma omp simd
        for (int j = 0; j < m; j++) {
            float r = e[j] * inv;
            Ri[j] = r;
            Gi[j] -= lr * r;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* The backward's first pass (sk_backward): E = Abar .* A in G, the seeds of
 * the adjoints (lamr, dla, the blocks' partial column sums) and rl, over the
 * row blocks claimed by this member. */
static void bwd_seed(const bki_team *tm, const bki_sk_problem *pb, const eng_ws *w, int odd, const float *hS,
                     const float *hS1, float la_u, const float *A, ptrdiff_t lda, float *G, ptrdiff_t ldg, float *dla)
{
    const int n = pb->n, m = pb->m;
    float *rl = w->rl, *lamr = w->lamr;
    bki_claims cl = bki_claims_open(tm, w->nb);
    for (int64_t bl; bki_claims_next(&cl, &bl);) {
        const int b = (int)bl;
        float *part = w->part + (size_t)b * w->mr;
        memset(part, 0, sizeof(float) * (size_t)m);
        const int i1 = (b + 1) * w->rb < n ? (b + 1) * w->rb : n;
        for (int i = b * w->rb; i < i1; i++) {
            rl[i] = la_at(pb, i, la_u) - (odd ? hS[i] : hS1[i]);
            float *Gi = G + (ptrdiff_t)i * ldg;
            const float *Ai = A + (ptrdiff_t)i * lda;
#pragma omp simd
            for (int j = 0; j < m; j++) Gi[j] *= Ai[j];
            const float r = vsum(Gi, m);
            if (odd) { /* lambda_S = r; C̄ -= r_i R^S, lambda_{S-1} = colsum(C̄) */
#pragma omp simd
                for (int j = 0; j < m; j++) {
                    Gi[j] -= r * Ai[j];
                    part[j] += Gi[j];
                }
                lamr[i] = 0.0f;
                if (dla) dla[i] = 0.0f;
            } else { /* lambda_S = c (column sums of E), lambda_{S-1} = r */
#pragma omp simd
                for (int j = 0; j < m; j++) part[j] += Gi[j];
                lamr[i] = r;
                if (dla) dla[i] = -r;
            }
        }
    }
}

static void ISA(sk_backward)(const bki_team *tm, const bki_sk_problem *pb, int S, const float *hist, float *A,
                             ptrdiff_t lda, float *G, ptrdiff_t ldg, float *scratch, float *dla, float *dlb)
{
    const int n = pb->n, m = pb->m;
    const eng_ws w = carve(tm, n, m, scratch);
    float *e = w.e, *lamc = w.lamc, *lamc2 = w.lamc2, *wb = w.wb, *lamr = w.lamr, *rl = w.rl;
    _Alignas(64) float eg[2 * (GROUP_MAX + 16)]; /* the row groups' buffers */
    const ptrdiff_t es = group_stride(m);
    const float la_u = -logf((float)n), lb_u = -logf((float)m);
    const float *hS = hist + bki_hist_off(n, m, S);
    const float *hS1 = S > 1 ? hist + bki_hist_off(n, m, S - 1) : NULL;
    const int odd = S % 2;
    /* row blocks and column ranges claimed at run time: a block writes its
     * rows (A, G, rl, lamr, dla) and part[b]; sv and uv are this member's,
     * used within a block */
    bki_claims cc;

    /* Gradients w.r.t. the log marginals (optional): every row step adds its
     * adjoint to dla, every column step to dlb, and the output map
     * A = P / a adds -rowsum(E) to dla (cancelled by step S when S is odd).
     * pass 1: E = Abar .* A; C̄ = E (minus the last row step for odd S).
     * rl_i = la_i - (row potential of the step after the pending column
     * step): for odd S that is h_S, for even S h_{S-1}. */
    bwd_seed(tm, pb, &w, odd, hS, hS1, la_u, A, lda, G, ldg, dla);
    bki_claims cl;
    /* Column step t's Jacobian: Q_ij = exp(C_ij + f_i - LSE_i'(C_i'j + f_i')).
     * Balanced, LSE = lb_j - h_t,j; damped (g = kappa (lb - LSE)), LSE =
     * lb_j - h_t,j / kappa: Q_ij = R_ij exp(rl_i + h_{t-1,i}) wb_j with
     * wb_j = exp(-lb_j + h_t,j (1/kappa - 1)), and the step's adjoint is
     * kappa times the balanced one (folded into wb). wb depends on t only
     * when damped. */
    const float kap = kappa_of(pb), ikm1 = 1.0f / kap - 1.0f;
    cc = cols_open(tm, m);
    for (int j0, j1; bki_ranges_next_int(&cc, &j0, &j1);)
        for (int j = j0; j < j1; j++) {
            wb[j] = expf(-lb_at(pb, j, lb_u));
            if (dlb) dlb[j] = 0.0f;
        }
    bki_team_sync(tm);
    reduce_cols(tm, &w, m, lamc);
    bki_team_sync(tm);
    int logwb = 0;
    for (int j = 0; j < m; j++)
        if (!(wb[j] < 1e30f)) logwb = 1;
    /* pending column step t (even) with lambda_t in lamc and lambda_{t-1}
     * (rows) in lamr; A holds R^{t+1} (or A itself when t = S). */
    int t = odd ? S - 1 : S;
    while (t >= 2) {
        const float *ht1 = hist + bki_hist_off(n, m, t - 1);            /* rows   */
        const float *ht2 = t > 2 ? hist + bki_hist_off(n, m, t - 2) : pb->g0; /* cols */
        const int more = t - 1 > 1; /* does lambda_{t-2} matter? */
        if (dlb) { /* column step t */
            cc = cols_open(tm, m);
            for (int j0, j1; bki_ranges_next_int(&cc, &j0, &j1);)
                for (int j = j0; j < j1; j++) dlb[j] += kap * lamc[j];
        }
        const float *ht = hist + bki_hist_off(n, m, t);              /* cols   */
        if (kap != 1.0f) { /* damped: this step's wb */
            cc = cols_open(tm, m);
            for (int j0, j1; bki_ranges_next_int(&cc, &j0, &j1);)
                for (int j = j0; j < j1; j++) wb[j] = kap * expf(-lb_at(pb, j, lb_u) + ht[j] * ikm1);
            bki_team_sync(tm);
            logwb = 0;
            for (int j = 0; j < m; j++)
                if (!(wb[j] < 1e30f)) logwb = 1;
        }
        cl = bki_claims_open(tm, w.nb);
        for (int64_t bl; bki_claims_next(&cl, &bl);) {
            const int b = (int)bl;
            float *part = w.part + (size_t)b * w.mr;
            if (more) memset(part, 0, sizeof(float) * (size_t)m);
            const int i0 = b * w.rb, i1 = (b + 1) * w.rb < n ? (b + 1) * w.rb : n;
            float *sv = w.sv, *uv = w.uv;
            if (!logwb) /* the block's row factors in vector lanes */
#pragma omp simd
                for (int i = i0; i < i1; i++) uv[i - i0] = bki_expf(rl[i] + ht1[i]);
            int i = i0;
            /* rows in groups of 4 (m <= QUAD_MAX) or 2 (row_softmax_g says
             * why): the group's column steps, its row softmaxes, then its
             * row updates in row order */
#define BWD_GROUP(GSZ)                                                                                              \
    for (; i + (GSZ)-1 < i1; i += (GSZ)) {                                                                          \
        float lr[GSZ], M[GSZ], sm[GSZ];                                                                             \
        for (int r = 0; r < (GSZ); r++) {                                                                           \
            lr[r] = lamr[i + r] - bwd_col_row(m, A + (ptrdiff_t)(i + r) * lda, G + (ptrdiff_t)(i + r) * ldg,         \
                                              uv[i + r - i0], wb, lamc, eg + r * es);                               \
            if (dla) dla[i + r] += lr[r];                                                                           \
        }                                                                                                           \
        row_softmax_g(GSZ, m, pb->C + (ptrdiff_t)i * pb->ldc, pb->ldc, ht2, eg, es, M, sm);                         \
        for (int r = 0; r < (GSZ); r++) {                                                                           \
            bwd_row_update(m, eg + r * es, M[r], sm[r], lr[r], more, A + (ptrdiff_t)(i + r) * lda,                  \
                           G + (ptrdiff_t)(i + r) * ldg, part, &rl[i + r], &sv[i + r - i0]);                         \
            lamr[i + r] = 0.0f;                                                                                     \
        }                                                                                                           \
    }
            if (!logwb && m <= QUAD_MAX) BWD_GROUP(4)
            if (!logwb && m <= GROUP_MAX) BWD_GROUP(2)
#undef BWD_GROUP
            for (; i < i1; i++) {
                float *Gi = G + (ptrdiff_t)i * ldg, *Ri = A + (ptrdiff_t)i * lda;
                /* column step t on row i: Q_ij = R_ij exp(rl_i + h_{t-1,i} - lb_j) */
                float acc = 0.0f;
                if (!logwb) {
                    acc = bwd_col_row(m, Ri, Gi, uv[i - i0], wb, lamc, e);
                } else { /* tiny column masses: stay in the log domain */
                    float base = rl[i] + ht1[i];
                    for (int j = 0; j < m; j++) {
                        float lw = -lb_at(pb, j, lb_u) + (kap != 1.0f ? ht[j] * ikm1 : 0.0f);
                        float q = Ri[j] > 0.0f ? kap * bki_expf(logf(Ri[j]) + base + lw) : 0.0f;
                        Gi[j] -= lamc[j] * q;
                        acc += q * lamc[j];
                    }
                }
                float lr = lamr[i] - acc; /* lambda_{t-1,i}, complete */
                if (dla) dla[i] += lr;    /* row step t-1 */
                /* row step t-1 on row i: R = softmax_j(C_ij + h_{t-2,j}) */
                float M;
                const float s = row_softmax(m, pb->C + (ptrdiff_t)i * pb->ldc, ht2, e, &M);
                bwd_row_update(m, e, M, s, lr, more, Ri, Gi, part, &rl[i], &sv[i - i0]);
                lamr[i] = 0.0f;
            }
#pragma omp simd
            for (int r = i0; r < i1; r++) rl[r] += bki_logf(sv[r - i0]);
        }
        bki_team_sync(tm);
        if (more) {
            reduce_cols(tm, &w, m, lamc2);
            bki_team_sync(tm);
        }
        float *tmp = lamc;
        lamc = lamc2;
        lamc2 = tmp;
        t -= 2;
    }
}

/* ------------------------------------------------------------------------ */
/* SoftSort rows (ESP): the same row softmax on logits -(a_i - s)^2 / t      */
/* ------------------------------------------------------------------------ */
/* Below this an entry of a soft permutation is flushed to zero: it would be a
 * subnormal (slow on x86), and its contribution is far below float rounding. */
#define BK_FLUSH 1e-30f

/* p_i = exp(-(a_i - s)^2 / t) / sum_i' (...). The maximum logit is 0 (s is one
 * of the a_i), so no max-shift is needed and the sum is >= 1. */
static void ISA(softsort_row)(int n, const float *restrict a, float s, float inv_t, float *restrict p)
{
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) {
        float d = a[i] - s;
        p[i] = bki_expf(-(d * d) * inv_t);
        sum += p[i];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int i = 0; i < n; i++) {
        float v = p[i] * inv;
        p[i] = v < BK_FLUSH ? 0.0f : v;
    }
}

/* Backward of one SoftSort row: with dz_i = p_i (dp_i - <p, dp>) and
 * g_i = -2 (a_i - s) / t * dz_i, adds g to da and returns sum_i g_i (the
 * caller subtracts it from da at the index whose value is s). */
static float ISA(softsort_row_bwd)(int n, const float *restrict a, float s, float inv_t,
                                   const float *restrict p, const float *restrict dp, float *restrict da)
{
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int i = 0; i < n; i++) dot += p[i] * dp[i];
    float gs = 0.0f;
    const float c = -2.0f * inv_t;
#pragma omp simd reduction(+ : gs)
    for (int i = 0; i < n; i++) {
        float g = c * (a[i] - s) * (p[i] * (dp[i] - dot));
        da[i] += g;
        gs += g;
    }
    return gs;
}

/* ------------------------------------------------------------------------ */
/* small stable argsort (sort1d.c's bki_argsort up to small_sort_max keys)  */
/* ------------------------------------------------------------------------ */
/* rank_i = #{j : k_j < k_i, or k_j == k_i and j < i}, for 16 keys i at once
 * in vector lanes against every key j: no horizontal sums and no branches,
 * so n^2 compares in n^2 / 16 lane operations; idx[rank_i] = i. Lanes past n
 * hold the largest key and are not scattered. */
#define SORT_LANES 16
/* the most keys this instruction set's small sort takes (bki_kernels.small_sort_max) */
#if defined(__AVX512F__)
#define SMALL_SORT_MAX 128
#else
#define SMALL_SORT_MAX 96
#endif
#if defined(__AVX512F__)
/* 17 to 128 keys on AVX-512: a bitonic sorting network on the words
 * key << 32 | index (all distinct, so the order is the stable one), in up to
 * 16 registers of 8 words; pads of all ones sort last. log2(N) (log2(N) + 1) / 2
 * stages of compare-exchanges (unsigned 64-bit min / max), within a register
 * through a lane permutation, else between registers: no branch on the data.
 * bitonic_net runs the network on nv registers (a compile-time constant after
 * inlining, so that the stages unroll and their masks fold). */
static inline __attribute__((always_inline)) void bitonic_net(__m512i *a, const int nv)
{
    const int N = 8 * nv;
    const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    for (int k = 2; k <= N; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            if (j >= 8) { /* partners in another register, same lane */
                const int vj = j >> 3;
                for (int v = 0; v < nv; v++) {
                    const int pv = v ^ vj;
                    if (pv < v) continue;
                    const __m512i lo = _mm512_min_epu64(a[v], a[pv]), hi = _mm512_max_epu64(a[v], a[pv]);
                    const int asc = ((8 * v) & k) == 0;
                    a[v] = asc ? lo : hi;
                    a[pv] = asc ? hi : lo;
                }
            } else { /* partners in the same register: lane ^ j */
                const __m512i perm = _mm512_xor_si512(lane, _mm512_set1_epi64(j));
                const unsigned low = j == 1 ? 0x55u : j == 2 ? 0x33u : 0x0Fu; /* lanes with (lane & j) == 0 */
                for (int v = 0; v < nv; v++) {
                    /* lanes sorted ascending in this merge: ((8 v + lane) & k) == 0 */
                    const unsigned asc = k == 2 ? 0x33u : k == 4 ? 0x0Fu : ((8 * v) & k) ? 0x00u : 0xFFu;
                    const __m512i b = _mm512_permutexvar_epi64(perm, a[v]);
                    const __m512i mn = _mm512_min_epu64(a[v], b), mx = _mm512_max_epu64(a[v], b);
                    a[v] = _mm512_mask_blend_epi64((__mmask8)(~(low ^ asc) & 0xFFu), mx, mn); /* 1: the minimum */
                }
            }
        }
}

static void bitonic_argsort(int n, const float *x, ptrdiff_t stride, int32_t *idx)
{
    const int nv = n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : n <= 64 ? 8 : 16, N = 8 * nv;
    __m512i a[16];
    if (stride == 1) { /* the words in lanes: bki_sort_key's map, widened, or-ed with the index */
        const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
        for (int v = 0; v < nv; v++) {
            const int r = n - 8 * v < 0 ? 0 : n - 8 * v > 8 ? 8 : n - 8 * v;
            const __mmask8 live = (__mmask8)((1u << r) - 1u);
            const __m256 xf = _mm256_add_ps(_mm256_maskz_loadu_ps(live, x + 8 * v), _mm256_setzero_ps()); /* -0 -> +0 */
            const __m256i u = _mm256_castps_si256(xf);
            const __m256i key = _mm256_xor_si256(u, _mm256_or_si256(_mm256_srai_epi32(u, 31), sign));
            const __m512i word = _mm512_or_si512(_mm512_slli_epi64(_mm512_cvtepu32_epi64(key), 32),
                                                 _mm512_add_epi64(_mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi64(8 * v)));
            a[v] = _mm512_mask_blend_epi64(live, _mm512_set1_epi64(-1), word);
        }
    } else {
        uint64_t w[128];
        for (int i = 0; i < n; i++) w[i] = ((uint64_t)bki_sort_key(x[(ptrdiff_t)i * stride]) << 32) | (uint32_t)i;
        for (int i = n; i < N; i++) w[i] = ~(uint64_t)0;
        for (int v = 0; v < nv; v++) a[v] = _mm512_loadu_si512(w + 8 * v);
    }
    switch (nv) {
    case 1: bitonic_net(a, 1); break;
    case 2: bitonic_net(a, 2); break;
    case 4: bitonic_net(a, 4); break;
    case 8: bitonic_net(a, 8); break;
    default: bitonic_net(a, 16); break;
    }
    for (int v = 0; v < nv; v++) { /* the low halves: the indices, in order */
        const int r = n - 8 * v < 0 ? 0 : n - 8 * v > 8 ? 8 : n - 8 * v;
        _mm256_mask_storeu_epi32(idx + 8 * v, (__mmask8)((1u << r) - 1u), _mm512_cvtepi64_epi32(a[v]));
    }
}
#endif

static void ISA(small_argsort)(int n, const float *x, ptrdiff_t stride, int32_t *idx)
{
#if defined(__AVX512F__)
    if (n > 16) { /* 64 keys: 160 ns against 280 by rank; at 16 and below the ranks are faster */
        bitonic_argsort(n, x, stride, idx);
        return;
    }
#endif
    uint32_t k[(SMALL_SORT_MAX + SORT_LANES - 1) / SORT_LANES * SORT_LANES];
    const int np = (n + SORT_LANES - 1) / SORT_LANES * SORT_LANES;
    for (int i = 0; i < n; i++) k[i] = bki_sort_key(x[(ptrdiff_t)i * stride]);
    for (int i = n; i < np; i++) k[i] = 0xffffffffu;
    for (int i0 = 0; i0 < n; i0 += SORT_LANES) {
        int32_t cnt[SORT_LANES] = {0};
        for (int j = 0; j < n; j++) {
            const uint32_t kj = k[j];
#pragma omp simd
            for (int l = 0; l < SORT_LANES; l++) cnt[l] += (kj < k[i0 + l]) | ((kj == k[i0 + l]) & (j < i0 + l));
        }
        const int e = n - i0 < SORT_LANES ? n - i0 : SORT_LANES;
        for (int l = 0; l < e; l++) idx[cnt[l]] = i0 + l;
    }
}

/* BKI_LANES sorts in lanes (bki_kernels.lanes_sort): every comparator is
 * compares and blends over the lanes, no permutes and no branches; with
 * indices, pairs are ordered by (key, index), so that indices that start in
 * ascending order end in bki_argsort's stable order */
static void ISA(lanes_sort)(int ncmp, const uint16_t *pairs, float *key, int32_t *idx)
{
    for (int c = 0; c < ncmp; c++) {
        float *restrict x = key + (size_t)pairs[2 * c] * BKI_LANES, *restrict y = key + (size_t)pairs[2 * c + 1] * BKI_LANES;
        if (idx) {
            int32_t *restrict xi = idx + (size_t)pairs[2 * c] * BKI_LANES, *restrict yi = idx + (size_t)pairs[2 * c + 1] * BKI_LANES;
#pragma omp simd
            for (int l = 0; l < BKI_LANES; l++) {
                const float a = x[l], b = y[l];
                const int32_t ia = xi[l], ib = yi[l];
                const int sw = b < a || (b == a && ib < ia); /* (key, index) order: the stable one */
                x[l] = sw ? b : a;
                y[l] = sw ? a : b;
                xi[l] = sw ? ib : ia;
                yi[l] = sw ? ia : ib;
            }
        } else {
#pragma omp simd
            for (int l = 0; l < BKI_LANES; l++) {
                const float a = x[l], b = y[l];
                x[l] = b < a ? b : a;
                y[l] = b < a ? a : b;
            }
        }
    }
}

/* bki_potential1d in lanes (bki_kernels.potential1d_lanes): per lane the
 * same double operations in the same order */
static void ISA(potential1d_lanes)(int n, int m, const float *sa, const int32_t *ia, const float *sb, int lanes,
                                   double *f, size_t fs, double *mean)
{
    double phi[BKI_LANES], prev[BKI_LANES], sum[BKI_LANES], v[BKI_LANES];
    for (int l = 0; l < BKI_LANES; l++) phi[l] = prev[l] = sum[l] = 0.0;
    for (int r = 0; r < n; r++) {
        const float *ar = sa + (size_t)r * BKI_LANES;
        if (r > 0) {
            const float *bt = sb + (size_t)(((int64_t)r * m - 1) / n) * BKI_LANES; /* sigma(r - 1) */
#pragma omp simd
            for (int l = 0; l < BKI_LANES; l++) phi[l] += (double)bt[l] * ((double)ar[l] - prev[l]);
        }
#pragma omp simd
        for (int l = 0; l < BKI_LANES; l++) {
            const double a = (double)ar[l];
            v[l] = 0.5 * a * a - phi[l];
            sum[l] += v[l];
            prev[l] = a;
        }
        const int32_t *ir = ia + (size_t)r * BKI_LANES;
        for (int l = 0; l < lanes; l++) f[(size_t)l * fs + ir[l]] = v[l];
    }
    for (int l = 0; l < lanes; l++) mean[l] = sum[l] / n;
}

/* ------------------------------------------------------------------------ */
/* machine-peak probes (for the benchmark's fraction-of-peak figures)       */
/* ------------------------------------------------------------------------ */

static double ISA(fma_probe)(long iters)
{
    /* 12 independent chains (enough to cover FMA latency on two ports);
     * distinct starting values, since identical chains would be merged */
    rvec a0 = RV_SET1(1.00f), a1 = RV_SET1(1.01f), a2 = RV_SET1(1.02f), a3 = RV_SET1(1.03f), a4 = RV_SET1(1.04f),
        a5 = RV_SET1(1.05f), a6 = RV_SET1(1.06f), a7 = RV_SET1(1.07f), a8 = RV_SET1(1.08f), a9 = RV_SET1(1.09f),
        a10 = RV_SET1(1.10f), a11 = RV_SET1(1.11f);
    const rvec x = RV_SET1(0.999999f), y = RV_SET1(1e-7f);
    for (long k = 0; k < iters; k++) {
        a0 = RV_FMA(a0, x, y); a1 = RV_FMA(a1, x, y); a2 = RV_FMA(a2, x, y); a3 = RV_FMA(a3, x, y);
        a4 = RV_FMA(a4, x, y); a5 = RV_FMA(a5, x, y); a6 = RV_FMA(a6, x, y); a7 = RV_FMA(a7, x, y);
        a8 = RV_FMA(a8, x, y); a9 = RV_FMA(a9, x, y); a10 = RV_FMA(a10, x, y); a11 = RV_FMA(a11, x, y);
    }
    rvec s = RV_ADD(RV_ADD(RV_ADD(a0, a1), RV_ADD(a2, a3)), RV_ADD(RV_ADD(a4, a5), RV_ADD(a6, a7)));
    s = RV_ADD(s, RV_ADD(RV_ADD(a8, a9), RV_ADD(a10, a11)));
    _Alignas(64) float out[RVL];
    RV_STORE(out, s);
    volatile float sink = out[0];
    (void)sink;
    return (double)iters * 12 * RVL * 2;
}

/* exp throughput of the engine's own exp on an L1-resident buffer of 4096
 * floats in (-10, 0] (the caller initialises it once; x -> exp(x) - 1 keeps
 * it in (-1, 0]). */
static double ISA(exp_probe)(long reps, float *buf)
{
    for (long r = 0; r < reps; r++) {
#pragma omp simd
        for (int i = 0; i < 4096; i++) buf[i] = bki_expf(buf[i]) - 1.0f;
    }
    return (double)reps * 4096;
}

static void ISA(gelu)(size_t n, const float *restrict z, float *restrict y)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) y[i] = gelu_of(z[i]);
}

/* dz may be dy (the Linear epilogue scales its tile in place) */
static void ISA(gelu_grad)(size_t n, const float *restrict z, const float *dy, float *dz)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) dz[i] = dy[i] * gelu_slope(z[i]);
}

/* g = gelu(z), and z overwritten by gelu'(z): the Linear forward's
 * epilogue, which keeps the slope for the backward instead of z */
static void ISA(gelu_keep_slope)(size_t n, float *restrict z, float *restrict g)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float sl;
        g[i] = gelu_and_slope(z[i], &sl);
        z[i] = sl;
    }
}

static void ISA(vexp)(float *x, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) x[i] = bki_expf(x[i]);
}

const bki_kernels ISA(bki_kernels) = {
    .name = BK_STR(BK_ISA),
    .gemm = &ISA(bki_gemm_kernels),
    .sk_forward = ISA(sk_forward),
    .sk_scratch = ISA(sk_scratch),
    .sk_attention = ISA(sk_attention),
    .sk_backward = ISA(sk_backward),
    .fma_probe = ISA(fma_probe),
    .exp_probe = ISA(exp_probe),
    .vexp = ISA(vexp),
    .gelu = ISA(gelu),
    .gelu_grad = ISA(gelu_grad),
    .gelu_keep_slope = ISA(gelu_keep_slope),
    .softsort_row = ISA(softsort_row),
    .softsort_row_bwd = ISA(softsort_row_bwd),
    .small_sort_max = SMALL_SORT_MAX,
    .small_argsort = ISA(small_argsort),
    .lanes_sort = ISA(lanes_sort),
    .potential1d_lanes = ISA(potential1d_lanes),
};
