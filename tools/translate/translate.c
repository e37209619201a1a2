/* translate.c -- `birkhoff translate`: translates a file of sentences, one a
 * line, with a seq2seq checkpoint (bk_model_translate, include/birkhoff/nn.h).
 * Raw text is encoded and the output decoded with the checkpoint's
 * SentencePiece model through the library (bk_spm_*, birkhoff/data.h);
 * --ids reads and writes space-separated ids. The sentences are sorted by
 * length into batches, translated, put back in input order and written
 * atomically; --ref scores the output (corpus BLEU, chrF) on stderr.
 * docs/TRANSLATION.md, "Translating". */
#include "../cli.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void usage_translate(FILE *f)
{
    fprintf(f,
            "usage: birkhoff translate --ckpt CKPT [--input FILE|-] [--output FILE] [--ids] [--spm MODEL]\n"
            "                          [--beam K] [--len-penalty A] [--len-a A] [--len-b B] [--no-cache]\n"
            "                          [--batch N] [--ref FILE] [--threads T]\n"
            "\n"
            "Translates the sentences of --input (one a line; default or -: standard input) with the\n"
            "arch=seq2seq checkpoint CKPT and writes one translation a line, in input order, to --output\n"
            "(written to a temporary file, then renamed) or standard output.\n"
            "  --ids            the input lines are space-separated token ids (EOS not included) and the\n"
            "                   output is ids; otherwise the text is encoded and the output decoded with\n"
            "                   the SentencePiece model (through the library: no tool is run)\n"
            "  --spm MODEL      the SentencePiece model; default: the run's spm_model (the model a run on\n"
            "                   text data trained and wrote as DIR/spm.model, or the one it was given),\n"
            "                   else DATA_DIR/bible/spm.model when CKPT was trained on the dataset bible\n"
            "                   (DATA_DIR: the run's data_dir, else $BK_DATA, else data); required otherwise\n"
            "  --beam K         beam size (default 5; 1: greedy)\n"
            "  --len-penalty A  score = sum(log p) / len^A (default 1)\n"
            "  --len-a A, --len-b B  at most min(tgt_max_len, A * source length + B) tokens (1.5, 10)\n"
            "  --no-cache       recompute the decoder's prefix at each step (same output, slower)\n"
            "  --batch N        sentences per decoding call, sorted by length (default 64)\n"
            "  --ref FILE       references, one a line: print corpus BLEU (13a; with --ids: the ids as\n"
            "                   tokens) and chrF2 (character 6-grams, whitespace removed; text only)\n"
            "  --threads T      threads (default: all)\n"
            "Every input line must be non-empty and, with its EOS, at most the model's max_len tokens,\n"
            "with ids in [0, vocab): a line that is not is an error naming it (nothing is written).\n"
            "The time and sentences/s of the decoding are printed on stderr.\n");
}

/* ------------------------------------------------------------------------ */
/* SentencePiece through the library                                        */
/* ------------------------------------------------------------------------ */
/* the lines encoded as space-separated ids (what parse_ids reads); NULL
 * after a message naming the line */
static char **spm_encode_lines(const bk_spm *sp, const char *src, char *const *lines, int n)
{
    char **res = calloc((size_t)(n > 0 ? n : 1), sizeof(char *));
    int32_t *ids = NULL;
    int cap = 0;
    for (int i = 0; res && i < n; i++) {
        int k = 0;
        if (bk_spm_encode(sp, lines[i], NULL, 0, &k) != BK_OK) {
            fprintf(stderr, "birkhoff translate: %s: line %d: %s\n", src, i + 1, bk_last_error());
            goto fail;
        }
        if (k > cap) {
            int32_t *nb = realloc(ids, sizeof(int32_t) * (size_t)k);
            if (!nb) goto nomem;
            ids = nb;
            cap = k;
        }
        bk_spm_encode(sp, lines[i], ids, k, &k);
        char *buf = malloc((size_t)k * 12 + 1);
        if (!buf) goto nomem;
        size_t used = 0;
        buf[0] = 0;
        for (int t = 0; t < k; t++) used += (size_t)snprintf(buf + used, 13, t ? " %d" : "%d", (int)ids[t]);
        res[i] = buf;
    }
    free(ids);
    return res;
nomem:
    fprintf(stderr, "birkhoff translate: out of memory\n");
fail:
    free(ids);
    cli_free_each(res, n);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* the command                                                              */
/* ------------------------------------------------------------------------ */
/* parses a line of ids into out (cap entries); the count, or -1 after a
 * message naming the line */
static int parse_ids(const char *src, int line, const char *s, int32_t *out, int cap, int vocab, int max_len)
{
    int n = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        const char *q = p;
        while (*q && *q != ' ' && *q != '\t') q++;
        char tok[24];
        size_t tl = (size_t)(q - p);
        int v;
        if (tl >= sizeof tok) tl = sizeof tok - 1;
        memcpy(tok, p, tl);
        tok[tl] = 0;
        if ((size_t)(q - p) >= sizeof tok || !cli_parse_int(tok, &v)) {
            fprintf(stderr, "birkhoff translate: %s: line %d: '%.*s' is not a token id\n", src, line,
                    (int)(q - p > 40 ? 40 : q - p), p);
            return -1;
        }
        if (v < 0 || v >= vocab) {
            fprintf(stderr, "birkhoff translate: %s: line %d: id %d outside the vocabulary [0, %d)\n", src, line, v,
                    vocab);
            return -1;
        }
        if (n < cap) out[n] = v;
        n++;
        p = q;
    }
    if (n == 0) {
        fprintf(stderr, "birkhoff translate: %s: line %d is empty: every line must be a sentence\n", src, line);
        return -1;
    }
    if (n + 1 > max_len) {
        fprintf(stderr,
                "birkhoff translate: %s: line %d has %d tokens, %d with its EOS: longer than the model's "
                "max_len %d\n",
                src, line, n, n + 1, max_len);
        return -1;
    }
    return n;
}

typedef struct {
    int len, idx;
} order_key;

static int cmp_order(const void *x, const void *y)
{
    const order_key *p = x, *q = y;
    if (p->len != q->len) return p->len < q->len ? -1 : 1;
    return (p->idx > q->idx) - (p->idx < q->idx);
}

/* appends s to a growing buffer; 1 on success */
static int sb_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 4096;
        while (*len + n + 1 > c) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return 0;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return 1;
}

int cmd_translate(int argc, char **argv)
{
    const char *ckpt = NULL, *input = "-", *output = NULL, *ids = NULL, *spm = NULL, *beam_s = NULL, *lp_s = NULL,
               *la_s = NULL, *lb_s = NULL, *nocache = NULL, *batch_s = NULL, *ref = NULL, *threads_s = NULL;
    const cli_opt opts[] = {{"--ckpt", &ckpt, 0},      {"--input", &input, 0},   {"--output", &output, 0},
                            {"--ids", &ids, 1},        {"--spm", &spm, 0},       {"--beam", &beam_s, 0},
                            {"--len-penalty", &lp_s, 0}, {"--len-a", &la_s, 0},  {"--len-b", &lb_s, 0},
                            {"--no-cache", &nocache, 1}, {"--batch", &batch_s, 0}, {"--ref", &ref, 0},
                            {"--threads", &threads_s, 0}};
    int done = 0,
        rc0 = cli_parse_opts("translate", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), usage_translate,
                             &done);
    if (done || rc0) return rc0;
    int batch = 64, threads = 0;
    if (!ckpt || (batch_s && (!cli_parse_int(batch_s, &batch) || batch < 1 || batch > 65536)) ||
        (threads_s && (!cli_parse_int(threads_s, &threads) || threads < 1 || threads > 4096))) {
        fprintf(stderr, "birkhoff translate: needs --ckpt; --batch in [1, 65536]; --threads in [1, 4096]\n");
        usage_translate(stderr);
        return CLI_USAGE;
    }
    bk_decode_config dc = bk_decode_config_default();
    const char *dkeys[] = {"beam", "len_penalty", "len_a", "len_b"}, *dvals[] = {beam_s, lp_s, la_s, lb_s};
    const char *dflags[] = {"--beam", "--len-penalty", "--len-a", "--len-b"};
    for (int i = 0; i < 4; i++) {
        if (dvals[i] && bk_decode_config_set(&dc, dkeys[i], dvals[i]) != BK_OK) {
            fprintf(stderr, "birkhoff translate: %s %s: %s\n", dflags[i], dvals[i], bk_last_error());
            return CLI_USAGE;
        }
    }
    if (nocache) dc.cache = 0;
    if (ref && !strcmp(ref, "-") && !strcmp(input, "-")) {
        fprintf(stderr, "birkhoff translate: only one of --input and --ref can be standard input\n");
        return CLI_USAGE;
    }
    if (threads > 0) bk_set_num_threads(threads);

    /* the checkpoint's configuration first: a wrong model fails before any work */
    bk_model_config mc;
    if (bk_checkpoint_config(ckpt, &mc) != BK_OK) {
        fprintf(stderr, "birkhoff translate: %s\n", bk_last_error());
        return CLI_FAIL;
    }
    if (mc.arch != BK_ARCH_SEQ2SEQ) {
        fprintf(stderr,
                "birkhoff translate: %s is not an encoder-decoder model (arch=classifier): translate needs an "
                "arch=seq2seq checkpoint\n",
                ckpt);
        return CLI_FAIL;
    }

    int code = CLI_FAIL, n = 0, nref = 0;
    char **lines = NULL, **enc = NULL, **R = NULL, **outl = NULL, *extra = NULL, *text = NULL, spm_buf[1100];
    int32_t *src = NULL, *srclen = NULL, *out = NULL, *outlen = NULL, *bsrc = NULL, *blen = NULL;
    bk_spm *sp = NULL;
    order_key *ord = NULL;
    bk_model *m = NULL;

    lines = cli_read_lines("translate", input, &n);
    if (!lines) goto out;
    const char *src_name = strcmp(input, "-") ? input : "standard input";
    if (n == 0) {
        fprintf(stderr, "birkhoff translate: %s has no lines\n", src_name);
        goto out;
    }
    if (ref) {
        R = cli_read_lines("translate", ref, &nref);
        if (!R) goto out;
        if (nref != n) {
            fprintf(stderr, "birkhoff translate: %s has %d lines and %s has %d: they must be equal\n", src_name, n, ref,
                    nref);
            goto out;
        }
    }
    /* the model (its batch: the sentences', up to --batch) and its run */
    const int maxb = batch < n ? batch : n;
    if (bk_checkpoint_load(ckpt, maxb, &m, NULL, &extra) != BK_OK) {
        fprintf(stderr, "birkhoff translate: %s\n", bk_last_error());
        goto out;
    }
    /* the SentencePiece model: --spm, else the run's spm_model, else the bible run's */
    if (!ids && !spm) {
        bk_run_config rc;
        const int have_run = extra && bk_run_config_from_extra(extra, &rc) == BK_OK;
        if (have_run && rc.spm_model[0]) {
            snprintf(spm_buf, sizeof spm_buf, "%s", rc.spm_model);
            spm = spm_buf;
        } else if (have_run && !strcmp(rc.data, "bible")) {
            const char *dd = rc.data_dir[0] ? rc.data_dir : getenv("BK_DATA");
            if (!dd || !*dd) dd = "data";
            snprintf(spm_buf, sizeof spm_buf, "%s/bible/spm.model", dd);
            spm = spm_buf;
        } else {
            fprintf(stderr,
                    "birkhoff translate: raw text needs --spm MODEL (the SentencePiece model of the checkpoint's "
                    "vocabulary): %s has no run with an spm_model and was not trained on the dataset bible; or give "
                    "--ids\n",
                    ckpt);
            code = CLI_USAGE;
            goto out;
        }
    }
    if (!ids && bk_spm_load_file(spm, &sp) != BK_OK) {
        fprintf(stderr, "birkhoff translate: SentencePiece model: %s%s\n", bk_last_error(),
                spm == spm_buf ? " (the run's model; scripts/data.sh bible-spm builds the bible one; or give --spm)"
                               : "");
        goto out;
    }
    if (sp && bk_spm_vocab(sp) != mc.vocab) {
        fprintf(stderr,
                "birkhoff translate: the SentencePiece model %s has %d pieces, the checkpoint's vocabulary %d: not "
                "the model it was trained with\n",
                spm, bk_spm_vocab(sp), mc.vocab);
        goto out;
    }
    if (!ids) {
        for (int i = 0; i < n; i++) { /* a blank line encodes to spaces: not a sentence */
            const char *p = lines[i];
            while (*p == ' ' || *p == '\t') p++;
            if (!*p) {
                fprintf(stderr, "birkhoff translate: %s: line %d is empty: every line must be a sentence\n", src_name,
                        i + 1);
                goto out;
            }
        }
        enc = spm_encode_lines(sp, src_name, lines, n);
        if (!enc) goto out;
    }

    /* the sources [n, max_len], each with its EOS */
    const int L = mc.max_len, T = mc.tgt_max_len;
    src = malloc(sizeof(int32_t) * (size_t)n * (size_t)L);
    srclen = malloc(sizeof(int32_t) * (size_t)n);
    out = malloc(sizeof(int32_t) * (size_t)n * (size_t)T);
    outlen = malloc(sizeof(int32_t) * (size_t)n);
    ord = malloc(sizeof(order_key) * (size_t)n);
    if (!src || !srclen || !out || !outlen || !ord) {
        fprintf(stderr, "birkhoff translate: out of memory\n");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        int k = parse_ids(src_name, i + 1, (enc ? enc : lines)[i], src + (size_t)i * L, L, mc.vocab, L);
        if (k < 0) goto out;
        src[(size_t)i * L + k] = mc.eos;
        srclen[i] = k + 1;
        ord[i].len = k + 1;
        ord[i].idx = i;
    }
    qsort(ord, (size_t)n, sizeof(order_key), cmp_order);

    bsrc = malloc(sizeof(int32_t) * (size_t)maxb * (size_t)L);
    blen = malloc(sizeof(int32_t) * (size_t)maxb * 2);
    if (!bsrc || !blen) {
        fprintf(stderr, "birkhoff translate: out of memory\n");
        goto out;
    }
    double t0 = cli_now();
    int64_t ntok = 0;
    for (int s = 0; s < n; s += maxb) {
        const int B = n - s < maxb ? n - s : maxb;
        const int stride = ord[s + B - 1].len; /* sorted: the batch's longest */
        for (int b = 0; b < B; b++) {
            const int i = ord[s + b].idx;
            for (int t = 0; t < stride; t++) bsrc[(size_t)b * stride + t] = t < srclen[i] ? src[(size_t)i * L + t] : mc.eos;
            blen[b] = srclen[i];
        }
        /* the outputs land in sorted order in out's first rows of this batch,
         * then are moved to their input rows below */
        int32_t *bout = malloc(sizeof(int32_t) * (size_t)B * (size_t)T);
        if (!bout) {
            fprintf(stderr, "birkhoff translate: out of memory\n");
            goto out;
        }
        if (bk_model_translate(m, bsrc, stride, blen, B, &dc, bout, T, blen + maxb, NULL) != BK_OK) {
            fprintf(stderr, "birkhoff translate: %s\n", bk_last_error());
            free(bout);
            goto out;
        }
        for (int b = 0; b < B; b++) {
            const int i = ord[s + b].idx;
            memcpy(out + (size_t)i * T, bout + (size_t)b * T, sizeof(int32_t) * (size_t)blen[maxb + b]);
            outlen[i] = blen[maxb + b];
            ntok += blen[maxb + b];
        }
        free(bout);
    }
    const double secs = cli_now() - t0;

    /* the output lines: ids, or the text they decode to */
    outl = calloc((size_t)n, sizeof(char *));
    if (!outl) goto out;
    for (int i = 0; i < n && sp; i++)
        if (bk_spm_decode(sp, out + (size_t)i * T, outlen[i], &outl[i]) != BK_OK) {
            fprintf(stderr, "birkhoff translate: decoding line %d: %s\n", i + 1, bk_last_error());
            goto out;
        }
    for (int i = 0; i < n && !sp; i++) {
        char *buf = NULL;
        size_t len = 0, cap = 0;
        if (!sb_add(&buf, &len, &cap, "", 0)) goto out;
        for (int t = 0; t < outlen[i]; t++) {
            char num[16];
            int k = snprintf(num, sizeof num, t ? " %d" : "%d", (int)out[(size_t)i * T + t]);
            if (!sb_add(&buf, &len, &cap, num, (size_t)k)) {
                free(buf);
                goto out;
            }
        }
        outl[i] = buf;
    }
    size_t tlen = 0, tcap = 0;
    for (int i = 0; i < n; i++)
        if (!sb_add(&text, &tlen, &tcap, outl[i], strlen(outl[i])) || !sb_add(&text, &tlen, &tcap, "\n", 1)) {
            fprintf(stderr, "birkhoff translate: out of memory\n");
            goto out;
        }
    if (output) {
        if (!cli_write_text("translate", output, text)) goto out;
    } else if (fwrite(text, 1, tlen, stdout) != tlen || fflush(stdout) != 0) {
        fprintf(stderr, "birkhoff translate: writing standard output: %s\n", strerror(errno));
        goto out;
    }
    fprintf(stderr, "translate: %d sentences, %lld tokens out in %.3f s (%.1f sentences/s; beam %d, batch %d, %s)\n",
            n, (long long)ntok, secs, secs > 0 ? n / secs : 0.0, dc.beam, maxb, dc.cache ? "cached" : "no cache");
    if (R) {
        bk_bleu_config bc = bk_bleu_config_default();
        bc.tokenize = ids ? BK_BLEU_TOKENIZE_NONE : BK_BLEU_TOKENIZE_13A;
        bk_bleu_report br;
        if (bk_bleu_text((const char *const *)outl, (const char *const *)R, n, &bc, &br) != BK_OK) {
            fprintf(stderr, "birkhoff translate: %s\n", bk_last_error());
            goto out;
        }
        fprintf(stderr, "BLEU = %.2f ", 100.0 * br.bleu);
        for (int k = 0; k < br.max_order; k++) fprintf(stderr, "%s%.1f", k ? "/" : "", 100.0 * br.precision[k]);
        fprintf(stderr, " (BP = %.3f ratio = %.3f hyp_len = %lld ref_len = %lld; %d sentences, tokenize %s)\n", br.bp,
                br.ref_len ? (double)br.hyp_len / (double)br.ref_len : 0.0, (long long)br.hyp_len,
                (long long)br.ref_len, n, ids ? "none (ids)" : "13a");
        if (!ids) {
            double c = 0;
            if (bk_chrf_text((const char *const *)outl, (const char *const *)R, n, &c) != BK_OK) {
                fprintf(stderr, "birkhoff translate: %s\n", bk_last_error());
                goto out;
            }
            fprintf(stderr, "chrF2 = %.2f (character 6-grams, beta 2, whitespace removed)\n", c);
        }
    }
    code = CLI_OK;
out:
    cli_free_lines(lines, n);
    cli_free_each(enc, enc ? n : 0);
    cli_free_lines(R, nref);
    cli_free_each(outl, outl ? n : 0); /* each line its own string */
    bk_spm_free(sp);
    free(text);
    free(extra);
    free(src);
    free(srclen);
    free(out);
    free(outlen);
    free(ord);
    free(bsrc);
    free(blen);
    bk_model_free(m);
    return code;
}
