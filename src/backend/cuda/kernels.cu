/* kernels.cu -- softmax and Sinkhorn attention on NVIDIA GPUs: streamed
 * (flash-style) forward and exact unrolled backward (docs/CUDA.md).
 *
 * Every kernel is one PASS over the score matrix C = alpha Q K^T of each
 * problem, never stored: a block of 128 threads owns 64 "outer" rows (queries
 * in a q-major pass, keys in a k-major one) and streams 64-wide tiles of the
 * other side through shared memory, recomputing the score tile (tensor cores
 * through WMMA for bf16/fp16 operands, fp32 FMAs for fp32 operands; fp32
 * accumulation always). Whatever a pass reduces is reduced along the
 * streamed index, inside one block, in a fixed order: no atomics, so every
 * result is bitwise reproducible for a given input, device and build.
 *
 * Forward (S half-steps, row first; potentials in natural-log units):
 *   row step t (q-major):  f_t,i = log a - LSE_j (C_ij + g_{t-1},j)
 *   col step t (k-major):  g_t,j = log b - LSE_i (C_ij + f_{t-1},i)
 *   output (q-major):      A_ij = Lq exp(C_ij + f_i + g_j),  O = A V
 * The last row step and the output share one online-softmax pass when S is
 * odd, no tolerance is set and no attention matrix is asked for (S = 1 is
 * then exactly one flash-attention pass).
 *
 * Backward (T = the problem's half-steps): with W = A .* (dO V^T),
 *   lam_T = rowsum W (T odd) / mu_T = colsum W (T even), then the adjoint of
 *   each step in reverse, one pass each (column step t: lam_{t-1,i} +=
 *   -sum_j mu_t,j Q^t_ij, q-major; row step t: mu_{t-1,j} += -sum_i lam_t,i
 *   R^t_ij, k-major), and finally
 *   Cbar_ij = W_ij - sum_{row t} lam_t,i R^t_ij - sum_{col t} mu_t,j Q^t_ij,
 *   dQ = alpha Cbar K (q-major), dK = alpha Cbar^T Q, dV = A^T dO (k-major).
 *   R^t_ij = exp(C_ij + g_{t-1},j + f_t,i - log a), Q^t_ij = exp(C_ij +
 *   f_{t-1},i + g_t,j - log b). Memory: O(S (Nq + Nk)) floats per problem.
 */
#include "kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <string.h>

using namespace nvcuda;

namespace {

constexpr int TILE = BKC_TILE; /* 64 outer rows, 64 streamed columns      */
constexpr int NT = 128;        /* threads per block: 4 warps              */
constexpr int LDS = TILE + 4;  /* float tiles' row stride                 */
constexpr int LDX = TILE + 8;  /* converted (16-bit) tiles' row stride    */

enum Mode {
    M_ROW_LSE, M_COL_LSE, M_OUT,                             /* forward  */
    M_BWD_D, M_BWD_FIRST, M_REV_COL, M_REV_ROW, M_DQ, M_DKDV, M_DK, M_DV /* backward */
};

__host__ __device__ constexpr bool kmajor(int m)
{
    return m == M_COL_LSE || m == M_BWD_FIRST || m == M_REV_ROW || m == M_DKDV || m == M_DK || m == M_DV;
}
/* the pass needs dP = dO V^T (outer and inner second operands) */
__host__ __device__ constexpr bool needs_dp(int m)
{
    return m == M_BWD_D || m == M_BWD_FIRST || m == M_DQ || m == M_DKDV || m == M_DK;
}
__host__ __device__ constexpr bool needs_i2(int m) { return needs_dp(m) || m == M_OUT || m == M_DV; }
__host__ __device__ constexpr bool needs_acc(int m)
{
    return m == M_OUT || m == M_DQ || m == M_DKDV || m == M_DK || m == M_DV;
}

/* ---- element types -------------------------------------------------------- */
template <typename T> struct Tr;
template <> struct Tr<float> {
    static constexpr bool tc = false;
    __device__ static float to(float x) { return x; }
    __device__ static float from(float x) { return x; }
};
template <> struct Tr<__half> {
    static constexpr bool tc = true;
    __device__ static float to(__half x) { return __half2float(x); }
    __device__ static __half from(float x) { return __float2half_rn(x); }
};
template <> struct Tr<__nv_bfloat16> {
    static constexpr bool tc = true;
    __device__ static float to(__nv_bfloat16 x) { return __bfloat162float(x); }
    __device__ static __nv_bfloat16 from(float x) { return __float2bfloat16_rn(x); }
};

/* ---- shared memory plan of a pass ---------------------------------------- */
struct Plan {
    int o1, o2, i1, i2, st, pt, xh, a1, a2, total;
};
__host__ __device__ inline int rnd128(int x) { return (x + 127) & ~127; }
__host__ __device__ inline Plan plan_of(int mode, int esz, bool tc, int DM)
{
    const int ldt = tc ? DM + 8 : DM + 1;
    const int tile_t = rnd128(TILE * ldt * esz), tile_f = rnd128(TILE * LDS * 4);
    const int acc = rnd128(TILE * (DM + 4) * 4), xh = tc ? rnd128(TILE * LDX * esz) : 0;
    Plan p;
    int off = 0;
    p.o1 = off; off += tile_t;
    p.o2 = off; off += needs_dp(mode) ? tile_t : 0;
    p.i1 = off; off += tile_t;
    p.i2 = off; off += needs_i2(mode) ? tile_t : 0;
    p.st = off; off += tile_f;
    p.pt = off; off += needs_dp(mode) ? tile_f : 0;
    p.xh = off; off += needs_acc(mode) ? xh : 0;
    p.a1 = off; off += needs_acc(mode) ? acc : 0;
    p.a2 = off; off += mode == M_DKDV ? acc : 0;
    p.total = off;
    return p;
}

/* exp through the SFU's ex2 (relative error ~2^-22; exp(-inf) = 0) */
__device__ __forceinline__ float ex(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
}

/* rows [row0, row0 + 64) x channels [0, DM) of one problem's operand into a
 * shared tile; rows >= L and channels >= C are zero. 16-bit operands whose
 * rows are 16-byte aligned move 8 channels per load. */
template <typename T, int DM>
__device__ void load_tile(T *dst, const T *src, int64_t sn, int row0, int L, int C)
{
    constexpr int LDT = Tr<T>::tc ? DM + 8 : DM + 1;
    if constexpr (Tr<T>::tc) {
        const bool vec = ((uintptr_t)src & 15) == 0 && (sn & 7) == 0 && (C & 7) == 0;
        if (vec) {
            constexpr int CH = DM / 8; /* 16-byte chunks per row */
            for (int idx = threadIdx.x; idx < TILE * CH; idx += NT) {
                const int rr = idx / CH, c8 = (idx % CH) * 8, n = row0 + rr;
                uint4 x = make_uint4(0u, 0u, 0u, 0u);
                if (n < L && c8 < C) x = *(const uint4 *)(src + (int64_t)n * sn + c8);
                *(uint4 *)(dst + rr * LDT + c8) = x;
            }
            return;
        }
    }
    for (int idx = threadIdx.x; idx < TILE * DM; idx += NT) {
        const int rr = idx / DM, cc = idx % DM, n = row0 + rr;
        dst[rr * LDT + cc] = (n < L && cc < C) ? src[(int64_t)n * sn + cc] : Tr<T>::from(0.0f);
    }
}

/* S[r][c] = alpha * A_r . B_c for a 64 x 64 tile (A, B: 64 x DM tiles) */
template <typename T, int DM>
__device__ void score_tile(const T *A, const T *Bm, float *S, float alpha)
{
    constexpr int LDT = Tr<T>::tc ? DM + 8 : DM + 1;
    if constexpr (Tr<T>::tc) {
        const int w = threadIdx.x >> 5;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4];
#pragma unroll
        for (int cf = 0; cf < 4; cf++) wmma::fill_fragment(acc[cf], 0.0f);
#pragma unroll
        for (int k = 0; k < DM; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, A + (16 * w) * LDT + k, LDT);
#pragma unroll
            for (int cf = 0; cf < 4; cf++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, Bm + (16 * cf) * LDT + k, LDT);
                wmma::mma_sync(acc[cf], fa, fb, acc[cf]);
            }
        }
#pragma unroll
        for (int cf = 0; cf < 4; cf++) {
#pragma unroll
            for (int i = 0; i < acc[cf].num_elements; i++) acc[cf].x[i] *= alpha;
            wmma::store_matrix_sync(S + (16 * w) * LDS + 16 * cf, acc[cf], LDS, wmma::mem_row_major);
        }
    } else {
        const int r0 = (threadIdx.x >> 3) * 4, c0 = (threadIdx.x & 7) * 8;
        float acc[4][8];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;
        for (int k = 0; k < DM; k++) {
            float x[4], y[8];
#pragma unroll
            for (int i = 0; i < 4; i++) x[i] = Tr<T>::to(A[(r0 + i) * LDT + k]);
#pragma unroll
            for (int j = 0; j < 8; j++) y[j] = Tr<T>::to(Bm[(c0 + j) * LDT + k]);
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] = fmaf(x[i], y[j], acc[i][j]);
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) S[(r0 + i) * LDS + c0 + j] = alpha * acc[i][j];
    }
}

/* An accumulator Acc[64][DM] += X[64][64] Y[64][DM] kept in registers over a
 * pass (X: a float tile, stride LDS; Y: a T tile whose rows are the streamed
 * index): WMMA fragments (warp w owns rows 16w..16w+15; X is rounded to T
 * into Xh first) or, for fp32, each thread's half row (row tid/2). add() is
 * called by all threads after a barrier; the caller syncs before X, Xh or Y
 * change. store() writes it to a float tile (stride DM + 4). */
template <typename T, int DM, bool TC = Tr<T>::tc> struct Acc;
template <typename T, int DM> struct Acc<T, DM, true> {
    static constexpr int LDT = DM + 8, LDA = DM + 4;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> f[DM / 16];
    __device__ void zero()
    {
#pragma unroll
        for (int cf = 0; cf < DM / 16; cf++) wmma::fill_fragment(f[cf], 0.0f);
    }
    __device__ void add(const float *X, T *Xh, const T *Y)
    {
        for (int idx = threadIdx.x; idx < TILE * TILE / 4; idx += NT) {
            const int rr = idx / (TILE / 4), c4 = (idx % (TILE / 4)) * 4;
            const float4 x = *(const float4 *)(X + rr * LDS + c4);
            T *d = Xh + rr * LDX + c4;
            d[0] = Tr<T>::from(x.x); d[1] = Tr<T>::from(x.y); d[2] = Tr<T>::from(x.z); d[3] = Tr<T>::from(x.w);
        }
        __syncthreads();
        const int w = threadIdx.x >> 5;
#pragma unroll
        for (int k = 0; k < TILE; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, Xh + (16 * w) * LDX + k, LDX);
#pragma unroll
            for (int cf = 0; cf < DM / 16; cf++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
                wmma::load_matrix_sync(fb, Y + k * LDT + 16 * cf, LDT);
                wmma::mma_sync(f[cf], fa, fb, f[cf]);
            }
        }
    }
    __device__ void store(float *A) const
    {
        const int w = threadIdx.x >> 5;
#pragma unroll
        for (int cf = 0; cf < DM / 16; cf++)
            wmma::store_matrix_sync(A + (16 * w) * LDA + 16 * cf, f[cf], LDA, wmma::mem_row_major);
    }
};
template <typename T, int DM> struct Acc<T, DM, false> {
    static constexpr int LDT = DM + 1, LDA = DM + 4;
    float v[DM / 2];
    __device__ void zero()
    {
#pragma unroll
        for (int c = 0; c < DM / 2; c++) v[c] = 0.0f;
    }
    __device__ void add(const float *X, T *Xh, const T *Y)
    {
        (void)Xh;
        const int r = threadIdx.x >> 1, c0 = (threadIdx.x & 1) * (DM / 2);
        for (int k = 0; k < TILE; k++) {
            const float x = X[r * LDS + k];
#pragma unroll
            for (int c = 0; c < DM / 2; c++) v[c] = fmaf(x, Y[k * LDT + c0 + c], v[c]);
        }
    }
    __device__ void store(float *A) const
    {
        const int r = threadIdx.x >> 1, c0 = (threadIdx.x & 1) * (DM / 2);
#pragma unroll
        for (int c = 0; c < DM / 2; c++) A[r * LDA + c0 + c] = v[c];
    }
};

/* a thread's 32 entries of a float tile row (16-byte aligned) */
__device__ inline void get32(const float *p, float *v)
{
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const float4 x = ((const float4 *)p)[q];
        v[4 * q] = x.x; v[4 * q + 1] = x.y; v[4 * q + 2] = x.z; v[4 * q + 3] = x.w;
    }
}
__device__ inline void put32(float *p, const float *v)
{
#pragma unroll
    for (int q = 0; q < 8; q++) ((float4 *)p)[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
}

/* rows [o0, o0 + 64) of Acc (times s) to a problem's output rows < L,
 * channels < C */
template <typename T, int DM>
__device__ void store_rows(const float *Acc, float s, T *dst, int64_t sn, int o0, int L, int C)
{
    constexpr int LDA = DM + 4;
    for (int idx = threadIdx.x; idx < TILE * DM; idx += NT) {
        const int rr = idx / DM, cc = idx % DM, n = o0 + rr;
        if (n < L && cc < C) dst[(int64_t)n * sn + cc] = Tr<T>::from(s * Acc[rr * LDA + cc]);
    }
}

/* an online log-sum-exp (max, sum) */
struct Lse {
    float m, l;
};
__device__ inline Lse lse_merge(Lse a, Lse b)
{
    const float M = fmaxf(a.m, b.m);
    if (M == -INFINITY) return a;
    return {M, a.l * ex(a.m - M) + b.l * ex(b.m - M)};
}

__device__ inline int len_q(const bkc_args &a, int b) { return a.inl ? a.lq[b] : (a.qlen ? a.qlen[b] : a.Nq); }
__device__ inline int len_k(const bkc_args &a, int b) { return a.inl ? a.lk[b] : (a.klen ? a.klen[b] : a.Nk); }

template <typename T> __device__ inline const T *prob_base(const void *p, const int64_t *s, int b, int h)
{
    return (const T *)p + (int64_t)b * s[0] + (int64_t)h * s[1];
}

template <typename T, int DM, int MODE>
__global__ void __launch_bounds__(NT) pass_kernel(const bkc_args a, const int t)
{
    extern __shared__ __align__(128) unsigned char sm[];
    constexpr bool KM = kmajor(MODE);
    const Plan pl = plan_of(MODE, (int)sizeof(T), Tr<T>::tc, DM);
    T *O1 = (T *)(sm + pl.o1), *O2 = (T *)(sm + pl.o2), *I1 = (T *)(sm + pl.i1), *I2 = (T *)(sm + pl.i2);
    float *St = (float *)(sm + pl.st), *Pt = (float *)(sm + pl.pt);
    T *Xh = (T *)(sm + pl.xh);
    float *A1 = (float *)(sm + pl.a1), *A2 = (float *)(sm + pl.a2);

    const int p = blockIdx.y, b = p / a.H, h = p % a.H;
    const int Lq = len_q(a, b), Lk = len_k(a, b);
    if (Lq == 0 || Lk == 0) return;
    const int Lo = KM ? Lk : Lq, Li = KM ? Lq : Lk;
    const int o0 = blockIdx.x * TILE;
    if (o0 >= Lo) return;
    int Tp = a.iters[p];
    Tp = Tp < 1 ? 1 : (Tp > a.S ? a.S : Tp);
    if ((MODE == M_ROW_LSE || MODE == M_COL_LSE) && a.stopped[p]) return;
    if (MODE == M_BWD_FIRST && Tp == 1) return;
    if (MODE == M_REV_COL && t > Tp) return;
    if (MODE == M_REV_ROW && t >= Tp) return;

    float *hist = (float *)(a.hist + (int64_t)p * a.hist_stride);
    float *adj = a.adj ? a.adj + (int64_t)p * a.hist_len : nullptr;
#define HV(tt) (hist + bkc_hist_off(a.Nq, a.Nk, (tt)))
#define AV(tt) (adj + bkc_hist_off(a.Nq, a.Nk, (tt)))
    const float la = -logf((float)Lq), lb = -logf((float)Lk), lLq = logf((float)Lq);
    const int trow = (Tp & 1) ? Tp : Tp - 1; /* the last row step       */
    const int tcol = (Tp & 1) ? Tp - 1 : Tp; /* the last column step (0: none) */
    const float *fF = HV(trow);
    const float *gF = tcol >= 2 ? HV(tcol) : nullptr;
    const float *Dp = a.D ? a.D + (int64_t)p * a.Nq : nullptr;

    /* the operands: outer rows and streamed rows */
    const T *Xo1, *Xo2 = nullptr, *Xi1, *Xi2 = nullptr;
    int64_t so1, so2 = 0, si1, si2 = 0;
    int co1, co2 = 0, ci1, ci2 = 0;
    if (!KM) {
        Xo1 = prob_base<T>(a.q, a.sq, b, h); so1 = a.sq[2]; co1 = a.d;
        Xi1 = prob_base<T>(a.k, a.sk, b, h); si1 = a.sk[2]; ci1 = a.d;
        if (needs_dp(MODE)) { Xo2 = prob_base<T>(a.dout, a.sdo, b, h); so2 = a.sdo[2]; co2 = a.dv; }
        if (needs_i2(MODE)) { Xi2 = prob_base<T>(a.v, a.sv, b, h); si2 = a.sv[2]; ci2 = a.dv; }
    } else {
        Xo1 = prob_base<T>(a.k, a.sk, b, h); so1 = a.sk[2]; co1 = a.d;
        Xi1 = prob_base<T>(a.q, a.sq, b, h); si1 = a.sq[2]; ci1 = a.d;
        if (needs_dp(MODE)) { Xo2 = prob_base<T>(a.v, a.sv, b, h); so2 = a.sv[2]; co2 = a.dv; }
        if (needs_i2(MODE)) { Xi2 = prob_base<T>(a.dout, a.sdo, b, h); si2 = a.sdo[2]; ci2 = a.dv; }
    }

    const int r = threadIdx.x >> 1, hf = threadIdx.x & 1, orow = o0 + r;
    const bool ov = orow < Lo;
    load_tile<T, DM>(O1, Xo1, so1, o0, Lo, co1);
    if (needs_dp(MODE)) load_tile<T, DM>(O2, Xo2, so2, o0, Lo, co2);
    Acc<T, DM> acc1, acc2;
    if (needs_acc(MODE)) {
        acc1.zero();
        if (MODE == M_DKDV) acc2.zero();
    }

    /* the outer row's constants */
    float rowc = 0.0f;
    const float *bias = nullptr; /* a streamed-side potential */
    if (MODE == M_ROW_LSE) bias = t > 1 ? HV(t - 1) : nullptr;
    if (MODE == M_COL_LSE) bias = HV(t - 1);
    if (MODE == M_OUT || MODE == M_BWD_D) { rowc = ov ? fF[orow] + lLq : 0.0f; bias = gF; }
    if (MODE == M_BWD_FIRST) { rowc = ov && gF ? gF[orow] + lLq : 0.0f; bias = fF; }
    if (MODE == M_REV_COL) { rowc = ov ? HV(t - 1)[orow] - lb : 0.0f; bias = HV(t); }
    if (MODE == M_REV_ROW) { rowc = ov ? HV(t - 1)[orow] - la : 0.0f; bias = HV(t); }

    Lse run = {-INFINITY, 0.0f};
    float racc = 0.0f;

    for (int i0 = 0; i0 < Li; i0 += TILE) {
        __syncthreads();
        load_tile<T, DM>(I1, Xi1, si1, i0, Li, ci1);
        if (needs_i2(MODE)) load_tile<T, DM>(I2, Xi2, si2, i0, Li, ci2);
        __syncthreads();
        score_tile<T, DM>(O1, I1, St, a.alpha);
        if (needs_dp(MODE)) score_tile<T, DM>(O2, I2, Pt, 1.0f);
        __syncthreads();
        float *srow = St + r * LDS + hf * 32;
        float *prow = Pt + r * LDS + hf * 32;
        const int cb = i0 + hf * 32;
        /* this thread's live entries jlo <= jj < jhi: the problem's valid
         * block, less what causality masks */
        int jlo = 0, jhi = ov ? min(32, Li - cb) : 0;
        if (a.causal) {
            const int sh = Lk - Lq;
            if (!KM) jhi = min(jhi, orow + sh - cb + 1);
            else jlo = max(jlo, orow - sh - cb);
        }
#define LIVE(jj) ((jj) >= jlo && (jj) < jhi)
        float sv[32]; /* indexed by unrolled loops only: registers */
        if (MODE != M_DQ && MODE != M_DK && MODE != M_DV && MODE != M_DKDV) get32(srow, sv);
        if (MODE == M_ROW_LSE || MODE == M_COL_LSE) { /* each thread a running (max, sum) over its columns */
            float mt = -INFINITY;
#pragma unroll
            for (int jj = 0; jj < 32; jj++) {
                sv[jj] = LIVE(jj) ? sv[jj] + (bias ? bias[cb + jj] : 0.0f) : -INFINITY;
                mt = fmaxf(mt, sv[jj]);
            }
            if (mt > run.m) {
                run.l = run.m == -INFINITY ? 0.0f : run.l * ex(run.m - mt);
                run.m = mt;
            }
            if (mt != -INFINITY) {
                float s = 0.0f;
#pragma unroll
                for (int jj = 0; jj < 32; jj++) s += ex(sv[jj] - run.m);
                run.l += s;
            }
        } else if (MODE == M_OUT || MODE == M_BWD_D || MODE == M_BWD_FIRST) {
            float pv[32];
            if (MODE != M_OUT) get32(prow, pv);
#pragma unroll
            for (int jj = 0; jj < 32; jj++) {
                const float A = LIVE(jj) ? ex(sv[jj] + rowc + (bias ? bias[cb + jj] : 0.0f)) : 0.0f;
                if (MODE == M_OUT) sv[jj] = A;
                else if (MODE == M_BWD_D) racc += A * pv[jj];
                else /* first: T odd -> mu_{T-1} = sum A (dP - D); T even -> mu_T = sum A dP */
                    racc += (Tp & 1) ? A * (pv[jj] - (LIVE(jj) ? Dp[cb + jj] : 0.0f)) : A * pv[jj];
            }
            if (MODE == M_OUT) {
                put32(srow, sv);
                if (a.attn && ov) {
                    T *arow = (T *)a.attn + (int64_t)b * a.sa[0] + (int64_t)h * a.sa[1] + (int64_t)orow * a.sa[2];
                    for (int jj = 0; jj < 32 && cb + jj < Li; jj++) arow[cb + jj] = Tr<T>::from(sv[jj]);
                }
                __syncthreads();
                acc1.add(St, Xh, I2); /* O += A V */
            }
        } else if (MODE == M_REV_COL || MODE == M_REV_ROW) {
            const float *w = AV(t); /* mu_t (column step) or lam_t (row step), streamed side */
#pragma unroll
            for (int jj = 0; jj < 32; jj++)
                if (LIVE(jj)) racc += w[cb + jj] * ex(sv[jj] + rowc + bias[cb + jj]);
        } else { /* M_DQ, M_DKDV, M_DK, M_DV: the tile of Cbar (and of A), in place */
            for (int jj = 0; jj < 32; jj++) {
                float A = 0.0f, cbar = 0.0f;
                if (LIVE(jj)) {
                    const int i = KM ? cb + jj : orow, j = KM ? orow : cb + jj;
                    const float sc = srow[jj];
                    A = ex(sc + fF[i] + (gF ? gF[j] : 0.0f) + lLq);
                    if (MODE != M_DV) {
                        cbar = A * prow[jj];
                        for (int tt = 1; tt <= Tp; tt++) {
                            if (tt & 1) { /* row step: lam_t,i R^t_ij */
                                const float gp = tt > 1 ? HV(tt - 1)[j] : 0.0f;
                                cbar -= AV(tt)[i] * ex(sc + gp + HV(tt)[i] - la);
                            } else { /* column step: mu_t,j Q^t_ij */
                                cbar -= AV(tt)[j] * ex(sc + HV(tt - 1)[i] + HV(tt)[j] - lb);
                            }
                        }
                    }
                }
                if (MODE != M_DQ) srow[jj] = A;
                if (MODE != M_DV) prow[jj] = cbar;
            }
            __syncthreads();
            if (MODE == M_DQ || MODE == M_DK || MODE == M_DKDV) acc1.add(Pt, Xh, I1); /* Cbar K, Cbar^T Q */
            if (MODE == M_DKDV) {
                __syncthreads();
                acc2.add(St, Xh, I2); /* A^T dO */
            }
            if (MODE == M_DV) acc1.add(St, Xh, I2);
        }
#undef LIVE
    }
    __syncthreads();

    /* ---- results ---- */
    if (MODE == M_ROW_LSE || MODE == M_COL_LSE) {
        Lse o = {__shfl_xor_sync(0xffffffffu, run.m, 1), __shfl_xor_sync(0xffffffffu, run.l, 1)};
        const Lse tot = hf ? lse_merge(o, run) : lse_merge(run, o); /* the same order in both lanes */
        const float lse = tot.m + logf(tot.l);
        float err = 0.0f;
        if (ov) {
            const float val = (MODE == M_ROW_LSE ? la : lb) - lse;
            if (MODE == M_COL_LSE) {
                const float gprev = t > 2 ? HV(t - 2)[orow] : 0.0f;
                err = fabsf(ex(gprev - val) - 1.0f);
                if (!(err == err)) err = INFINITY;
            }
            if (hf == 0) HV(t)[orow] = val;
        }
        if (MODE == M_COL_LSE && a.tol > 0.0f) {
            __shared__ float red[NT / 32];
            for (int off = 16; off > 0; off >>= 1) err = fmaxf(err, __shfl_xor_sync(0xffffffffu, err, off));
            if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = err;
            __syncthreads();
            if (threadIdx.x == 0) {
                float e = red[0];
                for (int w = 1; w < NT / 32; w++) e = fmaxf(e, red[w]);
                a.err[(int64_t)p * a.nkb + blockIdx.x] = e;
            }
        }
    } else if (MODE == M_OUT) {
        acc1.store(A1);
        __syncthreads();
        if (a.out) store_rows<T, DM>(A1, 1.0f, (T *)a.out + (int64_t)b * a.so[0] + (int64_t)h * a.so[1], a.so[2], o0, Lo, a.dv);
    } else if (MODE == M_BWD_D || MODE == M_BWD_FIRST || MODE == M_REV_COL || MODE == M_REV_ROW) {
        const float o = __shfl_xor_sync(0xffffffffu, racc, 1);
        const float tot = hf ? o + racc : racc + o;
        if (ov && hf == 0) {
            if (MODE == M_BWD_D) {
                a.D[(int64_t)p * a.Nq + orow] = tot;
                if (Tp & 1) AV(Tp)[orow] = tot; /* lam_T = rowsum W */
            } else if (MODE == M_BWD_FIRST) {
                AV((Tp & 1) ? Tp - 1 : Tp)[orow] = tot;
            } else if (MODE == M_REV_COL) {
                AV(t - 1)[orow] = (t == Tp ? Dp[orow] : 0.0f) - tot;
            } else {
                AV(t - 1)[orow] = -tot;
            }
        }
    } else if (MODE == M_DQ) {
        acc1.store(A1);
        __syncthreads();
        store_rows<T, DM>(A1, a.alpha, (T *)a.dq + (int64_t)b * a.sdq[0] + (int64_t)h * a.sdq[1], a.sdq[2], o0, Lo, a.d);
    } else if (MODE == M_DK || MODE == M_DKDV) {
        acc1.store(A1);
        if (MODE == M_DKDV) acc2.store(A2);
        __syncthreads();
        store_rows<T, DM>(A1, a.alpha, (T *)a.dk + (int64_t)b * a.sdk[0] + (int64_t)h * a.sdk[1], a.sdk[2], o0, Lo, a.d);
        if (MODE == M_DKDV)
            store_rows<T, DM>(A2, 1.0f, (T *)a.dvv + (int64_t)b * a.sdv[0] + (int64_t)h * a.sdv[1], a.sdv[2], o0, Lo, a.dv);
    } else if (MODE == M_DV) {
        acc1.store(A1);
        __syncthreads();
        store_rows<T, DM>(A1, 1.0f, (T *)a.dvv + (int64_t)b * a.sdv[0] + (int64_t)h * a.sdv[1], a.sdv[2], o0, Lo, a.dv);
    }
#undef HV
#undef AV
}

/* ---- small kernels -------------------------------------------------------- */
__global__ void init_kernel(const bkc_args a)
{
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= a.B * a.H) return;
    const int b = p / a.H;
    const int live = len_q(a, b) > 0 && len_k(a, b) > 0;
    a.iters[p] = live ? a.S : 0;
    a.stopped[p] = live ? 0 : 1;
}

/* after column step t: a problem whose row step t - 1 met the tolerance stops
 * there */
__global__ void decide_kernel(const bkc_args a, int t)
{
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= a.B * a.H || a.stopped[p]) return;
    const int Lk = len_k(a, p / a.H);
    const int nb = (Lk + TILE - 1) / TILE;
    float e = 0.0f;
    for (int kb = 0; kb < nb; kb++) e = fmaxf(e, a.err[(int64_t)p * a.nkb + kb]);
    if (e < a.tol) {
        a.stopped[p] = 1;
        a.iters[p] = t - 1;
    }
}

__global__ void iters_from_tape(const bkc_args a)
{
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= a.B * a.H) return;
    const int32_t *h = (const int32_t *)(a.blk + (int64_t)p * a.blk_stride);
    a.iters[p] = h[2]; /* bki_block_header: Lq, Lk, steps[0] */
}

/* a forward's last writes: zero rows of the output past Lq (all of an empty
 * problem's), the extras f and g, the tape's block headers */
template <typename T> __global__ void finish_fwd(const bkc_args a)
{
    const int p = blockIdx.y, b = p / a.H, h = p % a.H;
    const int Lq = len_q(a, b), Lk = len_k(a, b), live = Lq > 0 && Lk > 0;
    const int Tp = live ? a.iters[p] : 0;
    const float *hist = (const float *)(a.hist + (int64_t)p * a.hist_stride);
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (a.out && n < a.Nq && (!live || n >= Lq)) {
        T *row = (T *)a.out + (int64_t)b * a.so[0] + (int64_t)h * a.so[1] + (int64_t)n * a.so[2];
        for (int c = 0; c < a.dv; c++) row[c] = Tr<T>::from(0.0f);
    }
    if (a.f_out && n < a.Nq) {
        const int tr = (Tp & 1) ? Tp : Tp - 1;
        a.f_out[(int64_t)p * a.Nq + n] = live && n < Lq ? hist[bkc_hist_off(a.Nq, a.Nk, tr) + n] : 0.0f;
    }
    if (a.g_out && n < a.Nk) {
        const int tc = (Tp & 1) ? Tp - 1 : Tp;
        a.g_out[(int64_t)p * a.Nk + n] = live && tc >= 2 && n < Lk ? hist[bkc_hist_off(a.Nq, a.Nk, tc) + n] : 0.0f;
    }
    if (a.blk && n == 0) {
        int32_t *hd = (int32_t *)(a.blk + (int64_t)p * a.blk_stride);
        hd[0] = Lq;
        hd[1] = Lk;
        hd[2] = Tp;
    }
}

/* the attention output: zero everywhere (the output pass writes the block) */
template <typename T> __global__ void zero_attn(const bkc_args a)
{
    const int p = blockIdx.y, b = p / a.H, h = p % a.H;
    const int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= (int64_t)a.Nq * a.Nk) return;
    const int i = (int)(n / a.Nk), j = (int)(n % a.Nk);
    ((T *)a.attn)[(int64_t)b * a.sa[0] + (int64_t)h * a.sa[1] + (int64_t)i * a.sa[2] + j] = Tr<T>::from(0.0f);
}

/* a backward's padded rows: dq past Lq, dk and dv past Lk (everything of an
 * empty problem) */
template <typename T> __global__ void finish_bwd(const bkc_args a)
{
    const int p = blockIdx.y, b = p / a.H, h = p % a.H;
    const int Lq = len_q(a, b), Lk = len_k(a, b), live = Lq > 0 && Lk > 0;
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < a.Nq && (!live || n >= Lq)) {
        T *row = (T *)a.dq + (int64_t)b * a.sdq[0] + (int64_t)h * a.sdq[1] + (int64_t)n * a.sdq[2];
        for (int c = 0; c < a.d; c++) row[c] = Tr<T>::from(0.0f);
    }
    if (n < a.Nk && (!live || n >= Lk)) {
        T *row = (T *)a.dk + (int64_t)b * a.sdk[0] + (int64_t)h * a.sdk[1] + (int64_t)n * a.sdk[2];
        for (int c = 0; c < a.d; c++) row[c] = Tr<T>::from(0.0f);
        T *rv = (T *)a.dvv + (int64_t)b * a.sdv[0] + (int64_t)h * a.sdv[1] + (int64_t)n * a.sdv[2];
        for (int c = 0; c < a.dv; c++) rv[c] = Tr<T>::from(0.0f);
    }
}

struct Bytes {
    unsigned char v[256];
};
__global__ void put_kernel(unsigned char *dst, const Bytes src, int n)
{
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src.v[i];
}

__global__ void fill_kernel(float *dst, float v, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = v;
}

/* ---- launching ------------------------------------------------------------- */
struct Launch {
    const bkc_args *a;
    cudaStream_t st;
    int P;
};

template <typename T, int DM, int MODE> cudaError_t pass(const Launch &L, int t)
{
    const Plan pl = plan_of(MODE, (int)sizeof(T), Tr<T>::tc, DM);
    auto k = pass_kernel<T, DM, MODE>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, pl.total);
    if (e != cudaSuccess) return e;
    const int outer = kmajor(MODE) ? L.a->Nk : L.a->Nq;
    const dim3 grid((unsigned)((outer + TILE - 1) / TILE), (unsigned)L.P);
    k<<<grid, NT, pl.total, L.st>>>(*L.a, t);
    return cudaGetLastError();
}

int smem_optin(void)
{
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return 0;
    return v;
}

#define TRY(x)                                                                                                         \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) return e_;                                                                              \
    } while (0)

template <typename T, int DM> cudaError_t forward_t(const bkc_args *a, cudaStream_t st)
{
    const Launch L = {a, st, a->B * a->H};
    const int P = L.P, S = a->S;
    init_kernel<<<(P + 127) / 128, 128, 0, st>>>(*a);
    TRY(cudaGetLastError());
    if (a->attn) {
        const int64_t nn = (int64_t)a->Nq * a->Nk;
        zero_attn<T><<<dim3((unsigned)((nn + 255) / 256), (unsigned)P), 256, 0, st>>>(*a);
        TRY(cudaGetLastError());
    }
    for (int t = 1; t <= S; t++) {
        if (t & 1) {
            TRY((pass<T, DM, M_ROW_LSE>(L, t)));
        } else {
            TRY((pass<T, DM, M_COL_LSE>(L, t)));
            if (a->tol > 0.0f) {
                decide_kernel<<<(P + 127) / 128, 128, 0, st>>>(*a, t);
                TRY(cudaGetLastError());
            }
        }
    }
    if (a->out || a->attn) TRY((pass<T, DM, M_OUT>(L, 0)));
    const int nmax = a->Nq > a->Nk ? a->Nq : a->Nk;
    finish_fwd<T><<<dim3((unsigned)((nmax + 127) / 128), (unsigned)P), 128, 0, st>>>(*a);
    return cudaGetLastError();
}

template <typename T, int DM> cudaError_t backward_t(const bkc_args *a, cudaStream_t st)
{
    const Launch L = {a, st, a->B * a->H};
    const int P = L.P;
    if (a->blk) {
        iters_from_tape<<<(P + 127) / 128, 128, 0, st>>>(*a);
        TRY(cudaGetLastError());
    }
    TRY((pass<T, DM, M_BWD_D>(L, 0)));
    TRY((pass<T, DM, M_BWD_FIRST>(L, 0)));
    for (int t = a->S; t >= 2; t--) {
        if (t & 1) TRY((pass<T, DM, M_REV_ROW>(L, t)));
        else TRY((pass<T, DM, M_REV_COL>(L, t)));
    }
    TRY((pass<T, DM, M_DQ>(L, 0)));
    /* one pass for dK and dV where its two register accumulators and its
     * shared memory fit (d, dv <= 64), else two */
    if (DM == 64 && plan_of(M_DKDV, (int)sizeof(T), Tr<T>::tc, DM).total <= smem_optin()) {
        TRY((pass<T, DM, M_DKDV>(L, 0)));
    } else {
        TRY((pass<T, DM, M_DK>(L, 0)));
        TRY((pass<T, DM, M_DV>(L, 0)));
    }
    const int nmax = a->Nq > a->Nk ? a->Nq : a->Nk;
    finish_bwd<T><<<dim3((unsigned)((nmax + 127) / 128), (unsigned)P), 128, 0, st>>>(*a);
    return cudaGetLastError();
}

template <typename T> cudaError_t forward_dm(const bkc_args *a, cudaStream_t st)
{
    const int dm = a->d > a->dv ? a->d : a->dv;
    return dm <= 64 ? forward_t<T, 64>(a, st) : forward_t<T, 128>(a, st);
}
template <typename T> cudaError_t backward_dm(const bkc_args *a, cudaStream_t st)
{
    const int dm = a->d > a->dv ? a->d : a->dv;
    return dm <= 64 ? backward_t<T, 64>(a, st) : backward_t<T, 128>(a, st);
}

} /* namespace */

extern "C" int bkc_forward(const bkc_args *a, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    switch (a->dtype) {
    case BKC_F32: return (int)forward_dm<float>(a, st);
    case BKC_BF16: return (int)forward_dm<__nv_bfloat16>(a, st);
    case BKC_F16: return (int)forward_dm<__half>(a, st);
    }
    return (int)cudaErrorInvalidValue;
}

extern "C" int bkc_backward(const bkc_args *a, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    switch (a->dtype) {
    case BKC_F32: return (int)backward_dm<float>(a, st);
    case BKC_BF16: return (int)backward_dm<__nv_bfloat16>(a, st);
    case BKC_F16: return (int)backward_dm<__half>(a, st);
    }
    return (int)cudaErrorInvalidValue;
}

extern "C" int bkc_put(void *dst, const void *src, size_t n, void *stream)
{
    if (n > sizeof(Bytes)) return (int)cudaErrorInvalidValue;
    Bytes b;
    memcpy(b.v, src, n);
    put_kernel<<<1, 64, 0, (cudaStream_t)stream>>>((unsigned char *)dst, b, (int)n);
    return (int)cudaGetLastError();
}

extern "C" int bkc_fill(float *dst, float value, size_t n, void *stream)
{
    if (n == 0) return 0;
    fill_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(dst, value, n);
    return (int)cudaGetLastError();
}

extern "C" size_t bkc_smem_need(int dtype, int dmax)
{
    const int DM = dmax <= 64 ? 64 : 128;
    const int esz = dtype == BKC_F32 ? 4 : 2;
    const bool tc = dtype != BKC_F32;
    int need = 0;
    /* every pass but the fused dK/dV one, which splits when it does not fit */
    for (int m = M_ROW_LSE; m <= M_DV; m++) {
        if (m == M_DKDV) continue;
        const int x = plan_of(m, esz, tc, DM).total;
        need = x > need ? x : need;
    }
    return (size_t)need;
}
