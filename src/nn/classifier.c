/* classifier.c -- the classifier's own layers (docs/MODEL.md): the batch
 * check, the embedding (patches, tokens, points; [CLS]; positions) and its
 * backward, the trunk (embedding and encoder stack), the pooling (CLS,
 * mean, max, OTK with Nystrom anchors and PE, PMA) and its backward. */
#include "model_impl.h"
#include "../ops/op.h"
#include "../core/vexp.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* rows of a [rows, cols] matrix scaled to unit L2 norm (a zero row is left
 * as it is) */
void bki_unit_rows(float *w, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++) bki_unit_row(w + r * cols, (int)cols);
}

static bk_otk_desc otk_desc(const bk_model *m, int B)
{
    bk_otk_desc d = {B, m->T, m->c.dim, m->c.otk_refs, m->c.otk_supports, m->otk_k, m->nb};
    return d;
}

/* the OTK pool's operator parameters: log domain, the paper's convention
 * (scaling and PE on the plan only), the anchors of the parameter buffer
 * (W = NULL: the identity map) */
bk_otk_config bki_otk_params(const bk_model *m)
{
    const bk_model_config *c = &m->c;
    bk_otk_config p = bk_otk_config_default();
    p.eps = c->otk_eps;
    p.iters = c->otk_iters;
    p.W = m->otk_w >= 0 && m->w ? m->w + m->otk_w : NULL;
    p.sigma = c->otk_sigma;
    p.eta = c->otk_eta;
    p.pe = c->otk_pe;
    p.sigma_pos = c->otk_sigma_pos;
    if (c->otk_pe == BK_OTK_PE_2D) {
        p.grid_h = c->image_h / c->patch;
        p.grid_w = c->image_w / c->patch;
    }
    return p;
}
int64_t bki_model_sample_size(const bk_model *m)
{
    return m->c.input == BK_INPUT_IMAGE ? (int64_t)m->c.channels * m->c.image_h * m->c.image_w
                                        : (int64_t)m->np * (m->c.input == BK_INPUT_TOKENS ? 1 : m->in_feat);
}

bk_status bki_check_batch(const bk_model *m, const bk_batch *b, int need_labels)
{
    const bk_model_config *c = &m->c;
    if (!b) return bki_fail(BK_ERR_NULL, "model: NULL batch");
    if (b->B < 1 || b->B > m->max_batch)
        return bki_fail(BK_ERR_SHAPE, "model: batch of %d outside [1, max_batch = %d]", b->B, m->max_batch);
    if (c->arch == BK_ARCH_SEQ2SEQ) {
        (void)need_labels; /* (teacher forcing: the decoder reads the targets) */
        return bki_check_batch_s2s(m, b, 1);
    }
    if (c->input == BK_INPUT_TOKENS ? !b->tokens : !b->x)
        return bki_fail(BK_ERR_NULL, "model: the batch lacks its %s", c->input == BK_INPUT_TOKENS ? "tokens" : "inputs x");
    if (need_labels && !b->labels) return bki_fail(BK_ERR_NULL, "model: labels needed for the loss");
    if (b->len && c->input != BK_INPUT_IMAGE)
        for (int i = 0; i < b->B; i++)
            if (b->len[i] < 1 || b->len[i] > m->np)
                return bki_fail(BK_ERR_LENGTH, "model: len[%d] = %d outside [1, %d]", i, b->len[i], m->np);
    if (b->labels)
        for (int i = 0; i < b->B; i++)
            if (b->labels[i] < 0 || b->labels[i] >= c->classes)
                return bki_fail(BK_ERR_PARAM, "model: label[%d] = %d outside [0, %d)", i, b->labels[i], c->classes);
    if (c->input == BK_INPUT_TOKENS) {
        for (int64_t i = 0; i < (int64_t)b->B * m->np; i++)
            if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab)
                return bki_fail(BK_ERR_PARAM, "model: token %d at [%lld, %lld] outside [0, vocab = %d)", b->tokens[i],
                                (long long)(i / m->np), (long long)(i % m->np), c->vocab);
    } else {
        const int64_t per = bki_model_sample_size(m);
        for (int i = 0; i < b->B; i++) {
            const int64_t valid = c->input == BK_INPUT_POINTS && b->len ? (int64_t)b->len[i] * m->in_feat : per;
            const float *x = b->x + (int64_t)i * per;
            for (int64_t j = 0; j < valid; j++)
                if (!isfinite(x[j]))
                    return bki_fail(BK_ERR_NONFINITE, "model: input of sample %d has a non-finite value", i);
        }
    }
    return BK_OK;
}

/* embed_fwd's regions: the model and the batch, one row of B*np (the
 * input's rows) or of B*T (x0) an iteration */
typedef struct {
    bk_model *m;
    const bk_batch *bt;
} embed_args;

/* image patches into emb_in rows */
static void embed_patches_member(void *arg)
{
    const embed_args *ea = arg;
    bk_model *m = ea->m;
    const bk_batch *bt = ea->bt;
    const bk_model_config *c = &m->c;
    const int np = m->np;
    const int P = c->patch, gw = c->image_w / P, C = c->channels, Hh = c->image_h, Ww = c->image_w;
    BKI_FOR(r, (int64_t)bt->B * np) {
        const int b = (int)(r / np), pi = (int)(r % np), py = pi / gw, px = pi % gw;
        float *o = m->emb_in + (size_t)r * (size_t)m->in_feat;
        const float *img = bt->x + (size_t)b * C * Hh * Ww;
        for (int p1 = 0; p1 < P; p1++)
            for (int p2 = 0; p2 < P; p2++)
                for (int ch = 0; ch < C; ch++)
                    *o++ = img[((size_t)ch * Hh + (size_t)(py * P + p1)) * Ww + (size_t)(px * P + p2)];
    }
}

/* the tokens' table rows into emb_o */
static void embed_tokens_member(void *arg)
{
    const embed_args *ea = arg;
    bk_model *m = ea->m;
    const bk_batch *bt = ea->bt;
    const int D = m->c.dim;
    BKI_FOR(r, (int64_t)bt->B * m->np)
        memcpy(m->emb_o + (size_t)r * D, m->w + m->e_w + (size_t)bt->tokens[r] * D, sizeof(float) * (size_t)D);
}

/* the points into emb_in rows, padded rows zero */
static void embed_points_member(void *arg)
{
    const embed_args *ea = arg;
    bk_model *m = ea->m;
    const bk_batch *bt = ea->bt;
    const int np = m->np, pd = m->in_feat;
    BKI_FOR(r, (int64_t)bt->B * np) {
        const int b = (int)(r / np), i = (int)(r % np);
        const int valid = bt->len ? bt->len[b] : np;
        if (i < valid)
            memcpy(m->emb_in + (size_t)r * pd, bt->x + (size_t)r * pd, sizeof(float) * (size_t)pd);
        else
            memset(m->emb_in + (size_t)r * pd, 0, sizeof(float) * (size_t)pd);
    }
}

/* x0 rows: [cls;] emb_o [+ pos] */
static void embed_rows_member(void *arg)
{
    const embed_args *ea = arg;
    bk_model *m = ea->m;
    const bk_model_config *c = &m->c;
    const int np = m->np, T = m->T, D = c->dim;
    const float *cls = c->cls ? m->w + m->cls_o : NULL, *pos = c->pos_embed ? m->w + m->pos_o : NULL;
    BKI_FOR(r, (int64_t)ea->bt->B * T) {
        const int b = (int)(r / T), t = (int)(r % T);
        float *x = m->x0 + (size_t)r * D;
        if (c->cls && t == 0)
            memcpy(x, cls, sizeof(float) * (size_t)D);
        else
            memcpy(x, m->emb_o + ((size_t)b * np + (size_t)(t - c->cls)) * D, sizeof(float) * (size_t)D);
        if (pos)
            for (int k = 0; k < D; k++) x[k] += pos[(size_t)t * D + k];
    }
}

/* x0 = [cls;] embed(input) [+ pos], dropout, padded rows zero */
static void embed_fwd(bk_model *m, const bk_batch *bt, int train)
{
    const bk_model_config *c = &m->c;
    const int B = bt->B, np = m->np, T = m->T, D = c->dim, nt = bki_threads();
    const size_t Bn = (size_t)B * (size_t)np;
    embed_args ea = {m, bt};
    if (c->input == BK_INPUT_IMAGE) {
        bki_parallel_claimed(nt, embed_patches_member, &ea);
        bki_linear_fwd((int)Bn, m->in_feat, D, m->emb_in, m->in_feat, m->w + m->e_w, m->w + m->e_b, m->emb_o, D);
    } else if (c->input == BK_INPUT_TOKENS) {
        memcpy(m->tokens, bt->tokens, sizeof(int32_t) * Bn);
        bki_parallel_claimed(nt, embed_tokens_member, &ea);
    } else {
        const int pd = m->in_feat;
        bki_parallel_claimed(nt, embed_points_member, &ea);
        bki_linear_fwd((int)Bn, pd, D, m->emb_in, pd, m->w + m->e_w, m->w + m->e_b, m->emb_h, D);
        bki_gelu_fwd(Bn * (size_t)D, m->emb_h, m->emb_g);
        bki_linear_fwd((int)Bn, D, D, m->emb_g, D, m->w + m->e_w2, m->w + m->e_b2, m->emb_o, D);
    }
    bki_parallel_claimed(nt, embed_rows_member, &ea);
    if (train && c->dropout > 0.0f) bki_dropout(m->x0, B * T, D, D, c->dropout, bki_dropout_key(m->seed, m->cur_count, 0));
    for (int b = 0; b < B; b++)
        if (m->nb[b] < T) memset(m->x0 + ((size_t)b * T + (size_t)m->nb[b]) * D, 0, sizeof(float) * (size_t)(T - m->nb[b]) * D);
}

bk_status bki_pool_fwd(bk_model *m, int B, int train)
{
    const bk_model_config *c = &m->c;
    const int T = m->T, D = c->dim;
    const float *h = m->fin;
    if (c->pool == BK_POOL_PMA) return bki_pma_fwd(m, B, train);
    if (c->pool == BK_POOL_OTK) {
        bk_otk_desc od = otk_desc(m, B);
        bk_otk_config op = bki_otk_params(m);
        bk_tensor x = {(float *)h, (int64_t)T * D, 0, D, BK_DEVICE_HOST, BK_F32};
        bk_tensor out = {m->pooled, (int64_t)m->F, 0, (int64_t)c->otk_refs * m->otk_k, BK_DEVICE_HOST, BK_F32};
        bk_status st = bki_model_ensure_ws(m, bk_otk_workspace_size(&od, &op));
        if (st) return st;
        return bk_otk_forward(&od, &op, &x, m->w + m->otk_z, &out, train ? m->otk_tape : NULL, NULL, m->ws, m->ws_cap);
    }
    for (int b = 0; b < B; b++) {
        const float *hb = h + (size_t)b * T * D;
        float *o = m->pooled + (size_t)b * D;
        const int n = m->nb[b];
        if (c->pool == BK_POOL_CLS) {
            memcpy(o, hb, sizeof(float) * (size_t)D);
        } else if (c->pool == BK_POOL_MEAN) {
            for (int k = 0; k < D; k++) {
                double s = 0.0;
                for (int t = 0; t < n; t++) s += hb[(size_t)t * D + k];
                o[k] = (float)(s / n);
            }
        } else {
            for (int k = 0; k < D; k++) {
                int best = 0;
                for (int t = 1; t < n; t++)
                    if (hb[(size_t)t * D + k] > hb[(size_t)best * D + k]) best = t;
                o[k] = hb[(size_t)best * D + k];
                m->argmax[(size_t)b * D + k] = best;
            }
        }
    }
    return BK_OK;
}

/* the classifier's trunk on a checked batch: valid lengths, embedding,
 * blocks and final norm into m->fin, the rows the pool reads */
bk_status bki_trunk_fwd(bk_model *m, const bk_batch *bt, int train)
{
    const bk_model_config *c = &m->c;
    const int B = bt->B;
    for (int b = 0; b < B; b++) m->nb[b] = (c->input != BK_INPUT_IMAGE && bt->len ? bt->len[b] : m->np) + c->cls;
    if (m->nb1)
        for (int b = 0; b < B; b++) m->nb1[b] = m->nb[b] - 1;
    if (bt->labels) memcpy(m->labels, bt->labels, sizeof(int32_t) * (size_t)B);
    embed_fwd(m, bt, train);
    return bki_encoder_fwd(m, B, train);
}

bk_status bki_pool_bwd(bk_model *m, int B)
{
    const bk_model_config *c = &m->c;
    const int T = m->T, D = c->dim;
    memset(m->dN, 0, sizeof(float) * (size_t)B * T * D);
    if (c->pool == BK_POOL_PMA) return bki_pma_bwd(m, B);
    if (c->pool == BK_POOL_OTK) {
        bk_otk_desc od = otk_desc(m, B);
        bk_otk_config op = bki_otk_params(m);
        bk_tensor x = {m->fin, (int64_t)T * D, 0, D, BK_DEVICE_HOST, BK_F32};
        bk_tensor dout = {m->dpool, (int64_t)m->F, 0, (int64_t)c->otk_refs * m->otk_k, BK_DEVICE_HOST, BK_F32};
        bk_tensor dx = {m->dN, (int64_t)T * D, 0, D, BK_DEVICE_HOST, BK_F32};
        bk_status st = bki_model_ensure_ws(m, bk_otk_workspace_size(&od, &op));
        if (st) return st;
        st = bk_otk_backward(&od, &op, &x, m->w + m->otk_z, &dout, m->otk_tape, &dx, m->dZtmp, m->dWtmp, m->ws,
                             m->ws_cap);
        if (st) return st;
        bki_add_into(m->gw + m->otk_z, m->dZtmp, (size_t)c->otk_refs * c->otk_supports * m->otk_k);
        if (m->otk_w >= 0) bki_add_into(m->gw + m->otk_w, m->dWtmp, (size_t)c->otk_anchors * D);
        return BK_OK;
    }
    for (int b = 0; b < B; b++) {
        float *db = m->dN + (size_t)b * T * D;
        const float *g = m->dpool + (size_t)b * D;
        const int n = m->nb[b];
        if (c->pool == BK_POOL_CLS) {
            memcpy(db, g, sizeof(float) * (size_t)D);
        } else if (c->pool == BK_POOL_MEAN) {
            for (int t = 0; t < n; t++)
                for (int k = 0; k < D; k++) db[(size_t)t * D + k] = g[k] / (float)n;
        } else {
            for (int k = 0; k < D; k++) db[(size_t)m->argmax[(size_t)b * D + k] * D + k] = g[k];
        }
    }
    return BK_OK;
}

/* the token rows' gradient gathered from dX [B*T, D] into dE [B*np, D] */
typedef struct {
    float *dE;
    const float *dX;
    int64_t Bn;
    int np, T, D, cls;
} gather_args;

static void gather_member(void *arg)
{
    const gather_args *ga = arg;
    const int np = ga->np, T = ga->T, D = ga->D;
    BKI_FOR(r, ga->Bn) {
        const int b = (int)(r / np), i = (int)(r % np);
        memcpy(ga->dE + (size_t)r * D, ga->dX + ((size_t)b * T + (size_t)(i + ga->cls)) * D, sizeof(float) * (size_t)D);
    }
}

void bki_embed_bwd(bk_model *m, int B)
{
    const bk_model_config *c = &m->c;
    const int T = m->T, D = c->dim, np = m->np, nt = bki_threads();
    const size_t Bn = (size_t)B * (size_t)np;
    float *dX = m->dX;
    for (int b = 0; b < B; b++)
        if (m->nb[b] < T) memset(dX + ((size_t)b * T + (size_t)m->nb[b]) * D, 0, sizeof(float) * (size_t)(T - m->nb[b]) * D);
    if (c->dropout > 0.0f) bki_dropout(dX, B * T, D, D, c->dropout, bki_dropout_key(m->seed, m->cur_count, 0));
    if (c->pos_embed) {
        bki_pos_grad_args pg = {m->gw + m->pos_o, dX, T, B, D};
        bki_parallel_claimed(nt, bki_pos_grad_member, &pg);
    }
    if (c->cls) {
        float *g = m->gw + m->cls_o;
        for (int b = 0; b < B; b++) bki_add_into(g, dX + (size_t)b * T * D, (size_t)D);
    }
    /* gather the token rows' gradient into [B*np, D] */
    float *dE = m->dT;
    gather_args ga = {dE, dX, (int64_t)Bn, np, T, D, c->cls};
    bki_parallel_claimed(nt, gather_member, &ga);
    if (c->input == BK_INPUT_IMAGE) {
        bki_linear_bwd((int)Bn, m->in_feat, D, m->emb_in, m->in_feat, m->w + m->e_w, dE, D, NULL, 0.0f, m->gw + m->e_w,
                       m->gw + m->e_b, bki_kb(m, D, m->in_feat));
    } else if (c->input == BK_INPUT_TOKENS) {
        bki_table_scatter(m->gw + m->e_w, D, m->tokens, Bn, dE, 1.0f);
    } else {
        const int pd = m->in_feat;
        float *dG = m->dM;
        bki_linear_bwd((int)Bn, D, D, m->emb_g, D, m->w + m->e_w2, dE, D, dG, 0.0f, m->gw + m->e_w2, m->gw + m->e_b2, bki_kb(m, D, D));
        bki_gelu_bwd(Bn * (size_t)D, m->emb_h, dG, dG);
        bki_linear_bwd((int)Bn, pd, D, m->emb_in, pd, m->w + m->e_w, dG, D, NULL, 0.0f, m->gw + m->e_w, m->gw + m->e_b, bki_kb(m, D, pd));
    }
}
