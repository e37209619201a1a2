#!/usr/bin/env bash
# scripts/repro/lowdata.sh -- ESPFormer's low-data regime at CPU scale (docs/REPRODUCTION.md,
# experiment 4): the ViT of configs/mnist.conf on Fashion-MNIST trained on the first FRACS percent
# of the training set with softmax, Sinkhorn (S = 5) and ESP (soft-trained, evaluated with the
# exact sort; "espa": the same with the SoftSort temperature annealed by 0.8 per epoch, ESPFormer's
# "sharp soft" training, --esp-anneal 0.8), SEEDS seeds. Every run sees STEPS_IMAGES training
# images whatever the fraction
# (1 %: 50 epochs of 600 images; 10 %: 5 epochs of 6000); tested on the first TEST test images.
#   SEEDS="1 2 3" FRACS="1 10" MODELS="softmax sinkhorn esp" STEPS_IMAGES=30000 TEST=1000 \
#       OUT=runs/repro/lowdata scripts/repro/lowdata.sh
#   QUICK=1: one seed, 1 % only, 1200 images seen (make repro-quick)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BIRKHOFF:-build/birkhoff}
OUT=${OUT:-runs/repro/lowdata}
SEEDS=${SEEDS:-"1 2 3"}
FRACS=${FRACS:-"1 10"}
MODELS=${MODELS:-"softmax sinkhorn esp"}
STEPS_IMAGES=${STEPS_IMAGES:-30000}
TEST=${TEST:-1000}
if [ "${QUICK:-0}" = 1 ]; then SEEDS=1; FRACS=1; STEPS_IMAGES=1200; TEST=300; fi
[ -x "$B" ] || make -j"$(nproc)" all
mkdir -p "$OUT"
start=$(date +%s)
for f in $FRACS; do
    n=$(( 60000 * f / 100 ))
    epochs=$(( STEPS_IMAGES / n )); [ "$epochs" -ge 1 ] || epochs=1
    warm=$(( epochs * ((n + 63) / 64) / 10 )); [ "$warm" -ge 1 ] || warm=1
    for m in $MODELS; do
        extra=(--attn "$m")
        [ "$m" = esp ] && extra=(--attn esp --eval_esp_sort hard)
        [ "$m" = espa ] && extra=(--attn esp --esp_anneal 0.8 --eval_esp_sort hard)
        for s in $SEEDS; do
            dir="$OUT/f$f-$m-s$s"
            [ -f "$dir/summary.json" ] && continue
            "$B" train --config configs/mnist.conf --data fashion-mnist --train_limit "$n" \
                --test_limit "$TEST" --epochs "$epochs" --warmup "$warm" --seed "$s" --progress none \
                --out "$dir" --force "${extra[@]}"
        done
    done
done
echo "wall: $(( $(date +%s) - start )) s" | tee "$OUT/wall.txt"
/usr/bin/python3 scripts/repro/lowdata_table.py "$OUT" | tee "$OUT/table.md"
