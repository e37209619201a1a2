/* cli.h -- shared helpers of the birkhoff command-line program. */
#ifndef BK_CLI_H
#define BK_CLI_H
#include "birkhoff.h"

#include <stdint.h>

/* exit codes: 0 ok, 1 runtime failure (bad file, bad data), 2 usage error */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

double cli_now(void);                       /* monotonic seconds          */
int cli_parse_int(const char *s, int *out); /* 1 on success               */
int cli_parse_float(const char *s, float *out);
/* median and quartiles of n samples (sorts a copy) */
void cli_stats(const double *x, int n, double *med, double *p25, double *p75);
/* peak resident set size of this process in bytes */
long cli_peak_rss(void);

int cmd_attn(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_demo(int argc, char **argv);
#endif
