#!/usr/bin/python3
"""Whole PyTorch training steps: birkhoff's drop-in attention vs the PyTorch
ports of the references, inside the SAME model and training step.

For each normaliser, one ViT-style model (patch embedding + [CLS] + learned
positions, pre-norm blocks: LayerNorm, attention, LayerNorm, GELU MLP; a
linear head on [CLS]) is built twice with the same weights:

  birkhoff  birkhoff.torch.MultiheadAttention(dim, heads, normaliser=X, ...)
  PyTorch   the same projections (in_proj_weight, in_proj_bias, out_proj, and
            for LOT the pivots Z and logits theta) around the PyTorch port of
            the reference in bench/peers/:
    softmax   torch.nn.MultiheadAttention(batch_first=True) (the baseline);
    sinkhorn  sinkformer_torch.attention(q, k, v, n_it=S, eps): the
              Sinkformer reference loop (autograd through S half-steps);
              birkhoff: normaliser="sinkhorn", iters=S, eps (the same
              function: S half-steps, row first, scale d^-1/2);
    esp       espformer_torch.esp_reference(q, k, v, softsort_t=t,
              temperature=T): the reference-faithful ESPFormer port (dense
              [B, H, L, N, N] soft permutations, L = d axis-aligned slices);
              birkhoff: normaliser="esp", sort="soft", t=t, tau=T*N,
              cost="euclid", out_scale="rows", which the docstrings of both
              state to be the same function (N = tokens);
    lot       lotformer_torch.lot_reference(q, k, v, Z, theta, temp, n_iter,
              eps) (--lot-port reference, default: the batched reference
              DeiT/Swin port, the peer benchmark of lotformer_torch.py) or
              lotformer_torch.lot_semantics(...) (--lot-port semantics;
              "both", the default, gives a row each: birkhoff's documented
              semantics, written with a Python loop over the batch); birkhoff: normaliser="lot",
              r, temp, iters, eps, the same pivots Z and logits theta.

At the start of each pair the two models' logits (and the first step's loss
and gradients) are compared on the same batch, and the max differences are
printed; a mismatch beyond --tol is reported and makes the exit status 1.

Timing: a whole step (zero_grad, forward, cross-entropy loss, backward,
AdamW step) on a random MNIST-shaped batch ([B, 1, S, S] N(0, 1) images,
random labels; tokens N = (S / patch)^2 + 1), W warm-up steps each, then R
timed steps of each variant alternating (ABAB, BABA, ...) in this process so
that both share the machine's noise; the table gives the medians, the
speed-up (PyTorch / birkhoff) and, separately measured, the normaliser alone
(q, k, v -> out, forward + backward, per layer) and its share of the step
(depth x attention / step).

Usage:
  /usr/bin/python3 bench/python_step.py [--threads T] [--reps R] [--warmup W]
      [--json FILE] [--normalisers softmax,sinkhorn,esp,lot] [--cases 28:4,...]
      [--batch B] [--dim E] [--heads H] [--depth D] [--sinkhorn-iters S]
      [--sinkhorn-eps E] [--esp-t t] [--esp-temperature T] [--lot-r r]
      [--lot-iters T] [--lot-eps E] [--lot-temp t] [--lot-port P]
      [--esp-max-tokens N] [--flush-denormal] [--tol X] [--no-attn]
--cases: comma list of image:patch (28:4 = MNIST with 4x4 patches, 50
tokens; 32:4 = 65 tokens; 64:4 = 257 tokens; 64:2 = 1025 tokens...).
--json FILE writes {"meta": ..., "rows": [...]} atomically (temp + rename).
Default: 28:4 and 64:4 (50 and 257 tokens), softmax, sinkhorn, esp (50
tokens only: --esp-max-tokens) and lot (both ports), batch 32, dim 64, 4
heads, depth 2, W = 3, R = 10: about 2 minutes on 2 cores.
The ESP port at t = 1e-3 computes with subnormal numbers and is several times
slower for it; --flush-denormal (torch.set_flush_denormal) removes that, which
the reference does not do (birkhoff flushes inside its soft-sort kernels).
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(HERE, "peers"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import birkhoff  # noqa: E402
import birkhoff.torch as bt  # noqa: E402
import espformer_torch  # noqa: E402
import lotformer_torch  # noqa: E402
import sinkformer_torch  # noqa: E402
from vit import ViT  # noqa: E402

NORMALISERS = ("softmax", "sinkhorn", "esp", "lot")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="torch.set_num_threads and birkhoff.set_num_threads (default: all cores)")
    ap.add_argument("--reps", type=int, default=10, help="timed steps per variant (median)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON (atomically)")
    ap.add_argument("--normalisers", default=",".join(NORMALISERS))
    ap.add_argument("--cases", default="28:4,64:4",
                    help="comma list of image:patch (default 28:4,64:4: 50 and 257 tokens)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--mlp", type=int, default=0, help="MLP hidden width (default 2 x dim)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sinkhorn-iters", type=int, default=5, help="Sinkhorn half-steps S (birkhoff's default 5)")
    ap.add_argument("--sinkhorn-eps", type=float, default=1.0)
    ap.add_argument("--esp-t", type=float, default=1e-3, help="ESP SoftSort temperature (reference 1e-3)")
    ap.add_argument("--esp-temperature", type=float, default=10.0,
                    help="ESP reference slice temperature T (birkhoff tau = T * N)")
    ap.add_argument("--lot-r", type=int, default=32)
    ap.add_argument("--lot-iters", type=int, default=5)
    ap.add_argument("--lot-eps", type=float, default=1.0)
    ap.add_argument("--lot-temp", type=float, default=0.5)
    ap.add_argument("--lot-port", default="both", choices=("reference", "semantics", "both"))
    ap.add_argument("--esp-max-tokens", type=int, default=64,
                    help="skip ESP above this many tokens (the port forms [B, H, d, N, N] tensors: "
                         "seconds per step and GBs at N = 257; 0: no limit)")
    ap.add_argument("--flush-denormal", action="store_true",
                    help="torch.set_flush_denormal(True) (the references do not; the ESP port at "
                         "t = 1e-3 produces subnormals)")
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="max |logits difference| / max(1, max |logits|) accepted at the start")
    ap.add_argument("--no-attn", action="store_true", help="skip the attention-only timing")
    a = ap.parse_args(argv)
    a.normalisers = [x.strip() for x in a.normalisers.split(",") if x.strip()]
    bad = [x for x in a.normalisers if x not in NORMALISERS]
    if bad or not a.normalisers:
        ap.error("--normalisers: a comma list of %s (got %s)" % (", ".join(NORMALISERS), a.normalisers))
    cases = []
    for c in a.cases.split(","):
        try:
            img, patch = (int(x) for x in c.split(":"))
        except ValueError:
            ap.error("--cases: image:patch expected, got %r" % c)
        if patch < 1 or img < patch or img % patch:
            ap.error("--cases: the patch size must divide the image size (got %r)" % c)
        cases.append((img, patch))
    a.cases = cases
    if min(a.threads, a.reps, a.batch, a.dim, a.heads, a.depth) < 1 or a.warmup < 0 or a.dim % a.heads:
        ap.error("need --threads, --reps, --batch, --dim, --heads, --depth >= 1, --warmup >= 0, "
                 "heads dividing dim")
    if a.sinkhorn_iters < 1 or a.lot_iters < 1 or a.lot_r < 1 or not (
            a.sinkhorn_eps > 0 and a.esp_t > 0 and a.esp_temperature >= 0 and a.lot_eps > 0 and a.lot_temp > 0):
        ap.error("need positive iteration counts, r, eps, t and temperatures")
    a.mlp = a.mlp or 2 * a.dim
    return a


# ---------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------
class PortMHA(nn.Module):
    """Self-attention with torch.nn.MultiheadAttention's parameters and call,
    whose normaliser is fn(q, k, v[, Z, theta]) on [B, H, N, dh] tensors."""

    def __init__(self, dim, heads, fn, r=None):
        super().__init__()
        self.dim, self.heads, self.fn = dim, heads, fn
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)
        if r is not None:     # LOT: the names and shapes birkhoff's module uses
            dh = dim // heads
            self.Z = nn.Parameter(torch.randn(heads, r, dh) / math.sqrt(dh))
            self.theta = nn.Parameter(torch.zeros(heads, r))

    def attend(self, q, k, v):
        if hasattr(self, "Z"):
            return self.fn(q, k, v, self.Z, self.theta)
        return self.fn(q, k, v)

    def forward(self, query, key=None, value=None, need_weights=False, **_):
        B, N, E = query.shape
        H = self.heads
        qkv = nn.functional.linear(query, self.in_proj_weight, self.in_proj_bias)
        qkv = qkv.view(B, N, 3, H, E // H).permute(2, 0, 3, 1, 4)      # [3, B, H, N, dh]
        o = self.attend(qkv[0], qkv[1], qkv[2])                         # [B, H, N, dh]
        return self.out_proj(o.transpose(1, 2).reshape(B, N, E)), None


def variants(a, norm, tokens, lot_port):
    """(birkhoff attention factory, peer attention factory, peer description)"""
    if norm == "softmax":
        return (lambda E, H: bt.MultiheadAttention(E, H, normaliser="softmax", batch_first=True),
                lambda E, H: nn.MultiheadAttention(E, H, batch_first=True),
                "torch.nn.MultiheadAttention")
    if norm == "sinkhorn":
        S, eps = a.sinkhorn_iters, a.sinkhorn_eps
        fn = lambda q, k, v: sinkformer_torch.attention(q, k, v, S, eps=eps)[0]  # noqa: E731
        return (lambda E, H: bt.MultiheadAttention(E, H, normaliser="sinkhorn", iters=S, eps=eps, batch_first=True),
                lambda E, H: PortMHA(E, H, fn),
                "sinkformer_torch.attention(n_it=%d, eps=%g)" % (S, eps))
    if norm == "esp":
        t, T = a.esp_t, a.esp_temperature
        fn = lambda q, k, v: espformer_torch.esp_reference(q, k, v, softsort_t=t, temperature=T)[0]  # noqa: E731
        return (lambda E, H: bt.MultiheadAttention(E, H, normaliser="esp", batch_first=True, sort="soft", t=t, tau=T * tokens,
                                                   cost="euclid", out_scale="rows"),
                lambda E, H: PortMHA(E, H, fn),
                "espformer_torch.esp_reference(t=%g, T=%g) [birkhoff: soft, tau=T*N=%g, euclid, rows]"
                % (t, T, T * tokens))
    r, T, eps, temp = a.lot_r, a.lot_iters, a.lot_eps, a.lot_temp
    if lot_port == "reference":
        fn = lambda q, k, v, Z, th: lotformer_torch.lot_reference(  # noqa: E731
            q, k, v, Z, th, temp=temp, n_iter=T, eps=eps)
    else:
        fn = lambda q, k, v, Z, th: lotformer_torch.lot_semantics(  # noqa: E731
            q, k, v, Z, th, temp=temp, iters=T, eps=eps)[0]
    return (lambda E, H: bt.MultiheadAttention(E, H, normaliser="lot", batch_first=True, r=r, temp=temp, iters=T, eps=eps),
            lambda E, H: PortMHA(E, H, fn, r=r),
            "lotformer_torch.lot_%s(r=%d, T=%d, eps=%g, temp=%g)" % (lot_port, r, T, eps, temp))


# ---------------------------------------------------------------------------
# checks and timing
# ---------------------------------------------------------------------------
def compare(m_bk, m_pt, x, y):
    """max differences of logits, loss and parameter gradients (relative to
    max(1, |reference|)) on one batch; the gradients are cleared afterwards"""
    outs = []
    for m in (m_bk, m_pt):
        m.zero_grad(set_to_none=True)
        logits = m(x)
        loss = nn.functional.cross_entropy(logits, y)
        loss.backward()
        outs.append((logits.detach(), float(loss), {n: p.grad for n, p in m.named_parameters()}))
    (l1, s1, g1), (l2, s2, g2) = outs
    d_logits = float((l1 - l2).abs().max()) / max(1.0, float(l2.abs().max()))
    d_grad, where = 0.0, ""
    for n, g in g1.items():
        ref = g2.get(n)
        if g is None or ref is None:
            d_grad, where = float("inf"), n + " (no gradient)"
            break
        r = float((g - ref).abs().max()) / max(1.0, float(ref.abs().max()))
        if r > d_grad:
            d_grad, where = r, n
    for m in (m_bk, m_pt):
        m.zero_grad(set_to_none=True)
    finite = bool(torch.isfinite(l1).all() and torch.isfinite(l2).all())
    return dict(logits=d_logits, loss=abs(s1 - s2), grad=d_grad, grad_where=where, finite=finite)


def make_step(model, opt, x, y):
    def step():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return step


def time_pair(fa, fb, warmup, reps):
    """medians (seconds) of fa and fb, alternated: ab, ba, ab, ..."""
    for _ in range(warmup):
        fa()
        fb()
    ta, tb = [], []
    for r in range(reps):
        order = ((fa, ta), (fb, tb)) if r % 2 == 0 else ((fb, tb), (fa, ta))
        for f, acc in order:
            t0 = time.perf_counter()
            f()
            acc.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb), ta, tb


def attn_only(m_bk, m_pt, B, N, E, H, warmup, reps):
    """one layer's normaliser alone, forward + backward: birkhoff gets the q,
    k, v views of a fused [B, N, 3, H, dh] projection (as inside its module),
    the port the [B, H, N, dh] permuted views (as in PortMHA)"""
    a_bk, a_pt = m_bk.blocks[0].attn, m_pt.blocks[0].attn
    dh = E // H
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(B, N, 3, H, dh, generator=g).requires_grad_(True)
    dout = torch.randn(B, N, H, dh, generator=g)

    def f_bk():
        qkv.grad = None
        o = a_bk.attend(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], None, None, "bnhd")
        o.backward(dout)

    if isinstance(a_pt, nn.MultiheadAttention):
        def fn(q, k, v):
            return sinkformer_torch.softmax_attention(q, k, v)[0]
    else:
        fn = a_pt.attend

    def f_pt():
        qkv.grad = None
        p = qkv.permute(2, 0, 3, 1, 4)
        o = fn(p[0], p[1], p[2])
        o.backward(dout.transpose(1, 2))

    return time_pair(f_bk, f_pt, warmup, reps)[:2]


def write_json(path, obj):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".python_step.", suffix=".json.tmp", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    birkhoff.set_num_threads(a.threads)
    if a.flush_denormal:
        torch.set_flush_denormal(True)
    meta = dict(birkhoff=birkhoff.version(), isa=birkhoff.isa(), library=birkhoff.LIBRARY_PATH,
                torch=torch.__version__, python=platform.python_version(), machine=platform.machine(),
                cpus=os.cpu_count(), threads=a.threads, torch_threads=torch.get_num_threads(),
                birkhoff_threads=birkhoff.get_num_threads(), reps=a.reps, warmup=a.warmup, batch=a.batch,
                dim=a.dim, heads=a.heads, depth=a.depth, mlp=a.mlp, seed=a.seed,
                flush_denormal=a.flush_denormal, optimizer="AdamW(lr=1e-3)")
    print("birkhoff %s (%s), torch %s; threads %d (torch %d, birkhoff %d); batch %d, dim %d, heads %d, "
          "depth %d, mlp %d; warm-up %d, median of %d alternating steps"
          % (meta["birkhoff"], meta["isa"], meta["torch"], a.threads, meta["torch_threads"],
             meta["birkhoff_threads"], a.batch, a.dim, a.heads, a.depth, a.mlp, a.warmup, a.reps), flush=True)
    jobs = []
    for img, patch in a.cases:
        for norm in a.normalisers:
            N = (img // patch) ** 2 + 1
            if norm == "esp" and 0 < a.esp_max_tokens < N:
                print("esp      N=%-4d skipped (--esp-max-tokens %d)" % (N, a.esp_max_tokens))
                continue
            ports = ("reference", "semantics") if (norm == "lot" and a.lot_port == "both") else (a.lot_port,)
            for lp in ports:
                jobs.append((img, patch, norm, lp))
    rows, mismatches = [], 0
    t_start = time.perf_counter()
    for img, patch, norm, lot_port in jobs:
        N = (img // patch) ** 2 + 1
        f_bk, f_pt, peer = variants(a, norm, N, lot_port)
        torch.manual_seed(a.seed)
        m_bk = ViT(f_bk, img, patch, a.dim, a.heads, a.depth, a.mlp)
        m_pt = ViT(f_pt, img, patch, a.dim, a.heads, a.depth, a.mlp)
        m_pt.load_state_dict(m_bk.state_dict(), strict=True)
        g = torch.Generator().manual_seed(a.seed + 1)
        x = torch.randn(a.batch, 1, img, img, generator=g)
        y = torch.randint(0, 10, (a.batch,), generator=g)
        label = norm if norm != "lot" or a.lot_port != "both" else "lot/" + lot_port[:3]
        cmp = compare(m_bk, m_pt, x, y)
        ok = cmp["finite"] and cmp["logits"] <= a.tol and cmp["grad"] <= max(a.tol, 1e-3)
        mismatches += not ok
        print("%-8s N=%-4d vs %s\n         start: max |logits diff| %.2e, |loss diff| %.2e, max grad diff %.2e "
              "(%s; relative to max(1, |ref|))%s"
              % (label, N, peer, cmp["logits"], cmp["loss"], cmp["grad"], cmp["grad_where"],
                 "" if ok else "  MISMATCH (tol %.0e)" % a.tol), flush=True)
        o_bk = torch.optim.AdamW(m_bk.parameters(), lr=1e-3)
        o_pt = torch.optim.AdamW(m_pt.parameters(), lr=1e-3)
        t0 = time.perf_counter()
        s_bk, s_pt, all_bk, all_pt = time_pair(make_step(m_bk, o_bk, x, y), make_step(m_pt, o_pt, x, y),
                                               a.warmup, a.reps)
        row = dict(normaliser=norm, peer=peer, lot_port=lot_port if norm == "lot" else None, image=img,
                   patch=patch, tokens=N, batch=a.batch, dim=a.dim, heads=a.heads, depth=a.depth,
                   step_ms_birkhoff=1e3 * s_bk, step_ms_pytorch=1e3 * s_pt, speedup=s_pt / s_bk,
                   step_ms_birkhoff_all=[1e3 * t for t in all_bk], step_ms_pytorch_all=[1e3 * t for t in all_pt],
                   start_logits_diff=cmp["logits"], start_loss_diff=cmp["loss"], start_grad_diff=cmp["grad"],
                   match=ok)
        if not a.no_attn:
            at_bk, at_pt = attn_only(m_bk, m_pt, a.batch, N, a.dim, a.heads, a.warmup, a.reps)
            row.update(attn_ms_birkhoff=1e3 * at_bk, attn_ms_pytorch=1e3 * at_pt, attn_speedup=at_pt / at_bk,
                       attn_share_birkhoff=min(1.0, a.depth * at_bk / s_bk),
                       attn_share_pytorch=min(1.0, a.depth * at_pt / s_pt))
        print("         step: birkhoff %.2f ms, PyTorch %.2f ms, speed-up %.2fx (%.1f s)"
              % (row["step_ms_birkhoff"], row["step_ms_pytorch"], row["speedup"], time.perf_counter() - t0),
              flush=True)
        rows.append(dict(row, label=label))

    print()
    head = "%-9s %6s %13s %13s %9s" % ("normaliser", "N", "birkhoff ms", "PyTorch ms", "speed-up")
    if not a.no_attn:
        head += " | %12s %12s %8s %13s" % ("attn bk ms", "attn PT ms", "attn x", "attn share")
    print(head)
    print("-" * len(head))
    for r in rows:
        line = "%-10s %5d %13.2f %13.2f %8.2fx" % (r["label"], r["tokens"], r["step_ms_birkhoff"],
                                                   r["step_ms_pytorch"], r["speedup"])
        if not a.no_attn:
            line += " | %12.2f %12.2f %7.2fx %5.0f%% / %3.0f%%" % (
                r["attn_ms_birkhoff"], r["attn_ms_pytorch"], r["attn_speedup"],
                100 * r["attn_share_birkhoff"], 100 * r["attn_share_pytorch"])
        print(line + ("" if r["match"] else "  MISMATCH"))
    print("(ms per whole training step, median; speed-up = PyTorch / birkhoff%s; %.0f s in all)"
          % ("" if a.no_attn else "; attn: one layer's normaliser, forward + backward; share: depth x attn / "
             "step, birkhoff / PyTorch", time.perf_counter() - t_start))
    if a.json:
        write_json(a.json, dict(meta=meta, rows=rows))
        print("wrote", a.json)
    if mismatches:
        print("%d pair(s) did not compute the same function (see MISMATCH above)" % mismatches)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
