#!/usr/bin/env bash
# scripts/repro/otk.sh -- OTK's unsupervised pipeline at CPU scale (docs/REPRODUCTION.md,
# experiment 9): MNIST images as sets of patches, K-means anchors and supports, a linear probe on
# mean pooling, flattening, OTK and OTK with the 2-D positional encoding (scripts/repro/otk_probe.py
# says what and how).
#   SEEDS="1 2 3" TRAIN=10000 VAL=2000 TEST=10000 ANCHORS=64 SUPPORTS="9 16 25" \
#       OUT=runs/repro/otk scripts/repro/otk.sh
#   QUICK=1: one seed, 3000 training images, 16 anchors, p = 9 (make repro-quick)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f build/libbirkhoff.so ] || make -j"$(nproc)" lib
export OUT=${OUT:-runs/repro/otk}
mkdir -p "$OUT"
start=$(date +%s)
/usr/bin/python3 scripts/repro/otk_probe.py | tee "$OUT/log.txt"
echo "wall: $(( $(date +%s) - start )) s" | tee "$OUT/wall.txt"
/usr/bin/python3 scripts/repro/otk_probe.py --table "$OUT" > "$OUT/table.md"
