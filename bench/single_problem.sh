#!/usr/bin/env bash
# Single-problem scaling (issue 17): every operator on ONE problem (B = H = 1, or one set for
# OTK), forward + backward (forward only for ASAP, an inference operator), at 1 thread and at
# T threads, in one run, so the speed-up is a ratio of two medians taken minutes apart on the
# same machine. Prints the lines of `birkhoff bench` (median, quartiles, fraction of peak) and a
# summary table of f+b(1 thread) / f+b(T threads).
#
#   bench/single_problem.sh [BIRKHOFF] [T]      (defaults build/birkhoff, 2)
#   REPS=7 N=4096 bench/single_problem.sh
set -euo pipefail
BK=${1:-build/birkhoff}
T=${2:-2}
REPS=${REPS:-7}
N=${N:-4096}
d=64
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# name | bench arguments (a single problem) | the column of the time to compare
cases=(
  "softmax|--op softmax --cases 1:$N:$d:1"
  "sinkhorn S=5|--op sinkhorn --cases 1:$N:$d:5"
  "esp soft (sq)|--op esp-sq --cases 1:$N:$d:1"
  "esp hard|--op esp-hard --cases 1:$N:$d:1"
  "lot r=32|--op lot --cases 1:$N:$d:5"
  "otk q=4|--op otk --cases 1:$N:$d:128:64:4:10"
  "asap|--op asap --cases 1:$N:$d --calib 1"
)
printf '%-20s %12s %12s %8s\n' "operator" "1 thread ms" "$T threads ms" "speed-up"
for c in "${cases[@]}"; do
  name=${c%%|*}
  args=${c#*|}
  for t in 1 "$T"; do
    # shellcheck disable=SC2086
    "$BK" bench $args --threads "$t" --reps "$REPS" --warmup 1 --no-peer --json >"$out/$t.json" 2>"$out/$t.err" || {
      echo "$name: bench failed at $t threads:"; cat "$out/$t.err"; exit 1; }
  done
  /usr/bin/python3 - "$name" "$out/1.json" "$out/$T.json" "$T" <<'EOF'
import json, sys
name, f1, fT, T = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
def rows(path):
    out = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out
def key(r):
    # forward+backward where the operator has one, else its forward (ASAP)
    for k in ("fwdbwd_median_s", "median_s"):
        if k in r:
            return k
    raise KeyError(sorted(r))
def peak(r):
    return r.get("frac_peak_fwdbwd", r.get("frac_peak", float("nan")))
a, b = rows(f1), rows(fT)
for r1, rT in zip(a, b):
    k = key(r1)
    label = name if len(a) == 1 else f"{name} {r1.get('method', '')}".strip()
    what = "f+b" if k == "fwdbwd_median_s" else "fwd"
    print(f"{label:<20} {1e3 * r1[k]:12.3f} {1e3 * rT[k]:12.3f} {r1[k] / rT[k]:7.2f}x   {what}, "
          f"peak {100 * peak(r1):.0f}% / {100 * peak(rT):.0f}%")
EOF
done
