/* bleu.c -- the translation metrics (include/birkhoff/metrics.h has the
 * definitions): corpus BLEU over token ids, and over text with the 13a or a
 * whitespace tokenisation; corpus chrF over text (at the end).
 *
 * Clipped counts are exact: for each sentence and order k the reference's
 * k-grams go into an open-addressing table keyed by a hash of their tokens
 * (entries keep the k-gram's position and are compared token by token), with
 * the reference count and the number of hypothesis k-grams matched so far; a
 * hypothesis k-gram matches while that number is below the reference count,
 * which sums min(count_hyp, count_ref) over distinct k-grams. Text tokens are
 * interned into ids the same way (a table of byte strings per call). */
#include "../core/internal.h"
#include "birkhoff/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

bk_bleu_config bk_bleu_config_default(void)
{
    bk_bleu_config c = {4, BK_BLEU_TOKENIZE_13A};
    return c;
}

/* ---- k-gram table ------------------------------------------------------- */
typedef struct {
    uint64_t h;
    int pos;          /* start in the reference; -1: empty slot */
    int count, used;
} gram;

static uint64_t hash_gram(const int32_t *t, int k)
{
    uint64_t h = BKI_FNV_OFFSET ^ (uint64_t)k;
    for (int i = 0; i < k; i++) h = bki_mix64_fin(h ^ (uint32_t)t[i]);
    return h;
}

/* the slot of the k-gram t (its own slot if present, else the empty one
 * where it belongs) */
static gram *find(gram *tab, size_t mask, const int32_t *ref, const int32_t *t, int k, uint64_t h)
{
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        gram *g = &tab[i];
        if (g->pos < 0) return g;
        if (g->h == h && memcmp(ref + g->pos, t, sizeof(int32_t) * (size_t)k) == 0) return g;
    }
}

static bk_status check_cfg(const bk_bleu_config *cfg, const char *fn)
{
    if (!cfg) return bki_fail(BK_ERR_NULL, "%s: NULL config", fn);
    if (cfg->max_order < 1 || cfg->max_order > 8)
        return bki_fail(BK_ERR_PARAM, "%s: max_order must be in [1, 8], got %d", fn, cfg->max_order);
    return BK_OK;
}

static bk_status check_seq(const bk_token_seq *s, const char *side, int i)
{
    if (s->len < 0) return bki_fail(BK_ERR_PARAM, "bk_bleu: %s %d has length %d", side, i, s->len);
    if (s->len > 0 && !s->tok) return bki_fail(BK_ERR_NULL, "bk_bleu: %s %d has no tokens", side, i);
    return BK_OK;
}

bk_status bk_bleu(const bk_token_seq *hyp, const bk_token_seq *ref, int n, const bk_bleu_config *cfg,
                  bk_bleu_report *out)
{
    bki_clear_error();
    if (!hyp || !ref || !out) return bki_fail(BK_ERR_NULL, "bk_bleu: NULL argument");
    bk_status st = check_cfg(cfg, "bk_bleu");
    if (st) return st;
    if (n < 1) return bki_fail(BK_ERR_PARAM, "bk_bleu: n must be >= 1, got %d", n);
    int maxref = 0;
    for (int i = 0; i < n; i++) {
        if ((st = check_seq(&hyp[i], "hypothesis", i)) || (st = check_seq(&ref[i], "reference", i))) return st;
        if (ref[i].len > maxref) maxref = ref[i].len;
    }
    size_t cap = 16;
    while (cap < 2 * (size_t)maxref + 2) cap <<= 1;
    gram *tab = malloc(sizeof(gram) * cap);
    if (!tab) return bki_fail(BK_ERR_NOMEM, "bk_bleu: out of memory");
    const int N = cfg->max_order;
    bk_bleu_report r;
    memset(&r, 0, sizeof r);
    r.max_order = N;
    for (int i = 0; i < n; i++) {
        const bk_token_seq *h = &hyp[i], *e = &ref[i];
        r.hyp_len += h->len;
        r.ref_len += e->len;
        /* this sentence's table: the first sc slots (a short sentence in a
         * corpus with one long reference clears only what it uses) */
        size_t sc = 16;
        while (sc < 2 * (size_t)e->len + 2) sc <<= 1;
        for (int k = 1; k <= N; k++) {
            if (h->len < k) break;
            r.totals[k - 1] += h->len - k + 1;
            if (e->len < k) continue;
            for (size_t j = 0; j < sc; j++) tab[j].pos = -1;
            for (int j = 0; j + k <= e->len; j++) {
                const uint64_t hv = hash_gram(e->tok + j, k);
                gram *g = find(tab, sc - 1, e->tok, e->tok + j, k, hv);
                if (g->pos < 0) *g = (gram){hv, j, 0, 0};
                g->count++;
            }
            for (int j = 0; j + k <= h->len; j++) {
                gram *g = find(tab, sc - 1, e->tok, h->tok + j, k, hash_gram(h->tok + j, k));
                if (g->pos >= 0 && g->used < g->count) {
                    g->used++;
                    r.matches[k - 1]++;
                }
            }
        }
    }
    free(tab);
    double logsum = 0.0;
    int zero = 0;
    for (int k = 0; k < N; k++) {
        r.precision[k] = r.totals[k] > 0 ? (double)r.matches[k] / (double)r.totals[k] : 0.0;
        if (r.matches[k] == 0) zero = 1;
        else logsum += log(r.precision[k]);
    }
    r.bp = r.hyp_len == 0 ? 0.0 : r.hyp_len > r.ref_len ? 1.0 : exp(1.0 - (double)r.ref_len / (double)r.hyp_len);
    r.bleu = zero ? 0.0 : r.bp * exp(logsum / N);
    *out = r;
    return BK_OK;
}

/* ---- text --------------------------------------------------------------- */
/* the length of the valid UTF-8 sequence at s (0: invalid) */
static int utf8_len(const unsigned char *s)
{
    const unsigned c = s[0];
    int n;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) n = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, min = 0x10000;
    else return 0;
    unsigned v = c & (0x3Fu >> (n - 1));
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    return n;
}

static bk_status check_text(const char *s, const char *side, int i)
{
    if (!s) return bki_fail(BK_ERR_NULL, "bk_bleu_text: %s %d is NULL", side, i);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        if ((*p < 0x20 && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\v' && *p != '\f') || *p == 0x7F)
            return bki_fail(BK_ERR_PARAM, "bk_bleu_text: %s %d has the control character 0x%02x at byte %d", side, i,
                            *p, (int)(p - (const unsigned char *)s));
        const int L = utf8_len(p);
        if (!L)
            return bki_fail(BK_ERR_PARAM, "bk_bleu_text: %s %d is not valid UTF-8 at byte %d", side, i,
                            (int)(p - (const unsigned char *)s));
        p += L;
    }
    return BK_OK;
}

/* Python's str.isspace, which str.split() (sacreBLEU's token split) and re's \s remove */
static int py_space(uint32_t c)
{
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* the byte length of the whitespace character at s (valid UTF-8), 0 if it is not one */
static int ws_len(const unsigned char *s)
{
    if (s[0] < 0x80) return py_space(s[0]);
    const int L = utf8_len(s);
    if (!L) return 0;
    uint32_t v = s[0] & (0x3Fu >> (L - 1));
    for (int i = 1; i < L; i++) v = (v << 6) | (s[i] & 0x3F);
    return py_space(v) ? L : 0;
}
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* 13a's first class: { | } ~ [ \ ] ^ _ ` space ! " # $ % & ( ) * + : ; < = > ? @ / */
static int is_13a_punct(unsigned char c)
{
    return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') || (c >= '(' && c <= '+') ||
           (c >= ':' && c <= '@') || c == '/';
}

/* a growable byte buffer */
typedef struct {
    char *p;
    size_t n, cap;
    int bad;
} sbuf;

static void put(sbuf *b, char c)
{
    if (b->bad) return;
    if (b->n + 1 >= b->cap) {
        size_t nc = b->cap ? 2 * b->cap : 64;
        char *q = realloc(b->p, nc);
        if (!q) {
            b->bad = 1;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
    b->p[b->n++] = c;
    b->p[b->n] = 0;
}

static void reset(sbuf *b)
{
    b->n = 0;
    put(b, 0); /* allocates, terminates */
    b->n = 0;
}

/* dst = src with every occurrence of pat replaced by rep (left to right) */
static void replace_all(const sbuf *src, sbuf *dst, const char *pat, const char *rep)
{
    const size_t lp = strlen(pat);
    reset(dst);
    for (size_t i = 0; i < src->n;) {
        if (i + lp <= src->n && !memcmp(src->p + i, pat, lp)) {
            for (const char *r = rep; *r; r++) put(dst, *r);
            i += lp;
        } else put(dst, src->p[i++]);
    }
}

/* in -> out, the 13a rules as the scoring script applies them: its string
 * replacements in order, the line padded with a space on each side, then
 * each regular expression as a left-to-right, non-overlapping substitution */
static void tokenize_13a(const char *in, sbuf *out, sbuf *tmp)
{
    static const char *const subst[][2] = {{"<skipped>", ""}, {"-\n", ""},   {"\n", " "},   {"&quot;", "\""},
                                           {"&amp;", "&"},    {"&lt;", "<"}, {"&gt;", ">"}};
    reset(out);
    put(out, ' ');
    for (const char *p = in; *p; p++) put(out, *p);
    put(out, ' ');
    for (size_t k = 0; k < sizeof subst / sizeof subst[0]; k++) {
        replace_all(out, tmp, subst[k][0], subst[k][1]);
        sbuf t = *out;
        *out = *tmp;
        *tmp = t;
    }
    /* pass 1: the punctuation class -> " c " */
    reset(tmp);
    for (size_t i = 0; i < out->n; i++) {
        const unsigned char c = (unsigned char)out->p[i];
        if (is_13a_punct(c)) {
            put(tmp, ' ');
            put(tmp, (char)c);
            put(tmp, ' ');
        } else put(tmp, (char)c);
    }
    /* pass 2: ([^0-9])([.,]) -> "\1 \2 " */
    reset(out);
    size_t i = 0;
    for (; i + 1 < tmp->n; i++) {
        const unsigned char a = (unsigned char)tmp->p[i], b = (unsigned char)tmp->p[i + 1];
        if (!is_digit(a) && (b == '.' || b == ',')) {
            put(out, (char)a);
            put(out, ' ');
            put(out, (char)b);
            put(out, ' ');
            i++;
        } else put(out, (char)a);
    }
    for (; i < tmp->n; i++) put(out, tmp->p[i]);
    /* pass 3: ([.,])([^0-9]) -> " \1 \2" */
    reset(tmp);
    for (i = 0; i + 1 < out->n; i++) {
        const unsigned char a = (unsigned char)out->p[i], b = (unsigned char)out->p[i + 1];
        if ((a == '.' || a == ',') && !is_digit(b)) {
            put(tmp, ' ');
            put(tmp, (char)a);
            put(tmp, ' ');
            put(tmp, (char)b);
            i++;
        } else put(tmp, (char)a);
    }
    for (; i < out->n; i++) put(tmp, out->p[i]);
    /* pass 4: ([0-9])(-) -> "\1 \2 " */
    reset(out);
    for (i = 0; i + 1 < tmp->n; i++) {
        const unsigned char a = (unsigned char)tmp->p[i], b = (unsigned char)tmp->p[i + 1];
        if (is_digit(a) && b == '-') {
            put(out, (char)a);
            put(out, ' ');
            put(out, '-');
            put(out, ' ');
            i++;
        } else put(out, (char)a);
    }
    for (; i < tmp->n; i++) put(out, tmp->p[i]);
}

/* interned tokens: the distinct byte strings of the call, ids in order of
 * first appearance */
typedef struct {
    uint64_t h;
    int32_t id;       /* -1: empty */
    size_t off, len;  /* in the string pool */
} entry;

typedef struct {
    entry *tab;
    size_t cap, count;
    sbuf pool;
    int bad;
} vocab;

static uint64_t hash_bytes(const char *s, size_t n) { return bki_fnv1a(BKI_FNV_OFFSET, s, n); }

static int32_t intern(vocab *v, const char *s, size_t n)
{
    if (v->bad) return -1;
    if (2 * (v->count + 1) > v->cap) {
        const size_t nc = v->cap ? 2 * v->cap : 1024;
        entry *t = malloc(sizeof(entry) * nc);
        if (!t) {
            v->bad = 1;
            return -1;
        }
        for (size_t i = 0; i < nc; i++) t[i].id = -1;
        for (size_t i = 0; i < v->cap; i++) {
            if (v->tab[i].id < 0) continue;
            size_t j = (size_t)v->tab[i].h & (nc - 1);
            while (t[j].id >= 0) j = (j + 1) & (nc - 1);
            t[j] = v->tab[i];
        }
        free(v->tab);
        v->tab = t;
        v->cap = nc;
    }
    const uint64_t h = hash_bytes(s, n);
    size_t j = (size_t)h & (v->cap - 1);
    for (;; j = (j + 1) & (v->cap - 1)) {
        entry *e = &v->tab[j];
        if (e->id < 0) break;
        if (e->h == h && e->len == n && !memcmp(v->pool.p + e->off, s, n)) return e->id;
    }
    if (v->count >= INT32_MAX) {
        v->bad = 1;
        return -1;
    }
    entry *e = &v->tab[j];
    e->h = h;
    e->id = (int32_t)v->count++;
    e->off = v->pool.n;
    e->len = n;
    for (size_t i = 0; i < n; i++) put(&v->pool, s[i]);
    if (v->pool.bad) v->bad = 1;
    return e->id;
}

/* the token ids of one sentence, appended to ids (positions into one array) */
typedef struct {
    int32_t *p;
    size_t n, cap;
    int bad;
} ibuf;

static void iput(ibuf *b, int32_t x)
{
    if (b->bad) return;
    if (b->n == b->cap) {
        const size_t nc = b->cap ? 2 * b->cap : 1024;
        int32_t *q = realloc(b->p, sizeof(int32_t) * nc);
        if (!q) {
            b->bad = 1;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
    b->p[b->n++] = x;
}

static void sentence_ids(const char *s, bk_bleu_tokenize how, sbuf *work, sbuf *tmp, vocab *v, ibuf *ids)
{
    const char *text = s;
    size_t len = strlen(s);
    if (how == BK_BLEU_TOKENIZE_13A) {
        tokenize_13a(s, work, tmp);
        text = work->p ? work->p : "";
        len = work->n;
    }
    /* tokens are separated by Unicode whitespace (a no-break or ideographic
     * space too), as sacreBLEU's str.split() separates them */
    const unsigned char *t = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        int w;
        while (i < len && (w = ws_len(t + i)) > 0) i += (size_t)w;
        const size_t b = i;
        while (i < len && !ws_len(t + i)) i += t[i] < 0x80 ? 1 : (size_t)(utf8_len(t + i) ? utf8_len(t + i) : 1);
        if (i > b) iput(ids, intern(v, text + b, i - b));
    }
}

bk_status bk_bleu_text(const char *const *hyp, const char *const *ref, int n, const bk_bleu_config *cfg,
                       bk_bleu_report *out)
{
    bki_clear_error();
    if (!hyp || !ref || !out) return bki_fail(BK_ERR_NULL, "bk_bleu_text: NULL argument");
    bk_status st = check_cfg(cfg, "bk_bleu_text");
    if (st) return st;
    if (cfg->tokenize != BK_BLEU_TOKENIZE_13A && cfg->tokenize != BK_BLEU_TOKENIZE_NONE)
        return bki_fail(BK_ERR_PARAM, "bk_bleu_text: unknown tokenisation %d", (int)cfg->tokenize);
    if (n < 1) return bki_fail(BK_ERR_PARAM, "bk_bleu_text: n must be >= 1, got %d", n);
    for (int i = 0; i < n; i++)
        if ((st = check_text(hyp[i], "hypothesis", i)) || (st = check_text(ref[i], "reference", i))) return st;
    sbuf work = {0}, tmp = {0};
    vocab v = {0};
    ibuf ids = {0};
    size_t *start = malloc(sizeof(size_t) * (2 * (size_t)n + 1));
    bk_token_seq *seq = malloc(sizeof(bk_token_seq) * 2 * (size_t)n);
    if (!start || !seq) st = bki_fail(BK_ERR_NOMEM, "bk_bleu_text: out of memory");
    for (int i = 0; !st && i < 2 * n; i++) {
        start[i] = ids.n;
        sentence_ids(i < n ? hyp[i] : ref[i - n], cfg->tokenize, &work, &tmp, &v, &ids);
        if (work.bad || tmp.bad || v.bad || ids.bad) st = bki_fail(BK_ERR_NOMEM, "bk_bleu_text: out of memory");
    }
    if (!st) {
        start[2 * n] = ids.n;
        for (int i = 0; i < 2 * n; i++) {
            const size_t L = start[i + 1] - start[i];
            if (L > INT32_MAX) {
                st = bki_fail(BK_ERR_PARAM, "bk_bleu_text: a sentence of more than 2^31 tokens");
                break;
            }
            seq[i] = (bk_token_seq){ids.p ? ids.p + start[i] : NULL, (int)L};
        }
    }
    if (!st) st = bk_bleu(seq, seq + n, n, cfg, out);
    free(start);
    free(seq);
    free(work.p);
    free(tmp.p);
    free(v.tab);
    free(v.pool.p);
    free(ids.p);
    return st;
}

/* ---- chrF (metrics.h: sacreBLEU's default chrF2) ------------------------
 * Each sentence's character n-grams of each order (code points packed 21
 * bits each into a 128-bit key) are sorted; a merge of the two sorted lists
 * counts the multiset intersection. */
enum { CHRF_ORDER = 6 };


/* the code points of s without whitespace (a byte that is not valid UTF-8
 * counts as one character of its own) */
static uint32_t *chrf_code_points(const char *s, int *n)
{
    size_t L = strlen(s);
    uint32_t *cp = malloc(sizeof(uint32_t) * (L + 1));
    if (!cp) return NULL;
    int k = 0;
    const unsigned char *p = (const unsigned char *)s, *e = p + L;
    while (p < e) {
        uint32_t c = *p;
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len > 1 && p + len <= e) {
            uint32_t v = c & (0x7f >> len);
            int ok = 1;
            for (int i = 1; i < len; i++) {
                if ((p[i] & 0xc0) != 0x80) ok = 0;
                v = (v << 6) | (p[i] & 0x3f);
            }
            if (ok) {
                c = v;
                p += len;
            } else {
                c = 0xdc00 + *p++;
            }
        } else {
            c = len == 1 ? c : 0xdc00 + c;
            p++;
        }
        if (!py_space(c)) cp[k++] = c;
    }
    *n = k;
    return cp;
}

typedef struct {
    uint64_t a, b;
} key128;

static int chrf_cmp(const void *x, const void *y)
{
    const key128 *p = x, *q = y;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    return (p->b > q->b) - (p->b < q->b);
}

/* the n-grams of cp packed (21 bits a code point: 3 in a, 3 in b), sorted */
static void chrf_keys(const uint32_t *cp, int len, int n, key128 *k)
{
    for (int i = 0; i + n <= len; i++) {
        uint64_t a = 0, b = 0;
        for (int j = 0; j < n; j++) {
            if (j < 3)
                a = (a << 21) | cp[i + j];
            else
                b = (b << 21) | cp[i + j];
        }
        k[i].a = a;
        k[i].b = b;
    }
    if (len >= n) qsort(k, (size_t)(len - n + 1), sizeof(key128), chrf_cmp);
}

bk_status bk_chrf_text(const char *const *hyp, const char *const *ref, int n, double *chrf)
{
    if (!hyp || !ref || !chrf) return bki_fail(BK_ERR_NULL, "bk_chrf_text: NULL argument");
    if (n < 1) return bki_fail(BK_ERR_PARAM, "bk_chrf_text: n must be >= 1, got %d", n);
    for (int s = 0; s < n; s++)
        if (!hyp[s] || !ref[s])
            return bki_fail(BK_ERR_NULL, "bk_chrf_text: %s sentence %d is NULL", hyp[s] ? "reference" : "hypothesis", s);
    int64_t st[CHRF_ORDER][3] = {{0}};
    for (int s = 0; s < n; s++) {
        int lh, lr;
        uint32_t *h = chrf_code_points(hyp[s], &lh), *r = chrf_code_points(ref[s], &lr);
        key128 *kh = malloc(sizeof(key128) * (size_t)(lh + 1)), *kr = malloc(sizeof(key128) * (size_t)(lr + 1));
        if (!h || !r || !kh || !kr) {
            free(h);
            free(r);
            free(kh);
            free(kr);
            return bki_fail(BK_ERR_NOMEM, "bk_chrf_text: out of memory (sentence %d)", s);
        }
        for (int o = 1; o <= CHRF_ORDER; o++) {
            int nh = lh >= o ? lh - o + 1 : 0, nr = lr >= o ? lr - o + 1 : 0;
            chrf_keys(h, lh, o, kh);
            chrf_keys(r, lr, o, kr);
            int64_t match = 0;
            for (int i = 0, j = 0; i < nh && j < nr;) { /* multiset intersection */
                int c = chrf_cmp(&kh[i], &kr[j]);
                if (c == 0) {
                    match++;
                    i++;
                    j++;
                } else if (c < 0) {
                    i++;
                } else {
                    j++;
                }
            }
            /* sacreBLEU (metrics/chrf.py, _get_match_statistics): a sentence's
             * hypothesis n-grams of an order count only when its reference has
             * n-grams of that order */
            st[o - 1][0] += nr > 0 ? nh : 0;
            st[o - 1][1] += nr;
            st[o - 1][2] += match;
        }
        free(h);
        free(r);
        free(kh);
        free(kr);
    }
    double P = 0, R = 0;
    int eff = 0;
    for (int o = 0; o < CHRF_ORDER; o++) {
        if (st[o][0] > 0 && st[o][1] > 0) {
            P += (double)st[o][2] / (double)st[o][0];
            R += (double)st[o][2] / (double)st[o][1];
            eff++;
        }
    }
    *chrf = 0.0;
    if (eff) {
        P /= eff;
        R /= eff;
        const double b2 = 4.0; /* beta 2 */
        *chrf = P + R > 0 ? 100.0 * (1 + b2) * P * R / (b2 * P + R) : 0.0;
    }
    bki_clear_error();
    return BK_OK;
}
