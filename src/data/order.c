/* order.c -- the sample order of the splits and of training epochs
 * (birkhoff/data.h: bk_data_permute, bk_data_epoch_order,
 * bk_data_window_order): Fisher-Yates
 * shuffles on the library's splitmix64 stream. Used by data.c (the splits)
 * and the training loop; it calls nothing of src/data, so that data.c and
 * batch.c (which calls data.c) form no circle. */
#include "../core/internal.h"

#include <stdlib.h>

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

bk_status bk_data_window_order(int64_t *p, int64_t n, uint64_t seed, int epoch, int64_t window)
{
    if (window <= 0 || window >= n) return bk_data_epoch_order(p, n, seed, epoch);
    bki_clear_error();
    if (!p) return bki_fail(BK_ERR_NULL, "bk_data_window_order: p is NULL");
    const int64_t nw = (n + window - 1) / window; /* >= 2 */
    int64_t *w = malloc(sizeof *w * (size_t)nw);
    if (!w) return bki_fail(BK_ERR_NOMEM, "bk_data_window_order: out of memory");
    const uint64_t es = mix(seed ^ (0x5851f42d4c957f2dull * (uint64_t)(epoch + 1)));
    bk_data_permute(w, nw, mix(es ^ 0x77696e646f77ull)); /* the windows' order */
    int64_t at = 0;
    for (int64_t k = 0; k < nw; k++) {
        const int64_t lo = w[k] * window, m = n - lo < window ? n - lo : window;
        bk_data_permute(p + at, m, mix(es + (uint64_t)w[k] * BKI_GOLDEN)); /* the window's samples */
        for (int64_t i = 0; i < m; i++) p[at + i] += lo;
        at += m;
    }
    free(w);
    return BK_OK;
}
