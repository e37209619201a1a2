#!/usr/bin/python3
"""The determinism contract (docs/ARCHITECTURE.md, "Determinism"), checked from outside the library:

1. through the CLI, for every operator (softmax, Sinkhorn, ESP hard and soft, LOT, OTK, ASAP):
   every output and gradient file is bitwise identical at 1, 2, 3, 5 and 8 threads, for a
   single problem large enough to be split over a team of threads and for a batch;
2. through the CLI: a problem computed alone gives bitwise the same outputs and gradients as the
   same problem inside a batch of 16 problems;
3. through the Python bindings (numpy API): the same for the thread counts, forward and backward;
4. across ISA paths: the native run and the forced portable run (BK_ISA=avx2 with
   OPENBLAS_CORETYPE=Haswell, what an AVX2-only machine runs) agree within the documented
   tolerance (1e-5 forward, 1e-4 gradients, relative to the largest entry);
5. the thread count belongs to the library: its default is the process's CPU affinity, not
   OpenMP's setting (which `import torch` changes), BIRKHOFF_NUM_THREADS overrides it, and
   birkhoff.set_num_threads is not changed by torch.set_num_threads.

Run: /usr/bin/python3 tests/test_determinism.py build/birkhoff   (make check runs it)."""
import os
import subprocess
import signal
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from checklib import Checks  # noqa: E402

BK = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/birkhoff")
ROOT = os.path.dirname(HERE)
LIB = os.path.join(os.path.dirname(BK), "libbirkhoff.so")
THREADS = (1, 2, 3, 5, 8)
check = Checks()
tmp = tempfile.mkdtemp(prefix="bk_det_")
P = lambda n: os.path.join(tmp, n)  # noqa: E731
rng = np.random.default_rng(7)
PORTABLE = {"BK_ISA": "avx2", "OPENBLAS_CORETYPE": "Haswell"}


def run(args, env_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    p = subprocess.run([BK, *args], capture_output=True, text=True, timeout=600, env=env)
    return p.returncode, p.stdout + p.stderr


def save(name, a):
    np.save(P(name), np.ascontiguousarray(a))
    return P(name)


def randn(*shape):
    return rng.standard_normal(shape).astype("<f4")


# ---- the operators' problems -------------------------------------------------------------
# One problem large enough to run as a team (300 x 260 scores), a batch of 16 in which that
# problem is planted at (b, h) = (2, 1) with the same lengths, and the CLI flags of each op.
Nq, Nk, d, dv = 300, 260, 32, 24
BB, HB, PB, PH = 4, 4, 2, 1  # the batch and where the single problem sits in it


def make_attn_inputs(tag):
    q1, k1, v1, do1 = randn(1, 1, Nq, d), randn(1, 1, Nk, d), randn(1, 1, Nk, dv), randn(1, 1, Nq, dv)
    qb, kb, vb, dob = randn(BB, HB, Nq, d), randn(BB, HB, Nk, d), randn(BB, HB, Nk, dv), randn(BB, HB, Nq, dv)
    for big, small in ((qb, q1), (kb, k1), (vb, v1), (dob, do1)):
        big[PB, PH] = small[0, 0]
    ql1, kl1 = np.array([287], "<i4"), np.array([251], "<i4")
    qlb = rng.integers(1, Nq + 1, BB).astype("<i4")
    klb = rng.integers(1, Nk + 1, BB).astype("<i4")
    qlb[PB], klb[PB] = ql1[0], kl1[0]
    files = {}
    for name, a in (("q1", q1), ("k1", k1), ("v1", v1), ("do1", do1), ("ql1", ql1), ("kl1", kl1), ("qb", qb),
                    ("kb", kb), ("vb", vb), ("dob", dob), ("qlb", qlb), ("klb", klb)):
        files[name] = save(f"{tag}_{name}.npy", a)
    return files


def attn_args(f, which, outdir, op_flags, grads=True, attn=True):
    s = "1" if which == "single" else "b"
    a = ["attn", *op_flags, "--q", f["q" + s], "--k", f["k" + s], "--v", f["v" + s],
         "--q-len", f["ql" + s], "--k-len", f["kl" + s], "--out", os.path.join(outdir, "out.npy")]
    if attn:
        a += ["--attn", os.path.join(outdir, "attn.npy")]
    if grads:
        a += ["--dout", f["do" + s]] + sum(([flag, os.path.join(outdir, flag[2:] + ".npy")]
                                             for flag in ("--dq", "--dk", "--dv")), [])
    return a


# per head parameters are equal over the heads so that the planted problem sees the same ones
r = 8
Z1 = randn(r, d) * 0.5
th1 = randn(r) * 0.3
save("Zs.npy", Z1[None])
save("ths.npy", th1[None])
save("Zb.npy", np.repeat(Z1[None], HB, 0))
save("thb.npy", np.repeat(th1[None], HB, 0))
save("Ls.npy", np.array([0.6], np.float32))
save("Lb.npy", np.full(HB, 0.6, np.float32))
save("slices.npy", (lambda t: t / np.linalg.norm(t, axis=1, keepdims=True))(randn(12, d)))

fa = make_attn_inputs("a")
OPS = [
    ("softmax", ["--op", "softmax"], {}),
    ("sinkhorn S=5", ["--op", "sinkhorn", "--iters", "5", "--diag", "{o}/diag.npy"], {}),
    ("sinkhorn S=6 implicit", ["--op", "sinkhorn", "--iters", "40", "--grad", "implicit"], {}),
    ("unbalanced S=6 rho=2", ["--op", "unbalanced", "--iters", "6", "--rho", "2", "--diag", "{o}/diag.npy"], {}),
    ("esp hard", ["--op", "esp", "--sort", "hard", "--diag", "{o}/diag.npy", "--sigma", "{o}/sigma.npy"], {}),
    ("esp soft", ["--op", "esp", "--sort", "soft", "--slices", P("slices.npy"), "--tau", "2",
                  "--dslices", "{o}/dslices.npy", "--sigma", "{o}/sigma.npy"], {"dslices"}),
    ("lot", ["--op", "lot", "--pivots", "{Z}", "--pivot-logits", "{th}", "--diag", "{o}/diag.npy",
             "--dpivots", "{o}/dpivots.npy", "--dpivot-logits", "{o}/dpl.npy"], {"dpivots", "dpl"}),
    ("diff", ["--op", "diff", "--lambda", "{L}", "--dlambda", "{o}/dlambda.npy"], {"dlambda"}),
]
# outputs that are sums over the batch (parameter gradients) cannot be compared across batch shapes
SHARED = {"dslices", "dpivots", "dpl", "dlambda"}


def expand(flags, o, which):
    zs = P("Zs.npy") if which == "single" else P("Zb.npy")
    ths = P("ths.npy") if which == "single" else P("thb.npy")
    ls = P("Ls.npy") if which == "single" else P("Lb.npy")
    return [x.replace("{o}", o).replace("{Z}", zs).replace("{th}", ths).replace("{L}", ls) for x in flags]


def read_all(o):
    return {f[:-4]: np.load(os.path.join(o, f)) for f in sorted(os.listdir(o)) if f.endswith(".npy")}


def bitwise(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def threads_sweep(name, make_args):
    """runs make_args(outdir) at every thread count; all output files bitwise equal"""
    ref = None
    for t in THREADS:
        o = P(f"{name.replace(' ', '_').replace('=', '')}_t{t}")
        os.makedirs(o, exist_ok=True)
        rc, out = run(make_args(o) + ["--threads", str(t)])
        if not check(rc == 0, f"{name}: runs at {t} threads", out):
            return None
        got = read_all(o)
        if ref is None:
            ref = got
            continue
        bad = [k for k in ref if k not in got or not bitwise(ref[k], got[k])]
        check(not bad and len(got) == len(ref), f"{name}: bitwise identical files at {t} threads and 1 thread",
              f"differ: {bad}")
    return ref


cli_single = {}
cli_batch = {}
for name, flags, _ in OPS:
    grads = True
    for which in ("single", "batch"):
        res = threads_sweep(f"CLI {name} ({which})",
                            lambda o, w=which: attn_args(fa, w, o, expand(flags, o, w), grads=grads))
        if res is None:
            continue
        if which == "single":
            cli_single[name] = res
        else:
            cli_batch[name] = res
        if which == "batch" and name in cli_single:
            one = cli_single[name]
            bad = []
            for k, v in one.items():
                if k in SHARED:
                    continue
                b = res[k]
                if k == "sigma" or k == "diag":
                    same = bitwise(v[0, 0], b[PB, PH])
                else:
                    same = bitwise(v[0, 0], b[PB, PH])
                if not same:
                    bad.append(k)
            check(not bad, f"CLI {name}: a problem alone == the same problem in a batch of {BB * HB}",
                  f"differ: {bad}")

# ---- OTK: sets -----------------------------------------------------------------------------
n_set, dx, kq, p_sup = 400, 16, 4, 24
x1 = randn(1, n_set, dx)
xb = randn(16, n_set, dx)
xb[5] = x1[0]
l1 = np.array([371], "<i4")
lb = rng.integers(1, n_set + 1, 16).astype("<i4")
lb[5] = l1[0]
refs = randn(kq, p_sup, dx) * 0.5
dphi1, dphib = randn(1, p_sup, kq * dx), randn(16, p_sup, kq * dx)
dphib[5] = dphi1[0]
for nm, a in (("ox1", x1), ("oxb", xb), ("ol1", l1), ("olb", lb), ("orefs", refs), ("odp1", dphi1),
              ("odpb", dphib)):
    save(nm + ".npy", a)
for dom in ("log", "scaling"):
    res = {}
    for which, xs, ls, dps in (("single", "ox1", "ol1", "odp1"), ("batch", "oxb", "olb", "odpb")):
        res[which] = threads_sweep(
            f"CLI otk {dom} ({which})",
            lambda o, xs=xs, ls=ls, dps=dps: ["otk", "embed", "--x", P(xs + ".npy"), "--refs", P("orefs.npy"),
                                              "--lengths", P(ls + ".npy"), "--domain", dom, "--iters", "6",
                                              "--out", os.path.join(o, "out.npy"), "--plan", os.path.join(o, "plan.npy"),
                                              "--dout", P(dps + ".npy"), "--dx", os.path.join(o, "dx.npy"),
                                              "--drefs", os.path.join(o, "drefs.npy")])
    if res["single"] and res["batch"]:
        bad = [k for k in ("out", "plan", "dx") if not bitwise(res["single"][k][0], res["batch"][k][5])]
        check(not bad, f"CLI otk {dom}: a set alone == the same set in a batch of 16", f"differ: {bad}")

# ---- ASAP: a compiled layer ----------------------------------------------------------------
rc, out = run(["asap", "generate", "--b", "2", "--h", "2", "--n", "64", "--d", str(d), "--seed", "3",
               "--out-q", P("cq.npy"), "--out-k", P("ck.npy"), "--out-v", P("cv.npy")])
check(rc == 0, "asap generate", out)
rc, out = run(["asap", "calibrate", "--q", P("cq.npy"), "--k", P("ck.npy"), "--teacher-iters", "6", "--slices", "8",
               "--out", P("layer.asap")])
if check(rc == 0, "asap calibrate", out):
    for variant in ("zero", "row", "column"):
        res = {}
        for which in ("single", "batch"):
            res[which] = threads_sweep(
                f"CLI asap {variant} ({which})",
                lambda o, w=which: attn_args(fa, w, o, ["--op", "asap", "--layer", P("layer.asap"), "--variant", variant,
                                                        "--diag", os.path.join(o, "diag.npy")], grads=False))
        if res["single"] and res["batch"]:
            bad = [k for k in res["single"] if not bitwise(res["single"][k][0, 0], res["batch"][k][PB, PH])]
            check(not bad, f"CLI asap {variant}: a problem alone == the same problem in a batch of 16", f"differ: {bad}")

# ---- across ISA paths ----------------------------------------------------------------------
# The native path (AVX-512 kernels where the CPU has them, OpenBLAS's own core type) against
# what an AVX2-only machine runs. Tolerance: the operators' documented accuracy against the
# double reference, relative to the largest entry (1e-5 forward, 1e-4 gradients).
rc, isa_native = run(["version"])
rc2, isa_portable = run(["version"], PORTABLE)
check(rc == 0 and rc2 == 0 and "avx2" in isa_portable, "version runs on both paths", isa_native + isa_portable)
for name, flags, _ in OPS:
    outs = []
    for env in (None, PORTABLE):
        o = P(f"isa_{len(outs)}_{name.replace(' ', '_').replace('=', '')}")
        os.makedirs(o, exist_ok=True)
        rc, out = run(attn_args(fa, "batch", o, expand(flags, o, "batch")), env)
        check(rc == 0, f"ISA paths: {name} runs ({'portable' if env else 'native'})", out)
        outs.append(read_all(o) if rc == 0 else None)
    if outs[0] and outs[1]:
        worst = {}
        for k, a in outs[0].items():
            b = outs[1][k]
            if a.dtype != np.float32:
                continue
            if k in ("diag",):  # errors of a converging iteration: compared loosely below
                continue
            scale = max(1.0, float(np.abs(a).max())) if k in ("out", "attn", "sigma") else max(1e-30, float(np.abs(a).max()))
            worst[k] = float(np.abs(a.astype(np.float64) - b).max()) / scale
        grad_keys = {"dq", "dk", "dv", "dslices", "dpivots", "dpl"}
        bad = {k: v for k, v in worst.items() if v > (1e-4 if k in grad_keys else 1e-5)}
        check(not bad, f"ISA paths: {name} native ({isa_native.split('kernels: ')[-1].split(',')[0]}) vs portable "
                       f"agree within 1e-5 / 1e-4", f"worst {worst}")

# ---- Python bindings: thread counts, and who owns the thread count --------------------------
# The numpy API, every operator, forward and backward, one problem big enough for a team.
PY_SWEEP = r"""
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
import birkhoff as bk
rng = np.random.default_rng(5)
f = lambda *s: rng.standard_normal(s).astype(np.float32)
q, k, v, do = f(1, 1, 300, 32), f(1, 1, 260, 32), f(1, 1, 260, 24), f(1, 1, 300, 24)
Z, th = f(1, 8, 32) * 0.5, f(1, 8) * 0.3
x, refs, dphi = f(1, 400, 16), f(4, 24, 16) * 0.5, f(1, 24, 64)
def flat(r):
    if isinstance(r, np.ndarray):
        return [r.tobytes()]
    if isinstance(r, dict):  # the tape is opaque (its padding is unspecified): not compared
        return sum((flat(r[key]) for key in sorted(r) if key != "tape"), [])
    if isinstance(r, (tuple, list)):
        return sum((flat(y) for y in r), [])
    return [repr(r).encode()]
def once():
    res = []
    for op, kw in (("softmax", {}), ("sinkhorn", {"iters": 5}), ("unbalanced", {"iters": 6, "rho": 2.0}), ("esp", {}),
                   ("esp", {"sort": "soft", "tau": 2.0})):
        fw = getattr(bk, op)(q, k, v, **kw)
        res += flat(fw) + flat(getattr(bk, op + "_backward")(q, k, v, do, fw.tape, **kw))
    fw = bk.lot(q, k, v, Z, th)
    res += flat(fw) + flat(bk.lot_backward(q, k, v, Z, th, do, fw.tape))
    fw = bk.diff(q, k, v, [0.6], attn=True)
    res += flat(fw) + flat(bk.diff_backward(q, k, v, [0.6], do, fw.tape))
    fw = bk.otk(x, refs)
    res += flat(fw) + flat(bk.otk_backward(x, refs, dphi, fw.tape))
    return res
ref = None
for t in (1, 2, 3, 5, 8):
    bk.set_num_threads(t)
    got = once()
    if ref is None:
        ref = got
    elif got != ref:
        bad = [i for i, (a, b) in enumerate(zip(ref, got)) if a != b]
        print("DIFF at", t, "threads, arrays", bad); sys.exit(1)
# the caller's floating-point mode does not matter: the library flushes subnormals itself
if len(sys.argv) > 2:
    import torch
    for ftz in (True, False):
        torch.set_flush_denormal(ftz)
        got = once()
        if got != ref:
            print("DIFF with the caller's flush-denormal", ftz); sys.exit(1)
print("same", len(ref), "arrays")
"""
PY_OWN = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
want = int(sys.argv[2])
if len(sys.argv) > 3:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
import torch
torch.set_num_threads(1)
import birkhoff as bk
got = bk.get_num_threads()
bk.set_num_threads(2)
torch.set_num_threads(1)
after = bk.get_num_threads()
print(got, after)
sys.exit(0 if got == want and after == 2 else 1)
"""


def py(code, *args, env_extra=None):
    env = dict(os.environ, BIRKHOFF_LIB=LIB)
    env.pop("BIRKHOFF_NUM_THREADS", None)
    env.update(env_extra or {})
    p = subprocess.run(["/usr/bin/python3", "-c", code, os.path.join(ROOT, "python"), *map(str, args)],
                       capture_output=True, text=True, timeout=600, env=env)
    return p.returncode, p.stdout + p.stderr


try:
    import torch  # noqa: F401
    have_torch = True
except Exception:
    have_torch = False
if os.path.exists(LIB) and have_torch:
    rc, out = py(PY_SWEEP, "ftz")
    check(rc == 0, "Python: softmax, Sinkhorn, ESP hard/soft, LOT, OTK forward and backward bitwise identical at "
                   "1, 2, 3, 5, 8 threads and under either torch.set_flush_denormal", out)
    ncpu = len(os.sched_getaffinity(0))
    rc, out = py(PY_OWN, ncpu)
    check(rc == 0, f"Python: default threads = the affinity ({ncpu}) after torch.set_num_threads(1); "
                   "set_num_threads(2) survives torch.set_num_threads(1)", out)
    rc, out = py(PY_OWN, 3, env_extra={"BIRKHOFF_NUM_THREADS": "3"})
    check(rc == 0, "Python: BIRKHOFF_NUM_THREADS=3 sets the default", out)
    rc, out = py(PY_OWN, 1, "pin")
    check(rc == 0, "Python: a process pinned to one CPU defaults to 1 thread", out)
else:
    msg = "SKIP Python checks: " + ("no " + LIB if not os.path.exists(LIB) else "torch not importable")
    if os.environ.get("CI") == "true":
        check(False, "Python checks must run under CI", msg)
    else:
        print(msg)
# ---- on a busy machine ---------------------------------------------------------------------
# Every operator (a problem alone: a team; a batch: problems claimed by members) and a training
# run of a Sinkhorn ViT, at 2 and 3 threads beside busy processes started here (one per CPU, so
# members are descheduled mid-phase and blocks move between them): bitwise the idle 1-thread
# results.
BUSY = "import time\nt = time.time() + 600\nwhile time.time() < t: pass\n"
busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(max(1, len(os.sched_getaffinity(0))))]
try:
    for name, flags, _ in OPS:
        for which, ref_of in (("single", cli_single), ("batch", cli_batch)):
            if name not in ref_of:
                continue
            for t in (2, 3):
                o = P(f"loaded_{which}_{t}_{name.replace(' ', '_').replace('=', '')}")
                os.makedirs(o, exist_ok=True)
                rc, out = run(attn_args(fa, which, o, expand(flags, o, which)) + ["--threads", str(t)])
                got = read_all(o) if rc == 0 else {}
                bad = [k for k in ref_of[name] if k not in got or not bitwise(ref_of[name][k], got[k])]
                check(rc == 0 and not bad, f"CLI {name} ({which}): {t} threads beside {len(busy)} busy processes "
                                           f"== idle 1 thread, bitwise", out + f" differ: {bad}")
    xs = rng.standard_normal((24, 1, 16, 16)).astype(np.float32)
    ys = rng.integers(0, 10, 24).astype("<i4")
    save("tx.npy", xs)
    save("ty.npy", ys)
    cfg = "image_h=16,image_w=16,channels=1,patch=4,dim=32,depth=2,heads=2,mlp_dim=64,classes=10,attn=sinkhorn,sk_iters=3"
    init = ["model", "init", "--config", cfg, "--seed", "5", "--out", P("tinit.safetensors")]
    rc, out = run(init)
    if check(rc == 0, "model init (the loaded training run)", out):
        ck = {}
        for t, loaded in ((1, False), (2, True), (3, True)):
            if not loaded:  # the reference runs alone: pause the busy processes
                for b in busy:
                    b.send_signal(signal.SIGSTOP)
            rc, out = run(["model", "train", "--ckpt", P("tinit.safetensors"), "--x", P("tx.npy"), "--labels",
                           P("ty.npy"), "--steps", "3", "--micro", "8", "--out", P(f"tr{t}.safetensors")],
                          {"BIRKHOFF_NUM_THREADS": str(t)})
            if not loaded:
                for b in busy:
                    b.send_signal(signal.SIGCONT)
            check(rc == 0, f"model train at {t} threads{' under load' if loaded else ''}", out)
            ck[t] = open(P(f"tr{t}.safetensors"), "rb").read() if rc == 0 else b""
        for t in (2, 3):
            check(ck[1] and ck[t] == ck[1], f"a Sinkhorn ViT's 3 training steps at {t} threads beside "
                                            f"{len(busy)} busy processes == idle 1 thread, bitwise (checkpoint bytes)")
finally:
    for b in busy:
        b.kill()
        b.wait()

rc, out = run(["version"], {"BIRKHOFF_NUM_THREADS": "5"})
check(rc == 0 and "threads: 5" in out, "CLI: BIRKHOFF_NUM_THREADS=5 sets the default", out)
rc, out = run(["version"], {"OMP_NUM_THREADS": "1"})
check(rc == 0 and f"threads: {len(os.sched_getaffinity(0))}" in out, "CLI: OMP_NUM_THREADS does not set birkhoff's count", out)

sys.exit(check.summary(" (determinism)"))
