"""Loading libbirkhoff and its ctypes mirror (internal).

The shared library is found, in this order:
  1. the environment variable BIRKHOFF_LIB (a path to libbirkhoff.so);
  2. the copy bundled in the package by `pip install` (birkhoff/_native/libbirkhoff.so);
  3. the source tree this package sits in (python/birkhoff -> build/libbirkhoff.so);
  4. the library directory recorded by `make install` (_install.py);
  5. the dynamic loader's search path (libbirkhoff.so.0, then libbirkhoff.so).
Every struct mirrored here is checked against the library's own sizeof
(bk_abi_sizeof) when the library is loaded, so a header change that the
mirror misses fails at import, not with corrupted memory.
"""
import ctypes as C
import operator
import os


i32p = C.POINTER(C.c_int32)
f32p = C.POINTER(C.c_float)
f64p = C.POINTER(C.c_double)


class BirkhoffError(RuntimeError):
    """A failing libbirkhoff call: `status` is the C status name (e.g.
    "parameter out of range"), `code` its number, the message is the C
    library's own (bk_last_error)."""

    def __init__(self, code, status, message):
        super().__init__(message)
        self.code = code
        self.status = status


# bk_dtype (birkhoff/core.h): the element type of a bk_tensor; strides count
# elements of it. BK_F32 is the zero value (a zeroed tensor is float32).
BK_F32, BK_I32, BK_BF16, BK_F16 = 0, 1, 2, 3
# bk_backend (birkhoff/context.h)
BK_BACKEND_CPU, BK_BACKEND_CUDA = 0, 1
BK_ERR_UNSUPPORTED = 13


# ---- integers: ctypes wraps silently (2**32 + 5 into a C int is 5) --------
_INT_CTYPES = (C.c_int, C.c_uint, C.c_int64, C.c_uint64, C.c_size_t, C.c_int32, C.c_uint32)


def int_range(ctype):
    """(lo, hi) of a ctypes integer type"""
    bits = 8 * C.sizeof(ctype)
    if ctype(-1).value < 0:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def check_int(v, ctype, name, lo=None, hi=None):
    """v as a Python int in [lo, hi] (default: the range of the C type
    ctype), else ValueError naming `name` and the range; a value that is not
    an integer (3.5, "3") is TypeError. ctypes would wrap silently."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError("%s: an integer expected, got %r" % (name, v)) from None
    clo, chi = int_range(ctype)
    lo = clo if lo is None else max(lo, clo)
    hi = chi if hi is None else min(hi, chi)
    if not lo <= i <= hi:
        raise ValueError("%s must be an integer in [%d, %d], got %d" % (name, lo, hi, i))
    return i


def set_field(s, field, v, name=None):
    """s.field = v on a ctypes Structure, an integer field's value checked
    against its C type (check_int); other fields as ctypes converts them"""
    for f in s._fields_:
        if f[0] == field:
            if f[1] in _INT_CTYPES:
                v = check_int(v, f[1], name or field)
            break
    setattr(s, field, v)


def _checked(ctype):
    """ctype for argtypes whose from_param refuses an integer outside the C
    type's range (ctypes.ArgumentError naming the range) instead of wrapping
    it: a safety net under the Python API's own named checks"""
    lo, hi = int_range(ctype)

    class Checked(ctype):
        @classmethod
        def from_param(cls, v):
            try:
                i = operator.index(v)
            except TypeError:
                return ctype.from_param(v)
            if not lo <= i <= hi:
                raise ValueError("an integer in [%d, %d] expected (C %s), got %d" % (lo, hi, ctype.__name__, i))
            return ctype.from_param(i)
    Checked.__name__ = "checked_" + ctype.__name__
    return Checked


_CHECKED = {t: _checked(t) for t in _INT_CTYPES}


def checked_argtypes(args):
    """argtypes with every integer type range-checked (_checked)"""
    return [_CHECKED.get(a, a) for a in args]


def bk_device_cuda(i):
    """BK_DEVICE_CUDA(i): the device field of a tensor in CUDA device i's memory"""
    return 1 + i


class Tensor(C.Structure):
    # device: BK_DEVICE_HOST (0) or BK_DEVICE_CUDA(i); dtype: BK_F32 (0), BK_BF16, BK_F16 (CUDA only). The
    # dtype field sits in what was the struct's tail padding: 40 bytes with or without it.
    # data: an address (an integer, or None for NULL), set without a ctypes cast per call
    _fields_ = [("data", C.c_void_p), ("stride_b", C.c_int64), ("stride_h", C.c_int64), ("stride_n", C.c_int64),
                ("device", C.c_int32), ("dtype", C.c_int32)]


class Allocator(C.Structure):
    _fields_ = [("alloc", C.c_void_p), ("free", C.c_void_p), ("user", C.c_void_p)]   # NULL: the library's own


class ContextConfig(C.Structure):
    _fields_ = [("backend", C.c_int), ("device", C.c_int), ("threads", C.c_int), ("allocator", Allocator),
                ("stream", C.c_void_p), ("cache_workspace", C.c_int),
                ("tape_output", C.c_int)]


class AttnDesc(C.Structure):
    _fields_ = [("B", C.c_int), ("H", C.c_int), ("Nq", C.c_int), ("Nk", C.c_int), ("d", C.c_int),
                ("dv", C.c_int), ("q_len", i32p), ("k_len", i32p)]


class SinkhornParams(C.Structure):
    _fields_ = [("scale", C.c_float), ("eps", C.c_float), ("iters", C.c_int), ("tol", C.c_float),
                ("grad", C.c_int)]


class UnbalancedParams(C.Structure):
    _fields_ = [("scale", C.c_float), ("eps", C.c_float), ("iters", C.c_int), ("tol", C.c_float),
                ("rho", C.c_float)]


class SinkhornDiag(C.Structure):
    _fields_ = [("iters", C.c_int32), ("row_err", C.c_float), ("col_err", C.c_float)]


class SinkhornExtras(C.Structure):
    _fields_ = [("attn", Tensor), ("f", f32p), ("g", f32p), ("diag", C.POINTER(SinkhornDiag))]


class SoftmaxParams(C.Structure):
    _fields_ = [("scale", C.c_float), ("causal", C.c_int)]


class EspParams(C.Structure):
    _fields_ = [("sort", C.c_int), ("t", C.c_float), ("tau", C.c_float), ("scale", C.c_float),
                ("cost", C.c_int), ("out_scale", C.c_int), ("L", C.c_int), ("theta", f32p),
                ("seed", C.c_uint64)]


class EspDiag(C.Structure):
    _fields_ = [("row_err", C.c_float), ("col_err", C.c_float)]


class EspExtras(C.Structure):
    _fields_ = [("attn", Tensor), ("sigma", f32p), ("D", f32p), ("diag", C.POINTER(EspDiag))]


class LotParams(C.Structure):
    _fields_ = [("r", C.c_int), ("Z", f32p), ("theta", f32p), ("temp", C.c_float), ("iters", C.c_int),
                ("eps", C.c_float), ("scale", C.c_float), ("tol", C.c_float)]


class LotDiag(C.Structure):
    _fields_ = [("iters1", C.c_int32), ("iters2", C.c_int32), ("row_err", C.c_float), ("col_err", C.c_float)]


class LotExtras(C.Structure):
    _fields_ = [("attn", Tensor), ("diag", C.POINTER(LotDiag))]


class DiffParams(C.Structure):
    # bk_diff_config: scale, then the per-head lambda array ("lambda" in C)
    _fields_ = [("scale", C.c_float), ("lam", f32p)]


class DiffExtras(C.Structure):
    _fields_ = [("attn", Tensor)]


class OtkDesc(C.Structure):
    _fields_ = [("B", C.c_int), ("n", C.c_int), ("d", C.c_int), ("q", C.c_int), ("p", C.c_int),
                ("k", C.c_int), ("len", i32p)]


class OtkParams(C.Structure):
    _fields_ = [("W", f32p), ("sigma", C.c_float), ("eta", C.c_float), ("eps", C.c_float),
                ("iters", C.c_int), ("domain", C.c_int), ("convention", C.c_int), ("pe", C.c_int),
                ("sigma_pos", C.c_float), ("pe_double", C.c_int), ("grid_h", C.c_int), ("grid_w", C.c_int),
                ("isqrt_grad", C.c_int)]


class OtkDiag(C.Structure):
    _fields_ = [("row_err", C.c_float), ("col_err", C.c_float)]


class OtkExtras(C.Structure):
    _fields_ = [("plan", f32p), ("diag", C.POINTER(OtkDiag))]


class KmeansParams(C.Structure):
    _fields_ = [("iters", C.c_int), ("tol", C.c_float), ("seed", C.c_uint64), ("max_samples", C.c_int64),
                ("init", C.c_int)]


class KmeansReport(C.Structure):
    _fields_ = [("iters", C.c_int), ("converged", C.c_int), ("objective", C.c_double)]


class AsapLayer(C.Structure):
    _fields_ = [("d", C.c_int), ("slices", C.c_int), ("scale", C.c_float), ("eps", C.c_float),
                ("teacher_iters", C.c_int), ("theta", f32p), ("omega", f64p), ("fit", C.c_int),
                ("lambda_", C.c_double), ("seed", C.c_uint64), ("theta_given", C.c_int),
                ("calib_problems", C.c_int64), ("calib_rows", C.c_int64)]


class AsapConfig(C.Structure):
    _fields_ = [("d", C.c_int), ("slices", C.c_int), ("theta", f32p), ("seed", C.c_uint64),
                ("scale", C.c_float), ("eps", C.c_float), ("teacher_iters", C.c_int), ("lambda_", C.c_double)]


class AsapKlOpts(C.Structure):
    _fields_ = [("max_iters", C.c_int), ("tol", C.c_double)]


class AsapFitReport(C.Structure):
    _fields_ = [("problems", C.c_int64), ("rows", C.c_int64), ("ls_rmse", C.c_double), ("ls_r2", C.c_double),
                ("kl_j0", C.c_double), ("kl_j", C.c_double), ("kl_grad", C.c_double), ("kl_iters", C.c_int),
                ("kl_converged", C.c_int)]


class AsapExtras(C.Structure):
    _fields_ = [("attn", Tensor), ("fhat", f32p), ("diag", C.POINTER(SinkhornDiag))]


class AttnFidelity(C.Structure):
    _fields_ = [("out_rmse", C.c_double), ("out_rms", C.c_double), ("attn_rel_l2", C.c_double),
                ("row_err", C.c_double), ("col_err", C.c_double), ("problems", C.c_int)]


class OpParam(C.Structure):
    """bk_op_param (birkhoff/ops.h): a parameter of a registered operator"""
    _fields_ = [("key", C.c_char_p), ("type", C.c_char_p), ("doc", C.c_char_p), ("alias", C.c_char_p),
                ("values", C.POINTER(C.c_char_p)), ("default", C.c_char * 64), ("range", C.c_char * 96)]


class OpArray(C.Structure):
    """bk_op_array: an array of an operator beyond q, k, v, out"""
    _fields_ = [("name", C.c_char_p), ("alias", C.c_char_p), ("doc", C.c_char_p), ("shape", C.c_char_p),
                ("dim_key", C.c_char_p), ("cols", C.c_char_p), ("kind", C.c_uint), ("dim_at", C.c_int)]


class OpLearned(C.Structure):
    _fields_ = [("name", C.c_char_p), ("doc", C.c_char_p), ("rank", C.c_int), ("dims", C.c_int64 * 4)]


class OpPreset(C.Structure):
    _fields_ = [("name", C.c_char_p), ("params", C.c_char_p), ("doc", C.c_char_p)]


class OpBenchCase(C.Structure):
    _fields_ = [("name", C.c_char_p), ("B", C.c_int), ("H", C.c_int), ("Nq", C.c_int), ("Nk", C.c_int),
                ("d", C.c_int), ("dv", C.c_int), ("params", C.c_char_p), ("backward", C.c_int)]


# bk_op_array.kind (BK_OP_ARRAY_*)
OP_ARRAY_IN, OP_ARRAY_FWD, OP_ARRAY_BWD, OP_ARRAY_REQUIRED, OP_ARRAY_FILE, OP_ARRAY_SUMMARY, OP_ARRAY_HOST = \
    0x1, 0x2, 0x4, 0x8, 0x10, 0x20, 0x40
# bk_op_caps (BK_OP_CAP_*), in bit order
OP_CAPS = ("cross", "pad", "causal", "attn", "model")


_ABI = {
    "bk_tensor": Tensor, "bk_attn_desc": AttnDesc, "bk_sinkhorn_config": SinkhornParams,
    "bk_sinkhorn_diag": SinkhornDiag, "bk_sinkhorn_extras": SinkhornExtras, "bk_softmax_config": SoftmaxParams,
    "bk_unbalanced_config": UnbalancedParams,
    "bk_esp_config": EspParams, "bk_esp_diag": EspDiag, "bk_esp_extras": EspExtras, "bk_lot_config": LotParams,
    "bk_lot_diag": LotDiag, "bk_lot_extras": LotExtras, "bk_diff_config": DiffParams, "bk_diff_extras": DiffExtras, "bk_otk_desc": OtkDesc, "bk_otk_config": OtkParams,
    "bk_otk_diag": OtkDiag, "bk_otk_extras": OtkExtras, "bk_kmeans_config": KmeansParams,
    "bk_kmeans_report": KmeansReport, "bk_asap_layer": AsapLayer, "bk_asap_config": AsapConfig,
    "bk_asap_kl_config": AsapKlOpts, "bk_asap_fit_report": AsapFitReport, "bk_asap_extras": AsapExtras,
    "bk_attn_fidelity": AttnFidelity,
}
# mirrored structs that older libraries do not list in bk_abi_sizeof (0 there: not checked)
_ABI_OPTIONAL = {"bk_context_config": ContextConfig}
_ABI.update({"bk_op_param": OpParam, "bk_op_array": OpArray, "bk_op_learned": OpLearned, "bk_op_preset": OpPreset,
             "bk_op_bench_case": OpBenchCase})

P = C.POINTER
vp = C.c_void_p
sz = C.c_size_t
st = C.c_int
_T = P(Tensor)
_D = P(AttnDesc)
_OD = P(OtkDesc)
# name: (restype, argtypes)
_PROTOS = {
    "bk_version": (C.c_char_p, []),
    "bk_abi_sizeof": (sz, [C.c_char_p]),
    "bk_status_str": (C.c_char_p, [st]),
    "bk_last_error": (C.c_char_p, []),
    "bk_set_num_threads": (st, [C.c_int]),
    "bk_get_num_threads": (C.c_int, []),
    "bk_isa": (C.c_char_p, []),
    "bk_sinkhorn_config_default": (SinkhornParams, []),
    "bk_sinkhorn_tape_size": (sz, [_D, P(SinkhornParams)]),
    "bk_sinkhorn_workspace_size": (sz, [_D, P(SinkhornParams)]),
    "bk_sinkhorn_forward": (st, [_D, P(SinkhornParams), _T, _T, _T, _T, vp, P(SinkhornExtras), vp, sz]),
    "bk_sinkhorn_backward": (st, [_D, P(SinkhornParams), _T, _T, _T, _T, vp, _T, _T, _T, vp, sz]),
    "bk_unbalanced_config_default": (UnbalancedParams, []),
    "bk_unbalanced_tape_size": (sz, [_D, P(UnbalancedParams)]),
    "bk_unbalanced_workspace_size": (sz, [_D, P(UnbalancedParams)]),
    "bk_unbalanced_forward": (st, [_D, P(UnbalancedParams), _T, _T, _T, _T, vp, P(SinkhornExtras), vp, sz]),
    "bk_unbalanced_backward": (st, [_D, P(UnbalancedParams), _T, _T, _T, _T, vp, _T, _T, _T, vp, sz]),
    "bk_softmax_tape_size": (sz, [_D]),
    "bk_softmax_workspace_size": (sz, [_D]),
    "bk_softmax_forward": (st, [_D, P(SoftmaxParams), _T, _T, _T, _T, vp, _T, vp, sz]),
    "bk_softmax_backward": (st, [_D, P(SoftmaxParams), _T, _T, _T, _T, vp, _T, _T, _T, vp, sz]),
    "bk_esp_config_default": (EspParams, []),
    "bk_esp_num_slices": (C.c_int, [P(EspParams), C.c_int]),
    "bk_esp_slices": (st, [P(EspParams), C.c_int, f32p]),
    "bk_esp_tape_size": (sz, [_D, P(EspParams)]),
    "bk_esp_forward": (st, [_D, P(EspParams), _T, _T, _T, _T, vp, P(EspExtras), vp, sz]),
    "bk_esp_backward": (st, [_D, P(EspParams), _T, _T, _T, _T, vp, _T, _T, _T, f32p, vp, sz]),
    "bk_lot_config_default": (LotParams, []),
    "bk_lot_tape_size": (sz, [_D, P(LotParams)]),
    "bk_lot_forward": (st, [_D, P(LotParams), _T, _T, _T, _T, vp, P(LotExtras), vp, sz]),
    "bk_lot_backward": (st, [_D, P(LotParams), _T, _T, _T, _T, vp, _T, _T, _T, f32p, f32p, vp, sz]),
    "bk_diff_config_default": (DiffParams, []),
    "bk_diff_tape_size": (sz, [_D, P(DiffParams)]),
    "bk_diff_forward": (st, [_D, P(DiffParams), _T, _T, _T, _T, vp, P(DiffExtras), vp, sz]),
    "bk_diff_backward": (st, [_D, P(DiffParams), _T, _T, _T, _T, vp, _T, _T, _T, f32p, vp, sz]),
    "bk_otk_config_default": (OtkParams, []),
    "bk_otk_tape_size": (sz, [_OD, P(OtkParams)]),
    "bk_otk_features": (st, [_OD, P(OtkParams), _T, _T]),
    "bk_otk_forward": (st, [_OD, P(OtkParams), _T, f32p, _T, vp, P(OtkExtras), vp, sz]),
    "bk_otk_backward": (st, [_OD, P(OtkParams), _T, f32p, _T, vp, _T, f32p, f32p, vp, sz]),
    "bk_kmeans_config_default": (KmeansParams, []),
    "bk_spherical_kmeans": (st, [f32p, C.c_int64, C.c_int, C.c_int, P(KmeansParams), f32p, P(KmeansReport)]),
    "bk_otk_fit_anchors": (st, [_OD, _T, P(KmeansParams), f32p, P(KmeansReport)]),
    "bk_otk_fit_refs": (st, [_OD, P(OtkParams), _T, P(KmeansParams), C.c_int, f32p, P(KmeansReport)]),
    "bk_asap_config_default": (AsapConfig, [C.c_int]),
    "bk_asap_kl_config_default": (AsapKlOpts, []),
    "bk_asap_calib_create": (st, [P(AsapConfig), C.c_int, P(vp)]),
    "bk_asap_calib_free": (None, [vp]),
    "bk_asap_calib_add": (st, [vp, _D, _T, _T]),
    "bk_asap_calib_fit": (st, [vp, C.c_int, P(AsapKlOpts), P(AsapLayer), P(AsapFitReport)]),
    "bk_asap_layer_free": (None, [P(AsapLayer)]),
    "bk_asap_save": (st, [C.c_char_p, P(AsapLayer)]),
    "bk_asap_load": (st, [C.c_char_p, P(AsapLayer)]),
    "bk_asap_teacher_dual": (st, [_D, P(AsapConfig), _T, _T, f32p]),
    "bk_asap_features": (st, [_D, P(AsapLayer), _T, _T, f32p]),
    "bk_asap_forward": (st, [_D, P(AsapLayer), C.c_int, _T, _T, _T, _T, P(AsapExtras), vp, sz]),
    "bk_asap_close": (st, [_D, P(AsapLayer), C.c_int, f32p, _T, _T, _T, _T, P(AsapExtras), vp, sz]),
    "bk_attn_compare": (st, [_D, _T, _T, _T, _T, P(AttnFidelity)]),
    # the operator registry (birkhoff/ops.h): operators by name, parameters by key
    "bk_op_count": (C.c_int, []),
    "bk_op_at": (vp, [C.c_int]),
    "bk_op_find": (vp, [C.c_char_p]),
    "bk_op_name": (C.c_char_p, [vp]),
    "bk_op_has_backward": (C.c_int, [vp]),
    "bk_op_config_size": (sz, [vp]),
    "bk_op_config_default": (None, [vp, vp]),
    "bk_op_config_set": (st, [vp, vp, C.c_char_p, C.c_char_p]),
    "bk_op_config_count": (C.c_int, [vp]),
    "bk_op_config_key": (C.c_char_p, [vp, C.c_int]),
    "bk_op_tape_size": (sz, [vp, _D, vp]),
    "bk_op_forward": (st, [vp, _D, vp, _T, _T, _T, _T, vp, _T, vp, sz]),
    "bk_op_backward": (st, [vp, _D, vp, _T, _T, _T, _T, vp, _T, _T, _T, vp, sz]),
    # the operators' schema (birkhoff/ops.h): the keywords, docstrings and extra arrays come from it
    "bk_op_doc": (C.c_char_p, [vp]),
    "bk_op_caps": (C.c_uint, [vp]),
    "bk_op_param_info": (st, [vp, C.c_int, P(OpParam)]),
    "bk_op_param_find": (C.c_int, [vp, C.c_char_p]),
    "bk_op_config_parse": (st, [vp, vp, C.c_char_p]),
    "bk_op_config_check": (st, [vp, vp]),
    "bk_op_array_count": (C.c_int, [vp]),
    "bk_op_array_info": (st, [vp, C.c_int, P(OpArray)]),
    "bk_op_array_find": (C.c_int, [vp, C.c_char_p]),
    "bk_op_array_shape": (C.c_int, [vp, C.c_int, _D, vp, P(C.c_int64)]),
    "bk_op_config_set_array": (st, [vp, vp, _D, C.c_int, f32p, C.c_int, P(C.c_int64)]),
    "bk_op_config_load": (st, [vp, vp, C.c_int, C.c_char_p, P(vp)]),
    "bk_op_config_unload": (None, [vp, C.c_int, vp]),
    "bk_op_workspace_size": (sz, [vp, _D, vp]),
    "bk_op_forward_arrays": (st, [vp, _D, vp, _T, _T, _T, _T, vp, _T, P(f32p), vp, sz]),
    "bk_op_backward_arrays": (st, [vp, _D, vp, _T, _T, _T, _T, vp, _T, _T, _T, P(f32p), vp, sz]),
    "bk_op_learned_count": (C.c_int, [vp]),
    "bk_op_learned_info": (st, [vp, C.c_int, vp, C.c_int, C.c_int, P(OpLearned)]),
    "bk_op_preset_count": (C.c_int, [vp]),
    "bk_op_preset_info": (st, [vp, C.c_int, P(OpPreset)]),
    "bk_op_find_preset": (vp, [C.c_char_p, P(C.c_char_p)]),
    "bk_op_bench_count": (C.c_int, [vp]),
    "bk_op_bench_info": (st, [vp, C.c_int, P(OpBenchCase)]),
    # execution contexts (birkhoff/context.h): the CUDA backend's calls run in a context made current
    "bk_context_config_default": (ContextConfig, []),
    "bk_context_create": (st, [P(ContextConfig), P(vp)]),
    "bk_context_free": (None, [vp]),
    "bk_context_use": (vp, [vp]),
    "bk_context_supports": (C.c_int, [vp, C.c_char_p]),
}


def _candidates():
    env = os.environ.get("BIRKHOFF_LIB")
    if env:
        return [env], True
    from ._layout import candidates
    return candidates("lib") + ["libbirkhoff.so.0", "libbirkhoff.so"], False


def _load():
    cands, explicit = _candidates()
    errors = []
    for c in cands:
        if os.sep in c and not os.path.exists(c):
            errors.append("%s: not found" % c)
            continue
        try:
            lib = C.CDLL(c)
            break
        except OSError as e:
            errors.append("%s: %s" % (c, e))
    else:
        hint = ("BIRKHOFF_LIB=%s cannot be loaded" % cands[0]) if explicit else \
            "build it (make) in the source tree, install it (make install or pip install .), " \
            "or set BIRKHOFF_LIB to its path"
        raise ImportError("birkhoff: libbirkhoff not found (%s); tried: %s" % (hint, "; ".join(errors)))
    for name, (res, args) in _PROTOS.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise ImportError("birkhoff: %s lacks %s (a library older than this package?)" % (lib._name, name))
        f.restype = res
        f.argtypes = checked_argtypes(args)
    for name, cls in _ABI.items():
        want = lib.bk_abi_sizeof(name.encode())
        if want != C.sizeof(cls):
            raise ImportError("birkhoff: struct %s is %d bytes in %s, %d in this package's mirror "
                              "(library and package versions differ)" % (name, want, lib._name, C.sizeof(cls)))
    for name, cls in _ABI_OPTIONAL.items():
        want = lib.bk_abi_sizeof(name.encode())
        if want and want != C.sizeof(cls):
            raise ImportError("birkhoff: struct %s is %d bytes in %s, %d in this package's mirror "
                              "(library and package versions differ)" % (name, want, lib._name, C.sizeof(cls)))
    return lib


lib = _load()
LIBRARY_PATH = lib._name


def check(status):
    """Raises BirkhoffError with the C message for a non-zero status."""
    if status:
        raise BirkhoffError(status, lib.bk_status_str(status).decode(), lib.bk_last_error().decode())
