"""The table of scripts/repro/text.sh (docs/REPRODUCTION.md, experiment 5): per model, the final
and the best test accuracy over epochs and the training time per epoch (time_s of the last epoch / epochs) (median [min, max] over seeds)."""
import sys

from tablelib import epoch_rows, fmt


def main(out):
    runs = epoch_rows(out, r"(\w+)-s(\d+)")
    print("| model | final test acc % | best test acc % | seconds / epoch | seeds |")
    print("|---|---|---|---|---|")
    order = {"softmax": 0, "sinkhorn": 1, "esp": 2}
    for mdl in sorted(runs, key=lambda k: order.get(k, 9)):
        rs = runs[mdl]
        print("| %s | %s | %s | %s | %d |" % (mdl, fmt([100 * float(r[-1][5]) for r in rs]),
                                            fmt([100 * max(float(x[5]) for x in r) for r in rs]),
                                            fmt([float(r[-1][-1]) / len(r) for r in rs], "%.1f"), len(rs)))
    print("\nmedian [min, max] over seeds")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/repro/text")
