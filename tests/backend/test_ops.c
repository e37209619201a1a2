/* test_ops.c -- THE cross-backend operator harness.
 *
 * Every operator in the registry (src/ops/registry.c), on every backend this
 * build has, through the framework's generic call (the path every typed entry
 * point takes), forward and every gradient (inputs, and the parameters an
 * operator learns), against the independent double-precision references of
 * tests/ops, on a padded multi-head batch in both tensor layouts. Inputs and
 * outputs live in the backend's memory (its alloc/copy), so a device backend
 * is tested by the same code. A backend that lacks an operator must refuse
 * it with BK_ERR_UNSUPPORTED and write nothing.
 *
 * A new operator is tested here by adding one row to OPS (how its parameters
 * are filled, and its reference); a registered operator without a row fails.
 * A new backend is tested by adding it to the list of backends below (it is
 * skipped, loudly, in builds without it). Tolerances are those of the
 * accuracy contract (birkhoff/core.h): 1e-5 forward, 1e-4 gradients,
 * relative to max(1, max |reference|). */
#include "../../src/backend/backend.h"
#include "../../src/ops/op.h"
#include "birkhoff.h"
#include "../harness.h"
#include "../tutil.h"
#include "devbuf.h"
#include "../ops/ref_asap.h"
#include "../ops/ref_attn.h"
#include "../ops/ref_diff.h"
#include "../ops/ref_esp.h"
#include "../ops/ref_linear.h"
#include "../ops/ref_lot.h"
#include "../ops/ref_nystrom.h"
#include "../ops/ref_unbalanced.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B_ = 2, H_ = 2, NQ = 13, NK = 11, D_ = 6, DV = 5, NSL = 3, NPIV = 3 };

/* the parameters' arrays (host) and what the reference needs */
typedef struct {
    float Z[H_ * NPIV * D_], th[H_ * NPIV];      /* LOT pivots and mass logits */
    float slices[NSL * D_];                      /* ESP slice bank             */
    float lam[H_];                               /* differential attention     */
    bk_asap_layer ly;                            /* ASAP layer                 */
    float pg[H_ * NPIV * D_ + H_ * NPIV];        /* parameter gradients (lib)  */
    bki_lot_grads lg;
    int npg;                                     /* floats in pg               */
} op_state;

/* the reference's inputs: contiguous [B][H][N][C] doubles, lengths */
typedef struct {
    const int *ql, *kl;
    const double *Q, *K, *V, *dO;
} ref_in;
typedef struct {
    double *A, *O, *dQ, *dK, *dV, *dP; /* dP: the parameter gradients (npg) */
} ref_out;

typedef struct {
    const char *name;
    /* the registry's defaults, then these keys and arrays */
    const char *keys;
    void (*setup)(void *par, op_state *s, th_rng *r);
    void (*reference)(const void *par, const op_state *s, const ref_in *in, ref_out *out, int backward);
} op_row;

static double scale_of(float s) { return s != 0.0f ? (double)s : (double)(1.0f / sqrtf((float)D_)); }

/* ---- softmax, Sinkhorn, unbalanced: the matrix-form references ---------- */
static void softmax_ref(const void *par, const op_state *s, const ref_in *in, ref_out *o, int bw)
{
    (void)s;
    const double a = scale_of(((const bk_softmax_config *)par)->scale);
    ref_attn_forward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, a, 1, o->A, o->O);
    if (bw)
        ref_attn_backward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, a, 1, in->dO, o->dQ,
                                  o->dK, o->dV);
}

static void sinkhorn_ref(const void *par, const op_state *s, const ref_in *in, ref_out *o, int bw)
{
    (void)s;
    const bk_sinkhorn_config *p = par;
    const double a = (double)(float)(scale_of(p->scale) / p->eps);
    ref_attn_forward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, a, p->iters, o->A, o->O);
    if (bw)
        ref_attn_backward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, a, p->iters, in->dO,
                                  o->dQ, o->dK, o->dV);
}

static void unbalanced_ref(const void *par, const op_state *s, const ref_in *in, ref_out *o, int bw)
{
    (void)s;
    const bk_unbalanced_config *p = par;
    const double a = scale_of(p->scale) / p->eps, kappa = (double)p->rho / ((double)p->rho + p->eps);
    ref_unb_forward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, a, p->iters, kappa, o->A,
                            o->O);
    if (bw)
        ref_unb_backward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, a, p->iters, kappa,
                                 in->dO, o->dQ, o->dK, o->dV);
}

/* ---- ESP: soft sort on a given slice bank, dTheta learned --------------- */
static void esp_setup(void *par, op_state *s, th_rng *r)
{
    bk_esp_config *p = par;
    for (int i = 0; i < NSL * D_; i++) s->slices[i] = (float)th_normal(r);
    p->L = NSL;
    p->theta = s->slices;
    s->npg = NSL * D_;
}

static void esp_ref(const void *par, const op_state *s, const ref_in *in, ref_out *o, int bw)
{
    const bk_esp_config *p = par;
    double th[NSL * D_];
    for (int i = 0; i < NSL * D_; i++) th[i] = s->slices[i];
    const ref_esp_cfg c = {p->sort == BK_ESP_SOFT, p->t, p->tau, scale_of(p->scale), p->cost == BK_ESP_COST_EUCLID,
                           p->out_scale == BK_ESP_SCALE_PAPER, NSL, th};
    ref_esp_forward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, &c, o->A, o->O, NULL);
    if (bw)
        ref_esp_backward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, &c, in->dO, o->dQ, o->dK,
                                 o->dV, o->dP);
}

/* ---- LOT: learned pivots and masses ------------------------------------- */
static void lot_setup(void *par, op_state *s, th_rng *r)
{
    bk_lot_config *p = par;
    for (int i = 0; i < H_ * NPIV * D_; i++) s->Z[i] = (float)th_normal(r);
    for (int i = 0; i < H_ * NPIV; i++) s->th[i] = (float)(0.5 * th_normal(r));
    p->r = NPIV;
    p->Z = s->Z;
    p->theta = s->th;
    s->npg = H_ * NPIV * D_ + H_ * NPIV;
    s->lg = (bki_lot_grads){s->pg, s->pg + H_ * NPIV * D_};
}

static void lot_ref(const void *par, const op_state *s, const ref_in *in, ref_out *o, int bw)
{
    const bk_lot_config *p = par;
    double Z[H_ * NPIV * D_], th[H_ * NPIV];
    for (int i = 0; i < H_ * NPIV * D_; i++) Z[i] = s->Z[i];
    for (int i = 0; i < H_ * NPIV; i++) th[i] = s->th[i];
    ref_lot_forward_batched(B_, H_, NQ, NK, D_, DV, NPIV, in->ql, in->kl, in->Q, in->K, in->V, Z, th, p->temp,
                            p->iters, p->eps, scale_of(p->scale), o->A, o->O);
    if (bw)
        ref_lot_backward_batched(B_, H_, NQ, NK, D_, DV, NPIV, in->ql, in->kl, in->Q, in->K, in->V, Z, th, p->temp,
                                 p->iters, p->eps, scale_of(p->scale), in->dO, o->dQ, o->dK, o->dV, o->dP,
                                 o->dP + H_ * NPIV * D_);
}

/* ---- ASAP: a random compiled layer (unit slices, omega), forward only ---- */
static void asap_setup(void *par, op_state *s, th_rng *r)
{
    bk_asap_forward_config *p = par;
    bk_asap_layer *ly = &s->ly;
    memset(ly, 0, sizeof *ly);
    ly->d = D_;
    ly->slices = NSL;
    ly->scale = 1.0f / sqrtf((float)D_);
    ly->eps = 1.0f;
    ly->teacher_iters = 4; /* even: AUTO ends on a column step */
    ly->lambda = 1e-3;
    ly->theta = s->slices;
    ly->omega = malloc(sizeof(double) * NSL);
    for (int l = 0; l < NSL; l++) {
        double n = 0;
        for (int x = 0; x < D_; x++) {
            const double g = th_normal(r);
            s->slices[l * D_ + x] = (float)g;
            n += g * g;
        }
        for (int x = 0; x < D_; x++) s->slices[l * D_ + x] = (float)(s->slices[l * D_ + x] / sqrt(n));
        ly->omega[l] = th_normal(r);
    }
    p->layer = ly;
}

static void asap_ref(const void *par, const op_state *s, const ref_in *in, ref_out *o, int bw)
{
    (void)bw;
    const bk_asap_forward_config *p = par;
    const bk_asap_layer *ly = p->layer;
    const int variant = p->variant != BK_ASAP_AUTO ? (int)p->variant
                        : ly->teacher_iters % 2 == 0 ? (int)BK_ASAP_COLUMN
                                                     : (int)BK_ASAP_ROW;
    double th[NSL * D_];
    for (int i = 0; i < NSL * D_; i++) th[i] = s->slices[i];
    memset(o->A, 0, sizeof(double) * B_ * H_ * NQ * NK);
    memset(o->O, 0, sizeof(double) * B_ * H_ * NQ * DV);
    for (int b = 0; b < B_; b++)
        for (int h = 0; h < H_; h++) {
            const int n = in->ql ? in->ql[b] : NQ, m = in->kl ? in->kl[b] : NK;
            const size_t pq = (size_t)b * H_ + h;
            double X[NQ * NSL], f[NQ], A[NQ * NK], O[NQ * DV];
            const double *Q = in->Q + pq * NQ * D_, *K = in->K + pq * NK * D_, *V = in->V + pq * NK * DV;
            ref_asap_features(n, m, D_, Q, K, ly->scale, NSL, th, 0, X);
            for (int i = 0; i < n; i++) {
                f[i] = 0;
                for (int l = 0; l < NSL; l++) f[i] += X[i * NSL + l] * ly->omega[l];
            }
            ref_asap_apply(n, m, D_, DV, Q, K, V, ly->scale, ly->eps, f, variant, A, O, NULL, NULL, NULL);
            for (int i = 0; i < n; i++) {
                for (int j = 0; j < m; j++) o->A[(pq * NQ + i) * NK + j] = A[i * m + j];
                for (int e = 0; e < DV; e++) o->O[(pq * NQ + i) * DV + e] = O[i * DV + e];
            }
        }
}

/* ---- differential attention: lambda per head, dlambda learned ---------- */
static void diff_setup(void *par, op_state *s, th_rng *r)
{
    bk_diff_config *p = par;
    for (int h = 0; h < H_; h++) s->lam[h] = (float)(0.8 * th_normal(r));
    p->lambda = s->lam;
    s->npg = H_;
}

static void diff_ref(const void *par, const op_state *s, const ref_in *in, ref_out *o, int bw)
{
    const bk_diff_config *p = par;
    const double a = p->scale != 0.0f ? (double)p->scale : (double)(1.0f / sqrtf((float)(D_ / 2)));
    double lam[H_];
    for (int h = 0; h < H_; h++) lam[h] = s->lam[h];
    ref_diff_forward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, a, lam, o->A, o->O);
    if (bw)
        ref_diff_backward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, a, lam, in->dO, o->dQ,
                                  o->dK, o->dV, o->dP);
}

/* ---- kernelised attention: the explicit kernel form ---------------------- */
static void linear_ref(const void *par, const op_state *s, const ref_in *in, ref_out *o, int bw)
{
    (void)s;
    const ref_linear_cfg g = {0, ((const bk_linear_config *)par)->eps, 0, NULL, 0.0};
    ref_linear_forward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, &g, o->A, o->O);
    if (bw)
        ref_linear_backward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, &g, in->dO, o->dQ,
                                    o->dK, o->dV);
}

/* FAVOR+ with the projection the operator draws (bk_performer_projection) */
static void performer_ref(const void *par, const op_state *s, const ref_in *in, ref_out *o, int bw)
{
    (void)s;
    const bk_performer_config *p = par;
    float *w = malloc(sizeof(float) * (size_t)p->features * D_);
    double *W = malloc(sizeof(double) * (size_t)p->features * D_);
    bk_performer_projection(p, D_, w);
    for (int i = 0; i < p->features * D_; i++) W[i] = w[i];
    const ref_linear_cfg g = {1, p->eps, p->features, W, (double)sqrtf((float)scale_of(p->scale))};
    ref_linear_forward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, &g, o->A, o->O);
    if (bw)
        ref_linear_backward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, &g, in->dO, o->dQ,
                                    o->dK, o->dV);
    free(w);
    free(W);
}

/* ---- Nystrom attention: landmarks, pseudo-inverse iterations ------------ */
static void nystrom_ref(const void *par, const op_state *s, const ref_in *in, ref_out *o, int bw)
{
    (void)s;
    const bk_nystrom_config *p = par;
    const double a = scale_of(p->scale);
    ref_nystrom_forward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, p->landmarks, p->iters, a,
                                o->A, o->O);
    if (bw)
        ref_nystrom_backward_batched(B_, H_, NQ, NK, D_, DV, in->ql, in->kl, in->Q, in->K, in->V, p->landmarks,
                                     p->iters, a, in->dO, o->dQ, o->dK, o->dV);
}

static const op_row OPS[] = {
    {"softmax", "", NULL, softmax_ref},
    {"sinkhorn", "iters=5 eps=0.7", NULL, sinkhorn_ref},
    {"unbalanced", "iters=5 eps=0.7 rho=2", NULL, unbalanced_ref},
    {"esp", "sort=soft t=0.2 tau=1", esp_setup, esp_ref},
    {"lot", "iters=5 eps=1 temp=1", lot_setup, lot_ref},
    {"asap", "", asap_setup, asap_ref},
    {"diff", "", diff_setup, diff_ref},
    {"linear", "", NULL, linear_ref},
    {"performer", "features=10 seed=7", NULL, performer_ref},
    {"nystrom", "landmarks=4 iters=6", NULL, nystrom_ref},
};
#define NOPS_ROWS ((int)(sizeof OPS / sizeof OPS[0]))

/* every operator on one backend, one layout */
static void run_backend(bk_context *ctx, int layout)
{
    const bki_backend *be = bki_ctx_backend(ctx);
    const char *bname = bk_context_backend_name(ctx);
    for (int i = 0; i < NOPS_ROWS; i++) {
        const op_row *row = &OPS[i];
        const bk_op *pub = bk_op_find(row->name);
        const bki_op *op = bki_op_find(row->name);
        char name[160];
        snprintf(name, sizeof name, "harness %s on %s (%s)", row->name, bname, layout ? "bnhd" : "bhnd");
        if (!th_check(pub && op, name, "not in the registry")) continue;
        th_rng r = {0xA5u + (uint64_t)i * 31 + (uint64_t)layout};
        th_prob pb;
        th_prob_init(&pb, B_, H_, NQ, NK, D_, DV, layout, 1, 0.8, &r);
        op_state st;
        memset(&st, 0, sizeof st);
        _Alignas(16) unsigned char par[512];
        if (!th_check(op->par_size <= sizeof par, name, "parameter struct of %zu bytes", op->par_size)) continue;
        bk_op_config_default(pub, par);
        if (row->setup) row->setup(par, &st, &r);
        char keys[128];
        snprintf(keys, sizeof keys, "%s", row->keys);
        for (char *kv = strtok(keys, " "); kv; kv = strtok(NULL, " ")) {
            char *eq = strchr(kv, '=');
            *eq = 0;
            th_check(bk_op_config_set(pub, par, kv, eq + 1) == BK_OK, name, "key %s: %s", kv, bk_last_error());
        }
        const size_t nq = (size_t)B_ * H_ * NQ, nk = (size_t)B_ * H_ * NK;
        th_dbuf q = {0}, k = {0}, v = {0}, o = {0}, a = {0}, dout = {0}, dq = {0}, dk = {0}, dv = {0};
        int ok = th_dev_up(ctx, &q, pb.q, nq * D_, BK_F32) && th_dev_up(ctx, &k, pb.k, nk * D_, BK_F32) && th_dev_up(ctx, &v, pb.v, nk * DV, BK_F32) &&
                 th_dev_up(ctx, &o, pb.o, nq * DV, BK_F32) && th_dev_up(ctx, &a, pb.a, nq * NK, BK_F32) &&
                 th_dev_up(ctx, &dout, pb.dout, nq * DV, BK_F32) && th_dev_up(ctx, &dq, pb.dq, nq * D_, BK_F32) &&
                 th_dev_up(ctx, &dk, pb.dk, nk * D_, BK_F32) && th_dev_up(ctx, &dv, pb.dv, nk * DV, BK_F32);
        th_check(ok, name, "buffers in the backend's memory");
        const bk_tensor tq = th_dev_view(&pb.tq, &q), tk = th_dev_view(&pb.tk, &k), tv = th_dev_view(&pb.tv, &v), to = th_dev_view(&pb.to, &o),
                        ta = th_dev_view(&pb.ta, &a), tdo = th_dev_view(&pb.tdo, &dout), tdq = th_dev_view(&pb.tdq, &dq), tdk = th_dev_view(&pb.tdk, &dk),
                        tdv = th_dev_view(&pb.tdv, &dv);
        const int bw = op->backward != NULL;
        bki_call c;
        memset(&c, 0, sizeof c);
        c.op = op;
        c.d = &pb.desc;
        c.par = par;
        c.q = &tq; c.k = &tk; c.v = &tv; c.out = &to; c.attn = &ta;
        void *tape = NULL;
        if (bw) {
            const size_t tb = bki_op_tape_size_query(&c);
            tape = be->alloc(ctx, tb ? tb : 1);
        }
        bk_status s1 = bki_op_forward(&c, tape, NULL, 0), s2 = BK_OK;
        if (!bki_backend_kernel(be, op->name)) {
            /* refused, nothing written */
            float o0;
            be->copy(ctx, &o0, o.dev, sizeof o0, 1);
            th_check(s1 == BK_ERR_UNSUPPORTED && o0 == -7.0f && strstr(bk_last_error(), row->name), name,
                     "a backend without the operator: %s, %s", bk_status_str(s1), bk_last_error());
            goto done;
        }
        if (bw && s1 == BK_OK) {
            memset(&c, 0, sizeof c);
            c.op = op;
            c.d = &pb.desc;
            c.par = par;
            c.q = &tq; c.k = &tk; c.v = &tv; c.dout = &tdo; c.dq = &tdq; c.dk = &tdk; c.dv = &tdv;
            c.pg = st.npg ? (op == &bki_op_lot ? (void *)&st.lg : (void *)st.pg) : NULL;
            s2 = bki_op_backward(&c, tape, NULL, 0);
        }
        if (!th_check(s1 == BK_OK && s2 == BK_OK, name, "%s / %s: %s", bk_status_str(s1), bk_status_str(s2),
                      bk_last_error()))
            goto done;
        ok = th_dev_down(ctx, pb.o, &o) && th_dev_down(ctx, pb.a, &a);
        if (bw) ok = ok && th_dev_down(ctx, pb.dq, &dq) && th_dev_down(ctx, pb.dk, &dk) && th_dev_down(ctx, pb.dv, &dv);
        th_check(ok, name, "results back from the backend's memory");
        {
            int *ql = th_lens_int(pb.ql, B_), *kl = th_lens_int(pb.kl, B_);
            double *Q = th_gather(&pb.tq, B_, H_, NQ, D_, pb.ql), *K = th_gather(&pb.tk, B_, H_, NK, D_, pb.kl);
            double *V = th_gather(&pb.tv, B_, H_, NK, DV, pb.kl), *dO = th_gather(&pb.tdo, B_, H_, NQ, DV, pb.ql);
            ref_in in = {ql, kl, Q, K, V, dO};
            ref_out ro = {calloc(nq * NK, 8), calloc(nq * DV, 8), calloc(nq * D_, 8), calloc(nk * D_, 8),
                          calloc(nk * DV, 8), calloc((size_t)st.npg + 1, 8)};
            row->reference(par, &st, &in, &ro, bw);
            const double eo = th_rel_err(&pb.to, B_, H_, NQ, DV, ro.O), ea = th_rel_err(&pb.ta, B_, H_, NQ, NK, ro.A);
            double eq = 0, ek = 0, ev = 0, ep = 0;
            if (bw) {
                eq = th_rel_err(&pb.tdq, B_, H_, NQ, D_, ro.dQ);
                ek = th_rel_err(&pb.tdk, B_, H_, NK, D_, ro.dK);
                ev = th_rel_err(&pb.tdv, B_, H_, NK, DV, ro.dV);
                if (st.npg) ep = th_max_rel(st.pg, ro.dP, (size_t)st.npg, 1.0);
            }
            th_check(eo <= 1e-5 && ea <= 1e-5 && eq <= 1e-4 && ek <= 1e-4 && ev <= 1e-4 && ep <= 1e-4, name,
                     "vs the double reference: O %.2e A %.2e%s dQ %.2e dK %.2e dV %.2e dparams %.2e", eo, ea,
                     bw ? "" : " (forward only)", eq, ek, ev, ep);
            free(ql); free(kl); free(Q); free(K); free(V); free(dO);
            free(ro.A); free(ro.O); free(ro.dQ); free(ro.dK); free(ro.dV); free(ro.dP);
        }
    done:
        if (tape) be->free(ctx, tape);
        th_dbuf *all[] = {&q, &k, &v, &o, &a, &dout, &dq, &dk, &dv};
        for (int j = 0; j < 9; j++) th_dev_free(ctx, all[j]);
        free(st.ly.omega);
        th_prob_free(&pb);
    }
}

/* ---- overflow: finite inputs whose results overflow float32 --------------
 * Every operator (issue 41): |q|, |k| ~ 1e30, a score scale of 1e38, and a
 * backward whose dout ~ 3e38 overflows the gradients: BK_ERR_OVERFLOW
 * naming the operator and what overflowed, never BK_OK with NaN or Inf. */
static void fill_par(const op_row *row, const bk_op *pub, void *par, op_state *st, th_rng *r, const char *extra)
{
    bk_op_config_default(pub, par);
    if (row->setup) row->setup(par, st, r);
    char keys[160];
    snprintf(keys, sizeof keys, "%s %s", row->keys, extra);
    for (char *kv = strtok(keys, " "); kv; kv = strtok(NULL, " ")) {
        char *eq = strchr(kv, '=');
        *eq = 0;
        th_check(bk_op_config_set(pub, par, kv, eq + 1) == BK_OK, row->name, "key %s: %s", kv, bk_last_error());
    }
}

static void overflow_case(const op_row *row, int kind)
{
    static const char *const kinds[] = {"|q|, |k| ~ 1e30", "scale = 1e38", "dout ~ 3e38 (backward)"};
    const bk_op *pub = bk_op_find(row->name);
    const bki_op *op = bki_op_find(row->name);
    char name[160];
    snprintf(name, sizeof name, "overflow %s: %s", row->name, kinds[kind]);
    if (kind == 2 && !op->backward) return;
    int has_scale = 0; /* an operator without a score scale (linear) has no second case */
    for (int i = 0; i < bk_op_config_count(pub); i++) has_scale |= !strcmp(bk_op_config_key(pub, i), "scale");
    if (kind == 1 && !has_scale && op != &bki_op_asap) return;
    th_rng r = {0x0F1u + (uint64_t)kind};
    th_prob pb;
    th_prob_init(&pb, B_, H_, NQ, NK, D_, DV, 0, 1, kind ? 1.0 : 1e30, &r);
    op_state st;
    memset(&st, 0, sizeof st);
    _Alignas(16) unsigned char par[512];
    const int asap = op == &bki_op_asap;
    fill_par(row, pub, par, &st, &r, kind == 1 && !asap ? "scale=1e38" : "");
    if (kind == 1 && asap) st.ly.scale = 1e38f;
    /* LOT compares q and k with its pivots only: with unit pivots its scores
     * at |q| ~ 1e30 are ~1e30, a finite problem it solves; pivots ~ 1e30 too */
    if (kind == 0 && op == &bki_op_lot)
        for (int i = 0; i < H_ * NPIV * D_; i++) st.Z[i] *= 1e30f;
    if (kind == 2)
        for (size_t i = 0; i < (size_t)B_ * H_ * NQ * DV; i++) pb.dout[i] = 3e38f;
    bki_call c;
    memset(&c, 0, sizeof c);
    c.op = op; c.d = &pb.desc; c.par = par;
    c.q = &pb.tq; c.k = &pb.tk; c.v = &pb.tv; c.out = &pb.to;
    bk_status s = bki_op_forward(&c, NULL, NULL, 0);
    if (kind < 2) {
        th_check(s == BK_ERR_OVERFLOW && strstr(bk_last_error(), row->name) && strstr(bk_last_error(), "overflow") &&
                     strstr(bk_last_error(), "output"),
                 name, "forward: %s: %s", bk_status_str(s), bk_last_error());
    } else if (th_check(s == BK_OK, name, "the forward is finite: %s", bk_last_error())) {
        memset(&c, 0, sizeof c);
        c.op = op; c.d = &pb.desc; c.par = par;
        c.q = &pb.tq; c.k = &pb.tk; c.v = &pb.tv; c.dout = &pb.tdo; c.dq = &pb.tdq; c.dk = &pb.tdk; c.dv = &pb.tdv;
        c.pg = st.npg ? (op == &bki_op_lot ? (void *)&st.lg : (void *)st.pg) : NULL;
        s = bki_op_backward(&c, NULL, NULL, 0);
        th_check(s == BK_ERR_OVERFLOW && strstr(bk_last_error(), "gradient") && strstr(bk_last_error(), "overflow"),
                 name, "backward: %s: %s", bk_status_str(s), bk_last_error());
    }
    free(st.ly.omega);
    th_prob_free(&pb);
}

/* the check runs per problem inside the region: the lowest overflowing
 * problem is named whatever the threads, with teams (few large problems)
 * and without */
static void overflow_which(void)
{
    const int nts[] = {1, 2, 3};
    for (int t = 0; t < 3; t++) {
        bk_set_num_threads(nts[t]);
        th_rng r = {0x0F5u};
        th_prob pb; /* 3 problems of 200 x 200: a team of 2 or 3 threads runs each */
        th_prob_init(&pb, 1, 3, 200, 200, 8, 8, 0, 0, 1.0, &r);
        for (int i = 0; i < 200 * 8; i++) { /* head 2 only */
            pb.q[2 * 200 * 8 + i] *= 1e30f;
            pb.k[2 * 200 * 8 + i] *= 1e30f;
        }
        bk_sinkhorn_config p = bk_sinkhorn_config_default();
        bk_status s = bk_sinkhorn_forward(&pb.desc, &p, &pb.tq, &pb.tk, &pb.tv, &pb.to, NULL, NULL, NULL, 0);
        char name[96];
        snprintf(name, sizeof name, "overflow: the overflowing problem named (%d threads)", nts[t]);
        th_check(s == BK_ERR_OVERFLOW && strstr(bk_last_error(), "problem 2 (b=0, h=2)"), name, "%s: %s",
                 bk_status_str(s), bk_last_error());
        for (int i = 0; i < 200 * 8; i++) {
            pb.q[2 * 200 * 8 + i] *= 1e-30f;
            pb.k[2 * 200 * 8 + i] *= 1e-30f;
        }
        for (int i = 0; i < 200 * 8; i++) pb.dout[200 * 8 + i] = 3e38f; /* head 1's upstream gradient */
        s = bk_sinkhorn_backward(&pb.desc, &p, &pb.tq, &pb.tk, &pb.tv, &pb.tdo, NULL, &pb.tdq, &pb.tdk, &pb.tdv, NULL, 0);
        snprintf(name, sizeof name, "overflow: the backward's overflowing problem named (%d threads)", nts[t]);
        th_check(s == BK_ERR_OVERFLOW && strstr(bk_last_error(), "problem 1 (b=0, h=1)") &&
                     strstr(bk_last_error(), "gradient"),
                 name, "%s: %s", bk_status_str(s), bk_last_error());
        th_prob_free(&pb);
    }
    bk_set_num_threads(0);
}

static void test_ops_overflow(void)
{
    for (int i = 0; i < NOPS_ROWS; i++)
        for (int kind = 0; kind < 3; kind++) overflow_case(&OPS[i], kind);
    overflow_which();
}

/* a backend that runs the Sinkhorn family only (the shape of a first device
 * backend): the harness must see every other operator refused */
static const bki_kernel sinkhorn_family[] = {
    {"softmax", NULL, NULL, NULL, NULL}, {"sinkhorn", NULL, NULL, NULL, NULL}, {"unbalanced", NULL, NULL, NULL, NULL}};

void test_ops_harness(void)
{
    /* every registered operator has a row */
    for (int i = 0; i < bk_op_count(); i++) {
        const char *nm = bk_op_name(bk_op_at(i));
        int found = 0;
        for (int j = 0; j < NOPS_ROWS; j++) found |= !strcmp(OPS[j].name, nm);
        th_check(found, "harness: every registered operator has a row", "%s has none", nm);
    }
    bk_context *prev = bk_context_current();
    /* the backends of this build */
    const bk_backend kinds[] = {BK_BACKEND_CPU, BK_BACKEND_CUDA};
    for (int b = 0; b < (int)(sizeof kinds / sizeof kinds[0]); b++) {
        bk_context_config cfg = bk_context_config_default();
        cfg.backend = kinds[b];
        bk_context *ctx = NULL;
        if (bk_context_create(&cfg, &ctx) != BK_OK) {
            printf("# harness: backend %d skipped: %s\n", (int)kinds[b], bk_last_error());
            continue;
        }
        bk_context_use(ctx);
        for (int layout = 0; layout < 2; layout++) run_backend(ctx, layout);
        bk_context_use(prev);
        bk_context_free(ctx);
    }
    /* the partial backend */
    test_ops_overflow();
    bki_backend partial = bki_backend_cpu;
    partial.name = "partial";
    partial.kernels = sinkhorn_family; /* on the host path */
    partial.nkernels = 3;
    bk_context *ctx = NULL;
    if (bki_context_with_backend(&partial, &ctx) == BK_OK) {
        bk_context_use(ctx);
        run_backend(ctx, 1);
        bk_context_use(prev);
        bk_context_free(ctx);
    }
}
