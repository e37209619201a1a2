/* status.c -- status strings, the thread-local last-error message, and the
 * escaping of text for a terminal (bk_escape: every message bki_fail keeps
 * goes through it). */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_msg[1024];

uint64_t bk_splitmix64(uint64_t *state) { return bki_mix64(state); }

const char *bk_version(void)
{
    return BK_STR(BK_VERSION_MAJOR) "." BK_STR(BK_VERSION_MINOR) "." BK_STR(BK_VERSION_PATCH);
}

const char *bk_status_str(bk_status s)
{
    switch (s) {
    case BK_OK: return "ok";
    case BK_ERR_NULL: return "null pointer";
    case BK_ERR_SHAPE: return "invalid shape";
    case BK_ERR_STRIDE: return "invalid or overlapping strides";
    case BK_ERR_LENGTH: return "valid length out of range";
    case BK_ERR_PARAM: return "parameter out of range";
    case BK_ERR_NONFINITE: return "non-finite input";
    case BK_ERR_NOMEM: return "out of memory";
    case BK_ERR_WORKSPACE: return "workspace too small";
    case BK_ERR_TAPE: return "invalid tape";
    case BK_ERR_IO: return "i/o error";
    case BK_ERR_FORMAT: return "malformed file";
    case BK_ERR_NUMERIC: return "numerical failure";
    case BK_ERR_UNSUPPORTED: return "unsupported";
    case BK_ERR_OVERFLOW: return "float32 overflow";
    }
    return "unknown status";
}

const char *bk_last_error(void) { return last_msg; }

void bki_clear_error(void) { last_msg[0] = '\0'; }

/* ---- escaping ------------------------------------------------------------
 * The length of the UTF-8 sequence at s (n bytes available): 1..4 when it is
 * a whole, valid one (*cp its code point), 0 when s[0] cannot start one or a
 * byte after it is wrong (overlong, surrogate, above U+10FFFF, a missing
 * continuation), -1 when the n bytes are a valid but unfinished start. */
int bki_utf8_seq(const unsigned char *s, size_t n, uint32_t *cp)
{
    const unsigned b = s[0];
    int len;
    unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        if (b == 0xE0) lo = 0xA0;      /* overlong */
        else if (b == 0xED) hi = 0x9F; /* surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        if (b == 0xF0) lo = 0x90;      /* overlong */
        else if (b == 0xF4) hi = 0x8F; /* above U+10FFFF */
    } else {
        return 0;
    }
    uint32_t c = b & (0x7Fu >> len);
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return -1;
        const unsigned x = s[i];
        if (x < (i == 1 ? lo : 0x80) || x > (i == 1 ? hi : 0xBF)) return 0;
        c = c << 6 | (x & 0x3F);
    }
    *cp = c;
    return len;
}

long bki_bad_utf8(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    const size_t n = strlen(s);
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        const int k = bki_utf8_seq(u + i, n - i, &cp);
        if (k <= 0) return (long)i;
        i += (size_t)k;
    }
    return -1;
}

/* C0, DEL, C1, and the bidirectional embeddings, overrides and isolates */
static int escaped_cp(uint32_t c, unsigned flags)
{
    if (c == '\n' || c == '\t') return !(flags & BK_ESCAPE_KEEP_NL);
    return c < 0x20 || (c >= 0x7F && c <= 0x9F) || (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069);
}

size_t bk_escape(char *out, size_t cap, const char *src, size_t n, unsigned flags)
{
    const unsigned char *s = (const unsigned char *)src;
    size_t len = 0, room = cap ? cap - 1 : 0, at = 0;
    int full = 0; /* out holds no more: later units only count */
    for (size_t i = 0; s && i < n;) {
        char unit[16];
        size_t k;
        uint32_t c = 0;
        const int m = bki_utf8_seq(s + i, n - i, &c);
        if (m <= 0) { /* not UTF-8: this byte alone */
            k = (size_t)snprintf(unit, sizeof unit, "\\x%02x", s[i]);
            i++;
        } else if (escaped_cp(c, flags)) {
            k = c == '\n'   ? (size_t)snprintf(unit, sizeof unit, "\\n")
                : c == '\r' ? (size_t)snprintf(unit, sizeof unit, "\\r")
                : c == '\t' ? (size_t)snprintf(unit, sizeof unit, "\\t")
                : c < 0x80  ? (size_t)snprintf(unit, sizeof unit, "\\x%02x", (unsigned)c)
                            : (size_t)snprintf(unit, sizeof unit, "\\u%04x", (unsigned)c);
            i += (size_t)m;
        } else {
            memcpy(unit, s + i, (size_t)m);
            k = (size_t)m;
            i += (size_t)m;
        }
        if (!full && at + k <= room) {
            memcpy(out + at, unit, k);
            at += k;
        } else {
            full = 1;
        }
        len += k;
    }
    if (cap) out[at] = '\0';
    return len;
}

size_t bk_escape_tail(const char *src, size_t n)
{
    const unsigned char *s = (const unsigned char *)src;
    for (size_t t = n < 3 ? n : 3; t > 0; t--) {
        uint32_t c;
        if (bki_utf8_seq(s + n - t, t, &c) == -1) return t;
    }
    return 0;
}

bk_status bki_fail(bk_status s, const char *fmt, ...)
{
    char raw[sizeof last_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    /* what a message echoes (a path, a key, a line of a file) cannot drive
     * the terminal it is printed on */
    bk_escape(last_msg, sizeof last_msg, raw, strlen(raw), 0);
    return s;
}
