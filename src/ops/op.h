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

typedef struct bki_op bki_op;
typedef struct bki_call bki_call;

/* ---- the tape ------------------------------------------------------------
 * [bki_tape_header][block 0][block 1]...[block P-1]; a block is a
 * bki_block_header (Lq, Lk, the operator's step counts) then the operator's
 * block_bytes (rounded up to 64). The header names the operator, the shapes
 * and a hash of the parameters the backward must agree on; the blocks'
 * checksum is kept in debug builds (BK_TAPE_CHECKSUM). */
#define BKI_TAPE_MAGIC 0x50544b42u /* "BKTP" */
#define BKI_TAPE_VERSION 2u
typedef struct {
    uint32_t magic, version, op;
    int32_t B, H, Nq, Nk, d, dv;
    uint32_t key;          /* hash of the parameters (op->key)              */
    uint64_t block_bytes;  /* per problem, header included                  */
    uint64_t checksum;     /* FNV-1a of the blocks (BK_TAPE_CHECKSUM), or 0  */
    uint32_t flags;        /* a device backend's (BKI_TAPE_OUT)              */
    uint32_t reserved;
} bki_tape_header;
/* flags: the forward's output follows the blocks (the CUDA backend with
 * bk_context_config.tape_output; docs/CUDA.md) */
#define BKI_TAPE_OUT 1u
typedef struct {
    int32_t Lq, Lk;
    int32_t steps[4];      /* the operator's (e.g. half-steps run)           */
    int32_t reserved[10];
} bki_block_header;

/* ---- a call -------------------------------------------------------------- */
struct bki_call {
    const bki_op *op;
    const bk_attn_desc *d;
    const void *par;                 /* the operator's parameter struct        */
    const bk_tensor *q, *k, *v;
    const bk_tensor *out;            /* forward output (NULL: tape only)       */
    const bk_tensor *attn;           /* optional attention output (in ex)      */
    const void *ex;                  /* the operator's forward extras, or NULL */
    const bk_tensor *dout, *dq, *dk, *dv;
    void *pg;                        /* the operator's parameter-gradient
                                        outputs (backward), or NULL            */
    /* set by the driver */
    bki_plan pl;
    char *tape;                      /* header + blocks                        */
    void *prep;                      /* the per-call area (op->prepare)        */
    char *pgrad;                     /* P slabs of op->pgrad_bytes             */
    char *lanes;
    size_t lane_bytes;
    int bad;                         /* lowest failing problem (P: none)       */
    bk_status bad_s;
    bk_status team_s;                /* a team's serial step, set by member 0  */
    int ws_mode;                     /* 1: a workspace-size query (check needs
                                        the scalar parameters only)            */
    int trusted;                     /* 1: q, k, v are the library's own
                                        activations (the model's): their
                                        shapes are checked, their values not
                                        scanned (a non-finite activation
                                        reaches the logits, which the model
                                        checks)                                */
    int suspect;                     /* set (bki_op_suspect) by an operator
                                        that finds non-finite inputs in its
                                        own passes (op->finds_nonfinite)       */
};

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
    /* ---- the schema (see above) ---- */
    const char *doc;                 /* one line: what it computes, its paper  */
    unsigned caps;                   /* BKI_CAP_*                              */
    const bki_learned *learned;      /* NULL: none                             */
    int nlearned;
    const bki_bench_case *bench;     /* NULL: none                             */
    int nbench;
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

/* ---- the registry (registry.c) ------------------------------------------ */
const bki_op *bki_op_find(const char *name);
extern const bki_op bki_op_softmax, bki_op_sinkhorn, bki_op_unbalanced, bki_op_esp, bki_op_lot, bki_op_asap,
    bki_op_diff;
#endif
