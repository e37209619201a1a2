#!/bin/sh
# The papers' NMT protocol (Sinkformers Table 2, ESPFormer Table 5, LOTFormer
# Table 5) at CPU scale on the Spanish -> English Bible corpus
# (docs/TRANSLATION.md, "Plug-and-play protocol"):
#   1. train a Transformer (softmax) and a DiffTransformer (attn=diff) base;
#   2. plug-and-play: swap the encoder's self-attention of each trained base
#      to Sinkhorn, ESP and LOT, no training, and score it;
#   3. fine-tune boost: each swapped model (and the base itself) trained
#      FT_EPOCHS more epochs at a 10x lower learning rate, and scored.
# Scores: corpus BLEU (13a, detokenised) with beam 5 on the first TEST_N
# test sentences. One line per (base, attention, seed) in OUT/results.tsv;
# scripts/repro/translation_table.py makes the median table.
#
# usage: scripts/repro/translation.sh [OUT]   (default runs/translation)
# env:   SEEDS ("1 2"), LIMIT (8000 training pairs), LEN (64: longest
#        source/target pieces incl. EOS), EPOCHS (4), FT_EPOCHS (1),
#        TEST_N (500), BEAM (5), BK (build/birkhoff), DATA (data)
set -eu
OUT=${1:-runs/translation}
SEEDS=${SEEDS:-"1 2"}
LIMIT=${LIMIT:-8000}
LEN=${LEN:-64}
EPOCHS=${EPOCHS:-4}
FT_EPOCHS=${FT_EPOCHS:-1}
TEST_N=${TEST_N:-500}
BEAM=${BEAM:-5}
BK=${BK:-build/birkhoff}
DATA=${DATA:-data}
LR=2e-3
FT_LR=2e-4 # LR / 10
mkdir -p "$OUT"
[ -f "$DATA/bible/spm.model" ] || { echo "translation.sh: run scripts/data.sh bible && scripts/data.sh bible-spm first" >&2; exit 1; }
# the test subset: sentences whose pieces fit LEN (with EOS), first TEST_N
/usr/bin/python3 - "$DATA/bible" "$OUT" "$LEN" "$TEST_N" <<'PY'
import sys
d, out, L, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
es = open(f"{d}/test.es", encoding="utf-8").read().split("\n")
en = open(f"{d}/test.en", encoding="utf-8").read().split("\n")
ies = open(f"{d}/test.es.ids").read().split("\n")
ien = open(f"{d}/test.en.ids").read().split("\n")
keep = [i for i in range(len(ies)) if ies[i] and len(ies[i].split()) + 1 <= L and len(ien[i].split()) + 1 <= L][:n]
open(f"{out}/test.es", "w", encoding="utf-8").write("".join(es[i] + "\n" for i in keep))
open(f"{out}/test.en", "w", encoding="utf-8").write("".join(en[i] + "\n" for i in keep))
PY
RES="$OUT/results.tsv"
[ -f "$RES" ] || printf 'base\tattention\tseed\tstage\tbleu\tchrf\n' > "$RES"

score() { # score CKPT BASE ATTN SEED STAGE
    "$BK" translate --ckpt "$1" --input "$OUT/test.es" --ref "$OUT/test.en" --beam "$BEAM" \
        --spm "$DATA/bible/spm.model" --output "$OUT/hyp.$2.$3.$4.$5.en" 2> "$OUT/score.log"
    b=$(sed -n 's/^BLEU = \([0-9.]*\).*/\1/p' "$OUT/score.log")
    c=$(sed -n 's/^chrF2 = \([0-9.]*\).*/\1/p' "$OUT/score.log")
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$2" "$3" "$4" "$5" "$b" "$c" >> "$RES"
    echo "  $2 -> $3 seed $4 $5: BLEU $b chrF2 $c"
}

# (a fine-tuning run starts from its checkpoint's run and model: no config
# file, whose attn would swap the attention back)
FTC="--data-dir $DATA --train-limit $LIMIT --test-limit 500 --seq-len $LEN --tgt-len $LEN --progress none --force"
COMMON="--config configs/bible.conf $FTC"
for seed in $SEEDS; do
    for base in softmax diff; do
        B="$OUT/$base-s$seed"
        echo "base $base seed $seed: $EPOCHS epochs"
        "$BK" train $COMMON --out "$B" --seed "$seed" --attn "$base" --epochs "$EPOCHS" --lr $LR > "$B.log"
        score "$B/last.safetensors" "$base" "$base" "$seed" base
        # fine-tune boost of the base itself
        "$BK" train --init "$B/last.safetensors" $FTC --out "$B-ft" --epochs "$FT_EPOCHS" --lr $FT_LR \
            --sched constant --warmup 0 > "$B-ft.log"
        score "$B-ft/last.safetensors" "$base" "$base" "$seed" ft
        for to in sinkhorn esp lot; do
            case $to in
                sinkhorn) keys="sk_iters=5 sk_eps=1" ;;
                esp) keys="esp_soft=1 esp_t=1e-3 esp_tau=10" ;;
                lot) keys="lot_r=32 lot_iters=5 lot_eps=1" ;;
            esac
            S="$OUT/$base-s$seed-$to"
            # shellcheck disable=SC2086
            "$BK" model swap --in "$B/last.safetensors" --out "$S.safetensors" --attn $to $keys > /dev/null
            score "$S.safetensors" "$base" "$to" "$seed" pnp
            "$BK" train --init "$S.safetensors" $FTC --out "$S-ft" --epochs "$FT_EPOCHS" --lr $FT_LR \
                --sched constant --warmup 0 > "$S-ft.log"
            score "$S-ft/last.safetensors" "$base" "$to" "$seed" ft
        done
    done
done
/usr/bin/python3 scripts/repro/translation_table.py "$RES"
