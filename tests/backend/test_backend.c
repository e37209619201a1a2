/* test_backend.c -- execution contexts and the backend seam
 * (include/birkhoff/context.h, src/backend/): the default context, contexts
 * and their thread counts, allocators and the workspace cache, device
 * backends that are not in this build, and a backend lacking operators
 * (calls refused with BK_ERR_UNSUPPORTED, never run elsewhere). */
#include "../../src/backend/backend.h"
#include "../../src/ops/op.h"
#include "birkhoff.h"
#include "../harness.h"
#include "../tutil.h"

#include <stdlib.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int allocs, frees;
    size_t bytes;
} counter;

static void *count_alloc(size_t n, void *u)
{
    counter *c = u;
    c->allocs++;
    c->bytes += n;
    return malloc(n);
}

static void count_free(void *p, void *u)
{
    counter *c = u;
    c->frees++;
    free(p);
}

/* one Sinkhorn forward + backward on fixed data, workspace from the library */
typedef struct {
    th_prob pb;
    bk_sinkhorn_config p;
    bk_status s1, s2;
} run_t;

static void run_init(run_t *r, uint64_t seed)
{
    th_rng g = {seed};
    th_prob_init(&r->pb, 2, 3, 40, 36, 8, 6, 0, 1, 1.0, &g);
    r->p = bk_sinkhorn_config_default();
}

static void run_once(run_t *r)
{
    void *tape = malloc(bk_sinkhorn_tape_size(&r->pb.desc, &r->p));
    r->s1 = bk_sinkhorn_forward(&r->pb.desc, &r->p, &r->pb.tq, &r->pb.tk, &r->pb.tv, &r->pb.to, tape, NULL, NULL, 0);
    r->s2 = bk_sinkhorn_backward(&r->pb.desc, &r->p, &r->pb.tq, &r->pb.tk, &r->pb.tv, &r->pb.tdo, tape, &r->pb.tdq,
                                 &r->pb.tdk, &r->pb.tdv, NULL, 0);
    free(tape);
}

static int same_outputs(const run_t *a, const run_t *b)
{
    const size_t nq = (size_t)2 * 3 * 40, nk = (size_t)2 * 3 * 36;
    return !memcmp(a->pb.o, b->pb.o, sizeof(float) * nq * 6) && !memcmp(a->pb.dq, b->pb.dq, sizeof(float) * nq * 8) &&
           !memcmp(a->pb.dk, b->pb.dk, sizeof(float) * nk * 8) && !memcmp(a->pb.dv, b->pb.dv, sizeof(float) * nk * 6);
}

/* a backend that runs the Sinkhorn family only: every other operator must be
 * refused, not run on the CPU behind the caller's back */
static const bki_kernel sinkhorn_family[] = {
    {"softmax", NULL, NULL, NULL, NULL}, {"sinkhorn", NULL, NULL, NULL, NULL}, {"unbalanced", NULL, NULL, NULL, NULL}};

/* a backend that keeps 777 bytes after every operator's tape */
static size_t extra_777(bk_context *ctx, bki_call *c)
{
    (void)ctx;
    (void)c;
    return 777;
}
static const bki_kernel with_extra[] = {{NULL, NULL, NULL, NULL, extra_777}}; /* every operator, host path */

/* the notes of the tapes a context's forwards wrote (a device backward's
 * check without a read-back), and a backend's bytes after the tape */
static void tape_notes_test(void)
{
    bk_context *ctx = NULL;
    if (!th_check(bki_context_with_backend(&bki_backend_cpu, &ctx) == BK_OK, "a context for the tape notes", "%s",
                  bk_last_error()))
        return;
    static char slot[70];
    bki_tape_header h, g;
    for (int i = 0; i < 70; i++) {
        memset(&h, 0, sizeof h);
        h.B = i;
        bki_ctx_tape_note(ctx, slot + i, &h, sizeof h);
    }
    int ok = 1, first_bad = -1;
    for (int i = 0; i < 70; i++) {
        memset(&g, 0xff, sizeof g);
        const int found = bki_ctx_tape_known(ctx, slot + i, &g, sizeof g);
        const int good = i < 70 - BKI_TAPE_NOTES ? !found : found && g.B == i && g.H == 0;
        if (!good && first_bad < 0) first_bad = i;
        ok &= good;
    }
    th_check(ok, "tape notes: the last BKI_TAPE_NOTES tapes with their headers, the older forgotten",
             "first wrong: tape %d", first_bad);
    memset(&h, 0, sizeof h);
    h.B = 1000;
    bki_ctx_tape_note(ctx, slot + 69, &h, sizeof h);
    th_check(bki_ctx_tape_known(ctx, slot + 69, &g, sizeof g) && g.B == 1000, "a tape noted again: its newest header",
             "B = %d", g.B);
    th_check(!bki_ctx_tape_known(ctx, NULL, &g, sizeof g) && !bki_ctx_tape_known(ctx, slot + 3, &g, sizeof g),
             "NULL and a forgotten tape are not known", "%s", "");
    bk_context_free(ctx);

    /* the tape size queries add a backend's extra with its context current */
    bki_backend ext = bki_backend_cpu;
    ext.name = "extra";
    ext.kernels = with_extra;
    ext.nkernels = 1;
    bk_attn_desc d = {.B = 1, .H = 2, .Nq = 8, .Nk = 6, .d = 4, .dv = 4};
    bk_sinkhorn_config p = bk_sinkhorn_config_default();
    const size_t base = bk_sinkhorn_tape_size(&d, &p), sbase = bk_softmax_tape_size(&d);
    if (th_check(bki_context_with_backend(&ext, &ctx) == BK_OK, "a context with a tape extra", "%s", bk_last_error())) {
        bk_context *prev = bk_context_use(ctx);
        const size_t with = bk_sinkhorn_tape_size(&d, &p), swith = bk_softmax_tape_size(&d);
        bk_context_use(prev);
        th_check(base > 0 && with == base + 777 && swith == sbase + 777 && bk_sinkhorn_tape_size(&d, &p) == base,
                 "tape sizes: the current context's backend extra added, none elsewhere",
                 "base %zu with %zu, softmax %zu / %zu", base, with, sbase, swith);
        bk_context_free(ctx);
    }
}

void test_backend(void)
{
    /* the default context */
    bk_context *def = bk_context_default();
    th_check(bk_context_current() == def && bk_context_backend(def) == BK_BACKEND_CPU &&
                 !strcmp(bk_context_backend_name(def), "cpu") && bk_context_threads(def) == bk_get_num_threads(),
             "the default context is current: CPU, the library's thread count", "%s", bk_context_backend_name(def));
    bk_set_num_threads(3);
    th_check(bk_context_threads(def) == 3 && bk_get_num_threads() == 3, "bk_set_num_threads sets the default's count",
             "%d", bk_context_threads(def));
    bk_set_num_threads(0);
    int all = 1;
    for (int i = 0; i < bk_op_count(); i++) all &= bk_context_supports(def, bk_op_name(bk_op_at(i)));
    th_check(all && !bk_context_supports(def, "nope"), "the CPU backend runs every registered operator", "%s", "");

    /* host memory: 64-byte aligned, 2 MiB aligned from 2 MiB on, every byte writable; bk_free(NULL) */
    {
        const size_t sizes[] = {0, 1, 100, (size_t)2 << 20, ((size_t)3 << 20) + 5};
        int ok = 1;
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            unsigned char *p = bk_alloc(sizes[i]);
            const uintptr_t a = (uintptr_t)p;
            ok &= p != NULL && a % 64 == 0 && (sizes[i] < ((size_t)2 << 20) || a % ((size_t)2 << 20) == 0);
            if (p && sizes[i]) {
                memset(p, 0x5a, sizes[i]);
                ok &= p[0] == 0x5a && p[sizes[i] - 1] == 0x5a;
            }
            bk_free(p);
        }
        bk_free(NULL);
        th_check(ok, "bk_alloc: aligned (2 MiB from 2 MiB on), writable, freed by bk_free", "%s", "");
    }

    /* configurations refused */
    bk_context_config cfg = bk_context_config_default();
    bk_context *ctx = NULL;
    cfg.backend = BK_BACKEND_CUDA;
    bk_status s = bk_context_create(&cfg, &ctx);
    if (!bk_backend_built(BK_BACKEND_CUDA))
        th_check(s == BK_ERR_UNSUPPORTED && ctx == NULL && strstr(bk_last_error(), "not in this build"),
                 "a CUDA context in a build without CUDA: BK_ERR_UNSUPPORTED with a message", "%s: %s",
                 bk_status_str(s), bk_last_error());
    else if (s != BK_OK) /* built, no usable device here: says why */
        th_check(s == BK_ERR_UNSUPPORTED && ctx == NULL && strstr(bk_last_error(), "not usable"),
                 "a CUDA context without a usable device: BK_ERR_UNSUPPORTED with the reason", "%s: %s",
                 bk_status_str(s), bk_last_error());
    else
        th_check(bk_context_backend(ctx) == BK_BACKEND_CUDA && !strcmp(bk_context_backend_name(ctx), "cuda") &&
                     bk_context_supports(ctx, "sinkhorn") && bk_context_supports(ctx, "softmax") &&
                     !bk_context_supports(ctx, "lot"),
                 "a CUDA context: softmax and sinkhorn, nothing else", "%s", bk_context_backend_name(ctx));
    bk_context_free(ctx);
    ctx = NULL;
    th_check(bk_backend_built(BK_BACKEND_CPU) && !bk_backend_built((bk_backend)7), "bk_backend_built", "%s", "");
    cfg = bk_context_config_default();
    cfg.threads = -1;
    th_check(bk_context_create(&cfg, &ctx) == BK_ERR_PARAM && !ctx, "negative threads refused", "%s", bk_last_error());
    cfg = bk_context_config_default();
    cfg.allocator.alloc = count_alloc;
    th_check(bk_context_create(&cfg, &ctx) == BK_ERR_PARAM, "an allocator without its free refused", "%s",
             bk_last_error());
    cfg = bk_context_config_default();
    cfg.device = 1;
    th_check(bk_context_create(&cfg, &ctx) == BK_ERR_UNSUPPORTED, "CPU device 1 refused", "%s", bk_last_error());
    th_check(bk_context_create(NULL, &ctx) == BK_ERR_NULL, "NULL config refused", "%s", bk_last_error());

    /* a context's threads, allocator and cache; results identical to the default's */
    run_t ref, r;
    run_init(&ref, 5);
    run_once(&ref);
    counter cnt = {0, 0, 0};
    cfg = bk_context_config_default();
    cfg.threads = 3;
    cfg.allocator.alloc = count_alloc;
    cfg.allocator.free = count_free;
    cfg.allocator.user = &cnt;
    s = bk_context_create(&cfg, &ctx);
    if (th_check(s == BK_OK && ctx, "a CPU context with 3 threads and an allocator", "%s", bk_last_error())) {
        bk_context *prev = bk_context_use(ctx);
        run_init(&r, 5);
        run_once(&r);
        th_check(prev == def && bk_get_num_threads() == 3 && bk_context_current() == ctx,
                 "bk_context_use: the context is current, its thread count in force", "%d", bk_get_num_threads());
        th_check(r.s1 == BK_OK && r.s2 == BK_OK && same_outputs(&ref, &r),
                 "results in a 3-thread context == the default context's, bitwise", "%s", "");
        th_check(cnt.allocs == 2 && cnt.frees == 2, "workspaces come from the context's allocator (one per call)",
                 "%d allocations, %d frees", cnt.allocs, cnt.frees);
        th_prob_free(&r.pb);
        bk_context_use(prev);
        th_check(bk_context_current() == def, "bk_context_use(previous) restores it", "%s", "");
        bk_context_free(ctx);
    }
    /* the workspace cache: one allocation for many calls, freed with the context */
    cnt = (counter){0, 0, 0};
    cfg.threads = 0;
    cfg.cache_workspace = 1;
    if (bk_context_create(&cfg, &ctx) == BK_OK) {
        bk_context_use(ctx);
        run_init(&r, 5);
        for (int i = 0; i < 4; i++) run_once(&r);
        const int during = cnt.frees;
        th_check(same_outputs(&ref, &r) && cnt.allocs == 1 && during == 0,
                 "the workspace cache: one allocation for 8 calls, results unchanged", "%d allocations", cnt.allocs);
        bk_context_free(ctx); /* current on this thread: falls back to the default */
        th_check(cnt.frees == 1 && bk_context_current() == def,
                 "bk_context_free releases the cache; the thread falls back to the default", "%d frees", cnt.frees);
        th_prob_free(&r.pb);
    }

    /* tensors carry their device: one that lives elsewhere than the current
     * context computes is refused before anything is written */
    run_init(&r, 5);
    {
        bk_tensor qd = r.pb.tq;
        qd.device = BK_DEVICE_CUDA(0);
        const float before = r.pb.o[0];
        bk_status sd = bk_sinkhorn_forward(&r.pb.desc, &r.p, &qd, &r.pb.tk, &r.pb.tv, &r.pb.to, NULL, NULL, NULL, 0);
        th_check(sd == BK_ERR_PARAM && strstr(bk_last_error(), "tensor q lives in cuda:0 memory") &&
                     strstr(bk_last_error(), "computes in host memory") && r.pb.o[0] == before,
                 "a tensor on another device: refused, naming it and both places, nothing written", "%s: %s",
                 bk_status_str(sd), bk_last_error());
        bk_tensor od = r.pb.to;
        od.device = 7;
        sd = bk_sinkhorn_forward(&r.pb.desc, &r.p, &r.pb.tq, &r.pb.tk, &r.pb.tv, &od, NULL, NULL, NULL, 0);
        th_check(sd == BK_ERR_PARAM && strstr(bk_last_error(), "tensor out lives in cuda:6"), "an output on another device refused",
                 "%s", bk_last_error());
        th_check(bk_tensor_bhnd(r.pb.q, 3, 40, 8).device == BK_DEVICE_HOST && bk_tensor_bnhd(r.pb.q, 3, 40, 8).device == 0,
                 "views made by the library are host tensors", "%s", "");
    }
    th_prob_free(&r.pb);

    /* a backend lacking operators: they are refused, the others run */
    bki_backend partial = bki_backend_cpu;
    partial.name = "partial";
    partial.kernels = sinkhorn_family; /* on the host path */
    partial.nkernels = 3;
    if (bki_context_with_backend(&partial, &ctx) == BK_OK) {
        bk_context_use(ctx);
        th_check(bk_context_supports(ctx, "sinkhorn") && !bk_context_supports(ctx, "lot") &&
                     !strcmp(bk_context_backend_name(ctx), "partial"),
                 "supports: what the backend's table says", "%s", "");
        run_init(&r, 5);
        run_once(&r);
        th_check(r.s1 == BK_OK && same_outputs(&ref, &r), "an operator the backend has runs (and gives the same result)",
                 "%s", bk_last_error());
        /* LOT: refused before anything is written */
        bk_lot_config lp = bk_lot_config_default();
        float Z[3 * 2 * 8], th[3 * 2];
        for (int i = 0; i < 48; i++) Z[i] = 0.1f * (float)(i % 7);
        for (int i = 0; i < 6; i++) th[i] = 0.0f;
        lp.r = 2;
        lp.Z = Z;
        lp.theta = th;
        const float before = r.pb.o[0];
        s = bk_lot_forward(&r.pb.desc, &lp, &r.pb.tq, &r.pb.tk, &r.pb.tv, &r.pb.to, NULL, NULL, NULL, 0);
        th_check(s == BK_ERR_UNSUPPORTED && strstr(bk_last_error(), "lot") && strstr(bk_last_error(), "partial") &&
                     r.pb.o[0] == before,
                 "an operator the backend lacks: BK_ERR_UNSUPPORTED naming both, nothing written", "%s: %s",
                 bk_status_str(s), bk_last_error());
        th_prob_free(&r.pb);
        bk_context_use(NULL);
        bk_context_free(ctx);
    }
    th_prob_free(&ref.pb);
    tape_notes_test();
}
