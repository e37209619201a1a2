/* tutil.c -- helpers shared by the operator tests: filling strided tensors
 * (garbage in padded rows), gathering them to double, relative errors. */
#include "tutil.h"

#include <math.h>
#include <stdlib.h>

float *th_alloc_fill(size_t n, float val)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = val;
    return p;
}

void th_fill_tensor(const bk_tensor *t, int B, int H, int N, int C, const int32_t *len, th_rng *r,
                        double sigma)
{
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int n = 0; n < N; n++)
                for (int c = 0; c < C; c++) {
                    float *x = t->data + b * t->stride_b + h * t->stride_h + n * t->stride_n + c;
                    /* padded rows hold garbage the operator must never read */
                    *x = (len && n >= len[b]) ? NAN : (float)(sigma * th_normal(r));
                }
}

/* gather a view into a contiguous double [B][H][N][C] array (padding -> 0) */
double *th_gather(const bk_tensor *t, int B, int H, int N, int C, const int32_t *len)
{
    double *out = malloc(sizeof(double) * (size_t)B * H * N * C);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int n = 0; n < N; n++)
                for (int c = 0; c < C; c++) {
                    float x = t->data[b * t->stride_b + h * t->stride_h + n * t->stride_n + c];
                    out[(((size_t)b * H + h) * N + n) * C + c] = (len && n >= len[b]) ? 0.0 : x;
                }
    return out;
}

/* max |x - ref| / max(1, max |ref|) over the whole view (padding included) */
double th_rel_err(const bk_tensor *t, int B, int H, int N, int C, const double *ref)
{
    double mx = 1.0, err = 0.0;
    for (size_t i = 0; i < (size_t)B * H * N * C; i++) mx = fmax(mx, fabs(ref[i]));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int n = 0; n < N; n++)
                for (int c = 0; c < C; c++) {
                    double x = t->data[b * t->stride_b + h * t->stride_h + n * t->stride_n + c];
                    double e = fabs(x - ref[(((size_t)b * H + h) * N + n) * C + c]);
                    if (!(e <= err)) err = e; /* NaN propagates */
                }
    return err / mx;
}

int *th_lens_int(const int32_t *l, int B)
{
    if (!l) return NULL;
    int *o = malloc(sizeof(int) * B);
    for (int b = 0; b < B; b++) o[b] = l[b];
    return o;
}

