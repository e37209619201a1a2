/* sinkhorn.c -- Sinkhorn attention (Sinkformers): the public entry points.
 * Semantics in include/birkhoff.h and docs/ALGORITHMS.md; the work is done by
 * the shared attention driver (attn.c) and the LSE engine. */
#include "ops.h"

bk_sinkhorn_params bk_sinkhorn_params_default(void)
{
    bk_sinkhorn_params p = {0.0f, 1.0f, 5, 0.0f, BK_GRAD_UNROLLED};
    return p;
}

static bk_status cfg_of(const bk_sinkhorn_params *p, bki_attn_cfg *c)
{
    if (!p) return bki_fail(BK_ERR_NULL, "Sinkhorn parameters are NULL");
    c->kind = BKI_KIND_SINKHORN;
    c->scale = p->scale;
    c->eps = p->eps;
    c->S = p->iters;
    c->tol = p->tol;
    c->grad = p->grad;
    c->kappa = 1.0f;
    return BK_OK;
}

size_t bk_sinkhorn_workspace_size(const bk_attn_desc *desc, const bk_sinkhorn_params *p)
{
    bki_attn_cfg c;
    if (!p || cfg_of(p, &c)) return 0;
    return bki_attn_workspace_size(desc, &c);
}

size_t bk_sinkhorn_tape_size(const bk_attn_desc *desc, const bk_sinkhorn_params *p)
{
    return p ? bki_attn_tape_size(desc, p->iters) : 0;
}

bk_status bk_sinkhorn_forward(const bk_attn_desc *desc, const bk_sinkhorn_params *p, const bk_tensor *q,
                              const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                              const bk_sinkhorn_extras *extras, void *ws, size_t ws_size)
{
    bki_attn_cfg c;
    bk_status s = cfg_of(p, &c);
    if (s) return s;
    return bki_attn_forward(desc, &c, q, k, v, out, tape, extras, ws, ws_size);
}

bk_status bk_sinkhorn_backward(const bk_attn_desc *desc, const bk_sinkhorn_params *p, const bk_tensor *q,
                               const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout,
                               const void *tape, const bk_tensor *dq, const bk_tensor *dk,
                               const bk_tensor *dv, void *ws, size_t ws_size)
{
    bki_attn_cfg c;
    bk_status s = cfg_of(p, &c);
    if (s) return s;
    return bki_attn_backward(desc, &c, q, k, v, dout, tape, dq, dk, dv, ws, ws_size);
}
