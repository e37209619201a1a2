/* birkhoff/data.h -- datasets: stored readers with verified versions,
 * generated sets, batches and the sample order of training (docs/TRAINING.md),
 * and parallel text for translation (bk_parallel_*, docs/TRANSLATION.md).
 * Part of the public API; include <birkhoff.h> (all of it) or this file. The
 * conventions every function follows are at the top of birkhoff/core.h: a
 * function returns a bk_status and, on failure, bk_last_error() gives the
 * reason and nothing has been written to any output.
 *
 * Stored datasets are read from a data directory that scripts/data.sh fills
 * (bk_data_config.dir, else $BK_DATA, else "data"):
 *   mnist          mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte (IDX)
 *   fashion-mnist  fashion-mnist/{train,t10k}-...-ubyte.gz (gzipped IDX)
 *   digits         digits/digits.csv.gz (UCI 8x8: 64 pixels 0..16 + label)
 *   spam           spam/{easy-ham-1,easy-ham-2,hard-ham-1,spam-1,spam-2}/
 *                  *.txt (SpamAssassin messages; the body after the header
 *                  block, as bytes: vocabulary 256)
 *   spam-spm       spam/spm/{train,test}.ids: the spam splits (order,
 *                  labels, version check) with each message as SentencePiece
 *                  ids of a unigram vocabulary of 8000 trained on the
 *                  training bodies (scripts/data.sh spam-spm); max_len ids
 *                  kept per message (0: 256); an empty line is a message of
 *                  no ids; the ids file's FNV-1a is part of the version
 *   bible          bible/{train,valid,test}.{es,en}.ids (Spanish -> English
 *                  sentence pairs as SentencePiece ids of one joint
 *                  vocabulary of 8000; scripts/data.sh bible-spm): a
 *                  seq2seq dataset (below, "Sentence-pair datasets")
 * and generated ones are a pure function of (seed, index) (below):
 *   listops        LRA ListOps expressions (vocabulary 15, 10 classes)
 *   shapes         labelled 3-D point clouds (random pose, scale, noise)
 *
 * Every stored file is checked against the FNV-1a-64 checksum of the version
 * this library knows (of the decompressed content; plain or gzipped files
 * are read alike); a missing, truncated, corrupt or different file is
 * refused (BK_ERR_IO when it cannot be opened, BK_ERR_FORMAT otherwise) with
 * a message naming the file and the command that fixes it
 * ("scripts/data.sh NAME"). Readers are bounded: a file is read into one
 * buffer capped at the known version's size, parsed in place, and only the
 * samples are kept (as bytes). Splits: MNIST and Fashion-MNIST have their
 * own; digits and spam are split 80/20 by a fixed permutation (seed 2718) of
 * the sorted file order; generated sets use the stream seeds 2 gen_seed
 * (train) and 2 gen_seed + 1 (test).
 */
#ifndef BIRKHOFF_DATA_H
#define BIRKHOFF_DATA_H

#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Datasets                                                                 */
/* ------------------------------------------------------------------------ */
/* BK_SPLIT_VALID: only datasets with a validation split of their own
 * (bible); the others refuse it (BK_ERR_PARAM). */
typedef enum { BK_SPLIT_TRAIN = 0, BK_SPLIT_TEST = 1, BK_SPLIT_VALID = 2 } bk_split;

typedef struct {
    const char *dir;     /* data directory; NULL or "": $BK_DATA, else "data"  */
    int64_t limit;       /* > 0: only the first `limit` samples of the split   */
    int max_len;         /* spam: bytes kept per message (0: 1024, at most
                            65536); spam-spm: ids kept (0: 256, at most
                            65536); listops: longest sequence (0: 2000);
                            seq2seq: longest source, EOS counted (0: the
                            split's longest); longer pairs are dropped        */
    int min_len;         /* listops: shortest sequence (0: the generator's
                            default, max(5, max_len / 4))                      */
    int listops_depth;   /* listops: maximum nesting depth (10)                */
    int points;          /* shapes: points per cloud (256)                     */
    float noise;         /* shapes: jitter sd (0.02)                           */
    int64_t gen_train, gen_test; /* generated sets: samples per split (20000,
                            2000)                                              */
    uint64_t gen_seed;   /* generated sets: the seed of both splits (1)        */
    int tgt_max_len;     /* seq2seq: longest target, EOS counted (0: the
                            split's longest); longer pairs are dropped        */
    /* ---- user datasets (FORMAT:PATH specs, below) and carved splits ---- */
    const char *valid_spec;  /* the validation split's own files, as a spec of
                                the training spec's FORMAT or a bare PATH of
                                it; NULL or "": carved by valid_frac          */
    const char *test_spec;   /* the test split's own files (likewise); NULL or
                                "": a spec's test split is carved by test_frac */
    float valid_frac;        /* carved validation fraction of the training
                                split (every dataset without a validation split
                                of its own; 0: none, the library's default;
                                runs default to 0.1)                           */
    float test_frac;         /* a spec without test_spec: the carved test
                                fraction of its file (0.1)                     */
    uint64_t split_seed;     /* the seed of the carved splits (2718)           */
    int array_kind;          /* arrays: 0 auto, 1 image, 2 tokens, 3 points    */
    int label_column, text_column; /* labelled text: 1-based columns (1, 2)   */
    int text_header;         /* labelled text: 1 = the first line is a header  */
    const char *spm_model;   /* text: the SentencePiece model file to use; NULL
                                or "": one trained on the training split       */
    int spm_vocab;           /* text: the vocabulary of a trained model (0:
                                8000; a smaller corpus gives fewer pieces)     */
} bk_data_config;

/* The defaults above. */
BK_API bk_data_config bk_data_config_default(void);
/* 1 if name is a dataset of this library ("mnist", "fashion-mnist",
 * "digits", "spam", "spam-spm", "listops", "shapes", "bible"), else 0. */
BK_API int bk_data_known(const char *name);

typedef struct bk_dataset bk_dataset;

/* ---- user datasets: FORMAT:PATH specs (docs/DATA.md) ----
 * bk_data_open's name may be a spec instead of a built-in name:
 *   npy:DIR                   DIR/x.npy, DIR/y.npy, optional DIR/lengths.npy
 *   npy:X.npy,Y.npy[,L.npy]   the same files, named
 *   npz:FILE.npz              members x, y, optional lengths
 *   tsv:FILE, csv:FILE        labelled text, a sample a line
 *   parallel:SRC,TGT          line-aligned raw sentences (seq2seq)
 *   ids:SRC,TGT               line-aligned token ids (seq2seq; the format of
 *                             bk_data_open_ids)
 * Splits: TRAIN reads the spec's file(s); VALID and TEST read
 * c->valid_spec / c->test_spec when given, else they are carved from the
 * training file(s) (bk_data_split_rows: test_frac, then valid_frac, seeded
 * by split_seed, stratified by label), and TRAIN is what is left. The
 * built-in sets keep their own test (and bible its valid) split; a VALID
 * split of a built-in set without one is carved from its training split by
 * valid_frac (0: refused, BK_ERR_PARAM). info.name is the FORMAT for a
 * spec.
 *
 * Arrays (npy:, npz:; a PATH that is a directory is read as DIR/x.npy ...,
 * a comma list as the named .npy files, any other file as a zip archive, so
 * npy: and npz: take each other's forms). x, C order, little-endian:
 *   images  uint8 ('|u1') or float32 ('<f4') [N, H, W] (one channel),
 *           [N, H, W, C] with C in 1..4 (transposed to CHW at fill), or
 *           [N, C, H, W] when the last axis is over 4 and the second in
 *           1..4; uint8 scaled by 1/255, float32 taken as is;
 *   tokens  int32 ('<i4') or int64 ('<i8') [N, L]: ids in [0, 2^24),
 *           vocab = largest id + 1 (at least 2); lengths [N] in [1, L]: the
 *           ids past a row's length are not read and fill as 0; without,
 *           every row has length L;
 *   sets    float32 [N, P, D] (point clouds): points past a row's length
 *           (lengths [N] in [1, P]) are not read and fill as 0.
 * Which: c->array_kind 0 (auto): integer x -> tokens; float32 rank 3 with a
 * lengths array -> sets; else images. 1 image, 2 tokens, 3 points force the
 * kind (a shape or dtype that does not fit it is refused). y: int32, int64
 * or uint8 [N], every label in [0, 2^20); classes = largest + 1 (at least
 * 2). lengths: int32, int64 or uint8 [N]. Every dimension of x in [1,
 * 65536], at most 2^28 values a sample. Refused, naming the file (an .npz
 * member as FILE:x.npy) and the sample, element or byte: an empty or cut
 * file, another dtype (float64 among them), Fortran order, a wrong rank,
 * N = 0, N differing between x, y and lengths (BK_ERR_SHAPE), a label or
 * length out of range, a token id out of range within a row's length, NaN
 * or Inf in a float32 x (within a set's length), a trailing byte; in an
 * archive a missing x.npy or y.npy member (the message lists the members), a
 * CRC-32 mismatch, a member that does not inflate to its size. A missing
 * file is BK_ERR_IO. x is checked in one pass at open and then memory-mapped
 * (mmap, read-only, private) until bk_data_close, so a dataset larger than
 * RAM trains (bk_data_window_order keeps the reads local): a .npy file and
 * a stored .npz member (np.savez) are read in place, a deflated member
 * (np.savez_compressed) is inflated into memory. y and lengths are copied
 * into memory. info.version: "FORMAT:x DTYPE[SHAPE] y DTYPE [lengths DTYPE]
 * fnv1a:H" where H combines, per file (one for an archive), the FNV-1a-64
 * of the file's bytes when it is at most 64 MiB, else of its size and its
 * first and last MiB (no time stamp: a copied dataset resumes). */
/* 1 if spec is "FORMAT:PATH" with a FORMAT above and a non-empty PATH
 * (syntax only), else 0. */
BK_API int bk_data_is_spec(const char *spec);
/* The carved splits of n rows: per class (labels [n] in [0, classes);
 * labels NULL: one class) the rows are permuted by the splitmix64 stream of
 * (seed, class); the first round(test_frac n_c) go to TEST, the next
 * round(valid_frac n_c) to VALID, the rest to TRAIN. rows receives the rows
 * of `split` in ascending order (malloc'd; free()), *count their number.
 * Errors: BK_ERR_NULL, BK_ERR_PARAM (a fraction outside [0, 1), their sum
 * >= 1, a label outside [0, classes)), BK_ERR_NOMEM. */
BK_API bk_status bk_data_split_rows(int64_t n, const int32_t *labels, int classes, double test_frac,
                                    double valid_frac, uint64_t seed, bk_split split, int64_t **rows,
                                    int64_t *count);
/* The name of class k of a dataset whose labels are names (labelled text
 * with non-integer labels); NULL otherwise or for k outside [0, classes). */
BK_API const char *bk_data_class_name(const bk_dataset *ds, int k);
/* The SentencePiece model a text dataset was encoded with (serialized, as
 * an spm.model file holds it; valid while ds is open). BK_ERR_PARAM for a
 * dataset that has none. */
BK_API bk_status bk_data_spm_model(const bk_dataset *ds, const void **model, size_t *len);


/* What an opened split holds. Per-sample input, as bk_data_fill writes it:
 *   BK_INPUT_IMAGE   float [channels, height, width], byte values scaled to
 *                    [0, 1] (/255; digits: /16)
 *   BK_INPUT_TOKENS  int32 [max_len] token ids in [0, vocab), zero after the
 *                    sample's length (1..max_len)
 *   BK_INPUT_POINTS  float [points, point_dim] (shapes: x, y, z per point)
 * and an int32 label in [0, classes); except for a seq2seq dataset (seq2seq
 * 1: kind BK_INPUT_TOKENS, classes 0), whose sample is a sentence pair: the
 * source as tokens (max_len, padded with BK_SEQ_PAD) and the target
 * (tgt_max_len), no label (bk_data_fill_pair). */
typedef struct {
    char name[16];          /* the dataset's name                             */
    bk_split split;
    bk_input_kind kind;
    int64_t n;              /* samples (after the limit)                      */
    int classes;
    int channels, height, width;  /* images                                  */
    int vocab, max_len;     /* tokens                                         */
    int points, point_dim;  /* point clouds                                   */
    char version[192];      /* what a run records: name, split, source,
                               checksums or generator parameters (seq2seq:
                               also the caps and the pairs they dropped)      */
    int seq2seq;            /* 1: pairs (tokens = source, tgt = target)       */
    int tgt_max_len;        /* seq2seq: the target cap, EOS counted           */
    int64_t tokens_src, tokens_tgt; /* seq2seq: total ids of the n pairs kept,
                               EOS included                                   */
    int64_t dropped;        /* samples the reader dropped (seq2seq: pairs over
                               the caps; text: see note)                      */
    char note[256];         /* what the reader dropped or changed and why
                               ("" if nothing)                                */
    int64_t rows;           /* rows of the file(s) the split was taken from    */
} bk_dataset_info;

/* Opens a split of the dataset `name` (c NULL: bk_data_config_default()).
 * Stored sets are read and verified here, once; generated sets are checked
 * and produce samples on demand. Errors: an unknown name or invalid generator
 * options (BK_ERR_PARAM), a missing file or directory (BK_ERR_IO), a file
 * that is not the known version or does not parse (BK_ERR_FORMAT), an empty
 * split (BK_ERR_SHAPE), BK_ERR_NOMEM. */
BK_API bk_status bk_data_open(const char *name, bk_split split, const bk_data_config *c, bk_dataset **out);
BK_API void bk_data_close(bk_dataset *ds);
BK_API const bk_dataset_info *bk_data_info(const bk_dataset *ds);
/* Samples idx[0..B) of the split into arrays in the model's layout
 * (bk_batch): x [B, channels, height, width] for images, x [B, points, point_dim]
 * and len [B] (the set's points, points without lengths; nullable) for point
 * clouds, tokens [B, max_len] and
 * len [B] for tokens; labels [B] (nullable). Arrays the kind does not use may
 * be NULL. A generated sample is made here (any order, any thread: it
 * depends on (seed, index) only). A seq2seq dataset fills tokens and len
 * with the sources (as bk_data_fill_pair) and refuses labels != NULL
 * (BK_ERR_PARAM: it has none). Errors: an index outside [0, n)
 * (BK_ERR_PARAM), a needed array NULL (BK_ERR_NULL), B < 0 (BK_ERR_SHAPE). */
BK_API bk_status bk_data_fill(const bk_dataset *ds, const int64_t *idx, int B, float *x, int32_t *tokens,
                              int32_t *len, int32_t *labels);
/* Writes the model-config fields the data fixes: input kind, channels and
 * image size (the patch is kept if it divides both sides, else lowered to
 * the largest divisor of both), vocab, max_len, point_dim, max_points and
 * classes. A seq2seq dataset writes input = tokens, arch = BK_ARCH_SEQ2SEQ,
 * vocab, max_len, tgt_max_len, bos = BK_SEQ_BOS and eos = BK_SEQ_EOS, and
 * leaves classes alone; the other datasets leave arch alone. */
BK_API void bk_data_model_shape(const bk_dataset *ds, bk_model_config *c);

/* ---- batch buffers ---- */
typedef struct {
    int cap;             /* samples the buffers hold                            */
    float *x;            /* images [cap, c, h, w] or points [cap, points, point_dim];
                            NULL for tokens                                     */
    int32_t *tokens;     /* [cap, max_len] (tokens only, else NULL)             */
    int32_t *len;        /* [cap]                                               */
    int32_t *labels;     /* [cap]; NULL for a seq2seq dataset                   */
    int64_t *idx;        /* [cap]: the sample indices bk_data_batch_fill reads  */
    int32_t *tgt;        /* seq2seq: [cap, tgt_max_len], else NULL              */
    int32_t *tgt_len;    /* seq2seq: [cap], else NULL                           */
} bk_data_batch;
/* Allocates buffers for up to cap samples of ds (cap >= 1). */
BK_API bk_status bk_data_batch_init(bk_data_batch *b, const bk_dataset *ds, int cap);
BK_API void bk_data_batch_free(bk_data_batch *b);
/* Fills samples b->idx[0..B) (B <= cap) and sets *out to a batch over the
 * buffers (len NULL for images), ready for bk_model_forward. A seq2seq
 * dataset sets tokens/len (sources), tgt/tgt_len (targets) and labels NULL;
 * the others set tgt and tgt_len NULL. */
BK_API bk_status bk_data_batch_fill(bk_data_batch *b, const bk_dataset *ds, int B, bk_batch *out);

/* ---- sample order ---- */
/* p = the Fisher-Yates permutation of [0, n) from the splitmix64 stream of
 * seed (the stored sets' splits use it with seed 2718). */
BK_API bk_status bk_data_permute(int64_t *p, int64_t n, uint64_t seed);
/* p = the sample order of epoch `epoch` (0-based) of a run with this seed:
 * a fixed permutation of (seed, epoch), so that a resumed run sees the same
 * order as an uninterrupted one. */
BK_API bk_status bk_data_epoch_order(int64_t *p, int64_t n, uint64_t seed, int epoch);
/* p = the sample order of epoch `epoch` for data read from disk in place
 * (memory-mapped arrays larger than RAM): [0, n) cut into windows of
 * `window` consecutive samples, [kW, (k+1)W) (the last one shorter when W
 * does not divide n); the epoch visits the windows in a permuted order and
 * each window's samples in a permuted order, so that any run of reads stays
 * within W consecutive samples (the pages of one window) until it moves on.
 * A fixed function of (seed, epoch, window), like bk_data_epoch_order, and
 * bitwise equal to it when window <= 0 or window >= n. Errors: BK_ERR_SHAPE
 * (n < 0), BK_ERR_NULL, BK_ERR_NOMEM (one int64 per window). */
BK_API bk_status bk_data_window_order(int64_t *p, int64_t n, uint64_t seed, int epoch, int64_t window);
/* Length-bucketed order of a seq2seq dataset (fairseq batches sentences of
 * similar length, so that padding to the longest one wastes little). p[0..n)
 * is an order of samples (e.g. bk_data_epoch_order's), rewritten in place:
 *  1. cut into consecutive windows of w samples, w = window rounded up to a
 *     multiple of batch (window <= 0: one window, the whole of p);
 *  2. each window sorted by (target length, source length), stably (ties
 *     keep their incoming order);
 *  3. the window cut into batches of `batch`; its full batches are shuffled
 *     (Fisher-Yates over splitmix64) with a seed that is a hash of the
 *     window's incoming indices (so the epoch order's seed decides it: the
 *     same p gives the same result, on any thread count); a last, partial
 *     batch (only in the last window) stays last.
 * So every batch of `batch` consecutive entries starting at a multiple of
 * batch lies in one window and holds samples of similar lengths, and p stays
 * a permutation of its entries. Errors: BK_ERR_NULL, BK_ERR_SHAPE (n < 0,
 * batch < 1), BK_ERR_PARAM (not a seq2seq dataset; an entry outside
 * [0, n of ds)); p is untouched on failure. */
BK_API bk_status bk_data_bucket_order(const bk_dataset *ds, int64_t *p, int64_t n, int batch, int64_t window);

/* ---- sentence-pair (seq2seq) datasets ---- */
/* A seq2seq split is two line-aligned id files, line i of the source
 * translating line i of the target: one sentence a line, its token ids as
 * decimal numbers separated by single spaces, without BOS or EOS (what
 * spm_encode --output_format=id writes). Parsing is strict, BK_ERR_FORMAT
 * naming the file and line: "\n" line ends only (the last line's optional;
 * a CR is refused), no empty line, no leading, trailing or double space, no
 * token that is not a plain decimal number (no sign, no leading zero), no id
 * outside [0, vocab), the same number of lines in both files. Plain or
 * gzipped files are read alike, each at most 1 GiB.
 * Every sentence gets BK_SEQ_EOS appended (fairseq's convention), so a
 * length counts the EOS. The caps (bk_data_config.max_len for the source,
 * tgt_max_len for the target; 0: the split's longest) drop every pair with
 * a longer side (fairseq's skip of over-long pairs); info.version records
 * the caps and the count dropped. Then `limit` keeps the first pairs. An
 * empty result is BK_ERR_SHAPE; a negative cap BK_ERR_PARAM.
 * "bible" (bk_data_open) reads DIR/bible/SPLIT.{es,en}.ids, vocabulary
 * BK_BIBLE_VOCAB (a constant: the id files are bound by their checksums to
 * the one SentencePiece model, data/bible/spm.model), and checks each file
 * against the size and FNV-1a-64 sum of the known version (the files whose
 * sha256 scripts/data.sha256 records): a missing file is BK_ERR_IO, another
 * version BK_ERR_FORMAT, both naming the file and the fix
 * ("scripts/data.sh bible-spm"). Splits train, valid and test. */
#define BK_SEQ_UNK 0
#define BK_SEQ_BOS 1
#define BK_SEQ_EOS 2
#define BK_SEQ_PAD 3
#define BK_BIBLE_VOCAB 8000

/* Opens any two line-aligned id files as a seq2seq dataset (name "ids"),
 * with the rules above but no checksum: vocab in [4, 2^24], split is only
 * recorded (info.split). c NULL: the defaults. Errors: BK_ERR_NULL,
 * BK_ERR_PARAM (vocab, caps), BK_ERR_IO, BK_ERR_FORMAT, BK_ERR_SHAPE,
 * BK_ERR_NOMEM. */
BK_API bk_status bk_data_open_ids(const char *src_path, const char *tgt_path, int vocab, bk_split split,
                                  const bk_data_config *c, bk_dataset **out);
/* Pairs idx[0..B) of a seq2seq dataset: src [B, max_len] and tgt
 * [B, tgt_max_len] (ids, ending with BK_SEQ_EOS, then BK_SEQ_PAD to the
 * row's end), src_len [B] and tgt_len [B] (EOS counted; >= 2). Errors: a
 * dataset that is not seq2seq or an index outside [0, n) (BK_ERR_PARAM), a
 * NULL array (BK_ERR_NULL), B < 0 (BK_ERR_SHAPE). */
BK_API bk_status bk_data_fill_pair(const bk_dataset *ds, const int64_t *idx, int B, int32_t *src, int32_t *src_len,
                                   int32_t *tgt, int32_t *tgt_len);

/* ---- parsers over memory (what the readers use; fuzzed in tests/fuzz) ---- */
/* IDX: magic 0x0000080<d> (unsigned bytes, d dims), big-endian sizes. Fills
 * dims[want_dims]; *data points into buf, at the first sample byte. Rejects
 * (BK_ERR_FORMAT) another element type, d != want_dims, a dimension outside
 * [1, 2^24], and a size that does not match the header exactly. */
BK_API bk_status bk_data_parse_idx(const uint8_t *buf, size_t n, int want_dims, int64_t *dims,
                                   const uint8_t **data);
/* Digits CSV: one row per line, 64 integers in 0..16 and a label in 0..9
 * ("\n" or "\r\n" line ends; the last line's is optional). An empty line,
 * anywhere (trailing ones included), is an error naming the line. Writes up
 * to cap rows (pix [cap*64], labels [cap]); *rows receives the count.
 * Malformed input, no row, or more than cap rows: BK_ERR_FORMAT. */
BK_API bk_status bk_data_parse_digits(const char *buf, size_t n, int64_t cap, uint8_t *pix, int32_t *labels,
                                      int64_t *rows);
/* An RFC 5322 message: offset of the body, the byte after the first empty
 * line ("\n" or "\r\n" at the start of a line, the message's first byte
 * included: a message that starts with an empty line has no headers); the
 * body keeps any further empty lines. n when there is no empty line (the
 * whole message is headers). */
BK_API size_t bk_data_mail_body(const uint8_t *msg, size_t n);

/* ------------------------------------------------------------------------ */
/* Parallel text: sentence pairs for translation                            */
/* ------------------------------------------------------------------------ */
/* A parallel split is two line-aligned UTF-8 files, line i of the source
 * translating line i of the target; the sentences are kept as raw UTF-8
 * (tokenising them is not this layer's work). The stored corpus:
 *   bible          bible/{train,valid,test}.{es,en} (+ .ref, MANIFEST):
 *                  Spanish (Reina-Valera 1909) -> English (World English
 *                  Bible), verse-aligned, split by whole books; built by
 *                  scripts/data.sh bible (docs/TRANSLATION.md)
 * Every file is validated strictly, and a failure names the file and the
 * line (and the byte in the line for bad UTF-8), BK_ERR_FORMAT:
 *   - valid UTF-8 (no overlong forms, surrogates or code points above
 *     U+10FFFF), no byte-order mark at the start;
 *   - "\n" line ends only: a CR anywhere is refused, as are the other
 *     control characters (U+0000..U+001F but TAB, U+007F..U+009F) and the
 *     Unicode line and paragraph separators U+2028, U+2029 (readers that
 *     split on them would see other lines);
 *   - no empty line and no line of only spaces and tabs (the last line's
 *     "\n" is optional, so a file ending in "\n\n" has an empty line);
 *   - no line longer than max_bytes bytes (its "\n" not counted);
 *   - both files the same number of lines, at least one; each file at most
 *     BK_PARALLEL_MAX_FILE bytes.
 * A file that cannot be opened or read is BK_ERR_IO. */
#define BK_PARALLEL_MAX_LINE_DEFAULT 4096
#define BK_PARALLEL_MAX_LINE (1 << 20)
#define BK_PARALLEL_MAX_FILE ((int64_t)1 << 30)

typedef struct {
    int max_bytes;  /* longest line in bytes, its "\n" not counted
                       (0: BK_PARALLEL_MAX_LINE_DEFAULT; 1..BK_PARALLEL_MAX_LINE) */
    int64_t limit;  /* > 0: keep only the first `limit` pairs (every line is
                       still validated); 0: all; < 0 is refused          */
} bk_parallel_config;

/* A sentence pair: NUL-terminated UTF-8 without the line end, and its
 * length in bytes. The pointers live as long as the bk_parallel. */
typedef struct {
    const char *src, *tgt;
    int32_t src_len, tgt_len;
} bk_sentence_pair;

typedef struct {
    int64_t n;                    /* pairs kept                              */
    int64_t lines;                /* lines in each file (n unless limited)   */
    int64_t src_bytes, tgt_bytes; /* bytes of the kept sentences             */
    int32_t src_max, tgt_max;     /* longest kept sentence, bytes            */
    uint64_t src_fnv, tgt_fnv;    /* FNV-1a-64 of each whole file            */
    char version[192];            /* what a run records: corpus, split and
                                     checksums (or the files' names)         */
} bk_parallel_info;

typedef struct bk_parallel bk_parallel;

/* max_bytes 4096, no limit. */
BK_API bk_parallel_config bk_parallel_config_default(void);
/* Parses two files held in memory (src[0..src_n), tgt[0..tgt_n); copied,
 * so the caller keeps its buffers). src_name and tgt_name (NULL: "source",
 * "target") are what the messages call them. c NULL: the defaults. Errors:
 * BK_ERR_NULL (a NULL buffer with a non-zero size, or out NULL),
 * BK_ERR_PARAM (max_bytes or limit out of range), BK_ERR_FORMAT (above),
 * BK_ERR_NOMEM; *out is untouched on failure. */
BK_API bk_status bk_parallel_parse(const char *src, size_t src_n, const char *tgt, size_t tgt_n,
                                   const char *src_name, const char *tgt_name, const bk_parallel_config *c,
                                   bk_parallel **out);
/* Reads and parses the two files at these paths (any line-aligned pair). */
BK_API bk_status bk_parallel_load(const char *src_path, const char *tgt_path, const bk_parallel_config *c,
                                  bk_parallel **out);
/* Opens split "train", "valid" or "test" of a stored corpus of this library
 * (name "bible": source es, target en) from DIR/NAME/SPLIT.{src,tgt} (dir
 * NULL or "": $BK_DATA, else "data"), checked against the FNV-1a-64 sums
 * and sizes of the version this library knows (the one scripts/data.sha256
 * records). A missing file is BK_ERR_IO, another version BK_ERR_FORMAT, both
 * with a message naming the file and the fix ("scripts/data.sh bible") and,
 * for another version, the Debian package versions the known one was built
 * from. An unknown name or split: BK_ERR_PARAM. */
BK_API bk_status bk_parallel_open(const char *name, const char *split, const char *dir, const bk_parallel_config *c,
                                  bk_parallel **out);
BK_API void bk_parallel_free(bk_parallel *p);
/* Pairs kept (0 for NULL). */
BK_API int64_t bk_parallel_count(const bk_parallel *p);
/* Counts, sizes and checksums (NULL for NULL). */
BK_API const bk_parallel_info *bk_parallel_get_info(const bk_parallel *p);
/* Pair i, 0 <= i < count (BK_ERR_PARAM otherwise; BK_ERR_NULL for NULL). */
BK_API bk_status bk_parallel_pair(const bk_parallel *p, int64_t i, bk_sentence_pair *out);

/* ------------------------------------------------------------------------ */
/* SentencePiece: subword vocabularies of raw text                          */
/* ------------------------------------------------------------------------ */
/* SentencePiece (Kudo and Richardson, 2018) through its own C++ library
 * (Debian libsentencepiece-dev), linked into libbirkhoff behind these C
 * functions (src/data/spm.cc); no tool is run. The labelled-text and
 * parallel-text readers (tsv:, csv:, parallel: specs of bk_data_open) train
 * one with bk_spm_train or load the user's, and `birkhoff translate` encodes
 * raw text and decodes its output with it. A bk_spm is read-only after
 * loading: any number of threads may encode and decode with one at once.
 * Errors as everywhere (birkhoff/core.h): a bk_status and bk_last_error();
 * an exception inside SentencePiece becomes BK_ERR_NOMEM (out of memory) or
 * BK_ERR_FORMAT with its message, never a crash through the C caller. */
#define BK_SPM_MIN_VOCAB 261            /* 4 special + 256 byte pieces + 1  */
#define BK_SPM_MAX_VOCAB (1 << 20)
#define BK_SPM_MAX_MODEL ((int64_t)1 << 28) /* bytes of a model file          */
typedef struct bk_spm bk_spm;

/* Trains a unigram model on texts[0..n) (NUL-terminated UTF-8, each one
 * sentence; any bytes of valid UTF-8, newlines included, are taken as
 * written) and returns its serialized ModelProto in *model (malloc'd, *len
 * bytes; what spm_train writes as NAME.model, and what bk_spm_load and
 * `spm_encode --model` read). The recipe is scripts/data.sh's: every
 * character kept (character_coverage 1), byte fallback (a character never
 * seen in training encodes as its UTF-8 bytes, so decoding gives any valid
 * UTF-8 text back exactly), identity normalisation with whitespace kept as
 * written (remove_extra_whitespaces false; decode(encode(t)) == t), a
 * sentence up to BK_TEXT_MAX_LINE bytes, ids BK_SEQ_UNK 0, BK_SEQ_BOS 1,
 * BK_SEQ_EOS 2, BK_SEQ_PAD 3. vocab is an upper bound (hard_vocab_limit
 * false): a small corpus gives fewer pieces (bk_spm_vocab says how many).
 * Deterministic: one training thread, every text in the given order, no
 * sampling and no random seed, so the same texts and vocab give the same
 * bytes on every call, whatever bk_set_num_threads says (tested).
 * Errors: BK_ERR_NULL (texts, a text, model or len NULL), BK_ERR_SHAPE (n < 1,
 * every text empty), BK_ERR_PARAM (vocab outside [BK_SPM_MIN_VOCAB,
 * BK_SPM_MAX_VOCAB], or too small for the texts: 260 + the number of
 * distinct characters is needed), BK_ERR_FORMAT (a text that is not UTF-8,
 * naming it and the byte; SentencePiece's refusal), BK_ERR_NOMEM. */
BK_API bk_status bk_spm_train(const char *const *texts, int64_t n, int vocab, void **model, size_t *len);
/* Loads a serialized model (model[0..len), copied). Errors: BK_ERR_NULL,
 * BK_ERR_FORMAT (not a model: SentencePiece's message), BK_ERR_NOMEM. */
BK_API bk_status bk_spm_load(const void *model, size_t len, bk_spm **out);
/* Loads a model file (spm_train's NAME.model, or DIR/spm.model of a run);
 * at most BK_SPM_MAX_MODEL bytes are read. Errors as bk_spm_load, naming the
 * file, and BK_ERR_IO when it cannot be opened or read. */
BK_API bk_status bk_spm_load_file(const char *path, bk_spm **out);
/* The number of pieces (ids are in [0, vocab)); 0 for NULL. */
BK_API int bk_spm_vocab(const bk_spm *s);
/* The id the model gives to the role which (BK_SEQ_UNK, BK_SEQ_BOS,
 * BK_SEQ_EOS or BK_SEQ_PAD), -1 when it has none (spm_train's default has no
 * pad) or for NULL / another value. A model bk_spm_train made gives which. */
BK_API int bk_spm_special(const bk_spm *s, int which);
/* Encodes text (NUL-terminated UTF-8) into ids: *n receives the number of
 * ids the whole text encodes to (no BOS or EOS added), of which the first
 * min(*n, cap) are written to ids[0..cap) (so *n > cap says the text was cut;
 * ids may be NULL when cap is 0: a count only). An empty text is 0 ids.
 * Errors: BK_ERR_NULL, BK_ERR_SHAPE (cap < 0), BK_ERR_FORMAT ("byte K:
 * invalid UTF-8 (byte 0xXX)", K 1-based in the text: the caller adds the
 * file and line). */
BK_API bk_status bk_spm_encode(const bk_spm *s, const char *text, int32_t *ids, int cap, int *n);
/* Decodes ids[0..n) into *text (malloc'd, NUL-terminated; the caller frees
 * it). Control ids (BOS, EOS, PAD) decode to nothing, UNK to " U+2047 ",
 * byte pieces that do not form UTF-8 to U+FFFD (SentencePiece's rule), and
 * a NUL byte (the piece <0x00>) to U+FFFD too (a C string cannot hold it).
 * Errors: BK_ERR_NULL, BK_ERR_SHAPE (n < 0), BK_ERR_PARAM (an id outside
 * [0, vocab), naming it and its position), BK_ERR_NOMEM. */
BK_API bk_status bk_spm_decode(const bk_spm *s, const int32_t *ids, int n, char **text);
/* Frees s (NULL: nothing). */
BK_API void bk_spm_free(bk_spm *s);

/* ------------------------------------------------------------------------ */
/* Generated datasets                                                       */
/* ------------------------------------------------------------------------ */
/* Every sample depends only on (seed, index): sample i can be made on its
 * own, in any order, on any thread, and comes out the same every time. There
 * is no global mutable state and no allocation. The random numbers come from
 * a counter-based splitmix64 stream keyed by (seed, index, data set). ListOps
 * uses integers only. Shapes uses double arithmetic with +, -, *, / and sqrt
 * only: sine and cosine are polynomials of our own, not libm calls. So the
 * output is bit-identical on every IEEE-754 machine (the library is compiled
 * in ISO C mode, where GCC does not fuse multiply-adds).
 *
 * ListOps (the Long Range Arena task). Token ids: 0..9 are the digits, then
 * 10 "[MIN", 11 "[MAX", 12 "[MED", 13 "[SM" and 14 "]". An operation is
 * written OPEN arg arg ... CLOSE, and each argument is a digit or a nested
 * operation.
 *   MIN, MAX  the minimum or maximum of the arguments
 *   MED       int(numpy.median(args)): the middle value, or for an even
 *             count the floor of the mean of the two middle values
 *   SM        the sum of the arguments modulo 10
 * The whole sample is always one operation. The label is its value, 0..9.
 *
 * Shape rules: an operation has 2..max_args arguments. The nesting depth is
 * 1..max_depth, where a lone [OP d d ] has depth 1. The length is in
 * [min_len, max_len].
 *
 * Sampling:
 *  - Pick a target length uniformly in [min_len, max_len] (capped at the
 *    longest possible tree). If no tree has exactly that length, use the
 *    nearest length that works.
 *  - Build a tree of exactly that length from the top down. Each operation
 *    draws its argument count uniformly among the counts that still work.
 *    Its token budget is split among the arguments by a uniform random
 *    composition (Dirichlet(1)), and each share is moved to the nearest
 *    size that works. A share of 1 token becomes a digit.
 *  - Operators and digits are uniform.
 * Every step is bounded: there is no rejection loop.
 *
 * Which lengths work: write L(d) for the longest tree of depth d, with
 * L(1) = max_args + 2 and L(d) = max_args * L(d-1) + 2. A tree of length n
 * exists when:
 *   max_args >= 4   4 <= n <= L(max_depth)
 *   max_args == 3   4 <= n <= L(max_depth), n != 6
 *   max_args == 2   4 <= n <= L(max_depth), n % 3 == 1
 * Options are rejected when no length in [min_len, max_len] works. Some
 * depth-limited cases hit this: with max_depth 1 and max_args 10, for
 * instance, a tree has at most 12 tokens. */
#define BK_LISTOPS_VOCAB 15
#define BK_LISTOPS_CLASSES 10
#define BK_LISTOPS_MAXLEN 4096
#define BK_LISTOPS_TOK_MIN 10
#define BK_LISTOPS_TOK_MAX 11
#define BK_LISTOPS_TOK_MED 12
#define BK_LISTOPS_TOK_SM 13
#define BK_LISTOPS_TOK_CLOSE 14

typedef struct {
    int min_len, max_len; /* token count in [min_len, max_len];
                             5 <= min_len <= max_len <= 4096                   */
    int max_depth;        /* maximum operation nesting depth, 1..10 (LRA: 10) */
    int max_args;         /* arguments per operation, 2..max_args, max_args in
                             2..10 (LRA: 10)                                    */
} bk_listops_config;

/* Defaults in the style of LRA: min_len = max(5, max_len / 4) (so max_len
 * 2000 gives 500..2000, as in LRA), max_depth 10, max_args 10. Nothing is
 * clamped: an out-of-range max_len is reported by bk_listops_check. */
BK_API bk_listops_config bk_listops_config_default(int max_len);
/* Checks the options only (the checks bk_listops_sample makes): BK_ERR_NULL,
 * or BK_ERR_PARAM with a message naming the option. */
BK_API bk_status bk_listops_check(const bk_listops_config *c);
/* Makes sample `index` of stream `seed`: tokens[0..*len) (tokens needs room
 * for c->max_len ids) and *label in 0..9. Errors as bk_listops_check, and
 * BK_ERR_NULL for a NULL output. */
BK_API bk_status bk_listops_sample(uint64_t seed, uint64_t index, const bk_listops_config *c, int32_t *tokens,
                                   int *len, int *label);

/* Point-cloud shapes (a stand-in for ModelNet). There are 12 classes of 3-D
 * surfaces (bk_shapes_name gives their names). Each class draws its own
 * proportions per sample:
 *   0 sphere       radius 1
 *   1 box          half-sides 1 : 0.75..1 : 0.75..1 (near-cubes)
 *   2 cylinder     closed; radius 1, half-height 0.6..1.5
 *   3 cone         with its base disc; base radius 1, height 1.5..2.5
 *   4 torus        major radius 1, tube radius 0.2..0.4
 *   5 pyramid      square base [-1,1]^2 included, height 1.2..2
 *   6 ellipsoid    semi-axes 1 : 0.55..0.75 : 0.3..0.45
 *   7 capsule      tube radius 0.35..0.5, straight part 2 long
 *   8 helix        a spring: radius 1, 2.5..4 turns, height 1.6..3,
 *                  wire radius 0.12
 *   9 dumbbell     balls of radius 0.35..0.5 at +-1 and a rod of radius 0.08
 *  10 disc         flat; radius 1 with a central hole of radius 0..0.45
 *  11 tetrahedron  regular
 * Points are sampled on the surface, by area where that is exact. The
 * ellipsoid is a scaled sphere, and the torus uses bounded rejection. The
 * points are drawn independently, so their order carries no information.
 *
 * Pose and normalisation:
 *  1. A per-axis scale in [0.9, 1.1] is applied in the object frame.
 *  2. The cloud is turned by a uniform random rotation (a random unit
 *     quaternion, Shoemake's method).
 *  3. The mean is subtracted, and the cloud is scaled so its largest point
 *     radius is 1. This step also removes any overall scale, so none is
 *     drawn.
 *  4. Noise is added to each coordinate: approximately Gaussian (the sum of
 *     6 uniforms), with sd `noise`.
 *
 * Labels are balanced exactly: each block of 12 consecutive indices holds
 * every class once, in an order shuffled per block. */
#define BK_SHAPES_CLASSES 12
#define BK_SHAPES_MIN_POINTS 16
#define BK_SHAPES_MAX_POINTS 4096

typedef struct {
    int points;  /* 16..4096                                  */
    float noise; /* jitter sd, 0 <= noise <= 1 (default 0.02) */
} bk_shapes_config;

/* The class name of label 0..BK_SHAPES_CLASSES-1, "?" for any other value. */
BK_API const char *bk_shapes_name(int label);
/* Defaults: the given number of points (not clamped) and noise 0.02. */
BK_API bk_shapes_config bk_shapes_config_default(int points);
/* The label of sample `index` of stream `seed` (needs no options; the label
 * bk_shapes_sample gives). */
BK_API int bk_shapes_label(uint64_t seed, uint64_t index);
/* Checks the options only: BK_ERR_NULL, or BK_ERR_PARAM naming the option. */
BK_API bk_status bk_shapes_check(const bk_shapes_config *c);
/* Makes sample `index` of stream `seed`: xyz[points*3] as x,y,z per point,
 * and *label in [0, BK_SHAPES_CLASSES). Errors as bk_shapes_check, and
 * BK_ERR_NULL for a NULL output. */
BK_API bk_status bk_shapes_sample(uint64_t seed, uint64_t index, const bk_shapes_config *c, float *xyz,
                                  int *label);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_DATA_H */
