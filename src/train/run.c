/* run.c -- the run configuration (one key=value namespace over run, model
 * and optimiser keys; config files), the run stored in a checkpoint, and
 * opening a run's data (birkhoff/train.h). */
#include "../nn/nn.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- run keys: one table drives parsing and the text form ---- */
enum { K_STR, K_INT, K_I64, K_U64, K_FLOAT };
typedef struct {
    const char *name;
    int type;
    size_t off;
    double lo, hi; /* numeric bounds (inclusive)                             */
    size_t cap;    /* strings                                                */
} run_key;

#define RK(n, t, f, lo, hi) {n, t, offsetof(bk_run_config, f), lo, hi, 0}
#define RS(n, f) {n, K_STR, offsetof(bk_run_config, f), 0, 0, sizeof(((bk_run_config *)0)->f)}
static const run_key KEYS[] = {
    RS("data", data),
    RS("data_dir", data_dir),
    RK("train_limit", K_I64, data_config.limit, 0, 1e12),
    RK("test_limit", K_I64, test_limit, 0, 1e12),
    RK("seq_len", K_INT, data_config.max_len, 0, 65536),
    RK("tgt_len", K_INT, data_config.tgt_max_len, 0, 65536),
    RK("min_len", K_INT, data_config.min_len, 0, 4096),
    RK("listops_depth", K_INT, data_config.listops_depth, 1, 10),
    RK("points", K_INT, data_config.points, 16, 4096),
    RK("noise", K_FLOAT, data_config.noise, 0, 1),
    RK("gen_train", K_I64, data_config.gen_train, 1, 1e9),
    RK("gen_test", K_I64, data_config.gen_test, 1, 1e9),
    RK("data_seed", K_U64, data_config.gen_seed, 0, 0),
    RK("epochs", K_INT, epochs, 1, 100000),
    RK("batch", K_INT, batch, 1, 65536),
    RK("micro", K_INT, micro, 0, 65536),
    RK("ls", K_FLOAT, ls, 0, 0.999),
    RK("seed", K_U64, seed, 0, 0),
    RK("threads", K_INT, threads, 0, 1024),
    RK("log_every", K_INT, log_every, 1, 1000000),
    RK("eval_batch", K_INT, eval_batch, 1, 65536),
    RK("stop_after", K_I64, stop_after, 0, 1e15),
    RS("progress", progress),
    RS("init", init),
    RK("esp_anneal", K_FLOAT, esp_anneal, 0, 1),
    RS("eval_esp_sort", eval_esp_sort),
    RK("otk_init", K_I64, otk_init, 0, 1e9),
    /* user datasets and splits (docs/DATA.md) */
    RS("data_valid", data_valid),
    RS("data_test", data_test),
    RK("valid_frac", K_FLOAT, data_config.valid_frac, 0, 0.9),
    RK("test_frac", K_FLOAT, data_config.test_frac, 0, 0.9),
    RK("split_seed", K_U64, data_config.split_seed, 0, 0),
    RK("array_kind", K_INT, data_config.array_kind, 0, 3),
    RK("label_column", K_INT, data_config.label_column, 1, 1024),
    RK("text_column", K_INT, data_config.text_column, 1, 1024),
    RK("text_header", K_INT, data_config.text_header, 0, 1),
    RS("spm_model", spm_model),
    RK("spm_vocab", K_INT, data_config.spm_vocab, 0, 1 << 20),
    RK("shuffle_window", K_I64, shuffle_window, 0, 1e15),
    RK("patience", K_INT, patience, 0, 100000),
    RS("select", select),
};
#define NKEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

bk_run_config bk_run_config_default(void)
{
    bk_run_config r;
    memset(&r, 0, sizeof r);
    snprintf(r.data, sizeof r.data, "mnist");
    r.data_config = bk_data_config_default();
    r.epochs = 5;
    r.batch = 64;
    r.seed = 1;
    r.log_every = 1;
    r.eval_batch = 256;
    snprintf(r.progress, sizeof r.progress, "auto");
    snprintf(r.select, sizeof r.select, "auto");
    r.data_config.valid_frac = 0.1f; /* model selection on a validation split */
    r.model = bk_model_config_default();
    r.optim = bk_optim_config_default();
    r.optim.sched = BK_SCHED_COSINE; /* over the run (total_steps 0), after the automatic warm-up (-1) */
    r.optim.warmup = -1;
    return r;
}

/* is key one of the "key=" lines of a formatted config? */
static int in_format(const char *text, const char *key)
{
    size_t k = strlen(key);
    for (const char *p = text; p && *p;) {
        if (strncmp(p, key, k) == 0 && p[k] == '=') return 1;
        p = strchr(p, '\n');
        if (p) p++;
    }
    return 0;
}

static bk_status set_run_key(bk_run_config *r, const run_key *k, const char *v)
{
    char *p = (char *)r + k->off, *end;
    errno = 0;
    if (k->type == K_STR) {
        if (strlen(v) >= k->cap) return bki_fail(BK_ERR_PARAM, "%s: value too long", k->name);
        const long bad = bki_bad_utf8(v); /* a run's values go into its checkpoints' JSON header */
        if (bad >= 0)
            return bki_fail(BK_ERR_PARAM, "%s: the value is not UTF-8 (byte 0x%02x at offset %ld)", k->name,
                            (unsigned char)v[bad], bad);
        if (!strcmp(k->name, "data") && !bk_data_known(v))
            return bki_fail(BK_ERR_PARAM,
                            "data=%s: unknown dataset (mnist, fashion-mnist, digits, spam, spam-spm, listops, shapes, "
                            "bible, or FORMAT:PATH with FORMAT npy, npz, tsv, csv, parallel or ids: docs/DATA.md)", v);
        if (!strcmp(k->name, "select") && strcmp(v, "auto") && strcmp(v, "acc") && strcmp(v, "loss"))
            return bki_fail(BK_ERR_PARAM, "select=%s: expected auto, acc or loss", v);
        if (!strcmp(k->name, "progress") && strcmp(v, "auto") && strcmp(v, "bar") && strcmp(v, "plain") &&
            strcmp(v, "none"))
            return bki_fail(BK_ERR_PARAM, "progress=%s: expected auto, bar, plain or none", v);
        if (!strcmp(k->name, "eval_esp_sort") && *v && strcmp(v, "model") && strcmp(v, "soft") && strcmp(v, "hard"))
            return bki_fail(BK_ERR_PARAM, "eval_esp_sort=%s: expected model, soft or hard", v);
        snprintf(p, k->cap, "%s", v);
        return BK_OK;
    }
    if (k->type == K_FLOAT) {
        double x = strtod(v, &end);
        /* bounds on the stored float, so that formatted values load again */
        if (errno || end == v || *end || !isfinite(x) || (float)x < (float)k->lo || (float)x > (float)k->hi)
            return bki_fail(BK_ERR_PARAM, "%s=%s: expected a number in [%g, %g]", k->name, v, k->lo, k->hi);
        *(float *)p = (float)x;
        return BK_OK;
    }
    if (k->type == K_U64) {
        if (*v == '-') return bki_fail(BK_ERR_PARAM, "%s=%s: expected a non-negative integer", k->name, v);
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end)
            return bki_fail(BK_ERR_PARAM, "%s=%s: expected a non-negative integer", k->name, v);
        *(uint64_t *)p = x;
        return BK_OK;
    }
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < (long long)k->lo || x > (long long)k->hi)
        return bki_fail(BK_ERR_PARAM, "%s=%s: expected an integer in [%.0f, %.0f]", k->name, v, k->lo, k->hi);
    if (k->type == K_INT) *(int *)p = (int)x;
    else *(int64_t *)p = x;
    return BK_OK;
}

bk_status bk_run_config_set(bk_run_config *r, const char *key, const char *value)
{
    bki_clear_error();
    if (!r || !key || !value) return bki_fail(BK_ERR_NULL, "bk_run_config_set: NULL argument");
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(KEYS[i].name, key) == 0) return set_run_key(r, &KEYS[i], value);
    char fm[8192];
    if (bki_model_config_key(&r->model, key)) return bk_model_config_set(&r->model, key, value);
    bk_optim_config_format(&r->optim, fm, sizeof fm);
    if (in_format(fm, key)) return bk_optim_config_set(&r->optim, key, value);
    return bki_fail(BK_ERR_PARAM, "unknown key '%s' (docs/TRAINING.md lists the run, model and optimiser keys)", key);
}

bk_status bk_run_config_load(bk_run_config *r, const char *path)
{
    bki_clear_error();
    if (!r || !path) return bki_fail(BK_ERR_NULL, "bk_run_config_load: NULL argument");
    /* bounded (an endless input stops), no NUL byte, not a directory */
    bk_text_config tc = bk_text_config_default();
    tc.max_line = BK_RUN_CONFIG_MAX_LINE;
    tc.max_bytes = BK_RUN_CONFIG_MAX_BYTES;
    bk_text_reader *f = NULL;
    bk_status st = bk_text_open(path, &tc, &f);
    if (st != BK_OK) return st;
    char *line;
    int ln = 0;
    while (st == BK_OK && (st = bk_text_next(f, &line, NULL)) == BK_OK && line) {
        ln++;
        char *h = strchr(line, '#');
        if (h) *h = 0;
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        char *e = s + strlen(s);
        while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) *--e = 0;
        if (!*s) continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            st = bki_fail(BK_ERR_PARAM, "%s:%d: expected 'key = value'", path, ln);
            break;
        }
        char *ke = eq;
        while (ke > s && (ke[-1] == ' ' || ke[-1] == '\t')) ke--;
        *ke = 0;
        char *v = eq + 1;
        while (*v == ' ' || *v == '\t') v++;
        if ((st = bk_run_config_set(r, s, v)) != BK_OK) {
            char msg[600];
            snprintf(msg, sizeof msg, "%s", bk_last_error());
            bki_fail(st, "%s:%d: %s", path, ln, msg);
        }
    }
    bk_text_close(f);
    return st;
}

/* text built in a caller's buffer, whole lines only; n counts what the
 * whole text needs */
typedef struct {
    char *buf;
    size_t cap, n;
} text_out;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void put(text_out *t, const char *fmt, ...)
{
    char line[1100];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (t->buf && t->n + (size_t)k < t->cap) {
        memcpy(t->buf + t->n, line, (size_t)k + 1);
    }
    t->n += (size_t)k;
}

size_t bk_run_config_format(const bk_run_config *r, char *buf, size_t cap)
{
    text_out t = {cap ? buf : NULL, cap, 0};
    if (t.buf) t.buf[0] = 0;
    if (!r) return 0;
    for (int i = 0; i < NKEYS; i++) {
        const run_key *k = &KEYS[i];
        const char *p = (const char *)r + k->off;
        switch (k->type) {
        case K_STR: put(&t, "%s=%s\n", k->name, p); break;
        case K_INT: put(&t, "%s=%d\n", k->name, *(const int *)p); break;
        case K_I64: put(&t, "%s=%lld\n", k->name, (long long)*(const int64_t *)p); break;
        case K_U64: put(&t, "%s=%llu\n", k->name, (unsigned long long)*(const uint64_t *)p); break;
        default: put(&t, "%s=%.9g\n", k->name, (double)*(const float *)p); break;
        }
    }
    /* the model's and optimiser's own formatters, into what is left */
    int fits = t.buf && t.n < t.cap;
    t.n += bk_model_config_format(&r->model, fits ? t.buf + t.n : NULL, fits ? t.cap - t.n : 0);
    fits = t.buf && t.n < t.cap;
    t.n += bk_optim_config_format(&r->optim, fits ? t.buf + t.n : NULL, fits ? t.cap - t.n : 0);
    return t.n;
}

/* every run key within what bk_run_config_set accepts (a struct filled in
 * C may hold anything): each value goes through the setter again */
static bk_status check_run_keys(const bk_run_config *r)
{
    bk_run_config tmp = *r;
    for (int i = 0; i < NKEYS; i++) {
        const run_key *k = &KEYS[i];
        const char *p = (const char *)r + k->off;
        char v[600];
        switch (k->type) {
        case K_STR: snprintf(v, sizeof v, "%.*s", (int)strnlen(p, k->cap - 1), p); break;
        case K_INT: snprintf(v, sizeof v, "%d", *(const int *)p); break;
        case K_I64: snprintf(v, sizeof v, "%lld", (long long)*(const int64_t *)p); break;
        case K_U64: continue;
        default: snprintf(v, sizeof v, "%.9g", (double)*(const float *)p); break;
        }
        bk_status st = set_run_key(&tmp, k, v);
        if (st != BK_OK) return st;
    }
    return BK_OK;
}

bk_status bk_run_config_resolve(bk_run_config *r, const bk_dataset *train)
{
    bki_clear_error();
    if (!r || !train) return bki_fail(BK_ERR_NULL, "bk_run_config_resolve: NULL argument");
    bk_status st = check_run_keys(r);
    if (st != BK_OK) return st;
    bk_data_model_shape(train, &r->model);
    st = bk_model_config_check(&r->model);
    if (st != BK_OK) return st;
    if (!bk_op_has_backward(bk_op_at(r->model.attn)))
        return bki_fail(BK_ERR_PARAM,
                        "attn=asap cannot be trained: train a Sinkhorn model, then `birkhoff asap compile`");
    char v[32];
    const int has_t = bk_model_config_get(&r->model, "attn.t", v, sizeof v) > 0,
              has_sort = bk_model_config_get(&r->model, "attn.sort", v, sizeof v) > 0;
    bki_clear_error();
    if (!has_t && r->esp_anneal > 0)
        return bki_fail(BK_ERR_PARAM, "esp_anneal=%g anneals ESP's SoftSort temperature; this run has attn=%s",
                        (double)r->esp_anneal, bk_attn_kind_name(r->model.attn));
    if (!has_sort && (!strcmp(r->eval_esp_sort, "soft") || !strcmp(r->eval_esp_sort, "hard")))
        return bki_fail(BK_ERR_PARAM, "eval_esp_sort=%s chooses ESP's sort; this run has attn=%s", r->eval_esp_sort,
                        bk_attn_kind_name(r->model.attn));
    if (r->otk_init > 0 && (r->model.arch != BK_ARCH_CLASSIFIER || r->model.pool != BK_POOL_OTK))
        return bki_fail(BK_ERR_PARAM, "otk_init=%lld fits an OTK pool; this run's model has %s", (long long)r->otk_init,
                        r->model.arch != BK_ARCH_CLASSIFIER ? "arch=seq2seq" : "no pool=otk");
    if (r->otk_init > 0 && r->init[0])
        return bki_fail(BK_ERR_PARAM, "otk_init=%lld fits a new model's OTK pool; init=%s starts from trained weights "
                                      "(set one of them)", (long long)r->otk_init, r->init);
    if (r->micro > r->batch) r->micro = 0;
    const int64_t per_epoch = (bk_data_info(train)->n + r->batch - 1) / r->batch;
    bki_optim_plan(&r->optim, per_epoch * (int64_t)r->epochs);
    return BK_OK;
}


int bk_run_has_valid(const bk_run_config *r) { return r && (r->data_config.valid_frac > 0 || r->data_valid[0]); }

bk_data_config bk_run_data_config(const bk_run_config *r)
{
    bk_data_config o = r->data_config;
    o.dir = r->data_dir[0] ? r->data_dir : NULL;
    o.valid_spec = r->data_valid;
    o.test_spec = r->data_test;
    o.spm_model = r->spm_model;
    return o;
}

/* ---- the run stored in a checkpoint (metadata "extra") ---- */
int bk_run_extra_get(const char *extra, const char *key, char *out, size_t cap)
{
    if (!key || !out || cap == 0) return 0;
    size_t k = strlen(key);
    for (const char *p = extra; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t L = e ? (size_t)(e - p) : strlen(p);
        if (L > k && strncmp(p, key, k) == 0 && p[k] == '=') {
            size_t v = L - k - 1;
            if (v >= cap) v = cap - 1;
            memcpy(out, p + k + 1, v);
            out[v] = 0;
            return 1;
        }
        p = e ? e + 1 : NULL;
    }
    return 0;
}

int bki_run_meta_line(const char *extra, const char *line)
{
    /* data_test= is the run key (the test split's files) since issue 43, the
     * test split's version before it (a run that wrote no
     * data_test_version=) */
    return !strncmp(line, "pos_", 4) || !strncmp(line, "data_train=", 11) || !strncmp(line, "data_valid_version=", 19) ||
           !strncmp(line, "data_test_version=", 18) ||
           (!strncmp(line, "data_test=", 10) && !strstr(extra, "data_test_version="));
}

/* the run config stored in a checkpoint's extra: the non-position lines,
 * the attention kinds (kinds = 1) or the others */
static bk_status extra_pass(const char *extra, bk_run_config *r, int kinds)
{
    for (const char *p = extra; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t L = e ? (size_t)(e - p) : strlen(p);
        char line[1024];
        if (L >= sizeof line) return bki_fail(BK_ERR_FORMAT, "checkpoint metadata line too long");
        memcpy(line, p, L);
        line[L] = 0;
        p = e ? e + 1 : NULL;
        char *eq = strchr(line, '=');
        if (!eq || bki_run_meta_line(extra, line) || !strncmp(line, "teacher", 7) || !strncmp(line, "calib_", 6) ||
            !strncmp(line, "swapped_from=", 13))
            continue;
        *eq = 0;
        if ((!strcmp(line, "attn") || !strcmp(line, "cross_attn") || !strcmp(line, "pma_attn")) != kinds) continue;
        bk_status st = bk_run_config_set(r, line, eq + 1);
        if (st != BK_OK) return st;
    }
    return BK_OK;
}

/* the kinds first, so that the keys before the operator schema convert as
 * they were meant (as bk_model_config_parse) */
static bk_status extra_config(const char *extra, bk_run_config *r)
{
    bk_status st = extra_pass(extra, r, 1);
    return st ? st : extra_pass(extra, r, 0);
}

bk_status bk_run_config_from_extra(const char *extra, bk_run_config *r)
{
    bki_clear_error();
    if (!r) return bki_fail(BK_ERR_NULL, "bk_run_config_from_extra: r is NULL");
    *r = bk_run_config_default();
    r->data_config.valid_frac = 0; /* a run stored before the key: no validation split */
    r->optim.decay_embed = 1;      /* ... and its token tables decayed */
    if (!extra || !strstr(extra, "pos_epoch="))
        return bki_fail(BK_ERR_FORMAT, "the checkpoint was not written by `birkhoff train` (no run metadata)");
    return extra_config(extra, r);
}

bk_status bk_run_load(const char *path, int max_batch, bk_model **m, bk_run_config *r, char **extra_out)
{
    bki_clear_error();
    if (!path || !m || !r) return bki_fail(BK_ERR_NULL, "bk_run_load: NULL argument");
    *m = NULL;
    if (extra_out) *extra_out = NULL;
    char *extra = NULL;
    bk_status st = bk_checkpoint_load(path, max_batch, m, NULL, &extra);
    if (st != BK_OK) return st;
    if ((st = bk_run_config_from_extra(extra, r)) != BK_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", bk_last_error());
        bki_fail(st, "%s: %s", path, msg);
        free(extra);
        bk_model_free(*m);
        *m = NULL;
        return st;
    }
    r->model = *bk_model_get_config(*m);
    if (extra_out) *extra_out = extra;
    else free(extra);
    return BK_OK;
}

bk_status bk_run_open_data(const bk_run_config *r, const char *name, const char *dir, bk_split split, int64_t limit,
                           const bk_model_config *mc, bk_dataset **out)
{
    bki_clear_error();
    if (!r || !mc || !out) return bki_fail(BK_ERR_NULL, "bk_run_open_data: NULL argument");
    *out = NULL;
    bk_data_config o = bk_run_data_config(r);
    if (dir) o.dir = dir;
    o.limit = limit;
    if (mc->arch == BK_ARCH_SEQ2SEQ) {
        /* sentence pairs within the model's lengths (longer ones dropped) */
        o.max_len = mc->max_len;
        o.tgt_max_len = mc->tgt_max_len;
    }
    bk_dataset *ds;
    bk_status st = bk_data_open(name ? name : r->data, split, &o, &ds);
    if (st != BK_OK) return st;
    bk_model_config c = *mc;
    bk_data_model_shape(ds, &c);
    if (mc->arch == BK_ARCH_SEQ2SEQ) {
        /* (a split's caps are the model's: its shape is its vocabulary) */
        c.max_len = mc->max_len;
        c.tgt_max_len = mc->tgt_max_len;
    }
    if (c.arch != mc->arch || c.tgt_max_len != mc->tgt_max_len || c.input != mc->input || c.classes != mc->classes || c.channels != mc->channels || c.image_h != mc->image_h ||
        c.image_w != mc->image_w || c.vocab != mc->vocab || c.max_len != mc->max_len || c.max_points != mc->max_points ||
        c.point_dim != mc->point_dim) {
        st = bki_fail(BK_ERR_SHAPE, "dataset %s does not have the shape the model was trained on",
                      bk_data_info(ds)->name);
        bk_data_close(ds);
        return st;
    }
    *out = ds;
    return BK_OK;
}
