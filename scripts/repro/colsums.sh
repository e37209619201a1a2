#!/usr/bin/env bash
# scripts/repro/colsums.sh -- Sinkformers Figure 2 at CPU scale (docs/REPRODUCTION.md, experiment 1):
# do the column sums of a softmax Transformer's attention move toward 1 during training?
# Trains, with SEEDS seeds and every epoch's checkpoint kept: `mnist`, the softmax ViT of
# configs/mnist.conf (EPOCHS epochs); `mnist1h`, the reference code's Figure 2 model (1 layer, 1 head,
# patch 7, width 128, Adam, batch 10, 2000 steps per epoch on the first 20000 images, 10 epochs; lr
# 5e-4: the reference's 2e-3 does not train this variant); `spam`, a softmax byte-level text
# classifier on the SpamAssassin corpus (configs/spam.conf, SPAM_EPOCHS epochs). The table
# (scripts/repro/colsums_table.py) gives the mean |column sum - 1| per epoch (median and range
# over seeds) and the column-sum quantiles at each epoch, and `birkhoff plot colsums` the
# histograms.
#   SEEDS="1 2 3" EPOCHS=5 SPAM_EPOCHS=4 TASKS="mnist mnist1h spam" OUT=runs/repro/colsums \
#       scripts/repro/colsums.sh
#   QUICK=1: one seed, one epoch on 2000 images (make repro-quick)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BIRKHOFF:-build/birkhoff}
OUT=${OUT:-runs/repro/colsums}
SEEDS=${SEEDS:-"1 2 3"}
EPOCHS=${EPOCHS:-5}
SPAM_EPOCHS=${SPAM_EPOCHS:-4}
TASKS=${TASKS:-"mnist mnist1h spam"}
EXTRA=()
if [ "${QUICK:-0}" = 1 ]; then SEEDS=1; EPOCHS=1; SPAM_EPOCHS=1; EXTRA=(--train_limit 2000 --test_limit 500 --warmup 10); fi
[ -x "$B" ] || make -j"$(nproc)" all
mkdir -p "$OUT"
start=$(date +%s)
for task in $TASKS; do
    for s in $SEEDS; do
        dir="$OUT/$task-s$s"
        [ -f "$dir/summary.json" ] && { echo "have $dir"; continue; }
        case $task in
        mnist) "$B" train --config configs/mnist.conf --attn softmax --seed "$s" --epochs "$EPOCHS" \
                   --progress none --out "$dir" --force "${EXTRA[@]}" ;;
        mnist1h) "$B" train --data mnist --attn softmax --patch 7 --dim 128 --depth 1 --heads 1 --mlp_dim 128 \
                   --kind adam --lr 5e-4 --weight_decay 0 --sched constant --warmup 100 --batch 10 \
                   --train_limit 20000 --epochs "$([ "${QUICK:-0}" = 1 ] && echo 1 || echo 10)" --seed "$s" \
                   --progress none --out "$dir" --force "${EXTRA[@]}" ;;
        spam)  "$B" train --config configs/spam.conf --attn softmax --seed "$s" --epochs "$SPAM_EPOCHS" \
                   --progress none --out "$dir" --force "${EXTRA[@]}" ;;
        esac
    done
done
echo "wall: $(( $(date +%s) - start )) s" | tee "$OUT/wall.txt"
for task in $TASKS; do
    last=$(ls "$OUT/$task-s1/ckpt" | sed -n 's/epoch-0*\([0-9][0-9]*\)\.safetensors/\1/p' | sort -n | tail -1)
    eps=$(seq -s, 0 "${last:-0}")
    "$B" plot colsums --run "$OUT/$task-s1" --epochs "$eps" --out "$OUT/colsums-$task.png" \
        > "$OUT/colsums-$task.txt" || true
    for s in $SEEDS; do
        "$B" plot colsums --run "$OUT/$task-s$s" --epochs "$eps" --out "$OUT/colsums-$task-s$s.png" \
            > "$OUT/colsums-$task-s$s.txt" || true
    done
done
/usr/bin/python3 scripts/repro/colsums_table.py "$OUT" | tee "$OUT/table.md"
