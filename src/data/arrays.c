/* arrays.c -- the user's arrays as a dataset (birkhoff/data.h, specs
 * npy:... and npz:...; docs/DATA.md): x (images, token ids or point sets),
 * labels y and optional lengths from .npy files or one .npz archive. x is
 * memory-mapped (a stored .npz member in place, a deflated one inflated into
 * memory) and checked in one pass at open; y and the lengths are read into
 * int32 arrays. The stored image sets use the same store and fill path. */
#include "dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ARR_MAX_LABEL (1 << 20)  /* labels in [0, 2^20)               */
#define ARR_MAX_VOCAB (1 << 24)  /* token ids in [0, 2^24)            */
#define ARR_MAX_SIDE (1 << 16)   /* H, W, L, P, D each at most 65536   */
#define ARR_MAX_SAMPLE ((int64_t)1 << 28) /* elements of one sample    */
#define ARR_SUM_WHOLE ((uint64_t)64 << 20) /* files hashed whole up to this */
#define ARR_MIB ((uint64_t)1 << 20)

enum { KIND_AUTO, KIND_IMAGE, KIND_TOKENS, KIND_POINTS };

/* one array: where its elements are, what holds them */
typedef struct {
    char name[1200];       /* what messages call it: PATH or ARCHIVE:MEMBER */
    bki_npy_head h;
    const uint8_t *data;   /* the elements                                */
    void *map;             /* a mapping data lies in (or the archive's)   */
    size_t map_len;
    void *owned;           /* an inflated member data lies in             */
    uint64_t sum;          /* the checksum of its file (version)          */
} arr;

static void arr_free(arr *a)
{
    if (a->map) munmap(a->map, a->map_len);
    free(a->owned);
    a->map = a->owned = NULL;
    a->data = NULL;
}

/* The checksum of a file's bytes that the version records: FNV-1a-64 of the
 * whole file up to 64 MiB, else of its size, first and last MiB. */
static uint64_t file_sum(const uint8_t *b, uint64_t n)
{
    uint64_t h = bki_fnv1a(BKI_FNV_OFFSET, &n, sizeof n);
    if (n <= ARR_SUM_WHOLE) return bki_fnv1a(h, b, (size_t)n);
    h = bki_fnv1a(h, b, (size_t)ARR_MIB);
    return bki_fnv1a(h, b + n - ARR_MIB, (size_t)ARR_MIB);
}

/* maps a whole regular file read-only */
static bk_status map_file(const char *path, void **map, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return bki_fail(BK_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    struct stat sb;
    bk_status st = BK_OK;
    if (fstat(fd, &sb) != 0) st = bki_fail(BK_ERR_IO, "%s: cannot stat (%s)", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode)) st = bki_fail(BK_ERR_IO, "%s: not a regular file", path);
    else if (sb.st_size == 0) st = bki_fail(BK_ERR_FORMAT, "%s: empty file", path);
    else if ((uint64_t)sb.st_size > SIZE_MAX) st = bki_fail(BK_ERR_IO, "%s: too large to map", path);
    if (st == BK_OK) {
        *len = (size_t)sb.st_size;
        *map = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (*map == MAP_FAILED) {
            *map = NULL;
            st = bki_fail(BK_ERR_IO, "%s: cannot map %zu bytes (%s)", path, *len, strerror(errno));
        }
    }
    close(fd);
    return st;
}

/* the .npy bytes at b[0..n): header parsed, the data exactly the rest */
static bk_status arr_parse(arr *a, const uint8_t *b, uint64_t n)
{
    bk_status st = bki_npy_header(a->name, b, (size_t)n, &a->h);
    if (st != BK_OK) return st;
    const uint64_t have = n - a->h.offset;
    if (have < a->h.bytes)
        return bki_fail(BK_ERR_FORMAT, "%s: truncated data (the header describes %llu bytes, %llu follow it)", a->name,
                        (unsigned long long)a->h.bytes, (unsigned long long)have);
    if (have > a->h.bytes)
        return bki_fail(BK_ERR_FORMAT, "%s: %llu trailing bytes after the array data", a->name,
                        (unsigned long long)(have - a->h.bytes));
    a->data = b + a->h.offset;
    return BK_OK;
}

static bk_status arr_open_npy(arr *a, const char *path)
{
    snprintf(a->name, sizeof a->name, "%.1100s", path);
    bk_status st = map_file(path, &a->map, &a->map_len);
    if (st == BK_OK) st = arr_parse(a, a->map, a->map_len);
    if (st == BK_OK) a->sum = file_sum(a->map, a->map_len);
    if (st != BK_OK) arr_free(a);
    return st;
}

/* member KEY.npy of the archive at z (mapped, zlen bytes) listed in m[nm];
 * stored: a->data points into z (a->map stays NULL: the caller owns z) */
static bk_status arr_open_member(arr *a, const char *path, const uint8_t *z, const bki_zip_member *m, int nm,
                                 const char *key, int required, int *found)
{
    char want[16];
    snprintf(want, sizeof want, "%s.npy", key);
    snprintf(a->name, sizeof a->name, "%.1100s:%s", path, want);
    *found = 0;
    for (int i = 0; i < nm; i++) {
        if (strcmp(m[i].name, want) != 0) continue;
        *found = 1;
        const uint8_t *d = NULL;
        bk_status st = bki_zip_data(path, z, &m[i], (uint64_t)BKI_NPY_MAX_COUNT * 8 + (1u << 20), &d, &a->owned);
        if (st == BK_OK) st = arr_parse(a, d, m[i].usize);
        if (st != BK_OK) arr_free(a);
        return st;
    }
    if (!required) return BK_OK;
    char list[512] = "";
    for (int i = 0; i < nm; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", m[i].name[0] ? m[i].name : "(long name)");
    }
    return bki_fail(BK_ERR_FORMAT, "%s: no member '%s' (members: %s); save with np.savez(FILE, x=X, y=Y[, lengths=L])",
                    path, want, nm ? list : "none");
}

/* the three arrays of a spec: x, y and (when there) lengths */
typedef struct {
    arr a[3];
    int have_len;
    int npz;
    void *zmap;            /* the archive (npz), while x needs it         */
    size_t zlen;
} arrset;

static void set_free(arrset *s)
{
    for (int k = 0; k < 3; k++) arr_free(&s->a[k]);
    if (s->zmap) munmap(s->zmap, s->zlen);
    s->zmap = NULL;
}

static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bk_status open_npz(arrset *s, const char *path)
{
    bk_status st = map_file(path, &s->zmap, &s->zlen);
    if (st != BK_OK) return st;
    s->npz = 1;
    bki_zip_member *m = malloc(sizeof *m * BKI_ZIP_MAX_MEMBERS);
    int nm = 0, found = 0;
    if (!m) return bki_fail(BK_ERR_NOMEM, "%s: out of memory", path);
    st = bki_zip_list(path, s->zmap, s->zlen, m, &nm);
    static const char *const keys[3] = {"x", "y", "lengths"};
    for (int k = 0; st == BK_OK && k < 3; k++) {
        st = arr_open_member(&s->a[k], path, s->zmap, m, nm, keys[k], k < 2, &found);
        if (k == 2) s->have_len = found;
    }
    free(m);
    if (st == BK_OK) {
        const uint64_t sum = file_sum(s->zmap, s->zlen);
        for (int k = 0; k < 3; k++) s->a[k].sum = sum;
    }
    return st;
}

/* spec: DIR, X.npy,Y.npy[,LENGTHS.npy] or ARCHIVE.npz */
static bk_status open_spec(arrset *s, const char *spec)
{
    memset(s, 0, sizeof *s);
    if (!spec || !*spec) return bki_fail(BK_ERR_PARAM, "arrays: empty path (npy:DIR, npy:X.npy,Y.npy or npz:FILE.npz)");
    char path[3][1100];
    int np = 0;
    const char *p = spec;
    if (strchr(spec, ',')) {
        for (;;) {
            const char *c = strchr(p, ',');
            size_t l = c ? (size_t)(c - p) : strlen(p);
            if (np == 3 || l == 0 || l >= sizeof path[0])
                return bki_fail(BK_ERR_PARAM, "arrays: '%s' is not X.npy,Y.npy[,LENGTHS.npy] (%s)", spec,
                                np == 3 ? "more than three files" : l ? "a path too long" : "an empty path");
            memcpy(path[np], p, l);
            path[np++][l] = 0;
            if (!c) break;
            p = c + 1;
        }
        if (np < 2) return bki_fail(BK_ERR_PARAM, "arrays: '%s' names one file; x and y are needed", spec);
    } else if (is_dir(spec)) {
        static const char *const f[3] = {"x.npy", "y.npy", "lengths.npy"};
        for (np = 0; np < 3; np++)
            if (snprintf(path[np], sizeof path[np], "%s/%s", spec, f[np]) >= (int)sizeof path[np])
                return bki_fail(BK_ERR_PARAM, "arrays: the path '%s' is too long", spec);
        if (access(path[2], F_OK) != 0) np = 2;
    } else {
        return open_npz(s, spec);
    }
    for (int k = 0; k < np; k++) {
        bk_status st = arr_open_npy(&s->a[k], path[k]);
        if (st != BK_OK) return st;
    }
    s->have_len = np == 3;
    return BK_OK;
}

/* element j of an integer array as int64 */
static int64_t ld_int(const arr *a, int64_t j)
{
    const uint8_t *p = a->data + (size_t)j * (size_t)a->h.esize;
    if (a->h.dtype == BKI_NPY_U8) return *p;
    if (a->h.dtype == BKI_NPY_I32) {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

static const char *shape_str(const bki_npy_head *h, char *buf, size_t cap)
{
    size_t l = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < h->ndim && l < cap; i++)
        l += (size_t)snprintf(buf + l, cap - l, "%s%lld", i ? ", " : "", (long long)h->shape[i]);
    if (l < cap) snprintf(buf + l, cap - l, "]");
    return buf;
}

/* y or lengths: a 1-d integer array of n entries, each in [lo, hi], into a
 * malloc'd int32 array */
static bk_status read_ints(const arr *a, const arr *x, const char *what, int64_t lo, int64_t hi, int32_t **out)
{
    char sh[96];
    const bki_npy_head *h = &a->h;
    if (h->dtype == BKI_NPY_F32)
        return bki_fail(BK_ERR_FORMAT, "%s: the %ss are float32; they must be integers (int32, int64 or uint8)",
                        a->name, what);
    if (h->ndim != 1)
        return bki_fail(BK_ERR_FORMAT, "%s: the %ss must be a 1-d array [N], not %s%s", a->name, what, shape_str(h, sh, sizeof sh),
                        h->ndim == 2 && h->shape[1] == 1 ? " (flatten it: a.ravel())" : "");
    if (h->shape[0] != x->h.shape[0])
        return bki_fail(BK_ERR_SHAPE, "%s has %lld %ss but %s has %lld samples: N must match", a->name,
                        (long long)h->shape[0], what, x->name, (long long)x->h.shape[0]);
    int32_t *v = malloc(sizeof *v * (size_t)(h->shape[0] > 0 ? h->shape[0] : 1));
    if (!v) return bki_fail(BK_ERR_NOMEM, "%s: out of memory", a->name);
    for (int64_t i = 0; i < h->shape[0]; i++) {
        const int64_t e = ld_int(a, i);
        if (e < lo || e > hi) {
            free(v);
            return bki_fail(BK_ERR_FORMAT, "%s: %s %lld of sample %lld (byte %llu) is %s [%lld, %lld]", a->name, what,
                            (long long)e, (long long)i, (unsigned long long)(a->h.offset + (uint64_t)i * (uint64_t)h->esize),
                            e < 0 ? "negative, outside" : "outside", (long long)lo, (long long)hi);
        }
        v[i] = (int32_t)e;
    }
    *out = v;
    return BK_OK;
}

/* which input x is (KIND_*), its shape fields in *in and the layout */
static bk_status classify(const arr *x, int have_len, int kind, bk_dataset_info *in, int *hwc)
{
    const bki_npy_head *h = &x->h;
    char sh[96];
    const int isint = h->dtype == BKI_NPY_I32 || h->dtype == BKI_NPY_I64;
    if (kind == KIND_AUTO)
        kind = isint ? KIND_TOKENS : h->ndim == 3 && h->dtype == BKI_NPY_F32 && have_len ? KIND_POINTS : KIND_IMAGE;
    const int ok = kind == KIND_TOKENS   ? isint && h->ndim == 2
                   : kind == KIND_POINTS ? h->dtype == BKI_NPY_F32 && h->ndim == 3
                   : kind == KIND_IMAGE  ? !isint && (h->ndim == 3 || h->ndim == 4)
                                         : 0;
    if (!ok)
        return bki_fail(BK_ERR_FORMAT,
                        "%s: %s %s is not %s (images: [N, H, W] or [N, H, W, C] uint8 or float32; tokens: [N, L] "
                        "int32 or int64; sets: [N, P, D] float32)",
                        x->name, bki_npy_dtype_name(h->dtype), shape_str(h, sh, sizeof sh),
                        kind == KIND_TOKENS ? "token ids" : kind == KIND_POINTS ? "a set of points" :
                        kind == KIND_IMAGE ? "an image array" : "an array kind (array_kind: auto, image, tokens, points)");
    if (h->shape[0] < 1) return bki_fail(BK_ERR_FORMAT, "%s: no samples (N = 0)", x->name);
    for (int d = 1; d < h->ndim; d++)
        if (h->shape[d] < 1 || h->shape[d] > ARR_MAX_SIDE)
            return bki_fail(BK_ERR_FORMAT, "%s: dimension %d of %s is outside [1, %d]", x->name, d,
                            shape_str(h, sh, sizeof sh), ARR_MAX_SIDE);
    if (h->count / h->shape[0] > ARR_MAX_SAMPLE)
        return bki_fail(BK_ERR_FORMAT, "%s: a sample of %s has more than 2^28 elements", x->name,
                        shape_str(h, sh, sizeof sh));
    if (have_len && kind == KIND_IMAGE)
        return bki_fail(BK_ERR_FORMAT, "%s: lengths are given but x is an image array (lengths go with tokens or sets)",
                        x->name);
    *hwc = 0;
    if (kind == KIND_IMAGE) {
        in->kind = BK_INPUT_IMAGE;
        int c = 1, hh = (int)h->shape[1], ww = (int)h->shape[2];
        if (h->ndim == 4) {
            if (h->shape[3] <= 4) { /* [N, H, W, C] */
                c = (int)h->shape[3];
                *hwc = 1;
            } else if (h->shape[1] <= 4) { /* [N, C, H, W] */
                c = (int)h->shape[1];
                hh = (int)h->shape[2];
                ww = (int)h->shape[3];
            } else {
                return bki_fail(BK_ERR_FORMAT, "%s: image array %s has no channel axis of 1 to 4 (last: [N, H, W, C]; "
                                "second: [N, C, H, W])", x->name, shape_str(h, sh, sizeof sh));
            }
        }
        in->channels = c;
        in->height = hh;
        in->width = ww;
    } else if (kind == KIND_TOKENS) {
        in->kind = BK_INPUT_TOKENS;
        in->max_len = (int)h->shape[1];
    } else {
        in->kind = BK_INPUT_POINTS;
        in->points = (int)h->shape[1];
        in->point_dim = (int)h->shape[2];
    }
    return BK_OK;
}

/* the one pass over x: float inputs finite, token ids in [0, 2^24) (within
 * each row's length); *vocab = largest id + 1 */
static bk_status scan_x(const arr *x, const bk_dataset_info *in, const int32_t *lens, int *vocab)
{
    const int64_t n = x->h.shape[0], per = x->h.count / n;
    int64_t top = 0;
    for (int64_t i = 0; i < n && x->h.dtype != BKI_NPY_U8; i++) { /* (bytes: nothing to check) */
        const int64_t m = !lens ? per : in->kind == BK_INPUT_POINTS ? (int64_t)lens[i] * in->point_dim : lens[i];
        const int64_t base = i * per;
        for (int64_t j = 0; j < m; j++) {
            if (x->h.dtype == BKI_NPY_F32) {
                float v;
                memcpy(&v, x->data + 4 * (size_t)(base + j), 4);
                if (!isfinite(v))
                    return bki_fail(BK_ERR_FORMAT, "%s: sample %lld holds %s at element %lld (byte %llu)", x->name,
                                    (long long)i, isnan(v) ? "NaN" : "Inf", (long long)j,
                                    (unsigned long long)(x->h.offset + 4 * (uint64_t)(base + j)));
                continue;
            }
            const int64_t id = ld_int(x, base + j);
            if (id < 0 || id >= ARR_MAX_VOCAB)
                return bki_fail(BK_ERR_FORMAT, "%s: token id %lld of sample %lld at position %lld (byte %llu) is outside [0, 2^24)",
                                x->name, (long long)id, (long long)i, (long long)j,
                                (unsigned long long)(x->h.offset + (uint64_t)x->h.esize * (uint64_t)(base + j)));
            if (id > top) top = id;
        }
    }
    *vocab = top + 1 < 2 ? 2 : (int)top + 1;
    return BK_OK;
}

/* the version a run records: format, x's dtype and shape, checksums */
static void make_version(const arrset *s, bk_dataset_info *in)
{
    uint64_t h = BKI_FNV_OFFSET;
    for (int k = 0; k < (s->npz ? 1 : 2 + s->have_len); k++) h = bki_fnv1a(h, &s->a[k].sum, sizeof s->a[k].sum);
    char sh[96];
    snprintf(in->version, sizeof in->version, "%s:x %s%s y %s%s%s fnv1a:%016llx", s->npz ? "npz" : "npy",
             bki_npy_dtype_name(s->a[0].h.dtype), shape_str(&s->a[0].h, sh, sizeof sh), bki_npy_dtype_name(s->a[1].h.dtype),
             s->have_len ? " lengths " : "", s->have_len ? bki_npy_dtype_name(s->a[2].h.dtype) : "",
             (unsigned long long)h);
}

/* The whole file's samples of an arrays spec: *in gets kind, n (rows),
 * classes, the kind's shape fields and version; *xs the inputs; *labels [n]
 * and *lens [n] (NULL without a lengths array) are malloc'd. On failure
 * nothing is left allocated or mapped. */
static bk_status load(const char *spec, int array_kind, bk_dataset_info *in, bki_xstore *xs, int32_t **labels,
                      int32_t **lens)
{
    memset(xs, 0, sizeof *xs);
    *labels = *lens = NULL;
    if (array_kind < KIND_AUTO || array_kind > KIND_POINTS)
        return bki_fail(BK_ERR_PARAM, "arrays: array_kind %d is not 0 auto, 1 image, 2 tokens or 3 points", array_kind);
    arrset s;
    bk_status st = open_spec(&s, spec);
    int hwc = 0, vocab = 0;
    const arr *x = &s.a[0];
    if (st == BK_OK) st = classify(x, s.have_len, array_kind, in, &hwc);
    if (st == BK_OK) st = read_ints(&s.a[1], x, "label", 0, ARR_MAX_LABEL - 1, labels);
    if (st == BK_OK && s.have_len)
        st = read_ints(&s.a[2], x, "length", 1, in->kind == BK_INPUT_TOKENS ? in->max_len : in->points, lens);
    if (st == BK_OK) st = scan_x(x, in, *lens, &vocab);
    if (st != BK_OK) {
        free(*labels);
        free(*lens);
        *labels = *lens = NULL;
        set_free(&s);
        return st;
    }
    in->n = x->h.shape[0];
    int top = 0;
    for (int64_t i = 0; i < in->n; i++) top = (*labels)[i] > top ? (*labels)[i] : top;
    in->classes = top + 1 < 2 ? 2 : top + 1;
    if (in->kind == BK_INPUT_TOKENS) in->vocab = vocab;
    make_version(&s, in);
    /* x's store takes over its mapping or buffer; y and lengths are copied */
    xs->x = x->data;
    xs->stride = (size_t)(x->h.bytes / (uint64_t)in->n);
    xs->dtype = x->h.dtype;
    xs->hwc = hwc;
    xs->scale = x->h.dtype == BKI_NPY_U8 ? 1.0f / 255.0f : 1.0f;
    if (s.a[0].owned) {
        xs->owned = s.a[0].owned;
        s.a[0].owned = NULL;
    } else if (s.npz) {
        xs->map = s.zmap;
        xs->map_len = s.zlen;
        s.zmap = NULL;
    } else {
        xs->map = s.a[0].map;
        xs->map_len = s.a[0].map_len;
        s.a[0].map = NULL;
    }
    set_free(&s);
    return BK_OK;
}

bk_status bki_open_arrays(const bki_spec_ctx *ctx, bk_dataset *ds)
{
    return load(ctx->path, ctx->c->array_kind, &ds->info, &ds->xs, &ds->labels, &ds->lens);
}

void bki_xstore_bytes(bki_xstore *xs, const uint8_t *bytes, const bk_dataset_info *in, float scale)
{
    memset(xs, 0, sizeof *xs);
    xs->x = bytes;
    xs->stride = (size_t)in->channels * (size_t)in->height * (size_t)in->width;
    xs->dtype = BKI_NPY_U8;
    xs->scale = scale;
}

void bki_xstore_free(bki_xstore *xs)
{
    if (xs->map) munmap(xs->map, xs->map_len);
    free(xs->owned);
    memset(xs, 0, sizeof *xs);
}

/* n elements of type t from p (unaligned) into float out, times scale */
static void load_f(float *out, const uint8_t *p, size_t n, bki_npy_dtype t, float scale)
{
    if (t == BKI_NPY_U8) {
        for (size_t j = 0; j < n; j++) out[j] = (float)p[j] * scale;
    } else {
        memcpy(out, p, 4 * n);
    }
}

void bki_xstore_fill(const bki_xstore *xs, const bk_dataset_info *in, const int32_t *lens, int64_t i, float *x,
                     int32_t *tok, int32_t *len)
{
    const uint8_t *p = xs->x + (size_t)i * xs->stride;
    if (in->kind == BK_INPUT_IMAGE) {
        const size_t C = (size_t)in->channels, HW = (size_t)in->height * (size_t)in->width;
        if (!xs->hwc || C == 1) {
            load_f(x, p, C * HW, xs->dtype, xs->scale);
            return;
        }
        for (size_t q = 0; q < HW; q++) /* [H, W, C] -> [C, H, W] */
            for (size_t c = 0; c < C; c++) {
                float v;
                if (xs->dtype == BKI_NPY_U8) v = (float)p[q * C + c] * xs->scale;
                else memcpy(&v, p + 4 * (q * C + c), 4);
                x[c * HW + q] = v;
            }
    } else if (in->kind == BK_INPUT_TOKENS) {
        const int L = in->max_len, m = lens ? lens[i] : L;
        for (int j = 0; j < L; j++) {
            if (j >= m) {
                tok[j] = 0;
            } else if (xs->dtype == BKI_NPY_I32) {
                memcpy(&tok[j], p + 4 * (size_t)j, 4);
            } else {
                int64_t v;
                memcpy(&v, p + 8 * (size_t)j, 8);
                tok[j] = (int32_t)v; /* checked at open to lie in [0, 2^24) */
            }
        }
        *len = m;
    } else {
        const int m = lens ? lens[i] : in->points;
        const size_t D = (size_t)in->point_dim, used = (size_t)m * D, all = (size_t)in->points * D;
        load_f(x, p, used, BKI_NPY_F32, 1.0f);
        memset(x + used, 0, sizeof(float) * (all - used));
        if (len) *len = m;
    }
}
