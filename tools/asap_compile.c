/* asap_compile.c -- `birkhoff asap compile`: calibrate every Sinkhorn layer
 * of a trained model on unlabelled training inputs and write the model that
 * runs ASAP at inference (docs/TRAINING.md). */
#include "run.h"

#include <stdlib.h>
#include <string.h>

static void usage_compile(FILE *f)
{
    fprintf(f, "usage: birkhoff asap compile --ckpt SINKHORN.safetensors --out ASAP.safetensors [--samples N]\n"
               "                            [--batch B] [--slices L] [--seed S] [--lambda R] [--fit ls|kl]\n"
               "                            [--data-dir DIR]\n"
               "\n"
               "For every block of a model trained with Sinkhorn attention, streams the Q, K of the first N\n"
               "training inputs (default 512; their labels are not used) through the layer's own Sinkhorn\n"
               "teacher (its S, eps and scale), fits the ASAP coefficients (LS by default; KL refines them), and\n"
               "writes a checkpoint of the same weights with attn=asap and the compiled layers. `birkhoff eval`\n"
               "on it reports its accuracy and its agreement with the teacher.\n");
}

int asap_compile(int argc, char **argv)
{
    const char *ckpt = NULL, *out = NULL, *ns = NULL, *bs = NULL, *ls = NULL, *ss = NULL, *lam = NULL, *fit = "ls",
               *dir = NULL;
    const cli_opt opts[] = {{"--ckpt", &ckpt, 0}, {"--out", &out, 0},    {"--samples", &ns, 0},
                            {"--batch", &bs, 0},  {"--slices", &ls, 0},  {"--seed", &ss, 0},
                            {"--lambda", &lam, 0}, {"--fit", &fit, 0},   {"--data-dir", &dir, 0}};
    int done = 0,
        rc0 = cli_parse_opts("asap compile", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), usage_compile, &done);
    if (done || rc0) return rc0;
    int nsamp = 512, batch = 64, slices = 32, seed = 1;
    float lambda = 1e-3f;
    if (!ckpt || !out || (ns && (!cli_parse_int(ns, &nsamp) || nsamp < 1)) ||
        (bs && (!cli_parse_int(bs, &batch) || batch < 1)) || (ls && (!cli_parse_int(ls, &slices) || slices < 1)) ||
        (ss && (!cli_parse_int(ss, &seed) || seed < 0)) || (lam && (!cli_parse_float(lam, &lambda) || lambda < 0)) ||
        (strcmp(fit, "ls") && strcmp(fit, "kl"))) {
        fprintf(stderr, "birkhoff asap compile: needs --ckpt and --out; --samples, --batch, --slices >= 1, --seed >= 0, "
                        "--lambda >= 0, --fit ls|kl\n");
        return CLI_USAGE;
    }
    bk_model *m = NULL, *am = NULL;
    run_config r;
    char *extra = NULL;
    if (!run_load("asap compile", ckpt, batch, &m, &r, &extra)) return CLI_FAIL;
    const bk_model_config *c = bk_model_get_config(m);
    int rc = CLI_FAIL;
    data_set ds = {0};
    run_buf b = {0};
    bk_asap_calib **cal = calloc((size_t)(c->depth > 0 ? c->depth : 1), sizeof *cal);
    char *ex2 = NULL;
    if (!cal) goto done;
    if (c->attn != BK_ATTN_SINKHORN) {
        fprintf(stderr, "birkhoff asap compile: %s uses %s attention; ASAP compiles Sinkhorn attention\n", ckpt,
                run_attn_name(c));
        goto done;
    }
    if (!run_open_data("asap compile", &r, NULL, dir, DATA_TRAIN, nsamp, c, &ds)) goto done;
    bk_asap_config ac = bk_model_asap_config(m);
    ac.slices = slices;
    ac.seed = (uint64_t)seed;
    ac.lambda = lambda;
    for (int l = 0; l < c->depth; l++)
        if (bk_asap_calib_create(&ac, !strcmp(fit, "kl"), &cal[l]) != BK_OK) {
            fprintf(stderr, "birkhoff asap compile: %s\n", bk_last_error());
            goto done;
        }
    if (!run_buf_init(&b, &ds, batch, c->classes)) {
        fprintf(stderr, "birkhoff asap compile: out of memory\n");
        goto done;
    }
    const double t0 = cli_now();
    for (int64_t s = 0; s < ds.n; s += batch) {
        const int B = (int)(ds.n - s < batch ? ds.n - s : batch);
        for (int i = 0; i < B; i++) b.idx[i] = s + i;
        bk_batch bt;
        if (!run_buf_fill(&b, &ds, B, &bt)) {
            fprintf(stderr, "birkhoff asap compile: cannot read the calibration samples\n");
            goto done;
        }
        bt.labels = NULL; /* unlabelled: only the inputs are used */
        if (bk_model_forward(m, &bt, 0, 0.0f, NULL, NULL) != BK_OK) {
            fprintf(stderr, "birkhoff asap compile: %s\n", bk_last_error());
            goto done;
        }
        for (int l = 0; l < c->depth; l++)
            if (bk_model_calib_add(m, l, cal[l]) != BK_OK) {
                fprintf(stderr, "birkhoff asap compile: %s\n", bk_last_error());
                goto done;
            }
    }
    bk_model_config acfg = *c;
    acfg.attn = BK_ATTN_ASAP;
    if (bk_model_create(&acfg, 1, 1, &am) != BK_OK) {
        fprintf(stderr, "birkhoff asap compile: %s\n", bk_last_error());
        goto done;
    }
    memcpy(bk_model_params(am), bk_model_params(m), sizeof(float) * (size_t)bk_model_num_params(m));
    printf("compile  %s: %d layers, %lld calibration inputs of %s, L = %d slices, %s fit\n", ckpt, c->depth,
           (long long)ds.n, ds.version, slices, fit);
    printf("  layer  problems  rows      LS R^2    LS rmse\n");
    for (int l = 0; l < c->depth; l++) {
        bk_asap_layer ly;
        bk_asap_fit_report rep;
        bk_asap_kl_opts ko = bk_asap_kl_opts_default();
        if (bk_asap_calib_fit(cal[l], strcmp(fit, "kl") ? BK_ASAP_FIT_LS : BK_ASAP_FIT_KL, &ko, &ly, &rep) != BK_OK) {
            fprintf(stderr, "birkhoff asap compile: layer %d: %s\n", l, bk_last_error());
            goto done;
        }
        bk_status st = bk_model_set_asap(am, l, &ly);
        bk_asap_layer_free(&ly);
        if (st != BK_OK) {
            fprintf(stderr, "birkhoff asap compile: %s\n", bk_last_error());
            goto done;
        }
        printf("  %5d  %8lld  %8lld  %8.4f  %9.4g\n", l, (long long)rep.problems, (long long)rep.rows, rep.ls_r2,
               rep.ls_rmse);
    }
    {
        /* the run config (attn=asap) and the teacher travel with the model */
        r.model = acfg;
        char *cfg = run_config_format(&r);
        size_t n = (cfg ? strlen(cfg) : 0) + strlen(ckpt) + 512;
        ex2 = cfg ? malloc(n) : NULL;
        if (!ex2) {
            free(cfg);
            fprintf(stderr, "birkhoff asap compile: out of memory\n");
            goto done;
        }
        snprintf(ex2, n, "pos_epoch=0\npos_batch=0\npos_step=0\nteacher=%s\ncalib_samples=%lld\n%s", ckpt,
                 (long long)ds.n, cfg);
        free(cfg);
    }
    if (bk_checkpoint_save(out, am, NULL, ex2) != BK_OK) {
        fprintf(stderr, "birkhoff asap compile: %s\n", bk_last_error());
        goto done;
    }
    printf("wrote    %s (%.1f s); evaluate it with: birkhoff eval --ckpt %s\n", out, cli_now() - t0, out);
    rc = CLI_OK;
done:
    for (int l = 0; cal && l < c->depth; l++) bk_asap_calib_free(cal[l]);
    free(cal);
    free(ex2);
    free(extra);
    run_buf_free(&b);
    data_close(&ds);
    bk_model_free(am);
    bk_model_free(m);
    return rc;
}
