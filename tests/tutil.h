/* tutil.h -- helpers shared by the operator tests. */
#ifndef BK_TUTIL_H
#define BK_TUTIL_H
#include "birkhoff.h"
#include "harness.h"

#include <stddef.h>
#include <stdint.h>

float *th_alloc_fill(size_t n, float val);
/* N(0, sigma^2) values in valid rows (n < len[b]); NaN in padded rows */
void th_fill_tensor(const bk_tensor *t, int B, int H, int N, int C, const int32_t *len, th_rng *r, double sigma);
/* contiguous double [B][H][N][C] copy; padded rows -> 0 */
double *th_gather(const bk_tensor *t, int B, int H, int N, int C, const int32_t *len);
/* max |x - ref| / max(1, max |ref|) over the whole view (NaN -> NaN) */
double th_rel_err(const bk_tensor *t, int B, int H, int N, int C, const double *ref);
/* max |x - ref| / max(floor, max |ref|) over n entries (NaN in x -> NaN) */
double th_max_rel(const float *x, const double *ref, size_t n, double floor);
/* int copy of int32 lengths (NULL stays NULL) */
int *th_lens_int(const int32_t *l, int B);

/* An attention problem's buffers in a chosen layout: layout 0 [B,H,N,C],
 * 1 [B,N,H,C]; pad 0 none, 1 random lengths >= 1, 2 lengths may be 0 (the
 * last batch entry is always full). Inputs N(0, sigma^2) (v, dout N(0,1)),
 * padded rows NaN; outputs prefilled with -7. */
typedef struct {
    bk_attn_desc desc;
    int32_t *ql, *kl;
    float *q, *k, *v, *o, *a, *dout, *dq, *dk, *dv;
    bk_tensor tq, tk, tv, to, ta, tdo, tdq, tdk, tdv;
} th_prob;
void th_prob_init(th_prob *t, int B, int H, int Nq, int Nk, int d, int dv, int layout, int pad, double sigma,
                  th_rng *r);
void th_prob_free(th_prob *t);
/* Gives an unpadded problem per-batch lengths: (Lq, Lk) for entry e and
 * seeded random ones for the others (Lq in [0, Nq], Lk in [1, Nk]), then
 * refills q, k, v, dout (N(0,1) in the valid rows, NaN in the padding). For
 * the determinism tests that plant one problem inside batches. */
void th_prob_plant_lengths(th_prob *t, int e, int Lq, int Lk, uint64_t seed);

/* Directional finite-difference check of one gradient: perturbs the cnt
 * entries of x along a random +-1 direction by +-h, evaluates loss(ctx) (a
 * forward followed by sum(O .* dO), in double) and compares the central
 * difference with <grad, direction>; relative tolerance 1e-2 (float32
 * forward: single-entry differences are too noisy to be informative). */
void th_directional_fd(const char *name, float *x, const float *grad, int cnt, float h, th_rng *r,
                       double (*loss)(void *ctx), void *ctx);

/* ---- the determinism contract (docs/ARCHITECTURE.md) ---- */
/* the thread counts every determinism test sweeps: 1, 2, 3, 5, 8 */
#define TH_NTHREADS 5
extern const int th_threads[TH_NTHREADS];
/* bytes that a run writes and that must not depend on the thread count */
typedef struct { const void *p; size_t bytes; } th_span;
/* Runs run(ctx) at each of th_threads (bk_set_num_threads) and compares the
 * spans bytewise with the 1-thread run's; records one check `name` and
 * returns whether all runs matched. Restores the default thread count. */
int th_same_over_threads(const char *name, void (*run)(void *ctx), void *ctx, const th_span *spans, int nspans);
/* 1 when the [N, C] slices (b1, h1) of t1 and (b2, h2) of t2 are bitwise
 * equal in their first `rows` rows */
int th_slice_same(const bk_tensor *t1, int b1, int h1, const bk_tensor *t2, int b2, int h2, int rows, int C);
/* copies rows [0, N) of slice (0, 0) of src into slice (b, h) of dst */
void th_slice_copy(const bk_tensor *dst, int b, int h, const bk_tensor *src, int N, int C);
/* plants problem (0, 0) of x's q, k, v, dout as problem (b, h) of y (whose
 * entry b has the same lengths: th_prob_plant_lengths) */
void th_prob_plant(const th_prob *x, th_prob *y, int b, int h);
/* 1 when problem (b, h) of w has problem (0, 0) of u's outputs bitwise:
 * out, attention, dq, dk, dv */
int th_prob_same(const th_prob *u, const th_prob *w, int b, int h);
/* the spans of a problem's outputs (out, attention, dq, dk, dv) for
 * th_same_over_threads: writes 5, returns 5 */
int th_prob_spans(const th_prob *pb, th_span *sp);
#endif
