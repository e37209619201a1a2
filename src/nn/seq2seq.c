/* seq2seq.c -- the encoder-decoder (docs/MODEL.md "Encoder-decoder"):
 * decoder blocks (causal softmax self-attention, cross-attention, MLP), the
 * token embedding with scaled and sinusoidal positions, the token-averaged
 * loss over the tied output projection, forward and backward; the batch
 * check of a translation batch. */
#include "model_impl.h"
#include "../ops/op.h"
#include "../core/vexp.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* forward                                                                  */
/* ------------------------------------------------------------------------ */
/* the seq2seq batch: source ids and lengths, targets when needed */
bk_status bki_check_batch_s2s(const bk_model *m, const bk_batch *b, int need_tgt)
{
    const bk_model_config *c = &m->c;
    if (!b->tokens) return bki_fail(BK_ERR_NULL, "model: the batch lacks its source tokens");
    if (need_tgt && (!b->tgt || !b->tgt_len))
        return bki_fail(BK_ERR_NULL, "model: a seq2seq forward needs the targets (tgt and tgt_len: the decoder "
                                     "reads them shifted right; bk_model_translate decodes without them)");
    for (int i = 0; i < b->B; i++) {
        const int n = b->len ? b->len[i] : c->max_len;
        if (n < 1 || n > c->max_len)
            return bki_fail(BK_ERR_LENGTH, "model: source length len[%d] = %d outside [1, max_len = %d]", i, n,
                            c->max_len);
        for (int t = 0; t < n; t++) {
            const int32_t v = b->tokens[(size_t)i * c->max_len + t];
            if (v < 0 || v >= c->vocab)
                return bki_fail(BK_ERR_PARAM, "model: source token %d at [%d, %d] outside [0, vocab = %d)", v, i, t,
                                c->vocab);
        }
        if (!b->tgt || !b->tgt_len) continue;
        const int nt = b->tgt_len[i];
        if (nt < 1 || nt > c->tgt_max_len)
            return bki_fail(BK_ERR_LENGTH, "model: target length tgt_len[%d] = %d outside [1, tgt_max_len = %d]", i,
                            nt, c->tgt_max_len);
        for (int t = 0; t < nt; t++) {
            const int32_t v = b->tgt[(size_t)i * c->tgt_max_len + t];
            if (v < 0 || v >= c->vocab)
                return bki_fail(BK_ERR_PARAM, "model: target token %d at [%d, %d] outside [0, vocab = %d)", v, i, t,
                                c->vocab);
        }
    }
    return BK_OK;
}

/* ---- the encoder-decoder (arch = seq2seq) -------------------------------- */
/* block index of decoder block j, and its dropout sites (self, cross, MLP) */
static int dec_index(const bk_model *m, int j) { return m->c.depth + j; }
static int dec_site(const bk_model *m, int j) { return 1 + 2 * m->c.depth + 3 * j; }
static int dec_embed_site(const bk_model *m) { return 1 + 2 * m->c.depth + 3 * m->c.dec_depth; }

static void dec_views(const bk_model *m, blk_act *a, bk_tensor *q, bk_tensor *k, bk_tensor *v, bk_tensor *o)
{
    const int64_t Td = m->Td, I = m->I, dh = m->dh;
    *q = (bk_tensor){a->qkv, Td * 3 * I, dh, 3 * I, BK_DEVICE_HOST, BK_F32};
    *k = (bk_tensor){a->qkv + I, Td * 3 * I, dh, 3 * I, BK_DEVICE_HOST, BK_F32};
    *v = (bk_tensor){a->qkv + 2 * I, Td * 3 * I, dh, 3 * I, BK_DEVICE_HOST, BK_F32};
    *o = (bk_tensor){a->att, Td * I, dh, I, BK_DEVICE_HOST, BK_F32};
}

/* decoder block j on B samples: x [B*Td, D] -> out, attending to the
 * encoder's output m->fin [B*T, D] */
static bk_status dec_block_fwd(bk_model *m, int j, int B, const float *x, int train)
{
    const int L = dec_index(m, j), site = dec_site(m, j);
    blk_act *a = &m->ba[L];
    const blk_off *o = &m->bo[L];
    const bk_model_config *c = &m->c;
    const int D = c->dim, I = m->I, Rd = B * m->Td;
    const float p = train ? c->dropout : 0.0f;
    bk_tensor q, k, v, ot;
    dec_views(m, a, &q, &k, &v, &ot);
    const bk_attn_desc ds = {B, c->heads, m->Td, m->Td, m->dh, m->dh, m->nbt, m->nbt};
    /* causal softmax self-attention */
    const sub_norm n1 = bki_norm1(m, L);
    const float *h = bki_sub_in(m, Rd, x, &n1);
    bki_linear_fwd(Rd, D, 3 * I, h, D, m->w + o->qkv_w, c->qkv_bias ? m->w + o->qkv_b : NULL, a->qkv, 3 * I);
    bk_status st = bki_attn_forward(m, (attn_site){L, 0, 1}, &ds, &q, &k, &v, &ot, NULL, train ? a->tape : NULL);
    if (st) return st;
    bki_sub_last(m, Rd, I, a->att, o->proj_w, o->proj_b, p, site, x, &n1, a->mid);
    /* cross-attention: queries from the stream, keys and values from the
     * encoder's output */
    const bki_cross_shape cs = {m->Td, m->T, m->nbt, m->nb};
    if ((st = bki_cross_fwd(m, L, B, &cs, a->mid, m->fin, a->cmid, train, site + 1))) return st;
    if (c->mlp_dim > 0) bki_mlp_fwd(m, L, Rd, a->cmid, a->out, p, site + 2);
    return BK_OK;
}

/* dX = d(block output) -> d(block input); adds d(encoder output) into dMem */
static bk_status dec_block_bwd(bk_model *m, int j, int B, const float *xin)
{
    const int L = dec_index(m, j), site = dec_site(m, j);
    blk_act *a = &m->ba[L];
    const blk_off *o = &m->bo[L];
    const bk_model_config *c = &m->c;
    const int D = c->dim, I = m->I, Rd = B * m->Td;
    const int64_t Td = m->Td, dh = m->dh;
    bk_tensor q, k, v, ot;
    dec_views(m, a, &q, &k, &v, &ot);
    const bk_attn_desc ds = {B, c->heads, m->Td, m->Td, m->dh, m->dh, m->nbt, m->nbt};
    const bk_tensor dA = {m->dA, Td * I, dh, I, BK_DEVICE_HOST, BK_F32}, dq = {m->dq, Td * I, dh, I, BK_DEVICE_HOST, BK_F32},
                    dk = {m->dk, Td * I, dh, I, BK_DEVICE_HOST, BK_F32}, dv = {m->dv, Td * I, dh, I, BK_DEVICE_HOST, BK_F32};
    bk_status st;
    if (c->mlp_dim > 0) bki_mlp_bwd(m, L, Rd, a->cmid, site + 2);
    /* cross-attention */
    const bki_cross_shape cs = {m->Td, m->T, m->nbt, m->nb};
    if ((st = bki_cross_bwd(m, L, B, &cs, a->mid, m->fin, m->dMem, site + 1))) return st;
    /* causal self-attention */
    const sub_norm n1 = bki_norm1(m, L);
    const float *dy = bki_sub_bwd_in(m, Rd, &n1, site);
    bki_linear_bwd(Rd, I, D, a->att, I, m->w + o->proj_w, dy, D, m->dA, 0.0f, m->gw + o->proj_w, m->gw + o->proj_b, bki_kb(m, D, I));
    if ((st = bki_attn_backward(m, (attn_site){L, 0, 1}, &ds, &q, &k, &v, &dA, &dq, &dk, &dv, NULL, a->tape))) return st;
    float *dsrc[3] = {m->dq, m->dk, m->dv};
    const float *h = bki_sub_h(m, &n1, xin);
    for (int i = 0; i < 3; i++)
        bki_linear_bwd(Rd, D, I, h, D, m->w + o->qkv_w + (size_t)i * I * D, dsrc[i], I, m->dT, i ? 1.0f : 0.0f,
                       m->gw + o->qkv_w + (size_t)i * I * D, c->qkv_bias ? m->gw + o->qkv_b + (size_t)i * I : NULL, bki_kb(m, I, D));
    bki_sub_bwd_out(m, Rd, xin, &n1);
    return BK_OK;
}

/* x[b, t] = sqrt(dim) table[tok[b, t]] + pos[t] over [B, N] (tok row stride
 * N), dropout, rows t >= len[b] zero */
typedef struct {
    const int32_t *tok, *len;
    int N, D;
    float sc;
    const float *E, *pos;
    float *x;
    int64_t n;
} s2s_embed_args;

static void s2s_embed_member(void *arg)
{
    const s2s_embed_args *se = arg;
    const int N = se->N, D = se->D;
    const float sc = se->sc, *E = se->E, *pos = se->pos;
    BKI_FOR(r, se->n) {
        const int b = (int)(r / N), t = (int)(r % N);
        float *xr = se->x + (size_t)r * D;
        if (t >= se->len[b]) {
            memset(xr, 0, sizeof(float) * (size_t)D);
            continue;
        }
        const float *e = E + (size_t)se->tok[r] * D;
        for (int k = 0; k < D; k++) xr[k] = sc * e[k] + (pos ? pos[(size_t)t * D + k] : 0.0f);
    }
}

static void s2s_embed_fwd(bk_model *m, const int32_t *tok, const int32_t *len, int B, int N, int64_t pos_o, float *x,
                          int train, int site)
{
    const bk_model_config *c = &m->c;
    const int D = c->dim, nt = bki_threads();
    const float sc = sqrtf((float)D);
    const float *E = m->w + m->e_w;
    const float *pos = c->pos_embed == 1 ? m->w + pos_o : c->pos_embed == 2 ? m->sin_tab : NULL;
    s2s_embed_args se = {tok, len, N, D, sc, E, pos, x, (int64_t)B * N};
    bki_parallel_claimed(nt, s2s_embed_member, &se);
    if (train && c->dropout > 0.0f) bki_dropout(x, B * N, D, D, c->dropout, bki_dropout_key(m->seed, m->cur_count, site));
}

/* backward of s2s_embed_fwd from dx (modified: dropout applied, padded rows
 * zeroed) into the table and the learned positions; tok's padded entries
 * are set to -1 */
static void s2s_embed_bwd(bk_model *m, int32_t *tok, const int32_t *len, int B, int N, int64_t pos_o, float *dx,
                          int site)
{
    const bk_model_config *c = &m->c;
    const int D = c->dim, nt = bki_threads();
    for (int b = 0; b < B; b++)
        if (len[b] < N) {
            memset(dx + ((size_t)b * N + (size_t)len[b]) * D, 0, sizeof(float) * (size_t)(N - len[b]) * D);
            for (int t = len[b]; t < N; t++) tok[(size_t)b * N + t] = -1;
        }
    if (c->dropout > 0.0f) bki_dropout(dx, B * N, D, D, c->dropout, bki_dropout_key(m->seed, m->cur_count, site));
    if (c->pos_embed == 1) {
        bki_pos_grad_args pg = {m->gw + pos_o, dx, N, B, D};
        bki_parallel_claimed(nt, bki_pos_grad_member, &pg);
    }
    bki_table_scatter(m->gw + m->e_w, D, tok, (size_t)B * N, dx, sqrtf((float)D));
}

/* one row of the target logits an iteration: its probabilities in place,
 * loss and hit into rl; finite cleared by any row with a non-finite lse */
typedef struct {
    bk_model *m;
    int V, Td, Rd;
    float ls;
    double *rl;
    _Atomic int finite;
} s2s_loss_args;

static void s2s_loss_member(void *arg)
{
    s2s_loss_args *sl = arg;
    bk_model *m = sl->m;
    const int V = sl->V, Td = sl->Td;
    const float ls = sl->ls;
    double *rl = sl->rl;
    BKI_FOR(i, sl->Rd) {
        const int r = (int)i;
        const int b = r / Td, t = r % Td;
        float *z = m->plog + (size_t)r * V;
        if (t >= m->nbt[b]) {
            memset(z, 0, sizeof(float) * (size_t)V);
            rl[2 * r] = rl[2 * r + 1] = 0.0;
            continue;
        }
        const int y = m->tgt[r];
        int best = 0;
        float mx = z[0];
        double sz = 0.0;
        for (int j = 1; j < V; j++)
            if (z[j] > mx) mx = z[j], best = j;
        for (int j = 0; j < V; j++) sz += z[j];
        const double zy = z[y];
        /* exp(z - max) in place (the vectorised exp, 2 ulp), then the
         * probabilities */
        double s = 0.0;
        for (int j = 0; j < V; j++) {
            z[j] = bki_expf(z[j] - mx);
            s += z[j];
        }
        const double lse = mx + log(s);
        if (!isfinite(lse)) atomic_store(&sl->finite, 0);
        rl[2 * r] = (1.0 - ls) * (lse - zy) + ls * (lse - sz / V);
        rl[2 * r + 1] = best == y;
        const float is = (float)(1.0 / s);
        for (int j = 0; j < V; j++) z[j] *= is;
    }
}

/* logits = h table^T over the valid target rows, label-smoothed
 * cross-entropy averaged over the valid target tokens; plog keeps the
 * probabilities (rows of padded positions zero) */
static bk_status s2s_loss(bk_model *m, int B, float ls, float *logits, double *loss)
{
    const bk_model_config *c = &m->c;
    const int D = c->dim, V = c->vocab, Td = m->Td, nt = bki_threads(), Rd = B * Td;
    bki_linear_fwd(Rd, D, V, m->dfin, D, m->w + m->e_w, NULL, m->plog, V);
    if (logits) {
        memset(logits, 0, sizeof(float) * (size_t)B * c->tgt_max_len * V);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < m->nbt[b]; t++)
                memcpy(logits + ((size_t)b * c->tgt_max_len + t) * V, m->plog + ((size_t)b * Td + t) * V,
                       sizeof(float) * (size_t)V);
    }
    double *rl = m->rloss; /* per row: loss, hit */
    s2s_loss_args sl = {m, V, Td, Rd, ls, rl, 1};
    bki_parallel_claimed(nt, s2s_loss_member, &sl);
    if (!atomic_load(&sl.finite)) return bki_fail(BK_ERR_NONFINITE, "model: non-finite logits (diverged parameters?)");
    double total = 0.0;
    int64_t hits = 0;
    for (int r = 0; r < Rd; r++) {
        total += rl[2 * r];
        hits += rl[2 * r + 1] != 0.0;
    }
    m->ncorrect = hits;
    if (loss) *loss = total / (double)m->ntok;
    return BK_OK;
}

/* the encoder on B sources (rows of stride `stride`, lengths len, NULL:
 * max_len): T = the longest, the tokens packed [B, T], embedded, the
 * blocks and the final norm into m->fin (training forward and decoding) */
static bk_status encode_src(bk_model *m, const int32_t *src, int stride, const int32_t *len, int B, int train)
{
    int S = 1;
    for (int b = 0; b < B; b++) {
        m->nb[b] = len ? len[b] : m->c.max_len;
        S = m->nb[b] > S ? m->nb[b] : S;
    }
    m->T = S;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < S; t++) m->tokens[(size_t)b * S + t] = t < m->nb[b] ? src[(size_t)b * stride + t] : 0;
    s2s_embed_fwd(m, m->tokens, m->nb, B, S, m->pos_o, m->x0, train, 0);
    return bki_encoder_fwd(m, B, train);
}

bk_status bki_s2s_forward(bk_model *m, const bk_batch *bt, int train, float ls, float *logits, double *loss)
{
    const bk_model_config *c = &m->c;
    const int B = bt->B, D = c->dim;
    bk_status st;
    /* the encoder on the sources (T = the longest), then the decoder on
     * Td = the longest target's positions */
    if ((st = encode_src(m, bt->tokens, c->max_len, bt->len, B, train))) return st;
    int Td = 1;
    for (int b = 0; b < B; b++) {
        m->nbt[b] = bt->tgt_len ? bt->tgt_len[b] : c->tgt_max_len;
        Td = m->nbt[b] > Td ? m->nbt[b] : Td;
    }
    m->Td = Td;
    m->ntok = 0;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < Td; t++) {
            const int valid = t < m->nbt[b];
            m->dtok[(size_t)b * Td + t] = !valid ? 0 : t == 0 ? c->bos : bt->tgt[(size_t)b * c->tgt_max_len + t - 1];
            m->tgt[(size_t)b * Td + t] = valid && bt->tgt ? bt->tgt[(size_t)b * c->tgt_max_len + t] : 0;
        }
        m->ntok += m->nbt[b];
    }
    const int Rd = B * Td;
    /* decoder */
    s2s_embed_fwd(m, m->dtok, m->nbt, B, Td, m->dpos_o, m->dx0, train, dec_embed_site(m));
    const float *x = m->dx0;
    for (int j = 0; j < c->dec_depth; j++) {
        if ((st = dec_block_fwd(m, j, B, x, train))) return st;
        x = m->ba[dec_index(m, j)].out;
    }
    if (c->final_norm)
        bki_layernorm_fwd(Rd, D, x, m->w + m->dnrm_w, m->w + m->dnrm_b, c->ln_eps, m->dfin, m->dfmu, m->dfrs);
    else
        memcpy(m->dfin, x, sizeof(float) * (size_t)Rd * D);
    return s2s_loss(m, B, ls, logits, loss);
}

/* the encoder alone (inference) on B sentences: m->fin = memory [B*T, D],
 * T = the longest source, m->nb the lengths (decoding; src rows of stride
 * `stride`) */
bk_status bki_s2s_encode(bk_model *m, const int32_t *src, int stride, const int32_t *len, int B)
{
    m->have_tape = 0;
    m->B = B;
    return encode_src(m, src, stride, len, B, 0);
}

typedef struct {
    bk_model *m;
    int V, Td, Rd;
    float ls, k;
} s2s_dlogits_args;

/* dlogits = k (p - target) on the valid rows, one row an iteration */
static void s2s_dlogits_member(void *arg)
{
    const s2s_dlogits_args *sd = arg;
    bk_model *m = sd->m;
    const int V = sd->V, Td = sd->Td;
    const float ls = sd->ls, k = sd->k;
    BKI_FOR(i, sd->Rd) {
        const int r = (int)i;
        if (r % Td >= m->nbt[r / Td]) continue;
        float *p = m->plog + (size_t)r * V;
        for (int j = 0; j < V; j++) p[j] = k * (p[j] - ls / (float)V);
        p[m->tgt[r]] -= k * (1.0f - ls);
    }
}

bk_status bki_s2s_backward(bk_model *m, float grad_scale)
{
    const bk_model_config *c = &m->c;
    const int B = m->B, D = c->dim, V = c->vocab, Td = m->Td, S = m->T, Rd = B * Td, Re = B * S, nt = bki_threads();
    const float ls = m->ls, k = grad_scale / (float)m->ntok;
    bk_status st;
    /* dlogits = k (p - target) on the valid rows (padded rows are zero) */
    s2s_dlogits_args sd = {m, V, Td, Rd, ls, k};
    bki_parallel_claimed(nt, s2s_dlogits_member, &sd);
    bki_linear_bwd(Rd, D, V, m->dfin, D, m->w + m->e_w, m->plog, V, m->dN, 0.0f, m->gw + m->e_w, NULL, bki_kb(m, V, D));
    const float *xlast = m->ba[dec_index(m, c->dec_depth - 1)].out;
    if (c->final_norm) {
        memset(m->dX, 0, sizeof(float) * (size_t)Rd * D);
        bki_layernorm_bwd(Rd, D, xlast, m->dfmu, m->dfrs, m->w + m->dnrm_w, m->dN, m->dX, m->gw + m->dnrm_w,
                          m->gw + m->dnrm_b);
    } else {
        memcpy(m->dX, m->dN, sizeof(float) * (size_t)Rd * D);
    }
    memset(m->dMem, 0, sizeof(float) * (size_t)Re * D);
    for (int j = c->dec_depth - 1; j >= 0; j--)
        if ((st = dec_block_bwd(m, j, B, j > 0 ? m->ba[dec_index(m, j - 1)].out : m->dx0))) return st;
    s2s_embed_bwd(m, m->dtok, m->nbt, B, Td, m->dpos_o, m->dX, dec_embed_site(m));
    /* encoder, from d(its output) */
    const float *elast = c->depth > 0 ? m->ba[c->depth - 1].out : m->x0;
    if (c->final_norm) {
        memset(m->dX, 0, sizeof(float) * (size_t)Re * D);
        bki_layernorm_bwd(Re, D, elast, m->fmu, m->frs, m->w + m->nrm_w, m->dMem, m->dX, m->gw + m->nrm_w,
                          m->gw + m->nrm_b);
    } else {
        memcpy(m->dX, m->dMem, sizeof(float) * (size_t)Re * D);
    }
    for (int l = c->depth - 1; l >= 0; l--)
        if ((st = bki_enc_block_bwd(m, l, B, l > 0 ? m->ba[l - 1].out : m->x0))) return st;
    s2s_embed_bwd(m, m->tokens, m->nb, B, S, m->pos_o, m->dX, 0);
    return BK_OK;
}
