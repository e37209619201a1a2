#!/usr/bin/env bash
# scripts/repro/patches.sh -- the shallow-MNIST patch-size study at CPU scale (docs/REPRODUCTION.md,
# experiment 2: Sinkformers Fig. 6, ESPFormer Fig. 5, ASAP Table C.7): the papers' model (one
# attention layer, one head of width 64 in a 128-wide model, no feed-forward block, no qkv bias,
# pre-LN, [CLS] + learned positions, final LN, linear head), for every patch size in PATCHES, with
# softmax (lr 1e-3), Sinkhorn S = 5 (lr 2e-3) and ESP (soft-trained with tau = 0, lr 2e-3,
# evaluated with the exact sort), Adam, batch 100, the learning rate divided by 10 at 35/45 and
# 41/45 of the run (the papers' epochs 35 and 41 of 45); each Sinkformer is then compiled into ASAP
# (row-ending: S = 5 is odd; L = 256 slices, LS fit) and evaluated against its teacher.
#   SEEDS="1 2 3" PATCHES="4 7 14" MODELS="softmax sinkhorn esp" EPOCHS=6 LIMIT=60000 \
#       OUT=runs/repro/patches scripts/repro/patches.sh
#   QUICK=1: one seed, patch 7 and 14, one epoch on 3000 images, 1000 test images (make repro-quick)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BIRKHOFF:-build/birkhoff}
OUT=${OUT:-runs/repro/patches}
SEEDS=${SEEDS:-"1 2 3"}
PATCHES=${PATCHES:-"4 7 14"}
MODELS=${MODELS:-"softmax sinkhorn esp"}
EPOCHS=${EPOCHS:-6}
LIMIT=${LIMIT:-60000}
TEST=${TEST:-0}
SLICES=${SLICES:-256}
if [ "${QUICK:-0}" = 1 ]; then SEEDS=1; PATCHES="7 14"; EPOCHS=1; LIMIT=3000; TEST=1000; SLICES=32; fi
[ -x "$B" ] || make -j"$(nproc)" all
mkdir -p "$OUT"
MODEL=(--dim 128 --depth 1 --heads 1 --head_dim 64 --mlp_dim 0 --qkv_bias 0 --cls 1 --pos_embed 1
       --final_norm 1 --pool cls --dropout 0)
steps=$(( EPOCHS * ((LIMIT + 99) / 100) ))
m1=$(( steps * 35 / 45 )); m2=$(( steps * 41 / 45 ))
[ "$m1" -ge 1 ] || m1=1; [ "$m2" -gt "$m1" ] || m2=$(( m1 + 1 ))
OPT=(--batch 100 --kind adam --weight_decay 0 --clip 0 --sched step --gamma 0.1 --milestones "$m1:$m2" --warmup 0)
EVAL=()
[ "$TEST" -gt 0 ] && EVAL=(--limit "$TEST")
start=$(date +%s)
for p in $PATCHES; do
    for m in $MODELS; do
        case $m in
            softmax) extra=(--attn softmax --lr 1e-3) ;;
            sinkhorn) extra=(--attn sinkhorn --sk_iters 5 --sk_eps 1 --lr 2e-3) ;;
            esp) extra=(--attn esp --esp_soft 1 --esp_tau 0 --eval_esp_sort hard --lr 2e-3) ;;
            *) echo "patches.sh: unknown model $m" >&2; exit 2 ;;
        esac
        for s in $SEEDS; do
            dir="$OUT/p$p-$m-s$s"
            [ -f "$dir/summary.json" ] && continue
            "$B" train --data mnist --patch "$p" "${MODEL[@]}" "${OPT[@]}" "${extra[@]}" --epochs "$EPOCHS" \
                --train_limit "$LIMIT" --test_limit "$TEST" --seed "$s" --progress none --out "$dir" --force
        done
    done
    if [[ " $MODELS " == *" sinkhorn "* ]]; then
        for s in $SEEDS; do
            teacher="$OUT/p$p-sinkhorn-s$s/last.safetensors"
            name="$OUT/p$p-asap-s$s"
            [ -f "$name.json" ] && continue
            "$B" asap compile --ckpt "$teacher" --out "$name.safetensors" --slices "$SLICES" --fit ls \
                --seed "$s" > "$name.log"
            "$B" eval --ckpt "$name.safetensors" "${EVAL[@]}" --json "$name.json" > /dev/null
        done
    fi
done
echo "wall: $(( $(date +%s) - start )) s" | tee "$OUT/wall.txt"
/usr/bin/python3 scripts/repro/patches_table.py "$OUT" | tee "$OUT/table.md"
