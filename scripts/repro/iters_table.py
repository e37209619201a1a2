"""The table of scripts/repro/iters.sh (docs/REPRODUCTION.md, experiment 3): per Sinkhorn
iteration count S, the final and the best test accuracy over epochs (median and range over seeds),
the attention's mean |column sum - 1| at the end and the training time per epoch."""
import sys

from tablelib import epoch_rows, fmt




def main(out):
    runs = {int(k): v for k, v in epoch_rows(out, r"S(\d+)-s(\d+)").items()}
    print("| S | seeds | final test acc % | best test acc % | mean abs(col sum - 1) | s / epoch |")
    print("|---|---|---|---|---|---|")
    for S in sorted(runs):
        rs = runs[S]
        final = [100 * float(r[-1][5]) for r in rs]
        best = [100 * max(float(x[5]) for x in r) for r in rs]
        col = [float(r[-1][7]) for r in rs]
        t = [float(r[-1][9]) / len(r) for r in rs]
        print("| %d | %d | %s | %s | %s | %s |" % (S, len(rs), fmt(final), fmt(best), fmt(col, "%.2g"),
                                                  fmt(t, "%.1f")))
    print("\nmedian [min, max] over seeds")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/repro/iters")
