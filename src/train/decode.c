/* decode.c -- beam search (greedy = beam 1) over a model-independent step
 * callback (decode.h), and the decoding configuration (bk_decode_config).
 *
 * The search (fairseq's sequence generator without its extras):
 *   B sentences, beam hypotheses each: row r = b * beam + k of every step is
 *   hypothesis k of sentence b. At t = 0 every row is fed BOS, but only k = 0
 *   is alive (the others score -inf), so the beam never holds duplicates.
 *   Step t feeds the token at position t of every row and gets log p of the
 *   next token; a live row k with cumulative log-probability s_k (a double,
 *   summed token by token) makes the candidates (k, v) of score s_k + logp[v]
 *   (-inf candidates are never taken). Per unfinished sentence the 2 * beam
 *   best candidates are selected, ordered by score descending, then k
 *   ascending, then v ascending (a total order: a heap selection, one thread,
 *   so results do not depend on anything but the log-probabilities). Walking
 *   them in that order: an EOS candidate among the first beam becomes a
 *   finished hypothesis (while the sentence has fewer than beam), scored
 *   s / len^len_penalty with len its tokens counting the EOS; the first beam
 *   non-EOS candidates become the next step's rows (their parent: the row they
 *   extend). EOS candidates ranked below beam are dropped, as in fairseq: this
 *   makes beam 1 exactly greedy (argmax, ties to the lower token). At the
 *   last position of a sentence (t = max_len - 1) EOS is the only candidate
 *   of each live row (forced, with the model's log p of EOS there). A sentence
 *   is done when it has beam finished hypotheses, no live row, or has reached
 *   its last position; done sentences (and rows without a live hypothesis)
 *   keep being fed EOS with parent = own row, their results frozen. The search
 *   stops when every sentence is done. The answer is the finished hypothesis
 *   of best score, ties to the one finished first (then the lower row, then
 *   the lower token: the candidate order).
 */
#include "decode.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- configuration ------------------------------------------------------- */
bk_decode_config bk_decode_config_default(void)
{
    bk_decode_config c = {5, 1.0f, 1.5f, 10, 1};
    return c;
}

#define F(field, ty) {.name = #field, .type = ty, .offset = offsetof(bk_decode_config, field), .names = NULL, .list_len = 0}
static const bki_field DECODE_FIELDS[] = {
    F(beam, BKI_F_INT), F(len_penalty, BKI_F_FLOAT), F(len_a, BKI_F_FLOAT), F(len_b, BKI_F_INT), F(cache, BKI_F_INT),
};
#undef F
#define NFIELDS ((int)(sizeof DECODE_FIELDS / sizeof DECODE_FIELDS[0]))
#define BKI_MAX_BEAM 1024

bk_status bk_decode_config_set(bk_decode_config *c, const char *key, const char *value)
{
    if (!c) return bki_fail(BK_ERR_NULL, "decode config: NULL config");
    bk_decode_config t = *c; /* c is changed only by a valid assignment */
    bk_status st = bki_cfg_set(&t, DECODE_FIELDS, NFIELDS, "decode config", key, value);
    if (st) return st;
    if (t.beam < 1 || t.beam > BKI_MAX_BEAM)
        return bki_fail(BK_ERR_PARAM, "decode config: beam=%s must be in [1, %d]", value, BKI_MAX_BEAM);
    if (!(t.len_a >= 0.0f)) return bki_fail(BK_ERR_PARAM, "decode config: len_a=%s must be >= 0", value);
    if (t.len_b < 0) return bki_fail(BK_ERR_PARAM, "decode config: len_b=%s must be >= 0", value);
    if (t.cache != 0 && t.cache != 1) return bki_fail(BK_ERR_PARAM, "decode config: cache=%s must be 0 or 1", value);
    *c = t;
    return BK_OK;
}

/* ---- candidate selection ------------------------------------------------- */
typedef struct {
    double s; /* cumulative log-probability */
    int k, v; /* live row of the sentence, token */
} cand;

/* a ranks before b: higher score, then lower row, then lower token */
static inline int before(const cand *a, const cand *b)
{
    if (a->s != b->s) return a->s > b->s;
    if (a->k != b->k) return a->k < b->k;
    return a->v < b->v;
}

/* min-heap of the n best candidates so far: h[0] ranks last */
static void sift_down(cand *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && before(&h[w], &h[l])) w = l;
        if (r < n && before(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static void sift_up(cand *h, int i)
{
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!before(&h[p], &h[i])) return;
        cand t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

/* offer x to a heap of capacity cap holding *n */
static inline void offer(cand *h, int *n, int cap, cand x)
{
    if (*n < cap) {
        h[*n] = x;
        sift_up(h, (*n)++);
    } else if (before(&x, &h[0])) {
        h[0] = x;
        sift_down(h, cap, 0);
    }
}

/* the heap's n candidates in rank order (heap sort: pop the last-ranked to the end) */
static void heap_sort(cand *h, int n)
{
    for (int m = n - 1; m > 0; m--) {
        cand t = h[0];
        h[0] = h[m];
        h[m] = t;
        sift_down(h, m, 0);
    }
    /* each pass moved the last-ranked of h[0..m] to h[m]: h is now in rank order */
}

/* ---- the search ---------------------------------------------------------- */
/* the search's arguments; *Lout the longest output (EOS counted) */
static bk_status check_args(const bki_decoder *d, int B, const bk_decode_config *c, const int *max_len,
                            const int32_t *out, int out_stride, const int32_t *out_len, int *Lout)
{
    if (!d || !d->step || !c || !max_len || !out || !out_len)
        return bki_fail(BK_ERR_NULL, "beam search: NULL decoder, step, config, max_len, out or out_len");
    if (B < 1) return bki_fail(BK_ERR_SHAPE, "beam search: B = %d sentences (need >= 1)", B);
    if (d->vocab < 1) return bki_fail(BK_ERR_SHAPE, "beam search: vocab = %d (need >= 1)", d->vocab);
    const int V = d->vocab, beam = c->beam, eos = d->eos;
    if (beam < 1 || beam > BKI_MAX_BEAM)
        return bki_fail(BK_ERR_PARAM, "beam search: beam = %d outside [1, %d]", beam, BKI_MAX_BEAM);
    if (!isfinite(c->len_penalty))
        return bki_fail(BK_ERR_PARAM, "beam search: len_penalty = %g is not finite", (double)c->len_penalty);
    if (d->bos < 0 || d->bos >= V || eos < 0 || eos >= V)
        return bki_fail(BK_ERR_PARAM, "beam search: bos = %d or eos = %d outside [0, vocab = %d)", d->bos, eos, V);
    int L = 0;
    for (int b = 0; b < B; b++) {
        if (max_len[b] < 1)
            return bki_fail(BK_ERR_LENGTH, "beam search: max_len[%d] = %d (need >= 1: the EOS counts)", b, max_len[b]);
        if (max_len[b] > L) L = max_len[b];
    }
    if (out_stride < L - 1)
        return bki_fail(BK_ERR_SHAPE, "beam search: out_stride = %d below the longest output %d (max_len - 1)",
                        out_stride, L - 1);
    if ((int64_t)B * beam > INT_MAX / 2 || (uint64_t)B * (uint64_t)beam * (uint64_t)V > (uint64_t)PTRDIFF_MAX / 8)
        return bki_fail(BK_ERR_SHAPE, "beam search: B * beam * vocab = %d * %d * %d is too large", B, beam, V);
    *Lout = L;
    return BK_OK;
}

bk_status bki_beam_search(const bki_decoder *d, int B, const bk_decode_config *c, const int *max_len,
                          int32_t *out, int out_stride, int32_t *out_len, float *score)
{
    int L = 0;
    bk_status st = check_args(d, B, c, max_len, out, out_stride, out_len, &L);
    if (st) return st;
    const int V = d->vocab, beam = c->beam, eos = d->eos;
    const int R = B * beam, K = 2 * beam;
    const size_t RL = (size_t)R * (size_t)L;

    /* the one allocation */
    bki_arena a = {NULL, 0, 0};
    float *logp;
    double *cum, *cum2, *fscore;
    int32_t *tok, *par, *hist, *hist2, *ftok, *flen;
    int *nfin, *best, *done;
    cand *heap;
    for (int pass = 0; pass < 2; pass++) {
        logp = bki_carve(&a, sizeof(float) * (size_t)R * (size_t)V);
        cum = bki_carve(&a, sizeof(double) * (size_t)R);
        cum2 = bki_carve(&a, sizeof(double) * (size_t)R);
        fscore = bki_carve(&a, sizeof(double) * (size_t)R);
        tok = bki_carve(&a, sizeof(int32_t) * (size_t)R);
        par = bki_carve(&a, sizeof(int32_t) * (size_t)R);
        hist = bki_carve(&a, sizeof(int32_t) * RL);   /* live hypotheses' tokens after BOS */
        hist2 = bki_carve(&a, sizeof(int32_t) * RL);
        ftok = bki_carve(&a, sizeof(int32_t) * RL);   /* finished hypotheses (without EOS) */
        flen = bki_carve(&a, sizeof(int32_t) * (size_t)R);
        nfin = bki_carve(&a, sizeof(int) * (size_t)B);
        best = bki_carve(&a, sizeof(int) * (size_t)B);
        done = bki_carve(&a, sizeof(int) * (size_t)B);
        heap = bki_carve(&a, sizeof(cand) * (size_t)K);
        if (pass == 0) { /* measured: allocate, then carve the same layout */
            a.base = malloc(a.used);
            if (!a.base) return bki_fail(BK_ERR_NOMEM, "beam search: cannot allocate %zu bytes", a.used);
            a.cap = a.used;
            a.used = 0;
        }
    }

    for (int r = 0; r < R; r++) {
        cum[r] = r % beam == 0 ? 0.0 : -INFINITY;
        tok[r] = d->bos;
        par[r] = r;
    }
    for (int b = 0; b < B; b++) nfin[b] = 0, best[b] = -1, done[b] = 0;
    const double lp = (double)c->len_penalty;

    for (int t = 0;; t++) {
        int active = 0;
        for (int b = 0; b < B; b++) active += !done[b];
        if (!active) break;
        st = d->step(d->ctx, t, R, par, tok, logp);
        if (st) goto end;
        for (int b = 0; b < B; b++) {
            const int r0 = b * beam;
            if (done[b]) continue;
            const int forced = t == max_len[b] - 1;
            /* select the 2 * beam best candidates of the live rows */
            int n = 0;
            for (int k = 0; k < beam; k++) {
                const double s = cum[r0 + k];
                if (s == -INFINITY) continue;
                const float *lr = logp + (size_t)(r0 + k) * (size_t)V;
                for (int v = 0; v < V; v++)
                    if (isnan(lr[v]) || lr[v] == INFINITY) {
                        st = bki_fail(BK_ERR_NONFINITE,
                                      "beam search: step %d returned log p = %g for row %d (sentence %d, hypothesis "
                                      "%d) token %d (need finite or -inf)",
                                      t, (double)lr[v], r0 + k, b, k, v);
                        goto end;
                    }
                if (forced) {
                    if (lr[eos] != -INFINITY) offer(heap, &n, K, (cand){s + (double)lr[eos], k, eos});
                    continue;
                }
                for (int v = 0; v < V; v++) {
                    if (lr[v] == -INFINITY) continue;
                    offer(heap, &n, K, (cand){s + (double)lr[v], k, v});
                }
            }
            heap_sort(heap, n);
            /* finish the EOS candidates ranked within beam, extend by the first beam others */
            int live = 0;
            for (int i = 0; i < n; i++) {
                const cand *x = &heap[i];
                const int from = r0 + x->k;
                if (x->v == eos) {
                    if (i < beam && nfin[b] < beam) {
                        const int f = r0 + nfin[b]++;
                        memcpy(ftok + (size_t)f * L, hist + (size_t)from * L, sizeof(int32_t) * (size_t)t);
                        flen[f] = t;
                        fscore[f] = lp == 0.0 ? x->s : x->s / pow((double)(t + 1), lp);
                        if (best[b] < 0 || fscore[f] > fscore[best[b]]) best[b] = f;
                    }
                } else if (live < beam) {
                    const int to = r0 + live++;
                    memcpy(hist2 + (size_t)to * L, hist + (size_t)from * L, sizeof(int32_t) * (size_t)t);
                    hist2[(size_t)to * L + t] = x->v;
                    cum2[to] = x->s;
                    tok[to] = x->v;
                    par[to] = from;
                }
            }
            if (forced || live == 0 || nfin[b] >= beam) {
                done[b] = 1;
                if (nfin[b] == 0) {
                    st = bki_fail(BK_ERR_NUMERIC,
                                  "beam search: sentence %d has no hypothesis of finite log-probability "
                                  "(every candidate -inf by step %d)",
                                  b, t);
                    goto end;
                }
                live = 0;
            }
            for (int k = live; k < beam; k++) cum2[r0 + k] = -INFINITY, tok[r0 + k] = eos, par[r0 + k] = r0 + k;
        }
        /* rows of done sentences: eos, own parent (their cum stays -inf) */
        for (int b = 0; b < B; b++)
            if (done[b])
                for (int k = 0; k < beam; k++) {
                    const int r = b * beam + k;
                    cum2[r] = -INFINITY, tok[r] = eos, par[r] = r;
                }
        double *tc = cum;
        cum = cum2, cum2 = tc;
        int32_t *th = hist;
        hist = hist2, hist2 = th;
    }
    for (int b = 0; b < B; b++) {
        const int f = best[b];
        memcpy(out + (size_t)b * (size_t)out_stride, ftok + (size_t)f * L, sizeof(int32_t) * (size_t)flen[f]);
        out_len[b] = flen[f];
        if (score) score[b] = (float)fscore[f];
    }
end:
    free(a.base);
    return st;
}
