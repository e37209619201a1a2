/* nn.h -- declarations shared inside the training engine (src/nn), hidden
 * from the shared library like the rest of the bki_* names. */
#ifndef BK_NN_H
#define BK_NN_H

#include "../core/internal.h"

/* ---- model internals used by the optimiser and checkpoints (model.c) ---- */
typedef struct {
    char name[64];
    int ndim;
    int64_t shape[4];
    int64_t off, count;
    int decay;
} bki_param;

const bki_param *bki_model_table(const bk_model *m, int *count);
uint64_t bki_model_seed(const bk_model *m);
/* elements per sample of the batch's input array (x, or tokens) */
int64_t bki_model_sample_size(const bk_model *m);
uint64_t bki_model_fwd_count(const bk_model *m);
void bki_model_set_fwd_count(bk_model *m, uint64_t c);
/* the compiled ASAP layer of block l (NULL when none is attached) */
const bk_asap_layer *bki_model_asap(const bk_model *m, int layer);

/* ---- optimiser state access for checkpoints (optim.c) ------------------- */
/* slots: 0 (SGD momentum "buf" / Adam "m") and 1 (Adam "v"); NULL if absent */
int bki_optim_slots(const bk_optim *o);
const char *bki_optim_slot_name(const bk_optim *o, int slot);
float *bki_optim_slot(bk_optim *o, int slot);
void bki_optim_set_step(bk_optim *o, int64_t step);

#endif
