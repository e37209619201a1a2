/* main.c -- the birkhoff command-line program: dispatch to the commands
 * (one folder each: attn/, otk/, asap/, model/, train/ (train, eval, data),
 * bleu/, translate/, plot/, bench/, demo/). */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xmmintrin.h>

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
