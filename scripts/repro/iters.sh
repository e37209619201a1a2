#!/usr/bin/env bash
# scripts/repro/iters.sh -- the Sinkformers' iteration-count sweep at CPU scale (docs/REPRODUCTION.md,
# experiment 3): test accuracy of a set Transformer on generated point clouds (12 shape classes,
# dataset `shapes`) for S = 1 (softmax), 3, 5, 9 Sinkhorn half-steps, SEEDS seeds each. No
# positions, mean pooling: permutation invariant, as the papers' point-cloud models.
#   SEEDS="1 2 3" ITERS="1 3 5 9" EPOCHS=20 NTRAIN=10000 NTEST=2000 POINTS=64 OUT=runs/repro/iters \
#       scripts/repro/iters.sh
#   QUICK=1: one seed, S = 1 and 3, one epoch on 600 clouds (make repro-quick)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BIRKHOFF:-build/birkhoff}
OUT=${OUT:-runs/repro/iters}
SEEDS=${SEEDS:-"1 2 3"}
ITERS=${ITERS:-"1 3 5 9"}
EPOCHS=${EPOCHS:-20}
NTRAIN=${NTRAIN:-10000}
NTEST=${NTEST:-2000}
POINTS=${POINTS:-64}
if [ "${QUICK:-0}" = 1 ]; then SEEDS=1; ITERS="1 3"; EPOCHS=1; NTRAIN=600; NTEST=240; POINTS=32; fi
[ -x "$B" ] || make -j"$(nproc)" all
mkdir -p "$OUT"
start=$(date +%s)
for S in $ITERS; do
    for s in $SEEDS; do
        dir="$OUT/S$S-s$s"
        [ -f "$dir/summary.json" ] && { echo "have $dir"; continue; }
        "$B" train --data shapes --points "$POINTS" --gen_train "$NTRAIN" --gen_test "$NTEST" \
            --attn sinkhorn --sk_iters "$S" --sk_eps 1 --dim 64 --depth 2 --heads 4 --mlp_dim 128 \
            --pool mean --cls 0 --pos_embed 0 --epochs "$EPOCHS" --batch 32 --lr 1e-3 --warmup 50 \
            --seed "$s" --progress none --out "$dir" --force
    done
done
echo "wall: $(( $(date +%s) - start )) s" | tee "$OUT/wall.txt"
/usr/bin/python3 scripts/repro/iters_table.py "$OUT" | tee "$OUT/table.md"
