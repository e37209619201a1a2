/* parallel.c -- parallel text: two line-aligned UTF-8 files read into
 * sentence pairs with strict validation, the stored Bible corpus checked
 * against the version this library knows (birkhoff/data.h,
 * docs/TRANSLATION.md). */
#include "../core/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct bk_parallel {
    bk_parallel_info info;
    char *buf[2];     /* each file's bytes, every line end replaced by NUL */
    int64_t *off[2];  /* [lines + 1]: line i is buf + off[i], length off[i+1] - off[i] - 1 */
};

/* ---- the stored corpora this code knows ---- */
typedef struct {
    const char *path; /* relative to the data directory */
    uint64_t bytes;
    uint64_t fnv;     /* FNV-1a-64 of the file */
} known_text;

/* built by scripts/data.sh bible from these Debian packages */
#define BIBLE_SOURCES "sword-text-sparv 2.60-1, sword-text-web 426.0-1, libsword-utils 1.9.0+dfsg-4+b4"

static const known_text KNOWN_TEXT[] = {
    {"bible/train.es", 3509181, 0x0ade2a9864aef251ull}, {"bible/train.en", 3590908, 0xb4f074d7ae9cffebull},
    {"bible/valid.es", 131710, 0xcd5b90c8bfd76c89ull},  {"bible/valid.en", 132813, 0x6344b2e8e2278a7eull},
    {"bible/test.es", 207342, 0x48cbc9b8b2919769ull},   {"bible/test.en", 212589, 0xb0d305370671a37bull},
};

bk_parallel_config bk_parallel_config_default(void)
{
    bk_parallel_config c;
    memset(&c, 0, sizeof c);
    c.max_bytes = BK_PARALLEL_MAX_LINE_DEFAULT;
    return c;
}

static bk_status check_config(const bk_parallel_config *c, int *max_bytes)
{
    int m = c->max_bytes ? c->max_bytes : BK_PARALLEL_MAX_LINE_DEFAULT;
    if (m < 1 || m > BK_PARALLEL_MAX_LINE)
        return bki_fail(BK_ERR_PARAM, "parallel: max_bytes %d outside [1, %d] (0: %d)", c->max_bytes,
                        BK_PARALLEL_MAX_LINE, BK_PARALLEL_MAX_LINE_DEFAULT);
    if (c->limit < 0) return bki_fail(BK_ERR_PARAM, "parallel: limit %lld is negative", (long long)c->limit);
    *max_bytes = m;
    return BK_OK;
}

/* ---- validation ---- */
/* Length of the valid UTF-8 sequence at p[0..n) and its code point, or 0
 * when it is not one (truncated, bad continuation, overlong, surrogate,
 * above U+10FFFF, a stray continuation byte, 0xF5..0xFF). */
static size_t utf8_seq(const unsigned char *p, size_t n, uint32_t *cp)
{
    unsigned char b = p[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    uint32_t v;
    if (b >= 0xC2 && b <= 0xDF) len = 2, v = b & 0x1F;
    else if (b >= 0xE0 && b <= 0xEF) {
        len = 3, v = b & 0x0F;
        if (b == 0xE0) lo = 0xA0;      /* overlong */
        else if (b == 0xED) hi = 0x9F; /* surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4, v = b & 0x07;
        if (b == 0xF0) lo = 0x90;      /* overlong */
        else if (b == 0xF4) hi = 0x8F; /* above U+10FFFF */
    } else
        return 0;
    if (n < len) return 0;
    for (size_t k = 1; k < len; k++) {
        unsigned char c = p[k];
        if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return 0;
        v = v << 6 | (c & 0x3F);
    }
    *cp = v;
    return len;
}

/* Validates one file and counts its lines (the last line's "\n" optional). */
static bk_status scan(const char *name, const unsigned char *b, size_t n, int max_bytes, int64_t *lines)
{
    if (n == 0) return bki_fail(BK_ERR_FORMAT, "parallel: %s: empty file (no lines)", name);
    if (n >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF)
        return bki_fail(BK_ERR_FORMAT, "parallel: %s: starts with a byte-order mark (U+FEFF); save it without one",
                        name);
    int64_t line = 1;
    size_t start = 0, i = 0;
    int blank = 1; /* only spaces and tabs so far on this line */
    while (i <= n) {
        if (i == n || b[i] == '\n') {
            size_t len = i - start;
            if (i == n && len == 0) { /* the last line ended with "\n" */
                line--;
                break;
            }
            if (len == 0)
                return bki_fail(BK_ERR_FORMAT, "parallel: %s: line %lld is empty", name, (long long)line);
            if (blank)
                return bki_fail(BK_ERR_FORMAT, "parallel: %s: line %lld is blank (only spaces and tabs)", name,
                                (long long)line);
            if (len > (size_t)max_bytes)
                return bki_fail(BK_ERR_FORMAT, "parallel: %s: line %lld is %zu bytes, longer than the limit %d (max_bytes)",
                                name, (long long)line, len, max_bytes);
            if (i == n) break;
            line++;
            i++;
            start = i;
            blank = 1;
            continue;
        }
        long long col = (long long)(i - start) + 1;
        uint32_t cp = 0;
        size_t k = utf8_seq(b + i, n - i, &cp);
        if (k == 0)
            return bki_fail(BK_ERR_FORMAT, "parallel: %s: line %lld, byte %lld: invalid UTF-8 (byte 0x%02x)", name,
                            (long long)line, col, b[i]);
        if (cp == '\r')
            return bki_fail(BK_ERR_FORMAT,
                            "parallel: %s: line %lld, byte %lld: carriage return (CR); lines must end in \"\\n\" only",
                            name, (long long)line, col);
        if ((cp < 0x20 && cp != '\t') || (cp >= 0x7F && cp <= 0x9F))
            return bki_fail(BK_ERR_FORMAT, "parallel: %s: line %lld, byte %lld: control character U+%04X", name,
                            (long long)line, col, (unsigned)cp);
        if (cp == 0x2028 || cp == 0x2029)
            return bki_fail(BK_ERR_FORMAT, "parallel: %s: line %lld, byte %lld: %s separator U+%04X", name,
                            (long long)line, col, cp == 0x2028 ? "line" : "paragraph", (unsigned)cp);
        if (cp != ' ' && cp != '\t') blank = 0;
        i += k;
    }
    *lines = line;
    return BK_OK;
}

/* the line offsets of a validated buffer; every "\n" becomes NUL (buf has
 * room for one more byte, the last line's terminator) */
static int64_t *split_lines(char *buf, size_t n, int64_t lines)
{
    int64_t *off = malloc(((size_t)lines + 1) * sizeof *off);
    if (!off) return NULL;
    int64_t l = 0;
    off[0] = 0;
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '\n') {
            buf[i] = '\0';
            off[++l] = (int64_t)i + 1;
        }
    if (l < lines) { /* no final "\n" */
        buf[n] = '\0';
        off[++l] = (int64_t)n + 1;
    }
    return off;
}

static void free_parallel(bk_parallel *p)
{
    if (!p) return;
    for (int s = 0; s < 2; s++) {
        free(p->buf[s]);
        free(p->off[s]);
    }
    free(p);
}

/* Takes ownership of buf[0] and buf[1] (each with one spare byte past its
 * size), whatever happens. */
static bk_status build(char *buf[2], const size_t size[2], const char *name[2], const bk_parallel_config *c,
                       bk_parallel **out)
{
    bk_parallel_config def = bk_parallel_config_default();
    if (!c) c = &def;
    int max_bytes = 0;
    int64_t lines[2] = {0, 0};
    bk_status st = check_config(c, &max_bytes);
    for (int s = 0; s < 2 && st == BK_OK; s++)
        st = scan(name[s], (const unsigned char *)buf[s], size[s], max_bytes, &lines[s]);
    if (st == BK_OK && lines[0] != lines[1])
        st = bki_fail(BK_ERR_FORMAT, "parallel: %s has %lld lines, %s has %lld: the files are not line-aligned",
                      name[0], (long long)lines[0], name[1], (long long)lines[1]);
    bk_parallel *p = NULL;
    if (st == BK_OK && !(p = calloc(1, sizeof *p))) st = bki_fail(BK_ERR_NOMEM, "parallel: out of memory");
    if (st != BK_OK) {
        free(buf[0]);
        free(buf[1]);
        return st;
    }
    bk_parallel_info *in = &p->info;
    in->src_fnv = bki_fnv1a(BKI_FNV_OFFSET, buf[0], size[0]);
    in->tgt_fnv = bki_fnv1a(BKI_FNV_OFFSET, buf[1], size[1]);
    p->buf[0] = buf[0];
    p->buf[1] = buf[1];
    for (int s = 0; s < 2; s++)
        if (!(p->off[s] = split_lines(p->buf[s], size[s], lines[s]))) {
            free_parallel(p);
            return bki_fail(BK_ERR_NOMEM, "parallel: out of memory");
        }
    in->lines = lines[0];
    in->n = c->limit > 0 && c->limit < lines[0] ? c->limit : lines[0];
    for (int64_t i = 0; i < in->n; i++) {
        int32_t ls = (int32_t)(p->off[0][i + 1] - p->off[0][i] - 1);
        int32_t lt = (int32_t)(p->off[1][i + 1] - p->off[1][i] - 1);
        in->src_bytes += ls;
        in->tgt_bytes += lt;
        if (ls > in->src_max) in->src_max = ls;
        if (lt > in->tgt_max) in->tgt_max = lt;
    }
    snprintf(in->version, sizeof in->version, "%.60s | %.60s: %lld pairs, fnv1a %016llx %016llx", name[0], name[1],
             (long long)in->n, (unsigned long long)in->src_fnv, (unsigned long long)in->tgt_fnv);
    *out = p;
    return BK_OK;
}

bk_status bk_parallel_parse(const char *src, size_t src_n, const char *tgt, size_t tgt_n, const char *src_name,
                            const char *tgt_name, const bk_parallel_config *c, bk_parallel **out)
{
    bki_clear_error();
    if ((!src && src_n) || (!tgt && tgt_n) || !out) return bki_fail(BK_ERR_NULL, "parallel: NULL argument");
    const char *name[2] = {src_name ? src_name : "source", tgt_name ? tgt_name : "target"};
    size_t size[2] = {src_n, tgt_n};
    const char *in[2] = {src, tgt};
    if (src_n > (size_t)BK_PARALLEL_MAX_FILE || tgt_n > (size_t)BK_PARALLEL_MAX_FILE)
        return bki_fail(BK_ERR_FORMAT, "parallel: %s: larger than %lld bytes", name[src_n > (size_t)BK_PARALLEL_MAX_FILE ? 0 : 1],
                        (long long)BK_PARALLEL_MAX_FILE);
    char *buf[2] = {malloc(src_n + 1), malloc(tgt_n + 1)};
    if (!buf[0] || !buf[1]) {
        free(buf[0]);
        free(buf[1]);
        return bki_fail(BK_ERR_NOMEM, "parallel: out of memory");
    }
    for (int s = 0; s < 2; s++)
        if (size[s]) memcpy(buf[s], in[s], size[s]);
    return build(buf, size, name, c, out);
}

/* a whole regular file into a new buffer with one spare byte */
static bk_status read_file(const char *path, char **out, size_t *outn)
{
    errno = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return bki_fail(BK_ERR_IO, "parallel: %s: cannot open (%s)", path, strerror(errno ? errno : ENOENT));
    struct stat stt;
    if (fstat(fileno(f), &stt) != 0 || !S_ISREG(stt.st_mode)) {
        fclose(f);
        return bki_fail(BK_ERR_IO, "parallel: %s: not a regular file", path);
    }
    if ((int64_t)stt.st_size > BK_PARALLEL_MAX_FILE) {
        fclose(f);
        return bki_fail(BK_ERR_FORMAT, "parallel: %s: %lld bytes, larger than %lld", path, (long long)stt.st_size,
                        (long long)BK_PARALLEL_MAX_FILE);
    }
    size_t n = (size_t)stt.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return bki_fail(BK_ERR_NOMEM, "parallel: %s: out of memory", path);
    }
    size_t got = n ? fread(buf, 1, n, f) : 0;
    int extra = fgetc(f) != EOF; /* grew while read */
    int err = ferror(f);
    fclose(f);
    if (got != n || extra || err) {
        free(buf);
        return bki_fail(BK_ERR_IO, "parallel: %s: read failed (%s)", path,
                        err ? "I/O error" : "the file changed while it was read");
    }
    *out = buf;
    *outn = n;
    return BK_OK;
}

static bk_status load_paths(const char *sp, const char *tp, const bk_parallel_config *c, bk_parallel **out,
                            const known_text *known[2], const char *fix)
{
    char *buf[2] = {NULL, NULL};
    size_t size[2] = {0, 0};
    const char *name[2] = {sp, tp};
    for (int s = 0; s < 2; s++) {
        bk_status st = read_file(name[s], &buf[s], &size[s]);
        if (st == BK_OK && known[s]) {
            uint64_t h = bki_fnv1a(BKI_FNV_OFFSET, buf[s], size[s]);
            if (size[s] != known[s]->bytes || h != known[s]->fnv)
                st = bki_fail(BK_ERR_FORMAT,
                              "parallel: %s: not the known version (%zu bytes, fnv1a %016llx; the known one has "
                              "%llu bytes, fnv1a %016llx, built from %s): corrupt, or built from other package "
                              "versions; rebuild and verify it with: scripts/data.sh %s",
                              name[s], size[s], (unsigned long long)h, (unsigned long long)known[s]->bytes,
                              (unsigned long long)known[s]->fnv, BIBLE_SOURCES, fix);
        } else if (st == BK_ERR_IO && fix) {
            char msg[1400];
            snprintf(msg, sizeof msg, "%s", bk_last_error());
            st = bki_fail(st, "%s; build and verify it with: scripts/data.sh %s", msg, fix);
        }
        if (st != BK_OK) {
            free(buf[0]);
            free(buf[1]);
            return st;
        }
    }
    return build(buf, size, name, c, out);
}

bk_status bk_parallel_load(const char *src_path, const char *tgt_path, const bk_parallel_config *c,
                           bk_parallel **out)
{
    bki_clear_error();
    if (!src_path || !tgt_path || !out) return bki_fail(BK_ERR_NULL, "parallel: NULL argument");
    const known_text *none[2] = {NULL, NULL};
    return load_paths(src_path, tgt_path, c, out, none, NULL);
}

bk_status bk_parallel_open(const char *name, const char *split, const char *dir, const bk_parallel_config *c,
                           bk_parallel **out)
{
    bki_clear_error();
    if (!name || !split || !out) return bki_fail(BK_ERR_NULL, "parallel: NULL argument");
    if (strcmp(name, "bible") != 0) return bki_fail(BK_ERR_PARAM, "parallel: unknown corpus '%s' (bible)", name);
    if (strcmp(split, "train") && strcmp(split, "valid") && strcmp(split, "test"))
        return bki_fail(BK_ERR_PARAM, "parallel: unknown split '%s' (train, valid, test)", split);
    if (!dir || !*dir) {
        const char *e = getenv("BK_DATA");
        dir = e && *e ? e : "data";
    }
    if (strlen(dir) > 1000) return bki_fail(BK_ERR_PARAM, "parallel: data directory name too long");
    const char *lang[2] = {"es", "en"};
    char rel[2][64], path[2][1100];
    const known_text *known[2] = {NULL, NULL};
    for (int s = 0; s < 2; s++) {
        snprintf(rel[s], sizeof rel[s], "bible/%s.%s", split, lang[s]);
        snprintf(path[s], sizeof path[s], "%s/%s", dir, rel[s]);
        for (size_t k = 0; k < sizeof KNOWN_TEXT / sizeof KNOWN_TEXT[0]; k++)
            if (strcmp(KNOWN_TEXT[k].path, rel[s]) == 0) known[s] = &KNOWN_TEXT[k];
    }
    bk_parallel *p = NULL;
    bk_status st = load_paths(path[0], path[1], c, &p, known, "bible");
    if (st != BK_OK) return st;
    snprintf(p->info.version, sizeof p->info.version,
             "bible %s es-en (%.100s): %lld pairs, fnv1a %016llx %016llx", split, BIBLE_SOURCES,
             (long long)p->info.n, (unsigned long long)p->info.src_fnv, (unsigned long long)p->info.tgt_fnv);
    *out = p;
    return BK_OK;
}

void bk_parallel_free(bk_parallel *p) { free_parallel(p); }

int64_t bk_parallel_count(const bk_parallel *p) { return p ? p->info.n : 0; }

const bk_parallel_info *bk_parallel_get_info(const bk_parallel *p) { return p ? &p->info : NULL; }

bk_status bk_parallel_pair(const bk_parallel *p, int64_t i, bk_sentence_pair *out)
{
    bki_clear_error();
    if (!p || !out) return bki_fail(BK_ERR_NULL, "parallel: NULL argument");
    if (i < 0 || i >= p->info.n)
        return bki_fail(BK_ERR_PARAM, "parallel: pair %lld outside [0, %lld)", (long long)i, (long long)p->info.n);
    out->src = p->buf[0] + p->off[0][i];
    out->tgt = p->buf[1] + p->off[1][i];
    out->src_len = (int32_t)(p->off[0][i + 1] - p->off[0][i] - 1);
    out->tgt_len = (int32_t)(p->off[1][i + 1] - p->off[1][i] - 1);
    return BK_OK;
}
