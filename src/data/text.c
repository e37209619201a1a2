/* text.c -- the readers of text specs (dataset.h): labelled text (tsv:FILE,
 * csv:FILE: a label and a text a line, encoded with SentencePiece into the
 * token store spam-spm uses), parallel text (parallel:SRC,TGT: raw sentence
 * pairs encoded with one joint SentencePiece model into the pair store bible
 * uses) and id pairs (ids:SRC,TGT). The SentencePiece model is the user's
 * (spm_model) or trained here on the TRAINING split's texts (bk_spm_train).
 * birkhoff/data.h, docs/DATA.md. */
#include "dataset.h"
#include "text.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* the TSV / CSV parser                                                     */
/* ------------------------------------------------------------------------ */
typedef struct {
    const unsigned char *b;
    size_t n, i;
    int64_t line;      /* the line of b[i] */
    size_t line_start; /* offset of that line's first byte */
    const char *name;
    char *out;         /* the kept fields */
    size_t used;
} lcur;

static bk_status at_byte(const lcur *c, size_t at, const char *what, unsigned v)
{
    return bki_fail(BK_ERR_FORMAT, "%s:%lld:%lld: %s%s%02x%s", c->name, (long long)c->line,
                    (long long)(at - c->line_start) + 1, what, v < 256 ? " (byte 0x" : "", v & 0xFF,
                    v < 256 ? ")" : "");
}

static int at_eol(const lcur *c)
{
    return c->i == c->n || c->b[c->i] == '\n' || (c->b[c->i] == '\r' && c->i + 1 < c->n && c->b[c->i + 1] == '\n');
}

/* one character of a field at c->i (valid UTF-8, not a control but TAB),
 * appended */
static bk_status take_char(lcur *c)
{
    uint32_t cp = 0;
    const int k = bki_utf8_seq(c->b + c->i, c->n - c->i, &cp);
    if (k <= 0) return at_byte(c, c->i, "invalid UTF-8", c->b[c->i]);
    if (cp == '\r') return at_byte(c, c->i, "carriage return (CR) not before a line end", 256);
    if ((cp < 0x20 && cp != '\t') || (cp >= 0x7F && cp <= 0x9F))
        return at_byte(c, c->i, "control character", c->b[c->i]);
    memcpy(c->out + c->used, c->b + c->i, (size_t)k);
    c->used += (size_t)k;
    c->i += (size_t)k;
    return BK_OK;
}

static void next_line(lcur *c)
{
    c->i += c->b[c->i] == '\r' ? 2 : 1;
    c->line++;
    c->line_start = c->i;
}

/* one field into c->out (not terminated); at its end c->i is at the
 * separator, a line end or the end */
static bk_status take_field(lcur *c, int csv, char sep)
{
    if (csv && c->i < c->n && c->b[c->i] == '"') {
        const int64_t open_line = c->line;
        const size_t open_col = c->i - c->line_start + 1;
        c->i++;
        for (;;) {
            if (c->i == c->n)
                return bki_fail(BK_ERR_FORMAT, "%s:%lld:%lld: a quote that is never closed", c->name,
                                (long long)open_line, (long long)open_col);
            const unsigned char ch = c->b[c->i];
            if (ch == '"') {
                if (c->i + 1 < c->n && c->b[c->i + 1] == '"') {
                    c->out[c->used++] = '"';
                    c->i += 2;
                    continue;
                }
                c->i++;
                break;
            }
            if (at_eol(c)) { /* a line end inside quotes: part of the field, as "\n" */
                c->out[c->used++] = '\n';
                next_line(c);
                continue;
            }
            bk_status st = take_char(c);
            if (st != BK_OK) return st;
        }
        if (!at_eol(c) && c->b[c->i] != (unsigned char)sep)
            return at_byte(c, c->i, "text after a closing quote (a field is quoted whole)", c->b[c->i]);
        return BK_OK;
    }
    while (!at_eol(c) && c->b[c->i] != (unsigned char)sep) {
        if (csv && c->b[c->i] == '"')
            return at_byte(c, c->i, "a quote inside an unquoted field (quote the whole field, doubling its quotes)",
                           256);
        bk_status st = take_char(c);
        if (st != BK_OK) return st;
    }
    return BK_OK;
}

static int blank(const char *s)
{
    for (; *s; s++)
        if (*s != ' ' && *s != '\t') return 0;
    return 1;
}

/* one record (a line; with CSV quotes, maybe several); keep 0: a header */
static bk_status take_record(lcur *c, int csv, int label_col, int text_col, int keep, bki_ltable *t)
{
    const char sep = csv ? ',' : '\t';
    const int64_t line = c->line;
    if (at_eol(c)) return bki_fail(BK_ERR_FORMAT, "%s:%lld: empty line", c->name, (long long)line);
    int64_t off[2] = {-1, -1};
    int field = 0;
    for (;;) {
        const size_t start = c->used;
        bk_status st = take_field(c, csv, sep);
        if (st != BK_OK) return st;
        field++;
        if (keep && (field == label_col || field == text_col)) {
            c->out[c->used++] = 0;
            off[field == label_col ? 0 : 1] = (int64_t)start;
        } else {
            c->used = start;
        }
        if (at_eol(c)) break;
        c->i++; /* the separator */
    }
    if (c->i < c->n) next_line(c);
    if (!keep) return BK_OK;
    for (int k = 0; k < 2; k++)
        if (off[k] < 0)
            return bki_fail(BK_ERR_FORMAT, "%s:%lld: %d column%s, no %s column %d (%s_column; %s)", c->name,
                            (long long)line, field, field == 1 ? "" : "s", k ? "text" : "label", k ? text_col : label_col,
                            k ? "text" : "label", csv ? "CSV: fields separated by ','" : "TSV: fields separated by TAB");
    /* the label without surrounding spaces */
    char *lab = c->out + off[0];
    while (*lab == ' ') lab++, off[0]++;
    for (size_t L = strlen(lab); L > 0 && lab[L - 1] == ' '; L--) lab[L - 1] = 0;
    if (!*lab)
        return bki_fail(BK_ERR_FORMAT, "%s:%lld: the label (column %d) is empty", c->name, (long long)line, label_col);
    if (blank(c->out + off[1]))
        return bki_fail(BK_ERR_FORMAT, "%s:%lld: the text (column %d) is empty", c->name, (long long)line, text_col);
    t->label[t->n] = off[0];
    t->text[t->n] = off[1];
    t->line[t->n] = line;
    t->n++;
    return BK_OK;
}

void bki_ltable_free(bki_ltable *t)
{
    if (!t) return;
    free(t->buf);
    free(t->label);
    free(t->text);
    free(t->line);
    memset(t, 0, sizeof *t);
}

bk_status bki_parse_labelled(const char *b, size_t n, const char *name, int csv, int label_col, int text_col,
                             int header, bki_ltable *out)
{
    if ((!b && n) || !name || !out) return bki_fail(BK_ERR_NULL, "labelled text: NULL argument");
    if (label_col < 1 || text_col < 1 || label_col == text_col || label_col > 4096 || text_col > 4096)
        return bki_fail(BK_ERR_PARAM, "%s: label_column %d and text_column %d must be different columns in [1, 4096]",
                        name, label_col, text_col);
    if (n >= 3 && (unsigned char)b[0] == 0xEF && (unsigned char)b[1] == 0xBB && (unsigned char)b[2] == 0xBF)
        return bki_fail(BK_ERR_FORMAT, "%s:1:1: starts with a byte-order mark (U+FEFF); save it without one", name);
    size_t lines = 1;
    for (size_t i = 0; i < n; i++) lines += b[i] == '\n';
    bki_ltable t = {0};
    t.buf = malloc(n + 2 * lines + 1);
    t.label = malloc(sizeof(int64_t) * lines);
    t.text = malloc(sizeof(int64_t) * lines);
    t.line = malloc(sizeof(int64_t) * lines);
    if (!t.buf || !t.label || !t.text || !t.line) {
        bki_ltable_free(&t);
        return bki_fail(BK_ERR_NOMEM, "%s: out of memory", name);
    }
    lcur c = {(const unsigned char *)b, n, 0, 1, 0, name, t.buf, 0};
    bk_status st = BK_OK;
    for (int64_t rec = 0; st == BK_OK && c.i < n; rec++)
        st = take_record(&c, csv, label_col, text_col, !(header && rec == 0), &t);
    if (st == BK_OK && t.n == 0)
        st = bki_fail(BK_ERR_FORMAT, "%s: no rows (%s)", name, n == 0 ? "an empty file" : "only a header");
    if (st != BK_OK) {
        bki_ltable_free(&t);
        return st;
    }
    *out = t;
    return BK_OK;
}

/* ------------------------------------------------------------------------ */
/* files and SentencePiece models                                           */
/* ------------------------------------------------------------------------ */
/* A whole text file through the one text reader (its limits: a line of at
 * most BK_TEXT_MAX_LINE bytes, BK_TEXT_MAX_BYTES in all, no NUL byte), lines
 * joined by "\n"; *fnv: FNV-1a-64 of that text. */
static bk_status read_text(const char *path, char **out, size_t *outn, uint64_t *fnv)
{
    bk_text_reader *r = NULL;
    bk_status st = bk_text_open(path, NULL, &r);
    if (st != BK_OK) return st;
    size_t n = 0, cap = 1 << 16;
    char *buf = malloc(cap), *line;
    size_t len;
    if (!buf) st = bki_fail(BK_ERR_NOMEM, "%s: out of memory", path);
    while (st == BK_OK && (st = bk_text_next(r, &line, &len)) == BK_OK && line) {
        if (n + len + 2 > cap) {
            while (n + len + 2 > cap) cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                st = bki_fail(BK_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            buf = nb;
        }
        memcpy(buf + n, line, len);
        n += len;
        buf[n++] = '\n';
    }
    bk_text_close(r);
    if (st != BK_OK) {
        free(buf);
        return st;
    }
    buf[n] = 0;
    *out = buf;
    *outn = n;
    *fnv = bki_fnv1a(BKI_FNV_OFFSET, buf, n);
    return BK_OK;
}

/* The model of a text store: c->spm_model's file, else one trained on
 * texts[0..n) (the training split's); its bytes are kept in ds->spm. what:
 * where it came from and its checksum (for the version). */
static bk_status text_model(const bk_data_config *c, const char *const *texts, int64_t n, bk_dataset *ds,
                            bk_spm **sp, char *what, size_t cap)
{
    bk_status st;
    const int given = c->spm_model && *c->spm_model;
    if (given) {
        st = bki_data_read_file(c->spm_model, (size_t)BK_SPM_MAX_MODEL, &ds->spm, &ds->spm_len);
    } else {
        const int V = c->spm_vocab > 0 ? c->spm_vocab : 8000;
        st = bk_spm_train(texts, n, V, &ds->spm, &ds->spm_len);
        if (st != BK_OK) {
            char m[600];
            snprintf(m, sizeof m, "%s", bk_last_error());
            return bki_fail(st, "%s: training the SentencePiece model on %lld texts (spm_vocab %d): %s", ds->info.name,
                            (long long)n, V, m);
        }
    }
    if (st == BK_OK) st = bk_spm_load(ds->spm, ds->spm_len, sp);
    if (st != BK_OK) {
        char m[600];
        snprintf(m, sizeof m, "%s", bk_last_error());
        return given ? bki_fail(st, "spm_model %s: %s", c->spm_model, m) : st;
    }
    const unsigned long long h = (unsigned long long)bki_fnv1a(BKI_FNV_OFFSET, ds->spm, ds->spm_len);
    /* by content only: a run that trained its model and the same run resumed
     * from the spm.model it wrote have the same version */
    snprintf(what, cap, "spm %d fnv1a:%016llx", bk_spm_vocab(*sp), h);
    return BK_OK;
}

/* ------------------------------------------------------------------------ */
/* labelled text                                                            */
/* ------------------------------------------------------------------------ */
#define LABEL_INT_MAX (1 << 20)

/* a canonical decimal label in [0, 2^20): its value, else -1 */
static int32_t int_label(const char *s)
{
    if (!*s || (s[0] == '0' && s[1]) || strlen(s) > 7) return -1;
    int32_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        v = v * 10 + (*s - '0');
    }
    return v < LABEL_INT_MAX ? v : -1;
}

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The classes of the training table: integers (names NULL) or the sorted
 * distinct names. */
static bk_status label_map(const bki_ltable *t, char ***names, int *classes)
{
    int32_t maxv = -1;
    for (int64_t i = 0; i < t->n && maxv >= -1; i++) {
        const int32_t v = int_label(t->buf + t->label[i]);
        maxv = v < 0 ? -2 : v > maxv ? v : maxv;
    }
    *names = NULL;
    if (maxv >= 0) {
        *classes = maxv + 1 < 2 ? 2 : maxv + 1;
        return BK_OK;
    }
    char **all = malloc(sizeof(char *) * (size_t)t->n);
    if (!all) return bki_fail(BK_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < t->n; i++) all[i] = t->buf + t->label[i];
    qsort(all, (size_t)t->n, sizeof *all, cmp_cstr);
    int64_t k = 0;
    for (int64_t i = 0; i < t->n; i++)
        if (!k || strcmp(all[k - 1], all[i])) all[k++] = all[i];
    if (k > LABEL_INT_MAX) {
        free(all);
        return bki_fail(BK_ERR_FORMAT, "more than %d distinct labels", LABEL_INT_MAX);
    }
    char **own = calloc((size_t)(k < 2 ? 2 : k), sizeof(char *));
    for (int64_t i = 0; own && i < k; i++)
        if (!(own[i] = strdup(all[i]))) {
            for (int64_t j = 0; j < i; j++) free(own[j]);
            free(own);
            own = NULL;
        }
    free(all);
    if (!own) return bki_fail(BK_ERR_NOMEM, "out of memory");
    if (k < 2) own[1] = strdup("(none)"); /* at least 2 classes, as integer labels */
    if (k < 2 && !own[1]) {
        free(own[0]);
        free(own);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    *names = own;
    *classes = k < 2 ? 2 : (int)k;
    return BK_OK;
}

/* the class of each row of t; a label the map does not know refused */
static bk_status map_labels(const bki_ltable *t, const char *path, char **names, int classes, int32_t *labels)
{
    for (int64_t i = 0; i < t->n; i++) {
        const char *s = t->buf + t->label[i];
        int32_t v = -1;
        if (!names) {
            v = int_label(s);
            if (v >= classes) v = -1;
        } else {
            char **hit = bsearch(&s, names, (size_t)classes, sizeof *names, cmp_cstr);
            v = hit ? (int32_t)(hit - names) : -1;
        }
        if (v < 0)
            return bki_fail(BK_ERR_FORMAT, "%s:%lld: label '%.64s' is not a class of the training file (%s%d%s)", path,
                            (long long)t->line[i], s, names ? "" : "integer labels 0..", names ? classes : classes - 1,
                            names ? " named classes" : "");
        labels[i] = v;
    }
    return BK_OK;
}

/* the texts of t's rows[0..n) (rows NULL: all) */
static const char **texts_of(const bki_ltable *t, const int64_t *rows, int64_t n)
{
    const char **x = malloc(sizeof(char *) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; x && i < n; i++) x[i] = t->buf + t->text[rows ? rows[i] : i];
    return x;
}

/* the texts of t encoded into the token store (first L ids of each) */
static bk_status encode_rows(const bki_ltable *t, const char *path, const bk_spm *sp, int L, bk_dataset *ds)
{
    int64_t cut = 0;
    ds->toks = malloc(sizeof(int32_t) * (size_t)t->n * (size_t)L);
    ds->lens = malloc(sizeof(int32_t) * (size_t)t->n);
    if (!ds->toks || !ds->lens) return bki_fail(BK_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < t->n; i++) {
        int32_t *row = ds->toks + (size_t)i * (size_t)L;
        int k = 0;
        if (bk_spm_encode(sp, t->buf + t->text[i], row, L, &k) != BK_OK) {
            char m[300];
            snprintf(m, sizeof m, "%s", bk_last_error());
            return bki_fail(BK_ERR_FORMAT, "%s:%lld: %s", path, (long long)t->line[i], m);
        }
        if (k > L) cut++;
        const int kept = k < L ? k : L;
        for (int j = kept; j < L; j++) row[j] = 0;
        ds->lens[i] = kept > 0 ? kept : 1; /* (a text of only spaces is refused: k >= 1) */
    }
    if (cut)
        snprintf(ds->info.note, sizeof ds->info.note, "%lld of %lld texts longer than %d ids cut to %d (max_len)",
                 (long long)cut, (long long)t->n, L, L);
    return BK_OK;
}

static bk_status parse_file(const char *path, const bki_spec_ctx *ctx, int csv, bki_ltable *t, uint64_t *fnv)
{
    char *buf = NULL;
    size_t n = 0;
    bk_status st = read_text(path, &buf, &n, fnv);
    if (st != BK_OK) return st;
    const bk_data_config *c = ctx->c;
    st = bki_parse_labelled(buf, n, path, csv, c->label_column > 0 ? c->label_column : 1,
                            c->text_column > 0 ? c->text_column : 2, c->text_header, t);
    free(buf);
    return st;
}

bk_status bki_open_labelled_text(const bki_spec_ctx *ctx, bk_dataset *ds)
{
    const int csv = strcmp(ctx->format, "csv") == 0;
    const bk_data_config *c = ctx->c;
    const int L = c->max_len > 0 ? c->max_len : 256;
    if (L > 65536 || c->max_len < 0) return bki_fail(BK_ERR_PARAM, "%s: max_len %d outside [1, 65536]", ctx->path, L);
    bki_ltable tr = {0}, own = {0};
    uint64_t h_tr = 0, h = 0;
    bk_status st = parse_file(ctx->train_path, ctx, csv, &tr, &h_tr);
    if (st != BK_OK) return st;
    const bki_ltable *t = &tr;
    if (ctx->separate) {
        st = parse_file(ctx->path, ctx, csv, &own, &h);
        t = &own;
    } else {
        h = h_tr;
    }
    int32_t *tr_labels = NULL;
    int64_t *rows = NULL, nrows = 0;
    const char **texts = NULL;
    bk_spm *sp = NULL;
    char what[160] = "";
    if (st == BK_OK) st = label_map(&tr, &ds->class_names, &ds->info.classes);
    if (st == BK_OK && !(tr_labels = malloc(sizeof(int32_t) * (size_t)tr.n))) st = bki_fail(BK_ERR_NOMEM, "out of memory");
    if (st == BK_OK) st = map_labels(&tr, ctx->train_path, ds->class_names, ds->info.classes, tr_labels);
    /* the model: the user's, else trained on the training split's texts */
    if (st == BK_OK && !(c->spm_model && *c->spm_model))
        st = bki_data_train_rows(c, tr.n, tr_labels, ds->info.classes, &rows, &nrows);
    if (st == BK_OK && !(texts = texts_of(&tr, rows, rows ? nrows : 0))) st = bki_fail(BK_ERR_NOMEM, "out of memory");
    if (st == BK_OK) st = text_model(c, texts, rows ? nrows : 0, ds, &sp, what, sizeof what);
    if (st == BK_OK) {
        ds->labels = ctx->separate ? malloc(sizeof(int32_t) * (size_t)t->n) : tr_labels;
        if (ctx->separate) st = ds->labels ? map_labels(t, ctx->path, ds->class_names, ds->info.classes, ds->labels)
                                           : bki_fail(BK_ERR_NOMEM, "out of memory");
        else tr_labels = NULL;
    }
    if (st == BK_OK) st = encode_rows(t, ctx->path, sp, L, ds);
    if (st == BK_OK) {
        bk_dataset_info *in = &ds->info;
        in->kind = BK_INPUT_TOKENS;
        in->n = t->n;
        in->vocab = bk_spm_vocab(sp);
        in->max_len = L;
        snprintf(in->version, sizeof in->version, "%s:%.40s fnv1a:%016llx %lld rows, %d %s classes; %.64s", ctx->format,
                 ctx->path, (unsigned long long)h, (long long)t->n, in->classes, ds->class_names ? "named" : "integer",
                 what);
    }
    bk_spm_free(sp);
    free((void *)texts);
    free(rows);
    free(tr_labels);
    bki_ltable_free(&tr);
    bki_ltable_free(&own);
    return st;
}

/* ------------------------------------------------------------------------ */
/* parallel text and id pairs                                               */
/* ------------------------------------------------------------------------ */
/* "SRC,TGT" into two paths (the comma: the last one) */
static bk_status two_paths(const char *spec, char *a, char *b, size_t cap)
{
    const char *comma = strrchr(spec, ',');
    if (!comma || comma == spec || !comma[1] || (size_t)(comma - spec) >= cap || strlen(comma + 1) >= cap)
        return bki_fail(BK_ERR_PARAM, "'%s': expected SRC,TGT (two files, source and target)", spec);
    memcpy(a, spec, (size_t)(comma - spec));
    a[comma - spec] = 0;
    snprintf(b, cap, "%s", comma + 1);
    return BK_OK;
}

/* the sentences of p encoded, EOS appended, into ds->ids / ds->off */
static bk_status encode_pairs(const bk_parallel *p, const bk_spm *sp, const char *names[2], bk_dataset *ds)
{
    const int64_t n = bk_parallel_count(p);
    for (int s = 0; s < 2; s++) {
        size_t cap = 1 << 16, used = 0;
        ds->ids[s] = malloc(sizeof(int32_t) * cap);
        ds->off[s] = malloc(sizeof(int64_t) * (size_t)(n + 1));
        if (!ds->ids[s] || !ds->off[s]) return bki_fail(BK_ERR_NOMEM, "out of memory");
        for (int64_t l = 0; l < n; l++) {
            bk_sentence_pair pr;
            bk_parallel_pair(p, l, &pr);
            const char *text = s ? pr.tgt : pr.src;
            int k = 0;
            bk_status st = bk_spm_encode(sp, text, NULL, 0, &k);
            if (st == BK_OK && used + (size_t)k + 1 > cap) {
                while (used + (size_t)k + 1 > cap) cap *= 2;
                int32_t *nb = realloc(ds->ids[s], sizeof(int32_t) * cap);
                if (!nb) return bki_fail(BK_ERR_NOMEM, "out of memory");
                ds->ids[s] = nb;
            }
            if (st == BK_OK) st = bk_spm_encode(sp, text, ds->ids[s] + used, k, &k);
            if (st != BK_OK) {
                char m[300];
                snprintf(m, sizeof m, "%s", bk_last_error());
                return bki_fail(st, "%s:%lld: %s", names[s], (long long)l + 1, m);
            }
            ds->off[s][l] = (int64_t)used;
            used += (size_t)k;
            ds->ids[s][used++] = BK_SEQ_EOS;
        }
        ds->off[s][n] = (int64_t)used;
    }
    return BK_OK;
}

/* a model for pairs: unk, bos and eos where the seq2seq model expects them */
static bk_status check_pair_model(const bk_spm *sp, const char *path)
{
    const int pad = bk_spm_special(sp, BK_SEQ_PAD);
    if (bk_spm_special(sp, BK_SEQ_UNK) != BK_SEQ_UNK || bk_spm_special(sp, BK_SEQ_BOS) != BK_SEQ_BOS ||
        bk_spm_special(sp, BK_SEQ_EOS) != BK_SEQ_EOS || (pad != BK_SEQ_PAD && pad != -1))
        return bki_fail(BK_ERR_FORMAT,
                        "spm_model %s: its ids unk %d, bos %d, eos %d, pad %d are not the seq2seq model's 0, 1, 2, 3 "
                        "(train it with spm_train --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=3)",
                        path, bk_spm_special(sp, BK_SEQ_UNK), bk_spm_special(sp, BK_SEQ_BOS),
                        bk_spm_special(sp, BK_SEQ_EOS), pad);
    return BK_OK;
}

/* the training sentences (both sides of the training rows) of p */
static const char **pair_texts(const bk_parallel *p, const int64_t *rows, int64_t n)
{
    const char **x = malloc(sizeof(char *) * (size_t)(2 * n > 0 ? 2 * n : 1));
    for (int64_t i = 0; x && i < n; i++) {
        bk_sentence_pair pr;
        bk_parallel_pair(p, rows[i], &pr);
        x[2 * i] = pr.src;
        x[2 * i + 1] = pr.tgt;
    }
    return x;
}

bk_status bki_open_parallel_text(const bki_spec_ctx *ctx, bk_dataset *ds)
{
    const bk_data_config *c = ctx->c;
    if (c->max_len < 0 || c->tgt_max_len < 0)
        return bki_fail(BK_ERR_PARAM, "%s: max_len %d or tgt_max_len %d is negative", ctx->path, c->max_len,
                        c->tgt_max_len);
    char tp[2][1100], op[2][1100];
    bk_status st = two_paths(ctx->train_path, tp[0], tp[1], sizeof tp[0]);
    if (st == BK_OK) st = two_paths(ctx->path, op[0], op[1], sizeof op[0]);
    if (st != BK_OK) return st;
    bk_parallel *tr = NULL, *own = NULL;
    st = bk_parallel_load(tp[0], tp[1], NULL, &tr);
    if (st == BK_OK && ctx->separate) st = bk_parallel_load(op[0], op[1], NULL, &own);
    const bk_parallel *p = ctx->separate ? own : tr;
    int64_t *rows = NULL, nrows = 0;
    const char **texts = NULL;
    bk_spm *sp = NULL;
    char what[160] = "";
    const int given = c->spm_model && *c->spm_model;
    if (st == BK_OK && !given) st = bki_data_train_rows(c, bk_parallel_count(tr), NULL, 0, &rows, &nrows);
    if (st == BK_OK && !(texts = pair_texts(tr, rows, given ? 0 : nrows))) st = bki_fail(BK_ERR_NOMEM, "out of memory");
    if (st == BK_OK) st = text_model(c, texts, given ? 0 : 2 * nrows, ds, &sp, what, sizeof what);
    if (st == BK_OK && given) st = check_pair_model(sp, c->spm_model);
    const char *names[2] = {ctx->separate ? op[0] : tp[0], ctx->separate ? op[1] : tp[1]};
    if (st == BK_OK) st = encode_pairs(p, sp, names, ds);
    if (st == BK_OK) {
        ds->info.vocab = bk_spm_vocab(sp);
        st = bki_pairs_keep(ds, c, bk_parallel_count(p), 0);
    }
    if (st == BK_OK) {
        const bk_parallel_info *pi = bk_parallel_get_info(p);
        bk_dataset_info *in = &ds->info;
        snprintf(in->version, sizeof in->version,
                 "parallel:%.24s,%.24s fnv1a:%016llx+%016llx src<=%d tgt<=%d dropped %lld of %lld; %.50s", names[0],
                 names[1], (unsigned long long)pi->src_fnv, (unsigned long long)pi->tgt_fnv, in->max_len,
                 in->tgt_max_len, (long long)in->dropped, (long long)pi->n, what);
    }
    bk_spm_free(sp);
    free((void *)texts);
    free(rows);
    bk_parallel_free(tr);
    bk_parallel_free(own);
    return st;
}

bk_status bki_open_ids_text(const bki_spec_ctx *ctx, bk_dataset *ds)
{
    char tp[2][1100], op[2][1100];
    bk_status st = two_paths(ctx->train_path, tp[0], tp[1], sizeof tp[0]);
    if (st == BK_OK) st = two_paths(ctx->path, op[0], op[1], sizeof op[0]);
    if (st != BK_OK) return st;
    bk_data_config c = *ctx->c;
    c.limit = 0; /* (bk_data_open applies it to the split) */
    if (!ctx->separate) return bki_open_id_pairs(tp[0], tp[1], 0, &c, ds);
    /* a split of its own: the vocabulary is the training files' */
    bk_dataset *tr = calloc(1, sizeof *tr);
    if (!tr) return bki_fail(BK_ERR_NOMEM, "out of memory");
    snprintf(tr->info.name, sizeof tr->info.name, "ids");
    st = bki_open_id_pairs(tp[0], tp[1], 0, &c, tr);
    const int vocab = tr->info.vocab;
    bk_data_close(tr);
    if (st != BK_OK) return st;
    return bki_open_id_pairs(op[0], op[1], vocab, &c, ds);
}
