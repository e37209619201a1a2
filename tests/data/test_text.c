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
 *     that is not a model, a missing file, a directory, ids out of range;
 *   - labelled text (TSV and CSV: integer and named labels, columns, header,
 *     quoting, CRLF): classes, class names, the tokens decoding back to the
 *     texts, the carved splits disjoint and covering the file, the same model
 *     and tokens on 1 thread and on all, a model given by spm_model; every
 *     refusal naming file:line (and :byte): bad UTF-8, a control character,
 *     a missing column, an empty line / label / text, quotes, an empty file,
 *     only a header, a byte-order mark, a NUL byte, an over-long line, an
 *     unknown label in a test file;
 *   - parallel text: pairs that decode back to the lines (EOS appended), the
 *     drop report of the caps, misaligned files, a model given whose ids are
 *     not BK_SEQ_*; ids: the vocabulary inferred, a test id beyond it.
 * Run: build/test_text; prints "N passed, M failed". */
#include "birkhoff.h"
#include "../../src/data/text.h"
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
    if (sbig == BK_OK) sbig = bk_spm_load(mb, nb, &sb);
    const int vbig = bk_spm_vocab(sb);
    CHECK(sbig == BK_OK && vbig > 260 && vbig < 8000, "spm train: vocab 8000 is a bound (a small corpus gives fewer pieces)",
          "%d", vbig);
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
    const int okc = bk_spm_encode(s, "the quick brown fox jumps", NULL, 0, &nfull) == BK_OK &&
                    bk_spm_encode(s, "the quick brown fox jumps", one, 2, &n) == BK_OK;
    CHECK(okc && nfull > 2 && n == nfull, "spm encode: a cut encoding reports the whole count", "%d %d", n, nfull);
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


/* ---- labelled text ---- */
static const char *put(const char *name, const char *text)
{
    const char *p = tpath(name);
    return write_file(p, text, strlen(text)) ? p : NULL;
}

/* a TSV of 40 rows: label i % 2 (or names), text from the corpus */
static const char *make_tsv(const char *name, int named)
{
    static char buf[16384];
    size_t used = 0;
    static const char *const nm[3] = {"pos", "neg", "neutral"};
    for (int i = 0; i < 40; i++) {
        if (named) used += (size_t)snprintf(buf + used, sizeof buf - used, "%s\t%s\n", nm[i % 3], g_texts[i]);
        else used += (size_t)snprintf(buf + used, sizeof buf - used, "%d\t%s\n", i % 2, g_texts[i]);
    }
    return put(name, buf);
}

static bk_data_config tcfg(void)
{
    bk_data_config c = bk_data_config_default();
    c.spm_vocab = 300;
    c.test_frac = 0.25f;
    return c;
}

/* the text of sample i decoded from its tokens */
static char *decode_sample(const bk_dataset *ds, const bk_spm *sp, int64_t i, int32_t *label)
{
    const bk_dataset_info *in = bk_data_info(ds);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)in->max_len), len = 0;
    char *txt = NULL;
    if (tok && bk_data_fill(ds, &i, 1, NULL, tok, &len, label) == BK_OK) bk_spm_decode(sp, tok, len, &txt);
    free(tok);
    return txt;
}

static int in_corpus(const char *t)
{
    for (int i = 0; i < NCORP; i++)
        if (!strcmp(t, g_texts[i])) return i;
    return -1;
}

static void test_labelled(void)
{
    char spec[800];
    bk_data_config c = tcfg();
    snprintf(spec, sizeof spec, "tsv:%s", make_tsv("int.tsv", 0));
    bk_dataset *tr = NULL, *te = NULL;
    bk_status st = bk_data_open(spec, BK_SPLIT_TRAIN, &c, &tr);
    CHECK(st == BK_OK, "tsv: opens", "%s", st ? bk_last_error() : "");
    if (st != BK_OK) return;
    st = bk_data_open(spec, BK_SPLIT_TEST, &c, &te);
    CHECK(st == BK_OK, "tsv: the test split opens", "%s", st ? bk_last_error() : "");
    if (st != BK_OK) {
        bk_data_close(tr);
        return;
    }
    const bk_dataset_info *a = bk_data_info(tr), *b = bk_data_info(te);
    CHECK(a->n == 30 && b->n == 10 && a->classes == 2 && a->kind == BK_INPUT_TOKENS && a->max_len == 256 &&
              a->vocab > 260 && a->vocab <= 300 && !strcmp(a->name, "tsv") && a->rows == 40,
          "tsv: 30 train + 10 test rows, 2 integer classes, tokens", "n %lld %lld classes %d vocab %d rows %lld",
          (long long)a->n, (long long)b->n, a->classes, a->vocab, (long long)a->rows);
    CHECK(bk_data_class_name(tr, 0) == NULL && strstr(a->version, "integer"), "tsv: integer labels have no names", "%s",
          a->version);
    const void *m1, *m2;
    size_t n1 = 0, n2 = 0;
    CHECK(bk_data_spm_model(tr, &m1, &n1) == BK_OK && bk_data_spm_model(te, &m2, &n2) == BK_OK && n1 == n2 &&
              !memcmp(m1, m2, n1),
          "tsv: train and test encoded with the same model (trained on the training split)", NULL);
    bk_spm *sp = NULL;
    bk_spm_load(m1, n1, &sp);
    /* every sample decodes to a line of the file with its label; the splits are disjoint and cover it */
    int seen[40] = {0}, ok = 1;
    for (int s = 0; s < 2; s++) {
        const bk_dataset *ds = s ? te : tr;
        for (int64_t i = 0; i < bk_data_info(ds)->n; i++) {
            int32_t y = -1;
            char *t = decode_sample(ds, sp, i, &y);
            const int k = t ? in_corpus(t) : -1;
            if (k < 0 || k >= 40 || seen[k] || y != k % 2) ok = 0;
            else seen[k] = 1;
            free(t);
        }
    }
    for (int k = 0; k < 40; k++) ok = ok && seen[k];
    CHECK(ok, "tsv: the samples decode to the file's texts with their labels; splits disjoint, covering it", NULL);
    /* a training text of the test split never taught the model: only the training rows did */
    bk_data_config c1 = c;
    bk_set_num_threads(1);
    bk_dataset *tr1 = NULL;
    st = bk_data_open(spec, BK_SPLIT_TRAIN, &c1, &tr1);
    bk_set_num_threads(0);
    const void *m3 = NULL;
    size_t n3 = 0;
    int same = st == BK_OK && bk_data_spm_model(tr1, &m3, &n3) == BK_OK && n3 == n1 && !memcmp(m1, m3, n1);
    for (int64_t i = 0; same && i < a->n; i++) {
        int32_t t1[256], t2[256], l1, l2, y1, y2;
        same = bk_data_fill(tr, &i, 1, NULL, t1, &l1, &y1) == BK_OK && bk_data_fill(tr1, &i, 1, NULL, t2, &l2, &y2) == BK_OK &&
               l1 == l2 && y1 == y2 && !memcmp(t1, t2, sizeof t1);
    }
    CHECK(same, "tsv: the same model bytes and tokens on 1 thread and on all", NULL);
    bk_data_close(tr1);
    /* the model given (spm_model): the same tokens */
    const char *mp = tpath("given.model");
    write_file(mp, m1, n1);
    c1.spm_model = mp;
    st = bk_data_open(spec, BK_SPLIT_TRAIN, &c1, &tr1);
    /* the version names the model by content: the same as the trained one's */
    same = st == BK_OK && !strcmp(bk_data_info(tr1)->version, bk_data_info(tr)->version);
    for (int64_t i = 0; same && i < a->n; i++) {
        int32_t t1[256], t2[256], l1, l2;
        same = bk_data_fill(tr, &i, 1, NULL, t1, &l1, NULL) == BK_OK && bk_data_fill(tr1, &i, 1, NULL, t2, &l2, NULL) == BK_OK &&
               !memcmp(t1, t2, sizeof t1);
    }
    CHECK(same, "tsv: spm_model given: the same tokens and version as the model trained", "%s", st ? bk_last_error() : "");
    bk_data_close(tr1);
    /* max_len cuts, said in the note */
    c1 = c;
    c1.max_len = 3;
    st = bk_data_open(spec, BK_SPLIT_TRAIN, &c1, &tr1);
    CHECK(st == BK_OK && bk_data_info(tr1)->max_len == 3 && strstr(bk_data_info(tr1)->note, "cut to 3"),
          "tsv: max_len 3 cuts the texts, said in note", "%s", st ? bk_last_error() : bk_data_info(tr1)->note);
    bk_data_close(tr1);
    bk_spm_free(sp);
    bk_data_close(tr);
    bk_data_close(te);

    /* named labels, CSV with quotes, a header, other columns, CRLF */
    snprintf(spec, sizeof spec, "tsv:%s", make_tsv("named.tsv", 1));
    st = bk_data_open(spec, BK_SPLIT_TRAIN, &c, &tr);
    CHECK(st == BK_OK && bk_data_info(tr)->classes == 3 && !strcmp(bk_data_class_name(tr, 0), "neg") &&
              !strcmp(bk_data_class_name(tr, 1), "neutral") && !strcmp(bk_data_class_name(tr, 2), "pos") &&
              !bk_data_class_name(tr, 3) && !bk_data_class_name(tr, -1),
          "tsv: named labels: classes neg, neutral, pos (sorted)", "%s", st ? bk_last_error() : "");
    bk_data_close(tr);
    char csv[4096];
    size_t u = (size_t)snprintf(csv, sizeof csv, "id,text,label\r\n");
    for (int i = 0; i < 24; i++)
        u += (size_t)snprintf(csv + u, sizeof csv - u, "%d,\"%s, \"\"quoted\"\"%s\",%s\r\n", i, g_texts[i],
                              i == 3 ? "\nsecond line" : "", i % 2 ? "spam" : "ham");
    snprintf(spec, sizeof spec, "csv:%s", put("q.csv", csv));
    c1 = c;
    c1.text_header = 1;
    c1.label_column = 3;
    c1.text_column = 2;
    c1.test_frac = 0;
    st = bk_data_open(spec, BK_SPLIT_TRAIN, &c1, &tr);
    ok = st == BK_OK && bk_data_info(tr)->n == 24 && bk_data_info(tr)->classes == 2;
    if (ok) {
        bk_data_spm_model(tr, &m1, &n1);
        bk_spm_load(m1, n1, &sp);
        int32_t y;
        char *t3 = decode_sample(tr, sp, 3, &y), *t4 = decode_sample(tr, sp, 4, &y);
        char want[200];
        snprintf(want, sizeof want, "%s, \"quoted\"\nsecond line", g_texts[3]);
        ok = t3 && !strcmp(t3, want) && t4 && y == 0 && !strncmp(t4, g_texts[4], strlen(g_texts[4]));
        CHECK(ok, "csv: quotes, doubled quotes, a quoted newline, CRLF, header, columns 3 and 2", "'%s'", t3 ? t3 : "");
        free(t3);
        free(t4);
        bk_spm_free(sp);
    } else {
        CHECK(0, "csv: opens", "%s", bk_last_error());
    }
    bk_data_close(tr);

    /* a test file of its own: an unknown label named */
    snprintf(spec, sizeof spec, "tsv:%s", make_tsv("tr.tsv", 1));
    c1 = c;
    c1.test_spec = put("te.tsv", "pos\tthe dog\nmaybe\tthe fox\n");
    st = bk_data_open(spec, BK_SPLIT_TEST, &c1, &te);
    CHECK(st == BK_ERR_FORMAT && strstr(bk_last_error(), "te.tsv:2: label 'maybe' is not a class of the training file"),
          "tsv: a test label the training file lacks, named file:line", "%s", bk_last_error());
    c1.test_spec = put("te2.tsv", "pos\tthe dog\nneg\tthe fox\n");
    st = bk_data_open(spec, BK_SPLIT_TEST, &c1, &te);
    CHECK(st == BK_OK && bk_data_info(te)->n == 2 && bk_data_info(te)->classes == 3, "tsv: a test file of its own",
          "%s", st ? bk_last_error() : "");
    bk_data_close(te);
}

/* refusals: each a file, its message */
static void test_labelled_bad(void)
{
    static const struct {
        const char *name, *text, *msg;
        int csv, header;
    } bad[] = {
        {"utf8", "1\tok\n0\tcaf\xe9 bad\n", "utf8.tsv:2:6: invalid UTF-8 (byte 0xe9)", 0, 0},
        {"ctl", "1\tok\n0\tbell \x07\n", "ctl.tsv:2:8: control character (byte 0x07)", 0, 0},
        {"col", "1\tok\n0\n", "col.tsv:2: 1 column, no text column 2", 0, 0},
        {"emptyline", "1\tok\n\n0\tno\n", "emptyline.tsv:2: empty line", 0, 0},
        {"emptylabel", "1\tok\n \tno\n", "emptylabel.tsv:2: the label (column 1) is empty", 0, 0},
        {"emptytext", "1\tok\n0\t  \n", "emptytext.tsv:2: the text (column 2) is empty", 0, 0},
        {"empty", "", "empty.tsv: no rows (an empty file)", 0, 0},
        {"onlyheader", "label\ttext\n", "onlyheader.tsv: no rows (only a header)", 0, 1},
        {"cr", "1\tok\r0\tno\n", "cr.tsv:1:5: carriage return (CR) not before a line end", 0, 0},
        {"bom", "\xef\xbb\xbf" "1\tok\n", "bom.tsv:1:1: starts with a byte-order mark", 0, 0},
        {"unclosed", "1,ok\n0,\"never closed\n", "unclosed.tsv:2:3: a quote that is never closed", 1, 0},
        {"after", "1,\"q\"x\n", "after.tsv:1:6: text after a closing quote", 1, 0},
        {"inner", "1,a\"b\n", "inner.tsv:1:4: a quote inside an unquoted field", 1, 0},
    };
    bk_data_config c = tcfg();
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char fname[64], spec[800];
        snprintf(fname, sizeof fname, "%s.tsv", bad[k].name);
        snprintf(spec, sizeof spec, "%s:%s", bad[k].csv ? "csv" : "tsv", put(fname, bad[k].text));
        bk_data_config c1 = c;
        c1.text_header = bad[k].header;
        bk_dataset *ds = (bk_dataset *)(uintptr_t)8;
        bk_status st = bk_data_open(spec, BK_SPLIT_TRAIN, &c1, &ds);
        CHECK(st == BK_ERR_FORMAT && strstr(bk_last_error(), bad[k].msg) && ds == NULL, "tsv refuses", "%s: %s",
              bad[k].name, bk_last_error());
    }
    /* a NUL byte and an over-long line (the text reader's limits) */
    char spec[800];
    const char nul[] = "1\tok\n0\tn\0l\n";
    snprintf(spec, sizeof spec, "tsv:%s", tpath("nul.tsv"));
    write_file(tpath("nul.tsv"), nul, sizeof nul - 1);
    bk_dataset *ds = NULL;
    CHECK(bk_data_open(spec, BK_SPLIT_TRAIN, &c, &ds) == BK_ERR_FORMAT && strstr(bk_last_error(), "nul.tsv: line 2 holds a NUL"),
          "tsv refuses a NUL byte (file and line)", "%s", bk_last_error());
    size_t big = (size_t)BK_TEXT_MAX_LINE + 8;
    char *huge = malloc(big + 8);
    if (huge) {
        memcpy(huge, "1\t", 2);
        memset(huge + 2, 'a', big - 3);
        huge[big - 1] = '\n';
        write_file(tpath("long.tsv"), huge, big);
        free(huge);
        snprintf(spec, sizeof spec, "tsv:%s", tpath("long.tsv"));
        CHECK(bk_data_open(spec, BK_SPLIT_TRAIN, &c, &ds) == BK_ERR_FORMAT && strstr(bk_last_error(), "long.tsv: line 1 is longer than"),
              "tsv refuses a line over BK_TEXT_MAX_LINE", "%s", bk_last_error());
    }
    snprintf(spec, sizeof spec, "tsv:%s", tpath("missing.tsv"));
    CHECK(bk_data_open(spec, BK_SPLIT_TRAIN, &c, &ds) == BK_ERR_IO && strstr(bk_last_error(), "missing.tsv"),
          "tsv: a missing file is BK_ERR_IO, named", "%s", bk_last_error());
    bk_data_config c2 = c;
    c2.label_column = c2.text_column = 2;
    snprintf(spec, sizeof spec, "tsv:%s", make_tsv("ok.tsv", 0));
    CHECK(bk_data_open(spec, BK_SPLIT_TRAIN, &c2, &ds) == BK_ERR_PARAM, "tsv: label and text the same column refused",
          "%s", bk_last_error());
    c2 = c;
    c2.spm_vocab = 100;
    CHECK(bk_data_open(spec, BK_SPLIT_TRAIN, &c2, &ds) == BK_ERR_PARAM && strstr(bk_last_error(), "spm_vocab 100"),
          "tsv: spm_vocab too small, said", "%s", bk_last_error());
    /* the parser alone: columns beyond the text and TAB in CSV kept */
    bki_ltable t;
    const char in[] = "a,\"x\ty\",c,d\nb,z,,\n";
    bk_status st = bki_parse_labelled(in, sizeof in - 1, "m", 1, 1, 2, 0, &t);
    CHECK(st == BK_OK && t.n == 2 && !strcmp(t.buf + t.text[0], "x\ty") && !strcmp(t.buf + t.label[1], "b") &&
              t.line[1] == 2,
          "parser: extra columns ignored, TAB inside a CSV field kept", "%s", st ? bk_last_error() : "");
    if (st == BK_OK) bki_ltable_free(&t);
}

/* ---- parallel text and id pairs ---- */
static void test_parallel_text(void)
{
    char src[8192], tgt[8192];
    size_t us = 0, ut = 0;
    for (int i = 0; i < 30; i++) {
        us += (size_t)snprintf(src + us, sizeof src - us, "%s\n", g_texts[i]);
        ut += (size_t)snprintf(tgt + ut, sizeof tgt - ut, "%s %s\n", g_texts[i + 50], i == 7 ? g_texts[9] : "");
    }
    const char *ps = put("p.src", src), *pt = put("p.tgt", tgt);
    char spec[1600];
    snprintf(spec, sizeof spec, "parallel:%s,%s", ps, pt);
    bk_data_config c = tcfg();
    c.spm_vocab = 400;
    c.test_frac = 0.2f;
    bk_dataset *tr = NULL;
    bk_status st = bk_data_open(spec, BK_SPLIT_TRAIN, &c, &tr);
    CHECK(st == BK_OK, "parallel: opens", "%s", st ? bk_last_error() : "");
    if (st != BK_OK) return;
    const bk_dataset_info *in = bk_data_info(tr);
    CHECK(in->seq2seq && in->n == 24 && in->rows == 30 && in->dropped == 0 && !in->note[0] && !strcmp(in->name, "parallel"),
          "parallel: 24 training pairs of 30, nothing dropped", "n %lld rows %lld", (long long)in->n, (long long)in->rows);
    const void *m;
    size_t mn;
    bk_spm *sp = NULL;
    int ok = bk_data_spm_model(tr, &m, &mn) == BK_OK && bk_spm_load(m, mn, &sp) == BK_OK;
    for (int64_t i = 0; ok && i < in->n; i++) {
        int32_t s[256], t[256], ls, lt;
        char *a = NULL, *b = NULL;
        ok = in->max_len <= 256 && in->tgt_max_len <= 256 && bk_data_fill_pair(tr, &i, 1, s, &ls, t, &lt) == BK_OK &&
             s[ls - 1] == BK_SEQ_EOS && t[lt - 1] == BK_SEQ_EOS && bk_spm_decode(sp, s, ls - 1, &a) == BK_OK &&
             bk_spm_decode(sp, t, lt - 1, &b) == BK_OK;
        const int k = ok ? in_corpus(a) : -1;
        char want[200];
        if (k >= 0) snprintf(want, sizeof want, "%s %s", g_texts[k + 50], k == 7 ? g_texts[9] : "");
        ok = ok && k >= 0 && k < 30 && !strcmp(b, want);
        free(a);
        free(b);
    }
    CHECK(ok, "parallel: each pair decodes to its two lines, EOS appended", NULL);
    bk_spm_free(sp);
    const int longest = in->tgt_max_len;
    bk_data_close(tr);
    /* the caps drop pairs, and say so */
    bk_data_config c1 = c;
    c1.tgt_max_len = longest - 1;
    c1.test_frac = 0;
    st = bk_data_open(spec, BK_SPLIT_TRAIN, &c1, &tr);
    CHECK(st == BK_OK && bk_data_info(tr)->dropped >= 1 && bk_data_info(tr)->n == 30 - bk_data_info(tr)->dropped &&
              strstr(bk_data_info(tr)->note, "pairs dropped") && strstr(bk_data_info(tr)->note, "target longer than"),
          "parallel: tgt_max_len below the longest drops pairs, reported in note", "%s",
          st ? bk_last_error() : bk_data_info(tr)->note);
    bk_data_close(tr);
    /* misaligned files; a model whose ids are not BK_SEQ_* */
    snprintf(spec, sizeof spec, "parallel:%s,%s", ps, put("short.tgt", "one\ntwo\n"));
    CHECK(bk_data_open(spec, BK_SPLIT_TRAIN, &c, &tr) == BK_ERR_FORMAT && strstr(bk_last_error(), "not line-aligned"),
          "parallel: misaligned files refused", "%s", bk_last_error());
    snprintf(spec, sizeof spec, "parallel:%s", ps);
    CHECK(bk_data_open(spec, BK_SPLIT_TRAIN, &c, &tr) == BK_ERR_PARAM && strstr(bk_last_error(), "SRC,TGT"),
          "parallel: one file refused", "%s", bk_last_error());

    /* ids: vocabulary inferred; a test id beyond it named */
    snprintf(spec, sizeof spec, "ids:%s,%s", put("a.ids", "4 5 6\n7 9\n5\n4 4\n"), put("b.ids", "6 5 4\n9 7\n5\n8\n"));
    c1 = c;
    c1.test_frac = 0;
    st = bk_data_open(spec, BK_SPLIT_TRAIN, &c1, &tr);
    CHECK(st == BK_OK && bk_data_info(tr)->vocab == 10 && bk_data_info(tr)->n == 4 && bk_data_info(tr)->max_len == 4,
          "ids: vocab inferred (largest id + 1)", "%s", st ? bk_last_error() : "");
    bk_data_close(tr);
    c1.test_spec = "ids:x";
    c1.test_spec = NULL;
    char tspec[1600];
    snprintf(tspec, sizeof tspec, "%s,%s", put("ta.ids", "4 5\n"), put("tb.ids", "10\n"));
    c1.test_spec = tspec;
    CHECK(bk_data_open(spec, BK_SPLIT_TEST, &c1, &tr) == BK_ERR_FORMAT && strstr(bk_last_error(), "tb.ids: line 1, token 1: id 10 outside [0, 10)"),
          "ids: a test id beyond the training vocabulary, named", "%s", bk_last_error());
}

int main(void)
{
    TH.verbose = 1;
    if (!th_tmpdir(g_tmp, sizeof g_tmp, "test-text")) return 1;
    make_corpus();
    test_train();
    test_labelled();
    test_labelled_bad();
    test_parallel_text();
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) printf("# could not remove %s\n", g_tmp);
    return th_summary();
}
