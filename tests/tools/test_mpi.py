#!/usr/bin/python3
"""`birkhoff train` under mpirun (Open MPI on loopback): data-parallel
training across processes (docs/TRAINING.md, "Several processes").

Usage: /usr/bin/python3 tests/tools/test_mpi.py build/birkhoff

Checks, on the generated shapes set with dropout 0.1 (so the dropout
counters of the chunks matter):
* 2 processes compute what one process with micro = batch / 2 computes:
  every step's loss within 1e-5 (relative), the final weights within 1e-4
  (max |diff| / max |w|), and not bitwise equal (the gradient really was
  summed across processes);
* 2 processes again, with 2 threads each instead of 1: bitwise the same
  weights, optimiser state and metrics (but the timings);
* 3 processes with micro 0 (chunks of ceil(32 / 3) = 11) = one process with
  micro 11, within the same tolerances;
* stopped after 5 steps (status 130) and resumed on 2 processes: bitwise the
  uninterrupted 2-process run;
* a process given another lr (mpirun's MPMD form) is refused by every
  process with a message naming the rank and the key, status non-zero, and
  nothing hangs; no run directory is left;
* a process that fails before training -- a bad flag on rank 1 only, a
  config file missing on rank 0 only, --help on rank 1 only (wrapper scripts
  reading OMPI_COMM_WORLD_RANK) -- stops every process: all exit within the
  timeout (a hang fails the check, it does not hang the suite), status
  non-zero, rank 0 naming the rank, no run directory;
* the run directory is a normal run's (rank 0 alone writes: no temporary
  files left, summary.json says ranks 2).
Skips (loudly, status 0) when mpirun is missing or the CLI was built
without MPI, unless BK_REQUIRE_MPI=1.
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

import numpy as np

CLI = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/birkhoff")
passed = failed = 0


def check(ok, name, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print("ok - " + name)
    else:
        failed += 1
        print("not ok - " + name + (": " + str(detail)[-1500:] if detail else ""))
    return ok


def skip(why):
    if os.environ.get("BK_REQUIRE_MPI") == "1":
        print("not ok - MPI required (BK_REQUIRE_MPI=1): " + why)
        sys.exit(1)
    print("# SKIP mpi: " + why)
    sys.exit(0)


MPIRUN = shutil.which("mpirun")
if not MPIRUN:
    skip("mpirun not found (Debian: openmpi-bin)")
helptext = subprocess.run([CLI, "train", "--help"], capture_output=True, text=True).stdout
if "This build: with MPI" not in helptext:
    skip("this birkhoff was built without MPI (Debian: libopenmpi-dev, then make)")

ENV = dict(os.environ)
# root in containers and CI; more processes than cores; no ptrace-based
# single copy between processes (not allowed in most containers)
ENV.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")
BASE = ["--data", "shapes", "--gen_train", "320", "--gen_test", "64", "--points", "32", "--epochs", "2",
        "--batch", "32", "--dim", "16", "--depth", "1", "--heads", "2", "--mlp_dim", "32", "--attn", "sinkhorn",
        "--sk_iters", "3", "--dropout", "0.1", "--progress", "none", "--threads", "1"]


def mpirun(n, args, timeout=120):
    cmd = [MPIRUN, "--oversubscribe", "-np", str(n), CLI, "train"] + args
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def mpirun_wrapped(n, rank, extra, args, timeout=60):
    """n processes of `birkhoff train ARGS`, rank `rank` with EXTRA appended
    (a wrapper script); a hang is reported as status 124"""
    w = P("wrap-%d.sh" % rank)
    with open(w, "w") as f:
        f.write('#!/bin/sh\nif [ "$OMPI_COMM_WORLD_RANK" = "%d" ]; then exec "%s" train "$@" %s; fi\nexec "%s" train "$@"\n'
                % (rank, CLI, " ".join("'%s'" % x for x in extra), CLI))
    os.chmod(w, 0o755)
    p = subprocess.Popen([MPIRUN, "--oversubscribe", "-np", str(n), w] + args, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=ENV, start_new_session=True)
    try:
        out = p.communicate(timeout=timeout)[0]
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # mpirun and every process it started
        return 124, "timed out after %d s (a process left waiting): %s" % (timeout, p.communicate()[0])


def single(args):
    r = subprocess.run([CLI, "train"] + args, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def tensors(path):
    """the tensors of a safetensors checkpoint: name -> (raw bytes, float array or None)"""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        data = raw[8 + n + a:8 + n + b]
        out[k] = (data, np.frombuffer(data, np.float32) if v["dtype"] == "F32" else None)
    return out


def weight_err(a, b):
    ta, tb = tensors(a), tensors(b)
    if sorted(ta) != sorted(tb):
        return float("inf")
    num = den = 0.0
    for k, (_, x) in ta.items():
        if x is None or k.startswith("optim."):
            continue
        y = tb[k][1]
        num = max(num, float(np.max(np.abs(x.astype(np.float64) - y))))
        den = max(den, float(np.max(np.abs(x))))
    return num / den


def same_bits(a, b):
    ta, tb = tensors(a), tensors(b)
    return sorted(ta) == sorted(tb) and all(ta[k][0] == tb[k][0] for k in ta)


def losses(d):
    rows = open(os.path.join(d, "steps.csv")).read().split("\n")[1:]
    return [float(r.split(",")[3]) for r in rows if r]


def metrics_no_times(d, name):
    """a metrics CSV without its timing columns (samples_per_s, time_s)"""
    lines = open(os.path.join(d, name)).read().split("\n")
    head = lines[0].split(",")
    keep = [i for i, h in enumerate(head) if h not in ("samples_per_s", "time_s")]
    return [[c for i, c in enumerate(l.split(",")) if i in keep] for l in lines if l]


def close_runs(a, b, what):
    la, lb = losses(a), losses(b)
    lerr = max(abs(x - y) / abs(y) for x, y in zip(la, lb)) if la and len(la) == len(lb) else float("inf")
    werr = weight_err(os.path.join(a, "last.safetensors"), os.path.join(b, "last.safetensors"))
    check(lerr <= 1e-5 and werr <= 1e-4 and werr > 0,
          "%s: every step's loss and the final weights = the one-process run's up to rounding" % what,
          "max loss rel err %.3g over %d steps (tol 1e-5), weight err %.3g (tol 1e-4; 0: no reduction)"
          % (lerr, len(la), werr))
    print("#   %s: max step-loss rel err %.2e, final weight err %.2e" % (what, lerr, werr))


tmp = tempfile.mkdtemp(prefix="bk-test-mpi-")
P = lambda *p: os.path.join(tmp, *p)  # noqa: E731
try:
    rc, out = single(BASE + ["--micro", "16", "--out", P("one16")])
    check(rc == 0, "one process, micro 16", out)
    rc, out = mpirun(2, BASE + ["--out", P("two"), "--progress", "plain"])
    check(rc == 0 and "x 2 processes (MPI)" in out, "mpirun -np 2 birkhoff train", out)
    if rc == 0:
        close_runs(P("two"), P("one16"), "2 processes")
        s = json.load(open(P("two", "summary.json")))
        check(s.get("ranks") == 2 and s.get("steps") == 18 and s.get("best_epoch") in (1, 2),
              "summary.json: ranks 2, 18 steps (288 training samples: 32 of 320 held out for validation), a best epoch", s)
        left = [f for _, _, fs in os.walk(P("two")) for f in fs if ".tmp" in f]
        check(not left, "no temporary file left in the run directory", left)

    rc, out = mpirun(2, BASE[:-2] + ["--threads", "2", "--out", P("two-b")])
    check(rc == 0 and same_bits(P("two", "last.safetensors"), P("two-b", "last.safetensors"))
          and metrics_no_times(P("two"), "steps.csv") == metrics_no_times(P("two-b"), "steps.csv")
          and metrics_no_times(P("two"), "epochs.csv") == metrics_no_times(P("two-b"), "epochs.csv"),
          "2 processes again with 2 threads each: bitwise the same weights, state and metrics", out)

    rc, out = mpirun(3, BASE + ["--micro", "0", "--out", P("three")])
    rc1, out1 = single(BASE + ["--micro", "11", "--out", P("one11")])
    if check(rc == 0 and rc1 == 0, "3 processes (micro 0) and one process with micro 11", out + out1):
        close_runs(P("three"), P("one11"), "3 processes")

    rc, out = mpirun(2, BASE + ["--out", P("cut"), "--stop-after", "5"])
    check(rc == 130 and "--resume" in out, "2 processes stopped after 5 steps: status 130", out)
    rc, out = mpirun(2, ["--resume", P("cut"), "--progress", "none"])
    check(rc == 0 and same_bits(P("cut", "last.safetensors"), P("two", "last.safetensors"))
          and metrics_no_times(P("cut"), "steps.csv") == metrics_no_times(P("two"), "steps.csv"),
          "resumed on 2 processes: bitwise the uninterrupted run (weights, state, metrics)", out)

    cmd = [MPIRUN, "--oversubscribe", "-np", "1", CLI, "train"] + BASE + ["--out", P("bad")] + \
          [":", "-np", "1", CLI, "train"] + BASE + ["--out", P("bad"), "--lr", "0.003"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
    out = r.stdout + r.stderr
    check(r.returncode != 0 and "rank 1's configuration differs" in out and "lr=" in out
          and "[rank 0]" in out and "[rank 1]" in out,
          "a process with another lr: refused by both, naming rank 1 and the key", out)
    check(not os.path.exists(P("bad")), "the refused configuration left no run directory", str(os.listdir(tmp)))

    # a process that fails before training stops them all (no hang, nothing written)
    for n, rank, extra, what, name in (
            (2, 1, ["--nope", "1"], "unknown key 'nope'", "a bad flag on rank 1"),
            (3, 0, ["--config", P("missing.conf")], "missing.conf: cannot open", "a config file missing on rank 0"),
            (3, 2, ["--help"], "usage: birkhoff train", "--help on rank 2 only")):
        out_dir = P("early-%d" % rank)
        rc, out = mpirun_wrapped(n, rank, extra, BASE + ["--out", out_dir])
        check(rc not in (0, 124) and what in out and
              ("rank %d stopped before training" % rank in out or rank == 0) and not os.path.exists(out_dir),
              "%s: every process stops at once (status %d), nothing written" % (name, rc), out)
finally:
    shutil.rmtree(tmp, ignore_errors=True)

print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
