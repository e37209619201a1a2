/* test_bible.c -- sentence-pair (seq2seq) datasets (bk_data_open_ids, the
 * "bible" dataset of bk_data_open, bk_data_fill_pair, bk_data_batch_fill,
 * bk_data_bucket_order, bk_data_model_shape; src/data/data.c, batch.c) on
 * id files the test writes itself: EOS appended, padding, the caps dropping
 * pairs, every parse refusal naming the file and line, unequal line counts,
 * the checksum refusal of the stored set with its fix, the validation split
 * (and its refusal by the other datasets), the bucketed order (a
 * permutation, length-homogeneous batches, deterministic). When the real
 * corpus is present ($BK_TEST_DATA or $BK_DATA, else data/, as
 * scripts/data.sh bible-spm builds it) its three splits are opened and
 * checked; otherwise those checks are skipped.
 * Run: build/test_bible; prints "N passed, M failed". */
#include "birkhoff.h"
#include "../harness.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECK(ok, name, ...) th_check((ok), (name), __VA_ARGS__)

static char g_tmp[512];

static int has(const char *msg, const char *part) { return msg && strstr(msg, part) != NULL; }

static int write_file(const char *path, const char *data)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t n = strlen(data);
    int ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* writes both files as DIR/NAME.es.ids, DIR/NAME.en.ids, opens them */
static bk_status open_pair(const char *name, const char *src, const char *tgt, int vocab, const bk_data_config *c,
                           bk_dataset **ds, char *sp, char *tp)
{
    snprintf(sp, 600, "%s/%s.es.ids", g_tmp, name);
    snprintf(tp, 600, "%s/%s.en.ids", g_tmp, name);
    if (!write_file(sp, src) || !write_file(tp, tgt)) {
        CHECK(0, "write the files", "%s", g_tmp);
        return BK_ERR_IO;
    }
    return bk_data_open_ids(sp, tp, vocab, BK_SPLIT_TRAIN, c, ds);
}

/* source lengths with EOS 4, 2, 6, 3; target 3, 5, 2, 7 */
static const char SRC[] = "5 6 7\n9\n10 11 12 13 14\n0 99\n";
static const char TGT[] = "20 21\n22 23 24 25\n26\n27 28 29 30 31 32";

static void test_basic(void)
{
    char sp[600], tp[600];
    bk_dataset *ds = NULL;
    bk_status st = open_pair("basic", SRC, TGT, 100, NULL, &ds, sp, tp);
    CHECK(st == BK_OK, "basic: opens", "%s", bk_last_error());
    if (st != BK_OK) return;
    const bk_dataset_info *in = bk_data_info(ds);
    CHECK(in->seq2seq == 1 && in->kind == BK_INPUT_TOKENS && in->classes == 0 && in->n == 4 && in->vocab == 100 &&
              in->max_len == 6 && in->tgt_max_len == 7 && in->tokens_src == 15 && in->tokens_tgt == 17 &&
              !strcmp(in->name, "ids") && has(in->version, "dropped 0 of 4"),
          "basic: info (caps = the longest, EOS counted)", "n %lld max %d %d tokens %lld %lld version %s",
          (long long)in->n, in->max_len, in->tgt_max_len, (long long)in->tokens_src, (long long)in->tokens_tgt,
          in->version);
    int64_t idx[2] = {3, 0};
    int32_t src[2 * 6], sl[2], tgt[2 * 7], tl[2];
    st = bk_data_fill_pair(ds, idx, 2, src, sl, tgt, tl);
    const int32_t want_src[12] = {0, 99, 2, 3, 3, 3, 5, 6, 7, 2, 3, 3};
    const int32_t want_tgt[14] = {27, 28, 29, 30, 31, 32, 2, 20, 21, 2, 3, 3, 3, 3};
    CHECK(st == BK_OK && !memcmp(src, want_src, sizeof src) && !memcmp(tgt, want_tgt, sizeof tgt) && sl[0] == 3 &&
              sl[1] == 4 && tl[0] == 7 && tl[1] == 3,
          "basic: fill_pair appends EOS and pads with 3", "st %d len %d %d %d %d", st, sl[0], sl[1], tl[0], tl[1]);
    /* bk_data_fill: the sources; labels refused */
    int32_t tok[6], len1, lab;
    CHECK(bk_data_fill(ds, idx, 1, NULL, tok, &len1, NULL) == BK_OK && !memcmp(tok, want_src, sizeof tok) &&
              len1 == 3,
          "basic: bk_data_fill fills the source", "%s", bk_last_error());
    CHECK(bk_data_fill(ds, idx, 1, NULL, tok, &len1, &lab) == BK_ERR_PARAM && has(bk_last_error(), "no labels"),
          "basic: bk_data_fill refuses labels", "%s", bk_last_error());
    int64_t bad = 4;
    CHECK(bk_data_fill_pair(ds, &bad, 1, src, sl, tgt, tl) == BK_ERR_PARAM, "basic: index out of range", "%s",
          bk_last_error());
    CHECK(bk_data_fill_pair(ds, idx, 1, src, NULL, tgt, tl) == BK_ERR_NULL, "basic: NULL array", "%s",
          bk_last_error());
    CHECK(bk_data_fill_pair(ds, idx, -1, src, sl, tgt, tl) == BK_ERR_SHAPE, "basic: B < 0", "%s", bk_last_error());
    /* batch buffers */
    bk_data_batch b;
    st = bk_data_batch_init(&b, ds, 2);
    bk_batch bt;
    memset(&bt, 0xff, sizeof bt);
    if (st == BK_OK) {
        b.idx[0] = 3;
        b.idx[1] = 0;
        st = bk_data_batch_fill(&b, ds, 2, &bt);
    }
    CHECK(st == BK_OK && !b.labels && bt.labels == NULL && bt.B == 2 && bt.tokens == b.tokens && bt.len == b.len &&
              bt.tgt == b.tgt && bt.tgt_len == b.tgt_len && !memcmp(b.tokens, want_src, sizeof want_src) &&
              !memcmp(b.tgt, want_tgt, sizeof want_tgt) && b.tgt_len[0] == 7 && b.len[1] == 4,
          "basic: bk_data_batch_fill fills tokens and tgt, labels NULL", "%s", bk_last_error());
    bk_data_batch_free(&b);
    CHECK(b.tgt == NULL && b.tgt_len == NULL, "basic: batch_free clears tgt", "%s", "");
    /* model shape */
    bk_model_config mc = bk_model_config_default();
    mc.classes = 7;
    bk_data_model_shape(ds, &mc);
    CHECK(mc.arch == BK_ARCH_SEQ2SEQ && mc.input == BK_INPUT_TOKENS && mc.vocab == 100 && mc.max_len == 6 &&
              mc.tgt_max_len == 7 && mc.bos == 1 && mc.eos == 2 && mc.classes == 7,
          "basic: model shape", "arch %d vocab %d len %d %d", (int)mc.arch, mc.vocab, mc.max_len, mc.tgt_max_len);
    bk_data_close(ds);
}

static void test_caps(void)
{
    char sp[600], tp[600];
    bk_data_config c = bk_data_config_default();
    c.max_len = 4; /* drops pair 2 (source 6) */
    c.tgt_max_len = 5; /* drops pair 3 (target 7) */
    bk_dataset *ds = NULL;
    bk_status st = open_pair("caps", SRC, TGT, 100, &c, &ds, sp, tp);
    const bk_dataset_info *in = st == BK_OK ? bk_data_info(ds) : NULL;
    CHECK(in && in->n == 2 && in->max_len == 4 && in->tgt_max_len == 5 && in->tokens_src == 6 &&
              in->tokens_tgt == 8 && has(in->version, "dropped 2 of 4") && has(in->version, "src<=4 tgt<=5"),
          "caps: over-long pairs dropped, counted in the version", "%s", in ? in->version : bk_last_error());
    if (in) {
        int64_t idx[2] = {0, 1};
        int32_t src[8], sl[2], tgt[10], tl[2];
        st = bk_data_fill_pair(ds, idx, 2, src, sl, tgt, tl);
        CHECK(st == BK_OK && src[0] == 5 && sl[0] == 4 && src[4] == 9 && src[5] == 2 && sl[1] == 2 && tl[1] == 5 &&
                  tgt[5] == 22,
              "caps: kept pairs in file order", "%d %d", src[0], src[4]);
    }
    bk_data_close(ds);
    ds = NULL;
    c.max_len = 0;
    c.tgt_max_len = 0;
    c.limit = 3;
    st = open_pair("caps", SRC, TGT, 100, &c, &ds, sp, tp);
    in = st == BK_OK ? bk_data_info(ds) : NULL;
    CHECK(in && in->n == 3 && in->tokens_src == 12 && in->tokens_tgt == 10, "caps: limit keeps the first pairs",
          "%s", bk_last_error());
    bk_data_close(ds);
    ds = NULL;
    c.limit = 0;
    c.max_len = 1;
    CHECK(open_pair("caps", SRC, TGT, 100, &c, &ds, sp, tp) == BK_ERR_SHAPE && !ds, "caps: nothing left is an error",
          "%s", bk_last_error());
    c.max_len = -1;
    CHECK(open_pair("caps", SRC, TGT, 100, &c, &ds, sp, tp) == BK_ERR_PARAM, "caps: negative cap refused", "%s",
          bk_last_error());
    c.max_len = 0;
    CHECK(open_pair("caps", SRC, TGT, 3, &c, &ds, sp, tp) == BK_ERR_PARAM, "caps: vocab < 4 refused", "%s",
          bk_last_error());
}

/* each case: a bad source file, the part of the message that must appear */
static void test_refusals(void)
{
    static const struct {
        const char *src, *want;
    } bad[] = {
        {"1 2\n\n3\n", "line 2 is empty"},
        {"1 2\n3\n\n", "line 3 is empty"},
        {"\n1\n2\n", "line 1 is empty"},
        {"1 2\n3 x\n4\n", "line 2, token 2"},
        {"1 2\n3\n4 -5\n", "line 3, token 2"},
        {"1 2\n3a\n4\n", "line 2, token 1: not a decimal"},
        {"1 2\n3\n4 100\n", "id 100 outside [0, 100)"},
        {"1 2\n3\n99999999999999\n", "line 3, token 1"},
        {"1 2\n03\n4\n", "leading zero"},
        {"1  2\n3\n4\n", "line 1 has two spaces"},
        {" 1\n3\n4\n", "line 1 starts with a space"},
        {"1 2 \n3\n4\n", "line 1 ends with a space"},
        {"1 2\r\n3\n4\n", "line 1, token 2: carriage return"},
        {"1 2\n3\n4 ", "line 3 ends with a space"},
        {"1\t2\n3\n4\n", "line 1, token 1"},
        {"", "empty file"},
    };
    char sp[600], tp[600], name[160];
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        bk_dataset *ds = NULL;
        bk_status st = open_pair("bad", bad[k].src, "1\n2\n3\n", 100, NULL, &ds, sp, tp);
        snprintf(name, sizeof name, "refuse: %s", bad[k].want);
        CHECK(st == BK_ERR_FORMAT && !ds && has(bk_last_error(), bad[k].want) && has(bk_last_error(), sp), name,
              "st %d: %s", st, bk_last_error());
        bk_data_close(ds);
    }
    bk_dataset *ds = NULL;
    bk_status st = open_pair("lines", "1\n2\n3\n", "1\n2\n", 100, NULL, &ds, sp, tp);
    CHECK(st == BK_ERR_FORMAT && has(bk_last_error(), "not line-aligned") && has(bk_last_error(), tp),
          "refuse: unequal line counts", "%s", bk_last_error());
    st = open_pair("lines", "1\n2\n3", "1\n2\n3\n", 100, NULL, &ds, sp, tp);
    CHECK(st == BK_OK, "no final newline is fine", "%s", bk_last_error());
    bk_data_close(ds);
    ds = NULL;
    char missing[700];
    snprintf(missing, sizeof missing, "%s/none.ids", g_tmp);
    CHECK(bk_data_open_ids(missing, tp, 100, BK_SPLIT_TRAIN, NULL, &ds) == BK_ERR_IO && has(bk_last_error(), missing),
          "refuse: missing file (BK_ERR_IO)", "%s", bk_last_error());
    CHECK(bk_data_open_ids(NULL, tp, 100, BK_SPLIT_TRAIN, NULL, &ds) == BK_ERR_NULL, "refuse: NULL path", "%s",
          bk_last_error());
}

/* the stored set: DIR/bible/SPLIT.{es,en}.ids checked against the known
 * version, whatever the directory */
static void test_stored_refusal(void)
{
    char d[600], p[700];
    snprintf(d, sizeof d, "%s/bible", g_tmp);
    mkdir(d, 0755);
    bk_data_config c = bk_data_config_default();
    c.dir = g_tmp;
    bk_dataset *ds = NULL;
    bk_status st = bk_data_open("bible", BK_SPLIT_VALID, &c, &ds);
    CHECK(st == BK_ERR_IO && has(bk_last_error(), "valid.es.ids") && has(bk_last_error(), "scripts/data.sh bible-spm"),
          "bible: a missing file names the fix", "%s", bk_last_error());
    snprintf(p, sizeof p, "%s/valid.es.ids", d);
    int ok = write_file(p, "1 2\n3\n");
    snprintf(p, sizeof p, "%s/valid.en.ids", d);
    ok = ok && write_file(p, "4\n5 6\n");
    st = bk_data_open("bible", BK_SPLIT_VALID, &c, &ds);
    CHECK(ok && st == BK_ERR_FORMAT && !ds && has(bk_last_error(), "not the known version") &&
              has(bk_last_error(), "scripts/data.sh bible-spm"),
          "bible: another version is refused with the fix", "%s", bk_last_error());
    CHECK(bk_data_known("bible") == 1, "bible: known", "%s", "");
}

static void test_valid_split(void)
{
    bk_data_config c = bk_data_config_default();
    c.gen_train = 10;
    c.gen_test = 10;
    bk_dataset *ds = NULL;
    bk_status st = bk_data_open("listops", BK_SPLIT_VALID, &c, &ds);
    CHECK(st == BK_ERR_PARAM && !ds && has(bk_last_error(), "dataset listops has no validation split"),
          "valid: refused by the other datasets", "%s", bk_last_error());
    st = bk_data_open("shapes", (bk_split)3, &c, &ds);
    CHECK(st == BK_ERR_PARAM && !ds, "valid: split 3 refused", "%s", bk_last_error());
    st = bk_data_open("listops", BK_SPLIT_TEST, &c, &ds);
    bk_data_batch b;
    bk_batch bt;
    memset(&bt, 0xff, sizeof bt);
    if (st == BK_OK) st = bk_data_batch_init(&b, ds, 2);
    if (st == BK_OK) {
        b.idx[0] = 0;
        b.idx[1] = 1;
        st = bk_data_batch_fill(&b, ds, 2, &bt);
        CHECK(st == BK_OK && bt.tgt == NULL && bt.tgt_len == NULL && bt.labels == b.labels && b.tgt == NULL &&
                  bk_data_info(ds)->seq2seq == 0,
              "classifier batches: tgt NULL", "%s", bk_last_error());
        int64_t p[2] = {0, 1};
        CHECK(bk_data_bucket_order(ds, p, 2, 1, 0) == BK_ERR_PARAM, "bucket order refuses a classifier dataset", "%s",
              bk_last_error());
        int32_t s1[4096], l1, t1[8], tl1;
        CHECK(bk_data_fill_pair(ds, p, 1, s1, &l1, t1, &tl1) == BK_ERR_PARAM, "fill_pair refuses a classifier dataset",
              "%s", bk_last_error());
        bk_data_batch_free(&b);
    }
    bk_data_close(ds);
}

/* n pairs with lengths from a little generator */
static void test_buckets(void)
{
    enum { N = 1003 };
    char *src = malloc(N * 64), *tgt = malloc(N * 64);
    size_t a = 0, t = 0;
    uint64_t s = 7;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int ls = 1 + (int)((s >> 33) % 20), lt = 1 + (int)((s >> 45) % 20);
        for (int j = 0; j < ls; j++) a += (size_t)sprintf(src + a, j ? " %d" : "%d", 4 + (i + j) % 50);
        for (int j = 0; j < lt; j++) t += (size_t)sprintf(tgt + t, j ? " %d" : "%d", 4 + (i * 3 + j) % 50);
        src[a++] = '\n';
        tgt[t++] = '\n';
    }
    src[a] = tgt[t] = 0;
    char sp[600], tp[600];
    bk_dataset *ds = NULL;
    bk_status st = open_pair("bucket", src, tgt, 64, NULL, &ds, sp, tp);
    free(src);
    free(tgt);
    CHECK(st == BK_OK, "buckets: open", "%s", bk_last_error());
    if (st != BK_OK) return;
    int64_t *p = malloc(sizeof(int64_t) * N), *q = malloc(sizeof(int64_t) * N), *seen = calloc(N, sizeof(int64_t));
    const int B = 16;
    const int64_t W = 100; /* rounded up to 112 */
    bk_data_epoch_order(p, N, 5, 0);
    memcpy(q, p, sizeof(int64_t) * N);
    st = bk_data_bucket_order(ds, p, N, B, W);
    int perm = st == BK_OK;
    for (int i = 0; perm && i < N; i++) perm = p[i] >= 0 && p[i] < N && !seen[p[i]]++;
    CHECK(perm, "buckets: a permutation", "%s", bk_last_error());
    /* every window holds the same indices as before */
    int same = 1;
    for (int64_t w0 = 0; same && w0 < N; w0 += 112) {
        int64_t m = N - w0 < 112 ? N - w0 : 112, sa = 0, sb = 0, xa = 0, xb = 0;
        for (int64_t i = 0; i < m; i++) {
            sa += p[w0 + i];
            sb += q[w0 + i];
            xa ^= p[w0 + i] * 2654435761;
            xb ^= q[w0 + i] * 2654435761;
        }
        same = sa == sb && xa == xb;
    }
    CHECK(same, "buckets: windows keep their samples (window rounded up to a multiple of batch)", "%s", "");
    /* length spread inside batches vs. the random order's */
    int32_t *sv = malloc(sizeof(int32_t) * (size_t)B * 21), sl[16], *tv = malloc(sizeof(int32_t) * (size_t)B * 21),
            tl[16];
    long spread_b = 0, spread_r = 0;
    int sorted = 1;
    for (int64_t b0 = 0; b0 + B <= N; b0 += B) {
        for (int pass = 0; pass < 2; pass++) {
            bk_data_fill_pair(ds, (pass ? q : p) + b0, B, sv, sl, tv, tl);
            int lo = 99, hi = 0;
            for (int i = 0; i < B; i++) {
                if (tl[i] < lo) lo = tl[i];
                if (tl[i] > hi) hi = tl[i];
                if (!pass && i && (tl[i] < tl[i - 1] || (tl[i] == tl[i - 1] && sl[i] < sl[i - 1]))) sorted = 0;
            }
            if (pass) spread_r += hi - lo;
            else spread_b += hi - lo;
        }
    }
    CHECK(sorted && spread_b * 5 < spread_r, "buckets: batches sorted by (target, source) length, homogeneous",
          "spread %ld vs random %ld", spread_b, spread_r);
    /* the last partial batch stays at the end: N = 1003 = 62 * 16 + 11 */
    int64_t *r = malloc(sizeof(int64_t) * N);
    memcpy(r, q, sizeof(int64_t) * N);
    st = bk_data_bucket_order(ds, r, N, B, W);
    CHECK(st == BK_OK && !memcmp(r, p, sizeof(int64_t) * N), "buckets: deterministic", "%s", bk_last_error());
    bk_data_epoch_order(r, N, 5, 1);
    bk_data_bucket_order(ds, r, N, B, W);
    CHECK(memcmp(r, p, sizeof(int64_t) * N) != 0, "buckets: another epoch order gives another order", "%s", "");
    memcpy(r, q, sizeof(int64_t) * N);
    st = bk_data_bucket_order(ds, r, N, B, 0); /* one window: a global sort, batches shuffled */
    int glob = st == BK_OK;
    for (int64_t b0 = 0; glob && b0 + B <= N; b0 += B) {
        bk_data_fill_pair(ds, r + b0, B, sv, sl, tv, tl);
        glob = tl[B - 1] - tl[0] <= 1;
    }
    CHECK(glob, "buckets: window 0 is the whole order", "%s", bk_last_error());
    int64_t bad[2] = {0, N};
    CHECK(bk_data_bucket_order(ds, bad, 2, 1, 0) == BK_ERR_PARAM && bad[0] == 0 && bad[1] == N,
          "buckets: entry out of range refused, p untouched", "%s", bk_last_error());
    CHECK(bk_data_bucket_order(ds, bad, 2, 0, 0) == BK_ERR_SHAPE, "buckets: batch 0 refused", "%s", bk_last_error());
    free(sv);
    free(tv);
    free(p);
    free(q);
    free(r);
    free(seen);
    bk_data_close(ds);
}

/* the real corpus, when present */
static void test_real(void)
{
    const char *dir = getenv("BK_TEST_DATA");
    if (!dir || !*dir) dir = getenv("BK_DATA");
    if (!dir || !*dir) dir = "data";
    char p[1100];
    snprintf(p, sizeof p, "%s/bible/train.es.ids", dir);
    if (access(p, R_OK) != 0) {
        printf("ok - bible corpus: SKIP (%s absent; scripts/data.sh bible-spm)\n", p);
        return;
    }
    static const int64_t want[3] = {27732, 1691, 921};
    static const char *names[3] = {"train", "test", "valid"};
    for (int sp = 0; sp < 3; sp++) {
        bk_data_config c = bk_data_config_default();
        c.dir = dir;
        bk_dataset *ds = NULL;
        bk_status st = bk_data_open("bible", (bk_split)sp, &c, &ds);
        const bk_dataset_info *in = st == BK_OK ? bk_data_info(ds) : NULL;
        char name[96];
        snprintf(name, sizeof name, "bible corpus: %s opens, every pair kept", names[sp]);
        CHECK(in && in->n == want[sp] && in->vocab == 8000 && in->seq2seq && has(in->version, "dropped 0 of"), name,
              "%s", in ? in->version : bk_last_error());
        if (in) printf("# %s: %lld pairs, src <= %d, tgt <= %d, %lld + %lld ids; %s\n", names[sp], (long long)in->n,
                       in->max_len, in->tgt_max_len, (long long)in->tokens_src, (long long)in->tokens_tgt,
                       in->version);
        bk_data_close(ds);
        ds = NULL;
        c.max_len = 64;
        c.tgt_max_len = 64;
        st = bk_data_open("bible", (bk_split)sp, &c, &ds);
        in = st == BK_OK ? bk_data_info(ds) : NULL;
        snprintf(name, sizeof name, "bible corpus: %s with caps 64", names[sp]);
        CHECK(in && in->n < want[sp] && in->n > want[sp] / 2 && in->max_len == 64, name, "%s",
              in ? in->version : bk_last_error());
        if (in) printf("# %s caps 64: %s\n", names[sp], in->version);
        bk_data_close(ds);
    }
}

int main(void)
{
    TH.verbose = 1; /* one line per check, as before */
    if (!th_tmpdir(g_tmp, sizeof g_tmp, "bible")) return 1;
    test_basic();
    test_caps();
    test_refusals();
    test_stored_refusal();
    test_valid_split();
    test_buckets();
    test_real();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) printf("# could not remove %s\n", g_tmp);
    return th_summary();
}
