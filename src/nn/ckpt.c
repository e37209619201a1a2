/* ckpt.c -- checkpoints as safetensors files (docs/MODEL.md): parameters by
 * name, optional optimiser state, configuration and RNG counters in the
 * metadata, FNV-1a-64 checksum of the data section, atomic writes, strict
 * reading (a truncated or corrupt file is refused). */
#include "nn.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HEADER (64u << 20)

/* ---- a growing string ---- */
typedef struct {
    char *s;
    size_t n, cap;
    int bad;
} sbuf;

static void sb_put(sbuf *b, const char *t, size_t n)
{
    if (b->bad) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->bad = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, t, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void sb_str(sbuf *b, const char *t) { sb_put(b, t, strlen(t)); }
static void sb_json(sbuf *b, const char *t) /* a JSON string literal */
{
    sb_put(b, "\"", 1);
    for (; *t; t++) {
        char e[8];
        unsigned char ch = (unsigned char)*t;
        if (ch == '"' || ch == '\\') {
            e[0] = '\\';
            e[1] = (char)ch;
            sb_put(b, e, 2);
        } else if (ch == '\n') {
            sb_put(b, "\\n", 2);
        } else if (ch < 0x20) {
            snprintf(e, sizeof e, "\\u%04x", ch);
            sb_put(b, e, 6);
        } else {
            sb_put(b, (const char *)&ch, 1);
        }
    }
    sb_put(b, "\"", 1);
}

char *bki_json_string(const char *t)
{
    sbuf b = {0};
    sb_json(&b, t);
    if (b.bad) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* ---- a strict little JSON reader for the header ----
 * The header is the fixed shape of a safetensors header: one object whose
 * members are "__metadata__" (an object of strings) and the tensors (each an
 * object of exactly "dtype", "shape" and "data_offsets"), so the reader needs
 * no recursion. Every string is decoded into one arena of the header's size
 * (a decoded string and its NUL never take more bytes than its quoted text),
 * so that the memory a header costs is bounded by its length: the arena, and
 * per tensor one entry of the table (which at least 48 header bytes make). */
typedef struct {
    const char *p, *end;
    const char *base; /* the header's first byte (file offset 8) */
    char *arena;      /* the decoded strings, one after the other       */
    size_t an;        /* bytes of the arena used                        */
    char why[200];    /* what jstr found wrong, for the caller's message */
} jcur;

static void jws(jcur *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}
static int jlit(jcur *j, char ch)
{
    jws(j);
    if (j->p < j->end && *j->p == ch) {
        j->p++;
        return 1;
    }
    return 0;
}
static int hexval(char h)
{
    if (h >= '0' && h <= '9') return h - '0';
    if (h >= 'a' && h <= 'f') return h - 'a' + 10;
    if (h >= 'A' && h <= 'F') return h - 'A' + 10;
    return -1;
}
/* the length of the well-formed UTF-8 sequence at s (at most n bytes), or 0:
 * no overlong forms, no surrogates, nothing above U+10FFFF (Python's strict
 * decoder, which birkhoff.models reads headers with, decides the same) */
static size_t utf8_len(const unsigned char *s, size_t n) /* 0: malformed or cut */
{
    uint32_t cp;
    const int k = bki_utf8_seq(s, n, &cp);
    return k > 0 ? (size_t)k : 0;
}
/* A string, decoded into the arena, strictly as RFC 8259 reads it: the
 * escapes \" \\ \/ \b \f \n \r \t \uXXXX, no raw control character
 * (U+0000..U+001F) inside, well-formed UTF-8. \u0000 (a C string cannot
 * hold it) and escapes above U+007F (bk_checkpoint_save writes such
 * characters as UTF-8 bytes) are refused too. On failure NULL, with the
 * reason in j->why when the string itself is malformed. */
static char *jstr(jcur *j)
{
    jws(j);
    if (j->p >= j->end || *j->p != '"') return NULL;
    j->p++;
    char *const out = j->arena + j->an;
    char *o = out;
#define JBAD(...)                                                                                                      \
    do {                                                                                                               \
        snprintf(j->why, sizeof j->why, __VA_ARGS__);                                                                  \
        return NULL;                                                                                                   \
    } while (0)
    while (j->p < j->end && *j->p != '"') {
        const size_t at = (size_t)(j->p - j->base) + 8; /* file offset */
        char ch = *j->p++;
        if ((unsigned char)ch < 0x20)
            JBAD("raw control character 0x%02x in a string at file offset %zu; JSON strings must escape U+0000..U+001F",
                 (unsigned char)ch, at);
        if ((unsigned char)ch >= 0x80) {
            const size_t k = utf8_len((const unsigned char *)j->p - 1, (size_t)(j->end - j->p) + 1);
            if (!k) JBAD("invalid UTF-8 in a string at file offset %zu", at);
            memcpy(o, j->p - 1, k);
            o += k;
            j->p += k - 1;
            continue;
        }
        if (ch == '\\') {
            if (j->p >= j->end) break;
            char e = *j->p++;
            if (e == 'n') ch = '\n';
            else if (e == 't') ch = '\t';
            else if (e == 'r') ch = '\r';
            else if (e == 'b') ch = '\b';
            else if (e == 'f') ch = '\f';
            else if (e == '"' || e == '\\' || e == '/') ch = e;
            else if (e == 'u') {
                unsigned v = 0;
                for (int i = 0; i < 4; i++) {
                    const int d = j->p < j->end ? hexval(*j->p) : -1;
                    if (d < 0) JBAD("invalid \\u escape in a string at file offset %zu", at);
                    v = v * 16 + (unsigned)d;
                    j->p++;
                }
                if (v == 0) JBAD("\\u0000 in a string at file offset %zu (NUL is not allowed)", at);
                if (v > 0x7f)
                    JBAD("\\u%04x in a string at file offset %zu: escapes above U+007F are not supported", v, at);
                ch = (char)v;
            } else {
                JBAD("invalid escape in a string at file offset %zu", at);
            }
        }
        *o++ = ch;
    }
    if (j->p >= j->end) JBAD("unterminated string");
#undef JBAD
    j->p++;
    *o++ = 0;
    j->an += (size_t)(o - out);
    return out;
}
static int jint(jcur *j, int64_t *v)
{
    jws(j);
    const char *s = j->p;
    int64_t x = 0;
    if (s >= j->end || *s < '0' || *s > '9') return 0;
    while (s < j->end && *s >= '0' && *s <= '9') {
        if (x > (INT64_MAX - 9) / 10) return 0;
        x = x * 10 + (*s++ - '0');
    }
    j->p = s;
    *v = x;
    return 1;
}
static int jints(jcur *j, int64_t *v, int maxn, int *n)
{
    *n = 0;
    if (!jlit(j, '[')) return 0;
    if (jlit(j, ']')) return 1;
    do {
        if (*n >= maxn || !jint(j, &v[*n])) return 0;
        (*n)++;
    } while (jlit(j, ','));
    return jlit(j, ']');
}

typedef struct {
    const char *name, *dtype; /* in the header's arena */
    int ndim;
    int64_t shape[8], b, e;
} tentry;

typedef struct {
    const char *key, *val; /* in the header's arena */
} kv;

typedef struct {
    tentry *t;             /* the tensors in file order                     */
    const tentry **byname; /* the same, by name (no two alike)              */
    int nt, capt;
    kv *meta;              /* the metadata, by key (no two alike)           */
    int nm, capm;
    char *arena;           /* every string of the header                    */
    int64_t cs_b, cs_e;    /* the checksum value's bytes in the header (the
                              text between its quotes), or -1               */
} header;

static void header_free(header *h)
{
    free(h->t);
    free(h->byname);
    free(h->meta);
    free(h->arena);
}

static int cmp_kv(const void *a, const void *b) { return strcmp(((const kv *)a)->key, ((const kv *)b)->key); }
static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const tentry *const *)a)->name, (*(const tentry *const *)b)->name);
}

static const char *meta_get(const header *h, const char *key)
{
    const kv want = {key, NULL};
    const kv *f = h->nm ? bsearch(&want, h->meta, (size_t)h->nm, sizeof *h->meta, cmp_kv) : NULL;
    return f ? f->val : NULL;
}

/* ---- compiled ASAP layers (metadata "asap.<l>": one line of key=value,
 * floats in C99 hex notation, theta and omega as ':'-separated lists) ---- */
static char *asap_format(const bk_asap_layer *a)
{
    sbuf b = {0};
    char t[160];
    snprintf(t, sizeof t, "d=%d slices=%d scale=%a eps=%a teacher_iters=%d fit=%d lambda=%a seed=%llu theta_given=%d ",
             a->d, a->slices, (double)a->scale, (double)a->eps, a->teacher_iters, (int)a->fit, a->lambda,
             (unsigned long long)a->seed, a->theta_given);
    sb_str(&b, t);
    snprintf(t, sizeof t, "calib_problems=%lld calib_rows=%lld theta=", (long long)a->calib_problems,
             (long long)a->calib_rows);
    sb_str(&b, t);
    for (int i = 0; i < a->slices * a->d; i++) {
        snprintf(t, sizeof t, i ? ":%a" : "%a", (double)a->theta[i]);
        sb_str(&b, t);
    }
    sb_str(&b, " omega=");
    for (int i = 0; i < a->slices; i++) {
        snprintf(t, sizeof t, i ? ":%a" : "%a", a->omega[i]);
        sb_str(&b, t);
    }
    if (b.bad) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* parses a list of n finite doubles separated by ':' ending at a space/NUL */
static const char *asap_list(const char *p, int n, double *out)
{
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || !isfinite(v)) return NULL;
        out[i] = v;
        p = end;
        if (i + 1 < n && *p++ != ':') return NULL;
    }
    return (*p == ' ' || *p == 0) ? p : NULL;
}

static bk_status asap_parse(const char *path, int l, const char *txt, int dh, bk_asap_layer *a)
{
    memset(a, 0, sizeof *a);
    long long v[11];
    double scale, eps, lambda;
    int used = 0;
    int got = sscanf(txt, "d=%lld slices=%lld scale=%la eps=%la teacher_iters=%lld fit=%lld lambda=%la seed=%llu "
                          "theta_given=%lld calib_problems=%lld calib_rows=%lld theta=%n",
                     &v[0], &v[1], &scale, &eps, &v[2], &v[3], &lambda, (unsigned long long *)&v[4], &v[5], &v[6],
                     &v[7], &used);
    if (got != 11 || used == 0 || v[0] != dh || v[1] < 1 || v[1] > 65536 || !(scale > 0) || !(eps > 0) || v[2] < 2 ||
        (v[3] != 0 && v[3] != 1) || !(lambda >= 0))
        return bki_fail(BK_ERR_FORMAT, "%s: bad compiled ASAP layer %d in the metadata", path, l);
    a->d = (int)v[0];
    a->slices = (int)v[1];
    a->scale = (float)scale;
    a->eps = (float)eps;
    a->teacher_iters = (int)v[2];
    a->fit = (bk_asap_fit)v[3];
    a->lambda = lambda;
    a->seed = (uint64_t)v[4];
    a->theta_given = (int)v[5];
    a->calib_problems = v[6];
    a->calib_rows = v[7];
    const size_t nt = (size_t)a->slices * (size_t)a->d;
    double *tmp = malloc(sizeof(double) * nt);
    a->theta = malloc(sizeof(float) * nt);
    a->omega = malloc(sizeof(double) * (size_t)a->slices);
    if (!tmp || !a->theta || !a->omega) {
        free(tmp);
        bk_asap_layer_free(a);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    const char *p = asap_list(txt + used, (int)nt, tmp);
    if (p && strncmp(p, " omega=", 7) == 0) p = asap_list(p + 7, a->slices, a->omega);
    else p = NULL;
    int ok = p && *p == 0;
    for (int i = 0; ok && i < a->slices; i++) {
        double n2 = 0.0;
        for (int j = 0; j < a->d; j++) {
            const float t = (float)tmp[(size_t)i * a->d + j];
            a->theta[(size_t)i * a->d + j] = t;
            n2 += (double)t * t; /* on the stored floats: saving and loading round-trips */
        }
        ok = fabs(n2 - 1.0) < 1e-4;
    }
    free(tmp);
    if (!ok) {
        bk_asap_layer_free(a);
        return bki_fail(BK_ERR_FORMAT, "%s: bad slices or coefficients of compiled ASAP layer %d", path, l);
    }
    return BK_OK;
}

/* a header string as a message shows it: printable ASCII as is, other
 * bytes as \xNN, at most about 64 characters */
static const char *shown(const char *s, char *buf, size_t cap)
{
    size_t o = 0;
    for (; *s && o + 8 < cap; s++) {
        const unsigned char c = (unsigned char)*s;
        if (o > 64) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (c >= 0x20 && c < 0x7f && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = 0;
    return buf;
}

/* records why the header is refused, unless jstr already said: 0 */
static int jfail(jcur *j, const char *msg)
{
    if (!j->why[0]) snprintf(j->why, sizeof j->why, "%s", msg);
    return 0;
}

/* the metadata object: string values only, no key twice (refused after the
 * parse, by sorting); the checksum value's place is kept for its check */
static int parse_meta(jcur *j, header *h)
{
    if (!jlit(j, '{')) return jfail(j, "__metadata__ is not an object");
    if (jlit(j, '}')) return 1;
    do {
        const char *k = jstr(j), *v = NULL;
        const char *vb = NULL;
        if (k && jlit(j, ':')) {
            jws(j);
            vb = j->p;
            v = jstr(j);
        }
        if (!v) return jfail(j, "metadata values must be strings");
        if (h->nm == h->capm) {
            h->capm = h->capm ? 2 * h->capm : 16;
            kv *p = realloc(h->meta, sizeof(kv) * (size_t)h->capm);
            if (!p) return jfail(j, "out of memory");
            h->meta = p;
        }
        h->meta[h->nm++] = (kv){k, v};
        if (strcmp(k, "checksum") == 0) {
            h->cs_b = vb + 1 - j->base;
            h->cs_e = j->p - 1 - j->base;
        }
    } while (jlit(j, ','));
    if (!jlit(j, '}')) return jfail(j, "unterminated __metadata__");
    return 1;
}

/* one tensor entry: exactly dtype, shape (at most 8 sizes) and data_offsets,
 * each once */
static int parse_tensor(jcur *j, tentry *t)
{
    char nb[96];
    t->b = t->e = -1;
    if (!jlit(j, '{')) {
        snprintf(j->why, sizeof j->why, "tensor '%s' is not an object", shown(t->name, nb, sizeof nb));
        return 0;
    }
    unsigned seen = 0;
    do {
        const size_t mark = j->an; /* (the field's name is not kept) */
        const char *f = jstr(j);
        if (!f || !jlit(j, ':')) return jfail(j, "bad tensor field");
        const unsigned bit = !strcmp(f, "dtype") ? 1u : !strcmp(f, "shape") ? 2u : !strcmp(f, "data_offsets") ? 4u : 0u;
        if (bit & seen) {
            snprintf(j->why, sizeof j->why, "duplicate field '%s' in tensor '%s'", f, shown(t->name, nb, sizeof nb));
            return 0;
        }
        seen |= bit;
        j->an = mark;
        int ok = 1;
        if (bit == 1) {
            ok = (t->dtype = jstr(j)) != NULL;
        } else if (bit == 2) {
            ok = jints(j, t->shape, 8, &t->ndim);
        } else if (bit == 4) {
            int64_t o[2];
            int cnt;
            ok = jints(j, o, 2, &cnt) && cnt == 2;
            if (ok) {
                t->b = o[0];
                t->e = o[1];
            }
        } else {
            ok = 0;
        }
        if (!ok) return jfail(j, "bad dtype, shape or data_offsets");
    } while (jlit(j, ','));
    if (!jlit(j, '}')) return jfail(j, "unterminated tensor entry");
    if (seen != 7) {
        snprintf(j->why, sizeof j->why, "tensor '%s' lacks dtype, shape or data_offsets", shown(t->name, nb, sizeof nb));
        return 0;
    }
    return 1;
}

static bk_status parse_header(const char *path, const char *txt, size_t n, header *h)
{
    h->cs_b = h->cs_e = -1;
    if (!(h->arena = malloc(n + 1))) return bki_fail(BK_ERR_NOMEM, "%s: out of memory (header of %zu bytes)", path, n);
    jcur j = {txt, txt + n, txt, h->arena, 0, ""};
#define BAD(msg) return bki_fail(BK_ERR_FORMAT, "%s: malformed safetensors header (%s)", path, j.why[0] ? j.why : msg)
    if (!jlit(&j, '{')) BAD("not a JSON object");
    int have_meta = 0;
    char nb[96];
    if (!jlit(&j, '}')) {
        do {
            const char *key = jstr(&j);
            if (!key) BAD("expected a key");
            if (!jlit(&j, ':')) BAD("expected ':'");
            if (strcmp(key, "__metadata__") == 0) {
                if (have_meta++) BAD("duplicate key '__metadata__'");
                if (!parse_meta(&j, h)) BAD("bad __metadata__");
                continue;
            }
            if (h->nt == h->capt) {
                h->capt = h->capt ? 2 * h->capt : 64;
                tentry *p = realloc(h->t, sizeof(tentry) * (size_t)h->capt);
                if (!p) return bki_fail(BK_ERR_NOMEM, "%s: out of memory (%d tensor entries)", path, h->nt);
                h->t = p;
            }
            tentry *t = &h->t[h->nt++];
            memset(t, 0, sizeof *t);
            t->name = key;
            if (!parse_tensor(&j, t)) BAD("bad tensor entry");
        } while (jlit(&j, ','));
        if (!jlit(&j, '}')) BAD("unterminated object");
    }
    jws(&j);
    if (j.p != j.end) BAD("trailing bytes");
    /* no metadata key and no tensor name twice: readers that keep the first
     * or the last copy would load different files */
    if (h->nm > 1) qsort(h->meta, (size_t)h->nm, sizeof *h->meta, cmp_kv);
    for (int i = 1; i < h->nm; i++)
        if (!strcmp(h->meta[i - 1].key, h->meta[i].key))
            return bki_fail(BK_ERR_FORMAT, "%s: malformed safetensors header (duplicate metadata key '%s')", path,
                            shown(h->meta[i].key, nb, sizeof nb));
    if (!(h->byname = malloc(sizeof *h->byname * (size_t)(h->nt > 0 ? h->nt : 1))))
        return bki_fail(BK_ERR_NOMEM, "%s: out of memory (%d tensor entries)", path, h->nt);
    for (int i = 0; i < h->nt; i++) h->byname[i] = &h->t[i];
    if (h->nt > 1) qsort(h->byname, (size_t)h->nt, sizeof *h->byname, cmp_name);
    for (int i = 1; i < h->nt; i++)
        if (!strcmp(h->byname[i - 1]->name, h->byname[i]->name))
            return bki_fail(BK_ERR_FORMAT, "%s: malformed safetensors header (duplicate tensor name '%s')", path,
                            shown(h->byname[i]->name, nb, sizeof nb));
#undef BAD
    return BK_OK;
}

/* ---- save ---- */
typedef struct {
    char name[96];
    const float *data;
    int ndim;
    int64_t shape[4], count;
} wtensor;


bk_status bk_checkpoint_save(const char *path, const bk_model *m, const bk_optim *o, const char *extra)
{
    bk_outset *set = bk_outset_create();
    return bki_outset_done(set, set ? bk_checkpoint_stage(set, path, 0, m, o, extra) : BK_ERR_NOMEM);
}

bk_status bk_checkpoint_stage(bk_outset *set, const char *path, unsigned flags, const bk_model *m, const bk_optim *o,
                              const char *extra)
{
    if (!set) return bki_fail(BK_ERR_NULL, "bk_checkpoint_stage: NULL argument");
    if (!path || !m) return bki_fail(BK_ERR_NULL, "bk_checkpoint_save: NULL argument");
    const long bad = extra ? bki_bad_utf8(extra) : -1;
    if (bad >= 0)
        return bki_fail(BK_ERR_PARAM, "bk_checkpoint_save: the extra text is not UTF-8 (byte 0x%02x at offset %ld); a "
                                      "checkpoint's header is JSON",
                        (unsigned char)extra[bad], bad);
    int np;
    const bki_param *tab = bki_model_table(m, &np);
    const int slots = o ? bki_optim_slots(o) : 0;
    const int nw = np * (1 + slots);
    wtensor *w = calloc((size_t)nw, sizeof *w);
    if (!w) return bki_fail(BK_ERR_NOMEM, "bk_checkpoint_save: out of memory");
    const float *params = bk_model_params((bk_model *)m);
    int k = 0;
    for (int s = -1; s < slots; s++)
        for (int i = 0; i < np; i++, k++) {
            wtensor *t = &w[k];
            if (s < 0) {
                snprintf(t->name, sizeof t->name, "%s", tab[i].name);
                t->data = params + tab[i].off;
            } else {
                snprintf(t->name, sizeof t->name, "optim.%s.%s", bki_optim_slot_name(o, s), tab[i].name);
                t->data = bki_optim_slot((bk_optim *)o, s) + tab[i].off;
            }
            t->ndim = tab[i].ndim;
            memcpy(t->shape, tab[i].shape, sizeof t->shape);
            t->count = tab[i].count;
        }
    /* compiled ASAP layers live in the metadata */
    const int depth = bk_model_get_config(m)->depth;
    char **asap = calloc((size_t)(depth ? depth : 1), sizeof(char *));
    if (!asap) {
        free(w);
        return bki_fail(BK_ERR_NOMEM, "bk_checkpoint_save: out of memory");
    }
    for (int l = 0; l < depth; l++) {
        const bk_asap_layer *a = bki_model_asap(m, l);
        if (!a) continue;
        if (!(asap[l] = asap_format(a))) {
            for (int j = 0; j < l; j++) free(asap[j]);
            free(asap);
            free(w);
            return bki_fail(BK_ERR_NOMEM, "bk_checkpoint_save: out of memory");
        }
    }

    sbuf b = {0};
    char tmp[256];
    size_t clen = bk_model_config_format(bk_model_get_config(m), NULL, 0);
    char *cfg = malloc(clen + 1);
    if (!cfg) {
        free(w);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    bk_model_config_format(bk_model_get_config(m), cfg, clen + 1);
    sb_str(&b, "{\"__metadata__\":{\"format\":\"birkhoff\",\"version\":");
    snprintf(tmp, sizeof tmp, "%d.%d.%d", BK_VERSION_MAJOR, BK_VERSION_MINOR, BK_VERSION_PATCH);
    sb_json(&b, tmp);
    sb_str(&b, ",\"config\":");
    sb_json(&b, cfg);
    free(cfg);
    snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)bki_model_seed(m));
    sb_str(&b, ",\"seed\":");
    sb_json(&b, tmp);
    snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)bki_model_fwd_count(m));
    sb_str(&b, ",\"forward_count\":");
    sb_json(&b, tmp);
    if (o) {
        char oc[1024];
        bk_optim_config_format(bk_optim_get_config(o), oc, sizeof oc);
        sb_str(&b, ",\"optim\":");
        sb_json(&b, oc);
    }
    snprintf(tmp, sizeof tmp, "%lld", (long long)(o ? bk_optim_step_count(o) : 0));
    sb_str(&b, ",\"optim_step\":");
    sb_json(&b, tmp);
    if (extra) {
        sb_str(&b, ",\"extra\":");
        sb_json(&b, extra);
    }
    for (int l = 0; l < depth; l++) {
        if (!asap[l]) continue;
        snprintf(tmp, sizeof tmp, ",\"asap.%d\":", l);
        sb_str(&b, tmp);
        sb_json(&b, asap[l]);
        free(asap[l]);
    }
    free(asap);
    /* the checksum's place, zeros until the header is whole */
    sb_str(&b, ",\"checksum\":\"");
    const size_t cs_at = b.n;
    sb_str(&b, "0000000000000000\"}");
    int64_t off = 0;
    for (int i = 0; i < nw; i++) {
        const int64_t bytes = 4 * w[i].count;
        sb_str(&b, ",");
        sb_json(&b, w[i].name);
        sb_str(&b, ":{\"dtype\":\"F32\",\"shape\":[");
        for (int d = 0; d < w[i].ndim; d++) {
            snprintf(tmp, sizeof tmp, d ? ",%lld" : "%lld", (long long)w[i].shape[d]);
            sb_str(&b, tmp);
        }
        snprintf(tmp, sizeof tmp, "],\"data_offsets\":[%lld,%lld]}", (long long)off, (long long)(off + bytes));
        sb_str(&b, tmp);
        off += bytes;
    }
    sb_str(&b, "}");
    while (!b.bad && b.n % 8) sb_put(&b, " ", 1);
    if (b.bad) {
        free(b.s);
        free(w);
        return bki_fail(BK_ERR_NOMEM, "bk_checkpoint_save: out of memory");
    }
    /* the checksum: the data section, then the header as written (its own
     * 16 digits as zeros) */
    uint64_t h = BKI_FNV_OFFSET;
    for (int i = 0; i < nw; i++) h = bki_fnv1a(h, w[i].data, sizeof(float) * (size_t)w[i].count);
    h = bki_fnv1a(h, b.s, b.n);
    snprintf(tmp, sizeof tmp, "%016llx", (unsigned long long)h);
    memcpy(b.s + cs_at, tmp, 16);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)b.n >> (8 * i));
    const void **parts = malloc(sizeof(void *) * (size_t)(nw + 2));
    size_t *sizes = malloc(sizeof(size_t) * (size_t)(nw + 2));
    bk_status st;
    if (!parts || !sizes) {
        st = bki_fail(BK_ERR_NOMEM, "bk_checkpoint_save: out of memory");
    } else {
        parts[0] = len8;
        sizes[0] = 8;
        parts[1] = b.s;
        sizes[1] = b.n;
        for (int i = 0; i < nw; i++) {
            parts[i + 2] = w[i].data;
            sizes[i + 2] = sizeof(float) * (size_t)w[i].count;
        }
        st = bk_outset_add(set, path, flags, nw + 2, parts, sizes);
    }
    free(parts);
    free(sizes);
    free(b.s);
    free(w);
    return st;
}

/* ---- load ---- */
static const tentry *find_tensor(const header *h, const char *name)
{
    const tentry want = {.name = name}, *wp = &want;
    const tentry *const *f = h->nt ? bsearch(&wp, h->byname, (size_t)h->nt, sizeof *h->byname, cmp_name) : NULL;
    return f ? *f : NULL;
}

/* by offsets: begin, then end (empty tensors before the one that starts
 * where they are) */
static int cmp_off(const void *a, const void *b)
{
    const tentry *x = *(const tentry *const *)a, *y = *(const tentry *const *)b;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    return x->e < y->e ? -1 : x->e > y->e;
}

static bk_status parse_u64(const char *path, const header *h, const char *key, uint64_t *v)
{
    const char *s = meta_get(h, key);
    char *end;
    if (!s) return bki_fail(BK_ERR_FORMAT, "%s: checkpoint metadata lacks '%s'", path, key);
    errno = 0;
    unsigned long long x = *s >= '0' && *s <= '9' ? strtoull(s, &end, 10) : 0; /* (no sign, no space) */
    if (*s < '0' || *s > '9' || errno || *end)
        return bki_fail(BK_ERR_FORMAT, "%s: bad '%s' in the metadata (expected a decimal integer in [0, 2^64))", path,
                        key);
    *v = x;
    return BK_OK;
}

/* bytes per element of the dtypes a header may name (birkhoff.models reads
 * the same ones); 0 for any other */
static int dtype_size(const char *d)
{
    static const char *const names[] = {"F64", "F32", "F16", "I64", "I32", "I16", "I8", "U8"};
    static const int sizes[] = {8, 4, 2, 8, 4, 2, 1, 1};
    for (int i = 0; i < 8; i++)
        if (!strcmp(d, names[i])) return sizes[i];
    return 0;
}

/* Every tensor's shape fills its byte range at its dtype's size, and the
 * ranges tile the data section exactly (in the order of their offsets). */
static bk_status check_tiling(const char *path, const header *h, uint64_t dsize)
{
    char nb[96];
    for (int i = 0; i < h->nt; i++) {
        const tentry *t = &h->t[i];
        const int es = dtype_size(t->dtype);
        if (!es)
            return bki_fail(BK_ERR_FORMAT, "%s: tensor '%s' has the unknown dtype '%s' (F64, F32, F16, I64, I32, I16, "
                                           "I8 or U8)",
                            path, shown(t->name, nb, sizeof nb), t->dtype);
        /* the element count, exact: a zero size makes it 0, and a product
         * beyond the byte range cannot match it */
        int64_t cnt = 1, bytes = t->e - t->b;
        int zero = 0, over = 0;
        for (int d = 0; d < t->ndim; d++) zero |= t->shape[d] == 0;
        for (int d = 0; d < t->ndim && !zero && !over; d++) {
            over = cnt > INT64_MAX / es / t->shape[d];
            cnt *= t->shape[d];
        }
        if (zero) cnt = 0;
        if (over || bytes < 0 || cnt * es != bytes)
            return bki_fail(BK_ERR_FORMAT, "%s: tensor '%s': its shape does not fill its byte range [%lld, %lld)", path,
                            shown(t->name, nb, sizeof nb), (long long)t->b, (long long)t->e);
    }
    const tentry **ord = malloc(sizeof(*ord) * (size_t)(h->nt > 0 ? h->nt : 1));
    if (!ord) return bki_fail(BK_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < h->nt; i++) ord[i] = &h->t[i];
    qsort(ord, (size_t)h->nt, sizeof *ord, cmp_off);
    uint64_t pos = 0;
    bk_status st = BK_OK;
    for (int i = 0; i < h->nt && !st; i++) {
        if ((uint64_t)ord[i]->b != pos)
            st = bki_fail(BK_ERR_FORMAT, "%s: tensor '%s' has offsets [%lld, %lld] that do not tile the data", path,
                          shown(ord[i]->name, nb, sizeof nb), (long long)ord[i]->b, (long long)ord[i]->e);
        pos = (uint64_t)ord[i]->e;
    }
    free(ord);
    if (!st && pos != dsize)
        st = bki_fail(BK_ERR_FORMAT, "%s: data section is %llu bytes, the header describes %llu (truncated?)", path,
                      (unsigned long long)dsize, (unsigned long long)pos);
    return st;
}

/* The checksum (docs/MODEL.md "Checkpoints"): FNV-1a-64 of the data section
 * followed by the whole header (hdr[0..hl), padding included) with the bytes
 * of the checksum's own value read as '0's; 16 lowercase hex digits. A file
 * written before the checksum covered the header holds the FNV-1a-64 of the
 * data section followed by the "asap.<l>" metadata strings (l = 0, 1, ...):
 * such a file is accepted, and only its tensors and ASAP layers are vouched
 * for. FNV detects corruption and careless edits; it is no signature. */
static bk_status check_sum(const char *path, const header *h, const unsigned char *hdr, uint64_t hl,
                           const unsigned char *data, uint64_t dsize)
{
    const char *cs = meta_get(h, "checksum");
    char nb[96];
    if (!cs)
        return bki_fail(BK_ERR_FORMAT, "%s: no checksum in the metadata (not written by birkhoff, or edited)", path);
    int hex = strlen(cs) == 16;
    for (int i = 0; hex && i < 16; i++) hex = (cs[i] >= '0' && cs[i] <= '9') || (cs[i] >= 'a' && cs[i] <= 'f');
    if (!hex)
        return bki_fail(BK_ERR_FORMAT, "%s: bad checksum '%s' in the metadata (expected 16 lowercase hex digits)", path,
                        shown(cs, nb, sizeof nb));
    const uint64_t stored = strtoull(cs, NULL, 16), hd = bki_fnv1a(BKI_FNV_OFFSET, data, (size_t)dsize);
    uint64_t full = bki_fnv1a(hd, hdr, (size_t)h->cs_b);
    for (int64_t i = h->cs_b; i < h->cs_e; i++) full = bki_fnv1a(full, "0", 1);
    full = bki_fnv1a(full, hdr + h->cs_e, (size_t)(hl - (uint64_t)h->cs_e));
    if (full == stored) return BK_OK;
    uint64_t old = hd;
    for (int l = 0; l < 4096; l++) { /* (depth is at most 4096: config check) */
        char key[32];
        snprintf(key, sizeof key, "asap.%d", l);
        const char *a = meta_get(h, key);
        if (a) old = bki_fnv1a(old, a, strlen(a));
    }
    if (old == stored) return BK_OK;
    return bki_fail(BK_ERR_FORMAT, "%s: checksum mismatch (file corrupt or edited): stored %s, computed %016llx over "
                                   "the header and the data",
                    path, cs, (unsigned long long)full);
}

/* A checkpoint read into memory and verified (header, tiling, checksum) with
 * its model config parsed: what both bk_checkpoint_load and
 * bk_checkpoint_config start from. */
typedef struct {
    unsigned char *buf;
    header h;
    const unsigned char *data;
    uint64_t dsize;
    bk_model_config cfg;
    int old_otk;           /* written before 0.2.0: otk_iters converted      */
} ckfile;

/* Checkpoints written before 0.2.0 counted OTK's Sinkhorn iterations whole
 * (otk_iters = L); since 0.2.0 every iteration count of the library is in
 * half-steps (otk_iters = 2 L). A version string that does not parse is a
 * current one (the checksum already vouched for the file). */
static int counts_whole_otk_iterations(const char *version)
{
    int major = 0, minor = 0;
    if (!version || sscanf(version, "%d.%d", &major, &minor) != 2) return 0;
    return major == 0 && minor < 2;
}

/* the run text of such a checkpoint (key=value lines) with its otk_iters
 * line doubled; NULL when out of memory */
static char *otk_iters_doubled(const char *text)
{
    const size_t n = strlen(text);
    const size_t cap = 2 * n + 32; /* a doubled value gains at most one digit per line */
    char *out = malloc(cap);
    if (!out) return NULL;
    size_t o = 0;
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        const size_t L = e ? (size_t)(e - p) + 1 : strlen(p);
        long v;
        char *end;
        if (!strncmp(p, "otk_iters=", 10) && (v = strtol(p + 10, &end, 10)) >= 0 && v <= (1L << 20) &&
            (*end == '\n' || *end == 0))
            o += (size_t)snprintf(out + o, cap - o, "otk_iters=%ld%s", 2 * v, *end ? "\n" : "");
        else {
            memcpy(out + o, p, L);
            o += L;
        }
        p += L;
    }
    out[o] = 0;
    return out;
}

static void ckfile_free(ckfile *f)
{
    header_free(&f->h);
    free(f->buf);
}

static bk_status ckfile_read(const char *path, ckfile *f)
{
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) return bki_fail(BK_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    bk_status st = BK_OK;
    unsigned char *buf = NULL;
    header h = {0};
    long fsz = -1;
    if (fseek(fp, 0, SEEK_END) == 0) fsz = ftell(fp);
    if (fsz < 8 || fseek(fp, 0, SEEK_SET) != 0) {
        fclose(fp);
        return bki_fail(BK_ERR_FORMAT, "%s: not a safetensors checkpoint (too short)", path);
    }
    buf = malloc((size_t)fsz);
    if (!buf) {
        fclose(fp);
        return bki_fail(BK_ERR_NOMEM, "%s: out of memory (%ld bytes)", path, fsz);
    }
    size_t got = fread(buf, 1, (size_t)fsz, fp);
    fclose(fp);
    if (got != (size_t)fsz) {
        free(buf);
        return bki_fail(BK_ERR_IO, "%s: read failed", path);
    }
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)buf[i] << (8 * i);
    if (hl > MAX_HEADER || hl > (uint64_t)fsz - 8) {
        st = bki_fail(BK_ERR_FORMAT, "%s: header length %llu does not fit the %ld-byte file (truncated or not a "
                                     "safetensors file)",
                      path, (unsigned long long)hl, fsz);
        goto fail;
    }
    if ((st = parse_header(path, (const char *)buf + 8, (size_t)hl, &h))) goto fail;
    const char *fmt = meta_get(&h, "format");
    if (!fmt || strcmp(fmt, "birkhoff") != 0) {
        st = bki_fail(BK_ERR_FORMAT, "%s: not a birkhoff checkpoint (metadata format is '%s')", path, fmt ? fmt : "");
        goto fail;
    }
    const uint64_t dsize = (uint64_t)fsz - 8 - hl;
    const unsigned char *data = buf + 8 + hl;
    if ((st = check_tiling(path, &h, dsize)) || (st = check_sum(path, &h, buf + 8, hl, data, dsize))) goto fail;
    bk_model_config cfg = bk_model_config_default();
    const char *ctext = meta_get(&h, "config");
    const int old_otk = counts_whole_otk_iterations(meta_get(&h, "version"));
    if (!ctext) {
        st = bki_fail(BK_ERR_FORMAT, "%s: checkpoint metadata lacks the model config", path);
        goto fail;
    }
    if ((st = bk_model_config_parse(&cfg, ctext))) {
        char why[512];
        snprintf(why, sizeof why, "%s", bk_last_error()); /* (bki_fail rewrites that buffer) */
        st = bki_fail(BK_ERR_FORMAT, "%s: bad model config in the checkpoint: %s", path, why);
        goto fail;
    }
    if (old_otk && (cfg.otk_iters < 0 || cfg.otk_iters > (1 << 19))) { /* (doubled: at most 2^20, the config's bound) */
        st = bki_fail(BK_ERR_FORMAT, "%s: bad model config in the checkpoint: otk_iters=%d (whole iterations in a file "
                                     "written before 0.2.0) is out of range [0, 2^19]",
                      path, cfg.otk_iters);
        goto fail;
    }
    if (old_otk) cfg.otk_iters *= 2;
    f->old_otk = old_otk;
    f->buf = buf;
    f->h = h;
    f->data = data;
    f->dsize = dsize;
    f->cfg = cfg;
    return BK_OK;
fail:
    header_free(&h);
    free(buf);
    return st;
}

bk_status bk_checkpoint_config(const char *path, bk_model_config *c)
{
    if (!path || !c) return bki_fail(BK_ERR_NULL, "bk_checkpoint_config: NULL argument");
    ckfile f;
    bk_status st = ckfile_read(path, &f);
    if (!st) *c = f.cfg;
    ckfile_free(&f);
    return st;
}

bk_status bk_checkpoint_load(const char *path, int max_batch, bk_model **mout, bk_optim **oout, char **extra)
{
    if (!path || !mout) return bki_fail(BK_ERR_NULL, "bk_checkpoint_load: NULL argument");
    *mout = NULL;
    if (oout) *oout = NULL;
    if (extra) *extra = NULL;
    ckfile f;
    bk_status st = ckfile_read(path, &f);
    if (st) return st;
    header h = f.h;
    const unsigned char *data = f.data;
    const bk_model_config cfg = f.cfg;
    bk_model *m = NULL;
    bk_optim *o = NULL;
    {
        /* the exact parameter count, checked against the data section before
         * anything is allocated for it */
        int64_t P = 0;
        if ((st = bk_model_memory(&cfg, max_batch, &P, NULL))) goto done;
        if ((double)P * 4.0 > (double)f.dsize) {
            st = bki_fail(BK_ERR_FORMAT, "%s: the configuration has %lld parameters (%.0f bytes), the file holds %llu "
                                         "bytes of tensors (truncated or inconsistent)",
                          path, (long long)P, (double)P * 4.0, (unsigned long long)f.dsize);
            goto done;
        }
    }
    uint64_t seed, fcount;
    if ((st = parse_u64(path, &h, "seed", &seed)) || (st = parse_u64(path, &h, "forward_count", &fcount))) goto done;
    if ((st = bk_model_create(&cfg, seed, max_batch, &m))) goto done;
    bki_model_set_fwd_count(m, fcount);
    int np;
    const bki_param *tab = bki_model_table(m, &np);
    int want_slots = 0;
    const char *otext = meta_get(&h, "optim");
    if (oout && otext) {
        bk_optim_config oc = bk_optim_config_default();
        oc.decay_embed = 1; /* a checkpoint before issue 43 (no such key) decayed its token tables */
        uint64_t ostep;
        if ((st = bk_optim_config_parse(&oc, otext))) {
            char why[512];
            snprintf(why, sizeof why, "%s", bk_last_error());
            st = bki_fail(BK_ERR_FORMAT, "%s: bad optimiser config in the checkpoint: %s", path, why);
            goto done;
        }
        if ((st = parse_u64(path, &h, "optim_step", &ostep))) goto done;
        if (ostep > (uint64_t)INT64_MAX) {
            st = bki_fail(BK_ERR_FORMAT, "%s: bad 'optim_step' in the metadata (above 2^63 - 1)", path);
            goto done;
        }
        if ((st = bk_optim_create(&oc, m, &o))) goto done;
        bki_optim_set_step(o, (int64_t)ostep);
        want_slots = bki_optim_slots(o);
    }
    for (int s = -1; s < want_slots; s++)
        for (int i = 0; i < np; i++) {
            char name[96];
            if (s < 0)
                snprintf(name, sizeof name, "%s", tab[i].name);
            else
                snprintf(name, sizeof name, "optim.%s.%s", bki_optim_slot_name(o, s), tab[i].name);
            const tentry *t = find_tensor(&h, name);
            if (!t) {
                st = bki_fail(BK_ERR_FORMAT, "%s: tensor '%s' missing", path, name);
                goto done;
            }
            int same = strcmp(t->dtype, "F32") == 0 && t->ndim == tab[i].ndim;
            for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == tab[i].shape[d];
            if (!same || t->e - t->b != 4 * tab[i].count) {
                st = bki_fail(BK_ERR_FORMAT, "%s: tensor '%s' has the wrong dtype or shape for the configuration", path,
                              name);
                goto done;
            }
            float *dst = s < 0 ? bk_model_params(m) + tab[i].off : bki_optim_slot(o, s) + tab[i].off;
            memcpy(dst, data + t->b, (size_t)(t->e - t->b));
        }
    /* every other tensor must be optimiser state we were not asked for */
    for (int i = 0; i < h.nt; i++) {
        int known = 0;
        for (int p = 0; p < np && !known; p++) known = strcmp(h.t[i].name, tab[p].name) == 0;
        if (!known && strncmp(h.t[i].name, "optim.", 6) != 0) {
            st = bki_fail(BK_ERR_FORMAT, "%s: unexpected tensor '%s' for this configuration", path, h.t[i].name);
            goto done;
        }
    }
    for (int l = 0; l < cfg.depth; l++) {
        char key[32];
        snprintf(key, sizeof key, "asap.%d", l);
        const char *at = meta_get(&h, key);
        if (!at) continue;
        if (strcmp(bk_attn_kind_name(cfg.attn), "asap")) {
            st = bki_fail(BK_ERR_FORMAT, "%s: compiled ASAP layers in a model whose attention is not asap", path);
            goto done;
        }
        bk_asap_layer al;
        if ((st = asap_parse(path, l, at, cfg.head_dim ? cfg.head_dim : cfg.dim / cfg.heads, &al))) goto done;
        st = bk_model_set_asap(m, l, &al);
        bk_asap_layer_free(&al);
        if (st) goto done;
    }
    if (extra) {
        const char *e = meta_get(&h, "extra");
        if (e && !(*extra = f.old_otk ? otk_iters_doubled(e) : strdup(e))) {
            st = bki_fail(BK_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
done:
    ckfile_free(&f);
    if (st) {
        bk_optim_free(o);
        bk_model_free(m);
        if (extra && *extra) {
            free(*extra);
            *extra = NULL;
        }
        return st;
    }
    *mout = m;
    if (oout) *oout = o;
    return BK_OK;
}
