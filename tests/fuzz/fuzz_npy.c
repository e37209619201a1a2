/* fuzz_npy.c -- libFuzzer target for the .npy header parser over memory
 * (bki_npy_header: float32, int32, int64 and uint8, what the arrays datasets
 * read) and for bk_npy_read (src/core/npy.c), which uses it: the input is
 * parsed in memory, then written to a file and read. Header invariants: a
 * known dtype and its size, ndim in [0, 8], count = the shape's product
 * (<= 2^40), bytes = count * size, the data offset inside the input; a
 * refusal leaves a message and a zeroed header; bk_npy_read succeeds only
 * when the header parses. Invariants of bk_npy_read on success: dtype float32 or
 * int32, ndim in [0, 8], dimensions >= 0, the file is exactly the preamble,
 * the header and 4 * count data bytes, and the data are the file's last
 * bytes; writing the array with bk_npy_write and reading it back gives the
 * same dtype, shape and bytes. */
#include "birkhoff.h"
#include "../../src/core/internal.h"
#include "fuzz_util.h"

static int header_ok(const uint8_t *data, size_t n)
{
    bki_npy_head h;
    if (bki_npy_header("fuzz.npy", data, n, &h) != BK_OK) {
        FZ_CHECK(bk_last_error()[0] != 0, "npy header: failed without a message");
        FZ_CHECK(h.count == 0 && h.ndim == 0 && h.offset == 0, "npy header: not zeroed on failure");
        return 0;
    }
    static const int size[4] = {4, 4, 8, 1}; /* F32, I32, I64, U8 */
    FZ_CHECK(h.dtype >= BKI_NPY_F32 && h.dtype <= BKI_NPY_U8 && h.esize == size[h.dtype], "npy header: dtype %d size %d",
             (int)h.dtype, h.esize);
    FZ_CHECK(h.ndim >= 0 && h.ndim <= 8 && h.offset <= n, "npy header: ndim %d offset %zu of %zu", h.ndim, h.offset, n);
    int64_t c = 1;
    for (int i = 0; i < h.ndim; i++) c *= h.shape[i];
    FZ_CHECK(c == h.count && c <= BKI_NPY_MAX_COUNT && h.bytes == (uint64_t)c * (uint64_t)h.esize,
             "npy header: count %lld, bytes %llu", (long long)h.count, (unsigned long long)h.bytes);
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    const int hdr = header_ok(data, n);
    bk_npy a;
    memset(&a, 0x5a, sizeof a);
    if (bk_npy_read(fz_write(0, data, n), &a) != BK_OK) {
        FZ_CHECK(a.data == NULL, "npy: failed but left data allocated");
        FZ_CHECK(bk_last_error()[0] != 0, "npy: failed without a message");
        return 0;
    }
    FZ_CHECK(hdr, "npy: bk_npy_read accepted a header bki_npy_header refuses");
    FZ_CHECK(a.dtype == BK_F32 || a.dtype == BK_I32, "npy: dtype %d", (int)a.dtype);
    FZ_CHECK(a.ndim >= 0 && a.ndim <= 8, "npy: ndim %d", a.ndim);
    unsigned __int128 count = 1;
    for (int i = 0; i < a.ndim; i++) {
        FZ_CHECK(a.shape[i] >= 0, "npy: dimension %d is %lld", i, (long long)a.shape[i]);
        count *= (uint64_t)a.shape[i];
    }
    FZ_CHECK(count == (unsigned __int128)bk_npy_count(&a), "npy: bk_npy_count disagrees with the shape");
    FZ_CHECK(n >= 10 && memcmp(data, "\x93NUMPY", 6) == 0, "npy: accepted a bad magic");
    const size_t pre = data[6] == 1 ? 10 : 12;
    const size_t hlen = data[6] == 1 ? (size_t)data[8] | (size_t)data[9] << 8
                                     : (size_t)data[8] | (size_t)data[9] << 8 | (size_t)data[10] << 16 |
                                           (size_t)data[11] << 24;
    FZ_CHECK(count * 4 + pre + hlen == n, "npy: %zu-byte file, preamble %zu + header %zu + data %llu", n, pre, hlen,
             (unsigned long long)count * 4);
    const size_t bytes = (size_t)count * 4;
    FZ_CHECK(a.data != NULL, "npy: no data pointer");
    FZ_CHECK(memcmp(a.data, data + n - bytes, bytes) == 0, "npy: data differ from the file's last bytes");

    /* write and read back */
    const char *path = fz_tmp(1);
    FZ_CHECK(bk_npy_write(path, a.dtype, a.ndim, a.shape, a.data) == BK_OK, "npy: cannot write back: %s",
             bk_last_error());
    bk_npy b;
    FZ_CHECK(bk_npy_read(path, &b) == BK_OK, "npy: the written array does not read back: %s", bk_last_error());
    FZ_CHECK(b.dtype == a.dtype && b.ndim == a.ndim, "npy: round trip changed dtype or ndim");
    for (int i = 0; i < a.ndim; i++) FZ_CHECK(b.shape[i] == a.shape[i], "npy: round trip changed dimension %d", i);
    FZ_CHECK(memcmp(a.data, b.data, bytes) == 0, "npy: round trip changed the data");
    bk_npy_free(&b);
    bk_npy_free(&a);
    return 0;
}
