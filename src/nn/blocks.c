/* blocks.c -- the model's building blocks shared by its architectures
 * (docs/MODEL.md): the residual sublayers (pre-/post-LN), the MLP, the
 * self-attention sublayer with LOTFormer's ViT ingredients around the
 * operator, the encoder block, the cross-attention sublayer (the decoder's
 * and the Set Transformer's MABs), the residual adds, the embedding table's
 * and the positions' gradients. */
#include "model_impl.h"
#include "../ops/op.h"
#include "../core/vexp.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bk_attn_desc bki_attn_desc(const bk_model *m, int B)
{
    bk_attn_desc d = {B, m->c.heads, m->T, m->T, m->dh, m->dh, m->nb, m->nb};
    return d;
}
/* a MAB unit's (the lengths are the current batch's) */
bki_cross_shape bki_mab_shape(const bk_model *m, int u)
{
    const bk_model_config *c = &m->c;
    if (bki_has_pma(c) && u == bki_pma_unit(c)) return (bki_cross_shape){c->pma_seeds, m->T, NULL, m->nb};
    if (u >= c->depth) return (bki_cross_shape){c->set_inducing, m->T, NULL, m->nb}; /* mab0: I over X */
    return (bki_cross_shape){m->T, c->set_inducing, m->nb, NULL};                     /* mab1: X over H */
}
/* the problem of unit l's cross-attention for max_batch (tapes, workspace) */
bk_attn_desc bki_cross_desc_max(const bk_model *m, int l)
{
    if (bki_unit_of(&m->c, l) == U_DEC)
        return (bk_attn_desc){m->max_batch, m->c.heads, m->Td, m->Tmax, m->dh, m->dh, NULL, NULL};
    const bki_cross_shape cs = bki_mab_shape(m, l);
    return (bk_attn_desc){m->max_batch, m->c.heads, cs.Nq, cs.Nk, m->dh, m->dh, NULL, NULL};
}
attn_site bki_self_site(int l) { return (attn_site){l, 0, 0}; }

void bki_views(const bk_model *m, float *qkv, float *att, bk_tensor *q, bk_tensor *k, bk_tensor *v, bk_tensor *o)
{
    const int64_t T = m->T, I = m->I, dh = m->dh;
    *q = (bk_tensor){qkv, T * 3 * I, dh, 3 * I, BK_DEVICE_HOST, BK_F32};
    *k = (bk_tensor){qkv + I, T * 3 * I, dh, 3 * I, BK_DEVICE_HOST, BK_F32};
    *v = (bk_tensor){qkv + 2 * I, T * 3 * I, dh, 3 * I, BK_DEVICE_HOST, BK_F32};
    *o = (bk_tensor){att, T * I, dh, I, BK_DEVICE_HOST, BK_F32};
}

/* ---- LOTFormer's ViT ingredients around the operator (vit.c) --------------
 * cls_attn != full: the operator runs on the tokens after [CLS] (every view
 * one row down, lengths nb - 1, the problem (T - 1) x (T - 1)) and the [CLS]
 * row is computed on its own; dwc = 1: the convolution branch is added to
 * the attention's output. Both are the same for every attention kind. */
static int cls_split(const bk_model *m) { return m->c.cls_attn != BK_CLS_FULL; }
static bki_vit_shape vit_shape(const bk_model *m, int B)
{
    return (bki_vit_shape){B, m->T, m->c.heads, m->dh, m->nb};
}
static bki_cls_par cls_par(const bk_model *m)
{
    return (bki_cls_par){m->c.cls_attn, bki_scale(m->c.attn_scale, m->dh), m->c.pol_ps, m->c.pol_po};
}
static bki_dwc_par dwc_par(const bk_model *m)
{
    return (bki_dwc_par){m->c.cls, m->c.image_h / m->c.patch, m->c.image_w / m->c.patch, m->c.dwc_kernel};
}
/* the operator's problem: all tokens, or those after [CLS] (the bki_views of
 * ts[0..n) moved one token down: row strides ld[i]) */
static bk_attn_desc op_desc(const bk_model *m, int B, bk_tensor *ts, const int64_t *ld, int n)
{
    if (!cls_split(m)) return bki_attn_desc(m, B);
    for (int i = 0; i < n; i++) ts[i].data += ld[i];
    bk_attn_desc d = {B, m->c.heads, m->T - 1, m->T - 1, m->dh, m->dh, m->nb1, m->nb1};
    return d;
}

/* the self-attention of block l (classifier, encoder) with its kind's hooks;
 * attn_out (nullable): the attention map [B, H, T, T] */
bk_status bki_self_attn_fwd(bk_model *m, int l, int B, int train, const bk_tensor *attn_out)
{
    blk_act *a = &m->ba[l];
    bk_tensor t[5];  /* q, k, v, o, the map */
    bki_views(m, a->qkv, a->att, &t[0], &t[1], &t[2], &t[3]);
    bk_status st = bki_attn_fwd_pre(m, l, &t[3]);
    if (st) return st;
    if (attn_out) {
        t[4] = *attn_out;
        if (cls_split(m)) /* the operator fills the block of the other tokens */
            memset(attn_out->data, 0, sizeof(float) * (size_t)B * m->c.heads * m->T * m->T);
    }
    const int64_t I = m->I, ld[5] = {3 * I, 3 * I, 3 * I, I, m->T + 1};
    bk_attn_desc d = op_desc(m, B, t, ld, attn_out ? 5 : 4);
    st = bki_attn_forward(m, bki_self_site(l), &d, &t[0], &t[1], &t[2], &t[3], attn_out ? &t[4] : NULL,
                          train ? a->tape : NULL);
    if (st) return st;
    bki_attn_fwd_post(m, l, B);
    const bki_vit_shape vs = vit_shape(m, B);
    if (cls_split(m)) {
        const bki_cls_par cp = cls_par(m);
        bki_cls_row_fwd(&vs, &cp, a->qkv, a->clsa, a->att);
        if (attn_out) /* row 0 of each (sample, head) map: the [CLS] row's weights */
            for (int bh = 0; bh < B * m->c.heads; bh++)
                memcpy(attn_out->data + (size_t)bh * m->T * m->T, a->clsa + (size_t)bh * m->T,
                       sizeof(float) * (size_t)m->T);
    }
    if (m->c.dwc) {
        const bki_dwc_par dp = dwc_par(m);
        bki_dwc_fwd(&vs, &dp, m->w + m->bo[l].dwc_w, m->w + m->bo[l].dwc_b, a->qkv, a->att);
    }
    return BK_OK;
}

typedef struct {
    int R, D;
    const float *x;
    float *out;
    const float *b;
} residual_args;

/* out rows += b */
static void residual_bias_member(void *arg)
{
    const residual_args *ra = arg;
    const int D = ra->D;
    const float *b = ra->b;
    BKI_FOR(r, ra->R) {
        float *o = ra->out + (size_t)r * D;
        for (int c = 0; c < D; c++) o[c] += b[c];
    }
}

/* out rows += x rows */
static void residual_x_member(void *arg)
{
    const residual_args *ra = arg;
    const int D = ra->D;
    BKI_FOR(r, ra->R) {
        float *o = ra->out + (size_t)r * D;
        const float *xr = ra->x + (size_t)r * D;
        for (int c = 0; c < D; c++) o[c] += xr[c];
    }
}

static void residual_add(int R, int D, const float *x, float *out, const float *b, float p, uint64_t key)
{
    const int nt = bki_threads();
    residual_args ra = {R, D, x, out, b};
    bki_parallel_claimed(nt, residual_bias_member, &ra);
    if (p > 0.0f) bki_dropout(out, R, D, D, p, key);
    bki_parallel_claimed(nt, residual_x_member, &ra);
}

/* ------------------------------------------------------------------------ */
/* backward                                                                 */
/* ------------------------------------------------------------------------ */
void bki_add_into(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

static bk_status attn_backward(bk_model *m, int l, int B)
{
    blk_act *a = &m->ba[l];
    const int64_t T = m->T, I = m->I, dh = m->dh;
    bk_tensor t[8]; /* q, k, v, dout, dq, dk, dv (and o, unused) */
    bki_views(m, a->qkv, a->att, &t[0], &t[1], &t[2], &t[7]);
    t[3] = (bk_tensor){m->dA, T * I, dh, I, BK_DEVICE_HOST, BK_F32};
    t[4] = (bk_tensor){m->dq, T * I, dh, I, BK_DEVICE_HOST, BK_F32};
    t[5] = (bk_tensor){m->dk, T * I, dh, I, BK_DEVICE_HOST, BK_F32};
    t[6] = (bk_tensor){m->dv, T * I, dh, I, BK_DEVICE_HOST, BK_F32};
    bki_attn_bwd_pre(m, l, B, &t[3]);
    const int64_t ld[7] = {3 * I, 3 * I, 3 * I, I, I, I, I};
    bk_attn_desc d = op_desc(m, B, t, ld, 7);
    void *pg = bki_attn_pgrads(m);
    bk_status st = bki_attn_backward(m, bki_self_site(l), &d, &t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], pg, a->tape);
    if (st) return st;
    bki_attn_bwd_post(m, l);
    /* the ViT ingredients, from d(att) = dA (the [CLS] row first: it sets
     * row 0 of dq, dk and dv, which the operator left alone) */
    const bki_vit_shape vs = vit_shape(m, B);
    if (cls_split(m)) {
        const bki_cls_par cp = cls_par(m);
        bki_cls_row_bwd(&vs, &cp, a->qkv, a->clsa, m->dA, m->dcls, m->dq, m->dk, m->dv);
    }
    if (m->c.dwc) {
        const bki_dwc_par dp = dwc_par(m);
        bki_dwc_bwd(&vs, &dp, m->w + m->bo[l].dwc_w, a->qkv, m->dA, m->ddwc, m->dv, m->gw + m->bo[l].dwc_w,
                    m->gw + m->bo[l].dwc_b);
    }
    return BK_OK;
}

void bki_pos_grad_member(void *arg)
{
    const bki_pos_grad_args *pg = arg;
    const int T = pg->T, B = pg->B, D = pg->D;
    BKI_FOR(i, T) {
        const int t = (int)i;
        for (int b = 0; b < B; b++) bki_add_into(pg->g + (size_t)t * D, pg->dx + ((size_t)b * T + t) * D, (size_t)D);
    }
}

/* ---- residual sublayers -----------------------------------------------------
 * pre-LN:  out = x + drop(f(LN(x)) + b)
 * post-LN: out = LN(x + drop(f(x) + b))
 * The norm's buffers (ln, mu, rs) hold LN(x) (pre) or the residual sum x +
 * drop(f + b) (post); sub_in gives the sublayer's input, sub_y the buffer
 * its last linear writes, sub_out adds the residual (and normalises). */

const float *bki_sub_in(bk_model *m, int R, const float *x, const sub_norm *n)
{
    if (m->c.post_ln) return x;
    bki_layernorm_fwd(R, m->c.dim, x, m->w + n->g, m->w + n->b, m->c.ln_eps, n->ln, n->mu, n->rs);
    return n->ln;
}
float *bki_sub_y(const bk_model *m, const sub_norm *n, float *out) { return m->c.post_ln ? n->ln : out; }
/* post-LN: out = LN(y), y the residual sum */
static void sub_norm_out(bk_model *m, int R, const sub_norm *n, const float *y, float *out)
{
    if (m->c.post_ln) bki_layernorm_fwd(R, m->c.dim, y, m->w + n->g, m->w + n->b, m->c.ln_eps, out, n->mu, n->rs);
}
void bki_sub_out(bk_model *m, int R, const float *x, const sub_norm *n, int64_t bias, float p, int site, float *out)
{
    const int D = m->c.dim;
    float *y = bki_sub_y(m, n, out);
    residual_add(R, D, x, y, m->w + bias, p, bki_dropout_key(m->seed, m->cur_count, site));
    sub_norm_out(m, R, n, y, out);
}
/* f's last Linear (a [R, in] through the weights at w, bias at offset
 * bias) and the sublayer's end (bki_sub_out). Without dropout the bias and
 * the residual x are added in the Linear's GEMM tiles instead of two passes
 * of their own: the same bits, (y + b) + x */
void bki_sub_last(bk_model *m, int R, int in, const float *a, int64_t w, int64_t bias, float p, int site,
                     const float *x, const sub_norm *n, float *out)
{
    const int D = m->c.dim;
    float *y = bki_sub_y(m, n, out);
    if (p > 0.0f) {
        bki_linear_fwd(R, in, D, a, in, m->w + w, NULL, y, D);
        bki_sub_out(m, R, x, n, bias, p, site, out);
        return;
    }
    bki_linear_fwd_res(R, in, D, a, in, m->w + w, m->w + bias, x, D, y, D);
    sub_norm_out(m, R, n, y, out);
}

/* backward: dX holds d(out). bki_sub_bwd_in returns d(f's output) and, post-LN,
 * leaves dX = d(residual sum): with dropout, dT = dX with the dropout
 * applied; without, dX itself (no copy: f's backward reads it and writes
 * elsewhere, and dX is not changed before bki_sub_bwd_out). bki_sub_bwd_out takes
 * dT = d(f's input) into dX = d(x). */
const float *bki_sub_bwd_in(bk_model *m, int R, const sub_norm *n, int site)
{
    const int D = m->c.dim;
    const size_t RD = (size_t)R * D;
    if (m->c.post_ln) {
        memset(m->dS, 0, sizeof(float) * RD);
        bki_layernorm_bwd(R, D, n->ln, n->mu, n->rs, m->w + n->g, m->dX, m->dS, m->gw + n->g, m->gw + n->b);
        memcpy(m->dX, m->dS, sizeof(float) * RD);
    }
    if (m->c.dropout <= 0.0f) return m->dX;
    memcpy(m->dT, m->dX, sizeof(float) * RD);
    bki_dropout(m->dT, R, D, D, m->c.dropout, bki_dropout_key(m->seed, m->cur_count, site));
    return m->dT;
}
void bki_sub_bwd_out(bk_model *m, int R, const float *x, const sub_norm *n)
{
    const int D = m->c.dim;
    if (m->c.post_ln)
        bki_add_into(m->dX, m->dT, (size_t)R * D);
    else
        bki_layernorm_bwd(R, D, x, n->mu, n->rs, m->w + n->g, m->dT, m->dX, m->gw + n->g, m->gw + n->b);
}
/* the sublayer's input as the forward saw it */
const float *bki_sub_h(const bk_model *m, const sub_norm *n, const float *x) { return m->c.post_ln ? x : n->ln; }

sub_norm bki_norm1(bk_model *m, int l)
{
    return (sub_norm){m->bo[l].ln1_w, m->bo[l].ln1_b, m->ba[l].ln1, m->ba[l].mu1, m->ba[l].rs1};
}
static sub_norm norm2(bk_model *m, int l)
{
    return (sub_norm){m->bo[l].ln2_w, m->bo[l].ln2_b, m->ba[l].ln2, m->ba[l].mu2, m->ba[l].rs2};
}
static sub_norm normc(bk_model *m, int l)
{
    return (sub_norm){m->bo[l].lnc_w, m->bo[l].lnc_b, m->ba[l].lnc, m->ba[l].muc, m->ba[l].rsc};
}

/* the MLP sublayer of block l on rows R: x -> out */
void bki_mlp_fwd(bk_model *m, int l, int R, const float *x, float *out, float p, int site)
{
    blk_act *a = &m->ba[l];
    const blk_off *o = &m->bo[l];
    const int D = m->c.dim, M = m->c.mlp_dim;
    const sub_norm n = norm2(m, l);
    const float *h = bki_sub_in(m, R, x, &n);
    bki_linear_fwd_gelu(R, D, M, h, D, m->w + o->fc1_w, m->w + o->fc1_b, a->f1, M, a->g1);
    bki_sub_last(m, R, M, a->g1, o->fc2_w, o->fc2_b, p, site, x, &n, out);
}
void bki_mlp_bwd(bk_model *m, int l, int R, const float *x, int site)
{
    blk_act *a = &m->ba[l];
    const blk_off *o = &m->bo[l];
    const int D = m->c.dim, M = m->c.mlp_dim;
    const sub_norm n = norm2(m, l);
    const float *dy = bki_sub_bwd_in(m, R, &n, site);
    bki_linear_bwd_gelu(R, M, D, a->g1, M, m->w + o->fc2_w, dy, D, m->dM, 0.0f, m->gw + o->fc2_w,
                        m->gw + o->fc2_b, a->f1, bki_kb(m, D, M));
    bki_linear_bwd(R, D, M, bki_sub_h(m, &n, x), D, m->w + o->fc1_w, m->dM, M, m->dT, 0.0f, m->gw + o->fc1_w,
                   m->gw + o->fc1_b, bki_kb(m, M, D));
    bki_sub_bwd_out(m, R, x, &n);
}

/* encoder (classifier) block l on B samples of T = m->T rows each */
bk_status bki_enc_block_fwd(bk_model *m, int l, int B, const float *x, int train)
{
    blk_act *a = &m->ba[l];
    const blk_off *o = &m->bo[l];
    const bk_model_config *c = &m->c;
    const int D = c->dim, I = m->I, R = B * m->T;
    const float p = train ? c->dropout : 0.0f;
    const sub_norm n1 = bki_norm1(m, l);
    const float *h = bki_sub_in(m, R, x, &n1);
    bki_linear_fwd(R, D, 3 * I, h, D, m->w + o->qkv_w, c->qkv_bias ? m->w + o->qkv_b : NULL, a->qkv, 3 * I);
    bk_status st = bki_self_attn_fwd(m, l, B, train, NULL);
    if (st) return st;
    bki_sub_last(m, R, I, a->att, o->proj_w, o->proj_b, p, 1 + 2 * l, x, &n1, a->mid);
    if (c->mlp_dim > 0) bki_mlp_fwd(m, l, R, a->mid, a->out, p, 2 + 2 * l);
    return BK_OK;
}

/* dX = d(block output) -> d(block input) */
bk_status bki_enc_block_bwd(bk_model *m, int l, int B, const float *xin)
{
    blk_act *a = &m->ba[l];
    const blk_off *o = &m->bo[l];
    const bk_model_config *c = &m->c;
    const int D = c->dim, I = m->I, R = B * m->T;
    if (c->mlp_dim > 0) bki_mlp_bwd(m, l, R, a->mid, 2 + 2 * l);
    const sub_norm n1 = bki_norm1(m, l);
    const float *dy = bki_sub_bwd_in(m, R, &n1, 1 + 2 * l);
    bki_linear_bwd(R, I, D, a->att, I, m->w + o->proj_w, dy, D, m->dA, 0.0f, m->gw + o->proj_w, m->gw + o->proj_b, bki_kb(m, D, I));
    bk_status st = attn_backward(m, l, B);
    if (st) return st;
    /* qkv = h Wqkv^T: three blocks of rows of W, one per q / k / v */
    float *dsrc[3] = {m->dq, m->dk, m->dv};
    const float *h = bki_sub_h(m, &n1, xin);
    for (int j = 0; j < 3; j++)
        bki_linear_bwd(R, D, I, h, D, m->w + o->qkv_w + (size_t)j * I * D, dsrc[j], I, m->dT, j ? 1.0f : 0.0f,
                       m->gw + o->qkv_w + (size_t)j * I * D, c->qkv_bias ? m->gw + o->qkv_b + (size_t)j * I : NULL, bki_kb(m, I, D));
    bki_sub_bwd_out(m, R, xin, &n1);
    return BK_OK;
}

/* ---- the cross-attention sublayer of unit L --------------------------------
 * One mechanism for the decoder's cross-attention and the Set Transformer's
 * MABs: queries from the stream x [B*Nq, D] through the sublayer's norm
 * (lnc), keys and values from mem [B*Nk, D] (the encoder's output, a MAB's
 * normalised key set) as they are:
 *   out = x + drop(proj(Attn(LNc(x) Wq [+ bq], mem Wkv [+ bkv])) + bproj)
 * (post-LN as the other sublayers), attention kind site_kind(cross site). */
void bki_cross_views(const bk_model *m, blk_act *a, const bki_cross_shape *cs, bk_tensor *q, bk_tensor *k,
                        bk_tensor *v, bk_tensor *o)
{
    const int64_t Nq = cs->Nq, Nk = cs->Nk, I = m->I, dh = m->dh;
    *q = (bk_tensor){a->cq, Nq * I, dh, I, BK_DEVICE_HOST, BK_F32};
    *k = (bk_tensor){a->ckv, Nk * 2 * I, dh, 2 * I, BK_DEVICE_HOST, BK_F32};
    *v = (bk_tensor){a->ckv + I, Nk * 2 * I, dh, 2 * I, BK_DEVICE_HOST, BK_F32};
    *o = (bk_tensor){a->catt, Nq * I, dh, I, BK_DEVICE_HOST, BK_F32};
}

bk_status bki_cross_fwd(bk_model *m, int L, int B, const bki_cross_shape *cs, const float *x, const float *mem,
                           float *out, int train, int site)
{
    blk_act *a = &m->ba[L];
    const blk_off *o = &m->bo[L];
    const bk_model_config *c = &m->c;
    const int D = c->dim, I = m->I, Rq = B * cs->Nq, Rk = B * cs->Nk;
    const float p = train ? c->dropout : 0.0f;
    bk_tensor q, k, v, ot;
    bki_cross_views(m, a, cs, &q, &k, &v, &ot);
    const bk_attn_desc d = {B, c->heads, cs->Nq, cs->Nk, m->dh, m->dh, cs->nq, cs->nk};
    const sub_norm nc = normc(m, L);
    const float *h = bki_sub_in(m, Rq, x, &nc);
    bki_linear_fwd(Rq, D, I, h, D, m->w + o->cq_w, c->qkv_bias ? m->w + o->cq_b : NULL, a->cq, I);
    bki_linear_fwd(Rk, D, 2 * I, mem, D, m->w + o->ckv_w, c->qkv_bias ? m->w + o->ckv_b : NULL, a->ckv, 2 * I);
    bk_status st = bki_attn_forward(m, (attn_site){L, 1, 0}, &d, &q, &k, &v, &ot, NULL, train ? a->ctape : NULL);
    if (st) return st;
    bki_sub_last(m, Rq, I, a->catt, o->cproj_w, o->cproj_b, p, site, x, &nc, out);
    return BK_OK;
}

/* dX = d(out) -> d(x); ADDS d(mem) into dmem (x, mem: the forward's) */
bk_status bki_cross_bwd(bk_model *m, int L, int B, const bki_cross_shape *cs, const float *x, const float *mem,
                           float *dmem, int site)
{
    blk_act *a = &m->ba[L];
    const blk_off *o = &m->bo[L];
    const bk_model_config *c = &m->c;
    const int D = c->dim, I = m->I, Rq = B * cs->Nq, Rk = B * cs->Nk;
    const int64_t Nq = cs->Nq, Nk = cs->Nk, dh = m->dh;
    bk_tensor q, k, v, ot;
    bki_cross_views(m, a, cs, &q, &k, &v, &ot);
    const bk_attn_desc d = {B, c->heads, cs->Nq, cs->Nk, m->dh, m->dh, cs->nq, cs->nk};
    const bk_tensor dA = {m->dA, Nq * I, dh, I, BK_DEVICE_HOST, BK_F32}, dq = {m->dq, Nq * I, dh, I, BK_DEVICE_HOST, BK_F32},
                    dk = {m->dk, Nk * I, dh, I, BK_DEVICE_HOST, BK_F32}, dv = {m->dv, Nk * I, dh, I, BK_DEVICE_HOST, BK_F32};
    const sub_norm nc = normc(m, L);
    const float *dy = bki_sub_bwd_in(m, Rq, &nc, site);
    bki_linear_bwd(Rq, I, D, a->catt, I, m->w + o->cproj_w, dy, D, m->dA, 0.0f, m->gw + o->cproj_w,
                   m->gw + o->cproj_b, bki_kb(m, D, I));
    bk_status st = bki_attn_backward(m, (attn_site){L, 1, 0}, &d, &q, &k, &v, &dA, &dq, &dk, &dv, NULL, a->ctape);
    if (st) return st;
    bki_linear_bwd(Rq, D, I, bki_sub_h(m, &nc, x), D, m->w + o->cq_w, m->dq, I, m->dT, 0.0f, m->gw + o->cq_w,
                   c->qkv_bias ? m->gw + o->cq_b : NULL, bki_kb(m, I, D));
    /* kv = mem Wkv^T: the K rows of W, then the V rows */
    float *dkv[2] = {m->dk, m->dv};
    for (int i = 0; i < 2; i++)
        bki_linear_bwd(Rk, D, I, mem, D, m->w + o->ckv_w + (size_t)i * I * D, dkv[i], I, dmem, 1.0f,
                       m->gw + o->ckv_w + (size_t)i * I * D, c->qkv_bias ? m->gw + o->ckv_b + (size_t)i * I : NULL, bki_kb(m, I, D));
    bki_sub_bwd_out(m, Rq, x, &nc);
    return BK_OK;
}

/* the table's gradient: g[tok[r]] += scale dE[r] over n rows (rows with
 * tok < 0 skipped), parallel over column blocks, rows in order */
typedef struct {
    float *g;
    int D;
    const int32_t *tok;
    size_t n;
    const float *dE;
    float scale;
} table_scatter_args;

static void table_scatter_member(void *arg)
{
    const table_scatter_args *ts = arg;
    const int D = ts->D;
    const int32_t *tok = ts->tok;
    const size_t n = ts->n;
    const float scale = ts->scale;
    BKI_FOR(blk, (D + 31) / 32) {
        const int c0 = (int)blk * 32, cn = D - c0 < 32 ? D - c0 : 32;
        for (size_t r = 0; r < n; r++) {
            if (tok[r] < 0) continue;
            float *gr = ts->g + (size_t)tok[r] * D + c0;
            const float *er = ts->dE + r * D + c0;
            for (int k = 0; k < cn; k++) gr[k] += scale * er[k];
        }
    }
}

void bki_table_scatter(float *g, int D, const int32_t *tok, size_t n, const float *dE, float scale)
{
    table_scatter_args ts = {g, D, tok, n, dE, scale};
    bki_parallel_claimed(bki_threads(), table_scatter_member, &ts);
}
