/* tcheck.h -- the checks of the dataset and training-run tests
 * (tests/data, tests/train): "ok - NAME" / "not ok - NAME: why" per check,
 * tc_summary() prints "N passed, M failed" and gives the exit status;
 * tc_tmpdir makes a fresh temporary directory. */
#ifndef BK_TCHECK_H
#define BK_TCHECK_H
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tc_pass, tc_fail;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4), unused))
#endif
static int tc_check(int ok, const char *name, const char *fmt, ...)
{
    if (ok) {
        tc_pass++;
        printf("ok - %s\n", name);
        fflush(stdout);
        return 1;
    }
    tc_fail++;
    printf("not ok - %s", name);
    if (fmt && *fmt) {
        va_list ap;
        va_start(ap, fmt);
        printf(": ");
        vprintf(fmt, ap);
        va_end(ap);
    }
    printf("\n");
    fflush(stdout);
    return 0;
}

/* a new directory $TMPDIR/bk-NAME-XXXXXX (else under /tmp) in buf; 1 on
 * success */
#if defined(__GNUC__)
__attribute__((unused))
#endif
static int tc_tmpdir(char *buf, size_t cap, const char *name)
{
    const char *t = getenv("TMPDIR");
    snprintf(buf, cap, "%s/bk-%s-XXXXXX", t && *t ? t : "/tmp", name);
    if (mkdtemp(buf)) return 1;
    perror("mkdtemp");
    return 0;
}

#if defined(__GNUC__)
__attribute__((unused))
#endif
static int tc_summary(void)
{
    printf("%d passed, %d failed\n", tc_pass, tc_fail);
    return tc_fail ? 1 : 0;
}
#endif
