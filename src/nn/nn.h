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
    int init;        /* -1: by name (model.c's init_params); BKI_INIT_*: an
                        attention tensor's (bki_attn_tensors), sd init_sd   */
    double init_sd;
} bki_param;

const bki_param *bki_model_table(const bk_model *m, int *count);
/* A run's schedule fixed from its length run_steps (batches x epochs), as
 * bk_run_config_resolve does when the run starts (optim.c): a cosine
 * schedule's total_steps 0 becomes run_steps; warmup -1 (the run default)
 * becomes the automatic warm-up, 5 % of the schedule's steps (total_steps
 * for cosine, else run_steps), rounded down, at most BKI_WARMUP_MAX (by then
 * Adam's second-moment estimate, over 1 / (1 - beta2) = 1000 steps at the
 * default beta2, has settled). Both are recorded numbers from then on, so a
 * stored run re-reads the same schedule. */
#define BKI_WARMUP_DIV 20
#define BKI_WARMUP_MAX 1000
void bki_optim_plan(bk_optim_config *c, int64_t run_steps);
/* t as a JSON string literal, quotes included (malloc'd; NULL when out of
 * memory): quote and backslash escaped, control characters as \n or \u00XX
 * (ckpt.c, the checkpoint header's writer) */
char *bki_json_string(const char *t);
/* 1 when a line of a run checkpoint's metadata (extra) is the run's
 * position or a data version (pos_*, data_train=, data_valid_version=,
 * data_test_version=, and an old run's data_test=), not a configuration key
 * (run.c) */
int bki_run_meta_line(const char *extra, const char *line);
/* key is one of the model configuration's (its text form's, an old key, or
 * a site's "attn.KEY" of any operator) (config.c) */
int bki_model_config_key(const bk_model_config *c, const char *key);
uint64_t bki_model_seed(const bk_model *m);
/* elements per sample of the batch's input array (x, or tokens) */
int64_t bki_model_sample_size(const bk_model *m);
int bki_model_max_batch(const bk_model *m);
/* samples [s, s + n) of a batch (model.c); the weight of a batch in a mean
 * over micro-batches: its samples, or (seq2seq) its target tokens */
bk_batch bki_batch_slice(const bk_model *m, const bk_batch *b, int s, int n);
int64_t bki_batch_weight(const bk_model *m, const bk_batch *b);
/* gradient accumulation over micro-batches [k0, k1) of chunk samples
 * (optim.c; bk_train_step and the training loop) */
bk_status bki_train_accumulate(bk_model *m, const bk_batch *b, int chunk, int k0, int k1, int64_t total_w, float ls,
                               double *loss_sum, int64_t *hits);
uint64_t bki_model_fwd_count(const bk_model *m);
void bki_model_set_fwd_count(bk_model *m, uint64_t c);
/* the compiled ASAP layer of block l (NULL when none is attached) */
const bk_asap_layer *bki_model_asap(const bk_model *m, int layer);
/* The model's constraints on its parameters, restored after every
 * optimiser update (bk_optim_step calls it last): an OTK pool's Nystrom
 * anchors pool.otk_w back to unit rows. The one post-update mechanism of
 * the engine; a no-op for a model without constrained parameters. */
void bki_model_post_update(bk_model *m);

/* ---- the encoder-decoder's incremental decoding (model.c, seq2seq_step.c) ----
 * bki_s2s_encode runs the encoder on B <= max_batch sentences (checked by
 * the caller). A decoder state holds rows = B * beam hypotheses: every
 * decoder layer's keys and values of the positions fed so far (cache = 1),
 * or the rows' prefixes, recomputed from the start at every step (cache =
 * 0: the same numbers, what the cache saves). bki_s2s_step has the
 * semantics of bki_decoder.step (src/train/decode.h): feeds token tok[r] at
 * position t to row r, whose state continues row parent[r] of step t - 1,
 * and writes the next token's log-probabilities logp [rows, vocab]. */
bk_status bki_s2s_encode(bk_model *m, const int32_t *src, int stride, const int32_t *len, int B);
typedef struct bki_s2s_dec bki_s2s_dec;
bk_status bki_s2s_dec_create(bk_model *m, int B, int beam, int max_steps, int cache, bki_s2s_dec **out);
bk_status bki_s2s_step(bki_s2s_dec *d, int t, int rows, const int32_t *parent, const int32_t *tok, float *logp);
void bki_s2s_dec_free(bki_s2s_dec *d);

/* ---- optimiser state access for checkpoints (optim.c) ------------------- */
/* slots: 0 (SGD momentum "buf" / Adam "m") and 1 (Adam "v"); NULL if absent */
int bki_optim_slots(const bk_optim *o);
const char *bki_optim_slot_name(const bk_optim *o, int slot);
float *bki_optim_slot(bk_optim *o, int slot);
void bki_optim_set_step(bk_optim *o, int64_t step);

#endif
