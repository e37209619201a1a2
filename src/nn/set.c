/* set.c -- the Set Transformer's blocks (docs/MODEL.md "Set Transformer
 * blocks"): MAB(X, Y) on the cross-attention sublayer, ISAB (two MABs
 * through set_inducing inducing points) and the PMA pooling, forward and
 * backward. */
#include "model_impl.h"
#include "../ops/op.h"
#include "../core/vexp.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Set Transformer blocks (Lee et al. 2019; docs/MODEL.md) ------------
 * MAB unit u: MAB(X, Y) = Z + drop(MLP(LN2(Z))), Z = the cross-attention
 * sublayer of X over LNk(Y). X: the stream, or (qset) the unit's learned
 * queries broadcast over the batch; dropout sites 1 + 2u and 2 + 2u (the
 * encoder blocks' numbering: an ISAB's mab1 takes its block's). */
static int mab_site(int u) { return 1 + 2 * u; }

/* x [B*Nq, D] (NULL: the unit's learned queries), y [B*Nk, D] -> ba[u].out */
static bk_status mab_fwd(bk_model *m, int u, int B, const float *x, const float *y, int train)
{
    blk_act *a = &m->ba[u];
    const blk_off *o = &m->bo[u];
    const bk_model_config *c = &m->c;
    const bki_cross_shape cs = bki_mab_shape(m, u);
    const int D = c->dim, Rq = B * cs.Nq, Rk = B * cs.Nk;
    if (!x) {
        for (int b = 0; b < B; b++)
            memcpy(a->xq + (size_t)b * cs.Nq * D, m->w + o->qset, sizeof(float) * (size_t)cs.Nq * D);
        x = a->xq;
    }
    bki_layernorm_fwd(Rk, D, y, m->w + o->lnk_w, m->w + o->lnk_b, c->ln_eps, a->lnk, a->muk, a->rsk);
    bk_status st = bki_cross_fwd(m, u, B, &cs, x, a->lnk, a->cmid, train, mab_site(u));
    if (st) return st;
    if (c->mlp_dim > 0) bki_mlp_fwd(m, u, Rq, a->cmid, a->out, train ? c->dropout : 0.0f, mab_site(u) + 1);
    return BK_OK;
}

/* dX = d(ba[u].out) -> d(x) (the learned queries' gradient is accumulated
 * into the parameters); ADDS d(y) into dy. Scratch: dMem. */
static bk_status mab_bwd(bk_model *m, int u, int B, const float *x, const float *y, float *dy)
{
    blk_act *a = &m->ba[u];
    const blk_off *o = &m->bo[u];
    const bk_model_config *c = &m->c;
    const bki_cross_shape cs = bki_mab_shape(m, u);
    const int D = c->dim, Rq = B * cs.Nq, Rk = B * cs.Nk;
    if (!x) x = a->xq;
    if (c->mlp_dim > 0) bki_mlp_bwd(m, u, Rq, a->cmid, mab_site(u) + 1);
    memset(m->dMem, 0, sizeof(float) * (size_t)Rk * D);
    bk_status st = bki_cross_bwd(m, u, B, &cs, x, a->lnk, m->dMem, mab_site(u));
    if (st) return st;
    bki_layernorm_bwd(Rk, D, y, a->muk, a->rsk, m->w + o->lnk_w, m->dMem, dy, m->gw + o->lnk_w, m->gw + o->lnk_b);
    if (o->qset >= 0) bki_colsum_add(m->dX, B, cs.Nq * D, cs.Nq * D, m->gw + o->qset);
    return BK_OK;
}

/* ISAB block l: H = MAB(I, X) (unit depth + l), out = MAB(X, H) (unit l) */
bk_status bki_isab_fwd(bk_model *m, int l, int B, const float *x, int train)
{
    const int u0 = m->c.depth + l;
    bk_status st = mab_fwd(m, u0, B, NULL, x, train);
    return st ? st : mab_fwd(m, l, B, x, m->ba[u0].out, train);
}

/* dX = d(block output) -> d(block input) */
bk_status bki_isab_bwd(bk_model *m, int l, int B, const float *xin)
{
    const int u0 = m->c.depth + l, D = m->c.dim;
    const size_t nx = (size_t)B * m->T * D, nh = (size_t)B * m->c.set_inducing * D;
    memset(m->dY, 0, sizeof(float) * nh);
    bk_status st = mab_bwd(m, l, B, xin, m->ba[u0].out, m->dY); /* dX: d(X) as mab1's queries */
    if (st) return st;
    memcpy(m->dXs, m->dX, sizeof(float) * nx);
    memcpy(m->dX, m->dY, sizeof(float) * nh); /* d(H) */
    if ((st = mab_bwd(m, u0, B, NULL, xin, m->dXs))) return st; /* + d(X) as mab0's keys and values */
    memcpy(m->dX, m->dXs, sizeof(float) * nx);
    return BK_OK;
}

/* pool = pma: pooled [B, k D] = MAB(S, rFF(fin)) (unit bki_pma_unit) */
bk_status bki_pma_fwd(bk_model *m, int B, int train)
{
    const bk_model_config *c = &m->c;
    const int u = bki_pma_unit(c), D = c->dim, M = c->mlp_dim, R = B * m->T;
    blk_act *a = &m->ba[u];
    const blk_off *o = &m->bo[u];
    const float *z = m->fin;
    if (M > 0) {
        bki_linear_fwd(R, D, M, m->fin, D, m->w + o->rf1_w, m->w + o->rf1_b, a->rf1, M);
        bki_gelu_fwd((size_t)R * M, a->rf1, a->rg1);
        bki_linear_fwd(R, M, D, a->rg1, M, m->w + o->rf2_w, m->w + o->rf2_b, a->rfo, D);
        z = a->rfo;
    }
    bk_status st = mab_fwd(m, u, B, NULL, z, train);
    if (st) return st;
    memcpy(m->pooled, a->out, sizeof(float) * (size_t)B * c->pma_seeds * D);
    return BK_OK;
}

/* d(pooled) = dpool -> dN = d(fin) */
bk_status bki_pma_bwd(bk_model *m, int B)
{
    const bk_model_config *c = &m->c;
    const int u = bki_pma_unit(c), D = c->dim, M = c->mlp_dim, R = B * m->T;
    blk_act *a = &m->ba[u];
    const blk_off *o = &m->bo[u];
    memcpy(m->dX, m->dpool, sizeof(float) * (size_t)B * c->pma_seeds * D);
    memset(m->dY, 0, sizeof(float) * (size_t)R * D);
    bk_status st = mab_bwd(m, u, B, NULL, M > 0 ? a->rfo : m->fin, m->dY);
    if (st) return st;
    if (M > 0) {
        bki_linear_bwd(R, M, D, a->rg1, M, m->w + o->rf2_w, m->dY, D, m->dM, 0.0f, m->gw + o->rf2_w,
                       m->gw + o->rf2_b, bki_kb(m, D, M));
        bki_gelu_bwd((size_t)R * M, a->rf1, m->dM, m->dM);
        bki_linear_bwd(R, D, M, m->fin, D, m->w + o->rf1_w, m->dM, M, m->dN, 0.0f, m->gw + o->rf1_w,
                       m->gw + o->rf1_b, bki_kb(m, M, D));
    } else {
        memcpy(m->dN, m->dY, sizeof(float) * (size_t)R * D);
    }
    return BK_OK;
}
