/* swap.c -- plug-and-play swaps of a trained model's attention normaliser:
 * a checkpoint in, the same weights with another attention out, its run
 * carried along (birkhoff/train.h, docs/MODEL.md "Plug-and-play swaps").
 * The model-level mechanism is bk_model_swap (src/nn/model.c); ASAP is
 * bk_asap_compile. */
#include "../nn/nn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bk_swap_config bk_swap_config_default(void)
{
    bk_swap_config c;
    memset(&c, 0, sizeof c);
    c.asap = bk_asap_compile_config_default();
    return c;
}

/* The run text of a swapped checkpoint: the source's position and data lines,
 * swapped_from=<in>, then the run configuration with the new model (NULL when
 * out of memory). */
static char *swapped_extra(const char *extra, const char *in, bk_run_config *r)
{
    size_t n = bk_run_config_format(r, NULL, 0);
    const size_t cap = n + strlen(extra) + strlen(in) + 96;
    char *s = malloc(cap);
    if (!s) return NULL;
    size_t o = 0;
    for (const char *p = extra; *p;) {
        const size_t L = strcspn(p, "\n");
        if (bki_run_meta_line(extra, p)) {
            /* (an old run's test version line, under its name since issue 43) */
            const int old = !strncmp(p, "data_test=", 10);
            if (old) o += (size_t)snprintf(s + o, cap - o, "data_test_version=");
            memcpy(s + o, p + (old ? 10 : 0), L - (old ? 10 : 0));
            o += L - (old ? 10 : 0);
            s[o++] = '\n';
        }
        p += L + (p[L] == '\n');
    }
    o += (size_t)snprintf(s + o, cap - o, "swapped_from=%s\n", in);
    bk_run_config_format(r, s + o, cap - o);
    return s;
}

bk_status bk_checkpoint_swap(const char *in, const char *out, const bk_swap_config *c)
{
    bki_clear_error();
    if (!in || !out || !c) return bki_fail(BK_ERR_NULL, "bk_checkpoint_swap: NULL argument");
    if (!c->attn) return bki_fail(BK_ERR_NULL, "bk_checkpoint_swap: no attention named (attn)");
    bk_model_config target;
    bk_status st = bk_checkpoint_config(in, &target);
    if (st != BK_OK) return st;
    const bk_attn_kind from = target.attn;
    const char *part = c->part ? c->part : "enc";
    const int enc = !strcmp(part, "enc") || !strcmp(part, "both"), cross = !strcmp(part, "cross") || !strcmp(part, "both");
    if (!strcmp(part, "dec") || !strcmp(part, "decoder") || !strcmp(part, "self"))
        return bki_fail(BK_ERR_PARAM,
                        "bk_checkpoint_swap: the decoder's self-attention is causal and stays softmax: no "
                        "doubly-stochastic normaliser has a causal form (the only doubly-stochastic lower-triangular "
                        "matrix is the identity, and column sums over the queries would let a position see later "
                        "ones); swap the encoder (enc) or the cross-attention (cross)");
    if (!enc && !cross)
        return bki_fail(BK_ERR_PARAM, "bk_checkpoint_swap: part '%s': enc, cross or both", part);
    if (cross && target.arch != BK_ARCH_SEQ2SEQ)
        return bki_fail(BK_ERR_PARAM, "bk_checkpoint_swap: part '%s': %s has no cross-attention (not arch=seq2seq)",
                        part, in);
    if (cross && (st = bk_model_config_set(&target, "cross_attn", c->attn)) != BK_OK) return st;
    if (enc && (st = bk_model_config_set(&target, "attn", c->attn)) != BK_OK) return st;
    if (!strcmp(bk_attn_kind_name(target.attn), "asap")) { /* (compiled from a Sinkhorn model's own layers) */
        if (c->keys && *c->keys)
            return bki_fail(BK_ERR_PARAM, "swap to asap: ASAP compiles the checkpoint's own Sinkhorn layers (its "
                                          "attn.iters, attn.eps and scale); keys do not apply (got '%s')",
                            c->keys);
        if (c->nblocks > 0 || c->blocks)
            return bki_fail(BK_ERR_UNSUPPORTED, "swap to asap: every block is compiled (a block list does not apply)");
        if (!strcmp(bk_attn_kind_name(from), "asap"))
            return bki_fail(BK_ERR_PARAM,
                            "%s is a compiled ASAP model already: ASAP is compiled from a Sinkhorn model, its teacher "
                            "(`birkhoff eval --ckpt %s` names it); swap that checkpoint to asap",
                            in, in);
        if (strcmp(bk_attn_kind_name(from), "sinkhorn"))
            return bki_fail(BK_ERR_PARAM,
                            "%s has %s attention: ASAP is compiled from a Sinkhorn model, whose own layers are the "
                            "teacher; swap to sinkhorn first (birkhoff model swap --attn sinkhorn, fine-tune it if "
                            "wanted: birkhoff train --init), then swap that checkpoint to asap",
                            in, bk_attn_kind_name(from));
        return bk_asap_compile(in, out, &c->asap, NULL, NULL);
    }
    if (c->keys && (st = bk_model_config_parse(&target, c->keys)) != BK_OK) return st;
    bk_model *m = NULL, *sw = NULL;
    char *extra = NULL, *ex2 = NULL;
    if ((st = bk_checkpoint_load(in, 1, &m, NULL, &extra)) != BK_OK) return st;
    if ((st = bk_model_swap(m, &target, c->blocks, c->nblocks, 1, &sw)) != BK_OK) goto done;
    if (extra) {
        bk_run_config r;
        if (bk_run_config_from_extra(extra, &r) == BK_OK) {
            /* a training run's checkpoint: its run follows the new model */
            r.model = target;
            if (!(ex2 = swapped_extra(extra, in, &r))) {
                st = bki_fail(BK_ERR_NOMEM, "out of memory");
                goto done;
            }
        }
        bki_clear_error();
    }
    st = bk_checkpoint_save(out, sw, NULL, ex2 ? ex2 : extra);
done:
    free(ex2);
    free(extra);
    bk_model_free(sw);
    bk_model_free(m);
    return st;
}
