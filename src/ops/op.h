/* op.h -- the attention operator framework (internal).
 *
 * An attention operator is a table of per-problem kernels (bki_op) and a
 * parameter struct; ONE driver (driver.c) runs every operator: argument
 * checks common to all of them, the plan of the B*H problems over threads
 * (bki_plan_problems: one per thread, or a team per problem), workspace sizing
 * and carving (one lane per problem in flight, a per-call area, per-problem
 * parameter-gradient slabs), the tape (one versioned format: header, then one
 * block per problem), the parallel region, errors. Operators are listed in
 * one place, registry.c; the public API of each operator (bk_sinkhorn_*,
 * bk_esp_*, ...) is a thin wrapper filling a bki_call, and the registry's
 * public face (bk_op_*) lets C callers and the CLI find an operator by name
 * and set its parameters by key; the model calls the driver with the
 * registry's tables directly: any operator with BKI_CAP_MODEL is a model
 * attention kind (src/nn/attn_site.c).
 *
 * Adding an operator: its parameter struct and public wrappers in its header,
 * one file with its kernels and its bki_op, one line in registry.c, its tests
 * and docs (docs/ARCHITECTURE.md, "Adding an operator").
 */
#ifndef BK_OP_H
#define BK_OP_H
#include "ops.h"
#include "../backend/call.h"

#include <string.h>

typedef struct bki_op bki_op;

/* The tape format (bki_tape_header, bki_block_header, BKI_TAPE_*) and the
 * call (bki_call) are ../backend/call.h's: a backend's kernels read them
 * without this header. */

/* bki_call.ws_mode of bk_op_config_check: the scalars alone, on a
 * placeholder problem (no array set) */
#define BKI_WS_SCALARS 2

/* a float array of a call's parameter-gradient outputs (op->pg_arrays) */
typedef struct {
    const char *name;
    const float *data;   /* NULL: not asked for */
    size_t n;
} bki_farray;

/* ---- the operator's schema: what the layers above read -------------------
 * An operator's description is the one place that knows its kind: the CLI's
 * `attn --op NAME` options and help, Python's birkhoff.attention(name, ...)
 * keywords and docstrings, the model's attention keys ("attn.KEY"), the
 * bench's cases and the docs' operator table are made from it (its fields'
 * bki_field.doc and ranges, the capability flags, the learned arrays, the
 * bench cases), with no list of kinds above the registry. */
enum {
    BKI_CAP_CROSS = 1u << 0,  /* Nq != Nk: a cross-attention site             */
    BKI_CAP_PAD = 1u << 1,    /* q_len / k_len (padded queries and keys)      */
    BKI_CAP_CAUSAL = 1u << 2, /* a "causal" parameter (masked future keys)    */
    BKI_CAP_ATTN = 1u << 3,   /* exports the dense attention matrix (extras)  */
    BKI_CAP_MODEL = 1u << 4,  /* usable as a model's attention kind           */
};

/* a parameter array the operator reads through a pointer in its parameter
 * struct and a model learns (LOT's pivots and mass logits); its gradient is
 * the operator's parameter-gradient output of the same index: c->pg points
 * to nlearned `float *` in the learned order (e.g. bki_lot_grads) */
typedef struct {
    const char *name;   /* the model's tensor name per block: "attn.NAME"  */
    const char *doc;
    size_t offset;      /* of its `const float *` in the parameter struct   */
    /* its shape for H heads of head dimension d under the parameters:
     * writes the dimensions, returns the rank (1..3 for a model's tensor) */
    int (*shape)(const void *par, int H, int d, int64_t dims[4]);
    /* a model's initial values: BKI_INIT_ZERO, or BKI_INIT_NORMAL with
     * standard deviation init_sd (draws of the model's per-tensor stream) */
    int init;
    double init_sd;
} bki_learned;
enum { BKI_INIT_ZERO = 0, BKI_INIT_NORMAL = 1 };

/* a case of `birkhoff bench attn` (the bench's list is every registered
 * operator's cases) */
typedef struct {
    const char *name;    /* "N1024": the case's tag after the operator's name */
    int B, H, Nq, Nk, d, dv;
    const char *params;  /* key=value,... over the operator's defaults, or "" */
    int backward;        /* 1: the forward + backward is timed too           */
} bki_bench_case;

/* an array of the operator beyond q, k, v and out: an input the parameter
 * struct points to (LOT's pivots, diff's lambda, ESP's slices), an object
 * read from a file (ASAP's compiled layer), or an extra output of the
 * forward (diagnostics, slice weights) or of the backward (the parameters'
 * gradients). The CLI's `attn --NAME F.npy` and the bindings' keyword arrays
 * are made from these; the operator's run_arrays maps them onto its typed
 * extras. Outputs and inputs are float32. */
enum {
    BKI_ARR_IN = 1u << 0,       /* an input: a `const float *` at offset        */
    BKI_ARR_FWD = 1u << 1,      /* an output of the forward                     */
    BKI_ARR_BWD = 1u << 2,      /* an output of the backward                    */
    BKI_ARR_REQUIRED = 1u << 3, /* an input the operator cannot run without     */
    BKI_ARR_FILE = 1u << 4,     /* an input object read from a file by load     */
    BKI_ARR_SUMMARY = 1u << 5,  /* a [B, H, k] forward output whose columns'
                                   maxima the CLI prints (cols names them)      */
    BKI_ARR_HOST = 1u << 6,     /* an output run_arrays writes on the host (host
                                   memory even when q, k, v are a device's)     */
};
typedef struct {
    const char *name;        /* "pivots", "diag" (the CLI: --pivots, '_' as '-') */
    const char *alias;       /* an older CLI flag without "--", or NULL        */
    const char *doc;         /* one line                                        */
    unsigned kind;           /* BKI_ARR_*                                       */
    const char *shape_text;  /* "[H, r, d]" (messages, docs)                    */
    size_t offset;           /* IN, FILE: of its pointer in the parameter struct */
    /* IN: the integer (BKI_F_INT) key set from the array's dimension dim_at
     * (ESP's L from its slices' rows, LOT's r), or NULL */
    const char *dim_key;
    int dim_at;
    /* its shape under the parameters for desc (IN: after dim_key is set;
     * only desc->B, H, d are read for inputs): writes the dimensions,
     * returns the rank (1..4); NULL for FILE */
    int (*shape)(const void *par, const bk_attn_desc *d, int64_t dims[4]);
    const char *cols;        /* SUMMARY: its columns' names, comma-separated,
                                then optionally ";" and a note for the line;
                                "#name": a count, printed as an integer */
    /* FILE: reads the object at path into *obj (a new one), frees it */
    bk_status (*load)(const char *path, void **obj);
    void (*release)(void *obj);
} bki_array;

/* another name of the operator with some parameters preset (`asap0`: asap
 * with variant=zero) */
typedef struct {
    const char *name;
    const char *params;  /* key=value,... over the defaults */
    const char *doc;
} bki_preset;

/* ---- an operator --------------------------------------------------------- */
struct bki_op {
    const char *name;                /* registry name ("sinkhorn", ...)        */
    uint32_t id;                     /* written in the tape                    */
    const char *par_name;            /* the parameter struct, for messages     */
    /* the parameters' key=value table (bk_op_set_param) and its size */
    const bki_field *fields;
    int nfields;
    size_t par_size;
    void (*par_default)(void *par);
    /* parameter and extras checks (after the common ones); set the error */
    bk_status (*check)(const bki_call *c);
    /* a problem's work, for the plan (about the entries of its matrices) */
    double (*cost)(const bki_call *c);
    /* bytes of one lane for a team of `members` (1: a solo thread) */
    size_t (*lane_bytes)(const bki_call *c, int members);
    /* bytes of a problem's tape block after its header */
    size_t (*block_bytes)(const bki_call *c);
    /* hash of what a backward's parameters must agree on with the tape's */
    uint32_t (*key)(const bki_call *c);
    /* optional: bytes of the per-call area, filled by prepare (serially,
     * before each region) */
    size_t (*prep_bytes)(const bki_call *c);
    bk_status (*prepare)(bki_call *c);
    /* optional: bytes per problem of parameter gradients, summed over the
     * problems in problem order by reduce after the backward region */
    size_t (*pgrad_bytes)(const bki_call *c);
    void (*reduce)(bki_call *c);
    /* one problem; every team member calls them (see the parallel model) */
    void (*forward)(const bki_team *tm, bki_call *c, int p, char *lane);
    void (*backward)(const bki_team *tm, bki_call *c, int p, char *lane); /* NULL: no backward */
    /* optional: a tape block's steps are plausible for these parameters */
    int (*steps_ok)(const bki_call *c, const bki_block_header *h);
    /* 1: the operator's own passes see every non-finite value in the valid
     * rows of the inputs the driver would scan (q, k, v unless trusted; dout
     * in a backward): a product it computes from them comes out non-finite,
     * checked while in cache, and it then calls bki_op_suspect. The driver
     * does not scan those inputs before the region, and scans them after it
     * when a problem was suspect, so the status and message are the scan's
     * (naming the tensor and its first bad row), as before; the outputs are
     * then written. Saves a read of every input (LOT at large N: 8 % of its
     * time). */
    int finds_nonfinite;
    /* optional (NULL: none): the parameter-gradient outputs in c->pg as at
     * most 2 float arrays; returns how many. The driver checks them finite
     * after reduce, as it checks dq, dk and dv (BK_ERR_OVERFLOW). */
    int (*pg_arrays)(const bki_call *c, bki_farray out[2]);
    /* optional (NULL: none): bytes of the tape's per-call section (call.h):
     * in a forward with a tape the driver copies the first call_bytes of
     * the per-call area, as prepare left it, after the tape's header; a
     * backward's prepare finds that section in c->call_sec (the given tape's,
     * or the recomputed one's) and may take it instead of computing it */
    size_t (*call_bytes)(const bki_call *c);
    /* optional (NULL: an attention operator): the call's problems are not
     * (b, h) attention problems (OTK's sets: c->d is a descriptor the
     * operator maps its own shapes onto, c->q, k, v, out, dout, dq, dk, dv
     * carry what it says). check_io then replaces the driver's checks of the
     * descriptor (op->check does its own), of the arrays (shapes, aliasing,
     * values) and of the results: check_results runs after a forward's
     * region (the problems' failures in c->bad, c->bad_s) and after a
     * backward's reduce, and returns the call's status. Such an operator
     * runs on the host path whatever the context's backend (host arrays). */
    bk_status (*check_io)(const bki_call *c, int backward);
    bk_status (*check_results)(bki_call *c, int backward);
    /* ---- the schema (see above) ---- */
    const char *doc;                 /* one line: what it computes, its paper  */
    unsigned caps;                   /* BKI_CAP_*                              */
    const bki_learned *learned;      /* NULL: none                             */
    int nlearned;
    const bki_bench_case *bench;     /* NULL: none                             */
    int nbench;
    const bki_array *arrays;         /* NULL: none beyond q, k, v, out, attn   */
    int narrays;
    /* optional (arrays with outputs): the call c (forward when c->dout is
     * NULL, else backward) run with a[i] the buffer of arrays[i] (NULL: not
     * asked for; inputs are in c->par already) through the operator's typed
     * extras and parameter-gradient outputs */
    bk_status (*run_arrays)(bki_call *c, float *const *a, void *tape, void *ws, size_t ws_size);
    const bki_preset *presets;       /* NULL: none                             */
    int npresets;
};

/* ---- parameter-gradient outputs (bki_call.pg) ---------------------------
 * ESP: float *dtheta [L, d] (soft sort); LOT: a bki_lot_grads. Each
 * operator's reduce OVERWRITES them with the sum over the call's problems. */
typedef struct {
    float *dZ, *dtheta;   /* [H, r, d] pivots, [H, r] mass logits */
} bki_lot_grads;

/* ---- the driver (driver.c) ---------------------------------------------- */
/* a problem of c saw a non-finite value derived from its inputs (any thread) */
void bki_op_suspect(bki_call *c);
size_t bki_op_tape_size(bki_call *c);        /* parameters already checked */
/* a caller's size query: 0 when the scalar parameters are invalid (the
 * error is cleared; the forward reports it) */
size_t bki_op_tape_size_query(bki_call *c);
size_t bki_op_workspace_size(bki_call *c);
bk_status bki_op_forward(bki_call *c, void *tape, void *ws, size_t ws_size);
bk_status bki_op_backward(bki_call *c, const void *tape, void *ws, size_t ws_size);
/* problem p's block header and data in the call's tape */
bki_block_header *bki_op_block(const bki_call *c, int p);
/* the tape header a forward of this call writes, and the check of a given
 * one against the call (BK_ERR_TAPE with the reason); shared with device
 * backends, whose tapes have the same header */
void bki_op_tape_header(const bki_call *c, bki_tape_header *th);
bk_status bki_op_check_tape_header(const bki_call *c, const bki_tape_header *th);
/* bytes of the tape's per-call section (op->call_bytes rounded up; 0: none) */
size_t bki_op_call_total(const bki_call *c);
/* bytes of one problem's tape block, its header included */
size_t bki_op_block_total(const bki_call *c);
static inline void *bki_op_block_data(const bki_call *c, int p) { return bki_op_block(c, p) + 1; }
/* the lengths of problem p */
static inline int bki_op_lq(const bki_call *c, int p) { return bki_len(c->d->q_len, p / c->d->H, c->d->Nq); }
static inline int bki_op_lk(const bki_call *c, int p) { return bki_len(c->d->k_len, p / c->d->H, c->d->Nk); }
/* writes problem p's attention output (when the call asks for one) from a
 * dense Lq x Lk block A (row stride lda): the valid block, zeros elsewhere;
 * rows shared over the team (no sync) */
void bki_op_export_attn(const bki_team *tm, const bki_call *c, int p, const float *A, int lda, int Lq, int Lk);
/* a problem's failure, kept for the call's error (the lowest index wins);
 * a team's member 0 reports it */
void bki_op_fail(bki_call *c, int p, bk_status s);

/* ---- a call of an operator: the one way typed entry points are made ------
 * (every public bk_NAME_* function is one line over these) */
static inline bki_call bki_call_of(const bki_op *op, const bk_attn_desc *d, const void *par)
{
    bki_call c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.d = d;
    c.par = par;
    return c;
}
static inline size_t bki_call_workspace(const bki_op *op, const bk_attn_desc *d, const void *par)
{
    bki_call c = bki_call_of(op, d, par);
    return bki_op_workspace_size(&c);
}
static inline size_t bki_call_tape(const bki_op *op, const bk_attn_desc *d, const void *par)
{
    bki_call c = bki_call_of(op, d, par);
    return bki_op_tape_size_query(&c);
}
/* the forward with the operator's extras ex (its typed struct, or NULL) and
 * the attention output attn (NULL: none) */
static inline bk_status bki_call_forward(const bki_op *op, const bk_attn_desc *d, const void *par, const bk_tensor *q,
                                         const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                                         const void *ex, const bk_tensor *attn, void *ws, size_t ws_size)
{
    bki_call c = bki_call_of(op, d, par);
    c.q = q; c.k = k; c.v = v; c.out = out; c.ex = ex; c.attn = attn;
    return bki_op_forward(&c, tape, ws, ws_size);
}
/* the backward with the operator's parameter-gradient outputs pg (or NULL) */
static inline bk_status bki_call_backward(const bki_op *op, const bk_attn_desc *d, const void *par,
                                          const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                                          const bk_tensor *dout, const void *tape, const bk_tensor *dq,
                                          const bk_tensor *dk, const bk_tensor *dv, void *pg, void *ws, size_t ws_size)
{
    bki_call c = bki_call_of(op, d, par);
    c.q = q; c.k = k; c.v = v; c.dout = dout; c.dq = dq; c.dk = dk; c.dv = dv; c.pg = pg;
    return bki_op_backward(&c, tape, ws, ws_size);
}

/* the entries of a static table (the operators' schema tables) */
#define BKI_NB(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- the registry (registry.c) ------------------------------------------ */
const bki_op *bki_op_find(const char *name);
extern const bki_op bki_op_softmax, bki_op_sinkhorn, bki_op_unbalanced, bki_op_esp, bki_op_lot, bki_op_asap,
    bki_op_diff;
#endif
