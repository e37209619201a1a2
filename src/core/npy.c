/* npy.c -- the one parser of .npy headers (format 1.0/2.0/3.0), over memory
 * (bki_npy_header: the dataset readers use it on mapped files and .npz
 * members), and a minimal, strict reader and writer of whole little-endian
 * float32 and int32 C-order arrays (bk_npy_read / bk_npy_write, written
 * through the output sets of outfile.c). */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void bk_npy_free(bk_npy *a)
{
    if (!a) return;
    free(a->data);
    a->data = NULL;
}

int64_t bk_npy_count(const bk_npy *a)
{
    int64_t c = 1;
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] > 0 && c > INT64_MAX / a->shape[i]) return INT64_MAX; /* saturates: "too large" */
        c *= a->shape[i];
    }
    return c;
}

/* Finds "'key':" in the header dict and returns a pointer after the colon. */
static const char *dict_value(const char *hdr, const char *key)
{
    char pat[32];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *p = strstr(hdr, pat);
    if (!p) return NULL;
    p += strlen(pat);
    while (*p == ' ') p++;
    if (*p != ':') return NULL;
    p++;
    while (*p == ' ') p++;
    return p;
}

/* the element types a header may name (numpy writes '|u1' for uint8; other
 * writers, cnpy among them, '<u1') */
static const struct {
    const char *descr;
    bki_npy_dtype dtype;
    int size;
} DTYPES[] = {
    {"'<f4'", BKI_NPY_F32, 4}, {"'<i4'", BKI_NPY_I32, 4}, {"'<i8'", BKI_NPY_I64, 8},
    {"'|u1'", BKI_NPY_U8, 1},  {"'<u1'", BKI_NPY_U8, 1},
};

const char *bki_npy_dtype_name(bki_npy_dtype t)
{
    switch (t) {
    case BKI_NPY_F32: return "float32";
    case BKI_NPY_I32: return "int32";
    case BKI_NPY_I64: return "int64";
    default: return "uint8";
    }
}

static bk_status parse_dict(const char *path, const char *hdr, bki_npy_head *out)
{
    const char *v = dict_value(hdr, "descr");
    if (!v) return bki_fail(BK_ERR_FORMAT, "%s: .npy header has no 'descr'", path);
    size_t k = 0;
    while (k < sizeof DTYPES / sizeof DTYPES[0] && strncmp(v, DTYPES[k].descr, 5) != 0) k++;
    if (k == sizeof DTYPES / sizeof DTYPES[0]) {
        char got[16] = {0};
        strncpy(got, v, sizeof got - 1);
        char *e = strchr(got, ',');
        if (e) *e = 0;
        return bki_fail(BK_ERR_FORMAT,
                        "%s: dtype %s not supported (need '<f4' float32, '|u1' uint8, '<i4' int32 or '<i8' int64, "
                        "little-endian)",
                        path, got);
    }
    out->dtype = DTYPES[k].dtype;
    out->esize = DTYPES[k].size;
    v = dict_value(hdr, "fortran_order");
    if (!v) return bki_fail(BK_ERR_FORMAT, "%s: .npy header has no 'fortran_order'", path);
    if (strncmp(v, "False", 5) != 0)
        return bki_fail(BK_ERR_FORMAT, "%s: Fortran-order arrays are not supported (save np.ascontiguousarray(a))",
                        path);
    v = dict_value(hdr, "shape");
    if (!v || *v != '(') return bki_fail(BK_ERR_FORMAT, "%s: .npy header has no valid 'shape'", path);
    v++;
    out->ndim = 0;
    out->count = 1;
    for (;;) {
        while (*v == ' ') v++;
        if (*v == ')') break;
        if (*v < '0' || *v > '9') return bki_fail(BK_ERR_FORMAT, "%s: malformed shape in .npy header", path);
        errno = 0;
        char *end;
        long long x = strtoll(v, &end, 10);
        if (errno || x < 0 || x > ((long long)1 << 40)) return bki_fail(BK_ERR_FORMAT, "%s: shape entry out of range", path);
        if (out->ndim == 8) return bki_fail(BK_ERR_FORMAT, "%s: more than 8 dimensions", path);
        out->shape[out->ndim++] = x;
        if (x > 0 && out->count > BKI_NPY_MAX_COUNT / x)
            return bki_fail(BK_ERR_FORMAT, "%s: array too large (more than 2^40 elements)", path);
        out->count *= x;
        v = end;
        while (*v == ' ') v++;
        if (*v == ',') v++;
        else if (*v != ')') return bki_fail(BK_ERR_FORMAT, "%s: malformed shape in .npy header", path);
    }
    return BK_OK;
}

/* The preamble: the magic, the version and the header's length. Returns the
 * preamble's size (10 or 12) and sets *hlen, or 0 after a message. */
static size_t preamble(const char *path, const uint8_t *b, size_t n, size_t *hlen)
{
    if (n == 0) {
        bki_fail(BK_ERR_FORMAT, "%s: empty file (not a .npy file)", path);
        return 0;
    }
    if (memcmp(b, "\x93NUMPY", n < 6 ? n : 6) != 0) {
        bki_fail(BK_ERR_FORMAT, "%s: not a .npy file (bad magic)", path);
        return 0;
    }
    if (n >= 7 && (b[6] < 1 || b[6] > 3)) {
        bki_fail(BK_ERR_FORMAT, "%s: unsupported .npy version %d", path, b[6]);
        return 0;
    }
    const size_t pre = n >= 7 && b[6] == 1 ? 10 : 12;
    if (n < pre) {
        bki_fail(BK_ERR_FORMAT, "%s: truncated header (%zu bytes)", path, n);
        return 0;
    }
    *hlen = (size_t)b[8] | (size_t)b[9] << 8;
    if (pre == 12) *hlen |= (size_t)b[10] << 16 | (size_t)b[11] << 24;
    if (*hlen > (1u << 20)) {
        bki_fail(BK_ERR_FORMAT, "%s: header too long (%zu bytes; at most 1 MiB)", path, *hlen);
        return 0;
    }
    return pre;
}

bk_status bki_npy_header(const char *path, const void *buf, size_t n, bki_npy_head *out)
{
    memset(out, 0, sizeof *out);
    const uint8_t *b = buf;
    size_t hlen = 0, pre = preamble(path, b, n, &hlen);
    if (!pre) return BK_ERR_FORMAT;
    if (n - pre < hlen)
        return bki_fail(BK_ERR_FORMAT, "%s: truncated header (%zu of %zu bytes)", path, n - pre, hlen);
    char *hdr = malloc(hlen + 1);
    if (!hdr) return bki_fail(BK_ERR_NOMEM, "%s: out of memory", path);
    memcpy(hdr, b + pre, hlen);
    hdr[hlen] = 0;
    bk_status s = parse_dict(path, hdr, out);
    free(hdr);
    out->offset = pre + hlen;
    out->bytes = (uint64_t)out->count * (uint64_t)out->esize;
    if (s != BK_OK) memset(out, 0, sizeof *out);
    return s;
}

bk_status bk_npy_read(const char *path, bk_npy *out)
{
    if (!path || !out) return bki_fail(BK_ERR_NULL, "bk_npy_read: NULL argument");
    memset(out, 0, sizeof *out);
    FILE *fp = fopen(path, "rb");
    if (!fp) return bki_fail(BK_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    uint8_t *head = malloc(12);
    bk_status s = BK_OK;
    size_t got = head ? fread(head, 1, 12, fp) : 0, hlen = 0;
    size_t pre = head ? preamble(path, head, got, &hlen) : 0;
    uint8_t *h2 = pre ? realloc(head, pre + hlen) : NULL;
    bki_npy_head h;
    if (!head || (pre && !h2)) s = bki_fail(BK_ERR_NOMEM, "%s: out of memory", path);
    else if (!pre) s = BK_ERR_FORMAT;
    else {
        head = h2;
        if (got > pre) got = pre; /* the header starts at pre */
        if (fseek(fp, (long)pre, SEEK_SET) != 0) s = bki_fail(BK_ERR_IO, "%s: cannot seek", path);
        else s = bki_npy_header(path, head, pre + fread(head + pre, 1, hlen, fp), &h);
    }
    free(head);
    if (s == BK_OK && h.dtype != BKI_NPY_F32 && h.dtype != BKI_NPY_I32)
        s = bki_fail(BK_ERR_FORMAT, "%s: dtype %s not supported (need '<f4' float32 or '<i4' int32)", path,
                     bki_npy_dtype_name(h.dtype));
    if (s == BK_OK && h.count > ((int64_t)1 << 34)) s = bki_fail(BK_ERR_FORMAT, "%s: array too large", path);
    if (s != BK_OK) {
        fclose(fp);
        return s;
    }
    out->dtype = h.dtype == BKI_NPY_F32 ? BK_F32 : BK_I32;
    out->ndim = h.ndim;
    memcpy(out->shape, h.shape, sizeof out->shape);
    size_t bytes = (size_t)h.bytes;
    {
        /* the file must hold the data before we allocate for it */
        long here = ftell(fp), end = -1;
        if (here >= 0 && fseek(fp, 0, SEEK_END) == 0) end = ftell(fp);
        if (end < 0 || fseek(fp, here, SEEK_SET) != 0) { s = bki_fail(BK_ERR_IO, "%s: cannot seek", path); goto done; }
        if ((uint64_t)(end - here) < (uint64_t)bytes) {
            s = bki_fail(BK_ERR_FORMAT, "%s: truncated data (expected %zu bytes, the file has %ld)", path, bytes, end - here);
            goto done;
        }
    }
    out->data = malloc(bytes ? bytes : 1);
    if (!out->data) { s = bki_fail(BK_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, bytes); goto done; }
    if (fread(out->data, 1, bytes, fp) != bytes) {
        s = bki_fail(BK_ERR_FORMAT, "%s: truncated data (expected %zu bytes)", path, bytes);
        goto done;
    }
    if (fgetc(fp) != EOF) { s = bki_fail(BK_ERR_FORMAT, "%s: trailing bytes after the array data", path); goto done; }
done:
    fclose(fp);
    if (s) bk_npy_free(out);
    return s;
}

bk_status bk_outset_add_npy(bk_outset *set, const char *path, unsigned flags, bk_dtype dtype, int ndim,
                            const int64_t *shape, const void *data)
{
    bki_clear_error();
    if (!set || !path || (!shape && ndim > 0) || !data) return bki_fail(BK_ERR_NULL, "bk_npy_write: NULL argument");
    if (ndim < 0 || ndim > 8) return bki_fail(BK_ERR_SHAPE, "bk_npy_write: ndim %d outside [0, 8]", ndim);
    if (dtype != BK_F32 && dtype != BK_I32) return bki_fail(BK_ERR_PARAM, "bk_npy_write: unknown dtype");
    char dict[512];
    int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                       dtype == BK_F32 ? "<f4" : "<i4");
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return bki_fail(BK_ERR_SHAPE, "bk_npy_write: negative dimension");
        if (shape[i] > 0 && count > ((int64_t)1 << 34) / shape[i])
            return bki_fail(BK_ERR_SHAPE, "bk_npy_write: the array is too large (more than 2^34 elements)");
        count *= shape[i];
        len += snprintf(dict + len, sizeof dict - (size_t)len, "%lld%s", (long long)shape[i],
                        ndim == 1 ? "," : (i + 1 < ndim ? ", " : ""));
    }
    len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
    /* pad with spaces so that magic+len+header is a multiple of 64, ending in \n */
    int total = 10 + len + 1;
    int pad = (64 - total % 64) % 64;
    char hdr[640];
    memcpy(hdr, dict, (size_t)len);
    memset(hdr + len, ' ', (size_t)pad);
    hdr[len + pad] = '\n';
    int hlen = len + pad + 1;

    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    const void *parts[3] = {pre, hdr, data};
    const size_t sizes[3] = {10, (size_t)hlen, 4 * (size_t)count};
    return bk_outset_add(set, path, flags, 3, parts, sizes);
}

bk_status bk_npy_write(const char *path, bk_dtype dtype, int ndim, const int64_t *shape, const void *data)
{
    bki_clear_error();
    bk_outset *set = bk_outset_create();
    return bki_outset_done(set, set ? bk_outset_add_npy(set, path, 0, dtype, ndim, shape, data) : BK_ERR_NOMEM);
}
