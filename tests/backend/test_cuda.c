/* test_cuda.c -- the CUDA backend against the CPU backend (docs/CUDA.md).
 *
 * The cross-backend harness (test_ops.c) already checks every operator the
 * CUDA backend runs against the double references on a small padded batch.
 * This group adds what a device backend must show beyond it, on inputs in
 * device memory: a grid of shapes crossing the 64-wide tiles (cross
 * attention, padding with empty problems, causal softmax, S = 1..8, head
 * dims up to 128, the tolerance's early stop), both layouts, the three
 * dtypes (bf16/fp16 against the CPU run on the same rounded inputs), the
 * attention and potential extras, the backward with and without a tape,
 * finite differences in fp32, bitwise determinism (repeats, a problem alone
 * and inside a batch), the error paths, and a call on a stream of its own.
 * Without a usable CUDA device (or in a build without the backend) it prints
 * one SKIP line. */
#include "../../src/backend/backend.h"
#include "birkhoff.h"
#include "../harness.h"
#include "../tutil.h"
#include "devbuf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef BK_HAVE_CUDA
#include <cuda_runtime_api.h>


/* max |x - y| / max(1, max |y|) over n entries; NaN -> inf */
static double rel(const float *x, const float *y, size_t n)
{
    double m = 1.0, e = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)y[i]));
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)x[i] - (double)y[i]);
        if (!(d == d)) return INFINITY;
        e = fmax(e, d);
    }
    return e / m;
}

static const char *dt_name(int dt) { return dt == BK_F32 ? "fp32" : dt == BK_BF16 ? "bf16" : "fp16"; }

/* one case of the grid */
typedef struct {
    const char *name;
    int B, H, Nq, Nk, d, dv;
    int pad;    /* th_prob_init's */
    int S;      /* 0: softmax */
    int causal; /* softmax */
    float tol;
    int extras; /* attention matrix and potentials */
    float eps;  /* Sinkhorn's (0: the default, 1) */
} gcase;

typedef struct {
    float *o, *a, *dq, *dk, *dv, *f, *g;
} results;

/* the same call in the current context; tensors given; tape/extras on the
 * side of the context (device pointers when CUDA) */
static bk_status run_case(const gcase *gc, const bk_attn_desc *desc, const bk_tensor *q, const bk_tensor *k,
                          const bk_tensor *v, const bk_tensor *o, const bk_tensor *a, const bk_tensor *dout,
                          const bk_tensor *dq, const bk_tensor *dk, const bk_tensor *dv, void *tape, float *f,
                          float *g, int use_tape)
{
    bk_status s;
    if (gc->S == 0) {
        bk_softmax_config sp = bk_softmax_config_default();
        sp.causal = gc->causal;
        if ((s = bk_softmax_forward(desc, &sp, q, k, v, o, use_tape ? tape : NULL, gc->extras ? a : NULL, NULL, 0)))
            return s;
        return bk_softmax_backward(desc, &sp, q, k, v, dout, use_tape ? tape : NULL, dq, dk, dv, NULL, 0);
    }
    bk_sinkhorn_config p = bk_sinkhorn_config_default();
    p.iters = gc->S;
    p.tol = gc->tol;
    if (gc->eps > 0.0f) p.eps = gc->eps;
    bk_sinkhorn_extras ex;
    memset(&ex, 0, sizeof ex);
    if (gc->extras) {
        ex.attn = *a;
        ex.f = f;
        ex.g = g;
    }
    if ((s = bk_sinkhorn_forward(desc, &p, q, k, v, o, use_tape ? tape : NULL, gc->extras ? &ex : NULL, NULL, 0)))
        return s;
    return bk_sinkhorn_backward(desc, &p, q, k, v, dout, use_tape ? tape : NULL, dq, dk, dv, NULL, 0);
}

static size_t tape_bytes(const gcase *gc, const bk_attn_desc *desc)
{
    if (gc->S == 0) return bk_softmax_tape_size(desc);
    bk_sinkhorn_config p = bk_sinkhorn_config_default();
    p.iters = gc->S;
    p.tol = gc->tol;
    return bk_sinkhorn_tape_size(desc, &p);
}

static void grid_case(bk_context *cu, const gcase *gc, int layout, int dt, uint64_t seed)
{
    char name[200];
    /* the context keeps the output in 16-bit calls' tapes */
    const int tout = bki_ctx_config(cu)->tape_output && dt != BK_F32;
    snprintf(name, sizeof name, "cuda %s %s %s%s", gc->name, layout ? "bnhd" : "bhnd", dt_name(dt),
             tout ? " (tape keeps O)" : "");
    th_rng r = {seed};
    th_prob pb;
    th_prob_init(&pb, gc->B, gc->H, gc->Nq, gc->Nk, gc->d, gc->dv, layout, gc->pad, 0.8, &r);
    const int B = gc->B, H = gc->H;
    const size_t nq = (size_t)B * H * gc->Nq, nk = (size_t)B * H * gc->Nk, P = (size_t)B * H;
    th_round_to(dt, pb.q, nq * gc->d);
    th_round_to(dt, pb.k, nk * gc->d);
    th_round_to(dt, pb.v, nk * gc->dv);
    th_round_to(dt, pb.dout, nq * gc->dv);
    /* the CPU's results */
    float *cf = calloc(P * gc->Nq, 4), *cg = calloc(P * gc->Nk, 4);
    void *ctape = malloc(tape_bytes(gc, &pb.desc) + 64);
    bk_context *prev = bk_context_use(NULL);
    bk_status s = run_case(gc, &pb.desc, &pb.tq, &pb.tk, &pb.tv, &pb.to, &pb.ta, &pb.tdo, &pb.tdq, &pb.tdk, &pb.tdv,
                           ctape, cf, cg, 1);
    th_check(s == BK_OK, name, "CPU run: %s", bk_last_error());
    results cpu = {pb.o, pb.a, pb.dq, pb.dk, pb.dv, cf, cg};
    /* the device's */
    bk_context_use(cu);
    const bki_backend *be = bki_ctx_backend(cu);
    th_dbuf q = {0}, k = {0}, v = {0}, o = {0}, a = {0}, dout = {0}, dq = {0}, dk = {0}, dvb = {0};
    int ok = th_dev_up(cu, &q, pb.q, nq * gc->d, dt) && th_dev_up(cu, &k, pb.k, nk * gc->d, dt) && th_dev_up(cu, &v, pb.v, nk * gc->dv, dt) &&
             th_dev_up(cu, &dout, pb.dout, nq * gc->dv, dt);
    float *junk = th_alloc_fill(nq * (gc->Nk > gc->d ? gc->Nk : gc->d) + nk * gc->dv, -7.0f);
    ok = ok && th_dev_up(cu, &o, junk, nq * gc->dv, dt) && th_dev_up(cu, &a, junk, nq * gc->Nk, dt) &&
         th_dev_up(cu, &dq, junk, nq * gc->d, dt) && th_dev_up(cu, &dk, junk, nk * gc->d, dt) && th_dev_up(cu, &dvb, junk, nk * gc->dv, dt);
    float *df = be->alloc(cu, P * gc->Nq * 4), *dg = be->alloc(cu, P * gc->Nk * 4);
    void *tape = be->alloc(cu, tape_bytes(gc, &pb.desc) + 64);
    th_check(ok && df && dg && tape, name, "device buffers");
    const bk_tensor tq = th_dev_view(&pb.tq, &q), tk = th_dev_view(&pb.tk, &k), tv = th_dev_view(&pb.tv, &v), to = th_dev_view(&pb.to, &o),
                    ta = th_dev_view(&pb.ta, &a), tdo = th_dev_view(&pb.tdo, &dout), tdq = th_dev_view(&pb.tdq, &dq), tdk = th_dev_view(&pb.tdk, &dk),
                    tdv = th_dev_view(&pb.tdv, &dvb);
    s = run_case(gc, &pb.desc, &tq, &tk, &tv, &to, &ta, &tdo, &tdq, &tdk, &tdv, tape, df, dg, 1);
    if (th_check(s == BK_OK, name, "device run: %s", bk_last_error())) {
        results gpu;
        gpu.o = malloc(nq * gc->dv * 4); gpu.a = malloc(nq * gc->Nk * 4);
        gpu.dq = malloc(nq * gc->d * 4); gpu.dk = malloc(nk * gc->d * 4); gpu.dv = malloc(nk * gc->dv * 4);
        gpu.f = malloc(P * gc->Nq * 4); gpu.g = malloc(P * gc->Nk * 4);
        ok = th_dev_down(cu, gpu.o, &o) && th_dev_down(cu, gpu.dq, &dq) && th_dev_down(cu, gpu.dk, &dk) && th_dev_down(cu, gpu.dv, &dvb);
        if (gc->extras) ok = ok && th_dev_down(cu, gpu.a, &a);
        ok = ok && be->copy(cu, gpu.f, df, P * gc->Nq * 4, 1) == BK_OK && be->copy(cu, gpu.g, dg, P * gc->Nk * 4, 1) == BK_OK;
        th_check(ok, name, "results back");
        /* tolerances: fp32 within twice the accuracy contract of each side;
         * 16-bit types: the rounding of the outputs and of the tiles fed to
         * the tensor cores (P, Cbar) */
        const double tf = dt == BK_F32 ? 2e-5 : dt == BK_BF16 ? 2e-2 : 4e-3;
        /* fp32 gradients: scores of size alpha |q||k| (alpha = scale / eps)
         * rounded on each side, so the contract widens as 1 / eps below 0.1
         * (measured on an H100 at eps = 0.02: 7.1e-4) */
        const double cond = gc->eps > 0.0f && gc->eps < 0.1f ? 0.1 / gc->eps : 1.0;
        const double tb = dt == BK_F32 ? 2e-4 * cond : dt == BK_BF16 ? 5e-2 : 1e-2;
        const double eo = rel(gpu.o, cpu.o, nq * gc->dv), eq = rel(gpu.dq, cpu.dq, nq * gc->d),
                     ek = rel(gpu.dk, cpu.dk, nk * gc->d), ev = rel(gpu.dv, cpu.dv, nk * gc->dv);
        double ea = 0.0, ef = 0.0, eg = 0.0;
        if (gc->extras) {
            ea = rel(gpu.a, cpu.a, nq * gc->Nk);
            if (gc->S) {
                ef = rel(gpu.f, cpu.f, P * gc->Nq);
                eg = rel(gpu.g, cpu.g, P * gc->Nk);
            }
        }
        th_check(eo <= tf && ea <= tf && ef <= 10 * tf && eg <= 10 * tf && eq <= tb && ek <= tb && ev <= tb, name,
                 "vs the CPU backend: O %.2e A %.2e f %.2e g %.2e dQ %.2e dK %.2e dV %.2e (tol %.0e / %.0e)", eo, ea,
                 ef, eg, eq, ek, ev, tf, tb);
        /* the backward that recomputes its tape: bitwise the same gradients
         * (a tape keeping the output gives D from it, the recomputation by a
         * pass: then both within the tolerance of the CPU's) */
        float *dq2 = malloc(nq * gc->d * 4), *dk2 = malloc(nk * gc->d * 4), *dv2 = malloc(nk * gc->dv * 4);
        s = run_case(gc, &pb.desc, &tq, &tk, &tv, &to, &ta, &tdo, &tdq, &tdk, &tdv, tape, df, dg, 0);
        ok = s == BK_OK && th_dev_down(cu, dq2, &dq) && th_dev_down(cu, dk2, &dk) && th_dev_down(cu, dv2, &dvb);
        if (tout) {
            const double rq = rel(dq2, cpu.dq, nq * gc->d), rk = rel(dk2, cpu.dk, nk * gc->d),
                         rv = rel(dv2, cpu.dv, nk * gc->dv);
            th_check(ok && rq <= tb && rk <= tb && rv <= tb, name,
                     "no tape (D by a pass) vs the CPU: dQ %.2e dK %.2e dV %.2e (tol %.0e): %s", rq, rk, rv, tb,
                     s ? bk_last_error() : "ok");
        } else {
            th_check(ok && !memcmp(dq2, gpu.dq, nq * gc->d * 4) && !memcmp(dk2, gpu.dk, nk * gc->d * 4) &&
                         !memcmp(dv2, gpu.dv, nk * gc->dv * 4),
                     name, "no tape (recomputed) == tape, bitwise: %s", s ? bk_last_error() : "differs");
        }
        /* determinism: a second run with the tape, bitwise */
        float *o3 = malloc(nq * gc->dv * 4);
        s = run_case(gc, &pb.desc, &tq, &tk, &tv, &to, &ta, &tdo, &tdq, &tdk, &tdv, tape, df, dg, 1);
        ok = s == BK_OK && th_dev_down(cu, o3, &o) && th_dev_down(cu, dq2, &dq) && th_dev_down(cu, dk2, &dk) && th_dev_down(cu, dv2, &dvb);
        th_check(ok && !memcmp(o3, gpu.o, nq * gc->dv * 4) && !memcmp(dq2, gpu.dq, nq * gc->d * 4) &&
                     !memcmp(dk2, gpu.dk, nk * gc->d * 4) && !memcmp(dv2, gpu.dv, nk * gc->dv * 4),
                 name, "a repeat is bitwise the same: %s", s ? bk_last_error() : "differs");
        /* ordinary launches (even seeds) or launches at the predecessor's
         * start (odd) instead of at its blocks' exit, and the dV, dQ and dK
         * passes compiled for 3 blocks an SM instead of 4: the same bits */
        setenv("BK_CUDA_PDL", seed & 1 ? "2" : "0", 1);
        setenv("BK_CUDA_DV_BLOCKS", "3", 1);
        setenv("BK_CUDA_GRAD_BLOCKS", "3", 1);
        s = run_case(gc, &pb.desc, &tq, &tk, &tv, &to, &ta, &tdo, &tdq, &tdk, &tdv, tape, df, dg, 1);
        unsetenv("BK_CUDA_PDL");
        unsetenv("BK_CUDA_DV_BLOCKS");
        unsetenv("BK_CUDA_GRAD_BLOCKS");
        ok = s == BK_OK && th_dev_down(cu, o3, &o) && th_dev_down(cu, dq2, &dq) && th_dev_down(cu, dk2, &dk) && th_dev_down(cu, dv2, &dvb);
        th_check(ok && !memcmp(o3, gpu.o, nq * gc->dv * 4) && !memcmp(dq2, gpu.dq, nq * gc->d * 4) &&
                     !memcmp(dk2, gpu.dk, nk * gc->d * 4) && !memcmp(dv2, gpu.dv, nk * gc->dv * 4),
                 name, "other launches (BK_CUDA_PDL=%s), other blocks an SM: bitwise the same: %s", seed & 1 ? "2" : "0", s ? bk_last_error() : "differs");
        free(o3); free(dq2); free(dk2); free(dv2);
        free(gpu.o); free(gpu.a); free(gpu.dq); free(gpu.dk); free(gpu.dv); free(gpu.f); free(gpu.g);
    }
    th_dbuf *all[] = {&q, &k, &v, &o, &a, &dout, &dq, &dk, &dvb};
    for (int i = 0; i < 9; i++) th_dev_free(cu, all[i]);
    be->free(cu, df);
    be->free(cu, dg);
    be->free(cu, tape);
    bk_context_use(prev);
    free(junk); free(cf); free(cg); free(ctape);
    th_prob_free(&pb);
}

/* ---- finite differences of the device's fp32 gradients ---- */
typedef struct {
    bk_context *cu;
    th_prob *pb;
    th_dbuf *q, *k, *v, *o;
    int S;
} fd_ctx;

static double fd_loss(void *vx)
{
    fd_ctx *x = vx;
    th_prob *pb = x->pb;
    const size_t nq = (size_t)pb->desc.B * pb->desc.H * pb->desc.Nq, nk = (size_t)pb->desc.B * pb->desc.H * pb->desc.Nk;
    /* the host copies were perturbed: upload them again */
    th_dev_free(x->cu, x->q); th_dev_free(x->cu, x->k); th_dev_free(x->cu, x->v);
    th_dev_up(x->cu, x->q, pb->q, nq * pb->desc.d, BK_F32);
    th_dev_up(x->cu, x->k, pb->k, nk * pb->desc.d, BK_F32);
    th_dev_up(x->cu, x->v, pb->v, nk * pb->desc.dv, BK_F32);
    const bk_tensor tq = th_dev_view(&pb->tq, x->q), tk = th_dev_view(&pb->tk, x->k), tv = th_dev_view(&pb->tv, x->v), to = th_dev_view(&pb->to, x->o);
    bk_sinkhorn_config p = bk_sinkhorn_config_default();
    p.iters = x->S;
    bk_sinkhorn_forward(&pb->desc, &p, &tq, &tk, &tv, &to, NULL, NULL, NULL, 0);
    float *o = malloc(nq * pb->desc.dv * 4);
    th_dev_down(x->cu, o, x->o);
    double L = 0.0;
    bk_tensor th = pb->to; /* the downloaded output, in the host view's layout */
    th.data = o;
    double *og = th_gather(&th, pb->desc.B, pb->desc.H, pb->desc.Nq, pb->desc.dv, pb->ql);
    double *dg = th_gather(&pb->tdo, pb->desc.B, pb->desc.H, pb->desc.Nq, pb->desc.dv, pb->ql);
    for (size_t i = 0; i < nq * pb->desc.dv; i++) L += og[i] * dg[i];
    free(og); free(dg); free(o);
    return L;
}

static void fd_test(bk_context *cu)
{
    th_rng r = {77};
    th_prob pb;
    th_prob_init(&pb, 2, 2, 70, 90, 16, 12, 1, 0, 0.8, &r); /* full lengths: Lq = 1 has zero dQ */
    const size_t nq = (size_t)2 * 2 * 70, nk = (size_t)2 * 2 * 90;
    bk_context *prev = bk_context_use(cu);
    th_dbuf q = {0}, k = {0}, v = {0}, o = {0}, dout = {0}, dq = {0}, dk = {0}, dv = {0};
    th_dev_up(cu, &q, pb.q, nq * 16, BK_F32); th_dev_up(cu, &k, pb.k, nk * 16, BK_F32); th_dev_up(cu, &v, pb.v, nk * 12, BK_F32);
    th_dev_up(cu, &o, pb.o, nq * 12, BK_F32); th_dev_up(cu, &dout, pb.dout, nq * 12, BK_F32);
    th_dev_up(cu, &dq, pb.dq, nq * 16, BK_F32); th_dev_up(cu, &dk, pb.dk, nk * 16, BK_F32); th_dev_up(cu, &dv, pb.dv, nk * 12, BK_F32);
    const bk_tensor tq = th_dev_view(&pb.tq, &q), tk = th_dev_view(&pb.tk, &k), tv = th_dev_view(&pb.tv, &v), tdo = th_dev_view(&pb.tdo, &dout),
                    tdq = th_dev_view(&pb.tdq, &dq), tdk = th_dev_view(&pb.tdk, &dk), tdv = th_dev_view(&pb.tdv, &dv);
    for (int S = 1; S <= 4; S += 3) {
        bk_sinkhorn_config p = bk_sinkhorn_config_default();
        p.iters = S;
        const bk_status s = bk_sinkhorn_backward(&pb.desc, &p, &tq, &tk, &tv, &tdo, NULL, &tdq, &tdk, &tdv, NULL, 0);
        th_check(s == BK_OK, "cuda FD: backward", "%s", bk_last_error());
        float *gq = malloc(nq * 16 * 4), *gk = malloc(nk * 16 * 4), *gv = malloc(nk * 12 * 4);
        th_dev_down(cu, gq, &dq); th_dev_down(cu, gk, &dk); th_dev_down(cu, gv, &dv);
        fd_ctx x = {cu, &pb, &q, &k, &v, &o, S};
        char nm[64];
        /* valid rows only: perturb the first problem's valid block (NaN
         * padding stays untouched); the gradient there is the device's */
        const int lq = pb.ql ? pb.ql[0] : 70, lk = pb.kl ? pb.kl[0] : 90;
        snprintf(nm, sizeof nm, "cuda FD dQ (S=%d)", S);
        for (int row = 0; row < lq; row += 17) th_directional_fd(nm, pb.q + (size_t)row * pb.tq.stride_n, gq + (size_t)row * pb.tq.stride_n, 16, 3e-3f, &r, fd_loss, &x);
        snprintf(nm, sizeof nm, "cuda FD dK (S=%d)", S);
        for (int row = 0; row < lk; row += 23) th_directional_fd(nm, pb.k + (size_t)row * pb.tk.stride_n, gk + (size_t)row * pb.tk.stride_n, 16, 3e-3f, &r, fd_loss, &x);
        snprintf(nm, sizeof nm, "cuda FD dV (S=%d)", S);
        for (int row = 0; row < lk; row += 23) th_directional_fd(nm, pb.v + (size_t)row * pb.tv.stride_n, gv + (size_t)row * pb.tv.stride_n, 12, 3e-3f, &r, fd_loss, &x);
        free(gq); free(gk); free(gv);
    }
    th_dbuf *all[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
    for (int i = 0; i < 8; i++) th_dev_free(cu, all[i]);
    bk_context_use(prev);
    th_prob_free(&pb);
}

/* ---- a problem alone and inside a batch: bitwise ---- */
static void batch_shape_test(bk_context *cu)
{
    th_rng r = {5};
    th_prob big, one;
    th_prob_init(&big, 3, 2, 150, 100, 32, 32, 0, 0, 0.8, &r);
    th_prob_plant_lengths(&big, 1, 120, 77, 9);
    th_prob_init(&one, 1, 2, 150, 100, 32, 32, 0, 0, 0.8, &r);
    th_prob_plant_lengths(&one, 0, 120, 77, 9);
    /* the same data for the planted problem */
    const size_t qs = (size_t)2 * 150 * 32, ks = (size_t)2 * 100 * 32;
    memcpy(big.q + qs, one.q, qs * 4); memcpy(big.k + ks, one.k, ks * 4); memcpy(big.v + ks, one.v, ks * 4);
    memcpy(big.dout + qs, one.dout, qs * 4);
    bk_context *prev = bk_context_use(cu);
    th_prob *ps[2] = {&big, &one};
    float *res[2][2];
    for (int w = 0; w < 2; w++) {
        th_prob *pb = ps[w];
        const size_t nq = (size_t)pb->desc.B * 2 * 150, nk = (size_t)pb->desc.B * 2 * 100;
        th_dbuf q = {0}, k = {0}, v = {0}, o = {0}, dout = {0}, dq = {0}, dk = {0}, dv = {0};
        th_dev_up(cu, &q, pb->q, nq * 32, BK_BF16); th_dev_up(cu, &k, pb->k, nk * 32, BK_BF16); th_dev_up(cu, &v, pb->v, nk * 32, BK_BF16);
        th_dev_up(cu, &o, pb->o, nq * 32, BK_BF16); th_dev_up(cu, &dout, pb->dout, nq * 32, BK_BF16);
        th_dev_up(cu, &dq, pb->dq, nq * 32, BK_BF16); th_dev_up(cu, &dk, pb->dk, nk * 32, BK_BF16); th_dev_up(cu, &dv, pb->dv, nk * 32, BK_BF16);
        const bk_tensor tq = th_dev_view(&pb->tq, &q), tk = th_dev_view(&pb->tk, &k), tv = th_dev_view(&pb->tv, &v), to = th_dev_view(&pb->to, &o),
                        tdo = th_dev_view(&pb->tdo, &dout), tdq = th_dev_view(&pb->tdq, &dq), tdk = th_dev_view(&pb->tdk, &dk), tdv = th_dev_view(&pb->tdv, &dv);
        bk_sinkhorn_config p = bk_sinkhorn_config_default();
        bk_status s = bk_sinkhorn_forward(&pb->desc, &p, &tq, &tk, &tv, &to, NULL, NULL, NULL, 0);
        if (!s) s = bk_sinkhorn_backward(&pb->desc, &p, &tq, &tk, &tv, &tdo, NULL, &tdq, &tdk, &tdv, NULL, 0);
        th_check(s == BK_OK, "cuda batch shape: runs", "%s", bk_last_error());
        res[w][0] = malloc(nq * 32 * 4);
        res[w][1] = malloc(nk * 32 * 4);
        th_dev_down(cu, res[w][0], &o);
        th_dev_down(cu, res[w][1], &dk);
        th_dbuf *all[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
        for (int i = 0; i < 8; i++) th_dev_free(cu, all[i]);
    }
    th_check(!memcmp(res[0][0] + qs, res[1][0], qs * 4) && !memcmp(res[0][1] + ks, res[1][1], ks * 4),
             "cuda: a problem alone and inside a batch, bitwise (bf16 O and dK)", "%s", "differ");
    for (int w = 0; w < 2; w++) { free(res[w][0]); free(res[w][1]); }
    bk_context_use(prev);
    th_prob_free(&big);
    th_prob_free(&one);
}

/* ---- refusals ---- */
static int nomem_alloc_called;
static void *nomem_alloc(size_t n, void *u)
{
    (void)n; (void)u;
    nomem_alloc_called++;
    return NULL;
}
static void nomem_free(void *p, void *u) { (void)p; (void)u; }

static void error_tests(bk_context *cu)
{
    th_rng r = {3};
    th_prob pb;
    th_prob_init(&pb, 1, 2, 20, 20, 8, 8, 0, 0, 0.8, &r);
    const size_t n = (size_t)2 * 20 * 8;
    bk_context *prev = bk_context_use(cu);
    th_dbuf q = {0}, k = {0}, v = {0}, o = {0}, dq = {0}, dk = {0}, dv = {0}, qh = {0};
    th_dev_up(cu, &q, pb.q, n, BK_F32); th_dev_up(cu, &k, pb.k, n, BK_F32); th_dev_up(cu, &v, pb.v, n, BK_F32); th_dev_up(cu, &o, pb.o, n, BK_F32);
    th_dev_up(cu, &dq, pb.q, n, BK_F32); th_dev_up(cu, &dk, pb.q, n, BK_F32); th_dev_up(cu, &dv, pb.q, n, BK_F32);
    th_dev_up(cu, &qh, pb.q, n, BK_BF16);
    bk_tensor tq = th_dev_view(&pb.tq, &q), tk = th_dev_view(&pb.tk, &k), tv = th_dev_view(&pb.tv, &v), to = th_dev_view(&pb.to, &o);
    const bk_tensor tdq = th_dev_view(&pb.tdq, &dq), tdk = th_dev_view(&pb.tdk, &dk), tdv = th_dev_view(&pb.tdv, &dv), tqh = th_dev_view(&pb.tq, &qh);
    bk_sinkhorn_config p = bk_sinkhorn_config_default();
    /* a host pointer marked as device memory */
    bk_tensor bad = tq;
    bad.data = pb.q;
    bk_status s = bk_sinkhorn_forward(&pb.desc, &p, &bad, &tk, &tv, &to, NULL, NULL, NULL, 0);
    th_check(s == BK_ERR_PARAM && strstr(bk_last_error(), "host memory"), "cuda refuses host memory as device memory",
             "%s: %s", bk_status_str(s), bk_last_error());
    /* a host tensor in a CUDA context */
    s = bk_sinkhorn_forward(&pb.desc, &p, &pb.tq, &tk, &tv, &to, NULL, NULL, NULL, 0);
    th_check(s == BK_ERR_PARAM && strstr(bk_last_error(), "host"), "cuda refuses a host tensor", "%s", bk_last_error());
    s = bk_sinkhorn_forward(&pb.desc, &p, &tqh, &tk, &tv, &to, NULL, NULL, NULL, 0);
    th_check(s == BK_ERR_PARAM && strstr(bk_last_error(), "dtype"), "cuda refuses mixed dtypes", "%s", bk_last_error());
    bk_tensor odd = tq;
    odd.dtype = 9;
    s = bk_sinkhorn_forward(&pb.desc, &p, &odd, &tk, &tv, &to, NULL, NULL, NULL, 0);
    th_check(s == BK_ERR_PARAM, "cuda refuses an unknown dtype", "%s", bk_last_error());
    p.grad = BK_GRAD_IMPLICIT;
    s = bk_sinkhorn_backward(&pb.desc, &p, &tq, &tk, &tv, &to, NULL, &tdq, &tdk, &tdv, NULL, 0);
    th_check(s == BK_ERR_UNSUPPORTED && strstr(bk_last_error(), "implicit"), "cuda refuses the implicit backward",
             "%s", bk_last_error());
    p.grad = BK_GRAD_UNROLLED;
    bk_sinkhorn_diag diag[2];
    bk_sinkhorn_extras ex;
    memset(&ex, 0, sizeof ex);
    ex.diag = diag;
    s = bk_sinkhorn_forward(&pb.desc, &p, &tq, &tk, &tv, &to, NULL, &ex, NULL, 0);
    th_check(s == BK_ERR_UNSUPPORTED && strstr(bk_last_error(), "diag"), "cuda refuses extras.diag", "%s",
             bk_last_error());
    /* a tape of another operator */
    const size_t tb = bk_sinkhorn_tape_size(&pb.desc, &p) + bk_softmax_tape_size(&pb.desc);
    void *tape = bki_ctx_backend(cu)->alloc(cu, tb);
    s = bk_softmax_forward(&pb.desc, NULL, &tq, &tk, &tv, &to, tape, NULL, NULL, 0);
    th_check(s == BK_OK, "cuda softmax forward with a tape", "%s", bk_last_error());
    s = bk_sinkhorn_backward(&pb.desc, &p, &tq, &tk, &tv, &to, tape, &tdq, &tdk, &tdv, NULL, 0);
    th_check(s == BK_ERR_TAPE, "cuda refuses another operator's tape", "%s", bk_last_error());
    s = bk_softmax_backward(&pb.desc, NULL, &tq, &tk, &tv, &to, tape, &tdq, &tdk, &tdv, NULL, 0);
    th_check(s == BK_OK, "cuda accepts its own tape", "%s", bk_last_error());
    bki_ctx_backend(cu)->free(cu, tape);
    /* an operator the backend lacks */
    bk_esp_config ep = bk_esp_config_default();
    float theta[8 * 8];
    for (int i = 0; i < 64; i++) theta[i] = (float)th_normal(&r);
    ep.L = 8;
    ep.theta = theta;
    s = bk_esp_forward(&pb.desc, &ep, &tq, &tk, &tv, &to, NULL, NULL, NULL, 0);
    th_check(s == BK_ERR_UNSUPPORTED && strstr(bk_last_error(), "cuda"), "cuda refuses esp (not implemented there)",
             "%s", bk_last_error());
    th_check(bk_context_supports(cu, "sinkhorn") && bk_context_supports(cu, "softmax") &&
                 !bk_context_supports(cu, "lot") && !bk_context_supports(cu, "unbalanced"),
             "cuda supports softmax and sinkhorn", "%s", "");
    /* head dims past 128 */
    bk_attn_desc wide = pb.desc;
    wide.d = 200;
    s = bk_sinkhorn_forward(&wide, &p, &tq, &tk, &tv, &to, NULL, NULL, NULL, 0);
    th_check(s == BK_ERR_UNSUPPORTED && strstr(bk_last_error(), "128"), "cuda refuses d > 128", "%s", bk_last_error());
    /* out of memory: an allocator that has none */
    bk_context_config cfg = bk_context_config_default();
    cfg.backend = BK_BACKEND_CUDA;
    cfg.allocator.alloc = nomem_alloc;
    cfg.allocator.free = nomem_free;
    bk_context *cn = NULL;
    if (bk_context_create(&cfg, &cn) == BK_OK) {
        bk_context_use(cn);
        s = bk_sinkhorn_forward(&pb.desc, &p, &tq, &tk, &tv, &to, NULL, NULL, NULL, 0);
        th_check(s == BK_ERR_NOMEM && nomem_alloc_called, "cuda: no workspace memory -> BK_ERR_NOMEM", "%s",
                 bk_last_error());
        bk_context_use(cu);
        bk_context_free(cn);
    }
    /* a size query in the CUDA context: O(S (Nq + Nk)) per problem, no N^2 */
    bk_attn_desc big = {4, 1, 65536, 65536, 64, 64, NULL, NULL};
    const size_t ws = bk_sinkhorn_workspace_size(&big, &p), tp = bk_sinkhorn_tape_size(&big, &p);
    th_check(ws > 0 && ws < (size_t)64 << 20 && tp < (size_t)32 << 20,
             "cuda workspace and tape at N=65536, B*H=4, S=5: O(S N) bytes", "ws %zu tape %zu", ws, tp);
    th_dbuf *all[] = {&q, &k, &v, &o, &dq, &dk, &dv, &qh};
    for (int i = 0; i < 8; i++) th_dev_free(cu, all[i]);
    bk_context_use(prev);
    th_prob_free(&pb);
}

/* ---- the output kept in the tape (bk_context_config.tape_output): the
 * tape sizes, the grid's cases through it, and a tape used by a backward in
 * another context (whose header is then read back: no note of it there) ---- */
static void tape_output_test(bk_context *cu)
{
    bk_context_config cfg = bk_context_config_default();
    cfg.backend = BK_BACKEND_CUDA;
    cfg.tape_output = 1;
    bk_context *co = NULL;
    bk_status s = bk_context_create(&cfg, &co);
    if (!th_check(s == BK_OK, "cuda context with tape_output", "%s", bk_last_error())) return;
    const gcase grid[] = {
        {"tape output: softmax padded", 2, 3, 100, 100, 32, 32, 1, 0, 0, 0.0f, 0, 0.0f},
        {"tape output: softmax causal, attn", 2, 2, 70, 130, 16, 16, 0, 0, 1, 0.0f, 1, 0.0f},
        {"tape output: sinkhorn S=5", 2, 3, 129, 200, 40, 64, 1, 5, 0, 0.0f, 0, 0.0f},
        {"tape output: sinkhorn S=5, attn", 2, 2, 130, 77, 64, 48, 2, 5, 0, 0.0f, 1, 0.0f},
        {"tape output: sinkhorn S=4", 2, 1, 65, 64, 96, 80, 1, 4, 0, 0.0f, 0, 0.0f},
        {"tape output: sinkhorn d=128 S=3", 1, 2, 200, 150, 128, 128, 0, 3, 0, 0.0f, 0, 0.0f},
        {"tape output: sinkhorn tol=1e-4 S=41", 2, 2, 60, 60, 16, 16, 1, 41, 0, 1e-4f, 0, 0.0f},
    };
    for (int i = 0; i < (int)(sizeof grid / sizeof grid[0]); i++)
        for (int dt = 0; dt < 3; dt++) {
            const int dts[3] = {BK_F32, BK_BF16, BK_F16};
            grid_case(co, &grid[i], i & 1, dts[dt], 5000 + 13 * (uint64_t)i);
        }

    /* the sizes: the output's floats (and 256 bytes of alignment) more with
     * such a context current, none on the CPU or in a plain CUDA context */
    th_rng r = {77};
    th_prob pb;
    th_prob_init(&pb, 2, 2, 96, 80, 32, 48, 0, 0, 0.8, &r);
    bk_sinkhorn_config p = bk_sinkhorn_config_default();
    p.iters = 5;
    bk_context *prev = bk_context_use(NULL);
    const size_t host = bk_sinkhorn_tape_size(&pb.desc, &p);
    bk_context_use(cu);
    const size_t plain = bk_sinkhorn_tape_size(&pb.desc, &p);
    bk_context_use(co);
    const size_t kept = bk_sinkhorn_tape_size(&pb.desc, &p), sm = bk_softmax_tape_size(&pb.desc);
    bk_context_use(NULL);
    const size_t sm_host = bk_softmax_tape_size(&pb.desc);
    th_check(plain == host && kept == host + 256 + (size_t)2 * 2 * 96 * 48 * 4 &&
                 sm == sm_host + 256 + (size_t)2 * 2 * 96 * 48 * 4,
             "cuda tape_output: tape sizes", "host %zu plain %zu kept %zu softmax %zu / %zu", host, plain, kept, sm,
             sm_host);

    /* a tape written in co, its backward in cu (the header read back) and in
     * co (noted): the same gradients, bitwise */
    const size_t nq = (size_t)4 * 96, nk = (size_t)4 * 80;
    th_round_to(BK_BF16, pb.q, nq * 32);
    th_round_to(BK_BF16, pb.k, nk * 32);
    th_round_to(BK_BF16, pb.v, nk * 48);
    th_round_to(BK_BF16, pb.dout, nq * 48);
    th_dbuf q = {0}, k = {0}, v = {0}, o = {0}, dout = {0}, dq = {0}, dk = {0}, dvb = {0};
    float *zero = calloc(nq * 48 + nk * 48, 4);
    bk_context_use(co); /* device views of the current context's device */
    int ok = th_dev_up(co, &q, pb.q, nq * 32, BK_BF16) && th_dev_up(co, &k, pb.k, nk * 32, BK_BF16) &&
             th_dev_up(co, &v, pb.v, nk * 48, BK_BF16) && th_dev_up(co, &dout, pb.dout, nq * 48, BK_BF16) &&
             th_dev_up(co, &o, zero, nq * 48, BK_BF16) && th_dev_up(co, &dq, zero, nq * 32, BK_BF16) &&
             th_dev_up(co, &dk, zero, nk * 32, BK_BF16) && th_dev_up(co, &dvb, zero, nk * 48, BK_BF16);
    void *tape = bki_ctx_backend(co)->alloc(co, kept);
    float *g1 = malloc((nq * 32 + nk * 32 + nk * 48) * 4), *g2 = malloc((nq * 32 + nk * 32 + nk * 48) * 4);
    if (th_check(ok && tape && g1 && g2, "cuda tape_output: buffers", "allocation failed")) {
        const bk_tensor tq = th_dev_view(&pb.tq, &q), tk = th_dev_view(&pb.tk, &k), tv = th_dev_view(&pb.tv, &v),
                        to = th_dev_view(&pb.to, &o), tdo = th_dev_view(&pb.tdo, &dout),
                        tdq = th_dev_view(&pb.tdq, &dq), tdk = th_dev_view(&pb.tdk, &dk),
                        tdv = th_dev_view(&pb.tdv, &dvb);
        bk_context_config pc = bk_context_config_default();
        pc.backend = BK_BACKEND_CUDA;
        bk_context *cr = NULL; /* a context of no forward: no notes */
        s = bk_context_create(&pc, &cr);
        th_check(s == BK_OK, "cuda tape_output: a second context", "%s", bk_last_error());
        float *outs[2] = {g1, g2};
        bk_context *bwd[2] = {co, cr ? cr : co};
        for (int i = 0; i < 2; i++) {
            bk_context_use(co);
            s = bk_sinkhorn_forward(&pb.desc, &p, &tq, &tk, &tv, &to, tape, NULL, NULL, 0);
            bk_context_use(bwd[i]);
            if (!s) s = bk_sinkhorn_backward(&pb.desc, &p, &tq, &tk, &tv, &tdo, tape, &tdq, &tdk, &tdv, NULL, 0);
            ok = s == BK_OK && th_dev_down(co, outs[i], &dq) && th_dev_down(co, outs[i] + nq * 32, &dk) &&
                 th_dev_down(co, outs[i] + nq * 32 + nk * 32, &dvb);
            th_check(ok, "cuda tape_output: a backward in each context", "%s", s ? bk_last_error() : "copy");
        }
        th_check(!memcmp(g1, g2, (nq * 32 + nk * 32 + nk * 48) * 4), "cuda tape_output: a tape read back in another "
                 "context gives the noted tape's gradients, bitwise", "differ");
        /* a noted tape whose header was since overwritten: the note is
         * trusted (documented); in a context without the note it is read
         * back and refused */
        bk_context_use(co);
        const float zeros[16] = {0};
        bki_ctx_backend(co)->copy(co, tape, zeros, sizeof zeros, 0);
        s = bk_sinkhorn_backward(&pb.desc, &p, &tq, &tk, &tv, &tdo, tape, &tdq, &tdk, &tdv, NULL, 0);
        th_check(s == BK_OK, "cuda: a noted tape is checked against its note", "%s", bk_last_error());
        if (cr) {
            bk_context_use(cr);
            s = bk_sinkhorn_backward(&pb.desc, &p, &tq, &tk, &tv, &tdo, tape, &tdq, &tdk, &tdv, NULL, 0);
            th_check(s == BK_ERR_TAPE, "cuda: a zeroed tape is refused (its header read back)", "%s",
                     bk_last_error());
            /* a note of another call at the same address: read back */
            bk_context_use(co);
            bk_sinkhorn_config p3 = p;
            p3.iters = 3;
            s = bk_sinkhorn_forward(&pb.desc, &p3, &tq, &tk, &tv, &to, tape, NULL, NULL, 0);
            bk_context_use(cr);
            if (!s) s = bk_sinkhorn_forward(&pb.desc, &p, &tq, &tk, &tv, &to, tape, NULL, NULL, 0);
            bk_context_use(co);
            if (!s) s = bk_sinkhorn_backward(&pb.desc, &p, &tq, &tk, &tv, &tdo, tape, &tdq, &tdk, &tdv, NULL, 0);
            th_check(s == BK_OK, "cuda: a stale note of another call falls back to reading the header", "%s",
                     bk_last_error());
            bk_context_use(NULL);
            bk_context_free(cr);
        }
    }
    bk_context_use(prev);
    th_dbuf *all[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dvb};
    for (int i = 0; i < 8; i++) th_dev_free(co, all[i]);
    if (tape) bki_ctx_backend(co)->free(co, tape);
    free(zero); free(g1); free(g2);
    th_prob_free(&pb);
    bk_context_free(co);
}

/* ---- a context on a stream of its own ---- */
static void stream_test(void)
{
    cudaStream_t st;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
        th_check(0, "cuda stream", "cudaStreamCreate failed");
        return;
    }
    bk_context_config cfg = bk_context_config_default();
    cfg.backend = BK_BACKEND_CUDA;
    cfg.stream = st;
    cfg.cache_workspace = 1;
    bk_context *cs = NULL;
    bk_status s = bk_context_create(&cfg, &cs);
    th_check(s == BK_OK, "cuda context on a stream", "%s", bk_last_error());
    if (s == BK_OK) {
        gcase gc = {"on a stream, cached workspace", 2, 2, 100, 80, 32, 32, 1, 5, 0, 0.0f, 0, 0.0f};
        grid_case(cs, &gc, 1, BK_F32, 11);
        bk_context_free(cs);
    }
    cudaStreamDestroy(st);
}

void test_cuda(void)
{
    if (TH.filter && !strstr("cuda", TH.filter) && !strstr("harness", TH.filter)) return;
    bk_context_config cfg = bk_context_config_default();
    cfg.backend = BK_BACKEND_CUDA;
    bk_context *cu = NULL;
    if (bk_context_create(&cfg, &cu) != BK_OK) {
        printf("# SKIP cuda: %s\n", bk_last_error());
        return;
    }
    const gcase grid[] = {
        {"softmax padded", 2, 3, 100, 100, 32, 32, 1, 0, 0, 0.0f, 1, 0.0f},
        {"softmax cross", 2, 2, 70, 130, 16, 24, 2, 0, 0, 0.0f, 1, 0.0f},
        {"softmax causal", 2, 2, 70, 130, 16, 16, 0, 0, 1, 0.0f, 1, 0.0f},
        {"softmax causal Nq=Nk", 2, 2, 100, 100, 32, 32, 0, 0, 1, 0.0f, 0, 0.0f},
        {"sinkhorn S=1", 2, 2, 130, 77, 64, 48, 2, 1, 0, 0.0f, 1, 0.0f},
        {"sinkhorn S=2", 2, 2, 130, 77, 64, 48, 2, 2, 0, 0.0f, 1, 0.0f},
        {"sinkhorn S=3", 2, 2, 130, 77, 64, 48, 2, 3, 0, 0.0f, 0, 0.0f},
        {"sinkhorn S=5", 2, 3, 129, 200, 40, 64, 1, 5, 0, 0.0f, 1, 0.0f},
        {"sinkhorn S=8", 2, 2, 96, 96, 64, 64, 0, 8, 0, 0.0f, 1, 0.0f},
        {"sinkhorn d=128 S=5", 1, 2, 200, 150, 128, 128, 0, 5, 0, 0.0f, 0, 0.0f},
        {"sinkhorn d=96 dv=80 S=4", 2, 1, 65, 64, 96, 80, 1, 4, 0, 0.0f, 1, 0.0f},
        /* small eps: potentials move by more than the factorised gradient's
         * bound between steps, so 16-bit problems take the exact terms */
        {"sinkhorn eps=0.02 S=5 (exact terms)", 1, 2, 96, 80, 32, 32, 1, 5, 0, 0.0f, 0, 0.02f},
        {"sinkhorn tol=1e-4 S=41", 2, 2, 60, 60, 16, 16, 1, 41, 0, 1e-4f, 1, 0.0f},
    };
    const int ng = (int)(sizeof grid / sizeof grid[0]);
    for (int i = 0; i < ng; i++)
        for (int layout = 0; layout < 2; layout++)
            for (int dt = 0; dt < 3; dt++) {
                const int dts[3] = {BK_F32, BK_BF16, BK_F16};
                if (TH.quick && layout == 1 && dt) continue;
                grid_case(cu, &grid[i], layout, dts[dt], 1000 + 17 * (uint64_t)i + layout);
            }
    fd_test(cu);
    tape_output_test(cu);
    batch_shape_test(cu);
    error_tests(cu);
    stream_test();
    bk_context_free(cu);
}
#else
void test_cuda(void)
{
    if (TH.filter && !strstr("cuda", TH.filter)) return;
    printf("# SKIP cuda: this build has no CUDA backend (make CUDA=1 with nvcc)\n");
}
#endif
