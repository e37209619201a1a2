/* plot.c -- `birkhoff plot curves|attention|colsums|transport`: the
 * figures of a run (drawn by chart.c over cairo; PNG or SVG by extension). */
#include "../cli.h"
#include "chart.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void usage_plot(FILE *f)
{
    fprintf(f,
            "usage:\n"
            "  birkhoff plot curves --run DIR [--run DIR]... --out F.png|F.svg\n"
            "      training loss per step (moving average), test accuracy and attention |col sum - 1| per epoch\n"
            "  birkhoff plot attention --ckpt CKPT [--ckpt CKPT]... --out F [--index I] [--layer L] [--data-dir D]\n"
            "      the [CLS] row of layer L (default: the last) over the patches of test image I, per head, one\n"
            "      row per checkpoint (e.g. softmax and Sinkhorn side by side)\n"
            "  birkhoff plot colsums --run DIR [--run DIR]... --out F [--epochs a,b,...] [--layer L] [--samples N]\n"
            "      histograms of attention column sums at several epochs (default: first, middle, last saved;\n"
            "      all layers unless --layer), the Sinkformers Figure 2 view\n"
            "  birkhoff plot transport --out F [--n N] [--eps E] [--seed S]\n"
            "      the transport plans between two 2-D point sets: softmax, Sinkhorn, ESP (line width = weight)\n");
}

static const char *base_name(const char *p)
{
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    const char *s = p + n;
    while (s > p && s[-1] != '/') s--;
    return s;
}

/* What names a run in a figure: its directory's name, with its attention when that is not the
 * name already ("S5-s1 (sinkhorn)", "softmax"); a checkpoint file is named by its directory
 * (runs/x/last.safetensors -> x; runs/x/ckpt/epoch-0003.safetensors -> x). Two runs of one kind
 * stay apart in the figure. two_lines: "S5-s1\nsinkhorn" (a heat-map row label). */
static void run_label(const char *path, const char *attn, int two_lines, char *out, size_t cap)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') dir[--n] = 0;
    if (n > 12 && !strcmp(dir + n - 12, ".safetensors")) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
        n = strlen(dir);
        if (n >= 5 && !strcmp(dir + n - 5, "/ckpt")) dir[n - 5] = 0;
        else if (!strcmp(dir, "ckpt")) snprintf(dir, sizeof dir, ".");
    }
    const char *name = base_name(dir);
    if (!strcmp(name, ".") || !strcmp(name, attn) || !*name) snprintf(out, cap, "%s", attn);
    else snprintf(out, cap, two_lines ? "%.60s\n%s" : "%.60s (%s)", name, attn);
}

/* collects the values of a repeatable option; other options into opts */
static int collect(int argc, char **argv, const char *rep, const char **vals, int maxv, int *nv, const cli_opt *opts,
                   int nopt)
{
    *nv = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) {
            fprintf(stderr, "birkhoff plot: %s needs a value\n", argv[i]);
            return 0;
        }
        if (!strcmp(argv[i], rep)) {
            if (*nv == maxv) {
                fprintf(stderr, "birkhoff plot: at most %d %s\n", maxv, rep);
                return 0;
            }
            vals[(*nv)++] = argv[++i];
            continue;
        }
        int k = 0;
        while (k < nopt && strcmp(argv[i], opts[k].flag)) k++;
        if (k == nopt) {
            fprintf(stderr, "birkhoff plot: unknown option '%s'\n", argv[i]);
            return 0;
        }
        *opts[k].dst = argv[++i];
    }
    if (*nv == 0) {
        fprintf(stderr, "birkhoff plot: give at least one %s\n", rep);
        return 0;
    }
    return 1;
}

static int draw_fail(const char *err)
{
    fprintf(stderr, "birkhoff plot: %s\n", err);
    return CLI_FAIL;
}

/* ---- curves ---- */
typedef struct {
    int ns, ne;
    double *sx, *sy, *ex, *acc, *col;
    int valid; /* the epoch accuracies are the validation split's */
} run_curves;

/* A line of metrics.jsonl that is a record of `birkhoff train`: one JSON
 * object (no NUL byte), its first key "type", step with a finite "step" or
 * epoch with a finite "epoch", or the final test record; 0: step, 1: epoch,
 * 2: test, -1: not a record */
static int record_kind(const char *line, size_t len)
{
    const char *step = "{\"type\":\"step\",", *epoch = "{\"type\":\"epoch\",", *test = "{\"type\":\"test\",";
    if (strlen(line) != len || len < 2 || line[len - 1] != '}') return -1;
    if (!strncmp(line, test, strlen(test))) return 2;
    if (!strncmp(line, step, strlen(step))) return isfinite(cli_json_num(line, "step")) ? 0 : -1;
    if (!strncmp(line, epoch, strlen(epoch))) return isfinite(cli_json_num(line, "epoch")) ? 1 : -1;
    return -1;
}

/* The curves of a run's metrics.jsonl, read by the library's bounded reader
 * (BK_TEXT_MAX_LINE bytes a line, BK_TEXT_MAX_BYTES in all). A file without
 * any record (empty, or not a metrics file) is refused; lines that are not
 * records in a file that has some (a last line cut by a killed run, an
 * edit) are skipped with a warning naming their count and the first. */
static void free_curves(run_curves *c);
static int read_curves(const char *dir, run_curves *c)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    memset(c, 0, sizeof *c);
    bk_text_config tc = bk_text_config_default();
    tc.nul_ok = 1; /* a line holding one is not a record, counted below */
    bk_text_reader *f = NULL;
    if (bk_text_open(p, &tc, &f) != BK_OK) {
        fprintf(stderr, "birkhoff plot: %s (is %s a run directory of `birkhoff train`?)\n", bk_last_error(), dir);
        return 0;
    }
    int caps = 0, cape = 0;
    char *line = NULL;
    size_t len = 0;
    int ok = 1;
    int64_t bad = 0, first_bad = 0;
    bk_status st = BK_OK;
    while (ok && (st = bk_text_next(f, &line, &len)) == BK_OK && line) {
        const int kind = record_kind(line, len);
        if (kind < 0 && !bad++) first_bad = bk_text_lineno(f);
        if (kind == 1) {
            if (c->ne == cape) {
                cape = cape ? 2 * cape : 64;
                double *a = realloc(c->ex, sizeof(double) * cape), *b = a ? realloc(c->acc, sizeof(double) * cape) : NULL,
                       *d = b ? realloc(c->col, sizeof(double) * cape) : NULL;
                if (a) c->ex = a;
                if (b) c->acc = b;
                if (d) c->col = d;
                if (!d) ok = 0;
            }
            if (ok) {
                c->ex[c->ne] = cli_json_num(line, "epoch");
                /* the held-out accuracy: the validation split's when the run has one */
                const double va = cli_json_num(line, "valid_acc");
                if (isfinite(va)) c->valid = 1;
                c->acc[c->ne] = 100.0 * (isfinite(va) ? va : cli_json_num(line, "test_acc"));
                c->col[c->ne] = cli_json_num(line, "attn_col_dev");
                c->ne++;
            }
        } else if (kind == 0) {
            if (c->ns == caps) {
                caps = caps ? 2 * caps : 1024;
                double *a = realloc(c->sx, sizeof(double) * caps), *b = a ? realloc(c->sy, sizeof(double) * caps) : NULL;
                if (a) c->sx = a;
                if (b) c->sy = b;
                if (!b) ok = 0;
            }
            if (ok) {
                c->sx[c->ns] = cli_json_num(line, "step");
                c->sy[c->ns] = cli_json_num(line, "loss");
                c->ns++;
            }
        }
    }
    const int64_t lines = bk_text_lineno(f);
    bk_text_close(f);
    if (ok && st != BK_OK) {
        fprintf(stderr, "birkhoff plot: %s\n", bk_last_error());
        ok = 0;
    } else if (!ok) {
        fprintf(stderr, "birkhoff plot: out of memory\n");
    } else if (c->ns + c->ne == 0) {
        if (lines == 0) fprintf(stderr, "birkhoff plot: %s: no records (the file is empty)\n", p);
        else
            fprintf(stderr, "birkhoff plot: %s: no records: line %lld is not a record of `birkhoff train` (none of its "
                            "%lld lines is)\n", p, (long long)first_bad, (long long)lines);
        ok = 0;
    }
    if (!ok) {
        free_curves(c);
        return 0;
    }
    if (bad)
        fprintf(stderr, "birkhoff plot: warning: %s: %lld of its %lld lines are not records (the first: line %lld); "
                        "skipped\n", p, (long long)bad, (long long)lines, (long long)first_bad);
    /* moving average of the loss over ~1% of the steps (at least 1) */
    int w = c->ns / 100 > 1 ? c->ns / 100 : 1;
    double *sm = ok && c->ns ? malloc(sizeof(double) * c->ns) : NULL, acc = 0;
    for (int i = 0; sm && i < c->ns; i++) {
        acc += c->sy[i];
        if (i >= w) acc -= c->sy[i - w];
        sm[i] = acc / (i + 1 < w ? i + 1 : w);
    }
    if (sm) {
        free(c->sy);
        c->sy = sm;
    }
    return ok;
}

static void free_curves(run_curves *c)
{
    free(c->sx);
    free(c->sy);
    free(c->ex);
    free(c->acc);
    free(c->col);
}

static int plot_curves(int argc, char **argv)
{
    const char *runs[16], *out = NULL;
    int nr;
    const cli_opt opts[] = {{"--out", &out, 0}};
    if (!collect(argc, argv, "--run", runs, 16, &nr, opts, 1)) return CLI_USAGE;
    if (!out) {
        fprintf(stderr, "birkhoff plot curves: --out F.png|F.svg is required\n");
        return CLI_USAGE;
    }
    run_curves c[16];
    chart_series s[3][16];
    int ok = 1, nread = 0, nvalid = 0;
    for (int i = 0; i < nr && ok; i++) {
        ok = read_curves(runs[i], &c[i]);
        if (!ok) break;
        nread++;
        nvalid += c[i].valid;
        const char *nm = base_name(runs[i]);
        s[0][i] = (chart_series){nm, c[i].ns, c[i].sx, c[i].sy};
        s[1][i] = (chart_series){nm, c[i].ne, c[i].ex, c[i].acc};
        s[2][i] = (chart_series){nm, c[i].ne, c[i].ex, c[i].col};
    }
    int rc = CLI_FAIL;
    if (ok) {
        chart_panel p[3] = {{"training loss (moving average)", "step", "loss", 1, nr, s[0], 1},
                            {nvalid == nr  ? "validation accuracy"
                             : nvalid ? "validation accuracy (test for runs without a validation split)"
                                      : "test accuracy",
                             "epoch", "accuracy (%)", 0, nr, s[1], 1},
                            {"attention column sums", "epoch", "mean |col sum - 1|", 1, nr, s[2], 1}};
        char err[512];
        rc = chart_lines(out, "training curves", 3, p, err, sizeof err) ? CLI_OK : draw_fail(err);
        if (!rc) printf("wrote %s\n", out);
    }
    for (int i = 0; i < nread; i++) free_curves(&c[i]);
    return rc;
}

/* ---- attention maps ---- */
static int plot_attention(int argc, char **argv)
{
    const char *ck[8], *out = NULL, *is = NULL, *lsx = NULL, *dir = NULL;
    int nc;
    const cli_opt opts[] = {{"--out", &out, 0}, {"--index", &is, 0}, {"--layer", &lsx, 0}, {"--data-dir", &dir, 0}};
    if (!collect(argc, argv, "--ckpt", ck, 8, &nc, opts, 4)) return CLI_USAGE;
    int index = 0, layer = -1;
    if (!out || (is && (!cli_parse_int(is, &index) || index < 0)) || (lsx && (!cli_parse_int(lsx, &layer) || layer < 0))) {
        fprintf(stderr, "birkhoff plot attention: --out is required; --index and --layer >= 0\n");
        return CLI_USAGE;
    }
    int rc = CLI_FAIL, cols = 1;
    chart_map *maps = NULL;
    float *bufs[8] = {0};
    float *img = NULL;
    char labels[8][96];
    const char *lab[8];
    char titles[8][17][32];
    int hs[8] = {0}, gw = 0, gh = 0, iw = 0, ih = 0;
    for (int r = 0; r < nc; r++) {
        bk_model *m = NULL;
        bk_run_config rc_;
        if (bk_run_load(ck[r], 1, &m, &rc_, NULL) != BK_OK) {
            fprintf(stderr, "birkhoff plot: %s\n", bk_last_error());
            goto done;
        }
        const bk_model_config *c = bk_model_get_config(m);
        bk_dataset *dset;
        if (c->input != BK_INPUT_IMAGE || !c->cls || c->set_block != BK_SET_SAB) {
            fprintf(stderr, "birkhoff plot attention: %s is not an image model with a [CLS] token and encoder "
                            "blocks\n", ck[r]);
            bk_model_free(m);
            goto done;
        }
        if (bk_run_open_data(&rc_, NULL, dir, BK_SPLIT_TEST, 0, c, &dset) != BK_OK) {
            fprintf(stderr, "birkhoff plot: %s\n", bk_last_error());
            bk_model_free(m);
            goto done;
        }
        const bk_dataset_info *ds = bk_data_info(dset);
        const int L = layer < 0 ? c->depth - 1 : layer, T = bk_model_tokens(m), H = c->heads;
        const int pw = c->image_w / c->patch, ph = c->image_h / c->patch;
        bk_data_batch b = {0};
        float *A = malloc(sizeof(float) * (size_t)H * T * T);
        int ok = A && L < c->depth && index < ds->n && bk_data_batch_init(&b, dset, 1) == BK_OK;
        if (!ok) {
            fprintf(stderr, "birkhoff plot attention: layer %d or index %d out of range (depth %d, %lld images)\n", L,
                    index, c->depth, (long long)ds->n);
            free(A);
            bk_data_close(dset);
            bk_model_free(m);
            goto done;
        }
        b.idx[0] = index;
        bk_batch bt;
        ok = bk_data_batch_fill(&b, dset, 1, &bt) == BK_OK && bk_model_forward(m, &bt, 0, 0.0f, NULL, NULL) == BK_OK &&
             bk_model_attention(m, L, A) == BK_OK;
        if (ok) {
            bufs[r] = malloc(sizeof(float) * (size_t)H * ph * pw);
            if (!img) {
                iw = ds->width;
                ih = ds->height;
                img = malloc(sizeof(float) * (size_t)iw * ih);
                if (img) memcpy(img, b.x, sizeof(float) * (size_t)iw * ih);
            }
            ok = bufs[r] && img;
            for (int h = 0; ok && h < H; h++)
                for (int j = 0; j < ph * pw; j++) bufs[r][(size_t)h * ph * pw + j] = A[(size_t)h * T * T + 1 + j];
        }
        if (!ok) fprintf(stderr, "birkhoff plot attention: %s\n", bk_last_error());
        char who[96];
        run_label(ck[r], bk_attn_kind_name(c->attn), 1, who, sizeof who);
        snprintf(labels[r], sizeof labels[r], "%.70s, layer %d", who, L);
        lab[r] = labels[r];
        hs[r] = H < 16 ? H : 16;
        gw = pw;
        gh = ph;
        if (1 + hs[r] > cols) cols = 1 + hs[r];
        free(A);
        bk_data_batch_free(&b);
        bk_data_close(dset);
        bk_model_free(m);
        if (!ok) goto done;
    }
    maps = calloc((size_t)nc * cols, sizeof *maps);
    if (!maps) goto done;
    for (int r = 0; r < nc; r++) {
        maps[(size_t)r * cols] = (chart_map){"input", iw, ih, img, 1};
        for (int h = 0; h < hs[r]; h++) {
            snprintf(titles[r][h], sizeof titles[r][h], "head %d", h);
            maps[(size_t)r * cols + 1 + h] = (chart_map){titles[r][h], gw, gh, bufs[r] + (size_t)h * gw * gh, 0};
        }
    }
    char err[512], title[128];
    snprintf(title, sizeof title, "[CLS] attention over the patches of test image %d", index);
    if (!chart_heatmaps(out, title, nc, cols, lab, maps, err, sizeof err)) rc = draw_fail(err);
    else {
        printf("wrote %s\n", out);
        rc = CLI_OK;
    }
done:
    for (int r = 0; r < 8; r++) free(bufs[r]);
    free(img);
    free(maps);
    return rc;
}

/* ---- column sums across training ---- */
static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* the epochs with a checkpoint in DIR/ckpt, sorted */
static int run_epochs(const char *dir, int *ep, int max)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/ckpt", dir);
    DIR *d = opendir(p);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        /* epoch-N.safetensors, N in [0, 2^31) (strtoll: sscanf's %d overflows silently) */
        const char *dot = strchr(e->d_name, '.');
        char num[24] = "";
        long long v;
        if (!strncmp(e->d_name, "epoch-", 6) && dot && dot - e->d_name - 6 < (long)sizeof num) {
            memcpy(num, e->d_name + 6, (size_t)(dot - e->d_name - 6));
            if (!strcmp(dot, ".safetensors") && cli_parse_range(num, 0, 2147483647, &v)) ep[n++] = (int)v;
        }
    }
    closedir(d);
    qsort(ep, (size_t)n, sizeof(int), cmp_int);
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* one line per histogram: its quantiles, the mean |sum - 1| and the share of
 * columns within [0.5, 1.5] (the numbers behind the figure) */
static void print_colsum_stats(const char *run, int epoch, const double *v, int64_t n)
{
    double *w = malloc(sizeof(double) * (size_t)n);
    if (!w) return;
    memcpy(w, v, sizeof(double) * (size_t)n);
    qsort(w, (size_t)n, sizeof(double), cmp_double);
    double dev = 0.0;
    int64_t near = 0;
    for (int64_t i = 0; i < n; i++) {
        dev += fabs(w[i] - 1.0);
        near += w[i] >= 0.5 && w[i] <= 1.5;
    }
#define Q(f) w[(int64_t)((f) * (double)(n - 1) + 0.5)]
    printf("%s epoch %d: columns %lld, q10 %.3f q25 %.3f median %.3f q75 %.3f q90 %.3f max %.3f, mean |sum-1| "
           "%.4f, in [0.5,1.5] %.1f%%\n",
           run, epoch, (long long)n, Q(0.10), Q(0.25), Q(0.50), Q(0.75), Q(0.90), w[n - 1], dev / (double)n,
           100.0 * (double)near / (double)n);
#undef Q
    free(w);
}

static int plot_colsums(int argc, char **argv)
{
    const char *runs[8], *out = NULL, *eps_s = NULL, *lsx = NULL, *ns = NULL, *dir = NULL;
    int nr;
    const cli_opt opts[] = {
        {"--out", &out, 0}, {"--epochs", &eps_s, 0}, {"--layer", &lsx, 0}, {"--samples", &ns, 0}, {"--data-dir", &dir, 0}};
    if (!collect(argc, argv, "--run", runs, 8, &nr, opts, 5)) return CLI_USAGE;
    int layer = -1, nsamp = 64;
    if (!out || (lsx && (!cli_parse_int(lsx, &layer) || layer < 0)) ||
        (ns && (!cli_parse_int(ns, &nsamp) || nsamp < 1 || nsamp > 4096))) {
        fprintf(stderr, "birkhoff plot colsums: --out is required; --layer >= 0; --samples in [1, 4096]\n");
        return CLI_USAGE;
    }
    int want[16], nwant = 0;
    if (eps_s) {
        const char *p = eps_s;
        while (*p && nwant < 16) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v > 1000000 || (*end && *end != ',')) {
                fprintf(stderr, "birkhoff plot colsums: --epochs expects a list like 0,5,10\n");
                return CLI_USAGE;
            }
            want[nwant++] = (int)v;
            p = *end ? end + 1 : end;
        }
    }
    int rc = CLI_FAIL, npan = 0, cols = 0;
    chart_hist pan[8 * 16];
    char titles[8 * 16][128];
    float *vals[8 * 16] = {0};
    double *dv[8 * 16] = {0};
    for (int r = 0; r < nr; r++) {
        int ep[4096];
        int ne = run_epochs(runs[r], ep, 4096);
        if (ne <= 0) {
            fprintf(stderr, "birkhoff plot colsums: %s/ckpt holds no epoch checkpoints\n", runs[r]);
            goto done;
        }
        int pick[16], np = 0;
        if (nwant) {
            for (int k = 0; k < nwant; k++) {
                int f = 0;
                for (int i = 0; i < ne; i++) f |= ep[i] == want[k];
                if (!f) {
                    fprintf(stderr, "birkhoff plot colsums: %s has no checkpoint of epoch %d\n", runs[r], want[k]);
                    goto done;
                }
                pick[np++] = want[k];
            }
        } else {
            pick[np++] = ep[0];
            if (ne > 2) pick[np++] = ep[ne / 2];
            if (ne > 1) pick[np++] = ep[ne - 1];
        }
        if (np > cols) cols = np;
        for (int k = 0; k < np; k++) {
            char path[1200];
            snprintf(path, sizeof path, "%s/ckpt/epoch-%04d.safetensors", runs[r], pick[k]);
            bk_model *m = NULL;
            bk_run_config rc_;
            if (bk_run_load(path, nsamp, &m, &rc_, NULL) != BK_OK) {
                fprintf(stderr, "birkhoff plot: %s\n", bk_last_error());
                goto done;
            }
            const bk_model_config *c = bk_model_get_config(m);
            bk_dataset *dset;
            if (bk_run_open_data(&rc_, NULL, dir, BK_SPLIT_TEST, 0, c, &dset) != BK_OK) {
                fprintf(stderr, "birkhoff plot: %s\n", bk_last_error());
                bk_model_free(m);
                goto done;
            }
            const int64_t n = bk_data_info(dset)->n;
            const int T = bk_model_tokens(m), B = nsamp < n ? nsamp : (int)n;
            bk_layer_diag *dg = calloc((size_t)c->depth, sizeof *dg);
            float *cs = malloc(sizeof(float) * (size_t)c->depth * B * c->heads * T);
            int64_t ncol = 0;
            int ok = dg && cs && (layer < c->depth);
            if (ok && bk_attention_diag(m, dset, B, dg, cs, &ncol) != BK_OK) {
                fprintf(stderr, "birkhoff plot colsums: %s\n", bk_last_error());
                ok = 0;
            }
            const int l0 = layer < 0 ? 0 : layer, l1 = layer < 0 ? c->depth : layer + 1;
            double *v = ok ? malloc(sizeof(double) * (size_t)(l1 - l0) * (size_t)ncol) : NULL;
            int64_t nv = 0;
            for (int l = l0; v && l < l1; l++)
                for (int64_t i = 0; i < ncol; i++) v[nv++] = cs[(size_t)l * B * c->heads * T + (size_t)i];
            if (ok && !v) fprintf(stderr, "birkhoff plot colsums: out of memory\n");
            if (layer >= c->depth) fprintf(stderr, "birkhoff plot colsums: --layer %d >= depth %d\n", layer, c->depth);
            if (v && nv > 0) print_colsum_stats(runs[r], pick[k], v, nv);
            char who[96];
            run_label(runs[r], bk_attn_kind_name(c->attn), 0, who, sizeof who);
            snprintf(titles[npan], sizeof titles[npan], "%.80s, epoch %d%s", who, pick[k],
                     layer < 0 ? "" : " (one layer)");
            pan[npan] = (chart_hist){titles[npan], (int)nv, v};
            dv[npan] = v;
            vals[npan] = cs;
            npan++;
            free(dg);
            bk_data_close(dset);
            bk_model_free(m);
            if (!v) goto done;
        }
        /* pad the row to the grid */
        while (npan % (cols ? cols : 1) && npan < 8 * 16) {
            titles[npan][0] = 0;
            pan[npan] = (chart_hist){"", 0, NULL};
            npan++;
        }
    }
    {
        char err[512];
        /* [0, 3]: the informative range (softmax's few large sums, up to the
         * token count, would squash the rest); larger sums land in the last bin */
        if (!chart_histograms(out, "attention column sums across training (sums above 3 in the last bin)", npan, cols,
                              pan, 30, 0.0, 3.0, 1.0, "column sum", err, sizeof err))
            rc = draw_fail(err);
        else {
            printf("wrote %s\n", out);
            rc = CLI_OK;
        }
    }
done:
    for (int i = 0; i < npan; i++) {
        free(vals[i]);
        free(dv[i]);
    }
    return rc;
}

/* ---- transport plans between two point sets ---- */
static int plot_transport(int argc, char **argv)
{
    const char *out = NULL, *ns = NULL, *es = NULL, *ss = NULL;
    const cli_opt opts[] = {{"--out", &out, 0}, {"--n", &ns, 0}, {"--eps", &es, 0}, {"--seed", &ss, 0}};
    int done = 0, rc0 = cli_parse_opts("plot transport", argc, argv, opts, 4, usage_plot, &done);
    if (done || rc0) return rc0;
    int n = 12, seed = 1;
    float eps = 0.1f;
    if (!out || (ns && (!cli_parse_int(ns, &n) || n < 2 || n > 200)) || (es && (!cli_parse_float(es, &eps) || eps <= 0)) ||
        (ss && (!cli_parse_int(ss, &seed) || seed < 0))) {
        fprintf(stderr, "birkhoff plot transport: --out is required; --n in [2, 200], --eps > 0, --seed >= 0\n");
        return CLI_USAGE;
    }
    /* two clouds: x around (-1, 0), y on an arc around (1, 0) */
    float *x = malloc(sizeof(float) * 2 * n), *y = malloc(sizeof(float) * 2 * n), *v = malloc(sizeof(float) * n),
          *o = malloc(sizeof(float) * n), *P[3] = {NULL, NULL, NULL};
    int rc = CLI_FAIL;
    if (!x || !y || !v || !o) goto done;
    cli_fill(x, (size_t)2 * n, (unsigned)seed, 0.5f);
    cli_fill(y, (size_t)2 * n, (unsigned)seed + 1000u, 0.15f);
    for (int i = 0; i < n; i++) {
        x[2 * i] -= 1.0f;
        const double a = -1.2 + 2.4 * i / (n - 1);
        y[2 * i] += (float)(0.6 + cos(a));
        y[2 * i + 1] += (float)sin(a);
        v[i] = 0;
    }
    bk_attn_desc d = {1, 1, n, n, 2, 1, NULL, NULL};
    bk_tensor q = {x, 2 * n, 2 * n, 2, BK_DEVICE_HOST, BK_F32}, k = {y, 2 * n, 2 * n, 2, BK_DEVICE_HOST, BK_F32},
              vt = {v, n, n, 1, BK_DEVICE_HOST, BK_F32}, ot = {o, n, n, 1, BK_DEVICE_HOST, BK_F32};
    for (int i = 0; i < 3; i++)
        if (!(P[i] = malloc(sizeof(float) * n * n))) goto done;
    /* scores 2 x.y / eps: the row and column terms of -|x - y|^2 / eps are
     * absorbed by the normalisations, so Sinkhorn gives the entropic plan of
     * the squared distance and softmax its row-normalised kernel */
    bk_softmax_config sp = {2.0f / eps, 0};
    bk_sinkhorn_config kp = bk_sinkhorn_config_default();
    kp.scale = 2.0f;
    kp.eps = eps;
    kp.iters = 400;
    bk_esp_config ep = bk_esp_config_default();
    ep.sort = BK_ESP_HARD;
    ep.scale = 1.0f;
    ep.L = 16;
    ep.seed = (uint64_t)seed;
    size_t ws = bk_softmax_workspace_size(&d);
    size_t w2 = bk_sinkhorn_workspace_size(&d, &kp), w3 = bk_esp_workspace_size(&d, &ep);
    if (w2 > ws) ws = w2;
    if (w3 > ws) ws = w3;
    void *w = malloc(ws ? ws : 1);
    bk_tensor A0 = {P[0], n * n, n * n, n, BK_DEVICE_HOST, BK_F32}, A1 = {P[1], n * n, n * n, n, BK_DEVICE_HOST, BK_F32},
              A2 = {P[2], n * n, n * n, n, BK_DEVICE_HOST, BK_F32};
    bk_sinkhorn_extras kx = {A1, NULL, NULL, NULL};
    bk_esp_extras ex = {A2, NULL, NULL, NULL};
    int ok = w && bk_softmax_forward(&d, &sp, &q, &k, &vt, &ot, NULL, &A0, w, ws) == BK_OK &&
             bk_sinkhorn_forward(&d, &kp, &q, &k, &vt, &ot, NULL, &kx, w, ws) == BK_OK &&
             bk_esp_forward(&d, &ep, &q, &k, &vt, &ot, NULL, &ex, w, ws) == BK_OK;
    free(w);
    if (!ok) {
        fprintf(stderr, "birkhoff plot transport: %s\n", bk_last_error());
        goto done;
    }
    char t0[64], t1[64], t2[64], err[512];
    snprintf(t0, sizeof t0, "softmax (rows only), eps = %g", (double)eps);
    snprintf(t1, sizeof t1, "Sinkhorn, eps = %g", (double)eps);
    snprintf(t2, sizeof t2, "ESP (hard, %d slices)", ep.L);
    chart_plan plans[3] = {{t0, P[0]}, {t1, P[1]}, {t2, P[2]}};
    if (!chart_transport(out, "transport plans between two point sets (line width = weight)", n, x, n, y, 3, plans, err,
                         sizeof err))
        rc = draw_fail(err);
    else {
        printf("wrote %s\n", out);
        rc = CLI_OK;
    }
done:
    free(x);
    free(y);
    free(v);
    free(o);
    for (int i = 0; i < 3; i++) free(P[i]);
    return rc;
}

int cmd_plot(int argc, char **argv)
{
    if (argc < 2) {
        usage_plot(stderr);
        return CLI_USAGE;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
        usage_plot(stdout);
        return CLI_OK;
    }
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage_plot(stdout);
            return CLI_OK;
        }
    if (!strcmp(sub, "curves")) return plot_curves(argc - 1, argv + 1);
    if (!strcmp(sub, "attention")) return plot_attention(argc - 1, argv + 1);
    if (!strcmp(sub, "colsums")) return plot_colsums(argc - 1, argv + 1);
    if (!strcmp(sub, "transport")) return plot_transport(argc - 1, argv + 1);
    fprintf(stderr, "birkhoff plot: unknown figure '%s'\n", sub);
    usage_plot(stderr);
    return CLI_USAGE;
}
