/* fuzz_npz.c -- libFuzzer target for the .npz reader: the zip container
 * (src/core/npz.c: bki_zip_list, bki_zip_data), the .npy headers inside
 * (bki_npy_header) and the arrays dataset over the archive (bk_data_open of
 * "npz:FILE", src/data/arrays.c). Invariants: every listed member's data lie
 * inside the input; a member's data (stored: in place; deflated: inflated)
 * have the listed size and CRC-32; a dataset that opens has n >= 1 rows,
 * fills its first and last row with finite floats (images, sets) or ids in
 * [0, vocab) (tokens) and labels in [0, classes); a refusal leaves a
 * message and no dataset. */
#include "birkhoff.h"
#include "../../src/core/internal.h"
#include "fuzz_util.h"

#include <zlib.h>

static void check_members(const uint8_t *data, size_t n)
{
    static bki_zip_member m[BKI_ZIP_MAX_MEMBERS];
    int nm = -1;
    if (bki_zip_list("fuzz.npz", data, n, m, &nm) != BK_OK) {
        FZ_CHECK(bk_last_error()[0] != 0, "npz: list failed without a message");
        return;
    }
    FZ_CHECK(nm >= 0 && nm <= BKI_ZIP_MAX_MEMBERS, "npz: %d members", nm);
    for (int i = 0; i < nm; i++) {
        FZ_CHECK(m[i].offset <= n && m[i].csize <= n - m[i].offset, "npz: member %d outside the input", i);
        FZ_CHECK(m[i].method == 0 || m[i].method == 8, "npz: method %d", m[i].method);
        FZ_CHECK(memchr(m[i].name, 0, sizeof m[i].name) != NULL, "npz: name not terminated");
        const uint8_t *d = NULL;
        void *owned = NULL;
        if (bki_zip_data("fuzz.npz", data, &m[i], 1 << 20, &d, &owned) != BK_OK) {
            FZ_CHECK(!d && !owned, "npz: failed member left data");
            continue;
        }
        if (m[i].method == 0) FZ_CHECK(d == data + m[i].offset && !owned, "npz: stored data not in place");
        else FZ_CHECK(d == owned && d, "npz: deflated data not owned");
        FZ_CHECK((uint32_t)crc32(0, d, (uInt)m[i].usize) == m[i].crc, "npz: CRC accepted wrongly");
        bki_npy_head h;
        if (bki_npy_header("fuzz.npy", d, (size_t)m[i].usize, &h) == BK_OK)
            FZ_CHECK(h.offset <= m[i].usize && h.ndim >= 0 && h.ndim <= 8 && h.count <= BKI_NPY_MAX_COUNT,
                     "npz: header of member %d inconsistent", i);
        free(owned);
    }
}

static void check_dataset(const uint8_t *data, size_t n)
{
    char spec[300];
    snprintf(spec, sizeof spec, "npz:%s", fz_write(0, data, n));
    bk_data_config c = bk_data_config_default();
    c.test_frac = 0;
    bk_dataset *ds = (bk_dataset *)1;
    if (bk_data_open(spec, BK_SPLIT_TRAIN, &c, &ds) != BK_OK) {
        FZ_CHECK(ds == NULL, "npz: failed open left a dataset");
        FZ_CHECK(bk_last_error()[0] != 0, "npz: open failed without a message");
        return;
    }
    const bk_dataset_info *in = bk_data_info(ds);
    FZ_CHECK(in->n >= 1 && in->classes >= 2, "npz: n %lld classes %d", (long long)in->n, in->classes);
    const size_t per = in->kind == BK_INPUT_IMAGE  ? (size_t)in->channels * in->height * in->width
                       : in->kind == BK_INPUT_POINTS ? (size_t)in->points * in->point_dim
                                                     : (size_t)in->max_len;
    FZ_CHECK(per >= 1 && per <= (1u << 20), "npz: sample of %zu values", per);
    float *x = malloc(sizeof(float) * per);
    int32_t *tok = malloc(sizeof(int32_t) * per), len = -1, y = -1;
    for (int k = 0; k < 2; k++) {
        const int64_t i = k ? in->n - 1 : 0;
        FZ_CHECK(bk_data_fill(ds, &i, 1, x, tok, &len, &y) == BK_OK, "npz: fill failed: %s", bk_last_error());
        FZ_CHECK(y >= 0 && y < in->classes, "npz: label %d of %d classes", y, in->classes);
        for (size_t j = 0; j < per; j++) {
            if (in->kind == BK_INPUT_TOKENS) FZ_CHECK(tok[j] >= 0 && tok[j] < in->vocab, "npz: id %d", tok[j]);
            else FZ_CHECK(isfinite(x[j]), "npz: non-finite input");
        }
        if (in->kind != BK_INPUT_IMAGE)
            FZ_CHECK(len >= 1 && len <= (in->kind == BK_INPUT_TOKENS ? in->max_len : in->points), "npz: len %d", len);
    }
    free(x);
    free(tok);
    bk_data_close(ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    check_members(data, n);
    check_dataset(data, n);
    return 0;
}
