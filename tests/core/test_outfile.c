/* test_outfile.c -- the output files (src/core/outfile.c, bk_outset_* in
 * birkhoff/core.h): exclusive temporaries, modes, symlinks followed or
 * replaced, devices and FIFOs written into, all-or-none sets with roll back,
 * the leftovers of killed writers, the run directory's logs. */
#define _GNU_SOURCE
#include "birkhoff.h"
#include "../harness.h"
#include "../../src/core/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char D[64];

static const char *at(const char *name)
{
    static _Thread_local char buf[4][400];
    static _Thread_local int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", D, name);
    return buf[k];
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* the file's content ("" if unreadable) */
static const char *get(const char *path)
{
    static char buf[256];
    buf[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* names in D other than those listed (a NULL-terminated list); the first in *first */
static int others(const char *const *keep, char *first, size_t cap)
{
    DIR *d = opendir(D);
    int n = 0;
    struct dirent *de;
    first[0] = 0;
    while (d && (de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        int kept = 0;
        for (int i = 0; keep[i]; i++) kept |= !strcmp(keep[i], de->d_name);
        if (!kept && n++ == 0) snprintf(first, cap, "%s", de->d_name);
    }
    if (d) closedir(d);
    return n;
}

static void clear_dir(void)
{
    DIR *d = opendir(D);
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", D, de->d_name);
        if (unlink(p) != 0) {
            /* a directory of the test */
            char q[600];
            snprintf(q, sizeof q, "%s/x", p);
            unlink(q);
            rmdir(p);
        }
    }
    if (d) closedir(d);
}

static int mode_of(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0 ? (int)(st.st_mode & 07777) : -1;
}

static void test_modes_and_symlinks(void)
{
    mode_t um = umask(022);
    bk_status st = bk_file_write(at("a.txt"), 0, "new", 3);
    int mode = mode_of(at("a.txt"));
    th_check(st == BK_OK && !strcmp(get(at("a.txt")), "new") && mode == 0644,
             "outfile: a new file has 0666 less the umask", "mode %o, %s", (unsigned)mode, bk_last_error());
    chmod(at("a.txt"), 0600);
    th_check(bk_file_write(at("a.txt"), 0, "two", 3) == BK_OK && !strcmp(get(at("a.txt")), "two") &&
                 mode_of(at("a.txt")) == 0600,
             "outfile: a replaced file keeps its mode", "mode %o", (unsigned)mode_of(at("a.txt")));
    umask(um);

    put(at("victim"), "victim");
    symlink("victim", at("link"));
    th_check(bk_file_write(at("link"), 0, "through", 7) == BK_OK && !strcmp(get(at("victim")), "through") &&
                 mode_of(at("link")) == 0777,
             "outfile: a symlink the user named is followed (its target replaced, the link kept)", "%s",
             bk_last_error());
    put(at("victim"), "victim");
    struct stat ls;
    th_check(bk_file_write(at("link"), BK_OUT_NOFOLLOW, "own", 3) == BK_OK && !strcmp(get(at("victim")), "victim") &&
                 lstat(at("link"), &ls) == 0 && S_ISREG(ls.st_mode) && !strcmp(get(at("link")), "own"),
             "outfile: BK_OUT_NOFOLLOW replaces the link itself, never its target", "%s", bk_last_error());
    symlink("nothing-here", at("dangling"));
    th_check(bk_file_write(at("dangling"), 0, "x", 1) == BK_ERR_IO && strstr(bk_last_error(), "dangling") &&
                 access(at("nothing-here"), F_OK) != 0,
             "outfile: a symlink to nothing is refused", "%s", bk_last_error());
    mkdir(at("dir"), 0755);
    th_check(bk_file_write(at("dir"), 0, "x", 1) == BK_ERR_IO && strstr(bk_last_error(), "directory") &&
                 bk_file_write(at("sub/"), 0, "x", 1) == BK_ERR_IO && bk_file_write("", 0, "x", 1) == BK_ERR_IO,
             "outfile: a directory, a path ending in / and an empty path are refused", "%s", bk_last_error());
    rmdir(at("dir"));
    char first[256];
    const char *keep[] = {"a.txt", "victim", "link", "dangling", NULL};
    th_check(others(keep, first, sizeof first) == 0, "outfile: no temporary file is left", "found %s", first);
}

typedef struct {
    const char *path;
    char got[64];
} fifo_reader;

static void *read_fifo(void *arg)
{
    fifo_reader *r = arg;
    int fd = open(r->path, O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, r->got, sizeof r->got - 1) : -1;
    r->got[n > 0 ? n : 0] = 0;
    if (fd >= 0) close(fd);
    return NULL;
}

static void test_devices(void)
{
    struct stat st;
    th_check(bk_file_write("/dev/null", 0, "x", 1) == BK_OK && stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode),
             "outfile: /dev/null is written into and stays a device", "%s", bk_last_error());
    th_check(bk_file_write("/dev/null", BK_OUT_NOFOLLOW, "x", 1) == BK_ERR_IO && stat("/dev/null", &st) == 0 &&
                 S_ISCHR(st.st_mode),
             "outfile: a device is refused with BK_OUT_NOFOLLOW", "%s", bk_last_error());
    mkfifo(at("fifo"), 0644);
    fifo_reader r = {at("fifo"), ""};
    pthread_t th;
    pthread_create(&th, NULL, read_fifo, &r);
    bk_status s = bk_file_write(r.path, 0, "piped", 5);
    pthread_join(th, NULL);
    th_check(s == BK_OK && !strcmp(r.got, "piped") && lstat(at("fifo"), &st) == 0 && S_ISFIFO(st.st_mode),
             "outfile: a FIFO is written into and stays a FIFO", "got '%s' (%s)", r.got, bk_last_error());
    FILE *f = bki_open_log(at("fifo"), 0);
    th_check(!f && strstr(bk_last_error(), "fifo"), "outfile: a run log that is a FIFO is refused without blocking",
             "%s", bk_last_error());
    if (f) fclose(f);
    unlink(at("fifo"));
}

/* a pid that no longer exists (a child that exited and was reaped) */
static pid_t dead_pid(void)
{
    pid_t p = fork();
    if (p == 0) _exit(0);
    waitpid(p, NULL, 0);
    return p;
}

static void test_stale(void)
{
    char dead[256], mine[256], other[256], live[256], notours[256];
    pid_t dp = dead_pid();
    snprintf(dead, sizeof dead, ".o.npy.bk-%ld-0123456789abcdef.tmp", (long)dp);
    snprintf(mine, sizeof mine, ".o.npy.bk-%ld-0123456789abcdef.old", (long)getpid());
    snprintf(other, sizeof other, ".p.npy.bk-%ld-0123456789abcdef.tmp", (long)dp);
    snprintf(live, sizeof live, ".o.npy.bk-1-0123456789abcdef.tmp");
    snprintf(notours, sizeof notours, ".o.npy.bk-%ld-0123.tmp", (long)dp);
    const char *names[] = {dead, mine, other, live, notours};
    for (int i = 0; i < 5; i++) put(at(names[i]), "left");
    int ok = bk_file_write(at("o.npy"), 0, "o", 1) == BK_OK;
    th_check(ok && access(at(dead), F_OK) != 0 && access(at(mine), F_OK) == 0 && access(at(other), F_OK) == 0 &&
                 access(at(live), F_OK) == 0 && access(at(notours), F_OK) == 0,
             "outfile: writing a file removes its temporaries left by dead writers, nothing else", "%s",
             bk_last_error());
    th_check(bki_clean_stale(D, NULL) == 1 && access(at(other), F_OK) != 0 && access(at(mine), F_OK) == 0,
             "outfile: bki_clean_stale(dir, NULL) removes a dead writer's temporaries of any file", "%s", other);
    clear_dir();

    /* a writer killed while it writes: nothing of it is left after the next write */
    size_t big = (size_t)256 << 20;
    char *buf = malloc(big);
    if (!buf) return;
    memset(buf, 7, big);
    put(at("big.bin"), "old");
    pid_t p = fork();
    if (p == 0) {
        bk_file_write(at("big.bin"), 0, buf, big);
        _exit(0);
    }
    usleep(30000);
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    free(buf);
    int intact = !strcmp(get(at("big.bin")), "old") || access(at("big.bin"), F_OK) == 0;
    ok = bk_file_write(at("big.bin"), 0, "new", 3) == BK_OK;
    char first[256];
    const char *keep[] = {"big.bin", NULL};
    th_check(intact && ok && !strcmp(get(at("big.bin")), "new") && others(keep, first, sizeof first) == 0,
             "outfile: after a writer is killed, the next write of the file leaves no temporary", "left %s", first);
    clear_dir();
}

static void test_sets(void)
{
    put(at("a"), "old-a");
    bk_outset *s = bk_outset_create();
    const void *pa[1] = {"new-a"};
    size_t na = 5;
    bk_status s1 = bk_outset_add(s, at("a"), 0, 1, pa, &na);
    bk_status s2 = bk_outset_add(s, at("nodir/b"), 0, 1, pa, &na);
    bk_outset_free(s);
    char first[256];
    const char *keep1[] = {"a", NULL};
    th_check(s1 == BK_OK && s2 == BK_ERR_IO && !strcmp(get(at("a")), "old-a") && others(keep1, first, sizeof first) == 0,
             "outfile: a set that fails before commit writes nothing and leaves nothing", "left %s", first);

    /* the second rename fails (its path became a non-empty directory): the first is put back */
    mkdir(at("c"), 0755);
    s = bk_outset_create();
    s1 = bk_outset_add(s, at("a"), 0, 1, pa, &na);
    s2 = bk_outset_add(s, at("c/x"), 0, 1, pa, &na);
    bk_outset_add(s, at("fresh"), 0, 1, pa, &na);
    mkdir(at("c/x"), 0755);
    put(at("c/x/keep"), "k");
    bk_status s3 = bk_outset_commit(s);
    bk_outset_free(s);
    int back = !strcmp(get(at("a")), "old-a") && access(at("fresh"), F_OK) != 0;
    unlink(at("c/x/keep"));
    rmdir(at("c/x"));
    const char *keep2[] = {"a", "c", NULL};
    th_check(s1 == BK_OK && s2 == BK_OK && s3 == BK_ERR_IO && back && others(keep2, first, sizeof first) == 0,
             "outfile: a failed commit puts back the files it replaced and leaves nothing", "%d %s: %s", back, first,
             bk_last_error());
    s = bk_outset_create();
    bk_outset_add(s, at("a"), 0, 1, pa, &na);
    bk_outset_add(s, at("b"), 0, 1, pa, &na);
    s3 = bk_outset_commit(s);
    bk_outset_free(s);
    const char *keep3[] = {"a", "b", "c", NULL};
    th_check(s3 == BK_OK && !strcmp(get(at("a")), "new-a") && !strcmp(get(at("b")), "new-a") &&
                 others(keep3, first, sizeof first) == 0,
             "outfile: a set commits every file and keeps no backup", "left %s", first);
    clear_dir();
}

static void test_logs(void)
{
    mode_t um = umask(022);
    FILE *f = bki_open_log(at("m.jsonl"), 1);
    if (f) {
        fputs("one\n", f);
        fclose(f);
    }
    f = bki_open_log(at("m.jsonl"), 0);
    if (f) {
        fputs("two\n", f);
        fclose(f);
    }
    th_check(!strcmp(get(at("m.jsonl")), "one\ntwo\n") && mode_of(at("m.jsonl")) == 0644,
             "outfile: a run log is created 0644 under umask 022 and appended", "'%s' %o", get(at("m.jsonl")),
             (unsigned)mode_of(at("m.jsonl")));
    f = bki_open_log(at("m.jsonl"), 1);
    if (f) fclose(f);
    th_check(!strcmp(get(at("m.jsonl")), ""), "outfile: a fresh run log is truncated", "%s", get(at("m.jsonl")));
    umask(um);
    put(at("victim"), "victim");
    symlink("victim", at("steps.csv"));
    f = bki_open_log(at("steps.csv"), 0);
    th_check(!f && !strcmp(get(at("victim")), "victim") && strstr(bk_last_error(), "symbolic link"),
             "outfile: a run log to append that is a symlink is refused and its target untouched", "%s",
             bk_last_error());
    if (f) fclose(f);
    f = bki_open_log(at("steps.csv"), 1);
    if (f) {
        fputs("fresh\n", f);
        fclose(f);
    }
    struct stat ls;
    th_check(f && !strcmp(get(at("victim")), "victim") && lstat(at("steps.csv"), &ls) == 0 && S_ISREG(ls.st_mode) &&
                 !strcmp(get(at("steps.csv")), "fresh\n"),
             "outfile: a fresh run log replaces a symlink there with a new file, its target untouched", "%s",
             bk_last_error());
    clear_dir();
}

void test_outfile(void)
{
    if (TH.filter && !strstr("outfile", TH.filter)) return;
    snprintf(D, sizeof D, "/tmp/bk_test_outfile_XXXXXX");
    if (!mkdtemp(D)) {
        th_check(0, "outfile: a temporary directory", "%s", strerror(errno));
        return;
    }
    test_modes_and_symlinks();
    clear_dir();
    test_devices();
    test_stale();
    test_sets();
    test_logs();
    clear_dir();
    rmdir(D);
}
