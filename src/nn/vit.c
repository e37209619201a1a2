/* vit.c -- LOTFormer's ViT ingredients (docs/MODEL.md, "The [CLS] row and
 * DWC"): the [CLS] token's own attention row (softmax, or Pol-[CLS]'s
 * polarised logits) and the depthwise-convolution branch over the patch
 * grid, forward and exact backward (see layers.h).
 *
 * Determinism: the row and the branch run over the B*H (sample, head) pairs
 * in a static partition, each pair writing only its own rows' head columns;
 * the DWC's parameter gradients run over head channels, each channel summing
 * its terms in one fixed order (samples, heads, grid rows, grid columns) in
 * double. Nothing is summed across threads: results do not depend on the
 * thread count. */
#include "layers.h"

#include <math.h>
#include <string.h>

/* the [CLS] row's logit for key j of pair (b, h): q is [CLS]'s query, k the
 * key (dh floats each); pol: (u)^ps + (w)^po with u = s sum max(q k, 0),
 * w = s sum max(-q k, 0); softmax: s q . k. u, w returned (pol). */
static double cls_logit(const bki_cls_par *p, int dh, const float *q, const float *k, double *u, double *w)
{
    if (p->mode == BK_CLS_SOFTMAX) {
        double d = 0.0;
        for (int c = 0; c < dh; c++) d += (double)q[c] * k[c];
        return p->scale * d;
    }
    double su = 0.0, sw = 0.0;
    for (int c = 0; c < dh; c++) {
        const double t = (double)q[c] * k[c];
        if (t > 0.0) su += t;
        else sw -= t;
    }
    *u = p->scale * su;
    *w = p->scale * sw;
    return pow(*u, p->ps) + pow(*w, p->po);
}

void bki_cls_row_fwd(const bki_vit_shape *s, const bki_cls_par *p, const float *qkv, float *alpha, float *att)
{
    const int B = s->B, T = s->T, H = s->H, dh = s->dh, I = H * dh, nt = bki_threads();
    const size_t ld = 3 * (size_t)I;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            const int b = bh / H, h = bh % H, n = s->nb[b];
            const float *q = qkv + (size_t)b * T * ld + (size_t)h * dh, *k = q + I, *v = q + 2 * I;
            float *a = alpha + (size_t)bh * T;
            double u, w, mx = -INFINITY, sum = 0.0;
            for (int j = 0; j < n; j++) {
                const double lg = cls_logit(p, dh, q, k + (size_t)j * ld, &u, &w);
                mx = lg > mx ? lg : mx;
            }
            for (int j = 0; j < n; j++) {
                const double e = exp(cls_logit(p, dh, q, k + (size_t)j * ld, &u, &w) - mx);
                a[j] = (float)e;
                sum += e;
            }
            for (int j = 0; j < T; j++) a[j] = j < n ? (float)(a[j] / sum) : 0.0f;
            float *o = att + (size_t)b * T * I + (size_t)h * dh;
            for (int c = 0; c < dh; c++) {
                double acc = 0.0;
                for (int j = 0; j < n; j++) acc += (double)a[j] * v[(size_t)j * ld + c];
                o[c] = (float)acc;
            }
        }
    }
}

void bki_cls_row_bwd(const bki_vit_shape *s, const bki_cls_par *p, const float *qkv, const float *alpha,
                     const float *dA, float *scratch, float *dq, float *dk, float *dv)
{
    const int B = s->B, T = s->T, H = s->H, dh = s->dh, I = H * dh, nt = bki_threads();
    const size_t ld = 3 * (size_t)I;
    const int pol = p->mode == BK_CLS_POL;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            const int b = bh / H, h = bh % H, n = s->nb[b];
            const size_t row0 = (size_t)b * T, col = (size_t)h * dh;
            const float *q = qkv + row0 * ld + col, *k = q + I, *v = q + 2 * I;
            const float *a = alpha + (size_t)bh * T, *g = dA + row0 * I + col;
            /* dl_j = a_j (g . v_j - sum_i a_i g . v_i), kept in du; pol: the
             * logit's derivatives through u_j (du) and w_j (dw) */
            float *du = scratch + (size_t)bh * T, *dw = scratch + ((size_t)B * H + (size_t)bh) * T;
            double sbar = 0.0;
            for (int j = 0; j < n; j++) {
                double gv = 0.0;
                const float *vj = v + (size_t)j * ld;
                for (int c = 0; c < dh; c++) gv += (double)g[c] * vj[c];
                du[j] = (float)gv;
                sbar += (double)a[j] * gv;
            }
            /* the [CLS] row of dq, dk, dv is this row's alone (the operator
             * ran on the other tokens) */
            memset(dq + row0 * I + col, 0, sizeof(float) * (size_t)dh);
            memset(dk + row0 * I + col, 0, sizeof(float) * (size_t)dh);
            memset(dv + row0 * I + col, 0, sizeof(float) * (size_t)dh);
            for (int j = 0; j < n; j++) {
                const double dl = (double)a[j] * ((double)du[j] - sbar);
                float *dvj = dv + (row0 + (size_t)j) * I + col;
                for (int c = 0; c < dh; c++) dvj[c] += a[j] * g[c];
                if (pol) {
                    double u, w;
                    cls_logit(p, dh, q, k + (size_t)j * ld, &u, &w);
                    du[j] = (float)(dl * p->ps * pow(u, p->ps - 1.0));
                    dw[j] = (float)(dl * p->po * pow(w, p->po - 1.0));
                } else {
                    du[j] = (float)dl;
                }
            }
            /* through the logits: softmax s q . k_j; pol u_j = s sum_c
             * max(q_c k_jc, 0), w_j = s sum_c max(-q_c k_jc, 0) */
            const double sc = p->scale;
            float *dq0 = dq + row0 * I + col;
            for (int c = 0; c < dh; c++) {
                double acc = 0.0;
                for (int j = 0; j < n; j++) {
                    const float kjc = k[(size_t)j * ld + c];
                    float *dkj = dk + (row0 + (size_t)j) * I + col;
                    double gj = du[j];
                    if (pol) {
                        const double t = (double)q[c] * kjc;
                        gj = t > 0.0 ? du[j] : t < 0.0 ? -(double)dw[j] : 0.0;
                    }
                    acc += gj * kjc;
                    dkj[c] += (float)(sc * gj * q[c]);
                }
                dq0[c] = (float)(sc * acc);
            }
        }
    }
}

/* the grid positions of pair (b, h)'s tokens: row of grid cell (y, x) */
static size_t grid_row(const bki_vit_shape *s, const bki_dwc_par *p, int b, int y, int x)
{
    return (size_t)b * s->T + (size_t)p->cls + (size_t)y * p->gw + (size_t)x;
}

void bki_dwc_fwd(const bki_vit_shape *s, const bki_dwc_par *p, const float *w, const float *bias, const float *qkv,
                 float *att)
{
    const int H = s->H, dh = s->dh, I = H * dh, K = p->k, r = K / 2, nt = bki_threads();
    const size_t ld = 3 * (size_t)I;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
#pragma omp for schedule(static)
        for (int bh = 0; bh < s->B * H; bh++) {
            const int b = bh / H, h = bh % H;
            const float *v = qkv + 2 * (size_t)I + (size_t)h * dh;
            for (int y = 0; y < p->gh; y++)
                for (int x = 0; x < p->gw; x++) {
                    float *o = att + grid_row(s, p, b, y, x) * I + (size_t)h * dh;
                    for (int c = 0; c < dh; c++) {
                        const float *wc = w + (size_t)c * K * K;
                        double acc = bias[c];
                        for (int i = 0; i < K; i++) {
                            const int yy = y + i - r;
                            if (yy < 0 || yy >= p->gh) continue;
                            for (int j = 0; j < K; j++) {
                                const int xx = x + j - r;
                                if (xx < 0 || xx >= p->gw) continue;
                                acc += (double)wc[i * K + j] * v[grid_row(s, p, b, yy, xx) * ld + c];
                            }
                        }
                        o[c] += (float)acc;
                    }
                }
        }
    }
}

void bki_dwc_bwd(const bki_vit_shape *s, const bki_dwc_par *p, const float *w, const float *qkv, const float *dA,
                 float *dv, float *dw, float *db)
{
    const int B = s->B, H = s->H, dh = s->dh, I = H * dh, K = p->k, r = K / 2, nt = bki_threads();
    const size_t ld = 3 * (size_t)I;
#pragma omp parallel num_threads(nt)
    {
        BKI_REGION;
        /* dv += the transposed convolution of dA, per (sample, head) */
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            const int b = bh / H, h = bh % H;
            const size_t col = (size_t)h * dh;
            for (int y = 0; y < p->gh; y++)
                for (int x = 0; x < p->gw; x++) {
                    float *o = dv + grid_row(s, p, b, y, x) * I + col;
                    for (int c = 0; c < dh; c++) {
                        const float *wc = w + (size_t)c * K * K;
                        double acc = 0.0;
                        for (int i = 0; i < K; i++) {
                            const int yy = y - i + r;
                            if (yy < 0 || yy >= p->gh) continue;
                            for (int j = 0; j < K; j++) {
                                const int xx = x - j + r;
                                if (xx < 0 || xx >= p->gw) continue;
                                acc += (double)wc[i * K + j] * dA[grid_row(s, p, b, yy, xx) * I + col + c];
                            }
                        }
                        o[c] += (float)acc;
                    }
                }
        }
        /* (the implicit barrier of the loop above ends the reads of dv) the
         * kernel's and the bias's gradients, one head channel per task */
#pragma omp for schedule(static)
        for (int c = 0; c < dh; c++) {
            double gb = 0.0;
            for (int i = 0; i < K; i++)
                for (int j = 0; j < K; j++) {
                    double acc = 0.0;
                    for (int b = 0; b < B; b++)
                        for (int h = 0; h < H; h++) {
                            const size_t cc = (size_t)h * dh + (size_t)c;
                            for (int y = 0; y < p->gh; y++) {
                                const int yy = y + i - r;
                                if (yy < 0 || yy >= p->gh) continue;
                                for (int x = 0; x < p->gw; x++) {
                                    const int xx = x + j - r;
                                    if (xx < 0 || xx >= p->gw) continue;
                                    acc += (double)dA[grid_row(s, p, b, y, x) * I + cc] *
                                           qkv[grid_row(s, p, b, yy, xx) * ld + 2 * (size_t)I + cc];
                                }
                            }
                        }
                    dw[(size_t)c * K * K + (size_t)i * K + j] += (float)acc;
                }
            for (int b = 0; b < B; b++)
                for (int h = 0; h < H; h++)
                    for (int y = 0; y < p->gh; y++)
                        for (int x = 0; x < p->gw; x++) gb += dA[grid_row(s, p, b, y, x) * I + (size_t)h * dh + c];
            db[c] += (float)gb;
        }
    }
}
