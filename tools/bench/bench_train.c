/* bench_train.c -- `birkhoff bench --op train`: training throughput of a
 * model of the training engine (forward, loss, backward, AdamW step on a
 * fixed random batch) against the same model in PyTorch
 * (bench/peers/model_torch.py --bench) measured in the same run, for one
 * or more attention configurations. */
#include "../cli.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage_bt(FILE *f)
{
    fprintf(f, "usage: birkhoff bench --op train [--config TEXT] [--attn LIST] [--batch B] [--steps N] [--warmup W]\n"
               "                      [--threads T] [--no-peer] [--json] [--python PY] [--peer-script PATH]\n"
               "  TEXT: model keys (docs/MODEL.md); default: the issue's ViT, 28x28x1 images, patch 4, dim 128,\n"
               "  depth 4, 4 heads, mlp 256, 10 classes. LIST: comma-separated attention settings, each a\n"
               "  ';'-separated key=value group added to TEXT (default \"attn=softmax,attn=sinkhorn;sk_iters=5\").\n"
               "  Reports the median step time, samples/s, the GEMM GFLOP/s and fraction of the machine's peak,\n"
               "  and the PyTorch twin's samples/s on the same threads. An encoder-decoder (arch=seq2seq in TEXT)\n"
               "  trains on full-length sentence pairs (max_len source, tgt_max_len target pieces); --json adds\n"
               "  target tokens/s for both.\n");
}

/* forward multiply-adds x 2 of the GEMM-like parts (linears and the two
 * attention products); a training step is counted as 3 forwards */
static double step_flops(const bk_model_config *c, int B, int T, int np)
{
    const double D = c->dim, I = (double)c->heads * (c->head_dim ? c->head_dim : c->dim / c->heads), M = c->mlp_dim;
    const double R = (double)B * T;
    double in_feat = c->input == BK_INPUT_IMAGE ? (double)c->patch * c->patch * c->channels : c->point_dim;
    double f = c->input == BK_INPUT_TOKENS ? 0 : 2.0 * B * np * in_feat * D;
    char r[32] = ""; /* LOT's pivots: its attention is linear in T */
    const int lot = !strcmp(bk_attn_kind_name(c->attn), "lot") && bk_model_config_get(c, "attn.r", r, sizeof r);
    const double attn = lot ? 2.0 * 2.0 * R * atof(r) * I * 2 : 2.0 * 2.0 * B * (double)T * T * I;
    f += c->depth * (2.0 * R * D * 3 * I + 2.0 * R * I * D + 2.0 * 2.0 * R * D * M + attn);
    if (c->arch == BK_ARCH_SEQ2SEQ) {
        /* decoder blocks (self, cross: queries, keys/values of the source
         * rows, the two products; MLP) and the tied output projection */
        const double Td = c->tgt_max_len, Rd = (double)B * Td;
        const double self = 2.0 * Rd * D * 3 * I + 2.0 * Rd * I * D + 2.0 * 2.0 * B * Td * Td * I;
        const double cross = 2.0 * Rd * D * I + 2.0 * R * D * 2 * I + 2.0 * 2.0 * B * Td * T * I + 2.0 * Rd * I * D;
        f += c->dec_depth * (self + cross + 2.0 * 2.0 * Rd * D * M) + 2.0 * Rd * D * c->vocab;
    }
    return 3.0 * f;
}

int bench_train(int argc, char **argv)
{
    const char *cfg = "dim=128,depth=4,heads=4,mlp_dim=256,patch=4", *attn = "attn=softmax,attn=sinkhorn;sk_iters=5";
    const char *bs = "64", *ss = "10", *ws = "2", *ts = NULL, *nopeer = NULL, *json = NULL, *op = NULL;
    const char *py = "/usr/bin/python3", *script = "bench/peers/model_torch.py";
    cli_opt o[] = {{"--op", &op, 0},         {"--config", &cfg, 0},  {"--attn", &attn, 0},  {"--batch", &bs, 0},
                   {"--steps", &ss, 0},      {"--warmup", &ws, 0},   {"--threads", &ts, 0}, {"--no-peer", &nopeer, 1},
                   {"--json", &json, 1},     {"--python", &py, 0},   {"--peer-script", &script, 0}};
    int done = 0, rc = cli_parse_opts("bench", argc, argv, o, 11, usage_bt, &done);
    if (rc || done) return rc;
    int B, steps, warm, nt = bk_get_num_threads();
    if (!cli_parse_int(bs, &B) || B < 1 || !cli_parse_int(ss, &steps) || steps < 1 || !cli_parse_int(ws, &warm) ||
        warm < 0 || (ts && (!cli_parse_int(ts, &nt) || nt < 1 || nt > 4096))) {
        fprintf(stderr, "birkhoff bench: --batch, --steps >= 1, --warmup >= 0 and --threads in [1, 4096] are integers\n");
        return CLI_USAGE;
    }
    bk_set_num_threads(nt);
    double gf = 0, ge = 0;
    cli_peak(nt, &gf, &ge);
    if (!json)
        printf("# training throughput, batch %d, %d threads, machine peak %.0f GFLOP/s\n"
               "# %-28s %10s %10s %9s %8s %12s %9s\n",
               B, nt, gf, "attention", "step ms", "samples/s", "GFLOP/s", "of peak", "torch smp/s", "speed-up");
    double base_ms = 0;
    char *list = strdup(attn);
    if (!list) {
        fprintf(stderr, "birkhoff bench: out of memory\n");
        return CLI_FAIL;
    }
    for (char *save = NULL, *item = strtok_r(list, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char full[2048];
        snprintf(full, sizeof full, "%s,%s", cfg, item);
        for (char *p = full; *p; p++)
            if (*p == ';') *p = ',';
        bk_model_config c = bk_model_config_default();
        bk_model *m = NULL;
        bk_optim *opt = NULL;
        if (bk_model_config_parse(&c, full) || bk_model_create(&c, 1, B, &m)) {
            fprintf(stderr, "birkhoff bench: %s: %s\n", full, bk_last_error());
            free(list);
            return CLI_USAGE;
        }
        bk_optim_config oc = bk_optim_config_default();
        if (bk_optim_create(&oc, m, &opt) != BK_OK) {
            fprintf(stderr, "birkhoff bench: %s: %s\n", full, bk_last_error());
            bk_model_free(m);
            free(list);
            return CLI_FAIL;
        }
        const size_t nin = c.input == BK_INPUT_IMAGE    ? (size_t)B * c.channels * c.image_h * c.image_w
                           : c.input == BK_INPUT_POINTS ? (size_t)B * c.max_points * c.point_dim
                                                        : (size_t)B * c.max_len;
        float *x = malloc(sizeof(float) * nin);
        int32_t *tok = calloc(nin, sizeof(int32_t)), *lab = malloc(sizeof(int32_t) * (size_t)B);
        const int s2s = c.arch == BK_ARCH_SEQ2SEQ;
        int32_t *tgt = s2s ? malloc(sizeof(int32_t) * (size_t)B * c.tgt_max_len) : NULL;
        int32_t *tlen = s2s ? malloc(sizeof(int32_t) * (size_t)B) : NULL;
        double *times = malloc(sizeof(double) * (size_t)steps), loss = 0;
        if (!x || !tok || !lab || !times || (s2s && (!tgt || !tlen))) {
            fprintf(stderr, "birkhoff bench: %s: out of memory (batch %d)\n", full, B);
            free(x), free(tok), free(lab), free(tgt), free(tlen), free(times), free(list);
            bk_optim_free(opt);
            bk_model_free(m);
            return CLI_FAIL;
        }
        cli_fill(x, nin, 7, 1.0f);
        for (int i = 0; i < B; i++) lab[i] = i % (c.classes > 0 ? c.classes : 1);
        for (size_t i = 0; i < nin; i++) tok[i] = (int32_t)(i * 7 % (size_t)c.vocab);
        bk_batch b = {B, x, tok, NULL, lab, NULL, NULL};
        /* an encoder-decoder: full-length sentences on both sides (ids >= 4,
         * EOS last), so the rows are the configuration's */
        if (s2s) {
            for (int i = 0; i < B; i++) {
                for (int t = 0; t < c.max_len; t++)
                    tok[(size_t)i * c.max_len + t] = t == c.max_len - 1 ? c.eos : 4 + (int32_t)((i * 131 + t * 7) % (c.vocab - 4));
                for (int t = 0; t < c.tgt_max_len; t++)
                    tgt[(size_t)i * c.tgt_max_len + t] =
                        t == c.tgt_max_len - 1 ? c.eos : 4 + (int32_t)((i * 37 + t * 11) % (c.vocab - 4));
                tlen[i] = c.tgt_max_len;
            }
            b.labels = NULL;
            b.tgt = tgt;
            b.tgt_len = tlen;
        }
        const double per_sample = s2s ? c.tgt_max_len : 1; /* tokens (target) a sample */
        int ok = 1;
        for (int s = 0; s < warm + steps && ok; s++) {
            double t0 = cli_now();
            ok = bk_train_step(m, opt, &b, 0, 0.0f, &loss, NULL) == BK_OK;
            if (s >= warm) times[s - warm] = cli_now() - t0;
        }
        if (!ok) fprintf(stderr, "birkhoff bench: %s: %s\n", full, bk_last_error());
        double med, q25, q75;
        cli_stats(times, steps, &med, &q25, &q75);
        const int np = bk_model_tokens(m) - (s2s ? 0 : c.cls);
        const double fl = step_flops(&c, B, bk_model_tokens(m), np), gfs = fl / med / 1e9;
        double peer = -1;
        if (!nopeer && access(script, R_OK) == 0) {
            char cmd[4096];
            snprintf(cmd, sizeof cmd,
                     "OMP_NUM_THREADS=%d OPENBLAS_NUM_THREADS=%d '%s' '%s' --bench --config '%s' --batch %d --steps %d "
                     "--warmup %d --threads %d",
                     nt, nt, py, script, full, B, steps < 5 ? steps : 5, warm < 1 ? 1 : warm, nt);
            FILE *pp = popen(cmd, "r");
            char line[4096];
            while (pp && fgets(line, sizeof line, pp))
                if (line[0] == '{') peer = cli_json_num(line, "samples_per_s");
            if (!pp || pclose(pp) != 0) {
                fprintf(stderr, "bench train: the PyTorch peer failed (is python3-torch installed?)\n");
                peer = -1;
            }
        }
        if (base_ms == 0) base_ms = med * 1e3;
        if (json)
            printf("{\"op\": \"train\", \"config\": \"%s\", \"batch\": %d, \"threads\": %d, \"step_median_s\": %.6g, "
                   "\"step_q25_s\": %.6g, \"step_q75_s\": %.6g, \"samples_per_s\": %.2f, \"gemm_gflops\": %.2f, "
                   "\"frac_peak\": %.4f, \"vs_first\": %.4f, \"torch_samples_per_s\": %.2f, \"speedup\": %.3f, "
                   "\"tokens_per_s\": %.1f, \"torch_tokens_per_s\": %.1f, \"loss\": %.5f}\n",
                   full, B, nt, med, q25, q75, B / med, gfs, gf > 0 ? gfs / gf : 0.0, med * 1e3 / base_ms, peer,
                   peer > 0 ? B / med / peer : -1.0, B * per_sample / med, peer > 0 ? peer * per_sample : -1.0, loss);
        else
            printf("  %-28s %10.2f %10.1f %9.1f %7.1f%% %12.1f %8.2fx   (x%.2f the first)\n", item, med * 1e3, B / med,
                   gfs, 100.0 * gfs / gf, peer, peer > 0 ? B / med / peer : 0.0, med * 1e3 / base_ms);
        fflush(stdout);
        free(times);
        free(x);
        free(tok);
        free(lab);
        free(tgt);
        free(tlen);
        bk_optim_free(opt);
        bk_model_free(m);
    }
    free(list);
    return CLI_OK;
}
