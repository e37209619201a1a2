"""The tables of scripts/repro/listops.sh (docs/REPRODUCTION.md, experiment 6): per model, the
final and the best test accuracy over epochs (median and range over seeds) and the training time
per epoch; then the bench's time and memory of one attention call against N, with the growth
exponent between successive N (1 = linear, 2 = quadratic), and a log-log figure of the times
(OUT/listops-time.svg)."""
import json
import math
import os
import sys

from tablelib import epoch_rows, fmt, loglog_svg

LABELS = [("softmax", "Transformer (softmax)"), ("lot", "LOT r = 32, T = 5, learnt pivots and masses"),
          ("r4", "LOT r = 4"), ("r8", "LOT r = 8"), ("T1", "LOT T = 1"), ("T10", "LOT T = 10"),
          ("learnz", "LOT, learnt pivots, uniform masses (lot_learn = z)"),
          ("fixed", "LOT, fixed pivots, uniform masses (lot_learn = none)")]


def train_table(out):
    runs = epoch_rows(out, r"(\w+?)-s(\d+)")
    print("| model | seeds | final test acc % | best test acc % | s / epoch |")
    print("|---|---|---|---|---|")
    for key, label in LABELS:
        rs = runs.get(key)
        if not rs:
            continue
        print("| %s | %d | %s | %s | %s |" % (label, len(rs), fmt([100 * float(r[-1][5]) for r in rs]),
                                             fmt([100 * max(float(x[5]) for x in r) for r in rs]),
                                             fmt([float(r[-1][9]) / len(r) for r in rs], "%.0f")))
    print("\nmedian [min, max] over seeds; 10 classes (chance 10 %)")


def bench_table(out):
    path = os.path.join(out, "bench.jsonl")
    if not os.path.exists(path):
        return
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    ops = [op for op in ("lot", "softmax", "sinkhorn") if any(r["op"] == op for r in rows)]
    print("\n| op | N | forward ms | forward + backward ms | growth exponent (fwd+bwd) | workspace + tape MiB |")
    print("|---|---|---|---|---|---|")
    series = []
    for op in ops:
        rs = sorted((r for r in rows if r["op"] == op), key=lambda r: r["N"])
        pts = []
        for i, r in enumerate(rs):
            grow = "-"
            if i:
                p = rs[i - 1]
                grow = "%.2f" % (math.log(r["fwdbwd_median_s"] / p["fwdbwd_median_s"]) / math.log(r["N"] / p["N"]))
            mib = (r["workspace_bytes"] + r["tape_bytes"]) / 2.0 ** 20
            print("| %s | %d | %.3g | %.3g | %s | %.3g |" % (op, r["N"], 1e3 * r["fwd_median_s"],
                                                          1e3 * r["fwdbwd_median_s"], grow, mib))
            pts.append((r["N"], 1e3 * r["fwdbwd_median_s"]))
        series.append((op if op != "sinkhorn" else "sinkhorn S = 5", pts))
    r0 = rows[0]
    print("\n2 heads of 32 (B*H = 2), %d threads, median of %d repetitions; ISA %s; LOT r = 32, T = 5"
          % (r0["threads"], r0["reps"], r0["isa"]))
    with open(os.path.join(out, "listops-time.svg"), "w") as f:
        f.write(loglog_svg(series, "N", "forward + backward, ms", "one attention call, 2 heads of 32"))


def main(out):
    train_table(out)
    bench_table(out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/repro/listops")
