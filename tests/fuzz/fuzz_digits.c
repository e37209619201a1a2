/* fuzz_digits.c -- libFuzzer target for bk_data_parse_digits (src/data/data.c):
 * the input is the UCI digits CSV. It is parsed with the reader's capacity
 * (4096 rows) and with a capacity of 2 into exactly sized buffers, and the
 * result is compared with an independent line-by-line reading:
 *   lines are separated by '\n' (a final '\n' ends the last line and does
 *   not start another); every line is a row, and an empty line (nothing,
 *   or a single '\r') anywhere, trailing ones included, is an error whose
 *   message names the line; a row is 65 comma-separated fields of 1 to 3
 *   decimal digits (the last may be followed by one '\r'); fields 1..64
 *   are in [0, 16], field 65 in [0, 9]; more rows than the capacity, or no
 *   row at all, is an error.
 * Invariants on success: rows in [1, cap], every pixel <= 16, label <= 9,
 * and rows, pixels and labels equal the reference's. On failure: the
 * reference fails too, and when its first error is an empty line, the
 * message says "line N is empty". */
#include "birkhoff/data.h"
#include "fuzz_util.h"

/* the reference: number of rows (or -1: invalid); fills pix/lab up to cap;
 * *blank = the line number when the first error is an empty line, else 0 */
static int64_t ref_parse(const char *buf, size_t n, int64_t cap, uint8_t *pix, int32_t *lab, int64_t *blank)
{
    int64_t rows = 0;
    size_t start = 0;
    *blank = 0;
    while (start < n) {
        const char *nl = memchr(buf + start, '\n', n - start);
        size_t end = nl ? (size_t)(nl - buf) : n;
        size_t len = end - start;
        const char *line = buf + start;
        start = end + 1;
        if (len > 0 && line[len - 1] == '\r') len--;
        if (len == 0) {
            *blank = rows + 1;
            return -1;
        }
        if (rows >= cap) return -1;
        size_t p = 0;
        for (int f = 0; f < 65; f++) {
            size_t q = p;
            int v = 0;
            while (q < len && line[q] != ',') {
                if (line[q] < '0' || line[q] > '9') return -1;
                v = v * 10 + (line[q] - '0');
                if (q - p >= 3) return -1;
                q++;
            }
            if (q == p || v > (f < 64 ? 16 : 9)) return -1;
            if (f < 64) {
                if (q >= len) return -1; /* a ',' must follow */
                pix[rows * 64 + f] = (uint8_t)v;
            } else {
                if (q != len) return -1; /* 66 fields */
                lab[rows] = v;
            }
            p = q + 1;
        }
        rows++;
    }
    return rows ? rows : -1;
}

/* buffers of exactly cap rows (so that ASan sees a write past them), made
 * once per capacity */
typedef struct {
    int64_t cap;
    uint8_t *pix, *rpix;
    int32_t *lab, *rlab;
} bufs;

static void one(const char *buf, size_t n, bufs *b)
{
    const int64_t cap = b->cap;
    if (!b->pix) {
        b->pix = malloc(64 * (size_t)cap);
        b->rpix = malloc(64 * (size_t)cap);
        b->lab = malloc(sizeof(int32_t) * (size_t)cap);
        b->rlab = malloc(sizeof(int32_t) * (size_t)cap);
        if (!b->pix || !b->rpix || !b->lab || !b->rlab) fz_fail("out of memory");
    }
    uint8_t *pix = b->pix, *rpix = b->rpix;
    int32_t *lab = b->lab, *rlab = b->rlab;
    /* a row takes at least 129 bytes: poison the rows this input can fill */
    int64_t can = (int64_t)(n / 129) + 1;
    if (can > cap) can = cap;
    memset(pix, 0xee, 64 * (size_t)can);
    for (int64_t i = 0; i < can; i++) lab[i] = -1;
    int64_t rows = -5;
    char err[256];
    err[0] = 0;
    const int ok = bk_data_parse_digits(buf, n, cap, pix, lab, &rows) == BK_OK;
    if (!ok) snprintf(err, sizeof err, "%s", bk_last_error());
    int64_t blank;
    const int64_t want = ref_parse(buf, n, cap, rpix, rlab, &blank);
    if (!ok) {
        fz_check_err(err, sizeof err, "digits");
        FZ_CHECK(rows == -5, "digits: failed but wrote *rows");
        FZ_CHECK(want < 0, "digits: rejected (%s) what the reference reads as %lld rows", err, (long long)want);
        if (blank) {
            char say[64];
            snprintf(say, sizeof say, "line %lld is empty", (long long)blank);
            FZ_CHECK(strstr(err, say) != NULL, "digits: the first error is that %s, the message says: %s", say, err);
        }
    } else {
        FZ_CHECK(rows >= 1 && rows <= cap, "digits: %lld rows with capacity %lld", (long long)rows, (long long)cap);
        FZ_CHECK(want == rows, "digits: %lld rows, the reference reads %lld", (long long)rows, (long long)want);
        for (int64_t r = 0; r < rows; r++) {
            for (int f = 0; f < 64; f++) {
                FZ_CHECK(pix[r * 64 + f] <= 16, "digits: row %lld pixel %d is %d", (long long)r, f, pix[r * 64 + f]);
                FZ_CHECK(pix[r * 64 + f] == rpix[r * 64 + f], "digits: row %lld pixel %d differs from the reference",
                         (long long)r, f);
            }
            FZ_CHECK(lab[r] >= 0 && lab[r] <= 9, "digits: row %lld label %d", (long long)r, lab[r]);
            FZ_CHECK(lab[r] == rlab[r], "digits: row %lld label differs from the reference", (long long)r);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    static bufs full = {4096, 0, 0, 0, 0}, two = {2, 0, 0, 0, 0};
    one((const char *)data, n, &full);
    one((const char *)data, n, &two);
    return 0;
}
