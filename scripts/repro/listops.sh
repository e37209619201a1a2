#!/usr/bin/env bash
# scripts/repro/listops.sh -- LOTFormer on ListOps at CPU scale (docs/REPRODUCTION.md, experiment
# 6): the LRA ListOps model of LOTFormer's code (2 pre-LN blocks, dim 64, 2 heads of 32, MLP 128,
# learned positions, mean pooling) on the generated ListOps (LRA's rules and depth 10, sequences
# of SEQ/4..SEQ tokens) with softmax attention and with LOT (r = 32, T = 5, eps = 1, mass
# temperature 8), and LOT's ablations: r in {4, 8}, T in {1, 10}, lot_learn z (uniform masses) and
# none (fixed pivots, uniform masses); SEEDS seeds each. Then the time and memory of one LOT attention call
# (forward and forward + backward, 2 heads of 32, r = 32, T = 5) against N, next to softmax and
# Sinkhorn (S = 5), from `birkhoff bench` (BENCH=0 skips it).
#   SEEDS="1 2 3" SEQ=256 NTRAIN=10000 NTEST=2000 EPOCHS=2 OUT=runs/repro/listops \
#       scripts/repro/listops.sh
#   (RUNS="name:keys ..." picks runs, BENCH=0 skips the bench, THREADS=1 suits a shared machine,
#   BENCH_THREADS the bench's threads)
#   QUICK=1: one seed, softmax and LOT, one epoch of 600 sequences of <= 64 tokens, a short bench
#   (make repro-quick)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BIRKHOFF:-build/birkhoff}
OUT=${OUT:-runs/repro/listops}
SEEDS=${SEEDS:-"1 2 3"}
SEQ=${SEQ:-256}
NTRAIN=${NTRAIN:-10000}
NTEST=${NTEST:-2000}
EPOCHS=${EPOCHS:-2}
BENCH=${BENCH:-1}
THREADS=${THREADS:-0}   # training threads (0: all; the results do not depend on it)
# name:extra keys (the LOT runs share LOT below)
RUNS=${RUNS:-"softmax:attn=softmax lot:. r4:lot_r=4 r8:lot_r=8 T1:lot_iters=1 T10:lot_iters=10 \
learnz:lot_learn=z fixed:lot_learn=none"}
LOT="attn=lot lot_r=32 lot_iters=5 lot_eps=1 lot_temp=8"
BENCH_N=${BENCH_N:-"512 2048 8192 16384 65536 262144 1048576"}
BENCH_NQ=${BENCH_NQ:-16384}   # the quadratic operators run up to this N
BENCH_REPS=${BENCH_REPS:-5}
BENCH_THREADS=${BENCH_THREADS:-2}
if [ "${QUICK:-0}" = 1 ]; then
    SEEDS=1; SEQ=64; NTRAIN=600; NTEST=200; EPOCHS=1; RUNS="softmax:attn=softmax lot:."
    BENCH_N="512 2048"; BENCH_NQ=2048; BENCH_REPS=3
fi
[ -x "$B" ] || make -j"$(nproc)" all
mkdir -p "$OUT"
start=$(date +%s)
for run in $RUNS; do
    name=${run%%:*}
    keys=${run#*:}
    extra=()
    if [ "$name" != softmax ]; then for kv in $LOT; do extra+=(--set "$kv"); done; fi
    [ "$keys" = . ] || extra+=(--set "$keys")
    for s in $SEEDS; do
        dir="$OUT/$name-s$s"
        [ -f "$dir/summary.json" ] && { echo "have $dir"; continue; }
        "$B" train --data listops --seq_len "$SEQ" --listops_depth 10 --gen_train "$NTRAIN" \
            --gen_test "$NTEST" --input tokens --cls 0 --pos_embed 1 --pool mean --dim 64 \
            --depth 2 --heads 2 --mlp_dim 128 --epochs "$EPOCHS" --batch 32 --lr 1e-3 \
            --weight_decay 0 --sched cosine --warmup $(( EPOCHS * NTRAIN / 32 / 10 + 1 )) --clip 5 \
            --seed "$s" --threads "$THREADS" --progress none --out "$dir" --force "${extra[@]}"
    done
done
echo "wall (training): $(( $(date +%s) - start )) s" | tee "$OUT/wall.txt"
if [ "$BENCH" = 1 ]; then
    bstart=$(date +%s)
    : > "$OUT/bench.jsonl.tmp"
    for n in $BENCH_N; do
        ops="lot"
        [ "$n" -le "$BENCH_NQ" ] && ops="lot softmax sinkhorn"
        for op in $ops; do
            "$B" bench --op "$op" --cases "2:$n:32:5" --reps "$BENCH_REPS" --warmup 1 --threads "$BENCH_THREADS" \
                --json --no-peer \
                | grep '^{' >> "$OUT/bench.jsonl.tmp"
        done
    done
    mv "$OUT/bench.jsonl.tmp" "$OUT/bench.jsonl"
    echo "wall (bench): $(( $(date +%s) - bstart )) s" | tee -a "$OUT/wall.txt"
fi
/usr/bin/python3 scripts/repro/listops_table.py "$OUT" | tee "$OUT/table.md"
