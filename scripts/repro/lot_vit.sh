#!/usr/bin/env bash
# scripts/repro/lot_vit.sh -- LOTFormer's ViT ablation at CPU scale (docs/REPRODUCTION.md,
# experiment 7; lotformer.md section 5.2, Table 3): the ViT of configs/mnist.conf (patch 4: a 7 x 7
# grid + [CLS], width 64, 3 layers, 4 heads of 16, MLP 128, [CLS] pooling, AdamW 2e-3 cosine) with
# LOT attention (r = 8 pivots, T = 5 half-steps, eps = 1) on Fashion-MNIST, the four rows of the
# paper's Table 3 in its order:
#   base     every row doubly stochastic, [CLS] one of the tokens (the paper's "full DS")
#   cls      + [CLS]-softmax (cls_attn=softmax: the [CLS] row a softmax over every token, LOT on
#            the patches)
#   pol      Pol-[CLS] instead (cls_attn=pol; pol_ps 2, pol_po 1: docs/MODEL.md)
#   poldwc   Pol-[CLS] + the depthwise-convolution branch (dwc=1, kernel 3)
# SEEDS seeds each, EPOCHS epochs on the first LIMIT training images, tested on the first TEST test
# images (0: all 10000).
#   SEEDS="1 2 3" VARIANTS="base cls pol poldwc" EPOCHS=2 LIMIT=60000 TEST=0 \
#       OUT=runs/repro/lot_vit scripts/repro/lot_vit.sh
#   QUICK=1: one seed, one epoch on 3000 images, 1000 test images (make repro-quick)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BIRKHOFF:-build/birkhoff}
OUT=${OUT:-runs/repro/lot_vit}
SEEDS=${SEEDS:-"1 2 3"}
VARIANTS=${VARIANTS:-"base cls pol poldwc"}
EPOCHS=${EPOCHS:-2}
LIMIT=${LIMIT:-60000}
TEST=${TEST:-0}
if [ "${QUICK:-0}" = 1 ]; then SEEDS=1; EPOCHS=1; LIMIT=3000; TEST=1000; fi
[ -x "$B" ] || make -j"$(nproc)" all
mkdir -p "$OUT"
warm=$(( EPOCHS * ((LIMIT + 63) / 64) / 10 )); [ "$warm" -ge 1 ] || warm=1
start=$(date +%s)
for v in $VARIANTS; do
    case $v in
        base) extra=(--cls_attn full) ;;
        cls) extra=(--cls_attn softmax) ;;
        pol) extra=(--cls_attn pol --pol_ps 2 --pol_po 1) ;;
        poldwc) extra=(--cls_attn pol --pol_ps 2 --pol_po 1 --dwc 1 --dwc_kernel 3) ;;
        *) echo "lot_vit.sh: unknown variant $v" >&2; exit 2 ;;
    esac
    for s in $SEEDS; do
        dir="$OUT/$v-s$s"
        [ -f "$dir/summary.json" ] && continue
        "$B" train --config configs/mnist.conf --data fashion-mnist --attn lot --lot_r 8 --lot_iters 5 \
            --lot_eps 1 --pool cls --train_limit "$LIMIT" --test_limit "$TEST" --epochs "$EPOCHS" \
            --warmup "$warm" --seed "$s" --progress none --out "$dir" --force "${extra[@]}"
    done
done
echo "wall: $(( $(date +%s) - start )) s" | tee "$OUT/wall.txt"
/usr/bin/python3 scripts/repro/lot_vit_table.py "$OUT" | tee "$OUT/table.md"
