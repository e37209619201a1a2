#!/usr/bin/env python3
"""CUDA benchmark of birkhoff's Sinkhorn / softmax attention against PyTorch peers.

Usage (from the repository root, on a machine with one CUDA GPU):
  python3 bench/cuda_bench.py --out $OUT/bench.json            # full run, < 150 s on an H100
  python3 bench/cuda_bench.py --quick --out $OUT/bench.json    # fewer cases (no N=16384, no fp32 compile)
Options: --budget-s S (soft budget: no case starts after it, reps shrink to fit;
the run is hard-stopped --grace-s later), --reps R, --warmup W, --no-16k,
--no-compile, --lib PATH (sets BIRKHOFF_LIB). Without a CUDA device it prints
'SKIP: no CUDA device' and exits 0.

Shapes: B=4, H=8 (B*H = 32), d=64, S=5 half-steps (iters=5), eps=1, scale
d^-1/2, N in {1024, 4096} (and 16384 for ours and SDPA only). Cases:
  ours_sinkhorn  birkhoff.torch.sinkhorn_attention(q, k, v, iters=5, eps=1.0), bf16 and fp32
  ours_softmax   birkhoff.torch.softmax_attention(q, k, v), bf16 (the 'softmax path')
  ours_*_wmma    the same with BK_CUDA_KERNELS=wmma: the first (WMMA) kernels, the baseline
                 of the mma.sync passes, measured in the same run
  ours_*_nopdl   the same with BK_CUDA_PDL=0: ordinary kernel launches instead of programmatic
                 dependent ones (_pdl2: BK_CUDA_PDL=2, launched at the predecessor's start);
                 ours_*_dv3 with BK_CUDA_DV_BLOCKS=3 (the dV pass at 3 blocks an SM), _grad3
                 with BK_CUDA_GRAD_BLOCKS=3 (dQ and dK at 3); ours_*_prev with all of them
                 and PDL=0 (the kernels as of 2026-11-26, but for the unpadded shared tiles)
  ours_*_dpass   the same with BK_CUDA_TAPE_OUTPUT=0: the tape keeps no output, so the backward
                 computes D = rowsum(A .* dP) by a pass over the scores (the baseline of
                 bk_context_config.tape_output, which birkhoff.torch turns on)
  eager          bench/peers/sinkformer_torch.attention(q, k, v, 5, eps=1.0)[0] (reference
                 port, materialises N x N per half step); fp32 with its float32 marginals,
                 bf16 with marginal_dtype=None (all-bf16: the reference's float32 marginals
                 would promote the plan to fp32 and fail at attn @ v)
  compiled       the same function under torch.compile (default mode, torch._dynamo.reset()
                 before each shape/dtype, so it is compiled once per case; compile time is
                 the forward phase's first_call_s)
  sdpa           torch.nn.functional.scaled_dot_product_attention, flash backend, bf16
                 (fp32 with the default backend as an extra)
Phases: fwd (grad enabled, inputs require grad; the output is dropped),
fwdbwd (out = f(q, k, v); torch.autograd.grad(out, (q, k, v), g): the
backward of sum(out * g) for a fixed random g), fwd_nograd (under
torch.no_grad(); not for compiled). Each phase: 3 warm-ups, then >= 10 reps
timed one by one with CUDA events on torch's current stream; the median is
reported. torch.cuda.max_memory_allocated is reset before each phase.

Robustness: the cases run in a worker subprocess (this script with
--_worker) watched by a supervisor that imports no torch. A case that
raises is recorded (OOM separately); a CUDA error that poisons the context,
or a crash of the worker, is recorded against the case in progress and a
fresh worker goes on with the next case; the worker is killed if it is still
running --grace-s after the soft budget. Results go to --out (JSON) and to the
same path with .md (markdown, also printed).

bench/cuda_mem.py reuses this file's harness (import cuda_bench).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# H100 SXM peaks (the yardstick printed beside achieved rates)
PEAK_BF16_TFLOPS = 989.0      # dense bf16 tensor cores
PEAK_FP32_TFLOPS = 67.0       # fp32, non-tensor (CUDA cores)
PEAK_TF32_TFLOPS = 494.0      # tf32 tensor cores, dense (for reference only)
PEAK_EXP_PER_S = 132 * 16 * 1.98e9   # MUFU ex2: 132 SMs x 16/clk x 1.98 GHz ~ 4.18e12 /s

COUNTING_RULE = (
    "FLOPs are counted on the useful model, forward only, per problem (one of the B*H heads): "
    "Sinkhorn (ours_sinkhorn, eager, compiled) = S x 2*N*N*d (one QK^T per half-step pass) + "
    "2*N*N*d (PV); softmax (ours_softmax, sdpa) = 2*N*N*d + 2*N*N*d. Exps: S*N*N (Sinkhorn), "
    "N*N (softmax). Recomputations, max/sum passes and the backward are not counted. Rates = "
    "count x B*H / median fwd time (grad-enabled forward); peaks: H100 SXM dense bf16 989 "
    "TFLOP/s (bf16 cases), fp32 non-tensor 67 TFLOP/s (fp32 cases; tf32 tensor peak 494 for "
    "reference), MUFU exp 132 SMs x 16/clk x 1.98 GHz = 4.18e12 exp/s.")

TIMING_NOTE = (
    "Times: median over the timed reps (>= 10 unless the budget cut them, see status) after 3 warm-ups, "
    "each rep timed with a pair of CUDA events on torch's current stream; on CUDA the reps are queued "
    "behind a ~50 ms GPU sleep (torch.cuda._sleep) so the events see GPU time back to back rather than "
    "Python launch overhead (an implementation that synchronises inside, like the eager port's .item(), "
    "still pays it); the JSON's sync_wall_ms is one launched-and-synchronised call. fwd = forward with "
    "grad enabled (inputs require grad), fwd no-grad = under torch.no_grad(), fwd+bwd = forward + "
    "torch.autograd.grad(out, (q, k, v), g) (the backward of sum(out * g)). Peak = "
    "torch.cuda.max_memory_allocated, reset before each phase, inputs included.")
PHASE_CAP_S = 6.0     # timed reps of one phase stop growing past this (min_reps still run)
# an implementation's suffix: the C library's switches it runs under (a baseline measured in the same run)
VARIANTS = {
    "_dpass": {"BK_CUDA_TAPE_OUTPUT": "0"},                       # D by a pass over the scores
    "_wmma": {"BK_CUDA_KERNELS": "wmma"},                         # the first (WMMA) kernels
    "_nopdl": {"BK_CUDA_PDL": "0"},                               # ordinary launches
    "_pdl2": {"BK_CUDA_PDL": "2"},                                # launches at the predecessor's start
    "_dv3": {"BK_CUDA_DV_BLOCKS": "3"},                           # the dV pass at 3 blocks an SM
    "_grad3": {"BK_CUDA_GRAD_BLOCKS": "3"},                       # the dQ and dK passes at 3 blocks an SM
    "_prev": {"BK_CUDA_PDL": "0", "BK_CUDA_DV_BLOCKS": "3", "BK_CUDA_GRAD_BLOCKS": "3"},  # all three: as of 2026-11-26
}
SINKHORN_IMPLS = ("ours_sinkhorn", "eager", "compiled") + tuple("ours_sinkhorn" + v for v in VARIANTS)
EXIT_SKIP = 5        # worker: no CUDA device
EXIT_POISONED = 3    # worker: CUDA context unusable after a case


def log(*a):
    print(*a, flush=True)


def short_err(e, n=400):
    s = "%s: %s" % (type(e).__name__, str(e).strip().replace("\n", " | "))
    return s if len(s) <= n else s[:n] + "..."


def is_oom(e):
    try:
        import torch
        cls = getattr(torch.cuda, "OutOfMemoryError", None)
        if cls is not None and isinstance(e, cls):
            return True
    except Exception:
        pass
    return "out of memory" in str(e).lower()


# ---------------------------------------------------------------------------
# Case lists (pure Python: the supervisor builds them without torch)
# ---------------------------------------------------------------------------
def case(cid, impl, dtype, N, B, H, d=64, S=5, phases=("fwd", "fwdbwd", "fwd_nograd"), **kw):
    c = dict(id=cid, impl=impl, dtype=dtype, N=N, B=B, H=H, d=d, S=S, phases=list(phases))
    c.update(kw)
    return c


def bench_cases(args):
    tiny = args._tiny
    B, H = (1, 2) if tiny else (4, 8)
    Ns = [64, 128] if tiny else [1024, 4096]
    Nbig = 256 if tiny else 16384
    full = ("fwd", "fwdbwd", "fwd_nograd")
    comp = ("fwd", "fwdbwd")
    cs = []
    cs.append(case("check_N%d" % Ns[0], "check", "mixed", Ns[0], 1, 4, phases=()))
    for impl, dt in (("sdpa", "bf16"), ("ours_sinkhorn", "bf16"), ("ours_softmax", "bf16"), ("ours_sinkhorn", "fp32"),
                     ("eager", "bf16"), ("ours_sinkhorn_prev", "bf16"), ("ours_sinkhorn_nopdl", "bf16"),
                     ("ours_sinkhorn_pdl2", "bf16"), ("ours_sinkhorn_dv3", "bf16"), ("ours_sinkhorn_grad3", "bf16"),
                     ("ours_softmax_nopdl", "bf16"),
                     ("ours_sinkhorn_dpass", "bf16"), ("ours_softmax_dpass", "bf16"),
                     ("eager", "fp32"), ("ours_sinkhorn_wmma", "bf16"), ("ours_softmax_wmma", "bf16")):
        # the priority order
        for N in Ns:
            cs.append(case("%s_%s_N%d" % (impl, dt, N), impl, dt, N, B, H, phases=full))
    if not args.quick and not args.no_16k:
        cs.append(case("ours_sinkhorn_bf16_N%d" % Nbig, "ours_sinkhorn", "bf16", Nbig, B, H, phases=full))
        cs.append(case("ours_softmax_bf16_N%d" % Nbig, "ours_softmax", "bf16", Nbig, B, H, phases=full))
        cs.append(case("sdpa_bf16_N%d" % Nbig, "sdpa", "bf16", Nbig, B, H, phases=full))
    if not args.no_compile:
        for N in reversed(Ns):
            cs.append(case("compiled_bf16_N%d" % N, "compiled", "bf16", N, B, H, phases=comp))
    if not args.quick:
        for N in Ns:
            cs.append(case("sdpa_fp32_N%d" % N, "sdpa", "fp32", N, B, H, phases=full))
        if not args.no_compile:
            for N in reversed(Ns):
                cs.append(case("compiled_fp32_N%d" % N, "compiled", "fp32", N, B, H, phases=comp))
    return cs


# ---------------------------------------------------------------------------
# Worker (imports torch; runs cases; appends JSON lines to the state file)
# ---------------------------------------------------------------------------
class Worker:
    def __init__(self, args, cases):
        import torch
        self.torch = torch
        self.args = args
        self.cases = cases
        self.dev = torch.device(args.device)
        self.cuda = self.dev.type == "cuda"
        self.t0 = args._t0
        self.deadline = self.t0 + args.budget_s
        self.compile_est = 40.0     # prior for one torch.compile case (cold cache), refined after one
        self.state = open(args._state, "a")
        self._bt = self._sf = None

    # -- state file --------------------------------------------------------
    def emit(self, rec):
        self.state.write(json.dumps(rec) + "\n")
        self.state.flush()
        os.fsync(self.state.fileno())

    # -- helpers -----------------------------------------------------------
    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def clean(self):
        import gc
        gc.collect()
        if self.cuda:
            try:
                self.torch.cuda.synchronize()
                self.torch.cuda.empty_cache()
            except Exception:
                pass

    def cuda_ok(self):
        if not self.cuda:
            return True
        torch = self.torch
        try:
            torch.cuda.synchronize()
            x = torch.ones(4, device=self.dev)
            return float((x + 1).sum().item()) == 8.0
        except Exception:
            return False

    def dt(self, name):
        t = self.torch
        if self.args._bf16_as_fp32 and name in ("bf16", "fp16"):
            return t.float32        # CPU dry run of the logic only
        return {"bf16": t.bfloat16, "fp16": t.float16, "fp32": t.float32}[name]

    def bt(self):
        if self._bt is None:
            sys.path.insert(0, os.path.join(REPO, "python"))
            import birkhoff.torch as bt
            self._bt = bt
        return self._bt

    def sf(self):
        if self._sf is None:
            sys.path.insert(0, os.path.join(REPO, "bench", "peers"))
            import sinkformer_torch as sf
            self._sf = sf
        return self._sf

    def inputs(self, c, dtype, requires_grad=True, seed=0):
        torch = self.torch
        gen = torch.Generator(device=self.dev)
        gen.manual_seed(seed)
        shape = (c["B"], c["H"], c["N"], c["d"])
        mk = lambda: torch.randn(shape, generator=gen, device=self.dev, dtype=torch.float32).to(dtype)
        q, k, v, g = mk(), mk(), mk(), mk()
        for t in (q, k, v):
            t.requires_grad_(requires_grad)
        return q, k, v, g

    def meta(self):
        torch = self.torch
        m = {"torch": torch.__version__, "device_type": self.dev.type, "python": sys.version.split()[0],
             "pid": os.getpid(), "BIRKHOFF_LIB": os.environ.get("BIRKHOFF_LIB")}
        try:
            m["cuda_runtime"] = torch.version.cuda
        except Exception:
            pass
        if self.cuda:
            try:
                m["device_name"] = torch.cuda.get_device_name()
                p = torch.cuda.get_device_properties(self.dev)
                m["device_capability"] = "%d.%d" % (p.major, p.minor)
                m["device_sms"] = p.multi_processor_count
                m["device_total_memory_bytes"] = p.total_memory
            except Exception as e:
                m["device_error"] = short_err(e)
            try:
                m["allow_tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
                m["allow_tf32_cudnn"] = bool(torch.backends.cudnn.allow_tf32)
            except Exception:
                pass
            try:
                m["matmul_fp32_precision"] = str(torch.backends.cuda.matmul.fp32_precision)
            except Exception:
                pass
            try:
                m["float32_matmul_precision"] = torch.get_float32_matmul_precision()
            except Exception:
                pass
        try:
            import triton
            m["triton"] = triton.__version__
        except Exception as e:
            m["triton"] = "unavailable (%s)" % short_err(e, 120)
        try:
            sys.path.insert(0, os.path.join(REPO, "python"))
            import birkhoff
            m["birkhoff_library"] = birkhoff.LIBRARY_PATH
            m["birkhoff_version"] = birkhoff.version()
        except Exception as e:
            m["birkhoff_error"] = short_err(e)
        return m

    # -- the functions under test -----------------------------------------
    def make_fn(self, c, note):
        """returns f(q, k, v) -> out"""
        torch = self.torch
        impl, S = c["impl"], c["S"]
        # the C library reads its BK_CUDA_* switches at every call
        for env in VARIANTS.values():
            for key in env:
                os.environ.pop(key, None)
        for suffix, env in VARIANTS.items():
            if impl.endswith(suffix):
                os.environ.update(env)
                note["env"] = dict(env)
                impl = impl[:-len(suffix)]
                break
        if impl == "ours_sinkhorn":
            bt = self.bt()
            return lambda q, k, v: bt.sinkhorn_attention(q, k, v, iters=S, eps=1.0)
        if impl == "ours_softmax":
            bt = self.bt()
            return lambda q, k, v: bt.softmax_attention(q, k, v)
        if impl in ("eager", "compiled"):
            sf = self.sf()
            md = torch.float32 if c["dtype"] == "fp32" else None
            note["marginal_dtype"] = "float32" if md is not None else "input dtype (marginal_dtype=None)"

            def eager_out(q, k, v):
                return sf.attention(q, k, v, S, eps=1.0, marginal_dtype=md)[0]
            if impl == "eager":
                return eager_out
            import torch._dynamo
            torch._dynamo.reset()
            try:
                from torch._dynamo.utils import counters
                counters.clear()
            except Exception:
                pass
            return torch.compile(eager_out)
        if impl == "sdpa":
            import torch.nn.functional as F
            if c["dtype"] != "fp32":
                try:
                    from torch.nn.attention import sdpa_kernel, SDPBackend
                    flash = SDPBackend.FLASH_ATTENTION

                    def f(q, k, v):
                        with sdpa_kernel([flash]):
                            return F.scaled_dot_product_attention(q, k, v)
                    # probe: flash must accept this problem, else fall back to the default choice
                    q, k, v, _ = self.inputs(dict(c, N=min(c["N"], 256)), self.dt(c["dtype"]))
                    f(q, k, v)
                    del q, k, v
                    note["sdpa_backend"] = "flash"
                    return f
                except Exception as e:
                    note["sdpa_backend"] = "default (flash unavailable: %s)" % short_err(e, 200)
            else:
                note["sdpa_backend"] = "default"
            return lambda q, k, v: F.scaled_dot_product_attention(q, k, v)
        raise ValueError("unknown impl %r" % impl)

    # -- timing --------------------------------------------------------------
    def run_phase(self, name, call, warmup, reps, min_reps):
        torch = self.torch
        r = {}
        self.clean()
        base = None
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t = time.perf_counter()
        call()
        self.sync()
        per = time.perf_counter() - t
        r["first_call_s"] = round(per, 4)
        done_w = 1
        while done_w < warmup:
            # the first call may include compilation: always make a second one to know the real cost
            if done_w >= 2 and time.time() + per * (1 + min_reps) > self.deadline:
                r["warmup_cut"] = True
                break
            t = time.perf_counter()
            call()
            self.sync()
            per = time.perf_counter() - t
            done_w += 1
        r["warmup"] = done_w
        r["sync_wall_ms"] = per * 1e3       # one call, launched and synchronised (last warm-up)
        left = self.deadline - time.time()
        n = reps
        if per * reps > PHASE_CAP_S and reps > min_reps:
            # a slow call: no more reps than fit in PHASE_CAP_S, never fewer than min_reps
            n = max(min_reps, int(PHASE_CAP_S / max(per, 1e-9)))
            r["reps_cut"] = "slow call (%.2f s): %d of %d reps" % (per, n, reps)
        if per * n > left:
            n = max(min_reps, int(left / max(per, 1e-9)))
            if per * n > left:
                n = max(1, int(left / max(per, 1e-9)))
            r["reps_cut"] = "budget: %d of %d reps" % (n, reps)
        ms = []
        if self.cuda:
            evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            stream = torch.cuda.current_stream()
            sleep = getattr(torch.cuda, "_sleep", None)
            if sleep is not None:
                # a ~50 ms GPU spin ahead of the reps: the CPU enqueues them meanwhile, so the
                # events time the GPU work back to back, not the Python launch overhead (a call
                # that synchronises inside still pays it)
                try:
                    sleep(int(1e8))
                    r["queued_behind_sleep"] = True
                except Exception:
                    pass
            for a, b in evs:
                a.record(stream)
                call()
                b.record(stream)
            torch.cuda.synchronize()
            ms = [a.elapsed_time(b) for a, b in evs]
        else:
            for _ in range(n):
                t = time.perf_counter()
                call()
                ms.append((time.perf_counter() - t) * 1e3)
        r["reps"] = n
        r["ms_median"] = statistics.median(ms)
        r["ms_min"] = min(ms)
        r["ms_max"] = max(ms)
        if len(ms) >= 4:
            qs = statistics.quantiles(ms, n=4)
            r["ms_p25"], r["ms_p75"] = qs[0], qs[2]
        if self.cuda:
            peak = torch.cuda.max_memory_allocated()
            r["peak_mem_bytes"] = peak
            r["peak_mem_above_inputs_bytes"] = peak - base
            try:
                # allocations outside torch's caching allocator show up here, not in the peak
                free, total = torch.cuda.mem_get_info()
                r["device_used_bytes_after"] = total - free
                r["torch_reserved_bytes_after"] = torch.cuda.memory_reserved()
            except Exception:
                pass
        return r

    def run_case(self, c):
        torch = self.torch
        res = dict(c)
        res["phases_result"] = {}
        note = {}
        res["notes"] = note
        if c["impl"] == "check":
            return self.run_check(c, res)
        warmup = c.get("warmup", self.args.warmup)
        reps = c.get("reps", self.args.reps)
        min_reps = min(c.get("min_reps", 10), reps)
        try:
            fn = self.make_fn(c, note)
            q, k, v, g = self.inputs(c, self.dt(c["dtype"]))
        except Exception as e:
            res["status"] = "OOM" if is_oom(e) else "error"
            res["error"] = "setup: " + short_err(e)
            return res

        def fwd():
            fn(q, k, v)

        def fwd_nograd():
            with torch.no_grad():
                fn(q, k, v)

        def fwdbwd():
            out = fn(q, k, v)
            torch.autograd.grad(out, (q, k, v), g)

        calls = {"fwd": fwd, "fwd_nograd": fwd_nograd, "fwdbwd": fwdbwd}
        failed = None
        for ph in c["phases"]:
            if failed is not None:
                res["phases_result"][ph] = {"skipped": "fwd failed (%s)" % failed}
                continue
            if time.time() > self.deadline:
                res["phases_result"][ph] = {"skipped": "budget exhausted"}
                continue
            try:
                pr = self.run_phase(ph, calls[ph], warmup, reps, min_reps)
            except Exception as e:
                pr = {"status": "OOM" if is_oom(e) else "error", "error": short_err(e)}
                if is_oom(e) and self.cuda:
                    try:
                        pr["peak_mem_bytes_before_oom"] = torch.cuda.max_memory_allocated()
                    except Exception:
                        pass
                if ph == "fwd":
                    failed = pr["status"]
                res["phases_result"][ph] = pr
                if not self.cuda_ok():
                    res["poisoned"] = True
                    break
                continue
            res["phases_result"][ph] = pr
            if c["impl"] == "compiled" and ph == "fwd":
                self.compile_est = max(10.0, pr["first_call_s"] * 1.25)
                try:
                    from torch._dynamo.utils import counters
                    note["dynamo_unique_graphs"] = int(counters["stats"]["unique_graphs"])
                    note["dynamo_graph_breaks"] = int(sum(counters["graph_break"].values()))
                except Exception:
                    pass
        if c.get("validate") and not res.get("poisoned") and "ms_median" in res["phases_result"].get("fwdbwd", {}):
            try:
                out = fn(q, k, v)
                grads = torch.autograd.grad(out, (q, k, v), g)
                self.sync()
                note["validate"] = {
                    "out_finite": bool(torch.isfinite(out).all().item()),
                    "grads_finite": all(bool(torch.isfinite(x).all().item()) for x in grads),
                    "out_absmax": float(out.float().abs().max().item()),
                    "grad_absmax": [float(x.float().abs().max().item()) for x in grads]}
                del out, grads
            except Exception as e:
                note["validate"] = {"error": short_err(e)}
        st = [p.get("status", "ok") for p in res["phases_result"].values() if "skipped" not in p]
        if not st:
            res["status"] = "skipped"
        elif all(s == "ok" for s in st):
            res["status"] = "ok"
        elif st[0] == "OOM":
            res["status"] = "OOM"
        elif any(s == "ok" for s in st):
            res["status"] = "partial (" + ", ".join(sorted(set(s for s in st if s != "ok"))) + ")"
        else:
            res["status"] = "error"
        return res

    def run_check(self, c, res):
        """accuracy of ours against the eager reference port at one small shape"""
        torch = self.torch
        import torch.nn.functional as F
        out = {}
        res["checks"] = out
        S = c["S"]

        def cmp(a, b):
            a, b = a.detach().float(), b.detach().float()
            m = float((a - b).abs().max().item())
            s = float(b.abs().max().item())
            return {"max_abs": m, "rel": m / s if s > 0 else None}

        def run(fn, q, k, v, g):
            o = fn(q, k, v)
            gr = torch.autograd.grad(o, (q, k, v), g)
            return [o] + list(gr)

        def compare(name, got, ref):
            out[name] = {n: cmp(a, b) for n, a, b in zip(("out", "dq", "dk", "dv"), got, ref)}

        try:
            sf = self.sf()
            q, k, v, g = self.inputs(c, self.torch.float32)
            r32 = run(lambda a, b, cc: sf.attention(a, b, cc, S, eps=1.0)[0], q, k, v, g)
            rnd = [x.detach().bfloat16().float().requires_grad_() for x in (q, k, v)]
            gb = g.bfloat16().float()
            rb = run(lambda a, b, cc: sf.attention(a, b, cc, S, eps=1.0)[0], *rnd, gb)
            rsm = run(lambda a, b, cc: sf.softmax_attention(a, b, cc)[0], *rnd, gb)
        except Exception as e:
            res["status"] = "error"
            res["error"] = "reference: " + short_err(e)
            return res
        qb, kb, vb = [x.detach().bfloat16().requires_grad_() for x in (q, k, v)]
        gbf = g.bfloat16()
        trials = [
            ("ours_sinkhorn_fp32_vs_eager_fp32", lambda: run(
                lambda a, b, cc: self.bt().sinkhorn_attention(a, b, cc, iters=S, eps=1.0), q, k, v, g), r32),
            ("ours_sinkhorn_bf16_vs_eager_fp32_on_bf16_inputs", lambda: run(
                lambda a, b, cc: self.bt().sinkhorn_attention(a, b, cc, iters=S, eps=1.0), qb, kb, vb, gbf), rb),
            ("ours_softmax_bf16_vs_eager_softmax_fp32_on_bf16_inputs", lambda: run(
                lambda a, b, cc: self.bt().softmax_attention(a, b, cc), qb, kb, vb, gbf), rsm),
            ("sdpa_bf16_vs_eager_softmax_fp32_on_bf16_inputs", lambda: run(
                lambda a, b, cc: F.scaled_dot_product_attention(a, b, cc), qb, kb, vb, gbf), rsm),
        ]
        nok = 0
        for name, f, ref in trials:
            try:
                compare(name, f(), ref)
                nok += 1
            except Exception as e:
                out[name] = {"error": short_err(e)}
                if not self.cuda_ok():
                    res["poisoned"] = True
                    break
        res["status"] = "ok" if nok == len(trials) else ("partial" if nok else "error")
        return res

    # -- main loop ----------------------------------------------------------
    def main(self, start):
        if start == 0 or not self.args._meta_done:
            self.emit({"type": "meta", "meta": self.meta()})
        for i in range(start, len(self.cases)):
            c = self.cases[i]
            now = time.time()
            if now > self.deadline:
                self.emit({"type": "result", "i": i, "result": dict(c, status="skipped",
                                                                    error="budget exhausted")})
                continue
            if c["impl"] == "compiled" and self.deadline - now < self.compile_est + 5:
                self.emit({"type": "result", "i": i, "result": dict(
                    c, status="skipped", error="budget: %.0f s left < compile estimate %.0f s + 5"
                    % (self.deadline - now, self.compile_est))})
                continue
            self.emit({"type": "start", "i": i, "id": c["id"]})
            log("[%6.1fs] %-28s ..." % (now - self.t0, c["id"]))
            hook = os.environ.get("BK_BENCH_TEST_CRASH")
            if hook and hook == c["id"]:
                os.kill(os.getpid(), signal.SIGSEGV)
            hook = os.environ.get("BK_BENCH_TEST_HANG")
            if hook and hook == c["id"]:
                time.sleep(3600)
            hook = os.environ.get("BK_BENCH_TEST_POISON")
            t = time.time()
            try:
                res = self.run_case(c)
            except Exception as e:
                res = dict(c, status="OOM" if is_oom(e) else "error", error=short_err(e),
                           traceback=traceback.format_exc()[-2000:])
            if hook and hook == c["id"]:
                res["poisoned"] = True
            res["case_wall_s"] = round(time.time() - t, 3)
            self.emit({"type": "result", "i": i, "result": res})
            log("[%6.1fs] %-28s %s%s" % (time.time() - self.t0, c["id"], res.get("status"),
                                         describe_phases(res)))
            self.clean()
            if res.get("poisoned") or not self.cuda_ok():
                log("CUDA context unusable after %s: restarting the worker" % c["id"])
                return EXIT_POISONED
        return 0


def describe_phases(res):
    parts = []
    for ph, pr in (res.get("phases_result") or {}).items():
        if "ms_median" in pr:
            parts.append("%s %.3f ms" % (ph, pr["ms_median"]))
        elif "skipped" in pr:
            parts.append("%s skipped" % ph)
        else:
            parts.append("%s %s" % (ph, pr.get("status", "?")))
    if res.get("error"):
        parts.append(res["error"][:160])
    return (": " + "; ".join(parts)) if parts else ""


def worker_entry(args, cases):
    try:
        import torch
    except Exception as e:
        log("SKIP: no CUDA device (torch not importable: %s)" % short_err(e, 120))
        return EXIT_SKIP
    if args.device == "cuda" and not torch.cuda.is_available():
        log("SKIP: no CUDA device")
        return EXIT_SKIP
    w = Worker(args, cases)
    return w.main(args._start)


# ---------------------------------------------------------------------------
# Supervisor (no torch)
# ---------------------------------------------------------------------------
def read_state(path):
    meta, results, started = None, {}, []
    try:
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue      # a torn last line of a killed worker
                if r.get("type") == "meta":
                    meta = meta or r["meta"]
                elif r.get("type") == "result":
                    results[r["i"]] = r["result"]
                elif r.get("type") == "start":
                    started.append(r["i"])
    except OSError:
        pass
    return meta, results, started


def out_paths(args, default_name):
    out = args.out
    if not out:
        d = os.environ.get("OUT")
        out = os.path.join(d, default_name) if d else default_name
    base, ext = os.path.splitext(out)
    md = (base if ext.lower() == ".json" else out) + ".md"
    return out, md


def select_cases(spec, args):
    cases = spec["cases"](args)
    if args.only:
        import re
        rx = re.compile(args.only)
        cases = [c for c in cases if rx.search(c["id"])]
    return cases


def supervise(spec, args, script):
    t0 = time.time()
    cases = select_cases(spec, args)
    out, md_path = out_paths(args, spec["default_out"])
    hard = args.budget_s + args.grace_s
    fd, state = tempfile.mkstemp(prefix="bk_cuda_bench_", suffix=".jsonl")
    os.close(fd)
    if args.lib:
        os.environ["BIRKHOFF_LIB"] = os.path.abspath(args.lib)
    log("%s: %d cases, soft budget %.0f s, hard stop %.0f s, out %s" % (
        spec["name"], len(cases), args.budget_s, hard, out))
    extra = {}          # i -> supervisor-made result (crash, timeout)
    restarts = []
    start = 0
    passthrough = [a for a in sys.argv[1:]]
    meta_done = False
    while start < len(cases):
        left = t0 + hard - time.time()
        if left < 3 or (restarts and t0 + args.budget_s - time.time() < 8):
            break
        cmd = [sys.executable, script] + passthrough + [
            "--_worker", "--_state", state, "--_start", str(start), "--_t0", repr(t0)]
        if meta_done:
            cmd.append("--_meta-done")
        p = subprocess.Popen(cmd, start_new_session=True)
        try:
            rc = p.wait(timeout=left)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
            rc = "hard-timeout"
        if rc == EXIT_SKIP:
            try:
                os.unlink(state)
            except OSError:
                pass
            return 0
        meta, results, started = read_state(state)
        meta_done = meta is not None
        if rc == 0:
            break
        pending = [i for i in started if i not in results and i not in extra]
        if rc == "hard-timeout":
            why = "killed: still running at the hard stop (%.0f s)" % hard
        elif rc == EXIT_POISONED:
            why = None
        elif isinstance(rc, int) and rc < 0:
            why = "worker died with signal %d" % -rc
        else:
            why = "worker exited with status %s" % rc
        restarts.append({"rc": rc, "at_s": round(time.time() - t0, 1), "pending": pending})
        if why:
            for i in pending:
                extra[i] = dict(cases[i], status="error" if rc != "hard-timeout" else "timeout", error=why)
                log("[%6.1fs] %-28s %s" % (time.time() - t0, cases[i]["id"], why))
        done = set(results) | set(extra)
        nxt = [i for i in range(len(cases)) if i not in done]
        if rc == "hard-timeout" or not nxt or len(restarts) > 6:
            break
        start = nxt[0]
        log("restarting the worker at case %d (%s)" % (start, cases[start]["id"]))
    meta, results, _ = read_state(state)
    final = []
    for i, c in enumerate(cases):
        r = results.get(i) or extra.get(i)
        if r is None:
            r = dict(c, status="skipped", error="not run (budget or worker stop)")
        final.append(r)
    doc = {"script": spec["name"], "command": " ".join([os.path.relpath(script, REPO)] + sys.argv[1:]),
           "meta": meta or {}, "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
           "counting_rule": COUNTING_RULE, "timing": TIMING_NOTE,
           "peaks": {"bf16_tflops": PEAK_BF16_TFLOPS, "fp32_tflops": PEAK_FP32_TFLOPS,
                     "tf32_tflops": PEAK_TF32_TFLOPS, "exp_per_s": PEAK_EXP_PER_S},
           "cases": final, "worker_restarts": restarts}
    for c in final:
        add_rates(c)
    doc.update(spec["summarize"](final))
    doc["elapsed_s"] = round(time.time() - t0, 2)
    text = spec["markdown"](doc)
    log("")
    log(text)
    try:
        d = os.path.dirname(os.path.abspath(out))
        os.makedirs(d, exist_ok=True)
        with open(out, "w") as f:
            json.dump(doc, f, indent=1)
        with open(md_path, "w") as f:
            f.write(text + "\n")
        log("wrote %s and %s (%.1f s)" % (out, md_path, time.time() - t0))
    except OSError as e:
        log("could not write results: %s" % short_err(e))
    try:
        os.unlink(state)
    except OSError:
        pass
    return 0


# ---------------------------------------------------------------------------
# Metrics and reports (pure Python)
# ---------------------------------------------------------------------------
def ms(c, ph):
    pr = (c.get("phases_result") or {}).get(ph) or {}
    return pr.get("ms_median")


def add_rates(c):
    if c.get("impl") == "check" or "N" not in c:
        return
    BH, N, d, S = c["B"] * c["H"], c["N"], c["d"], c["S"]
    if c["impl"] in SINKHORN_IMPLS:
        flops, exps = (S * 2 * N * N * d + 2 * N * N * d) * BH, S * N * N * BH
    else:
        flops, exps = 4 * N * N * d * BH, N * N * BH
    c["fwd_flops"], c["fwd_exps"] = flops, exps
    t = ms(c, "fwd")
    if t:
        peak = PEAK_FP32_TFLOPS if c["dtype"] == "fp32" else PEAK_BF16_TFLOPS
        tf = flops / (t * 1e-3) / 1e12
        c["fwd_tflops"] = tf
        c["fwd_tflops_pct_peak"] = 100.0 * tf / peak
        c["fwd_exp_per_s"] = exps / (t * 1e-3)
        c["fwd_exp_pct_mufu"] = 100.0 * c["fwd_exp_per_s"] / PEAK_EXP_PER_S


def find(cases, impl, dtype, N):
    for c in cases:
        if c.get("impl") == impl and c.get("dtype") == dtype and c.get("N") == N:
            return c
    return None


def ratio(cases, num, den, label, floor=None, goal=None):
    """num/den = (impl, dtype, N, phase); floor = ('>=' | '<=', value)"""
    a, b = find(cases, *num[:3]), find(cases, *den[:3])
    if a is None or b is None:
        return None       # a case not in this run's list: no row
    r = {"label": label, "N": num[2], "num": "%s %s N=%d %s" % num, "den": "%s %s N=%d %s" % den}
    va = ms(a, num[3]) if a else None
    vb = ms(b, den[3]) if b else None
    r["num_ms"], r["den_ms"] = va, vb
    if va and vb:
        r["value"] = va / vb
    else:
        miss = []
        for tag, cc, v in (("num", a, va), ("den", b, vb)):
            if not v:
                miss.append("%s %s" % (tag, (cc or {}).get("status", "absent") if cc else "absent"))
        r["value"] = None
        r["missing"] = ", ".join(miss)
    if floor:
        r["floor"] = "%s %g" % floor
        if r["value"] is None:
            r["verdict"] = "n/a"
        else:
            ok = r["value"] >= floor[1] if floor[0] == ">=" else r["value"] <= floor[1]
            r["verdict"] = "PASS" if ok else "FAIL"
    if goal is not None:
        r["goal"] = goal
    return r


def bench_summarize(cases):
    Ns = sorted(set(c["N"] for c in cases if c.get("impl") == "ours_sinkhorn"))
    main_Ns = [n for n in Ns if n <= 4096] or Ns[:2]
    R = []
    for N in Ns:
        fl = N in main_Ns
        for peer, dt, ph in (("eager", "bf16", "fwdbwd"), ("eager", "bf16", "fwd"), ("eager", "fp32", "fwdbwd"),
                             ("eager", "fp32", "fwd"), ("compiled", "bf16", "fwdbwd"), ("compiled", "bf16", "fwd"),
                             ("compiled", "fp32", "fwdbwd")):
            floor = (">=", 10) if fl and (peer, dt, ph) == ("eager", "bf16", "fwdbwd") else None
            R.append(ratio(cases, (peer, dt, N, ph), ("ours_sinkhorn", dt, N, ph),
                           "%s/ours %s %s" % (peer, dt, "fwd+bwd" if ph == "fwdbwd" else "fwd"), floor))
        R.append(ratio(cases, ("ours_sinkhorn", "bf16", N, "fwd"), ("sdpa", "bf16", N, "fwd"),
                       "ours_fwd/sdpa_fwd bf16", ("<=", 6) if N == 4096 else None,
                       3.5 if N == 4096 else None))
        R.append(ratio(cases, ("ours_sinkhorn", "bf16", N, "fwd_nograd"), ("sdpa", "bf16", N, "fwd_nograd"),
                       "ours_fwd/sdpa_fwd bf16, no grad"))
        R.append(ratio(cases, ("ours_sinkhorn", "bf16", N, "fwdbwd"), ("sdpa", "bf16", N, "fwdbwd"),
                       "ours_fwdbwd/sdpa_fwdbwd bf16"))
        for ph in ("fwd", "fwdbwd"):
            R.append(ratio(cases, ("ours_sinkhorn_dpass", "bf16", N, ph), ("ours_sinkhorn", "bf16", N, ph),
                           "D by a pass / D from the tape's output, Sinkhorn %s bf16" % ph))
            R.append(ratio(cases, ("ours_softmax_dpass", "bf16", N, ph), ("ours_softmax", "bf16", N, ph),
                           "D by a pass / D from the tape's output, softmax %s bf16" % ph))
            for v, what in (("_prev", "ordinary launches, blocks an SM as before"), ("_nopdl", "ordinary launches"),
                            ("_pdl2", "launches at the predecessor's start"), ("_dv3", "dV at 3 blocks"),
                            ("_grad3", "dQ and dK at 3 blocks")):
                R.append(ratio(cases, ("ours_sinkhorn" + v, "bf16", N, ph), ("ours_sinkhorn", "bf16", N, ph),
                               "%s / now, Sinkhorn %s bf16" % (what, ph)))
            R.append(ratio(cases, ("ours_softmax_nopdl", "bf16", N, ph), ("ours_softmax", "bf16", N, ph),
                           "ordinary launches / now, softmax %s bf16" % ph))
            R.append(ratio(cases, ("ours_sinkhorn_wmma", "bf16", N, ph), ("ours_sinkhorn", "bf16", N, ph),
                           "wmma kernels / mma.sync kernels, Sinkhorn %s bf16" % ph))
            R.append(ratio(cases, ("ours_softmax_wmma", "bf16", N, ph), ("ours_softmax", "bf16", N, ph),
                           "wmma kernels / mma.sync kernels, softmax %s bf16" % ph))
        R.append(ratio(cases, ("ours_softmax", "bf16", N, "fwd"), ("sdpa", "bf16", N, "fwd"),
                       "ours_softmax_fwd/sdpa_fwd bf16", ("<=", 1.5) if N == 4096 else None))
        R.append(ratio(cases, ("ours_softmax", "bf16", N, "fwdbwd"), ("sdpa", "bf16", N, "fwdbwd"),
                       "ours_softmax_fwdbwd/sdpa_fwdbwd bf16"))
        R.append(ratio(cases, ("ours_sinkhorn", "fp32", N, "fwd"), ("ours_sinkhorn", "bf16", N, "fwd"),
                       "ours fp32/bf16 fwd"))
    return {"ratios": [r for r in R if r is not None]}


def fnum(x, fmt="%.3f"):
    return "-" if x is None else fmt % x


def mib(x):
    return "-" if x is None else "%.0f" % (x / 2 ** 20)



def status_text(c, P, limit):
    """a case's status and its phases' errors or skips, cut to limit characters"""
    stat = c.get("status", "?")
    errs = [("%s: %s" % (ph, pr.get("error") or pr.get("skipped"))) for ph, pr in P.items()
            if pr.get("error") or pr.get("skipped")]
    if c.get("error"):
        errs.insert(0, c["error"])
    if errs:
        stat += " — " + "; ".join(errs)[:limit]
    return stat

def case_row(c):
    P = c.get("phases_result") or {}
    pk = None
    for ph in ("fwdbwd", "fwd"):
        pr = P.get(ph) or {}
        if pr.get("peak_mem_bytes") is not None:
            pk = pr["peak_mem_bytes"]
            break
    stat = status_text(c, P, 220)
    for ph, pr in P.items():
        if pr.get("reps_cut"):
            stat += " [%s %s]" % (ph, pr["reps_cut"])
    nt = c.get("notes") or {}
    if "first_call_s" in (P.get("fwd") or {}) and c.get("impl") == "compiled":
        stat += " [compile+first call %.1f s, graphs %s, breaks %s]" % (
            P["fwd"]["first_call_s"], nt.get("dynamo_unique_graphs", "?"), nt.get("dynamo_graph_breaks", "?"))
    if nt.get("sdpa_backend") and nt["sdpa_backend"] != "flash" and c.get("dtype") != "fp32":
        stat += " [sdpa backend: %s]" % nt["sdpa_backend"][:120]
    if nt.get("validate"):
        stat += " [validate: %s]" % json.dumps(nt["validate"])[:200]
    return "| %s | %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        c["id"], c["impl"], c["dtype"], c["N"], fnum(ms(c, "fwd")), fnum(ms(c, "fwd_nograd")),
        fnum(ms(c, "fwdbwd")), mib(pk), fnum(c.get("fwd_tflops"), "%.1f"),
        fnum(c.get("fwd_tflops_pct_peak"), "%.1f%%"),
        fnum(c.get("fwd_exp_per_s") / 1e9 if c.get("fwd_exp_per_s") else None, "%.0f"),
        fnum(c.get("fwd_exp_pct_mufu"), "%.1f%%"), stat.replace("|", "/"))


TABLE_HEAD = ("| case | impl | dtype | N | fwd ms | fwd no-grad ms | fwd+bwd ms | peak MiB (fwd+bwd, else fwd) "
              "| fwd TFLOP/s | % peak | fwd Gexp/s | % MUFU | status |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def md_header(doc, title):
    m = doc.get("meta") or {}
    lines = ["# %s" % title, "",
             "device: %s (cc %s, %s SMs); torch %s, CUDA %s, triton %s; birkhoff library %s" % (
                 m.get("device_name", "?"), m.get("device_capability", "?"), m.get("device_sms", "?"),
                 m.get("torch", "?"), m.get("cuda_runtime", "?"), m.get("triton", "?"),
                 m.get("birkhoff_library", m.get("birkhoff_error", "?"))),
             "command: `python3 %s`; elapsed %.1f s; worker restarts: %d" % (
                 doc["command"], doc.get("elapsed_s", 0), len(doc.get("worker_restarts", []))), ""]
    return lines


def checks_md(cases):
    lines = []
    for c in cases:
        if c.get("impl") != "check":
            continue
        lines.append("## Accuracy check (%s: B=%d, H=%d, N=%d, d=%d, S=%d; max |a-b| / max |ref|)" % (
            c["id"], c["B"], c["H"], c["N"], c["d"], c["S"]))
        lines.append("")
        if c.get("error"):
            lines.append("error: %s" % c["error"])
        lines.append("| comparison | out | dq | dk | dv |")
        lines.append("|---|---|---|---|---|")
        for name, r in (c.get("checks") or {}).items():
            if "error" in r:
                lines.append("| %s | error: %s | | | |" % (name, r["error"][:160].replace("|", "/")))
            else:
                lines.append("| %s | %s |" % (name, " | ".join(
                    "%.2e" % (r[k]["rel"] if r[k]["rel"] is not None else float("nan")) for k in
                    ("out", "dq", "dk", "dv"))))
        lines.append("")
    return lines


def bench_markdown(doc):
    cases = doc["cases"]
    L = md_header(doc, "birkhoff CUDA attention benchmark (B*H = %s, d = 64, S = 5, eps = 1)" % (
        ", ".join(sorted(set(str(c["B"] * c["H"]) for c in cases if c.get("impl") not in ("check",))))))
    L += checks_md(cases)
    L += ["## Times", "", TIMING_NOTE, "",
          TABLE_HEAD]
    L += [case_row(c) for c in cases if c.get("impl") != "check"]
    L += ["", "## Ratios", "", "| N | ratio | value | floor | verdict | goal | numerator ms | denominator ms |",
          "|---|---|---|---|---|---|---|---|"]
    for r in doc.get("ratios", []):
        L.append("| %d | %s | %s | %s | %s | %s | %s | %s |" % (
            r["N"], r["label"], fnum(r["value"], "%.2f") if r["value"] is not None else "- (%s)" % r.get(
                "missing", ""), r.get("floor", ""), r.get("verdict", ""),
            "" if r.get("goal") is None else "%g" % r["goal"], fnum(r["num_ms"]), fnum(r["den_ms"])))
    L += ["", "Counting rule: " + COUNTING_RULE]
    return "\n".join(L)


BENCH_SPEC = dict(name="cuda_bench", default_out="bench.json", cases=bench_cases,
                  summarize=bench_summarize, markdown=bench_markdown)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------
def parser(description, budget, grace, reps):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=None, help="JSON output (default $OUT/<name>.json or ./<name>.json); "
                   "markdown beside it with .md")
    p.add_argument("--quick", action="store_true", help="fewer cases")
    p.add_argument("--budget-s", type=float, default=budget, help="soft time budget in seconds (default %(default)s)")
    p.add_argument("--grace-s", type=float, default=grace,
                   help="the worker is killed this long after the soft budget (default %(default)s)")
    p.add_argument("--reps", type=int, default=None, help="timed reps per phase (default %d, quick 10)" % reps)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-16k", action="store_true", help="skip the N=16384 cases")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile cases")
    p.add_argument("--lib", default=None, help="path of libbirkhoff.so (sets BIRKHOFF_LIB)")
    p.add_argument("--only", default=None, help="run only the cases whose id matches this regular expression")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)       # cpu: dry run of the logic
    p.add_argument("--_tiny", action="store_true", help=argparse.SUPPRESS)   # tiny shapes (dry run)
    p.add_argument("--_bf16-as-fp32", dest="_bf16_as_fp32", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--_state", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--_t0", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--_meta-done", dest="_meta_done", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(_default_reps=reps)
    return p


def entry(spec, script, description, budget, grace, reps):
    args = parser(description, budget, grace, reps).parse_args()
    if args.reps is None:
        args.reps = 10 if args.quick else args._default_reps
    args.reps = max(1, args.reps)
    args.warmup = max(1, args.warmup)
    if args._worker:
        if args._t0 is None:
            args._t0 = time.time()
        cases = select_cases(spec, args)
        try:
            return worker_entry(args, cases)
        except Exception as e:
            log("worker failed: %s" % short_err(e, 1000))
            traceback.print_exc()
            return 1
    return supervise(spec, args, os.path.abspath(script))


if __name__ == "__main__":
    sys.exit(entry(BENCH_SPEC, __file__, "CUDA benchmark of birkhoff attention vs PyTorch peers",
                   budget=115.0, grace=22.0, reps=15))
