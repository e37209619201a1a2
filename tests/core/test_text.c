/* test_text.c -- the one text reader (birkhoff/core.h, "Text files"): lines
 * split and terminated right, every limit (line, bytes, lines) refused with
 * a message naming the input and the limit, NUL bytes refused or kept,
 * directories refused, endless inputs (/dev/zero, a pipe that never ends)
 * stopped promptly. (Group "text": test_birkhoff text.) */
#include "birkhoff.h"
#include "../harness.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int has(const char *msg, const char *part) { return msg && strstr(msg, part) != NULL; }

static void put(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(p, 1, n, f);
    fclose(f);
}

/* every line of path under c joined by '|' into out; the last status */
static bk_status lines_of(const char *path, const bk_text_config *c, char *out, size_t cap, int64_t *n)
{
    bk_text_reader *r = NULL;
    out[0] = 0;
    *n = 0;
    bk_status st = bk_text_open(path, c, &r);
    char *line;
    size_t len;
    while (st == BK_OK && (st = bk_text_next(r, &line, &len)) == BK_OK && line) {
        size_t u = strlen(out);
        snprintf(out + u, cap - u, "%s%.*s", *n ? "|" : "", (int)len, line);
        if (strlen(line) != len) snprintf(out + strlen(out), cap - strlen(out), "<NUL>");
        (*n)++;
    }
    if (r && bk_text_lineno(r) != *n) st = BK_ERR_NUMERIC;
    bk_text_close(r);
    return st;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* reads fd to the end or the first failure; the status and the message */
static bk_status drain(bk_text_reader *r, int64_t *lines)
{
    char *line;
    bk_status st;
    *lines = 0;
    while ((st = bk_text_next(r, &line, NULL)) == BK_OK && line) (*lines)++;
    return st;
}

/* a child writing "y\n" forever into a pipe (`yes |`); its pid */
static pid_t yes_pipe(int *rfd)
{
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        static char buf[1 << 16];
        for (size_t i = 0; i < sizeof buf; i += 2) buf[i] = 'y', buf[i + 1] = '\n';
        for (;;)
            if (write(p[1], buf, sizeof buf) < 0) _exit(0);
    }
    close(p[1]);
    *rfd = p[0];
    return pid;
}

void test_text(void)
{
    if (TH.filter && !strstr("text", TH.filter)) return;
    char dir[] = "/tmp/bk_test_text_XXXXXX";
    if (!mkdtemp(dir)) {
        th_check(0, "text: temporary directory", "%s", "mkdtemp failed");
        return;
    }
    char p[200], got[512];
    int64_t n;
    snprintf(p, sizeof p, "%s/a.txt", dir);

    /* lines: '\n' removed, '\r' kept, a last line without '\n', empty lines */
    put(p, "one\n\ntwo\r\nthree", 15);
    bk_status st = lines_of(p, NULL, got, sizeof got, &n);
    th_check(st == BK_OK && n == 4 && !strcmp(got, "one||two\r|three"), "text: lines, CR kept, last line without LF",
             "%s %lld '%s' %s", bk_status_str(st), (long long)n, got, bk_last_error());
    put(p, "", 0);
    st = lines_of(p, NULL, got, sizeof got, &n);
    th_check(st == BK_OK && n == 0, "text: an empty file has no lines", "%s %lld", bk_status_str(st), (long long)n);
    put(p, "\n", 1);
    st = lines_of(p, NULL, got, sizeof got, &n);
    th_check(st == BK_OK && n == 1 && !got[0], "text: one empty line", "%lld", (long long)n);

    /* the line limit: exactly max_line bytes pass, one more is refused */
    bk_text_config c = bk_text_config_default();
    th_check(c.max_line == BK_TEXT_MAX_LINE && c.max_bytes == BK_TEXT_MAX_BYTES && c.max_lines == BK_TEXT_MAX_LINES &&
                 c.nul_ok == 0 && BK_TEXT_MAX_LINE == 1048576,
             "text: the documented defaults (1 MiB lines, 1 GiB, 2^24 lines)", "%lld", (long long)c.max_line);
    c.max_line = 4;
    put(p, "abcd\nab\nabcd", 12);
    st = lines_of(p, &c, got, sizeof got, &n);
    th_check(st == BK_OK && n == 3 && !strcmp(got, "abcd|ab|abcd"), "text: lines of exactly max_line bytes",
             "%s '%s' %s", bk_status_str(st), got, bk_last_error());
    put(p, "abcd\nabcde\n", 11);
    st = lines_of(p, &c, got, sizeof got, &n);
    char want[300];
    snprintf(want, sizeof want, "%s: line 2 is longer than 4 bytes (the limit)", p);
    th_check(st == BK_ERR_FORMAT && n == 1 && has(bk_last_error(), want), "text: a line over max_line is refused",
             "%s %s", bk_status_str(st), bk_last_error());
    put(p, "abcdefgh", 8); /* the last line, without '\n' */
    st = lines_of(p, &c, got, sizeof got, &n);
    th_check(st == BK_ERR_FORMAT && has(bk_last_error(), "line 1 is longer than 4 bytes"),
             "text: a last line over max_line is refused", "%s", bk_last_error());
    /* a line longer than the read chunk (64 KiB) with the default limit */
    {
        const size_t L = 300000;
        char *big = malloc(L + 3);
        memset(big, 'x', L);
        memcpy(big + L, "\nz", 2);
        put(p, big, L + 2);
        bk_text_reader *r = NULL;
        char *line;
        size_t len = 0, len2 = 0;
        st = bk_text_open(p, NULL, &r);
        if (st == BK_OK) st = bk_text_next(r, &line, &len);
        int ok1 = st == BK_OK && line && len == L && line[0] == 'x' && line[L - 1] == 'x' && line[L] == 0;
        if (st == BK_OK) st = bk_text_next(r, &line, &len2);
        int ok2 = st == BK_OK && line && len2 == 1 && !strcmp(line, "z");
        if (st == BK_OK) st = bk_text_next(r, &line, NULL);
        th_check(ok1 && ok2 && st == BK_OK && !line, "text: a 300 kB line across reads, then the last line", "%s",
                 bk_last_error());
        bk_text_close(r);
        free(big);
    }

    /* the file and line-count limits */
    c = bk_text_config_default();
    c.max_bytes = 10;
    put(p, "0123456789", 10);
    st = lines_of(p, &c, got, sizeof got, &n);
    th_check(st == BK_OK && n == 1, "text: a file of exactly max_bytes", "%s", bk_last_error());
    put(p, "0123456789\n", 11);
    st = lines_of(p, &c, got, sizeof got, &n);
    snprintf(want, sizeof want, "%s: 11 bytes, more than 10 bytes (the limit)", p);
    th_check(st == BK_ERR_FORMAT && has(bk_last_error(), want), "text: a regular file over max_bytes refused at open",
             "%s", bk_last_error());
    c = bk_text_config_default();
    c.max_lines = 3;
    put(p, "a\nb\nc\n", 6);
    st = lines_of(p, &c, got, sizeof got, &n);
    th_check(st == BK_OK && n == 3, "text: exactly max_lines lines", "%s", bk_last_error());
    put(p, "a\nb\nc\nd", 7);
    st = lines_of(p, &c, got, sizeof got, &n);
    th_check(st == BK_ERR_FORMAT && n == 3 && has(bk_last_error(), "more than 3 lines (the limit)"),
             "text: a line over max_lines refused", "%s", bk_last_error());
    c.max_lines = -1;
    bk_text_reader *r = NULL;
    st = bk_text_open(p, &c, &r);
    th_check(st == BK_ERR_PARAM && !r, "text: a negative limit is refused", "%s", bk_last_error());

    /* NUL bytes: refused by default (naming the line), kept with nul_ok */
    put(p, "ok\na\0b\n", 7);
    st = lines_of(p, NULL, got, sizeof got, &n);
    snprintf(want, sizeof want, "%s: line 2 holds a NUL byte", p);
    th_check(st == BK_ERR_FORMAT && n == 1 && has(bk_last_error(), want), "text: a NUL byte is refused", "%s %s",
             bk_status_str(st), bk_last_error());
    c = bk_text_config_default();
    c.nul_ok = 1;
    st = lines_of(p, &c, got, sizeof got, &n);
    th_check(st == BK_OK && n == 2 && !strcmp(got, "ok|a<NUL>"), "text: nul_ok keeps it (len counts past it)",
             "%s '%s'", bk_status_str(st), got);
    /* a failure is final */
    st = bk_text_open(p, NULL, &r);
    char *line;
    if (st == BK_OK) {
        bk_text_next(r, &line, NULL);
        bk_status a = bk_text_next(r, &line, NULL), b = bk_text_next(r, &line, NULL);
        th_check(a == BK_ERR_FORMAT && b == BK_ERR_FORMAT && !line, "text: a failure is final", "%d %d", a, b);
        bk_text_close(r);
    }

    /* not a text file: a directory, a missing file */
    st = bk_text_open(dir, NULL, &r);
    th_check(st == BK_ERR_IO && !r && has(bk_last_error(), "is a directory"), "text: a directory is refused at open",
             "%s", bk_last_error());
    snprintf(p, sizeof p, "%s/none", dir);
    st = bk_text_open(p, NULL, &r);
    th_check(st == BK_ERR_IO && !r && has(bk_last_error(), "cannot open"), "text: a missing file", "%s",
             bk_last_error());

    /* endless inputs end promptly: /dev/zero (NUL, or over max_line with
     * nul_ok), a pipe fed "y\n" forever (over max_lines) */
    double t0 = now();
    st = bk_text_open("/dev/zero", NULL, &r);
    if (st == BK_OK) st = drain(r, &n);
    bk_text_close(r);
    th_check(st == BK_ERR_FORMAT && has(bk_last_error(), "/dev/zero: line 1 holds a NUL byte") && now() - t0 < 5,
             "text: /dev/zero stops at its first NUL byte", "%s", bk_last_error());
    c = bk_text_config_default();
    c.nul_ok = 1;
    t0 = now();
    st = bk_text_open("/dev/zero", &c, &r);
    if (st == BK_OK) st = drain(r, &n);
    bk_text_close(r);
    th_check(st == BK_ERR_FORMAT && has(bk_last_error(), "/dev/zero: line 1 is longer than 1048576 bytes (the limit)") &&
                 now() - t0 < 5,
             "text: /dev/zero with nul_ok stops at the line limit", "%s", bk_last_error());
    int fd = -1;
    pid_t pid = yes_pipe(&fd);
    if (pid > 0) {
        c = bk_text_config_default();
        c.max_lines = 100000;
        t0 = now();
        st = bk_text_open_fd(fd, "-", &c, &r);
        if (st == BK_OK) st = drain(r, &n);
        bk_text_close(r);
        int still_open = fcntl(fd, F_GETFD) != -1; /* not closed by bk_text_close */
        close(fd);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        th_check(st == BK_ERR_FORMAT && n == 100000 && has(bk_last_error(), "-: more than 100000 lines (the limit)") &&
                     still_open && now() - t0 < 5,
                 "text: `yes |` on a descriptor stops at the line-count limit; the descriptor stays open", "%s %lld",
                 bk_last_error(), (long long)n);
        /* the byte limit on a stream */
        pid = yes_pipe(&fd);
        c = bk_text_config_default();
        c.max_bytes = 1000;
        st = bk_text_open_fd(fd, "pipe", &c, &r);
        if (st == BK_OK) st = drain(r, &n);
        bk_text_close(r);
        close(fd);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        th_check(st == BK_ERR_FORMAT && has(bk_last_error(), "pipe: more than 1000 bytes (the limit)") && n <= 500,
                 "text: a stream over max_bytes stops", "%s %lld", bk_last_error(), (long long)n);
    }
    th_check(bk_text_open(NULL, NULL, &r) == BK_ERR_NULL && bk_text_next(NULL, &line, NULL) == BK_ERR_NULL &&
                 bk_text_open_fd(-1, "x", NULL, &r) == BK_ERR_PARAM && bk_text_lineno(NULL) == 0,
             "text: NULL and bad arguments", "%s", bk_last_error());
    bk_text_close(NULL);
    snprintf(p, sizeof p, "%s/a.txt", dir);
    remove(p);
    rmdir(dir);
}
