/* birkhoff/nn.h -- the training engine: models, optimisers, checkpoints.
 * Part of the public API; include <birkhoff.h> (all of it) or this file. The
 * conventions every function follows (layouts, padding, accuracy, threads and
 * determinism, workspace and tape) are at the top of birkhoff/core.h. */
#ifndef BIRKHOFF_NN_H
#define BIRKHOFF_NN_H

#include "asap.h"
#include "esp.h"
#include "lot.h"
#include "otk.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Training engine: transformer models (docs/MODEL.md)                      */
/* ------------------------------------------------------------------------ */
/* A pre-LN encoder classifier whose attention normaliser is chosen per model:
 *
 *   embed:  image  NCHW [B,C,H,W] -> patches (p1 p2 c order) -> Linear(P*P*C, D)
 *           tokens int32 [B, max_len] -> table [vocab, D]
 *           points [B, max_points, point_dim] -> Linear -> GELU -> Linear (D)
 *           [+ CLS token prepended] [+ learned positional embedding] [dropout]
 *   block:  x += proj(Attn(LN1(x) Wqkv^T [+ bqkv]))  [dropout]
 *           x += fc2(GELU(fc1(LN2(x))))               [dropout]  (mlp_dim > 0)
 *           (set_block = isab: Set Transformer's ISAB instead, below)
 *   head:   [LN] -> pool (CLS | MEAN | MAX over valid tokens | OTK layer |
 *           PMA) -> Linear(features, classes)
 *   loss:   cross-entropy with label smoothing ls (PyTorch's definition),
 *           averaged over the batch.
 *
 * Parameters live in one float buffer, gradients in another, each tensor
 * named as a PyTorch state_dict would name it (Linear weights [out, in]);
 * bk_model_param() lists them. Activations, tapes and operator workspaces are
 * planned once for max_batch at creation: a training step allocates nothing.
 * Valid lengths (tokens, points) reach the operators through their marginals:
 * padded tokens are never attended to, never pooled, and get zero gradient.
 *
 * Threads: attention runs over the B*H problems, linears are single GEMMs over
 * all B*N rows (OpenBLAS splits over rows and columns, never the inner
 * dimension), row-wise layers split rows in fixed blocks, and every
 * parameter-gradient reduction over rows runs in row order: losses, gradients
 * and trained weights are bitwise identical for any thread count. */
typedef enum { BK_INPUT_IMAGE = 0, BK_INPUT_TOKENS = 1, BK_INPUT_POINTS = 2 } bk_input_kind;
/* The attention kind of a model site: the index of a registered operator
 * (birkhoff/ops.h: bk_op_at) whose schema marks it usable by a model. Every
 * such operator is a kind, with no list of kinds above the registry: an
 * operator registered later is a kind under its registry name. The
 * constants below are the registry indices of the first seven operators
 * (their values changed with issue 42: esp 2 -> 3, lot 3 -> 5,
 * unbalanced 5 -> 2; the names, as config text and checkpoints spell them,
 * did not). */
typedef enum {
    BK_ATTN_SOFTMAX = 0, BK_ATTN_SINKHORN = 1, BK_ATTN_UNBALANCED = 2, BK_ATTN_ESP = 3,
    BK_ATTN_ASAP = 4,       /* compiled layers (bk_model_set_asap); inference only */
    BK_ATTN_LOT = 5,        /* learned pivots and mass logits per block          */
    BK_ATTN_DIFF = 6        /* differential attention (DiffTransformer): even
                               head_dim; learned lambda vectors per block,
                               per-head RMSNorm, (1 - lambda_init)           */
} bk_attn_kind;
/* The name of an attention kind, as the config key attn= spells it (the
 * operator's registry name: "softmax", "sinkhorn", "unbalanced", "esp",
 * "asap", "lot", "diff", ...; "?" for a value that is not a model kind). */
BK_API const char *bk_attn_kind_name(bk_attn_kind k);
/* The kind of a registered operator's name (-1: no such operator, or one a
 * model cannot use). */
BK_API int bk_attn_kind_find(const char *name);
/* The parameters of a site's attention: the operator's own parameter struct
 * (bk_sinkhorn_config, bk_esp_config, ...: bk_op_config_size bytes), held
 * in place, tagged with the kind they belong to. Set them by key through
 * bk_model_config_set ("attn.iters=7"); read them with bk_model_config_get.
 * A site whose kind was assigned directly (c.attn = BK_ATTN_SINKHORN) reads
 * as that kind's defaults until its parameters are set. */
#define BK_ATTN_PARAMS_BYTES 256
typedef struct {
    int kind; /* the kind whose parameter struct par holds */
    union {
        unsigned char bytes[BK_ATTN_PARAMS_BYTES];
        double align_d;
        int64_t align_i;
        void *align_p;
    } par;
} bk_attn_params;
/* PMA: Set Transformer's pooling by multihead attention (docs/MODEL.md
 * "Set Transformer blocks"): pma_seeds learned seeds attend to the set. */
typedef enum { BK_POOL_CLS = 0, BK_POOL_MEAN = 1, BK_POOL_MAX = 2, BK_POOL_OTK = 3, BK_POOL_PMA = 4 } bk_pool_kind;
/* The classifier's blocks (Set Transformer, Lee et al. 2019; docs/MODEL.md
 * "Set Transformer blocks"). SAB: the encoder block above (self-attention
 * and MLP over the set: Set Transformer's SAB, pre-LN). ISAB: m =
 * set_inducing learned inducing points I attend to the set, H = MAB(I, X),
 * then the set attends to them, MAB(X, H): O(N m) attention instead of
 * O(N^2). MAB(X, Y) = Z + MLP(LN2(Z)), Z = X + proj(Attn(LNc(X) Wq,
 * LNk(Y) Wkv)): the encoder-decoder's cross-attention sublayer on a
 * normalised memory, then the MLP (mlp_dim > 0). */
typedef enum { BK_SET_SAB = 0, BK_SET_ISAB = 1 } bk_set_block;
/* How the [CLS] token's attention row is computed (LOTFormer's ViT
 * ingredients; docs/MODEL.md "The [CLS] row and DWC"). FULL: it is a row of
 * the model's attention over all tokens (the paper's "full DS"). SOFTMAX:
 * its own softmax over every valid token, logits attn_scale q_cls . k_j,
 * while the model's attention runs on the other tokens only ([CLS] is
 * neither a query nor a key there). POL: the same with the polarised logits
 * (u_j)^pol_ps + (w_j)^pol_po, u_j = s sum_c max(q_c k_jc, 0) and
 * w_j = s sum_c max(-q_c k_jc, 0), s = attn_scale (Pol-[CLS]). */
typedef enum { BK_CLS_FULL = 0, BK_CLS_SOFTMAX = 1, BK_CLS_POL = 2 } bk_cls_attn;
/* which part of each LOT layer's pivot measure is trained (lot_learn) */
typedef enum { BK_LOT_LEARN_BOTH = 0, BK_LOT_LEARN_Z = 1, BK_LOT_LEARN_NONE = 2 } bk_lot_learn;
/* The model's architecture: the encoder classifier above, or an
 * encoder-decoder translation model (docs/MODEL.md, "Encoder-decoder"). */
typedef enum { BK_ARCH_CLASSIFIER = 0, BK_ARCH_SEQ2SEQ = 1 } bk_arch;

typedef struct {
    bk_input_kind input;
    int channels, image_h, image_w, patch;  /* image (patch divides both sides) */
    int vocab, max_len;                     /* tokens                          */
    int point_dim, max_points;              /* points                          */
    int dim, depth, heads, head_dim;        /* head_dim 0: dim / heads (heads
                                               must then divide dim)           */
    int mlp_dim;                            /* 0: no MLP sub-block             */
    int cls, pos_embed, final_norm, qkv_bias;  /* 0/1 switches                */
    bk_pool_kind pool;                      /* CLS needs cls = 1               */
    int classes;                            /* >= 2                            */
    float dropout;                          /* [0, 1): embedding, attention
                                               output and MLP output          */
    float ln_eps;                           /* LayerNorm epsilon (1e-5)        */
    /* the self-attention (classifier and encoder blocks, ISAB blocks): a
     * kind and its operator's parameters (keys "attn.KEY", the operator's
     * schema; docs/MODEL.md "Attention keys"). The model itself sets each
     * operator's scale (attn_scale), causal (the decoder's self-attention)
     * and the per-block offset of a seed (1000 + block; cross-attention
     * sites 2000 + block), and the arrays it learns (the operator's learned
     * schema) or holds (compiled ASAP layers, diff's lambda).           */
    bk_attn_kind attn;
    bk_attn_params attn_par;
    float attn_scale;                       /* 0: 1/sqrt(head_dim); the scale
                                               of every site's operator and of
                                               the [CLS] row                   */
    int otk_refs, otk_supports, otk_iters; float otk_eps; /* OTK pooling:
                                               otk_iters half-steps (even)    */
    /* OTK pooling's feature map and positional encoding (docs/MODEL.md,
     * "The OTK layer"; specs/otk.md sections 2.4, 2.5):
     * otk_anchors K = 0: identity map, references pool.otk_z [q, p, D];
     *   K > 0: the Nystrom map of the homogeneous Gaussian kernel (bandwidth
     *   otk_sigma, inverse square root regulariser otk_eta; birkhoff/otk.h)
     *   on K trainable anchors pool.otk_w [K, D], references pool.otk_z
     *   [q, p, K] in R^K, features p * q * K. The anchors are kept unit
     *   rows: drawn on the sphere, and renormalised after every optimiser
     *   update (bk_optim_step); K <= 4096.
     * otk_pe = none | 1d | 2d (bk_otk_pe), bandwidth otk_sigma_pos: the
     *   paper's Gaussian positional weights on the plan (paper convention,
     *   not applied to the scores). 1d: positions i / n_b of the valid rows
     *   ([CLS], when there is one, is the first) against j / p. 2d: the
     *   image's patch grid (image_h / patch x image_w / patch) against a
     *   sqrt(p) x sqrt(p) support grid; needs input = image, cls = 0 and a
     *   square otk_supports.                                                */
    int otk_anchors;
    float otk_sigma, otk_eta;
    bk_otk_pe otk_pe;
    float otk_sigma_pos;
    /* ---- encoder-decoder (arch = seq2seq; docs/MODEL.md) ----
     * input = tokens, one joint vocabulary (vocab) whose table embeds the
     * source, the target and is the output projection (tied); max_len
     * source positions, tgt_max_len target positions (both counting the
     * EOS); depth encoder blocks (attention attn), dec_depth decoder blocks
     * (causal softmax self-attention, cross-attention cross_attn);
     * pos_embed 0 none, 1 learned, 2 sinusoidal; post_ln 1 normalises after
     * each residual add (fairseq's default), 0 before (pre-LN, with the
     * final norms final_norm); bos starts the decoder's input, eos ends a
     * sentence. cls, pool, classes and the OTK keys are not used.       */
    bk_arch arch;
    int dec_depth, tgt_max_len;
    bk_attn_kind cross_attn;                /* an operator with cross-attention
                                               and no learned arrays (softmax,
                                               sinkhorn, unbalanced, esp, ...) */
    bk_attn_params cross_par;               /* its parameters: "cross_attn.KEY" */
    int post_ln;
    int bos, eos;
    /* ---- the ViT ingredients of LOTFormer (classifier; docs/MODEL.md) ----
     * cls_attn: the [CLS] row (above; not FULL needs cls = 1 and attn
     * softmax, sinkhorn, unbalanced, esp or lot); pol_ps, pol_po: the
     * powers of Pol-[CLS]'s same- and opposite-sign similarities (>= 1;
     * 2 and 1). dwc = 1 (image input): each attention output gets the
     * depthwise-convolution branch O = A V + DWConv(V) over the patch grid
     * ([CLS] excluded), a dwc_kernel x dwc_kernel kernel (odd; 3) and a
     * bias per head channel, shared by the heads (blocks.l.attn.dwc.weight
     * [head_dim, k, k], .bias [head_dim])                             */
    bk_cls_attn cls_attn;
    float pol_ps, pol_po;
    int dwc, dwc_kernel;
    /* lot_learn: which of the self-attention operator's learned arrays
     * (its schema's, in order) are trained: both (all; default), z (the
     * first only), none. For attn = lot: both (the pivots Z and the mass
     * logits theta), z (Z only: the masses stay uniform, theta = 0,
     * LOTFormer Table 6's "learnable pivot"), none (Z stays at its
     * initialisation and the masses uniform: Table 6's "fixed pivot"). A tensor that is not trained keeps its
     * place in the parameter table and in checkpoints; its gradient is zero
     * (never accumulated), so no optimiser moves it (no weight decay
     * applies to LOT tensors) and the gradient norm leaves it out.      */
    bk_lot_learn lot_learn;
    /* ---- Set Transformer blocks (classifier; docs/MODEL.md) ----
     * set_block: sab (the encoder block) or isab (set_inducing inducing
     * points, >= 1; 16): the attentions of an ISAB block are of kind attn
     * (an operator with cross-attention and no learned arrays: softmax,
     * sinkhorn, unbalanced, esp, ...; rectangular problems with uniform
     * marginals 1/Nq, 1/Nk), and it takes cls_attn = full, dwc = 0.
     * pool = pma: pma_seeds learned seeds (>= 1; 1) attend to rFF(x)
     * (rFF = Linear-GELU-Linear of width mlp_dim; none when mlp_dim = 0)
     * through a MAB whose attention is pma_attn (as the ISAB's; softmax: with one seed a doubly-stochastic PMA is
     * exactly mean pooling), features [B, pma_seeds * dim].           */
    bk_set_block set_block;
    int set_inducing;
    int pma_seeds;
    bk_attn_kind pma_attn;
    bk_attn_params pma_par;                 /* its parameters: "pma_attn.KEY" */
} bk_model_config;

/* A ViT-like default: 28x28x1 images, patch 4, dim 64, depth 2, 4 heads,
 * mlp 128, CLS, positional embedding, final LN, CLS pooling, 10 classes,
 * softmax attention at every site (a site given another kind takes that
 * operator's defaults, except ESP's sort = soft and LOT's r = 8, the model's
 * defaults before the schema), OTK 1 reference of 4 supports, 20 half-steps (10
 * iterations), eps 0.5, identity map (otk_anchors 0; sigma 0.5, eta 1e-2),
 * no PE (otk_sigma_pos 0.1); cls_attn full, pol_ps 2, pol_po 1, no DWC
 * (kernel 3); lot_learn both; set_block sab, 16 inducing points, 1 PMA seed,
 * pma_attn softmax. */
BK_API bk_model_config bk_model_config_default(void);
/* One "key=value" assignment (keys are the field names above; enum values by
 * name: input=image|tokens|points, pool=cls|mean|max|otk|pma,
 * otk_pe=none|1d|2d, cls_attn=full|softmax|pol, lot_learn=both|z|none,
 * set_block=sab|isab; attn, cross_attn and pma_attn take a model operator's
 * registry name). The attention sites' parameters are "attn.KEY",
 * "cross_attn.KEY" and "pma_attn.KEY", KEY a parameter of the site's
 * operator (its schema, as `birkhoff attn --op NAME --help` lists them)
 * except scale and causal, which the model sets: set a site's kind first
 * (giving a site another kind resets its parameters to that kind's
 * defaults). The keys before the schema are accepted and converted (the
 * site's kind being the one they named): sk_iters, sk_eps (sinkhorn,
 * unbalanced: iters, eps), sk_rho (unbalanced: rho), esp_soft (esp: sort),
 * esp_t, esp_tau, esp_slices (esp: t, tau, L), lot_r, lot_iters, lot_eps,
 * lot_temp (lot: r, iters, eps, temp), asap_ending (asap: variant); each
 * sets that parameter at every site of such a kind, and none when there is
 * none (docs/MODEL.md "Attention keys"). Unknown keys or malformed values:
 * BK_ERR_PARAM. */
BK_API bk_status bk_model_config_set(bk_model_config *c, const char *key, const char *value);
/* Assignments separated by commas, newlines or spaces ("dim=128,depth=4"):
 * the kinds (attn, cross_attn, pma_attn) first, then the rest in order, so
 * old text (a checkpoint's before the schema) converts as it was meant. */
BK_API bk_status bk_model_config_parse(bk_model_config *c, const char *text);
/* Writes every field as "key=value\n" lines, each site's kind followed by
 * its operator's parameters ("attn=sinkhorn\nattn.eps=1\nattn.iters=5...")
 * (NUL-terminated; returns the length needed, excluding the NUL, like
 * snprintf). */
BK_API size_t bk_model_config_format(const bk_model_config *c, char *buf, size_t cap);
/* The value of one key as bk_model_config_format writes it (NUL-terminated
 * into buf; returns its length, or 0 with BK_ERR_PARAM set for a key the
 * configuration does not have). */
BK_API size_t bk_model_config_get(const bk_model_config *c, const char *key, char *buf, size_t cap);
/* Full validation with a message naming the problem (patch not dividing the
 * image, heads not dividing dim, CLS pooling without a CLS token, ...). */
BK_API bk_status bk_model_config_check(const bk_model_config *c);

typedef struct bk_model bk_model;

/* One batch. Exactly the input of the model's kind is read:
 *   image:  x [B, channels, image_h, image_w]
 *   tokens: tokens [B, max_len] in [0, vocab), len [B] in [1, max_len] or NULL
 *   points: x [B, max_points, point_dim],  len [B] in [1, max_points] or NULL
 * labels [B] in [0, classes) (needed for the loss and the backward).
 *   seq2seq: tokens [B, max_len] the source ids (ending with eos), len [B]
 *            (NULL: all max_len), tgt and tgt_len the targets (needed for
 *            the loss and the backward); labels are not read. */
typedef struct {
    int B;
    const float *x;
    const int32_t *tokens;
    const int32_t *len;
    const int32_t *labels;
    const int32_t *tgt;     /* seq2seq: target ids [B, tgt_max_len], each
                               sentence ending with eos, then anything      */
    const int32_t *tgt_len; /* seq2seq: [B] in [1, tgt_max_len] (EOS counted) */
} bk_batch;

/* Creates a model with parameters initialised from seed (Linear weights and
 * biases U(-1/sqrt(in), 1/sqrt(in)) as PyTorch; LN 1/0; CLS, positions and
 * token table N(0, 0.02^2); LOT pivots N(0,1), mass logits 0; diff's lambda
 * vectors N(0, 0.1^2); OTK references N(0, 1/k), k = otk_anchors or dim;
 * OTK anchors uniform on the unit sphere (N(0, 1) rows normalised); the
 * paper's unsupervised start of the OTK layer is bk_model_otk_fit) and its
 * activations planned for batches of up to max_batch.
 * Everything is allocated here, once (bk_model_memory says how much); a model
 * needing more than the machine's physical memory is refused (BK_ERR_NOMEM,
 * with both figures) rather than left to the kernel's OOM killer. */
BK_API bk_status bk_model_create(const bk_model_config *c, uint64_t seed, int max_batch, bk_model **out);
/* Without allocating: the trainable floats (num_params, nullable) and the
 * heap bytes bk_model_create would allocate (bytes, nullable): parameters,
 * gradients, activations, tapes and the operator workspace at the current
 * thread count. Errors as bk_model_create (a bad config, max_batch < 1,
 * sizes beyond 2^60 bytes: BK_ERR_SHAPE). */
BK_API bk_status bk_model_memory(const bk_model_config *c, int max_batch, int64_t *num_params, size_t *bytes);
BK_API void bk_model_free(bk_model *m);
BK_API const bk_model_config *bk_model_get_config(const bk_model *m);
/* Total trainable floats, and the named tensors: i in [0, count). */
BK_API int64_t bk_model_num_params(const bk_model *m);
BK_API int bk_model_param_count(const bk_model *m);
/* What weight decay a tensor takes (bk_param_info.decay) */
#define BK_DECAY_NONE 0
#define BK_DECAY_WEIGHT 1
#define BK_DECAY_EMBED 2
typedef struct {
    const char *name;      /* e.g. "blocks.0.attn.qkv.weight"                 */
    int ndim;
    int64_t shape[4];
    int64_t offset, count; /* in floats, into the parameter/gradient buffers  */
    int decay;             /* BK_DECAY_WEIGHT (1): weight decay applies
                              (Linear weights, DWC kernels);
                              BK_DECAY_EMBED (2): a token table
                              (embed.table), decayed only when the
                              optimiser's decay_embed is 1; BK_DECAY_NONE
                              (0): biases, norms, CLS, positions, LOT
                              pivots/masses, diff lambda vectors, OTK
                              anchors and references, inducing points and
                              seeds                                          */
    float *data, *grad;
} bk_param_info;
BK_API bk_status bk_model_param(const bk_model *m, int i, bk_param_info *info);
BK_API float *bk_model_params(bk_model *m);
BK_API float *bk_model_grads(bk_model *m);

/* Forward. train = 1 applies dropout and keeps what the backward needs;
 * train = 0 is inference. logits [B, classes] (nullable); loss (nullable,
 * needs labels): mean cross-entropy with label smoothing ls in [0, 1).
 * ASAP models refuse train = 1. */
BK_API bk_status bk_model_forward(bk_model *m, const bk_batch *b, int train, float ls, float *logits, double *loss);
/* Backward of the last train = 1 forward: ADDS grad_scale * dloss/dparams
 * to the gradient buffer (grad_scale = B / B_total accumulates micro-batches
 * of one effective batch). */
BK_API bk_status bk_model_backward(bk_model *m, float grad_scale);
BK_API void bk_model_zero_grad(bk_model *m);
/* Attach a compiled ASAP layer to block `layer` (copied; the model's
 * attention must be BK_ATTN_ASAP and every block needs one before use). */
BK_API bk_status bk_model_set_asap(bk_model *m, int layer, const bk_asap_layer *asap);
/* The attention of block `layer` in the last forward: [B, H, N, N] (N =
 * tokens incl. CLS; padded rows/columns zero). Recomputed from the stored
 * activations; attn must hold B*H*N*N floats. An ISAB block's map is its
 * first attention, the m = set_inducing inducing points over the set:
 * [B, H, m, N] (B*H*m*N floats; padded columns zero). */
BK_API bk_status bk_model_attention(bk_model *m, int layer, float *attn);
/* Compiling a trained Sinkhorn model into ASAP (birkhoff asap compile):
 * bk_model_asap_config gives the ASAP configuration whose teacher is this
 * model's Sinkhorn attention (d = head_dim, scale = attn_scale, eps = attn.eps,
 * teacher_iters = attn.iters; slices, seed and lambda at their defaults: set
 * them before bk_asap_calib_create). bk_model_calib_add adds the B*H
 * problems of block `layer` in the last forward (its Q, K and valid lengths)
 * to a calibrator. The compiled model is a copy with attn = asap and
 * bk_model_set_asap on every block; checkpoints carry its layers. */
BK_API bk_asap_config bk_model_asap_config(const bk_model *m);
BK_API bk_status bk_model_calib_add(bk_model *m, int layer, bk_asap_calib *calib);
/* The unsupervised start of an OTK pool (OTK section 3.4: the paper's
 * supervised models are initialised with the unsupervised procedure): the
 * model's own pooled sets for the b->B samples of b (inference forwards of
 * everything before the pool, max_batch samples at a time; labels are not
 * read) give the anchors pool.otk_w by spherical K-means (bk_otk_fit_anchors;
 * otk_anchors > 0), then the references pool.otk_z on the features psi of
 * those anchors (bk_otk_fit_refs, no barycentre steps: K-means of all rows
 * for q = 1, Wasserstein K-means over the sets with otk_eps and otk_iters
 * for q > 1; positions play no part). kp: iterations, tolerance, seed,
 * max_samples (NULL: bk_kmeans_config_default()); rep (nullable) receives
 * the references' fit. Every other parameter is untouched; on an error
 * nothing is (a pending backward is dropped either way). Errors: a model
 * without an OTK pool (BK_ERR_PARAM), the batch's (as bk_model_forward),
 * the fits' (fewer distinct rows than anchors or supports: BK_ERR_PARAM). */
BK_API bk_status bk_model_otk_fit(bk_model *m, const bk_batch *b, const bk_kmeans_config *kp,
                                  bk_kmeans_report *rep);
/* Tokens per sample (incl. CLS), and heads. */
BK_API int bk_model_tokens(const bk_model *m);

/* ---- changing a model's attention (docs/MODEL.md, "Plug-and-play swaps") ----
 * bk_model_set_attn_config changes, in place, the attention parameters that
 * keep the parameter table: c must equal the model's configuration except
 * for attn_scale, the sites' operator parameters (attn.*, cross_attn.*,
 * pma_attn.*) that keep the shapes of the learned arrays (LOT's attn.r
 * may not change), lot_learn, pol_ps and pol_po (any other difference:
 * BK_ERR_PARAM naming the key). The weights, the optimiser state that refers to them and the
 * dropout counter are untouched; operator tapes are grown when the new
 * parameters need more (BK_ERR_NOMEM leaves the model as it was), and a
 * pending backward is dropped (run a training forward again). What the
 * training loop uses for ESP's temperature annealing (attn.t per epoch) and
 * for evaluating a soft-sort ESP model with the hard sort (attn.sort=hard).
 *
 * bk_model_swap creates a new model (max_batch as bk_model_create) whose
 * configuration is target, with every weight of src: target must equal src's
 * configuration except for the attention keys (attn, cross_attn, pma_attn,
 * their attn.* keys, attn_scale, cls_attn, pol_*, lot_learn; another key: BK_ERR_PARAM naming it). Every tensor the two
 * parameter tables share (embedding, blocks, norms, pooling, head) is copied
 * bit for bit; a tensor only the target has (LOT's blocks.l.attn.lot_z and
 * lot_theta, swapping to lot; diff's blocks.l.attn.diff_lq1 ... diff_lk2,
 * swapping to diff) gets the model's own initialisation, i.e. what
 * bk_model_create gives a model of that kind with src's seed (pivots N(0, 1),
 * mass logits 0: uniform masses; lambda vectors N(0, 0.1^2)); a tensor only
 * src has (swapping away from lot or diff) is dropped. attn = diff needs an
 * even head dimension. The seed and the dropout counter are src's; compiled ASAP
 * layers are not carried (a swap away from asap gives the Sinkhorn teacher's
 * attention back). attn = asap is refused: ASAP layers are fitted to a
 * Sinkhorn model's attention on data (bk_asap_compile). A LOT source swapped
 * to LOT keeps its attn.r (its pivots are trained). Swapping to another kind
 * and back (without LOT in between) reproduces src exactly.
 * blocks (nblocks entries, each in [0, depth)) selects the blocks whose
 * attention changes; NULL / 0 selects all. A model holds one attention kind
 * for all its blocks: a selection that is not every block is refused
 * (BK_ERR_UNSUPPORTED) until models carry per-block kinds. */
BK_API bk_status bk_model_set_attn_config(bk_model *m, const bk_model_config *c);
BK_API bk_status bk_model_swap(const bk_model *src, const bk_model_config *target, const int *blocks, int nblocks,
                               int max_batch, bk_model **out);

/* ---- encoder-decoder models: statistics and decoding ---- */
/* Of the last forward: the tokens the loss averaged over (classifier: the
 * samples, seq2seq: the valid target tokens) and how many of them the
 * logits' argmax predicted (both nullable). BK_ERR_PARAM before any forward
 * with labels or targets. */
BK_API bk_status bk_model_token_stats(const bk_model *m, int64_t *tokens, int64_t *correct);

/* Decoding (greedy when beam = 1): the best hypothesis under the score
 * sum(log p) / len^len_penalty (len counts the EOS; fairseq's --lenpen),
 * at most min(tgt_max_len, len_a * src_len + len_b) tokens with its EOS
 * (forced at the limit). cache = 1 keeps every decoder layer's keys and
 * values (a step costs O(length)); cache = 0 recomputes the whole prefix at
 * every step (same result; what the cache saves, for benchmarks). */
typedef struct {
    int beam;            /* >= 1 (5)                                         */
    float len_penalty;   /* alpha (1)                                         */
    float len_a;         /* (1.5)                                             */
    int len_b;           /* (10)                                              */
    int cache;           /* 0/1 (1)                                           */
} bk_decode_config;
BK_API bk_decode_config bk_decode_config_default(void);
/* Keys beam, len_penalty, len_a, len_b, cache; BK_ERR_PARAM as the other
 * config setters. */
BK_API bk_status bk_decode_config_set(bk_decode_config *c, const char *key, const char *value);
/* Translates B source sentences (src [B, src_stride] ids, src_len [B] in
 * [1, max_len], each ending with eos) with a seq2seq model: out [B,
 * out_stride] receives the tokens of the best hypothesis without BOS and
 * EOS, out_len [B] their count (nullable: score [B], the hypothesis'
 * length-penalised log-probability). Batched over the sentences (B <= the
 * model's max_batch; the decoder's state, B * beam rows with every layer's
 * keys and values, is allocated per call), deterministic (ties go to the
 * lower hypothesis, then the lower token). src_stride >= the longest
 * sentence. Errors: not a seq2seq model or cross_attn not
 * softmax (a doubly-stochastic cross-attention normalises over all target
 * positions; it has no incremental form) (BK_ERR_PARAM), out_stride below
 * the length limit (BK_ERR_SHAPE), ids or lengths out of range
 * (BK_ERR_PARAM / BK_ERR_LENGTH). */
BK_API bk_status bk_model_translate(bk_model *m, const int32_t *src, int src_stride, const int32_t *src_len, int B,
                                    const bk_decode_config *c, int32_t *out, int out_stride, int32_t *out_len,
                                    float *score);

/* ---- optimisers and schedules ---- */
typedef enum { BK_OPT_ADAMW = 0, BK_OPT_ADAM = 1, BK_OPT_SGD = 2 } bk_opt_kind;
/* invsqrt: fairseq's inverse_sqrt, lr (step + 1) / warmup during the
 * warm-up, then lr sqrt(warmup / (step + 1)) (0-based steps). */
typedef enum { BK_SCHED_CONSTANT = 0, BK_SCHED_STEP = 1, BK_SCHED_COSINE = 2, BK_SCHED_INVSQRT = 3 } bk_sched_kind;
typedef struct {
    bk_opt_kind kind;
    float lr, beta1, beta2, eps;   /* Adam(W) (PyTorch's formulas)            */
    float weight_decay;            /* AdamW: decoupled; Adam/SGD: L2 added to
                                      the gradient; only tensors with decay
                                      BK_DECAY_WEIGHT (Linear weights), and
                                      BK_DECAY_EMBED (token tables) when
                                      decay_embed is 1; never biases, norms,
                                      positions (PyTorch users' convention)  */
    float momentum; int nesterov;  /* SGD                                     */
    float clip;                    /* > 0: clip the global L2 gradient norm   */
    bk_sched_kind sched;
    int warmup;                    /* linear warm-up steps from lr/warmup     */
    int64_t total_steps;           /* cosine: decay to lr_min at total_steps  */
    float lr_min;
    float gamma; int milestones[8];/* step: lr *= gamma at each step >= m (0 ends) */
    int decay_embed;               /* 1: weight_decay also applies to the token
                                      tables (what every optimiser did before
                                      issue 43: a checkpoint's optimiser
                                      metadata without the key reads 1, so an
                                      old run resumes as it was); 0 (the
                                      default): not                          */
} bk_optim_config;

/* AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0.01 (not on the token
 * tables: decay_embed 0), no clip, constant, no warm-up. A training run's
 * default differs (bk_run_config_default: a warm-up and a cosine schedule
 * over the run). warmup may be -1 only in a run's configuration, where
 * bk_run_config_resolve turns it into the run's automatic warm-up
 * (bk_optim_plan); bk_optim_create refuses it. */
BK_API bk_optim_config bk_optim_config_default(void);
BK_API bk_status bk_optim_config_set(bk_optim_config *c, const char *key, const char *value);
BK_API bk_status bk_optim_config_parse(bk_optim_config *c, const char *text);
BK_API size_t bk_optim_config_format(const bk_optim_config *c, char *buf, size_t cap);
/* Learning rate at (0-based) step under the schedule. */
BK_API float bk_optim_lr(const bk_optim_config *c, int64_t step);

typedef struct bk_optim bk_optim;
BK_API bk_status bk_optim_create(const bk_optim_config *c, const bk_model *m, bk_optim **out);
BK_API void bk_optim_free(bk_optim *o);
BK_API int64_t bk_optim_step_count(const bk_optim *o);
BK_API const bk_optim_config *bk_optim_get_config(const bk_optim *o);
/* Clips (if asked), applies one update from the model's gradients and
 * advances the step, then restores the model's constraints on its
 * parameters: an OTK pool's anchors pool.otk_w are renormalised to unit rows
 * (each row divided by its L2 norm, as the reference code does after every
 * step). gnorm (nullable) receives the pre-clip global norm. A non-finite
 * gradient norm refuses the update (BK_ERR_NONFINITE). */
BK_API bk_status bk_optim_step(bk_optim *o, bk_model *m, double *gnorm);

/* One training step on an effective batch: zero grads, forward/backward over
 * micro-batches of at most `micro` samples (0: all at once), accumulate, step.
 * loss receives the mean loss of the effective batch. */
BK_API bk_status bk_train_step(bk_model *m, bk_optim *o, const bk_batch *b, int micro, float ls,
                               double *loss, double *gnorm);

/* ---- checkpoints (safetensors; docs/MODEL.md "Checkpoints") ----
 * Tensors: every parameter by name (float32, little-endian), then, when an
 * optimiser is given, its state as "optim.<slot>.<name>". Metadata (strings):
 * format "birkhoff", model config (bk_model_config_format), optimiser config
 * and step, the model's RNG seed and step counter, `extra` (caller's
 * "key=value\n" lines, nullable) and a FNV-1a-64 checksum of every byte of
 * the file but its own 16 digits (the data section, then the header with
 * those digits as '0'): a check against corruption and careless edits, not a
 * signature. Written to a temporary file and renamed. Errors: BK_ERR_NULL
 * (path or m NULL), BK_ERR_PARAM (extra is not UTF-8: the header is JSON),
 * BK_ERR_NOMEM, BK_ERR_IO. Loading verifies the header, the offsets, the size
 * and the checksum: a truncated, corrupt or edited file is refused
 * (BK_ERR_FORMAT) and nothing is returned. A resumed model and optimiser
 * continue bit for bit as the uninterrupted run. */
BK_API bk_status bk_checkpoint_save(const char *path, const bk_model *m, const bk_optim *o, const char *extra);
/* The same checkpoint staged in an output set (birkhoff/core.h,
 * bk_outset_add: flags BK_OUT_NOFOLLOW, BK_OUT_SYNC), committed with the
 * set's other files by bk_outset_commit, all or none. The model's weights
 * are written when staged: the caller may change them afterwards. */
BK_API bk_status bk_checkpoint_stage(bk_outset *set, const char *path, unsigned flags, const bk_model *m,
                                     const bk_optim *o, const char *extra);
/* Creates the model (max_batch as bk_model_create) and, when o is not NULL
 * and the file holds optimiser state, the optimiser. extra (nullable)
 * receives a malloc'd copy of the caller's metadata (free()). On any error
 * nothing is returned (*m, *o, *extra NULL). Errors: BK_ERR_NULL; BK_ERR_IO
 * (cannot open or read); BK_ERR_NOMEM; BK_ERR_FORMAT, naming the problem,
 * for a file that is truncated, corrupt or edited: a header longer than
 * 64 MiB or than the file, a header that is not the strict JSON of the
 * format (RFC 8259 strings in UTF-8 without \u0000 or \u escapes above
 * U+007F, no nesting beyond the format's shape, at most 8 sizes per shape)
 * or that holds a metadata key, a tensor name, a field of a tensor entry or
 * "__metadata__" twice (named in the message), a dtype other than F64, F32,
 * F16, I64, I32, I16, I8, U8, a shape that does not fill its byte range,
 * offsets that do not tile the data section, a missing or mismatched
 * checksum ("checksum mismatch"; a file of an earlier version, whose
 * checksum covers only the data section and the ASAP layers, is accepted),
 * seed / forward_count / optim_step that are not decimal integers in range,
 * a bad model or optimiser config, tensors missing or misshapen for the
 * configuration, bad compiled ASAP layers; and bk_model_create's errors. The
 * memory a header costs is proportional to its length (a few times the
 * file's size in all). */
BK_API bk_status bk_checkpoint_load(const char *path, int max_batch, bk_model **m, bk_optim **o, char **extra);
/* Reads and verifies a checkpoint as bk_checkpoint_load does (header,
 * offsets, size, checksum, config) and returns its model config only,
 * creating nothing: with bk_model_memory, what loading it would cost. */
BK_API bk_status bk_checkpoint_config(const char *path, bk_model_config *c);

#ifdef __cplusplus
}
#endif
#endif /* BIRKHOFF_NN_H */
