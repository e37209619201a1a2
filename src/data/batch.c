/* batch.c -- batch buffers over a dataset (birkhoff/data.h): calls data.c
 * (bk_data_info, bk_data_fill, bk_data_fill_pair); the sample orders are
 * order.c's. */
#include "../core/internal.h"

#include <stdlib.h>
#include <string.h>

bk_status bk_data_batch_init(bk_data_batch *b, const bk_dataset *ds, int cap)
{
    bki_clear_error();
    if (!b || !ds) return bki_fail(BK_ERR_NULL, "bk_data_batch_init: NULL argument");
    memset(b, 0, sizeof *b);
    if (cap < 1) return bki_fail(BK_ERR_SHAPE, "bk_data_batch_init: cap = %d", cap);
    const bk_dataset_info *in = bk_data_info(ds);
    b->cap = cap;
    size_t xs = in->kind == BK_INPUT_IMAGE    ? (size_t)in->channels * in->height * in->width
                : in->kind == BK_INPUT_POINTS ? (size_t)in->points * in->point_dim
                                              : 0;
    if (xs) b->x = malloc(sizeof(float) * xs * (size_t)cap);
    if (in->kind == BK_INPUT_TOKENS) b->tokens = malloc(sizeof(int32_t) * (size_t)in->max_len * (size_t)cap);
    b->len = malloc(sizeof(int32_t) * (size_t)cap);
    if (in->seq2seq) { /* a target instead of a label */
        b->tgt = malloc(sizeof(int32_t) * (size_t)in->tgt_max_len * (size_t)cap);
        b->tgt_len = malloc(sizeof(int32_t) * (size_t)cap);
    } else {
        b->labels = malloc(sizeof(int32_t) * (size_t)cap);
    }
    b->idx = malloc(sizeof(int64_t) * (size_t)cap);
    if ((xs && !b->x) || (in->kind == BK_INPUT_TOKENS && !b->tokens) || !b->len || !b->idx ||
        (in->seq2seq ? !b->tgt || !b->tgt_len : !b->labels)) {
        bk_data_batch_free(b);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    return BK_OK;
}

void bk_data_batch_free(bk_data_batch *b)
{
    if (!b) return;
    free(b->x);
    free(b->tokens);
    free(b->len);
    free(b->labels);
    free(b->idx);
    free(b->tgt);
    free(b->tgt_len);
    memset(b, 0, sizeof *b);
}

bk_status bk_data_batch_fill(bk_data_batch *b, const bk_dataset *ds, int B, bk_batch *out)
{
    bki_clear_error();
    if (!b || !ds || !out) return bki_fail(BK_ERR_NULL, "bk_data_batch_fill: NULL argument");
    if (B < 0 || B > b->cap) return bki_fail(BK_ERR_SHAPE, "bk_data_batch_fill: %d samples, capacity %d", B, b->cap);
    const int s2s = bk_data_info(ds)->seq2seq;
    if (s2s && (!b->tgt || !b->tgt_len))
        return bki_fail(BK_ERR_PARAM, "bk_data_batch_fill: the buffers were not made for this seq2seq dataset");
    bk_status st = s2s ? bk_data_fill_pair(ds, b->idx, B, b->tokens, b->len, b->tgt, b->tgt_len)
                       : bk_data_fill(ds, b->idx, B, b->x, b->tokens, b->len, b->labels);
    if (st != BK_OK) return st;
    out->B = B;
    out->x = b->x;
    out->tokens = b->tokens;
    out->len = bk_data_info(ds)->kind == BK_INPUT_IMAGE ? NULL : b->len;
    out->labels = s2s ? NULL : b->labels;
    out->tgt = s2s ? b->tgt : NULL;
    out->tgt_len = s2s ? b->tgt_len : NULL;
    return BK_OK;
}
