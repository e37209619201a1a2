#!/usr/bin/python3
"""Throughput of `birkhoff train` against the number of processes (data
parallel under Open MPI, docs/TRAINING.md "Several processes").

Usage:
  /usr/bin/python3 bench/mpi_scaling.py [--cli build/birkhoff] [--config configs/mnist.conf]
      [--attn sinkhorn] [--limit 3072] [--reps 3] [--layouts 1x1,1x2,2x1,3x1] [--json OUT]

Each layout PxT runs P processes of T threads each (1xT: one process, no
mpirun) for one epoch on the first --limit training images (MNIST, which
scripts/data.sh fetches), the model of --config with --attn. Throughput is
the steady-state training rate from the run's own step records: samples
between the second step and the last over the training time between them
(time_s: evaluation, start-up and checkpoints are not counted); the median
of --reps runs is printed with the spread (min-max), and the speed-up
against 1x1. On a machine with C cores, layouts with P T > C oversubscribe
it (reported, not hidden). Also checks that every layout reached the same
loss curve as 1x1 within 1e-4 relative per step (the data-parallel runs
use micro = batch / P chunks, the one-process runs micro = 0: the same
samples in each step).
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--cli", default="build/birkhoff")
ap.add_argument("--config", default="configs/mnist.conf")
ap.add_argument("--attn", default="sinkhorn")
ap.add_argument("--limit", type=int, default=3072)
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--layouts", default="1x1,1x2,2x1,3x1")
ap.add_argument("--json")
a = ap.parse_args()

ENV = dict(os.environ)
ENV.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none")


def cpu_name():
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run(P, T, out):
    args = [os.path.abspath(a.cli), "train", "--config", a.config, "--attn", a.attn, "--epochs", "1",
            "--train_limit", str(a.limit), "--test_limit", "256", "--warmup", "2", "--threads", str(T), "--progress", "none",
            "--out", out, "--force"]
    if P > 1:
        # one core per process when they fit, else no binding
        bind = ["--bind-to", "none"] if P * T > os.cpu_count() or T > 1 else ["--bind-to", "core"]
        args = ["mpirun", "--oversubscribe"] + bind + ["-np", str(P)] + args
    r = subprocess.run(args, capture_output=True, text=True, env=ENV)
    if r.returncode:
        sys.exit("failed: %s\n%s" % (" ".join(args), r.stdout + r.stderr))
    rows = [l.split(",") for l in open(os.path.join(out, "steps.csv")).read().split("\n")[1:] if l]
    batch = int([l.split("=")[1] for l in open(os.path.join(out, "config.txt")) if l.startswith("batch=")][0])
    t = [float(r[8]) for r in rows]
    loss = [float(r[3]) for r in rows]
    n = (len(rows) - 2) * batch  # steps 3.. (the last may be short: its samples)
    last_b = a.limit - (len(rows) - 1) * batch
    n += last_b - batch
    return n / (t[-1] - t[1]), loss


layouts = [tuple(int(x) for x in s.split("x")) for s in a.layouts.split(",")]
tmp = tempfile.mkdtemp(prefix="bk-mpi-bench-")
res = {}
try:
    for P, T in layouts:
        rates, curve = [], None
        for k in range(a.reps):
            rate, loss = run(P, T, os.path.join(tmp, "%dx%d-%d" % (P, T, k)))
            rates.append(rate)
            curve = loss
        res["%dx%d" % (P, T)] = {"P": P, "T": T, "median": statistics.median(rates), "min": min(rates),
                                 "max": max(rates), "loss": curve}
finally:
    shutil.rmtree(tmp, ignore_errors=True)

base = res.get("1x1")
print("birkhoff train, %s, %s attention, %d images x 1 epoch; %s, %d CPUs"
      % (a.config, a.attn, a.limit, cpu_name(), os.cpu_count()))
print("%-7s %14s %20s %9s %14s" % ("PxT", "samples/s", "spread (min-max)", "speed-up", "loss vs 1x1"))
ok = True
for key, v in res.items():
    dev = max(abs(x - y) / abs(y) for x, y in zip(v["loss"], base["loss"])) if base else float("nan")
    ok = ok and dev <= 1e-4
    note = " (oversubscribed)" if v["P"] * v["T"] > os.cpu_count() else ""
    print("%-7s %14.1f %9.1f - %8.1f %8.2fx %14.1e%s" % (key, v["median"], v["min"], v["max"],
                                                       v["median"] / base["median"] if base else float("nan"),
                                                       dev, note))
if a.json:
    for v in res.values():
        v.pop("loss")
    json.dump({"cpu": cpu_name(), "cpus": os.cpu_count(), "config": a.config, "attn": a.attn, "limit": a.limit,
               "reps": a.reps, "layouts": res}, open(a.json, "w"), indent=1)
sys.exit(0 if ok else 1)
