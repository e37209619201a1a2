/* tensor.c -- views and the validation every operator shares. */
#include "internal.h"

#include <stdatomic.h>
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

bk_tensor bk_tensor_bhnd(float *data, int H, int N, int C)
{
    bk_tensor t = {data, (int64_t)H * N * C, (int64_t)N * C, C, BK_DEVICE_HOST, BK_F32};
    return t;
}

bk_tensor bk_tensor_bnhd(float *data, int H, int N, int C)
{
    bk_tensor t = {data, (int64_t)N * H * C, C, (int64_t)H * C, BK_DEVICE_HOST, BK_F32};
    return t;
}

bk_status bki_check_desc(const bk_attn_desc *d)
{
    if (!d) return bki_fail(BK_ERR_NULL, "attention descriptor is NULL");
    if (d->B < 1 || d->H < 1 || d->Nq < 1 || d->Nk < 1 || d->d < 1 || d->dv < 1)
        return bki_fail(BK_ERR_SHAPE, "sizes must be >= 1 (B=%d H=%d Nq=%d Nk=%d d=%d dv=%d)", d->B,
                        d->H, d->Nq, d->Nk, d->d, d->dv);
    /* keep every index product comfortably inside int64 and n*m inside size_t */
    if ((int64_t)d->Nq * d->Nk > ((int64_t)1 << 40) || d->d > (1 << 24) || d->dv > (1 << 24))
        return bki_fail(BK_ERR_SHAPE, "problem too large (Nq*Nk=%lld)", (long long)d->Nq * d->Nk);
    for (int b = 0; b < d->B; b++) {
        if (d->q_len && (d->q_len[b] < 0 || d->q_len[b] > d->Nq))
            return bki_fail(BK_ERR_LENGTH, "q_len[%d]=%d outside [0, Nq=%d]", b, (int)d->q_len[b], d->Nq);
        if (d->k_len && (d->k_len[b] < 0 || d->k_len[b] > d->Nk))
            return bki_fail(BK_ERR_LENGTH, "k_len[%d]=%d outside [0, Nk=%d]", b, (int)d->k_len[b], d->Nk);
    }
    return BK_OK;
}

static const char *device_name(int32_t dev, char *buf, size_t n)
{
    if (dev == BK_DEVICE_HOST) snprintf(buf, n, "host");
    else if (dev > 0) snprintf(buf, n, "cuda:%d", (int)dev - 1);
    else snprintf(buf, n, "an unknown device (%d)", (int)dev);
    return buf;
}

bk_status bki_check_tensor(const char *name, const bk_tensor *t, int B, int H, int N, int C)
{
    if (!t || !t->data) return bki_fail(BK_ERR_NULL, "tensor %s is NULL", name);
    const int here = bki_ctx_device();
    if (t->device != here) {
        char a[32], b[32];
        return bki_fail(BK_ERR_PARAM,
                        "tensor %s lives in %s memory but the current context computes in %s memory (birkhoff "
                        "never copies between devices: move the tensor, or run in a context of its device)",
                        name, device_name(t->device, a, sizeof a), device_name(here, b, sizeof b));
    }
    if (t->dtype != BK_F32 && !(here != BK_DEVICE_HOST && (t->dtype == BK_BF16 || t->dtype == BK_F16)))
        return bki_fail(BK_ERR_PARAM,
                        "tensor %s has dtype %d: the %s backend takes float32 (BK_F32)%s", name, (int)t->dtype,
                        here == BK_DEVICE_HOST ? "CPU" : "CUDA",
                        here == BK_DEVICE_HOST ? " only" : ", bfloat16 (BK_BF16) or float16 (BK_F16)");
    if (t->stride_b < 0 || t->stride_h < 0 || t->stride_n < 0)
        return bki_fail(BK_ERR_STRIDE, "tensor %s has a negative stride", name);
    /* No self-overlap: sort the non-trivial dims by stride; each stride must
     * cover the whole extent of the dims inside it (sufficient condition). */
    int64_t st[3] = {t->stride_b, t->stride_h, t->stride_n};
    int64_t sz[3] = {B, H, N};
    for (int a = 0; a < 3; a++)
        for (int b = a + 1; b < 3; b++)
            if (st[b] < st[a] || (st[b] == st[a] && sz[b] < sz[a])) {
                int64_t x = st[a]; st[a] = st[b]; st[b] = x;
                x = sz[a]; sz[a] = sz[b]; sz[b] = x;
            }
    int64_t extent = C; /* elements spanned by the dims handled so far */
    for (int a = 0; a < 3; a++) {
        if (sz[a] == 1) continue;
        if (st[a] < extent)
            return bki_fail(BK_ERR_STRIDE,
                            "tensor %s: strides (b=%lld h=%lld n=%lld) overlap for shape [%d,%d,%d,%d]",
                            name, (long long)t->stride_b, (long long)t->stride_h,
                            (long long)t->stride_n, B, H, N, C);
        extent = st[a] * (sz[a] - 1) + extent;
    }
    return BK_OK;
}

void bki_tensor_range(const bk_tensor *t, int B, int H, int N, int C, uintptr_t *lo, uintptr_t *hi)
{
    int64_t last = t->stride_b * (B - 1) + t->stride_h * (H - 1) + t->stride_n * (N - 1) + C;
    const int64_t esz = t->dtype == BK_BF16 || t->dtype == BK_F16 ? 2 : 4;
    *lo = (uintptr_t)t->data;
    *hi = (uintptr_t)t->data + (uintptr_t)(last * esz);
}

bk_status bki_check_aliasing(int nin, const bk_tensor *const *in, const int (*in_shape)[4], int nout,
                             const bk_tensor *const *out, const int (*out_shape)[4],
                             const char *const *out_names)
{
    for (int o = 0; o < nout; o++) {
        if (!out[o] || !out[o]->data) continue;
        uintptr_t lo, hi;
        bki_tensor_range(out[o], out_shape[o][0], out_shape[o][1], out_shape[o][2], out_shape[o][3], &lo, &hi);
        for (int i = 0; i < nin; i++) {
            if (!in[i] || !in[i]->data) continue;
            uintptr_t l2, h2;
            bki_tensor_range(in[i], in_shape[i][0], in_shape[i][1], in_shape[i][2], in_shape[i][3], &l2, &h2);
            if (lo < h2 && l2 < hi)
                return bki_fail(BK_ERR_STRIDE, "output %s overlaps an input", out_names[o]);
        }
        for (int p = 0; p < o; p++) {
            if (!out[p] || !out[p]->data) continue;
            uintptr_t l2, h2;
            bki_tensor_range(out[p], out_shape[p][0], out_shape[p][1], out_shape[p][2], out_shape[p][3], &l2, &h2);
            if (lo < h2 && l2 < hi)
                return bki_fail(BK_ERR_STRIDE, "outputs %s and %s overlap", out_names[o], out_names[p]);
        }
    }
    return BK_OK;
}

/* 1 if the L rows (C floats each, row stride sn) are all finite: a float is
 * NaN or Inf when its bits without the sign are >= 0x7F800000. Their
 * unsigned maximum is kept in vector lanes over all the rows (one AND and one
 * MAX a vector, no chain longer than a cycle: the scan runs at the speed of
 * its loads, from cache right after an operator wrote the rows) and tested
 * once at the end. The build's baseline is x86-64-v3, so AVX2 is always
 * there. */
int bki_rows_finite(const float *base, int64_t sn, int L, int C)
{
    const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(C % 8), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i m0 = _mm256_setzero_si256(), m1 = m0;
    for (int n = 0; n < L; n++) {
        const float *row = base + (int64_t)n * sn;
        int c = 0;
        for (; c + 16 <= C; c += 16) {
            m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(row + c)), magnitude));
            m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(row + c + 8)), magnitude));
        }
        if (c + 8 <= C) {
            m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(row + c)), magnitude));
            c += 8;
        }
        if (c < C)
            m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_maskload_epi32((const int *)(row + c), tail), magnitude));
    }
    /* (the maximum is <= 0x7FFFFFFF: a signed comparison is right) */
    const __m256i bad = _mm256_cmpgt_epi32(_mm256_max_epu32(m0, m1), _mm256_set1_epi32(0x7F7FFFFF));
    return _mm256_movemask_epi8(bad) == 0;
}

size_t bki_first_nonfinite_array(const float *a, size_t n)
{
    enum { BLOCK = 1 << 12 };
    for (size_t i = 0; a && i < n; i += BLOCK) {
        const int m = (int)(n - i < BLOCK ? n - i : BLOCK);
        if (bki_rows_finite(a + i, 0, 1, m)) continue;
        for (int j = 0; j < m; j++)
            if (!isfinite(a[i + (size_t)j])) return i + (size_t)j;
    }
    return n;
}

/* Below this many floats a scan runs on the calling thread alone. */
#define FINITE_PAR_MIN (1 << 18)

typedef struct {
    const bk_tensor *t;
    int H, N, C, P, chunk; /* chunk: rows a block of head `head` (P = 0)  */
    int head;
    const int32_t *len;
    _Atomic int bad; /* the lowest bad head found, or a bad chunk's flag  */
} scan_args;

static void scan_member(void *arg)
{
    scan_args *r = arg;
    const bk_tensor *t = r->t;
    if (r->P) { /* heads claimed at run time; the lowest bad one wins */
        BKI_FOR(i, r->P) {
            const int p = (int)i;
            if (p < atomic_load(&r->bad) && !bki_rows_finite(bki_at(t, p / r->H, p % r->H), t->stride_n,
                                                              bki_len(r->len, p / r->H, r->N), r->C)) {
                int cur = atomic_load(&r->bad);
                while (p < cur && !atomic_compare_exchange_weak(&r->bad, &cur, p)) {}
            }
        }
    } else { /* one head's rows in chunks */
        const int L = bki_len(r->len, r->head / r->H, r->N);
        const float *base = bki_at(t, r->head / r->H, r->head % r->H);
        BKI_FOR(c, (L + r->chunk - 1) / r->chunk) {
            const int r0 = (int)c * r->chunk, r1 = r0 + r->chunk < L ? r0 + r->chunk : L;
            if (!bki_rows_finite(base + (int64_t)r0 * t->stride_n, t->stride_n, r1 - r0, r->C)) atomic_store(&r->bad, 1);
        }
    }
}

/* index of the first head (b * H + h) with a non-finite value in its valid
 * rows, or B * H; heads shared over threads when there are enough of them,
 * else each head's rows in chunks. Either way the answer is the first bad
 * head, whatever the thread count. */
static int first_bad_head(const bk_tensor *t, int B, int H, int N, int C, const int32_t *len)
{
    const int P = B * H, nt = bki_threads();
    const double total = (double)P * N * C;
    int bad = P;
    if (nt < 2 || total < FINITE_PAR_MIN) {
        for (int p = 0; p < P && bad == P; p++)
            if (!bki_rows_finite(bki_at(t, p / H, p % H), t->stride_n, bki_len(len, p / H, N), C)) bad = p;
    } else if (P >= nt) {
        scan_args r = {t, H, N, C, P, 0, 0, len, P};
        bki_parallel_claimed(nt, scan_member, &r);
        bad = atomic_load(&r.bad);
    } else {
        for (int p = 0; p < P && bad == P; p++) {
            const int L = bki_len(len, p / H, N);
            scan_args r = {t, H, N, C, 0, (L + nt - 1) / nt, p, len, 0};
            if (L > 0) bki_parallel_claimed(nt, scan_member, &r);
            if (atomic_load(&r.bad)) bad = p;
        }
    }
    return bad;
}

int bki_first_nonfinite(const bk_tensor *t, int B, int H, int N, int C, const int32_t *len)
{
    if (!t || !t->data || t->device != BK_DEVICE_HOST || B < 1 || H < 1) return B * H;
    return first_bad_head(t, B, H, N, C, len);
}

bk_status bki_check_finite(const char *name, const bk_tensor *t, int B, int H, int N, int C,
                           const int32_t *len)
{
    /* device memory cannot be read here without a synchronisation: a device
     * backend's inputs are not scanned (docs/CUDA.md, "Limits") */
    if (t->device != BK_DEVICE_HOST || B < 1 || H < 1) return BK_OK;
    const int p = first_bad_head(t, B, H, N, C, len);
    if (p == B * H) return BK_OK;
    const int b = p / H, h = p % H, L = bki_len(len, b, N);
    const float *base = bki_at(t, b, h);
    for (int n = 0; n < L; n++) /* name the first bad row */
        if (!bki_rows_finite(base + (int64_t)n * t->stride_n, t->stride_n, 1, C))
            return bki_fail(BK_ERR_NONFINITE, "tensor %s has a non-finite value at [%d,%d,%d,:]", name, b, h, n);
    return bki_fail(BK_ERR_NONFINITE, "tensor %s has a non-finite value in [%d,%d,:,:]", name, b, h);
}

bk_status bki_check_qkv_shape(const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v)
{
    bk_status s;
    if ((s = bki_check_tensor("q", q, d->B, d->H, d->Nq, d->d))) return s;
    if ((s = bki_check_tensor("k", k, d->B, d->H, d->Nk, d->d))) return s;
    return bki_check_tensor("v", v, d->B, d->H, d->Nk, d->dv);
}

bk_status bki_check_values(const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                           const bk_tensor *dout)
{
    bk_status s;
    if (q && (s = bki_check_finite("q", q, d->B, d->H, d->Nq, d->d, d->q_len))) return s;
    if (k && (s = bki_check_finite("k", k, d->B, d->H, d->Nk, d->d, d->k_len))) return s;
    if (v && (s = bki_check_finite("v", v, d->B, d->H, d->Nk, d->dv, d->k_len))) return s;
    return dout ? bki_check_finite("dout", dout, d->B, d->H, d->Nq, d->dv, d->q_len) : BK_OK;
}

bk_status bki_check_qkv(const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v)
{
    bk_status s;
    if ((s = bki_check_qkv_shape(d, q, k, v))) return s;
    return bki_check_values(d, q, k, v, NULL);
}

void bki_zero_rows(float *base, int64_t sn, int from, int N, int C)
{
    for (int r = from; r < N; r++) memset(base + (int64_t)r * sn, 0, sizeof(float) * (size_t)C);
}

bk_status bki_check_fwd_outputs(const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                                const bk_tensor *out, const bk_tensor *attn)
{
    bk_status s;
    if ((s = bki_check_tensor("out", out, d->B, d->H, d->Nq, d->dv))) return s;
    if (attn && attn->data && (s = bki_check_tensor("attn", attn, d->B, d->H, d->Nq, d->Nk))) return s;
    const bk_tensor *in[3] = {q, k, v};
    const int ish[3][4] = {{d->B, d->H, d->Nq, d->d}, {d->B, d->H, d->Nk, d->d}, {d->B, d->H, d->Nk, d->dv}};
    const bk_tensor *o[2] = {out, attn};
    const int osh[2][4] = {{d->B, d->H, d->Nq, d->dv}, {d->B, d->H, d->Nq, d->Nk}};
    const char *on[2] = {"out", "attn"};
    return bki_check_aliasing(3, in, ish, 2, o, osh, on);
}

bk_status bki_check_bwd_views(const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                              const bk_tensor *dout, const bk_tensor *dq, const bk_tensor *dk, const bk_tensor *dv)
{
    bk_status s;
    if ((s = bki_check_tensor("dout", dout, d->B, d->H, d->Nq, d->dv))) return s;
    if ((s = bki_check_tensor("dq", dq, d->B, d->H, d->Nq, d->d))) return s;
    if ((s = bki_check_tensor("dk", dk, d->B, d->H, d->Nk, d->d))) return s;
    if ((s = bki_check_tensor("dv", dv, d->B, d->H, d->Nk, d->dv))) return s;
    const bk_tensor *in[4] = {q, k, v, dout};
    const int ish[4][4] = {{d->B, d->H, d->Nq, d->d}, {d->B, d->H, d->Nk, d->d}, {d->B, d->H, d->Nk, d->dv},
                           {d->B, d->H, d->Nq, d->dv}};
    const bk_tensor *o[3] = {dq, dk, dv};
    const int osh[3][4] = {{d->B, d->H, d->Nq, d->d}, {d->B, d->H, d->Nk, d->d}, {d->B, d->H, d->Nk, d->dv}};
    const char *on[3] = {"dq", "dk", "dv"};
    return bki_check_aliasing(4, in, ish, 3, o, osh, on);
}
