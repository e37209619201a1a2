"""birkhoff's SentencePiece shim (bk_spm_*, src/data/spm.cc, through ctypes on
libbirkhoff.so) against SentencePiece's own Python module (Debian's
python3-sentencepiece), or, when that module is missing, against its
command-line tools spm_encode / spm_decode (Debian's sentencepiece).

A model is trained by bk_spm_train on a corpus of random sentences (Latin,
accented, Cyrillic and CJK words, punctuation, digits; vocab 500), then:
  - the model bytes equal a second training's (determinism);
  - SentencePiece itself loads the bytes, and its piece count is
    bk_spm_vocab's, with unk 0, bos 1, eos 2, pad 3;
  - for 400 random texts (words of the corpus and unseen ones, emoji, runs
    of spaces, tabs, leading and trailing spaces) bk_spm_encode's ids equal
    SentencePiece's encode, and bk_spm_decode of those ids equals its decode
    and the text itself (byte fallback: nothing is lost);
  - 200 random id sequences (control ids included) decode alike (a NUL
    byte, which a C string cannot hold, as U+FFFD: birkhoff/data.h).
If neither the module nor the tools are there the test prints SKIP and exits
0, unless BK_REQUIRE_ORACLE=1 or CI=true. The last line is "N passed,
M failed". Run: /usr/bin/python3 tests/oracle/test_spm.py --lib build/libbirkhoff.so"""
import argparse
import ctypes as C
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from checklib import Checks  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default="build/libbirkhoff.so")
args = ap.parse_args()
check = Checks()

try:
    import sentencepiece as spm_mod
except ImportError as e:
    spm_mod = None
    why = str(e)
if spm_mod is None and not (shutil.which("spm_encode") and shutil.which("spm_decode")):
    if os.environ.get("BK_REQUIRE_ORACLE") == "1" or os.environ.get("CI") == "true":
        print("FAIL: python3-sentencepiece (or the sentencepiece tools) is required: %s" % why)
        print("0 passed, 1 failed")
        sys.exit(1)
    print("SKIP: neither the sentencepiece module (%s) nor spm_encode/spm_decode; install python3-sentencepiece" % why)
    sys.exit(0)

lib = C.CDLL(os.path.abspath(args.lib))
lib.bk_last_error.restype = C.c_char_p
lib.bk_spm_train.argtypes = [C.POINTER(C.c_char_p), C.c_int64, C.c_int, C.POINTER(C.c_void_p), C.POINTER(C.c_size_t)]
lib.bk_spm_load.argtypes = [C.c_void_p, C.c_size_t, C.POINTER(C.c_void_p)]
lib.bk_spm_vocab.argtypes = [C.c_void_p]
lib.bk_spm_encode.argtypes = [C.c_void_p, C.c_char_p, C.POINTER(C.c_int32), C.c_int, C.POINTER(C.c_int)]
lib.bk_spm_decode.argtypes = [C.c_void_p, C.POINTER(C.c_int32), C.c_int, C.POINTER(C.c_void_p)]
lib.bk_spm_free.argtypes = [C.c_void_p]
libc = C.CDLL(None)
libc.free.argtypes = [C.c_void_p]

rng = random.Random(7)
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "niño", "canción", "señor", "día", "agua",
         "мир", "привет", "книга", "漢字", "東京", "日本語", "42", "3.14", "e-mail", "(x)", "don't", "naïve", "café"]
UNSEEN = ["Ω", "ж", "\U0001F600", "ß", "Ärger", "ĳ", "𝔘𝔫𝔦", "ℕ", "中文字", "zebra", "ÿ"]


def sentence(words, k):
    return " ".join(rng.choice(words) for _ in range(k))


def train(texts, vocab):
    arr = (C.c_char_p * len(texts))(*[t.encode("utf-8") for t in texts])
    out, n = C.c_void_p(), C.c_size_t()
    st = lib.bk_spm_train(arr, len(texts), vocab, C.byref(out), C.byref(n))
    if st != 0:
        return None, lib.bk_last_error().decode()
    data = C.string_at(out, n.value)
    libc.free(out)
    return data, ""


def bk_encode(s, text):
    n = C.c_int()
    b = text.encode("utf-8")
    if lib.bk_spm_encode(s, b, None, 0, C.byref(n)) != 0:
        return None
    ids = (C.c_int32 * max(1, n.value))()
    if lib.bk_spm_encode(s, b, ids, n.value, C.byref(n)) != 0:
        return None
    return list(ids[:n.value])


def bk_decode(s, ids):
    arr = (C.c_int32 * max(1, len(ids)))(*ids)
    out = C.c_void_p()
    if lib.bk_spm_decode(s, arr, len(ids), C.byref(out)) != 0:
        return None
    text = C.string_at(out).decode("utf-8")
    libc.free(out)
    return text


corpus = [sentence(WORDS, rng.randint(2, 12)) for _ in range(600)]
model, err = train(corpus, 500)
check(model is not None, "bk_spm_train on 600 sentences, vocab 500", err)
if model is None:
    sys.exit(check.summary(" (sentencepiece)"))
again, _ = train(corpus, 500)
check(again == model, "training twice gives the same model bytes", "")
s = C.c_void_p()
check(lib.bk_spm_load(model, len(model), C.byref(s)) == 0, "bk_spm_load", lib.bk_last_error().decode())
V = lib.bk_spm_vocab(s)

tmp = tempfile.mkdtemp(prefix="bk_spm_")
mpath = os.path.join(tmp, "m.model")
with open(mpath, "wb") as f:
    f.write(model)

texts = []
for i in range(400):
    pool = WORDS + UNSEEN if i % 2 else WORDS
    t = sentence(pool, rng.randint(1, 10))
    if i % 5 == 0:
        t = "  " + t.replace(" ", "   ", 1) + " "
    if i % 7 == 0:
        t = t.replace(" ", "\t", 1)
    texts.append(t)
texts += ["", " ", "x", "\t", "a  b", "\U0001F600\U0001F600"]
id_seqs = [[rng.randrange(V) for _ in range(rng.randint(0, 12))] for _ in range(200)]

if spm_mod is not None:
    how = "the sentencepiece module %s" % getattr(spm_mod, "__version__", "")
    sp = spm_mod.SentencePieceProcessor(model_proto=model)
    check(sp.get_piece_size() == V, "the module reads the model: %d pieces" % V, str(sp.get_piece_size()))
    check((sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, 3), "unk, bos, eos, pad = 0, 1, 2, 3",
          str((sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id())))
    ref_enc = [sp.encode(t) for t in texts]
    ref_dec = [sp.decode(ids) for ids in ref_enc]
    ref_rand = [sp.decode(ids).replace("\x00", "\ufffd") for ids in id_seqs]  # (a NUL byte: U+FFFD, data.h)
else:
    how = "spm_encode / spm_decode"
    # the tools read lines: texts without a newline, one a line
    r = subprocess.run(["spm_encode", "--model=" + mpath, "--output_format=id"], input="".join(t + "\n" for t in texts),
                       capture_output=True, text=True)
    ref_enc = [[int(x) for x in ln.split()] for ln in r.stdout.split("\n")[:-1]]
    r = subprocess.run(["spm_decode", "--model=" + mpath, "--input_format=id"],
                       input="".join(" ".join(map(str, ids)) + "\n" for ids in ref_enc), capture_output=True, text=True)
    ref_dec = r.stdout.split("\n")[:-1]
    ref_rand = None  # (an empty id line is not a line spm_decode keeps apart)

print("reference: %s; %d pieces; %d texts" % (how, V, len(texts)))
bad_enc = [(t, bk_encode(s, t), e) for t, e in zip(texts, ref_enc) if bk_encode(s, t) != e]
check(len(ref_enc) == len(texts) and not bad_enc, "bk_spm_encode == %s on %d texts" % (how, len(texts)),
      repr(bad_enc[:3]))
bad_dec = [(ids, bk_decode(s, ids), d) for ids, d in zip(ref_enc, ref_dec) if bk_decode(s, ids) != d]
check(len(ref_dec) == len(texts) and not bad_dec, "bk_spm_decode == %s" % how, repr(bad_dec[:3]))
lost = [t for t in texts if bk_decode(s, bk_encode(s, t) or []) != t]
check(not lost, "decode(encode(t)) == t for every text (byte fallback, whitespace kept)", repr(lost[:3]))
if ref_rand is not None:
    bad_r = [(ids, bk_decode(s, ids), d) for ids, d in zip(id_seqs, ref_rand) if bk_decode(s, ids) != d]
    check(not bad_r, "bk_spm_decode == %s on 200 random id sequences" % how, repr(bad_r[:3]))
lib.bk_spm_free(s)
shutil.rmtree(tmp, ignore_errors=True)
sys.exit(check.summary(" (sentencepiece)"))
