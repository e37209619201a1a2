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
#endif
