/* attn_layer.c -- the model's attention sites over the operator registry
 * (docs/MODEL.md "Attention keys"). A site's kind is a registered operator
 * with BKI_CAP_MODEL; its parameters are the operator's own struct from the
 * model's configuration, to which the model adds what it owns (the scale,
 * causal, the per-block offset of a seed) and the arrays the operator reads
 * by pointer: those its schema declares learned (the block's tensors
 * "attn.NAME", bki_learned) and those a layer extension below holds. The
 * layer extensions are the work a few kinds need around their operator
 * inside the model's layer, found by the operator's name: diff's lambda
 * reparametrisation and per-head norm, ASAP's compiled layers (what they
 * ask of the configuration, their flags, is config.c's LAYER_FLAGS). Every
 * other kind, an operator registered later included, needs nothing here. */
#include "model_impl.h"
#include "../ops/op.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- attn=diff: the paper's layer around the operator (docs/MODEL.md) ------
 * lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init, one value shared by
 * the heads of block l; each head's operator output (dh channels) is divided
 * by its RMS (eps = ln_eps, no learned gain) and multiplied by
 * (1 - lambda_init). l is 0-based: the paper's l - 1. The four vectors are
 * the block's extension tensors 0..3 (diff_lq1, diff_lk1, diff_lq2,
 * diff_lk2). */
static double diff_lambda_init(int l) { return 0.8 - 0.6 * exp(-0.3 * (double)l); }

/* e1 = exp(lq1 . lk1), e2 = exp(lq2 . lk2) (dot products in double, in order) */
static void diff_exps(const bk_model *m, int l, double *e1, double *e2)
{
    const int64_t *x = m->bo[l].ext;
    const float *w = m->w;
    double s1 = 0.0, s2 = 0.0;
    for (int j = 0; j < m->dh / 2; j++) {
        s1 += (double)w[x[0] + j] * w[x[1] + j];
        s2 += (double)w[x[2] + j] * w[x[3] + j];
    }
    *e1 = exp(s1);
    *e2 = exp(s2);
}

static void diff_set_lambda(bk_model *m, int l)
{
    double e1, e2;
    diff_exps(m, l, &e1, &e2);
    const float lam = (float)(e1 - e2 + diff_lambda_init(l));
    for (int h = 0; h < m->c.heads; h++) m->ba[l].lam[h] = lam;
}

/* forward (bwd = 0): att = (1 - lambda_init) RMSNorm_h(draw) per (row, head),
 * drs keeping 1/RMS; backward (bwd = 1): dO = (1 - lambda_init) rs (dy - x
 * rs^2 <dy, x> / dh) from dy = dA */
typedef struct {
    bk_model *m;
    blk_act *a;
    int64_t R;
    float g;
    int bwd;
} diff_norm_args;

static void diff_norm_member(void *arg)
{
    const diff_norm_args *dn = arg;
    bk_model *m = dn->m;
    blk_act *a = dn->a;
    const int H = m->c.heads, dh = m->dh, I = m->I, bwd = dn->bwd;
    const double eps = m->c.ln_eps;
    const float g = dn->g;
    BKI_FOR(r, dn->R)
        for (int h = 0; h < H; h++) {
            const size_t at = (size_t)r * I + (size_t)h * dh;
            const float *x = a->draw + at;
            float *rs = a->drs + (size_t)r * H + h;
            if (!bwd) {
                double ss = 0.0;
                for (int k = 0; k < dh; k++) ss += (double)x[k] * x[k];
                *rs = (float)(1.0 / sqrt(ss / dh + eps));
                for (int k = 0; k < dh; k++) a->att[at + k] = x[k] * *rs * g;
            } else {
                const float *dy = m->dA + at;
                double dot = 0.0;
                for (int k = 0; k < dh; k++) dot += (double)dy[k] * x[k];
                const float c = (float)((double)*rs * *rs * dot / dh);
                for (int k = 0; k < dh; k++) m->dO[at + k] = g * *rs * (dy[k] - x[k] * c);
            }
        }
}

static void diff_norm(bk_model *m, int l, int B, int bwd)
{
    diff_norm_args dn = {m, &m->ba[l], (int64_t)B * m->T, (float)(1.0 - diff_lambda_init(l)), bwd};
    bki_parallel_claimed(bki_threads(), diff_norm_member, &dn);
}

/* dlambda (summed over the heads, in head order) into the four vectors */
static void diff_bwd_post(bk_model *m, int l)
{
    const int64_t *x = m->bo[l].ext;
    const float *w = m->w;
    float *gw = m->gw;
    double gl = 0.0, e1, e2;
    for (int h = 0; h < m->c.heads; h++) gl += m->dlam[h];
    diff_exps(m, l, &e1, &e2);
    const double g1 = gl * e1, g2 = -gl * e2;
    for (int j = 0; j < m->dh / 2; j++) {
        gw[x[0] + j] += (float)(g1 * w[x[1] + j]);
        gw[x[1] + j] += (float)(g1 * w[x[0] + j]);
        gw[x[2] + j] += (float)(g2 * w[x[3] + j]);
        gw[x[3] + j] += (float)(g2 * w[x[2] + j]);
    }
}

static void diff_fill(const bk_model *m, int l, void *par) { ((bk_diff_config *)par)->lambda = m->ba[l].lam; }
static void diff_fwd_pre(bk_model *m, int l, bk_tensor *o)
{
    diff_set_lambda(m, l);
    o->data = m->ba[l].draw; /* normalised into att by diff_fwd_post */
}
static void diff_fwd_post(bk_model *m, int l, int B) { diff_norm(m, l, B, 0); }
/* through the per-head norm first; the operator's dout is dO */
static void diff_bwd_pre(bk_model *m, int l, int B, bk_tensor *dout)
{
    diff_norm(m, l, B, 1);
    dout->data = m->dO;
}
static void *diff_pgrads(bk_model *m) { return m->dlam; }
static int64_t diff_vec_len(int dh) { return dh / 2; }

/* ---- attn=asap: the compiled layers (bk_model_set_asap) ------------------- */
static void asap_fill(const bk_model *m, int l, void *par)
{
    ((bk_asap_forward_config *)par)->layer = m->ba[l].asap;
}

/* ---- the layer extensions, by operator name ------------------------------
 * tensors: the block's own tensors "attn.NAME" (1-D, len(dh) floats, N(0,
 * sd^2), no weight decay) that the layer turns into the operator's arrays;
 * fill puts the arrays the layer holds into the parameters; the hooks run
 * around the operator: fwd_pre may redirect its output, bwd_pre its
 * upstream gradient; pgrads gives its parameter-gradient outputs, bwd_post
 * adds them into the model's gradients. NULL: nothing. */
typedef struct {
    const char *op;
    const char *const *tensors;
    int ntensors;
    int64_t (*len)(int dh);
    double sd;
    void (*fill)(const bk_model *m, int l, void *par);
    void (*fwd_pre)(bk_model *m, int l, bk_tensor *o);
    void (*fwd_post)(bk_model *m, int l, int B);
    void (*bwd_pre)(bk_model *m, int l, int B, bk_tensor *dout);
    void *(*pgrads)(bk_model *m);
    void (*bwd_post)(bk_model *m, int l);
} layer_ext;

static const char *const DIFF_TENSORS[] = {"diff_lq1", "diff_lk1", "diff_lq2", "diff_lk2"};
static const layer_ext EXTS[] = {
    {"diff", DIFF_TENSORS, 4, diff_vec_len,
     0.1 /* the paper's N(0, 0.1^2) */, diff_fill, diff_fwd_pre, diff_fwd_post, diff_bwd_pre, diff_pgrads,
     diff_bwd_post},
    {"asap", NULL, 0, NULL, 0.0, asap_fill, NULL, NULL, NULL, NULL, NULL},
};

static const layer_ext *ext_of(int kind)
{
    const bki_op *op = bki_attn_op(kind);
    for (size_t i = 0; op && i < sizeof EXTS / sizeof EXTS[0]; i++)
        if (!strcmp(EXTS[i].op, op->name)) return &EXTS[i];
    return NULL;
}

/* the operator's learned arrays the model holds as they are: none when the
 * kind's layer extension has tensors of its own, from which it makes the
 * operator's arrays (diff's lambda from its four vectors) */
static int learned_of(int kind)
{
    const bki_op *op = bki_attn_op(kind);
    const layer_ext *x = ext_of(kind);
    const int n = op && !(x && x->ntensors > 0) ? op->nlearned : 0;
    return n < BKI_MAX_LEARNED ? n : BKI_MAX_LEARNED;
}

/* ---- a block's attention tensors ------------------------------------------ */
int bki_attn_tensors(const bk_model_config *c, int dh, bki_attn_tensor out[BKI_MAX_ATTN_TENSORS])
{
    const bki_op *op = bki_attn_op(c->attn);
    const layer_ext *x = ext_of(c->attn);
    bk_attn_params par;
    bki_config_site_params(c, 0, &par);
    int n = 0;
    for (int j = 0; j < learned_of(c->attn); j++) {
        const bki_learned *L = &op->learned[j];
        bki_attn_tensor *t = &out[n++];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "attn.%s", L->name);
        t->ndim = L->shape(par.par.bytes, c->heads, dh, t->dims);
        t->init = L->init;
        t->sd = L->init_sd;
        t->slot = j;
    }
    for (int j = 0; x && j < x->ntensors && j < BKI_MAX_EXT; j++) {
        bki_attn_tensor *t = &out[n++];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "attn.%s", x->tensors[j]);
        t->ndim = 1;
        t->dims[0] = x->len(dh);
        t->init = BKI_INIT_NORMAL;
        t->sd = x->sd;
        t->slot = BKI_MAX_LEARNED + j;
    }
    return n;
}

/* ---- sites ------------------------------------------------------------------ */
/* the configuration's site of an attention site: 0 attn, 1 cross_attn, 2
 * pma_attn (-1: the decoder's causal self-attention, softmax with its
 * defaults) */
static int site_config(const bk_model *m, attn_site s)
{
    if (!s.cross) return s.causal ? -1 : 0;
    if (m->c.arch == BK_ARCH_SEQ2SEQ) return 1;
    return bki_has_pma(&m->c) && s.l == bki_pma_unit(&m->c) ? 2 : 0;
}

int bki_attn_site_kind(const bk_model *m, attn_site s)
{
    const int cs = site_config(m, s);
    return cs < 0 ? BK_ATTN_SOFTMAX : cs == 0 ? m->c.attn : cs == 1 ? m->c.cross_attn : m->c.pma_attn;
}

/* a call of the site's operator; par: the storage of its parameters */
static bki_call bki_attn_call(const bk_model *m, const bk_attn_desc *d, attn_site s, bk_attn_params *par)
{
    const int kind = bki_attn_site_kind(m, s);
    const bki_op *op = bki_attn_op(kind);
    const int cs = site_config(m, s);
    bk_attn_params ps;
    if (cs >= 0) bki_config_site_params(&m->c, cs, &ps);
    else op->par_default(ps.par.bytes);
    void *p = ps.par.bytes;
    bki_attn_set_owned(op, p, m->c.attn_scale, s.causal, (s.cross ? 2000 : 1000) + (int64_t)s.l);
    if (!s.cross && !s.causal) {
        for (int j = 0; j < learned_of(kind); j++)
            *(const float **)(void *)((char *)p + op->learned[j].offset) =
                m->w ? m->w + m->bo[s.l].lrn[j] : NULL;
        const layer_ext *x = ext_of(kind);
        if (x && x->fill) x->fill(m, s.l, p);
    }
    memcpy(par, &ps, sizeof ps);
    return bki_call_of(op, d, par->par.bytes);
}

size_t bki_attn_ws(const bk_model *m, const bk_attn_desc *d, attn_site s)
{
    bk_attn_params par;
    bki_call c = bki_attn_call(m, d, s, &par);
    return bki_op_workspace_size(&c);
}

/* a tape for training (operators without a backward need none) */
size_t bki_attn_tape(const bk_model *m, const bk_attn_desc *d, attn_site s)
{
    bk_attn_params par;
    bki_call c = bki_attn_call(m, d, s, &par);
    return c.op->backward ? bki_op_tape_size_query(&c) : 0;
}

/* operator workspace: grown only when a larger size is asked for (first
 * use, or a thread count raised after creation) */
bk_status bki_model_ensure_ws(bk_model *m, size_t need)
{
    if (need <= m->ws_cap) return BK_OK;
    void *p = bk_alloc(need); /* (the old contents are not needed) */
    if (!p) return bki_fail(BK_ERR_NOMEM, "model: workspace of %zu bytes", need);
    free(m->ws);
    m->ws = p;
    m->ws_cap = need;
    return BK_OK;
}

/* the operator at a site, forward: train keeps its tape */
bk_status bki_attn_forward(bk_model *m, attn_site s, const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k,
                           const bk_tensor *v, const bk_tensor *o, const bk_tensor *attn_out, void *tape)
{
    bk_attn_params par;
    bki_call c = bki_attn_call(m, d, s, &par), query = c; /* (a size query marks its call) */
    bk_status st = bki_model_ensure_ws(m, bki_op_workspace_size(&query));
    if (st) return st;
    c.q = q; c.k = k; c.v = v; c.out = o; c.attn = attn_out;
    c.trusted = 1; /* the model's activations: its logits are checked */
    return bki_op_forward(&c, tape, m->ws, m->ws_cap);
}

bk_status bki_attn_backward(bk_model *m, attn_site s, const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k,
                            const bk_tensor *v, const bk_tensor *dout, const bk_tensor *dq, const bk_tensor *dk,
                            const bk_tensor *dv, void *pg, void *tape)
{
    bk_attn_params par;
    bki_call c = bki_attn_call(m, d, s, &par), query = c; /* (a size query marks its call) */
    bk_status st = bki_model_ensure_ws(m, bki_op_workspace_size(&query));
    if (st) return st;
    c.q = q; c.k = k; c.v = v; c.dout = dout; c.dq = dq; c.dk = dk; c.dv = dv; c.pg = pg;
    c.trusted = 1;
    return bki_op_backward(&c, tape, m->ws, m->ws_cap);
}

/* ---- the self-attention layer's work around the operator ------------------ */
bk_status bki_attn_fwd_pre(bk_model *m, int l, bk_tensor *o)
{
    const layer_ext *x = ext_of(m->c.attn);
    if ((bki_attn_layer_flags(m->c.attn) & BKI_LAYER_HOLDS) && !m->ba[l].asap)
        return bki_fail(BK_ERR_PARAM, "model: block %d has no compiled ASAP layer (bk_model_set_asap)", l);
    if (x && x->fwd_pre) x->fwd_pre(m, l, o);
    return BK_OK;
}

void bki_attn_fwd_post(bk_model *m, int l, int B)
{
    const layer_ext *x = ext_of(m->c.attn);
    if (x && x->fwd_post) x->fwd_post(m, l, B);
}

void bki_attn_bwd_pre(bk_model *m, int l, int B, bk_tensor *dout)
{
    const layer_ext *x = ext_of(m->c.attn);
    if (x && x->bwd_pre) x->bwd_pre(m, l, B, dout);
}

/* the operator's parameter-gradient outputs: the layer's, or the learned
 * arrays' scratch (m->lgrad, in the learned order), or none */
void *bki_attn_pgrads(bk_model *m)
{
    const layer_ext *x = ext_of(m->c.attn);
    if (x && x->pgrads) return x->pgrads(m);
    return learned_of(m->c.attn) > 0 ? (void *)m->lgrad : NULL;
}

/* the learned arrays' gradients into the model's: lot_learn picks which are
 * trained (both: all, z: the first, none: none); a tensor that is not
 * trained never receives its gradient */
void bki_attn_bwd_post(bk_model *m, int l)
{
    const layer_ext *x = ext_of(m->c.attn);
    if (x && x->bwd_post) {
        x->bwd_post(m, l);
        return;
    }
    const int n = learned_of(m->c.attn);
    const int trained = m->c.lot_learn == BK_LOT_LEARN_BOTH ? n : m->c.lot_learn == BK_LOT_LEARN_Z && n > 0 ? 1 : 0;
    for (int j = 0; j < trained; j++) {
        float *g = m->gw + m->bo[l].lrn[j];
        for (int64_t i = 0; i < m->lgrad_n[j]; i++) g[i] += m->lgrad[j][i];
    }
}
