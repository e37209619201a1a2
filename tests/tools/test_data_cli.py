#!/usr/bin/python3
"""CLI tests for training on the user's own data (docs/DATA.md): for every
format (npy images, npz images / tokens / sets, TSV and CSV labelled text,
parallel text, id files) a small dataset made here is inspected, trained for
a few steps through `birkhoff train --data FORMAT:PATH`, evaluated, resumed
bit for bit, trained again on another thread count with the same result, and
(parallel text) translated from raw text; bad files are refused with the
file and the index / line named, and nothing is written.
Run: /usr/bin/python3 tests/tools/test_data_cli.py build/birkhoff"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from checklib import Checks  # noqa: E402

BK = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/birkhoff")
check = Checks()
tmp = tempfile.mkdtemp(prefix="bk_data_cli_")
P = lambda *n: os.path.join(tmp, *n)  # noqa: E731


def run(*args, stdin=None, timeout=600):
    p = subprocess.run([BK, *args], capture_output=True, text=True, errors="replace", timeout=timeout, cwd=tmp,
                       input=stdin)
    return p.returncode, p.stdout + p.stderr


def tensors(path):
    """the data section of a safetensors file (every weight and optimiser slot)"""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return b[8 + n:]


def records(path):
    """metrics.jsonl without its wall-clock fields"""
    out = []
    for line in open(path):
        r = json.loads(line)
        for k in ("samples_per_s", "time_s"):
            r.pop(k, None)
        out.append(json.dumps(r, sort_keys=True))
    return out


SMALL = ["--dim", "16", "--depth", "1", "--heads", "2", "--mlp-dim", "32", "--batch", "16", "--progress", "none"]


def exercise(tag, spec, keys, epochs=3, stop_after=5, seq2seq=False):
    """train, eval, resume, threads: the run directory P(tag)"""
    args = ["--data", spec, *SMALL, *keys, "--epochs", str(epochs)]
    rc, out = run("data", "inspect", spec, *keys)
    check(rc == 0 and "[train]" in out and "[test]" in out, f"{tag}: data inspect", out)
    rc, out = run("train", *args, "--threads", "2", "--out", P(tag))
    ok = check(rc == 0, f"{tag}: train", out)
    if not ok:
        return None
    for f in ("config.txt", "metrics.jsonl", "last.safetensors", "best.safetensors", "summary.json"):
        check(os.path.exists(P(tag, f)), f"{tag}: run directory has {f}")
    summ = json.load(open(P(tag, "summary.json")))
    check("test_loss" in summ and "best_epoch" in summ, f"{tag}: summary has the test result of the best epoch",
          str(summ))
    cfgtxt = open(P(tag, "config.txt")).read()
    check(f"data={spec}\n" in cfgtxt, f"{tag}: config.txt records the spec", cfgtxt[:200])
    recs = [json.loads(x) for x in open(P(tag, "metrics.jsonl"))]
    ep = [r for r in recs if r.get("type") == "epoch"]
    check(len(ep) == epochs and all("valid_loss" in r for r in ep), f"{tag}: one epoch record each with valid_loss",
          str(ep[:1]))
    check(sum(r.get("type") == "test" for r in recs) == 1, f"{tag}: one test record, at the end", str(recs[-1:]))
    rc, out = run("eval", "--ckpt", P(tag, "best.safetensors"))
    check(rc == 0, f"{tag}: eval of best.safetensors", out)
    rc, out = run("plot", "curves", "--run", P(tag), "--out", P(tag + "-curves.svg"))
    check(rc == 0 and os.path.getsize(P(tag + "-curves.svg")) > 1000, f"{tag}: plot curves of the run", out)
    # stopped and resumed == uninterrupted
    rc, out = run("train", *args, "--threads", "2", "--out", P(tag + "-r"), "--stop-after", str(stop_after))
    check(rc == 130, f"{tag}: stop_after stops with a checkpoint", out)
    rc, out = run("train", "--resume", P(tag + "-r"))
    check(rc == 0 and tensors(P(tag, "last.safetensors")) == tensors(P(tag + "-r", "last.safetensors")) and
          tensors(P(tag, "best.safetensors")) == tensors(P(tag + "-r", "best.safetensors")) and
          records(P(tag, "metrics.jsonl")) == records(P(tag + "-r", "metrics.jsonl")),
          f"{tag}: resumed run equals the uninterrupted one bitwise (weights, optimiser, best, records)", out)
    # another thread count: the same run
    rc, out = run("train", *args, "--threads", "1", "--out", P(tag + "-t1"))
    check(rc == 0 and tensors(P(tag, "last.safetensors")) == tensors(P(tag + "-t1", "last.safetensors")),
          f"{tag}: 1 thread and 2 threads train the same weights", out)
    return summ


def refused(tag, args, *needles, out_dir=None):
    """a command that must fail with a message naming each needle, writing nothing"""
    rc, out = run(*args)
    ok = rc != 0 and all(n in out for n in needles) and "Traceback" not in out
    if out_dir:
        ok = ok and not os.path.exists(out_dir)
    return check(ok, f"refused: {tag}", f"rc={rc} {out.strip()[:300]}")


rng = np.random.default_rng(7)

# ---- images: uint8 HWC in a directory of .npy files ----
N = 480
y = rng.integers(0, 3, N)
img = rng.integers(0, 60, (N, 8, 8, 1)).astype(np.uint8)
for i in range(N):  # class k: a bright row band at rows 2k..2k+1
    img[i, 2 * y[i]:2 * y[i] + 2, :, 0] += 180
os.makedirs(P("img"))
np.save(P("img", "x.npy"), img)
np.save(P("img", "y.npy"), y.astype(np.int64))
s = exercise("img", "npy:" + P("img"), ["--patch", "2"], epochs=12)
if s:
    check(s.get("test_acc", 0) > 0.9, "images: learns (chance is 1/3) with the default optimiser and schedule", str(s))

# ---- images: float32 [N, H, W] in an .npz ----
np.savez(P("imgf.npz"), x=(img[..., 0] / 255.0).astype(np.float32), y=y.astype(np.int32))
exercise("imgf", "npz:" + P("imgf.npz"), ["--patch", "2", "--shuffle-window", "64"], epochs=2)  # windowed order

# ---- tokens with lengths (compressed .npz) ----
L = 12
tok = rng.integers(1, 10, (N, L)).astype(np.int32)
ln = rng.integers(3, L + 1, N).astype(np.int32)
yt = np.array([int((tok[i, :ln[i]] == 7).any()) for i in range(N)], np.int32)
np.savez_compressed(P("tok.npz"), x=tok, y=yt, lengths=ln)
exercise("tok", "npz:" + P("tok.npz"), [], epochs=2)

# ---- sets with lengths ----
pts = rng.normal(size=(N, 10, 2)).astype(np.float32)
lp = rng.integers(3, 11, N).astype(np.int32)
ys = (pts[:, 0, 0] > 0).astype(np.int32)
np.savez(P("sets.npz"), x=pts, y=ys, lengths=lp)
exercise("sets", "npz:" + P("sets.npz"), ["--array-kind", "3"], epochs=2)

# ---- labelled text: TSV with named labels, CSV with a header and quotes ----
words = {"pos": ["good", "great", "fine", "lovely", "happy"], "neg": ["bad", "awful", "poor", "sad", "grim"],
         "mid": ["okay", "plain", "average", "so-so", "fair"]}
common = ["the", "film", "was", "really", "a", "day", "and", "ñandú", "café"]
rows = []
for i in range(N):
    lab = ["pos", "neg", "mid"][i % 3]
    w = [str(rng.choice(common)) for _ in range(4)] + [str(rng.choice(words[lab])) for _ in range(2)]
    rng.shuffle(w)
    rows.append((lab, " ".join(w)))
with open(P("text.tsv"), "w") as f:
    f.write("".join(f"{a}\t{b}\n" for a, b in rows))
s = exercise("tsv", "tsv:" + P("text.tsv"), ["--spm-vocab", "300", "--seq-len", "24"], epochs=2)
if s:
    check(os.path.exists(P("tsv", "spm.model")), "tsv: the trained SentencePiece model is in the run directory")
    check("spm_model=" in open(P("tsv", "config.txt")).read(), "tsv: the run records its SentencePiece model")
rc, out = run("data", "inspect", "tsv:" + P("text.tsv"), "--spm-vocab", "300")
check(rc == 0 and "mid=" in out and "neg=" in out and "pos=" in out, "tsv: inspect names the classes", out)
with open(P("text.csv"), "w") as f:
    f.write("text,label\n" + "".join('"%s, said ""x""",%s\n' % (b, a) for a, b in rows))
exercise("csv", "csv:" + P("text.csv"), ["--spm-vocab", "300", "--text-header", "1", "--text-column", "1",
                                         "--label-column", "2"], epochs=1, stop_after=3)

# ---- parallel text: raw sentences, then raw-text translation ----
vocab = ["uno", "dos", "tres", "cuatro", "cinco", "seis"]
eng = {"uno": "one", "dos": "two", "tres": "three", "cuatro": "four", "cinco": "five", "seis": "six"}
src, tgt = [], []
for i in range(300):
    k = int(rng.integers(1, 5))
    w = [str(rng.choice(vocab)) for _ in range(k)]
    src.append(" ".join(w))
    tgt.append(" ".join(eng[x] for x in w))
open(P("pairs.es"), "w").write("\n".join(src) + "\n")
open(P("pairs.en"), "w").write("\n".join(tgt) + "\n")
pkeys = ["--spm-vocab", "300", "--dec-depth", "1", "--batch", "32"]
s = exercise("par", "parallel:%s,%s" % (P("pairs.es"), P("pairs.en")), pkeys, epochs=2, seq2seq=True)
if s:
    open(P("raw.es"), "w").write("uno dos\ntres\ncinco seis uno\n")
    rc, out = run("translate", "--ckpt", P("par", "best.safetensors"), "--input", P("raw.es"), "--output",
                  P("raw.en"), "--beam", "2")
    got = open(P("raw.en")).read().split("\n") if os.path.exists(P("raw.en")) else []
    check(rc == 0 and len(got) == 4 and got[3] == "", "parallel: translate raw text with the run's own model", out)

# ---- id files ----
open(P("ids.src"), "w").write("".join(" ".join(str(t) for t in rng.integers(4, 20, int(rng.integers(1, 6)))) + "\n"
                                      for _ in range(200)))
lines = open(P("ids.src")).read().split("\n")[:-1]
open(P("ids.tgt"), "w").write("".join(" ".join(reversed(x.split())) + "\n" for x in lines))
exercise("ids", "ids:%s,%s" % (P("ids.src"), P("ids.tgt")), ["--dec-depth", "1"], epochs=2, seq2seq=True)

# ---- separate validation and test files ----
np.save(P("img", "xv.npy"), img[:40])
np.save(P("img", "yv.npy"), y[:40].astype(np.int64))
rc, out = run("data", "inspect", "npy:" + P("img"), "--data-valid", "npy:%s,%s" % (P("img", "xv.npy"),
                                                                                 P("img", "yv.npy")))
check(rc == 0 and "[valid]\nsamples   40 " in out, "a validation split of its own files", out)

# ---- bad data: a clear error naming the file and the place; nothing written ----
bad = P("bad")
os.makedirs(bad)


def npy_case(name, x, yy, *needles, lengths=None):
    d = os.path.join(bad, name)
    os.makedirs(d)
    np.save(os.path.join(d, "x.npy"), x)
    np.save(os.path.join(d, "y.npy"), yy)
    if lengths is not None:
        np.save(os.path.join(d, "lengths.npy"), lengths)
    refused(name, ["data", "inspect", "npy:" + d], *needles)
    refused(name + " (train)", ["train", "--data", "npy:" + d, *SMALL, "--out", P("never-" + name)], *needles,
            out_dir=P("never-" + name))


yb = y.copy()
yb[17] = -1
npy_case("negative label", img, yb, "y.npy", "17")
npy_case("mismatched N", img, y[:-3], "x.npy", "y.npy")
xf = (img[..., 0] / 255.0).astype(np.float32)
xf[5, 3, 3] = np.nan
npy_case("NaN input", xf, y, "x.npy", "5")
npy_case("float64 input", img.astype(np.float64), y, "x.npy", "dtype")
npy_case("rank-1 input", np.zeros(N, np.float32), y, "x.npy")
npy_case("lengths out of range", tok, yt, "lengths.npy", lengths=np.where(np.arange(N) == 9, L + 1, ln).astype(np.int32))
os.makedirs(os.path.join(bad, "empty"))
open(os.path.join(bad, "empty", "x.npy"), "wb").close()
np.save(os.path.join(bad, "empty", "y.npy"), y)
refused("empty file", ["data", "inspect", "npy:" + os.path.join(bad, "empty")], "x.npy")
raw = open(P("img", "x.npy"), "rb").read()
os.makedirs(os.path.join(bad, "trunc"))
open(os.path.join(bad, "trunc", "x.npy"), "wb").write(raw[:len(raw) - 100])
np.save(os.path.join(bad, "trunc", "y.npy"), y)
refused("truncated file", ["data", "inspect", "npy:" + os.path.join(bad, "trunc")], "x.npy")


def text_case(name, body, *needles, fmt="tsv", mode="wb"):
    path = os.path.join(bad, name.replace(" ", "_") + "." + fmt)
    open(path, mode).write(body)
    refused(name, ["data", "inspect", f"{fmt}:{path}", "--spm-vocab", "300"], *needles)
    refused(name + " (train)", ["train", "--data", f"{fmt}:{path}", "--spm-vocab", "300", *SMALL, "--out",
                                P("never-" + name)], *needles, out_dir=P("never-" + name))


good = "".join(f"{a}\t{b}\n" for a, b in rows[:60]).encode()
text_case("invalid UTF-8", good + b"pos\tbad \xff byte\n" + good, ".tsv:61")
text_case("missing label column", good + b"no tab here\n", ".tsv:61")
text_case("empty text file", b"", "empty")
text_case("line over the limit", good + b"pos\t" + b"a" * (1 << 21) + b"\n", "line_over_the_limit.tsv", "61")
open(P("short.en"), "w").write("\n".join(tgt[:-1]) + "\n")
refused("misaligned parallel files", ["data", "inspect", "parallel:%s,%s" % (P("pairs.es"), P("short.en"))],
        "short.en")
refused("an unknown format", ["data", "inspect", "xls:" + P("a.xls")], "unknown dataset")

status = check.summary()
shutil.rmtree(tmp, ignore_errors=True)
sys.exit(status)
