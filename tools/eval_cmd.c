/* eval_cmd.c -- `birkhoff eval`: accuracy, loss, confusion matrix and the
 * attention diagnostics of a checkpoint on a dataset; for a compiled ASAP
 * model, the agreement with its Sinkhorn teacher. Also `birkhoff data`. */
#include "run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void usage_eval(FILE *f)
{
    fprintf(f, "usage: birkhoff eval --ckpt CKPT [--data NAME] [--split test|train] [--limit N] [--data-dir DIR]\n"
               "                     [--batch B] [--diag-samples N] [--teacher CKPT] [--json OUT.json]\n"
               "\n"
               "Evaluates a checkpoint written by `birkhoff train` (or `birkhoff asap compile`) on a split of its\n"
               "dataset (the data options are the run's; --data picks another dataset of the same shape):\n"
               "accuracy, mean loss, the confusion matrix (rows = label, columns = prediction) and, per layer,\n"
               "the attention diagnostics on the first N samples (default 64): mean |row sum - 1|, mean\n"
               "|column sum - 1| and the mean entropy of the attention rows (with that of a uniform row).\n"
               "A compiled ASAP model is compared with its teacher (--teacher, default: the checkpoint it was\n"
               "compiled from): the fraction of samples on which their predictions agree.\n");
}

/* loads a checkpoint and the run config stored with it */
int run_load(const char *prog, const char *path, int max_batch, bk_model **m, run_config *r, char **extra_out)
{
    char *extra = NULL, err[1024];
    if (bk_checkpoint_load(path, max_batch, m, NULL, &extra) != BK_OK) {
        fprintf(stderr, "birkhoff %s: %s\n", prog, bk_last_error());
        return 0;
    }
    if (!run_from_checkpoint_extra(extra, r, err, sizeof err)) {
        fprintf(stderr, "birkhoff %s: %s: %s\n", prog, path, err);
        free(extra);
        bk_model_free(*m);
        *m = NULL;
        return 0;
    }
    r->model = *bk_model_get_config(*m);
    if (extra_out) *extra_out = extra;
    else free(extra);
    return 1;
}

/* opens the split of the run's dataset (or `name`) and checks it fits the model */
int run_open_data(const char *prog, const run_config *r, const char *name, const char *dir, int split, int64_t limit,
                  const bk_model_config *mc, data_set *ds)
{
    char err[1024];
    data_opts o = r->dopt;
    o.dir = dir ? dir : (r->data_dir[0] ? r->data_dir : NULL);
    o.limit = limit;
    if (!data_open(name ? name : r->data, split, &o, ds, err, sizeof err)) {
        fprintf(stderr, "birkhoff %s: %s\n", prog, err);
        return 0;
    }
    bk_model_config c = *mc;
    data_model_shape(ds, &c);
    if (c.input != mc->input || c.classes != mc->classes || c.channels != mc->channels || c.image_h != mc->image_h ||
        c.image_w != mc->image_w || c.vocab != mc->vocab || c.max_len != mc->max_len || c.max_points != mc->max_points ||
        c.point_dim != mc->point_dim) {
        fprintf(stderr, "birkhoff %s: dataset %s does not have the shape the model was trained on\n", prog, ds->name);
        data_close(ds);
        return 0;
    }
    return 1;
}

int cmd_eval(int argc, char **argv)
{
    const char *ckpt = NULL, *data = NULL, *split = "test", *limit_s = NULL, *dir = NULL, *batch_s = NULL,
               *diag_s = NULL, *teacher = NULL, *json = NULL;
    const cli_opt opts[] = {{"--ckpt", &ckpt, 0},         {"--data", &data, 0},   {"--split", &split, 0},
                            {"--limit", &limit_s, 0},     {"--data-dir", &dir, 0}, {"--batch", &batch_s, 0},
                            {"--diag-samples", &diag_s, 0}, {"--teacher", &teacher, 0}, {"--json", &json, 0}};
    int done = 0, rc0 = cli_parse_opts("eval", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), usage_eval, &done);
    if (done || rc0) return rc0;
    int limit = 0, batch = 256, ndiag = 64;
    if (!ckpt || (limit_s && (!cli_parse_int(limit_s, &limit) || limit < 0)) ||
        (batch_s && (!cli_parse_int(batch_s, &batch) || batch < 1)) ||
        (diag_s && (!cli_parse_int(diag_s, &ndiag) || ndiag < 1 || ndiag > 4096)) ||
        (strcmp(split, "test") && strcmp(split, "train"))) {
        fprintf(stderr, "birkhoff eval: needs --ckpt; --limit >= 0, --batch >= 1, --diag-samples in [1, 4096], "
                        "--split test|train\n");
        return CLI_USAGE;
    }
    const int maxb = batch > ndiag ? batch : ndiag;
    bk_model *m = NULL, *tm = NULL;
    run_config r, tr;
    char *extra = NULL, err[1024];
    if (!run_load("eval", ckpt, maxb, &m, &r, &extra)) return CLI_FAIL;
    data_set ds;
    const int sp = strcmp(split, "test") ? DATA_TRAIN : DATA_TEST;
    if (!run_open_data("eval", &r, data, dir, sp, limit, bk_model_get_config(m), &ds)) {
        free(extra);
        bk_model_free(m);
        return CLI_FAIL;
    }
    const bk_model_config *c = bk_model_get_config(m);
    int rc = CLI_FAIL;
    run_eval ev = {0}, tev = {0};
    run_attn_diag *dg = calloc((size_t)(c->depth > 0 ? c->depth : 1), sizeof *dg);
    char tpath[1024] = "";
    if (teacher) snprintf(tpath, sizeof tpath, "%s", teacher);
    else if (c->attn == BK_ATTN_ASAP) run_extra_get(extra, "teacher", tpath, sizeof tpath);
    if (!dg) goto done;
    const double t0 = cli_now();
    if (!run_evaluate(m, &ds, 0, batch, 1, &ev, err, sizeof err) ||
        !run_attention_diag(m, &ds, ndiag, dg, NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "birkhoff eval: %s\n", err);
        goto done;
    }
    const double secs = cli_now() - t0;
    double agree = NAN;
    if (tpath[0]) {
        if (!run_load("eval", tpath, batch, &tm, &tr, NULL)) goto done;
        if (!run_evaluate(tm, &ds, 0, batch, 1, &tev, err, sizeof err)) {
            fprintf(stderr, "birkhoff eval: teacher: %s\n", err);
            goto done;
        }
        int64_t same = 0;
        for (int64_t i = 0; i < ev.n; i++) same += ev.pred[i] == tev.pred[i];
        agree = (double)same / (double)ev.n;
    }
    const int C = c->classes;
    printf("checkpoint  %s (%s attention, depth %d, %d heads, %lld parameters)\n", ckpt, run_attn_name(c), c->depth,
           c->heads, (long long)bk_model_num_params(m));
    printf("data        %s, %lld samples (%.0f samples/s)\n", ds.version, (long long)ev.n, (double)ev.n / secs);
    printf("accuracy    %.2f %%   loss %.4f\n", 100.0 * ev.acc, ev.loss);
    if (tpath[0])
        printf("teacher     %s: accuracy %.2f %%, agreement %.2f %%\n", tpath, 100.0 * tev.acc, 100.0 * agree);
    printf("confusion   (rows = label, columns = prediction)\n      ");
    for (int j = 0; j < C; j++) printf(" %6d", j);
    printf("\n");
    for (int i = 0; i < C; i++) {
        printf("  %3d ", i);
        for (int j = 0; j < C; j++) printf(" %6lld", (long long)ev.confusion[(size_t)i * C + j]);
        printf("\n");
    }
    printf("attention   (first %d samples)  layer  mean|row sum-1|  mean|col sum-1|  row entropy (uniform)\n",
           ndiag < ds.n ? ndiag : (int)ds.n);
    for (int l = 0; l < c->depth; l++)
        printf("                                %5d  %15.3g  %15.3g  %.3f (%.3f)\n", l, dg[l].row_dev, dg[l].col_dev,
               dg[l].entropy, dg[l].uniform_entropy);
    if (json) {
        size_t cap = 4096 + (size_t)C * C * 24 + (size_t)c->depth * 160;
        char *s = malloc(cap);
        if (!s) goto done;
        size_t n = (size_t)snprintf(s, cap,
                                    "{\"ckpt\":\"%s\",\"attn\":\"%s\",\"data\":\"%s\",\"n\":%lld,\"accuracy\":%.6g,"
                                    "\"loss\":%.6g",
                                    ckpt, run_attn_name(c), ds.version, (long long)ev.n, ev.acc, ev.loss);
        if (tpath[0])
            n += (size_t)snprintf(s + n, cap - n, ",\"teacher\":\"%s\",\"teacher_accuracy\":%.6g,\"agreement\":%.6g",
                                  tpath, tev.acc, agree);
        n += (size_t)snprintf(s + n, cap - n, ",\"confusion\":[");
        for (int i = 0; i < C; i++) {
            n += (size_t)snprintf(s + n, cap - n, i ? ",[" : "[");
            for (int j = 0; j < C; j++)
                n += (size_t)snprintf(s + n, cap - n, j ? ",%lld" : "%lld", (long long)ev.confusion[(size_t)i * C + j]);
            n += (size_t)snprintf(s + n, cap - n, "]");
        }
        n += (size_t)snprintf(s + n, cap - n, "],\"layers\":[");
        for (int l = 0; l < c->depth; l++)
            n += (size_t)snprintf(s + n, cap - n,
                                  "%s{\"row_dev\":%.6g,\"col_dev\":%.6g,\"entropy\":%.6g,\"uniform_entropy\":%.6g}",
                                  l ? "," : "", dg[l].row_dev, dg[l].col_dev, dg[l].entropy, dg[l].uniform_entropy);
        snprintf(s + n, cap - n, "]}\n");
        int ok = cli_write_text("eval", json, s);
        free(s);
        if (!ok) goto done;
    }
    rc = CLI_OK;
done:
    run_eval_free(&ev);
    run_eval_free(&tev);
    free(dg);
    free(extra);
    bk_model_free(m);
    bk_model_free(tm);
    data_close(&ds);
    return rc;
}

/* ---- birkhoff data ---- */
static void usage_data(FILE *f)
{
    fprintf(f, "usage: birkhoff data info NAME [--split train|test] [--data-dir DIR] [--seq-len N] [--points N]\n"
               "\n"
               "Opens a dataset as `birkhoff train` would (verifying its checksums) and prints its size, shape,\n"
               "classes, label counts and version. Fetch stored datasets with scripts/data.sh NAME.\n");
}

int cmd_data(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage_data(argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_USAGE : CLI_OK;
    }
    if (strcmp(argv[1], "info") || argc < 3) {
        usage_data(stderr);
        return CLI_USAGE;
    }
    const char *name = argv[2], *split = "train", *dir = NULL, *len_s = NULL, *pts_s = NULL;
    const cli_opt opts[] = {{"--split", &split, 0}, {"--data-dir", &dir, 0}, {"--seq-len", &len_s, 0},
                            {"--points", &pts_s, 0}};
    int done = 0, rc0 = cli_parse_opts("data info", argc - 2, argv + 2, opts, 4, usage_data, &done);
    if (done || rc0) return rc0;
    data_opts o = data_opts_default();
    o.dir = dir;
    if ((len_s && !cli_parse_int(len_s, &o.max_len)) || (pts_s && !cli_parse_int(pts_s, &o.points)) ||
        (strcmp(split, "train") && strcmp(split, "test"))) {
        fprintf(stderr, "birkhoff data: bad --seq-len, --points or --split\n");
        return CLI_USAGE;
    }
    data_set ds;
    char err[1024];
    if (!data_open(name, strcmp(split, "train") ? DATA_TEST : DATA_TRAIN, &o, &ds, err, sizeof err)) {
        fprintf(stderr, "birkhoff data: %s\n", err);
        return CLI_FAIL;
    }
    printf("dataset   %s\nversion   %s\nsamples   %lld\nclasses   %d\n", ds.name, ds.version, (long long)ds.n,
           ds.classes);
    if (ds.kind == BK_INPUT_IMAGE) printf("input     images %d x %d x %d\n", ds.channels, ds.h, ds.w);
    else if (ds.kind == BK_INPUT_TOKENS) printf("input     tokens (vocabulary %d, up to %d)\n", ds.vocab, ds.max_len);
    else printf("input     point clouds (%d points x %d)\n", ds.points, ds.point_dim);
    /* label counts and mean length over (at most) the first 5000 samples */
    int64_t n = ds.n < 5000 ? ds.n : 5000;
    int64_t counts[64] = {0};
    double mlen = 0;
    run_buf b;
    int ok = run_buf_init(&b, &ds, 1, ds.classes);
    for (int64_t i = 0; ok && i < n; i++) {
        b.idx[0] = i;
        bk_batch bt;
        ok = run_buf_fill(&b, &ds, 1, &bt);
        if (ok && b.lab[0] >= 0 && b.lab[0] < 64) counts[b.lab[0]]++;
        if (ok && ds.kind == BK_INPUT_TOKENS) mlen += b.len[0];
    }
    if (ok) {
        printf("labels    (first %lld)", (long long)n);
        for (int k = 0; k < ds.classes && k < 64; k++) printf(" %lld", (long long)counts[k]);
        printf("\n");
        if (ds.kind == BK_INPUT_TOKENS) printf("length    mean %.1f\n", mlen / (double)n);
    }
    run_buf_free(&b);
    data_close(&ds);
    if (!ok) fprintf(stderr, "birkhoff data: cannot read the samples\n");
    return ok ? CLI_OK : CLI_FAIL;
}
