#!/usr/bin/env bash
# Adds inputs to a fuzz target's regressions (tests/fuzz/regress/<target>/),
# which `FUZZ_MODE=replay scripts/fuzz.sh` (make check) runs on every commit.
#
#   tests/fuzz/add_regress.sh [--minimize] TARGET FILE [NAME]
#
# FILE: a reproducer (crash-*, leak-*, oom-*, timeout-* under
# build-fuzz/out/<target>/) or any input worth keeping. NAME: the file name
# in the regressions, best a few words saying what the input is
# (default: <kind>-<first 12 hex digits of its sha1>, kind from FILE's
# libFuzzer prefix or "input"). An input whose bytes are already there is
# not added twice.
# --minimize: first shrink FILE with libFuzzer's -minimize_crash (needs the
# target built by scripts/fuzz.sh in $FUZZ_BUILD, default build-fuzz, and
# the bug still present: minimise before fixing). The shrunk input is
# added instead of FILE.
set -euo pipefail
minimize=0
if [ "${1:-}" = --minimize ]; then
  minimize=1
  shift
fi
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
t=$1 file=$2 name=${3:-}
[ -f "$file" ] || { echo "add_regress: $file: no such file" >&2; exit 2; }
file=$(realpath "$file")
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
[ -f "tests/fuzz/fuzz_$t.c" ] || { echo "add_regress: unknown target '$t'" >&2; exit 2; }
case $name in */*) echo "add_regress: NAME must be a file name, not a path" >&2; exit 2 ;; esac

if [ "$minimize" = 1 ]; then
  bin=${FUZZ_BUILD:-build-fuzz}/fuzz_$t
  case $bin in /*) ;; *) bin=$ROOT/$bin ;; esac
  [ -x "$bin" ] || { echo "add_regress: $bin not built (run scripts/fuzz.sh $t first)" >&2; exit 2; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && TMPDIR="$tmp" OMP_NUM_THREADS=1 "$bin" -minimize_crash=1 -runs=20000 -timeout=10 \
    -rss_limit_mb=2048 -exact_artifact_path="$tmp/min" "$file") >"$tmp/log" 2>&1 || true
  if [ ! -s "$tmp/min" ]; then
    echo "add_regress: minimisation gave nothing (does $file still fail?); last lines of its log:" >&2
    tail -5 "$tmp/log" >&2
    exit 1
  fi
  echo "add_regress: minimised $(wc -c <"$file") -> $(wc -c <"$tmp/min") bytes"
  file=$tmp/min
fi

dir=tests/fuzz/regress/$t
mkdir -p "$dir"
sum=$(sha1sum "$file" | cut -d' ' -f1)
for f in "$dir"/*; do
  [ -f "$f" ] || continue
  if [ "$(sha1sum "$f" | cut -d' ' -f1)" = "$sum" ]; then
    echo "add_regress: already there as $f"
    exit 0
  fi
done
if [ -z "$name" ]; then
  kind=$(basename "$2" | sed -n 's/^\(crash\|leak\|oom\|timeout\|slow-unit\)-.*/\1/p')
  name=${kind:-input}-${sum:0:12}
fi
[ -e "$dir/$name" ] && { echo "add_regress: $dir/$name exists (another input); pick another NAME" >&2; exit 1; }
cp "$file" "$dir/$name"
echo "add_regress: added $dir/$name ($(wc -c <"$dir/$name") bytes); replay it with:"
echo "  FUZZ_MODE=replay scripts/fuzz.sh $t"
