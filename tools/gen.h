/* gen.h -- procedural, labelled data sets for `birkhoff train`
 * (data=listops, data=shapes).
 *
 * Every sample depends only on (seed, index). Sample i can be made on its
 * own, in any order, on any thread, and comes out the same every time.
 * There is no global mutable state and no allocation. The random numbers
 * come from a counter-based splitmix64 stream keyed by (seed, index, data
 * set). ListOps uses integers only. Shapes uses double arithmetic with
 * +, -, *, / and sqrt only: sine and cosine are polynomials of our own, not
 * libm calls. So the output is bit-identical on every IEEE-754 machine,
 * provided the compiler does not fuse multiply-adds. GCC does not fuse them
 * in ISO mode (-std=c11).
 *
 * The functions return 1 on success. On invalid arguments they return 0 and
 * write a message into err (err may be NULL or errcap 0).
 */
#ifndef BK_TOOLS_GEN_H
#define BK_TOOLS_GEN_H
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------
 * ListOps (the Long Range Arena task)
 *
 * Token ids: 0..9 are the digits, then 10 "[MIN", 11 "[MAX", 12 "[MED",
 * 13 "[SM" and 14 "]". An operation is written OPEN arg arg ... CLOSE, and
 * each argument is a digit or a nested operation.
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
 * instance, a tree has at most 12 tokens.
 * --------------------------------------------------------------------- */
#define GEN_LISTOPS_VOCAB 15
#define GEN_LISTOPS_CLASSES 10
#define GEN_LISTOPS_MAXLEN 4096
#define GEN_TOK_MIN 10
#define GEN_TOK_MAX 11
#define GEN_TOK_MED 12
#define GEN_TOK_SM 13
#define GEN_TOK_CLOSE 14

typedef struct {
    int min_len, max_len; /* token count in [min_len, max_len]; 5 <= min_len <= max_len <= 4096 */
    int max_depth;        /* maximum operation nesting depth, 1..10 (LRA: 10) */
    int max_args;         /* arguments per operation, 2..max_args, max_args in 2..10 (LRA: 10) */
} gen_listops_opts;

/* Defaults in the style of LRA: min_len = max(5, max_len / 4) (so
 * max_len 2000 gives 500..2000, as in LRA), max_depth 10, max_args 10.
 * No clamping is done. An out-of-range max_len is reported by gen_listops. */
gen_listops_opts gen_listops_defaults(int max_len);

/* Makes sample `index` of stream `seed`. Writes tokens[0..*len) (tokens
 * needs room for o->max_len ids) and sets *label to 0..9. Returns 1, or 0
 * when the options are invalid. */
int gen_listops(uint64_t seed, uint64_t index, const gen_listops_opts *o, int32_t *tokens, int *len,
                int *label, char *err, size_t errcap);

/* Checks the options only (the same checks gen_listops makes). */
int gen_listops_check(const gen_listops_opts *o, char *err, size_t errcap);

/* ------------------------------------------------------------------------
 * Point-cloud shapes (a stand-in for ModelNet)
 *
 * There are 12 classes of 3-D surfaces. gen_shape_name() gives their names.
 * Each class draws its own proportions per sample:
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
 * every class once, in an order shuffled per block.
 * --------------------------------------------------------------------- */
#define GEN_SHAPES_CLASSES 12
#define GEN_SHAPES_MIN_POINTS 16
#define GEN_SHAPES_MAX_POINTS 4096

/* The class name for label 0..GEN_SHAPES_CLASSES-1, or "?" for any other value. */
const char *gen_shape_name(int label);

typedef struct {
    int points;  /* 16..4096 */
    float noise; /* jitter sd, 0 <= noise <= 1 (default 0.02) */
} gen_shapes_opts;

/* Defaults: the given number of points (not clamped) and noise 0.02. */
gen_shapes_opts gen_shapes_defaults(int points);

/* The label of sample `index` of stream `seed`. It needs no options and
 * gives the same label that gen_shapes() sets. */
int gen_shapes_label(uint64_t seed, uint64_t index);

/* Makes sample `index` of stream `seed`: xyz[points*3] as x,y,z per point,
 * and *label in [0, GEN_SHAPES_CLASSES). Returns 1, or 0 when the options
 * are invalid. */
int gen_shapes(uint64_t seed, uint64_t index, const gen_shapes_opts *o, float *xyz, int *label, char *err,
               size_t errcap);

/* Checks the options only (the same checks gen_shapes makes). */
int gen_shapes_check(const gen_shapes_opts *o, char *err, size_t errcap);

#endif
