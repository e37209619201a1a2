#!/usr/bin/python3
"""CLI tests for `birkhoff train|eval|plot|data` and `birkhoff asap compile`
on real data (the UCI digits, fetched by scripts/data.sh into DATA, default
build/test-data) and on the generated sets: learning happens (digits > 90 %
test accuracy in a seconds-long run), an interrupted run (stop_after, or a
real SIGINT) resumed equals the uninterrupted one bit for bit, bad flags,
missing or corrupt data and corrupt checkpoints give clear messages and
non-zero statuses, and every figure is written as PNG and SVG.
Run: /usr/bin/python3 tests/tools/test_train_cli.py build/birkhoff"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from checklib import Checks  # noqa: E402

BK = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/birkhoff")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.abspath(os.environ.get("BK_TEST_DATA", os.path.join(ROOT, "build", "test-data")))
check = Checks()


def run(*args, env=None, timeout=600):
    e = dict(os.environ, BK_DATA=DATA)
    if env:
        e.update(env)
    p = subprocess.run([BK, *args], capture_output=True, text=True, errors="replace", timeout=timeout, env=e, cwd=tmp)
    return p.returncode, p.stdout + p.stderr


def tensors(path):
    """the data section and metadata of a safetensors file"""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return b[8 + n:], json.loads(b[8:8 + n])["__metadata__"]


def strip_times(path):
    """a metrics file without its wall-clock columns"""
    out = []
    for line in open(path):
        if line.startswith("{"):
            r = json.loads(line)
            r.pop("samples_per_s", None)
            r.pop("time_s", None)
            out.append(json.dumps(r, sort_keys=True))
        else:
            cols = line.strip().split(",")
            out.append(",".join(cols[:7] if "samples_per_s" in line or len(cols) == 9 else cols[:9]))
    return out


tmp = tempfile.mkdtemp(prefix="bk_train_")
P = lambda n: os.path.join(tmp, n)  # noqa: E731

# ---- data ----
r = subprocess.run([os.path.join(ROOT, "scripts", "data.sh"), "--dir", DATA, "digits"], capture_output=True, text=True)
check(r.returncode == 0, "scripts/data.sh digits fetches and verifies", r.stdout + r.stderr)
rc, out = run("data", "info", "digits")
check(rc == 0 and "[train]\nsamples   1294 (of 1438 rows read)" in out and "[valid]\nsamples   144 (of 1438" in out
      and "fnv1a:0b6db7d4442bbc5d" in out, "data info digits: the splits a new run takes (10 % of train held out)", out)
rc, out = run("data", "inspect", "digits", "--valid-frac", "0", "--split", "train")
check(rc == 0 and "samples   1438 (of 1438" in out and "[valid]" not in out, "data inspect --valid-frac 0: the whole "
      "training split", out)
rc, out = run("data", "info", "digits", "--split", "test")
check(rc == 0 and "samples   359" in out, "data info digits (test split)", out)
rc, out = run("data", "info", "listops", "--seq-len", "64")
check(rc == 0 and "vocabulary 15" in out and "generator" in out, "data info listops", out)
rc, out = run("data", "info", "shapes", "--points", "64")
check(rc == 0 and "point clouds (64 points x 3)" in out, "data info shapes", out)
rc, out = run("data", "info", "nope")
check(rc == 1 and "unknown dataset" in out, "unknown dataset refused", out)
rc, out = run("data", "info", "mnist", env={"BK_DATA": P("empty")})
check(rc == 1 and "cannot open" in out and "scripts/data.sh mnist" in out, "missing data names the fix", out)
# a corrupt copy: one flipped byte inside the gzip stream, then a wrong file
bad = P("bad-data")
os.makedirs(os.path.join(bad, "digits"))
raw = bytearray(open(os.path.join(DATA, "digits", "digits.csv.gz"), "rb").read())
raw[len(raw) // 2] ^= 0x40
open(os.path.join(bad, "digits", "digits.csv.gz"), "wb").write(raw)
rc, out = run("data", "info", "digits", "--data-dir", bad)
check(rc == 1 and "scripts/data.sh digits" in out and ("corrupt" in out or "known version" in out),
      "corrupt data refused with the fix", out)
os.makedirs(os.path.join(bad, "mnist"))
open(os.path.join(bad, "mnist", "train-images-idx3-ubyte"), "wb").write(b"\0\0\x08\x03" + b"\0" * 12)
rc, out = run("data", "info", "mnist", "--data-dir", bad)
check(rc == 1 and "not the known version" in out and "scripts/data.sh mnist" in out, "wrong IDX file refused", out)

# ---- training learns, and writes its run directory ----
cfg = os.path.join(ROOT, "configs", "digits.conf")
# (valid_frac 0: the test split every epoch, as before issue 43; model selection is tested below)
rc, out = run("train", "--config", cfg, "--out", P("sm"), "--progress", "plain", "--valid-frac", "0")
check(rc == 0, "train digits (softmax)", out)
summ = json.load(open(P("sm/summary.json"))) if rc == 0 else {}
check(summ.get("test_acc", 0) > 0.90, "digits: test accuracy > 90 % after the config's 15 epochs", str(summ))
for f in ("config.txt", "metrics.jsonl", "steps.csv", "epochs.csv", "last.safetensors", "ckpt/epoch-0000.safetensors",
          "ckpt/epoch-0015.safetensors"):
    check(os.path.exists(P("sm/" + f)), f"run directory has {f}")
if rc == 0:
    recs = [json.loads(x) for x in open(P("sm/metrics.jsonl"))]
    steps = [x for x in recs if x["type"] == "step"]
    epochs = [x for x in recs if x["type"] == "epoch"]
    check(len(epochs) == 15 and len(steps) == 15 * 45 and steps[-1]["step"] == 675, "one record per step and epoch",
          f"{len(steps)} {len(epochs)}")
    check(abs(epochs[-1]["test_acc"] - summ["test_acc"]) < 1e-6, "summary = last epoch record")
    check(epochs[-1]["attn_row_dev"] < 1e-5 and epochs[-1]["attn_col_dev"] > 0.05, "softmax: rows exact, columns not",
          str(epochs[-1]))
    check(steps[-1]["loss"] < steps[0]["loss"], "loss decreases")
    check("Epoch" not in out and "epoch 15/15" in out and "\x1b[K" not in out, "plain progress lines", out[-500:])
rc, out = run("train", "--config", cfg, "--out", P("sk"), "--attn", "sinkhorn", "--epochs", "10", "--progress", "bar",
              "--valid-frac", "0")
check(rc == 0 and "\x1b[K" in out, "train digits (Sinkhorn), progress bar", out[-400:])
ep = [json.loads(x) for x in open(P("sk/metrics.jsonl")) if '"epoch","epoch"' in x or '"type":"epoch"' in x]
check(ep and ep[-1]["test_acc"] > 0.85 and ep[-1]["attn_row_dev"] < 1e-5, "Sinkhorn run learns", str(ep[-1:]))

# ---- eval ----
rc, out = run("eval", "--ckpt", P("sm/last.safetensors"), "--json", P("ev.json"))
check(rc == 0 and "accuracy" in out and "confusion" in out and "mean|col sum-1|" in out, "eval output", out)
if rc == 0:
    ev = json.load(open(P("ev.json")))
    check(abs(ev["accuracy"] - summ["test_acc"]) < 1e-6 and ev["n"] == 359, "eval = training's last evaluation",
          str(ev)[:300])
    cm = ev["confusion"]
    check(len(cm) == 10 and sum(map(sum, cm)) == 359 and
          abs(sum(cm[i][i] for i in range(10)) / 359 - ev["accuracy"]) < 1e-5, "confusion matrix adds up")
    check(len(ev["layers"]) == 2 and all(x["entropy"] <= x["uniform_entropy"] + 1e-6 for x in ev["layers"]),
          "per-layer diagnostics")
rc, out = run("eval", "--ckpt", P("sm/last.safetensors"), "--split", "train", "--limit", "100")
check(rc == 0 and "100 samples" in out, "eval --split train --limit", out)
rc, out = run("eval", "--ckpt", P("sm/last.safetensors"), "--data", "mnist", "--data-dir", P("empty"))
check(rc == 1 and "scripts/data.sh mnist" in out, "eval on missing data", out)
rc, out = run("eval", "--ckpt", P("nope.safetensors"))
check(rc == 1 and "cannot open" in out, "eval: missing checkpoint", out)
rc, out = run("eval")
check(rc == 2, "eval without --ckpt is a usage error", out)
# corrupt and truncated checkpoints
raw = bytearray(open(P("sm/last.safetensors"), "rb").read())
raw[-100] ^= 1
open(P("corrupt.safetensors"), "wb").write(raw)
rc, out = run("eval", "--ckpt", P("corrupt.safetensors"))
check(rc == 1 and "checksum" in out, "corrupt checkpoint refused", out)
open(P("cut.safetensors"), "wb").write(raw[: len(raw) // 2])
rc, out = run("eval", "--ckpt", P("cut.safetensors"))
check(rc == 1 and ("truncated" in out or "does not fit" in out), "truncated checkpoint refused", out)
shutil.copytree(P("sm"), P("smc"))
shutil.copy(P("corrupt.safetensors"), P("smc/last.safetensors"))
rc, out = run("train", "--resume", P("smc"), "--epochs", "20")
check(rc == 1 and "checksum" in out, "resume from a corrupt checkpoint refused", out)

# ---- asap compile ----
rc, out = run("asap", "compile", "--ckpt", P("sk/last.safetensors"), "--out", P("asap.safetensors"), "--samples", "256")
check(rc == 0 and "LS R^2" in out and os.path.exists(P("asap.safetensors")), "asap compile", out)
rc, out = run("eval", "--ckpt", P("asap.safetensors"), "--json", P("asap.json"))
check(rc == 0 and "agreement" in out, "eval of the compiled model reports the agreement", out)
if rc == 0:
    a = json.load(open(P("asap.json")))
    check(a["attn"] == "asap" and a["agreement"] > 0.9 and a["accuracy"] > 0.8, "ASAP agrees with its teacher",
          str(a)[:300])
# the endings: eval --asap-ending changes the compiled model's (the loss differs, zero != row),
# compile --ending records one; bad values and a non-ASAP model are usage errors
rc, out = run("eval", "--ckpt", P("asap.safetensors"), "--asap-ending", "zero", "--json", P("asap0.json"))
rc2, out2 = run("asap", "compile", "--ckpt", P("sk/last.safetensors"), "--out", P("asap0.safetensors"),
                "--samples", "256", "--ending", "zero")
rc3, out3 = run("eval", "--ckpt", P("asap0.safetensors"), "--json", P("asap0b.json"))
if check(rc == 0 and rc2 == 0 and rc3 == 0, "eval --asap-ending zero; asap compile --ending zero", out + out2 + out3):
    a0, a0b = json.load(open(P("asap0.json"))), json.load(open(P("asap0b.json")))
    a = json.load(open(P("asap.json")))
    check(a0["loss"] != a["loss"] and a0["loss"] == a0b["loss"] and a0["accuracy"] == a0b["accuracy"],
          "ASAP-0 evaluates differently from the row ending; compiled with it = switched to it",
          "%s %s %s" % (a["loss"], a0["loss"], a0b["loss"]))
for args, what in ((["--ckpt", P("asap.safetensors"), "--asap-ending", "middle"], "auto|zero|column|row"),
                   (["--ckpt", P("sk/last.safetensors"), "--asap-ending", "zero"], "compiled ASAP")):
    rc, out = run("eval", *args)
    check(rc == 2 and what in out, "eval %s: usage error" % " ".join(args[2:]), out)
rc, out = run("asap", "compile", "--ckpt", P("sk/last.safetensors"), "--out", P("never.safetensors"),
              "--ending", "middle")
check(rc == 2 and "auto|zero|column|row" in out and not os.path.exists(P("never.safetensors")),
      "asap compile --ending middle: usage error", out)
rc, out = run("asap", "compile", "--ckpt", P("sm/last.safetensors"), "--out", P("never.safetensors"))
check(rc == 1 and "compiles Sinkhorn" in out and not os.path.exists(P("never.safetensors")),
      "asap compile refuses a softmax model", out)
# a teacher is the Sinkhorn model the ASAP model was compiled from: no model is its own teacher
rc, out = run("asap", "compile", "--ckpt", P("asap.safetensors"), "--out", P("never.safetensors"))
check(rc == 1 and "uses asap attention" in out and not os.path.exists(P("never.safetensors")),
      "asap compile of an ASAP model is refused, naming its attention", out)
shutil.copytree(P("sk"), P("skc"))
before = open(P("skc/last.safetensors"), "rb").read()
rc, out = run("asap", "compile", "--ckpt", P("skc/last.safetensors"), "--out", P("skc/last.safetensors"), "--samples", "64")
check(rc == 1 and "the teacher checkpoint itself" in out and open(P("skc/last.safetensors"), "rb").read() == before,
      "asap compile over its own teacher is refused (the teacher intact)", out)
for t, what in ((P("sm/last.safetensors"), "softmax attention"), (P("asap.safetensors"), "asap attention")):
    rc, out = run("eval", "--ckpt", P("asap.safetensors"), "--teacher", t)
    check(rc == 2 and what in out and "agreement" not in out, "eval --teacher with %s is refused" % what, out)
rc, out = run("eval", "--ckpt", P("sm/last.safetensors"), "--teacher", P("sk/last.safetensors"))
check(rc == 2 and "compiled ASAP model" in out, "eval --teacher of a model that is not ASAP is refused", out)
rc, out = run("asap", "compile", "--ckpt", P("skc/last.safetensors"), "--out", P("asapc.safetensors"), "--samples", "64")
shutil.copy(P("sk/ckpt/epoch-0001.safetensors"), P("skc/last.safetensors"))
rc2, out2 = run("eval", "--ckpt", P("asapc.safetensors"))
shutil.copy(P("asap.safetensors"), P("skc/last.safetensors"))
rc3, out3 = run("eval", "--ckpt", P("asapc.safetensors"))
check(rc == 0 and rc2 == 1 and "weights differ" in out2 and rc3 == 1 and "asap attention" in out3 and
      "agreement" not in out2 + out3, "eval: a recorded teacher replaced since the compilation is refused",
      out + out2 + out3)
raw = bytearray(open(P("asap.safetensors"), "rb").read())
i = raw.find(b"omega=")
raw[i + 8] ^= 1
open(P("asap-bad.safetensors"), "wb").write(raw)
rc, out = run("eval", "--ckpt", P("asap-bad.safetensors"))
check(rc == 1 and "checksum" in out, "the checksum covers the compiled layers", out)

# ---- plug-and-play swaps of a trained model's attention, and fine-tuning ----
for attn, keys in (("softmax", []), ("unbalanced", ["sk_rho=2"]), ("esp", ["--esp-soft", "0"]),
                   ("lot", ["lot_r=4"]), ("sinkhorn", ["--keys", "sk_iters=9,sk_eps=0.5"])):
    rc, out = run("model", "swap", "--in", P("sk/last.safetensors"), "--out", P(f"sw-{attn}.safetensors"),
                  "--attn", attn, *keys)
    check(rc == 0 and f"-> {attn}" in out, f"model swap sinkhorn -> {attn}", out)
    rc, out = run("eval", "--ckpt", P(f"sw-{attn}.safetensors"), "--json", P(f"sw-{attn}.json"))
    ok = rc == 0
    if ok:
        ev = json.load(open(P(f"sw-{attn}.json")))
        ok = ev["attn"] == attn and ev["n"] == 359 and 0 <= ev["accuracy"] <= 1
    check(ok, f"the swapped ({attn}) checkpoint evaluates (unadapted)", out[:400])
    # and back: the source's weights bit for bit (no optimiser state in either)
    rc, out = run("model", "swap", "--in", P(f"sw-{attn}.safetensors"), "--out", P(f"back-{attn}.safetensors"),
                  "--attn", "sinkhorn", "sk_iters=5", "sk_eps=1", "--blocks", "all")
    if attn == "softmax":
        ref = tensors(P("back-softmax.safetensors"))[0] if rc == 0 else None
    else:
        check(rc == 0 and tensors(P(f"back-{attn}.safetensors"))[0] == ref,
              f"swap {attn} -> sinkhorn gives the source's weights bitwise", out)
meta = tensors(P("sw-lot.safetensors"))[1]
raw = open(P("sw-lot.safetensors"), "rb").read()
names = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]]).keys()
check("blocks.1.attn.lot_z" in names and "attn=lot" in meta["config"] and
      "attn=lot" in meta["extra"] and "swapped_from=" in meta["extra"] and "optim" not in meta,
      "the swapped checkpoint: LOT pivots, its run's config follows, no optimiser state", str(meta)[:300])
rc, out = run("train", "--init", P("sw-lot.safetensors"), "--epochs", "2", "--lr", "2e-4", "--out", P("ft"),
              "--progress", "none")
ok = rc == 0 and os.path.exists(P("ft/summary.json"))
check(ok, "fine-tune a swapped checkpoint: train --init (the run's data and keys)", out)
if ok:
    check(tensors(P("ft/ckpt/epoch-0000.safetensors"))[0][:1000] == tensors(P("sw-lot.safetensors"))[0][:1000] and
          json.load(open(P("ft/summary.json")))["attn"] == "lot", "the fine-tuning run starts from the swapped weights")
rc, out = run("train", "--init", P("sk/last.safetensors"), "--attn", "softmax", "--epochs", "1", "--out", P("ft2"),
              "--progress", "none")
check(rc == 0 and json.load(open(P("ft2/summary.json")))["attn"] == "softmax",
      "train --init CKPT --attn softmax swaps on the way in", out)
rc, out = run("train", "--init", P("sk/last.safetensors"), "--dim", "32", "--out", P("ft3"), "--progress", "none")
check(rc == 2 and "dim differs" in out and not os.path.exists(P("ft3/last.safetensors")),
      "train --init with another architecture is refused", out)
for args, code, msg in (
        (["--attn", "magic"], 2, "attn=magic: not a model attention operator"), (["--attn", "softmax", "dim=32"], 2, "dim differs"),
        (["--attn", "softmax", "nope=1"], 2, "unknown key 'nope'"), (["--attn", "sinkhorn", "sk_iters=x"], 2, "sk_iters"),
        (["--attn", "softmax", "--blocks", "0"], 2, "share one attention kind"),
        (["--attn", "softmax", "--blocks", "0,x"], 2, "--blocks"), (["--attn", "softmax", "stray"], 2, "unexpected"),
        (["--attn", "asap", "sk_iters=3"], 2, "keys do not apply"), ([], 2, "--attn")):
    rc, out = run("model", "swap", "--in", P("sk/last.safetensors"), "--out", P("never.safetensors"), *args)
    check(rc == code and msg in out and not os.path.exists(P("never.safetensors")), f"model swap {args} refused", out)
rc, out = run("model", "swap", "--in", P("sm/last.safetensors"), "--out", P("never.safetensors"), "--attn", "asap")
check(rc == 2 and "swap to sinkhorn first" in out and not os.path.exists(P("never.safetensors")),
      "model swap to asap needs a Sinkhorn source (says how)", out)
rc, out = run("model", "swap", "--in", P("asap.safetensors"), "--out", P("never.safetensors"), "--attn", "asap")
check(rc == 2 and "a compiled ASAP model already" in out and "its teacher" in out and
      not os.path.exists(P("never.safetensors")), "model swap of an ASAP model to asap: refused, naming its teacher", out)
rc, out = run("model", "swap", "--in", P("nope.safetensors"), "--out", P("never.safetensors"), "--attn", "softmax")
check(rc == 1 and "cannot open" in out, "model swap: missing checkpoint", out)
rc, out = run("model", "swap", "--in", P("sk/last.safetensors"), "--out", P("asap2.safetensors"), "--attn", "asap",
              "--samples", "128")
check(rc == 0 and "ASAP layers compiled" in out, "model swap --attn asap compiles the Sinkhorn layers", out)
rc, out = run("eval", "--ckpt", P("asap2.safetensors"))
check(rc == 0 and "agreement" in out, "the swapped-to-asap model evaluates against its teacher", out)

# ---- ESP as ESPFormer trains it: SoftSort temperature annealing, hard evaluation ----
esp = ["--config", cfg, "--attn", "esp", "--esp-t", "0.1", "--esp-anneal", "0.8", "--eval-esp-sort", "hard",
       "--epochs", "3", "--progress", "none", "--dim", "32", "--depth", "1"]
rc, out = run("train", *esp, "--out", P("esp"))
check(rc == 0, "train ESP with --esp-anneal 0.8 --eval-esp-sort hard", out)
if rc == 0:
    ep = [json.loads(x) for x in open(P("esp/metrics.jsonl")) if '"type":"epoch"' in x]
    check([e["esp_t"] for e in ep] == [float("%.9g" % (0.1 * 0.8 ** k)) for k in range(3)] or
          all(abs(e["esp_t"] - 0.1 * 0.8 ** k) < 1e-8 for k, e in enumerate(ep)),
          "esp_t per epoch: t0 0.8^epoch", str([e["esp_t"] for e in ep]))
    check(all(e["attn_col_dev"] < 1e-5 and e["attn_row_dev"] < 1e-5 for e in ep),
          "hard evaluation: exactly doubly stochastic attention every epoch", str(ep[-1]))
    rc, out = run("train", *esp, "--out", P("esp-cut"), "--stop-after", "60")
    rc2, out2 = run("train", "--resume", P("esp-cut"), "--threads", "1")
    check(rc == 130 and rc2 == 0 and tensors(P("esp/last.safetensors"))[0] == tensors(P("esp-cut/last.safetensors"))[0]
          and strip_times(P("esp/metrics.jsonl")) == strip_times(P("esp-cut/metrics.jsonl")),
          "annealing resumed mid-epoch == uninterrupted (same t, weights, records)", out + out2)
    rc, out = run("eval", "--ckpt", P("esp/last.safetensors"), "--json", P("esp-hard.json"))
    rc2, out2 = run("eval", "--ckpt", P("esp/last.safetensors"), "--esp-sort", "soft", "--json", P("esp-soft.json"))
    ok = rc == 0 and rc2 == 0
    if ok:
        h, so = json.load(open(P("esp-hard.json"))), json.load(open(P("esp-soft.json")))
        ok = (h["esp_sort"] == "hard" and so["esp_sort"] == "soft" and abs(h["esp_t"] - 0.1 * 0.8 ** 2) < 1e-8 and
              max(x["col_dev"] for x in h["layers"]) < 1e-5 and
              max(x["col_dev"] for x in so["layers"]) > max(x["col_dev"] for x in h["layers"]))
    check(ok, "eval: the run's eval_esp_sort (hard) by default, --esp-sort soft on request", out + out2)
    rc, out = run("eval", "--ckpt", P("esp/last.safetensors"), "--esp-hard")
    check(rc == 0 and "hard sort" in out, "eval --esp-hard", out)
rc, out = run("eval", "--ckpt", P("sm/last.safetensors"), "--esp-hard")
check(rc == 2 and "ESP's sort" in out, "eval --esp-hard of a softmax model is refused", out)
rc, out = run("train", "--config", cfg, "--esp-anneal", "0.8", "--out", P("never"))
check(rc == 2 and "esp_anneal" in out, "--esp-anneal on a softmax run is refused", out)

# ---- interrupted runs resume exactly ----
common = ["--config", cfg, "--epochs", "3", "--dropout", "0.1", "--micro", "20", "--progress", "none"]
rc, out = run("train", *common, "--out", P("full"))
check(rc == 0, "uninterrupted reference run", out)
rc, out = run("train", *common, "--out", P("cut"), "--stop-after", "50")
check(rc == 130 and "--resume" in out, "stop_after stops like Ctrl-C (status 130)", out)
rc, out = run("train", "--resume", P("cut"), "--stop-after", "100", "--threads", "1")
check(rc == 130, "a second interruption (one thread)", out)
rc, out = run("train", "--resume", P("cut"))
check(rc == 0, "resume to the end", out)
if rc == 0:
    check(tensors(P("full/last.safetensors"))[0] == tensors(P("cut/last.safetensors"))[0],
          "resumed weights and optimiser state == uninterrupted, bitwise")
    for f in ("metrics.jsonl", "steps.csv", "epochs.csv"):
        check(strip_times(P("full/" + f)) == strip_times(P("cut/" + f)), f"resumed {f} == uninterrupted")
# a real SIGINT
e = dict(os.environ, BK_DATA=DATA)
p = subprocess.Popen([BK, "train", *common, "--out", P("sig")], cwd=tmp, env=e, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)
t0 = time.time()
while time.time() - t0 < 60 and not os.path.exists(P("sig/steps.csv")):
    time.sleep(0.05)
while time.time() - t0 < 60 and sum(1 for _ in open(P("sig/steps.csv"))) < 5:
    time.sleep(0.05)
p.send_signal(signal.SIGINT)
outp = p.communicate(timeout=60)[0]
if p.returncode == 0:
    print("note: the SIGINT arrived after the run finished; the test is inconclusive")
else:
    check(p.returncode == 130 and "stopped at" in outp, "Ctrl-C saves and exits with 130", outp)
    rc, out = run("train", "--resume", P("sig"))
    check(rc == 0 and tensors(P("full/last.safetensors"))[0] == tensors(P("sig/last.safetensors"))[0],
          "resume after Ctrl-C == uninterrupted", out)

# ---- bad flags ----
for args, code, msg in (
        (["--nope", "1"], 2, "unknown key"), (["--epochs", "0"], 2, "epochs"), (["--lr", "abc"], 2, "lr"),
        (["--attn", "magic"], 2, "attn"), (["--data", "cifar"], 2, "unknown dataset"), (["--set", "x"], 2, "KEY=VALUE"),
        (["--attn", "asap"], 2, "asap compile"), (["--heads", "3"], 2, "heads"), (["--epochs"], 2, "needs a value"),
        (["stray"], 2, "unexpected")):
    rc, out = run("train", "--data", "digits", "--out", P("never"), *args)
    check(rc == code and msg in out and not os.path.exists(P("never/last.safetensors")), f"train {args}", out)
rc, out = run("train", "--config", P("nope.conf"))
check(rc == 2 and "cannot open" in out, "missing config file", out)
open(P("bad.conf"), "w").write("data = digits\nepochs 3\n")
rc, out = run("train", "--config", P("bad.conf"))
check(rc == 2 and "bad.conf:2" in out, "config file error names the line", out)
rc, out = run("train", "--config", cfg, "--out", P("sm"))
check(rc == 2 and "--resume" in out, "an existing run is not overwritten without --force", out)
rc, out = run("train", "--resume", P("sm"))
check(rc == 1 and "finished" in out, "resuming a finished run says how to extend it", out)
rc, out = run("train", "--resume", P("sm"), "--lr", "1")
check(rc == 2 and "keeps its configuration" in out, "a resumed run keeps its configuration", out)
# extending a finished cosine run (15 epochs of 45 steps): not at lr_min = 0; refused, or re-planned on request
shutil.copytree(P("sm"), P("smx"))
before = open(P("smx/last.safetensors"), "rb").read()
rc, out = run("train", "--resume", P("smx"), "--epochs", "16")
check(rc == 2 and "ends at step 675" in out and "total_steps=N (N >= 720" in out and "init=" in out and
      open(P("smx/last.safetensors"), "rb").read() == before and not os.path.exists(P("smx/ckpt/epoch-0016.safetensors")),
      "extending a cosine run past its end is refused, saying how to continue; the run untouched", out)
rc, out = run("train", "--resume", P("smx"), "--epochs", "16", "--total-steps", "0", "--progress", "none")
if check(rc == 0, "train --resume --epochs 16 --total-steps 0 re-plans the cosine over the extended run", out):
    rows = [r.split(",") for r in open(P("smx/steps.csv")).read().split("\n")[1:] if r]
    check(len(rows) == 720 and all(float(r[5]) > 0 for r in rows[675:]) and
          tensors(P("smx/last.safetensors"))[0] != tensors(P("sm/last.safetensors"))[0],
          "the extension trains (lr > 0 in every added step, weights changed)", str(rows[675:677]))
rc, out = run("train", "--resume", P("smx"), "--epochs", "17", "--total-steps", "700")
check(rc == 2 and "must end after the current step 720" in out, "a re-plan that has already ended is refused", out)
rc, out = run("train", "--resume", P("nodir"))
check(rc == 1 and "no checkpoint" in out, "resume of a missing run", out)
rc, out = run("train", "--resume", P("sm"), "--out", P("x"))
check(rc == 2, "--resume with --out is a usage error", out)

# ---- generated data: tokens and point clouds train ----
rc, out = run("train", "--data", "listops", "--seq-len", "48", "--gen-train", "256", "--gen-test", "64", "--epochs", "1",
              "--dim", "32", "--depth", "1", "--pool", "mean", "--out", P("lo"), "--progress", "none")
check(rc == 0 and os.path.exists(P("lo/summary.json")), "train on ListOps (tokens, padded)", out)
rc, out = run("train", "--data", "shapes", "--points", "32", "--gen-train", "128", "--gen-test", "32", "--epochs", "1",
              "--dim", "32", "--depth", "1", "--cls", "0", "--pool", "mean", "--attn", "esp", "--out", P("sh"),
              "--progress", "none")
check(rc == 0 and os.path.exists(P("sh/summary.json")), "train on shapes (point clouds, ESP)", out)

# ---- model selection (issue 43): the default valid_frac, best.safetensors, the test split once ----
rc, out = run("train", "--config", cfg, "--out", P("va"), "--epochs", "4", "--patience", "3", "--progress", "plain")
vs = json.load(open(P("va/summary.json"))) if rc == 0 else {}
check(rc == 0 and os.path.exists(P("va/best.safetensors")) and 1 <= vs.get("best_epoch", 0) <= 4 and
      vs.get("select") == "acc" and "test_acc" in vs and "best_valid_acc" in vs and vs.get("early_stopped") is False,
      "train with a validation split: best.safetensors and the best epoch's test figures in summary.json", str(vs))
check(f"best epoch {vs.get('best_epoch')}" in out and "test accuracy" in out and "valid loss" in out and
      "test (the best epoch" in out, "train: the epochs show the validation split; the last line the best epoch", out[-600:])
if rc == 0:
    recs = [json.loads(x) for x in open(P("va/metrics.jsonl"))]
    ep = [x for x in recs if x["type"] == "epoch"]
    te = [x for x in recs if x["type"] == "test"]
    best = max(range(len(ep)), key=lambda i: (ep[i]["valid_acc"], -i)) + 1
    check(len(ep) == 4 and all("valid_acc" in x and "test_acc" not in x for x in ep) and len(te) == 1 and
          te[0]["best_epoch"] == best == vs["best_epoch"] and abs(te[0]["test_acc"] - vs["test_acc"]) < 1e-6,
          "metrics: valid_* each epoch, one test record for the first best epoch", str(te))
    rc, out = run("eval", "--ckpt", P("va/best.safetensors"), "--json", P("evb.json"))
    evb = json.load(open(P("evb.json"))) if rc == 0 else {}
    check(rc == 0 and abs(evb.get("accuracy", -1) - vs["test_acc"]) < 1e-6,
          "eval of best.safetensors = the run's test figures", out[-300:])
    rc, out = run("eval", "--ckpt", P("va/best.safetensors"), "--split", "valid")
    check(rc == 0 and f"{100 * vs['best_valid_acc']:.2f}" in out, "eval --split valid = the best epoch's validation accuracy",
          out[-300:])
    rc, out = run("plot", "curves", "--run", P("va"), "--run", P("sm"), "--out", P("va.svg"))
    check(rc == 0 and os.path.getsize(P("va.svg")) > 1000 and "warning" not in out,
          "plot curves: the validation curve of a run with one (its test record is no stray line)", out)
    rc, out = run("train", "--resume", P("va"), "--epochs", "5")
    check(rc == 2 and "total_steps" in out, "extending a cosine run asks for a re-planned total_steps", out[-300:])

# ---- plots ----
for ext in ("png", "svg"):
    figs = [("curves", ["--run", P("sm"), "--run", P("sk")]),
            ("attention", ["--ckpt", P("sm/last.safetensors"), "--ckpt", P("sk/last.safetensors"), "--index", "2"]),
            ("colsums", ["--run", P("sm"), "--run", P("sk")]),
            ("transport", ["--n", "8"])]
    for fig, args in figs:
        f = P(f"{fig}.{ext}")
        rc, out = run("plot", fig, *args, "--out", f)
        ok = rc == 0 and os.path.exists(f)
        if ok:
            head = open(f, "rb").read(8)
            ok = head == b"\x89PNG\r\n\x1a\n" if ext == "png" else head.startswith(b"<?xml") or head.startswith(b"<svg")
        check(ok, f"plot {fig} .{ext}", out)
rc, out = run("plot", "curves", "--run", P("sm"), "--out", P("x.jpg"))
check(rc == 1 and "extension" in out and not os.path.exists(P("x.jpg")), "plot: unsupported extension", out)
rc, out = run("plot", "curves", "--run", P("empty"), "--out", P("x.png"))
check(rc == 1 and "metrics.jsonl" in out, "plot curves: not a run directory", out)
rc, out = run("plot", "attention", "--ckpt", P("lo/last.safetensors"), "--out", P("x.png"))
check(rc == 1 and "image model" in out, "plot attention needs an image model", out)
rc, out = run("plot", "colsums", "--run", P("sm"), "--epochs", "99", "--out", P("x.png"))
check(rc == 1 and "epoch 99" in out, "plot colsums: missing epoch", out)
rc, out = run("plot", "nope")
check(rc == 2, "plot: unknown figure", out)

# ---- text inputs (issue 41): endless, non-text and damaged config and metrics files ----


def bounded(*args, limit=60):
    """run with a time limit: a reader that never stops fails the check instead of hanging the suite"""
    try:
        return run(*args, timeout=limit)
    except subprocess.TimeoutExpired:
        return None, "timed out after %d s" % limit


rc, out = bounded("train", "--config", "/dev/zero", "--out", P("never"))
check(rc == 2 and "/dev/zero: line 1 holds a NUL byte" in out, "train --config /dev/zero stops at once", out)
os.makedirs(P("cfgdir"), exist_ok=True)
rc, out = bounded("train", "--config", P("cfgdir"), "--out", P("never"), "--epochs", "1")
check(rc == 2 and "cfgdir: is a directory" in out and not os.path.exists(P("never")),
      "train --config DIR is refused (not trained with the defaults)", out)
open(P("nul.conf"), "wb").write(b"data = digits\nepochs = 1\0 # the rest: epochs = 99\n")
rc, out = bounded("train", "--config", P("nul.conf"), "--out", P("never"))
check(rc == 2 and "nul.conf: line 2 holds a NUL byte" in out and not os.path.exists(P("never")),
      "a NUL byte in a config line is refused (not the line cut short)", out)
open(P("long.conf"), "w").write("data = digits\n# " + "x" * 5000 + "\n")
rc, out = bounded("train", "--config", P("long.conf"), "--out", P("never"))
check(rc == 2 and "long.conf: line 2 is longer than 4096 bytes (the limit)" in out, "a config line over 4096 bytes", out)
open(P("big.conf"), "w").write("# comment\n" * 120000)
rc, out = bounded("train", "--config", P("big.conf"), "--out", P("never"))
check(rc == 2 and "more than 1048576 bytes (the limit)" in out, "a config file over 1 MiB", out)
# a stream is read: /dev/stdin from a pipe (a bad key names the stream and line)
p = subprocess.run([BK, "train", "--config", "/dev/stdin", "--out", P("never")], input="data = digits\nnope = 1\n",
                   capture_output=True, text=True, timeout=60, cwd=tmp)
check(p.returncode == 2 and "/dev/stdin:2: unknown key 'nope'" in p.stderr, "a config from a pipe is read", p.stderr)
# with init=CKPT the config is read twice: a pipe (empty the second time: its keys lost) is refused
p = subprocess.run([BK, "train", "--config", "/dev/stdin", "--out", P("never"), "--progress", "none"],
                   input="init = %s\nepochs = 1\n" % P("sm/last.safetensors"), capture_output=True, text=True,
                   timeout=600, cwd=tmp, env=dict(os.environ, BK_DATA=DATA))
check(p.returncode == 2 and "read twice" in p.stderr and not os.path.exists(P("never")),
      "init=CKPT from a piped config is refused (not trained without its keys)", p.stderr)

# plot curves: no records (empty, random bytes, endless) refused; lines that are not records skipped with a warning
for name, data in (("empty", b""), ("random", bytes(range(256)) * 8 + b"\x00\xff\n\x01")):
    os.makedirs(P("m-" + name), exist_ok=True)
    open(P("m-%s/metrics.jsonl" % name), "wb").write(data)
    rc, out = bounded("plot", "curves", "--run", P("m-" + name), "--out", P("m.png"))
    check(rc == 1 and "m-%s/metrics.jsonl: no records" % name in out and not os.path.exists(P("m.png")),
          "plot curves refuses a metrics.jsonl without records (%s)" % name, out)
os.makedirs(P("m-zero"), exist_ok=True)
if not os.path.lexists(P("m-zero/metrics.jsonl")):
    os.symlink("/dev/zero", P("m-zero/metrics.jsonl"))
rc, out = bounded("plot", "curves", "--run", P("m-zero"), "--out", P("m.png"))
check(rc == 1 and "line 1 is longer than 1048576 bytes (the limit)" in out and not os.path.exists(P("m.png")),
      "plot curves on an endless metrics.jsonl stops", out)
os.makedirs(P("m-part"), exist_ok=True)
good = open(P("sm/metrics.jsonl")).read().split("\n")
open(P("m-part/metrics.jsonl"), "w").write("\n".join(good[:5] + ["garbage", "{\"type\":\"step\",\"step\":"] + good[5:20]))
rc, out = bounded("plot", "curves", "--run", P("m-part"), "--out", P("m.png"))
check(rc == 0 and os.path.exists(P("m.png")) and "warning" in out and
      "m-part/metrics.jsonl: 2 of its 22 lines are not records (the first: line 6)" in out,
      "plot curves skips the lines that are not records, with a warning naming them", out)

# resume after metrics.jsonl lost records before the checkpoint: a warning with the file and the missing range
quick = ["--config", cfg, "--epochs", "2", "--progress", "none", "--log-every", "5"]
rc, out = run("train", *quick, "--out", P("gap"), "--stop-after", "60")
if check(rc == 130, "a run to cut (stopped at step 60)", out):
    recs = open(P("gap/metrics.jsonl")).read().split("\n")
    steps = [r for r in recs if '"type":"step"' in r]
    # keep the step records of steps 5..20 and the first epoch record, cut the rest
    keep = [r for r in recs if r and ('"type":"epoch"' in r or int(json.loads(r)["step"]) <= 20)]
    open(P("gap/metrics.jsonl"), "w").write("\n".join(keep) + "\n")
    rc, out = run("train", "--resume", P("gap"), "--stop-after", "70")
    check(rc == 130 and "warning" in out and "gap/metrics.jsonl: 8 step records before the checkpoint's step 60 are "
          "missing (the first: steps 25-60, logged every 5" in out,
          "resume names the step records missing from a cut metrics.jsonl", out)
    after = [json.loads(r)["step"] for r in open(P("gap/metrics.jsonl")) if '"type":"step"' in r]
    check(after == [5, 10, 15, 20, 65, 70] and len(steps) == 12, "the gap stays; the run goes on", str(after))
    rc, out = run("train", "--resume", P("gap"), "--stop-after", "75")
    check(rc == 130 and "gap/metrics.jsonl: 8 step records" in out, "the gap is named again on the next resume", out)

status = check.summary()
shutil.rmtree(tmp, ignore_errors=True)
sys.exit(status)
