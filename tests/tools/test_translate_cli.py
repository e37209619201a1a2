#!/usr/bin/python3
"""CLI tests for `birkhoff translate` (and `birkhoff bleu --chrf`) on tiny
seq2seq checkpoints made here (`model init`, plus a few `model train` steps
on a reversal task so the outputs differ between sentences): one output line
per input line in input order, ids in range, deterministic across runs,
threads, batch sizes and the decoder cache, beam 1 and 4; every refusal
(empty line, over-long line, id >= vocab, non-id, classifier checkpoint,
missing files, a file that is not a SentencePiece model or has another
vocabulary, bad flags) exits non-zero with a message naming the problem; chrF
on hand-computed corpora; raw text through the library's SentencePiece
(bk_spm_*: a model trained here through ctypes on the library next to the
CLI; no tool is run): one line per input, deterministic, equal to --ids on
the model's encoding decoded, invalid UTF-8 and over-long lines named; the
same through data/bible/spm.model when it exists. Seconds. Run:
/usr/bin/python3 tests/tools/test_translate_cli.py build/birkhoff"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from checklib import Checks  # noqa: E402

BK = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/birkhoff")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
check = Checks()
tmp = tempfile.mkdtemp(prefix="bk_translate_")
P = lambda n: os.path.join(tmp, n)  # noqa: E731


def run(*args, stdin=None, env=None):
    e = dict(os.environ)
    if env:
        e.update(env)
    p = subprocess.run([BK, *args], capture_output=True, text=True, errors="replace", timeout=300, env=e,
                       cwd=tmp, input=stdin)
    return p.returncode, p.stdout, p.stderr


def write(name, text):
    with open(P(name), "w") as f:
        f.write(text)
    return P(name)


CFG = "arch=seq2seq,input=tokens,vocab=12,max_len=8,tgt_max_len=8,dim=16,depth=1,dec_depth=1,heads=2,mlp_dim=16"
rc, out, err = run("model", "init", "--config", CFG, "--out", P("init.st"))
check(rc == 0, "model init seq2seq", out + err)
# a few steps on reversing 1-5 ids in [4, 12) so that sentences translate differently
rng = np.random.default_rng(0)
n, L = 64, 8
T = np.full((n, L), 2, np.int32)
G = np.full((n, L), 2, np.int32)
ln = np.zeros(n, np.int32)
for i in range(n):
    k = int(rng.integers(1, 6))
    s = rng.integers(4, 12, k)
    T[i, :k], T[i, k], G[i, :k], G[i, k], ln[i] = s, 2, s[::-1], 2, k + 1
for name, a in (("T", T), ("L", ln), ("G", G)):
    np.save(P(name + ".npy"), a)
rc, out, err = run("model", "train", "--ckpt", P("init.st"), "--tokens", P("T.npy"), "--len", P("L.npy"), "--tgt",
                   P("G.npy"), "--tgt-len", P("L.npy"), "--steps", "60", "--optim", "lr=0.01", "--out", P("s2s.st"))
check(rc == 0, "model train seq2seq", out + err)
CK = P("s2s.st")

lines = ["4 5 6", "7 8", "9 10 11 4 5", "3", "11 4 6 8 10 5 7", "6"]
src = write("in.ids", "\n".join(lines) + "\n")


def ids_out(text):
    return [[int(t) for t in ln.split()] for ln in text.split("\n")[:-1]]


base = None
for beam in ("1", "4"):
    rc, out, err = run("translate", "--ckpt", CK, "--ids", "--input", src, "--beam", beam)
    ok = check(rc == 0, "translate --ids beam %s" % beam, err)
    if not ok:
        continue
    got = ids_out(out)
    check(len(got) == len(lines) and out.endswith("\n"), "one line per input (beam %s)" % beam, out)
    check(all(0 <= t < 12 for s in got for t in s) and all(len(s) <= 7 for s in got), "ids in range", out)
    check("sentences/s" in err, "sentences/s reported", err)
    variants = [["--threads", "1"], ["--threads", "2"], ["--no-cache"], ["--batch", "1"], ["--batch", "4"], []]
    for v in variants:
        rc2, out2, err2 = run("translate", "--ckpt", CK, "--ids", "--input", src, "--beam", beam, *v)
        check(rc2 == 0 and out2 == out, "beam %s: %s gives the same output" % (beam, " ".join(v) or "second run"),
              out + "\n---\n" + out2 + err2)
    if beam == "1":
        base = got
        check(len(set(map(tuple, got))) > 2, "the trained model's outputs differ between sentences", out)
        # order restored: each sentence alone gives its own line
        for i in (0, 2, 4):
            rc2, out2, _ = run("translate", "--ckpt", CK, "--ids", "--beam", "1", stdin=lines[i] + "\n")
            check(rc2 == 0 and ids_out(out2) == [got[i]], "input order restored (line %d)" % (i + 1), out2)

# stdin, --output (atomic file), --ref (BLEU over ids)
rc, out, err = run("translate", "--ckpt", CK, "--ids", "--beam", "1", "--output", P("o.ids"), stdin=open(src).read())
check(rc == 0 and out == "" and os.path.exists(P("o.ids")), "--output from stdin", err)
if base is not None and os.path.exists(P("o.ids")):
    check(ids_out(open(P("o.ids")).read()) == base, "--output holds the translations", open(P("o.ids")).read())
    rc, out, err = run("translate", "--ckpt", CK, "--ids", "--beam", "1", "--input", src, "--ref", P("o.ids"))
    check(rc == 0 and "BLEU = 100.00" in err, "--ref: BLEU of the output against itself is 100", err)
    check(not [f for f in os.listdir(tmp) if "tmp" in f.lower() and f.startswith("o.ids")], "no staged file left")

# refusals: non-zero status and a message naming the problem
cls = P("cls.st")
rc, out, err = run("model", "init", "--config", "input=tokens,vocab=12,max_len=8,dim=16,depth=1,heads=2,mlp_dim=16,"
                   "classes=2", "--out", cls)
check(rc == 0, "model init classifier", out + err)
bad = [
    ("empty line", ["--input", write("e.ids", "4 5\n\n6\n")], "line 2 is empty"),
    ("blank line", ["--input", write("b.ids", "4 5\n  \n")], "line 2 is empty"),
    ("over-long line", ["--input", write("l.ids", "4\n4 5 6 7 8 9 10 11\n")], "line 2 has 8 tokens"),
    ("id >= vocab", ["--input", write("v.ids", "4\n5\n4 12\n")], "line 3: id 12 outside the vocabulary"),
    ("negative id", ["--input", write("n.ids", "-1\n")], "line 1: id -1"),
    ("not an id", ["--input", write("x.ids", "4 five\n")], "line 1: 'five' is not a token id"),
    ("no lines", ["--input", write("z.ids", "")], "has no lines"),
    ("missing input", ["--input", P("nope.ids")], "nope.ids"),
    ("ref line count", ["--input", src, "--ref", write("r2", "a\n")], "they must be equal"),
    ("missing ref", ["--input", src, "--ref", P("nope.ref")], "nope.ref"),
]
for name, args, msg in bad:
    rc, out, err = run("translate", "--ckpt", CK, "--ids", *args)
    check(rc != 0 and msg in err and out == "", "refuses %s" % name, "rc %d: %s" % (rc, err))
for name, args, msg in [
    ("classifier checkpoint", ["--ckpt", cls, "--ids", "--input", src], "not an encoder-decoder"),
    ("missing checkpoint", ["--ckpt", P("nope.st"), "--ids", "--input", src], "nope.st"),
    ("no --ckpt", ["--ids", "--input", src], "needs --ckpt"),
    ("beam 0", ["--ckpt", CK, "--ids", "--input", src, "--beam", "0"], "--beam 0"),
    ("bad batch", ["--ckpt", CK, "--ids", "--input", src, "--batch", "0"], "--batch"),
    ("unknown flag", ["--ckpt", CK, "--ids", "--frobnicate"], "frobnicate"),
    ("raw text without --spm", ["--ckpt", CK, "--input", write("t.txt", "hola\n")], "needs --spm"),
    ("missing --spm", ["--ckpt", CK, "--input", P("t.txt"), "--spm", P("nope.model")], "nope.model"),
]:
    rc, out, err = run("translate", *args)
    check(rc != 0 and msg in err, "refuses %s" % name, "rc %d: %s" % (rc, err))
# the output file is not touched on failure
write("keep.out", "old\n")
rc, out, err = run("translate", "--ckpt", CK, "--ids", "--input", P("v.ids"), "--output", P("keep.out"))
check(rc != 0 and open(P("keep.out")).read() == "old\n", "a refused input leaves --output alone", err)
# endless and non-text inputs (issue 41): every reader stops at a documented limit (BK_TEXT_MAX_LINE 1 MiB,
# BK_TEXT_MAX_LINES 2^24, birkhoff/core.h) or at a NUL byte, with a message naming the input, instead of growing


def bounded(*args, yes=False, limit=60):
    """run with a time limit (a reader that never stops fails instead of hanging); yes: stdin from `yes`"""
    y = subprocess.Popen(["yes"], stdout=subprocess.PIPE) if yes else None
    try:
        p = subprocess.run([BK, *args], stdin=y.stdout if y else subprocess.DEVNULL, capture_output=True, text=True,
                           errors="replace", timeout=limit, cwd=tmp)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return None, "", "timed out after %d s" % limit
    finally:
        if y:
            y.kill()
            y.wait()


os.makedirs(P("adir"), exist_ok=True)
write("r1", "a b c\n")
open(P("huge.ids"), "w").write("4 5\n" + "4 " * (1 << 19) + "4\n")  # line 2: 1 MiB + 1 bytes
for name, args, stdin_yes, msg in [
    ("translate --input /dev/zero", ["translate", "--ckpt", CK, "--ids", "--input", "/dev/zero"], False,
     "birkhoff translate: /dev/zero: line 1 holds a NUL byte"),
    ("yes | translate --input -", ["translate", "--ckpt", CK, "--ids", "--input", "-"], True,
     "birkhoff translate: -: more than 16777216 lines (the limit)"),
    ("translate --ref /dev/zero", ["translate", "--ckpt", CK, "--ids", "--input", src, "--ref", "/dev/zero"], False,
     "/dev/zero: line 1 holds a NUL byte"),
    ("translate: a line over 1 MiB", ["translate", "--ckpt", CK, "--ids", "--input", P("huge.ids")], False,
     "huge.ids: line 2 is longer than 1048576 bytes (the limit)"),
    ("translate --input DIR", ["translate", "--ckpt", CK, "--ids", "--input", P("adir")], False,
     "adir: is a directory"),
    ("bleu --hyp /dev/zero", ["bleu", "--hyp", "/dev/zero", "--ref", P("r1")], False,
     "birkhoff bleu: /dev/zero: line 1 holds a NUL byte"),
    ("yes | bleu --hyp -", ["bleu", "--hyp", "-", "--ref", P("r1")], True,
     "birkhoff bleu: -: more than 16777216 lines (the limit)"),
    ("bleu --ref /dev/zero", ["bleu", "--hyp", P("r1"), "--ref", "/dev/zero"], False, "/dev/zero: line 1 holds a NUL"),
    ("bleu --ref DIR", ["bleu", "--hyp", P("r1"), "--ref", P("adir")], False, "adir: is a directory"),
]:
    rc, out, err = bounded(*args, yes=stdin_yes)
    check(rc == 1 and msg in err and out == "", "stops on %s" % name, "rc %s: %s" % (rc, err[-300:]))

# a file that is not a SentencePiece model; no tool is needed (an empty PATH)
rc, out, err = run("translate", "--ckpt", CK, "--input", P("t.txt"), "--spm", src, env={"PATH": tmp})
check(rc != 0 and "not a SentencePiece model" in err and "in.ids" in err, "refuses a file that is not a model",
      "rc %d: %s" % (rc, err))

# swaps of an encoder-decoder: the encoder or the cross-attention; the decoder's causal self-attention is
# refused with the reason; a DS cross-attention is refused by translate (no step-by-step form)
rc, out, err = run("model", "swap", "--in", CK, "--out", P("dec.st"), "--attn", "sinkhorn", "--blocks", "dec")
check(rc == 2 and "causal" in err and not os.path.exists(P("dec.st")), "swap of the decoder's self-attention refused",
      "rc %d: %s" % (rc, err))
rc, out, err = run("model", "swap", "--in", CK, "--out", P("enc.st"), "--attn", "sinkhorn", "sk_iters=3")
check(rc == 0 and "encoder softmax attention -> sinkhorn" in out, "swap of the encoder", out + err)
rc, out, err = run("translate", "--ckpt", P("enc.st"), "--ids", "--input", src)
check(rc == 0 and len(out.split("\n")) == len(lines) + 1, "a Sinkhorn encoder decodes", err)
rc, out, err = run("model", "swap", "--in", CK, "--out", P("cross.st"), "--attn", "sinkhorn", "--blocks", "cross")
check(rc == 0 and "cross-attention softmax -> sinkhorn" in out, "swap of the cross-attention", out + err)
rc, out, err = run("translate", "--ckpt", P("cross.st"), "--ids", "--input", src)
check(rc == 1 and "step-by-step" in err, "translate refuses a Sinkhorn cross-attention", "rc %d: %s" % (rc, err))
rc, out, err = run("eval", "--ckpt", P("cross.st"))
check(rc != 0, "eval of a checkpoint without a run needs data", out + err)

# chrF on hand-computed corpora (birkhoff bleu --chrf shares translate's chrF):
# "ab" vs "abc": 1-grams 2/2 precision, 2/3 recall; 2-grams 1/1, 1/2; no 3-grams in the hypothesis:
# P = 1, R = 7/12, F2 = 5 P R / (4 P + R) = 7/11. Adding "a b" vs "ab" (whitespace removed: equal):
# 1-grams 4/4, 4/5; 2-grams 2/2, 2/3: P = 1, R = 11/15, F2 = 55/71.
for hyp, ref, want in ((["ab"], ["abc"], 700 / 11), (["ab", "a b"], ["abc", "ab"], 5500 / 71),
                       (["ñandú x"], ["ñandúx"], 100.0), (["xyz"], ["abc"], 0.0)):
    rc, out, err = run("bleu", "--hyp", write("h", "\n".join(hyp) + "\n"), "--ref", write("r", "\n".join(ref) + "\n"),
                       "--chrf", "--json")
    ok = rc == 0
    got = json.loads(out)["chrf"] if ok else None
    check(ok and abs(got - want) < 1e-9, "chrF %r vs %r = %.6f" % (hyp, ref, want), "%s %s" % (out, err))

# raw text through the library's SentencePiece: a model trained here (bk_spm_train through ctypes)
import ctypes as C  # noqa: E402

LIB = os.path.join(os.path.dirname(BK), "libbirkhoff.so")
lib = C.CDLL(LIB)
lib.bk_spm_train.argtypes = [C.POINTER(C.c_char_p), C.c_int64, C.c_int, C.POINTER(C.c_void_p), C.POINTER(C.c_size_t)]
lib.bk_spm_load.argtypes = [C.c_void_p, C.c_size_t, C.POINTER(C.c_void_p)]
lib.bk_spm_vocab.argtypes = [C.c_void_p]
lib.bk_spm_encode.argtypes = [C.c_void_p, C.c_char_p, C.POINTER(C.c_int32), C.c_int, C.POINTER(C.c_int)]
lib.bk_spm_decode.argtypes = [C.c_void_p, C.POINTER(C.c_int32), C.c_int, C.POINTER(C.c_void_p)]
words = "el la los las de que y en un una por con para es era dios tierra cielo luz agua dia noche".split()
corpus = [" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(3 + i % 6)) for i in range(300)]
arr = (C.c_char_p * len(corpus))(*[t.encode() for t in corpus])
mptr, mlen = C.c_void_p(), C.c_size_t()
check(lib.bk_spm_train(arr, len(corpus), 300, C.byref(mptr), C.byref(mlen)) == 0, "bk_spm_train through ctypes")
model = C.string_at(mptr, mlen.value)
SPM = write("m.model", "")
with open(SPM, "wb") as f:
    f.write(model)
sp = C.c_void_p()
lib.bk_spm_load(model, len(model), C.byref(sp))
V = lib.bk_spm_vocab(sp)


def enc(text):
    n = C.c_int()
    ids = (C.c_int32 * 256)()
    lib.bk_spm_encode(sp, text.encode(), ids, 256, C.byref(n))
    return list(ids[:n.value])


def dec(ids):
    a = (C.c_int32 * max(1, len(ids)))(*ids)
    o = C.c_void_p()
    lib.bk_spm_decode(sp, a, len(ids), C.byref(o))
    return C.string_at(o).decode()


cfg = "arch=seq2seq,input=tokens,vocab=%d,max_len=32,tgt_max_len=16,dim=16,depth=1,dec_depth=1,heads=2,mlp_dim=16" % V
rc, out, err = run("model", "init", "--config", cfg, "--out", P("raw.st"))
check(rc == 0, "model init vocab %d" % V, out + err)
text = ["en el principio dios", "y la tierra era", "luz de dia y noche ñandú"]  # (ñandú: unseen, byte pieces)
tin = write("in.es", "\n".join(text) + "\n")
rc, out, err = run("translate", "--ckpt", P("raw.st"), "--spm", SPM, "--input", tin, "--beam", "2",
                   "--ref", write("ref.en", "in the beginning\nand the earth\nlight\n"), env={"PATH": tmp})
check(rc == 0 and len(out.split("\n")) == 4 and out.endswith("\n"), "raw text: one line per input (no PATH)", out + err)
check("BLEU = " in err and "chrF2 = " in err, "raw text --ref: BLEU and chrF", err)
rc2, out2, err2 = run("translate", "--ckpt", P("raw.st"), "--spm", SPM, "--input", tin, "--beam", "2", "--threads", "1")
check(rc2 == 0 and out2 == out, "raw text: deterministic", out + out2 + err2)
ids_in = "".join(" ".join(map(str, enc(t))) + "\n" for t in text)
rc3, out3, err3 = run("translate", "--ckpt", P("raw.st"), "--ids", "--beam", "2", stdin=ids_in)
decoded = "".join(dec([int(x) for x in ln.split()]) + "\n" for ln in out3.split("\n")[:-1])
check(rc3 == 0 and decoded == out, "raw text = decode(--ids on the model's encoding)", out + "---\n" + decoded + err3)
rc, out, err = run("translate", "--ckpt", P("raw.st"), "--spm", SPM,
                   "--input", write("long.es", "hola\n" + "palabra " * 40 + "\n"))
check(rc != 0 and "line 2 has" in err and "max_len 32" in err, "raw text: over-long line named", err)
with open(P("bad.es"), "wb") as f:
    f.write(b"hola\ncaf\xe9\n")
rc, out, err = run("translate", "--ckpt", P("raw.st"), "--spm", SPM, "--input", P("bad.es"))
check(rc != 0 and "bad.es: line 2: byte 4: invalid UTF-8" in err, "raw text: invalid UTF-8 named (line, byte)", err)
rc, out, err = run("translate", "--ckpt", CK, "--spm", SPM, "--input", tin)
check(rc != 0 and "pieces" in err and "vocabulary 12" in err, "a model of another vocabulary refused", err)

BIBLE_SPM = os.path.join(ROOT, "data", "bible", "spm.model")
if os.path.exists(BIBLE_SPM):
    cfg = "arch=seq2seq,input=tokens,vocab=8000,max_len=32,tgt_max_len=16,dim=16,depth=1,dec_depth=1,heads=2,mlp_dim=16"
    rc, out, err = run("model", "init", "--config", cfg, "--out", P("big.st"))
    rc, out, err = run("translate", "--ckpt", P("big.st"), "--spm", BIBLE_SPM, "--input",
                       write("b.es", "En el principio creó Dios los cielos y la tierra.\n"), "--beam", "2")
    check(rc == 0 and len(out.split("\n")) == 2, "raw text with the Bible model", out + err)
else:
    print("SKIP the Bible model: data/bible/spm.model missing (scripts/data.sh bible-spm)")

shutil.rmtree(tmp, ignore_errors=True)
sys.exit(check.summary(" (translate CLI)"))
