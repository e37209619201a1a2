#!/usr/bin/env bash
# scripts/repro/text.sh -- text classification with SentencePiece tokens (docs/REPRODUCTION.md,
# experiment 5; Sinkformers' IMDb and ESPFormer's TweetEval, whose data cannot be fetched here):
# the two-layer classifier of configs/spam.conf on the SpamAssassin bodies as SentencePiece ids
# (data = spam-spm, a unigram vocabulary of 8000 trained on the training bodies; the first SEQ
# ids of each message), softmax vs Sinkhorn (S = 3, the paper's IMDb setting) vs ESP
# (soft-trained, evaluated with the exact sort), SEEDS seeds, EPOCHS epochs, on the test split.
#   SEEDS="1 2 3" MODELS="softmax sinkhorn esp" EPOCHS=5 SEQ=256 OUT=runs/repro/text scripts/repro/text.sh
#   QUICK=1: one seed, one epoch, 600 training messages (make repro-quick)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BIRKHOFF:-build/birkhoff}
OUT=${OUT:-runs/repro/text}
SEEDS=${SEEDS:-"1 2 3"}
MODELS=${MODELS:-"softmax sinkhorn esp"}
EPOCHS=${EPOCHS:-5}
SEQ=${SEQ:-256}
LIMIT=0
if [ "${QUICK:-0}" = 1 ]; then SEEDS=1; EPOCHS=1; LIMIT=600; fi
[ -x "$B" ] || make -j"$(nproc)" all
BIRKHOFF="$B" ./scripts/data.sh spam-spm
mkdir -p "$OUT"
start=$(date +%s)
for m in $MODELS; do
    extra=(--attn "$m")
    [ "$m" = sinkhorn ] && extra=(--attn sinkhorn --sk_iters 3)
    [ "$m" = esp ] && extra=(--attn esp --eval_esp_sort hard)
    for s in $SEEDS; do
        dir="$OUT/$m-s$s"
        [ -f "$dir/summary.json" ] && continue
        lim=(); [ "$LIMIT" -gt 0 ] && lim=(--train_limit "$LIMIT" --test_limit 300 --warmup 5)
        "$B" train --config configs/spam.conf --data spam-spm --seq_len "$SEQ" --epochs "$EPOCHS" --seed "$s" \
            --progress none --out "$dir" --force "${lim[@]}" "${extra[@]}"
    done
done
echo "wall: $(( $(date +%s) - start )) s" | tee "$OUT/wall.txt"
/usr/bin/python3 scripts/repro/text_table.py "$OUT" | tee "$OUT/table.md"
