/* fuzz_config.c -- libFuzzer target for the run configuration (src/train/run.c):
 * bk_run_config_load over the input written to a file, and bk_run_config_set on
 * the input's first line split at its first '='.
 * Invariants: a failure leaves a message; after a successful load (or set of
 * a value a config file can hold), the text of bk_run_config_format, written
 * to a file and loaded into a fresh default config, loads and formats to the
 * same text (the round trip `birkhoff train` relies on: it writes that text
 * as the run's config.txt and into checkpoints). */
#include "fuzz_util.h"
#include "birkhoff/train.h"

/* bk_run_config_format into a malloc'd string */
static char *format(const bk_run_config *r)
{
    size_t n = bk_run_config_format(r, NULL, 0);
    char *s = malloc(n + 1);
    if (s && bk_run_config_format(r, s, n + 1) != n) {
        free(s);
        return NULL;
    }
    return s;
}

static void round_trip(const bk_run_config *r, const char *what)
{
    char *f1 = format(r);
    FZ_CHECK(f1 != NULL, "config: bk_run_config_format failed after a successful %s", what);
    const char *path = fz_write(1, f1, strlen(f1));
    bk_run_config r2 = bk_run_config_default();
    if (bk_run_config_load(&r2, path) != BK_OK)
        fz_fail("config: the formatted config of a successful %s does not load again: %s\n--- text ---\n%s", what,
                bk_last_error(), f1);
    char *f2 = format(&r2);
    FZ_CHECK(f2 != NULL, "config: bk_run_config_format failed on the reloaded config");
    if (strcmp(f1, f2) != 0) {
        const char *a = f1, *b = f2;
        while (*a && *a == *b) a++, b++;
        while (a > f1 && a[-1] != '\n') a--, b--;
        fz_fail("config: round trip after %s changed the config: '%.*s' became '%.*s'", what,
                (int)strcspn(a, "\n"), a, (int)strcspn(b, "\n"), b);
    }
    free(f1);
    free(f2);
}

/* can a "key = value" line of a config file carry this value unchanged? */
static int file_value(const char *v)
{
    size_t n = strlen(v);
    if (strpbrk(v, "#\n")) return 0;
    if (n && (v[0] == ' ' || v[0] == '\t')) return 0;
    if (n && strchr(" \t\r", v[n - 1])) return 0;
    return n < 3000;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    char err[1024];
    bk_run_config r;

    /* bk_run_config_load */
    r = bk_run_config_default();
    if (bk_run_config_load(&r, fz_write(0, data, n)) == BK_OK) {
        FZ_CHECK(memchr(r.data, 0, sizeof r.data) && memchr(r.data_dir, 0, sizeof r.data_dir) &&
                     memchr(r.progress, 0, sizeof r.progress),
                 "config: a string field is not NUL-terminated");
        round_trip(&r, "load");
    } else {
        snprintf(err, sizeof err, "%s", bk_last_error());
        fz_check_err(err, sizeof err, "bk_run_config_load");
    }

    /* bk_run_config_set on the first line, "key=value" */
    size_t len = 0;
    while (len < n && data[len] != '\n' && data[len] != 0) len++;
    char *line = malloc(len + 1);
    if (!line) fz_fail("out of memory");
    memcpy(line, data, len);
    line[len] = 0;
    char *eq = strchr(line, '=');
    if (eq) {
        *eq = 0;
        r = bk_run_config_default();
        if (bk_run_config_set(&r, line, eq + 1) == BK_OK) {
            if (file_value(eq + 1)) round_trip(&r, "set");
        } else {
            snprintf(err, sizeof err, "%s", bk_last_error());
            fz_check_err(err, sizeof err, "bk_run_config_set");
        }
    }
    free(line);
    return 0;
}
