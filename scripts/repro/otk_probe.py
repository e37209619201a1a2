"""OTK's unsupervised pipeline at CPU scale (docs/REPRODUCTION.md, experiment 9; otk.md section 7.1-7.2,
Tables 6-7): MNIST images as sets of 4x4 patches (49 elements of 16 pixels on a 7x7 grid), a Nystrom
map psi on K-means anchors (homogeneous Gaussian kernel), then a linear classifier (a linear probe)
on each set embedding:
  mean      the mean of psi over the patches (k features)
  flatten   every patch's psi in place (49 k features: position kept, no pooling)
  otk       OTK pooling onto p references supports fitted by K-means (q = 1; p k features)
  otk+pe    the same with the 2-D positional encoding (supports on a sqrt(p) x sqrt(p) grid,
            sigma_pos chosen on the validation split)
The probe is multinomial logistic regression (full-batch L-BFGS, PyTorch, float64) on features
centred and L2-normalised per sample (the reference code's unsupervised recipe), its L2 weight
lambda chosen on a validation split (the last VAL training images) from a grid, then refitted on
the whole training subset; test accuracy on the first TEST test images. Seeds change the K-means
initialisations (anchors and supports). Writes OUT/SEED.json per seed, then the table.

Environment (defaults): SEEDS="1 2 3" TRAIN=10000 VAL=2000 TEST=10000 ANCHORS=64 SUPPORTS="9 16 25"
OUT=runs/repro/otk; QUICK=1: one seed, 3000 / 1000 / 1000 images, 16 anchors, p = 9.
"""
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import birkhoff  # noqa: E402
import birkhoff.data  # noqa: E402

from tablelib import fmt  # noqa: E402

LAMBDAS = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3)
SIGMA_POS = (0.25, 0.5, 1.0)
EPS, ITERS, SIGMA = 0.5, 20, 0.5


def env(name, default):
    return os.environ.get(name, default)


def patches(x):
    """[N, 1, 28, 28] -> [N, 49, 16]: 4x4 patches in row-major grid order"""
    n = x.shape[0]
    p = x.reshape(n, 7, 4, 7, 4).transpose(0, 1, 3, 2, 4).reshape(n, 49, 16)
    return np.ascontiguousarray(p, dtype=np.float32)


def normalise(f):
    f = f - f.mean(axis=1, keepdims=True)
    return f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)


def probe(ftr, ytr, fte, yte, lam):
    """test accuracy of L2-regularised multinomial logistic regression fitted on (ftr, ytr)"""
    X = torch.from_numpy(normalise(ftr).astype(np.float64))
    y = torch.from_numpy(ytr.astype(np.int64))
    W = torch.zeros(X.shape[1], 10, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(10, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], lr=1, max_iter=300, tolerance_grad=1e-7, history_size=20,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(X @ W + b, y) + 0.5 * lam * (W * W).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        Xt = torch.from_numpy(normalise(fte).astype(np.float64))
        return float(((Xt @ W + b).argmax(1).numpy() == yte).mean())


def tuned(ftr, ytr, fte, yte, nval):
    """lambda chosen on the last nval training rows, then the probe refitted on all of them"""
    best = max(LAMBDAS, key=lambda lam: probe(ftr[:-nval], ytr[:-nval], ftr[-nval:], ytr[-nval:], lam))
    return probe(ftr, ytr, fte, yte, best), best, probe(ftr[:-nval], ytr[:-nval], ftr[-nval:], ytr[-nval:], best)


def run_seed(seed, ntr, nval, nte, k, supports):
    tr = birkhoff.data.Dataset("mnist", "train", limit=ntr).load()
    te = birkhoff.data.Dataset("mnist", "test", limit=nte).load()
    xtr, xte = patches(tr.x), patches(te.x)
    ytr, yte = np.asarray(tr.labels), np.asarray(te.labels)
    t0 = time.time()
    # anchors from the training patches only (the validation rows included: unsupervised)
    W, _ = birkhoff.otk_fit_anchors(xtr, k, seed=seed, max_samples=50000)
    psi_tr = birkhoff.otk_features(xtr, W, sigma=SIGMA)
    psi_te = birkhoff.otk_features(xte, W, sigma=SIGMA)
    res = {"seed": seed, "train": ntr, "val": nval, "test": nte, "anchors": k, "rows": {}}

    def add(name, ftr, fte):
        acc, lam, vacc = tuned(ftr.reshape(len(ftr), -1), ytr, fte.reshape(len(fte), -1), yte, nval)
        res["rows"][name] = {"acc": acc, "lambda": lam, "val_acc": vacc, "dim": int(ftr[0].size)}
        print("# seed %d %-12s dim %6d  test %.4f (lambda %g, val %.4f)" % (seed, name, ftr[0].size, acc, lam, vacc),
              flush=True)

    add("mean", psi_tr.mean(axis=1), psi_te.mean(axis=1))
    add("flatten", psi_tr, psi_te)
    for p in supports:
        z, _ = birkhoff.otk_fit_refs(psi_tr, 1, p, seed=seed)
        common = dict(eps=EPS, iters=ITERS)
        e_tr = birkhoff.otk(psi_tr, z, tape=False, **common).out
        e_te = birkhoff.otk(psi_te, z, tape=False, **common).out
        add("otk p=%d" % p, e_tr, e_te)
        s = int(round(p ** 0.5))
        if s * s == p:
            # sigma_pos on the validation split with the probe's lambda grid
            best = None
            for sp in SIGMA_POS:
                pe = dict(common, pe="2d", grid=(7, 7), sigma_pos=sp)
                f_tr = birkhoff.otk(psi_tr, z, tape=False, **pe).out.reshape(ntr, -1)
                _, lam, vacc = tuned(f_tr, ytr, f_tr[:1], ytr[:1], nval)
                if best is None or vacc > best[0]:
                    best = (vacc, sp, f_tr)
            pe = dict(common, pe="2d", grid=(7, 7), sigma_pos=best[1])
            add("otk+pe p=%d" % p, best[2], birkhoff.otk(psi_te, z, tape=False, **pe).out)
            res["rows"]["otk+pe p=%d" % p]["sigma_pos"] = best[1]
    res["seconds"] = time.time() - t0
    return res


def table(out):
    runs = [json.load(open(os.path.join(out, f))) for f in sorted(os.listdir(out))
            if f.startswith("seed-") and f.endswith(".json")]
    if not runs:
        return
    r0 = runs[0]
    print("MNIST as sets of 49 patches (4x4, 7x7 grid); %d training images (%d of them for validation), %d test; "
          "%d anchors\n" % (r0["train"], r0["val"], r0["test"], r0["anchors"]))
    print("| embedding | features | linear-probe test acc % | lambda | sigma_pos | seeds |")
    print("|---|---|---|---|---|---|")
    for name in r0["rows"]:
        rows = [r["rows"][name] for r in runs if name in r["rows"]]
        sp = sorted({x.get("sigma_pos") for x in rows if "sigma_pos" in x})
        print("| %s | %d | %s | %s | %s | %d |" % (name, rows[0]["dim"], fmt([100 * x["acc"] for x in rows]),
                                                  "/".join("%g" % v for v in sorted({x["lambda"] for x in rows})),
                                                  "/".join("%g" % v for v in sp) or "-", len(rows)))
    print("\nmedian [min, max] over seeds (K-means initialisations)")


def main():
    quick = env("QUICK", "0") == "1"
    out = env("OUT", "runs/repro/otk")
    if len(sys.argv) > 1 and sys.argv[1] == "--table":
        table(sys.argv[2] if len(sys.argv) > 2 else out)
        return
    seeds = [int(s) for s in env("SEEDS", "1 2 3").split()]
    ntr, nval, nte = int(env("TRAIN", "10000")), int(env("VAL", "2000")), int(env("TEST", "10000"))
    k, supports = int(env("ANCHORS", "64")), [int(p) for p in env("SUPPORTS", "9 16 25").split()]
    if quick:
        seeds, ntr, nval, nte, k, supports = [1], 3000, 1000, 1000, 16, [9]
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(out, exist_ok=True)
    for s in seeds:
        path = os.path.join(out, "seed-%d.json" % s)
        if os.path.exists(path):
            continue
        res = run_seed(s, ntr, nval, nte, k, supports)
        with open(path + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        os.replace(path + ".tmp", path)
    table(out)


if __name__ == "__main__":
    main()
