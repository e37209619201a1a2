"""birkhoff.data: the library's datasets as numpy arrays.

A thin numpy layer over the C dataset API (include/birkhoff/data.h): the
same verified readers `birkhoff train` uses (MNIST and Fashion-MNIST IDX,
plain or gzipped, the UCI digits, SpamAssassin bodies; each file checked
against the checksum of the known version) and the generated sets (ListOps,
3-D shapes), with the same splits and sample values. Nothing is parsed in
Python.

    from birkhoff.data import Dataset
    with Dataset("mnist", "test", data_dir="data") as ds:
        print(len(ds), ds.classes, ds.input_shape, ds.version)
        b = ds.batch(range(64))       # b.x [64, 1, 28, 28] float32 in [0, 1], b.labels [64] int32
        everything = ds.load()        # the whole split

Your own data opens the same way, by a FORMAT:PATH spec (docs/DATA.md):
npy:DIR (x.npy, y.npy, optional lengths.npy), npz:FILE, tsv:FILE / csv:FILE
(labelled text), parallel:SRC,TGT (sentence pairs), ids:SRC,TGT; the
validation and test splits are the files data_valid= / data_test= name, or
are carved from the training file (valid_frac, test_frac, split_seed):

    tr = Dataset("npy:my_images", "train", valid_frac=0.1)
    loader = torch.utils.data.DataLoader(tr.torch(), batch_size=64, shuffle=True)

Fetch the stored datasets with scripts/data.sh NAME. A missing, truncated or
different file raises birkhoff.BirkhoffError with the C library's message
(it names the file and the command that fixes it).

Parallel text for translation (bk_parallel_*; docs/TRANSLATION.md): sentence
pairs as str, validated by the C reader (UTF-8, line-aligned, no empty line):

    from birkhoff.data import Parallel
    with Parallel("bible", "test") as p:       # scripts/data.sh bible
        print(len(p), p.version, p[0])         # (spanish, english)
    p = Parallel.from_files("a.es", "a.en")    # any two line-aligned files
"""
import ctypes as C
from collections import namedtuple

import numpy as np

from ._lib import BirkhoffError, check, checked_argtypes as _checked_argtypes, lib, set_field as _lib_set_field

__all__ = ["Dataset", "Batch", "known", "NAMES", "Parallel", "TorchDataset", "BirkhoffError"]

NAMES = ("mnist", "fashion-mnist", "digits", "spam", "listops", "shapes", "bible")
SPLITS = {"train": 0, "test": 1, "valid": 2}  # bk_split; "valid": bible only
KINDS = ("image", "tokens", "points")  # bk_input_kind


class DataConfig(C.Structure):
    """mirror of bk_data_config"""
    _fields_ = [("dir", C.c_char_p), ("limit", C.c_int64), ("max_len", C.c_int), ("min_len", C.c_int),
                ("listops_depth", C.c_int), ("points", C.c_int), ("noise", C.c_float), ("gen_train", C.c_int64),
                ("gen_test", C.c_int64), ("gen_seed", C.c_uint64), ("tgt_max_len", C.c_int),
                ("valid_spec", C.c_char_p), ("test_spec", C.c_char_p), ("valid_frac", C.c_float),
                ("test_frac", C.c_float), ("split_seed", C.c_uint64), ("array_kind", C.c_int),
                ("label_column", C.c_int), ("text_column", C.c_int), ("text_header", C.c_int),
                ("spm_model", C.c_char_p), ("spm_vocab", C.c_int)]


class DatasetInfo(C.Structure):
    """mirror of bk_dataset_info"""
    _fields_ = [("name", C.c_char * 16), ("split", C.c_int), ("kind", C.c_int), ("n", C.c_int64),
                ("classes", C.c_int), ("channels", C.c_int), ("height", C.c_int), ("width", C.c_int),
                ("vocab", C.c_int), ("max_len", C.c_int), ("points", C.c_int), ("point_dim", C.c_int),
                ("version", C.c_char * 192), ("seq2seq", C.c_int), ("tgt_max_len", C.c_int),
                ("tokens_src", C.c_int64), ("tokens_tgt", C.c_int64), ("dropped", C.c_int64),
                ("note", C.c_char * 256), ("rows", C.c_int64)]


class ParallelConfig(C.Structure):
    """mirror of bk_parallel_config"""
    _fields_ = [("max_bytes", C.c_int), ("limit", C.c_int64)]


class ParallelInfo(C.Structure):
    """mirror of bk_parallel_info"""
    _fields_ = [("n", C.c_int64), ("lines", C.c_int64), ("src_bytes", C.c_int64), ("tgt_bytes", C.c_int64),
                ("src_max", C.c_int32), ("tgt_max", C.c_int32), ("src_fnv", C.c_uint64), ("tgt_fnv", C.c_uint64),
                ("version", C.c_char * 192)]


class SentencePair(C.Structure):
    """mirror of bk_sentence_pair"""
    _fields_ = [("src", C.c_void_p), ("tgt", C.c_void_p), ("src_len", C.c_int32), ("tgt_len", C.c_int32)]


_i64p = C.POINTER(C.c_int64)
_i32p = C.POINTER(C.c_int32)
_f32p = C.POINTER(C.c_float)
for _name, _res, _args in (
        ("bk_data_config_default", DataConfig, []),
        ("bk_data_known", C.c_int, [C.c_char_p]),
        ("bk_data_open", C.c_int, [C.c_char_p, C.c_int, C.POINTER(DataConfig), C.POINTER(C.c_void_p)]),
        ("bk_data_close", None, [C.c_void_p]),
        ("bk_data_info", C.POINTER(DatasetInfo), [C.c_void_p]),
        ("bk_data_fill", C.c_int, [C.c_void_p, _i64p, C.c_int, _f32p, _i32p, _i32p, _i32p]),
        ("bk_data_fill_pair", C.c_int, [C.c_void_p, _i64p, C.c_int, _i32p, _i32p, _i32p, _i32p]),
        ("bk_data_is_spec", C.c_int, [C.c_char_p]),
        ("bk_data_class_name", C.c_char_p, [C.c_void_p, C.c_int]),
        ("bk_data_spm_model", C.c_int, [C.c_void_p, C.POINTER(C.c_void_p), C.POINTER(C.c_size_t)]),
        ("bk_parallel_config_default", ParallelConfig, []),
        ("bk_parallel_parse", C.c_int, [C.c_char_p, C.c_size_t, C.c_char_p, C.c_size_t, C.c_char_p, C.c_char_p,
                                        C.POINTER(ParallelConfig), C.POINTER(C.c_void_p)]),
        ("bk_parallel_load", C.c_int, [C.c_char_p, C.c_char_p, C.POINTER(ParallelConfig), C.POINTER(C.c_void_p)]),
        ("bk_parallel_open", C.c_int, [C.c_char_p, C.c_char_p, C.c_char_p, C.POINTER(ParallelConfig),
                                       C.POINTER(C.c_void_p)]),
        ("bk_parallel_free", None, [C.c_void_p]),
        ("bk_parallel_get_info", C.POINTER(ParallelInfo), [C.c_void_p]),
        ("bk_parallel_pair", C.c_int, [C.c_void_p, C.c_int64, C.POINTER(SentencePair)])):
    try:
        _f = getattr(lib, _name)
    except AttributeError:
        raise ImportError("birkhoff.data: %s lacks %s (a library older than this package?)" % (lib._name, _name))
    _f.restype, _f.argtypes = _res, _checked_argtypes(_args)
for _name, _cls in (("bk_data_config", DataConfig), ("bk_dataset_info", DatasetInfo),
                    ("bk_parallel_config", ParallelConfig), ("bk_parallel_info", ParallelInfo),
                    ("bk_sentence_pair", SentencePair)):
    if lib.bk_abi_sizeof(_name.encode()) != C.sizeof(_cls):
        raise ImportError("birkhoff.data: struct %s is %d bytes in %s, %d in this package's mirror (library and "
                          "package versions differ)" % (_name, lib.bk_abi_sizeof(_name.encode()), lib._name,
                                                        C.sizeof(_cls)))

# keyword -> bk_data_config field (the keywords are `birkhoff train`'s run keys)
_OPTIONS = {"limit": "limit", "seq_len": "max_len", "min_len": "min_len", "listops_depth": "listops_depth",
            "points": "points", "noise": "noise", "gen_train": "gen_train", "gen_test": "gen_test",
            "data_seed": "gen_seed", "tgt_len": "tgt_max_len", "valid_frac": "valid_frac",
            "test_frac": "test_frac", "split_seed": "split_seed", "array_kind": "array_kind",
            "label_column": "label_column", "text_column": "text_column", "text_header": "text_header",
            "spm_vocab": "spm_vocab"}
# keyword -> bk_data_config string field (paths)
_STR_OPTIONS = {"data_valid": "valid_spec", "data_test": "test_spec", "spm_model": "spm_model"}
_ARRAY_KINDS = {"auto": 0, "image": 1, "tokens": 2, "points": 3}

Batch = namedtuple("Batch", "x tokens lengths labels")
Batch.__doc__ = """Samples of a split, in the model layout of bk_batch:
  x        float32 [B, channels, height, width] (images, values in [0, 1]) or
           [B, points, 3] (point clouds); None for tokens
  tokens   int32 [B, max_len] (zero after each sample's length); None otherwise
  lengths  int32 [B]: tokens per sample, or points per cloud; None for images
  labels   int32 [B] in [0, classes)"""


def known(name):
    """True if `name` is one of the library's datasets (NAMES) or a
    FORMAT:PATH spec of the user's (syntax only: docs/DATA.md)."""
    return bool(lib.bk_data_known(str(name).encode()))


class _Handle:
    """A C object owned by a Python one: close() (or a with block, or
    collection) releases it through the C function named by _free."""
    _free = None

    def close(self):
        """releases the C object (also done when this one is collected)"""
        if getattr(self, "_h", None):
            getattr(lib, self._free)(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


class Dataset(_Handle):
    """One split of a dataset, opened (and, for stored sets, read and verified)
    by the C library.

    Dataset(name, split="train", data_dir=None, *, limit=0, seq_len=0,
            min_len=0, listops_depth=10, points=256, noise=0.02,
            gen_train=20000, gen_test=2000, data_seed=1)

    data_dir: where scripts/data.sh put the files (None: $BK_DATA, else
    "data"). The keywords are `birkhoff train`'s run keys (docs/TRAINING.md):
    limit keeps the first samples of the split; seq_len is the bytes kept per
    spam message (0: 1024) or the longest ListOps sequence (0: 2000); points
    and noise shape the point clouds; gen_* size and seed the generated sets.

    Attributes: name, split, kind ("image", "tokens" or "points"), classes,
    version (what a run records), input_shape (one sample's input: (C, H, W),
    (max_len,) or (points, 3)); len(ds) is the number of samples."""

    _free = "bk_data_close"

    def __init__(self, name, split="train", data_dir=None, **options):
        if split not in SPLITS:
            raise ValueError("split must be 'train', 'test' or 'valid', got %r" % (split,))
        self._args = (name, split, data_dir, dict(options))  # how a pickled copy reopens it
        cfg = lib.bk_data_config_default()
        self._keep = []  # the bytes cfg's strings point at, alive while it is used
        for k, v in options.items():
            if k in _STR_OPTIONS:
                b = None if v is None else str(v).encode()
                self._keep.append(b)
                setattr(cfg, _STR_OPTIONS[k], b)
                continue
            if k not in _OPTIONS:
                raise TypeError("Dataset(): unknown option %r (%s)" % (k, ", ".join(list(_OPTIONS) + list(_STR_OPTIONS))))
            if k == "array_kind" and isinstance(v, str):
                if v not in _ARRAY_KINDS:
                    raise ValueError("array_kind must be one of %s, got %r" % (", ".join(_ARRAY_KINDS), v))
                v = _ARRAY_KINDS[v]
            _lib_set_field(cfg, _OPTIONS[k], v, k)   # integers range-checked (ctypes wraps)
        self._dir = None if data_dir is None else str(data_dir).encode()  # kept alive while cfg points at it
        cfg.dir = self._dir
        h = C.c_void_p()
        check(lib.bk_data_open(str(name).encode(), SPLITS[split], C.byref(cfg), C.byref(h)))
        self._h = h
        info = lib.bk_data_info(h).contents
        self.name = info.name.decode()
        self.spec = str(name)
        self.split = split
        self.rows = info.rows
        self.dropped = info.dropped
        self.note = info.note.decode()
        self.class_names = None
        if info.classes > 0 and lib.bk_data_class_name(h, 0) is not None:
            self.class_names = [lib.bk_data_class_name(h, k).decode() for k in range(info.classes)]
        self.kind = KINDS[info.kind]
        self.classes = info.classes
        self.version = info.version.decode()
        self._n = info.n
        self.seq2seq = bool(info.seq2seq)
        if self.seq2seq:
            self.tgt_max_len = info.tgt_max_len
        if self.kind == "image":
            self.input_shape = (info.channels, info.height, info.width)
        elif self.kind == "tokens":
            self.input_shape = (info.max_len,)
            self.vocab = info.vocab
        else:
            self.input_shape = (info.points, info.point_dim)

    def __len__(self):
        return self._n

    def __repr__(self):
        return "Dataset(%s, %d samples, %s %s, %d classes)" % (self.version, self._n, self.kind, self.input_shape,
                                                              self.classes)

    def batch(self, indices):
        """The samples at `indices` (any integers in [0, len)) as a Batch."""
        if not getattr(self, "_h", None):
            raise ValueError("the dataset is closed")
        idx = np.ascontiguousarray(np.asarray(indices, dtype=np.int64).reshape(-1))
        B = idx.shape[0]
        if B >= 2 ** 31:
            raise ValueError("at most 2^31 - 1 samples per batch")
        labels = None if self.seq2seq else np.empty(B, np.int32)
        x = tokens = lengths = None
        if self.kind == "tokens":
            tokens = np.empty((B,) + self.input_shape, np.int32)
            lengths = np.empty(B, np.int32)
        else:
            x = np.empty((B,) + self.input_shape, np.float32)
            if self.kind == "points":
                lengths = np.empty(B, np.int32)

        def ptr(a, t):
            return None if a is None else a.ctypes.data_as(t)
        check(lib.bk_data_fill(self._h, idx.ctypes.data_as(_i64p), B, ptr(x, _f32p), ptr(tokens, _i32p),
                               ptr(lengths, _i32p), ptr(labels, _i32p)))
        return Batch(x, tokens, lengths, labels)

    def pairs(self, indices):
        """A seq2seq dataset's pairs at `indices`: (src [B, max_len], src_len [B],
        tgt [B, tgt_max_len], tgt_len [B]), int32, each sentence ending with
        EOS (2) and padded with 3 (bk_data_fill_pair)."""
        if not getattr(self, "_h", None):
            raise ValueError("the dataset is closed")
        if not self.seq2seq:
            raise ValueError("%s is not a sentence-pair dataset" % self.name)
        idx = np.ascontiguousarray(np.asarray(indices, dtype=np.int64).reshape(-1))
        B = idx.shape[0]
        if B >= 2 ** 31:
            raise ValueError("at most 2^31 - 1 samples per batch")
        src = np.empty((B, self.input_shape[0]), np.int32)
        tgt = np.empty((B, self.tgt_max_len), np.int32)
        sl = np.empty(B, np.int32)
        tl = np.empty(B, np.int32)
        check(lib.bk_data_fill_pair(self._h, idx.ctypes.data_as(_i64p), B, src.ctypes.data_as(_i32p),
                                    sl.ctypes.data_as(_i32p), tgt.ctypes.data_as(_i32p), tl.ctypes.data_as(_i32p)))
        return src, sl, tgt, tl

    def load(self):
        """The whole split as one Batch."""
        return self.batch(np.arange(self._n, dtype=np.int64))

    def __getitem__(self, i):
        """Sample i as numpy arrays: (x, label) for images and sets (sets:
        (x, length, label)), (tokens, length, label) for tokens, and
        (src, src_len, tgt, tgt_len) for sentence pairs."""
        i = int(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("sample %d of a split of %d" % (i, self._n))
        if self.seq2seq:
            src, sl, tgt, tl = self.pairs([i])
            return src[0], int(sl[0]), tgt[0], int(tl[0])
        b = self.batch([i])
        if self.kind == "image":
            return b.x[0], int(b.labels[0])
        if self.kind == "points":
            return b.x[0], int(b.lengths[0]), int(b.labels[0])
        return b.tokens[0], int(b.lengths[0]), int(b.labels[0])

    def spm_model(self):
        """The serialized SentencePiece model a text dataset was encoded with
        (bytes, what an spm.model file holds), or None."""
        p, n = C.c_void_p(), C.c_size_t()
        if lib.bk_data_spm_model(self._h, C.byref(p), C.byref(n)) != 0:
            return None
        return C.string_at(p, n.value)

    def __getstate__(self):
        # a DataLoader worker (spawn) reopens the split from its arguments
        return {"_args": self._args}

    def __setstate__(self, state):
        name, split, data_dir, options = state["_args"]
        self.__init__(name, split, data_dir, **options)

    def torch(self):
        """This split as a torch.utils.data.Dataset (TorchDataset)."""
        return TorchDataset(self)


def _make_torch_class():
    import torch

    class _BirkhoffTorchDataset(torch.utils.data.Dataset):
        """a torch Dataset over a birkhoff.data.Dataset (TorchDataset)"""

        def __init__(self, d):
            self.ds = d

        def __len__(self):
            return len(self.ds)

        def __getitem__(self, i):
            return tuple(torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else torch.tensor(v)
                         for v in self.ds[i])

    _BirkhoffTorchDataset.__module__ = __name__
    _BirkhoffTorchDataset.__qualname__ = "_BirkhoffTorchDataset"
    return _BirkhoffTorchDataset


def __getattr__(name):
    # the torch class is made when first asked for (torch is imported only
    # then), under a module-level name so that pickling finds it (spawned
    # DataLoader workers)
    if name == "_BirkhoffTorchDataset":
        cls = _make_torch_class()
        globals()[name] = cls
        return cls
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def TorchDataset(ds):
    """A torch.utils.data.Dataset over a birkhoff Dataset: item i is sample i
    as torch tensors, in the tuple Dataset.__getitem__ gives (torch's default
    collate stacks them into batches). Works with DataLoader workers, forked
    or spawned (a spawned worker reopens the split from its arguments)."""
    cls = globals().get("_BirkhoffTorchDataset") or __getattr__("_BirkhoffTorchDataset")
    return cls(ds)


PARALLEL_SPLITS = ("train", "valid", "test")


class Parallel(_Handle):
    """Sentence pairs of a parallel split, read and validated by the C library
    (bk_parallel_*): valid UTF-8, "\\n" line ends, no empty or blank line, no
    line over max_bytes, both sides the same number of lines; a failure
    raises BirkhoffError naming the file and line.

    Parallel(name="bible", split="train", data_dir=None, *, limit=0, max_bytes=0)
        a stored corpus (data_dir/NAME/SPLIT.{src,tgt}; None: $BK_DATA, else
        "data"), checked against the version this library knows
    Parallel.from_files(src_path, tgt_path, *, limit=0, max_bytes=0)
    Parallel.from_bytes(src, tgt, *, limit=0, max_bytes=0, names=None)
        any two line-aligned texts (bytes or str)

    len(p) pairs; p[i] is (source, target) as str; iterating gives the
    pairs in order. Attributes: version (what a run records), lines,
    src_bytes, tgt_bytes, src_max, tgt_max (bytes), src_fnv, tgt_fnv."""

    _free = "bk_parallel_free"

    def __init__(self, name="bible", split="train", data_dir=None, *, limit=0, max_bytes=0, _handle=None):
        if _handle is None:
            if split not in PARALLEL_SPLITS:
                raise ValueError("split must be one of %s, got %r" % (", ".join(PARALLEL_SPLITS), split))
            h = C.c_void_p()
            cfg = self._config(limit, max_bytes)
            d = None if data_dir is None else str(data_dir).encode()
            check(lib.bk_parallel_open(str(name).encode(), split.encode(), d, C.byref(cfg), C.byref(h)))
            _handle = h
        self._h = _handle
        info = lib.bk_parallel_get_info(self._h).contents
        self._n = info.n
        self.version = info.version.decode()
        for k in ("lines", "src_bytes", "tgt_bytes", "src_max", "tgt_max", "src_fnv", "tgt_fnv"):
            setattr(self, k, getattr(info, k))

    @staticmethod
    def _config(limit, max_bytes):
        cfg = lib.bk_parallel_config_default()
        if max_bytes:
            _lib_set_field(cfg, "max_bytes", max_bytes)
        _lib_set_field(cfg, "limit", limit)
        return cfg

    @classmethod
    def from_files(cls, src_path, tgt_path, *, limit=0, max_bytes=0):
        """the pairs of two line-aligned files"""
        h = C.c_void_p()
        cfg = cls._config(limit, max_bytes)
        check(lib.bk_parallel_load(str(src_path).encode(), str(tgt_path).encode(), C.byref(cfg), C.byref(h)))
        return cls(_handle=h)

    @classmethod
    def from_bytes(cls, src, tgt, *, limit=0, max_bytes=0, names=None):
        """the pairs of two line-aligned texts in memory (str is encoded as UTF-8)"""
        s = src.encode() if isinstance(src, str) else bytes(src)
        t = tgt.encode() if isinstance(tgt, str) else bytes(tgt)
        sn, tn = (None, None) if names is None else (str(names[0]).encode(), str(names[1]).encode())
        h = C.c_void_p()
        cfg = cls._config(limit, max_bytes)
        check(lib.bk_parallel_parse(s, len(s), t, len(t), sn, tn, C.byref(cfg), C.byref(h)))
        return cls(_handle=h)

    def __len__(self):
        return self._n

    def __repr__(self):
        return "Parallel(%s)" % self.version

    def __getitem__(self, i):
        if not getattr(self, "_h", None):
            raise ValueError("the corpus is closed")
        i = int(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("pair %d outside [0, %d)" % (i, self._n))
        pr = SentencePair()
        check(lib.bk_parallel_pair(self._h, i, C.byref(pr)))
        return (C.string_at(pr.src, pr.src_len).decode("utf-8"), C.string_at(pr.tgt, pr.tgt_len).decode("utf-8"))

    def __iter__(self):
        for i in range(self._n):
            yield self[i]
