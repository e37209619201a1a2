/* tutil.c -- helpers shared by the operator tests: filling strided tensors
 * (garbage in padded rows), gathering them to double, relative errors. */
#include "tutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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


static bk_tensor th_view(int layout, float *p, int H, int N, int C)
{
    return layout ? bk_tensor_bnhd(p, H, N, C) : bk_tensor_bhnd(p, H, N, C);
}

void th_prob_init(th_prob *t, int B, int H, int Nq, int Nk, int d, int dv, int layout, int pad, double sigma,
                  th_rng *r)
{
    memset(t, 0, sizeof *t);
    if (pad) {
        t->ql = malloc(sizeof(int32_t) * B);
        t->kl = malloc(sizeof(int32_t) * B);
        for (int b = 0; b < B; b++) {
            int lo = pad == 2 ? 0 : 1;
            t->ql[b] = lo + (int)(th_next(r) % (uint64_t)(Nq - lo + 1));
            t->kl[b] = lo + (int)(th_next(r) % (uint64_t)(Nk - lo + 1));
        }
        if (B > 1) { t->ql[B - 1] = Nq; t->kl[B - 1] = Nk; }
    }
    bk_attn_desc de = {B, H, Nq, Nk, d, dv, t->ql, t->kl};
    t->desc = de;
    size_t nq = (size_t)B * H * Nq, nk = (size_t)B * H * Nk;
    t->q = th_alloc_fill(nq * d, 0); t->k = th_alloc_fill(nk * d, 0); t->v = th_alloc_fill(nk * dv, 0);
    t->o = th_alloc_fill(nq * dv, -7); t->a = th_alloc_fill(nq * Nk, -7); t->dout = th_alloc_fill(nq * dv, 0);
    t->dq = th_alloc_fill(nq * d, -7); t->dk = th_alloc_fill(nk * d, -7); t->dv = th_alloc_fill(nk * dv, -7);
    t->tq = th_view(layout, t->q, H, Nq, d); t->tk = th_view(layout, t->k, H, Nk, d);
    t->tv = th_view(layout, t->v, H, Nk, dv); t->to = th_view(layout, t->o, H, Nq, dv);
    t->ta = th_view(layout, t->a, H, Nq, Nk); t->tdo = th_view(layout, t->dout, H, Nq, dv);
    t->tdq = th_view(layout, t->dq, H, Nq, d); t->tdk = th_view(layout, t->dk, H, Nk, d);
    t->tdv = th_view(layout, t->dv, H, Nk, dv);
    double sg = sigma > 0 ? sigma : 1.0;
    th_fill_tensor(&t->tq, B, H, Nq, d, t->ql, r, sg);
    th_fill_tensor(&t->tk, B, H, Nk, d, t->kl, r, sg);
    th_fill_tensor(&t->tv, B, H, Nk, dv, t->kl, r, 1.0);
    th_fill_tensor(&t->tdo, B, H, Nq, dv, t->ql, r, 1.0);
}

void th_prob_plant_lengths(th_prob *t, int e, int Lq, int Lk, uint64_t seed)
{
    bk_attn_desc *d = &t->desc;
    t->ql = malloc(sizeof(int32_t) * (size_t)d->B);
    t->kl = malloc(sizeof(int32_t) * (size_t)d->B);
    d->q_len = t->ql;
    d->k_len = t->kl;
    th_rng r = {seed};
    for (int b = 0; b < d->B; b++) {
        t->ql[b] = b == e ? Lq : (int32_t)(th_next(&r) % (uint64_t)(d->Nq + 1));
        t->kl[b] = b == e ? Lk : 1 + (int32_t)(th_next(&r) % (uint64_t)d->Nk);
    }
    th_fill_tensor(&t->tq, d->B, d->H, d->Nq, d->d, t->ql, &r, 1.0);
    th_fill_tensor(&t->tk, d->B, d->H, d->Nk, d->d, t->kl, &r, 1.0);
    th_fill_tensor(&t->tv, d->B, d->H, d->Nk, d->dv, t->kl, &r, 1.0);
    th_fill_tensor(&t->tdo, d->B, d->H, d->Nq, d->dv, t->ql, &r, 1.0);
}

void th_prob_free(th_prob *t)
{
    free(t->ql); free(t->kl); free(t->q); free(t->k); free(t->v); free(t->o); free(t->a);
    free(t->dout); free(t->dq); free(t->dk); free(t->dv);
}

void th_directional_fd(const char *name, float *x, const float *grad, int cnt, float h, th_rng *r,
                       double (*loss)(void *ctx), void *ctx)
{
    float *u = malloc(sizeof(float) * (size_t)cnt), *x0 = malloc(sizeof(float) * (size_t)cnt);
    double dir = 0;
    for (int i = 0; i < cnt; i++) {
        u[i] = (th_next(r) & 1) ? 1.0f : -1.0f;
        x0[i] = x[i];
        dir += (double)u[i] * grad[i];
    }
    double L[2];
    for (int sg = 0; sg < 2; sg++) {
        for (int i = 0; i < cnt; i++) x[i] = x0[i] + (sg ? -h : h) * u[i];
        L[sg] = loss(ctx);
    }
    for (int i = 0; i < cnt; i++) x[i] = x0[i];
    double fd = (L[0] - L[1]) / (2 * h);
    th_check(fabs(fd - dir) <= 1e-2 * fmax(fabs(dir), 1e-2), name, "FD %.6f analytic %.6f", fd, dir);
    free(u);
    free(x0);
}

double th_max_rel(const float *x, const double *ref, size_t n, double floor)
{
    double mx = floor, e = 0.0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs(x[i] - ref[i]);
        if (!(d <= e)) e = d;
    }
    return e / mx;
}

const int th_threads[TH_NTHREADS] = {1, 2, 3, 5, 8};

int th_same_over_threads(const char *name, void (*run)(void *ctx), void *ctx, const th_span *spans, int nspans)
{
    size_t total = 0;
    for (int i = 0; i < nspans; i++) total += spans[i].bytes;
    unsigned char *ref = malloc(total ? total : 1);
    int ok = ref != NULL, bad_nt = 0, bad_span = -1;
    for (int t = 0; t < TH_NTHREADS && ok; t++) {
        bk_set_num_threads(th_threads[t]);
        run(ctx);
        size_t off = 0;
        for (int i = 0; i < nspans; i++) {
            if (t == 0) memcpy(ref + off, spans[i].p, spans[i].bytes);
            else if (memcmp(ref + off, spans[i].p, spans[i].bytes) != 0) {
                ok = 0;
                bad_nt = th_threads[t];
                bad_span = i;
                break;
            }
            off += spans[i].bytes;
        }
    }
    bk_set_num_threads(0);
    free(ref);
    th_check(ok, name, "output %d differs at %d threads from 1 thread", bad_span, bad_nt);
    return ok;
}

int th_slice_same(const bk_tensor *t1, int b1, int h1, const bk_tensor *t2, int b2, int h2, int rows, int C)
{
    const float *a = t1->data + b1 * t1->stride_b + h1 * t1->stride_h;
    const float *b = t2->data + b2 * t2->stride_b + h2 * t2->stride_h;
    for (int n = 0; n < rows; n++)
        if (memcmp(a + n * t1->stride_n, b + n * t2->stride_n, sizeof(float) * (size_t)C) != 0) return 0;
    return 1;
}

void th_slice_copy(const bk_tensor *dst, int b, int h, const bk_tensor *src, int N, int C)
{
    for (int i = 0; i < N; i++)
        memcpy(dst->data + b * dst->stride_b + h * dst->stride_h + i * dst->stride_n, src->data + i * src->stride_n,
               sizeof(float) * (size_t)C);
}

void th_prob_plant(const th_prob *x, th_prob *y, int b, int h)
{
    const bk_attn_desc *d = &x->desc;
    th_slice_copy(&y->tq, b, h, &x->tq, d->Nq, d->d);
    th_slice_copy(&y->tk, b, h, &x->tk, d->Nk, d->d);
    th_slice_copy(&y->tv, b, h, &x->tv, d->Nk, d->dv);
    th_slice_copy(&y->tdo, b, h, &x->tdo, d->Nq, d->dv);
}

int th_prob_same(const th_prob *u, const th_prob *w, int b, int h)
{
    const bk_attn_desc *d = &u->desc;
    return th_slice_same(&u->to, 0, 0, &w->to, b, h, d->Nq, d->dv) &&
           th_slice_same(&u->ta, 0, 0, &w->ta, b, h, d->Nq, d->Nk) &&
           th_slice_same(&u->tdq, 0, 0, &w->tdq, b, h, d->Nq, d->d) &&
           th_slice_same(&u->tdk, 0, 0, &w->tdk, b, h, d->Nk, d->d) &&
           th_slice_same(&u->tdv, 0, 0, &w->tdv, b, h, d->Nk, d->dv);
}

int th_prob_spans(const th_prob *pb, th_span *sp)
{
    const bk_attn_desc *d = &pb->desc;
    const size_t P = (size_t)d->B * d->H, Nq = (size_t)d->Nq, Nk = (size_t)d->Nk, F = sizeof(float);
    const th_span s[5] = {{pb->o, F * P * Nq * (size_t)d->dv}, {pb->a, F * P * Nq * Nk}, {pb->dq, F * P * Nq * (size_t)d->d},
                          {pb->dk, F * P * Nk * (size_t)d->d}, {pb->dv, F * P * Nk * (size_t)d->dv}};
    memcpy(sp, s, sizeof s);
    return 5;
}
