/* test_train.c -- training runs through the library (birkhoff/train.h,
 * src/train), on the generated ListOps set (no files needed): the run
 * configuration (keys, files, the text form and its round trip), a run's
 * directory and events, stopping by stop_after and by the caller's flag,
 * resuming bit for bit (weights, optimiser state and every metrics record
 * but the timings equal the uninterrupted run's, with a thread change),
 * refusals (an existing run, a changed configuration, a finished run), the
 * evaluation of a checkpoint equal to the run's own, attention diagnostics,
 * the ASAP compilation of a Sinkhorn model, the OTK pool's unsupervised
 * start (otk_init), and data-parallel runs
 * (bk_train_run_comm) over ranks that are threads of this process (the MPI
 * transport itself: tests/tools/test_mpi.py).
 * Run: build/test_train; prints "N passed, M failed". */
#include "birkhoff.h"
#include "../harness.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECK(ok, name, ...) th_check((ok), (name), __VA_ARGS__)

static int has(const char *msg, const char *part) { return msg && strstr(msg, part) != NULL; }
/* a model config key's text is v; two configs' texts of key agree */
static int cfg_is(const bk_model_config *c, const char *key, const char *v)
{
    char got[64] = "";
    return bk_model_config_get(c, key, got, sizeof got) && !strcmp(got, v);
}
static int cfg_text_eq(const bk_model_config *a, const bk_model_config *b, const char *key)
{
    char va[64] = "", vb[64] = "";
    return bk_model_config_get(a, key, va, sizeof va) && bk_model_config_get(b, key, vb, sizeof vb) && !strcmp(va, vb);
}
static char g_tmp[256];

static char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)len + 1);
    if (s && fread(s, 1, (size_t)len, f) != (size_t)len) {
        free(s);
        s = NULL;
    }
    fclose(f);
    if (s) s[len] = 0;
    if (n) *n = (size_t)len;
    return s;
}

static int exists(const char *dir, const char *rel)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    return access(p, F_OK) == 0;
}

/* the data section of a safetensors file (after the 8-byte length and the
 * JSON header): weights and optimiser state */
static int same_tensors(const char *a, const char *b)
{
    size_t na, nb;
    char *x = read_all(a, &na), *y = read_all(b, &nb);
    int ok = x && y && na > 8 && nb > 8;
    if (ok) {
        uint64_t ha, hb;
        memcpy(&ha, x, 8);
        memcpy(&hb, y, 8);
        ok = 8 + ha <= na && 8 + hb <= nb && na - ha == nb - hb && !memcmp(x + 8 + ha, y + 8 + hb, na - 8 - ha);
    }
    free(x);
    free(y);
    return ok;
}

/* a run stopped after `stop` steps in cut, then resumed to its end (on
 * `threads` threads; 0: the default); rr receives the resumed run's
 * configuration, res the last run's result */
static bk_status stop_and_resume(const bk_run_config *r, const char *cut, int64_t stop, int threads, bk_run_config *rr,
                                 bk_train_result *res)
{
    bk_run_config rc = *r;
    rc.stop_after = stop;
    bk_status st = bk_train_run(&rc, cut, BK_TRAIN_NEW, NULL, NULL, NULL, res);
    if (st == BK_OK) st = bk_train_resume_config(cut, rr, NULL);
    if (st == BK_OK && threads > 0) rr->threads = threads;
    if (st == BK_OK) st = bk_train_run(rr, cut, BK_TRAIN_RESUME, NULL, NULL, NULL, res);
    bk_set_num_threads(0);
    return st;
}

/* a metrics file without its timings: JSON records cut before
 * "samples_per_s" (steps) or "time_s" (epochs), CSV rows to 7 or 9 columns */
static char *strip_times(const char *path)
{
    char *s = read_all(path, NULL);
    if (!s) return NULL;
    char *out = malloc(strlen(s) + 1), *o = out;
    int csv_cols = strstr(path, "steps.csv") ? 7 : strstr(path, "epochs.csv") ? 9 : 0;
    for (char *line = s; out && *line;) {
        char *e = strchr(line, '\n');
        size_t L = e ? (size_t)(e - line) : strlen(line);
        size_t keep = L;
        if (!csv_cols) {
            const char *cut = strstr(line, ",\"samples_per_s\"");
            if (!cut || cut > line + L) cut = strstr(line, ",\"time_s\"");
            if (cut && cut < line + L) keep = (size_t)(cut - line);
        } else {
            int c = 0;
            for (size_t i = 0; i < L; i++)
                if (line[i] == ',' && ++c == csv_cols) {
                    keep = i;
                    break;
                }
        }
        memcpy(o, line, keep);
        o += keep;
        *o++ = '\n';
        line = e ? e + 1 : line + L;
    }
    if (out) *o = 0;
    free(s);
    return out;
}

/* ---- the run configuration ---- */
static void test_config(void)
{
    bk_run_config r = bk_run_config_default();
    CHECK(!strcmp(r.data, "mnist") && r.epochs == 5 && r.batch == 64 && r.eval_batch == 256 && r.seed == 1 &&
              !strcmp(r.progress, "auto") && r.data_config.points == 256 && r.model.dim == 64,
          "config: defaults", "%s", "");
    CHECK(bk_run_config_set(&r, "epochs", "3") == BK_OK && bk_run_config_set(&r, "dim", "32") == BK_OK &&
              bk_run_config_set(&r, "lr", "0.01") == BK_OK && bk_run_config_set(&r, "seq_len", "100") == BK_OK &&
              r.epochs == 3 && r.model.dim == 32 && fabsf(r.optim.lr - 0.01f) < 1e-9f && r.data_config.max_len == 100,
          "config: run, model, optimiser and data keys in one namespace", "%s", bk_last_error());
    struct {
        const char *k, *v, *msg;
    } bad[] = {{"nope", "1", "unknown key 'nope'"},
               {"epochs", "0", "epochs=0: expected an integer in [1, 100000]"},
               {"data", "cifar", "unknown dataset"},
               {"progress", "fast", "expected auto, bar, plain or none"},
               {"noise", "nan", "noise=nan: expected a number"},
               {"seed", "-1", "non-negative"},
               {"attn", "magic", "attn"},
               {"data_dir", "d\xff\xfe", "data_dir: the value is not UTF-8 (byte 0xff at offset 1)"},
               {"data_dir", "\xc0\xaf", "not UTF-8"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "config: %s=%s refused", bad[i].k, bad[i].v);
        bk_status st = bk_run_config_set(&r, bad[i].k, bad[i].v);
        CHECK(st == BK_ERR_PARAM && has(bk_last_error(), bad[i].msg), name, "%s: %s", bk_status_str(st),
              bk_last_error());
    }
    char path[400];
    snprintf(path, sizeof path, "%s/a.conf", g_tmp);
    FILE *f = fopen(path, "w");
    fputs("data = listops  # generated\n\n  epochs= 2\nbatch 3\n", f);
    fclose(f);
    bk_run_config l = bk_run_config_default();
    bk_status st = bk_run_config_load(&l, path);
    CHECK(st == BK_ERR_PARAM && has(bk_last_error(), "a.conf:4: expected 'key = value'") && !strcmp(l.data, "listops") &&
              l.epochs == 2,
          "config file: comments, blank lines, and an error naming the line", "%s", bk_last_error());
    snprintf(path, sizeof path, "%s/none.conf", g_tmp);
    CHECK(bk_run_config_load(&l, path) == BK_ERR_IO && has(bk_last_error(), "cannot open"),
          "config file: a missing file", "%s", bk_last_error());
    /* not a config: a directory, a NUL byte, an endless input, over the limits
     * (alarm: a reader that never stops kills the test instead of hanging it) */
    alarm(120);
    l = bk_run_config_default();
    st = bk_run_config_load(&l, g_tmp);
    CHECK(st == BK_ERR_IO && has(bk_last_error(), "is a directory"), "config file: a directory is refused", "%s",
          bk_last_error());
    snprintf(path, sizeof path, "%s/nul.conf", g_tmp);
    f = fopen(path, "wb");
    fwrite("epochs = 2\nbatch = 3\0 # batch = 99\n", 1, 35, f);
    fclose(f);
    l = bk_run_config_default();
    st = bk_run_config_load(&l, path);
    CHECK(st == BK_ERR_FORMAT && has(bk_last_error(), "nul.conf: line 2 holds a NUL byte") && l.batch == 64,
          "config file: a NUL byte is refused (not the line cut short)", "%s %d", bk_last_error(), l.batch);
    st = bk_run_config_load(&l, "/dev/zero");
    CHECK(st == BK_ERR_FORMAT && has(bk_last_error(), "/dev/zero: line 1 holds a NUL byte"),
          "config file: /dev/zero stops at once", "%s", bk_last_error());
    snprintf(path, sizeof path, "%s/long.conf", g_tmp);
    f = fopen(path, "w");
    fprintf(f, "epochs = 2\n#");
    for (int i = 0; i < 4096; i++) fputc('x', f);
    fclose(f);
    st = bk_run_config_load(&l, path);
    CHECK(st == BK_ERR_FORMAT && has(bk_last_error(), "long.conf: line 2 is longer than 4096 bytes (the limit)"),
          "config file: a line over BK_RUN_CONFIG_MAX_LINE", "%s", bk_last_error());
    snprintf(path, sizeof path, "%s/big.conf", g_tmp);
    f = fopen(path, "w");
    for (int i = 0; i < 1 << 17; i++) fputs("# 45678\n", f); /* 1 MiB exactly: accepted */
    fclose(f);
    l = bk_run_config_default();
    st = bk_run_config_load(&l, path);
    f = fopen(path, "a");
    fputs("\n", f);
    fclose(f);
    bk_status st2 = bk_run_config_load(&l, path);
    CHECK(st == BK_OK && st2 == BK_ERR_FORMAT && has(bk_last_error(), "more than 1048576 bytes (the limit)"),
          "config file: BK_RUN_CONFIG_MAX_BYTES, exactly and one byte over", "%s", bk_last_error());
    alarm(0);
    remove(path);

    /* text form: whole lines, the length like snprintf, and a round trip */
    size_t n = bk_run_config_format(&r, NULL, 0);
    char *text = malloc(n + 1), small[40];
    size_t n2 = text ? bk_run_config_format(&r, text, n + 1) : 0;
    size_t n3 = bk_run_config_format(&r, small, sizeof small);
    CHECK(text && n2 == n && n3 == n && strlen(text) == n && strlen(small) < sizeof small &&
              (small[0] == 0 || small[strlen(small) - 1] == '\n') && has(text, "epochs=3\n") && has(text, "dim=32\n"),
          "config: text form (length needed, whole lines in a small buffer)", "%zu %zu %zu", n, n2, n3);
    snprintf(path, sizeof path, "%s/b.conf", g_tmp);
    f = fopen(path, "w");
    if (text) fputs(text, f);
    fclose(f);
    l = bk_run_config_default();
    char *text2 = malloc(n + 1);
    st = bk_run_config_load(&l, path);
    CHECK(st == BK_OK && text2 && bk_run_config_format(&l, text2, n + 1) == n && text && !strcmp(text, text2),
          "config: the text form loads back to the same configuration", "%s", bk_last_error());
    free(text);
    free(text2);
    remove(path);
    snprintf(path, sizeof path, "%s/a.conf", g_tmp);
    remove(path);

    char v[16];
    const char *extra = "pos_epoch=3\ndata_train=x y\nteacher=/a/b\n";
    CHECK(bk_run_extra_get(extra, "teacher", v, sizeof v) && !strcmp(v, "/a/b") &&
              bk_run_extra_get(extra, "data_train", v, 3) && !strcmp(v, "x ") && !bk_run_extra_get(extra, "pos", v, 16),
          "extra: values by key (truncated to the buffer)", "%s", "");
    CHECK(bk_run_config_from_extra(NULL, &l) == BK_ERR_FORMAT && has(bk_last_error(), "no run metadata"),
          "extra: a checkpoint without a run is refused", "%s", bk_last_error());
    CHECK(!strcmp(bk_attn_kind_name(BK_ATTN_SINKHORN), "sinkhorn") && !strcmp(bk_attn_kind_name(BK_ATTN_UNBALANCED), "unbalanced") &&
              !strcmp(bk_attn_kind_name(BK_ATTN_DIFF), "diff") && !strcmp(bk_attn_kind_name((bk_attn_kind)bk_op_count()), "?"),
          "attention kind names", "%s", "");
}

/* ---- runs ---- */
typedef struct {
    int start, steps, epochs;
    int64_t last_step, stop_at;
    int bad_order;
    volatile sig_atomic_t stop;
    int tests; /* TEST events */
} events;

static void on_event(void *user, const bk_train_event *ev)
{
    events *e = user;
    if (ev->kind == BK_TRAIN_EVENT_START) {
        e->start++;
        return;
    }
    if (ev->kind == BK_TRAIN_EVENT_TEST) {
        e->tests++;
        return;
    }
    if (ev->kind == BK_TRAIN_EVENT_STEP) {
        e->steps++;
        if (ev->step != e->last_step + 1 && e->last_step) e->bad_order++;
        e->last_step = ev->step;
        if (e->stop_at && ev->step == e->stop_at) e->stop = 1;
        return;
    }
    e->epochs++;
}

static bk_run_config tiny(const char *attn, int epochs)
{
    bk_run_config r = bk_run_config_default();
    const char *kv[][2] = {{"data", "listops"}, {"seq_len", "32"}, {"gen_train", "96"}, {"gen_test", "32"},
                           {"batch", "16"},     {"micro", "8"},    {"dim", "16"},       {"depth", "1"},
                           {"heads", "2"},      {"mlp_dim", "32"}, {"pool", "mean"},    {"cls", "0"},
                           {"dropout", "0.1"},  {"progress", "none"}, {"eval_batch", "64"}, {"attn", attn},
                           {"valid_frac", "0"}}; /* the test split each epoch (test_loop.c: validation runs) */
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (bk_run_config_set(&r, kv[i][0], kv[i][1]) != BK_OK) printf("# config: %s\n", bk_last_error());
    r.epochs = epochs;
    return r;
}

static void test_runs(void)
{
    char full[400], cut[400], p1[600], p2[600];
    snprintf(full, sizeof full, "%s/full", g_tmp);
    snprintf(cut, sizeof cut, "%s/cut", g_tmp);

    /* the uninterrupted run */
    bk_run_config r = tiny("softmax", 3);
    events ev = {0};
    bk_train_result res;
    bk_status st = bk_train_run(&r, full, BK_TRAIN_NEW, on_event, &ev, NULL, &res);
    if (!CHECK(st == BK_OK, "run: trains", "%s", bk_last_error())) return;
    const double full_acc = res.test_acc;
    CHECK(!res.stopped && res.epoch == 3 && res.step == 18 && res.batch == 0 && isfinite(res.test_acc) &&
              ev.start == 1 && ev.steps == 18 && ev.epochs == 3 && !ev.bad_order,
          "run: 3 epochs of 6 steps, one event per step and per epoch", "step %lld, events %d %d %d",
          (long long)res.step, ev.start, ev.steps, ev.epochs);
    const char *files[] = {"config.txt", "metrics.jsonl", "steps.csv", "epochs.csv", "last.safetensors",
                           "ckpt/epoch-0000.safetensors", "ckpt/epoch-0003.safetensors", "summary.json"};
    int all = 1;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) all &= exists(full, files[i]);
    CHECK(all, "run: the run directory", "%s", "");
    snprintf(p1, sizeof p1, "%s/metrics.jsonl", full);
    char *m = read_all(p1, NULL);
    int nstep = 0, nep = 0;
    for (const char *q = m; q && (q = strstr(q, "\"type\":\"")); q++) nstep += !strncmp(q, "\"type\":\"step\"", 13),
                                                                    nep += !strncmp(q, "\"type\":\"epoch\"", 14);
    CHECK(nstep == 18 && nep == 3, "run: metrics.jsonl has a record per step and per epoch", "%d %d", nstep, nep);
    free(m);
    st = bk_train_run(&r, full, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && res.stage == BK_TRAIN_STAGE_CONFIG && has(bk_last_error(), "already holds a run"),
          "run: a new run over an existing one is refused", "%s", bk_last_error());

    /* stopped by stop_after, then by the caller's flag on one thread, then to the end */
    bk_run_config rc = r;
    rc.stop_after = 5;
    st = bk_train_run(&rc, cut, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    CHECK(st == BK_OK && res.stopped && res.step == 5 && res.epoch == 0 && res.batch == 5,
          "stop_after stops after its step with a checkpoint", "%s step %lld", bk_last_error(), (long long)res.step);
    bk_run_config rr;
    int done = -1;
    st = bk_train_resume_config(cut, &rr, &done);
    CHECK(st == BK_OK && done == 0 && rr.stop_after == 0 && rr.epochs == 3 && !strcmp(rr.data, "listops"),
          "resume config: the run's own, stop_after cleared", "%s", bk_last_error());
    rr.threads = 1;
    events e2 = {0};
    e2.stop_at = 11;
    st = bk_train_run(&rr, cut, BK_TRAIN_RESUME, on_event, &e2, &e2.stop, &res);
    CHECK(st == BK_OK && res.stopped && res.step == 11 && res.epoch == 1 && e2.steps == 6,
          "the caller's stop flag stops after the step that set it", "%s step %lld", bk_last_error(),
          (long long)res.step);
    bk_set_num_threads(0);
    st = bk_train_resume_config(cut, &rr, &done);
    if (st == BK_OK) st = bk_train_run(&rr, cut, BK_TRAIN_RESUME, NULL, NULL, NULL, &res);
    CHECK(st == BK_OK && !res.stopped && res.step == 18 && done == 1, "resumed to the end", "%s", bk_last_error());
    snprintf(p1, sizeof p1, "%s/last.safetensors", full);
    snprintf(p2, sizeof p2, "%s/last.safetensors", cut);
    CHECK(same_tensors(p1, p2), "resumed weights and optimiser state == uninterrupted, bitwise", "%s", "");
    const char *mf[] = {"metrics.jsonl", "steps.csv", "epochs.csv"};
    for (int i = 0; i < 3; i++) {
        snprintf(p1, sizeof p1, "%s/%s", full, mf[i]);
        snprintf(p2, sizeof p2, "%s/%s", cut, mf[i]);
        char *a = strip_times(p1), *b = strip_times(p2), name[80];
        snprintf(name, sizeof name, "resumed %s == uninterrupted (but the timings)", mf[i]);
        CHECK(a && b && !strcmp(a, b), name, "%s", "");
        free(a);
        free(b);
    }

    /* refusals on resume */
    st = bk_train_resume_config(full, &rr, &done);
    bk_run_config changed = rr;
    changed.optim.lr *= 2;
    if (st == BK_OK) st = bk_train_run(&changed, full, BK_TRAIN_RESUME, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && res.stage == BK_TRAIN_STAGE_CONFIG && has(bk_last_error(), "(lr differs)"),
          "resume: a changed configuration is refused, naming the key", "%s", bk_last_error());
    st = bk_train_run(&rr, full, BK_TRAIN_RESUME, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && has(bk_last_error(), "has finished its 3 epochs"), "resume: a finished run", "%s",
          bk_last_error());
    snprintf(p1, sizeof p1, "%s/none", g_tmp);
    CHECK(bk_train_resume_config(p1, &rr, &done) == BK_ERR_IO && has(bk_last_error(), "no checkpoint to resume from"),
          "resume: a directory without a run", "%s", bk_last_error());

    /* evaluation of the last checkpoint == the run's last evaluation */
    snprintf(p1, sizeof p1, "%s/last.safetensors", full);
    bk_model *mdl = NULL;
    bk_run_config lr;
    char *extra = NULL;
    bk_dataset *te = NULL;
    st = bk_run_load(p1, 64, &mdl, &lr, &extra);
    if (st == BK_OK) st = bk_run_open_data(&lr, NULL, NULL, BK_SPLIT_TEST, 0, bk_model_get_config(mdl), &te);
    bk_eval_result er = {0};
    if (st == BK_OK) st = bk_evaluate(mdl, te, 0, 64, 1, &er);
    int64_t total = 0, diag = 0;
    for (int i = 0; st == BK_OK && i < er.classes * er.classes; i++) total += er.confusion[i];
    for (int i = 0; st == BK_OK && i < er.classes; i++) diag += er.confusion[i * er.classes + i];
    char v[32];
    CHECK(st == BK_OK && er.n == 32 && er.acc == full_acc && total == 32 && diag == (int64_t)llround(er.acc * 32) &&
              er.pred != NULL && bk_run_extra_get(extra, "pos_epoch", v, sizeof v) && !strcmp(v, "3"),
          "evaluation of the checkpoint == the run's last one; the confusion adds up", "%s acc %g vs %g",
          bk_last_error(), er.acc, full_acc);
    bk_layer_diag dg[1];
    int64_t ncol = 0;
    float cs[32 * 2 * 32];
    st = bk_attention_diag(mdl, te, 32, dg, cs, &ncol);
    CHECK(st == BK_OK && dg[0].row_dev < 1e-5 && dg[0].col_dev > 1e-3 && dg[0].entropy <= dg[0].uniform_entropy + 1e-6 &&
              ncol > 0 && ncol <= 32 * 2 * 32,
          "attention diagnostics: softmax rows exact, columns not; entropy below uniform", "%s", bk_last_error());
    bk_dataset *other = NULL;
    CHECK(bk_run_open_data(&lr, "shapes", NULL, BK_SPLIT_TEST, 0, bk_model_get_config(mdl), &other) == BK_ERR_SHAPE &&
              other == NULL && has(bk_last_error(), "does not have the shape"),
          "run data: a dataset of another shape is refused", "%s", bk_last_error());
    bk_eval_result_free(&er);
    bk_data_close(te);
    free(extra);
    bk_model_free(mdl);

    /* extending a finished run */
    st = bk_train_resume_config(full, &rr, &done);
    rr.epochs = 4;
    rr.optim.total_steps = 0; /* the default cosine schedule, re-planned over the extended run */
    if (st == BK_OK) st = bk_train_run(&rr, full, BK_TRAIN_RESUME, NULL, NULL, NULL, &res);
    CHECK(st == BK_OK && res.epoch == 4 && res.step == 24 && exists(full, "ckpt/epoch-0004.safetensors"),
          "resume with more epochs extends a finished run", "%s", bk_last_error());

    /* configurations that cannot be trained */
    bk_run_config bad = tiny("asap", 1);
    snprintf(p1, sizeof p1, "%s/never", g_tmp);
    st = bk_train_run(&bad, p1, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && res.stage == BK_TRAIN_STAGE_CONFIG && has(bk_last_error(), "cannot be trained") &&
              !exists(p1, "last.safetensors"),
          "attn=asap cannot be trained", "%s", bk_last_error());
    bad = tiny("softmax", 1);
    bad.model.heads = 3;
    st = bk_train_run(&bad, p1, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && res.stage == BK_TRAIN_STAGE_CONFIG && has(bk_last_error(), "heads"),
          "a model configuration that does not check", "%s", bk_last_error());
    bad = tiny("softmax", 1);
    bad.log_every = 0; /* set in C, past bk_run_config_set */
    st = bk_train_run(&bad, p1, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && res.stage == BK_TRAIN_STAGE_CONFIG && has(bk_last_error(), "log_every=0"),
          "run keys out of range are refused as bk_run_config_set would", "%s", bk_last_error());
}

/* ---- extending a run (more epochs on resume) under each schedule ---- */
static void on_lr(void *user, const bk_train_event *ev)
{
    double *lo = user; /* the smallest learning rate of the steps */
    if (ev->kind == BK_TRAIN_EVENT_STEP && ev->lr < *lo) *lo = ev->lr;
}

static void test_extend(void)
{
    /* the schedules that are functions of the step alone: 2 epochs extended
     * to 3 == the uninterrupted 3 epochs, bitwise (6 steps an epoch) */
    const char *scheds[][3] = {{"constant", "warmup", "4"}, {"step", "milestones", "8:14"}, {"invsqrt", "warmup", "3"}};
    char full[400], ext[400], p1[600], p2[600];
    bk_train_result res;
    for (int i = 0; i < 3; i++) {
        snprintf(full, sizeof full, "%s/ext-full-%s", g_tmp, scheds[i][0]);
        snprintf(ext, sizeof ext, "%s/ext-%s", g_tmp, scheds[i][0]);
        bk_run_config r = tiny("softmax", 3), rr;
        bk_run_config_set(&r, "sched", scheds[i][0]);
        bk_run_config_set(&r, scheds[i][1], scheds[i][2]);
        bk_status st = bk_train_run(&r, full, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
        r.epochs = 2;
        if (st == BK_OK) st = bk_train_run(&r, ext, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
        if (st == BK_OK) st = bk_train_resume_config(ext, &rr, NULL);
        rr.epochs = 3;
        if (st == BK_OK) st = bk_train_run(&rr, ext, BK_TRAIN_RESUME, NULL, NULL, NULL, &res);
        snprintf(p1, sizeof p1, "%s/last.safetensors", full);
        snprintf(p2, sizeof p2, "%s/last.safetensors", ext);
        char s1[600], s2[600], name[120];
        snprintf(s1, sizeof s1, "%s/steps.csv", full);
        snprintf(s2, sizeof s2, "%s/steps.csv", ext);
        char *a = strip_times(s1), *b = strip_times(s2);
        snprintf(name, sizeof name, "extend (sched=%s): 2 epochs + 1 == 3 uninterrupted, bitwise", scheds[i][0]);
        CHECK(st == BK_OK && res.step == 18 && same_tensors(p1, p2) && a && b && !strcmp(a, b), name, "%s",
              bk_last_error());
        free(a);
        free(b);
    }

    /* cosine ends at total_steps: extending past it is refused, naming the
     * ways on (a re-plan, or a new run from the weights) */
    snprintf(ext, sizeof ext, "%s/ext-cosine", g_tmp);
    bk_run_config r = tiny("softmax", 2), rr;
    bk_run_config_set(&r, "sched", "cosine");
    bk_run_config_set(&r, "warmup", "2");
    bk_status st = bk_train_run(&r, ext, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    if (st == BK_OK) st = bk_train_resume_config(ext, &rr, NULL);
    if (!CHECK(st == BK_OK && rr.optim.total_steps == 12, "cosine: total_steps=0 resolves to the run's 12 steps",
               "%s %lld", bk_last_error(), (long long)rr.optim.total_steps))
        return;
    snprintf(p1, sizeof p1, "%s/last.safetensors", ext);
    size_t n0 = 0, n1 = 0;
    char *before = read_all(p1, &n0);
    bk_run_config x = rr;
    x.epochs = 4;
    st = bk_train_run(&x, ext, BK_TRAIN_RESUME, NULL, NULL, NULL, &res);
    char *after = read_all(p1, &n1);
    CHECK(st == BK_ERR_PARAM && res.stage == BK_TRAIN_STAGE_CONFIG && has(bk_last_error(), "ends at step 12") &&
              has(bk_last_error(), "total_steps=N (N >= 24") && has(bk_last_error(), "init=") && before && after &&
              n0 == n1 && !memcmp(before, after, n0) && !exists(ext, "ckpt/epoch-0003.safetensors"),
          "extend cosine past its end: refused (no lr_min epochs), the run untouched", "%s: %s", bk_status_str(st),
          bk_last_error());
    free(before);
    free(after);
    x.optim.total_steps = 20; /* still ends before epoch 4 does */
    st = bk_train_run(&x, ext, BK_TRAIN_RESUME, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && has(bk_last_error(), "N >= 24"), "extend cosine: a re-plan that ends too early",
          "%s", bk_last_error());
    x = rr;
    x.epochs = 4;
    x.optim.total_steps = 10; /* before the current step 12 */
    st = bk_train_run(&x, ext, BK_TRAIN_RESUME, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && has(bk_last_error(), "must end after the current step 12"),
          "re-plan: a cosine schedule that would have ended already is refused", "%s", bk_last_error());
    snprintf(full, sizeof full, "%s/ext-constant", g_tmp);
    st = bk_train_resume_config(full, &x, NULL);
    x.epochs = 4;
    x.optim.total_steps = 30;
    if (st == BK_OK) st = bk_train_run(&x, full, BK_TRAIN_RESUME, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && has(bk_last_error(), "re-plans a cosine schedule"),
          "total_steps on resume of a non-cosine run is refused", "%s", bk_last_error());
    /* the re-plan over the whole extended run (total_steps=0): every step
     * trains at lr > 0, from the checkpoint's optimiser state */
    x = rr;
    x.epochs = 4;
    x.optim.total_steps = 0;
    double lo = 1e30;
    st = bk_train_run(&x, ext, BK_TRAIN_RESUME, on_lr, &lo, NULL, &res);
    bk_run_config done;
    if (st == BK_OK) st = bk_train_resume_config(ext, &done, NULL);
    CHECK(st == BK_OK && res.step == 24 && lo > 0 && done.optim.total_steps == 24 && done.epochs == 4,
          "extend cosine with total_steps=0: re-planned over 24 steps, every step at lr > 0", "%s: lr %g",
          bk_last_error(), lo);
}

/* ---- ASAP compilation ---- */
typedef struct {
    int header, layers, depth;
    int64_t samples;
} compile_events;

static void on_compile(void *user, const bk_asap_compile_event *ev)
{
    compile_events *c = user;
    if (ev->layer < 0) {
        c->header++;
        c->depth = ev->layers;
        c->samples = ev->samples;
    } else if (ev->report && ev->report->problems > 0) {
        c->layers++;
    }
}

static void test_compile(void)
{
    char dir[400], ck[600], out[600], sm[600];
    snprintf(dir, sizeof dir, "%s/sk", g_tmp);
    bk_run_config r = tiny("sinkhorn", 1);
    bk_train_result res;
    bk_status st = bk_train_run(&r, dir, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    if (!CHECK(st == BK_OK, "compile: a Sinkhorn run trains", "%s", bk_last_error())) return;
    snprintf(ck, sizeof ck, "%s/last.safetensors", dir);
    snprintf(out, sizeof out, "%s/asap.safetensors", dir);
    bk_asap_compile_config cc = bk_asap_compile_config_default();
    cc.samples = 40;
    cc.batch = 16;
    cc.slices = 8;
    compile_events ce = {0};
    st = bk_asap_compile(ck, out, &cc, on_compile, &ce);
    CHECK(st == BK_OK && ce.header == 1 && ce.depth == 1 && ce.layers == 1 && ce.samples == 40,
          "compile: calibrates on the first samples and fits every layer", "%s", bk_last_error());
    bk_model *m = NULL;
    bk_run_config lr;
    char *extra = NULL, v[600];
    st = bk_run_load(out, 8, &m, &lr, &extra);
    CHECK(st == BK_OK && bk_model_get_config(m)->attn == BK_ATTN_ASAP && lr.model.attn == BK_ATTN_ASAP &&
              bk_run_extra_get(extra, "teacher", v, sizeof v) && !strcmp(v, ck),
          "compile: an ASAP model that names its teacher", "%s", bk_last_error());
    bk_dataset *te = NULL;
    bk_eval_result er = {0};
    if (st == BK_OK) st = bk_run_open_data(&lr, NULL, NULL, BK_SPLIT_TEST, 0, bk_model_get_config(m), &te);
    if (st == BK_OK) st = bk_evaluate(m, te, 0, 8, 0, &er);
    CHECK(st == BK_OK && er.n == 32, "compile: the ASAP model evaluates", "%s", bk_last_error());
    bk_eval_result_free(&er);

    /* the endings (asap_ending, changed in place): auto is the odd-S teacher's row ending
     * (bitwise), ASAP-0 and the column ending compute something else; a model compiled with
     * --ending zero is the auto one switched to zero */
    double loss[4] = {NAN, NAN, NAN, NAN};
    const char *names[4] = {"auto", "zero", "column", "row"};
    for (int k = 0; k < 4 && st == BK_OK; k++) {
        bk_model_config c = *bk_model_get_config(m);
        bk_eval_result e = {0};
        if ((st = bk_model_config_set(&c, "asap_ending", names[k])) == BK_OK &&
            (st = bk_model_set_attn_config(m, &c)) == BK_OK && (st = bk_evaluate(m, te, 0, 8, 0, &e)) == BK_OK)
            loss[k] = e.loss;
        bk_eval_result_free(&e);
    }
    CHECK(st == BK_OK && loss[0] == loss[3] && loss[1] != loss[3] && loss[2] != loss[3] && loss[1] != loss[2],
          "compile: asap_ending: auto = row (S = 5) bitwise; zero and column differ", "auto %.9g zero %.9g column "
          "%.9g row %.9g %s", loss[0], loss[1], loss[2], loss[3], st ? bk_last_error() : "");
    cc.ending = BK_ASAP_ZERO;
    snprintf(out, sizeof out, "%s/asap0.safetensors", dir);
    bk_model *m0 = NULL;
    bk_eval_result e0 = {0};
    if ((st = bk_asap_compile(ck, out, &cc, NULL, NULL)) == BK_OK && (st = bk_run_load(out, 8, &m0, &lr, NULL)) == BK_OK)
        st = bk_evaluate(m0, te, 0, 8, 0, &e0);
    char ending[16] = "";
    if (m0) bk_model_config_get(bk_model_get_config(m0), "attn.variant", ending, sizeof ending);
    CHECK(st == BK_OK && !strcmp(ending, "zero") && e0.loss == loss[1],
          "compile: ending zero is recorded in the model and equals switching to it", "%.9g vs %.9g %s", e0.loss,
          loss[1], st ? bk_last_error() : "");
    bk_eval_result_free(&e0);
    bk_model_free(m0);
    bk_model_config bad = *bk_model_get_config(m);
    CHECK(bk_model_config_set(&bad, "asap_ending", "middle") == BK_ERR_PARAM, "compile: asap_ending=middle is refused",
          "%s", bk_last_error());
    CHECK(bk_model_config_set(&bad, "attn.variant", "middle") == BK_ERR_PARAM && has(bk_last_error(), "variant"),
          "compile: attn.variant=middle is refused", "%s", bk_last_error());
    bk_data_close(te);
    free(extra);
    bk_model_free(m);
    snprintf(sm, sizeof sm, "%s/full/last.safetensors", g_tmp);
    snprintf(out, sizeof out, "%s/never.safetensors", g_tmp);
    st = bk_asap_compile(sm, out, &cc, NULL, NULL);
    CHECK(st == BK_ERR_PARAM && has(bk_last_error(), "ASAP compiles Sinkhorn attention") && access(out, F_OK) != 0,
          "compile: a softmax model is refused", "%s", bk_last_error());
}

/* ---- plug-and-play swaps of a run's checkpoint, and fine-tuning one ---- */
static int same_params(const char *a, const char *b)
{
    bk_model *x = NULL, *y = NULL;
    int ok = bk_checkpoint_load(a, 1, &x, NULL, NULL) == BK_OK && bk_checkpoint_load(b, 1, &y, NULL, NULL) == BK_OK &&
             bk_model_num_params(x) == bk_model_num_params(y) &&
             !memcmp(bk_model_params(x), bk_model_params(y), sizeof(float) * (size_t)bk_model_num_params(x));
    bk_model_free(x);
    bk_model_free(y);
    return ok;
}

static void test_swap(void)
{
    char ck[600], out[600], back[600], p[600];
    snprintf(ck, sizeof ck, "%s/sk/last.safetensors", g_tmp); /* test_compile's Sinkhorn run */
    const char *to[][2] = {{"softmax", NULL}, {"unbalanced", "sk_rho=2"}, {"esp", "esp_soft=0,esp_tau=1"},
                           {"lot", "lot_r=3,lot_iters=5"}, {"sinkhorn", "sk_iters=7"}, {"diff", NULL}};
    for (size_t i = 0; i < sizeof to / sizeof to[0]; i++) {
        snprintf(out, sizeof out, "%s/swap-%s.safetensors", g_tmp, to[i][0]);
        bk_swap_config sc = bk_swap_config_default();
        sc.attn = to[i][0];
        sc.keys = to[i][1];
        bk_status st = bk_checkpoint_swap(ck, out, &sc);
        bk_model *m = NULL;
        bk_run_config r;
        char *extra = NULL, v[600];
        if (st == BK_OK) st = bk_run_load(out, 32, &m, &r, &extra);
        bk_dataset *te = NULL;
        bk_eval_result er = {0};
        if (st == BK_OK) st = bk_run_open_data(&r, NULL, NULL, BK_SPLIT_TEST, 0, bk_model_get_config(m), &te);
        if (st == BK_OK) st = bk_evaluate(m, te, 0, 32, 0, &er);
        char name[120];
        snprintf(name, sizeof name, "checkpoint swap sinkhorn -> %s: a run checkpoint that evaluates", to[i][0]);
        CHECK(st == BK_OK && !strcmp(bk_attn_kind_name(r.model.attn), to[i][0]) &&
                  !strcmp(bk_attn_kind_name(bk_model_get_config(m)->attn), to[i][0]) &&
                  bk_run_extra_get(extra, "swapped_from", v, sizeof v) && !strcmp(v, ck) &&
                  bk_run_extra_get(extra, "data_train", v, sizeof v) && bk_run_extra_get(extra, "data_test_version", v, sizeof v) && er.n == 32,
              name, "%s", bk_last_error());
        bk_eval_result_free(&er);
        bk_data_close(te);
        free(extra);
        bk_model_free(m);
        /* back to the source's Sinkhorn */
        snprintf(back, sizeof back, "%s/back-%s.safetensors", g_tmp, to[i][0]);
        sc.attn = "sinkhorn";
        sc.keys = "sk_iters=5,sk_eps=1";
        st = bk_checkpoint_swap(out, back, &sc);
        snprintf(name, sizeof name, "checkpoint swap %s -> sinkhorn: the source's weights bitwise", to[i][0]);
        CHECK(st == BK_OK && same_params(ck, back), name, "%s", bk_last_error());
    }
    /* fine-tuning a swapped checkpoint: a new run from it (init) */
    snprintf(out, sizeof out, "%s/swap-lot.safetensors", g_tmp);
    snprintf(p, sizeof p, "%s/ft", g_tmp);
    bk_model *m = NULL;
    bk_run_config r;
    bk_status st = bk_run_load(out, 1, &m, &r, NULL);
    bk_model_free(m);
    snprintf(r.init, sizeof r.init, "%.500s", out);
    r.epochs = 1;
    r.optim.lr = 1e-4f;
    bk_train_result res;
    if (st == BK_OK) st = bk_train_run(&r, p, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    char e0[700];
    snprintf(e0, sizeof e0, "%s/ckpt/epoch-0000.safetensors", p);
    CHECK(st == BK_OK && !res.stopped && res.epoch == 1 && isfinite(res.test_acc) && same_params(out, e0),
          "fine-tuning a swapped (LOT) checkpoint: a new run from its weights", "%s", bk_last_error());
    /* init with another attention in the run: swapped on the way in */
    st = bk_run_load(ck, 1, &m, &r, NULL);
    bk_model_free(m);
    snprintf(r.init, sizeof r.init, "%.500s", ck);
    r.epochs = 1;
    r.model.attn = BK_ATTN_SOFTMAX;
    snprintf(p, sizeof p, "%s/ft2", g_tmp);
    if (st == BK_OK) st = bk_train_run(&r, p, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    snprintf(e0, sizeof e0, "%s/ckpt/epoch-0000.safetensors", p);
    CHECK(st == BK_OK && same_params(ck, e0), "init with another attention: the checkpoint's weights, swapped", "%s",
          bk_last_error());
    r.model.dim = 32;
    snprintf(p, sizeof p, "%s/ft3", g_tmp);
    st = bk_train_run(&r, p, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && res.stage == BK_TRAIN_STAGE_CONFIG && has(bk_last_error(), "dim differs") &&
              !exists(p, "last.safetensors"),
          "init: a model that is not the checkpoint's is refused", "%s", bk_last_error());

    /* refusals: nothing written */
    snprintf(out, sizeof out, "%s/never.safetensors", g_tmp);
    snprintf(p, sizeof p, "%s/full/last.safetensors", g_tmp); /* a softmax run */
    struct {
        const char *in, *attn, *keys, *want;
        bk_status st;
    } bad[] = {{ck, "magic", NULL, "attn=magic: not a model attention operator", BK_ERR_PARAM},
               {ck, "softmax", "dim=32", "dim differs", BK_ERR_PARAM},
               {ck, "softmax", "nope=1", "unknown key 'nope'", BK_ERR_PARAM},
               {ck, "sinkhorn", "sk_iters=abc", "not an integer", BK_ERR_PARAM},
               {ck, "sinkhorn", "sk_iters=0", "sk_iters: iters=0 is outside [1, ", BK_ERR_PARAM},
               {ck, "asap", "sk_iters=3", "keys do not apply", BK_ERR_PARAM},
               {p, "asap", NULL, "swap to sinkhorn first", BK_ERR_PARAM},
               {"/nonexistent/x.safetensors", "softmax", NULL, "cannot open", BK_ERR_IO},
               {ck, NULL, NULL, "no attention named", BK_ERR_NULL}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bk_swap_config sc = bk_swap_config_default();
        sc.attn = bad[i].attn;
        sc.keys = bad[i].keys;
        st = bk_checkpoint_swap(bad[i].in, out, &sc);
        char name[120];
        snprintf(name, sizeof name, "checkpoint swap refused: %s %s", bad[i].attn ? bad[i].attn : "(none)",
                 bad[i].keys ? bad[i].keys : "");
        CHECK(st == bad[i].st && has(bk_last_error(), bad[i].want) && access(out, F_OK) != 0, name, "%s: %s",
              bk_status_str(st), bk_last_error());
    }
    const int part[] = {0, 0};
    bk_swap_config sc = bk_swap_config_default();
    sc.attn = "softmax";
    sc.blocks = part;
    sc.nblocks = 2; /* block 0 twice: the model's only block */
    st = bk_checkpoint_swap(ck, out, &sc);
    CHECK(st == BK_OK, "checkpoint swap: a block list naming every block", "%s", bk_last_error());
    remove(out);
}

/* ---- ESP: the temperature annealing of ESPFormer, and hard evaluation ---- */
static void test_esp_anneal(void)
{
    char full[400], cut[400], p1[600], p2[600];
    snprintf(full, sizeof full, "%s/esp-full", g_tmp);
    snprintf(cut, sizeof cut, "%s/esp-cut", g_tmp);
    bk_run_config r = tiny("esp", 3);
    bk_model_config_set(&r.model, "attn.t", "0.1");
    r.esp_anneal = 0.8f;
    CHECK(bk_run_config_set(&r, "esp_anneal", "0.8") == BK_OK && bk_run_config_set(&r, "eval_esp_sort", "hard") == BK_OK &&
              bk_run_config_set(&r, "esp_anneal", "1.5") == BK_ERR_PARAM &&
              bk_run_config_set(&r, "eval_esp_sort", "sharp") == BK_ERR_PARAM && has(bk_last_error(), "model, soft or hard"),
          "esp_anneal and eval_esp_sort keys (ranges)", "%s", bk_last_error());
    bk_train_result res;
    bk_status st = bk_train_run(&r, full, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    if (!CHECK(st == BK_OK && res.epoch == 3, "ESP run with annealing and hard evaluation", "%s", bk_last_error())) return;
    /* epoch e (0-based) trains with t0 0.8^e; its checkpoint (epoch-(e+1)) holds that t; epoch-0000 holds t0 */
    int sched = 1;
    for (int e = 0; e <= 3; e++) {
        bk_model_config c;
        snprintf(p1, sizeof p1, "%s/ckpt/epoch-%04d.safetensors", full, e);
        const float want = e == 0 ? 0.1f : bk_esp_anneal(0.1f, 0.8f, e - 1);
        char t[32] = "", sort[16] = "";
        sched &= bk_checkpoint_config(p1, &c) == BK_OK && bk_model_config_get(&c, "attn.t", t, sizeof t) &&
                 strtof(t, NULL) == want && bk_model_config_get(&c, "attn.sort", sort, sizeof sort) &&
                 !strcmp(sort, "soft");
    }
    CHECK(sched && bk_esp_anneal(0.1f, 0.8f, 2) == 0.1f * powf(0.8f, 2.0f),
          "annealing: the t of every epoch's checkpoint is t0 0.8^epoch", "%s", bk_last_error());
    snprintf(p1, sizeof p1, "%s/metrics.jsonl", full);
    char *mtext = read_all(p1, NULL);
    int rec = mtext != NULL;
    for (int e = 0; e < 3; e++) {
        char want[64];
        snprintf(want, sizeof want, "\"type\":\"epoch\",\"epoch\":%d,", e + 1);
        const char *q = mtext ? strstr(mtext, want) : NULL;
        snprintf(want, sizeof want, "\"esp_t\":%.9g,", (double)bk_esp_anneal(0.1f, 0.8f, e));
        rec &= q && strstr(q, want) && strstr(q, want) < strchr(q, '\n');
    }
    CHECK(rec, "annealing: the epoch records carry each epoch's t", "%s", "");
    /* hard evaluation: exactly doubly stochastic attention in the records */
    int hard = 0;
    for (const char *q = mtext; q && (q = strstr(q, "\"attn_col_dev\":")); q++) hard += strtod(q + 15, NULL) < 1e-5;
    CHECK(hard == 3, "eval_esp_sort=hard: every epoch's attention is exactly doubly stochastic", "%d of 3", hard);
    free(mtext);
    /* resumed mid-epoch 2, on one thread: the same t and the same run bit for bit */
    bk_run_config rr;
    st = stop_and_resume(&r, cut, 8, 1, &rr, &res);
    snprintf(p1, sizeof p1, "%s/last.safetensors", full);
    snprintf(p2, sizeof p2, "%s/last.safetensors", cut);
    bk_model_config c1, c2;
    CHECK(st == BK_OK && !res.stopped && same_tensors(p1, p2) && bk_checkpoint_config(p1, &c1) == BK_OK &&
              bk_checkpoint_config(p2, &c2) == BK_OK && cfg_text_eq(&c1, &c2, "attn.t") && cfg_text_eq(&rr.model, &r.model, "attn.t") && cfg_is(&r.model, "attn.t", "0.100000001"),
          "annealing resumed mid-epoch == uninterrupted (weights, t), bitwise", "%s", bk_last_error());
    snprintf(p1, sizeof p1, "%s/metrics.jsonl", full);
    snprintf(p2, sizeof p2, "%s/metrics.jsonl", cut);
    char *a = strip_times(p1), *b = strip_times(p2);
    CHECK(a && b && !strcmp(a, b), "annealing resumed: metrics == uninterrupted (but the timings)", "%s", "");
    free(a);
    free(b);
    /* the soft evaluation of the same model: not doubly stochastic */
    bk_model *m = NULL;
    bk_run_config lr;
    bk_dataset *te = NULL;
    bk_layer_diag dg[1], dh[1];
    snprintf(p1, sizeof p1, "%s/last.safetensors", full);
    st = bk_run_load(p1, 64, &m, &lr, NULL);
    if (st == BK_OK) st = bk_run_open_data(&lr, NULL, NULL, BK_SPLIT_TEST, 0, bk_model_get_config(m), &te);
    if (st == BK_OK) st = bk_attention_diag(m, te, 32, dg, NULL, NULL);
    bk_model_config hc = m ? *bk_model_get_config(m) : bk_model_config_default();
    bk_model_config_set(&hc, "attn.sort", "hard");
    if (st == BK_OK) st = bk_model_set_attn_config(m, &hc);
    if (st == BK_OK) st = bk_attention_diag(m, te, 32, dh, NULL, NULL);
    CHECK(st == BK_OK && !strcmp(lr.eval_esp_sort, "hard") && dg[0].col_dev > 1e-4 && dh[0].col_dev < 1e-5 &&
              dh[0].row_dev < 1e-5,
          "the soft-trained model: soft attention not doubly stochastic, hard exactly", "%s: soft %.3g, hard %.3g",
          bk_last_error(), dg[0].col_dev, dh[0].col_dev);
    bk_data_close(te);
    bk_model_free(m);
    /* refusals */
    bk_run_config bad = tiny("sinkhorn", 1);
    bad.esp_anneal = 0.8f;
    snprintf(p1, sizeof p1, "%s/never", g_tmp);
    st = bk_train_run(&bad, p1, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && res.stage == BK_TRAIN_STAGE_CONFIG && has(bk_last_error(), "esp_anneal"),
          "esp_anneal on a non-ESP run is refused", "%s", bk_last_error());
    bad = tiny("softmax", 1);
    snprintf(bad.eval_esp_sort, sizeof bad.eval_esp_sort, "hard");
    st = bk_train_run(&bad, p1, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && has(bk_last_error(), "eval_esp_sort=hard"), "eval_esp_sort on a non-ESP run is refused",
          "%s", bk_last_error());
}

/* otk_init: a new run's OTK pool starts from the K-means of the model's own
 * pooled sets of the first otk_init training samples (bk_model_otk_fit,
 * seeded by the run's seed): epoch-0000 holds exactly that model; a resumed
 * run does not fit again (bitwise the uninterrupted run); refusals */
static void test_otk_init(void)
{
    char full[400], cut[400], p1[600], p2[600];
    snprintf(full, sizeof full, "%s/otk-full", g_tmp);
    snprintf(cut, sizeof cut, "%s/otk-cut", g_tmp);
    bk_run_config r = tiny("softmax", 2);
    const char *kv[][2] = {{"pool", "otk"}, {"otk_anchors", "6"}, {"otk_supports", "3"}, {"otk_init", "40"},
                           {"dropout", "0"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (bk_run_config_set(&r, kv[i][0], kv[i][1]) != BK_OK) printf("# config: %s\n", bk_last_error());
    CHECK(bk_run_config_set(&r, "otk_init", "-1") == BK_ERR_PARAM, "otk_init: negative refused", "%s", bk_last_error());
    bk_train_result res;
    bk_status st = bk_train_run(&r, full, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    if (!CHECK(st == BK_OK && res.epoch == 2, "otk_init: a run with anchors fitted before the first step", "%s",
               bk_last_error()))
        return;
    /* the same fit by hand */
    bk_model *m0 = NULL, *m1 = NULL;
    bk_run_config lr;
    bk_dataset *tr = NULL;
    bk_data_batch buf = {0};
    snprintf(p1, sizeof p1, "%s/ckpt/epoch-0000.safetensors", full);
    st = bk_run_load(p1, 64, &m0, &lr, NULL);
    if (st == BK_OK) st = bk_run_open_data(&lr, NULL, NULL, BK_SPLIT_TRAIN, 0, bk_model_get_config(m0), &tr);
    if (st == BK_OK) st = bk_model_create(bk_model_get_config(m0), lr.seed, 16, &m1);
    bk_batch b;
    if (st == BK_OK) st = bk_data_batch_init(&buf, tr, 40);
    for (int i = 0; st == BK_OK && i < 40; i++) buf.idx[i] = i;
    if (st == BK_OK) st = bk_data_batch_fill(&buf, tr, 40, &b);
    bk_kmeans_config kc = bk_kmeans_config_default();
    kc.seed = lr.seed;
    int differs = 0;
    if (st == BK_OK) {
        const int64_t P = bk_model_num_params(m1);
        float *fresh = malloc(sizeof(float) * (size_t)P);
        memcpy(fresh, bk_model_params(m1), sizeof(float) * (size_t)P);
        st = bk_model_otk_fit(m1, &b, &kc, NULL);
        differs = memcmp(fresh, bk_model_params(m1), sizeof(float) * (size_t)P) != 0;
        free(fresh);
    }
    CHECK(st == BK_OK && lr.otk_init == 40 && differs &&
              !memcmp(bk_model_params(m0), bk_model_params(m1), sizeof(float) * (size_t)bk_model_num_params(m0)),
          "otk_init: epoch-0000 is the model's own K-means start (bk_model_otk_fit on the first 40 samples), bitwise",
          "%s", bk_last_error());
    bk_data_batch_free(&buf);
    bk_data_close(tr);
    bk_model_free(m0);
    bk_model_free(m1);
    /* resumed mid-run: no second fit, the same run bit for bit */
    bk_run_config rr;
    st = stop_and_resume(&r, cut, 8, 0, &rr, &res);
    snprintf(p1, sizeof p1, "%s/last.safetensors", full);
    snprintf(p2, sizeof p2, "%s/last.safetensors", cut);
    CHECK(st == BK_OK && !res.stopped && same_tensors(p1, p2), "otk_init: resumed == uninterrupted, bitwise", "%s",
          bk_last_error());
    /* refusals */
    bk_run_config bad = tiny("softmax", 1);
    bad.otk_init = 10;
    snprintf(p1, sizeof p1, "%s/never", g_tmp);
    st = bk_train_run(&bad, p1, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && res.stage == BK_TRAIN_STAGE_CONFIG && has(bk_last_error(), "otk_init=10 fits an OTK pool"),
          "otk_init without pool=otk is refused", "%s", bk_last_error());
    bad = r;
    snprintf(bad.init, sizeof bad.init, "%s/ckpt/epoch-0000.safetensors", full);
    st = bk_train_run(&bad, p1, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && has(bk_last_error(), "init="), "otk_init with init= is refused", "%s", bk_last_error());
}

/* ---- data-parallel runs: ranks as threads over shared memory ---- */
enum { MAX_RANKS = 4 };
typedef struct {
    pthread_barrier_t bar;
    const void *ptr[MAX_RANKS];
} tcomm_shared;
typedef struct {
    tcomm_shared *sh;
    int rank;
    bk_train_comm comm;
    bk_run_config r;
    const char *dir;
    bk_train_mode mode;
    bk_status st;
    bk_train_result res;
    char msg[512];
} rank_job;

static int t_bcast(void *u, void *buf, size_t n)
{
    rank_job *j = u;
    if (j->rank == 0) j->sh->ptr[0] = buf;
    pthread_barrier_wait(&j->sh->bar);
    if (j->rank) memcpy(buf, j->sh->ptr[0], n);
    pthread_barrier_wait(&j->sh->bar);
    return 0;
}
static int t_allgather(void *u, const void *send, void *recv, size_t n)
{
    rank_job *j = u;
    j->sh->ptr[j->rank] = send;
    pthread_barrier_wait(&j->sh->bar);
    for (int k = 0; k < j->comm.size; k++) memcpy((char *)recv + k * n, j->sh->ptr[k], n);
    pthread_barrier_wait(&j->sh->bar);
    return 0;
}
static int t_alltoall(void *u, const void *send, void *recv, size_t n)
{
    rank_job *j = u;
    j->sh->ptr[j->rank] = send;
    pthread_barrier_wait(&j->sh->bar);
    for (int k = 0; k < j->comm.size; k++)
        memcpy((char *)recv + k * n, (const char *)j->sh->ptr[k] + (size_t)j->rank * n, n);
    pthread_barrier_wait(&j->sh->bar);
    return 0;
}
static void *rank_main(void *arg)
{
    rank_job *j = arg;
    j->st = bk_train_run_comm(&j->r, j->dir, j->mode, &j->comm, NULL, NULL, NULL, &j->res);
    snprintf(j->msg, sizeof j->msg, "%s", j->st ? bk_last_error() : "");
    return NULL;
}
/* R ranks, rank k with configuration r[k] (r[0] for all when r1 is NULL);
 * the jobs (statuses, messages) land in jobs */
static void run_ranks(int R, const bk_run_config *r0, const bk_run_config *r1, const char *dir, bk_train_mode mode,
                      rank_job *jobs)
{
    tcomm_shared sh;
    memset(&sh, 0, sizeof sh);
    pthread_barrier_init(&sh.bar, NULL, (unsigned)R);
    pthread_t th[MAX_RANKS];
    for (int k = 0; k < R; k++) {
        rank_job *j = &jobs[k];
        memset(j, 0, sizeof *j);
        j->sh = &sh;
        j->rank = k;
        j->comm = (bk_train_comm){.rank = k, .size = R, .user = j, .bcast = t_bcast, .allgather = t_allgather,
                                  .alltoall = t_alltoall};
        j->r = k > 0 && r1 ? *r1 : *r0;
        j->dir = dir;
        j->mode = mode;
        pthread_create(&th[k], NULL, rank_main, j);
    }
    for (int k = 0; k < R; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&sh.bar);
}
static int all_ok(const rank_job *jobs, int R)
{
    for (int k = 0; k < R; k++)
        if (jobs[k].st != BK_OK) {
            printf("# rank %d: %s\n", k, jobs[k].msg);
            return 0;
        }
    return 1;
}
/* max |a - b| / max |a| over the parameters of two checkpoints */
static double param_err(const char *a, const char *b)
{
    bk_model *x = NULL, *y = NULL;
    double err = INFINITY;
    if (bk_checkpoint_load(a, 1, &x, NULL, NULL) == BK_OK && bk_checkpoint_load(b, 1, &y, NULL, NULL) == BK_OK &&
        bk_model_num_params(x) == bk_model_num_params(y)) {
        const float *p = bk_model_params(x), *q = bk_model_params(y);
        double num = 0, den = 0;
        for (int64_t i = 0; i < bk_model_num_params(x); i++) {
            num = fmax(num, fabs((double)p[i] - q[i]));
            den = fmax(den, fabs((double)p[i]));
        }
        err = num / den;
    }
    bk_model_free(x);
    bk_model_free(y);
    return err;
}
static int same_metrics(const char *a, const char *b, const char *file)
{
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%s", a, file);
    snprintf(pb, sizeof pb, "%s/%s", b, file);
    char *x = strip_times(pa), *y = strip_times(pb);
    const int ok = x && y && !strcmp(x, y);
    free(x);
    free(y);
    return ok;
}

static void test_data_parallel(void)
{
    char one[400], two[400], two_b[400], three[400], one6[400], cut[400], pa[600], pb[600];
    snprintf(one, sizeof one, "%s/dp-one", g_tmp);
    snprintf(two, sizeof two, "%s/dp-two", g_tmp);
    snprintf(two_b, sizeof two_b, "%s/dp-two-b", g_tmp);
    snprintf(three, sizeof three, "%s/dp-three", g_tmp);
    snprintf(one6, sizeof one6, "%s/dp-one6", g_tmp);
    snprintf(cut, sizeof cut, "%s/dp-cut", g_tmp);
    rank_job jobs[MAX_RANKS];
    bk_train_result res;

    /* one process, micro 8 (two chunks a batch), dropout 0.1; then two
     * ranks of one chunk each: the same computation up to the sums' order */
    bk_run_config r = tiny("sinkhorn", 2);
    r.threads = 1;
    bk_status st = bk_train_run(&r, one, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    if (!CHECK(st == BK_OK, "dp: the one-process run", "%s", bk_last_error())) return;
    run_ranks(2, &r, NULL, two, BK_TRAIN_NEW, jobs);
    if (!CHECK(all_ok(jobs, 2), "dp: 2 ranks train", "%s", jobs[0].msg)) return;
    snprintf(pa, sizeof pa, "%s/last.safetensors", one);
    snprintf(pb, sizeof pb, "%s/last.safetensors", two);
    double err = param_err(pa, pb);
    CHECK(err < 1e-4 && err > 0, "dp: 2 ranks = one process (micro 8, dropout 0.1) up to rounding",
          "max rel weight error %.3g after %lld steps (tolerance 1e-4; 0 would mean no reduction happened)", err,
          (long long)jobs[0].res.step);
    CHECK(jobs[0].res.step == res.step && jobs[1].res.step == res.step && jobs[1].res.test_acc == jobs[0].res.test_acc,
          "dp: every rank's result (steps, test accuracy from rank 0)", "%lld %lld %g %g", (long long)jobs[0].res.step,
          (long long)jobs[1].res.step, jobs[0].res.test_acc, jobs[1].res.test_acc);
    CHECK(fabs(jobs[0].res.test_loss - res.test_loss) < 1e-4 * fabs(res.test_loss),
          "dp: 2 ranks: test loss = one process's", "%.9g vs %.9g", jobs[0].res.test_loss, res.test_loss);

    /* bitwise reproducible for a fixed number of ranks, whatever the threads */
    bk_run_config r2 = r;
    r2.threads = 2;
    run_ranks(2, &r2, NULL, two_b, BK_TRAIN_NEW, jobs);
    snprintf(pa, sizeof pa, "%s/last.safetensors", two_b);
    CHECK(all_ok(jobs, 2) && same_tensors(pa, pb) && same_metrics(two, two_b, "steps.csv") &&
              same_metrics(two, two_b, "epochs.csv"),
          "dp: 2 ranks again (2 threads each): bitwise the same weights, state and metrics", "%s", "");

    /* 3 ranks, micro 0: chunks of ceil(16 / 3) = 6 = one process with micro 6 */
    bk_run_config r3 = r;
    r3.micro = 0;
    run_ranks(3, &r3, NULL, three, BK_TRAIN_NEW, jobs);
    bk_run_config r6 = r;
    r6.micro = 6;
    st = bk_train_run(&r6, one6, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    snprintf(pa, sizeof pa, "%s/last.safetensors", three);
    snprintf(pb, sizeof pb, "%s/last.safetensors", one6);
    err = param_err(pa, pb);
    CHECK(all_ok(jobs, 3) && st == BK_OK && err < 1e-4, "dp: 3 ranks (micro 0) = one process with micro 6",
          "max rel weight error %.3g (tolerance 1e-4)", err);

    /* only rank 0 wrote: the run directory is a normal run's */
    CHECK(exists(three, "summary.json") && exists(three, "ckpt/epoch-0002.safetensors") && exists(three, "steps.csv"),
          "dp: rank 0 writes the run directory", "%s", three);

    /* stop after 5 steps, resume on 2 ranks: bitwise the uninterrupted run */
    bk_run_config rc = r;
    rc.stop_after = 5;
    run_ranks(2, &rc, NULL, cut, BK_TRAIN_NEW, jobs);
    const int stopped = all_ok(jobs, 2) && jobs[0].res.stopped && jobs[1].res.stopped && jobs[0].res.step == 5;
    bk_run_config rr;
    st = bk_train_resume_config(cut, &rr, NULL);
    run_ranks(2, &rr, NULL, cut, BK_TRAIN_RESUME, jobs);
    snprintf(pa, sizeof pa, "%s/last.safetensors", cut);
    snprintf(pb, sizeof pb, "%s/last.safetensors", two);
    CHECK(stopped && st == BK_OK && all_ok(jobs, 2) && same_tensors(pa, pb) && same_metrics(cut, two, "steps.csv") &&
              same_metrics(cut, two, "epochs.csv"),
          "dp: stopped at step 5 and resumed on 2 ranks = the uninterrupted run, bitwise", "stopped %d", stopped);

    /* a rank with another configuration: refused on every rank, named */
    bk_run_config bad = r;
    bad.optim.lr *= 2;
    snprintf(pa, sizeof pa, "%s/dp-bad", g_tmp);
    run_ranks(2, &r, &bad, pa, BK_TRAIN_NEW, jobs);
    CHECK(jobs[0].st == BK_ERR_PARAM && jobs[1].st == BK_ERR_PARAM && has(jobs[1].msg, "rank 1's configuration") &&
              has(jobs[1].msg, "lr=") && has(jobs[0].msg, "rank 1"),
          "dp: a rank's different lr is refused on every rank", "rank 0: %s | rank 1: %s", jobs[0].msg, jobs[1].msg);
    CHECK(access(pa, F_OK) != 0, "dp: a refused configuration leaves no run directory", "%s exists", pa);
    /* ... and a refused resume (an extension, rank 1 with another lr) leaves the run as it was */
    snprintf(pb, sizeof pb, "%s/config.txt", two);
    char *cfg0 = read_all(pb, NULL);
    snprintf(pb, sizeof pb, "%s/metrics.jsonl", two);
    char *met0 = read_all(pb, NULL);
    st = bk_train_resume_config(two, &rr, NULL);
    rr.epochs = 3;
    bad = rr;
    bad.optim.lr *= 2;
    run_ranks(2, &rr, &bad, two, BK_TRAIN_RESUME, jobs);
    snprintf(pb, sizeof pb, "%s/config.txt", two);
    char *cfg1 = read_all(pb, NULL);
    snprintf(pb, sizeof pb, "%s/metrics.jsonl", two);
    char *met1 = read_all(pb, NULL);
    CHECK(st == BK_OK && jobs[0].st == BK_ERR_PARAM && jobs[1].st == BK_ERR_PARAM && cfg0 && cfg1 && met0 && met1 &&
              !strcmp(cfg0, cfg1) && !strcmp(met0, met1),
          "dp: a refused resume leaves the run directory untouched (config.txt, metrics)", "%s | %s", jobs[0].msg,
          jobs[1].msg);
    free(cfg0);
    free(cfg1);
    free(met0);
    free(met1);

    /* a rank failing its own setup: every rank returns (nobody waits) */
    bad = r;
    snprintf(bad.init, sizeof bad.init, "%s/missing.safetensors", g_tmp);
    snprintf(pa, sizeof pa, "%s/dp-bad2", g_tmp);
    run_ranks(2, &r, &bad, pa, BK_TRAIN_NEW, jobs);
    CHECK(jobs[0].st != BK_OK && jobs[1].st == BK_ERR_IO && has(jobs[0].msg, "rank 1 failed") &&
              has(jobs[1].msg, "missing.safetensors"),
          "dp: a rank's failed setup ends every rank", "rank 0: %s | rank 1: %s", jobs[0].msg, jobs[1].msg);
    CHECK(access(pa, F_OK) != 0 && has(jobs[0].msg, "rank 1 failed (setup)"),
          "dp: a rank's failed setup: no run directory; rank 0 names the stage", "%s", jobs[0].msg);

    /* a malformed comm */
    bk_train_comm c = {.rank = 2, .size = 2};
    st = bk_train_run_comm(&r, pa, BK_TRAIN_NEW, &c, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && res.stage == BK_TRAIN_STAGE_COMM, "dp: a rank outside [0, size) is refused (stage COMM: "
          "nothing agreed, the caller ends the ranks)", "%s", bk_last_error());
}

/* A Set Transformer run (ISAB blocks, PMA pooling) on generated point
 * clouds trains end to end; the diagnostics read the ISAB blocks' first
 * maps (inducing points x the set): softmax rows exact, and a long Sinkhorn
 * brings the columns to their rectangular marginal m / n (normalised to 1) */
static void test_set_run(void)
{
    char dir[400], p1[600];
    snprintf(dir, sizeof dir, "%s/set", g_tmp);
    bk_run_config r = bk_run_config_default();
    const char *kv[][2] = {{"data", "shapes"}, {"points", "16"},  {"gen_train", "64"}, {"gen_test", "32"},
                           {"batch", "16"},     {"dim", "16"},      {"depth", "2"},      {"heads", "2"},
                           {"mlp_dim", "16"},   {"cls", "0"},       {"pos_embed", "0"},  {"set_block", "isab"},
                           {"set_inducing", "4"}, {"pool", "pma"},  {"pma_seeds", "2"},  {"progress", "none"},
                           {"eval_batch", "32"}, {"attn", "softmax"}, {"valid_frac", "0"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (bk_run_config_set(&r, kv[i][0], kv[i][1]) != BK_OK) printf("# config: %s\n", bk_last_error());
    r.epochs = 2;
    bk_train_result res;
    bk_status st = bk_train_run(&r, dir, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    if (!CHECK(st == BK_OK && res.epoch == 2 && isfinite(res.test_acc), "set run: ISAB + PMA on shapes trains", "%s",
               bk_last_error()))
        return;
    snprintf(p1, sizeof p1, "%s/last.safetensors", dir);
    bk_model *m = NULL, *sk = NULL;
    bk_run_config lr;
    bk_dataset *te = NULL;
    st = bk_run_load(p1, 32, &m, &lr, NULL);
    if (st == BK_OK) st = bk_run_open_data(&lr, NULL, NULL, BK_SPLIT_TEST, 0, bk_model_get_config(m), &te);
    bk_layer_diag dg[2], dk[2];
    int64_t ncol = 0;
    float *cs = malloc(sizeof(float) * 2 * 32 * 2 * 16);
    if (st == BK_OK) st = bk_attention_diag(m, te, 32, dg, cs, &ncol);
    CHECK(st == BK_OK && dg[0].row_dev < 1e-5 && dg[1].row_dev < 1e-5 && dg[0].col_dev > 1e-3 && ncol == 32 * 2 * 16 &&
              dg[1].entropy <= dg[1].uniform_entropy + 1e-6,
          "set run: ISAB diagnostics, softmax rows exact, columns not", "%s: col %.3g, ncol %lld", bk_last_error(),
          dg[0].col_dev, (long long)ncol);
    bk_model_config c = m ? *bk_model_get_config(m) : bk_model_config_default();
    c.attn = BK_ATTN_SINKHORN;
    bk_model_config_set(&c, "attn.iters", "201");
    if (st == BK_OK) st = bk_model_swap(m, &c, NULL, 0, 32, &sk);
    if (st == BK_OK) st = bk_attention_diag(sk, te, 32, dk, NULL, NULL);
    CHECK(st == BK_OK && dk[0].row_dev < 1e-5 && dk[0].col_dev < 1e-3 && dk[1].col_dev < 1e-3,
          "set run: swapped to Sinkhorn S = 201, the ISAB maps' columns reach m / n", "%s: col %.3g %.3g",
          bk_last_error(), dk[0].col_dev, dk[1].col_dev);
    free(cs);
    bk_data_close(te);
    bk_model_free(sk);
    bk_model_free(m);
}

static void rm_rf(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) printf("# could not remove %s\n", path);
}

/* ---- resume after the metrics lost records before the checkpoint ---- */
typedef struct {
    int start;
    char notice[4096];
} notes;

static void on_note(void *user, const bk_train_event *ev)
{
    notes *n = user;
    if (ev->kind != BK_TRAIN_EVENT_START) return;
    n->start++;
    snprintf(n->notice, sizeof n->notice, "%s", ev->notice ? ev->notice : "");
}

/* resumes dir to stop_after `stop`, the START event's notice into n */
static bk_status resume_to(const char *dir, int64_t stop, notes *n)
{
    bk_run_config rr;
    memset(n, 0, sizeof *n);
    bk_status st = bk_train_resume_config(dir, &rr, NULL);
    rr.stop_after = stop;
    bk_train_result res;
    if (st == BK_OK) st = bk_train_run(&rr, dir, BK_TRAIN_RESUME, on_note, n, NULL, &res);
    return st == BK_OK && (!res.stopped || res.step != stop) ? BK_ERR_NUMERIC : st;
}

/* the step numbers of the step records of a metrics.jsonl, joined by ',' */
static void step_list(const char *path, char *out, size_t cap)
{
    char *m = read_all(path, NULL);
    out[0] = 0;
    for (const char *q = m; q && (q = strstr(q, "{\"type\":\"step\",\"step\":")); q++) {
        size_t u = strlen(out);
        snprintf(out + u, cap - u, "%s%lld", u ? "," : "", strtoll(q + 22, NULL, 10));
    }
    free(m);
}

static void test_resume_gap(void)
{
    char dir[400], p[600], q[1000], got[400];
    snprintf(dir, sizeof dir, "%s/gap", g_tmp);
    bk_run_config r = tiny("softmax", 3); /* 6 steps an epoch, a record every step */
    r.stop_after = 10;
    bk_train_result res;
    bk_status st = bk_train_run(&r, dir, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    if (!CHECK(st == BK_OK && res.step == 10, "gap: a run stopped at step 10", "%s", bk_last_error())) return;
    notes n;
    st = resume_to(dir, 11, &n);
    CHECK(st == BK_OK && n.start == 1 && !n.notice[0], "gap: intact records, no notice", "%s '%s'", bk_last_error(),
          n.notice);
    /* metrics.jsonl cut after step 3's record (steps 4-11 and epoch 1 lost), a line that is not a record and one
     * holding a NUL byte after it */
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    char *m = read_all(p, NULL);
    char *cut = m ? strstr(m, "{\"type\":\"step\",\"step\":4,") : NULL;
    if (!CHECK(cut != NULL, "gap: step 4's record", "%s", "")) {
        free(m);
        return;
    }
    FILE *f = fopen(p, "wb");
    fwrite(m, 1, (size_t)(cut - m), f);
    fwrite("garbage\n{\"type\":\"step\",\"step\":5,\0}\n{\"type\":\"step\",\"st", 1, 53, f);
    fclose(f);
    free(m);
    st = resume_to(dir, 12, &n);
    snprintf(q, sizeof q, "%s: 8 step records before the checkpoint's step 11 are missing (the first: steps 4-11, "
                          "logged every 1; the file was cut or edited)", p);
    int ok = has(n.notice, q);
    snprintf(q, sizeof q, "%s: 1 epoch record before the checkpoint's epoch 1 is missing (the first: epoch 1;", p);
    step_list(p, got, sizeof got);
    CHECK(st == BK_OK && ok && has(n.notice, q) && !has(n.notice, "steps.csv") && !strcmp(got, "1,2,3,12"),
          "gap: the resume names the missing step and epoch records; the lines that are not records go",
          "%s '%s' steps %s", bk_last_error(), n.notice, got);
    /* steps.csv cut to its header: named too (the jsonl's gap again) */
    snprintf(p, sizeof p, "%s/steps.csv", dir);
    f = fopen(p, "w");
    fputs("step,epoch,batch,loss,acc,lr,gnorm,samples_per_s,time_s\n", f);
    fclose(f);
    st = resume_to(dir, 13, &n);
    snprintf(q, sizeof q, "%s: 12 step records before the checkpoint's step 12 are missing (the first: steps 1-12,", p);
    CHECK(st == BK_OK && has(n.notice, q) && has(n.notice, "metrics.jsonl: 8 step records"),
          "gap: a cut steps.csv is named, with the metrics.jsonl's gap", "%s '%s'", bk_last_error(), n.notice);
    /* an endless metrics file (a link to /dev/zero) stops the resume with the reader's message */
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    remove(p);
    alarm(120);
    st = symlink("/dev/zero", p) == 0 ? resume_to(dir, 14, &n) : BK_ERR_IO;
    alarm(0);
    CHECK(st == BK_ERR_IO && has(bk_last_error(), "metrics.jsonl: line 1 is longer than 1048576 bytes (the limit)"),
          "gap: an endless metrics.jsonl stops the resume", "%s", bk_last_error());
}


/* ---- model selection on a validation split, early stopping (issue 43) ---- */

/* the number after "key": in a JSON text (NAN if absent) */
static double json_num(const char *s, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = s ? strstr(s, pat) : NULL;
    return p ? strtod(p + strlen(pat), NULL) : NAN;
}

static void test_defaults(void)
{
    bk_run_config r = bk_run_config_default();
    CHECK(r.optim.kind == BK_OPT_ADAMW && r.optim.sched == BK_SCHED_COSINE && r.optim.warmup == -1 &&
              r.optim.total_steps == 0 && r.optim.decay_embed == 0 && fabsf(r.optim.weight_decay - 0.01f) < 1e-9f &&
              fabsf(r.data_config.valid_frac - 0.1f) < 1e-9f && !strcmp(r.select, "auto") && r.patience == 0,
          "defaults: AdamW, cosine over the run after the automatic warm-up, no decay on token tables, valid_frac 0.1",
          "%s", "");
    /* the warm-up rule: 5 % of the steps, rounded down, at most 1000 */
    const int64_t steps[] = {1, 19, 20, 240, 12345, 20000, 1000000};
    const int want[] = {0, 0, 1, 12, 617, 1000, 1000};
    int ok = 1;
    for (int i = 0; i < 7; i++) {
        bk_run_config q = tiny("softmax", 1);
        q.data_config.gen_train = steps[i] * q.batch;
        q.data_config.gen_test = 16;
        bk_dataset *tr = NULL;
        bk_data_config dc = bk_run_data_config(&q);
        ok &= bk_data_open(q.data, BK_SPLIT_TRAIN, &dc, &tr) == BK_OK && bk_run_config_resolve(&q, tr) == BK_OK &&
              q.optim.warmup == want[i] && q.optim.total_steps == steps[i];
        bk_data_close(tr);
        if (!ok) {
            printf("# %lld steps: warmup %d total %lld %s\n", (long long)steps[i], q.optim.warmup,
                   (long long)q.optim.total_steps, bk_last_error());
            break;
        }
    }
    CHECK(ok, "defaults: warm-up = 5 % of the run's steps (at most 1000), recorded with the cosine's length", "%s", "");
    /* an explicit warm-up and a non-cosine schedule stay as given */
    bk_run_config q = tiny("softmax", 2);
    bk_run_config_set(&q, "warmup", "3");
    bk_run_config_set(&q, "sched", "constant");
    bk_dataset *tr = NULL;
    bk_data_config dc = bk_run_data_config(&q);
    CHECK(bk_data_open(q.data, BK_SPLIT_TRAIN, &dc, &tr) == BK_OK && bk_run_config_resolve(&q, tr) == BK_OK &&
              q.optim.warmup == 3 && q.optim.total_steps == 0,
          "defaults: warmup and sched given are kept", "%d", q.optim.warmup);
    bk_data_close(tr);
    bk_optim_config oc = bk_optim_config_default();
    oc.warmup = -1;
    bk_model *m = NULL;
    bk_optim *o = NULL;
    bk_model_config mc = bk_model_config_default();
    bk_model_config_parse(&mc, "input=tokens,vocab=12,max_len=8,classes=3,dim=8,depth=1,heads=2,mlp_dim=8");
    bk_status st = bk_model_create(&mc, 1, 4, &m);
    CHECK(st == BK_OK && bk_optim_create(&oc, m, &o) == BK_ERR_PARAM && has(bk_last_error(), "warm-up"),
          "optimiser: warmup -1 outside a run is refused", "%s", bk_last_error());
    /* decay_embed: with a zero gradient AdamW moves a tensor only by its
     * decay: Linear weights always, the token table only with decay_embed=1,
     * biases and norms never */
    for (int de = 0; de < 2 && st == BK_OK; de++) {
        oc = bk_optim_config_default();
        oc.weight_decay = 0.5f;
        oc.lr = 0.1f;
        oc.decay_embed = de;
        bk_model_free(m);
        m = NULL;
        st = bk_model_create(&mc, 1, 4, &m);
        if (st == BK_OK) st = bk_optim_create(&oc, m, &o);
        const int64_t P = bk_model_num_params(m);
        float *w0 = malloc(sizeof(float) * (size_t)P);
        memcpy(w0, bk_model_params(m), sizeof(float) * (size_t)P);
        memset(bk_model_grads(m), 0, sizeof(float) * (size_t)P);
        if (st == BK_OK) st = bk_optim_step(o, m, NULL);
        int right = st == BK_OK, seen = 0;
        for (int i = 0; right && i < bk_model_param_count(m); i++) {
            bk_param_info pi;
            bk_model_param(m, i, &pi);
            int moved = 0;
            for (int64_t j = 0; j < pi.count; j++) moved |= pi.data[j] != w0[pi.offset + j];
            const int embed = !strcmp(pi.name, "embed.table");
            const int want_moved = pi.decay == BK_DECAY_WEIGHT || (embed && de);
            seen += embed && pi.decay == BK_DECAY_EMBED;
            right = moved == want_moved && (embed || pi.decay != BK_DECAY_EMBED) &&
                    (!strstr(pi.name, "bias") || pi.decay == BK_DECAY_NONE) &&
                    (!strstr(pi.name, "ln") || strstr(pi.name, "weight") == NULL || pi.decay == BK_DECAY_NONE);
            if (!right) printf("# %s decay %d moved %d\n", pi.name, pi.decay, moved);
        }
        char name[120];
        snprintf(name, sizeof name, "optimiser: decay_embed=%d decays Linear weights%s; biases and norms never", de,
                 de ? " and the token table" : ", not the token table");
        CHECK(right && seen == 1, name, "%s", bk_last_error());
        free(w0);
        bk_optim_free(o);
        o = NULL;
    }
    bk_model_free(m);
    /* a run stored before issue 43 (no decay_embed key) decayed its token table */
    bk_run_config a;
    CHECK(bk_run_config_from_extra("pos_epoch=1\nlr=0.01\n", &a) == BK_OK && a.optim.decay_embed == 1 &&
              a.data_config.valid_frac == 0 &&
              bk_run_config_from_extra("pos_epoch=1\ndecay_embed=0\n", &a) == BK_OK && a.optim.decay_embed == 0,
          "stored runs: decay_embed absent reads 1 (the old behaviour), present as stored", "%s", bk_last_error());
}

/* the listops run of tiny() with a validation split */
static bk_run_config tiny_valid(int epochs)
{
    bk_run_config r = tiny("softmax", epochs);
    r.data_config.valid_frac = 0.25f;
    r.data_config.gen_train = 128;
    return r;
}

static void test_valid_run(void)
{
    char full[400], cut[400], p1[700], p2[700];
    snprintf(full, sizeof full, "%s/valid-full", g_tmp);
    snprintf(cut, sizeof cut, "%s/valid-cut", g_tmp);
    bk_run_config r = tiny_valid(3);
    bk_train_result res, res2;
    events ev = {0};
    bk_status st = bk_train_run(&r, full, BK_TRAIN_NEW, on_event, &ev, NULL, &res);
    snprintf(p1, sizeof p1, "%s/metrics.jsonl", full);
    char *mj = read_all(p1, NULL);
    snprintf(p1, sizeof p1, "%s/summary.json", full);
    char *sum = read_all(p1, NULL);
    snprintf(p1, sizeof p1, "%s/epochs.csv", full);
    char *ec = read_all(p1, NULL);
    const char *trec = mj ? strstr(mj, "{\"type\":\"test\"") : NULL;
    CHECK(st == BK_OK && res.epoch == 3 && !res.stopped && !res.early_stopped && res.best_epoch >= 1 &&
              res.best_epoch <= 3 && isfinite(res.test_acc) && isfinite(res.valid_acc) && ev.epochs == 3 &&
              exists(full, "best.safetensors") && mj && strstr(mj, "\"valid_loss\":") && strstr(mj, "\"valid_acc\":") &&
              strstr(mj, "\"test_loss\":") > trec && ev.tests == 1 && trec && !strstr(trec + 1, "{\"type\":\"test\"") &&
              json_num(trec, "best_epoch") == res.best_epoch && fabs(json_num(trec, "test_acc") - res.test_acc) < 1e-5 &&
              ec && !strncmp(ec, "epoch,step,train_loss,train_acc,valid_loss,valid_acc,", 53),
          "validation run: valid_* each epoch, best.safetensors, one test record at the end", "%s best %d",
          bk_last_error(), res.best_epoch);
    CHECK(sum && json_num(sum, "best_epoch") == res.best_epoch && fabs(json_num(sum, "test_acc") - res.test_acc) < 1e-5 &&
              fabs(json_num(sum, "best_valid_acc") - res.valid_acc) < 1e-5 && strstr(sum, "\"early_stopped\":false") &&
              strstr(sum, "\"select\":\"acc\"") && json_num(sum, "epochs_trained") == 3,
          "validation run: summary.json holds the test figures of the best epoch", "%s", sum ? sum : "(none)");
    /* best.safetensors holds the best epoch's weights; the test figures are
     * its evaluation on the test split */
    snprintf(p1, sizeof p1, "%s/best.safetensors", full);
    snprintf(p2, sizeof p2, "%s/ckpt/epoch-%04d.safetensors", full, res.best_epoch);
    bk_model *mb = NULL;
    bk_run_config rb;
    bk_dataset *te = NULL;
    bk_eval_result er = {0};
    char *extra = NULL, v[64] = "";
    st = bk_run_load(p1, 64, &mb, &rb, &extra);
    if (st == BK_OK) st = bk_run_open_data(&rb, NULL, NULL, BK_SPLIT_TEST, 0, bk_model_get_config(mb), &te);
    if (st == BK_OK) st = bk_evaluate(mb, te, 0, 64, 0, &er);
    CHECK(st == BK_OK && same_params(p1, p2) && er.acc == res.test_acc && er.loss == res.test_loss &&
              bk_run_extra_get(extra, "pos_best_epoch", v, sizeof v) && atoi(v) == res.best_epoch,
          "best.safetensors: the best epoch's weights and run metadata; the test figures are its evaluation",
          "%s acc %g vs %g", bk_last_error(), er.acc, res.test_acc);
    bk_eval_result_free(&er);
    bk_data_close(te);
    bk_model_free(mb);
    free(extra);
    /* the best epoch is the first maximum of the validation accuracy */
    double best = -1;
    int be = 0;
    for (const char *q = mj; q && (q = strstr(q, "{\"type\":\"epoch\"")); q++) {
        const double a = json_num(q, "valid_acc");
        if (a > best) best = a, be = (int)json_num(q, "epoch");
    }
    CHECK(be == res.best_epoch, "validation run: the best epoch is the first maximum of valid_acc (select=auto)",
          "%d vs %d", be, res.best_epoch);
    /* stopped and resumed: the same run bitwise, its best and test too */
    bk_run_config rr;
    st = stop_and_resume(&r, cut, 7, 1, &rr, &res2);
    int same = st == BK_OK && res2.best_epoch == res.best_epoch && res2.test_acc == res.test_acc &&
               res2.valid_acc == res.valid_acc;
    const char *files[] = {"metrics.jsonl", "epochs.csv", "steps.csv"};
    for (int i = 0; i < 3 && same; i++) {
        snprintf(p1, sizeof p1, "%s/%s", full, files[i]);
        snprintf(p2, sizeof p2, "%s/%s", cut, files[i]);
        char *a = strip_times(p1), *b = strip_times(p2);
        same = a && b && !strcmp(a, b);
        free(a);
        free(b);
    }
    snprintf(p1, sizeof p1, "%s/best.safetensors", full);
    snprintf(p2, sizeof p2, "%s/best.safetensors", cut);
    same = same && same_params(p1, p2);
    snprintf(p1, sizeof p1, "%s/last.safetensors", full);
    snprintf(p2, sizeof p2, "%s/last.safetensors", cut);
    same = same && same_tensors(p1, p2);
    CHECK(same, "validation run: stopped and resumed == uninterrupted (metrics, best, last, test), bitwise", "%s",
          bk_last_error());
    free(mj);
    free(sum);
    free(ec);

    /* select=loss picks the first minimum of valid_loss */
    snprintf(full, sizeof full, "%s/valid-loss", g_tmp);
    r = tiny_valid(3);
    bk_run_config_set(&r, "select", "loss");
    st = bk_train_run(&r, full, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    snprintf(p1, sizeof p1, "%s/metrics.jsonl", full);
    mj = read_all(p1, NULL);
    best = INFINITY;
    be = 0;
    for (const char *q = mj; q && (q = strstr(q, "{\"type\":\"epoch\"")); q++) {
        const double a = json_num(q, "valid_loss");
        if (a < best) best = a, be = (int)json_num(q, "epoch");
    }
    CHECK(st == BK_OK && be == res.best_epoch && fabs(res.valid_loss - best) < 1e-5 * fabs(best),
          "select=loss: the best epoch is the first minimum of valid_loss", "%d vs %d", be, res.best_epoch);
    free(mj);

    /* patience: no epoch beats the first (the learning rate too small to
     * change a prediction: accuracy ties keep the earlier epoch) */
    snprintf(full, sizeof full, "%s/valid-early", g_tmp);
    r = tiny_valid(6);
    r.patience = 2;
    r.optim.lr = 1e-9f;
    bk_run_config_set(&r, "select", "acc");
    ev = (events){0};
    st = bk_train_run(&r, full, BK_TRAIN_NEW, on_event, &ev, NULL, &res);
    snprintf(p1, sizeof p1, "%s/summary.json", full);
    sum = read_all(p1, NULL);
    CHECK(st == BK_OK && res.early_stopped && !res.stopped && res.epoch == 3 && res.best_epoch == 1 && ev.epochs == 3 &&
              sum && strstr(sum, "\"early_stopped\":true") && !exists(full, "ckpt/epoch-0004.safetensors"),
          "patience=2: the run finishes after 2 epochs without a better metric", "%s epoch %d best %d",
          bk_last_error(), res.epoch, res.best_epoch);
    free(sum);
    st = bk_train_resume_config(full, &rr, NULL);
    if (st == BK_OK) st = bk_train_run(&rr, full, BK_TRAIN_RESUME, NULL, NULL, NULL, &res);
    CHECK(st == BK_ERR_PARAM && has(bk_last_error(), "stopped early at epoch 3") && has(bk_last_error(), "best.safetensors"),
          "patience: an early-stopped run is finished (resume refused, naming best.safetensors)", "%s",
          bk_last_error());
    /* no validation split: valid_frac=0 (and a run stored before the key) */
    snprintf(full, sizeof full, "%s/novalid", g_tmp);
    r = tiny("softmax", 1);
    st = bk_train_run(&r, full, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    snprintf(p1, sizeof p1, "%s/metrics.jsonl", full);
    mj = read_all(p1, NULL);
    CHECK(st == BK_OK && !exists(full, "best.safetensors") && mj && strstr(mj, "\"test_acc\":") &&
              !strstr(mj, "valid_") && !strstr(mj, "\"type\":\"test\"") && isnan(res.valid_acc) && res.best_epoch == 0,
          "valid_frac=0: the test split each epoch, no best.safetensors (as before issue 43)", "%s", bk_last_error());
    free(mj);
}


/* ---- defaults that learn (issue 43): a copy task and a small image task
 * through bk_train_run with the run defaults (AdamW, warm-up, cosine) ---- */

/* the first step record's loss and the last one's in a run's metrics */
static void first_last_loss(const char *dir, double *first, double *last)
{
    char p[700];
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    char *mj = read_all(p, NULL);
    *first = *last = NAN;
    for (const char *q = mj; q && (q = strstr(q, "{\"type\":\"step\"")); q++) {
        if (isnan(*first)) *first = json_num(q, "loss");
        *last = json_num(q, "loss");
    }
    free(mj);
}

static void test_learn_copy(void)
{
    char dir[400], src[500], tgt[500];
    snprintf(dir, sizeof dir, "%s/copy", g_tmp);
    snprintf(src, sizeof src, "%s/copy.src", g_tmp);
    snprintf(tgt, sizeof tgt, "%s/copy.tgt", g_tmp);
    FILE *a = fopen(src, "w"), *b = fopen(tgt, "w");
    th_rng rng = {43};
    for (int i = 0; a && b && i < 1024; i++) { /* 3 to 8 symbols of 12 (ids 4..15), copied */
        const int L = 3 + (int)(th_next(&rng) % 6);
        for (int k = 0; k < L; k++) {
            const int v = 4 + (int)(th_next(&rng) % 12);
            fprintf(a, k ? " %d" : "%d", v);
            fprintf(b, k ? " %d" : "%d", v);
        }
        fputc('\n', a);
        fputc('\n', b);
    }
    if (a) fclose(a);
    if (b) fclose(b);
    bk_run_config r = bk_run_config_default();
    char spec[1100];
    snprintf(spec, sizeof spec, "ids:%s,%s", src, tgt);
    const char *kv[][2] = {{"data", spec}, {"dim", "32"},        {"depth", "1"},       {"dec_depth", "1"},
                           {"heads", "2"}, {"mlp_dim", "64"},    {"batch", "32"},      {"attn", "softmax"},
                           {"progress", "none"}, {"eval_batch", "128"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (bk_run_config_set(&r, kv[i][0], kv[i][1]) != BK_OK) printf("# config: %s\n", bk_last_error());
    r.epochs = 40;
    bk_train_result res;
    bk_status st = bk_train_run(&r, dir, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    double first, last;
    first_last_loss(dir, &first, &last);
    CHECK(st == BK_OK && last < 0.15 * first && res.test_acc > 0.9,
          "defaults learn: a copy task (seq2seq, ids:) through bk_train_run", "%s loss %g -> %g, test token acc %g",
          bk_last_error(), first, last, res.test_acc);
}

static void test_learn_image(void)
{
    char dir[400], data[400], px[500], py[500];
    snprintf(dir, sizeof dir, "%s/img", g_tmp);
    snprintf(data, sizeof data, "%s/img-data", g_tmp);
    mkdir(data, 0777);
    snprintf(px, sizeof px, "%s/x.npy", data);
    snprintf(py, sizeof py, "%s/y.npy", data);
    /* 8x8 images of 4 classes: a bright 4x4 quadrant (the class) on noise */
    enum { N = 640 };
    float *x = malloc(sizeof(float) * N * 64);
    int32_t y[N];
    th_rng rng = {7};
    for (int i = 0; x && i < N; i++) {
        y[i] = (int32_t)(th_next(&rng) % 4);
        for (int p = 0; p < 64; p++) {
            const int q = (p / 8 >= 4) * 2 + (p % 8 >= 4);
            x[i * 64 + p] = (float)(0.5 * th_unif(&rng) + (q == y[i] ? 0.5 : 0.0));
        }
    }
    const int64_t sx[3] = {N, 8, 8}, sy[1] = {N};
    bk_status st = x ? bk_npy_write(px, BK_F32, 3, sx, x) : BK_ERR_NOMEM;
    if (st == BK_OK) st = bk_npy_write(py, BK_I32, 1, sy, y);
    free(x);
    bk_run_config r = bk_run_config_default();
    char spec[600];
    snprintf(spec, sizeof spec, "npy:%s", data);
    const char *kv[][2] = {{"data", spec},      {"dim", "32"},    {"depth", "1"},        {"heads", "2"},
                           {"mlp_dim", "64"},   {"patch", "4"},   {"batch", "32"},       {"attn", "softmax"},
                           {"progress", "none"}, {"eval_batch", "128"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (bk_run_config_set(&r, kv[i][0], kv[i][1]) != BK_OK) printf("# config: %s\n", bk_last_error());
    r.epochs = 20;
    bk_train_result res;
    if (st == BK_OK) st = bk_train_run(&r, dir, BK_TRAIN_NEW, NULL, NULL, NULL, &res);
    const char *what = "an image task (npy:)";
    const double chance = 0.25, drop = 0.2, above = 0.8; /* loss below drop x its start; acc above chance by above */
    double first, last;
    first_last_loss(dir, &first, &last);
    char name[120];
    snprintf(name, sizeof name, "defaults learn: %s through bk_train_run", what);
    CHECK(st == BK_OK && last < drop * first && res.test_acc > chance + above * (1 - chance), name,
          "%s loss %g -> %g, test acc %g (chance %g)", bk_last_error(), first, last, res.test_acc, chance);
}

int main(void)
{
    TH.verbose = 1; /* one line per check, as before */
    if (!th_tmpdir(g_tmp, sizeof g_tmp, "test-train")) return 1;
    test_config();
    test_runs();
    test_resume_gap();
    test_extend();
    test_compile();
    test_swap();
    test_esp_anneal();
    test_otk_init();
    test_data_parallel();
    test_set_run();
    test_defaults();
    test_valid_run();
    test_learn_copy();
    test_learn_image();
    rm_rf(g_tmp);
    return th_summary();
}
