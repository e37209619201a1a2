/* threads.c -- the parallel model: the default thread count and the current
 * context's (as bk_context_use tells it: bki_core_use), the plan of a call's problems
 * over threads, the entry and exit of every parallel region (floating-point
 * mode, BLAS threads), the one problem runner, and the run-time choice of
 * the kernel instruction set. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "internal.h"

#include <cblas.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <xmmintrin.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* OpenBLAS's own queries (declared here: Debian's cblas.h has them, other
 * CBLAS headers may not). */
extern int openblas_get_parallel(void);
extern int openblas_get_num_threads(void);
extern void openblas_set_num_threads(int);

/* ---- how many CPUs the process may really use ------------------------- */

/* the quota of one cgroup directory in CPUs (rounded up), or 0 for none */
static int dir_quota(const char *dir, int v1)
{
    char path[4096 + 32]; /* dir (under 4096) and a file name */
    long q = -1, per = 0;
    if (v1) {
        snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
        FILE *f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld", &q) != 1) q = -1;
            fclose(f);
        }
        snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
        f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld", &per) != 1) per = 0;
            fclose(f);
        }
    } else {
        snprintf(path, sizeof path, "%s/cpu.max", dir);
        FILE *f = fopen(path, "r");
        if (f) {
            char qs[32] = "";
            if (fscanf(f, "%31s %ld", qs, &per) == 2 && strcmp(qs, "max") != 0) q = strtol(qs, NULL, 10);
            fclose(f);
        }
    }
    if (q <= 0 || per <= 0) return 0;
    const long n = (q + per - 1) / per;
    return n < 1 ? 1 : n > 4096 ? 4096 : (int)n;
}

int bki_cpu_quota_from(const char *proc_cgroup, const char *root)
{
    int best = 0;
    for (const char *line = proc_cgroup; line && *line;) {
        const char *end = strchr(line, '\n');
        const size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[4096];
        if (len < sizeof buf) {
            memcpy(buf, line, len);
            buf[len] = '\0';
            char *c1 = strchr(buf, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (c2) {
                *c1 = *c2 = '\0';
                const char *ctrl = c1 + 1, *cg = c2 + 1;
                int v1 = 0, use = !strcmp(buf, "0") && !*ctrl; /* v2: "0::/path" */
                for (const char *t = ctrl; *ctrl && t;) { /* v1: a "cpu" controller */
                    const char *comma = strchr(t, ',');
                    const size_t tl = comma ? (size_t)(comma - t) : strlen(t);
                    if (tl == 3 && !strncmp(t, "cpu", 3)) use = v1 = 1;
                    t = comma ? comma + 1 : NULL;
                }
                for (int pass = 0; use && pass < (v1 ? 2 : 1); pass++) {
                    char dir[4096];
                    /* v1 mounts the controller as cpu,cpuacct (or cpu); v2 is one tree */
                    int w = v1 ? snprintf(dir, sizeof dir, "%s/%s%s", root, pass ? "cpu" : ctrl, cg)
                               : snprintf(dir, sizeof dir, "%s%s", root, cg);
                    if (w <= 0 || (size_t)w >= sizeof dir) break;
                    const size_t base = strlen(root) + (v1 ? strlen(pass ? "cpu" : ctrl) + 1 : 0);
                    /* the cgroup and every ancestor up to the root: the tightest quota holds */
                    for (;;) {
                        const int n = dir_quota(dir, v1);
                        if (n > 0 && (best == 0 || n < best)) best = n;
                        char *slash = strrchr(dir, '/');
                        if (!slash || (size_t)(slash - dir) < base) break;
                        *slash = '\0';
                        if (strlen(dir) < base) break;
                    }
                }
            }
        }
        line = end ? end + 1 : NULL;
    }
    return best;
}

/* the cgroup CPU quota of this process in CPUs, or 0 for none */
static int cgroup_quota(void)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return 0;
    char text[8192];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    return bki_cpu_quota_from(text, "/sys/fs/cgroup");
}

int bki_cpus(void)
{
    static _Atomic int cached;
    int n = cached;
    if (n > 0) return n;
    cpu_set_t set;
    n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (n < 1) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    cached = n;
    return n;
}

int bki_default_threads(void)
{
    static _Atomic int cached;
    int n = cached;
    if (n > 0) return n;
    const char *env = getenv("BIRKHOFF_NUM_THREADS");
    char *end = NULL;
    long v = env ? strtol(env, &end, 10) : 0;
    if (env && end != env && *end == '\0' && v > 0) {
        n = v > 1024 ? 1024 : (int)v;
    } else {
        n = bki_cpus();
        const int quota = cgroup_quota(); /* a container's cpu.max, a cgroup's quota */
        if (quota > 0 && quota < n) n = quota;
    }
    cached = n;
    return n;
}

/* ---- the calling thread's current context, as bk_context_use tells it ---- */
static _Atomic int g_default_threads;               /* the default context's count */
static _Thread_local const _Atomic int *tl_threads; /* NULL: the default context   */
static _Thread_local int tl_device;                 /* BK_DEVICE_HOST (0)          */

void bki_core_use(const _Atomic int *threads, int device)
{
    tl_threads = threads;
    tl_device = device;
}

_Atomic int *bki_default_threads_cell(void) { return &g_default_threads; }

int bki_threads(void)
{
    const int n = *(tl_threads ? tl_threads : &g_default_threads);
    return n > 0 ? n : bki_default_threads();
}

int bki_ctx_device(void) { return tl_device; }

int bk_get_num_threads(void) { return bki_threads(); }

int bki_work_threads(int problems)
{
    int nt = bki_threads();
    return problems < 1 ? 1 : (problems < nt ? problems : nt);
}

/* Team mode only pays when a problem's passes outweigh a few barriers. */
#define BKI_TEAM_MIN_COST 32768.0

bki_plan bki_plan_problems(int P, double cost)
{
    const int nt = bki_threads();
    bki_plan pl = {bki_work_threads(P), bki_work_threads(P), 0};
    if (nt > 1 && cost >= BKI_TEAM_MIN_COST && (P < nt || (P % nt != 0 && P < 4 * nt))) {
        pl.nt = nt;
        pl.lanes = 1;
        pl.team = 1;
    }
    return pl;
}

/* ---- BLAS on one thread ------------------------------------------------- *
 * Every GEMM the library makes is one tile of its own partition, called from
 * inside its own parallel region, and must run on the calling thread alone.
 * OpenBLAS's OpenMP build does that by itself inside an active region, and
 * inside a one-thread region once the member's own nthreads ICV is 1 (set by
 * bki_region_enter: it lasts until the region ends, nothing process-wide
 * changes). OpenBLAS's pthreads build (Debian's default) has only a
 * process-wide setting: the library sets it to 1 the first time it needs
 * BLAS, once, and leaves it there (docs/ARCHITECTURE.md: a numpy in the same
 * process then runs its BLAS on one thread; Debian's libopenblas0-openmp
 * avoids that). */
static int blas_kind(void)
{
    static _Atomic int kind = -1; /* 0 sequential, 1 pthreads, 2 OpenMP */
    int k = kind;
    if (k < 0) {
        k = openblas_get_parallel();
        if (k == 1 && openblas_get_num_threads() != 1) openblas_set_num_threads(1);
        kind = k;
    }
    return k;
}

unsigned bki_region_enter(void)
{
    const unsigned saved = _mm_getcsr();
    _mm_setcsr(saved | 0x8040u); /* FTZ (bit 15) | DAZ (bit 6) */
#ifdef _OPENMP
    if (blas_kind() == 2) omp_set_num_threads(1);
#else
    (void)blas_kind();
#endif
    return saved;
}

void bki_region_leave(const unsigned *saved) { _mm_setcsr(*saved); }

typedef struct {
    bki_plan pl;
    int P;
    char *lanes;
    size_t lane_bytes;
    bki_problem_fn fn;
    void *ctx;
} problems;

/* a team on one problem after another, or problems claimed one at a time
 * by members working alone (each in its own lane: a problem's result does
 * not depend on the lane it ran in) */
static void problems_member(void *arg)
{
    const problems *r = arg;
    if (r->pl.team) {
        const bki_team tm = bki_region_team();
        for (int p = 0; p < r->P; p++) {
            r->fn(&tm, p, r->lanes, r->ctx);
            bki_team_sync(&tm);
        }
    } else {
        char *lane = r->lanes ? r->lanes + (size_t)bki_thread_id() * r->lane_bytes : NULL;
        bki_claims cl = bki_claims_open(&(bki_team){bki_thread_id(), bki_region_size()}, r->P);
        for (int64_t p; bki_claims_next(&cl, &p);) r->fn(&BKI_SOLO, (int)p, lane, r->ctx);
    }
}

void bki_run_problems(bki_plan pl, int P, char *lanes, size_t lane_bytes, bki_problem_fn fn, void *ctx)
{
    problems r = {pl, P, lanes, lane_bytes, fn, ctx};
    if (pl.team) bki_parallel(pl.nt, problems_member, &r);
    else bki_parallel_claimed(pl.nt, problems_member, &r); /* problems claimed, no barrier */
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
