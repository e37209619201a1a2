/* config.c -- the model's configuration (docs/MODEL.md): its keys, defaults,
 * text form and checks. The attention sites' parameters are their operators'
 * own parameter structs, set by namespaced keys from each operator's schema
 * ("attn.iters", "cross_attn.t", ...); the keys written before the schema
 * (sk_iters, esp_t, lot_r, ...) are converted here, in one table. */
#include "model_impl.h"
#include "../ops/op.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const INPUT_NAMES[] = {"image", "tokens", "points", NULL};
static const char *const POOL_NAMES[] = {"cls", "mean", "max", "otk", "pma", NULL};
/* bk_set_block's values in order */
static const char *const SET_BLOCK_NAMES[] = {"sab", "isab", NULL};
static const char *const ARCH_NAMES[] = {"classifier", "seq2seq", NULL};
/* bk_cls_attn's values in order */
static const char *const CLS_ATTN_NAMES[] = {"full", "softmax", "pol", NULL};
/* bk_lot_learn's values in order */
static const char *const LOT_LEARN_NAMES[] = {"both", "z", "none", NULL};
/* bk_otk_pe's values in order */
static const char *const OTK_PE_NAMES[] = {"none", "1d", "2d", NULL};

/* the attention sites' kinds are not table fields (their names are the
 * registry's): the key, the kind and the parameters of each */
typedef struct {
    const char *key;
    size_t kind, par;
} site_key;
static const site_key SITES[] = {
    {"attn", offsetof(bk_model_config, attn), offsetof(bk_model_config, attn_par)},
    {"cross_attn", offsetof(bk_model_config, cross_attn), offsetof(bk_model_config, cross_par)},
    {"pma_attn", offsetof(bk_model_config, pma_attn), offsetof(bk_model_config, pma_par)},
};
enum { NSITES = 3 };
static int *site_kind_of(bk_model_config *c, int s) { return (int *)(void *)((char *)c + SITES[s].kind); }
static int site_kind_c(const bk_model_config *c, int s) { return *(const int *)(const void *)((const char *)c + SITES[s].kind); }
static bk_attn_params *site_params(bk_model_config *c, int s) { return (bk_attn_params *)(void *)((char *)c + SITES[s].par); }
static const bk_attn_params *site_params_c(const bk_model_config *c, int s)
{
    return (const bk_attn_params *)(const void *)((const char *)c + SITES[s].par);
}
static void site_reset(bk_model_config *c, int s, int k);
/* site s's parameters, made the kind's (its defaults) when they are not */
static void *site_par(bk_model_config *c, int s)
{
    if (site_params(c, s)->kind != site_kind_c(c, s)) site_reset(c, s, site_kind_c(c, s));
    return site_params(c, s)->par.bytes;
}

#define F(field, ty) {.name = #field, .type = ty, .offset = offsetof(bk_model_config, field), .names = NULL, .list_len = 0}
#define E(field, nm) {.name = #field, .type = BKI_F_ENUM, .offset = offsetof(bk_model_config, field), .names = nm, .list_len = 0}
static const bki_field MODEL_FIELDS[] = {
    E(input, INPUT_NAMES),        F(channels, BKI_F_INT),    F(image_h, BKI_F_INT),      F(image_w, BKI_F_INT),
    F(patch, BKI_F_INT),          F(vocab, BKI_F_INT),       F(max_len, BKI_F_INT),      F(point_dim, BKI_F_INT),
    F(max_points, BKI_F_INT),     F(dim, BKI_F_INT),         F(depth, BKI_F_INT),        F(heads, BKI_F_INT),
    F(head_dim, BKI_F_INT),       F(mlp_dim, BKI_F_INT),     F(cls, BKI_F_INT),          F(pos_embed, BKI_F_INT),
    F(final_norm, BKI_F_INT),     F(qkv_bias, BKI_F_INT),    E(pool, POOL_NAMES),        F(classes, BKI_F_INT),
    F(dropout, BKI_F_FLOAT),      F(ln_eps, BKI_F_FLOAT),    F(attn_scale, BKI_F_FLOAT),
    F(otk_refs, BKI_F_INT),       F(otk_supports, BKI_F_INT),
    F(otk_iters, BKI_F_INT),      F(otk_eps, BKI_F_FLOAT),   F(otk_anchors, BKI_F_INT),  F(otk_sigma, BKI_F_FLOAT),
    F(otk_eta, BKI_F_FLOAT),      E(otk_pe, OTK_PE_NAMES),   F(otk_sigma_pos, BKI_F_FLOAT),
    E(arch, ARCH_NAMES),          F(dec_depth, BKI_F_INT),
    F(tgt_max_len, BKI_F_INT),    F(post_ln, BKI_F_INT),      F(bos, BKI_F_INT),
    F(eos, BKI_F_INT),            E(cls_attn, CLS_ATTN_NAMES),
    F(pol_ps, BKI_F_FLOAT),       F(pol_po, BKI_F_FLOAT),    F(dwc, BKI_F_INT),          F(dwc_kernel, BKI_F_INT),
    E(lot_learn, LOT_LEARN_NAMES),
    E(set_block, SET_BLOCK_NAMES), F(set_inducing, BKI_F_INT), F(pma_seeds, BKI_F_INT),
};
#undef F
#undef E
#define NFIELDS ((int)(sizeof MODEL_FIELDS / sizeof MODEL_FIELDS[0]))
/* where the text form writes each site (its kind, then its parameters):
 * before these fields (NULL: at the end), where the kinds always were */
static const char *const SITE_BEFORE[] = {"attn_scale", "post_ln", NULL};

/* ---- the keys before the operator schema --------------------------------
 * Each old key sets one parameter of every site whose operator is one of
 * ops (none when there is none: a softmax model's text carried sk_iters
 * too). The model's defaults before the schema where they differ from the
 * operator's (ESP's soft sort, LOT's 8 pivots) are given to a site that
 * takes one of those kinds, so old text that leaves them out means what it
 * meant. New operators take their own defaults and have no old keys. */
typedef struct {
    const char *old, *ops, *key;
    int lo, hi; /* an integer's range even where no site takes it (lo < hi) */
} legacy_key;
static const legacy_key LEGACY[] = {
    {"sk_iters", "sinkhorn unbalanced", "iters", 0, 1 << 20},
    {"sk_eps", "sinkhorn unbalanced", "eps", 0, 0},
    {"sk_rho", "unbalanced", "rho", 0, 0},
    {"esp_soft", "esp", "sort", 0, 0},
    {"esp_t", "esp", "t", 0, 0},
    {"esp_tau", "esp", "tau", 0, 0},
    {"esp_slices", "esp", "L", 0, 1 << 24},
    {"lot_r", "lot", "r", 0, 1 << 24},
    {"lot_iters", "lot", "iters", 0, 1 << 20},
    {"lot_eps", "lot", "eps", 0, 0},
    {"lot_temp", "lot", "temp", 0, 0},
    {"asap_ending", "asap", "variant", 0, 0},
};
static const struct {
    const char *op, *params;
} LEGACY_DEFAULTS[] = {{"esp", "sort=soft"}, {"lot", "r=8"}};

static int word_in(const char *name, const char *list)
{
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const size_t k = strcspn(p, " ");
        if (k == n && !strncmp(p, name, n)) return 1;
        p += k + (p[k] == ' ');
    }
    return 0;
}

/* ---- the kinds: the registry's operators with BKI_CAP_MODEL ---- */
/* (a parameter struct larger than a site's storage cannot be a model's: the
 * registry test checks that none is) */
const bki_op *bki_attn_op(int kind)
{
    const bki_op *op = (const bki_op *)(const void *)bk_op_at(kind);
    return op && (op->caps & BKI_CAP_MODEL) && op->par_size <= BK_ATTN_PARAMS_BYTES ? op : NULL;
}

const char *bk_attn_kind_name(bk_attn_kind k)
{
    const bki_op *op = bki_attn_op((int)k);
    return op ? op->name : "?";
}

int bk_attn_kind_find(const char *name)
{
    if (!name) return -1;
    for (int i = 0; i < bk_op_count(); i++)
        if (bki_attn_op(i) && !strcmp(bki_attn_op(i)->name, name)) return i;
    return -1;
}

/* a field of the operator's parameter struct by name and type, or NULL */
static void *field(const bki_op *op, void *par, const char *name, bki_field_type ty)
{
    for (int j = 0; j < op->nfields; j++)
        if (op->fields[j].type == ty && !strcmp(op->fields[j].name, name)) return (char *)par + op->fields[j].offset;
    return NULL;
}

void bki_attn_set_owned(const bki_op *op, void *par, float scale, int causal, int64_t seed_offset)
{
    float *sc = field(op, par, "scale", BKI_F_FLOAT);
    int *ca = field(op, par, "causal", BKI_F_INT);
    /* a seed is a 64-bit key, unsigned (ESP's) or signed: the same bits */
    uint64_t *sd = field(op, par, "seed", BKI_F_U64);
    if (!sd) sd = field(op, par, "seed", BKI_F_I64);
    if (sc) *sc = scale;
    if (ca) *ca = causal;
    if (sd) *sd += (uint64_t)seed_offset;
}

/* what the layer work of a few kinds (attn_layer.c's extensions, by the
 * same operator names) asks of the configuration */
static const struct {
    const char *op;
    unsigned flags;
} LAYER_FLAGS[] = {
    {"diff", BKI_LAYER_SELF_ONLY | BKI_LAYER_WHOLE_ROWS | BKI_LAYER_BUFFERS},
    {"asap", BKI_LAYER_SELF_ONLY | BKI_LAYER_HOLDS},
};

unsigned bki_attn_layer_flags(int kind)
{
    const bki_op *op = bki_attn_op(kind);
    for (size_t i = 0; op && i < sizeof LAYER_FLAGS / sizeof LAYER_FLAGS[0]; i++)
        if (!strcmp(LAYER_FLAGS[i].op, op->name)) return LAYER_FLAGS[i].flags;
    return 0u;
}

/* the parameters the model sets itself at every call (bki_attn_set_owned) */
static int model_owned(const char *key) { return !strcmp(key, "scale") || !strcmp(key, "causal"); }

/* a site given kind k: that operator's defaults (and the model's old ones) */
static void site_reset(bk_model_config *c, int s, int k)
{
    const bki_op *op = bki_attn_op(k);
    *site_kind_of(c, s) = k;
    bk_attn_params *ps = site_params(c, s);
    memset(ps, 0, sizeof *ps);
    ps->kind = k;
    void *par = ps->par.bytes;
    if (!op) return;
    op->par_default(par);
    for (size_t i = 0; i < sizeof LEGACY_DEFAULTS / sizeof LEGACY_DEFAULTS[0]; i++)
        if (!strcmp(op->name, LEGACY_DEFAULTS[i].op))
            (void)bki_cfg_parse(par, op->fields, op->nfields, op->name, LEGACY_DEFAULTS[i].params);
}

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
    for (int s = 0; s < NSITES; s++) site_reset(&c, s, BK_ATTN_SOFTMAX);
    c.otk_refs = 1;
    c.otk_supports = 4;
    c.otk_iters = 20; /* half-steps: 10 iterations */
    c.otk_eps = 0.5f;
    c.otk_sigma = 0.5f;      /* the paper's bandwidth (SCOP, SST-2)          */
    c.otk_eta = 1e-2f;       /* the reference code's regulariser             */
    c.otk_pe = BK_OTK_PE_NONE;
    c.otk_sigma_pos = 0.1f;  /* bk_otk_config_default's                      */
    c.arch = BK_ARCH_CLASSIFIER;
    c.dec_depth = 2;
    c.tgt_max_len = 128;
    c.bos = 1;
    c.eos = 2;
    c.cls_attn = BK_CLS_FULL;
    c.pol_ps = 2.0f;
    c.pol_po = 1.0f;
    c.dwc_kernel = 3;
    c.set_block = BK_SET_SAB;
    c.set_inducing = 16;
    c.pma_seeds = 1;
    return c;
}

/* the site whose kind key (len n) this is, or -1 */
static int site_of_key(const char *key, size_t n)
{
    for (int s = 0; s < NSITES; s++)
        if (strlen(SITES[s].key) == n && !strncmp(SITES[s].key, key, n)) return s;
    return -1;
}

static bk_status set_kind(bk_model_config *c, int s, const char *value)
{
    const int k = bk_attn_kind_find(value);
    if (k < 0) {
        char names[512] = "";
        size_t used = 0;
        for (int i = 0; i < bk_op_count(); i++)
            if (bki_attn_op(i) && used < sizeof names)
                used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "",
                                         bki_attn_op(i)->name);
        return bki_fail(BK_ERR_PARAM, "model config: %s=%s: not a model attention operator (one of %s)", SITES[s].key,
                        value, names);
    }
    if (site_kind_c(c, s) != k) site_reset(c, s, k);
    return BK_OK;
}

/* "attn.KEY" of site s (its operator's schema) */
static bk_status set_site_param(bk_model_config *c, int s, const char *key, const char *value)
{
    const bki_op *op = bki_attn_op(site_kind_c(c, s));
    if (!op) return bki_fail(BK_ERR_PARAM, "model config: %s has no attention kind", SITES[s].key);
    if (model_owned(key))
        return bki_fail(BK_ERR_PARAM,
                        "model config: %s.%s is set by the model (%s); set attn_scale for the scale of every site",
                        SITES[s].key, key, !strcmp(key, "scale") ? "attn_scale" : "the decoder's self-attention");
    char what[64];
    snprintf(what, sizeof what, "model config: %s=%s", SITES[s].key, op->name);
    return bki_cfg_set(site_par(c, s), op->fields, op->nfields, what, key, value);
}

/* an old key: its parameter at every site of a kind it named (esp_soft's
 * 0/1 is the sort's hard/soft) */
static bk_status set_legacy(bk_model_config *c, const legacy_key *lk, const char *value)
{
    if (!strcmp(lk->old, "esp_soft")) {
        if (strcmp(value, "0") && strcmp(value, "1"))
            return bki_fail(BK_ERR_PARAM, "model config: esp_soft is a 0/1 switch (got '%s')", value);
        value = !strcmp(value, "1") ? "soft" : "hard";
    }
    { /* the value is the parameter's even where no site takes it (its
       * type, its schema range): a scratch struct of the first kind named */
        char first[32];
        snprintf(first, sizeof first, "%.*s", (int)strcspn(lk->ops, " "), lk->ops);
        const bki_op *op = bki_op_find(first);
        bk_attn_params scratch;
        char what[64];
        snprintf(what, sizeof what, "model config: %s", lk->old);
        op->par_default(scratch.par.bytes);
        bk_status st = bki_cfg_set(scratch.par.bytes, op->fields, op->nfields, what, lk->key, value);
        if (st) return st;
        const long v = strtol(value, NULL, 10);
        if (lk->lo < lk->hi && (v < lk->lo || v > lk->hi))
            return bki_fail(BK_ERR_PARAM, "model config: %s must be in [%d, %d] (got %s)", lk->old, lk->lo, lk->hi,
                            value);
    }
    for (int s = 0; s < NSITES; s++) {
        const bki_op *op = bki_attn_op(site_kind_c(c, s));
        if (!op || !word_in(op->name, lk->ops)) continue;
        char what[96];
        snprintf(what, sizeof what, "model config: %s (%s.%s)", lk->old, SITES[s].key, lk->key);
        bk_status st = bki_cfg_set(site_par(c, s), op->fields, op->nfields, what, lk->key, value);
        if (st) return st;
    }
    return BK_OK;
}

int bki_model_config_key(const bk_model_config *c, const char *key)
{
    const char *dot = strchr(key, '.');
    if (site_of_key(key, dot ? (size_t)(dot - key) : strlen(key)) >= 0) return 1;
    for (size_t i = 0; i < sizeof LEGACY / sizeof LEGACY[0]; i++)
        if (!strcmp(key, LEGACY[i].old)) return 1;
    for (int i = 0; i < NFIELDS; i++)
        if (!strcmp(key, MODEL_FIELDS[i].name)) return 1;
    (void)c;
    return 0;
}

bk_status bk_model_config_set(bk_model_config *c, const char *key, const char *value)
{
    if (!c || !key || !value) return bki_fail(BK_ERR_NULL, "model config: NULL argument");
    const char *dot = strchr(key, '.');
    const int s = site_of_key(key, dot ? (size_t)(dot - key) : strlen(key));
    if (s >= 0) return dot ? set_site_param(c, s, dot + 1, value) : set_kind(c, s, value);
    for (size_t i = 0; i < sizeof LEGACY / sizeof LEGACY[0]; i++)
        if (!strcmp(key, LEGACY[i].old)) return set_legacy(c, &LEGACY[i], value);
    return bki_cfg_set(c, MODEL_FIELDS, NFIELDS, "model config", key, value);
}

/* one pass over text: the kind keys only (kinds = 1), or all others */
static bk_status parse_pass(bk_model_config *c, const char *text, int kinds)
{
    for (const char *s = text; *s;) {
        s += strspn(s, ", \t\r\n");
        if (!*s) break;
        const size_t len = strcspn(s, ", \t\r\n");
        const char *eq = memchr(s, '=', len);
        if (!eq) return bki_fail(BK_ERR_PARAM, "model config: '%.*s' is not key=value", (int)len, s);
        char key[96], value[128];
        const size_t kl = (size_t)(eq - s), vl = len - kl - 1;
        if (kl >= sizeof key) return bki_fail(BK_ERR_PARAM, "model config: unknown key '%.*s'", (int)kl, s);
        if (vl >= sizeof value) return bki_fail(BK_ERR_PARAM, "model config: value of %.*s too long", (int)kl, s);
        memcpy(key, s, kl);
        key[kl] = 0;
        memcpy(value, eq + 1, vl);
        value[vl] = 0;
        if ((site_of_key(key, kl) >= 0) == kinds) {
            bk_status st = bk_model_config_set(c, key, value);
            if (st) return st;
        }
        s += len;
    }
    return BK_OK;
}

bk_status bk_model_config_parse(bk_model_config *c, const char *text)
{
    if (!c || !text) return bki_fail(BK_ERR_NULL, "model config: NULL text");
    bk_status st = parse_pass(c, text, 1);
    return st ? st : parse_pass(c, text, 0);
}

/* appends what bki_cfg_format writes (a line per field), each line prefixed */
static void put(char *buf, size_t cap, size_t *used, const char *prefix, const char *text)
{
    for (const char *p = text; *p;) {
        const size_t n = strcspn(p, "\n") + 1;
        const int k = snprintf(*used < cap ? buf + *used : NULL, *used < cap ? cap - *used : 0, "%s%.*s", prefix,
                               (int)n, p);
        *used += (size_t)k;
        p += n;
    }
}

/* site s's lines: its kind, then its operator's parameters */
static void format_site(const bk_model_config *c, int s, char *buf, size_t cap, size_t *used)
{
    const bki_op *op = bki_attn_op(site_kind_c(c, s));
    bk_attn_params eff;
    bki_config_site_params(c, s, &eff);
    char line[1024], prefix[32];
    snprintf(line, sizeof line, "%s=%s\n", SITES[s].key, op ? op->name : "?");
    put(buf, cap, used, "", line);
    if (!op) return;
    snprintf(prefix, sizeof prefix, "%s.", SITES[s].key);
    for (int j = 0; j < op->nfields; j++) {
        if (model_owned(op->fields[j].name)) continue;
        bki_cfg_format(eff.par.bytes, &op->fields[j], 1, line, sizeof line);
        put(buf, cap, used, prefix, line);
    }
}

size_t bk_model_config_format(const bk_model_config *c, char *buf, size_t cap)
{
    if (!c) return 0;
    size_t used = 0;
    int s = 0;
    char line[512];
    if (buf && cap) buf[0] = 0;
    for (int i = 0; i <= NFIELDS; i++) {
        while (s < NSITES && (i == NFIELDS ? !SITE_BEFORE[s] : SITE_BEFORE[s] && !strcmp(SITE_BEFORE[s], MODEL_FIELDS[i].name)))
            format_site(c, s++, buf, buf ? cap : 0, &used);
        if (i == NFIELDS) break;
        bki_cfg_format(c, &MODEL_FIELDS[i], 1, line, sizeof line);
        put(buf, buf ? cap : 0, &used, "", line);
    }
    if (buf && cap && used >= cap) buf[cap - 1] = 0;
    return used;
}

size_t bk_model_config_get(const bk_model_config *c, const char *key, char *buf, size_t cap)
{
    if (!c || !key || !buf || !cap) return 0;
    buf[0] = 0;
    const size_t need = bk_model_config_format(c, NULL, 0);
    char *text = malloc(need + 1);
    if (!text) return bki_fail(BK_ERR_NOMEM, "model config: out of memory"), 0;
    bk_model_config_format(c, text, need + 1);
    const size_t kl = strlen(key);
    size_t n = 0;
    int found = 0;
    for (const char *p = text; *p && !found;) {
        const size_t ln = strcspn(p, "\n");
        if (ln > kl && p[kl] == '=' && !strncmp(p, key, kl)) {
            n = ln - kl - 1;
            snprintf(buf, cap, "%.*s", (int)n, p + kl + 1);
            found = 1;
        }
        p += ln + (p[ln] == '\n');
    }
    free(text);
    if (!found) bki_fail(BK_ERR_PARAM, "model config: no key '%s'", key);
    return n;
}

void bki_config_site_params(const bk_model_config *c, int s, bk_attn_params *out)
{
    if (site_params_c(c, s)->kind == site_kind_c(c, s)) {
        *out = *site_params_c(c, s);
        return;
    }
    bk_model_config t = *c;
    site_reset(&t, s, site_kind_c(c, s));
    *out = *site_params_c(&t, s);
}

/* ------------------------------------------------------------------------ */
/* checks                                                                   */
/* ------------------------------------------------------------------------ */
#define NEED(cond, ...)                                                                                            \
    do {                                                                                                           \
        if (!(cond)) return bki_fail(BK_ERR_PARAM, "model config: " __VA_ARGS__);                                  \
    } while (0)

static int head_dim_of(const bk_model_config *c) { return c->head_dim > 0 ? c->head_dim : c->dim / c->heads; }
static const char *kind_name(int k) { return bk_attn_kind_name((bk_attn_kind)k); }

/* a kind a rectangular cross-attention site takes: the operator allows
 * Nq != Nk, learns no arrays (they are per-block self-attention
 * parameters) and needs no layer work of its own (attn_par.c) */
int bki_attn_cross_ok(int k)
{
    const bki_op *op = bki_attn_op(k);
    return op && (op->caps & BKI_CAP_CROSS) && op->nlearned == 0 && !(bki_attn_layer_flags(k) & BKI_LAYER_SELF_ONLY);
}

/* the scalar parameters of site s for a problem of N x N tokens: the
 * operator's own check (a size query: arrays are not read) */
static bk_status site_check(const bk_model_config *c, int s, int N)
{
    const int k = site_kind_c(c, s);
    const bki_op *op = bki_attn_op(k);
    NEED(op, "%s: unknown attention kind %d", SITES[s].key, k);
    if (bki_attn_layer_flags(k) & BKI_LAYER_HOLDS) return BK_OK; /* (its arrays come later) */
    bk_attn_params par;
    bki_config_site_params(c, s, &par);
    bki_attn_set_owned(op, par.par.bytes, c->attn_scale, 0, 0);
    const int dh = head_dim_of(c);
    const bk_attn_desc d = {1, c->heads, N, N, dh, dh, NULL, NULL};
    bki_call call = bki_call_of(op, &d, par.par.bytes);
    call.ws_mode = 1;
    if (op->check(&call) == BK_OK) return BK_OK;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", bk_last_error());
    return bki_fail(BK_ERR_PARAM, "model config: %s=%s: %s", SITES[s].key, op->name, msg);
}

/* the attention sites: kinds usable where they are, parameters valid */
static bk_status attn_check(const bk_model_config *c)
{
    const int s2s = c->arch == BK_ARCH_SEQ2SEQ, pma = !s2s && c->pool == BK_POOL_PMA;
    for (int s = 0; s < NSITES; s++)
        NEED(bki_attn_op(site_kind_c(c, s)), "unknown %s %d", SITES[s].key, site_kind_c(c, s));
    bk_status st = site_check(c, 0, 2);
    if (st) return st;
    if (s2s) {
        NEED(bki_attn_op(c->attn)->backward, "arch=seq2seq: attn=%s has no backward (compiled ASAP layers are for "
             "classifier models)", kind_name(c->attn));
        NEED(bki_attn_cross_ok(c->cross_attn),
             "cross_attn=%s: the cross-attention takes an operator with cross-attention and no learned arrays (%s)",
             kind_name(c->cross_attn), "LOT's pivots and diff's lambda are per-block parameters of self-attention "
             "layers");
        if ((st = site_check(c, 1, 2))) return st;
    }
    if (pma) {
        NEED(bki_attn_cross_ok(c->pma_attn),
             "pma_attn=%s: the PMA's attention (seeds x set) takes an operator with cross-attention and no learned "
             "arrays (softmax, sinkhorn, unbalanced, esp, ...)",
             kind_name(c->pma_attn));
        if ((st = site_check(c, 2, 2))) return st;
    }
    return BK_OK;
}

/* the input's keys */
static bk_status input_check(const bk_model_config *c)
{
    NEED(c->input >= BK_INPUT_IMAGE && c->input <= BK_INPUT_POINTS, "unknown input kind %d", (int)c->input);
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
    return BK_OK;
}

/* the encoder-decoder's keys, or the classifier's */
static bk_status arch_check(const bk_model_config *c)
{
    const int s2s = c->arch == BK_ARCH_SEQ2SEQ;
    NEED((c->cls | c->pos_embed | c->final_norm | c->qkv_bias | c->post_ln) >= 0 && c->cls <= 1 &&
             c->final_norm <= 1 && c->qkv_bias <= 1 && c->post_ln <= 1,
         "cls, final_norm, qkv_bias and post_ln are 0/1 switches");
    NEED(c->pos_embed <= (s2s ? 2 : 1), "pos_embed must be 0 (none), 1 (learned)%s (got %d)",
         s2s ? " or 2 (sinusoidal)" : "; sinusoidal positions (2) are for arch=seq2seq", c->pos_embed);
    if (s2s) {
        NEED(c->input == BK_INPUT_TOKENS, "arch=seq2seq needs input=tokens");
        NEED(c->dec_depth >= 1 && c->dec_depth <= 4096, "arch=seq2seq needs dec_depth in [1, 4096] (got %d)",
             c->dec_depth);
        NEED(c->tgt_max_len >= 1 && c->tgt_max_len <= (1 << 20), "tgt_max_len must be in [1, 2^20] (got %d)",
             c->tgt_max_len);
        NEED(c->bos >= 0 && c->bos < c->vocab && c->eos >= 0 && c->eos < c->vocab,
             "bos (%d) and eos (%d) must be ids of the vocabulary [0, %d)", c->bos, c->eos, c->vocab);
    } else {
        NEED(c->classes >= 2, "classes must be >= 2 (got %d)", c->classes);
        NEED(!c->post_ln, "post_ln=1 is implemented for arch=seq2seq only (the classifier is pre-LN)");
    }
    return BK_OK;
}

/* sizes whose products are ints in the model: bounded (a config is also
 * untrusted input, e.g. from a checkpoint's metadata) */
static bk_status size_check(const bk_model_config *c)
{
    const int64_t L = 1 << 24, dh = head_dim_of(c);
    const int64_t np = c->input == BK_INPUT_IMAGE ? (int64_t)(c->image_h / c->patch) * (c->image_w / c->patch)
                       : c->input == BK_INPUT_TOKENS ? c->max_len
                                                     : c->max_points;
    const int64_t feat = c->input == BK_INPUT_IMAGE ? (int64_t)c->patch * c->patch * c->channels : c->point_dim;
    NEED(c->dim <= L && c->heads <= L && dh * c->heads <= L && c->mlp_dim <= L && c->classes <= L && np <= L &&
             feat <= L && (int64_t)c->vocab * c->dim <= ((int64_t)1 << 34) && c->channels <= L &&
             c->otk_refs <= L && c->otk_supports <= L && (int64_t)c->otk_refs * c->otk_supports <= L &&
             (int64_t)c->otk_refs * c->otk_supports * c->dim <= L && c->otk_anchors <= L &&
             (int64_t)c->otk_refs * c->otk_supports * c->otk_anchors <= L &&
             (int64_t)c->otk_anchors * c->dim <= L && c->set_inducing <= L && (int64_t)c->pma_seeds * c->dim <= L,
         "model sizes too large (each size and product of sizes must stay below 2^24)");
    return BK_OK;
}

/* LOTFormer's ViT ingredients: the [CLS] row, the DWC branch */
static bk_status vit_check(const bk_model_config *c)
{
    const int s2s = c->arch == BK_ARCH_SEQ2SEQ;
    NEED(c->cls_attn >= BK_CLS_FULL && c->cls_attn <= BK_CLS_POL, "unknown cls_attn %d", (int)c->cls_attn);
    if (c->cls_attn != BK_CLS_FULL) {
        const char *cn = CLS_ATTN_NAMES[c->cls_attn];
        NEED(!s2s, "cls_attn=%s is the classifier's [CLS] row (an encoder-decoder has no [CLS] token)", cn);
        NEED(c->cls, "cls_attn=%s needs the [CLS] token (cls=1)", cn);
        NEED(bki_attn_op(c->attn)->backward && !(bki_attn_layer_flags(c->attn) & BKI_LAYER_WHOLE_ROWS),
             "cls_attn=%s takes an attention whose rows may leave out the [CLS] token (attn=%s: %s)", cn,
             kind_name(c->attn),
             bki_attn_op(c->attn)->backward ? "its layer's work is defined on whole attention rows"
                                            : "compiled layers are calibrated on the model's own rows");
    }
    if (c->cls_attn == BK_CLS_POL)
        NEED(c->pol_ps >= 1.0f && c->pol_ps <= 16.0f && c->pol_po >= 1.0f && c->pol_po <= 16.0f,
             "cls_attn=pol needs pol_ps and pol_po in [1, 16] (got %g, %g; a power below 1 has an unbounded "
             "derivative at 0)",
             (double)c->pol_ps, (double)c->pol_po);
    NEED(c->dwc == 0 || c->dwc == 1, "dwc is a 0/1 switch (got %d; the kernel size is dwc_kernel)", c->dwc);
    if (c->dwc) {
        NEED(!s2s && c->input == BK_INPUT_IMAGE,
             "dwc=1 convolves over the patch grid: it needs input=image and arch=classifier");
        NEED(c->dwc_kernel >= 1 && c->dwc_kernel <= 63 && c->dwc_kernel % 2 == 1,
             "dwc_kernel must be odd and in [1, 63] (got %d)", c->dwc_kernel);
    }
    return BK_OK;
}

/* the OTK pool's keys */
static bk_status otk_check(const bk_model_config *c)
{
    const int s2s = c->arch == BK_ARCH_SEQ2SEQ;
    NEED(c->otk_refs >= 0 && c->otk_supports >= 0 && c->otk_iters >= 0 && c->otk_iters <= (1 << 20),
         "OTK sizes must be >= 0 and iteration counts <= 2^20");
    NEED(c->otk_pe >= BK_OTK_PE_NONE && c->otk_pe <= BK_OTK_PE_2D, "unknown otk_pe %d", (int)c->otk_pe);
    NEED(c->otk_anchors >= 0 && c->otk_anchors <= 4096,
         "otk_anchors must be in [0, 4096] (0: identity feature map; got %d)", c->otk_anchors);
    if (s2s || c->pool != BK_POOL_OTK) {
        NEED(c->otk_anchors == 0 && c->otk_pe == BK_OTK_PE_NONE,
             "otk_anchors and otk_pe configure pool=otk (this model has %s)",
             s2s ? "arch=seq2seq" : POOL_NAMES[c->pool]);
        return BK_OK;
    }
    NEED(c->otk_refs >= 1 && c->otk_supports >= 1 && c->otk_iters >= 2 && c->otk_iters % 2 == 0 &&
             c->otk_eps > 0.0f && isfinite(c->otk_eps),
         "OTK pooling needs otk_refs, otk_supports >= 1, otk_iters even and >= 2 (half-steps: 2 L for L "
         "iterations) and otk_eps > 0");
    if (c->otk_anchors > 0)
        NEED(c->otk_sigma > 0.0f && isfinite(c->otk_sigma) && c->otk_eta >= 0.0f && isfinite(c->otk_eta),
             "otk_anchors=%d (Nystrom map) needs otk_sigma > 0 and otk_eta >= 0 (got %g, %g)", c->otk_anchors,
             (double)c->otk_sigma, (double)c->otk_eta);
    if (c->otk_pe != BK_OTK_PE_NONE)
        NEED(c->otk_sigma_pos > 0.0f && isfinite(c->otk_sigma_pos), "otk_pe=%s needs otk_sigma_pos > 0 (got %g)",
             OTK_PE_NAMES[c->otk_pe], (double)c->otk_sigma_pos);
    if (c->otk_pe == BK_OTK_PE_2D) {
        const int s = (int)lround(sqrt((double)c->otk_supports));
        NEED(c->input == BK_INPUT_IMAGE,
             "otk_pe=2d weighs the image's patch grid: it needs input=image (otk_pe=1d orders a sequence)");
        NEED(!c->cls, "otk_pe=2d pools the patch grid only: set cls=0 (the [CLS] token has no place on the grid)");
        NEED(s * s == c->otk_supports,
             "otk_pe=2d puts the supports on a square grid: otk_supports must be a square (got %d)", c->otk_supports);
    }
    return BK_OK;
}

/* the Set Transformer keys (set_block, set_inducing, pool = pma, pma_seeds) */
static bk_status set_check(const bk_model_config *c)
{
    const int s2s = c->arch == BK_ARCH_SEQ2SEQ;
    NEED(c->set_block == BK_SET_SAB || c->set_block == BK_SET_ISAB, "unknown set_block %d", (int)c->set_block);
    if (c->set_block == BK_SET_ISAB) {
        NEED(!s2s, "set_block=isab is a block of the classifier (arch=seq2seq has encoder blocks)");
        NEED(c->set_inducing >= 1, "set_block=isab needs set_inducing >= 1 inducing points (got %d)", c->set_inducing);
        NEED(bki_attn_cross_ok(c->attn),
             "set_block=isab: attn=%s; an ISAB block's attentions are rectangular cross-attentions (inducing points "
             "x set, set x inducing points), which take an operator with cross-attention and no learned arrays "
             "(softmax, sinkhorn, unbalanced, esp, ...; %s)",
             kind_name(c->attn),
             bki_attn_op(c->attn) && !bki_attn_op(c->attn)->backward
                 ? "compiled layers are fitted to square self-attention"
                 : "LOT's pivots and diff's lambda are self-attention parameters");
        NEED(c->cls_attn == BK_CLS_FULL && !c->dwc,
             "set_block=isab takes cls_attn=full and dwc=0 (the [CLS] row and the DWC branch are self-attention "
             "ingredients)");
    }
    if (!s2s && c->pool == BK_POOL_PMA)
        NEED(c->pma_seeds >= 1, "pool=pma needs pma_seeds >= 1 (got %d)", c->pma_seeds);
    return BK_OK;
}

bk_status bk_model_config_check(const bk_model_config *c)
{
    if (!c) return bki_fail(BK_ERR_NULL, "model config: NULL");
    NEED(c->pool >= BK_POOL_CLS && c->pool <= BK_POOL_PMA, "unknown pooling %d", (int)c->pool);
    NEED(c->arch == BK_ARCH_CLASSIFIER || c->arch == BK_ARCH_SEQ2SEQ, "unknown arch %d", (int)c->arch);
    bk_status st = input_check(c);
    if (st) return st;
    NEED(c->dim >= 1 && c->depth >= 0 && c->depth <= 4096 && c->heads >= 1,
         "dim >= 1, depth in [0, 4096], heads >= 1 required");
    NEED(c->head_dim > 0 || c->dim % c->heads == 0, "heads (%d) do not divide dim (%d); set head_dim explicitly",
         c->heads, c->dim);
    NEED(c->head_dim >= 0 && c->mlp_dim >= 0, "head_dim and mlp_dim must be >= 0");
    if ((st = arch_check(c)) || (st = size_check(c))) return st;
    NEED(c->dropout >= 0.0f && c->dropout < 1.0f, "dropout must be in [0, 1) (got %g)", (double)c->dropout);
    NEED(c->ln_eps > 0.0f, "ln_eps must be > 0");
    NEED(c->attn_scale >= 0.0f, "attn_scale must be >= 0 (0 = 1/sqrt(head_dim))");
    NEED(c->arch == BK_ARCH_SEQ2SEQ || c->pool != BK_POOL_CLS || c->cls, "pool=cls needs cls=1");
    NEED(c->lot_learn >= BK_LOT_LEARN_BOTH && c->lot_learn <= BK_LOT_LEARN_NONE, "unknown lot_learn %d",
         (int)c->lot_learn);
    if ((st = attn_check(c)) || (st = vit_check(c)) || (st = otk_check(c))) return st;
    return set_check(c);
}
