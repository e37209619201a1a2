/* decode.h -- model-independent beam search (greedy = beam 1) for the
 * translation decoding (internal; the model's step is a callback).
 * The algorithm is described at the top of decode.c. */
#ifndef BK_TRAIN_DECODE_H
#define BK_TRAIN_DECODE_H

#include "../core/internal.h"

typedef struct {
    void *ctx;
    int vocab;      /* >= 1                                                   */
    int bos, eos;   /* in [0, vocab)                                          */
    /* One decoding step for all rows = B * beam hypotheses (row r = b * beam + k).
     * t: the position being fed (0 = the BOS position); tok[r]: the token at position t of row r's
     * hypothesis (t = 0: bos); parent[r]: the row (of step t - 1) whose state row r continues
     * (the callee reorders its cached per-row state by it: new_state[r] = old_state[parent[r]];
     * at t = 0 parent[r] = r). Writes logp[r * vocab + v] = log p(next token = v | prefix of row r),
     * finite or -INFINITY. Returns BK_OK or an error (then the search stops with it).
     * Rows that hold no live hypothesis (the beam is not full, or the sentence is done) are fed
     * eos with parent[r] = r; their logp is not read (it may hold anything). NaN or +inf in a row
     * that is read: BK_ERR_NONFINITE. */
    bk_status (*step)(void *ctx, int t, int rows, const int32_t *parent, const int32_t *tok, float *logp);
} bki_decoder;

/* B sentences, beam = c->beam; max_len[b] >= 1: the longest output of sentence b counted WITH its EOS
 * (at position max_len[b]-1 the only allowed token is eos: EOS is forced at the limit).
 * out[b * out_stride + i] (i < out_len[b]) receives the best finished hypothesis without BOS and EOS;
 * score[b] (nullable) its score = sum of log p of its tokens including the EOS, divided by
 * (number of tokens including the EOS)^len_penalty (fairseq's length penalty).
 * Needs out_stride >= max over b of max_len[b] - 1 (else BK_ERR_SHAPE). All memory allocated once
 * at the start (workspace for rows * vocab candidate scores etc.), freed at the end.
 * Errors: NULL d, d->step, c, max_len, out or out_len (BK_ERR_NULL); B < 1, vocab < 1, B * beam
 * too large or out_stride too small (BK_ERR_SHAPE); beam outside [1, 1024], len_penalty not
 * finite, bos or eos outside [0, vocab) (BK_ERR_PARAM); max_len[b] < 1 (BK_ERR_LENGTH); NaN or
 * +inf from step (BK_ERR_NONFINITE); a sentence whose every hypothesis has log-probability -inf
 * (BK_ERR_NUMERIC); step's own error as returned. Outputs are written only on success. */
bk_status bki_beam_search(const bki_decoder *d, int B, const bk_decode_config *c, const int *max_len,
                          int32_t *out, int out_stride, int32_t *out_len, float *score);

#endif
