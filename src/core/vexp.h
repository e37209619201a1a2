/* vexp.h -- inline float exp, written so that compilers vectorise it inside
 * loops (no calls, no branches, integer tricks on the bit pattern).
 *
 * Method: exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 with ln 2
 * split in two parts (Cody-Waite), exp(r) by a degree-6 minimax polynomial on
 * |r| <= ln2/2, evaluated with FMAs. Max relative error 2 ulp (1.17e-7 measured) on [-87.3, 88]. x below
 * -87.33 (where exp underflows to subnormals) returns 0, -inf included;
 * x above 88 is clamped to exp(88); NaN propagates. */
#ifndef BK_VEXP_H
#define BK_VEXP_H
#include <stdint.h>
#include <string.h>

static inline float bki_expf(float x)
{
    const float lo = -87.33654475f, hi = 88.0f;
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    /* round(x / ln2) by the 1.5 * 2^23 trick: the low mantissa bits of big
     * hold n; exact for |n| < 2^22 under round-to-nearest. */
    const float shifter = 12582912.0f;
    /* explicit fused multiply-adds: ISO C mode does not contract a*b+c */
    float big = __builtin_fmaf(xc, 1.44269504088896341f, shifter);
    float nf = big - shifter;
    float r = __builtin_fmaf(nf, -0.693359375f, xc); /* ln2 high part */
    r = __builtin_fmaf(nf, 2.12194440e-4f, r);       /* ln2 low part  */
    float p = 1.9875691500e-4f;
    p = __builtin_fmaf(p, r, 1.3981999507e-3f);
    p = __builtin_fmaf(p, r, 8.3334519073e-3f);
    p = __builtin_fmaf(p, r, 4.1665795894e-2f);
    p = __builtin_fmaf(p, r, 1.6666665459e-1f);
    p = __builtin_fmaf(p, r, 5.0000001201e-1f);
    p = __builtin_fmaf(p, r * r, r + 1.0f);
    int32_t bi;
    memcpy(&bi, &big, sizeof bi);
    /* in unsigned arithmetic: a NaN's bits would overflow a signed shift
     * (the same bits for every other input) */
    const uint32_t ei = ((uint32_t)bi - 0x4B400000u + 127u) << 23;
    float scale;
    memcpy(&scale, &ei, sizeof scale);
    float y = p * scale;
    return x < lo ? 0.0f : y;
}


/* inline float log for positive normal finite x (the callers' row sums, in
 * [1, m]), vectorised like bki_expf. Method: x = 2^k y with y in
 * [sqrt(1/2), sqrt(2)) from the bit pattern, log y = 2 atanh(u) with
 * u = (y - 1) / (y + 1), |u| <= 0.1716, by its odd series to u^9 (the first
 * omitted term is below 1e-9 relative), plus k ln 2 with ln 2 split in two
 * parts. Max error 2 ulp, tested against libm's log in double
 * (tests/core/test_vmath.c). NaN and +inf are returned as they are (a
 * non-finite row sum stays visible); zero, negative or subnormal x give
 * unspecified values. */
static inline float bki_logf(float x)
{
    int32_t bi;
    memcpy(&bi, &x, sizeof bi);
    const int32_t k = (bi - 0x3f3504f3) >> 23; /* floor(log2(x / sqrt(1/2))) */
    const int32_t yb = bi - (int32_t)((uint32_t)k << 23);
    float y;
    memcpy(&y, &yb, sizeof y);
    const float f = y - 1.0f; /* exact: y in [0.70, 1.42) */
    const float u = f / (2.0f + f), u2 = u * u;
    float p = 2.0f / 9.0f;
    p = __builtin_fmaf(p, u2, 2.0f / 7.0f);
    p = __builtin_fmaf(p, u2, 2.0f / 5.0f);
    p = __builtin_fmaf(p, u2, 2.0f / 3.0f);
    const float ly = __builtin_fmaf(u * u2, p, 2.0f * u);
    const float kf = (float)k;
    const float r = __builtin_fmaf(kf, 0.693359375f, __builtin_fmaf(kf, -2.12194440e-4f, ly));
    return (bi & 0x7f800000) == 0x7f800000 ? x : r;
}

#endif
