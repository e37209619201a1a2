#!/usr/bin/python3
"""CLI tests for `birkhoff attn`, `birkhoff otk` and `birkhoff asap`: file errors are reported clearly with a
non-zero status and never leave a half-written output; a good run writes
every requested file. Run: /usr/bin/python3 tests/tools/test_cli.py build/birkhoff"""
import os
import subprocess
import sys
import tempfile

import numpy as np
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from checklib import Checks  # noqa: E402


BK = sys.argv[1] if len(sys.argv) > 1 else "build/birkhoff"
check = Checks()


def run(*args):
    p = subprocess.run([BK, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


tmp = tempfile.mkdtemp(prefix="bk_cli_")
P = lambda n: os.path.join(tmp, n)  # noqa: E731
rng = np.random.default_rng(0)
B, H, Nq, Nk, d, dv = 2, 3, 5, 7, 4, 6
np.save(P("q.npy"), rng.standard_normal((B, H, Nq, d)).astype("<f4"))
np.save(P("k.npy"), rng.standard_normal((B, H, Nk, d)).astype("<f4"))
np.save(P("v.npy"), rng.standard_normal((B, H, Nk, dv)).astype("<f4"))
np.save(P("do.npy"), rng.standard_normal((B, H, Nq, dv)).astype("<f4"))
np.save(P("ql.npy"), np.array([5, 2], dtype="<i4"))
np.save(P("kl.npy"), np.array([3, 7], dtype="<i4"))
base = ["attn", "--op", "sinkhorn", "--q", P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy")]

# a good run with every output
rc, out = run(*base, "--out", P("o.npy"), "--attn", P("a.npy"), "--diag", P("diag.npy"), "--iters", "4",
              "--q-len", P("ql.npy"), "--k-len", P("kl.npy"), "--dout", P("do.npy"), "--dq", P("dq.npy"),
              "--dk", P("dk.npy"), "--dv", P("dv.npy"))
check(rc == 0, "good run", out)
if rc == 0:
    o, a, dg = np.load(P("o.npy")), np.load(P("a.npy")), np.load(P("diag.npy"))
    check(o.shape == (B, H, Nq, dv) and a.shape == (B, H, Nq, Nk) and dg.shape == (B, H, 3), "output shapes")
    check(np.all(o[1, :, 2:] == 0) and np.all(a[0, :, :, 3:] == 0), "padding is zero in the outputs")
    cs = a[0, :, :5, :3].sum(axis=1)  # S=4 even: columns exact, = Lq/Lk
    check(np.allclose(cs, 5 / 3, atol=1e-5), "even S: exact columns (Lq/Lk)", str(cs))
    check(np.load(P("dq.npy")).shape == (B, H, Nq, d), "dq written")

# unbalanced Sinkhorn: a good run (damped columns: rows exact after an odd S), and its errors
rc, out = run("attn", "--op", "unbalanced", "--rho", "0.5", "--iters", "3", "--q", P("q.npy"), "--k", P("k.npy"),
              "--v", P("v.npy"), "--out", P("ou.npy"), "--attn", P("au.npy"), "--diag", P("du.npy"),
              "--dout", P("do.npy"), "--dq", P("dqu.npy"))
check(rc == 0 and np.allclose(np.load(P("au.npy")).sum(-1), 1, atol=1e-5) and np.load(P("dqu.npy")).shape == (B, H, Nq, d),
      "unbalanced run (rows sum to 1 after S = 3)", out)
for extra, msg in ((["--rho", "0"], "--rho"), (["--rho", "x"], "--rho"), (["--grad", "implicit"], "sinkhorn only")):
    rc, out = run("attn", "--op", "unbalanced", "--q", P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy"),
                  "--out", P("never_u.npy"), *extra)
    check(rc == 2 and msg in out and not os.path.exists(P("never_u.npy")), "unbalanced usage error %s" % extra, out)
rc, out = run(*base, "--out", P("never_u.npy"), "--rho", "1")
check(rc == 2 and "unbalanced only" in out, "--rho refused for sinkhorn", out)
rc, out = run("attn", "--op", "nope", "--q", P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy"), "--out", P("x.npy"))
check(rc == 2 and "unknown --op" in out and "unbalanced" in out, "unknown --op lists the registry's operators", out)

# softmax op
rc, out = run("attn", "--op", "softmax", "--q", P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy"),
              "--out", P("o2.npy"), "--attn", P("a2.npy"))
check(rc == 0 and np.allclose(np.load(P("a2.npy")).sum(-1), 1, atol=1e-6), "softmax run", out)
rc, out = run("attn", "--op", "softmax", "--q", P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy"),
              "--out", P("o2.npy"), "--iters", "3")
check(rc == 2 and "not to --op softmax" in out, "softmax rejects --iters", out)

# differential attention: a good run (rows of A sum to 1 - lambda, padding, dlambda), lambda = 0 is
# softmax on the first halves bitwise, and its errors
lam = np.array([0.5, -0.25, 1.0], dtype="<f4")
np.save(P("lam.npy"), lam)
np.save(P("lam0.npy"), np.zeros(H, dtype="<f4"))
np.save(P("lam_bad.npy"), np.zeros(H + 1, dtype="<f4"))
dbase = ["attn", "--op", "diff", "--q", P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy")]
rc, out = run(*dbase, "--lambda", P("lam.npy"), "--out", P("od.npy"), "--attn", P("ad.npy"), "--q-len", P("ql.npy"),
              "--k-len", P("kl.npy"), "--dout", P("do.npy"), "--dq", P("dqd.npy"), "--dlambda", P("dld.npy"))
check(rc == 0, "diff run", out)
if rc == 0:
    ad, dl = np.load(P("ad.npy")), np.load(P("dld.npy"))
    rs = ad[1, :, :2].sum(-1)  # batch 1: 2 valid queries
    check(np.allclose(rs, (1 - lam)[:, None], atol=1e-6) and np.all(ad[0, :, :, 3:] == 0)
          and np.all(np.load(P("od.npy"))[1, :, 2:] == 0), "diff: rows of A1 - lambda A2 sum to 1 - lambda, padding zero")
    check(dl.shape == (H,) and np.all(np.isfinite(dl)) and np.load(P("dqd.npy")).shape == (B, H, Nq, d),
          "diff: dlambda [H] and dq written")
np.save(P("q1.npy"), np.ascontiguousarray(np.load(P("q.npy"))[..., :d // 2]))
np.save(P("k1.npy"), np.ascontiguousarray(np.load(P("k.npy"))[..., :d // 2]))
rc1, out1 = run(*dbase, "--lambda", P("lam0.npy"), "--out", P("od0.npy"))
rc2, out2 = run("attn", "--op", "softmax", "--q", P("q1.npy"), "--k", P("k1.npy"), "--v", P("v.npy"),
                "--out", P("os0.npy"))
check(rc1 == 0 and rc2 == 0 and np.array_equal(np.load(P("od0.npy")), np.load(P("os0.npy"))),
      "diff with lambda = 0 == softmax on the first halves (bitwise)", out1 + out2)
for extra, msg, want in (([], "--lambda", 2), (["--lambda", P("lam.npy"), "--iters", "3"], "not to --op diff", 2),
                         (["--lambda", P("lam.npy"), "--dlambda", P("never_d2.npy")], "--dout", 2),
                         (["--lambda", P("lam_bad.npy")], "float32 array [H]", 1),
                         (["--lambda", P("missing.npy")], "missing.npy", 1)):
    rc, out = run(*dbase, "--out", P("never_d.npy"), *extra)
    check(rc == want and msg in out and not os.path.exists(P("never_d.npy")), "diff error %s" % extra[-1:], out)
rc, out = run(*base, "--out", P("never_d.npy"), "--lambda", P("lam.npy"))
check(rc == 2 and "diff only" in out and not os.path.exists(P("never_d.npy")), "--lambda refused for sinkhorn", out)
np.save(P("q3.npy"), rng.standard_normal((B, H, Nq, 3)).astype("<f4"))
np.save(P("k3.npy"), rng.standard_normal((B, H, Nk, 3)).astype("<f4"))
rc, out = run("attn", "--op", "diff", "--lambda", P("lam.npy"), "--q", P("q3.npy"), "--k", P("k3.npy"),
              "--v", P("v.npy"), "--out", P("never_d.npy"), "--attn", P("never_da.npy"))
check(rc == 1 and "even" in out and not os.path.exists(P("never_d.npy")) and not os.path.exists(P("never_da.npy")),
      "diff: an odd head dimension fails, nothing written", out)


def bad_case(name, files, extra=(), want_rc=1, want_msg=""):
    out_path = P("never.npy")
    if os.path.exists(out_path):
        os.remove(out_path)
    args = list(base)
    for flag, path in files.items():
        args[args.index(flag) + 1] = path
    rc, out = run(*args, "--out", out_path, *extra)
    check(rc == want_rc and want_msg in out and not os.path.exists(out_path),
          f"error: {name}", f"rc={rc} out={out.strip()}")
    leftovers = [f for f in os.listdir(tmp) if ".tmp." in f or ".bk-" in f or f.endswith(".staged")]
    check(not leftovers, f"no temporary files left: {name}", str(leftovers))


raw = open(P("q.npy"), "rb").read()
open(P("badmagic.npy"), "wb").write(b"XX" + raw[2:])
open(P("trunc.npy"), "wb").write(raw[:-7])
np.save(P("f64.npy"), rng.standard_normal((B, H, Nq, d)))
np.save(P("i32.npy"), np.zeros((B, H, Nq, d), dtype="<i4"))
np.save(P("q3d.npy"), rng.standard_normal((B, H, Nq)).astype("<f4"))
np.save(P("kwrong.npy"), rng.standard_normal((B, H, Nk, d + 1)).astype("<f4"))
np.save(P("vwrong.npy"), rng.standard_normal((B, H, Nk + 1, dv)).astype("<f4"))
np.save(P("qlbig.npy"), np.array([9, 2], dtype="<i4"))
np.save(P("qlshort.npy"), np.array([1], dtype="<i4"))
qn = rng.standard_normal((B, H, Nq, d)).astype("<f4")
qn[1, 2, 3, 0] = np.nan
np.save(P("qnan.npy"), qn)

bad_case("bad magic", {"--q": P("badmagic.npy")}, want_msg="bad magic")
bad_case("truncated data", {"--q": P("trunc.npy")}, want_msg="truncated")
bad_case("float64 dtype", {"--q": P("f64.npy")}, want_msg="dtype")
bad_case("int32 data", {"--q": P("i32.npy")}, want_msg="float32")
bad_case("3-d array", {"--q": P("q3d.npy")}, want_msg="4 dimensions")
bad_case("K shape mismatch", {"--k": P("kwrong.npy")}, want_msg="K has shape")
bad_case("V shape mismatch", {"--v": P("vwrong.npy")}, want_msg="V has shape")
bad_case("missing file", {"--q": P("nope.npy")}, want_msg="cannot open")
bad_case("length > N", {}, extra=["--q-len", P("qlbig.npy")], want_msg="q_len")
bad_case("length array wrong size", {}, extra=["--q-len", P("qlshort.npy")], want_msg="shape [2]")
bad_case("NaN input", {"--q": P("qnan.npy")}, want_msg="non-finite")
bad_case("eps <= 0", {}, extra=["--eps", "0"], want_rc=2, want_msg="--eps")
bad_case("iters < 1", {}, extra=["--iters", "0"], want_rc=2, want_msg="--iters")
bad_case("iters not a number", {}, extra=["--iters", "3x"], want_rc=2, want_msg="--iters")
bad_case("unknown option", {}, extra=["--bogus", "1"], want_rc=2, want_msg="unknown option")
bad_case("dq without dout", {}, extra=["--dq", P("x.npy")], want_rc=2, want_msg="need --dout")
bad_case("unwritable output dir", {}, extra=["--attn", "/nonexistent/dir/a.npy"], want_msg="cannot write /nonexistent/dir/a.npy")

# ESP through the CLI
esp = ["attn", "--op", "esp", "--q", P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy")]
rc, out = run(*esp, "--out", P("oe.npy"), "--attn", P("ae.npy"), "--sigma", P("se.npy"), "--tau", "2",
              "--q-len", P("ql.npy"), "--k-len", P("kl.npy"), "--diag", P("de.npy"))
check(rc == 0, "esp hard run", out)
if rc == 0:
    a, sg = np.load(P("ae.npy")), np.load(P("se.npy"))
    check(sg.shape == (B, H, d) and np.allclose(sg.sum(-1), 1, atol=1e-6), "esp sigma written, sums to 1")
    # hard ESP: rows sum to 1, columns to Lq/Lk on the valid block (cross-attention: 5 x 3 and 2 x 7)
    check(np.allclose(a[0, :, :5, :3].sum(-1), 1, atol=1e-5) and np.allclose(a[0, :, :5, :3].sum(-2), 5 / 3, atol=1e-5),
          "esp hard plan: exact marginals on the valid block")
    check(np.load(P("de.npy")).shape == (B, H, 2), "esp diag shape")
np.save(P("theta.npy"), rng.standard_normal((3, d)).astype("<f4"))
rc, out = run(*esp, "--out", P("oe.npy"), "--sort", "soft", "--softsort-t", "0.3", "--slices", P("theta.npy"),
              "--dout", P("do.npy"), "--dq", P("dqe.npy"), "--dslices", P("dth.npy"))
check(rc == 0 and np.load(P("dth.npy")).shape == (3, d), "esp soft with slices and dslices", out)
np.save(P("thetabad.npy"), rng.standard_normal((3, d + 1)).astype("<f4"))
rc, out = run(*esp, "--out", P("never.npy"), "--slices", P("thetabad.npy"))
check(rc == 1 and "[L, d]" in out and not os.path.exists(P("never.npy")), "esp rejects mismatched slices", out)
for bad, msg in ((["--sort", "medium"], "--sort"), (["--tau", "-1"], "--tau"), (["--tau", "nan"], "--tau"),
                 (["--sort", "soft", "--softsort-t", "0"], "SoftSort temperature"), (["--cost", "l1"], "--cost"),
                 (["--esp-scale", "x"], "--esp-scale"), (["--num-slices", "-1"], "--num-slices"),
                 (["--iters", "3"], "not to --op esp")):
    rc, out = run(*esp, "--out", P("never.npy"), *bad)
    check(rc == 2 and msg in out, f"esp usage error {bad}", out)
rc, out = run("attn", "--op", "sinkhorn", "--q", P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy"),
              "--out", P("never.npy"), "--tau", "1")
check(rc == 2 and "esp only" in out, "sinkhorn rejects ESP options", out)

# LOT through the CLI
r_ = 3
np.save(P("Z.npy"), rng.standard_normal((H, r_, d)).astype("<f4"))
np.save(P("th.npy"), rng.standard_normal((H, r_)).astype("<f4"))
lot = ["attn", "--op", "lot", "--q", P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy"), "--pivots", P("Z.npy"),
       "--pivot-logits", P("th.npy")]
rc, out = run(*lot, "--out", P("ol.npy"), "--attn", P("al.npy"), "--iters", "5", "--pivot-temp", "0.5",
              "--q-len", P("ql.npy"), "--k-len", P("kl.npy"), "--diag", P("dl.npy"), "--dout", P("do.npy"),
              "--dpivots", P("dz.npy"), "--dpivot-logits", P("dth.npy"), "--dq", P("dql.npy"))
check(rc == 0, "lot run", out)
if rc == 0:
    a = np.load(P("al.npy"))
    check(np.allclose(a[0, :, :5, :3].sum(-1), 1, atol=1e-5) and np.all(a[0, :, :, 3:] == 0),
          "lot: odd T rows exact on the valid block, zeros on padded keys")
    check(np.linalg.matrix_rank(a[1, 0, :2, :7].astype(np.float64), tol=1e-5) <= r_, "lot: rank(A) <= r")
    check(np.load(P("dz.npy")).shape == (H, r_, d) and np.load(P("dth.npy")).shape == (H, r_)
          and np.load(P("dl.npy")).shape == (B, H, 4), "lot: pivot gradients and diag written")
np.save(P("Zbad.npy"), rng.standard_normal((H, r_, d + 1)).astype("<f4"))
np.save(P("thbad.npy"), rng.standard_normal((H, r_ + 1)).astype("<f4"))
rc, out = run(*lot, "--out", P("never.npy"), "--pivots", P("Zbad.npy"))
check(rc == 1 and "[H, r, d]" in out and not os.path.exists(P("never.npy")), "lot rejects mismatched pivots", out)
rc, out = run(*lot, "--out", P("never.npy"), "--pivot-logits", P("thbad.npy"))
check(rc == 1 and "[H, r]" in out and not os.path.exists(P("never.npy")), "lot rejects mismatched logits", out)
rc, out = run("attn", "--op", "lot", "--q", P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy"), "--out", P("never.npy"))
check(rc == 2 and "--pivots" in out, "lot needs pivots", out)
rc, out = run(*lot, "--out", P("never.npy"), "--pivot-temp", "0")
check(rc == 2 and "--pivot-temp" in out, "lot rejects temp 0", out)
rc, out = run(*lot, "--out", P("never.npy"), "--dpivots", P("x.npy"))
check(rc == 2 and "need --dout" in out, "lot --dpivots needs --dout", out)
rc, out = run(*esp, "--out", P("never.npy"), "--pivots", P("Z.npy"))
check(rc == 2 and "lot only" in out, "esp rejects LOT options", out)

rc, out = run("attn", "--op", "nope", "--q", "a", "--k", "b", "--v", "c", "--out", "d")
check(rc == 2 and "unknown --op" in out, "unknown op", out)
rc, out = run("frobnicate")
check(rc == 2 and "unknown command" in out, "unknown command", out)
rc, out = run("attn", "--help")
check(rc == 0 and "usage" in out and all(o in out for o in ("softmax", "sinkhorn", "lot", "asap0")),
      "attn --help lists the registry's operators", out)
rc, out = run("attn", "--op", "lot", "--help")
check(rc == 0 and "--pivot-temp" in out and "--pivots" in out and "[H, r, d]" in out and "--dpivots" in out,
      "attn --op lot --help: its generated options", out)
# the operator table of docs/OPERATORS.md is the registry's (scripts/gen_operators_md.sh regenerates it)
rc, out = run("attn", "--list", "--markdown")
doc = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "OPERATORS.md")).read()
block = doc[doc.index("<!-- BEGIN generated"):].split("\n", 1)[1].split("<!-- END generated -->")[0]
check(rc == 0 and out == block, "docs/OPERATORS.md's table is current (scripts/gen_operators_md.sh)",
      "differs from `birkhoff attn --list --markdown`")
# every registered operator runs through `birkhoff attn` from its registration alone (its required input
# arrays made from the schema's shapes, every output array asked for), bitwise as the Python bindings' generic
# path: an operator registered later is covered with no edit here or in the CLI
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import birkhoff as bkpy  # noqa: E402
from birkhoff import _core as bkcore, _lib as bklib  # noqa: E402
for name in bkpy.operators():
    sc = bkcore.schema(name)
    if any(a["kind"] & bklib.OP_ARRAY_FILE and a["kind"] & bklib.OP_ARRAY_REQUIRED for a in sc["arrays"]):
        continue   # a file input (asap's layer): tested above
    reg = bkcore.Registered(name, {})
    desc = bklib.AttnDesc(B, H, Nq, Nk, d, dv, None, None)
    args = ["attn", "--op", name, "--q", P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy"), "--q-len", P("ql.npy"),
            "--k-len", P("kl.npy"), "--out", P("g_%s_o.npy" % name)]
    kw, outs = {}, {}
    for j, a in enumerate(sc["arrays"]):
        flag = "--" + a["name"].replace("_", "-")
        if a["kind"] & bklib.OP_ARRAY_IN:
            if a["kind"] & bklib.OP_ARRAY_REQUIRED:
                x = rng.standard_normal(reg.shape(j, desc)).astype("<f4") * 0.5
                np.save(P("g_%s_%s.npy" % (name, a["name"])), x)
                args += [flag, P("g_%s_%s.npy" % (name, a["name"]))]
                kw[a["name"]] = x
        elif not a["kind"] & bklib.OP_ARRAY_BWD or sc["backward"]:
            outs[a["name"]] = P("g_%s_%s.npy" % (name, a["name"]))
            args += [flag, outs[a["name"]]]
    if sc["backward"]:
        args += ["--dout", P("do.npy"), "--dq", P("g_%s_dq.npy" % name)]
    rc, out = run(*args)
    ok = rc == 0
    if ok:
        ref = bkpy.attention(name, *(np.load(P(f)) for f in ("q.npy", "k.npy", "v.npy")), q_len=[5, 2], k_len=[3, 7],
                             **kw, **{o: True for o in outs if not sc["arrays"][reg._array(o)]["kind"] & bklib.OP_ARRAY_BWD})
        ok = np.array_equal(np.load(P("g_%s_o.npy" % name)), ref.out) and all(
            np.array_equal(np.load(outs[o]), ref[o]) for o in outs if o in ref)
        if sc["backward"]:
            g = bkpy.attention_backward(name, *(np.load(P(f)) for f in ("q.npy", "k.npy", "v.npy", "do.npy")),
                                        ref.tape, q_len=[5, 2], k_len=[3, 7], **kw)
            ok = ok and np.array_equal(np.load(P("g_%s_dq.npy" % name)), g[0])
    check(ok, "attn --op %s from its registration alone (every output array; == birkhoff.attention bitwise)" % name,
          out)

rc, out = run("bench", "--cases", "2:3", "--no-peer")
check(rc == 2, "bench rejects malformed --cases", out)
rc, out = run("bench", "--cases", "2:16:8:3", "--op", "sinkhorn", "--no-peer", "--reps", "3", "--json")
check(rc == 0 and '"op": "sinkhorn"' in out, "bench --json runs", out)
# cases beyond the machine's memory (or whose sizes wrap size_t): a message and status 1, never a crash
for args in (["--op", "sinkhorn", "--cases", "1:100000000:64"], ["--op", "softmax", "--cases", "2147483647:2147483647:64"],
             ["--op", "lot", "--cases", "1:2147483647:2147483647"],
             ["--op", "otk", "--cases", "2147483647:2147483647:2147483647:1:1:1:1"],
             ["--op", "asap", "--cases", "1:2147483647:64"]):
    rc, out = run("bench", *args, "--no-peer", "--reps", "1", "--warmup", "0")
    check(rc == 1 and "too large" in out, "bench %s: too large, refused" % " ".join(args), out)

# ---- otk -------------------------------------------------------------------------
Bo, no, do_, qo, po, ko = 3, 6, 4, 2, 3, 5
Xo = rng.standard_normal((Bo, no, do_)).astype("<f4") * 0.5
Xo[1, 4:] = np.nan  # padding is never read
np.save(P("ox.npy"), Xo)
np.save(P("olen.npy"), np.array([6, 4, 5], dtype="<i4"))
Wo = rng.standard_normal((ko, do_)); Wo /= np.linalg.norm(Wo, axis=1, keepdims=True)
np.save(P("ow.npy"), Wo.astype("<f4"))
np.save(P("oz.npy"), (rng.standard_normal((qo, po, ko)) * 0.5).astype("<f4"))
np.save(P("oz_id.npy"), (rng.standard_normal((qo, po, do_)) * 0.5).astype("<f4"))
np.save(P("odo.npy"), rng.standard_normal((Bo, po, qo * ko)).astype("<f4"))
otk = ["otk", "embed", "--x", P("ox.npy"), "--lengths", P("olen.npy"), "--refs", P("oz.npy"), "--anchors", P("ow.npy")]
rc, out = run(*otk, "--out", P("ophi.npy"), "--plan", P("oplan.npy"), "--diag", P("odiag.npy"), "--iters", "14",
              "--dout", P("odo.npy"), "--dx", P("odx.npy"), "--drefs", P("odz.npy"), "--danchors", P("odw.npy"))
check(rc == 0, "otk embed good run", out)
if rc == 0:
    phi, pl = np.load(P("ophi.npy")), np.load(P("oplan.npy"))
    check(phi.shape == (Bo, po, qo * ko) and np.isfinite(phi).all(), "otk: Phi [B, p, q*k], finite")
    check(pl.shape == (Bo, qo, no, po) and np.all(pl[1, :, 4:] == 0), "otk: plan [B, q, n, p], padded rows zero")
    c = np.sqrt(po / qo)
    check(np.allclose(pl.sum(axis=2), c / po, atol=1e-6), "otk: plan columns exact (c/p)")
    check(np.load(P("odiag.npy")).shape == (Bo, qo, 2), "otk: diag [B, q, 2]")
    dx = np.load(P("odx.npy"))
    check(dx.shape == (Bo, no, do_) and np.all(dx[1, 4:] == 0) and np.isfinite(dx).all(), "otk: dx, zero on padding")
    check(np.load(P("odz.npy")).shape == (qo, po, ko) and np.load(P("odw.npy")).shape == (ko, do_), "otk: dz, dW shapes")
rc, out = run("otk", "embed", "--x", P("ox.npy"), "--lengths", P("olen.npy"), "--refs", P("oz_id.npy"),
              "--out", P("ophi2.npy"), "--domain", "scaling", "--convention", "reference", "--pe", "1d", "--pe-double")
check(rc == 0 and np.load(P("ophi2.npy")).shape == (Bo, po, qo * do_), "otk identity map, scaling, reference, PE", out)
for bad, msg, code in [(["--eps", "0"], "--eps", 2), (["--sigma", "-1"], "--sigma", 2), (["--iters", "0"], "--iters", 2),
                       (["--domain", "x"], "--domain", 2), (["--pe", "2d"], "--grid", 2), (["--grid", "2x3"], "--pe", 2),
                       (["--danchors", P("w.npy")], "--dout", 2), (["--k", "3"], "fit-anchors", 2)]:
    rc, out = run(*otk, "--out", P("never.npy"), *bad)
    check(rc == code and msg in out and not os.path.exists(P("never.npy")), f"otk usage error {bad}", out)
np.save(P("olen0.npy"), np.array([6, 0, 5], dtype="<i4"))
rc, out = run("otk", "embed", "--x", P("ox.npy"), "--lengths", P("olen0.npy"), "--refs", P("oz.npy"), "--anchors",
              P("ow.npy"), "--out", P("never.npy"))
check(rc == 1 and "empty" in out and not os.path.exists(P("never.npy")), "otk empty set refused", out)
rc, out = run("otk", "embed", "--x", P("ox.npy"), "--refs", P("oz.npy"), "--out", P("never.npy"))
check(rc == 1 and "must equal d" in out and not os.path.exists(P("never.npy")), "otk identity needs k = d", out)
np.save(P("owbad.npy"), Wo[:, :3].astype("<f4"))
rc, out = run("otk", "embed", "--x", P("ox.npy"), "--lengths", P("olen.npy"), "--refs", P("oz.npy"), "--anchors",
              P("owbad.npy"), "--out", P("never.npy"))
check(rc == 1 and "anchors must be" in out and not os.path.exists(P("never.npy")), "otk anchors shape checked", out)
rc, out = run("otk", "embed", "--x", P("ox.npy"), "--refs", P("oz_id.npy"), "--out", P("never.npy"))
check(rc == 1 and "non-finite" in out and not os.path.exists(P("never.npy")), "otk NaN in a valid element refused", out)
rc, out = run("otk", "embed", "--x", P("missing.npy"), "--refs", P("oz.npy"), "--out", P("never.npy"))
check(rc == 1 and "missing.npy" in out, "otk missing file", out)
rc, out = run(*otk, "--iters", "7", "--out", P("never.npy"))
check(rc != 0 and "even" in out and "half-steps" in out and not os.path.exists(P("never.npy")),
      "otk --iters counts half-steps: an odd count refused", out)
rc, out = run("otk", "fit-anchors", "--x", P("ox.npy"), "--lengths", P("olen.npy"), "--k", "4", "--seed", "3",
              "--out", P("ofw.npy"))
W1 = np.load(P("ofw.npy")) if rc == 0 else None
check(rc == 0 and W1.shape == (4, do_) and np.allclose(np.linalg.norm(W1, axis=1), 1, atol=1e-5), "otk fit-anchors", out)
rc, out = run("otk", "fit-anchors", "--x", P("ox.npy"), "--lengths", P("olen.npy"), "--k", "4", "--seed", "3",
              "--threads", "1", "--out", P("ofw2.npy"))
check(rc == 0 and np.array_equal(W1, np.load(P("ofw2.npy"))), "otk fit-anchors reproducible, any thread count", out)
rc, out = run("otk", "fit-anchors", "--x", P("ox.npy"), "--lengths", P("olen.npy"), "--k", "100", "--out", P("never.npy"))
check(rc == 1 and "only" in out and not os.path.exists(P("never.npy")), "otk fit-anchors k > samples refused", out)
rc, out = run("otk", "fit-refs", "--x", P("ox.npy"), "--lengths", P("olen.npy"), "--anchors", P("ow.npy"), "--q", "2",
              "--p", "3", "--barycenter", "2", "--out", P("ofz.npy"))
check(rc == 0 and np.load(P("ofz.npy")).shape == (2, 3, ko), "otk fit-refs (q = 2, barycenter)", out)
rc, out = run("otk", "fit-refs", "--x", P("ox.npy"), "--lengths", P("olen.npy"), "--q", "4", "--p", "3",
              "--out", P("never.npy"))
check(rc == 1 and "sets" in out and not os.path.exists(P("never.npy")), "otk fit-refs q > sets refused", out)
rc, out = run("otk", "nope")
check(rc == 2 and "unknown subcommand" in out, "otk unknown subcommand", out)
rc, out = run("bench", "--op", "otk", "--cases", "2:20:4:6:3:2:3", "--no-peer", "--reps", "2", "--warmup", "0", "--json")
check(rc == 0 and '"op": "otk"' in out, "bench --op otk runs", out)

# ---- asap ------------------------------------------------------------------------
gen = ["asap", "generate", "--b", "2", "--h", "2", "--n", "24", "--d", "8"]
for sd in (11, 12, 13):
    rc, out = run(*gen, "--seed", str(sd), "--out-q", P(f"cq{sd}.npy"), "--out-k", P(f"ck{sd}.npy"), "--out-v", P(f"cv{sd}.npy"))
    check(rc == 0, "asap generate", out)
rc, out = run(*gen, "--seed", "1", "--out-q", P("hq.npy"), "--out-k", P("hk.npy"), "--out-v", P("hv.npy"))
check(rc == 0 and np.load(P("hq.npy")).shape == (2, 2, 24, 8), "asap generate shapes", out)
np.save(P("hql.npy"), np.array([24, 17], dtype="<i4"))
np.save(P("hkl.npy"), np.array([24, 17], dtype="<i4"))
cal = ["asap", "calibrate", "--q", P("cq*.npy"), "--k", P("ck*.npy"), "--teacher-iters", "10", "--slices", "8"]
rc, out = run(*cal, "--out", P("l.asap"), "--json")
check(rc == 0 and '"problems": 12' in out and '"fit": "ls"' in out, "asap calibrate (glob, LS, json)", out)
rc, out = run("asap", "calibrate", "--q", P("cq11.npy") + "," + P("cq12.npy"), "--k", P("ck11.npy") + "," + P("ck12.npy"),
              "--q-len", P("hql.npy") + "," + P("hql.npy"), "--k-len", P("hkl.npy") + "," + P("hkl.npy"),
              "--teacher-iters", "5", "--slices", "8", "--fit", "kl", "--out", P("lk.asap"))
check(rc == 0 and "converged" in out and "NOT" not in out, "asap calibrate (comma lists, lengths, KL)", out)
rc, out = run("asap", "show", "--layer", P("l.asap"), "--theta-out", P("th.npy"), "--omega-out", P("om.npy"))
check(rc == 0 and '"ending": "column"' in out and np.load(P("th.npy")).shape == (8, 8)
      and np.load(P("om.npy")).shape == (8,), "asap show", out)
rc, out = run("asap", "calibrate", "--q", P("cq11.npy"), "--k", P("ck11.npy"), "--theta", P("th.npy"), "--out", P("lt.asap"))
check(rc == 0, "asap calibrate with a supplied bank", out)
attn = ["attn", "--q", P("hq.npy"), "--k", P("hk.npy"), "--v", P("hv.npy"), "--layer", P("l.asap")]
for op, col in (("asap", True), ("asap0", True)):
    rc, out = run(*attn, "--op", op, "--out", P("ao.npy"), "--attn", P("aa.npy"), "--diag", P("ad.npy"),
                  "--q-len", P("hql.npy"), "--k-len", P("hkl.npy"))
    ok = rc == 0
    if ok:
        a, o = np.load(P("aa.npy")), np.load(P("ao.npy"))
        ok = (np.allclose(a[0].sum(axis=1), 1, atol=2e-5) and np.allclose(a[1, :, :17, :17].sum(axis=1), 1, atol=2e-5)
              and np.all(a[1, :, 17:] == 0) and np.all(a[1, :, :, 17:] == 0) and np.all(o[1, :, 17:] == 0))
    check(ok, f"attn --op {op}: exact columns, zero padding", out)
rc, out = run(*attn, "--op", "asap", "--variant", "row", "--out", P("ao.npy"), "--attn", P("aa.npy"))
check(rc == 0 and np.allclose(np.load(P("aa.npy")).sum(-1), 1, atol=2e-5), "attn --op asap --variant row: exact rows", out)
rc, out = run("asap", "report", "--layer", P("l.asap"), "--q", P("hq.npy"), "--k", P("hk.npy"), "--v", P("hv.npy"),
              "--json", "--reps", "1")
rows = [ln for ln in out.splitlines() if ln.startswith("{")]
check(rc == 0 and len(rows) == 5 and '"method": "asap0"' in out and '"method": "sinkhorn S=5"' in out, "asap report", out)
rc, out = run("asap", "report", "--layer", P("l.asap"), "--q", P("hq.npy"), "--k", P("hk.npy"), "--v", P("hv.npy"))
check(rc == 0 and "teacher S=10" in out and "attn rl2" in out, "asap report table", out)
# bad input
with open(P("l.asap"), "rb") as f:
    blob = bytearray(f.read())
bad = bytearray(blob)
bad[len(bad) // 2] ^= 0x10
open(P("bad.asap"), "wb").write(bad)
rc, out = run("attn", "--op", "asap", "--layer", P("bad.asap"), "--q", P("hq.npy"), "--k", P("hk.npy"), "--v", P("hv.npy"),
              "--out", P("never.npy"))
check(rc == 1 and "checksum" in out and not os.path.exists(P("never.npy")), "attn --op asap: corrupt layer refused", out)
ver = bytearray(blob)
ver[8] = 9
open(P("ver.asap"), "wb").write(ver)
rc, out = run("asap", "show", "--layer", P("ver.asap"))
check(rc == 1 and "version 9" in out, "asap: layer version mismatch refused", out)
for args, code, msg in (
        (["--slices", "0"], 2, "--slices"), (["--lambda", "-1"], 2, "--lambda"), (["--teacher-iters", "1"], 2, "softmax"),
        (["--fit", "nope"], 2, "--fit"), (["--seed", "1", "--theta", P("th.npy")], 2, "not both")):
    rc, out = run(*cal, "--out", P("never.asap"), *args)
    check(rc == code and msg in out and not os.path.exists(P("never.asap")), f"asap calibrate usage error {args}", out)
rc, out = run("asap", "calibrate", "--q", P("nomatch*.npy"), "--k", P("ck11.npy"), "--out", P("never.asap"))
check(rc == 1 and "matches no file" in out and not os.path.exists(P("never.asap")), "asap calibrate: empty glob", out)
rc, out = run("asap", "calibrate", "--q", P("cq11.npy"), "--k", P("ck11.npy") + "," + P("ck12.npy"), "--out", P("never.asap"))
check(rc == 1 and "must match" in out, "asap calibrate: list lengths differ", out)
np.save(P("zl.npy"), np.array([0, 0], dtype="<i4"))
rc, out = run("asap", "calibrate", "--q", P("cq11.npy"), "--k", P("ck11.npy"), "--q-len", P("zl.npy"), "--out", P("never.asap"))
check(rc == 1 and "empty" in out and not os.path.exists(P("never.asap")), "asap calibrate: empty calibration set", out)
rc, out = run(*attn, "--op", "asap", "--out", P("never.npy"), "--dout", P("hq.npy"))
check(rc == 2 and "inference only" in out, "attn --op asap has no backward", out)
rc, out = run("attn", "--op", "asap", "--q", P("q.npy"), "--k", P("k.npy"), "--v", P("v.npy"), "--layer", P("l.asap"),
              "--out", P("never.npy"))
check(rc == 1 and "head dim" in out and not os.path.exists(P("never.npy")), "attn --op asap: d mismatch", out)
rc, out = run("attn", "--op", "asap", "--q", P("hq.npy"), "--k", P("hk.npy"), "--v", P("hv.npy"), "--out", P("never.npy"))
check(rc == 2 and "--layer" in out, "attn --op asap needs --layer", out)
rc, out = run("asap", "nope")
check(rc == 2 and "unknown subcommand" in out, "asap unknown subcommand", out)
rc, out = run("bench", "--op", "asap", "--cases", "2:32:8", "--no-peer", "--reps", "1", "--warmup", "0", "--calib", "2",
              "--json")
check(rc == 0 and out.count('"op": "asap"') == 5, "bench --op asap runs", out)

# ---- issue 41: numbers that cannot be represented, integers that would wrap, raw bytes in messages ----


def run_bytes(*args):
    """(status, stderr bytes): messages are checked byte by byte (text=True would fail on 0xFF)"""
    p = subprocess.run([BK, *args], capture_output=True, timeout=120)
    return p.returncode, p.stderr


# finite inputs whose scores overflow float32: status 1, a message naming the overflow, no output, no
# diagnostics line claiming zero errors
np.save(P("qbig.npy"), (rng.standard_normal((B, H, Nq, d)) * 1e20).astype("<f4"))
np.save(P("kbig.npy"), (rng.standard_normal((B, H, Nk, d)) * 1e20).astype("<f4"))
np.save(P("dvbig.npy"), rng.standard_normal((B, H, Nq, d)).astype("<f4"))
for op, extra in (("softmax", []), ("sinkhorn", ["--diag", P("never_diag.npy")]), ("unbalanced", []), ("esp", []),
                  ("diff", ["--lambda", P("lam.npy")])):
    rc, out = run("attn", "--op", op, "--q", P("qbig.npy"), "--k", P("kbig.npy"), "--v", P("v.npy"),
                  "--out", P("never_big.npy"), *extra)
    check(rc == 1 and "overflow" in out and "|row sum - 1| 0" not in out and not os.path.exists(P("never_big.npy"))
          and not os.path.exists(P("never_diag.npy")), "attn --op %s: scores overflowing float32 refused" % op, out)
rc, out = run(*base, "--scale", "1e38", "--out", P("never_big.npy"), "--diag", P("never_diag.npy"))
check(rc == 1 and "overflow" in out and not os.path.exists(P("never_big.npy")), "attn --scale 1e38: overflow refused",
      out)
np.save(P("dobig.npy"), np.full((B, H, Nq, dv), 3e38, "<f4"))
rc, out = run(*base, "--out", P("never_big.npy"), "--dout", P("dobig.npy"), "--dq", P("never_dq.npy"))
check(rc == 1 and "gradient" in out and "overflow" in out and not os.path.exists(P("never_dq.npy")),
      "attn backward whose gradients overflow refused", out)
# floats that float32 cannot hold, and non-finite ones, where a finite value is needed
for flag, val in (("--scale", "1e39"), ("--eps", "1e39"), ("--tol", "1e-50")):   # (inf, 0 as float32)
    rc, out = run(*base, "--out", P("never_f.npy"), flag, val)
    check(rc == 2 and flag in out and not os.path.exists(P("never_f.npy")), "attn %s %s refused" % (flag, val), out)
# integers that would wrap: refused with the argument's name and range
for args, msg in ((["model", "init", "--seed", "-1"], "--seed"), (["model", "init", "--seed", "1e23"], "--seed"),
                  (["model", "init", "--seed", "18446744073709551616"], "--seed"),
                  (["model", "init", "--seed", " 5"], "--seed")):
    rc, out = run(*args, "--out", P("never.safetensors"))
    check(rc == 2 and msg in out and "18446744073709551615" in out and not os.path.exists(P("never.safetensors")),
          "%s refused" % " ".join(args), out)
rc, out = run("model", "init", "--seed", "18446744073709551615", "--out", P("seedmax.safetensors"))
check(rc == 0 and os.path.exists(P("seedmax.safetensors")), "model init --seed 2^64-1 accepted", out)
rc, out = run("model", "train", "--ckpt", P("none.st"), "--labels", P("none.npy"), "--out", P("never.st"), "--steps", "1",
              "--micro", "4294967296")
check(rc == 2 and "--micro" in out, "model train --micro 2^32: refused naming --micro", out)
rc, out = run("version", "--x")
check(rc == 2 and "no arguments" in out, "version with an argument refused", out)
open(P("h.txt"), "wb").write(b"the cat \xff sat\n")
open(P("r.txt"), "wb").write(b"the cat sat\n")
rc, out = run("bleu", "--hyp", P("h.txt"), "--ref", P("r.txt"))
check(rc == 1 and "h.txt" in out and "UTF-8" in out, "bleu: hypotheses not UTF-8, the message names the file", out)
rc, out = run("data", "info", "listops", "--seq-len", "-5")
check(rc == 2 and "--seq-len" in out, "data info --seq-len -5 refused (not the default)", out)
np.save(P("x3.npy"), rng.standard_normal((2, 4, 3)).astype("<f4"))
np.save(P("z3.npy"), rng.standard_normal((1, 4, 3)).astype("<f4"))
for i, (args, msg) in enumerate((
        ((*base, "--out", P("never_i0.npy"), "--threads", "5000"), "--threads"),
        (("bench", "--op", "sinkhorn", "--cases", "4294967297:16:8:3", "--no-peer", "--reps", "1"), "--cases"),
        (("bench", "--op", "sinkhorn", "--cases", "2:16:8:3", "--threads", "5000", "--no-peer", "--reps", "1"),
         "--threads"),
        (("otk", "embed", "--x", P("x3.npy"), "--refs", P("z3.npy"), "--pe", "2d", "--grid", "4294967298x1",
          "--out", P("never_i3.npy")), "--grid"))):
    rc, out = run(*args)
    check(rc == 2 and msg in out and not os.path.exists(P("never_i%d.npy" % i)),
          "integer out of range refused: %s" % " ".join(args[-4:]), out[:300])
# raw bytes in messages: control characters, ANSI escapes and invalid UTF-8 escaped, valid UTF-8 kept
evil = os.path.join(tmp, "").encode() + b"x\x1b[2J\x1b]0;pwned\x07\r\xc2\x9b31m\xff\xfe"
E = lambda n: P(n).encode()  # noqa: E731
for args in ((b"attn", b"--op", b"sinkhorn", b"--q", evil, b"--k", E("k.npy"), b"--v", E("v.npy"), b"--out",
              E("never_e.npy")),
             (b"attn", b"--op", b"sinkhorn", b"--q", E("q.npy"), b"--k", E("k.npy"), b"--v", E("v.npy"), b"--out",
              E("never_e.npy"), b"--iters", b"3\x1b[31m\xff"),
             (b"attn", b"--op", b"bad\x1b[5m\xc2\x9b\xff", b"--q", E("q.npy"), b"--k", E("k.npy"), b"--v", E("v.npy"),
              b"--out", E("never_e.npy")),
             (b"model", b"init", b"--config", b"arch=\x1b[2J\xffvit", b"--out", E("never_e.safetensors")),
             (b"bleu", b"--hyp", evil, b"--ref", evil),
             (b"no\x1b[2J\xffsuch-command",)):
    rc, err = run_bytes(*args)
    raw = [c for c in err if (c < 0x20 and c not in (0x0A, 0x09)) or c == 0x7F]
    try:
        err.decode("utf-8")
        utf8 = b"\xc2\x9b" not in err   # the C1 CSI is valid UTF-8 but a terminal control
    except UnicodeDecodeError:
        utf8 = False
    check(rc != 0 and err and not raw and utf8 and b"\\x1b" in err and b"\\xff" in err,
          "stderr escaped: %r" % (args[:2],), repr(err[:300]))
rc, err = run_bytes("attn", "--op", "sinkhorn", "--q", os.path.join(tmp, "caf\u00e9-\u20ac.npy").encode(), "--k",
                    P("k.npy"), "--v", P("v.npy"), "--out", P("never_e.npy"))
check(rc == 1 and "caf\u00e9-\u20ac.npy".encode() in err, "stderr keeps valid UTF-8 (café-€)", repr(err))

# ---- checkpoints of the build before the operator schema (issue 42) ----
# Their config text has the old attention keys (sk_*, esp_*, lot_*); they load,
# converted to the sites' attn.* keys, and give that build's logits bit for bit.
FX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
F = lambda n: os.path.join(FX, n)  # noqa: E731
for name, data in (("lot", ["--x", F("old_img.npy"), "--labels", F("old_y.npy")]),
                   ("s2s", ["--tokens", F("old_tok.npy"), "--len", F("old_tlen.npy"), "--tgt", F("old_tgt.npy"),
                            "--tgt-len", F("old_tgtlen.npy")]),
                   ("set", ["--x", F("old_pts.npy"), "--labels", F("old_y.npy")])):
    od = P("old_" + name)
    os.makedirs(od, exist_ok=True)
    rc, out = run("model", "grads", "--ckpt", F(f"old_{name}.ckpt"), *data, "--out-dir", od)
    same = rc == 0 and open(os.path.join(od, "logits.npy"), "rb").read() == open(F(f"old_{name}.logits.npy"), "rb").read()
    check(same, f"a checkpoint of the build before the schema ({name}) loads: the same logits, bitwise", out[-300:])
rc, out = run("model", "show", "--ckpt", F("old_s2s.ckpt"))
check(rc == 0 and "attn=esp\nattn.sort=soft\nattn.t=0.200000003\nattn.tau=2" in out and "attn.L=2" in out
      and "cross_attn=sinkhorn\ncross_attn.eps=0.699999988\ncross_attn.iters=3" in out and "sk_iters" not in out,
      "old keys converted: esp_* to attn.*, sk_* to cross_attn.* (the sites of those kinds)", out[:1500])

sys.exit(check.summary())
