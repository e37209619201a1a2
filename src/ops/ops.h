/* ops.h -- internal interface of the attention operators (not installed). */
#ifndef BK_OPS_H
#define BK_OPS_H
#include "../core/internal.h"

enum { BKI_KIND_SOFTMAX = 1, BKI_KIND_SINKHORN = 2 };

/* Resolved operator configuration for the shared attention driver. */
typedef struct {
    uint32_t kind;      /* BKI_KIND_*: recorded in the tape */
    float scale, eps;   /* scale 0 = 1/sqrt(d)              */
    int S;
    float tol;
    bk_grad_mode grad;
    float kappa;        /* column damping (unbalanced); 0 or 1 = balanced */
} bki_attn_cfg;

size_t bki_attn_workspace_size(const bk_attn_desc *d, const bki_attn_cfg *c);
size_t bki_attn_tape_size(const bk_attn_desc *d, int S);
bk_status bki_attn_forward(const bk_attn_desc *d, const bki_attn_cfg *c, const bk_tensor *q,
                           const bk_tensor *k, const bk_tensor *v, const bk_tensor *out, void *tape,
                           const bk_sinkhorn_extras *ex, void *ws, size_t ws_size);
bk_status bki_attn_backward(const bk_attn_desc *d, const bki_attn_cfg *c, const bk_tensor *q,
                            const bk_tensor *k, const bk_tensor *v, const bk_tensor *dout,
                            const void *tape, const bk_tensor *dq, const bk_tensor *dk,
                            const bk_tensor *dv, void *ws, size_t ws_size);
/* OTK descriptor checks (sizes, lengths in [1, n]) (otk.c). */
bk_status bki_otk_check_desc(const bk_otk_desc *d);
/* OTK transport statistics for the unsupervised fits (otk.c). */
bk_status bki_otk_transport(const bk_otk_desc *d, const bk_otk_params *p, const float *F, const float *z,
                            double *sim, const int *ref, float *bary);
#endif
