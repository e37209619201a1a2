/* data.c -- `birkhoff data info`: open a dataset as training would
 * (bk_data_open, verifying its checksums) and print its size, shape, version
 * and label counts. */
#include "../cli.h"

#include <string.h>

static void usage_data(FILE *f)
{
    fprintf(f, "usage: birkhoff data info NAME [--split train|test|valid] [--data-dir DIR] [--seq-len N] [--points N]\n"
               "\n"
               "Opens a dataset as `birkhoff train` would (verifying its checksums) and prints its size, shape,\n"
               "classes, label counts and version. Fetch stored datasets with scripts/data.sh NAME.\n");
}

int cmd_data(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage_data(argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_USAGE : CLI_OK;
    }
    if (strcmp(argv[1], "info") || argc < 3) {
        usage_data(stderr);
        return CLI_USAGE;
    }
    const char *name = argv[2], *split = "train", *dir = NULL, *len_s = NULL, *pts_s = NULL;
    const cli_opt opts[] = {{"--split", &split, 0}, {"--data-dir", &dir, 0}, {"--seq-len", &len_s, 0},
                            {"--points", &pts_s, 0}};
    int done = 0, rc0 = cli_parse_opts("data info", argc - 2, argv + 2, opts, 4, usage_data, &done);
    if (done || rc0) return rc0;
    bk_data_config o = bk_data_config_default();
    o.dir = dir;
    if ((len_s && !cli_parse_int(len_s, &o.max_len)) || (pts_s && !cli_parse_int(pts_s, &o.points)) ||
        (strcmp(split, "train") && strcmp(split, "test") && strcmp(split, "valid"))) {
        fprintf(stderr, "birkhoff data: bad --seq-len, --points or --split\n");
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
