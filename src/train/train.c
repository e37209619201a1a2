/* train.c -- the training loop of a run: epochs in a seeded sample order,
 * metrics (JSONL and CSV), a checkpoint per epoch, stopping on a caller's
 * flag and resuming bit for bit (birkhoff/train.h, docs/TRAINING.md). */
#include "../nn/nn.h"
#include "dp.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int mkdir_p(const char *path)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return 0;
            *p = '/';
        }
    return mkdir(tmp, 0777) == 0 || errno == EEXIST;
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

bk_status bk_run_write_text(const char *path, const char *text)
{
    bki_clear_error();
    if (!path || !text) return bki_fail(BK_ERR_NULL, "bk_run_write_text: NULL argument");
    return bk_file_write(path, 0, text, strlen(text));
}

/* a file of the run directory: named by the run, so a symlink there is
 * replaced, never followed */
static bk_status run_write_text(const char *path, const char *text)
{
    return bk_file_write(path, BK_OUT_NOFOLLOW, text, strlen(text));
}

/* the number after "key": in one of our records (NAN if absent) */
static double rec_num(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    return p ? strtod(p + strlen(pat), NULL) : NAN;
}

/* The step (or epoch) numbers of the records a resumed run keeps, in file
 * order, against those the run wrote: every `every`-th up to `bound` (the
 * checkpoint's step, or epoch). The first gap is [lo, hi]; missing counts
 * the records absent in all. */
typedef struct {
    int64_t every, bound, last, lo, hi, missing;
} rec_seq;

static void seq_gap(rec_seq *q, int64_t from, int64_t to)
{
    if (!q->missing) {
        q->lo = from;
        q->hi = to;
    }
    q->missing += (to - from) / q->every + 1;
}
static void seq_see(rec_seq *q, int64_t x)
{
    if (x <= q->last) return; /* a repeat */
    if (x > q->last + q->every) seq_gap(q, q->last + q->every, x - q->every);
    q->last = x;
}
static void seq_end(rec_seq *q)
{
    const int64_t want = q->bound / q->every * q->every;
    if (want > q->last) seq_gap(q, q->last + q->every, want);
}

/* What a line of a metrics file (csv 0: metrics.jsonl, 1: steps.csv, 2:
 * epochs.csv) is: 0 a step record, 1 an epoch record (*num: its step or
 * epoch), 2 the CSV header, -1 not a record (cut by a killed run, edited,
 * holding a NUL byte) */
static int rec_kind(int csv, const char *line, size_t len, int64_t *num)
{
    if (strlen(line) != len) return -1;
    if (csv) {
        if (!strncmp(line, csv == 1 ? "step," : "epoch,", csv == 1 ? 5 : 6)) return 2;
        char *end;
        errno = 0;
        const long long v = strtoll(line, &end, 10);
        if (!(line[0] >= '0' && line[0] <= '9') || *end != ',' || errno) return -1;
        *num = v;
        return csv == 1 ? 0 : 1;
    }
    const int k = !strncmp(line, "{\"type\":\"step\",", 15) ? 0 : !strncmp(line, "{\"type\":\"epoch\",", 16) ? 1 : -1;
    const double v = k < 0 || line[len - 1] != '}' ? NAN : rec_num(line, k ? "epoch" : "step");
    if (!(v >= 0 && v < 9e18)) return -1;
    *num = (int64_t)v;
    return k;
}

/* Keeps the records of a metrics file up to the checkpoint (resume: records
 * written after it, and lines that are not records, are dropped), noting
 * the numbers kept in seq[0] (steps) and seq[1] (epochs); rewritten
 * atomically. Read by the library's bounded reader (BK_TEXT_MAX_LINE,
 * _BYTES, _LINES); a missing file holds no records. 0 after bki_fail. */
static int filter_lines(const char *path, int csv, int64_t step, int64_t epoch, rec_seq seq[2])
{
    if (!exists(path)) return 1;
    bk_text_config tc = bk_text_config_default();
    tc.nul_ok = 1; /* a line holding one is not a record: dropped */
    bk_text_reader *f = NULL;
    char *line, *out = NULL;
    size_t len, n = 0, ocap = 0;
    int ok = bk_text_open(path, &tc, &f) == BK_OK;
    bk_status rs;
    while (ok && (rs = bk_text_next(f, &line, &len)) == BK_OK && line) {
        int64_t num = 0;
        const int k = rec_kind(csv, line, len, &num);
        if (k < 0 || (k == 0 && num > step) || (k == 1 && num > epoch)) continue;
        if (k < 2) seq_see(&seq[k], num);
        if (n + len + 2 > ocap) {
            ocap = 2 * (n + len + 2);
            char *p = realloc(out, ocap);
            if (!p) ok = bki_fail(BK_ERR_NOMEM, "%s: out of memory", path) == BK_OK;
            else out = p;
        }
        if (ok) {
            memcpy(out + n, line, len);
            n += len;
            out[n++] = '\n';
        }
    }
    if (ok && rs != BK_OK) ok = 0;
    bk_text_close(f);
    if (ok) ok = run_write_text(path, out ? (out[n] = 0, out) : "") == BK_OK;
    free(out);
    return ok;
}

/* After filter_lines: the records missing before the checkpoint (a file
 * cut or edited), appended to note (cap bytes) as one sentence per file;
 * the run goes on with the gap, and the CLI prints the note as a warning. */
static void note_gaps(char *note, size_t cap, const char *path, int csv, rec_seq seq[2])
{
    static const char *const what[2] = {"step", "epoch"};
    for (int k = 0; k < 2; k++) {
        if ((csv == 1 && k == 1) || (csv == 2 && k == 0)) continue;
        rec_seq *q = &seq[k];
        seq_end(q);
        if (!q->missing) continue;
        const size_t used = strlen(note);
        if (used + 1 >= cap) return;
        char range[64], every[48] = "";
        if (q->lo == q->hi) snprintf(range, sizeof range, "%s %lld", what[k], (long long)q->lo);
        else snprintf(range, sizeof range, "%ss %lld-%lld", what[k], (long long)q->lo, (long long)q->hi);
        if (!k) snprintf(every, sizeof every, ", logged every %lld", (long long)q->every);
        char one[1700];
        snprintf(one, sizeof one,
                 "%s%.1100s: %lld %s record%s before the checkpoint's %s %lld %s missing (the first: %s%s; the file "
                 "was cut or edited): the resumed run keeps the gap",
                 used ? "; " : "", path, (long long)q->missing, what[k], q->missing > 1 ? "s" : "", what[k],
                 (long long)q->bound, q->missing > 1 ? "are" : "is", range, every);
        const size_t add = strlen(one) < cap - used - 1 ? strlen(one) : cap - used - 1;
        memcpy(note + used, one, add);
        note[used + add] = 0;
    }
}

/* the run configuration's text (malloc'd) */
static char *config_text(const bk_run_config *r)
{
    size_t n = bk_run_config_format(r, NULL, 0);
    char *s = malloc(n + 1);
    if (s) bk_run_config_format(r, s, n + 1);
    return s;
}

/* the position and running sums stored with a checkpoint (broadcast as
 * bytes from rank 0 in data-parallel training: plain data only) */
typedef struct {
    int epoch;          /* epochs completed                                */
    int64_t batch;      /* batches done in the current epoch               */
    int64_t step;       /* optimiser steps in total                        */
    double loss_sum;    /* current epoch: sum of per-sample losses         */
    int64_t correct, seen;
    double elapsed;     /* training seconds before this process            */
    /* a run with a validation split: model selection and early stopping */
    int best_epoch;     /* the epoch best.safetensors holds (0: none yet)  */
    int bad_epochs;     /* epochs since then without a better metric       */
    double best_loss, best_acc; /* its validation loss and accuracy        */
} run_pos;

/* the versions of a run's splits (valid: NULL without a validation split) */
typedef struct {
    const char *train, *valid, *test;
} run_versions;

/* A checkpoint's run metadata: the position, the data versions (the test
 * split's as data_test_version, since the run key data_test names its
 * files; a run before issue 43 wrote data_test=VERSION), the ranks, the
 * configuration. The validation lines only for a run with one. */
static char *extra_text(const bk_run_config *r, const run_pos *p, const run_versions *v, int ranks)
{
    char *cfg = config_text(r);
    if (!cfg) return NULL;
    size_t n = strlen(cfg) + 4096;
    char *s = malloc(n);
    if (!s) {
        free(cfg);
        return NULL;
    }
    char best[512] = "";
    if (v->valid)
        snprintf(best, sizeof best, "pos_best_epoch=%d\npos_bad_epochs=%d\npos_best_loss=%a\npos_best_acc=%a\n"
                                    "data_valid_version=%.300s\n",
                 p->best_epoch, p->bad_epochs, p->best_loss, p->best_acc, v->valid);
    snprintf(s, n,
             "pos_epoch=%d\npos_batch=%lld\npos_step=%lld\npos_loss_sum=%a\npos_correct=%lld\npos_seen=%lld\n"
             "pos_elapsed=%a\n%sdata_train=%s\ndata_test_version=%s\npos_ranks=%d\n%s",
             p->epoch, (long long)p->batch, (long long)p->step, p->loss_sum, (long long)p->correct, (long long)p->seen,
             p->elapsed, best, v->train, v->test, ranks, cfg);
    free(cfg);
    return s;
}

static int parse_pos(const char *extra, run_pos *p)
{
    char v[128];
    memset(p, 0, sizeof *p);
    if (!bk_run_extra_get(extra, "pos_epoch", v, sizeof v)) return 0;
    p->epoch = atoi(v);
    if (!bk_run_extra_get(extra, "pos_batch", v, sizeof v)) return 0;
    p->batch = strtoll(v, NULL, 10);
    if (!bk_run_extra_get(extra, "pos_step", v, sizeof v)) return 0;
    p->step = strtoll(v, NULL, 10);
    if (!bk_run_extra_get(extra, "pos_loss_sum", v, sizeof v)) return 0;
    p->loss_sum = strtod(v, NULL);
    if (!bk_run_extra_get(extra, "pos_correct", v, sizeof v)) return 0;
    p->correct = strtoll(v, NULL, 10);
    if (!bk_run_extra_get(extra, "pos_seen", v, sizeof v)) return 0;
    p->seen = strtoll(v, NULL, 10);
    if (bk_run_extra_get(extra, "pos_elapsed", v, sizeof v)) p->elapsed = strtod(v, NULL);
    /* model selection (a run with a validation split) */
    if (bk_run_extra_get(extra, "pos_best_epoch", v, sizeof v)) p->best_epoch = atoi(v);
    if (bk_run_extra_get(extra, "pos_bad_epochs", v, sizeof v)) p->bad_epochs = atoi(v);
    if (bk_run_extra_get(extra, "pos_best_loss", v, sizeof v)) p->best_loss = strtod(v, NULL);
    if (bk_run_extra_get(extra, "pos_best_acc", v, sizeof v)) p->best_acc = strtod(v, NULL);
    return p->epoch >= 0 && p->batch >= 0 && p->step >= 0 && p->seen >= 0 && p->best_epoch >= 0 &&
           p->best_epoch <= p->epoch && p->bad_epochs >= 0 && p->bad_epochs <= p->epoch;
}

/* The run stored in dir/last.safetensors: its configuration, position and
 * metadata (*extra, malloc'd). */
static bk_status read_run(const char *dir, bk_run_config *r, run_pos *pos, char **extra)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/last.safetensors", dir);
    *extra = NULL;
    if (!exists(path)) return bki_fail(BK_ERR_IO, "%s: no checkpoint to resume from (%s missing)", dir, path);
    bk_model *probe = NULL;
    bk_status st = bk_checkpoint_load(path, 1, &probe, NULL, extra);
    if (st != BK_OK) return st;
    bk_model_free(probe);
    st = bk_run_config_from_extra(*extra, r);
    if (st == BK_OK && !parse_pos(*extra, pos))
        st = bki_fail(BK_ERR_FORMAT, "bad run position in the metadata");
    if (st != BK_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", bk_last_error());
        bki_fail(st, "%s: %s", path, msg);
        free(*extra);
        *extra = NULL;
        return st;
    }
    r->stop_after = 0; /* per process, like threads and progress */
    return BK_OK;
}

bk_status bk_train_resume_config(const char *dir, bk_run_config *r, int *epochs_done)
{
    bki_clear_error();
    if (!dir || !r) return bki_fail(BK_ERR_NULL, "bk_train_resume_config: NULL argument");
    run_pos pos;
    char *extra;
    bk_status st = read_run(dir, r, &pos, &extra);
    free(extra);
    if (st == BK_OK && epochs_done) *epochs_done = pos.epoch;
    return st;
}

/* A resumed run keeps its configuration but for the keys that may change:
 * the first other key that differs (NULL: none). */
static const char *changed_key(const bk_run_config *stored, const bk_run_config *r, char *key, size_t cap)
{
    bk_run_config a = *r;
    a.epochs = stored->epochs;
    a.optim.total_steps = stored->optim.total_steps; /* a re-plan: check_plan */
    a.threads = stored->threads;
    a.stop_after = stored->stop_after;
    memcpy(a.progress, stored->progress, sizeof a.progress);
    memcpy(a.data_dir, stored->data_dir, sizeof a.data_dir);
    char *x = config_text(stored), *y = config_text(&a);
    const char *res = NULL;
    if (!x || !y) {
        snprintf(key, cap, "(out of memory)");
        res = key;
    } else if (strcmp(x, y)) {
        const char *p = x, *q = y;
        while (*p && *p == *q) p++, q++;
        while (p > x && p[-1] != '\n') p--;
        snprintf(key, cap, "%.*s", (int)strcspn(p, "="), p);
        res = key;
    }
    free(x);
    free(y);
    return res;
}

/* Stages checkpoint dir/name (o NULL: the weights alone) in set */
static bk_status stage_ckpt(bk_outset *set, const char *dir, const char *name, bk_model *m, bk_optim *o,
                            const bk_run_config *r, const run_pos *p, const run_versions *v, int ranks)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *ex = extra_text(r, p, v, ranks);
    if (!ex) return bki_fail(BK_ERR_NOMEM, "out of memory");
    const bk_status st = bk_checkpoint_stage(set, path, BK_OUT_NOFOLLOW | BK_OUT_SYNC, m, o, ex);
    free(ex);
    return st;
}

/* Checkpoints committed together, all or none: names[0..n) of the same
 * model (with the optimiser, but for a name starting "best": weights
 * alone) */
static bk_status save_ckpts(const char *dir, int n, const char *const *names, bk_model *m, bk_optim *o,
                            const bk_run_config *r, const run_pos *p, const run_versions *v, int ranks)
{
    bk_outset *set = bk_outset_create();
    bk_status st = set ? BK_OK : bki_fail(BK_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && st == BK_OK; i++)
        st = stage_ckpt(set, dir, names[i], m, strncmp(names[i], "best", 4) ? o : NULL, r, p, v, ranks);
    return bki_outset_done(set, st);
}

static bk_status save_ckpt(const char *dir, const char *name, bk_model *m, bk_optim *o, const bk_run_config *r,
                           const run_pos *p, const run_versions *v, int ranks)
{
    return save_ckpts(dir, 1, &name, m, o, r, p, v, ranks);
}

typedef struct {
    FILE *jsonl, *steps, *epochs;
} run_logs;

static void logs_close(run_logs *L)
{
    if (L->jsonl) fclose(L->jsonl);
    if (L->steps) fclose(L->steps);
    if (L->epochs) fclose(L->epochs);
    memset(L, 0, sizeof *L);
}

static void logs_flush(run_logs *L)
{
    if (!L->jsonl) return; /* a rank other than 0 writes no metrics */
    fflush(L->jsonl);
    fflush(L->steps);
    fflush(L->epochs);
}

static int logs_open(const char *dir, int fresh, int valid, run_logs *L)
{
    char p[1100];
    memset(L, 0, sizeof *L);
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    L->jsonl = bki_open_log(p, fresh);
    snprintf(p, sizeof p, "%s/steps.csv", dir);
    int new_steps = fresh || !exists(p);
    if (L->jsonl) L->steps = bki_open_log(p, fresh);
    snprintf(p, sizeof p, "%s/epochs.csv", dir);
    int new_epochs = fresh || !exists(p);
    if (L->steps) L->epochs = bki_open_log(p, fresh);
    if (!L->jsonl || !L->steps || !L->epochs) {
        logs_close(L);
        return 0;
    }
    if (new_steps) fprintf(L->steps, "step,epoch,batch,loss,acc,lr,gnorm,samples_per_s,time_s\n");
    if (new_epochs)
        fprintf(L->epochs, "epoch,step,train_loss,train_acc,%s_loss,%s_acc,attn_row_dev,attn_col_dev,"
                           "attn_entropy,time_s\n", valid ? "valid" : "test", valid ? "valid" : "test");
    return 1;
}

/* --force over an old run: its epoch checkpoints and summary go */
static void remove_old_run(const char *dir)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/ckpt", dir);
    DIR *d = opendir(path);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        int ep;
        char tail[32], f[1400];
        if (sscanf(de->d_name, "epoch-%d.%31s", &ep, tail) == 2 && !strcmp(tail, "safetensors")) {
            snprintf(f, sizeof f, "%s/%s", path, de->d_name);
            remove(f);
        }
    }
    if (d) closedir(d);
    snprintf(path, sizeof path, "%s/summary.json", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/best.safetensors", dir);
    remove(path);
}

/* Everything one call holds, released by train_free. */
typedef struct {
    bk_run_config r;
    bk_dataset *tr, *va, *te; /* va: the validation split (NULL: none; the test split is evaluated each epoch) */
    run_versions ver;
    bk_model *m;
    bk_optim *o;
    char *extra;
    int64_t *order;
    bk_layer_diag *diag;
    bk_data_batch buf;
    run_logs logs;
    bki_dp dp;              /* the ranks of a data-parallel run               */
    char spm_written[1100]; /* a new run's spm.model, written at setup        */
    char notice[4096];      /* resume: records missing before the checkpoint  */
} train_state;

static void train_free(train_state *s)
{
    logs_close(&s->logs);
    bki_dp_free(&s->dp);
    bk_data_batch_free(&s->buf);
    free(s->order);
    free(s->diag);
    free(s->extra);
    bk_optim_free(s->o);
    bk_model_free(s->m);
    bk_data_close(s->tr);
    bk_data_close(s->va);
    bk_data_close(s->te);
}

/* A new run's model from the checkpoint r->init: its weights, seed and
 * dropout counter, with the run's model configuration (the attention swapped
 * when the run's differs; any other difference is refused). */
static bk_status init_model(const bk_run_config *r, int maxb, bk_model **out)
{
    bk_model *m0 = NULL;
    bk_status st = bk_checkpoint_load(r->init, maxb, &m0, NULL, NULL);
    if (st != BK_OK) return st;
    char a[4096], b[4096];
    bk_model_config_format(bk_model_get_config(m0), a, sizeof a);
    bk_model_config_format(&r->model, b, sizeof b);
    if (!strcmp(a, b)) {
        *out = m0;
        return BK_OK;
    }
    st = bk_model_swap(m0, &r->model, NULL, 0, maxb, out);
    bk_model_free(m0);
    if (st != BK_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", bk_last_error());
        bki_fail(st, "init=%s: the run's model must be the checkpoint's but for its attention: %s", r->init, msg);
    }
    return st;
}

/* otk_init: the new model's OTK pool fitted to its own pooled sets of the
 * first otk_init training samples (all of them when fewer) */
static bk_status otk_init_model(bk_model *m, const bk_dataset *tr, const bk_run_config *r)
{
    const int64_t n64 = r->otk_init < bk_data_info(tr)->n ? r->otk_init : bk_data_info(tr)->n;
    const int n = n64 < (1 << 30) ? (int)n64 : 1 << 30;
    bk_data_batch buf;
    bk_status st = bk_data_batch_init(&buf, tr, n > 0 ? n : 1);
    if (st != BK_OK) return st;
    bk_batch b;
    for (int i = 0; i < n; i++) buf.idx[i] = i;
    if ((st = bk_data_batch_fill(&buf, tr, n, &b)) == BK_OK) {
        bk_kmeans_config kc = bk_kmeans_config_default();
        kc.seed = r->seed;
        st = bk_model_otk_fit(m, &b, &kc, NULL);
    }
    bk_data_batch_free(&buf);
    if (st != BK_OK) {
        char msg[480];
        snprintf(msg, sizeof msg, "%s", bk_last_error());
        bki_fail(st, "otk_init=%lld: %s", (long long)r->otk_init, msg);
    }
    return st;
}

/* The attention of epoch e (0-based): ESP's annealed SoftSort temperature
 * t0 factor^e, t0 the run's esp_t (a pure function of the epoch, so a resumed
 * run continues with the same t). */
static bk_status epoch_attention(bk_model *m, const bk_run_config *r, int e)
{
    if (!(r->esp_anneal > 0.0f)) return BK_OK;
    bk_model_config c = *bk_model_get_config(m);
    char v[64];
    if (!bk_model_config_get(&r->model, "attn.t", v, sizeof v)) return BK_ERR_PARAM;
    const float t = bk_esp_anneal(strtof(v, NULL), r->esp_anneal, e);
    snprintf(v, sizeof v, "%.9g", (double)t);
    bk_status st = bk_model_config_set(&c, "attn.t", v);
    if (st == BK_OK) st = bk_model_set_attn_config(m, &c);
    if (st != BK_OK) {
        char msg[480];
        snprintf(msg, sizeof msg, "%s", bk_last_error());
        bki_fail(st, "esp_anneal: epoch %d (t = %g): %s", e + 1, (double)t, msg);
    }
    return st;
}

/* the model's attn.sort ("" when its attention has none) */
static void attn_sort(const bk_model_config *c, char *v, size_t cap)
{
    if (!bk_model_config_get(c, "attn.sort", v, cap)) bki_clear_error();
}

/* The end-of-epoch evaluation and diagnostics (diag_n > 0: of the first
 * diag_n samples), with the sort eval_esp_sort asks of an ESP model (the
 * model's own attention is restored after). */
static bk_status evaluate_epoch(bk_model *m, const bk_run_config *r, const bk_dataset *te, int diag_n,
                                bk_layer_diag *diag, bk_eval_result *er)
{
    const bk_model_config keep = *bk_model_get_config(m);
    const int hard = !strcmp(r->eval_esp_sort, "hard"), soft = !strcmp(r->eval_esp_sort, "soft");
    bk_status st = BK_OK;
    char was[16], now[16];
    attn_sort(&keep, was, sizeof was);
    if (*was && (hard || soft)) {
        bk_model_config c = keep;
        st = bk_model_config_set(&c, "attn.sort", soft ? "soft" : "hard");
        if (st == BK_OK) st = bk_model_set_attn_config(m, &c);
    }
    if (st == BK_OK) st = bk_evaluate(m, te, 0, r->eval_batch, 0, er);
    if (st == BK_OK && diag_n > 0) st = bk_attention_diag(m, te, diag_n, diag, NULL, NULL);
    attn_sort(bk_model_get_config(m), now, sizeof now);
    if (strcmp(was, now)) {
        char msg[480];
        snprintf(msg, sizeof msg, "%s", bk_last_error());
        const bk_status s2 = bk_model_set_attn_config(m, &keep); /* (never grows a tape: cannot fail) */
        if (st == BK_OK) st = s2;
        else bki_fail(st, "%s", msg);
    }
    return st;
}

/* A resumed run continues its schedule as planned when the run started:
 * every schedule is a function of the step, so a run extended (epochs above
 * the stored ones) is the uninterrupted run of the new length -- but for a
 * cosine schedule, which ends at total_steps: training past its end would
 * run at lr_min, so an extension past it is refused unless total_steps is
 * re-planned (a new value; 0: over the whole extended run, set by
 * bk_run_config_resolve), which must end after the current step. r is the
 * resolved configuration; planned and stored_epochs the checkpoint's. */
static bk_status check_plan(const bk_run_config *r, int64_t planned, int stored_epochs, const run_pos *pos,
                            int64_t nb, const char *dir)
{
    const bk_optim_config *c = &r->optim;
    const int64_t end = nb * (int64_t)r->epochs;
    if (c->total_steps != planned) {
        if (c->sched != BK_SCHED_COSINE)
            return bki_fail(BK_ERR_PARAM, "total_steps=%lld re-plans a cosine schedule; this run has a schedule that "
                                          "is a function of the step alone (only epochs extends it)",
                            (long long)c->total_steps);
        if (c->total_steps <= pos->step || c->total_steps <= c->warmup)
            return bki_fail(BK_ERR_PARAM, "total_steps=%lld: a re-planned cosine schedule must end after the current "
                                          "step %lld and the warm-up (%d steps)",
                            (long long)c->total_steps, (long long)pos->step, c->warmup);
    }
    if (c->sched == BK_SCHED_COSINE && r->epochs > stored_epochs && end > c->total_steps)
        return bki_fail(BK_ERR_PARAM, "%s: its cosine schedule ends at step %lld (total_steps=%lld; %d epochs of %lld "
                                      "steps were planned), so epochs=%d would train steps %lld to %lld at lr_min=%g; "
                                      "re-plan the rest of the schedule with total_steps=N (N >= %lld; 0: over the "
                                      "whole extended run), or start a new run from its weights with "
                                      "init=%s/last.safetensors",
                        dir, (long long)c->total_steps, (long long)c->total_steps, stored_epochs, (long long)nb,
                        r->epochs, (long long)c->total_steps + 1, (long long)end, (double)c->lr_min, (long long)end,
                        dir);
    return BK_OK;
}

/* The checkpoint's optimiser with the run's re-planned total_steps (its
 * state and step kept). */
static bk_status replan_optim(train_state *s)
{
    const bk_optim_config *oc = bk_optim_get_config(s->o);
    if (oc->total_steps == s->r.optim.total_steps) return BK_OK;
    bk_optim_config c = *oc;
    c.total_steps = s->r.optim.total_steps;
    bk_optim *o2 = NULL;
    bk_status st = bk_optim_create(&c, s->m, &o2);
    if (st != BK_OK) return st;
    const size_t P = (size_t)bk_model_num_params(s->m);
    for (int k = 0; k < bki_optim_slots(o2); k++)
        memcpy(bki_optim_slot(o2, k), bki_optim_slot(s->o, k), sizeof(float) * P);
    bki_optim_set_step(o2, bk_optim_step_count(s->o));
    bk_optim_free(s->o);
    s->o = o2;
    return BK_OK;
}

/* A text run's SentencePiece model: when the training split was encoded
 * with one the run trained (spm_model ""), root writes it to dir/spm.model
 * and every rank records that path in spm_model, so that the held-out
 * splits, a resumed run and `birkhoff eval` / `translate` read the same
 * model (the other ranks of a data-parallel run, which may not see the file
 * yet, encode their held-out splits with the model the reader trains again
 * from the same texts: the same bytes). A resumed run whose directory moved
 * reads dir/spm.model when the recorded path is gone. *own receives 1 when
 * the held-out splits may read the file. */
static bk_status run_spm_model(train_state *s, const char *dir, int root, int resume, int *own)
{
    bk_run_config *r = &s->r;
    const void *model = NULL;
    size_t len = 0;
    char path[1100];
    *own = 1;
    snprintf(path, sizeof path, "%s/spm.model", dir);
    if (resume) {
        const char *base = strrchr(r->spm_model, '/');
        if (r->spm_model[0] && !exists(r->spm_model) && base && !strcmp(base, "/spm.model") && exists(path) &&
            strlen(path) < sizeof r->spm_model)
            snprintf(r->spm_model, sizeof r->spm_model, "%.1023s", path);
        return BK_OK;
    }
    if (r->spm_model[0] || bk_data_spm_model(s->tr, &model, &len) != BK_OK) {
        bki_clear_error();
        return BK_OK;
    }
    if (strlen(path) >= sizeof r->spm_model)
        return bki_fail(BK_ERR_PARAM, "%s: the run directory's path is too long to record its spm.model", dir);
    if (root) {
        if (!mkdir_p(dir)) return bki_fail(BK_ERR_IO, "cannot create %s (%s)", dir, strerror(errno));
        bk_status st = bk_file_write(path, BK_OUT_NOFOLLOW, model, len);
        if (st != BK_OK) return st;
        snprintf(s->spm_written, sizeof s->spm_written, "%s", path);
    }
    *own = root;
    snprintf(r->spm_model, sizeof r->spm_model, "%.1023s", path);
    return BK_OK;
}

/* The run's splits: training, validation (bk_run_has_valid), test; the
 * held-out ones within test_limit and, for sentence pairs, the lengths the
 * training split fixes (longer pairs dropped, as in training); a resumed
 * run's data versions checked against its checkpoint's. */
static bk_status open_splits(train_state *s, const char *dir, int root, int resume)
{
    bk_run_config *r = &s->r;
    bk_data_config dop = bk_run_data_config(r);
    bk_status st = bk_data_open(r->data, BK_SPLIT_TRAIN, &dop, &s->tr);
    int own = 1;
    if (st == BK_OK) st = run_spm_model(s, dir, root, resume, &own);
    if (st != BK_OK) return st;
    dop = bk_run_data_config(r);
    if (!own) dop.spm_model = NULL;
    dop.limit = r->test_limit;
    const bk_dataset_info *tri = bk_data_info(s->tr);
    if (tri->seq2seq) {
        dop.max_len = tri->max_len;
        dop.tgt_max_len = tri->tgt_max_len;
    }
    if (bk_run_has_valid(r))
        if ((st = bk_data_open(r->data, BK_SPLIT_VALID, &dop, &s->va)) != BK_OK) return st;
    if ((st = bk_data_open(r->data, BK_SPLIT_TEST, &dop, &s->te)) != BK_OK) return st;
    s->ver.train = tri->version;
    s->ver.valid = s->va ? bk_data_info(s->va)->version : NULL;
    s->ver.test = bk_data_info(s->te)->version;
    if (!resume) return BK_OK;
    /* (a checkpoint before issue 43 names the test split's version data_test) */
    const char *key[3] = {"data_train", "data_valid_version", "data_test_version"};
    const char *now[3] = {s->ver.train, s->ver.valid, s->ver.test};
    if (!strstr(s->extra, "data_test_version=")) key[2] = "data_test";
    for (int i = 0; i < 3; i++) {
        char v1[600];
        if (now[i] && bk_run_extra_get(s->extra, key[i], v1, sizeof v1) && strcmp(v1, now[i]))
            return bki_fail(BK_ERR_FORMAT, "the data changed since the run started (checkpoint: %s; now: %s)", v1,
                            now[i]);
    }
    return BK_OK;
}

/* Steps 1..: data, model, run directory, up to the first step. Only root
 * (rank 0 of a data-parallel run, or the one process) writes the run
 * directory; the other ranks read what they need (the resumed checkpoint,
 * init=) and hold no metrics files. */
static bk_status train_setup(train_state *s, const char *dir, bk_train_mode mode, run_pos *pos,
                             bk_train_result *res, int rank)
{
    const int root = rank == 0;
    bk_run_config *r = &s->r;
    const int resume = mode == BK_TRAIN_RESUME;
    char path[1100];
    snprintf(path, sizeof path, "%s/last.safetensors", dir);
    bk_status st;
    int64_t planned = 0; /* resume: the stored schedule's total_steps and epochs */
    int stored_epochs = 0;
    if (root && mode == BK_TRAIN_NEW && exists(path)) {
        res->stage = BK_TRAIN_STAGE_CONFIG;
        return bki_fail(BK_ERR_PARAM, "%s already holds a run: resume it (BK_TRAIN_RESUME) or overwrite it "
                                      "(BK_TRAIN_OVERWRITE)", dir);
    }
    if (resume) {
        bk_run_config stored;
        if ((st = read_run(dir, &stored, pos, &s->extra)) != BK_OK) return st;
        planned = stored.optim.total_steps;
        stored_epochs = stored.epochs;
        char key[128];
        if (changed_key(&stored, r, key, sizeof key)) {
            res->stage = BK_TRAIN_STAGE_CONFIG;
            return bki_fail(BK_ERR_PARAM, "a resumed run keeps its configuration: only epochs, threads, progress, "
                                          "stop_after, data_dir and a cosine schedule's total_steps may change (%s "
                                          "differs)", key);
        }
        if (pos->epoch >= r->epochs)
            return bki_fail(BK_ERR_PARAM, "%s has finished its %d epochs; set epochs above %d to continue it", dir,
                            pos->epoch, pos->epoch);
        if (r->patience > 0 && pos->best_epoch > 0 && pos->bad_epochs >= r->patience)
            return bki_fail(BK_ERR_PARAM, "%s has finished: it stopped early at epoch %d, %d epochs without a better "
                                          "validation metric than epoch %d's (patience=%d); start a new run from its "
                                          "best weights with init=%s/best.safetensors",
                            dir, pos->epoch, pos->bad_epochs, pos->best_epoch, r->patience, dir);
    }
    if (r->threads > 0) bk_set_num_threads(r->threads);

    if ((st = open_splits(s, dir, root, resume)) != BK_OK) return st;
    const bk_dataset_info *tri = bk_data_info(s->tr), *evi = bk_data_info(s->va ? s->va : s->te);
    if ((st = bk_run_config_resolve(r, s->tr)) != BK_OK ||
        (resume && (st = check_plan(r, planned, stored_epochs, pos, (tri->n + r->batch - 1) / r->batch, dir)))) {
        res->stage = BK_TRAIN_STAGE_CONFIG;
        return st;
    }

    /* the model, and the run directory */
    const int chunk = r->micro > 0 ? r->micro : r->batch;
    const int diag_n = evi->n < 64 ? (int)evi->n : 64;
    int maxb = chunk > r->eval_batch ? chunk : r->eval_batch;
    if (maxb < diag_n) maxb = diag_n;
    if (resume) {
        if ((st = bk_checkpoint_load(path, maxb, &s->m, &s->o, NULL)) != BK_OK) return st;
        if (!s->o && (st = bk_optim_create(&r->optim, s->m, &s->o)) != BK_OK) return st;
        if ((st = replan_optim(s)) != BK_OK) return st;
    } else {
        if (r->init[0]) {
            if ((st = init_model(r, maxb, &s->m)) != BK_OK) {
                res->stage = st == BK_ERR_PARAM ? BK_TRAIN_STAGE_CONFIG : BK_TRAIN_STAGE_SETUP;
                return st;
            }
        } else if ((st = bk_model_create(&r->model, r->seed, maxb, &s->m)) != BK_OK) {
            return st;
        }
        if (r->otk_init > 0 && (st = otk_init_model(s->m, s->tr, r)) != BK_OK) return st;
        if ((st = bk_optim_create(&r->optim, s->m, &s->o)) != BK_OK) return st;
    }
    s->order = malloc(sizeof(int64_t) * (size_t)tri->n);
    s->diag = calloc((size_t)(r->model.depth > 0 ? r->model.depth : 1), sizeof *s->diag);
    /* a batch is filled whole (micro-batches are weighted by their share
     * of it: an encoder-decoder's target tokens are counted first) */
    if (!s->order || !s->diag || bk_data_batch_init(&s->buf, s->tr, r->batch) != BK_OK)
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    return BK_OK;
}

/* The run directory, written by root alone (a data-parallel run's once every
 * rank's setup and configuration were agreed, so that a refused run writes
 * nothing): a new run's directory, ckpt/, config.txt, the metrics files (a
 * resumed run's cut back to its checkpoint) and a new run's epoch-0000. */
static bk_status setup_dir(train_state *s, const char *dir, bk_train_mode mode, const run_pos *pos, int comm_size)
{
    const bk_run_config *r = &s->r;
    const int resume = mode == BK_TRAIN_RESUME;
    char path[1100];
    bk_status st;
    if (!resume && !mkdir_p(dir)) return bki_fail(BK_ERR_IO, "cannot create %s (%s)", dir, strerror(errno));
    snprintf(path, sizeof path, "%s/ckpt", dir);
    if (!mkdir_p(path)) return bki_fail(BK_ERR_IO, "cannot create %s (%s)", path, strerror(errno));
    struct stat cst;
    if (lstat(path, &cst) != 0 || !S_ISDIR(cst.st_mode))
        return bki_fail(BK_ERR_IO, "cannot write %s (not a directory: a run directory's files are never followed "
                                   "through symbolic links)", path);
    /* the temporaries a killed run left in the directory this run owns */
    bki_clean_stale(dir, NULL);
    bki_clean_stale(path, NULL);
    {
        char *cfg = config_text(r);
        const char *vv = s->ver.valid ? s->ver.valid : "";
        size_t n = cfg ? strlen(cfg) + strlen(s->ver.train) + strlen(vv) + strlen(s->ver.test) + 256 : 0;
        char *txt = cfg ? malloc(n) : NULL;
        if (txt)
            snprintf(txt, n, "# birkhoff %s\n# data: %s\n%s%s%s# data: %s\n%s", bk_version(), s->ver.train,
                     *vv ? "# data: " : "", vv, *vv ? "\n" : "", s->ver.test, cfg);
        snprintf(path, sizeof path, "%s/config.txt", dir);
        st = txt ? run_write_text(path, txt) : bki_fail(BK_ERR_NOMEM, "out of memory");
        free(cfg);
        free(txt);
        if (st != BK_OK) return st;
    }
    if (resume) {
        /* the records up to the checkpoint stay; a gap among them is noted */
        static const char *const mf[3] = {"metrics.jsonl", "steps.csv", "epochs.csv"};
        for (int i = 0; i < 3; i++) {
            char p2[1100];
            rec_seq seq[2] = {{.every = r->log_every, .bound = pos->step}, {.every = 1, .bound = pos->epoch}};
            snprintf(p2, sizeof p2, "%s/%s", dir, mf[i]);
            if (!filter_lines(p2, i, pos->step, pos->epoch, seq)) {
                char msg[600];
                snprintf(msg, sizeof msg, "%s", bk_last_error());
                return bki_fail(BK_ERR_IO, "cannot rewrite the metrics of %s: %s", dir, msg);
            }
            note_gaps(s->notice, sizeof s->notice, p2, i, seq);
        }
    }
    if (!logs_open(dir, !resume, s->va != NULL, &s->logs)) return BK_ERR_IO; /* bki_open_log said which and why */
    if (!resume) {
        remove_old_run(dir);
        if ((st = save_ckpt(dir, "ckpt/epoch-0000.safetensors", s->m, s->o, r, pos, &s->ver, comm_size)) != BK_OK)
            return st;
    }
    return BK_OK;
}

/* Data-parallel setup, after each rank's own: agree that all succeeded, that
 * the configurations match (but for the keys that are per process), then
 * take rank 0's weights, optimiser state and position. */
static bk_status dp_start(train_state *s, bk_train_mode mode, run_pos *pos)
{
    bki_dp *d = &s->dp;
    bk_run_config a = s->r;
    a.threads = 0;
    memset(a.progress, 0, sizeof a.progress);
    memset(a.data_dir, 0, sizeof a.data_dir);
    char *cfg = config_text(&a);
    size_t n = cfg ? strlen(cfg) + 2048 : 0;
    char *txt = cfg ? malloc(n) : NULL; /* (a failure is agreed below, as every one here) */
    if (txt)
        snprintf(txt, n, "mode=%d\nranks=%d\ndata_train=%s\ndata_valid=%.600s\ndata_test=%s\nmodel_seed=%llu\n%s",
                 (int)mode, bki_dp_size(d), s->ver.train, s->ver.valid ? s->ver.valid : "", s->ver.test,
                 (unsigned long long)bki_model_seed(s->m), cfg);
    free(cfg);
    bk_status st = txt ? BK_OK : bki_fail(BK_ERR_NOMEM, "out of memory");
    st = bki_dp_agree(d, st, "setup"); /* (the other ranks' first agreement: "setup" in bk_train_run_comm) */
    if (st == BK_OK) st = bki_dp_same_text(d, txt, "configuration");
    free(txt);
    if (st != BK_OK) return st;
    int64_t step = bk_optim_step_count(s->o);
    uint64_t fc = bki_model_fwd_count(s->m);
    const size_t P = (size_t)bk_model_num_params(s->m);
    if ((st = bki_dp_bcast(d, pos, sizeof *pos)) || (st = bki_dp_bcast(d, &step, sizeof step)) ||
        (st = bki_dp_bcast(d, &fc, sizeof fc)) || (st = bki_dp_bcast(d, bk_model_params(s->m), sizeof(float) * P)))
        return st;
    for (int k = 0; k < bki_optim_slots(s->o); k++)
        if ((st = bki_dp_bcast(d, bki_optim_slot(s->o, k), sizeof(float) * P))) return st;
    bki_optim_set_step(s->o, step);
    bki_model_set_fwd_count(s->m, fc);
    return BK_OK;
}

/* the checksum the ranks compare after each epoch: weights and optimiser
 * state */
static uint64_t state_hash(bk_model *m, bk_optim *o)
{
    const size_t P = (size_t)bk_model_num_params(m);
    uint64_t h = bki_fnv1a(BKI_FNV_OFFSET, bk_model_params(m), sizeof(float) * P);
    for (int k = 0; k < bki_optim_slots(o); k++) h = bki_fnv1a(h, bki_optim_slot(o, k), sizeof(float) * P);
    return h;
}

bk_status bk_train_run(const bk_run_config *r_in, const char *dir, bk_train_mode mode, bk_train_callback cb,
                       void *user, const volatile sig_atomic_t *stop, bk_train_result *result)
{
    return bk_train_run_comm(r_in, dir, mode, NULL, cb, user, stop, result);
}

/* ---- the training loop --------------------------------------------------
 * bk_train_run_comm: start (setup, the ranks' agreement, the run
 * directory), the epochs (each: its attention and order, the batches, the
 * end-of-epoch evaluation and checkpoint), the finish (the last checkpoint
 * or the summary). A run's state between them is a run_ctx. */
typedef struct {
    train_state s;
    run_pos pos;
    const char *dir;
    bk_train_callback cb;
    void *user;
    const volatile sig_atomic_t *stop;
    bk_train_result *res;
    bk_train_event ev;
    int ranks, rank, root;
    int chunk;      /* the unit of work: a micro-batch, or a rank's share of the batch */
    int diag_n;
    int64_t nb;     /* batches per epoch */
    double t0, win_t, rate;
    int64_t win_samples;
    int stopped;
    int early;      /* patience ran out: the run has finished early            */
    int best_epoch; /* the best epoch so far (a run with a validation split)   */
} run_ctx;

/* setup, the ranks' agreement on it, the run directory; the start event */
static bk_status run_start(run_ctx *x, const bk_run_config *r_in, bk_train_mode mode, const bk_train_comm *comm)
{
    train_state *s = &x->s;
    s->r = *r_in;
    /* a malformed comm, or no memory for the collectives: cannot take part */
    bk_status st = bki_dp_init(&s->dp, comm);
    if (st != BK_OK) {
        x->res->stage = BK_TRAIN_STAGE_COMM; /* before any collective: nothing agreed */
        return st;
    }
    x->ranks = bki_dp_size(&s->dp);
    x->rank = bki_dp_rank(&s->dp);
    x->root = x->rank == 0;
    st = train_setup(s, x->dir, mode, &x->pos, x->res, x->rank);
    if (st == BK_OK) st = bki_dp_reserve(&s->dp, bk_model_num_params(s->m));
    if (x->ranks > 1) /* every rank takes part in the collectives from here on, whatever its own setup gave */
        st = st == BK_OK ? dp_start(s, mode, &x->pos) : bki_dp_agree(&s->dp, st, "setup");
    if (st == BK_OK) { /* every rank agreed: now the run directory, agreed too */
        if (x->root) st = setup_dir(s, x->dir, mode, &x->pos, x->ranks);
        st = bki_dp_agree(&s->dp, st, "the run directory");
    }
    if (st != BK_OK) {
        if (bki_dp_broken(&s->dp)) x->res->stage = BK_TRAIN_STAGE_COMM;
        if (s->spm_written[0]) remove(s->spm_written); /* a refused new run leaves nothing */
        train_free(s);
        return st;
    }
    if (!x->root) x->cb = NULL; /* rank 0 reports */
    const bk_run_config *r = &s->r;
    const bk_dataset_info *tri = bk_data_info(s->tr), *evi = bk_data_info(s->va ? s->va : s->te);
    x->chunk = r->micro > 0 ? r->micro : (r->batch + x->ranks - 1) / x->ranks;
    x->diag_n = evi->n < 64 ? (int)evi->n : 64;
    x->nb = (tri->n + r->batch - 1) / r->batch;
    bk_train_event *ev = &x->ev;
    memset(ev, 0, sizeof *ev);
    ev->config = r;
    ev->train = s->tr;
    ev->valid = s->va;
    ev->test = s->te;
    ev->model = s->m;
    ev->batches = x->nb;
    ev->total_steps = x->nb * r->epochs;
    ev->first_step = x->pos.step;
    ev->step = x->pos.step;
    ev->epoch = x->pos.epoch + 1;
    ev->time_s = x->pos.elapsed;
    ev->kind = BK_TRAIN_EVENT_START;
    ev->notice = s->notice[0] ? s->notice : NULL;
    if (x->cb) x->cb(x->user, ev);
    ev->notice = NULL;
    x->t0 = now_s();
    x->win_t = x->t0;
    return BK_OK;
}

/* the gradient of batch bi on this rank's chunks, summed over the ranks:
 * *bl the loss times the weight, *bc the hits, *bw the weight */
static bk_status batch_gradient(run_ctx *x, int64_t bi, int B, double *bl, int64_t *bc, int64_t *bw)
{
    train_state *s = &x->s;
    const bk_run_config *r = &s->r;
    bk_model *m = s->m;
    bk_model_zero_grad(m);
    /* the whole batch, then its micro-batches, each weighted by its share of
     * bw (an encoder-decoder's by its target tokens); chunk k runs with the
     * dropout counter base + k on whichever rank holds it (this rank: chunks
     * [k0, k1)), as one process running every chunk would */
    bk_batch whole;
    memcpy(s->buf.idx, s->order + bi * r->batch, sizeof(int64_t) * (size_t)B);
    bk_status st = bk_data_batch_fill(&s->buf, s->tr, B, &whole);
    if (st == BK_OK) *bw = bki_batch_weight(m, &whole);
    const int nchunks = (B + x->chunk - 1) / x->chunk;
    const int k0 = (int)((int64_t)nchunks * x->rank / x->ranks), k1 = (int)((int64_t)nchunks * (x->rank + 1) / x->ranks);
    if (st == BK_OK) st = bki_train_accumulate(m, &whole, x->chunk, k0, k1, *bw, r->ls, bl, bc);
    else bki_model_set_fwd_count(m, bki_model_fwd_count(m) + (uint64_t)nchunks);
    if (st != BK_OK) {
        char msg[480];
        snprintf(msg, sizeof msg, "%s", bk_last_error());
        bki_fail(st, "step %lld: %s", (long long)x->pos.step + 1, msg);
    }
    if (x->ranks > 1 && (st = bki_dp_agree(&s->dp, st, "training step")) == BK_OK) {
        /* the batch's loss and hits, then the gradient, summed over the ranks */
        double v[2] = {*bl, (double)*bc};
        if ((st = bki_dp_sum(&s->dp, v, 2)) == BK_OK)
            st = bki_dp_sum_floats(&s->dp, bk_model_grads(m), bk_model_num_params(m));
        *bl = v[0];
        *bc = (int64_t)v[1];
    }
    return st;
}

/* a step's records: the logs (every log_every steps) and the step event */
static void step_records(run_ctx *x, int e, int64_t bi, int B, double bl, int64_t bc, int64_t bw, float lr,
                         double gnorm)
{
    const bk_run_config *r = &x->s.r;
    const run_pos *pos = &x->pos;
    const double now = now_s();
    x->win_samples += B;
    if (now - x->win_t >= 1.0 || x->rate == 0) {
        if (now > x->win_t) x->rate = (double)x->win_samples / (now - x->win_t);
        x->win_t = now;
        x->win_samples = 0;
    }
    const double t = pos->elapsed + now - x->t0;
    if (x->root && pos->step % r->log_every == 0) {
        fprintf(x->s.logs.jsonl,
                "{\"type\":\"step\",\"step\":%lld,\"epoch\":%d,\"batch\":%lld,\"loss\":%.6g,\"acc\":%.6g,"
                "\"lr\":%.6g,\"gnorm\":%.6g,\"samples_per_s\":%.1f,\"time_s\":%.3f}\n",
                (long long)pos->step, e + 1, (long long)bi + 1, bl / bw, (double)bc / bw, (double)lr, gnorm, x->rate,
                t);
        fprintf(x->s.logs.steps, "%lld,%d,%lld,%.6g,%.6g,%.6g,%.6g,%.1f,%.3f\n", (long long)pos->step, e + 1,
                (long long)bi + 1, bl / bw, (double)bc / bw, (double)lr, gnorm, x->rate, t);
    }
    bk_train_event *ev = &x->ev;
    ev->kind = BK_TRAIN_EVENT_STEP;
    ev->epoch = e + 1;
    ev->batch = bi + 1;
    ev->step = pos->step;
    ev->elapsed_s = now - x->t0;
    ev->time_s = t;
    ev->loss = bl / bw;
    ev->acc = (double)bc / bw;
    ev->lr = lr;
    ev->gnorm = gnorm;
    ev->samples_per_s = x->rate;
    ev->train_loss = pos->loss_sum / (double)pos->seen;
    ev->train_acc = (double)pos->correct / (double)pos->seen;
    if (x->cb) x->cb(x->user, ev);
}

/* one optimiser step on batch bi of epoch e; sets x->stopped when a stop
 * is asked for (any rank's) */
static bk_status train_step_at(run_ctx *x, int e, int64_t bi)
{
    train_state *s = &x->s;
    const bk_run_config *r = &s->r;
    const bk_dataset_info *tri = bk_data_info(s->tr);
    const int B = (int)(tri->n - bi * r->batch < r->batch ? tri->n - bi * r->batch : r->batch);
    const float lr = bk_optim_lr(bk_optim_get_config(s->o), bk_optim_step_count(s->o));
    double bl = 0;
    int64_t bc = 0, bw = 0; /* hits, and what the loss averages over: samples or target tokens */
    bk_status st = batch_gradient(x, bi, B, &bl, &bc, &bw);
    double gnorm = 0;
    /* (the summed gradient and the optimiser state are every rank's: so is
     * the step's outcome, which needs no agreement) */
    if (st == BK_OK && (st = bk_optim_step(s->o, s->m, &gnorm)) != BK_OK) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", bk_last_error());
        bki_fail(st, "step %lld: %s (the run stops; its last checkpoint is intact)", (long long)x->pos.step + 1, msg);
    }
    if (st != BK_OK) return st;
    x->pos.step++;
    x->pos.batch = bi + 1;
    x->pos.loss_sum += bl;
    x->pos.correct += bc;
    x->pos.seen += bw;
    step_records(x, e, bi, B, bl, bc, bw, lr, gnorm);
    /* read after the step and its event; any rank's flag stops all */
    double stop_now = (x->stop && *x->stop) || (r->stop_after > 0 && x->pos.step >= r->stop_after);
    if (x->ranks > 1 && (st = bki_dp_sum(&s->dp, &stop_now, 1)) != BK_OK) return st;
    if (stop_now > 0) x->stopped = 1;
    return BK_OK;
}

/* the metric that selects the best epoch: 1 accuracy, 0 loss (select=auto:
 * accuracy for a classifier, loss for sentence pairs) */
static int select_acc(const train_state *s)
{
    if (!strcmp(s->r.select, "acc")) return 1;
    if (!strcmp(s->r.select, "loss")) return 0;
    return !bk_data_info(s->tr)->seq2seq;
}

/* epoch's validation figures against the best so far (a tie keeps the
 * earlier epoch); 1 when it is the new best */
static int select_update(const train_state *s, run_pos *done, int epoch, const bk_eval_result *er)
{
    const int better = done->best_epoch == 0 || (select_acc(s) ? er->acc > done->best_acc : er->loss < done->best_loss);
    if (!better) {
        done->bad_epochs++;
        return 0;
    }
    done->best_epoch = epoch;
    done->bad_epochs = 0;
    done->best_loss = er->loss;
    done->best_acc = er->acc;
    return 1;
}

/* an epoch's records: metrics.jsonl, epochs.csv, the EPOCH event */
static void epoch_log(run_ctx *x, int e, const bk_eval_result *er, const double dg[3], double t, double now)
{
    train_state *s = &x->s;
    const run_pos *pos = &x->pos;
    const int valid = s->va != NULL;
    char esp_t[48] = ""; /* an ESP run's SoftSort temperature of the epoch */
    char tv[32], best[32] = "";
    if (bk_model_config_get(bk_model_get_config(s->m), "attn.t", tv, sizeof tv))
        snprintf(esp_t, sizeof esp_t, ",\"esp_t\":%s", tv); /* (an attention with ESP's t) */
    else
        bki_clear_error();
    if (valid) snprintf(best, sizeof best, ",\"best_epoch\":%d", x->best_epoch);
    const char *held = valid ? "valid" : "test";
    fprintf(s->logs.jsonl,
            "{\"type\":\"epoch\",\"epoch\":%d,\"step\":%lld,\"train_loss\":%.6g,\"train_acc\":%.6g,"
            "\"%s_loss\":%.6g,\"%s_acc\":%.6g%s,\"attn_row_dev\":%.6g,\"attn_col_dev\":%.6g,"
            "\"attn_entropy\":%.6g%s,\"time_s\":%.3f}\n",
            e + 1, (long long)pos->step, pos->loss_sum / pos->seen, (double)pos->correct / pos->seen, held, er->loss,
            held, er->acc, best, dg[0], dg[1], dg[2], esp_t, t);
    fprintf(s->logs.epochs, "%d,%lld,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.3f\n", e + 1, (long long)pos->step,
            pos->loss_sum / pos->seen, (double)pos->correct / pos->seen, er->loss, er->acc, dg[0], dg[1], dg[2], t);
    logs_flush(&s->logs);
    bk_train_event *ev = &x->ev;
    ev->kind = BK_TRAIN_EVENT_EPOCH;
    ev->epoch = e + 1;
    ev->step = pos->step;
    ev->elapsed_s = now - x->t0;
    ev->time_s = t;
    ev->train_loss = pos->loss_sum / (double)pos->seen;
    ev->train_acc = (double)pos->correct / (double)pos->seen;
    ev->test_loss = valid ? NAN : er->loss;
    ev->test_acc = valid ? NAN : er->acc;
    ev->valid_loss = valid ? er->loss : NAN;
    ev->valid_acc = valid ? er->acc : NAN;
    ev->best_epoch = valid ? x->best_epoch : 0;
    ev->attn_row_dev = dg[0];
    ev->attn_col_dev = dg[1];
    ev->attn_entropy = dg[2];
    if (x->cb) x->cb(x->user, ev);
}

/* rank 0's end of epoch e: evaluation (the validation split, else the test
 * split), model selection, records, checkpoints (done: the position after
 * the epoch, its best-epoch state updated here) */
static bk_status epoch_records(run_ctx *x, int e, run_pos *done)
{
    train_state *s = &x->s;
    const bk_run_config *r = &s->r;
    const int depth = r->model.depth;
    bk_eval_result er = {0};
    bk_status st = evaluate_epoch(s->m, r, s->va ? s->va : s->te, x->diag_n, s->diag, &er);
    if (st != BK_OK) {
        char msg[480];
        snprintf(msg, sizeof msg, "%s", bk_last_error());
        bki_fail(st, "evaluation: %s", msg);
        x->res->stage = BK_TRAIN_STAGE_EVAL;
        bk_eval_result_free(&er);
        return st;
    }
    double dg[3] = {0, 0, 0};
    for (int l = 0; l < depth; l++) {
        dg[0] += s->diag[l].row_dev / depth;
        dg[1] += s->diag[l].col_dev / depth;
        dg[2] += s->diag[l].entropy / depth;
    }
    const int improved = s->va && select_update(s, done, e + 1, &er);
    x->best_epoch = done->best_epoch;
    const double now = now_s(), t = x->pos.elapsed + now - x->t0;
    epoch_log(x, e, &er, dg, t, now);
    if (s->va) {
        x->res->valid_loss = done->best_loss;
        x->res->valid_acc = done->best_acc;
    } else {
        x->res->test_acc = er.acc;
        x->res->test_loss = er.loss;
    }
    /* the epoch's checkpoint, best.safetensors when the epoch is the best
     * (weights only) and last.safetensors, committed together */
    char name[64];
    snprintf(name, sizeof name, "ckpt/epoch-%04d.safetensors", e + 1);
    const char *names[3] = {name, "best.safetensors", "last.safetensors"};
    if (!improved) names[1] = names[2];
    run_pos saved = *done;
    saved.elapsed = t;
    if ((st = save_ckpts(x->dir, improved ? 3 : 2, names, s->m, s->o, r, &saved, &s->ver, x->ranks)) != BK_OK)
        x->res->stage = BK_TRAIN_STAGE_SAVE;
    bk_eval_result_free(&er);
    return st;
}

/* the end of epoch e: rank 0 evaluates, records and checkpoints; then the
 * ranks agree and compare their states; patience epochs without a better
 * validation metric end the run (x->early) */
static bk_status epoch_end(run_ctx *x, int e)
{
    run_pos done = x->pos;
    done.epoch = e + 1;
    done.batch = 0;
    done.loss_sum = 0;
    done.correct = done.seen = 0;
    bk_status st = BK_OK;
    int evaluated = !x->root;
    if (x->root) evaluated = (st = epoch_records(x, e, &done)) == BK_OK || x->res->stage == BK_TRAIN_STAGE_SAVE;
    if (evaluated) x->pos = done;
    if (x->ranks > 1) {
        /* rank 0's status, the states' checksums, rank 0's figures and model selection */
        run_pos *p = &x->pos;
        double te[6] = {x->res->test_loss, x->res->test_acc, p->best_epoch, p->bad_epochs, p->best_loss, p->best_acc};
        if ((st = bki_dp_agree(&x->s.dp, st, "end of epoch")) != BK_OK ||
            (st = bki_dp_same_u64(&x->s.dp, state_hash(x->s.m, x->s.o), "weights and optimiser state")) != BK_OK ||
            (st = bki_dp_bcast(&x->s.dp, te, sizeof te)) != BK_OK)
            return st;
        x->res->test_loss = te[0];
        x->res->test_acc = te[1];
        p->best_epoch = (int)te[2];
        p->bad_epochs = (int)te[3];
        p->best_loss = te[4];
        p->best_acc = te[5];
        x->res->valid_loss = p->best_loss;
        x->res->valid_acc = p->best_acc;
    }
    if (st == BK_OK && x->s.va && x->s.r.patience > 0 && x->pos.bad_epochs >= x->s.r.patience) x->early = 1;
    return st;
}

/* epoch e: its attention and order, its batches, its end */
static bk_status run_epoch(run_ctx *x, int e)
{
    train_state *s = &x->s;
    const bk_run_config *r = &s->r;
    const bk_dataset_info *tri = bk_data_info(s->tr);
    bk_status st = epoch_attention(s->m, r, e);
    if (st == BK_OK) st = bk_data_window_order(s->order, tri->n, r->seed, e, r->shuffle_window);
    /* sentence pairs: batches of similar lengths (windows of 100 batches
     * sorted by length, the batches shuffled; a pure function of the
     * epoch's order, so a resumed run sees the same batches) */
    if (st == BK_OK && tri->seq2seq)
        st = bk_data_bucket_order(s->tr, s->order, tri->n, r->batch, 100 * (int64_t)r->batch);
    if ((st = bki_dp_agree(&s->dp, st, "epoch start")) != BK_OK) return st;
    for (int64_t bi = x->pos.batch; bi < x->nb; bi++)
        if ((st = train_step_at(x, e, bi)) != BK_OK || x->stopped) return st;
    return epoch_end(x, e);
}

/* A run with a validation split, at its end: the test split evaluated once
 * with the best epoch's weights (best.safetensors), by rank 0, its figures
 * shared; a {"type":"test"} record and the TEST event. */
static bk_status run_test(run_ctx *x)
{
    train_state *s = &x->s;
    const bk_run_config *r = &s->r;
    bk_train_result *res = x->res;
    double te[2] = {NAN, NAN};
    bk_status st = BK_OK;
    res->stage = BK_TRAIN_STAGE_EVAL;
    if (x->root) {
        char path[1100];
        snprintf(path, sizeof path, "%s/best.safetensors", x->dir);
        bk_model *mb = NULL;
        bk_eval_result er = {0};
        st = bk_checkpoint_load(path, r->eval_batch, &mb, NULL, NULL);
        if (st == BK_OK) st = evaluate_epoch(mb, r, s->te, 0, NULL, &er);
        if (st != BK_OK) {
            char msg[480];
            snprintf(msg, sizeof msg, "%s", bk_last_error());
            bki_fail(st, "the test evaluation of the best epoch (%d): %s", x->pos.best_epoch, msg);
        }
        te[0] = er.loss;
        te[1] = er.acc;
        bk_eval_result_free(&er);
        bk_model_free(mb);
    }
    if ((st = bki_dp_agree(&s->dp, st, "the test evaluation")) != BK_OK ||
        (x->ranks > 1 && (st = bki_dp_bcast(&s->dp, te, sizeof te)) != BK_OK))
        return st;
    res->test_loss = te[0];
    res->test_acc = te[1];
    res->stage = BK_TRAIN_STAGE_SAVE;
    if (!x->root) return BK_OK;
    const run_pos *p = &x->pos;
    const double t = p->elapsed + now_s() - x->t0;
    fprintf(s->logs.jsonl,
            "{\"type\":\"test\",\"best_epoch\":%d,\"epochs\":%d,\"step\":%lld,\"test_loss\":%.6g,\"test_acc\":%.6g,"
            "\"valid_loss\":%.6g,\"valid_acc\":%.6g,\"select\":\"%s\",\"early_stopped\":%s,\"time_s\":%.3f}\n",
            p->best_epoch, p->epoch, (long long)p->step, te[0], te[1], p->best_loss, p->best_acc,
            select_acc(s) ? "acc" : "loss", x->early ? "true" : "false", t);
    logs_flush(&s->logs);
    bk_train_event *ev = &x->ev;
    ev->kind = BK_TRAIN_EVENT_TEST;
    ev->epoch = p->epoch;
    ev->step = p->step;
    ev->time_s = t;
    ev->test_loss = te[0];
    ev->test_acc = te[1];
    ev->valid_loss = p->best_loss;
    ev->valid_acc = p->best_acc;
    ev->best_epoch = p->best_epoch;
    if (x->cb) x->cb(x->user, ev);
    return BK_OK;
}

/* summary.json of a finished run (root) */
static bk_status write_summary(run_ctx *x, double elapsed)
{
    train_state *s = &x->s;
    const bk_run_config *r = &s->r;
    const bk_train_result *res = x->res;
    char *data = bki_json_string(r->data);
    if (!data) return bki_fail(BK_ERR_NOMEM, "out of memory");
    char best[512] = "";
    if (s->va)
        snprintf(best, sizeof best, ",\"best_epoch\":%d,\"best_valid_loss\":%.6g,\"best_valid_acc\":%.6g,"
                                    "\"select\":\"%s\",\"epochs_trained\":%d,\"early_stopped\":%s",
                 x->pos.best_epoch, x->pos.best_loss, x->pos.best_acc, select_acc(s) ? "acc" : "loss", x->pos.epoch,
                 x->early ? "true" : "false");
    const size_t n = strlen(data) + 2048;
    char *sj = malloc(n), path[1100];
    bk_status st = sj ? BK_OK : bki_fail(BK_ERR_NOMEM, "out of memory");
    if (sj) {
        snprintf(sj, n,
                 "{\"data\":%s,\"attn\":\"%s\",\"epochs\":%d,\"steps\":%lld,\"params\":%lld,\"test_acc\":%.6g,"
                 "\"test_loss\":%.6g%s,\"time_s\":%.3f,\"threads\":%d,\"ranks\":%d}\n",
                 data, bk_attn_kind_name(r->model.attn), r->epochs, (long long)x->pos.step,
                 (long long)bk_model_num_params(s->m), res->test_acc, res->test_loss, best, elapsed,
                 bk_get_num_threads(), x->ranks);
        snprintf(path, sizeof path, "%s/summary.json", x->dir);
        st = run_write_text(path, sj);
    }
    free(sj);
    free(data);
    return st;
}

/* the run's last writes: the checkpoint of a stopped run, or (a run with a
 * validation split: after its test evaluation) the summary */
static bk_status run_finish(run_ctx *x, bk_status st)
{
    train_state *s = &x->s;
    const bk_run_config *r = &s->r;
    bk_train_result *res = x->res;
    logs_flush(&s->logs);
    res->epoch = x->pos.epoch;
    res->batch = x->pos.batch;
    res->step = x->pos.step;
    res->stopped = x->stopped;
    res->early_stopped = x->early;
    res->best_epoch = x->pos.best_epoch;
    if (st == BK_OK && !x->stopped && s->va) st = run_test(x);
    const double elapsed = x->pos.elapsed + now_s() - x->t0;
    res->time_s = elapsed;
    if (st == BK_OK) {
        res->stage = BK_TRAIN_STAGE_SAVE;
        if (!x->root) {
            /* rank 0 writes */
        } else if (x->stopped) {
            run_pos saved = x->pos;
            saved.elapsed = elapsed;
            st = save_ckpt(x->dir, "last.safetensors", s->m, s->o, r, &saved, &s->ver, x->ranks);
        } else if (isfinite(res->test_acc)) {
            st = write_summary(x, elapsed);
        }
        /* the last writes, agreed (a failed loop has agreed already) */
        st = bki_dp_agree(&s->dp, st, "the final checkpoint");
    }
    if (st != BK_OK && bki_dp_broken(&s->dp)) res->stage = BK_TRAIN_STAGE_COMM;
    train_free(s);
    return st;
}

bk_status bk_train_run_comm(const bk_run_config *r_in, const char *dir, bk_train_mode mode,
                            const bk_train_comm *comm, bk_train_callback cb, void *user,
                            const volatile sig_atomic_t *stop, bk_train_result *result)
{
    bki_clear_error();
    bk_train_result res_local, *res = result ? result : &res_local;
    memset(res, 0, sizeof *res);
    res->test_acc = res->test_loss = res->valid_acc = res->valid_loss = NAN;
    res->stage = BK_TRAIN_STAGE_SETUP;
    if (!r_in || !dir) return bki_fail(BK_ERR_NULL, "bk_train_run: NULL argument");
    if (mode != BK_TRAIN_NEW && mode != BK_TRAIN_OVERWRITE && mode != BK_TRAIN_RESUME)
        return bki_fail(BK_ERR_PARAM, "bk_train_run: unknown mode %d", (int)mode);
    run_ctx *x = calloc(1, sizeof *x);
    if (!x) return bki_fail(BK_ERR_NOMEM, "bk_train_run: out of memory");
    x->dir = dir;
    x->cb = cb;
    x->user = user;
    x->stop = stop;
    x->res = res;
    bk_status st = run_start(x, r_in, mode, comm);
    if (st != BK_OK) {
        free(x);
        return st;
    }
    res->stage = BK_TRAIN_STAGE_STEP;
    for (int e = x->pos.epoch; e < x->s.r.epochs && !x->stopped && !x->early && st == BK_OK; e++) st = run_epoch(x, e);
    st = run_finish(x, st);
    free(x);
    return st;
}
