"""The table of scripts/repro/colsums.sh (docs/REPRODUCTION.md, experiment 1): per task and epoch,
the median and range over seeds of the test accuracy and of the column-sum statistics that
`birkhoff plot colsums` printed for each seed's checkpoints (64 test samples, every layer and head):
the mean |column sum - 1|, the median column sum and the share of columns within [0.5, 1.5]."""
import os
import re
import sys

from tablelib import fmt as _fmt


def fmt(vals, f="%.3f"):
    return _fmt(vals, f)

LINE = re.compile(r"epoch (\d+): columns (\d+), q10 ([\d.]+) q25 ([\d.]+) median ([\d.]+) q75 ([\d.]+) "
                  r"q90 ([\d.]+) max ([\d.]+), mean \|sum-1\| ([\d.]+), in \[0.5,1.5\] ([\d.]+)%")




def main(out):
    tasks = sorted({re.sub(r"-s\d+$", "", d) for d in os.listdir(out) if re.search(r"-s\d+$", d)})
    for task in tasks:
        runs = sorted(d for d in os.listdir(out) if re.fullmatch(re.escape(task) + r"-s\d+", d))
        stats, acc = {}, {}
        for r in runs:
            txt = os.path.join(out, "colsums-%s.txt" % r)
            if os.path.exists(txt):
                for line in open(txt):
                    m = LINE.search(line)
                    if m:
                        e = int(m.group(1))
                        stats.setdefault(e, []).append((float(m.group(9)), float(m.group(5)), float(m.group(10))))
            csv = os.path.join(out, r, "epochs.csv")
            if os.path.exists(csv):
                rows = [line.strip().split(",") for line in open(csv)][1:]
                for row in rows:
                    acc.setdefault(int(row[0]), []).append(100 * float(row[5]))
        print("### %s (%d seeds: %s)\n" % (task, len(runs), ", ".join(runs)))
        print("| epoch | test acc % | mean abs(col sum - 1) | median col sum | cols in [0.5, 1.5] % |")
        print("|---|---|---|---|---|")
        for e in sorted(set(stats) | set(acc)):
            s = stats.get(e, [])
            print("| %d | %s | %s | %s | %s |" % (e, fmt(acc.get(e, []), "%.2f"), fmt([x[0] for x in s]),
                                               fmt([x[1] for x in s]), fmt([x[2] for x in s], "%.1f")))
        print("\nmedian [min, max] over seeds; epoch 0 = the initial model\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/repro/colsums")
