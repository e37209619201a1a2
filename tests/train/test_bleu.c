/* test_bleu.c -- corpus BLEU (src/train/bleu.c): the paper's definition on
 * hand-computed corpora (clipping, brevity penalty, zero precisions, orders),
 * the 13a tokenisation rule by rule, text = the same tokens as ids, and bad
 * input; chrF (bk_chrf_text) on hand-computed corpora. (Agreement with
 * NLTK's corpus_bleu on random corpora: tests/oracle/test_bleu.py.) */
#include "birkhoff.h"
#include "../harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* chrF (bk_chrf_text) on hand-computed corpora and its refusals */
static void test_chrf(void)
{
    double f = -1;
    /* "ab" vs "abc": 1-grams P 2/2 R 2/3, 2-grams P 1/1 R 1/2, no 3-grams in the hypothesis:
     * P = 1, R = 7/12, F2 = 5 P R / (4 P + R) = 7/11 */
    const char *h1[] = {"ab"}, *r1[] = {"abc"};
    th_check(bk_chrf_text(h1, r1, 1, &f) == BK_OK && fabs(f - 700.0 / 11) < 1e-12, "chrF: 'ab' vs 'abc' = 700/11",
             "%.17g", f);
    /* with "a b" vs "ab" (whitespace removed: equal) summed over the corpus: P = 1, R = 11/15, F2 = 55/71 */
    const char *h2[] = {"ab", "a b"}, *r2[] = {"abc", "ab"};
    th_check(bk_chrf_text(h2, r2, 2, &f) == BK_OK && fabs(f - 5500.0 / 71) < 1e-12,
             "chrF: corpus statistics summed over sentences, whitespace removed", "%.17g", f);
    /* identical up to whitespace (a no-break space and a tab included): 100; disjoint: 0 */
    const char *h3[] = {"\xc3\xb1" "and\xc3\xba x\xc2\xa0y\tz"}, *r3[] = {"\xc3\xb1" "and\xc3\xbaxyz"};
    th_check(bk_chrf_text(h3, r3, 1, &f) == BK_OK && f == 100.0, "chrF: equal code points up to whitespace = 100",
             "%.17g", f);
    const char *h4[] = {"xyz"}, *r4[] = {"abc"};
    th_check(bk_chrf_text(h4, r4, 1, &f) == BK_OK && f == 0.0, "chrF: no common character = 0", "%.17g", f);
    /* an empty hypothesis: no order has n-grams on both sides: 0 */
    const char *h5[] = {""}, *r5[] = {"abc"};
    th_check(bk_chrf_text(h5, r5, 1, &f) == BK_OK && f == 0.0, "chrF: an empty hypothesis = 0", "%.17g", f);
    /* a reference shorter than the order adds nothing there, its hypothesis's n-grams included
     * (sacreBLEU): "abc" vs "ab" and "xy" vs "xyz": order 1 P 4/5 R 4/5; order 2 P 2/3 R 2/3; order 3:
     * the 3-gram "abc" is not counted (its reference has none), so no hypothesis 3-gram: not an
     * order with n-grams on both sides. P = R = 11/15, F2 = 11/15 (counting "abc" would give order 3
     * P 0 R 0 and F2 = 22/45) */
    const char *h6[] = {"abc", "xy"}, *r6[] = {"ab", "xyz"};
    th_check(bk_chrf_text(h6, r6, 2, &f) == BK_OK && fabs(f - 1100.0 / 15) < 1e-12,
             "chrF: a reference shorter than the order drops the hypothesis n-grams there (sacreBLEU)", "%.17g", f);
    /* refusals */
    const char *hn[] = {"ab", NULL};
    th_check(bk_chrf_text(hn, r2, 2, &f) == BK_ERR_NULL && strstr(bk_last_error(), "hypothesis sentence 1"),
             "chrF: a NULL hypothesis sentence is named", "%s", bk_last_error());
    th_check(bk_chrf_text(h1, r1, 0, &f) == BK_ERR_PARAM && bk_chrf_text(NULL, r1, 1, &f) == BK_ERR_NULL &&
                 bk_chrf_text(h1, r1, 1, NULL) == BK_ERR_NULL,
             "chrF: n < 1 and NULL arguments refused", "%s", bk_last_error());
}

static bk_token_seq seq(const int32_t *t, int n) { return (bk_token_seq){t, n}; }

/* the 13a tokens of `raw` are exactly the space-separated `want` */
static void tok13a(const char *raw, const char *want, int ntok)
{
    bk_bleu_config c = bk_bleu_config_default();
    c.max_order = 1;
    bk_bleu_report r;
    const char *h[1] = {raw}, *e[1] = {want};
    int ok = bk_bleu_text(h, e, 1, &c, &r) == BK_OK;
    char name[160];
    snprintf(name, sizeof name, "13a: '%s' -> '%s'", raw, want);
    th_check(ok && r.hyp_len == ntok && r.ref_len == ntok && r.matches[0] == ntok, name,
             "hyp_len %lld ref_len %lld matches %lld (%s)", (long long)r.hyp_len, (long long)r.ref_len,
             (long long)r.matches[0], ok ? "" : bk_last_error());
}

int main(void)
{
    TH.verbose = 1; /* one line per check, as before */
    bk_bleu_config c = bk_bleu_config_default();
    bk_bleu_report r;
    /* identical corpora: BLEU 1 */
    const int32_t a[] = {1, 2, 3, 4, 5, 6}, b[] = {7, 8, 9, 10};
    bk_token_seq H[2] = {seq(a, 6), seq(b, 4)};
    th_check(bk_bleu(H, H, 2, &c, &r) == BK_OK && r.bleu == 1.0 && r.bp == 1.0 && r.hyp_len == 10,
             "identical corpora: BLEU = 1", "%.17g", r.bleu);
    /* Papineni's clipping example: "the" x7 against "the cat is on the mat": p1 = 2/7 */
    const int32_t the7[] = {0, 0, 0, 0, 0, 0, 0}, ref1[] = {0, 1, 2, 3, 0, 4};
    bk_token_seq h1 = seq(the7, 7), e1 = seq(ref1, 6);
    c.max_order = 1;
    th_check(bk_bleu(&h1, &e1, 1, &c, &r) == BK_OK && r.matches[0] == 2 && r.totals[0] == 7 &&
                 fabs(r.bleu - 2.0 / 7.0) < 1e-15,
             "clipping: 'the' x7 vs 'the cat is on the mat' gives p1 = 2/7", "%lld/%lld bleu %.17g",
             (long long)r.matches[0], (long long)r.totals[0], r.bleu);
    /* brevity penalty: a 4-token prefix of a 6-token reference, order 1 -> exp(1 - 6/4) */
    const int32_t pre[] = {1, 2, 3, 4};
    bk_token_seq hp = seq(pre, 4), ep = seq(a, 6);
    th_check(bk_bleu(&hp, &ep, 1, &c, &r) == BK_OK && fabs(r.bp - exp(1.0 - 1.5)) < 1e-15 &&
                 fabs(r.bleu - exp(1.0 - 1.5)) < 1e-15,
             "brevity penalty exp(1 - r/c) for a short hypothesis", "bp %.17g bleu %.17g", r.bp, r.bleu);
    /* a hand-computed order-4 corpus: hyp 1 2 3 4 5 x / ref 1 2 3 4 5 6 and hyp 7 8 y 10 / ref 7 8 9 10 */
    const int32_t hA[] = {1, 2, 3, 4, 5, 99}, hB[] = {7, 8, 98, 10};
    bk_token_seq HH[2] = {seq(hA, 6), seq(hB, 4)}, RR[2] = {seq(a, 6), seq(b, 4)};
    c.max_order = 4;
    /* matches: 1-grams 5 + 3 = 8 of 10; 2-grams 4 + 1 = 5 of 8; 3-grams 3 + 0 of 6; 4-grams 2 + 0 of 4 */
    const double want = exp((log(8.0 / 10) + log(5.0 / 8) + log(3.0 / 6) + log(2.0 / 4)) / 4);
    th_check(bk_bleu(HH, RR, 2, &c, &r) == BK_OK && r.matches[0] == 8 && r.matches[1] == 5 && r.matches[2] == 3 &&
                 r.matches[3] == 2 && r.totals[3] == 4 && fabs(r.bleu - want) < 1e-15,
             "order 4 by hand: geometric mean of 8/10, 5/8, 3/6, 2/4, BP 1", "%.17g vs %.17g", r.bleu, want);
    /* an empty hypothesis adds reference length only (the brevity penalty) */
    bk_token_seq hz[2] = {seq(hA, 6), seq(NULL, 0)};
    const double wz = exp(1.0 - 10.0 / 6.0) * exp((log(5.0 / 6) + log(4.0 / 5) + log(3.0 / 4) + log(2.0 / 3)) / 4);
    th_check(bk_bleu(hz, RR, 2, &c, &r) == BK_OK && r.matches[3] == 2 && r.totals[3] == 3 && fabs(r.bleu - wz) < 1e-15,
             "an empty hypothesis counts in the reference length only", "%.17g vs %.17g", r.bleu, wz);
    /* no smoothing: a zero precision gives 0 */
    const int32_t miss4[] = {1, 2, 3, 77, 5, 78};
    bk_token_seq hm = seq(miss4, 6), em = seq(a, 6);
    th_check(bk_bleu(&hm, &em, 1, &c, &r) == BK_OK && r.matches[3] == 0 && r.matches[0] == 4 && r.bleu == 0.0,
             "no 4-gram matches: BLEU 0 (no smoothing)", "%.17g", r.bleu);
    bk_token_seq h0 = seq(NULL, 0);
    th_check(bk_bleu(&h0, &e1, 1, &c, &r) == BK_OK && r.bleu == 0.0 && r.bp == 0.0,
             "an empty corpus hypothesis: BLEU 0, BP 0", "%.17g", r.bleu);
    const int32_t one[] = {5};
    bk_token_seq ho = seq(one, 1), eo = seq(one, 1);
    th_check(bk_bleu(&ho, &eo, 1, &c, &r) == BK_OK && r.bleu == 0.0 && r.totals[1] == 0,
             "a one-token corpus has no bigrams: BLEU 0 at order 4", "%.17g", r.bleu);
    c.max_order = 1;
    th_check(bk_bleu(&ho, &eo, 1, &c, &r) == BK_OK && r.bleu == 1.0, "... and 1 at order 1", "%.17g", r.bleu);
    /* repeated n-grams in the reference are matched as many times as they occur, not more */
    const int32_t rep_h[] = {3, 3, 3, 3}, rep_r[] = {3, 3, 2, 3};
    bk_token_seq hr = seq(rep_h, 4), er = seq(rep_r, 4);
    c.max_order = 2;
    th_check(bk_bleu(&hr, &er, 1, &c, &r) == BK_OK && r.matches[0] == 3 && r.matches[1] == 1,
             "clipped counts of repeated n-grams (3 of 4 unigrams, 1 of 3 bigrams)", "%lld %lld",
             (long long)r.matches[0], (long long)r.matches[1]);

    /* the 13a rules */
    tok13a("Hello, world!", "Hello , world !", 4);
    tok13a("3.5 and 1,000 dollars", "3.5 and 1,000 dollars", 4);
    tok13a("e.g. this", "e . g . this", 5);
    tok13a("years 1990-2000 and x-y", "years 1990 - 2000 and x-y", 6);
    tok13a("don't (really) stop", "don't ( really ) stop", 5);
    tok13a("&quot;quoted&quot; &amp; &lt;b&gt;", "\" quoted \" & < b >", 7);
    tok13a("a/b:c;d", "a / b : c ; d", 7);
    tok13a("último café.", "último café .", 3);
    tok13a(".5 to 5.", ". 5 to 5 .", 5);
    tok13a("<skipped>kept", "kept", 1);
    /* Unicode whitespace separates tokens, as Python's str.split() in sacreBLEU (no-break, em and
     * ideographic spaces); a zero-width space does not */
    tok13a("a\xc2\xa0" "b\xe2\x80\x83" "c\xe3\x80\x80" "d", "a b c d", 4);
    tok13a("x\xe2\x80\x8by", "x\xe2\x80\x8by", 1);
    /* text = the same tokens as ids (tokenize none) */
    {
        bk_bleu_config cn = bk_bleu_config_default();
        cn.tokenize = BK_BLEU_TOKENIZE_NONE;
        const char *ht[2] = {"a b c d e x", "g h  y j"}, *rt[2] = {"a b c d e f", "g\th i j"};
        bk_bleu_report rt_, ri;
        const int32_t ia[] = {1, 2, 3, 4, 5, 99}, ib[] = {7, 8, 98, 10}, ja[] = {1, 2, 3, 4, 5, 6}, jb[] = {7, 8, 9, 10};
        bk_token_seq Hi[2] = {seq(ia, 6), seq(ib, 4)}, Ri[2] = {seq(ja, 6), seq(jb, 4)};
        th_check(bk_bleu_text(ht, rt, 2, &cn, &rt_) == BK_OK && bk_bleu(Hi, Ri, 2, &cn, &ri) == BK_OK &&
                     rt_.bleu == ri.bleu && rt_.hyp_len == 10,
                 "text with tokenize none = the same corpus as ids", "%.17g vs %.17g", rt_.bleu, ri.bleu);
    }
    /* bad input */
    const char *ok1[1] = {"fine"}, *badu[1] = {"caf\xe9"}, *ctl[1] = {"bell\x07"}, *nul[1] = {NULL};
    bk_bleu_config cd = bk_bleu_config_default();
    th_check(bk_bleu_text(badu, ok1, 1, &cd, &r) == BK_ERR_PARAM && strstr(bk_last_error(), "UTF-8") &&
                 strstr(bk_last_error(), "hypothesis 0"),
             "invalid UTF-8 refused, naming the sentence", "%s", bk_last_error());
    th_check(bk_bleu_text(ok1, ctl, 1, &cd, &r) == BK_ERR_PARAM && strstr(bk_last_error(), "reference 0") &&
                 strstr(bk_last_error(), "0x07"),
             "a control character refused", "%s", bk_last_error());
    th_check(bk_bleu_text(nul, ok1, 1, &cd, &r) == BK_ERR_NULL, "a NULL sentence refused", "%s", bk_last_error());
    cd.max_order = 9;
    th_check(bk_bleu(&ho, &eo, 1, &cd, &r) == BK_ERR_PARAM && strstr(bk_last_error(), "max_order"),
             "max_order 9 refused", "%s", bk_last_error());
    cd = bk_bleu_config_default();
    th_check(bk_bleu(&ho, &eo, 0, &cd, &r) == BK_ERR_PARAM, "an empty corpus refused", "%s", bk_last_error());
    bk_token_seq neg = {one, -1};
    th_check(bk_bleu(&neg, &eo, 1, &cd, &r) == BK_ERR_PARAM, "a negative length refused", "%s", bk_last_error());
    bk_token_seq nulseq = {NULL, 3};
    th_check(bk_bleu(&ho, &nulseq, 1, &cd, &r) == BK_ERR_NULL, "tokens NULL with a positive length refused", "%s",
             bk_last_error());
    test_chrf();
    return th_summary();
}
