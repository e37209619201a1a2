#!/usr/bin/python3
"""birkhoff's C-backed PyTorch modules under DistributedDataParallel (issue 22, item 5).

    /usr/bin/python3 tests/python/test_ddp.py [--birkhoff build/birkhoff]

Two processes (torch.multiprocessing spawn) join a gloo process group on
127.0.0.1 (a free port), one thread each (birkhoff.set_num_threads(1),
torch.set_num_threads(1)), and train two models wrapped in
torch.nn.parallel.DistributedDataParallel:

  "mha":    a set classifier built on birkhoff.torch.MultiheadAttention
            (normaliser="sinkhorn", padded batches through lengths=) and
            birkhoff.torch.OTKPooling: C operators with autograd;
  "models": a birkhoff.models classifier (attn=lot, pool=otk) with
            backend="c" (libbirkhoff's LOT and OTK kernels inside the
            torch model), tokens with padding.

Each rank takes half of every global batch of 8 (rank r: samples r, r + 2,
...). Checks, per model:

  * after the first backward, every gradient is bitwise identical on the
    two ranks (DDP's all-reduce), and equal to the gradient of a
    single-process run on the whole global batch (the mean of the two
    half-batch gradients vs the full batch: the same in exact arithmetic;
    float32 summation order differs): per tensor max|g_ddp - g_1| /
    max(max|g_1|, 1e-3 R) <= GRAD_TOL = 1e-4, R the largest |g_1| entry (the
    floor keeps tensors whose gradient is ~1e-4 R from measuring pure
    rounding noise; tests/oracle/test_model.py's measure and tolerance).
    Measured: 3e-7 (mha), 8e-6 (models: the OTK references, whose gradient
    is ~2e-3 R and sums per-sample terms over the batch in the C kernel);
  * after STEPS = 3 SGD steps (momentum 0.9) on successive global batches
    the weights are bitwise identical on the two ranks and within
    max|w_ddp - w_1| / max|w_1| <= WEIGHT_TOL = 1e-5 of the single-process
    run's (measured: 1.5e-8 and 4e-8; the steps move the weights by ~0.1).

Then examples/ddp_train.py runs for 3 steps on 2 processes and its
checkpoint loads back with birkhoff.models.load (optim_step 3).

The library is $BIRKHOFF_LIB, else the libbirkhoff.so next to --birkhoff
(default $BIRKHOFF_CLI or <repo>/build/birkhoff), else the source tree's.
Prints the measured differences, "FAIL name: detail" for failures, then
"N passed, M failed"; exit status 1 if any failed.
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.dont_write_bytecode = True


def _library_from_cli():
    """BIRKHOFF_LIB from --birkhoff / BIRKHOFF_CLI when not set (the spawned
    ranks inherit it)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--birkhoff", default=os.environ.get("BIRKHOFF_CLI")
                    or os.path.join(REPO, "build", "birkhoff"))
    args, _ = ap.parse_known_args()
    lib = os.path.join(os.path.dirname(os.path.abspath(args.birkhoff)), "libbirkhoff.so")
    if not os.environ.get("BIRKHOFF_LIB") and os.path.exists(lib):
        os.environ["BIRKHOFF_LIB"] = lib


if __name__ == "__main__":
    _library_from_cli()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import birkhoff  # noqa: E402
import birkhoff.models as bm  # noqa: E402
import birkhoff.torch as bt  # noqa: E402

WORLD, GLOBAL_B, STEPS = 2, 8, 3
GRAD_TOL, GRAD_FLOOR, WEIGHT_TOL = 1e-4, 1e-3, 1e-5
N, D_IN, CLASSES = 10, 5, 3
MODELS_CONFIG = ("input=tokens,vocab=13,max_len=10,dim=16,depth=2,heads=2,mlp_dim=32,classes=3,"
                 "attn=lot,lot_r=3,pool=otk,otk_refs=1,otk_supports=3")


class SetClassifier(nn.Module):
    """Linear embedding, pre-LN block with birkhoff's Sinkhorn
    MultiheadAttention, OTK pooling over the valid elements, linear head."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.embed = nn.Linear(D_IN, dim)
        self.ln = nn.LayerNorm(dim)
        self.attn = bt.MultiheadAttention(dim, heads, batch_first=True, normaliser="sinkhorn",
                                          iters=5, eps=1.0)
        self.pool = bt.OTKPooling(dim, refs=1, supports=3, eps=0.5, iters=10)
        self.head = nn.Linear(3 * dim, CLASSES)

    def forward(self, x, lengths):
        h = self.embed(x)
        h = h + self.attn(self.ln(h), need_weights=False, lengths=lengths)[0]
        return self.head(self.pool(h, lengths=lengths).reshape(x.shape[0], -1))


def make(name, seed=0):
    torch.manual_seed(seed)
    if name == "mha":
        return SetClassifier()
    return bm.build(MODELS_CONFIG, seed=seed, backend="c")


def global_batch(name, step):
    """The global batch of a step (the same on every rank): inputs, lengths, labels."""
    rng = np.random.default_rng(1000 + step)
    lens = rng.integers(1, N + 1, GLOBAL_B).astype(np.int32)
    lens[0] = N
    y = torch.from_numpy(rng.integers(0, CLASSES, GLOBAL_B))
    if name == "mha":
        x = torch.from_numpy(rng.standard_normal((GLOBAL_B, N, D_IN)).astype(np.float32))
    else:
        x = torch.from_numpy(rng.integers(0, 13, (GLOBAL_B, N)).astype(np.int64))
    return x, torch.from_numpy(lens), y


def loss_of(model, name, x, lens, y):
    if name == "mha":
        logits = model(x, lens)
    else:
        logits = model(tokens=x, lengths=lens)
    return nn.functional.cross_entropy(logits, y)


def run_steps(model, name, shard):
    """First backward's gradients, then STEPS SGD steps; shard(t) -> the part
    of a tensor this process takes."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    params = model.module if isinstance(model, DDP) else model
    first = None
    for s in range(STEPS):
        x, lens, y = (shard(t) for t in global_batch(name, s))
        opt.zero_grad()
        loss_of(model, name, x, lens, y).backward()
        if first is None:
            first = {n: p.grad.detach().clone() for n, p in params.named_parameters()}
        opt.step()
    return first, {n: p.detach().clone() for n, p in params.named_parameters()}


def worker(rank, port, tmp):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    birkhoff.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        out = {}
        for name in ("mha", "models"):
            model = make(name)
            ddp = DDP(model)
            out[name] = run_steps(ddp, name, lambda t: t[rank::WORLD])
        torch.save(out, os.path.join(tmp, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    from checklib import Checks
    check = Checks()
    torch.set_num_threads(1)
    birkhoff.set_num_threads(1)
    print(f"# library {birkhoff.LIBRARY_PATH}, torch {torch.__version__}, gloo "
          f"{dist.is_gloo_available()}, {WORLD} ranks")
    with tempfile.TemporaryDirectory(prefix="bk_test_ddp_") as tmp:
        mp.spawn(worker, args=(free_port(), tmp), nprocs=WORLD, join=True)
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(WORLD)]
        for name in ("mha", "models"):
            g1, w1 = run_steps(make(name), name, lambda t: t)      # one process, whole batches
            g = [r[name][0] for r in ranks]
            w = [r[name][1] for r in ranks]
            check(list(g[0]) == list(g1) and all(v.abs().max() > 0 for v in g1.values()),
                  f"{name}: every parameter has a gradient", sorted(g1))
            check(all(torch.equal(g[0][n], g[1][n]) for n in g1),
                  f"{name}: gradients bitwise identical on the {WORLD} ranks")
            R = max(float(v.abs().max()) for v in g1.values())
            err, where = max((float((g[0][n] - v).abs().max()) / max(float(v.abs().max()), GRAD_FLOOR * R),
                              n) for n, v in g1.items())
            print(f"  {name}: DDP gradient vs one process on the global batch  {err:.2e} "
                  f"(tol {GRAD_TOL:.0e}; worst tensor {where}, max |g| {float(g1[where].abs().max()) / R:.1e} R)")
            check(err <= GRAD_TOL, f"{name}: DDP gradient == single-process gradient", err)
            check(all(torch.equal(w[0][n], w[1][n]) for n in w1),
                  f"{name}: weights bitwise identical on the ranks after {STEPS} steps")
            W = max(float(v.abs().max()) for v in w1.values())
            werr = max(float((w[0][n] - v).abs().max()) for n, v in w1.items()) / W
            moved = max(float((w[0][n] - p).abs().max()) for n, p in make(name).named_parameters())
            print(f"  {name}: weights after {STEPS} SGD steps vs one process     {werr:.2e} "
                  f"(tol {WEIGHT_TOL:.0e}; the steps moved them by up to {moved:.2e})")
            check(werr <= WEIGHT_TOL and moved > 1e-3, f"{name}: DDP weights == single-process weights",
                  (werr, moved))
        # the example, briefly
        out = os.path.join(tmp, "ddp.safetensors")
        p = subprocess.run([sys.executable, os.path.join(REPO, "examples", "ddp_train.py"),
                            "--config", "input=points,point_dim=3,max_points=16,dim=16,depth=1,heads=2,"
                            "mlp_dim=32,classes=12,attn=sinkhorn",
                            "--data", "shapes", "--points", "16", "--gen-train", "64", "--gen-test", "32",
                            "--steps", "3", "--batch", "16", "--out", out],
                           capture_output=True, text=True, timeout=300)
        check(p.returncode == 0, "examples/ddp_train.py runs (2 ranks, 3 steps)",
              p.stdout[-2000:] + p.stderr[-2000:])
        if p.returncode == 0:
            m = bm.load(out)
            check(m.checkpoint_meta.get("optim_step") == "3" and m.config["attn"] == "sinkhorn",
                  "its checkpoint loads with birkhoff.models.load (optim_step 3)", m.checkpoint_meta)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
