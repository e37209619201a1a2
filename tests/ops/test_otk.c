/* test_otk.c -- the OTK embedding: against the independent double reference
 * (tests/ops/ref_otk.c), finite differences for x, z and W, the digest's
 * properties (section 8), determinism, padding, the unsupervised fits, and
 * bad input. */
#include "birkhoff.h"
#include "../harness.h"
#include "ref_otk.h"
#include "../tutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, n, d, q, p, k, pad, anchors, L;
    float eps;
    bk_otk_domain domain;
    bk_otk_convention conv;
    bk_otk_pe pe;
    int pe_double;
    bk_otk_isqrt_grad isq;
    float eta;
} ocase;

typedef struct {
    ocase c;
    bk_otk_desc desc;
    bk_otk_config p;
    int32_t *len;
    int64_t ldx;             /* row stride of x (>= d: exercises strides)   */
    float *x, *z, *W, *o, *dout, *dx, *dz, *dW, *plan;
    bk_tensor tx, to, tdo, tdx;
} obuf;

static void ob_init(obuf *t, const ocase *c, uint64_t seed)
{
    memset(t, 0, sizeof *t);
    t->c = *c;
    th_rng r = {seed};
    t->ldx = c->d + 3;
    if (c->pad) {
        t->len = malloc(sizeof(int32_t) * (size_t)c->B);
        for (int b = 0; b < c->B; b++) t->len[b] = b == c->B - 1 ? c->n : 1 + (int32_t)(th_next(&r) % (uint64_t)c->n);
    }
    bk_otk_desc d = {c->B, c->n, c->d, c->q, c->p, c->k, t->len};
    t->desc = d;
    t->x = malloc(sizeof(float) * (size_t)c->B * c->n * t->ldx);
    for (int b = 0; b < c->B; b++)
        for (int i = 0; i < c->n; i++)
            for (int e = 0; e < t->ldx; e++)
                t->x[((size_t)b * c->n + i) * t->ldx + e] =
                    (i < (t->len ? t->len[b] : c->n) && e < c->d) ? (float)(0.6 * th_normal(&r)) : NAN;
    const size_t nz = (size_t)c->q * c->p * c->k;
    t->z = malloc(sizeof(float) * nz);
    for (size_t i = 0; i < nz; i++) t->z[i] = (float)(0.6 * th_normal(&r));
    if (c->anchors) {
        t->W = malloc(sizeof(float) * (size_t)c->k * c->d);
        for (int l = 0; l < c->k; l++) {
            double s = 0;
            for (int e = 0; e < c->d; e++) s += pow(t->W[(size_t)l * c->d + e] = (float)th_normal(&r), 2);
            for (int e = 0; e < c->d; e++) t->W[(size_t)l * c->d + e] = (float)(t->W[(size_t)l * c->d + e] / sqrt(s));
        }
        t->dW = calloc((size_t)c->k * c->d, sizeof(float));
    }
    const size_t no = (size_t)c->B * c->p * c->q * c->k;
    t->o = th_alloc_fill(no, -7.0f);
    t->dout = malloc(sizeof(float) * no);
    for (size_t i = 0; i < no; i++) t->dout[i] = (float)th_normal(&r);
    t->dx = th_alloc_fill((size_t)c->B * c->n * c->d, -7.0f);
    t->dz = th_alloc_fill(nz, -7.0f);
    t->plan = th_alloc_fill((size_t)c->B * c->q * c->n * c->p, -7.0f);
    bk_tensor tx = {t->x, (int64_t)c->n * t->ldx, 0, t->ldx, BK_DEVICE_HOST, BK_F32};
    t->tx = tx;
    t->to = bk_tensor_bhnd(t->o, 1, c->p, c->q * c->k);
    t->tdo = bk_tensor_bhnd(t->dout, 1, c->p, c->q * c->k);
    t->tdx = bk_tensor_bhnd(t->dx, 1, c->n, c->d);
    t->p = bk_otk_config_default();
    t->p.W = t->W;
    t->p.sigma = 0.8f;
    t->p.eta = c->eta;
    t->p.eps = c->eps;
    t->p.iters = 2 * c->L; /* the case's L iterations, in half-steps */
    t->p.domain = c->domain;
    t->p.convention = c->conv;
    t->p.pe = c->pe;
    t->p.sigma_pos = 0.4f;
    t->p.pe_double = c->pe_double;
    t->p.isqrt_grad = c->isq;
    if (c->pe == BK_OTK_PE_2D) {
        t->p.grid_h = 2;
        t->p.grid_w = c->n / 2;
    }
}

static void ob_free(obuf *t)
{
    free(t->len); free(t->x); free(t->z); free(t->W); free(t->o); free(t->dout); free(t->dx); free(t->dz);
    free(t->dW); free(t->plan);
}

static bk_status ofwd(obuf *t, void *tape)
{
    bk_otk_extras ex = {t->plan, NULL};
    return bk_otk_forward(&t->desc, &t->p, &t->tx, t->z, &t->to, tape, &ex, NULL, 0);
}
static bk_status obwd(obuf *t, const void *tape)
{
    return bk_otk_backward(&t->desc, &t->p, &t->tx, t->z, &t->tdo, tape, &t->tdx, t->dz, t->W ? t->dW : NULL, NULL, 0);
}

static double maxdiff(const float *a, const float *b, size_t n)
{
    double e = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d;
    }
    return e;
}

static double maxabs(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

/* ---- against the double reference --------------------------------------------- */
static void check_ref(const ocase *c, uint64_t seed)
{
    obuf t;
    ob_init(&t, c, seed);
    void *tape = malloc(bk_otk_tape_size(&t.desc, &t.p));
    bk_status s1 = ofwd(&t, tape), s2 = s1 ? s1 : obwd(&t, tape);
    char name[240];
    snprintf(name, sizeof name, "OTK vs reference B=%d n=%d d=%d q=%d p=%d k=%d pad=%d nys=%d L=%d eps=%g dom=%d conv=%d pe=%d%s isq=%d eta=%g",
             c->B, c->n, c->d, c->q, c->p, c->k, c->pad, c->anchors, c->L, (double)c->eps, (int)c->domain, (int)c->conv,
             (int)c->pe, c->pe_double ? "x2" : "", (int)c->isq, (double)c->eta);
    if (!th_check(s1 == BK_OK && s2 == BK_OK, name, "status %d/%d: %s", s1, s2, bk_last_error())) goto out;
    {
        const int B = c->B, n = c->n, d = c->d;
        double *xd = malloc(sizeof(double) * (size_t)B * n * d), *zd = malloc(sizeof(double) * (size_t)c->q * c->p * c->k);
        double *Wd = c->anchors ? malloc(sizeof(double) * (size_t)c->k * d) : NULL;
        const size_t no = (size_t)B * c->p * c->q * c->k, nz = (size_t)c->q * c->p * c->k;
        double *o = malloc(sizeof(double) * no), *pl = malloc(sizeof(double) * (size_t)B * c->q * n * c->p);
        double *dx = malloc(sizeof(double) * (size_t)B * n * d), *dz = malloc(sizeof(double) * nz);
        double *dW = c->anchors ? malloc(sizeof(double) * (size_t)c->k * d) : NULL, *dO = malloc(sizeof(double) * no);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < n; i++)
                for (int e = 0; e < d; e++) xd[((size_t)b * n + i) * d + e] = t.x[((size_t)b * n + i) * t.ldx + e];
        for (size_t i = 0; i < nz; i++) zd[i] = t.z[i];
        for (size_t i = 0; Wd && i < (size_t)c->k * d; i++) Wd[i] = t.W[i];
        for (size_t i = 0; i < no; i++) dO[i] = t.dout[i];
        ref_otk_cfg cfg = {n, d, c->q, c->p, c->k, Wd, t.p.sigma, t.p.eta, t.p.eps, c->L, (int)c->conv, (int)c->pe,
                           t.p.sigma_pos, c->pe_double, t.p.grid_h, t.p.grid_w, n, (int)c->isq};
        int *len = th_lens_int(t.len, B);
        ref_otk_forward_batched(&cfg, B, len, xd, zd, o, pl);
        ref_otk_backward_batched(&cfg, B, len, xd, zd, dO, dx, dz, dW);
        const double eo = th_max_rel(t.o, o, no, 1e-3), ep = th_max_rel(t.plan, pl, (size_t)B * c->q * n * c->p, 1e-3);
        const double ex = th_max_rel(t.dx, dx, (size_t)B * n * d, 1e-3), ez = th_max_rel(t.dz, dz, nz, 1e-3);
        const double ew = dW ? th_max_rel(t.dW, dW, (size_t)c->k * d, 1e-3) : 0.0;
        /* float32 vs double: the plan's error grows with L and 1/eps */
        const double tf = 2e-5 * (1 + 0.1 * c->L), tg = 2e-4 * (1 + 0.1 * c->L);
        th_check(eo <= tf && ep <= tf && ex <= tg && ez <= tg && ew <= tg, name,
                 "out %.2e plan %.2e dx %.2e dz %.2e dW %.2e", eo, ep, ex, ez, ew);
        free(len); free(xd); free(zd); free(Wd); free(o); free(pl); free(dx); free(dz); free(dW); free(dO);
    }
out:
    free(tape);
    ob_free(&t);
}

static void test_otk_grid(void)
{
    const ocase base = {3, 9, 5, 2, 4, 6, 1, 1, 3, 0.5f, BK_OTK_LOG, BK_OTK_PAPER, BK_OTK_PE_NONE, 0, BK_OTK_ISQRT_EXACT, 1e-2f};
    uint64_t seed = 100;
    for (int dom = 0; dom < 2; dom++)
        for (int conv = 0; conv < 2; conv++)
            for (int nys = 0; nys < 2; nys++) {
                ocase c = base;
                c.domain = (bk_otk_domain)dom;
                c.conv = (bk_otk_convention)conv;
                c.anchors = nys;
                if (!nys) c.k = c.d;
                check_ref(&c, seed++);
            }
    const int Ls[3] = {1, 2, 10};
    const float epss[3] = {0.2f, 1.0f, 3.0f};
    for (int a = 0; a < 3; a++)
        for (int e = 0; e < 3; e++) {
            if (TH.quick && a != e) continue;
            ocase c = base;
            c.L = Ls[a];
            c.eps = epss[e];
            check_ref(&c, seed++);
        }
    ocase c = base;
    c.q = 1; c.p = 1;
    check_ref(&c, seed++);                        /* one support            */
    c = base; c.n = 1; c.pad = 0;
    check_ref(&c, seed++);                        /* one element            */
    c = base; c.pe = BK_OTK_PE_1D;
    check_ref(&c, seed++);
    c.pe_double = 1;
    check_ref(&c, seed++);
    c.conv = BK_OTK_REFERENCE; c.domain = BK_OTK_SCALING;
    check_ref(&c, seed++);
    c = base; c.pe = BK_OTK_PE_2D; c.pad = 0; c.n = 8; c.p = 4; c.pe_double = 1;
    check_ref(&c, seed++);
    c = base; c.isq = BK_OTK_ISQRT_REFERENCE;
    check_ref(&c, seed++);
    c = base; c.eta = 0.0f; c.k = 4; c.d = 6;
    check_ref(&c, seed++);
    c = base; c.B = 2; c.n = 40; c.d = 16; c.k = 24; c.p = 9; c.q = 3;
    check_ref(&c, seed++);                        /* larger, SIMD tails      */
}

/* ---- finite differences -------------------------------------------------------- */
static double otk_loss(void *ctx)
{
    obuf *t = ctx;
    ofwd(t, NULL);
    double s = 0;
    for (size_t i = 0; i < (size_t)t->c.B * t->c.p * t->c.q * t->c.k; i++) s += (double)t->o[i] * t->dout[i];
    return s;
}

static void test_otk_fd(void)
{
    ocase cs[3] = {{1, 6, 4, 2, 3, 5, 0, 1, 3, 0.5f, BK_OTK_LOG, BK_OTK_PAPER, BK_OTK_PE_NONE, 0, BK_OTK_ISQRT_EXACT, 1e-2f},
                   {1, 6, 4, 2, 3, 5, 0, 1, 4, 0.7f, BK_OTK_SCALING, BK_OTK_REFERENCE, BK_OTK_PE_1D, 1, BK_OTK_ISQRT_EXACT, 1e-2f},
                   {1, 7, 4, 1, 3, 4, 0, 0, 2, 0.5f, BK_OTK_LOG, BK_OTK_PAPER, BK_OTK_PE_1D, 0, BK_OTK_ISQRT_EXACT, 0.0f}};
    th_rng r = {77};
    for (int ci = 0; ci < 3; ci++) {
        obuf t;
        ob_init(&t, &cs[ci], 300 + ci);
        ofwd(&t, NULL);
        obwd(&t, NULL);
        /* x is strided: perturb one row's d entries at a time through a dense copy is not needed: use row 2 */
        char name[80];
        snprintf(name, sizeof name, "OTK directional FD dx (case %d)", ci);
        th_directional_fd(name, t.x + 2 * t.ldx, t.dx + 2 * cs[ci].d, cs[ci].d, 1e-3f, &r, otk_loss, &t);
        snprintf(name, sizeof name, "OTK directional FD dz (case %d)", ci);
        th_directional_fd(name, t.z, t.dz, cs[ci].q * cs[ci].p * cs[ci].k, 1e-3f, &r, otk_loss, &t);
        if (t.W) {
            snprintf(name, sizeof name, "OTK directional FD dW (case %d)", ci);
            th_directional_fd(name, t.W, t.dW, cs[ci].k * cs[ci].d, 1e-3f, &r, otk_loss, &t);
        }
        ob_free(&t);
    }
}

/* ---- properties ------------------------------------------------------------------ */
static const ocase PROP = {2, 8, 5, 2, 4, 6, 0, 1, 5, 0.5f, BK_OTK_LOG, BK_OTK_PAPER, BK_OTK_PE_NONE, 0, BK_OTK_ISQRT_EXACT, 1e-2f};

static void test_otk_properties(void)
{
    /* permutation invariance over set elements (no PE), broken by PE */
    for (int pe = 0; pe < 2; pe++) {
        obuf t;
        ocase c = PROP;
        c.pe = pe ? BK_OTK_PE_1D : BK_OTK_PE_NONE;
        ob_init(&t, &c, 11);
        ofwd(&t, NULL);
        const size_t no = (size_t)c.B * c.p * c.q * c.k;
        float *o0 = malloc(sizeof(float) * no);
        memcpy(o0, t.o, sizeof(float) * no);
        for (int b = 0; b < c.B; b++) /* reverse each set */
            for (int i = 0; i < c.n / 2; i++)
                for (int e = 0; e < c.d; e++) {
                    float *a = t.x + ((size_t)b * c.n + i) * t.ldx + e, *z = t.x + ((size_t)b * c.n + c.n - 1 - i) * t.ldx + e;
                    float tmp = *a; *a = *z; *z = tmp;
                }
        ofwd(&t, NULL);
        const double e = maxdiff(o0, t.o, no) / maxabs(o0, no);
        if (!pe) th_check(e < 1e-5, "OTK embedding invariant to permutations of the set", "rel diff %.2e", e);
        else th_check(e > 1e-3, "OTK positional encoding breaks permutation invariance", "rel diff %.2e", e);
        free(o0);
        ob_free(&t);
    }
    /* marginals: columns exact (c/p per column of the weights), rows -> c/n as L grows */
    {
        double prev = 1e9;
        int mono = 1;
        double colerr = 0;
        for (int L = 1; L <= 64; L *= 4) {
            obuf t;
            ocase c = PROP;
            c.L = L;
            ob_init(&t, &c, 12);
            bk_otk_diag dg[4];
            bk_otk_extras ex = {t.plan, dg};
            bk_otk_forward(&t.desc, &t.p, &t.tx, t.z, &t.to, NULL, &ex, NULL, 0);
            double re = 0;
            const double cc = sqrt((double)c.p / c.q);
            for (int bh = 0; bh < c.B * c.q; bh++) {
                re = fmax(re, dg[bh].row_err);
                colerr = fmax(colerr, dg[bh].col_err);
                for (int j = 0; j < c.p; j++) {
                    double s = 0;
                    for (int i = 0; i < c.n; i++) s += t.plan[((size_t)bh * c.n + i) * c.p + j];
                    colerr = fmax(colerr, fabs(s * c.p / cc - 1.0));
                }
            }
            if (re > prev * 1.0001 && re > 1e-6) mono = 0;
            prev = re;
            ob_free(&t);
        }
        th_check(colerr < 2e-6, "OTK plan columns exact after the final column step", "max err %.2e", colerr);
        th_check(mono && prev < 1e-5, "OTK row marginal error decreases with L to 0", "final %.2e", prev);
    }
    /* eps -> infinity: every bucket is (c/p) * mean of psi */
    {
        obuf t;
        ocase c = PROP;
        c.eps = 1e6f;
        c.anchors = 0; c.k = c.d;
        ob_init(&t, &c, 13);
        ofwd(&t, NULL);
        double e = 0;
        const double cc = sqrt((double)c.p / c.q);
        for (int b = 0; b < c.B; b++)
            for (int e2 = 0; e2 < c.d; e2++) {
                double m = 0;
                for (int i = 0; i < c.n; i++) m += t.x[((size_t)b * c.n + i) * t.ldx + e2];
                m /= c.n;
                for (int j = 0; j < c.p; j++)
                    for (int h = 0; h < c.q; h++)
                        e = fmax(e, fabs(t.o[(((size_t)b * c.p + j) * c.q + h) * c.k + e2] - cc / c.p * m));
            }
        th_check(e < 1e-5, "OTK eps -> infinity gives mean pooling", "max err %.2e", e);
        ob_free(&t);
    }
    /* plan invariant to f_i + g_j shifts of the cost (identity map with two
     * extra coordinates: x_i gets (f_i, 1), z_j gets (1, g_j)); the row
     * shift is absorbed by the first row step at any L, the column shift only
     * at convergence (the iteration starts from g = 0) */
    for (int cshift = 0; cshift < 2; cshift++) {
        obuf t0, t1;
        ocase c = PROP;
        c.anchors = 0; c.d = 6; c.k = 6;
        c.L = cshift ? 400 : 3;
        ob_init(&t0, &c, 14);
        ob_init(&t1, &c, 14);
        th_rng r = {15};
        for (int b = 0; b < c.B; b++)
            for (int i = 0; i < c.n; i++) {
                t0.x[((size_t)b * c.n + i) * t0.ldx + 4] = t0.x[((size_t)b * c.n + i) * t0.ldx + 5] = 0.0f;
                t1.x[((size_t)b * c.n + i) * t1.ldx + 4] = (float)th_normal(&r);
                t1.x[((size_t)b * c.n + i) * t1.ldx + 5] = 1.0f;
            }
        for (int h = 0; h < c.q; h++)
            for (int j = 0; j < c.p; j++) {
                memcpy(t1.z + ((size_t)h * c.p + j) * c.k, t0.z + ((size_t)h * c.p + j) * c.k, sizeof(float) * 4);
                t1.z[((size_t)h * c.p + j) * c.k + 4] = 1.0f;
                t1.z[((size_t)h * c.p + j) * c.k + 5] = cshift ? (float)th_normal(&r) : 0.0f;
            }
        ofwd(&t0, NULL);
        ofwd(&t1, NULL);
        const size_t np = (size_t)c.B * c.q * c.n * c.p;
        const double e = maxdiff(t0.plan, t1.plan, np) / maxabs(t0.plan, np);
        th_check(e < 1e-5, cshift ? "OTK plan invariant to f_i + g_j cost shifts at convergence (L = 400)"
                                  : "OTK plan invariant to f_i cost shifts at any L (L = 3)", "rel diff %.2e", e);
        ob_free(&t0);
        ob_free(&t1);
    }
    /* Nystrom with eta = 0 reproduces the kernel on the anchors */
    {
        const int k = 4, d = 6;
        float W[24], x[24], psi[24];
        th_rng r = {16};
        for (int l = 0; l < k; l++) {
            double s = 0;
            for (int e = 0; e < d; e++) s += pow(W[l * d + e] = (float)th_normal(&r), 2);
            const double sc = 0.5 + l;                     /* x = r_l w_l */
            for (int e = 0; e < d; e++) {
                W[l * d + e] = (float)(W[l * d + e] / sqrt(s));
                x[l * d + e] = (float)(sc * W[l * d + e]);
            }
        }
        bk_otk_desc desc = {1, k, d, 1, 1, k, NULL};
        bk_otk_config p = bk_otk_config_default();
        p.W = W; p.sigma = 1.0f; p.eta = 0.0f;
        bk_tensor tx = bk_tensor_bhnd(x, 1, k, d), tp = bk_tensor_bhnd(psi, 1, k, k);
        bk_status s = bk_otk_features(&desc, &p, &tx, &tp);
        double e = 0, normok = 1;
        for (int a = 0; a < k; a++)
            for (int b = 0; b < k; b++) {
                double ip = 0, wx = 0;
                for (int l = 0; l < k; l++) ip += (double)psi[a * k + l] * psi[b * k + l];
                for (int c2 = 0; c2 < d; c2++) wx += (double)W[a * d + c2] * W[b * d + c2];
                const double kern = (0.5 + a) * (0.5 + b) * exp(wx - 1.0);
                e = fmax(e, fabs(ip - kern) / kern);
                if (a == b && sqrt(ip) > (0.5 + a) * (1 + 1e-5)) normok = 0;
            }
        th_check(s == BK_OK && e < 1e-4 && normok, "OTK Nystrom (eta = 0) reproduces the kernel on the anchors",
                 "max rel err %.2e, |psi| <= |x| %d", e, (int)normok);
    }
    /* conventions: reference output = sqrt(p q) x paper output; domains agree */
    {
        obuf a, b;
        ocase c = PROP;
        ob_init(&a, &c, 17);
        c.conv = BK_OTK_REFERENCE;
        c.domain = BK_OTK_SCALING;
        ob_init(&b, &c, 17);
        ofwd(&a, NULL);
        ofwd(&b, NULL);
        const size_t no = (size_t)c.B * c.p * c.q * c.k;
        double e = 0;
        for (size_t i = 0; i < no; i++) e = fmax(e, fabs(b.o[i] - sqrt((double)c.p * c.q) * a.o[i]));
        e /= maxabs(b.o, no);
        th_check(e < 1e-5, "OTK reference convention = sqrt(pq) x paper (scaling vs log domain)", "rel err %.2e", e);
        ob_free(&a);
        ob_free(&b);
    }
    /* the reference's isqrt gradient equals the exact one at eta = 0 only */
    for (int z0 = 0; z0 < 2; z0++) {
        obuf a, b;
        ocase c = PROP;
        c.eta = z0 ? 0.0f : 1e-2f;
        c.k = 4;
        ob_init(&a, &c, 18);
        c.isq = BK_OTK_ISQRT_REFERENCE;
        ob_init(&b, &c, 18);
        ofwd(&a, NULL); obwd(&a, NULL);
        ofwd(&b, NULL); obwd(&b, NULL);
        const size_t nw = (size_t)c.k * c.d;
        const double e = maxdiff(a.dW, b.dW, nw) / maxabs(a.dW, nw);
        if (z0) th_check(e < 1e-4, "OTK isqrt gradient: reference formula exact at eta = 0", "rel diff %.2e", e);
        else th_check(e > 1e-4, "OTK isqrt gradient: reference formula differs at eta > 0", "rel diff %.2e", e);
        ob_free(&a);
        ob_free(&b);
    }
}

/* padding == truncation, thread-count determinism, tape == no tape */
static void test_otk_determinism(void)
{
    for (int dom = 0; dom < 2; dom++) {
        ocase c = PROP;
        c.pad = 1;
        c.B = 4;
        c.domain = (bk_otk_domain)dom;
        c.pe = BK_OTK_PE_1D;
        obuf t;
        ob_init(&t, &c, 21);
        void *tape = malloc(bk_otk_tape_size(&t.desc, &t.p));
        ofwd(&t, tape);
        obwd(&t, tape);
        const size_t no = (size_t)c.B * c.p * c.q * c.k, nx = (size_t)c.B * c.n * c.d, nz = (size_t)c.q * c.p * c.k;
        float *o0 = malloc(sizeof(float) * no), *x0 = malloc(sizeof(float) * nx), *z0 = malloc(sizeof(float) * nz);
        float *w0 = malloc(sizeof(float) * (size_t)c.k * c.d);
        memcpy(o0, t.o, sizeof(float) * no); memcpy(x0, t.dx, sizeof(float) * nx);
        memcpy(z0, t.dz, sizeof(float) * nz); memcpy(w0, t.dW, sizeof(float) * (size_t)c.k * c.d);
        int same = 1;
        for (int nt = 1; nt <= 3; nt++) {
            bk_set_num_threads(nt);
            ofwd(&t, NULL);
            obwd(&t, NULL);          /* no tape: recomputes the forward */
            same &= !memcmp(o0, t.o, sizeof(float) * no) && !memcmp(x0, t.dx, sizeof(float) * nx) &&
                    !memcmp(z0, t.dz, sizeof(float) * nz) && !memcmp(w0, t.dW, sizeof(float) * (size_t)c.k * c.d);
        }
        bk_set_num_threads(0);
        th_check(same, dom ? "OTK bitwise identical for 1..3 threads, tape or not (scaling)"
                           : "OTK bitwise identical for 1..3 threads, tape or not (log)", "%s", "");
        /* each padded set equals the same set alone, unpadded (paper PE uses the valid length) */
        int eq = 1;
        for (int b = 0; b < c.B; b++) {
            const int nb = t.len[b];
            bk_otk_desc d1 = {1, nb, c.d, c.q, c.p, c.k, NULL};
            bk_tensor tx1 = {t.x + (size_t)b * c.n * t.ldx, 0, 0, t.ldx, BK_DEVICE_HOST, BK_F32};
            float *o1 = malloc(sizeof(float) * (size_t)c.p * c.q * c.k), *dx1 = malloc(sizeof(float) * (size_t)nb * c.d);
            float *dz1 = malloc(sizeof(float) * nz);
            bk_tensor to1 = bk_tensor_bhnd(o1, 1, c.p, c.q * c.k), tdx1 = bk_tensor_bhnd(dx1, 1, nb, c.d);
            bk_tensor tdo1 = bk_tensor_bhnd(t.dout + (size_t)b * c.p * c.q * c.k, 1, c.p, c.q * c.k);
            bk_status s = bk_otk_forward(&d1, &t.p, &tx1, t.z, &to1, NULL, NULL, NULL, 0);
            s = s ? s : bk_otk_backward(&d1, &t.p, &tx1, t.z, &tdo1, NULL, &tdx1, dz1, NULL, NULL, 0);
            eq &= s == BK_OK && !memcmp(o1, o0 + (size_t)b * c.p * c.q * c.k, sizeof(float) * (size_t)c.p * c.q * c.k) &&
                  !memcmp(dx1, x0 + (size_t)b * c.n * c.d, sizeof(float) * (size_t)nb * c.d);
            for (int i = nb * c.d; i < c.n * c.d; i++) eq &= x0[(size_t)b * c.n * c.d + i] == 0.0f;
            free(o1); free(dx1); free(dz1);
        }
        th_check(eq, dom ? "OTK padding == truncation, bitwise (scaling)" : "OTK padding == truncation, bitwise (log)", "%s", "");
        /* the tape's Nystrom section (G's eigendecomposition and M) is taken
         * only for the W it was made from: with other anchors the backward
         * decomposes their G itself, so a stale tape section changes nothing
         * (bitwise the backward from a copy whose section is wiped) */
        const size_t tb = bk_otk_tape_size(&t.desc, &t.p), kd = (size_t)c.k * c.d;
        ofwd(&t, tape);
        for (size_t i = 0; i < kd; i++) t.W[i] *= 0.875f; /* other anchors (not renormalised: any W is allowed) */
        void *wiped = malloc(tb);
        memcpy(wiped, tape, tb);
        const size_t hdr_and_hist = tb - (2 * ((size_t)c.k * c.k * 8 + 63) / 64 * 64 + ((size_t)c.k * 8 + 63) / 64 * 64 +
                                          ((size_t)c.k * c.k * 4 + 63) / 64 * 64 + 64);
        memset((char *)wiped + hdr_and_hist, 0, tb - hdr_and_hist);
        obwd(&t, tape);
        memcpy(x0, t.dx, sizeof(float) * nx); memcpy(z0, t.dz, sizeof(float) * nz); memcpy(w0, t.dW, sizeof(float) * kd);
        obwd(&t, wiped);
        const int stale_ok = !memcmp(x0, t.dx, sizeof(float) * nx) && !memcmp(z0, t.dz, sizeof(float) * nz) &&
                             !memcmp(w0, t.dW, sizeof(float) * kd);
        /* and with the forward's own W the section is what it recomputes */
        for (size_t i = 0; i < kd; i++) t.W[i] /= 0.875f;
        ofwd(&t, tape);
        obwd(&t, tape);
        memcpy(x0, t.dx, sizeof(float) * nx); memcpy(w0, t.dW, sizeof(float) * kd);
        memcpy(wiped, tape, tb);
        memset((char *)wiped + hdr_and_hist, 0, tb - hdr_and_hist);
        obwd(&t, wiped);
        const int own_ok = !memcmp(x0, t.dx, sizeof(float) * nx) && !memcmp(w0, t.dW, sizeof(float) * kd);
        th_check(stale_ok && own_ok, "OTK tape: the Nystrom section is used only for its own anchors",
                 "other W: %s; same W: %s", stale_ok ? "recomputed" : "STALE SECTION USED",
                 own_ok ? "same bits as recomputing" : "DIFFERENT");
        free(wiped);
        free(o0); free(x0); free(z0); free(w0); free(tape);
        ob_free(&t);
    }
}

/* ---- the determinism contract (docs/ARCHITECTURE.md): thread counts and
 * batch shapes. The forward (output, plans, diagnostics, tape), the features
 * and the backward from the tape (dx, dz, dW) must be bitwise the same at
 * 1, 2, 3, 5 and 8 threads; a set must give bitwise the same output, plans,
 * diagnostics, features and dx alone, as one of 3 and as one of 16 (dz and
 * dW are batch sums: threads only). ---- */
typedef struct {
    obuf t;
    float *psi;
    bk_otk_diag *diag;
    void *tape;
    size_t tape_bytes;
    bk_status s[3];
} odet;

/* B sets (as c), length L0 for set e and random lengths for the others; NaN
 * in the padding */
static void od_init(odet *x, const ocase *c, int e, int L0, uint64_t seed)
{
    ocase u = *c;
    u.pad = 1;
    ob_init(&x->t, &u, seed);
    obuf *t = &x->t;
    th_rng r = {seed ^ 0x77ull};
    for (int b = 0; b < c->B; b++) t->len[b] = b == e ? L0 : 1 + (int32_t)(th_next(&r) % (uint64_t)c->n);
    for (int b = 0; b < c->B; b++)
        for (int i = 0; i < c->n; i++)
            for (int j = 0; j < c->d; j++)
                t->x[((size_t)b * c->n + i) * t->ldx + j] = i < t->len[b] ? (float)(0.6 * th_normal(&r)) : NAN;
    x->psi = th_alloc_fill((size_t)c->B * c->n * c->k, -7.0f);
    x->diag = calloc((size_t)c->B * c->q, sizeof(bk_otk_diag));
    x->tape_bytes = bk_otk_tape_size(&t->desc, &t->p);
    x->tape = calloc(1, x->tape_bytes); /* bytes a run does not write stay 0 */
}

static void od_free(odet *x)
{
    free(x->psi); free(x->diag); free(x->tape);
    ob_free(&x->t);
}

static void od_run(void *ctx)
{
    odet *x = ctx;
    obuf *t = &x->t;
    bk_otk_extras ex = {t->plan, x->diag};
    bk_tensor tp = bk_tensor_bhnd(x->psi, 1, t->c.n, t->c.k);
    x->s[0] = bk_otk_forward(&t->desc, &t->p, &t->tx, t->z, &t->to, x->tape, &ex, NULL, 0);
    x->s[1] = x->s[0] ? x->s[0] : obwd(t, x->tape);
    x->s[2] = bk_otk_features(&t->desc, &t->p, &t->tx, &tp);
}

static int od_spans(const odet *x, th_span *sp)
{
    const ocase *c = &x->t.c;
    const size_t B = (size_t)c->B;
    const th_span s[10] = {{x->t.o, 4 * B * c->p * c->q * c->k}, {x->t.plan, 4 * B * c->q * c->n * c->p},
                           {x->diag, sizeof(bk_otk_diag) * B * c->q}, {x->tape, x->tape_bytes},
                           {x->psi, 4 * B * c->n * c->k}, {x->t.dx, 4 * B * c->n * c->d},
                           {x->t.dz, 4 * (size_t)c->q * c->p * c->k}, {x->s, sizeof x->s},
                           {x->t.dW, 4 * (size_t)c->k * c->d}};
    memcpy(sp, s, sizeof s);
    return x->t.W ? 9 : 8; /* dW only with anchors */
}

/* plants set 0 of x (elements, output gradient; the same z and W) as set b of
 * y (whose set b has the same length) */
static void od_plant(const odet *x, odet *y, int b)
{
    const ocase *c = &x->t.c;
    memcpy(y->t.x + (size_t)b * c->n * y->t.ldx, x->t.x, sizeof(float) * (size_t)c->n * x->t.ldx);
    memcpy(y->t.dout + (size_t)b * c->p * c->q * c->k, x->t.dout, sizeof(float) * (size_t)c->p * c->q * c->k);
    memcpy(y->t.z, x->t.z, sizeof(float) * (size_t)c->q * c->p * c->k);
    if (x->t.W) memcpy(y->t.W, x->t.W, sizeof(float) * (size_t)c->k * c->d);
}

/* set b of y equals set 0 of x in every per-set output */
static int od_same(const odet *x, const odet *y, int b)
{
    const ocase *c = &x->t.c;
    const size_t no = (size_t)c->p * c->q * c->k, np = (size_t)c->q * c->n * c->p;
    return x->s[0] == BK_OK && x->s[1] == BK_OK && x->s[2] == BK_OK && y->s[0] == BK_OK && y->s[1] == BK_OK &&
           y->s[2] == BK_OK && !memcmp(x->t.o, y->t.o + b * no, 4 * no) && !memcmp(x->t.plan, y->t.plan + b * np, 4 * np) &&
           !memcmp(x->diag, y->diag + (size_t)b * c->q, sizeof(bk_otk_diag) * c->q) &&
           !memcmp(x->psi, y->psi + (size_t)b * c->n * c->k, 4 * (size_t)c->n * c->k) &&
           !memcmp(x->t.dx, y->t.dx + (size_t)b * c->n * c->d, 4 * (size_t)c->n * c->d);
}

/* A one-set call runs as a team at 2+ threads: its workspace then holds the
 * engine's row buffers of every member (one thread per set would not) */
static int otk_runs_as_team(const odet *x)
{
    bk_set_num_threads(1);
    const size_t w1 = bk_otk_workspace_size(&x->t.desc, &x->t.p);
    int team = 1;
    for (int i = 1; i < TH_NTHREADS; i++) {
        bk_set_num_threads(th_threads[i]);
        team &= bk_otk_workspace_size(&x->t.desc, &x->t.p) > w1;
    }
    bk_set_num_threads(0);
    return team;
}

typedef struct {
    odet x;
    float Z[2 * 8 * 16];
    bk_kmeans_report rep;
    bk_status s;
} ofit;

static void of_run(void *ctx)
{
    ofit *f = ctx;
    bk_kmeans_config kp = bk_kmeans_config_default();
    kp.iters = 3;
    kp.seed = 9;
    f->s = bk_otk_fit_refs(&f->x.t.desc, &f->x.t.p, &f->x.t.tx, &kp, 2, f->Z, &f->rep);
}

static void test_otk_contract(void)
{
    /* one set large enough to run as a team: 400 x (p + k) */
    const int n = 400, L0 = 389;
    const ocase cases[3] = {
        {1, n, 20, 2, 40, 48, 1, 1, 5, 0.5f, BK_OTK_LOG, BK_OTK_PAPER, BK_OTK_PE_1D, 0, BK_OTK_ISQRT_EXACT, 1e-2f},
        {1, n, 20, 2, 40, 48, 1, 1, 5, 0.5f, BK_OTK_SCALING, BK_OTK_REFERENCE, BK_OTK_PE_NONE, 0, BK_OTK_ISQRT_EXACT, 1e-2f},
        {1, n, 48, 1, 40, 48, 1, 0, 4, 0.5f, BK_OTK_LOG, BK_OTK_PAPER, BK_OTK_PE_1D, 1, BK_OTK_ISQRT_EXACT, 1e-2f}};
    const char *names[3] = {"OTK log, Nystrom, PE", "OTK scaling, Nystrom, reference convention",
                            "OTK log, identity map, PE x2"};
    for (int ci = 0; ci < 3; ci++) {
        char name[200];
        th_span sp[10];
        /* (a) thread counts: one set (a team) and a batch of 7 */
        for (int si = 0; si < 2; si++) {
            ocase c = cases[ci];
            c.B = si ? 7 : 1;
            odet x;
            od_init(&x, &c, 0, L0, 500 + ci);
            if (si == 0)
                th_check(otk_runs_as_team(&x), "OTK: one set of 389 elements (p 40, k 48) runs as a team", "%s",
                         "its workspace does not grow with the thread count");
            snprintf(name, sizeof name, "%s: forward (out, plans, diag, tape), features and backward (dx, dz, dW) "
                     "bitwise identical at 1, 2, 3, 5, 8 threads (B=%d)", names[ci], c.B);
            th_same_over_threads(name, od_run, &x, sp, od_spans(&x, sp));
            th_check(x.s[0] == BK_OK && x.s[1] == BK_OK && x.s[2] == BK_OK, name, "status %d %d %d: %s", x.s[0],
                     x.s[1], x.s[2], bk_last_error());
            od_free(&x);
        }
        /* (b) batch shapes: the set alone, as one of 3 and as one of 16 */
        odet x;
        od_init(&x, &cases[ci], 0, L0, 510 + ci);
        od_run(&x);
        const int batches[2][2] = {{3, 1}, {16, 9}}; /* B, set of the planted one */
        for (int bi = 0; bi < 2; bi++)
            for (int nt = 1; nt <= 3; nt++) {
                ocase cb = cases[ci];
                cb.B = batches[bi][0];
                odet y;
                od_init(&y, &cb, batches[bi][1], L0, 520 + ci);
                od_plant(&x, &y, batches[bi][1]);
                bk_set_num_threads(nt);
                od_run(&y);
                bk_set_num_threads(0);
                snprintf(name, sizeof name, "%s: a set alone == the same set in a batch of %d (%d threads)", names[ci],
                         cb.B, nt);
                th_check(od_same(&x, &y, batches[bi][1]), name, "outputs differ (%s)", bk_last_error());
                od_free(&y);
            }
        od_free(&x);
    }
    /* the fits: Wasserstein K-means (transport statistics; few large sets run
     * as a team) with barycentric steps */
    ofit f;
    memset(&f, 0, sizeof f);
    ocase c = {3, 1400, 16, 2, 8, 16, 1, 0, 3, 0.2f, BK_OTK_LOG, BK_OTK_PAPER, BK_OTK_PE_NONE, 0, BK_OTK_ISQRT_EXACT, 0.0f};
    od_init(&f.x, &c, 0, 1400, 530);
    th_span fs[3] = {{f.Z, sizeof f.Z}, {&f.rep, sizeof f.rep}, {&f.s, sizeof f.s}};
    th_same_over_threads("OTK fit-refs (q = 2, 3 sets of up to 1400): references bitwise identical at 1, 2, 3, 5, 8 "
                         "threads", of_run, &f, fs, 3);
    th_check(f.s == BK_OK, "OTK fit-refs on large sets", "%s", bk_last_error());
    od_free(&f.x);
}

/* ---- unsupervised fits ----------------------------------------------------------- */
static void test_otk_kmeans(void)
{
    /* three tight clusters of directions in R^5 */
    const int N = 300, dim = 5, K = 3;
    float *x = malloc(sizeof(float) * N * dim), C[15], C2[15], C3[15];
    const float ctr[3][5] = {{1, 0, 0, 0, 0}, {0, 0, 1, 0, 0}, {0, 0, 0, 0.6f, 0.8f}};
    th_rng r = {31};
    for (int i = 0; i < N; i++)
        for (int e = 0; e < dim; e++) x[i * dim + e] = (float)((1.0 + 2.0 * (i % 7)) * (ctr[i % 3][e] + 0.05 * th_normal(&r)));
    bk_kmeans_config kp = bk_kmeans_config_default();
    kp.seed = 5;
    bk_kmeans_report rep;
    bk_status s = bk_spherical_kmeans(x, N, dim, K, &kp, C, &rep);
    int found = 0;
    for (int a = 0; a < 3; a++)
        for (int j = 0; j < K; j++) {
            double cs = 0;
            for (int e = 0; e < dim; e++) cs += (double)C[j * dim + e] * ctr[a][e];
            if (cs > 0.99) { found++; break; }
        }
    th_check(s == BK_OK && found == 3 && rep.converged && rep.objective > 0.99, "spherical K-means recovers three clusters",
             "found %d, iters %d, objective %.4f", found, rep.iters, rep.objective);
    bk_set_num_threads(1);
    bk_spherical_kmeans(x, N, dim, K, &kp, C2, NULL);
    bk_set_num_threads(3);
    bk_spherical_kmeans(x, N, dim, K, &kp, C3, NULL);
    bk_set_num_threads(0);
    th_check(!memcmp(C, C2, sizeof C) && !memcmp(C, C3, sizeof C), "spherical K-means reproducible for a seed, any thread count", "%s", "");
    th_check(bk_spherical_kmeans(x, 2, dim, K, &kp, C, NULL) == BK_ERR_PARAM, "K-means with K > N refused", "%s", bk_last_error());
    x[7] = NAN;
    th_check(bk_spherical_kmeans(x, N, dim, K, &kp, C, NULL) == BK_ERR_NONFINITE, "K-means NaN refused", "%s", bk_last_error());
    free(x);

    /* anchors and references on sets of two kinds */
    const int B = 12, n = 10, d = 4, p = 2;
    float *xs = malloc(sizeof(float) * B * n * d);
    int32_t len[12];
    for (int b = 0; b < B; b++) {
        len[b] = 6 + b % 5;
        for (int i = 0; i < n; i++)
            for (int e = 0; e < d; e++) {
                const int kind = b % 2, sup = i % 2; /* kind 0 near e0/e1, kind 1 near e2/e3 */
                xs[(b * n + i) * d + e] = (float)((e == 2 * kind + sup) + 0.05 * th_normal(&r));
            }
    }
    bk_tensor tx = bk_tensor_bhnd(xs, 1, n, d);
    bk_otk_desc dd = {B, n, d, 2, p, 3, len};
    float W[12], Z[2 * 2 * 4];
    s = bk_otk_fit_anchors(&dd, &tx, &kp, W, &rep);
    double un = 0;
    for (int l = 0; l < 3; l++) {
        double nn = 0;
        for (int e = 0; e < d; e++) nn += (double)W[l * d + e] * W[l * d + e];
        un = fmax(un, fabs(nn - 1));
    }
    th_check(s == BK_OK && un < 1e-5, "fit-anchors: unit anchors", "status %d, max |norm^2 - 1| %.2e", s, un);
    bk_otk_desc dr = {B, n, d, 2, p, d, len};
    bk_otk_config op = bk_otk_config_default();
    op.eps = 0.1f;
    s = bk_otk_fit_refs(&dr, &op, &tx, &kp, 2, Z, &rep);
    /* each reference should hold the two directions of one kind */
    int ok = s == BK_OK;
    for (int h = 0; h < 2 && ok; h++) {
        int kind = -1;
        for (int j = 0; j < p; j++) {
            int arg = 0;
            for (int e = 1; e < d; e++)
                if (Z[(h * p + j) * d + e] > Z[(h * p + j) * d + arg]) arg = e;
            if (Z[(h * p + j) * d + arg] < 0.95f) ok = 0;
            if (kind < 0) kind = arg / 2;
            else if (kind != arg / 2) ok = 0;
        }
    }
    th_check(ok, "fit-refs (q = 2): Wasserstein K-means separates the two kinds of sets", "status %d, iters %d, obj %.4f",
             s, rep.iters, rep.objective);
    float Z2[16];
    bk_set_num_threads(1);
    bk_otk_fit_refs(&dr, &op, &tx, &kp, 2, Z2, NULL);
    bk_set_num_threads(0);
    th_check(!memcmp(Z, Z2, sizeof Z), "fit-refs reproducible for a seed, any thread count", "%s", "");
    bk_otk_desc dq1 = {B, n, d, 1, 4, d, len};
    s = bk_otk_fit_refs(&dq1, &op, &tx, &kp, 0, Z, &rep);
    th_check(s == BK_OK && rep.objective > 0.95, "fit-refs (q = 1): spherical K-means of the features", "obj %.4f", rep.objective);
    bk_otk_desc dbig = {B, n, d, 1, 1, 200, len};
    th_check(bk_otk_fit_anchors(&dbig, &tx, &kp, W, NULL) == BK_ERR_PARAM, "fit-anchors: k > samples refused", "%s",
             bk_last_error());
    bk_otk_desc dmany = {B, n, d, 13, 2, d, len};
    float *Zm = malloc(sizeof(float) * 13 * 2 * d);
    th_check(bk_otk_fit_refs(&dmany, &op, &tx, &kp, 0, Zm, NULL) == BK_ERR_PARAM, "fit-refs: q > number of sets refused",
             "%s", bk_last_error());
    free(Zm);
    free(xs);
}

/* ---- bad input ---------------------------------------------------------------------- */
/* finite inputs whose results overflow float32 (issue 41): the plan's
 * logits <psi_i, z_j> / eps beyond 3.4e38 (z ~ 1e10, eps = 1e-30) in the
 * forward, dout ~ 3e38 in the backward: BK_ERR_OVERFLOW, never BK_OK with
 * NaN or Inf */
static void test_otk_overflow(void)
{
    obuf t;
    ob_init(&t, &PROP, 43);
    const bk_otk_config p0 = t.p;
    const size_t nz = (size_t)PROP.q * PROP.p * PROP.k, no = (size_t)PROP.B * PROP.p * PROP.q * PROP.k;
    for (size_t i = 0; i < nz; i++) t.z[i] *= 1e10f;
    t.p.eps = 1e-30f;
    bk_status s = ofwd(&t, NULL);
    th_check(s == BK_ERR_OVERFLOW && strstr(bk_last_error(), "output") && strstr(bk_last_error(), "overflow"),
             "OTK forward whose logits overflow float32 fails", "%s: %s", bk_status_str(s), bk_last_error());
    for (size_t i = 0; i < nz; i++) t.z[i] *= 1e-10f;
    t.p = p0;
    for (size_t i = 0; i < no; i++) t.dout[i] = 3e38f;
    s = ofwd(&t, NULL);
    if (th_check(s == BK_OK, "OTK overflow: a finite forward", "%s", bk_last_error())) {
        s = obwd(&t, NULL);
        th_check(s == BK_ERR_OVERFLOW && strstr(bk_last_error(), "gradient") && strstr(bk_last_error(), "overflow"),
                 "OTK backward whose gradients overflow float32 fails", "%s: %s", bk_status_str(s), bk_last_error());
    }
    ob_free(&t);
}

static void test_otk_bad_input(void)
{
    obuf t;
    ob_init(&t, &PROP, 41);
    bk_otk_config p0 = t.p;
    struct { const char *name; bk_status want; } cs[] = {
        {"sigma <= 0", BK_ERR_PARAM}, {"eps <= 0", BK_ERR_PARAM}, {"L < 1", BK_ERR_PARAM}, {"eta < 0", BK_ERR_PARAM},
        {"sigma_pos <= 0", BK_ERR_PARAM}, {"2-D PE with p not square", BK_ERR_SHAPE}, {"2-D PE grid != n", BK_ERR_SHAPE},
        {"NaN anchor", BK_ERR_NONFINITE}, {"unknown domain", BK_ERR_PARAM},
        {"odd iters (half-steps of whole iterations)", BK_ERR_PARAM},
    };
    for (int i = 0; i < (int)(sizeof cs / sizeof cs[0]); i++) {
        t.p = p0;
        switch (i) {
        case 0: t.p.sigma = 0; break;
        case 1: t.p.eps = -1; break;
        case 2: t.p.iters = 0; break;
        case 3: t.p.eta = -0.1f; break;
        case 4: t.p.pe = BK_OTK_PE_1D; t.p.sigma_pos = 0; break;
        case 5: t.p.pe = BK_OTK_PE_2D; t.p.grid_h = 2; t.p.grid_w = 4; t.desc.p = 3; break;
        case 6: t.p.pe = BK_OTK_PE_2D; t.p.grid_h = 3; t.p.grid_w = 3; break;
        case 7: t.W[3] = NAN; break;
        case 8: t.p.domain = (bk_otk_domain)7; break;
        case 9: t.p.iters = 7; break;
        }
        bk_status s = ofwd(&t, NULL);
        th_check(s == cs[i].want, cs[i].name, "status %d: %s", s, bk_last_error());
        t.desc.p = PROP.p;
        if (i == 7) t.W[3] = 0.1f;
    }
    t.p = p0;
    int32_t len[2] = {0, 8};
    t.desc.len = len;
    th_check(ofwd(&t, NULL) == BK_ERR_LENGTH, "OTK empty set refused", "%s", bk_last_error());
    len[0] = 9;
    th_check(ofwd(&t, NULL) == BK_ERR_LENGTH, "OTK length > n refused", "%s", bk_last_error());
    t.desc.len = NULL;
    t.desc.p = 0;
    th_check(ofwd(&t, NULL) == BK_ERR_SHAPE, "OTK p < 1 refused", "%s", bk_last_error());
    t.desc.p = PROP.p;
    t.p.W = NULL;
    th_check(ofwd(&t, NULL) == BK_ERR_SHAPE, "OTK identity map with k != d refused", "%s", bk_last_error());
    {
        bk_otk_desc di = t.desc;
        di.k = di.d;
        bk_tensor tdo = bk_tensor_bhnd(t.dout, 1, di.p, di.q * di.k);
        th_check(bk_otk_backward(&di, &t.p, &t.tx, t.z, &tdo, NULL, &t.tdx, t.dz, t.dW, NULL, 0) == BK_ERR_PARAM,
                 "OTK dW without anchors refused", "%s", bk_last_error());
    }
    t.p = p0;
    t.x[3] = NAN;
    th_check(ofwd(&t, NULL) == BK_ERR_NONFINITE, "OTK NaN in a valid element refused", "%s", bk_last_error());
    t.x[3] = 0.5f;
    t.z[2] = INFINITY;
    th_check(ofwd(&t, NULL) == BK_ERR_NONFINITE, "OTK Inf in the references refused", "%s", bk_last_error());
    t.z[2] = 0.5f;
    bk_tensor alias = {t.x, (int64_t)PROP.p * PROP.q * PROP.k, 0, PROP.q * PROP.k, BK_DEVICE_HOST, BK_F32};
    th_check(bk_otk_forward(&t.desc, &t.p, &t.tx, t.z, &alias, NULL, NULL, NULL, 0) == BK_ERR_STRIDE,
             "OTK output overlapping the input refused", "%s", bk_last_error());
    const size_t need = bk_otk_workspace_size(&t.desc, &t.p);
    char *ws = malloc(need);
    th_check(bk_otk_forward(&t.desc, &t.p, &t.tx, t.z, &t.to, NULL, NULL, ws, 64) == BK_ERR_WORKSPACE,
             "OTK small workspace refused", "%s", bk_last_error());
    th_check(bk_otk_forward(&t.desc, &t.p, &t.tx, t.z, &t.to, NULL, NULL, ws, need) == BK_OK, "OTK caller workspace works", "%s",
             bk_last_error());
    free(ws);
    void *tape = malloc(bk_otk_tape_size(&t.desc, &t.p));
    ofwd(&t, tape);
    t.p.eps = 0.7f;
    th_check(obwd(&t, tape) == BK_ERR_TAPE, "OTK tape from other parameters refused", "%s", bk_last_error());
    t.p = p0;
    memset(tape, 0, 16);
    th_check(obwd(&t, tape) == BK_ERR_TAPE, "OTK corrupt tape refused", "%s", bk_last_error());
    free(tape);
    /* scaling domain at a tiny eps underflows: a clear error, not NaN */
    t.p.domain = BK_OTK_SCALING;
    t.p.eps = 1e-3f;
    for (size_t i = 0; i < (size_t)PROP.q * PROP.p * PROP.k; i++) t.z[i] *= 20.0f;
    bk_status s = ofwd(&t, NULL);
    th_check(s == BK_ERR_NUMERIC, "OTK scaling-domain underflow reported", "status %d: %s", s, bk_last_error());
    t.p.domain = BK_OTK_LOG;
    s = ofwd(&t, NULL);
    int fin = 1;
    for (size_t i = 0; i < (size_t)PROP.B * PROP.p * PROP.q * PROP.k; i++) fin &= isfinite(t.o[i]);
    th_check(s == BK_OK && fin, "OTK log domain at eps = 1e-3 is finite", "status %d", s);
    ob_free(&t);
    test_otk_overflow();
}

void test_otk(void)
{
    test_otk_grid();
    test_otk_fd();
    test_otk_properties();
    test_otk_determinism();
    test_otk_contract();
    test_otk_kmeans();
    test_otk_bad_input();
}
