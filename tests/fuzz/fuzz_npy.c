/* fuzz_npy.c -- libFuzzer target for bk_npy_read (src/core/npy.c): the input
 * is written to a file and read. Invariants on success: dtype float32 or
 * int32, ndim in [0, 8], dimensions >= 0, the file is exactly the preamble,
 * the header and 4 * count data bytes, and the data are the file's last
 * bytes; writing the array with bk_npy_write and reading it back gives the
 * same dtype, shape and bytes. */
#include "birkhoff.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    bk_npy a;
    memset(&a, 0x5a, sizeof a);
    if (bk_npy_read(fz_write(0, data, n), &a) != BK_OK) {
        FZ_CHECK(a.data == NULL, "npy: failed but left data allocated");
        FZ_CHECK(bk_last_error()[0] != 0, "npy: failed without a message");
        return 0;
    }
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
