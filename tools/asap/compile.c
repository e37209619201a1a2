/* compile.c -- `birkhoff asap compile`: arguments and the report of the
 * library's compilation of a trained Sinkhorn model into an ASAP model
 * (bk_asap_compile; docs/TRAINING.md). */
#include "../cli.h"

#include <stdlib.h>
#include <string.h>

static void usage_compile(FILE *f)
{
    fprintf(f, "usage: birkhoff asap compile --ckpt SINKHORN.safetensors --out ASAP.safetensors [--samples N]\n"
               "                            [--batch B] [--slices L] [--seed S] [--lambda R] [--fit ls|kl]\n"
               "                            [--data-dir DIR] [--ending auto|zero|column|row]\n"
               "\n"
               "For every block of a model trained with Sinkhorn attention, streams the Q, K of the first N\n"
               "training inputs (default 512; their labels are not used) through the layer's own Sinkhorn\n"
               "teacher (its S, eps and scale), fits the ASAP coefficients (LS by default; KL refines them), and\n"
               "writes a checkpoint of the same weights with attn=asap and the compiled layers. `birkhoff eval`\n"
               "on it reports its accuracy and its agreement with the teacher. --ending records the online\n"
               "operator's ending (asap_ending; auto: the teacher's, row for odd S and column for even S; zero:\n"
               "ASAP-0); the fit does not depend on it, and `birkhoff eval --asap-ending` changes it.\n");
}

/* what the report names */
typedef struct {
    const char *ckpt, *fit;
    int slices;
} compile_report;

static void on_compile(void *user, const bk_asap_compile_event *ev)
{
    const compile_report *c = user;
    if (ev->layer < 0) {
        printf("compile  %s: %d layers, %lld calibration inputs of %s, L = %d slices, %s fit\n", c->ckpt, ev->layers,
               (long long)ev->samples, ev->data_version, c->slices, c->fit);
        printf("  layer  problems  rows      LS R^2    LS rmse\n");
        return;
    }
    const bk_asap_fit_report *rep = ev->report;
    printf("  %5d  %8lld  %8lld  %8.4f  %9.4g\n", ev->layer, (long long)rep->problems, (long long)rep->rows, rep->ls_r2,
           rep->ls_rmse);
}

int asap_compile(int argc, char **argv)
{
    const char *ckpt = NULL, *out = NULL, *ns = NULL, *bs = NULL, *ls = NULL, *ss = NULL, *lam = NULL, *fit = "ls",
               *dir = NULL, *ending = "auto";
    const cli_opt opts[] = {{"--ckpt", &ckpt, 0}, {"--out", &out, 0},    {"--samples", &ns, 0},
                            {"--batch", &bs, 0},  {"--slices", &ls, 0},  {"--seed", &ss, 0},
                            {"--lambda", &lam, 0}, {"--fit", &fit, 0},   {"--data-dir", &dir, 0},
                            {"--ending", &ending, 0}};
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
    static const char *const ENDINGS[] = {"auto", "zero", "column", "row"};
    int end = -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(ending, ENDINGS[i])) end = i;
    if (end < 0) {
        fprintf(stderr, "birkhoff asap compile: --ending auto|zero|column|row (got '%s')\n", ending);
        return CLI_USAGE;
    }
    bk_asap_compile_config cc = bk_asap_compile_config_default();
    cc.ending = (bk_asap_variant)end;
    cc.samples = nsamp;
    cc.batch = batch;
    cc.slices = slices;
    cc.seed = (uint64_t)seed;
    cc.lambda = lambda;
    cc.fit = strcmp(fit, "kl") ? BK_ASAP_FIT_LS : BK_ASAP_FIT_KL;
    cc.data_dir = dir;
    compile_report rep = {ckpt, fit, slices};
    const double t0 = cli_now();
    if (bk_asap_compile(ckpt, out, &cc, on_compile, &rep) != BK_OK) {
        fprintf(stderr, "birkhoff asap compile: %s\n", bk_last_error());
        return CLI_FAIL;
    }
    printf("wrote    %s (%.1f s); evaluate it with: birkhoff eval --ckpt %s\n", out, cli_now() - t0, out);
    return CLI_OK;
}
