/* test_parallel.c -- parallel text (bk_parallel_*, src/data/parallel.c):
 * line-aligned files the test writes itself, read from disk and from
 * memory alike; every refusal (bad UTF-8 of each kind, a byte-order mark,
 * CR, control characters, line separators, empty and blank lines, a line
 * over the limit, unequal line counts, an empty file, missing files, bad
 * options, NULLs, indices) with its status and a message naming the file
 * and line; the stored corpus's refusal of a missing or changed file with
 * the fix and the package versions. When the Bible corpus is present
 * ($BK_TEST_DATA or $BK_DATA, else data/, as scripts/data.sh bible builds
 * it) its splits are opened and their counts printed and checked.
 * Run: build/test_parallel; prints "N passed, M failed". */
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

static int write_file(const char *path, const char *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static uint64_t fnv(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
    return h;
}

/* ---- good input ---- */
static const char SRC[] = "En el principio crió Dios los cielos y la tierra.\n"
                          "¿Dónde\testás?\n"
                          "Amén.";                      /* no final newline */
static const char TGT[] = "In the beginning, God created the heavens and the earth.\n"
                          "Where are you? \xf0\x9f\x98\x80\n" /* U+1F600, 4 bytes */
                          "Amen.\n";

static void check_good(bk_parallel *p, const char *how)
{
    char name[128];
    snprintf(name, sizeof name, "%s: three pairs, text and lengths as written", how);
    bk_sentence_pair a, b, c;
    int ok = bk_parallel_count(p) == 3 && bk_parallel_pair(p, 0, &a) == BK_OK &&
             bk_parallel_pair(p, 1, &b) == BK_OK && bk_parallel_pair(p, 2, &c) == BK_OK;
    ok = ok && strcmp(a.src, "En el principio crió Dios los cielos y la tierra.") == 0 &&
         strcmp(a.tgt, "In the beginning, God created the heavens and the earth.") == 0 &&
         a.src_len == (int32_t)strlen(a.src) && a.tgt_len == (int32_t)strlen(a.tgt) &&
         strcmp(b.src, "¿Dónde\testás?") == 0 && strcmp(b.tgt, "Where are you? \xf0\x9f\x98\x80") == 0 &&
         b.tgt_len == 19 && strcmp(c.src, "Amén.") == 0 && c.src_len == 6 && strcmp(c.tgt, "Amen.") == 0;
    CHECK(ok, name, "count %lld", (long long)bk_parallel_count(p));
    const bk_parallel_info *in = bk_parallel_get_info(p);
    snprintf(name, sizeof name, "%s: info counts, sizes and checksums", how);
    CHECK(in && in->n == 3 && in->lines == 3 && in->src_bytes == (int64_t)(sizeof SRC - 1 - 2) &&
              in->tgt_bytes == (int64_t)(sizeof TGT - 1 - 3) && in->src_max == a.src_len &&
              in->tgt_max == a.tgt_len && in->src_fnv == fnv(SRC, sizeof SRC - 1) &&
              in->tgt_fnv == fnv(TGT, sizeof TGT - 1) && in->version[0],
          name, "n %lld bytes %lld %lld", in ? (long long)in->n : -1LL, in ? (long long)in->src_bytes : -1LL,
          in ? (long long)in->tgt_bytes : -1LL);
}

static void test_good(void)
{
    char sp[600], tp[600];
    snprintf(sp, sizeof sp, "%s/good.es", g_tmp);
    snprintf(tp, sizeof tp, "%s/good.en", g_tmp);
    if (!write_file(sp, SRC, sizeof SRC - 1) || !write_file(tp, TGT, sizeof TGT - 1)) {
        CHECK(0, "good: write the files", "%s", g_tmp);
        return;
    }
    bk_parallel *p = NULL;
    bk_status st = bk_parallel_load(sp, tp, NULL, &p);
    CHECK(st == BK_OK && p, "load: two good files", "%s", bk_last_error());
    if (p) check_good(p, "load");
    bk_parallel_free(p);

    p = NULL;
    st = bk_parallel_parse(SRC, sizeof SRC - 1, TGT, sizeof TGT - 1, "a.es", "a.en", NULL, &p);
    CHECK(st == BK_OK && p, "parse: the same bytes from memory", "%s", bk_last_error());
    if (p) check_good(p, "parse");
    bk_sentence_pair x;
    CHECK(bk_parallel_pair(p, 3, &x) == BK_ERR_PARAM && has(bk_last_error(), "outside [0, 3)"),
          "pair: index 3 of 3 refused", "%s", bk_last_error());
    CHECK(bk_parallel_pair(p, -1, &x) == BK_ERR_PARAM, "pair: index -1 refused", "%s", bk_last_error());
    CHECK(bk_parallel_pair(NULL, 0, &x) == BK_ERR_NULL && bk_parallel_pair(p, 0, NULL) == BK_ERR_NULL,
          "pair: NULL refused", "%s", bk_last_error());
    bk_parallel_free(p);

    bk_parallel_config c = bk_parallel_config_default();
    c.limit = 2;
    p = NULL;
    st = bk_parallel_parse(SRC, sizeof SRC - 1, TGT, sizeof TGT - 1, NULL, NULL, &c, &p);
    const bk_parallel_info *in = bk_parallel_get_info(p);
    CHECK(st == BK_OK && bk_parallel_count(p) == 2 && in->lines == 3 && bk_parallel_pair(p, 2, &x) == BK_ERR_PARAM,
          "limit 2 keeps the first two pairs", "%s", bk_last_error());
    bk_parallel_free(p);
    c.limit = 10;
    p = NULL;
    st = bk_parallel_parse(SRC, sizeof SRC - 1, TGT, sizeof TGT - 1, NULL, NULL, &c, &p);
    CHECK(st == BK_OK && bk_parallel_count(p) == 3, "a limit above the count keeps all", "%s", bk_last_error());
    bk_parallel_free(p);

    /* max_bytes counts bytes, without the newline: the longest line fits exactly */
    c = bk_parallel_config_default();
    c.max_bytes = (int)strlen("In the beginning, God created the heavens and the earth.");
    p = NULL;
    st = bk_parallel_parse(SRC, sizeof SRC - 1, TGT, sizeof TGT - 1, NULL, NULL, &c, &p);
    CHECK(st == BK_OK, "max_bytes equal to the longest line is accepted", "%s", bk_last_error());
    bk_parallel_free(p);

    CHECK(bk_parallel_count(NULL) == 0 && bk_parallel_get_info(NULL) == NULL, "NULL handle: count 0, info NULL", "%s",
          "");
    bk_parallel_free(NULL);
}

/* ---- refusals ---- */
static void expect_bad(const char *src, size_t sn, const char *tgt, size_t tn, const bk_parallel_config *c,
                       bk_status want, const char *msg, const char *what)
{
    char name[160];
    snprintf(name, sizeof name, "parse refuses %s", what);
    bk_parallel *p = (bk_parallel *)(uintptr_t)1; /* must stay untouched */
    bk_status st = bk_parallel_parse(src, sn, tgt, tn, "x.es", "x.en", c, &p);
    CHECK(st == want && has(bk_last_error(), msg) && p == (bk_parallel *)(uintptr_t)1, name, "%s: %s",
          bk_status_str(st), bk_last_error());
}

static void test_bad(void)
{
    static const struct {
        const char *src;
        size_t n; /* 0: strlen */
        const char *msg, *what;
    } bad[] = {
        {"ok\n\x80x\nok\n", 0, "x.es: line 2, byte 1: invalid UTF-8 (byte 0x80)", "a stray continuation byte"},
        {"ok\nok\nab\xc0\x80\n", 0, "x.es: line 3, byte 3: invalid UTF-8", "an overlong 2-byte NUL"},
        {"ok\nok\n\xe0\x80\xaf\n", 0, "line 3, byte 1: invalid UTF-8", "an overlong 3-byte form"},
        {"ok\nok\n\xf0\x80\x80\xaf\n", 0, "line 3, byte 1: invalid UTF-8", "an overlong 4-byte form"},
        {"ok\nok\n\xed\xa0\x80\n", 0, "invalid UTF-8 (byte 0xed)", "a surrogate"},
        {"ok\nok\n\xf4\x90\x80\x80\n", 0, "invalid UTF-8 (byte 0xf4)", "a code point above U+10FFFF"},
        {"ok\nok\n\xf5\x80\x80\x80\n", 0, "invalid UTF-8 (byte 0xf5)", "byte 0xF5"},
        {"ok\nok\nx\xe2\x82\n", 0, "line 3, byte 2: invalid UTF-8", "a sequence cut by the line end"},
        {"ok\nok\nx\xe2\x82", 0, "line 3, byte 2: invalid UTF-8", "a sequence cut by the end of the file"},
        {"\xef\xbb\xbfok\nok\nok\n", 0, "byte-order mark", "a byte-order mark"},
        {"ok\r\nok\nok\n", 0, "line 1, byte 3: carriage return", "CRLF line ends"},
        {"ok\nok\rok\nok\n", 0, "line 2, byte 3: carriage return", "a lone CR"},
        {"ok\no\0k\nok\n", 9, "line 2, byte 2: control character U+0000", "a NUL byte"},
        {"ok\nok\n\x01\n", 0, "control character U+0001", "U+0001"},
        {"ok\nok\na\x7f\n", 0, "control character U+007F", "DEL"},
        {"ok\nok\na\xc2\x85\n", 0, "control character U+0085", "U+0085 (next line)"},
        {"ok\nok\na\xe2\x80\xa8z\n", 0, "line 3, byte 2: line separator U+2028", "U+2028"},
        {"ok\nok\na\xe2\x80\xa9z\n", 0, "paragraph separator U+2029", "U+2029"},
        {"ok\n\nok\n", 0, "x.es: line 2 is empty", "an empty line"},
        {"ok\nok\nok\n\n", 0, "x.es: line 4 is empty", "a trailing empty line"},
        {"\nok\nok\n", 0, "x.es: line 1 is empty", "an empty first line"},
        {"ok\n \t \nok\n", 0, "x.es: line 2 is blank", "a line of spaces and tabs"},
        {"ok\nok\n", 0, "x.es has 2 lines, x.en has 3", "unequal line counts"},
        {"ok\nok\nok\nok\n", 0, "x.es has 4 lines, x.en has 3", "one line more"},
        {"", 0, "x.es: empty file", "an empty file"},
    };
    const char *tgt = "ok\nok\nok\n";
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t n = bad[i].n ? bad[i].n : strlen(bad[i].src);
        expect_bad(bad[i].src, n, tgt, strlen(tgt), NULL, BK_ERR_FORMAT, bad[i].msg, bad[i].what);
    }
    /* the target is validated too, and named */
    expect_bad(tgt, strlen(tgt), "ok\nok\nk\xff\n", 9, NULL, BK_ERR_FORMAT, "x.en: line 3, byte 2: invalid UTF-8",
               "bad UTF-8 in the target");
    expect_bad(tgt, strlen(tgt), "ok\n\nok\n", 7, NULL, BK_ERR_FORMAT, "x.en: line 2 is empty",
               "an empty line in the target");

    bk_parallel_config c = bk_parallel_config_default();
    c.max_bytes = 3;
    expect_bad("abc\nabcd\nab\n", 12, tgt, strlen(tgt), &c, BK_ERR_FORMAT,
               "x.es: line 2 is 4 bytes, longer than the limit 3", "a line over max_bytes");
    c.max_bytes = 4;
    expect_bad("ab\nab\n\xc3\xa9\xc3\xa9\xc3\xa9\n", 12, tgt, strlen(tgt), &c, BK_ERR_FORMAT,
               "line 3 is 6 bytes", "max_bytes counts bytes, not characters");
    c.max_bytes = -1;
    expect_bad(tgt, strlen(tgt), tgt, strlen(tgt), &c, BK_ERR_PARAM, "max_bytes -1", "max_bytes -1");
    c.max_bytes = BK_PARALLEL_MAX_LINE + 1;
    expect_bad(tgt, strlen(tgt), tgt, strlen(tgt), &c, BK_ERR_PARAM, "outside [1,", "max_bytes above the cap");
    c = bk_parallel_config_default();
    c.limit = -1;
    expect_bad(tgt, strlen(tgt), tgt, strlen(tgt), &c, BK_ERR_PARAM, "limit -1", "a negative limit");
    expect_bad(NULL, 3, tgt, strlen(tgt), NULL, BK_ERR_NULL, "NULL", "a NULL buffer");
    bk_parallel *p = NULL;
    CHECK(bk_parallel_parse(tgt, strlen(tgt), tgt, strlen(tgt), NULL, NULL, NULL, NULL) == BK_ERR_NULL,
          "parse refuses a NULL output", "%s", bk_last_error());
    CHECK(bk_parallel_parse(NULL, 0, tgt, strlen(tgt), NULL, NULL, NULL, &p) == BK_ERR_FORMAT &&
              has(bk_last_error(), "source: empty file") && p == NULL,
          "parse: NULL with size 0 is an empty file, named 'source'", "%s", bk_last_error());

    /* files: missing, a directory, one bad line named by its path */
    char sp[600], tp[600], dp[600];
    snprintf(sp, sizeof sp, "%s/bad.es", g_tmp);
    snprintf(tp, sizeof tp, "%s/bad.en", g_tmp);
    snprintf(dp, sizeof dp, "%s/nothing.en", g_tmp);
    write_file(sp, "uno\ndos\r\n", 9);
    write_file(tp, "one\ntwo\n", 8);
    bk_status st = bk_parallel_load(sp, tp, NULL, &p);
    CHECK(st == BK_ERR_FORMAT && has(bk_last_error(), sp) && has(bk_last_error(), "line 2, byte 4: carriage return") &&
              p == NULL,
          "load names the file and line of a CR", "%s", bk_last_error());
    st = bk_parallel_load(sp, dp, NULL, &p);
    CHECK(st == BK_ERR_IO && has(bk_last_error(), dp) && has(bk_last_error(), "cannot open"),
          "load: a missing file is BK_ERR_IO naming it", "%s", bk_last_error());
    st = bk_parallel_load(tp, g_tmp, NULL, &p);
    CHECK(st == BK_ERR_IO && has(bk_last_error(), "not a regular file"), "load: a directory is refused", "%s",
          bk_last_error());
    CHECK(bk_parallel_load(NULL, tp, NULL, &p) == BK_ERR_NULL, "load refuses NULL paths", "%s", bk_last_error());
}

/* ---- the stored corpus ---- */
static void test_open(void)
{
    bk_parallel *p = NULL;
    bk_status st = bk_parallel_open("iwslt", "train", g_tmp, NULL, &p);
    CHECK(st == BK_ERR_PARAM && has(bk_last_error(), "unknown corpus 'iwslt'"), "open: unknown corpus", "%s",
          bk_last_error());
    st = bk_parallel_open("bible", "dev", g_tmp, NULL, &p);
    CHECK(st == BK_ERR_PARAM && has(bk_last_error(), "unknown split 'dev'"), "open: unknown split", "%s",
          bk_last_error());
    CHECK(bk_parallel_open(NULL, "train", g_tmp, NULL, &p) == BK_ERR_NULL, "open: NULL name", "%s", bk_last_error());
    st = bk_parallel_open("bible", "test", g_tmp, NULL, &p);
    CHECK(st == BK_ERR_IO && has(bk_last_error(), "bible/test.es") && has(bk_last_error(), "scripts/data.sh bible") &&
              p == NULL,
          "open: a missing corpus names the file and the fix", "%s", bk_last_error());
    /* a corpus that parses but is not the known version */
    char d[600], f[700];
    snprintf(d, sizeof d, "%s/bible", g_tmp);
    mkdir(d, 0755);
    snprintf(f, sizeof f, "%s/test.es", d);
    write_file(f, "Hola.\n", 6);
    snprintf(f, sizeof f, "%s/test.en", d);
    write_file(f, "Hello.\n", 7);
    st = bk_parallel_open("bible", "test", g_tmp, NULL, &p);
    CHECK(st == BK_ERR_FORMAT && has(bk_last_error(), "test.es: not the known version (6 bytes") &&
              has(bk_last_error(), "sword-text-web 426.0-1") && has(bk_last_error(), "scripts/data.sh bible"),
          "open: another version names the packages and the fix", "%s", bk_last_error());
    /* the same files through the generic reader are fine */
    snprintf(f, sizeof f, "%s/test.es", d);
    char f2[700];
    snprintf(f2, sizeof f2, "%s/test.en", d);
    st = bk_parallel_load(f, f2, NULL, &p);
    CHECK(st == BK_OK && bk_parallel_count(p) == 1, "load reads them as any parallel pair", "%s", bk_last_error());
    bk_parallel_free(p);
}

static void test_real(void)
{
    const char *dir = getenv("BK_TEST_DATA");
    if (!dir || !*dir) dir = getenv("BK_DATA");
    if (!dir || !*dir) dir = "data";
    char probe[600];
    snprintf(probe, sizeof probe, "%s/bible/train.es", dir);
    if (access(probe, R_OK) != 0) {
        printf("# skip: %s not found (scripts/data.sh bible; BK_TEST_DATA or BK_DATA)\n", probe);
        return;
    }
    static const struct {
        const char *split;
        int64_t n;
    } want[] = {{"train", 27732}, {"valid", 921}, {"test", 1691}};
    for (size_t s = 0; s < 3; s++) {
        bk_parallel *p = NULL;
        char name[96];
        snprintf(name, sizeof name, "bible %s: opens, verified, %lld pairs", want[s].split, (long long)want[s].n);
        bk_status st = bk_parallel_open("bible", want[s].split, dir, NULL, &p);
        const bk_parallel_info *in = bk_parallel_get_info(p);
        CHECK(st == BK_OK && in && in->n == want[s].n, name, "%s", bk_last_error());
        if (st != BK_OK) continue;
        printf("# bible %-5s %6lld pairs, es %8lld bytes (longest %4d), en %8lld bytes (longest %4d)\n",
               want[s].split, (long long)in->n, (long long)in->src_bytes, (int)in->src_max, (long long)in->tgt_bytes,
               (int)in->tgt_max);
        bk_parallel_free(p);
    }
}

int main(void)
{
    TH.verbose = 1; /* one line per check, as before */
    if (!th_tmpdir(g_tmp, sizeof g_tmp, "test-parallel")) return 1;
    test_good();
    test_bad();
    test_open();
    test_real();
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) printf("# could not remove %s\n", g_tmp);
    return th_summary();
}
