/* quickstart.c -- Sinkhorn attention forward and backward on a small batch.
 * Build: cc quickstart.c $(pkg-config --cflags --libs birkhoff) -o quickstart
 * (inside the source tree `make check` builds and runs it). */
#include <birkhoff.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    enum { B = 2, H = 4, N = 32, D = 16 };
    size_t n = (size_t)B * H * N * D;
    float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *o = malloc(n * 4);
    float *dout = malloc(n * 4), *dq = malloc(n * 4), *dk = malloc(n * 4), *dv = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        q[i] = (float)((i * 7919) % 17) / 17.0f - 0.5f;
        k[i] = (float)((i * 104729) % 13) / 13.0f - 0.5f;
        v[i] = (float)(i % 11) / 11.0f;
        dout[i] = (float)(i % 5) / 5.0f - 0.4f;
    }
    int32_t q_len[B] = {N, 20}, k_len[B] = {N, 20};          /* batch 1 is padded */
    bk_attn_desc desc = {B, H, N, N, D, D, q_len, k_len};
    bk_tensor tq = bk_tensor_bhnd(q, H, N, D), tk = bk_tensor_bhnd(k, H, N, D);
    bk_tensor tv = bk_tensor_bhnd(v, H, N, D), to = bk_tensor_bhnd(o, H, N, D);
    bk_sinkhorn_config p = bk_sinkhorn_config_default();      /* S=5, eps=1, scale=1/sqrt(d) */
    bk_sinkhorn_diag diag[B * H];
    bk_sinkhorn_extras ex = {{0}, NULL, NULL, diag};
    void *tape = malloc(bk_sinkhorn_tape_size(&desc, &p));   /* what the backward needs */

    bk_status s = bk_sinkhorn_forward(&desc, &p, &tq, &tk, &tv, &to, tape, &ex, NULL, 0);
    if (s != BK_OK) {
        fprintf(stderr, "forward: %s: %s\n", bk_status_str(s), bk_last_error());
        return 1;
    }
    bk_tensor tdo = bk_tensor_bhnd(dout, H, N, D), tdq = bk_tensor_bhnd(dq, H, N, D);
    bk_tensor tdk = bk_tensor_bhnd(dk, H, N, D), tdv = bk_tensor_bhnd(dv, H, N, D);
    s = bk_sinkhorn_backward(&desc, &p, &tq, &tk, &tv, &tdo, tape, &tdq, &tdk, &tdv, NULL, 0);
    if (s != BK_OK) {
        fprintf(stderr, "backward: %s: %s\n", bk_status_str(s), bk_last_error());
        return 1;
    }
    printf("problem 0: %d half-steps, |row sum - 1| <= %.1e, |col sum - 1| <= %.1e\n", diag[0].iters,
           (double)diag[0].row_err, (double)diag[0].col_err);
    printf("O[0,0,0,0] = %.6f, dQ[0,0,0,0] = %.6f\n", (double)o[0], (double)dq[0]);
    free(q); free(k); free(v); free(o); free(dout); free(dq); free(dk); free(dv); free(tape);
    return 0;
}
