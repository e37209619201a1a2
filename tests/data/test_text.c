/* test_text.c -- SentencePiece through the library (bk_spm_*, src/data/spm.cc)
 * and the text readers (tsv:, csv:, parallel:, ids: specs of bk_data_open,
 * src/data/text.c) on small files the test writes itself:
 *   - training is deterministic: the same texts give the same model bytes on
 *     every call and whatever the thread count; the special ids are BK_SEQ_*;
 *   - decode(encode(t)) == t for texts with unseen characters, emoji, tabs,
 *     leading, trailing and repeated spaces; a model file loads to the same
 *     encodings; a cut encoding reports the full count;
 *   - refusals with their status and a message naming the problem: bad UTF-8
 *     (the byte), a vocab too small or out of range, no texts, NULLs, a file
 *     that is not a model, a missing file, a directory, ids out of range.
 * Run: build/test_text; prints "N passed, M failed". */
#include "birkhoff.h"
#include "../harness.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CHECK(ok, name, ...) th_check((ok), (name), __VA_ARGS__)

static char g_tmp[512];

static int has(const char *msg, const char *part) { return msg && strstr(msg, part) != NULL; }

static int write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static const char *tpath(const char *name)
{
    static char buf[4][700];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_tmp, name);
    return buf[k];
}

/* a small corpus: 200 sentences of English and Spanish words (deterministic) */
#define NCORP 200
static char g_corp[NCORP][96];
static const char *g_texts[NCORP];

static void make_corpus(void)
{
    static const char *const w[] = {"the",  "quick", "brown", "fox",   "jumps", "over",  "lazy", "dog",
                                    "hola", "mundo", "niño",  "señor", "canción", "agua", "día",  "sol"};
    th_rng r = {42};
    for (int i = 0; i < NCORP; i++) {
        char *p = g_corp[i];
        size_t used = 0;
        int nw = 3 + (int)(th_next(&r) % 8);
        for (int k = 0; k < nw; k++)
            used += (size_t)snprintf(p + used, sizeof g_corp[i] - used, "%s%s", k ? " " : "",
                                     w[th_next(&r) % (sizeof w / sizeof w[0])]);
        g_texts[i] = p;
    }
}

static void test_train(void)
{
    void *m1 = NULL, *m2 = NULL, *m3 = NULL;
    size_t n1 = 0, n2 = 0, n3 = 0;
    bk_status s1 = bk_spm_train(g_texts, NCORP, 300, &m1, &n1);
    CHECK(s1 == BK_OK && n1 > 100, "spm train: a model of 300 pieces from 200 sentences", "%s, %zu bytes",
          s1 == BK_OK ? "ok" : bk_last_error(), n1);
    bk_status s2 = bk_spm_train(g_texts, NCORP, 300, &m2, &n2);
    bk_set_num_threads(1);
    bk_status s3 = bk_spm_train(g_texts, NCORP, 300, &m3, &n3);
    bk_set_num_threads(0);
    CHECK(s2 == BK_OK && s3 == BK_OK && n1 == n2 && n1 == n3 && !memcmp(m1, m2, n1) && !memcmp(m1, m3, n1),
          "spm train: the same texts give the same model bytes (twice; on 1 thread and on all)", "%zu %zu %zu", n1,
          n2, n3);
    /* another vocab or other texts give another model */
    void *m4 = NULL;
    size_t n4 = 0;
    bk_status s4 = bk_spm_train(g_texts, NCORP - 1, 300, &m4, &n4);
    CHECK(s4 == BK_OK && (n4 != n1 || memcmp(m1, m4, n1)), "spm train: other texts, another model", NULL);
    free(m2);
    free(m3);
    free(m4);

    bk_spm *s = NULL;
    bk_status sl = bk_spm_load(m1, n1, &s);
    CHECK(sl == BK_OK && bk_spm_vocab(s) == 300, "spm load: 300 pieces", "%d", bk_spm_vocab(s));
    CHECK(bk_spm_special(s, BK_SEQ_UNK) == 0 && bk_spm_special(s, BK_SEQ_BOS) == 1 &&
              bk_spm_special(s, BK_SEQ_EOS) == 2 && bk_spm_special(s, BK_SEQ_PAD) == 3 && bk_spm_special(s, 7) == -1,
          "spm special ids are BK_SEQ_UNK/BOS/EOS/PAD", NULL);
    /* a large bound on a small corpus: fewer pieces (hard_vocab_limit false) */
    void *mb = NULL;
    size_t nb = 0;
    bk_spm *sb = NULL;
    bk_status sbig = bk_spm_train(g_texts, NCORP, 8000, &mb, &nb);
    CHECK(sbig == BK_OK && bk_spm_load(mb, nb, &sb) == BK_OK && bk_spm_vocab(sb) > 260 && bk_spm_vocab(sb) < 8000,
          "spm train: vocab 8000 is a bound (a small corpus gives fewer pieces)", "%d", bk_spm_vocab(sb));
    bk_spm_free(sb);
    free(mb);

    /* round trips: seen and unseen characters, whitespace as written */
    static const char *const rt[] = {"the quick brown fox",
                                     "señor niño",
                                     "  two leading spaces",
                                     "trailing spaces   ",
                                     "a  double\tand a tab",
                                     "unseen: Ω ж 漢字 \xf0\x9f\x98\x80 ©",
                                     "",
                                     " ",
                                     "x"};
    int all = 1;
    for (size_t k = 0; k < sizeof rt / sizeof rt[0]; k++) {
        int32_t ids[256];
        int n = -1;
        char *back = NULL;
        bk_status e = bk_spm_encode(s, rt[k], ids, 256, &n);
        bk_status d = e == BK_OK ? bk_spm_decode(s, ids, n, &back) : e;
        int ok = e == BK_OK && d == BK_OK && n >= 0 && n <= 256 && strcmp(back, rt[k]) == 0;
        for (int i = 0; ok && i < n; i++) ok = ids[i] >= 0 && ids[i] < 300 && ids[i] != 0;
        if (!ok) all = 0;
        CHECK(ok, "spm round trip", "'%s' -> %d ids -> '%s'", rt[k], n, back ? back : "(none)");
        free(back);
    }
    CHECK(all, "spm: decode(encode(t)) == t, no UNK (byte fallback)", NULL);
    int32_t one[4];
    int n = 0, nfull = 0;
    CHECK(bk_spm_encode(s, "the quick brown fox jumps", NULL, 0, &nfull) == BK_OK && nfull > 2 &&
              bk_spm_encode(s, "the quick brown fox jumps", one, 2, &n) == BK_OK && n == nfull,
          "spm encode: a cut encoding reports the whole count", "%d %d", n, nfull);
    char *txt = NULL;
    int32_t ctl[3] = {BK_SEQ_BOS, BK_SEQ_EOS, BK_SEQ_PAD};
    CHECK(bk_spm_decode(s, ctl, 3, &txt) == BK_OK && txt && txt[0] == 0, "spm decode: control ids give nothing", "%s",
          txt ? txt : "");
    free(txt);

    /* the model through a file */
    const char *mp = tpath("m.model");
    bk_spm *sf = NULL;
    CHECK(write_file(mp, m1, n1) && bk_spm_load_file(mp, &sf) == BK_OK && bk_spm_vocab(sf) == 300,
          "spm load_file: the written model", "%s", bk_last_error());
    int32_t a[64], b[64];
    int na = 0, nbb = 0;
    CHECK(sf && bk_spm_encode(s, g_texts[7], a, 64, &na) == BK_OK && bk_spm_encode(sf, g_texts[7], b, 64, &nbb) == BK_OK &&
              na == nbb && !memcmp(a, b, sizeof(int32_t) * (size_t)na),
          "spm load_file: the same encodings as the model in memory", NULL);
    bk_spm_free(sf);

    /* refusals */
    int32_t ids[8];
    char bad[] = "ok \xc3\x28 bad";
    bk_status e = bk_spm_encode(s, bad, ids, 8, &n);
    CHECK(e == BK_ERR_FORMAT && has(bk_last_error(), "byte 4: invalid UTF-8 (byte 0xc3)"), "spm encode: bad UTF-8 named",
          "%s", bk_last_error());
    CHECK(bk_spm_encode(s, "x", ids, -1, &n) == BK_ERR_SHAPE && bk_spm_encode(NULL, "x", ids, 8, &n) == BK_ERR_NULL &&
              bk_spm_encode(s, "x", NULL, 8, &n) == BK_ERR_NULL,
          "spm encode: cap < 0, NULLs", NULL);
    int32_t out_of[2] = {5, 300};
    e = bk_spm_decode(s, out_of, 2, &txt);
    CHECK(e == BK_ERR_PARAM && has(bk_last_error(), "id 300 (position 1) outside the vocabulary [0, 300)"),
          "spm decode: an id out of range named", "%s", bk_last_error());
    int32_t neg = -1;
    CHECK(bk_spm_decode(s, &neg, 1, &txt) == BK_ERR_PARAM && bk_spm_decode(s, one, -1, &txt) == BK_ERR_SHAPE,
          "spm decode: a negative id, n < 0", NULL);
    const char *badt[2] = {"fine", "caf\xe9"};
    void *mm = NULL;
    size_t mn = 0;
    e = bk_spm_train(badt, 2, 300, &mm, &mn);
    CHECK(e == BK_ERR_FORMAT && has(bk_last_error(), "text 1, byte 4: invalid UTF-8") && !mm,
          "spm train: bad UTF-8 named (text and byte)", "%s", bk_last_error());
    e = bk_spm_train(g_texts, NCORP, 261, &mm, &mn);
    CHECK(e == BK_ERR_PARAM && has(bk_last_error(), "too small") && !mm, "spm train: a vocab too small for the texts",
          "%s", bk_last_error());
    CHECK(bk_spm_train(g_texts, NCORP, 100, &mm, &mn) == BK_ERR_PARAM &&
              bk_spm_train(g_texts, NCORP, BK_SPM_MAX_VOCAB + 1, &mm, &mn) == BK_ERR_PARAM &&
              bk_spm_train(g_texts, 0, 300, &mm, &mn) == BK_ERR_SHAPE &&
              bk_spm_train(NULL, 1, 300, &mm, &mn) == BK_ERR_NULL && !mm,
          "spm train: vocab out of range, no texts, NULL", NULL);
    const char *empty[2] = {"", ""};
    CHECK(bk_spm_train(empty, 2, 300, &mm, &mn) == BK_ERR_SHAPE && has(bk_last_error(), "empty"),
          "spm train: only empty texts", "%s", bk_last_error());
    bk_spm *x = (bk_spm *)(uintptr_t)8;
    CHECK(bk_spm_load("not a model at all", 18, &x) == BK_ERR_FORMAT && x == (bk_spm *)(uintptr_t)8,
          "spm load: garbage refused, *out untouched", "%s", bk_last_error());
    CHECK(bk_spm_load(m1, 0, &x) == BK_ERR_FORMAT, "spm load: zero bytes refused", "%s", bk_last_error());
    CHECK(write_file(tpath("junk.model"), "\x0a\x05hello", 7) && bk_spm_load_file(tpath("junk.model"), &x) != BK_OK &&
              has(bk_last_error(), "junk.model"),
          "spm load_file: not a model, named", "%s", bk_last_error());
    CHECK(bk_spm_load_file(tpath("none.model"), &x) == BK_ERR_IO && has(bk_last_error(), "none.model"),
          "spm load_file: a missing file (BK_ERR_IO, named)", "%s", bk_last_error());
    CHECK(bk_spm_load_file(g_tmp, &x) == BK_ERR_IO && has(bk_last_error(), "directory"),
          "spm load_file: a directory", "%s", bk_last_error());
    CHECK(bk_spm_vocab(NULL) == 0 && bk_spm_special(NULL, 0) == -1, "spm: NULL model queries", NULL);
    bk_spm_free(NULL);
    bk_spm_free(s);
    free(m1);
}

int main(void)
{
    TH.verbose = 1;
    if (!th_tmpdir(g_tmp, sizeof g_tmp, "test-text")) return 1;
    make_corpus();
    test_train();
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) printf("# could not remove %s\n", g_tmp);
    return th_summary();
}
