/* birkhoff/compat.h -- the names of option structs before issue 18, kept so
 * that code written against them still compiles. Deprecated: they will be
 * removed at 1.0. Include <birkhoff.h> (which includes this file) or this
 * file after the headers it maps.
 *
 * Every option struct is now `bk_<thing>_config` with a
 * `bk_<thing>_config_default()` (birkhoff/core.h, "CONVENTIONS OF THE WHOLE
 * API"):
 *   bk_<op>_params        -> bk_<op>_config  (softmax, sinkhorn, unbalanced,
 *                                             esp, lot, otk, kmeans)
 *   bk_asap_params        -> bk_asap_forward_config
 *   bk_asap_kl_opts       -> bk_asap_kl_config
 *   bk_op_params_*        -> bk_op_config_*  (size, default, set, format)
 *   bk_op_param_count/key -> bk_op_config_count/key
 * The structs' layouts are unchanged. */
#ifndef BIRKHOFF_COMPAT_H
#define BIRKHOFF_COMPAT_H

#include "asap.h"
#include "attn.h"
#include "esp.h"
#include "lot.h"
#include "ops.h"
#include "otk.h"

typedef bk_softmax_config bk_softmax_params;
typedef bk_sinkhorn_config bk_sinkhorn_params;
typedef bk_unbalanced_config bk_unbalanced_params;
typedef bk_esp_config bk_esp_params;
typedef bk_lot_config bk_lot_params;
typedef bk_otk_config bk_otk_params;
typedef bk_kmeans_config bk_kmeans_params;
typedef bk_asap_forward_config bk_asap_params;
typedef bk_asap_kl_config bk_asap_kl_opts;

#define bk_softmax_params_default bk_softmax_config_default
#define bk_sinkhorn_params_default bk_sinkhorn_config_default
#define bk_unbalanced_params_default bk_unbalanced_config_default
#define bk_esp_params_default bk_esp_config_default
#define bk_lot_params_default bk_lot_config_default
#define bk_otk_params_default bk_otk_config_default
#define bk_kmeans_params_default bk_kmeans_config_default
#define bk_asap_kl_opts_default bk_asap_kl_config_default
#define bk_op_params_size bk_op_config_size
#define bk_op_params_default bk_op_config_default
#define bk_op_params_set bk_op_config_set
#define bk_op_params_format bk_op_config_format
#define bk_op_param_count bk_op_config_count
#define bk_op_param_key bk_op_config_key

#endif /* BIRKHOFF_COMPAT_H */
