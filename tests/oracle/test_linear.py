#!/usr/bin/python3
"""Compare birkhoff's kernelised attention with the PyTorch ports of the
references (tests/oracle/linear_torch.py), float64.

Usage:
  /usr/bin/python3 tests/oracle/test_linear.py [--lib build/libbirkhoff.so] [--quick]

Driven through the Python package's generic registry call
(birkhoff.ops.attention / attention_backward: bk_op_forward and
bk_op_backward with the parameters set by key), since the CLI's generic
`attn --op NAME --KEY VALUE` path is being written elsewhere. For every case
of a grid (shapes with Nq != Nk and N = 1, padding with NaN in the padded
rows, both operators' parameters) birkhoff runs in float32 and the port in
float64 on the same float32 inputs; compared: out, the implied attention
(birkhoff's attn extra against the port's out on one-hot values), dq, dk,
dv (torch autograd of the port, the stabilisers detached as the reference
does). performer is given birkhoff's own projection (bk_performer_projection,
called through ctypes with the registry's parameter struct), so the two use
the same random features.

Error measure: max|x - ref| / max(1, max|ref|); tolerances 1e-5 for out and
attn, 1e-4 for the gradients. Padded rows of birkhoff's outputs must be
exactly zero. If torch cannot be imported the test prints a SKIP line and
exits 0 (exit 1 with BK_REQUIRE_ORACLE=1 or CI=true). The last line is
"N passed, M failed"; the exit status is 1 if anything failed.
"""
import argparse
import ctypes as C
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libbirkhoff.so"))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    from torch_guard import require_torch
    require_torch()
    os.environ["BIRKHOFF_LIB"] = os.path.abspath(args.lib)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import numpy as np
    import torch
    import linear_torch as port
    import birkhoff.ops as bo
    from birkhoff import _core as K
    from birkhoff._lib import lib
    torch.set_default_dtype(torch.float64)

    def projection(params, d):
        reg = K.Registered("performer", params)
        W = np.empty((reg_int(reg, "features"), d), dtype=np.float32)
        fn = lib.bk_performer_projection
        fn.restype = C.c_int
        fn.argtypes = [C.c_void_p, C.c_int, C.c_void_p]
        st = fn(C.cast(reg.par, C.c_void_p), d, W.ctypes.data)
        if st != 0:
            raise RuntimeError("bk_performer_projection failed: %d" % st)
        return W

    def reg_int(reg, key):
        buf = C.create_string_buffer(256)
        lib.bk_op_config_format.restype = C.c_size_t
        lib.bk_op_config_format.argtypes = [C.c_void_p, C.c_void_p, C.c_char_p, C.c_size_t]
        lib.bk_op_config_format(reg.op, C.cast(reg.par, C.c_void_p), buf, 256)
        for kv in buf.value.decode().replace(",", " ").split():
            k, _, v = kv.partition("=")
            if k == key:
                return int(v)
        raise KeyError(key)

    passed = failed = 0

    def check(ok, name, detail):
        nonlocal passed, failed
        print(("ok   " if ok else "FAIL ") + name + ": " + detail, flush=True)
        if ok:
            passed += 1
        else:
            failed += 1

    def rel(x, ref):
        x = np.asarray(x, dtype=np.float64)
        return float(np.max(np.abs(x - ref)) / max(1.0, float(np.max(np.abs(ref))))) if ref.size else 0.0

    def port_problem(op, params, q, k, v, W):
        """one valid problem [h, n, d] in float64 -> (out, attn) as torch"""
        if op == "linear":
            eps = float(params.get("eps", 1e-6))
            o = port.fast_transformers_linear(q.permute(1, 0, 2)[None], k.permute(1, 0, 2)[None],
                                              v.permute(1, 0, 2)[None], None, eps)[0].permute(1, 0, 2)
            m = k.shape[1]
            eye = torch.eye(m).expand(q.shape[0], m, m)
            a = port.fast_transformers_linear(q.permute(1, 0, 2)[None], k.permute(1, 0, 2)[None],
                                              eye.permute(1, 0, 2)[None], None, eps)[0].permute(1, 0, 2)
            return o, a
        Wt = torch.tensor(W, dtype=torch.float64)
        eps = float(params.get("eps", 0.0))
        scale = params.get("scale")
        scale = float(scale) if scale not in (None, 0, 0.0) else None
        o = port.favor_attention(q[None], k[None], v[None], Wt, eps, scale)[0]
        m = k.shape[1]
        eye = torch.eye(m).expand(q.shape[0], m, m)
        a = port.favor_attention(q[None], k[None], eye[None], Wt, eps, scale)[0]
        return o, a

    def run_case(op, params, B, H, Nq, Nk, d, dv, pad, seed):
        rng = np.random.default_rng(seed)
        q = rng.normal(0, 0.8, (B, H, Nq, d)).astype(np.float32)
        k = rng.normal(0, 0.8, (B, H, Nk, d)).astype(np.float32)
        v = rng.normal(0, 1, (B, H, Nk, dv)).astype(np.float32)
        do = rng.normal(0, 1, (B, H, Nq, dv)).astype(np.float32)
        ql = kl = None
        Lq, Lk = [Nq] * B, [Nk] * B
        if pad:
            Lq = [int(rng.integers(0 if pad == 2 else 1, Nq + 1)) for _ in range(B)]
            Lk = [int(rng.integers(1, Nk + 1)) for _ in range(B)]
            Lq[-1], Lk[-1] = Nq, Nk
            ql, kl = np.array(Lq, dtype=np.int32), np.array(Lk, dtype=np.int32)
            for b in range(B):
                q[b, :, Lq[b]:] = np.nan
                do[b, :, Lq[b]:] = np.nan
                k[b, :, Lk[b]:] = np.nan
                v[b, :, Lk[b]:] = np.nan
        name = "%s %s B%d H%d Nq%d Nk%d d%d dv%d pad%d" % (
            op, " ".join("%s=%s" % kv for kv in params.items()), B, H, Nq, Nk, d, dv, pad)
        try:
            r = bo.attention(op, q, k, v, q_len=ql, k_len=kl, attn=True, **params)
            dq, dk, dvv = bo.attention_backward(op, q, k, v, do, r.tape, q_len=ql, k_len=kl, **params)
        except Exception as e:
            check(False, name, "birkhoff failed: %s" % e)
            return
        W = projection(params, d) if op == "performer" else None
        errs = {"out": 0.0, "attn": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0}
        pad_zero = True
        for b in range(B):
            n, m = Lq[b], Lk[b]
            pad_zero &= bool(np.all(r.out[b, :, n:] == 0) and np.all(dq[b, :, n:] == 0) and
                             np.all(dk[b, :, m:] == 0) and np.all(dvv[b, :, m:] == 0) and
                             np.all(r.attn[b, :, n:] == 0) and np.all(r.attn[b, :, :, m:] == 0))
            if n == 0:
                continue
            tq = torch.tensor(q[b, :, :n], dtype=torch.float64, requires_grad=True)
            tk = torch.tensor(k[b, :, :m], dtype=torch.float64, requires_grad=True)
            tv = torch.tensor(v[b, :, :m], dtype=torch.float64, requires_grad=True)
            o, a = port_problem(op, params, tq, tk, tv, W)
            (o * torch.tensor(do[b, :, :n], dtype=torch.float64)).sum().backward()
            for key, got, ref in (("out", r.out[b, :, :n], o.detach().numpy()),
                                  ("attn", r.attn[b, :, :n, :m], a.detach().numpy()),
                                  ("dq", dq[b, :, :n], tq.grad.numpy()), ("dk", dk[b, :, :m], tk.grad.numpy()),
                                  ("dv", dvv[b, :, :m], tv.grad.numpy())):
                errs[key] = max(errs[key], rel(got, ref))
        ok = pad_zero and errs["out"] <= 1e-5 and errs["attn"] <= 1e-5 and max(
            errs["dq"], errs["dk"], errs["dv"]) <= 1e-4
        check(ok, name, " ".join("%s %.1e" % kv for kv in errs.items()) + ("" if pad_zero else " PADDING NOT ZERO"))

    shapes = [(1, 1, 1, 1, 2, 1), (2, 2, 9, 7, 8, 5), (1, 3, 5, 12, 4, 4), (3, 2, 16, 11, 6, 8), (2, 2, 40, 33, 16, 8)]
    lin_params = [{}, {"eps": 0.0}, {"eps": 0.3}]
    perf_params = [{"features": 7, "seed": 3}, {"features": 40, "seed": 11, "scale": 0.2},
                   {"features": 16, "eps": 1e-4, "scaling": "sqrt_d"}, {"features": 64, "eps": 1e-4}]
    seed = 100
    for op, plist in (("linear", lin_params), ("performer", perf_params)):
        for si, sh in enumerate(shapes):
            for pi, params in enumerate(plist):
                for pad in (0, 1, 2):
                    seed += 1
                    if args.quick and (si + pi + pad) % 2:
                        continue
                    run_case(op, params, *sh, pad, seed)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
