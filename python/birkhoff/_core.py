"""The one bridge between array objects and the C operators (internal).

Every operator call of the numpy API (birkhoff.ops) and of the PyTorch API
(birkhoff.torch) goes through the functions here, with an *adapter* that
knows one array library: how to validate an argument and read its data
pointer, shape and strides, and how to allocate an output. Checks of dtype,
device, rank and shape happen here, before any C call; what only the C
library can judge (lengths, parameter ranges, overlapping strides, non-finite
values) comes back as BirkhoffError with the C message.

Layouts. Attention operands are 4-D with unit stride on the last (channel)
axis: layout "bhnd" is [B, H, N, C], "bnhd" is [B, N, H, C] (PyTorch's usual
layout before the heads are moved). Any other strides are passed to C as
they are (no copy): a q, k or v sliced out of a fused [B, N, 3, H, d]
projection is used in place. Outputs and gradients are allocated dense in
the operands' layout.

Devices. An adapter may hand over arrays that live on a CUDA device (the
torch adapter does): each operand then carries its device and element type
(bk_tensor.device, .dtype), the outputs, gradients and tape are allocated
where the operands live, and the C call runs in a CUDA context made current
on the calling thread for that call only (the adapter's `running`: one
context per (device, stream), created on first use, freed at exit). Every
operand of a call must live on one device with one dtype (checked here,
before any C call). Host arrays are float32 and their calls run in the
thread's current context exactly as before.
"""
import atexit
import contextlib
import ctypes as C
import os
import threading

import numpy as np

from . import _lib
from ._lib import check, lib

LAYOUTS = ("bhnd", "bnhd")
GRAD_MODES = {"unrolled": 0, "implicit": 1}
ESP_SORT = {"hard": 0, "soft": 1}
ESP_COST = {"sq": 0, "euclid": 1}
ESP_SCALE = {"rows": 0, "paper": 1}
ASAP_VARIANT = {"auto": 0, "zero": 1, "column": 2, "row": 3}
ASAP_FIT = {"ls": 0, "kl": 1}
OTK_DOMAIN = {"log": 0, "scaling": 1}
OTK_CONVENTION = {"paper": 0, "reference": 1}
OTK_PE = {"none": 0, "1d": 1, "2d": 2}
OTK_ISQRT = {"exact": 0, "reference": 1}
KMEANS_INIT = {"plusplus": 0, "random": 1}


def choice(table, value, name):
    if value not in table:
        raise ValueError("%s must be one of %s (got %r)" % (name, ", ".join(sorted(table)), value))
    return table[value]


class NumpyAdapter:
    """Arrays are numpy.ndarray of float32 (int32 for lengths), in host
    memory."""
    name = "numpy"

    @staticmethod
    def prepare(a, name):
        if not isinstance(a, np.ndarray):
            raise TypeError("%s: numpy.ndarray expected, got %s" % (name, type(a).__name__))
        if a.dtype != np.float32:
            raise TypeError("%s: float32 expected, got %s (convert with .astype(numpy.float32))" % (name, a.dtype))
        return a

    @staticmethod
    def info(a):
        """(address, shape, strides in elements)"""
        return a.ctypes.data, a.shape, tuple(s // a.itemsize for s in a.strides)

    @staticmethod
    def aligned(a):
        return all(s % a.itemsize == 0 for s in a.strides)

    @staticmethod
    def contiguous(a):
        """a cheap sufficient test that needs_copy is false (numpy: none; its
        C-contiguous flag does not constrain the strides of size-1 axes)"""
        return False

    @staticmethod
    def dense(a):
        return np.ascontiguousarray(a)

    @staticmethod
    def empty(shape, like=None):
        """a new float32 array (`like`: an operand whose device and dtype it
        takes; host float32 here)"""
        return np.empty(shape, dtype=np.float32)

    @staticmethod
    def place(a):
        """(bk device, bk dtype) of a prepared array"""
        return 0, _lib.BK_F32

    @staticmethod
    def where(a):
        """(device, dtype) of a prepared array, in words"""
        return "cpu", "float32"

    @staticmethod
    def tape(nbytes, like):
        return tape_buffer(nbytes)

    @staticmethod
    def zeros32(n, like):
        return np.zeros(n, np.float32)

    @staticmethod
    def running(a):
        return HOST

    @staticmethod
    def lengths(x, B, name):
        a = np.ascontiguousarray(np.asarray(x))
        if a.shape != (B,):
            raise ValueError("%s: shape (%d,) expected (one length per batch entry), got %s" % (name, B, a.shape))
        if a.dtype.kind not in "iu":
            raise TypeError("%s: integer lengths expected, got %s" % (name, a.dtype))
        if a.size and (a.min() < -2**31 or a.max() >= 2**31):
            raise ValueError("%s: lengths outside int32" % name)
        return np.ascontiguousarray(a, dtype=np.int32)


NP = NumpyAdapter


def fptr(addr):
    return C.cast(C.c_void_p(addr), _lib.f32p)


HOST = contextlib.nullcontext()   # host calls run in the thread's current context, untouched

# ---- CUDA contexts: one per (device ordinal, stream), kept for the process ----
_CONTEXTS = {}
_CONTEXTS_LOCK = threading.Lock()


def cuda_context(device, stream):
    """The library's CUDA context for device ordinal `device` running on the
    CUDA stream `stream` (a cudaStream_t as an integer; 0: the default
    stream), created on first use (BirkhoffError when the library was built
    without the CUDA backend or the device is not usable) and cached: a
    context's stream is fixed at its creation."""
    key = (int(device), int(stream or 0))
    ctx = _CONTEXTS.get(key)
    if ctx is not None:
        return ctx
    with _CONTEXTS_LOCK:
        ctx = _CONTEXTS.get(key)
        if ctx is None:
            cfg = lib.bk_context_config_default()
            cfg.backend, cfg.device, cfg.stream = _lib.BK_BACKEND_CUDA, key[0], key[1] or None
            # the 16-bit forward keeps its output in the tape: the backward
            # takes D = rowsum(dO .* O) from it instead of a pass (docs/CUDA.md)
            cfg.tape_output = 1
            out = C.c_void_p()
            check(lib.bk_context_create(C.byref(cfg), C.byref(out)))
            ctx = _CONTEXTS[key] = out.value
    return ctx


@atexit.register
def free_contexts():
    """frees the cached CUDA contexts (at exit; later calls create new ones)"""
    with _CONTEXTS_LOCK:
        ctxs = list(_CONTEXTS.values())
        _CONTEXTS.clear()
    for ctx in ctxs:
        lib.bk_context_free(ctx)


@contextlib.contextmanager
def using(ctx):
    """makes the library context `ctx` current on this thread for a block,
    then restores the previous one"""
    prev = lib.bk_context_use(ctx)
    try:
        yield
    finally:
        lib.bk_context_use(prev)


def cuda_status(device=0):
    """(True, "") when the library can run on CUDA device `device` (a context
    can be created on its default stream), else (False, the library's
    reason)"""
    try:
        cuda_context(device, 0)
    except _lib.BirkhoffError as e:
        return False, str(e)
    return True, ""


def _addr_np(a):
    """address of a numpy array (None -> NULL)"""
    return None if a is None else a.ctypes.data


def needs_copy(ad, a, shape, strides):
    """the strides C cannot take: a last axis that is not unit-stride, a
    negative stride, a broadcast (zero-stride) axis of size > 1, or a stride
    that is not a whole number of elements"""
    if shape[-1] > 1 and strides[-1] != 1:
        return True
    return not ad.aligned(a) or any(st < 0 or (st == 0 and n > 1) for n, st in zip(shape, strides))


class Operand:
    """A validated operand: the object (kept alive), its address, its
    [B, H, N, C] sizes and element strides in C's order, and where it lives
    (bk device and dtype)."""
    __slots__ = ("obj", "addr", "B", "H", "N", "C", "sb", "sh", "sn", "dev", "dt")

    def tensor(self):
        return _lib.Tensor(self.addr, self.sb, self.sh, self.sn, self.dev, self.dt)


def attn_operand(ad, a, layout, name):
    """A 4-D attention operand in `layout`; a copy only when its last axis is
    not unit-stride (or a stride is not a whole number of elements)."""
    a = ad.prepare(a, name)
    if len(a.shape) != 4:
        raise ValueError("%s: 4-D [%s] expected, got shape %s" % (name, ", ".join(layout.upper()), tuple(a.shape)))
    if max(a.shape) > 2147483647:   # before any copy (a broadcast view may be that large)
        raise ValueError("%s: every size must be < 2^31 (a C int), got shape %s" % (name, tuple(a.shape)))
    addr, shape, strides = ad.info(a)
    if not ad.contiguous(a) and needs_copy(ad, a, shape, strides):
        a = ad.dense(a)
        addr, shape, strides = ad.info(a)
    if min(shape) < 1:
        raise ValueError("%s: every size must be >= 1, got shape %s" % (name, tuple(shape)))
    return _operand(ad, a, addr, shape, strides, layout)


def _operand(ad, a, addr, shape, strides, layout):
    o = Operand()
    o.obj, o.addr = a, addr
    o.dev, o.dt = ad.place(a)
    if layout == "bhnd":
        o.B, o.H, o.N, o.C = shape
        o.sb, o.sh, o.sn = strides[0], strides[1], strides[2]
    elif layout == "bnhd":
        o.B, o.N, o.H, o.C = shape
        o.sb, o.sn, o.sh = strides[0], strides[1], strides[2]
    else:
        raise ValueError("layout must be 'bhnd' or 'bnhd' (got %r)" % (layout,))
    return o


def new_operand(ad, B, H, N, Cc, layout, like=None):
    """a fresh dense output (sizes from a validated problem: nothing to check
    or copy)"""
    shape = (B, H, N, Cc) if layout == "bhnd" else (B, N, H, Cc)
    a = ad.empty(shape, like)
    addr, shape, strides = ad.info(a)
    return _operand(ad, a, addr, shape, strides, layout)


def same_place(ad, ops, what):
    """every (name, operand) of `ops` on one device with one dtype, else
    ValueError (devices) or TypeError (dtypes) naming them"""
    (n0, o0), rest = ops[0], ops[1:]
    for n, o in rest:
        if o.dev != o0.dev:
            raise ValueError("%s must be on one device: %s is on %s, %s on %s (move them with .to())"
                             % (what, n0, ad.where(o0.obj)[0], n, ad.where(o.obj)[0]))
        if o.dt != o0.dt:
            raise TypeError("%s must have one dtype: %s is %s, %s is %s (cast them, or run under torch.autocast)"
                            % (what, n0, ad.where(o0.obj)[1], n, ad.where(o.obj)[1]))


class Problem:
    """Validated q, k, v (and lengths) of one attention call, on one device
    with one dtype."""

    def __init__(self, ad, q, k, v, q_len, k_len, layout, dv_from_v=True):
        if layout not in LAYOUTS:
            raise ValueError("layout must be 'bhnd' or 'bnhd' (got %r)" % (layout,))
        self.ad, self.layout = ad, layout
        self.q = attn_operand(ad, q, layout, "q")
        self.k = attn_operand(ad, k, layout, "k")
        self.v = attn_operand(ad, v, layout, "v") if v is not None else None
        Q, K, V = self.q, self.k, self.v
        same_place(ad, [("q", Q), ("k", K)] + ([("v", V)] if V is not None else []), "q, k and v")
        self.dev = Q.dev
        if (K.B, K.H) != (Q.B, Q.H) or K.C != Q.C:
            raise ValueError("k: batch, heads and head dim must match q's (q [B=%d, H=%d, N=%d, d=%d], k [B=%d, "
                             "H=%d, N=%d, d=%d])" % (Q.B, Q.H, Q.N, Q.C, K.B, K.H, K.N, K.C))
        if V is not None and ((V.B, V.H, V.N) != (K.B, K.H, K.N)):
            raise ValueError("v: batch, heads and length must match k's (k [%d, %d, %d], v [%d, %d, %d])"
                             % (K.B, K.H, K.N, V.B, V.H, V.N))
        self.q_len = None if q_len is None else ad.lengths(q_len, Q.B, "q_len")
        self.k_len = None if k_len is None else ad.lengths(k_len, Q.B, "k_len")
        self.desc = _lib.AttnDesc(Q.B, Q.H, Q.N, K.N, Q.C, V.C if V is not None else Q.C,
                                  self._lp(self.q_len), self._lp(self.k_len))

    @staticmethod
    def _lp(a):
        return None if a is None else C.cast(C.c_void_p(a.ctypes.data), _lib.i32p)

    def tensors(self):
        return self.q.tensor(), self.k.tensor(), self.v.tensor()

    def out(self, C_=None):
        d = self.desc
        return new_operand(self.ad, d.B, d.H, d.Nq, d.dv if C_ is None else C_, self.layout, self.q.obj)

    def grads(self):
        d, like = self.desc, self.q.obj
        return (new_operand(self.ad, d.B, d.H, d.Nq, d.d, self.layout, like),
                new_operand(self.ad, d.B, d.H, d.Nk, d.d, self.layout, like),
                new_operand(self.ad, d.B, d.H, d.Nk, d.dv, self.layout, like))

    def dout(self, dout):
        o = attn_operand(self.ad, dout, self.layout, "dout")
        d = self.desc
        if (o.B, o.H, o.N, o.C) != (d.B, d.H, d.Nq, d.dv):
            raise ValueError("dout: shape of the output expected ([B=%d, H=%d, N=%d, dv=%d] in layout %s), got %s"
                             % (d.B, d.H, d.Nq, d.dv, self.layout, tuple(dout.shape)))
        same_place(self.ad, [("q", self.q), ("dout", o)], "dout and q")
        return o

    def attn(self):
        """a dense [B, H, Nq, Nk] array for the exported attention"""
        d = self.desc
        return attn_operand(self.ad, self.ad.empty((d.B, d.H, d.Nq, d.Nk), self.q.obj), "bhnd", "attn")

    def host_only(self, name):
        """ValueError before any C call for an operator that takes host
        arrays only (ESP, LOT, differential attention: their parameter
        arrays are host memory, docs/BACKENDS.md)"""
        if self.dev:
            raise ValueError("%s runs on the CPU only (on CUDA: softmax and sinkhorn); q is on %s: pass CPU float32 "
                             "tensors" % (name, self.ad.where(self.q.obj)[0]))

    def running(self):
        """the context the problem's C calls run in (a with-block): the
        thread's current one for host arrays, the device's CUDA context on
        the current stream for device arrays"""
        return self.ad.running(self.q.obj) if self.dev else HOST

    def tape(self, nbytes):
        """a buffer of nbytes (at least 1) for the tape, where the operands live"""
        return self.ad.tape(nbytes, self.q.obj) if self.dev else tape_buffer(nbytes)

    def workspace(self, size_fn, *args):
        """(buffer, address, bytes) of a call's workspace: on a device from
        the framework's allocator (stream-ordered, reused, counted in its
        memory statistics; the size queried with the call's context current,
        so call it inside running()); (None, None, 0) on the host, where the
        library allocates its own"""
        if not self.dev:
            return None, None, 0
        n = int(size_fn(*args))
        buf = self.ad.tape(n, self.q.obj)
        return buf, C.c_void_p(buf.data_ptr()), n

    def zeros32(self, n):
        """n float32 zeros where the operands live (Sinkhorn's potentials)"""
        return self.ad.zeros32(n, self.q.obj) if self.dev else np.zeros(n, np.float32)

    def tape_ptr(self, tape):
        """the address of a tape for this problem's backward (None: NULL);
        a device problem takes a tape on its own device only"""
        if tape is None:
            return None
        if self.dev:
            if not hasattr(tape, "data_ptr") or self.ad.place(tape)[0] != self.dev:
                raise ValueError("tape: the forward's tape on %s expected (the operands' device)"
                                 % self.ad.where(self.q.obj)[0])
            return C.c_void_p(tape.data_ptr())
        return tape_ptr(tape)


def operator_names():
    """the registry's operators, in its order"""
    return [lib.bk_op_name(lib.bk_op_at(i)).decode() for i in range(lib.bk_op_count())]


def _s(b):
    return None if b is None else b.decode()


_SCHEMAS = {}


def find_operator(name):
    """(bk_op handle, the preset's key=value text or None) of a registry
    name or a preset ("asap0"); ValueError naming the registry otherwise"""
    if not isinstance(name, str):
        raise TypeError("the operator name must be a string, got %r" % (name,))
    op = lib.bk_op_find(name.encode())
    if op:
        return op, None
    pp = C.c_char_p()
    op = lib.bk_op_find_preset(name.encode(), C.byref(pp))
    if not op:
        raise ValueError("unknown operator %r; the registry has: %s" % (name, ", ".join(operator_names())))
    return op, pp.value


def schema(name):
    """An operator's description, read from the C registry (birkhoff/ops.h):
    {name, doc, caps, backward, params: [{key, type, doc, alias, values,
    default, range}], arrays: [{name, alias, doc, shape, kind, dim_key}],
    presets: [{name, params, doc}]}. Cached per operator."""
    op, _ = find_operator(name)
    real = lib.bk_op_name(op).decode()
    if real in _SCHEMAS:
        return _SCHEMAS[real]
    caps = lib.bk_op_caps(op)
    sc = {"name": real, "doc": lib.bk_op_doc(op).decode(), "backward": bool(lib.bk_op_has_backward(op)),
          "caps": [c for i, c in enumerate(_lib.OP_CAPS) if caps >> i & 1], "params": [], "arrays": [],
          "presets": []}
    for i in range(lib.bk_op_config_count(op)):
        p = _lib.OpParam()
        check(lib.bk_op_param_info(op, i, C.byref(p)))
        vals = None
        if p.values:
            vals, j = [], 0
            while p.values[j]:
                vals.append(p.values[j].decode())
                j += 1
        sc["params"].append({"key": p.key.decode(), "type": p.type.decode(), "doc": p.doc.decode(),
                             "alias": _s(p.alias), "values": vals, "default": p.default.decode(),
                             "range": p.range.decode()})
    for i in range(lib.bk_op_array_count(op)):
        a = _lib.OpArray()
        check(lib.bk_op_array_info(op, i, C.byref(a)))
        sc["arrays"].append({"name": a.name.decode(), "alias": _s(a.alias), "doc": a.doc.decode(),
                             "shape": a.shape.decode(), "kind": a.kind, "dim_key": _s(a.dim_key),
                             "dim_at": a.dim_at})
    for i in range(lib.bk_op_preset_count(op)):
        pr = _lib.OpPreset()
        check(lib.bk_op_preset_info(op, i, C.byref(pr)))
        sc["presets"].append({"name": pr.name.decode(), "params": pr.params.decode(), "doc": pr.doc.decode()})
    _SCHEMAS[real] = sc
    return sc


def _array_role(kind):
    if kind & _lib.OP_ARRAY_FILE:
        return "a path (file input%s)" % (", required" if kind & _lib.OP_ARRAY_REQUIRED else "")
    if kind & _lib.OP_ARRAY_IN:
        return "float32 array (input%s)" % (", required" if kind & _lib.OP_ARRAY_REQUIRED else "")
    return "True: returned by the %s" % ("backward" if kind & _lib.OP_ARRAY_BWD else "forward")


def describe(name):
    """the keyword section of a docstring for operator `name`, made from its
    schema (the C registry's description)"""
    sc = schema(name)
    lines = ["%s: %s." % (sc["name"], sc["doc"]), ""]
    if sc["params"]:
        lines.append("Parameters (keywords; None keeps the default):")
    for p in sc["params"]:
        vals = "|".join(p["values"]) if p["values"] else p["type"]
        rng = "; in %s" % p["range"] if p["range"] else ""
        lines.append("  %s (%s; default %s%s): %s" % (p["key"], vals, p["default"], rng, p["doc"]))
    if sc["arrays"]:
        lines.append("Arrays (keywords):")
    for a in sc["arrays"]:
        lines.append("  %s %s, %s: %s" % (a["name"], a["shape"], _array_role(a["kind"]), a["doc"]))
    for pr in sc["presets"]:
        lines.append("Preset %r: %s (%s)." % (pr["name"], pr["doc"], pr["params"]))
    if not sc["backward"]:
        lines.append("Inference only (no backward).")
    return "\n".join(lines)


def _py_value(p, v, opname):
    """the text of keyword value v for parameter p, checked as the typed
    functions check theirs: TypeError for a non-number, ValueError for a
    non-integer or an integer outside its C type, or an unknown enum name"""
    key, t = p["key"], p["type"]
    if t == "enum":
        if p["values"] is None or v not in p["values"]:
            raise ValueError("%s must be one of %s (got %r)" % (key, ", ".join(sorted(p["values"] or [])), v))
        return v
    if isinstance(v, bool):
        v = int(v)
    if t in ("int", "int64", "uint64"):
        try:
            x = int(v)
        except (TypeError, ValueError, OverflowError):
            raise TypeError("%s: a number expected, got %r" % (key, v))
        if x != v:
            raise ValueError("%s: an integer expected, got %r" % (key, v))
        return str(_lib.check_int(x, {"int": C.c_int, "int64": C.c_int64, "uint64": C.c_uint64}[t], key))
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        raise TypeError("%s: a number expected, got %r" % (key, v))
    return _float_text(x)


def _float_text(x):
    """the text of a float that reads back (strtof) as the C float of x"""
    with np.errstate(over="ignore"):
        return repr(float(np.float32(x)))


class Registered:
    """A registered operator (or a preset, e.g. "asap0") and one filled
    parameter struct: the registry's defaults, the preset, then each keyword
    checked against the operator's schema: a parameter key (or its alias)
    through the C setter (which names a bad value or a value outside the
    key's range); an input array (LOT's pivots, diff's lambda, ESP's slices:
    float32 arrays; ASAP's layer: a path), attached at the first call for a
    problem's shapes; an output array (diag=True, sigma=True, dlambda=True,
    ...) returned by the forward or the backward. An unknown keyword is the C
    setter's BirkhoffError naming it (TypeError with py_errors, the typed
    functions' convention, which also checks values' types in Python)."""

    def __init__(self, name, params, py_errors=False, outputs=()):
        self.op, preset = find_operator(name)
        self.name = name
        self.sc = schema(name)
        size = lib.bk_op_config_size(self.op)
        self.par = (C.c_double * ((size + 7) // 8 + 1))()   # 8-byte aligned storage
        lib.bk_op_config_default(self.op, self.par)
        if preset:
            check(lib.bk_op_config_parse(self.op, self.par, preset))
        self.inputs, self.keep, self.handles, self.want = {}, {}, {}, set()
        for k, v in params.items():
            if v is not None:
                self._keyword(str(k), v, py_errors)
        for o in outputs:
            self.want.add(self._array(o))

    def _array(self, name):
        j = lib.bk_op_array_find(self.op, name.encode())
        if j < 0:
            raise ValueError("%s has no array %r" % (self.name, name))
        return j

    def _keyword(self, k, v, py_errors):
        i = lib.bk_op_param_find(self.op, k.encode())
        if i >= 0:
            p = self.sc["params"][i]
            if py_errors:
                text = _py_value(p, v, self.name)
            elif isinstance(v, (float, np.floating)):
                text = _float_text(v)
            else:
                text = str(int(v) if isinstance(v, bool) else v)
            check(lib.bk_op_config_set(self.op, self.par, p["key"].encode(), text.encode()))
            return
        j = lib.bk_op_array_find(self.op, k.encode())
        if j >= 0:
            if self.sc["arrays"][j]["kind"] & _lib.OP_ARRAY_IN:
                self.inputs[j] = v
            elif v:
                self.want.add(j)
            return
        if py_errors:
            raise TypeError("%s: unknown option %r" % (self.name, k))
        check(lib.bk_op_config_set(self.op, self.par, k.encode(), b""))   # the C message naming the key

    def __del__(self):
        for j, h in getattr(self, "handles", {}).items():
            lib.bk_op_config_unload(self.op, j, h)

    def has_backward(self):
        return bool(lib.bk_op_has_backward(self.op))

    def shape(self, j, desc):
        dims = (C.c_int64 * 4)()
        r = lib.bk_op_array_shape(self.op, j, C.byref(desc), self.par, dims)
        return tuple(int(dims[i]) for i in range(r))

    def set_input(self, j, v, desc):
        """attaches input array j (float32, dense) for the problem desc:
        ValueError when its shape is not the schema's"""
        a = self.sc["arrays"][j]
        if a["kind"] & _lib.OP_ARRAY_FILE:
            if j not in self.handles:
                h = C.c_void_p()
                check(lib.bk_op_config_load(self.op, self.par, j, os.fsencode(v), C.byref(h)))
                self.handles[j] = h
            return
        x = np.ascontiguousarray(np.asarray(v, dtype=np.float32))
        if a["dim_key"]:   # the dimension that sets a key (ESP's L, LOT's r) first
            if x.ndim <= a["dim_at"]:
                raise ValueError("%s: %s expected, got shape %s" % (a["name"], a["shape"], x.shape))
            check(lib.bk_op_config_set(self.op, self.par, a["dim_key"].encode(), str(x.shape[a["dim_at"]]).encode()))
        want = self.shape(j, desc)
        if tuple(x.shape) != want:
            raise ValueError("%s: %s = %s expected, got shape %s" % (a["name"], a["shape"], want, tuple(x.shape)))
        dims = (C.c_int64 * 4)(*x.shape)
        check(lib.bk_op_config_set_array(self.op, self.par, C.byref(desc), j, C.cast(C.c_void_p(x.ctypes.data),
                                                                                      _lib.f32p), x.ndim, dims))
        self.keep[j] = x

    def bind(self, pr):
        for j, v in self.inputs.items():
            self.set_input(j, v, pr.desc)

    def _buffers(self, pr, kind):
        """the requested output arrays of a kind: (pointer array, {name: (index, buffer, shape)})"""
        n = len(self.sc["arrays"])
        ptrs = (_lib.f32p * max(n, 1))()
        got = {}
        for j in sorted(self.want):
            a = self.sc["arrays"][j]
            if not a["kind"] & kind:
                continue
            shp = self.shape(j, pr.desc)
            cnt = int(np.prod(shp)) if shp else 0
            if pr.dev and a["kind"] & _lib.OP_ARRAY_HOST:
                raise ValueError("%s: %s is not available on a device; run on the CPU for it" % (self.name, a["name"]))
            buf = pr.zeros32(cnt)
            ptrs[j] = f32_ptr(buf)
            got[a["name"]] = (buf, shp)
        return ptrs, got

    def forward(self, pr, want_tape=True, want_attn=False):
        self.bind(pr)
        d = pr.desc
        out = pr.out()
        want_tape = want_tape and self.has_backward()
        attn = pr.attn() if want_attn else None
        ptrs, got = self._buffers(pr, _lib.OP_ARRAY_FWD)
        tq, tk, tv = pr.tensors()
        with pr.running():
            tape = pr.tape(lib.bk_op_tape_size(self.op, C.byref(d), self.par)) if want_tape else None
            _ws, wp, wn = pr.workspace(lib.bk_op_workspace_size, self.op, C.byref(d), self.par)
            check(lib.bk_op_forward_arrays(self.op, C.byref(d), self.par, C.byref(tq), C.byref(tk), C.byref(tv),
                                           C.byref(out.tensor()), pr.tape_ptr(tape),
                                           C.byref(attn.tensor()) if attn else None, ptrs, wp, wn))
        res = {"out": out.obj, "tape": tape}
        if want_attn:
            res["attn"] = attn.obj
        for name, (buf, shp) in got.items():
            res[name] = buf.reshape(shp)
        return res

    def backward(self, pr, dout, tape, outputs=False):
        """(dq, dk, dv), and the backward's requested output arrays as a
        dict when outputs"""
        if not self.has_backward():
            raise ValueError("operator %r has no backward (inference only)" % self.name)
        self.bind(pr)
        do = pr.dout(dout)
        dq, dk, dv = pr.grads()
        tq, tk, tv = pr.tensors()
        tp = pr.tape_ptr(tape)
        ptrs, got = self._buffers(pr, _lib.OP_ARRAY_BWD)
        with pr.running():
            _ws, wp, wn = pr.workspace(lib.bk_op_workspace_size, self.op, C.byref(pr.desc), self.par)
            check(lib.bk_op_backward_arrays(self.op, C.byref(pr.desc), self.par, C.byref(tq), C.byref(tk),
                                            C.byref(tv), C.byref(do.tensor()), tp, C.byref(dq.tensor()),
                                            C.byref(dk.tensor()), C.byref(dv.tensor()), ptrs, wp, wn))
        if not outputs:
            return dq.obj, dk.obj, dv.obj
        return dq.obj, dk.obj, dv.obj, {name: buf.reshape(shp) for name, (buf, shp) in got.items()}


def tape_buffer(nbytes):
    return np.empty(max(int(nbytes), 1), dtype=np.uint8)


def tape_ptr(tape):
    return None if tape is None else C.c_void_p(tape.ctypes.data)


def dense_param(a, shape, name):
    """a float32 numpy array of exactly `shape`, dense (copied if needed)"""
    a = np.asarray(a, dtype=np.float32) if not isinstance(a, np.ndarray) or a.dtype != np.float32 else a
    a = np.ascontiguousarray(a)
    if tuple(a.shape) != tuple(shape):
        raise ValueError("%s: shape %s expected, got %s" % (name, tuple(shape), tuple(a.shape)))
    return a


def f32_np(a):
    return None if a is None else C.cast(C.c_void_p(a.ctypes.data), _lib.f32p)


def f32_ptr(a):
    """a float32 buffer's address: a numpy array (host) or a device tensor (data_ptr)"""
    if a is None or isinstance(a, np.ndarray):
        return f32_np(a)
    return fptr(a.data_ptr())


# --------------------------------------------------------------------------
# the operators' typed keywords, on the registry's generic path (the public
# functions of ops.py and torch.py are thin wrappers over these)
# --------------------------------------------------------------------------

def setp(p, **kw):
    """fields of a C parameter struct from keywords; None keeps the
    library's default (the *_config_default() value)"""
    for k, v in kw.items():
        if v is not None:
            t = type(getattr(p, k))
            try:
                x = t(v)
            except (TypeError, ValueError, OverflowError):
                raise TypeError("%s: a number expected, got %r" % (k, v))
            if t is int and x != v:
                raise ValueError("%s: an integer expected, got %r" % (k, v))
            _lib.set_field(p, k, x)   # an integer in its C type's range (ctypes wraps)
    return p


def softmax_op(scale=None, causal=None):
    return Registered("softmax", dict(scale=scale, causal=None if causal is None else int(bool(causal))), True)


def sinkhorn_op(scale=None, eps=None, iters=None, tol=None, grad=None, outputs=()):
    return Registered("sinkhorn", dict(scale=scale, eps=eps, iters=iters, tol=tol, grad=grad), True, outputs)


def unbalanced_op(scale=None, eps=None, iters=None, tol=None, rho=None, outputs=()):
    return Registered("unbalanced", dict(scale=scale, eps=eps, iters=iters, tol=tol, rho=rho), True, outputs)


def esp_op(sort=None, t=None, tau=None, scale=None, cost=None, out_scale=None, slices=None, theta=None, seed=None,
           outputs=()):
    """ESP: slices L (0 = axis-aligned) as key L; theta [L, d] as its input
    array "slices" (which sets L)"""
    if theta is not None:
        th = np.asarray(theta, dtype=np.float32)
        if th.ndim != 2:
            raise ValueError("theta: [L, d] expected, got shape %s" % (th.shape,))
        slices = None
    if slices is not None:
        slices = _lib.check_int(slices, C.c_int, "slices")
    if seed is not None:
        seed = _lib.check_int(seed, C.c_uint64, "seed")
    op = Registered("esp", dict(sort=sort, t=t, tau=tau, scale=scale, cost=cost, out_scale=out_scale, L=slices,
                                seed=seed), True, outputs)
    if theta is not None:
        op.inputs[op._array("slices")] = theta
    return op


def esp_slices(op, d):
    """the [L, d] slice matrix of an ESP operator (esp_op) for head dim d"""
    desc = _lib.AttnDesc(1, 1, 1, 1, d, d, None, None)
    for j, v in op.inputs.items():
        op.set_input(j, v, desc)
    L = op.shape(op._array("slices"), desc)[0]
    if L < 1:
        raise ValueError("ESP: invalid slice setting (L=%d) for head dim %d" % (L, d))
    th = np.zeros((L, d), np.float32)
    check(lib.bk_esp_slices(C.cast(op.par, C.POINTER(_lib.EspParams)), d, f32_np(th)))
    return th


def lot_op(Z, theta, temp=None, iters=None, eps=None, scale=None, tol=None, outputs=()):
    """LOT: Z [H, r, d] and theta [H, r] as its input arrays pivots and
    pivot_logits (checked against the problem at the first call)"""
    if Z is None or theta is None:
        raise ValueError("LOT: pivots Z [H, r, d] and mass logits theta [H, r] are required")
    op = Registered("lot", dict(temp=temp, iters=iters, eps=eps, scale=scale, tol=tol), True, outputs)
    op.inputs[op._array("pivots")] = Z
    op.inputs[op._array("pivot_logits")] = theta
    return op


def diff_op(lam, H, scale=None, outputs=()):
    """differential attention: lam [H] (a number: the same lambda for every
    head) as its input array lambda"""
    if lam is None:
        raise ValueError("differential attention: lambda [H] is required")
    if np.ndim(lam) == 0:
        lam = np.full(H, lam, np.float32)
    op = Registered("diff", dict(scale=scale), True, outputs)
    op.inputs[op._array("lambda")] = lam
    return op


def diag_dict(arr, B, H, fields):
    """per-problem diagnostics as {field: numpy array [B, H]}: from a C
    struct array, or from a float array [B, H, len(fields)] (an operator's
    diag output; counts, named iters*, come back as integers)"""
    out = {}
    if isinstance(arr, np.ndarray):
        a = arr.reshape(B * H, len(fields))
        for i, f in enumerate(fields):
            col = a[:, i]
            out[f] = (col.astype(np.int64) if f.startswith("iters") else col.astype(np.float64)).reshape(B, H)
        return out
    for f in fields:
        out[f] = np.array([getattr(arr[i], f) for i in range(B * H)]).reshape(B, H)
    return out


# ---- OTK ----

class OtkProblem:
    """x [B, n, d] (any strides with a unit-stride last axis), lengths, and
    the references' sizes."""

    def __init__(self, ad, x, q, p, k, lengths):
        x = ad.prepare(x, "x")
        if ad.place(x)[0]:
            raise ValueError("x: the OTK embedding runs on the CPU only; x is on %s" % ad.where(x)[0])
        if len(x.shape) != 3:
            raise ValueError("x: [B, n, d] expected, got shape %s" % (tuple(x.shape),))
        addr, shape, strides = ad.info(x)
        if needs_copy(ad, x, shape, strides):
            x = ad.dense(x)
            addr, shape, strides = ad.info(x)
        if min(shape) < 1:
            raise ValueError("x: every size must be >= 1, got shape %s" % (tuple(shape),))
        self.ad, self.x = ad, x
        self.B, self.n, self.d = shape
        self.tx = _lib.Tensor(addr, strides[0], 0, strides[1])
        self.len = None if lengths is None else ad.lengths(lengths, self.B, "lengths")
        q, p, k = (_lib.check_int(a, C.c_int, nm) for a, nm in ((q, "q"), (p, "p"), (k, "k")))
        self.desc = _lib.OtkDesc(self.B, self.n, self.d, q, p, k, Problem._lp(self.len))

    def new(self, shape):
        a = self.ad.empty(shape)
        addr, _, strides = self.ad.info(a)
        if len(shape) == 3:
            return a, _lib.Tensor(addr, strides[0], 0, strides[1])
        return a, None


OTK_KEYS = ("sigma", "eta", "eps", "iters", "domain", "convention", "pe", "sigma_pos", "pe_double", "grid",
            "isqrt_grad")


def otk_keywords(kw):
    bad = set(kw) - set(OTK_KEYS)
    if bad:
        raise TypeError("unknown OTK parameter(s): %s (known: %s)" % (", ".join(sorted(bad)), ", ".join(OTK_KEYS)))
    return kw


def otk_setup(ad, x, z, W, lengths, kw):
    """(problem, params) for sets x (adapter ad), references z [q, p, k] and
    anchors W [k, d] or None, both dense float32 numpy arrays"""
    if z is None or z.ndim != 3:
        raise ValueError("z: references [q, p, k] expected, got shape %s" % (None if z is None else z.shape,))
    q, p, k = z.shape
    if W is not None and (W.ndim != 2 or W.shape[0] != k):
        raise ValueError("W: anchors [k=%d, d] expected, got shape %s" % (k, W.shape))
    op = OtkProblem(ad, x, q, p, k, lengths)
    if W is not None and W.shape[1] != op.d:
        raise ValueError("W: anchors [k, d=%d] expected, got shape %s" % (op.d, W.shape))
    return op, otk_params(W, *(otk_keywords(kw).get(key) for key in OTK_KEYS))


def otk_params(W, sigma, eta, eps, iters, domain, convention, pe, sigma_pos, pe_double, grid, isqrt_grad):
    p = setp(lib.bk_otk_config_default(), sigma=sigma, eta=eta, eps=eps, iters=iters, sigma_pos=sigma_pos)
    p.W = f32_np(W)
    for field, table, v in (("domain", OTK_DOMAIN, domain), ("convention", OTK_CONVENTION, convention),
                            ("pe", OTK_PE, pe), ("isqrt_grad", OTK_ISQRT, isqrt_grad)):
        if v is not None:
            setattr(p, field, choice(table, v, field))
    if pe_double is not None:
        p.pe_double = int(bool(pe_double))
    if grid is not None:
        p.grid_h, p.grid_w = (_lib.check_int(g, C.c_int, nm) for g, nm in ((grid[0], "grid[0]"), (grid[1], "grid[1]")))
    return p


def otk_forward(op, p, z, want_tape=True, want_plan=False, want_diag=False):
    d = op.desc
    out, tout = op.new((d.B, d.p, d.q * d.k))
    tape = tape_buffer(lib.bk_otk_tape_size(C.byref(d), C.byref(p))) if want_tape else None
    plan = np.zeros((d.B, d.q, d.n, d.p), np.float32) if want_plan else None
    diag = (_lib.OtkDiag * (d.B * d.q))() if want_diag else None
    ex = _lib.OtkExtras(f32_np(plan), diag)
    check(lib.bk_otk_forward(C.byref(d), C.byref(p), C.byref(op.tx), f32_np(z), C.byref(tout), tape_ptr(tape),
                             C.byref(ex), None, 0))
    res = {"out": out, "tape": tape}
    if want_plan:
        res["plan"] = plan
    if want_diag:
        res["diag"] = diag_dict(diag, d.B, d.q, ("row_err", "col_err"))
    return res


def otk_backward(op, p, z, dout, tape, want_dx=True, want_dz=True, want_dW=False):
    d = op.desc
    do = op.ad.prepare(dout, "dout")
    if tuple(do.shape) != (d.B, d.p, d.q * d.k):
        raise ValueError("dout: [B=%d, p=%d, q*k=%d] expected, got %s" % (d.B, d.p, d.q * d.k, tuple(do.shape)))
    addr, shape, strides = op.ad.info(do)
    if needs_copy(op.ad, do, shape, strides):
        do = op.ad.dense(do)
        addr, _, strides = op.ad.info(do)
    tdo = _lib.Tensor(addr, strides[0], 0, strides[1])
    dx, tdx = op.new((d.B, d.n, d.d)) if want_dx else (None, None)
    dz = np.zeros((d.q, d.p, d.k), np.float32) if want_dz else None
    dW = np.zeros((d.k, d.d), np.float32) if want_dW else None
    check(lib.bk_otk_backward(C.byref(d), C.byref(p), C.byref(op.tx), f32_np(z), C.byref(tdo), tape_ptr(tape),
                              C.byref(tdx) if tdx is not None else None, f32_np(dz), f32_np(dW), None, 0))
    return dx, dz, dW
