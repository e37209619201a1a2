/* softmax.c -- softmax attention: the S = 1 case of the shared driver and
 * LSE engine (one row pass; the backward is Cbar = A .* (Abar - rowsum)). */
#include "ops.h"

static bki_attn_cfg cfg_of(const bk_softmax_params *p)
{
    bki_attn_cfg c = {BKI_KIND_SOFTMAX, p ? p->scale : 0.0f, 1.0f, 1, 0.0f, BK_GRAD_UNROLLED, 1.0f};
    return c;
}

size_t bk_softmax_workspace_size(const bk_attn_desc *desc)
{
    bki_attn_cfg c = cfg_of(NULL);
    return bki_attn_workspace_size(desc, &c);
}

size_t bk_softmax_tape_size(const bk_attn_desc *desc) { return bki_attn_tape_size(desc, 1); }

bk_status bk_softmax_forward(const bk_attn_desc *desc, const bk_softmax_params *p, const bk_tensor *q,
                             const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                             const bk_tensor *attn, void *ws, size_t ws_size)
{
    if (!p) return bki_fail(BK_ERR_NULL, "softmax parameters are NULL");
    bki_attn_cfg c = cfg_of(p);
    bk_sinkhorn_extras ex = {{0}, NULL, NULL, NULL};
    if (attn) ex.attn = *attn;
    return bki_attn_forward(desc, &c, q, k, v, out, tape, attn ? &ex : NULL, ws, ws_size);
}

bk_status bk_softmax_backward(const bk_attn_desc *desc, const bk_softmax_params *p, const bk_tensor *q,
                              const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout,
                              const void *tape, const bk_tensor *dq, const bk_tensor *dk,
                              const bk_tensor *dv, void *ws, size_t ws_size)
{
    if (!p) return bki_fail(BK_ERR_NULL, "softmax parameters are NULL");
    bki_attn_cfg c = cfg_of(p);
    return bki_attn_backward(desc, &c, q, k, v, dout, tape, dq, dk, dv, ws, ws_size);
}
