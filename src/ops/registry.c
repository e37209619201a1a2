/* registry.c -- THE list of attention operators, and the registry's public
 * face (include/birkhoff/ops.h). An operator is registered by one line
 * here; everything else finds it through this list. */
#include "op.h"
#include "../backend/backend.h"

#include <string.h>

static const bki_op *const ops[] = {
    &bki_op_softmax,
    &bki_op_sinkhorn,
    &bki_op_unbalanced,
    &bki_op_esp,
    &bki_op_asap,
    &bki_op_lot,
    &bki_op_diff,
    &bki_op_linear,
    &bki_op_performer,
    &bki_op_nystrom,
};
enum { NOPS = (int)(sizeof ops / sizeof ops[0]) };

/* bk_op is the public name of a registry entry: a bki_op */
static const bki_op *in(const bk_op *op) { return (const bki_op *)(const void *)op; }
static const bk_op *out(const bki_op *op) { return (const bk_op *)(const void *)op; }

const bki_op *bki_op_find(const char *name)
{
    if (!name) return NULL;
    for (int i = 0; i < NOPS; i++)
        if (strcmp(ops[i]->name, name) == 0) return ops[i];
    return NULL;
}

int bk_op_count(void) { return NOPS; }
const bk_op *bk_op_at(int i) { return i >= 0 && i < NOPS ? out(ops[i]) : NULL; }
const bk_op *bk_op_find(const char *name) { return out(bki_op_find(name)); }
const char *bk_op_name(const bk_op *op) { return op ? in(op)->name : NULL; }
int bk_op_has_backward(const bk_op *op) { return op && in(op)->backward != NULL; }
size_t bk_op_config_size(const bk_op *op) { return op ? in(op)->par_size : 0; }

void bk_op_config_default(const bk_op *op, void *params)
{
    if (op && params) in(op)->par_default(params);
}

bk_status bk_op_config_set(const bk_op *op, void *params, const char *key, const char *value)
{
    if (!op || !params) return bki_fail(BK_ERR_NULL, "bk_op_config_set: NULL operator or parameters");
    bk_status s = bki_cfg_set(params, in(op)->fields, in(op)->nfields, in(op)->name, key, value);
    if (s == BK_OK) bki_clear_error();
    return s;
}

int bk_op_config_count(const bk_op *op) { return op ? in(op)->nfields : 0; }

const char *bk_op_config_key(const bk_op *op, int i)
{
    return op && i >= 0 && i < in(op)->nfields ? in(op)->fields[i].name : NULL;
}

size_t bk_op_config_format(const bk_op *op, const void *params, char *buf, size_t cap)
{
    if (!op || !params) return 0;
    return bki_cfg_format(params, in(op)->fields, in(op)->nfields, buf, cap);
}

static bki_call call(const bk_op *op, const bk_attn_desc *desc, const void *params)
{
    bki_call c;
    memset(&c, 0, sizeof c);
    c.op = in(op);
    c.d = desc;
    c.par = params;
    return c;
}

size_t bk_op_workspace_size(const bk_op *op, const bk_attn_desc *desc, const void *params)
{
    if (!op) return 0;
    bki_call c = call(op, desc, params);
    return bki_op_workspace_size(&c);
}

size_t bk_op_tape_size(const bk_op *op, const bk_attn_desc *desc, const void *params)
{
    if (!op) return 0;
    bki_call c = call(op, desc, params);
    return bki_op_tape_size_query(&c);
}

bk_status bk_op_forward(const bk_op *op, const bk_attn_desc *desc, const void *params, const bk_tensor *q,
                        const bk_tensor *k, const bk_tensor *v, const bk_tensor *o, void *tape, const bk_tensor *attn,
                        void *ws, size_t ws_size)
{
    if (!op) return bki_fail(BK_ERR_NULL, "bk_op_forward: NULL operator");
    bki_call c = call(op, desc, params);
    c.q = q; c.k = k; c.v = v; c.out = o; c.attn = attn;
    return bki_op_forward(&c, tape, ws, ws_size);
}

bk_status bk_op_backward(const bk_op *op, const bk_attn_desc *desc, const void *params, const bk_tensor *q,
                         const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout, const void *tape,
                         const bk_tensor *dq, const bk_tensor *dk, const bk_tensor *dv, void *ws, size_t ws_size)
{
    if (!op) return bki_fail(BK_ERR_NULL, "bk_op_backward: NULL operator");
    bki_call c = call(op, desc, params);
    c.q = q; c.k = k; c.v = v; c.dout = dout; c.dq = dq; c.dk = dk; c.dv = dv;
    return bki_op_backward(&c, tape, ws, ws_size);
}

/* (context.h; here, where the operators' names are known: the backend layer
 * below knows its kernels' names, not the registry) */
int bk_context_supports(const bk_context *ctx, const char *op_name)
{
    const bki_op *op = bki_op_find(op_name);
    return op && bki_backend_kernel(bki_ctx_backend(ctx ? ctx : bki_ctx()), op->name) != NULL;
}
