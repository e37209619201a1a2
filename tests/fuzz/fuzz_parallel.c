/* fuzz_parallel.c -- libFuzzer target for bk_parallel_parse and
 * bk_parallel_load (src/data/parallel.c): the input is the source file, a
 * NUL byte, and the target file (no NUL: the same bytes on both sides; a
 * NUL can never be valid text, so nothing is lost). Each input is parsed
 * with the defaults and with max_bytes 8 and limit 2, and read once more
 * from files, and compared with an independent reading:
 *   lines are separated by '\n' (a final '\n' ends the last line and does
 *   not start another; an empty file has no lines); a line is refused when
 *   it is empty, only spaces and tabs, longer than max_bytes, or not a
 *   sequence of shortest-form UTF-8 encodings of scalar values (U+0000 ..
 *   U+10FFFF without the surrogates) other than the controls U+0000..U+001F
 *   but TAB, U+007F..U+009F, U+2028 and U+2029; a file starting with the
 *   encoding of U+FEFF is refused; the two files must have the same number
 *   of lines, at least one.
 * Invariants: accepted exactly when the reference accepts; then count =
 * min(lines, limit), every pair is the lines' bytes with their lengths, the
 * info's sums, maxima and FNV-1a checksums agree, and the file reader gives
 * the same pairs; on failure *out is untouched and the message is set, and
 * when the reference's first error is an empty line, it names the file and
 * the line. */
#include "birkhoff/data.h"
#include "fuzz_util.h"

/* -1 and *empty_line (0: the error is another) when invalid, else the line count */
static int64_t ref_lines(const unsigned char *b, size_t n, int max_bytes, int64_t *empty_line)
{
    *empty_line = 0;
    if (n == 0) return -1;
    if (n >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF) return -1;
    int64_t lines = 0;
    size_t start = 0;
    while (start < n) {
        const unsigned char *nl = memchr(b + start, '\n', n - start);
        size_t end = nl ? (size_t)(nl - b) : n;
        lines++;
        if (end == start) {
            *empty_line = lines;
            return -1;
        }
        int blank = 1;
        for (size_t i = start; i < end;) {
            uint32_t cp;
            size_t k = fz_utf8_decode(b + i, end - i, &cp);
            if (k == 0) return -1;
            if ((cp < 0x20 && cp != '\t') || (cp >= 0x7F && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029) return -1;
            if (cp != ' ' && cp != '\t') blank = 0;
            i += k;
        }
        if (blank || end - start > (size_t)max_bytes) return -1;
        start = end + 1;
    }
    return lines;
}

/* line i's start and length (i < lines) */
static const unsigned char *ref_line(const unsigned char *b, size_t n, int64_t i, size_t *len)
{
    size_t start = 0;
    for (int64_t k = 0; k < i; k++) start = (size_t)((const unsigned char *)memchr(b + start, '\n', n - start) - b) + 1;
    const unsigned char *nl = memchr(b + start, '\n', n - start);
    *len = (nl ? (size_t)(nl - b) : n) - start;
    return b + start;
}

static uint64_t ref_fnv(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void same_pairs(const bk_parallel *a, const bk_parallel *b)
{
    FZ_CHECK(bk_parallel_count(a) == bk_parallel_count(b), "parallel: load and parse count differently");
    for (int64_t i = 0; i < bk_parallel_count(a); i++) {
        bk_sentence_pair x, y;
        FZ_CHECK(bk_parallel_pair(a, i, &x) == BK_OK && bk_parallel_pair(b, i, &y) == BK_OK, "parallel: pair %lld",
                 (long long)i);
        FZ_CHECK(x.src_len == y.src_len && x.tgt_len == y.tgt_len && !memcmp(x.src, y.src, (size_t)x.src_len) &&
                     !memcmp(x.tgt, y.tgt, (size_t)x.tgt_len),
                 "parallel: load and parse differ at pair %lld", (long long)i);
    }
}

static void one(const unsigned char *s, size_t sn, const unsigned char *t, size_t tn, int max_bytes, int64_t limit,
                int from_files)
{
    bk_parallel_config c = bk_parallel_config_default();
    c.max_bytes = max_bytes;
    c.limit = limit;
    bk_parallel *p = (bk_parallel *)(uintptr_t)8;
    bk_status st = bk_parallel_parse((const char *)s, sn, (const char *)t, tn, "S", "T", &c, &p);
    char err[512];
    snprintf(err, sizeof err, "%s", st == BK_OK ? "" : bk_last_error());
    int64_t es, et;
    int64_t ls = ref_lines(s, sn, max_bytes, &es), lt = ls < 0 ? -1 : ref_lines(t, tn, max_bytes, &et);
    if (ls < 0) et = 0;
    int64_t want = ls >= 0 && lt >= 0 && ls == lt ? ls : -1;
    if (st != BK_OK) {
        fz_check_err(err, sizeof err, "parallel");
        FZ_CHECK(st == BK_ERR_FORMAT, "parallel: status %d for bad text (%s)", (int)st, err);
        FZ_CHECK(p == (bk_parallel *)(uintptr_t)8, "parallel: failed but wrote *out");
        FZ_CHECK(want < 0, "parallel: refused (%s) what the reference reads as %lld lines", err, (long long)want);
        if (ls < 0 && es) {
            char say[64];
            snprintf(say, sizeof say, "S: line %lld is empty", (long long)es);
            FZ_CHECK(strstr(err, say) != NULL, "parallel: the first error is that %s; the message: %s", say, err);
        } else if (ls >= 0 && lt < 0 && et) {
            char say[64];
            snprintf(say, sizeof say, "T: line %lld is empty", (long long)et);
            FZ_CHECK(strstr(err, say) != NULL, "parallel: the first error is that %s; the message: %s", say, err);
        }
        return;
    }
    FZ_CHECK(want >= 1, "parallel: accepted what the reference refuses (%lld, %lld lines)", (long long)ls,
             (long long)lt);
    const bk_parallel_info *in = bk_parallel_get_info(p);
    int64_t n = limit > 0 && limit < want ? limit : want;
    FZ_CHECK(in->lines == want && in->n == n && bk_parallel_count(p) == n, "parallel: %lld pairs of %lld lines, want %lld",
             (long long)in->n, (long long)in->lines, (long long)n);
    FZ_CHECK(in->src_fnv == ref_fnv(s, sn) && in->tgt_fnv == ref_fnv(t, tn), "parallel: checksums");
    int64_t sb = 0, tb = 0;
    int32_t sm = 0, tm = 0;
    for (int64_t i = 0; i < n; i++) {
        bk_sentence_pair x;
        FZ_CHECK(bk_parallel_pair(p, i, &x) == BK_OK, "parallel: pair %lld refused", (long long)i);
        size_t l1, l2;
        const unsigned char *a = ref_line(s, sn, i, &l1), *b = ref_line(t, tn, i, &l2);
        FZ_CHECK((size_t)x.src_len == l1 && (size_t)x.tgt_len == l2 && !memcmp(x.src, a, l1) &&
                     !memcmp(x.tgt, b, l2) && x.src[l1] == 0 && x.tgt[l2] == 0,
                 "parallel: pair %lld differs from the lines", (long long)i);
        sb += x.src_len;
        tb += x.tgt_len;
        if (x.src_len > sm) sm = x.src_len;
        if (x.tgt_len > tm) tm = x.tgt_len;
    }
    FZ_CHECK(in->src_bytes == sb && in->tgt_bytes == tb && in->src_max == sm && in->tgt_max == tm,
             "parallel: info sums or maxima");
    bk_sentence_pair x;
    FZ_CHECK(bk_parallel_pair(p, n, &x) == BK_ERR_PARAM, "parallel: pair n accepted");
    if (from_files) {
        const char *fs = fz_write(0, s, sn), *ft = fz_write(1, t, tn);
        bk_parallel *q = NULL;
        FZ_CHECK(bk_parallel_load(fs, ft, &c, &q) == BK_OK, "parallel: load refuses what parse accepts: %s",
                 bk_last_error());
        same_pairs(p, q);
        bk_parallel_free(q);
    }
    bk_parallel_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    const uint8_t *nul = memchr(data, 0, n);
    const uint8_t *s = data, *t = data;
    size_t sn = n, tn = n;
    if (nul) {
        sn = (size_t)(nul - data);
        t = nul + 1;
        tn = n - sn - 1;
    }
    one(s, sn, t, tn, BK_PARALLEL_MAX_LINE_DEFAULT, 0, 1);
    one(s, sn, t, tn, 8, 2, 0);
    return 0;
}
