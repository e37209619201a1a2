#!/usr/bin/env bash
# scripts/repro/asap.sh -- ASAP compile sweeps at CPU scale (docs/REPRODUCTION.md, experiment 10):
# the MNIST Sinkformer of configs/mnist.conf (attn = sinkhorn, S = 5: a row-ending teacher) is
# trained with SEEDS seeds, then compiled for every number of slices L in SLICES and both
# calibrations (LS, then KL); each compiled model's test accuracy, its agreement with its teacher
# and the compile time go to runs/repro/asap/table.md (scripts/repro/asap_table.py). Each compiled
# model is also evaluated with the other endings of ENDINGS (ASAP-0 "zero", "column"; the
# compiled one is auto = row for S = 5) on the slice counts ENDING_SLICES: one compilation serves
# every ending (birkhoff eval --asap-ending).
#   SEEDS="1 2 3" EPOCHS=3 SLICES="8 32 128 256" FITS="ls kl" ENDINGS="zero column" \
#       ENDING_SLICES="32 256" OUT=runs/repro/asap scripts/repro/asap.sh
#   QUICK=1: one seed, one epoch on 2000 images, L = 8, LS only, ASAP-0 too (make repro-quick)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BIRKHOFF:-build/birkhoff}
OUT=${OUT:-runs/repro/asap}
SEEDS=${SEEDS:-"1 2 3"}
EPOCHS=${EPOCHS:-3}
SLICES=${SLICES:-"8 32 128 256"}
FITS=${FITS:-"ls kl"}
ENDINGS=${ENDINGS:-"zero column"}
ENDING_SLICES=${ENDING_SLICES:-"32 256"}
EXTRA=()
LIMIT=()
if [ "${QUICK:-0}" = 1 ]; then
    SEEDS=1; EPOCHS=1; SLICES=8; FITS=ls; ENDINGS=zero; ENDING_SLICES=8
    EXTRA=(--train_limit 2000 --test_limit 500 --warmup 10); LIMIT=(--limit 500)
fi
[ -x "$B" ] || make -j"$(nproc)" all
mkdir -p "$OUT"
start=$(date +%s)
for s in $SEEDS; do
    dir="$OUT/sinkformer-s$s"
    [ -f "$dir/summary.json" ] || "$B" train --config configs/mnist.conf --attn sinkhorn --seed "$s" \
        --epochs "$EPOCHS" --progress none --out "$dir" --force "${EXTRA[@]}"
    [ -f "$OUT/teacher-s$s.json" ] || "$B" eval --ckpt "$dir/last.safetensors" "${LIMIT[@]}" \
        --json "$OUT/teacher-s$s.json" > /dev/null
    for L in $SLICES; do
        for fit in $FITS; do
            name="asap-s$s-L$L-$fit"
            if [ ! -f "$OUT/$name.json" ]; then
                t0=$(date +%s.%N)
                "$B" asap compile --ckpt "$dir/last.safetensors" --out "$OUT/$name.safetensors" --slices "$L" \
                    --fit "$fit" --seed "$s" > "$OUT/$name.log"
                t1=$(date +%s.%N)
                echo "$t0 $t1" | awk '{printf "%.2f\n", $2 - $1}' > "$OUT/$name.time"
                "$B" eval --ckpt "$OUT/$name.safetensors" "${LIMIT[@]}" --json "$OUT/$name.json" > /dev/null
            fi
            [[ " $ENDING_SLICES " == *" $L "* ]] || continue
            for e in $ENDINGS; do
                [ -f "$OUT/$name-$e.json" ] || "$B" eval --ckpt "$OUT/$name.safetensors" "${LIMIT[@]}" \
                    --asap-ending "$e" --json "$OUT/$name-$e.json" > /dev/null
            done
        done
    done
done
echo "wall: $(( $(date +%s) - start )) s" | tee "$OUT/wall.txt"
/usr/bin/python3 scripts/repro/asap_table.py "$OUT" | tee "$OUT/table.md"
