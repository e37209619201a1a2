/* ref_selftest_util.h -- helpers shared by the double-precision references'
 * self-tests (tests/ops/ref_*_selftest.c): their checks go through the one
 * test harness (tests/harness.h: th_check, th_summary) with th_report for a
 * detail already formatted; a seeded 64-bit LCG (their inputs), allocation
 * and max-error helpers. */
#ifndef BK_REF_SELFTEST_UTIL_H
#define BK_REF_SELFTEST_UTIL_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../harness.h"

/* one check whose detail is already formatted */
static inline void th_report(int ok, const char *name, const char *detail) { th_check(ok, name, "%s", detail); }

/* 64-bit LCG (Knuth MMIX constants); uniform in [lo, hi). */
typedef struct {
    uint64_t s;
} lcg;

static inline double lcg_uniform(lcg *g, double lo, double hi)
{
    g->s = g->s * 6364136223846793005ULL + 1442695040888963407ULL;
    double u = (double)(g->s >> 11) * (1.0 / 9007199254740992.0); /* 2^-53 */
    return lo + (hi - lo) * u;
}

static inline void fill(lcg *g, double *x, size_t count, double lo, double hi)
{
    for (size_t i = 0; i < count; i++) x[i] = lcg_uniform(g, lo, hi);
}

static inline double *dalloc(size_t count)
{
    double *p = malloc((count > 0 ? count : 1) * sizeof(double));
    if (p == NULL) {
        fprintf(stderr, "selftest: out of memory\n");
        exit(1);
    }
    return p;
}

static inline double max_abs_diff(const double *a, const double *b, size_t count)
{
    double e = 0.0;
    for (size_t i = 0; i < count; i++) {
        double t = fabs(a[i] - b[i]);
        if (!(t <= e)) e = t; /* NaN propagates */
    }
    return e;
}

static inline double max_abs(const double *a, size_t count)
{
    double e = 0.0;
    for (size_t i = 0; i < count; i++)
        if (!(fabs(a[i]) <= e)) e = fabs(a[i]);
    return e;
}
#endif
