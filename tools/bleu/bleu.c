/* bleu.c -- `birkhoff bleu`: corpus BLEU of a file of hypotheses against a
 * file of references, one sentence per line (bk_bleu_text,
 * include/birkhoff/metrics.h). */
#include "../cli.h"

#include <stdlib.h>
#include <string.h>

static void usage_bleu(FILE *f)
{
    fprintf(f, "usage: birkhoff bleu --hyp FILE --ref FILE [--tokenize 13a|none] [--order N] [--json] [--chrf]\n"
               "\n"
               "Corpus BLEU (one reference per sentence) of the hypotheses against the references, UTF-8\n"
               "text, one sentence per line (- reads standard input; the files must have as many lines).\n"
               "--tokenize 13a (default) is the WMT scoring script's tokenisation (sacreBLEU's default);\n"
               "none splits on whitespace only, for text already tokenised. --order N: n-grams up to N\n"
               "(default 4). Prints BLEU x 100, the n-gram precisions, the brevity penalty and the lengths.\n"
               "--chrf also prints chrF2 x 100 (sacreBLEU's default chrF: character 6-grams, beta 2,\n"
               "whitespace removed; \"chrf\" in the --json object).\n");
}

int cmd_bleu(int argc, char **argv)
{
    const char *hyp = NULL, *ref = NULL, *tok = "13a", *order = NULL, *json = NULL, *chrf = NULL;
    const cli_opt opts[] = {{"--hyp", &hyp, 0}, {"--ref", &ref, 0}, {"--tokenize", &tok, 0}, {"--order", &order, 0},
                            {"--json", &json, 1}, {"--chrf", &chrf, 1}};
    int done = 0, rc = cli_parse_opts("bleu", argc, argv, opts, 6, usage_bleu, &done);
    if (done || rc) return rc;
    bk_bleu_config cfg = bk_bleu_config_default();
    if (!hyp || !ref || (strcmp(tok, "13a") && strcmp(tok, "none")) ||
        (order && (!cli_parse_int(order, &cfg.max_order) || cfg.max_order < 1 || cfg.max_order > 8))) {
        fprintf(stderr, "birkhoff bleu: --hyp and --ref are required; --tokenize is 13a or none; --order in [1, 8]\n");
        usage_bleu(stderr);
        return CLI_USAGE;
    }
    if (!strcmp(hyp, "-") && !strcmp(ref, "-")) {
        fprintf(stderr, "birkhoff bleu: only one of --hyp and --ref can be standard input\n");
        return CLI_USAGE;
    }
    cfg.tokenize = strcmp(tok, "13a") ? BK_BLEU_TOKENIZE_NONE : BK_BLEU_TOKENIZE_13A;
    int nh = 0, nr = 0;
    char **H = cli_read_lines("bleu", hyp, &nh), **R = H ? cli_read_lines("bleu", ref, &nr) : NULL;
    int code = CLI_FAIL;
    bk_bleu_report r;
    if (!H || !R) goto out;
    if (nh != nr || nh == 0) {
        fprintf(stderr, "birkhoff bleu: %s has %d lines and %s has %d: they must be equal and not 0\n", hyp, nh, ref,
                nr);
        goto out;
    }
    if (bk_bleu_text((const char *const *)H, (const char *const *)R, nh, &cfg, &r) != BK_OK) {
        /* (sentence i of the library's message is line i + 1) */
        fprintf(stderr, "birkhoff bleu: --hyp %s, --ref %s: %s\n", hyp, ref, bk_last_error());
        goto out;
    }
    double cf = 0;
    if (chrf && bk_chrf_text((const char *const *)H, (const char *const *)R, nh, &cf) != BK_OK) {
        fprintf(stderr, "birkhoff bleu: --hyp %s, --ref %s: %s\n", hyp, ref, bk_last_error());
        goto out;
    }
    if (json) {
        printf("{");
        if (chrf) printf("\"chrf\": %.17g, ", cf);
        printf("\"bleu\": %.17g, \"bp\": %.17g, \"hyp_len\": %lld, \"ref_len\": %lld, \"sentences\": %d, "
               "\"order\": %d, \"tokenize\": \"%s\", \"precisions\": [",
               100.0 * r.bleu, r.bp, (long long)r.hyp_len, (long long)r.ref_len, nh, r.max_order, tok);
        for (int k = 0; k < r.max_order; k++) printf("%s%.17g", k ? ", " : "", 100.0 * r.precision[k]);
        printf("], \"matches\": [");
        for (int k = 0; k < r.max_order; k++) printf("%s%lld", k ? ", " : "", (long long)r.matches[k]);
        printf("], \"totals\": [");
        for (int k = 0; k < r.max_order; k++) printf("%s%lld", k ? ", " : "", (long long)r.totals[k]);
        printf("]}\n");
    } else {
        printf("BLEU = %.2f ", 100.0 * r.bleu);
        for (int k = 0; k < r.max_order; k++) printf("%s%.1f", k ? "/" : "", 100.0 * r.precision[k]);
        printf(" (BP = %.3f ratio = %.3f hyp_len = %lld ref_len = %lld; %d sentences, tokenize %s)\n", r.bp,
               r.ref_len ? (double)r.hyp_len / (double)r.ref_len : 0.0, (long long)r.hyp_len, (long long)r.ref_len,
               nh, tok);
        if (chrf) printf("chrF2 = %.2f (character 6-grams, beta 2, whitespace removed)\n", cf);
    }
    code = CLI_OK;
out:
    cli_free_lines(H, nh);
    cli_free_lines(R, nr);
    return code;
}
