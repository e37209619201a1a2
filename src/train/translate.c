/* translate.c -- bk_model_translate: a seq2seq model's encoder, its
 * incremental decoder (src/nn/seq2seq_step.c) and the model-independent
 * beam search (decode.c), one call for a batch of sentences. */
#include "../nn/nn.h"
#include "decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bk_status step_cb(void *ctx, int t, int rows, const int32_t *parent, const int32_t *tok, float *logp)
{
    return bki_s2s_step(ctx, t, rows, parent, tok, logp);
}

bk_status bk_model_translate(bk_model *m, const int32_t *src, int src_stride, const int32_t *src_len, int B,
                             const bk_decode_config *c, int32_t *out, int out_stride, int32_t *out_len, float *score)
{
    if (!m || !src || !src_len || !c || !out || !out_len)
        return bki_fail(BK_ERR_NULL, "bk_model_translate: NULL argument");
    const bk_model_config *mc = bk_model_get_config(m);
    if (mc->arch != BK_ARCH_SEQ2SEQ) return bki_fail(BK_ERR_PARAM, "bk_model_translate: not an arch=seq2seq model");
    if (strcmp(bk_attn_kind_name(mc->cross_attn), "softmax")) /* (the one kind with a step-by-step form) */
        return bki_fail(BK_ERR_PARAM,
                        "bk_model_translate: cross_attn=%s normalises over all target positions at once (its columns "
                        "sum over the queries); it has no step-by-step form. Decode with softmax cross-attention "
                        "(bk_model_swap back), or evaluate it teacher-forced",
                        bk_attn_kind_name(mc->cross_attn));
    if (B < 1 || B > bki_model_max_batch(m))
        return bki_fail(BK_ERR_SHAPE, "bk_model_translate: %d sentences outside [1, max_batch = %d]", B,
                        bki_model_max_batch(m));
    if (c->beam < 1 || c->beam > 1024 || !isfinite(c->len_penalty) || !(c->len_a >= 0.0f) || !isfinite(c->len_a) ||
        c->len_b < 0 || (c->cache != 0 && c->cache != 1))
        return bki_fail(BK_ERR_PARAM, "bk_model_translate: invalid decode configuration (beam %d, len_penalty %g, "
                                      "len_a %g, len_b %d, cache %d)",
                        c->beam, (double)c->len_penalty, (double)c->len_a, c->len_b, c->cache);
    int maxsrc = 0;
    for (int b = 0; b < B; b++) {
        if (src_len[b] < 1 || src_len[b] > mc->max_len)
            return bki_fail(BK_ERR_LENGTH, "bk_model_translate: sentence %d has %d tokens (with its EOS), outside [1, "
                                           "max_len = %d]",
                            b, src_len[b], mc->max_len);
        maxsrc = src_len[b] > maxsrc ? src_len[b] : maxsrc;
        for (int t = 0; t < src_len[b]; t++) {
            const int32_t v = src[(size_t)b * src_stride + t];
            if (v < 0 || v >= mc->vocab)
                return bki_fail(BK_ERR_PARAM, "bk_model_translate: token %d of sentence %d is %d, outside [0, %d)", t,
                                b, v, mc->vocab);
        }
    }
    if (src_stride < maxsrc)
        return bki_fail(BK_ERR_SHAPE, "bk_model_translate: src_stride %d below the longest sentence (%d)", src_stride,
                        maxsrc);
    int *lim = malloc(sizeof(int) * (size_t)B);
    if (!lim) return bki_fail(BK_ERR_NOMEM, "bk_model_translate: out of memory");
    int tmax = 1;
    for (int b = 0; b < B; b++) {
        const double want = floor((double)c->len_a * src_len[b]) + c->len_b;
        lim[b] = want < 1.0 ? 1 : want > mc->tgt_max_len ? mc->tgt_max_len : (int)want;
        tmax = lim[b] > tmax ? lim[b] : tmax;
    }
    bk_status st = BK_OK;
    if (out_stride < tmax - 1) {
        st = bki_fail(BK_ERR_SHAPE, "bk_model_translate: out_stride %d below the longest output (%d)", out_stride,
                      tmax - 1);
        goto done;
    }
    bki_s2s_dec *d = NULL;
    if ((st = bki_s2s_encode(m, src, src_stride, src_len, B)) || (st = bki_s2s_dec_create(m, B, c->beam, tmax, c->cache, &d)))
        goto done;
    const bki_decoder dec = {d, mc->vocab, mc->bos, mc->eos, step_cb};
    st = bki_beam_search(&dec, B, c, lim, out, out_stride, out_len, score);
    bki_s2s_dec_free(d);
done:
    free(lim);
    return st;
}
