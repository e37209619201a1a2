/* model_impl.h -- the model's layout, shared by the files of the training
 * engine that run it: model.c (configuration, parameters, forward and
 * backward of the classifier and of the encoder-decoder) and
 * seq2seq_step.c (the encoder-decoder's incremental decoding). */
#ifndef BK_MODEL_IMPL_H
#define BK_MODEL_IMPL_H

#include "layers.h"

#define MAXP 512
/* a block's attention tensors: the operator's learned arrays (its schema),
 * then its layer extension's (attn_layer.c) */
#define BKI_MAX_LEARNED 4
#define BKI_MAX_EXT 4
#define BKI_MAX_ATTN_TENSORS (BKI_MAX_LEARNED + BKI_MAX_EXT)

/* parameter offsets of one block (-1 when absent). Encoder (and classifier)
 * blocks use ln1, qkv, the attention kind's own tensors, proj, ln2 and the
 * MLP; decoder blocks add the cross-attention: lnc, cq (queries from the
 * decoder stream), ckv (keys and values from the encoder's output), cproj.
 * A MAB unit (Set Transformer: half of an ISAB block, or the PMA) has the
 * cross-attention and the MLP, lnk (the norm of its keys' set), qset (its
 * queries when they are learned: inducing points, seeds) and, for the PMA,
 * the rFF before it (rf1, rf2). */
typedef struct {
    int64_t ln1_w, ln1_b, qkv_w, qkv_b, dwc_w, dwc_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
    int64_t lrn[BKI_MAX_LEARNED];  /* the operator's learned arrays          */
    int64_t ext[BKI_MAX_EXT];      /* the layer extension's tensors          */
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
    bk_asap_layer *asap;
    float *draw, *drs, *lam;          /* diff: the operator's output [R, I], its
                                         per-head inverse RMS [R, H], lambda [H] */
    float *clsa;                      /* cls_attn != full: the [CLS] row's
                                         weights [B, H, T] (vit.c)           */
    /* decoder blocks: the stream after the cross-attention, its norm, the
     * queries [Rd, I], keys and values [Re, 2I], output [Rd, I] and tape */
    float *cmid, *lnc, *muc, *rsc, *cq, *ckv, *catt;
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
    int nparam, nparam_need; /* the table's tensors; those the configuration asks for */
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
    float *dX, *dT, *dA, *dq, *dk, *dv, *dM, *dN, *dpool, *dlog, *dZtmp, *dO, *dlam;
    /* the self-attention operator's learned arrays' gradients of a block,
     * lgrad_n floats each (its parameter-gradient outputs, in order) */
    float *lgrad[BKI_MAX_LEARNED];
    int64_t lgrad_n[BKI_MAX_LEARNED];
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

/* ---- the Set Transformer's units (model.c) ---- */
static inline int bki_is_isab(const bk_model_config *c)
{
    return c->arch == BK_ARCH_CLASSIFIER && c->set_block == BK_SET_ISAB;
}
static inline int bki_has_pma(const bk_model_config *c) { return c->arch == BK_ARCH_CLASSIFIER && c->pool == BK_POOL_PMA; }
static inline int bki_pma_unit(const bk_model_config *c) { return c->depth * (bki_is_isab(c) ? 2 : 1); }

/* ---- the attention sites (config.c: the kinds and their flags;
 * attn_layer.c: the sites' calls and the layer extensions) ----
 * A site: the block (index into bo/ba), cross-attention or self-attention,
 * causal (the decoder's self-attention: softmax only). */
typedef struct {
    int l, cross, causal;
} attn_site;
struct bki_op;
struct bki_call;
/* the registered operator of a model kind (BKI_CAP_MODEL), or NULL (config.c) */
const struct bki_op *bki_attn_op(int kind);
/* what a kind's layer extension asks of the model: used at self-attention
 * sites only (no cross-attention), defined on whole attention rows (no
 * [CLS] split), holds arrays the model gets later (compiled layers), uses
 * the blocks' draw, drs, lam and the model's dO, dlam (diff's norm) */
enum { BKI_LAYER_SELF_ONLY = 1u, BKI_LAYER_WHOLE_ROWS = 2u, BKI_LAYER_HOLDS = 4u, BKI_LAYER_BUFFERS = 8u };
unsigned bki_attn_layer_flags(int kind);
/* a kind a rectangular cross-attention site takes (config.c) */
int bki_attn_cross_ok(int kind);
/* the parameters of site s (0 attn, 1 cross_attn, 2 pma_attn) as they are
 * read: the kind's defaults when the site's kind was assigned directly
 * (config.c) */
void bki_config_site_params(const bk_model_config *c, int s, bk_attn_params *out);
/* the parameters the model owns: scale, causal, seed += seed_offset */
void bki_attn_set_owned(const struct bki_op *op, void *par, float scale, int causal, int64_t seed_offset);
/* a block's attention tensors (the configuration's self-attention kind):
 * name "attn.NAME", shape, initialisation (BKI_INIT_*, sd), slot (< BKI_MAX_LEARNED:
 * the learned array's index; else BKI_MAX_LEARNED + the extension's index) */
typedef struct {
    char name[48];
    int ndim;
    int64_t dims[4];
    int init;
    double sd;
    int slot;
} bki_attn_tensor;
int bki_attn_tensors(const bk_model_config *c, int dh, bki_attn_tensor out[BKI_MAX_ATTN_TENSORS]);
int bki_attn_site_kind(const bk_model *m, attn_site s);
size_t bki_attn_ws(const bk_model *m, const bk_attn_desc *d, attn_site s);
size_t bki_attn_tape(const bk_model *m, const bk_attn_desc *d, attn_site s);
bk_status bki_model_ensure_ws(bk_model *m, size_t need);
bk_status bki_attn_forward(bk_model *m, attn_site s, const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k,
                           const bk_tensor *v, const bk_tensor *o, const bk_tensor *attn_out, void *tape);
bk_status bki_attn_backward(bk_model *m, attn_site s, const bk_attn_desc *d, const bk_tensor *q, const bk_tensor *k,
                            const bk_tensor *v, const bk_tensor *dout, const bk_tensor *dq, const bk_tensor *dk,
                            const bk_tensor *dv, void *pg, void *tape);
/* the self-attention layer of block l around its operator */
bk_status bki_attn_fwd_pre(bk_model *m, int l, bk_tensor *o);
void bki_attn_fwd_post(bk_model *m, int l, int B);
void bki_attn_bwd_pre(bk_model *m, int l, int B, bk_tensor *dout);
void *bki_attn_pgrads(bk_model *m);
void bki_attn_bwd_post(bk_model *m, int l);

/* ---- the model's units and the files that run them ----
 * (no import circle: model.c -> classifier.c, seq2seq.c -> encoder.c ->
 * set.c -> blocks.c -> attn_layer.c -> config.c; model.c also uses each of
 * them) */
/* blocks in bo/ba: the encoder's (or the classifier's), then the decoder's,
 * or the classifier's set units */
static inline int bki_block_count(const bk_model_config *c)
{
    return c->depth + (c->arch == BK_ARCH_SEQ2SEQ ? c->dec_depth : 0) + (bki_is_isab(c) ? c->depth : 0) + bki_has_pma(c);
}
/* what an entry of bo/ba is */
typedef enum { U_ENC = 0, U_DEC = 1, U_MAB = 2 } unit_kind;
static inline unit_kind bki_unit_of(const bk_model_config *c, int l)
{
    if (c->arch == BK_ARCH_SEQ2SEQ) return l >= c->depth ? U_DEC : U_ENC;
    return bki_is_isab(c) || l >= c->depth ? U_MAB : U_ENC;
}

/* The cross-attention of unit L (a decoder block, a MAB unit): Nq queries
 * with lengths nq, Nk keys with lengths nk per sample (NULL: all) */
typedef struct {
    int Nq, Nk;
    const int32_t *nq, *nk;
} bki_cross_shape;
static inline float *bki_kb(const bk_model *m, int out, int in) { return bki_linear_kbuf_floats(out, in) <= m->kbuf_n ? m->kbuf : NULL; }

/* the learned positions' gradient: g[t] += dx[b, t] over b in order, one
 * position t of T an iteration (dx [B, T, D]) */
typedef struct {
    float *g;
    const float *dx;
    int T, B, D;
} bki_pos_grad_args;

/* blocks.c */
bk_attn_desc bki_attn_desc(const bk_model *m, int B);
bki_cross_shape bki_mab_shape(const bk_model *m, int u);
bk_attn_desc bki_cross_desc_max(const bk_model *m, int l);
attn_site bki_self_site(int l);
void bki_views(const bk_model *m, float *qkv, float *att, bk_tensor *q, bk_tensor *k, bk_tensor *v, bk_tensor *o);
bk_status bki_self_attn_fwd(bk_model *m, int l, int B, int train, const bk_tensor *attn_out);
void bki_add_into(float *dst, const float *src, size_t n);
void bki_pos_grad_member(void *arg);
void bki_sub_last(bk_model *m, int R, int in, const float *a, int64_t w, int64_t bias, float p, int site,
                     const float *x, const sub_norm *n, float *out);
const float *bki_sub_bwd_in(bk_model *m, int R, const sub_norm *n, int site);
void bki_sub_bwd_out(bk_model *m, int R, const float *x, const sub_norm *n);
const float *bki_sub_h(const bk_model *m, const sub_norm *n, const float *x);
sub_norm bki_norm1(bk_model *m, int l);
void bki_mlp_fwd(bk_model *m, int l, int R, const float *x, float *out, float p, int site);
void bki_mlp_bwd(bk_model *m, int l, int R, const float *x, int site);
bk_status bki_enc_block_fwd(bk_model *m, int l, int B, const float *x, int train);
bk_status bki_enc_block_bwd(bk_model *m, int l, int B, const float *xin);
void bki_cross_views(const bk_model *m, blk_act *a, const bki_cross_shape *cs, bk_tensor *q, bk_tensor *k,
                        bk_tensor *v, bk_tensor *o);
bk_status bki_cross_fwd(bk_model *m, int L, int B, const bki_cross_shape *cs, const float *x, const float *mem,
                           float *out, int train, int site);
bk_status bki_cross_bwd(bk_model *m, int L, int B, const bki_cross_shape *cs, const float *x, const float *mem,
                           float *dmem, int site);
void bki_table_scatter(float *g, int D, const int32_t *tok, size_t n, const float *dE, float scale);
/* set.c */
bk_status bki_isab_fwd(bk_model *m, int l, int B, const float *x, int train);
bk_status bki_isab_bwd(bk_model *m, int l, int B, const float *xin);
bk_status bki_pma_fwd(bk_model *m, int B, int train);
bk_status bki_pma_bwd(bk_model *m, int B);
/* encoder.c */
bk_status bki_encoder_fwd(bk_model *m, int B, int train);
/* seq2seq.c */
bk_status bki_check_batch_s2s(const bk_model *m, const bk_batch *b, int need_tgt);
bk_status bki_s2s_forward(bk_model *m, const bk_batch *bt, int train, float ls, float *logits, double *loss);
bk_status bki_s2s_backward(bk_model *m, float grad_scale);

/* classifier.c */
void bki_unit_rows(float *w, int64_t rows, int64_t cols);
bk_otk_config bki_otk_params(const bk_model *m);
bk_status bki_check_batch(const bk_model *m, const bk_batch *b, int need_labels);
bk_status bki_pool_fwd(bk_model *m, int B, int train);
bk_status bki_trunk_fwd(bk_model *m, const bk_batch *bt, int train);
bk_status bki_pool_bwd(bk_model *m, int B);
void bki_embed_bwd(bk_model *m, int B);

#endif
