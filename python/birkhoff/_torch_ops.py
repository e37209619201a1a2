"""birkhoff's operators as torch.library custom operators (torch >= 2.4).

birkhoff.torch imports this module when torch.library.custom_op exists and
then routes every differentiable function (softmax_attention, ...,
otk_embedding, attention(name, ...) without array parameters) and
MultiheadAttention's weights and padding masks through the operators here
instead of its torch.autograd.Function classes (which stay for torch 1.13).
Each operator is opaque to torch.compile: dynamo and AOTAutograd see one
node with a fake (meta) implementation giving the shapes and dtypes of its
outputs, so torch.compile(fullgraph=True) keeps it whole (no graph break);
its gradient is registered with torch.library.register_autograd and is a
second custom operator calling the C backward.

Operators (namespace "birkhoff", torch.ops.birkhoff.NAME):
  softmax, sinkhorn, unbalanced, esp, lot, diff   (q, k, v, [arrays],
      q_len?, k_len?, layout, <typed parameters>, want_tape) -> (out, tape)
  attention        (name, params, q, k, v, ...): any registered operator
      by name, its scalar parameters as the repr of a dict (literal values)
  otk_embedding    (x, z, W?, lengths?, <typed parameters>, want_tape)
      -> (out, tape)
  NAME_backward    (dout, q, k, v, [arrays], tape, ...) -> (dq, dk, dv,
      [d array]): the gradient, called by the autograd registration
  weights          MultiheadAttention's exported attention matrices (no
      gradient)
  suffix_lengths   a [B, N] bool padding mask -> [B] int32 lengths, or
      ValueError when the padding is not a suffix of every row
The tape is the C forward's tape as a uint8 tensor (0 elements when no
gradient is wanted: want_tape is false when grad mode is off or no operand
requires grad), its size given by the C library from the shapes, so the fake
implementation knows it.

Strides: the operators take q, k, v (and x) with any strides whose last axis
is unit-stride, as the Functions do (a q sliced from a fused QKV projection
goes to C without a copy; other strides are copied first); their outputs
are dense (contiguous) in the operands' layout, which the fake
implementations say too. Parameter arrays (theta, Z, lambda, z, W) are read
as dense copies when they are not contiguous.

Autocast: under torch.autocast("cpu") (bfloat16 or float16) the CPU
operators cast their floating-point operands to float32
(torch.library.register_autocast), compute in float32 and return float32,
as torch's autocast does for the operations of its float32 list; the
casts are differentiable, so gradients reach the bfloat16 activations in
bfloat16 and float32 leaves in float32. Under torch.autocast("cuda") the
operands of softmax / Sinkhorn are cast to the autocast dtype by
birkhoff.torch before the call (the CUDA kernels take 16-bit operands).
"""
import ast

import ctypes as C
import numpy as np
import torch

from . import _core as K
from . import _lib
from .torch import TorchAdapter as TA, _suffix_lengths_check

NS = "birkhoff"
ATTN_ARGS = "Tensor q, Tensor k, Tensor v"
LENS = "Tensor? q_len, Tensor? k_len, str layout"

def _seed(p):
    """ESP's seed is a uint64: the schema's int64 carries it modulo 2^64"""
    return dict(p, seed=None if p["seed"] is None else p["seed"] % 2 ** 64)


# name: (parameter schema, array operands [(name, gradient output of the C
# backward)], builder(params dict, arrays as numpy dict, H) -> Registered,
# host-only message or None)
SPECS = {
    "softmax": ("float? scale, bool? causal", (),
                lambda p, a, H: K.softmax_op(p["scale"], p["causal"]), None),
    "sinkhorn": ("float? scale, float? eps, int? iters, float? tol, str? grad", (),
                 lambda p, a, H: K.sinkhorn_op(**p), None),
    "unbalanced": ("float? scale, float? eps, int? iters, float? tol, float? rho", (),
                   lambda p, a, H: K.unbalanced_op(**p), None),
    "esp": ("str? sort, float? t, float? tau, float? scale, str? cost, str? out_scale, int? slices, int? seed",
            (("theta", "dslices"),),
            lambda p, a, H: K.esp_op(theta=a["theta"], outputs=a["_want"], **_seed(p)), "ESP attention"),
    "lot": ("float? temp, int? iters, float? eps, float? scale, float? tol",
            (("Z", "dpivots"), ("theta", "dpivot_logits")),
            lambda p, a, H: K.lot_op(a["Z"], a["theta"], outputs=a["_want"], **p), "LOT attention"),
    "diff": ("float? scale", (("lam", "dlambda"),),
             lambda p, a, H: K.diff_op(a["lam"], H, outputs=a["_want"], **p), "differential attention"),
}
OTK_SCHEMA = ("float? sigma, float? eta, float? eps, int? iters, str? domain, str? convention, str? pe, "
              "float? sigma_pos, bool? pe_double, int[]? grid, str? isqrt_grad")
OTK_NAMES = K.OTK_KEYS

def _pnames(schema):
    return [s.split()[-1] for s in schema.split(", ")] if schema else []


def _np(t):
    """a parameter tensor (real) as a dense float32 numpy array, or None"""
    return None if t is None else t.detach().contiguous().cpu().numpy()


def _zeros_like_np(t):
    """a stand-in of a (fake) parameter tensor's shape for the size queries"""
    return None if t is None else np.zeros(tuple(int(s) for s in t.shape), np.float32)


def _lens(t):
    return None if t is None else t


def _tape(res, like):
    tape = res["tape"]
    if tape is None:
        return torch.empty(0, dtype=torch.uint8, device=like.device)
    return torch.from_numpy(tape) if isinstance(tape, np.ndarray) else tape


def _tape_in(tape):
    """the tape as the C path takes it (numpy on the host; None when empty)"""
    if tape.numel() == 0:
        return None
    return tape if tape.is_cuda else tape.detach().numpy()


def _out_dtype(q):
    return torch.float32 if q.device.type == "cpu" else q.dtype


def _grad_or_empty(g, like):
    return torch.from_numpy(np.ascontiguousarray(g)).reshape(like.shape) if g is not None \
        else torch.empty(0, dtype=torch.float32)


class _FakeProblem:
    """what Registered.bind / shape need of a problem: its desc"""

    def __init__(self, q, k, v, layout):
        def sizes(a):
            s = [int(x) for x in a.shape]
            return (s[0], s[2], s[1], s[3]) if layout == "bnhd" else tuple(s)
        if layout not in K.LAYOUTS:
            raise ValueError("layout must be 'bhnd' or 'bnhd' (got %r)" % (layout,))
        for a, nm in ((q, "q"), (k, "k"), (v, "v")):
            TA.prepare(a, nm)
            if a.dim() != 4:
                raise ValueError("%s: 4-D [%s] expected, got shape %s" % (nm, ", ".join(layout.upper()),
                                                                         tuple(a.shape)))
        (B, H, Nq, d), (_, _, Nk, _), (_, _, _, dv) = sizes(q), sizes(k), sizes(v)
        self.B, self.H = B, H
        self.desc = _lib.AttnDesc(B, H, Nq, Nk, d, dv, None, None)


def _tape_size(op, fp, like, want):
    if not (want and op.has_backward()):
        return 0
    op.bind(fp)
    if like.device.type == "cuda":
        with TA.running(like):
            n = _lib.lib.bk_op_tape_size(op.op, C.byref(fp.desc), op.par)
    else:
        n = _lib.lib.bk_op_tape_size(op.op, C.byref(fp.desc), op.par)
    return max(int(n), 1)


def _dense_like(a, shape):
    return torch.empty(shape, dtype=_out_dtype(a), device=a.device)


def _first_order(bop):
    """the backward operator's own gradient: an error, as the Functions'
    once_differentiable backward gives (birkhoff's gradients are first-order
    only)"""
    name = bop._qualname if hasattr(bop, "_qualname") else str(bop)

    def twice(ctx, *grads):
        raise RuntimeError("trying to differentiate twice a function that was marked with @once_differentiable "
                           "(%s: birkhoff's gradients are first-order only)" % name)

    bop.register_autograd(twice, setup_context=lambda ctx, inputs, output: None)


def _pair(name, forward, fschema, forward_fake, backward, bschema, backward_fake):
    """the custom operators NAME and NAME_backward with their fake
    implementations (the backward's own gradient an error)"""
    fop = torch.library.custom_op("%s::%s" % (NS, name), forward, mutates_args=(), schema=fschema)
    fop.register_fake(forward_fake)
    bop = torch.library.custom_op("%s::%s_backward" % (NS, name), backward, mutates_args=(), schema=bschema)
    bop.register_fake(backward_fake)
    _first_order(bop)
    return fop, bop


def _finish(fop, grad, setup_context):
    """fop's gradient, and its float32 cast under CPU autocast"""
    fop.register_autograd(grad, setup_context=setup_context)
    torch.library.register_autocast(fop._qualname, "cpu", torch.float32)
    return fop


def _register_attention(name, pschema, arrays, build, host):
    pn = _pnames(pschema)
    an = [a for a, _ in arrays]
    arr_schema = "".join(", Tensor? %s" % a for a in an)
    fschema = "(%s%s, %s, %s, bool want_tape) -> (Tensor, Tensor)" % (ATTN_ARGS, arr_schema, LENS, pschema)
    bschema = "(Tensor dout, %s%s, Tensor tape, %s, %s, bool[] want) -> (Tensor, Tensor, Tensor%s)" % (
        ATTN_ARGS, arr_schema, LENS, pschema, ", Tensor" * len(an))
    na = len(an)

    def split(args):
        q, k, v = args[:3]
        arr = dict(zip(an, args[3:3 + na]))
        q_len, k_len, layout = args[3 + na:6 + na]
        params = dict(zip(pn, args[6 + na:6 + na + len(pn)]))
        if "grid" in params and params["grid"] is not None:
            params["grid"] = tuple(params["grid"])
        return q, k, v, arr, q_len, k_len, layout, params

    def make(arr, params, H, want=(), fake=False):
        a = {k: (_zeros_like_np(t) if fake else _np(t)) for k, t in arr.items()}
        a["_want"] = tuple(want)
        return build(params, a, H)

    def forward(*args):
        q, k, v, arr, q_len, k_len, layout, params = split(args[:-1])
        pr = K.Problem(TA, q, k, v, _lens(q_len), _lens(k_len), layout)
        if host:
            pr.host_only(host)
        res = make(arr, params, pr.desc.H).forward(pr, want_tape=args[-1])
        return res["out"], _tape(res, q)

    def forward_fake(*args):
        q, k, v, arr, q_len, k_len, layout, params = split(args[:-1])
        fp = _FakeProblem(q, k, v, layout)
        if host and q.device.type != "cpu":
            raise ValueError("%s runs on the CPU only (on CUDA: softmax and sinkhorn); q is on %s: pass CPU "
                             "float32 tensors" % (host, q.device))
        op = make(arr, params, fp.H, fake=True)
        shape = list(q.shape)
        shape[-1] = v.shape[-1]
        n = _tape_size(op, fp, q, args[-1])
        return _dense_like(q, shape), torch.empty(n, dtype=torch.uint8, device=q.device)

    def backward(*args):
        dout, rest = args[0], args[1:-1]
        want = args[-1]
        q, k, v = rest[:3]
        arr = dict(zip(an, rest[3:3 + na]))
        tape = rest[3 + na]
        q_len, k_len, layout = rest[4 + na:7 + na]
        params = dict(zip(pn, rest[7 + na:]))
        pr = K.Problem(TA, q, k, v, _lens(q_len), _lens(k_len), layout)
        if host:
            pr.host_only(host)
        outs = [g for (a, g), w in zip(arrays, want) if w and arr[a] is not None]
        op = make(arr, params, pr.desc.H, outs)
        dq, dk, dv, g = op.backward(pr, dout, _tape_in(tape), outputs=True)
        return (dq, dk, dv) + tuple(_grad_or_empty(g.get(gn) if w else None, arr[a])
                                    for (a, gn), w in zip(arrays, want))

    def backward_fake(*args):
        want = args[-1]
        q, k, v = args[1:4]
        arr = [args[4 + i] for i in range(na)]
        return (_dense_like(q, q.shape), _dense_like(k, k.shape), _dense_like(v, v.shape)) + tuple(
            torch.empty(a.shape if (w and a is not None) else (0,), dtype=torch.float32, device=a.device
                        if a is not None else q.device) for a, w in zip(arr, want))

    fop, bop = _pair(name, forward, fschema, forward_fake, backward, bschema, backward_fake)

    def setup_context(ctx, inputs, output):
        q, k, v = inputs[:3]
        arrs = inputs[3:3 + na]
        ctx.save_for_backward(q, k, v, *[a if a is not None else None for a in arrs], output[1])
        ctx.rest = inputs[3 + na:-1]
        ctx.has = [a is not None for a in arrs]

    def grad(ctx, dout, _dtape):
        saved = ctx.saved_tensors
        q, k, v = saved[:3]
        arrs, tape = saved[3:3 + na], saved[3 + na]
        want = [bool(h and n) for h, n in zip(ctx.has, ctx.needs_input_grad[3:3 + na])]
        res = bop(dout, q, k, v, *arrs, tape, *ctx.rest, want)
        dq, dk, dv = res[:3]
        ga = tuple(g if w else None for g, w in zip(res[3:], want))
        return (dq, dk, dv) + ga + (None,) * (len(ctx.rest) + 1)

    return _finish(fop, grad, setup_context)


def _register_generic():
    """attention(name, params, q, k, v, ...): any registered operator, its
    scalar parameters as repr(dict) (literals only)"""
    fschema = "(str name, str params, %s, %s, bool want_tape) -> (Tensor, Tensor)" % (ATTN_ARGS, LENS)
    bschema = "(Tensor dout, str name, str params, %s, Tensor tape, %s) -> (Tensor, Tensor, Tensor)" % (
        ATTN_ARGS, LENS)

    def op_of(name, params):
        return K.Registered(name, ast.literal_eval(params))

    def forward(name, params, q, k, v, q_len, k_len, layout, want_tape):
        pr = K.Problem(TA, q, k, v, _lens(q_len), _lens(k_len), layout)
        res = op_of(name, params).forward(pr, want_tape=want_tape)
        return res["out"], _tape(res, q)

    def forward_fake(name, params, q, k, v, q_len, k_len, layout, want_tape):
        fp = _FakeProblem(q, k, v, layout)
        shape = list(q.shape)
        shape[-1] = v.shape[-1]
        n = _tape_size(op_of(name, params), fp, q, want_tape)
        return _dense_like(q, shape), torch.empty(n, dtype=torch.uint8, device=q.device)

    def backward(dout, name, params, q, k, v, tape, q_len, k_len, layout):
        pr = K.Problem(TA, q, k, v, _lens(q_len), _lens(k_len), layout)
        return op_of(name, params).backward(pr, dout, _tape_in(tape))

    def backward_fake(dout, name, params, q, k, v, tape, q_len, k_len, layout):
        return _dense_like(q, q.shape), _dense_like(k, k.shape), _dense_like(v, v.shape)

    fop, bop = _pair("attention", forward, fschema, forward_fake, backward, bschema, backward_fake)

    def setup_context(ctx, inputs, output):
        name, params, q, k, v, q_len, k_len, layout, _ = inputs
        ctx.save_for_backward(q, k, v, output[1])
        ctx.rest = (name, params, q_len, k_len, layout)

    def grad(ctx, dout, _dtape):
        q, k, v, tape = ctx.saved_tensors
        name, params, q_len, k_len, layout = ctx.rest
        dq, dk, dv = bop(dout, name, params, q, k, v, tape, q_len, k_len, layout)
        return None, None, dq, dk, dv, None, None, None, None

    return _finish(fop, grad, setup_context)


def _register_otk():
    pn = list(OTK_NAMES)
    fschema = "(Tensor x, Tensor z, Tensor? W, Tensor? lengths, %s, bool want_tape) -> (Tensor, Tensor)" % OTK_SCHEMA
    bschema = ("(Tensor dout, Tensor x, Tensor z, Tensor? W, Tensor tape, Tensor? lengths, %s, bool[] want) "
               "-> (Tensor, Tensor, Tensor)" % OTK_SCHEMA)

    def kw(vals):
        d = dict(zip(pn, vals))
        if d.get("grid") is not None:
            d["grid"] = tuple(d["grid"])
        return d

    def forward(x, z, W, lengths, *rest):
        zn, Wn = _np(z), _np(W)
        op, prm = K.otk_setup(TA, x, zn, Wn, lengths, kw(rest[:-1]))
        res = K.otk_forward(op, prm, zn, want_tape=rest[-1])
        return res["out"], _tape(res, x)

    def forward_fake(x, z, W, lengths, *rest):
        TA.prepare(x, "x")
        if x.dim() != 3:
            raise ValueError("x: [B, n, d] expected, got shape %s" % (tuple(x.shape),))
        if z.dim() != 3:
            raise ValueError("z: references [q, p, k] expected, got shape %s" % (tuple(z.shape),))
        B, n, d = (int(s) for s in x.shape)
        q, p, k = (int(s) for s in z.shape)
        if W is not None and (W.dim() != 2 or tuple(W.shape) != (k, d)):
            raise ValueError("W: anchors [k=%d, d=%d] expected, got shape %s" % (k, d, tuple(W.shape)))
        ntape = 0
        if rest[-1]:
            prm = K.otk_params(_zeros_like_np(W), *(kw(rest[:-1]).get(key) for key in pn))
            desc = _lib.OtkDesc(B, n, d, q, p, k, None)
            ntape = max(int(_lib.lib.bk_otk_tape_size(C.byref(desc), C.byref(prm))), 1)
        return (torch.empty((B, p, q * k), dtype=torch.float32, device=x.device),
                torch.empty(ntape, dtype=torch.uint8, device=x.device))

    def backward(dout, x, z, W, tape, lengths, *rest):
        want = rest[-1]
        zn, Wn = _np(z), _np(W)
        op, prm = K.otk_setup(TA, x, zn, Wn, lengths, kw(rest[:-1]))
        dx, dz, dW = K.otk_backward(op, prm, zn, dout, _tape_in(tape), want[0], want[1], W is not None and want[2])
        return (dx if dx is not None else torch.empty(0), _grad_or_empty(dz, z),
                _grad_or_empty(dW, W) if dW is not None else torch.empty(0))

    def backward_fake(dout, x, z, W, tape, lengths, *rest):
        want = rest[-1]
        return (torch.empty(x.shape if want[0] else (0,), dtype=torch.float32),
                torch.empty(z.shape if want[1] else (0,), dtype=torch.float32),
                torch.empty(W.shape if (W is not None and want[2]) else (0,), dtype=torch.float32))

    fop, bop = _pair("otk_embedding", forward, fschema, forward_fake, backward, bschema, backward_fake)

    def setup_context(ctx, inputs, output):
        x, z, W, lengths = inputs[:4]
        ctx.save_for_backward(x, z, W, output[1])
        ctx.rest = inputs[3:-1]

    def grad(ctx, dout, _dtape):
        x, z, W, tape = ctx.saved_tensors
        n = ctx.needs_input_grad
        want = [bool(n[0]), bool(n[1]), bool(W is not None and n[2])]
        dx, dz, dW = bop(dout, x, z, W, tape, *ctx.rest, want)
        return (dx if want[0] else None, dz if want[1] else None, dW if want[2] else None) + \
            (None,) * (len(ctx.rest) + 1)

    return _finish(fop, grad, setup_context)


def _register_weights():
    """weights(kind, params, q, k, v, Z?, theta?, q_len?, k_len?) -> A [B, H,
    Nq, Nk]: MultiheadAttention's exported attention matrices (layout bnhd,
    no gradient)"""
    schema = "(str kind, str params, %s, Tensor? Z, Tensor? theta, Tensor? q_len, Tensor? k_len) -> Tensor" % ATTN_ARGS

    def op_of(kind, params, Z, theta, fake=False):
        o = ast.literal_eval(params)
        if kind == "lot":
            conv = _zeros_like_np if fake else _np
            return K.lot_op(conv(Z), conv(theta), **o)
        return {"softmax": K.softmax_op, "sinkhorn": K.sinkhorn_op, "unbalanced": K.unbalanced_op,
                "esp": K.esp_op}[kind](**o)

    def impl(kind, params, q, k, v, Z, theta, q_len, k_len):
        pr = K.Problem(TA, q, k, v, _lens(q_len), _lens(k_len), "bnhd")
        return op_of(kind, params, Z, theta).forward(pr, False, True)["attn"]

    def fake(kind, params, q, k, v, Z, theta, q_len, k_len):
        fp = _FakeProblem(q, k, v, "bnhd")
        op_of(kind, params, Z, theta, fake=True)
        return torch.empty((fp.B, fp.H, int(fp.desc.Nq), int(fp.desc.Nk)), dtype=_out_dtype(q), device=q.device)

    op = torch.library.custom_op(NS + "::weights", impl, mutates_args=(), schema=schema)
    op.register_fake(fake)
    torch.library.register_autocast(NS + "::weights", "cpu", torch.float32)
    return op


def _register_suffix():
    def impl(mask, name):
        return torch.from_numpy(_suffix_lengths_check(mask, name))

    def fake(mask, name):
        return torch.empty(mask.shape[0], dtype=torch.int32)

    op = torch.library.custom_op(NS + "::suffix_lengths", impl, mutates_args=(),
                                 schema="(Tensor mask, str name) -> Tensor")
    op.register_fake(fake)
    return op


OPS = {name: _register_attention(name, *spec) for name, spec in SPECS.items()}
OPS["attention"] = _register_generic()
OPS["otk_embedding"] = _register_otk()
OPS["weights"] = _register_weights()
OPS["suffix_lengths"] = _register_suffix()
PARAMS = {name: _pnames(spec[0]) for name, spec in SPECS.items()}
