/* fuzz_mail.c -- libFuzzer target for bk_data_mail_body (src/data/data.c): the
 * input is an RFC 5322 message, whose header section ends at the first
 * empty line; everything after that line is the body (further empty lines
 * included). Invariants: the offset is <= n; when < n the bytes before it
 * are an empty line, "\n" or "\r\n", that starts a line (at the message's
 * start or after a '\n'); and it is the end of the FIRST such line (no
 * earlier empty line in the header section), n when there is none. */
#include "birkhoff/data.h"
#include "fuzz_util.h"

/* 1 when an empty line ("\n" or "\r\n") ends at e (exclusive) */
static int empty_line_ends_at(const uint8_t *m, size_t e)
{
    if (e >= 1 && m[e - 1] == '\n' && (e == 1 || m[e - 2] == '\n')) return 1;
    return e >= 2 && m[e - 2] == '\r' && m[e - 1] == '\n' && (e == 2 || m[e - 3] == '\n');
}

/* the end of the first empty line, or n: walks the message line by line */
static size_t ref_body(const uint8_t *m, size_t n)
{
    size_t s = 0; /* start of the current line */
    while (s < n) {
        if (m[s] == '\n') return s + 1;
        if (m[s] == '\r' && s + 1 < n && m[s + 1] == '\n') return s + 2;
        const uint8_t *nl = memchr(m + s, '\n', n - s);
        if (!nl) return n;
        s = (size_t)(nl - m) + 1;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *m, size_t n)
{
    const size_t off = bk_data_mail_body(m, n);
    FZ_CHECK(off <= n, "mail: body offset %zu beyond the %zu-byte message", off, n);
    if (off < n) FZ_CHECK(empty_line_ends_at(m, off), "mail: body offset %zu does not follow an empty line", off);
    const size_t want = ref_body(m, n);
    FZ_CHECK(off == want, "mail: body offset %zu, the first empty line ends at %zu", off, want);
    return 0;
}
