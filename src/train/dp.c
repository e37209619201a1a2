/* dp.c -- the collectives of data-parallel training (dp.h) over the
 * caller's bk_train_comm (birkhoff/train.h: bcast, allgather, alltoall).
 * Sums are taken in rank order by the code here, never by the transport,
 * so a run over N ranks is bitwise reproducible whatever reduction the
 * transport would have chosen. */
#include "dp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DP_PIECE = 1 << 22, DP_MSG = 200 };

/* a collective failed: the ranks can no longer agree on anything (the
 * caller aborts them: BK_TRAIN_STAGE_COMM) */
static bk_status io_fail(bki_dp *d, const char *what)
{
    d->broken = 1;
    return bki_fail(BK_ERR_IO, "data-parallel training: collective failed (%s)", what);
}

typedef struct {
    int32_t status;
    char msg[DP_MSG];
} dp_report;

bk_status bki_dp_init(bki_dp *d, const bk_train_comm *comm)
{
    memset(d, 0, sizeof *d);
    if (!comm || comm->size == 1) return BK_OK;
    if (comm->size < 1 || comm->rank < 0 || comm->rank >= comm->size || !comm->bcast || !comm->allgather ||
        !comm->alltoall)
        return bki_fail(BK_ERR_PARAM, "bk_train_run_comm: rank %d of size %d, or a NULL function", comm->rank,
                        comm->size);
    d->c = comm;
    d->reports = malloc(sizeof(dp_report) * (size_t)comm->size);
    d->sums = malloc(sizeof(double) * BKI_DP_SUMS * (size_t)comm->size);
    if (!d->reports || !d->sums) {
        bki_dp_free(d);
        return bki_fail(BK_ERR_NOMEM, "data-parallel training: out of memory");
    }
    return BK_OK;
}

bk_status bki_dp_reserve(bki_dp *d, int64_t nparams)
{
    if (!d->c) return BK_OK;
    const int R = d->c->size;
    /* a piece of whole segments, no larger than the gradient needs */
    int64_t piece = nparams < DP_PIECE ? nparams : DP_PIECE;
    piece = (piece + R - 1) / R * R;
    if (piece < R) piece = R;
    d->piece = piece;
    d->send = malloc(sizeof(float) * (size_t)piece);
    d->recv = malloc(sizeof(float) * (size_t)piece);
    if (!d->send || !d->recv)
        return bki_fail(BK_ERR_NOMEM, "data-parallel training: out of memory for the gradient buffers");
    return BK_OK;
}

void bki_dp_free(bki_dp *d)
{
    free(d->send);
    free(d->recv);
    free(d->reports);
    free(d->sums);
    memset(d, 0, sizeof *d);
}

bk_status bki_dp_agree(bki_dp *d, bk_status st, const char *what)
{
    if (!d->c) return st;
    const int n = d->c->size;
    dp_report mine, *all = d->reports;
    memset(&mine, 0, sizeof mine);
    mine.status = (int32_t)st;
    if (st != BK_OK) snprintf(mine.msg, sizeof mine.msg, "%s", bk_last_error());
    if (d->c->allgather(d->c->user, &mine, all, sizeof mine)) return io_fail(d, what);
    int k = 0;
    while (k < n && all[k].status == BK_OK) k++;
    if (k == n) return BK_OK;
    if (st != BK_OK) return st; /* this rank's own failure and message */
    return bki_fail((bk_status)all[k].status, "rank %d failed (%s): %.*s", k, what, DP_MSG, all[k].msg);
}

bk_status bki_dp_bcast(bki_dp *d, void *buf, size_t bytes)
{
    if (!d->c || !bytes) return BK_OK;
    return d->c->bcast(d->c->user, buf, bytes) ? io_fail(d, "broadcast") : BK_OK;
}

bk_status bki_dp_sum(bki_dp *d, double *v, int n)
{
    if (!d->c || n < 1) return BK_OK;
    if (n > BKI_DP_SUMS) return bki_fail(BK_ERR_PARAM, "internal: bki_dp_sum of %d values", n);
    const int R = d->c->size;
    const double *all = d->sums;
    if (d->c->allgather(d->c->user, v, d->sums, sizeof(double) * (size_t)n)) return io_fail(d, "sum");
    for (int i = 0; i < n; i++) {
        double s = all[i];
        for (int k = 1; k < R; k++) s += all[(size_t)k * n + i];
        v[i] = s;
    }
    return BK_OK;
}

/* One piece: rank k owns segment k; it receives every rank's copy of that
 * segment, adds them in rank order, and the sums are gathered back. */
bk_status bki_dp_sum_floats(bki_dp *d, float *g, int64_t n)
{
    if (!d->c) return BK_OK;
    const int R = d->c->size;
    for (int64_t p0 = 0; p0 < n; p0 += d->piece) {
        const int64_t len = n - p0 < d->piece ? n - p0 : d->piece;
        const int64_t seg = (len + R - 1) / R;
        memcpy(d->send, g + p0, sizeof(float) * (size_t)len);
        memset(d->send + len, 0, sizeof(float) * (size_t)(seg * R - len));
        if (d->c->alltoall(d->c->user, d->send, d->recv, sizeof(float) * (size_t)seg)) return io_fail(d, "alltoall");
        for (int k = 1; k < R; k++) {
            const float *b = d->recv + (size_t)k * (size_t)seg;
            for (int64_t i = 0; i < seg; i++) d->recv[i] += b[i];
        }
        if (d->c->allgather(d->c->user, d->recv, d->send, sizeof(float) * (size_t)seg)) return io_fail(d, "allgather");
        memcpy(g + p0, d->send, sizeof(float) * (size_t)len);
    }
    return BK_OK;
}

/* the "key=value" line of text at offset at (its key and value, for a message) */
static void line_at(const char *text, size_t at, char *out, size_t cap)
{
    size_t b = at;
    while (b > 0 && text[b - 1] != '\n') b--;
    size_t e = b;
    while (text[e] && text[e] != '\n') e++;
    snprintf(out, cap, "%.*s", (int)(e - b), text + b);
}

bk_status bki_dp_same_text(bki_dp *d, const char *text, const char *what)
{
    if (!d->c) return BK_OK;
    uint64_t len = strlen(text);
    bk_status st = bki_dp_bcast(d, &len, sizeof len);
    if (st) return st;
    char *ref = malloc((size_t)len + 1);
    st = bki_dp_agree(d, ref ? BK_OK : bki_fail(BK_ERR_NOMEM, "data-parallel training: out of memory"), what);
    if (st != BK_OK) {
        free(ref);
        return st;
    }
    if (d->c->rank == 0) memcpy(ref, text, (size_t)len);
    if ((st = bki_dp_bcast(d, ref, (size_t)len)) != BK_OK) {
        free(ref);
        return st;
    }
    ref[len] = 0;
    bk_status mine = BK_OK;
    if (strcmp(ref, text)) {
        size_t i = 0;
        while (ref[i] && ref[i] == text[i]) i++;
        char a[160], b[160];
        line_at(ref, i, a, sizeof a);
        line_at(text, i, b, sizeof b);
        mine = bki_fail(BK_ERR_PARAM, "rank %d's %s differs from rank 0's: '%s' (rank 0: '%s')", d->c->rank, what, b,
                        a);
    }
    free(ref);
    return bki_dp_agree(d, mine, what);
}

bk_status bki_dp_same_u64(bki_dp *d, uint64_t v, const char *what)
{
    if (!d->c) return BK_OK;
    const int R = d->c->size;
    /* gathered into the sums' buffer (8 bytes a rank) */
    if (d->c->allgather(d->c->user, &v, d->sums, sizeof v)) return io_fail(d, what);
    const char *all = (const char *)d->sums;
    uint64_t v0, vk;
    memcpy(&v0, all, sizeof v0);
    int k = 1;
    for (; k < R; k++) {
        memcpy(&vk, all + (size_t)k * sizeof vk, sizeof vk);
        if (vk != v0) break;
    }
    if (k < R)
        return bki_fail(BK_ERR_NUMERIC, "data-parallel training: rank %d's %s differs from rank 0's (the ranks "
                                        "diverged: every rank must run the same build on the same kind of CPU, or "
                                        "force one instruction set with BK_ISA)", k, what);
    return BK_OK;
}
