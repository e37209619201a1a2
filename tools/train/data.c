/* data.c -- `birkhoff data inspect` (old name: info): open a dataset as
 * training would (bk_data_open: a built-in set, verifying its checksums, or
 * a FORMAT:PATH spec of the user's) and print what the reader sees, split
 * by split; `birkhoff data export spam`: a split's message bodies as
 * text, one a line (the input of scripts/data.sh spam-spm). */
#include "../cli.h"

#include <stdlib.h>
#include <string.h>

static void usage_data(FILE *f)
{
    fprintf(f, "usage: birkhoff data inspect NAME|FORMAT:PATH [--split train|valid|test|all] [--KEY VALUE]...\n"
               "       birkhoff data export spam --out FILE [--split train|test] [--data-dir DIR]\n"
               "\n"
               "inspect opens a dataset as `birkhoff train` would and prints what the reader sees, split by split\n"
               "(default all: train, then valid and test where the dataset has them): samples, input shape,\n"
               "classes and the label histogram (class names for named labels), lengths (min / mean / max),\n"
               "vocabulary, what the reader dropped, and the version a run records. A bad file is refused with\n"
               "the file and the line, index or offset named (status 1). NAME is a built-in dataset (mnist,\n"
               "fashion-mnist, digits, spam, spam-spm, listops, shapes, bible; fetch stored ones with\n"
               "scripts/data.sh NAME); FORMAT:PATH is your own data (npy:DIR, npz:FILE, tsv:FILE, csv:FILE,\n"
               "parallel:SRC,TGT, ids:SRC,TGT; docs/DATA.md). --KEY VALUE are the run's data keys, as\n"
               "`birkhoff train` takes them: --data-dir, --valid-frac, --test-frac, --split-seed, --data-valid,\n"
               "--data-test, --array-kind, --label-column, --text-column, --text-header, --spm-model,\n"
               "--spm-vocab, --seq-len, --tgt-len, --train-limit, --points, ... (`data info` is the old name.)\n"
               "export writes the split's message bodies (their first 16384 bytes) as UTF-8 text, one message a\n"
               "line in the split's order: control bytes become spaces, a body that is not valid UTF-8 is read as\n"
               "Latin-1 (scripts/data.sh spam-spm encodes the lines with SentencePiece).\n");
}

/* the length of the valid UTF-8 sequence at p (1-4), 0 if there is none */
static int utf8_len(const unsigned char *p, int n)
{
    const unsigned c = p[0];
    int k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 && c >= 0xC2 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 && c <= 0xF4 ? 4 : 0;
    if (k == 0 || k > n) return 0;
    for (int j = 1; j < k; j++)
        if ((p[j] & 0xC0) != 0x80) return 0;
    if (k == 3 && ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] >= 0xA0))) return 0; /* overlong, surrogate */
    if (k == 4 && ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] >= 0x90))) return 0;
    return k;
}

static int data_export(const char *name, bk_split sp, const char *dir, const char *out)
{
    if (strcmp(name, "spam") != 0) {
        fprintf(stderr, "birkhoff data export: only spam has text to export (got '%s')\n", name);
        return CLI_USAGE;
    }
    enum { MAXB = 16384 };
    bk_data_config o = bk_data_config_default();
    o.dir = dir;
    o.max_len = MAXB;
    bk_dataset *ds;
    if (bk_data_open(name, sp, &o, &ds) != BK_OK) {
        fprintf(stderr, "birkhoff data export: %s\n", bk_last_error());
        return CLI_FAIL;
    }
    const int64_t n = bk_data_info(ds)->n;
    int32_t *tok = malloc(sizeof(int32_t) * MAXB);
    unsigned char *b = malloc(MAXB);
    size_t cap = (size_t)n * 64 + 1, len = 0;
    char *text = malloc(cap);
    int ok = tok && b && text;
    for (int64_t i = 0; ok && i < n; i++) {
        int32_t L;
        ok = bk_data_fill(ds, &i, 1, NULL, tok, &L, NULL) == BK_OK;
        for (int j = 0; ok && j < L; j++) b[j] = (unsigned char)tok[j];
        int valid = 1;
        for (int j = 0; ok && j < L;) {
            const int k = utf8_len(b + j, L - j);
            if (!k) { valid = 0; break; }
            j += k;
        }
        if (ok && len + 2 * (size_t)L + 2 > cap) { /* at most 2 bytes a byte, and the newline */
            cap = 2 * cap + 2 * (size_t)L + 2;
            char *nt = realloc(text, cap);
            if (!nt) ok = 0;
            else text = nt;
        }
        for (int j = 0; ok && j < L; j++) {
            const unsigned c = b[j];
            if (c < 0x20 || c == 0x7F) text[len++] = ' ';
            else if (c < 0x80 || valid) text[len++] = (char)c;
            else { /* Latin-1 */
                text[len++] = (char)(0xC0 | (c >> 6));
                text[len++] = (char)(0x80 | (c & 0x3F));
            }
        }
        if (ok) text[len++] = '\n';
    }
    if (ok) text[len] = 0;
    if (!ok) fprintf(stderr, "birkhoff data export: %s\n", text && tok && b ? bk_last_error() : "out of memory");
    ok = ok && cli_write_text("data export", out, text);
    if (ok) fprintf(stderr, "birkhoff data export: %lld messages of %s (%s) -> %s\n", (long long)n, name,
                    sp == BK_SPLIT_TRAIN ? "train" : "test", out);
    free(text);
    free(b);
    free(tok);
    bk_data_close(ds);
    return ok ? CLI_OK : CLI_FAIL;
}

/* the label histogram and lengths of a whole split, read through batches
 * (as training reads it) */
typedef struct {
    int64_t *counts;            /* [classes]                                   */
    int64_t len_min[2], len_max[2];
    double len_sum[2];
} split_stats;

static int read_stats(bk_dataset *d, split_stats *st)
{
    const bk_dataset_info *in = bk_data_info(d);
    memset(st, 0, sizeof *st);
    st->counts = calloc((size_t)(in->classes > 0 ? in->classes : 1), sizeof *st->counts);
    st->len_min[0] = st->len_min[1] = INT64_MAX;
    enum { CHUNK = 64 };
    bk_data_batch b;
    int ok = st->counts && bk_data_batch_init(&b, d, CHUNK) == BK_OK;
    if (!ok) {
        free(st->counts);
        st->counts = NULL;
        return 0;
    }
    for (int64_t a = 0; ok && a < in->n; a += CHUNK) {
        const int B = in->n - a < CHUNK ? (int)(in->n - a) : CHUNK;
        for (int k = 0; k < B; k++) b.idx[k] = a + k;
        bk_batch bt;
        ok = bk_data_batch_fill(&b, d, B, &bt) == BK_OK;
        for (int k = 0; ok && k < B; k++) {
            if (b.labels && b.labels[k] >= 0 && b.labels[k] < in->classes) st->counts[b.labels[k]]++;
            const int32_t L[2] = {b.len ? b.len[k] : 0, b.tgt_len ? b.tgt_len[k] : 0};
            for (int s2 = 0; s2 < 2; s2++) {
                if (L[s2] < st->len_min[s2]) st->len_min[s2] = L[s2];
                if (L[s2] > st->len_max[s2]) st->len_max[s2] = L[s2];
                st->len_sum[s2] += L[s2];
            }
        }
    }
    bk_data_batch_free(&b);
    if (!ok) {
        fprintf(stderr, "birkhoff data inspect: %s\n", bk_last_error());
        free(st->counts);
        st->counts = NULL;
    }
    return ok;
}

static void print_split(const char *split, bk_dataset *d)
{
    const bk_dataset_info *in = bk_data_info(d);
    printf("[%s]\nsamples   %lld (of %lld rows read)\nversion   %s\n", split, (long long)in->n, (long long)in->rows,
           in->version);
    if (in->kind == BK_INPUT_IMAGE) printf("input     images %d x %d x %d (channels x height x width)\n", in->channels, in->height, in->width);
    else if (in->seq2seq)
        printf("input     sentence pairs: vocabulary %d, source up to %d ids, target up to %d ids (EOS counted)\n",
               in->vocab, in->max_len, in->tgt_max_len);
    else if (in->kind == BK_INPUT_TOKENS) printf("input     tokens: vocabulary %d, up to %d a sample\n", in->vocab, in->max_len);
    else printf("input     point clouds (%d points x %d)\n", in->points, in->point_dim);
    if (in->note[0] || in->dropped) printf("dropped   %lld%s%s\n", (long long)in->dropped, in->note[0] ? ": " : "", in->note);
    split_stats st;
    if (!read_stats(d, &st)) return;
    if (in->classes > 0) {
        printf("classes   %d\nlabels   ", in->classes);
        for (int k = 0; k < in->classes; k++) {
            const char *nm = bk_data_class_name(d, k);
            if (k == 64 && in->classes > 72) {
                printf(" ... (%d more)", in->classes - 64);
                break;
            }
            if (nm) printf(" %s=%lld", nm, (long long)st.counts[k]);
            else printf(" %d:%lld", k, (long long)st.counts[k]);
        }
        printf("\n");
    }
    if (in->kind != BK_INPUT_IMAGE && in->n > 0)
        for (int s2 = 0; s2 < 1 + in->seq2seq; s2++)
            printf("%s min %lld, mean %.1f, max %lld%s\n", s2 ? "target   " : in->seq2seq ? "source   " : "length   ",
                   (long long)st.len_min[s2], st.len_sum[s2] / (double)in->n, (long long)st.len_max[s2],
                   in->kind == BK_INPUT_POINTS ? " points" : " ids");
    free(st.counts);
}

/* `data inspect`: every split asked, or the first failure */
static int data_inspect(const char *name, const char *split, const bk_run_config *r)
{
    const bk_data_config o = bk_run_data_config(r);
    static const char *const names[3] = {"train", "valid", "test"};
    static const bk_split sp[3] = {BK_SPLIT_TRAIN, BK_SPLIT_VALID, BK_SPLIT_TEST};
    const int all = !strcmp(split, "all");
    printf("dataset   %s\n", name);
    for (int k = 0; k < 3; k++) {
        if (!all && strcmp(split, names[k])) continue;
        /* (all: the validation split when a run would have one) */
        if (all && sp[k] == BK_SPLIT_VALID && !bk_run_has_valid(r)) continue;
        bk_dataset *d;
        if (bk_data_open(name, sp[k], &o, &d) != BK_OK) {
            fprintf(stderr, "birkhoff data inspect: %s\n", bk_last_error());
            return CLI_FAIL;
        }
        print_split(names[k], d);
        bk_data_close(d);
    }
    return CLI_OK;
}

/* inspect's --KEY VALUE / --set KEY=VALUE flags, as `birkhoff train`'s
 * run keys (the data ones matter; --split is inspect's own) */
static int inspect_main(int argc, char **argv)
{
    const char *name = argv[2], *split = "all";
    bk_run_config r = bk_run_config_default(); /* the splits a new run would take */
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage_data(stdout);
            return CLI_OK;
        }
        if (strncmp(argv[i], "--", 2) || i + 1 >= argc) {
            fprintf(stderr, "birkhoff data inspect: expected --KEY VALUE, got '%s'\n", argv[i]);
            return CLI_USAGE;
        }
        char key[128], val[1100];
        const char *v = argv[++i];
        if (!cli_key_flag("data inspect", argv[i - 1], v, key, sizeof key, val, sizeof val)) return CLI_USAGE;
        if (!strcmp(key, "split")) {
            if (strcmp(val, "train") && strcmp(val, "valid") && strcmp(val, "test") && strcmp(val, "all")) {
                fprintf(stderr, "birkhoff data inspect: --split train|valid|test|all, got '%s'\n", val);
                return CLI_USAGE;
            }
            split = v;
        } else if (bk_run_config_set(&r, key, val) != BK_OK) {
            fprintf(stderr, "birkhoff data inspect: %s %s: %s\n", argv[i - 1], v, bk_last_error());
            return CLI_USAGE;
        }
    }
    if (!bk_data_known(name)) {
        fprintf(stderr, "birkhoff data inspect: unknown dataset '%s' (a built-in name, or FORMAT:PATH: docs/DATA.md)\n",
                name);
        return CLI_FAIL;
    }
    return data_inspect(name, split, &r);
}

int cmd_data(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage_data(argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_USAGE : CLI_OK;
    }
    const int inspect = !strcmp(argv[1], "inspect") || !strcmp(argv[1], "info");
    if ((!inspect && strcmp(argv[1], "export")) || argc < 3) {
        usage_data(stderr);
        return CLI_USAGE;
    }
    if (inspect) return inspect_main(argc, argv);
    const char *name = argv[2], *split = "train", *dir = NULL, *out = NULL;
    const cli_opt opts[] = {{"--split", &split, 0}, {"--data-dir", &dir, 0}, {"--out", &out, 0}};
    int done = 0, rc0 = cli_parse_opts("data", argc - 2, argv + 2, opts, 3, usage_data, &done);
    if (done || rc0) return rc0;
    if (!out || (strcmp(split, "train") && strcmp(split, "test"))) {
        fprintf(stderr, "birkhoff data export: needs --out FILE; --split train|test\n");
        return CLI_USAGE;
    }
    return data_export(name, !strcmp(split, "train") ? BK_SPLIT_TRAIN : BK_SPLIT_TEST, dir, out);
}
