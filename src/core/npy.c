/* npy.c -- minimal, strict .npy (format 1.0/2.0/3.0) reader and writer for
 * little-endian float32 and int32 C-order arrays (written through the output
 * sets of outfile.c). */
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

static bk_status parse_header(const char *path, const char *hdr, bk_npy *out)
{
    const char *v = dict_value(hdr, "descr");
    if (!v) return bki_fail(BK_ERR_FORMAT, "%s: .npy header has no 'descr'", path);
    if (strncmp(v, "'<f4'", 5) == 0) out->dtype = BK_F32;
    else if (strncmp(v, "'<i4'", 5) == 0) out->dtype = BK_I32;
    else {
        char got[16] = {0};
        strncpy(got, v, sizeof got - 1);
        char *e = strchr(got, ',');
        if (e) *e = 0;
        return bki_fail(BK_ERR_FORMAT, "%s: dtype %s not supported (need '<f4' float32 or '<i4' int32)", path, got);
    }
    v = dict_value(hdr, "fortran_order");
    if (!v) return bki_fail(BK_ERR_FORMAT, "%s: .npy header has no 'fortran_order'", path);
    if (strncmp(v, "False", 5) != 0) return bki_fail(BK_ERR_FORMAT, "%s: Fortran-order arrays are not supported", path);
    v = dict_value(hdr, "shape");
    if (!v || *v != '(') return bki_fail(BK_ERR_FORMAT, "%s: .npy header has no valid 'shape'", path);
    v++;
    out->ndim = 0;
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
        v = end;
        while (*v == ' ') v++;
        if (*v == ',') v++;
        else if (*v != ')') return bki_fail(BK_ERR_FORMAT, "%s: malformed shape in .npy header", path);
    }
    return BK_OK;
}

bk_status bk_npy_read(const char *path, bk_npy *out)
{
    if (!path || !out) return bki_fail(BK_ERR_NULL, "bk_npy_read: NULL argument");
    memset(out, 0, sizeof *out);
    FILE *fp = fopen(path, "rb");
    if (!fp) return bki_fail(BK_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    unsigned char pre[12];
    bk_status s = BK_OK;
    char *hdr = NULL;
    if (fread(pre, 1, 10, fp) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        s = bki_fail(BK_ERR_FORMAT, "%s: not a .npy file (bad magic)", path);
        goto done;
    }
    size_t hlen;
    if (pre[6] == 1) {
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 10, 1, 2, fp) != 2) { s = bki_fail(BK_ERR_FORMAT, "%s: truncated header", path); goto done; }
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)pre[10] << 16) | ((size_t)pre[11] << 24);
    } else {
        s = bki_fail(BK_ERR_FORMAT, "%s: unsupported .npy version %d", path, pre[6]);
        goto done;
    }
    if (hlen > (1u << 20)) { s = bki_fail(BK_ERR_FORMAT, "%s: header too long", path); goto done; }
    hdr = malloc(hlen + 1);
    if (!hdr) { s = bki_fail(BK_ERR_NOMEM, "%s: out of memory", path); goto done; }
    if (fread(hdr, 1, hlen, fp) != hlen) { s = bki_fail(BK_ERR_FORMAT, "%s: truncated header", path); goto done; }
    hdr[hlen] = 0;
    if ((s = parse_header(path, hdr, out))) goto done;
    int64_t count = bk_npy_count(out);
    if (count > ((int64_t)1 << 34)) { s = bki_fail(BK_ERR_FORMAT, "%s: array too large", path); goto done; }
    size_t bytes = (size_t)count * 4;
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
    free(hdr);
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
