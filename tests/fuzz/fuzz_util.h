/* fuzz_util.h -- helpers shared by the libFuzzer targets (tests/fuzz):
 * per-process temporary files for the parsers that take a path, and a
 * loud abort for invariant violations. */
#ifndef BK_FUZZ_UTIL_H
#define BK_FUZZ_UTIL_H
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* An invariant failed: say which and abort, so that libFuzzer saves the
 * input as a crash. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2), noreturn))
#endif
static inline void fz_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\n==fuzz invariant violated== ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}
#define FZ_CHECK(cond, ...)                                                                                            \
    do {                                                                                                               \
        if (!(cond)) fz_fail(__VA_ARGS__);                                                                             \
    } while (0)

/* A temporary file made once per process (slot 0..3) under $TMPDIR or /tmp
 * and removed at exit; returns its path. */
static char fz_paths[4][256];
static inline void fz_cleanup(void)
{
    for (int i = 0; i < 4; i++)
        if (fz_paths[i][0]) unlink(fz_paths[i]);
}
static inline const char *fz_tmp(int slot)
{
    if (!fz_paths[slot][0]) {
        const char *dir = getenv("TMPDIR");
        if (!dir || !*dir) dir = "/tmp";
        snprintf(fz_paths[slot], sizeof fz_paths[slot], "%s/bk-fuzz-%ld-%d-XXXXXX", dir, (long)getpid(), slot);
        int fd = mkstemp(fz_paths[slot]);
        if (fd < 0) fz_fail("mkstemp(%s) failed", fz_paths[slot]);
        close(fd);
        static int registered;
        if (!registered) registered = atexit(fz_cleanup) == 0;
    }
    return fz_paths[slot];
}

/* Writes n bytes to the slot's file (replacing it); returns its path. */
static inline const char *fz_write(int slot, const void *data, size_t n)
{
    const char *path = fz_tmp(slot);
    FILE *f = fopen(path, "wb");
    if (!f) fz_fail("cannot write %s", path);
    if (n && fwrite(data, 1, n, f) != n) fz_fail("short write to %s", path);
    if (fclose(f) != 0) fz_fail("cannot close %s", path);
    return path;
}

/* Reads a whole file (malloc'd, NUL-terminated); *n receives its size. */
static inline char *fz_read(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) fz_fail("cannot read %s", path);
    size_t cap = 4096, len = 0;
    char *s = malloc(cap);
    for (;;) {
        if (!s) fz_fail("out of memory");
        len += fread(s + len, 1, cap - len - 1, f);
        if (len < cap - 1) break;
        cap *= 2;
        s = realloc(s, cap);
    }
    fclose(f);
    s[len] = 0;
    if (n) *n = len;
    return s;
}

/* err must be a NUL-terminated message within its capacity */
static inline void fz_check_err(const char *err, size_t cap, const char *what)
{
    FZ_CHECK(memchr(err, 0, cap) != NULL, "%s: error message not NUL-terminated", what);
    FZ_CHECK(err[0] != 0, "%s: failed without a message", what);
}
/* The reference UTF-8 decoder of the text parsers' targets: the code point
 * at p[0..n) and its length, decoded arithmetically: 0 when
 * the bytes are not the shortest encoding of a scalar value */
static inline size_t fz_utf8_decode(const unsigned char *p, size_t n, uint32_t *cp)
{
    size_t len;
    uint32_t v, min;
    if (p[0] < 0x80) {
        *cp = p[0];
        return 1;
    } else if ((p[0] & 0xE0) == 0xC0) len = 2, v = p[0] & 0x1Fu, min = 0x80;
    else if ((p[0] & 0xF0) == 0xE0) len = 3, v = p[0] & 0x0Fu, min = 0x800;
    else if ((p[0] & 0xF8) == 0xF0) len = 4, v = p[0] & 0x07u, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((p[k] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (p[k] & 0x3Fu);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

#endif
