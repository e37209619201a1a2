/* test_gen.c -- tests of the procedural data sets (src/data/gen.c, the
 * "Generated datasets" of birkhoff/data.h): ListOps and point-cloud shapes.
 * A standalone program over the library (make builds build/test_gen):
 *
 *   gcc -std=c11 -O2 -Wall -Wextra -Werror -Wshadow -D_POSIX_C_SOURCE=200809L -Iinclude \
 *       tests/data/test_gen.c build/libbirkhoff.a -o /tmp/test_gen -lopenblas -llapacke -lz -lm -fopenmp
 *
 * Options: --quick (fewer samples, for valgrind). Speeds are printed, never
 * checked (a speed is a property of the machine, not of the code).
 *
 * Prints "ok - ..." / "not ok - ..." per check, "# ..." diagnostics (class
 * and length distributions, descriptor accuracy, speed), and at the end
 * "N passed, M failed". It exits non-zero on any failure.
 *
 * The ListOps checks use their own evaluator: a recursive-descent parser
 * over the token ids with a median found by sorting. They share no code
 * with the generator. */
#include "birkhoff/data.h"
#include "../harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_quick; /* --quick: fewer samples (for valgrind) */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}
#define FNV_INIT 0xCBF29CE484222325ull

/* ========================================================================
 * ListOps: an independent evaluator
 * ===================================================================== */
typedef struct {
    const int32_t *t;
    int n, pos;
    const char *err; /* first error, or NULL */
    int max_depth;   /* deepest operation nesting seen */
    int max_args;    /* most arguments of one operation */
    int min_args;    /* fewest arguments of one operation */
} lo_parser;

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* expr := digit | OPEN expr expr ... CLOSE. Returns the value, or -1 on
 * a parse error. depth = number of operations enclosing this one. */
static int lo_parse(lo_parser *p, int depth)
{
    if (p->pos >= p->n) {
        if (!p->err) p->err = "unexpected end";
        return -1;
    }
    int32_t tk = p->t[p->pos++];
    if (tk >= 0 && tk <= 9) return (int)tk;
    if (tk < 10 || tk > 13) {
        if (!p->err) p->err = tk == 14 ? "unexpected ]" : "token id out of range";
        return -1;
    }
    if (depth + 1 > p->max_depth) p->max_depth = depth + 1;
    int args[64], na = 0;
    for (;;) {
        if (p->pos >= p->n) {
            if (!p->err) p->err = "unclosed operation";
            return -1;
        }
        if (p->t[p->pos] == 14) {
            p->pos++;
            break;
        }
        int v = lo_parse(p, depth + 1);
        if (v < 0) return -1;
        if (na >= 64) {
            if (!p->err) p->err = "more than 64 arguments";
            return -1;
        }
        args[na++] = v;
    }
    if (na > p->max_args) p->max_args = na;
    if (na < p->min_args) p->min_args = na;
    if (na == 0) {
        if (!p->err) p->err = "operation without arguments";
        return -1;
    }
    int v = 0;
    switch (tk) {
    case 10: /* MIN */
        v = args[0];
        for (int i = 1; i < na; i++)
            if (args[i] < v) v = args[i];
        break;
    case 11: /* MAX */
        v = args[0];
        for (int i = 1; i < na; i++)
            if (args[i] > v) v = args[i];
        break;
    case 12: /* MED = int(numpy.median) */
        qsort(args, (size_t)na, sizeof args[0], cmp_int);
        v = (na % 2) ? args[na / 2] : (args[na / 2 - 1] + args[na / 2]) / 2;
        break;
    default: /* SM */
        for (int i = 0; i < na; i++) v += args[i];
        v %= 10;
        break;
    }
    return v;
}

/* Parses a whole sample. Returns its value, or -1 with *why set. */
static int lo_eval(const int32_t *t, int n, int *depth, int *maxa, int *mina, const char **why)
{
    lo_parser p = {t, n, 0, NULL, 0, 0, 1 << 30};
    *why = NULL;
    if (n < 1 || t[0] < 10 || t[0] > 13) {
        *why = "top level is not an operation";
        return -1;
    }
    int v = lo_parse(&p, 0);
    if (v >= 0 && p.pos != n) p.err = "trailing tokens";
    if (p.err) {
        *why = p.err;
        return -1;
    }
    *depth = p.max_depth, *maxa = p.max_args, *mina = p.min_args;
    return v;
}

static void test_evaluator_selftest(void)
{
    /* hand-written cases, including the median rounding */
    static const int32_t e1[] = {11, 2, 9, 14};                            /* [MAX 2 9] = 9 */
    static const int32_t e2[] = {12, 1, 2, 14};                            /* [MED 1 2] = 1 */
    static const int32_t e3[] = {12, 3, 8, 1, 14};                         /* [MED 3 8 1] = 3 */
    static const int32_t e4[] = {13, 7, 8, 9, 14};                         /* [SM 7 8 9] = 4 */
    static const int32_t e5[] = {10, 5, 11, 1, 7, 14, 12, 6, 9, 2, 0, 14, 14}; /* MIN(5, 7, MED(0,2,6,9)=4) = 4 */
    int d, a, m;
    const char *why;
    int ok = lo_eval(e1, 4, &d, &a, &m, &why) == 9 && lo_eval(e2, 4, &d, &a, &m, &why) == 1 &&
             lo_eval(e3, 5, &d, &a, &m, &why) == 3 && lo_eval(e4, 5, &d, &a, &m, &why) == 4 &&
             lo_eval(e5, 13, &d, &a, &m, &why) == 4 && d == 2 && a == 4 && m == 2;
    static const int32_t b1[] = {11, 2, 9};     /* unclosed */
    static const int32_t b2[] = {11, 2, 14, 3}; /* trailing */
    static const int32_t b3[] = {3};            /* not an op */
    ok = ok && lo_eval(b1, 3, &d, &a, &m, &why) < 0 && lo_eval(b2, 4, &d, &a, &m, &why) < 0 &&
         lo_eval(b3, 1, &d, &a, &m, &why) < 0;
    th_check(ok, "listops: independent evaluator self-test", "hand-written expressions mis-evaluated");
}

/* ------------------------------------------------------------------------
 * which lengths work, by a dynamic program (independent of the generator)
 * --------------------------------------------------------------------- */
#define DP_N 400
/* feas[d][n]: an operation of exactly n tokens and depth <= d exists */
static void dp_feasible(int A, unsigned char feas[11][DP_N + 1])
{
    unsigned char G[DP_N + 1], cur[DP_N + 1], nxt[DP_N + 1];
    memset(feas, 0, 11 * (DP_N + 1));
    memset(G, 0, sizeof G);
    G[1] = 1; /* depth 0: a digit */
    for (int d = 1; d <= 10; d++) {
        memset(cur, 0, sizeof cur);
        cur[0] = 1;
        for (int k = 1; k <= A; k++) {
            memset(nxt, 0, sizeof nxt);
            for (int s = 0; s <= DP_N; s++) {
                if (!cur[s]) continue;
                for (int g = 1; s + g <= DP_N; g++)
                    if (G[g]) nxt[s + g] = 1;
            }
            memcpy(cur, nxt, sizeof cur);
            if (k >= 2)
                for (int s = 0; s + 2 <= DP_N; s++)
                    if (cur[s]) feas[d][s + 2] = 1;
        }
        for (int n = 0; n <= DP_N; n++) G[n] = (unsigned char)(n == 1 || feas[d][n]);
    }
}

/* Checks options against the dynamic program. The generator must accept
 * exactly the feasible single lengths, and hit them exactly. */
static void test_listops_feasibility(void)
{
    static unsigned char feas[11][DP_N + 1];
    int32_t tok[DP_N];
    char err[256];
    for (int A = 2; A <= 10; A++) {
        dp_feasible(A, feas);
        int bad = 0, gens = 0;
        char what[640] = "";
        for (int D = 1; D <= 10; D++) {
            for (int n = 5; n <= (g_quick ? DP_N / 4 : DP_N); n++) {
                bk_listops_config o = {n, n, D, A};
                int acc = (bk_listops_check(&o) == BK_OK);
                snprintf(err, sizeof err, "%s", bk_last_error()); /* "" when accepted */
                if (acc != feas[D][n]) {
                    if (!bad++)
                        snprintf(what, sizeof what, "A=%d D=%d n=%d: accepted=%d dp=%d (%s)", A, D, n, acc,
                                 feas[D][n], err);
                    continue;
                }
                if (!acc) {
                    if (!err[0] && !bad++) snprintf(what, sizeof what, "A=%d D=%d n=%d: no message", A, D, n);
                    continue;
                }
                for (uint64_t i = 0; i < 2; i++) {
                    int len = -1, lab = -1, dep, ma, mi;
                    const char *why;
                    gens++;
                    if (!(bk_listops_sample(7, i + (uint64_t)n * 31, &o, tok, &len, &lab) == BK_OK)) {
                        if (!bad++) snprintf(what, sizeof what, "A=%d D=%d n=%d: %s", A, D, n, bk_last_error());
                        continue;
                    }
                    int v = lo_eval(tok, len, &dep, &ma, &mi, &why);
                    if (len != n || v != lab || dep > D || ma > A || mi < 2) {
                        if (!bad++)
                            snprintf(what, sizeof what, "A=%d D=%d n=%d: len %d label %d eval %d depth %d args %d..%d",
                                     A, D, n, len, lab, v, dep, mi, ma);
                    }
                }
            }
        }
        char name[128];
        snprintf(name, sizeof name, "listops: max_args %d: accepted lengths == DP, exact lengths (%d samples)", A, gens);
        th_check(!bad, name, "%d problems; first %s", bad, what);
    }
    /* ranges that contain no feasible length, and ones that just do */
    bk_listops_config r1 = {5, 6, 2, 2}, r2 = {5, 7, 2, 2}, r3 = {6, 6, 5, 3}, r4 = {6, 7, 5, 3};
    int len = 0, lab = 0;
    int ok = !(bk_listops_check(&r1) == BK_OK) && (bk_listops_check(&r2) == BK_OK) &&
             !(bk_listops_check(&r3) == BK_OK) && (bk_listops_check(&r4) == BK_OK);
    ok = ok && (bk_listops_sample(1, 0, &r2, tok, &len, &lab) == BK_OK) && len == 7;
    ok = ok && (bk_listops_sample(1, 0, &r4, tok, &len, &lab) == BK_OK) && len == 7;
    th_check(ok, "listops: infeasible ranges rejected (args 2: len%3==1; args 3: no 6)", "r1..r4 mishandled");
}

/* ------------------------------------------------------------------------
 * the main option grid
 * --------------------------------------------------------------------- */
static void print_hist(const char *title, const long *h, int nb, long total)
{
    printf("# %s:", title);
    for (int i = 0; i < nb; i++) printf(" %d:%.1f%%", i, 100.0 * (double)h[i] / (double)total);
    printf("\n");
}

static void test_listops_grid(void)
{
    static const int maxlens[3] = {64, 256, 2000};
    static const int depths[3] = {1, 3, 10};
    const int N = g_quick ? 300 : 2000;
    int32_t *tok = malloc(sizeof(int32_t) * 4096);
    char name[160];
    for (int li = 0; li < 3; li++) {
        for (int di = 0; di < 3; di++) {
            bk_listops_config o = bk_listops_config_default(maxlens[li]);
            o.max_depth = depths[di];
            if (depths[di] == 1) o.min_len = 5; /* depth 1, 10 args: at most 12 tokens */
            if (depths[di] == 3 && o.min_len > 1222) o.min_len = 500;
            long cls[10] = {0}, lq[4] = {0}, dh[11] = {0};
            int bad = 0, lmin = 1 << 30, lmax = 0, dmax = 0;
            char what[640] = "";
            double lsum = 0;
            for (int i = 0; i < N; i++) {
                int len = -1, lab = -1, dep = 0, ma = 0, mi = 0;
                const char *why = NULL;
                if (!(bk_listops_sample(12345, (uint64_t)i, &o, tok, &len, &lab) == BK_OK)) {
                    if (!bad++) snprintf(what, sizeof what, "i=%d: %s", i, bk_last_error());
                    continue;
                }
                int idok = 1;
                for (int t = 0; t < len; t++) idok &= tok[t] >= 0 && tok[t] < BK_LISTOPS_VOCAB;
                int v = idok ? lo_eval(tok, len, &dep, &ma, &mi, &why) : -1;
                if (!idok || v < 0 || v != lab || len < o.min_len || len > o.max_len || dep > o.max_depth ||
                    ma > o.max_args || mi < 2 || lab < 0 || lab > 9) {
                    if (!bad++)
                        snprintf(what, sizeof what, "i=%d: ids ok %d, eval %d (%s) label %d len %d depth %d args %d..%d",
                                 i, idok, v, why ? why : "", lab, len, dep, mi, ma);
                    continue;
                }
                cls[lab]++;
                dh[dep]++;
                if (len < lmin) lmin = len;
                if (len > lmax) lmax = len;
                if (dep > dmax) dmax = dep;
                lsum += len;
                int hi = o.max_len < 12 || depths[di] > 1 ? o.max_len : 12;
                int q = (int)((long)(len - o.min_len) * 4 / (hi - o.min_len + 1));
                lq[q < 0 ? 0 : q > 3 ? 3 : q]++;
            }
            snprintf(name, sizeof name,
                     "listops max_len %d depth %d (min_len %d): %d samples: label == independent eval, well-formed, "
                     "len/depth/args in range",
                     o.max_len, o.max_depth, o.min_len, N);
            th_check(!bad, name, "%d bad; first %s", bad, what);
            int allc = 1;
            long cmax = 0;
            for (int c = 0; c < 10; c++) {
                allc &= cls[c] > 0;
                if (cls[c] > cmax) cmax = cls[c];
            }
            snprintf(name, sizeof name, "listops max_len %d depth %d: all 10 classes occur", o.max_len, o.max_depth);
            th_check(allc, name, "a class is missing");
            if (depths[di] == 10) {
                snprintf(name, sizeof name, "listops max_len %d depth 10: no class above 35%% (max %.1f%%)",
                         o.max_len, 100.0 * (double)cmax / N);
                th_check(cmax <= 0.35 * N, name, "class too common");
                int spread = 1;
                for (int q = 0; q < 4; q++) spread &= lq[q] >= N / 8;
                snprintf(name, sizeof name, "listops max_len %d depth 10: lengths spread over the range (quarters %ld/%ld/%ld/%ld)",
                         o.max_len, lq[0], lq[1], lq[2], lq[3]);
                th_check(spread, name, "lengths are bunched");
            }
            printf("# listops max_len %d min_len %d depth %d: len %d..%d mean %.1f; length quarters %ld %ld %ld %ld; max depth %d\n",
                   o.max_len, o.min_len, o.max_depth, lmin, lmax, lsum / N, lq[0], lq[1], lq[2], lq[3], dmax);
            snprintf(name, sizeof name, "listops max_len %d depth %d classes", o.max_len, o.max_depth);
            print_hist(name, cls, 10, N);
            if (depths[di] == 10) {
                snprintf(name, sizeof name, "listops max_len %d depth 10 tree depths", o.max_len);
                printf("# %s:", name);
                for (int d = 1; d <= 10; d++) printf(" %d:%.1f%%", d, 100.0 * (double)dh[d] / N);
                printf("\n");
            }
        }
    }
    free(tok);
}

static void test_listops_determinism(void)
{
    bk_listops_config o = bk_listops_config_default(256);
    enum { M = 64 };
    int32_t *a = malloc(sizeof(int32_t) * M * 256), *b = malloc(sizeof(int32_t) * 256);
    int la[M], ya[M], ok = 1;
    for (int i = 0; i < M; i++) ok &= (bk_listops_sample(99, (uint64_t)i, &o, a + i * 256, &la[i], &ya[i]) == BK_OK);
    /* again, in reverse, with other indices and seeds in between */
    for (int i = M - 1; i >= 0; i--) {
        int lb, yb;
        ok &= (bk_listops_sample(5, (uint64_t)i * 7 + 1000, &o, b, &lb, &yb) == BK_OK);
        ok &= (bk_listops_sample(99, (uint64_t)i, &o, b, &lb, &yb) == BK_OK);
        ok &= lb == la[i] && yb == ya[i] && memcmp(b, a + i * 256, sizeof(int32_t) * (size_t)lb) == 0;
    }
    th_check(ok, "listops: determinism (same sample in any order, with other samples in between)", "mismatch");

    /* different seeds (and indices) give different streams */
    int same_seed = 0, same_next = 0;
    for (int i = 0; i < M; i++) {
        int lb, yb;
        bk_listops_sample(100, (uint64_t)i, &o, b, &lb, &yb);
        same_seed += lb == la[i] && memcmp(b, a + i * 256, sizeof(int32_t) * (size_t)lb) == 0;
        if (i + 1 < M)
            same_next += la[i] == la[i + 1] && memcmp(a + i * 256, a + (i + 1) * 256, sizeof(int32_t) * (size_t)la[i]) == 0;
    }
    th_check(same_seed == 0 && same_next == 0, "listops: different seeds / indices give different samples",
          "%d identical across seeds, %d across neighbouring indices", same_seed, same_next);

    /* Golden hash of the stream (seed 2024, first 200 samples at max_len
     * 512). It pins the exact output on every machine. Change it only when
     * the sampler changes on purpose, since that changes every data set. */
    bk_listops_config o2 = bk_listops_config_default(512);
    int32_t *t2 = malloc(sizeof(int32_t) * 512);
    uint64_t h = FNV_INIT;
    for (int i = 0; i < 200; i++) {
        int l, y;
        bk_listops_sample(2024, (uint64_t)i, &o2, t2, &l, &y);
        h = fnv1a(h, &l, sizeof l);
        h = fnv1a(h, &y, sizeof y);
        h = fnv1a(h, t2, sizeof(int32_t) * (size_t)l);
    }
    printf("# listops golden hash %016llx\n", (unsigned long long)h);
    th_check(h == 0x20236af7be8eda2aull, "listops: golden stream hash", "got %016llx", (unsigned long long)h);
    free(t2);
    free(a);
    free(b);
}

static void test_listops_bad_options(void)
{
    int32_t tok[4096];
    int len, lab;
    struct {
        bk_listops_config o;
        const char *what;
    } cases[] = {
        {{5, 3, 10, 10}, "max_len 3"},
        {{5, 64, 0, 10}, "max_depth 0"},
        {{100, 64, 10, 10}, "min_len > max_len"},
        {{1000, 4097, 10, 10}, "max_len 4097"},
        {{4, 64, 10, 10}, "min_len 4"},
        {{16, 64, 11, 10}, "max_depth 11"},
        {{16, 64, 10, 1}, "max_args 1"},
        {{16, 64, 10, 11}, "max_args 11"},
        {{16, 64, 1, 10}, "min_len 16 with max_depth 1 (at most 12 tokens)"},
        {{2000, 4096, 3, 10}, "min_len 2000 with max_depth 3 (at most 1222 tokens)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "", name[160];
        int r = (bk_listops_sample(1, 0, &cases[i].o, tok, &len, &lab) == BK_OK);
        snprintf(err, sizeof err, "%s", r ? "" : bk_last_error());
        snprintf(name, sizeof name, "listops: rejects %s", cases[i].what);
        th_check(r == 0 && err[0] != 0, name, "returned %d, message '%s'", r, err);
        if (r == 0) printf("#   message: %s\n", err);
    }
    bk_listops_config ok = bk_listops_config_default(64);
    int r1 = (bk_listops_sample(1, 0, NULL, tok, &len, &lab) == BK_OK), m1 = bk_last_error()[0] != 0;
    int r2 = (bk_listops_sample(1, 0, &ok, NULL, &len, &lab) == BK_OK), m2 = bk_last_error()[0] != 0;
    bk_listops_config bad = {5, 3, 10, 10};
    int r3 = (bk_listops_sample(1, 0, &bad, tok, &len, &lab) == BK_OK), m3 = bk_last_error()[0] != 0;
    th_check(r1 == 0 && r2 == 0 && r3 == 0 && m1 && m2 && m3,
          "listops: NULL options / outputs rejected, each with a message (bk_last_error)", "r %d %d %d", r1, r2, r3);
    bk_listops_config d = bk_listops_config_default(2000);
    th_check(d.min_len == 500 && d.max_len == 2000 && d.max_depth == 10 && d.max_args == 10,
          "listops: defaults(2000) = LRA (500..2000, depth 10, args 10)", "%d %d %d %d", d.min_len, d.max_len,
          d.max_depth, d.max_args);
}

/* ========================================================================
 * shapes
 * ===================================================================== */

/* eigenvalues (descending) and eigenvectors (columns of V) of a symmetric
 * 3x3 matrix, by cyclic Jacobi */
static void eig3(double Ain[3][3], double ev[3], double V[3][3])
{
    double A[3][3];
    memcpy(A, Ain, sizeof A);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) V[i][j] = i == j;
    for (int sweep = 0; sweep < 50; sweep++) {
        double off = fabs(A[0][1]) + fabs(A[0][2]) + fabs(A[1][2]);
        if (off < 1e-15) break;
        for (int p = 0; p < 2; p++)
            for (int q = p + 1; q < 3; q++) {
                if (fabs(A[p][q]) < 1e-300) continue;
                double th = (A[q][q] - A[p][p]) / (2.0 * A[p][q]);
                double t = (th >= 0 ? 1.0 : -1.0) / (fabs(th) + sqrt(th * th + 1.0));
                double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
                for (int k = 0; k < 3; k++) { /* A = J^T A J */
                    double akp = A[k][p], akq = A[k][q];
                    A[k][p] = c * akp - s * akq;
                    A[k][q] = s * akp + c * akq;
                }
                for (int k = 0; k < 3; k++) {
                    double apk = A[p][k], aqk = A[q][k];
                    A[p][k] = c * apk - s * aqk;
                    A[q][k] = s * apk + c * aqk;
                }
                for (int k = 0; k < 3; k++) {
                    double vkp = V[k][p], vkq = V[k][q];
                    V[k][p] = c * vkp - s * vkq;
                    V[k][q] = s * vkp + c * vkq;
                }
            }
    }
    int idx[3] = {0, 1, 2};
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (A[idx[j]][idx[j]] > A[idx[i]][idx[i]]) {
                int t = idx[i];
                idx[i] = idx[j], idx[j] = t;
            }
    double W[3][3];
    for (int i = 0; i < 3; i++) {
        ev[i] = A[idx[i]][idx[i]];
        for (int k = 0; k < 3; k++) W[k][i] = V[k][idx[i]];
    }
    memcpy(V, W, sizeof W);
}

static void cloud_stats(const float *xyz, int n, double mean[3], double cov[3][3], double *rmax)
{
    for (int i = 0; i < 3; i++) mean[i] = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < 3; i++) mean[i] += xyz[3 * j + i];
    for (int i = 0; i < 3; i++) mean[i] /= n;
    memset(cov, 0, sizeof(double) * 9);
    *rmax = 0;
    for (int j = 0; j < n; j++) {
        double d[3], r2 = 0;
        for (int i = 0; i < 3; i++) d[i] = xyz[3 * j + i] - mean[i], r2 += d[i] * d[i];
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++) cov[a][b] += d[a] * d[b] / n;
        if (r2 > *rmax) *rmax = r2;
    }
    *rmax = sqrt(*rmax);
}

/* the rotation-invariant descriptor: sorted covariance eigenvalues and a
 * histogram of radii (about the mean) */
#define DESC_BINS 10
#define DESC_DIM (3 + DESC_BINS)
static void descriptor(const float *xyz, int n, double *f)
{
    double mean[3], cov[3][3], rmax, ev[3], V[3][3];
    cloud_stats(xyz, n, mean, cov, &rmax);
    eig3(cov, ev, V);
    for (int i = 0; i < 3; i++) f[i] = ev[i];
    for (int b = 0; b < DESC_BINS; b++) f[3 + b] = 0;
    for (int j = 0; j < n; j++) {
        double r2 = 0;
        for (int i = 0; i < 3; i++) r2 += (xyz[3 * j + i] - mean[i]) * (xyz[3 * j + i] - mean[i]);
        int b = (int)(sqrt(r2) / 1.1 * DESC_BINS);
        f[3 + (b < 0 ? 0 : b >= DESC_BINS ? DESC_BINS - 1 : b)] += 1.0 / n;
    }
}

static void test_shapes_basic(void)
{
    const int P = 1024;
    float *a = malloc(sizeof(float) * 3 * P), *b = malloc(sizeof(float) * 3 * P);
    char name[160];
    bk_shapes_config o = bk_shapes_config_default(P);
    int la = -1, lb = -1, ok = 1;

    /* names */
    int names_ok = strcmp(bk_shapes_name(-1), "?") == 0 && strcmp(bk_shapes_name(BK_SHAPES_CLASSES), "?") == 0;
    for (int c = 0; c < BK_SHAPES_CLASSES; c++) {
        names_ok &= strlen(bk_shapes_name(c)) > 0 && strcmp(bk_shapes_name(c), "?") != 0;
        for (int d = 0; d < c; d++) names_ok &= strcmp(bk_shapes_name(c), bk_shapes_name(d)) != 0;
    }
    th_check(names_ok && BK_SHAPES_CLASSES >= 10, "shapes: >= 10 classes with distinct names", "names");

    /* determinism */
    ok &= (bk_shapes_sample(3, 17, &o, a, &la) == BK_OK);
    for (int i = 0; i < 5; i++) ok &= (bk_shapes_sample(4, (uint64_t)i, &o, b, &lb) == BK_OK);
    ok &= (bk_shapes_sample(3, 17, &o, b, &lb) == BK_OK);
    th_check(ok && la == lb && memcmp(a, b, sizeof(float) * 3 * P) == 0,
          "shapes: determinism (same sample after others)", "mismatch");

    /* golden hash: pins the output bits on every machine */
    uint64_t h = FNV_INIT;
    bk_shapes_config og = bk_shapes_config_default(256);
    for (int i = 0; i < 48; i++) {
        int l;
        bk_shapes_sample(2024, (uint64_t)i, &og, a, &l);
        h = fnv1a(h, &l, sizeof l);
        h = fnv1a(h, a, sizeof(float) * 3 * 256);
    }
    printf("# shapes golden hash %016llx\n", (unsigned long long)h);
    th_check(h == 0x42181d31b430e05dull, "shapes: golden stream hash", "got %016llx", (unsigned long long)h);

    /* label balance: every block of 12 is a permutation; not index % 12 */
    int perm_ok = 1, not_mod = 0, label_fn = 1;
    long cnt[BK_SHAPES_CLASSES] = {0};
    for (int blk = 0; blk < 100; blk++) {
        int seen[BK_SHAPES_CLASSES] = {0};
        for (int k = 0; k < BK_SHAPES_CLASSES; k++) {
            uint64_t idx = (uint64_t)blk * BK_SHAPES_CLASSES + (uint64_t)k;
            int l = bk_shapes_label(11, idx);
            if (l < 0 || l >= BK_SHAPES_CLASSES) {
                perm_ok = 0;
                continue;
            }
            seen[l]++;
            cnt[l]++;
            not_mod |= l != k;
        }
        for (int c = 0; c < BK_SHAPES_CLASSES; c++) perm_ok &= seen[c] == 1;
    }
    for (int i = 0; i < 40; i++) {
        int l;
        bk_shapes_sample(11, (uint64_t)i, &og, a, &l);
        label_fn &= l == bk_shapes_label(11, (uint64_t)i);
    }
    th_check(perm_ok && not_mod && label_fn, "shapes: labels balanced (a permutation per block of 12), match bk_shapes_label",
          "perm %d shuffled %d fn %d", perm_ok, not_mod, label_fn);

    /* finite, centred, unit max radius (with and without noise) */
    int fin = 1;
    double worst_mean = 0, rmin = 1e9, rmaxx = 0, rmin0 = 1e9, rmax0 = 0;
    bk_shapes_config o0 = {P, 0.0f};
    for (int i = 0; i < 240; i++) {
        double mean[3], cov[3][3], rm;
        int l;
        ok &= (bk_shapes_sample(8, (uint64_t)i, &o, a, &l) == BK_OK);
        for (int k = 0; k < 3 * P; k++) fin &= isfinite(a[k]) != 0;
        cloud_stats(a, P, mean, cov, &rm);
        for (int c = 0; c < 3; c++)
            if (fabs(mean[c]) > worst_mean) worst_mean = fabs(mean[c]);
        if (rm < rmin) rmin = rm;
        if (rm > rmaxx) rmaxx = rm;
        ok &= (bk_shapes_sample(8, (uint64_t)i, &o0, a, &l) == BK_OK);
        cloud_stats(a, P, mean, cov, &rm);
        for (int c = 0; c < 3; c++)
            if (fabs(mean[c]) > worst_mean) worst_mean = fabs(mean[c]);
        if (rm < rmin0) rmin0 = rm;
        if (rm > rmax0) rmax0 = rm;
    }
    th_check(ok && fin, "shapes: 240 samples generated, every coordinate finite", "failure");
    snprintf(name, sizeof name, "shapes: centred (max |mean| %.2e)", worst_mean);
    th_check(worst_mean < 0.01, name, "not centred");
    snprintf(name, sizeof name, "shapes: noise 0: max radius 1 (%.7f..%.7f)", rmin0, rmax0);
    th_check(rmin0 > 1 - 1e-5 && rmax0 < 1 + 1e-5, name, "not unit");
    snprintf(name, sizeof name, "shapes: noise 0.02: max radius ~1 (%.4f..%.4f)", rmin, rmaxx);
    th_check(rmin > 0.95 && rmaxx < 1.15, name, "out of range");

    /* rotations: the long axis of ellipsoids points everywhere; two
     * samples of a class differ */
    double absdir[3] = {0, 0, 0}, outer[3][3] = {{0}};
    int nell = 0, differ = 1, cls_prev[BK_SHAPES_CLASSES];
    for (int c = 0; c < BK_SHAPES_CLASSES; c++) cls_prev[c] = -1;
    float *keep = malloc(sizeof(float) * 3 * P * BK_SHAPES_CLASSES);
    for (int i = 0; i < 12 * 50; i++) {
        int l;
        bk_shapes_sample(21, (uint64_t)i, &o, a, &l);
        if (cls_prev[l] < 0) {
            memcpy(keep + (size_t)l * 3 * P, a, sizeof(float) * 3 * P);
            cls_prev[l] = i;
        } else if (cls_prev[l] >= 0 && cls_prev[l] != -2) {
            /* covariance matrices of two samples of the same class differ */
            double m1[3], c1[3][3], m2[3], c2[3][3], r1, r2, d = 0;
            cloud_stats(keep + (size_t)l * 3 * P, P, m1, c1, &r1);
            cloud_stats(a, P, m2, c2, &r2);
            for (int x = 0; x < 3; x++)
                for (int y = 0; y < 3; y++) d += fabs(c1[x][y] - c2[x][y]);
            if (l != 0 && d < 1e-3) differ = 0; /* a sphere may look alike */
            cls_prev[l] = -2;
        }
        if (strcmp(bk_shapes_name(l), "ellipsoid") == 0) {
            double mean[3], cov[3][3], rm, ev[3], V[3][3];
            cloud_stats(a, P, mean, cov, &rm);
            eig3(cov, ev, V);
            for (int x = 0; x < 3; x++) {
                absdir[x] += fabs(V[x][0]);
                for (int y = 0; y < 3; y++) outer[x][y] += V[x][0] * V[y][0];
            }
            nell++;
        }
    }
    free(keep);
    int iso = nell >= 40;
    for (int x = 0; x < 3; x++) {
        absdir[x] /= nell;
        iso &= absdir[x] > 0.38 && absdir[x] < 0.62;
        for (int y = 0; y < 3; y++) {
            outer[x][y] /= nell;
            iso &= fabs(outer[x][y] - (x == y ? 1.0 / 3 : 0.0)) < 0.15;
        }
    }
    snprintf(name, sizeof name, "shapes: random rotations (ellipsoid long axis mean |v| = %.2f %.2f %.2f over %d)",
             absdir[0], absdir[1], absdir[2], nell);
    th_check(iso, name, "orientations not spread");
    th_check(differ, "shapes: two samples of the same class differ", "identical covariance");

    /* bad options */
    bk_shapes_config bad[5] = {{15, 0.02f}, {4097, 0.02f}, {P, -0.1f}, {P, NAN}, {P, 2.0f}};
    const char *bw[5] = {"points 15", "points 4097", "noise -0.1", "noise NaN", "noise 2"};
    for (int i = 0; i < 5; i++) {
        char e2[256] = "";
        int l;
        int r = (bk_shapes_sample(1, 0, &bad[i], a, &l) == BK_OK);
        snprintf(e2, sizeof e2, "%s", r ? "" : bk_last_error());
        snprintf(name, sizeof name, "shapes: rejects %s", bw[i]);
        th_check(r == 0 && e2[0], name, "returned %d '%s'", r, e2);
    }
    int l;
    th_check((bk_shapes_sample(1, 0, NULL, a, &l) == BK_OK) == 0 && (bk_shapes_sample(1, 0, &o, NULL, &l) == BK_OK) == 0,
          "shapes: NULL options / outputs rejected", "accepted");
    bk_shapes_config small = {16, 0.02f}, big = {4096, 0.0f};
    float *bb = malloc(sizeof(float) * 3 * 4096);
    th_check((bk_shapes_sample(1, 5, &small, bb, &l) == BK_OK) && (bk_shapes_sample(1, 5, &big, bb, &l) == BK_OK),
          "shapes: 16 and 4096 points accepted", "%s", bk_last_error());
    free(bb);
    free(a);
    free(b);
}

static void test_shapes_separability(void)
{
    const int P = 1024, NTR = g_quick ? 240 : 1200, NTE = g_quick ? 120 : 600;
    bk_shapes_config o = bk_shapes_config_default(P);
    float *xyz = malloc(sizeof(float) * 3 * P);
    double *F = malloc(sizeof(double) * DESC_DIM * (NTR + NTE));
    int *Y = malloc(sizeof(int) * (NTR + NTE));
    for (int i = 0; i < NTR + NTE; i++) {
        bk_shapes_sample(77, (uint64_t)i, &o, xyz, &Y[i]);
        descriptor(xyz, P, F + (size_t)i * DESC_DIM);
    }
    /* standardise on the training set, nearest centroid */
    double mu[DESC_DIM] = {0}, sd[DESC_DIM] = {0}, cen[BK_SHAPES_CLASSES][DESC_DIM] = {{0}};
    int cc[BK_SHAPES_CLASSES] = {0};
    for (int i = 0; i < NTR; i++)
        for (int k = 0; k < DESC_DIM; k++) mu[k] += F[i * DESC_DIM + k] / NTR;
    for (int i = 0; i < NTR; i++)
        for (int k = 0; k < DESC_DIM; k++) sd[k] += (F[i * DESC_DIM + k] - mu[k]) * (F[i * DESC_DIM + k] - mu[k]) / NTR;
    for (int k = 0; k < DESC_DIM; k++) sd[k] = sqrt(sd[k]) + 1e-12;
    for (int i = 0; i < NTR + NTE; i++)
        for (int k = 0; k < DESC_DIM; k++) F[i * DESC_DIM + k] = (F[i * DESC_DIM + k] - mu[k]) / sd[k];
    for (int i = 0; i < NTR; i++) {
        cc[Y[i]]++;
        for (int k = 0; k < DESC_DIM; k++) cen[Y[i]][k] += F[i * DESC_DIM + k];
    }
    for (int c = 0; c < BK_SHAPES_CLASSES; c++)
        for (int k = 0; k < DESC_DIM; k++) cen[c][k] /= cc[c] ? cc[c] : 1;
    int correct = 0, pc_n[BK_SHAPES_CLASSES] = {0}, pc_ok[BK_SHAPES_CLASSES] = {0};
    int conf[BK_SHAPES_CLASSES][BK_SHAPES_CLASSES] = {{0}};
    for (int i = NTR; i < NTR + NTE; i++) {
        int best = 0;
        double bd = 1e300;
        for (int c = 0; c < BK_SHAPES_CLASSES; c++) {
            double d = 0;
            for (int k = 0; k < DESC_DIM; k++) d += (F[i * DESC_DIM + k] - cen[c][k]) * (F[i * DESC_DIM + k] - cen[c][k]);
            if (d < bd) bd = d, best = c;
        }
        pc_n[Y[i]]++;
        conf[Y[i]][best]++;
        if (best == Y[i]) correct++, pc_ok[Y[i]]++;
    }
    double acc = (double)correct / NTE;
    printf("# shapes descriptor (cov eigenvalues + radius histogram) nearest-centroid test accuracy: %.1f%% "
           "(chance %.1f%%)\n# per class:",
           100 * acc, 100.0 / BK_SHAPES_CLASSES);
    for (int c = 0; c < BK_SHAPES_CLASSES; c++) {
        int worst = -1;
        for (int d = 0; d < BK_SHAPES_CLASSES; d++)
            if (d != c && conf[c][d] > 0 && (worst < 0 || conf[c][d] > conf[c][worst])) worst = d;
        printf(" %s %.0f%%", bk_shapes_name(c), 100.0 * pc_ok[c] / (pc_n[c] ? pc_n[c] : 1));
        if (worst >= 0) printf(" (->%s)", bk_shapes_name(worst));
        printf(";");
    }
    printf("\n");
    char name[160];
    snprintf(name, sizeof name, "shapes: simple descriptor separates classes well above chance (%.1f%% > 40%%)",
             100 * acc);
    th_check(acc > 0.40, name, "too low");
    free(xyz);
    free(F);
    free(Y);
}

/* ========================================================================
 * speed
 * ===================================================================== */
static void test_speed(void)
{
    int32_t *tok = malloc(sizeof(int32_t) * 4096);
    float *xyz = malloc(sizeof(float) * 3 * 1024);
    int len, lab;
    uint64_t sink = 0;
    static const int lens[2] = {512, 2000};
    double rate512 = 0;
    for (int li = 0; li < 2; li++) {
        bk_listops_config o = bk_listops_config_default(lens[li]);
        int n = 0;
        long toks = 0;
        double t0 = now_s(), t1;
        do {
            for (int k = 0; k < 256; k++, n++) {
                bk_listops_sample(1, (uint64_t)n, &o, tok, &len, &lab);
                sink += (uint64_t)tok[len - 1] + (uint64_t)lab;
                toks += len;
            }
            t1 = now_s();
        } while (t1 - t0 < (g_quick ? 0.02 : 0.3));
        double rate = n / (t1 - t0);
        if (li == 0) rate512 = rate;
        printf("# speed: listops max_len %d (defaults, mean len %.0f): %.0f samples/s, %.1f M tokens/s (one core)\n",
               lens[li], (double)toks / n, rate, toks / (t1 - t0) / 1e6);
    }
    bk_shapes_config so = bk_shapes_config_default(1024);
    int n = 0;
    double t0 = now_s(), t1;
    do {
        for (int k = 0; k < 64; k++, n++) {
            bk_shapes_sample(1, (uint64_t)n, &so, xyz, &lab);
            sink += (uint64_t)lab;
        }
        t1 = now_s();
    } while (t1 - t0 < (g_quick ? 0.02 : 0.3));
    printf("# speed: shapes 1024 points: %.0f samples/s (one core)\n", n / (t1 - t0));
    /* reported, never checked: a speed is a property of the machine (benchmarks
     * record speeds; tests do not encode them) */
    (void)rate512;
    if (sink == 42) printf("#\n");
    free(tok);
    free(xyz);
}

int main(int argc, char **argv)
{
    TH.verbose = 1; /* one line per check, as before */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else {
            fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
            return 2;
        }
    }
    test_evaluator_selftest();
    test_listops_feasibility();
    test_listops_grid();
    test_listops_determinism();
    test_listops_bad_options();
    test_shapes_basic();
    test_shapes_separability();
    test_speed();
    return th_summary();
}
