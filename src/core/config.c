/* config.c -- "key=value" configuration: one table of fields per struct
 * drives parsing, validation of the syntax and the text form (models and
 * optimisers, whose text is stored in checkpoints; operators' parameters,
 * which the CLI and the bindings set by name through the registry). */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const bki_field *find(const bki_field *tab, int n, const char *key, size_t klen)
{
    for (int i = 0; i < n; i++)
        if (strlen(tab[i].name) == klen && strncmp(tab[i].name, key, klen) == 0) return &tab[i];
    return NULL;
}

static int parse_i64(const char *v, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) return 0;
    *out = x;
    return 1;
}

void bki_cfg_range(const bki_field *f, char *buf, size_t cap)
{
    if (!cap) return;
    buf[0] = 0;
    if (!(f->lo < f->hi) ||
        (f->type != BKI_F_INT && f->type != BKI_F_I64 && f->type != BKI_F_U64 && f->type != BKI_F_FLOAT))
        return;
    snprintf(buf, cap, "%c%.9g, %.9g]", (f->rflags & BKI_FR_OPEN_LO) ? '(' : '[', f->lo, f->hi);
}

/* the value of a ranged scalar field inside its range */
static bk_status in_range(const void *obj, const bki_field *f, const char *what)
{
    if (!(f->lo < f->hi)) return BK_OK;
    const char *p = (const char *)obj + f->offset;
    double x;
    switch (f->type) {
    case BKI_F_INT: x = *(const int *)p; break;
    case BKI_F_I64: x = (double)*(const int64_t *)p; break;
    case BKI_F_U64: x = (double)*(const uint64_t *)p; break;
    case BKI_F_FLOAT: x = *(const float *)p; break;
    default: return BK_OK;
    }
    int low_ok = (f->rflags & BKI_FR_OPEN_LO) ? x > f->lo : x >= f->lo;
    if (low_ok && x <= f->hi) return BK_OK;
    char r[96];
    bki_cfg_range(f, r, sizeof r);
    return bki_fail(BK_ERR_PARAM, "%s: %s=%.9g is outside %s", what, f->name, x, r);
}

bk_status bki_cfg_check(const void *obj, const bki_field *tab, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        bk_status s = in_range(obj, &tab[i], what);
        if (s) return s;
    }
    return BK_OK;
}

static bk_status set_value(void *obj, const bki_field *f, const char *what, const char *value);

/* a field set from its text, then checked against its range (the field
 * keeps its old value when either fails) */
static bk_status set_field(void *obj, const bki_field *f, const char *what, const char *value)
{
    char *p = (char *)obj + f->offset;
    unsigned char old[sizeof(int64_t) * 64];
    size_t sz = f->type == BKI_F_I64 || f->type == BKI_F_U64 ? sizeof(int64_t)
                : f->type == BKI_F_LIST ? sizeof(int) * (size_t)f->list_len : sizeof(int);
    if (sz > sizeof old) return bki_fail(BK_ERR_PARAM, "%s: bad field table", what);
    memcpy(old, p, sz);
    bk_status s = set_value(obj, f, what, value);
    if (!s) s = in_range(obj, f, what);
    if (s) memcpy(p, old, sz);
    return s;
}

static bk_status set_value(void *obj, const bki_field *f, const char *what, const char *value)
{
    char *p = (char *)obj + f->offset;
    long long iv;
    switch (f->type) {
    case BKI_F_INT:
        if (!parse_i64(value, &iv) || iv < -2147483647LL || iv > 2147483647LL)
            return bki_fail(BK_ERR_PARAM, "%s: %s=%s is not an integer", what, f->name, value);
        *(int *)p = (int)iv;
        return BK_OK;
    case BKI_F_I64:
        if (!parse_i64(value, &iv)) return bki_fail(BK_ERR_PARAM, "%s: %s=%s is not an integer", what, f->name, value);
        *(int64_t *)p = (int64_t)iv;
        return BK_OK;
    case BKI_F_U64: {
        char *end;
        errno = 0;
        unsigned long long u = strtoull(value, &end, 10);
        if (value[0] < '0' || value[0] > '9' || errno || end == value || *end)
            return bki_fail(BK_ERR_PARAM, "%s: %s=%s is not an integer in [0, 18446744073709551615]", what, f->name,
                            value);
        *(uint64_t *)p = (uint64_t)u;
        return BK_OK;
    }
    case BKI_F_FLOAT: {
        char *end;
        errno = 0;
        float x = strtof(value, &end);
        if (errno || end == value || *end || !isfinite(x))
            return bki_fail(BK_ERR_PARAM, "%s: %s=%s is not a finite number", what, f->name, value);
        *(float *)p = x;
        return BK_OK;
    }
    case BKI_F_ENUM:
        for (int i = 0; f->names[i]; i++)
            if (strcmp(f->names[i], value) == 0) {
                *(int *)p = i;
                return BK_OK;
            }
        {
            char opts[256] = "";
            for (int i = 0; f->names[i]; i++) {
                if (i) strncat(opts, "|", sizeof opts - strlen(opts) - 1);
                strncat(opts, f->names[i], sizeof opts - strlen(opts) - 1);
            }
            return bki_fail(BK_ERR_PARAM, "%s: unknown %s '%s' (expected %s)", what, f->name, value, opts);
        }
    case BKI_F_LIST: {
        /* colon-separated non-negative integers, at most list_len; "" = none */
        int tmp[64] = {0}, cnt = 0;
        const char *s = value;
        while (*s) {
            char item[32];
            size_t k = strcspn(s, ":");
            if (k == 0 || k >= sizeof item || cnt >= f->list_len)
                return bki_fail(BK_ERR_PARAM, "%s: %s=%s: expected up to %d colon-separated integers", what, f->name,
                                value, f->list_len);
            memcpy(item, s, k);
            item[k] = 0;
            if (!parse_i64(item, &iv) || iv < 1 || iv > 2147483647LL)
                return bki_fail(BK_ERR_PARAM, "%s: %s=%s: entries must be positive integers", what, f->name, value);
            tmp[cnt++] = (int)iv;
            s += k;
            if (*s == ':') s++;
        }
        memcpy(p, tmp, sizeof(int) * (size_t)f->list_len);
        return BK_OK;
    }
    }
    return bki_fail(BK_ERR_PARAM, "%s: bad field table", what);
}

bk_status bki_cfg_set(void *obj, const bki_field *tab, int n, const char *what, const char *key, const char *value)
{
    if (!obj || !key || !value) return bki_fail(BK_ERR_NULL, "%s: NULL key or value", what);
    const bki_field *f = find(tab, n, key, strlen(key));
    if (!f) return bki_fail(BK_ERR_PARAM, "%s: unknown key '%s'", what, key);
    return set_field(obj, f, what, value);
}

bk_status bki_cfg_parse(void *obj, const bki_field *tab, int n, const char *what, const char *text)
{
    if (!obj || !text) return bki_fail(BK_ERR_NULL, "%s: NULL text", what);
    const char *s = text;
    while (*s) {
        s += strspn(s, ", \t\r\n");
        if (!*s) break;
        size_t len = strcspn(s, ", \t\r\n");
        const char *eq = memchr(s, '=', len);
        if (!eq) return bki_fail(BK_ERR_PARAM, "%s: '%.*s' is not key=value", what, (int)len, s);
        const bki_field *f = find(tab, n, s, (size_t)(eq - s));
        if (!f) return bki_fail(BK_ERR_PARAM, "%s: unknown key '%.*s'", what, (int)(eq - s), s);
        char value[128];
        size_t vl = len - (size_t)(eq + 1 - s);
        if (vl >= sizeof value) return bki_fail(BK_ERR_PARAM, "%s: value of %s too long", what, f->name);
        memcpy(value, eq + 1, vl);
        value[vl] = 0;
        bk_status st = set_field(obj, f, what, value);
        if (st) return st;
        s += len;
    }
    return BK_OK;
}

size_t bki_cfg_format(const void *obj, const bki_field *tab, int n, char *buf, size_t cap)
{
    size_t used = 0, written = 0;
    int full = 0;
    char line[512];
    for (int i = 0; i < n; i++) {
        const char *p = (const char *)obj + tab[i].offset;
        int k = 0;
        switch (tab[i].type) {
        case BKI_F_INT: k = snprintf(line, sizeof line, "%s=%d\n", tab[i].name, *(const int *)p); break;
        case BKI_F_I64: k = snprintf(line, sizeof line, "%s=%lld\n", tab[i].name, (long long)*(const int64_t *)p); break;
        case BKI_F_U64:
            k = snprintf(line, sizeof line, "%s=%llu\n", tab[i].name, (unsigned long long)*(const uint64_t *)p);
            break;
        case BKI_F_FLOAT: k = snprintf(line, sizeof line, "%s=%.9g\n", tab[i].name, (double)*(const float *)p); break;
        case BKI_F_ENUM: {
            int v = *(const int *)p, cnt = 0;
            while (tab[i].names[cnt]) cnt++;
            k = snprintf(line, sizeof line, "%s=%s\n", tab[i].name, v >= 0 && v < cnt ? tab[i].names[v] : "?");
            break;
        }
        case BKI_F_LIST: {
            const int *a = (const int *)p;
            k = snprintf(line, sizeof line, "%s=", tab[i].name);
            for (int j = 0; j < tab[i].list_len && a[j] > 0 && k < (int)sizeof line - 16; j++)
                k += snprintf(line + k, sizeof line - (size_t)k, j ? ":%d" : "%d", a[j]);
            k += snprintf(line + k, sizeof line - (size_t)k, "\n");
            break;
        }
        }
        if (k < 0) k = 0;
        if (buf && !full && used + (size_t)k < cap) {
            memcpy(buf + used, line, (size_t)k);
            written = used + (size_t)k;
        } else {
            full = 1; /* whole lines only, like a truncated snprintf */
        }
        used += (size_t)k;
    }
    if (buf && cap) buf[written] = 0;
    return used;
}
