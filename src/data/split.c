/* split.c -- user dataset specs ("FORMAT:PATH") and the carved splits of
 * every dataset: which file a split reads, and the seeded, stratified rows a
 * split takes out of a store (birkhoff/data.h, docs/DATA.md). */
#include "dataset.h"

#include <math.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

static const char *const FORMATS[] = {"npy", "npz", "tsv", "csv", "parallel", "ids"};
#define NFORMATS ((int)(sizeof FORMATS / sizeof FORMATS[0]))

/* the FORMAT of a spec (its index), or -1; *path: after the colon */
static int spec_format(const char *spec, const char **path)
{
    if (!spec) return -1;
    const char *colon = strchr(spec, ':');
    if (!colon || !colon[1]) return -1;
    for (int f = 0; f < NFORMATS; f++)
        if ((size_t)(colon - spec) == strlen(FORMATS[f]) && !strncmp(spec, FORMATS[f], (size_t)(colon - spec))) {
            *path = colon + 1;
            return f;
        }
    return -1;
}

int bk_data_is_spec(const char *spec)
{
    const char *p;
    return spec_format(spec, &p) >= 0;
}

static int cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* the count of n_c rows a fraction takes (round half up) */
static int64_t frac_of(double f, int64_t n) { return (int64_t)floor(f * (double)n + 0.5); }

bk_status bk_data_split_rows(int64_t n, const int32_t *labels, int classes, double test_frac, double valid_frac,
                             uint64_t seed, bk_split split, int64_t **rows, int64_t *count)
{
    bki_clear_error();
    if (!rows || !count) return bki_fail(BK_ERR_NULL, "bk_data_split_rows: NULL argument");
    *rows = NULL;
    *count = 0;
    if (n < 0 || (n > 0 && labels && classes < 1))
        return bki_fail(BK_ERR_PARAM, "bk_data_split_rows: n = %lld, classes = %d", (long long)n, classes);
    if (!(test_frac >= 0 && test_frac < 1 && valid_frac >= 0 && valid_frac < 1 && test_frac + valid_frac < 1))
        return bki_fail(BK_ERR_PARAM, "carved splits: test_frac %g and valid_frac %g must lie in [0, 1) with a sum "
                                      "below 1", test_frac, valid_frac);
    if (split != BK_SPLIT_TRAIN && split != BK_SPLIT_TEST && split != BK_SPLIT_VALID)
        return bki_fail(BK_ERR_PARAM, "bk_data_split_rows: split %d is not a bk_split", (int)split);
    const int C = labels ? classes : 1;
    for (int64_t i = 0; labels && i < n; i++)
        if (labels[i] < 0 || labels[i] >= classes)
            return bki_fail(BK_ERR_PARAM, "bk_data_split_rows: label %d of row %lld outside [0, %d)", labels[i],
                            (long long)i, classes);
    /* rows grouped by class, in file order (a counting sort) */
    int64_t *start = calloc((size_t)C + 1, sizeof *start), *by = malloc(sizeof *by * (size_t)(n > 0 ? n : 1)),
            *perm = malloc(sizeof *perm * (size_t)(n > 0 ? n : 1)), *out = malloc(sizeof *out * (size_t)(n > 0 ? n : 1));
    if (!start || !by || !perm || !out) {
        free(start), free(by), free(perm), free(out);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n; i++) start[(labels ? labels[i] : 0) + 1]++;
    for (int c = 0; c < C; c++) start[c + 1] += start[c];
    int64_t *pos = malloc(sizeof *pos * (size_t)C);
    if (!pos) {
        free(start), free(by), free(perm), free(out);
        return bki_fail(BK_ERR_NOMEM, "out of memory");
    }
    memcpy(pos, start, sizeof *pos * (size_t)C);
    for (int64_t i = 0; i < n; i++) by[pos[labels ? labels[i] : 0]++] = i;
    free(pos);
    int64_t k = 0;
    for (int c = 0; c < C; c++) {
        const int64_t nc = start[c + 1] - start[c], nt = frac_of(test_frac, nc), nv = frac_of(valid_frac, nc);
        if (nc == 0) continue;
        bk_data_permute(perm, nc, bki_mix64_fin(seed ^ bki_mix64_fin((uint64_t)c + 1)));
        const int64_t lo = split == BK_SPLIT_TEST ? 0 : split == BK_SPLIT_VALID ? nt : nt + nv,
                      hi = split == BK_SPLIT_TEST ? nt : split == BK_SPLIT_VALID ? nt + nv : nc;
        for (int64_t j = lo; j < hi && j < nc; j++) out[k++] = by[start[c] + perm[j]];
    }
    qsort(out, (size_t)k, sizeof *out, cmp_i64);
    free(start), free(by), free(perm);
    *rows = out;
    *count = k;
    return BK_OK;
}

void bki_data_fracs(const bk_data_config *c, int spec, double *test_frac, double *valid_frac)
{
    *test_frac = spec && !(c->test_spec && *c->test_spec) ? c->test_frac : 0.0;
    *valid_frac = c->valid_spec && *c->valid_spec ? 0.0 : c->valid_frac;
}

/* the labels a store carves by: a seq2seq store has none */
static const int32_t *carve_labels(const bk_dataset *ds) { return ds->info.seq2seq ? NULL : ds->labels; }

bk_status bki_data_train_rows(const bk_data_config *c, int64_t n, const int32_t *labels, int classes,
                              int64_t **rows, int64_t *count)
{
    double tf, vf;
    bki_data_fracs(c, 1, &tf, &vf);
    return bk_data_split_rows(n, labels, classes, tf, vf, c->split_seed, BK_SPLIT_TRAIN, rows, count);
}

bk_status bki_data_carve(bk_dataset *ds, const bk_data_config *c, double test_frac, double valid_frac,
                         bk_split split)
{
    if (test_frac == 0 && valid_frac == 0) return BK_OK; /* the whole store is the split */
    int64_t *rows, k;
    bk_status st = bk_data_split_rows(ds->info.n, carve_labels(ds), ds->info.classes, test_frac, valid_frac,
                                      c->split_seed, split, &rows, &k);
    if (st != BK_OK) return st;
    if (ds->sel) { /* a store already mapped (a built-in split): compose */
        for (int64_t i = 0; i < k; i++) rows[i] = ds->sel[rows[i]];
        free(ds->sel);
    }
    ds->sel = rows;
    ds->info.n = k;
    /* the version says how the split was taken */
    static const char *const names[3] = {"train", "test", "valid"};
    char *v = ds->info.version;
    const size_t used = strlen(v);
    snprintf(v + used, sizeof ds->info.version - used, "; %s carved (test %g, valid %g, seed %llu)",
             names[split], test_frac, valid_frac, (unsigned long long)c->split_seed);
    return BK_OK;
}

/* the path of a split's own files: a spec of the same FORMAT, or a bare
 * PATH; NULL when the split has none */
static bk_status split_path(const char *own, int fmt, const char *what, const char **path)
{
    *path = NULL;
    if (!own || !*own) return BK_OK;
    const char *p;
    const int f = spec_format(own, &p);
    if (f < 0) {
        *path = own;
        return BK_OK;
    }
    if (f != fmt)
        return bki_fail(BK_ERR_PARAM, "%s=%s: a %s split of a %s dataset must be %s:PATH (or a bare PATH)", what, own,
                        what, FORMATS[fmt], FORMATS[fmt]);
    *path = p;
    return BK_OK;
}

/* Every file a spec names must be a regular file (or, for npy:DIR, a
 * directory): a run reads its data more than once (each split opens the
 * training file; a resume opens it again), so a FIFO's or a device's
 * content could not be read the same way twice. */
static bk_status check_files(const char *paths)
{
    for (const char *p = paths; *p;) {
        const size_t n = strcspn(p, ",");
        char one[4096];
        if (n < sizeof one) {
            memcpy(one, p, n);
            one[n] = 0;
            struct stat st;
            if (stat(one, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
                return bki_fail(BK_ERR_IO, "%s: not a regular file (a %s); a dataset is read more than once (each "
                                           "split, a resumed run), so give a file",
                                one, S_ISFIFO(st.st_mode) ? "FIFO" : S_ISSOCK(st.st_mode) ? "socket" : "device");
        }
        p += n;
        if (*p) p++;
    }
    return BK_OK;
}

bk_status bki_open_spec(const char *spec, bk_split split, const bk_data_config *c, bk_dataset *ds)
{
    const char *train_path;
    const int fmt = spec_format(spec, &train_path);
    if (fmt < 0) return bki_fail(BK_ERR_PARAM, "'%s' is not a dataset spec (FORMAT:PATH)", spec);
    const char *own = NULL;
    bk_status st = BK_OK;
    if (split == BK_SPLIT_VALID) st = split_path(c->valid_spec, fmt, "data_valid", &own);
    else if (split == BK_SPLIT_TEST) st = split_path(c->test_spec, fmt, "data_test", &own);
    if (st != BK_OK) return st;
    double tf, vf;
    bki_data_fracs(c, 1, &tf, &vf);
    if (split == BK_SPLIT_VALID && !own && vf <= 0)
        return bki_fail(BK_ERR_PARAM, "%s has no validation split: give data_valid, or valid_frac > 0", spec);
    if ((st = check_files(train_path)) != BK_OK || (own && (st = check_files(own)) != BK_OK)) return st;
    const bki_spec_ctx ctx = {FORMATS[fmt], own ? own : train_path, train_path, own != NULL, split, c};
    snprintf(ds->info.name, sizeof ds->info.name, "%s", FORMATS[fmt]);
    ds->info.split = split;
    switch (fmt) {
    case 0:
    case 1: st = bki_open_arrays(&ctx, ds); break;
    case 2:
    case 3: st = bki_open_labelled_text(&ctx, ds); break;
    case 4: st = bki_open_parallel_text(&ctx, ds); break;
    default: st = bki_open_ids_text(&ctx, ds); break;
    }
    if (st != BK_OK) return st;
    ds->info.rows = ds->info.n;
    if (!own) st = bki_data_carve(ds, c, tf, vf, split);
    return st;
}
