/* registry.c -- THE list of attention operators, and the registry's public
 * face (include/birkhoff/ops.h). An operator is registered by one line
 * here; everything else finds it through this list. */
#include "op.h"
#include "../backend/backend.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* THE list: one line an operator, NAME for the bki_op_NAME its own file
 * defines (registry order: the kinds' indices, bk_attn_kind) */
#define BKI_OPERATORS(X)                                                                                             \
    X(softmax)                                                                                                       \
    X(sinkhorn)                                                                                                      \
    X(unbalanced)                                                                                                    \
    X(esp)                                                                                                           \
    X(asap)                                                                                                          \
    X(lot)                                                                                                           \
    X(diff)                                                                                                          \
    X(linear)                                                                                                        \
    X(performer)                                                                                                     \
    X(nystrom)

#define BKI_DECLARE(n) extern const bki_op bki_op_##n;
BKI_OPERATORS(BKI_DECLARE)
#define BKI_ENTRY(n) &bki_op_##n,
static const bki_op *const ops[] = {BKI_OPERATORS(BKI_ENTRY)};
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

size_t bk_op_workspace_size(const bk_op *op, const bk_attn_desc *desc, const void *params)
{
    return op ? bki_call_workspace(in(op), desc, params) : 0;
}

size_t bk_op_tape_size(const bk_op *op, const bk_attn_desc *desc, const void *params)
{
    return op ? bki_call_tape(in(op), desc, params) : 0;
}

bk_status bk_op_forward(const bk_op *op, const bk_attn_desc *desc, const void *params, const bk_tensor *q,
                        const bk_tensor *k, const bk_tensor *v, const bk_tensor *o, void *tape, const bk_tensor *attn,
                        void *ws, size_t ws_size)
{
    if (!op) return bki_fail(BK_ERR_NULL, "bk_op_forward: NULL operator");
    return bki_call_forward(in(op), desc, params, q, k, v, o, tape, NULL, attn, ws, ws_size);
}

bk_status bk_op_backward(const bk_op *op, const bk_attn_desc *desc, const void *params, const bk_tensor *q,
                         const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout, const void *tape,
                         const bk_tensor *dq, const bk_tensor *dk, const bk_tensor *dv, void *ws, size_t ws_size)
{
    if (!op) return bki_fail(BK_ERR_NULL, "bk_op_backward: NULL operator");
    return bki_call_backward(in(op), desc, params, q, k, v, dout, tape, dq, dk, dv, NULL, ws, ws_size);
}

/* (context.h; here, where the operators' names are known: the backend layer
 * below knows its kernels' names, not the registry) */
int bk_context_supports(const bk_context *ctx, const char *op_name)
{
    const bki_op *op = bki_op_find(op_name);
    return op && bki_backend_kernel(bki_ctx_backend(ctx ? ctx : bki_ctx()), op->name) != NULL;
}

/* ---- the schema (birkhoff/ops.h) ----------------------------------------- */
const char *bk_op_doc(const bk_op *op) { return op && in(op)->doc ? in(op)->doc : ""; }
unsigned bk_op_caps(const bk_op *op) { return op ? in(op)->caps : 0u; }

/* the key or alias of a field or array: '-' and '_' match each other */
static int same_key(const char *a, const char *b)
{
    if (!a || !b) return 0;
    for (; *a && *b; a++, b++)
        if (*a != *b && !((*a == '-' || *a == '_') && (*b == '-' || *b == '_'))) return 0;
    return *a == *b;
}

int bk_op_param_find(const bk_op *op, const char *name)
{
    for (int i = 0; op && name && i < in(op)->nfields; i++)
        if (same_key(in(op)->fields[i].name, name) || same_key(in(op)->fields[i].alias, name)) return i;
    return -1;
}

static const char *const type_names[] = {"int", "int64", "float", "enum", "list", "uint64"};

bk_status bk_op_param_info(const bk_op *op, int i, bk_op_param *info)
{
    if (!op || !info) return bki_fail(BK_ERR_NULL, "bk_op_param_info: NULL operator or info");
    if (i < 0 || i >= in(op)->nfields) return bki_fail(BK_ERR_PARAM, "%s: no parameter %d", in(op)->name, i);
    const bki_field *f = &in(op)->fields[i];
    memset(info, 0, sizeof *info);
    info->key = f->name;
    info->type = type_names[f->type];
    info->doc = f->doc ? f->doc : "";
    info->alias = f->alias;
    info->values = f->type == BKI_F_ENUM ? f->names : NULL;
    /* the default: the field's line of the default struct's text */
    union {
        max_align_t align;
        unsigned char bytes[1024];
    } def;
    if (in(op)->par_size <= sizeof def.bytes) {
        in(op)->par_default(def.bytes);
        char line[sizeof info->def + 64];
        bki_cfg_format(def.bytes, f, 1, line, sizeof line);
        const char *eq = strchr(line, '=');
        snprintf(info->def, sizeof info->def, "%s", eq ? eq + 1 : "");
        info->def[strcspn(info->def, "\n")] = 0;
        if (f->type == BKI_F_FLOAT) { /* the shortest text that reads back as the value */
            const float x = *(const float *)(const void *)(def.bytes + f->offset);
            for (int prec = 1; prec <= 9; prec++) {
                snprintf(info->def, sizeof info->def, "%.*g", prec, (double)x);
                if (strtof(info->def, NULL) == x) break;
            }
        }
    }
    bki_cfg_range(f, info->range, sizeof info->range);
    return BK_OK;
}

bk_status bk_op_config_check(const bk_op *op, const void *params)
{
    if (!op || !params) return bki_fail(BK_ERR_NULL, "bk_op_config_check: NULL operator or parameters");
    bk_status s = bki_cfg_check(params, in(op)->fields, in(op)->nfields, in(op)->name);
    if (s) return s;
    /* the operator's own check as a size query makes it, on a placeholder
     * problem (d = 2: even, as differential attention needs) */
    static const bk_attn_desc one = {1, 1, 1, 1, 2, 1, NULL, NULL};
    bki_call c = bki_call_of(in(op), &one, params);
    c.ws_mode = BKI_WS_SCALARS;
    return in(op)->check(&c);
}

/* ---- arrays ---- */
int bk_op_array_count(const bk_op *op) { return op ? in(op)->narrays : 0; }

int bk_op_array_find(const bk_op *op, const char *name)
{
    for (int i = 0; op && name && i < in(op)->narrays; i++)
        if (same_key(in(op)->arrays[i].name, name) || same_key(in(op)->arrays[i].alias, name)) return i;
    return -1;
}

bk_status bk_op_array_info(const bk_op *op, int i, bk_op_array *info)
{
    if (!op || !info) return bki_fail(BK_ERR_NULL, "bk_op_array_info: NULL operator or info");
    if (i < 0 || i >= in(op)->narrays) return bki_fail(BK_ERR_PARAM, "%s: no array %d", in(op)->name, i);
    const bki_array *a = &in(op)->arrays[i];
    memset(info, 0, sizeof *info);
    info->name = a->name;
    info->alias = a->alias;
    info->doc = a->doc ? a->doc : "";
    info->shape = a->shape_text ? a->shape_text : "";
    info->dim_key = a->dim_key;
    info->cols = a->cols;
    info->kind = a->kind; /* BK_OP_ARRAY_* == BKI_ARR_* */
    info->dim_at = a->dim_at;
    return BK_OK;
}

int bk_op_array_shape(const bk_op *op, int i, const bk_attn_desc *desc, const void *params, int64_t dims[4])
{
    if (!op || !desc || !params || !dims || i < 0 || i >= in(op)->narrays || !in(op)->arrays[i].shape) return 0;
    return in(op)->arrays[i].shape(params, desc, dims);
}

static void shape_text(char *buf, size_t cap, int rank, const int64_t *dims)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int j = 0; j < rank && n < cap; j++)
        n += (size_t)snprintf(buf + n, cap - n, j ? ", %lld" : "%lld", (long long)dims[j]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

bk_status bk_op_config_set_array(const bk_op *op, void *params, const bk_attn_desc *desc, int i, const float *data,
                                 int rank, const int64_t *dims)
{
    if (!op || !params || !desc || !data || !dims)
        return bki_fail(BK_ERR_NULL, "bk_op_config_set_array: NULL argument");
    if (i < 0 || i >= in(op)->narrays || (in(op)->arrays[i].kind & (BKI_ARR_IN | BKI_ARR_FILE)) != BKI_ARR_IN)
        return bki_fail(BK_ERR_PARAM, "%s: array %d is not an input array", in(op)->name, i);
    const bki_array *a = &in(op)->arrays[i];
    if (rank < 1 || rank > 4 || rank <= a->dim_at)
        return bki_fail(BK_ERR_SHAPE, "%s: %s must be a float32 array %s", in(op)->name, a->name, a->shape_text);
    const bki_field *key = NULL;
    int64_t old = 0; /* the dim_key's value, put back when the shape is refused */
    if (a->dim_key) { /* the array's dimension sets its key (range-checked) */
        for (int k = 0; k < in(op)->nfields; k++)
            if (strcmp(in(op)->fields[k].name, a->dim_key) == 0) key = &in(op)->fields[k];
        if (!key || key->type != BKI_F_INT) return bki_fail(BK_ERR_PARAM, "%s: bad array table", in(op)->name);
        old = *(const int *)(const void *)((const char *)params + key->offset);
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)dims[a->dim_at]);
        bk_status s = bki_cfg_set(params, in(op)->fields, in(op)->nfields, in(op)->name, a->dim_key, v);
        if (s) return s;
    }
    int64_t want[4];
    const int wr = a->shape(params, desc, want);
    int ok = wr == rank;
    for (int j = 0; ok && j < rank; j++) ok = want[j] == dims[j];
    if (!ok) {
        char w[96], g[96];
        shape_text(w, sizeof w, wr, want);
        shape_text(g, sizeof g, rank, dims);
        if (key) *(int *)(void *)((char *)params + key->offset) = (int)old;
        return bki_fail(BK_ERR_SHAPE, "%s: %s must be a float32 array %s = %s, got %s", in(op)->name, a->name,
                        a->shape_text, w, g);
    }
    memcpy((char *)params + a->offset, &data, sizeof data);
    bki_clear_error();
    return BK_OK;
}

bk_status bk_op_config_load(const bk_op *op, void *params, int i, const char *path, void **handle)
{
    if (!op || !params || !path || !handle) return bki_fail(BK_ERR_NULL, "bk_op_config_load: NULL argument");
    *handle = NULL;
    if (i < 0 || i >= in(op)->narrays || !(in(op)->arrays[i].kind & BKI_ARR_FILE))
        return bki_fail(BK_ERR_PARAM, "%s: array %d is not read from a file", in(op)->name, i);
    const bki_array *a = &in(op)->arrays[i];
    bk_status s = a->load(path, handle);
    if (s) return s;
    const void *obj = *handle;
    memcpy((char *)params + a->offset, &obj, sizeof obj);
    return BK_OK;
}

void bk_op_config_unload(const bk_op *op, int i, void *handle)
{
    if (op && handle && i >= 0 && i < in(op)->narrays && (in(op)->arrays[i].kind & BKI_ARR_FILE))
        in(op)->arrays[i].release(handle);
}

static bk_status run_arrays(bki_call *c, float *const *arrays, void *tape, void *ws, size_t ws_size)
{
    int any = 0;
    for (int i = 0; arrays && i < c->op->narrays; i++)
        any |= arrays[i] != NULL && (c->op->arrays[i].kind & (BKI_ARR_FWD | BKI_ARR_BWD));
    if (c->op->run_arrays && arrays) return c->op->run_arrays(c, arrays, tape, ws, ws_size);
    if (any) return bki_fail(BK_ERR_PARAM, "%s: output arrays given, but the operator has none", c->op->name);
    return c->dout ? bki_op_backward(c, tape, ws, ws_size) : bki_op_forward(c, tape, ws, ws_size);
}

bk_status bk_op_forward_arrays(const bk_op *op, const bk_attn_desc *desc, const void *params, const bk_tensor *q,
                               const bk_tensor *k, const bk_tensor *v, const bk_tensor *o, void *tape,
                               const bk_tensor *attn, float *const *arrays, void *ws, size_t ws_size)
{
    if (!op) return bki_fail(BK_ERR_NULL, "bk_op_forward_arrays: NULL operator");
    bki_call c = bki_call_of(in(op), desc, params);
    c.q = q; c.k = k; c.v = v; c.out = o; c.attn = attn;
    return run_arrays(&c, arrays, tape, ws, ws_size);
}

bk_status bk_op_backward_arrays(const bk_op *op, const bk_attn_desc *desc, const void *params, const bk_tensor *q,
                                const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout, const void *tape,
                                const bk_tensor *dq, const bk_tensor *dk, const bk_tensor *dv, float *const *arrays,
                                void *ws, size_t ws_size)
{
    if (!op) return bki_fail(BK_ERR_NULL, "bk_op_backward_arrays: NULL operator");
    if (!dout) return bki_fail(BK_ERR_NULL, "bk_op_backward_arrays: dout is NULL");
    bki_call c = bki_call_of(in(op), desc, params);
    c.q = q; c.k = k; c.v = v; c.dout = dout; c.dq = dq; c.dk = dk; c.dv = dv;
    return run_arrays(&c, arrays, (void *)(uintptr_t)tape, ws, ws_size);
}

/* ---- learned arrays, presets, bench cases ---- */
int bk_op_learned_count(const bk_op *op) { return op ? in(op)->nlearned : 0; }

bk_status bk_op_learned_info(const bk_op *op, int i, const void *params, int H, int d, bk_op_learned *info)
{
    if (!op || !info) return bki_fail(BK_ERR_NULL, "bk_op_learned_info: NULL operator or info");
    if (i < 0 || i >= in(op)->nlearned) return bki_fail(BK_ERR_PARAM, "%s: no learned array %d", in(op)->name, i);
    const bki_learned *l = &in(op)->learned[i];
    memset(info, 0, sizeof *info);
    info->name = l->name;
    info->doc = l->doc ? l->doc : "";
    if (params && l->shape) info->rank = l->shape(params, H, d, info->dims);
    return BK_OK;
}

int bk_op_preset_count(const bk_op *op) { return op ? in(op)->npresets : 0; }

bk_status bk_op_preset_info(const bk_op *op, int i, bk_op_preset *info)
{
    if (!op || !info) return bki_fail(BK_ERR_NULL, "bk_op_preset_info: NULL operator or info");
    if (i < 0 || i >= in(op)->npresets) return bki_fail(BK_ERR_PARAM, "%s: no preset %d", in(op)->name, i);
    info->name = in(op)->presets[i].name;
    info->params = in(op)->presets[i].params;
    info->doc = in(op)->presets[i].doc ? in(op)->presets[i].doc : "";
    return BK_OK;
}

const bk_op *bk_op_find_preset(const char *name, const char **params)
{
    for (int i = 0; name && i < NOPS; i++)
        for (int j = 0; j < ops[i]->npresets; j++)
            if (strcmp(ops[i]->presets[j].name, name) == 0) {
                if (params) *params = ops[i]->presets[j].params;
                return out(ops[i]);
            }
    return NULL;
}

bk_status bk_op_config_parse(const bk_op *op, void *params, const char *text)
{
    if (!op || !params) return bki_fail(BK_ERR_NULL, "bk_op_config_parse: NULL operator or parameters");
    bk_status s = bki_cfg_parse(params, in(op)->fields, in(op)->nfields, in(op)->name, text);
    if (s == BK_OK) bki_clear_error();
    return s;
}

int bk_op_bench_count(const bk_op *op) { return op ? in(op)->nbench : 0; }

bk_status bk_op_bench_info(const bk_op *op, int i, bk_op_bench_case *info)
{
    if (!op || !info) return bki_fail(BK_ERR_NULL, "bk_op_bench_info: NULL operator or case");
    if (i < 0 || i >= in(op)->nbench) return bki_fail(BK_ERR_PARAM, "%s: no bench case %d", in(op)->name, i);
    const bki_bench_case *b = &in(op)->bench[i];
    info->name = b->name ? b->name : "";
    info->B = b->B; info->H = b->H; info->Nq = b->Nq; info->Nk = b->Nk; info->d = b->d; info->dv = b->dv;
    info->params = b->params ? b->params : "";
    info->backward = b->backward;
    return BK_OK;
}

/* the public constants are the internal ones */
_Static_assert(BK_OP_CAP_CROSS == BKI_CAP_CROSS && BK_OP_CAP_PAD == BKI_CAP_PAD && BK_OP_CAP_CAUSAL == BKI_CAP_CAUSAL &&
                   BK_OP_CAP_ATTN == BKI_CAP_ATTN && BK_OP_CAP_MODEL == BKI_CAP_MODEL,
               "BK_OP_CAP_* == BKI_CAP_*");
_Static_assert(BK_OP_ARRAY_IN == BKI_ARR_IN && BK_OP_ARRAY_FWD == BKI_ARR_FWD && BK_OP_ARRAY_BWD == BKI_ARR_BWD &&
                   BK_OP_ARRAY_REQUIRED == BKI_ARR_REQUIRED && BK_OP_ARRAY_FILE == BKI_ARR_FILE &&
                   BK_OP_ARRAY_SUMMARY == BKI_ARR_SUMMARY && BK_OP_ARRAY_HOST == BKI_ARR_HOST,
               "BK_OP_ARRAY_* == BKI_ARR_*");
