#!/usr/bin/env bash
# Regenerates the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).
# The seeds are small and committed; this script documents how they were made.
# Needs python3 and the CLI (./build/birkhoff, `make`) for the checkpoints.
#   tests/fuzz/make_corpus.sh [CLI]
set -euo pipefail
cd "$(dirname "$0")/../.."
CLI=${1:-./build/birkhoff}
C=tests/fuzz/corpus
rm -rf "$C"
mkdir -p "$C"/{idx,digits,mail,config,ckpt,npy,npz,parallel,labelled}

python3 - "$C" <<'PY'
import struct, sys
C = sys.argv[1]
def w(path, data):
    with open(f"{C}/{path}", "wb") as f:
        f.write(data)
# IDX: 2 images of 3x3 and 2 labels
w("idx/images-2x3x3", struct.pack(">I3I", 0x803, 2, 3, 3) + bytes(range(0, 180, 10)))
w("idx/labels-2", struct.pack(">II", 0x801, 2) + bytes([3, 7]))
# digits: 2 rows of 64 pixels in 0..16 and a label
r1 = ",".join(str(i % 17) for i in range(64)) + ",5"
r2 = ",".join(str((3 * i) % 17) for i in range(64)) + ",9"
w("digits/two-rows.csv", (r1 + "\n" + r2 + "\n").encode())
w("digits/crlf.csv", (r1 + "\r\n" + r2 + "\r\n").encode())
# mail
w("mail/lf.eml", b"From: a@example.com\nTo: b@example.com\nSubject: hi\n\nHello,\nbody text.\n")
w("mail/crlf.eml", b"From: a@example.com\r\nSubject: hi\r\n\r\nHello\r\n")
# config: run, model and optimiser keys
w("config/small.cfg", b"# a small run\n"
  b"data = digits\nepochs = 2\nbatch=16\nseed = 7  # comment\n\n"
  b"dim = 32\nheads = 4\nattn = sinkhorn\nsk_iters = 3\nmlp_dim = 64\n"
  b"lr = 1e-3\nkind = adamw\nsched = cosine\nmilestones = 10:20\nls = 0.1\n"
  b"data_dir = /tmp/some dir\nprogress = none\nnoise = 0.05\n")
w("config/set-first-line.cfg", b"epochs=3\ndim=16\n")
# npy: float32 [2, 3] (format 1.0), int32 [4] (format 2.0)
def npy(descr, shape, payload, version=1):
    sh = "(" + "".join(f"{d}, " if len(shape) > 1 else f"{d}," for d in shape).rstrip(", ") + \
         ("," if len(shape) == 1 else "") + ")"
    d = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {sh}, }}"
    pre = 10 if version == 1 else 12
    pad = (64 - (pre + len(d) + 1) % 64) % 64
    h = (d + " " * pad + "\n").encode()
    ln = struct.pack("<H", len(h)) if version == 1 else struct.pack("<I", len(h))
    return b"\x93NUMPY" + bytes([version, 0]) + ln + h + payload
w("npy/f32-2x3.npy", npy("<f4", (2, 3), struct.pack("<6f", 0, 1, -2.5, 3.25, 1e-3, 7)))
w("npy/i32-4-v2.npy", npy("<i4", (4,), struct.pack("<4i", 1, -2, 3, 2**31 - 1), version=2))
w("npy/scalar.npy", npy("<f4", (), struct.pack("<f", 1.5)))
w("npy/u8-2x2.npy", npy("|u1", (2, 2), bytes([0, 7, 128, 255])))
w("npy/i64-3.npy", npy("<i8", (3,), struct.pack("<3q", 5, -1, 2**40)))
# npz: x, y (and lengths) as np.savez writes them (zip64 local headers,
# stored) and np.savez_compressed (deflated), built with zipfile
import io, zipfile
def npz(members, method, zip64=True):
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", method) as z:
        for name, data in members:
            with z.open(name, "w", force_zip64=zip64) as f:
                f.write(data)
    return b.getvalue()
img = [("x.npy", npy("|u1", (3, 2, 2), bytes(range(0, 240, 20)))), ("y.npy", npy("<i8", (3,), struct.pack("<3q", 0, 2, 1)))]
w("npz/images-stored.npz", npz(img, zipfile.ZIP_STORED))
w("npz/images-deflated.npz", npz(img, zipfile.ZIP_DEFLATED, zip64=False))
tok = [("x.npy", npy("<i4", (2, 3), struct.pack("<6i", 4, 1, 9, 2, 0, 0))), ("y.npy", npy("<i4", (2,), struct.pack("<2i", 1, 0))),
       ("lengths.npy", npy("<i4", (2,), struct.pack("<2i", 3, 1)))]
w("npz/tokens-lengths.npz", npz(tok, zipfile.ZIP_STORED))
pts = [("x.npy", npy("<f4", (2, 2, 3), struct.pack("<12f", *[0.5 * i for i in range(12)]))),
       ("y.npy", npy("|u1", (2,), bytes([1, 0]))), ("lengths.npy", npy("<i8", (2,), struct.pack("<2q", 2, 1)))]
w("npz/points-deflated.npz", npz(pts, zipfile.ZIP_DEFLATED))
# parallel: source NUL target (two line-aligned files); without a NUL, the same text on both sides
w("parallel/es-en.txt", "En el principio crió Dios los cielos y la tierra.\n¿Dónde\testás?\n".encode()
  + b"\0" + "In the beginning, God created the heavens and the earth.\nWhere are you? \U0001F600\n".encode())
w("parallel/one-side-no-final-newline.txt", "Amén.\nAleluya.".encode())
# labelled: an options byte (bit 0 CSV, bit 1 header, bits 2-3 label column - 1, bits 4-5 text column - 1), the file
w("labelled/tsv-named.txt", b"\x10" + "pos\tA fine film.\nneg\t  Too long; dull.\r\n1\tcafé ñandú\n".encode())
w("labelled/csv-quoted-header.txt",
  b"\x1b" + b'id,text,label\r\n1,"a, ""quoted"" text\nover two lines",spam\r\n2,plain,ham\n')
w("labelled/tsv-no-final-newline.txt", b"\x10" + b" 0 \tone\n1\ttwo\t extra column")
PY

cfg="input=image,image_h=4,image_w=4,patch=2,dim=8,depth=1,heads=2,mlp_dim=8,classes=2"
"$CLI" model init --config "$cfg" --out "$C/ckpt/image.ckpt" >/dev/null
"$CLI" model init --config "$cfg,attn=sinkhorn,sk_iters=2" --optim "kind=sgd,momentum=0.9" \
  --out "$C/ckpt/sgd.ckpt" >/dev/null
"$CLI" model init --config "input=tokens,vocab=5,max_len=4,dim=4,depth=1,heads=1,mlp_dim=0,classes=2,pool=mean,cls=0" \
  --out "$C/ckpt/tokens.ckpt" >/dev/null
# a compiled ASAP layer in the metadata (head_dim 4, one slice)
"$CLI" model init --config "$cfg,attn=asap" --out "$C/ckpt/asap.tmp" >/dev/null
python3 - "$C/ckpt/asap.tmp" "$C/ckpt/asap.ckpt" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
hl = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + hl])
data = b[8 + hl:]
layer = ("d=4 slices=1 scale=0x1p-1 eps=0x1p+0 teacher_iters=5 fit=0 lambda=0x0p+0 seed=1 theta_given=0 "
         "calib_problems=0 calib_rows=0 theta=0x1p+0:0x0p+0:0x0p+0:0x0p+0 omega=0x1p+0")
meta = hdr["__metadata__"]
meta["asap.0"] = layer
meta["checksum"] = "0" * 16  # (docs/MODEL.md "Checkpoints": the data, then the header with these as '0's)
text = json.dumps(hdr, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
h = 0xcbf29ce484222325
for c in data + text:
    h = ((h ^ c) * 0x100000001b3) & (2**64 - 1)
text = text.replace(b'"checksum":"0000000000000000"', b'"checksum":"%016x"' % h)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data)
PY
rm -f "$C/ckpt/asap.tmp"
find "$C" -type f | sort | while read -r f; do printf '%6d %s\n' "$(wc -c <"$f")" "$f"; done
