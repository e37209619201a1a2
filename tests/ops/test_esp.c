/* test_esp.c -- ESP attention: against the independent double reference
 * (tests/ops/ref_esp.c), finite differences, the digest's properties,
 * determinism, padding, and bad input. */
#include "birkhoff.h"
#include "../harness.h"
#include "ref_esp.h"
#include "../tutil.h"
#include "../../src/ops/ops.h" /* bki_esp_plan, bki_argsort_team: the team mode and the team sort */

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, H, Nq, Nk, d, dv, layout, pad;
    bk_esp_sort sort;
    float t, tau;
    bk_esp_cost cost;
    bk_esp_scale sc;
    int L;          /* 0 axis; > 0 random theta given explicitly */
    double sigma;   /* input std */
} ecase;

typedef struct {
    th_prob pb; /* inputs, outputs, views, lengths */
    float *theta, *sig, *dth;
    bk_esp_config p;
    bk_esp_diag *diag;
    int L;
} ebuf;

static void eb_init(ebuf *t, const ecase *c, uint64_t seed)
{
    th_rng r = {seed};
    const int B = c->B, H = c->H;
    th_prob_init(&t->pb, B, H, c->Nq, c->Nk, c->d, c->dv, c->layout, c->pad, c->sigma, &r);
    t->p = bk_esp_config_default();
    t->p.sort = c->sort;
    t->p.t = c->t;
    t->p.tau = c->tau;
    t->p.cost = c->cost;
    t->p.out_scale = c->sc;
    t->L = c->L ? c->L : c->d;
    t->theta = calloc((size_t)t->L * c->d, sizeof(float));
    t->dth = calloc((size_t)t->L * c->d, sizeof(float));
    if (c->L) {
        for (int l = 0; l < c->L; l++) {
            double nrm = 0;
            for (int x = 0; x < c->d; x++) {
                t->theta[l * c->d + x] = (float)th_normal(&r);
                nrm += (double)t->theta[l * c->d + x] * t->theta[l * c->d + x];
            }
            for (int x = 0; x < c->d; x++) t->theta[l * c->d + x] /= (float)sqrt(nrm);
        }
        t->p.L = c->L;
        t->p.theta = t->theta;
    }
    t->sig = calloc((size_t)B * H * t->L, sizeof(float));
    t->diag = calloc((size_t)B * H, sizeof(bk_esp_diag));
}

static void eb_free(ebuf *t)
{
    th_prob_free(&t->pb);
    free(t->theta); free(t->sig); free(t->dth); free(t->diag);
}

static bk_status efwd(ebuf *t, void *tape)
{
    bk_esp_extras ex = {t->pb.ta, t->sig, NULL, t->diag};
    return bk_esp_forward(&t->pb.desc, &t->p, &t->pb.tq, &t->pb.tk, &t->pb.tv, &t->pb.to, tape, &ex, NULL, 0);
}
static bk_status ebwd(ebuf *t, const void *tape)
{
    return bk_esp_backward(&t->pb.desc, &t->p, &t->pb.tq, &t->pb.tk, &t->pb.tv, &t->pb.tdo, tape, &t->pb.tdq, &t->pb.tdk, &t->pb.tdv, t->dth,
                           NULL, 0);
}

static ref_esp_cfg ref_cfg(const ecase *c, const ebuf *t, double *theta_d)
{
    ref_esp_cfg rc;
    memset(&rc, 0, sizeof rc);
    rc.sort = c->sort == BK_ESP_SOFT;
    rc.t = c->t;
    rc.tau = c->tau;
    rc.scale = 1.0 / sqrt((double)(float)c->d);
    rc.scale = (double)(1.0f / sqrtf((float)c->d)); /* the float scale the library uses */
    rc.cost = c->cost == BK_ESP_COST_EUCLID;
    rc.out_scale = c->sc == BK_ESP_SCALE_PAPER;
    rc.L = t->L;
    if (c->L) {
        for (int i = 0; i < t->L * c->d; i++) theta_d[i] = t->theta[i];
        rc.theta = theta_d;
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
static void check_ref(const ecase *c, uint64_t seed)
{
    ebuf t;
    eb_init(&t, c, seed);
    void *tape = malloc(bk_esp_tape_size(&t.pb.desc, &t.p));
    bk_status s1 = efwd(&t, tape), s2 = s1 ? s1 : ebwd(&t, tape);
    char name[240];
    snprintf(name, sizeof name, "esp-ref %s %s %s B%d H%d Nq%d Nk%d d%d dv%d %s pad%d tau%g t%g L%d",
             c->sort ? "soft" : "hard", c->cost ? "euclid" : "sq", c->sc ? "paper" : "rows", c->B, c->H, c->Nq, c->Nk,
             c->d, c->dv, c->layout ? "bnhd" : "bhnd", c->pad, (double)c->tau, (double)c->t, c->L);
    if (!th_check(s1 == BK_OK && s2 == BK_OK, name, "%s / %s: %s", bk_status_str(s1), bk_status_str(s2),
                  bk_last_error())) {
        free(tape);
        eb_free(&t);
        return;
    }
    const int B = c->B, H = c->H, L = t.L;
    double *Q = th_gather(&t.pb.tq, B, H, c->Nq, c->d, t.pb.ql), *K = th_gather(&t.pb.tk, B, H, c->Nk, c->d, t.pb.kl);
    double *V = th_gather(&t.pb.tv, B, H, c->Nk, c->dv, t.pb.kl), *dO = th_gather(&t.pb.tdo, B, H, c->Nq, c->dv, t.pb.ql);
    size_t nq = (size_t)B * H * c->Nq, nk = (size_t)B * H * c->Nk;
    double *A = calloc(nq * c->Nk, 8), *O = calloc(nq * c->dv, 8), *S = calloc((size_t)B * H * L, 8);
    double *dQ = calloc(nq * c->d, 8), *dK = calloc(nk * c->d, 8), *dV = calloc(nk * c->dv, 8);
    double *dT = calloc((size_t)L * c->d, 8), *thd = calloc((size_t)L * c->d, 8);
    int *ql = th_lens_int(t.pb.ql, B), *kl = th_lens_int(t.pb.kl, B);
    ref_esp_cfg rc = ref_cfg(c, &t, thd);
    ref_esp_forward_batched(B, H, c->Nq, c->Nk, c->d, c->dv, ql, kl, Q, K, V, &rc, A, O, S);
    ref_esp_backward_batched(B, H, c->Nq, c->Nk, c->d, c->dv, ql, kl, Q, K, V, &rc, dO, dQ, dK, dV, dT);
    double eo = th_rel_err(&t.pb.to, B, H, c->Nq, c->dv, O), ea = th_rel_err(&t.pb.ta, B, H, c->Nq, c->Nk, A);
    double eq = th_rel_err(&t.pb.tdq, B, H, c->Nq, c->d, dQ), ek = th_rel_err(&t.pb.tdk, B, H, c->Nk, c->d, dK);
    double ev = th_rel_err(&t.pb.tdv, B, H, c->Nk, c->dv, dV);
    double es = 0, et = 0, tmax = 1;
    for (int i = 0; i < B * H * L; i++) es = fmax(es, fabs(t.sig[i] - S[i]));
    for (int i = 0; i < L * c->d; i++) tmax = fmax(tmax, fabs(dT[i]));
    if (c->L && c->sort == BK_ESP_SOFT)
        for (int i = 0; i < L * c->d; i++) et = fmax(et, fabs(t.dth[i] - dT[i]) / tmax);
    th_check(eo <= 1e-5 && ea <= 1e-5 && es <= 1e-5 && eq <= 1e-4 && ek <= 1e-4 && ev <= 1e-4 && et <= 1e-4, name,
             "O %.1e A %.1e sig %.1e dQ %.1e dK %.1e dV %.1e dTheta %.1e", eo, ea, es, eq, ek, ev, et);
    free(Q); free(K); free(V); free(dO); free(A); free(O); free(S); free(dQ); free(dK); free(dV); free(dT); free(thd);
    free(ql); free(kl); free(tape);
    eb_free(&t);
}

static void test_esp_grid(void)
{
    const int shapes[][6] = {
        {1, 1, 1, 1, 2, 2},  {1, 1, 7, 7, 4, 3},   {2, 2, 9, 9, 4, 5},  {1, 1, 5, 9, 4, 3},
        {2, 1, 12, 4, 8, 6}, {2, 2, 16, 16, 8, 8}, {1, 2, 3, 11, 2, 4},
    };
    const int ns = (int)(sizeof shapes / sizeof shapes[0]);
    uint64_t seed = 500;
    for (int si = 0; si < ns; si++)
        for (int sort = 0; sort < 2; sort++)
            for (int cost = 0; cost < 2; cost++)
                for (int v = 0; v < 3; v++) {
                    if (TH.quick && (v + si) % 2) continue;
                    ecase c = {shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], shapes[si][4], shapes[si][5],
                               v == 1, v == 2, sort, v == 2 ? 0.05f : 0.5f, v == 0 ? 0.0f : (v == 1 ? 1.0f : 10.0f),
                               cost, (si + v) % 2 ? BK_ESP_SCALE_PAPER : BK_ESP_SCALE_ROWS, (si % 3 == 1) ? 3 : 0, 1.0};
                    if (c.d == 2 && c.L == 3) c.L = 0;
                    check_ref(&c, seed++);
                }
}

/* ------------------------------------------------------------------------ */
/* properties                                                                 */
/* ------------------------------------------------------------------------ */
static void attn_sums(const ebuf *t, int n, int m, double *rmax, double *cmax, double ctarget)
{
    *rmax = *cmax = 0;
    for (int i = 0; i < n; i++) {
        double r = 0;
        for (int j = 0; j < m; j++) r += t->pb.a[i * m + j];
        *rmax = fmax(*rmax, fabs(r - 1));
    }
    for (int j = 0; j < m; j++) {
        double s = 0;
        for (int i = 0; i < n; i++) s += t->pb.a[i * m + j];
        *cmax = fmax(*cmax, fabs(s - ctarget));
    }
}

static void test_esp_doubly_stochastic(void)
{
    const float taus[] = {0.0f, 1.0f, 100.0f};
    const int nm[][2] = {{17, 17}, {7, 12}, {12, 5}};
    for (int k = 0; k < 3; k++)
        for (int s = 0; s < 3; s++) {
            ecase c = {1, 1, nm[s][0], nm[s][1], 6, 4, 0, 0, BK_ESP_HARD, 0.1f, taus[k], BK_ESP_COST_SQ,
                       BK_ESP_SCALE_ROWS, 0, 1.0};
            ebuf t;
            eb_init(&t, &c, 600 + k * 3 + s);
            efwd(&t, NULL);
            double re, ce;
            attn_sums(&t, c.Nq, c.Nk, &re, &ce, (double)c.Nq / c.Nk);
            char name[96];
            snprintf(name, sizeof name, "hard ESP exactly doubly stochastic (tau=%g, %dx%d)", (double)taus[k], c.Nq, c.Nk);
            th_check(re < 2e-6 && ce < 2e-6 * c.Nq, name, "rows %.1e cols %.1e", re, ce);
            eb_free(&t);
        }
}

static void test_esp_tau_limits(void)
{
    ecase c = {1, 1, 10, 10, 5, 3, 0, 0, BK_ESP_HARD, 0.1f, 0.0f, BK_ESP_COST_SQ, BK_ESP_SCALE_ROWS, 0, 1.0};
    ebuf t;
    eb_init(&t, &c, 610);
    efwd(&t, NULL);
    double e = 0;
    for (int l = 0; l < 5; l++) e = fmax(e, fabs(t.sig[l] - 0.2));
    th_check(e < 1e-7, "tau = 0: uniform slice weights", "max |sigma - 1/L| %.1e", e);
    /* tau = 0: A is the mean of the lifted plans; each slice's plan alone via L=1 theta = e_l */
    float *acc = calloc(100, sizeof(float));
    for (int l = 0; l < 5; l++) {
        ebuf u;
        eb_init(&u, &c, 610);
        float th[5] = {0, 0, 0, 0, 0};
        th[l] = 1.0f;
        u.p.L = 1;
        u.p.theta = th;
        efwd(&u, NULL);
        for (int i = 0; i < 100; i++) acc[i] += u.pb.a[i] / 5.0f;
        eb_free(&u);
    }
    e = 0;
    for (int i = 0; i < 100; i++) e = fmax(e, fabs(acc[i] - t.pb.a[i]));
    th_check(e < 1e-6, "tau = 0 gives the mean of the slices' plans", "max diff %.1e", e);
    free(acc);
    /* large tau selects the cheapest slice; E_sigma[D] does not increase with tau */
    float D[5];
    bk_esp_extras ex = {t.pb.ta, t.sig, D, NULL};
    t.p.tau = 1e4f;
    bk_esp_forward(&t.pb.desc, &t.p, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, NULL, &ex, NULL, 0);
    int arg = 0;
    for (int l = 1; l < 5; l++)
        if (D[l] < D[arg]) arg = l;
    th_check(t.sig[arg] > 0.999f, "large tau selects argmin D", "sigma[argmin] = %g", (double)t.sig[arg]);
    double prev = 1e300;
    int mono = 1;
    for (int k = 0; k < 6; k++) {
        t.p.tau = (float)k;
        bk_esp_forward(&t.pb.desc, &t.p, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, NULL, &ex, NULL, 0);
        double ed = 0;
        for (int l = 0; l < 5; l++) ed += t.sig[l] * D[l];
        if (ed > prev + 1e-6) mono = 0;
        prev = ed;
    }
    th_check(mono, "E_sigma[D] non-increasing in tau (sign of eq. 9)", "%s", "");
    eb_free(&t);
}

static void test_esp_identity_and_tau0_grad(void)
{
    ecase c = {1, 1, 9, 9, 4, 4, 0, 0, BK_ESP_HARD, 0.1f, 2.0f, BK_ESP_COST_SQ, BK_ESP_SCALE_ROWS, 0, 1.0};
    ebuf t;
    eb_init(&t, &c, 620);
    memcpy(t.pb.k, t.pb.q, sizeof(float) * 9 * 4); /* K = Q: every slice matches i to i */
    efwd(&t, NULL);
    double e = 0;
    for (int i = 0; i < 9 * 4; i++) e = fmax(e, fabs(t.pb.o[i] - t.pb.v[i]));
    th_check(e < 1e-6, "K = Q: hard ESP output equals V", "max diff %.1e", e);
    t.p.tau = 0.0f;
    memcpy(t.pb.k, t.pb.v, sizeof(float) * 9 * 4); /* any K */
    efwd(&t, NULL);
    ebwd(&t, NULL);
    int zero = 1;
    for (int i = 0; i < 9 * 4; i++) zero &= t.pb.dq[i] == 0.0f && t.pb.dk[i] == 0.0f;
    th_check(zero, "hard ESP, tau = 0: dQ = dK = 0 exactly", "%s", "");
    eb_free(&t);
}

static void test_esp_permutation(void)
{
    for (int sort = 0; sort < 2; sort++) {
        ecase c = {1, 1, 8, 8, 4, 3, 0, 0, sort, 0.3f, 1.0f, BK_ESP_COST_SQ, BK_ESP_SCALE_ROWS, 0, 1.0};
        ebuf t, u;
        eb_init(&t, &c, 630);
        eb_init(&u, &c, 631);
        int pm[8] = {5, 2, 7, 0, 3, 6, 1, 4};
        for (int i = 0; i < 8; i++) {
            memcpy(u.pb.q + i * 4, t.pb.q + pm[i] * 4, 16);
            memcpy(u.pb.k + i * 4, t.pb.k + pm[i] * 4, 16);
            memcpy(u.pb.v + i * 3, t.pb.v + pm[i] * 3, 12);
        }
        efwd(&t, NULL);
        efwd(&u, NULL);
        double e = 0;
        for (int i = 0; i < 8; i++)
            for (int x = 0; x < 3; x++) e = fmax(e, fabs(u.pb.o[i * 3 + x] - t.pb.o[pm[i] * 3 + x]));
        char name[64];
        snprintf(name, sizeof name, "%s ESP permutation equivariance", sort ? "soft" : "hard");
        th_check(e < 2e-6, name, "max diff %.1e", e);
        eb_free(&t);
        eb_free(&u);
    }
}

static void test_esp_soft_to_hard(void)
{
    ecase c = {1, 2, 10, 13, 4, 3, 0, 0, BK_ESP_SOFT, 1e-12f, 1.0f, BK_ESP_COST_SQ, BK_ESP_SCALE_ROWS, 0, 3.0};
    ebuf t, u;
    eb_init(&t, &c, 640);
    c.sort = BK_ESP_HARD;
    eb_init(&u, &c, 640);
    efwd(&t, NULL);
    efwd(&u, NULL);
    double e = 0;
    for (int i = 0; i < 2 * 10 * 3; i++) e = fmax(e, fabs(t.pb.o[i] - u.pb.o[i]));
    th_check(e < 1e-5, "soft sort -> hard sort as t -> 0", "max |O_soft(t=1e-12) - O_hard| %.1e", e);
    th_check(t.diag[0].col_err < 1e-4f, "soft plan marginals reported (t small: nearly exact)", "col err %.1e",
             (double)t.diag[0].col_err);
    c.sort = BK_ESP_SOFT;
    c.t = 1.0f;
    ebuf w;
    eb_init(&w, &c, 640);
    efwd(&w, NULL);
    th_check(w.diag[0].col_err > 1e-3f && w.diag[0].row_err > 1e-3f, "soft plan at t=1 is not doubly stochastic",
             "row %.2e col %.2e", (double)w.diag[0].row_err, (double)w.diag[0].col_err);
    eb_free(&t);
    eb_free(&u);
    eb_free(&w);
}

static void test_esp_padding_determinism(void)
{
    for (int sort = 0; sort < 2; sort++) {
        ecase c = {4, 2, 11, 9, 4, 3, 0, 1, sort, 0.2f, 1.5f, BK_ESP_COST_SQ, BK_ESP_SCALE_ROWS, 0, 1.0};
        ebuf t;
        eb_init(&t, &c, 650 + sort);
        t.pb.ql[0] = 3; t.pb.kl[0] = 9; t.pb.ql[1] = 11; t.pb.kl[1] = 2; t.pb.ql[2] = 0; t.pb.kl[2] = 4; t.pb.ql[3] = 11; t.pb.kl[3] = 9;
        th_rng rr = {9};
        th_fill_tensor(&t.pb.tq, 4, 2, 11, 4, t.pb.ql, &rr, 1.0);
        th_fill_tensor(&t.pb.tk, 4, 2, 9, 4, t.pb.kl, &rr, 1.0);
        th_fill_tensor(&t.pb.tv, 4, 2, 9, 3, t.pb.kl, &rr, 1.0);
        th_fill_tensor(&t.pb.tdo, 4, 2, 11, 3, t.pb.ql, &rr, 1.0);
        bk_status st = efwd(&t, NULL);
        if (st == BK_OK) st = ebwd(&t, NULL);
        th_check(st == BK_OK, "padded ESP run with NaN in the padding", "%s", bk_last_error());
        int ok = 1;
        for (int b = 0; b < 4; b++)
            for (int h = 0; h < 2; h++) {
                int n = t.pb.ql[b], m = t.pb.kl[b];
                size_t po = (size_t)(b * 2 + h);
                if (n == 0 || m == 0) {
                    for (int i = 0; i < 11 * 3; i++) ok &= t.pb.o[po * 33 + i] == 0.0f;
                    continue;
                }
                ecase u = {1, 1, n, m, 4, 3, 0, 0, sort, 0.2f, 1.5f, BK_ESP_COST_SQ, BK_ESP_SCALE_ROWS, 0, 1.0};
                ebuf s;
                eb_init(&s, &u, 1);
                memcpy(s.pb.q, t.pb.q + po * 44, sizeof(float) * n * 4);
                memcpy(s.pb.k, t.pb.k + po * 36, sizeof(float) * m * 4);
                memcpy(s.pb.v, t.pb.v + po * 27, sizeof(float) * m * 3);
                memcpy(s.pb.dout, t.pb.dout + po * 33, sizeof(float) * n * 3);
                efwd(&s, NULL);
                ebwd(&s, NULL);
                ok &= !memcmp(s.pb.o, t.pb.o + po * 33, sizeof(float) * n * 3);
                ok &= !memcmp(s.pb.dq, t.pb.dq + po * 44, sizeof(float) * n * 4);
                ok &= !memcmp(s.pb.dk, t.pb.dk + po * 36, sizeof(float) * m * 4);
                ok &= !memcmp(s.pb.dv, t.pb.dv + po * 27, sizeof(float) * m * 3);
                for (int i = n * 3; i < 33; i++) ok &= t.pb.o[po * 33 + i] == 0.0f;
                eb_free(&s);
            }
        char name[64];
        snprintf(name, sizeof name, "%s ESP padding == truncation (bitwise)", sort ? "soft" : "hard");
        th_check(ok, name, "%s", "");
        /* thread-count determinism, including the slice gradient */
        ecase cd = {3, 3, 12, 10, 6, 4, 1, 1, sort, 0.2f, 1.0f, BK_ESP_COST_SQ, BK_ESP_SCALE_ROWS, 4, 1.0};
        ebuf r1;
        eb_init(&r1, &cd, 660);
        bk_set_num_threads(1);
        efwd(&r1, NULL);
        ebwd(&r1, NULL);
        int same = 1;
        for (int nt = 2; nt <= 4; nt++) {
            ebuf r2;
            eb_init(&r2, &cd, 660);
            bk_set_num_threads(nt);
            efwd(&r2, NULL);
            ebwd(&r2, NULL);
            size_t nq = 3 * 3 * 12, nk = 3 * 3 * 10;
            same &= !memcmp(r1.pb.o, r2.pb.o, nq * 4 * 4) && !memcmp(r1.pb.dq, r2.pb.dq, nq * 6 * 4) &&
                    !memcmp(r1.pb.dk, r2.pb.dk, nk * 6 * 4) && !memcmp(r1.pb.dv, r2.pb.dv, nk * 4 * 4) &&
                    !memcmp(r1.dth, r2.dth, 4 * 6 * 4);
            eb_free(&r2);
        }
        bk_set_num_threads(0);
        snprintf(name, sizeof name, "%s ESP bitwise identical for 1..4 threads", sort ? "soft" : "hard");
        th_check(same, name, "%s", "");
        eb_free(&r1);
        eb_free(&t);
    }
}

static double esp_loss(void *ctx)
{
    ebuf *t = ctx;
    efwd(t, NULL);
    double L = 0;
    for (size_t j = 0; j < (size_t)t->pb.desc.B * t->pb.desc.H * t->pb.desc.Nq * t->pb.desc.dv; j++)
        L += (double)t->pb.o[j] * t->pb.dout[j];
    return L;
}

/* finite differences of the float32 soft operator (Q, K, V, Theta), as
 * directional derivatives along random +-1 directions (the float forward's
 * rounding makes single-entry differences too noisy to be informative) */
static void test_esp_fd(void)
{
    for (int cost = 0; cost < 2; cost++) {
        ecase c = {1, 1, 5, 6, 3, 2, 0, 0, BK_ESP_SOFT, 0.5f, 1.0f, cost, BK_ESP_SCALE_ROWS, 2, 1.0};
        ebuf t;
        eb_init(&t, &c, 670 + cost);
        efwd(&t, NULL);
        ebwd(&t, NULL);
        float *in[4] = {t.pb.q, t.pb.k, t.pb.v, t.theta};
        const float *an[4] = {t.pb.dq, t.pb.dk, t.pb.dv, t.dth};
        const int cnt[4] = {15, 18, 12, 6};
        const char *nm[4] = {"dQ", "dK", "dV", "dTheta"};
        th_rng r = {99};
        for (int w = 0; w < 4; w++) {
            char name[64];
            snprintf(name, sizeof name, "ESP soft %s directional FD %s", cost ? "euclid" : "sq", nm[w]);
            th_directional_fd(name, in[w], an[w], cnt[w], 3e-4f, &r, esp_loss, &t);
        }
        eb_free(&t);
    }
}

/* larger hard problems: O(L N log N) path stays exactly doubly stochastic
 * (checked through O with V = one-hot key indicators) */
static void test_esp_large_hard(void)
{
    const int n = 3000, m = 3000, d = 8, dv = 1;
    ecase c = {1, 1, n, m, d, dv, 0, 0, BK_ESP_HARD, 0.1f, 0.5f, BK_ESP_COST_SQ, BK_ESP_SCALE_ROWS, 0, 1.0};
    ebuf t;
    eb_init(&t, &c, 680);
    for (int j = 0; j < m; j++) t.pb.v[j] = 1.0f;
    bk_esp_extras ex = {{0}, t.sig, NULL, NULL};
    bk_status s = bk_esp_forward(&t.pb.desc, &t.p, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, NULL, &ex, NULL, 0);
    double e = 0;
    for (int i = 0; i < n; i++) e = fmax(e, fabs(t.pb.o[i] - 1.0));
    th_check(s == BK_OK && e < 1e-5, "hard ESP N=3000: rows of A sum to 1 (A 1 via O)", "%.1e", e);
    eb_free(&t);
}

static void test_esp_bad_input(void)
{
    ecase c = {1, 2, 5, 5, 3, 2, 0, 0, BK_ESP_SOFT, 0.5f, 1.0f, BK_ESP_COST_SQ, BK_ESP_SCALE_ROWS, 0, 1.0};
    ebuf t;
    eb_init(&t, &c, 690);
    float o0[20];
    memcpy(o0, t.pb.o, sizeof o0);
#define EXPECT(mut, code, what)                                                                                   \
    do {                                                                                                          \
        bk_esp_config p = t.p;                                                                                    \
        mut;                                                                                                      \
        bk_status s_ = bk_esp_forward(&t.pb.desc, &p, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, NULL, NULL, NULL, 0);             \
        th_check(s_ == (code) && !memcmp(o0, t.pb.o, sizeof o0), "esp bad input: " what, "%s (%s)", bk_status_str(s_), \
                 bk_last_error());                                                                                \
    } while (0)
    EXPECT(p.L = -1, BK_ERR_PARAM, "L < 0");
    EXPECT(p.t = 0.0f, BK_ERR_PARAM, "t = 0 (soft)");
    EXPECT(p.t = -1.0f, BK_ERR_PARAM, "t < 0 (soft)");
    EXPECT(p.tau = NAN, BK_ERR_PARAM, "tau NaN");
    EXPECT(p.tau = INFINITY, BK_ERR_PARAM, "tau inf");
    EXPECT(p.tau = -1.0f, BK_ERR_PARAM, "tau < 0");
    EXPECT(p.theta = t.theta, BK_ERR_PARAM, "theta with L = 0");
    float bad[6] = {1, 0, 0, 0, NAN, 0};
    EXPECT((p.L = 2, p.theta = bad), BK_ERR_NONFINITE, "NaN in theta");
    EXPECT(p.sort = (bk_esp_sort)7, BK_ERR_PARAM, "unknown sort");
    EXPECT(p.cost = (bk_esp_cost)7, BK_ERR_PARAM, "unknown cost");
    EXPECT(p.scale = NAN, BK_ERR_PARAM, "scale NaN");
#undef EXPECT
    /* hard sort ignores t */
    bk_esp_config p = t.p;
    p.sort = BK_ESP_HARD;
    p.t = 0.0f;
    th_check(bk_esp_forward(&t.pb.desc, &p, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.to, NULL, NULL, NULL, 0) == BK_OK,
             "hard sort does not need t", "%s", bk_last_error());
    /* tapes */
    size_t tsz = bk_esp_tape_size(&t.pb.desc, &t.p);
    char *tape = calloc(1, tsz);
    th_check(ebwd(&t, tape) == BK_ERR_TAPE, "esp bad input: garbage tape", "%s", bk_last_error());
    efwd(&t, tape);
    bk_esp_config p2 = t.p;
    p2.tau = 2.0f;
    th_check(bk_esp_backward(&t.pb.desc, &p2, &t.pb.tq, &t.pb.tk, &t.pb.tv, &t.pb.tdo, tape, &t.pb.tdq, &t.pb.tdk, &t.pb.tdv, NULL, NULL, 0) ==
                 BK_ERR_TAPE,
             "esp bad input: tape from other parameters", "%s", bk_last_error());
    ((int32_t *)(tape + 64))[16 + 2 * 3] = 77; /* corrupt an order */
    th_check(ebwd(&t, tape) == BK_ERR_TAPE, "esp bad input: corrupt tape order", "%s", bk_last_error());
    free(tape);
    float th[9];
    th_check(bk_esp_slices(&t.p, 3, th) == BK_OK && th[0] == 1 && th[1] == 0 && th[4] == 1, "bk_esp_slices identity",
             "%s", "");
    bk_esp_config pr = t.p;
    pr.L = 4;
    pr.seed = 42;
    float r1[12], r2[12];
    bk_esp_slices(&pr, 3, r1);
    bk_esp_slices(&pr, 3, r2);
    double nrm = r1[0] * r1[0] + r1[1] * r1[1] + r1[2] * r1[2];
    th_check(!memcmp(r1, r2, sizeof r1) && fabs(nrm - 1) < 1e-6, "seeded random slices: unit, reproducible", "%g", nrm);
    th_check(fabsf(bk_esp_anneal(1e-3f, 0.8f, 40) - 1e-3f * powf(0.8f, 40)) < 1e-12f, "annealing schedule", "%s", "");
    eb_free(&t);
}

/* ------------------------------------------------------------------------ */
/* the parallel model: bitwise the same for any thread count, batch shape    */
/* ------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    bk_esp_sort sort;
    bk_esp_cost cost;
    int Nq, Nk, d, dv, Lq, Lk; /* sizes and the valid lengths of the single problem */
    int L, slices;             /* slices: 0 axis-aligned (L = d), 1 learned theta, 2 random (seeded) */
    int no_attn;               /* 1: no dense attention output (long sequences) */
} dcase;

typedef struct {
    ebuf t;
    float *D, *dq2, *dk2, *dv2, *dth2;  /* D; the backward's outputs without a tape */
    bk_tensor tdq2, tdk2, tdv2;
    bk_status s[3];
    int attn; /* the forward writes the dense attention */
} dprob;

/* B x H problems of case c; the single problem's lengths for every batch entry
 * when B * H = 1, random lengths otherwise (the last entry full) */
static void dpe_init(dprob *x, const dcase *c, int B, int H, int layout, uint64_t seed)
{
    ecase e = {B, H, c->Nq, c->Nk, c->d, c->dv, layout, 1, c->sort, 0.2f, 1.0f, c->cost, BK_ESP_SCALE_ROWS,
               c->slices ? c->L : 0, 1.0};
    memset(x, 0, sizeof *x);
    x->attn = !c->no_attn;
    if (c->no_attn) e.Nk = 1; /* th_prob's [Nq, Nk] attention buffer stays small */
    eb_init(&x->t, &e, seed);
    if (c->no_attn) { /* the real key count, without th_prob's Nq x Nk attention buffer */
        th_prob *pb = &x->t.pb;
        th_rng r0 = {seed + 2};
        const size_t nk = (size_t)B * H * c->Nk;
        free(pb->k); free(pb->v); free(pb->dk); free(pb->dv);
        pb->k = th_alloc_fill(nk * c->d, 0); pb->v = th_alloc_fill(nk * c->dv, 0);
        pb->dk = th_alloc_fill(nk * c->d, -7); pb->dv = th_alloc_fill(nk * c->dv, -7);
        pb->desc.Nk = c->Nk;
        for (int b = 0; b < B; b++) pb->kl[b] = b == B - 1 && B > 1 ? c->Nk : 1 + (int)(th_next(&r0) % (uint64_t)c->Nk);
        bk_tensor *views[4] = {&pb->tk, &pb->tv, &pb->tdk, &pb->tdv};
        float *data[4] = {pb->k, pb->v, pb->dk, pb->dv};
        const int C[4] = {c->d, c->dv, c->d, c->dv};
        for (int i = 0; i < 4; i++) { /* layout 0 [B, H, N, C], 1 [B, N, H, C] */
            bk_tensor tv = {data[i], (int64_t)H * c->Nk * C[i], layout ? C[i] : (int64_t)c->Nk * C[i],
                            layout ? (int64_t)H * C[i] : C[i], BK_DEVICE_HOST, BK_F32};
            *views[i] = tv;
        }
        th_fill_tensor(&pb->tk, B, H, c->Nk, c->d, pb->kl, &r0, 1.0);
        th_fill_tensor(&pb->tv, B, H, c->Nk, c->dv, pb->kl, &r0, 1.0);
    }
    th_prob *pb = &x->t.pb;
    if (B * H == 1) {
        pb->ql[0] = c->Lq;
        pb->kl[0] = c->Lk;
        th_rng r = {seed + 1};
        th_fill_tensor(&pb->tq, B, H, c->Nq, c->d, pb->ql, &r, 1.0);
        th_fill_tensor(&pb->tk, B, H, c->Nk, c->d, pb->kl, &r, 1.0);
        th_fill_tensor(&pb->tv, B, H, c->Nk, c->dv, pb->kl, &r, 1.0);
        th_fill_tensor(&pb->tdo, B, H, c->Nq, c->dv, pb->ql, &r, 1.0);
    }
    if (c->slices == 2) { /* random directions from a seed */
        x->t.p.theta = NULL;
        x->t.p.seed = 1234;
    }
    const size_t P = (size_t)B * H, L = (size_t)x->t.L;
    x->D = calloc(P * L, sizeof(float));
    x->dq2 = th_alloc_fill(P * c->Nq * c->d, -7);
    x->dk2 = th_alloc_fill(P * c->Nk * c->d, -7);
    x->dv2 = th_alloc_fill(P * c->Nk * c->dv, -7);
    x->dth2 = calloc(L * c->d, sizeof(float));
    x->tdq2 = pb->tdq; x->tdq2.data = x->dq2;
    x->tdk2 = pb->tdk; x->tdk2.data = x->dk2;
    x->tdv2 = pb->tdv; x->tdv2.data = x->dv2;
}

static void dpe_free(dprob *x)
{
    eb_free(&x->t);
    free(x->D); free(x->dq2); free(x->dk2); free(x->dv2); free(x->dth2);
}

/* forward (O, A, sigma, D, diag) with a tape, the backward from it, and the
 * backward without a tape (its own forward) */
static void dpe_run(void *ctx)
{
    dprob *x = ctx;
    ebuf *t = &x->t;
    th_prob *pb = &t->pb;
    void *tape = malloc(bk_esp_tape_size(&pb->desc, &t->p));
    bk_esp_extras ex = {pb->ta, t->sig, x->D, t->diag};
    if (!x->attn) ex.attn.data = NULL;
    x->s[0] = bk_esp_forward(&pb->desc, &t->p, &pb->tq, &pb->tk, &pb->tv, &pb->to, tape, &ex, NULL, 0);
    x->s[1] = bk_esp_backward(&pb->desc, &t->p, &pb->tq, &pb->tk, &pb->tv, &pb->tdo, tape, &pb->tdq, &pb->tdk,
                              &pb->tdv, t->dth, NULL, 0);
    x->s[2] = bk_esp_backward(&pb->desc, &t->p, &pb->tq, &pb->tk, &pb->tv, &pb->tdo, NULL, &x->tdq2, &x->tdk2,
                              &x->tdv2, x->dth2, NULL, 0);
    free(tape);
}

static int dpe_ok(const dprob *x) { return x->s[0] == BK_OK && x->s[1] == BK_OK && x->s[2] == BK_OK; }

static int dpe_spans(const dprob *x, th_span *sp)
{
    const bk_attn_desc *d = &x->t.pb.desc;
    const size_t P = (size_t)d->B * d->H, Nq = d->Nq, Nk = d->Nk, L = (size_t)x->t.L;
    const th_span s[14] = {
        {x->t.pb.o, 4 * P * Nq * d->dv}, {x->t.pb.a, x->attn ? 4 * P * Nq * Nk : 0}, {x->t.sig, 4 * P * L},
        {x->D, 4 * P * L},               {x->t.diag, sizeof(bk_esp_diag) * P},
        {x->t.pb.dq, 4 * P * Nq * d->d}, {x->t.pb.dk, 4 * P * Nk * d->d}, {x->t.pb.dv, 4 * P * Nk * d->dv},
        {x->t.dth, 4 * L * d->d},        {x->dq2, 4 * P * Nq * d->d},     {x->dk2, 4 * P * Nk * d->d},
        {x->dv2, 4 * P * Nk * d->dv},    {x->dth2, 4 * L * d->d},         {x->s, sizeof x->s}};
    memcpy(sp, s, sizeof s);
    return 14;
}

/* the backward from the tape and the one without agree bitwise */
static int dpe_tape_same(const dprob *x)
{
    const bk_attn_desc *d = &x->t.pb.desc;
    const size_t P = (size_t)d->B * d->H;
    return !memcmp(x->t.pb.dq, x->dq2, 4 * P * d->Nq * d->d) && !memcmp(x->t.pb.dk, x->dk2, 4 * P * d->Nk * d->d) &&
           !memcmp(x->t.pb.dv, x->dv2, 4 * P * d->Nk * d->dv) && !memcmp(x->t.dth, x->dth2, 4 * (size_t)x->t.L * d->d);
}

/* copies x's single problem into problem (b, h) of y (entry b's lengths and
 * the slices too) and zeroes dO of y's other problems, so that y's dtheta is
 * x's (the other problems add exact zeros) */
static void dpe_plant(const dprob *x, dprob *y, int b, int h)
{
    const th_prob *a = &x->t.pb;
    th_prob *z = &y->t.pb;
    const bk_attn_desc *d = &a->desc;
    z->ql[b] = a->ql[0];
    z->kl[b] = a->kl[0];
    memcpy(y->t.theta, x->t.theta, sizeof(float) * (size_t)x->t.L * d->d); /* the same learned slices */
#define DPE_ROWS(T, N, C)                                                                                          \
    for (int n_ = 0; n_ < (N); n_++)                                                                               \
        memcpy(z->T.data + b * z->T.stride_b + h * z->T.stride_h + n_ * z->T.stride_n, a->T.data + n_ * a->T.stride_n, \
               sizeof(float) * (size_t)(C))
    DPE_ROWS(tq, a->ql[0], d->d);
    DPE_ROWS(tk, a->kl[0], d->d);
    DPE_ROWS(tv, a->kl[0], d->dv);
    DPE_ROWS(tdo, a->ql[0], d->dv);
#undef DPE_ROWS
    /* entry b's other heads: rows that the new lengths made valid get values */
    th_rng r = {77};
#define DPE_FILL(T, N, C)                                                                                              for (int n_ = 0; n_ < (N); n_++)                                                                                       for (int c_ = 0; c_ < (C); c_++) {                                                                                     float *e_ = z->T.data + b * z->T.stride_b + hh * z->T.stride_h + n_ * z->T.stride_n + c_;                         if (isnan(*e_)) *e_ = (float)th_normal(&r);                                                                    }
    for (int hh = 0; hh < z->desc.H; hh++) {
        if (hh == h) continue;
        DPE_FILL(tq, a->ql[0], d->d);
        DPE_FILL(tk, a->kl[0], d->d);
        DPE_FILL(tv, a->kl[0], d->dv);
        DPE_FILL(tdo, a->ql[0], d->dv);
    }
#undef DPE_FILL
    for (int bb = 0; bb < z->desc.B; bb++)
        for (int hh = 0; hh < z->desc.H; hh++)
            if (bb != b || hh != h)
                for (int n = 0; n < z->ql[bb]; n++)
                    memset(z->tdo.data + bb * z->tdo.stride_b + hh * z->tdo.stride_h + n * z->tdo.stride_n, 0,
                           sizeof(float) * (size_t)d->dv);
}

/* problem (b, h) of y equals x's single problem, bitwise, in every output */
static int dpe_same_problem(const dprob *x, const dprob *y, int b, int h)
{
    const bk_attn_desc *d = &x->t.pb.desc;
    const th_prob *a = &x->t.pb, *z = &y->t.pb;
    const size_t L = (size_t)x->t.L, py = (size_t)b * y->t.pb.desc.H + h;
    int ok = th_slice_same(&a->to, 0, 0, &z->to, b, h, d->Nq, d->dv) &&
             (!x->attn || th_slice_same(&a->ta, 0, 0, &z->ta, b, h, d->Nq, d->Nk)) &&
             th_slice_same(&a->tdq, 0, 0, &z->tdq, b, h, d->Nq, d->d) &&
             th_slice_same(&a->tdk, 0, 0, &z->tdk, b, h, d->Nk, d->d) &&
             th_slice_same(&a->tdv, 0, 0, &z->tdv, b, h, d->Nk, d->dv) &&
             th_slice_same(&x->tdq2, 0, 0, &y->tdq2, b, h, d->Nq, d->d) &&
             th_slice_same(&x->tdk2, 0, 0, &y->tdk2, b, h, d->Nk, d->d) &&
             th_slice_same(&x->tdv2, 0, 0, &y->tdv2, b, h, d->Nk, d->dv);
    ok = ok && !memcmp(x->t.sig, y->t.sig + py * L, 4 * L) && !memcmp(x->D, y->D + py * L, 4 * L) &&
         !memcmp(&x->t.diag[0], &y->t.diag[py], sizeof(bk_esp_diag));
    ok = ok && !memcmp(x->t.dth, y->t.dth, 4 * L * d->d) && !memcmp(x->dth2, y->dth2, 4 * L * d->d);
    return ok && dpe_ok(x) && dpe_ok(y);
}

/* bki_argsort (sort1d.c: ranks, merges or radix by size) gives the stable
 * ascending order of an independent insertion sort, for every size across
 * its path switches, with ties, both zeros and a wide range, strided */
static void test_argsort_ref(void)
{
    th_rng r = {777};
    int bad = 0, count = 0;
    for (int n = 1; n <= 300; n += n < 140 ? 1 : 53, count++) {
        float *x = malloc(sizeof(float) * 3 * (size_t)n);
        int32_t *ref = malloc(sizeof(int32_t) * (size_t)n), *got = malloc(sizeof(int32_t) * (size_t)n);
        void *scr = malloc(bki_argsort_scratch(n));
        for (int i = 0; i < 3 * n; i++) { /* ties, both zeros, neighbouring floats of both signs, a wide range */
            const uint64_t u = th_next(&r) % 7;
            const float t = (float)((int)(th_next(&r) % 7) - 3) * 0.25f;
            x[i] = u == 0 ? 0.0f : u == 1 ? -0.0f : u == 2 ? (float)(th_next(&r) % 4) : u == 3 ? t
                 : u == 4 ? nextafterf(t, t < 0.0f ? -INFINITY : INFINITY) : (float)th_normal(&r) * (u == 5 ? 1e3f : 1e-3f);
        }
        for (int i = 0; i < n; i++) { /* stable insertion sort of indices by x[3 i] */
            int j = i;
            while (j > 0 && x[3 * ref[j - 1]] > x[3 * i]) {
                ref[j] = ref[j - 1];
                j--;
            }
            ref[j] = i;
        }
        bki_argsort(n, x, 3, got, scr);
        int differs = memcmp(ref, got, sizeof(int32_t) * (size_t)n) != 0;
        float *xc = malloc(sizeof(float) * (size_t)n); /* the same keys contiguous (stride 1) */
        for (int i = 0; i < n; i++) xc[i] = x[3 * i];
        bki_argsort(n, xc, 1, got, scr);
        differs |= memcmp(ref, got, sizeof(int32_t) * (size_t)n) != 0;
        free(xc);
        if (differs) {
            if (!bad) printf("argsort differs from the reference at n = %d\n", n);
            bad++;
        }
        free(x); free(ref); free(got); free(scr);
    }
    th_check(!bad, "bki_argsort == a stable insertion sort (n = 1..140, then to 300; ties, +-0, strides 3 and 1)", "%d of %d sizes differ",
             bad, count);
}

/* the team-parallel argsort (sort1d.c) equals the serial one for any team */


typedef struct {
    int n;
    const float *x;
    int32_t *got;
    void *scr, *cnt;
} argsort_args;

static void argsort_member(void *arg)
{
    const argsort_args *a = arg;
    const bki_team tm = bki_region_team();
    bki_argsort_team(&tm, a->n, a->x, 2, a->got, a->scr, a->cnt);
}

static void test_esp_team_sort(void)
{
    const int sizes[] = {1, 50, 8192, 8193, 20000, 300001};
    th_rng r = {4242};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int n = sizes[si];
        float *x = malloc(sizeof(float) * 2 * (size_t)n);
        int32_t *ref = malloc(sizeof(int32_t) * (size_t)n), *got = malloc(sizeof(int32_t) * (size_t)n);
        void *scr = malloc(bki_argsort_scratch(n)), *cnt = malloc(bki_argsort_team_counts(n));
        for (int i = 0; i < 2 * n; i++) { /* ties, both zeros, a wide range; stride 2 */
            const uint64_t u = th_next(&r) % 7;
            x[i] = u == 0 ? 0.0f : u == 1 ? -0.0f : u == 2 ? (float)(th_next(&r) % 5) : (float)th_normal(&r) * 1e3f;
        }
        bki_argsort(n, x, 2, ref, scr);
        int ok = 1;
        for (int ti = 0; ti < TH_NTHREADS; ti++) {
            const int nt = th_threads[ti];
            memset(got, 0xff, sizeof(int32_t) * (size_t)n);
            argsort_args a = {n, x, got, scr, cnt};
            bki_parallel(nt, argsort_member, &a);
            ok &= !memcmp(ref, got, sizeof(int32_t) * (size_t)n);
        }
        char name[96];
        snprintf(name, sizeof name, "team argsort == serial argsort (n = %d, teams of 1, 2, 3, 5, 8)", n);
        th_check(ok, name, "%s", "orders differ");
        free(x); free(ref); free(got); free(scr); free(cnt);
    }
}

static void test_esp_parallel_determinism(void)
{
    const dcase cases[] = {
        {"hard self sq, learned slices", BK_ESP_HARD, BK_ESP_COST_SQ, 300, 300, 16, 12, 287, 287, 8, 1, 0},
        {"hard cross euclid, random slices", BK_ESP_HARD, BK_ESP_COST_EUCLID, 300, 220, 16, 12, 287, 213, 8, 2, 0},
        {"soft self sq, learned slices", BK_ESP_SOFT, BK_ESP_COST_SQ, 128, 128, 8, 8, 121, 121, 2, 1, 0},
        {"soft cross euclid, axis slices", BK_ESP_SOFT, BK_ESP_COST_EUCLID, 128, 96, 4, 4, 119, 90, 4, 0, 0},
        /* one slice, long: at 3+ threads the team sorts each slice together */
        {"hard cross sq, one long random slice", BK_ESP_HARD, BK_ESP_COST_SQ, 9000, 8300, 4, 4, 8999, 8217, 1, 2, 1},
    };
    char name[200];
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const dcase *c = &cases[ci];
        /* (a) thread counts: one problem (a team at 2+ threads) and a batch of 12 */
        const int shapes[2][2] = {{1, 1}, {3, 4}};
        for (int si = 0; si < 2; si++) {
            dprob x;
            dpe_init(&x, c, shapes[si][0], shapes[si][1], si, 700 + 10 * ci + si);
            if (si == 0) {
                bk_set_num_threads(2);
                const bki_plan pl = bki_esp_plan(&x.t.pb.desc, &x.t.p);
                bk_set_num_threads(0);
                snprintf(name, sizeof name, "ESP %s: one problem runs as a team at 2 threads", c->name);
                th_check(pl.team == 1 && pl.nt == 2, name, "team %d nt %d", pl.team, pl.nt);
            }
            th_span sp[14];
            const int ns = dpe_spans(&x, sp);
            snprintf(name, sizeof name, "ESP %s: bitwise identical at 1, 2, 3, 5, 8 threads (B=%d H=%d)", c->name,
                     shapes[si][0], shapes[si][1]);
            th_same_over_threads(name, dpe_run, &x, sp, ns);
            th_check(dpe_ok(&x), name, "status %s / %s / %s: %s", bk_status_str(x.s[0]), bk_status_str(x.s[1]),
                     bk_status_str(x.s[2]), bk_last_error());
            snprintf(name, sizeof name, "ESP %s: backward from the tape == backward without (B=%d H=%d)", c->name,
                     shapes[si][0], shapes[si][1]);
            th_check(dpe_tape_same(&x), name, "%s", "gradients differ");
            dpe_free(&x);
        }
        /* (b) batch shapes: the problem alone, as one of 3 and as one of 16 */
        dprob x;
        dpe_init(&x, c, 1, 1, 0, 800 + ci);
        dpe_run(&x);
        const int batches[2][5] = {{1, 3, 0, 2, 0}, {4, 4, 2, 1, 1}}; /* B, H, b, h of the planted problem, layout */
        const int nts[3] = {1, 2, 5};
        for (int bi = 0; bi < 2; bi++)
            for (int ti = 0; ti < 3; ti++) {
                dprob y;
                dpe_init(&y, c, batches[bi][0], batches[bi][1], batches[bi][4], 900 + 10 * ci + bi);
                dpe_plant(&x, &y, batches[bi][2], batches[bi][3]);
                bk_set_num_threads(nts[ti]);
                dpe_run(&y);
                bk_set_num_threads(0);
                snprintf(name, sizeof name, "ESP %s: a problem alone == the same problem in a batch of %d (%d threads)",
                         c->name, batches[bi][0] * batches[bi][1], nts[ti]);
                th_check(dpe_same_problem(&x, &y, batches[bi][2], batches[bi][3]), name, "%s",
                         dpe_ok(&y) ? "outputs differ" : bk_last_error());
                dpe_free(&y);
            }
        dpe_free(&x);
    }
}

/* ------------------------------------------------------------------------ */
/* the operator registry (birkhoff/ops.h)                                    */
/* ------------------------------------------------------------------------ */
static void test_esp_registry(void)
{
    const bk_op *op = bk_op_find("esp");
    int ok = op && bk_op_has_backward(op) && bk_op_config_size(op) == sizeof(bk_esp_config) &&
             !strcmp(bk_op_name(op), "esp");
    th_check(ok, "registry: esp found by name, with a backward and bk_esp_config", "%p", (const void *)op);
    if (!ok) return;
    /* the scalar fields by key; enums by name */
    bk_esp_config p;
    bk_op_config_default(op, &p);
    const bk_esp_config def = bk_esp_config_default();
    ok = p.sort == def.sort && p.t == def.t && p.tau == def.tau && p.scale == def.scale && p.cost == def.cost &&
         p.out_scale == def.out_scale && p.L == def.L && p.theta == def.theta && p.seed == def.seed;
    const char *kv[][2] = {{"sort", "soft"}, {"t", "0.25"},        {"tau", "1.5"}, {"scale", "0.5"},
                           {"cost", "euclid"}, {"out_scale", "paper"}, {"L", "3"},     {"seed", "42"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) ok &= bk_op_config_set(op, &p, kv[i][0], kv[i][1]) == BK_OK;
    ok = ok && p.sort == BK_ESP_SOFT && p.t == 0.25f && p.tau == 1.5f && p.scale == 0.5f &&
         p.cost == BK_ESP_COST_EUCLID && p.out_scale == BK_ESP_SCALE_PAPER && p.L == 3 && p.seed == 42 && !p.theta;
    char buf[512];
    ok = ok && bk_op_config_count(op) == 8 && bk_op_config_format(op, &p, buf, sizeof buf) < sizeof buf &&
         strstr(buf, "sort=soft\n") && strstr(buf, "cost=euclid\n") && strstr(buf, "out_scale=paper\n") &&
         strstr(buf, "L=3\n") && strstr(buf, "seed=42\n");
    th_check(ok, "registry: esp parameters set by key (enums by name) and formatted", "%s", bk_last_error());
    const bk_esp_config keep = p;
    bk_status s1 = bk_op_config_set(op, &p, "temperature", "1");
    int bad = s1 == BK_ERR_PARAM && strstr(bk_last_error(), "temperature") != NULL;
    bk_status s2 = bk_op_config_set(op, &p, "sort", "medium");
    bad &= s2 == BK_ERR_PARAM && strstr(bk_last_error(), "medium") != NULL && strstr(bk_last_error(), "sort") != NULL;
    bk_status s3 = bk_op_config_set(op, &p, "tau", "abc");
    bad &= s3 == BK_ERR_PARAM && strstr(bk_last_error(), "tau") != NULL;
    bad &= p.sort == keep.sort && p.tau == keep.tau;
    th_check(bad, "registry: esp refuses an unknown key and a bad value, naming them", "%s", bk_last_error());
    /* the generic entry points == the typed ones, bitwise (padded batch; seeded slices, hard and soft) */
    for (int sort = 0; sort < 2; sort++) {
        ecase c = {2, 2, 9, 7, 4, 3, 1, 1, (bk_esp_sort)sort, 0.25f, 1.5f, (bk_esp_cost)sort, BK_ESP_SCALE_ROWS, 0, 1.0};
        ebuf x, y;
        eb_init(&x, &c, 720 + sort);
        eb_init(&y, &c, 720 + sort);
        bk_esp_config q = keep;
        q.sort = (bk_esp_sort)sort;
        q.out_scale = BK_ESP_SCALE_ROWS;
        x.p = y.p = q;
        const bk_attn_desc *d = &y.pb.desc;
        const size_t tsz = bk_esp_tape_size(d, &q);
        void *tx = malloc(tsz), *ty = malloc(tsz);
        bk_esp_extras ex = {x.pb.ta, NULL, NULL, NULL};
        bk_status st[4];
        st[0] = bk_esp_forward(&x.pb.desc, &q, &x.pb.tq, &x.pb.tk, &x.pb.tv, &x.pb.to, tx, &ex, NULL, 0);
        st[1] = ebwd(&x, tx);
        st[2] = bk_op_forward(op, d, &q, &y.pb.tq, &y.pb.tk, &y.pb.tv, &y.pb.to, ty, &y.pb.ta, NULL, 0);
        st[3] = bk_op_backward(op, d, &q, &y.pb.tq, &y.pb.tk, &y.pb.tv, &y.pb.tdo, ty, &y.pb.tdq, &y.pb.tdk, &y.pb.tdv,
                               NULL, 0);
        const size_t P = 4, nq = P * c.Nq, nk = P * c.Nk;
        int same = st[0] == BK_OK && st[1] == BK_OK && st[2] == BK_OK && st[3] == BK_OK &&
                   !memcmp(x.pb.o, y.pb.o, 4 * nq * c.dv) && !memcmp(x.pb.a, y.pb.a, 4 * nq * c.Nk) &&
                   !memcmp(x.pb.dq, y.pb.dq, 4 * nq * c.d) && !memcmp(x.pb.dk, y.pb.dk, 4 * nk * c.d) &&
                   !memcmp(x.pb.dv, y.pb.dv, 4 * nk * c.dv) && !memcmp(tx, ty, tsz);
        same &= bk_op_tape_size(op, d, &q) == tsz && bk_op_workspace_size(op, d, &q) == bk_esp_workspace_size(d, &q);
        char name[128];
        snprintf(name, sizeof name, "registry: bk_op_forward/backward == bk_esp_forward/backward (%s, bitwise)",
                 sort ? "soft euclid" : "hard sq");
        th_check(same, name, "%s %s %s %s: %s", bk_status_str(st[0]), bk_status_str(st[1]), bk_status_str(st[2]),
                 bk_status_str(st[3]), bk_last_error());
        if (sort == 0) { /* a Sinkhorn tape is refused by the ESP backward, and an ESP tape by Sinkhorn's */
            bk_sinkhorn_config sp = bk_sinkhorn_config_default();
            void *stape = malloc(bk_sinkhorn_tape_size(d, &sp));
            bk_status s0 = bk_sinkhorn_forward(d, &sp, &y.pb.tq, &y.pb.tk, &y.pb.tv, &y.pb.to, stape, NULL, NULL, 0);
            bk_status se = ebwd(&y, stape);
            int refused = s0 == BK_OK && se == BK_ERR_TAPE && strstr(bk_last_error(), "another operator") != NULL;
            bk_status ss = bk_sinkhorn_backward(d, &sp, &y.pb.tq, &y.pb.tk, &y.pb.tv, &y.pb.tdo, ty, &y.pb.tdq,
                                                &y.pb.tdk, &y.pb.tdv, NULL, 0);
            refused &= ss == BK_ERR_TAPE;
            th_check(refused, "esp backward refuses a Sinkhorn tape (and Sinkhorn an ESP tape)", "%s / %s: %s",
                     bk_status_str(se), bk_status_str(ss), bk_last_error());
            free(stape);
        }
        free(tx);
        free(ty);
        eb_free(&x);
        eb_free(&y);
    }
}

void test_esp(void)
{
    test_esp_grid();
    test_esp_doubly_stochastic();
    test_esp_tau_limits();
    test_esp_identity_and_tau0_grad();
    test_esp_permutation();
    test_esp_soft_to_hard();
    test_esp_padding_determinism();
    test_argsort_ref();
    test_esp_team_sort();
    test_esp_parallel_determinism();
    test_esp_fd();
    test_esp_large_hard();
    test_esp_bad_input();
    test_esp_registry();
}
