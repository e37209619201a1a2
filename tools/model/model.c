/* model.c -- `birkhoff model`: create, differentiate and train models of
 * the training engine on .npy batches (the interface of the PyTorch parity
 * test), and `birkhoff bench --op train` (training throughput against the
 * PyTorch twin in the same run). */
#include "../cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage_model(FILE *f)
{
    fprintf(f, "usage:\n"
               "  birkhoff model init --config TEXT [--seed S] [--optim TEXT] --out CKPT\n"
               "  birkhoff model grads --ckpt CKPT (--x X.npy | --tokens T.npy) [--len L.npy] --labels Y.npy\n"
               "                       [--ls LS] --out-dir DIR\n"
               "  birkhoff model grads --ckpt CKPT --tokens T.npy [--len L.npy] --tgt TGT.npy --tgt-len TL.npy\n"
               "                       [--ls LS] --out-dir DIR                               (arch=seq2seq)\n"
               "  birkhoff model train --ckpt CKPT (--x X.npy | --tokens T.npy) [--len L.npy] --labels Y.npy\n"
               "                       --steps N [--optim TEXT] [--micro M] [--ls LS] --out CKPT2 [--losses L.npy]\n"
               "  birkhoff model train --ckpt CKPT --tokens T.npy [--len L.npy] --tgt TGT.npy --tgt-len TL.npy\n"
               "                       --steps N [--optim TEXT] [--micro M] [--ls LS] --out CKPT2 [--losses L.npy]\n"
               "  birkhoff model show --ckpt CKPT\n"
               "  birkhoff model swap --in CKPT --out CKPT2 --attn NAME [KEY=VALUE... | --KEY VALUE... | --keys TEXT]\n"
               "                      [--blocks all|i,j,...|enc|cross|both] [--samples N] [--data-dir DIR]\n"
               "\n"
               "TEXT is \"key=value,...\" (docs/MODEL.md lists the keys; model keys as bk_model_config, optimiser\n"
               "keys kind=adamw|adam|sgd, lr, beta1, beta2, eps, weight_decay, momentum, nesterov, clip,\n"
               "sched=constant|step|cosine|invsqrt, warmup, total_steps, lr_min, gamma, milestones=a:b).\n"
               "X: images float32 [B,C,H,W] or points [B,max_points,point_dim]; T int32 [B,max_len]; L, Y int32 [B].\n"
               "An encoder-decoder (arch=seq2seq) reads source tokens T (lengths L) and, instead of labels, the\n"
               "targets: TGT int32 [B,tgt_max_len] (each sentence ending with eos) and their lengths TL int32 [B]\n"
               "(EOS counted); its loss is the mean over the valid target tokens.\n"
               "grads writes DIR/logits.npy [B,classes] (seq2seq: [B,tgt_max_len,vocab], rows at t >= TL zero),\n"
               "DIR/loss.npy [1] and DIR/grads.safetensors (a checkpoint-format file whose tensors hold the\n"
               "gradients of one training-mode forward/backward).\n"
               "train runs N optimiser steps on the same batch (--micro M: micro-batches of M samples, weighted by\n"
               "their samples, seq2seq by their target tokens); --losses gets the loss before each step.\n"
               "swap replaces the attention normaliser of a trained model (any model operator: softmax, sinkhorn,\n"
               "unbalanced, esp, lot, diff, ...; asap) and keeps every weight: KEYs are the new normaliser's (attn.KEY,\n"
               "its operator's parameters as `birkhoff attn --op NAME --help` lists them, e.g. attn.iters, attn.eps;\n"
               "the old sk_*, esp_*, lot_* keys convert; attn_scale, cls_attn, pol_ps, pol_po, pma_attn and\n"
               "pma_attn.KEY: the PMA pooling's);\n"
               "a swap to lot creates the pivots (the model's own LOT initialisation), away from lot drops them;\n"
               "asap compiles the Sinkhorn layers of a Sinkhorn run (--samples calibration inputs, default 512).\n"
               "The blocks of a classifier share one attention kind: --blocks must name all of them. An\n"
               "encoder-decoder swaps its encoder's self-attention (--blocks enc, the default), its cross-attention\n"
               "(cross) or both; its decoder's causal self-attention stays softmax. The run of a `birkhoff train` checkpoint is carried:\n"
               "the result evaluates with `birkhoff eval` and fine-tunes with `birkhoff train --init CKPT2`\n"
               "(docs/MODEL.md, Plug-and-play swaps).\n");
}

typedef struct {
    bk_npy x, tok, len, lab, tgt, tgt_len;
    bk_batch b;
} cli_batch;

static void batch_release(cli_batch *cb)
{
    bk_npy_free(&cb->x);
    bk_npy_free(&cb->tok);
    bk_npy_free(&cb->len);
    bk_npy_free(&cb->lab);
    bk_npy_free(&cb->tgt);
    bk_npy_free(&cb->tgt_len);
}

/* loads the batch files and checks their shapes against the model: the
 * labels (yp) for a classifier, the targets (gp, glp) for a seq2seq model */
static int load_batch(const char *prog, const bk_model_config *c, const char *xp, const char *tp, const char *lp,
                      const char *yp, const char *gp, const char *glp, cli_batch *cb)
{
    memset(cb, 0, sizeof *cb);
    int64_t B = -1;
    const int s2s = c->arch == BK_ARCH_SEQ2SEQ;
    if (s2s) {
        if (yp) {
            fprintf(stderr, "birkhoff %s: this is an encoder-decoder (arch=seq2seq) model: it reads targets, not labels; "
                            "give --tgt TGT.npy and --tgt-len TL.npy instead of --labels\n", prog);
            return 0;
        }
        if (!gp || !glp) {
            fprintf(stderr, "birkhoff %s: this is an encoder-decoder (arch=seq2seq) model: give both --tgt TGT.npy "
                            "(int32 [B, %d]) and --tgt-len TL.npy (int32 [B])\n", prog, c->tgt_max_len);
            return 0;
        }
    } else {
        if (gp || glp) {
            fprintf(stderr, "birkhoff %s: --tgt and --tgt-len are for encoder-decoder (arch=seq2seq) models; this "
                            "classifier reads --labels\n", prog);
            return 0;
        }
        if (!yp) {
            fprintf(stderr, "birkhoff %s: --labels Y.npy is required\n", prog);
            return 0;
        }
    }
    if (c->input == BK_INPUT_TOKENS) {
        if (!tp) {
            fprintf(stderr, "birkhoff %s: this model reads tokens: give --tokens T.npy\n", prog);
            return 0;
        }
        if (bk_npy_read(tp, &cb->tok) != BK_OK) {
            fprintf(stderr, "birkhoff %s: %s\n", prog, bk_last_error());
            return 0;
        }
        if (cb->tok.dtype != BK_I32 || cb->tok.ndim != 2 || cb->tok.shape[1] != c->max_len || cb->tok.shape[0] < 1) {
            fprintf(stderr, "birkhoff %s: --tokens (%s) must be int32 [B, %d]\n", prog, tp, c->max_len);
            return 0;
        }
        B = cb->tok.shape[0];
        cb->b.tokens = cb->tok.data;
    } else {
        if (!xp) {
            fprintf(stderr, "birkhoff %s: this model reads %s: give --x X.npy\n", prog,
                    c->input == BK_INPUT_IMAGE ? "images" : "points");
            return 0;
        }
        int nd = c->input == BK_INPUT_IMAGE ? 4 : 3;
        if (!cli_load_f32(prog, "--x", xp, nd, &cb->x)) return 0;
        const int64_t *s = cb->x.shape;
        int ok = c->input == BK_INPUT_IMAGE
                     ? s[1] == c->channels && s[2] == c->image_h && s[3] == c->image_w
                     : s[1] == c->max_points && s[2] == c->point_dim;
        if (!ok) {
            if (c->input == BK_INPUT_IMAGE)
                fprintf(stderr, "birkhoff %s: --x (%s) must be [B, %d, %d, %d]\n", prog, xp, c->channels, c->image_h,
                        c->image_w);
            else
                fprintf(stderr, "birkhoff %s: --x (%s) must be [B, %d, %d]\n", prog, xp, c->max_points, c->point_dim);
            return 0;
        }
        B = s[0];
        cb->b.x = cb->x.data;
    }
    if (B > 1 << 20) {
        fprintf(stderr, "birkhoff %s: batch of %lld too large\n", prog, (long long)B);
        return 0;
    }
    cb->b.B = (int)B;
    if (lp) {
        if (!cli_load_len(prog, "--len", lp, B, &cb->len)) return 0;
        cb->b.len = cb->len.data;
    }
    if (yp) {
        if (!cli_load_len(prog, "--labels", yp, B, &cb->lab)) return 0;
        cb->b.labels = cb->lab.data;
    }
    if (s2s) {
        if (bk_npy_read(gp, &cb->tgt) != BK_OK) {
            fprintf(stderr, "birkhoff %s: %s\n", prog, bk_last_error());
            return 0;
        }
        if (cb->tgt.dtype != BK_I32 || cb->tgt.ndim != 2 || cb->tgt.shape[0] != B ||
            cb->tgt.shape[1] != c->tgt_max_len) {
            fprintf(stderr, "birkhoff %s: --tgt (%s) must be int32 [%lld, %d] (B, tgt_max_len)\n", prog, gp,
                    (long long)B, c->tgt_max_len);
            return 0;
        }
        cb->b.tgt = cb->tgt.data;
        if (!cli_load_len(prog, "--tgt-len", glp, B, &cb->tgt_len)) return 0;
        cb->b.tgt_len = cb->tgt_len.data;
    }
    return 1;
}

static int fail(const char *prog, const char *what)
{
    fprintf(stderr, "birkhoff %s: %s: %s\n", prog, what, bk_last_error());
    return CLI_FAIL;
}

static int model_init(int argc, char **argv)
{
    const char *cfg = NULL, *seed = "0", *optim = NULL, *out = NULL;
    cli_opt o[] = {{"--config", &cfg, 0}, {"--seed", &seed, 0}, {"--optim", &optim, 0}, {"--out", &out, 0}};
    int done = 0, rc = cli_parse_opts("model init", argc, argv, o, 4, usage_model, &done);
    if (rc || done) return rc;
    if (!out) {
        fprintf(stderr, "birkhoff model init: --out is required\n");
        return CLI_USAGE;
    }
    uint64_t sd;
    if (!cli_parse_u64(seed, &sd)) {
        fprintf(stderr, "birkhoff model init: --seed must be an integer in [0, 18446744073709551615], got '%s'\n", seed);
        return CLI_USAGE;
    }
    bk_model_config c = bk_model_config_default();
    if (cfg && bk_model_config_parse(&c, cfg)) return fprintf(stderr, "birkhoff model init: %s\n", bk_last_error()), CLI_USAGE;
    bk_model *m = NULL;
    bk_optim *op = NULL;
    if (bk_model_create(&c, sd, 1, &m)) return fprintf(stderr, "birkhoff model init: %s\n", bk_last_error()), CLI_USAGE;
    int ret = CLI_OK;
    if (optim) {
        bk_optim_config oc = bk_optim_config_default();
        if (bk_optim_config_parse(&oc, optim) || bk_optim_create(&oc, m, &op)) {
            fprintf(stderr, "birkhoff model init: %s\n", bk_last_error());
            ret = CLI_USAGE;
        }
    }
    if (!ret && bk_checkpoint_save(out, m, op, NULL)) ret = fail("model init", out);
    if (!ret) printf("%s: %lld parameters in %d tensors\n", out, (long long)bk_model_num_params(m), bk_model_param_count(m));
    bk_optim_free(op);
    bk_model_free(m);
    return ret;
}

static int model_grads(int argc, char **argv)
{
    const char *ck = NULL, *xp = NULL, *tp = NULL, *lp = NULL, *yp = NULL, *lsp = "0", *dir = NULL, *gp = NULL,
               *glp = NULL;
    cli_opt o[] = {{"--ckpt", &ck, 0},   {"--x", &xp, 0},   {"--tokens", &tp, 0},  {"--len", &lp, 0},
                   {"--labels", &yp, 0}, {"--ls", &lsp, 0}, {"--out-dir", &dir, 0}, {"--tgt", &gp, 0},
                   {"--tgt-len", &glp, 0}};
    int done = 0, rc = cli_parse_opts("model grads", argc, argv, o, 9, usage_model, &done);
    if (rc || done) return rc;
    float ls;
    if (!ck || !(yp || gp || glp) || !dir || !cli_parse_float(lsp, &ls)) {
        fprintf(stderr, "birkhoff model grads: --ckpt, --labels (seq2seq: --tgt and --tgt-len), --out-dir (and a "
                        "numeric --ls) are required\n");
        return CLI_USAGE;
    }
    bk_model *m = NULL;
    if (bk_checkpoint_load(ck, 1, &m, NULL, NULL)) return fail("model grads", "loading the checkpoint");
    const bk_model_config *c = bk_model_get_config(m);
    cli_batch cb;
    int ret = CLI_OK;
    if (!load_batch("model grads", c, xp, tp, lp, yp, gp, glp, &cb)) {
        ret = CLI_FAIL;
        goto out;
    }
    bk_model_free(m);
    m = NULL;
    if (bk_checkpoint_load(ck, cb.b.B, &m, NULL, NULL)) {
        ret = fail("model grads", "loading the checkpoint");
        goto out;
    }
    c = bk_model_get_config(m);
    const int B = cb.b.B, s2s = c->arch == BK_ARCH_SEQ2SEQ;
    const int C = s2s ? c->vocab : c->classes, Tt = s2s ? c->tgt_max_len : 1;
    float *logits = malloc(sizeof(float) * (size_t)B * (size_t)Tt * (size_t)C);
    if (!logits) {
        fprintf(stderr, "birkhoff model grads: out of memory\n");
        ret = CLI_FAIL;
        goto out;
    }
    double loss = 0;
    const int train = bk_op_has_backward(bk_op_at(c->attn)); /* (compiled ASAP layers: inference only) */
    if (bk_model_forward(m, &cb.b, train, ls, logits, &loss) || (train && (bk_model_zero_grad(m), bk_model_backward(m, 1.0f)))) {
        ret = fail("model grads", "forward/backward");
        free(logits);
        goto out;
    }
    mkdir(dir, 0777);
    char p1[4096], p2[4096], p3[4096];
    snprintf(p1, sizeof p1, "%s/logits.npy", dir);
    snprintf(p2, sizeof p2, "%s/loss.npy", dir);
    snprintf(p3, sizeof p3, "%s/grads.safetensors", dir);
    float lossf = (float)loss;
    int64_t s1[3] = {B, s2s ? Tt : C, C}, s2[1] = {1};
    /* files named by the command inside the directory the user named: a symlink there is replaced */
    cli_output outs[2] = {{p1, s2s ? 3 : 2, s1, logits}, {p2, 1, s2, &lossf}};
    bk_outset *set = bk_outset_create(); /* the three files, all or none */
    if (!set || !cli_stage_outputs("model grads", set, BK_OUT_NOFOLLOW, 2, outs)) ret = CLI_FAIL;
    if (!ret && train) {
        /* the gradients in the checkpoint layout: swap them into the parameter buffer for the write */
        const int64_t P = bk_model_num_params(m);
        float *w = bk_model_params(m), *g = bk_model_grads(m), *keep = malloc(sizeof(float) * (size_t)P);
        if (!keep) {
            fprintf(stderr, "birkhoff model grads: out of memory\n");
            ret = CLI_FAIL;
        } else {
            memcpy(keep, w, sizeof(float) * (size_t)P);
            memcpy(w, g, sizeof(float) * (size_t)P);
            if (bk_checkpoint_stage(set, p3, BK_OUT_NOFOLLOW, m, NULL, "content=gradients\n")) ret = fail("model grads", p3);
            memcpy(w, keep, sizeof(float) * (size_t)P);
            free(keep);
        }
    }
    if (!ret && !cli_commit("model grads", set)) ret = CLI_FAIL;
    bk_outset_free(set);
    if (!ret) printf("loss %.9g\n", loss);
    free(logits);
out:
    batch_release(&cb);
    bk_model_free(m);
    return ret;
}

static int model_train(int argc, char **argv)
{
    const char *ck = NULL, *xp = NULL, *tp = NULL, *lp = NULL, *yp = NULL, *lsp = "0", *out = NULL, *sp = NULL,
               *optim = NULL, *mp = "0", *lossp = NULL, *gp = NULL, *glp = NULL;
    cli_opt o[] = {{"--ckpt", &ck, 0},     {"--x", &xp, 0},     {"--tokens", &tp, 0},   {"--len", &lp, 0},
                   {"--labels", &yp, 0},   {"--ls", &lsp, 0},   {"--out", &out, 0},     {"--steps", &sp, 0},
                   {"--optim", &optim, 0}, {"--micro", &mp, 0}, {"--losses", &lossp, 0}, {"--tgt", &gp, 0},
                   {"--tgt-len", &glp, 0}};
    int done = 0, rc = cli_parse_opts("model train", argc, argv, o, 13, usage_model, &done);
    if (rc || done) return rc;
    float ls;
    int steps, micro;
    if (!ck || !(yp || gp || glp) || !out || !sp || !cli_parse_int(sp, &steps) || steps < 1) {
        fprintf(stderr, "birkhoff model train: --ckpt, --labels (seq2seq: --tgt and --tgt-len), --out and --steps N "
                        ">= 1 are required\n");
        return CLI_USAGE;
    }
    if (!cli_parse_int(mp, &micro) || micro < 0) {
        fprintf(stderr, "birkhoff model train: --micro must be an integer in [0, 2147483647] (0: the whole batch), got "
                        "'%s'\n", mp);
        return CLI_USAGE;
    }
    if (!cli_parse_float(lsp, &ls)) {
        fprintf(stderr, "birkhoff model train: --ls must be a finite number, got '%s'\n", lsp);
        return CLI_USAGE;
    }
    bk_model *m = NULL;
    bk_optim *op = NULL;
    if (bk_checkpoint_load(ck, 1, &m, NULL, NULL)) return fail("model train", "loading the checkpoint");
    cli_batch cb;
    int ret = CLI_OK;
    double *losses = NULL;
    float *lf = NULL;
    if (!load_batch("model train", bk_model_get_config(m), xp, tp, lp, yp, gp, glp, &cb)) {
        ret = CLI_FAIL;
        goto out;
    }
    bk_model_free(m);
    m = NULL;
    if (bk_checkpoint_load(ck, cb.b.B, &m, &op, NULL)) {
        ret = fail("model train", "loading the checkpoint");
        goto out;
    }
    if (optim || !op) {
        bk_optim_config oc = op ? *bk_optim_get_config(op) : bk_optim_config_default();
        bk_optim_free(op);
        op = NULL;
        if ((optim && bk_optim_config_parse(&oc, optim)) || bk_optim_create(&oc, m, &op)) {
            fprintf(stderr, "birkhoff model train: %s\n", bk_last_error());
            ret = CLI_USAGE;
            goto out;
        }
    }
    losses = malloc(sizeof(double) * (size_t)steps);
    lf = malloc(sizeof(float) * (size_t)steps);
    if (!losses || !lf) {
        fprintf(stderr, "birkhoff model train: out of memory\n");
        ret = CLI_FAIL;
        goto out;
    }
    for (int s = 0; s < steps; s++) {
        if (bk_train_step(m, op, &cb.b, micro, ls, &losses[s], NULL)) {
            fprintf(stderr, "birkhoff model train: step %d: %s\n", s, bk_last_error());
            ret = CLI_FAIL;
            goto out;
        }
        lf[s] = (float)losses[s];
    }
    {
        int64_t sh[1] = {steps};
        cli_output lo[1] = {{lossp, 1, sh, lf}}; /* --losses and --out: all or none */
        bk_outset *set = bk_outset_create();
        int ok = set && cli_stage_outputs("model train", set, 0, 1, lo);
        if (ok && bk_checkpoint_stage(set, out, 0, m, op, NULL)) {
            fail("model train", out);
            ok = 0;
        }
        ok = ok && cli_commit("model train", set);
        bk_outset_free(set);
        if (!ok) {
            ret = CLI_FAIL;
            goto out;
        }
    }
    printf("loss %.6f -> %.6f after %d steps\n", losses[0], losses[steps - 1], steps);
out:
    free(losses);
    free(lf);
    batch_release(&cb);
    bk_optim_free(op);
    bk_model_free(m);
    return ret;
}

static int model_show(int argc, char **argv)
{
    const char *ck = NULL;
    cli_opt o[] = {{"--ckpt", &ck, 0}};
    int done = 0, rc = cli_parse_opts("model show", argc, argv, o, 1, usage_model, &done);
    if (rc || done) return rc;
    if (!ck) {
        fprintf(stderr, "birkhoff model show: --ckpt is required\n");
        return CLI_USAGE;
    }
    bk_model *m = NULL;
    bk_optim *op = NULL;
    if (bk_checkpoint_load(ck, 1, &m, &op, NULL)) return fail("model show", "loading the checkpoint");
    char buf[4096];
    bk_model_config_format(bk_model_get_config(m), buf, sizeof buf);
    printf("%s", buf);
    printf("# %lld parameters, %d tensors, %d tokens per sample\n", (long long)bk_model_num_params(m),
           bk_model_param_count(m), bk_model_tokens(m));
    for (int i = 0; i < bk_model_param_count(m); i++) {
        bk_param_info pi;
        bk_model_param(m, i, &pi);
        printf("#   %-32s [", pi.name);
        for (int d = 0; d < pi.ndim; d++) printf(d ? ", %lld" : "%lld", (long long)pi.shape[d]);
        printf("]%s\n", pi.decay ? " decay" : "");
    }
    if (op) printf("# optimiser at step %lld\n", (long long)bk_optim_step_count(op));
    bk_optim_free(op);
    bk_model_free(m);
    return CLI_OK;
}

/* "all" (NULL list) or "i,j,..." block indices into out (room for max) */
static int parse_blocks(const char *s, int *out, int max, int *n)
{
    *n = 0;
    if (!strcmp(s, "all")) return 1;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 1 << 20 || *n >= max || (*end && *end != ',')) return 0;
        out[(*n)++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return *n > 0;
}

/* what a swap from kind a to kind b did to the blocks' own tensors */
static const char *swap_note(const char *a, const char *b)
{
    if (!strcmp(a, b)) return "";
    if (!strcmp(b, "lot")) return "; LOT pivots initialised";
    if (!strcmp(a, "lot")) return "; LOT pivots dropped";
    if (!strcmp(b, "diff")) return "; diff lambda vectors initialised";
    if (!strcmp(a, "diff")) return "; diff lambda vectors dropped";
    return !strcmp(b, "asap") ? "; ASAP layers compiled" : "";
}

static int model_swap(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *attn = NULL, *blocks_s = "all", *samples = NULL, *dir = NULL;
    char keys[4096] = "";
    size_t kn = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_model(stdout);
            return CLI_OK;
        }
        const char **dst = !strcmp(a, "--in") ? &in : !strcmp(a, "--out") ? &out : !strcmp(a, "--attn") ? &attn
                           : !strcmp(a, "--blocks") ? &blocks_s : !strcmp(a, "--samples") ? &samples
                           : !strcmp(a, "--data-dir") ? &dir : NULL;
        char item[1200];
        if (strncmp(a, "--", 2) != 0) {
            if (!strchr(a, '=')) {
                fprintf(stderr, "birkhoff model swap: unexpected argument '%s' (keys are KEY=VALUE)\n", a);
                return CLI_USAGE;
            }
            snprintf(item, sizeof item, "%s", a);
        } else {
            if (i + 1 >= argc) {
                fprintf(stderr, "birkhoff model swap: %s needs a value\n", a);
                return CLI_USAGE;
            }
            const char *v = argv[++i];
            if (dst) {
                *dst = v;
                continue;
            }
            if (!strcmp(a, "--keys") || !strcmp(a, "--set")) {
                snprintf(item, sizeof item, "%s", v);
            } else { /* --KEY VALUE: a model key */
                snprintf(item, sizeof item, "%s=%s", a + 2, v);
                for (char *c = item; *c && *c != '='; c++)
                    if (*c == '-') *c = '_';
            }
        }
        const size_t L = strlen(item);
        if (kn + L + 2 > sizeof keys) {
            fprintf(stderr, "birkhoff model swap: too many keys\n");
            return CLI_USAGE;
        }
        if (kn) keys[kn++] = ',';
        memcpy(keys + kn, item, L + 1);
        kn += L;
    }
    int blocks[64], nb = 0, ns = 512;
    if (!in || !out || !attn) {
        fprintf(stderr, "birkhoff model swap: --in, --out and --attn are required\n");
        return CLI_USAGE;
    }
    const char *part = NULL; /* an encoder-decoder's attention: enc, cross or both */
    if (strcmp(blocks_s, "all") && (blocks_s[0] < '0' || blocks_s[0] > '9')) { /* a part, checked by the library */
        part = blocks_s;
        blocks_s = "all";
    }
    if (!parse_blocks(blocks_s, blocks, 64, &nb)) {
        fprintf(stderr,
                "birkhoff model swap: --blocks expects 'all', block indices 'i,j,...' or (an encoder-decoder) enc, "
                "cross or both (got '%s')\n",
                blocks_s);
        return CLI_USAGE;
    }
    if (samples && (!cli_parse_int(samples, &ns) || ns < 1)) {
        fprintf(stderr, "birkhoff model swap: --samples must be >= 1\n");
        return CLI_USAGE;
    }
    bk_swap_config sc = bk_swap_config_default();
    sc.attn = attn;
    sc.keys = kn ? keys : NULL;
    sc.blocks = nb ? blocks : NULL;
    sc.nblocks = nb;
    sc.part = part;
    sc.asap.samples = ns;
    sc.asap.data_dir = dir;
    bk_model_config from;
    if (bk_checkpoint_config(in, &from) != BK_OK) return fail("model swap", "loading the checkpoint");
    const bk_status st = bk_checkpoint_swap(in, out, &sc);
    if (st != BK_OK) {
        fprintf(stderr, "birkhoff model swap: %s\n", bk_last_error());
        /* what the request got wrong is a usage error; a file that cannot be
         * read or written is not */
        return st == BK_ERR_PARAM || st == BK_ERR_UNSUPPORTED ? CLI_USAGE : CLI_FAIL;
    }
    bk_model_config to;
    struct stat ost; /* a FIFO or device was written into: nothing to read back */
    if (stat(out, &ost) != 0 || !S_ISREG(ost.st_mode)) {
        printf("%s: %s attention -> %s: %s\n", in, bk_attn_kind_name(from.attn), attn, out);
        return CLI_OK;
    }
    if (bk_checkpoint_config(out, &to) != BK_OK) return fail("model swap", out);
    if (from.arch == BK_ARCH_SEQ2SEQ && to.cross_attn != from.cross_attn)
        printf("%s: cross-attention %s -> %s\n", in, bk_attn_kind_name(from.cross_attn), bk_attn_kind_name(to.cross_attn));
    printf("%s: %s%s attention -> %s: %s (every weight kept%s)\n", in,
           from.arch == BK_ARCH_SEQ2SEQ ? "encoder " : "", bk_attn_kind_name(from.attn), bk_attn_kind_name(to.attn), out,
           swap_note(bk_attn_kind_name(from.attn), bk_attn_kind_name(to.attn)));
    return CLI_OK;
}

int cmd_model(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage_model(argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_USAGE : CLI_OK;
    }
    if (!strcmp(argv[1], "init")) return model_init(argc - 1, argv + 1);
    if (!strcmp(argv[1], "grads")) return model_grads(argc - 1, argv + 1);
    if (!strcmp(argv[1], "train")) return model_train(argc - 1, argv + 1);
    if (!strcmp(argv[1], "show")) return model_show(argc - 1, argv + 1);
    if (!strcmp(argv[1], "swap")) return model_swap(argc - 1, argv + 1);
    fprintf(stderr, "birkhoff model: unknown subcommand '%s'\n", argv[1]);
    usage_model(stderr);
    return CLI_USAGE;
}
