#!/usr/bin/python3
"""birkhoff.torch under torch.compile, torch.library and torch.autocast (issue 44, item 2).

    $(TORCH2_PY) tests/python/test_compile.py      # torch >= 2.4: everything below
    /usr/bin/python3 tests/python/test_compile.py  # torch 1.13: SKIP (said), Function-path checks

The package is <repo>/python; its library is found as birkhoff finds it
($BIRKHOFF_LIB, else <repo>/build/libbirkhoff.so, ...). Prints "FAIL name: detail" per failing check, then
"N passed, M failed"; exit status 1 if any failed.

On torch >= 2.4 (birkhoff._torch_ops registers the custom operators):
  1. every operator is registered (torch.ops.birkhoff.*);
  2. the custom-operator path equals the autograd.Function path bitwise
     (outputs and every gradient: q, k, v, ESP's slices, LOT's pivots and
     logits, diff's lambda, OTK's x, z, W; padded lengths, the bnhd layout
     as views of a fused QKV projection, MultiheadAttention's weights and
     key padding masks);
  3. torch.library.opcheck (schema, autograd registration, fake tensors,
     AOT dispatch with dynamic shapes) of every forward and backward
     operator;
  4. the floor: a ViT with Sinkhorn attention (birkhoff.models, backend
     "c") under torch.compile(fullgraph=True) (Inductor): 0 graph breaks
     (torch._dynamo.explain), the birkhoff operator in the graph, outputs
     within 1e-6 relative of eager, every parameter gradient within 1e-5
     (relative to the largest |entry| of eager's);
  5. models with ESP, LOT, diff attention and the OTK pool (birkhoff.models,
     backend "c"), and a module of birkhoff.torch.MultiheadAttention (ESP,
     need_weights=True, a key padding mask), LOTAttention and OTKPooling
     with anchors: 0 graph breaks, fullgraph=True with the "aot_eager"
     backend (dynamo + AOTAutograd through the fake and autograd
     registrations; Inductor's code generation is the ViT's part, slow on
     2 cores), the same tolerances;
  6. torch.autocast("cpu", torch.bfloat16): the operators return float32
     equal to the float32 call on the cast operands, bfloat16 leaves get
     bfloat16 gradients, the ViT runs (eager and compiled) within 3e-2 of
     float32; the Function path (USE_CUSTOM_OPS = False) casts the same way;
  7. double backward raises RuntimeError; CPU bfloat16 without autocast is
     still a TypeError.
On torch < 2.4: a loud SKIP line with the reason, and checks that the
Function path is the one in use and works under CPU autocast.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests"))
from checklib import Checks  # noqa: E402
sys.dont_write_bytecode = True

import numpy as np  # noqa: E402
import torch  # noqa: E402

import birkhoff  # noqa: E402
import birkhoff.torch as bt  # noqa: E402

check = Checks()
HAVE_OPS = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autocast")


def rel(a, b):
    """max |a - b| / max |b| (0 when both are zero)"""
    a, b = a.detach().double(), b.detach().double()
    den = b.abs().max().item()
    return (a - b).abs().max().item() / den if den else (a - b).abs().max().item()


def leaves(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


def run_case(fn, inputs):
    """(output, gradients of <w, output> for every input that requires grad)"""
    xs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    out = fn(*xs)
    w = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    (out * w).sum().backward()
    return out.detach(), [x.grad for x in xs if x.requires_grad]


def fused(B=2, N=6, H=2, d=4, seed=0):
    """q, k, v as bnhd views of a fused [B, N, 3, H, d] leaf"""
    w, = leaves((B, N, 3, H, d), seed=seed)
    return w


CASES = [
    ("softmax causal, lengths list", lambda q, k, v: bt.softmax_attention(q, k, v, causal=True, q_len=[6, 4],
                                                                          k_len=[6, 4]), 0),
    ("sinkhorn padded numpy lengths", lambda q, k, v: bt.sinkhorn_attention(
        q, k, v, eps=0.5, iters=5, q_len=np.array([6, 3], np.int32), k_len=np.array([5, 3], np.int32)), 0),
    ("sinkhorn bnhd views of a fused qkv", "fused", 0),
    ("unbalanced", lambda q, k, v: bt.unbalanced_attention(q, k, v, eps=0.7, iters=4, rho=3.0), 0),
    ("esp hard, seeded slices (seed 2^64 - 1)",
     lambda q, k, v: bt.esp_attention(q, k, v, slices=3, seed=2 ** 64 - 1, t=0.2), 0),
    ("esp soft, theta gradient", lambda q, k, v, th: bt.esp_attention(q, k, v, theta=th, sort="soft", t=0.1,
                                                                     tau=2.0), (3, 4)),
    ("lot, Z and theta gradients", lambda q, k, v, Z, th: bt.lot_attention(q, k, v, Z, th, iters=5, temp=0.7,
                                                                          k_len=[6, 2]), ((2, 3, 4), (2, 3))),
    ("diff, lambda gradient", lambda q, k, v, lam: bt.diff_attention(q, k, v, lam), (2,)),
    ("attention('sinkhorn', iters=3)", lambda q, k, v: bt.attention("sinkhorn", q, k, v, iters=3, eps=0.3), 0),
]


def test_registered():
    for name in ("softmax", "sinkhorn", "unbalanced", "esp", "lot", "diff", "attention", "otk_embedding"):
        for n in (name, name + "_backward"):
            check(hasattr(torch.ops.birkhoff, n), "torch.ops.birkhoff.%s registered" % n)
    for n in ("weights", "suffix_lengths"):
        check(hasattr(torch.ops.birkhoff, n), "torch.ops.birkhoff.%s registered" % n)
    check(bt._ops is not None and bt.USE_CUSTOM_OPS, "birkhoff.torch uses the custom operators on torch %s"
          % torch.__version__)


def both_paths(fn, inputs):
    res = []
    for use in (True, False):
        bt.USE_CUSTOM_OPS = use
        try:
            res.append(run_case(fn, inputs))
        finally:
            bt.USE_CUSTOM_OPS = True
    return res


def same(name, a, b):
    (oa, ga), (ob, gb) = a, b
    check(torch.equal(oa, ob), "%s: custom op == Function output" % name, rel(oa, ob))
    check(len(ga) == len(gb) and all(torch.equal(x, y) for x, y in zip(ga, gb)),
          "%s: custom op == Function gradients" % name, [rel(x, y) for x, y in zip(ga, gb)])


def test_same_as_function():
    for name, fn, extra in CASES:
        if fn == "fused":
            w = fused()

            def fn2(w):
                return bt.sinkhorn_attention(w[:, :, 0], w[:, :, 1], w[:, :, 2], layout="bnhd", iters=4)
            same(name, *both_paths(fn2, [w]))
            continue
        shapes = [(2, 2, 6, 4)] * 3 + ([] if extra == 0 else [extra] if isinstance(extra[0], int) else list(extra))
        same(name, *both_paths(fn, leaves(*shapes)))
    x, z, W = leaves((3, 7, 5), (2, 3, 4), (4, 5))

    def otk(x, z, W):
        return bt.otk_embedding(x, z, W, lengths=[7, 5, 2], eps=0.5, iters=6)
    same("otk_embedding with anchors and lengths", *both_paths(otk, [x, z, W]))
    # MultiheadAttention: weights and a key padding mask through their operators
    for norm in ("sinkhorn", "esp", "lot"):
        torch.manual_seed(3)
        m = bt.MultiheadAttention(8, 2, normaliser=norm, batch_first=True)
        x, = leaves((2, 5, 8), seed=4)
        mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
        outs = []
        for use in (True, False):
            bt.USE_CUSTOM_OPS = use
            try:
                o, a = m(x, key_padding_mask=mask)
                outs.append((o.detach(), a))
            finally:
                bt.USE_CUSTOM_OPS = True
        check(torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]),
              "MultiheadAttention(%s) output and weights: custom op == Function" % norm)
    bad = torch.tensor([[False, True, False, False, False], [False] * 5])
    try:
        m(x, key_padding_mask=bad)
        check(False, "a non-suffix mask through birkhoff::suffix_lengths raises ValueError")
    except ValueError as e:
        check("suffix" in str(e), "a non-suffix mask through birkhoff::suffix_lengths raises ValueError", e)


def test_opcheck():
    O = torch.ops.birkhoff
    q, k, v = leaves(*[(2, 2, 5, 4)] * 3, seed=5)
    lens = torch.tensor([5, 3], dtype=torch.int32)
    th, Z, lt, lam = leaves((3, 4), (2, 3, 4), (2, 3), (2,), seed=6)
    x, z, W = leaves((2, 5, 4), (2, 3, 4), (4, 4), seed=7)
    otk_p = [None] * 11
    fwd = {
        "softmax": (q, k, v, lens, lens, "bhnd", None, True),
        "sinkhorn": (q, k, v, lens, lens, "bhnd", None, 0.5, 5, None, None),
        "unbalanced": (q, k, v, None, None, "bhnd", None, 0.5, 5, None, 3.0),
        "esp": (q, k, v, th, None, None, "bhnd", "soft", 0.1, 2.0, None, None, None, None, None),
        "lot": (q, k, v, Z, lt, None, lens, "bhnd", None, 5, None, None, None),
        "diff": (q, k, v, lam, None, None, "bhnd", None),
        "attention": ("sinkhorn", "{'iters': 3}", q, k, v, None, None, "bhnd"),
        "otk_embedding": tuple([x, z, W, None] + otk_p),
    }
    for name, args in fwd.items():
        op = getattr(O, name).default
        full = args + (True,)
        try:
            r = torch.library.opcheck(op, full)
            check(all(s == "SUCCESS" for s in r.values()), "opcheck birkhoff::%s" % name, r)
        except Exception as e:  # noqa: BLE001
            check(False, "opcheck birkhoff::%s" % name, "%s: %s" % (type(e).__name__, e))
        # the backward operator, on the forward's tape
        with torch.no_grad():
            out, tape = op(*args, True)
        dout = torch.randn_like(out)
        if name == "attention":
            bargs = (dout,) + args[:5] + (tape,) + args[5:]
        elif name == "otk_embedding":
            bargs = (dout, x, z, W, tape, None) + tuple(otk_p) + ([True, True, True],)
        else:
            na = {"esp": 1, "lot": 2, "diff": 1}.get(name, 0)
            bargs = (dout,) + args[:3 + na] + (tape,) + args[3 + na:] + ([True] * na,)
        bargs = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in bargs)
        try:
            r = torch.library.opcheck(getattr(O, name + "_backward").default, bargs,
                                      test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
            check(all(s == "SUCCESS" for s in r.values()), "opcheck birkhoff::%s_backward" % name, r)
        except Exception as e:  # noqa: BLE001
            check(False, "opcheck birkhoff::%s_backward" % name, "%s: %s" % (type(e).__name__, e))
    qb, kb, vb = (t.detach().transpose(1, 2) for t in (q, k, v))
    for name, args in (("weights", ("sinkhorn", "{'iters': 3}", qb, kb, vb, None, None, None, lens)),
                       ("weights lot", ("lot", "{}", qb, kb, vb, Z.detach(), lt.detach(), None, None)),
                       ("suffix_lengths", (torch.tensor([[False, False, True], [False] * 3]), "mask"))):
        try:
            r = torch.library.opcheck(getattr(O, name.split()[0]).default, args,
                                      test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
            check(all(s == "SUCCESS" for s in r.values()), "opcheck birkhoff::%s" % name, r)
        except Exception as e:  # noqa: BLE001
            check(False, "opcheck birkhoff::%s" % name, "%s: %s" % (type(e).__name__, e))


def compare_compiled(name, model, inputs, backend, ops=(), atol_out=1e-6, atol_grad=1e-5):
    """explain (0 graph breaks, the birkhoff operators in the graph), then
    compiled (fullgraph) against eager: outputs and parameter gradients"""
    import torch._dynamo as dynamo
    dynamo.reset()
    ex = dynamo.explain(model)(*inputs)
    check(ex.graph_break_count == 0 and ex.graph_count == 1, "%s: 0 graph breaks, one graph" % name,
          "%d breaks, %d graphs: %s" % (ex.graph_break_count, ex.graph_count, ex.break_reasons[:3]))
    text = " ".join(str(o) for g in ex.ops_per_graph for o in g)
    for o in ops:
        check("birkhoff." + o in text, "%s: birkhoff::%s is one node of the graph" % (name, o), text[:400])

    def step(f):
        model.zero_grad(set_to_none=True)
        y = f(*inputs)
        w = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
        (y * w).sum().backward()
        return y.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    ye, ge = step(model)
    dynamo.reset()
    cm = torch.compile(model, fullgraph=True, backend=backend)
    yc, gc = step(cm)
    yc2, _ = step(cm)    # a second call runs the cached graph
    e = rel(yc, ye)
    check(e <= atol_out, "%s: compiled (%s) output within %g of eager" % (name, backend, atol_out), e)
    check(torch.equal(yc, yc2), "%s: the compiled graph reruns bitwise" % name)
    check(set(gc) == set(ge), "%s: the same parameters get gradients" % name, sorted(set(gc) ^ set(ge)))
    worst = max((rel(gc[n], ge[n]), n) for n in ge if n in gc)
    check(worst[0] <= atol_grad, "%s: compiled gradients within %g of eager" % (name, atol_grad), worst)
    print("   %s (%s): output %.2e, worst gradient %.2e (%s), %d params" % (name, backend, e, worst[0], worst[1],
                                                                          len(ge)))
    return ye


VIT = ("input=image,image_h=8,image_w=8,patch=2,dim=16,depth=2,heads=4,mlp_dim=32,classes=4,attn=sinkhorn,"
       "sk_iters=5,sk_eps=0.5,pool=mean")


def test_vit_inductor():
    import birkhoff.models as bm
    m = bm.build(VIT, seed=1, backend="c")
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    compare_compiled("ViT Sinkhorn (floor)", m, (x,), "inductor", ops=("sinkhorn",))


MODELS = [
    ("ViT ESP soft", "input=image,image_h=8,image_w=8,patch=2,dim=16,depth=1,heads=2,mlp_dim=16,classes=3,"
     "attn=esp,esp_soft=1,esp_t=0.1,esp_tau=2,esp_slices=3", ("esp",), None),
    ("ViT LOT", "input=image,image_h=8,image_w=8,patch=2,dim=16,depth=2,heads=2,mlp_dim=32,classes=4,attn=lot,"
     "lot_r=3,lot_iters=5", ("lot",), None),
    ("ViT diff", "input=image,image_h=8,image_w=8,patch=2,dim=16,depth=2,heads=2,mlp_dim=16,classes=3,"
     "attn=diff,pool=mean", ("diff",), None),
    ("ViT Sinkhorn + OTK pool", "input=image,image_h=8,image_w=8,patch=4,dim=16,depth=1,heads=2,mlp_dim=16,"
     "classes=3,attn=sinkhorn,sk_iters=3,pool=otk,otk_supports=4", ("sinkhorn", "otk_embedding"), None),
    ("points LOT + OTK pool", "input=points,point_dim=3,max_points=8,dim=16,depth=1,heads=2,head_dim=6,"
     "mlp_dim=16,classes=3,attn=lot,lot_r=3,lot_iters=5,pool=otk,otk_refs=2,otk_supports=3,otk_iters=10",
     ("lot", "otk_embedding"), None),
]


class MHAModel(torch.nn.Module):
    """MultiheadAttention(esp) with need_weights and a key padding mask,
    LOTAttention, OTKPooling with anchors"""

    def __init__(self):
        super().__init__()
        self.a = bt.MultiheadAttention(16, 2, normaliser="esp", batch_first=True, sort="soft", t=0.1, slices=3,
                                       seed=5)
        self.b = bt.LOTAttention(16, 2, r=3, batch_first=True, iters=5)
        self.c = bt.MultiheadAttention(16, 4, normaliser="unbalanced", iters=4)
        self.pool = bt.OTKPooling(16, refs=2, supports=3, anchors=6, eps=0.5)

    def forward(self, x, mask):
        h, w = self.a(x, key_padding_mask=mask)
        h = x + h + w.sum(dim=-1, keepdim=True)
        h = h + self.b(h, need_weights=False)[0]
        h = h + self.c(h.transpose(0, 1), need_weights=False)[0].transpose(0, 1)
        return self.pool(h, lengths=(~mask).sum(dim=1))


def test_models_aot():
    import birkhoff.models as bm
    for name, cfg, ops, lens in MODELS:
        m = bm.build(cfg, seed=3, backend="c")
        B = 3
        g = torch.Generator().manual_seed(4)
        if "input=points" in cfg:
            inp = dict(x=torch.randn(B, 8, 3, generator=g), lengths=lens)
        else:
            inp = dict(x=torch.randn(B, 1, 8, 8, generator=g))
        compare_compiled(name, _Wrap(m, inp), (), "aot_eager", ops=ops)
    torch.manual_seed(6)
    mm = MHAModel()
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(7))
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    compare_compiled("MultiheadAttention(esp) + LOTAttention + MHA(unbalanced) + OTKPooling", mm, (x, mask),
                     "aot_eager", ops=("esp", "weights", "suffix_lengths", "lot", "unbalanced", "otk_embedding"))


class _Wrap(torch.nn.Module):
    """a model called with fixed keyword inputs"""

    def __init__(self, m, inp):
        super().__init__()
        self.m, self.inp = m, inp

    def forward(self):
        return self.m(**self.inp)


def test_autocast():
    q, k, v = leaves(*[(2, 2, 6, 4)] * 3, seed=8)
    qb, kb, vb = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
    for use in (True, False):
        bt.USE_CUSTOM_OPS = use
        path = "custom op" if use else "Function"
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                o = bt.sinkhorn_attention(qb, kb, vb, iters=4)
            ref = bt.sinkhorn_attention(qb.detach().float(), kb.detach().float(), vb.detach().float(), iters=4)
            check(o.dtype == torch.float32 and torch.equal(o.detach(), ref),
                  "autocast bf16 (%s): sinkhorn returns float32 equal to the float32 call" % path, (o.dtype,))
            o.sum().backward()
            check(qb.grad is not None and qb.grad.dtype == torch.bfloat16,
                  "autocast bf16 (%s): bfloat16 leaves get bfloat16 gradients" % path,
                  None if qb.grad is None else qb.grad.dtype)
            qb.grad = kb.grad = vb.grad = None
        finally:
            bt.USE_CUSTOM_OPS = True
    import birkhoff.models as bm
    m = bm.build(VIT, seed=1, backend="c")
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        y32 = m(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yb = m(x)
            torch._dynamo.reset()
            yc = torch.compile(m, fullgraph=True, backend="aot_eager")(x)
    check(yb.dtype == torch.bfloat16 and rel(yb.float(), y32) < 3e-2,
          "autocast bf16 ViT (eager) close to float32", (yb.dtype, rel(yb.float(), y32)))
    check(rel(yc.float(), y32) < 3e-2 and rel(yc.float(), yb.float()) < 1e-2,
          "autocast bf16 ViT (compiled, aot_eager) close to float32 and to eager bf16",
          (rel(yc.float(), y32), rel(yc.float(), yb.float())))
    print("   autocast bf16 ViT: eager vs float32 %.2e, compiled vs float32 %.2e" % (rel(yb.float(), y32),
                                                                                   rel(yc.float(), y32)))


def test_errors():
    q, k, v = leaves(*[(2, 2, 6, 4)] * 3, seed=9)
    g, = torch.autograd.grad(bt.sinkhorn_attention(q, k, v).pow(2).sum(), q, create_graph=True)
    try:
        g.pow(2).sum().backward()
        check(False, "double backward through birkhoff::sinkhorn raises RuntimeError")
    except RuntimeError as e:
        check("differentiate twice" in str(e), "double backward through birkhoff::sinkhorn raises RuntimeError", e)
    try:
        bt.softmax_attention(q.detach().bfloat16(), k.detach().bfloat16(), v.detach().bfloat16())
        check(False, "CPU bfloat16 without autocast: TypeError")
    except TypeError as e:
        check("float32" in str(e), "CPU bfloat16 without autocast: TypeError", e)
    for bad, exc in ((dict(iters=2.5), (TypeError, ValueError)), (dict(grad="sideways"), ValueError)):
        try:
            bt.sinkhorn_attention(q, k, v, **bad)
            check(False, "sinkhorn %s refused" % bad)
        except exc:
            check(True, "sinkhorn %s refused" % bad)


def test_function_path_113():
    """torch < 2.4: the Function path, under CPU autocast too"""
    check(bt._ops is None, "torch %s: birkhoff.torch uses its autograd.Function path" % torch.__version__)
    q, k, v = leaves(*[(2, 2, 6, 4)] * 3, seed=8)
    qb, kb, vb = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = bt.sinkhorn_attention(qb, kb, vb, iters=4)
    ref = bt.sinkhorn_attention(qb.detach().float(), kb.detach().float(), vb.detach().float(), iters=4)
    check(o.dtype == torch.float32 and torch.equal(o.detach(), ref),
          "autocast bf16 (Function path): float32 output equal to the float32 call")
    o.sum().backward()
    check(qb.grad is not None and qb.grad.dtype == torch.bfloat16, "autocast bf16: bfloat16 gradients")


def main():
    print("torch %s, birkhoff library %s" % (torch.__version__, birkhoff.LIBRARY_PATH))
    if not HAVE_OPS:
        print("SKIP torch.compile / torch.library tests: torch %s has no torch.library.custom_op and "
              "register_autocast (torch >= 2.4 needed); birkhoff.torch runs its autograd.Function path here, "
              "checked below" % torch.__version__)
        tests = (test_function_path_113,)
    else:
        tests = (test_registered, test_same_as_function, test_opcheck, test_errors, test_autocast,
                 test_models_aot, test_vit_inductor)
    only = sys.argv[1:]   # test names to run (all by default)
    for t in tests:
        if only and t.__name__ not in only:
            continue
        print("-- %s" % t.__name__, flush=True)
        try:
            t()
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            check(False, t.__name__, "raised %s: %s" % (type(e).__name__, e))
    return check.summary(" (torch %s%s)" % (torch.__version__, "" if HAVE_OPS else ", compile tests SKIPPED"))


if __name__ == "__main__":
    sys.exit(main())
