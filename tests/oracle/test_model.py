#!/usr/bin/python3
"""Hold the C training engine (`birkhoff model`) to its PyTorch twin.

Usage:
  /usr/bin/python3 tests/oracle/test_model.py --birkhoff build/birkhoff [--quick]
      [--only SUBSTRING] [--keep DIR] [--tol-logits T] [--tol-grad T] ...

The twin is birkhoff.models (python/birkhoff/models.py, docs/MODEL.md in
PyTorch), imported as bench/peers/model_torch.py. Every case creates a tiny
model with the CLI, loads the checkpoint into the twin in float64 and
compares:

  BIRKHOFF model init --config TEXT --seed S --out init.safetensors [--optim TEXT]
  BIRKHOFF model grads --ckpt CKPT (--x X.npy | --tokens T.npy) [--len L.npy]
           --labels Y.npy [--ls LS] --out-dir DIR
      -> DIR/logits.npy, DIR/loss.npy, DIR/grads.safetensors
  BIRKHOFF model train --ckpt CKPT (--x X.npy | --tokens T.npy) [--len L.npy]
           --labels Y.npy --steps N [--optim TEXT] [--micro M] [--ls LS]
           --out CKPT2 --losses LOSSES.npy
  (arch=seq2seq: --tgt TGT.npy --tgt-len TL.npy instead of --labels; logits
   [B, tgt_max_len, vocab]; the twin is model_torch.Seq2SeqModel)

Checks (one output line each, with the measured error and its tolerance):

* init (every case): the checkpoint's metadata (format "birkhoff", version,
  seed, optim_step 0, forward_count, checksum), its configuration (every
  requested key round-trips; the twin can be built from it), the parameter
  names, order and shapes against model_torch.param_specs (MODEL.md), and the
  initialisation: LayerNorm weights 1 and biases 0, LOT mass logits 0 exactly;
  Linear weights and biases inside +-1/sqrt(fan_in) and filling it (max > 0.5
  bound); CLS/positions/token table, LOT pivots and OTK references with the
  documented standard deviation (pooled estimate within +-40%: this catches a
  wrong law or scale, not a subtle bias). Once: the same seed gives the same
  bytes, another seed other values.
* grads (softmax; Sinkhorn S = 5 and 4, eps = 1 and 0.5; ESP soft (t = 0.1,
  0.2) and hard, axis slices and seeded slices; LOT r = 3, T = 5; pools cls,
  mean, max, otk (identity map; Nystrom anchors with the 2-D encoding on the
  patch grid in a model without blocks, with the 1-D encoding over padded
  sequences and eta = 0); image, tokens and points inputs, padded batches with a
  length-1 sample; qkv bias, head_dim != dim/heads, no MLP, no CLS / positions
  / final norm, attn_scale, label smoothing): logits, loss and the gradient of
  EVERY parameter against the float64 twin. Entries whose reference gradient
  is exactly zero (token rows used only at padded positions, ...) must also be
  ~0 (|g| <= tol-zero times the tensor's error denominator, below).
* train: N-step trajectories on one batch against the float64 twin started
  from the same checkpoint with the optimiser configuration read back from
  the CLI's output checkpoint (weight decay 0.1 (AdamW), 0.05 (AdamW,
  cosine), 0.01 (Adam), 1e-3 at lr 0.05 (SGD): large enough for decay
  mistakes to show well above the tolerances): AdamW
  with clipping, AdamW on a padded batch, SGD with momentum (and Nesterov +
  clipping), Adam with a step schedule, AdamW with a cosine schedule and
  warm-up, label smoothing, micro-batches (gradient accumulation), and a run
  resumed from an intermediate checkpoint (4 + 6 steps, the second call
  without --optim, so the optimiser state and step count come from the
  checkpoint), the OTK layer with Nystrom anchors (AdamW with the 2-D
  encoding and no blocks; SGD with the 1-D encoding resumed 4 + 6): the
  anchors' renormalisation after every update is part of both sides' step
  (model.post_update in the twin). Compared: the losses step by step, the final weights and the
  optimiser state (m, v or the momentum buffer), tensor by tensor; optim_step
  and the optimiser configuration in the output.
* seq2seq (S2S_GRAD_CASES, S2S_TRAIN_CASES; most run in --quick, ~3 s):
  the encoder-decoder's init checks (names/order/shapes of build_table_s2s,
  the token table and learned positions N(0, 1/dim), LN incl. lnc / enc.norm
  / dec.norm 1/0) and grads parity (logits [B, tgt_max_len, vocab], loss,
  every gradient) for softmax pre-LN with learned positions (full and
  padded), post-LN without final norms with sinusoidal positions, qkv bias
  and ls 0.1, Sinkhorn S = 3 self and cross, ESP soft (axes; seeded slices:
  self 1000 + l, cross 2000 + l), LOT r = 2 in the encoder, diff, unbalanced
  self and cross, no MLP with one block each side, an odd dim (sinusoids'
  zero column); padded batches differ on both sides (a length-1 target and
  a length-1 source). Trajectories: AdamW with sched=invsqrt warmup=3 (6
  steps), the same with --micro 2 on 5 samples (micro-batches weighted by
  their target tokens) and ls 0.1, SGD post-LN resumed 3 + 3.
* files: a checkpoint with one data byte flipped is refused by `model grads`
  (non-zero exit, the message names the checksum or corruption), so are one
  truncated by 64 bytes and one cut inside its header; a checkpoint
  re-serialised by model_torch.write_safetensors (another valid safetensors
  layout of the same content) gives bitwise the same logits and gradients;
  checkpoints written by the twin itself (its own initialisation, AdamW with
  a cosine schedule, optimiser state after 2 steps; a Sinkhorn model and an
  OTK model with the twin's own unit-row anchors) are continued by `model
  train` without --optim for 5 steps exactly as the twin continues them
  (losses, weights, state, optim_step 7).

Error measures. Logits: max|x - ref| / max|ref|; losses: |x - ref| / |ref|.
Tensors (each gradient, final weight, optimiser-state tensor on its own):
max|x - ref| / max(max|ref|, floor * R), R the largest |ref| entry of the
group (all gradients of the case; all weights; one optimiser slot):
  * gradients, floor 1e-3 (--grad-floor): float32 rounding leaves ~1e-8 R of
    noise in every gradient entry whatever the tensor's own size, and some
    tensors are tiny (the last block's LOT pivots and mass logits get
    ~1e-4 R): without the floor the float32 twin itself measures up to 7e-4
    there, with it at most 6e-5. The line also prints the error without the
    floor ("no floor"), and a zero-gradient entry test (--tol-zero);
  * optimiser state: m and the momentum buffer like the gradients, v as
    sqrt(v) (linear in |g|, as Adam uses it);
  * final weights, floor 1e-2 (--weights-floor) of the largest weight: the
    LOT mass logits start at 0 and stay ~1e-3.
Tolerances (defaults; --tol-* override them) and the worst values measured
when they were set (the C engine over --seed 1..8; in brackets the float32
twin on the same cases): logits and loss 1e-5 (1.3e-6 [6e-7]); gradients
1e-4 (4.8e-5 [5.6e-5], both on lot-tokens-otk); zeros 1e-6 (4e-8);
trajectory losses 1e-5 (1.9e-6); final weights 1e-5 with SGD (1.4e-6) and
1e-4 with Adam/AdamW (2.9e-5); optimiser state 1e-4 (8.4e-6).
Adam's weights get the larger tolerance because its normalised update turns
the float32 noise of an entry whose gradient is ~1e-7 R (q/k entries of the
last block that barely matter) into a relative change of its O(lr) step. For
the same reason the Adam trajectories use no LOT model (the mass logits'
gradients, ~1e-4 R, carry ~1e-3 relative float32 noise: a twin-initialised
LOT model measured 4e-4 after 7 AdamW steps; the LOT trajectory uses SGD)
and no qkv bias (its key part has an exactly zero gradient). The
trajectories still detect, by 10x or more, each of these deliberate mistakes
in the twin: weight decay on every tensor, on none, the schedule one step off,
no clipping (checked by mutating the twin).

If the CLI has no `model` command (`BIRKHOFF model --help` fails) the test
prints a SKIP line and exits 0. If torch cannot be imported it SKIPs too,
unless BK_REQUIRE_ORACLE=1 or CI=true. The last line is "N passed, M failed";
the exit status is 1 if anything failed.
"""

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# A tiny model: dim 16, depth 2, 2 heads, MLP 32, 5 classes.
BASE = "dim=16,depth=2,heads=2,mlp_dim=32,classes=5"
IMG8P4 = "input=image,channels=1,image_h=8,image_w=8,patch=4"      # 4 patches
IMG8P2 = "input=image,channels=2,image_h=8,image_w=8,patch=2"      # 16 patches, 2 channels
TOK = "input=tokens,vocab=11,max_len=6"
PTS = "input=points,point_dim=3,max_points=7"
SET_PTS = f"{PTS},cls=0,pos_embed=0"     # a permutation-invariant set model

# name, config overrides, batch, padded, label smoothing, quick
GRAD_CASES = [
    ("softmax-image-cls", f"{IMG8P4},attn=softmax,pool=cls", 3, False, 0.0, True),
    ("softmax-points-max-nocls", f"{PTS},attn=softmax,pool=max,cls=0,pos_embed=0,final_norm=0,"
     "head_dim=6,qkv_bias=1", 4, True, 0.1, True),
    ("softmax-tokens-mean-ls-depth3", f"{TOK},attn=softmax,pool=mean,depth=3", 4, True, 0.2,
     False),
    ("sinkhorn-S5-e1-image-mean", f"{IMG8P2},attn=sinkhorn,sk_iters=5,sk_eps=1,pool=mean", 3,
     False, 0.0, True),
    ("sinkhorn-S4-e0.5-tokens-max", f"{TOK},attn=sinkhorn,sk_iters=4,sk_eps=0.5,pool=max,"
     "qkv_bias=1", 4, True, 0.0, True),
    ("sinkhorn-S5-e0.5-points-otk", f"{PTS},attn=sinkhorn,sk_iters=5,sk_eps=0.5,pool=otk,"
     "otk_refs=2,otk_supports=3,otk_iters=10,otk_eps=0.5", 4, True, 0.0, True),
    ("sinkhorn-S4-e1-tokens-cls-nomlp", f"{TOK},attn=sinkhorn,sk_iters=4,sk_eps=1,pool=cls,"
     "mlp_dim=0,attn_scale=0.3", 3, True, 0.0, False),
    ("unbalanced-S5-r2-image-mean", f"{IMG8P2},attn=unbalanced,sk_iters=5,sk_eps=1,sk_rho=2,"
     "pool=mean", 3, False, 0.0, True),
    ("unbalanced-S4-r0.5-tokens-cls", f"{TOK},attn=unbalanced,sk_iters=4,sk_eps=0.5,sk_rho=0.5,"
     "pool=cls", 4, True, 0.0, True),
    ("esp-soft-image-cls", f"{IMG8P4},attn=esp,esp_soft=1,esp_t=0.1,esp_tau=1,pool=cls", 3,
     False, 0.0, True),
    ("esp-soft-slices5-tokens-mean", f"{TOK},attn=esp,esp_soft=1,esp_t=0.2,esp_tau=2,"
     "esp_slices=5,pool=mean", 4, True, 0.0, False),
    ("esp-hard-image-mean", f"{IMG8P2},attn=esp,esp_soft=0,esp_tau=2,pool=mean", 3, False, 0.0,
     True),
    ("esp-hard-points-cls", f"{PTS},attn=esp,esp_soft=0,esp_tau=1,pool=cls", 4, True, 0.0,
     False),
    ("lot-image-cls", f"{IMG8P4},attn=lot,lot_r=3,lot_iters=5,lot_eps=1,lot_temp=1,pool=cls", 3,
     False, 0.0, True),
    ("lot-tokens-otk", f"{TOK},attn=lot,lot_r=3,lot_iters=5,lot_eps=0.5,lot_temp=0.5,pool=otk,"
     "otk_refs=1,otk_supports=4,otk_iters=20,otk_eps=0.5", 4, True, 0.0, True),
    ("lot-points-max", f"{PTS},attn=lot,lot_r=3,lot_iters=5,lot_eps=1,lot_temp=2,pool=max", 3,
     True, 0.1, False),
    ("diff-image-cls", f"{IMG8P4},attn=diff,pool=cls,qkv_bias=1", 3, False, 0.0, True),
    ("diff-tokens-mean-depth3", f"{TOK},attn=diff,pool=mean,depth=3,head_dim=6,attn_scale=0.4", 4,
     True, 0.1, True),
    # LOTFormer's ViT ingredients: the [CLS] row (softmax, Pol-[CLS]) and the DWC branch
    ("lot-vit-pol-dwc-image", f"{IMG8P2},attn=lot,lot_r=3,lot_iters=5,cls_attn=pol,dwc=1,pool=cls",
     3, False, 0.0, True),
    ("lot-vit-clssoftmax-dwc5-image", f"{IMG8P2},attn=lot,lot_r=3,lot_iters=4,cls_attn=softmax,dwc=1,"
     "dwc_kernel=5,pool=mean", 3, False, 0.1, True),
    ("lot-vit-pol3-tokens", f"{TOK},attn=lot,lot_r=2,cls_attn=pol,pol_ps=3,pol_po=1.5,pool=mean", 4,
     True, 0.0, True),
    # lot_learn: the pivots alone (uniform masses), or neither (LOTFormer Table 6's fixed pivots)
    ("lot-learn-z-tokens", f"{TOK},attn=lot,lot_r=3,lot_iters=5,lot_learn=z,pool=mean", 4, True,
     0.0, True),
    ("lot-learn-none-image", f"{IMG8P4},attn=lot,lot_r=3,lot_iters=4,lot_learn=none,pool=cls", 3,
     False, 0.0, False),
    # Set Transformer blocks: ISAB (inducing points), PMA pooling (seeds, rFF), SAB + PMA
    ("set-isab-pma-softmax-points", f"{SET_PTS},set_block=isab,set_inducing=3,pool=pma", 4, True,
     0.0, True),
    ("set-isab-sinkhorn-pma2-sinkhorn-points", f"{SET_PTS},set_block=isab,set_inducing=4,"
     "attn=sinkhorn,sk_iters=3,pool=pma,pma_seeds=2,pma_attn=sinkhorn", 4, True, 0.0, True),
    ("set-isab-esp-slices-pma-esp-points", f"{SET_PTS},set_block=isab,set_inducing=3,attn=esp,"
     "esp_t=0.2,esp_slices=3,pool=pma,pma_seeds=2,pma_attn=esp", 4, True, 0.0, True),
    ("set-isab-unbalanced-tokens-mean-bias-ls", f"{TOK},set_block=isab,set_inducing=2,"
     "attn=unbalanced,sk_iters=4,sk_rho=2,pool=mean,qkv_bias=1", 4, True, 0.1, True),
    ("set-sab-pma3-nomlp-image", f"{IMG8P4},attn=softmax,cls=0,pool=pma,pma_seeds=3,mlp_dim=0",
     3, False, 0.0, True),
    # (3 seeds: with one, a Sinkhorn PMA's plan is uniform whatever its queries, whose gradient is
    # then exactly 0 in float64 and float32 noise in the engine: test_birkhoff set checks that)
    ("set-sab-sinkhorn-pma3-sinkhorn-points-headdim", f"{SET_PTS},attn=sinkhorn,sk_iters=4,"
     "head_dim=6,pool=pma,pma_seeds=3,pma_attn=sinkhorn", 4, True, 0.0, False),
    ("set-isab-depth1-nomlp-esp-hard-cls", f"{PTS},set_block=isab,set_inducing=5,depth=1,mlp_dim=0,"
     "attn=esp,esp_soft=0,esp_tau=2,pool=cls", 3, True, 0.0, False),
    # the supervised OTK layer: Nystrom anchors (dW through the map and its inverse square
    # root), the 2-D encoding on the 4 x 4 patch grid with no blocks at all (the paper's
    # "OTK layer + linear classifier"), the 1-D encoding over padded sequences, eta = 0
    ("otk-nystrom-pe2d-image-depth0", f"{IMG8P2},depth=0,cls=0,pool=otk,otk_anchors=6,"
     "otk_supports=4,otk_pe=2d,otk_sigma_pos=0.3,otk_sigma=0.6", 3, False, 0.0, True),
    ("otk-nystrom-pe1d-sinkhorn-tokens", f"{TOK},attn=sinkhorn,sk_iters=4,pool=otk,otk_anchors=5,"
     "otk_refs=2,otk_supports=3,otk_iters=10,otk_pe=1d,otk_sigma_pos=0.5,otk_eta=0", 4, True, 0.0,
     True),
    ("otk-nystrom-points-ls", f"{PTS},attn=softmax,pool=otk,otk_anchors=4,otk_supports=2,"
     "otk_eps=1,otk_sigma=0.4", 4, True, 0.1, False),
]

# name, config overrides, batch, padded, optimiser, steps, micro, ls, resume split, quick
ADAMW = "kind=adamw,lr=1e-3,beta1=0.9,beta2=0.999,eps=1e-8,weight_decay=0.1"
COSINE = ("kind=adamw,lr=3e-3,weight_decay=0.05,sched=cosine,warmup=3,total_steps=8,"
          "lr_min=1e-4")
TRAIN_CASES = [
    ("adamw-clip-softmax-image", f"{IMG8P4},attn=softmax,pool=cls", 4, False,
     f"{ADAMW},clip=1", 10, 0, 0.0, None, True),
    ("adamw-sinkhorn-tokens-padded", f"{TOK},attn=sinkhorn,sk_iters=5,sk_eps=1,pool=cls", 4,
     True, ADAMW, 10, 0, 0.0, None, False),
    ("sgd-momentum-lot-image", f"{IMG8P4},attn=lot,lot_r=3,lot_iters=5,pool=cls", 4, False,
     "kind=sgd,lr=0.05,momentum=0.9,weight_decay=1e-3", 10, 0, 0.0, None, True),
    ("sgd-nesterov-clip-softmax-points", f"{PTS},attn=softmax,pool=mean", 4, True,
     "kind=sgd,lr=0.05,momentum=0.9,nesterov=1,weight_decay=1e-3,clip=0.5", 10, 0, 0.0, None,
     False),
    ("adam-step-sinkhorn-image", f"{IMG8P2},attn=sinkhorn,sk_iters=4,sk_eps=0.5,pool=mean", 3,
     False, "kind=adam,lr=1e-3,weight_decay=0.01,sched=step,milestones=3:6,gamma=0.5", 10, 0,
     0.0, None, False),
    ("adamw-cosine-warmup-softmax-tokens", f"{TOK},attn=softmax,pool=cls", 4, True, COSINE, 10,
     0, 0.0, None, True),
    ("adamw-ls0.1-esp-soft-image", f"{IMG8P4},attn=esp,esp_soft=1,esp_t=0.1,esp_tau=1,pool=cls",
     4, False, ADAMW, 10, 0, 0.1, None, True),
    ("adamw-micro2-softmax-points-otk", f"{PTS},attn=softmax,pool=otk,otk_supports=3", 4, True,
     ADAMW, 10, 2, 0.0, None, True),
    ("adamw-cosine-resume-4+6-sinkhorn-image", f"{IMG8P4},attn=sinkhorn,sk_iters=5,pool=cls", 4,
     False, COSINE, 10, 0, 0.0, 4, True),
    ("sgd-momentum-diff-tokens-padded", f"{TOK},attn=diff,pool=mean", 4, True,
     "kind=sgd,lr=0.05,momentum=0.9,weight_decay=1e-3", 10, 0, 0.0, None, True),
    ("sgd-momentum-lot-vit-pol-dwc-image", f"{IMG8P2},attn=lot,lot_r=3,cls_attn=pol,dwc=1,pool=cls",
     4, False, "kind=sgd,lr=0.05,momentum=0.9,weight_decay=1e-3", 10, 0, 0.0, None, True),
    # (SGD as the LOT case above: Adam's 1/sqrt(v) magnifies the float32 rounding of LOT's
    # near-zero gradients past the weights' tolerance, with or without lot_learn)
    ("sgd-clip-lot-learn-none-tokens", f"{TOK},attn=lot,lot_r=3,lot_learn=none,pool=mean", 4,
     True, "kind=sgd,lr=0.05,momentum=0.9,weight_decay=1e-3,clip=1", 10, 0, 0.0, None, True),
    # Set Transformer: ISAB + PMA. Doubly-stochastic attention has gauge directions whose
    # gradient is ~0: a one-seed Sinkhorn PMA is mean pooling (its query weights), and a Sinkhorn
    # ISAB's first MAB nearly absorbs a shift shared by its inducing-point queries (their
    # LayerNorm bias: a per-key score shift, which the column steps cancel). Adam turns the
    # float32 noise of such gradients into full steps (1.6e-4 on the AVX2 path against 1e-6
    # elsewhere), so the AdamW run takes softmax ISAB and PMA, and the Sinkhorn ones train with SGD
    # (one resumed 5 + 5 from a checkpoint)
    ("adamw-set-isab-softmax-pma-points-padded", f"{SET_PTS},set_block=isab,set_inducing=3,"
     "attn=softmax,pool=pma", 4, True, ADAMW, 10, 0, 0.0, None, True),
    ("sgd-set-isab-sinkhorn-pma-points-padded", f"{SET_PTS},set_block=isab,set_inducing=3,"
     "attn=sinkhorn,sk_iters=3,pool=pma", 4, True, "kind=sgd,lr=0.05,momentum=0.9,weight_decay=1e-3",
     10, 0, 0.0, None, True),
    ("sgd-set-isab-esp-pma-sinkhorn-resume-5+5", f"{SET_PTS},set_block=isab,set_inducing=3,attn=esp,"
     "esp_t=0.2,pool=pma,pma_attn=sinkhorn,sk_iters=3", 4, True,
     "kind=sgd,lr=0.05,momentum=0.9,weight_decay=1e-3", 10, 0, 0.0, 5, True),
    # the supervised OTK layer: every step renormalises the anchors (bk_optim_step)
    ("adamw-otk-nystrom-pe2d-image-depth0", f"{IMG8P2},depth=0,cls=0,pool=otk,otk_anchors=6,"
     "otk_supports=4,otk_pe=2d,otk_sigma_pos=0.3", 4, False, f"{ADAMW},lr=1e-2", 10, 0, 0.0, None,
     True),
    ("sgd-otk-nystrom-pe1d-tokens-resume-4+6", f"{TOK},attn=softmax,pool=otk,otk_anchors=5,"
     "otk_supports=3,otk_pe=1d,otk_sigma_pos=0.5", 4, True,
     "kind=sgd,lr=0.1,momentum=0.9,weight_decay=1e-3", 10, 0, 0.0, 4, True),
]

# The encoder-decoder (arch=seq2seq): joint vocabulary of 13 ids (bos 1, eos
# 2), sources of up to 6 tokens, targets of up to 5, 2 + 2 blocks.
S2S = ("arch=seq2seq,input=tokens,vocab=13,max_len=6,tgt_max_len=5,dec_depth=2,bos=1,eos=2,"
       "pos_embed=1")
# name, config overrides, batch, padded, label smoothing, quick (the grads
# cases of GRAD_CASES' shape; the batch: random_seq2seq_batch, padded on both
# sides with one length-1 target and one length-1 source)
S2S_GRAD_CASES = [
    ("s2s-softmax-preln-learned", f"{S2S},attn=softmax,cross_attn=softmax", 3, False, 0.0, True),
    ("s2s-softmax-preln-padded", f"{S2S},attn=softmax,cross_attn=softmax", 4, True, 0.0, True),
    ("s2s-postln-nofinal-sin-bias-ls", f"{S2S},post_ln=1,final_norm=0,pos_embed=2,qkv_bias=1",
     4, True, 0.1, True),
    ("s2s-sinkhorn-S3", f"{S2S},attn=sinkhorn,cross_attn=sinkhorn,sk_iters=3", 4, True, 0.0,
     True),
    ("s2s-esp-t0.2", f"{S2S},attn=esp,cross_attn=esp,esp_t=0.2", 4, True, 0.0, True),
    ("s2s-esp-slices3-nopos", f"{S2S},attn=esp,cross_attn=esp,esp_t=0.2,esp_slices=3,"
     "pos_embed=0", 3, True, 0.0, False),
    ("s2s-lot-r2", f"{S2S},attn=lot,lot_r=2", 4, True, 0.0, True),
    ("s2s-diff", f"{S2S},attn=diff", 4, True, 0.1, True),
    ("s2s-unbalanced", f"{S2S},attn=unbalanced,cross_attn=unbalanced,sk_rho=2", 4, True, 0.0,
     True),
    ("s2s-nomlp-depth1-dec1", f"{S2S},mlp_dim=0,depth=1,dec_depth=1", 4, True, 0.0, True),
    ("s2s-postln-sinkhorn-cross-headdim", f"{S2S},post_ln=1,cross_attn=sinkhorn,sk_iters=4,"
     "head_dim=6,attn_scale=0.4", 3, True, 0.0, False),
    ("s2s-odd-dim9-sin-esp-cross", f"{S2S},dim=9,head_dim=4,pos_embed=2,cross_attn=esp,"
     "esp_t=0.2,esp_tau=2", 4, True, 0.0, False),
]
INVSQRT = f"{ADAMW},sched=invsqrt,warmup=3"
# name, config overrides, batch, padded, optimiser, steps, micro, ls, resume split, quick
S2S_TRAIN_CASES = [
    ("s2s-adamw-invsqrt-warmup3", f"{S2S},attn=softmax", 4, True, INVSQRT, 6, 0, 0.0, None,
     True),
    ("s2s-adamw-micro2-tokens-weighted", f"{S2S},attn=sinkhorn,cross_attn=sinkhorn,sk_iters=3",
     5, True, INVSQRT, 6, 2, 0.1, None, True),
    ("s2s-sgd-postln-resume-3+3", f"{S2S},post_ln=1,pos_embed=2", 4, True,
     "kind=sgd,lr=0.05,momentum=0.9,weight_decay=1e-3", 6, 0, 0.0, 3, False),
]

# Standard deviations of the N(0, 0.02^2) initialisations (MODEL.md)
INIT_STD = {"cls": 0.02, "pos": 0.02, "embed.table": 0.02}
# seq2seq: the token table and the learned positions N(0, 1/dim) (fairseq's)
S2S_INIT_STD = ("embed.table", "enc.pos", "dec.pos")


def import_twin():
    """numpy, torch and the twin; SKIP (or fail) when torch is missing."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_guard import require_torch
    require_torch()
    import torch
    sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
    import model_torch
    torch.set_num_threads(1)
    return model_torch


def case_seed(base, name):
    """A per-case model/data seed: the same whatever subset of cases runs."""
    return base * 100003 + zlib.crc32(name.encode()) % 100000


def cli_has_model(cli):
    """(True, "") when `cli model --help` succeeds, else (False, why)."""
    try:
        p = subprocess.run([cli, "model", "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"could not run `{cli} model --help`: {e}"
    if p.returncode == 0:
        return True, ""
    first = (p.stderr.strip() or p.stdout.strip() or "no output").splitlines()[0]
    return False, f"`{cli} model --help` exited with status {p.returncode} ({first})"


class Runner:
    """Runs CLI commands; counts and prints the checks."""

    def __init__(self, cli):
        self.cli = cli
        self.passed = self.failed = 0
        self.worst = {}

    def run(self, args):
        """(ok, output text); output = stderr + stdout."""
        cmd = [self.cli] + [str(a) for a in args]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f"could not run: {e}\n  command: {' '.join(cmd)}"
        text = (p.stderr.strip() + "\n" + p.stdout.strip()).strip()
        if p.returncode != 0:
            return False, (f"exit status {p.returncode}\n  command: {' '.join(cmd)}\n"
                           f"  output: {text}")
        return True, text

    def check(self, ok, label, detail):
        self.passed += bool(ok)
        self.failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {label:58s} {detail}", flush=True)
        return ok

    def note(self, key, err):
        self.worst[key] = max(self.worst.get(key, 0.0), err)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
def rel_err(x, ref, floor=0.0):
    """max|x - ref| / max(max|ref|, floor) (1 when both are 0); inf for a shape
    mismatch or non-finite x."""
    import numpy as np
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if x.shape != ref.shape or not np.all(np.isfinite(x)):
        return float("inf")
    if x.size == 0:
        return 0.0
    den = max(float(np.abs(ref).max()), floor) or 1.0
    return float(np.abs(x - ref).max()) / den


def zero_err(x, ref, floor=0.0):
    """Largest |x| where ref is exactly zero, over the same denominator as
    rel_err (0 if ref has no zero)."""
    import numpy as np
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if x.shape != ref.shape:
        return float("inf")
    z = ref == 0
    if not z.any():
        return 0.0
    den = max(float(np.abs(ref).max()), floor) or 1.0
    return float(np.abs(x[z]).max()) / den


def tensor_errors(got, ref, names, floor=0.0):
    """{name: (error, structural-zero error, raw error)} per tensor.

    error: max|x - ref| / max(max|ref|, floor * R) with R the largest |ref|
    entry over all the tensors (the case's largest gradient); raw: the same
    without the floor. A tensor whose reference is all zero is measured
    against floor * R, or R when floor is 0.
    """
    import numpy as np
    big = max([float(np.abs(ref[n]).max()) for n in names] + [0.0]) or 1.0
    fl = floor * big if floor > 0 else 0.0
    out = {}
    for n in names:
        if n not in got:
            out[n] = (float("inf"), float("inf"), float("inf"))
            continue
        allzero = not np.any(ref[n])
        f = fl if fl > 0 or not allzero else big
        out[n] = (rel_err(got[n], ref[n], f), zero_err(got[n], ref[n], f),
                  rel_err(got[n], ref[n], 0.0 if not allzero else big))
    return out


def worst_of(errs, idx=0):
    """(name, error) of the largest error."""
    if not errs:
        return ("-", 0.0)
    n = max(errs, key=lambda k: errs[k][idx])
    return n, errs[n][idx]


def f32_equal(a, b):
    """Configuration values equal after float32 rounding (C stores floats)."""
    import numpy as np
    if isinstance(a, float) or isinstance(b, float):
        return np.float32(a) == np.float32(b)
    return a == b


# ---------------------------------------------------------------------------
# Inputs, CLI calls, the twin
# ---------------------------------------------------------------------------
def write_batch(mt, cfg, B, padded, seed, d):
    """Random batch as .npy files; returns (batch dict, CLI arguments)."""
    import numpy as np
    batch = mt.random_batch(cfg, B, np.random.default_rng(seed), padded)
    args = []
    for key, flag in (("x", "--x"), ("tokens", "--tokens"), ("lengths", "--len"),
                      ("labels", "--labels"), ("tgt", "--tgt"), ("tgt_len", "--tgt-len")):
        if batch.get(key) is not None:
            path = os.path.join(d, key + ".npy")
            np.save(path, batch[key])
            args += [flag, path]
    return batch, args


def twin_grads(mt, path, batch, ls, dtype):
    """Logits, loss and {name: grad} of the twin loaded from path."""
    import torch
    model, _, _ = mt.load_checkpoint(path, dtype=dtype)
    logits, loss = mt.model_loss(model, batch, ls)
    loss.backward()
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().numpy()
             for n, p in model.ordered_parameters()}
    return logits.detach().numpy(), float(loss.detach()), grads


def cli_init(rn, text, seed, path, optim=None):
    """Runs `model init`; (ok, output)."""
    args = ["model", "init", "--config", text, "--seed", seed, "--out", path]
    if optim:
        args += ["--optim", optim]
    return rn.run(args)


def cli_grads(rn, mt, ckpt, data_args, ls, out_dir):
    """Runs `model grads`; returns ((logits, loss, grads), None) or (None, message)."""
    import numpy as np
    args = ["model", "grads", "--ckpt", ckpt] + data_args + ["--out-dir", out_dir]
    if ls:
        args += ["--ls", repr(ls)]
    ok, msg = rn.run(args)
    if not ok:
        return None, msg
    try:
        logits = np.load(os.path.join(out_dir, "logits.npy"))
        loss = np.load(os.path.join(out_dir, "loss.npy"))
        grads, _ = mt.read_safetensors(os.path.join(out_dir, "grads.safetensors"))
    except Exception as e:
        return None, f"unreadable output ({type(e).__name__}: {e})"
    if loss.shape != (1,):
        return None, f"loss.npy has shape {loss.shape}, expected (1,)"
    return (logits, float(loss[0]), grads), None


# ---------------------------------------------------------------------------
# init checks
# ---------------------------------------------------------------------------
def init_problems(mt, text, seed, tensors, meta):
    """Problems with an init checkpoint (list of strings) and the config."""
    import numpy as np
    probs = []
    for key in ("format", "version", "config", "optim_step", "seed", "forward_count", "checksum"):
        if key not in meta:
            probs.append(f"metadata has no {key!r}")
    if meta.get("format") != "birkhoff":
        probs.append(f"format {meta.get('format')!r}")
    if meta.get("seed") not in (None, str(seed)):
        probs.append(f"seed {meta.get('seed')!r}, expected {seed}")
    if meta.get("optim_step") not in (None, "0"):
        probs.append(f"optim_step {meta.get('optim_step')!r}, expected 0")
    try:
        cfg = mt.resolve_config(mt.parse_config(meta.get("config", "")))
        mt.check_config(cfg)
    except ValueError as e:
        return probs + [f"config: {e}"], None
    # (the attention sites' parameters are written for the sites' own kinds only)
    missing = sorted(set(mt.CONFIG_DEFAULTS) - set(mt.parse_config(meta.get("config", ""))) - mt.SITE_OLD_KEYS)
    if missing:
        probs.append(f"config lacks keys {missing}")
    for k, v in mt.parse_config(text).items():
        if not f32_equal(cfg.get(k), v):
            probs.append(f"config {k}={cfg.get(k)!r}, requested {v!r}")
    specs = mt.param_specs(cfg)
    names = [n for n in tensors if not n.startswith("optim.")]
    if names != [n for n, _, _ in specs]:
        probs.append(f"parameter names/order {names}, expected {[n for n, _, _ in specs]}")
    for n, shape, _ in specs:
        if n in tensors and tuple(tensors[n].shape) != tuple(shape):
            probs.append(f"{n}: shape {tuple(tensors[n].shape)}, expected {tuple(shape)}")
        if n in tensors and tensors[n].dtype != np.float32:
            probs.append(f"{n}: dtype {tensors[n].dtype}, expected float32")
    if probs:
        return probs, cfg
    # Initialisation laws.
    pooled = {}
    shapes = {m: s for m, s, _ in specs}
    for n, _, _ in specs:
        a = tensors[n].astype(np.float64)
        leaf = n.rsplit(".", 1)[-1]
        parent = n.rsplit(".", 1)[0] if "." in n else ""
        is_norm = parent.endswith(("ln1", "ln2", "lnc", "lnk")) or parent in ("norm", "enc.norm",
                                                                               "dec.norm")
        s2s = cfg["arch"] == "seq2seq"
        if is_norm:
            want = 1.0 if leaf == "weight" else 0.0
            if not np.all(a == want):
                probs.append(f"{n}: LayerNorm {leaf} not all {want:g}")
        elif n.endswith("lot_theta"):
            if not np.all(a == 0):
                probs.append(f"{n}: LOT mass logits not all 0")
        elif n == "pool.otk_w":
            # unit rows, distinct (drawn uniformly on the sphere)
            dev = float(np.abs(np.sqrt((a ** 2).sum(1)) - 1).max())
            if dev > 1e-6:
                probs.append(f"{n}: anchors not unit rows (|norm - 1| up to {dev:.2e})")
            if len(np.unique(a, axis=0)) != len(a):
                probs.append(f"{n}: repeated anchors")
        elif leaf in ("weight", "bias"):
            fan_in = int(np.prod(shapes[parent + ".weight"][1:]))   # (a DWC kernel: k * k)
            bound = fan_in ** -0.5
            amax = float(np.abs(a).max())
            if amax > bound * (1 + 1e-6):
                probs.append(f"{n}: max |w| {amax:.4g} > 1/sqrt({fan_in}) = {bound:.4g}")
            if a.size >= 16 and amax < 0.5 * bound:
                probs.append(f"{n}: max |w| {amax:.4g} < half of 1/sqrt({fan_in})")
        else:
            std = (cfg["dim"] ** -0.5 if s2s and n in S2S_INIT_STD
                   else 0.02 if not s2s and n in INIT_STD else 1.0 if n.endswith("lot_z")
                   else 0.1 if leaf.startswith("diff_l")
                   else mt.otk_dim(cfg) ** -0.5 if n == "pool.otk_z"
                   else cfg["dim"] ** -0.5 if n == "pool.seeds" or leaf == "inducing" else None)
            if std is None:
                probs.append(f"{n}: no initialisation law known to the test")
                continue
            acc = pooled.setdefault(std, [0.0, 0])
            acc[0] += float((a ** 2).sum())
            acc[1] += a.size
    for std, (ss, cnt) in pooled.items():
        est = (ss / cnt) ** 0.5
        if not 0.6 * std <= est <= 1.4 * std:
            probs.append(f"tensors of std {std:g}: pooled estimate {est:.4g} (n = {cnt})")
    return probs, cfg


# ---------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------
def run_grads_case(rn, mt, case, tols, tmp, seed):
    """One grads case: init checks, then logits/loss/gradients vs the twin."""
    import numpy as np
    import torch
    name, over, B, padded, ls, _ = case
    text = f"{BASE},{over}"
    ckpt = os.path.join(tmp, "init.safetensors")
    ok, msg = cli_init(rn, text, seed, ckpt)
    if not ok:
        rn.check(False, f"init  {name}", msg)
        return None
    try:
        tensors, meta = mt.read_safetensors(ckpt)
    except ValueError as e:
        rn.check(False, f"init  {name}", f"checkpoint unreadable by the twin: {e}")
        return None
    probs, cfg = init_problems(mt, text, seed, tensors, meta)
    rn.check(not probs, f"init  {name}",
             "; ".join(probs) if probs else
             f"{len(tensors)} tensors, {sum(t.size for t in tensors.values())} floats, "
             f"names/shapes/metadata/laws as MODEL.md")
    if probs:
        return None
    batch, data_args = write_batch(mt, cfg, B, padded, seed, tmp)
    got, msg = cli_grads(rn, mt, ckpt, data_args, ls, os.path.join(tmp, "grads"))
    if got is None:
        rn.check(False, f"grads {name}", msg)
        return None
    ref = twin_grads(mt, ckpt, batch, ls, torch.float64)
    r32 = twin_grads(mt, ckpt, batch, ls, torch.float32)
    names = list(ref[2])
    e_log = rel_err(got[0], ref[0])
    e_loss = abs(got[1] - ref[1]) / abs(ref[1])
    ge = tensor_errors(got[2], ref[2], names, tols["floor"])
    ge32 = tensor_errors(r32[2], ref[2], names, tols["floor"])
    extra = sorted(set(got[2]) - set(names))
    wn, wg = worst_of(ge)
    zn, wz = worst_of(ge, 1)
    raw_name, wr = worst_of(ge, 2)
    _, w32 = worst_of(ge32)
    e32 = (rel_err(r32[0], ref[0]), abs(r32[1] - ref[1]) / abs(ref[1]))
    for key, val in (("grads logits", e_log), ("grads loss", e_loss), ("grads params", wg),
                     ("grads zeros", wz), ("grads params (no floor)", wr),
                     ("f32 twin logits", e32[0]), ("f32 twin loss", e32[1]),
                     ("f32 twin params", w32)):
        rn.note(key, val)
    rn.check(e_log <= tols["logits"] and e_loss <= tols["logits"], f"fwd   {name}",
             f"logits {e_log:.1e} loss {e_loss:.1e} (tol {tols['logits']:g}) "
             f"| f32 twin {e32[0]:.1e}/{e32[1]:.1e}")
    bad = [n for n in names if not (ge[n][0] <= tols["grad"] and ge[n][1] <= tols["zero"])]
    detail = (f"{len(names)} tensors, worst {wg:.1e} [{wn}] (tol {tols['grad']:g}), "
              f"zeros {wz:.1e} (tol {tols['zero']:g}) | no floor {wr:.1e} [{raw_name}], "
              f"f32 twin {w32:.1e}")
    if extra:
        detail += f"; unexpected tensors {extra}"
    rn.check(not bad and not extra, f"grads {name}", detail)
    for n in bad:
        print(f"       {n}: error {ge[n][0]:.2e}, zeros {ge[n][1]:.2e}, no floor {ge[n][2]:.2e}, "
              f"shape {tuple(np.shape(got[2].get(n, ())))}, f32 twin {ge32[n][0]:.1e}")
    return ckpt, data_args, got, ls


def twin_trajectory(mt, ckpt, batch, ocfg, steps, micro, ls):
    """The float64 twin's N steps from ckpt: (losses, model, optimiser)."""
    import torch
    model, _, _ = mt.load_checkpoint(ckpt, dtype=torch.float64)
    opt = mt.make_optimizer(model, ocfg)
    losses = [mt.train_step(model, opt, ocfg, i, batch, ls, micro)[0] for i in range(steps)]
    return losses, model, opt


def optim_problems(mt, text, meta, steps):
    """Problems with an output checkpoint's optimiser metadata; and its config."""
    probs = []
    if meta.get("optim_step") != str(steps):
        probs.append(f"optim_step {meta.get('optim_step')!r}, expected {steps}")
    try:
        written = mt.parse_optim(meta.get("optim", ""))
        ocfg = mt.resolve_optim(written)
    except ValueError as e:
        return probs + [f"optim metadata: {e}"], None
    missing = sorted(set(mt.OPTIM_DEFAULTS) - set(written))
    if missing:
        probs.append(f"optim metadata lacks keys {missing}")
    for k, v in mt.parse_optim(text).items():
        if not (f32_equal(ocfg[k], v) if k != "milestones" else tuple(ocfg[k]) == tuple(v)):
            probs.append(f"optim {k}={ocfg[k]!r}, requested {v!r}")
    return probs, ocfg


def run_train_case(rn, mt, case, tols, tmp, seed):
    import numpy as np
    name, over, B, padded, otext, steps, micro, ls, split, _ = case
    text = f"{BASE},{over}"
    ckpt = os.path.join(tmp, "init.safetensors")
    ok, msg = cli_init(rn, text, seed, ckpt)
    if not ok:
        rn.check(False, f"init  {name}", msg)
        return
    tensors, meta = mt.read_safetensors(ckpt)
    probs, cfg = init_problems(mt, text, seed, tensors, meta)
    if probs:
        rn.check(False, f"init  {name}", "; ".join(probs))
        return
    batch, data_args = write_batch(mt, cfg, B, padded, seed, tmp)
    common = data_args + (["--micro", micro] if micro else []) + (["--ls", repr(ls)] if ls else [])
    segments = [steps] if split is None else [split, steps - split]
    cur, losses, total = ckpt, [], 0
    for i, n in enumerate(segments):
        out = os.path.join(tmp, f"train{i}.safetensors")
        lpath = os.path.join(tmp, f"losses{i}.npy")
        args = ["model", "train", "--ckpt", cur, "--steps", n, "--out", out, "--losses", lpath]
        if i == 0:
            args += ["--optim", otext]
        ok, msg = rn.run(args + common)
        if not ok:
            rn.check(False, f"train {name}", msg)
            return
        total += n
        try:
            lo = np.load(lpath)
            t2, m2 = mt.read_safetensors(out)
        except Exception as e:
            rn.check(False, f"train {name}", f"unreadable output ({type(e).__name__}: {e})")
            return
        if lo.shape != (n,):
            rn.check(False, f"train {name}", f"losses shape {lo.shape}, expected ({n},)")
            return
        losses += [float(v) for v in lo]
        p, ocfg = optim_problems(mt, otext, m2, total)
        if m2.get("config") is not None and mt.parse_config(m2["config"]) != \
                mt.parse_config(meta["config"]):
            p.append("config changed by training")
        if p:
            rn.check(False, f"train {name}", f"segment {i}: " + "; ".join(p))
            return
        cur = out
    ref_losses, model, opt = twin_trajectory(mt, ckpt, batch, ocfg, steps, micro, ls)
    compare_trajectory(rn, mt, name, tols, ocfg, losses, ref_losses, t2, model, opt)


def compare_trajectory(rn, mt, name, tols, ocfg, losses, ref_losses, t2, model, opt):
    """Losses, final weights and optimiser state (t2: the CLI's output
    checkpoint tensors) against the twin's model and optimiser."""
    import numpy as np
    steps = len(ref_losses)
    e_loss = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    rn.note("train losses", e_loss)
    rn.check(e_loss <= tols["traj_loss"], f"loss  {name}",
             f"{steps} steps, max rel {e_loss:.1e} (tol {tols['traj_loss']:g}); losses "
             f"{ref_losses[0]:.4f} -> {ref_losses[-1]:.4f}")
    ref_w = model.tensors(np.float64)
    we = tensor_errors(t2, ref_w, list(ref_w), tols["w_floor"])
    wn, ww = worst_of(we)
    adam = ocfg["kind"] in ("adam", "adamw")
    tol_w = tols["traj_w_adam"] if adam else tols["traj_w"]
    rn.note("train weights (Adam)" if adam else "train weights (SGD)", ww)
    extra = sorted(n for n in t2 if not n.startswith("optim.") and n not in ref_w)
    rn.check(ww <= tol_w and not extra, f"wts   {name}",
             f"worst {ww:.1e} [{wn}] (tol {tol_w:g})"
             + (f"; unexpected tensors {extra}" if extra else ""))
    ref_s = mt.optimizer_state(opt, model, ocfg)
    se = {}
    for slot in sorted({k.split(".")[1] for k in ref_s}):
        keys = [k for k in ref_s if k.split(".")[1] == slot]
        tr = np.sqrt if slot == "v" else (lambda a: a)   # v as sqrt(v): linear in |g|
        g2 = {k: tr(np.maximum(np.asarray(t2[k], np.float64), 0) if slot == "v" else t2[k])
              for k in keys if k in t2}
        se.update(tensor_errors(g2, {k: tr(ref_s[k]) for k in keys}, keys, tols["floor"]))
    sn, ws = worst_of(se)
    rn.note("train optimiser state", ws)
    # (SGD without momentum: torch keeps no buffer, so none is compared.)
    extra = sorted(n for n in t2 if n.startswith("optim.") and n not in ref_s
                   and not (ocfg["kind"] == "sgd" and ocfg["momentum"] == 0))
    rn.check(ws <= tols["traj_state"] and not extra, f"state {name}",
             f"{len(ref_s)} tensors, worst {ws:.1e} [{sn}] (tol {tols['traj_state']:g})"
             + (f"; unexpected tensors {extra}" if extra else ""))


# name, config overrides, padded: checkpoints written by the twin, continued by the CLI
TWIN_CASES = [
    ("twin-written-sinkhorn-tokens-cosine", f"{TOK},attn=sinkhorn,sk_iters=4,pool=cls,qkv_bias=0",
     True),
    # the twin's own anchors (torch's draw, renormalised) and 2 renormalising steps
    ("twin-written-otk-nystrom-pe2d-cosine", f"{IMG8P2},depth=1,cls=0,pool=otk,otk_anchors=6,"
     "otk_supports=4,otk_pe=2d,otk_sigma_pos=0.3", False),
]


def run_twin_checkpoint_check(rn, mt, tols, tmp, seed, case):
    """A checkpoint written by the twin (its own initialisation and 2 AdamW
    steps of optimiser state) is continued by `model train` (no --optim) as
    the twin continues it."""
    import numpy as np
    import torch
    name, over, padded = case
    cfg = mt.resolve_config(f"{BASE},{over}")
    ocfg = mt.resolve_optim(COSINE)
    torch.manual_seed(seed)
    model = mt.Model(cfg).double()
    opt = mt.make_optimizer(model, ocfg)
    batch, data_args = write_batch(mt, cfg, 4, padded, seed, tmp)
    for i in range(2):
        mt.train_step(model, opt, ocfg, i, batch)
    ckpt = os.path.join(tmp, "twin.safetensors")
    mt.save_checkpoint(ckpt, model, opt, ocfg, optim_step=2, seed=seed)
    out, lpath = os.path.join(tmp, "cont.safetensors"), os.path.join(tmp, "losses.npy")
    ok, msg = rn.run(["model", "train", "--ckpt", ckpt, "--steps", 5, "--out", out,
                      "--losses", lpath] + data_args)
    if not ok:
        rn.check(False, f"train {name}", msg)
        return
    t2, m2 = mt.read_safetensors(out)
    probs, _ = optim_problems(mt, COSINE, m2, 7)
    if probs:
        rn.check(False, f"train {name}", "; ".join(probs))
        return
    model, tensors, _ = mt.load_checkpoint(ckpt, dtype=torch.float64)
    opt = mt.make_optimizer(model, ocfg, tensors, 2)
    ref = [mt.train_step(model, opt, ocfg, 2 + i, batch)[0] for i in range(5)]
    losses = [float(v) for v in np.load(lpath)]
    compare_trajectory(rn, mt, name, tols, ocfg, losses, ref, t2, model, opt)


def run_file_checks(rn, mt, tmp, ckpt, data_args, ref, ls=0.0):
    """Corrupt / truncated checkpoints are refused; a re-serialised one loads
    (and, with the label smoothing ls of the case that gave ref, gives ref)."""
    import numpy as np
    raw = open(ckpt, "rb").read()
    hlen = struct.unpack("<Q", raw[:8])[0]
    mid = 8 + hlen + (len(raw) - 8 - hlen) // 2
    bad = {"flipped data byte": raw[:mid] + bytes([raw[mid] ^ 0x10]) + raw[mid + 1:],
           "truncated by 64 bytes": raw[:-64],
           "cut inside the header": raw[:8 + hlen // 2]}
    for label, blob in bad.items():
        path = os.path.join(tmp, "bad.safetensors")
        with open(path, "wb") as f:
            f.write(blob)
        out_dir = os.path.join(tmp, "bad_out")
        got, msg = cli_grads(rn, mt, path, data_args, 0.0, out_dir)
        if got is not None:
            rn.check(False, f"file  {label}", "accepted by `model grads`")
            continue
        low = msg.lower()
        named = "checksum" in low or "corrupt" in low
        exited = "exit status" in msg
        need_name = label == "flipped data byte"
        last = msg.strip().splitlines()[-1].strip().replace(tmp + os.sep, "")
        rn.check(exited and (named or not need_name), f"file  {label}",
                 f"refused: {last[:150]}" + ("" if named or not need_name else
                                            " [message must name the checksum or corruption]"))
    # Another valid safetensors layout of the same content.
    tensors, meta = mt.read_safetensors(ckpt)
    meta.pop("checksum", None)
    path = os.path.join(tmp, "rewritten.safetensors")
    mt.write_safetensors(path, tensors, meta, checksum_key="checksum")
    got, msg = cli_grads(rn, mt, path, data_args, ls, os.path.join(tmp, "rewritten_out"))
    if got is None:
        rn.check(False, "file  re-serialised by model_torch", msg)
        return
    same = (np.array_equal(got[0], ref[0]) and got[1] == ref[1]
            and all(np.array_equal(got[2][n], ref[2][n]) for n in ref[2]))
    rn.check(same, "file  re-serialised by model_torch",
             "bitwise the same logits, loss and gradients" if same else "results differ")


def run_seed_checks(rn, mt, tmp):
    """The same seed gives the same bytes; another seed other parameters."""
    text = f"{BASE},{IMG8P4}"
    paths = [os.path.join(tmp, f"seed{i}.safetensors") for i in range(3)]
    for p, s in zip(paths, (7, 7, 8)):
        ok, msg = cli_init(rn, text, s, p)
        if not ok:
            rn.check(False, "init  seed determinism", msg)
            return
    t = [mt.read_safetensors(p)[0] for p in paths]
    same = all((t[0][n] == t[1][n]).all() for n in t[0])
    differ = any((t[0][n] != t[2][n]).any() for n in t[0])
    rn.check(same and differ, "init  seed determinism",
             f"seed 7 twice: {'identical' if same else 'DIFFERENT'}; seed 8: "
             f"{'different' if differ else 'IDENTICAL'}")


def main():
    ap = argparse.ArgumentParser(description="birkhoff model engine vs its PyTorch twin")
    ap.add_argument("--birkhoff", default=os.path.join(ROOT, "build", "birkhoff"),
                    help="path to the birkhoff CLI (default: build/birkhoff)")
    ap.add_argument("--quick", action="store_true", help="a subset of the cases")
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    ap.add_argument("--keep", default=None, help="keep the case files under this directory")
    ap.add_argument("--seed", type=int, default=1, help="base model/data seed")
    ap.add_argument("--tol-logits", type=float, default=1e-5, help="logits and loss")
    ap.add_argument("--tol-grad", type=float, default=1e-4, help="parameter gradients")
    ap.add_argument("--grad-floor", type=float, default=1e-3,
                    help="denominator floor of the gradient errors, as a fraction of the "
                         "case's largest gradient entry")
    ap.add_argument("--tol-zero", type=float, default=1e-6,
                    help="|grad| where the reference is exactly zero, relative to max|ref|")
    ap.add_argument("--tol-traj-loss", type=float, default=1e-5, help="trajectory losses")
    ap.add_argument("--tol-traj-weights", type=float, default=1e-5, help="final weights (SGD)")
    ap.add_argument("--tol-traj-weights-adam", type=float, default=1e-4,
                    help="final weights (Adam, AdamW)")
    ap.add_argument("--tol-traj-state", type=float, default=1e-4, help="optimiser state")
    ap.add_argument("--weights-floor", type=float, default=1e-2,
                    help="denominator floor of the final-weight errors, as a fraction of the "
                         "model's largest weight")
    args = ap.parse_args()
    mt = import_twin()
    tols = {"logits": args.tol_logits, "grad": args.tol_grad, "zero": args.tol_zero,
            "floor": args.grad_floor,
            "traj_loss": args.tol_traj_loss, "traj_w": args.tol_traj_weights,
            "traj_state": args.tol_traj_state, "w_floor": args.weights_floor,
            "traj_w_adam": args.tol_traj_weights_adam}
    cli = args.birkhoff
    if not (os.path.isfile(cli) and os.access(cli, os.X_OK)):
        print(f"FAIL: birkhoff CLI not found or not executable: {cli} (build it first)")
        print("0 passed, 1 failed")
        return 1
    has, why = cli_has_model(cli)
    if not has:
        print(f"SKIP: the CLI has no `model` command, nothing run [{why}]")
        return 0
    t0 = time.perf_counter()
    rn = Runner(cli)
    gcases = [c for c in GRAD_CASES + S2S_GRAD_CASES if (c[-1] or not args.quick)
              and (args.only is None or args.only in c[0])]
    tcases = [c for c in TRAIN_CASES + S2S_TRAIN_CASES if (c[-1] or not args.quick)
              and (args.only is None or args.only in c[0])]
    print(f"model engine test: {len(gcases)} gradient cases, {len(tcases)} trajectories, CLI {cli}",
          flush=True)
    base_tmp = args.keep or tempfile.mkdtemp(prefix="bk_model_")
    try:
        if args.only is None:
            d = os.path.join(base_tmp, "seeds")
            os.makedirs(d, exist_ok=True)
            run_seed_checks(rn, mt, d)
        first = None
        for case in gcases:
            d = os.path.join(base_tmp, "grads-" + case[0])
            os.makedirs(d, exist_ok=True)
            res = run_grads_case(rn, mt, case, tols, d, case_seed(args.seed, case[0]))
            if res is not None and first is None:
                first = (d,) + res
        for case in tcases:
            d = os.path.join(base_tmp, "train-" + case[0])
            os.makedirs(d, exist_ok=True)
            run_train_case(rn, mt, case, tols, d, case_seed(args.seed, case[0]))
        for i, case in enumerate(TWIN_CASES):
            if args.only is None or args.only in case[0]:
                d = os.path.join(base_tmp, case[0])
                os.makedirs(d, exist_ok=True)
                # (the first case's seed is the one it had alone)
                run_twin_checkpoint_check(rn, mt, tols, d,
                                          case_seed(args.seed, "twin-written" if i == 0 else case[0]),
                                          case)
        if first is not None:
            d, ckpt, data_args, ref, ls = first
            run_file_checks(rn, mt, d, ckpt, data_args, ref, ls)
        elif gcases:
            rn.check(False, "file  checks", "not run: no gradient case succeeded")
    finally:
        if args.keep is None:
            shutil.rmtree(base_tmp, ignore_errors=True)
    for key, val in rn.worst.items():
        print(f"worst {key:26s} {val:.2e}")
    print(f"time {time.perf_counter() - t0:.1f} s")
    print(f"{rn.passed} passed, {rn.failed} failed")
    return 1 if rn.failed else 0


if __name__ == "__main__":
    sys.exit(main())
