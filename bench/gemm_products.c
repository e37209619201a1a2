/* gemm_products.c -- the training step's Linear products and LayerNorm
 * backward, timed alone on one thread (docs/PERFORMANCE.md, "Thin column
 * tiles, row groups, one-pass LayerNorm, quiet engine").
 *
 *   make bench-gemm && build/gemm_products [rows]
 *   build/gemm_products --wide
 *   build/gemm_products --cold [rows]
 *
 * For each Linear of the benchmark's ViT (dim 128, MLP 256, QKV 384; rows =
 * batch 64 x 50 tokens = 3200 by default): the forward y = x W^T, the input
 * gradient dx = dy W and the weight gradient dW += dy^T x, each one
 * bki_gemm over a one-member team inside a one-thread region (the
 * library's own tiles and kernels, BLAS on the calling thread),
 * then LayerNorm's backward over rows x 128 on the library's threads. The
 * operands (1.6-4.9 MB) come from L3, as in the step. Best of 40 runs,
 * GFLOP/s against the FMA peak measured in the same run. --wide: products
 * with wide outputs (M x N x K, no transposes) on the library's threads,
 * where K decides between the thin kernel's 128-column tiles and OpenBLAS
 * (src/core/gemm.c). --cold: 64 MiB written between products, so that
 * every operand comes from memory, as a saved activation does in the step's
 * backward (best of 12). A development
 * benchmark: it calls the library's internal entry points (src/core), so it
 * links the static library. */
#include "../src/core/internal.h"
#include "../src/nn/layers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *filled(size_t n, unsigned seed)
{
    float *p = bk_alloc(n * sizeof(float));
    if (!p) return NULL;
    for (size_t i = 0; i < n; i++) p[i] = (float)(((i + seed) * 2654435761u) % 1000u) / 1000.0f - 0.5f;
    return p;
}

/* M x N x K products on the library's threads (bki_gemm over a team of the
 * region), best of 8 */
typedef struct {
    int M, N, K;
    const float *A, *B;
    float *C;
} square_args;

static void square_member(void *arg)
{
    const square_args *g = arg;
    const bki_team tm = bki_region_team();
    bki_gemm(&tm, 0, 0, g->M, g->N, g->K, 1.0f, g->A, g->K, g->B, g->N, 0.0f, g->C, g->N);
}

static int wide(void)
{
    const int shapes[][3] = {{3200, 2048, 512}, {1024, 1024, 1024}, {3200, 512, 2048},
                             {3200, 2048, 128}, {3200, 1024, 64},   {3200, 1536, 96}};
    printf("# wide products, %d threads, kernels %s (GFLOP/s)\n", bk_get_num_threads(), bk_isa());
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *A = filled((size_t)M * K, 1), *B = filled((size_t)K * N, 2), *C = filled((size_t)M * N, 3);
        if (!A || !B || !C) {
            bk_free(A), bk_free(B), bk_free(C);
            fprintf(stderr, "gemm_products: out of memory\n");
            return 1;
        }
        double best = 1e30;
        for (int rep = 0; rep < 8; rep++) {
            const double t0 = now_s();
            square_args g = {M, N, K, A, B, C};
            bki_parallel(bk_get_num_threads(), square_member, &g);
            const double t = now_s() - t0;
            if (t < best) best = t;
        }
        printf("%5d x %5d x %5d   %6.1f\n", M, N, K, 2.0 * M * N * K / best * 1e-9);
        bk_free(A), bk_free(B), bk_free(C);
    }
    return 0;
}

/* writes one float in every line of n (64 MiB: more than every cache), so
 * that the caches hold none of the operands afterwards */
static void evict(float *buf, size_t n)
{
    if (!buf) return;
    for (size_t i = 0; i < n; i += 16) buf[i] += 1.0f;
}

typedef struct {
    int R, in, out, reps;
    const float *x, *W;
    float *y;
    const float *dy;
    float *dx, *dW, *ev;
    size_t nev;
    double *best;
} linear_args;

/* the three products of one Linear on one thread, best of reps */
static void linear_member(void *arg)
{
    const linear_args *a = arg;
    const bki_team one = {0, 1};
    const int R = a->R, in = a->in, out = a->out;
    for (int rep = 0; rep < a->reps; rep++) {
        double t[3];
        for (int k = 0; k < 3; k++) {
            evict(a->ev, a->nev);
            const double t0 = now_s();
            if (k == 0) bki_gemm(&one, 0, 1, R, out, in, 1.0f, a->x, in, a->W, in, 0.0f, a->y, out);
            else if (k == 1) bki_gemm(&one, 0, 0, R, in, out, 1.0f, a->dy, out, a->W, in, 0.0f, a->dx, in);
            else bki_gemm(&one, 1, 0, out, in, R, 1.0f, a->dy, out, a->x, in, 1.0f, a->dW, in);
            t[k] = now_s() - t0;
        }
        for (int k = 0; k < 3; k++)
            if (t[k] < a->best[k]) a->best[k] = t[k];
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--wide")) return wide();
    const int cold = argc > 1 && !strcmp(argv[1], "--cold");
    if (cold) argc--, argv++;
    const int R = argc > 1 ? atoi(argv[1]) : 3200;
    if (R < 1 || R > (1 << 22)) {
        fprintf(stderr, "gemm_products: rows must be in [1, 4194304] (got %s)\n", argv[1]);
        return 2;
    }
    double gflops, gexps;
    bk_machine_peak(1.0, &gflops, &gexps); /* this core */
    const double peak = gflops * 1e9;
    const size_t nev = cold ? (size_t)16 << 20 : 0;
    float *ev = cold ? filled(nev, 99) : NULL;
    if (cold && !ev) {
        fprintf(stderr, "gemm_products: out of memory\n");
        return 1;
    }
    const int reps = cold ? 12 : 40;
    printf("# %d rows, one thread, kernels %s, FMA peak %.1f GFLOP/s a core%s\n", R, bk_isa(), gflops,
           cold ? ", operands from memory (--cold)" : "");
    printf("# Linear (in -> out)     fwd GF/s     dx GF/s     dW GF/s\n");
    const int shapes[][2] = {{128, 384}, {128, 128}, {128, 256}, {256, 128}};
    const char *names[] = {"QKV", "proj", "fc1", "fc2"};
    int rc = 0;
    for (int s = 0; s < 4 && !rc; s++) {
        const int in = shapes[s][0], out = shapes[s][1];
        float *x = filled((size_t)R * in, 1), *W = filled((size_t)out * in, 2), *y = filled((size_t)R * out, 3);
        float *dy = filled((size_t)R * out, 4), *dx = filled((size_t)R * in, 5), *dW = filled((size_t)out * in, 6);
        if (!x || !W || !y || !dy || !dx || !dW) {
            fprintf(stderr, "gemm_products: out of memory\n");
            rc = 1;
        } else {
            double best[3] = {1e30, 1e30, 1e30};
            /* inside a one-thread region, as the library calls its GEMMs
             * (FTZ/DAZ set, BLAS kept on the calling thread) */
            linear_args la = {R, in, out, reps, x, W, y, dy, dx, dW, ev, nev, best};
            bki_parallel(1, linear_member, &la);
            const double f = 2.0 * R * in * out;
            printf("%-5s %3d -> %3d        %6.1f      %6.1f      %6.1f   (%.0f / %.0f / %.0f %% of peak)\n", names[s],
                   in, out, f / best[0] * 1e-9, f / best[1] * 1e-9, f / best[2] * 1e-9, 100.0 * f / best[0] / peak,
                   100.0 * f / best[1] / peak, 100.0 * f / best[2] / peak);
        }
        bk_free(x), bk_free(W), bk_free(y), bk_free(dy), bk_free(dx), bk_free(dW);
    }
    if (!rc) { /* LayerNorm backward, rows x 128, the library's threads */
        const int C = 128;
        float *x = filled((size_t)R * C, 7), *dy = filled((size_t)R * C, 8), *dx = filled((size_t)R * C, 9);
        float *g = filled(C, 10), *b = filled(C, 11), *y = filled((size_t)R * C, 12);
        float *mu = filled((size_t)R, 13), *rs = filled((size_t)R, 14), *dg = filled(C, 15), *db = filled(C, 16);
        if (!x || !dy || !dx || !g || !b || !y || !mu || !rs || !dg || !db) {
            fprintf(stderr, "gemm_products: out of memory\n");
            rc = 1;
        } else {
            bki_layernorm_fwd(R, C, x, g, b, 1e-5f, y, mu, rs);
            double best = 1e30;
            for (int rep = 0; rep < 40; rep++) {
                const double t0 = now_s();
                bki_layernorm_bwd(R, C, x, mu, rs, g, dy, dx, dg, db);
                const double t = now_s() - t0;
                if (t < best) best = t;
            }
            printf("LayerNorm backward %d x %d, %d threads: %.3f ms\n", R, C, bk_get_num_threads(), best * 1e3);
        }
        bk_free(x), bk_free(dy), bk_free(dx), bk_free(g), bk_free(b), bk_free(y), bk_free(mu), bk_free(rs);
        bk_free(dg), bk_free(db);
    }
    bk_free(ev);
    return rc;
}
