#!/usr/bin/python3
"""Tests of birkhoff.data.Dataset on the user's own data (FORMAT:PATH
specs, docs/DATA.md): arrays written by numpy read back equal (HWC images
transposed to CHW, uint8 scaled by 1/255, tokens zero after their length),
carved splits disjoint and covering the file, a validation split of its own
files, named classes and the SentencePiece model of labelled text, sentence
pairs, pickling (a spawned DataLoader worker reopens the split), the
torch.utils.data wrapper, and the C library's refusals raised as
BirkhoffError naming the file.

    /usr/bin/python3 tests/python/test_data.py
Prints "FAIL name: detail" for every failing check, then "N passed, M
failed"; exit status 1 if any failed. Needs numpy; torch for the wrapper.
"""
import os
import pickle
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.dont_write_bytecode = True
from checklib import Checks  # noqa: E402

from birkhoff.data import BirkhoffError, Dataset, known  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="bk_pydata_") if __name__ == "__main__" else None
P = lambda *n: os.path.join(tmp, *n)  # noqa: E731
rng = np.random.default_rng(3)


def raises(fn, name, *needles):
    try:
        fn()
    except BirkhoffError as e:
        return check(all(n in str(e) for n in needles), name, "message: %s" % e)
    except Exception as e:  # noqa: BLE001
        return check(False, name, "raised %r" % e)
    return check(False, name, "no error")


def main():
    # ---- images: uint8 HWC ----
    N = 200
    x = rng.integers(0, 256, (N, 6, 5, 3)).astype(np.uint8)
    y = rng.integers(0, 4, N)
    os.makedirs(P("img"))
    np.save(P("img", "x.npy"), x)
    np.save(P("img", "y.npy"), y)
    check(known("npy:" + P("img")) and not known("xls:" + P("img")), "known(): specs by their FORMAT")
    sp = {k: Dataset("npy:" + P("img"), k, valid_frac=0.2) for k in ("train", "valid", "test")}
    check(sum(len(d) for d in sp.values()) == N and all(d.rows == N for d in sp.values()),
          "carved splits cover the file", str([len(d) for d in sp.values()]))
    seen = {}
    for k, d in sp.items():
        for i in range(len(d)):
            img, lab = d[i]
            j = [r for r in range(N) if y[r] == lab and np.allclose(img, x[r].transpose(2, 0, 1) / 255.0, atol=0)]
            seen.setdefault(k, set()).update(j[:1])
    check(all(len(seen[k]) == len(sp[k]) for k in sp) and not (seen["train"] & seen["valid"]) and
          not (seen["train"] & seen["test"]) and not (seen["valid"] & seen["test"]),
          "every sample is a file row (CHW, /255), each in one split", str({k: len(v) for k, v in seen.items()}))
    tr = sp["train"]
    check(tr.kind == "image" and tr.input_shape == (3, 6, 5) and tr.classes == 4, "image shape and classes",
          "%s %s %d" % (tr.kind, tr.input_shape, tr.classes))
    # a split of its own files
    np.save(P("img", "xv.npy"), x[:30])
    np.save(P("img", "yv.npy"), y[:30])
    v = Dataset("npy:" + P("img"), "valid", data_valid="%s,%s" % (P("img", "xv.npy"), P("img", "yv.npy")))
    b = v.load()
    check(len(v) == 30 and np.allclose(b.x, x[:30].transpose(0, 3, 1, 2) / 255.0, rtol=1e-6, atol=0) and
          np.array_equal(b.labels, y[:30]), "data_valid: its own files, whole and in order")
    # pickling reopens
    t2 = pickle.loads(pickle.dumps(tr))
    check(len(t2) == len(tr) and np.array_equal(t2.load().x, tr.load().x), "a pickled split reopens the same")

    # ---- tokens with lengths, in an .npz ----
    L = 9
    tok = rng.integers(0, 50, (N, L)).astype(np.int32)
    ln = rng.integers(1, L + 1, N).astype(np.int32)
    np.savez(P("tok.npz"), x=tok, y=(tok[:, 0] % 2).astype(np.int32), lengths=ln)
    d = Dataset("npz:" + P("tok.npz"), "train", test_frac=0.0)
    b = d.load()
    want = np.where(np.arange(L)[None, :] < ln[:, None], tok, 0)
    check(d.kind == "tokens" and len(d) == N and np.array_equal(b.tokens, want) and np.array_equal(b.lengths, ln),
          "tokens: ids up to each length, zero after (test_frac 0: the whole file trains)")

    # ---- labelled text: named classes and the SentencePiece model ----
    names = ["neg", "pos", "mid"]
    with open(P("t.tsv"), "w") as f:
        for i in range(120):
            f.write("%s\tsentence %d about %s things\n" % (names[i % 3], i, names[i % 3]))
    t = Dataset("tsv:" + P("t.tsv"), "train", spm_vocab=300)
    check(t.class_names == ["mid", "neg", "pos"], "tsv: classes named in byte order", str(t.class_names))
    m = t.spm_model()
    check(isinstance(m, bytes) and len(m) > 100, "tsv: the SentencePiece model as bytes", str(len(m or b"")))
    open(P("spm.model"), "wb").write(m)
    t_given = Dataset("tsv:" + P("t.tsv"), "train", spm_model=P("spm.model"))
    check(t_given.version == t.version and np.array_equal(t_given.load().tokens, t.load().tokens),
          "tsv: the model given gives the same ids and version")
    tok0, l0, lab0 = t[0]
    check(tok0.shape == t.input_shape and 0 < l0 <= t.input_shape[0] and 0 <= lab0 < 3, "tsv: one sample")

    # ---- sentence pairs ----
    open(P("a.src"), "w").write("".join("uno dos %d\n" % i for i in range(50)))
    open(P("a.tgt"), "w").write("".join("one two %d\n" % i for i in range(50)))
    pr = Dataset("parallel:%s,%s" % (P("a.src"), P("a.tgt")), "test", spm_vocab=300)
    src, sl, tgt, tl = pr[0]
    check(pr.seq2seq and len(pr) == 5 and src[sl - 1] == 2 and tgt[tl - 1] == 2, "parallel: pairs ending in EOS",
          "%d %s" % (len(pr), pr.note))

    # ---- the torch wrapper, with spawned workers ----
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None:
        print("SKIP torch wrapper: no torch")
    else:
        ctx = torch.multiprocessing.get_context("spawn")
        dl = torch.utils.data.DataLoader(tr.torch(), batch_size=16, num_workers=2, multiprocessing_context=ctx)
        xs, ys = zip(*list(dl))
        allx = torch.cat(xs).numpy()
        check(allx.shape == (len(tr), 3, 6, 5) and np.array_equal(allx, tr.load().x) and
              np.array_equal(torch.cat(ys).numpy(), tr.load().labels), "DataLoader (2 spawned workers) = the split")

    # ---- refusals ----
    yb = y.copy()
    yb[11] = -3
    os.makedirs(P("bad"))
    np.save(P("bad", "x.npy"), x)
    np.save(P("bad", "y.npy"), yb)
    raises(lambda: Dataset("npy:" + P("bad")), "a negative label: BirkhoffError naming the file and the sample",
           "y.npy", "11")
    open(P("bad.tsv"), "wb").write(b"pos\tfine\nneg\t\xc3\x28 bad\n")
    raises(lambda: Dataset("tsv:" + P("bad.tsv"), spm_vocab=300), "invalid UTF-8: BirkhoffError naming file:line",
           "bad.tsv:2")
    try:
        Dataset("npy:" + P("img"), array_kind="pixels")
        check(False, "a bad array_kind name is refused")
    except ValueError:
        check(True, "a bad array_kind name is refused")



if __name__ == "__main__":  # (spawned DataLoader workers import this file)
    main()
    status = check.summary()
    shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(status)
