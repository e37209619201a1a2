/* birkhoff/ops.h -- the operator registry: every attention operator by name.
 * Part of the public API; include <birkhoff.h> (all of it) or this file.
 *
 * Each attention operator (softmax, sinkhorn, unbalanced, esp, lot, diff,
 * asap, ...) has its own typed entry points (birkhoff/attn.h, esp.h, lot.h,
 * diff.h, asap.h); the registry gives the same operators to code that
 * chooses one at run time (the CLI's `birkhoff attn --op NAME`, the Python
 * bindings' birkhoff.attention(name, ...), the bench, the models): find it
 * by name, fill its parameter struct by key=value (the keys are the struct's
 * field names, e.g. "iters", "eps", "rho"), attach its arrays by name, then
 * run the generic entry points, which behave exactly as the operator's own.
 *
 * Every operator describes itself (its schema): a one-line doc, capability
 * flags, each parameter's key, type, doc, default and accepted range, its
 * arrays beyond q, k, v and out (inputs such as LOT's pivots, extra outputs
 * such as diagnostics and the parameters' gradients), the arrays a model
 * learns, named presets (`asap0`) and its bench cases. The CLI's options and
 * help, the bindings' keywords and docstrings, the bench's case list and the
 * operator table of docs/OPERATORS.md are generated from it: an operator
 * registered in src/ops/registry.c appears in all of them with no other
 * edit. Strings returned here are static (never freed). */
#ifndef BIRKHOFF_OPS_H
#define BIRKHOFF_OPS_H

#include "attn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bk_op bk_op; /* a registry entry (static; never freed) */

BK_API int bk_op_count(void);
BK_API const bk_op *bk_op_at(int i);             /* NULL outside [0, count)  */
BK_API const bk_op *bk_op_find(const char *name); /* NULL for an unknown name */
BK_API const char *bk_op_name(const bk_op *op);
/* 1 when the operator has a backward (asap: inference only) */
BK_API int bk_op_has_backward(const bk_op *op);

/* The parameter struct: its size, its defaults, key=value assignment (an
 * unknown key or a malformed value is BK_ERR_PARAM naming both), the keys,
 * and every scalar field as "key=value\n" lines (returns the length it
 * needs; writes at most cap bytes, NUL-terminated). */
BK_API size_t bk_op_config_size(const bk_op *op);
BK_API void bk_op_config_default(const bk_op *op, void *params);
BK_API bk_status bk_op_config_set(const bk_op *op, void *params, const char *key, const char *value);
BK_API int bk_op_config_count(const bk_op *op);
BK_API const char *bk_op_config_key(const bk_op *op, int i);
BK_API size_t bk_op_config_format(const bk_op *op, const void *params, char *buf, size_t cap);

/* The operator's entry points without extras (attn: the optional
 * [B,H,Nq,Nk] attention output, data NULL or attn NULL for none). */
BK_API size_t bk_op_workspace_size(const bk_op *op, const bk_attn_desc *desc, const void *params);
BK_API size_t bk_op_tape_size(const bk_op *op, const bk_attn_desc *desc, const void *params);
BK_API bk_status bk_op_forward(const bk_op *op, const bk_attn_desc *desc, const void *params, const bk_tensor *q,
                               const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                               const bk_tensor *attn, void *ws, size_t ws_size);
BK_API bk_status bk_op_backward(const bk_op *op, const bk_attn_desc *desc, const void *params, const bk_tensor *q,
                                const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout, const void *tape,
                                const bk_tensor *dq, const bk_tensor *dk, const bk_tensor *dv, void *ws,
                                size_t ws_size);

/* ---- the schema ------------------------------------------------------------ */
/* capability flags (bk_op_caps) */
#define BK_OP_CAP_CROSS 0x1u  /* Nq != Nk (a cross-attention site)               */
#define BK_OP_CAP_PAD 0x2u    /* q_len / k_len: padded queries and keys          */
#define BK_OP_CAP_CAUSAL 0x4u /* a "causal" parameter (masked future keys)       */
#define BK_OP_CAP_ATTN 0x8u   /* exports the dense attention matrix (attn)       */
#define BK_OP_CAP_MODEL 0x10u /* usable as a model's attention kind              */

/* one line: what the operator computes, after which paper ("" if none) */
BK_API const char *bk_op_doc(const bk_op *op);
BK_API unsigned bk_op_caps(const bk_op *op);

/* A parameter (i in [0, bk_op_config_count)). def is the default as
 * bk_op_config_format writes it; range "[lo, hi]" or "(lo, hi]" (inf: no
 * upper bound) when bk_op_config_set checks one, else "". */
typedef struct {
    const char *key;    /* the config key ("iters")                          */
    const char *type;   /* "int", "int64", "uint64", "float", "enum", "list" */
    const char *doc;    /* one line                                          */
    const char *alias;  /* an older CLI flag name without "--", or NULL      */
    const char *const *values; /* enum: the value names, NULL-terminated; else NULL */
    char def[64];
    char range[96];
} bk_op_param;
/* BK_ERR_NULL, or BK_ERR_PARAM for i out of range */
BK_API bk_status bk_op_param_info(const bk_op *op, int i, bk_op_param *info);
/* the index of a key, or of a parameter whose alias is name ('-' and '_'
 * are the same letter), or -1 */
BK_API int bk_op_param_find(const bk_op *op, const char *name);
/* "key=value,key=value" (commas, spaces or newlines between pairs): each
 * assigned as bk_op_config_set would; stops at the first error */
BK_API bk_status bk_op_config_parse(const bk_op *op, void *params, const char *text);
/* The parameters' checks that need neither shapes nor arrays (the ranges
 * above, then the operator's own scalar checks, e.g. ESP's SoftSort
 * temperature under soft sort): BK_ERR_PARAM naming the first bad one.
 * The forward checks everything again with the shapes. */
BK_API bk_status bk_op_config_check(const bk_op *op, const void *params);

/* ---- arrays beyond q, k, v, out ------------------------------------------- */
/* kinds (bk_op_array_info.kind, or-ed) */
#define BK_OP_ARRAY_IN 0x1u       /* an input the parameter struct points to     */
#define BK_OP_ARRAY_FWD 0x2u      /* an output of the forward                    */
#define BK_OP_ARRAY_BWD 0x4u      /* an output of the backward (a gradient)      */
#define BK_OP_ARRAY_REQUIRED 0x8u /* an input the operator cannot run without    */
#define BK_OP_ARRAY_FILE 0x10u    /* an input object read from a file            */
#define BK_OP_ARRAY_SUMMARY 0x20u /* a [B, H, k] output whose column maxima the
                                     CLI prints (cols names the columns)         */
#define BK_OP_ARRAY_HOST 0x40u    /* an output written on the host: host memory
                                     even for a device call (the diagnostics)    */
typedef struct {
    const char *name;    /* "pivots", "diag" (the CLI's --pivots, '_' as '-')  */
    const char *alias;   /* an older CLI flag without "--", or NULL           */
    const char *doc;
    const char *shape;   /* its shape in words: "[H, r, d]"; "F.asap" (a file) */
    const char *dim_key; /* an input whose dimension dim_at sets this key, or
                            NULL                                          */
    const char *cols;    /* SUMMARY: comma-separated column names (then ";"
                            and a note, e.g. "(relative)"; "#name" is a
                            count), or NULL                                */
    unsigned kind;       /* BK_OP_ARRAY_*                                     */
    int dim_at;
} bk_op_array;
BK_API int bk_op_array_count(const bk_op *op);
BK_API bk_status bk_op_array_info(const bk_op *op, int i, bk_op_array *info);
/* the index of an array by name or alias, or -1 */
BK_API int bk_op_array_find(const bk_op *op, const char *name);
/* array i's float32 shape for desc and params: writes dims, returns the
 * rank (1..4); 0 for a file input or a bad argument */
BK_API int bk_op_array_shape(const bk_op *op, int i, const bk_attn_desc *desc, const void *params, int64_t dims[4]);
/* Points params' input array i at data (float32, rank dims; kept by the
 * caller until the last call with params). An input with a dim_key sets
 * that key from its dimension first (range-checked: BK_ERR_PARAM); then the
 * dims must equal bk_op_array_shape (desc->B, H, d are read): BK_ERR_SHAPE
 * naming the array, its shape in words, the expected and the given dims
 * (params as before the call). BK_ERR_PARAM for an array that is not an
 * input (or a file input). */
BK_API bk_status bk_op_config_set_array(const bk_op *op, void *params, const bk_attn_desc *desc, int i,
                                        const float *data, int rank, const int64_t *dims);
/* A file input (BK_OP_ARRAY_FILE, e.g. ASAP's compiled layer): reads path
 * into a new object *handle and points params at it; the loader's error
 * (BK_ERR_IO, BK_ERR_FORMAT, ...) otherwise. Free with bk_op_config_unload
 * after the last call with params. */
BK_API bk_status bk_op_config_load(const bk_op *op, void *params, int i, const char *path, void **handle);
BK_API void bk_op_config_unload(const bk_op *op, int i, void *handle);
/* The forward and backward with the operator's output arrays: arrays holds
 * bk_op_array_count pointers indexed as bk_op_array_info (each NULL or a
 * float32 buffer of bk_op_array_shape; input slots are ignored: inputs are
 * in params), or arrays NULL for none. Same results as the operator's typed
 * entry points with the corresponding extras. */
BK_API bk_status bk_op_forward_arrays(const bk_op *op, const bk_attn_desc *desc, const void *params,
                                      const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                                      const bk_tensor *out, void *tape, const bk_tensor *attn, float *const *arrays,
                                      void *ws, size_t ws_size);
BK_API bk_status bk_op_backward_arrays(const bk_op *op, const bk_attn_desc *desc, const void *params,
                                       const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                                       const bk_tensor *dout, const void *tape, const bk_tensor *dq,
                                       const bk_tensor *dk, const bk_tensor *dv, float *const *arrays, void *ws,
                                       size_t ws_size);

/* ---- learned arrays, presets, bench cases --------------------------------- */
/* An array a model learns per attention block ("attn.NAME"); its shape for
 * H heads of dimension d under params (rank 0 when params is NULL). */
typedef struct {
    const char *name, *doc;
    int rank;
    int64_t dims[4];
} bk_op_learned;
BK_API int bk_op_learned_count(const bk_op *op);
BK_API bk_status bk_op_learned_info(const bk_op *op, int i, const void *params, int H, int d,
                                    bk_op_learned *info);
/* Another name of an operator with parameters preset ("asap0": asap with
 * variant=zero): bk_op_find_preset returns the operator and sets *params
 * (nullable) to the preset's key=value text, for bk_op_config_parse. */
typedef struct {
    const char *name, *params, *doc;
} bk_op_preset;
BK_API int bk_op_preset_count(const bk_op *op);
BK_API bk_status bk_op_preset_info(const bk_op *op, int i, bk_op_preset *info);
BK_API const bk_op *bk_op_find_preset(const char *name, const char **params);
/* A case of `birkhoff bench` ([B, H, Nq, d] queries, params over the
 * defaults; name: a variant's tag, e.g. "hard", printed as "esp-hard") */
typedef struct {
    const char *name;
    int B, H, Nq, Nk, d, dv;
    const char *params;
    int backward;
} bk_op_bench_case;
BK_API int bk_op_bench_count(const bk_op *op);
BK_API bk_status bk_op_bench_info(const bk_op *op, int i, bk_op_bench_case *info);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_OPS_H */
