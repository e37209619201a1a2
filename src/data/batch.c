/* batch.c -- batch buffers over a dataset, and the sample order of the
 * splits and of training epochs (birkhoff/data.h). */
#include "../core/internal.h"

#include <stdlib.h>
#include <string.h>

/* one step of the splitmix64 stream started at x */
static uint64_t mix(uint64_t x) { return bki_mix64_fin(x + BKI_GOLDEN); }

bk_status bk_data_permute(int64_t *p, int64_t n, uint64_t seed)
{
    bki_clear_error();
    if (n < 0) return bki_fail(BK_ERR_SHAPE, "bk_data_permute: n = %lld", (long long)n);
    if (!p && n > 0) return bki_fail(BK_ERR_NULL, "bk_data_permute: p is NULL");
    for (int64_t i = 0; i < n; i++) p[i] = i;
    uint64_t s = seed;
    for (int64_t i = n - 1; i > 0; i--) {
        s = mix(s);
        int64_t j = (int64_t)(s % (uint64_t)(i + 1));
        int64_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    return BK_OK;
}

bk_status bk_data_epoch_order(int64_t *p, int64_t n, uint64_t seed, int epoch)
{
    return bk_data_permute(p, n, mix(seed ^ (0x5851f42d4c957f2dull * (uint64_t)(epoch + 1))));
}

bk_status bk_data_batch_init(bk_data_batch *b, const bk_dataset *ds, int cap)
{
    bki_clear_error();
    if (!b || !ds) return bki_fail(BK_ERR_NULL, "bk_data_batch_init: NULL argument");
    memset(b, 0, sizeof *b);
    if (cap < 1) return bki_fail(BK_ERR_SHAPE, "bk_data_batch_init: cap = %d", cap);
    const bk_dataset_info *in = bk_data_info(ds);
    b->cap = cap;
    size_t xs = in->kind == BK_INPUT_IMAGE    ? (size_t)in->channels * in->height * in->width
                : in->kind == BK_INPUT_POINTS ? (size_t)in->points * 3
                                              : 0;
    if (xs) b->x = malloc(sizeof(float) * xs * (size_t)cap);
    if (in->kind == BK_INPUT_TOKENS) b->tokens = malloc(sizeof(int32_t) * (size_t)in->max_len * (size_t)cap);
    b->len = malloc(sizeof(int32_t) * (size_t)cap);
    b->labels = malloc(sizeof(int32_t) * (size_t)cap);
    b->idx = malloc(sizeof(int64_t) * (size_t)cap);
    if ((xs && !b->x) || (in->kind == BK_INPUT_TOKENS && !b->tokens) || !b->len || !b->labels || !b->idx) {
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
    memset(b, 0, sizeof *b);
}

bk_status bk_data_batch_fill(bk_data_batch *b, const bk_dataset *ds, int B, bk_batch *out)
{
    bki_clear_error();
    if (!b || !ds || !out) return bki_fail(BK_ERR_NULL, "bk_data_batch_fill: NULL argument");
    if (B < 0 || B > b->cap) return bki_fail(BK_ERR_SHAPE, "bk_data_batch_fill: %d samples, capacity %d", B, b->cap);
    bk_status st = bk_data_fill(ds, b->idx, B, b->x, b->tokens, b->len, b->labels);
    if (st != BK_OK) return st;
    out->B = B;
    out->x = b->x;
    out->tokens = b->tokens;
    out->len = bk_data_info(ds)->kind == BK_INPUT_IMAGE ? NULL : b->len;
    out->labels = b->labels;
    return BK_OK;
}
