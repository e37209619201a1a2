/* eval.c -- evaluation (accuracy, loss, confusion) and attention
 * diagnostics of a model on a dataset (birkhoff/train.h). */
#include "../core/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the predicted class of one row of logits (the first maximum) */
static int argmax(const float *z, int C)
{
    int p = 0;
    for (int j = 1; j < C; j++)
        if (z[j] > z[p]) p = j;
    return p;
}

void bk_eval_result_free(bk_eval_result *ev)
{
    if (!ev) return;
    free(ev->confusion);
    free(ev->pred);
    ev->confusion = NULL;
    ev->pred = NULL;
}

bk_status bk_evaluate(bk_model *m, const bk_dataset *ds, int64_t n, int batch, int keep_pred, bk_eval_result *ev)
{
    bki_clear_error();
    if (!m || !ds || !ev) return bki_fail(BK_ERR_NULL, "bk_evaluate: NULL argument");
    memset(ev, 0, sizeof *ev);
    if (batch < 1) return bki_fail(BK_ERR_SHAPE, "bk_evaluate: batch %d", batch);
    const bk_dataset_info *in = bk_data_info(ds);
    /* (a seq2seq model has no classes: no confusion matrix, no predictions) */
    const int C = in->seq2seq ? 0 : bk_model_get_config(m)->classes;
    if (in->seq2seq) keep_pred = 0;
    if (n <= 0 || n > in->n) n = in->n;
    ev->n = n;
    ev->classes = C;
    ev->confusion = calloc(C ? (size_t)C * (size_t)C : 1, sizeof(int64_t));
    if (keep_pred) ev->pred = malloc(sizeof(int32_t) * (size_t)n);
    float *logits = malloc(sizeof(float) * (C ? (size_t)C * (size_t)batch : 1));
    bk_data_batch b = {0};
    if (!ev->confusion || (keep_pred && !ev->pred) || !logits || bk_data_batch_init(&b, ds, batch) != BK_OK) {
        free(logits);
        bk_eval_result_free(ev);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    double total = 0.0;
    int64_t correct = 0, tokens = 0;
    bk_status st = BK_OK;
    for (int64_t s = 0; st == BK_OK && s < n; s += batch) {
        const int B = (int)(n - s < batch ? n - s : batch);
        for (int i = 0; i < B; i++) b.idx[i] = s + i;
        bk_batch bt;
        double loss;
        if (bk_data_batch_fill(&b, ds, B, &bt) != BK_OK) {
            st = bki_fail(BK_ERR_IO, "cannot read samples %lld..%lld of %s", (long long)s, (long long)(s + B),
                          in->name);
            } else if (in->seq2seq) {
            /* sentence pairs: teacher-forced loss and accuracy per target
             * token */
            int64_t w = 0, hit = 0;
            if ((st = bk_model_forward(m, &bt, 0, 0.0f, NULL, &loss)) == BK_OK &&
                (st = bk_model_token_stats(m, &w, &hit)) == BK_OK) {
                total += loss * (double)w;
                correct += hit;
                tokens += w;
            }
        } else if ((st = bk_model_forward(m, &bt, 0, 0.0f, logits, &loss)) == BK_OK) {
            total += loss * B;
            for (int i = 0; i < B; i++) {
                const int p = argmax(logits + (size_t)i * C, C);
                correct += p == b.labels[i];
                ev->confusion[(size_t)b.labels[i] * C + p]++;
                if (ev->pred) ev->pred[s + i] = p;
            }
        }
    }
    bk_data_batch_free(&b);
    free(logits);
    if (st != BK_OK) {
        bk_eval_result_free(ev);
        return st;
    }
    const double w = in->seq2seq ? (double)tokens : (double)n;
    ev->loss = total / w;
    ev->acc = (double)correct / w;
    return BK_OK;
}

bk_status bk_attention_diag(bk_model *m, const bk_dataset *ds, int B, bk_layer_diag *per, float *colsums,
                            int64_t *ncol)
{
    bki_clear_error();
    if (!m || !ds || !per) return bki_fail(BK_ERR_NULL, "bk_attention_diag: NULL argument");
    const bk_model_config *c = bk_model_get_config(m);
    const int H = c->heads;
    /* (seq2seq: the encoder's self-attention, no CLS token) */
    const int cls = c->arch == BK_ARCH_SEQ2SEQ ? 0 : c->cls;
    if (B > bk_data_info(ds)->n) B = (int)bk_data_info(ds)->n;
    if (B < 1) return bki_fail(BK_ERR_SHAPE, "bk_attention_diag: B = %d", B);
    bk_data_batch b = {0};
    if (bk_data_batch_init(&b, ds, B) != BK_OK) return bki_fail(BK_ERR_NOMEM, "out of memory");
    for (int i = 0; i < B; i++) b.idx[i] = i;
    bk_batch bt;
    bk_status st = BK_OK;
    if (bk_data_batch_fill(&b, ds, B, &bt) != BK_OK)
        st = bki_fail(BK_ERR_IO, "cannot read the samples of %s", bk_data_info(ds)->name);
    if (st == BK_OK) st = bk_model_forward(m, &bt, 0, 0.0f, NULL, NULL);
    /* the tokens per sample of this forward (a seq2seq model runs its
     * batch's longest source) */
    const int T = bk_model_tokens(m);
    /* an ISAB block's map is [Nq = set_inducing, T]: its inducing points
     * over the set (rows sum to 1, a column's target is Nq / L) */
    const int isab = c->arch == BK_ARCH_CLASSIFIER && c->set_block == BK_SET_ISAB, Nq = isab ? c->set_inducing : T;
    float *A = st == BK_OK ? malloc(sizeof(float) * (size_t)B * H * Nq * T) : NULL;
    if (st == BK_OK && !A) st = bki_fail(BK_ERR_NOMEM, "out of memory");
    int64_t nc = 0;
    for (int l = 0; st == BK_OK && l < c->depth; l++) {
        if ((st = bk_model_attention(m, l, A)) != BK_OK) break;
        double rd = 0, cd = 0, en = 0, ue = 0;
        int64_t nr = 0, ncl = 0;
        nc = 0;
        for (int s = 0; s < B; s++) {
            const int L = c->input == BK_INPUT_IMAGE ? T : bt.len[s] + cls, Lq = isab ? Nq : L;
            const double target = (double)Lq / L; /* a column's sum when doubly stochastic */
            for (int h = 0; h < H; h++) {
                const float *P = A + ((size_t)s * H + h) * Nq * T;
                for (int i = 0; i < Lq; i++) {
                    double rs = 0, e = 0;
                    for (int j = 0; j < L; j++) {
                        const double a = P[(size_t)i * T + j];
                        rs += a;
                        if (a > 0) e -= a * log(a);
                    }
                    rd += fabs(rs - 1.0);
                    en += e;
                    ue += log((double)L);
                    nr++;
                }
                for (int j = 0; j < L; j++) {
                    double cs = 0;
                    for (int i = 0; i < Lq; i++) cs += P[(size_t)i * T + j];
                    cs /= target;
                    cd += fabs(cs - 1.0);
                    if (colsums) colsums[(size_t)l * B * H * T + (size_t)nc] = (float)cs;
                    nc++;
                    ncl++;
                }
            }
        }
        per[l].row_dev = rd / (double)nr;
        per[l].col_dev = cd / (double)ncl;
        per[l].entropy = en / (double)nr;
        per[l].uniform_entropy = ue / (double)nr;
    }
    if (ncol) *ncol = nc;
    free(A);
    bk_data_batch_free(&b);
    return st;
}
