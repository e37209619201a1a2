/* fuzz_idx.c -- libFuzzer target for bk_data_parse_idx (src/data/data.c): the
 * input is an IDX file, parsed for 1 and 3 dimensions (the images and labels
 * of MNIST) and for the dimension count its header claims.
 * Invariants on success: every dimension in [1, 2^24], the dimensions
 * multiply to exactly the bytes after the header, *data is the first byte
 * after the header (inside the buffer), and the header says what was asked. */
#include "birkhoff/data.h"
#include "fuzz_util.h"

static void one(const uint8_t *buf, size_t n, int want)
{
    int64_t dims[256];
    const uint8_t *data = NULL;
    char err[128];
    for (int i = 0; i < 256; i++) dims[i] = -7;
    err[0] = 0;
    int ok = bk_data_parse_idx(buf, n, want, dims, &data) == BK_OK;
    if (!ok) snprintf(err, sizeof err, "%s", bk_last_error());
    if (!ok) {
        fz_check_err(err, sizeof err, "idx");
        return;
    }
    const size_t head = 4 + 4 * (size_t)want;
    FZ_CHECK(n >= head, "idx: accepted %zu bytes, shorter than the %zu-byte header", n, head);
    FZ_CHECK(buf[0] == 0 && buf[1] == 0 && buf[2] == 0x08 && buf[3] == want, "idx: accepted a bad magic number");
    FZ_CHECK(data == buf + head, "idx: data at offset %td, expected %zu", data - buf, head);
    unsigned __int128 total = 1;
    for (int d = 0; d < want; d++) {
        FZ_CHECK(dims[d] >= 1 && dims[d] <= (1 << 24), "idx: dimension %d is %lld", d, (long long)dims[d]);
        const uint32_t be = (uint32_t)buf[4 + 4 * d] << 24 | (uint32_t)buf[5 + 4 * d] << 16 |
                            (uint32_t)buf[6 + 4 * d] << 8 | buf[7 + 4 * d];
        FZ_CHECK((int64_t)be == dims[d], "idx: dimension %d is %lld, the header says %u", d, (long long)dims[d], be);
        total *= (uint64_t)dims[d];
    }
    for (int d = want; d < 256; d++) FZ_CHECK(dims[d] == -7, "idx: wrote dims[%d] beyond want_dims %d", d, want);
    FZ_CHECK(total == n - head, "idx: dimensions multiply to %llu, %zu data bytes", (unsigned long long)total,
             n - head);
    FZ_CHECK(data + total == buf + n, "idx: data does not end at the end of the buffer");
}

int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t n)
{
    one(buf, n, 1);
    one(buf, n, 3);
    if (n >= 4 && buf[3] != 1 && buf[3] != 3) one(buf, n, buf[3]);
    return 0;
}
