/* fuzz_mail.c -- libFuzzer target for data_mail_body (tools/data.c): the
 * input is an RFC 822 message. Invariants: the offset is <= n; when < n the
 * bytes before it end with "\n\n" or "\n\r\n"; and it is the end of the
 * FIRST such empty line (no earlier "\n\n" or "\n\r\n" ends inside the
 * header block), n when there is none. */
#include "data.h"
#include "fuzz_util.h"

/* the end of the first "\n\n" or "\n\r\n", or n */
static size_t ref_body(const uint8_t *m, size_t n)
{
    for (size_t e = 2; e <= n; e++) {
        if (m[e - 2] == '\n' && m[e - 1] == '\n') return e;
        if (e >= 3 && m[e - 3] == '\n' && m[e - 2] == '\r' && m[e - 1] == '\n') return e;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *m, size_t n)
{
    const size_t off = data_mail_body(m, n);
    FZ_CHECK(off <= n, "mail: body offset %zu beyond the %zu-byte message", off, n);
    if (off < n)
        FZ_CHECK((off >= 2 && m[off - 2] == '\n' && m[off - 1] == '\n') ||
                     (off >= 3 && m[off - 3] == '\n' && m[off - 2] == '\r' && m[off - 1] == '\n'),
                 "mail: body offset %zu does not follow an empty line", off);
    const size_t want = ref_body(m, n);
    FZ_CHECK(off == want, "mail: body offset %zu, the first empty line ends at %zu", off, want);
    return 0;
}
