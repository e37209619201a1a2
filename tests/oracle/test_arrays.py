"""The arrays datasets (npy:DIR, npy:X.npy,Y.npy, npz:FILE; src/data/arrays.c,
src/core/npz.c) against numpy, which writes the files: np.save for a
directory of .npy files, np.savez (stored members, numpy's zip64 local
headers) and np.savez_compressed (deflated members). For each input kind
and dtype (uint8 and float32 images as [N, H, W], [N, H, W, C] and
[N, C, H, W]; int32 and int64 token ids with and without lengths; float32
point sets with lengths and NaN padding; int32, int64 and uint8 labels)
every row birkhoff fills (bk_data_fill through ctypes, the whole file kept:
test_frac 0) must equal what numpy computes from the arrays it saved:
images as float32 CHW (uint8 * float32(1/255)), ids and points zero after
each row's length, lengths and labels as saved; the shapes, classes
(max + 1) and vocabularies (max id + 1) too. Then files numpy writes that
must be refused, each message naming the file: float64 x, a negative label,
NaN in x, mismatched N, positional np.savez members.

No torch is needed, only numpy. The last line is "N passed, M failed".
Run: /usr/bin/python3 tests/oracle/test_arrays.py --lib build/libbirkhoff.so"""
import argparse
import ctypes as C
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from checklib import Checks  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libbirkhoff.so"))
args = ap.parse_args()
os.environ["BIRKHOFF_LIB"] = os.path.abspath(args.lib)
sys.path.insert(0, os.path.join(ROOT, "python"))
import numpy as np  # noqa: E402
from birkhoff import data as bd  # noqa: E402

check = Checks()
KINDS = ("image", "tokens", "points")
_i64p, _i32p, _f32p = C.POINTER(C.c_int64), C.POINTER(C.c_int32), C.POINTER(C.c_float)


def open_spec(spec, array_kind=0):
    """(status, message, info, handle) of bk_data_open(spec, TRAIN) keeping every row"""
    cfg = bd.lib.bk_data_config_default()
    cfg.test_frac = 0
    cfg.valid_frac = 0
    cfg.array_kind = array_kind
    h = C.c_void_p()
    st = bd.lib.bk_data_open(spec.encode(), 0, C.byref(cfg), C.byref(h))
    if st:
        return st, bd.lib.bk_last_error().decode(), None, None
    return 0, "", bd.lib.bk_data_info(h).contents, h


def fill_all(info, h):
    """every row: (x or tokens, lengths, labels) in the model's layout"""
    n = info.n
    idx = np.arange(n, dtype=np.int64)
    y = np.empty(n, np.int32)
    x = tok = ln = None
    kind = KINDS[info.kind]
    if kind == "image":
        x = np.empty((n, info.channels, info.height, info.width), np.float32)
    elif kind == "points":
        x = np.empty((n, info.points, info.point_dim), np.float32)
        ln = np.empty(n, np.int32)
    else:
        tok = np.empty((n, info.max_len), np.int32)
        ln = np.empty(n, np.int32)

    def ptr(a, t):
        return None if a is None else a.ctypes.data_as(t)
    bd.check(bd.lib.bk_data_fill(h, idx.ctypes.data_as(_i64p), n, ptr(x, _f32p), ptr(tok, _i32p), ptr(ln, _i32p),
                                 ptr(y, _i32p)))
    return x if x is not None else tok, ln, y


def save_all(tmp, name, arrays):
    """the arrays as a directory of .npy files, a stored and a deflated .npz:
    [(spec, how)]"""
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    for k, a in arrays.items():
        np.save(os.path.join(d, k + ".npy"), a)
    np.savez(os.path.join(tmp, name + ".npz"), **arrays)
    np.savez_compressed(os.path.join(tmp, name + "-z.npz"), **arrays)
    files = ",".join(os.path.join(d, k + ".npy") for k in ("x", "y", "lengths") if k in arrays)
    return [("npy:" + d, "np.save dir"), ("npy:" + files, "np.save files"),
            ("npz:" + os.path.join(tmp, name + ".npz"), "np.savez"),
            ("npz:" + os.path.join(tmp, name + "-z.npz"), "np.savez_compressed")]


def expected(x, y, lengths, kind, layout):
    """what birkhoff must fill, computed by numpy"""
    if kind == "image":
        v = x.astype(np.float32) * np.float32(1.0 / 255.0) if x.dtype == np.uint8 else x.astype(np.float32)
        if v.ndim == 3:
            v = v[:, None]
        elif layout == "hwc":
            v = v.transpose(0, 3, 1, 2)
        return np.ascontiguousarray(v), None, y.astype(np.int32)
    L = x.shape[1]
    ln = np.full(x.shape[0], L, np.int32) if lengths is None else lengths.astype(np.int32)
    keep = np.arange(L)[None, :] < ln[:, None]
    if kind == "tokens":
        return np.where(keep, x, 0).astype(np.int32), ln, y.astype(np.int32)
    return np.where(keep[:, :, None], x, np.float32(0)).astype(np.float32), ln, y.astype(np.int32)


def case(tmp, name, x, y, lengths=None, kind="image", layout="", array_kind=0):
    arrays = {"x": x, "y": y}
    if lengths is not None:
        arrays["lengths"] = lengths
    want_x, want_len, want_y = expected(x, y, lengths, kind, layout)
    for spec, how in save_all(tmp, name, arrays):
        label = "%s (%s)" % (name, how)
        st, msg, info, h = open_spec(spec, array_kind)
        if not check(st == 0, label + ": opens", msg):
            continue
        try:
            got_x, got_len, got_y = fill_all(info, h)
            check(KINDS[info.kind] == kind and info.n == x.shape[0] and info.rows == x.shape[0],
                  label + ": kind and rows", "%s %d" % (KINDS[info.kind], info.n))
            check(info.classes == max(2, int(y.max()) + 1), label + ": classes = max label + 1", info.classes)
            if kind == "tokens":
                check(info.vocab == max(2, int(want_x.max()) + 1) and info.max_len == x.shape[1],
                      label + ": vocab = max id + 1 (within the lengths), max_len", info.vocab)
            check(got_x.shape == want_x.shape and np.array_equal(got_x, want_x), label + ": inputs equal numpy's",
                  "%s vs %s" % (got_x.shape, want_x.shape))
            check(np.array_equal(got_y, want_y), label + ": labels")
            if want_len is not None:
                check(np.array_equal(got_len, want_len), label + ": lengths")
            check(info.version.decode().startswith(spec.split(":")[0] + ":x "), label + ": the version names the format",
                  info.version)
        finally:
            bd.lib.bk_data_close(h)


def refused(tmp, name, arrays, want, savez_positional=False):
    d = os.path.join(tmp, name)
    if savez_positional:
        path = d + ".npz"
        np.savez(path, *arrays.values())
        spec = "npz:" + path
    else:
        os.makedirs(d, exist_ok=True)
        for k, a in arrays.items():
            np.save(os.path.join(d, k + ".npy"), a)
        spec, path = "npy:" + d, d
    st, msg, _, h = open_spec(spec)
    if h:
        bd.lib.bk_data_close(h)
    check(st != 0 and want in msg and path in msg, "refuses %s (names the file)" % name, msg or "opened")


def main():
    rng = np.random.default_rng(43)
    with tempfile.TemporaryDirectory(prefix="bk-oracle-arrays-") as tmp:
        n = 37
        y = rng.integers(0, 5, n)
        case(tmp, "u8-nhw", rng.integers(0, 256, (n, 6, 5), dtype=np.uint8), y.astype(np.int64))
        case(tmp, "u8-nhwc", rng.integers(0, 256, (n, 4, 6, 3), dtype=np.uint8), y.astype(np.int32), layout="hwc")
        case(tmp, "f32-nhwc", rng.standard_normal((n, 5, 3, 4)).astype(np.float32), y.astype(np.uint8), layout="hwc")
        case(tmp, "f32-nchw", rng.standard_normal((n, 2, 3, 7)).astype(np.float32), y.astype(np.int64))
        big = rng.integers(0, 256, (300, 16, 16, 3), dtype=np.uint8)  # a member of several deflate blocks
        case(tmp, "u8-big", big, rng.integers(0, 10, 300), layout="hwc")
        ids = rng.integers(0, 50, (n, 9)).astype(np.int32)
        case(tmp, "tokens-i32", ids, y, kind="tokens")
        ln = rng.integers(1, 10, n)
        ids64 = np.where(np.arange(9)[None, :] < ln[:, None], rng.integers(0, 70, (n, 9)), -5).astype(np.int64)
        case(tmp, "tokens-i64-lengths", ids64, y, lengths=ln.astype(np.int64), kind="tokens")
        pl = rng.integers(1, 8, n).astype(np.int32)
        pts = rng.standard_normal((n, 7, 3)).astype(np.float32)
        pts[np.arange(7)[None, :] >= pl[:, None]] = np.nan
        case(tmp, "points-lengths", pts, y, lengths=pl, kind="points")
        case(tmp, "points-kind", rng.standard_normal((n, 5, 2)).astype(np.float32), y, kind="points", array_kind=3)

        x = rng.integers(0, 256, (8, 4, 4), dtype=np.uint8)
        yy = np.arange(8) % 3
        refused(tmp, "float64 x", {"x": x.astype(np.float64), "y": yy}, "dtype '<f8' not supported")
        bad = yy.copy()
        bad[5] = -2
        refused(tmp, "a negative label", {"x": x, "y": bad}, "label -2 of sample 5")
        xf = x.astype(np.float32)
        xf[6, 2, 1] = np.nan
        refused(tmp, "NaN in x", {"x": xf, "y": yy}, "sample 6 holds NaN at element 9")
        refused(tmp, "mismatched N", {"x": x, "y": yy[:7]}, "has 7 labels but")
        refused(tmp, "positional savez members", {"x": x, "y": yy}, "no member 'x.npy' (members: arr_0.npy, arr_1.npy)",
                savez_positional=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
