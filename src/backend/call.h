/* call.h -- what the operator driver (src/ops/driver.c) hands a backend's
 * per-operator kernels (internal; docs/BACKENDS.md): the call (bki_call) and
 * the tape format every backend writes (bki_tape_header, bki_block_header).
 *
 * These types sit in the backend layer so that a backend's kernels read a
 * call without including the framework's header (src/ops/op.h includes this
 * one): the seam points down only. A call names its operator through an
 * opaque `const struct bki_op *` (the framework's table, op.h); a backend
 * never dereferences it: the driver runs the operator's own checks before a
 * backend's kernel runs and fills `tape_hdr` and `tape_bytes` (the header a
 * forward of the call writes, and the size of the operator's tape) for it. */
#ifndef BK_CALL_H
#define BK_CALL_H
#include "../core/internal.h"

struct bki_op;

/* ---- the tape ------------------------------------------------------------
 * [bki_tape_header][per-call section][block 0][block 1]...[block P-1]; the
 * per-call section (version 3; empty for most operators) is data computed
 * once per call by the operator's prepare (OTK's Nystrom matrices), its size
 * the operator's call_bytes rounded up to 64; a block is a bki_block_header
 * (Lq, Lk, the operator's step counts) then the operator's block_bytes
 * (rounded up to 64). The header names the operator, the shapes, a hash of
 * the parameters the backward must agree on and the section's size; the
 * checksum of the section and the blocks is kept in debug builds
 * (BK_TAPE_CHECKSUM). (Version 2 had no section; a version-2 tape is refused
 * as any other version.) */
#define BKI_TAPE_MAGIC 0x50544b42u /* "BKTP" */
#define BKI_TAPE_VERSION 3u
typedef struct {
    uint32_t magic, version, op;
    int32_t B, H, Nq, Nk, d, dv;
    uint32_t key;          /* hash of the parameters (op->key)              */
    uint64_t block_bytes;  /* per problem, header included                  */
    uint64_t checksum;     /* FNV-1a of the blocks (BK_TAPE_CHECKSUM), or 0  */
    uint32_t flags;        /* a device backend's (BKI_TAPE_OUT)              */
    uint32_t call_lines;   /* the per-call section's size in 64-byte lines   */
} bki_tape_header;
/* flags: the forward's output follows the blocks (the CUDA backend with
 * bk_context_config.tape_output; docs/CUDA.md) */
#define BKI_TAPE_OUT 1u
typedef struct {
    int32_t Lq, Lk;
    int32_t steps[4];      /* the operator's (e.g. half-steps run)           */
    int32_t reserved[10];
} bki_block_header;

/* A tape header `got` against the one this call's forward writes (`want`):
 * BK_OK, or BK_ERR_TAPE naming what differs (op_name: the operator's name,
 * for the messages). Defined in context.c. */
bk_status bki_tape_check(const bki_tape_header *want, const bki_tape_header *got, const char *op_name);

/* ---- a call -------------------------------------------------------------- */
typedef struct bki_call {
    const struct bki_op *op;         /* the framework's table (opaque here)     */
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
    const char *call_sec;            /* a backward's prepare: the tape's
                                        per-call section (op->call_bytes), to
                                        take instead of computing it when it
                                        fits the call; NULL in a forward      */
    char *pgrad;                     /* P slabs of op->pgrad_bytes             */
    char *lanes;
    size_t lane_bytes;
    int bad;                         /* lowest failing problem (P: none)       */
    bk_status bad_s;
    bk_status team_s;                /* a team's serial step, set by member 0  */
    int ws_mode;                     /* 1: a workspace-size query (check needs
                                        the scalar parameters only); 2
                                        (BKI_WS_SCALARS, op.h):
                                        bk_op_config_check, d is a
                                        placeholder, no array is set           */
    int trusted;                     /* 1: q, k, v are the library's own
                                        activations (the model's): their
                                        shapes are checked, their values not
                                        scanned (a non-finite activation
                                        reaches the logits, which the model
                                        checks)                                */
    int suspect;                     /* set (bki_op_suspect) by an operator
                                        that finds non-finite inputs in its
                                        own passes (op->finds_nonfinite)       */
    /* set by the driver before a backend's kernel entry runs (bki_kernel):
     * the header a forward of this call writes, and the bytes of the
     * operator's tape (header and blocks; a backend's extra comes after) */
    bki_tape_header tape_hdr;
    size_t tape_bytes;
} bki_call;
#endif
