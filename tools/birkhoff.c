/* birkhoff.c -- the command-line program: `birkhoff attn|bench|demo`. */
#define _GNU_SOURCE
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cli_parse_int(const char *s, int *out)
{
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < -2147483647L || v > 2147483647L) return 0;
    *out = (int)v;
    return 1;
}

int cli_parse_float(const char *s, float *out)
{
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return 0;
    *out = (float)v;
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void cli_stats(const double *x, int n, double *med, double *p25, double *p75)
{
    double *c = malloc(sizeof(double) * (size_t)n);
    memcpy(c, x, sizeof(double) * (size_t)n);
    qsort(c, (size_t)n, sizeof(double), cmp_double);
    *med = c[n / 2];
    *p25 = c[n / 4];
    *p75 = c[(3 * n) / 4 < n ? (3 * n) / 4 : n - 1];
    free(c);
}

long cli_peak_rss(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss * 1024L;
}

static void usage(FILE *f)
{
    fprintf(f,
            "birkhoff %s -- doubly-stochastic (optimal-transport) attention\n"
            "\n"
            "usage: birkhoff COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  attn    run an attention operator on .npy files (forward, and backward with --dout)\n"
            "  bench   benchmark operators over a shape grid against the PyTorch peers\n"
            "  demo    Sinkhorn vs softmax attention on generated data: marginals and timings\n"
            "  version print the version and the kernel instruction set\n"
            "\n"
            "`birkhoff COMMAND --help` describes each command.\n",
            bk_version());
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "attn")) return cmd_attn(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "demo")) return cmd_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("birkhoff %s (kernels: %s, threads: %d)\n", bk_version(), bk_isa(), bk_get_num_threads());
        return CLI_OK;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return CLI_OK;
    }
    fprintf(stderr, "birkhoff: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return CLI_USAGE;
}
