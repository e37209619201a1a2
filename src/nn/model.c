/* model.c -- the transformer classifier of the training engine
 * (docs/MODEL.md): configuration, parameter table, planned activations,
 * forward and exact backward over the library's attention operators. */
#include "layers.h"
#include "../ops/op.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* configuration                                                            */
/* ------------------------------------------------------------------------ */
static const char *const INPUT_NAMES[] = {"image", "tokens", "points", NULL};
static const char *const ATTN_NAMES[] = {"softmax", "sinkhorn", "esp", "lot", "asap", "unbalanced", "diff", NULL};
static const char *const POOL_NAMES[] = {"cls", "mean", "max", "otk", NULL};

#define F(field, type) {#field, type, offsetof(bk_model_config, field), NULL, 0}
#define E(field, names) {#field, BKI_F_ENUM, offsetof(bk_model_config, field), names, 0}
static const bki_field MODEL_FIELDS[] = {
    E(input, INPUT_NAMES),        F(channels, BKI_F_INT),    F(image_h, BKI_F_INT),      F(image_w, BKI_F_INT),
    F(patch, BKI_F_INT),          F(vocab, BKI_F_INT),       F(max_len, BKI_F_INT),      F(point_dim, BKI_F_INT),
    F(max_points, BKI_F_INT),     F(dim, BKI_F_INT),         F(depth, BKI_F_INT),        F(heads, BKI_F_INT),
    F(head_dim, BKI_F_INT),       F(mlp_dim, BKI_F_INT),     F(cls, BKI_F_INT),          F(pos_embed, BKI_F_INT),
    F(final_norm, BKI_F_INT),     F(qkv_bias, BKI_F_INT),    E(pool, POOL_NAMES),        F(classes, BKI_F_INT),
    F(dropout, BKI_F_FLOAT),      F(ln_eps, BKI_F_FLOAT),    E(attn, ATTN_NAMES),        F(attn_scale, BKI_F_FLOAT),
    F(sk_iters, BKI_F_INT),       F(sk_eps, BKI_F_FLOAT),    F(sk_rho, BKI_F_FLOAT),     F(esp_soft, BKI_F_INT),
    F(esp_t, BKI_F_FLOAT),
    F(esp_tau, BKI_F_FLOAT),      F(esp_slices, BKI_F_INT),  F(lot_r, BKI_F_INT),        F(lot_iters, BKI_F_INT),
    F(lot_eps, BKI_F_FLOAT),      F(lot_temp, BKI_F_FLOAT),  F(otk_refs, BKI_F_INT),     F(otk_supports, BKI_F_INT),
    F(otk_iters, BKI_F_INT),      F(otk_eps, BKI_F_FLOAT),
};
#undef F
#undef E
#define NFIELDS ((int)(sizeof MODEL_FIELDS / sizeof MODEL_FIELDS[0]))

bk_model_config bk_model_config_default(void)
{
    bk_model_config c;
    memset(&c, 0, sizeof c);
    c.input = BK_INPUT_IMAGE;
    c.channels = 1;
    c.image_h = c.image_w = 28;
    c.patch = 4;
    c.vocab = 256;
    c.max_len = 128;
    c.point_dim = 3;
    c.max_points = 64;
    c.dim = 64;
    c.depth = 2;
    c.heads = 4;
    c.mlp_dim = 128;
    c.cls = c.pos_embed = c.final_norm = 1;
    c.pool = BK_POOL_CLS;
    c.classes = 10;
    c.ln_eps = 1e-5f;
    c.attn = BK_ATTN_SOFTMAX;
    c.sk_iters = 5;
    c.sk_eps = 1.0f;
    c.sk_rho = 10.0f;
    c.esp_soft = 1;
    c.esp_t = 1e-3f;
    c.esp_tau = 1.0f;
    c.lot_r = 8;
    c.lot_iters = 5;
    c.lot_eps = 1.0f;
    c.lot_temp = 1.0f;
    c.otk_refs = 1;
    c.otk_supports = 4;
    c.otk_iters = 20; /* half-steps: 10 iterations */
    c.otk_eps = 0.5f;
    return c;
}

const char *bk_attn_kind_name(bk_attn_kind k)
{
    return k >= BK_ATTN_SOFTMAX && k <= BK_ATTN_DIFF ? ATTN_NAMES[k] : "?";
}

bk_status bk_model_config_set(bk_model_config *c, const char *key, const char *value)
{
    return bki_cfg_set(c, MODEL_FIELDS, NFIELDS, "model config", key, value);
}
bk_status bk_model_config_parse(bk_model_config *c, const char *text)
{
    return bki_cfg_parse(c, MODEL_FIELDS, NFIELDS, "model config", text);
}
size_t bk_model_config_format(const bk_model_config *c, char *buf, size_t cap)
{
    return bki_cfg_format(c, MODEL_FIELDS, NFIELDS, buf, cap);
}

#define NEED(cond, ...)                                                                                            \
    do {                                                                                                           \
        if (!(cond)) return bki_fail(BK_ERR_PARAM, "model config: " __VA_ARGS__);                                  \
    } while (0)

bk_status bk_model_config_check(const bk_model_config *c)
{
    if (!c) return bki_fail(BK_ERR_NULL, "model config: NULL");
    NEED(c->input >= BK_INPUT_IMAGE && c->input <= BK_INPUT_POINTS, "unknown input kind %d", (int)c->input);
    NEED(c->attn >= BK_ATTN_SOFTMAX && c->attn <= BK_ATTN_DIFF, "unknown attention type %d", (int)c->attn);
    NEED(c->pool >= BK_POOL_CLS && c->pool <= BK_POOL_OTK, "unknown pooling %d", (int)c->pool);
    if (c->input == BK_INPUT_IMAGE) {
        NEED(c->channels >= 1 && c->image_h >= 1 && c->image_w >= 1, "image sizes must be >= 1 (channels=%d, %dx%d)",
             c->channels, c->image_h, c->image_w);
        NEED(c->patch >= 1, "patch must be >= 1 (got %d)", c->patch);
        NEED(c->image_h % c->patch == 0 && c->image_w % c->patch == 0,
             "patch size %d does not divide the %dx%d image", c->patch, c->image_h, c->image_w);
    } else if (c->input == BK_INPUT_TOKENS) {
        NEED(c->vocab >= 1 && c->max_len >= 1, "vocab and max_len must be >= 1 (got %d, %d)", c->vocab, c->max_len);
    } else {
        NEED(c->point_dim >= 1 && c->max_points >= 1, "point_dim and max_points must be >= 1 (got %d, %d)",
             c->point_dim, c->max_points);
    }
    NEED(c->dim >= 1 && c->depth >= 0 && c->depth <= 4096 && c->heads >= 1, "dim >= 1, depth in [0, 4096], heads >= 1 required");
    NEED(c->head_dim > 0 || c->dim % c->heads == 0, "heads (%d) do not divide dim (%d); set head_dim explicitly",
         c->heads, c->dim);
    NEED(c->head_dim >= 0 && c->mlp_dim >= 0, "head_dim and mlp_dim must be >= 0");
    NEED((c->cls | c->pos_embed | c->final_norm | c->qkv_bias | c->esp_soft) >= 0 &&
             c->cls <= 1 && c->pos_embed <= 1 && c->final_norm <= 1 && c->qkv_bias <= 1 && c->esp_soft <= 1,
         "cls, pos_embed, final_norm, qkv_bias and esp_soft are 0/1 switches");
    NEED(c->classes >= 2, "classes must be >= 2 (got %d)", c->classes);
    {
        /* sizes whose products are ints in the model: bounded (a config is
         * also untrusted input, e.g. from a checkpoint's metadata) */
        const int64_t L = 1 << 24, dh = c->head_dim > 0 ? c->head_dim : c->dim / c->heads;
        const int64_t np = c->input == BK_INPUT_IMAGE ? (int64_t)(c->image_h / c->patch) * (c->image_w / c->patch)
                           : c->input == BK_INPUT_TOKENS ? c->max_len
                                                         : c->max_points;
        const int64_t feat = c->input == BK_INPUT_IMAGE ? (int64_t)c->patch * c->patch * c->channels : c->point_dim;
        NEED(c->dim <= L && c->heads <= L && dh * c->heads <= L && c->mlp_dim <= L && c->classes <= L && np <= L &&
                 feat <= L && (int64_t)c->vocab * c->dim <= ((int64_t)1 << 34) && c->channels <= L &&
                 (int64_t)c->otk_refs * c->otk_supports * c->dim <= L && c->lot_r <= L && c->esp_slices <= L,
             "model sizes too large (each size and product of sizes must stay below 2^24)");
    }
    NEED(c->dropout >= 0.0f && c->dropout < 1.0f, "dropout must be in [0, 1) (got %g)", (double)c->dropout);
    NEED(c->ln_eps > 0.0f, "ln_eps must be > 0");
    NEED(c->attn_scale >= 0.0f, "attn_scale must be >= 0 (0 = 1/sqrt(head_dim))");
    NEED(c->pool != BK_POOL_CLS || c->cls, "pool=cls needs cls=1");
    if (c->attn == BK_ATTN_SINKHORN || c->attn == BK_ATTN_UNBALANCED)
        NEED(c->sk_iters >= 1 && c->sk_iters <= (1 << 20) && c->sk_eps > 0.0f,
             "Sinkhorn needs sk_iters in [1, 2^20], sk_eps > 0");
    if (c->attn == BK_ATTN_UNBALANCED)
        NEED(c->sk_rho > 0.0f, "unbalanced Sinkhorn needs sk_rho > 0 (got %g)", (double)c->sk_rho);
    NEED(c->lot_r >= 0 && c->lot_iters >= 0 && c->lot_iters <= (1 << 20) && c->otk_refs >= 0 && c->otk_supports >= 0 &&
             c->otk_iters >= 0 && c->otk_iters <= (1 << 20) && c->esp_slices >= 0,
         "LOT/OTK/ESP sizes must be >= 0 and iteration counts <= 2^20");
    if (c->attn == BK_ATTN_ESP)
        NEED(c->esp_t > 0.0f && c->esp_tau >= 0.0f && c->esp_slices >= 0, "ESP needs esp_t > 0, esp_tau >= 0, esp_slices >= 0");
    if (c->attn == BK_ATTN_LOT)
        NEED(c->lot_r >= 1 && c->lot_iters >= 1 && c->lot_eps > 0.0f && c->lot_temp > 0.0f,
             "LOT needs lot_r, lot_iters >= 1 and lot_eps, lot_temp > 0");
    if (c->attn == BK_ATTN_DIFF) {
        const int dh = c->head_dim > 0 ? c->head_dim : c->dim / c->heads;
        NEED(dh % 2 == 0,
             "attn=diff needs an even head dimension (the two halves of q and k give the two maps); head_dim is %d "
             "(set head_dim, or dim and heads, so that it is even)",
             dh);
    }
    if (c->pool == BK_POOL_OTK)
        NEED(c->otk_refs >= 1 && c->otk_supports >= 1 && c->otk_iters >= 2 && c->otk_iters % 2 == 0 &&
                 c->otk_eps > 0.0f,
             "OTK pooling needs otk_refs, otk_supports >= 1, otk_iters even and >= 2 (half-steps: 2 L for L "
             "iterations) and otk_eps > 0");
    return BK_OK;
}

/* ------------------------------------------------------------------------ */
/* the model                                                                */
/* ------------------------------------------------------------------------ */
#define MAXP 256

typedef struct {
    int64_t ln1_w, ln1_b, qkv_w, qkv_b, lot_z, lot_t, dl_q1, dl_k1, dl_q2, dl_k2, proj_w, proj_b, ln2_w, ln2_b,
        fc1_w, fc1_b, fc2_w, fc2_b;
} blk_off;

typedef struct {
    float *mid, *out;                 /* residual stream after attention / block */
    float *ln1, *mu1, *rs1, *qkv, *att;
    float *ln2, *mu2, *rs2, *f1, *g1;
    void *tape;
    size_t tape_cap;
    float *esp_theta;
    bk_asap_layer *asap;
    float *draw, *drs, *lam;          /* diff: the operator's output [R, I], its
                                         per-head inverse RMS [R, H], lambda [H] */
} blk_act;

struct bk_model {
    bk_model_config c;
    uint64_t seed, fwd_count, cur_count;
    int max_batch, np, in_feat, T, I, dh, F;
    int nparam;
    bki_param tab[MAXP];
    int64_t P;
    float *w, *gw;
    /* parameter offsets (-1 when absent) */
    int64_t e_w, e_b, e_w2, e_b2, cls_o, pos_o, nrm_w, nrm_b, otk_z, head_w, head_b;
    blk_off *bo;
    /* activations */
    float *emb_in, *emb_h, *emb_g, *emb_o;  /* [B*np, in_feat], points hidden, gelu, embed out */
    float *x0;                               /* [R, D] stream entering block 0   */
    blk_act *ba;
    float *fin, *fmu, *frs;                  /* final norm                        */
    float *pooled, *logits, *probs;
    int32_t *argmax, *nb, *labels, *tokens;
    void *otk_tape;
    size_t otk_tape_cap;
    /* backward scratch */
    float *dX, *dT, *dA, *dq, *dk, *dv, *dM, *dN, *dpool, *dlog, *dZtmp, *dthtmp, *dO, *dlam;
    void *ws;
    size_t ws_cap;
    int B, have_tape;
    float ls;
};

static int64_t add_param(bk_model *m, const char *name, int ndim, int64_t s0, int64_t s1, int64_t s2, int decay)
{
    bki_param *p = &m->tab[m->nparam++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->shape[0] = s0;
    p->shape[1] = s1;
    p->shape[2] = s2;
    p->count = s0 * (ndim > 1 ? s1 : 1) * (ndim > 2 ? s2 : 1);
    p->off = m->P;
    p->decay = decay;
    m->P += p->count;
    return p->off;
}

static void build_table(bk_model *m)
{
    const bk_model_config *c = &m->c;
    const int D = c->dim, I = m->I;
    char nm[64];
    m->e_w = m->e_b = m->e_w2 = m->e_b2 = m->cls_o = m->pos_o = m->nrm_w = m->nrm_b = m->otk_z = -1;
    if (c->input == BK_INPUT_IMAGE) {
        m->e_w = add_param(m, "embed.proj.weight", 2, D, m->in_feat, 0, 1);
        m->e_b = add_param(m, "embed.proj.bias", 1, D, 0, 0, 0);
    } else if (c->input == BK_INPUT_TOKENS) {
        m->e_w = add_param(m, "embed.table", 2, c->vocab, D, 0, 1);
    } else {
        m->e_w = add_param(m, "embed.fc1.weight", 2, D, m->in_feat, 0, 1);
        m->e_b = add_param(m, "embed.fc1.bias", 1, D, 0, 0, 0);
        m->e_w2 = add_param(m, "embed.fc2.weight", 2, D, D, 0, 1);
        m->e_b2 = add_param(m, "embed.fc2.bias", 1, D, 0, 0, 0);
    }
    if (c->cls) m->cls_o = add_param(m, "cls", 1, D, 0, 0, 0);
    if (c->pos_embed) m->pos_o = add_param(m, "pos", 2, m->T, D, 0, 0);
    for (int l = 0; l < c->depth; l++) {
        blk_off *o = &m->bo[l];
        memset(o, 0xff, sizeof *o); /* all -1 */
#define P(field, suffix, nd, a, b2, c2, dec)                                                                       \
    do {                                                                                                           \
        snprintf(nm, sizeof nm, "blocks.%d.%s", l, suffix);                                                        \
        o->field = add_param(m, nm, nd, a, b2, c2, dec);                                                           \
    } while (0)
        P(ln1_w, "ln1.weight", 1, D, 0, 0, 0);
        P(ln1_b, "ln1.bias", 1, D, 0, 0, 0);
        P(qkv_w, "attn.qkv.weight", 2, 3 * I, D, 0, 1);
        if (c->qkv_bias) P(qkv_b, "attn.qkv.bias", 1, 3 * I, 0, 0, 0);
        if (c->attn == BK_ATTN_LOT) {
            P(lot_z, "attn.lot_z", 3, c->heads, c->lot_r, m->dh, 0);
            P(lot_t, "attn.lot_theta", 2, c->heads, c->lot_r, 0, 0);
        }
        if (c->attn == BK_ATTN_DIFF) {
            P(dl_q1, "attn.diff_lq1", 1, m->dh / 2, 0, 0, 0);
            P(dl_k1, "attn.diff_lk1", 1, m->dh / 2, 0, 0, 0);
            P(dl_q2, "attn.diff_lq2", 1, m->dh / 2, 0, 0, 0);
            P(dl_k2, "attn.diff_lk2", 1, m->dh / 2, 0, 0, 0);
        }
        P(proj_w, "attn.proj.weight", 2, D, I, 0, 1);
        P(proj_b, "attn.proj.bias", 1, D, 0, 0, 0);
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
    if (c->final_norm) {
        m->nrm_w = add_param(m, "norm.weight", 1, D, 0, 0, 0);
        m->nrm_b = add_param(m, "norm.bias", 1, D, 0, 0, 0);
    }
    if (c->pool == BK_POOL_OTK) m->otk_z = add_param(m, "pool.otk_z", 3, c->otk_refs, c->otk_supports, D, 0);
    m->head_w = add_param(m, "head.weight", 2, c->classes, m->F, 0, 1);
    m->head_b = add_param(m, "head.bias", 1, c->classes, 0, 0, 0);
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
        if (strstr(n, ".ln1.") || strstr(n, ".ln2.") || strncmp(n, "norm.", 5) == 0) {
            for (int64_t j = 0; j < p->count; j++) w[j] = ENDS(".weight") ? 1.0f : 0.0f;
        } else if (strcmp(n, "cls") == 0 || strcmp(n, "pos") == 0 || strcmp(n, "embed.table") == 0) {
            for (int64_t j = 0; j < p->count; j++) w[j] = (float)(0.02 * gauss(&s));
        } else if (ENDS("lot_z")) {
            for (int64_t j = 0; j < p->count; j++) w[j] = (float)gauss(&s);
        } else if (ENDS("lot_theta")) {
            for (int64_t j = 0; j < p->count; j++) w[j] = 0.0f;
        } else if (ENDS("diff_lq1") || ENDS("diff_lk1") || ENDS("diff_lq2") || ENDS("diff_lk2")) {
            for (int64_t j = 0; j < p->count; j++) w[j] = (float)(0.1 * gauss(&s)); /* the paper's N(0, 0.1^2) */
        } else if (strcmp(n, "pool.otk_z") == 0) {
            const double sd = 1.0 / sqrt((double)m->c.dim);
            for (int64_t j = 0; j < p->count; j++) w[j] = (float)(sd * gauss(&s));
        } else {
            /* Linear weight [out, in] or bias [out]: U(-1/sqrt(in), 1/sqrt(in)) with in from the weight */
            int64_t fan_in = p->ndim == 2 ? p->shape[1] : (i > 0 ? m->tab[i - 1].shape[1] : 1);
            const double bound = 1.0 / sqrt((double)(fan_in > 0 ? fan_in : 1));
            for (int64_t j = 0; j < p->count; j++) w[j] = (float)((2.0 * unif(&s) - 1.0) * bound);
        }
#undef ENDS
    }
}

/* operator workspace: grown only when a larger size is asked for (first
 * use, or a thread count raised after creation) */
static bk_status ensure_ws(bk_model *m, size_t need)
{
    if (need <= m->ws_cap) return BK_OK;
    void *p = realloc(m->ws, need);
    if (!p) return bki_fail(BK_ERR_NOMEM, "model: workspace of %zu bytes", need);
    m->ws = p;
    m->ws_cap = need;
    return BK_OK;
}

static bk_attn_desc attn_desc(const bk_model *m, int B)
{
    bk_attn_desc d = {B, m->c.heads, m->T, m->T, m->dh, m->dh, m->nb, m->nb};
    return d;
}

static bk_otk_desc otk_desc(const bk_model *m, int B)
{
    bk_otk_desc d = {B, m->T, m->c.dim, m->c.otk_refs, m->c.otk_supports, m->c.dim, m->nb};
    return d;
}

static bk_sinkhorn_config sk_params(const bk_model *m)
{
    bk_sinkhorn_config p = bk_sinkhorn_config_default();
    p.scale = m->c.attn_scale;
    p.eps = m->c.sk_eps;
    p.iters = m->c.sk_iters;
    return p;
}

static bk_esp_config esp_params(const bk_model *m, int l)
{
    bk_esp_config p = bk_esp_config_default();
    p.sort = m->c.esp_soft ? BK_ESP_SOFT : BK_ESP_HARD;
    p.t = m->c.esp_t;
    p.tau = m->c.esp_tau;
    p.scale = m->c.attn_scale;
    p.L = m->c.esp_slices;
    p.theta = m->c.esp_slices > 0 ? m->ba[l].esp_theta : NULL;
    p.seed = 1000u + (uint64_t)l;
    return p;
}

static bk_lot_config lot_params(const bk_model *m, int l)
{
    bk_lot_config p = bk_lot_config_default();
    p.r = m->c.lot_r;
    p.Z = m->w + m->bo[l].lot_z;
    p.theta = m->w + m->bo[l].lot_t;
    p.temp = m->c.lot_temp;
    p.iters = m->c.lot_iters;
    p.eps = m->c.lot_eps;
    p.scale = m->c.attn_scale;
    return p;
}

static bk_otk_config otk_params(const bk_model *m)
{
    bk_otk_config p = bk_otk_config_default();
    p.eps = m->c.otk_eps;
    p.iters = m->c.otk_iters;
    return p;
}

/* ---- the attention operators, through the registry ------------------------
 * A model's attention kind names a registered operator (src/ops/registry.c)
 * and says how the model's configuration fills that operator's parameter
 * struct; everything else (workspace, tape, forward, backward) is the
 * operator framework's generic call. A kind with parameters learned by the
 * model (LOT's pivots) also says where their gradients go. */
typedef union {
    bk_softmax_config softmax;
    bk_sinkhorn_config sinkhorn;
    bk_unbalanced_config unbalanced;
    bk_esp_config esp;
    bk_lot_config lot;
    bk_asap_forward_config asap;
    bk_diff_config diff;
} attn_par;

static void softmax_fill(const bk_model *m, int l, attn_par *p)
{
    (void)l;
    p->softmax = bk_softmax_config_default();
    p->softmax.scale = m->c.attn_scale;
}
static void sinkhorn_fill(const bk_model *m, int l, attn_par *p)
{
    (void)l;
    p->sinkhorn = sk_params(m);
}
static void unbalanced_fill(const bk_model *m, int l, attn_par *p)
{
    (void)l;
    p->unbalanced = bk_unbalanced_config_default();
    p->unbalanced.scale = m->c.attn_scale;
    p->unbalanced.eps = m->c.sk_eps;
    p->unbalanced.iters = m->c.sk_iters;
    p->unbalanced.rho = m->c.sk_rho;
}
static void esp_fill(const bk_model *m, int l, attn_par *p) { p->esp = esp_params(m, l); }
static void lot_fill(const bk_model *m, int l, attn_par *p) { p->lot = lot_params(m, l); }
static void asap_fill(const bk_model *m, int l, attn_par *p)
{
    p->asap.layer = m->ba[l].asap;
    p->asap.variant = BK_ASAP_AUTO;
}

/* diff: lambda is the block's [H] array (diff_set_lambda fills it before
 * each call; a size query reads no array) */
static void diff_fill(const bk_model *m, int l, attn_par *p)
{
    p->diff = bk_diff_config_default();
    p->diff.scale = m->c.attn_scale;
    p->diff.lambda = m->ba[l].lam;
}

/* The layer's own work around the operator, for the kinds that learn
 * parameters of the operator (LOT's pivots, diff's lambda vectors) or
 * post-process its output (diff's per-head norm); NULL hooks do nothing.
 * fwd_pre may redirect the operator's output, bwd_pre its upstream
 * gradient; pgrads gives the operator's parameter-gradient outputs (lg: the
 * storage LOT's take), bwd_post adds them into the model's gradients. */
typedef struct {
    void (*fwd_pre)(bk_model *m, int l, bk_tensor *o);
    void (*fwd_post)(bk_model *m, int l, int B);
    void (*bwd_pre)(bk_model *m, int l, int B, bk_tensor *dout);
    void *(*pgrads)(bk_model *m, bki_lot_grads *lg);
    void (*bwd_post)(bk_model *m, int l);
} attn_hooks;

typedef struct {
    const char *op;                                     /* registry name */
    void (*fill)(const bk_model *m, int l, attn_par *p); /* config -> params */
    const attn_hooks *hooks;                            /* NULL: the operator alone */
} attn_kind;

static void *lot_pgrads(bk_model *m, bki_lot_grads *lg);
static void lot_bwd_post(bk_model *m, int l);
static void diff_fwd_pre(bk_model *m, int l, bk_tensor *o);
static void diff_fwd_post(bk_model *m, int l, int B);
static void diff_bwd_pre(bk_model *m, int l, int B, bk_tensor *dout);
static void *diff_pgrads(bk_model *m, bki_lot_grads *lg);
static void diff_lambda_bwd(bk_model *m, int l);
static const attn_hooks LOT_HOOKS = {NULL, NULL, NULL, lot_pgrads, lot_bwd_post};
static const attn_hooks DIFF_HOOKS = {diff_fwd_pre, diff_fwd_post, diff_bwd_pre, diff_pgrads, diff_lambda_bwd};

/* indexed by bk_attn_kind (ATTN_NAMES above lists the same kinds) */
static const attn_kind ATTN_KINDS[] = {
    [BK_ATTN_SOFTMAX] = {"softmax", softmax_fill, NULL},   [BK_ATTN_SINKHORN] = {"sinkhorn", sinkhorn_fill, NULL},
    [BK_ATTN_ESP] = {"esp", esp_fill, NULL},               [BK_ATTN_LOT] = {"lot", lot_fill, &LOT_HOOKS},
    [BK_ATTN_ASAP] = {"asap", asap_fill, NULL},            [BK_ATTN_UNBALANCED] = {"unbalanced", unbalanced_fill, NULL},
    [BK_ATTN_DIFF] = {"diff", diff_fill, &DIFF_HOOKS},
};

/* a generic call of layer l's operator (par: its storage) */
static bki_call attn_call(const bk_model *m, const bk_attn_desc *d, int l, attn_par *par)
{
    const attn_kind *k = &ATTN_KINDS[m->c.attn];
    bki_call c;
    memset(&c, 0, sizeof c);
    c.op = bki_op_find(k->op);
    c.d = d;
    k->fill(m, l, par);
    c.par = par;
    return c;
}

static size_t attn_ws(const bk_model *m, const bk_attn_desc *d, int l)
{
    attn_par par;
    bki_call c = attn_call(m, d, l, &par);
    return bki_op_workspace_size(&c);
}

/* a tape for training (operators without a backward need none) */
static size_t attn_tape(const bk_model *m, const bk_attn_desc *d, int l)
{
    attn_par par;
    bki_call c = attn_call(m, d, l, &par);
    return c.op->backward ? bki_op_tape_size_query(&c) : 0;
}

void bk_model_free(bk_model *m)
{
    if (!m) return;
    free(m->w);
    free(m->gw);
    if (m->ba)
        for (int l = 0; l < m->c.depth; l++) {
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
            free(a->esp_theta);
            free(a->draw);
            free(a->drs);
            free(a->lam);
            if (a->asap) {
                bk_asap_layer_free(a->asap);
                free(a->asap);
            }
        }
    free(m->ba);
    free(m->bo);
    void *bufs[] = {m->emb_in, m->emb_h, m->emb_g, m->emb_o, m->x0, m->fin, m->fmu, m->frs, m->pooled,
                    m->logits, m->probs, m->argmax, m->nb, m->labels, m->tokens, m->otk_tape, m->dX, m->dT,
                    m->dA, m->dq, m->dk, m->dv, m->dM, m->dN, m->dpool, m->dlog, m->dZtmp, m->dthtmp, m->dO, m->dlam, m->ws};
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
    void *p = calloc(n ? n : 1, size);
    if (!p) z->bad = 1;
    return p;
}

static float *falloc(size_t n, sizer *z) { return zalloc(z, n, sizeof(float)); }

static size_t phys_memory(void)
{
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && size > 0) return (size_t)pages * (size_t)size;
#endif
    return 0;
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
    m->T = m->np + c->cls;
    m->F = c->pool == BK_POOL_OTK ? c->otk_supports * c->otk_refs * c->dim : c->dim;
    const int64_t R = (int64_t)max_batch * m->T, D = c->dim, I = m->I, M = c->mlp_dim;
    /* (bounds that keep every size below in range; bk_model_memory and the
     * physical-memory check refuse what is merely too large for the machine) */
    if (R * (3 * I > D ? 3 * I : D) > ((int64_t)1 << 40) ||
        (double)max_batch * c->heads * (double)m->T * (double)m->T * 8.0 > 0x1p60)
        return bk_model_free(m), bki_fail(BK_ERR_SHAPE, "bk_model_create: activations too large");
    m->bo = calloc((size_t)(c->depth ? c->depth : 1), sizeof *m->bo);
    m->ba = calloc((size_t)(c->depth ? c->depth : 1), sizeof *m->ba);
    if (!m->bo || !m->ba) return bk_model_free(m), bki_fail(BK_ERR_NOMEM, "bk_model_create: out of memory");
    const int per_block = c->attn == BK_ATTN_DIFF ? 16 : 14; /* (diff: four lambda vectors for LOT's two) */
    int tensors = 8 + per_block * c->depth;
    if (tensors > MAXP) {
        const int depth = c->depth; /* (c points into m) */
        bk_model_free(m);
        return bki_fail(BK_ERR_PARAM, "bk_model_create: depth %d too large (at most %d)", depth, (MAXP - 8) / per_block);
    }
    build_table(m);
    sizer z = {0, 0, measure};
    m->w = falloc((size_t)m->P, &z);
    m->gw = falloc((size_t)m->P, &z);
    if (z.bad) {
        const long long P = (long long)m->P;
        bk_model_free(m);
        return bki_fail(BK_ERR_NOMEM, "bk_model_create: out of memory for %lld parameters", P);
    }
    if (!measure) init_params(m);

    const size_t Bn = (size_t)max_batch * (size_t)m->np;
    if (c->input != BK_INPUT_TOKENS) m->emb_in = falloc(Bn * (size_t)m->in_feat, &z);
    if (c->input == BK_INPUT_POINTS) {
        m->emb_h = falloc(Bn * (size_t)D, &z);
        m->emb_g = falloc(Bn * (size_t)D, &z);
    }
    if (c->input == BK_INPUT_TOKENS) m->tokens = zalloc(&z, Bn, sizeof(int32_t));
    m->emb_o = falloc(Bn * (size_t)D, &z);
    m->x0 = falloc((size_t)(R * D), &z);
    bk_attn_desc ad = {max_batch, c->heads, m->T, m->T, m->dh, m->dh, NULL, NULL};
    size_t wsz = 0;
    for (int l = 0; l < c->depth; l++) {
        blk_act *a = &m->ba[l];
        a->mid = falloc((size_t)(R * D), &z);
        a->out = M > 0 ? falloc((size_t)(R * D), &z) : a->mid;
        a->ln1 = falloc((size_t)(R * D), &z);
        a->mu1 = falloc((size_t)R, &z);
        a->rs1 = falloc((size_t)R, &z);
        a->qkv = falloc((size_t)(R * 3 * I), &z);
        a->att = falloc((size_t)(R * I), &z);
        if (M > 0) {
            a->ln2 = falloc((size_t)(R * D), &z);
            a->mu2 = falloc((size_t)R, &z);
            a->rs2 = falloc((size_t)R, &z);
            a->f1 = falloc((size_t)(R * M), &z);
            a->g1 = falloc((size_t)(R * M), &z);
        }
        if (c->attn == BK_ATTN_ESP && c->esp_slices > 0) {
            a->esp_theta = falloc((size_t)c->esp_slices * (size_t)m->dh, &z);
            if (!z.bad && !measure) {
                bk_esp_config ep = esp_params(m, l);
                ep.theta = NULL;
                bk_esp_slices(&ep, m->dh, a->esp_theta);
            }
        }
        if (c->attn == BK_ATTN_DIFF) {
            a->draw = falloc((size_t)(R * I), &z);
            a->drs = falloc((size_t)R * (size_t)c->heads, &z);
            a->lam = falloc((size_t)c->heads, &z);
        }
        if (z.bad) break;
        a->tape_cap = attn_tape(m, &ad, l);
        if (a->tape_cap) a->tape = zalloc(&z, a->tape_cap, 1);
        size_t w1 = attn_ws(m, &ad, l);
        if (w1 > wsz) wsz = w1;
    }
    m->fin = falloc((size_t)(R * D), &z);
    m->fmu = falloc((size_t)R, &z);
    m->frs = falloc((size_t)R, &z);
    m->pooled = falloc((size_t)max_batch * (size_t)m->F, &z);
    m->logits = falloc((size_t)max_batch * (size_t)c->classes, &z);
    m->probs = falloc((size_t)max_batch * (size_t)c->classes, &z);
    m->argmax = zalloc(&z, (size_t)max_batch * (size_t)D, sizeof(int32_t));
    m->nb = zalloc(&z, (size_t)max_batch, sizeof(int32_t));
    m->labels = zalloc(&z, (size_t)max_batch, sizeof(int32_t));
    if (c->pool == BK_POOL_OTK) {
        bk_otk_desc od = {max_batch, m->T, c->dim, c->otk_refs, c->otk_supports, c->dim, NULL};
        bk_otk_config op = otk_params(m);
        m->otk_tape_cap = bk_otk_tape_size(&od, &op);
        m->otk_tape = zalloc(&z, m->otk_tape_cap, 1);
        size_t w1 = bk_otk_workspace_size(&od, &op);
        if (w1 > wsz) wsz = w1;
    }
    m->dX = falloc((size_t)(R * D), &z);
    m->dT = falloc((size_t)(R * D), &z);
    m->dN = falloc((size_t)(R * D), &z);
    m->dA = falloc((size_t)(R * I), &z);
    m->dq = falloc((size_t)(R * I), &z);
    m->dk = falloc((size_t)(R * I), &z);
    m->dv = falloc((size_t)(R * I), &z);
    m->dM = falloc((size_t)(R * (M > D ? M : D)), &z);
    m->dpool = falloc((size_t)max_batch * (size_t)m->F, &z);
    m->dlog = falloc((size_t)max_batch * (size_t)c->classes, &z);
    const size_t ztmp = (size_t)c->heads * (size_t)c->lot_r * (size_t)m->dh;
    const size_t otmp = (size_t)c->otk_refs * (size_t)c->otk_supports * (size_t)D;
    m->dZtmp = falloc(ztmp > otmp ? ztmp : otmp, &z);
    m->dthtmp = falloc((size_t)c->heads * (size_t)c->lot_r, &z);
    if (c->attn == BK_ATTN_DIFF) {
        m->dO = falloc((size_t)(R * I), &z);
        m->dlam = falloc((size_t)c->heads, &z);
    }
    if (z.bad) return bk_model_free(m), bki_fail(BK_ERR_NOMEM, "bk_model_create: out of memory for activations");
    if (measure) {
        *bytes = wsz > SIZE_MAX - z.bytes ? SIZE_MAX : z.bytes + wsz;
        *out = m;
        return BK_OK;
    }
    if ((st = ensure_ws(m, wsz))) return bk_model_free(m), st;
    *out = m;
    return BK_OK;
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
int64_t bki_model_sample_size(const bk_model *m)
{
    return m->c.input == BK_INPUT_IMAGE ? (int64_t)m->c.channels * m->c.image_h * m->c.image_w
                                        : (int64_t)m->np * (m->c.input == BK_INPUT_TOKENS ? 1 : m->in_feat);
}
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

void bk_model_zero_grad(bk_model *m)
{
    if (m) memset(m->gw, 0, sizeof(float) * (size_t)m->P);
}

bk_status bk_model_set_asap(bk_model *m, int layer, const bk_asap_layer *asap)
{
    if (!m || !asap) return bki_fail(BK_ERR_NULL, "bk_model_set_asap: NULL argument");
    if (m->c.attn != BK_ATTN_ASAP) return bki_fail(BK_ERR_PARAM, "bk_model_set_asap: the model's attention is not asap");
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
    size_t need = attn_ws(m, &(bk_attn_desc){m->max_batch, m->c.heads, m->T, m->T, m->dh, m->dh, NULL, NULL}, layer);
    return ensure_ws(m, need);
}

/* ------------------------------------------------------------------------ */
/* changing the attention of a model: in place, or swapped into a new one   */
/* ------------------------------------------------------------------------ */
/* the attention keys: what a swap may change (the rest of the configuration
 * fixes the parameter table of everything but the attention) */
static const char *const SWAP_KEYS[] = {"attn",    "attn_scale", "sk_iters", "sk_eps",    "sk_rho",
                                        "esp_soft", "esp_t",     "esp_tau",  "esp_slices", "lot_r",
                                        "lot_iters", "lot_eps",  "lot_temp", NULL};
/* the attention keys that keep the parameter table and the fixed ESP slices:
 * what bk_model_set_attn_config may change in place */
static const char *const INPLACE_KEYS[] = {"attn_scale", "sk_iters", "sk_eps",   "sk_rho",  "esp_soft",
                                           "esp_t",      "esp_tau",  "lot_iters", "lot_eps", "lot_temp", NULL};

static int key_in(const char *key, size_t n, const char *const *list)
{
    for (int i = 0; list[i]; i++)
        if (strlen(list[i]) == n && !strncmp(list[i], key, n)) return 1;
    return 0;
}

/* The first key (in the text form's order) in which a and b differ and that
 * is not in allowed, copied into key; 0 when there is none. */
static int config_diff(const bk_model_config *a, const bk_model_config *b, const char *const *allowed, char *key,
                       size_t cap)
{
    char ta[4096], tb[4096];
    bk_model_config_format(a, ta, sizeof ta);
    bk_model_config_format(b, tb, sizeof tb);
    /* both texts list the same keys in the same order, one per line */
    for (const char *p = ta, *q = tb; *p && *q;) {
        const size_t lp = strcspn(p, "\n"), lq = strcspn(q, "\n"), k = strcspn(p, "=");
        if ((lp != lq || strncmp(p, q, lp)) && !key_in(p, k, allowed)) {
            snprintf(key, cap, "%.*s", (int)k, p);
            return 1;
        }
        p += lp + (p[lp] == '\n');
        q += lq + (q[lq] == '\n');
    }
    return 0;
}

bk_status bk_model_set_attn_config(bk_model *m, const bk_model_config *c)
{
    if (!m || !c) return bki_fail(BK_ERR_NULL, "bk_model_set_attn_config: NULL argument");
    bk_status st = bk_model_config_check(c);
    if (st) return st;
    char key[64];
    if (config_diff(&m->c, c, INPLACE_KEYS, key, sizeof key))
        return bki_fail(BK_ERR_PARAM,
                        "bk_model_set_attn_config: %s differs; in place only attn_scale, sk_*, esp_soft, esp_t, esp_tau "
                        "and lot_iters/lot_eps/lot_temp may change (bk_model_swap changes the attention kind)",
                        key);
    /* the tapes follow the new parameters (grown, never shrunk); the
     * workspace grows on use (ensure_ws) */
    const bk_model_config old = m->c;
    m->c = *c;
    bk_attn_desc ad = {m->max_batch, c->heads, m->T, m->T, m->dh, m->dh, NULL, NULL};
    for (int l = 0; l < c->depth; l++) {
        blk_act *a = &m->ba[l];
        const size_t need = attn_tape(m, &ad, l);
        if (need <= a->tape_cap) continue;
        void *t = calloc(1, need);
        if (!t) {
            m->c = old;
            return bki_fail(BK_ERR_NOMEM, "bk_model_set_attn_config: out of memory for a %zu-byte tape", need);
        }
        free(a->tape);
        a->tape = t;
        a->tape_cap = need;
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
    if (target->attn == BK_ATTN_ASAP)
        return bki_fail(BK_ERR_PARAM, "bk_model_swap: ASAP layers are compiled from a Sinkhorn model's own attention "
                                      "on calibration inputs (bk_asap_compile, `birkhoff model swap --attn asap`)");
    char key[64];
    if (config_diff(&src->c, target, SWAP_KEYS, key, sizeof key))
        return bki_fail(BK_ERR_PARAM,
                        "bk_model_swap: %s differs; a swap changes the attention only (attn, attn_scale, sk_*, esp_*, "
                        "lot_*)",
                        key);
    if (src->c.attn == BK_ATTN_LOT && target->attn == BK_ATTN_LOT && src->c.lot_r != target->lot_r)
        return bki_fail(BK_ERR_PARAM, "bk_model_swap: lot_r %d -> %d: a LOT model's pivots are trained weights of "
                                      "lot_r rows; their count cannot change",
                        src->c.lot_r, target->lot_r);
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
            if (q->count != p->count) { /* (no shared tensor changes shape: lot_r is checked above) */
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

/* ------------------------------------------------------------------------ */
/* forward                                                                  */
/* ------------------------------------------------------------------------ */
static bk_status check_batch(const bk_model *m, const bk_batch *b, int need_labels)
{
    const bk_model_config *c = &m->c;
    if (!b) return bki_fail(BK_ERR_NULL, "model: NULL batch");
    if (b->B < 1 || b->B > m->max_batch)
        return bki_fail(BK_ERR_SHAPE, "model: batch of %d outside [1, max_batch = %d]", b->B, m->max_batch);
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

/* x0 = [cls;] embed(input) [+ pos], dropout, padded rows zero */
static void embed_fwd(bk_model *m, const bk_batch *bt, int train)
{
    const bk_model_config *c = &m->c;
    const int B = bt->B, np = m->np, T = m->T, D = c->dim, nt = bki_threads();
    const size_t Bn = (size_t)B * (size_t)np;
    if (c->input == BK_INPUT_IMAGE) {
        const int P = c->patch, gw = c->image_w / P, C = c->channels, Hh = c->image_h, Ww = c->image_w;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
#pragma omp for schedule(static)
            for (int64_t r = 0; r < (int64_t)Bn; r++) {
                const int b = (int)(r / np), pi = (int)(r % np), py = pi / gw, px = pi % gw;
                float *o = m->emb_in + (size_t)r * (size_t)m->in_feat;
                const float *img = bt->x + (size_t)b * C * Hh * Ww;
                for (int p1 = 0; p1 < P; p1++)
                    for (int p2 = 0; p2 < P; p2++)
                        for (int ch = 0; ch < C; ch++)
                            *o++ = img[((size_t)ch * Hh + (size_t)(py * P + p1)) * Ww + (size_t)(px * P + p2)];
            }
    }
        bki_linear_fwd((int)Bn, m->in_feat, D, m->emb_in, m->in_feat, m->w + m->e_w, m->w + m->e_b, m->emb_o, D);
    } else if (c->input == BK_INPUT_TOKENS) {
        memcpy(m->tokens, bt->tokens, sizeof(int32_t) * Bn);
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
#pragma omp for schedule(static)
            for (int64_t r = 0; r < (int64_t)Bn; r++)
                memcpy(m->emb_o + (size_t)r * D, m->w + m->e_w + (size_t)bt->tokens[r] * D, sizeof(float) * (size_t)D);
    }
    } else {
        const int pd = m->in_feat;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
#pragma omp for schedule(static)
            for (int64_t r = 0; r < (int64_t)Bn; r++) {
                const int b = (int)(r / np), i = (int)(r % np);
                const int valid = bt->len ? bt->len[b] : np;
                if (i < valid)
                    memcpy(m->emb_in + (size_t)r * pd, bt->x + (size_t)r * pd, sizeof(float) * (size_t)pd);
                else
                    memset(m->emb_in + (size_t)r * pd, 0, sizeof(float) * (size_t)pd);
            }
    }
        bki_linear_fwd((int)Bn, pd, D, m->emb_in, pd, m->w + m->e_w, m->w + m->e_b, m->emb_h, D);
        bki_gelu_fwd(Bn * (size_t)D, m->emb_h, m->emb_g);
        bki_linear_fwd((int)Bn, D, D, m->emb_g, D, m->w + m->e_w2, m->w + m->e_b2, m->emb_o, D);
    }
    const float *cls = c->cls ? m->w + m->cls_o : NULL, *pos = c->pos_embed ? m->w + m->pos_o : NULL;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < (int64_t)B * T; r++) {
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
    if (train && c->dropout > 0.0f) bki_dropout(m->x0, B * T, D, D, c->dropout, bki_dropout_key(m->seed, m->cur_count, 0));
    for (int b = 0; b < B; b++)
        if (m->nb[b] < T) memset(m->x0 + ((size_t)b * T + (size_t)m->nb[b]) * D, 0, sizeof(float) * (size_t)(T - m->nb[b]) * D);
}

static void views(const bk_model *m, float *qkv, float *att, bk_tensor *q, bk_tensor *k, bk_tensor *v, bk_tensor *o)
{
    const int64_t T = m->T, I = m->I, dh = m->dh;
    *q = (bk_tensor){qkv, T * 3 * I, dh, 3 * I, BK_DEVICE_HOST};
    *k = (bk_tensor){qkv + I, T * 3 * I, dh, 3 * I, BK_DEVICE_HOST};
    *v = (bk_tensor){qkv + 2 * I, T * 3 * I, dh, 3 * I, BK_DEVICE_HOST};
    *o = (bk_tensor){att, T * I, dh, I, BK_DEVICE_HOST};
}

/* ---- attn=diff: the paper's layer around the operator (docs/MODEL.md) ------
 * lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init, one value shared by
 * the heads of block l; each head's operator output (dh channels) is divided
 * by its RMS (eps = ln_eps, no learned gain) and multiplied by
 * (1 - lambda_init). l is 0-based: the paper's l - 1. */
static double diff_lambda_init(int l) { return 0.8 - 0.6 * exp(-0.3 * (double)l); }

/* e1 = exp(lq1 . lk1), e2 = exp(lq2 . lk2) (dot products in double, in order) */
static void diff_exps(const bk_model *m, int l, double *e1, double *e2)
{
    const blk_off *o = &m->bo[l];
    const float *w = m->w;
    double s1 = 0.0, s2 = 0.0;
    for (int j = 0; j < m->dh / 2; j++) {
        s1 += (double)w[o->dl_q1 + j] * w[o->dl_k1 + j];
        s2 += (double)w[o->dl_q2 + j] * w[o->dl_k2 + j];
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
static void diff_norm(bk_model *m, int l, int B, int bwd)
{
    blk_act *a = &m->ba[l];
    const int H = m->c.heads, dh = m->dh, I = m->I, nt = bki_threads();
    const int64_t R = (int64_t)B * m->T;
    const double eps = m->c.ln_eps;
    const float g = (float)(1.0 - diff_lambda_init(l));
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++)
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
}

/* dlambda (summed over the heads, in head order) into the four vectors */
static void diff_lambda_bwd(bk_model *m, int l)
{
    const blk_off *o = &m->bo[l];
    const float *w = m->w;
    float *gw = m->gw;
    double gl = 0.0, e1, e2;
    for (int h = 0; h < m->c.heads; h++) gl += m->dlam[h];
    diff_exps(m, l, &e1, &e2);
    const double g1 = gl * e1, g2 = -gl * e2;
    for (int j = 0; j < m->dh / 2; j++) {
        gw[o->dl_q1 + j] += (float)(g1 * w[o->dl_k1 + j]);
        gw[o->dl_k1 + j] += (float)(g1 * w[o->dl_q1 + j]);
        gw[o->dl_q2 + j] += (float)(g2 * w[o->dl_k2 + j]);
        gw[o->dl_k2 + j] += (float)(g2 * w[o->dl_q2 + j]);
    }
}

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
static void *diff_pgrads(bk_model *m, bki_lot_grads *lg)
{
    (void)lg;
    return m->dlam;
}

static bk_status attn_forward(bk_model *m, int l, int B, int train, const bk_tensor *attn_out)
{
    blk_act *a = &m->ba[l];
    bk_attn_desc d = attn_desc(m, B);
    bk_tensor q, k, v, o;
    views(m, a->qkv, a->att, &q, &k, &v, &o);
    bk_status st = ensure_ws(m, attn_ws(m, &d, l));
    if (st) return st;
    if (m->c.attn == BK_ATTN_ASAP && !a->asap)
        return bki_fail(BK_ERR_PARAM, "model: block %d has no compiled ASAP layer (bk_model_set_asap)", l);
    const attn_hooks *hk = ATTN_KINDS[m->c.attn].hooks;
    if (hk && hk->fwd_pre) hk->fwd_pre(m, l, &o);
    attn_par par;
    bki_call c = attn_call(m, &d, l, &par);
    c.q = &q; c.k = &k; c.v = &v; c.out = &o; c.attn = attn_out;
    if ((st = bki_op_forward(&c, train ? a->tape : NULL, m->ws, m->ws_cap))) return st;
    if (hk && hk->fwd_post) hk->fwd_post(m, l, B);
    return BK_OK;
}

/* out = x + dropout(out + b) over [R, D] */
static void residual_add(int R, int D, const float *x, float *out, const float *b, float p, uint64_t key)
{
    const int nt = bki_threads();
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) {
            float *o = out + (size_t)r * D;
            for (int c = 0; c < D; c++) o[c] += b[c];
        }
    }
    if (p > 0.0f) bki_dropout(out, R, D, D, p, key);
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) {
            float *o = out + (size_t)r * D;
            const float *xr = x + (size_t)r * D;
            for (int c = 0; c < D; c++) o[c] += xr[c];
        }
    }
}

static bk_status pool_forward(bk_model *m, int B, int train)
{
    const bk_model_config *c = &m->c;
    const int T = m->T, D = c->dim;
    const float *h = m->fin;
    if (c->pool == BK_POOL_OTK) {
        bk_otk_desc od = otk_desc(m, B);
        bk_otk_config op = otk_params(m);
        bk_tensor x = {(float *)h, (int64_t)T * D, 0, D, BK_DEVICE_HOST};
        bk_tensor out = {m->pooled, (int64_t)m->F, 0, (int64_t)c->otk_refs * D, BK_DEVICE_HOST};
        bk_status st = ensure_ws(m, bk_otk_workspace_size(&od, &op));
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

bk_status bk_model_forward(bk_model *m, const bk_batch *bt, int train, float ls, float *logits, double *loss)
{
    if (!m) return bki_fail(BK_ERR_NULL, "bk_model_forward: NULL model");
    const bk_model_config *c = &m->c;
    bk_status st = check_batch(m, bt, loss != NULL || train);
    if (st) return st;
    if (!(ls >= 0.0f && ls < 1.0f)) return bki_fail(BK_ERR_PARAM, "model: label smoothing %g outside [0, 1)", (double)ls);
    if (train && c->attn == BK_ATTN_ASAP)
        return bki_fail(BK_ERR_PARAM, "model: ASAP layers are compiled for inference only; they cannot be trained");
    const int B = bt->B, T = m->T, D = c->dim, I = m->I, M = c->mlp_dim, R = B * T;
    m->have_tape = 0;
    m->B = B;
    m->ls = ls;
    for (int b = 0; b < B; b++) m->nb[b] = (c->input != BK_INPUT_IMAGE && bt->len ? bt->len[b] : m->np) + c->cls;
    if (bt->labels) memcpy(m->labels, bt->labels, sizeof(int32_t) * (size_t)B);
    if (train) m->cur_count = m->fwd_count;
    const float pdrop = train ? c->dropout : 0.0f;

    embed_fwd(m, bt, train);
    const float *x = m->x0;
    for (int l = 0; l < c->depth; l++) {
        blk_act *a = &m->ba[l];
        const blk_off *o = &m->bo[l];
        bki_layernorm_fwd(R, D, x, m->w + o->ln1_w, m->w + o->ln1_b, c->ln_eps, a->ln1, a->mu1, a->rs1);
        bki_linear_fwd(R, D, 3 * I, a->ln1, D, m->w + o->qkv_w, c->qkv_bias ? m->w + o->qkv_b : NULL, a->qkv, 3 * I);
        if ((st = attn_forward(m, l, B, train, NULL))) return st;
        bki_linear_fwd(R, I, D, a->att, I, m->w + o->proj_w, NULL, a->mid, D);
        residual_add(R, D, x, a->mid, m->w + o->proj_b, pdrop, bki_dropout_key(m->seed, m->cur_count, 1 + 2 * l));
        if (M > 0) {
            bki_layernorm_fwd(R, D, a->mid, m->w + o->ln2_w, m->w + o->ln2_b, c->ln_eps, a->ln2, a->mu2, a->rs2);
            bki_linear_fwd(R, D, M, a->ln2, D, m->w + o->fc1_w, m->w + o->fc1_b, a->f1, M);
            bki_gelu_fwd((size_t)R * M, a->f1, a->g1);
            bki_linear_fwd(R, M, D, a->g1, M, m->w + o->fc2_w, NULL, a->out, D);
            residual_add(R, D, a->mid, a->out, m->w + o->fc2_b, pdrop, bki_dropout_key(m->seed, m->cur_count, 2 + 2 * l));
        }
        x = a->out;
    }
    if (c->final_norm)
        bki_layernorm_fwd(R, D, x, m->w + m->nrm_w, m->w + m->nrm_b, c->ln_eps, m->fin, m->fmu, m->frs);
    else
        memcpy(m->fin, x, sizeof(float) * (size_t)R * D);
    if ((st = pool_forward(m, B, train))) return st;
    bki_linear_fwd(B, m->F, c->classes, m->pooled, m->F, m->w + m->head_w, m->w + m->head_b, m->logits, c->classes);

    const int C = c->classes;
    double total = 0.0;
    int finite = 1;
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
        if (bt->labels) total += (1.0 - ls) * (lse - z[bt->labels[b]]) + ls * mean_nll / C;
    }
    if (!finite) return bki_fail(BK_ERR_NONFINITE, "model: non-finite logits (diverged parameters?)");
    if (logits) memcpy(logits, m->logits, sizeof(float) * (size_t)B * C);
    if (loss) *loss = total / B;
    if (train) {
        m->have_tape = 1;
        m->fwd_count++;
    }
    return BK_OK;
}

/* ------------------------------------------------------------------------ */
/* backward                                                                 */
/* ------------------------------------------------------------------------ */
static void add_into(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

static void *lot_pgrads(bk_model *m, bki_lot_grads *lg)
{
    *lg = (bki_lot_grads){m->dZtmp, m->dthtmp};
    return lg;
}
static void lot_bwd_post(bk_model *m, int l)
{
    add_into(m->gw + m->bo[l].lot_z, m->dZtmp, (size_t)m->c.heads * m->c.lot_r * m->dh);
    add_into(m->gw + m->bo[l].lot_t, m->dthtmp, (size_t)m->c.heads * m->c.lot_r);
}

static bk_status attn_backward(bk_model *m, int l, int B)
{
    blk_act *a = &m->ba[l];
    bk_attn_desc d = attn_desc(m, B);
    bk_tensor q, k, v, o;
    views(m, a->qkv, a->att, &q, &k, &v, &o);
    const int64_t T = m->T, I = m->I, dh = m->dh;
    bk_tensor dout = {m->dA, T * I, dh, I, BK_DEVICE_HOST}, dq = {m->dq, T * I, dh, I, BK_DEVICE_HOST},
              dk = {m->dk, T * I, dh, I, BK_DEVICE_HOST}, dv = {m->dv, T * I, dh, I, BK_DEVICE_HOST};
    bk_status st = ensure_ws(m, attn_ws(m, &d, l));
    if (st) return st;
    const attn_hooks *hk = ATTN_KINDS[m->c.attn].hooks;
    if (hk && hk->bwd_pre) hk->bwd_pre(m, l, B, &dout);
    attn_par par;
    bki_call c = attn_call(m, &d, l, &par);
    bki_lot_grads lg;
    c.q = &q; c.k = &k; c.v = &v; c.dout = &dout; c.dq = &dq; c.dk = &dk; c.dv = &dv;
    if (hk && hk->pgrads) c.pg = hk->pgrads(m, &lg);
    if ((st = bki_op_backward(&c, a->tape, m->ws, m->ws_cap))) return st;
    if (hk && hk->bwd_post) hk->bwd_post(m, l);
    return BK_OK;
}

static bk_status pool_backward(bk_model *m, int B)
{
    const bk_model_config *c = &m->c;
    const int T = m->T, D = c->dim;
    memset(m->dN, 0, sizeof(float) * (size_t)B * T * D);
    if (c->pool == BK_POOL_OTK) {
        bk_otk_desc od = otk_desc(m, B);
        bk_otk_config op = otk_params(m);
        bk_tensor x = {m->fin, (int64_t)T * D, 0, D, BK_DEVICE_HOST};
        bk_tensor dout = {m->dpool, (int64_t)m->F, 0, (int64_t)c->otk_refs * D, BK_DEVICE_HOST};
        bk_tensor dx = {m->dN, (int64_t)T * D, 0, D, BK_DEVICE_HOST};
        bk_status st = ensure_ws(m, bk_otk_workspace_size(&od, &op));
        if (st) return st;
        st = bk_otk_backward(&od, &op, &x, m->w + m->otk_z, &dout, m->otk_tape, &dx, m->dZtmp, NULL, m->ws, m->ws_cap);
        if (st) return st;
        add_into(m->gw + m->otk_z, m->dZtmp, (size_t)c->otk_refs * c->otk_supports * D);
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

static void embed_backward(bk_model *m, int B)
{
    const bk_model_config *c = &m->c;
    const int T = m->T, D = c->dim, np = m->np, nt = bki_threads();
    const size_t Bn = (size_t)B * (size_t)np;
    float *dX = m->dX;
    for (int b = 0; b < B; b++)
        if (m->nb[b] < T) memset(dX + ((size_t)b * T + (size_t)m->nb[b]) * D, 0, sizeof(float) * (size_t)(T - m->nb[b]) * D);
    if (c->dropout > 0.0f) bki_dropout(dX, B * T, D, D, c->dropout, bki_dropout_key(m->seed, m->cur_count, 0));
    if (c->pos_embed) {
        float *g = m->gw + m->pos_o;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
#pragma omp for schedule(static)
            for (int t = 0; t < T; t++)
                for (int b = 0; b < B; b++) add_into(g + (size_t)t * D, dX + ((size_t)b * T + t) * D, (size_t)D);
    }
    }
    if (c->cls) {
        float *g = m->gw + m->cls_o;
        for (int b = 0; b < B; b++) add_into(g, dX + (size_t)b * T * D, (size_t)D);
    }
    /* gather the token rows' gradient into [B*np, D] */
    float *dE = m->dT;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < (int64_t)Bn; r++) {
            const int b = (int)(r / np), i = (int)(r % np);
            memcpy(dE + (size_t)r * D, dX + ((size_t)b * T + (size_t)(i + c->cls)) * D, sizeof(float) * (size_t)D);
        }
    }
    if (c->input == BK_INPUT_IMAGE) {
        bki_linear_bwd((int)Bn, m->in_feat, D, m->emb_in, m->in_feat, m->w + m->e_w, dE, D, NULL, 0.0f, m->gw + m->e_w,
                       m->gw + m->e_b);
    } else if (c->input == BK_INPUT_TOKENS) {
        /* table rows: parallel over column blocks, rows in order */
        float *g = m->gw + m->e_w;
        const int nblk = (D + 31) / 32;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
#pragma omp for schedule(static)
            for (int blk = 0; blk < nblk; blk++) {
                const int c0 = blk * 32, cn = D - c0 < 32 ? D - c0 : 32;
                for (size_t r = 0; r < Bn; r++) {
                    float *gr = g + (size_t)m->tokens[r] * D + c0;
                    const float *er = dE + r * D + c0;
                    for (int k = 0; k < cn; k++) gr[k] += er[k];
                }
            }
    }
    } else {
        const int pd = m->in_feat;
        float *dG = m->dM;
        bki_linear_bwd((int)Bn, D, D, m->emb_g, D, m->w + m->e_w2, dE, D, dG, 0.0f, m->gw + m->e_w2, m->gw + m->e_b2);
        bki_gelu_bwd(Bn * (size_t)D, m->emb_h, dG, dG);
        bki_linear_bwd((int)Bn, pd, D, m->emb_in, pd, m->w + m->e_w, dG, D, NULL, 0.0f, m->gw + m->e_w, m->gw + m->e_b);
    }
}

bk_status bk_model_backward(bk_model *m, float grad_scale)
{
    if (!m) return bki_fail(BK_ERR_NULL, "bk_model_backward: NULL model");
    if (!m->have_tape) return bki_fail(BK_ERR_TAPE, "bk_model_backward: no training forward to differentiate");
    if (!isfinite(grad_scale)) return bki_fail(BK_ERR_PARAM, "bk_model_backward: grad_scale must be finite");
    const bk_model_config *c = &m->c;
    const int B = m->B, T = m->T, D = c->dim, I = m->I, M = c->mlp_dim, R = B * T, C = c->classes;
    bk_status st;
    const float ls = m->ls;
    /* dlogits = scale / B (p - target) */
    for (int b = 0; b < B; b++)
        for (int j = 0; j < C; j++) {
            const float tgt = (1.0f - ls) * (j == m->labels[b]) + ls / (float)C;
            m->dlog[(size_t)b * C + j] = grad_scale / (float)B * (m->probs[(size_t)b * C + j] - tgt);
        }
    bki_linear_bwd(B, m->F, C, m->pooled, m->F, m->w + m->head_w, m->dlog, C, m->dpool, 0.0f, m->gw + m->head_w,
                   m->gw + m->head_b);
    if ((st = pool_backward(m, B))) return st;
    const float *xlast = c->depth > 0 ? m->ba[c->depth - 1].out : m->x0;
    if (c->final_norm) {
        memset(m->dX, 0, sizeof(float) * (size_t)R * D);
        bki_layernorm_bwd(R, D, xlast, m->fmu, m->frs, m->w + m->nrm_w, m->dN, m->dX, m->gw + m->nrm_w, m->gw + m->nrm_b);
    } else {
        memcpy(m->dX, m->dN, sizeof(float) * (size_t)R * D);
    }
    for (int l = c->depth - 1; l >= 0; l--) {
        blk_act *a = &m->ba[l];
        const blk_off *o = &m->bo[l];
        const float *xin = l > 0 ? m->ba[l - 1].out : m->x0;
        if (M > 0) {
            memcpy(m->dT, m->dX, sizeof(float) * (size_t)R * D);
            if (c->dropout > 0.0f) bki_dropout(m->dT, R, D, D, c->dropout, bki_dropout_key(m->seed, m->cur_count, 2 + 2 * l));
            bki_linear_bwd(R, M, D, a->g1, M, m->w + o->fc2_w, m->dT, D, m->dM, 0.0f, m->gw + o->fc2_w, m->gw + o->fc2_b);
            bki_gelu_bwd((size_t)R * M, a->f1, m->dM, m->dM);
            bki_linear_bwd(R, D, M, a->ln2, D, m->w + o->fc1_w, m->dM, M, m->dT, 0.0f, m->gw + o->fc1_w, m->gw + o->fc1_b);
            bki_layernorm_bwd(R, D, a->mid, a->mu2, a->rs2, m->w + o->ln2_w, m->dT, m->dX, m->gw + o->ln2_w,
                              m->gw + o->ln2_b);
        }
        memcpy(m->dT, m->dX, sizeof(float) * (size_t)R * D);
        if (c->dropout > 0.0f) bki_dropout(m->dT, R, D, D, c->dropout, bki_dropout_key(m->seed, m->cur_count, 1 + 2 * l));
        bki_linear_bwd(R, I, D, a->att, I, m->w + o->proj_w, m->dT, D, m->dA, 0.0f, m->gw + o->proj_w, m->gw + o->proj_b);
        if ((st = attn_backward(m, l, B))) return st;
        /* qkv = ln1 Wqkv^T: three blocks of rows of W, one per q / k / v */
        float *dsrc[3] = {m->dq, m->dk, m->dv};
        for (int j = 0; j < 3; j++)
            bki_linear_bwd(R, D, I, a->ln1, D, m->w + o->qkv_w + (size_t)j * I * D, dsrc[j], I, m->dT, j ? 1.0f : 0.0f,
                           m->gw + o->qkv_w + (size_t)j * I * D, c->qkv_bias ? m->gw + o->qkv_b + (size_t)j * I : NULL);
        bki_layernorm_bwd(R, D, xin, a->mu1, a->rs1, m->w + o->ln1_w, m->dT, m->dX, m->gw + o->ln1_w, m->gw + o->ln1_b);
    }
    embed_backward(m, B);
    m->have_tape = 0;
    return BK_OK;
}

bk_asap_config bk_model_asap_config(const bk_model *m)
{
    bk_asap_config a = bk_asap_config_default(m ? m->dh : 1);
    if (!m) return a;
    a.scale = m->c.attn_scale;
    a.eps = m->c.sk_eps;
    a.teacher_iters = m->c.sk_iters;
    return a;
}

bk_status bk_model_calib_add(bk_model *m, int layer, bk_asap_calib *calib)
{
    if (!m || !calib) return bki_fail(BK_ERR_NULL, "bk_model_calib_add: NULL argument");
    if (layer < 0 || layer >= m->c.depth)
        return bki_fail(BK_ERR_PARAM, "bk_model_calib_add: layer %d outside [0, %d)", layer, m->c.depth);
    if (m->B < 1) return bki_fail(BK_ERR_PARAM, "bk_model_calib_add: no forward has run");
    bk_attn_desc d = attn_desc(m, m->B);
    bk_tensor q, k, v, o;
    views(m, m->ba[layer].qkv, m->ba[layer].att, &q, &k, &v, &o);
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
    bk_tensor A = {attn, m->c.heads * T * T, T * T, T, BK_DEVICE_HOST};
    /* re-running the operator rewrites att with the same values; the tape
     * of a pending backward is left alone (train = 0) */
    return attn_forward(m, layer, m->B, 0, &A);
}
