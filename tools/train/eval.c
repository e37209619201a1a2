/* eval.c -- `birkhoff eval`: accuracy, loss, confusion matrix and the
 * attention diagnostics of a checkpoint on a dataset (bk_evaluate,
 * bk_attention_diag); for a compiled ASAP model, the agreement with its
 * Sinkhorn teacher. */
#include "../cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void usage_eval(FILE *f)
{
    fprintf(f, "usage: birkhoff eval --ckpt CKPT [--data NAME] [--split test|train|valid] [--limit N] [--data-dir DIR]\n"
               "                     [--batch B] [--diag-samples N] [--teacher CKPT] [--json OUT.json]\n"
               "                     [--esp-sort model|soft|hard | --esp-hard] [--asap-ending auto|zero|column|row]\n"
               "\n"
               "Evaluates a checkpoint written by `birkhoff train` (or `birkhoff asap compile`) on a split of its\n"
               "dataset (the data options are the run's; --data picks another dataset of the same shape):\n"
               "accuracy, mean loss, the confusion matrix (rows = label, columns = prediction) and, per layer,\n"
               "the attention diagnostics on the first N samples (default 64): mean |row sum - 1|, mean\n"
               "|column sum - 1| and the mean entropy of the attention rows (with that of a uniform row).\n"
               "A compiled ASAP model is compared with its teacher (--teacher, default: the checkpoint it was\n"
               "compiled from): the fraction of samples on which their predictions agree.\n"
               "An ESP model is evaluated with the sort its run's eval_esp_sort names (default: the model's own,\n"
               "esp_soft of its configuration); --esp-sort hard (or --esp-hard) evaluates a soft-trained model with\n"
               "the exact sort (ESPFormer's \"hard\" mode: exactly doubly stochastic attention).\n"
               "A compiled ASAP model runs with the ending it was compiled with (asap_ending, default auto: the\n"
               "teacher's); --asap-ending evaluates it with another (zero: ASAP-0; column; row): the fitted\n"
               "coefficients serve every ending.\n");
}

int cmd_eval(int argc, char **argv)
{
    const char *ckpt = NULL, *data = NULL, *split = "test", *limit_s = NULL, *dir = NULL, *batch_s = NULL,
               *diag_s = NULL, *teacher = NULL, *json = NULL, *esp_sort = NULL, *esp_hard = NULL, *ending = NULL;
    const cli_opt opts[] = {{"--ckpt", &ckpt, 0},         {"--data", &data, 0},   {"--split", &split, 0},
                            {"--limit", &limit_s, 0},     {"--data-dir", &dir, 0}, {"--batch", &batch_s, 0},
                            {"--diag-samples", &diag_s, 0}, {"--teacher", &teacher, 0}, {"--json", &json, 0},
                            {"--esp-sort", &esp_sort, 0}, {"--esp-hard", &esp_hard, 1},
                            {"--asap-ending", &ending, 0}};
    int done = 0, rc0 = cli_parse_opts("eval", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), usage_eval, &done);
    if (done || rc0) return rc0;
    int limit = 0, batch = 256, ndiag = 64;
    if (!ckpt || (limit_s && (!cli_parse_int(limit_s, &limit) || limit < 0)) ||
        (batch_s && (!cli_parse_int(batch_s, &batch) || batch < 1)) ||
        (diag_s && (!cli_parse_int(diag_s, &ndiag) || ndiag < 1 || ndiag > 4096)) ||
        (strcmp(split, "test") && strcmp(split, "train") && strcmp(split, "valid")) ||
        (esp_sort && strcmp(esp_sort, "model") && strcmp(esp_sort, "soft") && strcmp(esp_sort, "hard")) ||
        (esp_sort && esp_hard && strcmp(esp_sort, "hard"))) {
        fprintf(stderr, "birkhoff eval: needs --ckpt; --limit >= 0, --batch >= 1, --diag-samples in [1, 4096], "
                        "--split test|train|valid, --esp-sort model|soft|hard (--esp-hard: hard)\n");
        return CLI_USAGE;
    }
    if (esp_hard) esp_sort = "hard";
    const int maxb = batch > ndiag ? batch : ndiag;
    bk_model *m = NULL, *tm = NULL;
    bk_run_config r, tr;
    char *extra = NULL;
    if (bk_run_load(ckpt, maxb, &m, &r, &extra) != BK_OK) {
        fprintf(stderr, "birkhoff eval: %s\n", bk_last_error());
        return CLI_FAIL;
    }
    bk_dataset *dset;
    const bk_split sp = !strcmp(split, "test") ? BK_SPLIT_TEST : !strcmp(split, "valid") ? BK_SPLIT_VALID : BK_SPLIT_TRAIN;
    if (bk_run_open_data(&r, data, dir, sp, limit, bk_model_get_config(m), &dset) != BK_OK) {
        fprintf(stderr, "birkhoff eval: %s\n", bk_last_error());
        free(extra);
        bk_model_free(m);
        return CLI_FAIL;
    }
    const bk_dataset_info *ds = bk_data_info(dset);
    int rc = CLI_FAIL;
    /* ESP's sort: the flag, else the run's eval_esp_sort, else the model's own */
    if (!esp_sort && (!strcmp(r.eval_esp_sort, "soft") || !strcmp(r.eval_esp_sort, "hard"))) esp_sort = r.eval_esp_sort;
    /* the attention's evaluation options: ESP's sort, ASAP's ending */
    int bad_kind = 0;
    bk_model_config ec = *bk_model_get_config(m);
    if (esp_sort && strcmp(esp_sort, "model")) {
        if (strcmp(bk_attn_kind_name(ec.attn), "esp")) {
            fprintf(stderr, "birkhoff eval: --esp-sort %s chooses ESP's sort; %s has %s attention\n", esp_sort, ckpt,
                    bk_attn_kind_name(ec.attn));
            bad_kind = 1;
        } else
            bk_model_config_set(&ec, "attn.sort", !strcmp(esp_sort, "soft") ? "soft" : "hard");
    }
    if (ending) {
        if (strcmp(bk_attn_kind_name(ec.attn), "asap")) {
            fprintf(stderr, "birkhoff eval: --asap-ending %s chooses a compiled ASAP model's ending; %s has %s "
                            "attention\n", ending, ckpt, bk_attn_kind_name(ec.attn));
            bad_kind = 1;
        }
        if (!bad_kind && bk_model_config_set(&ec, "attn.variant", ending) != BK_OK) {
            fprintf(stderr, "birkhoff eval: --asap-ending auto|zero|column|row (got '%s')\n", ending);
            bad_kind = 1;
        }
    }
    const int change = (esp_sort && strcmp(esp_sort, "model")) || ending;
    if (bad_kind || (change && bk_model_set_attn_config(m, &ec) != BK_OK)) {
        if (!bad_kind) fprintf(stderr, "birkhoff eval: %s\n", bk_last_error());
        free(extra);
        bk_model_free(m);
        bk_data_close(dset);
        return bad_kind ? CLI_USAGE : CLI_FAIL;
    }
    const bk_model_config *c = bk_model_get_config(m);
    bk_eval_result ev = {0}, tev = {0};
    bk_layer_diag *dg = calloc((size_t)(c->depth > 0 ? c->depth : 1), sizeof *dg);
    char tpath[1024] = "";
    if (teacher) snprintf(tpath, sizeof tpath, "%s", teacher);
    else if (!strcmp(bk_attn_kind_name(c->attn), "asap")) bk_run_extra_get(extra, "teacher", tpath, sizeof tpath);
    if (!dg) goto done;
    if (teacher && strcmp(bk_attn_kind_name(c->attn), "asap")) {
        fprintf(stderr, "birkhoff eval: --teacher compares a compiled ASAP model with its teacher; %s has %s "
                        "attention\n", ckpt, bk_attn_kind_name(c->attn));
        rc = CLI_USAGE;
        goto done;
    }
    if (tpath[0] && c->arch == BK_ARCH_SEQ2SEQ) {
        fprintf(stderr, "birkhoff eval: --teacher compares a compiled ASAP classifier with its teacher; %s is an "
                        "encoder-decoder\n",
                ckpt);
        rc = CLI_USAGE;
        goto done;
    }
    const double t0 = cli_now();
    if (bk_evaluate(m, dset, 0, batch, 1, &ev) != BK_OK || bk_attention_diag(m, dset, ndiag, dg, NULL, NULL) != BK_OK) {
        fprintf(stderr, "birkhoff eval: %s\n", bk_last_error());
        goto done;
    }
    const double secs = cli_now() - t0;
    double agree = NAN;
    if (tpath[0]) {
        if (bk_run_load(tpath, batch, &tm, &tr, NULL) != BK_OK) {
            fprintf(stderr, "birkhoff eval: %s\n", bk_last_error());
            goto done;
        }
        /* the teacher is a Sinkhorn model; the one the metadata names must
         * still be the model this one was compiled from (its weights) */
        const bk_model_config *tc = bk_model_get_config(tm);
        const int64_t tp = bk_model_num_params(tm);
        if (strcmp(bk_attn_kind_name(tc->attn), "sinkhorn")) {
            fprintf(stderr, "birkhoff eval: teacher %s has %s attention; an ASAP model's teacher is the Sinkhorn model "
                            "it was compiled from%s\n", tpath, bk_attn_kind_name(tc->attn),
                    teacher ? "" : " (that file was replaced since: pass --teacher CKPT)");
            rc = teacher ? CLI_USAGE : CLI_FAIL;
            goto done;
        }
        if (!teacher && (tp > bk_model_num_params(m) ||
                         memcmp(bk_model_params(tm), bk_model_params(m), sizeof(float) * (size_t)tp))) {
            fprintf(stderr, "birkhoff eval: teacher %s (named in %s) is no longer the model %s was compiled from: "
                            "its weights differ (pass --teacher CKPT)\n", tpath, ckpt, ckpt);
            goto done;
        }
        if (bk_evaluate(tm, dset, 0, batch, 1, &tev) != BK_OK) {
            fprintf(stderr, "birkhoff eval: teacher: %s\n", bk_last_error());
            goto done;
        }
        int64_t same = 0;
        for (int64_t i = 0; i < ev.n; i++) same += ev.pred[i] == tev.pred[i];
        agree = (double)same / (double)ev.n;
    }
    const int C = ev.classes; /* (0 for an encoder-decoder: no confusion matrix) */
    const int s2s = c->arch == BK_ARCH_SEQ2SEQ;
    printf("checkpoint  %s (%s attention, depth %d, %d heads, %lld parameters)\n", ckpt, bk_attn_kind_name(c->attn), c->depth,
           c->heads, (long long)bk_model_num_params(m));
    char esort[16] = "", et[32] = "", etau[32] = "";
    if (!strcmp(bk_attn_kind_name(c->attn), "esp")) {
        bk_model_config_get(c, "attn.sort", esort, sizeof esort);
        bk_model_config_get(c, "attn.t", et, sizeof et);
        bk_model_config_get(c, "attn.tau", etau, sizeof etau);
        printf("esp         %s sort (t = %g, tau = %g)\n", esort, strtod(et, NULL), strtod(etau, NULL));
    }
    printf("data        %s, %lld samples (%.0f samples/s)\n", ds->version, (long long)ev.n, (double)ev.n / secs);
    if (s2s)
        printf("accuracy    %.2f %% of the target tokens (teacher-forced)   loss %.4f per token   perplexity %.2f\n"
               "            (BLEU of decoded translations: birkhoff translate --ckpt CKPT --input SRC --ref REF)\n",
               100.0 * ev.acc, ev.loss, exp(ev.loss));
    else
        printf("accuracy    %.2f %%   loss %.4f\n", 100.0 * ev.acc, ev.loss);
    if (tpath[0])
        printf("teacher     %s: accuracy %.2f %%, agreement %.2f %%\n", tpath, 100.0 * tev.acc, 100.0 * agree);
    if (C) {
        printf("confusion   (rows = label, columns = prediction)\n      ");
        for (int j = 0; j < C; j++) printf(" %6d", j);
        printf("\n");
    }
    for (int i = 0; i < C; i++) {
        printf("  %3d ", i);
        for (int j = 0; j < C; j++) printf(" %6lld", (long long)ev.confusion[(size_t)i * C + j]);
        printf("\n");
    }
    printf("attention   (first %d samples)  layer  mean|row sum-1|  mean|col sum-1|  row entropy (uniform)\n",
           ndiag < ds->n ? ndiag : (int)ds->n);
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
                                    ckpt, bk_attn_kind_name(c->attn), ds->version, (long long)ev.n, ev.acc, ev.loss);
        if (*esort) n += (size_t)snprintf(s + n, cap - n, ",\"esp_sort\":\"%s\",\"esp_t\":%s", esort, et);
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
    bk_eval_result_free(&ev);
    bk_eval_result_free(&tev);
    free(dg);
    free(extra);
    bk_model_free(m);
    bk_model_free(tm);
    bk_data_close(dset);
    return rc;
}
