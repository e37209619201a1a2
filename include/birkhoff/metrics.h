/* birkhoff/metrics.h -- translation metrics: corpus BLEU (Papineni et al.
 * 2002) over token sequences or over text with a documented tokenisation,
 * and corpus chrF (Popovic 2015) over text (bk_chrf_text, at the end).
 * Part of the public API; include <birkhoff.h> (all of it) or this file. The
 * conventions every function follows are at the top of birkhoff/core.h.
 *
 * Definition (one reference per sentence, as IWSLT and most MT test sets):
 * for n = 1..N (N = max_order, 4 by default) the modified n-gram precision
 * p_n = sum over sentences of the hypothesis n-grams' counts clipped by the
 * reference's counts, divided by the number of hypothesis n-grams; c = total
 * hypothesis length, r = total reference length, brevity penalty BP = 1 if
 * c > r else exp(1 - r / c) (0 when c = 0), and
 *     BLEU = BP * exp( (1/N) sum_n log p_n ),
 * 0 when any p_n is 0 (no smoothing: the corpus-level definition of the
 * paper, NLTK's corpus_bleu and sacreBLEU's "none" smoothing). The value is
 * in [0, 1]; papers report 100 x BLEU. N-grams are compared exactly (token
 * by token), never by hash alone. Tested against NLTK's corpus_bleu on the
 * same tokens (tests/oracle/test_bleu.py) to 1e-12.
 *
 * Text: bk_bleu_text tokenises each sentence first. BK_BLEU_TOKENIZE_13A is
 * the tokenisation of the WMT scoring script mteval-v13a (and sacreBLEU's
 * default "13a"): the entities &quot; &amp; &lt; &gt; are unescaped; then
 * every ASCII character in { [ \ ] ^ _ ` { | } ~ ! " # $ % & ( ) * + : ; <
 * = > ? @ / } becomes a separate token, as do a period or comma not
 * preceded by a digit or not followed by one (so 3.5 and 1,000 stay whole)
 * and a dash preceded by a digit; then tokens are the whitespace-separated
 * pieces. Bytes >= 0x80 (non-ASCII UTF-8) are never split. Case is kept.
 * BK_BLEU_TOKENIZE_NONE splits on whitespace only (for text that is already
 * tokenised, e.g. SentencePiece pieces or Moses-tokenised text). Scores are
 * comparable across systems only with the same tokenisation and
 * references: report both with the number. */
#ifndef BIRKHOFF_METRICS_H
#define BIRKHOFF_METRICS_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* one sentence as token ids */
typedef struct {
    const int32_t *tok;
    int len;                 /* >= 0 */
} bk_token_seq;

typedef enum { BK_BLEU_TOKENIZE_13A = 0, BK_BLEU_TOKENIZE_NONE = 1 } bk_bleu_tokenize;

typedef struct {
    int max_order;              /* N in [1, 8] (4)                            */
    bk_bleu_tokenize tokenize;  /* bk_bleu_text only (13A)                    */
} bk_bleu_config;

typedef struct {
    double bleu;                /* in [0, 1]                                  */
    double bp;                  /* brevity penalty                            */
    double precision[8];        /* p_n for n = 1..max_order (0 beyond)        */
    int64_t matches[8], totals[8]; /* clipped matches and hypothesis n-grams */
    int64_t hyp_len, ref_len;   /* c and r                                    */
    int max_order;
} bk_bleu_report;

/* max_order 4, 13a tokenisation */
BK_API bk_bleu_config bk_bleu_config_default(void);

/* Corpus BLEU of n hypotheses against their references (token ids; equal
 * ids are equal tokens). n >= 1. Errors: NULL arguments, a negative length,
 * a NULL token array with a positive length, max_order outside [1, 8]. */
BK_API bk_status bk_bleu(const bk_token_seq *hyp, const bk_token_seq *ref, int n, const bk_bleu_config *cfg,
                         bk_bleu_report *out);

/* Corpus BLEU of n UTF-8 sentences against their references, tokenised as
 * cfg->tokenize says (tokens compare as byte strings; whitespace is Python's
 * str.isspace, as sacreBLEU splits: ASCII space, tab, CR, LF, VT, FF and the
 * Unicode spaces U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029,
 * U+202F, U+205F, U+3000; a zero-width space U+200B is not one). Errors as bk_bleu; a NULL sentence, one that
 * is not valid UTF-8 or one holding an ASCII control character other than
 * tab is refused, naming the side and the sentence. */
BK_API bk_status bk_bleu_text(const char *const *hyp, const char *const *ref, int n, const bk_bleu_config *cfg,
                              bk_bleu_report *out);

/* Corpus chrF x 100 of n UTF-8 sentences against their references (one
 * each), sacreBLEU's default chrF2 (nc 6, nw 0, beta 2) and its 0..100
 * scale, in *chrf:
 *   - each sentence's characters are its Unicode code points with every
 *     whitespace character removed (Python's str.isspace: ASCII 9-13 and
 *     28-32, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F,
 *     U+205F, U+3000); a byte that is not part of valid UTF-8 counts as one
 *     character of its own;
 *   - for n = 1..6, the character n-grams of hypothesis and reference are
 *     matched as multisets (min of the counts); the hypothesis n-grams, the
 *     reference n-grams and the matches are summed over the corpus, a
 *     sentence's hypothesis n-grams of an order counting only when its
 *     reference has n-grams of that order (as sacreBLEU does: a reference
 *     shorter than n characters, or empty, adds nothing at order n);
 *   - precision P and recall R are averaged over the orders with n-grams on
 *     both sides (0 when none), and
 *         chrF = 100 (1 + beta^2) P R / (beta^2 P + R),  beta = 2
 *     (0 when P + R = 0).
 * Checked on hand-computed corpora (tests/train/test_bleu.c,
 * tests/tools/test_translate_cli.py) and against sacreBLEU
 * (tests/oracle/test_sacrebleu.py). Errors: BK_ERR_NULL (a NULL array,
 * output or sentence, naming the side and the sentence), BK_ERR_PARAM
 * (n < 1), BK_ERR_NOMEM. */
BK_API bk_status bk_chrf_text(const char *const *hyp, const char *const *ref, int n, double *chrf);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_METRICS_H */
