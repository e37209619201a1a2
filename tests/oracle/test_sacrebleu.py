"""`birkhoff bleu` (BLEU and chrF, src/train/bleu.c) against sacreBLEU, the
standard scorer (its signatures are printed).

1. Random corpora, whitespace tokens (`--tokenize none` vs sacreBLEU's
   tokenize="none"), orders 1 to 4, smooth_method="none" (birkhoff does not
   smooth: a corpus with a zero n-gram precision scores 0, as sacreBLEU's
   "none"): the clipped matches and totals per order, the lengths and BP equal
   sacreBLEU's exactly, BLEU to 1e-9 (printed precision: 2 decimals).
2. Random corpora over words with punctuation, numbers, entities, quotes and
   non-ASCII letters, with the 13a tokenisation on both sides (birkhoff's
   default, sacreBLEU's default): the same equalities, so the tokenisers agree
   token for token on these texts.
3. sacreBLEU's default smoothing ("exp") differs from birkhoff only where an
   order has 0 matches: checked equal where every order matches, and the
   difference shown where one does not (birkhoff 0, sacreBLEU > 0).
4. chrF: sacreBLEU's default CHRF() (character 6-grams, beta 2, whitespace
   removed, word order 0) on every corpus above and on text with tabs,
   non-breaking and ideographic spaces, to 1e-9.
5. A translation output: fixed Spanish -> English machine translations of
   Bible-style verses (the translation demo's domain; hypotheses as a
   small NMT model writes them, references from the English side) scored
   by both, BLEU and chrF to 1e-9.

If sacrebleu cannot be imported the test prints SKIP and exits 0, unless
BK_REQUIRE_ORACLE=1 or CI=true. The last line is "N passed, M failed".
Run: PY tests/oracle/test_sacrebleu.py --birkhoff build/birkhoff
(PY: a Python with `pip install sacrebleu`, e.g. the torch 2.13 venv)."""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from checklib import Checks, oracle_missing  # noqa: E402

check = Checks()
ap = argparse.ArgumentParser(description="birkhoff bleu (BLEU, chrF) against sacreBLEU")
ap.add_argument("--birkhoff", default="build/birkhoff", help="the CLI")
ap.add_argument("--quick", action="store_true", help="fewer random corpora")
args = ap.parse_args()
try:
    import sacrebleu
    from sacrebleu.metrics import BLEU, CHRF
except ImportError as e:
    oracle_missing("sacrebleu", e, "pip install sacrebleu")

TMP = tempfile.mkdtemp(prefix="bk_sacrebleu_")
TOL = 1e-9


def cli(hyps, refs, tokenize, order=4):
    hp, rp = os.path.join(TMP, "hyp.txt"), os.path.join(TMP, "ref.txt")
    for path, lines in ((hp, hyps), (rp, refs)):
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write("".join(x + "\n" for x in lines))
    r = subprocess.run([args.birkhoff, "bleu", "--hyp", hp, "--ref", rp, "--tokenize", tokenize,
                        "--order", str(order), "--json", "--chrf"], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return json.loads(r.stdout), ""


def sb_bleu(hyps, refs, tokenize, order=4, smooth="none"):
    m = BLEU(tokenize=tokenize, smooth_method=smooth, max_ngram_order=order)
    return m.corpus_score(hyps, [refs]), m


CHRF_METRIC = CHRF()


def compare(tag, hyps, refs, tokenize, order=4):
    """BLEU (smooth none) and chrF of birkhoff vs sacreBLEU on one corpus;
    returns (birkhoff's json, sacreBLEU's BLEUScore) or (None, None)"""
    got, err = cli(hyps, refs, tokenize, order)
    if got is None:
        check(False, tag, err)
        return None, None
    s, _ = sb_bleu(hyps, refs, tokenize, order)
    check(got["matches"] == list(s.counts) and got["totals"] == list(s.totals),
          tag + ": matches and totals = sacreBLEU's",
          "birkhoff %s / %s, sacreBLEU %s / %s" % (got["matches"], got["totals"], s.counts, s.totals))
    check(got["hyp_len"] == s.sys_len and got["ref_len"] == s.ref_len and abs(got["bp"] - s.bp) <= TOL,
          tag + ": lengths and BP = sacreBLEU's",
          "birkhoff %s %s %.17g, sacreBLEU %s %s %.17g" % (got["hyp_len"], got["ref_len"], got["bp"],
                                                           s.sys_len, s.ref_len, s.bp))
    check(abs(got["bleu"] - s.score) <= TOL, tag + ": BLEU = sacreBLEU's (smooth none)",
          "birkhoff %.17g, sacreBLEU %.17g" % (got["bleu"], s.score))
    c = CHRF_METRIC.corpus_score(hyps, [refs]).score
    check(abs(got["chrf"] - c) <= TOL, tag + ": chrF2 = sacreBLEU's", "birkhoff %.17g, sacreBLEU %.17g"
          % (got["chrf"], c))
    return got, s


rng = random.Random(20261129)
ncases = 30 if args.quick else 120


def corpus(words, n, order, maxlen=30):
    refs, hyps = [], []
    for _ in range(n):
        r = [rng.choice(words) for _ in range(rng.randint(0, maxlen))]
        if rng.random() < 0.75 and r:   # an edited copy (long n-grams match) or unrelated words
            h = [w if rng.random() < 0.8 else rng.choice(words) for w in r]
            if rng.random() < 0.3:
                h = h[: rng.randint(0, len(h))]
            if rng.random() < 0.3:
                h += [rng.choice(words) for _ in range(rng.randint(0, 5))]
        else:
            h = [rng.choice(words) for _ in range(rng.randint(0, maxlen))]
        refs.append(r)
        hyps.append(h)
    if not any(hyps):
        hyps[0] = [words[0]]
    return [" ".join(h) for h in hyps], [" ".join(r) for r in refs]


# ---- 1. whitespace tokens ----
for case in range(ncases):
    vocab = rng.choice([3, 8, 30, 200, 2000])
    n = rng.choice([1, 2, 7, 50, 300])
    order = rng.choice([1, 2, 3, 4, 4, 4])
    hyps, refs = corpus(["w%d" % i for i in range(vocab)], n, order)
    compare("none corpus %d (vocab %d, %d sentences, order %d)" % (case, vocab, n, order), hyps, refs, "none",
            order)

# ---- 2. 13a on text with punctuation, numbers, entities, non-ASCII ----
PIECES = ["the", "The", "cat", "sat", "mat.", "mat", ",", "it,", "seems", "(or", "1,000", "3.5%", "1990-2000",
          "5-6", "7.5", ".5", "x-y", "e.g.", "&quot;Don't&quot;", "&amp;", "&lt;b&gt;", "\"stop\"!", "man/woman:",
          "Él", "comió", "¿y", "tú?", "naïve", "café", "señor", "Ελλάδα", "日本語", "dollars).", "--", "...", "'quoted'",
          "{x}", "[y]", "a~b", "50$", "#tag", "@user", "a+b=c", "<skipped>", "end-\nline"]
for case in range(ncases // 2):
    n = rng.choice([1, 3, 20, 100])
    hyps, refs = corpus(PIECES, n, 4, maxlen=25)
    hyps = [h.replace("\n", " ") for h in hyps]
    refs = [r.replace("\n", " ") for r in refs]
    compare("13a corpus %d (%d sentences)" % (case, n), hyps, refs, "13a")

# ---- 3. smoothing: sacreBLEU's default "exp" ----
hyps, refs = corpus(["w%d" % i for i in range(20)], 40, 4)
got, _ = cli(hyps, refs, "13a")
s_exp, m_exp = sb_bleu(hyps, refs, "13a", smooth="exp")
check(got is not None and min(got["matches"]) > 0 and abs(got["bleu"] - s_exp.score) <= TOL,
      "every order matches: birkhoff = sacreBLEU's default (smooth exp)",
      "%s vs %.17g" % (got and got["bleu"], s_exp.score))
hyps0, refs0 = ["a b c d", "e f"], ["a b x d", "e g"]     # no 3-gram or 4-gram matches
got0, _ = cli(hyps0, refs0, "13a")
s0_exp, _ = sb_bleu(hyps0, refs0, "13a", smooth="exp")
s0_none, m_none = sb_bleu(hyps0, refs0, "13a", smooth="none")
check(got0 is not None and got0["bleu"] == 0.0 and s0_none.score == 0.0 and s0_exp.score > 0,
      "a zero precision: birkhoff 0 = sacreBLEU smooth none; smooth exp gives %.4f" % s0_exp.score,
      "birkhoff %s" % (got0 and got0["bleu"]))

# ---- 4. chrF and whitespace ----
ws_h = ["a\tb  c\u00a0d", "\u3000日本\u2003語 テスト", "no-space", "x\u200by", "  lead and trail  "]
ws_r = ["ab c d", "日本語テスト", "no - space", "xy", "leadandtrail"]
compare("chrF whitespace (tab, NBSP, ideographic, em space; zero-width is not space)", ws_h, ws_r, "13a")

# ---- 5. a translation output (Spanish -> English, fixed texts) ----
SRC_REF_HYP = [
    ("En el principio creó Dios los cielos y la tierra.",
     "In the beginning God created the heavens and the earth.",
     "In the beginning God created the heaven and the earth."),
    ("Y la tierra estaba desordenada y vacía, y las tinieblas estaban sobre la faz del abismo.",
     "The earth was formless and empty, and darkness was on the surface of the deep.",
     "And the earth was without order and empty, and darkness was on the face of the abyss."),
    ("Y dijo Dios: Sea la luz; y fue la luz.",
     "God said, \"Let there be light,\" and there was light.",
     "And God said: Let there be light; and there was light."),
    ("Y vio Dios que la luz era buena; y separó Dios la luz de las tinieblas.",
     "God saw the light, and saw that it was good. God divided the light from the darkness.",
     "And God saw that the light was good; and God separated the light from the darkness."),
    ("Llamó Dios a la luz Día, y a las tinieblas llamó Noche.",
     "God called the light \"day,\" and the darkness he called \"night.\"",
     "God called the light Day, and the darkness he called Night."),
    ("Y fue la tarde y la mañana un día.",
     "There was evening and there was morning, the first day.",
     "And it was the evening and the morning one day."),
    ("Bienaventurados los pobres en espíritu, porque de ellos es el reino de los cielos.",
     "Blessed are the poor in spirit, for theirs is the Kingdom of Heaven.",
     "Blessed are the poor in spirit, because theirs is the kingdom of the heavens."),
    ("Jesús lloró.", "Jesus wept.", "Jesus cried."),
    ("Tenía Noé seiscientos años cuando el diluvio de las aguas vino sobre la tierra.",
     "Noah was six hundred years old when the flood of waters came on the earth.",
     "Noah was 600 years old when the flood of the waters came upon the earth."),
    ("Y los hijos de Israel hicieron conforme a todo lo que Jehová había mandado a Moisés.",
     "The children of Israel did according to all that Yahweh commanded Moses.",
     "And the sons of Israel did according to everything that the LORD had commanded Moses."),
]
hyp_t = [h for _, _, h in SRC_REF_HYP]
ref_t = [r for _, r, _ in SRC_REF_HYP]
got_t, s_t = compare("translation output (10 verses, 13a)", hyp_t, ref_t, "13a")
s_def = sacrebleu.corpus_bleu(hyp_t, [ref_t])     # sacreBLEU's defaults, as papers print it
c_def = sacrebleu.corpus_chrf(hyp_t, [ref_t])
if got_t is not None:
    print("translation output: birkhoff BLEU = %.2f chrF2 = %.2f; sacreBLEU %s ; %s"
          % (got_t["bleu"], got_t["chrf"], s_def, c_def))
    check(abs(got_t["bleu"] - s_def.score) <= TOL and "%.2f" % got_t["bleu"] == "%.2f" % s_def.score,
          "translation output: birkhoff = sacreBLEU's default BLEU (every order matches, so exp = none)",
          "%.17g vs %.17g" % (got_t["bleu"], s_def.score))

print("sacreBLEU signatures: BLEU %s | BLEU (test) %s | chrF %s"
      % (m_exp.get_signature(), m_none.get_signature(), CHRF_METRIC.get_signature()))
print("sacrebleu %s" % sacrebleu.__version__)
sys.exit(check.summary())
