/* kernels.h -- the CUDA backend's kernels (kernels.cu), as seen from its C
 * driver (backend.c). Plain C, shared by the C and the CUDA compiler.
 *
 * One call runs the P = B*H problems of an attention call on one stream.
 * Every problem's potentials live in a history laid out as the CPU tape's
 * (h_1 row, h_2 column, ...; bkc_hist_off), in the caller's tape or in the
 * workspace; the backward keeps the adjoints of the same vectors in a second
 * history of the same layout. Nothing of size Nq x Nk is ever stored (the
 * attention output, when asked for, excepted). docs/CUDA.md gives the
 * algorithm. */
#ifndef BK_CUDA_KERNELS_H
#define BK_CUDA_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { BKC_F32 = 0, BKC_BF16 = 2, BKC_F16 = 3 }; /* bk_dtype's values */
enum { BKC_TILE = 64, BKC_DMAX = 128, BKC_INLINE_B = 256 };

typedef struct {
    int dtype;                      /* every tensor's                          */
    int B, H, Nq, Nk, d, dv;
    const int32_t *qlen, *klen;     /* device, [B] each, or NULL (all N)       */
    int inl;                        /* 1: the lengths are lq/lk below          */
    int32_t lq[BKC_INLINE_B], lk[BKC_INLINE_B]; /* lengths carried in the launch
                                       (B <= BKC_INLINE_B: no copy, no sync)   */
    const void *q, *k, *v;          /* [b][h][n][c], strides in elements       */
    int64_t sq[3], sk[3], sv[3];
    void *out; int64_t so[3];       /* forward output (NULL: none)             */
    void *attn; int64_t sa[3];      /* attention output (NULL: none)           */
    const void *dout; int64_t sdo[3];
    void *dq, *dk, *dvv; int64_t sdq[3], sdk[3], sdv[3];
    float alpha;                    /* scale / eps                             */
    int S;                          /* half-steps                              */
    float tol;                      /* early stop (0: none)                    */
    int causal;                     /* softmax only                            */
    char *hist; int64_t hist_stride;/* problem p's history: hist + p * stride  */
    char *blk; int64_t blk_stride;  /* tape block headers (NULL: no tape)      */
    float *adj;                     /* backward: P x hist_len adjoints         */
    int64_t hist_len;               /* floats of one history                   */
    float *D;                       /* backward: P x Nq (rowsum of dA * A)     */
    float *fac;                     /* backward: P x S x (Nq + Nk) factors of the
                                       half-step terms (16-bit passes)         */
    int32_t *fact;                  /* P: the factors may be used              */
    int32_t *iters, *stopped;       /* P each: half-steps run, stop flag       */
    float *err; int nkb;            /* P x nkb column-error block maxima       */
    float *f_out, *g_out;           /* extras: final potentials (NULL: none)   */
    float *ot;                      /* the output kept in the tape, [P][Nq][dv]
                                       fp32 (tensor-core passes; NULL: none):
                                       the forward writes it, the backward
                                       takes D = rowsum(dO .* O) from it       */
    int pdl_early;                  /* set by bkc_forward/bkc_backward: each
                                       block lets the next kernel launch as it
                                       starts (BK_CUDA_PDL=2)                  */
} bkc_args;

#ifdef __CUDACC__
#define BKC_HD __host__ __device__
#else
#define BKC_HD
#endif
/* offset of h_t (t >= 1) in a history: the CPU tape's layout */
static inline BKC_HD int64_t bkc_hist_off(int Nq, int Nk, int t)
{
    return (int64_t)(t / 2) * Nq + (int64_t)((t - 1) / 2) * Nk;
}

/* The whole forward / backward of softmax or Sinkhorn attention on the
 * stream (asynchronous). Return a cudaError_t (0: launched). */
int bkc_forward(const bkc_args *a, void *stream);
int bkc_backward(const bkc_args *a, void *stream);
/* 1 when calls of this dtype run the tensor-core passes (16-bit operands,
 * unless BK_CUDA_KERNELS=wmma): the passes that keep the output in the tape */
int bkc_tc_path(int dtype);
/* copies n <= 256 host bytes to device memory inside a launch (stream
 * ordered, no synchronisation) */
int bkc_put(void *dst, const void *src, size_t n, void *stream);
/* dst[i] = value, i < n (device floats) */
int bkc_fill(float *dst, float value, size_t n, void *stream);
/* the largest dynamic shared memory a pass of this call needs (bytes), and
 * what the device allows: the driver refuses shapes that do not fit */
size_t bkc_smem_need(int dtype, int dmax);

#ifdef __cplusplus
}
#endif
#endif
