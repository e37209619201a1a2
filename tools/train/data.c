/* data.c -- `birkhoff data info`: open a dataset as training would
 * (bk_data_open, verifying its checksums) and print its size, shape, version
 * and label counts; `birkhoff data export spam`: a split's message bodies as
 * text, one a line (the input of scripts/data.sh spam-spm). */
#include "../cli.h"

#include <stdlib.h>
#include <string.h>

static void usage_data(FILE *f)
{
    fprintf(f, "usage: birkhoff data info NAME [--split train|test|valid] [--data-dir DIR] [--seq-len N] [--points N]\n"
               "       birkhoff data export spam --out FILE [--split train|test] [--data-dir DIR]\n"
               "\n"
               "info opens a dataset as `birkhoff train` would (verifying its checksums) and prints its size, shape,\n"
               "classes, label counts and version. Fetch stored datasets with scripts/data.sh NAME.\n"
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

int cmd_data(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage_data(argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_USAGE : CLI_OK;
    }
    if ((strcmp(argv[1], "info") && strcmp(argv[1], "export")) || argc < 3) {
        usage_data(stderr);
        return CLI_USAGE;
    }
    const char *name = argv[2], *split = "train", *dir = NULL, *len_s = NULL, *pts_s = NULL, *out = NULL;
    const cli_opt opts[] = {{"--split", &split, 0}, {"--data-dir", &dir, 0}, {"--seq-len", &len_s, 0},
                            {"--points", &pts_s, 0}, {"--out", &out, 0}};
    int done = 0, rc0 = cli_parse_opts("data", argc - 2, argv + 2, opts, 5, usage_data, &done);
    if (done || rc0) return rc0;
    if (!strcmp(argv[1], "export")) {
        if (!out || len_s || pts_s || (strcmp(split, "train") && strcmp(split, "test"))) {
            fprintf(stderr, "birkhoff data export: needs --out FILE; --split train|test; no --seq-len or --points\n");
            return CLI_USAGE;
        }
        return data_export(name, !strcmp(split, "train") ? BK_SPLIT_TRAIN : BK_SPLIT_TEST, dir, out);
    }
    if (out) {
        fprintf(stderr, "birkhoff data info: --out is for export\n");
        return CLI_USAGE;
    }
    bk_data_config o = bk_data_config_default();
    o.dir = dir;
    if ((len_s && (!cli_parse_int(len_s, &o.max_len) || o.max_len < 0)) ||
        (pts_s && (!cli_parse_int(pts_s, &o.points) || o.points < 0)) ||
        (strcmp(split, "train") && strcmp(split, "test") && strcmp(split, "valid"))) {
        fprintf(stderr, "birkhoff data: bad --seq-len or --points (integers >= 0; 0: the dataset's default) or "
                        "--split\n");
        return CLI_USAGE;
    }
    bk_dataset *dset;
    const bk_split sp = !strcmp(split, "train") ? BK_SPLIT_TRAIN : !strcmp(split, "test") ? BK_SPLIT_TEST : BK_SPLIT_VALID;
    if (bk_data_open(name, sp, &o, &dset) != BK_OK) {
        fprintf(stderr, "birkhoff data: %s\n", bk_last_error());
        return CLI_FAIL;
    }
    const bk_dataset_info *ds = bk_data_info(dset);
    printf("dataset   %s\nversion   %s\nsamples   %lld\nclasses   %d\n", ds->name, ds->version, (long long)ds->n,
           ds->classes);
    if (ds->kind == BK_INPUT_IMAGE) printf("input     images %d x %d x %d\n", ds->channels, ds->height, ds->width);
    else if (ds->seq2seq)
        printf("input     sentence pairs (vocabulary %d, source up to %d, target up to %d; %lld + %lld ids)\n",
               ds->vocab, ds->max_len, ds->tgt_max_len, (long long)ds->tokens_src, (long long)ds->tokens_tgt);
    else if (ds->kind == BK_INPUT_TOKENS) printf("input     tokens (vocabulary %d, up to %d)\n", ds->vocab, ds->max_len);
    else printf("input     point clouds (%d points x %d)\n", ds->points, ds->point_dim);
    /* label counts and mean length over (at most) the first 5000 samples */
    int64_t n = ds->n < 5000 ? ds->n : 5000;
    int64_t counts[64] = {0};
    double mlen = 0;
    bk_data_batch b;
    int ok = bk_data_batch_init(&b, dset, 1) == BK_OK;
    for (int64_t i = 0; ok && i < n; i++) {
        b.idx[0] = i;
        bk_batch bt;
        ok = bk_data_batch_fill(&b, dset, 1, &bt) == BK_OK;
        if (ok && b.labels && b.labels[0] >= 0 && b.labels[0] < 64) counts[b.labels[0]]++;
        if (ok && ds->kind == BK_INPUT_TOKENS) mlen += b.len[0];
    }
    if (ok) {
        if (ds->classes > 0) {
            printf("labels    (first %lld)", (long long)n);
            for (int k = 0; k < ds->classes && k < 64; k++) printf(" %lld", (long long)counts[k]);
            printf("\n");
        }
        if (ds->kind == BK_INPUT_TOKENS) printf("length    mean %.1f\n", mlen / (double)n);
    }
    bk_data_batch_free(&b);
    bk_data_close(dset);
    if (!ok) fprintf(stderr, "birkhoff data: cannot read the samples\n");
    return ok ? CLI_OK : CLI_FAIL;
}
