/* harness.c -- THE test harness (harness.h): named checks, the pass/fail
 * count and the closing line "N passed, N failed", deterministic random
 * numbers, a fresh temporary directory. Linked into build/test_birkhoff and
 * into every separate test program (tests/data, tests/train, tests/tools'
 * test_chart, the references' self-tests in tests/ops). */
#include "harness.h"

#include <birkhoff/core.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>

th_state TH;

int th_check(int ok, const char *name, const char *fmt, ...)
{
    if (ok) TH.passed++;
    else TH.failed++;
    if (!ok || TH.verbose) {
        printf("%s %s", ok ? "ok  " : "FAIL", name);
        if (fmt && *fmt) {
            va_list ap;
            va_start(ap, fmt);
            printf(": ");
            vprintf(fmt, ap);
            va_end(ap);
        }
        printf("\n");
        fflush(stdout);
    }
    return ok;
}

int th_summary(void)
{
    printf("%d passed, %d failed\n", TH.passed, TH.failed);
    fflush(stdout);
    return TH.failed ? 1 : 0;
}

int th_tmpdir(char *buf, size_t cap, const char *name)
{
    const char *t = getenv("TMPDIR");
    snprintf(buf, cap, "%s/bk-%s-XXXXXX", t && *t ? t : "/tmp", name);
    if (mkdtemp(buf)) return 1;
    perror("mkdtemp");
    return 0;
}

uint64_t th_next(th_rng *r) { return bk_splitmix64(&r->s); }
double th_unif(th_rng *r) { return (double)(th_next(r) >> 11) * (1.0 / 9007199254740992.0); }
double th_normal(th_rng *r)
{
    double u = th_unif(r), v = th_unif(r);
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}
