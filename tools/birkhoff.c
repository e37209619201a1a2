/* birkhoff.c -- the command-line program: dispatch and shared helpers. */
#define _GNU_SOURCE
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <xmmintrin.h>

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

void cli_fill(float *x, size_t n, unsigned seed, float sd)
{
    unsigned s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 3.4f * sd; /* std ~ sd */
    }
}

double cli_json_num(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p) return NAN;
    p += strlen(pat);
    while (*p == ' ') p++;
    char *end;
    double v = strtod(p, &end);
    return end == p ? NAN : v;
}

long cli_peak_rss(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss * 1024L;
}

int cli_parse_opts(const char *prog, int argc, char **argv, const cli_opt *opts, int nopt,
                   void (*usage_fn)(FILE *), int *done)
{
    *done = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage_fn(stdout);
            *done = 1;
            return CLI_OK;
        }
        int hit = 0;
        for (int o = 0; o < nopt; o++)
            if (!strcmp(argv[i], opts[o].flag)) {
                if (opts[o].is_switch) {
                    *opts[o].dst = "1";
                } else {
                    if (i + 1 >= argc) {
                        fprintf(stderr, "birkhoff %s: %s needs a value\n", prog, argv[i]);
                        return CLI_USAGE;
                    }
                    *opts[o].dst = argv[++i];
                }
                hit = 1;
                break;
            }
        if (!hit) {
            fprintf(stderr, "birkhoff %s: unknown option '%s'\n", prog, argv[i]);
            usage_fn(stderr);
            return CLI_USAGE;
        }
    }
    return CLI_OK;
}

int cli_parse_tuples(const char *prog, const char *list, int k, int *out, int max, const char *form)
{
    int n = 0;
    for (const char *s = list; *s;) {
        if (n == max) {
            fprintf(stderr, "birkhoff %s: at most %d cases in --cases\n", prog, max);
            return -1;
        }
        for (int f = 0; f < k; f++) {
            char *end;
            long v = strtol(s, &end, 10);
            if (end == s || v < 1 || v > 0x7fffffff || (f + 1 < k ? *end != ':' : (*end && *end != ','))) {
                fprintf(stderr, "birkhoff %s: --cases must be a comma list of %s (integers >= 1), got '%s'\n", prog,
                        form, list);
                return -1;
            }
            out[n * k + f] = (int)v;
            s = f + 1 < k ? end + 1 : end;
        }
        n++;
        if (*s == ',') s++;
    }
    return n;
}

void cli_peak(int nt, double *gf, double *ge)
{
    bk_machine_peak(0.5, gf, ge);
    *gf *= nt;
    *ge *= nt;
}

int cli_load_f32(const char *prog, const char *what, const char *path, int ndim, bk_npy *a)
{
    if (bk_npy_read(path, a) != BK_OK) {
        fprintf(stderr, "birkhoff %s: %s\n", prog, bk_last_error());
        return 0;
    }
    if (a->dtype != BK_F32 || a->ndim != ndim) {
        fprintf(stderr, "birkhoff %s: %s (%s) must be a float32 array of %d dimensions, got %s with %d\n", prog, what,
                path, ndim, a->dtype == BK_F32 ? "float32" : "int32", a->ndim);
        bk_npy_free(a);
        return 0;
    }
    for (int i = 0; i < ndim; i++)
        if (a->shape[i] < 1 || a->shape[i] > 0x7fffffff) {
            fprintf(stderr, "birkhoff %s: %s (%s) has an empty or too large dimension\n", prog, what, path);
            bk_npy_free(a);
            return 0;
        }
    return 1;
}

int cli_load_len(const char *prog, const char *what, const char *path, int64_t B, bk_npy *a)
{
    if (bk_npy_read(path, a) != BK_OK) {
        fprintf(stderr, "birkhoff %s: %s\n", prog, bk_last_error());
        return 0;
    }
    if (a->dtype != BK_I32 || a->ndim != 1 || a->shape[0] != B) {
        fprintf(stderr, "birkhoff %s: %s (%s) must be an int32 array of shape [%lld]\n", prog, what, path, (long long)B);
        bk_npy_free(a);
        return 0;
    }
    return 1;
}

int cli_write_outputs(const char *prog, int n, const cli_output *outs)
{
    char (*staged)[4096] = calloc((size_t)(n > 0 ? n : 1), sizeof *staged);
    if (!staged) {
        fprintf(stderr, "birkhoff %s: out of memory\n", prog);
        return 0;
    }
    int nstaged = 0, werr = 0;
    for (int i = 0; i < n && !werr; i++) {
        nstaged = i + 1;
        if (!outs[i].path) continue;
        snprintf(staged[i], sizeof staged[i], "%s.staged", outs[i].path);
        if (bk_npy_write(staged[i], BK_F32, outs[i].ndim, outs[i].shape, outs[i].data) != BK_OK) {
            fprintf(stderr, "birkhoff %s: %s\n", prog, bk_last_error());
            werr = 1;
            nstaged = i;
        }
    }
    for (int i = 0; i < nstaged; i++) {
        if (!outs[i].path) continue;
        if (werr) remove(staged[i]);
        else if (rename(staged[i], outs[i].path) != 0) {
            fprintf(stderr, "birkhoff %s: cannot rename %s to %s\n", prog, staged[i], outs[i].path);
            werr = 1;
        }
    }
    free(staged);
    return !werr;
}

int cli_write_text(const char *prog, const char *path, const char *text)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    int ok = f != NULL;
    if (ok) ok = fputs(text, f) >= 0;
    if (f) ok = (fclose(f) == 0) && ok;
    else if (fd >= 0) close(fd);
    if (ok) ok = rename(tmp, path) == 0;
    if (!ok) {
        fprintf(stderr, "birkhoff %s: cannot write %s (%s)\n", prog, path, strerror(errno));
        if (fd >= 0) remove(tmp);
    }
    return ok;
}

static void usage(FILE *f)
{
    fprintf(f,
            "birkhoff %s -- doubly-stochastic (optimal-transport) attention\n"
            "\n"
            "usage: birkhoff COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  train   train a model on a dataset (progress, metrics, checkpoints, --resume)\n"
            "  eval    accuracy, confusion and attention diagnostics of a checkpoint on a dataset\n"
            "  plot    figures: training curves, attention maps, column-sum histograms, transport plans\n"
            "  data    inspect a dataset (fetch stored ones with scripts/data.sh)\n"
            "  attn    run an attention operator on .npy files (forward, and backward with --dout)\n"
            "  otk     OTK embedding: embed sets onto references, fit anchors and references\n"
            "  asap    compile Sinkhorn into ASAP: a trained model (compile) or a layer (calibrate, report, ...)\n"
            "  model   transformer models: create, differentiate, train on .npy batches, show checkpoints\n"
            "  bench   benchmark operators over a shape grid against the PyTorch peers\n"
            "  demo    Sinkhorn vs softmax attention on generated data: marginals and timings\n"
            "  version print the version and the kernel instruction set\n"
            "\n"
            "`birkhoff COMMAND --help` describes each command.\n",
            bk_version());
}

int main(int argc, char **argv)
{
    /* Subnormal floats: training produces them (measured: a ViT on MNIST ran
     * at 80 samples/s instead of 2050 once they appeared, each one costing a
     * microcode assist). The program flushes them to zero (FTZ | DAZ in
     * MXCSR) before any thread exists, so every OpenMP thread inherits the
     * mode and results stay thread-count independent.
     * BK_KEEP_DENORMALS=1 keeps IEEE gradual underflow. */
    if (!getenv("BK_KEEP_DENORMALS")) _mm_setcsr(_mm_getcsr() | 0x8040);
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "plot")) return cmd_plot(argc - 1, argv + 1);
    if (!strcmp(cmd, "data")) return cmd_data(argc - 1, argv + 1);
    if (!strcmp(cmd, "attn")) return cmd_attn(argc - 1, argv + 1);
    if (!strcmp(cmd, "otk")) return cmd_otk(argc - 1, argv + 1);
    if (!strcmp(cmd, "asap")) return cmd_asap(argc - 1, argv + 1);
    if (!strcmp(cmd, "model")) return cmd_model(argc - 1, argv + 1);
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
