#!/usr/bin/python3
"""birkhoff.models: the models of birkhoff's training engine as PyTorch modules.

The model, the optimisers, the learning-rate schedules and the checkpoint
format of `src/nn/` (docs/MODEL.md) written with PyTorch: the twin that
tests/oracle/test_model.py holds the C engine to (the same checkpoint loaded
here in float64 must give the same logits, loss, parameter gradients and
training trajectories), the PyTorch peer of the training benchmark, and the
way to move models between the C engine and PyTorch:

    import birkhoff.models as bm
    model = bm.load("runs/digits-softmax/last.safetensors")   # nn.Module, float32
    model.config                                              # its configuration dict
    ...                                                       # torch training, DDP, ...
    bm.save("tuned.safetensors", model, optimizer)            # `birkhoff train --init` it

Public API (docs/PYTHON.md "birkhoff.models", docs/MODEL.md "PyTorch
modules"): load, save, build, from_config, parse_config, format_config,
resolve_config, parse_optim, format_optim, resolve_optim, param_specs (the
parameter names: C checkpoint name == torch parameter name), optim_config_of,
make_optimizer, train_step, lr_at, loss_fn, seq2seq_loss, model_loss,
read_safetensors, write_safetensors, load_checkpoint, save_checkpoint, Model,
Seq2SeqModel. This module imports torch; `import birkhoff` does not import
it. It calls no C code: the operators are the pure-PyTorch ports
birkhoff._port_* (bench/peers/*_torch.py are these files under their old
names, loaded without the C library).

Contents:

* Checkpoints: read_safetensors / write_safetensors (pure Python: struct,
  json, numpy; the safetensors package is not needed; the header read
  strictly, as the C loader reads it), fnv1a64 (the checksum of the data
  section and the header), load_checkpoint / save_checkpoint (the birkhoff
  metadata of MODEL.md "Checkpoints").
* Configurations: parse_config / format_config / resolve_config for the model
  (`bk_model_config`, "key=value" lines or comma lists; enums by name) and
  parse_optim / resolve_optim / format_optim for the optimiser
  (`bk_optim_config`; milestones written "a:b:c").
* Model: the pre-LN encoder classifier, parameter names exactly those of the
  checkpoint (param_specs gives them in the checkpoint's order with shapes and
  the weight-decay flag), forward(x=None, tokens=None, lengths=None) -> logits.
  Padding: per-sample valid lengths n_b = len[b] + cls reach the attention
  operators as q_len = k_len, and pooling reads valid rows only.
  Two attention numerics:
    - exact (default): the operators' documented semantics as the oracle ports
      implement them (birkhoff._port_*): Sinkhorn in the input dtype
      (float64 marginals in a float64 model, textbook update, no early stop),
      per-sample valid blocks for every operator. This is the parity twin.
    - reference=True: the benchmark peer: Sinkhorn as the reference port runs
      it (float32 marginals, increment update, its early-stop check), a
      plain batched softmax attention (masked keys when padded), and LOT as
      the reference DeiT/Swin port (lot_reference: batched, float32
      marginals) when nothing is padded and attn_scale is 0. ESP and the OTK
      pool use the semantics functions in both modes (per-sample loops: slow
      peers, not the reference codes' speed).
  Set Transformer blocks (set_block=isab: _ISAB, two _MAB on the decoder's
  cross-attention module; pool=pma: _PMA, seeds, rFF and a _MAB of attention
  pma_attn; MODEL.md "Set Transformer blocks").
  LOTFormer's ViT ingredients (cls_attn: the [CLS] row's own softmax or
  Pol-[CLS] logits, the operator on the other tokens; dwc: the
  depthwise-convolution branch over the patch grid) are
  _Attention.self_attention around the operator, with
  _port_lotformer.cls_row_semantics and dwc_semantics (MODEL.md "The [CLS]
  row and DWC").
  Dropout cannot be reproduced (the C engine draws it from a counter-based
  hash): a model with dropout > 0 is refused unless allow_dropout=True (the
  benchmark), where nn.Dropout is used.
* Encoder-decoder (arch=seq2seq): Seq2SeqModel, the same pieces (the
  attention module and its operators, LN, MLP, pre- or post-LN sublayers)
  arranged as src/nn/model.c's s2s_forward: tied token table, learned /
  sinusoidal / no positions, encoder blocks of attention attn, decoder blocks
  of causal softmax self-attention, cross-attention cross_attn (rectangular
  problems: query lengths tgt_len, key lengths len) and MLP; forward(tokens,
  lengths, tgt, tgt_len) -> logits [B, tgt_max_len, vocab]; seq2seq_loss
  (mean over the valid target tokens); build_model picks the class from
  cfg["arch"], model_loss(model, batch, ls) gives (logits, loss) for either.
* Training: loss_fn (cross-entropy with label smoothing), lr_at (the
  schedule), make_optimizer (torch.optim.AdamW / Adam / SGD with the decay and
  no-decay parameter groups, optionally loading the checkpoint's optimiser
  state), train_step (zero, forward/backward over micro-batches, clip, set the
  scheduled learning rate, step) and optimizer_state (the state as checkpoint
  tensors "optim.m.<name>", ...).

Command line:

  /usr/bin/python3 bench/peers/model_torch.py --bench --config "dim=128,depth=4,heads=4,\
patch=4,mlp_dim=256,attn=sinkhorn,sk_iters=5" --batch 64 --steps 20 --warmup 3 --threads 2

    times full training steps (forward, loss, backward, AdamW step with the
    default optimiser configuration) of the model built from the defaults
    overridden by --config, on random float32 inputs and labels, and prints
    one JSON line {"samples_per_s", "step_s_median", "step_s_p25",
    "step_s_p75", "threads", "torch", "batch", "steps", "params", "attn"}.

  /usr/bin/python3 bench/peers/model_torch.py --self-check
  (also: python3 -m birkhoff.models --self-check | --bench ...)

    float64 checks of the twin itself (no C involved): checkpoint round trip
    and corruption detection, configuration round trip, padding invariance,
    torch.autograd.gradcheck of tiny models (every attention kind, every pool,
    every input kind), the optimisers against MODEL.md's formulas written out
    by hand, the schedules, and the seeded ESP slices.
"""

import argparse
import json
import math
import os
import re
import stat
import struct
import sys
import tempfile
import time

import numpy as np
import torch
from . import _torch_support
_torch_support.check(torch, "birkhoff.models")  # a torch outside the supported range: ImportError
import torch.nn as nn
import torch.nn.functional as F

from . import _port_diff as diff_port
from . import _port_espformer as esp_port
from . import _port_lotformer as lot_port
from . import _port_otk as otk_port
from . import _port_sinkformer as sk_port


# ---------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------
_ST_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32,
              "I64": np.int64, "I16": np.int16, "I8": np.int8, "U8": np.uint8}
_ST_NAMES = {np.dtype(v).str: k for k, v in _ST_DTYPES.items()}
_U64 = (1 << 64) - 1


def fnv1a64(data, h=0xCBF29CE484222325):
    """FNV-1a 64-bit hash of a bytes-like object (the checkpoint checksum),
    continuing from h (default: the FNV offset basis). Pure Python: about
    10 MB/s."""
    for b in bytes(data):
        h = ((h ^ b) * 0x100000001B3) & _U64
    return h


_HEADER_MAX = 64 << 20     # the longest header bk_checkpoint_load reads (64 MiB)
_ST_SIZES = {"F64": 8, "F32": 4, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}
_J_WS = re.compile(rb"[ \t\n\r]*")
_J_RUN = re.compile(rb'[^"\\\x00-\x1f]*')      # a string's bytes up to a quote, escape or control
_J_INT = re.compile(rb"[0-9]+")
_J_ESC = {ord("n"): "\n", ord("t"): "\t", ord("r"): "\r", ord("b"): "\b", ord("f"): "\f",
          ord('"'): '"', ord("\\"): "\\", ord("/"): "/"}
_J_FIELDS = {"dtype": 1, "shape": 2, "data_offsets": 4}
# a tensor entry as the writers write it (ASCII name and dtype, no escapes,
# numbers below 10^18): read in one match, with the decisions of the general
# path, which reads every other form
_J_ENTRY = re.compile(rb'"([^"\\\x00-\x1f\x80-\xff]*)":\{"dtype":"([^"\\\x00-\x1f\x80-\xff]*)",'
                      rb'"shape":\[((?:[0-9]{1,18}(?:,[0-9]{1,18}){0,7})?)\],'
                      rb'"data_offsets":\[([0-9]{1,18}),([0-9]{1,18})\]\}')


def _shown(s):
    """A header string as the messages show it (as src/nn/ckpt.c does):
    printable ASCII but the backslash as is, other bytes as \\xNN, cut after
    about 64 characters."""
    out = []
    n = 0
    for c in s.encode("utf-8"):
        if n > 64:
            out.append("...")
            break
        t = chr(c) if 0x20 <= c < 0x7F and c != 0x5C else f"\\x{c:02x}"
        out.append(t)
        n += len(t)
    return "".join(out)


class _Header:
    """The strict reader of a safetensors header that bk_checkpoint_load
    uses (src/nn/ckpt.c), decision for decision: the fixed shape of the
    format (an object of "__metadata__", an object of strings, and tensor
    entries of exactly dtype, shape and data_offsets; no recursion), RFC 8259
    strings in well-formed UTF-8 without \\u0000 or \\u escapes above U+007F,
    unsigned integers, no key twice. Python's json module would keep the last
    of two equal keys (and recurse into nested values)."""

    def __init__(self, raw, path):
        self.b, self.i, self.n, self.path = raw, 0, len(raw), path

    def fail(self, why):
        raise ValueError(f"{self.path}: malformed safetensors header ({why})")

    def ws(self):
        if self.i < self.n and self.b[self.i] in b" \t\n\r":
            self.i = _J_WS.match(self.b, self.i).end()

    def lit(self, ch):
        self.ws()
        if self.i < self.n and self.b[self.i] == ord(ch):
            self.i += 1
            return True
        return False

    def entry(self):
        """a tensor entry of the writers' form at the cursor, or None"""
        m = _J_ENTRY.match(self.b, self.i)
        if not m or m.group(1) == b"__metadata__":
            return None
        self.i = m.end()
        sh = m.group(3)
        return (m.group(1).decode(), m.group(2).decode(),
                tuple(int(x) for x in sh.split(b",")) if sh else (), int(m.group(4)), int(m.group(5)))

    def string(self, what):
        self.ws()
        b = self.b
        if self.i >= self.n or b[self.i] != 0x22:
            self.fail(what)
        self.i += 1
        parts = []
        while True:
            end = _J_RUN.match(b, self.i).end()
            try:
                parts.append(b[self.i:end].decode("utf-8"))
            except UnicodeDecodeError as e:
                self.fail(f"invalid UTF-8 in a string at file offset {self.i + e.start + 8}")
            self.i = end
            if end >= self.n:
                self.fail("unterminated string")
            c, at = b[end], end + 8
            if c == 0x22:
                break
            if c < 0x20:
                self.fail(f"raw control character 0x{c:02x} in a string at file offset {at}; "
                          f"JSON strings must escape U+0000..U+001F")
            if end + 1 >= self.n:
                self.fail("unterminated string")
            e = b[end + 1]
            if e == ord("u"):
                h = b[end + 2:end + 6]
                if len(h) < 4 or h.strip(b"0123456789abcdefABCDEF"):
                    self.fail(f"invalid \\u escape in a string at file offset {at}")
                v = int(h, 16)
                if v == 0:
                    self.fail(f"\\u0000 in a string at file offset {at} (NUL is not allowed)")
                if v > 0x7F:
                    self.fail(f"\\u{v:04x} in a string at file offset {at}: escapes above U+007F "
                              f"are not supported")
                parts.append(chr(v))
                self.i = end + 6
            elif e in _J_ESC:
                parts.append(_J_ESC[e])
                self.i = end + 2
            else:
                self.fail(f"invalid escape in a string at file offset {at}")
        self.i += 1
        return "".join(parts)

    def integer(self):
        self.ws()
        m = _J_INT.match(self.b, self.i)
        if not m:
            return None
        d = m.group().lstrip(b"0") or b"0"
        # (ckpt.c's jint: no digit is added to a value above (2^63 - 10) / 10)
        if len(d) > 19 or int(d) // 10 > (2**63 - 10) // 10:
            return None
        self.i = m.end()
        return int(d)

    def integers(self, most):
        if not self.lit("["):
            return None
        out = []
        if self.lit("]"):
            return out
        while True:
            v = self.integer() if len(out) < most else None
            if v is None:
                return None
            out.append(v)
            if not self.lit(","):
                break
        return out if self.lit("]") else None

    def metadata(self, pairs):
        """the "__metadata__" object into pairs; the checksum value's byte
        span (between its quotes) or None"""
        span = None
        if not self.lit("{"):
            self.fail("__metadata__ is not an object")
        if self.lit("}"):
            return span
        while True:
            k = self.string("metadata values must be strings")
            if not self.lit(":"):
                self.fail("metadata values must be strings")
            self.ws()
            vb = self.i
            pairs.append((k, self.string("metadata values must be strings")))
            if k == "checksum":
                span = (vb + 1, self.i - 1)
            if not self.lit(","):
                break
        if not self.lit("}"):
            self.fail("unterminated __metadata__")
        return span

    def tensor(self, name):
        if not self.lit("{"):
            self.fail(f"tensor '{_shown(name)}' is not an object")
        seen, ent = 0, {}
        while True:
            f = self.string("bad tensor field")
            if not self.lit(":"):
                self.fail("bad tensor field")
            bit = _J_FIELDS.get(f, 0)
            if bit & seen:
                self.fail(f"duplicate field '{f}' in tensor '{_shown(name)}'")
            seen |= bit
            if bit == 1:
                v = self.string("bad dtype, shape or data_offsets")
            elif bit == 2:
                v = self.integers(8)
            elif bit == 4:
                v = self.integers(2)
                v = v if v is not None and len(v) == 2 else None
            else:
                v = None
            if v is None:
                self.fail("bad dtype, shape or data_offsets")
            ent[f] = v
            if not self.lit(","):
                break
        if not self.lit("}"):
            self.fail("unterminated tensor entry")
        if seen != 7:
            self.fail(f"tensor '{_shown(name)}' lacks dtype, shape or data_offsets")
        return (name, ent["dtype"], tuple(ent["shape"]), *ent["data_offsets"])


def _parse_header(raw, path):
    """A safetensors header (bytes) -> (tensor entries (name, dtype, shape,
    begin, end) in the header's order, metadata dict, checksum value span
    or None). ValueError for anything bk_checkpoint_load refuses."""
    j = _Header(raw, path)
    pairs, entries, span, have_meta = [], [], None, False
    if not j.lit("{"):
        j.fail("not a JSON object")
    if not j.lit("}"):
        while True:
            j.ws()
            fast = j.entry()
            if fast:
                entries.append(fast)
                if not j.lit(","):
                    break
                continue
            key = j.string("expected a key")
            if not j.lit(":"):
                j.fail("expected ':'")
            if key == "__metadata__":
                if have_meta:
                    j.fail("duplicate key '__metadata__'")
                have_meta = True
                span = j.metadata(pairs)
            else:
                entries.append(j.tensor(key))
            if not j.lit(","):
                break
        if not j.lit("}"):
            j.fail("unterminated object")
    j.ws()
    if j.i != j.n:
        j.fail("trailing bytes")
    # no key twice (the first in sorted order named, as ckpt.c does)
    for what, keys in (("metadata key", [k for k, _ in pairs]),
                       ("tensor name", [e[0] for e in entries])):
        if len(set(keys)) != len(keys):
            seen, dup = set(), set()
            for k in keys:
                (dup if k in seen else seen).add(k)
            j.fail(f"duplicate {what} '{_shown(min(dup))}'")
    return entries, dict(pairs), span


def _checksum_error(path, hdr, span, data, meta):
    """None when meta["checksum"] vouches for the file (MODEL.md
    "Checkpoints"): the FNV-1a-64 of the data section followed by the header
    with the checksum's own digits read as '0's; or, in a file written
    before the checksum covered the header, of the data section followed by
    the "asap.<l>" strings. Else the message."""
    cs = meta["checksum"]
    if not re.fullmatch(r"[0-9a-f]{16}", cs):
        return (f"{path}: bad checksum '{_shown(cs)}' in the metadata (expected 16 lowercase hex "
                f"digits)")
    stored, hd = int(cs, 16), fnv1a64(data)
    b, e = span
    full = fnv1a64(hdr[e:], fnv1a64(b"0" * (e - b), fnv1a64(hdr[:b], hd)))
    if full == stored:
        return None
    old = hd
    for l in range(4096):
        a = meta.get(f"asap.{l}")
        if a is not None:
            old = fnv1a64(a.encode("utf-8"), old)
    if old == stored:
        return None
    return (f"{path}: checksum mismatch (file corrupt or edited): stored {cs}, computed "
            f"{full:016x} over the header and the data")


def read_safetensors(path, verify=True):
    """Read a safetensors file.

    Returns (tensors, metadata): tensors maps each name to a numpy array (a
    copy, in the file's dtype: float32 for birkhoff checkpoints) in the order
    of the data section; metadata is the "__metadata__" dict of strings (empty
    if absent). The header is read as bk_checkpoint_load reads it (the same
    decisions, MODEL.md "Checkpoints"). Raises ValueError naming the problem
    for a malformed file: a header length beyond the file (or above 64 MiB),
    a header that is not the strict JSON of the format (a metadata key, a
    tensor name or a field of a tensor entry twice; nesting; \\u0000; bytes
    that are not UTF-8), a dtype other than F64, F32, F16, I64, I32, I16, I8,
    U8, a shape that does not match its byte range, offsets that do not tile
    the data section exactly, trailing bytes, and (verify=True) a "checksum"
    metadata entry that does not match the file ("checksum mismatch: corrupt
    file").
    """
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: truncated file ({len(raw)} bytes, no header length)")
    (hlen,) = struct.unpack("<Q", raw[:8])
    if hlen > len(raw) - 8 or hlen > _HEADER_MAX:
        raise ValueError(f"{path}: truncated or corrupt file (header length {hlen} exceeds "
                         f"the {len(raw) - 8} bytes after it, or 64 MiB)")
    hdr = raw[8:8 + hlen]
    entries, meta, span = _parse_header(hdr, path)
    data = memoryview(raw)[8 + hlen:]
    for name, dtype, shape, b, e in entries:
        if dtype not in _ST_SIZES:
            raise ValueError(f"{path}: tensor '{_shown(name)}' has the unknown dtype "
                             f"'{_shown(dtype)}' (F64, F32, F16, I64, I32, I16, I8 or U8)")
        if math.prod(shape) * _ST_SIZES[dtype] != e - b:
            raise ValueError(f"{path}: tensor '{_shown(name)}': its shape does not fill its byte "
                             f"range [{b}, {e})")
    entries.sort(key=lambda t: (t[3], t[4]))
    pos = 0
    for name, _, _, b, e in entries:
        if b != pos:
            raise ValueError(f"{path}: tensor '{_shown(name)}' has offsets [{b}, {e}] that do not "
                             f"tile the data (expected it at {pos})")
        pos = e
    if pos != len(data):
        raise ValueError(f"{path}: truncated or corrupt file: tensors end at {pos}, data "
                         f"section has {len(data)} bytes")
    if verify and "checksum" in meta:
        why = _checksum_error(path, hdr, span, data, meta)
        if why:
            raise ValueError(why)
    tensors = {}
    for name, dtype, shape, b, e in entries:
        dt = np.dtype(_ST_DTYPES[dtype]).newbyteorder("<")
        tensors[name] = np.frombuffer(data[b:e], dtype=dt).reshape(shape).astype(
            dt.newbyteorder("="), copy=True)
    return tensors, meta


def _json_string(s, what):
    """s as a JSON string that bk_checkpoint_load reads back as s (UTF-8,
    control characters escaped); ValueError for what it cannot hold."""
    if "\0" in s:
        raise ValueError(f"{what}: a NUL character cannot be stored in a checkpoint header")
    try:
        return json.dumps(s, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what}: not encodable as UTF-8 ({e.reason})") from None


def write_safetensors(path, tensors, metadata=None, checksum_key=None):
    """Write tensors (an ordered mapping name -> array) as a safetensors file.

    Arrays are stored little-endian, contiguous, in the given order; the
    header JSON (UTF-8) is padded with spaces to a multiple of 8 bytes.
    metadata: a dict of strings (no NUL). checksum_key: when set (readers
    verify "checksum"), metadata[checksum_key] receives the checksum of
    MODEL.md "Checkpoints" as 16 hex digits: the FNV-1a-64 of the data
    section followed by the whole header, in which these 16 digits count as
    '0's. Written to a temporary file in the same directory, synced and
    renamed over path (atomic).
    """
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    if checksum_key:
        meta[str(checksum_key)] = "0" * 16
    parts, chunks, pos, at = [b'{"__metadata__":{'], [], 0, None
    for i, (k, v) in enumerate(meta.items()):
        parts.append((b"," if i else b"") + _json_string(k, "a metadata key") + b":")
        if checksum_key and k == str(checksum_key):
            at = sum(len(p) for p in parts) + 1          # (after the opening quote)
        parts.append(_json_string(v, f"metadata {k!r}"))
    parts.append(b"}")
    for name, arr in tensors.items():
        a = np.ascontiguousarray(np.asarray(arr))
        key = a.dtype.newbyteorder("<").str if a.dtype.byteorder in "=|" else a.dtype.str
        if np.dtype(key).str not in _ST_NAMES:
            raise ValueError(f"tensor {name!r}: unsupported dtype {a.dtype}")
        blob = a.astype(np.dtype(key), copy=False).tobytes()
        parts.append(b"," + _json_string(str(name), "a tensor name") +
                     f':{{"dtype":"{_ST_NAMES[np.dtype(key).str]}","shape":[{",".join(map(str, a.shape))}],'
                     f'"data_offsets":[{pos},{pos + len(blob)}]}}'.encode())
        chunks.append(blob)
        pos += len(blob)
    parts.append(b"}")
    hdr = bytearray(b"".join(parts))
    hdr += b" " * (-len(hdr) % 8)
    data = b"".join(chunks)
    if at is not None:
        hdr[at:at + 16] = f"{fnv1a64(hdr, fnv1a64(data)):016x}".encode()
    _write_file(os.fspath(path), (struct.pack("<Q", len(hdr)), bytes(hdr), data))


def _write_file(path, blobs):
    """The C library's rules for an output file (bk_outset_add, birkhoff/core.h):
    a device or FIFO is written into, never replaced; a symlink is followed (a
    dangling one refused); otherwise a temporary file created exclusively beside
    the target (O_EXCL | O_NOFOLLOW, a random name), with the replaced file's
    mode or 0666 less the umask, synced and renamed over it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise ValueError(f"cannot write {path} (a dangling symbolic link)") from None
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ValueError(f"cannot write {path} (a directory)")
    if st is not None and not stat.S_ISREG(st.st_mode):
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            raise ValueError(f"cannot write {path} (not a regular file)")
        with open(path, "wb", buffering=0) as f:           # a device: no O_TRUNC matters
            for b in blobs:
                f.write(b)
        return
    if os.path.islink(path):
        path = os.path.realpath(path)
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)[:160]}.bk-{os.getpid()}-{os.urandom(8).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)   # the umask applies
    try:
        if st is not None:
            os.fchmod(fd, stat.S_IMODE(st.st_mode))
        with os.fdopen(fd, "wb") as f:
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------
INPUTS = ("image", "tokens", "points")
ATTNS = ("softmax", "sinkhorn", "esp", "lot", "asap", "unbalanced", "diff")
POOLS = ("cls", "mean", "max", "otk", "pma")
# Set Transformer blocks (docs/MODEL.md "Set Transformer blocks")
SET_BLOCKS = ("sab", "isab")
ARCHS = ("classifier", "seq2seq")
# the attention kinds a seq2seq model's cross-attention takes (bk_model_config_check)
CROSS_ATTNS = ("softmax", "sinkhorn", "unbalanced", "esp")

# bk_model_config fields in declaration order, with bk_model_config_default's
# values (include/birkhoff.h). vocab, max_len, point_dim and max_points are
# not stated there: the values below are this twin's own (assumed) defaults;
# checkpoints always carry every field, so they only matter for --config.
CONFIG_DEFAULTS = {
    "input": "image", "channels": 1, "image_h": 28, "image_w": 28, "patch": 4,
    "vocab": 256, "max_len": 128, "point_dim": 3, "max_points": 64,
    "dim": 64, "depth": 2, "heads": 4, "head_dim": 0, "mlp_dim": 128,
    "cls": 1, "pos_embed": 1, "final_norm": 1, "qkv_bias": 0,
    "pool": "cls", "classes": 10, "dropout": 0.0, "ln_eps": 1e-5,
    "attn": "softmax", "attn_scale": 0.0,
    "sk_iters": 5, "sk_eps": 1.0, "sk_rho": 10.0,
    "esp_soft": 1, "esp_t": 1e-3, "esp_tau": 1.0, "esp_slices": 0,
    "lot_r": 8, "lot_iters": 5, "lot_eps": 1.0, "lot_temp": 1.0,
    "otk_refs": 1, "otk_supports": 4, "otk_iters": 20, "otk_eps": 0.5,
    # OTK pooling's Nystrom map and positional encoding (docs/MODEL.md "The OTK layer")
    "otk_anchors": 0, "otk_sigma": 0.5, "otk_eta": 1e-2, "otk_pe": "none", "otk_sigma_pos": 0.1,
    # the encoder-decoder (arch=seq2seq; docs/MODEL.md "Encoder-decoder")
    "arch": "classifier", "dec_depth": 2, "tgt_max_len": 128, "cross_attn": "softmax",
    "post_ln": 0, "bos": 1, "eos": 2,
    # attn=asap's ending (no twin: recorded so every checkpoint's configuration parses)
    "asap_ending": "auto",
    # LOTFormer's ViT ingredients (docs/MODEL.md "The [CLS] row and DWC")
    "cls_attn": "full", "pol_ps": 2.0, "pol_po": 1.0, "dwc": 0, "dwc_kernel": 3,
    # what of the LOT pivot measure is trained (docs/MODEL.md "LOT pivots")
    "lot_learn": "both",
    # Set Transformer blocks (docs/MODEL.md "Set Transformer blocks")
    "set_block": "sab", "set_inducing": 16, "pma_seeds": 1, "pma_attn": "softmax",
}
ASAP_ENDINGS = ("auto", "zero", "column", "row")
OTK_PES = ("none", "1d", "2d")
CLS_ATTNS = ("full", "softmax", "pol")
LOT_LEARNS = ("both", "z", "none")
# the attention kinds whose [CLS] row cls_attn may take out (bk_model_config_check)
CLS_SPLIT_ATTNS = ("softmax", "sinkhorn", "unbalanced", "esp", "lot")
_CONFIG_ENUMS = {"input": INPUTS, "attn": ATTNS, "pool": POOLS, "arch": ARCHS,
                 "cross_attn": ATTNS, "asap_ending": ASAP_ENDINGS, "cls_attn": CLS_ATTNS,
                 "lot_learn": LOT_LEARNS, "set_block": SET_BLOCKS, "pma_attn": ATTNS,
                 "otk_pe": OTK_PES}

OPT_KINDS = ("adamw", "adam", "sgd")
SCHEDS = ("constant", "step", "cosine", "invsqrt")
# bk_optim_config fields (bk_optim_config_default: AdamW lr 1e-3, betas
# (0.9, 0.999), eps 1e-8, wd 0.01, no clip, constant). momentum, gamma and the
# others are this twin's defaults (checkpoints carry every field).
OPTIM_DEFAULTS = {
    "kind": "adamw", "lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
    "weight_decay": 0.01, "momentum": 0.0, "nesterov": 0, "clip": 0.0,
    "sched": "constant", "warmup": 0, "total_steps": 0, "lr_min": 0.0,
    "gamma": 0.1, "milestones": (), "decay_embed": 0,
}
_OPTIM_ENUMS = {"kind": OPT_KINDS, "sched": SCHEDS}


def _split_assignments(text):
    """'a=1,b=2' / 'a=1\\nb=2' / 'a=1 b=2' -> [(key, value), ...]."""
    out = []
    for tok in text.replace(",", "\n").replace(" ", "\n").replace("\t", "\n").splitlines():
        tok = tok.strip()
        if not tok:
            continue
        if "=" not in tok:
            raise ValueError(f"malformed assignment {tok!r} (expected key=value)")
        k, v = tok.split("=", 1)
        out.append((k.strip(), v.strip()))
    return out


def _parse_milestones(v):
    """'a:b:c' (also ';', '/' or '|' separated) -> tuple of ints; a 0 ends the list."""
    out = []
    for s in v.replace(";", ":").replace("/", ":").replace("|", ":").split(":"):
        s = s.strip()
        if not s:
            continue
        m = int(s)
        if m == 0:
            break
        out.append(m)
    return tuple(out)


def _typed(key, value, defaults, enums):
    if key in enums:
        if value.isdigit() and int(value) < len(enums[key]):
            return enums[key][int(value)]          # tolerate numeric enum values
        if value not in enums[key]:
            raise ValueError(f"{key}={value!r}: expected one of {'|'.join(enums[key])}")
        return value
    ref = defaults[key]
    if key == "milestones":
        return _parse_milestones(value)
    if isinstance(ref, int):
        return int(value)
    return float(value)


def _parse(text, defaults, enums):
    out = {}
    for k, v in _split_assignments(text):
        out[k] = _typed(k, v, defaults, enums) if k in defaults else v
    return out


# The C library's attention keys (issue 42): each site's operator parameters
# "attn.KEY", "cross_attn.KEY", "pma_attn.KEY" from the operator's schema.
# The twin keeps the keys before the schema, shared by the sites as they were:
# (operator, KEY) -> the twin's key (and a value map); the parameters the twin
# does not implement are accepted at their operators' defaults only.
_SITE_KEYS = {
    ("sinkhorn", "iters"): "sk_iters", ("sinkhorn", "eps"): "sk_eps",
    ("unbalanced", "iters"): "sk_iters", ("unbalanced", "eps"): "sk_eps", ("unbalanced", "rho"): "sk_rho",
    ("esp", "sort"): "esp_soft", ("esp", "t"): "esp_t", ("esp", "tau"): "esp_tau", ("esp", "L"): "esp_slices",
    ("lot", "r"): "lot_r", ("lot", "iters"): "lot_iters", ("lot", "eps"): "lot_eps", ("lot", "temp"): "lot_temp",
    ("asap", "variant"): "asap_ending",
}
# the twin's keys the C text writes only where a site's kind has them
SITE_OLD_KEYS = frozenset(_SITE_KEYS.values())
_SITE_FIXED = {"tol": ("0",), "grad": ("unrolled",), "cost": ("sq",), "out_scale": ("rows",), "seed": ("0",)}
_SITES = ("attn", "cross_attn", "pma_attn")


def _site_pairs(pairs):
    """(key, value) pairs with the sites' "attn.KEY" converted to the twin's
    keys (the kinds read first); a parameter the twin cannot represent is
    kept under its own name (check_config refuses it)."""
    kinds = {k: v for k, v in pairs if k in _SITES}
    out, seen = [], {}
    for k, v in pairs:
        site, dot, key = k.partition(".")
        if not dot or site not in _SITES:
            out.append((k, v))
            continue
        op = kinds.get(site, "softmax")
        old = _SITE_KEYS.get((op, key))
        if old is None:
            if v not in _SITE_FIXED.get(key, ()):
                out.append((k, v))
            continue
        if old == "esp_soft":
            v = {"soft": "1", "hard": "0"}.get(v, v)
        if old in seen and seen[old] != v:
            out.append((k, v))  # the twin shares the old key over the sites
            continue
        seen[old] = v
        out.append((old, v))
    return out


def parse_config(text):
    """Model configuration text ("key=value" lines or a comma list) -> dict.

    Known keys get their type (int, float, or the enum name as a string:
    input=image|tokens|points, attn=softmax|sinkhorn|esp|lot|asap|unbalanced|diff,
    pool=cls|mean|max|otk|pma, set_block=sab|isab, pma_attn as attn); the
    sites' operator keys of the C library (attn.iters, cross_attn.t, ...) are
    converted to the twin's (sk_iters, esp_t, ...); unknown keys are kept as
    strings (Model refuses them). Only the keys present in the text are
    returned.
    """
    out = {}
    for k, v in _site_pairs(_split_assignments(text)):
        out[k] = _typed(k, v, CONFIG_DEFAULTS, _CONFIG_ENUMS) if k in CONFIG_DEFAULTS else v
    return out


def resolve_config(text_or_dict=None):
    """CONFIG_DEFAULTS overridden by a configuration text or dict."""
    cfg = dict(CONFIG_DEFAULTS)
    if text_or_dict:
        cfg.update(parse_config(text_or_dict) if isinstance(text_or_dict, str) else text_or_dict)
    return cfg


def _format(cfg):
    lines = []
    for k, v in cfg.items():
        if k == "milestones":
            v = ":".join(str(m) for m in v)
        elif isinstance(v, float):
            v = repr(v)
        lines.append(f"{k}={v}")
    return "".join(line + "\n" for line in lines)


def format_config(cfg):
    """Model configuration dict -> "key=value\\n" lines (every field of cfg)."""
    return _format(cfg)


def parse_optim(text):
    """Optimiser configuration text -> dict (kind=adamw|adam|sgd, lr, beta1,
    beta2, eps, weight_decay, momentum, nesterov, clip, sched=constant|step|
    cosine, warmup, total_steps, lr_min, gamma, milestones=a:b:c as a tuple,
    decay_embed)."""
    return _parse(text, OPTIM_DEFAULTS, _OPTIM_ENUMS)


def resolve_optim(text_or_dict=None):
    """OPTIM_DEFAULTS overridden by an optimiser configuration text or dict."""
    cfg = dict(OPTIM_DEFAULTS)
    if text_or_dict:
        cfg.update(parse_optim(text_or_dict) if isinstance(text_or_dict, str) else text_or_dict)
    unknown = sorted(set(cfg) - set(OPTIM_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown optimiser keys: {', '.join(unknown)}")
    # the C bounds (bk_optim_create, src/nn/optim.c): warmup an int >= 0, total_steps an int64 >= 0
    for key, hi in (("warmup", 2**31 - 1), ("total_steps", 2**63 - 1)):
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) <= hi:
            raise ValueError(f"{key}={v!r} is out of range [0, {hi}]")
    return cfg


def format_optim(cfg):
    """Optimiser configuration dict -> "key=value\\n" lines."""
    return _format(cfg)


# ---------------------------------------------------------------------------
# Model definition helpers
# ---------------------------------------------------------------------------
def head_dim(cfg):
    """dh: head_dim, or dim / heads when head_dim is 0."""
    return cfg["head_dim"] or cfg["dim"] // cfg["heads"]


def seq_len(cfg):
    """Tokens per sample excluding the CLS token."""
    if cfg["input"] == "image":
        return (cfg["image_h"] // cfg["patch"]) * (cfg["image_w"] // cfg["patch"])
    return cfg["max_len"] if cfg["input"] == "tokens" else cfg["max_points"]


def num_tokens(cfg):
    """T: tokens per sample including the CLS token."""
    return seq_len(cfg) + cfg["cls"]


def otk_dim(cfg):
    """k: the OTK pool's feature dimension (otk_anchors, or dim for the
    identity map)."""
    return cfg["otk_anchors"] or cfg["dim"]


def otk_grid(cfg):
    """The 2-D positional encoding's grid: the image's patch grid (gh, gw)."""
    return (cfg["image_h"] // cfg["patch"], cfg["image_w"] // cfg["patch"])


def feature_dim(cfg):
    """Width of the pooled features fed to the head."""
    if cfg["pool"] == "otk":
        return cfg["otk_supports"] * cfg["otk_refs"] * otk_dim(cfg)
    if cfg["pool"] == "pma":
        return cfg["pma_seeds"] * cfg["dim"]
    return cfg["dim"]


_INT_MAX = 2**31 - 1        # a config integer is a C int (bki_cfg_set: |v| <= 2^31 - 1)
_SIZE_MAX = 1 << 24         # bk_model_config_check's bound on every size and product of sizes


def _in_range(cfg, key, lo, hi, why=""):
    v = cfg[key]
    if not lo <= v <= hi:
        raise ValueError(f"{key}={v} is out of range [{lo}, {hi}]{why}")


def _check_ranges(cfg):
    """Every integer of the configuration in the range bk_model_config_check
    (src/nn/model.c) keeps it in, so that the twin refuses what the C engine
    refuses, before anything is allocated; ValueError naming the key and
    the range."""
    for k, ref in CONFIG_DEFAULTS.items():
        if isinstance(ref, int) and k not in _CONFIG_ENUMS:
            v = cfg[k]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"{k}={v!r}: expected an integer")
            _in_range(cfg, k, -_INT_MAX, _INT_MAX, " (a C int)")
    s2s, L = cfg["arch"] == "seq2seq", _SIZE_MAX
    _in_range(cfg, "dim", 1, L)
    _in_range(cfg, "depth", 0, 4096)
    _in_range(cfg, "heads", 1, L)
    _in_range(cfg, "head_dim", 0, L)
    _in_range(cfg, "mlp_dim", 0, L)
    _in_range(cfg, "classes", -_INT_MAX if s2s else 2, L)
    _in_range(cfg, "channels", 1 if cfg["input"] == "image" else -_INT_MAX, L)
    for k in ("cls", "final_norm", "qkv_bias", "esp_soft", "post_ln"):
        _in_range(cfg, k, 0, 1, " (a 0/1 switch)")
    _in_range(cfg, "pos_embed", 0, 2 if s2s else 1,
              " (0 none, 1 learned; 2 sinusoidal for arch=seq2seq)")
    for k in ("lot_r", "esp_slices"):
        _in_range(cfg, k, 0, L)
    for k in ("otk_refs", "otk_supports"):
        _in_range(cfg, k, 0, _INT_MAX)
    for k in ("lot_iters", "otk_iters", "sk_iters"):     # (sk_iters also without Sinkhorn)
        _in_range(cfg, k, 0, 1 << 20)
    _in_range(cfg, "set_inducing", 1 if cfg["set_block"] == "isab" and not s2s else -_INT_MAX, L)
    if cfg["input"] == "image":
        for k in ("image_h", "image_w", "patch"):
            _in_range(cfg, k, 1, _INT_MAX)
    elif cfg["input"] == "tokens":
        _in_range(cfg, "max_len", 1, L)
        _in_range(cfg, "vocab", 1, _INT_MAX)
        _in_range(cfg, "point_dim", -_INT_MAX, L)      # (the C check bounds it for every input but images)
    else:
        _in_range(cfg, "max_points", 1, L)
        _in_range(cfg, "point_dim", 1, L)
    if s2s:
        _in_range(cfg, "dec_depth", 1, 4096)
        _in_range(cfg, "tgt_max_len", 1, 1 << 20)
    pma = not s2s and cfg["pool"] == "pma"
    kinds = {cfg["attn"]} | ({cfg["cross_attn"]} if s2s else set()) | ({cfg["pma_attn"]} if pma else set())
    if kinds & {"sinkhorn", "unbalanced"}:
        _in_range(cfg, "sk_iters", 1, 1 << 20, " (Sinkhorn)")
    if cfg["attn"] == "lot":
        _in_range(cfg, "lot_r", 1, L, " (LOT)")
        _in_range(cfg, "lot_iters", 1, 1 << 20, " (LOT)")
    D, dh = cfg["dim"], cfg["head_dim"] or cfg["dim"] // cfg["heads"]
    if cfg["vocab"] * D > 1 << 34:
        raise ValueError(f"model sizes too large: vocab x dim = {cfg['vocab'] * D} is above 2^34")
    sizes = {"head_dim x heads": dh * cfg["heads"],
             "otk_refs x otk_supports x dim": cfg["otk_refs"] * cfg["otk_supports"] * D,
             "otk_refs x otk_supports x otk_anchors":
                 cfg["otk_refs"] * cfg["otk_supports"] * cfg["otk_anchors"],
             "otk_anchors x dim": cfg["otk_anchors"] * D, "pma_seeds x dim": cfg["pma_seeds"] * D}
    if cfg["input"] == "image":
        sizes["patches (image_h / patch x image_w / patch)"] = \
            (cfg["image_h"] // cfg["patch"]) * (cfg["image_w"] // cfg["patch"])
        sizes["patch x patch x channels"] = cfg["patch"] ** 2 * cfg["channels"]
    for what, v in sizes.items():
        if v > L:
            raise ValueError(f"model sizes too large: {what} = {v} is above 2^24 (each size and "
                             f"product of sizes must stay below 2^24)")


def check_config(cfg):
    """Raise ValueError for configurations the model cannot be built from
    (those bk_model_config_check refuses; an integer out of its range names
    the key and the range)."""
    unknown = sorted(set(cfg) - set(CONFIG_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown configuration keys (the twin does not know their "
                         f"semantics): {', '.join(unknown)}")
    for k, vals in _CONFIG_ENUMS.items():
        if cfg[k] not in vals:
            raise ValueError(f"{k}={cfg[k]!r}: expected one of {'|'.join(vals)}")
    _check_ranges(cfg)
    D, H = cfg["dim"], cfg["heads"]
    s2s = cfg["arch"] == "seq2seq"
    if s2s:
        _check_seq2seq(cfg)
    elif min(D, H) < 1 or cfg["depth"] < 0 or cfg["head_dim"] < 0 or cfg["mlp_dim"] < 0:
        raise ValueError("dim, heads must be >= 1; depth, head_dim, mlp_dim >= 0")
    elif cfg["pos_embed"] not in (0, 1) or cfg["post_ln"]:
        raise ValueError("the classifier takes pos_embed 0/1 and post_ln=0 (sinusoidal positions "
                         "and post-LN are for arch=seq2seq)")
    if cfg["head_dim"] == 0 and D % H:
        raise ValueError(f"heads ({H}) must divide dim ({D}) when head_dim = 0")
    if cfg["input"] == "image":
        P = cfg["patch"]
        if P < 1 or cfg["image_h"] % P or cfg["image_w"] % P or cfg["channels"] < 1:
            raise ValueError("patch must divide image_h and image_w")
    if not s2s and cfg["pool"] == "cls" and not cfg["cls"]:
        raise ValueError("pool=cls needs cls=1")
    if not s2s and cfg["classes"] < 2:
        raise ValueError("classes must be >= 2")
    if not 0.0 <= cfg["dropout"] < 1.0:
        raise ValueError("dropout must be in [0, 1)")
    if cfg["attn"] == "asap":
        raise ValueError("attn=asap (compiled inference-only layers) has no PyTorch twin")
    if cfg["attn"] == "diff" and head_dim(cfg) % 2:
        raise ValueError(f"attn=diff needs an even head dimension, got {head_dim(cfg)}")
    _check_vit(cfg)
    _check_set(cfg)
    _check_otk(cfg)


def _check_set(cfg):
    """set_block, set_inducing, pool=pma, pma_seeds, pma_attn (bk_model_config_check)."""
    s2s = cfg["arch"] == "seq2seq"
    if cfg["set_block"] == "isab":
        if s2s:
            raise ValueError("set_block=isab is a block of the classifier")
        if cfg["set_inducing"] < 1:
            raise ValueError("set_block=isab needs set_inducing >= 1")
        if cfg["attn"] not in CROSS_ATTNS:
            raise ValueError(f"set_block=isab takes attn {', '.join(CROSS_ATTNS)} (got {cfg['attn']})")
        if cfg["cls_attn"] != "full" or cfg["dwc"]:
            raise ValueError("set_block=isab takes cls_attn=full and dwc=0")
    if not s2s and cfg["pool"] == "pma":
        if cfg["pma_seeds"] < 1:
            raise ValueError("pool=pma needs pma_seeds >= 1")
        if cfg["pma_attn"] not in CROSS_ATTNS:
            raise ValueError(f"pma_attn takes {', '.join(CROSS_ATTNS)} (got {cfg['pma_attn']})")


def _check_otk(cfg):
    """The OTK pool's keys (bk_model_config_check)."""
    if not 0 <= cfg["otk_anchors"] <= 4096:
        raise ValueError("otk_anchors must be in [0, 4096] (0: identity feature map)")
    if cfg["arch"] == "seq2seq" or cfg["pool"] != "otk":
        if cfg["otk_anchors"] or cfg["otk_pe"] != "none":
            raise ValueError("otk_anchors and otk_pe configure pool=otk")
        return
    if (min(cfg["otk_refs"], cfg["otk_supports"]) < 1 or cfg["otk_iters"] < 2
            or cfg["otk_iters"] % 2 or not cfg["otk_eps"] > 0):
        raise ValueError("OTK pooling needs otk_refs, otk_supports >= 1, otk_iters even and >= 2 "
                         "and otk_eps > 0")
    if cfg["otk_anchors"] and not (cfg["otk_sigma"] > 0 and cfg["otk_eta"] >= 0):
        raise ValueError("otk_anchors > 0 (Nystrom map) needs otk_sigma > 0 and otk_eta >= 0")
    if cfg["otk_pe"] != "none" and not cfg["otk_sigma_pos"] > 0:
        raise ValueError(f"otk_pe={cfg['otk_pe']} needs otk_sigma_pos > 0")
    if cfg["otk_pe"] == "2d":
        if cfg["input"] != "image":
            raise ValueError("otk_pe=2d weighs the image's patch grid: it needs input=image")
        if cfg["cls"]:
            raise ValueError("otk_pe=2d pools the patch grid only: set cls=0")
        if math.isqrt(cfg["otk_supports"]) ** 2 != cfg["otk_supports"]:
            raise ValueError("otk_pe=2d needs a square otk_supports")


def _check_vit(cfg):
    """cls_attn, pol_*, dwc, dwc_kernel (bk_model_config_check)."""
    s2s = cfg["arch"] == "seq2seq"
    if cfg["cls_attn"] != "full":
        if s2s or not cfg["cls"]:
            raise ValueError(f"cls_attn={cfg['cls_attn']} needs the classifier's [CLS] token (cls=1)")
        if cfg["attn"] not in CLS_SPLIT_ATTNS:
            raise ValueError(f"cls_attn={cfg['cls_attn']} takes attn {', '.join(CLS_SPLIT_ATTNS)} "
                             f"(got {cfg['attn']})")
    if cfg["cls_attn"] == "pol" and not (1 <= cfg["pol_ps"] <= 16 and 1 <= cfg["pol_po"] <= 16):
        raise ValueError("cls_attn=pol needs pol_ps and pol_po in [1, 16]")
    if cfg["dwc"] not in (0, 1):
        raise ValueError("dwc is a 0/1 switch (the kernel size is dwc_kernel)")
    if cfg["dwc"]:
        if s2s or cfg["input"] != "image":
            raise ValueError("dwc=1 convolves over the patch grid: it needs input=image and "
                             "arch=classifier")
        if not (1 <= cfg["dwc_kernel"] <= 63 and cfg["dwc_kernel"] % 2 == 1):
            raise ValueError(f"dwc_kernel must be odd and in [1, 63] (got {cfg['dwc_kernel']})")


def _check_seq2seq(cfg):
    """The encoder-decoder's own constraints (bk_model_config_check)."""
    if cfg["input"] != "tokens":
        raise ValueError("arch=seq2seq needs input=tokens")
    if min(cfg["dim"], cfg["heads"], cfg["dec_depth"], cfg["tgt_max_len"], cfg["vocab"],
           cfg["max_len"]) < 1 or cfg["depth"] < 0 or cfg["head_dim"] < 0 or cfg["mlp_dim"] < 0:
        raise ValueError("arch=seq2seq: dim, heads, dec_depth, tgt_max_len, vocab, max_len >= 1; "
                         "depth, head_dim, mlp_dim >= 0")
    if cfg["pos_embed"] not in (0, 1, 2) or cfg["post_ln"] not in (0, 1):
        raise ValueError("arch=seq2seq: pos_embed 0/1/2, post_ln 0/1")
    if not (0 <= cfg["bos"] < cfg["vocab"] and 0 <= cfg["eos"] < cfg["vocab"]):
        raise ValueError("bos and eos must be ids of the vocabulary")
    if cfg["cross_attn"] not in CROSS_ATTNS:
        raise ValueError(f"cross_attn={cfg['cross_attn']}: expected one of {'|'.join(CROSS_ATTNS)}")


DECAY_EMBED = 2  # a param_specs decay flag: the token table (BK_DECAY_EMBED)


def decays(flag, ocfg):
    """Whether a tensor with param_specs' decay flag takes ocfg's weight decay
    (the C engine's rule, src/nn/optim.c)."""
    return flag == 1 or (flag == DECAY_EMBED and bool(ocfg.get("decay_embed", 0)))


def param_specs(cfg):
    """[(name, shape, decay)] in the checkpoint's order (MODEL.md "Parameters").

    decay is 1 for Linear weights (weight decay applies), DECAY_EMBED (2) for
    the token table (decayed when the optimiser's decay_embed is 1: decays()),
    0 otherwise. arch=seq2seq: build_table_s2s's order (see _seq2seq_specs).
    """
    D, H, dh, M = cfg["dim"], cfg["heads"], head_dim(cfg), cfg["mlp_dim"]
    inner = H * dh
    specs = []

    def linear(prefix, fin, fout, bias=True):
        specs.append((prefix + ".weight", (fout, fin), 1))
        if bias:
            specs.append((prefix + ".bias", (fout,), 0))

    def norm(prefix):
        specs.append((prefix + ".weight", (D,), 0))
        specs.append((prefix + ".bias", (D,), 0))

    def block(p, kind, dec):
        """add_block: ln1, attn.qkv, [kind's tensors], attn.proj, [lnc, cross.*], [ln2, mlp.*]"""
        norm(p + "ln1")
        linear(p + "attn.qkv", D, 3 * inner, bias=bool(cfg["qkv_bias"]))
        if kind == "lot":
            specs.append((p + "attn.lot_z", (H, cfg["lot_r"], dh), 0))
            specs.append((p + "attn.lot_theta", (H, cfg["lot_r"]), 0))
        if kind == "diff":
            for v in _DIFF_VECTORS:
                specs.append((p + "attn." + v, (dh // 2,), 0))
        if cfg["dwc"] and not dec:
            k = cfg["dwc_kernel"]
            specs.append((p + "attn.dwc.weight", (dh, k, k), 1))
            specs.append((p + "attn.dwc.bias", (dh,), 0))
        linear(p + "attn.proj", inner, D)
        if dec:
            cross(p, False)
        mlp(p)

    def cross(p, key_norm):
        """the cross-attention sublayer: lnc, [lnk], cross.q, cross.kv, cross.proj"""
        norm(p + "lnc")
        if key_norm:
            norm(p + "lnk")
        linear(p + "cross.q", D, inner, bias=bool(cfg["qkv_bias"]))
        linear(p + "cross.kv", D, 2 * inner, bias=bool(cfg["qkv_bias"]))
        linear(p + "cross.proj", inner, D)

    def mlp(p):
        if M > 0:
            norm(p + "ln2")
            linear(p + "mlp.fc1", D, M)
            linear(p + "mlp.fc2", M, D)

    def mab(p):
        """add_mab: lnc, lnk, cross.q, cross.kv, cross.proj, [ln2, mlp.*]"""
        cross(p, True)
        mlp(p)

    if cfg["arch"] == "seq2seq":
        # embed.table, [enc.pos, dec.pos], enc.blocks.*, [enc.norm], dec.blocks.*, [dec.norm]
        specs.append(("embed.table", (cfg["vocab"], D), DECAY_EMBED))
        if cfg["pos_embed"] == 1:
            specs.append(("enc.pos", (cfg["max_len"], D), 0))
            specs.append(("dec.pos", (cfg["tgt_max_len"], D), 0))
        for l in range(cfg["depth"]):
            block(f"enc.blocks.{l}.", cfg["attn"], False)
        if cfg["final_norm"]:
            norm("enc.norm")
        for j in range(cfg["dec_depth"]):
            block(f"dec.blocks.{j}.", "softmax", True)
        if cfg["final_norm"]:
            norm("dec.norm")
        return specs

    if cfg["input"] == "image":
        linear("embed.proj", cfg["patch"] ** 2 * cfg["channels"], D)
    elif cfg["input"] == "tokens":
        specs.append(("embed.table", (cfg["vocab"], D), DECAY_EMBED))
    else:
        linear("embed.fc1", cfg["point_dim"], D)
        linear("embed.fc2", D, D)
    if cfg["cls"]:
        specs.append(("cls", (D,), 0))
    if cfg["pos_embed"]:
        specs.append(("pos", (num_tokens(cfg), D), 0))
    for l in range(cfg["depth"]):
        if cfg["set_block"] == "isab":   # add_isab: inducing points, mab0, mab1
            specs.append((f"blocks.{l}.inducing", (cfg["set_inducing"], D), 0))
            mab(f"blocks.{l}.mab0.")
            mab(f"blocks.{l}.mab1.")
        else:
            block(f"blocks.{l}.", cfg["attn"], False)
    if cfg["final_norm"]:
        norm("norm")
    if cfg["pool"] == "otk":
        if cfg["otk_anchors"]:
            specs.append(("pool.otk_w", (cfg["otk_anchors"], D), 0))
        specs.append(("pool.otk_z", (cfg["otk_refs"], cfg["otk_supports"], otk_dim(cfg)), 0))
    if cfg["pool"] == "pma":   # add_pma: seeds, [rFF], the MAB
        specs.append(("pool.seeds", (cfg["pma_seeds"], D), 0))
        if M > 0:
            linear("pool.rff.fc1", D, M)
            linear("pool.rff.fc2", M, D)
        mab("pool.mab.")
    linear("head", feature_dim(cfg), cfg["classes"])
    return specs


# attn=diff: the learned lambda vectors of each block, in the checkpoint's order
_DIFF_VECTORS = ("diff_lq1", "diff_lk1", "diff_lq2", "diff_lk2")


def unit_directions(seed, L, d):
    """The C library's seeded unit directions (bki_unit_directions, sort1d.c).

    splitmix64 stream from seed; per direction d Box-Muller Gaussians
    g = sqrt(-2 log u) cos(2 pi w), u = (x1 >> 11 + 0.5) 2^-53,
    w = (x2 >> 11) 2^-53, each stored as float32, then multiplied (float32)
    by float32(1 / sqrt(sum g^2)) accumulated in double. Returns float32 [L, d].
    """
    st = seed & _U64

    def mix():
        nonlocal st
        st = (st + 0x9E3779B97F4A7C15) & _U64
        z = st
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
        return z ^ (z >> 31)

    theta = np.zeros((L, d), dtype=np.float32)
    for l in range(L):
        nrm = 0.0
        for x in range(d):
            u = ((mix() >> 11) + 0.5) * (1.0 / 9007199254740992.0)
            w = (mix() >> 11) * (1.0 / 9007199254740992.0)
            g = math.sqrt(-2.0 * math.log(u)) * math.cos(6.283185307179586 * w)
            theta[l, x] = np.float32(g)
            nrm += g * g
        inv = np.float32(1.0 / math.sqrt(nrm if nrm > 0 else 1.0))
        theta[l] = theta[l] * inv
    return theta


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------
class _Embed(nn.Module):
    """embed.proj (image), embed.table (tokens) or embed.fc1/fc2 (points)."""

    def __init__(self, cfg):
        super().__init__()
        D = cfg["dim"]
        self.kind = cfg["input"]
        if self.kind == "image":
            self.P = cfg["patch"]
            self.proj = nn.Linear(self.P * self.P * cfg["channels"], D)
        elif self.kind == "tokens":
            self.table = nn.Parameter(torch.empty(cfg["vocab"], D))
        else:
            self.fc1 = nn.Linear(cfg["point_dim"], D)
            self.fc2 = nn.Linear(D, D)

    def forward(self, x=None, tokens=None):
        if self.kind == "image":
            B, C, Hi, Wi = x.shape
            P = self.P
            # 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)'
            p = x.reshape(B, C, Hi // P, P, Wi // P, P).permute(0, 2, 4, 3, 5, 1)
            return self.proj(p.reshape(B, (Hi // P) * (Wi // P), P * P * C))
        if self.kind == "tokens":
            return self.table[tokens]
        return self.fc2(F.gelu(self.fc1(x)))


class _DWC(nn.Module):
    """attn.dwc: the depthwise-convolution branch's kernel [dh, k, k] and bias
    [dh], shared by the heads (lot_port.dwc_semantics; torch's Conv2d weight
    is weight[:, None])."""

    def __init__(self, dh, k, gh, gw):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dh, k, k))
        self.bias = nn.Parameter(torch.empty(dh))
        self.gh, self.gw = gh, gw

    def reset_parameters(self):
        """Conv2d's: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = k * k."""
        bound = 1.0 / self.weight.shape[-1]
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            self.bias.uniform_(-bound, bound)

    def forward(self, v):
        return lot_port.dwc_semantics(v, self.weight, self.bias, self.gh, self.gw)


class _Attention(nn.Module):
    """attn.qkv, [attn.lot_z, attn.lot_theta | attn.diff_*], [attn.dwc], attn.proj around the operator.

    cls_attn softmax / pol (self-attention of the classifier): the operator
    runs on the tokens after [CLS] (lengths - 1) and the [CLS] row is
    lot_port.cls_row_semantics over every valid token; dwc: the output of
    the grid's tokens gets lot_port.dwc_semantics of their values.

    attn=diff is _port_diff.DiffAttentionLayer's computation on the model's
    qkv (head_dim dh, halves of dh/2): lambda = exp(lq1 . lk1) - exp(lq2 . lk2)
    + lambda_init(layer + 1) shared by the heads, diff_semantics, per-head
    RMSNorm (no gain, eps = ln_eps), times (1 - lambda_init).

    The seq2seq model uses the same module for its other attention layers:
    kind overrides cfg["attn"] (the decoder's self-attention is "softmax"
    with causal=True; the cross-attention cfg["cross_attn"]); cross=True
    replaces qkv by q (on the decoder stream) and kv (rows k|v, on the
    encoder memory) and takes ESP's seeded slices from seed 2000 + layer
    instead of 1000 + layer (layer: the block's index, decoder blocks
    counted after the encoder's)."""

    def __init__(self, cfg, layer, reference, kind=None, causal=False, cross=False):
        super().__init__()
        D, H, dh = cfg["dim"], cfg["heads"], head_dim(cfg)
        self.cfg, self.H, self.dh, self.reference = cfg, H, dh, reference
        self.kind = kind = cfg["attn"] if kind is None else kind
        self.causal, self.cross = causal, cross
        if causal and kind != "softmax":
            raise ValueError("only softmax attention has a causal mode")
        self.scale = cfg["attn_scale"] if cfg["attn_scale"] != 0 else dh ** -0.5
        bias = bool(cfg["qkv_bias"])
        if cross:
            self.q = nn.Linear(D, H * dh, bias=bias)
            self.kv = nn.Linear(D, 2 * H * dh, bias=bias)
        else:
            self.qkv = nn.Linear(D, 3 * H * dh, bias=bias)
        if kind == "lot":
            self.lot_z = nn.Parameter(torch.empty(H, cfg["lot_r"], dh))
            self.lot_theta = nn.Parameter(torch.empty(H, cfg["lot_r"]))
        if kind == "diff":
            for v in _DIFF_VECTORS:
                setattr(self, v, nn.Parameter(torch.empty(dh // 2)))
            self.lam_init = diff_port.lambda_init(layer + 1)
            self.subln = diff_port.RMSNorm(eps=cfg["ln_eps"])
        self.proj = nn.Linear(H * dh, D)
        # LOTFormer's ViT ingredients: self-attention of the classifier only
        own = not causal and not cross and cfg["arch"] == "classifier"
        self.cls_mode = cfg["cls_attn"] if own else "full"
        self.dwc = None
        if own and cfg["dwc"]:
            self.dwc = _DWC(dh, cfg["dwc_kernel"], cfg["image_h"] // cfg["patch"],
                            cfg["image_w"] // cfg["patch"])
        if kind == "esp" and cfg["esp_slices"] > 0:
            # Fixed (not trained) slices: not part of the state_dict.
            th = torch.from_numpy(unit_directions((2000 if cross else 1000) + layer,
                                                  cfg["esp_slices"], dh))
            self.register_buffer("esp_theta", th, persistent=False)
        else:
            self.esp_theta = None

    backend = "torch"    # set_backend("c"): the C operators (birkhoff.torch)

    def lot_pivots(self):
        """(Z, theta) as the LOT operator sees them: lot_learn = z or none
        detaches what is not trained, so it gets no gradient (the C engine
        never accumulates it; bk_model_config's lot_learn)."""
        learn = self.cfg["lot_learn"]
        z = self.lot_z if learn != "none" else self.lot_z.detach()
        theta = self.lot_theta if learn == "both" else self.lot_theta.detach()
        return z, theta

    def c_operator(self, q, k, v, lens, kl):
        """The same attention through libbirkhoff's operators (birkhoff.torch's
        autograd Functions): the C engine's own kernels with the parameters
        src/nn/model.c gives them (the library's defaults for the rest).
        float32 on the CPU (softmax and Sinkhorn also on CUDA)."""
        bt = _c_ops()
        c, kind = self.cfg, self.kind
        kw = dict(q_len=lens, k_len=kl, scale=c["attn_scale"] if c["attn_scale"] != 0 else None)
        if self.causal:
            return bt.softmax_attention(q, k, v, causal=True, **kw)
        if kind == "softmax":
            return bt.softmax_attention(q, k, v, **kw)
        if kind == "sinkhorn":
            return bt.sinkhorn_attention(q, k, v, eps=c["sk_eps"], iters=c["sk_iters"], **kw)
        if kind == "unbalanced":
            return bt.unbalanced_attention(q, k, v, eps=c["sk_eps"], iters=c["sk_iters"],
                                           rho=c["sk_rho"], **kw)
        if kind == "esp":
            return bt.esp_attention(q, k, v, theta=self.esp_theta,
                                    sort="soft" if c["esp_soft"] else "hard", t=c["esp_t"],
                                    tau=c["esp_tau"], **kw)
        if kind == "lot":
            z, theta = self.lot_pivots()
            return bt.lot_attention(q, k, v, z, theta, temp=c["lot_temp"],
                                    iters=c["lot_iters"], eps=c["lot_eps"], **kw)
        if kind == "diff":
            lam = diff_port.reparam_lambda(self.diff_lq1, self.diff_lk1, self.diff_lq2,
                                           self.diff_lk2, self.lam_init)
            o = bt.diff_attention(q, k, v, lam.reshape(1).expand(self.H), **kw)
            return self.subln(o) * (1.0 - self.lam_init)
        raise ValueError(f"attention {kind!r} has no C operator here")

    def operator(self, q, k, v, lens, k_lens=None):
        """Attention of q [B, H, Nq, dh], k, v [B, H, Nk, dh] with valid lengths
        lens (queries; None: all Nq) and k_lens (keys; None: lens, i.e.
        self-attention)."""
        c, kind, s = self.cfg, self.kind, self.scale
        kl = lens if k_lens is None else k_lens
        if self.backend == "c":
            return self.c_operator(q, k, v, lens, kl)
        if self.causal:   # query i sees the keys j <= i of its valid block
            def block(qb, kb):
                sc = torch.matmul(qb, kb.transpose(-1, -2)) * s
                n = sc.shape[-1]
                mask = torch.ones(n, n, dtype=torch.bool, device=sc.device).triu(1)
                return torch.softmax(sc.masked_fill(mask, float("-inf")), dim=-1)
            return sk_port._padded_apply(q, k, v, lens, kl, block)[0]
        if kind == "softmax":
            if not self.reference:
                return sk_port.softmax_attention(q, k, v, scale=s, q_len=lens, k_len=kl)[0]
            scores = torch.matmul(q, k.transpose(-1, -2)) * s
            if kl is not None:
                Tk = k.shape[2]
                keep = (torch.arange(Tk, device=k.device).unsqueeze(0)
                        < torch.tensor(kl, device=k.device).unsqueeze(1))
                scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
            return torch.matmul(torch.softmax(scores, dim=-1), v)
        if kind == "sinkhorn":
            if self.reference:   # the reference port's own numerics
                return sk_port.attention(q, k, v, c["sk_iters"], eps=c["sk_eps"], scale=s,
                                         q_len=lens, k_len=kl)[0]
            return sk_port.attention(q, k, v, c["sk_iters"], eps=c["sk_eps"], scale=s,
                                     q_len=lens, k_len=kl, thresh=0.0,
                                     marginal_dtype=None, update="direct")[0]
        if kind == "unbalanced":   # the reference's SinkhornUnbalanced (rho = its q)
            return sk_port.attention(q, k, v, c["sk_iters"], eps=c["sk_eps"], scale=s,
                                     q_len=lens, k_len=kl, thresh=0.0, marginal_dtype=None,
                                     update="direct", rho=c["sk_rho"])[0]
        if kind == "esp":
            return esp_port.esp_semantics(
                q, k, v, sort="soft" if c["esp_soft"] else "hard", t=c["esp_t"],
                tau=c["esp_tau"], cost="sq", out_scale="rows", scale=s,
                theta=self.esp_theta, q_len=lens, k_len=kl)[0]
        if kind == "lot":
            if self.reference and lens is None and c["attn_scale"] == 0:
                # the reference DeiT/Swin port: batched, float32 marginals
                z, theta = self.lot_pivots()
                return lot_port.lot_reference(q, k, v, z, theta,
                                              temp=c["lot_temp"], n_iter=c["lot_iters"],
                                              eps=c["lot_eps"])
            z, theta = self.lot_pivots()
            return lot_port.lot_semantics(q, k, v, z, theta,
                                          temp=c["lot_temp"], iters=c["lot_iters"],
                                          eps=c["lot_eps"], scale=s, q_len=lens, k_len=kl)[0]
        if kind == "diff":   # the operator's default scale is (dh/2)^-1/2
            lam = diff_port.reparam_lambda(self.diff_lq1, self.diff_lk1, self.diff_lq2,
                                           self.diff_lk2, self.lam_init)
            o = diff_port.diff_semantics(q, k, v, lam.expand(self.H),
                                         scale=c["attn_scale"] if c["attn_scale"] != 0 else None,
                                         q_len=lens, k_len=kl, return_attn=False)
            return self.subln(o) * (1.0 - self.lam_init)
        raise ValueError(f"attention {kind!r} has no PyTorch twin")

    def forward(self, x, lens, mem=None, mem_lens=None):
        """x [B, T, D] -> [B, T, D] (proj's bias included). Cross-attention:
        keys and values from mem [B, S, D] with valid lengths mem_lens."""
        B, T, _ = x.shape
        H, dh = self.H, self.dh
        if self.cross:
            S = mem.shape[1]
            q = self.q(x).view(B, T, H, dh).transpose(1, 2)
            kv = self.kv(mem).view(B, S, 2, H, dh).permute(2, 0, 3, 1, 4)
            o = self.operator(q, kv[0], kv[1], lens, mem_lens)
        else:
            # q, k, v = columns [0, I), [I, 2I), [2I, 3I); head h at h*dh + c.
            qkv = self.qkv(x).view(B, T, 3, H, dh).permute(2, 0, 3, 1, 4)
            o = self.self_attention(qkv[0], qkv[1], qkv[2], lens)   # [B, H, T, dh]
        return self.proj(o.transpose(1, 2).reshape(B, T, H * dh))

    def self_attention(self, q, k, v, lens):
        """The operator on every token, or ([CLS] row treated apart) on the
        tokens after [CLS] next to the [CLS] row; plus the DWC branch."""
        if self.cls_mode == "full":
            o = self.operator(q, k, v, lens)
        else:
            c = self.cfg
            rest = self.operator(q[:, :, 1:], k[:, :, 1:], v[:, :, 1:],
                                 None if lens is None else [n - 1 for n in lens])
            o0, _ = lot_port.cls_row_semantics(q[:, :, 0], k, v, mode=self.cls_mode,
                                               scale=self.scale, ps=c["pol_ps"], po=c["pol_po"],
                                               k_len=lens)
            o = torch.cat([o0.unsqueeze(2), rest], dim=2)
        if self.dwc is not None:
            n0 = self.cfg["cls"]
            o = torch.cat([o[:, :, :n0], o[:, :, n0:] + self.dwc(v[:, :, n0:])], dim=2)
        return o


class _MLP(nn.Module):
    def __init__(self, D, M):
        super().__init__()
        self.fc1 = nn.Linear(D, M)
        self.fc2 = nn.Linear(M, D)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def _sublayer(x, f, norm, drop, post_ln):
    """A residual sublayer (f includes its last linear's bias): pre-LN
    x + drop(f(norm(x))), post-LN norm(x + drop(f(x)))."""
    if post_ln:
        return norm(x + drop(f(x)))
    return x + drop(f(norm(x)))


def _mlp_sublayer(cfg):
    """(ln2, mlp) of a block or a MAB: the MLP sub-block and its norm, (None, None) when
    mlp_dim = 0"""
    if cfg["mlp_dim"] <= 0:
        return None, None
    return nn.LayerNorm(cfg["dim"], eps=cfg["ln_eps"]), _MLP(cfg["dim"], cfg["mlp_dim"])


class _Block(nn.Module):
    """Encoder block: x = sub(attn, ln1); x = sub(mlp, ln2) (mlp_dim > 0), the
    sublayers pre-LN (the classifier; seq2seq post_ln=0) or post-LN.

    dec=True: the seq2seq decoder block: causal softmax self-attention (ln1),
    cross-attention on the encoder memory (lnc, cross.q/kv/proj, cross_attn),
    MLP (ln2)."""

    def __init__(self, cfg, layer, reference, dec=False):
        super().__init__()
        D = cfg["dim"]
        self.post_ln = bool(cfg["post_ln"])
        self.ln1 = nn.LayerNorm(D, eps=cfg["ln_eps"])
        if dec:
            self.attn = _Attention(cfg, layer, reference, kind="softmax", causal=True)
            self.lnc = nn.LayerNorm(D, eps=cfg["ln_eps"])
            self.cross = _Attention(cfg, layer, reference, kind=cfg["cross_attn"], cross=True)
        else:
            self.attn = _Attention(cfg, layer, reference)
            self.lnc = self.cross = None
        self.ln2, self.mlp = _mlp_sublayer(cfg)
        self.drop = nn.Dropout(cfg["dropout"])

    def forward(self, x, lens, mem=None, mem_lens=None):
        x = _sublayer(x, lambda h: self.attn(h, lens), self.ln1, self.drop, self.post_ln)
        if self.cross is not None:
            x = _sublayer(x, lambda h: self.cross(h, lens, mem, mem_lens), self.lnc, self.drop,
                          self.post_ln)
        if self.mlp is not None:
            x = _sublayer(x, self.mlp, self.ln2, self.drop, self.post_ln)
        return x


def _c_ops():
    """birkhoff.torch (imported on first use: it loads libbirkhoff)."""
    from . import torch as bt
    return bt


BACKENDS = ("torch", "c")


def _set_backend(model, backend):
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {'|'.join(BACKENDS)}")
    if backend == "c":
        _c_ops()                       # fail here, not in the first forward
    for m in model.modules():
        if isinstance(m, (_Attention, _OTKPool)):
            m.backend = backend
    model.backend = backend
    return model


class _OTKPool(nn.Module):
    """The OTK layer over the valid rows: references pool.otk_z [q, p, k] and,
    with otk_anchors = k > 0, the Nystrom anchors pool.otk_w [k, D] (kept unit
    rows by post_update); log domain, paper convention, the positional
    encoding otk_pe on the plan only."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        K = cfg["otk_anchors"]
        self.otk_w = nn.Parameter(torch.empty(K, cfg["dim"])) if K else None
        self.otk_z = nn.Parameter(torch.empty(cfg["otk_refs"], cfg["otk_supports"], otk_dim(cfg)))

    backend = "torch"

    def options(self):
        """The operator's keyword arguments (birkhoff.otk's names)."""
        c = self.cfg
        kw = {"eps": c["otk_eps"], "iters": c["otk_iters"], "domain": "log", "convention": "paper",
              "sigma": c["otk_sigma"], "eta": c["otk_eta"],
              "pe": None if c["otk_pe"] == "none" else c["otk_pe"], "sigma_pos": c["otk_sigma_pos"]}
        if c["otk_pe"] == "2d":
            kw["grid"] = otk_grid(c)
        return kw

    @torch.no_grad()
    def post_update(self):
        """The anchors back to unit rows (bk_optim_step's last act)."""
        if self.otk_w is not None:
            self.otk_w.div_(self.otk_w.norm(dim=1, keepdim=True).clamp_min(1e-300))

    def forward(self, h, lens):
        kw = self.options()
        if self.backend == "c":       # libbirkhoff's OTK embedding: [B, p, q*k]
            out = _c_ops().otk_embedding(h, self.otk_z, self.otk_w, lengths=lens, **kw)
            return out.reshape(h.shape[0], -1)
        out, _ = otk_port.otk_semantics(h, self.otk_z, lengths=lens, W=self.otk_w, **kw)
        return out.reshape(h.shape[0], -1)                     # [B, p*q*k], [p, q, k] order


class _MAB(nn.Module):
    """A Set Transformer MAB (src/nn/model.c's MAB unit; docs/MODEL.md "Set
    Transformer blocks"): MAB(X, Y) = Z + drop(mlp(ln2(Z))), Z = X +
    drop(cross(lnc(X), lnk(Y))) with cross the decoder's cross-attention
    module (_Attention(cross=True): cross.q on the queries, cross.kv on the
    keys' set, cross.proj) of kind `kind`, pre-LN. unit: the C unit index
    (ESP's seeded slices: 2000 + unit)."""

    def __init__(self, cfg, unit, reference, kind):
        super().__init__()
        D = cfg["dim"]
        self.lnc = nn.LayerNorm(D, eps=cfg["ln_eps"])
        self.lnk = nn.LayerNorm(D, eps=cfg["ln_eps"])
        self.cross = _Attention(cfg, unit, reference, kind=kind, cross=True)
        self.ln2, self.mlp = _mlp_sublayer(cfg)
        self.drop = nn.Dropout(cfg["dropout"])

    def forward(self, x, y, x_lens, y_lens):
        """x [B, Nq, D] the queries' set (valid lengths x_lens, None: all),
        y [B, Nk, D] the keys' (y_lens) -> [B, Nq, D]."""
        yn = self.lnk(y)
        B, Nq, Nk = x.shape[0], x.shape[1], y.shape[1]
        if x_lens is not None or y_lens is not None:   # explicit on both sides
            x_lens = [Nq] * B if x_lens is None else x_lens
            y_lens = [Nk] * B if y_lens is None else y_lens
        x = _sublayer(x, lambda h: self.cross(h, x_lens, yn, y_lens), self.lnc, self.drop, False)
        if self.mlp is not None:
            x = _sublayer(x, self.mlp, self.ln2, self.drop, False)
        return x


class _ISAB(nn.Module):
    """ISAB block l: blocks.l.inducing [m, D]; H = mab0(I, X), out = mab1(X, H)
    (the C units depth + l and l), both of attention cfg["attn"]."""

    def __init__(self, cfg, l, reference):
        super().__init__()
        self.inducing = nn.Parameter(torch.empty(cfg["set_inducing"], cfg["dim"]))
        self.mab0 = _MAB(cfg, cfg["depth"] + l, reference, cfg["attn"])
        self.mab1 = _MAB(cfg, l, reference, cfg["attn"])

    def forward(self, x, lens):
        B = x.shape[0]
        h = self.mab0(self.inducing.expand(B, -1, -1), x, None, lens)
        return self.mab1(x, h, lens, None)


class _PMA(nn.Module):
    """pool = pma: pool.seeds [k, D], pool.rff (Linear-GELU-Linear of width
    mlp_dim; none when 0), pool.mab (attention cfg["pma_attn"], the C unit
    depth (2 depth with ISAB blocks)); features [B, k D]."""

    def __init__(self, cfg, reference):
        super().__init__()
        self.seeds = nn.Parameter(torch.empty(cfg["pma_seeds"], cfg["dim"]))
        self.rff = _MLP(cfg["dim"], cfg["mlp_dim"]) if cfg["mlp_dim"] > 0 else None
        unit = cfg["depth"] * (2 if cfg["set_block"] == "isab" else 1)
        self.mab = _MAB(cfg, unit, reference, cfg["pma_attn"])

    def forward(self, h, lens):
        B = h.shape[0]
        z = self.rff(h) if self.rff is not None else h
        return self.mab(self.seeds.expand(B, -1, -1), z, None, lens).reshape(B, -1)


def _finish_init(module, cfg, backend):
    """the end of Model's and Seq2SeqModel's __init__: the parameter table
    (names and shapes must be MODEL.md's), the initialisation, the backend"""
    module.specs = param_specs(cfg)
    got = {n: tuple(p.shape) for n, p in module.named_parameters()}
    want = {n: tuple(s) for n, s, _ in module.specs}
    assert got == want, f"internal: parameters {got} != specs {want}"
    module.reset_parameters()
    _set_backend(module, backend)


class Model(nn.Module):
    """The birkhoff encoder classifier (docs/MODEL.md) in PyTorch.

    Model(cfg) with cfg a complete configuration dict (resolve_config, or
    parse_config of a checkpoint's "config" metadata). Parameter names are
    those of the checkpoint (param_specs); named_parameters() lists them in
    PyTorch's registration order, ordered_parameters() in the checkpoint's.

    reference: benchmark numerics (see the module docstring); the default is
    the exact parity twin. allow_dropout: accept dropout > 0 (nn.Dropout; its
    masks cannot match the C engine's). Parameters are initialised as
    MODEL.md says (with torch's RNG, so not the C engine's values).
    """

    def __init__(self, cfg, *, reference=False, allow_dropout=False, backend="torch"):
        super().__init__()
        cfg = dict(cfg)
        check_config(cfg)
        if cfg["dropout"] > 0 and not allow_dropout:
            raise ValueError(f"dropout = {cfg['dropout']}: the C engine's dropout masks cannot "
                             f"be reproduced; parity needs dropout = 0 (allow_dropout=True "
                             f"for benchmarks)")
        self.cfg = cfg
        D = cfg["dim"]
        self.embed = _Embed(cfg)
        self.cls = nn.Parameter(torch.empty(D)) if cfg["cls"] else None
        self.pos = nn.Parameter(torch.empty(num_tokens(cfg), D)) if cfg["pos_embed"] else None
        self.drop = nn.Dropout(cfg["dropout"])
        blk = _ISAB if cfg["set_block"] == "isab" else _Block
        self.blocks = nn.ModuleList(blk(cfg, l, reference) for l in range(cfg["depth"]))
        self.norm = nn.LayerNorm(D, eps=cfg["ln_eps"]) if cfg["final_norm"] else None
        self.pool = (_OTKPool(cfg) if cfg["pool"] == "otk" else _PMA(cfg, reference)
                     if cfg["pool"] == "pma" else None)
        self.head = nn.Linear(feature_dim(cfg), cfg["classes"])
        _finish_init(self, cfg, backend)

    def reset_parameters(self):
        """MODEL.md initialisation (torch's RNG): Linear U(+-1/sqrt(in)), LN 1/0,
        CLS, positions, token table N(0, 0.02^2), LOT pivots N(0, 1), masses 0,
        OTK references N(0, 1/k) (k = otk_anchors or D), OTK anchors uniform on
        the unit sphere, ISAB inducing points and PMA seeds N(0, 1/D), diff
        lambda vectors N(0, 0.1^2)."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.LayerNorm, _DWC)):
                m.reset_parameters()
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name in ("cls", "pos", "embed.table"):
                    p.normal_(0.0, 0.02)
                elif name.endswith("lot_z"):
                    p.normal_(0.0, 1.0)
                elif name.endswith("lot_theta"):
                    p.zero_()
                elif name.rsplit(".", 1)[-1] in _DIFF_VECTORS:
                    p.normal_(0.0, 0.1)
                elif name == "pool.seeds" or name.endswith(".inducing"):
                    p.normal_(0.0, self.cfg["dim"] ** -0.5)
                elif name == "pool.otk_z":
                    p.normal_(0.0, otk_dim(self.cfg) ** -0.5)
                elif name == "pool.otk_w":
                    p.normal_(0.0, 1.0)
            self.post_update()

    def post_update(self):
        """The constraints the engine restores after every optimiser update
        (bk_optim_step): the OTK anchors pool.otk_w back to unit rows."""
        if isinstance(self.pool, _OTKPool):
            self.pool.post_update()

    def set_backend(self, backend):
        """backend "torch" (default): the pure-PyTorch operator ports, any
        dtype and device (the oracle's float64 twin). "c": the attention
        operators and the OTK pool run as libbirkhoff's kernels through
        birkhoff.torch's autograd Functions (float32; CPU, and CUDA for
        softmax / Sinkhorn), the same kernels and parameters as the C engine;
        embeddings, LayerNorm, MLP, pooling and the loss stay in torch.
        Returns the model."""
        return _set_backend(self, backend)

    @property
    def config(self):
        """The complete model configuration (a dict: CONFIG_DEFAULTS' keys;
        format_config gives the checkpoint's "config" text)."""
        return self.cfg

    def ordered_parameters(self):
        """[(name, parameter)] in the checkpoint's order."""
        params = dict(self.named_parameters())
        return [(n, params[n]) for n, _, _ in self.specs]

    def decay_flags(self):
        """{name: 1 if weight decay applies}."""
        return {n: d for n, _, d in self.specs}

    def load_tensors(self, tensors):
        """Copy the parameters from a checkpoint's tensors (name -> array); the
        "optim." entries are ignored, every parameter must be present with its
        shape, and no other tensor may be."""
        params = dict(self.named_parameters())
        names = [n for n in tensors if not n.startswith("optim.")]
        missing = sorted(set(params) - set(names))
        extra = sorted(set(names) - set(params))
        if missing or extra:
            raise ValueError(f"checkpoint tensors do not match the model: missing {missing}, "
                             f"unexpected {extra}")
        with torch.no_grad():
            for n in names:
                a = torch.as_tensor(np.asarray(tensors[n]))
                if tuple(a.shape) != tuple(params[n].shape):
                    raise ValueError(f"{n}: shape {tuple(a.shape)}, expected "
                                     f"{tuple(params[n].shape)}")
                params[n].copy_(a.to(params[n].dtype))

    def tensors(self, dtype=np.float32):
        """{name: numpy array} in the checkpoint's order."""
        return {n: p.detach().cpu().numpy().astype(dtype) for n, p in self.ordered_parameters()}

    def valid_lengths(self, lengths, batch):
        """Per-sample valid rows n_b = len[b] + cls as a list (None: all T)."""
        if lengths is None:
            return None
        if self.cfg["input"] == "image":
            raise ValueError("image inputs take no lengths")
        lens = np.asarray(lengths.detach().cpu() if torch.is_tensor(lengths) else lengths)
        lens = [int(v) for v in lens.reshape(-1)]
        if len(lens) != batch or not all(1 <= v <= seq_len(self.cfg) for v in lens):
            raise ValueError(f"lengths must be {batch} values in [1, {seq_len(self.cfg)}]")
        return [v + self.cfg["cls"] for v in lens]

    def features(self, x=None, tokens=None, lengths=None):
        """The pooled features [B, F] fed to the head."""
        c, dt, dev = self.cfg, self.head.weight.dtype, self.head.weight.device
        if c["input"] == "tokens":
            if tokens is None:
                raise ValueError("tokens input: pass tokens")
            tokens = torch.as_tensor(np.asarray(tokens) if not torch.is_tensor(tokens)
                                     else tokens).long().to(dev)
            if tokens.dim() != 2 or tokens.shape[1] != c["max_len"]:
                raise ValueError(f"tokens must be [B, {c['max_len']}]")
            if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= c["vocab"]):
                raise ValueError("token ids must be in [0, vocab)")
            h = self.embed(tokens=tokens)
        else:
            if x is None:
                raise ValueError(f"{c['input']} input: pass x")
            x = torch.as_tensor(x).to(device=dev, dtype=dt)
            if c["input"] == "image":
                want = (c["channels"], c["image_h"], c["image_w"])
            else:
                want = (c["max_points"], c["point_dim"])
            if x.dim() != len(want) + 1 or tuple(x.shape[1:]) != want:
                raise ValueError(f"x must be [B, {', '.join(map(str, want))}]")
            h = self.embed(x=x)
        B = h.shape[0]
        lens = self.valid_lengths(lengths, B)
        if self.cls is not None:
            h = torch.cat([self.cls.expand(B, 1, -1), h], dim=1)
        if self.pos is not None:
            h = h + self.pos
        h = self.drop(h)
        for blk in self.blocks:
            h = blk(h, lens)
        if self.norm is not None:
            h = self.norm(h)
        pool = c["pool"]
        if pool == "cls":
            return h[:, 0]
        if pool in ("otk", "pma"):
            return self.pool(h, lens)
        rows = [h[b] if lens is None else h[b, :lens[b]] for b in range(B)]
        if pool == "mean":
            return torch.stack([r.mean(0) for r in rows])
        # max: torch.argmax returns the first maximal row, which then gets
        # the whole gradient (MODEL.md).
        return torch.stack([r.gather(0, r.argmax(0, keepdim=True))[0] for r in rows])

    def forward(self, x=None, tokens=None, lengths=None):
        """Logits [B, classes]. x: images [B, C, H, W] or points [B, max_points,
        point_dim]; tokens: int [B, max_len]; lengths: valid tokens/points per
        sample (None: all)."""
        return self.head(self.features(x=x, tokens=tokens, lengths=lengths))


def sinusoid_table(N, D):
    """fairseq's sinusoidal positions as the C engine stores them (float32):
    row p = [sin(p w_i), i < h] ++ [cos(p w_i), i < h] (++ [0] for an odd D),
    h = D // 2, w_i = 10000^(-i / (h - 1)) (w_0 = 1 when h = 1)."""
    h = D // 2
    tab = np.zeros((N, D), dtype=np.float64)
    for i in range(h):
        w = math.exp(-math.log(10000.0) * i / (h - 1)) if h > 1 else 1.0
        for p in range(N):
            tab[p, i] = math.sin(p * w)
            tab[p, h + i] = math.cos(p * w)
    return tab.astype(np.float32)


def _as_long(a):
    return (a if torch.is_tensor(a) else torch.as_tensor(np.asarray(a))).long()


def _lengths_list(lengths, B, N, what):
    """Per-sample lengths as a list of ints in [1, N] (None: all N)."""
    if lengths is None:
        return [N] * B
    lens = np.asarray(lengths.detach().cpu() if torch.is_tensor(lengths) else lengths)
    lens = [int(v) for v in lens.reshape(-1)]
    if len(lens) != B or not all(1 <= v <= N for v in lens):
        raise ValueError(f"{what} must be {B} values in [1, {N}]")
    return lens


class Seq2SeqModel(nn.Module):
    """The birkhoff encoder-decoder (arch=seq2seq; docs/MODEL.md
    "Encoder-decoder") in PyTorch, built from the classifier's pieces
    (_Attention with its operators, _MLP, _Block with pre- or post-LN
    sublayers).

    One vocabulary: embed.table [vocab, D] embeds the source and the target
    (x = sqrt(D) table[tok] + pos[t], pos learned (enc.pos, dec.pos),
    sinusoidal or none; rows t >= length zero) and is the output projection
    (logits = h table^T). Encoder: depth blocks of attention cfg["attn"]
    [+ enc.norm] -> memory. Decoder: dec_depth blocks (causal softmax
    self-attention, cross-attention cfg["cross_attn"] on the memory with
    query lengths tgt_len and key lengths len, MLP) [+ dec.norm]. Its input
    is bos, tgt[:, :-1] (teacher forcing); position t predicts tgt[:, t].

    forward(tokens, lengths, tgt, tgt_len) -> logits [B, tgt_max_len, vocab]
    (rows t >= tgt_len zero); seq2seq_loss gives the loss. Parameter names,
    ordered_parameters, decay_flags, load_tensors and tensors as Model's.
    """

    def __init__(self, cfg, *, reference=False, allow_dropout=False, backend="torch"):
        super().__init__()
        cfg = dict(cfg)
        check_config(cfg)
        if cfg["arch"] != "seq2seq":
            raise ValueError("Seq2SeqModel needs arch=seq2seq (Model is the classifier)")
        if cfg["dropout"] > 0 and not allow_dropout:
            raise ValueError(f"dropout = {cfg['dropout']}: the C engine's dropout masks cannot "
                             f"be reproduced; parity needs dropout = 0 (allow_dropout=True "
                             f"for benchmarks)")
        self.cfg = cfg
        D, depth = cfg["dim"], cfg["depth"]
        self.embed = _Embed(cfg)
        self.enc = nn.Module()
        self.dec = nn.Module()
        if cfg["pos_embed"] == 1:
            self.enc.pos = nn.Parameter(torch.empty(cfg["max_len"], D))
            self.dec.pos = nn.Parameter(torch.empty(cfg["tgt_max_len"], D))
        elif cfg["pos_embed"] == 2:
            tab = torch.from_numpy(sinusoid_table(max(cfg["max_len"], cfg["tgt_max_len"]), D))
            self.register_buffer("sin_tab", tab, persistent=False)
        self.enc.blocks = nn.ModuleList(_Block(cfg, l, reference) for l in range(depth))
        self.dec.blocks = nn.ModuleList(_Block(cfg, depth + j, reference, dec=True)
                                        for j in range(cfg["dec_depth"]))
        if cfg["final_norm"]:
            self.enc.norm = nn.LayerNorm(D, eps=cfg["ln_eps"])
            self.dec.norm = nn.LayerNorm(D, eps=cfg["ln_eps"])
        self.drop = nn.Dropout(cfg["dropout"])
        _finish_init(self, cfg, backend)

    def reset_parameters(self):
        """MODEL.md initialisation (torch's RNG): Linear U(+-1/sqrt(in)), LN 1/0,
        token table and learned positions N(0, 1/D) (fairseq's), LOT pivots
        N(0, 1), masses 0, diff lambda vectors N(0, 0.1^2)."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.LayerNorm)):
                m.reset_parameters()
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name in ("embed.table", "enc.pos", "dec.pos"):
                    p.normal_(0.0, self.cfg["dim"] ** -0.5)
                elif name.endswith("lot_z"):
                    p.normal_(0.0, 1.0)
                elif name.endswith("lot_theta"):
                    p.zero_()
                elif name.rsplit(".", 1)[-1] in _DIFF_VECTORS:
                    p.normal_(0.0, 0.1)

    config = Model.config
    set_backend = Model.set_backend
    ordered_parameters = Model.ordered_parameters
    decay_flags = Model.decay_flags
    load_tensors = Model.load_tensors
    tensors = Model.tensors

    def _embed(self, tok, lens, pos):
        """sqrt(D) table[tok] + pos[t], dropout, rows t >= lens[b] zero."""
        B, N = tok.shape
        D = self.cfg["dim"]
        dev = tok.device
        keep = (torch.arange(N, device=dev).unsqueeze(0)
                < torch.tensor(lens, device=dev).unsqueeze(1))   # [B, N]
        tok = tok.masked_fill(~keep, 0)
        h = math.sqrt(D) * self.embed(tokens=tok)
        if pos is not None:
            h = h + pos[:N].to(h.dtype)
        h = self.drop(h)
        return h * keep.unsqueeze(-1).to(h.dtype)

    def _pos(self, which):
        if self.cfg["pos_embed"] == 1:
            return getattr(self, which).pos
        if self.cfg["pos_embed"] == 2:
            return self.sin_tab
        return None

    def encode(self, tokens, lengths=None):
        """The encoder memory [B, max_len, D] (rows t >= len are never read)
        and the source lengths (a list)."""
        c = self.cfg
        tokens = _as_long(tokens).to(self.embed.table.device)
        if tokens.dim() != 2 or tokens.shape[1] != c["max_len"]:
            raise ValueError(f"tokens must be [B, {c['max_len']}]")
        B = tokens.shape[0]
        lens = _lengths_list(lengths, B, c["max_len"], "lengths")
        for b, n in enumerate(lens):
            if int(tokens[b, :n].min()) < 0 or int(tokens[b, :n].max()) >= c["vocab"]:
                raise ValueError("source token ids must be in [0, vocab)")
        h = self._embed(tokens, lens, self._pos("enc"))
        for blk in self.enc.blocks:
            h = blk(h, lens)
        if c["final_norm"]:
            h = self.enc.norm(h)
        return h, lens

    def forward(self, tokens=None, lengths=None, tgt=None, tgt_len=None, x=None):
        """Logits [B, tgt_max_len, vocab] (zero at t >= tgt_len[b])."""
        c = self.cfg
        if tokens is None or tgt is None:
            raise ValueError("seq2seq: pass tokens (source) and tgt (targets)")
        mem, slens = self.encode(tokens, lengths)
        tgt = _as_long(tgt).to(mem.device)
        B, Tm = tgt.shape[0], c["tgt_max_len"]
        if tgt.dim() != 2 or tgt.shape[1] != Tm or B != mem.shape[0]:
            raise ValueError(f"tgt must be [{mem.shape[0]}, {Tm}]")
        tlens = _lengths_list(tgt_len, B, Tm, "tgt_len")
        for b, n in enumerate(tlens):
            if int(tgt[b, :n].min()) < 0 or int(tgt[b, :n].max()) >= c["vocab"]:
                raise ValueError("target token ids must be in [0, vocab)")
        dec_in = torch.cat([torch.full((B, 1), c["bos"], dtype=torch.long, device=tgt.device),
                            tgt[:, :-1]], dim=1)
        h = self._embed(dec_in, tlens, self._pos("dec"))
        for blk in self.dec.blocks:
            h = blk(h, tlens, mem, slens)
        if c["final_norm"]:
            h = self.dec.norm(h)
        logits = h @ self.embed.table.t()
        keep = (torch.arange(Tm, device=logits.device).unsqueeze(0)
                < torch.tensor(tlens, device=logits.device).unsqueeze(1))
        return logits * keep.unsqueeze(-1).to(logits.dtype)


def seq2seq_loss(logits, tgt, tgt_len, ls=0.0):
    """Mean over the valid target tokens (t < tgt_len[b]) of the label-smoothed
    cross-entropy (PyTorch's definition)."""
    tgt = _as_long(tgt)
    B, Tm = tgt.shape
    tlens = _lengths_list(tgt_len, B, Tm, "tgt_len")
    keep = (torch.arange(Tm, device=logits.device).unsqueeze(0)
            < torch.tensor(tlens, device=logits.device).unsqueeze(1))
    tgt = tgt.to(logits.device)
    return F.cross_entropy(logits[keep], tgt[keep], label_smoothing=float(ls))


def build_model(cfg, **kw):
    """Model (classifier) or Seq2SeqModel, as cfg["arch"] says."""
    cfg = resolve_config(cfg) if isinstance(cfg, str) else cfg
    return (Seq2SeqModel if cfg.get("arch") == "seq2seq" else Model)(cfg, **kw)


def model_loss(model, batch, ls=0.0):
    """The model's loss on a batch dict: labels (classifier: x / tokens,
    lengths) or tgt, tgt_len (seq2seq: tokens, lengths)."""
    if isinstance(model, Seq2SeqModel):
        logits = model(tokens=batch["tokens"], lengths=batch.get("lengths"), tgt=batch["tgt"],
                       tgt_len=batch["tgt_len"])
        return logits, seq2seq_loss(logits, batch["tgt"], batch["tgt_len"], ls)
    logits = model(x=batch.get("x"), tokens=batch.get("tokens"), lengths=batch.get("lengths"))
    return logits, loss_fn(logits, batch["labels"], ls)


def loss_fn(logits, labels, ls=0.0):
    """Mean cross-entropy with label smoothing ls (PyTorch's definition)."""
    labels = torch.as_tensor(np.asarray(labels) if not torch.is_tensor(labels) else labels).long()
    labels = labels.to(logits.device)
    return F.cross_entropy(logits, labels, label_smoothing=float(ls))


# ---------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------
def load_checkpoint(path, dtype=torch.float64, verify=True, **model_kw):
    """Read a birkhoff checkpoint and build the twin from it.

    Returns (model, tensors, meta): the model (in dtype, parameters loaded),
    every tensor of the file (optimiser state included) and the metadata.
    """
    tensors, meta = read_safetensors(path, verify=verify)
    if meta.get("format") != "birkhoff":
        raise ValueError(f"{path}: metadata format is {meta.get('format')!r}, not 'birkhoff' "
                         f"(not a birkhoff checkpoint)")
    if verify and "checksum" not in meta:
        raise ValueError(f"{path}: no checksum in the metadata (not written by birkhoff, or edited)")
    if "config" not in meta:
        raise ValueError(f"{path}: checkpoint metadata lacks the model config")
    for key in ("seed", "forward_count"):
        _meta_u64(path, meta, key)
    try:
        cfg = resolve_config(parse_config(meta["config"]))
        if _counts_whole_otk_iterations(meta.get("version")):
            if not 0 <= cfg["otk_iters"] <= 1 << 19:
                raise ValueError(f"otk_iters={cfg['otk_iters']} (whole iterations in a file written "
                                 f"before 0.2.0) is out of range [0, 2^19]")
            cfg["otk_iters"] *= 2      # written before 0.2.0 (as bk_checkpoint_load)
        model = build_model(cfg, **model_kw).to(dtype)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    model.load_tensors(tensors)
    return model, tensors, meta


def _meta_u64(path, meta, key, top=_U64):
    """meta[key] as bk_checkpoint_load reads it: decimal digits, at most top."""
    v = meta.get(key)
    if v is None:
        raise ValueError(f"{path}: checkpoint metadata lacks '{key}'")
    if not (v.isascii() and v.isdigit()) or int(v) > top:
        raise ValueError(f"{path}: bad '{key}' in the metadata (expected a decimal integer in "
                         f"[0, {top}])")
    return int(v)


def save_checkpoint(path, model, optimizer=None, optim_cfg=None, optim_step=0, seed=0,
                    forward_count=0, extra="", version="1"):
    """Write a checkpoint in the format of MODEL.md "Checkpoints" (float32
    parameters in the checkpoint's order, then the optimiser state as
    optim.m/v/buf.<name>, metadata, FNV-1a-64 checksum of the data and the
    header). seed and forward_count must be in [0, 2^64), optim_step in
    [0, 2^63) (ValueError otherwise), as the C loader reads them."""
    for key, v, top in (("seed", seed, _U64), ("forward_count", forward_count, _U64),
                        ("optim_step", optim_step, 2**63 - 1)):
        if not 0 <= int(v) <= top:
            raise ValueError(f"{key}={int(v)} is out of range [0, {top}]")
    tensors = model.tensors(np.float32)
    meta = {"format": "birkhoff", "version": str(version), "config": format_config(model.cfg),
            "optim_step": str(int(optim_step)), "seed": str(int(seed)),
            "forward_count": str(int(forward_count)), "extra": extra}
    if optimizer is not None:
        ocfg = resolve_optim(optim_cfg)
        meta["optim"] = format_optim(ocfg)
        for k, a in optimizer_state(optimizer, model, ocfg).items():
            tensors[k] = a.astype(np.float32)
    write_safetensors(path, tensors, meta, checksum_key="checksum")


def _counts_whole_otk_iterations(version):
    """Checkpoints written before 0.2.0 counted OTK's Sinkhorn iterations
    whole; a version that does not parse as "major.minor" is a current one."""
    try:
        major, minor = (int(x) for x in str(version).split(".")[:2])
    except ValueError:
        return False
    return major == 0 and minor < 2


# ---------------------------------------------------------------------------
# Public API: birkhoff.models.build / load / save
# ---------------------------------------------------------------------------
def _package_version():
    """The birkhoff package's version when this module was imported as part
    of it (the C library's version string), else "1" (a current format)."""
    pkg = sys.modules.get(__package__ or "")
    return str(getattr(pkg, "__version__", "1"))


def build(config=None, *, dtype=torch.float32, device=None, seed=None, **model_kw):
    """A new model (Model, or Seq2SeqModel for arch=seq2seq) from a
    configuration: CONFIG_DEFAULTS overridden by config, a "key=value" text
    (lines, commas or spaces; a checkpoint's "config" metadata is one) or a
    dict. Initialised as MODEL.md says, with torch's generator (seed: drawn
    from torch.manual_seed(seed) in a forked RNG, leaving torch's global
    state alone; None: from the global generator), so not with the C
    engine's values (`birkhoff model init` draws those). model_kw:
    backend="torch"|"c" (Model.set_backend), reference, allow_dropout (see
    Model)."""
    cfg = resolve_config(config)
    if seed is None:
        model = build_model(cfg, **model_kw)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            model = build_model(cfg, **model_kw)
    return model.to(device=device, dtype=dtype)


def from_config(text, **kw):
    """build() from a configuration text (a checkpoint's "config" metadata,
    `birkhoff model show`'s config lines, a comma list)."""
    if not isinstance(text, str):
        raise TypeError("from_config takes a configuration text (build takes a dict)")
    return build(text, **kw)


def load(path, dtype=torch.float32, device=None, *, verify=True, optimizer=False,
         backend="torch", reference=False):
    """A birkhoff checkpoint (written by the C engine: `birkhoff train`,
    `birkhoff model init/train`, ... or by save()) as a torch nn.Module.

    Returns the Model / Seq2SeqModel with the checkpoint's weights in dtype
    (float32 by default, the checkpoint's own precision; float64 for the
    oracle's parity runs) on device, in eval mode: .config is its
    configuration dict, .checkpoint_meta the file's metadata (the optimiser
    configuration and step, seed, forward_count, the run's "extra" lines),
    which save() carries over by default. Parameter names are the
    checkpoint's tensor names (state_dict() keys == param_specs names).

    optimizer=True: returns (model, opt, optim_config, step) with opt the
    torch.optim optimiser of the checkpoint's optimiser configuration
    (make_optimizer: AdamW / Adam / SGD, the decay and no-decay groups) with
    its state (m, v or the momentum buffer) and step count, so that
    train_step(model, opt, optim_config, step, batch) continues the run as
    the C engine would; a checkpoint without optimiser state raises
    ValueError.

    Errors: a missing file raises FileNotFoundError (OSError); a truncated,
    corrupt (checksum), non-birkhoff or unbuildable checkpoint (attn=asap,
    unknown configuration keys) raises ValueError naming the file and the
    problem. verify=False skips the checksum (not the structure checks).
    backend="c": the attention operators and the OTK pool run as
    libbirkhoff's kernels (Model.set_backend; float32).
    """
    model, tensors, meta = load_checkpoint(os.fspath(path), dtype=dtype, verify=verify,
                                           reference=reference, backend=backend)
    model.checkpoint_meta = dict(meta)
    if device is not None:
        model = model.to(device)
    model.eval()
    if not optimizer:
        return model
    if "optim" not in meta:
        raise ValueError(f"{path}: the checkpoint holds no optimiser state (no 'optim' metadata)")
    try:
        ocfg = resolve_optim({"decay_embed": 1, **parse_optim(meta["optim"])})  # before issue 43: 1
        step = _meta_u64(path, meta, "optim_step", 2**63 - 1)
        opt = make_optimizer(model, ocfg, tensors, step)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return model, opt, ocfg, step


_OPT_KIND = {torch.optim.AdamW: "adamw", torch.optim.Adam: "adam", torch.optim.SGD: "sgd"}


def optim_config_of(optimizer, model):
    """The bk_optim_config (a dict, OPTIM_DEFAULTS' keys) that a torch.optim
    AdamW / Adam / SGD over model's parameters stands for: kind, lr (the
    groups' initial_lr when a torch LR scheduler set one, else lr), betas,
    eps, momentum, nesterov, and weight_decay, which the C engine applies to
    the decay tensors only (Linear weights, token table; MODEL.md): the
    groups holding decay tensors must agree on it. Schedules, warm-up and
    clipping are not part of a torch optimiser: pass them to save() as
    optim_config. Raises ValueError for what the C optimisers do not have
    (another optimiser class, amsgrad, maximize, SGD dampening, parameters
    that are not the model's)."""
    kind = _OPT_KIND.get(type(optimizer))
    if kind is None:
        raise ValueError(f"{type(optimizer).__name__}: the C engine has AdamW, Adam and SGD only "
                         f"(pass optim_config and optimizer=None to save the weights alone)")
    names = {id(p): n for n, p in model.named_parameters()}
    flags = model.decay_flags()
    groups = optimizer.param_groups
    for g in groups:
        for p in g["params"]:
            if id(p) not in names:
                raise ValueError("the optimiser holds parameters that are not the model's")
        if g.get("amsgrad") or g.get("maximize") or g.get("dampening", 0.0):
            raise ValueError("amsgrad, maximize and SGD dampening have no C counterpart")
    oc = dict(OPTIM_DEFAULTS)
    g0 = groups[0]
    lrs = {float(g.get("initial_lr", g["lr"])) for g in groups}
    if len(lrs) != 1:
        raise ValueError(f"the parameter groups have different learning rates {sorted(lrs)}: "
                         f"the C engine has one (pass optim_config)")
    oc["kind"], oc["lr"] = kind, lrs.pop()
    wds = {float(g["weight_decay"]) for g in groups
           if any(flags[names[id(p)]] == 1 for p in g["params"])}
    if len(wds) > 1:
        raise ValueError(f"the groups holding decay tensors have different weight decays "
                         f"{sorted(wds)} (pass optim_config)")
    oc["weight_decay"] = wds.pop() if wds else 0.0
    # the token tables decay (decay_embed=1) when their group's decay is the others'
    ewds = {float(g["weight_decay"]) for g in groups
            if any(flags[names[id(p)]] == DECAY_EMBED for p in g["params"])}
    oc["decay_embed"] = int(bool(ewds) and ewds != {0.0} and ewds == {oc["weight_decay"]})
    if kind == "sgd":
        oc["momentum"], oc["nesterov"] = float(g0["momentum"]), int(bool(g0["nesterov"]))
    else:
        oc["beta1"], oc["beta2"] = (float(b) for b in g0["betas"])
        oc["eps"] = float(g0["eps"])
    return oc


def _optimizer_step(optimizer, ocfg):
    """The optimiser's step count: Adam's state "step" (all parameters
    agree); SGD keeps none (None)."""
    if ocfg["kind"] == "sgd":
        return None
    steps = {int(float(st["step"])) for st in optimizer.state.values() if "step" in st}
    if len(steps) > 1:
        raise ValueError(f"the parameters have different Adam step counts {sorted(steps)}: "
                         f"pass step")
    return steps.pop() if steps else 0


def save(path, model, optimizer=None, *, optim_config=None, step=None, seed=None,
         forward_count=None, extra=None, config=None):
    """Write a birkhoff checkpoint (MODEL.md "Checkpoints") that the CLI
    evaluates and fine-tunes: `birkhoff model grads/train --ckpt`, `birkhoff
    train --init`, and `birkhoff eval` when the run's metadata is there.

    model: a birkhoff.models Model / Seq2SeqModel (any dtype or device; a
    DistributedDataParallel or other wrapper with .module is unwrapped), or a
    state_dict (name -> tensor) together with config= (text or dict). The
    parameters are written as float32 in the checkpoint's order.

    optimizer: a torch.optim AdamW / Adam / SGD over the model's parameters
    (None: weights only). Its state goes to "optim.<slot>.<name>" and its
    configuration (optim_config_of, or optim_config: a text or dict, e.g.
    with the schedule) to the "optim" metadata, so `birkhoff model train`
    without --optim continues it. step: the optimiser's step count (default:
    Adam's own; SGD keeps none: required when momentum buffers exist).

    seed, forward_count, extra: the metadata (the model's RNG seed and
    forward counter, which only dropout uses, and the caller's "key=value"
    lines; `birkhoff train` keeps its run there, which `birkhoff eval`
    needs); default: those of the checkpoint the model was loaded from, else
    0, 0, "". The file is written to a temporary file in the same directory,
    synced and renamed over path (atomic: a reader sees the old file or the
    new one). Returns path.
    """
    if isinstance(model, dict) or (hasattr(model, "keys") and not isinstance(model, nn.Module)):
        if config is None:
            raise ValueError("save(path, state_dict): pass config= (the model's configuration)")
        if optimizer is not None:
            raise ValueError("save(path, state_dict, optimizer): pass the model itself (the "
                             "optimiser's state is keyed by its parameters)")
        state = model
        model = build_model(resolve_config(config))
        model.load_tensors({n: (t.detach().cpu().numpy() if torch.is_tensor(t) else np.asarray(t))
                            for n, t in state.items()})
    else:
        while not hasattr(model, "ordered_parameters") and hasattr(model, "module"):
            model = model.module             # DistributedDataParallel, DataParallel
        if not (hasattr(model, "ordered_parameters") and hasattr(model, "cfg")):
            raise TypeError(f"save: a birkhoff.models model or a state_dict expected, got "
                            f"{type(model).__name__}")
        if config is not None and resolve_config(config) != model.cfg:
            raise ValueError("save: config= differs from the model's own configuration")
        have = {n for n, _ in model.named_parameters()}
        want = {n for n, _, _ in model.specs}
        if have != want:
            raise ValueError(f"the model's parameters are not those of its configuration: "
                             f"unexpected {sorted(have - want)}, missing {sorted(want - have)}")
    old = getattr(model, "checkpoint_meta", None) or {}
    if seed is None:
        seed = int(old.get("seed", "0"))
    if forward_count is None:
        forward_count = int(old.get("forward_count", "0"))
    if extra is None:
        extra = old.get("extra", "")
    ocfg = None
    if optimizer is not None:
        ocfg = (resolve_optim(optim_config) if optim_config is not None
                else optim_config_of(optimizer, model))
        if step is None:
            step = _optimizer_step(optimizer, ocfg)
            if step is None:
                if optimizer.state and ocfg["momentum"]:
                    raise ValueError("SGD keeps no step count: pass step= (the number of "
                                     "optimiser steps taken)")
                step = 0
    elif optim_config is not None:
        raise ValueError("optim_config without optimizer: the C engine needs the optimiser "
                         "state with it (save the weights alone, or pass the optimiser)")
    path = os.fspath(path)
    save_checkpoint(path, model, optimizer, ocfg, optim_step=int(step or 0), seed=int(seed),
                    forward_count=int(forward_count), extra=str(extra),
                    version=_package_version())
    return path


# ---------------------------------------------------------------------------
# Optimisers and schedules
# ---------------------------------------------------------------------------
def lr_at(ocfg, step):
    """Learning rate at 0-based step i (MODEL.md): warm-up lr (i+1)/warmup for
    i < warmup, then constant, step (lr gamma^k, k = milestones <= i), cosine
    lr_min + (lr - lr_min)(1 + cos(pi (i - warmup)/(total_steps - warmup)))/2,
    held at lr_min from total_steps on, or invsqrt (fairseq's inverse_sqrt)
    lr sqrt(max(warmup, 1) / (i + 1))."""
    lr, w = ocfg["lr"], ocfg["warmup"]
    if step < w:
        return lr * (step + 1) / w
    sched = ocfg["sched"]
    if sched == "constant":
        return lr
    if sched == "step":
        return lr * ocfg["gamma"] ** sum(1 for m in ocfg["milestones"] if m <= step)
    if sched == "invsqrt":     # fairseq's inverse_sqrt
        return lr * math.sqrt(max(w, 1) / (step + 1))
    if sched == "cosine":
        T, lo = ocfg["total_steps"], ocfg["lr_min"]
        if step >= T:
            return lo
        return lo + (lr - lo) * (1.0 + math.cos(math.pi * (step - w) / (T - w))) / 2.0
    raise ValueError(f"unknown schedule {sched!r}")


_SLOTS = {"adamw": (("m", "exp_avg"), ("v", "exp_avg_sq")),
          "adam": (("m", "exp_avg"), ("v", "exp_avg_sq")),
          "sgd": (("buf", "momentum_buffer"),)}


def make_optimizer(model, ocfg, tensors=None, step=0):
    """torch.optim optimiser for the model under ocfg (a resolved optimiser dict).

    Two parameter groups in the checkpoint's order: the decay tensors (Linear
    weights, token table) with ocfg's weight_decay and the others with 0.
    tensors/step: a checkpoint's tensors and its optim_step, to resume (the
    "optim.<slot>.<name>" entries become the optimiser state).
    """
    flags = model.decay_flags()
    named = model.ordered_parameters()
    groups = [{"params": [p for n, p in named if decays(flags[n], ocfg)], "weight_decay": ocfg["weight_decay"]},
              {"params": [p for n, p in named if not decays(flags[n], ocfg)], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    kind, lr = ocfg["kind"], ocfg["lr"]
    if kind in ("adamw", "adam"):
        cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
        opt = cls(groups, lr=lr, betas=(ocfg["beta1"], ocfg["beta2"]), eps=ocfg["eps"],
                  foreach=False)
    elif kind == "sgd":
        opt = torch.optim.SGD(groups, lr=lr, momentum=ocfg["momentum"], dampening=0.0,
                              nesterov=bool(ocfg["nesterov"]), foreach=False)
    else:
        raise ValueError(f"unknown optimiser {kind!r}")
    if tensors is not None and step > 0:
        for n, p in named:
            st = {}
            for slot, key in _SLOTS[kind]:
                name = f"optim.{slot}.{n}"
                if name not in tensors:
                    if kind == "sgd" and ocfg["momentum"] == 0:
                        continue                     # torch keeps no buffer then
                    raise ValueError(f"checkpoint has no {name}")
                st[key] = torch.as_tensor(np.asarray(tensors[name])).to(p.dtype).clone()
            if kind != "sgd":
                st["step"] = torch.tensor(float(step))
            if st:
                opt.state[p] = st
    return opt


def optimizer_state(opt, model, ocfg):
    """{"optim.<slot>.<name>": array} of the optimiser's state (zeros where
    torch has none yet; SGD without momentum has no buffer)."""
    kind = ocfg["kind"]
    out = {}
    for slot, key in _SLOTS[kind]:
        if kind == "sgd" and ocfg["momentum"] == 0:
            continue
        for n, p in model.ordered_parameters():
            t = opt.state.get(p, {}).get(key)
            out[f"optim.{slot}.{n}"] = (np.zeros(tuple(p.shape)) if t is None
                                        else t.detach().cpu().numpy())
    return out


def train_step(model, opt, ocfg, step, batch, ls=0.0, micro=0):
    """One optimiser step on batch, as bk_train_step.

    batch: dict with labels and x or tokens (lengths optional); seq2seq:
    tokens, lengths (optional), tgt and tgt_len. step: the number of steps
    already taken (0-based index for the schedule). Gradients are zeroed,
    accumulated over micro-batches of at most `micro` samples (0: one pass)
    with weight B_micro / B (seq2seq: the micro-batch's target tokens over the
    batch's: the loss is the token-weighted mean), clipped (global L2 norm,
    clip > 0), the group learning rates set to lr_at(step), the optimiser
    stepped, and the model's constraints restored (model.post_update: the OTK
    anchors' unit rows, as bk_optim_step). Returns (mean loss of the batch,
    pre-clip gradient norm).
    """
    params = [p for _, p in model.ordered_parameters()]
    for p in params:
        p.grad = None
    s2s = isinstance(model, Seq2SeqModel)
    keys = ("tokens", "lengths", "tgt", "tgt_len") if s2s else ("x", "tokens", "lengths", "labels")
    B = len(np.asarray(batch["tgt_len" if s2s else "labels"]))
    weights = (np.asarray(batch["tgt_len"], dtype=np.float64) if s2s else np.ones(B))
    mb = B if micro <= 0 else micro
    total = 0.0
    for s in range(0, B, mb):
        sl = slice(s, min(B, s + mb))
        part = {k: (None if batch.get(k) is None else np.asarray(batch[k])[sl]) for k in keys}
        loss = model_loss(model, part, ls)[1]
        w = float(weights[sl].sum() / weights.sum())
        (loss * w).backward()
        total += float(loss.detach()) * w
    for p in params:           # every tensor steps (and decays) as in the C engine
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if ocfg["clip"] > 0:
        gnorm = float(torch.nn.utils.clip_grad_norm_(params, ocfg["clip"]))
    else:
        gnorm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)))
    for g in opt.param_groups:
        g["lr"] = lr_at(ocfg, step)
    opt.step()
    if hasattr(model, "post_update"):   # the constraints bk_optim_step restores
        model.post_update()
    return total, gnorm


# ---------------------------------------------------------------------------
# Random inputs
# ---------------------------------------------------------------------------
def random_batch(cfg, B, rng, padded=False):
    """A random batch for cfg: float32 x / int32 tokens, int32 lengths when
    padded (tokens/points only; one sample full, one of length 1), int32
    labels."""
    c = cfg
    out = {"x": None, "tokens": None, "lengths": None}
    if c["input"] == "image":
        out["x"] = rng.standard_normal((B, c["channels"], c["image_h"], c["image_w"])).astype(
            np.float32)
    elif c["input"] == "tokens":
        out["tokens"] = rng.integers(0, c["vocab"], (B, c["max_len"])).astype(np.int32)
    else:
        out["x"] = rng.standard_normal((B, c["max_points"], c["point_dim"])).astype(np.float32)
    if padded and c["input"] != "image":
        n = seq_len(c)
        lens = rng.integers(1, n + 1, B)
        lens[0] = n
        if B > 1:
            lens[1] = 1
        out["lengths"] = lens.astype(np.int32)
    out["labels"] = rng.integers(0, c["classes"], B).astype(np.int32)
    if c.get("arch") == "seq2seq":
        out = random_seq2seq_batch(c, B, rng, padded)
    return out


def random_seq2seq_batch(cfg, B, rng, padded=False):
    """A random seq2seq batch: int32 tokens [B, max_len] and tgt [B,
    tgt_max_len] (ids in [0, vocab); each sentence ends with eos at its
    length - 1, padding holds random ids), lengths (None unless padded) and
    tgt_len [B]. Padded: source and target lengths drawn in [1, max]; sample
    0 full on both sides, sample 1 a length-1 target (EOS only), sample 2 (B
    > 2) a length-1 source."""
    c = cfg
    S, Tm, V = c["max_len"], c["tgt_max_len"], c["vocab"]
    tokens = rng.integers(0, V, (B, S)).astype(np.int32)
    tgt = rng.integers(0, V, (B, Tm)).astype(np.int32)
    if padded:
        lens = rng.integers(1, S + 1, B)
        tl = rng.integers(1, Tm + 1, B)
        lens[0], tl[0] = S, Tm
        if B > 1:
            tl[1] = 1
            lens[1] = max(1, S - 1)
        if B > 2:
            lens[2] = 1
    else:
        lens, tl = np.full(B, S), np.full(B, Tm)
    for b in range(B):
        tokens[b, lens[b] - 1] = c["eos"]
        tgt[b, tl[b] - 1] = c["eos"]
    return {"x": None, "tokens": tokens, "lengths": lens.astype(np.int32) if padded else None,
            "tgt": tgt, "tgt_len": tl.astype(np.int32), "labels": None}


# ---------------------------------------------------------------------------
# Benchmark
# ---------------------------------------------------------------------------
def bench(config, batch, steps, warmup, threads, seed=0):
    """Time full training steps; returns the JSON-ready result dict."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    cfg = resolve_config(config)
    model = build_model(cfg, reference=True, allow_dropout=True).float()
    model.train()
    ocfg = resolve_optim(None)
    opt = make_optimizer(model, ocfg)
    data = random_batch(cfg, batch, np.random.default_rng(seed))
    if cfg.get("arch") == "seq2seq":
        # full-length sentences (as the C benchmark's batch): ids >= 4, EOS last
        rng = np.random.default_rng(seed)
        for k, n in (("tokens", cfg["max_len"]), ("tgt", cfg["tgt_max_len"])):
            data[k] = rng.integers(4, cfg["vocab"], (batch, n)).astype(np.int32)
            data[k][:, n - 1] = cfg["eos"]
        data["lengths"] = None
        data["tgt_len"] = np.full(batch, cfg["tgt_max_len"], dtype=np.int32)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        train_step(model, opt, ocfg, i, data)
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    med = float(np.median(times))
    tokens = batch * cfg["tgt_max_len"] if cfg.get("arch") == "seq2seq" else batch
    return {"samples_per_s": batch / med, "tokens_per_s": tokens / med, "step_s_median": med,
            "step_s_p25": float(np.percentile(times, 25)),
            "step_s_p75": float(np.percentile(times, 75)),
            "threads": threads, "torch": torch.__version__, "batch": batch, "steps": steps,
            "params": int(sum(p.numel() for p in model.parameters())), "attn": cfg["attn"]}


# ---------------------------------------------------------------------------
# Self-check: /usr/bin/python3 bench/peers/model_torch.py --self-check
# ---------------------------------------------------------------------------
_SELF_CASES = [
    # (config, padded)
    ("input=image,image_h=8,image_w=8,patch=4,channels=2,dim=8,depth=2,heads=2,mlp_dim=12,"
     "classes=3,attn=softmax,pool=cls,qkv_bias=1", False),
    ("input=image,image_h=4,image_w=4,patch=2,dim=8,depth=1,heads=2,mlp_dim=8,classes=3,"
     "attn=sinkhorn,sk_iters=4,sk_eps=0.5,pool=mean", False),
    ("input=tokens,vocab=7,max_len=5,dim=8,depth=1,heads=2,mlp_dim=0,classes=3,"
     "attn=sinkhorn,sk_iters=5,pool=max,cls=0,final_norm=0", True),
    ("input=points,point_dim=3,max_points=5,dim=8,depth=1,heads=2,head_dim=3,mlp_dim=8,"
     "classes=3,attn=lot,lot_r=3,lot_iters=5,lot_temp=0.7,pool=otk,otk_refs=2,"
     "otk_supports=2,otk_iters=6", True),
    ("input=tokens,vocab=9,max_len=5,dim=8,depth=1,heads=2,mlp_dim=8,classes=3,"
     "attn=esp,esp_soft=1,esp_t=0.3,esp_tau=2,esp_slices=3,pool=mean", True),
    ("input=image,image_h=4,image_w=4,patch=2,dim=8,depth=1,heads=2,mlp_dim=8,classes=3,"
     "attn=esp,esp_soft=0,esp_tau=3,pool=cls", False),
    ("input=tokens,vocab=9,max_len=5,dim=8,depth=2,heads=2,mlp_dim=8,classes=3,"
     "attn=diff,pool=mean", True),
    # LOTFormer's ViT ingredients: Pol-[CLS] and the DWC branch on a 2 x 3 grid, the
    # [CLS]-softmax row with padded tokens
    ("input=image,image_h=4,image_w=6,patch=2,dim=8,depth=1,heads=2,mlp_dim=8,classes=3,"
     "attn=lot,lot_r=2,cls_attn=pol,dwc=1,pool=cls", False),
    ("input=tokens,vocab=9,max_len=5,dim=8,depth=1,heads=2,mlp_dim=8,classes=3,"
     "attn=sinkhorn,sk_iters=3,cls_attn=softmax,pool=mean", True),
    # Set Transformer: ISAB blocks + PMA (2 seeds), SAB + PMA without rFF
    ("input=points,point_dim=3,max_points=5,dim=8,depth=1,heads=2,mlp_dim=8,classes=3,cls=0,"
     "pos_embed=0,set_block=isab,set_inducing=2,attn=sinkhorn,sk_iters=3,pool=pma,pma_seeds=2",
     True),
    ("input=tokens,vocab=9,max_len=5,dim=8,depth=1,heads=2,mlp_dim=0,classes=3,attn=softmax,"
     "pool=pma,pma_attn=esp,esp_t=0.3", True),
    # the supervised OTK layer: Nystrom anchors, 2-D PE on a 2 x 2 patch grid, no blocks
    ("input=image,image_h=4,image_w=4,patch=2,dim=8,depth=0,cls=0,classes=3,pool=otk,"
     "otk_anchors=3,otk_supports=4,otk_pe=2d,otk_sigma_pos=0.5", False),
]


_SELF_S2S_CASES = [
    "arch=seq2seq,input=tokens,vocab=7,max_len=4,tgt_max_len=4,dim=8,depth=1,dec_depth=2,"
    "heads=2,mlp_dim=8,attn=softmax,cross_attn=softmax,pos_embed=1",
    "arch=seq2seq,input=tokens,vocab=7,max_len=5,tgt_max_len=3,dim=7,depth=1,dec_depth=1,"
    "heads=2,head_dim=4,mlp_dim=6,attn=lot,lot_r=2,cross_attn=sinkhorn,sk_iters=3,post_ln=1,"
    "pos_embed=2,final_norm=0,qkv_bias=1",
]


def _manual_optim_step(ocfg, p, g, st, t, lr, decay):
    """MODEL.md's update formulas, written out (float64 numpy)."""
    wd = ocfg["weight_decay"] if decay else 0.0
    if ocfg["kind"] == "sgd":
        g = g + wd * p
        mu = ocfg["momentum"]
        st["buf"] = g.copy() if t == 1 else mu * st["buf"] + g
        return p - lr * (g + mu * st["buf"] if ocfg["nesterov"] else st["buf"])
    b1, b2 = ocfg["beta1"], ocfg["beta2"]
    if ocfg["kind"] == "adamw":
        p = p * (1 - lr * wd)
    else:
        g = g + wd * p
    st["m"] = b1 * st.get("m", 0.0) + (1 - b1) * g
    st["v"] = b2 * st.get("v", 0.0) + (1 - b2) * g * g
    return p - (lr / (1 - b1 ** t)) * st["m"] / (np.sqrt(st["v"]) / math.sqrt(1 - b2 ** t)
                                                 + ocfg["eps"])


def _gradcheck_params(model, kw):
    """torch.autograd.gradcheck of model(**kw) with respect to every parameter
    (float64 model)"""
    names = [n for n, _ in model.ordered_parameters()]
    leaves = [p.detach().clone().requires_grad_(True) for _, p in model.ordered_parameters()]

    def f(*ps):
        return torch.nn.utils.stateless.functional_call(model, dict(zip(names, ps)), (), kw)
    return torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-6, rtol=1e-5)


def _self_check():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    worst, ok = {}, True

    def note(key, val):
        worst[key] = max(worst.get(key, 0.0), float(val))

    with tempfile.TemporaryDirectory(prefix="bk_model_torch_") as tmp:
        for text, padded in _SELF_CASES:
            cfg = resolve_config(text)
            model = Model(cfg).double()
            data = random_batch(cfg, 3, rng, padded)
            kw = {k: data[k] for k in ("x", "tokens", "lengths")}
            # 1. configuration and checkpoint round trips.
            assert resolve_config(format_config(cfg)) == cfg
            path = os.path.join(tmp, "m.safetensors")
            ocfg = resolve_optim("kind=adam,lr=0.01,weight_decay=0.1,sched=step,"
                                 "milestones=2:4,gamma=0.5")
            opt = make_optimizer(model, ocfg)
            train_step(model, opt, ocfg, 0, data)
            save_checkpoint(path, model, opt, ocfg, optim_step=1, seed=5)
            m2, tens, meta = load_checkpoint(path)
            assert [n for n in tens if not n.startswith("optim.")] == [n for n, _, _ in
                                                                          param_specs(cfg)]
            assert resolve_optim(parse_optim(meta["optim"])) == ocfg
            note("checkpoint round trip (float32 rounding)",
                 max(float((p - q).abs().max()) for (_, p), (_, q) in
                     zip(model.ordered_parameters(), m2.ordered_parameters())))
            # resumed (float32-rounded parameters and state) == continued
            o2 = make_optimizer(m2, ocfg, tens, int(meta["optim_step"]))
            for i in (1, 2):
                train_step(m2, o2, ocfg, i, data)
                train_step(model, opt, ocfg, i, data)
            note("resume == continue", max(float((p - q).abs().max()) for (_, p), (_, q) in
                                           zip(model.ordered_parameters(),
                                               m2.ordered_parameters())))
            # 2. padding invariance: changing padded tokens / points changes nothing.
            if padded:
                d2 = {k: (None if v is None else v.copy()) for k, v in kw.items()}
                for b, n in enumerate(data["lengths"]):
                    if cfg["input"] == "tokens":
                        d2["tokens"][b, n:] = (d2["tokens"][b, n:] + 1) % cfg["vocab"]
                    else:
                        d2["x"][b, n:] = 1e3
                note("padding invariance (logits)", (model(**kw) - model(**d2)).abs().max())
            # the benchmark numerics agree (float32 marginals: ~1e-8)
            ref_model = Model(cfg, reference=True).double()
            ref_model.load_state_dict(model.state_dict())
            note("reference numerics vs exact (logits)",
                 (ref_model(**kw) - model(**kw)).abs().max())
            # 3. gradcheck of the logits w.r.t. every parameter.
            gc = _gradcheck_params(model, kw)
            print(f"gradcheck {cfg['input']}/{cfg['attn']}/{cfg['pool']}: {gc}")
            ok = ok and gc
        # 4. corruption detection.
        raw = open(path, "rb").read()
        hlen = struct.unpack("<Q", raw[:8])[0]
        at = 8 + hlen + 5
        for label, blob in (("flipped data byte", raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:]),
                            ("truncated", raw[:-3]), ("truncated header", raw[:20])):
            with open(path, "wb") as fh:
                fh.write(blob)
            try:
                read_safetensors(path)
                print(f"corruption not detected: {label}")
                ok = False
            except ValueError as e:
                if label == "flipped data byte" and "checksum" not in str(e):
                    ok = False
    # 5. torch.optim == MODEL.md's formulas (with groups, schedule, clipping).
    cfg = resolve_config(_SELF_CASES[0][0])
    data = random_batch(cfg, 3, rng)
    for text in ("kind=adamw,lr=0.01,weight_decay=0.1,clip=0.05,warmup=2,sched=cosine,"
                 "total_steps=4,lr_min=0.001",
                 "kind=adam,lr=0.01,weight_decay=0.1,beta1=0.8,sched=step,milestones=1:3,gamma=0.3",
                 "kind=sgd,lr=0.1,momentum=0.9,weight_decay=0.01",
                 "kind=sgd,lr=0.1,momentum=0.9,nesterov=1,weight_decay=0.01,clip=0.01"):
        ocfg = resolve_optim(text)
        model = Model(cfg).double()
        ref = {n: p.detach().numpy().copy() for n, p in model.ordered_parameters()}
        flags = model.decay_flags()
        opt = make_optimizer(model, ocfg)
        states = {n: {} for n in ref}
        for t in range(1, 6):
            # gradient at the reference point, computed with the same model
            with torch.no_grad():
                saved = {n: p.detach().clone() for n, p in model.ordered_parameters()}
                for n, p in model.ordered_parameters():
                    p.copy_(torch.from_numpy(ref[n]))
            model.zero_grad()
            loss_fn(model(x=data["x"]), data["labels"]).backward()
            g = {n: p.grad.detach().numpy().copy() for n, p in model.ordered_parameters()}
            with torch.no_grad():
                for n, p in model.ordered_parameters():
                    p.copy_(saved[n])
            norm = math.sqrt(sum(float((v ** 2).sum()) for v in g.values()))
            if ocfg["clip"] > 0 and norm > ocfg["clip"]:
                g = {n: v * (ocfg["clip"] / (norm + 1e-6)) for n, v in g.items()}
            lr = lr_at(ocfg, t - 1)
            ref = {n: _manual_optim_step(ocfg, ref[n], g[n], states[n], t, lr, decays(flags[n], ocfg))
                   for n in ref}
            train_step(model, opt, ocfg, t - 1, data)
            note("torch.optim vs MODEL.md formulas",
                 max(float(np.abs(p.detach().numpy() - ref[n]).max())
                     for n, p in model.ordered_parameters()))
    # 5b. the encoder-decoder: gradcheck, padding invariance, checkpoint round trip.
    with tempfile.TemporaryDirectory(prefix="bk_model_torch_") as tmp:
        for text in _SELF_S2S_CASES:
            cfg = resolve_config(text)
            model = build_model(cfg).double()
            data = random_batch(cfg, 3, rng, True)
            kw = {k: data[k] for k in ("tokens", "lengths", "tgt", "tgt_len")}
            path = os.path.join(tmp, "s2s.safetensors")
            save_checkpoint(path, model)
            m2, tens, _ = load_checkpoint(path)
            assert isinstance(m2, Seq2SeqModel)
            assert list(tens) == [n for n, _, _ in param_specs(cfg)]
            note("checkpoint round trip (float32 rounding)",
                 max(float((p - q).abs().max()) for (_, p), (_, q) in
                     zip(model.ordered_parameters(), m2.ordered_parameters())))
            d2 = {k: (None if v is None else v.copy()) for k, v in kw.items()}
            for b in range(3):
                n, t = data["lengths"][b], data["tgt_len"][b]
                d2["tokens"][b, n:] = (d2["tokens"][b, n:] + 1) % cfg["vocab"]
                d2["tgt"][b, t:] = (d2["tgt"][b, t:] + 1) % cfg["vocab"]
            note("padding invariance (logits)", (model(**kw) - model(**d2)).abs().max())
            gc = _gradcheck_params(model, kw)
            print(f"gradcheck seq2seq/{cfg['attn']}/{cfg['cross_attn']}/post_ln={cfg['post_ln']}: "
                  f"{gc}")
            ok = ok and gc
    # 6. schedules.
    oc = resolve_optim("lr=2,warmup=3,sched=invsqrt")
    note("invsqrt schedule", max(abs(lr_at(oc, i) - w) for i, w in
                                 enumerate([2 / 3, 4 / 3, 2, 2 * math.sqrt(3 / 4),
                                            2 * math.sqrt(3 / 5)])))
    oc = resolve_optim("lr=1,warmup=2,sched=cosine,total_steps=6,lr_min=0.1")
    want = [0.5, 1.0, 1.0, 0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2, 0.55,
            0.1 + 0.9 * (1 + math.cos(3 * math.pi / 4)) / 2, 0.1, 0.1]
    note("cosine schedule", max(abs(lr_at(oc, i) - w) for i, w in enumerate(want)))
    oc = resolve_optim("lr=1,sched=step,gamma=0.5,milestones=2:4")
    note("step schedule", max(abs(lr_at(oc, i) - w) for i, w in
                              enumerate([1, 1, 0.5, 0.5, 0.25, 0.25])))
    # 7. seeded slices: unit rows, deterministic.
    th = unit_directions(1000, 5, 7)
    note("ESP slices: |row norm - 1|",
         np.abs(np.linalg.norm(th.astype(np.float64), axis=1) - 1).max())
    assert np.array_equal(th, unit_directions(1000, 5, 7))
    assert not np.array_equal(th, unit_directions(1001, 5, 7))
    tols = {"checkpoint round trip (float32 rounding)": 1e-6, "ESP slices: |row norm - 1|": 1e-6,
            "resume == continue": 1e-6, "torch.optim vs MODEL.md formulas": 1e-10,
            "reference numerics vs exact (logits)": 1e-6}
    for key, val in worst.items():
        good = val <= tols.get(key, 1e-12)
        ok = ok and good
        print(f"{key:44s} {val:.3e}{'' if good else '  FAIL'}")
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", action="store_true", help="time training steps (JSON line)")
    ap.add_argument("--self-check", action="store_true", help="float64 checks of the twin")
    ap.add_argument("--config", default="", help="model configuration overrides k=v,k=v")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.self_check:
        torch.set_num_threads(1)
        ok = _self_check()
        print("self-check", "ok" if ok else "FAIL")
        return 0 if ok else 1
    if a.bench:
        if a.batch < 1 or a.steps < 1 or a.warmup < 0 or a.threads < 1:
            ap.error("--batch, --steps, --threads must be >= 1 and --warmup >= 0")
        try:
            res = bench(a.config, a.batch, a.steps, a.warmup, a.threads, a.seed)
        except ValueError as e:
            ap.error(str(e))
        print(json.dumps(res), flush=True)
        return 0
    ap.error("nothing to do: pass --bench or --self-check")


if __name__ == "__main__":
    sys.exit(main())
