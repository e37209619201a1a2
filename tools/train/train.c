/* train.c -- `birkhoff train`: arguments, progress display and Ctrl-C over
 * the library's training loop (bk_train_run; docs/TRAINING.md): a progress
 * bar or plain lines on stderr, and SIGINT/SIGTERM stopping the run with a
 * checkpoint (status 130) that --resume continues bit for bit. */
#define _GNU_SOURCE
#include "../cli.h"
#include "train_mpi.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Set by SIGINT/SIGTERM, read by the training loop between steps: the one
 * piece of process state the command keeps outside its frame (a signal
 * handler can reach no other). */
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
            "       birkhoff train --resume DIR [--epochs N] [--total-steps S] [--threads T] [--progress MODE]\n"
            "                      [--stop-after N]\n"
            "\n"
            "Trains a model on a dataset: a built-in one (data=mnist|fashion-mnist|digits|spam|spam-spm|listops|\n"
            "shapes|bible) or your own, data=FORMAT:PATH (docs/DATA.md): npy:DIR (x.npy, y.npy, lengths.npy),\n"
            "npy:X.npy,Y.npy[,L.npy], npz:FILE, tsv:FILE, csv:FILE (labelled text), parallel:SRC,TGT (sentence\n"
            "pairs), ids:SRC,TGT; `birkhoff data inspect SPEC` shows what the reader sees.\n"
            "Keys (docs/TRAINING.md): run keys (data, data_dir, data_valid, data_test, valid_frac, test_frac,\n"
            "split_seed, array_kind, label_column, text_column, text_header, spm_model, spm_vocab, shuffle_window,\n"
            "train_limit, test_limit, seq_len, tgt_len, min_len, listops_depth, points, noise, gen_train, gen_test,\n"
            "data_seed, epochs, batch, micro, ls, seed, threads, log_every, eval_batch, patience, select,\n"
            "stop_after, progress=auto|bar|plain|none, init=CKPT, esp_anneal=FACTOR, eval_esp_sort=model|soft|hard),\n"
            "model keys (attn=softmax|sinkhorn|esp|lot|unbalanced|diff|linear|performer|nystrom, dim,\n"
            "depth, heads, mlp_dim, patch, attn.iters, attn.eps (the operator's attn.KEY; old sk_iters, sk_eps, ... convert),\n"
            "... as `birkhoff model`) and optimiser keys (kind, lr,\n"
            "weight_decay, clip, sched, warmup, ...). The config file holds 'key = value' lines; flags override it\n"
            "(--weight-decay and --weight_decay are the same key).\n"
            "\n"
            "Defaults of a new run: kind=adamw lr=1e-3 weight_decay=0.01 (decoupled; Linear weights only: not biases,\n"
            "norms, positions or token tables, decay_embed=0), sched=cosine to lr_min=0 over the whole run\n"
            "(total_steps=0), after a linear warm-up of 5%% of the run's steps, at most 1000 (warmup=-1); the numbers\n"
            "are fixed when the run starts and recorded. Model selection: valid_frac=0.1 of the training split is\n"
            "held out (or data_valid=FILES); each epoch evaluates it, best.safetensors keeps the best epoch by\n"
            "select=auto|acc|loss (auto: accuracy, loss for seq2seq), patience=N stops after N epochs without a\n"
            "better one, and the test split is evaluated once at the end with the best weights (summary.json).\n"
            "valid_frac=0: no validation split, the test split every epoch (runs before issue 43).\n"
            "\n"
            "DIR (default runs/DATA-ATTN) receives config.txt, metrics.jsonl (one record per step and per epoch,\n"
            "a test record at the end), steps.csv, epochs.csv, ckpt/epoch-NNNN.safetensors (epoch 0 = the initial\n"
            "model), best.safetensors, last.safetensors, summary.json and (text data) spm.model. Ctrl-C (or\n"
            "stop_after) saves last.safetensors and exits with status 130;\n"
            "--resume DIR continues bit for bit as the uninterrupted run would have.\n"
            "--init CKPT starts a new run (fine-tuning) from a checkpoint's weights: the model keys start from the\n"
            "checkpoint's (other attention keys swap its attention, as `birkhoff model swap`); a fresh optimiser.\n"
            "--esp-anneal F trains ESP epoch e with esp_t = t0 F^e (ESPFormer: 0.8); --eval-esp-sort hard evaluates\n"
            "every epoch with the exact sort.\n"
            "\n"
            "Several processes: mpirun -np N birkhoff train ... shares each batch out among N processes (data\n"
            "parallel: gradients summed across them; rank 0 writes DIR; docs/TRAINING.md). This build: %s.\n",
            cli_mpi_built() ? "with MPI" : "without MPI (mpirun is refused)");
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void fmt_time(double s, char *out, size_t cap)
{
    if (!(s >= 0) || s > 360000) s = 0;
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(out, cap, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
    else snprintf(out, cap, "%d:%02d", t / 60, t % 60);
}

/* The default run directory's name for a dataset: a built-in name as it
 * is; a spec "FORMAT:PATH" as FORMAT-STEM, STEM the last path component of
 * its first file without the extension, in [A-Za-z0-9_.-] (others '_'). */
static void run_tag(const char *data, char *tag, size_t cap)
{
    const char *colon = strchr(data, ':');
    if (!colon) {
        snprintf(tag, cap, "%.60s", data);
        return;
    }
    const char *p = colon + 1, *end = p + strcspn(p, ",");
    while (end > p && end[-1] == '/') end--;
    const char *base = end;
    while (base > p && base[-1] != '/') base--;
    const char *dot = memchr(base, '.', (size_t)(end - base));
    if (dot && dot > base) end = dot;
    int n = snprintf(tag, cap, "%.*s-", (int)(colon - data), data);
    for (const char *q = base; q < end && n + 1 < (int)cap && n < 60; q++) {
        const char c = *q;
        tag[n++] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.' ? c : '_';
    }
    tag[n] = 0;
}

enum { PR_NONE, PR_PLAIN, PR_BAR };

/* the display of one run, driven by the loop's events */
typedef struct {
    const char *dir;
    int ranks;              /* processes of a data-parallel run (1: one)     */
    int mode, started;
    double last_draw;
    struct sigaction old_int, old_term;
} progress;

/* From here on SIGINT/SIGTERM set the stop flag (the loop stops with a
 * checkpoint; a second signal terminates at once); the old handlers are kept
 * in p for the end of the run. */
static void catch_stop(progress *p)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND; /* a second Ctrl-C terminates at once */
    sigemptyset(&sa.sa_mask);
    g_stop = 0;
    sigaction(SIGINT, &sa, &p->old_int);
    sigaction(SIGTERM, &sa, &p->old_term);
    p->started = 1;
}

static void on_event(void *user, const bk_train_event *ev)
{
    progress *p = user;
    const bk_run_config *r = ev->config;
    if (ev->kind == BK_TRAIN_EVENT_START) {
        p->mode = PR_PLAIN;
        if (!strcmp(r->progress, "none")) p->mode = PR_NONE;
        else if (!strcmp(r->progress, "bar") || (!strcmp(r->progress, "auto") && isatty(STDERR_FILENO)))
            p->mode = PR_BAR;
        const bk_dataset_info *tr = bk_data_info(ev->train);
        char procs[48] = "";
        if (p->ranks > 1) snprintf(procs, sizeof procs, " x %d processes (MPI)", p->ranks);
        if (p->mode != PR_NONE)
            fprintf(stderr,
                    "train: %s, %s attention, %lld parameters, %lld samples x %d epochs (batch %d), %d threads%s -> "
                    "%s\n",
                    tr->version, bk_attn_kind_name(r->model.attn), (long long)bk_model_num_params(ev->model),
                    (long long)tr->n, r->epochs, r->batch, bk_get_num_threads(), procs, p->dir);
        /* (whatever the progress mode: a damaged record is worth a word) */
        if (ev->notice) fprintf(stderr, "birkhoff train: warning: %s\n", ev->notice);
        /* from the first step on, Ctrl-C stops the run with a checkpoint */
        catch_stop(p);
        p->last_draw = -1.0;
        return;
    }
    const int64_t nb = ev->batches;
    if (ev->kind == BK_TRAIN_EVENT_STEP) {
        if (p->mode == PR_BAR && (ev->elapsed_s - p->last_draw > 0.1 || ev->batch == nb)) {
            p->last_draw = ev->elapsed_s;
            const double per = ev->elapsed_s / (double)(ev->step - ev->first_step);
            char eta[32];
            fmt_time(per * (double)(ev->total_steps - ev->step), eta, sizeof eta);
            int fill = (int)(24 * ev->batch / nb);
            char bar[32];
            for (int k = 0; k < 24; k++) bar[k] = k < fill ? '#' : '.';
            bar[24] = 0;
            fprintf(cli_stderr_raw(), "\r\033[Kepoch %d/%d [%s] %lld/%lld  %.0f samples/s  ETA %s  loss %.4f  acc %.2f%%",
                    ev->epoch, r->epochs, bar, (long long)ev->batch, (long long)nb, ev->samples_per_s, eta,
                    ev->train_loss, 100.0 * ev->train_acc);
        } else if (p->mode == PR_PLAIN && (ev->batch % (nb / 10 > 0 ? nb / 10 : 1) == 0)) {
            fprintf(stderr, "epoch %d/%d  batch %lld/%lld  %.0f samples/s  loss %.4f  acc %.2f%%\n", ev->epoch,
                    r->epochs, (long long)ev->batch, (long long)nb, ev->samples_per_s, ev->train_loss,
                    100.0 * ev->train_acc);
        }
        return;
    }
    char tt[32];
    fmt_time(ev->time_s, tt, sizeof tt);
    if (p->mode == PR_BAR) fprintf(cli_stderr_raw(), "\r\033[K");
    if (p->mode == PR_NONE) return;
    if (ev->kind == BK_TRAIN_EVENT_TEST) {
        fprintf(stderr, "test (the best epoch, %d): loss %.4f acc %.2f%%\n", ev->best_epoch, ev->test_loss,
                100.0 * ev->test_acc);
        return;
    }
    const int valid = ev->valid != NULL;
    fprintf(stderr, "epoch %d/%d  train loss %.4f acc %.2f%%  %s loss %.4f acc %.2f%%%s  |col sum-1| %.3g  %s\n",
            ev->epoch, r->epochs, ev->train_loss, 100.0 * ev->train_acc, valid ? "valid" : "test",
            valid ? ev->valid_loss : ev->test_loss, 100.0 * (valid ? ev->valid_acc : ev->test_acc),
            valid && ev->best_epoch == ev->epoch ? " (best)" : "", ev->attn_col_dev, tt);
}

/* The key flags (--KEY VALUE, --set KEY=VALUE) applied to r in order
 * (resume: only those a resumed run may change); CLI_OK or CLI_USAGE. */
static int apply_flags(int argc, char **argv, int resume, bk_run_config *r)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--force")) continue;
        if (!strcmp(a, "--config") || !strcmp(a, "--out") || !strcmp(a, "--resume")) {
            i++;
            continue;
        }
        char key[128], val[1024];
        const char *v = argv[++i];
        if (!cli_key_flag("train", a, v, key, sizeof key, val, sizeof val)) return CLI_USAGE;
        if (resume && strcmp(key, "epochs") && strcmp(key, "threads") && strcmp(key, "progress") &&
            strcmp(key, "stop_after") && strcmp(key, "data_dir") && strcmp(key, "total_steps")) {
            fprintf(stderr, "birkhoff train: a resumed run keeps its configuration: only --epochs, --threads, "
                            "--progress, --stop-after, --data-dir and --total-steps (a cosine schedule's re-plan) "
                            "apply (got --%s)\n", key);
            return CLI_USAGE;
        }
        if (bk_run_config_set(r, key, val) != BK_OK) {
            fprintf(stderr, "birkhoff train: %s\n", bk_last_error());
            return CLI_USAGE;
        }
    }
    return CLI_OK;
}

/* What one `birkhoff train` command asks, its arguments parsed and checked */
typedef struct {
    bk_run_config r;
    char dir[1024];
    int resume, force, help;
} train_request;

/* The arguments, the config file, the resumed run's or init's checkpoint:
 * CLI_OK and the request (q->help: usage printed, nothing to run), or an
 * exit status after a message. */
static int parse_request(int argc, char **argv, train_request *q)
{
    bk_run_config r = bk_run_config_default();
    const char *cfg_path = NULL, *out = NULL, *resume = NULL;
    int force = 0;
    /* pass 1: --config, --resume, --out, --force, --help */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_train(stdout);
            q->help = 1;
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
    int epochs_done = 0;
    char dir[1024], path[1100];
    if (resume) {
        /* the configuration comes from the checkpoint itself */
        snprintf(dir, sizeof dir, "%s", resume);
        if (bk_train_resume_config(dir, &r, &epochs_done) != BK_OK) {
            fprintf(stderr, "birkhoff train: %s\n", bk_last_error());
            return CLI_FAIL;
        }
    } else if (cfg_path && bk_run_config_load(&r, cfg_path) != BK_OK) {
        fprintf(stderr, "birkhoff train: %s\n", bk_last_error());
        return CLI_USAGE;
    }
    /* pass 2: key flags, in order */
    int rc = apply_flags(argc, argv, resume != NULL, &r);
    if (rc != CLI_OK) return rc;
    if (!resume && r.init[0]) {
        /* init=CKPT (a new run from a checkpoint's weights): the keys start
         * from the checkpoint's run when it has one (data, batch, ...:
         * fine-tuning goes on where it stopped; else the defaults) and its
         * model, then the config file and the flags apply again on top */
        char init[sizeof r.init];
        snprintf(init, sizeof init, "%s", r.init);
        bk_model *m0 = NULL;
        if (bk_run_load(init, 1, &m0, &r, NULL) != BK_OK) {
            r = bk_run_config_default();
            if (bk_checkpoint_config(init, &r.model) != BK_OK) {
                fprintf(stderr, "birkhoff train: init: %s\n", bk_last_error());
                return CLI_FAIL;
            }
        }
        bk_model_free(m0);
        r.stop_after = 0;
        /* a new run: a cosine schedule follows its own length, after the
         * automatic warm-up (the checkpoint's run recorded the numbers of its
         * own), unless the config or flags below say otherwise */
        if (r.optim.sched == BK_SCHED_COSINE) {
            r.optim.total_steps = 0;
            if (r.optim.warmup > 0) r.optim.warmup = -1;
        }
        /* (a pipe was read to its end the first time: its keys would be lost) */
        struct stat cs;
        if (cfg_path && (stat(cfg_path, &cs) != 0 || !S_ISREG(cs.st_mode))) {
            fprintf(stderr, "birkhoff train: --config %s: with init=CKPT the config is read twice (again after the "
                            "checkpoint's keys): give a regular file, not a pipe or device\n", cfg_path);
            return CLI_USAGE;
        }
        if (cfg_path && bk_run_config_load(&r, cfg_path) != BK_OK) {
            fprintf(stderr, "birkhoff train: %s\n", bk_last_error());
            return CLI_USAGE;
        }
        if ((rc = apply_flags(argc, argv, 0, &r)) != CLI_OK) return rc;
    }
    if (resume && epochs_done >= r.epochs) {
        fprintf(stderr, "birkhoff train: %s has finished its %d epochs; --epochs N with N > %d continues it\n", dir,
                epochs_done, epochs_done);
        return CLI_FAIL;
    }
    if (!resume) {
        if (out) snprintf(dir, sizeof dir, "%s", out);
        else {
            char tag[80];
            run_tag(r.data, tag, sizeof tag);
            snprintf(dir, sizeof dir, "runs/%s-%s", tag, bk_attn_kind_name(r.model.attn));
        }
        snprintf(path, sizeof path, "%s/last.safetensors", dir);
        if (exists(path) && !force) {
            fprintf(stderr, "birkhoff train: %s already holds a run: continue it with --resume %s, or start over with "
                            "--force or another --out\n", dir, dir);
            return CLI_USAGE;
        }
    }
    q->r = r;
    snprintf(q->dir, sizeof q->dir, "%s", dir);
    q->resume = resume != NULL;
    q->force = force;
    return CLI_OK;
}

static int train_main(int argc, char **argv, const bk_train_comm *comm)
{
    train_request q;
    memset(&q, 0, sizeof q);
    int rc = parse_request(argc, argv, &q);
    /* under mpirun: every rank's request agreed before any trains (a rank
     * that failed here, or only printed the usage, stops them all) */
    rc = cli_mpi_agree(comm, rc, rc == CLI_OK && !q.help);
    if (rc != CLI_OK || q.help) return rc;
    bk_run_config r = q.r;
    const char *dir = q.dir;
    const int resume = q.resume, force = q.force;
    progress p;
    memset(&p, 0, sizeof p);
    p.dir = dir;
    p.ranks = comm->size;
    bk_train_result res;
    const bk_train_mode mode = resume ? BK_TRAIN_RESUME : force ? BK_TRAIN_OVERWRITE : BK_TRAIN_NEW;
    if (comm->rank > 0) catch_stop(&p); /* rank 0 reports (its START event catches them); the others still stop */
    bk_status st = bk_train_run_comm(&r, dir, mode, comm, on_event, &p, &g_stop, &res);
    if (p.started) {
        sigaction(SIGINT, &p.old_int, NULL);
        sigaction(SIGTERM, &p.old_term, NULL);
    }
    if (st != BK_OK && comm->size > 1 && res.stage == BK_TRAIN_STAGE_COMM) {
        /* a failure the ranks could not agree on: the others may wait in a
         * collective, so all end here */
        fprintf(stderr, "[rank %d] birkhoff train: %s; ending every process\n", comm->rank, bk_last_error());
        cli_mpi_abort(CLI_FAIL);
    }
    if (st != BK_OK) {
        /* a failing step or evaluation ends a progress line; a rank other
         * than 0 reports its own failures only (rank 0 names the others') */
        const int mid = res.stage == BK_TRAIN_STAGE_STEP || res.stage == BK_TRAIN_STAGE_EVAL;
        const char *e = bk_last_error();
        if (comm->rank > 0 && !strncmp(e, "rank ", 5) && atoi(e + 5) != comm->rank)
            return res.stage == BK_TRAIN_STAGE_CONFIG ? CLI_USAGE : CLI_FAIL;
        char who[32] = "";
        if (comm->size > 1) snprintf(who, sizeof who, "[rank %d] ", comm->rank);
        fprintf(stderr, "%s%sbirkhoff train: %s\n", mid && comm->rank == 0 ? "\n" : "", who, bk_last_error());
        if (p.mode == PR_BAR) fprintf(cli_stderr_raw(), "\r\033[K");
        return res.stage == BK_TRAIN_STAGE_CONFIG ? CLI_USAGE : CLI_FAIL;
    }
    if (p.mode == PR_BAR) fprintf(cli_stderr_raw(), "\r\033[K");
    if (comm->rank > 0) return res.stopped ? 130 : CLI_OK;
    if (res.stopped) {
        fprintf(stderr, "train: stopped at epoch %d batch %lld (step %lld); checkpoint %s/last.safetensors; continue "
                        "with: birkhoff train --resume %s\n",
                res.epoch + 1, (long long)res.batch, (long long)res.step, dir, dir);
        return 130;
    }
    char tt[32];
    fmt_time(res.time_s, tt, sizeof tt);
    if (p.mode != PR_NONE && res.best_epoch > 0)
        fprintf(stderr, "train: done in %s%s; best epoch %d (validation accuracy %.2f%%, loss %.4f); test accuracy "
                        "%.2f%% with its weights; outputs in %s (metrics.jsonl, epochs.csv, best.safetensors, "
                        "last.safetensors)\n",
                tt, res.early_stopped ? " (stopped early: patience)" : "", res.best_epoch, 100.0 * res.valid_acc,
                res.valid_loss, 100.0 * res.test_acc, dir);
    else if (p.mode != PR_NONE)
        fprintf(stderr, "train: done in %s; test accuracy %.2f%%; outputs in %s (metrics.jsonl, epochs.csv, "
                        "last.safetensors)\n",
                tt, 100.0 * res.test_acc, dir);
    return CLI_OK;
}

int cmd_train(int argc, char **argv)
{
    bk_train_comm comm;
    int started = 0;
    int rc = cli_mpi_start(&argc, &argv, &comm, &started);
    if (rc == CLI_OK) rc = train_main(argc, argv, &comm);
    cli_mpi_stop(started);
    return rc;
}
