/* npz.c -- the zip container of .npz files (numpy's np.savez: stored
 * members; np.savez_compressed: deflated members), over memory: the central
 * directory listed and checked against the archive's bounds (zip64 records
 * included: numpy writes its members with zip64 local headers), and a
 * member's data (a pointer into the archive when stored, raw inflate into a
 * buffer when deflated), its size and CRC-32 checked. The .npy arrays inside
 * are parsed by npy.c's bki_npy_header. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static uint32_t le16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t le32(const uint8_t *p) { return le16(p) | le16(p + 2) << 16; }
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define SIG_CEN 0x02014b50u
#define SIG_LOCAL 0x04034b50u

/* the end of central directory: *cd_off, *cd_size, *entries (zip64 when
 * the classic record says so) */
static bk_status find_end(const char *path, const uint8_t *b, size_t n, uint64_t *cd_off, uint64_t *cd_size,
                          uint64_t *entries)
{
    if (n < 22) return bki_fail(BK_ERR_FORMAT, "%s: %zu bytes, too short for a zip archive (.npz)", path, n);
    size_t e = n - 22, stop = n - 22 > 65535 ? n - 22 - 65535 : 0;
    while (le32(b + e) != SIG_EOCD || e + 22 + le16(b + e + 20) > n) {
        if (e == stop)
            return bki_fail(BK_ERR_FORMAT, "%s: not a zip archive (.npz): no end of central directory record", path);
        e--;
    }
    if (le16(b + e + 4) != 0 || le16(b + e + 6) != 0 || le16(b + e + 8) != le16(b + e + 10))
        return bki_fail(BK_ERR_FORMAT, "%s: a multi-disk zip archive (byte %zu) is not supported", path, e);
    *entries = le16(b + e + 10);
    *cd_size = le32(b + e + 12);
    *cd_off = le32(b + e + 16);
    if (*entries != 0xffff && *cd_size != 0xffffffffu && *cd_off != 0xffffffffu) return BK_OK;
    /* zip64: the locator just before the classic record, then the record */
    if (e < 20 || le32(b + e - 20) != SIG_LOC64)
        return bki_fail(BK_ERR_FORMAT, "%s: zip64 end record expected before byte %zu, none found", path, e);
    const uint64_t z = le64(b + e - 12);
    if (z > n - 20 || n - 20 - z < 56 || le32(b + z) != SIG_EOCD64)
        return bki_fail(BK_ERR_FORMAT, "%s: the zip64 end of central directory record (byte %llu) is missing or cut short",
                        path, (unsigned long long)z);
    if (le32(b + z + 16) != 0 || le32(b + z + 20) != 0 || le64(b + z + 24) != le64(b + z + 32))
        return bki_fail(BK_ERR_FORMAT, "%s: a multi-disk zip archive (byte %llu) is not supported", path,
                        (unsigned long long)z);
    *entries = le64(b + z + 32);
    *cd_size = le64(b + z + 40);
    *cd_off = le64(b + z + 48);
    return BK_OK;
}

/* the zip64 extended information of a central directory entry: the fields
 * that are 0xffffffff in the entry, in the order usize, csize, offset */
static bk_status zip64_extra(const char *path, const uint8_t *x, size_t xlen, size_t at, uint64_t *usize,
                             uint64_t *csize, uint64_t *off)
{
    uint64_t *want[3] = {*usize == 0xffffffffu ? usize : NULL, *csize == 0xffffffffu ? csize : NULL,
                         *off == 0xffffffffu ? off : NULL};
    if (!want[0] && !want[1] && !want[2]) return BK_OK;
    for (size_t i = 0; i + 4 <= xlen;) {
        const uint32_t id = le16(x + i), len = le16(x + i + 2);
        if (len > xlen - i - 4) break;
        if (id == 1) {
            size_t k = 0;
            for (int f = 0; f < 3; f++) {
                if (!want[f]) continue;
                if (k + 8 > len)
                    return bki_fail(BK_ERR_FORMAT, "%s: zip64 extra field of the entry at byte %zu is cut short", path, at);
                *want[f] = le64(x + i + 4 + k);
                k += 8;
            }
            return BK_OK;
        }
        i += 4 + len;
    }
    return bki_fail(BK_ERR_FORMAT, "%s: the entry at byte %zu needs a zip64 extra field and has none", path, at);
}

/* one central directory entry at b[at..] (its bounds checked by the caller
 * up to 46 bytes); *next: the byte after it */
static bk_status read_entry(const char *path, const uint8_t *b, size_t n, size_t at, size_t end, bki_zip_member *m,
                            size_t *next)
{
    if (le32(b + at) != SIG_CEN)
        return bki_fail(BK_ERR_FORMAT, "%s: central directory entry expected at byte %zu", path, at);
    const uint32_t flags = le16(b + at + 8), method = le16(b + at + 10), nlen = le16(b + at + 28),
                   xlen = le16(b + at + 30), clen = le16(b + at + 32);
    if ((size_t)nlen + xlen + clen > end - at - 46)
        return bki_fail(BK_ERR_FORMAT, "%s: the central directory entry at byte %zu runs past the directory", path, at);
    *next = at + 46 + nlen + xlen + clen;
    memset(m, 0, sizeof *m);
    if (nlen < sizeof m->name) memcpy(m->name, b + at + 46, nlen); /* longer: listed without a name */
    if (flags & 1) return bki_fail(BK_ERR_FORMAT, "%s: member '%s' (byte %zu) is encrypted", path, m->name, at);
    if (method != 0 && method != 8)
        return bki_fail(BK_ERR_FORMAT, "%s: member '%s' (byte %zu) uses compression method %u (only stored and deflated)",
                        path, m->name, at, method);
    m->method = (int)method;
    m->crc = le32(b + at + 16);
    m->csize = le32(b + at + 20);
    m->usize = le32(b + at + 24);
    uint64_t loc = le32(b + at + 42);
    bk_status st = zip64_extra(path, b + at + 46 + nlen, xlen, at, &m->usize, &m->csize, &loc);
    if (st != BK_OK) return st;
    if (loc > n || n - loc < 30 || le32(b + loc) != SIG_LOCAL)
        return bki_fail(BK_ERR_FORMAT, "%s: member '%s': no local header at byte %llu", path, m->name,
                        (unsigned long long)loc);
    const uint32_t lnlen = le16(b + loc + 26), lxlen = le16(b + loc + 28);
    if (lnlen != nlen || (uint64_t)lnlen + lxlen > n - loc - 30 || memcmp(b + loc + 30, b + at + 46, nlen) != 0)
        return bki_fail(BK_ERR_FORMAT, "%s: member '%s': the local header at byte %llu does not match the directory",
                        path, m->name, (unsigned long long)loc);
    m->offset = loc + 30 + lnlen + lxlen;
    if (m->csize > n - m->offset)
        return bki_fail(BK_ERR_FORMAT, "%s: member '%s': %llu bytes at byte %llu run past the end of the file (%zu bytes)",
                        path, m->name, (unsigned long long)m->csize, (unsigned long long)m->offset, n);
    if (method == 0 && m->csize != m->usize)
        return bki_fail(BK_ERR_FORMAT, "%s: stored member '%s' (byte %zu): sizes %llu and %llu differ", path, m->name,
                        at, (unsigned long long)m->csize, (unsigned long long)m->usize);
    return BK_OK;
}

bk_status bki_zip_list(const char *path, const uint8_t *b, size_t n, bki_zip_member *m, int *count)
{
    uint64_t cd_off = 0, cd_size = 0, entries = 0;
    bk_status st = find_end(path, b, n, &cd_off, &cd_size, &entries);
    if (st != BK_OK) return st;
    if (cd_off > n || cd_size > n - cd_off)
        return bki_fail(BK_ERR_FORMAT, "%s: the central directory (byte %llu, %llu bytes) lies outside the file", path,
                        (unsigned long long)cd_off, (unsigned long long)cd_size);
    if (entries > BKI_ZIP_MAX_MEMBERS)
        return bki_fail(BK_ERR_FORMAT, "%s: %llu members (at most %d)", path, (unsigned long long)entries,
                        BKI_ZIP_MAX_MEMBERS);
    const size_t end = (size_t)(cd_off + cd_size);
    size_t at = (size_t)cd_off;
    for (uint64_t i = 0; i < entries; i++) {
        if (end - at < 46)
            return bki_fail(BK_ERR_FORMAT, "%s: the central directory ends at byte %zu, inside entry %llu of %llu", path,
                            end, (unsigned long long)i + 1, (unsigned long long)entries);
        if ((st = read_entry(path, b, n, at, end, &m[i], &at)) != BK_OK) return st;
        for (uint64_t j = 0; j < i; j++)
            if (m[i].name[0] && strcmp(m[i].name, m[j].name) == 0)
                return bki_fail(BK_ERR_FORMAT, "%s: two members named '%s'", path, m[i].name);
    }
    *count = (int)entries;
    return BK_OK;
}

/* CRC-32 over any size (zlib's crc32 takes an unsigned int length) */
static uint32_t crc_of(const uint8_t *p, uint64_t n)
{
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        const unsigned k = n > (1u << 30) ? 1u << 30 : (unsigned)n;
        c = crc32(c, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}

static bk_status inflate_member(const char *path, const uint8_t *src, const bki_zip_member *m, uint8_t *dst)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, -15) != Z_OK) return bki_fail(BK_ERR_NOMEM, "%s: cannot start zlib", path);
    /* one byte of room more than the directory says, so that a stream that
     * inflates to more is seen */
    uint64_t in_left = m->csize, out_left = m->usize + 1;
    int r = Z_OK;
    z.next_in = (Bytef *)(uintptr_t)src;
    z.next_out = dst;
    while (r == Z_OK) {
        if (z.avail_in == 0 && in_left > 0) {
            z.avail_in = in_left > (1u << 30) ? 1u << 30 : (uInt)in_left;
            in_left -= z.avail_in;
        }
        if (z.avail_out == 0 && out_left > 0) {
            z.avail_out = out_left > (1u << 30) ? 1u << 30 : (uInt)out_left;
            out_left -= z.avail_out;
        }
        r = inflate(&z, Z_NO_FLUSH); /* Z_BUF_ERROR: input or room used up */
    }
    const uint64_t got = (uint64_t)z.total_out;
    inflateEnd(&z);
    if (r != Z_STREAM_END || got != m->usize)
        return bki_fail(BK_ERR_FORMAT, "%s: member '%s' (byte %llu) does not inflate to its %llu bytes (%s)", path,
                        m->name, (unsigned long long)m->offset, (unsigned long long)m->usize,
                        r == Z_STREAM_END ? "another size" : r == Z_DATA_ERROR ? "corrupt deflate data" : "cut short");
    return BK_OK;
}

bk_status bki_zip_data(const char *path, const uint8_t *buf, const bki_zip_member *m, uint64_t max_bytes,
                       const uint8_t **data, void **owned)
{
    *data = NULL;
    *owned = NULL;
    const uint8_t *src = buf + m->offset;
    uint8_t *out = NULL;
    if (m->method == 8) {
        if (m->usize > max_bytes || m->usize > SIZE_MAX - 1)
            return bki_fail(BK_ERR_FORMAT, "%s: member '%s' inflates to %llu bytes (at most %llu)", path, m->name,
                            (unsigned long long)m->usize, (unsigned long long)max_bytes);
        out = malloc((size_t)m->usize + 1);
        if (!out)
            return bki_fail(BK_ERR_NOMEM, "%s: cannot allocate %llu bytes to inflate member '%s'", path,
                            (unsigned long long)m->usize, m->name);
        bk_status st = inflate_member(path, src, m, out);
        if (st != BK_OK) {
            free(out);
            return st;
        }
        src = out;
    }
    if (crc_of(src, m->usize) != m->crc) {
        free(out);
        return bki_fail(BK_ERR_FORMAT, "%s: member '%s' (byte %llu): CRC-32 mismatch (corrupt archive)", path, m->name,
                        (unsigned long long)m->offset);
    }
    *data = src;
    *owned = out;
    return BK_OK;
}
