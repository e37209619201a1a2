/* test_engine.c -- the LSE engine's row groups (src/core/lse_engine.c:
 * pairs, and 4 rows at a time up to 64 entries; row_softmax_g in the
 * forward's row passes, bwd_col_row and bwd_row_update in the backward)
 * against its one-row path, bitwise.
 *
 * The rows come in triples of equal rows (equal logits, equal log marginals,
 * equal incoming gradients), so the rows of a triple fall on different places
 * of a group (and, at a block's end or an odd row count, on the one-row
 * path); every row's potentials,
 * plan row, gradient row and marginal gradient must then be the same floats.
 * The operators' tests (reference, oracle, finite differences) bound the
 * arithmetic itself; this test catches a pair path that drifts within those
 * tolerances. Every instruction set this CPU runs, one thread and a team of
 * two, balanced and damped (kappa != 1) steps, row lengths around the vector
 * width and up to the pair limit. */
#include "../../src/core/internal.h"
#include "../harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int n, m, S;
    float kappa;
    int nt;
} ecase;

typedef struct {
    const bki_kernels *K;
    const bki_sk_problem *pb;
    int S, m;
    float *hist, *A, *G, *scr, *dla, *dlb;
} engine_args;

static void engine_member(void *arg)
{
    const engine_args *a = arg;
    const bki_team tm = bki_region_team();
    bki_sk_result res = {a->hist, a->A, a->m, NULL, NULL, 0, 0.0f, 0.0f};
    a->K->sk_forward(&tm, a->pb, &res, a->scr);
    bki_team_sync(&tm);
    a->K->sk_backward(&tm, a->pb, a->S, a->hist, a->A, a->m, a->G, a->m, a->scr, a->dla, a->dlb);
}

/* run the forward and the backward; out: hist, A, G, dla, dlb */
static void run_engine(const bki_kernels *K, const ecase *c, const float *C, const float *la, const float *lb,
                       const float *g0, const float *G0, float *hist, float *A, float *G, float *dla, float *dlb)
{
    const int n = c->n, m = c->m;
    float *scr = malloc(sizeof(float) * K->sk_scratch(n, m, c->nt));
    bki_sk_problem pb = {n, m, C, m, la, lb, c->S, 0.0f, g0, c->kappa, 0};
    memcpy(G, G0, sizeof(float) * (size_t)n * m);
    engine_args a = {K, &pb, c->S, m, hist, A, G, scr, dla, dlb};
    bki_parallel(c->nt, engine_member, &a);
    free(scr);
}

static int rows_equal(const float *x, int n, int m)
{
    for (int i = 0; i < n; i++)
        if (memcmp(x + (size_t)i * m, x + (size_t)(i - i % 3) * m, sizeof(float) * (size_t)m)) return 0;
    return 1;
}

static void one_case(const bki_kernels *K, const char *isa, const ecase *c, th_rng *r)
{
    const int n = c->n, m = c->m;
    const size_t nm = (size_t)n * m, hl = bki_hist_len(n, m, c->S);
    float *C = malloc(sizeof(float) * nm), *G0 = malloc(sizeof(float) * nm), *A = malloc(sizeof(float) * nm);
    float *G = malloc(sizeof(float) * nm), *hist = malloc(sizeof(float) * hl);
    float *la = malloc(sizeof(float) * n), *lb = malloc(sizeof(float) * m), *g0 = malloc(sizeof(float) * m);
    float *dla = malloc(sizeof(float) * n), *dlb = malloc(sizeof(float) * m);
    double za = 0.0, zb = 0.0;
    for (int i = 0; i < n; i += 3) za += 3.0 * (1.0 + i % 5);
    for (int j = 0; j < m; j++) zb += 1.0 + j % 3;
    for (int i = 0; i < n; i++) {
        const int i3 = i - i % 3; /* the triple's first row */
        if (i == i3)
            for (int j = 0; j < m; j++) {
                C[(size_t)i * m + j] = (float)(2.0 * th_normal(r));
                G0[(size_t)i * m + j] = (float)th_normal(r);
            }
        else {
            memcpy(C + (size_t)i * m, C + (size_t)i3 * m, sizeof(float) * (size_t)m);
            memcpy(G0 + (size_t)i * m, G0 + (size_t)i3 * m, sizeof(float) * (size_t)m);
        }
        la[i] = (float)log((1.0 + i3 % 5) / za);
    }
    for (int j = 0; j < m; j++) {
        lb[j] = (float)log((1.0 + j % 3) / zb);
        g0[j] = (float)(0.5 * th_normal(r));
    }
    int ok = 1, ran = 0;
    for (int marg = 0; marg < 2; marg++) { /* uniform marginals, g0 = 0; given ones, a g0 */
        run_engine(K, c, C, marg ? la : NULL, marg ? lb : NULL, marg ? g0 : NULL, G0, hist, A, G, marg ? dla : NULL,
                   marg ? dlb : NULL);
        ran++;
        ok &= rows_equal(A, n, m) && rows_equal(G, n, m);
        for (int t = 1; t <= c->S; t += 2) { /* row potentials of every row step */
            const float *f = hist + bki_hist_off(n, m, t);
            for (int i = 0; i < n; i++) ok &= !memcmp(&f[i], &f[i - i % 3], sizeof(float));
        }
        if (marg)
            for (int i = 0; i < n; i++) ok &= !memcmp(&dla[i], &dla[i - i % 3], sizeof(float));
        /* and the values are real: a row of A sums to about 1 / (n a_i) x n a_i */
        for (size_t e = 0; e < nm; e++) ok &= isfinite(A[e]) && isfinite(G[e]);
    }
    th_check(ok && ran == 2, "engine two rows at once", "%s, n %d m %d S %d kappa %g, %d member(s): %s", isa, n, m,
             c->S, (double)c->kappa, c->nt, ok ? "equal rows bitwise equal" : "equal rows DIFFER");
    free(C), free(G0), free(A), free(G), free(hist), free(la), free(lb), free(g0), free(dla), free(dlb);
}

static void isa_cases(const bki_kernels *K, const char *isa)
{
    th_rng r = {0x3e11a5u};
    /* n = 3 * odd: pairs straddle the triples and the last row is a single */
    const int ns[] = {9, 33, 99, 303};
    const int ms[] = {1, 7, 16, 33, 64, 100, 256, 1024};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ms / sizeof *ms; b++) {
            if ((size_t)ns[a] * ms[b] > 120000) continue;
            if (TH.quick && (a + b) % 2) continue;
            for (int v = 0; v < 2; v++) {
                const ecase c = {ns[a], ms[b], v ? 6 : 5, v ? 0.75f : 1.0f, 1 + (int)((a + b + v) % 2)};
                one_case(K, isa, &c, &r);
            }
        }
}

void test_engine(void)
{
    if (TH.filter && !strstr("engine", TH.filter)) return;
    isa_cases(&bki_kernels_avx2, "avx2");
    if (!strcmp(bk_isa(), "avx512")) isa_cases(&bki_kernels_avx512, "avx512");
    else printf("SKIP engine avx512: this CPU (or BK_ISA) runs the avx2 kernels only\n");
}
