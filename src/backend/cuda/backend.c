/* backend.c -- the CUDA backend's table and its per-operator kernels
 * (docs/CUDA.md, docs/BACKENDS.md). It registers softmax and Sinkhorn
 * attention (forward and the exact unrolled backward) on tensors in device
 * memory, on the context's stream, asynchronously: a call validates on the
 * host, queues its kernels (kernels.cu) and returns. A backward given a tape
 * checks its header on the host as this context's forward noted it
 * (bki_ctx_tape_note); a tape the context did not write is read back, the
 * one synchronisation. It sees a call through ../call.h only (the driver
 * has run the operator's own checks and filled the tape header), never the
 * framework's header. */
#include "../backend.h"
#include "kernels.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cudaStream_t stream_of(const bk_context *ctx) { return (cudaStream_t)bki_ctx_config(ctx)->stream; }

static bk_status cuda_fail(cudaError_t e, const char *what)
{
    const bk_status s = e == cudaErrorMemoryAllocation ? BK_ERR_NOMEM : BK_ERR_UNSUPPORTED;
    return bki_fail(s, "CUDA backend: %s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* makes the context's device current on the calling thread */
static bk_status use_device(const bk_context *ctx)
{
    const cudaError_t e = cudaSetDevice(bki_ctx_config(ctx)->device);
    return e == cudaSuccess ? BK_OK : cuda_fail(e, "cudaSetDevice");
}

static int available(int device, char *err, size_t cap)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(err, cap, "no CUDA device is visible (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        cudaGetLastError(); /* clear the runtime's sticky error */
        return 0;
    }
    if (device >= n) {
        snprintf(err, cap, "%d CUDA device(s) visible, no ordinal %d", n, device);
        return 0;
    }
    struct cudaDeviceProp pr;
    if ((e = cudaGetDeviceProperties(&pr, device)) != cudaSuccess) {
        snprintf(err, cap, "cudaGetDeviceProperties: %s", cudaGetErrorString(e));
        return 0;
    }
    if (pr.major < 9) {
        snprintf(err, cap, "%s has compute capability %d.%d; this build's kernels need 9.0 or later (sm_90 + PTX)",
                 pr.name, pr.major, pr.minor);
        return 0;
    }
    return 1;
}

static void *alloc(bk_context *ctx, size_t bytes)
{
    void *p = NULL;
    if (use_device(ctx) != BK_OK) return NULL;
    if (cudaMallocAsync(&p, bytes ? bytes : 1, stream_of(ctx)) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void release(bk_context *ctx, void *p)
{
    if (!p) return;
    if (use_device(ctx) == BK_OK) cudaFreeAsync(p, stream_of(ctx));
}

static bk_status copy(bk_context *ctx, void *dst, const void *src, size_t bytes, int dir)
{
    bk_status s;
    if ((s = use_device(ctx))) return s;
    const enum cudaMemcpyKind k = dir == 0 ? cudaMemcpyHostToDevice
                                           : dir == 1 ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, k, stream_of(ctx));
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream_of(ctx));
    return e == cudaSuccess ? BK_OK : cuda_fail(e, "cudaMemcpy");
}

/* ---- the call's parameters: each registered operator's entry reads its
 * own parameter struct (softmax_par, sinkhorn_par) ------------------------ */
typedef struct {
    const char *name; /* the operator's, for messages */
    float alpha, tol;
    int S, causal, implicit;
    const bk_sinkhorn_extras *ex; /* the forward's extras (Sinkhorn), or NULL */
} cu_par;

static cu_par softmax_par(const bki_call *c)
{
    const bk_softmax_config *p = c->par;
    const cu_par k = {"softmax", bki_scale(p->scale, c->d->d), 0.0f, 1, p->causal, 0, NULL};
    return k;
}

static cu_par sinkhorn_par(const bki_call *c)
{
    const bk_sinkhorn_config *p = c->par;
    const cu_par k = {"sinkhorn", bki_scale(p->scale, c->d->d) / p->eps, p->tol, p->iters, 0,
                      p->grad == BK_GRAD_IMPLICIT, c->ex};
    return k;
}

/* ---- workspace: [lengths][iters][stopped][errors][history][adjoints][D]
 * [factors][factor flags] (docs/CUDA.md, "Workspace") -------------------- */
typedef struct {
    size_t lens, iters, stopped, err, hist, adj, D, fac, fact, total;
} cu_ws;

static size_t r256(size_t x) { return (x + 255) & ~(size_t)255; }

static cu_ws ws_layout(const bki_call *c, const cu_par *k, int with_hist, int backward)
{
    const bk_attn_desc *d = c->d;
    const size_t P = (size_t)d->B * d->H, nkb = (size_t)(d->Nk + BKC_TILE - 1) / BKC_TILE;
    const size_t hl = bki_hist_len(d->Nq, d->Nk, k->S);
    cu_ws w;
    size_t off = 0;
    w.lens = off; off += r256(2 * (size_t)d->B * sizeof(int32_t));
    w.iters = off; off += r256(P * sizeof(int32_t));
    w.stopped = off; off += r256(P * sizeof(int32_t));
    w.err = off; off += r256(P * nkb * sizeof(float));
    w.hist = off; off += with_hist ? r256(P * hl * sizeof(float)) : 0;
    w.adj = off; off += backward ? r256(P * hl * sizeof(float)) : 0;
    w.D = off; off += backward ? r256(P * (size_t)d->Nq * sizeof(float)) : 0;
    /* the backward's rank-one factors: S (Nq + Nk) floats a problem (used by
     * the 16-bit passes; the size query knows no dtype) */
    w.fac = off;
    off += backward ? r256(P * (size_t)k->S * (((size_t)d->Nq + 3) / 4 * 4 + ((size_t)d->Nk + 3) / 4 * 4) *
                           sizeof(float))
                    : 0;
    w.fact = off; off += backward ? r256(P * sizeof(int32_t)) : 0;
    w.total = off + 256;
    return w;
}

/* a backward that recomputes its tape: the largest */
static size_t softmax_workspace(bk_context *ctx, bki_call *c)
{
    (void)ctx;
    const cu_par k = softmax_par(c);
    return ws_layout(c, &k, 1, 1).total;
}

static size_t sinkhorn_workspace(bk_context *ctx, bki_call *c)
{
    (void)ctx;
    const cu_par k = sinkhorn_par(c);
    return ws_layout(c, &k, 1, 1).total;
}

/* ---- the output kept in the tape (bk_context_config.tape_output): P x Nq x
 * dv floats after the operator's blocks, at the next 256-byte address ---- */
static int tape_output(const bk_context *ctx)
{
    /* BK_CUDA_TAPE_OUTPUT=0 turns it off (the benchmarks' baseline; read at
     * every call, like BK_CUDA_KERNELS: keep it fixed between a size query
     * and its forward) */
    const char *e = getenv("BK_CUDA_TAPE_OUTPUT");
    return bki_ctx_config(ctx)->tape_output && !(e && strcmp(e, "0") == 0);
}

static size_t tape_extra(bk_context *ctx, bki_call *c)
{
    if (!tape_output(ctx)) return 0;
    return 256 + (size_t)c->d->B * c->d->H * c->d->Nq * c->d->dv * sizeof(float);
}

_Static_assert(sizeof(bki_tape_header) <= BKI_TAPE_NOTE_MAX, "a tape header fits a context's note");

static float *tape_out(const bki_call *c, const void *tape)
{
    const uintptr_t at = (uintptr_t)tape + c->tape_bytes;
    return (float *)((at + 255) & ~(uintptr_t)255);
}

/* ---- checks ---------------------------------------------------------------- */
/* the tensor's memory is device memory of the context's device */
static bk_status on_device(const bk_context *ctx, const char *name, const void *ptr)
{
    struct cudaPointerAttributes at;
    const cudaError_t e = cudaPointerGetAttributes(&at, ptr);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return bki_fail(BK_ERR_PARAM, "%s is not CUDA memory (cudaPointerGetAttributes: %s)", name,
                        cudaGetErrorString(e));
    }
    if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
        return bki_fail(BK_ERR_PARAM, "%s points to host memory, not to memory of CUDA device %d (copy it to the device "
                                      "first: birkhoff never copies behind the caller's back)",
                        name, bki_ctx_config(ctx)->device);
    if (at.device != bki_ctx_config(ctx)->device)
        return bki_fail(BK_ERR_PARAM, "%s lives on CUDA device %d, the context computes on device %d", name, at.device,
                        bki_ctx_config(ctx)->device);
    return BK_OK;
}

/* (the driver has checked the descriptor and the operator's parameters) */
static bk_status check_call(bk_context *ctx, bki_call *c, const cu_par *k, int backward, const void *tape, void *ws)
{
    bk_status s;
    const bk_attn_desc *d = c->d;
    if (backward && k->implicit)
        return bki_fail(BK_ERR_UNSUPPORTED, "sinkhorn: the implicit backward (grad=implicit) is not implemented on the "
                                            "CUDA backend; use grad=unrolled (the exact VJP of the forward run)");
    if (d->d > BKC_DMAX || d->dv > BKC_DMAX)
        return bki_fail(BK_ERR_UNSUPPORTED, "the CUDA backend takes head dims d, dv <= %d (got d=%d dv=%d)", BKC_DMAX,
                        d->d, d->dv);
    if (k->ex && k->ex->diag)
        return bki_fail(BK_ERR_UNSUPPORTED, "sinkhorn: extras.diag is not computed on the CUDA backend (attn, f and g "
                                            "are)");
    /* the shapes, strides and overlaps every backend checks (device memory is
     * not scanned for non-finite values: bki_check_finite) */
    if ((s = bki_check_qkv(d, c->q, c->k, c->v))) return s;
    if (!backward && (s = bki_check_fwd_outputs(d, c->q, c->k, c->v, c->out, c->attn))) return s;
    if (backward && (s = bki_check_bwd_views(d, c->q, c->k, c->v, c->dout, c->dq, c->dk, c->dv))) return s;
    if (backward && (s = bki_check_values(d, NULL, NULL, NULL, c->dout))) return s;
    /* this backend's own: one dtype per call, memory of the context's device */
    const bk_tensor *ts[9] = {c->q, c->k, c->v, backward ? NULL : c->out,
                              !backward && c->attn && c->attn->data ? c->attn : NULL,
                              backward ? c->dout : NULL, backward ? c->dq : NULL, backward ? c->dk : NULL,
                              backward ? c->dv : NULL};
    const char *tn[9] = {"q", "k", "v", "out", "attn", "dout", "dq", "dk", "dv"};
    for (int i = 0; i < 9; i++) {
        if (!ts[i]) continue;
        if (ts[i]->dtype != c->q->dtype)
            return bki_fail(BK_ERR_PARAM, "tensor %s has dtype %d, q has %d: every tensor of a call has one dtype",
                            tn[i], (int)ts[i]->dtype, (int)c->q->dtype);
        if ((s = on_device(ctx, tn[i], ts[i]->data))) return s;
    }
    if (tape && (s = on_device(ctx, "the tape", tape))) return s;
    if (ws && (s = on_device(ctx, "the workspace", ws))) return s;
    const int dm = d->d > d->dv ? d->d : d->dv;
    int dev = bki_ctx_config(ctx)->device, optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    const size_t need = bkc_smem_need(c->q->dtype, dm);
    if (need > (size_t)optin)
        return bki_fail(BK_ERR_UNSUPPORTED, "the CUDA kernels need %zu bytes of shared memory per block for d=%d dv=%d, "
                                            "the device allows %d",
                        need, d->d, d->dv, optin);
    return BK_OK;
}

/* ---- the call's kernel arguments -------------------------------------------- */
static void strides(const bk_tensor *t, int64_t *s)
{
    s[0] = t ? t->stride_b : 0;
    s[1] = t ? t->stride_h : 0;
    s[2] = t ? t->stride_n : 0;
}

static bk_status fill_args(bk_context *ctx, const bki_call *c, const cu_par *k, bkc_args *a, char *base,
                           const cu_ws *w)
{
    const bk_attn_desc *d = c->d;
    memset(a, 0, sizeof *a);
    a->dtype = c->q->dtype;
    a->B = d->B; a->H = d->H; a->Nq = d->Nq; a->Nk = d->Nk; a->d = d->d; a->dv = d->dv;
    if (d->q_len || d->k_len) {
        if (d->B <= BKC_INLINE_B) {
            a->inl = 1;
            for (int b = 0; b < d->B; b++) {
                a->lq[b] = bki_len(d->q_len, b, d->Nq);
                a->lk[b] = bki_len(d->k_len, b, d->Nk);
            }
        } else { /* a staged copy (pageable host memory: ordered on the stream) */
            int32_t *l = malloc(2 * (size_t)d->B * sizeof(int32_t));
            if (!l) return bki_fail(BK_ERR_NOMEM, "CUDA backend: out of host memory for the lengths");
            for (int b = 0; b < d->B; b++) {
                l[b] = bki_len(d->q_len, b, d->Nq);
                l[d->B + b] = bki_len(d->k_len, b, d->Nk);
            }
            int32_t *dl = (int32_t *)(base + w->lens);
            const cudaError_t e = cudaMemcpyAsync(dl, l, 2 * (size_t)d->B * sizeof(int32_t), cudaMemcpyHostToDevice,
                                                  stream_of(ctx));
            free(l);
            if (e != cudaSuccess) return cuda_fail(e, "copying the lengths");
            a->qlen = dl;
            a->klen = dl + d->B;
        }
    }
    a->q = c->q->data; strides(c->q, a->sq);
    a->k = c->k->data; strides(c->k, a->sk);
    a->v = c->v->data; strides(c->v, a->sv);
    a->alpha = k->alpha;
    a->S = k->S;
    a->tol = k->tol;
    a->causal = k->causal;
    a->hist_len = (int64_t)bki_hist_len(d->Nq, d->Nk, k->S);
    a->iters = (int32_t *)(base + w->iters);
    a->stopped = (int32_t *)(base + w->stopped);
    a->err = (float *)(base + w->err);
    a->nkb = (d->Nk + BKC_TILE - 1) / BKC_TILE;
    return BK_OK;
}

/* the history lives in the tape (blocks after their headers) or the workspace */
static void place_hist(const bki_call *c, bkc_args *a, char *tape, char *base, const cu_ws *w)
{
    if (tape) {
        const size_t bt = (size_t)c->tape_hdr.block_bytes;
        a->blk = tape + sizeof(bki_tape_header);
        a->blk_stride = (int64_t)bt;
        a->hist = a->blk + sizeof(bki_block_header);
        a->hist_stride = (int64_t)bt;
    } else {
        a->blk = NULL;
        a->hist = base + w->hist;
        a->hist_stride = a->hist_len * (int64_t)sizeof(float);
    }
}

static bk_status launched(int e, const char *what)
{
    return e == 0 ? BK_OK : cuda_fail((cudaError_t)e, what);
}

/* the forward's launches into a prepared argument block: the tape zeroed and
 * its header written first when there is one (the output kept after its
 * blocks where the context asks for it and the tensor-core passes run), the
 * header noted in the context (the backward's check without a read-back) */
static bk_status run_forward(bk_context *ctx, const bki_call *c, bkc_args *a, char *tape)
{
    bki_tape_header th = c->tape_hdr;
    if (tape) {
        /* the whole tape is zeroed (its unused bytes too: tapes are
         * deterministic), the extra bytes included where the size had them */
        const size_t extra = tape_extra(ctx, (bki_call *)c);
        const size_t n = c->tape_bytes + extra;
        if (extra && bkc_tc_path(a->dtype)) {
            a->ot = tape_out(c, tape);
            th.flags |= BKI_TAPE_OUT;
        }
        cudaError_t e = cudaMemsetAsync(tape, 0, n, stream_of(ctx));
        if (e != cudaSuccess) return cuda_fail(e, "zeroing the tape");
        bk_status s = launched(bkc_put(tape, &th, sizeof th, stream_of(ctx)), "writing the tape header");
        if (s) return s;
    }
    const bk_status s = launched(bkc_forward(a, stream_of(ctx)), "the forward kernels");
    if (!s && tape) bki_ctx_tape_note(ctx, tape, &th, sizeof th);
    return s;
}

/* a call's host side: its workspace (the caller's, or the context's) and its
 * kernel arguments, with the history placed (in the tape, or the workspace) */
typedef struct {
    cu_ws w;
    void *owned;
    char *base;
    bkc_args a; /* about 2.3 KB: passed by value to every launch */
} cu_call;

static bk_status call_begin(bk_context *ctx, const bki_call *c, const cu_par *par, char *tape, void *ws,
                            size_t ws_size, int backward, cu_call *k)
{
    bk_status s;
    k->w = ws_layout(c, par, tape == NULL, backward);
    k->owned = NULL;
    if ((s = bki_workspace(ws, ws_size, k->w.total, "the operator's workspace_size function (with the CUDA context "
                                                    "current)", &k->owned, &k->base)))
        return s;
    k->base = (char *)(((uintptr_t)k->base + 255) & ~(uintptr_t)255);
    if ((s = fill_args(ctx, c, par, &k->a, k->base, &k->w))) return s;
    place_hist(c, &k->a, tape, k->base, &k->w);
    return BK_OK;
}

static bk_status call_end(cu_call *k, bk_status s)
{
    bki_workspace_release(k->owned); /* stream-ordered: freed after the kernels */
    if (s == BK_OK) bki_clear_error();
    return s;
}

static bk_status forward(bk_context *ctx, bki_call *c, const cu_par *par, void *tape, void *ws, size_t ws_size)
{
    bk_status s;
    if ((s = use_device(ctx))) return s;
    if ((s = check_call(ctx, c, par, 0, tape, ws))) return s;
    cu_call k;
    if (!(s = call_begin(ctx, c, par, tape, ws, ws_size, 0, &k))) {
        bkc_args *a = &k.a;
        a->out = c->out->data;
        strides(c->out, a->so);
        if (c->attn && c->attn->data) {
            a->attn = c->attn->data;
            strides(c->attn, a->sa);
        }
        if (par->ex) {
            const bk_sinkhorn_extras *ex = par->ex;
            a->f_out = ex->f;
            a->g_out = ex->g;
            if (ex->f) s = on_device(ctx, "extras.f", ex->f);
            if (!s && ex->g) s = on_device(ctx, "extras.g", ex->g);
        }
        if (!s) s = run_forward(ctx, c, a, tape);
    }
    return call_end(&k, s);
}

static bk_status backward(bk_context *ctx, bki_call *c, const cu_par *par, const void *tape, void *ws,
                          size_t ws_size)
{
    bk_status s;
    if ((s = use_device(ctx))) return s;
    if ((s = check_call(ctx, c, par, 1, tape, ws))) return s;
    bki_tape_header th;
    memset(&th, 0, sizeof th);
    if (tape) { /* the tape's header, checked on the host: as this context's
                   forward noted it, else (not noted, or a note of another
                   call: the memory may have been reused) read back, a
                   synchronisation */
        if (!bki_ctx_tape_known(ctx, tape, &th, sizeof th) || bki_tape_check(&c->tape_hdr, &th, par->name) != BK_OK) {
            cudaError_t e = cudaMemcpyAsync(&th, tape, sizeof th, cudaMemcpyDeviceToHost, stream_of(ctx));
            if (e == cudaSuccess) e = cudaStreamSynchronize(stream_of(ctx));
            if (e != cudaSuccess) return cuda_fail(e, "reading the tape header");
            if ((s = bki_tape_check(&c->tape_hdr, &th, par->name))) return s;
        }
    }
    cu_call k;
    if (!(s = call_begin(ctx, c, par, (char *)tape, ws, ws_size, 1, &k))) {
        bkc_args *a = &k.a;
        if (!tape) /* recompute the forward's potentials (no output); iters stay from it */
            s = run_forward(ctx, c, a, NULL);
        if (!s) {
            a->dout = c->dout->data; strides(c->dout, a->sdo);
            a->dq = c->dq->data; strides(c->dq, a->sdq);
            a->dk = c->dk->data; strides(c->dk, a->sdk);
            a->dvv = c->dv->data; strides(c->dv, a->sdv);
            a->adj = (float *)(k.base + k.w.adj);
            a->D = (float *)(k.base + k.w.D);
            if (c->q->dtype != BK_F32) {
                a->fac = (float *)(k.base + k.w.fac);
                a->fact = (int32_t *)(k.base + k.w.fact);
            }
            if (tape && (th.flags & BKI_TAPE_OUT) && bkc_tc_path(a->dtype)) a->ot = tape_out(c, tape);
            s = launched(bkc_backward(a, stream_of(ctx)), "the backward kernels");
        }
    }
    return call_end(&k, s);
}

/* ---- the registered operators: softmax and Sinkhorn --------------------- */
static bk_status softmax_forward(bk_context *ctx, bki_call *c, void *tape, void *ws, size_t ws_size)
{
    const cu_par k = softmax_par(c);
    return forward(ctx, c, &k, tape, ws, ws_size);
}

static bk_status softmax_backward(bk_context *ctx, bki_call *c, const void *tape, void *ws, size_t ws_size)
{
    const cu_par k = softmax_par(c);
    return backward(ctx, c, &k, tape, ws, ws_size);
}

static bk_status sinkhorn_forward(bk_context *ctx, bki_call *c, void *tape, void *ws, size_t ws_size)
{
    const cu_par k = sinkhorn_par(c);
    return forward(ctx, c, &k, tape, ws, ws_size);
}

static bk_status sinkhorn_backward(bk_context *ctx, bki_call *c, const void *tape, void *ws, size_t ws_size)
{
    const cu_par k = sinkhorn_par(c);
    return backward(ctx, c, &k, tape, ws, ws_size);
}

static const bki_kernel kernels[] = {
    {"softmax", softmax_forward, softmax_backward, softmax_workspace, tape_extra},
    {"sinkhorn", sinkhorn_forward, sinkhorn_backward, sinkhorn_workspace, tape_extra},
};

const bki_backend bki_backend_cuda = {"cuda", BK_BACKEND_CUDA, available, alloc, release, copy,
                                      kernels, (int)(sizeof kernels / sizeof kernels[0])};
