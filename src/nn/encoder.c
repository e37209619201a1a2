/* encoder.c -- the encoder stack: the classifier's blocks and the
 * encoder-decoder's encoder (encoder blocks, or ISAB blocks). */
#include "model_impl.h"
#include "../ops/op.h"
#include "../core/vexp.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the blocks from m->x0 [B*T, D], then the final norm (or a copy) into
 * m->fin: the classifier's trunk, the encoder's memory */
bk_status bki_encoder_fwd(bk_model *m, int B, int train)
{
    const bk_model_config *c = &m->c;
    const int R = B * m->T, D = c->dim;
    const float *x = m->x0;
    for (int l = 0; l < c->depth; l++) {
        bk_status st = bki_is_isab(c) ? bki_isab_fwd(m, l, B, x, train) : bki_enc_block_fwd(m, l, B, x, train);
        if (st) return st;
        x = m->ba[l].out;
    }
    if (c->final_norm)
        bki_layernorm_fwd(R, D, x, m->w + m->nrm_w, m->w + m->nrm_b, c->ln_eps, m->fin, m->fmu, m->frs);
    else
        memcpy(m->fin, x, sizeof(float) * (size_t)R * D);
    return BK_OK;
}
