"""The table of scripts/repro/lot_vit.sh (docs/REPRODUCTION.md, experiment 7): per variant of the
LOTFormer ViT ablation (the rows of lotformer.md's Table 3), the final and the best test accuracy
over epochs (median [min, max] over seeds), the change of the median final accuracy against the
row above (the paper's Delta) and the training time per epoch."""
import statistics
import sys

from tablelib import epoch_rows, fmt

ROWS = [("base", "LOT, full DS ([CLS] a token like the others)", "-", "-", "-"),
        ("cls", "+ [CLS]-softmax", "yes", "-", "-"),
        ("pol", "+ Pol-[CLS] (instead of the plain softmax row)", "yes", "[CLS]", "-"),
        ("poldwc", "+ DWC (k = 3)", "yes", "[CLS]", "yes")]


def main(out):
    runs = epoch_rows(out, r"(\w+)-s(\d+)")
    print("| variant | [CLS]-softmax | Pola | DWC | final test acc % | Delta (median) | "
          "best test acc % | s / epoch | seeds |")
    print("|---|---|---|---|---|---|---|---|---|")
    prev = None
    for key, label, cs, pola, dwc in ROWS:
        if key not in runs:
            continue
        rs = runs[key]
        final = [100 * float(r[-1][5]) for r in rs]
        best = [100 * max(float(x[5]) for x in r) for r in rs]
        t = [float(r[-1][9]) / len(r) for r in rs]
        med = statistics.median(final)
        delta = "-" if prev is None else "%+.2f" % (med - prev)
        prev = med
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %d |" % (label, cs, pola, dwc, fmt(final), delta,
                                                                  fmt(best), fmt(t, "%.0f"), len(rs)))
    print("\nmedian [min, max] over seeds; Delta: the median final accuracy against the row above")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/repro/lot_vit")
