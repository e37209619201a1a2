/* vgelu.h -- the exact (erf) GELU and its slope, inline and without libm
 * calls, so that compilers vectorise them inside loops. Compiled per
 * instruction set by lse_engine.c (bki_kern()->gelu, ->gelu_grad,
 * ->gelu_keep_slope), which the training engine's GELU passes and Linear
 * epilogues call. */
#ifndef BK_VGELU_H
#define BK_VGELU_H
#include "vexp.h"

#include <math.h>

/* The exact (erf) GELU without libm calls, so that the loops vectorise.
 * Phi(z) for -0.75 < z < 2: 0.5 + z S(z^2), S a degree-8 polynomial fitted
 * here to relative error 3.1e-10 (iteratively reweighted least squares in
 * double; below -0.75 the sum would cancel). Elsewhere, for u = |z|, Phi(-u) = exp(-u^2 / 2) R(u), where R(u) = Phi(-u)
 * exp(u^2/2) is smooth and decreasing (0.5 at 0, ~1 / (u sqrt(2 pi)) for
 * large u); R is a degree-10 polynomial in t = 1 / (1 + 0.3 u) fitted to
 * relative error 2.8e-9 on [0, 13.5], and Phi(z) = 1 - Phi(-z) for z >= 0.
 * u^2 is split exactly by an FMA (u^2 = p + e) so that exp(-u^2/2) keeps its
 * relative accuracy for large u: exp(-p/2) (1 - e/2); it also gives the
 * density phi. Beyond u = 13.5 Phi(-u) < 1e-41 is flushed to 0. Both
 * branches are computed and one selected (no branch in the loop).
 * Accuracy against double-precision libm (tests/nn/test_model.c, test_gelu):
 * gelu within 6 ulp of its value, gelu' within 6 ulp of max(Phi(z),
 * |z| phi(z)) (its two terms cancel near z = -0.75), or either within 1e-36
 * absolutely (z < -12.9: the tail nears float's subnormal range, which a
 * flush-to-zero mode or exp's underflow at -87.3 sends to 0). */
static inline float gelu_cdf(float x, float *pdf)
{
    const float u = fabsf(x), uc = u < 13.5f ? u : 13.5f;
    const float t = 1.0f / __builtin_fmaf(0.3f, uc, 1.0f);
    float r = -1.9634403495e-02f;
    r = __builtin_fmaf(r, t, 1.0660060394e-01f);
    r = __builtin_fmaf(r, t, -2.1311503048e-01f);
    r = __builtin_fmaf(r, t, 1.6926162440e-01f);
    r = __builtin_fmaf(r, t, -5.8016095996e-02f);
    r = __builtin_fmaf(r, t, 8.2637306872e-02f);
    r = __builtin_fmaf(r, t, 8.4123769543e-02f);
    r = __builtin_fmaf(r, t, 1.0862550830e-01f);
    r = __builtin_fmaf(r, t, 1.1985772406e-01f);
    r = __builtin_fmaf(r, t, 1.1965772060e-01f);
    r = __builtin_fmaf(r, t, 1.2708965606e-06f);
    const float p = uc * uc, e = __builtin_fmaf(uc, uc, -p);
    const float g = bki_expf(-0.5f * p) * __builtin_fmaf(-0.5f, e, 1.0f); /* exp(-u^2/2) */
    const float q = u < 13.5f ? g * r : 0.0f;                              /* Phi(-u) */
    *pdf = u < 13.5f ? 0.39894228040143268f * g : 0.0f;
    float sc = 9.4468619101e-10f;
    sc = __builtin_fmaf(sc, p, -3.2689085558e-08f);
    sc = __builtin_fmaf(sc, p, 6.3379921959e-07f);
    sc = __builtin_fmaf(sc, p, -9.3713454616e-06f);
    sc = __builtin_fmaf(sc, p, 1.1533449841e-04f);
    sc = __builtin_fmaf(sc, p, -1.1872501975e-03f);
    sc = __builtin_fmaf(sc, p, 9.9735262092e-03f);
    sc = __builtin_fmaf(sc, p, -6.6490375327e-02f);
    sc = __builtin_fmaf(sc, p, 3.9894228028e-01f);
    const float central = __builtin_fmaf(x, sc, 0.5f);
    return x > -0.75f && x < 2.0f ? central : x >= 0.0f ? 1.0f - q : q;
}

/* gelu(x) = x Phi(x) and its slope Phi(x) + x phi(x), from one Phi and phi:
 * the one formula of the GELU passes and of the Linear epilogues (gelu_of
 * and gelu_slope take one of the two; the other is not computed) */
static inline float gelu_and_slope(float x, float *slope)
{
    float pdf;
    const float cdf = gelu_cdf(x, &pdf);
    *slope = __builtin_fmaf(x, pdf, cdf);
    return x * cdf;
}
static inline float gelu_of(float x)
{
    float slope;
    return gelu_and_slope(x, &slope);
}
static inline float gelu_slope(float x)
{
    float slope;
    (void)gelu_and_slope(x, &slope);
    return slope;
}

#endif
