/* ops.h -- internal interface of the attention operators (not installed). */
#ifndef BK_OPS_H
#define BK_OPS_H
#include "../core/internal.h"

/* OTK descriptor checks (sizes, lengths in [1, n]) (otk.c). */
bk_status bki_otk_check_desc(const bk_otk_desc *d);
/* OTK transport statistics for the unsupervised fits (otk.c). */
bk_status bki_otk_transport(const bk_otk_desc *d, const bk_otk_config *p, const float *F, const float *z,
                            double *sim, const int *ref, float *bary);

/* How ESP and ASAP plan a call's problems (esp.c, asap.c; ASAP's L = 0:
 * the teacher alone); the tests assert the team mode with them. */
bki_plan bki_esp_plan(const bk_attn_desc *d, const bk_esp_config *p);
bki_plan bki_asap_plan(const bk_attn_desc *d, int L);
#endif
