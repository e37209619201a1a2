/* cli.h -- the birkhoff command-line program: the helpers shared by its
 * commands (cli.c) and the commands' entry points. Each command lives in its
 * own folder and depends on the library (birkhoff.h) and this header only:
 *   attn/   birkhoff attn                 otk/    birkhoff otk
 *   asap/   birkhoff asap (+ compile)     model/  birkhoff model
 *   train/  birkhoff train, eval, data    plot/   birkhoff plot (chart.c: cairo)
 *   bench/  birkhoff bench (--op ...)     demo/   birkhoff demo
 *   bleu/   birkhoff bleu                 translate/ birkhoff translate
 * The mechanisms (datasets, training runs, evaluation, ASAP compilation) are
 * the library's (birkhoff/data.h, birkhoff/train.h); a command parses its
 * arguments, calls them and prints. */
#ifndef BK_CLI_H
#define BK_CLI_H
#include "birkhoff.h"

#include <stdint.h>
#include <stdio.h>

/* exit codes: 0 ok, 1 runtime failure (bad file, bad data), 2 usage error */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };
/* stderr is escaped (main.c: control characters, ANSI escapes and invalid
 * UTF-8 shown as "\xNN"); this is the plain stream, for the program's own
 * terminal controls only (the training progress bar's "\r\033[K") */
FILE *cli_stderr_raw(void);

double cli_now(void);                       /* monotonic seconds          */
int cli_parse_int(const char *s, int *out); /* 1 on success               */
/* a finite float32 (1 on success): inf, nan, "1e39" (overflows float32) and
 * "1e-50" (underflows to 0) are refused */
int cli_parse_float(const char *s, float *out);
/* a decimal integer in [0, 2^64) without sign or spaces ("-1", "1e23" and
 * 2^64 are refused); 1 on success */
int cli_parse_u64(const char *s, uint64_t *out);
/* a decimal integer in [lo, hi]; 1 on success */
int cli_parse_range(const char *s, long long lo, long long hi, long long *out);
/* median and quartiles of n samples (sorts a copy) */
void cli_stats(const double *x, int n, double *med, double *p25, double *p75);
/* whether `bytes` (a size computed in double: no product wraps) fit in this
 * machine's physical memory; if not, "birkhoff CMD: WHAT is too large: it
 * needs X GiB, this machine has Y GiB" on stderr and 0 (a benchmark's
 * allocation would succeed lazily and the kernel kill it while filling) */
int cli_fits_memory(const char *cmd, const char *what, double bytes);
/* reproducible benchmark inputs: uniform values of standard deviation ~sd */
void cli_fill(float *x, size_t n, unsigned seed, float sd);
/* the number after "key": (optional spaces) in a one-line JSON object (NAN
 * if absent or not a number) */
double cli_json_num(const char *line, const char *key);
/* peak resident set size of this process in bytes */
long cli_peak_rss(void);

/* Options: "--flag value" pairs, or switches (is_switch: no value, *dst set
 * to "1"). --help/-h prints usage to stdout and returns CLI_OK through *done.
 * Returns CLI_OK, or CLI_USAGE after a message on stderr. */
typedef struct {
    const char *flag;
    const char **dst;
    int is_switch;
} cli_opt;
/* One key flag (birkhoff train's --KEY VALUE or --set KEY=VALUE): flag is the
 * argument (--set, or --KEY) and v the one after it; key receives KEY with
 * '-' read as '_', val the value. 0 after a message "birkhoff PROG: --set
 * expects KEY=VALUE, got '...'" when a --set is malformed or its key too
 * long; 1 otherwise. */
int cli_key_flag(const char *prog, const char *flag, const char *v, char *key, size_t kcap, char *val, size_t vcap);
int cli_parse_opts(const char *prog, int argc, char **argv, const cli_opt *opts, int nopt,
                   void (*usage)(FILE *), int *done);
/* Parses --cases "a:b:c,..." with k positive integers per case into out
 * [max * k]; returns the number of cases, or -1 after a message naming form. */
int cli_parse_tuples(const char *prog, const char *list, int k, int *out, int max, const char *form);
/* the machine's measured FMA and exp peaks for nt threads (GFLOP/s, Gexp/s) */
void cli_peak(int nt, double *gf, double *ge);
/* Reads a float32 .npy of ndim dimensions, each in [1, 2^31). 1 on success,
 * else a message on stderr naming prog, what and path. */
int cli_load_f32(const char *prog, const char *what, const char *path, int ndim, bk_npy *a);
/* Reads an int32 [B] lengths array. */
int cli_load_len(const char *prog, const char *what, const char *path, int64_t B, bk_npy *a);
/* All-or-nothing output: the .npy files of one command in one output set
 * (bk_outset_add: staged beside their paths, renamed together, put back if a
 * rename fails; a device or FIFO written into). Entries with path NULL are
 * skipped. Returns 1 on success, else a message on stderr naming prog. */
typedef struct {
    const char *path;
    int ndim;
    const int64_t *shape;
    const float *data;
} cli_output;
int cli_write_outputs(const char *prog, int n, const cli_output *outs);
/* The two halves, for a command whose outputs include other files (a
 * checkpoint: bk_checkpoint_stage): stage into set (flags: bk_outset_add's;
 * BK_OUT_NOFOLLOW for files the command names itself), then commit the set.
 * Each returns 1 on success, else 0 after a message naming prog; the caller
 * frees the set (bk_outset_free discards what was not committed). */
int cli_stage_outputs(const char *prog, bk_outset *set, unsigned flags, int n, const cli_output *outs);
int cli_commit(const char *prog, bk_outset *set);

/* Writes text to path atomically (temporary file, rename); 1 on success,
 * else a message on stderr naming prog. */
int cli_write_text(const char *prog, const char *path, const char *text);

/* The lines of a text file, or of standard input for "-" (without their
 * '\n'), read by the library's bounded reader (birkhoff/core.h, "Text
 * files": lines of at most BK_TEXT_MAX_LINE bytes, BK_TEXT_MAX_BYTES in all,
 * BK_TEXT_MAX_LINES lines, no NUL byte, not a directory): a malloc'd array
 * of *count strings (never NULL on success, even when empty; the strings
 * share one block), freed by cli_free_lines; NULL after a message on stderr
 * naming prog and path. */
char **cli_read_lines(const char *prog, const char *path, int *count);
void cli_free_lines(char **lines, int count);
/* frees an array of count strings each malloc'd on its own, and the array */
void cli_free_each(char **lines, int count);

/* structured synthetic Q, K, V [B,H,N,d] (`asap generate`, `bench --op
 * asap`); 1 on success */
int asap_synth(int B, int H, int N, int d, uint64_t seed, float temp, float *Q, float *K, float *V);

/* the commands (argv[0] is the command's name) */
int cmd_attn(int argc, char **argv);      /* attn/attn.c   */
int cmd_otk(int argc, char **argv);       /* otk/otk.c     */
int cmd_asap(int argc, char **argv);      /* asap/asap.c   */
int asap_compile(int argc, char **argv);  /* asap/compile.c: asap compile */
int cmd_model(int argc, char **argv);     /* model/model.c */
int cmd_train(int argc, char **argv);     /* train/train.c */
int cmd_eval(int argc, char **argv);      /* train/eval.c  */
int cmd_data(int argc, char **argv);      /* train/data.c  */
int cmd_bleu(int argc, char **argv);      /* bleu/bleu.c   */
int cmd_translate(int argc, char **argv); /* translate/translate.c */
int cmd_plot(int argc, char **argv);      /* plot/plot.c   */
int cmd_bench(int argc, char **argv);     /* bench/bench.c */
int bench_otk(int argc, char **argv);     /* bench/bench_otk.c: bench --op otk */
int bench_asap(int argc, char **argv);    /* bench/bench_asap.c: bench --op asap */
int bench_train(int argc, char **argv);   /* bench/bench_train.c: bench --op train */
/* bench/load.c: competing processes for `bench --load N --load-job N` */
typedef struct {
    int n, busy, jobs;
    int *pid;
} bench_load;
int bench_load_args(int *argc, char **argv, int *busy, int *jobs); /* removes them; -1: bad */
int bench_load_start(bench_load *ld, int busy, int jobs);           /* -1: failed, nothing left */
void bench_load_stop(bench_load *ld);                               /* kills and reaps them */
int cmd_demo(int argc, char **argv);      /* demo/demo.c   */
#endif
