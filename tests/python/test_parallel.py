#!/usr/bin/python3
"""Tests of birkhoff.data.Parallel (the C reader of parallel text,
bk_parallel_*, through ctypes): pairs from memory and from files equal to
what was written, str and bytes input, limit, negative indices, iteration,
the C library's refusals raised as BirkhoffError with its message (file and
line), argument errors before C. When the Bible corpus is present
($BK_TEST_DATA or $BK_DATA, else data/; scripts/data.sh bible) its splits
are opened and their counts checked.

    /usr/bin/python3 tests/python/test_parallel.py
Prints "FAIL name: detail" for every failing check, then "N passed, M
failed"; exit status 1 if any failed. Needs numpy (not torch).
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.dont_write_bytecode = True
from checklib import Checks  # noqa: E402

from birkhoff.data import BirkhoffError, Parallel  # noqa: E402

check = Checks()

ES = "En el principio crió Dios los cielos y la tierra.\n¿Dónde\testás?\nAmén."
EN = "In the beginning, God created the heavens and the earth.\nWhere are you? \U0001F600\nAmen.\n"
PAIRS = [("En el principio crió Dios los cielos y la tierra.",
          "In the beginning, God created the heavens and the earth."),
         ("¿Dónde\testás?", "Where are you? \U0001F600"), ("Amén.", "Amen.")]


def raises(exc, fn, name, contains=None):
    try:
        fn()
    except exc as e:
        return check(contains is None or contains in str(e), name, "message: %s" % e)
    except Exception as e:  # noqa: BLE001
        return check(False, name, "raised %r" % e)
    return check(False, name, "did not raise")


def test_good():
    with Parallel.from_bytes(ES, EN, names=("a.es", "a.en")) as p:
        check(len(p) == 3 and list(p) == PAIRS, "from_bytes: the pairs as written", list(p))
        check(p[-1] == PAIRS[-1], "negative index", p[-1])
        check(p.lines == 3 and p.src_max == len(PAIRS[0][0].encode()) and
              p.tgt_bytes == sum(len(t.encode()) for _, t in PAIRS), "info fields", vars(p))
        check("a.es" in p.version and "3 pairs" in p.version, "version names the texts", p.version)
        raises(IndexError, lambda: p[3], "index 3 of 3 raises IndexError")
    raises(ValueError, lambda: p[0], "a closed corpus raises ValueError")
    p = Parallel.from_bytes(ES.encode(), EN.encode(), limit=2)
    check(len(p) == 2 and p.lines == 3 and list(p) == PAIRS[:2], "limit 2 keeps the first two pairs", list(p))
    with tempfile.TemporaryDirectory() as d:
        s, t = os.path.join(d, "x.es"), os.path.join(d, "x.en")
        with open(s, "wb") as f:
            f.write(ES.encode())
        with open(t, "wb") as f:
            f.write(EN.encode())
        q = Parallel.from_files(s, t)
        check(list(q) == PAIRS, "from_files: the same pairs", list(q))
        with open(t, "wb") as f:
            f.write(b"one\r\ntwo\nthree\n")
        raises(BirkhoffError, lambda: Parallel.from_files(s, t), "from_files: CR refused naming file and line",
               t + ": line 1, byte 4: carriage return")
        raises(BirkhoffError, lambda: Parallel.from_files(s, os.path.join(d, "none")), "a missing file",
               "cannot open")


def test_bad():
    for src, msg, what in ((b"ok\n\xc0\x80\nok\n", "source: line 2, byte 1: invalid UTF-8", "overlong UTF-8"),
                           (b"ok\n\nok\n", "source: line 2 is empty", "an empty line"),
                           (b"ok\nok\n", "source has 2 lines, target has 3", "unequal counts"),
                           (b"ok\nok\n\xe2\x80\xa8\n", "line separator U+2028", "U+2028")):
        raises(BirkhoffError, lambda: Parallel.from_bytes(src, b"a\nb\nc\n"), "refuses " + what, msg)
    raises(BirkhoffError, lambda: Parallel.from_bytes("abcd\n", "ab\n", max_bytes=3), "max_bytes",
           "longer than the limit 3")
    raises(BirkhoffError, lambda: Parallel.from_bytes("a\n", "b\n", limit=-1), "negative limit", "limit -1")
    raises(ValueError, lambda: Parallel("bible", "dev"), "unknown split before C", "train, valid, test")
    raises(BirkhoffError, lambda: Parallel("iwslt", "train"), "unknown corpus", "unknown corpus 'iwslt'")
    with tempfile.TemporaryDirectory() as d:
        raises(BirkhoffError, lambda: Parallel("bible", "test", d), "a missing corpus names the fix",
               "scripts/data.sh bible")


def test_real():
    d = os.environ.get("BK_TEST_DATA") or os.environ.get("BK_DATA") or os.path.join(REPO, "data")
    if not os.path.exists(os.path.join(d, "bible", "train.es")):
        print("# skip: %s/bible not found (scripts/data.sh bible)" % d)
        return
    for split, n in (("train", 27732), ("valid", 921), ("test", 1691)):
        with Parallel("bible", split, d) as p:
            check(len(p) == n and all(a and b for a, b in (p[0], p[n - 1])), "bible %s: %d pairs" % (split, n),
                  len(p))
            print("# bible %-5s %6d pairs: %s" % (split, len(p), p[0]))


def main():
    test_good()
    test_bad()
    test_real()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
