/* run.c -- the run configuration, batches, evaluation and attention
 * diagnostics shared by train, eval, plot and asap compile (run.h). */
#include "run.h"

#include <errno.h>
#include <math.h>
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

#define RK(n, t, f, lo, hi) {n, t, offsetof(run_config, f), lo, hi, 0}
static const run_key KEYS[] = {
    {"data", K_STR, offsetof(run_config, data), 0, 0, sizeof(((run_config *)0)->data)},
    {"data_dir", K_STR, offsetof(run_config, data_dir), 0, 0, sizeof(((run_config *)0)->data_dir)},
    RK("train_limit", K_I64, dopt.limit, 0, 1e12),
    RK("test_limit", K_I64, test_limit, 0, 1e12),
    RK("seq_len", K_INT, dopt.max_len, 0, 65536),
    RK("min_len", K_INT, dopt.min_len, 0, 4096),
    RK("listops_depth", K_INT, dopt.listops_depth, 1, 10),
    RK("points", K_INT, dopt.points, 16, 4096),
    RK("noise", K_FLOAT, dopt.noise, 0, 1),
    RK("gen_train", K_I64, dopt.gen_train, 1, 1e9),
    RK("gen_test", K_I64, dopt.gen_test, 1, 1e9),
    RK("data_seed", K_U64, dopt.gen_seed, 0, 0),
    RK("epochs", K_INT, epochs, 1, 100000),
    RK("batch", K_INT, batch, 1, 65536),
    RK("micro", K_INT, micro, 0, 65536),
    RK("ls", K_FLOAT, ls, 0, 0.999),
    RK("seed", K_U64, seed, 0, 0),
    RK("threads", K_INT, threads, 0, 1024),
    RK("log_every", K_INT, log_every, 1, 1000000),
    RK("eval_batch", K_INT, eval_batch, 1, 65536),
    RK("stop_after", K_I64, stop_after, 0, 1e15),
    {"progress", K_STR, offsetof(run_config, progress), 0, 0, sizeof(((run_config *)0)->progress)},
};
#define NKEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

void run_config_default(run_config *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->data, sizeof r->data, "mnist");
    r->dopt = data_opts_default();
    r->epochs = 5;
    r->batch = 64;
    r->seed = 1;
    r->log_every = 1;
    r->eval_batch = 256;
    snprintf(r->progress, sizeof r->progress, "auto");
    r->model = bk_model_config_default();
    r->optim = bk_optim_config_default();
}

int run_is_key(const char *key)
{
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(KEYS[i].name, key) == 0) return 1;
    return 0;
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

static int set_run_key(run_config *r, const run_key *k, const char *v, char *err, size_t cap)
{
    char *p = (char *)r + k->off, *end;
    errno = 0;
    if (k->type == K_STR) {
        if (strlen(v) >= k->cap) return snprintf(err, cap, "%s: value too long", k->name), 0;
        if (!strcmp(k->name, "data") && !data_known(v))
            return snprintf(err, cap, "data=%s: unknown dataset (mnist, fashion-mnist, digits, spam, listops, shapes)", v),
                   0;
        if (!strcmp(k->name, "progress") && strcmp(v, "auto") && strcmp(v, "bar") && strcmp(v, "plain") &&
            strcmp(v, "none"))
            return snprintf(err, cap, "progress=%s: expected auto, bar, plain or none", v), 0;
        snprintf(p, k->cap, "%s", v);
        return 1;
    }
    if (k->type == K_FLOAT) {
        double x = strtod(v, &end);
        /* bounds on the stored float, so that formatted values load again */
        if (errno || end == v || *end || !isfinite(x) || (float)x < (float)k->lo || (float)x > (float)k->hi)
            return snprintf(err, cap, "%s=%s: expected a number in [%g, %g]", k->name, v, k->lo, k->hi), 0;
        *(float *)p = (float)x;
        return 1;
    }
    if (k->type == K_U64) {
        if (*v == '-') return snprintf(err, cap, "%s=%s: expected a non-negative integer", k->name, v), 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end) return snprintf(err, cap, "%s=%s: expected a non-negative integer", k->name, v), 0;
        *(uint64_t *)p = x;
        return 1;
    }
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < (long long)k->lo || x > (long long)k->hi)
        return snprintf(err, cap, "%s=%s: expected an integer in [%.0f, %.0f]", k->name, v, k->lo, k->hi), 0;
    if (k->type == K_INT) *(int *)p = (int)x;
    else *(int64_t *)p = x;
    return 1;
}

int run_config_set(run_config *r, const char *key, const char *value, char *err, size_t cap)
{
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(KEYS[i].name, key) == 0) return set_run_key(r, &KEYS[i], value, err, cap);
    char fm[4096];
    bk_model_config_format(&r->model, fm, sizeof fm);
    if (in_format(fm, key)) {
        if (bk_model_config_set(&r->model, key, value) != BK_OK) return snprintf(err, cap, "%s", bk_last_error()), 0;
        return 1;
    }
    bk_optim_config_format(&r->optim, fm, sizeof fm);
    if (in_format(fm, key)) {
        if (bk_optim_config_set(&r->optim, key, value) != BK_OK) return snprintf(err, cap, "%s", bk_last_error()), 0;
        return 1;
    }
    return snprintf(err, cap, "unknown key '%s' (docs/TRAINING.md lists the run, model and optimiser keys)", key), 0;
}

int run_config_load(run_config *r, const char *path, char *err, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return snprintf(err, cap, "%s: cannot open (%s)", path, strerror(errno)), 0;
    char line[4096];
    int ln = 0, ok = 1;
    while (ok && fgets(line, sizeof line, f)) {
        ln++;
        size_t n = strlen(line);
        if (n == sizeof line - 1 && line[n - 1] != '\n') {
            snprintf(err, cap, "%s:%d: line too long", path, ln);
            ok = 0;
            break;
        }
        char *h = strchr(line, '#');
        if (h) *h = 0;
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        char *e = s + strlen(s);
        while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) *--e = 0;
        if (!*s) continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(err, cap, "%s:%d: expected 'key = value'", path, ln);
            ok = 0;
            break;
        }
        char *ke = eq;
        while (ke > s && (ke[-1] == ' ' || ke[-1] == '\t')) ke--;
        *ke = 0;
        char *v = eq + 1;
        while (*v == ' ' || *v == '\t') v++;
        char msg[600];
        if (!run_config_set(r, s, v, msg, sizeof msg)) {
            snprintf(err, cap, "%s:%d: %s", path, ln, msg);
            ok = 0;
        }
    }
    fclose(f);
    return ok;
}

char *run_config_format(const run_config *r)
{
    size_t cap = 16384, n = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    for (int i = 0; i < NKEYS; i++) {
        const run_key *k = &KEYS[i];
        const char *p = (const char *)r + k->off;
        switch (k->type) {
        case K_STR: n += (size_t)snprintf(s + n, cap - n, "%s=%s\n", k->name, p); break;
        case K_INT: n += (size_t)snprintf(s + n, cap - n, "%s=%d\n", k->name, *(const int *)p); break;
        case K_I64: n += (size_t)snprintf(s + n, cap - n, "%s=%lld\n", k->name, (long long)*(const int64_t *)p); break;
        case K_U64:
            n += (size_t)snprintf(s + n, cap - n, "%s=%llu\n", k->name, (unsigned long long)*(const uint64_t *)p);
            break;
        default: n += (size_t)snprintf(s + n, cap - n, "%s=%.9g\n", k->name, (double)*(const float *)p); break;
        }
    }
    n += bk_model_config_format(&r->model, s + n, cap - n);
    n += bk_optim_config_format(&r->optim, s + n, cap - n);
    if (n >= cap) {
        free(s);
        return NULL;
    }
    return s;
}

int run_config_resolve(run_config *r, const data_set *train, char *err, size_t cap)
{
    data_model_shape(train, &r->model);
    if (bk_model_config_check(&r->model) != BK_OK) return snprintf(err, cap, "%s", bk_last_error()), 0;
    if (r->model.attn == BK_ATTN_ASAP)
        return snprintf(err, cap, "attn=asap cannot be trained: train a Sinkhorn model, then `birkhoff asap compile`"), 0;
    if (r->micro > r->batch) r->micro = 0;
    const int64_t per_epoch = (train->n + r->batch - 1) / r->batch;
    if (r->optim.sched == BK_SCHED_COSINE && r->optim.total_steps == 0)
        r->optim.total_steps = per_epoch * (int64_t)r->epochs;
    return 1;
}

/* ---- the run stored in a checkpoint (metadata "extra") ---- */
/* the value of "key=" in an extra text (copied into out), 1 if present */
int run_extra_get(const char *extra, const char *key, char *out, size_t cap)
{
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

/* the run config stored in a checkpoint's extra: the non-position lines */
static int extra_config(const char *extra, run_config *r, char *err, size_t cap)
{
    for (const char *p = extra; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t L = e ? (size_t)(e - p) : strlen(p);
        char line[1024];
        if (L >= sizeof line) return snprintf(err, cap, "checkpoint metadata line too long"), 0;
        memcpy(line, p, L);
        line[L] = 0;
        p = e ? e + 1 : NULL;
        char *eq = strchr(line, '=');
        if (!eq || !strncmp(line, "pos_", 4) || !strncmp(line, "data_train=", 11) || !strncmp(line, "data_test=", 10) ||
            !strncmp(line, "teacher", 7) || !strncmp(line, "calib_", 6))
            continue;
        *eq = 0;
        if (!run_config_set(r, line, eq + 1, err, cap)) return 0;
    }
    return 1;
}

int run_from_checkpoint_extra(const char *extra, run_config *r, char *err, size_t cap)
{
    run_config_default(r);
    if (!extra || !strstr(extra, "pos_epoch="))
        return snprintf(err, cap, "the checkpoint was not written by `birkhoff train` (no run metadata)"), 0;
    return extra_config(extra, r, err, cap);
}

/* ---- batches ---- */
int run_buf_init(run_buf *b, const data_set *ds, int cap, int classes)
{
    memset(b, 0, sizeof *b);
    b->cap = cap;
    size_t xs = ds->kind == BK_INPUT_IMAGE    ? (size_t)ds->channels * ds->h * ds->w
                : ds->kind == BK_INPUT_POINTS ? (size_t)ds->points * 3
                                              : 0;
    if (xs) b->x = malloc(sizeof(float) * xs * (size_t)cap);
    if (ds->kind == BK_INPUT_TOKENS) b->tok = malloc(sizeof(int32_t) * (size_t)ds->max_len * (size_t)cap);
    b->len = malloc(sizeof(int32_t) * (size_t)cap);
    b->lab = malloc(sizeof(int32_t) * (size_t)cap);
    b->idx = malloc(sizeof(int64_t) * (size_t)cap);
    b->logits = malloc(sizeof(float) * (size_t)classes * (size_t)cap);
    if ((xs && !b->x) || (ds->kind == BK_INPUT_TOKENS && !b->tok) || !b->len || !b->lab || !b->idx || !b->logits) {
        run_buf_free(b);
        return 0;
    }
    return 1;
}

void run_buf_free(run_buf *b)
{
    free(b->x);
    free(b->tok);
    free(b->len);
    free(b->lab);
    free(b->idx);
    free(b->logits);
    memset(b, 0, sizeof *b);
}

int run_buf_fill(run_buf *b, const data_set *ds, int B, bk_batch *out)
{
    if (B > b->cap || !data_fill(ds, b->idx, B, b->x, b->tok, b->len, b->lab)) return 0;
    out->B = B;
    out->x = b->x;
    out->tokens = b->tok;
    out->len = ds->kind == BK_INPUT_IMAGE ? NULL : b->len;
    out->labels = b->lab;
    return 1;
}

/* ---- evaluation ---- */
int run_argmax(const float *z, int C)
{
    int p = 0;
    for (int j = 1; j < C; j++)
        if (z[j] > z[p]) p = j;
    return p;
}

void run_eval_free(run_eval *ev)
{
    free(ev->confusion);
    free(ev->pred);
    ev->confusion = NULL;
    ev->pred = NULL;
}

int run_evaluate(bk_model *m, const data_set *ds, int64_t n, int batch, int keep_pred, run_eval *ev, char *err,
                 size_t cap)
{
    memset(ev, 0, sizeof *ev);
    const int C = bk_model_get_config(m)->classes;
    if (n <= 0 || n > ds->n) n = ds->n;
    ev->n = n;
    ev->classes = C;
    ev->confusion = calloc((size_t)C * (size_t)C, sizeof(int64_t));
    if (keep_pred) ev->pred = malloc(sizeof(int32_t) * (size_t)n);
    run_buf b;
    if (!ev->confusion || (keep_pred && !ev->pred) || !run_buf_init(&b, ds, batch, C)) {
        run_eval_free(ev);
        return snprintf(err, cap, "out of memory"), 0;
    }
    double total = 0.0;
    int64_t correct = 0;
    int ok = 1;
    for (int64_t s = 0; ok && s < n; s += batch) {
        const int B = (int)(n - s < batch ? n - s : batch);
        for (int i = 0; i < B; i++) b.idx[i] = s + i;
        bk_batch bt;
        double loss;
        if (!run_buf_fill(&b, ds, B, &bt)) {
            snprintf(err, cap, "cannot read samples %lld..%lld of %s", (long long)s, (long long)(s + B), ds->name);
            ok = 0;
        } else if (bk_model_forward(m, &bt, 0, 0.0f, b.logits, &loss) != BK_OK) {
            snprintf(err, cap, "%s", bk_last_error());
            ok = 0;
        } else {
            total += loss * B;
            for (int i = 0; i < B; i++) {
                const int p = run_argmax(b.logits + (size_t)i * C, C);
                correct += p == b.lab[i];
                ev->confusion[(size_t)b.lab[i] * C + p]++;
                if (ev->pred) ev->pred[s + i] = p;
            }
        }
    }
    run_buf_free(&b);
    if (!ok) {
        run_eval_free(ev);
        return 0;
    }
    ev->loss = total / (double)n;
    ev->acc = (double)correct / (double)n;
    return 1;
}

int run_attention_diag(bk_model *m, const data_set *ds, int B, run_attn_diag *per, float *colsums, int64_t *ncol,
                       char *err, size_t cap)
{
    const bk_model_config *c = bk_model_get_config(m);
    const int H = c->heads, T = bk_model_tokens(m);
    if (B > ds->n) B = (int)ds->n;
    run_buf b;
    float *A = malloc(sizeof(float) * (size_t)B * H * T * T);
    if (!A || !run_buf_init(&b, ds, B, c->classes)) {
        free(A);
        return snprintf(err, cap, "out of memory"), 0;
    }
    for (int i = 0; i < B; i++) b.idx[i] = i;
    bk_batch bt;
    int ok = run_buf_fill(&b, ds, B, &bt);
    if (!ok) snprintf(err, cap, "cannot read the samples of %s", ds->name);
    if (ok && bk_model_forward(m, &bt, 0, 0.0f, NULL, NULL) != BK_OK) {
        snprintf(err, cap, "%s", bk_last_error());
        ok = 0;
    }
    int64_t nc = 0;
    for (int l = 0; ok && l < c->depth; l++) {
        if (bk_model_attention(m, l, A) != BK_OK) {
            snprintf(err, cap, "%s", bk_last_error());
            ok = 0;
            break;
        }
        double rd = 0, cd = 0, en = 0, ue = 0;
        int64_t nr = 0, ncl = 0;
        nc = 0;
        for (int s = 0; s < B; s++) {
            const int L = c->input == BK_INPUT_IMAGE ? T : bt.len[s] + c->cls;
            for (int h = 0; h < H; h++) {
                const float *P = A + ((size_t)s * H + h) * T * T;
                for (int i = 0; i < L; i++) {
                    double rs = 0, e = 0;
                    for (int j = 0; j < L; j++) {
                        const double a = P[(size_t)i * T + j];
                        rs += a;
                        if (a > 0) e -= a * log(a);
                    }
                    rd += fabs(rs - 1.0);
                    en += e;
                    ue += log((double)L);
                    nr++;
                }
                for (int j = 0; j < L; j++) {
                    double cs = 0;
                    for (int i = 0; i < L; i++) cs += P[(size_t)i * T + j];
                    cd += fabs(cs - 1.0);
                    if (colsums) colsums[(size_t)l * B * H * T + (size_t)nc] = (float)cs;
                    nc++;
                    ncl++;
                }
            }
        }
        per[l].row_dev = rd / (double)nr;
        per[l].col_dev = cd / (double)ncl;
        per[l].entropy = en / (double)nr;
        per[l].uniform_entropy = ue / (double)nr;
    }
    if (ncol) *ncol = nc;
    free(A);
    run_buf_free(&b);
    return ok;
}

const char *run_attn_name(const bk_model_config *c)
{
    static const char *const names[] = {"softmax", "sinkhorn", "esp", "lot", "asap"};
    return c->attn >= BK_ATTN_SOFTMAX && c->attn <= BK_ATTN_ASAP ? names[c->attn] : "?";
}
