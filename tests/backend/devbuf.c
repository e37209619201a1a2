/* devbuf.c -- test buffers in a backend's memory (devbuf.h). */
#include "devbuf.h"
#include "../../src/backend/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- element conversions (round to nearest even) ---- */
static uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}
static uint16_t to_f16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t ax = u & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow (>= 65520) */
    if (ax < 0x38800000u) { /* subnormal half */
        float f;
        memcpy(&f, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(f * 16777216.0f)); /* units of 2^-24 */
    }
    uint32_t m = ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u;
    return (uint16_t)(sign | (m >> 13));
}
static float from_f16(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float x;
    if (e == 0) {
        x = (float)m * 5.9604644775390625e-08f;
        return sign ? -x : x;
    }
    uint32_t u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    memcpy(&x, &u, 4);
    return x;
}
static size_t esize(int dt) { return dt == BK_F32 ? 4 : 2; }

void th_round_to(int dt, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (dt == BK_BF16) x[i] = from_bf16(to_bf16(x[i]));
        if (dt == BK_F16) x[i] = from_f16(to_f16(x[i]));
    }
}

int th_dev_up(bk_context *ctx, th_dbuf *b, const float *h, size_t n, int dt)
{
    const bki_backend *be = bki_ctx_backend(ctx);
    b->n = n;
    b->dt = dt;
    b->dev = be->alloc(ctx, n * esize(dt));
    if (!b->dev) return 0;
    void *tmp = malloc(n * esize(dt));
    for (size_t i = 0; i < n; i++) {
        if (dt == BK_F32) ((float *)tmp)[i] = h[i];
        else ((uint16_t *)tmp)[i] = dt == BK_BF16 ? to_bf16(h[i]) : to_f16(h[i]);
    }
    const bk_status s = be->copy(ctx, b->dev, tmp, n * esize(dt), 0);
    free(tmp);
    return s == BK_OK;
}

int th_dev_down(bk_context *ctx, float *h, const th_dbuf *b)
{
    const bki_backend *be = bki_ctx_backend(ctx);
    void *tmp = malloc(b->n * esize(b->dt));
    const bk_status s = be->copy(ctx, tmp, b->dev, b->n * esize(b->dt), 1);
    for (size_t i = 0; i < b->n; i++) {
        if (b->dt == BK_F32) h[i] = ((float *)tmp)[i];
        else h[i] = b->dt == BK_BF16 ? from_bf16(((uint16_t *)tmp)[i]) : from_f16(((uint16_t *)tmp)[i]);
    }
    free(tmp);
    return s == BK_OK;
}

void th_dev_free(bk_context *ctx, th_dbuf *b)
{
    if (b->dev) bki_ctx_backend(ctx)->free(ctx, b->dev);
    b->dev = NULL;
}

bk_tensor th_dev_view(const bk_tensor *t, const th_dbuf *b)
{
    bk_tensor r = *t;
    r.data = b->dev;
    r.device = bki_ctx_device(); /* the tensor says where it lives */
    r.dtype = b->dt;
    return r;
}
