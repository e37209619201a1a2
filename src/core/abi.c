/* abi.c -- sizes of the public structs by name, so that bindings
 * written against the header without a compiler (python/birkhoff, ctypes)
 * can check their mirror of every struct at load time. */
#include "internal.h"

#include <string.h>

#define ROW(T) {#T, sizeof(T)}

static const struct {
    const char *name;
    size_t size;
} abi_table[] = {
    ROW(bk_tensor),          ROW(bk_attn_desc),        ROW(bk_context_config),        ROW(bk_sinkhorn_config), ROW(bk_sinkhorn_diag),
    ROW(bk_sinkhorn_extras), ROW(bk_softmax_config),   ROW(bk_unbalanced_config),   ROW(bk_esp_config),      ROW(bk_esp_diag),
    ROW(bk_esp_extras),      ROW(bk_lot_config),       ROW(bk_lot_diag),        ROW(bk_lot_extras),      ROW(bk_diff_config),      ROW(bk_diff_extras),
    ROW(bk_otk_desc),        ROW(bk_otk_config),       ROW(bk_otk_diag),        ROW(bk_otk_extras),
    ROW(bk_kmeans_config),   ROW(bk_kmeans_report),    ROW(bk_asap_layer),      ROW(bk_asap_config),
    ROW(bk_asap_kl_config),    ROW(bk_asap_fit_report),  ROW(bk_asap_extras),     ROW(bk_attn_fidelity),
    ROW(bk_model_config),    ROW(bk_optim_config),     ROW(bk_batch),           ROW(bk_param_info),
    ROW(bk_data_config),     ROW(bk_dataset_info),     ROW(bk_parallel_config), ROW(bk_parallel_info),
    ROW(bk_sentence_pair),
    ROW(bk_op_param),        ROW(bk_op_array),         ROW(bk_op_learned),      ROW(bk_op_preset),       ROW(bk_op_bench_case),
};

size_t bk_abi_sizeof(const char *name)
{
    if (!name) return 0;
    for (size_t i = 0; i < sizeof abi_table / sizeof abi_table[0]; i++)
        if (strcmp(abi_table[i].name, name) == 0) return abi_table[i].size;
    return 0;
}
