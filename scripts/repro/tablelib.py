"""Shared by the reproduction tables (scripts/repro/*_table.py): how a statistic over seeds is
printed."""
import statistics


def fmt(vals, f="%.2f"):
    """median [min, max] of vals in format f ('-' when empty)"""
    if not vals:
        return "-"
    return (f + " [" + f + ", " + f + "]") % (statistics.median(vals), min(vals), max(vals))


def epoch_rows(out, pattern):
    """{key: [rows of each run's epochs.csv]} for the run folders of out whose name fully
    matches the regular expression pattern; key = the match's groups except the last (the
    seed)"""
    import os
    import re
    runs = {}
    for d in sorted(os.listdir(out)):
        m = re.fullmatch(pattern, d)
        csv = os.path.join(out, d, "epochs.csv")
        if m and os.path.exists(csv):
            rows = [line.strip().split(",") for line in open(csv)][1:]
            if rows:
                key = m.groups()[:-1]
                runs.setdefault(key if len(key) > 1 else key[0], []).append(rows)
    return runs
