#!/usr/bin/env bash
# compare_bench.sh -- is a change speed-neutral? Runs `birkhoff bench` of two
# builds in interleaved rounds (old, new, old, new, ...: the machine's load
# drifts over both alike) on the same cases and threads, and prints per case
# the median over rounds of each build's median forward and forward+backward
# time and their ratio new/old (and, for training, the step time).
#
#   scripts/compare_bench.sh OLD_BIRKHOFF NEW_BIRKHOFF [ROUNDS] [OPS]
#
# OPS: space-separated `bench --op` values both builds know (default: the
# attention cases of docs/PERFORMANCE.md and the training step). A ratio
# within the spread of the rounds is noise; report the machine's load.
set -u
OLD=$(readlink -f "$1"); NEW=$(readlink -f "$2"); ROUNDS=${3:-3}
OPS=${4:-"softmax sinkhorn esp esp-hard lot train"}
OUT=$(mktemp -d /tmp/bkbench.XXXXXX)
for r in $(seq 1 "$ROUNDS"); do
  for op in $OPS; do
    for which in old new; do
      bin=$OLD; [ $which = new ] && bin=$NEW
      extra="--reps 11 --warmup 2"
      [ "$op" = train ] && extra="--steps 8 --warmup 2"
      "$bin" bench --op "$op" --no-peer --json $extra > "$OUT/$which.$op.$r.json" 2> /dev/null || echo "bench --op $op failed ($which)"
    done
  done
done
/usr/bin/python3 - "$OUT" "$ROUNDS" $OPS <<'EOF'
import sys, json, glob, statistics as st
out, rounds, ops = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def rows(which, op, r):
    try: return [json.loads(l) for l in open(f"{out}/{which}.{op}.{r}.json") if l.startswith("{")]
    except OSError: return []
def key(j):
    return tuple(j.get(k) for k in ("op", "config", "BH", "N", "d", "S", "batch"))
print(f"{'case':52s} {'metric':8s} {'old':>10s} {'new':>10s} {'new/old':>8s}  (spread of new/old over {rounds} rounds)")
for op in ops:
    per = {}
    for r in range(1, rounds + 1):
        for which in ("old", "new"):
            for j in rows(which, op, r):
                per.setdefault(key(j), {}).setdefault(which, []).append(j)
    for k, d in per.items():
        for m in ("fwd_median_s", "fwdbwd_median_s", "step_median_s", "step_s"):
            o = [j[m] for j in d.get("old", []) if m in j]; n = [j[m] for j in d.get("new", []) if m in j]
            if not o or not n: continue
            rs = [b / a for a, b in zip(o, n)]
            name = "/".join(str(x) for x in k if x is not None)
            print(f"{name:52s} {m.split('_')[0]:8s} {st.median(o):10.5f} {st.median(n):10.5f} {st.median(rs):8.3f}  ({min(rs):.3f}..{max(rs):.3f})")
EOF
