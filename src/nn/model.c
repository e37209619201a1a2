/* model.c -- the model of the training engine (docs/MODEL.md): the
 * parameter table (one declarative list per architecture), initialisation,
 * activations planned at creation, the classifier's embedding, pooling,
 * head and loss, the forward and backward entry points, changing the
 * attention (in place, swaps), OTK's unsupervised start, ASAP calibration.
 * The configuration is config.c's, the attention sites attn_layer.c's, the
 * shared blocks blocks.c's, the encoder stack encoder.c's, the Set
 * Transformer's units set.c's, the encoder-decoder seq2seq.c's. */
#include "model_impl.h"
#include "../ops/op.h"
#include "../core/vexp.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* the model                                                                */
/* ------------------------------------------------------------------------ */
static int64_t add_param(bk_model *m, const char *name, int ndim, int64_t s0, int64_t s1, int64_t s2, int decay)
{
    /* (a table that would overflow is counted, not written: model_build refuses it) */
    if (m->nparam_need++ >= MAXP) return -1;
    bki_param *p = &m->tab[m->nparam++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->shape[0] = s0;
    p->shape[1] = s1;
    p->shape[2] = s2;
    p->count = s0 * (ndim > 1 ? s1 : 1) * (ndim > 2 ? s2 : 1);
    p->off = m->P;
    p->decay = decay;
    p->init = -1;
    p->init_sd = 0.0;
    m->P += p->count;
    return p->off;
}

/* the tensors of block l (index into bo; decoder blocks after the encoder's)
 * under prefix ("blocks.3.", "enc.blocks.0.", "dec.blocks.1."): self-
 * attention of kind `kind`, the cross-attention when dec */
static void add_block(bk_model *m, int l, const char *prefix, int dec)
{
    const bk_model_config *c = &m->c;
    const int D = c->dim, I = m->I;
    char nm[64];
    blk_off *o = &m->bo[l];
    memset(o, 0xff, sizeof *o); /* all -1 */
#define P(field, suffix, nd, a, b2, c2, dec)                                                                       \
    do {                                                                                                           \
        snprintf(nm, sizeof nm, "%s%s", prefix, suffix);                                                           \
        o->field = add_param(m, nm, nd, a, b2, c2, dec);                                                           \
    } while (0)
    P(ln1_w, "ln1.weight", 1, D, 0, 0, 0);
    P(ln1_b, "ln1.bias", 1, D, 0, 0, 0);
    P(qkv_w, "attn.qkv.weight", 2, 3 * I, D, 0, 1);
    if (c->qkv_bias) P(qkv_b, "attn.qkv.bias", 1, 3 * I, 0, 0, 0);
    if (!dec) { /* the self-attention operator's learned arrays, its layer's tensors */
        bki_attn_tensor at[BKI_MAX_ATTN_TENSORS];
        const int n = bki_attn_tensors(c, m->dh, at);
        for (int i = 0; i < n; i++) {
            const bki_attn_tensor *t = &at[i];
            snprintf(nm, sizeof nm, "%.20s%.43s", prefix, t->name);
            const int64_t off = add_param(m, nm, t->ndim, t->dims[0], t->dims[1], t->dims[2], 0);
            m->tab[m->nparam - 1].init = t->init;
            m->tab[m->nparam - 1].init_sd = t->sd;
            if (t->slot < BKI_MAX_LEARNED) o->lrn[t->slot] = off;
            else o->ext[t->slot - BKI_MAX_LEARNED] = off;
        }
    }
    if (c->dwc && !dec) {
        P(dwc_w, "attn.dwc.weight", 3, m->dh, c->dwc_kernel, c->dwc_kernel, 1);
        P(dwc_b, "attn.dwc.bias", 1, m->dh, 0, 0, 0);
    }
    P(proj_w, "attn.proj.weight", 2, D, I, 0, 1);
    P(proj_b, "attn.proj.bias", 1, D, 0, 0, 0);
    if (dec) {
        P(lnc_w, "lnc.weight", 1, D, 0, 0, 0);
        P(lnc_b, "lnc.bias", 1, D, 0, 0, 0);
        P(cq_w, "cross.q.weight", 2, I, D, 0, 1);
        if (c->qkv_bias) P(cq_b, "cross.q.bias", 1, I, 0, 0, 0);
        P(ckv_w, "cross.kv.weight", 2, 2 * I, D, 0, 1);
        if (c->qkv_bias) P(ckv_b, "cross.kv.bias", 1, 2 * I, 0, 0, 0);
        P(cproj_w, "cross.proj.weight", 2, D, I, 0, 1);
        P(cproj_b, "cross.proj.bias", 1, D, 0, 0, 0);
    }
    if (c->mlp_dim > 0) {
        P(ln2_w, "ln2.weight", 1, D, 0, 0, 0);
        P(ln2_b, "ln2.bias", 1, D, 0, 0, 0);
        P(fc1_w, "mlp.fc1.weight", 2, c->mlp_dim, D, 0, 1);
        P(fc1_b, "mlp.fc1.bias", 1, c->mlp_dim, 0, 0, 0);
        P(fc2_w, "mlp.fc2.weight", 2, D, c->mlp_dim, 0, 1);
        P(fc2_b, "mlp.fc2.bias", 1, D, 0, 0, 0);
    }
#undef P
}

/* a tensor named prefix + suffix */
static int64_t add_named(bk_model *m, const char *prefix, const char *suffix, int nd, int64_t s0, int64_t s1,
                         int decay)
{
    char nm[64];
    snprintf(nm, sizeof nm, "%s%s", prefix, suffix);
    return add_param(m, nm, nd, s0, s1, 0, decay);
}

/* the tensors of MAB unit u under prefix ("blocks.0.mab0.", "pool.mab."):
 * lnc (the queries' norm), lnk (the keys' norm), cross.q, cross.kv,
 * cross.proj (the decoder's cross-attention names), ln2, mlp.fc1, mlp.fc2 */
static void add_mab(bk_model *m, int u, const char *prefix)
{
    const bk_model_config *c = &m->c;
    const int D = c->dim, I = m->I, M = c->mlp_dim;
    blk_off *o = &m->bo[u];
    o->lnc_w = add_named(m, prefix, "lnc.weight", 1, D, 0, 0);
    o->lnc_b = add_named(m, prefix, "lnc.bias", 1, D, 0, 0);
    o->lnk_w = add_named(m, prefix, "lnk.weight", 1, D, 0, 0);
    o->lnk_b = add_named(m, prefix, "lnk.bias", 1, D, 0, 0);
    o->cq_w = add_named(m, prefix, "cross.q.weight", 2, I, D, 1);
    if (c->qkv_bias) o->cq_b = add_named(m, prefix, "cross.q.bias", 1, I, 0, 0);
    o->ckv_w = add_named(m, prefix, "cross.kv.weight", 2, 2 * I, D, 1);
    if (c->qkv_bias) o->ckv_b = add_named(m, prefix, "cross.kv.bias", 1, 2 * I, 0, 0);
    o->cproj_w = add_named(m, prefix, "cross.proj.weight", 2, D, I, 1);
    o->cproj_b = add_named(m, prefix, "cross.proj.bias", 1, D, 0, 0);
    if (M > 0) {
        o->ln2_w = add_named(m, prefix, "ln2.weight", 1, D, 0, 0);
        o->ln2_b = add_named(m, prefix, "ln2.bias", 1, D, 0, 0);
        o->fc1_w = add_named(m, prefix, "mlp.fc1.weight", 2, M, D, 1);
        o->fc1_b = add_named(m, prefix, "mlp.fc1.bias", 1, M, 0, 0);
        o->fc2_w = add_named(m, prefix, "mlp.fc2.weight", 2, D, M, 1);
        o->fc2_b = add_named(m, prefix, "mlp.fc2.bias", 1, D, 0, 0);
    }
}

/* ISAB block l: blocks.l.inducing [m, D], blocks.l.mab0.* (H = MAB(I, X)),
 * blocks.l.mab1.* (MAB(X, H)) */
static void add_isab(bk_model *m, int l)
{
    const bk_model_config *c = &m->c;
    char pre[48];
    const int u0 = c->depth + l;
    memset(&m->bo[l], 0xff, sizeof m->bo[l]); /* all -1 */
    memset(&m->bo[u0], 0xff, sizeof m->bo[u0]);
    snprintf(pre, sizeof pre, "blocks.%d.", l);
    m->bo[u0].qset = add_named(m, pre, "inducing", 2, c->set_inducing, c->dim, 0);
    snprintf(pre, sizeof pre, "blocks.%d.mab0.", l);
    add_mab(m, u0, pre);
    snprintf(pre, sizeof pre, "blocks.%d.mab1.", l);
    add_mab(m, l, pre);
}

/* the PMA: pool.seeds [k, D], pool.rff.fc1, fc2 (mlp_dim > 0), pool.mab.* */
static void add_pma(bk_model *m)
{
    const bk_model_config *c = &m->c;
    const int u = bki_pma_unit(c), D = c->dim, M = c->mlp_dim;
    blk_off *o = &m->bo[u];
    memset(o, 0xff, sizeof *o);
    o->qset = add_param(m, "pool.seeds", 2, c->pma_seeds, D, 0, 0);
    if (M > 0) {
        o->rf1_w = add_param(m, "pool.rff.fc1.weight", 2, M, D, 0, 1);
        o->rf1_b = add_param(m, "pool.rff.fc1.bias", 1, M, 0, 0, 0);
        o->rf2_w = add_param(m, "pool.rff.fc2.weight", 2, D, M, 0, 1);
        o->rf2_b = add_param(m, "pool.rff.fc2.bias", 1, D, 0, 0, 0);
    }
    add_mab(m, u, "pool.mab.");
}

/* the encoder-decoder's table (docs/MODEL.md): embed.table (shared by the
 * source, the target and the output projection), [enc.pos, dec.pos],
 * enc.blocks.*, [enc.norm], dec.blocks.*, [dec.norm] */
static void build_table_s2s(bk_model *m)
{
    const bk_model_config *c = &m->c;
    const int D = c->dim;
    char pre[32];
    m->e_w = add_param(m, "embed.table", 2, c->vocab, D, 0, BK_DECAY_EMBED);
    if (c->pos_embed == 1) {
        m->pos_o = add_param(m, "enc.pos", 2, c->max_len, D, 0, 0);
        m->dpos_o = add_param(m, "dec.pos", 2, c->tgt_max_len, D, 0, 0);
    }
    for (int l = 0; l < c->depth; l++) {
        snprintf(pre, sizeof pre, "enc.blocks.%d.", l);
        add_block(m, l, pre, 0);
    }
    if (c->final_norm) {
        m->nrm_w = add_param(m, "enc.norm.weight", 1, D, 0, 0, 0);
        m->nrm_b = add_param(m, "enc.norm.bias", 1, D, 0, 0, 0);
    }
    for (int j = 0; j < c->dec_depth; j++) {
        snprintf(pre, sizeof pre, "dec.blocks.%d.", j);
        add_block(m, c->depth + j, pre, 1);
    }
    if (c->final_norm) {
        m->dnrm_w = add_param(m, "dec.norm.weight", 1, D, 0, 0, 0);
        m->dnrm_b = add_param(m, "dec.norm.bias", 1, D, 0, 0, 0);
    }
}

static void build_table(bk_model *m)
{
    const bk_model_config *c = &m->c;
    const int D = c->dim;
    char pre[32];
    m->e_w = m->e_b = m->e_w2 = m->e_b2 = m->cls_o = m->pos_o = m->nrm_w = m->nrm_b = m->otk_w = m->otk_z = -1;
    m->head_w = m->head_b = m->dpos_o = m->dnrm_w = m->dnrm_b = -1;
    if (c->arch == BK_ARCH_SEQ2SEQ) {
        build_table_s2s(m);
        return;
    }
    if (c->input == BK_INPUT_IMAGE) {
        m->e_w = add_param(m, "embed.proj.weight", 2, D, m->in_feat, 0, 1);
        m->e_b = add_param(m, "embed.proj.bias", 1, D, 0, 0, 0);
    } else if (c->input == BK_INPUT_TOKENS) {
        m->e_w = add_param(m, "embed.table", 2, c->vocab, D, 0, BK_DECAY_EMBED);
    } else {
        m->e_w = add_param(m, "embed.fc1.weight", 2, D, m->in_feat, 0, 1);
        m->e_b = add_param(m, "embed.fc1.bias", 1, D, 0, 0, 0);
        m->e_w2 = add_param(m, "embed.fc2.weight", 2, D, D, 0, 1);
        m->e_b2 = add_param(m, "embed.fc2.bias", 1, D, 0, 0, 0);
    }
    if (c->cls) m->cls_o = add_param(m, "cls", 1, D, 0, 0, 0);
    if (c->pos_embed) m->pos_o = add_param(m, "pos", 2, m->T, D, 0, 0);
    for (int l = 0; l < c->depth; l++) {
        if (bki_is_isab(c)) {
            add_isab(m, l);
            continue;
        }
        snprintf(pre, sizeof pre, "blocks.%d.", l);
        add_block(m, l, pre, 0);
    }
    if (c->final_norm) {
        m->nrm_w = add_param(m, "norm.weight", 1, D, 0, 0, 0);
        m->nrm_b = add_param(m, "norm.bias", 1, D, 0, 0, 0);
    }
    if (c->pool == BK_POOL_OTK && c->otk_anchors > 0)
        m->otk_w = add_param(m, "pool.otk_w", 2, c->otk_anchors, D, 0, 0);
    if (c->pool == BK_POOL_OTK) m->otk_z = add_param(m, "pool.otk_z", 3, c->otk_refs, c->otk_supports, m->otk_k, 0);
    if (bki_has_pma(c)) add_pma(m);
    m->head_w = add_param(m, "head.weight", 2, c->classes, m->F, 0, 1);
    m->head_b = add_param(m, "head.bias", 1, c->classes, 0, 0, 0);
}

void bki_model_post_update(bk_model *m)
{
    if (m && m->otk_w >= 0) bki_unit_rows(m->w + m->otk_w, m->c.otk_anchors, m->c.dim);
}

/* seeded initialisation: one splitmix64 stream per tensor */
static double unif(uint64_t *s) { return (double)(bki_mix64(s) >> 11) * 0x1.0p-53; }
static double gauss(uint64_t *s)
{
    double u = unif(s), v = unif(s);
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void init_params(bk_model *m)
{
    for (int i = 0; i < m->nparam; i++) {
        const bki_param *p = &m->tab[i];
        float *w = m->w + p->off;
        uint64_t s = m->seed * BKI_GOLDEN + (uint64_t)(i + 1) * 0xD1B54A32D192ED03ull;
        const char *n = p->name;
        size_t ln = strlen(n);
#define ENDS(suf) (ln >= strlen(suf) && strcmp(n + ln - strlen(suf), suf) == 0)
        if (strstr(n, ".ln1.") || strstr(n, ".ln2.") || strstr(n, ".lnc.") || strstr(n, ".lnk.") ||
            strncmp(n, "norm.", 5) == 0 ||
            ENDS("norm.weight") || ENDS("norm.bias")) {
            for (int64_t j = 0; j < p->count; j++) w[j] = ENDS(".weight") ? 1.0f : 0.0f;
        } else if (m->c.arch == BK_ARCH_SEQ2SEQ && (strcmp(n, "embed.table") == 0 || ENDS(".pos"))) {
            /* fairseq's: N(0, 1/dim), the table scaled by sqrt(dim) on input */
            const double sd = 1.0 / sqrt((double)m->c.dim);
            for (int64_t j = 0; j < p->count; j++) w[j] = (float)(sd * gauss(&s));
        } else if (strcmp(n, "cls") == 0 || strcmp(n, "pos") == 0 || strcmp(n, "embed.table") == 0) {
            for (int64_t j = 0; j < p->count; j++) w[j] = (float)(0.02 * gauss(&s));
        } else if (p->init == BKI_INIT_NORMAL) { /* an attention tensor (bki_attn_tensors) */
            for (int64_t j = 0; j < p->count; j++) w[j] = (float)(p->init_sd * gauss(&s));
        } else if (p->init == BKI_INIT_ZERO) {
            for (int64_t j = 0; j < p->count; j++) w[j] = 0.0f;
        } else if (ENDS("dwc.weight") || ENDS("dwc.bias")) {
            /* PyTorch's Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = k * k */
            const double bound = 1.0 / (double)m->c.dwc_kernel;
            for (int64_t j = 0; j < p->count; j++) w[j] = (float)((2.0 * unif(&s) - 1.0) * bound);
        } else if (ENDS(".inducing") || strcmp(n, "pool.seeds") == 0) {
            /* ISAB inducing points, PMA seeds: N(0, 1/dim) */
            const double sd = 1.0 / sqrt((double)m->c.dim);
            for (int64_t j = 0; j < p->count; j++) w[j] = (float)(sd * gauss(&s));
        } else if (strcmp(n, "pool.otk_z") == 0) {
            /* N(0, 1/k): rows of norm ~1 in R^k, k = otk_anchors or D */
            const double sd = 1.0 / sqrt((double)m->otk_k);
            for (int64_t j = 0; j < p->count; j++) w[j] = (float)(sd * gauss(&s));
        } else if (strcmp(n, "pool.otk_w") == 0) {
            /* anchors uniform on the unit sphere: N(0, 1) rows, normalised */
            for (int64_t j = 0; j < p->count; j++) w[j] = (float)gauss(&s);
            bki_unit_rows(w, p->shape[0], p->shape[1]);
        } else {
            /* Linear weight [out, in] or bias [out]: U(-1/sqrt(in), 1/sqrt(in)) with in from the weight */
            int64_t fan_in = p->ndim == 2 ? p->shape[1] : (i > 0 ? m->tab[i - 1].shape[1] : 1);
            const double bound = 1.0 / sqrt((double)(fan_in > 0 ? fan_in : 1));
            for (int64_t j = 0; j < p->count; j++) w[j] = (float)((2.0 * unif(&s) - 1.0) * bound);
        }
#undef ENDS
    }
}


void bk_model_free(bk_model *m)
{
    if (!m) return;
    free(m->w);
    free(m->gw);
    if (m->ba)
        for (int l = 0; l < bki_block_count(&m->c); l++) {
            blk_act *a = &m->ba[l];
            free(a->mid);
            if (a->out != a->mid) free(a->out);
            free(a->ln1);
            free(a->mu1);
            free(a->rs1);
            free(a->qkv);
            free(a->att);
            free(a->ln2);
            free(a->mu2);
            free(a->rs2);
            free(a->f1);
            free(a->g1);
            free(a->tape);
            free(a->draw);
            free(a->drs);
            free(a->lam);
            free(a->clsa);
            if (a->cmid != a->out) free(a->cmid);
            free(a->lnc);
            free(a->muc);
            free(a->rsc);
            free(a->cq);
            free(a->ckv);
            free(a->catt);
            free(a->ctape);
            free(a->lnk);
            free(a->muk);
            free(a->rsk);
            free(a->xq);
            free(a->rf1);
            free(a->rg1);
            free(a->rfo);
            if (a->asap) {
                bk_asap_layer_free(a->asap);
                free(a->asap);
            }
        }
    free(m->ba);
    free(m->bo);
    void *bufs[] = {m->emb_in, m->emb_h, m->emb_g, m->emb_o, m->x0, m->fin, m->fmu, m->frs, m->pooled,
                    m->logits, m->probs, m->argmax, m->nb, m->labels, m->tokens, m->otk_tape, m->dX, m->dT,
                    m->dA, m->dq, m->dk, m->dv, m->dM, m->dN, m->dpool, m->dlog, m->dZtmp, m->dWtmp, m->kbuf, m->lgrad[0], m->lgrad[1], m->lgrad[2], m->lgrad[3], m->dO, m->dlam, m->ws, m->nb1, m->dcls, m->ddwc,
                    m->sin_tab, m->nbt, m->dtok, m->tgt, m->dx0, m->dfin, m->dfmu, m->dfrs, m->plog, m->dMem, m->dS, m->rloss,
                    m->dY, m->dXs};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(m);
}

/* Every allocation of bk_model_create goes through one sizer: it counts the
 * bytes and, unless the sizer only measures (bk_model_memory), allocates
 * zeroed memory; a failure sets bad. */
typedef struct {
    size_t bytes;
    int bad, measure;
} sizer;

static void *zalloc(sizer *z, size_t n, size_t size)
{
    const size_t b = n * size; /* (n and size are bounded by the checks of model_build) */
    z->bytes = b > SIZE_MAX - z->bytes ? SIZE_MAX : z->bytes + b;
    if (z->measure) return NULL;
    void *p = bki_calloc(n ? n : 1, size);
    if (!p) z->bad = 1;
    return p;
}

static float *falloc(size_t n, sizer *z) { return zalloc(z, n, sizeof(float)); }

/* the scratch of bki_linear_bwd's K split for an out x in weight gradient
 * (NULL where it does not fit: the product then runs unsplit) */
#define KBUF_MAX ((size_t)1 << 18)

static size_t phys_memory(void)
{
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && size > 0) return (size_t)pages * (size_t)size;
#endif
    return 0;
}

/* the activations, tape and ESP slices of MAB unit u for max_batch; wsz
 * receives the larger of itself and the unit's workspace */
static void alloc_mab(bk_model *m, int u, sizer *z, size_t *wsz)
{
    const bk_model_config *c = &m->c;
    blk_act *a = &m->ba[u];
    const bki_cross_shape cs = bki_mab_shape(m, u);
    const size_t D = (size_t)c->dim, I = (size_t)m->I, M = (size_t)c->mlp_dim, Rq = (size_t)m->max_batch * cs.Nq,
                 Rk = (size_t)m->max_batch * cs.Nk;
    a->lnk = falloc(Rk * D, z);
    a->muk = falloc(Rk, z);
    a->rsk = falloc(Rk, z);
    if (m->bo[u].qset >= 0) a->xq = falloc(Rq * D, z);
    a->out = falloc(Rq * D, z);
    a->cmid = M > 0 ? falloc(Rq * D, z) : a->out; /* (without an MLP the output is the cross-attention's) */
    a->lnc = falloc(Rq * D, z);
    a->muc = falloc(Rq, z);
    a->rsc = falloc(Rq, z);
    a->cq = falloc(Rq * I, z);
    a->ckv = falloc(Rk * 2 * I, z);
    a->catt = falloc(Rq * I, z);
    if (M > 0) {
        a->ln2 = falloc(Rq * D, z);
        a->mu2 = falloc(Rq, z);
        a->rs2 = falloc(Rq, z);
        a->f1 = falloc(Rq * M, z);
        a->g1 = falloc(Rq * M, z);
        if (m->bo[u].rf1_w >= 0) { /* the PMA's rFF on the set's rows */
            a->rf1 = falloc(Rk * M, z);
            a->rg1 = falloc(Rk * M, z);
            a->rfo = falloc(Rk * D, z);
        }
    }
    const attn_site site = {u, 1, 0};
    if (z->bad) return;
    const bk_attn_desc d = bki_cross_desc_max(m, u);
    a->ctape_cap = bki_attn_tape(m, &d, site);
    if (a->ctape_cap) a->ctape = zalloc(z, a->ctape_cap, 1);
    const size_t w1 = bki_attn_ws(m, &d, site);
    if (w1 > *wsz) *wsz = w1;
}

/* bk_model_create, or (measure) only the count of the bytes it allocates */
static bk_status model_build(const bk_model_config *cfg, uint64_t seed, int max_batch, int measure, bk_model **out,
                             size_t *bytes);

bk_status bk_model_create(const bk_model_config *cfg, uint64_t seed, int max_batch, bk_model **out)
{
    if (!cfg || !out) return bki_fail(BK_ERR_NULL, "bk_model_create: NULL argument");
    *out = NULL;
    size_t need = 0;
    bk_model *probe = NULL;
    bk_status st = model_build(cfg, seed, max_batch, 1, &probe, &need);
    bk_model_free(probe);
    if (st) return st;
    const size_t have = phys_memory();
    if (have && need > have)
        return bki_fail(BK_ERR_NOMEM,
                        "bk_model_create: the model needs %.2f GiB for max_batch %d (parameters, gradients, activations "
                        "and workspaces), the machine has %.2f GiB",
                        (double)need / 1073741824.0, max_batch, (double)have / 1073741824.0);
    return model_build(cfg, seed, max_batch, 0, out, NULL);
}

bk_status bk_model_memory(const bk_model_config *cfg, int max_batch, int64_t *num_params, size_t *bytes)
{
    if (!cfg) return bki_fail(BK_ERR_NULL, "bk_model_memory: NULL argument");
    bk_model *m = NULL;
    size_t need = 0;
    bk_status st = model_build(cfg, 0, max_batch, 1, &m, &need);
    if (!st) {
        if (num_params) *num_params = m->P;
        if (bytes) *bytes = need;
    }
    bk_model_free(m);
    return st;
}

/* fairseq's sinusoidal positions: row p = [sin(p w_0) .. sin(p w_{h-1}),
 * cos(p w_0) .. cos(p w_{h-1})] (, 0 for an odd dim), h = dim / 2,
 * w_i = 10000^(-i / (h - 1)), positions from 0 */
static void sinusoids(float *tab, int N, int D)
{
    const int h = D / 2;
    for (int p = 0; p < N; p++) {
        float *r = tab + (size_t)p * D;
        for (int i = 0; i < h; i++) {
            const double w = h > 1 ? exp(-log(10000.0) * (double)i / (double)(h - 1)) : 1.0;
            r[i] = (float)sin((double)p * w);
            r[h + i] = (float)cos((double)p * w);
        }
        if (D % 2) r[D - 1] = 0.0f;
    }
}

/* the sizes the allocations are planned for: max_batch B, the longest
 * sequence Nmax, the rows of the encoder (classifier) stream R, the
 * decoder's Rd, the larger Rx (the shared backward scratch) */
typedef struct {
    int B, Nmax;
    int64_t R, Rd, Rx;
} plan_rows;

/* the model's shapes from its configuration; Nmax */
static int model_shape(bk_model *m)
{
    const bk_model_config *c = &m->c;
    const int s2s = c->arch == BK_ARCH_SEQ2SEQ;
    m->dh = c->head_dim > 0 ? c->head_dim : c->dim / c->heads;
    m->I = c->heads * m->dh;
    if (c->input == BK_INPUT_IMAGE) {
        m->np = (c->image_h / c->patch) * (c->image_w / c->patch);
        m->in_feat = c->patch * c->patch * c->channels;
    } else if (c->input == BK_INPUT_TOKENS) {
        m->np = c->max_len;
        m->in_feat = 0;
    } else {
        m->np = c->max_points;
        m->in_feat = c->point_dim;
    }
    m->T = m->np + (s2s ? 0 : c->cls);
    m->Tmax = m->T;
    m->Td = s2s ? c->tgt_max_len : 0;
    m->otk_k = c->otk_anchors > 0 ? c->otk_anchors : c->dim;
    m->F = !s2s && c->pool == BK_POOL_OTK ? c->otk_supports * c->otk_refs * m->otk_k
           : bki_has_pma(c)                   ? c->pma_seeds * c->dim
                                          : c->dim;
    int Nmax = m->T > m->Td ? m->T : m->Td;
    if (bki_is_isab(c) && c->set_inducing > Nmax) Nmax = c->set_inducing;
    if (bki_has_pma(c) && c->pma_seeds > Nmax) Nmax = c->pma_seeds;
    return Nmax;
}

/* the embedding's and the stream's buffers, the encoder-decoder's, the set units' */
static void alloc_stream(bk_model *m, const plan_rows *q, sizer *z)
{
    const bk_model_config *c = &m->c;
    const int s2s = c->arch == BK_ARCH_SEQ2SEQ;
    const int64_t D = c->dim, I = m->I, M = c->mlp_dim, V = c->vocab, R = q->R, Rd = q->Rd, Rx = q->Rx;
    (void)s2s, (void)D, (void)I, (void)M, (void)V, (void)R, (void)Rd, (void)Rx;
    const int sets = bki_is_isab(c) || bki_has_pma(c);
    const size_t Bn = (size_t)q->B * (size_t)m->np;
    if (c->input != BK_INPUT_TOKENS) m->emb_in = falloc(Bn * (size_t)m->in_feat, z);
    if (c->input == BK_INPUT_POINTS) {
        m->emb_h = falloc(Bn * (size_t)D, z);
        m->emb_g = falloc(Bn * (size_t)D, z);
    }
    if (c->input == BK_INPUT_TOKENS) m->tokens = zalloc(z, Bn, sizeof(int32_t));
    if (!s2s) m->emb_o = falloc(Bn * (size_t)D, z);
    m->x0 = falloc((size_t)(q->R * D), z);
    if (s2s) {
        if (c->pos_embed == 2) {
            m->sin_tab = falloc((size_t)q->Nmax * (size_t)D, z);
            if (!z->bad && !z->measure) sinusoids(m->sin_tab, q->Nmax, (int)D);
        }
        m->nbt = zalloc(z, (size_t)q->B, sizeof(int32_t));
        m->dtok = zalloc(z, (size_t)q->Rd, sizeof(int32_t));
        m->tgt = zalloc(z, (size_t)q->Rd, sizeof(int32_t));
        m->dx0 = falloc((size_t)(q->Rd * D), z);
        m->dfin = falloc((size_t)(q->Rd * D), z);
        m->dfmu = falloc((size_t)q->Rd, z);
        m->dfrs = falloc((size_t)q->Rd, z);
        m->plog = falloc((size_t)q->Rd * (size_t)V, z);
        m->rloss = zalloc(z, 2 * (size_t)q->Rd, sizeof(double));
        m->dMem = falloc((size_t)(q->R * D), z);
        if (c->post_ln) m->dS = falloc((size_t)(q->Rx * D), z);
    }
    if (sets) {
        m->dMem = falloc((size_t)(q->Rx * D), z);
        m->dY = falloc((size_t)(q->Rx * D), z);
        m->dXs = falloc((size_t)(q->Rx * D), z);
    }
}

/* every block's activations, tapes and the workspace they need */
static void alloc_blocks(bk_model *m, const plan_rows *q, sizer *z, size_t *wsz)
{
    const bk_model_config *c = &m->c;
    const int s2s = c->arch == BK_ARCH_SEQ2SEQ;
    const int64_t D = c->dim, I = m->I, M = c->mlp_dim, V = c->vocab, R = q->R, Rd = q->Rd, Rx = q->Rx;
    (void)s2s, (void)D, (void)I, (void)M, (void)V, (void)R, (void)Rd, (void)Rx;
    bk_attn_desc ad = {q->B, c->heads, m->T, m->T, m->dh, m->dh, NULL, NULL};
    bk_attn_desc dd = {q->B, c->heads, m->Td, m->Td, m->dh, m->dh, NULL, NULL};
    bk_attn_desc cd = {q->B, c->heads, m->Td, m->T, m->dh, m->dh, NULL, NULL};
    for (int l = 0; l < bki_block_count(c); l++) {
        blk_act *a = &m->ba[l];
        if (bki_unit_of(c, l) == U_MAB) {
            alloc_mab(m, l, z, wsz);
            if (z->bad) break;
            continue;
        }
        const int dec = l >= c->depth;
        const int64_t Rl = dec ? Rd : R;
        a->mid = falloc((size_t)(Rl * D), z);
        a->out = M > 0 || dec ? falloc((size_t)(Rl * D), z) : a->mid;
        a->ln1 = falloc((size_t)(Rl * D), z);
        a->mu1 = falloc((size_t)Rl, z);
        a->rs1 = falloc((size_t)Rl, z);
        a->qkv = falloc((size_t)(Rl * 3 * I), z);
        a->att = falloc((size_t)(Rl * I), z);
        if (M > 0) {
            a->ln2 = falloc((size_t)(Rl * D), z);
            a->mu2 = falloc((size_t)Rl, z);
            a->rs2 = falloc((size_t)Rl, z);
            a->f1 = falloc((size_t)(Rl * M), z);
            a->g1 = falloc((size_t)(Rl * M), z);
        }
        if (dec) {
            /* (without an MLP the block's output is the cross-attention's) */
            a->cmid = M > 0 ? falloc((size_t)(q->Rd * D), z) : a->out;
            a->lnc = falloc((size_t)(q->Rd * D), z);
            a->muc = falloc((size_t)q->Rd, z);
            a->rsc = falloc((size_t)q->Rd, z);
            a->cq = falloc((size_t)(q->Rd * I), z);
            a->ckv = falloc((size_t)(q->R * 2 * I), z);
            a->catt = falloc((size_t)(q->Rd * I), z);
        }
        if (!dec && c->cls_attn != BK_CLS_FULL) a->clsa = falloc((size_t)q->R * (size_t)c->heads, z);
        if (!dec && (bki_attn_layer_flags(c->attn) & BKI_LAYER_BUFFERS)) {
            a->draw = falloc((size_t)(q->R * I), z);
            a->drs = falloc((size_t)q->R * (size_t)c->heads, z);
            a->lam = falloc((size_t)c->heads, z);
        }
        if (z->bad) break;
        const attn_site self = {l, 0, dec}, cross = {l, 1, 0};
        a->tape_cap = bki_attn_tape(m, dec ? &dd : &ad, self);
        if (a->tape_cap) a->tape = zalloc(z, a->tape_cap, 1);
        size_t w1 = bki_attn_ws(m, dec ? &dd : &ad, self);
        if (w1 > *wsz) *wsz = w1;
        if (dec) {
            a->ctape_cap = bki_attn_tape(m, &cd, cross);
            if (a->ctape_cap) a->ctape = zalloc(z, a->ctape_cap, 1);
            w1 = bki_attn_ws(m, &cd, cross);
            if (w1 > *wsz) *wsz = w1;
        }
    }
}

/* the final norm, the [CLS] row's and DWC's scratch, the pooling and head */
static void alloc_head(bk_model *m, const plan_rows *q, sizer *z, size_t *wsz)
{
    const bk_model_config *c = &m->c;
    const int s2s = c->arch == BK_ARCH_SEQ2SEQ;
    const int64_t D = c->dim, I = m->I, M = c->mlp_dim, V = c->vocab, R = q->R, Rd = q->Rd, Rx = q->Rx;
    (void)s2s, (void)D, (void)I, (void)M, (void)V, (void)R, (void)Rd, (void)Rx;
    m->fin = falloc((size_t)(q->R * D), z);
    m->fmu = falloc((size_t)R, z);
    m->frs = falloc((size_t)R, z);
    m->nb = zalloc(z, (size_t)q->B, sizeof(int32_t));
    if (c->cls_attn != BK_CLS_FULL) {
        m->nb1 = zalloc(z, (size_t)q->B, sizeof(int32_t));
        m->dcls = falloc(2 * (size_t)q->R * (size_t)c->heads, z);
    }
    if (c->dwc) m->ddwc = zalloc(z, (size_t)(c->dwc_kernel * c->dwc_kernel + 1) * (size_t)m->dh, sizeof(double));
    if (!s2s) {
        m->pooled = falloc((size_t)q->B * (size_t)m->F, z);
        m->logits = falloc((size_t)q->B * (size_t)c->classes, z);
        m->probs = falloc((size_t)q->B * (size_t)c->classes, z);
        m->argmax = zalloc(z, (size_t)q->B * (size_t)D, sizeof(int32_t));
        m->labels = zalloc(z, (size_t)q->B, sizeof(int32_t));
        m->dpool = falloc((size_t)q->B * (size_t)m->F, z);
        m->dlog = falloc((size_t)q->B * (size_t)c->classes, z);
    }
    if (!s2s && c->pool == BK_POOL_OTK) {
        bk_otk_desc od = {q->B, m->T, c->dim, c->otk_refs, c->otk_supports, m->otk_k, NULL};
        bk_otk_config op = bki_otk_params(m);
        /* (the sizes depend on whether there are anchors, not on their
         * values: measuring, there is no parameter buffer yet) */
        const float no_anchors_yet = 0.0f;
        if (c->otk_anchors > 0 && !op.W) op.W = &no_anchors_yet;
        m->otk_tape_cap = bk_otk_tape_size(&od, &op);
        m->otk_tape = zalloc(z, m->otk_tape_cap, 1);
        size_t w1 = bk_otk_workspace_size(&od, &op);
        if (w1 > *wsz) *wsz = w1;
    }
}

/* the backward's scratch */
static void alloc_scratch(bk_model *m, const plan_rows *q, sizer *z)
{
    const bk_model_config *c = &m->c;
    const int s2s = c->arch == BK_ARCH_SEQ2SEQ;
    const int64_t D = c->dim, I = m->I, M = c->mlp_dim, V = c->vocab, R = q->R, Rd = q->Rd, Rx = q->Rx;
    (void)s2s, (void)D, (void)I, (void)M, (void)V, (void)R, (void)Rd, (void)Rx;
    m->dX = falloc((size_t)(q->Rx * D), z);
    m->dT = falloc((size_t)(q->Rx * D), z);
    m->dN = falloc((size_t)(q->Rx * D), z);
    m->dA = falloc((size_t)(q->Rx * I), z);
    m->dq = falloc((size_t)(q->Rx * I), z);
    m->dk = falloc((size_t)(q->Rx * I), z);
    m->dv = falloc((size_t)(q->Rx * I), z);
    m->dM = falloc((size_t)(q->Rx * (M > D ? M : D)), z);
    const size_t otmp = s2s ? 0 : (size_t)c->otk_refs * (size_t)c->otk_supports * (size_t)m->otk_k;
    m->dZtmp = falloc(otmp, z);
    { /* the learned arrays' gradients of a block (the tensors of block 0) */
        bki_attn_tensor at[BKI_MAX_ATTN_TENSORS];
        const int n = c->depth > 0 ? bki_attn_tensors(c, m->dh, at) : 0;
        for (int i = 0; i < n; i++)
            if (at[i].slot < BKI_MAX_LEARNED) {
                const int64_t cnt = at[i].dims[0] * (at[i].ndim > 1 ? at[i].dims[1] : 1) * (at[i].ndim > 2 ? at[i].dims[2] : 1);
                m->lgrad_n[at[i].slot] = cnt;
                m->lgrad[at[i].slot] = falloc((size_t)cnt, z);
            }
    }
    if (!s2s && c->pool == BK_POOL_OTK && c->otk_anchors > 0) m->dWtmp = falloc((size_t)c->otk_anchors * (size_t)D, z);
    { /* the Linear weight gradients' K split: the largest out x in of the
       * encoder's and decoder's Linear layers (D, I, MLP wide), up to 1 MiB */
        const int64_t dmax = D > I ? D : I, wmax = dmax > M ? dmax : M;
        const size_t kn = bki_linear_kbuf_floats((int)wmax, (int)wmax);
        m->kbuf_n = kn <= KBUF_MAX ? kn : 0;
        m->kbuf = m->kbuf_n ? falloc(m->kbuf_n, z) : NULL;
    }
    if (bki_attn_layer_flags(c->attn) & BKI_LAYER_BUFFERS) {
        m->dO = falloc((size_t)(q->R * I), z);
        m->dlam = falloc((size_t)c->heads, z);
    }
}

static bk_status model_build(const bk_model_config *cfg, uint64_t seed, int max_batch, int measure, bk_model **out,
                             size_t *bytes)
{
    *out = NULL;
    bk_status st = bk_model_config_check(cfg);
    if (st) return st;
    if (max_batch < 1) return bki_fail(BK_ERR_PARAM, "bk_model_create: max_batch must be >= 1 (got %d)", max_batch);
    bk_model *m = calloc(1, sizeof *m);
    if (!m) return bki_fail(BK_ERR_NOMEM, "bk_model_create: out of memory");
    m->c = *cfg;
    const bk_model_config *c = &m->c;
    m->seed = seed;
    m->max_batch = max_batch;
    plan_rows q = {max_batch, model_shape(m), 0, 0, 0};
    q.R = (int64_t)max_batch * m->T;
    q.Rd = (int64_t)max_batch * m->Td;
    q.Rx = (int64_t)max_batch * q.Nmax;
    const int NB = bki_block_count(c);
    const int64_t D = c->dim, I = m->I, V = c->vocab;
    /* (bounds that keep every size below in range; bk_model_memory and the
     * physical-memory check refuse what is merely too large for the machine) */
    if (q.Rx * (3 * I > D ? 3 * I : D) > ((int64_t)1 << 40) || (double)q.Rd * (double)V > 0x1p40 ||
        (double)max_batch * c->heads * (double)q.Nmax * (double)q.Nmax * 8.0 > 0x1p60)
        return bk_model_free(m), bki_fail(BK_ERR_SHAPE, "bk_model_create: activations too large");
    m->bo = calloc((size_t)(NB ? NB : 1), sizeof *m->bo);
    m->ba = calloc((size_t)(NB ? NB : 1), sizeof *m->ba);
    if (!m->bo || !m->ba) return bk_model_free(m), bki_fail(BK_ERR_NOMEM, "bk_model_create: out of memory");
    build_table(m);
    if (m->nparam_need > MAXP) {
        const int need = m->nparam_need;
        bk_model_free(m);
        return bki_fail(BK_ERR_PARAM, "bk_model_create: %d blocks are too many (the configuration has %d tensors, "
                        "the parameter table holds %d)", NB, need, MAXP);
    }
    sizer z = {0, 0, measure};
    m->w = falloc((size_t)m->P, &z);
    m->gw = falloc((size_t)m->P, &z);
    if (z.bad) {
        const long long P = (long long)m->P;
        bk_model_free(m);
        return bki_fail(BK_ERR_NOMEM, "bk_model_create: out of memory for %lld parameters", P);
    }
    if (!measure) init_params(m);
    size_t wsz = 0;
    alloc_stream(m, &q, &z);
    alloc_blocks(m, &q, &z, &wsz);
    alloc_head(m, &q, &z, &wsz);
    alloc_scratch(m, &q, &z);
    if (z.bad) return bk_model_free(m), bki_fail(BK_ERR_NOMEM, "bk_model_create: out of memory for activations");
    if (measure) {
        *bytes = wsz > SIZE_MAX - z.bytes ? SIZE_MAX : z.bytes + wsz;
        *out = m;
        return BK_OK;
    }
    if ((st = bki_model_ensure_ws(m, wsz))) return bk_model_free(m), st;
    *out = m;
    return BK_OK;
}

/* samples [s, s + n) of a batch (bki_views into its arrays) */
bk_batch bki_batch_slice(const bk_model *m, const bk_batch *b, int s, int n)
{
    const int64_t per = bki_model_sample_size(m);
    const bk_model_config *c = bk_model_get_config(m);
    bk_batch part = *b;
    part.B = n;
    part.x = b->x ? b->x + (int64_t)s * per : NULL;
    part.tokens = b->tokens ? b->tokens + (int64_t)s * per : NULL;
    part.len = b->len ? b->len + s : NULL;
    part.labels = b->labels ? b->labels + s : NULL;
    part.tgt = b->tgt ? b->tgt + (int64_t)s * c->tgt_max_len : NULL;
    part.tgt_len = b->tgt_len ? b->tgt_len + s : NULL;
    return part;
}

/* what the loss averages over: samples, or (seq2seq) target tokens */
int64_t bki_batch_weight(const bk_model *m, const bk_batch *b)
{
    if (bk_model_get_config(m)->arch != BK_ARCH_SEQ2SEQ || !b->tgt_len) return b->B;
    int64_t w = 0;
    for (int i = 0; i < b->B; i++) w += b->tgt_len[i] > 0 ? b->tgt_len[i] : 0;
    return w;
}

const bk_model_config *bk_model_get_config(const bk_model *m) { return m ? &m->c : NULL; }
int64_t bk_model_num_params(const bk_model *m) { return m ? m->P : 0; }
int bk_model_param_count(const bk_model *m) { return m ? m->nparam : 0; }
float *bk_model_params(bk_model *m) { return m ? m->w : NULL; }
float *bk_model_grads(bk_model *m) { return m ? m->gw : NULL; }
int bk_model_tokens(const bk_model *m) { return m ? m->T : 0; }
const bki_param *bki_model_table(const bk_model *m, int *count)
{
    *count = m->nparam;
    return m->tab;
}
uint64_t bki_model_seed(const bk_model *m) { return m->seed; }
int bki_model_max_batch(const bk_model *m) { return m->max_batch; }
uint64_t bki_model_fwd_count(const bk_model *m) { return m->fwd_count; }
void bki_model_set_fwd_count(bk_model *m, uint64_t c) { m->fwd_count = c; }

bk_status bk_model_param(const bk_model *m, int i, bk_param_info *info)
{
    if (!m || !info) return bki_fail(BK_ERR_NULL, "bk_model_param: NULL argument");
    if (i < 0 || i >= m->nparam) return bki_fail(BK_ERR_PARAM, "bk_model_param: index %d outside [0, %d)", i, m->nparam);
    const bki_param *p = &m->tab[i];
    info->name = p->name;
    info->ndim = p->ndim;
    for (int k = 0; k < 4; k++) info->shape[k] = k < p->ndim ? p->shape[k] : 0;
    info->offset = p->off;
    info->count = p->count;
    info->decay = p->decay;
    info->data = m->w + p->off;
    info->grad = m->gw + p->off;
    return BK_OK;
}

/* the gradient in claimed blocks of 16384 floats (whole lines) */
static void zero_grad_member(void *arg)
{
    const bk_model *m = arg;
    const bki_team tm = bki_region_team();
    bki_claims cl = bki_ranges_open(&tm, m->P, 16384);
    for (int64_t lo, hi; bki_ranges_next(&cl, &lo, &hi);) memset(m->gw + lo, 0, sizeof(float) * (size_t)(hi - lo));
}

void bk_model_zero_grad(bk_model *m)
{
    if (!m) return;
    /* on the library's threads */
    bki_parallel_claimed(m->P > 65536 ? bki_threads() : 1, zero_grad_member, m);
}

bk_status bk_model_set_asap(bk_model *m, int layer, const bk_asap_layer *asap)
{
    if (!m || !asap) return bki_fail(BK_ERR_NULL, "bk_model_set_asap: NULL argument");
    if (!(bki_attn_layer_flags(m->c.attn) & BKI_LAYER_HOLDS))
        return bki_fail(BK_ERR_PARAM, "bk_model_set_asap: the model's attention is not asap");
    if (layer < 0 || layer >= m->c.depth)
        return bki_fail(BK_ERR_PARAM, "bk_model_set_asap: layer %d outside [0, %d)", layer, m->c.depth);
    if (asap->d != m->dh)
        return bki_fail(BK_ERR_SHAPE, "bk_model_set_asap: layer has d = %d, the model's head_dim is %d", asap->d, m->dh);
    bk_asap_layer *cp = calloc(1, sizeof *cp);
    if (!cp) return bki_fail(BK_ERR_NOMEM, "bk_model_set_asap: out of memory");
    *cp = *asap;
    cp->theta = malloc(sizeof(float) * (size_t)asap->slices * (size_t)asap->d);
    cp->omega = malloc(sizeof(double) * (size_t)asap->slices);
    if (!cp->theta || !cp->omega) {
        free(cp->theta);
        free(cp->omega);
        free(cp);
        return bki_fail(BK_ERR_NOMEM, "bk_model_set_asap: out of memory");
    }
    memcpy(cp->theta, asap->theta, sizeof(float) * (size_t)asap->slices * (size_t)asap->d);
    memcpy(cp->omega, asap->omega, sizeof(double) * (size_t)asap->slices);
    if (m->ba[layer].asap) {
        bk_asap_layer_free(m->ba[layer].asap);
        free(m->ba[layer].asap);
    }
    m->ba[layer].asap = cp;
    size_t need =
        bki_attn_ws(m, &(bk_attn_desc){m->max_batch, m->c.heads, m->T, m->T, m->dh, m->dh, NULL, NULL}, bki_self_site(layer));
    return bki_model_ensure_ws(m, need);
}

/* ------------------------------------------------------------------------ */
/* changing the attention of a model: in place, or swapped into a new one   */
/* ------------------------------------------------------------------------ */
/* the attention keys: what a swap may change besides the sites' kinds and
 * their operators' parameters (the rest of the configuration fixes the
 * parameter table of everything but the attention) */
static const char *const SWAP_KEYS[] = {"attn_scale", "cls_attn", "pol_ps", "pol_po", "lot_learn", NULL};
/* what bk_model_set_attn_config may change in place besides the sites'
 * parameters (under the same kinds, with the learned arrays' shapes kept) */
static const char *const INPLACE_KEYS[] = {"attn_scale", "pol_ps", "pol_po", "lot_learn", NULL};

/* The first key (in the text form's order) in which a and b differ once
 * b's keys in allowed are a's, and with sites = 1 the sites' parameters
 * (sites = 2: and their kinds), copied into key; 0 when there is none. */
static int config_diff(const bk_model_config *a, const bk_model_config *b, const char *const *allowed, int sites,
                       char *key, size_t cap)
{
    bk_model_config t = *b;
    char v[128];
    for (int i = 0; allowed[i]; i++)
        if (bk_model_config_get(a, allowed[i], v, sizeof v)) (void)bk_model_config_set(&t, allowed[i], v);
    if (sites == 2) {
        t.attn = a->attn;
        t.cross_attn = a->cross_attn;
        t.pma_attn = a->pma_attn;
    }
    if (sites && t.attn == a->attn) t.attn_par = a->attn_par;
    if (sites && t.cross_attn == a->cross_attn) t.cross_par = a->cross_par;
    if (sites && t.pma_attn == a->pma_attn) t.pma_par = a->pma_par;
    bki_clear_error();
    char ta[8192], tb[8192];
    bk_model_config_format(a, ta, sizeof ta);
    bk_model_config_format(&t, tb, sizeof tb);
    for (const char *p = ta, *q = tb; *p || *q;) {
        const size_t lp = strcspn(p, "\n"), lq = strcspn(q, "\n"), k = strcspn(p, "=");
        if (lp != lq || strncmp(p, q, lp)) {
            snprintf(key, cap, "%.*s", (int)k, p);
            return 1;
        }
        p += lp + (p[lp] == '\n');
        q += lq + (q[lq] == '\n');
    }
    return 0;
}

/* the block attention tensors of a and b have the same names and shapes */
static int same_attn_tensors(const bk_model_config *a, const bk_model_config *b, int dh)
{
    bki_attn_tensor ta[BKI_MAX_ATTN_TENSORS], tb[BKI_MAX_ATTN_TENSORS];
    const int na = bki_attn_tensors(a, dh, ta), nb = bki_attn_tensors(b, dh, tb);
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (strcmp(ta[i].name, tb[i].name) || ta[i].ndim != tb[i].ndim || memcmp(ta[i].dims, tb[i].dims, sizeof ta[i].dims))
            return 0;
    return 1;
}

bk_status bk_model_set_attn_config(bk_model *m, const bk_model_config *c)
{
    if (!m || !c) return bki_fail(BK_ERR_NULL, "bk_model_set_attn_config: NULL argument");
    bk_status st = bk_model_config_check(c);
    if (st) return st;
    char key[64];
    if (config_diff(&m->c, c, INPLACE_KEYS, 1, key, sizeof key))
        return bki_fail(BK_ERR_PARAM,
                        "bk_model_set_attn_config: %s differs; in place only attn_scale, the sites' operator "
                        "parameters (attn.*, cross_attn.*, pma_attn.*), lot_learn and pol_ps/pol_po may change "
                        "(bk_model_swap changes the attention kind and cls_attn)",
                        key);
    if (!same_attn_tensors(&m->c, c, m->dh))
        return bki_fail(BK_ERR_PARAM, "bk_model_set_attn_config: the new attn.* parameters change the shapes of the "
                                      "learned arrays of %s (e.g. LOT's attn.r); they are trained weights",
                        bk_attn_kind_name(c->attn));
    /* the tapes follow the new parameters (grown, never shrunk); the
     * workspace grows on use (ensure_ws) */
    const bk_model_config old = m->c;
    m->c = *c;
    bk_attn_desc ad = {m->max_batch, c->heads, m->Tmax, m->Tmax, m->dh, m->dh, NULL, NULL};
    /* (the decoder's at its largest: m->Td is the last batch's target length) */
    const int tdmax = c->arch == BK_ARCH_SEQ2SEQ ? c->tgt_max_len : 0;
    bk_attn_desc dd = {m->max_batch, c->heads, tdmax, tdmax, m->dh, m->dh, NULL, NULL};
    for (int l = 0; l < bki_block_count(c); l++) {
        blk_act *a = &m->ba[l];
        const unit_kind uk = bki_unit_of(c, l);
        const int dec = uk == U_DEC;
        /* encoder blocks: self-attention; decoder blocks: both; MAB units:
         * their cross-attention */
        for (int cross = uk == U_MAB; cross <= (uk != U_ENC); cross++) {
            void **tape = cross ? &a->ctape : &a->tape;
            size_t *cap = cross ? &a->ctape_cap : &a->tape_cap;
            const bk_attn_desc cd = bki_cross_desc_max(m, l);
            const size_t need = bki_attn_tape(m, cross ? &cd : dec ? &dd : &ad, (attn_site){l, cross, dec && !cross});
            if (need <= *cap) continue;
            void *t = calloc(1, need);
            if (!t) {
                m->c = old;
                return bki_fail(BK_ERR_NOMEM, "bk_model_set_attn_config: out of memory for a %zu-byte tape", need);
            }
            free(*tape);
            *tape = t;
            *cap = need;
        }
    }
    m->have_tape = 0; /* a pending backward belongs to the old attention */
    return BK_OK;
}

bk_status bk_model_swap(const bk_model *src, const bk_model_config *target, const int *blocks, int nblocks,
                        int max_batch, bk_model **out)
{
    if (!src || !target || !out) return bki_fail(BK_ERR_NULL, "bk_model_swap: NULL argument");
    *out = NULL;
    const int depth = src->c.depth;
    if (nblocks < 0 || (nblocks > 0 && !blocks))
        return bki_fail(BK_ERR_PARAM, "bk_model_swap: nblocks = %d without a block list", nblocks);
    if (nblocks > 0 && src->c.arch == BK_ARCH_SEQ2SEQ)
        return bki_fail(BK_ERR_UNSUPPORTED, "bk_model_swap: an encoder-decoder's swap is chosen by the target's attn "
                                            "(encoder self-attention) and cross_attn (cross-attention), not by a block "
                                            "list");
    if (nblocks > 0) {
        /* a list naming every block is a swap of all blocks; one kind per
         * model is all a model holds today */
        char seen[4096] = {0};
        int distinct = 0;
        for (int i = 0; i < nblocks; i++) {
            if (blocks[i] < 0 || blocks[i] >= depth)
                return bki_fail(BK_ERR_PARAM, "bk_model_swap: block %d outside [0, %d)", blocks[i], depth);
            distinct += !seen[blocks[i]];
            seen[blocks[i]] = 1;
        }
        if (distinct != depth)
            return bki_fail(BK_ERR_UNSUPPORTED,
                            "bk_model_swap: the blocks of a model share one attention kind; swapping %d of its %d "
                            "blocks is not supported (swap every block)",
                            distinct, depth);
    }
    bk_status st = bk_model_config_check(target);
    if (st) return st;
    if (bki_attn_layer_flags(target->attn) & BKI_LAYER_HOLDS)
        return bki_fail(BK_ERR_PARAM, "bk_model_swap: ASAP layers are compiled from a Sinkhorn model's own attention "
                                      "on calibration inputs (bk_asap_compile, `birkhoff model swap --attn asap`)");
    char key[64];
    if (config_diff(&src->c, target, SWAP_KEYS, 2, key, sizeof key))
        return bki_fail(BK_ERR_PARAM,
                        "bk_model_swap: %s differs; a swap changes the attention only (attn, cross_attn, pma_attn, "
                        "their attn.* parameters, attn_scale, cls_attn, pol_*, lot_learn)",
                        key);
    if (src->c.attn == target->attn && !same_attn_tensors(&src->c, target, src->dh))
        return bki_fail(BK_ERR_PARAM, "bk_model_swap: the attn.* parameters change the shapes of %s's learned arrays "
                                      "(e.g. LOT's attn.r: the pivots are trained weights of attn.r rows; their count "
                                      "cannot change)",
                        bk_attn_kind_name(target->attn));
    bk_model *m = NULL;
    if ((st = bk_model_create(target, src->seed, max_batch, &m))) return st;
    /* every tensor both tables name is copied; the others (a LOT target's
     * pivots and mass logits) keep the initialisation of bk_model_create
     * with the source's seed */
    for (int i = 0; i < m->nparam; i++) {
        const bki_param *p = &m->tab[i];
        for (int j = 0; j < src->nparam; j++) {
            const bki_param *q = &src->tab[j];
            if (strcmp(p->name, q->name)) continue;
            if (q->count != p->count) { /* (no shared tensor changes shape: the learned arrays are checked above) */
                bk_model_free(m);
                return bki_fail(BK_ERR_SHAPE, "bk_model_swap: tensor %s changes shape", p->name);
            }
            memcpy(m->w + p->off, src->w + q->off, sizeof(float) * (size_t)p->count);
            break;
        }
    }
    m->fwd_count = src->fwd_count;
    *out = m;
    return BK_OK;
}

bk_status bk_model_forward(bk_model *m, const bk_batch *bt, int train, float ls, float *logits, double *loss)
{
    if (!m) return bki_fail(BK_ERR_NULL, "bk_model_forward: NULL model");
    const bk_model_config *c = &m->c;
    bk_status st = bki_check_batch(m, bt, loss != NULL || train);
    if (st) return st;
    if (!(ls >= 0.0f && ls < 1.0f)) return bki_fail(BK_ERR_PARAM, "model: label smoothing %g outside [0, 1)", (double)ls);
    if (train && !bki_attn_op(c->attn)->backward)
        return bki_fail(BK_ERR_PARAM, "model: ASAP layers are compiled for inference only; they cannot be trained");
    m->have_tape = 0;
    m->B = bt->B;
    m->ls = ls;
    if (train) m->cur_count = m->fwd_count;
    if (c->arch == BK_ARCH_SEQ2SEQ) {
        if ((st = bki_s2s_forward(m, bt, train, ls, logits, loss))) return st;
        if (train) {
            m->have_tape = 1;
            m->fwd_count++;
        }
        return BK_OK;
    }
    const int B = bt->B;
    if ((st = bki_trunk_fwd(m, bt, train))) return st;
    if ((st = bki_pool_fwd(m, B, train))) return st;
    bki_linear_fwd(B, m->F, c->classes, m->pooled, m->F, m->w + m->head_w, m->w + m->head_b, m->logits, c->classes);

    const int C = c->classes;
    double total = 0.0;
    int finite = 1;
    int64_t hits = 0;
    for (int b = 0; b < B; b++) {
        const float *z = m->logits + (size_t)b * C;
        float *p = m->probs + (size_t)b * C;
        double mx = z[0];
        for (int j = 1; j < C; j++) mx = z[j] > mx ? z[j] : mx;
        double s = 0.0;
        for (int j = 0; j < C; j++) s += exp(z[j] - mx);
        const double lse = mx + log(s);
        double mean_nll = 0.0;
        for (int j = 0; j < C; j++) {
            p[j] = (float)exp(z[j] - lse);
            mean_nll += lse - z[j];
        }
        if (!isfinite(lse)) finite = 0;
        if (bt->labels) {
            total += (1.0 - ls) * (lse - z[bt->labels[b]]) + ls * mean_nll / C;
            int best = 0;
            for (int j = 1; j < C; j++) best = z[j] > z[best] ? j : best;
            hits += best == bt->labels[b];
        }
    }
    m->ntok = bt->labels ? B : 0;
    m->ncorrect = hits;
    if (!finite) return bki_fail(BK_ERR_NONFINITE, "model: non-finite logits (diverged parameters?)");
    if (logits) memcpy(logits, m->logits, sizeof(float) * (size_t)B * C);
    if (loss) *loss = total / B;
    if (train) {
        m->have_tape = 1;
        m->fwd_count++;
    }
    return BK_OK;
}

bk_status bk_model_otk_fit(bk_model *m, const bk_batch *b, const bk_kmeans_config *kp, bk_kmeans_report *rep)
{
    if (!m || !b) return bki_fail(BK_ERR_NULL, "bk_model_otk_fit: NULL argument");
    const bk_model_config *c = &m->c;
    if (c->arch != BK_ARCH_CLASSIFIER || c->pool != BK_POOL_OTK)
        return bki_fail(BK_ERR_PARAM, "bk_model_otk_fit: the model has no OTK pool (%s)",
                        c->arch != BK_ARCH_CLASSIFIER ? "arch=seq2seq" : "pool is not otk");
    if (b->B < 1) return bki_fail(BK_ERR_SHAPE, "bk_model_otk_fit: empty batch");
    const int B = b->B, T = m->T, D = c->dim, K = c->otk_anchors;
    const size_t rows = (size_t)B * (size_t)T;
    float *feat = malloc(sizeof(float) * rows * (size_t)D);
    int32_t *len = malloc(sizeof(int32_t) * (size_t)B);
    float *W = K > 0 ? malloc(sizeof(float) * (size_t)K * (size_t)D) : NULL;
    const size_t zn = (size_t)c->otk_refs * (size_t)c->otk_supports * (size_t)m->otk_k;
    float *z = malloc(sizeof(float) * zn);
    bk_status st = BK_OK;
    if (!feat || !len || !z || (K > 0 && !W)) st = bki_fail(BK_ERR_NOMEM, "out of memory for %zu pooled rows", rows);
    /* the pooled sets: inference forwards of the trunk, max_batch samples at
     * a time (labels are not read) */
    for (int s0 = 0; s0 < B && st == BK_OK; s0 += m->max_batch) {
        const int n = B - s0 < m->max_batch ? B - s0 : m->max_batch;
        bk_batch part = bki_batch_slice(m, b, s0, n);
        part.labels = NULL;
        if ((st = bki_check_batch(m, &part, 0))) break;
        m->have_tape = 0; /* (the activations a pending backward needs are overwritten) */
        m->B = n;
        if ((st = bki_trunk_fwd(m, &part, 0))) break;
        memcpy(feat + (size_t)s0 * T * D, m->fin, sizeof(float) * (size_t)n * T * D);
        memcpy(len + s0, m->nb, sizeof(int32_t) * (size_t)n);
    }
    const bk_kmeans_config kc = kp ? *kp : bk_kmeans_config_default();
    const bk_tensor x = {feat, (int64_t)T * D, 0, D, BK_DEVICE_HOST, BK_F32};
    bk_otk_desc d = {B, T, D, c->otk_refs, c->otk_supports, m->otk_k, len};
    if (st == BK_OK && K > 0) {
        d.k = K;
        st = bk_otk_fit_anchors(&d, &x, &kc, W, NULL);
    }
    /* references on the features of those anchors; the K-means knows no
     * positions (otk_pe is left out of the fit) */
    bk_otk_config op = bki_otk_params(m);
    op.W = W;
    op.pe = BK_OTK_PE_NONE;
    if (st == BK_OK) st = bk_otk_fit_refs(&d, &op, &x, &kc, 0, z, rep);
    if (st == BK_OK) {
        if (K > 0) memcpy(m->w + m->otk_w, W, sizeof(float) * (size_t)K * (size_t)D);
        memcpy(m->w + m->otk_z, z, sizeof(float) * zn);
    } else {
        char msg[480];
        snprintf(msg, sizeof msg, "%s", bk_last_error());
        bki_fail(st, "bk_model_otk_fit: %s (the model is unchanged)", msg);
    }
    free(feat);
    free(len);
    free(W);
    free(z);
    return st;
}

bk_status bk_model_backward(bk_model *m, float grad_scale)
{
    if (!m) return bki_fail(BK_ERR_NULL, "bk_model_backward: NULL model");
    if (!m->have_tape) return bki_fail(BK_ERR_TAPE, "bk_model_backward: no training forward to differentiate");
    if (!isfinite(grad_scale)) return bki_fail(BK_ERR_PARAM, "bk_model_backward: grad_scale must be finite");
    const bk_model_config *c = &m->c;
    bk_status st;
    if (c->arch == BK_ARCH_SEQ2SEQ) {
        if ((st = bki_s2s_backward(m, grad_scale))) return st;
        m->have_tape = 0;
        return BK_OK;
    }
    const int B = m->B, T = m->T, D = c->dim, R = B * T, C = c->classes;
    const float ls = m->ls;
    /* dlogits = scale / B (p - target) */
    for (int b = 0; b < B; b++)
        for (int j = 0; j < C; j++) {
            const float tgt = (1.0f - ls) * (j == m->labels[b]) + ls / (float)C;
            m->dlog[(size_t)b * C + j] = grad_scale / (float)B * (m->probs[(size_t)b * C + j] - tgt);
        }
    bki_linear_bwd(B, m->F, C, m->pooled, m->F, m->w + m->head_w, m->dlog, C, m->dpool, 0.0f, m->gw + m->head_w,
                   m->gw + m->head_b, bki_kb(m, C, m->F));
    if ((st = bki_pool_bwd(m, B))) return st;
    const float *xlast = c->depth > 0 ? m->ba[c->depth - 1].out : m->x0;
    if (c->final_norm) {
        memset(m->dX, 0, sizeof(float) * (size_t)R * D);
        bki_layernorm_bwd(R, D, xlast, m->fmu, m->frs, m->w + m->nrm_w, m->dN, m->dX, m->gw + m->nrm_w, m->gw + m->nrm_b);
    } else {
        memcpy(m->dX, m->dN, sizeof(float) * (size_t)R * D);
    }
    for (int l = c->depth - 1; l >= 0; l--) {
        const float *xin = l > 0 ? m->ba[l - 1].out : m->x0;
        if ((st = bki_is_isab(c) ? bki_isab_bwd(m, l, B, xin) : bki_enc_block_bwd(m, l, B, xin))) return st;
    }
    bki_embed_bwd(m, B);
    m->have_tape = 0;
    return BK_OK;
}

bk_status bk_model_token_stats(const bk_model *m, int64_t *tokens, int64_t *correct)
{
    if (!m) return bki_fail(BK_ERR_NULL, "bk_model_token_stats: NULL model");
    if (m->ntok < 1) return bki_fail(BK_ERR_PARAM, "bk_model_token_stats: no forward with labels or targets has run");
    if (tokens) *tokens = m->ntok;
    if (correct) *correct = m->ncorrect;
    return BK_OK;
}

bk_asap_config bk_model_asap_config(const bk_model *m)
{
    bk_asap_config a = bk_asap_config_default(m ? m->dh : 1);
    if (!m) return a;
    /* the teacher: the model's Sinkhorn (attn.eps, attn.iters; a model of
     * another kind: Sinkhorn's defaults) */
    char v[64];
    a.scale = m->c.attn_scale;
    a.eps = bk_model_config_get(&m->c, "attn.eps", v, sizeof v) ? strtof(v, NULL) : 1.0f;
    a.teacher_iters = bk_model_config_get(&m->c, "attn.iters", v, sizeof v) ? (int)strtol(v, NULL, 10) : 5;
    bki_clear_error();
    return a;
}

bk_status bk_model_calib_add(bk_model *m, int layer, bk_asap_calib *calib)
{
    if (!m || !calib) return bki_fail(BK_ERR_NULL, "bk_model_calib_add: NULL argument");
    if (layer < 0 || layer >= m->c.depth)
        return bki_fail(BK_ERR_PARAM, "bk_model_calib_add: layer %d outside [0, %d)", layer, m->c.depth);
    if (m->B < 1) return bki_fail(BK_ERR_PARAM, "bk_model_calib_add: no forward has run");
    if (bki_is_isab(&m->c))
        return bki_fail(BK_ERR_UNSUPPORTED, "bk_model_calib_add: an ISAB block's attentions are rectangular "
                                            "cross-attentions; ASAP compiles square self-attention layers");
    bk_attn_desc d = bki_attn_desc(m, m->B);
    bk_tensor q, k, v, o;
    bki_views(m, m->ba[layer].qkv, m->ba[layer].att, &q, &k, &v, &o);
    return bk_asap_calib_add(calib, &d, &q, &k);
}

const bk_asap_layer *bki_model_asap(const bk_model *m, int layer) { return m->ba[layer].asap; }

bk_status bk_model_attention(bk_model *m, int layer, float *attn)
{
    if (!m || !attn) return bki_fail(BK_ERR_NULL, "bk_model_attention: NULL argument");
    if (layer < 0 || layer >= m->c.depth)
        return bki_fail(BK_ERR_PARAM, "bk_model_attention: layer %d outside [0, %d)", layer, m->c.depth);
    if (m->B < 1) return bki_fail(BK_ERR_PARAM, "bk_model_attention: no forward has run");
    const int64_t T = m->T;
    if (bki_is_isab(&m->c)) { /* the block's first map: the inducing points over the set */
        const int u0 = m->c.depth + layer;
        const bki_cross_shape cs = bki_mab_shape(m, u0);
        const int64_t Nq = cs.Nq, Nk = cs.Nk;
        bk_tensor q, k, v, o, A = {attn, m->c.heads * Nq * Nk, Nq * Nk, Nk, BK_DEVICE_HOST, BK_F32};
        bki_cross_views(m, &m->ba[u0], &cs, &q, &k, &v, &o);
        const bk_attn_desc d = {m->B, m->c.heads, cs.Nq, cs.Nk, m->dh, m->dh, cs.nq, cs.nk};
        return bki_attn_forward(m, (attn_site){u0, 1, 0}, &d, &q, &k, &v, &o, &A, NULL);
    }
    bk_tensor A = {attn, m->c.heads * T * T, T * T, T, BK_DEVICE_HOST, BK_F32};
    /* re-running the operator rewrites att with the same values; the tape
     * of a pending backward is left alone (train = 0) */
    return bki_self_attn_fwd(m, layer, m->B, 0, &A);
}
