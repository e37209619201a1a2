/* test_gemm.c -- the library's GEMM (src/core/gemm.c) and its thin-product
 * kernel (src/core/gemm_kern.c) on every instruction set this CPU runs:
 * against a double-precision reference for every transpose pair, both
 * orientations, row and column remainders of the micro-tile, alpha and beta
 * (beta == 0 must not read C); bitwise agreement of the two orientations
 * (each element is one multiply-add chain over k either way); no write
 * outside the output (guard columns and rows); and bki_gemm's team tiles
 * giving the same bits for one member and for teams of two and three. */
#include "../../src/core/internal.h"
#include "../harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 3.25f

typedef struct {
    int ta, tb, M, N, K;
    float alpha, beta;
} gcase;


/* bki_gemm_ep by every member of a region of the library's threads */
typedef struct {
    int ta, tb, M, N, K;
    float alpha;
    const float *A;
    ptrdiff_t lda;
    const float *B;
    ptrdiff_t ldb;
    float beta;
    float *C;
    ptrdiff_t ldc;
    bki_tile_fn ep;
    void *arg;
} gemm_call;

static void gemm_member(void *arg)
{
    const gemm_call *g = arg;
    const bki_team tm = bki_region_team();
    bki_gemm_ep(&tm, g->ta, g->tb, g->M, g->N, g->K, g->alpha, g->A, g->lda, g->B, g->ldb, g->beta, g->C, g->ldc,
                g->ep, g->arg);
}

static void fill(th_rng *r, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)th_normal(r);
}

static double opa(const gcase *c, const float *A, int lda, int i, int k)
{
    return c->ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
}
static double opb(const gcase *c, const float *B, int ldb, int k, int j)
{
    return c->tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
}

/* max |C - ref| / (|alpha| sum_k |a b| + |beta C0| + tiny) over the output,
 * and whether every guard cell kept GUARD */
static double rel_err(const gcase *c, const float *A, int lda, const float *B, int ldb, const float *C0,
                      const float *C, int ldc, int rows_alloc, int *guard_ok)
{
    double worst = 0.0;
    *guard_ok = 1;
    for (int i = 0; i < rows_alloc; i++)
        for (int j = 0; j < ldc; j++) {
            const float got = C[(size_t)i * ldc + j];
            if (i >= c->M || j >= c->N) {
                *guard_ok &= got == GUARD;
                continue;
            }
            double s = 0.0, a = 0.0;
            for (int k = 0; k < c->K; k++) {
                const double p = opa(c, A, lda, i, k) * opb(c, B, ldb, k, j);
                s += p;
                a += fabs(p);
            }
            const double c0 = c->beta != 0.0f ? C0[(size_t)i * ldc + j] : 0.0;
            const double ref = c->alpha * s + c->beta * c0;
            const double scale = fabs(c->alpha) * a + fabs(c->beta * c0) + 1e-30;
            const double e = isfinite(got) ? fabs(got - ref) / scale : INFINITY;
            worst = e > worst ? e : worst;
        }
    return worst;
}

static void one_case(const bki_gemm_kernels *gk, const char *isa, const gcase *c, th_rng *r)
{
    const int lda = (c->ta ? c->M : c->K) + 1, ldb = (c->tb ? c->K : c->N) + 2, ldc = c->N + 3, rows = c->M + 2;
    const size_t na = (size_t)(c->ta ? c->K : c->M) * lda, nb = (size_t)(c->tb ? c->N : c->K) * ldb;
    const size_t nc = (size_t)rows * ldc;
    float *A = malloc(na * sizeof(float)), *B = malloc(nb * sizeof(float)), *C0 = malloc(nc * sizeof(float));
    float *C[2] = {malloc(nc * sizeof(float)), malloc(nc * sizeof(float))};
    const size_t pkn = gk->pack_floats(c->K, c->M > c->N ? c->M : c->N);
    float *pk = malloc((pkn ? pkn : 1) * sizeof(float));
    fill(r, A, na);
    fill(r, B, nb);
    fill(r, C0, nc);
    for (size_t e = 0; e < nc; e++)
        if ((int)(e / ldc) >= c->M || (int)(e % ldc) >= c->N) C0[e] = GUARD;
    char name[160];
    snprintf(name, sizeof name, "gemm thin %s: ta %d tb %d %dx%dx%d alpha %g beta %g", isa, c->ta, c->tb, c->M, c->N,
             c->K, (double)c->alpha, (double)c->beta);
    double err[2];
    int guard_ok[2];
    for (int o = 0; o < 2; o++) {
        for (size_t e = 0; e < nc; e++) /* beta == 0: C is not read, so NaN there must not reach the output */
            C[o][e] = c->beta == 0.0f && (int)(e / ldc) < c->M && (int)(e % ldc) < c->N ? NAN : C0[e];
        /* the packing leaves its padding columns as they are: NaN there must
         * not reach the output either */
        for (size_t e = 0; e < pkn; e++) pk[e] = NAN;
        gk->thin(o, c->ta, c->tb, c->M, c->N, c->K, c->alpha, A, lda, B, ldb, c->beta, C[o], ldc, pk, 0, 0);
        err[o] = rel_err(c, A, lda, B, ldb, C0, C[o], ldc, rows, &guard_ok[o]);
    }
    /* float32 chain of K fused multiply-adds, then two roundings */
    const double tol = 4e-7 * (c->K + 4);
    const int same = !memcmp(C[0], C[1], nc * sizeof(float));
    th_check(err[0] <= tol && err[1] <= tol && guard_ok[0] && guard_ok[1] && same, name,
             "relative error %.3g / %.3g (rows / columns streamed; tol %.3g), guards %s, orientations %s", err[0],
             err[1], tol, guard_ok[0] && guard_ok[1] ? "kept" : "OVERWRITTEN", same ? "bitwise equal" : "DIFFER");
    free(A), free(B), free(C0), free(C[0]), free(C[1]), free(pk);
}

static void kernel_cases(const bki_gemm_kernels *gk, const char *isa)
{
    th_rng r = {0x6e3a11};
    const int mr = gk->mr, nr = gk->nr;
    /* remainders of both micro-tile sides around the tile sizes, K of 1 and odd */
    const int Ms[] = {1, mr - 1, mr, mr + 1, 3 * mr + 2};
    const int Ns[] = {1, nr / 2 - 1, nr / 2 + 1, nr, nr + 5, 2 * nr + 3};
    const int Ks[] = {1, 7, 64};
    int done = 0;
    for (int t = 0; t < 4; t++)
        for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
            for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
                for (size_t k = 0; k < sizeof Ks / sizeof *Ks; k++) {
                    if (TH.quick && (a + b + k) % 3) continue;
                    const float beta = (a + b + k + t) % 2 ? 0.0f : -0.75f;
                    const gcase c = {t & 1, t >> 1, Ms[a], Ns[b], Ks[k], (k % 2) ? 1.0f : 0.5f, beta};
                    one_case(gk, isa, &c, &r);
                    done++;
                }
    /* LOT's and OTK's shapes: long side, r or d short */
    /* long K, cut into chunks whose raw sums wait in a buffer (the other
     * orientation, wider than the buffer, runs one chain: the bits must
     * agree), K, M and the columns not multiples of the chunk, the row group
     * or the micro-tile; beta != 0 across chunks; the prefetching rows */
    const gcase big[] = {{0, 1, 1000, 32, 64, 0.125f, 0.0f}, {1, 0, 517, 64, 32, 1.0f, 0.0f},
                         {0, 0, 301, 128, 128, 1.0f, 1.0f}, {0, 1, 32, 777, 64, 2.0f, 0.0f},
                         {1, 0, 130, 50, 777, 0.5f, -0.75f}, {0, 1, 67, 96, 1000, 1.0f, 0.0f},
                         {0, 0, 200, 17, 3001, 1.0f, 1.0f}, {1, 1, 150, 128, 401, 1.0f, 0.0f},
                         /* several row groups (as many rows as the buffer holds at the padded
                          * width: 85 at 96 columns, 256 at 24) and a partial last one */
                         {1, 0, 600, 96, 700, 1.0f, 0.5f}, {1, 0, 700, 24, 900, 1.0f, 0.0f}};
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) one_case(gk, isa, &big[i], &r);
    th_check(done > 0, "gemm thin: cases ran", "%d small cases on %s", done, isa);
}

/* bki_gemm over team tiles (thin or BLAS by shape): one member and two give
 * the same bits, and both match the reference */
static void team_case(int ta, int tb, int M, int N, int K)
{
    th_rng r = {0x5151u + (unsigned)(M * 7 + N * 3 + K)};
    const int lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
    float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)K * N);
    float *C1 = malloc(sizeof(float) * (size_t)M * N), *C2 = malloc(sizeof(float) * (size_t)M * N);
    fill(&r, A, (size_t)M * K);
    fill(&r, B, (size_t)K * N);
    bki_gemm(&BKI_SOLO, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C1, ldc);
    const gcase c = {ta, tb, M, N, K, 1.0f, 0.0f};
    int guard_ok;
    const double err = rel_err(&c, A, lda, B, ldb, NULL, C1, ldc, M, &guard_ok);
    /* teams of two and three: a member's range of tiles starts and ends
     * anywhere in a row of tiles (row-major numbering) */
    for (int nt = 2; nt <= 3; nt++) {
        memset(C2, 0, sizeof(float) * (size_t)M * N);
        gemm_call g = {ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C2, ldc, NULL, NULL};
        bki_parallel(nt, gemm_member, &g);
        const int same = !memcmp(C1, C2, sizeof(float) * (size_t)M * N);
        th_check(err <= 4e-7 * (K + 4) && same, "gemm team tiles",
                 "ta %d tb %d %dx%dx%d: relative error %.3g, one member and %d %s", ta, tb, M, N, K, err, nt,
                 same ? "bitwise equal" : "DIFFER");
    }
    free(A), free(B), free(C1), free(C2);
}

/* Non-temporal stores (the thin kernel's stream flag, bki_gemm's outputs of
 * 4M floats and more): the same bits as ordinary stores, nothing written
 * outside the output. Row strides that keep every row's lines aligned (80)
 * and that misalign every other row (70: those rows take ordinary stores). */
static void stream_case(const bki_gemm_kernels *gk, const char *isa)
{
    th_rng r = {0x57e4u};
    const int M = 37, N = 70, K = 19;
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
    float *pk = malloc(sizeof(float) * gk->pack_floats(K, N));
    fill(&r, A, (size_t)M * K);
    fill(&r, B, (size_t)K * N);
    for (int ldc = 70; ldc <= 80; ldc += 10)
        for (int tb = 0; tb < 2; tb++) {
            const size_t nc = (size_t)M * ldc;
            float *C0 = bk_alloc(sizeof(float) * (nc + 16)), *C1 = bk_alloc(sizeof(float) * (nc + 16)); /* 64-byte aligned */
            for (size_t i = 0; i < nc + 16; i++) C0[i] = C1[i] = GUARD;
            const int ldb = tb ? K : N;
            gk->thin(0, 0, tb, M, N, K, 0.75f, A, K, B, ldb, 0.0f, C0, ldc, pk, 0, 0);
            gk->thin(0, 0, tb, M, N, K, 0.75f, A, K, B, ldb, 0.0f, C1, ldc, pk, 0, 1);
            int guard = 1;
            for (int i = 0; i < M; i++)
                for (int j = N; j < ldc; j++) guard &= C1[(size_t)i * ldc + j] == GUARD;
            for (size_t i = nc; i < nc + 16; i++) guard &= C1[i] == GUARD;
            const int same = !memcmp(C0, C1, sizeof(float) * (nc + 16));
            th_check(same && guard, "gemm thin: streaming stores give the same bits", "%s ldc %d tb %d: %s, guard %s",
                     isa, ldc, tb, same ? "equal" : "DIFFER", guard ? "intact" : "WRITTEN");
            bk_free(C0), bk_free(C1);
        }
    free(A), free(B), free(pk);
}

/* bki_gemm with an output large enough to stream, in bk_alloc'd (aligned)
 * memory, on a team of two: the same bits as the kernel's ordinary stores */
static void stream_product(void)
{
    th_rng r = {0x57e5u};
    const int M = 65536 + 5, N = 64, K = 24;
    float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * K * N);
    float *C0 = malloc(sizeof(float) * (size_t)M * N), *C1 = bk_alloc(sizeof(float) * (size_t)M * N);
    fill(&r, A, (size_t)M * K);
    fill(&r, B, (size_t)K * N);
    bki_kern()->gemm->thin(0, 0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C0, N, NULL, 0, 0);
        gemm_call g = {0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C1, N, NULL, NULL};
    bki_parallel(2, gemm_member, &g);
    th_check(!memcmp(C0, C1, sizeof(float) * (size_t)M * N), "gemm: a streamed 4M-float output",
             "%dx%dx%d on %s: same bits as ordinary stores", M, N, K, bk_isa());
    free(A), free(B), free(C0), bk_free(C1);
}

/* bki_gemm_ep's epilogue: on the thin kernel's rows-streamed route it runs
 * on each block of micro-tile rows as the kernel stores them (K chunks
 * included), on the other routes on each tile. Either way every output
 * element must pass through it exactly once, with its own coordinates,
 * after its whole product: the result is bitwise that of bki_gemm followed
 * by the same function, on teams of one to three. */
typedef struct {
    unsigned char *seen;
    int N;
} ep_probe;
static void ep_mark(void *arg, int i0, int j0, int mi, int nj, float *Ct, ptrdiff_t ldc)
{
    ep_probe *p = arg;
    for (int i = 0; i < mi; i++)
        for (int j = 0; j < nj; j++) {
            Ct[(ptrdiff_t)i * ldc + j] = Ct[(ptrdiff_t)i * ldc + j] * 0.5f + (float)((i0 + i) * 3 + (j0 + j));
            p->seen[(size_t)(i0 + i) * p->N + (j0 + j)]++;
        }
}
static void ep_case(int ta, int tb, int M, int N, int K)
{
    th_rng r = {0xe9u + (unsigned)(M + N + K)};
    const int lda = ta ? M : K, ldb = tb ? K : N;
    const size_t mn = (size_t)M * N;
    float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)K * N);
    float *C0 = malloc(sizeof(float) * mn), *C1 = malloc(sizeof(float) * mn);
    unsigned char *seen = malloc(mn);
    fill(&r, A, (size_t)M * K);
    fill(&r, B, (size_t)K * N);
    bki_gemm(&BKI_SOLO, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C0, N);
    ep_probe p0 = {seen, N};
    ep_mark(&p0, 0, 0, M, N, C0, N); /* the reference: the same function once over the whole output */
    for (int nt = 1; nt <= 3; nt++) {
        memset(seen, 0, mn);
        ep_probe p = {seen, N};
        gemm_call g = {ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C1, N, ep_mark, &p};
        bki_parallel(nt, gemm_member, &g);
        int once = 1;
        for (size_t e = 0; e < mn; e++) once &= seen[e] == 1;
        const int same = !memcmp(C0, C1, sizeof(float) * mn);
        th_check(once && same, "gemm epilogue: every element once, after its product",
                 "ta %d tb %d %dx%dx%d, %d member(s): %s, %s", ta, tb, M, N, K, nt,
                 once ? "each element once" : "NOT ONCE", same ? "bitwise equal" : "DIFFER");
    }
    free(A), free(B), free(C0), free(C1), free(seen);
}

void test_gemm(void)
{
    if (TH.filter && !strstr("gemm", TH.filter)) return;
    kernel_cases(&bki_gemm_kernels_avx2, "avx2");
    if (!strcmp(bk_isa(), "avx512")) kernel_cases(&bki_gemm_kernels_avx512, "avx512");
    else printf("SKIP gemm thin avx512: this CPU (or BK_ISA) runs the avx2 kernels only\n");
    team_case(0, 1, 4099, 32, 64);   /* thin, rows streamed */
    team_case(1, 0, 40, 3001, 48);   /* thin, columns streamed */
    team_case(0, 1, 3000, 100, 64);  /* thin, rows streamed, two column tiles: the packed panel changes tile by tile */
    team_case(0, 0, 60, 5000, 40);   /* thin, columns streamed, op(A) packed and reused along the columns */
    team_case(0, 0, 700, 300, 700);  /* thin, 112-column tiles, K in chunks */
    team_case(1, 0, 130, 70, 1500);  /* a weight gradient's shape: op(A) transposed, K in chunks */
    team_case(0, 1, 700, 600, 100);  /* thin: 120-column tiles where the shape's tiles were 200 wide */
    team_case(0, 1, 700, 600, 200);  /* BLAS: 200-column tiles (a packed 128-column panel of K = 200 is too large) */
    team_case(0, 0, 700, 600, 300);  /* BLAS: 200-column tiles (K = 300 > 128: too long to cut the columns) */
    stream_case(&bki_gemm_kernels_avx2, "avx2");
    if (!strcmp(bk_isa(), "avx512")) stream_case(&bki_gemm_kernels_avx512, "avx512");
    stream_product();
    ep_case(0, 1, 3200, 256, 128); /* rows streamed, 128-column tiles, K in chunks (the MLP's first Linear) */
    ep_case(0, 0, 1003, 100, 37);  /* rows streamed, a row remainder of the micro-tile, one chunk */
    ep_case(1, 0, 40, 3001, 48);   /* columns streamed: the epilogue on each tile */
    ep_case(0, 1, 700, 600, 200);  /* BLAS tiles */
}
