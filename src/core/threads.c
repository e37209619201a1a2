/* threads.c -- the thread-count setting (the library's only mutable global)
 * and the run-time choice of the kernel instruction set. */
#include "internal.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static int g_threads; /* 0 = OpenMP default */

void bk_set_num_threads(int n) { g_threads = n > 0 ? n : 0; }

int bki_threads(void)
{
    if (g_threads > 0) return g_threads;
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

int bk_get_num_threads(void) { return bki_threads(); }

int bki_work_threads(int problems)
{
    int nt = bki_threads();
    return problems < 1 ? 1 : (problems < nt ? problems : nt);
}

int bki_region_threads(int problems, int nt)
{
    /* One problem and several threads: the problem runs on one thread and
     * BLAS gets all of them. OpenBLAS splits sgemm over the rows and columns
     * of C only (never over K), so every element is computed the same way
     * whatever its thread count: results stay bitwise identical (tested). */
    (void)nt;
    const int all = bki_threads();
    if (problems == 1 && all > 1) {
        if (openblas_get_num_threads() != all) openblas_set_num_threads(all);
        return 1;
    }
    bki_blas_single_thread();
    return bki_work_threads(problems);
}

void bki_blas_single_thread(void)
{
    /* Our parallel regions call BLAS from each thread: it must not spawn
     * threads of its own (oversubscription, and one code path per problem
     * whatever the thread count). */
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

/* The kernel table is a pure function of the CPU (and BK_ISA), computed on
 * first use; concurrent first calls compute the same value. */
const bki_kernels *bki_kern(void)
{
    static const bki_kernels *_Atomic chosen;
    const bki_kernels *k = chosen;
    if (k) return k;
    const char *env = getenv("BK_ISA");
    int want512 = !(env && strcmp(env, "avx2") == 0);
    __builtin_cpu_init();
    if (want512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
        k = &bki_kernels_avx512;
    else
        k = &bki_kernels_avx2;
    chosen = k;
    return k;
}

const char *bk_isa(void) { return bki_kern()->name; }

size_t bki_hist_off(int n, int m, int t)
{
    /* h_1 (n), h_2 (m), h_3 (n), ...: before h_t come ceil((t-1)/2) row
     * vectors and floor((t-1)/2) column vectors */
    size_t rows = (size_t)(t / 2), cols = (size_t)((t - 1) / 2);
    return rows * (size_t)n + cols * (size_t)m;
}

size_t bki_hist_len(int n, int m, int S) { return bki_hist_off(n, m, S + 1); }

void bk_vexp(float *x, size_t n)
{
    if (x) bki_kern()->vexp(x, n);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void bk_machine_peak(double seconds, double *gflops, double *gexps)
{
    const bki_kernels *k = bki_kern();
    _Alignas(64) float buf[4096];
    for (int i = 0; i < 4096; i++) buf[i] = -(float)(i % 97) * 0.1f;
    double best_f = 0, best_e = 0;
    /* several short rounds; keep the best (the machine is shared and noisy) */
    for (int round = 0; round < 5; round++) {
        long it = 1 << 16;
        double t0 = now_s(), fl = 0;
        while (now_s() - t0 < seconds / 10) fl += k->fma_probe(it);
        double r = fl / (now_s() - t0);
        best_f = r > best_f ? r : best_f;
        t0 = now_s();
        double ex = 0;
        while (now_s() - t0 < seconds / 10) ex += k->exp_probe(64, buf);
        r = ex / (now_s() - t0);
        best_e = r > best_e ? r : best_e;
    }
    if (gflops) *gflops = best_f * 1e-9;
    if (gexps) *gexps = best_e * 1e-9;
}

int bki_thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
