/* vit.c -- LOTFormer's ViT ingredients (docs/MODEL.md, "The [CLS] row and
 * DWC"): the [CLS] token's own attention row (softmax, or Pol-[CLS]'s
 * polarised logits) and the depthwise-convolution branch over the patch
 * grid, forward and exact backward (see layers.h).
 *
 * Determinism: the row and the branch run over the B*H (sample, head) pairs
 * (taken at run time by whichever thread asks first), each pair writing
 * only its own rows' head columns; the DWC's parameter gradients run over
 * the kernel's taps (and the bias), each tap summing its terms in one fixed
 * order (samples, heads, grid rows, grid columns) in double per head
 * channel. Nothing is summed across threads: results do not depend on the
 * thread count. */
#include "layers.h"

#include <math.h>
#include <string.h>

/* x^p for x >= 0 (the common powers exactly, without pow) */
static double powp(double x, double p)
{
    return p == 1.0 ? x : p == 2.0 ? x * x : p == 0.0 ? 1.0 : pow(x, p);
}

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
    return powp(*u, p->ps) + powp(*w, p->po);
}

typedef struct {
    const bki_vit_shape *s;
    const bki_cls_par *p;
    const float *qkv;
    float *alpha, *att;
} cls_row_fwd_args;

static void cls_row_fwd_member(void *arg)
{
    const cls_row_fwd_args *r = arg;
    const bki_vit_shape *s = r->s;
    const bki_cls_par *p = r->p;
    const float *qkv = r->qkv;
    float *alpha = r->alpha, *att = r->att;
    const int B = s->B, T = s->T, H = s->H, dh = s->dh, I = H * dh;
    const size_t ld = 3 * (size_t)I;
    BKI_FOR(bhi, (int64_t)B * H) {
        const int bh = (int)bhi;
        const int b = bh / H, h = bh % H, n = s->nb[b];
        const float *q = qkv + (size_t)b * T * ld + (size_t)h * dh, *k = q + I, *v = q + 2 * I;
        float *a = alpha + (size_t)bh * T;
        double u, w, mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < n; j++) { /* the logits, kept in a */
            const double lg = cls_logit(p, dh, q, k + (size_t)j * ld, &u, &w);
            a[j] = (float)lg;
            mx = lg > mx ? lg : mx;
        }
        for (int j = 0; j < n; j++) {
            const double e = exp((double)a[j] - mx);
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

void bki_cls_row_fwd(const bki_vit_shape *s, const bki_cls_par *p, const float *qkv, float *alpha, float *att)
{
    cls_row_fwd_args r = {s, p, qkv, alpha, att};
    bki_parallel_claimed(bki_threads(), cls_row_fwd_member, &r);
}

typedef struct {
    const bki_vit_shape *s;
    const bki_cls_par *p;
    const float *qkv, *alpha, *dA;
    float *scratch, *dq, *dk, *dv;
} cls_row_bwd_args;

static void cls_row_bwd_member(void *arg)
{
    const cls_row_bwd_args *r = arg;
    const bki_vit_shape *s = r->s;
    const bki_cls_par *p = r->p;
    const float *qkv = r->qkv, *alpha = r->alpha, *dA = r->dA;
    float *scratch = r->scratch, *dq = r->dq, *dk = r->dk, *dv = r->dv;
    const int B = s->B, T = s->T, H = s->H, dh = s->dh, I = H * dh;
    const size_t ld = 3 * (size_t)I;
    const int pol = p->mode == BK_CLS_POL;
    BKI_FOR(bhi, (int64_t)B * H) {
        const int bh = (int)bhi;
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
                du[j] = (float)(dl * p->ps * powp(u, p->ps - 1.0));
                dw[j] = (float)(dl * p->po * powp(w, p->po - 1.0));
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

void bki_cls_row_bwd(const bki_vit_shape *s, const bki_cls_par *p, const float *qkv, const float *alpha,
                     const float *dA, float *scratch, float *dq, float *dk, float *dv)
{
    cls_row_bwd_args r = {s, p, qkv, alpha, dA, scratch, dq, dk, dv};
    bki_parallel_claimed(bki_threads(), cls_row_bwd_member, &r);
}

/* the grid positions of pair (b, h)'s tokens: row of grid cell (y, x) */
static size_t grid_row(const bki_vit_shape *s, const bki_dwc_par *p, int b, int y, int x)
{
    return (size_t)b * s->T + (size_t)p->cls + (size_t)y * p->gw + (size_t)x;
}

typedef struct {
    const bki_vit_shape *s;
    const bki_dwc_par *p;
    const float *w, *bias, *qkv;
    float *att;
} dwc_fwd_args;

static void dwc_fwd_member(void *arg)
{
    const dwc_fwd_args *a = arg;
    const bki_vit_shape *s = a->s;
    const bki_dwc_par *p = a->p;
    const float *w = a->w, *bias = a->bias, *qkv = a->qkv;
    float *att = a->att;
    const int H = s->H, dh = s->dh, I = H * dh, K = p->k, r = K / 2;
    const size_t ld = 3 * (size_t)I;
    BKI_FOR(bhi, (int64_t)s->B * H) {
        const int bh = (int)bhi;
        const int b = bh / H, h = bh % H;
        const float *v = qkv + 2 * (size_t)I + (size_t)h * dh;
        for (int y = 0; y < p->gh; y++)
            for (int x = 0; x < p->gw; x++) {
                /* o += bias + sum over the taps in (i, j) order */
                float *o = att + grid_row(s, p, b, y, x) * I + (size_t)h * dh;
                for (int c = 0; c < dh; c++) o[c] += bias[c];
                for (int i = 0; i < K; i++) {
                    const int yy = y + i - r;
                    if (yy < 0 || yy >= p->gh) continue;
                    for (int j = 0; j < K; j++) {
                        const int xx = x + j - r;
                        if (xx < 0 || xx >= p->gw) continue;
                        const float *vr = v + grid_row(s, p, b, yy, xx) * ld, *wt = w + i * K + j;
                        for (int c = 0; c < dh; c++) o[c] += wt[(size_t)c * K * K] * vr[c];
                    }
                }
            }
    }
}

void bki_dwc_fwd(const bki_vit_shape *s, const bki_dwc_par *p, const float *w, const float *bias, const float *qkv,
                 float *att)
{
    dwc_fwd_args a = {s, p, w, bias, qkv, att};
    bki_parallel_claimed(bki_threads(), dwc_fwd_member, &a);
}

typedef struct {
    const bki_vit_shape *s;
    const bki_dwc_par *p;
    const float *w, *qkv, *dA;
    double *scratch;
    float *dv, *dw, *db;
} dwc_bwd_args;

/* The two loops share no data (the first writes dv, the second reads dA
 * and v and writes its taps' sums): no barrier between them. */
static void dwc_bwd_member(void *arg)
{
    const dwc_bwd_args *a = arg;
    const bki_vit_shape *s = a->s;
    const bki_dwc_par *p = a->p;
    const float *w = a->w, *qkv = a->qkv, *dA = a->dA;
    double *scratch = a->scratch;
    float *dv = a->dv, *dw = a->dw, *db = a->db;
    const int B = s->B, H = s->H, dh = s->dh, I = H * dh, K = p->k, r = K / 2;
    const size_t ld = 3 * (size_t)I;
    /* dv += the transposed convolution of dA, per (sample, head) */
    BKI_FOR(bhi, (int64_t)B * H) {
        const int bh = (int)bhi;
        const int b = bh / H, h = bh % H;
        const size_t col = (size_t)h * dh;
        for (int y = 0; y < p->gh; y++)
            for (int x = 0; x < p->gw; x++) {
                float *o = dv + grid_row(s, p, b, y, x) * I + col;
                for (int i = 0; i < K; i++) {
                    const int yy = y - i + r;
                    if (yy < 0 || yy >= p->gh) continue;
                    for (int j = 0; j < K; j++) {
                        const int xx = x - j + r;
                        if (xx < 0 || xx >= p->gw) continue;
                        const float *g = dA + grid_row(s, p, b, yy, xx) * I + col, *wt = w + i * K + j;
                        for (int c = 0; c < dh; c++) o[c] += wt[(size_t)c * K * K] * g[c];
                    }
                }
            }
    }
    /* the kernel's gradient, one tap (i, j) per task, and the bias's
     * (task K*K): sums over samples, heads and grid cells in that order,
     * in double, per head channel */
    BKI_FOR(ti, (int64_t)K * K + 1) {
        const int t = (int)ti;
        const int i = t / K, j = t % K;
        double *acc = scratch + (size_t)t * dh;
        for (int c = 0; c < dh; c++) acc[c] = 0.0;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                const size_t col = (size_t)h * dh;
                for (int y = 0; y < p->gh; y++) {
                    const int yy = y + i - r;
                    if (t < K * K && (yy < 0 || yy >= p->gh)) continue;
                    for (int x = 0; x < p->gw; x++) {
                        const float *g = dA + grid_row(s, p, b, y, x) * I + col;
                        if (t == K * K) {
                            for (int c = 0; c < dh; c++) acc[c] += g[c];
                            continue;
                        }
                        const int xx = x + j - r;
                        if (xx < 0 || xx >= p->gw) continue;
                        const float *vr = qkv + grid_row(s, p, b, yy, xx) * ld + 2 * (size_t)I + col;
                        for (int c = 0; c < dh; c++) acc[c] += (double)g[c] * vr[c];
                    }
                }
            }
        if (t == K * K)
            for (int c = 0; c < dh; c++) db[c] += (float)acc[c];
        else
            for (int c = 0; c < dh; c++) dw[(size_t)c * K * K + (size_t)t] += (float)acc[c];
    }
}

void bki_dwc_bwd(const bki_vit_shape *s, const bki_dwc_par *p, const float *w, const float *qkv, const float *dA,
                 double *scratch, float *dv, float *dw, float *db)
{
    dwc_bwd_args a = {s, p, w, qkv, dA, scratch, dv, dw, db};
    bki_parallel_claimed(bki_threads(), dwc_bwd_member, &a);
}
