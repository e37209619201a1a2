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
#include <stdlib.h>
#include <string.h>

using namespace nvcuda;

namespace {

constexpr int TILE = BKC_TILE; /* 64 outer rows, 64 streamed columns      */
constexpr int NT = 128;        /* threads per block: 4 warps              */
constexpr int LDS = TILE + 4;  /* float tiles' row stride                 */
constexpr int LDX = TILE + 8;  /* converted (16-bit) tiles' row stride    */

enum Mode {
    M_ROW_LSE, M_COL_LSE, M_OUT,                             /* forward  */
    M_BWD_D, M_BWD_FIRST, M_REV_COL, M_REV_ROW, M_DQ, M_DKDV, M_DK, M_DV, /* backward */
    M_ROW_OUT, /* the last row step with the output (tensor-core passes only) */
    M_DV_FIRST /* dV and the first reverse weights in one k-major pass (tensor-core passes only) */
};

__host__ __device__ constexpr bool kmajor(int m)
{
    return m == M_COL_LSE || m == M_BWD_FIRST || m == M_REV_ROW || m == M_DKDV || m == M_DK || m == M_DV ||
           m == M_DV_FIRST;
}
/* the pass needs dP = dO V^T (outer and inner second operands) */
__host__ __device__ constexpr bool needs_dp(int m)
{
    return m == M_BWD_D || m == M_BWD_FIRST || m == M_DQ || m == M_DKDV || m == M_DK;
}
__host__ __device__ constexpr bool needs_i2(int m)
{
    return needs_dp(m) || m == M_OUT || m == M_DV || m == M_ROW_OUT || m == M_DV_FIRST;
}
__host__ __device__ constexpr bool needs_acc(int m)
{
    return m == M_OUT || m == M_DQ || m == M_DKDV || m == M_DK || m == M_DV || m == M_ROW_OUT || m == M_DV_FIRST;
}

/* ---- programmatic dependent launch (Hopper and later) ---------------------
 * Every kernel of a forward or backward begins with pdl_gate(): it waits
 * until the kernels before it in the stream have finished and their writes
 * are visible (griddepcontrol.wait: at once when the kernel was launched the
 * ordinary way). Launched with programmatic stream serialisation (launch()
 * below), a kernel is set up while its predecessor's last blocks finish
 * (each block lets it launch as it exits), and nothing is read or written
 * before the predecessor is complete, so the results are the same bits as
 * with ordinary launches. With a.pdl_early every block lets the next kernel
 * launch as soon as it starts: that kernel's blocks then wait on the SMs the
 * predecessor's last wave leaves free, packed onto the first SMs to free up
 * (measured on an H100: the forward at B*H = 32, N = 1024 takes 15 % longer,
 * since its passes are less than one wave and their blocks end up unevenly
 * spread; BK_CUDA_PDL=2 keeps it for the benchmarks). */
__device__ __forceinline__ void pdl_gate(const bkc_args &a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (a.pdl_early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#else
    (void)a;
#endif
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

/* What a block of a pass works on: its problem, the lengths, the half-steps
 * the problem ran and its potentials (shared by both kernel families). */
struct Prob {
    int p, b, h, Lq, Lk, Lo, Li, o0, Tp, trow, tcol;
    float *hist, *adj;
    float la, lb, lLq;
    const float *fF, *gF, *Dp;
};
/* false: the block has nothing to do in this pass (an empty problem, rows
 * past the length, a stopped problem, a step the problem did not run) */
template <int MODE> __device__ __forceinline__ bool prob_of(const bkc_args &a, int t, Prob &P)
{
    constexpr bool KM = kmajor(MODE);
    P.p = blockIdx.y;
    P.b = P.p / a.H;
    P.h = P.p % a.H;
    P.Lq = len_q(a, P.b);
    P.Lk = len_k(a, P.b);
    if (P.Lq == 0 || P.Lk == 0) return false;
    P.Lo = KM ? P.Lk : P.Lq;
    P.Li = KM ? P.Lq : P.Lk;
    P.o0 = blockIdx.x * TILE;
    if (P.o0 >= P.Lo) return false;
    const int it = a.iters[P.p];
    P.Tp = it < 1 ? 1 : (it > a.S ? a.S : it);
    if ((MODE == M_ROW_LSE || MODE == M_COL_LSE || MODE == M_ROW_OUT) && a.stopped[P.p]) return false;
    if (MODE == M_BWD_FIRST && P.Tp == 1) return false;
    if (MODE == M_REV_COL && t > P.Tp) return false;
    if (MODE == M_REV_ROW && t >= P.Tp) return false;
    P.hist = (float *)(a.hist + (int64_t)P.p * a.hist_stride);
    P.adj = a.adj ? a.adj + (int64_t)P.p * a.hist_len : nullptr;
    P.la = -logf((float)P.Lq);
    P.lb = -logf((float)P.Lk);
    P.lLq = logf((float)P.Lq);
    P.trow = (P.Tp & 1) ? P.Tp : P.Tp - 1; /* the last row step              */
    P.tcol = (P.Tp & 1) ? P.Tp - 1 : P.Tp; /* the last column step (0: none) */
    P.fF = P.hist + bkc_hist_off(a.Nq, a.Nk, P.trow);
    P.gF = P.tcol >= 2 ? P.hist + bkc_hist_off(a.Nq, a.Nk, P.tcol) : nullptr;
    P.Dp = a.D ? a.D + (int64_t)P.p * a.Nq : nullptr;
    return true;
}

/* A pass's operands: the outer rows (Q or K, and dO or V where dP is
 * needed) and the streamed rows (K or Q, and V or dO), with their row
 * strides and channel counts. */
template <typename T> struct Ops {
    const T *o1, *o2, *i1, *i2;
    int64_t so1, so2, si1, si2;
    int co1, co2, ci1, ci2;
};
template <typename T, int MODE> __device__ __forceinline__ Ops<T> ops_of(const bkc_args &a, int b, int h)
{
    Ops<T> X = {nullptr, nullptr, nullptr, nullptr, 0, 0, 0, 0, 0, 0, 0, 0};
    if (!kmajor(MODE)) {
        X.o1 = prob_base<T>(a.q, a.sq, b, h); X.so1 = a.sq[2]; X.co1 = a.d;
        X.i1 = prob_base<T>(a.k, a.sk, b, h); X.si1 = a.sk[2]; X.ci1 = a.d;
        if (needs_dp(MODE)) { X.o2 = prob_base<T>(a.dout, a.sdo, b, h); X.so2 = a.sdo[2]; X.co2 = a.dv; }
        if (needs_i2(MODE)) { X.i2 = prob_base<T>(a.v, a.sv, b, h); X.si2 = a.sv[2]; X.ci2 = a.dv; }
    } else {
        X.o1 = prob_base<T>(a.k, a.sk, b, h); X.so1 = a.sk[2]; X.co1 = a.d;
        X.i1 = prob_base<T>(a.q, a.sq, b, h); X.si1 = a.sq[2]; X.ci1 = a.d;
        if (needs_dp(MODE)) { X.o2 = prob_base<T>(a.v, a.sv, b, h); X.so2 = a.sv[2]; X.co2 = a.dv; }
        if (needs_i2(MODE)) { X.i2 = prob_base<T>(a.dout, a.sdo, b, h); X.si2 = a.sdo[2]; X.ci2 = a.dv; }
    }
    return X;
}

template <typename T, int DM, int MODE>
__global__ void __launch_bounds__(NT) pass_kernel(const bkc_args a, const int t)
{
    pdl_gate(a);
    extern __shared__ __align__(128) unsigned char sm[];
    constexpr bool KM = kmajor(MODE);
    const Plan pl = plan_of(MODE, (int)sizeof(T), Tr<T>::tc, DM);
    T *O1 = (T *)(sm + pl.o1), *O2 = (T *)(sm + pl.o2), *I1 = (T *)(sm + pl.i1), *I2 = (T *)(sm + pl.i2);
    float *St = (float *)(sm + pl.st), *Pt = (float *)(sm + pl.pt);
    T *Xh = (T *)(sm + pl.xh);
    float *A1 = (float *)(sm + pl.a1), *A2 = (float *)(sm + pl.a2);

    Prob P;
    if (!prob_of<MODE>(a, t, P)) return;
    const int p = P.p, b = P.b, h = P.h, Lq = P.Lq, Lk = P.Lk, Lo = P.Lo, Li = P.Li, o0 = P.o0, Tp = P.Tp;
    float *hist = P.hist, *adj = P.adj;
#define HV(tt) (hist + bkc_hist_off(a.Nq, a.Nk, (tt)))
#define AV(tt) (adj + bkc_hist_off(a.Nq, a.Nk, (tt)))
    const float la = P.la, lb = P.lb, lLq = P.lLq;
    const float *fF = P.fF, *gF = P.gF, *Dp = P.Dp;

    /* the operands: outer rows and streamed rows */
    const Ops<T> X = ops_of<T, MODE>(a, b, h);
    const T *Xo1 = X.o1, *Xo2 = X.o2, *Xi1 = X.i1, *Xi2 = X.i2;
    const int64_t so1 = X.so1, so2 = X.so2, si1 = X.si1, si2 = X.si2;
    const int co1 = X.co1, co2 = X.co2, ci1 = X.ci1, ci2 = X.ci2;

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

/* ---- tensor-core passes (bf16 / fp16): warp-level mma.sync --------------
 *
 * The same passes as pass_kernel, with every tile kept in registers: a warp
 * owns 16 outer rows, computes its 16 x 64 score tile with m16n8k16 MMAs
 * whose accumulator fragments it exponentiates and reduces in place, and
 * feeds those fragments (rounded to T) straight back to the tensor cores as
 * the A operand of the products P V, Cbar K, Cbar^T Q and A^T dO. Streamed
 * tiles arrive by cp.async, double buffered. Entry (r, c) of a fragment
 * f[nt][e] is row g + 8 (e >> 1), column 8 nt + 2 q + (e & 1), with
 * g = lane / 4, q = lane % 4. Exponentials are taken in base 2 (scores and
 * potentials pre-multiplied by log2 e); a masked entry's scaled score is -inf,
 * so that every exponential of it is exactly 0. Row reductions: each thread
 * sums its own columns in a fixed order, the four threads of a row combine by
 * xor shuffles (commutative: every lane holds the same bits). With an odd
 * S and no tolerance the last row step is always M_ROW_OUT, writing the
 * output or not (with_out), so that the potentials of a forward and of a
 * backward recomputing its tape come from the same code, bitwise. */
namespace tc {

constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ uint32_t saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void ldsm4(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm4t(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
template <typename T> __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma<__nv_bfloat16>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma<__half>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* two floats as one register of T (lo in the low half) */
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi)
{
    const __half2 v = __floats2half2_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}
__device__ __forceinline__ void cpa16(void *dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(saddr(dst)), "l"(src), "r"(ok ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cpa_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cpa_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* a 16-bit shared tile's element (r, c): rows of DM elements, unpadded, whose
 * 16-byte chunks are permuted by the row (chunk c / 8 goes to (c / 8) ^ (r &
 * 7)), so that the 8 rows an ldmatrix phase reads at one column fall in 8
 * different bank groups. (A padded row of DM + 8 elements does the same at
 * 1 KiB more per tile: the gradient passes' six tiles would then not fit 4
 * blocks in an SM.) */
template <int DM> __device__ __forceinline__ int swz(int r, int c)
{
    return r * DM + (((c >> 3) ^ (r & 7)) << 3) + (c & 7);
}

/* rows [row0, row0 + 64) of an operand into a shared tile (swz; zero past L
 * rows and C channels): by cp.async where the rows are 16-byte aligned (the
 * caller commits and waits), else by plain loads */
template <typename T, int DM>
__device__ void fetch(T *dst, const T *src, int64_t sn, int row0, int L, int C, bool vec)
{
    constexpr int CH = DM / 8, RPI = NT / CH; /* rows per round */
    if (vec) {
        const int rr = threadIdx.x / CH, c8 = (threadIdx.x % CH) * 8;
        const bool cok = c8 < C;
        const T *s = src + (int64_t)(row0 + rr) * sn + c8;
#pragma unroll
        for (int k = 0; k < TILE / RPI; k++) {
            const bool ok = cok && row0 + rr + k * RPI < L;
            cpa16(dst + swz<DM>(rr + k * RPI, c8), ok ? (const void *)(s + (int64_t)k * RPI * sn) : (const void *)src, ok);
        }
    } else {
        for (int idx = threadIdx.x; idx < TILE * DM; idx += NT) {
            const int rr = idx / DM, cc = idx % DM, n = row0 + rr;
            dst[swz<DM>(rr, cc)] = (n < L && cc < C) ? src[(int64_t)n * sn + cc] : Tr<T>::from(0.0f);
        }
    }
}
__host__ __device__ inline bool vec_ok(const void *p, int64_t sn, int C)
{
    return ((uintptr_t)p & 15) == 0 && (sn & 7) == 0 && (C & 7) == 0;
}

/* shared memory: outer tiles (1, 2 with dP), streamed tiles double buffered */
struct TPlan {
    int tile, o1, o2, i1, i2, cv, fc, total;
};
constexpr int NCV = 2;   /* streamed-side vectors staged per tile            */
constexpr int FCAP = 16; /* gradient passes: the factors of up to FCAP steps
                            staged in shared memory (beyond: global loads)  */
/* the steps whose factors a gradient pass stages (S between 1 and FCAP) */
__host__ __device__ inline int fac_steps(int S) { return S < 1 ? 1 : S > FCAP ? FCAP : S; }
__host__ __device__ inline TPlan tplan(int mode, int DM, int S)
{
    TPlan p;
    p.tile = rnd128(TILE * DM * 2);
    int off = 0;
    p.o1 = off; off += p.tile;
    p.o2 = off; off += needs_dp(mode) ? p.tile : 0;
    p.i1 = off; off += 2 * p.tile;
    p.i2 = off; off += needs_i2(mode) ? 2 * p.tile : 0;
    p.cv = off; off += 2 * NCV * TILE * 4; /* [buffer][vector][64] floats */
    const bool grad = mode == M_DQ || mode == M_DK || mode == M_DV || mode == M_DKDV;
    p.fc = off; off += grad ? 3 * fac_steps(S) * TILE * 4 : 0; /* [outer | buffer 0 | buffer 1][step][64] */
    p.total = off;
    return p;
}

/* a warp's A fragments of its 16 rows of an outer tile, k-chunk kk */
template <int DM> __device__ __forceinline__ void outer_frag(uint32_t f[4], const void *tile, int w, int kk)
{
    const int lane = threadIdx.x & 31;
    const char *p = (const char *)tile + 2 * swz<DM>(16 * w + (lane & 7) + ((lane >> 3) & 1) * 8, kk * 16 + ((lane >> 4) & 1) * 8);
    ldsm4(f, saddr(p));
}

/* s[8][4] = X Y^T for the warp's 16 rows against a 64-row streamed tile:
 * X from registers (xf, DM <= 64) or from the outer tile */
template <typename T, int DM, bool KEEP>
__device__ __forceinline__ void scores(float s[8][4], const uint32_t (*xf)[4], const T *X, const T *Y, int w)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DM / 16; kk++) {
        uint32_t xa[4];
        if constexpr (KEEP) {
            xa[0] = xf[kk][0]; xa[1] = xf[kk][1]; xa[2] = xf[kk][2]; xa[3] = xf[kk][3];
        } else {
            outer_frag<DM>(xa, X, w, kk);
        }
#pragma unroll
        for (int np = 0; np < 4; np++) {
            uint32_t b[4];
            ldsm4(b, saddr(Y + swz<DM>(np * 16 + (lane & 7) + ((lane >> 4) & 1) * 8, kk * 16 + ((lane >> 3) & 1) * 8)));
            mma<T>(s[2 * np], xa, b[0], b[1]);
            mma<T>(s[2 * np + 1], xa, b[2], b[3]);
        }
    }
}

/* acc[DM/8][4] += P Y: P the warp's 16 x 64 fragments (rounded to T), Y a
 * streamed tile whose rows are P's columns */
template <typename T, int DM>
__device__ __forceinline__ void accumulate(float (*acc)[4], const float p[8][4], const T *Y)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
        uint32_t pa[4];
        pa[0] = pack2<T>(p[2 * kc][0], p[2 * kc][1]);
        pa[1] = pack2<T>(p[2 * kc][2], p[2 * kc][3]);
        pa[2] = pack2<T>(p[2 * kc + 1][0], p[2 * kc + 1][1]);
        pa[3] = pack2<T>(p[2 * kc + 1][2], p[2 * kc + 1][3]);
#pragma unroll
        for (int nc = 0; nc < DM / 16; nc++) {
            uint32_t b[4];
            ldsm4t(b, saddr(Y + swz<DM>(kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, nc * 16 + ((lane >> 4) & 1) * 8)));
            mma<T>(acc[2 * nc], pa, b[0], b[1]);
            mma<T>(acc[2 * nc + 1], pa, b[2], b[3]);
        }
    }
}

/* an accumulator's rows (r0 and r0 + 8 of this thread) times s into a
 * problem's rows < L, channels < C */
template <typename T, int DM>
__device__ void store_acc(const float (*acc)[4], float s0, float s1, T *dst, int64_t sn, int r0, int L, int C)
{
    const int q = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < DM / 8; nt++) {
        const int c = nt * 8 + 2 * q;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int n = r0 + (e >> 1) * 8, cc = c + (e & 1);
            if (n < L && cc < C) dst[(int64_t)n * sn + cc] = Tr<T>::from((e >> 1 ? s1 : s0) * acc[nt][e]);
        }
    }
}

/* the gradient passes' factor vectors (fac_kernel) are padded to a multiple
 * of 4 floats, for float2 loads */
__host__ __device__ inline int fac_pad(int n) { return (n + 3) & ~3; }

/* a potential as an additive constant: +inf (a row or column with no live
 * entry) becomes 0, so that a masked entry (-inf) never meets +inf */
__device__ __forceinline__ float fin(float x) { return x == INFINITY ? 0.0f : x; }

template <typename T, int DM, int MODE, bool FAST>
__device__ __forceinline__ void tc_body(const bkc_args &a, const int t, const int with_out)
{
    extern __shared__ __align__(128) unsigned char sm[];
    constexpr bool KM = kmajor(MODE), DP = needs_dp(MODE), I2 = needs_i2(MODE);
    constexpr bool LSE = MODE == M_ROW_LSE || MODE == M_COL_LSE || MODE == M_ROW_OUT;
    constexpr bool RED = MODE == M_BWD_D || MODE == M_BWD_FIRST || MODE == M_REV_COL || MODE == M_REV_ROW;
    constexpr bool GRAD = MODE == M_DQ || MODE == M_DK || MODE == M_DV || MODE == M_DKDV;
    /* outer fragments in registers (else reloaded from shared memory per
     * tile): d <= 64 outside the gradient passes, whose accumulators need
     * the registers */
    constexpr bool KEEP = DM <= 64 && !GRAD;
    constexpr bool ACC2 = MODE == M_DKDV;
    const TPlan pl = tplan(MODE, DM, a.S);
    T *O1 = (T *)(sm + pl.o1), *O2 = (T *)(sm + pl.o2);

    Prob P;
    if (!prob_of<MODE>(a, t, P)) return;
    const int p = P.p, b = P.b, h = P.h, Lq = P.Lq, Lk = P.Lk, Lo = P.Lo, Li = P.Li, o0 = P.o0, Tp = P.Tp;
    float *hist = P.hist, *adj = P.adj;
#define HV(tt) (hist + bkc_hist_off(a.Nq, a.Nk, (tt)))
#define AV(tt) (adj + bkc_hist_off(a.Nq, a.Nk, (tt)))
    const float la = P.la, lb = P.lb, lLq = P.lLq;
    const float alpha2 = a.alpha * LOG2E;
    const float *fF = P.fF, *gF = P.gF, *Dp = P.Dp;
    /* the gradient passes' half-step terms by rank-one factors (fac_kernel) */
    /* a gradient pass runs as two kernels, one for the problems whose terms
     * factorise (fac_kernel) and one for the others: each leaves the other's
     * (one kernel holding both bodies would take 168 registers and spill in
     * the dQ pass, where the factorised body alone takes 164 and the exact
     * one 138) */
    if (GRAD && (FAST != (a.fac && a.fact[p]))) return;
    constexpr bool fast = GRAD && FAST;
    constexpr bool EXACT = GRAD && !FAST; /* keeps the scaled score apart */

    const Ops<T> X = ops_of<T, MODE>(a, b, h);
    const T *Xo1 = X.o1, *Xo2 = X.o2, *Xi1 = X.i1, *Xi2 = X.i2;
    const int64_t so1 = X.so1, so2 = X.so2, si1 = X.si1, si2 = X.si2;
    const int co1 = X.co1, co2 = X.co2, ci1 = X.ci1, ci2 = X.ci2;
    const bool vo1 = vec_ok(Xo1, so1, co1), vo2 = DP && vec_ok(Xo2, so2, co2);
    const bool vi1 = vec_ok(Xi1, si1, ci1), vi2 = I2 && vec_ok(Xi2, si2, ci2);
    const bool i2 = I2 && (MODE != M_ROW_OUT || with_out); /* V is needed */

    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int rw[2] = {o0 + 16 * w + g, o0 + 16 * w + g + 8}; /* this thread's outer rows */
    const bool rv[2] = {rw[0] < Lo, rw[1] < Lo};

    /* the streamed range: causal masking skips whole tiles */
    const int sh = Lk - Lq;
    int ib = 0, ie = Li;
    if (a.causal) {
        if (!KM) ie = max(0, min(Li, o0 + TILE + sh));
        else ib = (max(0, o0 - sh) / TILE) * TILE;
    }

    fetch<T, DM>(O1, Xo1, so1, o0, Lo, co1, vo1);
    if (DP) fetch<T, DM>(O2, Xo2, so2, o0, Lo, co2, vo2);
    auto B1 = [&](int s) { return (T *)(sm + pl.i1 + s * pl.tile); };
    auto B2 = [&](int s) { return (T *)(sm + pl.i2 + s * pl.tile); };
    auto CV = [&](int s, int v) { return (float *)(sm + pl.cv) + (s * NCV + v) * TILE; };
    if (ib < ie) {
        fetch<T, DM>(B1(0), Xi1, si1, ib, Li, ci1, vi1);
        if (i2) fetch<T, DM>(B2(0), Xi2, si2, ib, Li, ci2, vi2);
    }
    cpa_commit();
    uint32_t xf1[KEEP ? DM / 16 : 1][4], xf2[KEEP && DP ? DM / 16 : 1][4];
    if (KEEP) {
        cpa_wait<0>();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < DM / 16; kk++) {
            outer_frag<DM>(xf1[kk], O1, w, kk);
            if (DP) outer_frag<DM>(xf2[KEEP && DP ? kk : 0], O2, w, kk);
        }
    }

    /* the outer rows' constants (natural units): rowc, and the streamed-side
     * potential added to every entry (bias) */
    float rowc[2] = {0.0f, 0.0f};
    const float *bias = nullptr;
    if (MODE == M_ROW_LSE || MODE == M_ROW_OUT) bias = t > 1 ? HV(t - 1) : nullptr;
    if (MODE == M_COL_LSE) bias = HV(t - 1);
    for (int k = 0; k < 2; k++) {
        const int o = rw[k];
        if (!rv[k]) continue;
        if (MODE == M_OUT || MODE == M_BWD_D) rowc[k] = fin(fF[o]) + lLq;
        if (MODE == M_BWD_FIRST || MODE == M_DV_FIRST) rowc[k] = (gF ? fin(gF[o]) : 0.0f) + lLq;
        if (MODE == M_REV_COL) rowc[k] = fin(HV(t - 1)[o]) - lb;
        if (MODE == M_REV_ROW) rowc[k] = fin(HV(t - 1)[o]) - la;
        if (GRAD) rowc[k] = fin(KM ? (gF ? gF[o] : 0.0f) : fF[o]) + lLq;
    }
    if (MODE == M_BWD_D || MODE == M_OUT) bias = gF;
    if (MODE == M_BWD_FIRST || MODE == M_DV_FIRST) bias = fF;
    if (MODE == M_REV_COL || MODE == M_REV_ROW) bias = HV(t);
    if (GRAD) bias = KM ? fF : gF;
    const float rc2[2] = {rowc[0] * LOG2E, rowc[1] * LOG2E};

    /* the streamed side's vectors, staged in shared memory with each tile:
     * the potential added to every entry (log2 units, 0 past Li) and the
     * reduced weight (D, first pass with T odd; the streamed adjoint, reverse
     * passes) */
    const float *wvec = (MODE == M_REV_COL || MODE == M_REV_ROW) ? AV(t)
                        : ((MODE == M_BWD_FIRST || MODE == M_DV_FIRST) && (Tp & 1)) ? Dp : nullptr;
    /* the factorised gradient's vectors (fac_kernel): step tt's outer-side
     * and streamed-side factors; staged in shared memory for Tp <= FCAP (the
     * outer side once, the streamed side with each tile) */
    const int nqp = fac_pad(a.Nq), nkp = fac_pad(a.Nk);
    const float *F = fast ? a.fac + (int64_t)p * a.S * (nqp + nkp) : nullptr;
    auto fac_side = [&](int tt, bool outer) {
        const float *U = F + (int64_t)(tt - 1) * (nqp + nkp);
        return (outer != KM) ? U : U + nqp; /* U: the query side, V: the key side */
    };
    const bool fstaged = fast && Tp <= FCAP;
    auto FO = [&](int tt) { return (float *)(sm + pl.fc) + (tt - 1) * TILE; };
    const int fs = fac_steps(a.S);
    auto FC = [&](int s, int tt) { return (float *)(sm + pl.fc) + ((1 + s) * fs + tt - 1) * TILE; };
    if (fstaged)
        for (int idx = threadIdx.x; idx < Tp * TILE; idx += NT) {
            const int tt = 1 + idx / TILE, r = idx % TILE;
            FO(tt)[r] = o0 + r < Lo ? fac_side(tt, true)[o0 + r] : 0.0f;
        }
    auto stage = [&](int s, int j0) {
        if (threadIdx.x < TILE) {
            const int j = j0 + threadIdx.x;
            const bool ok = j < Li;
            CV(s, 0)[threadIdx.x] = bias && ok ? fin(bias[j]) * LOG2E : 0.0f;
            CV(s, 1)[threadIdx.x] = wvec && ok ? wvec[j] : 0.0f;
        }
        if (fstaged)
            for (int idx = threadIdx.x; idx < Tp * TILE; idx += NT) {
                const int tt = 1 + idx / TILE, jj = idx % TILE;
                FC(s, tt)[jj] = j0 + jj < Li ? fac_side(tt, false)[j0 + jj] : 0.0f;
            }
    };
    if (ib < ie) stage(0, ib);

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* LSE: log2 units */
    float racc[2] = {0.0f, 0.0f};
    float acc[(MODE == M_ROW_OUT || MODE == M_OUT || MODE == M_DV_FIRST || GRAD) ? DM / 8 : 1][4];
    float acc2[ACC2 ? DM / 8 : 1][4];
#pragma unroll
    for (int nt = 0; nt < (int)(sizeof acc / sizeof acc[0]); nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
    for (int nt = 0; nt < (int)(sizeof acc2 / sizeof acc2[0]); nt++)
        acc2[nt][0] = acc2[nt][1] = acc2[nt][2] = acc2[nt][3] = 0.0f;

    for (int i0 = ib, it = 0; i0 < ie; i0 += TILE, it++) {
        const int cur = it & 1;
        if (i0 + TILE < ie) {
            fetch<T, DM>(B1(cur ^ 1), Xi1, si1, i0 + TILE, Li, ci1, vi1);
            if (i2) fetch<T, DM>(B2(cur ^ 1), Xi2, si2, i0 + TILE, Li, ci2, vi2);
            cpa_commit();
            stage(cur ^ 1, i0 + TILE);
            cpa_wait<1>();
        } else {
            cpa_wait<0>();
        }
        __syncthreads();
        const T *Y1 = B1(cur), *Y2 = B2(cur);

        float s[8][4], dp[DP ? 8 : 1][4];
        scores<T, DM, KEEP>(s, xf1, O1, Y1, w);
        if constexpr (DP) scores<T, DM, KEEP>(dp, xf2, O2, Y2, w);

        /* the streamed side's potential, log2 units (0 past Li) */
        float cb[8][2];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            const float2 v = *(const float2 *)(CV(cur, 0) + nt * 8 + 2 * q);
            cb[nt][0] = v.x;
            cb[nt][1] = v.y;
        }
        /* every entry's exponent (log2 units) in one FMA: the scaled score
         * plus the potentials (the row's too, except in a log-sum-exp pass);
         * the exact gradient pass keeps the scaled score alone */
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if constexpr (EXACT) s[nt][e] *= alpha2;
                else if constexpr (LSE) s[nt][e] = fmaf(s[nt][e], alpha2, cb[nt][e & 1]);
                else s[nt][e] = fmaf(s[nt][e], alpha2, cb[nt][e & 1] + rc2[e >> 1]);
            }
        /* mask what lies past the streamed length or across the causal
         * diagonal (edge tiles only) */
        if (i0 + TILE > Li || (a.causal && (KM ? i0 < o0 + TILE - 1 - sh : i0 + TILE - 1 > o0 + sh))) {
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = i0 + nt * 8 + 2 * q + (e & 1), o = rw[e >> 1];
                    bool live = j < Li;
                    if (a.causal) live = live && (KM ? j >= o - sh : j <= o + sh);
                    if (!live) s[nt][e] = -INFINITY;
                }
        }

        if constexpr (LSE) {
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
            float ref[2], scl[2];
#pragma unroll
            for (int k = 0; k < 2; k++) {
                mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 1));
                mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 2));
                const float mn = fmaxf(m[k], mx[k]);
                ref[k] = mn == -INFINITY ? 0.0f : mn;
                scl[k] = ex2(__fsub_rn(m[k], ref[k]));
                m[k] = mn;
            }
            float ts[2] = {0.0f, 0.0f};
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[nt][e] = ex2(__fsub_rn(s[nt][e], ref[e >> 1]));
                    ts[e >> 1] = __fadd_rn(ts[e >> 1], s[nt][e]);
                }
            l[0] = __fmaf_rn(l[0], scl[0], ts[0]);
            l[1] = __fmaf_rn(l[1], scl[1], ts[1]);
            if (MODE == M_ROW_OUT && with_out) {
#pragma unroll
                for (int nt = 0; nt < DM / 8; nt++) {
                    acc[nt][0] *= scl[0]; acc[nt][1] *= scl[0];
                    acc[nt][2] *= scl[1]; acc[nt][3] *= scl[1];
                }
                accumulate<T, DM>(acc, s, Y2);
            }
        } else if constexpr (MODE == M_OUT) {
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] = ex2(s[nt][e]);
            if (a.attn) {
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int j = i0 + nt * 8 + 2 * q + (e & 1), o = rw[e >> 1];
                        if (o < Lo && j < Li)
                            ((T *)a.attn)[(int64_t)b * a.sa[0] + (int64_t)h * a.sa[1] + (int64_t)o * a.sa[2] + j] =
                                Tr<T>::from(s[nt][e]);
                    }
            }
            accumulate<T, DM>(acc, s, Y2);
        } else if constexpr (MODE == M_DV_FIRST) {
            /* A, its weighted sum against D (T odd) and dV += A^T dO, with A
             * fed to the tensor cores as two T parts (A = hi + lo to ~2^-18
             * for bf16): the weights below take V_j . dV_j, a difference
             * that cancels where A is sharp (small eps), so dV must hold A's
             * products beyond T's rounding */
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e2 = 0; e2 < 2; e2++) {
                    const float cw = CV(cur, 1)[nt * 8 + 2 * q + e2];
#pragma unroll
                    for (int k = 0; k < 2; k++) {
                        const int e = 2 * k + e2;
                        s[nt][e] = ex2(s[nt][e]);
                        racc[k] = fmaf(cw, s[nt][e], racc[k]);
                    }
                }
            accumulate<T, DM>(acc, s, Y2);
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] -= Tr<T>::to(Tr<T>::from(s[nt][e]));
            accumulate<T, DM>(acc, s, Y2);
        } else if constexpr (RED) {
            /* the reduced weight: dP (D, first) or the streamed adjoint */
            const bool sub = MODE == M_BWD_FIRST && (Tp & 1);
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e2 = 0; e2 < 2; e2++) {
                    const float cw = CV(cur, 1)[nt * 8 + 2 * q + e2];
#pragma unroll
                    for (int k = 0; k < 2; k++) {
                        const int e = 2 * k + e2;
                        const float A = ex2(s[nt][e]);
                        if (MODE == M_BWD_D) racc[k] += A * dp[DP ? nt : 0][e];
                        else if (MODE == M_BWD_FIRST) racc[k] += sub ? A * (dp[DP ? nt : 0][e] - cw) : A * dp[DP ? nt : 0][e];
                        else racc[k] += cw * A;
                    }
                }
        } else if constexpr (fast) { /* GRAD, factorised: one exponential per entry */
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] = ex2(s[nt][e]);
            if constexpr (DP) {
                /* Cbar = A .* (dP - sum_t U_t V_t^T) */
                for (int tt = 1; tt <= Tp; tt++) {
                    const float *ov = fac_side(tt, true), *cv = fac_side(tt, false);
                    float o0v, o1v;
                    if (fstaged) {
                        o0v = FO(tt)[16 * w + g];
                        o1v = FO(tt)[16 * w + g + 8];
                    } else {
                        o0v = rv[0] ? ov[rw[0]] : 0.0f;
                        o1v = rv[1] ? ov[rw[1]] : 0.0f;
                    }
#pragma unroll
                    for (int nt = 0; nt < 8; nt++) {
                        const int j = i0 + nt * 8 + 2 * q; /* even: 8-byte aligned, zero past Li */
                        const float2 c = fstaged ? *(const float2 *)(FC(cur, tt) + nt * 8 + 2 * q)
                                         : j < Li ? *(const float2 *)(cv + j) : make_float2(0.0f, 0.0f);
                        dp[DP ? nt : 0][0] = fmaf(-o0v, c.x, dp[DP ? nt : 0][0]);
                        dp[DP ? nt : 0][1] = fmaf(-o0v, c.y, dp[DP ? nt : 0][1]);
                        dp[DP ? nt : 0][2] = fmaf(-o1v, c.x, dp[DP ? nt : 0][2]);
                        dp[DP ? nt : 0][3] = fmaf(-o1v, c.y, dp[DP ? nt : 0][3]);
                    }
                }
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) dp[DP ? nt : 0][e] *= s[nt][e];
            }
            if constexpr (MODE == M_DQ || MODE == M_DK || MODE == M_DKDV) accumulate<T, DM>(acc, dp, Y1);
            if constexpr (MODE == M_DKDV) accumulate<T, DM>(acc2, s, Y2);
            if constexpr (MODE == M_DV) accumulate<T, DM>(acc, s, Y2);
        } else { /* GRAD, exact: Cbar (in dp), then A (in s) where dV needs it */
            if constexpr (DP) {
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) dp[DP ? nt : 0][e] *= ex2(s[nt][e] + (cb[nt][e & 1] + rc2[e >> 1]));
                /* less every half-step's term w * exp(C + outer + streamed):
                 * T + 1 exponentials per entry, each of its own exponent */
                for (int tt = 1; tt <= Tp; tt++) {
                    const bool rs = tt & 1;
                    const float *iv = rs ? HV(tt) : HV(tt - 1), ioff = rs ? -la : 0.0f;
                    const float *jv = rs ? (tt > 1 ? HV(tt - 1) : nullptr) : HV(tt), joff = rs ? 0.0f : -lb;
                    const float *ov = KM ? jv : iv, *cv = KM ? iv : jv;
                    const float ooff = KM ? joff : ioff, coff = KM ? ioff : joff;
                    const bool wout = KM ? !rs : rs; /* the weight lives on the outer side */
                    const float *wv = AV(tt);
                    float oa[2], ow[2];
#pragma unroll
                    for (int k = 0; k < 2; k++) {
                        oa[k] = ((rv[k] && ov ? fin(ov[rw[k]]) : 0.0f) + ooff) * LOG2E;
                        ow[k] = wout ? (rv[k] ? wv[rw[k]] : 0.0f) : 1.0f;
                    }
#pragma unroll
                    for (int nt = 0; nt < 8; nt++)
#pragma unroll
                        for (int e2 = 0; e2 < 2; e2++) {
                            const int j = i0 + nt * 8 + 2 * q + e2;
                            const bool jl = j < Li;
                            const float ca = ((jl && cv ? fin(cv[j]) : 0.0f) + coff) * LOG2E;
                            const float cw = wout ? 1.0f : (jl ? wv[j] : 0.0f);
#pragma unroll
                            for (int k = 0; k < 2; k++) {
                                const int e = 2 * k + e2;
                                dp[DP ? nt : 0][e] -= ow[k] * cw * ex2(s[nt][e] + (ca + oa[k]));
                            }
                        }
                }
            }
            if constexpr (MODE == M_DKDV || MODE == M_DV) {
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[nt][e] = ex2(s[nt][e] + (cb[nt][e & 1] + rc2[e >> 1]));
            }
            if constexpr (MODE == M_DQ || MODE == M_DK || MODE == M_DKDV) accumulate<T, DM>(acc, dp, Y1);
            if constexpr (MODE == M_DKDV) accumulate<T, DM>(acc2, s, Y2);
            if constexpr (MODE == M_DV) accumulate<T, DM>(acc, s, Y2);
        }
        __syncthreads(); /* the buffer is refilled two tiles later */
    }

    /* ---- results ---- */
    if constexpr (LSE) {
        float lse[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            float lt = l[k] + __shfl_xor_sync(0xffffffffu, l[k], 1);
            lt = lt + __shfl_xor_sync(0xffffffffu, lt, 2);
            l[k] = lt;
            lse[k] = m[k] * LN2 + logf(lt);
        }
        float err = 0.0f;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            if (!rv[k]) continue;
            const float val = (MODE == M_COL_LSE ? lb : la) - lse[k];
            if (MODE == M_COL_LSE) {
                const float gprev = t > 2 ? HV(t - 2)[rw[k]] : 0.0f;
                float e = fabsf(ex(gprev - val) - 1.0f);
                if (!(e == e)) e = INFINITY;
                err = fmaxf(err, e);
            }
            if (q == 0) HV(t)[rw[k]] = val;
        }
        if (MODE == M_COL_LSE && a.tol > 0.0f) {
            __shared__ float red[NT / 32];
            for (int off = 16; off > 0; off >>= 1) err = fmaxf(err, __shfl_xor_sync(0xffffffffu, err, off));
            if (lane == 0) red[w] = err;
            __syncthreads();
            if (threadIdx.x == 0) {
                float e = red[0];
                for (int k = 1; k < NT / 32; k++) e = fmaxf(e, red[k]);
                a.err[(int64_t)p * a.nkb + blockIdx.x] = e;
            }
        }
        if constexpr (MODE == M_ROW_OUT) {
            if (with_out) {
                const float r0 = l[0] > 0.0f ? 1.0f / l[0] : 0.0f, r1 = l[1] > 0.0f ? 1.0f / l[1] : 0.0f;
                store_acc<T, DM>(acc, r0, r1, (T *)a.out + (int64_t)b * a.so[0] + (int64_t)h * a.so[1], a.so[2], rw[0], Lo,
                                 a.dv);
                if (a.ot) store_acc<float, DM>(acc, r0, r1, a.ot + (int64_t)p * a.Nq * a.dv, a.dv, rw[0], Lo, a.dv);
            }
        }
    } else if constexpr (MODE == M_OUT) {
        if (a.out)
            store_acc<T, DM>(acc, 1.0f, 1.0f, (T *)a.out + (int64_t)b * a.so[0] + (int64_t)h * a.so[1], a.so[2], rw[0], Lo,
                             a.dv);
        if (a.ot) store_acc<float, DM>(acc, 1.0f, 1.0f, a.ot + (int64_t)p * a.Nq * a.dv, a.dv, rw[0], Lo, a.dv);
    } else if constexpr (MODE == M_DV_FIRST) {
        /* dV, and the first reverse weight of key j from it: sum_i A_ij
         * dP_ij = V_j . dV_j (fp32 accumulator), less sum_i A_ij D_i when
         * the last step is a row step (as M_BWD_FIRST writes) */
        store_acc<T, DM>(acc, 1.0f, 1.0f, (T *)a.dvv + (int64_t)b * a.sdv[0] + (int64_t)h * a.sdv[1], a.sdv[2], rw[0], Lo,
                         a.dv);
        const T *Vp = prob_base<T>(a.v, a.sv, b, h);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            float vd = 0.0f;
            if (rv[k]) {
                const T *vr = Vp + (int64_t)rw[k] * a.sv[2];
#pragma unroll
                for (int nt = 0; nt < DM / 8; nt++)
#pragma unroll
                    for (int e2 = 0; e2 < 2; e2++) {
                        const int c = nt * 8 + 2 * q + e2;
                        if (c < a.dv) vd = fmaf(Tr<T>::to(vr[c]), acc[nt][2 * k + e2], vd);
                    }
            }
            vd = vd + __shfl_xor_sync(0xffffffffu, vd, 1);
            vd = vd + __shfl_xor_sync(0xffffffffu, vd, 2);
            float ad = racc[k] + __shfl_xor_sync(0xffffffffu, racc[k], 1);
            ad = ad + __shfl_xor_sync(0xffffffffu, ad, 2);
            if (rv[k] && q == 0 && Tp > 1) AV((Tp & 1) ? Tp - 1 : Tp)[rw[k]] = vd - ad;
        }
    } else if constexpr (RED) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
            float tot = racc[k] + __shfl_xor_sync(0xffffffffu, racc[k], 1);
            tot = tot + __shfl_xor_sync(0xffffffffu, tot, 2);
            const int o = rw[k];
            if (!rv[k] || q != 0) continue;
            if (MODE == M_BWD_D) {
                a.D[(int64_t)p * a.Nq + o] = tot;
                if (Tp & 1) AV(Tp)[o] = tot;
            } else if (MODE == M_BWD_FIRST) {
                AV((Tp & 1) ? Tp - 1 : Tp)[o] = tot;
            } else if (MODE == M_REV_COL) {
                AV(t - 1)[o] = (t == Tp ? Dp[o] : 0.0f) - tot;
            } else {
                AV(t - 1)[o] = -tot;
            }
        }
    } else {
        if constexpr (MODE == M_DQ)
            store_acc<T, DM>(acc, a.alpha, a.alpha, (T *)a.dq + (int64_t)b * a.sdq[0] + (int64_t)h * a.sdq[1], a.sdq[2],
                             rw[0], Lo, a.d);
        if constexpr (MODE == M_DK || MODE == M_DKDV)
            store_acc<T, DM>(acc, a.alpha, a.alpha, (T *)a.dk + (int64_t)b * a.sdk[0] + (int64_t)h * a.sdk[1], a.sdk[2],
                             rw[0], Lo, a.d);
        if constexpr (MODE == M_DKDV)
            store_acc<T, DM>(acc2, 1.0f, 1.0f, (T *)a.dvv + (int64_t)b * a.sdv[0] + (int64_t)h * a.sdv[1], a.sdv[2],
                             rw[0], Lo, a.dv);
        if constexpr (MODE == M_DV)
            store_acc<T, DM>(acc, 1.0f, 1.0f, (T *)a.dvv + (int64_t)b * a.sdv[0] + (int64_t)h * a.sdv[1], a.sdv[2],
                             rw[0], Lo, a.dv);
    }
#undef HV
#undef AV
}

/* the passes' kernels: one per mode and operand type; the dV pass is held to
 * 3 blocks an SM by its launch bounds (alone it would take 234 registers and
 * 2), and at d <= 64 to 4 (128 registers, 4 bytes of spill; its shared
 * memory, 46 KiB, lets 4 blocks share an SM): at B*H = 32, N = 1024 its 512
 * blocks then run in one wave of 528 on an H100 instead of two of 396
 * (BK_CUDA_DV_BLOCKS=3 keeps 3, the baseline of the benchmarks). The others
 * keep the compiler's default (an explicit minimum of 1 block lets it take
 * far more registers; the gradient passes' 67 KiB of shared memory hold
 * them to 3 blocks whatever their registers) */
template <typename T, int DM, int MODE, bool FAST>
__global__ void __launch_bounds__(NT) tc_kernel(const bkc_args a, const int t, const int with_out)
{
    pdl_gate(a);
    tc_body<T, DM, MODE, FAST>(a, t, with_out);
}
/* the factorised dQ and dK passes at d <= 64 held to 4 blocks an SM (128
 * registers, 8-12 bytes of spill, where they would take 164): with their
 * shared memory (six unpadded tiles and the factors of S <= 9 steps, under
 * 56 KiB) 4 blocks fit an SM, so at B*H = 32, N = 1024 the two passes' 1024
 * blocks run in two waves of 528 on an H100 instead of three of 396
 * (BK_CUDA_GRAD_BLOCKS=3 keeps 3, the baseline of the benchmarks) */
template <typename T, int DM, int MODE>
__global__ void __launch_bounds__(NT, 4) tc_grad4_kernel(const bkc_args a, const int t, const int with_out)
{
    pdl_gate(a);
    tc_body<T, DM, MODE, true>(a, t, with_out);
}

template <typename T, int DM, int MINB>
__global__ void __launch_bounds__(NT, MINB) tc_dv_kernel(const bkc_args a, const int t, const int with_out)
{
    pdl_gate(a);
    tc_body<T, DM, M_DV_FIRST, false>(a, t, with_out);
}

/* The gradient passes' factors. Every half-step term of Cbar is A times a
 * rank-one matrix: with A_ij = Lq exp(C_ij + f_i + g_j) (the final
 * potentials f, g),
 *   row step t:    lam_t,i R^t_ij = A_ij [lam_t,i e^(f_t,i - f_i)] [e^(g_{t-1},j - g_j)]
 *   column step t: mu_t,j Q^t_ij  = A_ij [e^(f_{t-1},i - f_i - log Lq)] [mu_t,j e^(g_t,j - log b - g_j)]
 * so Cbar = A .* (dP - sum_t U_t V_t^T) costs one exponential per entry
 * instead of T + 1. U_t (Nq) and V_t (Nk) of every step go to a.fac. A
 * factor's exponent beyond +-FAC_BOUND could lose the product to overflow
 * or underflow (A below float range where the exact term is not): such a
 * problem keeps the exact per-entry terms (a.fact[p] = 0). Rows and columns
 * with an infinite final potential (no live entry) get factor 0. */
constexpr float FAC_BOUND = 40.0f;
/* grid (chunks, P): block x writes the factors of rows and columns in its
 * chunk of [0, padded length) for every step, and the largest |exponent| it
 * met to a.err[p * a.nkb + x] (free in the backward; chunks <= a.nkb) */
__global__ void fac_kernel(const bkc_args a)
{
    pdl_gate(a);
    const int p = blockIdx.y, b = p / a.H, x = blockIdx.x, nch = gridDim.x;
    const int Lq = len_q(a, b), Lk = len_k(a, b);
    __shared__ float red[8];
    float big = 0.0f;
    if (Lq > 0 && Lk > 0) {
        int Tp = a.iters[p];
        Tp = Tp < 1 ? 1 : (Tp > a.S ? a.S : Tp);
        const float *hist = (const float *)(a.hist + (int64_t)p * a.hist_stride);
        const float *adj = a.adj + (int64_t)p * a.hist_len;
        const float lb = -logf((float)Lk), lLq = logf((float)Lq);
        const int trow = (Tp & 1) ? Tp : Tp - 1, tcol = (Tp & 1) ? Tp - 1 : Tp;
        const float *fF = hist + bkc_hist_off(a.Nq, a.Nk, trow);
        const float *gF = tcol >= 2 ? hist + bkc_hist_off(a.Nq, a.Nk, tcol) : nullptr;
        const int nqp = fac_pad(a.Nq), nkp = fac_pad(a.Nk);
        const int cq = (nqp + nch - 1) / nch, ck = (nkp + nch - 1) / nch;
        const int i0 = x * cq, i1 = min(nqp, i0 + cq), j0 = x * ck, j1 = min(nkp, j0 + ck);
        float *F = a.fac + (int64_t)p * a.S * (nqp + nkp);
        for (int tt = 1; tt <= Tp; tt++) {
            const bool rs = tt & 1;
            float *U = F + (int64_t)(tt - 1) * (nqp + nkp), *V = U + nqp;
            const float *fi = hist + bkc_hist_off(a.Nq, a.Nk, rs ? tt : tt - 1);
            const float *gj = rs ? (tt > 1 ? hist + bkc_hist_off(a.Nq, a.Nk, tt - 1) : nullptr)
                                 : hist + bkc_hist_off(a.Nq, a.Nk, tt);
            const float *wv = adj + bkc_hist_off(a.Nq, a.Nk, tt);
            for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
                if (i >= Lq || fF[i] == INFINITY) { U[i] = 0.0f; continue; }
                const float e = fi[i] - fF[i] - (rs ? 0.0f : lLq);
                big = (e == e) ? fmaxf(big, fabsf(e)) : INFINITY;
                U[i] = (rs ? wv[i] : 1.0f) * expf(e);
            }
            for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
                const float g = gF && j < Lk ? gF[j] : 0.0f;
                if (j >= Lk || g == INFINITY) { V[j] = 0.0f; continue; }
                const float e = (gj ? gj[j] : 0.0f) - (rs ? 0.0f : lb) - g;
                big = (e == e) ? fmaxf(big, fabsf(e)) : INFINITY;
                V[j] = (rs ? 1.0f : wv[j]) * expf(e);
            }
        }
    }
    for (int off = 16; off > 0; off >>= 1) big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, off));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = big;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) m = fmaxf(m, red[w]);
        a.err[(int64_t)p * a.nkb + x] = m;
    }
}
/* a.fact[p]: every chunk's exponents within the bound (max: order-free) */
__global__ void fac_flag_kernel(const bkc_args a, int nch)
{
    pdl_gate(a);
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= a.B * a.H) return;
    const int b = p / a.H;
    float m = 0.0f;
    for (int x = 0; x < nch; x++) m = fmaxf(m, a.err[(int64_t)p * a.nkb + x]);
    a.fact[p] = len_q(a, b) > 0 && len_k(a, b) > 0 && m <= FAC_BOUND;
}

} /* namespace tc */

/* ---- small kernels -------------------------------------------------------- */
__global__ void init_kernel(const bkc_args a)
{
    pdl_gate(a);
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
    pdl_gate(a);
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

/* D = rowsum(dO .* O) from the output kept in the tape (a.ot): the row sums
 * of A .* dP without a pass over the scores (sum_j A_ij dO_i . V_j = dO_i .
 * O_i); also lam_T when the last step is a row step, as M_BWD_D writes. One
 * warp a row, a fixed order (lanes by channel, then an xor tree). */
template <typename T> __global__ void d_kernel(const bkc_args a)
{
    pdl_gate(a);
    const int p = blockIdx.y, b = p / a.H, h = p % a.H;
    const int Lq = len_q(a, b), Lk = len_k(a, b);
    const int lane = threadIdx.x & 31, o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (Lq == 0 || Lk == 0 || o >= Lq) return;
    const T *dO = (const T *)a.dout + (int64_t)b * a.sdo[0] + (int64_t)h * a.sdo[1] + (int64_t)o * a.sdo[2];
    const float *O = a.ot + ((int64_t)p * a.Nq + o) * a.dv;
    float s = 0.0f;
    for (int c = lane; c < a.dv; c += 32) s = fmaf(Tr<T>::to(dO[c]), O[c], s);
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane != 0) return;
    a.D[(int64_t)p * a.Nq + o] = s;
    const int it = a.iters[p], Tp = it < 1 ? 1 : (it > a.S ? a.S : it);
    if (Tp & 1) a.adj[(int64_t)p * a.hist_len + bkc_hist_off(a.Nq, a.Nk, Tp) + o] = s;
}

__global__ void iters_from_tape(const bkc_args a)
{
    pdl_gate(a);
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= a.B * a.H) return;
    const int32_t *h = (const int32_t *)(a.blk + (int64_t)p * a.blk_stride);
    a.iters[p] = h[2]; /* bki_block_header: Lq, Lk, steps[0] */
}

/* a forward's last writes: zero rows of the output past Lq (all of an empty
 * problem's), the extras f and g, the tape's block headers */
template <typename T> __global__ void finish_fwd(const bkc_args a)
{
    pdl_gate(a);
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
    pdl_gate(a);
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
    pdl_gate(a);
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
    bool tcp; /* the tensor-core (mma.sync) passes: bf16 / fp16 */
    bool pdl; /* programmatic dependent launches (pdl_gate; a->pdl_early) */
    bool capt; /* the stream is being captured into a graph (no second stream, no PDL) */
};

/* an environment switch set to this value (read at every call) */
bool env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

/* whether st is being captured into a graph (an error counts as captured:
 * the caller then takes the plain path) */
bool capturing(cudaStream_t st)
{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess) {
        cudaGetLastError();
        return true;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* every kernel of a forward or backward is launched here: with programmatic
 * stream serialisation where L.pdl (the kernel starts with pdl_gate, which
 * keeps the stream's order of completion) */
template <typename... KA, typename... A>
cudaError_t launch(const Launch &L, void (*k)(KA...), dim3 grid, dim3 block, size_t smem, A... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = L.st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = L.pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, args...);
}

/* programmatic dependent launches (pdl_gate): 0 none (BK_CUDA_PDL=0, the
 * benchmarks' baseline), 1 each kernel launched as its predecessor's blocks
 * exit (the default), 2 as they start (BK_CUDA_PDL=2); on devices of compute
 * capability 9.0 and later, not while the stream is captured (capt) */
int want_pdl(bool capt)
{
    if (capt || env_is("BK_CUDA_PDL", "0")) return 0;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (major < 9) return 0;
    return env_is("BK_CUDA_PDL", "2") ? 2 : 1;
}

/* a pass compiled for more blocks an SM (tc_dv_kernel<.., 4>: the dV pass at
 * 4; tc_grad4_kernel: the factorised dQ and dK passes at 4): where that many blocks' shared memory (smem bytes each, and the
 * device's reservation per block) fit an SM, unless the environment variable
 * env names another number (the benchmarks' baselines) */
bool blocks_fit(const char *env, int blocks, int smem)
{
    const char *v = getenv(env);
    if (v && atoi(v) != blocks) return false;
    int dev = 0, per_sm = 0, rsv = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&rsv, cudaDevAttrReservedSharedMemoryPerBlock, dev) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return blocks * (smem + rsv) <= per_sm;
}

/* one pass: the tensor-core kernel for 16-bit operands (unless the WMMA
 * kernels were asked for), else pass_kernel */
template <typename T, int DM, int MODE> cudaError_t pass(const Launch &L, int t, int with_out = 0)
{
    const int outer = kmajor(MODE) ? L.a->Nk : L.a->Nq;
    const dim3 grid((unsigned)((outer + TILE - 1) / TILE), (unsigned)L.P);
    if constexpr (Tr<T>::tc) {
        if (L.tcp) {
            const tc::TPlan tp = tc::tplan(MODE, DM, L.a->S);
            constexpr bool GR = MODE == M_DQ || MODE == M_DK || MODE == M_DV || MODE == M_DKDV;
            void (*kt)(bkc_args, int, int);
            cudaError_t e = cudaSuccess;
            if constexpr (MODE != M_DV_FIRST) kt = tc::tc_kernel<T, DM, MODE, false>;
            else if constexpr (DM == 64) kt = blocks_fit("BK_CUDA_DV_BLOCKS", 4, tp.total) ? tc::tc_dv_kernel<T, DM, 4> : tc::tc_dv_kernel<T, DM, 3>;
            else kt = tc::tc_dv_kernel<T, DM, 3>;
            e = cudaFuncSetAttribute(kt, cudaFuncAttributeMaxDynamicSharedMemorySize, tp.total);
            if (e != cudaSuccess) return e;
            e = launch(L, kt, grid, dim3(NT), tp.total, *L.a, t, with_out);
            if (e != cudaSuccess) return e;
            if constexpr (GR) {
                if (L.a->fac) { /* the problems whose terms factorise */
                    void (*kf)(bkc_args, int, int) = tc::tc_kernel<T, DM, MODE, true>;
                    if constexpr (DM == 64 && (MODE == M_DQ || MODE == M_DK)) {
                        if (blocks_fit("BK_CUDA_GRAD_BLOCKS", 4, tp.total)) {
                            kf = tc::tc_grad4_kernel<T, DM, MODE>;
                            e = cudaFuncSetAttribute(kf, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
                            if (e != cudaSuccess) return e;
                        }
                    }
                    e = cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, tp.total);
                    if (e != cudaSuccess) return e;
                    e = launch(L, kf, grid, dim3(NT), tp.total, *L.a, t, with_out);
                }
            }
            return e;
        }
    }
    if constexpr (MODE == M_ROW_OUT || MODE == M_DV_FIRST) {
        return cudaErrorInvalidValue; /* tensor-core passes only */
    } else {
        const Plan pl = plan_of(MODE, (int)sizeof(T), Tr<T>::tc, DM);
        auto k = pass_kernel<T, DM, MODE>;
        cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, pl.total);
        if (e != cudaSuccess) return e;
        return launch(L, k, grid, dim3(NT), pl.total, *L.a, t);
    }
}

/* BK_CUDA_KERNELS=wmma: the first (WMMA) kernels for 16-bit operands too,
 * kept as the benchmarks' baseline */
bool want_tc(int dtype) { return dtype != BKC_F32 && !env_is("BK_CUDA_KERNELS", "wmma"); }

int smem_optin(void)
{
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return 0;
    return v;
}

/* a second stream for a pass that may run beside the main stream's: opened
 * after an event on the main stream (tensor-core calls, not while the main
 * stream is captured), joined by an event back; released when it goes out of
 * scope (CUDA frees a stream's resources once its work is done) */
struct Fork {
    cudaStream_t aux = nullptr, st = nullptr;
    cudaEvent_t ev = nullptr;
    bool open(const Launch &L)
    {
        if (!L.tcp || L.capt || env_is("BK_CUDA_FORK", "0")) return false;
        st = L.st;
        if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess ||
            cudaStreamCreateWithFlags(&aux, cudaStreamNonBlocking) != cudaSuccess || cudaEventRecord(ev, st) != cudaSuccess ||
            cudaStreamWaitEvent(aux, ev, 0) != cudaSuccess) {
            cudaGetLastError();
            release();
            return false;
        }
        return true;
    }
    /* the main stream waits for the second one's work */
    cudaError_t join(cudaStream_t main)
    {
        if (!aux) return cudaSuccess;
        cudaError_t e = cudaEventRecord(ev, aux);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(main, ev, 0);
        return e;
    }
    void release()
    {
        if (aux) cudaStreamDestroy(aux);
        if (ev) cudaEventDestroy(ev);
        aux = nullptr;
        ev = nullptr;
    }
    ~Fork() { release(); }
};

#define TRY(x)                                                                                                         \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) return e_;                                                                              \
    } while (0)

/* a call's launch settings; ac: the arguments its kernels get (args, with
 * pdl_early as the launches ask) */
Launch setup(bkc_args &ac, const bkc_args *args, cudaStream_t st)
{
    const bool capt = capturing(st);
    const int pdl = want_pdl(capt);
    ac = *args;
    ac.pdl_early = pdl == 2;
    return Launch{&ac, st, ac.B * ac.H, want_tc(ac.dtype), pdl > 0, capt};
}

template <typename T, int DM> cudaError_t forward_t(const bkc_args *args, cudaStream_t st)
{
    bkc_args ac;
    const Launch L = setup(ac, args, st);
    const bkc_args *a = &ac;
    const int P = L.P, S = a->S;
    /* odd S without a tolerance: the last row step is always the pass that
     * can also write the output (online softmax), so that its potentials are
     * bitwise the same whether the output is asked for (a forward) or not (a
     * backward recomputing its tape); it writes the output unless an
     * attention matrix is asked for (then the output pass does both) */
    const bool last = L.tcp && (S & 1) && a->tol == 0.0f;
    const bool fuse = last && !a->attn && a->out;
    TRY(launch(L, init_kernel, dim3((P + 127) / 128), dim3(128), 0, *a));
    if (a->attn) {
        const int64_t nn = (int64_t)a->Nq * a->Nk;
        TRY(launch(L, zero_attn<T>, dim3((unsigned)((nn + 255) / 256), (unsigned)P), dim3(256), 0, *a));
    }
    for (int t = 1; t <= S; t++) {
        if (last && t == S) {
            TRY((pass<T, DM, M_ROW_OUT>(L, t, fuse)));
        } else if (t & 1) {
            TRY((pass<T, DM, M_ROW_LSE>(L, t)));
        } else {
            TRY((pass<T, DM, M_COL_LSE>(L, t)));
            if (a->tol > 0.0f) {
                TRY(launch(L, decide_kernel, dim3((P + 127) / 128), dim3(128), 0, *a, t));
            }
        }
    }
    if ((a->out || a->attn) && !fuse) TRY((pass<T, DM, M_OUT>(L, 0)));
    const int nmax = a->Nq > a->Nk ? a->Nq : a->Nk;
    return launch(L, finish_fwd<T>, dim3((unsigned)((nmax + 127) / 128), (unsigned)P), dim3(128), 0, *a);
}

template <typename T, int DM> cudaError_t backward_t(const bkc_args *args, cudaStream_t st)
{
    bkc_args ac;
    const Launch L = setup(ac, args, st);
    const bkc_args *a = &ac;
    const int P = L.P;
    if (a->blk) {
        TRY(launch(L, iters_from_tape, dim3((P + 127) / 128), dim3(128), 0, *a));
    }
    if (L.tcp && a->ot) { /* D from the output kept in the tape */
        TRY(launch(L, d_kernel<T>, dim3((unsigned)((a->Nq + 7) / 8), (unsigned)P), dim3(256), 0, *a));
    } else {
        TRY((pass<T, DM, M_BWD_D>(L, 0)));
    }
    /* the first reverse weights (none when S = 1: softmax): with dV in the
     * same pass on the tensor-core path (sum_i A_ij dP_ij = V_j . dV_j),
     * which then leaves dK alone to the last pass. Softmax keeps dK and dV
     * in one last pass: a pass of its own for dV would add one over the
     * scores (measured on an H100: 3.73 against 3.35 ms at N = 4096). */
    const bool dvf = L.tcp && a->S > 1;
    if (dvf) TRY((pass<T, DM, M_DV_FIRST>(L, 0)));
    else if (a->S > 1) TRY((pass<T, DM, M_BWD_FIRST>(L, 0)));
    /* the reverse steps; a row step t = S has nothing to pass back (every
     * problem ran at most S half-steps: prob_of skips t >= Tp) */
    for (int t = a->S; t >= 2; t--) {
        if (t & 1) {
            if (t < a->S) TRY((pass<T, DM, M_REV_ROW>(L, t)));
        } else {
            TRY((pass<T, DM, M_REV_COL>(L, t)));
        }
    }
    if (L.tcp && a->fac) {
        const int nch = a->nkb < 16 ? a->nkb : 16;
        TRY(launch(L, tc::fac_kernel, dim3((unsigned)nch, (unsigned)P), dim3(256), 0, *a));
        TRY(launch(L, tc::fac_flag_kernel, dim3((P + 127) / 128), dim3(128), 0, *a, nch));
    }
    /* dQ and dK (dV done with the first weights), or dQ and dK and dV:
     * independent passes. The tensor-core ones run side by side, dQ on a
     * second stream (forked and joined by events; not while the stream is
     * captured into a graph; BK_CUDA_FORK=0: one stream), so that each fills
     * the other's last partial wave of blocks. dK and dV: one pass where its
     * two accumulators and its shared memory fit (d, dv <= 64), else two. */
    Fork fk;
    const Launch Ldq = fk.open(L) ? Launch{a, fk.aux, P, L.tcp, L.pdl, L.capt} : L;
    TRY((pass<T, DM, M_DQ>(Ldq, 0)));
    if (dvf) {
        TRY((pass<T, DM, M_DK>(L, 0)));
    } else {
        const int dkdv_smem = L.tcp ? tc::tplan(M_DKDV, DM, a->S).total : plan_of(M_DKDV, (int)sizeof(T), Tr<T>::tc, DM).total;
        if (DM == 64 && dkdv_smem <= smem_optin()) {
            TRY((pass<T, DM, M_DKDV>(L, 0)));
        } else {
            TRY((pass<T, DM, M_DK>(L, 0)));
            TRY((pass<T, DM, M_DV>(L, 0)));
        }
    }
    TRY(fk.join(st));
    const int nmax = a->Nq > a->Nk ? a->Nq : a->Nk;
    return launch(L, finish_bwd<T>, dim3((unsigned)((nmax + 127) / 128), (unsigned)P), dim3(128), 0, *a);
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

extern "C" int bkc_tc_path(int dtype) { return want_tc(dtype) ? 1 : 0; }

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
    int need = tc ? tc::tplan(M_ROW_OUT, DM, tc::FCAP).total : 0;
    /* every pass but the fused dK/dV one, which splits when it does not fit */
    for (int m = M_ROW_LSE; m <= M_DV; m++) {
        if (m == M_DKDV) continue;
        const int x = plan_of(m, esz, tc, DM).total;
        need = x > need ? x : need;
        const int y = tc ? tc::tplan(m, DM, tc::FCAP).total : 0;
        need = y > need ? y : need;
    }
    return (size_t)need;
}
