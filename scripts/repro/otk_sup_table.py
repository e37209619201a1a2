"""The table of scripts/repro/otk_sup.sh (docs/REPRODUCTION.md, experiment 9, supervised half):
per pool, the final and the best test accuracy over epochs, the pooled features and the trainable
parameters (median [min, max] over seeds)."""
import json
import os
import sys

from tablelib import epoch_rows, fmt

LABELS = {"mean": ("mean pooling", 0),
          "otk": ("OTK, identity map (p = 9, k = 64)", 1),
          "nys": ("OTK, 64 Nystrom anchors (p = 9)", 2),
          "nyspe": ("OTK, 64 Nystrom anchors + 2-D PE (p = 9, sigma_pos 0.25)", 3)}


def config_value(run_dir, key):
    """key's value in a run's config.txt (None when absent)"""
    for line in open(os.path.join(run_dir, "config.txt")):
        k, _, v = line.strip().partition("=")
        if k.strip() == key:
            return v.strip()
    return None


def main(out):
    runs = epoch_rows(out, r"(\w+)-s(\d+)")
    print("| pool | features | parameters | final test acc % | best test acc % | seeds |")
    print("|---|---|---|---|---|---|")
    for mdl in sorted(runs, key=lambda k: LABELS.get(k, (k, 9))[1]):
        rs = runs[mdl]
        dirs = sorted(d for d in os.listdir(out) if d.startswith(mdl + "-s")
                      and os.path.exists(os.path.join(out, d, "summary.json")))
        params = json.load(open(os.path.join(out, dirs[0], "summary.json")))["params"] if dirs else "-"
        feats = "-"
        if dirs:
            d = os.path.join(out, dirs[0])
            if config_value(d, "pool") == "otk":
                k = int(config_value(d, "otk_anchors")) or int(config_value(d, "dim"))
                feats = int(config_value(d, "otk_supports")) * int(config_value(d, "otk_refs")) * k
            else:
                feats = config_value(d, "dim")
        print("| %s | %s | %s | %s | %s | %d |" % (LABELS.get(mdl, (mdl, 9))[0], feats, params,
                                                   fmt([100 * float(r[-1][5]) for r in rs]),
                                                   fmt([100 * max(float(x[5]) for x in r) for r in rs]),
                                                   len(rs)))
    print("\nmedian [min, max] over seeds; MNIST as sets of 49 patches (4 x 4, a 7 x 7 grid), "
          "depth 0 (pool + linear head), trained end to end")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/repro/otk_sup")
