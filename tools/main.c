/* main.c -- the birkhoff command-line program: dispatch to the commands
 * (one folder each: attn/, otk/, asap/, model/, train/ (train, eval, data),
 * bleu/, translate/, plot/, bench/, demo/), with standard error escaped. */
#define _GNU_SOURCE
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xmmintrin.h>

/* ---- standard error, escaped ----------------------------------------------
 * Messages echo what the user gave (paths, argument values, lines of files):
 * none may drive the terminal (an ANSI escape, a '\r' that overwrites the
 * line, bytes that are not UTF-8). The one mechanism: stderr becomes a
 * glibc fopencookie stream whose writes go to descriptor 2 through the
 * library's bk_escape (BK_ESCAPE_KEEP_NL: '\n' and '\t' kept; control
 * characters as "\r", "\x1b", invalid UTF-8 as "\xNN", valid UTF-8 as it
 * is), so every fprintf(stderr, ...) of every command, perror, and the
 * library's own output are escaped. The stream is unbuffered, as stderr is:
 * each fprintf is one write, in order with everything else written to 2. A
 * UTF-8 sequence cut between two writes is held until the next one, and
 * written (escaped) at exit. The training progress bar, whose "\r\033[K" is
 * the program's own, writes through cli_stderr_raw(). */
typedef struct {
    char held[4]; /* the start of a UTF-8 sequence the next write may finish */
    size_t nheld;
} esc_sink;

static esc_sink g_sink;
static FILE *g_raw_stderr;

FILE *cli_stderr_raw(void) { return g_raw_stderr ? g_raw_stderr : stderr; }

static int write_all(const char *p, size_t n)
{
    while (n) {
        const ssize_t w = write(2, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* escapes held + buf[0..n) and writes it; an unfinished sequence at the end
 * is held (keep) or escaped as it is (at exit) */
static int esc_out(esc_sink *s, const char *buf, size_t n, int keep)
{
    enum { CHUNK = 1024 };
    char in[CHUNK + 4], out[4 * (CHUNK + 4) + 1]; /* at most 4 bytes out per byte in */
    size_t done = 0;
    do {
        const size_t take = n - done < CHUNK ? n - done : CHUNK;
        size_t m = s->nheld;
        memcpy(in, s->held, m);
        memcpy(in + m, buf + done, take);
        m += take;
        s->nheld = keep ? bk_escape_tail(in, m) : 0;
        m -= s->nheld;
        memcpy(s->held, in + m, s->nheld);
        if (write_all(out, bk_escape(out, sizeof out, in, m, BK_ESCAPE_KEEP_NL))) return -1;
        done += take;
    } while (done < n);
    return 0;
}

static ssize_t esc_write(void *cookie, const char *buf, size_t n)
{
    return esc_out(cookie, buf, n, 1) ? -1 : (ssize_t)n;
}

static void esc_at_exit(void)
{
    flockfile(stderr);
    if (g_sink.nheld) esc_out(&g_sink, "", 0, 0);
    funlockfile(stderr);
}

static void escape_stderr(void)
{
    cookie_io_functions_t io = {NULL, esc_write, NULL, NULL};
    FILE *f = fopencookie(&g_sink, "w", io);
    if (!f) return; /* out of memory: the plain stream */
    setvbuf(f, NULL, _IONBF, 0);
    fflush(stderr);
    g_raw_stderr = stderr;
    stderr = f;
    atexit(esc_at_exit);
}

static void usage(FILE *f)
{
    fprintf(f,
            "birkhoff %s -- doubly-stochastic (optimal-transport) attention\n"
            "\n"
            "usage: birkhoff COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  train   train a model on a dataset (progress, metrics, checkpoints, --resume)\n"
            "  eval    accuracy, confusion and attention diagnostics of a checkpoint on a dataset\n"
            "  plot    figures: training curves, attention maps, column-sum histograms, transport plans\n"
            "  data    inspect a dataset (fetch stored ones with scripts/data.sh)\n"
            "  translate  translate sentences (text or ids) with a seq2seq checkpoint; --ref scores them\n"
            "  bleu    corpus BLEU of a file of translations against a file of references\n"
            "  attn    run an attention operator on .npy files (forward, and backward with --dout)\n"
            "  otk     OTK embedding: embed sets onto references, fit anchors and references\n"
            "  asap    compile Sinkhorn into ASAP: a trained model (compile) or a layer (calibrate, report, ...)\n"
            "  model   transformer models: create, differentiate, train on .npy batches, show, swap attention\n"
            "  bench   benchmark operators over a shape grid against the PyTorch peers\n"
            "  demo    Sinkhorn vs softmax attention on generated data: marginals and timings\n"
            "  version print the version and the kernel instruction set\n"
            "\n"
            "`birkhoff COMMAND --help` describes each command.\n",
            bk_version());
}

int main(int argc, char **argv)
{
    /* Subnormal floats: training produces them (measured: a ViT on MNIST ran
     * at 80 samples/s instead of 2050 once they appeared, each one costing a
     * microcode assist). The program flushes them to zero (FTZ | DAZ in
     * MXCSR) before any thread exists, so every OpenMP thread inherits the
     * mode and results stay thread-count independent.
     * BK_KEEP_DENORMALS=1 keeps IEEE gradual underflow. */
    if (!getenv("BK_KEEP_DENORMALS")) _mm_setcsr(_mm_getcsr() | 0x8040);
    escape_stderr();
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "plot")) return cmd_plot(argc - 1, argv + 1);
    if (!strcmp(cmd, "data")) return cmd_data(argc - 1, argv + 1);
    if (!strcmp(cmd, "bleu")) return cmd_bleu(argc - 1, argv + 1);
    if (!strcmp(cmd, "translate")) return cmd_translate(argc - 1, argv + 1);
    if (!strcmp(cmd, "attn")) return cmd_attn(argc - 1, argv + 1);
    if (!strcmp(cmd, "otk")) return cmd_otk(argc - 1, argv + 1);
    if (!strcmp(cmd, "asap")) return cmd_asap(argc - 1, argv + 1);
    if (!strcmp(cmd, "model")) return cmd_model(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "demo")) return cmd_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        if (argc > 2) {
            fprintf(stderr, "birkhoff version: takes no arguments (got '%s')\n", argv[2]);
            return CLI_USAGE;
        }
        printf("birkhoff %s (kernels: %s, threads: %d)\n", bk_version(), bk_isa(), bk_get_num_threads());
        return CLI_OK;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return CLI_OK;
    }
    fprintf(stderr, "birkhoff: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return CLI_USAGE;
}
