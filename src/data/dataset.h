/* dataset.h -- the dataset store every reader fills (internal to src/data):
 * the built-in readers (data.c), the arrays reader (arrays.c), the text
 * readers (text.c), and the split layer (split.c) that takes a split's rows
 * out of a store through a row map. docs/ARCHITECTURE.md, "Data". */
#ifndef BK_DATA_DATASET_H
#define BK_DATA_DATASET_H

#include "../core/internal.h"

/* ---- arrays (arrays.c; the ARRAYS helper's block) ----
 * The inputs of an array store: the user's .npy / .npz x (memory-mapped, or
 * an inflated .npz member) and the stored image sets' bytes (mnist,
 * fashion-mnist, digits), filled into the model's layout by one function. */
typedef struct {
    const uint8_t *x;     /* sample i at x + i * stride bytes (NULL: not an
                             array store); C order within the sample     */
    size_t stride;        /* bytes per sample                              */
    bki_npy_dtype dtype;  /* of the elements                               */
    int hwc;              /* images stored [H, W, C] (else [C, H, W])      */
    float scale;          /* images: value = element * scale (f32: 1)      */
    void *map;            /* the mapping x lies in (munmap'd at close)     */
    size_t map_len;
    void *owned;          /* a malloc'd buffer x lies in (freed at close)  */
} bki_xstore;

/* A store holds every row of the file(s) it was read from (info.n rows,
 * info.rows the same) until bk_data_open takes the split out of it: then
 * sel [info.n] maps a sample of the split to its row (NULL: sample i is row
 * i). Every accessor (bk_data_fill, bk_data_fill_pair, bk_data_bucket_order)
 * goes through bki_data_row. */
struct bk_dataset {
    bk_dataset_info info;
    int64_t *sel;       /* [info.n] rows of the split, or NULL              */
    /* images, token rows and labels (built-in sets, arrays, labelled text) */
    uint8_t *bytes;     /* images [n, c*h*w]; spam [n, max_len]              */
    int32_t *lens;      /* spam, spam-spm, labelled text [n]                 */
    int32_t *toks;      /* spam-spm, labelled text [n, max_len]              */
    int32_t *labels;    /* [n]                                               */
    uint64_t gen_seed;  /* generated sets: the split's stream seed           */
    bk_listops_config listops; /* resolved and checked at open              */
    bk_shapes_config shapes;
    /* seq2seq: every line of both files (EOS appended): line l of side s is
     * ids[s] + off[s][l], off[s][l+1] - off[s][l] ids; store row i is line
     * keep[i] (the pairs within the caps, in file order) */
    int32_t *ids[2];
    int64_t *off[2];
    int64_t *keep;
    /* labelled text */
    char **class_names; /* [info.classes] when labels are names, else NULL   */
    void *spm;          /* the serialized SentencePiece model (malloc'd)     */
    size_t spm_len;
    /* ---- arrays (arrays.c) ---- */
    bki_xstore xs;      /* images of every image set, and array inputs: the
                           samples when xs.x is set (lens: the lengths array,
                           NULL when every row is full)                     */
};

/* What one reader call reads: the file(s) of one split. */
typedef struct {
    const char *format;     /* "npy", "npz", "tsv", "csv", "parallel", "ids"  */
    const char *path;       /* the spec's part after "FORMAT:" to read        */
    const char *train_path; /* the training spec's (== path when separate 0)  */
    int separate;           /* 1: path is a VALID or TEST split of its own
                               (every row of it is the split): label maps,
                               vocabularies and SentencePiece models come from
                               train_path (or c->spm_model); 0: path is the
                               training file, to be carved                   */
    bk_split split;
    const bk_data_config *c;
} bki_spec_ctx;

/* The readers of specs: each fills ds with EVERY row of ctx->path (info.n =
 * info.rows = the rows read; kind, shapes, classes, vocab, version) and
 * returns BK_OK, or fails with a message naming the file and the
 * index/line/offset. */
bk_status bki_open_arrays(const bki_spec_ctx *ctx, bk_dataset *ds);
bk_status bki_open_labelled_text(const bki_spec_ctx *ctx, bk_dataset *ds);
bk_status bki_open_parallel_text(const bki_spec_ctx *ctx, bk_dataset *ds);
bk_status bki_open_ids_text(const bki_spec_ctx *ctx, bk_dataset *ds);

/* ---- pair stores (data.c; the text readers, text.c, use them) ---- */
/* The caps and keep list of a pair store whose ds->ids / ds->off hold
 * `lines` lines a side (EOS counted): max_len / tgt_max_len of o (0: the
 * store's longest), ds->keep, info.n (the first `limit` when > 0), kind,
 * seq2seq, caps, token counts, and the drop report info.dropped / info.note
 * ("N of M pairs dropped: A with a source longer than S ids, B with a
 * target longer than T ids ..."). info.vocab is the caller's. */
bk_status bki_pairs_keep(bk_dataset *ds, const bk_data_config *o, int64_t lines, int64_t limit);
/* Two line-aligned id files (bk_data_open_ids's format) into ds, caps and
 * o->limit applied; vocab <= 0: inferred (largest id + 1, at least 4). */
bk_status bki_open_id_pairs(const char *src_path, const char *tgt_path, int vocab, const bk_data_config *o,
                            bk_dataset *ds);
/* A whole file's bytes (malloc'd), plain or gzipped, at most maxb of them
 * (an endless device or FIFO stops there: BK_ERR_FORMAT): the stored
 * sets' reader (data.c's read_path) without a known version. BK_ERR_IO
 * naming the file when it cannot be opened or is a directory. */
bk_status bki_data_read_file(const char *path, size_t maxb, void **buf, size_t *len);

/* The carving fractions a training file of this spec gets under c (test:
 * 0 when c->test_spec is given, else c->test_frac; valid: 0 when
 * c->valid_spec is given, else c->valid_frac). */
void bki_data_fracs(const bk_data_config *c, int spec, double *test_frac, double *valid_frac);
/* The rows of the TRAINING split of the training file's n rows (labels
 * [n] in [0, classes), or NULL: unlabelled, as sentence pairs), as
 * bk_data_open will carve them: what a reader trains a tokenizer on. rows
 * malloc'd. */
bk_status bki_data_train_rows(const bk_data_config *c, int64_t n, const int32_t *labels, int classes,
                              int64_t **rows, int64_t *count);
/* Takes split `split`'s rows out of a store by bk_data_split_rows (sets
 * sel and info.n; keeps info.rows). */
bk_status bki_data_carve(bk_dataset *ds, const bk_data_config *c, double test_frac, double valid_frac,
                         bk_split split);
/* Opens a spec (bk_data_open's work for "FORMAT:PATH"). */
bk_status bki_open_spec(const char *spec, bk_split split, const bk_data_config *c, bk_dataset *ds);

/* A store over bytes [n, channels * height * width] (CHW), value = byte *
 * scale: the stored image sets (the bytes stay ds->bytes'). */
void bki_xstore_bytes(bki_xstore *xs, const uint8_t *bytes, const bk_dataset_info *in, float scale);
/* Sample i (a row of the whole file) into the model's layout: images
 * x [channels, height, width]; tokens tok [max_len] (zero after the
 * length) and *len; points x [points, point_dim] (zero after the length)
 * and *len (len nullable for images and points). lens: the lengths (NULL:
 * every row full). */
void bki_xstore_fill(const bki_xstore *xs, const bk_dataset_info *in, const int32_t *lens, int64_t i, float *x,
                     int32_t *tok, int32_t *len);
/* Unmaps and frees what xs holds; xs zeroed. */
void bki_xstore_free(bki_xstore *xs);

/* The store row of sample i of the split. */
static inline int64_t bki_data_row(const bk_dataset *ds, int64_t i) { return ds->sel ? ds->sel[i] : i; }

#endif
