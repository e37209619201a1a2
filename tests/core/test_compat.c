/* test_compat.c -- the deprecated option-struct names (birkhoff/compat.h)
 * still compile and mean the new ones: same types, same defaults, and the
 * registry's old function names reach the new functions. */
#include "birkhoff.h"
#include "../harness.h"

#include <string.h>

void test_compat(void)
{
    bk_sinkhorn_params sp = bk_sinkhorn_params_default();
    bk_sinkhorn_config sc = bk_sinkhorn_config_default();
    bk_esp_params ep = bk_esp_params_default();
    bk_esp_config ec = bk_esp_config_default();
    bk_otk_params op = bk_otk_params_default();
    bk_otk_config oc = bk_otk_config_default();
    bk_asap_kl_opts ko = bk_asap_kl_opts_default();
    bk_asap_kl_config kc = bk_asap_kl_config_default();
    /* field by field (padding bytes are unspecified) */
    th_check(sp.iters == sc.iters && sp.eps == sc.eps && sp.scale == sc.scale && sp.tol == sc.tol &&
                 sp.grad == sc.grad && ep.sort == ec.sort && ep.t == ec.t && ep.tau == ec.tau && ep.L == ec.L &&
                 ep.seed == ec.seed && op.iters == oc.iters && op.eps == oc.eps && op.domain == oc.domain &&
                 ko.max_iters == kc.max_iters && sizeof sp == sizeof sc && sizeof ko == sizeof kc,
             "compat: the old option-struct names are the new structs with the same defaults", "%s", "");
    const bk_op *lot = bk_op_find("lot");
    bk_lot_params lp;
    bk_op_params_default(lot, &lp);
    th_check(bk_op_params_size(lot) == sizeof(bk_lot_config) && bk_op_params_set(lot, &lp, "iters", "7") == BK_OK &&
                 lp.iters == 7 && bk_op_param_count(lot) == bk_op_config_count(lot) &&
                 !strcmp(bk_op_param_key(lot, 0), bk_op_config_key(lot, 0)),
             "compat: the registry's old function names", "%s", bk_last_error());
}
