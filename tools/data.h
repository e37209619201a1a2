/* data.h -- the datasets of `birkhoff train/eval/plot` (tools layer).
 *
 * Stored datasets are read from a data directory that scripts/data.sh fills
 * (default "data", or $BK_DATA, or the caller's dir):
 *   mnist          mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte (IDX)
 *   fashion-mnist  fashion-mnist/{train,t10k}-...-ubyte.gz (gzipped IDX)
 *   digits         digits/digits.csv.gz (UCI 8x8: 64 pixels 0..16 + label)
 *   spam           spam/{easy-ham-1,easy-ham-2,hard-ham-1,spam-1,spam-2}/
 *                  *.txt (SpamAssassin messages; the body after the header
 *                  block, as bytes: vocabulary 256)
 * and generated ones are a pure function of (seed, index) (tools/gen.h):
 *   listops        LRA ListOps expressions (vocabulary 15, 10 classes)
 *   shapes         labelled 3-D point clouds (random pose, scale, noise)
 *
 * Every stored file is checked against the FNV-1a-64 checksum of the
 * version this code knows (of the decompressed content); a missing or
 * different file is refused with a message naming the command that fixes
 * it. Readers stream through a fixed buffer and keep only the parsed samples
 * (bytes). Splits: MNIST/Fashion-MNIST have their own; digits and spam are
 * split 80/20 by a fixed permutation (seed 2718) of the file order; the
 * generated sets use different seeds per split. */
#ifndef BK_DATA_H
#define BK_DATA_H
#include "birkhoff.h"
#include "gen.h"

#include <stddef.h>
#include <stdint.h>

enum { DATA_TRAIN = 0, DATA_TEST = 1 };

typedef struct {
    const char *dir;     /* data directory; NULL: $BK_DATA, else "data"      */
    int64_t limit;       /* > 0: the first `limit` samples of the split      */
    int max_len;         /* spam (bytes kept, default 1024), listops (2000)  */
    int min_len;         /* listops: 0 = the generator's default             */
    int listops_depth;   /* listops: maximum depth (10)                      */
    int points;          /* shapes: points per cloud (256)                   */
    float noise;         /* shapes: jitter sd (0.02)                         */
    int64_t gen_train, gen_test; /* generated sets: samples per split (20000 / 2000) */
    uint64_t gen_seed;   /* generated sets: stream seed (1)                  */
} data_opts;

typedef struct {
    char name[16];
    int split;
    bk_input_kind kind;
    int64_t n;
    int classes;
    int channels, h, w; /* images                                            */
    int vocab, max_len; /* tokens                                            */
    int points, point_dim;
    float scale;        /* image pixel value = byte * scale                  */
    uint8_t *bytes;     /* images [n, c*h*w]; spam [n, max_len]              */
    int32_t *lens;      /* spam [n]                                          */
    int32_t *labels;    /* stored sets [n]                                   */
    uint64_t gen_seed;  /* generated sets: the split's stream seed           */
    gen_listops_opts listops; /* resolved and checked at open              */
    gen_shapes_opts shapes;
    char version[192];  /* what the run records: name, source, checksum      */
} data_set;

data_opts data_opts_default(void);
/* "mnist", "fashion-mnist", "digits", "spam", "listops", "shapes"; 1 if known */
int data_known(const char *name);
/* Opens a split. Returns 1, or 0 with a message in err. */
int data_open(const char *name, int split, const data_opts *o, data_set *ds, char *err, size_t errcap);
void data_close(data_set *ds);
/* Writes the model-config fields the data fixes: input kind, channels and
 * image size (patch kept if it divides, else the largest divisor <= it),
 * vocab, max_len, point_dim, max_points, classes. */
void data_model_shape(const data_set *ds, bk_model_config *c);
/* Samples idx[0..B) into the batch arrays (the model's layout; x for images
 * [B,c,h,w] in [0,1] and points [B,points,3]; tokens [B,max_len] and len
 * for tokens; labels [B]). Arrays not used by the kind may be NULL. */
int data_fill(const data_set *ds, const int64_t *idx, int B, float *x, int32_t *tok, int32_t *len, int32_t *lab);

/* splitmix64's finaliser, and the Fisher-Yates permutation of [0, n) from
 * the splitmix64 stream of seed (the splits and the epochs' sample orders) */
uint64_t data_mix64(uint64_t x);
void data_permute(int64_t *p, int64_t n, uint64_t seed);

/* ---- parsers over memory (used by the readers; fuzzed) ----
 * IDX: magic 0x0000080<d> (unsigned bytes, d dims), big-endian sizes. Fills
 * dims[d]; *data points into buf. Rejects another type, d != want_dims,
 * zero or oversized dimensions, and a size that does not match exactly. */
int data_parse_idx(const uint8_t *buf, size_t n, int want_dims, int64_t *dims, const uint8_t **data, char *err,
                   size_t errcap);
/* Digits CSV: one row per line, 64 integers in 0..16 and a label in 0..9
 * ("\n" or "\r\n" line ends; the last line's is optional). An empty line,
 * anywhere (trailing ones included), is an error naming the line. Writes up
 * to cap rows (pix [cap*64], lab [cap]); *rows receives the count. */
int data_parse_digits(const char *buf, size_t n, int64_t cap, uint8_t *pix, int32_t *lab, int64_t *rows, char *err,
                      size_t errcap);
/* An RFC 5322 message: offset of the body, the byte after the first empty
 * line ("\n" or "\r\n" at the start of a line, the message's first byte
 * included: a message that starts with an empty line has no headers); the
 * body keeps any further empty lines. n when there is no empty line (the
 * whole message is headers). */
size_t data_mail_body(const uint8_t *msg, size_t n);
#endif
