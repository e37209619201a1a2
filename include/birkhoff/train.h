/* birkhoff/train.h -- training runs on datasets: the run configuration, the
 * training loop (metrics, checkpoints, interruption and bit-for-bit resume),
 * evaluation, attention diagnostics and the ASAP compilation of a trained
 * model (docs/TRAINING.md). `birkhoff train|eval|plot|asap compile` are this
 * API plus argument parsing and printing.
 * Part of the public API; include <birkhoff.h> (all of it) or this file. The
 * conventions every function follows are at the top of birkhoff/core.h: a
 * function returns a bk_status and, on failure, bk_last_error() gives the
 * reason. */
#ifndef BIRKHOFF_TRAIN_H
#define BIRKHOFF_TRAIN_H

#include <signal.h>

#include "data.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* The run configuration                                                    */
/* ------------------------------------------------------------------------ */
/* One flat namespace of "key=value" settings: the run keys below (by their
 * field names, except data_config's: train_limit, seq_len, min_len,
 * listops_depth, points, noise, gen_train, gen_test, data_seed), then the
 * model keys of bk_model_config and the optimiser keys of bk_optim_config.
 * The text form (bk_run_config_format) is what a run records in config.txt
 * and in its checkpoints; it loads back to the same configuration. */
typedef struct {
    char data[1024];        /* dataset: a built-in name or a FORMAT:PATH spec
                               (bk_data_known; docs/DATA.md)                   */
    char data_valid[1024];  /* the validation split's own files (a spec or a
                               bare PATH of data's FORMAT); "": carved by
                               data_config.valid_frac (key valid_frac; runs
                               default to 0.1, a run stored before the key
                               existed reads 0: no validation split)          */
    char data_test[1024];   /* the test split's own files; "": a spec's is
                               carved by data_config.test_frac (key test_frac) */
    char spm_model[1024];   /* text datasets: the SentencePiece model file; "":
                               trained on the training split and written to the
                               run directory as spm.model (then recorded)      */
    int64_t shuffle_window; /* > 0: each epoch visits windows of this many
                               consecutive samples in a permuted order, each
                               window's samples permuted
                               (bk_data_window_order: reads stay local for
                               memory-mapped data larger than RAM); 0: the
                               whole split permuted (bk_data_epoch_order)     */
    int patience;           /* > 0: stop after this many epochs without a better
                               validation metric (early stopping)              */
    char select[8];         /* auto | acc | loss: the validation metric that
                               picks best.safetensors (auto: accuracy for a
                               classifier, loss for seq2seq)                   */
    char data_dir[512];     /* "": $BK_DATA, else "data"                        */
    bk_data_config data_config; /* limit (train_limit), max_len (seq_len),
                               min_len, listops_depth, points, noise,
                               gen_train, gen_test, gen_seed (data_seed); its
                               dir is not used (data_dir is)                   */
    int64_t test_limit;     /* > 0: evaluate on the first samples of the test
                               split                                            */
    int epochs, batch, micro; /* micro > 0: gradients accumulated over
                               micro-batches of at most micro samples           */
    float ls;               /* label smoothing                                  */
    uint64_t seed;          /* model initialisation, sample order, dropout      */
    int threads;            /* > 0: bk_set_num_threads(threads) for the run     */
    int log_every;          /* steps between step records (1)                   */
    int eval_batch;         /* batch of the evaluation passes (256)             */
    int64_t stop_after;     /* > 0: stop as the stop flag would after this many
                               steps in total                                   */
    char progress[8];       /* auto | bar | plain | none (for the CLI's display;
                               recorded, not used by the library)               */
    char init[512];         /* "": a new run starts from bk_model_create; else
                               the checkpoint it starts from (fine-tuning): its
                               weights, seed and dropout counter, with the
                               run's model configuration, which must equal the
                               checkpoint's but for the attention keys (a
                               different attention is a bk_model_swap); a
                               fresh optimiser. Set r->model from
                               bk_checkpoint_config (or the whole run from
                               bk_run_load) first, as the CLI's --init does.
                               Not used when resuming.                         */
    float esp_anneal;       /* ESP's SoftSort temperature annealing (ESPFormer
                               section 4.4): 0 = off; a factor in (0, 1]: epoch
                               e (0-based) trains and is evaluated with
                               attn.t = bk_esp_anneal(t0, factor, e) (t0: the
                               model's attn.t, esp_t before issue 42); an
                               attention with ESP's t only (attn=esp)          */
    char eval_esp_sort[8];  /* "" (= model) | model | soft | hard: the sort of
                               an ESP model in the end-of-epoch evaluations and
                               diagnostics (hard: the model trained soft,
                               evaluated with the exact sort, attn.sort=hard);
                               birkhoff eval reads it as its default           */
    int64_t otk_init;       /* > 0 (pool = otk, a new run without init=): before
                               the first step the OTK pool starts from the
                               paper's unsupervised procedure, its anchors and
                               references fitted by K-means to the model's own
                               pooled sets of the first otk_init training
                               samples (bk_model_otk_fit, K-means seeded by
                               seed); 0 = the random initialisation          */
    bk_model_config model;
    bk_optim_config optim;
} bk_run_config;

/* data mnist, epochs 5, batch 64, seed 1, log_every 1, eval_batch 256,
 * progress auto, bk_data_config_default(), bk_model_config_default(),
 * bk_optim_config_default(); everything else 0 / "". */
BK_API bk_run_config bk_run_config_default(void);
/* One key=value: run keys first, then model keys, then optimiser keys.
 * Unknown keys, values out of range or malformed: BK_ERR_PARAM. */
BK_API bk_status bk_run_config_set(bk_run_config *r, const char *key, const char *value);
/* A config file: "key = value" lines, '#' comments, blank lines; an error
 * names the file and line (BK_ERR_IO if it cannot be opened, cannot be read
 * or is a directory; BK_ERR_FORMAT for a line longer than
 * BK_RUN_CONFIG_MAX_LINE bytes, a file longer than BK_RUN_CONFIG_MAX_BYTES
 * or a NUL byte; else BK_ERR_PARAM). It is read through the text reader
 * (birkhoff/core.h, "Text files"): a pipe or device is read as a stream,
 * and an input that never ends (/dev/zero) stops at a limit. */
#define BK_RUN_CONFIG_MAX_LINE ((int64_t)4096)
#define BK_RUN_CONFIG_MAX_BYTES ((int64_t)1 << 20)
BK_API bk_status bk_run_config_load(bk_run_config *r, const char *path);
/* Every key as "key=value\n" lines (run keys, then model, then optimiser);
 * NUL-terminated, whole lines only; returns the length needed, excluding the
 * NUL, like snprintf. */
BK_API size_t bk_run_config_format(const bk_run_config *r, char *buf, size_t cap);
/* Checks the run keys (the ranges bk_run_config_set enforces), applies the
 * training split's shapes to the model config (bk_data_model_shape), fills
 * the cosine schedule's total_steps when 0 (the whole run), drops micro when
 * above batch, and checks the model (BK_ERR_PARAM; attn=asap cannot be
 * trained). */
BK_API bk_status bk_run_config_resolve(bk_run_config *r, const bk_dataset *train);

/* ---- runs stored in checkpoints ----
 * A run's checkpoints carry, in their caller metadata ("extra" of
 * bk_checkpoint_save), the run configuration (bk_run_config_format), the
 * position reached (pos_* keys) and the data versions. */
/* The value of "key=" in an extra text, copied into out (truncated to
 * cap - 1 bytes, NUL-terminated); 1 if present, 0 if not. */
BK_API int bk_run_extra_get(const char *extra, const char *key, char *out, size_t cap);
/* The run configuration stored in an extra text (BK_ERR_FORMAT when the
 * checkpoint was not written by a training run). */
BK_API bk_status bk_run_config_from_extra(const char *extra, bk_run_config *r);
/* Loads a checkpoint (max_batch as bk_model_create) and its run
 * configuration (r->model = the checkpoint's model config); extra (nullable)
 * receives the metadata (free()). */
BK_API bk_status bk_run_load(const char *path, int max_batch, bk_model **m, bk_run_config *r, char **extra);
/* Opens a split of the run's dataset (or of `name` when not NULL; dir, when
 * not NULL, overrides the data directory; limit > 0 keeps the first samples)
 * and checks that it has the input shape and classes of the model config mc
 * (BK_ERR_SHAPE otherwise). */
BK_API bk_status bk_run_open_data(const bk_run_config *r, const char *name, const char *dir, bk_split split,
                                  int64_t limit, const bk_model_config *mc, bk_dataset **ds);

/* 1 if the run has a validation split (valid_frac > 0, or data_valid
 * given): its epochs are evaluated on it and best.safetensors kept; 0: the
 * test split every epoch (runs stored before valid_frac existed). */
BK_API int bk_run_has_valid(const bk_run_config *r);

/* The data configuration of a run: r->data_config with its pointers (dir,
 * valid_spec, test_spec, spm_model) into r's strings (valid while r is). */
BK_API bk_data_config bk_run_data_config(const bk_run_config *r);

/* Writes text to path atomically (a temporary file beside it, then rename):
 * a reader never sees a half-written file. How a run's text files
 * (config.txt, summary.json, the metrics cut back on resume) are written.
 * Errors: BK_ERR_IO ("cannot write PATH (reason)"). */
BK_API bk_status bk_run_write_text(const char *path, const char *text);

/* ------------------------------------------------------------------------ */
/* Evaluation and attention diagnostics                                     */
/* ------------------------------------------------------------------------ */
typedef struct {
    int64_t n;              /* samples evaluated                                */
    double loss, acc;       /* mean loss, accuracy                              */
    int classes;
    int64_t *confusion;     /* [classes x classes]: row = label, column =
                               prediction (malloc'd)                            */
    int32_t *pred;          /* [n] predictions (malloc'd when asked, else NULL) */
} bk_eval_result;
/* Inference over the first n samples of ds (n <= 0: all) in batches of
 * `batch` (the model's max_batch must be >= batch); the prediction is the
 * first maximum of the logits. keep_pred: also return every prediction.
 * Free the result with bk_eval_result_free (also after a failure). */
BK_API bk_status bk_evaluate(bk_model *m, const bk_dataset *ds, int64_t n, int batch, int keep_pred,
                             bk_eval_result *ev);
BK_API void bk_eval_result_free(bk_eval_result *ev);

/* Attention diagnostics of one forward on samples [0, B) of ds (B is capped
 * at the split's size; the model's max_batch must be >= B), per layer l:
 * mean |row sum - 1| over valid rows, mean |column sum - 1| over valid
 * columns, mean row entropy (nats) and the entropy of the uniform row (log of
 * the length) for reference; padded tokens are excluded. colsums (nullable)
 * receives, per layer, the column sums of every (sample, head, valid column):
 * layer l's values start at colsums + l * B * heads * tokens (room for
 * depth * B * heads * tokens floats) and *ncol (nullable) receives the count
 * per layer. per_layer has room for the model's depth. An ISAB model's
 * layer is its blocks' first map, the m = set_inducing inducing points over
 * the set (bk_model_attention): rows sum over the valid tokens, and column
 * sums are divided by their doubly-stochastic value m / n_b (1 for a square
 * map), so col_dev and colsums measure the same thing for both. */
typedef struct {
    double row_dev, col_dev, entropy, uniform_entropy;
} bk_layer_diag;
BK_API bk_status bk_attention_diag(bk_model *m, const bk_dataset *ds, int B, bk_layer_diag *per_layer,
                                   float *colsums, int64_t *ncol);

/* ------------------------------------------------------------------------ */
/* The training loop                                                        */
/* ------------------------------------------------------------------------ */
/* bk_train_run trains the model of a run configuration on its dataset and
 * writes the run directory:
 *   config.txt          every key's value and the data versions
 *   metrics.jsonl       one record per log_every steps ({"type":"step","step",
 *                       "epoch","batch","loss","acc","lr","gnorm",
 *                       "samples_per_s","time_s"}) and one per epoch
 *                       ({"type":"epoch","epoch","step","train_loss",
 *                       "train_acc","test_loss","test_acc","attn_row_dev",
 *                       "attn_col_dev","attn_entropy","time_s"}; a run
 *                       with a validation split: "valid_loss","valid_acc",
 *                       "best_epoch" instead of the test figures, and at
 *                       the end one {"type":"test","best_epoch","epochs",
 *                       "step","test_loss","test_acc","valid_loss",
 *                       "valid_acc","select","early_stopped","time_s"})
 *   steps.csv, epochs.csv  the same records as CSV
 *   ckpt/epoch-NNNN.safetensors  after each epoch (0000: the initial model)
 *   last.safetensors    the latest state (end of an epoch, or a stop)
 *   best.safetensors    a run with a validation split: the best epoch's
 *                       weights (no optimiser state) and run metadata,
 *                       committed with that epoch's checkpoints
 *   spm.model           a text run whose training split trained its
 *                       SentencePiece model (spm_model ""): the model, its
 *                       path recorded as the run's spm_model
 *   summary.json        at the end (with a validation split: the test
 *                       figures of the best epoch, best_epoch,
 *                       best_valid_loss, best_valid_acc, select,
 *                       epochs_trained, early_stopped)
 * Each epoch visits the training split in the order bk_data_epoch_order
 * (seed, epoch) gives, in batches of `batch` (the last one smaller); each
 * batch is one bk_train_step (micro-batches of `micro`). After each epoch the
 * whole held-out split is evaluated (bk_evaluate) and the attention
 * diagnostics of its first 64 samples are averaged over layers
 * (bk_attention_diag): the validation split when the run has one
 * (data_config.valid_frac > 0 or data_valid; bible's is its own), else the
 * test split. A run with a validation split keeps the best epoch by
 * `select` (auto: accuracy for a classifier, loss for seq2seq; acc; loss; a
 * tie keeps the earlier epoch), ends after `patience` epochs in a row
 * without a better one (0: never; a finished run, result->early_stopped;
 * resuming it is refused), and at its end evaluates the test split once
 * with best.safetensors' weights (the TEST event, result->test_*). The
 * best-epoch state is in each checkpoint's pos_* keys, so a resumed run
 * equals the uninterrupted one, its best and test included.
 *
 * Stopping: *stop (caller-owned, nullable; e.g. set by a SIGINT handler) and
 * stop_after are read after every step; a stop writes last.safetensors with
 * the position in the epoch and returns BK_OK with result->stopped = 1.
 * Resuming (BK_TRAIN_RESUME) reloads last.safetensors (weights, optimiser
 * state and step, dropout counter, position, the epoch's running sums),
 * cuts the metrics files back to its step (dropping lines that are not
 * records; the files are read by the text reader of birkhoff/core.h, within
 * its default limits; records missing before the checkpoint are reported
 * in the START event's notice) and continues bit for bit as the
 * uninterrupted run would: weights, optimiser state and every record but the
 * timings are identical, whatever the thread count. A resumed run keeps its
 * configuration except epochs (to extend a run), threads, progress,
 * stop_after, data_dir and a cosine schedule's total_steps;
 * bk_train_resume_config reads it. Extending (epochs above the stored ones)
 * continues the schedule planned when the run started: the constant, step,
 * invsqrt schedules and the warm-up are functions of the step, so the
 * extended run equals the uninterrupted run of the new length bitwise; a
 * cosine schedule ends at total_steps, and an extension past it is refused
 * (BK_ERR_PARAM, stage CONFIG: it would train at lr_min) unless total_steps
 * is re-planned: a new value >= batches * epochs (0: exactly that), which
 * the optimiser takes from the current step on (its state kept; the steps
 * already taken keep the old schedule). A total_steps that differs on a
 * schedule other than cosine, or that ends at or before the current step, is
 * BK_ERR_PARAM. Checkpoints are
 * written to a temporary file and renamed: none is ever half-written. */
typedef enum {
    BK_TRAIN_NEW = 0,       /* a new run; refused when dir holds one          */
    BK_TRAIN_OVERWRITE = 1, /* a new run over any old one in dir (its epoch
                               checkpoints and summary are removed)            */
    BK_TRAIN_RESUME = 2     /* continue the run in dir                         */
} bk_train_mode;

typedef enum {
    BK_TRAIN_EVENT_START = 0,
    BK_TRAIN_EVENT_STEP = 1,
    BK_TRAIN_EVENT_EPOCH = 2,
    BK_TRAIN_EVENT_TEST = 3 /* a run with a validation split, at its end: the
                               test split evaluated with the best weights */
} bk_train_event_kind;

/* What the callback receives: START once before the first step (the model
 * and data are ready), STEP after every optimiser step, EPOCH after every
 * epoch's evaluation (before its checkpoints are written), TEST once at the
 * end of a finished run with a validation split. Pointers are valid during
 * the call only. */
typedef struct {
    bk_train_event_kind kind;
    const bk_run_config *config;  /* the resolved configuration                */
    const bk_dataset *train, *test;
    const bk_dataset *valid;      /* NULL: the run has no validation split     */
    const bk_model *model;
    int epoch;              /* 1-based epoch of this event                     */
    int64_t batch, batches; /* 1-based batch within the epoch; batches per epoch */
    int64_t step;           /* optimiser steps in total, this one included     */
    int64_t total_steps;    /* batches * epochs                                */
    int64_t first_step;     /* the step this call started from (0, or resumed) */
    double elapsed_s;       /* seconds since this call started training        */
    double time_s;          /* training seconds of the whole run (resumed parts
                               included): the records' time_s                 */
    /* STEP: the batch's mean loss and accuracy, the learning rate it used, the
     * gradient norm before clipping, samples/s over about the last second */
    double loss, acc, lr, gnorm, samples_per_s;
    /* STEP: running means over the epoch so far; EPOCH: over the epoch */
    double train_loss, train_acc;
    /* EPOCH: the evaluated split (the validation split when the run has
     * one: valid_*, test_* NAN; else the test split: test_*, valid_* NAN),
     * and the attention diagnostics of its first 64 samples averaged over
     * layers; TEST: the test split with the best epoch's weights (test_*)
     * and that epoch's validation figures (valid_*) */
    double test_loss, test_acc, attn_row_dev, attn_col_dev, attn_entropy;
    double valid_loss, valid_acc;
    int best_epoch;         /* EPOCH, TEST of a run with a validation split:
                               the best epoch so far (1-based); else 0       */
    /* START of a resumed run: NULL, or what is wrong with the records the
     * run keeps, for a warning: the step or epoch records before the
     * checkpoint that are missing from metrics.jsonl, steps.csv or
     * epochs.csv (a file cut or edited), by file, with the count and the
     * first missing range. The run goes on; the gap stays in the files. */
    const char *notice;
} bk_train_event;
typedef void (*bk_train_callback)(void *user, const bk_train_event *ev);

/* Where a failing run failed (the status says how). */
typedef enum {
    BK_TRAIN_STAGE_SETUP = 0, /* data, model, run directory, resume checks     */
    BK_TRAIN_STAGE_CONFIG,    /* the request: the configuration does not fit the
                                 data or cannot be trained
                                 (bk_run_config_resolve), or BK_TRAIN_NEW over
                                 an existing run                              */
    BK_TRAIN_STAGE_STEP,      /* a training step (a non-finite gradient norm
                                 refuses the update: the last checkpoint is
                                 intact)                                      */
    BK_TRAIN_STAGE_EVAL,      /* the end-of-epoch evaluation                   */
    BK_TRAIN_STAGE_SAVE,      /* a checkpoint, metrics or summary write        */
    BK_TRAIN_STAGE_COMM       /* bk_train_run_comm: a failure the ranks could
                                 not agree on (a malformed comm, no memory
                                 for the collectives' buffers, a collective
                                 that failed): other ranks may be left waiting
                                 in a collective, and the caller must end them
                                 (MPI_Abort)                                  */
} bk_train_stage;

typedef struct {
    int stopped;            /* 1: stopped (flag or stop_after); last.safetensors
                               holds the position; 0: finished                 */
    int epoch;              /* epochs completed                                */
    int64_t batch;          /* batches done in the current epoch               */
    int64_t step;           /* optimiser steps in total                        */
    double test_loss, test_acc; /* without a validation split: the last
                               evaluation of this call; with one: the test
                               split's, with the best weights, of a finished
                               run (NAN if none)                              */
    double valid_loss, valid_acc; /* the best epoch's validation figures (NAN
                               without a validation split)                    */
    int best_epoch;         /* the epoch best.safetensors holds (0: none)      */
    int early_stopped;      /* 1: finished early (patience); not a stop        */
    double time_s;          /* training seconds of the whole run               */
    bk_train_stage stage;   /* on failure: where                               */
} bk_train_result;

/* Runs (or resumes) the run configured by r in directory dir (created if
 * needed). cb (nullable) receives the events, with user; stop (nullable) is
 * read after every step; result (nullable) says how it ended. Returns BK_OK
 * when the run finished or stopped; on failure the run directory holds the
 * last checkpoint written. */
BK_API bk_status bk_train_run(const bk_run_config *r, const char *dir, bk_train_mode mode, bk_train_callback cb,
                              void *user, const volatile sig_atomic_t *stop, bk_train_result *result);
/* ---- data-parallel training across processes ----
 * bk_train_run_comm is bk_train_run over `comm->size` processes (ranks) that
 * each call it with the same configuration and directory: each global batch
 * of `batch` samples is cut into chunks of `micro` samples (micro = 0: of
 * ceil(batch / size)), the chunks are shared out contiguously among the
 * ranks (rank k gets chunks [C k / size, C (k + 1) / size) of the batch's C),
 * every rank runs forward and backward on its chunks, and the gradients are
 * summed across ranks in rank order (a reduce-scatter and an all-gather built
 * from comm's alltoall and allgather, in pieces of at most 4 Mi floats), so
 * every rank takes the same optimiser step. Chunk k of a step runs with the
 * dropout counter of the single-process run's chunk k: a run over N ranks
 * computes what the one-process run with the same micro computes, dropout
 * included, up to the order of the gradient sums (float rounding); for a
 * fixed N it is bitwise reproducible, whatever the thread counts.
 * Rank 0 alone writes the run directory (metrics, checkpoints, summary) and
 * evaluates after each epoch; the callback is called on rank 0 only. At the
 * start rank 0's weights, optimiser state and position are broadcast (a
 * resumed run needs last.safetensors readable by every rank only for its
 * configuration: bk_train_resume_config), and each rank's configuration text
 * is compared with rank 0's: only threads, progress and data_dir may differ
 * (BK_ERR_PARAM naming the first differing key and rank, on every rank).
 * After each epoch the ranks compare checksums of their weights (a
 * divergence, e.g. ranks whose kernels round differently, is
 * BK_ERR_NUMERIC). The stop flag of any rank stops all of them at the same
 * step. Every failure is agreed on by all ranks at the next synchronisation
 * point (setup, each epoch start, each step, each epoch end), so none is
 * left waiting: each returns the failure (the failing rank its own message,
 * the others "rank K failed: ..."); the exceptions, failures no agreement can
 * reach, return with result->stage = BK_TRAIN_STAGE_COMM. Rank 0 creates and
 * writes the run directory only once every rank's setup and configuration
 * were agreed: a run refused at setup leaves no directory (a new run) and
 * does not touch the old one (a resumed run). comm == NULL or size == 1 is
 * bk_train_run.
 * The collectives are blocking, called by every rank in the same order; each
 * returns 0 on success (non-zero: BK_ERR_IO "collective failed"). The
 * checkpoints record the number of ranks (pos_ranks); a run resumed with
 * another number continues correctly but not bitwise as the uninterrupted
 * run would. tools/train/mpi.c is this interface over MPI. */
typedef struct {
    int rank, size;   /* this process's rank in [0, size), the number of ranks */
    void *user;       /* passed to the functions                              */
    /* rank 0's `bytes` bytes at buf, copied to buf on every rank */
    int (*bcast)(void *user, void *buf, size_t bytes);
    /* every rank's `bytes` bytes at send, in rank order, into recv (size *
     * bytes) on every rank */
    int (*allgather)(void *user, const void *send, void *recv, size_t bytes);
    /* send holds size blocks of `bytes`: block j goes to rank j; recv
     * receives size blocks: block i from rank i */
    int (*alltoall)(void *user, const void *send, void *recv, size_t bytes);
} bk_train_comm;
BK_API bk_status bk_train_run_comm(const bk_run_config *r, const char *dir, bk_train_mode mode,
                                   const bk_train_comm *comm, bk_train_callback cb, void *user,
                                   const volatile sig_atomic_t *stop, bk_train_result *result);
/* The configuration of the run in dir (its last.safetensors; stop_after set
 * to 0: it applies to one process), to pass to bk_train_run with
 * BK_TRAIN_RESUME after changing what may change; epochs_done (nullable)
 * receives the epochs it has completed. BK_ERR_IO when dir holds no
 * checkpoint. */
BK_API bk_status bk_train_resume_config(const char *dir, bk_run_config *r, int *epochs_done);

/* ------------------------------------------------------------------------ */
/* ASAP compilation of a trained model                                      */
/* ------------------------------------------------------------------------ */
/* bk_asap_compile runs a model trained with Sinkhorn attention on the first
 * `samples` training inputs of its run (labels unused), streams every block's
 * Q, K and lengths into that block's calibrator (bk_model_calib_add; the
 * teacher is the layer's own Sinkhorn: its S, eps and scale), fits each layer
 * (bk_asap_calib_fit) and writes a checkpoint of the same weights with
 * attn=asap and the compiled layers (its extra names the teacher checkpoint:
 * teacher=<path>). */
typedef struct {
    int samples;            /* calibration inputs (512)                        */
    int batch;              /* forward batch (64)                              */
    int slices;             /* ASAP slices L (32)                              */
    uint64_t seed;          /* slice directions (1)                            */
    float lambda;           /* ridge (1e-3)                                    */
    bk_asap_fit fit;        /* BK_ASAP_FIT_LS (default) or BK_ASAP_FIT_KL      */
    const char *data_dir;   /* NULL: the run's                                 */
    bk_asap_variant ending; /* the compiled model's asap_ending (BK_ASAP_AUTO:
                               the teacher's); evaluation may change it
                               (bk_model_set_attn_config)                     */
} bk_asap_compile_config;
BK_API bk_asap_compile_config bk_asap_compile_config_default(void);

/* The callback's view: layer = -1 once the calibration inputs have been
 * streamed, then each layer as it is fitted (report set). */
typedef struct {
    int layer;
    int layers;             /* the model's depth                               */
    int64_t samples;        /* calibration inputs used                         */
    const char *data_version;
    const bk_asap_fit_report *report; /* layer >= 0                            */
} bk_asap_compile_event;
typedef void (*bk_asap_compile_callback)(void *user, const bk_asap_compile_event *ev);

/* Compiles the checkpoint ckpt (written by bk_train_run) into out. The model
 * must use Sinkhorn attention (BK_ERR_PARAM naming its attention otherwise:
 * an ASAP model is no teacher), and out must not be ckpt itself (BK_ERR_PARAM:
 * the compiled model records its teacher by path). cb is nullable. */
BK_API bk_status bk_asap_compile(const char *ckpt, const char *out, const bk_asap_compile_config *c,
                                 bk_asap_compile_callback cb, void *user);

/* ------------------------------------------------------------------------ */
/* Plug-and-play swaps of a trained model's attention                       */
/* ------------------------------------------------------------------------ */
/* bk_checkpoint_swap writes to out the model of checkpoint in with another
 * attention normaliser (docs/MODEL.md, "Plug-and-play swaps"): the model
 * configuration of in, then attn = c->attn and c->keys applied, then
 * bk_model_swap (every weight kept bit for bit; LOT pivots created or
 * dropped). Only attention keys may be given (attn_scale, sk_iters, sk_eps,
 * sk_rho, esp_soft, esp_t, esp_tau, esp_slices, lot_r, lot_iters, lot_eps,
 * lot_temp): another key, an unknown one or a bad value is BK_ERR_PARAM.
 * The new checkpoint holds no optimiser state (fine-tuning starts a fresh
 * optimiser: bk_run_config.init); when in was written by a training run its
 * run (data versions, position, configuration with the new model keys) is
 * carried, with swapped_from=<in>, so it evaluates (bk_run_load) and
 * fine-tunes like any checkpoint of a run.
 * attn = "asap" compiles (bk_asap_compile with c->asap) a checkpoint of a
 * Sinkhorn run: its own Sinkhorn layers are the teacher; keys are refused
 * (the teacher's S and eps are the model's), and a source whose attention is
 * not Sinkhorn is refused with the two steps that do it (swap to sinkhorn,
 * fine-tune if wanted, then compile): ASAP reproduces a Sinkhorn layer, and a
 * model whose weights were not trained for Sinkhorn has no such teacher of
 * its own. Written atomically (temporary file, rename); on failure out is not
 * created. */
typedef struct {
    const char *attn;       /* the new normaliser: softmax, sinkhorn,
                               unbalanced, esp, lot or asap                    */
    const char *keys;       /* "key=value,..." attention keys, or NULL         */
    const int *blocks;      /* the blocks to change (NULL: all); today every
                               block of a model shares one kind, so a list must
                               name them all (else BK_ERR_UNSUPPORTED)         */
    int nblocks;
    bk_asap_compile_config asap; /* attn = asap: the compilation              */
    const char *part;       /* an encoder-decoder's attention to change: "enc"
                               (its encoder's self-attention, attn; NULL means
                               it), "cross" (cross_attn) or "both"; the
                               decoder's causal self-attention is softmax and
                               is never swapped. A classifier refuses a part
                               other than NULL / "enc".                         */
} bk_swap_config;
/* attn NULL (must be set), keys NULL, all blocks, asap defaults. */
BK_API bk_swap_config bk_swap_config_default(void);
BK_API bk_status bk_checkpoint_swap(const char *in, const char *out, const bk_swap_config *c);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_TRAIN_H */
