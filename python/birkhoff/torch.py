"""PyTorch API: autograd Functions and drop-in modules over libbirkhoff.

Functions (differentiable; CPU float32 tensors, and CUDA tensors of
float32, bfloat16 or float16 for softmax and Sinkhorn):
  softmax_attention(q, k, v, ...)      sinkhorn_attention(q, k, v, ...)
  unbalanced_attention(q, k, v, ...)
  esp_attention(q, k, v, ...)          lot_attention(q, k, v, Z, theta, ...)
  otk_embedding(x, z, W=None, ...)
Each takes q [B, H, N, d] (layout="bhnd", default) or [B, N, H, d]
(layout="bnhd") with any strides whose last axis is unit-stride: views are
passed to C without copies (a q sliced from a fused QKV projection included).
Outputs are dense in the same layout. q_len / k_len: optional [B] valid
lengths (padding at the end). Parameters left at None take the C library's
defaults (include/birkhoff/*.h).

Modules:
  MultiheadAttention(embed_dim, num_heads, normaliser="sinkhorn", ...)
      a drop-in for torch.nn.MultiheadAttention (batch_first, key padding
      masks given as suffix masks or lengths) whose row normaliser is
      softmax, sinkhorn, unbalanced, esp or lot;
  LOTAttention(embed_dim, num_heads, r, ...)  MultiheadAttention with
      normaliser="lot" and the pivots Z [H, r, dh] and mass logits
      theta [H, r] as parameters;
  OTKPooling(dim, refs, supports, ...)        the OTK embedding as a pooling
      layer with its references (and optional anchors) as parameters.

CUDA (libbirkhoff built with its CUDA backend): softmax_attention,
sinkhorn_attention, attention("softmax" / "sinkhorn", ...) and
MultiheadAttention(normaliser="softmax" / "sinkhorn") take CUDA tensors of
float32, bfloat16 or float16 (q, k, v of one dtype; outputs and gradients in
it, fp32 accumulation inside) and run asynchronously on torch's current
stream of the tensors' device; the tape stays in device memory. Under
torch.autocast("cuda") CUDA operands are cast to the autocast dtype first
(as torch's own attention). The other operators run on the CPU only.

torch >= 2.4: the functions and modules call torch.library custom
operators (birkhoff._torch_ops: fake implementations, register_autograd,
register_autocast), so torch.compile(fullgraph=True) traces each as one
node without a graph break; under torch.autocast("cpu") their operands are
cast to float32 and their outputs are float32. Older torch (1.13) runs the
autograd.Function classes below (CPU autocast casts the same way);
USE_CUSTOM_OPS = False selects them on torch 2.x too. docs/PYTHON.md,
"torch.compile, custom operators and autocast".

Wrong dtype (CPU: float32 only), device (CPU or CUDA, all operands on one),
rank or shape raise TypeError/ValueError before any C call; C errors raise
birkhoff.BirkhoffError with the C library's message (a result that
overflows float32 for finite inputs: status "float32 overflow"); sparse
tensors raise TypeError. Gradients are exact VJPs of the C forward: see
docs/PYTHON.md for the tolerances the tests hold them to. They are
first-order only: every Function's backward is once_differentiable, so a
second derivative through it (torch.autograd.grad(..., create_graph=True),
then a backward through that gradient) raises RuntimeError instead of
returning a gradient with no graph.
"""
import contextlib
import functools
import math

import numpy as np
import torch
from . import _torch_support
_torch_support.check(torch)  # a torch outside birkhoff's supported range: ImportError saying so
from torch import nn
from torch.autograd.function import once_differentiable

from . import _core as K

__all__ = ["attention", "softmax_attention", "sinkhorn_attention", "unbalanced_attention", "esp_attention", "lot_attention", "diff_attention", "otk_embedding",
           "MultiheadAttention", "LOTAttention", "OTKPooling", "cuda_available"]

# element types of CUDA operands (bk_dtype); host operands are float32 only
_CUDA_DTYPES = {torch.float32: K._lib.BK_F32, torch.bfloat16: K._lib.BK_BF16, torch.float16: K._lib.BK_F16}


class TorchAdapter:
    name = "torch"

    @staticmethod
    def prepare(a, name):
        if not isinstance(a, torch.Tensor):
            raise TypeError("%s: torch.Tensor expected, got %s" % (name, type(a).__name__))
        if a.layout != torch.strided:
            raise TypeError("%s: a dense (strided) tensor expected, got a %s one (convert it with .to_dense())"
                            % (name, str(a.layout).replace("torch.", "")))
        if a.is_cuda:  # (is_cuda is cheaper than a.device, which builds a device object per call)
            if a.dtype not in _CUDA_DTYPES:
                raise TypeError("%s: CUDA tensors must be torch.float32, torch.bfloat16 or torch.float16, got %s"
                                % (name, a.dtype))
            return a.detach()
        if a.dtype != torch.float32:
            raise TypeError("%s: torch.float32 expected, got %s%s" % (
                name, a.dtype, " (bfloat16 and float16 run on CUDA only)" if a.dtype in _CUDA_DTYPES else ""))
        if a.device.type != "cpu":
            raise ValueError("%s: birkhoff runs on the CPU or on CUDA, the tensor is on %s" % (name, a.device))
        return a.detach()

    @staticmethod
    def place(a):
        if a.is_cuda:
            return K._lib.bk_device_cuda(a.device.index), _CUDA_DTYPES.get(a.dtype, -1)
        return 0, K._lib.BK_F32

    @staticmethod
    def where(a):
        return str(a.device), str(a.dtype).replace("torch.", "")

    @staticmethod
    def tape(nbytes, like):
        return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=like.device)

    @staticmethod
    def zeros32(n, like):
        return torch.zeros(n, dtype=torch.float32, device=like.device)

    @staticmethod
    @contextlib.contextmanager
    def running(a):
        """the library's CUDA context of a's device on torch's current stream
        there, current on this thread for the block (with a's device as the
        CUDA runtime's current device, restored afterwards)"""
        dev = a.device
        with torch.cuda.device(dev):
            ctx = K.cuda_context(dev.index, torch.cuda.current_stream(dev).cuda_stream)
            with K.using(ctx):
                yield

    @staticmethod
    def info(a):
        return a.data_ptr(), tuple(a.shape), tuple(a.stride())

    @staticmethod
    def aligned(a):
        return True

    @staticmethod
    def contiguous(a):
        """a cheap sufficient test that needs_copy is false: a contiguous
        tensor (torch has no negative strides)"""
        return a.is_contiguous()

    @staticmethod
    def dense(a):
        return a.contiguous()

    @staticmethod
    def empty(shape, like=None):
        if like is None or like.device.type == "cpu":
            return torch.empty(shape, dtype=torch.float32)
        return torch.empty(shape, dtype=like.dtype, device=like.device)

    @staticmethod
    def lengths(x, B, name):
        if isinstance(x, torch.Tensor):
            if x.layout != torch.strided:
                raise TypeError("%s: a dense (strided) tensor of lengths expected, got a %s one"
                                % (name, str(x.layout).replace("torch.", "")))
            if x.dtype.is_floating_point or x.dtype == torch.bool:
                raise TypeError("%s: integer lengths expected, got %s" % (name, x.dtype))
            x = x.detach().cpu().numpy()
        return K.NP.lengths(x, B, name)


TA = TorchAdapter


def _param_np(t, name):
    """a float32 CPU tensor parameter as a dense numpy array sharing its
    memory where possible"""
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        TA.prepare(t, name)
        if t.device.type != "cpu":
            raise ValueError("%s: a CPU float32 tensor expected (operators with parameter arrays run on the CPU "
                             "only), got one on %s" % (name, t.device))
        return t.detach().contiguous().numpy()
    return np.ascontiguousarray(np.asarray(t, dtype=np.float32))


def _as_tensor(t, name):
    """parameters may be given as numpy arrays: autograd saves tensors only"""
    if t is None or isinstance(t, torch.Tensor):
        return t
    a = np.asarray(t)
    if a.dtype != np.float32:
        raise TypeError("%s: float32 expected, got %s" % (name, a.dtype))
    return torch.from_numpy(np.ascontiguousarray(a))


def _t(a):
    return None if a is None else torch.from_numpy(a)


def _autocast_dtype():
    """the dtype of torch.autocast("cuda") in force on this thread, or None"""
    try:
        on = torch.is_autocast_enabled("cuda")
    except TypeError:   # torch < 2.4: no device argument, the CUDA state
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    return torch.get_autocast_dtype("cuda") if on else None


def _cpu_autocast():
    """whether torch.autocast("cpu") is in force on this thread"""
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:   # torch < 2.4
        return torch.is_autocast_cpu_enabled()


def _autocast(*ts):
    """Under torch.autocast("cuda"): the CUDA float32 / float16 / bfloat16
    operands cast to the autocast dtype (as autocast casts the inputs of
    torch's own attention; a differentiable cast, so float32 leaves get
    float32 gradients). Under torch.autocast("cpu") on the Function path
    (torch < 2.4; the custom operators do it through
    torch.library.register_autocast): CPU bfloat16 / float16 operands cast
    to float32, the CPU operators' only dtype. Everything else as it is.
    Outside autocast: all as they are (q, k, v of different dtypes are then
    refused)."""
    dt = _autocast_dtype()
    if dt is not None:
        ts = tuple(t.to(dt) if isinstance(t, torch.Tensor) and t.is_cuda and t.dtype in _CUDA_DTYPES and t.dtype != dt
                   else t for t in ts)
    if not _use_ops() and _cpu_autocast():
        ts = tuple(t.float() if isinstance(t, torch.Tensor) and not t.is_cuda and t.dtype in (torch.bfloat16,
                                                                                               torch.float16)
                   else t for t in ts)
    return ts


def cuda_available(device=0):
    """True when CUDA tensors on `device` can go to birkhoff here: torch sees
    the device and libbirkhoff was built with its CUDA backend and can use
    it (see birkhoff._core.cuda_status for the library's reason if not)."""
    if not torch.cuda.is_available() or device >= torch.cuda.device_count():
        return False
    return K.cuda_status(device)[0]


def _first_order(backward):
    """backward made once_differentiable (torch.autograd.function): a second
    derivative through it (torch.autograd.grad(..., create_graph=True), then
    a backward through that gradient) raises RuntimeError ("trying to
    differentiate twice a function that was marked with
    @once_differentiable") instead of returning a gradient with no graph.
    once_differentiable looks at the incoming gradients only: the gradient
    of a scalar loss, a constant, would slip through while the inputs
    require grad, so it is marked as requiring grad then."""
    inner = once_differentiable(backward)

    @functools.wraps(backward)
    def wrapped(ctx, *grads):
        if torch.is_grad_enabled() and any(ctx.needs_input_grad) and \
                not any(isinstance(g, torch.Tensor) and g.requires_grad for g in grads):
            grads = tuple(g.detach().requires_grad_() if isinstance(g, torch.Tensor) and g.is_floating_point()
                          else g for g in grads)
        return inner(ctx, *grads)
    return wrapped


class _QKV(torch.autograd.Function):
    """softmax and Sinkhorn attention: q, k, v in, their gradients out; `op`
    is (forward, backward) of _core with their parameters `p`. CPU or CUDA
    (the tape is then a uint8 tensor on the device, kept for the backward,
    which autograd runs on the forward's stream)."""

    @staticmethod
    def forward(ctx, q, k, v, q_len, k_len, layout, op, p):
        pr = K.Problem(TA, q, k, v, q_len, k_len, layout)
        res = op[0](pr, p, want_tape=any(ctx.needs_input_grad[:3]))
        ctx.save_for_backward(q, k, v)
        ctx.tape, ctx.args = res["tape"], (q_len, k_len, layout, op, p)
        return res["out"]

    @staticmethod
    @_first_order
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        q_len, k_len, layout, op, p = ctx.args
        dq, dk, dv = op[1](K.Problem(TA, q, k, v, q_len, k_len, layout), p, dout, ctx.tape)
        return dq, dk, dv, None, None, None, None, None


# (forward, backward) of a registered operator p (_core.Registered): every
# operator of _QKV runs on the registry's generic path
_REGISTERED = (lambda pr, p, want_tape=True, want_attn=False: p.forward(pr, want_tape, want_attn),
               lambda pr, p, dout, tape: p.backward(pr, dout, tape))


class _Esp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, theta, q_len, k_len, layout, kw):
        op = K.esp_op(theta=_param_np(theta, "theta"), **kw)
        pr = K.Problem(TA, q, k, v, q_len, k_len, layout)
        pr.host_only("ESP attention")
        res = op.forward(pr, want_tape=any(ctx.needs_input_grad[:4]))
        ctx.save_for_backward(q, k, v, theta)
        ctx.tape, ctx.args = res["tape"], (q_len, k_len, layout, kw)
        return res["out"]

    @staticmethod
    @_first_order
    def backward(ctx, dout):
        q, k, v, theta = ctx.saved_tensors
        q_len, k_len, layout, kw = ctx.args
        want_th = theta is not None and ctx.needs_input_grad[3]
        op = K.esp_op(theta=_param_np(theta, "theta"), outputs=("dslices",) if want_th else (), **kw)
        pr = K.Problem(TA, q, k, v, q_len, k_len, layout)
        pr.host_only("ESP attention")
        dq, dk, dv, g = op.backward(pr, dout, ctx.tape, outputs=True)
        dth = g.get("dslices")
        return dq, dk, dv, _t(dth), None, None, None, None


class _Lot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, Z, theta, q_len, k_len, layout, kw):
        pr = K.Problem(TA, q, k, v, q_len, k_len, layout)
        pr.host_only("LOT attention")
        res = K.lot_op(_param_np(Z, "Z"), _param_np(theta, "theta"), **kw).forward(
            pr, want_tape=any(ctx.needs_input_grad[:5]))
        ctx.save_for_backward(q, k, v, Z, theta)
        ctx.tape, ctx.args = res["tape"], (q_len, k_len, layout, kw)
        return res["out"]

    @staticmethod
    @_first_order
    def backward(ctx, dout):
        q, k, v, Z, theta = ctx.saved_tensors
        q_len, k_len, layout, kw = ctx.args
        pr = K.Problem(TA, q, k, v, q_len, k_len, layout)
        pr.host_only("LOT attention")
        want = ctx.needs_input_grad[3] or ctx.needs_input_grad[4]
        op = K.lot_op(_param_np(Z, "Z"), _param_np(theta, "theta"),
                      outputs=("dpivots", "dpivot_logits") if want else (), **kw)
        dq, dk, dv, g = op.backward(pr, dout, ctx.tape, outputs=True)
        dZ, dth = g.get("dpivots"), g.get("dpivot_logits")
        return dq, dk, dv, _t(dZ), _t(dth), None, None, None, None


class _Diff(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lam, q_len, k_len, layout, kw):
        pr = K.Problem(TA, q, k, v, q_len, k_len, layout)
        pr.host_only("differential attention")
        res = K.diff_op(_param_np(lam, "lambda"), pr.desc.H, **kw).forward(pr, want_tape=any(ctx.needs_input_grad[:4]))
        ctx.save_for_backward(q, k, v, lam)
        ctx.tape, ctx.args = res["tape"], (q_len, k_len, layout, kw)
        return res["out"]

    @staticmethod
    @_first_order
    def backward(ctx, dout):
        q, k, v, lam = ctx.saved_tensors
        q_len, k_len, layout, kw = ctx.args
        pr = K.Problem(TA, q, k, v, q_len, k_len, layout)
        pr.host_only("differential attention")
        op = K.diff_op(_param_np(lam, "lambda"), pr.desc.H, outputs=("dlambda",) if ctx.needs_input_grad[3] else (),
                       **kw)
        dq, dk, dv, g = op.backward(pr, dout, ctx.tape, outputs=True)
        dl = g.get("dlambda")
        return dq, dk, dv, _t(dl), None, None, None, None


class _Otk(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, z, W, lengths, kw):
        zn, Wn = _param_np(z, "z"), _param_np(W, "W")
        op, prm = K.otk_setup(TA, x, zn, Wn, lengths, kw)
        res = K.otk_forward(op, prm, zn, want_tape=any(ctx.needs_input_grad[:3]))
        ctx.save_for_backward(x, z, W)
        ctx.tape, ctx.args = res["tape"], (lengths, kw)
        return res["out"]

    @staticmethod
    @_first_order
    def backward(ctx, dout):
        x, z, W = ctx.saved_tensors
        lengths, kw = ctx.args
        zn, Wn = _param_np(z, "z"), _param_np(W, "W")
        op, prm = K.otk_setup(TA, x, zn, Wn, lengths, kw)
        n = ctx.needs_input_grad
        dx, dz, dW = K.otk_backward(op, prm, zn, dout, ctx.tape, n[0], n[1], W is not None and n[2])
        return dx, _t(dz), _t(dW), None, None


# ---- the custom-operator path (torch >= 2.4: birkhoff._torch_ops) ----

def _use_ops(q=None):
    """whether the functions call the torch.library custom operators (torch
    >= 2.4 and USE_CUSTOM_OPS) rather than the autograd.Function classes.
    CUDA operands q take the Function path in eager mode (the path the CUDA
    tests hold) and the custom operators under torch.compile only."""
    if _ops is None or not USE_CUSTOM_OPS:
        return False
    return not (isinstance(q, torch.Tensor) and q.is_cuda) or _compiling()


def _compiling():
    return torch.compiler.is_compiling()


def _want_tape(*ts):
    """whether the forward keeps a tape: grad mode on and an operand that
    requires grad"""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in ts)


def _lengths_t(x):
    """lengths as a tensor for the custom operators (checked inside them,
    as the Function path checks them)"""
    if x is None or isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    return torch.tensor(x)


def _seed64(seed):
    """a uint64 seed in the schema's int64 (the operator takes it modulo 2^64)"""
    if seed is None or _compiling():
        return seed
    s = K._lib.check_int(seed, K.C.c_uint64, "seed")
    return s - 2 ** 64 if s >= 2 ** 63 else s


def _op(name, qkv, arrays, q_len, k_len, layout, params, check):
    """custom operator `name` on q, k, v (cast under CUDA autocast), its
    array operands and typed parameters; check() (eager only) raises the
    Function path's errors for bad keywords before the call"""
    if not _compiling():
        check()
    q, k, v = _autocast(*qkv)
    return _ops.OPS[name](q, k, v, *arrays, _lengths_t(q_len), _lengths_t(k_len), layout, *params,
                          _want_tape(q, k, v, *arrays))[0]


# ---- functional API ----

def _literal(v):
    """a parameter value as a Python literal (numpy scalars as Python
    numbers), or raise _NotLiteral"""
    if isinstance(v, np.generic):
        v = v.item()
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise _NotLiteral


class _NotLiteral(Exception):
    pass


def _params_text(params):
    """repr of a dict of literal parameters (the custom operators' str
    argument), or None when a value is not a literal (an array)"""
    try:
        return repr({str(k): _literal(v) for k, v in sorted(params.items())})
    except _NotLiteral:
        return None


def attention(name, q, k, v, *, q_len=None, k_len=None, layout="bhnd", **params):
    """Any registered operator by name (birkhoff.operators()), its scalar
    parameters by key as birkhoff.attention(); differentiable in q, k, v
    when the operator has a backward. CUDA tensors: the library runs the
    operators its CUDA backend has (softmax, sinkhorn) and refuses the
    others (BirkhoffError, status "unsupported"). On torch >= 2.4 a call
    whose parameters are all literals (numbers, strings, booleans) is the
    custom operator birkhoff::attention; one with array parameters takes the
    autograd.Function path (not traceable by torch.compile)."""
    text = _params_text(params) if _use_ops(q) else None
    if text is None:
        return _QKV.apply(*_autocast(q, k, v), q_len, k_len, layout, _REGISTERED, K.Registered(name, params))
    if not _compiling():
        K.Registered(name, params)   # the keywords' errors before the call, as on the Function path
    q, k, v = _autocast(q, k, v)
    return _ops.OPS["attention"](name, text, q, k, v, _lengths_t(q_len), _lengths_t(k_len), layout,
                                 _want_tape(q, k, v))[0]


def softmax_attention(q, k, v, *, q_len=None, k_len=None, layout="bhnd", scale=None, causal=False):
    """softmax(scale q k^T) v (scale None: 1/sqrt(d)); causal=True: query i
    sees keys j <= i + (Lk - Lq). CPU float32, or CUDA float32 / bfloat16 /
    float16 (on torch's current stream; under torch.autocast("cuda") the
    operands are cast to its dtype)."""
    if _use_ops(q):
        return _op("softmax", (q, k, v), (), q_len, k_len, layout, (scale, None if causal is None else bool(causal)),
                   lambda: K.softmax_op(scale, causal))
    return _QKV.apply(*_autocast(q, k, v), q_len, k_len, layout, _REGISTERED, K.softmax_op(scale, causal))


def sinkhorn_attention(q, k, v, *, q_len=None, k_len=None, layout="bhnd", scale=None, eps=None, iters=None,
                       tol=None, grad=None):
    """Sinkhorn attention (Sinkformers): iters half-steps (row first) at
    temperature eps; grad "unrolled" (exact VJP, default) or "implicit".
    Devices and dtypes as softmax_attention."""
    if _use_ops(q):
        return _op("sinkhorn", (q, k, v), (), q_len, k_len, layout, (scale, eps, iters, tol, grad),
                   lambda: K.sinkhorn_op(scale, eps, iters, tol, grad))
    p = K.sinkhorn_op(scale, eps, iters, tol, grad)
    return _QKV.apply(*_autocast(q, k, v), q_len, k_len, layout, _REGISTERED, p)


def unbalanced_attention(q, k, v, *, q_len=None, k_len=None, layout="bhnd", scale=None, eps=None, iters=None,
                         tol=None, rho=None):
    """Unbalanced Sinkhorn attention (the Sinkformers code's
    SinkhornUnbalanced): column half-steps damped by rho / (rho + eps)
    (default rho 10); exact unrolled backward."""
    if _use_ops():
        return _op("unbalanced", (q, k, v), (), q_len, k_len, layout, (scale, eps, iters, tol, rho),
                   lambda: K.unbalanced_op(scale, eps, iters, tol, rho))
    p = K.unbalanced_op(scale, eps, iters, tol, rho)
    return _QKV.apply(*_autocast(q, k, v), q_len, k_len, layout, _REGISTERED, p)


def esp_attention(q, k, v, *, theta=None, q_len=None, k_len=None, layout="bhnd", sort=None, t=None, tau=None,
                  scale=None, cost=None, out_scale=None, slices=None, seed=None):
    """ESP attention (ESPFormer). sort "hard" or "soft"; theta [L, d]: slice
    directions (a tensor with requires_grad gets its gradient under soft
    sort; None: axis-aligned (slices 0) or `slices` random directions).
    The other options, their units and the margins: birkhoff.esp."""
    kw = dict(sort=sort, t=t, tau=tau, scale=scale, cost=cost, out_scale=out_scale, slices=slices, seed=seed)
    if _use_ops():
        th = _as_tensor(theta, "theta")
        return _op("esp", (q, k, v), (th,), q_len, k_len, layout,
                   (sort, t, tau, scale, cost, out_scale, slices, _seed64(seed)),
                   lambda: (K.esp_op(**dict(kw, slices=slices if th is None else None)),
                            th is None or TA.prepare(th, "theta")))
    return _Esp.apply(q, k, v, _as_tensor(theta, "theta"), q_len, k_len, layout, kw)


def lot_attention(q, k, v, Z, theta, *, q_len=None, k_len=None, layout="bhnd", temp=None, iters=None, eps=None,
                  scale=None, tol=None):
    """LOT attention (LOTFormer): pivots Z [H, r, d], mass logits theta
    [H, r]; both get gradients."""
    kw = dict(temp=temp, iters=iters, eps=eps, scale=scale, tol=tol)
    if _use_ops():
        Zt, tht = _as_tensor(Z, "Z"), _as_tensor(theta, "theta")
        if Zt is None or tht is None:
            raise ValueError("LOT: pivots Z [H, r, d] and mass logits theta [H, r] are required")
        return _op("lot", (q, k, v), (Zt, tht), q_len, k_len, layout, (temp, iters, eps, scale, tol),
                   lambda: (K.Registered("lot", kw, True), TA.prepare(Zt, "Z"), TA.prepare(tht, "theta")))
    return _Lot.apply(q, k, v, _as_tensor(Z, "Z"), _as_tensor(theta, "theta"), q_len, k_len, layout, kw)


def diff_attention(q, k, v, lam, *, q_len=None, k_len=None, layout="bhnd", scale=None):
    """Differential attention (DiffTransformer): (softmax(s Q1 K1^T) - lam_h
    softmax(s Q2 K2^T)) V with q, k split in halves of the (even) head
    dimension; lam [H] (a tensor with requires_grad gets dL/dlambda, summed
    over the batch; the paper's re-parameterisation lambda = exp(lq1.lk1) -
    exp(lq2.lk2) + lambda_init can be written around it in torch);
    scale None: 1/sqrt(d/2)."""
    if not isinstance(lam, torch.Tensor):
        lam = torch.as_tensor(np.asarray(lam, dtype=np.float32))
    if lam.dim() == 0 and q.dim() == 4:
        lam = lam.expand(q.shape[2] if layout == "bnhd" else q.shape[1])
    if _use_ops():
        return _op("diff", (q, k, v), (lam,), q_len, k_len, layout, (scale,),
                   lambda: (K.Registered("diff", dict(scale=scale), True), TA.prepare(lam, "lambda")))
    return _Diff.apply(q, k, v, lam, q_len, k_len, layout, dict(scale=scale))


def otk_embedding(x, z, W=None, *, lengths=None, **params):
    """OTK embedding of x [B, n, d] onto references z [q, p, k]: [B, p, q*k]
    (params as birkhoff.otk: sigma, eta, eps, iters (half-steps, even),
    domain, convention, pe, sigma_pos, pe_double, grid, isqrt_grad)."""
    kw = K.otk_keywords(params)
    if _use_ops():
        zt, Wt = _as_tensor(z, "z"), _as_tensor(W, "W")
        if not _compiling():
            K.otk_params(None, *(kw.get(key) for key in K.OTK_KEYS))   # the keywords' errors first
            for t, nm in ((zt, "z"), (Wt, "W")):
                if t is not None:
                    TA.prepare(t, nm)
        vals = [kw.get(key) for key in K.OTK_KEYS]
        i = K.OTK_KEYS.index("grid")
        if vals[i] is not None:
            vals[i] = [int(g) for g in vals[i]]
        i = K.OTK_KEYS.index("pe_double")
        if vals[i] is not None:
            vals[i] = bool(vals[i])
        x, = _autocast(x)
        return _ops.OPS["otk_embedding"](x, zt, Wt, _lengths_t(lengths), *vals, _want_tape(x, zt, Wt))[0]
    return _Otk.apply(x, _as_tensor(z, "z"), _as_tensor(W, "W"), lengths, K.otk_keywords(params))


# ---- modules ----

NORMALISERS = ("softmax", "sinkhorn", "unbalanced", "esp", "lot")


def _suffix_lengths(mask, B, N, name):
    """[B] lengths from a [B, N] boolean padding mask (True = padding) whose
    padding is a suffix of every row (the custom operator
    birkhoff::suffix_lengths on torch >= 2.4: an int32 tensor)"""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.layout != torch.strided or mask.dtype != torch.bool or \
            tuple(mask.shape) != (B, N):
        raise ValueError("%s: a bool tensor [B=%d, N=%d] (True = padding) expected" % (name, B, N))
    if _use_ops():
        return _ops.OPS["suffix_lengths"](mask, name)
    return _suffix_lengths_check(mask, name)


def _suffix_lengths_check(mask, name):
    m = mask.detach().cpu()
    lens = (~m).sum(dim=1)
    ar = torch.arange(m.shape[1]).unsqueeze(0)
    if not torch.equal(m, ar >= lens.unsqueeze(1)):
        raise ValueError("%s: birkhoff takes padding at the end of each sequence only (a suffix mask); "
                         "reorder the tokens or pass lengths" % name)
    return lens.to(torch.int32).numpy()


class MultiheadAttention(nn.Module):
    """Multi-head attention whose attention matrix is normalised by
    `normaliser`: "softmax", "sinkhorn" (default), "unbalanced", "esp" or
    "lot".

    The constructor, the parameters (in_proj_weight [3E, E], in_proj_bias,
    out_proj) and the call are torch.nn.MultiheadAttention's, defaults
    included (batch_first=False: [N, B, E]; batch_first=True: [B, N, E]):
        out, weights = mha(query, key=None, value=None, key_padding_mask=None,
                           need_weights=True, attn_mask=None,
                           average_attn_weights=True, *, lengths=None)
    key/value None (or the query itself) means self-attention;
    key_padding_mask [B, Nk] (True = padding) must be a suffix mask; lengths
    [B] gives the valid length of queries and keys of a self-attention
    directly. weights [B, Nq, Nk] (or [B, H, Nq, Nk] without averaging) come
    from a second, non-differentiable forward that exports them: pass
    need_weights=False in training (the differentiable path never forms an
    N x N matrix). Not supported (ValueError): attn_mask, dropout,
    add_bias_kv, add_zero_attn, kdim/vdim != embed_dim, devices other than
    CPU and CUDA, dtypes other than float32 (CPU) or float32 / bfloat16 /
    float16 (CUDA, normaliser softmax or sinkhorn; under torch.autocast
    the projections' dtype). The fused QKV projection is viewed as
    [B, N, 3, H, dh] and its q, k, v slices go to C without copies.

    options: the normaliser's parameters (Sinkhorn: eps, iters, tol, grad,
    scale; unbalanced: eps, iters, tol, rho, scale; ESP: sort, t, tau, cost, out_scale, slices, seed, scale; LOT:
    r, temp, iters, eps, tol, scale; softmax: scale).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None, *, normaliser="sinkhorn",
                 **options):
        super().__init__()
        if add_bias_kv or add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn are not supported")
        if (kdim is not None and kdim != embed_dim) or (vdim is not None and vdim != embed_dim):
            raise ValueError("kdim and vdim other than embed_dim are not supported")
        dev = torch.device(device) if device is not None else torch.device("cpu")
        if dev.type not in ("cpu", "cuda"):
            raise ValueError("birkhoff runs on the CPU or on CUDA (device %s requested)" % (device,))
        if dtype is not None and dtype != torch.float32 and (dev.type != "cuda" or dtype not in _CUDA_DTYPES):
            raise TypeError("birkhoff computes in float32 on the CPU, in float32, bfloat16 or float16 on CUDA "
                            "(dtype %s requested on %s)" % (dtype, dev))
        fk = dict(device=device, dtype=dtype)
        if normaliser not in NORMALISERS:
            raise ValueError("normaliser must be one of %s (got %r)" % (", ".join(NORMALISERS), normaliser))
        if embed_dim % num_heads:
            raise ValueError("embed_dim %d is not divisible by num_heads %d" % (embed_dim, num_heads))
        if dropout:
            raise ValueError("attention dropout is not supported (dropout must be 0)")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.normaliser, self.batch_first = normaliser, batch_first
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **fk))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim, **fk)) if bias else None
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **fk)
        self.options = dict(options)
        if normaliser == "lot":
            r = int(self.options.pop("r", 32))
            # N(0, 1), the C engine's law (docs/MODEL.md, "Parameters, names and initialisation")
            self.Z = nn.Parameter(torch.randn(num_heads, r, self.head_dim, **fk))
            self.theta = nn.Parameter(torch.zeros(num_heads, r, **fk))
        self._check_options()
        nn.init.xavier_uniform_(self.in_proj_weight)

    _KEYS = {"softmax": ("scale", "causal"), "sinkhorn": ("scale", "eps", "iters", "tol", "grad"),
             "unbalanced": ("scale", "eps", "iters", "tol", "rho"),
             "esp": ("sort", "t", "tau", "scale", "cost", "out_scale", "slices", "seed"),
             "lot": ("temp", "iters", "eps", "scale", "tol")}

    def _check_options(self):
        bad = set(self.options) - set(self._KEYS[self.normaliser])
        if bad:
            raise TypeError("unknown option(s) for normaliser %s: %s (known: %s)" % (
                self.normaliser, ", ".join(sorted(bad)), ", ".join(self._KEYS[self.normaliser])))
        self._kernel(None)  # types now (ranges are the C library's, at the first call)

    def _kernel(self, pr):
        """(forward of _core, its parameters) for the normaliser; pr None
        only checks the options (LOT's pivots are checked against a problem)"""
        o = self.options
        if self.normaliser == "softmax":
            op = K.softmax_op(**o)
        elif self.normaliser == "sinkhorn":
            op = K.sinkhorn_op(**o)
        elif self.normaliser == "unbalanced":
            op = K.unbalanced_op(**o)
        elif self.normaliser == "esp":
            op = K.esp_op(**o)
        elif pr is None:   # the options' types only (the pivots are checked against a problem)
            op = K.Registered("lot", o, True)
        else:
            op = K.lot_op(_param_np(self.Z, "Z"), _param_np(self.theta, "theta"), **o)
        return _REGISTERED[0], op

    def extra_repr(self):
        opts = "".join(", %s=%r" % kv for kv in sorted(self.options.items()))
        if self.normaliser == "lot":
            opts = ", r=%d" % self.Z.shape[1] + opts
        return "embed_dim=%d, num_heads=%d, normaliser=%s%s" % (self.embed_dim, self.num_heads, self.normaliser,
                                                               opts)

    def attend(self, q, k, v, q_len=None, k_len=None, layout="bnhd"):
        """the normaliser applied to per-head q, k, v (no projections)"""
        o = self.options
        if self.normaliser == "softmax":
            return softmax_attention(q, k, v, q_len=q_len, k_len=k_len, layout=layout, **o)
        if self.normaliser == "sinkhorn":
            return sinkhorn_attention(q, k, v, q_len=q_len, k_len=k_len, layout=layout, **o)
        if self.normaliser == "unbalanced":
            return unbalanced_attention(q, k, v, q_len=q_len, k_len=k_len, layout=layout, **o)
        if self.normaliser == "esp":
            return esp_attention(q, k, v, q_len=q_len, k_len=k_len, layout=layout, **o)
        return lot_attention(q, k, v, self.Z, self.theta, q_len=q_len, k_len=k_len, layout=layout, **o)

    def forward(self, query, key=None, value=None, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, *, lengths=None):
        if attn_mask is not None:
            raise ValueError("attn_mask is not supported (padding: key_padding_mask as a suffix mask, or lengths)")
        self_attn = (key is None or key is query) and (value is None or value is query)
        if not self.batch_first:
            query = query.transpose(0, 1)
            key = key.transpose(0, 1) if key is not None else None
            value = value.transpose(0, 1) if value is not None else None
        if query.dim() != 3 or query.shape[-1] != self.embed_dim:
            raise ValueError("query: [B, N, %d] expected, got %s" % (self.embed_dim, tuple(query.shape)))
        B, N, E = query.shape
        H, dh = self.num_heads, self.head_dim
        W, b = self.in_proj_weight, self.in_proj_bias
        if self_attn:
            qkv = nn.functional.linear(query, W, b).view(B, N, 3, H, dh)
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
            Nk = N
        else:
            key = query if key is None else key
            value = key if value is None else value
            Nk = key.shape[1]
            q = nn.functional.linear(query, W[:E], None if b is None else b[:E]).view(B, N, H, dh)
            k = nn.functional.linear(key, W[E:2 * E], None if b is None else b[E:2 * E]).view(B, Nk, H, dh)
            v = nn.functional.linear(value, W[2 * E:], None if b is None else b[2 * E:]).view(B, Nk, H, dh)
        k_len = _suffix_lengths(key_padding_mask, B, Nk, "key_padding_mask")
        q_len = None
        if lengths is not None:
            if key_padding_mask is not None:
                raise ValueError("give either lengths or key_padding_mask, not both")
            if not self_attn:
                raise ValueError("lengths is for self-attention; use key_padding_mask for cross-attention")
            q_len = k_len = _lengths_t(lengths) if _use_ops() else TA.lengths(lengths, B, "lengths")
        o = self.attend(q, k, v, q_len, k_len, "bnhd").reshape(B, N, E)
        out = self.out_proj(o)
        if not self.batch_first:
            out = out.transpose(0, 1)
        weights = self.weights(q, k, v, q_len, k_len, average_attn_weights) if need_weights else None
        return out, weights

    @torch.no_grad()
    def weights(self, q, k, v, q_len=None, k_len=None, average=True):
        """the attention matrices [B, H, Nq, Nk] (average: their mean over
        heads, [B, Nq, Nk]) of per-head q, k, v in layout bnhd: a second,
        non-differentiable forward that exports them (the differentiable
        one never forms them); on CUDA in the operands' dtype"""
        q, k, v = _autocast(q, k, v)
        text = _params_text(self.options) if _use_ops(q) else None
        if text is not None:
            lot = self.normaliser == "lot"
            A = _ops.OPS["weights"](self.normaliser, text, q, k, v, self.Z if lot else None,
                                    self.theta if lot else None, _lengths_t(q_len), _lengths_t(k_len))
            return A.mean(dim=1) if average else A
        pr = K.Problem(TA, q, k, v, q_len, k_len, "bnhd")
        fwd, p = self._kernel(pr)
        A = fwd(pr, p, False, True)["attn"]
        return A.mean(dim=1) if average else A


class LOTAttention(MultiheadAttention):
    """MultiheadAttention(normaliser="lot") with r pivots per head: Z
    [H, r, dh] ~ N(0, 1) (the C engine's law; the reference code's DeiT/Swin
    models draw N(0, 1/dh), its LRA/NMT ones N(0, 0.02^2): re-draw with
    nn.init.normal_(m.Z, 0, std) for those) and mass logits theta [H, r] =
    0, both parameters."""

    def __init__(self, embed_dim, num_heads, r=32, **kwargs):
        super().__init__(embed_dim, num_heads, normaliser="lot", r=r, **kwargs)


class OTKPooling(nn.Module):
    """The OTK embedding as a pooling layer: x [B, n, dim] -> [B, p * refs * k]
    (flatten=True) or [B, p, refs * k]. References z [refs, supports, k]
    are a parameter (N(0, 1/k)); anchors=k0 adds a trainable Nystrom
    feature map with anchors W [k0, dim] (unit rows; renormalise them after
    an optimiser step with normalise_anchors()), else k = dim.
    options: sigma, eta, eps, iters (half-steps, even), domain, convention,
    pe, sigma_pos, pe_double, grid, isqrt_grad (birkhoff.otk)."""

    def __init__(self, dim, refs=1, supports=10, anchors=None, flatten=True, **options):
        super().__init__()
        self.options = K.otk_keywords(dict(options))
        self.flatten = flatten
        k = dim if anchors is None else int(anchors)
        self.z = nn.Parameter(torch.randn(refs, supports, k) / math.sqrt(k))
        if anchors is not None:
            W = torch.randn(k, dim)
            self.W = nn.Parameter(W / W.norm(dim=1, keepdim=True))
        else:
            self.register_parameter("W", None)

    @torch.no_grad()
    def normalise_anchors(self):
        if self.W is not None:
            self.W.div_(self.W.norm(dim=1, keepdim=True).clamp_min(1e-12))

    def forward(self, x, lengths=None):
        out = otk_embedding(x, self.z, self.W, lengths=lengths, **self.options)
        return out.reshape(out.shape[0], -1) if self.flatten else out


# torch >= 2.4: the operators as torch.library custom operators (torch.compile
# keeps them whole); USE_CUSTOM_OPS = False returns to the Function path
_ops = None
if hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autocast"):
    from . import _torch_ops as _ops   # noqa: E402
USE_CUSTOM_OPS = _ops is not None
