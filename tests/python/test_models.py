#!/usr/bin/python3
"""birkhoff.models: C checkpoints as PyTorch modules and back (issue 22, item 3).

    /usr/bin/python3 tests/python/test_models.py [--birkhoff build/birkhoff] [--keep DIR]

The CLI is --birkhoff, else $BIRKHOFF_CLI, else <repo>/build/birkhoff; the
library is $BIRKHOFF_LIB, else the libbirkhoff.so next to that CLI (so the
two always come from one build). Parts (each a few seconds on 2 cores):

1. C -> torch: for each configuration of CASES (softmax, Sinkhorn,
   unbalanced, ESP soft with seeded slices and hard, LOT, diff; image,
   tokens and points inputs, padded batches with a length-1 sample; pools
   cls, mean, max, otk (also with Nystrom anchors and the 2-D encoding in a
   model without blocks); the encoder-decoder with pre-/post-LN, learned and
   sinusoidal positions, Sinkhorn/ESP cross-attention) `birkhoff model init`
   makes a model, `birkhoff model train` moves it 2 AdamW steps off its
   initialisation, `birkhoff model grads` writes its logits and loss on a
   fresh batch; birkhoff.models.load (float32) must give the same logits and
   loss (max|x - ref| / max|ref| <= TOL = 1e-5), and the C gradients of
   every parameter (grads.safetensors; the oracle's measure, floor 1e-3,
   <= 1e-4), with state_dict names equal to the checkpoint's tensor names
   (order: ordered_parameters); the same again with backend="c" (the C
   operators through birkhoff.torch inside the torch model). One case
   also continues the C run in torch (load(optimizer=True) + train_step) and
   compares the losses with `birkhoff model train` continuing it.
2. torch -> C: models built with birkhoff.models.build are trained a few
   steps with torch optimisers (torch.optim.AdamW / Adam over
   model.parameters(), and make_optimizer's groups) and saved with
   birkhoff.models.save; `birkhoff model grads` must reproduce the torch
   logits and loss (TOL), `birkhoff model train` without --optim continues
   them (finite, decreasing losses; optim_step carried; the result loads
   back); for the make_optimizer case the C losses equal torch's own
   continuation (train_step) to TOL.
3. `birkhoff train` <-> torch on a generated dataset (shapes, read through
   birkhoff.data): the run's checkpoint loads; torch's test loss and
   accuracy equal `birkhoff eval`'s; fine-tuned in torch and saved (the
   run's metadata carried), `birkhoff eval` gives torch's loss and accuracy,
   and `birkhoff train --init` fine-tunes it (its checkpoint loads back).
4. Bad input: a missing file, a directory, one flipped data byte, truncated
   files, garbage, an empty file, a safetensors file that is not a birkhoff
   checkpoint, unknown configuration keys, attn=asap, a missing or
   misshapen tensor: each raises FileNotFoundError / OSError or ValueError
   naming the problem (never a crash); save() refuses optimisers the C
   engine lacks, a state_dict without config, a missing directory, and
   leaves the old file whole when writing fails; `import birkhoff` does not
   import torch; build(seed=) is reproducible and leaves torch's RNG alone.
5. Checkpoint headers (issue 41): files of the C and the Python writer load
   in both readers; the metadata edited (sk_eps=1 -> 9) is refused by both,
   and loads in both when its checksum is recomputed as MODEL.md defines it;
   a data-only checksum (earlier versions) loads; duplicated metadata keys,
   tensor names, tensor fields and metadata objects, unknown dtypes,
   misshapen ignored tensors, nesting, non-UTF-8 and escapes above
   U+007F are refused by both, naming the same thing; 300 seeded random
   edits of a header get the same decision from both; a header nested
   200000 deep is a ValueError; out-of-range configuration integers raise
   ValueError naming the key and the range, and the CLI refuses them.

Prints one line per measured parity error, "FAIL name: detail" for failures,
then "N passed, M failed"; exit status 1 if any failed.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.dont_write_bytecode = True
from checklib import Checks  # noqa: E402

TOL = 1e-5
GRAD_TOL, GRAD_FLOOR = 1e-4, 1e-3    # tests/oracle/test_model.py's gradient measure
check = Checks()
worst = {}

# (name, configuration, padded batch)
CASES = [
    ("softmax-image-cls", "input=image,image_h=8,image_w=8,patch=4,channels=2,dim=16,depth=2,heads=2,"
     "mlp_dim=32,classes=5,attn=softmax,qkv_bias=1", False),
    ("sinkhorn-image-mean", "input=image,image_h=8,image_w=8,patch=2,dim=16,depth=2,heads=4,mlp_dim=32,"
     "classes=4,attn=sinkhorn,sk_iters=5,sk_eps=0.5,pool=mean", False),
    ("softmax-tokens-padded-max", "input=tokens,vocab=11,max_len=9,dim=16,depth=2,heads=2,mlp_dim=24,"
     "classes=3,attn=softmax,pool=max", True),
    ("unbalanced-tokens-padded", "input=tokens,vocab=11,max_len=8,dim=16,depth=2,heads=2,mlp_dim=24,"
     "classes=3,attn=unbalanced,sk_iters=4,sk_rho=3", True),
    ("esp-soft-tokens-padded", "input=tokens,vocab=9,max_len=7,dim=16,depth=2,heads=2,mlp_dim=16,"
     "classes=3,attn=esp,esp_soft=1,esp_t=0.1,esp_tau=2,esp_slices=3,pool=mean", True),
    ("esp-hard-image", "input=image,image_h=8,image_w=8,patch=2,dim=16,depth=1,heads=2,mlp_dim=16,"
     "classes=3,attn=esp,esp_soft=0,esp_tau=3", False),
    ("lot-points-padded-otk", "input=points,point_dim=3,max_points=8,dim=16,depth=2,heads=2,head_dim=6,"
     "mlp_dim=16,classes=3,attn=lot,lot_r=3,lot_iters=5,lot_temp=0.7,pool=otk,otk_refs=2,"
     "otk_supports=3,otk_iters=10", True),
    ("sinkhorn-image-otk", "input=image,image_h=8,image_w=8,patch=4,dim=16,depth=1,heads=2,mlp_dim=16,"
     "classes=3,attn=sinkhorn,sk_iters=3,pool=otk,otk_supports=4", False),
    ("diff-tokens-padded", "input=tokens,vocab=9,max_len=7,dim=16,depth=2,heads=2,mlp_dim=16,classes=3,"
     "attn=diff,pool=mean", True),
    ("seq2seq-softmax-padded", "arch=seq2seq,input=tokens,vocab=13,max_len=7,tgt_max_len=6,dim=16,"
     "depth=1,dec_depth=2,heads=2,mlp_dim=32,attn=softmax,cross_attn=softmax,pos_embed=1", True),
    ("seq2seq-sinkhorn-postln", "arch=seq2seq,input=tokens,vocab=13,max_len=6,tgt_max_len=5,dim=16,"
     "depth=1,dec_depth=1,heads=2,mlp_dim=16,attn=sinkhorn,cross_attn=sinkhorn,sk_iters=3,post_ln=1,"
     "pos_embed=2,final_norm=0,qkv_bias=1", True),
    ("seq2seq-lot-esp", "arch=seq2seq,input=tokens,vocab=11,max_len=6,tgt_max_len=5,dim=16,depth=1,"
     "dec_depth=1,heads=2,mlp_dim=16,attn=lot,lot_r=2,cross_attn=esp,esp_t=0.1,esp_slices=2", True),
    # LOTFormer's ViT ingredients (cls_attn, pol_*, dwc): a non-square 6 x 4 grid, kernels 3 and 5
    ("lot-vit-clssoftmax-dwc", "input=image,image_h=12,image_w=8,patch=2,dim=16,depth=2,heads=2,"
     "mlp_dim=32,classes=4,attn=lot,lot_r=3,lot_iters=5,cls_attn=softmax,dwc=1", False),
    ("lot-vit-pol-dwc5-mean", "input=image,image_h=8,image_w=12,patch=2,channels=2,dim=16,depth=2,"
     "heads=2,head_dim=6,mlp_dim=16,classes=3,attn=lot,lot_r=4,lot_iters=4,lot_eps=0.5,cls_attn=pol,"
     "dwc=1,dwc_kernel=5,qkv_bias=1,pool=mean", False),
    ("lot-vit-pol3-tokens-padded", "input=tokens,vocab=11,max_len=8,dim=16,depth=2,heads=2,mlp_dim=16,"
     "classes=3,attn=lot,lot_r=3,cls_attn=pol,pol_ps=3,pol_po=1.5,attn_scale=0.5", True),
    ("sinkhorn-vit-pol-dwc", "input=image,image_h=8,image_w=8,patch=2,dim=16,depth=1,heads=2,mlp_dim=16,"
     "classes=3,attn=sinkhorn,sk_iters=3,cls_attn=pol,dwc=1", False),
    ("esp-vit-clssoftmax", "input=image,image_h=8,image_w=8,patch=2,dim=16,depth=1,heads=2,mlp_dim=16,"
     "classes=3,attn=esp,esp_t=0.2,cls_attn=softmax", False),
    # Set Transformer: ISAB blocks (rectangular Sinkhorn problems) and a PMA of 2 seeds
    ("set-isab-sinkhorn-pma-points-padded", "input=points,point_dim=3,max_points=8,dim=16,depth=2,heads=2,"
     "mlp_dim=16,classes=3,cls=0,pos_embed=0,set_block=isab,set_inducing=3,attn=sinkhorn,sk_iters=3,"
     "pool=pma,pma_seeds=2,pma_attn=esp,esp_t=0.2", True),
    # the supervised OTK layer: Nystrom anchors, the 2-D encoding on the patch grid, no blocks
    ("otk-nystrom-pe2d-depth0", "input=image,image_h=8,image_w=8,patch=2,dim=16,depth=0,cls=0,classes=3,"
     "pool=otk,otk_anchors=6,otk_supports=4,otk_pe=2d,otk_sigma_pos=0.3", False),
]
B = 4


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--birkhoff", default=os.environ.get("BIRKHOFF_CLI")
                    or os.path.join(REPO, "build", "birkhoff"), help="the CLI")
    ap.add_argument("--keep", help="keep the files in this directory")
    ap.add_argument("--only", help="parts 1 and 2: only the cases whose name contains this")
    return ap.parse_args()


ARGS = parse_args()
CLI = os.path.abspath(ARGS.birkhoff)
if not os.environ.get("BIRKHOFF_LIB") and os.path.exists(os.path.join(os.path.dirname(CLI),
                                                                      "libbirkhoff.so")):
    os.environ["BIRKHOFF_LIB"] = os.path.join(os.path.dirname(CLI), "libbirkhoff.so")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import birkhoff  # noqa: E402
import birkhoff.data as bdata  # noqa: E402
import birkhoff.models as bm  # noqa: E402


def run(*args):
    """(returncode, output) of the CLI."""
    p = subprocess.run([CLI] + [str(a) for a in args], capture_output=True, text=True, timeout=300)
    return p.returncode, (p.stderr + p.stdout).strip()


def cli(label, *args):
    rc, out = run(*args)
    check(rc == 0, label, f"exit {rc}: {' '.join(map(str, args))}\n{out}")
    return rc == 0, out


def rel(a, ref):
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(a - ref).max() / max(np.abs(ref).max(), 1e-30))


def note(label, err, tol=TOL):
    worst[label] = max(worst.get(label, 0.0), err)
    print(f"  {label:58s} {err:.2e} (tol {tol:.0e})")
    check(err <= tol and np.isfinite(err), label, f"{err:.3e} > {tol:.0e}")


def batch_files(d, tag, batch):
    """Writes a batch's arrays as .npy files; returns the CLI's arguments."""
    args = []
    for key, flag in (("x", "--x"), ("tokens", "--tokens"), ("lengths", "--len"),
                      ("labels", "--labels"), ("tgt", "--tgt"), ("tgt_len", "--tgt-len")):
        if batch.get(key) is not None:
            path = os.path.join(d, f"{tag}_{key}.npy")
            np.save(path, np.ascontiguousarray(batch[key]))
            args += [flag, path]
    return args


def torch_logits_loss(model, batch):
    with torch.no_grad():
        logits, loss = bm.model_loss(model, batch)
    return logits.numpy(), float(loss)


def c_logits_loss(d, tag, ckpt, batch):
    """`birkhoff model grads` on batch: (logits, loss) or (None, None)."""
    out = os.path.join(d, tag + "_grads")
    ok, _ = cli(f"{tag}: model grads", "model", "grads", "--ckpt", ckpt,
                *batch_files(d, tag, batch), "--out-dir", out)
    if not ok:
        return None, None
    return np.load(os.path.join(out, "logits.npy")), float(np.load(os.path.join(out, "loss.npy"))[0])


def grad_error(model, batch, ref):
    """max over tensors of max|g - ref| / max(max|ref|, GRAD_FLOOR * R), R the
    largest reference gradient entry (tests/oracle/test_model.py's measure:
    float32 rounding leaves ~1e-8 R in every entry, whatever the tensor's own
    size)."""
    model.zero_grad()
    was = model.training
    model.train()
    bm.model_loss(model, batch)[1].backward()
    model.train(was)
    R = max(float(np.abs(a).max()) for a in ref.values())
    err = 0.0
    for n, p in model.named_parameters():
        g = np.zeros(p.shape) if p.grad is None else p.grad.numpy()
        den = max(float(np.abs(ref[n]).max()), GRAD_FLOOR * R)
        err = max(err, float(np.abs(g - ref[n]).max()) / den)
    model.zero_grad()
    return err


def train_batch(model, opt, batch, steps):
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        bm.model_loss(model, batch)[1].backward()
        opt.step()
    model.eval()


# ---------------------------------------------------------------------------
# 1. C -> torch
# ---------------------------------------------------------------------------
def part_c_to_torch(d):
    print("1. C checkpoints loaded as torch modules (float32)")
    for i, (name, text, padded) in enumerate(CASES):
        if ARGS.only and ARGS.only not in name:
            continue
        cfg = bm.resolve_config(text)
        rng = np.random.default_rng(100 + i)
        init, trained = os.path.join(d, name + "_init.safetensors"), os.path.join(d, name + ".safetensors")
        if not cli(f"{name}: model init", "model", "init", "--config", text, "--seed", 10 + i,
                   "--out", init)[0]:
            continue
        tb = bm.random_batch(cfg, B, rng, padded)
        if not cli(f"{name}: model train", "model", "train", "--ckpt", init,
                   *batch_files(d, name + "_t", tb), "--steps", 2, "--optim", "kind=adamw,lr=0.01",
                   "--out", trained)[0]:
            continue
        eb = bm.random_batch(cfg, B, rng, padded)
        ref_logits, ref_loss = c_logits_loss(d, name, trained, eb)
        if ref_logits is None:
            continue
        model = bm.load(trained)
        tensors, _ = bm.read_safetensors(trained)
        names = [n for n in tensors if not n.startswith("optim.")]
        check(set(model.state_dict()) == set(names), f"{name}: state_dict keys == checkpoint tensors",
              (sorted(model.state_dict()), names))
        check([n for n, _ in model.ordered_parameters()] == names and
              [n for n, _, _ in bm.param_specs(model.config)] == names,
              f"{name}: ordered_parameters / param_specs == the checkpoint's order")
        check(all(p.dtype == torch.float32 for p in model.parameters()) and not model.training,
              f"{name}: float32 and eval mode by default")
        check(bm.resolve_config(model.config) == model.config and model.config["attn"] == cfg["attn"],
              f"{name}: .config")
        ref_grads, _ = bm.read_safetensors(os.path.join(d, name + "_grads", "grads.safetensors"))
        for backend in ("torch", "c"):
            m = model if backend == "torch" else bm.load(trained, backend=backend)
            logits, loss = torch_logits_loss(m, eb)
            note(f"{name}: logits ({backend})", rel(logits, ref_logits))
            note(f"{name}: loss ({backend})", rel(loss, ref_loss))
            note(f"{name}: gradients ({backend})", grad_error(m, eb, ref_grads), GRAD_TOL)
        if name == "sinkhorn-image-mean":
            continue_c_run(d, name, trained, tb)


def continue_c_run(d, name, trained, tb):
    """load(optimizer=True) + train_step continues the C run as `model train` does."""
    model, opt, ocfg, step = bm.load(trained, optimizer=True)
    check(step == 2 and ocfg["kind"] == "adamw" and abs(ocfg["lr"] - 0.01) < 1e-9,
          f"{name}: load(optimizer=True) reads the optimiser and its step", (ocfg, step))
    more = os.path.join(d, name + "_more.safetensors")
    losses = os.path.join(d, name + "_more_losses.npy")
    if not cli(f"{name}: model train continues", "model", "train", "--ckpt", trained,
               *batch_files(d, name + "_t", tb), "--steps", 3, "--out", more, "--losses", losses)[0]:
        return
    model.train()
    mine = [bm.train_step(model, opt, ocfg, step + s, tb)[0] for s in range(3)]
    note(f"{name}: torch continues the C run (3 AdamW losses)", rel(mine, np.load(losses)))


# ---------------------------------------------------------------------------
# 2. torch -> C
# ---------------------------------------------------------------------------
def part_torch_to_c(d):
    print("2. torch models saved for the CLI")
    setups = [("sinkhorn-image-mean", "adamw"), ("softmax-tokens-padded-max", "groups"),
              ("lot-points-padded-otk", "adam"), ("seq2seq-softmax-padded", "adamw"),
              ("lot-vit-pol-dwc5-mean", "groups")]
    for j, (name, how) in enumerate(setups):
        if ARGS.only and ARGS.only not in name:
            continue
        text, padded = next((t, p) for n, t, p in CASES if n == name)
        tag = "torch-" + name
        cfg = bm.resolve_config(text)
        rng = np.random.default_rng(200 + j)
        model = bm.build(text, seed=j)
        if how == "groups":    # the C engine's own groups: decay on Linear weights / table only
            ocfg = bm.resolve_optim("kind=adamw,lr=0.005,weight_decay=0.05")
            opt = bm.make_optimizer(model, ocfg)
        elif how == "adam":
            opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.99))
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
        tb = bm.random_batch(cfg, B, rng, padded)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        train_batch(model, opt, tb, 3)
        moved = sum(not torch.equal(before[n], p) for n, p in model.named_parameters())
        check(moved >= len(before) - 2, f"{tag}: the torch steps changed the weights",
              f"{moved} of {len(before)}")
        path = os.path.join(d, tag + ".safetensors")
        got = bm.save(path, model, opt)
        check(got == path and os.path.exists(path), f"{tag}: save returns the path")
        check(not [f for f in os.listdir(d) if ".tmp." in f or ".bk-" in f], f"{tag}: no temporary file left")
        eb = bm.random_batch(cfg, B, rng, padded)
        ref_logits, ref_loss = c_logits_loss(d, tag, path, eb)
        if ref_logits is None:
            continue
        logits, loss = torch_logits_loss(model, eb)
        note(f"{tag}: C logits of the torch-saved model", rel(ref_logits, logits))
        note(f"{tag}: C loss", rel(ref_loss, loss))
        # the CLI continues the torch run from the saved optimiser state
        out, losses = os.path.join(d, tag + "_ft.safetensors"), os.path.join(d, tag + "_ft.npy")
        ok, _ = cli(f"{tag}: model train continues it (no --optim)", "model", "train", "--ckpt", path,
                    *batch_files(d, tag + "_t", tb), "--steps", 4, "--out", out, "--losses", losses)
        if not ok:
            continue
        L = np.load(losses)
        check(np.all(np.isfinite(L)) and L[-1] < L[0], f"{tag}: C fine-tuning losses finite, decreasing",
              L)
        back = bm.load(out)
        meta = back.checkpoint_meta
        check(meta.get("optim_step") == "7" and bm.parse_optim(meta["optim"])["kind"] ==
              ("adam" if how == "adam" else "adamw"), f"{tag}: optim_step 3 + 4, the optimiser kind kept",
              {k: meta.get(k) for k in ("optim_step", "optim")})
        check(all(torch.isfinite(p).all() for p in back.parameters()), f"{tag}: the result loads back")
        if how == "groups":
            model.train()
            mine = [bm.train_step(model, opt, ocfg, 3 + s, tb)[0] for s in range(4)]
            note(f"{tag}: C continuation == torch continuation (4 losses)", rel(L, mine))


# ---------------------------------------------------------------------------
# 3. birkhoff train <-> torch on a generated dataset
# ---------------------------------------------------------------------------
DATA = ["--data", "shapes", "--points", 16, "--gen-train", 256, "--gen-test", 64]


def dataset_eval(model, ds):
    b = ds.load()
    with torch.no_grad():
        logits = model(x=b.x, lengths=b.lengths)
        loss = float(bm.loss_fn(logits, b.labels))
    return loss, float((logits.argmax(1).numpy() == b.labels).mean())


def c_eval(d, tag, ckpt):
    js = os.path.join(d, tag + ".json")
    ok, out = cli(f"{tag}: birkhoff eval", "eval", "--ckpt", ckpt, "--json", js)
    return json.load(open(js)) if ok else None


def part_train_run(d):
    print("3. `birkhoff train` runs and torch")
    run1 = os.path.join(d, "run1")
    if not cli("train: birkhoff train (shapes, sinkhorn)", "train", *DATA, "--epochs", 2, "--batch", 32,
               "--dim", 16, "--depth", 1, "--heads", 2, "--mlp-dim", 32, "--attn", "sinkhorn",
               "--threads", 1, "--progress", "none", "--out", run1)[0]:
        return
    last = os.path.join(run1, "last.safetensors")
    model = bm.load(last)
    opts = dict(points=16, gen_train=256, gen_test=64, data_seed=1)
    with bdata.Dataset("shapes", "test", **opts) as test, bdata.Dataset("shapes", "train", **opts) as train:
        ev = c_eval(d, "eval-run1", last)
        loss, acc = dataset_eval(model, test)
        if ev:
            note("train: torch test loss == birkhoff eval's (run checkpoint)", rel(loss, ev["loss"]))
            check(abs(acc - ev["accuracy"]) < 1e-9, "train: torch test accuracy == birkhoff eval's",
                  (acc, ev["accuracy"]))
        # fine-tune in torch on training batches, save with the run's metadata
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        for s in range(6):
            b = train.batch(np.arange(32 * s, 32 * s + 32))
            opt.zero_grad()
            bm.loss_fn(model(x=b.x, lengths=b.lengths), b.labels).backward()
            opt.step()
        model.eval()
        ft = os.path.join(d, "torch-ft.safetensors")
        bm.save(ft, model, opt)
        ev = c_eval(d, "eval-torch-ft", ft)
        loss, acc = dataset_eval(model, test)
        if ev:
            note("train: birkhoff eval of the torch-fine-tuned model: loss", rel(ev["loss"], loss))
            check(abs(acc - ev["accuracy"]) < 1e-9, "train: ... and its accuracy", (acc, ev["accuracy"]))
    run2 = os.path.join(d, "run2")
    if cli("train: birkhoff train --init <torch checkpoint>", "train", "--init", ft, *DATA, "--epochs", 1,
           "--batch", 32, "--threads", 1, "--progress", "none", "--out", run2)[0]:
        back = bm.load(os.path.join(run2, "last.safetensors"))
        summ = json.load(open(os.path.join(run2, "summary.json")))
        check(back.config == model.config, "train: the fine-tuned run keeps the torch model's config")
        check(all(np.isfinite(v) for v in summ.values() if isinstance(v, float)),
              "train: the fine-tuned run's summary is finite", summ)


# ---------------------------------------------------------------------------
# 4. bad input and the API's edges
# ---------------------------------------------------------------------------
def raises(exc, fn, name, contains=None):
    try:
        fn()
    except exc as e:
        return check(contains is None or contains in str(e), name, f"message: {e}")
    except Exception as e:  # noqa: BLE001
        return check(False, name, f"raised {type(e).__name__}: {e}")
    return check(False, name, "did not raise")


def part_bad(d):
    print("4. bad input, API edges")
    good = os.path.join(d, "bad-src.safetensors")
    text = CASES[0][1]
    model = bm.build(text, seed=3)
    bm.save(good, model)
    raw = open(good, "rb").read()
    hlen = int.from_bytes(raw[:8], "little")

    def write(name, blob):
        p = os.path.join(d, name)
        with open(p, "wb") as f:
            f.write(blob)
        return p

    raises(FileNotFoundError, lambda: bm.load(os.path.join(d, "nope.safetensors")), "missing file")
    raises(OSError, lambda: bm.load(d), "a directory")
    at = 8 + hlen + 17
    flipped = write("flipped.safetensors", raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:])
    raises(ValueError, lambda: bm.load(flipped), "one flipped data byte: checksum", "checksum")
    raises(ValueError, lambda: bm.load(write("cut.safetensors", raw[:-64])), "truncated by 64 bytes",
           "truncated")
    raises(ValueError, lambda: bm.load(write("cuthdr.safetensors", raw[:40])), "cut inside the header")
    raises(ValueError, lambda: bm.load(write("empty.safetensors", b"")), "empty file", "truncated")
    raises(ValueError, lambda: bm.load(write("garbage.safetensors", os.urandom(8) + b"{" * 300)),
           "garbage")
    raises(ValueError, lambda: bm.load(write("json.safetensors", raw[:8] + b"[" + raw[9:])),
           "corrupt header JSON")
    tensors, meta = bm.read_safetensors(good)
    other = os.path.join(d, "plain.safetensors")
    bm.write_safetensors(other, {"w": np.zeros(3, np.float32)})
    raises(ValueError, lambda: bm.load(other), "a safetensors file that is not a birkhoff checkpoint",
           "not a birkhoff checkpoint")
    for label, m2, t2, want in (
            ("unknown configuration key", dict(meta, config=meta["config"] + "warp=9\n"), tensors,
             "warp"),
            ("attn=asap", dict(meta, config=meta["config"].replace("attn=softmax", "attn=asap")),
             tensors, "asap"),
            ("a missing tensor", meta, {k: v for k, v in tensors.items() if k != "head.bias"},
             "head.bias"),
            ("a misshapen tensor", meta, dict(tensors, **{"head.bias": np.zeros(2, np.float32)}),
             "head.bias")):
        p = os.path.join(d, "edit.safetensors")
        bm.write_safetensors(p, t2, {k: v for k, v in m2.items() if k != "checksum"},
                             checksum_key="checksum")
        raises(ValueError, lambda: bm.load(p), label, want)
    raises(ValueError, lambda: bm.load(good, optimizer=True), "load(optimizer=True) without optimiser state",
           "optimiser")
    # LOTFormer's ViT keys: bad values refused by the twin (and by the CLI, naming the key)
    vit = "input=image,image_h=8,image_w=8,patch=2,dim=8,depth=1,heads=2,classes=3,attn=lot"
    for extra, want in (("cls_attn=middle", "cls_attn"), ("cls_attn=pol,pol_ps=0.5", "pol_ps"),
                        ("cls_attn=softmax,cls=0,pool=mean", "cls=1"),
                        ("cls_attn=pol,attn=diff", "cls_attn=pol"), ("dwc=2", "0/1 switch"),
                        ("dwc=1,dwc_kernel=4", "odd"),
                        ("dwc=1,input=tokens,pool=mean", "input=image"),
                        # the OTK layer's keys
                        ("pool=otk,otk_pe=2d,otk_supports=4", "cls=0"),
                        ("pool=otk,cls=0,otk_pe=2d,otk_supports=5", "square"),
                        ("pool=otk,otk_anchors=8,otk_sigma=0", "otk_sigma"),
                        ("pool=mean,otk_anchors=8", "pool=otk"),
                        ("pool=otk,otk_pe=3d", "otk_pe")):
        raises(ValueError, lambda: bm.build(f"{vit},{extra}"), f"twin refuses {extra}", want)
        rc, out = run("model", "init", "--config", f"{vit},{extra}", "--seed", 1, "--out",
                      os.path.join(d, "vit-bad.safetensors"))
        check(rc != 0 and want.split("=")[0] in out and
              not os.path.exists(os.path.join(d, "vit-bad.safetensors")), f"CLI refuses {extra}, naming it",
              out[-300:])
    # save's refusals; a failed write leaves the old file whole
    raises(FileNotFoundError, lambda: bm.save(os.path.join(d, "no", "dir.safetensors"), model),
           "save into a missing directory")
    raises(ValueError, lambda: bm.save(os.path.join(d, "x.safetensors"), model,
                                       torch.optim.RMSprop(model.parameters())), "save refuses RMSprop",
           "AdamW, Adam and SGD")
    raises(ValueError, lambda: bm.save(os.path.join(d, "x.safetensors"), model,
                                       torch.optim.Adam(model.parameters(), amsgrad=True)),
           "save refuses amsgrad", "amsgrad")
    raises(ValueError, lambda: bm.save(os.path.join(d, "x.safetensors"), model.state_dict()),
           "save(state_dict) without config", "config")
    raises(TypeError, lambda: bm.save(os.path.join(d, "x.safetensors"), torch.nn.Linear(2, 2)),
           "save refuses a foreign module")
    check(not os.path.exists(os.path.join(d, "x.safetensors")), "refused saves write nothing")
    sd_path = os.path.join(d, "from-state-dict.safetensors")
    bm.save(sd_path, model.state_dict(), config=text)
    check(open(sd_path, "rb").read() == raw, "save(state_dict, config=) == save(model): same bytes")
    orig_replace = os.replace

    def failing_replace(a, b):
        raise OSError("simulated failure")
    os.replace = failing_replace
    try:
        raises(OSError, lambda: bm.save(good, bm.build(text, seed=4)), "a failing rename raises")
    finally:
        os.replace = orig_replace
    check(open(good, "rb").read() == raw and not [f for f in os.listdir(d) if ".tmp." in f or ".bk-" in f],
          "a failed save leaves the old file whole and no temporary file")
    # the API's edges
    g = torch.get_rng_state()
    a, b = bm.build(text, seed=5), bm.build(text, seed=5)
    check(torch.equal(g, torch.get_rng_state()), "build(seed=) leaves torch's RNG alone")
    check(all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters())),
          "build(seed=) is reproducible")
    c = bm.from_config(bm.format_config(a.config), seed=5, dtype=torch.float64)
    check(c.config == a.config and next(c.parameters()).dtype == torch.float64,
          "from_config(format_config(config)) round trip, dtype")
    check(bm.parse_config(bm.format_config(a.config)) == a.config, "parse_config(format_config(cfg))")
    p = subprocess.run([sys.executable, "-c", "import sys; import birkhoff; "
                        "print('torch' in sys.modules)"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "python")))
    check(p.returncode == 0 and p.stdout.strip() == "False", "import birkhoff does not import torch",
          p.stdout + p.stderr)
    rc, out = run("model", "grads", "--ckpt", flipped, "--x", "nope.npy", "--labels", "nope.npy",
                  "--out-dir", d)
    check(rc != 0 and "checksum" in out, "the CLI refuses the same flipped file", out)


def _fnv(data, h=0xCBF29CE484222325):
    for b in bytes(data):
        h = ((h ^ b) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def edit_ckpt(src, dst, what, with_, sum_="fix"):
    """src with the first `what` of its header replaced; the checksum left
    (sum_="keep"), recomputed as MODEL.md defines it ("fix": the data
    section, then the header with its 16 digits as '0'), or as earlier
    versions wrote it ("legacy": the data section alone)."""
    raw = open(src, "rb").read()
    hl = int.from_bytes(raw[:8], "little")
    hdr, data = raw[8:8 + hl].rstrip(b" "), raw[8 + hl:]
    if what is not None:
        assert what in hdr, what
        hdr = hdr.replace(what, with_, 1)
    hdr = bytearray(hdr + b" " * (-len(hdr) % 8))
    if sum_ != "keep":
        at = hdr.index(b'"checksum":"') + 12
        hdr[at:at + 16] = b"0" * 16
        v = _fnv(data) if sum_ == "legacy" else _fnv(hdr, _fnv(data))
        hdr[at:at + 16] = b"%016x" % v
    with open(dst, "wb") as f:
        f.write(len(hdr).to_bytes(8, "little") + hdr + data)
    return dst


def py_load(path):
    """(model, "") or (None, the exception)"""
    try:
        return bm.load(path), ""
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def part_headers(d):
    print("5. checkpoint headers: the checksum covers them, duplicates, nesting, config ranges")
    cfg = "input=tokens,vocab=7,max_len=4,dim=8,depth=1,heads=2,attn=sinkhorn,sk_iters=3,classes=3"
    c_ck, p_ck, bad = (os.path.join(d, n + ".safetensors") for n in ("hdr-c", "hdr-py", "hdr-bad"))
    cli("model init (header tests)", "model", "init", "--config", cfg, "--seed", 2, "--out", c_ck)
    bm.save(p_ck, bm.build(cfg, seed=2), extra="note=caf\u00e9\ttab\n")
    # (the C library writes the site's operator key attn.eps, the twin its sk_eps)
    for who, src, eps, eps9 in (("C", c_ck, b"attn.eps=1\\n", b"attn.eps=9\\n"),
                                ("Python", p_ck, b"sk_eps=1.0\\n", b"sk_eps=9\\n")):
        # a file of either writer loads in both readers
        rc, out = run("model", "show", "--ckpt", src)
        check(rc == 0, f"a {who}-written checkpoint loads in C", out[-300:])
        m, why = py_load(src)
        check(m is not None and m.config["sk_eps"] == 1.0, f"a {who}-written checkpoint loads in Python", why)
        # the metadata edited: both readers refuse it
        edit_ckpt(src, bad, eps, eps9, "keep")
        raises(ValueError, lambda: bm.load(bad), f"{who}-written, sk_eps edited: Python refuses",
               "checksum mismatch")
        rc, out = run("model", "show", "--ckpt", bad)
        check(rc != 0 and "checksum mismatch" in out, f"{who}-written, sk_eps edited: C refuses", out[-300:])
        # ... with the checksum recomputed as MODEL.md says, both load the edit
        edit_ckpt(src, bad, eps, eps9, "fix")
        rc, out = run("model", "show", "--ckpt", bad)
        check(rc == 0 and "attn.eps=9" in out, f"{who}-written, edited, checksum recomputed: C loads it",
              out[-300:])
        m, why = py_load(bad)
        check(m is not None and m.config["sk_eps"] == 9.0,
              f"{who}-written, edited, checksum recomputed: Python loads it", why)
    m, why = py_load(p_ck)
    check(m is not None and m.checkpoint_meta["extra"] == "note=caf\u00e9\ttab\n",
          "Python writes UTF-8 text (C reads no \\u escape above U+007F)", why)
    # a file of an earlier version (checksum of the data section) still loads
    edit_ckpt(c_ck, bad, None, None, "legacy")
    rc, out = run("model", "show", "--ckpt", bad)
    check(rc == 0, "a data-only checksum (earlier versions) loads in C", out[-300:])
    m, why = py_load(bad)
    check(m is not None and m.config == py_load(c_ck)[0].config,
          "a data-only checksum (earlier versions) loads in Python", why)
    # duplicates and malformed headers: both refuse, naming the same thing
    bad_headers = [
        (b'{"__metadata__":{', b'{"__metadata__":{"seed":"7",', "duplicate metadata key 'seed'"),
        (b'"config":"', b'"config":"depth=2","config":"', "duplicate metadata key 'config'"),
        (b',"head.bias":{', b',"head.bias":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"head.bias":{',
         "duplicate tensor name 'head.bias'"),
        (b'{"dtype":"F32",', b'{"dtype":"F32","dtype":"F64",', "duplicate field 'dtype' in tensor"),
        (b',"head.bias":{', b',"__metadata__":{},"head.bias":{', "duplicate key '__metadata__'"),
        (b',"head.bias":{', b',"optim.x":{"dtype":"BF16","shape":[0],"data_offsets":[0,0]},"head.bias":{',
         "unknown dtype 'BF16'"),
        (b',"head.bias":{', b',"optim.x":{"dtype":"F32","shape":[3],"data_offsets":[0,0]},"head.bias":{',
         "does not fill its byte range"),
        (b',"head.bias":{', b',"x":{"y":' + b'{"y":' * 5000 + b'1' + b'}' * 5001 + b',"head.bias":{',
         "bad dtype, shape or data_offsets"),
        (b'"__metadata__":{', b'"__metadata__":{"a":' + b'{"a":' * 5000 + b'"b"' + b'}' * 5001 + b',',
         "metadata values must be strings"),
        (b'"shape":[', b'"shape":' + b'[' * 100000 + b'[', "bad dtype, shape or data_offsets"),
        (b'"config":"', b'"config":"\\u00e9', "escapes above U+007F"),
        (b'"config":"', b'"config":"\xc3(', "invalid UTF-8"),
        (b'"seed":"', b'"seed":"-', "bad 'seed'"),
    ]
    for what, with_, msg in bad_headers:
        for kind in ("fix", "legacy"):
            edit_ckpt(c_ck, bad, what, with_, kind)
            raises(ValueError, lambda: bm.load(bad), f"Python refuses: {msg} ({kind} checksum)", msg)
            rc, out = run("model", "show", "--ckpt", bad)
            check(rc != 0 and msg in out, f"C refuses: {msg} ({kind} checksum)", out[-300:])
    # the same decisions on 300 randomly edited headers (checksums recomputed; seeded)
    rng = np.random.default_rng(41)
    toks = [b'"', b'\\', b',', b':', b'{', b'}', b'[', b']', b' ', b'0', b'\\u0041', b'\\u0000', b'\\u00e9',
            b'\xc3\xa9', b'\xff', b'\n', b'"dtype":"F32",', b'"shape":[1],', b'"a":"b",', b'"__metadata__":{},',
            b'99999999999999999999', b'"head.bias":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},']
    src = open(c_ck, "rb").read()
    hl = int.from_bytes(src[:8], "little")
    differ, accepted, compared = [], 0, 0
    for _ in range(300):
        h = bytearray(src[8:8 + hl].rstrip(b" "))
        for _ in range(int(rng.integers(1, 4))):
            at, tok = int(rng.integers(len(h))), toks[int(rng.integers(len(toks)))]
            h[at:at + int(rng.integers(0, 3))] = tok
        with open(bad, "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h + src[8 + hl:])
        edit_ckpt(bad, bad, None, None, "fix") if b'"checksum":"' in h else None
        rc, out = run("model", "show", "--ckpt", bad)
        if "not a birkhoff checkpoint" in out:
            continue                     # (C stops there; read_safetensors goes on)
        c_ok = rc == 0 or not any(m in out for m in ("malformed safetensors header", "do not tile", "dtype",
                                                     "does not fill", "checksum", "header length",
                                                     "data section is"))
        try:
            _, meta = bm.read_safetensors(bad)
            py_ok = "checksum" in meta
        except ValueError:
            py_ok = False
        compared += 1
        accepted += py_ok
        if py_ok != c_ok:
            differ.append(out[-120:])
    print(f"  C and Python readers on {compared} edited headers: {accepted} accepted, "
          f"{len(differ)} decided differently")
    check(not differ and accepted > 10, f"C and Python decide alike on {compared} edited headers "
          f"({accepted} accepted)", "; ".join(differ[:3]))
    # a whole header nested deeply: ValueError (the reader does not recurse)
    deep = b"[" * 200000 + b"]" * 200000
    with open(bad, "wb") as f:
        f.write(len(deep).to_bytes(8, "little") + deep)
    raises(ValueError, lambda: bm.read_safetensors(bad), "a header nested 200000 deep: ValueError",
           "not a JSON object")
    # save's refusals: what the header or the C reader cannot hold
    m = bm.build(cfg, seed=2)
    raises(ValueError, lambda: bm.save(bad, m, extra="a\0b"), "save refuses NUL in extra", "NUL")
    raises(ValueError, lambda: bm.save(bad, m, seed=-1), "save refuses seed=-1", "seed")
    raises(ValueError, lambda: bm.save(bad, m, seed=2**64), "save refuses seed=2^64", "seed")
    # configuration values out of range: ValueError naming the key and the range (std::bad_alloc
    # and RecursionError before), and the C engine refuses them too
    for extra, key, rng in (("depth=1000000", "depth", "[0, 4096]"), ("depth=-1", "depth", "[0, 4096]"),
                            ("dim=33554432", "dim", "[1, 16777216]"),
                            ("heads=2147483648", "heads", "2147483647"),
                            ("sk_iters=2000000", "sk_iters", "[0, 1048576]"),
                            ("attn=sinkhorn,sk_iters=0", "sk_iters", "[1, 1048576]"),
                            ("attn=softmax,sk_iters=-1", "sk_iters", "[0, 1048576]"),
                            ("max_len=33554432", "max_len", "[1, 16777216]"),
                            ("cls=2", "cls", "[0, 1]"), ("lot_iters=-3", "lot_iters", "[0, 1048576]"),
                            ("arch=seq2seq,dec_depth=5000", "dec_depth", "[1, 4096]"),
                            ("arch=seq2seq,tgt_max_len=2000000", "tgt_max_len", "[1, 1048576]")):
        text = f"{cfg},{extra}"
        raises(ValueError, lambda: bm.build(text), f"twin refuses {extra}", f"{key}=")
        try:
            bm.build(text)
            check(False, f"twin names the range of {key}", "built")
        except Exception as e:  # noqa: BLE001
            check(rng in str(e), f"twin names the range of {key}", f"{type(e).__name__}: {e}")
        out_p = os.path.join(d, "range.safetensors")
        rc, out = run("model", "init", "--config", text, "--out", out_p)
        check(rc != 0 and "config" in out and not os.path.exists(out_p),
              f"CLI refuses {extra} (no file)", out[-300:])
    # the optimiser's integers: the C bounds (bk_optim_create), before anything is built
    for text, key in (("total_steps=-1", "total_steps"), ("warmup=-2", "warmup"), ("warmup=2147483648", "warmup")):
        raises(ValueError, lambda: bm.resolve_optim(text), f"optimiser config refuses {text}", f"{key}=")


def main():
    d = ARGS.keep or tempfile.mkdtemp(prefix="bk_test_models_")
    os.makedirs(d, exist_ok=True)
    if not os.access(CLI, os.X_OK):
        print(f"FAIL: no CLI at {CLI} (build it: make, or pass --birkhoff)")
        return 1
    print(f"# CLI {CLI}, library {birkhoff.LIBRARY_PATH}, torch {torch.__version__}")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    try:
        part_c_to_torch(d)
        part_torch_to_c(d)
        part_train_run(d)
        part_bad(d)
        part_headers(d)
    finally:
        if not ARGS.keep:
            shutil.rmtree(d, ignore_errors=True)
    for kind, pick in (("logits/loss", lambda k: "gradients" not in k), ("gradient", lambda k: "gradients" in k)):
        errs = [(v, k) for k, v in worst.items() if pick(k)]
        if errs:
            print("# worst %s error %.2e (%s)" % ((kind,) + max(errs)))
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
