/* test_nystrom.c -- Nystrom attention, through the registry's generic calls
 * (bk_op_*; the operator has no typed entry points): against the
 * independent double reference (tests/ops/ref_nystrom.c: dual numbers,
 * forward-mode gradients) over a grid (padding, both layouts, cross-
 * attention, landmark counts below, at and above the lengths, 0 to 6
 * iterations), the reference itself against central differences,
 * directional finite differences of the float32 operator (dq, dk, dv, with
 * padding), properties (l = N approaches softmax attention as the
 * iterations grow; A pinv(A) A ~ A for a well-conditioned A; padding ==
 * truncation bitwise; the schema), the determinism contract (1, 2, 3, 5, 8
 * threads; alone vs in a batch), and bad input. */
#include "birkhoff.h"
#include "../harness.h"
#include "ref_nystrom.h"
#include "../tutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, H, Nq, Nk, d, dv, layout, pad;
    int l, T;
} ncase;

typedef struct {
    th_prob pb;
    bk_nystrom_config p;
} nbuf;

static const bk_op *nys(void) { return bk_op_find("nystrom"); }

static void nb_init(nbuf *t, const ncase *c, uint64_t seed, double sigma)
{
    th_rng r = {seed};
    th_prob_init(&t->pb, c->B, c->H, c->Nq, c->Nk, c->d, c->dv, c->layout, c->pad, sigma, &r);
    bk_op_config_default(nys(), &t->p);
    t->p.landmarks = c->l;
    t->p.iters = c->T;
}

static bk_status nfwd(nbuf *t, void *tape, int attn)
{
    return bk_op_forward(nys(), &t->pb.desc, &t->p, &t->pb.tq, &t->pb.tk, &t->pb.tv, &t->pb.to, tape,
                         attn ? &t->pb.ta : NULL, NULL, 0);
}

static bk_status nbwd(nbuf *t, const void *tape)
{
    return bk_op_backward(nys(), &t->pb.desc, &t->p, &t->pb.tq, &t->pb.tk, &t->pb.tv, &t->pb.tdo, tape, &t->pb.tdq,
                          &t->pb.tdk, &t->pb.tdv, NULL, 0);
}

static void check_ref(const ncase *c, uint64_t seed)
{
    nbuf t;
    nb_init(&t, c, seed, 1.0);
    void *tape = malloc(bk_op_tape_size(nys(), &t.pb.desc, &t.p));
    bk_status s1 = nfwd(&t, tape, 1), s2 = s1 ? s1 : nbwd(&t, tape);
    char name[200];
    snprintf(name, sizeof name, "nystrom-ref B%d H%d Nq%d Nk%d d%d dv%d l%d T%d %s pad%d", c->B, c->H, c->Nq, c->Nk,
             c->d, c->dv, c->l, c->T, c->layout ? "bnhd" : "bhnd", c->pad);
    if (!th_check(s1 == BK_OK && s2 == BK_OK, name, "%s / %s: %s", bk_status_str(s1), bk_status_str(s2),
                  bk_last_error())) {
        free(tape);
        th_prob_free(&t.pb);
        return;
    }
    const int B = c->B, H = c->H;
    th_prob *pb = &t.pb;
    double *Q = th_gather(&pb->tq, B, H, c->Nq, c->d, pb->ql), *K = th_gather(&pb->tk, B, H, c->Nk, c->d, pb->kl);
    double *V = th_gather(&pb->tv, B, H, c->Nk, c->dv, pb->kl), *dO = th_gather(&pb->tdo, B, H, c->Nq, c->dv, pb->ql);
    const size_t nq = (size_t)B * H * c->Nq, nk = (size_t)B * H * c->Nk;
    double *A = calloc(nq * c->Nk, 8), *O = calloc(nq * c->dv, 8), *dQ = calloc(nq * c->d, 8);
    double *dK = calloc(nk * c->d, 8), *dV = calloc(nk * c->dv, 8);
    int *ql = th_lens_int(pb->ql, B), *kl = th_lens_int(pb->kl, B);
    const double s = (double)(1.0f / sqrtf((float)c->d));
    ref_nystrom_forward_batched(B, H, c->Nq, c->Nk, c->d, c->dv, ql, kl, Q, K, V, c->l, c->T, s, A, O);
    ref_nystrom_backward_batched(B, H, c->Nq, c->Nk, c->d, c->dv, ql, kl, Q, K, V, c->l, c->T, s, dO, dQ, dK, dV);
    const double eo = th_rel_err(&pb->to, B, H, c->Nq, c->dv, O), ea = th_rel_err(&pb->ta, B, H, c->Nq, c->Nk, A);
    const double eq = th_rel_err(&pb->tdq, B, H, c->Nq, c->d, dQ), ek = th_rel_err(&pb->tdk, B, H, c->Nk, c->d, dK);
    const double ev = th_rel_err(&pb->tdv, B, H, c->Nk, c->dv, dV);
    th_check(eo <= 1e-5 && ea <= 1e-5 && eq <= 1e-4 && ek <= 1e-4 && ev <= 1e-4, name,
             "O %.1e A %.1e dQ %.1e dK %.1e dV %.1e", eo, ea, eq, ek, ev);
    free(Q); free(K); free(V); free(dO); free(A); free(O); free(dQ); free(dK); free(dV);
    free(ql); free(kl); free(tape);
    th_prob_free(&t.pb);
}

static void test_nystrom_grid(void)
{
    const int shapes[][6] = {{1, 1, 1, 1, 2, 1},   {1, 1, 6, 6, 4, 3},   {2, 2, 9, 7, 8, 5},
                             {1, 3, 5, 12, 4, 4},  {3, 1, 16, 11, 6, 8}, {2, 2, 40, 33, 16, 8}};
    const int lt[][2] = {{3, 6}, {4, 1}, {64, 6}, {1, 0}, {8, 2}};
    uint64_t seed = 4000;
    for (int si = 0; si < 6; si++)
        for (int li = 0; li < 5; li++)
            for (int pad = 0; pad < 3; pad++) {
                if ((si + li + pad) % (TH.quick ? 4 : 2)) continue;
                const ncase c = {shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], shapes[si][4],
                                 shapes[si][5], (si + li + pad) % 2, pad, lt[li][0], lt[li][1]};
                check_ref(&c, seed++);
            }
}

/* the reference's forward-mode gradients against its own central
 * differences (double), on an uneven problem (segments of 2 and 3 rows) */
static void test_nystrom_ref_self(void)
{
    enum { n = 7, m = 5, d = 3, dv = 2, l = 3, T = 3 };
    th_rng r = {4100};
    double Q[n * d], K[m * d], V[m * dv], dO[n * dv], dQ[n * d], dK[m * d], dV[m * dv], O[n * dv];
    for (int i = 0; i < n * d; i++) Q[i] = th_normal(&r);
    for (int i = 0; i < m * d; i++) K[i] = th_normal(&r);
    for (int i = 0; i < m * dv; i++) V[i] = th_normal(&r);
    for (int i = 0; i < n * dv; i++) dO[i] = th_normal(&r);
    ref_nystrom_backward(n, m, d, dv, Q, K, V, l, T, 0.7, dO, dQ, dK, dV);
    double *xs[3] = {Q, K, V}, *gs[3] = {dQ, dK, dV}, err = 0.0;
    const int cnt[3] = {n * d, m * d, m * dv};
    for (int w = 0; w < 3; w++)
        for (int x = 0; x < cnt[w]; x++) {
            const double h = 1e-6, x0 = xs[w][x];
            double L[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                xs[w][x] = x0 + (sgn ? -h : h);
                ref_nystrom_forward(n, m, d, dv, Q, K, V, l, T, 0.7, NULL, O);
                L[sgn] = 0.0;
                for (int e = 0; e < n * dv; e++) L[sgn] += dO[e] * O[e];
            }
            xs[w][x] = x0;
            err = fmax(err, fabs((L[0] - L[1]) / (2 * h) - gs[w][x]) / fmax(1.0, fabs(gs[w][x])));
        }
    th_check(err < 1e-6, "nystrom reference: forward-mode gradients == central differences (double)", "%.2e", err);
}

static double nys_loss(void *ctx)
{
    nbuf *t = ctx;
    nfwd(t, NULL, 0);
    double L = 0;
    const bk_attn_desc *d = &t->pb.desc;
    th_prob *pb = &t->pb;
    for (int b = 0; b < d->B; b++) /* the valid rows (padded ones are zero and dout NaN there) */
        for (int h = 0; h < d->H; h++)
            for (int i = 0; i < (pb->ql ? pb->ql[b] : d->Nq); i++)
                for (int x = 0; x < d->dv; x++) {
                    const int64_t o = b * pb->to.stride_b + h * pb->to.stride_h + i * pb->to.stride_n + x;
                    L += (double)pb->o[o] * pb->dout[o];
                }
    return L;
}

/* directional finite differences of the float32 operator, every gradient,
 * with padding (the perturbation touches padded rows too: their gradient is
 * zero and they are never read) */
static void test_nystrom_fd(void)
{
    const ncase cs[3] = {{2, 2, 9, 7, 4, 3, 0, 1, 3, 6}, {2, 1, 6, 8, 4, 3, 1, 1, 2, 3}, {1, 2, 5, 5, 3, 2, 0, 0, 5, 6}};
    for (int k = 0; k < 3; k++) {
        const ncase *c = &cs[k];
        nbuf t;
        nb_init(&t, c, 4200 + k, 1.0);
        /* padded rows hold NaN: a perturbation of them must be ignored, and
         * the directional sum must stay finite, so zero them in the inputs
         * while their gradients are checked zero by the grid */
        th_prob *pb = &t.pb;
        const size_t nq = (size_t)c->B * c->H * c->Nq, nk = (size_t)c->B * c->H * c->Nk;
        for (size_t i = 0; i < nq * c->d; i++) if (isnan(pb->q[i])) pb->q[i] = 0.0f;
        for (size_t i = 0; i < nk * c->d; i++) if (isnan(pb->k[i])) pb->k[i] = 0.0f;
        for (size_t i = 0; i < nk * c->dv; i++) if (isnan(pb->v[i])) pb->v[i] = 0.0f;
        bk_status s = nfwd(&t, NULL, 0);
        s = s ? s : nbwd(&t, NULL);
        th_check(s == BK_OK, "nystrom FD: forward and backward", "%s", bk_last_error());
        float *in[3] = {pb->q, pb->k, pb->v};
        const float *an[3] = {pb->dq, pb->dk, pb->dv};
        const int cnt[3] = {(int)(nq * c->d), (int)(nk * c->d), (int)(nk * c->dv)};
        const char *nm[3] = {"dq", "dk", "dv"};
        th_rng r = {31 + (uint64_t)k};
        for (int w = 0; w < 3; w++) {
            char name[96];
            snprintf(name, sizeof name, "nystrom directional FD %s (l %d, T %d, %s)", nm[w], c->l, c->T,
                     c->pad ? "padded" : "full");
            th_directional_fd(name, in[w], an[w], cnt[w], 1e-3f, &r, nys_loss, &t);
        }
        th_prob_free(&t.pb);
    }
}

static float at(const bk_tensor *t, int b, int h, int i, int x)
{
    return t->data[(int64_t)b * t->stride_b + (int64_t)h * t->stride_h + (int64_t)i * t->stride_n + x];
}

/* max |x - y| / max(1, max |y|) over [B,H,N,C] views of one shape */
static double view_err(const bk_tensor *x, const bk_tensor *y, int B, int H, int N, int C)
{
    double e = 0.0, mx = 1.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < N; i++)
                for (int c = 0; c < C; c++) {
                    e = fmax(e, fabs((double)at(x, b, h, i, c) - at(y, b, h, i, c)));
                    mx = fmax(mx, fabs((double)at(y, b, h, i, c)));
                }
    return e / mx;
}

/* q = k = a e_i + noise (d >= N): S = softmax(s Q K^T) is diagonally
 * dominant, well conditioned */
static void well_conditioned(nbuf *t, int N, int d, double a, double noise, th_rng *r)
{
    th_prob *pb = &t->pb;
    for (int i = 0; i < N; i++)
        for (int x = 0; x < d; x++) {
            const float v = (float)((x == i ? a : 0.0) + noise * th_normal(r));
            pb->q[i * d + x] = v;
            pb->k[i * d + x] = v;
        }
}

/* l = N: one landmark per token, O = S Z_T S V -> S V as Z_T -> pinv(S);
 * the dense attention S Z_T S -> S (A pinv(A) A = A) */
static void test_nystrom_softmax_limit(void)
{
    enum { N = 12, D = 16, DV = 4 };
    const ncase c = {1, 1, N, N, D, DV, 0, 0, N, 0};
    const int Ts[6] = {0, 1, 2, 3, 6, 10};
    for (int wc = 0; wc < 2; wc++) {
        nbuf t, u;
        nb_init(&t, &c, 4300 + wc, 1.0);
        nb_init(&u, &c, 4300 + wc, 1.0);
        th_rng r = {4310 + (uint64_t)wc};
        if (wc) {
            well_conditioned(&t, N, D, 2.5, 0.3, &r);
            memcpy(u.pb.q, t.pb.q, sizeof(float) * N * D);
            memcpy(u.pb.k, t.pb.k, sizeof(float) * N * D);
        }
        bk_status s = bk_softmax_forward(&u.pb.desc, NULL, &u.pb.tq, &u.pb.tk, &u.pb.tv, &u.pb.to, NULL, &u.pb.ta,
                                         NULL, 0);
        double eo[6] = {0}, ea[6] = {0};
        for (int k = 0; k < 6 && s == BK_OK; k++) {
            t.p.iters = Ts[k];
            s = nfwd(&t, NULL, 1);
            eo[k] = view_err(&t.pb.to, &u.pb.to, 1, 1, N, DV);
            ea[k] = view_err(&t.pb.ta, &u.pb.ta, 1, 1, N, N);
        }
        char name[160];
        if (wc) {
            snprintf(name, sizeof name, "nystrom l = N, well-conditioned S: the error to softmax attention falls with "
                     "the iterations and vanishes (T = 0, 1, 2, 3, 6, 10)");
            th_check(s == BK_OK && eo[0] > eo[1] && eo[1] > eo[2] && eo[2] > eo[3] && eo[4] < 2e-6 && eo[5] < 2e-6,
                     name, "O errors %.1e %.1e %.1e %.1e %.1e %.1e (%s)", eo[0], eo[1], eo[2], eo[3], eo[4], eo[5],
                     bk_last_error());
            th_check(s == BK_OK && ea[0] > ea[2] && ea[4] < 2e-6,
                     "nystrom pinv converges on a well-conditioned A: A pinv(A) A ~ A (l = N, T = 6)",
                     "|S Z S - S| %.1e (T = 0), %.1e (T = 2), %.1e (T = 6)", ea[0], ea[2], ea[4]);
        } else {
            snprintf(name, sizeof name, "nystrom l = N, random inputs: the error to softmax attention falls with the "
                     "iterations (T = 0 -> 3 -> 10)");
            th_check(s == BK_OK && eo[3] < eo[0] && eo[5] < 0.5 * eo[3], name, "O errors %.1e %.1e %.1e %.1e %.1e %.1e (%s)",
                     eo[0], eo[1], eo[2], eo[3], eo[4], eo[5], bk_last_error());
        }
        th_prob_free(&t.pb);
        th_prob_free(&u.pb);
    }
}

/* padding == truncation (bitwise, NaN in the padding, a problem without
 * queries), the tape == a recomputed forward, the schema */
static void test_nystrom_properties(void)
{
    {
        const int Nq = 10, Nk = 8, d = 4, dv = 3;
        const ncase c = {3, 1, Nq, Nk, d, dv, 0, 1, 3, 6};
        nbuf t;
        nb_init(&t, &c, 4400, 1.0);
        t.pb.ql[0] = 4; t.pb.kl[0] = 8; t.pb.ql[1] = 10; t.pb.kl[1] = 2; t.pb.ql[2] = 0; t.pb.kl[2] = 5;
        th_rng rr = {3};
        th_fill_tensor(&t.pb.tq, 3, 1, Nq, d, t.pb.ql, &rr, 1.0);
        th_fill_tensor(&t.pb.tk, 3, 1, Nk, d, t.pb.kl, &rr, 1.0);
        th_fill_tensor(&t.pb.tv, 3, 1, Nk, dv, t.pb.kl, &rr, 1.0);
        th_fill_tensor(&t.pb.tdo, 3, 1, Nq, dv, t.pb.ql, &rr, 1.0);
        bk_status st = nfwd(&t, NULL, 1);
        if (!st) st = nbwd(&t, NULL);
        int ok = st == BK_OK;
        for (int b = 0; b < 3 && ok; b++) {
            const int n = t.pb.ql[b], m = t.pb.kl[b];
            if (n == 0 || m == 0) {
                for (int i = 0; i < Nq * dv; i++) ok &= t.pb.o[b * Nq * dv + i] == 0.0f;
                for (int i = 0; i < Nq * Nk; i++) ok &= t.pb.a[b * Nq * Nk + i] == 0.0f;
                for (int i = 0; i < Nq * d; i++) ok &= t.pb.dq[b * Nq * d + i] == 0.0f;
                for (int i = 0; i < Nk * d; i++) ok &= t.pb.dk[b * Nk * d + i] == 0.0f;
                continue;
            }
            const ncase u = {1, 1, n, m, d, dv, 0, 0, 3, 6};
            nbuf s;
            nb_init(&s, &u, 1, 1.0);
            memcpy(s.pb.q, t.pb.q + b * Nq * d, sizeof(float) * n * d);
            memcpy(s.pb.k, t.pb.k + b * Nk * d, sizeof(float) * m * d);
            memcpy(s.pb.v, t.pb.v + b * Nk * dv, sizeof(float) * m * dv);
            memcpy(s.pb.dout, t.pb.dout + b * Nq * dv, sizeof(float) * n * dv);
            ok &= nfwd(&s, NULL, 1) == BK_OK && nbwd(&s, NULL) == BK_OK;
            ok &= !memcmp(s.pb.o, t.pb.o + b * Nq * dv, sizeof(float) * n * dv);
            for (int i = 0; i < n; i++) {
                ok &= !memcmp(s.pb.a + i * m, t.pb.a + (b * Nq + i) * Nk, sizeof(float) * m);
                for (int j = m; j < Nk; j++) ok &= t.pb.a[(b * Nq + i) * Nk + j] == 0.0f;
            }
            ok &= !memcmp(s.pb.dq, t.pb.dq + b * Nq * d, sizeof(float) * n * d);
            ok &= !memcmp(s.pb.dk, t.pb.dk + b * Nk * d, sizeof(float) * m * d);
            ok &= !memcmp(s.pb.dv, t.pb.dv + b * Nk * dv, sizeof(float) * m * dv);
            for (int i = n * dv; i < Nq * dv; i++) ok &= t.pb.o[b * Nq * dv + i] == 0.0f;
            for (int i = n * d; i < Nq * d; i++) ok &= t.pb.dq[b * Nq * d + i] == 0.0f;
            for (int j = m * d; j < Nk * d; j++) ok &= t.pb.dk[b * Nk * d + j] == 0.0f;
            for (int j = m * dv; j < Nk * dv; j++) ok &= t.pb.dv[b * Nk * dv + j] == 0.0f;
            th_prob_free(&s.pb);
        }
        th_check(ok, "nystrom padding == truncation (bitwise; fewer keys than landmarks; NaN in the padding; a problem "
                 "without queries)", "%s", bk_last_error());
        /* the forward's tape == the backward's own recomputation */
        const size_t tb = bk_op_tape_size(nys(), &t.pb.desc, &t.p), nq = (size_t)3 * Nq * d;
        void *tape = malloc(tb);
        float *g = malloc(sizeof(float) * nq);
        memcpy(g, t.pb.dq, sizeof(float) * nq);
        st = nfwd(&t, tape, 0);
        st = st ? st : nbwd(&t, tape);
        th_check(st == BK_OK && !memcmp(g, t.pb.dq, sizeof(float) * nq),
                 "nystrom: a backward from the forward's tape == one that recomputes it (bitwise)", "%s",
                 bk_last_error());
        free(g);
        free(tape);
        th_prob_free(&t.pb);
    }
    /* the schema: keys, defaults, ranges, doc, capabilities, bench cases */
    const bk_op *op = nys();
    bk_nystrom_config p;
    int ok = op && bk_op_has_backward(op) && bk_op_config_size(op) == sizeof p;
    if (ok) {
        bk_op_config_default(op, &p);
        ok = p.landmarks == 64 && p.iters == 6 && p.scale == 0.0f;
        ok &= bk_op_config_set(op, &p, "landmarks", "16") == BK_OK && p.landmarks == 16;
        ok &= bk_op_config_set(op, &p, "iters", "0") == BK_OK && p.iters == 0;
        ok &= bk_op_config_set(op, &p, "scale", "0.3") == BK_OK && p.scale == 0.3f;
        ok &= bk_op_config_set(op, &p, "landmarks", "0") == BK_ERR_PARAM && p.landmarks == 16;
        ok &= bk_op_config_set(op, &p, "iters", "-1") == BK_ERR_PARAM && p.iters == 0;
        ok &= bk_op_config_set(op, &p, "init", "batch") != BK_OK;
    }
    th_check(ok, "nystrom in the registry: defaults l = 64, T = 6; keys with ranges", "%s", bk_last_error());
}

static void test_nystrom_bad_input(void)
{
    const ncase c = {1, 2, 5, 5, 4, 2, 0, 0, 3, 6};
    nbuf t;
    nb_init(&t, &c, 4500, 1.0);
    float o0[20];
    memcpy(o0, t.pb.o, sizeof o0);
#define EXPECT(mut, code, what)                                                                                    \
    do {                                                                                                           \
        bk_nystrom_config p = t.p;                                                                                 \
        bk_attn_desc de = t.pb.desc;                                                                               \
        mut;                                                                                                       \
        bk_status s_ = bk_op_forward(nys(), &de, &p, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, NULL, NULL, NULL, 0); \
        th_check(s_ == (code) && !memcmp(o0, t.pb.o, sizeof o0),                                          \
                 "nystrom bad input: " what, "%s (%s)", bk_status_str(s_), bk_last_error());                       \
    } while (0)
    EXPECT(p.landmarks = 0, BK_ERR_PARAM, "landmarks 0");
    EXPECT(p.landmarks = 5000, BK_ERR_PARAM, "landmarks above 4096");
    EXPECT(p.iters = -1, BK_ERR_PARAM, "negative iters");
    EXPECT(p.scale = INFINITY, BK_ERR_PARAM, "non-finite scale");
    EXPECT(p.scale = NAN, BK_ERR_PARAM, "NaN scale");
    EXPECT(de.Nq = 0, BK_ERR_SHAPE, "Nq 0");
#undef EXPECT
    th_check(bk_op_forward(nys(), &t.pb.desc, NULL, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, NULL, NULL, NULL, 0) ==
                 BK_ERR_NULL,
             "nystrom bad input: NULL parameters", "%s", bk_last_error());
    {
        bk_nystrom_config p = t.p;
        p.landmarks = 0;
        th_check(bk_op_workspace_size(nys(), &t.pb.desc, &p) == 0 && bk_op_tape_size(nys(), &t.pb.desc, &p) == 0,
                 "nystrom bad input: size queries of landmarks 0 are 0", "%s", "");
    }
    const float *arr[3] = {t.pb.q, t.pb.k, t.pb.v};
    const char *nm[3] = {"q", "k", "v"};
    for (int w = 0; w < 3; w++) {
        float *x = (float *)arr[w] + 3;
        const float keep = *x;
        *x = w == 1 ? INFINITY : NAN;
        bk_status s = nfwd(&t, NULL, 0);
        *x = keep;
        char name[64];
        snprintf(name, sizeof name, "nystrom bad input: a non-finite value in %s", nm[w]);
        th_check(s == BK_ERR_NONFINITE && strstr(bk_last_error(), nm[w]), name, "%s", bk_last_error());
    }
    {
        const float keep = t.pb.dout[1];
        t.pb.dout[1] = NAN;
        bk_status s = nbwd(&t, NULL);
        t.pb.dout[1] = keep;
        th_check(s == BK_ERR_NONFINITE, "nystrom bad input: NaN in dout", "%s", bk_last_error());
    }
    const size_t tsz = bk_op_tape_size(nys(), &t.pb.desc, &t.p);
    char *tape = calloc(1, tsz);
    th_check(nbwd(&t, tape) == BK_ERR_TAPE, "nystrom bad input: garbage tape", "%s", bk_last_error());
    nfwd(&t, tape, 0);
    t.p.scale = 0.3f;
    th_check(nbwd(&t, tape) == BK_ERR_TAPE, "nystrom bad input: tape from another scale", "%s", bk_last_error());
    t.p.scale = 0.0f;
    t.p.iters = 2;
    th_check(nbwd(&t, tape) == BK_ERR_TAPE, "nystrom bad input: tape from another iteration count", "%s",
             bk_last_error());
    t.p.iters = 6;
    bk_softmax_config sp = bk_softmax_config_default();
    void *stape = malloc(bk_softmax_tape_size(&t.pb.desc));
    bk_softmax_forward(&t.pb.desc, &sp, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, stape, NULL, NULL, 0);
    th_check(nbwd(&t, stape) == BK_ERR_TAPE, "nystrom bad input: a softmax tape", "%s", bk_last_error());
    free(stape);
    free(tape);
    th_prob_free(&t.pb);
}

/* ---- the determinism contract: thread counts and batch shapes ---- */
typedef struct {
    nbuf t;
    void *tape;
    size_t tape_bytes;
    bk_status s[2];
} ndet;

static void nd_init(ndet *x, const ncase *c, int e, int Lq, int Lk, uint64_t seed)
{
    ncase u = *c;
    u.pad = 0;
    nb_init(&x->t, &u, seed, 1.0);
    th_prob_plant_lengths(&x->t.pb, e, Lq, Lk, seed ^ 0x77ull);
    x->tape_bytes = bk_op_tape_size(nys(), &x->t.pb.desc, &x->t.p);
    x->tape = calloc(1, x->tape_bytes);
}

static void nd_free(ndet *x)
{
    free(x->tape);
    th_prob_free(&x->t.pb);
}

static void nd_run(void *ctx)
{
    ndet *x = ctx;
    x->s[0] = nfwd(&x->t, x->tape, 1);
    x->s[1] = x->s[0] ? x->s[0] : nbwd(&x->t, x->tape);
}

static int nd_spans(const ndet *x, th_span *sp)
{
    int n = th_prob_spans(&x->t.pb, sp);
    sp[n++] = (th_span){x->tape, x->tape_bytes};
    sp[n++] = (th_span){x->s, sizeof x->s};
    return n;
}


static int nd_same(const ndet *x, const ndet *y, int b, int h)
{
    return x->s[0] == BK_OK && x->s[1] == BK_OK && y->s[0] == BK_OK && y->s[1] == BK_OK &&
           th_prob_same(&x->t.pb, &y->t.pb, b, h);
}

static int runs_as_team(const ndet *x)
{
    bk_set_num_threads(1);
    const size_t w1 = bk_op_workspace_size(nys(), &x->t.pb.desc, &x->t.p);
    int team = 1;
    for (int i = 1; i < TH_NTHREADS; i++) {
        bk_set_num_threads(th_threads[i]);
        team &= bk_op_workspace_size(nys(), &x->t.pb.desc, &x->t.p) > w1;
    }
    bk_set_num_threads(0);
    return team;
}

static void test_nystrom_determinism(void)
{
    const int Nq = 300, Nk = 260, Lq = 289, Lk = 251;
    char name[200];
    th_span sp[7];
    const int shapes[2][3] = {{1, 1, 0}, {3, 4, 1}};
    for (int si = 0; si < 2; si++) {
        const ncase c = {shapes[si][0], shapes[si][1], Nq, Nk, 32, 16, shapes[si][2], 0, 64, 6};
        ndet x;
        nd_init(&x, &c, 0, Lq, Lk, 4600 + si);
        if (si == 0)
            th_check(runs_as_team(&x), "nystrom: one problem of 289 x 251 runs as a team", "%s",
                     "its workspace does not grow with the thread count");
        snprintf(name, sizeof name, "nystrom: forward (O, A, tape) and backward (dQ, dK, dV) bitwise identical at 1, "
                 "2, 3, 5, 8 threads (B=%d H=%d)", c.B, c.H);
        th_same_over_threads(name, nd_run, &x, sp, nd_spans(&x, sp));
        th_check(x.s[0] == BK_OK && x.s[1] == BK_OK, name, "status %s / %s: %s", bk_status_str(x.s[0]),
                 bk_status_str(x.s[1]), bk_last_error());
        nd_free(&x);
    }
    const ncase c1 = {1, 1, Nq, Nk, 32, 16, 0, 0, 64, 6};
    ndet x;
    nd_init(&x, &c1, 0, Lq, Lk, 4610);
    nd_run(&x);
    const int batches[2][5] = {{1, 3, 0, 2, 0}, {4, 4, 2, 1, 1}}; /* B, H, b, h, layout */
    for (int bi = 0; bi < 2; bi++)
        for (int nt = 1; nt <= 3; nt++) {
            if (TH.quick && nt == 2) continue;
            ncase cb = c1;
            cb.B = batches[bi][0];
            cb.H = batches[bi][1];
            cb.layout = batches[bi][4];
            ndet y;
            nd_init(&y, &cb, batches[bi][2], Lq, Lk, 4620);
            const int b = batches[bi][2], h = batches[bi][3];
            th_prob_plant(&x.t.pb, &y.t.pb, b, h);
            bk_set_num_threads(nt);
            nd_run(&y);
            bk_set_num_threads(0);
            snprintf(name, sizeof name, "nystrom: a problem alone == the same problem in a batch of %d (%d threads)",
                     cb.B * cb.H, nt);
            th_check(nd_same(&x, &y, b, h), name, "outputs differ (%s)", bk_last_error());
            nd_free(&y);
        }
    nd_free(&x);
}

void test_nystrom(void)
{
    if (TH.filter && !strstr("nystrom", TH.filter)) return;
    if (!th_check(nys() != NULL, "nystrom is registered", "%s", "bk_op_find(\"nystrom\") is NULL")) return;
    test_nystrom_ref_self();
    test_nystrom_grid();
    test_nystrom_fd();
    test_nystrom_softmax_limit();
    test_nystrom_properties();
    test_nystrom_bad_input();
    test_nystrom_determinism();
}
