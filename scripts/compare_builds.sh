#!/usr/bin/env bash
# compare_builds.sh -- is a change behaviour-preserving? Runs one fixed set of
# CLI commands with two birkhoff binaries (every attention operator's forward
# and backward with padding and extras; model init + training steps for every
# attention kind, the encoder-decoder, the Set Transformer, OTK pooling, the
# ViT extras, micro-batches) and compares the bytes of what they wrote:
# .npy files whole, checkpoints tensor by tensor (their config text may
# differ in key spelling), exit codes too.
#
#   scripts/compare_builds.sh OLD_BIRKHOFF NEW_BIRKHOFF [WORKDIR]
#
# Prints one line per differing output and "N same, N differ"; exits 1 when
# anything differs. Run it again under OPENBLAS_CORETYPE=Haswell BK_ISA=avx2
# for the portable path. Old key names are used on purpose: a new build must
# still accept them (and convert them) with the same result.
set -u
OLD=$(readlink -f "$1"); NEW=$(readlink -f "$2")
WORK=${3:-$(mktemp -d /tmp/bkcmp.XXXXXX)}
PY=/usr/bin/python3
mkdir -p "$WORK/in" "$WORK/old" "$WORK/new"
cd "$WORK" || exit 2

$PY - "$WORK/in" <<'EOF'
import sys, numpy as np
d = sys.argv[1]; r = np.random.default_rng(7)
f = lambda *s: r.standard_normal(s).astype(np.float32)
B, H, N, M, D = 2, 2, 12, 10, 8
for n, a in {"q": f(B, H, N, D), "k": f(B, H, M, D), "v": f(B, H, M, D), "dout": f(B, H, N, D),
             "qs": f(B, H, N, D), "ks": f(B, H, N, D), "vs": f(B, H, N, D),
             "Z": f(H, 4, D), "th": f(H, 4), "lam": np.array([0.3, 0.6], np.float32)}.items():
    np.save(f"{d}/{n}.npy", a)
np.save(f"{d}/qlen.npy", np.array([12, 9], np.int32)); np.save(f"{d}/klen.npy", np.array([10, 7], np.int32))
np.save(f"{d}/slen.npy", np.array([12, 8], np.int32))
np.save(f"{d}/img.npy", f(6, 1, 8, 8)); np.save(f"{d}/y.npy", np.array([0, 1, 2, 1, 0, 2], np.int32))
np.save(f"{d}/pts.npy", f(6, 8, 3))
t = r.integers(3, 20, (6, 8)).astype(np.int32); np.save(f"{d}/tok.npy", t)
np.save(f"{d}/tlen.npy", np.array([8, 5, 7, 8, 3, 6], np.int32))
g = r.integers(3, 20, (6, 8)).astype(np.int32); gl = np.array([8, 4, 6, 8, 3, 5], np.int32)
for i in range(6): g[i, gl[i] - 1] = 2; g[i, gl[i]:] = 0
np.save(f"{d}/tgt.npy", g); np.save(f"{d}/tgtlen.npy", gl)
EOF

# name | arguments (IN = the inputs' directory, OUT = the build's output directory)
cmds() {
  local A="--q IN/q.npy --k IN/k.npy --v IN/v.npy --q-len IN/qlen.npy --k-len IN/klen.npy --dout IN/dout.npy"
  local S="--q IN/qs.npy --k IN/ks.npy --v IN/vs.npy --q-len IN/slen.npy --k-len IN/slen.npy --dout IN/dout.npy"
  local G="--dq OUT/NAME.dq.npy --dk OUT/NAME.dk.npy --dv OUT/NAME.dv.npy --out OUT/NAME.o.npy --threads 2"
  echo "softmax|attn --op softmax $A $G --attn OUT/NAME.a.npy"
  echo "sinkhorn|attn --op sinkhorn $A $G --iters 7 --eps 0.7 --attn OUT/NAME.a.npy --diag OUT/NAME.diag.npy"
  echo "sinkhorn-impl|attn --op sinkhorn $A $G --iters 40 --grad implicit"
  echo "unbalanced|attn --op unbalanced $A $G --iters 6 --rho 3 --diag OUT/NAME.diag.npy"
  echo "esp-hard|attn --op esp $A $G --sort hard --diag OUT/NAME.diag.npy"
  echo "esp-soft|attn --op esp $A $G --sort soft --softsort-t 0.1 --tau 2 --num-slices 5 --seed 3 --sigma OUT/NAME.sig.npy --dslices OUT/NAME.ds.npy"
  echo "lot|attn --op lot $S $G --pivots IN/Z.npy --pivot-logits IN/th.npy --pivot-temp 0.5 --iters 5 --dpivots OUT/NAME.dZ.npy --dpivot-logits OUT/NAME.dth.npy --diag OUT/NAME.diag.npy"
  echo "diff|attn --op diff $S $G --lambda IN/lam.npy --dlambda OUT/NAME.dl.npy --attn OUT/NAME.a.npy"
  local I="input=image,channels=1,image_h=8,image_w=8,patch=4,dim=16,depth=2,heads=2,mlp_dim=32,classes=3"
  local X="--x IN/img.npy --labels IN/y.npy"
  echo "m-softmax|model:$I,attn=softmax|$X"
  echo "m-sinkhorn|model:$I,attn=sinkhorn,sk_iters=4,sk_eps=0.8|$X"
  echo "m-unbalanced|model:$I,attn=unbalanced,sk_iters=4,sk_rho=3|$X"
  echo "m-esp-soft|model:$I,attn=esp,esp_soft=1,esp_t=0.1,esp_tau=2|$X"
  echo "m-esp-hard|model:$I,attn=esp,esp_soft=0|$X"
  echo "m-esp-slices|model:$I,attn=esp,esp_soft=1,esp_slices=5|$X"
  echo "m-lot|model:$I,attn=lot,lot_r=3,lot_iters=5,lot_temp=0.7|$X"
  echo "m-diff|model:$I,attn=diff|$X"
  echo "m-vit|model:$I,attn=sinkhorn,cls_attn=pol,dwc=1,pool=cls|$X"
  echo "m-otk|model:$I,attn=softmax,cls=0,pool=otk,otk_anchors=4,otk_supports=3|$X"
  echo "m-micro|model:$I,attn=lot,lot_r=2,dropout=0.1|$X --micro 4"
  local P="input=points,point_dim=3,max_points=8,dim=16,depth=2,heads=2,mlp_dim=32,classes=3,cls=0,pos_embed=0"
  echo "m-set|model:$P,set_block=isab,set_inducing=4,pool=pma,pma_attn=sinkhorn,attn=sinkhorn|--x IN/pts.npy --labels IN/y.npy"
  local T="arch=seq2seq,input=tokens,vocab=20,max_len=8,tgt_max_len=8,dim=16,depth=1,dec_depth=1,heads=2,mlp_dim=32"
  local Q="--tokens IN/tok.npy --len IN/tlen.npy --tgt IN/tgt.npy --tgt-len IN/tgtlen.npy"
  echo "s-softmax|model:$T,attn=softmax,cross_attn=softmax|$Q"
  echo "s-sinkhorn|model:$T,attn=sinkhorn,cross_attn=sinkhorn,sk_iters=3|$Q"
  echo "s-esp|model:$T,attn=esp,cross_attn=esp,post_ln=1|$Q --micro 3"
  echo "s-esp-slices|model:$T,attn=esp,cross_attn=esp,esp_slices=3|$Q"
}

run_all() { # BIN OUTDIR
  local bin=$1 out=$2
  cmds | while IFS='|' read -r name a b; do
    if [[ $a == model:* ]]; then
      local cfg=${a#model:} data=${b//IN/$WORK/in}
      "$bin" model init --config "$cfg" --seed 5 --optim "kind=adamw,lr=3e-3,weight_decay=0" --out "$out/$name.init.ckpt" > /dev/null 2> "$out/$name.err"
      echo $? > "$out/$name.rc"
      "$bin" model train --ckpt "$out/$name.init.ckpt" $data --steps 3 --out "$out/$name.ckpt" --losses "$out/$name.loss.npy" > /dev/null 2>> "$out/$name.err"
      echo $? >> "$out/$name.rc"
      mkdir -p "$out/$name.grads"
      "$bin" model grads --ckpt "$out/$name.ckpt" ${data%%--micro*} --out-dir "$out/$name.grads" > /dev/null 2>> "$out/$name.err"
      echo $? >> "$out/$name.rc"
    else
      local args=${a//IN/$WORK/in}; args=${args//OUT/$out}; args=${args//NAME/$name}
      $bin $args > /dev/null 2> "$out/$name.err"; echo $? > "$out/$name.rc"
    fi
  done
}
run_all "$OLD" "$WORK/old"
run_all "$NEW" "$WORK/new"

$PY - "$WORK/old" "$WORK/new" <<'EOF'
import sys, os, json, struct, hashlib
old, new = sys.argv[1:3]
def tensors(p):  # a checkpoint's tensors by name, their bytes' hash
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); base = 8 + n
    return {k: hashlib.sha256(b[base + v["data_offsets"][0]: base + v["data_offsets"][1]]).hexdigest()
            for k, v in h.items() if k != "__metadata__"}
same = differ = 0
for root, _, files in os.walk(old):
    for f in sorted(files):
        if f.endswith(".err"): continue
        po = os.path.join(root, f); pn = os.path.join(new, os.path.relpath(po, old))
        if not os.path.exists(pn): print("missing in new:", os.path.relpath(po, old)); differ += 1; continue
        if f.endswith(".ckpt") or f.endswith(".safetensors"):
            a, b = tensors(po), tensors(pn)
            ok = a == b
            if not ok: print("differs:", os.path.relpath(po, old), sorted(k for k in a if a.get(k) != b.get(k))[:5])
        else:
            ok = open(po, "rb").read() == open(pn, "rb").read()
            if not ok: print("differs:", os.path.relpath(po, old))
        same += ok; differ += not ok
rcs = [f for f in os.listdir(old) if f.endswith(".rc")]
bad = [f for f in rcs if any(x != "0" for x in open(os.path.join(old, f)).read().split())]
if bad: print("commands failing on the OLD build (fix the script):", bad)
print(f"{same} same, {differ} differ")
sys.exit(1 if differ else 0)
EOF
