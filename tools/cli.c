/* cli.c -- helpers shared by the commands of the birkhoff program (cli.h):
 * option parsing, .npy loading, all-or-nothing staged outputs, timing and
 * statistics, and the structured synthetic attention inputs of `asap
 * generate` and `bench --op asap`. */
#define _GNU_SOURCE
#include "cli.h"

#include <errno.h>
#include <float.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

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

/* a finite number that float32 holds: "1e39" (inf as a float), "1e-50" (0)
 * and "inf" / "nan" are refused, not rounded */
int cli_parse_float(const char *s, float *out)
{
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || fabs(v) > FLT_MAX || (v != 0.0 && (float)v == 0.0f)) return 0;
    *out = (float)v;
    return 1;
}

int cli_parse_u64(const char *s, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9') return 0; /* no sign, no space: strtoull takes "-1" as 2^64 - 1 */
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return 0;
    *out = (uint64_t)v;
    return 1;
}

int cli_parse_range(const char *s, long long lo, long long hi, long long *out)
{
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void cli_stats(const double *x, int n, double *med, double *p25, double *p75)
{
    double *c = n > 0 ? malloc(sizeof(double) * (size_t)n) : NULL;
    if (!c) { /* (no samples, or no memory for the copy) */
        *med = *p25 = *p75 = NAN;
        return;
    }
    memcpy(c, x, sizeof(double) * (size_t)n);
    qsort(c, (size_t)n, sizeof(double), cmp_double);
    *med = c[n / 2];
    *p25 = c[n / 4];
    *p75 = c[(3 * n) / 4 < n ? (3 * n) / 4 : n - 1];
    free(c);
}

int cli_fits_memory(const char *cmd, const char *what, double bytes)
{
    const double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (bytes <= phys || !(phys > 0)) return 1;
    fprintf(stderr, "birkhoff %s: %s is too large: it needs %.3g GiB, this machine has %.3g GiB of memory\n", cmd, what,
            bytes / 1073741824.0, phys / 1073741824.0);
    return 0;
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

int cli_stage_outputs(const char *prog, bk_outset *set, unsigned flags, int n, const cli_output *outs)
{
    for (int i = 0; i < n; i++)
        if (outs[i].path &&
            bk_outset_add_npy(set, outs[i].path, flags, BK_F32, outs[i].ndim, outs[i].shape, outs[i].data) !=
                BK_OK) {
            fprintf(stderr, "birkhoff %s: %s\n", prog, bk_last_error());
            return 0;
        }
    return 1;
}

int cli_commit(const char *prog, bk_outset *set)
{
    if (bk_outset_commit(set) == BK_OK) return 1;
    fprintf(stderr, "birkhoff %s: %s\n", prog, bk_last_error());
    return 0;
}

int cli_write_outputs(const char *prog, int n, const cli_output *outs)
{
    bk_outset *set = bk_outset_create();
    if (!set) {
        fprintf(stderr, "birkhoff %s: out of memory\n", prog);
        return 0;
    }
    int ok = cli_stage_outputs(prog, set, 0, n, outs) && cli_commit(prog, set);
    bk_outset_free(set);
    return ok;
}

char **cli_read_lines(const char *prog, const char *path, int *count)
{
    /* the library's bounded reader: BK_TEXT_MAX_LINE, _BYTES and _LINES
     * (birkhoff/core.h), no NUL byte, not a directory; the lines one after
     * the other in one block (a short line costs its bytes and a pointer) */
    bk_text_reader *f = NULL;
    bk_status st = strcmp(path, "-") ? bk_text_open(path, NULL, &f) : bk_text_open_fd(0, "-", NULL, &f);
    char *text = NULL, *line = NULL;
    size_t used = 0, cap = 0, len = 0, n = 0;
    while (st == BK_OK && (st = bk_text_next(f, &line, &len)) == BK_OK && line) {
        if (used + len + 1 > cap) {
            size_t nc = cap ? 2 * cap : 1 << 16;
            while (nc < used + len + 1) nc *= 2;
            char *t = realloc(text, nc);
            if (!t) {
                st = BK_ERR_NOMEM;
                break;
            }
            text = t;
            cap = nc;
        }
        memcpy(text + used, line, len + 1);
        used += len + 1;
        n++;
    }
    bk_text_close(f);
    char **lines = st == BK_OK ? malloc(sizeof(char *) * (n + 1)) : NULL;
    if (st == BK_OK && !lines) st = BK_ERR_NOMEM;
    if (st != BK_OK) {
        if (st == BK_ERR_NOMEM) fprintf(stderr, "birkhoff %s: %s: out of memory\n", prog, path);
        else fprintf(stderr, "birkhoff %s: %s\n", prog, bk_last_error());
        free(text);
        return NULL;
    }
    /* (no line holds a NUL byte: each ends at the next one) */
    for (size_t i = 0, at = 0; i < n; i++) {
        lines[i] = text + at;
        at += strlen(text + at) + 1;
    }
    lines[n] = NULL;
    if (!n) free(text);
    *count = (int)n; /* (BK_TEXT_MAX_LINES < INT_MAX) */
    return lines;
}

void cli_free_lines(char **l, int n)
{
    if (l && n > 0) free(l[0]); /* the block of every line */
    free(l);
}

void cli_free_each(char **l, int n)
{
    for (int i = 0; l && i < n; i++) free(l[i]);
    free(l);
}

int cli_write_text(const char *prog, const char *path, const char *text)
{
    if (bk_run_write_text(path, text) == BK_OK) return 1;
    fprintf(stderr, "birkhoff %s: %s\n", prog, bk_last_error());
    return 0;
}

/* ------------------------------------------------------------------------ */
/* structured synthetic inputs (shared with bench --op asap)                */
/* ------------------------------------------------------------------------ */
/* Tokens x_t = mu_{z_t} + 0.45 xi_t + p_t: z_t a sticky Markov chain over 8
 * clusters (stay with probability 0.8), xi_t Gaussian noise, p_t a
 * sinusoidal position code of amplitude 0.5; per head, Q = x Wq, K = x Wk,
 * V = x Wv with Gaussian d x d maps, Wk = Wq + 0.5 G (queries and keys of the
 * same token correlate, as in trained layers), all scaled by temp. Seeded. */
static double gauss(uint64_t *st)
{
    double u = ((double)(bk_splitmix64(st) >> 11) + 0.5) / 9007199254740992.0;
    double v = (double)(bk_splitmix64(st) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

int asap_synth(int B, int H, int N, int d, uint64_t seed, float temp, float *Q, float *K, float *V)
{
    enum { NC = 8 };
    uint64_t st = seed * 0x2545F4914F6CDD1Dull + 17;
    double *mu = malloc(sizeof(double) * NC * d), *x = malloc(sizeof(double) * (size_t)N * d);
    double *W = malloc(sizeof(double) * 3 * (size_t)d * d);
    if (!mu || !x || !W) {
        free(mu);
        free(x);
        free(W);
        return 0;
    }
    for (int i = 0; i < NC * d; i++) mu[i] = gauss(&st);
    const double sd = 1.0 / sqrt((double)d);
    for (int b = 0; b < B; b++) {
        int z = (int)(bk_splitmix64(&st) % NC);
        for (int t = 0; t < N; t++) {
            if (bk_splitmix64(&st) % 5 == 0) z = (int)(bk_splitmix64(&st) % NC); /* stay with probability >= 0.8 */
            for (int c = 0; c < d; c++) {
                double ang = (double)t / pow(100.0, (double)(c / 2 * 2) / d);
                double pe = 0.5 * (c % 2 ? cos(ang) : sin(ang));
                x[(size_t)t * d + c] = mu[z * d + c] + 0.45 * gauss(&st) + pe;
            }
        }
        for (int h = 0; h < H; h++) {
            uint64_t hs = seed * 7919 + (uint64_t)h * 104729 + 3; /* maps shared over the batch */
            double *Wq = W, *Wk = W + (size_t)d * d, *Wv = Wk + (size_t)d * d;
            for (size_t i = 0; i < (size_t)d * d; i++) {
                Wq[i] = gauss(&hs) * sd;
                Wk[i] = Wq[i] + 0.5 * gauss(&hs) * sd;
                Wv[i] = gauss(&hs) * sd;
            }
            size_t off = ((size_t)b * H + h) * (size_t)N * d;
            for (int t = 0; t < N; t++)
                for (int c = 0; c < d; c++) {
                    double aq = 0, ak = 0, av = 0;
                    for (int e = 0; e < d; e++) {
                        double xe = x[(size_t)t * d + e];
                        aq += xe * Wq[(size_t)e * d + c];
                        ak += xe * Wk[(size_t)e * d + c];
                        av += xe * Wv[(size_t)e * d + c];
                    }
                    Q[off + (size_t)t * d + c] = (float)(temp * aq);
                    K[off + (size_t)t * d + c] = (float)(temp * ak);
                    V[off + (size_t)t * d + c] = (float)av;
                }
        }
    }
    free(mu);
    free(x);
    free(W);
    return 1;
}

int cli_key_flag(const char *prog, const char *flag, const char *v, char *key, size_t kcap, char *val, size_t vcap)
{
    if (!strcmp(flag, "--set")) {
        const char *eq = strchr(v, '=');
        if (!eq || eq == v || (size_t)(eq - v) >= kcap) {
            fprintf(stderr, "birkhoff %s: --set expects KEY=VALUE, got '%s'\n", prog, v);
            return 0;
        }
        snprintf(key, kcap, "%.*s", (int)(eq - v), v);
        snprintf(val, vcap, "%s", eq + 1);
    } else {
        snprintf(key, kcap, "%s", flag + 2);
        snprintf(val, vcap, "%s", v);
    }
    for (char *c = key; *c; c++)
        if (*c == '-') *c = '_';
    return 1;
}
