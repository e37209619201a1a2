/* train_cmd.c -- `birkhoff train`: train a model on a dataset from a config
 * file and flags, with a progress bar, JSONL/CSV metrics, a checkpoint per
 * epoch, exact --resume, and Ctrl-C saving a checkpoint (docs/TRAINING.md). */
#define _GNU_SOURCE
#include "run.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Set by SIGINT/SIGTERM, read between steps: the one piece of process state
 * the command keeps outside its frame (a signal handler can reach no other). */
static volatile sig_atomic_t g_stop = 0;
static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void usage_train(FILE *f)
{
    fprintf(f,
            "usage: birkhoff train [--config FILE] [--out DIR] [--KEY VALUE | --set KEY=VALUE]... [--force]\n"
            "       birkhoff train --resume DIR [--epochs N] [--threads T] [--progress MODE] [--stop-after N]\n"
            "\n"
            "Trains a model on a dataset. Keys (docs/TRAINING.md): run keys (data=mnist|fashion-mnist|digits|spam|\n"
            "listops|shapes, data_dir, train_limit, test_limit, seq_len, min_len, listops_depth, points, noise,\n"
            "gen_train, gen_test, data_seed, epochs, batch, micro, ls, seed, threads, log_every, eval_batch,\n"
            "stop_after, progress=auto|bar|plain|none), model keys (attn=softmax|sinkhorn|esp|lot, dim, depth,\n"
            "heads, mlp_dim, patch, sk_iters, sk_eps, ... as `birkhoff model`) and optimiser keys (kind, lr,\n"
            "weight_decay, clip, sched, warmup, ...). The config file holds 'key = value' lines; flags override it\n"
            "(--weight-decay and --weight_decay are the same key).\n"
            "\n"
            "DIR (default runs/DATA-ATTN) receives config.txt, metrics.jsonl (one record per step and per epoch),\n"
            "steps.csv, epochs.csv, ckpt/epoch-NNNN.safetensors (epoch 0 = the initial model), last.safetensors\n"
            "and summary.json. Ctrl-C (or stop_after) saves last.safetensors and exits with status 130;\n"
            "--resume DIR continues bit for bit as the uninterrupted run would have.\n");
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

/* Keeps the lines of a metrics file that `keep` accepts (resume: records
 * written after the checkpoint are dropped); rewritten atomically. */
static int filter_lines(const char *path, int (*keep)(const char *line, int64_t step, int64_t epoch), int64_t step,
                        int64_t epoch)
{
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT;
    char *line = NULL, *out = NULL;
    size_t cap = 0, n = 0, ocap = 0;
    ssize_t len;
    int ok = 1;
    while (ok && (len = getline(&line, &cap, f)) > 0) {
        if (!keep(line, step, epoch)) continue;
        if (n + (size_t)len + 1 > ocap) {
            ocap = 2 * (n + (size_t)len + 1);
            char *p = realloc(out, ocap);
            if (!p) ok = 0;
            else out = p;
        }
        if (ok) {
            memcpy(out + n, line, (size_t)len);
            n += (size_t)len;
        }
    }
    free(line);
    fclose(f);
    if (ok) ok = cli_write_text("train", path, out ? (out[n] = 0, out) : "");
    free(out);
    return ok;
}

static int keep_jsonl(const char *line, int64_t step, int64_t epoch)
{
    if (strstr(line, "\"type\":\"epoch\"")) return cli_json_num(line, "epoch") <= (double)epoch;
    return cli_json_num(line, "step") <= (double)step;
}
/* CSV: the header, and rows whose first column is within the bound */
static int keep_csv_step(const char *line, int64_t step, int64_t epoch)
{
    (void)epoch;
    return !strncmp(line, "step,", 5) || strtoll(line, NULL, 10) <= step;
}
static int keep_csv_epoch(const char *line, int64_t step, int64_t epoch)
{
    (void)step;
    return !strncmp(line, "epoch,", 6) || strtoll(line, NULL, 10) <= epoch;
}

/* the sample order of epoch e (0-based) */
static void epoch_order(int64_t *p, int64_t n, uint64_t seed, int e)
{
    data_permute(p, n, data_mix64(seed ^ (0x5851f42d4c957f2dull * (uint64_t)(e + 1))));
}

/* the position and running sums stored with a checkpoint */
typedef struct {
    int epoch;          /* epochs completed                                */
    int64_t batch;      /* batches done in the current epoch               */
    int64_t step;       /* optimiser steps in total                        */
    double loss_sum;    /* current epoch: sum of per-sample losses         */
    int64_t correct, seen;
    double elapsed;     /* training seconds before this process            */
} run_pos;

static char *extra_text(const run_config *r, const run_pos *p, const data_set *tr, const data_set *te)
{
    char *cfg = run_config_format(r);
    if (!cfg) return NULL;
    size_t n = strlen(cfg) + 2048;
    char *s = malloc(n);
    if (s)
        snprintf(s, n,
                 "pos_epoch=%d\npos_batch=%lld\npos_step=%lld\npos_loss_sum=%a\npos_correct=%lld\npos_seen=%lld\n"
                 "pos_elapsed=%a\ndata_train=%s\ndata_test=%s\n%s",
                 p->epoch, (long long)p->batch, (long long)p->step, p->loss_sum, (long long)p->correct,
                 (long long)p->seen, p->elapsed, tr->version, te->version, cfg);
    free(cfg);
    return s;
}

static int parse_pos(const char *extra, run_pos *p)
{
    char v[128];
    memset(p, 0, sizeof *p);
    if (!run_extra_get(extra, "pos_epoch", v, sizeof v)) return 0;
    p->epoch = atoi(v);
    if (!run_extra_get(extra, "pos_batch", v, sizeof v)) return 0;
    p->batch = strtoll(v, NULL, 10);
    if (!run_extra_get(extra, "pos_step", v, sizeof v)) return 0;
    p->step = strtoll(v, NULL, 10);
    if (!run_extra_get(extra, "pos_loss_sum", v, sizeof v)) return 0;
    p->loss_sum = strtod(v, NULL);
    if (!run_extra_get(extra, "pos_correct", v, sizeof v)) return 0;
    p->correct = strtoll(v, NULL, 10);
    if (!run_extra_get(extra, "pos_seen", v, sizeof v)) return 0;
    p->seen = strtoll(v, NULL, 10);
    if (run_extra_get(extra, "pos_elapsed", v, sizeof v)) p->elapsed = strtod(v, NULL);
    return p->epoch >= 0 && p->batch >= 0 && p->step >= 0 && p->seen >= 0;
}

static void fmt_time(double s, char *out, size_t cap)
{
    if (!(s >= 0) || s > 360000) s = 0;
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(out, cap, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
    else snprintf(out, cap, "%d:%02d", t / 60, t % 60);
}

enum { PR_NONE, PR_PLAIN, PR_BAR };

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

static int logs_open(const char *dir, int fresh, run_logs *L)
{
    char p[1100];
    memset(L, 0, sizeof *L);
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    L->jsonl = fopen(p, fresh ? "w" : "a");
    snprintf(p, sizeof p, "%s/steps.csv", dir);
    int new_steps = fresh || !exists(p);
    L->steps = fopen(p, fresh ? "w" : "a");
    snprintf(p, sizeof p, "%s/epochs.csv", dir);
    int new_epochs = fresh || !exists(p);
    L->epochs = fopen(p, fresh ? "w" : "a");
    if (!L->jsonl || !L->steps || !L->epochs) {
        logs_close(L);
        return 0;
    }
    if (new_steps) fprintf(L->steps, "step,epoch,batch,loss,acc,lr,gnorm,samples_per_s,time_s\n");
    if (new_epochs)
        fprintf(L->epochs, "epoch,step,train_loss,train_acc,test_loss,test_acc,attn_row_dev,attn_col_dev,"
                           "attn_entropy,time_s\n");
    return 1;
}

static int save_ckpt(const char *dir, const char *name, bk_model *m, bk_optim *o, const run_config *r,
                     const run_pos *p, const data_set *tr, const data_set *te)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *ex = extra_text(r, p, tr, te);
    if (!ex) {
        fprintf(stderr, "birkhoff train: out of memory\n");
        return 0;
    }
    bk_status st = bk_checkpoint_save(path, m, o, ex);
    free(ex);
    if (st != BK_OK) {
        fprintf(stderr, "birkhoff train: %s\n", bk_last_error());
        return 0;
    }
    return 1;
}

int cmd_train(int argc, char **argv)
{
    run_config r;
    run_config_default(&r);
    const char *cfg_path = NULL, *out = NULL, *resume = NULL;
    int force = 0;
    char err[1024];
    /* pass 1: --config, --resume, --out, --force, --help */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_train(stdout);
            return CLI_OK;
        }
        if (!strcmp(a, "--force")) {
            force = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "birkhoff train: unexpected argument '%s'\n", a);
            usage_train(stderr);
            return CLI_USAGE;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "birkhoff train: %s needs a value\n", a);
            return CLI_USAGE;
        }
        if (!strcmp(a, "--config")) cfg_path = argv[i + 1];
        else if (!strcmp(a, "--out")) out = argv[i + 1];
        else if (!strcmp(a, "--resume")) resume = argv[i + 1];
        i++;
    }
    if (resume && (cfg_path || out)) {
        fprintf(stderr, "birkhoff train: --resume DIR continues a run as configured; --config and --out do not apply\n");
        return CLI_USAGE;
    }
    bk_model *m = NULL;
    bk_optim *o = NULL;
    run_pos pos = {0};
    char *extra = NULL;
    char dir[1024], path[1100];
    if (resume) {
        snprintf(dir, sizeof dir, "%s", resume);
        snprintf(path, sizeof path, "%s/last.safetensors", dir);
        if (!exists(path)) {
            fprintf(stderr, "birkhoff train: %s: no checkpoint to resume from (%s missing)\n", dir, path);
            return CLI_FAIL;
        }
        /* the configuration comes from the checkpoint itself */
        bk_model *probe = NULL;
        if (bk_checkpoint_load(path, 1, &probe, NULL, &extra) != BK_OK) {
            fprintf(stderr, "birkhoff train: %s\n", bk_last_error());
            return CLI_FAIL;
        }
        bk_model_free(probe);
        if (!run_from_checkpoint_extra(extra, &r, err, sizeof err) || !parse_pos(extra, &pos)) {
            fprintf(stderr, "birkhoff train: %s: %s\n", path, err[0] ? err : "bad run position in the metadata");
            free(extra);
            return CLI_FAIL;
        }
        r.stop_after = 0; /* per process, like threads and progress: only a flag sets it */
    } else if (cfg_path && !run_config_load(&r, cfg_path, err, sizeof err)) {
        fprintf(stderr, "birkhoff train: %s\n", err);
        return CLI_USAGE;
    }
    /* pass 2: key flags, in order */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--force")) continue;
        if (!strcmp(a, "--config") || !strcmp(a, "--out") || !strcmp(a, "--resume")) {
            i++;
            continue;
        }
        char key[128], val[1024];
        const char *v = argv[++i];
        if (!strcmp(a, "--set")) {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || (size_t)(eq - v) >= sizeof key) {
                fprintf(stderr, "birkhoff train: --set expects KEY=VALUE, got '%s'\n", v);
                free(extra);
                return CLI_USAGE;
            }
            memcpy(key, v, (size_t)(eq - v));
            key[eq - v] = 0;
            snprintf(val, sizeof val, "%s", eq + 1);
        } else {
            snprintf(key, sizeof key, "%s", a + 2);
            snprintf(val, sizeof val, "%s", v);
        }
        for (char *c = key; *c; c++)
            if (*c == '-') *c = '_';
        if (resume && strcmp(key, "epochs") && strcmp(key, "threads") && strcmp(key, "progress") &&
            strcmp(key, "stop_after") && strcmp(key, "data_dir")) {
            fprintf(stderr, "birkhoff train: a resumed run keeps its configuration: only --epochs, --threads, "
                            "--progress, --stop-after and --data-dir apply (got --%s)\n", key);
            free(extra);
            return CLI_USAGE;
        }
        if (!run_config_set(&r, key, val, err, sizeof err)) {
            fprintf(stderr, "birkhoff train: %s\n", err);
            free(extra);
            return CLI_USAGE;
        }
    }
    if (resume && pos.epoch >= r.epochs) {
        fprintf(stderr, "birkhoff train: %s has finished its %d epochs; --epochs N with N > %d continues it\n", dir,
                pos.epoch, pos.epoch);
        free(extra);
        return CLI_FAIL;
    }
    if (!resume) {
        if (out) snprintf(dir, sizeof dir, "%s", out);
        else snprintf(dir, sizeof dir, "runs/%s-%s", r.data, run_attn_name(&r.model));
        snprintf(path, sizeof path, "%s/last.safetensors", dir);
        if (exists(path) && !force) {
            fprintf(stderr, "birkhoff train: %s already holds a run: continue it with --resume %s, or start over with "
                            "--force or another --out\n", dir, dir);
            return CLI_USAGE;
        }
    }
    if (r.threads > 0) bk_set_num_threads(r.threads);

    /* data */
    data_set tr, te;
    data_opts dop = r.dopt;
    dop.dir = r.data_dir[0] ? r.data_dir : NULL;
    if (!data_open(r.data, DATA_TRAIN, &dop, &tr, err, sizeof err)) {
        fprintf(stderr, "birkhoff train: %s\n", err);
        free(extra);
        return CLI_FAIL;
    }
    dop.limit = r.test_limit;
    if (!data_open(r.data, DATA_TEST, &dop, &te, err, sizeof err)) {
        fprintf(stderr, "birkhoff train: %s\n", err);
        data_close(&tr);
        free(extra);
        return CLI_FAIL;
    }
    int rc = CLI_FAIL;
    int64_t *order = NULL;
    run_buf buf = {0};
    run_logs logs = {0};
    run_attn_diag *diag = NULL;
    char v1[256];
    if (resume && ((run_extra_get(extra, "data_train", v1, sizeof v1) && strcmp(v1, tr.version)) ||
                   (run_extra_get(extra, "data_test", v1, sizeof v1) && strcmp(v1, te.version)))) {
        fprintf(stderr, "birkhoff train: the data changed since the run started (checkpoint: %s; now: %s)\n", v1,
                strcmp(v1, tr.version) ? tr.version : te.version);
        goto done;
    }
    if (!run_config_resolve(&r, &tr, err, sizeof err)) {
        fprintf(stderr, "birkhoff train: %s\n", err);
        rc = CLI_USAGE;
        goto done;
    }
    const int chunk = r.micro > 0 ? r.micro : r.batch;
    const int diag_n = te.n < 64 ? (int)te.n : 64;
    int maxb = chunk > r.eval_batch ? chunk : r.eval_batch;
    if (maxb < diag_n) maxb = diag_n;
    if (resume) {
        if (bk_checkpoint_load(path, maxb, &m, &o, NULL) != BK_OK) {
            fprintf(stderr, "birkhoff train: %s\n", bk_last_error());
            goto done;
        }
        if (!o && bk_optim_create(&r.optim, m, &o) != BK_OK) {
            fprintf(stderr, "birkhoff train: %s\n", bk_last_error());
            goto done;
        }
    } else {
        if (!mkdir_p(dir)) {
            fprintf(stderr, "birkhoff train: cannot create %s (%s)\n", dir, strerror(errno));
            goto done;
        }
        if (bk_model_create(&r.model, r.seed, maxb, &m) != BK_OK || bk_optim_create(&r.optim, m, &o) != BK_OK) {
            fprintf(stderr, "birkhoff train: %s\n", bk_last_error());
            goto done;
        }
    }
    snprintf(path, sizeof path, "%s/ckpt", dir);
    if (!mkdir_p(path)) {
        fprintf(stderr, "birkhoff train: cannot create %s (%s)\n", path, strerror(errno));
        goto done;
    }
    {
        char *cfg = run_config_format(&r);
        size_t n = cfg ? strlen(cfg) + 1024 : 0;
        char *txt = cfg ? malloc(n) : NULL;
        if (txt) snprintf(txt, n, "# birkhoff %s\n# data: %s\n# data: %s\n%s", bk_version(), tr.version, te.version, cfg);
        snprintf(path, sizeof path, "%s/config.txt", dir);
        int ok = txt && cli_write_text("train", path, txt);
        free(cfg);
        free(txt);
        if (!ok) goto done;
    }
    if (resume) {
        char p2[1100];
        snprintf(p2, sizeof p2, "%s/metrics.jsonl", dir);
        int ok = filter_lines(p2, keep_jsonl, pos.step, pos.epoch);
        snprintf(p2, sizeof p2, "%s/steps.csv", dir);
        ok = ok && filter_lines(p2, keep_csv_step, pos.step, pos.epoch);
        snprintf(p2, sizeof p2, "%s/epochs.csv", dir);
        ok = ok && filter_lines(p2, keep_csv_epoch, pos.step, pos.epoch);
        if (!ok) {
            fprintf(stderr, "birkhoff train: cannot rewrite the metrics of %s\n", dir);
            goto done;
        }
    }
    if (!logs_open(dir, !resume, &logs)) {
        fprintf(stderr, "birkhoff train: cannot open the metrics files in %s (%s)\n", dir, strerror(errno));
        goto done;
    }
    order = malloc(sizeof(int64_t) * (size_t)tr.n);
    diag = calloc((size_t)(r.model.depth > 0 ? r.model.depth : 1), sizeof *diag);
    if (!order || !diag || !run_buf_init(&buf, &tr, chunk, r.model.classes)) {
        fprintf(stderr, "birkhoff train: out of memory\n");
        goto done;
    }
    if (!resume) {
        /* --force over an old run: its epoch checkpoints and summary go */
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
    }
    if (!resume && !save_ckpt(dir, "ckpt/epoch-0000.safetensors", m, o, &r, &pos, &tr, &te)) goto done;

    int mode = PR_PLAIN;
    if (!strcmp(r.progress, "none")) mode = PR_NONE;
    else if (!strcmp(r.progress, "bar") || (!strcmp(r.progress, "auto") && isatty(STDERR_FILENO))) mode = PR_BAR;
    const int64_t nb = (tr.n + r.batch - 1) / r.batch;
    const int64_t total_steps = nb * r.epochs;
    if (mode != PR_NONE)
        fprintf(stderr, "train: %s, %s attention, %lld parameters, %lld samples x %d epochs (batch %d), %d threads -> %s\n",
                tr.version, run_attn_name(&r.model), (long long)bk_model_num_params(m), (long long)tr.n, r.epochs,
                r.batch, bk_get_num_threads(), dir);
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND; /* a second Ctrl-C terminates at once */
    sigemptyset(&sa.sa_mask);
    g_stop = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    const double t0 = cli_now();
    const int64_t step0 = pos.step;
    double last_draw = 0, win_t = t0;
    int64_t win_samples = 0;
    double rate = 0;
    int stopped = 0, failed = 0;
    const int C = r.model.classes;
    double last_test_acc = NAN, last_test_loss = NAN;
    for (int e = pos.epoch; e < r.epochs && !stopped && !failed; e++) {
        epoch_order(order, tr.n, r.seed, e);
        for (int64_t bi = pos.batch; bi < nb; bi++) {
            const int B = (int)(tr.n - bi * r.batch < r.batch ? tr.n - bi * r.batch : r.batch);
            const float lr = bk_optim_lr(bk_optim_get_config(o), bk_optim_step_count(o));
            bk_model_zero_grad(m);
            double bl = 0;
            int64_t bc = 0;
            for (int s = 0; s < B && !failed; s += chunk) {
                const int Bc = B - s < chunk ? B - s : chunk;
                memcpy(buf.idx, order + bi * r.batch + s, sizeof(int64_t) * (size_t)Bc);
                bk_batch bt;
                double loss;
                if (!run_buf_fill(&buf, &tr, Bc, &bt) || bk_model_forward(m, &bt, 1, r.ls, buf.logits, &loss) != BK_OK ||
                    bk_model_backward(m, (float)Bc / (float)B) != BK_OK) {
                    fprintf(stderr, "\nbirkhoff train: step %lld: %s\n", (long long)pos.step + 1, bk_last_error());
                    failed = 1;
                    break;
                }
                bl += loss * Bc;
                for (int i = 0; i < Bc; i++) bc += run_argmax(buf.logits + (size_t)i * C, C) == buf.lab[i];
            }
            double gnorm = 0;
            if (!failed && bk_optim_step(o, m, &gnorm) != BK_OK) {
                fprintf(stderr, "\nbirkhoff train: step %lld: %s (the run stops; its last checkpoint is intact)\n",
                        (long long)pos.step + 1, bk_last_error());
                failed = 1;
            }
            if (failed) break;
            pos.step++;
            pos.batch = bi + 1;
            pos.loss_sum += bl;
            pos.correct += bc;
            pos.seen += B;
            const double now = cli_now();
            win_samples += B;
            if (now - win_t >= 1.0 || rate == 0) {
                if (now > win_t) rate = (double)win_samples / (now - win_t);
                win_t = now;
                win_samples = 0;
            }
            if (pos.step % r.log_every == 0) {
                const double t = pos.elapsed + now - t0;
                fprintf(logs.jsonl,
                        "{\"type\":\"step\",\"step\":%lld,\"epoch\":%d,\"batch\":%lld,\"loss\":%.6g,\"acc\":%.6g,"
                        "\"lr\":%.6g,\"gnorm\":%.6g,\"samples_per_s\":%.1f,\"time_s\":%.3f}\n",
                        (long long)pos.step, e + 1, (long long)bi + 1, bl / B, (double)bc / B, (double)lr, gnorm, rate,
                        t);
                fprintf(logs.steps, "%lld,%d,%lld,%.6g,%.6g,%.6g,%.6g,%.1f,%.3f\n", (long long)pos.step, e + 1,
                        (long long)bi + 1, bl / B, (double)bc / B, (double)lr, gnorm, rate, t);
            }
            if (mode == PR_BAR && (now - last_draw > 0.1 || bi + 1 == nb)) {
                last_draw = now;
                const double per = (now - t0) / (double)(pos.step - step0);
                char eta[32];
                fmt_time(per * (double)(total_steps - pos.step), eta, sizeof eta);
                int fill = (int)(24 * (bi + 1) / nb);
                char bar[32];
                for (int k = 0; k < 24; k++) bar[k] = k < fill ? '#' : '.';
                bar[24] = 0;
                fprintf(stderr, "\r\033[Kepoch %d/%d [%s] %lld/%lld  %.0f samples/s  ETA %s  loss %.4f  acc %.2f%%",
                        e + 1, r.epochs, bar, (long long)bi + 1, (long long)nb, rate, eta, pos.loss_sum / pos.seen,
                        100.0 * pos.correct / pos.seen);
            } else if (mode == PR_PLAIN && ((bi + 1) % (nb / 10 > 0 ? nb / 10 : 1) == 0)) {
                fprintf(stderr, "epoch %d/%d  batch %lld/%lld  %.0f samples/s  loss %.4f  acc %.2f%%\n", e + 1, r.epochs,
                        (long long)bi + 1, (long long)nb, rate, pos.loss_sum / pos.seen, 100.0 * pos.correct / pos.seen);
            }
            if (g_stop || (r.stop_after > 0 && pos.step >= r.stop_after)) {
                stopped = 1;
                break;
            }
        }
        if (stopped || failed) break;
        /* end of epoch: evaluate, record, checkpoint */
        run_eval ev;
        if (!run_evaluate(m, &te, 0, r.eval_batch, 0, &ev, err, sizeof err) ||
            !run_attention_diag(m, &te, diag_n, diag, NULL, NULL, err, sizeof err)) {
            fprintf(stderr, "\nbirkhoff train: evaluation: %s\n", err);
            failed = 1;
            break;
        }
        double rd = 0, cd = 0, en = 0;
        for (int l = 0; l < r.model.depth; l++) {
            rd += diag[l].row_dev / r.model.depth;
            cd += diag[l].col_dev / r.model.depth;
            en += diag[l].entropy / r.model.depth;
        }
        const double t = pos.elapsed + cli_now() - t0;
        fprintf(logs.jsonl,
                "{\"type\":\"epoch\",\"epoch\":%d,\"step\":%lld,\"train_loss\":%.6g,\"train_acc\":%.6g,"
                "\"test_loss\":%.6g,\"test_acc\":%.6g,\"attn_row_dev\":%.6g,\"attn_col_dev\":%.6g,"
                "\"attn_entropy\":%.6g,\"time_s\":%.3f}\n",
                e + 1, (long long)pos.step, pos.loss_sum / pos.seen, (double)pos.correct / pos.seen, ev.loss, ev.acc,
                rd, cd, en, t);
        fprintf(logs.epochs, "%d,%lld,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.3f\n", e + 1, (long long)pos.step,
                pos.loss_sum / pos.seen, (double)pos.correct / pos.seen, ev.loss, ev.acc, rd, cd, en, t);
        fflush(logs.jsonl);
        fflush(logs.steps);
        fflush(logs.epochs);
        if (mode == PR_BAR) fprintf(stderr, "\r\033[K");
        if (mode != PR_NONE)
            fprintf(stderr, "epoch %d/%d  train loss %.4f acc %.2f%%  test loss %.4f acc %.2f%%  |col sum-1| %.3g  %s\n",
                    e + 1, r.epochs, pos.loss_sum / pos.seen, 100.0 * pos.correct / pos.seen, ev.loss, 100.0 * ev.acc, cd,
                    (fmt_time(t, v1, sizeof v1), v1));
        last_test_acc = ev.acc;
        last_test_loss = ev.loss;
        run_eval_free(&ev);
        pos.epoch = e + 1;
        pos.batch = 0;
        pos.loss_sum = 0;
        pos.correct = pos.seen = 0;
        char name[64];
        snprintf(name, sizeof name, "ckpt/epoch-%04d.safetensors", e + 1);
        run_pos saved = pos;
        saved.elapsed = t;
        if (!save_ckpt(dir, name, m, o, &r, &saved, &tr, &te) ||
            !save_ckpt(dir, "last.safetensors", m, o, &r, &saved, &tr, &te)) {
            failed = 1;
            break;
        }
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    fflush(logs.jsonl);
    fflush(logs.steps);
    fflush(logs.epochs);
    if (mode == PR_BAR) fprintf(stderr, "\r\033[K");
    if (failed) goto done;
    const double elapsed = pos.elapsed + cli_now() - t0;
    if (stopped) {
        run_pos saved = pos;
        saved.elapsed = elapsed;
        if (!save_ckpt(dir, "last.safetensors", m, o, &r, &saved, &tr, &te)) goto done;
        fprintf(stderr, "train: stopped at epoch %d batch %lld (step %lld); checkpoint %s/last.safetensors; continue "
                        "with: birkhoff train --resume %s\n",
                pos.epoch + 1, (long long)pos.batch, (long long)pos.step, dir, dir);
        rc = 130;
        goto done;
    }
    {
        char s[2048];
        snprintf(s, sizeof s,
                 "{\"data\":\"%s\",\"attn\":\"%s\",\"epochs\":%d,\"steps\":%lld,\"params\":%lld,\"test_acc\":%.6g,"
                 "\"test_loss\":%.6g,\"time_s\":%.3f,\"threads\":%d}\n",
                 r.data, run_attn_name(&r.model), r.epochs, (long long)pos.step, (long long)bk_model_num_params(m),
                 last_test_acc, last_test_loss, elapsed, bk_get_num_threads());
        snprintf(path, sizeof path, "%s/summary.json", dir);
        if (isfinite(last_test_acc) && !cli_write_text("train", path, s)) goto done;
        char tt[32];
        fmt_time(elapsed, tt, sizeof tt);
        if (mode != PR_NONE)
            fprintf(stderr, "train: done in %s; test accuracy %.2f%%; outputs in %s (metrics.jsonl, epochs.csv, "
                            "last.safetensors)\n",
                    tt, 100.0 * last_test_acc, dir);
    }
    rc = CLI_OK;
done:
    logs_close(&logs);
    run_buf_free(&buf);
    free(order);
    free(diag);
    free(extra);
    bk_optim_free(o);
    bk_model_free(m);
    data_close(&tr);
    data_close(&te);
    return rc;
}
