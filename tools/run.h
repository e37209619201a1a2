/* run.h -- training runs on real data: the run configuration (one flat
 * key=value namespace over run, model and optimiser keys), evaluation and
 * attention diagnostics shared by `birkhoff train`, `eval`, `plot` and
 * `asap compile`. */
#ifndef BK_RUN_H
#define BK_RUN_H
#include "cli.h"
#include "data.h"

typedef struct {
    char data[16];          /* dataset name                                  */
    char data_dir[512];     /* "" : $BK_DATA or ./data                        */
    data_opts dopt;         /* limits, sequence length, points, generator    */
    int64_t test_limit;     /* > 0: evaluate on the first samples of the test split */
    int epochs, batch, micro;
    float ls;               /* label smoothing                               */
    uint64_t seed;          /* model init, data order, dropout               */
    int threads;            /* 0: the library's default                      */
    int log_every;          /* steps between step records (1)                */
    int eval_batch;         /* batch of the evaluation passes (256)          */
    int64_t stop_after;     /* > 0: stop as Ctrl-C would after this many steps in total */
    char progress[8];       /* auto | bar | plain | none                     */
    bk_model_config model;
    bk_optim_config optim;
} run_config;

void run_config_default(run_config *r);
/* One key=value: run keys first, then model keys, then optimiser keys.
 * Returns 1, or 0 with a message in err. */
int run_config_set(run_config *r, const char *key, const char *value, char *err, size_t cap);
/* A config file: "key = value" lines, '#' comments, blank lines. */
int run_config_load(run_config *r, const char *path, char *err, size_t cap);
/* Every key as "key=value\n" lines (run keys, then model, then optimiser);
 * malloc'd. */
char *run_config_format(const run_config *r);
/* 1 if key is a run key (not a model or optimiser key) */
int run_is_key(const char *key);
/* Applies the dataset's shapes to the model config, fills cosine
 * total_steps when 0, and checks everything. */
int run_config_resolve(run_config *r, const data_set *train, char *err, size_t cap);

/* The value of "key=" in a checkpoint's extra metadata (copied into out,
 * truncated to cap); 1 if present. */
int run_extra_get(const char *extra, const char *key, char *out, size_t cap);
/* The run configuration `birkhoff train` stored in a checkpoint. */
int run_from_checkpoint_extra(const char *extra, run_config *r, char *err, size_t cap);

/* Loads a checkpoint (max_batch as bk_model_create) and its run config
 * (r->model = the checkpoint's model config); extra_out (nullable) gets the
 * metadata (free()). Messages on stderr name prog; 1 on success. */
int run_load(const char *prog, const char *path, int max_batch, bk_model **m, run_config *r, char **extra_out);
/* Opens a split of the run's dataset (or of `name`; dir overrides the data
 * directory; limit > 0 keeps the first samples) and checks that it has the
 * model's input shape and classes. */
int run_open_data(const char *prog, const run_config *r, const char *name, const char *dir, int split, int64_t limit,
                  const bk_model_config *mc, data_set *ds);

/* ---- evaluation ---- */
typedef struct {
    int64_t n;
    double loss, acc;
    int classes;
    int64_t *confusion;     /* [classes x classes]: row = label, column = prediction (malloc'd) */
    int32_t *pred;          /* [n] predictions (malloc'd, when asked)        */
} run_eval;
/* Inference over the first n samples (n <= 0: all) in batches of `batch`
 * (the model's max_batch must be >= batch). */
int run_evaluate(bk_model *m, const data_set *ds, int64_t n, int batch, int keep_pred, run_eval *ev, char *err,
                 size_t cap);
void run_eval_free(run_eval *ev);
/* the predicted class of one row of logits (the first maximum) */
int run_argmax(const float *z, int C);

/* Attention diagnostics of one forward on samples [0, B) of ds, per layer:
 * mean |row sum - 1| over valid rows, mean |column sum - 1| over valid
 * columns (scaled by Lk/Lq), mean row entropy (nats) and the entropy of the
 * uniform row (log Lk) for reference. colsums (nullable) receives, per layer,
 * the column sums of every (sample, head, valid column): layer l's values
 * start at colsums + l * B * H * N and *ncol receives the count per layer. */
typedef struct {
    double row_dev, col_dev, entropy, uniform_entropy;
} run_attn_diag;
int run_attention_diag(bk_model *m, const data_set *ds, int B, run_attn_diag *per_layer, float *colsums,
                       int64_t *ncol, char *err, size_t cap);

/* Batch buffers for a dataset and model: x or tokens/len, labels, logits. */
typedef struct {
    int cap;
    float *x, *logits;
    int32_t *tok, *len, *lab;
    int64_t *idx;
} run_buf;
int run_buf_init(run_buf *b, const data_set *ds, int cap, int classes);
void run_buf_free(run_buf *b);
/* fills b with samples idx[0..B) and returns the batch view */
int run_buf_fill(run_buf *b, const data_set *ds, int B, bk_batch *out);

/* a model's Sinkhorn-style "<name>[ S=..]" label for tables */
const char *run_attn_name(const bk_model_config *c);
#endif
