/* model_impl.h -- the model's layout, shared by the files of the training
 * engine that run it: model.c (configuration, parameters, forward and
 * backward of the classifier and of the encoder-decoder) and
 * seq2seq_step.c (the encoder-decoder's incremental decoding). */
#ifndef BK_MODEL_IMPL_H
#define BK_MODEL_IMPL_H

#include "layers.h"

#define MAXP 512

/* parameter offsets of one block (-1 when absent). Encoder (and classifier)
 * blocks use ln1, qkv, the attention kind's own tensors, proj, ln2 and the
 * MLP; decoder blocks add the cross-attention: lnc, cq (queries from the
 * decoder stream), ckv (keys and values from the encoder's output), cproj.
 * A MAB unit (Set Transformer: half of an ISAB block, or the PMA) has the
 * cross-attention and the MLP, lnk (the norm of its keys' set), qset (its
 * queries when they are learned: inducing points, seeds) and, for the PMA,
 * the rFF before it (rf1, rf2). */
typedef struct {
    int64_t ln1_w, ln1_b, qkv_w, qkv_b, lot_z, lot_t, dl_q1, dl_k1, dl_q2, dl_k2, dwc_w, dwc_b, proj_w, proj_b,
        ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
    int64_t lnc_w, lnc_b, cq_w, cq_b, ckv_w, ckv_b, cproj_w, cproj_b;
    int64_t lnk_w, lnk_b, qset, rf1_w, rf1_b, rf2_w, rf2_b;
} blk_off;

/* A block's activations. Pre-LN: ln1/lnc/ln2 hold the normalised inputs of
 * the sublayers; post-LN: they hold the residual sums the norms take (the
 * sublayers read the stream itself). */
typedef struct {
    float *mid, *out;                 /* residual stream after attention / block */
    float *ln1, *mu1, *rs1, *qkv, *att;
    float *ln2, *mu2, *rs2, *f1, *g1; /* MLP: f1 = gelu' at fc1's output, g1 = gelu of it */
    void *tape;
    size_t tape_cap;
    float *esp_theta;
    bk_asap_layer *asap;
    float *draw, *drs, *lam;          /* diff: the operator's output [R, I], its
                                         per-head inverse RMS [R, H], lambda [H] */
    float *clsa;                      /* cls_attn != full: the [CLS] row's
                                         weights [B, H, T] (vit.c)           */
    /* decoder blocks: the stream after the cross-attention, its norm, the
     * queries [Rd, I], keys and values [Re, 2I], output [Rd, I] and tape */
    float *cmid, *lnc, *muc, *rsc, *cq, *ckv, *catt, *cesp_theta;
    void *ctape;
    size_t ctape_cap;
    /* MAB units: LNk of the keys' set [Rk, D] with its statistics, the
     * learned queries broadcast over the batch [Rq, D]; the PMA's rFF
     * (pre-activation, GELU [Rk, M], output [Rk, D]) */
    float *lnk, *muk, *rsk, *xq, *rf1, *rg1, *rfo;
} blk_act;

struct bk_model {
    bk_model_config c;
    uint64_t seed, fwd_count, cur_count;
    int max_batch, np, in_feat, T, I, dh, F;
    int nparam;
    bki_param tab[MAXP];
    int64_t P;
    float *w, *gw;
    /* parameter offsets (-1 when absent) */
    int64_t e_w, e_b, e_w2, e_b2, cls_o, pos_o, nrm_w, nrm_b, otk_w, otk_z, head_w, head_b;
    int otk_k;     /* the OTK pool's feature dimension: otk_anchors, or D     */
    blk_off *bo;   /* seq2seq: [0, depth) encoder, [depth, depth + dec_depth) decoder;
                      classifier: [0, depth) the blocks (set_block = isab: each
                      ISAB's second MAB, mab1), [depth, 2 depth) the ISABs'
                      first MABs (mab0), then the PMA unit (pool = pma) */
    /* activations */
    float *emb_in, *emb_h, *emb_g, *emb_o;  /* [B*np, in_feat], points hidden, gelu, embed out */
    float *x0;                               /* [R, D] stream entering block 0   */
    blk_act *ba;
    float *fin, *fmu, *frs;                  /* final norm                        */
    float *pooled, *logits, *probs;
    int32_t *argmax, *nb, *labels, *tokens;
    int32_t *nb1;                            /* cls_attn != full: nb - 1, the
                                                tokens after [CLS]             */
    void *otk_tape;
    size_t otk_tape_cap;
    /* backward scratch */
    float *dX, *dT, *dA, *dq, *dk, *dv, *dM, *dN, *dpool, *dlog, *dZtmp, *dthtmp, *dO, *dlam;
    float *dWtmp;                            /* OTK anchors' gradient [K, D]    */
    float *kbuf;                             /* a weight gradient's second half
                                                of the rows (bki_linear_bwd),
                                                kbuf_n floats                  */
    size_t kbuf_n;
    float *dcls;                             /* the [CLS] row's backward scratch
                                                [2, B, H, T] (cls_attn != full) */
    double *ddwc;                            /* the DWC's: [k*k + 1, dh] (dwc)  */
    void *ws;
    size_t ws_cap;
    int B, have_tape;
    float ls;
    int64_t ntok, ncorrect;                  /* bk_model_token_stats            */
    /* ---- seq2seq (arch = seq2seq): T is the source length of the current
     * batch (the longest valid one; max_len at most), Td the target's;
     * encoder rows B*T, decoder rows B*Td, each [B, len, D] ---- */
    int Tmax, Td;
    int64_t dpos_o, dnrm_w, dnrm_b;           /* dec.pos, dec.norm             */
    float *sin_tab;                           /* sinusoidal positions [max(max_len,
                                                 tgt_max_len), D]               */
    int32_t *nbt, *dtok, *tgt;                /* target lengths [B], decoder input
                                                 and targets [B, Td]            */
    float *dx0, *dfin, *dfmu, *dfrs;          /* decoder stream in, final norm */
    float *plog;                              /* [Rd, vocab]: logits, then
                                                 probabilities, then their
                                                 gradient                       */
    double *rloss;                            /* [Rd, 2]: per-row loss and hit */
    float *dMem, *dS;                         /* backward: d(encoder output),
                                                 post-LN residual-sum gradient;
                                                 set units: dMem d(LNk(keys))  */
    float *dY, *dXs;                          /* set units' backward: d(keys'
                                                 set), the saved d(stream)     */
};

/* A residual sublayer (model.c): pre-LN out = x + drop(f(LN(x)) + b),
 * post-LN out = LN(x + drop(f(x) + b)). The norm's buffers (ln, mu, rs)
 * hold LN(x) (pre) or the residual sum (post). bki_sub_in gives f's input,
 * bki_sub_y the buffer f's last linear writes (pre: out, post: ln),
 * bki_sub_out adds the residual (dropout p at site) and normalises. Used by
 * every block of the training forward and by the decoding step. */
typedef struct {
    int64_t g, b;          /* the norm's parameters                          */
    float *ln, *mu, *rs;   /* its buffers                                    */
} sub_norm;
const float *bki_sub_in(bk_model *m, int R, const float *x, const sub_norm *n);
float *bki_sub_y(const bk_model *m, const sub_norm *n, float *out);
void bki_sub_out(bk_model *m, int R, const float *x, const sub_norm *n, int64_t bias, float p, int site, float *out);

#endif
