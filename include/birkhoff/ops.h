/* birkhoff/ops.h -- the operator registry: every attention operator by name.
 * Part of the public API; include <birkhoff.h> (all of it) or this file.
 *
 * Each attention operator (softmax, sinkhorn, unbalanced, esp, lot, asap)
 * has its own typed entry points (birkhoff/attn.h, esp.h, lot.h, asap.h);
 * the registry gives the same operators to code that chooses one at run
 * time (the CLI resolves `attn --op NAME` here; the training engine's models
 * use the same registry internally): find it by
 * name, fill its parameter struct by key=value (the keys are the struct's
 * field names, e.g. "iters", "eps", "rho"), then run the generic entry points,
 * which behave exactly as the operator's own with no extras but the
 * attention matrix. A parameter struct holding arrays (LOT's pivots, ESP's
 * slices) gets those through its typed struct; keys set scalars only. */
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

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_OPS_H */
