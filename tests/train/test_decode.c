/* test_decode.c -- the beam search of src/train/decode.c (bki_beam_search,
 * model-independent) and bk_decode_config: exhaustive beams against brute
 * force under the length penalty, greedy against a hand-rolled argmax chain,
 * batched against one sentence at a time, EOS forced at the limit,
 * repeatability, bad input; the configuration's key=value setter.
 *
 * The synthetic decoder keeps each row's whole prefix as its state, reorders
 * it by parent as a model reorders its cache, and derives the next-token
 * log-probabilities from a hash of (sentence seed, prefix): a wrong parent
 * or token changes the distribution the search sees. It also checks that
 * every fed token was a finite-probability continuation of its parent's
 * prefix (or eos for a row without a live hypothesis). */
#include "../../src/train/decode.h"
#include "../harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LMAX 64

/* ---- the synthetic decoder ------------------------------------------------ */
typedef struct {
    int V, bos, eos, beam, R;
    const uint64_t *seed;  /* [B]: sentence b = r / beam                              */
    int forbid;            /* 1: some tokens get -inf (a function of the prefix)      */
    int eos_bias;          /* 1: log p(eos) pushed down by 30 (EOS only when forced)  */
    int eos_never;         /* 1: eos always -inf                                      */
    int flat;              /* 1: every token equally likely (ties)                    */
    int nan_at, inf_at;    /* >= 0: a NaN / +inf at row 0 token 1 at that step         */
    int fail_at;           /* >= 0: return BK_ERR_IO at that step                      */
    int tmax;              /* steps must be < tmax                                    */
    int32_t pref[2][512][LMAX + 1]; int plen[2][512];
    int cur;
    float prev[512 * 128];
    int calls;
    char bad[200];
} hdec;

/* one splitmix64 number from the state x (the library's generator) */
static uint64_t mix(uint64_t x) { return bk_splitmix64(&x); }

/* log p(. | prefix) of a sentence with seed s: the model the search and the references share */
static void model_logp(const hdec *h, uint64_t s, const int32_t *p, int n, float *out)
{
    const int V = h->V;
    if (h->flat) {
        for (int v = 0; v < V; v++) out[v] = -logf((float)V);
        return;
    }
    uint64_t x = mix(s);
    for (int i = 0; i < n; i++) x = mix(x ^ (uint64_t)(p[i] + 1) * 0x100000001b3ull);
    double raw[128], mx = -INFINITY;
    for (int v = 0; v < V; v++) {
        uint64_t y = mix(x + (uint64_t)v);
        raw[v] = 4.0 * (double)(y >> 11) / 9007199254740992.0;
        if (h->forbid && v != h->eos && (y & 7) == 0) raw[v] = -INFINITY;
        if (v == h->eos && h->eos_bias) raw[v] -= 30.0;
        if (v == h->eos && h->eos_never) raw[v] = -INFINITY;
        if (raw[v] > mx) mx = raw[v];
    }
    double z = 0;
    for (int v = 0; v < V; v++) z += raw[v] == -INFINITY ? 0.0 : exp(raw[v] - mx);
    for (int v = 0; v < V; v++) out[v] = raw[v] == -INFINITY ? -INFINITY : (float)(raw[v] - mx - log(z));
}

static bk_status hstep(void *ctx, int t, int rows, const int32_t *parent, const int32_t *tok, float *logp)
{
    hdec *h = ctx;
    h->calls++;
    if (h->fail_at == t) return BK_ERR_IO;
    if (rows != h->R || t >= h->tmax || t > LMAX) {
        snprintf(h->bad, sizeof h->bad, "step %d: rows %d (want %d), tmax %d", t, rows, h->R, h->tmax);
        return BK_ERR_NUMERIC;
    }
    const int nw = h->cur ^ 1;
    for (int r = 0; r < rows; r++) {
        if (t == 0) {
            if (parent[r] != r || tok[r] != h->bos) {
                snprintf(h->bad, sizeof h->bad, "t = 0 row %d: parent %d tok %d", r, parent[r], tok[r]);
                return BK_ERR_NUMERIC;
            }
            h->pref[nw][r][0] = tok[r];
            h->plen[nw][r] = 1;
            continue;
        }
        const int p = parent[r];
        if (p < 0 || p >= rows || p / h->beam != r / h->beam || h->plen[h->cur][p] != t) {
            snprintf(h->bad, sizeof h->bad, "step %d row %d: parent %d out of the sentence or stale", t, r, p);
            return BK_ERR_NUMERIC;
        }
        /* the token continues the parent's prefix: finite probability there, or eos fed to a
           row that holds no live hypothesis (its own parent) */
        if (!(h->prev[(size_t)p * h->V + tok[r]] > -INFINITY) && !(tok[r] == h->eos && p == r)) {
            snprintf(h->bad, sizeof h->bad, "step %d row %d: token %d has log p -inf after parent %d", t, r, tok[r], p);
            return BK_ERR_NUMERIC;
        }
        memcpy(h->pref[nw][r], h->pref[h->cur][p], sizeof(int32_t) * (size_t)t);
        h->pref[nw][r][t] = tok[r];
        h->plen[nw][r] = t + 1;
    }
    h->cur = nw;
    for (int r = 0; r < rows; r++) {
        model_logp(h, h->seed[r / h->beam], h->pref[nw][r] + 1, t, logp + (size_t)r * h->V);
        if (h->nan_at == t && r == 0) logp[1] = NAN;
        if (h->inf_at == t && r == 0) logp[1] = INFINITY;
    }
    memcpy(h->prev, logp, sizeof(float) * (size_t)rows * h->V);
    return BK_OK;
}

static hdec *hnew(int V, int beam, int B, const uint64_t *seed)
{
    if (B * beam > 512 || V > 128) {
        fprintf(stderr, "test_decode: at most 512 rows and 128 tokens\n");
        exit(2);
    }
    hdec *h = calloc(1, sizeof *h);
    h->V = V, h->bos = V - 1, h->eos = V > 2 ? 2 : 0, h->beam = beam, h->R = B * beam, h->seed = seed;
    h->nan_at = h->inf_at = h->fail_at = -1;
    h->tmax = LMAX;
    return h;
}

static bk_status run(hdec *h, int B, int beam, float lp, const int *max_len, int32_t *out, int stride,
                     int32_t *len, float *score)
{
    bki_decoder d = {h, h->V, h->bos, h->eos, hstep};
    bk_decode_config c = bk_decode_config_default();
    c.beam = beam, c.len_penalty = lp;
    if (B * beam > 512) return BK_ERR_SHAPE;
    h->beam = beam, h->R = B * beam, h->cur = 0, h->bad[0] = 0;
    bk_status st = bki_beam_search(&d, B, &c, max_len, out, stride, len, score);
    if (h->bad[0]) printf("# decoder: %s\n", h->bad);
    return st;
}

/* the score of tokens y (without eos) followed by eos, under the model */
static double seq_score(const hdec *h, uint64_t s, const int32_t *y, int n, float lp)
{
    int32_t p[LMAX + 1] = {0};
    float lg[128];
    double cum = 0;
    for (int i = 0; i <= n; i++) {
        model_logp(h, s, p, i, lg);
        int v = i < n ? y[i] : h->eos;
        cum += (double)lg[v];
        if (i < n) p[i] = v;
    }
    return lp == 0.0f ? cum : cum / pow((double)(n + 1), (double)lp);
}

/* brute force: every output of at most L tokens with its EOS (forced at L) */
static void brute(const hdec *h, uint64_t s, int L, float lp, int32_t *p, int n, double cum, double *best,
                  int32_t *bt, int *bn)
{
    float lg[128];
    model_logp(h, s, p, n, lg);
    for (int v = 0; v < h->V; v++) {
        if (lg[v] == -INFINITY) continue;
        if (n + 1 == L && v != h->eos) continue;
        double c = cum + (double)lg[v];
        if (v == h->eos) {
            double sc = lp == 0.0f ? c : c / pow((double)(n + 1), (double)lp);
            if (sc > *best) *best = sc, *bn = n, memcpy(bt, p, sizeof(int32_t) * (size_t)n);
        } else {
            p[n] = v;
            brute(h, s, L, lp, p, n + 1, c, best, bt, bn);
        }
    }
}

/* the search sums log p in double, token by token, as the references do: scores agree exactly */
static int same_f(float a, float b) { return a == b; }

/* ---- (1) exhaustive beams equal brute force --------------------------------- */
static void test_exhaustive(void)
{
    const float lps[3] = {0.0f, 1.0f, 2.0f};
    for (int li = 0; li < 3; li++)
        for (int L = 1; L <= 5; L++)
            for (int forbid = 0; forbid <= 1; forbid++) {
                uint64_t seed[3] = {11u + (uint64_t)L, 222u + (uint64_t)L * 7, 3333u};
                const int beam = L <= 4 ? 64 : 128, B = 3;
                hdec *h = hnew(4, beam, B, seed);
                h->forbid = forbid;
                int ml[3] = {L, L, L};
                int32_t out[3 * LMAX], len[3];
                float sc[3];
                bk_status st = run(h, B, beam, lps[li], ml, out, LMAX, len, sc);
                int ok = st == BK_OK, bad = -1;
                double want = 0;
                for (int b = 0; ok && b < B; b++) {
                    int32_t p[LMAX], bt[LMAX];
                    double best = -INFINITY;
                    int bn = -1;
                    brute(h, seed[b], L, lps[li], p, 0, 0.0, &best, bt, &bn);
                    want = best;
                    if (bn != len[b] || memcmp(bt, out + b * LMAX, sizeof(int32_t) * (size_t)bn) ||
                        !same_f(sc[b], (float)best))
                        ok = 0, bad = b;
                }
                char name[160];
                snprintf(name, sizeof name, "exhaustive beam %d = brute force (V 4, max_len %d, len_penalty %g%s)",
                         beam, L, (double)lps[li], forbid ? ", some tokens -inf" : "");
                th_check(ok, name, "status %d (%s), sentence %d: len %d score %.9g vs brute %.9g", (int)st,
                         st ? bk_last_error() : "", bad, bad >= 0 ? len[bad] : -1, bad >= 0 ? (double)sc[bad] : 0.0,
                         want);
                free(h);
            }
}

/* smaller beams: the answer is a legal output whose reported score is its true score */
static void test_consistent(void)
{
    int ok = 1;
    char why[200] = "";
    for (int beam = 1; beam <= 6 && ok; beam++)
        for (int trial = 0; trial < 6 && ok; trial++) {
            uint64_t seed[4] = {100u + (uint64_t)trial, 200u + (uint64_t)beam, 300u, 400u + (uint64_t)trial * beam};
            const int B = 4, ml[4] = {9, 3, 12, 6};
            const float lp = 0.5f * (float)(trial % 4);
            hdec *h = hnew(37, beam, B, seed);
            h->forbid = trial & 1;
            int32_t out[4 * 16], len[4];
            float sc[4];
            bk_status st = run(h, B, beam, lp, ml, out, 16, len, sc);
            if (st) ok = 0, snprintf(why, sizeof why, "status %d: %s", (int)st, bk_last_error());
            for (int b = 0; ok && b < B; b++) {
                double s = seq_score(h, seed[b], out + b * 16, len[b], lp);
                int legal = len[b] >= 0 && len[b] <= ml[b] - 1;
                for (int i = 0; legal && i < len[b]; i++) legal = out[b * 16 + i] != h->eos;
                if (!legal || !same_f(sc[b], (float)s))
                    ok = 0, snprintf(why, sizeof why, "beam %d trial %d sentence %d: len %d score %.9g, true %.9g",
                                     beam, trial, b, len[b], (double)sc[b], s);
            }
            free(h);
        }
    th_check(ok, "beams 1..6: the answer is a legal output and its score is its true score", "%s", why);
}

/* ---- a naive reference beam search: explicit prefixes, every candidate sorted ---- */
typedef struct { double s; int k, v; } rcand;
static int rcmp(const void *a, const void *b)
{
    const rcand *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    if (x->k != y->k) return x->k < y->k ? -1 : 1;
    return x->v < y->v ? -1 : x->v > y->v;
}
static void ref_beam(const hdec *h, uint64_t s, int L, int beam, float lp, int32_t *bt, int *bn, double *bs)
{
    static int32_t pre[2][128][LMAX];
    static double cum[2][128];
    static rcand cs[128 * 128];
    int nal = 1, nfin = 0, cur = 0;
    cum[0][0] = 0;
    *bn = -1, *bs = -INFINITY;
    for (int t = 0; t < L && nal > 0 && nfin < beam; t++) {
        int n = 0;
        for (int k = 0; k < nal; k++) {
            float lg[128];
            model_logp(h, s, pre[cur][k], t, lg);
            for (int v = 0; v < h->V; v++)
                if (lg[v] > -INFINITY && (t < L - 1 || v == h->eos)) cs[n++] = (rcand){cum[cur][k] + (double)lg[v], k, v};
        }
        qsort(cs, (size_t)n, sizeof *cs, rcmp);
        if (n > 2 * beam) n = 2 * beam;
        int nx = 0;
        for (int i = 0; i < n; i++) {
            if (cs[i].v == h->eos) {
                if (i < beam && nfin < beam) {
                    nfin++;
                    double sc = lp == 0.0f ? cs[i].s : cs[i].s / pow((double)(t + 1), (double)lp);
                    if (sc > *bs) *bs = sc, *bn = t, memcpy(bt, pre[cur][cs[i].k], sizeof(int32_t) * (size_t)t);
                }
            } else if (nx < beam) {
                memcpy(pre[cur ^ 1][nx], pre[cur][cs[i].k], sizeof(int32_t) * (size_t)t);
                pre[cur ^ 1][nx][t] = cs[i].v;
                cum[cur ^ 1][nx++] = cs[i].s;
            }
        }
        nal = nx, cur ^= 1;
    }
}

static void test_reference(void)
{
    int ok = 1, n = 0;
    char why[200] = "";
    for (int beam = 1; beam <= 12 && ok; beam++)
        for (int trial = 0; trial < 8 && ok; trial++, n++) {
            uint64_t seed[3] = {900u + (uint64_t)trial, 77u * (uint64_t)beam, 5u + (uint64_t)trial};
            const int B = 3, ml[3] = {2 + trial, 10, 1 + (beam + trial) % 14};
            const float lp = 0.5f * (float)(trial % 5);
            hdec *h = hnew(trial & 1 ? 11 : 40, beam, B, seed);
            h->forbid = trial & 2;
            int32_t out[3 * 16], len[3];
            float sc[3];
            bk_status st = run(h, B, beam, lp, ml, out, 16, len, sc);
            if (st) ok = 0, snprintf(why, sizeof why, "status %d: %s", (int)st, bk_last_error());
            for (int b = 0; ok && b < B; b++) {
                int32_t bt[LMAX];
                int bn;
                double bs;
                ref_beam(h, seed[b], ml[b], beam, lp, bt, &bn, &bs);
                if (bn != len[b] || memcmp(bt, out + b * 16, sizeof(int32_t) * (size_t)bn) || sc[b] != (float)bs)
                    ok = 0, snprintf(why, sizeof why, "beam %d trial %d sentence %d: len %d score %.9g, reference %d %.9g",
                                     beam, trial, b, len[b], (double)sc[b], bn, bs);
            }
            free(h);
        }
    th_check(ok, "beams 1..12 = a naive reference beam search (every candidate sorted)", "%s (%d cases)", why, n);
}

/* ---- (2) greedy is the argmax chain ---------------------------------------- */
static void test_greedy(void)
{
    int ok = 1;
    char why[200] = "";
    for (int trial = 0; trial < 20 && ok; trial++) {
        uint64_t seed[1] = {5000u + (uint64_t)trial};
        const int L = 3 + trial % 15, V = 23;
        const float lp = trial % 3 == 0 ? 0.0f : 1.0f;
        hdec *h = hnew(V, 1, 1, seed);
        h->forbid = trial & 1;
        h->eos_bias = trial % 5 == 4;
        /* hand-rolled: argmax, ties to the lower token, eos forced at the limit */
        int32_t want[LMAX];
        int n = 0;
        double cum = 0;
        for (;;) {
            float lg[128];
            model_logp(h, seed[0], want, n, lg);
            int a = 0;
            for (int v = 1; v < V; v++)
                if (lg[v] > lg[a]) a = v;
            if (n + 1 == L) a = h->eos;
            cum += (double)lg[a];
            if (a == h->eos) break;
            want[n++] = a;
        }
        const double wsc = lp == 0.0f ? cum : cum / pow((double)(n + 1), (double)lp);
        int32_t out[LMAX], len;
        float sc;
        const int ml[1] = {L};
        bk_status st = run(h, 1, 1, lp, ml, out, LMAX, &len, &sc);
        if (st || len != n || memcmp(out, want, sizeof(int32_t) * (size_t)n) || !same_f(sc, (float)wsc))
            ok = 0, snprintf(why, sizeof why, "trial %d: status %d len %d (want %d) score %.9g (want %.9g)", trial,
                             (int)st, len, n, (double)sc, wsc);
        free(h);
    }
    th_check(ok, "greedy (beam 1) = the hand-rolled argmax chain with EOS forced at the limit", "%s", why);

    /* ties: every token equally likely -> the lowest token each step, eos forced at the limit */
    uint64_t seed[1] = {1};
    hdec *h = hnew(9, 1, 1, seed);
    h->flat = 1;
    h->eos = 8, h->bos = 3;
    const int ml[1] = {6};
    int32_t out[8], len = -1;
    float sc;
    bk_status st = run(h, 1, 1, 0.0f, ml, out, 8, &len, &sc);
    int zeros = st == BK_OK && len == 5;
    for (int i = 0; zeros && i < 5; i++) zeros = out[i] == 0;
    th_check(zeros && fabs(sc + 6.0 * log(9.0)) < 1e-5, "greedy ties go to the lower token", "status %d len %d score %g",
             (int)st, len, (double)sc);
    free(h);

    /* ties in the answer go to the hypothesis finished first, ties among candidates to the lower
       row then the lower token: uniform log p, eos = 0, beam 3. Step 0 finishes [] (rank 0) and
       keeps [1] [2] [3]; step 1 finishes [1] (row 0 token 0 ranks first) and keeps [1 1] [1 2] [1 3];
       step 2 finishes [1 1]: three finished, done. len_penalty 1: every score is -log 9, the first
       ([]) wins; len_penalty 2: -log 9 / len, the longest ([1 1]) wins. */
    for (int lpi = 1; lpi <= 2; lpi++) {
        h = hnew(9, 3, 1, seed);
        h->flat = 1;
        h->eos = 0, h->bos = 3;
        len = -1;
        st = run(h, 1, 3, (float)lpi, ml, out, 8, &len, &sc);
        int good = st == BK_OK && (lpi == 1 ? len == 0 : len == 2 && out[0] == 1 && out[1] == 1) && h->calls == 3;
        th_check(good, lpi == 1 ? "beam ties: equal scores go to the hypothesis finished first"
                                : "beam ties: candidates ordered by row, then token",
                 "status %d len %d out %d %d, %d steps", (int)st, len, out[0], out[1], h->calls);
        free(h);
    }
}

/* ---- (3) batched = one sentence at a time ----------------------------------- */
static void test_batched(void)
{
    uint64_t seed[5] = {71, 72, 9999, 123456789, 42};
    const int ml[5] = {3, 9, 1, 6, 12}, B = 5;
    int ok = 1;
    char why[200] = "";
    for (int beam = 1; beam <= 5 && ok; beam += 2) {
        hdec *h = hnew(31, beam, B, seed);
        h->forbid = 1;
        int32_t out[5 * 12], len[5];
        float sc[5];
        bk_status st = run(h, B, beam, 1.0f, ml, out, 12, len, sc);
        if (st) ok = 0, snprintf(why, sizeof why, "batch: %s", bk_last_error());
        for (int b = 0; ok && b < B; b++) {
            hdec *g = hnew(31, beam, 1, seed + b);
            g->forbid = 1;
            int32_t o1[16], l1;
            float s1;
            st = run(g, 1, beam, 1.0f, ml + b, o1, 11, &l1, &s1);
            if (st || l1 != len[b] || memcmp(o1, out + b * 12, sizeof(int32_t) * (size_t)l1) || s1 != sc[b])
                ok = 0, snprintf(why, sizeof why, "beam %d sentence %d: alone len %d score %.9g, batched len %d %.9g",
                                 beam, b, l1, (double)s1, len[b], (double)sc[b]);
            free(g);
        }
        free(h);
    }
    th_check(ok, "batched sentences with different max_len = each decoded alone (beams 1, 3, 5)", "%s", why);
}

/* ---- (4) EOS forced at the limit --------------------------------------------- */
static void test_forced(void)
{
    for (int beam = 1; beam <= 4; beam += 3) {
        uint64_t seed[2] = {31337, 4242};
        hdec *h = hnew(17, beam, 2, seed);
        h->eos_bias = 1;
        const int ml[2] = {7, 1};
        h->tmax = 7; /* never a step past the longest limit */
        int32_t out[2 * 6], len[2];
        float sc[2];
        bk_status st = run(h, 2, beam, 1.0f, ml, out, 6, len, sc);
        int ok = st == BK_OK && len[0] == 6 && len[1] == 0, legal = 1;
        for (int i = 0; ok && i < 6; i++) legal &= out[i] != h->eos;
        double s0 = ok ? seq_score(h, seed[0], out, 6, 1.0f) : 0, s1 = seq_score(h, seed[1], NULL, 0, 1.0f);
        char name[120];
        snprintf(name, sizeof name, "beam %d: EOS forced at the limit (max_len 7 -> 6 tokens; max_len 1 -> empty)", beam);
        th_check(ok && legal && same_f(sc[0], (float)s0) && same_f(sc[1], (float)s1), name,
                 "status %d (%s) len %d %d scores %.9g %.9g want %.9g %.9g", (int)st, st ? bk_last_error() : "", len[0],
                 len[1], (double)sc[0], (double)sc[1], s0, s1);
        free(h);
    }
    /* eos impossible even when forced: no finite output */
    uint64_t seed[1] = {5};
    hdec *h = hnew(6, 2, 1, seed);
    h->eos_never = 1;
    const int ml[1] = {4};
    int32_t out[4], len = 77;
    bk_status st = run(h, 1, 2, 1.0f, ml, out, 4, &len, NULL);
    th_check(st == BK_ERR_NUMERIC && len == 77, "eos -inf even at the limit: BK_ERR_NUMERIC, outputs untouched",
             "status %d len %d (%s)", (int)st, len, bk_last_error());
    free(h);
}

/* ---- (5) repeatable ------------------------------------------------------------ */
static void test_repeat(void)
{
    uint64_t seed[3] = {1, 2, 3};
    const int ml[3] = {20, 14, 30};
    int32_t o1[3 * 32], o2[3 * 32], l1[3], l2[3];
    float s1[3], s2[3];
    memset(o1, 0, sizeof o1), memset(o2, 0, sizeof o2);
    hdec *h = hnew(101, 5, 3, seed);
    h->forbid = 1;
    bk_status a = run(h, 3, 5, 1.0f, ml, o1, 32, l1, s1);
    bk_status b = run(h, 3, 5, 1.0f, ml, o2, 32, l2, s2);
    th_check(a == BK_OK && b == BK_OK && !memcmp(o1, o2, sizeof o1) && !memcmp(l1, l2, sizeof l1) &&
                 !memcmp(s1, s2, sizeof s1),
             "the same call twice: identical tokens, lengths and scores", "status %d %d", (int)a, (int)b);
    free(h);
}

/* ---- (6) bad input ------------------------------------------------------------- */
static void test_bad(void)
{
    uint64_t seed[2] = {8, 9};
    hdec *h = hnew(10, 2, 2, seed);
    bki_decoder d = {h, 10, h->bos, h->eos, hstep};
    bk_decode_config c = bk_decode_config_default();
    c.beam = 2;
    const int ml[2] = {5, 3};
    int32_t out[2 * 8], len[2] = {-7, -7};
    float sc[2];
#define BAD(expr, want, name)                                                                                       \
    do {                                                                                                           \
        h->cur = 0;                                                                                                \
        bk_status s_ = (expr);                                                                                     \
        th_check(s_ == (want) && len[0] == -7 && len[1] == -7, name, "status %d (want %d) len %d: %s", (int)s_,    \
                 (int)(want), len[0], bk_last_error());                                                            \
    } while (0)
    c.beam = 0;
    BAD(bki_beam_search(&d, 2, &c, ml, out, 8, len, sc), BK_ERR_PARAM, "beam 0: BK_ERR_PARAM");
    c.beam = 1025;
    BAD(bki_beam_search(&d, 2, &c, ml, out, 8, len, sc), BK_ERR_PARAM, "beam 1025: BK_ERR_PARAM");
    c.beam = 2;
    c.len_penalty = NAN;
    BAD(bki_beam_search(&d, 2, &c, ml, out, 8, len, sc), BK_ERR_PARAM, "len_penalty NaN: BK_ERR_PARAM");
    c.len_penalty = 1.0f;
    BAD(bki_beam_search(&d, 2, &c, ml, out, 3, len, sc), BK_ERR_SHAPE, "out_stride 3 < max_len - 1 = 4: BK_ERR_SHAPE");
    BAD(bki_beam_search(&d, 0, &c, ml, out, 8, len, sc), BK_ERR_SHAPE, "B = 0: BK_ERR_SHAPE");
    const int ml0[2] = {5, 0};
    BAD(bki_beam_search(&d, 2, &c, ml0, out, 8, len, sc), BK_ERR_LENGTH, "max_len 0: BK_ERR_LENGTH");
    BAD(bki_beam_search(NULL, 2, &c, ml, out, 8, len, sc), BK_ERR_NULL, "NULL decoder: BK_ERR_NULL");
    BAD(bki_beam_search(&d, 2, NULL, ml, out, 8, len, sc), BK_ERR_NULL, "NULL config: BK_ERR_NULL");
    BAD(bki_beam_search(&d, 2, &c, NULL, out, 8, len, sc), BK_ERR_NULL, "NULL max_len: BK_ERR_NULL");
    BAD(bki_beam_search(&d, 2, &c, ml, NULL, 8, len, sc), BK_ERR_NULL, "NULL out: BK_ERR_NULL");
    BAD(bki_beam_search(&d, 2, &c, ml, out, 8, NULL, sc), BK_ERR_NULL, "NULL out_len: BK_ERR_NULL");
    bki_decoder d0 = d;
    d0.step = NULL;
    BAD(bki_beam_search(&d0, 2, &c, ml, out, 8, len, sc), BK_ERR_NULL, "NULL step: BK_ERR_NULL");
    d0 = d;
    d0.eos = 10;
    BAD(bki_beam_search(&d0, 2, &c, ml, out, 8, len, sc), BK_ERR_PARAM, "eos = vocab: BK_ERR_PARAM");
    d0 = d;
    d0.bos = -1;
    BAD(bki_beam_search(&d0, 2, &c, ml, out, 8, len, sc), BK_ERR_PARAM, "bos = -1: BK_ERR_PARAM");
    d0 = d;
    d0.vocab = 0;
    BAD(bki_beam_search(&d0, 2, &c, ml, out, 8, len, sc), BK_ERR_SHAPE, "vocab 0: BK_ERR_SHAPE");
    h->nan_at = 2;
    BAD(bki_beam_search(&d, 2, &c, ml, out, 8, len, sc), BK_ERR_NONFINITE, "NaN log p from step: BK_ERR_NONFINITE");
    th_check(strstr(bk_last_error(), "step 2") && strstr(bk_last_error(), "token 1"),
             "the NaN's message names the step and the token", "%s", bk_last_error());
    h->nan_at = -1, h->inf_at = 1;
    BAD(bki_beam_search(&d, 2, &c, ml, out, 8, len, sc), BK_ERR_NONFINITE, "+inf log p from step: BK_ERR_NONFINITE");
    h->inf_at = -1, h->fail_at = 1, h->calls = 0;
    BAD(bki_beam_search(&d, 2, &c, ml, out, 8, len, sc), BK_ERR_IO, "the step's error is returned (BK_ERR_IO)");
    th_check(h->calls == 2, "the search stops at the failing step", "%d calls", h->calls);
    h->fail_at = -1;
    h->cur = 0;
    th_check(bki_beam_search(&d, 2, &c, ml, out, 8, len, NULL) == BK_OK && len[0] >= 0 && len[0] <= 4 && len[1] <= 2,
             "score NULL is allowed", "%s", bk_last_error());
#undef BAD
    free(h);
}

/* ---- the configuration ------------------------------------------------------- */
static void test_config(void)
{
    bk_decode_config c = bk_decode_config_default();
    th_check(c.beam == 5 && c.len_penalty == 1.0f && c.len_a == 1.5f && c.len_b == 10 && c.cache == 1,
             "bk_decode_config_default: beam 5, len_penalty 1, len_a 1.5, len_b 10, cache 1", "%d %g %g %d %d", c.beam,
             (double)c.len_penalty, (double)c.len_a, c.len_b, c.cache);
    int ok = bk_decode_config_set(&c, "beam", "1") == BK_OK && bk_decode_config_set(&c, "len_penalty", "-0.5") == BK_OK &&
             bk_decode_config_set(&c, "len_a", "0") == BK_OK && bk_decode_config_set(&c, "len_b", "0") == BK_OK &&
             bk_decode_config_set(&c, "cache", "0") == BK_OK;
    th_check(ok && c.beam == 1 && c.len_penalty == -0.5f && c.len_a == 0.0f && c.len_b == 0 && c.cache == 0,
             "bk_decode_config_set: good values", "%s", bk_last_error());
    ok = bk_decode_config_set(&c, "beam", "1024") == BK_OK && c.beam == 1024;
    th_check(ok, "beam 1024 is allowed", "%s", bk_last_error());
    const bk_decode_config keep = c;
    static const char *const bad[][2] = {{"beam", "0"},       {"beam", "1025"},    {"beam", "2.5"}, {"beam", "x"},
                                         {"len_penalty", "nan"}, {"len_penalty", "inf"}, {"len_a", "-1"},
                                         {"len_a", "inf"},    {"len_b", "-1"},     {"cache", "2"},  {"cache", "-1"},
                                         {"beams", "3"},      {"", "1"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bk_status st = bk_decode_config_set(&c, bad[i][0], bad[i][1]);
        char name[100];
        snprintf(name, sizeof name, "bk_decode_config_set %s=%s: BK_ERR_PARAM, config unchanged", bad[i][0], bad[i][1]);
        th_check(st == BK_ERR_PARAM && !memcmp(&c, &keep, sizeof c) && *bk_last_error(), name, "status %d (%s)",
                 (int)st, bk_last_error());
    }
    th_check(bk_decode_config_set(&c, NULL, "1") == BK_ERR_NULL && bk_decode_config_set(&c, "beam", NULL) == BK_ERR_NULL &&
                 bk_decode_config_set(NULL, "beam", "1") == BK_ERR_NULL,
             "bk_decode_config_set: NULL config, key or value: BK_ERR_NULL", "%s", bk_last_error());
}

int main(void)
{
    TH.verbose = 1; /* one line per check, as before */
    test_config();
    test_exhaustive();
    test_consistent();
    test_reference();
    test_greedy();
    test_batched();
    test_forced();
    test_repeat();
    test_bad();
    return th_summary();
}
