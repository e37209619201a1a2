/* outfile.c -- every file the library and the CLI write goes through here
 * (docs/ARCHITECTURE.md, "Files"): a set of outputs staged in temporary files
 * created exclusively beside their targets and renamed onto them together
 * (all or none), devices and FIFOs written into instead of replaced, a
 * temporary file never reached through a symlink, the leftovers of a killed
 * writer removed by the next writer of the same file, and the run
 * directory's append-only logs opened without following symlinks. */
#define _GNU_SOURCE
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Temporary names: ".BASE.bk-PID-RANDOM.tmp" (staged content) and
 * ".BASE.bk-PID-RANDOM.old" (a link to the replaced file while a set is
 * committed), BASE cut to TMP_BASE bytes so that the name fits NAME_MAX. */
#define TMP_BASE 160
#define TAG ".bk-"

typedef struct {
    char *path;      /* where the content goes (a followed symlink resolved) */
    char *dir;       /* its directory                                       */
    char *tmp;       /* the staged file's name once it has one, else NULL   */
    char *old;       /* the backup link during commit, else NULL            */
    int fd;          /* the staged file (named or O_TMPFILE); -1 when closed */
    int anon;        /* fd is an O_TMPFILE with no name yet                 */
    int done;        /* renamed onto path by commit                         */
    int existed;     /* path held a file before the rename                  */
    unsigned flags;
} entry;

struct bk_outset {
    entry *e;
    int n, cap;
};

static const char *base_of(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* the directory part of path ("." for a bare name, "/" for "/x") */
static char *dir_of(const char *path)
{
    const char *s = strrchr(path, '/');
    if (!s) return strdup(".");
    size_t n = s == path ? 1 : (size_t)(s - path);
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = 0;
    return d;
}

static uint64_t random_word(void)
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r) return r;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 17) ^ (uintptr_t)&r;
    return bki_mix64(&s);
}

/* a fresh temporary name beside path with the suffix ("tmp" or "old") */
static char *temp_name(const entry *e, const char *suffix)
{
    const char *b = base_of(e->path);
    int bl = (int)strlen(b) < TMP_BASE ? (int)strlen(b) : TMP_BASE;
    size_t cap = strlen(e->dir) + (size_t)bl + 80;
    char *t = malloc(cap);
    if (t)
        snprintf(t, cap, "%s/.%.*s" TAG "%ld-%016llx.%s", e->dir, bl, b, (long)getpid(),
                 (unsigned long long)random_word(), suffix);
    return t;
}

/* Is name a temporary of ours (of the file base, or of any file when base is
 * NULL) left by a process that no longer exists? */
static int stale(const char *name, const char *base)
{
    if (name[0] != '.') return 0;
    const char *tag = strstr(name + 1, TAG);
    if (!tag) return 0;
    if (base) {
        size_t bl = strlen(base) < TMP_BASE ? strlen(base) : TMP_BASE;
        if ((size_t)(tag - (name + 1)) != bl || memcmp(name + 1, base, bl) != 0) return 0;
    }
    const char *p = tag + strlen(TAG);
    char *end;
    long pid = strtol(p, &end, 10);
    if (end == p || *end != '-' || pid <= 0 || pid > INT_MAX) return 0;
    size_t len = strlen(end);
    if (len != 1 + 16 + 4 || (strcmp(end + 17, ".tmp") != 0 && strcmp(end + 17, ".old") != 0)) return 0;
    if (pid == (long)getpid()) return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

int bki_clean_stale(const char *dir, const char *base)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (stale(de->d_name, base) && unlinkat(dirfd(d), de->d_name, 0) == 0) removed++;
    closedir(d);
    return removed;
}

static bk_status write_parts(int fd, const char *path, int nparts, const void *const *parts, const size_t *sizes)
{
    for (int i = 0; i < nparts; i++) {
        const char *p = parts[i];
        size_t left = sizes[i];
        while (left > 0) {
            ssize_t w = write(fd, p, left > (1u << 30) ? (1u << 30) : left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return bki_fail(BK_ERR_IO, "cannot write %s (%s)", path, w < 0 ? strerror(errno) : "no progress");
            p += w;
            left -= (size_t)w;
        }
    }
    return BK_OK;
}

/* The process's standard output or error when path names the same file
 * (/dev/stdout, /proc/self/fd/1, or the file stdout is redirected to): 1 or
 * 2, else -1. Writing through the open descriptor keeps its offset, so the
 * output lands where the rest of the process's output goes. */
static int std_stream(const struct stat *st)
{
    for (int fd = 1; fd <= 2; fd++) {
        struct stat o;
        if (fstat(fd, &o) == 0 && o.st_dev == st->st_dev && o.st_ino == st->st_ino) return fd;
    }
    return -1;
}

/* A device, FIFO or terminal named as an output, or the process's own
 * standard output or error: written into, never replaced. */
static bk_status write_direct(const char *path, int nparts, const void *const *parts, const size_t *sizes)
{
    struct stat pst;
    int sfd = stat(path, &pst) == 0 ? std_stream(&pst) : -1;
    if (sfd > 0) {
        fflush(sfd == 1 ? stdout : stderr);
        return write_parts(sfd, path, nparts, parts, sizes);
    }
    int fd;
    do fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) return bki_fail(BK_ERR_IO, "cannot open %s (%s)", path, strerror(errno));
    struct stat st;
    bk_status s = BK_OK;
    if (fstat(fd, &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))
        s = bki_fail(BK_ERR_IO, "%s changed while it was opened", path);
    if (!s) s = write_parts(fd, path, nparts, parts, sizes);
    if (close(fd) != 0 && !s && errno != EINTR) s = bki_fail(BK_ERR_IO, "cannot write %s (%s)", path, strerror(errno));
    return s;
}

/* Where the content of `path` goes: a regular file or nothing (*direct 0;
 * a symlink followed unless BK_OUT_NOFOLLOW), or a device/FIFO (*direct 1). */
static bk_status resolve(const char *path, unsigned flags, char **out, int *direct)
{
    struct stat ls, st;
    *direct = 0;
    *out = NULL;
    if (!path[0]) return bki_fail(BK_ERR_IO, "an output path is empty");
    if (path[strlen(path) - 1] == '/') return bki_fail(BK_ERR_IO, "%s: an output path names a directory", path);
    if (lstat(path, &ls) != 0) {
        if (errno != ENOENT) return bki_fail(BK_ERR_IO, "cannot write %s (%s)", path, strerror(errno));
        *out = strdup(path);
        return *out ? BK_OK : bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    if (S_ISLNK(ls.st_mode) && (flags & BK_OUT_NOFOLLOW)) { /* the link itself is replaced */
        *out = strdup(path);
        return *out ? BK_OK : bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    if (stat(path, &st) != 0)
        return bki_fail(BK_ERR_IO, "cannot write %s (%s)", path,
                        errno == ENOENT ? "a dangling symbolic link" : strerror(errno));
    if (S_ISDIR(st.st_mode)) return bki_fail(BK_ERR_IO, "cannot write %s (a directory)", path);
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISBLK(st.st_mode) ||
        (S_ISLNK(ls.st_mode) && std_stream(&st) > 0)) {
        if (flags & BK_OUT_NOFOLLOW)
            return bki_fail(BK_ERR_IO, "cannot write %s (not a regular file)", path);
        *direct = 1;
        *out = strdup(path);
        return *out ? BK_OK : bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    if (!S_ISREG(st.st_mode)) return bki_fail(BK_ERR_IO, "cannot write %s (not a regular file)", path);
    *out = S_ISLNK(ls.st_mode) ? realpath(path, NULL) : strdup(path);
    return *out ? BK_OK : bki_fail(BK_ERR_IO, "cannot write %s (%s)", path, strerror(errno));
}

/* The staged file of e: an unnamed O_TMPFILE in the target's directory where
 * the file system has them (nothing is left if the process is killed), else a
 * named one created exclusively, never through a symlink. Mode: the replaced
 * file's, else 0666 less the umask (what fopen would give). */
static bk_status stage_open(entry *e, const char *shown)
{
    struct stat st;
    int keep = stat(e->path, &st) == 0 && S_ISREG(st.st_mode);
    int fd = -1;
#ifdef O_TMPFILE
    if (access("/proc/self/fd", X_OK) == 0) {
        fd = open(e->dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
        e->anon = fd >= 0;
    }
#endif
    for (int tries = 0; fd < 0 && tries < 64; tries++) {
        free(e->tmp);
        if (!(e->tmp = temp_name(e, "tmp"))) return bki_fail(BK_ERR_NOMEM, "out of memory");
        fd = open(e->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        bk_status s = bki_fail(BK_ERR_IO, "cannot write %s (%s)", shown, strerror(errno));
        free(e->tmp);
        e->tmp = NULL;
        return s;
    }
    e->fd = fd;
    if (keep) {
        if (geteuid() == 0) (void)!fchown(fd, st.st_uid, st.st_gid);
        (void)fchmod(fd, st.st_mode & 07777);
    }
    return BK_OK;
}

/* gives an O_TMPFILE a name (linkat through /proc) so that it can be renamed */
static int name_anon(entry *e)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", e->fd);
    for (int tries = 0; tries < 64; tries++) {
        free(e->tmp);
        if (!(e->tmp = temp_name(e, "tmp"))) return -1;
        if (linkat(AT_FDCWD, proc, AT_FDCWD, e->tmp, AT_SYMLINK_FOLLOW) == 0) {
            e->anon = 0;
            return 0;
        }
        if (errno != EEXIST) break;
    }
    free(e->tmp);
    e->tmp = NULL;
    return -1;
}

static void entry_discard(entry *e)
{
    if (e->fd >= 0) close(e->fd);
    e->fd = -1;
    if (e->tmp) unlink(e->tmp);
    if (e->old) unlink(e->old);
    free(e->tmp);
    free(e->old);
    free(e->path);
    free(e->dir);
    memset(e, 0, sizeof *e);
    e->fd = -1;
}

bk_outset *bk_outset_create(void)
{
    bk_outset *s = calloc(1, sizeof *s);
    if (!s) bki_fail(BK_ERR_NOMEM, "bk_outset_create: out of memory");
    return s;
}

void bk_outset_free(bk_outset *s)
{
    if (!s) return;
    for (int i = 0; i < s->n; i++) entry_discard(&s->e[i]);
    free(s->e);
    free(s);
}

bk_status bk_outset_add(bk_outset *s, const char *path, unsigned flags, int nparts, const void *const *parts,
                        const size_t *sizes)
{
    bki_clear_error();
    if (!s || !path || nparts < 0 || (nparts > 0 && (!parts || !sizes)))
        return bki_fail(BK_ERR_NULL, "bk_outset_add: NULL argument");
    for (int i = 0; i < nparts; i++)
        if (!parts[i] && sizes[i]) return bki_fail(BK_ERR_NULL, "bk_outset_add: part %d is NULL", i);
    char *where;
    int direct;
    bk_status st = resolve(path, flags, &where, &direct);
    if (st) return st;
    if (direct) {
        st = write_direct(where, nparts, parts, sizes);
        free(where);
        return st;
    }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 4;
        entry *e = realloc(s->e, (size_t)cap * sizeof *e);
        if (!e) {
            free(where);
            return bki_fail(BK_ERR_NOMEM, "out of memory");
        }
        s->e = e;
        s->cap = cap;
    }
    entry *e = &s->e[s->n];
    memset(e, 0, sizeof *e);
    e->fd = -1;
    e->path = where;
    e->flags = flags;
    if (!(e->dir = dir_of(where))) {
        entry_discard(e);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    bki_clean_stale(e->dir, base_of(where));
    st = stage_open(e, path);
    if (!st) st = write_parts(e->fd, path, nparts, parts, sizes);
    if (!st && (flags & BK_OUT_SYNC) && fsync(e->fd) != 0)
        st = bki_fail(BK_ERR_IO, "cannot write %s (%s)", path, strerror(errno));
    if (!e->anon) { /* an O_TMPFILE stays open until it is named */
        if (close(e->fd) != 0 && errno != EINTR && !st)
            st = bki_fail(BK_ERR_IO, "cannot write %s (%s)", path, strerror(errno));
        e->fd = -1;
    }
    if (st) {
        entry_discard(e);
        return st;
    }
    s->n++;
    return BK_OK;
}

/* puts back what commit replaced in entries [0, upto) */
static void roll_back(bk_outset *s, int upto)
{
    for (int i = upto - 1; i >= 0; i--) {
        entry *e = &s->e[i];
        if (!e->done) continue;
        if (e->old) {
            if (rename(e->old, e->path) == 0) {
                free(e->old);
                e->old = NULL;
            }
        } else if (!e->existed) {
            unlink(e->path);
        } /* else: a file system without hard links; the new file stays */
        e->done = 0;
    }
}

/* renames e's staged file onto its path, keeping a link to the file it
 * replaces (e->old) until the whole set is in place */
static int commit_one(entry *e)
{
    if (e->anon && name_anon(e) != 0) return -1;
    struct stat ls;
    e->existed = lstat(e->path, &ls) == 0;
    if (e->existed && !S_ISDIR(ls.st_mode)) {
        for (int tries = 0; tries < 64 && !e->old; tries++) {
            if (!(e->old = temp_name(e, "old"))) return -1;
            if (link(e->path, e->old) != 0) {
                int again = errno == EEXIST;
                free(e->old);
                e->old = NULL;
                if (!again) break; /* no hard links here: that file cannot be put back */
            }
        }
    }
    if (rename(e->tmp, e->path) != 0) return -1;
    free(e->tmp);
    e->tmp = NULL;
    if (e->fd >= 0) close(e->fd);
    e->fd = -1;
    e->done = 1;
    return 0;
}

bk_status bk_outset_commit(bk_outset *s)
{
    bki_clear_error();
    if (!s) return bki_fail(BK_ERR_NULL, "bk_outset_commit: NULL argument");
    for (int i = 0; i < s->n; i++) {
        if (commit_one(&s->e[i]) == 0) continue;
        bk_status st = bki_fail(BK_ERR_IO, "cannot write %s (%s); no output of this set was written",
                                s->e[i].path, strerror(errno));
        roll_back(s, i + 1);
        for (int j = 0; j < s->n; j++) entry_discard(&s->e[j]);
        s->n = 0;
        return st;
    }
    for (int i = 0; i < s->n; i++) {
        entry *e = &s->e[i];
        if (e->flags & BK_OUT_SYNC) { /* the rename itself durable */
            int dfd = open(e->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd >= 0) {
                (void)fsync(dfd);
                close(dfd);
            }
        }
        entry_discard(e);
    }
    s->n = 0;
    return BK_OK;
}

bk_status bki_outset_done(bk_outset *set, bk_status st)
{
    if (!set) return st; /* (bk_outset_create said why) */
    if (!st) st = bk_outset_commit(set);
    bk_outset_free(set);
    return st;
}

bk_status bki_write_file(const char *path, unsigned flags, int nparts, const void *const *parts, const size_t *sizes)
{
    bki_clear_error();
    if (!path) return bki_fail(BK_ERR_NULL, "NULL path");
    bk_outset *s = bk_outset_create();
    return bki_outset_done(s, s ? bk_outset_add(s, path, flags, nparts, parts, sizes) : BK_ERR_NOMEM);
}

bk_status bk_file_write(const char *path, unsigned flags, const void *data, size_t n)
{
    const void *parts[1] = {data ? data : ""};
    return bki_write_file(path, flags, 1, parts, &n);
}

FILE *bki_open_log(const char *path, int fresh)
{
    bki_clear_error();
    /* a fresh log is a new file: whatever the name held (a symlink, a FIFO,
     * an old log) is removed, not followed or opened */
    if (fresh && unlink(path) != 0 && errno != ENOENT) {
        bki_fail(BK_ERR_IO, "cannot write %s (%s)", path, strerror(errno));
        return NULL;
    }
    int fd;
    do fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (fresh ? O_EXCL : O_APPEND), 0666);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        bki_fail(BK_ERR_IO, "cannot write %s (%s)", path,
                 errno == ELOOP  ? "a symbolic link: the run directory's files are never followed"
                 : errno == ENXIO ? "not a regular file" : strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        bki_fail(BK_ERR_IO, "cannot write %s (not a regular file)", path);
        return NULL;
    }
    if (fcntl(fd, F_SETFL, O_APPEND) != 0) {
        bki_fail(BK_ERR_IO, "cannot write %s (%s)", path, strerror(errno));
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "a");
    if (!f) {
        bki_fail(BK_ERR_IO, "cannot write %s (%s)", path, strerror(errno));
        close(fd);
    }
    return f;
}
