/* test_pool.c -- the library's threads (src/core/pool.c): regions, the
 * barrier, claimed blocks (every block exactly once, each member's share
 * first), ordered sections in order, nested regions, regions opened by two
 * threads of the caller at once, members descheduled at random; the cgroup
 * CPU quota reader (src/core/threads.c). */
#define _GNU_SOURCE
#include "../harness.h"
#include "../tutil.h"
#include "../../src/core/internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LOOPS 40
#define MAXB 300

typedef struct {
    _Atomic int hits[LOOPS][MAXB]; /* how often each block of each loop ran */
    _Atomic int order_bad, phase_bad, members;
    _Atomic int64_t ord_seen[LOOPS];
    int nblocks[LOOPS];
    int ordered[LOOPS];
    int sleepy; /* members sleep at random: the kernel descheduling them */
    _Atomic int64_t phase;
} claim_run;

static void nap(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    if ((*seed >> 16) % 7 == 0) {
        struct timespec ts = {0, (long)((*seed >> 8) % 300) * 1000};
        nanosleep(&ts, NULL);
    }
}

static void claim_member(void *arg)
{
    claim_run *r = arg;
    const bki_team tm = bki_region_team();
    unsigned seed = 977u * (unsigned)(tm.tid + 1);
    atomic_fetch_add(&r->members, 1);
    for (int l = 0; l < LOOPS; l++) {
        if (r->sleepy) nap(&seed);
        bki_claims cl = r->ordered[l] ? bki_claims_open_ordered(&tm, r->nblocks[l]) : bki_claims_open(&tm, r->nblocks[l]);
        for (int64_t b; bki_claims_next(&cl, &b);) {
            if (b < 0 || b >= r->nblocks[l]) atomic_store(&r->order_bad, 1);
            else atomic_fetch_add(&r->hits[l][b], 1);
            if (r->sleepy) nap(&seed);
            if (r->ordered[l]) {
                bki_ordered_begin(&cl, b);
                if (atomic_load(&r->ord_seen[l]) != b) atomic_store(&r->order_bad, 1);
                atomic_store(&r->ord_seen[l], b + 1);
                bki_ordered_end(&cl, b);
            }
        }
        if (l % 5 == 4) { /* a barrier: every member sees every block of the loops before */
            bki_team_sync(&tm);
            for (int k = 0; k <= l; k++)
                for (int b = 0; b < r->nblocks[k]; b++)
                    if (atomic_load(&r->hits[k][b]) != 1) atomic_store(&r->phase_bad, 1);
            bki_team_sync(&tm);
        }
    }
}

static void test_claims(void)
{
    const int nts[] = {1, 2, 3, 5, 8};
    for (int sleepy = 0; sleepy < 2; sleepy++)
        for (size_t ti = 0; ti < sizeof nts / sizeof *nts; ti++) {
            claim_run *r = calloc(1, sizeof *r);
            th_rng g = {0xC1A1u + ti};
            for (int l = 0; l < LOOPS; l++) {
                r->nblocks[l] = (int)(th_next(&g) % MAXB); /* 0 and fewer blocks than members included */
                if (l % 9 == 0) r->nblocks[l] = l % 2;
                r->ordered[l] = l % 4 == 1;
            }
            r->sleepy = sleepy;
            bki_parallel(nts[ti], claim_member, r);
            int once = 1;
            for (int l = 0; l < LOOPS; l++)
                for (int b = 0; b < r->nblocks[l]; b++) once &= atomic_load(&r->hits[l][b]) == 1;
            th_check(once && !r->order_bad && !r->phase_bad && atomic_load(&r->members) == nts[ti],
                     "pool: claimed blocks", "%d members%s: every block of %d loops exactly once %s, ordered sections "
                     "in order %s, complete at each barrier %s, members %d",
                     nts[ti], sleepy ? " napping at random" : "", LOOPS, once ? "yes" : "NO",
                     r->order_bad ? "NO" : "yes", r->phase_bad ? "NO" : "yes", atomic_load(&r->members));
            free(r);
        }
}

/* BKI_FOR covers [0, n) once, for n around the chunking's edges */
typedef struct {
    int64_t n;
    _Atomic int *hit;
} for_run;

static void for_member(void *arg)
{
    for_run *r = arg;
    BKI_FOR(i, r->n) atomic_fetch_add(&r->hit[i], 1);
}

/* a claimed region whose workers start late: skipped or not, every
 * iteration once */
static void late_member(void *arg)
{
    if (bki_thread_id() != 0) {
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    for_member(arg);
}

static void test_claimed_region(void)
{
    int ok = 1;
    for (int nt = 2; nt <= 5; nt++)
        for (int rep = 0; rep < 20; rep++) {
            const int64_t n = 50 + 37 * rep;
            for_run r = {n, calloc((size_t)n, sizeof(_Atomic int))};
            bki_parallel_claimed(nt, late_member, &r);
            for (int64_t i = 0; i < n; i++) ok &= atomic_load(&r.hit[i]) == 1;
            free(r.hit);
        }
    th_check(ok, "pool: a claimed region with late workers", "%s",
             "every iteration exactly once, 2-5 members, workers starting 200 us late (skipped or joined)");
}

static void test_for(void)
{
    const int64_t ns[] = {0, 1, 2, 7, 15, 16, 17, 63, 64, 65, 1000, 4099};
    int ok = 1;
    for (int nt = 1; nt <= 5; nt++)
        for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
            for_run r = {ns[k], calloc((size_t)ns[k] + 1, sizeof(_Atomic int))};
            bki_parallel(nt, for_member, &r);
            for (int64_t i = 0; i < ns[k]; i++) ok &= atomic_load(&r.hit[i]) == 1;
            free(r.hit);
        }
    th_check(ok, "pool: BKI_FOR", "%s", "every iteration exactly once, 1-5 members, n from 0 to 4099");
}

/* a region inside a region runs on its caller alone */
typedef struct {
    _Atomic int inner_size, inner_bad;
} nest_run;

static void inner_member(void *arg)
{
    nest_run *r = arg;
    atomic_fetch_add(&r->inner_size, 1);
    if (bki_thread_id() != 0 || bki_region_size() != 1) atomic_store(&r->inner_bad, 1);
}

static void outer_member(void *arg)
{
    const int tid = bki_thread_id(), nt = bki_region_size();
    bki_parallel(4, inner_member, arg);
    if (bki_thread_id() != tid || bki_region_size() != nt) atomic_store(&((nest_run *)arg)->inner_bad, 1);
}

static void test_nested(void)
{
    nest_run r = {0, 0};
    bki_parallel(3, outer_member, &r);
    th_check(atomic_load(&r.inner_size) == 3 && !atomic_load(&r.inner_bad) && bki_region_size() == 1 &&
                 bki_thread_id() == 0,
             "pool: nested regions", "3 outer members each ran one inner member alone (%d), member ids restored",
             atomic_load(&r.inner_size));
}

/* two threads of the caller run Sinkhorn attention (a team on one problem)
 * at once, each on the library's threads: both bitwise the result alone */
typedef struct {
    const float *q, *k, *v;
    float *o;
    int N, d, reps;
    bk_status s;
} sk_job;

static void *sk_thread(void *arg)
{
    sk_job *j = arg;
    bk_set_num_threads(2);
    bk_attn_desc desc = {1, 1, j->N, j->N, j->d, j->d, NULL, NULL};
    bk_sinkhorn_config p = bk_sinkhorn_config_default();
    p.iters = 5;
    bk_tensor tq = bk_tensor_bhnd((float *)j->q, 1, j->N, j->d), tk = bk_tensor_bhnd((float *)j->k, 1, j->N, j->d);
    bk_tensor tv = bk_tensor_bhnd((float *)j->v, 1, j->N, j->d), to = bk_tensor_bhnd(j->o, 1, j->N, j->d);
    for (int r = 0; r < j->reps && !j->s; r++) j->s = bk_sinkhorn_forward(&desc, &p, &tq, &tk, &tv, &to, NULL, NULL, NULL, 0);
    return NULL;
}

static void test_concurrent_callers(void)
{
    const int N = 384, d = 32;
    const size_t n = (size_t)N * d;
    float *q = malloc(4 * n), *k = malloc(4 * n), *v = malloc(4 * n);
    float *o0 = malloc(4 * n), *o1 = malloc(4 * n), *o2 = malloc(4 * n);
    th_rng g = {0x7701u};
    for (size_t i = 0; i < n; i++) q[i] = (float)th_normal(&g), k[i] = (float)th_normal(&g), v[i] = (float)th_normal(&g);
    sk_job alone = {q, k, v, o0, N, d, 1, BK_OK};
    sk_thread(&alone); /* on this thread, alone */
    sk_job a = {q, k, v, o1, N, d, 6, BK_OK}, b = {q, k, v, o2, N, d, 6, BK_OK};
    pthread_t ta, tb;
    const int started = !pthread_create(&ta, NULL, sk_thread, &a) && !pthread_create(&tb, NULL, sk_thread, &b);
    if (started) {
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
    }
    th_check(started && !alone.s && !a.s && !b.s && !memcmp(o0, o1, 4 * n) && !memcmp(o0, o2, 4 * n),
             "pool: two callers at once", "two threads of the caller, each Sinkhorn on 2 threads 6 times at once: %s",
             !memcmp(o0, o1, 4 * n) && !memcmp(o0, o2, 4 * n) ? "both bitwise the result alone" : "DIFFER");
    free(q), free(k), free(v), free(o0), free(o1), free(o2);
}

/* ---- the cgroup CPU quota ----------------------------------------------- */

static void put(const char *dir, const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_quota(void)
{
    char root[] = "/tmp/bk_cgroupXXXXXX";
    if (!mkdtemp(root)) {
        th_check(0, "cgroup quota", "%s", "mkdtemp failed");
        return;
    }
    char d1[256], d2[256], v1[256], v1a[256];
    snprintf(d1, sizeof d1, "%s/user.slice", root);
    snprintf(d2, sizeof d2, "%s/user.slice/job", root);
    snprintf(v1, sizeof v1, "%s/cpu,cpuacct", root);
    snprintf(v1a, sizeof v1a, "%s/cpu,cpuacct/box", root);
    mkdir(d1, 0700), mkdir(d2, 0700), mkdir(v1, 0700), mkdir(v1a, 0700);
    put(root, "cpu.max", "max 100000\n");
    put(d1, "cpu.max", "150000 100000\n"); /* 1.5 CPUs: 2 threads */
    put(d2, "cpu.max", "max 100000\n");
    const int a = bki_cpu_quota_from("0::/user.slice/job\n", root);
    put(d2, "cpu.max", "50000 100000\n"); /* half a CPU: 1 */
    const int b = bki_cpu_quota_from("0::/user.slice/job\n", root);
    const int c = bki_cpu_quota_from("0::/\n", root); /* root: no limit */
    put(v1a, "cpu.cfs_quota_us", "300000\n");
    put(v1a, "cpu.cfs_period_us", "100000\n");
    put(v1, "cpu.cfs_quota_us", "-1\n");
    put(v1, "cpu.cfs_period_us", "100000\n");
    const int e = bki_cpu_quota_from("12:memory:/box\n4:cpu,cpuacct:/box\n1:name=systemd:/box\n", root);
    const int f = bki_cpu_quota_from("garbage without colons\n\n::\n", root);
    th_check(a == 2 && b == 1 && c == 0 && e == 3 && f == 0, "cgroup quota",
             "v2 ancestor 1.5 CPUs -> %d (2), own 0.5 -> %d (1), none -> %d (0), v1 3 CPUs -> %d (3), garbage -> %d (0)",
             a, b, c, e, f);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "test_pool: could not remove %s\n", root);
}

void test_pool(void)
{
    if (TH.filter && !strstr("pool", TH.filter)) return;
    test_claims();
    test_for();
    test_claimed_region();
    test_nested();
    test_concurrent_callers();
    test_quota();
}
