/* layers.h -- the row-wise building blocks of the training engine: Linear
 * (CBLAS), LayerNorm, GELU, dropout masks and deterministic column sums.
 * Activations are row-major [R, C]; every parameter-gradient reduction over
 * rows runs in row order (parallel over column blocks only), so results do
 * not depend on the thread count. */
#ifndef BK_NN_LAYERS_H
#define BK_NN_LAYERS_H

#include "nn.h"

/* y[R,out] = x[R,in] W^T (+ b), W [out, in] (PyTorch layout); ldx/ldy row strides */
void bki_linear_fwd(int R, int in, int out, const float *x, int ldx, const float *W, const float *b, float *y,
                    int ldy);
/* dx[R,in] = dy W (+ beta_dx * dx; dx nullable); dW += dy^T x; db += colsum(dy) (nullable).
 * kbuf: bki_linear_kbuf_floats(out, in) floats of scratch (nullable): from
 * 1024 rows on, dW's product and db's sums then run in two fixed halves of
 * the rows, each half of the team on the rows its own threads wrote, dW =
 * (dW + P0) + P1, db += (float)(s0 + s1) (a function of R only: the same
 * bits on any thread count, not those of kbuf NULL) */
void bki_linear_bwd(int R, int in, int out, const float *x, int ldx, const float *W, const float *dy, int ldy,
                    float *dx, float beta_dx, float *dW, float *db, float *kbuf);
size_t bki_linear_kbuf_floats(int out, int in);
/* Linear then GELU: z = x W^T + b, g = gelu(z) [R,out] (row stride ldy),
 * and y receives gelu'(z), the slope the backward needs (bki_linear_bwd_gelu;
 * without g, bki_linear_fwd: y = z). The bias and the GELU run in the GEMM's
 * tiles, gelu and gelu' from one evaluation of Phi and phi; g has the bits
 * of bki_linear_fwd then bki_gelu_fwd */
void bki_linear_fwd_gelu(int R, int in, int out, const float *x, int ldx, const float *W, const float *b, float *y,
                         int ldy, float *g);
/* y = x W^T + b + res ([R,out], res's row stride ldr; b nullable): a
 * residual sublayer's last Linear with the bias and the residual added in
 * the GEMM tiles, bits as bki_linear_fwd then y += b, then y += res. res
 * must not alias y */
void bki_linear_fwd_res(int R, int in, int out, const float *x, int ldx, const float *W, const float *b,
                        const float *res, int ldr, float *y, int ldy);
/* the backward of a Linear whose input x = gelu(z): as bki_linear_bwd, then
 * dx *= s, s = gelu'(z) as bki_linear_fwd_gelu left it in y ([R,in], row
 * stride in; s nullable: bki_linear_bwd), fused into dx's GEMM tiles; bits
 * as bki_linear_bwd then bki_gelu_bwd on z. beta_dx must be 0 where s is
 * given (dx is a fresh gradient) */
void bki_linear_bwd_gelu(int R, int in, int out, const float *x, int ldx, const float *W, const float *dy, int ldy,
                         float *dx, float beta_dx, float *dW, float *db, const float *s, float *kbuf);
/* out[c] += sum_r a[r, c] in row order (double accumulation) */
void bki_colsum_add(const float *a, int R, int C, int lda, float *out);

/* y = (x - mu) rs g + b per row; mu, rs [R] saved for the backward */
void bki_layernorm_fwd(int R, int C, const float *x, const float *g, const float *b, float eps, float *y, float *mu,
                       float *rs);
/* dx += LN backward of dy; dg += colsum(dy xhat), db += colsum(dy), in one
 * pass over x and dy: each fixed block of rows (8192 / C rows, at most 64)
 * sums its rows in order in double, the blocks' sums are added in block
 * order (the same bits on any thread count); rows wider than 512 columns
 * are read again for each further 512 columns of dg, db */
void bki_layernorm_bwd(int R, int C, const float *x, const float *mu, const float *rs, const float *g,
                       const float *dy, float *dx, float *dg, float *db);

/* exact-erf GELU: y = gelu(z); backward dz = dy * gelu'(z) (in place allowed);
 * vectorised, within 6 ulp of libm in double (layers.c) */
void bki_gelu_fwd(size_t n, const float *z, float *y);
void bki_gelu_bwd(size_t n, const float *z, const float *dy, float *dz);

/* Dropout of rows [R, C] (row stride ld) with keep probability 1 - p, scale
 * 1/(1-p); element (r, c) keeps iff hash(key, row0 + r, c) >= p. The same
 * call applies the same mask to a gradient. */
void bki_dropout(float *a, int R, int C, int ld, float p, uint64_t key);
/* key of a dropout site: a pure function of (seed, forward counter, site) */
uint64_t bki_dropout_key(uint64_t seed, uint64_t count, int site);

/* ---- LOTFormer's ViT ingredients (vit.c; docs/MODEL.md "The [CLS] row and
 * DWC") on a block's activations: qkv [B*T, 3I] as the block's projection
 * writes it (q, k, v at columns 0, I, 2I; head h at h*dh), att, dA, dq, dk,
 * dv [B*T, I], I = H*dh; nb[b] valid tokens of sample b (with [CLS]). */
typedef struct {
    int B, T, H, dh;
    const int32_t *nb;
} bki_vit_shape;

/* The [CLS] row (token 0) of each (sample, head): weights alpha [B, H, T]
 * (zero past nb) = softmax over the valid keys of the logits s q0 . k_j
 * (BK_CLS_SOFTMAX) or u_j^ps + w_j^po (BK_CLS_POL), and att's row 0 =
 * sum_j alpha_j v_j (written, not added). The backward SETS row 0 of dq, dk
 * and dv and ADDS into the other valid rows of dk and dv, from row 0 of dA;
 * scratch holds 2 B*H*T floats. */
typedef struct {
    bk_cls_attn mode;
    double scale, ps, po;  /* s (the model's attention scale), pol's powers */
} bki_cls_par;
void bki_cls_row_fwd(const bki_vit_shape *s, const bki_cls_par *p, const float *qkv, float *alpha, float *att);
void bki_cls_row_bwd(const bki_vit_shape *s, const bki_cls_par *p, const float *qkv, const float *alpha,
                     const float *dA, float *scratch, float *dq, float *dk, float *dv);

/* The depthwise-convolution branch over the gh x gw patch grid (tokens cls,
 * ..., cls + gh*gw - 1 in row-major grid order): att += conv(v) + bias per
 * head channel (cross-correlation, k x k kernel w [dh, k, k] shared by the
 * heads, zero padding k/2). The backward ADDS dv, dw and db; scratch holds
 * (k*k + 1) dh doubles. */
typedef struct {
    int cls, gh, gw, k;
} bki_dwc_par;
void bki_dwc_fwd(const bki_vit_shape *s, const bki_dwc_par *p, const float *w, const float *bias, const float *qkv,
                 float *att);
void bki_dwc_bwd(const bki_vit_shape *s, const bki_dwc_par *p, const float *w, const float *qkv, const float *dA,
                 double *scratch, float *dv, float *dw, float *db);

#endif
