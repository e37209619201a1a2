"""Shared by the reproduction tables (scripts/repro/*_table.py): how a statistic over seeds is
printed."""
import statistics


def fmt(vals, f="%.2f"):
    """median [min, max] of vals in format f ('-' when empty)"""
    if not vals:
        return "-"
    return (f + " [" + f + ", " + f + "]") % (statistics.median(vals), min(vals), max(vals))
