/* gemm_kern.c -- the library's own GEMM kernel for thin products: one side of
 * the output (or the inner dimension and one side) small enough that the
 * small operand, packed, stays in cache while the long operand streams
 * through once, unpacked.
 *
 * Why not OpenBLAS for these: its blocking copies ("packs") both operands of
 * every call and zeroes C first when beta = 0; for a product whose long side
 * is n and whose other sides are r, d <= 128 (LOT's and OTK's problems, the
 * per-tile calls of bki_gemm), the copies and the zeroing pass move as many
 * bytes as the product itself and cost more than its arithmetic
 * (docs/PERFORMANCE.md, "Thin GEMMs").
 *
 * Compiled once per instruction set like lse_engine.c (BK_ISA); bki_kern()
 * picks the table at run time. One call is single-threaded (gemm.c shares its
 * tiles over a team). Arithmetic: every output element is one fused
 * multiply-add chain over k = 0..K-1 in order, then alpha * sum (+ beta * C):
 * a function of the element only, so neither the tiling nor the row/column
 * remainder paths change a bit. */
#include "internal.h"

#include <stdint.h>
#include <string.h>

#ifndef BK_ISA
#error "BK_ISA must be defined (avx2 or avx512)"
#endif

#include <immintrin.h>

#if defined(__AVX512F__)
#define VL 16 /* floats per vector */
#define MR 8  /* rows per micro-tile: 2 MR accumulators + 2 B vectors + 1 broadcast of 32 registers */
typedef __m512 vf;
typedef __mmask16 vmask;
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_MASK(n) ((vmask)((1u << (n)) - 1u))
#define V_LOADM(p, m) _mm512_maskz_loadu_ps(m, p)
#define V_STOREM(p, m, v) _mm512_mask_storeu_ps(p, m, v)
#define V_STREAM(p, v) _mm512_stream_ps(p, v)
#else
#define VL 8
#define MR 6 /* 2 MR accumulators + 2 B vectors + 1 broadcast of 16 registers */
typedef __m256 vf;
typedef __m256i vmask;
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps(p, v)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
static inline vmask V_MASK(int n)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}
#define V_LOADM(p, m) _mm256_maskload_ps(p, m)
#define V_STOREM(p, m, v) _mm256_maskstore_ps(p, m, v)
#define V_STREAM(p, v) _mm256_stream_ps(p, v)
#endif
#define NR (2 * VL) /* columns per micro-tile */
/* n columns padded to whole micro-tiles (a packed operand's rows, K chunks' buffer rows) */
static inline int padded(int n) { return (n + NR - 1) / NR * NR; }

/* The streamed operand: element (row i, k) at a[i * rs + k * ks]. The packed
 * (or row-major) operand: element (k, column j) at b[k * bs + j], rows padded
 * to a multiple of NR columns when packed. The output: element (i, j) at
 * c[i * crs + j * ccs]; ccs == 1 stores vectors, otherwise (a transposed
 * product) the tile goes through a buffer. */
typedef struct {
    const float *a;
    ptrdiff_t rs, ks;
    const float *b;
    ptrdiff_t bs;
    float *c;
    ptrdiff_t crs, ccs;
    int K;
    float alpha, beta;
    /* K chunks (run): the raw sums of a group of rows from wi on between chunks, at
     * ws[(i - wi) * wrs + j]; first: start from zero, not from ws; last: the
     * epilogue, not ws */
    float *ws;
    ptrdiff_t wrs;
    int wi, first, last;
    int stream; /* non-temporal stores of C's 64-byte-aligned micro-tile rows (beta == 0, ccs == 1) */
} gk_args;

/* one k of a micro-tile: acc(r) += op(A)(row r, k) (b0 | b1), rows at ak[r rs] */
static inline __attribute__((always_inline)) void kstep(int R, const float *ak, ptrdiff_t rs, vf b0, vf b1, vf *acc0,
                                                        vf *acc1)
{
    for (int r = 0; r < R; r++) {
        const vf x = V_SET1(ak[r * rs]);
        acc0[r] = V_FMA(x, b0, acc0[r]);
        acc1[r] = V_FMA(x, b1, acc1[r]);
    }
}

/* 8 x 8 transpose: dst[r][c] = src[c][r] (row strides ss, ds) */
static inline void tr8(const float *src, ptrdiff_t ss, float *dst, ptrdiff_t ds)
{
    __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + ss), r2 = _mm256_loadu_ps(src + 2 * ss),
           r3 = _mm256_loadu_ps(src + 3 * ss), r4 = _mm256_loadu_ps(src + 4 * ss), r5 = _mm256_loadu_ps(src + 5 * ss),
           r6 = _mm256_loadu_ps(src + 6 * ss), r7 = _mm256_loadu_ps(src + 7 * ss);
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
                 t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    r0 = _mm256_shuffle_ps(t0, t2, 0x44);
    r1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    r2 = _mm256_shuffle_ps(t1, t3, 0x44);
    r3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    r4 = _mm256_shuffle_ps(t4, t6, 0x44);
    r5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    r6 = _mm256_shuffle_ps(t5, t7, 0x44);
    r7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(r0, r4, 0x20));
    _mm256_storeu_ps(dst + ds, _mm256_permute2f128_ps(r1, r5, 0x20));
    _mm256_storeu_ps(dst + 2 * ds, _mm256_permute2f128_ps(r2, r6, 0x20));
    _mm256_storeu_ps(dst + 3 * ds, _mm256_permute2f128_ps(r3, r7, 0x20));
    _mm256_storeu_ps(dst + 4 * ds, _mm256_permute2f128_ps(r0, r4, 0x31));
    _mm256_storeu_ps(dst + 5 * ds, _mm256_permute2f128_ps(r1, r5, 0x31));
    _mm256_storeu_ps(dst + 6 * ds, _mm256_permute2f128_ps(r2, r6, 0x31));
    _mm256_storeu_ps(dst + 7 * ds, _mm256_permute2f128_ps(r3, r7, 0x31));
}

/* R rows (a compile-time constant after inlining) x one NR-column block at
 * column j0 with nc <= NR valid columns. U: the streamed rows are adjacent
 * floats (rs == 1: a transposed op(A), as in a weight gradient dY^T X, or
 * the columns of op(B)), a compile-time constant, so that the R broadcasts
 * of a k take immediate offsets instead of R - 1 index registers (with rs
 * in a register GCC kept the offsets in spilled registers and reloaded the
 * loop bound from the stack in the k loop: the weight gradients' products
 * with operands in L2 ran at 69 % of the FMA peak, 84 % with U) */
static inline __attribute__((always_inline)) void micro(const gk_args *g, int R, int i0, int j0, int nc, const float *pf,
                                                        const int ST, const int U)
{
    vf acc0[MR], acc1[MR];
    if (g->first)
        for (int r = 0; r < R; r++) acc0[r] = acc1[r] = V_ZERO();
    else
        for (int r = 0; r < R; r++) {
            const float *w = g->ws + (ptrdiff_t)(i0 - g->wi + r) * g->wrs + j0;
            acc0[r] = V_LOAD(w);
            acc1[r] = V_LOAD(w + VL);
        }
    const float *a = g->a + (ptrdiff_t)i0 * g->rs, *b = g->b + j0;
    const ptrdiff_t rs = U ? 1 : g->rs, ks = g->ks, bs = g->bs;
    int k = 0;
    if (nc == NR && pf) { /* and fetch the next rows' stretch of the streamed operand meanwhile */
        /* rows of 8 k (rs > 1) or 8 rows of k (rs == 1: the next rows share
         * each k's line) */
        const ptrdiff_t ps = rs == 1 ? ks : rs;
        for (; k + 8 <= g->K; k += 8) {
            for (int r = 0; r < MR; r++) _mm_prefetch((const char *)(pf + r * ps + (ptrdiff_t)k * ks), _MM_HINT_T0);
            for (int kk = k; kk < k + 8; kk++)
                kstep(R, a + (ptrdiff_t)kk * ks, rs, V_LOAD(b + (ptrdiff_t)kk * bs), V_LOAD(b + (ptrdiff_t)kk * bs + VL),
                      acc0, acc1);
        }
    }
    if (nc == NR)
        for (; k < g->K; k++)
            kstep(R, a + (ptrdiff_t)k * ks, rs, V_LOAD(b + (ptrdiff_t)k * bs), V_LOAD(b + (ptrdiff_t)k * bs + VL), acc0,
                  acc1);
    else { /* the last, partial column block: masked loads (never past the operand) */
        const vmask m0 = V_MASK(nc < VL ? nc : VL), m1 = V_MASK(nc > VL ? nc - VL : 0);
        for (; k < g->K; k++)
            kstep(R, a + (ptrdiff_t)k * ks, rs, V_LOADM(b + (ptrdiff_t)k * bs, m0),
                  V_LOADM(b + (ptrdiff_t)k * bs + VL, m1), acc0, acc1);
    }
    if (!g->last) { /* a later chunk goes on from these sums: the same chain */
        for (int r = 0; r < R; r++) {
            float *w = g->ws + (ptrdiff_t)(i0 - g->wi + r) * g->wrs + j0;
            V_STORE(w, acc0[r]);
            V_STORE(w + VL, acc1[r]);
        }
        return;
    }
    const vf al = V_SET1(g->alpha), be = V_SET1(g->beta);
    if (g->ccs == 1) {
        const vmask m0 = V_MASK(nc < VL ? nc : VL), m1 = V_MASK(nc > VL ? nc - VL : 0);
        for (int r = 0; r < R; r++) {
            float *c = g->c + (ptrdiff_t)(i0 + r) * g->crs + j0;
            vf y0 = V_MUL(al, acc0[r]), y1 = V_MUL(al, acc1[r]);
            if (ST && nc == NR && !((uintptr_t)c & 63)) { /* whole lines (NR floats: 1 or 2) */
                V_STREAM(c, y0);
                V_STREAM(c + VL, y1);
            } else if (nc == NR) {
                if (g->beta != 0.0f) {
                    y0 = V_FMA(be, V_LOAD(c), y0);
                    y1 = V_FMA(be, V_LOAD(c + VL), y1);
                }
                V_STORE(c, y0);
                V_STORE(c + VL, y1);
            } else {
                if (g->beta != 0.0f) {
                    y0 = V_FMA(be, V_LOADM(c, m0), y0);
                    y1 = V_FMA(be, V_LOADM(c + VL, m1), y1);
                }
                V_STOREM(c, m0, y0);
                V_STOREM(c + VL, m1, y1);
            }
        }
    } else {
        _Alignas(64) float t[MR][NR];
        for (int r = 0; r < R; r++) {
            V_STORE(t[r], V_MUL(al, acc0[r]));
            V_STORE(t[r] + VL, V_MUL(al, acc1[r]));
        }
#if MR == 8
        if (R == MR && nc == NR && g->beta == 0.0f) { /* 8 x 8 blocks transposed in registers, rows of 8 stored whole */
            for (int q = 0; q < NR; q += 8)
                tr8(&t[0][q], NR, g->c + (ptrdiff_t)(j0 + q) * g->ccs + (ptrdiff_t)i0 * g->crs, g->ccs);
            return;
        }
#endif
        /* column by column: each column of the tile is a run of R contiguous
         * outputs when the product is transposed (crs == 1) */
        for (int j = 0; j < nc; j++) {
            float *c = g->c + (ptrdiff_t)(j0 + j) * g->ccs + (ptrdiff_t)i0 * g->crs;
            for (int r = 0; r < R; r++) {
                float y = t[r][j];
                if (g->beta != 0.0f) y = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(g->beta), _mm_set_ss(c[r * g->crs]), _mm_set_ss(y)));
                c[r * g->crs] = y;
            }
        }
    }
}

/* rows of MR ahead the first column block prefetches (2 measured 3 % faster
 * than 1 on the training step's products with operands in L3; none, 13 %
 * slower: the streamed rows' misses are latency-bound, not bandwidth-bound) */
#define PF_AHEAD 2
/* ST: the stores stream (a compile-time constant: the ordinary path's code is
 * that of a kernel without streaming) */
static inline __attribute__((always_inline)) void rows_body(const gk_args *g, int i0, int i1, int N, const float *nxt,
                                                            int nxt_rows, const int ST, const int U)
{
    for (int i = i0; i < i1; i += MR) {
        const int R = i1 - i < MR ? i1 - i : MR;
        /* the first column block prefetches rows PF_AHEAD blocks on (later
         * blocks find this block's rows in L1); past this call's rows, the
         * next call's first rows (nxt: the next K chunk or row group) */
        const int t = i + PF_AHEAD * MR;
        const float *pf = t + MR <= i1                               ? g->a + (ptrdiff_t)t * g->rs
                          : nxt && t >= i1 && t - i1 + MR <= nxt_rows ? nxt + (ptrdiff_t)(t - i1) * g->rs
                                                                      : NULL;
        for (int j = 0; j < N; j += NR) {
            const int nc = N - j < NR ? N - j : NR;
            const float *p = j ? NULL : pf;
            switch (R) { /* one specialised body per row count */
            case MR: micro(g, MR, i, j, nc, p, ST, U); break;
            case 1: micro(g, 1, i, j, nc, NULL, ST, U); break;
            case 2: micro(g, 2, i, j, nc, NULL, ST, U); break;
            case 3: micro(g, 3, i, j, nc, NULL, ST, U); break;
            case 4: micro(g, 4, i, j, nc, NULL, ST, U); break;
            case 5: micro(g, 5, i, j, nc, NULL, ST, U); break;
#if MR > 6
            case 6: micro(g, 6, i, j, nc, NULL, ST, U); break;
            case 7: micro(g, 7, i, j, nc, NULL, ST, U); break;
#endif
            default: break;
            }
        }
    }
}

static void run_rows(const gk_args *g, int i0, int i1, int N, const float *nxt, int nxt_rows)
{
    if (g->stream) rows_body(g, i0, i1, N, nxt, nxt_rows, 1, 0);
    else if (g->rs == 1) rows_body(g, i0, i1, N, nxt, nxt_rows, 0, 1);
    else rows_body(g, i0, i1, N, nxt, nxt_rows, 0, 0);
}

/* K in chunks: the reused operand's chunk (KC_FLOATS floats of its padded
 * rows) stays in L1 while a group of rows of the streamed operand goes past
 * it, their raw sums kept in ws between chunks (stored and reloaded as the
 * same floats, so the bits are those of one chain). Chunked only while the
 * padded width fits ws. A group is as many rows as ws holds at the padded
 * width (64 at 128 columns, 128 at 64, 256 at 32): when the reused operand
 * streams too (a weight gradient, dW = dY^T X, K = the batch's rows), each
 * group reads all of it again, so fewer groups read it fewer times
 * (128-row groups at 64 columns: the training step's weight gradients
 * 10-13 % faster than 64-row groups). Measured in docs/PERFORMANCE.md ("K in
 * chunks", "Thin column tiles"). */
#define WS_FLOATS 8192
#define WS_COLS 128
#define KC_FLOATS 8192
static int chunk_k(int K, int N)
{
    const int w = padded(N);
    if (w > WS_COLS) return K;
    int kc = KC_FLOATS / w;
    kc = kc < 64 ? 64 : kc & ~7;
    return K > kc + kc / 2 ? kc : K;
}

static void run(const gk_args *g0, int M, int N)
{
    const int kc = chunk_k(g0->K, N);
    gk_args g = *g0;
    g.first = g.last = 1;
    if (kc >= g0->K) {
        run_rows(&g, 0, M, N, NULL, 0);
        return;
    }
    _Alignas(64) float ws[WS_FLOATS];
    g.ws = ws;
    g.wrs = padded(N);
    const int mc = WS_FLOATS / padded(N); /* rows a group (padded(N) <= WS_COLS: at least 64) */
    for (int i0 = 0; i0 < M; i0 += mc) {
        g.wi = i0;
        for (int k0 = 0; k0 < g0->K; k0 += kc) {
            g.K = g0->K - k0 < kc ? g0->K - k0 : kc;
            g.a = g0->a + (ptrdiff_t)k0 * g0->ks;
            g.b = g0->b + (ptrdiff_t)k0 * g0->bs;
            g.first = k0 == 0;
            g.last = k0 + kc >= g0->K;
            /* the call after this one: the next chunk of these rows, or the next group's first chunk */
            const int ni = g.last ? i0 + mc : i0, nk = g.last ? 0 : k0 + kc;
            const float *nxt = ni < M ? g0->a + (ptrdiff_t)ni * g0->rs + (ptrdiff_t)nk * g0->ks : NULL;
            run_rows(&g, i0, M - i0 < mc ? M : i0 + mc, N, nxt, M - ni < mc ? M - ni : mc);
        }
    }
}

static size_t ISA(gemm_pack_floats)(int rows, int cols) { return (size_t)rows * (size_t)padded(cols); }


/* dst[k][j] = src[j * sj + k] for j < cols (rows x padded cols, row stride
 * padded cols): the transpose of a row-major panel, in 8 x 8 blocks, the
 * edges element by element. The padding columns are left as they are: the
 * last, partial column block reads its valid columns only (masked loads).
 * (Zeroing them was a third of the packing of attention's 50-column
 * panels.) With done, dst holds it already (the caller's previous tile had
 * the same panel). */
static ptrdiff_t pack(int rows, int cols, const float *src, ptrdiff_t sj, float *dst, int done)
{
    const ptrdiff_t w = padded(cols);
    if (done) return w;
    const int c8 = cols & ~7, r8 = rows & ~7;
    for (int j = 0; j < c8; j += 8) {
        for (int k = 0; k < r8; k += 8) tr8(src + (ptrdiff_t)j * sj + k, sj, dst + (ptrdiff_t)k * w + j, w);
        for (int jj = j; jj < j + 8; jj++)
            for (int k = r8; k < rows; k++) dst[(ptrdiff_t)k * w + jj] = src[(ptrdiff_t)jj * sj + k];
    }
    for (int j = c8; j < cols; j++)
        for (int k = 0; k < rows; k++) dst[(ptrdiff_t)k * w + j] = src[(ptrdiff_t)j * sj + k];
    return w;
}

/* C (M x N, row-major, ldc) = alpha op(A) op(B) + beta C, with op(A)(i, k) =
 * ta ? A[k lda + i] : A[i lda + k] and op(B)(k, j) = tb ? B[j ldb + k] :
 * B[k ldb + j]; beta == 0 does not read C. trans == 0 streams the rows of
 * op(A) against op(B) (packed into pk when tb; used as it is otherwise);
 * trans == 1 computes C^T = op(B)^T op(A)^T: streams the columns of op(B)
 * against op(A)^T (packed into pk unless ta). pk: gemm_pack_floats(K, N)
 * floats (trans 0) or (K, M) (trans 1); packed: pk holds that operand already
 * (packed by a call with the same operand, K and short side). */
static void ISA(gemm_thin)(int trans, int ta, int tb, int M, int N, int K, float alpha, const float *A, ptrdiff_t lda,
                           const float *B, ptrdiff_t ldb, float beta, float *C, ptrdiff_t ldc, float *pk, int packed,
                           int stream)
{
    gk_args g = {0};
    g.K = K;
    g.alpha = alpha;
    g.beta = beta;
    g.stream = stream && !trans && beta == 0.0f;
    if (!trans) {
        g.a = A;
        g.rs = ta ? 1 : lda;
        g.ks = ta ? lda : 1;
        if (tb) {
            g.bs = pack(K, N, B, ldb, pk, packed);
            g.b = pk;
        } else {
            g.b = B;
            g.bs = ldb;
        }
        g.c = C;
        g.crs = ldc;
        g.ccs = 1;
        run(&g, M, N);
        if (g.stream) _mm_sfence(); /* the non-temporal stores before whatever follows (a team's sync) */
    } else {
        g.a = B; /* rows j of op(B)^T: element (j, k) = op(B)(k, j) */
        g.rs = tb ? ldb : 1;
        g.ks = tb ? 1 : ldb;
        if (ta) { /* op(A)^T (k, i) = A[k lda + i]: row-major already */
            g.b = A;
            g.bs = lda;
        } else {
            g.bs = pack(K, M, A, lda, pk, packed);
            g.b = pk;
        }
        g.c = C;
        g.crs = 1;
        g.ccs = ldc;
        run(&g, N, M);
    }
}

const bki_gemm_kernels ISA(bki_gemm_kernels) = {
    .mr = MR,
    .nr = NR,
    .pack_floats = ISA(gemm_pack_floats),
    .thin = ISA(gemm_thin),
};
