#!/usr/bin/python3
"""Train a birkhoff model with PyTorch's DistributedDataParallel, then hand it back to the CLI.

    # fine-tune a `birkhoff train` run on 2 processes (its dataset options are read from the run)
    /usr/bin/python3 examples/ddp_train.py --init runs/shapes/last.safetensors --steps 200 \\
        --out tuned.safetensors
    birkhoff eval --ckpt tuned.safetensors              # the run's metadata came along

    # or a new model from a configuration, on a generated dataset
    /usr/bin/python3 examples/ddp_train.py --config "input=points,point_dim=3,max_points=64,dim=32,\\
depth=2,heads=4,mlp_dim=64,classes=12,attn=sinkhorn" --data shapes --points 64 --out new.safetensors
    birkhoff train --init new.safetensors --data shapes --points 64 --epochs 1 --out runs/ft

The model is a birkhoff.models module (docs/PYTHON.md "birkhoff.models") with
backend="c": its attention operators (and an OTK pool) are libbirkhoff's
kernels through birkhoff.torch's autograd Functions, the rest is PyTorch.
--world processes (default 2) are started with torch.multiprocessing.spawn
and join a gloo process group on 127.0.0.1 (a free port); each uses
--threads threads for torch and for birkhoff (birkhoff.set_num_threads).
Every step draws one global batch of --batch samples (a seeded permutation
of the training split, the same on every rank) and rank r takes samples r,
r + world, ...; DDP averages the gradients, so the step is that of the whole
batch. The data are read by the C library (birkhoff.data: the verified
readers and generators `birkhoff train` uses). Rank 0 prints the loss, the
test accuracy at the end, and saves the model and its AdamW state with
birkhoff.models.save (DDP's wrapper is unwrapped): `birkhoff model train`
continues it, `birkhoff train --init` fine-tunes it, and `birkhoff eval`
evaluates it when it started from a `birkhoff train` checkpoint (whose run
metadata save() carries over).
"""
import argparse
import os
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))   # the source tree's package, if not installed

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import birkhoff  # noqa: E402
import birkhoff.data as bdata  # noqa: E402
import birkhoff.models as bm  # noqa: E402

# run keys of a `birkhoff train` checkpoint -> birkhoff.data.Dataset options
RUN_DATA_KEYS = {"seq_len": int, "min_len": int, "listops_depth": int, "points": int, "noise": float,
                 "gen_train": int, "gen_test": int, "data_seed": int}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--init", help="a checkpoint to start from (birkhoff train, model init, save)")
    src.add_argument("--config", help="a new model: configuration key=value,... (docs/MODEL.md)")
    ap.add_argument("--data", help="dataset (default: the --init run's): mnist, digits, listops, shapes, ...")
    ap.add_argument("--data-dir", help="where scripts/data.sh put the stored datasets")
    ap.add_argument("--points", type=int, help="shapes: points per cloud")
    ap.add_argument("--seq-len", type=int, help="listops / spam: sequence length")
    ap.add_argument("--gen-train", type=int, help="generated sets: training samples")
    ap.add_argument("--gen-test", type=int, help="generated sets: test samples")
    ap.add_argument("--world", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--threads", type=int, default=1, help="threads per process (default 1)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32, help="global batch (a multiple of --world)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="c", choices=bm.BACKENDS,
                    help="attention operators: c (libbirkhoff, default) or torch (the pure-PyTorch ports)")
    ap.add_argument("--out", required=True, help="the checkpoint to write")
    a = ap.parse_args()
    if a.world < 1 or a.batch % a.world or a.steps < 1:
        ap.error("--world >= 1, --steps >= 1, and --batch a multiple of --world")
    return a


def data_options(args, meta):
    """(dataset name, Dataset keywords): the run's (an --init checkpoint of
    `birkhoff train` keeps them in its "extra" metadata), overridden by the
    command line."""
    run = dict(line.split("=", 1) for line in meta.get("extra", "").splitlines() if "=" in line)
    name = args.data or run.get("data")
    if not name:
        raise SystemExit("--data is needed (the checkpoint carries no run metadata)")
    opts = {k: conv(run[k]) for k, conv in RUN_DATA_KEYS.items() if run.get(k) not in (None, "")}
    for k in ("points", "seq_len", "gen_train", "gen_test"):
        if getattr(args, k) is not None:
            opts[k] = getattr(args, k)
    data_dir = args.data_dir or run.get("data_dir") or None
    return name, data_dir, opts


def model_inputs(model, b):
    if model.config["input"] == "tokens":
        return {"tokens": torch.from_numpy(b.tokens).long(), "lengths": b.lengths}
    return {"x": torch.from_numpy(b.x), "lengths": b.lengths}


def build_model(args):
    if args.init:
        return bm.load(args.init, backend=args.backend)
    return bm.build(args.config, seed=args.seed, backend=args.backend)


def worker(rank, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(args.threads)
    birkhoff.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    try:
        model = build_model(args)          # the same weights on every rank (DDP broadcasts rank 0's)
        name, data_dir, opts = data_options(args, getattr(model, "checkpoint_meta", {}))
        ddp = DDP(model)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        with bdata.Dataset(name, "train", data_dir, **opts) as train:
            n = len(train)
            order = np.random.default_rng(args.seed).permutation(n)
            ddp.train()
            for step in range(args.steps):
                at = (step * args.batch) % n
                idx = np.take(order, np.arange(at, at + args.batch), mode="wrap")[rank::args.world]
                b = train.batch(idx)
                opt.zero_grad()
                loss = bm.loss_fn(ddp(**model_inputs(model, b)), b.labels)
                loss.backward()
                opt.step()
                if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
                    print(f"step {step + 1:5d}/{args.steps}  loss (rank 0's half) {float(loss):.4f}",
                          flush=True)
        if rank == 0:
            model.eval()
            with bdata.Dataset(name, "test", data_dir, **opts) as test, torch.no_grad():
                correct = 0
                for s in range(0, len(test), 256):
                    b = test.batch(np.arange(s, min(s + 256, len(test))))
                    correct += int((model(**model_inputs(model, b)).argmax(1).numpy() == b.labels).sum())
            print(f"test accuracy {correct / len(test):.4f} ({len(test)} samples)")
            bm.save(args.out, ddp, opt)
            print(f"wrote {args.out}")
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    args = parse_args()
    mp.spawn(worker, args=(args, free_port()), nprocs=args.world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
