/* text.c -- the one reader of text inputs (birkhoff/core.h, "Text files"):
 * run configurations, metrics files, the CLI's sentence files. Line by line
 * from a file or a descriptor (standard input, a pipe, a device), every
 * line, the whole input and the count of lines bounded, so that an input
 * that never ends (/dev/zero, `yes |`) stops with a message instead of
 * growing without bound, and a NUL byte is refused rather than cutting a
 * line short where C strings are used. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CHUNK = 1 << 16 };

struct bk_text_reader {
    int fd, own;            /* own: opened here, closed by bk_text_close      */
    char *name;             /* for messages                                    */
    bk_text_config c;
    char *buf;              /* bytes [lo, hi) not yet returned; one spare byte */
    size_t cap, lo, hi;
    size_t scan;            /* [lo, scan) holds no '\n' (and no NUL unless nul_ok) */
    int64_t line, bytes;    /* lines returned, bytes read                      */
    int eof;
    bk_status err;          /* a failure is final: every later call returns it */
};

bk_text_config bk_text_config_default(void)
{
    bk_text_config c;
    memset(&c, 0, sizeof c);
    c.max_line = BK_TEXT_MAX_LINE;
    c.max_bytes = BK_TEXT_MAX_BYTES;
    c.max_lines = BK_TEXT_MAX_LINES;
    return c;
}

static bk_status resolve(const bk_text_config *in, bk_text_config *c)
{
    *c = bk_text_config_default();
    if (!in) return BK_OK;
    if (in->max_line < 0 || in->max_bytes < 0 || in->max_lines < 0 || (in->nul_ok != 0 && in->nul_ok != 1))
        return bki_fail(BK_ERR_PARAM, "bk_text_open: max_line %lld, max_bytes %lld, max_lines %lld must be >= 0 "
                                      "(0: the default) and nul_ok 0 or 1 (it is %d)",
                        (long long)in->max_line, (long long)in->max_bytes, (long long)in->max_lines, in->nul_ok);
    if (in->max_line > ((int64_t)1 << 40))
        return bki_fail(BK_ERR_PARAM, "bk_text_open: max_line %lld above 2^40", (long long)in->max_line);
    if (in->max_line) c->max_line = in->max_line;
    if (in->max_bytes) c->max_bytes = in->max_bytes;
    if (in->max_lines) c->max_lines = in->max_lines;
    c->nul_ok = in->nul_ok;
    return BK_OK;
}

/* fd (owned or not) as a reader; closes an owned fd on failure */
static bk_status make(int fd, int own, const char *name, const bk_text_config *c, bk_text_reader **out)
{
    struct stat st;
    const int bad = fstat(fd, &st) != 0;
    if (bad || S_ISDIR(st.st_mode)) {
        bk_status s = bad ? bki_fail(BK_ERR_IO, "%s: cannot read (%s)", name, strerror(errno))
                          : bki_fail(BK_ERR_IO, "%s: is a directory, not a text file", name);
        if (own) close(fd);
        return s;
    }
    if (S_ISREG(st.st_mode) && (int64_t)st.st_size > c->max_bytes) {
        if (own) close(fd);
        return bki_fail(BK_ERR_FORMAT, "%s: %lld bytes, more than %lld bytes (the limit)", name,
                        (long long)st.st_size, (long long)c->max_bytes);
    }
    bk_text_reader *r = calloc(1, sizeof *r);
    const size_t nl = strlen(name) + 1;
    char *nm = r ? malloc(nl) : NULL;
    if (!nm) {
        free(r);
        if (own) close(fd);
        return bki_fail(BK_ERR_NOMEM, "%s: out of memory", name);
    }
    memcpy(nm, name, nl);
    r->fd = fd;
    r->own = own;
    r->name = nm;
    r->c = *c;
    *out = r;
    return BK_OK;
}

bk_status bk_text_open(const char *path, const bk_text_config *c, bk_text_reader **out)
{
    bki_clear_error();
    if (!path || !out) return bki_fail(BK_ERR_NULL, "bk_text_open: NULL argument");
    *out = NULL;
    bk_text_config cc;
    bk_status s = resolve(c, &cc);
    if (s != BK_OK) return s;
    int fd;
    do {
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return bki_fail(BK_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    return make(fd, 1, path, &cc, out);
}

bk_status bk_text_open_fd(int fd, const char *name, const bk_text_config *c, bk_text_reader **out)
{
    bki_clear_error();
    if (!name || !out) return bki_fail(BK_ERR_NULL, "bk_text_open_fd: NULL argument");
    *out = NULL;
    if (fd < 0) return bki_fail(BK_ERR_PARAM, "bk_text_open_fd: %s: descriptor %d is negative", name, fd);
    bk_text_config cc;
    bk_status s = resolve(c, &cc);
    if (s != BK_OK) return s;
    return make(fd, 0, name, &cc, out);
}

void bk_text_close(bk_text_reader *r)
{
    if (!r) return;
    if (r->own) close(r->fd);
    free(r->buf);
    free(r->name);
    free(r);
}

int64_t bk_text_lineno(const bk_text_reader *r) { return r ? r->line : 0; }

/* room for at least one more chunk after [lo, hi) (moved to the front);
 * the buffer grows to the longest line plus its '\n' and a NUL */
static bk_status make_room(bk_text_reader *r)
{
    if (r->lo > 0) {
        memmove(r->buf, r->buf + r->lo, r->hi - r->lo);
        r->hi -= r->lo;
        r->scan -= r->lo;
        r->lo = 0;
    }
    if (r->cap - r->hi > CHUNK / 4) return BK_OK;
    size_t want = r->cap ? 2 * r->cap : CHUNK + 1;
    const size_t most = (size_t)r->c.max_line + 2 > (size_t)CHUNK + 1 ? (size_t)r->c.max_line + 2 : (size_t)CHUNK + 1;
    if (want > most) want = most;
    if (want <= r->cap) return BK_OK; /* full: the line check ends it */
    char *nb = realloc(r->buf, want);
    if (!nb) return bki_fail(BK_ERR_NOMEM, "%s: out of memory", r->name);
    r->buf = nb;
    r->cap = want;
    return BK_OK;
}

static bk_status fail(bk_text_reader *r, bk_status s) { return r->err = s; }

/* reads once more: 0 more bytes at the end of the input */
static bk_status fill(bk_text_reader *r)
{
    bk_status s = make_room(r);
    if (s != BK_OK) return s;
    size_t room = r->cap - r->hi - 1; /* the spare byte for a last line's NUL */
    if (room == 0) /* (cannot happen: a full buffer holds a line over the limit) */
        return bki_fail(BK_ERR_FORMAT, "%s: line %lld is longer than %lld bytes (the limit)", r->name,
                        (long long)r->line + 1, (long long)r->c.max_line);
    if (room > CHUNK) room = CHUNK;
    ssize_t got;
    do {
        got = read(r->fd, r->buf + r->hi, room);
    } while (got < 0 && errno == EINTR);
    if (got < 0)
        return bki_fail(BK_ERR_IO, "%s: cannot read (%s)", r->name, strerror(errno));
    if (got == 0) {
        r->eof = 1;
        return BK_OK;
    }
    r->hi += (size_t)got;
    r->bytes += got;
    if (r->bytes > r->c.max_bytes)
        return bki_fail(BK_ERR_FORMAT, "%s: more than %lld bytes (the limit)", r->name, (long long)r->c.max_bytes);
    return BK_OK;
}

bk_status bk_text_next(bk_text_reader *r, char **line, size_t *len)
{
    if (!r || !line) return bki_fail(BK_ERR_NULL, "bk_text_next: NULL argument");
    *line = NULL;
    if (len) *len = 0;
    if (r->err) return r->err;
    const int64_t n = r->line + 1;
    for (;;) {
        /* the bytes not scanned yet, up to a '\n' */
        char *p = r->buf ? r->buf + r->scan : NULL;
        char *nl = p ? memchr(p, '\n', r->hi - r->scan) : NULL;
        const size_t upto = nl ? (size_t)(nl - r->buf) : r->hi;
        if (!r->c.nul_ok && p && memchr(p, 0, upto - r->scan))
            return fail(r, bki_fail(BK_ERR_FORMAT, "%s: line %lld holds a NUL byte (not text)", r->name, (long long)n));
        r->scan = upto;
        const size_t have = upto - r->lo;
        if (have > (size_t)r->c.max_line)
            return fail(r, bki_fail(BK_ERR_FORMAT, "%s: line %lld is longer than %lld bytes (the limit)", r->name,
                                    (long long)n, (long long)r->c.max_line));
        if (nl || (r->eof && have > 0)) {
            if (n > r->c.max_lines)
                return fail(r, bki_fail(BK_ERR_FORMAT, "%s: more than %lld lines (the limit)", r->name,
                                        (long long)r->c.max_lines));
            *line = r->buf + r->lo;
            r->buf[upto] = 0; /* the '\n', or the spare byte after the last line */
            if (len) *len = have;
            r->lo = r->scan = nl ? upto + 1 : upto;
            r->line = n;
            return BK_OK;
        }
        if (r->eof) return BK_OK; /* the end: *line NULL */
        bk_status s = fill(r);
        if (s != BK_OK) return fail(r, s);
    }
}
