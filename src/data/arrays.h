/* arrays.h -- the sample store of array datasets (src/data/arrays.c): the
 * inputs of the user's .npy / .npz arrays (memory-mapped, or an inflated
 * .npz member) and of the stored image sets (mnist, fashion-mnist, digits:
 * their bytes), filled into the model's layout by one function. Internal. */
#ifndef BK_DATA_ARRAYS_H
#define BK_DATA_ARRAYS_H

#include "../core/internal.h"

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

/* The whole file's samples of an arrays spec (the part after "npy:" or
 * "npz:"; birkhoff/data.h and docs/DATA.md say the forms): *in gets name
 * ("npy" or "npz"), kind, n (rows), classes and the kind's shape fields, and
 * version; *xs the inputs; *labels [n] and *lens [n] (NULL without a
 * lengths array) are malloc'd. array_kind: 0 auto, 1 image, 2 tokens, 3
 * points. On failure nothing is left allocated or mapped. */
bk_status bki_arrays_load(const char *spec, int array_kind, bk_dataset_info *in, bki_xstore *xs, int32_t **labels,
                          int32_t **lens);
/* A store over bytes [n, channels * height * width] (CHW), value = byte *
 * scale: the stored image sets. Owns nothing. */
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

#endif
