#!/usr/bin/env bash
# scripts/repro/sets.sh -- Set Transformer vs Set Sinkformer vs Set ESPFormer at CPU scale
# (docs/REPRODUCTION.md, experiment 8; Sinkformers Table 1, ESPFormer Table 2): point-cloud
# classification on the generated clouds (12 shape classes, dataset `shapes`) with the engine's
# Set Transformer: 2 ISAB blocks (set_inducing inducing points) and PMA pooling (one seed), the
# ISAB attentions softmax, Sinkhorn (S = SK_ITERS half-steps, eps 1) or ESP (soft-trained,
# evaluated with the exact sort), SEEDS seeds each. The PMA's own attention is softmax in every
# model (PMA_ATTN; with one seed a doubly-stochastic PMA is exactly mean pooling: MODEL.md); the
# optional model "sinkpma" is the reference code's Set Sinkformer, Sinkhorn in the PMA too.
# No positions, no [CLS]: permutation invariant. AdamW 1e-3, cosine, batch 32.
#   SEEDS="1 2 3" MODELS="softmax sinkhorn esp" EPOCHS=10 NTRAIN=5000 NTEST=1000 POINTS=64 \
#       INDUCING=16 SK_ITERS=21 WARMUP=50 THREADS=0 OUT=runs/repro/sets scripts/repro/sets.sh
#   Cost (one core, measured at 1000 clouds): per 1000 training clouds and epoch about 1.7 s softmax,
#   2.5 s Sinkhorn S = 21, 10 s ESP (soft sort over 64 x 64 ranks, 16 slices): the default run is
#   about 36 CPU-minutes, 20-25 minutes on 2 free cores; ESP is 70 % of it.
#   QUICK=1: one seed, one epoch on 600 clouds of 32 points, warm-up 5 steps (make repro-quick)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BIRKHOFF:-build/birkhoff}
OUT=${OUT:-runs/repro/sets}
SEEDS=${SEEDS:-"1 2 3"}
MODELS=${MODELS:-"softmax sinkhorn esp"}
EPOCHS=${EPOCHS:-10}
NTRAIN=${NTRAIN:-5000}
NTEST=${NTEST:-1000}
POINTS=${POINTS:-64}
INDUCING=${INDUCING:-16}
SK_ITERS=${SK_ITERS:-21}
PMA_ATTN=${PMA_ATTN:-softmax}
WARMUP=${WARMUP:-50}
THREADS=${THREADS:-0}   # 0: every core (results do not depend on it; on a busy machine 1 can be faster)
if [ "${QUICK:-0}" = 1 ]; then SEEDS=1; EPOCHS=1; NTRAIN=600; NTEST=240; POINTS=32; WARMUP=5; fi
[ -x "$B" ] || make -j"$(nproc)" all
mkdir -p "$OUT"
start=$(date +%s)
for m in $MODELS; do
    case "$m" in
        softmax) extra=(--attn softmax --pma_attn "$PMA_ATTN") ;;
        sinkhorn) extra=(--attn sinkhorn --sk_iters "$SK_ITERS" --sk_eps 1 --pma_attn "$PMA_ATTN") ;;
        sinkpma) extra=(--attn sinkhorn --sk_iters "$SK_ITERS" --sk_eps 1 --pma_attn sinkhorn) ;;
        esp) extra=(--attn esp --eval_esp_sort hard --pma_attn "$PMA_ATTN") ;;
        *) echo "sets.sh: unknown model '$m' (softmax, sinkhorn, sinkpma, esp)" >&2; exit 2 ;;
    esac
    for s in $SEEDS; do
        dir="$OUT/$m-s$s"
        [ -f "$dir/summary.json" ] && { echo "have $dir"; continue; }
        "$B" train --data shapes --points "$POINTS" --gen_train "$NTRAIN" --gen_test "$NTEST" \
            --set_block isab --set_inducing "$INDUCING" --pool pma --pma_seeds 1 \
            --dim 64 --depth 2 --heads 4 --mlp_dim 128 --cls 0 --pos_embed 0 \
            --epochs "$EPOCHS" --batch 32 --lr 1e-3 --sched cosine --warmup "$WARMUP" \
            --seed "$s" --threads "$THREADS" --progress none --out "$dir" --force "${extra[@]}"
    done
done
echo "wall: $(( $(date +%s) - start )) s" | tee "$OUT/wall.txt"
/usr/bin/python3 scripts/repro/sets_table.py "$OUT" | tee "$OUT/table.md"
