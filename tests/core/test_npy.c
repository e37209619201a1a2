/* test_npy.c -- .npy round trip and rejection of malformed files. */
#include "birkhoff.h"
#include "../harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

void test_npy(void)
{
    char path[] = "/tmp/bk_test_npy_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    float data[24];
    for (int i = 0; i < 24; i++) data[i] = (float)i * 0.5f - 3.0f;
    int64_t shape[3] = {2, 3, 4};
    bk_status s = bk_npy_write(path, BK_F32, 3, shape, data);
    bk_npy a;
    bk_status r = bk_npy_read(path, &a);
    th_check(s == BK_OK && r == BK_OK && a.dtype == BK_F32 && a.ndim == 3 && a.shape[0] == 2 && a.shape[1] == 3 &&
                 a.shape[2] == 4 && !memcmp(a.data, data, sizeof data),
             "npy float32 round trip", "%s", bk_last_error());
    bk_npy_free(&a);
    int32_t iv[3] = {1, -2, 3};
    int64_t s1[1] = {3};
    s = bk_npy_write(path, BK_I32, 1, s1, iv);
    r = bk_npy_read(path, &a);
    th_check(s == BK_OK && r == BK_OK && a.dtype == BK_I32 && a.ndim == 1 && a.shape[0] == 3 &&
                 !memcmp(a.data, iv, sizeof iv),
             "npy int32 round trip (1-d)", "%s", bk_last_error());
    bk_npy_free(&a);

    /* read the good file's bytes, then damage them */
    bk_npy_write(path, BK_F32, 3, shape, data);
    FILE *f = fopen(path, "rb");
    unsigned char good[1024];
    size_t n = fread(good, 1, sizeof good, f);
    fclose(f);
    unsigned char bad[1024];
    struct { const char *what; bk_status want; } cases[] = {
        {"bad magic", BK_ERR_FORMAT}, {"truncated data", BK_ERR_FORMAT}, {"float64 dtype", BK_ERR_FORMAT},
        {"fortran order", BK_ERR_FORMAT}, {"trailing bytes", BK_ERR_FORMAT}, {"truncated header", BK_ERR_FORMAT},
        {"malformed shape", BK_ERR_FORMAT},
    };
    for (int k = 0; k < 7; k++) {
        memcpy(bad, good, n);
        size_t len = n;
        char *hdr = (char *)bad + 10;
        switch (k) {
        case 0: bad[1] = 'X'; break;
        case 1: len = n - 5; break;
        case 2: memcpy(strstr(hdr, "<f4"), "<f8", 3); break;
        case 3: memcpy(strstr(hdr, "False"), "True ", 5); break;
        case 4: len = n + 3; bad[n] = bad[n + 1] = bad[n + 2] = 0; break;
        case 5: len = 20; break;
        case 6: memcpy(strstr(hdr, "(2,"), "(x,", 3); break;
        }
        write_bytes(path, bad, len);
        r = bk_npy_read(path, &a);
        char name[64];
        snprintf(name, sizeof name, "npy rejects %s", cases[k].what);
        th_check(r == cases[k].want && a.data == NULL, name, "%s (%s)", bk_status_str(r), bk_last_error());
    }
    r = bk_npy_read("/nonexistent/dir/x.npy", &a);
    th_check(r == BK_ERR_IO, "npy missing file", "%s", bk_last_error());
    s = bk_npy_write("/nonexistent/dir/x.npy", BK_F32, 3, shape, data);
    th_check(s == BK_ERR_IO, "npy write to a missing directory fails cleanly", "%s", bk_last_error());
    remove(path);
}
