#!/usr/bin/env bash
# The README's main job: fetch MNIST, train a Transformer (softmax attention)
# and a Sinkformer (Sinkhorn attention) with the same configuration, compile
# the Sinkformer into ASAP, evaluate all three, print the diagnostics side by
# side and draw the figures. Outputs under $OUT (default runs/main).
# EPOCHS (default 3) and THREADS (default: all cores) adjust it.
set -euo pipefail
cd "$(dirname "$0")/.."
B=./build/birkhoff
OUT="${OUT:-runs/main}"
EPOCHS="${EPOCHS:-3}"
THREADS="${THREADS:-0}"
t0=$(date +%s)
scripts/data.sh mnist
mkdir -p "$OUT/figures"
for a in softmax sinkhorn; do
  name=$([ $a = softmax ] && echo transformer || echo sinkformer)
  echo "== training the $name ($a attention, $EPOCHS epochs)"
  $B train --config configs/mnist.conf --attn $a --epochs "$EPOCHS" --threads "$THREADS" --out "$OUT/$name" --force
done
echo "== compiling the Sinkformer into ASAP (loop-free Sinkhorn)"
$B asap compile --ckpt "$OUT/sinkformer/best.safetensors" --out "$OUT/sinkformer/asap.safetensors" --samples 1024
echo "== evaluating on the 10,000 test images"
$B eval --ckpt "$OUT/transformer/best.safetensors" --json "$OUT/transformer/eval.json" > "$OUT/transformer/eval.txt"
$B eval --ckpt "$OUT/sinkformer/best.safetensors" --json "$OUT/sinkformer/eval.json" > "$OUT/sinkformer/eval.txt"
$B eval --ckpt "$OUT/sinkformer/asap.safetensors" --json "$OUT/sinkformer/asap-eval.json" > "$OUT/sinkformer/asap-eval.txt"
echo "== figures"
$B plot curves --run "$OUT/transformer" --run "$OUT/sinkformer" --out "$OUT/figures/curves.png"
$B plot attention --ckpt "$OUT/transformer/best.safetensors" --ckpt "$OUT/sinkformer/best.safetensors" --index 0 --out "$OUT/figures/attention.png"
$B plot colsums --run "$OUT/transformer" --run "$OUT/sinkformer" --out "$OUT/figures/colsums.png"
$B plot transport --n 12 --eps 0.1 --out "$OUT/figures/transport.png"
t1=$(date +%s)
/usr/bin/env python3 - "$OUT" $((t1 - t0)) <<'PY' 2>/dev/null || cat "$OUT"/transformer/eval.txt "$OUT"/sinkformer/eval.txt
import json, sys
out, secs = sys.argv[1], int(sys.argv[2])
rows = [("Transformer (softmax)", f"{out}/transformer"), ("Sinkformer (Sinkhorn)", f"{out}/sinkformer"),
        ("Sinkformer -> ASAP", None)]
def load(p): return json.load(open(p))
print()
print(f"{'model':<24}{'test acc':>9}{'loss':>8}{'|row-1|':>10}{'|col-1|':>10}{'entropy':>9}{'train s':>9}")
for name, d in rows:
    e = load(f"{d}/eval.json") if d else load(f"{out}/sinkformer/asap-eval.json")
    s = load(f"{d}/summary.json")["time_s"] if d else float("nan")
    L = e["layers"]
    r = sum(l["row_dev"] for l in L) / len(L); c = sum(l["col_dev"] for l in L) / len(L)
    h = sum(l["entropy"] for l in L) / len(L)
    print(f"{name:<24}{100*e['accuracy']:>8.2f}%{e['loss']:>8.4f}{r:>10.2g}{c:>10.2g}{h:>9.3f}{s:>9.0f}" if s == s else f"{name:<24}{100*e['accuracy']:>8.2f}%{e['loss']:>8.4f}{r:>10.2g}{c:>10.2g}{h:>9.3f}{'-':>9}")
a = load(f"{out}/sinkformer/asap-eval.json")
print(f"\nASAP agrees with its Sinkhorn teacher on {100*a['agreement']:.2f}% of the test images.")
print("|row-1|, |col-1|: mean deviation of attention row/column sums from 1 (all layers, 64 test images);")
print("a doubly-stochastic attention has both near 0, softmax only the rows.")
print(f"\nDone in {secs // 60} min {secs % 60} s. Outputs:")
print(f"  {out}/transformer/, {out}/sinkformer/   runs: metrics.jsonl, epochs.csv, checkpoints, eval.txt")
print(f"  {out}/sinkformer/asap.safetensors      the compiled ASAP model")
print(f"  {out}/figures/                          curves.png attention.png colsums.png transport.png")
PY
