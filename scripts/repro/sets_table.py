"""The table of scripts/repro/sets.sh (docs/REPRODUCTION.md, experiment 8): per model (the ISAB
attention), the final and the best test accuracy over epochs, the ISAB maps' mean |column sum /
(m / n) - 1| at the end (the inducing points over the set; 0 when doubly stochastic) and the
training time per epoch, median [min, max] over seeds."""
import sys

from tablelib import epoch_rows, fmt

NAMES = {"softmax": "Set Transformer (softmax)", "sinkhorn": "Set Sinkformer (Sinkhorn)",
         "sinkpma": "Set Sinkformer, Sinkhorn PMA too", "esp": "Set ESPFormer (ESP, hard-sort eval)"}


def main(out):
    runs = epoch_rows(out, r"(\w+)-s(\d+)")
    print("| model | seeds | final test acc % | best test acc % | ISAB mean abs(col sum / (m/n) - 1) "
          "| s / epoch |")
    print("|---|---|---|---|---|---|")
    order = {"softmax": 0, "sinkhorn": 1, "sinkpma": 2, "esp": 3}
    for mdl in sorted(runs, key=lambda k: order.get(k, 9)):
        rs = runs[mdl]
        final = [100 * float(r[-1][5]) for r in rs]
        best = [100 * max(float(x[5]) for x in r) for r in rs]
        col = [float(r[-1][7]) for r in rs]
        t = [float(r[-1][9]) / len(r) for r in rs]
        print("| %s | %d | %s | %s | %s | %s |" % (NAMES.get(mdl, mdl), len(rs), fmt(final), fmt(best),
                                                  fmt(col, "%.2g"), fmt(t, "%.1f")))
    print("\nmedian [min, max] over seeds")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/repro/sets")
