/* test_diff.c -- differential attention: against the independent double
 * reference (tests/ops/ref_diff.c) over a grid (padding, both layouts,
 * rectangular problems, lambda of either sign), directional finite
 * differences of the float32 operator (Q, K, V, lambda), properties
 * (lambda = 0 is bk_softmax_* on the first halves bitwise; linear in lambda;
 * the tape does not depend on lambda; padding == truncation bitwise; the
 * registry's generic call == the typed one), the determinism contract
 * (1, 2, 3, 5, 8 threads; alone vs in a batch), and bad input. */
#include "birkhoff.h"
#include "../harness.h"
#include "ref_diff.h"
#include "../tutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, H, Nq, Nk, d, dv, layout, pad;
    float lam0; /* lambda of head h: lam0 - 0.35 h */
} dcase;

typedef struct {
    th_prob pb;
    float *lam, *dlam;
    bk_diff_config p;
} dbuf;

static void db_init(dbuf *t, const dcase *c, uint64_t seed)
{
    th_rng r = {seed};
    th_prob_init(&t->pb, c->B, c->H, c->Nq, c->Nk, c->d, c->dv, c->layout, c->pad, 1.0, &r);
    t->lam = malloc(sizeof(float) * (size_t)c->H);
    t->dlam = malloc(sizeof(float) * (size_t)c->H);
    for (int h = 0; h < c->H; h++) {
        t->lam[h] = c->lam0 - 0.35f * (float)h;
        t->dlam[h] = -7.0f;
    }
    t->p = bk_diff_config_default();
    t->p.lambda = t->lam;
}

static void db_free(dbuf *t)
{
    th_prob_free(&t->pb);
    free(t->lam);
    free(t->dlam);
}

static bk_status dfwd(dbuf *t, void *tape)
{
    bk_diff_extras ex = {t->pb.ta};
    return bk_diff_forward(&t->pb.desc, &t->p, &t->pb.tq, &t->pb.tk, &t->pb.tv, &t->pb.to, tape, &ex, NULL, 0);
}

static bk_status dbwd(dbuf *t, const void *tape)
{
    return bk_diff_backward(&t->pb.desc, &t->p, &t->pb.tq, &t->pb.tk, &t->pb.tv, &t->pb.tdo, tape, &t->pb.tdq,
                            &t->pb.tdk, &t->pb.tdv, t->dlam, NULL, 0);
}

static void check_ref(const dcase *c, uint64_t seed)
{
    dbuf t;
    db_init(&t, c, seed);
    void *tape = malloc(bk_diff_tape_size(&t.pb.desc, &t.p));
    bk_status s1 = dfwd(&t, tape), s2 = s1 ? s1 : dbwd(&t, tape);
    char name[200];
    snprintf(name, sizeof name, "diff-ref B%d H%d Nq%d Nk%d d%d dv%d lambda0 %g %s pad%d", c->B, c->H, c->Nq, c->Nk,
             c->d, c->dv, (double)c->lam0, c->layout ? "bnhd" : "bhnd", c->pad);
    if (!th_check(s1 == BK_OK && s2 == BK_OK, name, "%s / %s: %s", bk_status_str(s1), bk_status_str(s2),
                  bk_last_error())) {
        free(tape);
        db_free(&t);
        return;
    }
    const int B = c->B, H = c->H;
    th_prob *pb = &t.pb;
    double *Q = th_gather(&pb->tq, B, H, c->Nq, c->d, pb->ql), *K = th_gather(&pb->tk, B, H, c->Nk, c->d, pb->kl);
    double *V = th_gather(&pb->tv, B, H, c->Nk, c->dv, pb->kl), *dO = th_gather(&pb->tdo, B, H, c->Nq, c->dv, pb->ql);
    const size_t nq = (size_t)B * H * c->Nq, nk = (size_t)B * H * c->Nk;
    double *A = calloc(nq * c->Nk, 8), *O = calloc(nq * c->dv, 8), *dQ = calloc(nq * c->d, 8);
    double *dK = calloc(nk * c->d, 8), *dV = calloc(nk * c->dv, 8), *lam = malloc(8 * (size_t)H),
           *dl = calloc((size_t)H, 8);
    for (int h = 0; h < H; h++) lam[h] = t.lam[h];
    int *ql = th_lens_int(pb->ql, B), *kl = th_lens_int(pb->kl, B);
    const double s = (double)(1.0f / sqrtf((float)(c->d / 2)));
    ref_diff_forward_batched(B, H, c->Nq, c->Nk, c->d, c->dv, ql, kl, Q, K, V, s, lam, A, O);
    ref_diff_backward_batched(B, H, c->Nq, c->Nk, c->d, c->dv, ql, kl, Q, K, V, s, lam, dO, dQ, dK, dV, dl);
    const double eo = th_rel_err(&pb->to, B, H, c->Nq, c->dv, O), ea = th_rel_err(&pb->ta, B, H, c->Nq, c->Nk, A);
    const double eq = th_rel_err(&pb->tdq, B, H, c->Nq, c->d, dQ), ek = th_rel_err(&pb->tdk, B, H, c->Nk, c->d, dK);
    const double ev = th_rel_err(&pb->tdv, B, H, c->Nk, c->dv, dV), el = th_max_rel(t.dlam, dl, (size_t)H, 1.0);
    th_check(eo <= 1e-5 && ea <= 1e-5 && eq <= 1e-4 && ek <= 1e-4 && ev <= 1e-4 && el <= 1e-4, name,
             "O %.1e A %.1e dQ %.1e dK %.1e dV %.1e dlambda %.1e", eo, ea, eq, ek, ev, el);
    free(Q); free(K); free(V); free(dO); free(A); free(O); free(dQ); free(dK); free(dV); free(lam); free(dl);
    free(ql); free(kl); free(tape);
    db_free(&t);
}

static void test_diff_grid(void)
{
    const int shapes[][6] = {{1, 1, 1, 1, 2, 1}, {1, 1, 6, 6, 4, 3}, {2, 2, 9, 7, 8, 5}, {1, 3, 5, 12, 4, 4},
                             {3, 1, 16, 11, 6, 8}, {2, 2, 40, 33, 16, 8}};
    const float lams[] = {0.8f, -0.4f, 0.0f};
    uint64_t seed = 2000;
    for (int si = 0; si < 6; si++)
        for (int li = 0; li < 3; li++)
            for (int pad = 0; pad < 3; pad++) {
                if (TH.quick && (si + li + pad) % 2) continue;
                const dcase c = {shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], shapes[si][4],
                                 shapes[si][5], (si + li + pad) % 2, pad, lams[li]};
                check_ref(&c, seed++);
            }
}

static double diff_loss(void *ctx)
{
    dbuf *t = ctx;
    dfwd(t, NULL);
    double L = 0;
    const bk_attn_desc *d = &t->pb.desc;
    for (size_t j = 0; j < (size_t)d->B * d->H * d->Nq * d->dv; j++) L += (double)t->pb.o[j] * t->pb.dout[j];
    return L;
}

/* directional finite differences of the float32 operator, every gradient */
static void test_diff_fd(void)
{
    for (int k = 0; k < 2; k++) {
        const dcase c = {2, 2, 6, 7, 4, 3, 0, 0, k ? -0.6f : 0.7f};
        dbuf t;
        db_init(&t, &c, 2100 + k);
        dfwd(&t, NULL);
        dbwd(&t, NULL);
        float *in[4] = {t.pb.q, t.pb.k, t.pb.v, t.lam};
        const float *an[4] = {t.pb.dq, t.pb.dk, t.pb.dv, t.dlam};
        const int cnt[4] = {2 * 2 * 6 * 4, 2 * 2 * 7 * 4, 2 * 2 * 7 * 3, 2};
        const char *nm[4] = {"dQ", "dK", "dV", "dlambda"};
        th_rng r = {17 + (uint64_t)k};
        for (int w = 0; w < 4; w++) {
            char name[64];
            snprintf(name, sizeof name, "diff directional FD %s (lambda0 %g)", nm[w], (double)c.lam0);
            th_directional_fd(name, in[w], an[w], cnt[w], 1e-3f, &r, diff_loss, &t);
        }
        db_free(&t);
    }
}

/* a [B,H,N,d/2] view of the first half of a [B,H,N,d] tensor: the same view
 * (the descriptor says d/2) */
static bk_tensor first_half(const bk_tensor *t) { return *t; }

static float at(const bk_tensor *t, int b, int h, int i, int x)
{
    return t->data[(int64_t)b * t->stride_b + (int64_t)h * t->stride_h + (int64_t)i * t->stride_n + x];
}

/* lambda = 0: bitwise bk_softmax_* on the first halves of q and k (O, dV, dq
 * and dk of the first halves; zero gradients of the second halves); linear
 * in lambda (O(lambda) = O(0) - lambda softmax(Q2 K2^T) V, within float
 * rounding) */
static void test_diff_softmax(void)
{
    const dcase cases[2] = {{3, 2, 13, 11, 8, 5, 1, 1, 0.0f}, {1, 1, 300, 290, 32, 16, 0, 0, 0.0f}};
    for (int ci = 0; ci < 2; ci++) {
        const dcase *c = &cases[ci];
        dbuf t;
        db_init(&t, c, 2200 + ci);
        for (int h = 0; h < c->H; h++) t.lam[h] = 0.0f;
        bk_status st = dfwd(&t, NULL);
        if (!st) st = dbwd(&t, NULL);
        /* softmax on the first halves into its own outputs (same layout) */
        dcase cs = *c;
        cs.d = c->d / 2;
        dbuf u;
        db_init(&u, &cs, 1);
        bk_attn_desc ds = t.pb.desc;
        ds.d = c->d / 2;
        const bk_tensor q1 = first_half(&t.pb.tq), k1 = first_half(&t.pb.tk);
        bk_status su = bk_softmax_forward(&ds, NULL, &q1, &k1, &t.pb.tv, &u.pb.to, NULL, &u.pb.ta, NULL, 0);
        if (!su)
            su = bk_softmax_backward(&ds, NULL, &q1, &k1, &t.pb.tv, &t.pb.tdo, NULL, &u.pb.tdq, &u.pb.tdk, &u.pb.tdv,
                                     NULL, 0);
        int same = st == BK_OK && su == BK_OK, zero = 1;
        for (int b = 0; b < c->B; b++)
            for (int h = 0; h < c->H; h++) {
                same &= th_slice_same(&t.pb.to, b, h, &u.pb.to, b, h, c->Nq, c->dv);
                same &= th_slice_same(&t.pb.ta, b, h, &u.pb.ta, b, h, c->Nq, c->Nk);
                same &= th_slice_same(&t.pb.tdv, b, h, &u.pb.tdv, b, h, c->Nk, c->dv);
                same &= th_slice_same(&t.pb.tdq, b, h, &u.pb.tdq, b, h, c->Nq, c->d / 2);
                same &= th_slice_same(&t.pb.tdk, b, h, &u.pb.tdk, b, h, c->Nk, c->d / 2);
                for (int i = 0; i < c->Nq; i++)
                    for (int x = c->d / 2; x < c->d; x++)
                        zero &= at(&t.pb.tdq, b, h, i, x) == 0.0f;
                for (int j = 0; j < c->Nk; j++)
                    for (int x = c->d / 2; x < c->d; x++)
                        zero &= at(&t.pb.tdk, b, h, j, x) == 0.0f;
            }
        char name[160];
        snprintf(name, sizeof name, "diff lambda = 0 is bk_softmax on the first halves, bitwise (O, A, dV, dq, dk; "
                 "B%d H%d Nq%d Nk%d d%d %s)", c->B, c->H, c->Nq, c->Nk, c->d, c->pad ? "padded" : "full");
        th_check(same, name, "%s / %s: %s", bk_status_str(st), bk_status_str(su), bk_last_error());
        th_check(zero, "diff lambda = 0: gradients of the second halves are zero", "%s", "");
        /* linearity: O(lambda) = O(0) - lambda softmax(Q2 K2^T) V */
        if (ci == 0) {
            bk_tensor q2 = t.pb.tq, k2 = t.pb.tk;
            q2.data += c->d / 2;
            k2.data += c->d / 2;
            dbuf w;
            db_init(&w, &cs, 2);
            bk_status s2 = bk_softmax_forward(&ds, NULL, &q2, &k2, &t.pb.tv, &w.pb.to, NULL, NULL, NULL, 0);
            for (int h = 0; h < c->H; h++) t.lam[h] = 0.9f - 0.7f * (float)h;
            s2 = s2 ? s2 : dfwd(&t, NULL);
            double e = 0, mx = 1;
            for (int b = 0; b < c->B; b++)
                for (int h = 0; h < c->H; h++)
                    for (int i = 0; i < c->Nq; i++)
                        for (int x = 0; x < c->dv; x++) {
                            const double want = (double)at(&u.pb.to, b, h, i, x) -
                                                (double)t.lam[h] * at(&w.pb.to, b, h, i, x);
                            e = fmax(e, fabs(at(&t.pb.to, b, h, i, x) - want));
                            mx = fmax(mx, fabs(want));
                        }
            th_check(s2 == BK_OK && e / mx < 1e-6, "diff is linear in lambda: O = softmax1 V - lambda softmax2 V",
                     "%.1e (%s)", e / mx, bk_last_error());
            db_free(&w);
        }
        db_free(&u);
        db_free(&t);
    }
}

/* the tape does not depend on lambda; padding == truncation (bitwise, NaN in
 * the padding, a problem without queries); generic == typed bitwise */
static void test_diff_properties(void)
{
    {
        const dcase c = {2, 2, 9, 8, 6, 4, 1, 1, 0.5f};
        dbuf t;
        db_init(&t, &c, 2300);
        const size_t tb = bk_diff_tape_size(&t.pb.desc, &t.p);
        void *tape = malloc(tb);
        dfwd(&t, tape);
        t.lam[0] = -1.25f;
        t.lam[1] = 2.0f;
        bk_status s = dbwd(&t, tape);
        const size_t nq = (size_t)2 * 2 * 9, nk = (size_t)2 * 2 * 8;
        float *g = malloc(sizeof(float) * (nq * 6 + nk * 6 + nk * 4 + 2));
        memcpy(g, t.pb.dq, sizeof(float) * nq * 6);
        memcpy(g + nq * 6, t.pb.dk, sizeof(float) * nk * 6);
        memcpy(g + nq * 6 + nk * 6, t.pb.dv, sizeof(float) * nk * 4);
        memcpy(g + nq * 6 + nk * 10, t.dlam, sizeof(float) * 2);
        s = s ? s : dbwd(&t, NULL);
        const int same = s == BK_OK && !memcmp(g, t.pb.dq, sizeof(float) * nq * 6) &&
                         !memcmp(g + nq * 6, t.pb.dk, sizeof(float) * nk * 6) &&
                         !memcmp(g + nq * 6 + nk * 6, t.pb.dv, sizeof(float) * nk * 4) &&
                         !memcmp(g + nq * 6 + nk * 10, t.dlam, sizeof(float) * 2);
        th_check(same, "diff: the tape does not depend on lambda (a forward's tape with other lambda == recomputed)",
                 "%s", bk_last_error());
        /* the registry's generic call == the typed one, bitwise */
        const bk_op *op = bk_op_find("diff");
        int ok = op && bk_op_has_backward(op) && bk_op_config_size(op) == sizeof(bk_diff_config);
        bk_diff_config gp;
        if (ok) {
            bk_op_config_default(op, &gp);
            ok = bk_op_config_set(op, &gp, "scale", "0.4") == BK_OK && gp.scale == 0.4f && gp.lambda == NULL &&
                 bk_op_config_set(op, &gp, "lambda", "0.5") != BK_OK;
            gp.lambda = t.lam;
        }
        th_check(ok, "diff in the registry: scale by key, lambda an array", "%s", bk_last_error());
        if (ok) {
            t.p.scale = 0.4f;
            dfwd(&t, NULL);
            dbwd(&t, NULL);
            float *o1 = malloc(sizeof(float) * nq * 4), *q1 = malloc(sizeof(float) * nq * 6);
            memcpy(o1, t.pb.o, sizeof(float) * nq * 4);
            memcpy(q1, t.pb.dq, sizeof(float) * nq * 6);
            bk_status a = bk_op_forward(op, &t.pb.desc, &gp, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, NULL, NULL, NULL, 0);
            bk_status b = bk_op_backward(op, &t.pb.desc, &gp, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.tdo, NULL, &t.pb.tdq,
                                         &t.pb.tdk, &t.pb.tdv, NULL, 0);
            th_check(a == BK_OK && b == BK_OK && !memcmp(o1, t.pb.o, sizeof(float) * nq * 4) &&
                         !memcmp(q1, t.pb.dq, sizeof(float) * nq * 6),
                     "diff: bk_op_forward/backward == bk_diff_forward/backward bitwise", "%s", bk_last_error());
            free(o1);
            free(q1);
        }
        free(g);
        free(tape);
        db_free(&t);
    }
    {
        const int Nq = 10, Nk = 8, d = 4, dv = 3;
        const dcase c = {3, 1, Nq, Nk, d, dv, 0, 1, 0.6f};
        dbuf t;
        db_init(&t, &c, 2310);
        t.pb.ql[0] = 4; t.pb.kl[0] = 8; t.pb.ql[1] = 10; t.pb.kl[1] = 3; t.pb.ql[2] = 0; t.pb.kl[2] = 5;
        th_rng rr = {3};
        th_fill_tensor(&t.pb.tq, 3, 1, Nq, d, t.pb.ql, &rr, 1.0);
        th_fill_tensor(&t.pb.tk, 3, 1, Nk, d, t.pb.kl, &rr, 1.0);
        th_fill_tensor(&t.pb.tv, 3, 1, Nk, dv, t.pb.kl, &rr, 1.0);
        th_fill_tensor(&t.pb.tdo, 3, 1, Nq, dv, t.pb.ql, &rr, 1.0);
        bk_status st = dfwd(&t, NULL);
        if (!st) st = dbwd(&t, NULL);
        int ok = st == BK_OK;
        double dsum = 0.0;
        for (int b = 0; b < 3 && ok; b++) {
            const int n = t.pb.ql[b], m = t.pb.kl[b];
            if (n == 0 || m == 0) {
                for (int i = 0; i < Nq * dv; i++) ok &= t.pb.o[b * Nq * dv + i] == 0.0f;
                for (int i = 0; i < Nq * d; i++) ok &= t.pb.dq[b * Nq * d + i] == 0.0f;
                continue;
            }
            const dcase u = {1, 1, n, m, d, dv, 0, 0, 0.6f};
            dbuf s;
            db_init(&s, &u, 1);
            memcpy(s.pb.q, t.pb.q + b * Nq * d, sizeof(float) * n * d);
            memcpy(s.pb.k, t.pb.k + b * Nk * d, sizeof(float) * m * d);
            memcpy(s.pb.v, t.pb.v + b * Nk * dv, sizeof(float) * m * dv);
            memcpy(s.pb.dout, t.pb.dout + b * Nq * dv, sizeof(float) * n * dv);
            dfwd(&s, NULL);
            dbwd(&s, NULL);
            dsum += s.dlam[0];
            ok &= !memcmp(s.pb.o, t.pb.o + b * Nq * dv, sizeof(float) * n * dv);
            for (int i = 0; i < n; i++) {
                ok &= !memcmp(s.pb.a + i * m, t.pb.a + (b * Nq + i) * Nk, sizeof(float) * m);
                for (int j = m; j < Nk; j++) ok &= t.pb.a[(b * Nq + i) * Nk + j] == 0.0f;
            }
            ok &= !memcmp(s.pb.dq, t.pb.dq + b * Nq * d, sizeof(float) * n * d);
            ok &= !memcmp(s.pb.dk, t.pb.dk + b * Nk * d, sizeof(float) * m * d);
            ok &= !memcmp(s.pb.dv, t.pb.dv + b * Nk * dv, sizeof(float) * m * dv);
            for (int i = n * dv; i < Nq * dv; i++) ok &= t.pb.o[b * Nq * dv + i] == 0.0f;
            for (int j = m * d; j < Nk * d; j++) ok &= t.pb.dk[b * Nk * d + j] == 0.0f;
            db_free(&s);
        }
        th_check(ok, "diff padding == truncation (bitwise), NaN in the padding, a problem without queries", "%s",
                 bk_last_error());
        th_check(fabs(dsum - t.dlam[0]) <= 1e-6 * fmax(1.0, fabs(dsum)),
                 "diff dlambda is the sum over the batch of the problems' dlambda", "%g vs %g", dsum,
                 (double)t.dlam[0]);
        db_free(&t);
    }
}

static void test_diff_bad_input(void)
{
    const dcase c = {1, 2, 5, 5, 4, 2, 0, 0, 0.5f};
    dbuf t;
    db_init(&t, &c, 2400);
    float o0[20];
    memcpy(o0, t.pb.o, sizeof o0);
#define EXPECT(mut, code, what)                                                                                    \
    do {                                                                                                           \
        bk_diff_config p = t.p;                                                                                    \
        bk_attn_desc de = t.pb.desc;                                                                               \
        mut;                                                                                                       \
        bk_status s_ = bk_diff_forward(&de, &p, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, NULL, NULL, NULL, 0);      \
        th_check(s_ == (code) && !memcmp(o0, t.pb.o, sizeof o0), "diff bad input: " what, "%s (%s)",               \
                 bk_status_str(s_), bk_last_error());                                                              \
    } while (0)
    EXPECT(de.d = 3, BK_ERR_SHAPE, "odd d");
    EXPECT(p.lambda = NULL, BK_ERR_NULL, "lambda NULL");
    float lbad[2] = {0.5f, NAN};
    EXPECT(p.lambda = lbad, BK_ERR_NONFINITE, "non-finite lambda");
    EXPECT(p.scale = INFINITY, BK_ERR_PARAM, "non-finite scale");
#undef EXPECT
    {
        bk_diff_config p = t.p;
        bk_attn_desc de = t.pb.desc;
        de.d = 3;
        th_check(bk_diff_workspace_size(&de, &p) == 0 && bk_diff_tape_size(&de, &p) == 0,
                 "diff bad input: size queries of an odd d are 0", "%s", "");
        p.lambda = NULL;
        th_check(bk_diff_workspace_size(&t.pb.desc, &p) > 0 && bk_diff_tape_size(&t.pb.desc, &p) > 0,
                 "diff: size queries need the scalars only (lambda NULL)", "%s", "");
        th_check(bk_diff_forward(&t.pb.desc, NULL, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, NULL, NULL, NULL, 0) ==
                     BK_ERR_NULL,
                 "diff bad input: NULL parameters", "%s", bk_last_error());
    }
    {
        const float keep = t.pb.q[3];
        t.pb.q[3] = NAN;
        bk_status s = dfwd(&t, NULL);
        t.pb.q[3] = keep;
        th_check(s == BK_ERR_NONFINITE, "diff bad input: NaN in q", "%s", bk_last_error());
    }
    const size_t tsz = bk_diff_tape_size(&t.pb.desc, &t.p);
    char *tape = calloc(1, tsz);
    th_check(dbwd(&t, tape) == BK_ERR_TAPE, "diff bad input: garbage tape", "%s", bk_last_error());
    dfwd(&t, tape);
    t.p.scale = 0.3f;
    th_check(dbwd(&t, tape) == BK_ERR_TAPE, "diff bad input: tape from another scale", "%s", bk_last_error());
    t.p.scale = 0.0f;
    bk_softmax_config sp = bk_softmax_config_default();
    void *stape = malloc(bk_softmax_tape_size(&t.pb.desc));
    bk_softmax_forward(&t.pb.desc, &sp, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, stape, NULL, NULL, 0);
    th_check(dbwd(&t, stape) == BK_ERR_TAPE, "diff bad input: a softmax tape", "%s", bk_last_error());
    free(stape);
    free(tape);
    db_free(&t);
}

/* ---- the determinism contract: thread counts and batch shapes ---- */
typedef struct {
    dbuf t;
    void *tape;
    size_t tape_bytes;
    bk_status s[2];
} ddet;

static void dd_init(ddet *x, const dcase *c, int e, int Lq, int Lk, uint64_t seed)
{
    dcase u = *c;
    u.pad = 0;
    db_init(&x->t, &u, seed);
    th_prob *pb = &x->t.pb;
    th_prob_plant_lengths(pb, e, Lq, Lk, seed ^ 0x77ull);
    x->tape_bytes = bk_diff_tape_size(&pb->desc, &x->t.p);
    x->tape = calloc(1, x->tape_bytes);
}

static void dd_free(ddet *x)
{
    free(x->tape);
    db_free(&x->t);
}

static void dd_run(void *ctx)
{
    ddet *x = ctx;
    x->s[0] = dfwd(&x->t, x->tape);
    x->s[1] = x->s[0] ? x->s[0] : dbwd(&x->t, x->tape);
}

static int dd_spans(const ddet *x, th_span *sp)
{
    int n = th_prob_spans(&x->t.pb, sp);
    sp[n++] = (th_span){x->t.dlam, 4 * (size_t)x->t.pb.desc.H};
    sp[n++] = (th_span){x->tape, x->tape_bytes};
    sp[n++] = (th_span){x->s, sizeof x->s};
    return n;
}


static void dd_plant(const ddet *x, ddet *y, int b, int h)
{
    th_prob_plant(&x->t.pb, &y->t.pb, b, h);
    y->t.lam[h] = x->t.lam[0];
}

static int dd_same(const ddet *x, const ddet *y, int b, int h)
{
    return x->s[0] == BK_OK && x->s[1] == BK_OK && y->s[0] == BK_OK && y->s[1] == BK_OK &&
           th_prob_same(&x->t.pb, &y->t.pb, b, h);
}

static int runs_as_team(const ddet *x)
{
    bk_set_num_threads(1);
    const size_t w1 = bk_diff_workspace_size(&x->t.pb.desc, &x->t.p);
    int team = 1;
    for (int i = 1; i < TH_NTHREADS; i++) {
        bk_set_num_threads(th_threads[i]);
        team &= bk_diff_workspace_size(&x->t.pb.desc, &x->t.p) > w1;
    }
    bk_set_num_threads(0);
    return team;
}

static void test_diff_determinism(void)
{
    const int Nq = 300, Nk = 260, Lq = 289, Lk = 251;
    char name[200];
    th_span sp[8];
    const int shapes[2][3] = {{1, 1, 0}, {3, 4, 1}};
    for (int si = 0; si < 2; si++) {
        const dcase c = {shapes[si][0], shapes[si][1], Nq, Nk, 32, 16, shapes[si][2], 0, 0.7f};
        ddet x;
        dd_init(&x, &c, 0, Lq, Lk, 2500 + si);
        if (si == 0)
            th_check(runs_as_team(&x), "diff: one problem of 289 x 251 runs as a team", "%s",
                     "its workspace does not grow with the thread count");
        snprintf(name, sizeof name, "diff: forward (O, A, tape) and backward (dQ, dK, dV, dlambda) bitwise identical "
                 "at 1, 2, 3, 5, 8 threads (B=%d H=%d)", c.B, c.H);
        th_same_over_threads(name, dd_run, &x, sp, dd_spans(&x, sp));
        th_check(x.s[0] == BK_OK && x.s[1] == BK_OK, name, "status %s / %s: %s", bk_status_str(x.s[0]),
                 bk_status_str(x.s[1]), bk_last_error());
        dd_free(&x);
    }
    const dcase c1 = {1, 1, Nq, Nk, 32, 16, 0, 0, 0.7f};
    ddet x;
    dd_init(&x, &c1, 0, Lq, Lk, 2510);
    dd_run(&x);
    const int batches[2][5] = {{1, 3, 0, 2, 0}, {4, 4, 2, 1, 1}}; /* B, H, b, h, layout */
    for (int bi = 0; bi < 2; bi++)
        for (int nt = 1; nt <= 3; nt++) {
            if (TH.quick && nt == 2) continue;
            dcase cb = c1;
            cb.B = batches[bi][0];
            cb.H = batches[bi][1];
            cb.layout = batches[bi][4];
            ddet y;
            dd_init(&y, &cb, batches[bi][2], Lq, Lk, 2520);
            dd_plant(&x, &y, batches[bi][2], batches[bi][3]);
            bk_set_num_threads(nt);
            dd_run(&y);
            bk_set_num_threads(0);
            snprintf(name, sizeof name, "diff: a problem alone == the same problem in a batch of %d (%d threads)",
                     cb.B * cb.H, nt);
            th_check(dd_same(&x, &y, batches[bi][2], batches[bi][3]), name, "outputs differ (%s)", bk_last_error());
            dd_free(&y);
        }
    dd_free(&x);
}

void test_diff(void)
{
    if (TH.filter && !strstr("diff", TH.filter)) return;
    test_diff_grid();
    test_diff_fd();
    test_diff_softmax();
    test_diff_properties();
    test_diff_bad_input();
    test_diff_determinism();
}
