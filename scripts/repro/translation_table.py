#!/usr/bin/python3
"""The plug-and-play table of scripts/repro/translation.sh: BLEU (and chrF2)
medians over seeds, per base and attention, with the papers' Table 5 beside.

usage: scripts/repro/translation_table.py OUT/results.tsv"""
import statistics
import sys
from collections import defaultdict

PAPER = {  # LOTFormer Table 5 / ESPFormer Table 5 (IWSLT'14 De-En, medians of 4 runs): PnP, FT
    ("softmax", "softmax"): ("33.40", "34.61"), ("softmax", "sinkhorn"): ("33.36", "34.61"),
    ("softmax", "esp"): ("33.38", "34.64"), ("softmax", "lot"): ("33.29", "34.72"),
    ("diff", "diff"): ("33.85", "34.78"), ("diff", "sinkhorn"): ("33.67", "34.81"),
    ("diff", "esp"): ("33.72", "34.83"), ("diff", "lot"): ("33.42", "34.91"),
}


def main(path):
    rows = [l.rstrip("\n").split("\t") for l in open(path, encoding="utf-8")][1:]
    by = defaultdict(list)
    seeds = set()
    for base, attn, seed, stage, bleu, chrf in rows:
        if bleu:
            by[(base, attn, "pnp" if stage == "base" else stage)].append((float(bleu), float(chrf or "nan")))
            seeds.add(seed)

    def cell(key):
        v = by.get(key)
        if not v:
            return "-"
        b = [x[0] for x in v]
        return f"{statistics.median(b):.2f} ({min(b):.2f}-{max(b):.2f})"

    print(f"BLEU, median (min-max) over {len(seeds)} seeds ({', '.join(sorted(seeds))})\n")
    print("| base | attention | ours: plug-and-play | ours: fine-tuned | paper: PnP | paper: FT |")
    print("|---|---|---|---|---|---|")
    for base in ("softmax", "diff"):
        for attn in (base, "sinkhorn", "esp", "lot"):
            p = PAPER.get((base, attn), ("-", "-"))
            name = {"softmax": "Transformer", "diff": "DiffTransformer"}
            print(f"| {name[base]} | {name.get(attn, attn)} | {cell((base, attn, 'pnp'))} | "
                  f"{cell((base, attn, 'ft'))} | {p[0]} | {p[1]} |")


if __name__ == "__main__":
    main(sys.argv[1])
