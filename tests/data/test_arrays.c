/* test_arrays.c -- the user's arrays as datasets (specs npy:DIR,
 * npy:X.npy,Y.npy[,L.npy], npz:FILE; src/data/arrays.c, src/core/npz.c):
 * files written here (bk_npy_write, or bytes built here for the dtypes it
 * does not write, and zip archives with stored and deflated members) are
 * opened through bk_data_open and filled, every value checked against what
 * was written (uint8 HWC images transposed to CHW and scaled, float32 images
 * as they are, tokens with and without lengths, point sets with lengths);
 * x is memory-mapped while the dataset is open and unmapped at close
 * (/proc/self/maps); every refusal names the file and the sample, element
 * or byte; and bk_data_window_order.
 * Run: build/test_arrays; prints "N passed, M failed". */
#define _XOPEN_SOURCE 700 /* realpath */
#include "birkhoff.h"
#include "../harness.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define CHECK(ok, name, ...) th_check((ok), (name), __VA_ARGS__)

static char g_tmp[512];

static int has(const char *msg, const char *part) { return msg && strstr(msg, part) != NULL; }

/* ---- files ---- */
typedef struct {
    uint8_t *b;
    size_t n;
} bytes;

/* a .npy file's bytes: format 1.0, header padded to 64 */
static bytes npy_bytes(const char *descr, int ndim, const int64_t *shape, const void *data, size_t esize,
                       const char *order)
{
    char dict[256], sh[128] = "";
    size_t count = 1, l = 0;
    for (int i = 0; i < ndim; i++) {
        l += (size_t)snprintf(sh + l, sizeof sh - l, "%lld%s", (long long)shape[i], ndim == 1 ? "," : i + 1 < ndim ? ", " : "");
        count *= (size_t)shape[i];
    }
    int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }", descr, order, sh);
    int pad = (64 - (10 + len + 1) % 64) % 64;
    bytes r;
    r.n = 10 + (size_t)len + (size_t)pad + 1 + count * esize;
    r.b = malloc(r.n);
    memcpy(r.b, "\x93NUMPY\x01\x00", 8);
    r.b[8] = (uint8_t)((len + pad + 1) & 0xff);
    r.b[9] = (uint8_t)((len + pad + 1) >> 8);
    memcpy(r.b + 10, dict, (size_t)len);
    memset(r.b + 10 + len, ' ', (size_t)pad);
    r.b[10 + len + pad] = '\n';
    memcpy(r.b + 10 + len + pad + 1, data, count * esize);
    return r;
}

static void put(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        if (n) fwrite(b, 1, n, f);
        fclose(f);
    }
}

static void put_npy(const char *path, const char *descr, int ndim, const int64_t *shape, const void *data, size_t esize)
{
    bytes r = npy_bytes(descr, ndim, shape, data, esize, "False");
    put(path, r.b, r.n);
    free(r.b);
}

static const char *in_dir(const char *dir, const char *name)
{
    static char p[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

/* dir = the test's directory g_tmp/name, made */
static void mk(char *dir, size_t cap, const char *name)
{
    snprintf(dir, cap, "%s/%s", g_tmp, name);
    mkdir(dir, 0755);
}

/* removes a directory's x.npy, y.npy, lengths.npy and the directory */
static void rm_dir(const char *dir)
{
    remove(in_dir(dir, "x.npy"));
    remove(in_dir(dir, "y.npy"));
    remove(in_dir(dir, "lengths.npy"));
    rmdir(dir);
}

/* a zip archive of members (name, bytes), each stored or deflated */
typedef struct {
    const char *name;
    bytes data;
    int deflate;
} member;

static void le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static bytes zip_bytes(const member *m, int nm)
{
    bytes z = {malloc(1 << 20), 0};
    uint8_t cd[4096];
    size_t cdn = 0;
    for (int i = 0; i < nm; i++) {
        const size_t nl = strlen(m[i].name);
        const uint32_t crc = (uint32_t)crc32(0, m[i].data.b, (uInt)m[i].data.n);
        uint8_t *comp = m[i].data.b;
        size_t cn = m[i].data.n;
        if (m[i].deflate) {
            z_stream s;
            memset(&s, 0, sizeof s);
            deflateInit2(&s, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
            comp = malloc(deflateBound(&s, (uLong)cn));
            s.next_in = m[i].data.b;
            s.avail_in = (uInt)cn;
            s.next_out = comp;
            s.avail_out = (uInt)deflateBound(&s, (uLong)cn);
            deflate(&s, Z_FINISH);
            cn = s.total_out;
            deflateEnd(&s);
        }
        uint8_t *h = z.b + z.n, *c = cd + cdn;
        memset(h, 0, 30);
        le(h, 0x04034b50, 4);
        le(h + 4, 20, 2);
        le(h + 8, m[i].deflate ? 8 : 0, 2);
        le(h + 14, crc, 4);
        le(h + 18, cn, 4);
        le(h + 22, m[i].data.n, 4);
        le(h + 26, nl, 2);
        memcpy(h + 30, m[i].name, nl);
        memcpy(h + 30 + nl, comp, cn);
        memset(c, 0, 46);
        le(c, 0x02014b50, 4);
        le(c + 4, 20, 2);
        le(c + 6, 20, 2);
        le(c + 10, m[i].deflate ? 8 : 0, 2);
        le(c + 16, crc, 4);
        le(c + 20, cn, 4);
        le(c + 24, m[i].data.n, 4);
        le(c + 28, nl, 2);
        le(c + 42, z.n, 4);
        memcpy(c + 46, m[i].name, nl);
        cdn += 46 + nl;
        z.n += 30 + nl + cn;
        if (comp != m[i].data.b) free(comp);
    }
    memcpy(z.b + z.n, cd, cdn);
    uint8_t *e = z.b + z.n + cdn;
    memset(e, 0, 22);
    le(e, 0x06054b50, 4);
    le(e + 8, (uint64_t)nm, 2);
    le(e + 10, (uint64_t)nm, 2);
    le(e + 12, cdn, 4);
    le(e + 16, z.n, 4);
    z.n += cdn + 22;
    return z;
}

/* 1 when a file of this path is mapped into the process */
static int mapped(const char *path)
{
    char real[PATH_MAX];
    if (!realpath(path, real)) return -1;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[4096];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        const size_t L = strlen(line), R = strlen(real);
        found |= L >= R && strcmp(line + L - R, real) == 0;
    }
    fclose(f);
    return found;
}

/* a config that keeps every row in TRAIN (no carved split) */
static bk_data_config whole(void)
{
    bk_data_config o = bk_data_config_default();
    o.test_frac = 0;
    o.valid_frac = 0;
    return o;
}

static bk_status open_spec(const char *fmt, const char *path, const bk_data_config *o, bk_dataset **ds)
{
    char spec[1200];
    snprintf(spec, sizeof spec, "%s:%s", fmt, path);
    *ds = NULL;
    return bk_data_open(spec, BK_SPLIT_TRAIN, o, ds);
}

/* ---- images ---- */
enum { NI = 6, IH = 4, IW = 2, IC = 3 };

static void test_images_u8_hwc(void)
{
    char dir[600];
    mk(dir, sizeof dir, "img-u8");
    uint8_t px[NI * IH * IW * IC];
    int64_t lab[NI] = {0, 4, 2, 4, 1, 0};
    for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)(i * 37 + 11);
    const int64_t xs[4] = {NI, IH, IW, IC}, ys[1] = {NI};
    put_npy(in_dir(dir, "x.npy"), "|u1", 4, xs, px, 1);
    put_npy(in_dir(dir, "y.npy"), "<i8", 1, ys, lab, 8);
    bk_data_config o = whole();
    bk_dataset *ds;
    bk_status st = open_spec("npy", dir, &o, &ds);
    CHECK(st == BK_OK, "arrays: uint8 [N, H, W, C] images and int64 labels open", "%s", bk_last_error());
    if (st != BK_OK) return rm_dir(dir);
    const bk_dataset_info *in = bk_data_info(ds);
    CHECK(in->kind == BK_INPUT_IMAGE && in->n == NI && in->channels == IC && in->height == IH && in->width == IW &&
              in->classes == 5 && in->rows == NI && !strcmp(in->name, "npy"),
          "arrays: u8 HWC info (kind, n, C, H, W, classes = max + 1)", "kind %d n %lld %dx%dx%d classes %d name %s",
          in->kind, (long long)in->n, in->channels, in->height, in->width, in->classes, in->name);
    CHECK(has(in->version, "npy:x uint8[6, 4, 2, 3] y int64 fnv1a:"), "arrays: the version names dtype, shape and sum",
          "%s", in->version);
    CHECK(mapped(in_dir(dir, "x.npy")) == 1, "arrays: x.npy is memory-mapped while the dataset is open", "%s", "-");
    CHECK(mapped(in_dir(dir, "y.npy")) == 0, "arrays: y.npy is read, not kept mapped", "%s", "-");
    int64_t idx[NI];
    for (int i = 0; i < NI; i++) idx[i] = NI - 1 - i;
    float x[NI * IC * IH * IW];
    int32_t y[NI];
    st = bk_data_fill(ds, idx, NI, x, NULL, NULL, y);
    int ok = st == BK_OK;
    for (int b = 0; b < NI && ok; b++) {
        const int64_t i = idx[b];
        ok &= y[b] == lab[i];
        for (int c = 0; c < IC; c++)
            for (int h = 0; h < IH; h++)
                for (int w = 0; w < IW; w++)
                    ok &= x[((b * IC + c) * IH + h) * IW + w] ==
                          (float)px[((i * IH + h) * IW + w) * IC + c] * (1.0f / 255.0f);
    }
    CHECK(ok, "arrays: u8 HWC filled as CHW, /255, labels", "%s", bk_last_error());
    bk_model_config mc = bk_model_config_default();
    mc.patch = 4;
    bk_data_model_shape(ds, &mc);
    CHECK(mc.input == BK_INPUT_IMAGE && mc.channels == IC && mc.image_h == IH && mc.image_w == IW && mc.patch == 2 &&
              mc.classes == 5,
          "arrays: the model shape of an image array (patch lowered to divide 4x2)", "patch %d", mc.patch);
    bk_data_close(ds);
    CHECK(mapped(in_dir(dir, "x.npy")) == 0, "arrays: x.npy is unmapped at close", "%s", "-");
    rm_dir(dir);
}

static void test_images_f32(void)
{
    char dir[600];
    mk(dir, sizeof dir, "img-f32");
    enum { N = 5, H = 3, W = 6 };
    float v[N * H * W];
    int32_t lab[N] = {1, 0, 1, 1, 0};
    for (int i = 0; i < N * H * W; i++) v[i] = (float)sin(0.7 * i) * 3.5f - 0.25f;
    const int64_t xs[3] = {N, H, W}, ys[1] = {N};
    const char *px = in_dir(dir, "images.npy"), *py = in_dir(dir, "labels.npy");
    CHECK(bk_npy_write(px, BK_F32, 3, xs, v) == BK_OK && bk_npy_write(py, BK_I32, 1, ys, lab) == BK_OK,
          "arrays: float32 [N, H, W] written by bk_npy_write", "%s", bk_last_error());
    char files[1300];
    snprintf(files, sizeof files, "%s,%s", px, py);
    bk_data_config o = whole();
    bk_dataset *ds;
    bk_status st = open_spec("npy", files, &o, &ds);
    CHECK(st == BK_OK, "arrays: npy:X.npy,Y.npy opens", "%s", bk_last_error());
    if (st == BK_OK) {
        const bk_dataset_info *in = bk_data_info(ds);
        float x[N * H * W];
        int64_t idx[N] = {0, 1, 2, 3, 4};
        int32_t y[N];
        st = bk_data_fill(ds, idx, N, x, NULL, NULL, y);
        CHECK(st == BK_OK && in->channels == 1 && in->height == H && in->width == W && in->classes == 2 &&
                  !memcmp(x, v, sizeof v) && !memcmp(y, lab, sizeof y),
              "arrays: float32 images taken as they are (bitwise), 1 channel", "%s", bk_last_error());
        bk_data_close(ds);
    }
    /* [N, C, H, W]: the channel axis second (its size 1..4, the last not) */
    float c4[2 * 2 * 3 * 5];
    for (int i = 0; i < 60; i++) c4[i] = (float)i * 0.5f;
    const int64_t s4[4] = {2, 2, 3, 5}, s1[1] = {2};
    int32_t l2[2] = {0, 1};
    bk_npy_write(px, BK_F32, 4, s4, c4);
    bk_npy_write(py, BK_I32, 1, s1, l2);
    st = open_spec("npy", files, &o, &ds);
    if (st == BK_OK) {
        const bk_dataset_info *in = bk_data_info(ds);
        float x[60];
        int64_t idx[2] = {0, 1};
        st = bk_data_fill(ds, idx, 2, x, NULL, NULL, NULL);
        CHECK(st == BK_OK && in->channels == 2 && in->height == 3 && in->width == 5 && !memcmp(x, c4, sizeof c4),
              "arrays: float32 [N, C, H, W] taken as CHW", "C %d H %d W %d", in->channels, in->height, in->width);
        bk_data_close(ds);
    } else {
        CHECK(0, "arrays: float32 [N, C, H, W] opens", "%s", bk_last_error());
    }
    remove(px);
    remove(py);
    rmdir(dir);
}

/* ---- tokens ---- */
static void test_tokens(void)
{
    char dir[600];
    mk(dir, sizeof dir, "tok");
    enum { N = 4, L = 5 };
    int32_t t[N * L] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4};
    int32_t lab[N] = {2, 0, 1, 2};
    const int64_t xs[2] = {N, L}, ys[1] = {N};
    bk_npy_write(in_dir(dir, "x.npy"), BK_I32, 2, xs, t);
    bk_npy_write(in_dir(dir, "y.npy"), BK_I32, 1, ys, lab);
    bk_data_config o = whole();
    bk_dataset *ds;
    bk_status st = open_spec("npy", dir, &o, &ds);
    CHECK(st == BK_OK, "arrays: int32 [N, L] tokens open", "%s", bk_last_error());
    if (st == BK_OK) {
        const bk_dataset_info *in = bk_data_info(ds);
        int32_t tok[N * L], len[N], y[N];
        int64_t idx[N] = {3, 2, 1, 0};
        st = bk_data_fill(ds, idx, N, NULL, tok, len, y);
        int ok = st == BK_OK && in->kind == BK_INPUT_TOKENS && in->vocab == 10 && in->max_len == L && in->classes == 3;
        for (int b = 0; b < N && ok; b++)
            ok &= len[b] == L && y[b] == lab[idx[b]] && !memcmp(tok + b * L, t + idx[b] * L, sizeof(int32_t) * L);
        CHECK(ok, "arrays: tokens without lengths: every row full, vocab = max id + 1", "vocab %d", in->vocab);
        bk_data_close(ds);
    }
    /* int64 ids with int64 lengths: ids past a row's length are not read
     * (even negative ones) and come out 0 */
    int64_t t8[N * L], len8[N] = {5, 2, 1, 3};
    for (int i = 0; i < N * L; i++) t8[i] = (i % L) < len8[i / L] ? 100 + i : -7;
    put_npy(in_dir(dir, "x.npy"), "<i8", 2, xs, t8, 8);
    put_npy(in_dir(dir, "lengths.npy"), "<i8", 1, ys, len8, 8);
    st = open_spec("npy", dir, &o, &ds);
    CHECK(st == BK_OK, "arrays: int64 tokens with lengths open (garbage past the lengths ignored)", "%s",
          bk_last_error());
    if (st == BK_OK) {
        const bk_dataset_info *in = bk_data_info(ds);
        int32_t tok[N * L], len[N];
        int64_t idx[N] = {0, 1, 2, 3};
        st = bk_data_fill(ds, idx, N, NULL, tok, len, NULL);
        int ok = st == BK_OK && in->vocab == 100 + 3 * L + 2 + 1;
        for (int b = 0; b < N && ok; b++) {
            ok &= len[b] == len8[b];
            for (int j = 0; j < L; j++) ok &= tok[b * L + j] == (j < len8[b] ? (int32_t)t8[b * L + j] : 0);
        }
        CHECK(ok, "arrays: tokens with lengths: ids, zeros after the length, len, vocab", "vocab %d", in->vocab);
        bk_data_close(ds);
    }
    /* array_kind=image refuses ids; a length of 0 or past L is refused */
    o.array_kind = 1;
    st = open_spec("npy", dir, &o, &ds);
    CHECK(st == BK_ERR_FORMAT && has(bk_last_error(), "x.npy: int64 [4, 5] is not an image array"),
          "arrays: array_kind=image refuses token ids", "%s", bk_last_error());
    o.array_kind = 0;
    const int64_t bad_len[2] = {0, 6};
    for (int k = 0; k < 2; k++) {
        int64_t l2[N] = {5, 2, 1, 3};
        l2[2] = bad_len[k];
        put_npy(in_dir(dir, "lengths.npy"), "<i8", 1, ys, l2, 8);
        st = open_spec("npy", dir, &o, &ds);
        char want[64];
        snprintf(want, sizeof want, "length %lld of sample 2", (long long)bad_len[k]);
        CHECK(st == BK_ERR_FORMAT && has(bk_last_error(), want) && has(bk_last_error(), "lengths.npy") &&
                  has(bk_last_error(), "[1, 5]"),
              k ? "arrays: a length past L refused (file, sample)" : "arrays: a length of 0 refused (file, sample)",
              "%s", bk_last_error());
    }
    remove(in_dir(dir, "lengths.npy"));
    /* ids: negative within the length, or past int32 */
    const int64_t bad_id[2] = {-1, (int64_t)1 << 33};
    for (int k = 0; k < 2; k++) {
        int64_t t2[N * L];
        for (int i = 0; i < N * L; i++) t2[i] = i;
        t2[2 * L + 3] = bad_id[k];
        put_npy(in_dir(dir, "x.npy"), "<i8", 2, xs, t2, 8);
        st = open_spec("npy", dir, &o, &ds);
        CHECK(st == BK_ERR_FORMAT && has(bk_last_error(), "of sample 2 at position 3") &&
                  has(bk_last_error(), "x.npy") && has(bk_last_error(), "byte "),
              k ? "arrays: an int64 id past 2^24 refused (sample, position, byte)"
                : "arrays: a negative id refused (sample, position, byte)",
              "%s", bk_last_error());
    }
    rm_dir(dir);
}

/* ---- point sets ---- */
static void test_points(void)
{
    char dir[600];
    mk(dir, sizeof dir, "pts");
    enum { N = 3, P = 4, D = 2 };
    float v[N * P * D];
    int32_t len[N] = {4, 1, 3}, lab[N] = {0, 1, 0};
    for (int i = 0; i < N * P * D; i++) v[i] = (i / D) % P < len[i / (P * D)] ? (float)i * 0.125f - 1.0f : NAN;
    const int64_t xs[3] = {N, P, D}, ys[1] = {N};
    bk_npy_write(in_dir(dir, "x.npy"), BK_F32, 3, xs, v);
    bk_npy_write(in_dir(dir, "y.npy"), BK_I32, 1, ys, lab);
    bk_npy_write(in_dir(dir, "lengths.npy"), BK_I32, 1, ys, len);
    bk_data_config o = whole();
    bk_dataset *ds;
    bk_status st = open_spec("npy", dir, &o, &ds);
    CHECK(st == BK_OK, "arrays: float32 [N, P, D] with lengths opens as sets (NaN padding not read)", "%s",
          bk_last_error());
    if (st == BK_OK) {
        const bk_dataset_info *in = bk_data_info(ds);
        float x[N * P * D];
        int32_t l[N], y[N];
        int64_t idx[N] = {0, 1, 2};
        st = bk_data_fill(ds, idx, N, x, NULL, l, y);
        int ok = st == BK_OK && in->kind == BK_INPUT_POINTS && in->points == P && in->point_dim == D;
        for (int b = 0; b < N && ok; b++) {
            ok &= l[b] == len[b] && y[b] == lab[b];
            for (int j = 0; j < P * D; j++) ok &= x[b * P * D + j] == (j / D < len[b] ? v[b * P * D + j] : 0.0f);
        }
        CHECK(ok, "arrays: sets filled, zero past the length, len", "%s", bk_last_error());
        bk_data_batch bb;
        bk_batch batch;
        ok = bk_data_batch_init(&bb, ds, N) == BK_OK;
        for (int b = 0; ok && b < N; b++) bb.idx[b] = b;
        ok = ok && bk_data_batch_fill(&bb, ds, N, &batch) == BK_OK && !memcmp(batch.x, x, sizeof x);
        CHECK(ok, "arrays: batch buffers hold [points, point_dim] (D = 2)", "%s", bk_last_error());
        bk_data_batch_free(&bb);
        bk_model_config mc = bk_model_config_default();
        bk_data_model_shape(ds, &mc);
        CHECK(mc.input == BK_INPUT_POINTS && mc.point_dim == D && mc.max_points == P, "arrays: the model shape of sets",
              "%d %d", mc.point_dim, mc.max_points);
        bk_data_close(ds);
    }
    /* without lengths: float32 rank 3 is an image unless array_kind=points;
     * then the NaN in the padding is seen */
    remove(in_dir(dir, "lengths.npy"));
    st = open_spec("npy", dir, &o, &ds);
    CHECK(st == BK_ERR_FORMAT && has(bk_last_error(), "x.npy: sample 1 holds NaN at element 2"),
          "arrays: NaN in a float input refused (file, sample, element)", "%s", bk_last_error());
    for (int i = 0; i < N * P * D; i++) v[i] = (float)i;
    bk_npy_write(in_dir(dir, "x.npy"), BK_F32, 3, xs, v);
    o.array_kind = 3;
    st = open_spec("npy", dir, &o, &ds);
    CHECK(st == BK_OK && bk_data_info(ds)->kind == BK_INPUT_POINTS && bk_data_info(ds)->points == P,
          "arrays: array_kind=points without lengths: every set full", "%s", bk_last_error());
    bk_data_close(ds);
    o.array_kind = 0;
    st = open_spec("npy", dir, &o, &ds);
    CHECK(st == BK_OK && bk_data_info(ds)->kind == BK_INPUT_IMAGE, "arrays: float32 rank 3 without lengths is an image",
          "%s", bk_last_error());
    bk_data_close(ds);
    v[2 * P * D + 5] = INFINITY;
    bk_npy_write(in_dir(dir, "x.npy"), BK_F32, 3, xs, v);
    st = open_spec("npy", dir, &o, &ds);
    CHECK(st == BK_ERR_FORMAT && has(bk_last_error(), "sample 2 holds Inf at element 5"), "arrays: Inf refused", "%s",
          bk_last_error());
    rm_dir(dir);
}

/* ---- refusals of bad files ---- */
static void test_hostile(void)
{
    char dir[600];
    mk(dir, sizeof dir, "bad");
    enum { N = 4 };
    uint8_t px[N * 9];
    for (int i = 0; i < N * 9; i++) px[i] = (uint8_t)i;
    int32_t lab[N] = {0, 1, 2, 3};
    const int64_t xs[3] = {N, 3, 3}, ys[1] = {N};
    bytes good = npy_bytes("|u1", 3, xs, px, 1, "False");
    bk_data_config o = whole();
    bk_dataset *ds = NULL;
    struct {
        const char *what;
        int kind; /* 0 x bytes, 1 y array */
        bk_status want;
        const char *msg;
    } cases[] = {
        {"an empty x file", 0, BK_ERR_FORMAT, "x.npy: empty file"},
        {"a truncated x", 0, BK_ERR_FORMAT, "x.npy: truncated data"},
        {"trailing bytes after x", 0, BK_ERR_FORMAT, "x.npy: 3 trailing bytes"},
        {"a truncated header", 0, BK_ERR_FORMAT, "x.npy: truncated header"},
        {"float64 x", 0, BK_ERR_FORMAT, "x.npy: dtype '<f8' not supported"},
        {"big-endian x", 0, BK_ERR_FORMAT, "x.npy: dtype '>f4' not supported"},
        {"Fortran order", 0, BK_ERR_FORMAT, "x.npy: Fortran-order"},
        {"rank 2 float x", 0, BK_ERR_FORMAT, "is not an image array"},
        {"N = 0", 0, BK_ERR_FORMAT, "x.npy: no samples"},
        {"a negative label", 1, BK_ERR_FORMAT, "y.npy: label -3 of sample 2 (byte"},
        {"a label at 2^20", 1, BK_ERR_FORMAT, "y.npy: label 1048576 of sample 2"},
        {"float labels", 1, BK_ERR_FORMAT, "y.npy: the labels are float32"},
        {"2-d labels", 1, BK_ERR_FORMAT, "(flatten it: a.ravel())"},
        {"mismatched N", 1, BK_ERR_SHAPE, "y.npy has 3 labels but"},
        {"a missing y", 1, BK_ERR_IO, "y.npy: cannot open"},
        {"lengths with images", 1, BK_ERR_FORMAT, "lengths are given but x is an image array"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        bk_npy_write(in_dir(dir, "y.npy"), BK_I32, 1, ys, lab);
        remove(in_dir(dir, "lengths.npy"));
        put(in_dir(dir, "x.npy"), good.b, good.n);
        bytes b = {NULL, 0};
        float f4[N * 3] = {0};
        int32_t l2[N] = {0, 1, -3, 1};
        switch (k) {
        case 0: put(in_dir(dir, "x.npy"), "", 0); break;
        case 1: put(in_dir(dir, "x.npy"), good.b, good.n - 5); break;
        case 2: {
            uint8_t *t = malloc(good.n + 3);
            memcpy(t, good.b, good.n);
            memset(t + good.n, 0, 3);
            put(in_dir(dir, "x.npy"), t, good.n + 3);
            free(t);
            break;
        }
        case 3: put(in_dir(dir, "x.npy"), good.b, 30); break;
        case 4: b = npy_bytes("<f8", 3, xs, px, 1, "False"); break; /* (data size irrelevant: refused first) */
        case 5: b = npy_bytes(">f4", 3, xs, px, 1, "False"); break;
        case 6: b = npy_bytes("|u1", 3, xs, px, 1, "True"); break;
        case 7: {
            const int64_t s2[2] = {N, 3};
            b = npy_bytes("<f4", 2, s2, f4, 4, "False");
            break;
        }
        case 8: {
            const int64_t s0[3] = {0, 3, 3};
            b = npy_bytes("|u1", 3, s0, px, 1, "False");
            break;
        }
        case 9: bk_npy_write(in_dir(dir, "y.npy"), BK_I32, 1, ys, l2); break;
        case 10: l2[2] = 1 << 20, bk_npy_write(in_dir(dir, "y.npy"), BK_I32, 1, ys, l2); break;
        case 11: bk_npy_write(in_dir(dir, "y.npy"), BK_F32, 1, ys, f4); break;
        case 12: {
            const int64_t s2[2] = {N, 1};
            bk_npy_write(in_dir(dir, "y.npy"), BK_I32, 2, s2, lab);
            break;
        }
        case 13: {
            const int64_t s3[1] = {3};
            bk_npy_write(in_dir(dir, "y.npy"), BK_I32, 1, s3, lab);
            break;
        }
        case 14: remove(in_dir(dir, "y.npy")); break;
        case 15: l2[2] = 1, bk_npy_write(in_dir(dir, "lengths.npy"), BK_I32, 1, ys, lab); break;
        }
        if (b.b) put(in_dir(dir, "x.npy"), b.b, b.n);
        free(b.b);
        bk_status st = open_spec("npy", dir, &o, &ds);
        char name[96];
        snprintf(name, sizeof name, "arrays: refuses %s (names the file)", cases[k].what);
        CHECK(st == cases[k].want && !ds && has(bk_last_error(), cases[k].msg) && has(bk_last_error(), dir), name,
              "%s: %s", bk_status_str(st), bk_last_error());
        bk_data_close(ds);
    }
    free(good.b);
    char nodir[700];
    snprintf(nodir, sizeof nodir, "%s/none", dir);
    bk_status st = open_spec("npy", nodir, &o, &ds);
    CHECK(st == BK_ERR_IO && has(bk_last_error(), nodir), "arrays: a missing path refused (BK_ERR_IO)", "%s",
          bk_last_error());
    st = open_spec("npy", "a.npy", &o, &ds);
    CHECK(st == BK_ERR_IO, "arrays: one missing file refused", "%s", bk_last_error());
    rm_dir(dir);
}

/* ---- .npz ---- */
static void test_npz(void)
{
    enum { N = 5, H = 2, W = 3 };
    uint8_t px[N * H * W];
    int64_t lab[N] = {1, 1, 0, 3, 2};
    for (int i = 0; i < N * H * W; i++) px[i] = (uint8_t)(250 - 7 * i);
    const int64_t xs[3] = {N, H, W}, ys[1] = {N};
    member m[3] = {{"y.npy", npy_bytes("<i8", 1, ys, lab, 8, "False"), 0},
                   {"x.npy", npy_bytes("|u1", 3, xs, px, 1, "False"), 0},
                   {"notes.npy", npy_bytes("<f4", 1, ys, lab, 4, "False"), 1}};
    char path[600];
    snprintf(path, sizeof path, "%s/set.npz", g_tmp);
    bk_data_config o = whole();
    for (int deflate = 0; deflate < 2; deflate++) {
        m[0].deflate = m[1].deflate = deflate;
        bytes z = zip_bytes(m, 3);
        put(path, z.b, z.n);
        bk_dataset *ds;
        bk_status st = open_spec("npz", path, &o, &ds);
        const char *how = deflate ? "deflated" : "stored";
        char name[96];
        snprintf(name, sizeof name, "npz: %s members open", how);
        CHECK(st == BK_OK, name, "%s", bk_last_error());
        if (st == BK_OK) {
            const bk_dataset_info *in = bk_data_info(ds);
            float x[N * H * W];
            int32_t y[N];
            int64_t idx[N] = {4, 3, 2, 1, 0};
            st = bk_data_fill(ds, idx, N, x, NULL, NULL, y);
            int ok = st == BK_OK && in->n == N && in->height == H && in->width == W && in->classes == 4 &&
                     has(in->version, "npz:x uint8[5, 2, 3] y int64");
            for (int b = 0; b < N && ok; b++) {
                ok &= y[b] == lab[idx[b]];
                for (int j = 0; j < H * W; j++) ok &= x[b * H * W + j] == (float)px[idx[b] * H * W + j] * (1.0f / 255.0f);
            }
            snprintf(name, sizeof name, "npz: %s members: values and labels", how);
            CHECK(ok, name, "%s", in->version);
            snprintf(name, sizeof name, deflate ? "npz: a deflated x is inflated (the archive is not kept mapped)"
                                                : "npz: a stored x is read in place (the archive stays mapped)");
            CHECK(mapped(path) == !deflate, name, "%s", "-");
            bk_data_close(ds);
            CHECK(mapped(path) == 0, "npz: unmapped at close", "%s", "-");
        }
        /* damage: a cut archive, x's member bytes */
        struct {
            const char *what, *msg;
        } bad[] = {{"a cut archive", "no end of central directory"},
                   {"a corrupt member", deflate ? "x.npy" : "x.npy' (byte 238): CRC-32 mismatch"}};
        size_t at = 0; /* x's member data */
        for (size_t i = 0; i + 35 < z.n; i++)
            if (!memcmp(z.b + i, "PK\x03\x04", 4) && !memcmp(z.b + i + 30, "x.npy", 5)) at = i + 35;
        for (int k = 0; k < 2; k++) {
            bytes d = {malloc(z.n), z.n};
            memcpy(d.b, z.b, z.n);
            if (k == 0) d.n = z.n - 30;
            else if (deflate)
                for (size_t i = at; i < at + 12; i++) d.b[i] ^= 0x5a;
            else
                d.b[at + 70] ^= 1; /* a pixel */
            put(path, d.b, d.n);
            free(d.b);
            st = open_spec("npz", path, &o, &ds);
            snprintf(name, sizeof name, "npz (%s): refuses %s", how, bad[k].what);
            CHECK(st == BK_ERR_FORMAT && !ds && has(bk_last_error(), path) && has(bk_last_error(), bad[k].msg), name,
                  "%s: %s", bk_status_str(st), bk_last_error());
        }
        free(z.b);
    }
    /* np.savez(f, a, b): members arr_0, arr_1 */
    member pos[2] = {{"arr_0.npy", m[1].data, 0}, {"arr_1.npy", m[0].data, 0}};
    bytes z = zip_bytes(pos, 2);
    put(path, z.b, z.n);
    free(z.b);
    bk_dataset *ds;
    bk_status st = open_spec("npz", path, &o, &ds);
    CHECK(st == BK_ERR_FORMAT && has(bk_last_error(), "no member 'x.npy' (members: arr_0.npy, arr_1.npy)") &&
              has(bk_last_error(), "np.savez(FILE, x=X, y=Y"),
          "npz: positional members refused, the message says how to save", "%s", bk_last_error());
    put(path, "PK\x05\x06", 4);
    st = open_spec("npz", path, &o, &ds);
    CHECK(st == BK_ERR_FORMAT && has(bk_last_error(), "too short for a zip archive"), "npz: a 4-byte file refused", "%s",
          bk_last_error());
    remove(path);
    for (int i = 0; i < 3; i++) free(m[i].data.b);
}

/* ---- the window order ---- */
static void test_window_order(void)
{
    enum { N = 103 };
    int64_t a[N], b[N], c[N];
    int ok = 1;
    for (int e = 0; e < 3; e++) {
        bk_data_epoch_order(a, N, 9, e);
        bk_data_window_order(b, N, 9, e, 0);
        bk_data_window_order(c, N, 9, e, N);
        ok &= !memcmp(a, b, sizeof a) && !memcmp(a, c, sizeof a);
    }
    CHECK(ok, "window order: window 0 or >= n is bk_data_epoch_order bitwise", "%s", "-");
    const int64_t W = 10;
    CHECK(bk_data_window_order(b, N, 9, 1, W) == BK_OK, "window order: status", "%s", bk_last_error());
    int perm = 1, local = 1;
    int8_t seen[N] = {0};
    for (int i = 0; i < N; i++) {
        perm &= b[i] >= 0 && b[i] < N && !seen[b[i]];
        if (b[i] >= 0 && b[i] < N) seen[b[i]] = 1;
    }
    /* consecutive entries come window by window: each window's samples
     * together, [kW, (k+1)W), the short last one included */
    for (int at = 0; at < N && local;) {
        const int64_t k = b[at] / W, m = (k + 1) * W > N ? N - k * W : W;
        for (int64_t j = 0; j < m; j++) local &= at + j < N && b[at + j] / W == k;
        at += (int)m;
    }
    CHECK(perm && local, "window order: a permutation, read window by window", "%s", "-");
    bk_data_window_order(c, N, 9, 1, W);
    int same = !memcmp(b, c, sizeof b);
    bk_data_window_order(c, N, 9, 2, W);
    int differs = memcmp(b, c, sizeof b) != 0;
    int inside = 0; /* samples shuffled inside a window, windows shuffled */
    for (int i = 1; i < N; i++) inside += b[i] != b[i - 1] + 1;
    CHECK(same && differs && inside > N / 2,
          "window order: deterministic, per epoch, shuffled", "%d", inside);
    CHECK(bk_data_window_order(NULL, N, 9, 1, W) == BK_ERR_NULL && bk_data_window_order(b, -1, 9, 1, W) == BK_ERR_SHAPE,
          "window order: NULL and n < 0 refused", "%s", "-");
}

int main(void)
{
    TH.verbose = 1;
    if (!th_tmpdir(g_tmp, sizeof g_tmp, "test-arrays")) return 1;
    test_images_u8_hwc();
    test_images_f32();
    test_tokens();
    test_points();
    test_hostile();
    test_npz();
    test_window_order();
    rmdir(g_tmp);
    return th_summary();
}
