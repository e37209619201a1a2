"""The table of scripts/repro/lowdata.sh (docs/REPRODUCTION.md, experiment 4): per fraction of the
training set and model, the final and the best test accuracy over epochs (median [min, max] over
seeds)."""
import sys

from tablelib import epoch_rows, fmt


def main(out):
    runs = {(int(f), mdl): v for (f, mdl), v in epoch_rows(out, r"f(\d+)-(\w+)-s(\d+)").items()}
    print("| train data | model | final test acc % | best test acc % | seeds |")
    print("|---|---|---|---|---|")
    order = {"softmax": 0, "sinkhorn": 1, "esp": 2, "espa": 3}
    for (f, mdl) in sorted(runs, key=lambda k: (k[0], order.get(k[1], 9))):
        rs = runs[(f, mdl)]
        print("| %d %% | %s | %s | %s | %d |" % (f, mdl, fmt([100 * float(r[-1][5]) for r in rs]),
                                              fmt([100 * max(float(x[5]) for x in r) for r in rs]), len(rs)))
    print("\nmedian [min, max] over seeds")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/repro/lowdata")
