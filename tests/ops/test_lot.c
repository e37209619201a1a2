/* test_lot.c -- LOT attention: against the independent double reference
 * (tests/ops/ref_lot.c), finite differences, the digest's properties,
 * determinism, padding, and bad input. */
#include "birkhoff.h"
#include "../harness.h"
#include "ref_lot.h"
#include "../tutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, H, Nq, Nk, d, dv, layout, pad, r, T;
    float eps, temp;
} lcase;

typedef struct {
    th_prob pb;
    float *Z, *theta, *dZ, *dth;
    bk_lot_config p;
    bk_lot_diag *diag;
} lbuf;

static void lb_init(lbuf *t, const lcase *c, uint64_t seed)
{
    th_rng r = {seed};
    th_prob_init(&t->pb, c->B, c->H, c->Nq, c->Nk, c->d, c->dv, c->layout, c->pad, 1.0, &r);
    size_t nz = (size_t)c->H * c->r * c->d, nt = (size_t)c->H * c->r;
    t->Z = malloc(nz * sizeof(float));
    t->theta = malloc(nt * sizeof(float));
    t->dZ = calloc(nz, sizeof(float));
    t->dth = calloc(nt, sizeof(float));
    for (size_t i = 0; i < nz; i++) t->Z[i] = (float)th_normal(&r);
    for (size_t i = 0; i < nt; i++) t->theta[i] = (float)(0.5 * th_normal(&r));
    t->p = bk_lot_config_default();
    t->p.r = c->r;
    t->p.Z = t->Z;
    t->p.theta = t->theta;
    t->p.temp = c->temp;
    t->p.iters = c->T;
    t->p.eps = c->eps;
    t->diag = calloc((size_t)c->B * c->H, sizeof(bk_lot_diag));
}

static void lb_free(lbuf *t)
{
    th_prob_free(&t->pb);
    free(t->Z); free(t->theta); free(t->dZ); free(t->dth); free(t->diag);
}

static bk_status lfwd(lbuf *t, void *tape)
{
    bk_lot_extras ex = {t->pb.ta, t->diag};
    return bk_lot_forward(&t->pb.desc, &t->p, &t->pb.tq, &t->pb.tk, &t->pb.tv, &t->pb.to, tape, &ex, NULL, 0);
}
static bk_status lbwd(lbuf *t, const void *tape)
{
    return bk_lot_backward(&t->pb.desc, &t->p, &t->pb.tq, &t->pb.tk, &t->pb.tv, &t->pb.tdo, tape, &t->pb.tdq,
                           &t->pb.tdk, &t->pb.tdv, t->dZ, t->dth, NULL, 0);
}

static void check_ref(const lcase *c, uint64_t seed)
{
    lbuf t;
    lb_init(&t, c, seed);
    void *tape = malloc(bk_lot_tape_size(&t.pb.desc, &t.p));
    bk_status s1 = lfwd(&t, tape), s2 = s1 ? s1 : lbwd(&t, tape);
    char name[200];
    snprintf(name, sizeof name, "lot-ref B%d H%d Nq%d Nk%d d%d dv%d r%d T%d eps%g temp%g %s pad%d", c->B, c->H, c->Nq,
             c->Nk, c->d, c->dv, c->r, c->T, (double)c->eps, (double)c->temp, c->layout ? "bnhd" : "bhnd", c->pad);
    if (!th_check(s1 == BK_OK && s2 == BK_OK, name, "%s / %s: %s", bk_status_str(s1), bk_status_str(s2),
                  bk_last_error())) {
        free(tape);
        lb_free(&t);
        return;
    }
    const int B = c->B, H = c->H;
    th_prob *pb = &t.pb;
    double *Q = th_gather(&pb->tq, B, H, c->Nq, c->d, pb->ql), *K = th_gather(&pb->tk, B, H, c->Nk, c->d, pb->kl);
    double *V = th_gather(&pb->tv, B, H, c->Nk, c->dv, pb->kl), *dO = th_gather(&pb->tdo, B, H, c->Nq, c->dv, pb->ql);
    size_t nq = (size_t)B * H * c->Nq, nk = (size_t)B * H * c->Nk, nz = (size_t)H * c->r * c->d, nt = (size_t)H * c->r;
    double *A = calloc(nq * c->Nk, 8), *O = calloc(nq * c->dv, 8), *dQ = calloc(nq * c->d, 8);
    double *dK = calloc(nk * c->d, 8), *dV = calloc(nk * c->dv, 8), *dZ = calloc(nz, 8), *dT = calloc(nt, 8);
    double *Zd = malloc(nz * 8), *Td = malloc(nt * 8);
    for (size_t i = 0; i < nz; i++) Zd[i] = t.Z[i];
    for (size_t i = 0; i < nt; i++) Td[i] = t.theta[i];
    int *ql = th_lens_int(pb->ql, B), *kl = th_lens_int(pb->kl, B);
    const double s = (double)(1.0f / sqrtf((float)c->d));
    ref_lot_forward_batched(B, H, c->Nq, c->Nk, c->d, c->dv, c->r, ql, kl, Q, K, V, Zd, Td, c->temp, c->T, c->eps, s, A,
                            O);
    ref_lot_backward_batched(B, H, c->Nq, c->Nk, c->d, c->dv, c->r, ql, kl, Q, K, V, Zd, Td, c->temp, c->T, c->eps, s, dO,
                             dQ, dK, dV, dZ, dT);
    double eo = th_rel_err(&pb->to, B, H, c->Nq, c->dv, O), ea = th_rel_err(&pb->ta, B, H, c->Nq, c->Nk, A);
    double eq = th_rel_err(&pb->tdq, B, H, c->Nq, c->d, dQ), ek = th_rel_err(&pb->tdk, B, H, c->Nk, c->d, dK);
    double ev = th_rel_err(&pb->tdv, B, H, c->Nk, c->dv, dV);
    double ez = th_max_rel(t.dZ, dZ, nz, 1.0), et = th_max_rel(t.dth, dT, nt, 1.0);
    th_check(eo <= 1e-5 && ea <= 1e-5 && eq <= 1e-4 && ek <= 1e-4 && ev <= 1e-4 && ez <= 1e-4 && et <= 1e-4, name,
             "O %.1e A %.1e dQ %.1e dK %.1e dV %.1e dZ %.1e dtheta %.1e", eo, ea, eq, ek, ev, ez, et);
    free(Q); free(K); free(V); free(dO); free(A); free(O); free(dQ); free(dK); free(dV); free(dZ); free(dT);
    free(Zd); free(Td); free(ql); free(kl); free(tape);
    lb_free(&t);
}

static void test_lot_grid(void)
{
    const int shapes[][6] = {{1, 1, 1, 1, 4, 2}, {1, 1, 6, 6, 4, 3}, {2, 2, 9, 7, 8, 5}, {1, 2, 5, 12, 4, 4},
                             {2, 1, 16, 16, 8, 8}};
    const int rs[] = {1, 3, 8}, Ts[] = {1, 2, 5, 6};
    uint64_t seed = 800;
    for (int si = 0; si < 5; si++)
        for (int ri = 0; ri < 3; ri++)
            for (int ti = 0; ti < 4; ti++) {
                if (TH.quick && (si + ri + ti) % 2) continue;
                lcase c = {shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], shapes[si][4], shapes[si][5],
                           (ti + si) % 2, (si + ri) % 3 == 1 ? 1 : 0, rs[ri], Ts[ti], ti % 2 ? 0.5f : 1.0f,
                           ri % 2 ? 2.0f : 0.5f};
                check_ref(&c, seed++);
            }
}

/* max |O_i - mean_j V_j| of a single problem */
static double mean_v_error(const lbuf *t)
{
    const int n = t->pb.desc.Nq, m = t->pb.desc.Nk, dv = t->pb.desc.dv;
    double e = 0;
    for (int x = 0; x < dv; x++) {
        double mean = 0;
        for (int j = 0; j < m; j++) mean += t->pb.v[j * dv + x] / (double)m;
        for (int i = 0; i < n; i++) e = fmax(e, fabs(t->pb.o[i * dv + x] - mean));
    }
    return e;
}

/* properties: rank, exact margins, r = 1, eps -> inf, permutation, padding,
 * determinism */
static void test_lot_properties(void)
{
    /* exact rows for odd T, exact columns (n/m) for even T; doubly stochastic at convergence */
    const int Ts[] = {1, 2, 5, 6, 301};
    for (int k = 0; k < 5; k++) {
        lcase c = {1, 1, 9, 12, 4, 3, 0, 0, 4, Ts[k], 1.0f, 1.0f};
        lbuf t;
        lb_init(&t, &c, 900 + k);
        lfwd(&t, NULL);
        double re = 0, ce = 0;
        for (int i = 0; i < 9; i++) {
            double rs = 0;
            for (int j = 0; j < 12; j++) rs += t.pb.a[i * 12 + j];
            re = fmax(re, fabs(rs - 1));
        }
        for (int j = 0; j < 12; j++) {
            double cs = 0;
            for (int i = 0; i < 9; i++) cs += t.pb.a[i * 12 + j];
            ce = fmax(ce, fabs(cs - 9.0 / 12.0));
        }
        char name[80];
        snprintf(name, sizeof name, "LOT marginals T=%d", Ts[k]);
        int ok = Ts[k] == 301 ? (re < 1e-5 && ce < 1e-5) : (Ts[k] % 2 ? re < 1e-5 : ce < 1e-5);
        th_check(ok && fabs(t.diag[0].row_err - re) < 1e-5 && t.diag[0].iters1 == Ts[k], name,
                 "rows %.1e cols %.1e (diag %.1e %.1e)", re, ce, (double)t.diag[0].row_err, (double)t.diag[0].col_err);
        lb_free(&t);
    }
    /* r = 1: every output row is the mean of V (for T >= 2; at T = 1 it is a
     * softmax over the keys, see docs/ALGORITHMS.md section 5) */
    {
        lcase c = {1, 1, 7, 10, 4, 3, 0, 0, 1, 3, 1.0f, 1.0f};
        lbuf t;
        lb_init(&t, &c, 910);
        lfwd(&t, NULL);
        double e = mean_v_error(&t);
        th_check(e < 1e-6, "LOT r = 1 gives the mean of V", "%.1e", e);
        lb_free(&t);
    }
    /* eps -> infinity: the mean of V */
    {
        lcase c = {1, 1, 7, 10, 4, 3, 0, 0, 5, 5, 1e6f, 1.0f};
        lbuf t;
        lb_init(&t, &c, 911);
        lfwd(&t, NULL);
        double e = mean_v_error(&t);
        th_check(e < 1e-5, "LOT eps -> infinity gives the mean of V", "%.1e", e);
        lb_free(&t);
    }
    /* rank(A) <= r: r + 1 rows of A are linearly dependent (Gram determinant ~ 0) via Gaussian elimination */
    {
        const int n = 10, m = 12, r = 3;
        lcase c = {1, 1, n, m, 4, 2, 0, 0, r, 5, 1.0f, 1.0f};
        lbuf t;
        lb_init(&t, &c, 912);
        lfwd(&t, NULL);
        double M[10][12];
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) M[i][j] = t.pb.a[i * m + j];
        int rank = 0;
        for (int col = 0; col < m && rank < n; col++) {
            int piv = rank;
            for (int i = rank; i < n; i++)
                if (fabs(M[i][col]) > fabs(M[piv][col])) piv = i;
            if (fabs(M[piv][col]) < 1e-5) continue;
            for (int j = 0; j < m; j++) {
                double tmp = M[rank][j];
                M[rank][j] = M[piv][j];
                M[piv][j] = tmp;
            }
            for (int i = rank + 1; i < n; i++) {
                double f = M[i][col] / M[rank][col];
                for (int j = col; j < m; j++) M[i][j] -= f * M[rank][j];
            }
            rank++;
        }
        th_check(rank <= r, "LOT rank(A) <= r", "numerical rank %d (r = %d)", rank, r);
        lb_free(&t);
    }
    /* permutation equivariance (queries and keys with values) */
    {
        lcase c = {1, 1, 8, 8, 4, 3, 0, 0, 3, 5, 1.0f, 1.0f};
        lbuf t, u;
        lb_init(&t, &c, 913);
        lb_init(&u, &c, 913);
        int pm[8] = {5, 2, 7, 0, 3, 6, 1, 4};
        for (int i = 0; i < 8; i++) {
            memcpy(u.pb.q + i * 4, t.pb.q + pm[i] * 4, 16);
            memcpy(u.pb.k + i * 4, t.pb.k + pm[(i + 3) % 8] * 4, 16);
            memcpy(u.pb.v + i * 3, t.pb.v + pm[(i + 3) % 8] * 3, 12);
        }
        lfwd(&t, NULL);
        lfwd(&u, NULL);
        double e = 0;
        for (int i = 0; i < 8; i++)
            for (int x = 0; x < 3; x++) e = fmax(e, fabs(u.pb.o[i * 3 + x] - t.pb.o[pm[i] * 3 + x]));
        th_check(e < 2e-6, "LOT permutation equivariance", "%.1e", e);
        lb_free(&t);
        lb_free(&u);
    }
    /* thread-count determinism: many problems, and one problem (BLAS then
     * runs multi-threaded inside it) */
    for (int one = 0; one < 2; one++) {
        lcase c = one ? (lcase){1, 1, 300, 280, 16, 8, 0, 0, 12, 5, 1.0f, 1.0f}
                      : (lcase){4, 2, 11, 9, 4, 3, 1, 1, 3, 5, 1.0f, 1.0f};
        lbuf t;
        lb_init(&t, &c, 914);
        bk_set_num_threads(1);
        lfwd(&t, NULL);
        lbwd(&t, NULL);
        int same = 1;
        for (int nt = 2; nt <= 4; nt++) {
            lbuf u;
            lb_init(&u, &c, 914);
            bk_set_num_threads(nt);
            lfwd(&u, NULL);
            lbwd(&u, NULL);
            size_t nq = (size_t)c.B * c.H * c.Nq, nk = (size_t)c.B * c.H * c.Nk;
            same &= !memcmp(t.pb.o, u.pb.o, nq * c.dv * 4) && !memcmp(t.pb.dq, u.pb.dq, nq * c.d * 4) &&
                    !memcmp(t.pb.dk, u.pb.dk, nk * c.d * 4) && !memcmp(t.pb.dv, u.pb.dv, nk * c.dv * 4) &&
                    !memcmp(t.dZ, u.dZ, (size_t)c.H * c.r * c.d * 4) && !memcmp(t.dth, u.dth, (size_t)c.H * c.r * 4);
            lb_free(&u);
        }
        bk_set_num_threads(0);
        th_check(same, one ? "LOT bitwise identical for 1..4 threads, one problem (threaded BLAS)"
                           : "LOT bitwise identical for 1..4 threads (incl. dZ, dtheta)", "%s", "");
        lb_free(&t);
    }
    {
        lcase c = {3, 1, 10, 8, 4, 3, 0, 1, 3, 4, 1.0f, 1.0f};
        lbuf t;
        lb_init(&t, &c, 915);
        t.pb.ql[0] = 4; t.pb.kl[0] = 8; t.pb.ql[1] = 10; t.pb.kl[1] = 3; t.pb.ql[2] = 0; t.pb.kl[2] = 5;
        th_rng rr = {3};
        th_fill_tensor(&t.pb.tq, 3, 1, 10, 4, t.pb.ql, &rr, 1.0);
        th_fill_tensor(&t.pb.tk, 3, 1, 8, 4, t.pb.kl, &rr, 1.0);
        th_fill_tensor(&t.pb.tv, 3, 1, 8, 3, t.pb.kl, &rr, 1.0);
        th_fill_tensor(&t.pb.tdo, 3, 1, 10, 3, t.pb.ql, &rr, 1.0);
        bk_status st = lfwd(&t, NULL);
        if (!st) st = lbwd(&t, NULL);
        int ok = st == BK_OK;
        for (int b = 0; b < 3 && ok; b++) {
            int n = t.pb.ql[b], m = t.pb.kl[b];
            if (n == 0 || m == 0) {
                for (int i = 0; i < 30; i++) ok &= t.pb.o[b * 30 + i] == 0.0f;
                continue;
            }
            lcase u = {1, 1, n, m, 4, 3, 0, 0, 3, 4, 1.0f, 1.0f};
            lbuf s;
            lb_init(&s, &u, 1);
            memcpy(s.Z, t.Z, sizeof(float) * 12);
            memcpy(s.theta, t.theta, sizeof(float) * 3);
            memcpy(s.pb.q, t.pb.q + b * 40, sizeof(float) * n * 4);
            memcpy(s.pb.k, t.pb.k + b * 32, sizeof(float) * m * 4);
            memcpy(s.pb.v, t.pb.v + b * 24, sizeof(float) * m * 3);
            memcpy(s.pb.dout, t.pb.dout + b * 30, sizeof(float) * n * 3);
            lfwd(&s, NULL);
            lbwd(&s, NULL);
            ok &= !memcmp(s.pb.o, t.pb.o + b * 30, sizeof(float) * n * 3);
            ok &= !memcmp(s.pb.dq, t.pb.dq + b * 40, sizeof(float) * n * 4);
            ok &= !memcmp(s.pb.dk, t.pb.dk + b * 32, sizeof(float) * m * 4);
            for (int i = n * 3; i < 30; i++) ok &= t.pb.o[b * 30 + i] == 0.0f;
            lb_free(&s);
        }
        th_check(ok, "LOT padding == truncation (bitwise), NaN in the padding", "%s", bk_last_error());
        lb_free(&t);
    }
}

static double lot_loss(void *ctx)
{
    lbuf *t = ctx;
    lfwd(t, NULL);
    double L = 0;
    for (size_t j = 0; j < (size_t)t->pb.desc.B * t->pb.desc.H * t->pb.desc.Nq * t->pb.desc.dv; j++)
        L += (double)t->pb.o[j] * t->pb.dout[j];
    return L;
}

/* directional finite differences of the float32 operator for Q, K, V, Z, theta */
static void test_lot_fd(void)
{
    lcase c = {1, 1, 6, 7, 3, 2, 0, 0, 3, 5, 1.0f, 1.0f};
    lbuf t;
    lb_init(&t, &c, 920);
    lfwd(&t, NULL);
    lbwd(&t, NULL);
    float *in[5] = {t.pb.q, t.pb.k, t.pb.v, t.Z, t.theta};
    const float *an[5] = {t.pb.dq, t.pb.dk, t.pb.dv, t.dZ, t.dth};
    const int cnt[5] = {18, 21, 14, 9, 3};
    const char *nm[5] = {"dQ", "dK", "dV", "dZ", "dtheta"};
    th_rng r = {5};
    for (int w = 0; w < 5; w++) {
        char name[48];
        snprintf(name, sizeof name, "LOT directional FD %s", nm[w]);
        /* step 4e-3: with 1e-3 the float32 forward's rounding (which moves
         * with the CPU's BLAS kernels) reached the tolerance on a 16-core host */
        th_directional_fd(name, in[w], an[w], cnt[w], 4e-3f, &r, lot_loss, &t);
    }
    lb_free(&t);
}

/* per-problem early stop of the inner problems: stops after a row step, and
 * the result equals a run with that many half-steps */
static void test_lot_early_stop(void)
{
    lcase c = {1, 1, 12, 10, 4, 3, 0, 0, 4, 301, 1.0f, 1.0f};
    lbuf t;
    lb_init(&t, &c, 940);
    t.p.tol = 1e-4f;
    lfwd(&t, NULL);
    const int i1 = t.diag[0].iters1, i2 = t.diag[0].iters2;
    int ok = i1 % 2 == 1 && i2 % 2 == 1 && i1 < 301 && i2 < 301;
    th_check(ok, "LOT early stop: both inner problems stop on a row step", "iters %d %d", i1, i2);
    lbwd(&t, NULL);
    if (i1 == i2) { /* same count: compare with a fixed-T run */
        lbuf u;
        lcase c2 = c;
        c2.T = i1;
        lb_init(&u, &c2, 940);
        lfwd(&u, NULL);
        lbwd(&u, NULL);
        th_check(!memcmp(u.pb.o, t.pb.o, sizeof(float) * 36) && !memcmp(u.pb.dq, t.pb.dq, sizeof(float) * 48) &&
                     !memcmp(u.dth, t.dth, sizeof(float) * 4),
                 "LOT early-stopped forward and backward == fixed T", "T=%d", i1);
        lb_free(&u);
    }
    /* the backward replays exactly the steps run: tape-less (recomputed) == taped */
    void *tape = malloc(bk_lot_tape_size(&t.pb.desc, &t.p));
    lfwd(&t, tape);
    lbwd(&t, tape);
    float dq1[48];
    memcpy(dq1, t.pb.dq, sizeof dq1);
    lbwd(&t, NULL);
    th_check(!memcmp(dq1, t.pb.dq, sizeof dq1), "LOT early stop: taped backward == recomputing backward", "%s", "");
    free(tape);
    lb_free(&t);
}

static void test_lot_bad_input(void)
{
    lcase c = {1, 2, 5, 5, 3, 2, 0, 0, 2, 3, 1.0f, 1.0f};
    lbuf t;
    lb_init(&t, &c, 930);
    float o0[20];
    memcpy(o0, t.pb.o, sizeof o0);
#define EXPECT(mut, code, what)                                                                                    \
    do {                                                                                                           \
        bk_lot_config p = t.p;                                                                                     \
        mut;                                                                                                       \
        bk_status s_ = bk_lot_forward(&t.pb.desc, &p, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, NULL, NULL, NULL, 0); \
        th_check(s_ == (code) && !memcmp(o0, t.pb.o, sizeof o0), "lot bad input: " what, "%s (%s)",               \
                 bk_status_str(s_), bk_last_error());                                                              \
    } while (0)
    EXPECT(p.r = 0, BK_ERR_PARAM, "r < 1");
    EXPECT(p.temp = 0.0f, BK_ERR_PARAM, "temp = 0");
    EXPECT(p.temp = -1.0f, BK_ERR_PARAM, "temp < 0");
    EXPECT(p.eps = 0.0f, BK_ERR_PARAM, "eps = 0");
    EXPECT(p.iters = 0, BK_ERR_PARAM, "T = 0");
    EXPECT(p.Z = NULL, BK_ERR_NULL, "Z NULL");
    EXPECT(p.theta = NULL, BK_ERR_NULL, "theta NULL");
    float zbad[12];
    memcpy(zbad, t.Z, sizeof zbad);
    zbad[7] = NAN;
    EXPECT(p.Z = zbad, BK_ERR_NONFINITE, "non-finite pivot");
    float tbad[4] = {0, INFINITY, 0, 0};
    EXPECT(p.theta = tbad, BK_ERR_NONFINITE, "non-finite logit");
#undef EXPECT
    size_t tsz = bk_lot_tape_size(&t.pb.desc, &t.p);
    char *tape = calloc(1, tsz);
    th_check(lbwd(&t, tape) == BK_ERR_TAPE, "lot bad input: garbage tape", "%s", bk_last_error());
    lfwd(&t, tape);
    t.p.iters = 4;
    th_check(lbwd(&t, tape) == BK_ERR_TAPE, "lot bad input: tape from another T", "%s", bk_last_error());
    free(tape);
    /* r > n is allowed (documented) */
    lcase c2 = {1, 1, 3, 4, 3, 2, 0, 0, 7, 5, 1.0f, 1.0f};
    lbuf u;
    lb_init(&u, &c2, 931);
    th_check(lfwd(&u, NULL) == BK_OK && lbwd(&u, NULL) == BK_OK, "lot r > n is allowed", "%s", bk_last_error());
    lb_free(&u);
    lb_free(&t);
}

/* Non-finite inputs: LOT finds them in its own products (L1 = Q Z^T, L2 =
 * Z K^T, Y = A2 V, X = A1^T dO) instead of a scan before the call, then
 * names them by that scan. Every valid position of q, k, v and dout, NaN and
 * +-Inf, in a padded [B,N,H,d] batch, with a column of Z zero (0 * NaN must
 * still be seen), forward and backward (taped and recomputing): the status
 * and the row named are the scan's; values in padded rows are never read. */
static void test_lot_nonfinite(void)
{
    lcase c = {2, 2, 6, 5, 3, 2, 1, 1, 2, 3, 1.0f, 1.0f};
    lbuf t;
    lb_init(&t, &c, 933);
    for (int tt = 0; tt < c.r; tt++) t.Z[((size_t)1 * c.r + tt) * c.d + 2] = 0.0f; /* head 1: Z[:, 2] = 0 */
    const bk_attn_desc *d = &t.pb.desc;
    char *tape = malloc(bk_lot_tape_size(d, &t.p));
    int ok_clean = lfwd(&t, tape) == BK_OK;
    struct {
        const char *name;
        const bk_tensor *tv;
        int N, C;
        const int32_t *len;
    } in[4] = {{"q", &t.pb.tq, c.Nq, c.d, t.pb.ql}, {"k", &t.pb.tk, c.Nk, c.d, t.pb.kl},
               {"v", &t.pb.tv, c.Nk, c.dv, t.pb.kl}, {"dout", &t.pb.tdo, c.Nq, c.dv, t.pb.ql}};
    int total = 0, named = 0, padded = 0, padded_ok = 0;
    char why[256] = "";
    for (int x = 0; x < 4; x++)
        for (int b = 0; b < c.B; b++)
            for (int h = 0; h < c.H; h++)
                for (int n = 0; n < in[x].N; n++)
                    for (int col = 0; col < in[x].C; col++) {
                        float *at = in[x].tv->data + b * in[x].tv->stride_b + h * in[x].tv->stride_h + (int64_t)n * in[x].tv->stride_n + col;
                        const float keep = *at;
                        *at = (n + col) % 3 == 0 ? NAN : (n + col) % 3 == 1 ? INFINITY : -INFINITY;
                        const int valid = n < in[x].len[b];
                        char want[96];
                        snprintf(want, sizeof want, "tensor %s has a non-finite value at [%d,%d,%d,:]", in[x].name, b,
                                 h, n);
                        bk_status s[3] = {BK_OK, BK_OK, BK_OK};
                        const char *msg[3] = {"", "", ""};
                        char m0[256] = "", m1[256] = "", m2[256] = "";
                        if (x < 3) {
                            s[0] = lfwd(&t, NULL);
                            snprintf(m0, sizeof m0, "%s", bk_last_error());
                        }
                        s[1] = lbwd(&t, tape);
                        snprintf(m1, sizeof m1, "%s", bk_last_error());
                        s[2] = lbwd(&t, NULL);
                        snprintf(m2, sizeof m2, "%s", bk_last_error());
                        msg[0] = m0, msg[1] = m1, msg[2] = m2;
                        *at = keep;
                        if (!valid) {
                            padded++;
                            padded_ok += s[0] == BK_OK && s[1] == BK_OK && s[2] == BK_OK;
                            continue;
                        }
                        for (int k = x < 3 ? 0 : 1; k < 3; k++) {
                            total++;
                            if (s[k] == BK_ERR_NONFINITE && strstr(msg[k], want)) named++;
                            else if (!why[0])
                                snprintf(why, sizeof why, "%s [%d,%d,%d,%d] call %d: %s (%s)", in[x].name, b, h, n,
                                         col, k, bk_status_str(s[k]), msg[k]);
                        }
                    }
    th_check(ok_clean && total > 0 && named == total, "lot: a non-finite q, k, v or dout is found and named, forward "
             "and backward", "%d of %d; first miss %s", named, total, why);
    th_check(padded > 0 && padded_ok == padded, "lot: non-finite values in padded rows are not read", "%d of %d",
             padded_ok, padded);
    free(tape);
    lb_free(&t);
}

/* ---- the determinism contract (docs/ARCHITECTURE.md): thread counts and
 * batch shapes. Every output of a forward (with A and diagnostics) and of a
 * backward from its tape must be bitwise the same at 1, 2, 3, 5 and 8
 * threads, and a problem must give bitwise the same slices alone, as one of
 * 3 and as one of 16 (dZ and dtheta are batch sums: threads only). ---- */
typedef struct {
    lbuf t;
    void *tape;
    size_t tape_bytes;
    bk_status s[2];
} ldet;

/* B x H problems (layout as c), lengths (Lq, Lk) for entry e and random ones
 * for the others (some without queries); NaN in the padding */
static void ld_init(ldet *x, const lcase *c, int e, int Lq, int Lk, uint64_t seed)
{
    lcase u = *c;
    u.pad = 0;
    lb_init(&x->t, &u, seed);
    th_prob *pb = &x->t.pb;
    th_prob_plant_lengths(pb, e, Lq, Lk, seed ^ 0x51ull);
    x->tape_bytes = bk_lot_tape_size(&pb->desc, &x->t.p);
    x->tape = calloc(1, x->tape_bytes); /* bytes a run does not write stay 0 */
}

static void ld_free(ldet *x)
{
    free(x->tape);
    lb_free(&x->t);
}

static void ld_run(void *ctx)
{
    ldet *x = ctx;
    x->s[0] = lfwd(&x->t, x->tape);
    x->s[1] = x->s[0] ? x->s[0] : lbwd(&x->t, x->tape);
}

static int ld_spans(const ldet *x, th_span *sp)
{
    const bk_attn_desc *d = &x->t.pb.desc;
    const size_t P = (size_t)d->B * d->H, r = (size_t)x->t.p.r;
    int n = th_prob_spans(&x->t.pb, sp);
    sp[n++] = (th_span){x->t.dZ, 4 * (size_t)d->H * r * (size_t)d->d};
    sp[n++] = (th_span){x->t.dth, 4 * (size_t)d->H * r};
    sp[n++] = (th_span){x->t.diag, sizeof(bk_lot_diag) * P};
    sp[n++] = (th_span){x->tape, x->tape_bytes};
    sp[n++] = (th_span){x->s, sizeof x->s};
    return n;
}


/* plants problem (0, 0) of x (its inputs, pivots, masses) as problem (b, h)
 * of y (whose entry b has the same lengths) */
static void ld_plant(const ldet *x, ldet *y, int b, int h)
{
    const bk_attn_desc *d = &x->t.pb.desc;
    const int r = x->t.p.r;
    th_prob_plant(&x->t.pb, &y->t.pb, b, h);
    memcpy(y->t.Z + (size_t)h * r * d->d, x->t.Z, sizeof(float) * (size_t)r * d->d);
    memcpy(y->t.theta + (size_t)h * r, x->t.theta, sizeof(float) * (size_t)r);
}

/* problem (b, h) of y equals problem (0, 0) of x in every per-problem output */
static int ld_same(const ldet *x, const ldet *y, int b, int h)
{
    return x->s[0] == BK_OK && x->s[1] == BK_OK && y->s[0] == BK_OK && y->s[1] == BK_OK &&
           th_prob_same(&x->t.pb, &y->t.pb, b, h) &&
           !memcmp(&x->t.diag[0], &y->t.diag[b * y->t.pb.desc.H + h], sizeof(bk_lot_diag));
}

/* A B*H = 1 call runs as a team at 2+ threads: its workspace then holds the
 * engine's row buffers of every member (one thread per problem would not) */
static int lot_runs_as_team(const ldet *x)
{
    bk_set_num_threads(1);
    const size_t w1 = bk_lot_workspace_size(&x->t.pb.desc, &x->t.p);
    int team = 1;
    for (int i = 1; i < TH_NTHREADS; i++) {
        bk_set_num_threads(th_threads[i]);
        team &= bk_lot_workspace_size(&x->t.pb.desc, &x->t.p) > w1;
    }
    bk_set_num_threads(0);
    return team;
}

static void test_lot_determinism(void)
{
    /* one problem large enough to run as a team: (389 + 321) x (r + d + dv) */
    const int Nq = 400, Nk = 333, Lq = 389, Lk = 321;
    struct { const char *name; int T; float tol; } cases[] = {
        {"LOT T=5", 5, 0.0f}, {"LOT T=6", 6, 0.0f}, {"LOT T=40 tol=1e-3 (early stop)", 40, 1e-3f}};
    for (int ci = 0; ci < 3; ci++) {
        if (TH.quick && ci == 1) continue;
        char name[200];
        th_span sp[10];
        /* (a) thread counts: one problem (a team) and a batch of 12 in [B,N,H,C] */
        const int shapes[2][3] = {{1, 1, 0}, {3, 4, 1}};
        for (int si = 0; si < 2; si++) {
            lcase c = {shapes[si][0], shapes[si][1], Nq, Nk, 24, 16, shapes[si][2], 0, 20, cases[ci].T, 1.0f, 1.0f};
            ldet x;
            ld_init(&x, &c, 0, Lq, Lk, 960 + ci);
            x.t.p.tol = cases[ci].tol;
            if (si == 0)
                th_check(lot_runs_as_team(&x), "LOT: one problem of 389 x 321 (r 20, d 24, dv 16) runs as a team",
                         "%s", "its workspace does not grow with the thread count");
            snprintf(name, sizeof name, "%s: forward (O, A, diag, tape) and backward (dQ, dK, dV, dZ, dtheta) bitwise "
                     "identical at 1, 2, 3, 5, 8 threads (B=%d H=%d)", cases[ci].name, c.B, c.H);
            th_same_over_threads(name, ld_run, &x, sp, ld_spans(&x, sp));
            th_check(x.s[0] == BK_OK && x.s[1] == BK_OK, name, "status %s / %s: %s", bk_status_str(x.s[0]),
                     bk_status_str(x.s[1]), bk_last_error());
            ld_free(&x);
        }
        /* (b) batch shapes: the problem alone, as one of 3 and as one of 16 */
        lcase c1 = {1, 1, Nq, Nk, 24, 16, 0, 0, 20, cases[ci].T, 1.0f, 1.0f};
        ldet x;
        ld_init(&x, &c1, 0, Lq, Lk, 970 + ci);
        x.t.p.tol = cases[ci].tol;
        ld_run(&x);
        const int batches[2][5] = {{1, 3, 0, 2, 0}, {4, 4, 2, 1, 1}}; /* B, H, b, h, layout */
        for (int bi = 0; bi < 2; bi++)
            for (int nt = 1; nt <= 3; nt++) {
                lcase cb = c1;
                cb.B = batches[bi][0];
                cb.H = batches[bi][1];
                cb.layout = batches[bi][4];
                ldet y;
                ld_init(&y, &cb, batches[bi][2], Lq, Lk, 980 + ci);
                y.t.p.tol = cases[ci].tol;
                ld_plant(&x, &y, batches[bi][2], batches[bi][3]);
                bk_set_num_threads(nt);
                ld_run(&y);
                bk_set_num_threads(0);
                snprintf(name, sizeof name, "%s: a problem alone == the same problem in a batch of %d (%d threads)",
                         cases[ci].name, cb.B * cb.H, nt);
                th_check(ld_same(&x, &y, batches[bi][2], batches[bi][3]), name, "outputs differ (%s)", bk_last_error());
                ld_free(&y);
            }
        ld_free(&x);
    }
}

void test_lot(void)
{
    test_lot_grid();
    test_lot_properties();
    test_lot_fd();
    test_lot_early_stop();
    test_lot_bad_input();
    test_lot_nonfinite();
    test_lot_determinism();
}
