/* seq2seq_step.c -- the encoder-decoder's incremental decoding: one
 * position of every hypothesis per call, each decoder layer's keys and
 * values kept (docs/MODEL.md, "Decoding"). The training forward (model.c)
 * runs the decoder on whole target sentences with the registered causal
 * softmax operator; a step is the same arithmetic on one query row per
 * hypothesis: the self-attention over the cached positions 0..t, the
 * cross-attention (softmax: a doubly-stochastic cross-attention normalises
 * over all target positions and has no step form) over the sentence's
 * encoder output, the MLP, the final norm and the tied output projection.
 * Rows are independent: each row's arithmetic is the same for any number of
 * threads and any batch. */
#include "model_impl.h"
#include "../core/vexp.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct bki_s2s_dec {
    bk_model *m;
    int B, beam, rows, tmax, cache, S, pst;
    float *kc, *vc;        /* [layers][rows, tmax, I]: cached keys, values   */
    float *ckv;            /* [layers][B*S, 2I]: cross keys | values          */
    float *scratch;        /* [rows, tmax, I]: reorder buffer                  */
    int32_t *prefix, *ptmp;/* [rows, tmax]: tokens fed, reorder buffer        */
    float *x, *h, *y, *qkv, *att, *f1, *g1, *mu, *rs, *p;
};

void bki_s2s_dec_free(bki_s2s_dec *d)
{
    if (!d) return;
    void *bufs[] = {d->kc, d->vc, d->ckv, d->scratch, d->prefix, d->ptmp, d->x, d->h, d->y, d->qkv,
                    d->att, d->f1, d->g1, d->mu, d->rs, d->p};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(d);
}

static float *fnew(size_t n) { return malloc(sizeof(float) * (n ? n : 1)); }

bk_status bki_s2s_dec_create(bk_model *m, int B, int beam, int max_steps, int cache, bki_s2s_dec **out)
{
    *out = NULL;
    const bk_model_config *c = &m->c;
    bki_s2s_dec *d = calloc(1, sizeof *d);
    if (!d) return bki_fail(BK_ERR_NOMEM, "decoding: out of memory");
    const int L = c->dec_depth, I = m->I, D = c->dim, M = c->mlp_dim, S = m->T;
    d->m = m;
    d->B = B;
    d->beam = beam;
    d->rows = B * beam;
    d->tmax = max_steps;
    d->cache = cache;
    d->S = S;
    const size_t R = (size_t)d->rows, kv = (size_t)L * R * (size_t)max_steps * I;
    d->kc = fnew(kv);
    d->vc = fnew(kv);
    d->ckv = fnew((size_t)L * B * S * 2 * I);
    d->scratch = fnew(R * (size_t)max_steps * I);
    d->prefix = malloc(sizeof(int32_t) * R * (size_t)max_steps);
    d->ptmp = malloc(sizeof(int32_t) * R * (size_t)max_steps);
    d->x = fnew(R * D);
    d->h = fnew(R * D);
    d->y = fnew(R * D);
    d->qkv = fnew(R * 3 * I);
    d->att = fnew(R * I);
    d->f1 = fnew(R * (size_t)(M > 0 ? M : 1));
    d->g1 = fnew(R * (size_t)(M > 0 ? M : 1));
    d->mu = fnew(R);
    d->rs = fnew(R);
    d->pst = max_steps > S ? max_steps : S;
    d->p = fnew(R * (size_t)d->pst);
    if (!d->kc || !d->vc || !d->ckv || !d->scratch || !d->prefix || !d->ptmp || !d->x || !d->h || !d->y || !d->qkv ||
        !d->att || !d->f1 || !d->g1 || !d->mu || !d->rs || !d->p) {
        bki_s2s_dec_free(d);
        return bki_fail(BK_ERR_NOMEM, "decoding: out of memory for %d hypotheses of up to %d tokens", B * beam,
                        max_steps);
    }
    /* the cross-attention's keys and values, once per sentence */
    for (int j = 0; j < L; j++) {
        const blk_off *o = &m->bo[c->depth + j];
        bki_linear_fwd(B * S, D, 2 * I, m->fin, D, m->w + o->ckv_w, c->qkv_bias ? m->w + o->ckv_b : NULL,
                       d->ckv + (size_t)j * B * S * 2 * I, 2 * I);
    }
    *out = d;
    return BK_OK;
}

/* a sublayer's norm over the state's buffers (the model's own residual
 * sublayers, bki_sub_in / bki_sub_y / bki_sub_out, run on them) */
static sub_norm step_norm(bki_s2s_dec *d, int64_t g, int64_t b) { return (sub_norm){g, b, d->h, d->mu, d->rs}; }
/* the stream after a sublayer whose last linear wrote bki_sub_y(.., d->y):
 * the residual (and norm) into d->y, which becomes the stream */
static void step_out(bki_s2s_dec *d, const sub_norm *n, int64_t bias)
{
    bki_sub_out(d->m, d->rows, d->x, n, bias, 0.0f, 0, d->y);
    float *t = d->x;
    d->x = d->y;
    d->y = t;
}

/* out[r] = softmax(scale q_r . K_j, j < n) V over one head (dh), keys and
 * values rows of stride ld; p: scratch of n floats */
static void attend(const float *q, const float *K, const float *V, int64_t ld, int n, int dh, float scale, float *p,
                   float *out)
{
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float *k = K + (size_t)j * ld;
        float s = 0.0f;
        for (int e = 0; e < dh; e++) s += q[e] * k[e];
        p[j] = s * scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    double z = 0.0;
    for (int j = 0; j < n; j++) {
        p[j] = expf(p[j] - mx);
        z += p[j];
    }
    const float iz = (float)(1.0 / z);
    for (int e = 0; e < dh; e++) out[e] = 0.0f;
    for (int j = 0; j < n; j++) {
        const float w = p[j] * iz;
        const float *v = V + (size_t)j * ld;
        for (int e = 0; e < dh; e++) out[e] += w * v[e];
    }
}

/* the self-attention of one layer at position t: every row's keys and
 * values join the cache, then the row attends over positions 0..t */
typedef struct {
    const bki_s2s_dec *d;
    float *kc, *vc;
    int t, I, H, dh;
    float scale;
} self_att_args;

static void self_att_member(void *arg)
{
    const self_att_args *a = arg;
    const bki_s2s_dec *d = a->d;
    float *kc = a->kc, *vc = a->vc;
    const int t = a->t, I = a->I, H = a->H, dh = a->dh;
    const float scale = a->scale;
    BKI_FOR(ri, d->rows) {
        const int r = (int)ri;
        const float *qr = d->qkv + (size_t)r * 3 * I;
        memcpy(kc + ((size_t)r * d->tmax + t) * I, qr + I, sizeof(float) * (size_t)I);
        memcpy(vc + ((size_t)r * d->tmax + t) * I, qr + 2 * I, sizeof(float) * (size_t)I);
        float *p = d->p + (size_t)r * d->pst;
        for (int hh = 0; hh < H; hh++)
            attend(qr + (size_t)hh * dh, kc + (size_t)r * d->tmax * I + (size_t)hh * dh,
                   vc + (size_t)r * d->tmax * I + (size_t)hh * dh, I, t + 1, dh, scale, p,
                   d->att + (size_t)r * I + (size_t)hh * dh);
    }
}

/* the cross-attention of one layer: every row over its sentence's encoder
 * keys and values ckv */
typedef struct {
    const bki_s2s_dec *d;
    const float *ckv;
    int I, H, dh;
    float scale;
} cross_att_args;

static void cross_att_member(void *arg)
{
    const cross_att_args *a = arg;
    const bki_s2s_dec *d = a->d;
    const bk_model *m = d->m;
    const float *ckv = a->ckv;
    const int I = a->I, H = a->H, dh = a->dh, S = d->S;
    const float scale = a->scale;
    BKI_FOR(ri, d->rows) {
        const int r = (int)ri;
        const int b = r / d->beam;
        const float *kv = ckv + (size_t)b * S * 2 * I;
        float *p = d->p + (size_t)r * d->pst;
        for (int hh = 0; hh < H; hh++)
            attend(d->qkv + (size_t)r * I + (size_t)hh * dh, kv + (size_t)hh * dh, kv + I + (size_t)hh * dh, 2 * I,
                   m->nb[b], dh, scale, p, d->att + (size_t)r * I + (size_t)hh * dh);
    }
}

/* one position t for every row: tok -> x through the decoder layers; the
 * layers' keys and values of position t join the cache */
static void feed(bki_s2s_dec *d, int t, const int32_t *tok)
{
    bk_model *m = d->m;
    const bk_model_config *c = &m->c;
    const int D = c->dim, I = m->I, dh = m->dh, H = c->heads, M = c->mlp_dim, R = d->rows, S = d->S,
              nt = bki_threads();
    const float sc = sqrtf((float)D), scale = c->attn_scale > 0.0f ? c->attn_scale : 1.0f / sqrtf((float)dh);
    const float *E = m->w + m->e_w;
    const float *pos = c->pos_embed == 1 ? m->w + m->dpos_o : c->pos_embed == 2 ? m->sin_tab : NULL;
    for (int r = 0; r < R; r++) {
        const float *e = E + (size_t)tok[r] * D;
        float *xr = d->x + (size_t)r * D;
        for (int k = 0; k < D; k++) xr[k] = sc * e[k] + (pos ? pos[(size_t)t * D + k] : 0.0f);
    }
    for (int j = 0; j < c->dec_depth; j++) {
        const blk_off *o = &m->bo[c->depth + j];
        float *kc = d->kc + (size_t)j * R * d->tmax * I, *vc = d->vc + (size_t)j * R * d->tmax * I;
        const float *ckv = d->ckv + (size_t)j * d->B * S * 2 * I;
        /* causal self-attention over positions 0..t */
        const sub_norm n1 = step_norm(d, o->ln1_w, o->ln1_b), nc = step_norm(d, o->lnc_w, o->lnc_b),
                       n2 = step_norm(d, o->ln2_w, o->ln2_b);
        const float *h = bki_sub_in(m, R, d->x, &n1);
        bki_linear_fwd(R, D, 3 * I, h, D, m->w + o->qkv_w, c->qkv_bias ? m->w + o->qkv_b : NULL, d->qkv, 3 * I);
        self_att_args sa = {d, kc, vc, t, I, H, dh, scale};
        bki_parallel_claimed(nt, self_att_member, &sa);
        bki_linear_fwd(R, I, D, d->att, I, m->w + o->proj_w, NULL, bki_sub_y(m, &n1, d->y), D);
        step_out(d, &n1, o->proj_b);
        /* cross-attention over the sentence's encoder output */
        h = bki_sub_in(m, R, d->x, &nc);
        bki_linear_fwd(R, D, I, h, D, m->w + o->cq_w, c->qkv_bias ? m->w + o->cq_b : NULL, d->qkv, I);
        cross_att_args ca = {d, ckv, I, H, dh, scale};
        bki_parallel_claimed(nt, cross_att_member, &ca);
        bki_linear_fwd(R, I, D, d->att, I, m->w + o->cproj_w, NULL, bki_sub_y(m, &nc, d->y), D);
        step_out(d, &nc, o->cproj_b);
        if (M > 0) {
            h = bki_sub_in(m, R, d->x, &n2);
            bki_linear_fwd(R, D, M, h, D, m->w + o->fc1_w, m->w + o->fc1_b, d->f1, M);
            bki_gelu_fwd((size_t)R * M, d->f1, d->g1);
            bki_linear_fwd(R, M, D, d->g1, M, m->w + o->fc2_w, NULL, bki_sub_y(m, &n2, d->y), D);
            step_out(d, &n2, o->fc2_b);
        }
    }
}

/* rows' cached state [rows, tmax, n] of the first `len` positions:
 * row r takes row parent[r]'s */
static void reorder(float *a, float *scratch, const int32_t *parent, int R, int tmax, int len, int n)
{
    const size_t row = (size_t)tmax * n, used = (size_t)len * n;
    for (int r = 0; r < R; r++) memcpy(scratch + (size_t)r * row, a + (size_t)parent[r] * row, sizeof(float) * used);
    for (int r = 0; r < R; r++) memcpy(a + (size_t)r * row, scratch + (size_t)r * row, sizeof(float) * used);
}

/* each row of logp [R, V] minus its log-sum-exp; finite is cleared where
 * a row's is not finite */
typedef struct {
    float *logp;
    int R, V;
    _Atomic int finite;
} log_softmax_args;

static void log_softmax_member(void *arg)
{
    log_softmax_args *a = arg;
    const int V = a->V;
    BKI_FOR(r, a->R) {
        float *z = a->logp + (size_t)r * V;
        float mx = z[0];
        for (int j = 1; j < V; j++) mx = z[j] > mx ? z[j] : mx;
        double s = 0.0;
        for (int j = 0; j < V; j++) s += bki_expf(z[j] - mx);
        const double lse = mx + log(s);
        if (!isfinite(lse)) atomic_store(&a->finite, 0);
        for (int j = 0; j < V; j++) z[j] = (float)((double)z[j] - lse);
    }
}

bk_status bki_s2s_step(bki_s2s_dec *d, int t, int rows, const int32_t *parent, const int32_t *tok, float *logp)
{
    bk_model *m = d->m;
    const bk_model_config *c = &m->c;
    const int R = d->rows, D = c->dim, V = c->vocab, I = m->I, nt = bki_threads();
    if (rows != R || t < 0 || t >= d->tmax)
        return bki_fail(BK_ERR_SHAPE, "decoding: step %d of %d rows (the state holds %d rows, %d positions)", t, rows,
                        R, d->tmax);
    for (int r = 0; r < R; r++) {
        if (tok[r] < 0 || tok[r] >= V) return bki_fail(BK_ERR_PARAM, "decoding: token %d outside [0, %d)", tok[r], V);
        if (parent[r] < 0 || parent[r] >= R) return bki_fail(BK_ERR_PARAM, "decoding: parent row %d", parent[r]);
    }
    if (t > 0) {
        /* the prefixes follow their hypotheses (both modes) */
        for (int r = 0; r < R; r++)
            memcpy(d->ptmp + (size_t)r * d->tmax, d->prefix + (size_t)parent[r] * d->tmax, sizeof(int32_t) * (size_t)t);
        memcpy(d->prefix, d->ptmp, sizeof(int32_t) * (size_t)R * d->tmax);
    }
    for (int r = 0; r < R; r++) d->prefix[(size_t)r * d->tmax + t] = tok[r];
    if (d->cache) {
        if (t > 0)
            for (int j = 0; j < c->dec_depth; j++) {
                const size_t off = (size_t)j * R * d->tmax * I;
                reorder(d->kc + off, d->scratch, parent, R, d->tmax, t, I);
                reorder(d->vc + off, d->scratch, parent, R, d->tmax, t, I);
            }
        feed(d, t, tok);
    } else {
        /* no cache: every position of the prefix again */
        int32_t *col = d->ptmp;
        for (int u = 0; u <= t; u++) {
            for (int r = 0; r < R; r++) col[r] = d->prefix[(size_t)r * d->tmax + u];
            feed(d, u, col);
        }
    }
    /* final norm, tied projection, log-softmax */
    const float *h = d->x;
    if (c->final_norm) {
        bki_layernorm_fwd(R, D, d->x, m->w + m->dnrm_w, m->w + m->dnrm_b, c->ln_eps, d->h, d->mu, d->rs);
        h = d->h;
    }
    bki_linear_fwd(R, D, V, h, D, m->w + m->e_w, NULL, logp, V);
    log_softmax_args ls = {logp, R, V, 1};
    bki_parallel_claimed(nt, log_softmax_member, &ls);
    if (!atomic_load(&ls.finite)) return bki_fail(BK_ERR_NONFINITE, "decoding: non-finite logits at step %d", t);
    return BK_OK;
}
