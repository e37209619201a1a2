/* test_linear.c -- kernelised attention (src/ops/linear.c): the Linear
 * Transformer ("linear") and FAVOR+ ("performer") through the registry's
 * generic call. Against the independent double reference
 * (tests/ops/ref_linear.c: explicit features, the explicit n x m kernel
 * form) over a grid (padding, both layouts, Nq != Nk, eps and scale);
 * directional finite differences of every gradient (dq, dk, dv) on padded
 * problems; properties (the implied attention is positive with rows summing
 * to 1 and out = A v; performer's error against softmax falls as the
 * feature count grows, over several seeds; the projection's orthogonal
 * blocks and norms; the tape; padding == truncation; a large problem's
 * workspace is far below N x N); the determinism contract (1, 2, 3, 5, 8
 * threads; alone vs in a batch); bad input. */
#include "birkhoff.h"
#include "../harness.h"
#include "../tutil.h"
#include "ref_linear.h"
#include "ref_attn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int performer;
    int B, H, Nq, Nk, d, dv, layout, pad;
    const char *keys; /* key=value ... over the defaults */
} lcase;

typedef struct {
    const bk_op *op;
    th_prob pb;
    union {
        bk_linear_config l;
        bk_performer_config p;
    } par;
} lbuf;

static int set_keys(const bk_op *op, void *par, const char *keys)
{
    char buf[160];
    snprintf(buf, sizeof buf, "%s", keys ? keys : "");
    int ok = 1;
    for (char *kv = strtok(buf, " "); kv; kv = strtok(NULL, " ")) {
        char *eq = strchr(kv, '=');
        if (!eq) return 0;
        *eq = 0;
        ok &= bk_op_config_set(op, par, kv, eq + 1) == BK_OK;
    }
    return ok;
}

static void lb_init(lbuf *t, const lcase *c, uint64_t seed, double sigma)
{
    th_rng r = {seed};
    th_prob_init(&t->pb, c->B, c->H, c->Nq, c->Nk, c->d, c->dv, c->layout, c->pad, sigma, &r);
    t->op = bk_op_find(c->performer ? "performer" : "linear");
    bk_op_config_default(t->op, &t->par);
    if (!set_keys(t->op, &t->par, c->keys)) th_check(0, "linear: test keys", "%s: %s", c->keys, bk_last_error());
}

static bk_status lfwd(lbuf *t, void *tape)
{
    return bk_op_forward(t->op, &t->pb.desc, &t->par, &t->pb.tq, &t->pb.tk, &t->pb.tv, &t->pb.to, tape, &t->pb.ta,
                         NULL, 0);
}

static bk_status lbwd(lbuf *t, const void *tape)
{
    return bk_op_backward(t->op, &t->pb.desc, &t->par, &t->pb.tq, &t->pb.tk, &t->pb.tv, &t->pb.tdo, tape, &t->pb.tdq,
                          &t->pb.tdk, &t->pb.tdv, NULL, 0);
}

/* the reference's configuration for t (W: the performer's, as doubles) */
static ref_linear_cfg ref_cfg(const lbuf *t, double **W)
{
    ref_linear_cfg g = {0, 0.0, 0, NULL, 0.0};
    *W = NULL;
    if (t->op != bk_op_find("performer")) {
        g.eps = t->par.l.eps;
        return g;
    }
    const int d = t->pb.desc.d, F = t->par.p.features;
    float *w = malloc(sizeof(float) * (size_t)F * d);
    *W = malloc(sizeof(double) * (size_t)F * d);
    bk_performer_projection(&t->par.p, d, w);
    for (int i = 0; i < F * d; i++) (*W)[i] = w[i];
    free(w);
    const float s = t->par.p.scale != 0.0f ? t->par.p.scale : 1.0f / sqrtf((float)d);
    g.performer = 1;
    g.eps = t->par.p.eps;
    g.F = F;
    g.W = *W;
    g.c = (double)sqrtf(s);
    return g;
}

static void check_ref(const lcase *c, uint64_t seed)
{
    lbuf t;
    lb_init(&t, c, seed, 1.0);
    void *tape = malloc(bk_op_tape_size(t.op, &t.pb.desc, &t.par));
    bk_status s1 = lfwd(&t, tape), s2 = s1 ? s1 : lbwd(&t, tape);
    char name[200];
    snprintf(name, sizeof name, "%s-ref B%d H%d Nq%d Nk%d d%d dv%d [%s] %s pad%d", c->performer ? "performer" : "linear",
             c->B, c->H, c->Nq, c->Nk, c->d, c->dv, c->keys, c->layout ? "bnhd" : "bhnd", c->pad);
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
    double *dK = calloc(nk * c->d, 8), *dV = calloc(nk * c->dv, 8), *W;
    int *ql = th_lens_int(pb->ql, B), *kl = th_lens_int(pb->kl, B);
    const ref_linear_cfg g = ref_cfg(&t, &W);
    ref_linear_forward_batched(B, H, c->Nq, c->Nk, c->d, c->dv, ql, kl, Q, K, V, &g, A, O);
    ref_linear_backward_batched(B, H, c->Nq, c->Nk, c->d, c->dv, ql, kl, Q, K, V, &g, dO, dQ, dK, dV);
    const double eo = th_rel_err(&pb->to, B, H, c->Nq, c->dv, O), ea = th_rel_err(&pb->ta, B, H, c->Nq, c->Nk, A);
    const double eq = th_rel_err(&pb->tdq, B, H, c->Nq, c->d, dQ), ek = th_rel_err(&pb->tdk, B, H, c->Nk, c->d, dK);
    const double ev = th_rel_err(&pb->tdv, B, H, c->Nk, c->dv, dV);
    th_check(eo <= 1e-5 && ea <= 1e-5 && eq <= 1e-4 && ek <= 1e-4 && ev <= 1e-4, name,
             "O %.1e A %.1e dQ %.1e dK %.1e dV %.1e", eo, ea, eq, ek, ev);
    free(Q); free(K); free(V); free(dO); free(A); free(O); free(dQ); free(dK); free(dV); free(W);
    free(ql); free(kl); free(tape);
    th_prob_free(&t.pb);
}

static void test_linear_grid(void)
{
    const int shapes[][6] = {{1, 1, 1, 1, 2, 1}, {1, 1, 6, 6, 4, 3}, {2, 2, 9, 7, 8, 5}, {1, 3, 5, 12, 4, 4},
                             {3, 1, 16, 11, 6, 8}, {2, 2, 40, 33, 16, 8}};
    const char *lkeys[] = {"", "eps=0", "eps=0.5"};
    const char *pkeys[] = {"features=7 seed=3", "features=40 seed=11 scale=0.2", "features=16 eps=1e-4 scaling=sqrt_d"};
    uint64_t seed = 3000;
    for (int perf = 0; perf < 2; perf++)
        for (int si = 0; si < 6; si++)
            for (int ki = 0; ki < 3; ki++)
                for (int pad = 0; pad < 3; pad++) {
                    if (TH.quick && (si + ki + pad) % 2) continue;
                    const lcase c = {perf,         shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3],
                                     shapes[si][4], shapes[si][5], (si + ki + pad) % 2, pad, perf ? pkeys[ki] : lkeys[ki]};
                    check_ref(&c, seed++);
                }
}

/* sum over the valid rows of O .* dO, in double */
static double lloss(void *ctx)
{
    lbuf *t = ctx;
    lfwd(t, NULL);
    const bk_attn_desc *d = &t->pb.desc;
    double L = 0;
    for (int b = 0; b < d->B; b++)
        for (int h = 0; h < d->H; h++)
            for (int i = 0; i < (d->q_len ? d->q_len[b] : d->Nq); i++)
                for (int x = 0; x < d->dv; x++) {
                    const int64_t o = b * t->pb.to.stride_b + h * t->pb.to.stride_h + i * t->pb.to.stride_n + x;
                    const int64_t g = b * t->pb.tdo.stride_b + h * t->pb.tdo.stride_h + i * t->pb.tdo.stride_n + x;
                    L += (double)t->pb.o[o] * t->pb.dout[g];
                }
    return L;
}

/* directional finite differences of the float32 operator, every gradient,
 * padded problems (NaN in the padding: never read) */
static void test_linear_fd(void)
{
    const char *keys[4] = {"", "eps=0", "features=12 seed=5", "features=9 seed=2 scale=0.6"};
    for (int k = 0; k < 4; k++) {
        const int perf = k >= 2;
        const lcase c = {perf, 3, 2, 6, 7, 4, 3, k % 2, 1, keys[k]};
        lbuf t;
        lb_init(&t, &c, 3100 + k, 0.7);
        lfwd(&t, NULL);
        lbwd(&t, NULL);
        float *in[3] = {t.pb.q, t.pb.k, t.pb.v};
        const float *an[3] = {t.pb.dq, t.pb.dk, t.pb.dv};
        const int cnt[3] = {3 * 2 * 6 * 4, 3 * 2 * 7 * 4, 3 * 2 * 7 * 3};
        const char *nm[3] = {"dQ", "dK", "dV"};
        th_rng r = {31 + (uint64_t)k};
        for (int w = 0; w < 3; w++) {
            char name[96];
            snprintf(name, sizeof name, "%s directional FD %s [%s] (padded)", perf ? "performer" : "linear", nm[w],
                     keys[k]);
            th_directional_fd(name, in[w], an[w], cnt[w], 1e-3f, &r, lloss, &t);
        }
        th_prob_free(&t.pb);
    }
}

/* the implied attention: positive, rows summing to 1 (eps = 0), out = A v;
 * a dense 1-thread check of linear against its explicit kernel form is the
 * grid above */
static void test_linear_rows(void)
{
    for (int perf = 0; perf < 2; perf++) {
        const lcase c = {perf, 2, 3, 37, 29, 8, 5, 0, 1, perf ? "features=64" : "eps=0"};
        lbuf t;
        lb_init(&t, &c, 3200 + perf, 1.0);
        bk_status s = lfwd(&t, NULL);
        double srow = 0, pos = 1, eav = 0;
        const bk_attn_desc *d = &t.pb.desc;
        for (int b = 0; b < d->B; b++)
            for (int h = 0; h < d->H; h++) {
                const int n = t.pb.ql[b], m = t.pb.kl[b];
                for (int i = 0; i < n; i++) {
                    const float *a = t.pb.a + (((size_t)b * d->H + h) * d->Nq + i) * d->Nk;
                    double sum = 0;
                    for (int j = 0; j < m; j++) {
                        sum += a[j];
                        pos = fmin(pos, a[j]);
                    }
                    srow = fmax(srow, fabs(sum - 1.0));
                    for (int x = 0; x < d->dv; x++) {
                        double o = 0;
                        for (int j = 0; j < m; j++)
                            o += (double)a[j] * t.pb.v[(((size_t)b * d->H + h) * d->Nk + j) * d->dv + x];
                        eav = fmax(eav, fabs(o - t.pb.o[(((size_t)b * d->H + h) * d->Nq + i) * d->dv + x]));
                    }
                }
            }
        char name[128];
        snprintf(name, sizeof name, "%s: the implied attention is positive, its rows sum to 1, out = A v",
                 perf ? "performer" : "linear");
        th_check(s == BK_OK && pos > 0 && srow < 1e-5 && eav < 1e-5, name, "min %.3g, |rowsum - 1| %.2e, |O - AV| %.2e (%s)",
                 pos, srow, eav, bk_last_error());
        th_prob_free(&t.pb);
    }
}

/* performer estimates softmax attention: the error of A against softmax's
 * falls as the feature count grows (mean over seeds of the relative
 * Frobenius error; each 4x more features must cut it by a clear margin, and
 * the largest count must be close) */
static void test_performer_vs_softmax(void)
{
    const int Fs[4] = {16, 64, 256, 1024}, nseed = TH.quick ? 4 : 8;
    const lcase c = {1, 1, 4, 48, 40, 16, 8, 0, 0, ""};
    double err[4] = {0, 0, 0, 0};
    int ok = 1;
    for (int s = 0; s < nseed; s++) {
        lbuf t;
        lb_init(&t, &c, 3300 + s, 0.5);
        th_prob u; /* softmax on the same inputs */
        th_rng r = {1};
        th_prob_init(&u, c.B, c.H, c.Nq, c.Nk, c.d, c.dv, 0, 0, 1.0, &r);
        bk_softmax_config sp = bk_softmax_config_default();
        ok &= bk_softmax_forward(&t.pb.desc, &sp, &t.pb.tq, &t.pb.tk, &t.pb.tv, &u.to, NULL, &u.ta, NULL, 0) == BK_OK;
        for (int fi = 0; fi < 4; fi++) {
            char kv[64];
            snprintf(kv, sizeof kv, "features=%d seed=%d", Fs[fi], 100 + s);
            bk_op_config_default(t.op, &t.par);
            ok &= set_keys(t.op, &t.par, kv) && lfwd(&t, NULL) == BK_OK;
            double num = 0, den = 0;
            for (size_t x = 0; x < (size_t)c.H * c.Nq * c.Nk; x++) {
                num += ((double)t.pb.a[x] - u.a[x]) * ((double)t.pb.a[x] - u.a[x]);
                den += (double)u.a[x] * u.a[x];
            }
            err[fi] += sqrt(num / den) / nseed;
        }
        th_prob_free(&u);
        th_prob_free(&t.pb);
    }
    /* the estimator's variance ~ 1/F: the error roughly halves per 4x */
    const int falls = err[1] < 0.8 * err[0] && err[2] < 0.8 * err[1] && err[3] < 0.8 * err[2];
    th_check(ok && falls && err[3] < 0.15, "performer: its error against softmax falls as the features grow",
             "F 16: %.4f, 64: %.4f, 256: %.4f, 1024: %.4f (%s)", err[0], err[1], err[2], err[3], bk_last_error());
}

/* the projection: blocks of d orthogonal rows, the norms of the scaling,
 * reproducible from the seed */
static void test_performer_projection(void)
{
    const int d = 8, F = 20;
    bk_performer_config p = bk_performer_config_default();
    p.features = F;
    p.seed = 42;
    float W[F * d], W2[F * d];
    int ok = bk_performer_projection(&p, d, W) == BK_OK && bk_performer_projection(&p, d, W2) == BK_OK &&
             !memcmp(W, W2, sizeof W);
    double orth = 0, nrm_sq = 0, mean_n = 0;
    for (int a = 0; a < F; a++) {
        double na = 0;
        for (int x = 0; x < d; x++) na += (double)W[a * d + x] * W[a * d + x];
        mean_n += sqrt(na) / F;
        for (int b2 = a + 1; b2 < F && b2 / d == a / d; b2++) {
            double dot = 0, nb = 0;
            for (int x = 0; x < d; x++) {
                dot += (double)W[a * d + x] * W[b2 * d + x];
                nb += (double)W[b2 * d + x] * W[b2 * d + x];
            }
            orth = fmax(orth, fabs(dot) / sqrt(na * nb));
        }
    }
    p.scaling = BK_PERFORMER_SQRT_D;
    ok &= bk_performer_projection(&p, d, W2) == BK_OK;
    for (int a = 0; a < F; a++) {
        double na = 0;
        for (int x = 0; x < d; x++) na += (double)W2[a * d + x] * W2[a * d + x];
        nrm_sq = fmax(nrm_sq, fabs(sqrt(na) - sqrt((double)d)));
    }
    p.scaling = BK_PERFORMER_NORMS;
    p.seed = 43;
    ok &= bk_performer_projection(&p, d, W2) == BK_OK && memcmp(W, W2, sizeof W) != 0;
    th_check(ok && orth < 1e-5 && nrm_sq < 1e-5 && mean_n > 1.5 && mean_n < 4.5,
             "performer projection: orthogonal blocks, sqrt_d norms, chi norms, reproducible per seed",
             "cos %.1e, |norm - sqrt d| %.1e, mean chi norm %.2f (%s)", orth, nrm_sq, mean_n, bk_last_error());
    p.features = 0;
    th_check(bk_performer_projection(&p, d, W2) == BK_ERR_PARAM && bk_performer_projection(NULL, d, W2) == BK_ERR_NULL,
             "performer projection: bad parameters refused", "%s", bk_last_error());
}

/* the tape (== recomputed; refused with other parameters); padding ==
 * truncation bitwise; a large problem's workspace is O(N), not N x N */
static void test_linear_properties(void)
{
    for (int perf = 0; perf < 2; perf++) {
        const char *nm = perf ? "performer" : "linear";
        char name[160];
        {
            const lcase c = {perf, 2, 2, 9, 8, 6, 4, 1, 1, perf ? "features=10 seed=4" : ""};
            lbuf t;
            lb_init(&t, &c, 3400 + perf, 1.0);
            const size_t tb = bk_op_tape_size(t.op, &t.pb.desc, &t.par), nq = 2 * 2 * 9, nk = 2 * 2 * 8;
            void *tape = malloc(tb);
            bk_status s = lfwd(&t, tape);
            s = s ? s : lbwd(&t, tape);
            float *g = malloc(sizeof(float) * (nq * 6 + nk * 10));
            memcpy(g, t.pb.dq, sizeof(float) * nq * 6);
            memcpy(g + nq * 6, t.pb.dk, sizeof(float) * nk * 6);
            memcpy(g + nq * 6 + nk * 6, t.pb.dv, sizeof(float) * nk * 4);
            s = s ? s : lbwd(&t, NULL);
            const int same = s == BK_OK && !memcmp(g, t.pb.dq, sizeof(float) * nq * 6) &&
                             !memcmp(g + nq * 6, t.pb.dk, sizeof(float) * nk * 6) &&
                             !memcmp(g + nq * 6 + nk * 6, t.pb.dv, sizeof(float) * nk * 4);
            snprintf(name, sizeof name, "%s: a backward from the tape == one that recomputes it (bitwise)", nm);
            th_check(same && tb < 4096, name, "tape %zu bytes (%s)", tb, bk_last_error());
            set_keys(t.op, &t.par, perf ? "seed=5" : "eps=1e-3");
            snprintf(name, sizeof name, "%s: a tape of other parameters is refused", nm);
            th_check(lbwd(&t, tape) == BK_ERR_TAPE, name, "%s", bk_last_error());
            bk_softmax_config sp = bk_softmax_config_default();
            void *stape = malloc(bk_softmax_tape_size(&t.pb.desc));
            bk_softmax_forward(&t.pb.desc, &sp, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, stape, NULL, NULL, 0);
            snprintf(name, sizeof name, "%s: a softmax tape is refused", nm);
            th_check(lbwd(&t, stape) == BK_ERR_TAPE, name, "%s", bk_last_error());
            free(stape);
            free(g);
            free(tape);
            th_prob_free(&t.pb);
        }
        {
            const int Nq = 10, Nk = 8, d = 4, dv = 3;
            const lcase c = {perf, 3, 1, Nq, Nk, d, dv, 0, 1, perf ? "features=12" : ""};
            lbuf t;
            lb_init(&t, &c, 3410 + perf, 1.0);
            t.pb.ql[0] = 4; t.pb.kl[0] = 8; t.pb.ql[1] = 10; t.pb.kl[1] = 3; t.pb.ql[2] = 0; t.pb.kl[2] = 5;
            th_rng rr = {3};
            th_fill_tensor(&t.pb.tq, 3, 1, Nq, d, t.pb.ql, &rr, 1.0);
            th_fill_tensor(&t.pb.tk, 3, 1, Nk, d, t.pb.kl, &rr, 1.0);
            th_fill_tensor(&t.pb.tv, 3, 1, Nk, dv, t.pb.kl, &rr, 1.0);
            th_fill_tensor(&t.pb.tdo, 3, 1, Nq, dv, t.pb.ql, &rr, 1.0);
            bk_status st = lfwd(&t, NULL);
            if (!st) st = lbwd(&t, NULL);
            int ok = st == BK_OK;
            for (int b = 0; b < 3 && ok; b++) {
                const int n = t.pb.ql[b], m = t.pb.kl[b];
                if (n == 0 || m == 0) {
                    for (int i = 0; i < Nq * dv; i++) ok &= t.pb.o[b * Nq * dv + i] == 0.0f;
                    for (int i = 0; i < Nq * d; i++) ok &= t.pb.dq[b * Nq * d + i] == 0.0f;
                    for (int i = 0; i < Nk * d; i++) ok &= t.pb.dk[b * Nk * d + i] == 0.0f;
                    continue;
                }
                const lcase u = {perf, 1, 1, n, m, d, dv, 0, 0, c.keys};
                lbuf s;
                lb_init(&s, &u, 1, 1.0);
                memcpy(s.pb.q, t.pb.q + b * Nq * d, sizeof(float) * n * d);
                memcpy(s.pb.k, t.pb.k + b * Nk * d, sizeof(float) * m * d);
                memcpy(s.pb.v, t.pb.v + b * Nk * dv, sizeof(float) * m * dv);
                memcpy(s.pb.dout, t.pb.dout + b * Nq * dv, sizeof(float) * n * dv);
                ok &= lfwd(&s, NULL) == BK_OK && lbwd(&s, NULL) == BK_OK;
                ok &= !memcmp(s.pb.o, t.pb.o + b * Nq * dv, sizeof(float) * n * dv);
                ok &= !memcmp(s.pb.dq, t.pb.dq + b * Nq * d, sizeof(float) * n * d);
                ok &= !memcmp(s.pb.dk, t.pb.dk + b * Nk * d, sizeof(float) * m * d);
                ok &= !memcmp(s.pb.dv, t.pb.dv + b * Nk * dv, sizeof(float) * m * dv);
                for (int i = n * dv; i < Nq * dv; i++) ok &= t.pb.o[b * Nq * dv + i] == 0.0f;
                for (int i = n * d; i < Nq * d; i++) ok &= t.pb.dq[b * Nq * d + i] == 0.0f;
                for (int j = m * d; j < Nk * d; j++) ok &= t.pb.dk[b * Nk * d + j] == 0.0f;
                for (int j = m * dv; j < Nk * dv; j++) ok &= t.pb.dv[b * Nk * dv + j] == 0.0f;
                th_prob_free(&s.pb);
            }
            snprintf(name, sizeof name, "%s padding == truncation (bitwise), NaN in the padding, a problem without "
                     "queries", nm);
            th_check(ok, name, "%s", bk_last_error());
            th_prob_free(&t.pb);
        }
        {
            const bk_op *op = bk_op_find(nm);
            bk_attn_desc de = {1, 8, 16384, 16384, 64, 64, NULL, NULL};
            unsigned char par[64];
            bk_op_config_default(op, par);
            const size_t ws = bk_op_workspace_size(op, &de, par), tb = bk_op_tape_size(op, &de, par);
            snprintf(name, sizeof name, "%s: N = 16384 needs O(N) workspace and an O(F dv) tape, never N x N", nm);
            th_check(ws > 0 && ws < (size_t)200 << 20 && tb < (size_t)8 * 260 * 65 * 4 + 8192, name,
                     "workspace %zu bytes, tape %zu", ws, tb);
        }
    }
}

static void test_linear_bad_input(void)
{
    for (int perf = 0; perf < 2; perf++) {
        const char *nm = perf ? "performer" : "linear";
        const lcase c = {perf, 1, 2, 5, 5, 4, 2, 0, 0, perf ? "features=8" : ""};
        lbuf t;
        lb_init(&t, &c, 3500 + perf, 1.0);
        char name[128];
        const float keep = t.pb.q[3];
        t.pb.q[3] = NAN;
        bk_status s = lfwd(&t, NULL);
        t.pb.q[3] = keep;
        snprintf(name, sizeof name, "%s bad input: NaN in q", nm);
        th_check(s == BK_ERR_NONFINITE && strstr(bk_last_error(), "q"), name, "%s", bk_last_error());
        t.pb.dout[1] = INFINITY;
        s = lbwd(&t, NULL);
        snprintf(name, sizeof name, "%s bad input: Inf in dout", nm);
        th_check(s == BK_ERR_NONFINITE, name, "%s", bk_last_error());
        snprintf(name, sizeof name, "%s bad input: parameters out of range", nm);
        if (perf) {
            bk_performer_config p = t.par.p;
            t.par.p.features = 0;
            int ok = lfwd(&t, NULL) == BK_ERR_PARAM;
            t.par.p = p;
            t.par.p.scaling = 7;
            ok &= lfwd(&t, NULL) == BK_ERR_PARAM;
            t.par.p = p;
            t.par.p.eps = -1.0f;
            ok &= lfwd(&t, NULL) == BK_ERR_PARAM;
            t.par.p = p;
            ok &= bk_op_config_set(t.op, &t.par, "features", "0") == BK_ERR_PARAM &&
                  bk_op_config_set(t.op, &t.par, "scaling", "cube") == BK_ERR_PARAM &&
                  bk_op_config_set(t.op, &t.par, "scale", "-1") == BK_ERR_PARAM;
            th_check(ok && t.par.p.features == 8, name, "%s", bk_last_error());
        } else {
            t.par.l.eps = -1e-3f;
            int ok = lfwd(&t, NULL) == BK_ERR_PARAM;
            t.par.l.eps = 1e-6f;
            ok &= bk_op_config_set(t.op, &t.par, "eps", "-1") == BK_ERR_PARAM &&
                  bk_op_config_set(t.op, &t.par, "scale", "1") != BK_OK;
            th_check(ok, name, "%s", bk_last_error());
        }
        th_prob_free(&t.pb);
    }
}

/* ---- the determinism contract: thread counts and batch shapes ---- */
typedef struct {
    lbuf t;
    void *tape;
    size_t tape_bytes;
    bk_status s[2];
} ldet;

static void ld_init(ldet *x, const lcase *c, int e, int Lq, int Lk, uint64_t seed)
{
    lcase u = *c;
    u.pad = 0;
    lb_init(&x->t, &u, seed, 1.0);
    th_prob_plant_lengths(&x->t.pb, e, Lq, Lk, seed ^ 0x77ull);
    x->tape_bytes = bk_op_tape_size(x->t.op, &x->t.pb.desc, &x->t.par);
    x->tape = calloc(1, x->tape_bytes);
}

static void ld_free(ldet *x)
{
    free(x->tape);
    th_prob_free(&x->t.pb);
}

static void ld_run(void *ctx)
{
    ldet *x = ctx;
    x->s[0] = lfwd(&x->t, x->tape);
    x->s[1] = x->s[0] ? x->s[0] : lbwd(&x->t, x->tape);
}

static int ld_spans(const ldet *x, th_span *sp)
{
    int n = th_prob_spans(&x->t.pb, sp);
    sp[n++] = (th_span){x->tape, x->tape_bytes};
    sp[n++] = (th_span){x->s, sizeof x->s};
    return n;
}


static int ld_same(const ldet *x, const ldet *y, int b, int h)
{
    return x->s[0] == BK_OK && x->s[1] == BK_OK && y->s[0] == BK_OK && y->s[1] == BK_OK &&
           th_prob_same(&x->t.pb, &y->t.pb, b, h);
}

static void test_linear_determinism(void)
{
    const int Nq = 600, Nk = 520, Lq = 589, Lk = 511;
    char name[200];
    th_span sp[7];
    const int shapes[2][3] = {{1, 1, 0}, {3, 4, 1}};
    for (int perf = 0; perf < 2; perf++) {
        const char *nm = perf ? "performer" : "linear", *keys = perf ? "features=48 seed=9" : "";
        for (int si = 0; si < 2; si++) {
            const lcase c = {perf, shapes[si][0], shapes[si][1], Nq, Nk, 32, 16, shapes[si][2], 0, keys};
            ldet x;
            ld_init(&x, &c, 0, Lq, Lk, 3600 + si);
            snprintf(name, sizeof name, "%s: forward (O, A, tape) and backward (dQ, dK, dV) bitwise identical at 1, "
                     "2, 3, 5, 8 threads (B=%d H=%d)", nm, c.B, c.H);
            th_same_over_threads(name, ld_run, &x, sp, ld_spans(&x, sp));
            th_check(x.s[0] == BK_OK && x.s[1] == BK_OK, name, "status %s / %s: %s", bk_status_str(x.s[0]),
                     bk_status_str(x.s[1]), bk_last_error());
            ld_free(&x);
        }
        const lcase c1 = {perf, 1, 1, Nq, Nk, 32, 16, 0, 0, keys};
        ldet x;
        ld_init(&x, &c1, 0, Lq, Lk, 3610);
        ld_run(&x);
        const int batches[2][5] = {{1, 3, 0, 2, 0}, {4, 4, 2, 1, 1}}; /* B, H, b, h, layout */
        for (int bi = 0; bi < 2; bi++)
            for (int nt = 1; nt <= 3; nt++) {
                if (TH.quick && nt == 2) continue;
                lcase cb = c1;
                cb.B = batches[bi][0];
                cb.H = batches[bi][1];
                cb.layout = batches[bi][4];
                ldet y;
                ld_init(&y, &cb, batches[bi][2], Lq, Lk, 3620);
                const int b = batches[bi][2], h = batches[bi][3];
                th_prob_plant(&x.t.pb, &y.t.pb, b, h);
                bk_set_num_threads(nt);
                ld_run(&y);
                bk_set_num_threads(0);
                snprintf(name, sizeof name, "%s: a problem alone == the same problem in a batch of %d (%d threads)",
                         nm, cb.B * cb.H, nt);
                th_check(ld_same(&x, &y, b, h), name, "outputs differ (%s)", bk_last_error());
                ld_free(&y);
            }
        ld_free(&x);
    }
}

void test_linear(void)
{
    if (TH.filter && !strstr("linear performer", TH.filter)) return;
    test_linear_grid();
    test_linear_fd();
    test_linear_rows();
    test_performer_vs_softmax();
    test_performer_projection();
    test_linear_properties();
    test_linear_bad_input();
    test_linear_determinism();
}
