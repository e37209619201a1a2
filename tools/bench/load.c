/* load.c -- `birkhoff bench --load N` and `--load-job N`: competing load of
 * the bench's own making, so that speed on a busy machine is measured as
 * users meet it (docs/PERFORMANCE.md, "On a busy machine"). The loads are
 * child processes forked before the bench starts any thread: --load N runs N
 * busy single-threaded loops (a compiler, a DataLoader worker), --load-job N
 * runs N multi-threaded birkhoff jobs (Sinkhorn attention, B*H = 4, N = 1024,
 * d = 64, S = 5, forward and backward in a loop on every core the process
 * may use: a second experiment beside this one). Each child dies with the
 * bench (PR_SET_PDEATHSIG) and is killed and reaped when it ends. */
#define _GNU_SOURCE
#include "../cli.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define LOAD_MAX 64

static void busy_loop(void)
{
    volatile double x = 1.0;
    for (;;)
        for (int i = 0; i < 1000000; i++) x = x * 1.0000001 + 1e-9;
}

static void job_loop(void)
{
    const int BH = 4, N = 1024, d = 64;
    const size_t n = (size_t)BH * N * d;
    float *q = bk_alloc(n * 4), *k = bk_alloc(n * 4), *v = bk_alloc(n * 4), *o = bk_alloc(n * 4);
    float *g = bk_alloc(n * 4), *dq = bk_alloc(n * 4), *dk = bk_alloc(n * 4), *dv = bk_alloc(n * 4);
    if (!q || !k || !v || !o || !g || !dq || !dk || !dv) busy_loop();
    for (size_t i = 0; i < n; i++) {
        q[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
        k[i] = (float)((i * 40503u) % 1000) * 1e-3f - 0.5f;
        v[i] = g[i] = (float)(i % 97) * 1e-2f;
    }
    bk_attn_desc desc = {1, BH, N, N, d, d, NULL, NULL};
    bk_sinkhorn_config p = bk_sinkhorn_config_default();
    p.iters = 5;
    bk_tensor tq = bk_tensor_bhnd(q, BH, N, d), tk = bk_tensor_bhnd(k, BH, N, d), tv = bk_tensor_bhnd(v, BH, N, d);
    bk_tensor to = bk_tensor_bhnd(o, BH, N, d), tg = bk_tensor_bhnd(g, BH, N, d);
    bk_tensor tdq = bk_tensor_bhnd(dq, BH, N, d), tdk = bk_tensor_bhnd(dk, BH, N, d), tdv = bk_tensor_bhnd(dv, BH, N, d);
    for (;;) {
        if (bk_sinkhorn_forward(&desc, &p, &tq, &tk, &tv, &to, NULL, NULL, NULL, 0) ||
            bk_sinkhorn_backward(&desc, &p, &tq, &tk, &tv, &tg, NULL, &tdq, &tdk, &tdv, NULL, 0))
            busy_loop();
    }
}

static pid_t spawn(int job)
{
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid != 0) return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    if (job) job_loop();
    busy_loop();
    _exit(0);
}

int bench_load_start(bench_load *ld, int busy, int jobs)
{
    memset(ld, 0, sizeof *ld);
    if (busy < 0 || jobs < 0 || busy + jobs > LOAD_MAX) {
        fprintf(stderr, "birkhoff bench: --load and --load-job take 0 to %d processes in all\n", LOAD_MAX);
        return -1;
    }
    ld->pid = calloc((size_t)(busy + jobs) + 1, sizeof(int));
    if (!ld->pid) return -1;
    fflush(NULL); /* the children must not flush the parent's buffers */
    for (int i = 0; i < busy + jobs; i++) {
        const pid_t p = spawn(i >= busy);
        if (p < 0) {
            perror("birkhoff bench: fork");
            bench_load_stop(ld);
            return -1;
        }
        ld->pid[ld->n++] = p;
    }
    ld->busy = busy;
    ld->jobs = jobs;
    if (ld->n) usleep(200000); /* the jobs past their start-up */
    return 0;
}

void bench_load_stop(bench_load *ld)
{
    for (int i = 0; i < ld->n; i++) kill(ld->pid[i], SIGKILL);
    for (int i = 0; i < ld->n; i++) waitpid(ld->pid[i], NULL, 0);
    free(ld->pid);
    memset(ld, 0, sizeof *ld);
}

/* Takes --load N and --load-job N out of argv (the benches parse the rest). */
int bench_load_args(int *argc, char **argv, int *busy, int *jobs)
{
    *busy = *jobs = 0;
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        int *dst = !strcmp(argv[i], "--load") ? busy : !strcmp(argv[i], "--load-job") ? jobs : NULL;
        if (!dst) {
            argv[out++] = argv[i];
            continue;
        }
        if (i + 1 >= *argc || !cli_parse_int(argv[i + 1], dst) || *dst < 0 || *dst > LOAD_MAX) {
            fprintf(stderr, "birkhoff bench: %s takes a number of processes from 0 to %d\n", argv[i], LOAD_MAX);
            return -1;
        }
        i++;
    }
    *argc = out;
    argv[out] = NULL;
    return 0;
}
