/* devbuf.h -- test buffers in a backend's memory: host floats uploaded in a
 * dtype (BK_F32, BK_BF16, BK_F16; rounding to nearest even) through the
 * backend's alloc/copy, downloaded back to floats, and tensor views on them.
 * Shared by the cross-backend harness (test_ops.c) and the CUDA tests
 * (test_cuda.c). */
#ifndef BK_TEST_DEVBUF_H
#define BK_TEST_DEVBUF_H
#include "birkhoff.h"

#include <stddef.h>

typedef struct {
    void *dev;
    size_t n;   /* elements */
    int dt;     /* bk_dtype */
} th_dbuf;

/* rounds host floats to the dtype's values (a CPU reference then sees what a
 * 16-bit device tensor holds) */
void th_round_to(int dt, float *x, size_t n);
/* n host floats into the current context's backend memory as dtype dt; 1 on
 * success */
int th_dev_up(bk_context *ctx, th_dbuf *b, const float *h, size_t n, int dt);
/* back to host floats; 1 on success */
int th_dev_down(bk_context *ctx, float *h, const th_dbuf *b);
void th_dev_free(bk_context *ctx, th_dbuf *b);
/* the view t on b's memory, marked with the current context's device and b's
 * dtype */
bk_tensor th_dev_view(const bk_tensor *t, const th_dbuf *b);
#endif
