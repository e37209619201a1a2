#!/usr/bin/python3
"""PyTorch peer benchmark on the CPU: softmax, Sinkformer, ESPFormer, LOTFormer, OTK embedding,
ASAP (frozen-layer inference).

Usage:
  /usr/bin/python3 bench/peers/torch_peer.py --op softmax|sinkhorn|esp|lot|otk|asap \
      --cases "BH:N:d[:S],..." --threads T --reps R --warmup W [--json]
      [--no-isolate] [--flush-denormal] [--fixed-mmap-threshold]
      [--esp-t t] [--esp-temperature T]
      [--lot-r r] [--lot-iters T] [--lot-eps E] [--lot-temp t]
      [--otk-k k] [--otk-p p] [--otk-q q] [--otk-eps E] [--otk-iters L]
      [--otk-sigma s] [--asap-slices L]

Each case is B=1, H=BH heads of N x N self-attention with head dim d (dv = d)
and S Sinkhorn half-steps (sinkhorn only, required there; ignored otherwise).
q, k, v are float32 [1, BH, N, d] N(0,1) tensors with requires_grad.
softmax/sinkhorn use the reference-faithful port in sinkformer_torch.py
(scale d^-1/2, eps = 1, float32 marginals, increment update, per-half-step
early-stop check with thresh 1e-12, autograd through the unrolled loop).
esp uses the reference-faithful port esp_reference in espformer_torch.py
(soft sort, SoftSort t = 1e-3 and temperature 10 unless --esp-t and
--esp-temperature say otherwise, axis-aligned slices L = d,
dense [BH, L, N, N] soft permutations and plans, autograd).
lot uses the reference-faithful port lot_reference in lotformer_torch.py
(DeiT/Swin variant: r = 32 pivots, T = 5 Sinkhorn half-steps, eps = 1, mass
temperature 0.5 unless --lot-r, --lot-iters, --lot-eps, --lot-temp say
otherwise; pivots Z ~ N(0, 1)/sqrt(d) [BH, r, d] and logits theta = 0 [BH, r],
both learnable (requires_grad, so fwd+bwd computes their gradients too);
float32 marginals, O(N r) plans, autograd through the unrolled loop). Its
JSON rows carry "r", "eps", "pivot_temp", and "S" = T (half-steps).
otk is different (not self-attention): each case "B:N:d[:S]" is a batch of
B = BH sets of N elements of dimension d (S ignored), pooled by
otk_reference in otk_torch.py, the port of the reference OTK code as a user
of it runs it: a CKN Nystrom layer with k trainable anchors W [k, d] (unit
rows, "exp" kernel with sigma, inverse square root regulariser 1e-2, the
code's own backward) followed by OTKernel with q references z [q, p, k]
(the code's uniform(-1/sqrt(p), 1/sqrt(p)) initialisation), scaling-domain
Sinkhorn with eps and L iterations, no mask, no PE; defaults k = 64, p = 10,
q = 5, eps = 0.5, L = 10, sigma = 0.5 (the paper's supervised SCOP setting
with 64 anchors) unless --otk-k, --otk-p, --otk-q, --otk-eps, --otk-iters,
--otk-sigma say otherwise. x is float32 N(0, 1)/sqrt(d) [B, N, d] (rows of
norm about 1); x, z and W require grad, and dout is [B, p, q*k]. Its JSON
rows carry B, "H" = 1, "BH" = B, "k", "p", "q", "eps", "sigma", "eta",
"domain", and "S" = L; saved_bytes_excl_inputs excludes x, z and W.
asap is forward only (a frozen layer at inference): each case "BH:N:d:S" (S,
the teacher's half-steps, is required) times, under torch.no_grad() on
float32 N(0, 1) q, k, v [1, BH, N, d], eps = 1, scale d^-1/2:
  * teacher:   the S-step Sinkformer loop (sinkformer_torch.attention, the
               reference numerics as for --op sinkhorn);
  * sinkhorn3, sinkhorn5: the same loop with S = 3 and S = 5;
  * asap:      ASAP with the teacher's ending, as `birkhoff bench --op asap`
               times it: column-ending for even S (sliced features on L
               slices + 3 log-sum-exp passes + exp + A V), row-ending for odd
               S (2 passes); bench/peers/asap_torch.py;
  * asap0:     ASAP-0 (features + 1 log-sum-exp pass + exp + A V).
The slice bank has L = 32 unit directions (--asap-slices) and omega is random
(timing only: no calibration is run). Its JSON row has, for each method m in
(teacher, sinkhorn3, sinkhorn5, asap, asap0), the fields m_median_s, m_p25_s,
m_p75_s (forward seconds; the key "asap_median_s" is not a suffix match of
"asap0_median_s" or of the plain keys, so tools/bench_asap.c's cli_json_num
look-up of "<m>_median_s" is exact), plus "S" (the teacher's), "L", "eps" and
"asap_variant" ("column" or "row").
The shared fields follow the other ops: fwd_median_s / fwd_p25_s / fwd_p75_s
repeat asap's; fwdbwd_* and saved_bytes* are null (no backward, nothing
saved); peak_rss_delta_bytes is the RSS growth of one ASAP forward (the
method as for the other ops, without the backward).

Measured per case, with time.perf_counter over R repetitions after W
warm-ups (median and 25/75 percentiles, seconds):
  * forward only, under torch.no_grad();
  * forward + backward (out.backward(dout)).
Memory:
  * saved_bytes: the bytes autograd saves for backward, from
    saved_tensors_hooks (sum of numel * element_size over saved tensors, each
    distinct storage counted once, with and without the q/k/v inputs);
  * peak_rss_delta_bytes: the peak resident set size during the first full
    forward + backward at the case's size minus the RSS just before it (after
    the inputs exist and a tiny warm-up call has loaded the kernels). The
    high-water mark is reset first through /proc/self/clear_refs where the
    kernel allows it (peak_rss_method "hwm_reset"), otherwise it is the plain
    ru_maxrss ("maxrss"), which can only over-count the baseline;
  * peak_rss_bytes: the process peak RSS (getrusage).
glibc's default malloc raises its mmap threshold after the first large free,
so later large blocks come from the heap and freed ones stay resident: the
RSS delta then exceeds the live-tensor peak (measured 3-4x the saved bytes
for sinkhorn N=512..1024, against 1.4x with a fixed threshold).
--fixed-mmap-threshold runs the case subprocesses with
MALLOC_MMAP_THRESHOLD_=65536 (large blocks always mmapped and returned), which
brings the delta close to the live peak; use it for memory only: every large
allocation then page-faults afresh and the timings are NOT representative
(sinkhorn BH=4 N=512 S=3 forward: 15 ms -> 250 ms). The JSON key
malloc_mmap_threshold records it.
By default every case runs in a fresh subprocess (python startup + torch
import per case), so the allocator state and peak RSS of one case do not leak
into the next; --no-isolate runs all cases in this process (peak_rss_bytes is
then cumulative and the RSS delta less reliable).

At t = 1e-3 most soft-permutation entries of the esp peer are subnormal;
--flush-denormal calls torch.set_flush_denormal(True) (FTZ/DAZ), which the
reference does not do (default off: the reference's numerics and speed).

--json prints one JSON object per case per line; otherwise a table.
"""

import argparse
import json
import os
import platform
import resource
import sys
import time

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch attention peer benchmark")
    ap.add_argument("--op", required=True, choices=["softmax", "sinkhorn", "esp", "lot", "otk", "asap"])
    ap.add_argument("--cases", required=True,
                    help='comma list of "BH:N:d:S" (sinkhorn, asap) or "BH:N:d[:S]" (S ignored)')
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--no-isolate", action="store_true",
                    help="run all cases in this process instead of one subprocess each")
    ap.add_argument("--flush-denormal", action="store_true",
                    help="torch.set_flush_denormal(True) (not what the reference does)")
    ap.add_argument("--esp-t", type=float, default=1e-3, help="esp: SoftSort temperature")
    ap.add_argument("--esp-temperature", type=float, default=10.0,
                    help="esp: the reference's slice temperature T")
    ap.add_argument("--lot-r", type=int, default=32, help="lot: number of pivots r")
    ap.add_argument("--lot-iters", type=int, default=5, help="lot: Sinkhorn half-steps T")
    ap.add_argument("--lot-eps", type=float, default=1.0, help="lot: entropic eps")
    ap.add_argument("--lot-temp", type=float, default=0.5,
                    help="lot: pivot-mass temperature (p0 = softmax(theta / t))")
    ap.add_argument("--otk-k", type=int, default=64, help="otk: number of Nystrom anchors k")
    ap.add_argument("--otk-p", type=int, default=10, help="otk: supports per reference p")
    ap.add_argument("--otk-q", type=int, default=5, help="otk: number of references q")
    ap.add_argument("--otk-eps", type=float, default=0.5, help="otk: entropic eps")
    ap.add_argument("--otk-iters", type=int, default=10, help="otk: Sinkhorn iterations L")
    ap.add_argument("--otk-sigma", type=float, default=0.5, help="otk: kernel bandwidth sigma")
    ap.add_argument("--asap-slices", type=int, default=32, help="asap: slices L")
    ap.add_argument("--fixed-mmap-threshold", action="store_true",
                    help="run the case subprocesses with MALLOC_MMAP_THRESHOLD_=65536 "
                         "(memory measurement only: distorts the timings)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.threads < 1 or a.reps < 1 or a.warmup < 0:
        ap.error("need --threads >= 1, --reps >= 1, --warmup >= 0")
    if a.asap_slices < 1:
        ap.error("need --asap-slices >= 1")
    if a.lot_r < 1 or a.lot_iters < 1 or not a.lot_eps > 0 or not a.lot_temp > 0:
        ap.error("need --lot-r >= 1, --lot-iters >= 1, --lot-eps > 0, --lot-temp > 0")
    if (min(a.otk_k, a.otk_p, a.otk_q, a.otk_iters) < 1 or not a.otk_eps > 0
            or not a.otk_sigma > 0):
        ap.error("need --otk-k, --otk-p, --otk-q, --otk-iters >= 1, --otk-eps > 0, "
                 "--otk-sigma > 0")
    cases = []
    for item in a.cases.split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        need_s = a.op in ("sinkhorn", "asap")
        if len(parts) != 4 and not (len(parts) == 3 and not need_s):
            ap.error(f"bad case {item!r}: expected BH:N:d:S"
                     + ("" if need_s else " or BH:N:d"))
        try:
            vals = [int(x) for x in parts]
        except ValueError:
            ap.error(f"bad case {item!r}: expected integers")
        if len(vals) == 3:
            vals.append(1)
        bh, n, d, s = vals
        if min(bh, n, d) < 1 or (a.op == "sinkhorn" and s < 1):
            ap.error(f"bad case {item!r}: all fields must be >= 1")
        if a.op == "asap" and s < 2:
            ap.error(f"bad case {item!r}: asap needs a teacher with S >= 2")
        cases.append((bh, n, d, s))
    if not cases:
        ap.error("no cases given")
    a.case_list = cases
    return a


ARGS = parse_args()
# Thread pools are sized when torch (and its OpenMP/BLAS) load: set the
# environment first, then import.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import asap_torch as asap_port  # noqa: E402  (same directory as this script)
import espformer_torch as esp_port  # noqa: E402
import lotformer_torch as lot_port  # noqa: E402
import otk_torch as otk_port  # noqa: E402
import sinkformer_torch as port  # noqa: E402

torch.set_num_threads(ARGS.threads)
if ARGS.flush_denormal:
    torch.set_flush_denormal(True)
try:
    torch.set_num_interop_threads(1)
except RuntimeError:
    pass  # already set (only possible before any parallel work)


OTK_ETA = 1e-2  # the reference's inverse square root regulariser (fixed in its code)


def make_fn(op, S, pivots=None):
    """The timed callable: (q, k, v) -> out [1, BH, N, d].

    pivots: (Z, theta) for lot (shared by every call, tiny warm-up included).
    """
    if op == "softmax":
        return lambda q, k, v: port.softmax_attention(q, k, v)[0]
    if op == "esp":
        return lambda q, k, v: esp_port.esp_reference(
            q, k, v, softsort_t=ARGS.esp_t, temperature=ARGS.esp_temperature)[0]
    if op == "lot":
        Z, theta = pivots
        return lambda q, k, v: lot_port.lot_reference(
            q, k, v, Z, theta, temp=ARGS.lot_temp, n_iter=ARGS.lot_iters, eps=ARGS.lot_eps)
    if op == "otk":
        # (x, z, W) in the places of (q, k, v)
        return lambda x, z, W: otk_port.otk_reference(
            x, z, W=W, sigma=ARGS.otk_sigma, eta=OTK_ETA, eps=ARGS.otk_eps,
            iters=ARGS.otk_iters, log_domain=False)
    return lambda q, k, v: port.attention(q, k, v, S)[0]


def saved_bytes(fn, q, k, v):
    """Bytes autograd keeps for backward: (all saved, saved minus q/k/v).

    Every tensor packed by saved_tensors_hooks during one forward is recorded
    by its storage; a storage saved several times (or through several views)
    counts once, with the largest numel * element_size seen for it.
    """
    seen = {}

    def pack(t):
        key = t.storage().data_ptr()
        seen[key] = max(seen.get(key, 0), t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(q, k, v)
    del out
    total = sum(seen.values())
    inputs = {t.storage().data_ptr() for t in (q, k, v)}
    return total, total - sum(b for p, b in seen.items() if p in inputs)


def quartiles(ts):
    p25, med, p75 = np.percentile(np.asarray(ts), [25, 50, 75])
    return float(med), float(p25), float(p75)


def peak_rss_bytes():
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) * (1 if sys.platform == "darwin" else 1024)  # KiB on Linux


def _status_kib(field):
    """A 'VmXXX:  N kB' field of /proc/self/status in bytes (None if absent)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_hwm():
    """Reset the kernel's peak-RSS mark to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_delta(fn, q, k, v, dout, warm=None):
    """Peak RSS of one forward + backward minus the RSS just before it.

    A tiny call of the same function first loads and initialises the kernels
    (thread pools, BLAS buffers) without touching much memory; the measured
    call is then the first one at the case's size, so no cached allocator
    blocks from earlier calls hide its footprint. warm: a callable doing that
    tiny call instead of the default one (which slices q, k, v to 4 rows).
    """
    import gc
    if warm is not None:
        warm()
    else:
        m = min(q.shape[2], 4)
        tiny = [t[:, :, :m].detach().clone().requires_grad_(True) for t in (q, k, v)]
        fn(*tiny).backward(dout[:, :, :m])
        del tiny
    gc.collect()
    before = _status_kib("VmRSS")
    method = "hwm_reset" if before is not None and _reset_hwm() else "maxrss"
    if before is None:
        before = 0
    for t in (q, k, v):
        t.grad = None
    fn(q, k, v).backward(dout)
    peak = _status_kib("VmHWM") if method == "hwm_reset" else None
    if peak is None:
        peak = peak_rss_bytes()
        method = "maxrss"
    for t in (q, k, v):
        t.grad = None
    return max(0, peak - before), method


def measurement_fields(reps, warmup, res, sb_all, sb_noinp, rss_delta, rss_method):
    """The JSON fields every op's row shares: timings, memory, environment."""
    return {
        "threads": ARGS.threads, "reps": reps, "warmup": warmup,
        "fwd_median_s": res["fwd"][0], "fwd_p25_s": res["fwd"][1],
        "fwd_p75_s": res["fwd"][2],
        "fwdbwd_median_s": res["fwdbwd"][0], "fwdbwd_p25_s": res["fwdbwd"][1],
        "fwdbwd_p75_s": res["fwdbwd"][2],
        "saved_bytes": sb_all, "saved_bytes_excl_inputs": sb_noinp,
        "peak_rss_bytes": peak_rss_bytes(),
        "peak_rss_delta_bytes": rss_delta, "peak_rss_method": rss_method,
        "isolated": bool(ARGS.child), "flush_denormal": bool(ARGS.flush_denormal),
        "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
        "torch": torch.__version__, "python": platform.python_version(),
    }


def time_fns(fwd, fwd_bwd, reps, warmup):
    """Median and quartiles of forward and forward + backward."""
    res = {}
    for name, f in (("fwd", fwd), ("fwdbwd", fwd_bwd)):
        for _ in range(warmup):
            f()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        res[name] = quartiles(ts)
    return res


def run_case_otk(B, n, d, reps, warmup, seed):
    """otk: B sets of n elements in R^d (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    k, p, q = ARGS.otk_k, ARGS.otk_p, ARGS.otk_q
    x = (torch.randn(B, n, d, generator=g) / d ** 0.5).requires_grad_(True)
    stdv = 1.0 / p ** 0.5                   # OTKernel.reset_parameter
    z = ((torch.rand(q, p, k, generator=g) * 2 - 1) * stdv).requires_grad_(True)
    W = torch.randn(k, d, generator=g)
    W = (W / W.norm(dim=1, keepdim=True)).requires_grad_(True)   # unit anchors
    dout = torch.randn(B, p, q * k, generator=g)
    fn = make_fn("otk", None)
    params = (x, z, W)

    def warm():
        xt = x[:1, :min(n, 4)].detach().clone().requires_grad_(True)
        fn(xt, z, W).backward(dout[:1])
        for t in params:
            t.grad = None

    rss_delta, rss_method = peak_rss_delta(fn, x, z, W, dout, warm=warm)

    def fwd():
        with torch.no_grad():
            fn(x, z, W)

    def fwd_bwd():
        for t in params:
            t.grad = None
        fn(x, z, W).backward(dout)

    res = time_fns(fwd, fwd_bwd, reps, warmup)
    sb_all, sb_noinp = saved_bytes(fn, x, z, W)
    return {
        "peer": "torch", "op": "otk", "B": B, "H": 1, "BH": B, "N": n, "d": d,
        "S": ARGS.otk_iters, "k": k, "p": p, "q": q, "eps": ARGS.otk_eps,
        "sigma": ARGS.otk_sigma, "eta": OTK_ETA, "domain": "scaling",
        **measurement_fields(reps, warmup, res, sb_all, sb_noinp, rss_delta, rss_method),
    }


ASAP_METHODS = ("teacher", "sinkhorn3", "sinkhorn5", "asap", "asap0")


def peak_rss_delta_fwd(fn, warm):
    """Peak RSS of one forward (no backward) minus the RSS just before it;
    warm() first does a tiny call (as peak_rss_delta)."""
    import gc
    warm()
    gc.collect()
    before = _status_kib("VmRSS")
    method = "hwm_reset" if before is not None and _reset_hwm() else "maxrss"
    if before is None:
        before = 0
    fn()
    peak = _status_kib("VmHWM") if method == "hwm_reset" else None
    if peak is None:
        peak = peak_rss_bytes()
        method = "maxrss"
    return max(0, peak - before), method


def run_case_asap(bh, n, d, S, reps, warmup, seed):
    """asap: forward-only timings of the frozen-layer methods (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, bh, n, d, generator=g) for _ in range(3))
    L = ARGS.asap_slices
    theta = asap_port.unit_rows(torch.randn(L, d, generator=g))
    omega = torch.randn(L, generator=g) / L ** 0.5   # random: timing only

    def method(name):
        if name == "teacher":
            return lambda q, k, v: port.attention(q, k, v, S)[0]
        if name in ("sinkhorn3", "sinkhorn5"):
            s = int(name[-1])
            return lambda q, k, v: port.attention(q, k, v, s)[0]
        var = asap_port.auto_variant(S) if name == "asap" else "zero"
        return lambda q, k, v: asap_port.asap(q, k, v, theta, omega, variant=var)[0]

    fns = {m: method(m) for m in ASAP_METHODS}

    def warm():
        m = min(n, 4)
        with torch.no_grad():
            fns["asap"](q[:, :, :m], k[:, :, :m], v[:, :, :m])

    def run_asap():
        with torch.no_grad():
            fns["asap"](q, k, v)

    rss_delta, rss_method = peak_rss_delta_fwd(run_asap, warm)
    fields = {}
    for m in ASAP_METHODS:
        fn = fns[m]

        def fwd(fn=fn):
            with torch.no_grad():
                fn(q, k, v)

        for _ in range(warmup):
            fwd()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fwd()
            ts.append(time.perf_counter() - t0)
        med, p25, p75 = quartiles(ts)
        fields.update({f"{m}_median_s": med, f"{m}_p25_s": p25, f"{m}_p75_s": p75})
    res = {"fwd": (fields["asap_median_s"], fields["asap_p25_s"], fields["asap_p75_s"]),
           "fwdbwd": (None, None, None)}
    return {
        "peer": "torch", "op": "asap", "B": 1, "H": bh, "BH": bh, "N": n, "d": d,
        "S": S, "L": L, "eps": 1.0, "asap_variant": asap_port.auto_variant(S), **fields,
        **measurement_fields(reps, warmup, res, None, None, rss_delta, rss_method),
    }


def run_case(op, bh, n, d, S, reps, warmup, seed):
    if op == "otk":
        return run_case_otk(bh, n, d, reps, warmup, seed)
    if op == "asap":
        return run_case_asap(bh, n, d, S, reps, warmup, seed)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, bh, n, d, generator=g).requires_grad_(True)
               for _ in range(3))
    dout = torch.randn(1, bh, n, d, generator=g)
    pivots = None
    if op == "lot":
        # Reference DeiT/Swin initialisation: Z ~ N(0, 1)/sqrt(d), theta = 0.
        pivots = ((torch.randn(bh, ARGS.lot_r, d, generator=g) / d ** 0.5).requires_grad_(True),
                  torch.zeros(bh, ARGS.lot_r).requires_grad_(True))
    fn = make_fn(op, S, pivots)
    rss_delta, rss_method = peak_rss_delta(fn, q, k, v, dout)

    def fwd():
        with torch.no_grad():
            fn(q, k, v)

    def fwd_bwd():
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).backward(dout)

    res = time_fns(fwd, fwd_bwd, reps, warmup)
    sb_all, sb_noinp = saved_bytes(fn, q, k, v)
    return {
        "peer": "torch", "op": op, "B": 1, "H": bh, "BH": bh, "N": n, "d": d,
        "S": S if op == "sinkhorn" else ARGS.lot_iters if op == "lot" else None,
        **({"softsort_t": ARGS.esp_t, "temperature": ARGS.esp_temperature}
           if op == "esp" else {}),
        **({"r": ARGS.lot_r, "eps": ARGS.lot_eps, "pivot_temp": ARGS.lot_temp}
           if op == "lot" else {}),
        **measurement_fields(reps, warmup, res, sb_all, sb_noinp, rss_delta, rss_method),
    }


def run_isolated(bh, n, d, S):
    """Run one case in a fresh interpreter; returns its JSON row (or raises)."""
    import subprocess
    cmd = [sys.executable, os.path.abspath(__file__), "--op", ARGS.op,
           "--cases", f"{bh}:{n}:{d}:{S}", "--threads", str(ARGS.threads),
           "--reps", str(ARGS.reps), "--warmup", str(ARGS.warmup),
           "--seed", str(ARGS.seed), "--esp-t", repr(ARGS.esp_t),
           "--esp-temperature", repr(ARGS.esp_temperature),
           "--lot-r", str(ARGS.lot_r), "--lot-iters", str(ARGS.lot_iters),
           "--lot-eps", repr(ARGS.lot_eps), "--lot-temp", repr(ARGS.lot_temp),
           "--otk-k", str(ARGS.otk_k), "--otk-p", str(ARGS.otk_p), "--otk-q", str(ARGS.otk_q),
           "--otk-eps", repr(ARGS.otk_eps), "--otk-iters", str(ARGS.otk_iters),
           "--otk-sigma", repr(ARGS.otk_sigma), "--asap-slices", str(ARGS.asap_slices),
           "--json", "--no-isolate", "--child"]
    if ARGS.flush_denormal:
        cmd.append("--flush-denormal")
    env = dict(os.environ)
    if ARGS.fixed_mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    # stderr passes through
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    rows = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or len(rows) != 1:
        raise RuntimeError(f"case {bh}:{n}:{d}:{S} failed in its subprocess "
                           f"(status {p.returncode})")
    return json.loads(rows[0])


def main():
    if not ARGS.json:
        print(f"torch {torch.__version__}, op {ARGS.op}, threads {ARGS.threads}, "
              f"reps {ARGS.reps}, warmup {ARGS.warmup}"
              + (f", t {ARGS.esp_t:g}, T {ARGS.esp_temperature:g}" if ARGS.op == "esp" else "")
              + (f", r {ARGS.lot_r}, T {ARGS.lot_iters}, eps {ARGS.lot_eps:g}, "
                 f"temp {ARGS.lot_temp:g}" if ARGS.op == "lot" else "")
              + (f", k {ARGS.otk_k}, p {ARGS.otk_p}, q {ARGS.otk_q}, eps {ARGS.otk_eps:g}, "
                 f"L {ARGS.otk_iters}, sigma {ARGS.otk_sigma:g} (BH = batch B)"
                 if ARGS.op == "otk" else "")
              + (f", L {ARGS.asap_slices}, eps 1, forward only" if ARGS.op == "asap" else "")
              + (", flush-denormal" if ARGS.flush_denormal else "")
              + ("" if ARGS.no_isolate else ", one process per case"))
        if ARGS.op == "asap":
            print(f"{'BH':>5} {'N':>6} {'d':>4} {'S':>3} | "
                  + " ".join(f"{m + ' ms':>13}" for m in ASAP_METHODS)
                  + f" | {'peak RSS MiB':>12} {'fwd dRSS MiB':>12}")
        else:
            print(f"{'BH':>5} {'N':>6} {'d':>4} {'S':>3} | {'fwd med ms':>10} "
                  f"{'[p25, p75]':>19} | {'f+b med ms':>10} {'[p25, p75]':>19} | "
                  f"{'saved MiB':>9} {'(no qkv)':>9} | {'peak RSS MiB':>12} {'f+b dRSS MiB':>12}")
    status = 0
    for bh, n, d, S in ARGS.case_list:
        if ARGS.no_isolate:
            r = run_case(ARGS.op, bh, n, d, S, ARGS.reps, ARGS.warmup, ARGS.seed)
        else:
            try:
                r = run_isolated(bh, n, d, S)
            except RuntimeError as e:
                print(f"torch_peer: {e}", file=sys.stderr, flush=True)
                status = 1
                continue
        if ARGS.json:
            print(json.dumps(r), flush=True)
        elif ARGS.op == "asap":
            print(f"{bh:>5} {n:>6} {d:>4} {S:>3} | "
                  + " ".join(f"{r[m + '_median_s'] * 1e3:13.3f}" for m in ASAP_METHODS)
                  + f" | {r['peak_rss_bytes'] / (1 << 20):12.1f}"
                  f" {r['peak_rss_delta_bytes'] / (1 << 20):12.2f}", flush=True)
        else:
            ms = 1e3
            mib = 1.0 / (1 << 20)
            s_col = (S if ARGS.op == "sinkhorn" else ARGS.lot_iters if ARGS.op == "lot"
                     else ARGS.otk_iters if ARGS.op == "otk" else "-")
            print(f"{bh:>5} {n:>6} {d:>4} {s_col:>3} | "
                  f"{r['fwd_median_s'] * ms:10.3f} "
                  f"[{r['fwd_p25_s'] * ms:8.3f}, {r['fwd_p75_s'] * ms:8.3f}] | "
                  f"{r['fwdbwd_median_s'] * ms:10.3f} "
                  f"[{r['fwdbwd_p25_s'] * ms:8.3f}, {r['fwdbwd_p75_s'] * ms:8.3f}] | "
                  f"{r['saved_bytes'] * mib:9.2f} {r['saved_bytes_excl_inputs'] * mib:9.2f} | "
                  f"{r['peak_rss_bytes'] * mib:12.1f} {r['peak_rss_delta_bytes'] * mib:12.2f}",
                  flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
