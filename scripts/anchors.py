#!/usr/bin/env python3
"""The anchors users compare birkhoff against, measured side by side (issue 44).

One process, one thread count, one run: birkhoff (the C library through its
numpy bindings, python/birkhoff/ops.py; the training step through the CLI's
`birkhoff bench --op train`) and its PyTorch/POT anchors are timed in
interleaved rounds (round r calls every contender once, in an order rotated
from round to round), and the medians and quartiles over the rounds are
reported, with the versions of everything that ran.

  build/venv-torch2/bin/python scripts/anchors.py [--threads 2] [--reps 15] [--load 2]
                                [--only softmax,sinkhorn,pot,train] [--json FILE]

Run it under a Python that has torch >= 2 (the torch 2.13 venv that `make
check` makes, or any venv with torch==2.13.0), numpy, and for the POT
section `pot` (pip install pot). birkhoff is imported from this source tree
(python/, build/libbirkhoff.so unless BIRKHOFF_LIB says otherwise).

birkhoff is timed twice in softmax and sinkhorn: "birkhoff" is the numpy
bindings in this process (what a Python caller gets; on the CPU the library
allocates its workspace on every call), "birkhoff CLI bench" is `birkhoff
bench --no-peer` on the case, run as a child each round, its own median of 3
repetitions counted (a workspace allocated once, outside the timed region).

Sections (forward = under torch.no_grad / without a tape; f+b = forward
with autograd / a tape, then the backward with a fixed N(0,1) dout):
  softmax   B*H = 8, N = 1024, d = 64 and B*H = 1, N = 4096, d = 64:
            birkhoff softmax | F.scaled_dot_product_attention (the CPU
            kernel it chose is named, from torch.profiler's aten ops) |
            eager math (softmax(q k^T / sqrt d) v) | the same math under
            torch.compile.
  sinkhorn  B*H = 8, N = 1024, d = 64, S = 5 half-steps, eps = 1:
            birkhoff sinkhorn | the reference port (birkhoff._port_sinkformer,
            the Sinkformer loop with its increment update and early-stop
            check) eager | the same port under torch.compile (default mode;
            its .item() early-stop check breaks the graph once per row step).
  pot       the transport plan alone, per head of the same scores, cost
            M = -q k^T / sqrt(d), eps = reg = 1, uniform marginals:
            POT's ot.sinkhorn(a, b, M, reg, method="sinkhorn_log") (one call
            per head: POT's batched form shares M, these heads do not) with
            numItermax = S/2 iterations (POT's iteration is a column and a
            row half-step) and stopThr = 0, against birkhoff's sinkhorn with
            S half-steps and attn=True (which also writes its output A V).
            Agreement: both run to convergence (birkhoff iters = 1001,
            POT numItermax = 5000, stopThr = 1e-9) and the plans compared
            (birkhoff's A = N P).
  train     the training step of `birkhoff bench --op train` (the issue's ViT,
            batch 64) against the PyTorch twin (birkhoff.models, reference
            numerics) eager and under torch.compile, attn=softmax and
            attn=sinkhorn (S = 5). birkhoff's steps run in a child process
            (its CLI times them itself), the twin's in this one; rounds
            alternate them.

--load N starts N busy single-threaded processes (a Python spin loop)
for the whole run and stops them at the end (or when this process dies) (what COMMON44 calls
"under load"). Results: a table on stdout, and with --json FILE one JSON
document (versions, machine, every row)."""
import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

sys.dont_write_bytecode = True
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--reps", type=int, default=15, help="rounds (each calls every contender once)")
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--load", type=int, default=0, help="busy single-threaded processes beside the run")
ap.add_argument("--only", default="softmax,sinkhorn,pot,train")
ap.add_argument("--train-rounds", type=int, default=5)
ap.add_argument("--train-attn", default="attn=softmax,attn=sinkhorn;sk_iters=5",
                help="comma-separated attention settings of the training step")
ap.add_argument("--train-steps", type=int, default=4, help="timed steps per contender per round")
ap.add_argument("--birkhoff", default=os.path.join(ROOT, "build", "birkhoff"))
ap.add_argument("--json", default=None, help="write every row and the versions to this file")
ARGS = ap.parse_args()
SECTIONS = [s for s in ARGS.only.split(",") if s]
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)
# inductor's compiled-code cache of its own: a cache shared with other processes (other users'
# runs of torch.compile) is not what this run measures
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join("/tmp", "birkhoff-anchors-inductor-%d" % os.getuid()))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "python"))
import birkhoff  # noqa: E402
from birkhoff import ops as bko  # noqa: E402
from birkhoff import _port_sinkformer as port  # noqa: E402

torch.set_num_threads(ARGS.threads)
birkhoff.set_num_threads(ARGS.threads)
# the port's .item() graph break is expected (and said in the docstring): keep the log quiet
torch._logging.set_logs(dynamo=logging.ERROR)
warnings.filterwarnings("ignore", message="Sinkhorn did not converge")
ROWS = []


def cpu_model():
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def versions():
    v = {"loadavg": os.getloadavg()[0], "python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
         "birkhoff": birkhoff.version(), "birkhoff_isa": birkhoff.isa(),
         "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
         "threads": ARGS.threads, "load": ARGS.load, "cpu": cpu_model(), "nproc": os.cpu_count()}
    for mod in ("ot", "sacrebleu"):
        try:
            v["pot" if mod == "ot" else mod] = __import__(mod).__version__
        except ImportError:
            v["pot" if mod == "ot" else mod] = None
    return v


def interleaved(contenders, reps, warmup):
    """contenders: {name: fn}; every fn is warmed up, then `reps` rounds call
    each once in an order rotated by one per round. {name: [seconds]}; a fn
    that returns a number has timed itself (the CLI's own median), and that
    number is its time."""
    names = list(contenders)
    for n in names:
        for _ in range(warmup):
            contenders[n]()
    times = {n: [] for n in names}
    for r in range(reps):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            t0 = time.perf_counter()
            own = contenders[n]()
            dt = time.perf_counter() - t0
            times[n].append(float(own) if isinstance(own, float) else dt)
    return times


def cli_bench(op, case, key, reps=3):
    """`birkhoff bench` on one case, --no-peer: its own median (key:
    fwd_median_s or fwdbwd_median_s), the C library with a workspace the
    bench allocates once (no allocation in the timed region)"""
    r = subprocess.run([ARGS.birkhoff, "bench", "--op", op, "--cases", case, "--threads", str(ARGS.threads),
                        "--reps", str(reps), "--warmup", "1", "--no-peer", "--json"],
                       capture_output=True, text=True, check=True)
    return float(json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][0])[key])


def stats(ts):
    q = np.percentile(ts, [25, 50, 75])
    return {"median_s": float(q[1]), "p25_s": float(q[0]), "p75_s": float(q[2]), "n": len(ts)}


def report(section, case, times, base):
    """rows for one case; ratio = contender / birkhoff (> 1: birkhoff faster)"""
    b = statistics.median(times[base])
    for name, ts in times.items():
        s = stats(ts)
        row = {"section": section, "case": case, "contender": name, **s,
               "x_birkhoff": s["median_s"] / b}
        ROWS.append(row)
        print("  %-34s %10.3f ms  [%8.3f, %8.3f]  %6.2fx birkhoff's time" % (
            name, s["median_s"] * 1e3, s["p25_s"] * 1e3, s["p75_s"] * 1e3, row["x_birkhoff"]))
    sys.stdout.flush()


def qkv(BH, N, d, seed=0):
    g = np.random.default_rng(seed)
    a = [g.standard_normal((1, BH, N, d), dtype=np.float32) for _ in range(4)]
    return a  # q, k, v, dout


def sdpa_kernels(q, k, v):
    """the aten attention ops SDPA ran (forward and backward) on these inputs"""
    from torch.profiler import ProfilerActivity, profile
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(qg, kg, vg).sum().backward()
    names = sorted({e.key for e in prof.key_averages()
                    if "attention" in e.key or "_math" in e.key or "flash" in e.key})
    return [n for n in names if n.startswith("aten::")]


def torch_timers(qt, kt, vt, dt):
    """(nograd, fb): for a torch attention f, a call of f(q, k, v) under
    torch.no_grad, and one forward with autograd then backward(dt) (the
    gradients of fresh leaf copies cleared before each)"""
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (qt, kt, vt))

    def nograd(f):
        def run():
            with torch.no_grad():
                f(qt, kt, vt)
        return run

    def fb(f):
        def run():
            for t in (qg, kg, vg):
                t.grad = None
            f(qg, kg, vg).backward(dt)
        return run
    return nograd, fb


# ---------------------------------------------------------------- softmax
def softmax_section():
    print("softmax attention (birkhoff softmax vs torch %s)" % torch.__version__)
    math_c = torch.compile(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, -1) @ v)
    for BH, N, d in ((8, 1024, 64), (1, 4096, 64)):
        qn, kn, vn, dn = qkv(BH, N, d)
        qt, kt, vt, dt = (torch.from_numpy(a) for a in (qn, kn, vn, dn))
        kern = sdpa_kernels(qt, kt, vt)
        case = "BH=%d N=%d d=%d" % (BH, N, d)
        print(" %s; SDPA ran %s" % (case, ", ".join(kern)))
        ROWS.append({"section": "softmax", "case": case, "sdpa_aten_ops": kern})
        # agreement (not a test: the numbers say the contenders compute the same thing)
        o_b = bko.softmax(qn, kn, vn, tape=False).out
        o_t = F.scaled_dot_product_attention(qt, kt, vt).numpy()
        print("  max |birkhoff - SDPA| = %.2e" % float(np.abs(o_b - o_t).max()))

        def math(q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2) * d ** -0.5, -1) @ v

        nograd, fb_torch = torch_timers(qt, kt, vt, dt)

        def b_fb():
            r = bko.softmax(qn, kn, vn)
            bko.softmax_backward(qn, kn, vn, dn, r.tape)

        cc = "%d:%d:%d" % (BH, N, d)
        fw = {"birkhoff fwd": lambda: bko.softmax(qn, kn, vn, tape=False),
              "birkhoff CLI bench fwd": lambda: cli_bench("softmax", cc, "fwd_median_s"),
              "SDPA fwd": nograd(F.scaled_dot_product_attention),
              "eager math fwd": nograd(math), "compiled math fwd": nograd(math_c)}
        reps = ARGS.reps if N <= 1024 else max(5, ARGS.reps // 2)
        report("softmax-fwd", case, interleaved(fw, reps, ARGS.warmup), "birkhoff fwd")
        fb = {"birkhoff f+b": b_fb, "birkhoff CLI bench f+b": lambda: cli_bench("softmax", cc, "fwdbwd_median_s"),
              "SDPA f+b": fb_torch(F.scaled_dot_product_attention),
              "eager math f+b": fb_torch(math), "compiled math f+b": fb_torch(math_c)}
        report("softmax-fb", case, interleaved(fb, reps, ARGS.warmup), "birkhoff f+b")


# ---------------------------------------------------------------- sinkhorn
def sinkhorn_section(BH=8, N=1024, d=64, S=5):
    print("Sinkhorn attention, S = %d, eps = 1 (birkhoff vs the reference port, torch %s)"
          % (S, torch.__version__))
    qn, kn, vn, dn = qkv(BH, N, d)
    qt, kt, vt, dt = (torch.from_numpy(a) for a in (qn, kn, vn, dn))

    def ref(q, k, v):
        return port.attention(q, k, v, S)[0]

    ref_c = torch.compile(ref)
    case = "BH=%d N=%d d=%d S=%d" % (BH, N, d, S)
    o_b = bko.sinkhorn(qn, kn, vn, iters=S, tape=False).out
    with torch.no_grad():
        o_r, o_c = ref(qt, kt, vt).numpy(), ref_c(qt, kt, vt).numpy()
    print(" %s; max |birkhoff - port| = %.2e, |compiled port - port| = %.2e"
          % (case, float(np.abs(o_b - o_r).max()), float(np.abs(o_c - o_r).max())))

    nograd, fb_torch = torch_timers(qt, kt, vt, dt)

    def b_fb():
        r = bko.sinkhorn(qn, kn, vn, iters=S)
        bko.sinkhorn_backward(qn, kn, vn, dn, r.tape, iters=S)

    t0 = time.perf_counter()
    fb_torch(ref_c)()
    print("  (torch.compile of the port, first f+b: %.1f s)" % (time.perf_counter() - t0))
    cc = "%d:%d:%d:%d" % (BH, N, d, S)
    fw = {"birkhoff fwd": lambda: bko.sinkhorn(qn, kn, vn, iters=S, tape=False),
          "birkhoff CLI bench fwd": lambda: cli_bench("sinkhorn", cc, "fwd_median_s"),
          "port eager fwd": nograd(ref), "port compiled fwd": nograd(ref_c)}
    report("sinkhorn-fwd", case, interleaved(fw, ARGS.reps, ARGS.warmup), "birkhoff fwd")
    fb = {"birkhoff f+b": b_fb, "birkhoff CLI bench f+b": lambda: cli_bench("sinkhorn", cc, "fwdbwd_median_s"),
          "port eager f+b": fb_torch(ref), "port compiled f+b": fb_torch(ref_c)}
    report("sinkhorn-fb", case, interleaved(fb, ARGS.reps, ARGS.warmup), "birkhoff f+b")


# ---------------------------------------------------------------- POT
def pot_section(BH=8, N=1024, d=64, S=10):
    import ot
    print("the plan alone: POT %s ot.sinkhorn(method='sinkhorn_log') vs birkhoff sinkhorn" % ot.__version__)
    qn, kn, vn, _ = qkv(BH, N, d)
    scale = d ** -0.5
    Ms = [-(qn[0, h] @ kn[0, h].T) * scale for h in range(BH)]              # float32 [N, N]
    Ms64 = [m.astype(np.float64) for m in Ms]
    a = np.full(N, 1.0 / N)
    a32 = a.astype(np.float32)
    case = "BH=%d N=%d d=%d, %d half-steps" % (BH, N, d, S)

    def pot(Ms_, aa, iters, thr):
        return [ot.sinkhorn(aa, aa, M, 1.0, method="sinkhorn_log", numItermax=iters, stopThr=thr)
                for M in Ms_]

    # agreement at convergence
    A = bko.sinkhorn(qn, kn, vn, iters=1001, attn=True, tape=False).attn[0] / N
    P = pot(Ms64, a, 5000, 1e-9)
    diff = max(float(np.abs(A[h] - P[h]).max()) for h in range(BH))
    rel = max(float(np.abs(A[h] - P[h]).sum() / np.abs(P[h]).sum()) for h in range(BH))
    mx = max(float(P[h].max()) for h in range(BH))
    print(" converged plans: max |P_birkhoff - P_POT| = %.2e (largest entry %.2e), "
          "sum|dP| / sum P = %.2e" % (diff, mx, rel))
    ROWS.append({"section": "pot", "case": "converged", "max_abs_diff": diff, "l1_rel": rel,
                 "max_entry": mx})
    with np.errstate(all="ignore"):
        contenders = {
            "birkhoff plan+output": lambda: bko.sinkhorn(qn, kn, vn, iters=S, attn=True, tape=False),
            "POT sinkhorn_log float64": lambda: pot(Ms64, a, S // 2, 0.0),
            "POT sinkhorn_log float32": lambda: pot(Ms, a32, S // 2, 0.0),
        }
        report("pot", case, interleaved(contenders, max(5, ARGS.reps // 2), 1), "birkhoff plan+output")


# ---------------------------------------------------------------- train
TRAIN_CFG = "dim=128,depth=4,heads=4,mlp_dim=256,patch=4"


def train_section(batch=64):
    from birkhoff import models as M
    print("training step, the issue's ViT, batch %d (birkhoff CLI vs the PyTorch twin, torch %s)"
          % (batch, torch.__version__))
    for attn in ARGS.train_attn.split(","):
        full = TRAIN_CFG + "," + attn.replace(";", ",")
        torch.manual_seed(0)
        cfg = M.resolve_config(full)
        twins = {}
        for mode in ("eager", "compiled"):
            model = M.build_model(cfg, reference=True, allow_dropout=True).float().train()
            ocfg = M.resolve_optim(None)
            opt = M.make_optimizer(model, ocfg)
            data = M.random_batch(cfg, batch, np.random.default_rng(0))
            data = {k: (None if v is None else v) for k, v in data.items()}
            run_model = torch.compile(model) if mode == "compiled" else model
            twins[mode] = (run_model, opt, ocfg, data)

        def twin_steps(mode):
            m, opt, ocfg, data = twins[mode]
            ts = []
            for i in range(ARGS.train_steps):
                t0 = time.perf_counter()
                M.train_step(m, opt, ocfg, i, data)
                ts.append(time.perf_counter() - t0)
            return ts

        def ours():
            r = subprocess.run([ARGS.birkhoff, "bench", "--op", "train", "--config", TRAIN_CFG, "--attn", attn,
                                "--batch", str(batch), "--steps", str(ARGS.train_steps), "--warmup", "1",
                                "--threads", str(ARGS.threads), "--no-peer", "--json"],
                               capture_output=True, text=True, check=True)
            row = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][0])
            return [row["step_median_s"]] * ARGS.train_steps   # its own median of the round

        names = {"birkhoff step": ours, "twin eager step": lambda: twin_steps("eager"),
                 "twin compiled step": lambda: twin_steps("compiled")}
        t0 = time.perf_counter()
        try:
            twin_steps("compiled")
            print(" %s: torch.compile of the twin, first steps: %.1f s" % (attn, time.perf_counter() - t0))
        except Exception as e:   # a torch.compile failure is a result too: say it, time the others
            msg = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])
            print(" %s: the compiled twin FAILED (%s)" % (attn, msg))
            ROWS.append({"section": "train", "case": attn, "contender": "twin compiled step", "error": msg})
            del names["twin compiled step"]
        twin_steps("eager")
        times = {n: [] for n in names}
        order = list(names)
        for r in range(ARGS.train_rounds):
            k = r % len(order)
            for n in order[k:] + order[:k]:
                times[n].append(statistics.median(names[n]()))
        report("train", "%s batch %d" % (attn, batch), times, "birkhoff step")


def main():
    v = versions()
    print("anchors: " + ", ".join("%s %s" % kv for kv in v.items()))
    # busy loops that end with this process (they spin while their parent is this one)
    spin = "import os\np = os.getppid()\nwhile os.getppid() == p: pass"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(ARGS.load)]
    try:
        for s in SECTIONS:
            {"softmax": softmax_section, "sinkhorn": sinkhorn_section, "pot": pot_section,
             "train": train_section}[s]()
            if ARGS.json:   # after every section: a crash later (torch.compile's) keeps what was measured
                with open(ARGS.json, "w") as f:
                    json.dump({"versions": v, "rows": ROWS}, f, indent=1)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
