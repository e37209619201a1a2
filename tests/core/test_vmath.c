/* test_vmath.c -- the engine's inline float exp and log (src/core/vexp.h)
 * against libm in double: their stated contracts, max 2 ulp of the correctly
 * rounded value (bki_expf on [-87.3, 88], bki_logf on positive normal
 * floats); bki_logf exhaustively on [1/2, 2) (where its error peaks, near 1)
 * and on every 185th float of the positive normal range. */
#include "../../src/core/vexp.h"
#include "../harness.h"

#include <math.h>
#include <string.h>

static double ulps(float got, double want)
{
    if (want == 0.0) return got == 0.0f ? 0.0 : INFINITY;
    return fabs((double)got - want) / ldexp(1.0, ilogb(want) - 23);
}

static float from_bits(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

void test_vmath(void)
{
    if (TH.filter && !strstr("vmath", TH.filter)) return;
    double worst = 0.0;
    float at = 0.0f;
    long n = 0;
    const uint32_t half = 0x3f000000u, two = 0x40000000u, step = TH.quick ? 7u : 1u;
    for (uint32_t b = half; b < two; b += step, n++) {
        const float x = from_bits(b);
        const double e = ulps(bki_logf(x), log((double)x));
        if (e > worst) worst = e, at = x;
    }
    th_check(worst <= 2.0 && bki_logf(1.0f) == 0.0f, "vmath: bki_logf on [1/2, 2)",
             "max %.3f ulp at %.9g over %ld floats; log(1) = %g", worst, (double)at, n, (double)bki_logf(1.0f));
    worst = 0.0, n = 0;
    for (uint32_t b = 0x00800000u; b < 0x7f800000u; b += 37u * (TH.quick ? 11u : 5u), n++) {
        const float x = from_bits(b);
        const double e = ulps(bki_logf(x), log((double)x));
        if (e > worst) worst = e, at = x;
    }
    th_check(worst <= 2.0, "vmath: bki_logf on positive normal floats", "max %.3f ulp at %.9g over %ld floats", worst,
             (double)at, n);
    th_check(isnan(bki_logf(NAN)) && bki_logf(INFINITY) == INFINITY, "vmath: bki_logf keeps NaN and +inf",
             "log(NaN) = %g, log(inf) = %g", (double)bki_logf(NAN), (double)bki_logf(INFINITY));
    worst = 0.0, n = 0;
    for (float x = -87.3f; x <= 88.0f; x = nextafterf(x, INFINITY) + (TH.quick ? 3e-4f : 3e-5f), n++) {
        const double e = ulps(bki_expf(x), exp((double)x));
        if (e > worst) worst = e, at = x;
    }
    th_check(worst <= 2.0 && bki_expf(-INFINITY) == 0.0f && bki_expf(-100.0f) == 0.0f, "vmath: bki_expf on [-87.3, 88]",
             "max %.3f ulp at %.9g over %ld points; exp(-inf) = %g, exp(-100) = %g", worst, (double)at, n,
             (double)bki_expf(-INFINITY), (double)bki_expf(-100.0f));
}
