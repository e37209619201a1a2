"""The table of scripts/repro/asap.sh (docs/REPRODUCTION.md, experiment 10): per number of slices L
and calibration, the test accuracy of the compiled ASAP model, its teacher's, their agreement and
the compile time (median [min, max] over seeds)."""
import json
import os
import re
import sys

from tablelib import fmt




def main(out):
    rows = {}
    teach = []
    for name in os.listdir(out):
        m = re.fullmatch(r"asap-s(\d+)-L(\d+)-(ls|kl)\.json", name)
        if m:
            d = json.load(open(os.path.join(out, name)))
            t = os.path.join(out, name[:-5] + ".time")
            sec = float(open(t).read()) if os.path.exists(t) else float("nan")
            rows.setdefault((int(m.group(2)), m.group(3)), []).append(
                (100 * d["accuracy"], 100 * d.get("teacher_accuracy", float("nan")), 100 * d.get("agreement", float("nan")), sec))
        m = re.fullmatch(r"teacher-s(\d+)\.json", name)
        if m:
            teach.append(100 * json.load(open(os.path.join(out, name)))["accuracy"])
    print("Sinkformer teachers (S = 5): test accuracy %s %%\n" % fmt(teach))
    print("| slices L | fit | ASAP test acc % | teacher acc % | agreement % | compile s |")
    print("|---|---|---|---|---|---|")
    for (L, fit) in sorted(rows):
        r = rows[(L, fit)]
        print("| %d | %s | %s | %s | %s | %s |" % (L, fit, fmt([x[0] for x in r]), fmt([x[1] for x in r]),
                                               fmt([x[2] for x in r]), fmt([x[3] for x in r], "%.1f")))
    print("\nmedian [min, max] over seeds")
    ends = {}
    for name in os.listdir(out):
        m = re.fullmatch(r"asap-s(\d+)-L(\d+)-(ls|kl)(?:-(zero|column|row))?\.json", name)
        if m:
            key = (int(m.group(2)), m.group(3))
            d = json.load(open(os.path.join(out, name)))
            ends.setdefault(key, {}).setdefault(m.group(4) or "auto", []).append(
                (100 * d["accuracy"], 100 * d.get("agreement", float("nan"))))
    ends = {k: v for k, v in ends.items() if len(v) > 1}
    if ends:
        print("\nEndings of the same compiled models (birkhoff eval --asap-ending; auto = row, the S = 5 "
              "teacher's):\n")
        print("| slices L | fit | ending | ASAP test acc % | agreement % | seeds |")
        print("|---|---|---|---|---|---|")
        names = {"auto": "row (auto)", "zero": "ASAP-0", "column": "column"}
        for (L, fit) in sorted(ends):
            for e in ("zero", "auto", "column"):
                r = ends[(L, fit)].get(e)
                if r:
                    print("| %d | %s | %s | %s | %s | %d |" % (L, fit, names[e], fmt([x[0] for x in r]),
                                                             fmt([x[1] for x in r]), len(r)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/repro/asap")
