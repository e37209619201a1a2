/* driver.c -- the one driver of every attention operator (op.h), and of
 * OTK's set embedding (an operator whose problems are sets: op->check_io): the
 * (operator, backend) entry of the current context's backend
 * (bki_backend_kernel), common argument checks, and for the host path the
 * plan, the workspace (per-call area, parameter-gradient slabs, lanes, and a
 * temporary tape for a backward without one), the tape format, the parallel
 * region over the problems (bki_run_problems), errors. */
#include "op.h"
#include "../backend/backend.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static int desc_sane(const bk_attn_desc *d)
{
    return d && d->B >= 1 && d->H >= 1 && d->Nq >= 1 && d->Nk >= 1 && d->d >= 1 && d->dv >= 1;
}

size_t bki_op_call_total(const bki_call *c)
{
    return c->op->call_bytes ? bki_round_up(c->op->call_bytes(c)) : 0;
}

size_t bki_op_block_total(const bki_call *c)
{
    return sizeof(bki_block_header) + bki_round_up(c->op->block_bytes(c));
}

size_t bki_op_tape_size(bki_call *c)
{
    if (!desc_sane(c->d) || !c->par) return 0;
    return sizeof(bki_tape_header) + bki_op_call_total(c) + (size_t)c->d->B * c->d->H * bki_op_block_total(c);
}

/* an operator whose problems are not attention problems (op->check_io) runs
 * on the host path in any context */
static int host_only(const bki_call *c) { return c->op->check_io != NULL; }

static void for_backend(bki_call *c); /* (below) */

size_t bki_op_tape_size_query(bki_call *c)
{
    if (!desc_sane(c->d) || !c->par) return 0;
    /* the scalar parameters decide the block size; arrays are not read */
    const int mode = c->ws_mode;
    c->ws_mode = 1;
    const bk_status s = c->op->check(c);
    c->ws_mode = mode;
    if (s != BK_OK) {
        bki_clear_error();
        return 0;
    }
    /* a device backend may keep more after the blocks (its extra, with the
     * context that runs the forward current) */
    bk_context *ctx = bki_ctx();
    const bki_kernel *kn = host_only(c) ? NULL : bki_backend_kernel(bki_ctx_backend(ctx), c->op->name);
    if (kn && kn->tape_extra) for_backend(c);
    return bki_op_tape_size(c) + (kn && kn->tape_extra ? kn->tape_extra(ctx, c) : 0);
}

void bki_op_export_attn(const bki_team *tm, const bki_call *c, int p, const float *A, int lda, int Lq, int Lk)
{
    if (!c->attn || !c->attn->data) return;
    const bk_attn_desc *d = c->d;
    float *Ab = bki_at(c->attn, p / d->H, p % d->H);
    const int live = Lq > 0 && Lk > 0;
    /* row blocks claimed at run time (internal.h); no sync */
    const int rb = bki_row_block(d->Nq);
    bki_claims cl = bki_claims_open(tm, bki_nblocks(d->Nq, rb));
    for (int64_t blk; bki_claims_next(&cl, &blk);) {
        const int i0 = (int)blk * rb, i1 = i0 + rb < d->Nq ? i0 + rb : d->Nq;
        for (int i = i0; i < i1; i++) {
            float *row = Ab + (int64_t)i * c->attn->stride_n;
            if (live && i < Lq) {
                memcpy(row, A + (size_t)i * lda, sizeof(float) * (size_t)Lk);
                memset(row + Lk, 0, sizeof(float) * (size_t)(d->Nk - Lk));
            } else {
                memset(row, 0, sizeof(float) * (size_t)d->Nk);
            }
        }
    }
}

bki_block_header *bki_op_block(const bki_call *c, int p)
{
    return (bki_block_header *)(c->tape + sizeof(bki_tape_header) + bki_op_call_total(c) +
                                (size_t)p * bki_op_block_total(c));
}

/* ---- workspace ------------------------------------------------------------
 * [per-call area][P parameter-gradient slabs (backward)][lanes][tape] */
typedef struct {
    size_t prep, pgrad, lanes, tape, total;
} ws_layout;

static ws_layout layout(bki_call *c, int backward, int with_tape)
{
    const int P = c->d->B * c->d->H;
    ws_layout w;
    c->pl = bki_plan_problems(P, c->op->cost(c));
    c->lane_bytes = bki_round_up(c->op->lane_bytes(c, c->pl.team ? c->pl.nt : 1));
    w.prep = c->op->prep_bytes ? bki_round_up(c->op->prep_bytes(c)) : 0;
    w.pgrad = backward && c->op->pgrad_bytes ? (size_t)P * bki_round_up(c->op->pgrad_bytes(c)) : 0;
    w.lanes = (size_t)c->pl.lanes * c->lane_bytes;
    w.tape = with_tape ? bki_round_up(bki_op_tape_size(c)) : 0;
    w.total = w.prep + w.pgrad + w.lanes + w.tape + BK_ALIGN;
    return w;
}

size_t bki_op_workspace_size(bki_call *c)
{
    if (!desc_sane(c->d) || !c->par) return 0;
    c->ws_mode = 1;
    if (c->op->check(c) != BK_OK) {
        bki_clear_error();
        return 0;
    }
    /* a backend without the operator: none; a device backend sizes its own
     * (device memory) */
    bk_context *ctx = bki_ctx();
    const bki_kernel *kn = bki_backend_kernel(bki_ctx_backend(ctx), c->op->name);
    if (!kn && !host_only(c)) return 0;
    if (kn && !host_only(c) && kn->workspace_size) {
        for_backend(c);
        return kn->workspace_size(ctx, c);
    }
    /* the larger of a forward and a backward that recomputes its tape */
    const size_t f = layout(c, 0, 0).total;
    const size_t b = c->op->backward ? layout(c, 1, 1).total : 0;
    return f > b ? f : b;
}

static void carve(bki_call *c, const ws_layout *w, char *base)
{
    char *p = bki_align_ptr(base);
    c->prep = w->prep ? p : NULL;
    p += w->prep;
    c->pgrad = w->pgrad ? p : NULL;
    p += w->pgrad;
    c->lanes = p;
    p += w->lanes;
    if (w->tape) c->tape = p;
}

/* ---- the region ------------------------------------------------------------ */
typedef struct {
    bki_call *c;
    int backward;
    int check; /* scan each problem's results after it (see "results" below) */
} run_ctx;

/* problem p's results in the valid rows are finite: its output (forward),
 * or dq, dk and dv (backward) */
static int problem_finite(const bki_call *c, int p, int backward)
{
    const bk_attn_desc *d = c->d;
    const int b = p / d->H, h = p % d->H, Lq = bki_op_lq(c, p), Lk = bki_op_lk(c, p);
    if (!backward) return bki_rows_finite(bki_at(c->out, b, h), c->out->stride_n, Lq, d->dv);
    return bki_rows_finite(bki_at(c->dq, b, h), c->dq->stride_n, Lq, d->d) &&
           bki_rows_finite(bki_at(c->dk, b, h), c->dk->stride_n, Lk, d->d) &&
           bki_rows_finite(bki_at(c->dv, b, h), c->dv->stride_n, Lk, d->dv);
}

static void one(const bki_team *tm, int p, char *lane, void *vctx)
{
    run_ctx *x = vctx;
    if (x->backward) x->c->op->backward(tm, x->c, p, lane);
    else x->c->op->forward(tm, x->c, p, lane);
    if (!x->check) return;
    /* the problem's results while they are in cache: by the thread that
     * computed them, or a team's member 0 once the team is done */
    if (tm->nt > 1) bki_team_sync(tm);
    if (tm->tid == 0 && !problem_finite(x->c, p, x->backward)) bki_op_fail(x->c, p, BK_ERR_OVERFLOW);
}

/* whether a call's results are checked in its region (see "results") */
static int checks_results(const bki_call *c, int backward)
{
    const bk_tensor *t = backward ? c->dq : c->out;
    return !host_only(c) && !c->trusted && t && t->data && t->device == BK_DEVICE_HOST &&
           (!backward || (c->dk && c->dk->device == BK_DEVICE_HOST && c->dv && c->dv->device == BK_DEVICE_HOST));
}

/* the host path's region: the operator's kernels over the problems */
static void run(bki_call *c, int backward)
{
    run_ctx x = {c, backward, checks_results(c, backward)};
    bki_run_problems(c->pl, c->d->B * c->d->H, c->lanes, c->lane_bytes, one, &x);
}

/* what a backend's kernel entry reads besides the call's arguments: the
 * tape header a forward of the call writes and the operator's tape size
 * (call.h; the parameters are checked) */
static void for_backend(bki_call *c)
{
    bki_op_tape_header(c, &c->tape_hdr);
    c->tape_bytes = bki_op_tape_size(c);
}

/* The current context's backend runs the operator: its entry for the
 * operator with its own forward/backward runs the whole call (a device
 * backend) after the checks every backend shares (the descriptor, the
 * parameters: the operator's own check); the host path (*done = 0) is the
 * rest of the driver. A backend without the operator: the call fails, no
 * data is moved behind the caller's back. *done = 1 when the backend ran it. */
static bk_status on_backend(bki_call *c, int backward, const void *tape, void *ws, size_t ws_size, int *done)
{
    bk_context *ctx = bki_ctx();
    const bki_backend *be = bki_ctx_backend(ctx);
    const bki_kernel *kn = bki_backend_kernel(be, c->op->name);
    bk_status s;
    *done = 0;
    if (!kn)
        return bki_fail(BK_ERR_UNSUPPORTED, "%s is not implemented on the %s backend (the current context's); run it "
                                            "in a context whose backend has it (bk_context_use)", c->op->name, be->name);
    if (!(backward ? kn->backward != NULL : kn->forward != NULL)) return BK_OK;
    *done = 1;
    if ((s = bki_check_desc(c->d))) return s;
    if (!c->par) return bki_fail(BK_ERR_NULL, "%s: the parameters are NULL", c->op->par_name);
    if ((s = c->op->check(c))) return s;
    for_backend(c);
    return backward ? kn->backward(ctx, c, tape, ws, ws_size) : kn->forward(ctx, c, (void *)tape, ws, ws_size);
}

/* failures are rare: one lock for all calls keeps (bad, bad_s) a pair */
static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;

void bki_op_fail(bki_call *c, int p, bk_status s)
{
    pthread_mutex_lock(&fail_mu);
    if (p < c->bad) {
        c->bad = p;
        c->bad_s = s;
    }
    pthread_mutex_unlock(&fail_mu);
}

void bki_op_suspect(bki_call *c) { __atomic_store_n(&c->suspect, 1, __ATOMIC_RELAXED); }

/* the values of the inputs a call reads: q, k, v (unless they are the
 * library's own activations) and, in a backward, dout */
static bk_status scan_inputs(const bki_call *c, int backward)
{
    const int t = c->trusted;
    return bki_check_values(c->d, t ? NULL : c->q, t ? NULL : c->k, t ? NULL : c->v, backward ? c->dout : NULL);
}

static bk_status problem_overflow(const bki_call *c, int p); /* (results, below) */

static bk_status problem_error(const bki_call *c)
{
    const int b = c->bad / c->d->H, h = c->bad % c->d->H;
    if (c->bad_s == BK_ERR_NONFINITE)
        return bki_fail(c->bad_s, "%s: problem %d (b=%d, h=%d) produced non-finite values", c->op->name, c->bad, b, h);
    if (c->bad_s == BK_ERR_OVERFLOW) return problem_overflow(c, c->bad);
    if (c->bad_s == BK_ERR_NUMERIC)
        return bki_fail(c->bad_s, "backward failed on problem %d (b=%d, h=%d): the implicit system could not be solved "
                                  "(is the forward converged?)", c->bad, b, h);
    return bki_fail(c->bad_s, "%s: problem %d (b=%d, h=%d) failed: %s", c->op->name, c->bad, b, h,
                    bk_status_str(c->bad_s));
}

/* after a region: the scan an operator's own passes replaced (when they saw
 * a non-finite value), then the lowest failing problem */
static bk_status region_status(const bki_call *c, int backward)
{
    bk_status s;
    if (c->suspect && (s = scan_inputs(c, backward))) return s;
    return c->bad < c->d->B * c->d->H ? problem_error(c) : BK_OK;
}

/* ---- results ---------------------------------------------------------------
 * Every input of a call is finite (scanned, or the model's own activations),
 * so a non-finite result means a value overflowed float32: the scores
 * (scale/eps) q.k beyond 3.4e38, their sums, A V, or a gradient. The call
 * then fails with BK_ERR_OVERFLOW instead of returning NaN or Inf with
 * BK_OK. Each problem's results (its output, or dq, dk, dv) are read once
 * right after the problem, while in cache (one(): O(N d) per problem, never
 * O(N^2); a team adds one barrier), the lowest failing problem reported as
 * any problem's failure; the parameter gradients after their reduction. Not
 * scanned: results in device memory (a device backend runs its own driver;
 * docs/CUDA.md, "Limits") and the model's calls (trusted: its logits are
 * checked). */

/* the largest Euclidean norm of problem p's first L rows of t (C floats) */
static double max_row_norm(const bk_tensor *t, int H, int p, int L, int C)
{
    const float *base = bki_at(t, p / H, p % H);
    double m = 0.0;
    for (int n = 0; n < L; n++) {
        double s = 0.0;
        for (int j = 0; j < C; j++) {
            const double x = base[(int64_t)n * t->stride_n + j];
            s += x * x;
        }
        m = fmax(m, sqrt(s));
    }
    return m;
}

/* BK_ERR_OVERFLOW for problem p, whose result `what` is not finite; the
 * sizes that decide the scores in the message (the failure path only) */
static bk_status overflow_error(const bki_call *c, int p, const char *what)
{
    const bk_attn_desc *d = c->d;
    const int Lq = bki_op_lq(c, p), Lk = bki_op_lk(c, p);
    const double qk = max_row_norm(c->q, d->H, p, Lq, d->d) * max_row_norm(c->k, d->H, p, Lk, d->d);
    const double vn = max_row_norm(c->v, d->H, p, Lk, d->dv);
    return bki_fail(BK_ERR_OVERFLOW,
                    "%s: %s of problem %d (b=%d, h=%d) is not finite although every input is: a value overflowed "
                    "float32 (the scores (scale/eps) q.k, their sums or A V; here max |q_i| |k_j| = %.3g before "
                    "scale/eps, max |v_j| = %.3g; float32 ends at 3.4e+38): reduce |q|, |k|, |v| or the scale, or "
                    "raise eps",
                    c->op->name, what, p, p / d->H, p % d->H, qk, vn);
}

/* the message of problem p's BK_ERR_OVERFLOW (which result: the failure path
 * looks again) */
static bk_status problem_overflow(const bki_call *c, int p)
{
    if (c->out) return overflow_error(c, p, "the output");
    const bk_attn_desc *d = c->d;
    const int b = p / d->H, h = p % d->H, Lq = bki_op_lq(c, p);
    return overflow_error(c, p, !bki_rows_finite(bki_at(c->dq, b, h), c->dq->stride_n, Lq, d->d) ? "the gradient dq"
                                : !bki_rows_finite(bki_at(c->dk, b, h), c->dk->stride_n, bki_op_lk(c, p), d->d)
                                    ? "the gradient dk"
                                    : "the gradient dv");
}

/* the parameter gradients, after their reduction over the problems */
static bk_status check_param_grads(const bki_call *c)
{
    if (c->trusted) return BK_OK;
    bki_farray pa[2];
    const int np = c->pg && c->op->pg_arrays ? c->op->pg_arrays(c, pa) : 0;
    for (int i = 0; i < np; i++) {
        const size_t j = bki_first_nonfinite_array(pa[i].data, pa[i].n);
        if (j < pa[i].n)
            return bki_fail(BK_ERR_OVERFLOW,
                            "%s: the parameter gradient %s is not finite at %zu although every input is: a value "
                            "overflowed float32 (the scores, their sums or the gradient's sum over the batch): "
                            "reduce |q|, |k|, |v|, |dout| or the scale, or raise eps",
                            c->op->name, pa[i].name, j);
    }
    return BK_OK;
}

#ifdef BK_TAPE_CHECKSUM
/* of the per-call section and the blocks */
static uint64_t blocks_checksum(const bki_call *c)
{
    const size_t n = bki_op_call_total(c) + (size_t)c->d->B * c->d->H * bki_op_block_total(c);
    return bki_fnv1a(BKI_FNV_OFFSET, c->tape + sizeof(bki_tape_header), n);
}
#endif

/* ---- forward -------------------------------------------------------------- */
/* The header is read and written through a local copy: a caller's tape needs
 * only float alignment, the header has 64-bit fields. */
void bki_op_tape_header(const bki_call *c, bki_tape_header *th)
{
    memset(th, 0, sizeof *th);
    th->magic = BKI_TAPE_MAGIC;
    th->version = BKI_TAPE_VERSION;
    th->op = c->op->id;
    th->B = c->d->B; th->H = c->d->H; th->Nq = c->d->Nq; th->Nk = c->d->Nk; th->d = c->d->d; th->dv = c->d->dv;
    th->key = c->op->key(c);
    th->block_bytes = bki_op_block_total(c);
    th->call_lines = (uint32_t)(bki_op_call_total(c) / BK_ALIGN);
}

static void write_header(bki_call *c)
{
    bki_tape_header th;
    memset(c->tape, 0, bki_op_tape_size(c)); /* padding and unused history are zero: tapes are deterministic */
    bki_op_tape_header(c, &th);
    memcpy(c->tape, &th, sizeof th);
    if (bki_op_call_total(c)) memcpy(c->tape + sizeof th, c->prep, c->op->call_bytes(c)); /* prepare's */
    const int P = c->d->B * c->d->H;
    for (int p = 0; p < P; p++) {
        bki_block_header *h = bki_op_block(c, p);
        h->Lq = bki_op_lq(c, p);
        h->Lk = bki_op_lk(c, p);
    }
}

/* the forward into c->tape (NULL: the operator keeps none), with c->out and
 * c->ex as given; the workspace is carved already */
static bk_status forward_region(bki_call *c)
{
    bk_status s;
    c->call_sec = NULL;
    if (c->op->prepare && (s = c->op->prepare(c))) return s;
    if (c->tape) write_header(c);
    c->bad = c->d->B * c->d->H;
    c->suspect = 0;
    run(c, 0);
    if ((s = c->op->check_results ? c->op->check_results(c, 0) : region_status(c, 0))) return s;
#ifdef BK_TAPE_CHECKSUM
    if (c->tape) {
        const uint64_t sum = blocks_checksum(c);
        memcpy(c->tape + offsetof(bki_tape_header, checksum), &sum, sizeof sum);
    }
#endif
    return BK_OK;
}

/* the descriptor, the parameters and the arrays of a forward or a backward */
static bk_status check_call(bki_call *c, int backward)
{
    bk_status s;
    if (!host_only(c) && (s = bki_check_desc(c->d))) return s;
    if (!c->par) return bki_fail(BK_ERR_NULL, "%s: the parameters are NULL", c->op->par_name);
    if ((s = c->op->check(c))) return s;
    if (c->op->check_io) return c->op->check_io(c, backward);
    if ((s = bki_check_qkv_shape(c->d, c->q, c->k, c->v))) return s;
    if (!c->op->finds_nonfinite && (s = scan_inputs(c, 0))) return s;
    if (!backward) return bki_check_fwd_outputs(c->d, c->q, c->k, c->v, c->out, c->attn);
    if ((s = bki_check_bwd_views(c->d, c->q, c->k, c->v, c->dout, c->dq, c->dk, c->dv))) return s;
    return c->op->finds_nonfinite ? BK_OK : bki_check_values(c->d, NULL, NULL, NULL, c->dout);
}

bk_status bki_op_forward(bki_call *c, void *tape, void *ws, size_t ws_size)
{
    bk_status s;
    int done;
    if (!host_only(c) && ((s = on_backend(c, 0, tape, ws, ws_size, &done)) || done)) return s;
    if ((s = check_call(c, 0))) return s;
    const ws_layout w = layout(c, 0, 0);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(ws, ws_size, w.total, "the operator's workspace_size function", &owned, &base))) return s;
    carve(c, &w, base);
    c->tape = tape;
    s = forward_region(c);
    bki_workspace_release(owned);
    if (s == BK_OK) bki_clear_error();
    return s;
}

/* ---- backward ------------------------------------------------------------- */
bk_status bki_op_check_tape_header(const bki_call *c, const bki_tape_header *th)
{
    bki_tape_header want;
    bki_op_tape_header(c, &want);
    return bki_tape_check(&want, th, c->op->name);
}

static bk_status check_tape(bki_call *c, const void *tape)
{
    bki_tape_header hdr;
    memcpy(&hdr, tape, sizeof hdr);
    const bki_tape_header *th = &hdr;
    const bk_attn_desc *d = c->d;
    bk_status s;
    if ((s = bki_op_check_tape_header(c, th))) return s;
    c->tape = (char *)tape;
#ifdef BK_TAPE_CHECKSUM
    if (th->checksum != blocks_checksum(c)) return bki_fail(BK_ERR_TAPE, "tape checksum mismatch (corrupt tape)");
#endif
    const int P = d->B * d->H;
    for (int p = 0; p < P; p++) {
        const bki_block_header *h = bki_op_block(c, p);
        const int Lq = bki_op_lq(c, p), Lk = bki_op_lk(c, p);
        int ok = h->Lq == Lq && h->Lk == Lk;
        if (ok && c->op->steps_ok) ok = c->op->steps_ok(c, h);
        if (!ok) return bki_fail(BK_ERR_TAPE, "tape block %d does not match the lengths or is corrupt", p);
    }
    return BK_OK;
}

bk_status bki_op_backward(bki_call *c, const void *tape, void *ws, size_t ws_size)
{
    bk_status s;
    int done;
    if (!c->op->backward) return bki_fail(BK_ERR_PARAM, "%s has no backward (inference only)", c->op->name);
    if (!host_only(c) && ((s = on_backend(c, 1, tape, ws, ws_size, &done)) || done)) return s;
    if ((s = check_call(c, 1))) return s;
    if (tape && (s = check_tape(c, tape))) return s;
    const ws_layout w = layout(c, 1, tape == NULL);
    void *owned = NULL;
    char *base = NULL;
    if ((s = bki_workspace(ws, ws_size, w.total, "the operator's workspace_size function", &owned, &base))) return s;
    carve(c, &w, base);
    if (!tape) { /* recompute the forward's tape */
        bki_call f = *c;
        f.out = NULL;
        f.attn = NULL;
        f.ex = NULL;
        if ((s = forward_region(&f))) {
            bki_workspace_release(owned);
            return s;
        }
    } else {
        c->tape = (char *)tape;
    }
    c->call_sec = c->tape + sizeof(bki_tape_header);
    if (c->op->prepare && (s = c->op->prepare(c))) {
        bki_workspace_release(owned);
        return s;
    }
    c->bad = c->d->B * c->d->H;
    c->suspect = 0;
    run(c, 1);
    if (!c->op->check_results && (s = region_status(c, 1))) {
        bki_workspace_release(owned);
        return s;
    }
    if (c->op->reduce) c->op->reduce(c);
    bki_workspace_release(owned);
    if ((s = c->op->check_results ? c->op->check_results(c, 1) : check_param_grads(c))) return s;
    bki_clear_error();
    return BK_OK;
}
