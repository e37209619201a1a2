/* fuzz_labelled.c -- libFuzzer target for the labelled-text parser of the
 * tsv: and csv: readers (bki_parse_labelled, src/data/text.c; an internal
 * function: its header src/data/text.h). The first byte of the input picks
 * the options (bit 0: CSV, bit 1: a header, bits 2-3: the label column 1..4,
 * bits 4-5: the text column 1..4, moved on when equal); the rest is the
 * file. Invariants:
 *   - TSV: accepted exactly when an independent line-based reader accepts
 *     (lines split at '\n', a CR only before it, each line non-empty, every
 *     character shortest-form UTF-8 of a scalar value, no control but TAB,
 *     no byte-order mark, fields split at TAB, enough fields, a label that
 *     is not only spaces, a text that is not only spaces and tabs, at least
 *     one row), and then the rows are that reader's (label without its
 *     surrounding spaces, text as written, the line number);
 *   - CSV: on success every row's label and text are valid UTF-8 without
 *     controls but TAB and newline, labels non-empty without surrounding
 *     spaces, lines increasing, at most one row a line;
 *   - a refusal is BK_ERR_FORMAT (or BK_ERR_PARAM for bad columns) with a
 *     message that starts with the file's name, and leaves *out untouched. */
#include "birkhoff.h"
#include "../../src/data/text.h"
#include "fuzz_util.h"

/* text characters: valid UTF-8, no control but TAB (and '\n' when nl_ok) */
static int ref_text(const unsigned char *p, size_t n, int nl_ok)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = fz_utf8_decode(p + i, n - i, &cp);
        if (!k) return 0;
        if ((cp < 0x20 && cp != '\t' && !(nl_ok && cp == '\n')) || (cp >= 0x7F && cp <= 0x9F)) return 0;
        i += k;
    }
    return 1;
}

typedef struct {
    const unsigned char *lab, *txt;
    size_t ll, tl;
    int64_t line;
} ref_row;

/* the TSV reference: the row count (rows[] filled up to cap), or -1 */
static int64_t ref_tsv(const unsigned char *b, size_t n, int lc, int tc, int header, ref_row *rows, int64_t cap)
{
    if (n >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF) return -1;
    int64_t line = 0, nr = 0;
    size_t s = 0;
    while (s < n) {
        const unsigned char *nl = memchr(b + s, '\n', n - s);
        size_t e = nl ? (size_t)(nl - b) : n, next = nl ? e + 1 : n;
        if (e > s && b[e - 1] == '\r' && nl) e--;
        line++;
        if (e == s) return -1;
        if (!ref_text(b + s, e - s, 0)) return -1;
        if (!(header && line == 1)) {
            int f = 1;
            size_t fs = s;
            ref_row r = {0};
            for (size_t i = s; i <= e; i++)
                if (i == e || b[i] == '\t') {
                    if (f == lc) r.lab = b + fs, r.ll = i - fs;
                    if (f == tc) r.txt = b + fs, r.tl = i - fs;
                    f++;
                    fs = i + 1;
                }
            if (!r.lab || !r.txt) return -1;
            while (r.ll && r.lab[0] == ' ') r.lab++, r.ll--;
            while (r.ll && r.lab[r.ll - 1] == ' ') r.ll--;
            if (!r.ll) return -1;
            int blank = 1;
            for (size_t i = 0; i < r.tl; i++) blank = blank && (r.txt[i] == ' ' || r.txt[i] == '\t');
            if (blank) return -1;
            r.line = line;
            if (nr < cap) rows[nr] = r;
            nr++;
        }
        s = next;
    }
    return nr ? nr : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 1) return 0;
    const int opt = data[0], csv = opt & 1, header = (opt >> 1) & 1, lc = 1 + ((opt >> 2) & 3);
    int tc = 1 + ((opt >> 4) & 3);
    if (tc == lc) tc = tc % 4 + 1;
    const char *b = (const char *)data + 1;
    const size_t m = n - 1;
    bki_ltable t;
    memset(&t, 0x5A, sizeof t);
    bk_status st = bki_parse_labelled(b, m, "F", csv, lc, tc, header, &t);
    if (st != BK_OK) {
        FZ_CHECK(st == BK_ERR_FORMAT, "labelled: status %d", (int)st);
        FZ_CHECK(!strncmp(bk_last_error(), "F", 1), "labelled: the message does not name the file: %s",
                 bk_last_error());
        FZ_CHECK(t.n == (int64_t)0x5A5A5A5A5A5A5A5All, "labelled: failed but wrote *out");
    } else {
        int64_t prev = 0;
        for (int64_t i = 0; i < t.n; i++) {
            const char *l = t.buf + t.label[i], *x = t.buf + t.text[i];
            FZ_CHECK(*l && l[0] != ' ' && l[strlen(l) - 1] != ' ', "labelled: row %lld: label '%s'", (long long)i, l);
            FZ_CHECK(ref_text((const unsigned char *)l, strlen(l), csv) && ref_text((const unsigned char *)x, strlen(x), csv),
                     "labelled: row %lld: a field that is not text", (long long)i);
            FZ_CHECK(t.line[i] > prev, "labelled: row %lld: line %lld after %lld", (long long)i, (long long)t.line[i],
                     (long long)prev);
            prev = t.line[i];
        }
    }
    if (!csv) {
        enum { CAP = 64 };
        ref_row rows[CAP];
        const int64_t want = ref_tsv((const unsigned char *)b, m, lc, tc, header, rows, CAP);
        FZ_CHECK((st == BK_OK) == (want > 0), "labelled: TSV %s what the reference %s (%s)",
                 st == BK_OK ? "accepted" : "refused", want > 0 ? "accepts" : "refuses", st ? bk_last_error() : "");
        if (st == BK_OK) {
            FZ_CHECK(t.n == want, "labelled: %lld rows, the reference %lld", (long long)t.n, (long long)want);
            for (int64_t i = 0; i < t.n && i < CAP; i++) {
                const char *l = t.buf + t.label[i], *x = t.buf + t.text[i];
                FZ_CHECK(strlen(l) == rows[i].ll && !memcmp(l, rows[i].lab, rows[i].ll) && strlen(x) == rows[i].tl &&
                             !memcmp(x, rows[i].txt, rows[i].tl) && t.line[i] == rows[i].line,
                         "labelled: row %lld differs from the reference", (long long)i);
            }
        }
    }
    if (st == BK_OK) bki_ltable_free(&t);
    return 0;
}
