#!/usr/bin/env bash
# bench/loaded.sh -- speed on a busy machine (docs/PERFORMANCE.md, "On a busy
# machine"): each case at 1 thread and at T threads (default: every CPU), idle,
# beside one busy single-threaded process, and beside a second multi-threaded
# birkhoff job (Sinkhorn f+b, B*H = 4, N = 1024, T threads, of the same build),
# in ROUNDS interleaved rounds. The loads are started here, not by the bench,
# so that any build (an older one included) is measured the same way.
#
#   bench/loaded.sh [BIRKHOFF] [CASES]      ROUNDS=3 T=$(nproc) LOADS="idle busy job"
#
# Prints one line per run (case, load, threads, seconds: f+b median, or the
# training step's median) and, at the end, per case and load the median over
# the rounds and the ratio T threads / 1 thread (below 1: faster on T).
set -euo pipefail
BK=${1:-build/birkhoff}
ROUNDS=${ROUNDS:-3}
T=${T:-$(nproc)}
LOADS=${LOADS:-idle busy job}
DEFAULT_CASES="sinkhorn:1:4096:64:5 softmax:8:1024:64 lot:1:4096:64 lot:1:65536:64 esp-hard:1:65536:64 train:attn=softmax train:attn=sinkhorn;sk_iters=5 train-s2s:attn=softmax"
CASES=${2:-$DEFAULT_CASES}
S2S="arch=seq2seq,input=tokens,vocab=1000,max_len=32,tgt_max_len=32,dim=128,depth=2,dec_depth=2,heads=4,mlp_dim=256"

load_pids=()
start_load() {
    case "$1" in
    idle) ;;
    busy) (while :; do :; done) & load_pids+=($!) ;;
    job) "$BK" bench --op sinkhorn --cases 4:1024:64:5 --no-peer --reps 1000000 --warmup 0 --threads "$T" \
             >/dev/null 2>&1 & load_pids+=($!) ;;
    esac
    [ "$1" = idle ] || sleep 0.5
}
stop_load() {
    for p in "${load_pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    for p in "${load_pids[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
    load_pids=()
}
trap stop_load EXIT

# one run: prints seconds
one() {
    local c=$1 t=$2 op=${1%%:*} rest=${1#*:}
    case "$op" in
    train) "$BK" bench --op train --steps 6 --warmup 2 --no-peer --threads "$t" --attn "$rest" --json 2>/dev/null |
               sed -n 's/.*"step_median_s": \([0-9.e-]*\).*/\1/p' | head -1 ;;
    train-s2s) "$BK" bench --op train --config "$S2S" --batch 32 --steps 6 --warmup 2 --no-peer --threads "$t" \
                   --attn "$rest" --json 2>/dev/null | sed -n 's/.*"step_median_s": \([0-9.e-]*\).*/\1/p' | head -1 ;;
    *) "$BK" bench --op "$op" --cases "$rest" --no-peer --reps 7 --warmup 2 --threads "$t" --json 2>/dev/null |
           sed -n 's/.*"fwdbwd_median_s": \([0-9.e-]*\).*/\1/p' | head -1 ;;
    esac
}

out=$(mktemp)
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, T = $T, $BK ($("$BK" version | head -1))"
for r in $(seq "$ROUNDS"); do
    for load in $LOADS; do
        start_load "$load"
        for c in $CASES; do
            for t in 1 "$T"; do
                s=$(one "$c" "$t" || true)
                echo "$c	$load	$t	${s:-fail}" | tee -a "$out"
            done
        done
        stop_load
    done
done
echo "# medians over $ROUNDS rounds: case, load, 1 thread, $T threads, $T/1"
python3 - "$out" "$T" <<'EOF'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    c, load, t, s = line.rstrip("\n").split("\t")
    if s != "fail":
        rows[(c, load, t)].append(float(s))
T = sys.argv[2]
seen = []
for (c, load, t) in rows:
    if (c, load) not in seen:
        seen.append((c, load))
for c, load in seen:
    a, b = rows.get((c, load, "1")), rows.get((c, load, T))
    if a and b:
        m1, mt = statistics.median(a), statistics.median(b)
        print(f"{c:28s} {load:5s} {m1 * 1e3:9.2f} ms {mt * 1e3:9.2f} ms  {mt / m1:5.2f}"
              f"   (1: {min(a) * 1e3:.2f}-{max(a) * 1e3:.2f}, {T}: {min(b) * 1e3:.2f}-{max(b) * 1e3:.2f})")
EOF
rm -f "$out"
