"""The table of scripts/repro/patches.sh (docs/REPRODUCTION.md, experiment 2): per patch size and
model, the best test accuracy over epochs (the statistic the Sinkformers' plot uses) and the final
one; for the ASAP compilation of each Sinkformer (inference only: one accuracy, in both columns),
its test accuracy and its agreement with its teacher (median [min, max] over seeds)."""
import json
import os
import re
import sys

from tablelib import epoch_rows, fmt


def main(out):
    runs = {(int(p), mdl): v for (p, mdl), v in epoch_rows(out, r"p(\d+)-(\w+)-s(\d+)").items()}
    asap = {}
    for name in os.listdir(out):
        m = re.fullmatch(r"p(\d+)-asap-s(\d+)\.json", name)
        if m:
            d = json.load(open(os.path.join(out, name)))
            asap.setdefault(int(m.group(1)), []).append(
                (100 * d["accuracy"], 100 * d.get("teacher_accuracy", float("nan")),
                 100 * d.get("agreement", float("nan"))))
    print("| patch | tokens | model | best test acc % | final test acc % | seeds |")
    print("|---|---|---|---|---|---|")
    order = {"softmax": 0, "sinkhorn": 1, "esp": 2}
    for (p, mdl) in sorted(runs, key=lambda k: (k[0], order.get(k[1], 9))):
        rs = runs[(p, mdl)]
        label = {"softmax": "Transformer (softmax)", "sinkhorn": "Sinkformer (S = 5)",
                 "esp": "ESPFormer (soft-trained, hard-evaluated)"}.get(mdl, mdl)
        print("| %d | %d | %s | %s | %s | %d |" % (p, (28 // p) ** 2 + 1, label,
                                                  fmt([100 * max(float(x[5]) for x in r) for r in rs]),
                                                  fmt([100 * float(r[-1][5]) for r in rs]), len(rs)))
        if mdl == "sinkhorn" and p in asap:
            a = asap[p]
            print("| %d | %d | its ASAP compilation (L = 256, LS; agreement with the teacher %s %%) | %s | %s | %d |"
                  % (p, (28 // p) ** 2 + 1, fmt([x[2] for x in a]), fmt([x[0] for x in a]),
                     fmt([x[0] for x in a]), len(a)))
    print("\nmedian [min, max] over seeds; tokens = patches + [CLS]")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/repro/patches")
