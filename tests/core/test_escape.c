/* test_escape.c -- bk_escape and bk_escape_tail (birkhoff/core.h): control
 * characters, ANSI escapes and invalid UTF-8 escaped, valid UTF-8 kept,
 * truncation at a unit's end, idempotence, the pieces of a stream; and
 * every library message (bki_fail) escaped, so bk_last_error() echoes no raw
 * byte of what it names. Issue 41. */
#include "../harness.h"
#include "birkhoff.h"

#include <stdlib.h>
#include <string.h>

static void expect(const char *in, size_t n, unsigned flags, const char *want, const char *name)
{
    char out[256];
    const size_t len = bk_escape(out, sizeof out, in, n, flags);
    th_check(len == strlen(want) && !strcmp(out, want), name, "got '%s' (%zu), want '%s'", out, len, want);
}

static void test_escape_cases(void)
{
    expect("plain ascii", 11, 0, "plain ascii", "escape: plain ASCII kept");
    expect("a\x1b[31mred\x1b[0m", 13, 0, "a\\x1b[31mred\\x1b[0m", "escape: ANSI escapes as \\x1b");
    expect("over\rwrite", 10, 0, "over\\rwrite", "escape: carriage return as \\r");
    expect("l1\nl2\tx", 7, 0, "l1\\nl2\\tx", "escape: newline and tab escaped by default");
    expect("l1\nl2\tx", 7, BK_ESCAPE_KEEP_NL, "l1\nl2\tx", "escape: BK_ESCAPE_KEEP_NL keeps newline and tab");
    expect("bell\a del\x7f", 10, BK_ESCAPE_KEEP_NL, "bell\\x07 del\\x7f", "escape: BEL and DEL");
    expect("nul\0x", 5, 0, "nul\\x00x", "escape: a NUL byte inside the text");
    expect("bad \xff\xfe end", 10, 0, "bad \\xff\\xfe end", "escape: invalid bytes 0xFF 0xFE");
    expect("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14, 0, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
           "escape: valid 2-, 3- and 4-byte UTF-8 kept");
    expect("\xc0\xaf", 2, 0, "\\xc0\\xaf", "escape: overlong encoding of '/' refused");
    expect("\xed\xa0\x80", 3, 0, "\\xed\\xa0\\x80", "escape: surrogate refused");
    expect("\xf4\x90\x80\x80", 4, 0, "\\xf4\\x90\\x80\\x80", "escape: above U+10FFFF refused");
    expect("cut \xe2\x82", 6, 0, "cut \\xe2\\x82", "escape: a sequence cut short");
    expect("\x80stray", 6, 0, "\\x80stray", "escape: a stray continuation byte");
    expect("c1 \xc2\x9b" "31m", 8, 0, "c1 \\u009b31m", "escape: C1 CSI (U+009B) as \\u009b");
    expect("rlo \xe2\x80\xae" "txt", 10, 0, "rlo \\u202etxt", "escape: bidi override U+202E as \\u202e");
    expect("back\\slash", 10, 0, "back\\slash", "escape: a backslash is kept (idempotent)");
    /* idempotent: escaping escaped text changes nothing */
    {
        const char *raw = "x\x1b]0;title\x07\r\n\xff\xc2\x85";
        char once[128], twice[128];
        bk_escape(once, sizeof once, raw, strlen(raw), 0);
        bk_escape(twice, sizeof twice, once, strlen(once), 0);
        th_check(!strcmp(once, twice), "escape: idempotent", "'%s' then '%s'", once, twice);
    }
    /* truncation: snprintf's return value, never inside an escape or a
     * UTF-8 sequence */
    {
        char out[8];
        size_t len = bk_escape(out, sizeof out, "ab\x1b" "cdef", 7, 0);
        th_check(len == 10 && !strcmp(out, "ab\\x1bc"), "escape: cut after a whole escape", "'%s' %zu", out, len);
        len = bk_escape(out, 5, "ab\x1b" "cd", 5, 0);
        th_check(len == 8 && !strcmp(out, "ab"), "escape: an escape that does not fit is left out whole", "'%s' %zu",
                 out, len);
        len = bk_escape(out, 4, "a\xe2\x82\xac", 4, 0);
        th_check(len == 4 && !strcmp(out, "a"), "escape: a UTF-8 character that does not fit is left out whole",
                 "'%s' %zu", out, len);
        th_check(bk_escape(NULL, 0, "\x1b", 1, 0) == 4, "escape: cap 0 measures", "%s", "");
        th_check(bk_escape(out, sizeof out, NULL, 0, 0) == 0 && out[0] == 0, "escape: empty text", "%s", "");
    }
    /* a stream in pieces: the tail of an unfinished sequence waits */
    th_check(bk_escape_tail("ab", 2) == 0, "escape_tail: ASCII", "%s", "");
    th_check(bk_escape_tail("a\xe2\x82", 3) == 2, "escape_tail: 2 bytes of a 3-byte sequence", "%s", "");
    th_check(bk_escape_tail("a\xf0\x9f\x98", 4) == 3, "escape_tail: 3 bytes of a 4-byte sequence", "%s", "");
    th_check(bk_escape_tail("a\xe2\x82\xac", 4) == 0, "escape_tail: a finished sequence", "%s", "");
    th_check(bk_escape_tail("a\xff", 2) == 0, "escape_tail: an invalid byte is not held", "%s", "");
    th_check(bk_escape_tail("a\xe0\x80", 3) == 0, "escape_tail: an overlong start is not held", "%s", "");
}

/* every library message: the path named by a failing call comes back
 * escaped */
static void test_escape_messages(void)
{
    bk_npy a;
    const char *path = "/nonexistent-\x1b[2J\r\xff-dir/x.npy";
    bk_status s = bk_npy_read(path, &a);
    const char *e = bk_last_error();
    int raw = 0;
    for (const unsigned char *p = (const unsigned char *)e; *p; p++) raw |= *p < 0x20 || *p == 0x7f || *p == 0xff;
    th_check(s != BK_OK && !raw && strstr(e, "\\x1b[2J\\r\\xff-dir"), "bk_last_error: a path's control bytes escaped",
             "%s", e);
    /* an operator key set by name (the registry's setter echoes it) */
    const bk_op *op = bk_op_find("sinkhorn");
    bk_sinkhorn_config p = bk_sinkhorn_config_default();
    s = bk_op_config_set(op, &p, "it\x1b[5mers", "3");
    th_check(s == BK_ERR_PARAM && strstr(bk_last_error(), "it\\x1b[5mers") && !strchr(bk_last_error(), 0x1b),
             "bk_last_error: a key's escape sequence escaped", "%s", bk_last_error());
    /* a long message keeps valid UTF-8 and is cut cleanly */
    char big[3000];
    for (int i = 0; i < 999; i++) memcpy(big + 3 * i, "\xe2\x82\xac", 3);
    big[2997] = 0;
    s = bk_op_config_set(op, &p, big, "3");
    const size_t n = strlen(bk_last_error());
    char again[1100];
    bk_escape(again, sizeof again, bk_last_error(), n, 0);
    th_check(s == BK_ERR_PARAM && n < 1024 && !strcmp(again, bk_last_error()),
             "bk_last_error: a long message is cut at a character's end", "%zu bytes", n);
}

void test_escape(void)
{
    test_escape_cases();
    test_escape_messages();
}
