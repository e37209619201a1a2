"""birkhoff's corpus BLEU (`birkhoff bleu`, src/train/bleu.c) against an
independent implementation: NLTK's nltk.translate.bleu_score.corpus_bleu
(Debian's python3-nltk) on the same tokens.

Random corpora (vocabularies of 3 to 2000 words, so that matches are
frequent or rare; sentences of 0 to 40 tokens; 1 to 300 sentences; orders 1
to 4) are written as whitespace-tokenised text and scored with
`--tokenize none --json`. The clipped n-gram counts must equal NLTK's
(modified_precision's numerators, summed over the corpus) exactly, and the
n-gram totals must equal its denominators less one per hypothesis shorter
than n: NLTK counts max(1, n-grams) per sentence (a guard for its sentence
BLEU), where the paper's corpus BLEU (and sacreBLEU, and birkhoff) counts
the n-grams, 0 for a short sentence. On corpora without such sentences the
BLEU values must agree to 1e-12 (NLTK returns 0 when a precision is 0, as
birkhoff does). Then a few hand-made corpora with the 13a tokenisation,
checked against NLTK on tokens split by a Python transcription of the 13a
rules (the regular expressions of the WMT scoring script).

If nltk cannot be imported the test prints SKIP and exits 0, unless
BK_REQUIRE_ORACLE=1 or CI=true. The last line is "N passed, M failed".
Run: /usr/bin/python3 tests/oracle/test_bleu.py --birkhoff build/birkhoff"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from checklib import Checks, oracle_missing  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--birkhoff", default="build/birkhoff")
ap.add_argument("--quick", action="store_true")
args = ap.parse_args()
check = Checks()

try:
    from nltk.translate.bleu_score import corpus_bleu, modified_precision
except ImportError as e:
    oracle_missing("nltk", e, "install python3-nltk")

TMP = tempfile.mkdtemp(prefix="bk_bleu_")


def cli_bleu(hyps, refs, tokenize, order=4):
    hp, rp = os.path.join(TMP, "hyp.txt"), os.path.join(TMP, "ref.txt")
    with open(hp, "w", encoding="utf-8") as f:
        f.write("".join(h + "\n" for h in hyps))
    with open(rp, "w", encoding="utf-8") as f:
        f.write("".join(r + "\n" for r in refs))
    r = subprocess.run([args.birkhoff, "bleu", "--hyp", hp, "--ref", rp, "--tokenize", tokenize,
                        "--order", str(order), "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return json.loads(r.stdout), ""


def nltk_bleu(hyp_tokens, ref_tokens, order):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # NLTK warns on zero counts and returns 0
        return corpus_bleu([[r] for r in ref_tokens], hyp_tokens, weights=(1.0 / order,) * order)


# ---- random corpora, whitespace tokens ----
rng = random.Random(20261125)
worst = 0.0
ncases = 40 if args.quick else 200
for case in range(ncases):
    vocab = rng.choice([3, 8, 30, 200, 2000])
    n = rng.choice([1, 2, 7, 50, 300])
    order = rng.choice([1, 2, 3, 4, 4, 4])
    words = ["w%d" % i for i in range(vocab)]
    refs, hyps = [], []
    for _ in range(n):
        short = case % 2 == 0   # half the corpora have no hypothesis shorter than the order
        r = [rng.choice(words) for _ in range(rng.randint(0, 40))]
        # a hypothesis: an edited copy of the reference (so that long n-grams match) or random
        if rng.random() < 0.7 and r:
            h = [w if rng.random() < 0.8 else rng.choice(words) for w in r]
            if rng.random() < 0.3:
                h = h[: rng.randint(0, len(h))]
            if rng.random() < 0.3:
                h += [rng.choice(words) for _ in range(rng.randint(0, 5))]
        else:
            h = [rng.choice(words) for _ in range(rng.randint(0, 40))]
        if not short:
            h += [rng.choice(words) for _ in range(max(0, order - len(h)))]
        refs.append(r)
        hyps.append(h)
    if sum(len(h) for h in hyps) == 0:
        hyps[0] = ["w0"]
    got, err = cli_bleu([" ".join(h) for h in hyps], [" ".join(r) for r in refs], "none", order)
    tag = "random corpus %d (vocab %d, %d sentences, order %d)" % (case, vocab, n, order)
    if got is None:
        check(False, tag, err)
        continue
    num = [sum(modified_precision([r], h, k).numerator for h, r in zip(hyps, refs)) for k in range(1, order + 1)]
    den = [sum(modified_precision([r], h, k).denominator for h, r in zip(hyps, refs))
           - sum(1 for h in hyps if len(h) < k) for k in range(1, order + 1)]
    check(got["matches"] == num and got["totals"] == den, tag + ": clipped counts and totals = NLTK's",
          "birkhoff %s / %s, NLTK %s / %s" % (got["matches"], got["totals"], num, den))
    if all(len(h) >= order for h in hyps):
        want = nltk_bleu(hyps, refs, order)
        d = abs(got["bleu"] / 100.0 - want)
        worst = max(worst, d)
        check(d <= 1e-12, tag + ": BLEU = NLTK's corpus_bleu", "birkhoff %.17g, NLTK %.17g" % (got["bleu"] / 100.0,
                                                                                              want))


# ---- 13a: a transcription of the scoring script's rules, then NLTK ----
def tok13a(line):
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        line = line.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    line = " %s " % line
    line = re.sub(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])", r" \1 ", line)
    line = re.sub(r"([^0-9])([\.,])", r"\1 \2 ", line)
    line = re.sub(r"([\.,])([^0-9])", r" \1 \2", line)
    line = re.sub(r"([0-9])(-)", r"\1 \2 ", line)
    return line.split()


hyp13 = ["The cat, it seems, sat on the mat.", "In 1990-2000 prices rose 3.5% (or 1,000 dollars).",
         "&quot;Don't&quot; said the man/woman: e.g. \"stop\"!", "Él comió una manzana; ¿y tú?",
         "A second sentence, with a few words.", "x-y and 5-6 and 7.5 versus .5"]
ref13 = ["The cat sat on the mat, it seems.", "From 1990 to 2000 prices rose 3.5 % (about 1,000 dollars).",
         "\"Don't,\" said the man: \"stop\"!", "Él comió una manzana, ¿y tú?",
         "A second sentence with a few words.", "x-y and 5 - 6 and 7.5 versus 0.5"]
got, err = cli_bleu(hyp13, ref13, "13a")
want = nltk_bleu([tok13a(h) for h in hyp13], [tok13a(r) for r in ref13], 4)
check(got is not None and abs(got["bleu"] / 100.0 - want) <= 1e-12, "13a corpus vs NLTK on 13a tokens",
      "birkhoff %s, NLTK %.17g %s" % (got and got["bleu"] / 100.0, want, err))
hl = sum(len(tok13a(h)) for h in hyp13)
check(got is not None and got["hyp_len"] == hl, "13a token count", "%s vs %d" % (got and got["hyp_len"], hl))

# ---- the CLI's errors ----
bad = os.path.join(TMP, "bad.txt")
with open(bad, "wb") as f:
    f.write(b"caf\xe9\n")
one = os.path.join(TMP, "one.txt")
with open(one, "w") as f:
    f.write("fine\n")
two = os.path.join(TMP, "two.txt")
with open(two, "w") as f:
    f.write("a\nb\n")
for name, argv, want_msg in [
        ("line counts differ", ["--hyp", one, "--ref", two], "lines"),
        ("invalid UTF-8", ["--hyp", bad, "--ref", one], "UTF-8"),
        ("missing file", ["--hyp", os.path.join(TMP, "nope.txt"), "--ref", one], "nope.txt"),
        ("bad tokenize", ["--hyp", one, "--ref", one, "--tokenize", "moses"], "tokenize"),
        ("bad order", ["--hyp", one, "--ref", one, "--order", "9"], "order")]:
    r = subprocess.run([args.birkhoff, "bleu"] + argv, capture_output=True, text=True)
    check(r.returncode != 0 and want_msg in r.stderr, "bleu CLI refuses: " + name, r.stderr.strip())

print("worst |birkhoff - NLTK| %.2e" % worst)
sys.exit(check.summary())
