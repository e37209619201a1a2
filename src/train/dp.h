/* dp.h -- data-parallel training's collectives over a bk_train_comm
 * (dp.c; the training loop, train.c, is their one user). Every function is
 * collective: all ranks call it in the same order. */
#ifndef BK_TRAIN_DP_H
#define BK_TRAIN_DP_H

#include "../nn/nn.h"

enum { BKI_DP_SUMS = 4 }; /* doubles bki_dp_sum takes at once */

typedef struct {
    const bk_train_comm *c; /* NULL: one process (every function a no-op)   */
    float *send, *recv;     /* the gradient sum's buffers (piece floats each) */
    int64_t piece;          /* floats reduced per round: a multiple of size  */
    void *reports;          /* size failure reports (bki_dp_agree)           */
    double *sums;           /* size * BKI_DP_SUMS (bki_dp_sum, same_u64)     */
    int broken;             /* a collective failed: no agreement is possible */
} bki_dp;

/* comm NULL or size 1: one process. Checks the comm (BK_ERR_PARAM) and
 * allocates the small buffers every collective uses, so that none
 * allocates; bki_dp_reserve then sizes the gradient buffers. */
bk_status bki_dp_init(bki_dp *d, const bk_train_comm *comm);
bk_status bki_dp_reserve(bki_dp *d, int64_t nparams);
void bki_dp_free(bki_dp *d);
static inline int bki_dp_on(const bki_dp *d) { return d->c != NULL; }
static inline int bki_dp_rank(const bki_dp *d) { return d->c ? d->c->rank : 0; }
static inline int bki_dp_size(const bki_dp *d) { return d->c ? d->c->size : 1; }
/* whether a collective failed (the transport's own error: the ranks cannot
 * agree on the failure, the caller must end them, e.g. by MPI_Abort) */
static inline int bki_dp_broken(const bki_dp *d) { return d->broken; }

/* Agrees on a failure: every rank passes its status (and, on failure, its
 * bk_last_error stands); returns BK_OK when all succeeded, else on every rank
 * the status of the lowest failing rank, with this rank's own message if it
 * failed and "rank K failed (its message: ...)" otherwise: the failing
 * rank's first 200 bytes travel with the status. `what` names the stage. */
bk_status bki_dp_agree(bki_dp *d, bk_status st, const char *what);

/* rank 0's bytes to every rank */
bk_status bki_dp_bcast(bki_dp *d, void *buf, size_t bytes);

/* v[0..n) summed over ranks in rank order (in place, on every rank; n <=
 * BKI_DP_SUMS) */
bk_status bki_dp_sum(bki_dp *d, double *v, int n);

/* g[0..n) summed over ranks in rank order, in place, on every rank */
bk_status bki_dp_sum_floats(bki_dp *d, float *g, int64_t n);

/* Compares each rank's text with rank 0's: BK_ERR_PARAM on every rank when
 * one differs, naming the rank and the first differing "key=" line. */
bk_status bki_dp_same_text(bki_dp *d, const char *text, const char *what);

/* Compares a 64-bit value across ranks: BK_ERR_NUMERIC naming the first rank
 * whose value differs from rank 0's. */
bk_status bki_dp_same_u64(bki_dp *d, uint64_t v, const char *what);

#endif
