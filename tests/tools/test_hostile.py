#!/usr/bin/python3
"""Hostile inputs, files and failures (issue 41) for every `birkhoff` command.

A table of cases (class, command, argv, setup, expectation), each run in a
fresh working directory with a timeout, a memory limit and umask 022:

  missing      a named input (file or directory) that does not exist
  empty        an empty input file (or an empty run directory)
  truncated    valid .npy / .safetensors / .asap / config / metrics files cut at several points
  huge         headers claiming huge shapes or lengths, /dev/zero as an input, `yes` piped
               as standard input, absurd sizes given as flags
  nonregular   a directory or a FIFO (fed by a writer thread) as an input; a directory or a
               FIFO (drained by a reader thread) as an output
  symlink      a symlink at an output path the user named (followed: its target replaced
               whole on success, untouched on failure, the link kept), a dangling one, symlinks to
               a victim at the predictable temporary paths (OUT.staged, OUT.tmp.<pid>, ...) and
               at the files of a run directory: those victims are never written through
  device       an output that is a character device (a private mknod of /dev/null's 1,3)
               or a symlink to /proc/self/fd/1 (what /dev/stdout is): written into or
               refused, never replaced
  readonly     an output inside a read-only directory (chattr +i when root)
  nonutf8      control bytes (ANSI escapes, \\r, 0xFF) in paths, flag values, config and
               text files: stderr never echoes a raw control byte
  nul          NUL bytes in config and text files
  intrange     -1, 2**31, 2**32+5, 2**64, 1e23, 12abc for every integer flag and key
  float        nan, inf, -inf, 1e39 for every float flag and key; finite inputs whose
               scores overflow float32 (q, k ~ 1e20; --scale 1e38): refused, or finite outputs
  specs        the user's datasets (FORMAT:PATH): array and text files that are FIFOs,
               directories, /dev/zero, cut archives, for data inspect and train --data
  killed       SIGKILL while a large output or a checkpoint is written: the old output is
               intact and the leftovers are gone after the next run of the same command
               (or named by it)
  allornone    two outputs where the second cannot be written: neither is committed
  perms        every output of every command: mode 0644 under umask 022 (0600 under 077)

Every case checks: no signal death, no hang (a timeout fails), the exit status
(1 runtime, 2 usage; 0 only where the case allows it) with a "birkhoff ..."
line on stderr naming the file or flag, no raw control byte on stderr, no
success with a non-finite output, no file touched that was not named
(snapshots of the working directory, the fixtures and the victims), named
outputs complete (rc 0) or absent/unchanged (rc != 0), no temporary files left.

Run: /usr/bin/python3 tests/tools/test_hostile.py build/birkhoff
     [--class NAME]... [--list-failures FILE] [--jobs N] [--timeout S] [--keep] [-v]
Prints a table of attempts / passed / failed per class; exits 1 if any case fails."""
import argparse
import concurrent.futures as cf
import json
import os
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from checklib import Checks  # noqa: E402

CLASSES = ("missing", "empty", "truncated", "huge", "nonregular", "symlink", "device", "readonly", "nonutf8",
           "nul", "intrange", "float", "killed", "allornone", "perms", "specs")
ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("cli", nargs="?", default="build/birkhoff")
ap.add_argument("--class", dest="only", action="append", choices=CLASSES, help="run this class only (repeatable)")
ap.add_argument("--list-failures", metavar="FILE", help="write the failing cases to FILE")
ap.add_argument("--jobs", type=int, default=3, help="cases run at once (default 3)")
ap.add_argument("--timeout", type=float, default=10.0, help="seconds a command may run (default 10)")
ap.add_argument("--keep", action="store_true", help="keep the working directories")
ap.add_argument("-v", action="store_true", help="print every case")
A = ap.parse_args()
BK = os.path.abspath(A.cli)
MEM_LIMIT = 1 << 30          # RLIMIT_DATA of every command: a refusal, not the OOM killer
HUGE_RSS = 256 << 20         # a huge header or endless input may not make birkhoff use more than this
STDIN_RSS = 512 << 20        # `yes` on standard input (at most BK_TEXT_MAX_LINES short lines)
check = Checks(limit=1500)
if not os.access(BK, os.X_OK):
    sys.exit("test_hostile: %s is not an executable" % BK)

BASE = tempfile.mkdtemp(prefix="bk_hostile_")
os.chmod(BASE, 0o755)
F = os.path.join(BASE, "fixtures")
os.mkdir(F)
IS_ROOT = os.geteuid() == 0
VICTIM = b"VICTIM: must never be written through\n"
TEMP_MARKS = (".tmp", ".staged", ".old", ".bk-", "tmp.", ".part")


def looks_temporary(name):
    return any(m in name for m in TEMP_MARKS)


# ---------------------------------------------------------------------------------------------
# fixtures: tiny inputs, models, runs (made once; every case reads them and must not change them)
# ---------------------------------------------------------------------------------------------
def fx(name):
    return os.path.join(F, name)


def bk_setup(*args):
    p = subprocess.run([BK, *args], cwd=F, capture_output=True, timeout=300)
    if p.returncode != 0:
        sys.exit("test_hostile: fixture command failed: birkhoff %s\n%s" % (" ".join(args),
                 (p.stdout + p.stderr).decode(errors="replace")))


TINY_CONF = ("# a seconds-long run on the generated point clouds\n"
             "data = shapes\npoints = 16\ngen_train = 32\ngen_test = 16\nepochs = 1\nbatch = 16\n"
             "dim = 8\ndepth = 1\nheads = 1\nmlp_dim = 8\ncls = 0\npool = mean\nprogress = none\n")
TOK_CFG = "input=tokens,vocab=12,max_len=6,dim=8,depth=1,heads=1,mlp_dim=8,classes=2"
PTS_CFG = "input=points,point_dim=3,max_points=8,dim=8,depth=1,heads=1,mlp_dim=8,classes=2,cls=0,pool=mean"
S2S_CFG = "arch=seq2seq,input=tokens,vocab=12,max_len=8,tgt_max_len=8,dim=8,depth=1,dec_depth=1,heads=1,mlp_dim=8"


def make_fixtures():
    rng = np.random.default_rng(0)
    f32 = lambda *s: rng.standard_normal(s).astype("<f4")  # noqa: E731
    np.save(fx("q.npy"), f32(1, 1, 3, 4))
    np.save(fx("k.npy"), f32(1, 1, 5, 4))
    np.save(fx("v.npy"), f32(1, 1, 5, 4))
    np.save(fx("do.npy"), f32(1, 1, 3, 4))
    np.save(fx("ql.npy"), np.array([3], "<i4"))
    np.save(fx("kl.npy"), np.array([5], "<i4"))
    np.save(fx("qbig.npy"), np.load(fx("q.npy")) * np.float32(1e20))
    np.save(fx("kbig.npy"), np.load(fx("k.npy")) * np.float32(1e20))
    np.save(fx("lam.npy"), np.array([0.5], "<f4"))
    np.save(fx("sl.npy"), f32(2, 4))
    np.save(fx("Z.npy"), f32(1, 2, 4))
    np.save(fx("th.npy"), f32(1, 2))
    x = f32(2, 4, 3) * np.float32(0.5)
    np.save(fx("ox.npy"), x)
    np.save(fx("oxbig.npy"), x * np.float32(1e20))
    np.save(fx("olen.npy"), np.array([4, 3], "<i4"))
    w = rng.standard_normal((2, 3))
    np.save(fx("ow.npy"), (w / np.linalg.norm(w, axis=1, keepdims=True)).astype("<f4"))
    np.save(fx("oz.npy"), f32(1, 2, 2) * np.float32(0.5))
    np.save(fx("oz4.npy"), f32(1, 4, 2) * np.float32(0.5))
    np.save(fx("T.npy"), rng.integers(4, 12, (4, 6)).astype("<i4"))
    np.save(fx("L.npy"), np.array([6, 5, 4, 3], "<i4"))
    np.save(fx("Y.npy"), np.array([0, 1, 0, 1], "<i4"))
    np.save(fx("X.npy"), f32(4, 8, 3))
    np.save(fx("Xbig.npy"), np.load(fx("X.npy")) * np.float32(1e20))
    open(fx("tiny.conf"), "w").write(TINY_CONF)
    open(fx("hyp.txt"), "w").write("the cat sat on the mat\na b c d\n")
    open(fx("ref.txt"), "w").write("the cat sat on a mat\na b c e\n")
    open(fx("in.ids"), "w").write("4 5 6\n7 8\n9\n")
    bk_setup("asap", "generate", "--b", "1", "--h", "1", "--n", "8", "--d", "4", "--seed", "1",
             "--out-q", "aq.npy", "--out-k", "ak.npy", "--out-v", "av.npy")
    bk_setup("asap", "calibrate", "--q", "aq.npy", "--k", "ak.npy", "--teacher-iters", "4", "--slices", "4",
             "--out", "l.asap")
    bk_setup("model", "init", "--config", TOK_CFG, "--out", "m.st")
    bk_setup("model", "init", "--config", PTS_CFG, "--out", "mp.st")
    bk_setup("model", "init", "--config", S2S_CFG, "--out", "s2s.st")
    bk_setup("train", "--config", "tiny.conf", "--out", "run")
    bk_setup("train", "--config", "tiny.conf", "--attn", "sinkhorn", "--out", "run_sk")
    bk_setup("asap", "compile", "--ckpt", "run_sk/last.safetensors", "--out", "asap.st", "--samples", "16", "--batch",
             "16", "--slices", "4")
    # a run stopped after its first step, for --resume
    p = subprocess.run([BK, "train", "--config", "tiny.conf", "--epochs", "2", "--stop-after", "1", "--out",
                        "run_cut"], cwd=F, capture_output=True, timeout=300)
    if p.returncode != 130:
        sys.exit("test_hostile: fixture run_cut: status %d\n%s" % (p.returncode, p.stderr.decode(errors="replace")))


# ---------------------------------------------------------------------------------------------
# snapshots
# ---------------------------------------------------------------------------------------------
def sig(st, target=None):
    """what must not change: type, mode, and for non-directories size, mtime, inode, link target"""
    if stat.S_ISDIR(st.st_mode):
        return ("d", st.st_mode)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):   # FIFO, device: reading one is no change
        return (stat.S_IFMT(st.st_mode), st.st_mode, st.st_ino, st.st_rdev)
    return (stat.S_IFMT(st.st_mode), st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino, st.st_rdev, target)


def snapshot(root):
    snap = {}
    if not os.path.lexists(root):
        return snap
    stack = [""]
    while stack:
        rel = stack.pop()
        full = os.path.join(root, rel) if rel else root
        try:
            entries = list(os.scandir(full))
        except OSError:
            continue
        for e in entries:
            r = os.path.join(rel, e.name) if rel else e.name
            try:
                st = os.lstat(e.path)
            except OSError:
                continue
            tgt = os.readlink(e.path) if stat.S_ISLNK(st.st_mode) else None
            snap[r] = sig(st, tgt)
            if stat.S_ISDIR(st.st_mode):
                stack.append(r)
    return snap


FSNAP = None  # the fixtures' snapshot, taken once they are made


# ---------------------------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------------------------
class Case:
    """One attempt. argv: strings with {W} (the case's working directory, also the cwd), {F}
    (fixtures) and {V} (the victims' directory) placeholders, or bytes with b"{W}" for names
    that are not UTF-8. expect: "refuse" (status in rcs), "ok" (status 0) or "either".
    names: one of them must appear on a "birkhoff ..." line of stderr when refused. outputs:
    the paths (relative to W) the command may create or change (a directory: all below it).
    setup(ctx) prepares W; post(ctx, res) returns a list of problems."""

    def __init__(self, cls, cmd, argv, expect="refuse", names=(), outputs=(), setup=None, post=None, rcs=(1, 2),
                 stdin=None, timeout=None, serial=False, finite=False, umask=0o022, perms=False, runner=None,
                 maxrss=None, what=""):
        self.cls, self.cmd, self.argv, self.expect = cls, cmd, list(argv), expect
        self.names, self.outputs, self.setup, self.post = list(names), list(outputs), setup, post
        self.rcs, self.stdin, self.timeout, self.serial = tuple(rcs), stdin, timeout, serial
        self.finite, self.umask, self.perms, self.runner, self.maxrss = finite, umask, perms, runner, maxrss
        self.what = what


class Ctx:
    def __init__(self, root):
        self.root = root
        self.w = os.path.join(root, "w")
        self.v = os.path.join(root, "v")
        os.mkdir(self.w)
        os.mkdir(self.v)
        self.victims = {}      # path -> bytes it must keep
        self.keep_type = {}    # path -> stat.S_IFMT it must keep (devices, FIFOs, symlinks, directories)
        self.planted = set()   # relative paths that may disappear (planted at temporary names)
        self.followed = set()  # victims named through a symlink the user gave as an output: replaced
        #                        whole on success (the link followed, as every Unix tool does), else kept
        self.immutable = []    # directories made read-only (undone after the case)
        self.threads = []
        self.stop = threading.Event()
        self.env = {}
        self.notes = []

    def W(self, *p):
        return os.path.join(self.w, *p)

    def victim(self, name="victim"):
        p = os.path.join(self.v, name)
        with open(p, "wb") as f:
            f.write(VICTIM)
        self.victims[p] = VICTIM
        return p


class Result:
    def __init__(self):
        self.rc, self.out, self.err, self.timed_out, self.elapsed, self.maxrss = None, b"", b"", False, 0.0, 0


def fmt(argv, ctx):
    out = []
    for a in argv:
        if isinstance(a, bytes):
            out.append(a.replace(b"{W}", os.fsencode(ctx.w)).replace(b"{F}", os.fsencode(F))
                       .replace(b"{V}", os.fsencode(ctx.v)))
        else:
            out.append(a.replace("{W}", ctx.w).replace("{F}", F).replace("{V}", ctx.v))
    return out


def launch(case, ctx, argv, stdin=None):
    """starts birkhoff argv in W (new session, memory limit, the case's umask); stdout and stderr
    go to files beside W"""
    def pre():
        os.umask(case.umask)
        resource.setrlimit(resource.RLIMIT_DATA, (MEM_LIMIT, MEM_LIMIT))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    env = dict(os.environ, BK_DATA=os.path.join(ctx.root, "no-data"), LC_ALL="C")
    env.update(ctx.env)
    fo = open(os.path.join(ctx.root, "stdout"), "wb")
    fe = open(os.path.join(ctx.root, "stderr"), "wb")
    try:
        p = subprocess.Popen([BK, *argv], cwd=ctx.w, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                             stdout=fo, stderr=fe, preexec_fn=pre, start_new_session=True, env=env)
    finally:
        fo.close()
        fe.close()
    return p


def peak_rss(pid):
    """the peak resident set of birkhoff (VmHWM once it has exec'd; the rusage of a child
    forked from this process would count this process's own memory)"""
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            st = f.read()
    except OSError:
        return 0
    if b"Name:\tbirkhoff" not in st:
        return 0
    i = st.find(b"VmHWM:")
    return int(st[i + 6:st.index(b"kB", i)]) * 1024 if i >= 0 else 0


def reap(p, ctx, timeout, res, t0, on_poll=None):
    """waits for p (wait4: its own peak RSS), killing its session at the timeout"""
    hwm = 0
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            break
        hwm = max(hwm, peak_rss(p.pid))
        if on_poll is not None and on_poll():
            on_poll = None
        if time.time() - t0 > timeout:
            res.timed_out = True
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            pid, status, ru = os.wait4(p.pid, 0)
            break
        time.sleep(0.002)
    p.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    res.rc, res.maxrss = p.returncode, hwm
    res.elapsed = time.time() - t0
    res.out = open(os.path.join(ctx.root, "stdout"), "rb").read()
    res.err = open(os.path.join(ctx.root, "stderr"), "rb").read()
    return res


def run_plain(case, ctx):
    res = Result()
    stdin, feeder = None, None
    if case.stdin == "yes":
        feeder = subprocess.Popen(["yes"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        stdin = feeder.stdout
    elif isinstance(case.stdin, bytes):
        path = os.path.join(ctx.root, "stdin")
        open(path, "wb").write(case.stdin)
        stdin = open(path, "rb")
    t0 = time.time()
    try:
        p = launch(case, ctx, fmt(case.argv, ctx), stdin)
    finally:
        if feeder is not None:
            feeder.stdout.close()
        elif stdin is not None:
            stdin.close()
    reap(p, ctx, case.timeout or A.timeout, res, t0)
    if feeder is not None:
        feeder.kill()
        feeder.wait()
    return res


# ---- FIFO helpers -----------------------------------------------------------------------------
def start_thread(ctx, go):
    """runs go() beside the case; the case ends it through ctx.stop"""
    t = threading.Thread(target=go, daemon=True)
    ctx.threads.append(t)
    t.start()


def fifo_writer(ctx, path, data):
    """feeds data into the FIFO when a reader opens it (never blocks past the case)"""
    def go():
        fd = None
        while not ctx.stop.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                time.sleep(0.003)
        if fd is None:
            return
        view = memoryview(data)
        try:
            while view and not ctx.stop.is_set():
                try:
                    n = os.write(fd, view[:65536])
                    view = view[n:]
                except BlockingIOError:
                    time.sleep(0.002)
        except OSError:
            pass
        os.close(fd)
    start_thread(ctx, go)


def fifo_reader(ctx, path):
    """drains the FIFO (an output) until the case ends"""
    def go():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return
        try:
            while not ctx.stop.is_set():
                try:
                    if not os.read(fd, 65536):
                        time.sleep(0.003)
                except BlockingIOError:
                    time.sleep(0.002)
        except OSError:
            pass
        os.close(fd)
    start_thread(ctx, go)


def make_fifo(ctx, rel):
    p = ctx.W(rel)
    os.mkfifo(p)
    ctx.keep_type[p] = stat.S_IFIFO
    return p


# ---- read-only directories --------------------------------------------------------------------
def make_readonly(ctx, rel):
    p = ctx.W(rel)
    os.makedirs(p, exist_ok=True)
    if IS_ROOT:
        r = subprocess.run(["chattr", "+i", p], capture_output=True)
        if r.returncode != 0:
            return None
        ctx.immutable.append(p)
    else:
        os.chmod(p, 0o555)
    return p


def undo_readonly(ctx):
    for p in ctx.immutable:
        subprocess.run(["chattr", "-i", p], capture_output=True)
    ctx.immutable = []


# ---- file checks ------------------------------------------------------------------------------
def complete(path):
    """'' when the file at path is a complete file of its kind (by its name), else the problem"""
    try:
        st = os.lstat(path)
    except OSError:
        return "absent"
    if not stat.S_ISREG(st.st_mode):
        return ""
    name = os.path.basename(path)
    try:
        if name.endswith(".npy"):
            np.load(path, allow_pickle=False)
        elif name.endswith(".safetensors") or name.endswith(".st"):
            b = open(path, "rb").read()
            n = struct.unpack("<Q", b[:8])[0]
            h = json.loads(b[8:8 + n])
            end = max([t["data_offsets"][1] for k, t in h.items() if k != "__metadata__"] or [0])
            if 8 + n + end != len(b):
                return "safetensors size %d, header says %d" % (len(b), 8 + n + end)
        elif name.endswith(".json"):
            json.loads(open(path, "rb").read())
        elif name.endswith(".png"):
            b = open(path, "rb").read()
            if not b.startswith(b"\x89PNG\r\n\x1a\n") or b"IEND" not in b[-16:]:
                return "not a complete PNG"
        elif name.endswith(".svg"):
            if b"</svg>" not in open(path, "rb").read()[-64:]:
                return "not a complete SVG"
        elif name.endswith(".asap"):
            if not open(path, "rb").read(8).startswith(b"BKASAP"):
                return "not an ASAP layer"
    except Exception as e:  # noqa: BLE001
        return "unreadable %s: %s" % (name, str(e)[:120])
    return ""


def nonfinite(path):
    """'' unless the .npy or checkpoint at path holds a non-finite float"""
    name = os.path.basename(path)
    try:
        if name.endswith(".npy"):
            arrays = [np.load(path, allow_pickle=False)]
        elif name.endswith(".safetensors") or name.endswith(".st"):
            b = open(path, "rb").read()
            n = struct.unpack("<Q", b[:8])[0]
            h = json.loads(b[8:8 + n])
            arrays = [np.frombuffer(b, "<f4", (t["data_offsets"][1] - t["data_offsets"][0]) // 4,
                                    8 + n + t["data_offsets"][0])
                      for k, t in h.items() if k != "__metadata__" and t.get("dtype") == "F32"]
        else:
            return ""
    except Exception:  # noqa: BLE001
        return ""
    bad = sum(int((~np.isfinite(a)).sum()) for a in arrays if a.dtype.kind == "f")
    return "%s holds %d non-finite values" % (name, bad) if bad else ""


def raw_controls(b):
    bad = sorted({c for c in b if (c < 0x20 and c not in (9, 10)) or c == 0x7F})
    try:
        b.decode("utf-8")
        utf = True
    except UnicodeDecodeError:
        utf = False
    out = []
    if bad:
        out.append("raw control bytes %s" % ", ".join("0x%02x" % c for c in bad))
    if not utf:
        out.append("bytes that are not UTF-8 (e.g. a raw 0xFF)")
    return "; ".join(out)


def under(rel, outs):
    return any(rel == o or rel.startswith(o.rstrip("/") + "/") for o in outs)


def judge(case, ctx, res, before, vbefore):
    """the contract: returns the list of problems"""
    pr = []
    if res.timed_out:
        pr.append("hang: killed after %.0f s" % (case.timeout or A.timeout))
    elif res.rc is not None and res.rc < 0:
        pr.append("killed by signal %s" % signal.Signals(-res.rc).name)
    else:
        if case.expect == "refuse" and res.rc not in case.rcs:
            pr.append("exit status %d, want %s" % (res.rc, "/".join(map(str, case.rcs))))
        elif case.expect == "ok" and res.rc != 0:
            pr.append("exit status %d, want 0" % res.rc)
        elif case.expect == "either" and res.rc != 0 and res.rc not in case.rcs:
            pr.append("exit status %d" % res.rc)
    if case.maxrss and res.maxrss > case.maxrss:
        pr.append("peak memory %d MB (limit %d MB)" % (res.maxrss >> 20, case.maxrss >> 20))
    cb = raw_controls(res.err)
    if cb:
        pr.append("stderr echoes " + cb)
    refused = res.rc not in (0, None) and not res.timed_out and res.rc > 0
    if refused:
        text = res.err.decode("utf-8", "replace")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines:
            pr.append("refused without a message on stderr")
        elif case.names:
            named = [ln for ln in lines if any(n in ln for n in case.names)]
            if not named:
                pr.append("the message does not name %s" % " or ".join(repr(n) for n in case.names))
            elif not any(ln.startswith("birkhoff") for ln in named):
                pr.append("the message naming it is not a 'birkhoff CMD: ...' line")
        elif not any(ln.startswith("birkhoff") for ln in lines):
            pr.append("no 'birkhoff CMD: ...' line on stderr")
    # files
    after = snapshot(ctx.w)
    outs = [os.path.normpath(o) for o in case.outputs]
    for rel in sorted(set(before) | set(after)):
        if under(rel, outs):
            continue
        if rel not in after:
            if rel not in ctx.planted:
                pr.append("removed %s" % rel)
        elif rel not in before:
            pr.append(("left a temporary file %s" if looks_temporary(rel) else "created unnamed %s") % rel)
        elif before[rel] != after[rel]:
            pr.append("changed unnamed %s" % rel)
    for o in outs:
        full = ctx.W(o)
        if full in ctx.keep_type or case.runner:   # a killed case checks its outputs itself
            continue
        if refused or res.timed_out or (res.rc is not None and res.rc < 0):
            if o in before:
                if after.get(o) != before[o]:
                    pr.append("a failed run changed its output %s" % o)
            elif o in after:
                pr.append("a failed run left its output %s" % o)
        elif res.rc == 0:
            if os.path.isdir(full) and not os.path.islink(full):
                for r2 in after:
                    if under(r2, [o]) and r2 != o:
                        if looks_temporary(os.path.basename(r2)) and r2 not in before:
                            pr.append("left a temporary file %s" % r2)
                        else:
                            c = complete(ctx.W(r2))
                            if c:
                                pr.append("%s: %s" % (r2, c))
            else:
                c = complete(full)
                if c and c != "absent":
                    pr.append("%s: %s" % (o, c))
            if case.finite:
                for r2 in after:
                    if under(r2, [o]) and not stat.S_ISDIR(after[r2][1]):
                        nf = nonfinite(ctx.W(r2))
                        if nf:
                            pr.append("exit 0 with a non-finite output: " + nf)
    for p, want in ctx.victims.items():
        try:
            got = open(p, "rb").read()
        except OSError as e:
            got = ("<%s>" % e).encode()
        if p in ctx.followed and res.rc == 0:
            if got == want or not got:
                pr.append("exit 0 but the output named through a symlink (%s) was not written" % os.path.basename(p))
            continue
        if got != want:
            pr.append("wrote through a symlink: victim %s now %r" % (os.path.basename(p), got[:40]))
    vafter = snapshot(ctx.v)
    for rel in sorted(set(vafter) - set(vbefore)):
        pr.append("created %s in the victims' directory (through a symlink)" % rel)
    for p, kind in ctx.keep_type.items():
        try:
            k = stat.S_IFMT(os.lstat(p).st_mode)
        except OSError:
            k = None
        if k != kind:
            names = {stat.S_IFCHR: "character device", stat.S_IFIFO: "FIFO", stat.S_IFLNK: "symlink",
                     stat.S_IFDIR: "directory", stat.S_IFREG: "regular file", None: "nothing"}
            pr.append("%s was a %s, now %s" % (os.path.relpath(p, ctx.w), names.get(kind), names.get(k, "other")))
    if snapshot(F) != FSNAP:
        pr.append("changed the fixtures directory")
    if case.perms and res.rc == 0:
        want_f = 0o666 & ~case.umask
        want_d = 0o777 & ~case.umask
        for r2, s in after.items():
            if not under(r2, outs) or r2 in before:
                continue
            m = s[1]
            if stat.S_ISREG(m) and stat.S_IMODE(m) != want_f:
                pr.append("%s has mode %04o, want %04o (umask %03o)" % (r2, stat.S_IMODE(m), want_f, case.umask))
            elif stat.S_ISDIR(m) and stat.S_IMODE(m) != want_d:
                pr.append("directory %s has mode %04o, want %04o" % (r2, stat.S_IMODE(m), want_d))
    if case.post:
        pr.extend(case.post(ctx, res) or [])
    return pr


def execute(case, idx):
    t0 = time.time()
    root = os.path.join(BASE, "c%05d" % idx)
    os.mkdir(root)
    ctx = Ctx(root)
    res = None
    try:
        if case.setup:
            case.setup(ctx)
        before, vbefore = snapshot(ctx.w), snapshot(ctx.v)
        res = (case.runner or run_plain)(case, ctx)
        ctx.stop.set()
        for t in ctx.threads:
            t.join(timeout=2)
        problems = judge(case, ctx, res, before, vbefore)
    except Exception as e:  # noqa: BLE001
        import traceback
        problems = ["the test itself failed: %s" % traceback.format_exc(limit=3)[-600:]]
    finally:
        ctx.stop.set()
        undo_readonly(ctx)
        if not A.keep:
            shutil.rmtree(root, ignore_errors=True)
    case.seconds = time.time() - t0
    return case, res, problems


# ---------------------------------------------------------------------------------------------
# the commands: a valid invocation of each, its file inputs, outputs, integer and float flags
# ---------------------------------------------------------------------------------------------
class Cmd:
    def __init__(self, name, argv, inputs=(), outputs=(), ints=(), seeds=(), floats=(), ok=True):
        self.name, self.argv = name, list(argv)
        self.inputs = list(inputs)     # (flag, kind): kind npy, npyi, st, asap, conf, text, ids, rundir, dir
        self.outputs = list(outputs)   # (flag, kind): npy, st, asap, json, text, svg, png, dir
        self.ints, self.seeds, self.floats = list(ints), list(seeds), list(floats)
        self.ok = ok                   # the valid invocation succeeds (plot attention needs image data)


def setv(argv, flag, value):
    """argv with flag's value replaced (or flag appended)"""
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


ATTN = ["attn", "--op", "sinkhorn", "--q", "{F}/q.npy", "--k", "{F}/k.npy", "--v", "{F}/v.npy"]
CMDS = [
    Cmd("attn", ATTN + ["--out", "{W}/o.npy", "--attn", "{W}/a.npy", "--diag", "{W}/d.npy", "--q-len",
                        "{F}/ql.npy", "--k-len", "{F}/kl.npy", "--dout", "{F}/do.npy", "--dq", "{W}/dq.npy"],
        inputs=[("--q", "npy"), ("--k", "npy"), ("--v", "npy"), ("--q-len", "npyi"), ("--k-len", "npyi"),
                ("--dout", "npy")],
        outputs=[("--out", "npy"), ("--attn", "npy"), ("--diag", "npy"), ("--dq", "npy")],
        ints=["--iters", "--threads"], floats=["--eps", "--scale", "--tol"]),
    Cmd("attn unbalanced", setv(ATTN, "--op", "unbalanced") + ["--out", "{W}/o.npy"], outputs=[("--out", "npy")],
        floats=["--rho"]),
    Cmd("attn esp", setv(ATTN, "--op", "esp") + ["--sort", "soft", "--out", "{W}/o.npy", "--sigma", "{W}/s.npy"],
        outputs=[("--out", "npy"), ("--sigma", "npy")], ints=["--num-slices"], seeds=["--seed"],
        floats=["--softsort-t", "--tau", "--scale"]),
    Cmd("attn esp --slices", setv(ATTN, "--op", "esp") + ["--slices", "{F}/sl.npy", "--out", "{W}/o.npy"],
        inputs=[("--slices", "npy")], outputs=[("--out", "npy")]),
    Cmd("attn lot", setv(ATTN, "--op", "lot") + ["--pivots", "{F}/Z.npy", "--pivot-logits", "{F}/th.npy",
                                                 "--out", "{W}/o.npy"],
        inputs=[("--pivots", "npy"), ("--pivot-logits", "npy")], outputs=[("--out", "npy")], ints=["--iters"],
        floats=["--pivot-temp", "--eps"]),
    Cmd("attn diff", setv(ATTN, "--op", "diff") + ["--lambda", "{F}/lam.npy", "--out", "{W}/o.npy"],
        inputs=[("--lambda", "npy")], outputs=[("--out", "npy")], floats=["--scale"]),
    Cmd("attn asap", ["attn", "--op", "asap", "--q", "{F}/aq.npy", "--k", "{F}/ak.npy", "--v", "{F}/av.npy",
                      "--layer", "{F}/l.asap", "--out", "{W}/o.npy"],
        inputs=[("--layer", "asap")], outputs=[("--out", "npy")]),
    Cmd("otk embed", ["otk", "embed", "--x", "{F}/ox.npy", "--lengths", "{F}/olen.npy", "--refs", "{F}/oz.npy",
                      "--anchors", "{F}/ow.npy", "--out", "{W}/phi.npy", "--plan", "{W}/plan.npy", "--diag",
                      "{W}/od.npy"],
        inputs=[("--x", "npy"), ("--lengths", "npyi"), ("--refs", "npy"), ("--anchors", "npy")],
        outputs=[("--out", "npy"), ("--plan", "npy"), ("--diag", "npy")], ints=["--iters", "--threads"],
        floats=["--sigma", "--eta", "--eps", "--sigma-pos"]),
    Cmd("otk fit-anchors", ["otk", "fit-anchors", "--x", "{F}/ox.npy", "--lengths", "{F}/olen.npy", "--k", "2",
                            "--out", "{W}/w.npy"],
        inputs=[("--x", "npy"), ("--lengths", "npyi")], outputs=[("--out", "npy")],
        ints=["--k", "--samples", "--kmeans-iters", "--threads"], seeds=["--seed"], floats=["--tol"]),
    Cmd("otk fit-refs", ["otk", "fit-refs", "--x", "{F}/ox.npy", "--lengths", "{F}/olen.npy", "--q", "1", "--p",
                         "2", "--out", "{W}/z.npy"],
        inputs=[("--x", "npy")], outputs=[("--out", "npy")], ints=["--q", "--p", "--barycenter"], floats=["--eps"]),
    Cmd("asap generate", ["asap", "generate", "--b", "1", "--h", "1", "--n", "8", "--d", "4", "--out-q",
                          "{W}/gq.npy", "--out-k", "{W}/gk.npy", "--out-v", "{W}/gv.npy"],
        outputs=[("--out-q", "npy"), ("--out-k", "npy"), ("--out-v", "npy")], ints=["--b", "--h", "--n", "--d"],
        seeds=["--seed"], floats=["--temp"]),
    Cmd("asap calibrate", ["asap", "calibrate", "--q", "{F}/aq.npy", "--k", "{F}/ak.npy", "--teacher-iters", "4",
                           "--slices", "4", "--out", "{W}/l.asap"],
        inputs=[("--q", "npy"), ("--k", "npy")], outputs=[("--out", "asap")],
        ints=["--teacher-iters", "--slices", "--kl-iters", "--threads"], seeds=["--seed"],
        floats=["--eps", "--scale", "--lambda", "--kl-tol"]),
    Cmd("asap report", ["asap", "report", "--layer", "{F}/l.asap", "--q", "{F}/aq.npy", "--k", "{F}/ak.npy", "--v",
                        "{F}/av.npy", "--reps", "1"],
        inputs=[("--layer", "asap"), ("--q", "npy"), ("--v", "npy")], ints=["--reps", "--baselines"]),
    Cmd("asap show", ["asap", "show", "--layer", "{F}/l.asap", "--theta-out", "{W}/th.npy", "--omega-out",
                      "{W}/om.npy"],
        inputs=[("--layer", "asap")], outputs=[("--theta-out", "npy"), ("--omega-out", "npy")]),
    Cmd("asap compile", ["asap", "compile", "--ckpt", "{F}/run_sk/last.safetensors", "--out", "{W}/c.safetensors",
                         "--samples", "16", "--batch", "16", "--slices", "4"],
        inputs=[("--ckpt", "st")], outputs=[("--out", "st")], ints=["--samples", "--batch", "--slices"],
        seeds=["--seed"], floats=["--lambda"]),
    Cmd("model init", ["model", "init", "--config", TOK_CFG, "--out", "{W}/mi.safetensors"],
        outputs=[("--out", "st")], seeds=["--seed"]),
    Cmd("model grads", ["model", "grads", "--ckpt", "{F}/m.st", "--tokens", "{F}/T.npy", "--len", "{F}/L.npy",
                        "--labels", "{F}/Y.npy", "--out-dir", "{W}/g"],
        inputs=[("--ckpt", "st"), ("--tokens", "npyi"), ("--len", "npyi"), ("--labels", "npyi")],
        outputs=[("--out-dir", "dir")], floats=["--ls"]),
    Cmd("model grads --x", ["model", "grads", "--ckpt", "{F}/mp.st", "--x", "{F}/X.npy", "--labels", "{F}/Y.npy",
                            "--out-dir", "{W}/g"],
        inputs=[("--x", "npy")], outputs=[("--out-dir", "dir")]),
    Cmd("model train", ["model", "train", "--ckpt", "{F}/m.st", "--tokens", "{F}/T.npy", "--len", "{F}/L.npy",
                        "--labels", "{F}/Y.npy", "--steps", "2", "--out", "{W}/mt.safetensors", "--losses",
                        "{W}/losses.npy"],
        inputs=[("--ckpt", "st"), ("--tokens", "npyi")], outputs=[("--out", "st"), ("--losses", "npy")],
        ints=["--steps", "--micro"], floats=["--ls"]),
    Cmd("model show", ["model", "show", "--ckpt", "{F}/m.st"], inputs=[("--ckpt", "st")]),
    Cmd("model swap", ["model", "swap", "--in", "{F}/m.st", "--out", "{W}/sw.safetensors", "--attn", "sinkhorn"],
        inputs=[("--in", "st")], outputs=[("--out", "st")]),
    Cmd("train", ["train", "--config", "{F}/tiny.conf", "--out", "{W}/run"],
        inputs=[("--config", "conf")], outputs=[("--out", "dir")],
        ints=["--epochs", "--batch", "--micro", "--threads", "--stop-after", "--log-every", "--eval-batch",
              "--gen-train", "--gen-test", "--dim", "--depth", "--heads", "--mlp-dim", "--sk-iters", "--points",
              "--warmup", "--total-steps", "--train-limit"],
        seeds=["--seed", "--data-seed"],
        floats=["--lr", "--sk-eps", "--noise", "--ls", "--weight-decay", "--clip", "--dropout", "--beta1",
                "--attn-scale", "--lr-min", "--gamma", "--eps"]),
    Cmd("train --resume", ["train", "--resume", "{W}/rr"], inputs=[("--resume", "rundir")],
        ints=["--epochs", "--threads", "--stop-after"]),
    Cmd("eval", ["eval", "--ckpt", "{F}/run/last.safetensors", "--json", "{W}/e.json"],
        inputs=[("--ckpt", "st")], outputs=[("--json", "json")], ints=["--limit", "--batch", "--diag-samples"]),
    Cmd("eval --teacher", ["eval", "--ckpt", "{F}/asap.st", "--teacher", "{F}/run_sk/last.safetensors", "--json",
                           "{W}/e.json"], inputs=[("--ckpt", "st"), ("--teacher", "st")], outputs=[("--json", "json")]),
    Cmd("data info", ["data", "info", "listops", "--seq-len", "16"], ints=["--seq-len"]),
    Cmd("data info shapes", ["data", "info", "shapes", "--points", "16"], ints=["--points"]),
    Cmd("bleu", ["bleu", "--hyp", "{F}/hyp.txt", "--ref", "{F}/ref.txt"],
        inputs=[("--hyp", "text"), ("--ref", "text")], ints=["--order"]),
    Cmd("translate", ["translate", "--ckpt", "{F}/s2s.st", "--ids", "--input", "{F}/in.ids", "--output",
                      "{W}/tr.txt", "--beam", "1"],
        inputs=[("--ckpt", "st"), ("--input", "ids")], outputs=[("--output", "text")],
        ints=["--beam", "--batch", "--threads"], floats=["--len-penalty", "--len-a", "--len-b"]),
    Cmd("plot curves", ["plot", "curves", "--run", "{F}/run", "--out", "{W}/c.svg"],
        inputs=[("--run", "rundir")], outputs=[("--out", "svg")]),
    Cmd("plot curves png", ["plot", "curves", "--run", "{F}/run", "--out", "{W}/c.png"], outputs=[("--out", "png")]),
    Cmd("plot colsums", ["plot", "colsums", "--run", "{F}/run", "--out", "{W}/cs.svg", "--samples", "4"],
        inputs=[("--run", "rundir")], outputs=[("--out", "svg")], ints=["--layer", "--samples"]),
    Cmd("plot attention", ["plot", "attention", "--ckpt", "{F}/run/last.safetensors", "--out", "{W}/pa.svg"],
        inputs=[("--ckpt", "st")], ints=["--index", "--layer"], ok=False),
    Cmd("plot transport", ["plot", "transport", "--out", "{W}/t.svg", "--n", "8"], outputs=[("--out", "svg")],
        ints=["--n"], seeds=["--seed"], floats=["--eps"]),
    Cmd("bench", ["bench", "--op", "sinkhorn", "--cases", "1:8:4:2", "--no-peer", "--reps", "1", "--warmup", "0",
                  "--json"], ints=["--reps", "--warmup", "--threads", "--peer-max-n", "--load"]),
    Cmd("bench otk", ["bench", "--op", "otk", "--cases", "1:4:3:2:2:1:2", "--no-peer", "--reps", "1", "--warmup",
                      "0", "--json"], ints=["--reps", "--threads"], floats=["--eps"]),
    Cmd("bench asap", ["bench", "--op", "asap", "--cases", "1:16:4", "--no-peer", "--reps", "1", "--warmup", "0",
                       "--calib", "1", "--slices", "4", "--teacher-iters", "4", "--json"],
        ints=["--reps", "--calib", "--slices", "--teacher-iters"], floats=["--temp"]),
    Cmd("bench train", ["bench", "--op", "train", "--config", TOK_CFG, "--attn", "attn=softmax", "--batch", "4",
                        "--steps", "2", "--warmup", "0", "--no-peer", "--json"],
        ints=["--batch", "--steps", "--warmup", "--threads"]),
    Cmd("demo", ["demo", "--n", "16"], ints=["--n", "--threads"]),
]
CMD = {c.name: c for c in CMDS}

INT_BAD = ["-1", str(2 ** 31), str(2 ** 32 + 5), str(2 ** 64), "1e23", "12abc"]
SEED_BAD = ["-1", str(2 ** 64), "1e23", "12abc"]
FLOAT_BAD = ["nan", "inf", "-inf", "1e309"]   # refused: non-finite in any type
FLOAT_BIG = "1e39"                             # finite as a double, inf as a float32: refused, or finite outputs
# integer keys a run records in its config.txt: a 64-bit key may take 2^31 and 2^32+5, if it keeps them exactly
WIDE = [str(2 ** 31), str(2 ** 32 + 5)]


RECORDS = ("train", "train --resume", "model init", "model train", "model swap")


def records(ctx):
    """key -> value of what the case's outputs record: a run's config.txt, a checkpoint's metadata
    (its config and optimiser lines, its seed)"""
    got = {}
    for d in ("run", "rr"):
        p = ctx.W(d, "config.txt")
        if os.path.exists(p):
            for ln in open(p, errors="replace"):
                if "=" in ln and not ln.startswith("#"):
                    k, v = ln.strip().split("=", 1)
                    got[k] = v
    for name in os.listdir(ctx.w):
        if name.endswith(".safetensors"):
            try:
                b = open(ctx.W(name), "rb").read()
                meta = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]]).get("__metadata__", {})
            except Exception:  # noqa: BLE001
                continue
            for field in ("config", "optim"):
                for ln in meta.get(field, "").splitlines():
                    if "=" in ln:
                        k, v = ln.split("=", 1)
                        got[k] = v
            if "seed" in meta:
                got["seed"] = meta["seed"]
    return got


def recorded(key, value):
    """post: a command that accepted key=value recorded it exactly (no wrap)"""
    def post(ctx, res):
        if res.rc not in (0, 130):
            return []
        got = records(ctx).get(key)
        if got is None:
            return ["accepted %s=%s; no output records it" % (key, value)]
        return [] if got == value else ["accepted %s=%s but recorded %s=%s" % (key, value, key, got)]
    return post


def int_case(cmdname, argv, key, v, names, outputs, setup=None, what=""):
    """an out-of-range integer: refused; a 64-bit key of a command that records it may keep 2^31
    and 2^32+5 if it keeps them exactly"""
    wide = cmdname in RECORDS and v in WIDE
    return Case("intrange", cmdname, argv, names=names, expect="either" if wide else "refuse",
                rcs=(1, 2, 130) if wide else (1, 2), post=recorded(key, v) if wide else None,
                setup=setup, outputs=outputs, what=what)


# the words a clear message may use instead of the flag's name
ALIASES = {"--ls": ["label smoothing"], "--lr": ["learning rate"], "--softsort-t": ["SoftSort temperature"],
           "--pivot-temp": ["pivot temperature"]}


def flag_names(flag):
    k = flag.lstrip("-")
    return [flag, k, k.replace("-", "_")] + ALIASES.get(flag, [])


def file_value(argv, flag):
    return argv[argv.index(flag) + 1]


def fixture_path(value):
    return value.replace("{F}", F)


# the file of a run directory each command reads (plot curves: the records; plot colsums: a checkpoint)
RUNFILE = {"plot curves": "metrics.jsonl", "plot colsums": "ckpt/epoch-0001.safetensors"}


def run_copy(cmdname, mutate):
    """setup: a copy of the fixture run at W/r whose RUNFILE[cmdname] mutate(path) changes"""
    def s(ctx):
        shutil.copytree(fx("run"), ctx.W("r"))
        mutate(ctx.W("r", RUNFILE[cmdname]))
    return s


def rundir_setup(ctx):
    shutil.copytree(fx("run_cut"), ctx.W("rr"), symlinks=True)


def setup_for(cmd):
    return rundir_setup if cmd.name == "train --resume" else None


def chain(*fns):
    def go(ctx):
        for f_ in fns:
            if f_:
                f_(ctx)
    return go


def out_rels(cmd):
    return [os.path.relpath(file_value(cmd.argv, f).replace("{W}", "/W"), "/W") for f, _ in cmd.outputs
            if file_value(cmd.argv, f).startswith("{W}")] + (["rr"] if cmd.name == "train --resume" else [])


# ---------------------------------------------------------------------------------------------
# case generators, one per class
# ---------------------------------------------------------------------------------------------
def content_of(cmd, flag):
    v = file_value(cmd.argv, flag)
    if v.startswith("{F}"):
        p = fixture_path(v)
        return open(p, "rb").read() if os.path.isfile(p) else None
    return None


def input_case(cls, cmd, flag, value, setup=None, expect="refuse", names=(), stdin=None, what="", **kw):
    argv = setv(cmd.argv, flag, value)
    return Case(cls, cmd.name, argv, expect=expect, names=names, outputs=out_rels(cmd),
                setup=chain(setup_for(cmd), setup), stdin=stdin, what=what or "%s %s" % (flag, cls), **kw)


def writer(rel, data):
    def s(ctx):
        p = ctx.W(rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    return s


def cached(name, make):
    """a large input made once (make() -> bytes) in the cache beside the cases; its path"""
    path = os.path.join(BASE, "cache", name)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(make())
    return path


def linker(rel, path):
    """setup: a hard link of a cached input at W/rel (no copy, the cache stays unchanged)"""
    def s(ctx):
        os.link(path, ctx.W(rel))
    return s


def gen_missing():
    for c in CMDS:
        for flag, kind in c.inputs:
            if c.name == "train --resume":
                yield input_case("missing", c, flag, "{W}/no-such-run", names=["no-such-run"])
                continue
            yield input_case("missing", c, flag, "{W}/no-such-file", names=["no-such-file"])
    yield Case("missing", "data info", ["data", "info", "digits", "--data-dir", "{W}/no-such-dir"],
               names=["no-such-dir", "digits"], what="stored dataset, missing --data-dir")
    yield Case("missing", "data export", ["data", "export", "spam", "--out", "{W}/s.txt", "--data-dir",
                                          "{W}/no-such-dir"], names=["no-such-dir", "spam"], outputs=["s.txt"],
               what="missing dataset")
    yield Case("missing", "train", ["train", "--data", "digits", "--data-dir", "{W}/no-such-dir", "--epochs", "1",
                                    "--out", "{W}/run"], names=["no-such-dir", "digits"], outputs=["run"],
               what="missing dataset directory")
    yield Case("missing", "train", ["train", "--init", "{W}/no-such-file", "--out", "{W}/run"],
               names=["no-such-file"], outputs=["run"], what="--init missing")
    yield Case("missing", "translate", ["translate", "--ckpt", "{F}/s2s.st", "--ids", "--input", "{F}/in.ids",
                                        "--ref", "{W}/no-such-file"], names=["no-such-file"], what="--ref missing")
    yield Case("missing", "asap calibrate", ["asap", "calibrate", "--q", "{F}/aq.npy", "--k", "{F}/ak.npy", "--theta",
                                             "{W}/no-such-file", "--out", "{W}/l.asap"],
               names=["no-such-file"], outputs=["l.asap"], what="--theta missing")


def gen_empty():
    for c in CMDS:
        for flag, kind in c.inputs:
            if kind == "rundir":
                if c.name == "train --resume":
                    yield Case("empty", c.name, c.argv, names=["rr", "checkpoint"], outputs=["rr"],
                               setup=lambda ctx: os.mkdir(ctx.W("rr")), what="an empty run directory")
                else:
                    yield input_case("empty", c, flag, "{W}/e", setup=lambda ctx: os.mkdir(ctx.W("e")),
                                     names=["e/", "metrics"], what="an empty run directory")
                    rf = RUNFILE[c.name]
                    yield input_case("empty", c, flag, "{W}/r", names=[os.path.basename(rf)],
                                     setup=run_copy(c.name, lambda p: open(p, "wb").close()),
                                     what="an empty %s" % rf)
                continue
            if kind == "conf":
                # an empty config is valid (no keys): the defaults' dataset (MNIST) is missing here
                continue
            yield input_case("empty", c, flag, "{W}/empty", setup=writer("empty", b""), names=["empty"])
    yield Case("empty", "bleu", ["bleu", "--hyp", "-", "--ref", "{F}/ref.txt"], stdin=b"", names=["-", "stdin", "line"],
               what="empty standard input")
    yield Case("empty", "translate", ["translate", "--ckpt", "{F}/s2s.st", "--ids"], stdin=b"",
               names=["-", "stdin", "no lines"], what="empty standard input")


def npy_cuts(raw):
    hl = struct.unpack("<H", raw[8:10])[0]
    he = 10 + hl
    return sorted({6, 9, 10 + hl // 2, he, he + (len(raw) - he) // 2, len(raw) - 1})


def st_cuts(raw):
    hl = struct.unpack("<Q", raw[:8])[0]
    he = 8 + hl
    return sorted({4, 8, 8 + hl // 2, he, he + (len(raw) - he) // 2, len(raw) - 1})


def gen_truncated():
    for c in CMDS:
        for flag, kind in c.inputs:
            raw = content_of(c, flag)
            if kind in ("npy", "npyi"):
                cuts = npy_cuts(raw)
            elif kind == "st":
                cuts = st_cuts(raw)
            elif kind == "asap":
                cuts = [4, 12, 60, 96, len(raw) // 2, len(raw) - 1]
            elif kind == "conf":
                i = raw.index(b"epochs")
                cuts = [i + 3, i + 8]      # "epo" (no '='), "epochs =" (no value)
            else:
                continue
            for n in cuts:
                yield input_case("truncated", c, flag, "{W}/cut", setup=writer("cut", raw[:n]), names=["cut"],
                                 what="%s cut at %d of %d bytes" % (flag, n, len(raw)))
        if c.name == "train --resume":
            ck = open(fx("run_cut/last.safetensors"), "rb").read()
            for n in (len(ck) // 3, len(ck) - 1):
                def s(ctx, n=n, ck=ck):
                    rundir_setup(ctx)
                    open(ctx.W("rr/last.safetensors"), "wb").write(ck[:n])
                yield Case("truncated", c.name, c.argv, names=["last.safetensors"], outputs=["rr"], setup=s,
                           what="last.safetensors cut at %d" % n)
    def cut(p):
        b = open(p, "rb").read()
        open(p, "wb").write(b[:len(b) // 2])
    # a metrics file cut mid-record: refused, or drawn with a warning naming it
    c = CMD["plot curves"]
    yield Case("truncated", c.name, setv(c.argv, "--run", "{W}/r"), expect="either",
               names=["metrics.jsonl"], outputs=out_rels(c), setup=run_copy(c.name, cut),
               what="metrics.jsonl cut mid-record",
               post=lambda ctx, res: [] if res.rc != 0 or b"metrics.jsonl" in res.err else
               ["drew a metrics.jsonl cut mid-record without a word"])
    c = CMD["plot colsums"]
    yield Case("truncated", c.name, setv(c.argv, "--run", "{W}/r"), names=["epoch-0001"], outputs=out_rels(c),
               setup=run_copy(c.name, cut), what="ckpt/epoch-0001.safetensors cut in half")
    # --resume after metrics.jsonl lost its last records: a gap in the records must be named
    def s2(ctx):
        rundir_setup(ctx)
        m = open(ctx.W("rr/metrics.jsonl"), "rb").read().splitlines(True)
        open(ctx.W("rr/metrics.jsonl"), "wb").write(b"".join(m[:-1]))
    yield Case("truncated", "train --resume", ["train", "--resume", "{W}/rr"], expect="either",
               names=["metrics.jsonl"], outputs=["rr"], setup=s2, what="metrics.jsonl lost its last record",
               post=lambda ctx, res: [] if res.rc != 0 or b"metrics" in res.err else
               ["resumed over a truncated metrics.jsonl without a word (a gap in the step records)"])


def npy_header(shape, descr="<f4", extra=64):
    h = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, repr(tuple(shape)))
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + b"\0" * extra


def st_blob(header, data=b"\0" * 64, hlen=None):
    hb = json.dumps(header).encode()
    return struct.pack("<Q", len(hb) if hlen is None else hlen) + hb + data


def gen_huge():
    for c in CMDS:
        for flag, kind in c.inputs:
            if kind in ("rundir",):
                continue
            yield input_case("huge", c, flag, "/dev/zero", names=["/dev/zero", "zero"], maxrss=HUGE_RSS,
                             what="%s /dev/zero" % flag)
            if kind in ("npy", "npyi"):
                d = "<i4" if kind == "npyi" else "<f4"
                for shape in ((1, 1, 2 ** 31, 4), (2 ** 40, 2 ** 40, 1, 1), (2 ** 62,), (2 ** 31 - 1, 2 ** 31 - 1)):
                    yield input_case("huge", c, flag, "{W}/huge.npy", setup=writer("huge.npy", npy_header(shape, d)),
                                     names=["huge.npy"], maxrss=HUGE_RSS, what="%s shape %s" % (flag, shape))
            elif kind == "st":
                raw = content_of(c, flag)
                hl = struct.unpack("<Q", raw[:8])[0]
                hdr = json.loads(raw[8:8 + hl])
                name = next(k for k in hdr if k != "__metadata__")
                big = json.loads(raw[8:8 + hl])
                big[name]["shape"] = [2 ** 40, 2 ** 40]
                far = json.loads(raw[8:8 + hl])
                far[name]["data_offsets"] = [0, 2 ** 63]

                def many_blob(hdr=hdr):
                    many = {"__metadata__": hdr.get("__metadata__", {})}
                    for i in range(100000):
                        many["t%06d" % i] = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
                    return st_blob(many, b"")
                many_path = cached("many.st", many_blob)
                variants = [("header length 2^62", struct.pack("<Q", 2 ** 62) + raw[8:]),
                            ("header length past the end", struct.pack("<Q", len(raw)) + raw[8:]),
                            ("a tensor of 2^80 elements", st_blob(big, raw[8 + hl:])),
                            ("data offsets to 2^63", st_blob(far, raw[8 + hl:]))]
                for what, blob in variants:
                    yield input_case("huge", c, flag, "{W}/huge.st", setup=writer("huge.st", blob),
                                     names=["huge.st"], maxrss=HUGE_RSS, what="%s: %s" % (flag, what))
                # memory a header makes the loader use: a small multiple of the file's size
                size = os.path.getsize(many_path)
                yield input_case("huge", c, flag, "{W}/huge.st", setup=linker("huge.st", many_path),
                                 names=["huge.st"], maxrss=(64 << 20) + 20 * size,
                                 what="%s: a %.0f MB header of 100k empty tensors" % (flag, size / 2 ** 20))
            elif kind == "asap":
                raw = bytearray(content_of(c, flag))
                raw[16:24] = struct.pack("<ii", 1 << 24, 16)
                yield input_case("huge", c, flag, "{W}/huge.asap", setup=writer("huge.asap", bytes(raw)),
                                 names=["huge.asap"], maxrss=HUGE_RSS, what="%s: d = 2^24, L = 16" % flag)
            elif kind in ("text", "ids"):
                yield input_case("huge", c, flag, "{W}/long",
                                 setup=linker("long", cached("long-line", lambda: b"x" * (64 << 20))),
                                 names=["long"], maxrss=HUGE_RSS, what="%s: one 64 MB line" % flag)
    # `yes` as standard input, and /dev/zero where the docs take a file
    yield Case("huge", "bleu", ["bleu", "--hyp", "-", "--ref", "{F}/ref.txt"], stdin="yes", maxrss=STDIN_RSS,
               names=["-", "stdin", "standard input", "limit", "line"], what="yes | bleu --hyp -")
    yield Case("huge", "bleu", ["bleu", "--hyp", "{F}/hyp.txt", "--ref", "-"], stdin="yes", maxrss=STDIN_RSS,
               names=["-", "stdin", "standard input", "limit", "line"], what="yes | bleu --ref -")
    yield Case("huge", "translate", ["translate", "--ckpt", "{F}/s2s.st", "--ids", "--input", "-"], stdin="yes",
               maxrss=STDIN_RSS, names=["-", "stdin", "standard input", "limit", "line"], what="yes | translate")
    yield Case("huge", "translate", ["translate", "--ckpt", "{F}/s2s.st", "--ids", "--ref", "/dev/zero", "--input",
                                     "{F}/in.ids"], maxrss=HUGE_RSS, names=["/dev/zero"], what="--ref /dev/zero")
    yield Case("huge", "train", ["train", "--config", "/dev/stdin", "--out", "{W}/run"], stdin="yes",
               outputs=["run"], maxrss=STDIN_RSS, names=["/dev/stdin", "stdin"], what="yes | train --config /dev/stdin")
    yield Case("huge", "asap calibrate", ["asap", "calibrate", "--q", "{F}/aq.npy", "--k", "{F}/ak.npy", "--theta",
                                          "/dev/zero", "--out", "{W}/l.asap"], outputs=["l.asap"], maxrss=HUGE_RSS,
               names=["/dev/zero"], what="--theta /dev/zero")
    # a metrics.jsonl that never ends
    for cmdname in ("plot curves", "plot colsums"):
        c = CMD[cmdname]
        rf = RUNFILE[cmdname]
        yield Case("huge", cmdname, setv(c.argv, "--run", "{W}/r"), names=[os.path.basename(rf)],
                   outputs=out_rels(c), setup=run_copy(cmdname, lambda p: (os.remove(p), os.symlink("/dev/zero", p))),
                   maxrss=HUGE_RSS, what="%s -> /dev/zero" % rf)
    # absurd sizes as flags: a clean refusal (or a run within the memory limit), never a crash
    absurd = [("bench", ["bench", "--op", "sinkhorn", "--cases", "1:100000000:64", "--no-peer", "--reps", "1",
                         "--warmup", "0"], ["--cases", "100000000"]),
              ("bench", ["bench", "--op", "sinkhorn", "--cases", "100000000:16:64", "--no-peer", "--reps", "1",
                         "--warmup", "0"], ["--cases", "100000000"]),
              ("bench otk", ["bench", "--op", "otk", "--cases", "1:100000000:3:2:2:1:2", "--no-peer", "--reps", "1",
                             "--warmup", "0"], ["--cases", "100000000"]),
              ("bench asap", ["bench", "--op", "asap", "--cases", "1:100000000:4", "--no-peer", "--reps", "1",
                              "--warmup", "0"], ["--cases", "100000000"]),
              ("asap generate", setv(CMD["asap generate"].argv, "--n", "100000000"), ["--n", "100000000"]),
              ("asap generate", setv(setv(CMD["asap generate"].argv, "--b", "65536"), "--n", "65536"), ["--b", "--n"]),
              ("plot transport", setv(CMD["plot transport"].argv, "--n", "100000000"), ["--n"]),
              ("demo", ["demo", "--n", "8192"], []),
              ("otk fit-anchors", setv(CMD["otk fit-anchors"].argv, "--k", "100000000"), ["--k"]),
              ("model init", ["model", "init", "--config", TOK_CFG.replace("dim=8", "dim=1000000"), "--out",
                              "{W}/mi.safetensors"], ["dim"]),
              ("model init", ["model", "init", "--config", TOK_CFG.replace("vocab=12", "vocab=2000000000"), "--out",
                              "{W}/mi.safetensors"], ["vocab"]),
              # above gen_train's documented bound (1e9); 1e8 is a valid, long request (it trains)
              ("train", setv(CMD["train"].argv, "--gen-train", "10000000000"), ["gen_train", "--gen-train"]),
              ("train", setv(CMD["train"].argv, "--points", "4096") + ["--dim", "4096", "--batch", "4096"],
               ["points", "dim", "batch", "memory"]),
              ("eval", setv(CMD["eval"].argv, "--batch", "100000000"), ["--batch"])]
    for name, argv, names in absurd:
        c = CMD[name]
        # a refusal names the flag, the size or the memory it would need
        yield Case("huge", name, argv, expect="either", names=names + ["size", "memory", "needs", "GiB"],
                   outputs=out_rels(c), what=" ".join(names[:1]) + " absurd size", finite=True)


def gen_nonregular():
    for c in CMDS:
        for flag, kind in c.inputs:
            if kind == "rundir":
                if c.name == "train --resume":
                    yield Case("nonregular", c.name, setv(c.argv, "--resume", "{W}/afile"), names=["afile"],
                               setup=writer("afile", b"not a run\n"), what="--resume a regular file")
                else:
                    yield input_case("nonregular", c, flag, "{W}/afile", setup=writer("afile", b"x\n"),
                                     names=["afile"], what="%s a regular file" % flag)
                    rf = RUNFILE[c.name]
                    yield input_case("nonregular", c, flag, "{W}/r", names=[os.path.basename(rf)],
                                     setup=run_copy(c.name, lambda p: (os.remove(p), os.mkdir(p))),
                                     what="%s is a directory" % rf)
                continue
            yield input_case("nonregular", c, flag, "{W}/adir", setup=lambda ctx: os.mkdir(ctx.W("adir")),
                             names=["adir"], what="%s a directory" % flag)
            data = content_of(c, flag)

            def s(ctx, data=data):
                fifo_writer(ctx, make_fifo(ctx, "fifo"), data)
            yield input_case("nonregular", c, flag, "{W}/fifo", setup=s, expect="either", names=["fifo"],
                             what="%s a FIFO holding the valid content" % flag)
        for flag, kind in c.outputs:
            rel = file_value(c.argv, flag).replace("{W}/", "")

            def sd(ctx, rel=rel):
                os.makedirs(ctx.W(rel, "inside"))
                open(ctx.W(rel, "inside", "keep"), "wb").write(b"keep\n")
                ctx.keep_type[ctx.W(rel)] = stat.S_IFDIR
            if kind != "dir":
                yield Case("nonregular", c.name, c.argv, names=[os.path.basename(rel)], setup=chain(setup_for(c), sd),
                           outputs=[o for o in out_rels(c) if o != rel], what="%s is an existing directory" % flag,
                           post=lambda ctx, res, rel=rel: [] if os.path.exists(ctx.W(rel, "inside", "keep")) else
                           ["removed the directory at the output path"])

                def sf(ctx, rel=rel):
                    fifo_reader(ctx, make_fifo(ctx, rel))
                yield Case("nonregular", c.name, c.argv, expect="either", names=[os.path.basename(rel)],
                           setup=chain(setup_for(c), sf), outputs=out_rels(c), what="%s is a FIFO" % flag)
            else:
                yield Case("nonregular", c.name, c.argv, names=[rel], setup=chain(setup_for(c), writer(rel, b"file\n")),
                           what="%s is a regular file" % flag)
    cfg = CMD["train"]

    def sconf(ctx):
        os.mkdir(ctx.W("conf.d"))
    yield Case("nonregular", "train", setv(cfg.argv, "--config", "{W}/conf.d"), names=["conf.d"], outputs=["run"],
               setup=sconf, what="--config a directory (alone)")


def plant_temps(ctx, rels):
    """symlinks to a victim at the temporary names of each output W/rel: REL.staged, REL.tmp,
    REL.tmp.<pid> and REL.staged.tmp.<pid> for the next 500 pids, ..."""
    victim = ctx.victim()
    probe = subprocess.Popen(["true"])
    probe.wait()
    p0 = probe.pid
    for rel in rels:
        d, b = os.path.split(rel)
        names = [rel + ".staged", rel + ".tmp", rel + "~", os.path.join(d, "." + b + ".tmp"), rel + ".part"]
        for pid in range(p0, p0 + 500):   # the next pids (other processes of the machine take some)
            names += ["%s.tmp.%d" % (rel, pid), "%s.staged.tmp.%d" % (rel, pid)]
        os.makedirs(ctx.W(d), exist_ok=True)
        for n in names:
            os.symlink(victim, ctx.W(n))
            ctx.planted.add(n)


def gen_symlink():
    for c in CMDS:
        rels = out_rels(c)
        for flag, kind in c.outputs:
            rel = file_value(c.argv, flag).replace("{W}/", "")
            if kind == "dir":
                continue

            def sl(ctx, rel=rel):
                p = ctx.victim()
                ctx.followed.add(p)
                os.symlink(p, ctx.W(rel))
                ctx.keep_type[ctx.W(rel)] = stat.S_IFLNK
            yield Case("symlink", c.name, c.argv, expect="either", names=[os.path.basename(rel)],
                       setup=chain(setup_for(c), sl), outputs=rels, what="%s is a symlink to a victim" % flag)

            def dl(ctx, rel=rel):
                os.symlink(os.path.join(ctx.v, "created"), ctx.W(rel))
            yield Case("symlink", c.name, c.argv, expect="either", names=[os.path.basename(rel)],
                       setup=chain(setup_for(c), dl), outputs=rels, what="%s is a dangling symlink" % flag)

            def tmp(ctx, rel=rel):
                plant_temps(ctx, [rel])
            yield Case("symlink", c.name, c.argv, expect="either", setup=chain(setup_for(c), tmp), outputs=rels,
                       what="%s: symlinks to a victim at its temporary names" % flag)
    # the files of a run directory
    for f_ in ("metrics.jsonl", "steps.csv", "epochs.csv", "config.txt", "summary.json", "last.safetensors"):
        def s(ctx, f_=f_):
            os.mkdir(ctx.W("run"))
            os.symlink(ctx.victim(), ctx.W("run", f_))
        yield Case("symlink", "train", ["train", "--config", "{F}/tiny.conf", "--out", "{W}/run", "--force"],
                   expect="either", setup=s, outputs=["run"], names=[f_], what="train --force: run/%s a symlink" % f_)

        def r(ctx, f_=f_):
            rundir_setup(ctx)
            if os.path.exists(ctx.W("rr", f_)):
                shutil.copy(ctx.W("rr", f_), os.path.join(ctx.v, "victim"))
                ctx.victims[os.path.join(ctx.v, "victim")] = open(ctx.W("rr", f_), "rb").read()
                os.remove(ctx.W("rr", f_))
                os.symlink(os.path.join(ctx.v, "victim"), ctx.W("rr", f_))
            else:
                os.symlink(ctx.victim(), ctx.W("rr", f_))
        yield Case("symlink", "train --resume", ["train", "--resume", "{W}/rr"], expect="either", setup=r,
                   outputs=["rr"], names=[f_], what="train --resume: rr/%s a symlink" % f_)

    def ck(ctx):
        os.mkdir(ctx.W("run"))
        os.symlink(ctx.v, ctx.W("run", "ckpt"))
        ctx.victim()
    yield Case("symlink", "train", ["train", "--config", "{F}/tiny.conf", "--out", "{W}/run", "--force"],
               expect="either", setup=ck, outputs=["run"], names=["ckpt"], what="train --force: run/ckpt a symlink")
    yield Case("symlink", "train", ["train", "--config", "{F}/tiny.conf", "--out", "{W}/run", "--force"],
               expect="either", outputs=["run"],
               setup=lambda ctx: plant_temps(ctx, ["run/" + f_ for f_ in (
                   "last.safetensors", "ckpt/epoch-0000.safetensors", "ckpt/epoch-0001.safetensors", "config.txt",
                   "summary.json", "metrics.jsonl")]),
               what="train --force: symlinks to a victim at the temporary names of the run's files")
    # the files of an output directory (model grads --out-dir)
    mg = CMD["model grads"]
    for f_ in ("logits.npy", "loss.npy", "grads.safetensors"):
        def sg(ctx, f_=f_):
            os.mkdir(ctx.W("g"))
            os.symlink(ctx.victim(), ctx.W("g", f_))
        yield Case("symlink", mg.name, mg.argv, expect="either", setup=sg, outputs=["g"], names=[f_],
                   what="--out-dir: g/%s a symlink to a victim" % f_)
    yield Case("symlink", mg.name, mg.argv, expect="either", outputs=["g"],
               setup=lambda ctx: plant_temps(ctx, ["g/logits.npy", "g/loss.npy", "g/grads.safetensors"]),
               what="--out-dir: symlinks to a victim at the temporary names of its files")


def gen_device():
    for c in CMDS:
        for flag, kind in c.outputs:
            if kind == "dir":
                continue
            rel = file_value(c.argv, flag).replace("{W}/", "")
            others = [o for o in out_rels(c) if o != rel]

            def nd(ctx):
                p = ctx.W("nulldev")
                os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
                ctx.keep_type[p] = stat.S_IFCHR
            yield Case("device", c.name, setv(c.argv, flag, "{W}/nulldev"), expect="either", names=["nulldev"],
                       setup=chain(setup_for(c), nd), outputs=others, what="%s a character device (1,3)" % flag)

            def so(ctx):
                p = ctx.W("stdout")
                os.symlink("/proc/self/fd/1", p)
                ctx.keep_type[p] = stat.S_IFLNK
            yield Case("device", c.name, setv(c.argv, flag, "{W}/stdout"), expect="either", names=["stdout"],
                       setup=chain(setup_for(c), so), outputs=others,
                       what="%s a symlink to /proc/self/fd/1 (as /dev/stdout)" % flag)


def gen_readonly():
    for c in CMDS:
        for flag, kind in c.outputs:
            rel = file_value(c.argv, flag).replace("{W}/", "")

            def s(ctx):
                if make_readonly(ctx, "ro") is None:
                    raise RuntimeError("cannot make a read-only directory (chattr +i)")
            yield Case("readonly", c.name, setv(c.argv, flag, "{W}/ro/" + rel), names=[rel, "ro/"],
                       setup=chain(setup_for(c), s), outputs=[o for o in out_rels(c) if o != rel],
                       what="%s in a read-only directory" % flag)
    c = CMD["train --resume"]

    def sr(ctx):
        rundir_setup(ctx)
        make_readonly(ctx, "rr")
    yield Case("readonly", c.name, c.argv, names=["rr"], setup=sr, what="--resume of a read-only run directory")


ESC = b"\x1b[31mRED\x1b[0m\r\xff"


def gen_nonutf8():
    for c in CMDS:
        if c.inputs:
            flag, kind = c.inputs[0]
            argv = setv(c.argv, flag, b"{W}/missing-" + ESC + b".npy")
            yield Case("nonutf8", c.name, argv, names=["missing-"], outputs=out_rels(c), setup=setup_for(c),
                       what="%s: missing file named with ESC, CR, 0xFF" % flag)
        if c.outputs:
            flag, kind = c.outputs[0]
            others = [o for o in out_rels(c) if o != file_value(c.argv, flag).replace("{W}/", "")]
            if kind == "dir":   # a run or output directory is created with its parents: a name with control bytes
                yield Case("nonutf8", c.name, setv(c.argv, flag, b"{W}/out-" + ESC), expect="either", names=["out-"],
                           setup=setup_for(c), outputs=others + [os.fsdecode(b"out-" + ESC)],
                           what="%s: a directory named with control bytes" % flag)
            else:
                yield Case("nonutf8", c.name, setv(c.argv, flag, b"{W}/no-dir-" + ESC + b"/out"), names=["no-dir-"],
                           setup=setup_for(c), outputs=others,
                           what="%s: output in a missing directory named with control bytes" % flag)
        yield Case("nonutf8", c.name, c.argv + [b"--bad" + ESC, b"1"], names=["bad"], rcs=(2,), setup=setup_for(c),
                   outputs=out_rels(c), what="an unknown option with control bytes")
        for flag in (c.ints + c.floats)[:1]:
            yield Case("nonutf8", c.name, setv(c.argv, flag, b"1" + ESC), names=flag_names(flag), rcs=(2,),
                       setup=setup_for(c), outputs=out_rels(c), what="%s value with control bytes" % flag)
    enums = [("attn", ["--op"]), ("attn esp", ["--sort", "--cost"]), ("otk embed", ["--domain", "--pe"]),
             ("asap calibrate", ["--fit"]), ("asap compile", ["--ending"]), ("train", ["--attn", "--data", "--sched"]),
             ("eval", ["--split", "--esp-sort"]), ("bleu", ["--tokenize"]), ("model swap", ["--attn"])]
    for name, flags in enums:
        c = CMD[name]
        for flag in flags:
            yield Case("nonutf8", name, setv(c.argv, flag, b"x" + ESC), names=flag_names(flag) + ["x"], rcs=(2,),
                       outputs=out_rels(c), what="%s value with control bytes" % flag)
    yield Case("nonutf8", "data export", ["data", "export", "spam", "--out", "{W}/s.txt", "--data-dir",
                                          b"{W}/data-" + ESC], names=["data-"], outputs=["s.txt"],
               what="missing --data-dir named with control bytes")
    for argv, what in ((["plot", b"curves" + ESC], "plot figure"), (["model", b"\xff" + ESC], "model subcommand"),
                       ([b"\x1b]0;title\x07" + ESC], "command name"), (["data", "info", b"nope" + ESC], "dataset"),
                       (["otk", b"nope" + ESC], "otk subcommand"), (["asap", b"nope" + ESC], "asap subcommand"),
                       (["version", b"--x" + ESC], "version with an argument")):
        yield Case("nonutf8", argv[0] if isinstance(argv[0], str) else "birkhoff", argv, names=[], rcs=(1, 2),
                   what=what + " with control bytes")
    # control bytes inside files
    conf = TINY_CONF.encode()
    for what, blob in (("a value", conf.replace(b"data = shapes", b"data = shapes" + ESC)),
                       ("a key", conf + b"dim" + ESC + b" = 8\n"), ("a whole line", conf + ESC + b"\n")):
        yield Case("nonutf8", "train", setv(CMD["train"].argv, "--config", "{W}/bad.conf"), names=["bad.conf"],
                   setup=writer("bad.conf", blob), outputs=["run"], what="config: control bytes in " + what)
    yield Case("nonutf8", "translate", setv(CMD["translate"].argv, "--input", "{W}/bad.ids"), names=["bad.ids", "line"],
               setup=writer("bad.ids", b"4 5\n6 " + ESC + b" 7\n"), outputs=["tr.txt"],
               what="ids: control bytes in a token")
    yield Case("nonutf8", "bleu", ["bleu", "--hyp", "{W}/h.txt", "--ref", "{F}/ref.txt"], expect="either",
               names=["h.txt"], setup=writer("h.txt", b"the cat \xff\xfe sat\nand " + ESC + b"\n"),
               what="hypotheses that are not UTF-8 (with escapes)")

    def sm(ctx):
        shutil.copytree(fx("run"), ctx.W("r"))
        with open(ctx.W("r/metrics.jsonl"), "ab") as f:
            f.write(b'{"type":"' + ESC + b'"}\n')
    yield Case("nonutf8", "plot curves", setv(CMD["plot curves"].argv, "--run", "{W}/r"), expect="either",
               names=["metrics.jsonl"], setup=sm, outputs=["c.svg"], what="metrics.jsonl: a record with control bytes")


def gen_nul():
    conf = TINY_CONF.encode()
    for what, blob in (("mid-line", conf.replace(b"epochs = 1", b"epochs = 1\0 junk = 3")),
                       ("a whole line", conf + b"\0\0\0\n"), ("at the end", conf + b"dim = 8\0")):
        yield Case("nul", "train", setv(CMD["train"].argv, "--config", "{W}/nul.conf"), names=["nul.conf"],
                   setup=writer("nul.conf", blob), outputs=["run"], what="config: NUL " + what)

    def sr(ctx):
        rundir_setup(ctx)
        c = open(ctx.W("rr/config.txt"), "rb").read()
        open(ctx.W("rr/config.txt"), "wb").write(c.replace(b"epochs=2", b"epochs=2\0 9"))
    # config.txt is the run's record, not its input (a resume reads the checkpoint's
    # configuration, docs/TRAINING.md): it is written anew
    def nul_gone(ctx, res):
        return ["config.txt still holds a NUL"] if b"\0" in open(ctx.W("rr/config.txt"), "rb").read() else []
    yield Case("nul", "train --resume", ["train", "--resume", "{W}/rr"], expect="ok", setup=sr, post=nul_gone,
               outputs=["rr"], what="run config.txt: NUL in a line (rewritten from the checkpoint)")
    for flag in ("--hyp", "--ref"):
        yield Case("nul", "bleu", setv(CMD["bleu"].argv, flag, "{W}/nul.txt"), names=["nul.txt"],
                   setup=writer("nul.txt", b"the cat sat\0 on the mat\na b c d\n"), what="bleu %s: NUL" % flag)
    yield Case("nul", "bleu", ["bleu", "--hyp", "-", "--ref", "{F}/ref.txt"], stdin=b"the cat\0 sat\na b c d\n",
               names=["-", "stdin", "NUL", "line"], what="bleu --hyp - : NUL on standard input")
    yield Case("nul", "translate", setv(CMD["translate"].argv, "--input", "{W}/nul.ids"), names=["nul.ids"],
               setup=writer("nul.ids", b"4 5\0 6\n7\n"), outputs=["tr.txt"], what="ids: NUL in a line")
    yield Case("nul", "translate", setv(CMD["translate"].argv, "--ref", "{W}/nul.ref"), names=["nul.ref"],
               setup=writer("nul.ref", b"4 5\0 6\n7\n8\n"), outputs=["tr.txt"], what="--ref: NUL in a line")
    def nul_rec(p):
        m = open(p, "rb").read()
        open(p, "wb").write(m[:40] + b"\0" + m[41:])

    def nul_meta(p):
        m = open(p, "rb").read()
        i = m.index(b"dim=8")
        open(p, "wb").write(m[:i + 4] + b"\0" + m[i + 5:])
    for name, mut, what in (("plot curves", nul_rec, "inside a record"), ("plot colsums", nul_meta, "in the metadata")):
        rf = RUNFILE[name]
        # a corrupt record: refused, or skipped with a warning naming the file (a checkpoint: refused)
        yield Case("nul", name, setv(CMD[name].argv, "--run", "{W}/r"), names=[os.path.basename(rf)],
                   expect="either" if name == "plot curves" else "refuse",
                   post=lambda ctx, res, rf=rf: [] if res.rc != 0 or os.path.basename(rf).encode() in res.err else
                   ["drew from a %s with a NUL byte without a word" % rf],
                   setup=run_copy(name, mut), outputs=out_rels(CMD[name]), what="%s: NUL %s" % (rf, what))
    npy = open(fx("q.npy"), "rb").read()
    yield Case("nul", "attn", setv(CMD["attn"].argv, "--q", "{W}/nul.npy"), names=["nul.npy"],
               setup=writer("nul.npy", npy[:20] + b"\0" + npy[21:]), outputs=out_rels(CMD["attn"]),
               what=".npy: NUL inside the header's dict")
    st = open(fx("m.st"), "rb").read()
    i = st.index(b"dim=8")
    yield Case("nul", "model show", ["model", "show", "--ckpt", "{W}/nul.st"], names=["nul.st"],
               setup=writer("nul.st", st[:i + 4] + b"\0" + st[i + 5:]), what="safetensors: NUL inside the metadata")


MODEL_INT_KEYS = ["dim", "depth", "heads", "mlp_dim", "vocab", "max_len", "classes", "sk_iters", "head_dim"]
MODEL_FLOAT_KEYS = ["sk_eps", "attn_scale", "dropout", "ln_eps", "sk_rho", "esp_t"]
OPTIM_INT_KEYS = ["warmup", "total_steps"]
OPTIM_FLOAT_KEYS = ["lr", "beta1", "beta2", "eps", "weight_decay", "clip", "momentum", "lr_min", "gamma"]


def cfg_with(key, value):
    parts = [p for p in TOK_CFG.split(",") if not p.startswith(key + "=")]
    return ",".join(parts + ["%s=%s" % (key, value)])


def gen_intrange():
    for c in CMDS:
        for flag in c.ints + c.seeds:
            for v in (SEED_BAD if flag in c.seeds else INT_BAD):
                if c.name == "train" and flag == "--warmup" and v == "-1":
                    v = "-2"   # (a run's warmup=-1 is the automatic warm-up, 5 % of the steps)
                yield int_case(c.name, setv(c.argv, flag, v), flag.lstrip("-").replace("-", "_"), v,
                               flag_names(flag), out_rels(c), setup_for(c), "%s %s" % (flag, v))
    mi = CMD["model init"]
    for key in MODEL_INT_KEYS:
        for v in INT_BAD:
            yield int_case("model init", setv(mi.argv, "--config", cfg_with(key, v)), key, v, [key], out_rels(mi),
                           what="--config %s=%s" % (key, v))
    mt = CMD["model train"]
    for key in OPTIM_INT_KEYS:
        for v in INT_BAD:
            yield int_case("model train", mt.argv + ["--optim", "%s=%s" % (key, v)], key, v, [key], out_rels(mt),
                           what="--optim %s=%s" % (key, v))
    sw = CMD["model swap"]
    for v in INT_BAD:
        yield int_case("model swap", sw.argv + ["sk_iters=%s" % v], "sk_iters", v, ["sk_iters"], out_rels(sw),
                       what="swap key sk_iters=%s" % v)
    for name, form in (("bench", "1:{}:4:2"), ("bench", "{}:8:4:2"), ("bench otk", "1:4:3:2:2:1:{}"),
                       ("bench asap", "1:{}:4")):
        c = CMD[name]
        for v in INT_BAD:
            yield Case("intrange", name, setv(c.argv, "--cases", form.format(v)), names=["--cases", v],
                       what="--cases %s" % form.format(v))
    c = CMD["plot colsums"]
    for v in INT_BAD:
        yield Case("intrange", "plot colsums", c.argv + ["--epochs", v], names=["--epochs", "epoch"], rcs=(1, 2),
                   outputs=out_rels(c), what="--epochs %s" % v)
    c = CMD["otk embed"]
    grid = setv(c.argv, "--refs", "{F}/oz4.npy") + ["--pe", "2d"]   # p = 4 supports, n = 4 = 2x2 elements
    for v in ("2147483648x1", "-1x4", "4294967297x4", "4x4294967297", "12abcx4", "2x2x2"):
        yield Case("intrange", "otk embed", grid + ["--grid", v], names=["--grid"], outputs=out_rels(c),
                   what="--grid %s (2x2 is valid)" % v)


def gen_float():
    for c in CMDS:
        for flag in c.floats:
            for v in FLOAT_BAD + [FLOAT_BIG]:
                yield Case("float", c.name, setv(c.argv, flag, v), names=flag_names(flag),
                           expect="either" if v == FLOAT_BIG else "refuse", finite=True,
                           setup=setup_for(c), outputs=out_rels(c), what="%s %s" % (flag, v))
    mi = CMD["model init"]
    for key in MODEL_FLOAT_KEYS:
        for v in FLOAT_BAD + [FLOAT_BIG]:
            yield Case("float", "model init", setv(mi.argv, "--config", cfg_with(key, v)), names=[key],
                       expect="either" if v == FLOAT_BIG else "refuse",
                       outputs=out_rels(mi), what="--config %s=%s" % (key, v))
    mt = CMD["model train"]
    for key in OPTIM_FLOAT_KEYS:
        for v in FLOAT_BAD + [FLOAT_BIG]:
            yield Case("float", "model train", mt.argv + ["--optim", "%s=%s" % (key, v)], names=[key],
                       expect="either" if v == FLOAT_BIG else "refuse", finite=True,
                       outputs=out_rels(mt), what="--optim %s=%s" % (key, v))
    for v in FLOAT_BAD + [FLOAT_BIG]:
        big = "either" if v == FLOAT_BIG else "refuse"
        yield Case("float", "model swap", CMD["model swap"].argv + ["sk_eps=%s" % v], names=["sk_eps"], expect=big,
                   finite=True, outputs=out_rels(CMD["model swap"]), what="swap key sk_eps=%s" % v)
        yield Case("float", "train", setv(CMD["train"].argv, "--config", "{W}/f.conf"), names=["lr", "f.conf"],
                   setup=writer("f.conf", TINY_CONF.encode() + b"lr = " + v.encode() + b"\n"), expect=big,
                   finite=True, outputs=["run"], what="config file lr = %s" % v)
    # finite inputs whose scores overflow float32: refused, or finite outputs
    ops = [("softmax", []), ("sinkhorn", ["--diag", "{W}/d.npy"]), ("unbalanced", ["--diag", "{W}/d.npy"]),
           ("esp", []), ("diff", ["--lambda", "{F}/lam.npy"]),
           ("lot", ["--pivots", "{F}/Z.npy", "--pivot-logits", "{F}/th.npy"])]
    for op, extra in ops:
        base = ["attn", "--op", op, "--v", "{F}/v.npy", "--out", "{W}/o.npy", "--attn", "{W}/a.npy", *extra]
        outs = ["o.npy", "a.npy"] + (["d.npy"] if "--diag" in extra else [])
        yield Case("float", "attn %s" % op, base + ["--q", "{F}/qbig.npy", "--k", "{F}/kbig.npy"], expect="either",
                   names=["overflow", "non-finite", "finite", "--q", "qbig"], outputs=outs, finite=True,
                   what="q, k ~ 1e20")
        yield Case("float", "attn %s" % op, base + ["--q", "{F}/q.npy", "--k", "{F}/k.npy", "--scale", "1e38"],
                   expect="either", names=["overflow", "non-finite", "finite", "--scale"], outputs=outs, finite=True,
                   what="--scale 1e38")
        yield Case("float", "attn %s" % op, base + ["--q", "{F}/q.npy", "--k", "{F}/k.npy", "--dout", "{F}/do.npy",
                                                    "--dq", "{W}/dq.npy", "--scale", "1e30"],
                   expect="either", names=["overflow", "non-finite", "finite", "--scale"], outputs=outs + ["dq.npy"],
                   finite=True, what="--scale 1e30 with the backward")
    yield Case("float", "attn asap", ["attn", "--op", "asap", "--q", "{W}/qb.npy", "--k", "{W}/kb.npy", "--v",
                                      "{F}/av.npy", "--layer", "{F}/l.asap", "--out", "{W}/o.npy"],
               setup=lambda ctx: [np.save(ctx.W("qb.npy"), np.load(fx("aq.npy")) * np.float32(1e20)),
                                  np.save(ctx.W("kb.npy"), np.load(fx("ak.npy")) * np.float32(1e20))],
               expect="either", names=["overflow", "non-finite", "finite", "qb.npy"], outputs=["o.npy"], finite=True,
               what="q, k ~ 1e20")
    oe = CMD["otk embed"]
    yield Case("float", "otk embed", setv(oe.argv, "--x", "{F}/oxbig.npy"), expect="either", finite=True,
               names=["overflow", "non-finite", "finite", "oxbig"], outputs=out_rels(oe), what="x ~ 1e20")
    yield Case("float", "otk fit-anchors", setv(CMD["otk fit-anchors"].argv, "--x", "{F}/oxbig.npy"), expect="either",
               finite=True, names=["overflow", "non-finite", "finite", "oxbig"], outputs=["w.npy"], what="x ~ 1e20")
    mg = CMD["model grads --x"]
    yield Case("float", "model grads --x", setv(mg.argv, "--x", "{F}/Xbig.npy"), expect="either", finite=True,
               names=["overflow", "non-finite", "finite", "Xbig"], outputs=["g"], what="x ~ 1e20",
               post=lambda ctx, res: [] if res.rc != 0 or b"nan" not in res.out.lower() else
               ["exit 0 printing a NaN loss"])
    yield Case("float", "asap calibrate", ["asap", "calibrate", "--q", "{W}/qb.npy", "--k", "{W}/kb.npy",
                                           "--teacher-iters", "4", "--slices", "4", "--out", "{W}/l.asap"],
               setup=lambda ctx: [np.save(ctx.W("qb.npy"), np.load(fx("aq.npy")) * np.float32(1e20)),
                                  np.save(ctx.W("kb.npy"), np.load(fx("ak.npy")) * np.float32(1e20))],
               expect="either", names=["overflow", "non-finite", "finite", "qb.npy"], outputs=["l.asap"],
               what="q, k ~ 1e20",
               post=lambda ctx, res: [] if res.rc != 0 or b"nan" not in (res.out + res.err).lower() else
               ["exit 0 reporting NaN"])


# ---- killed mid-write -------------------------------------------------------------------------
def killed_runner(trigger_frac, next_argv=None):
    """runs the command once to its end (the reference time), then again over the finished
    outputs and SIGKILLs it when a new entry appears in the output directories, or at
    trigger_frac of the reference time; then runs it (or next_argv) a third time to its end"""
    def runner(case, ctx):
        argv = fmt(case.argv, ctx)
        ref = Result()
        t0 = time.time()
        reap(launch(case, ctx, argv), ctx, 120, ref, t0)
        ctx.ref_time = ref.elapsed
        if ref.rc != 0:
            ctx.notes.append("the reference run failed (status %s): %s" % (ref.rc, ref.err[-300:]))
            return ref
        dirs = {os.path.dirname(ctx.W(o)) for o in case.outputs}
        for o in case.outputs:
            for d, subdirs, _ in os.walk(ctx.W(o)):
                dirs.add(d)
        ctx.old = {o: open(ctx.W(o), "rb").read() for o in case.outputs if os.path.isfile(ctx.W(o))}
        seen = {d: set(os.listdir(d)) for d in dirs if os.path.isdir(d)}
        k = Result()
        t0 = time.time()
        p = launch(case, ctx, argv)
        state = {"killed": False}

        def poll():
            new = False
            for d, names in seen.items():
                try:
                    if set(os.listdir(d)) - names:
                        new = True
                except OSError:
                    pass
            if new or time.time() - t0 > trigger_frac * ctx.ref_time:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                    state["killed"] = True
                except OSError:
                    pass
                return True
            return False
        reap(p, ctx, 120, k, t0, on_poll=poll)
        ctx.killed_rc = k.rc
        ctx.after_kill = snapshot(ctx.w)
        ctx.old_after_kill = {o: (open(ctx.W(o), "rb").read() if os.path.isfile(ctx.W(o)) else None)
                              for o in ctx.old}
        res = Result()
        t0 = time.time()
        reap(launch(case, ctx, fmt(next_argv, ctx) if next_argv else argv), ctx, 120, res, t0)
        return res
    return runner


INCONCLUSIVE = []


def killed_post(ctx, res):
    pr = list(ctx.notes)
    if not hasattr(ctx, "after_kill"):
        return pr
    if ctx.killed_rc != -signal.SIGKILL or (res.rc != 0 and b"finished" in res.err):
        INCONCLUSIVE.append(ctx.root)   # the run ended before the kill: nothing to check
        return pr
    if res.rc != 0:
        pr.append("the run after the kill failed (status %s)" % res.rc)
    # the old outputs: each intact or replaced by a complete new file (all-or-none)
    states = []
    for o, old in ctx.old.items():
        now = ctx.old_after_kill[o]
        if now == old:
            states.append("old")
        elif now is None:
            pr.append("the kill removed the old %s" % o)
        else:
            c = complete(ctx.W(o))
            states.append("new")
            if c:
                pr.append(c)
    if "old" in states and "new" in states and len(ctx.old) > 1:
        pr.append("after the kill some outputs were old and some new: %s" % dict(zip(ctx.old, states)))
    left = sorted(r for r in ctx.after_kill if looks_temporary(os.path.basename(r)))
    if left:
        final = snapshot(ctx.w)
        still = [r for r in left if r in final]
        if still and not any(os.path.basename(r).encode() in res.err for r in still):
            pr.append("leftovers of the killed run survive the next run without a word: %s" % ", ".join(still[:4]))
    return pr


def gen_killed():
    def big_attn(ctx):
        rng = np.random.default_rng(1)
        for n, s in (("bq.npy", (1, 2, 512, 16)), ("bk.npy", (1, 2, 2048, 16)), ("bv.npy", (1, 2, 2048, 16))):
            np.save(ctx.W(n), rng.standard_normal(s).astype("<f4"))
    attn = ["attn", "--op", "softmax", "--q", "{W}/bq.npy", "--k", "{W}/bk.npy", "--v", "{W}/bv.npy", "--out",
            "{W}/o.npy", "--attn", "{W}/a.npy", "--threads", "1"]
    big_cfg = "input=tokens,vocab=4096,max_len=64,dim=256,depth=4,heads=4,mlp_dim=1024,classes=2"
    gen = ["asap", "generate", "--b", "4", "--h", "4", "--n", "2048", "--d", "64", "--out-q", "{W}/gq.npy",
           "--out-k", "{W}/gk.npy", "--out-v", "{W}/gv.npy"]
    for frac in (0.5, 0.9, 1.5):
        yield Case("killed", "attn", attn, expect="ok", setup=big_attn, outputs=["o.npy", "a.npy"], serial=True,
                   runner=killed_runner(frac), post=killed_post, timeout=120,
                   what="SIGKILL while writing an 8 MB --attn (new entry or %.0f %% of the run)" % (100 * frac))
        yield Case("killed", "model init", ["model", "init", "--config", big_cfg, "--out", "{W}/big.safetensors"],
                   expect="ok", outputs=["big.safetensors"], serial=True, runner=killed_runner(frac),
                   post=killed_post, timeout=120,
                   what="SIGKILL while writing a 16 MB checkpoint (%.0f %%)" % (100 * frac))
    yield Case("killed", "asap generate", gen, expect="ok", outputs=["gq.npy", "gk.npy", "gv.npy"], serial=True,
               runner=killed_runner(0.7), post=killed_post, timeout=120, what="SIGKILL while writing 3 x 8 MB")

    conf = ["train", "--config", "{F}/tiny.conf", "--epochs", "6", "--dim", "64", "--mlp-dim", "256", "--depth", "2",
            "--out", "{W}/run", "--force"]
    yield Case("killed", "train", conf, expect="ok", outputs=["run"], serial=True, runner=killed_runner(0.6),
               post=killed_post, timeout=120, what="SIGKILL of train --force while it writes checkpoints")
    yield Case("killed", "train --resume", conf, expect="either", names=["run"], outputs=["run"], serial=True,
               runner=killed_runner(0.4, ["train", "--resume", "{W}/run"]), post=killed_post, timeout=120,
               what="SIGKILL of train while it writes checkpoints, then train --resume")


# ---- all or none ----------------------------------------------------------------------------
def gen_allornone():
    def old(rels):
        def s(ctx):
            for r in rels:
                open(ctx.W(r), "wb").write(b"OLD " + r.encode() + b"\n")
        return s

    def blocked_dir(rel):
        def s(ctx):
            os.makedirs(ctx.W(rel, "x"))
        return s
    # (command, argv, the output flag made unwritable, the other outputs)
    multi = []
    for c in CMDS:
        outs = [(f_, k) for f_, k in c.outputs if k != "dir"]
        if len(outs) >= 2:
            multi.append(c)
    for c in multi:
        rels = out_rels(c)
        for flag, kind in c.outputs:
            bad = file_value(c.argv, flag).replace("{W}/", "")
            good = [r for r in rels if r != bad]
            yield Case("allornone", c.name, c.argv, names=[bad], setup=chain(setup_for(c), blocked_dir(bad)),
                       outputs=good, what="%s is a directory: no other output committed" % flag,
                       post=lambda ctx, res, good=good: ["%s committed" % g for g in good if os.path.exists(ctx.W(g))])
            yield Case("allornone", c.name, c.argv, names=[bad], setup=chain(setup_for(c), old(good), blocked_dir(bad)),
                       outputs=good, what="%s is a directory: the old outputs are kept" % flag)
            yield Case("allornone", c.name, setv(c.argv, flag, "{W}/missing-dir/" + bad), names=["missing-dir"],
                       setup=setup_for(c), outputs=good, what="%s in a missing directory" % flag,
                       post=lambda ctx, res, good=good: ["%s committed" % g for g in good if os.path.exists(ctx.W(g))])
    # model grads: one of the files of --out-dir cannot be written
    mg = CMD["model grads"]
    for f_ in ("logits.npy", "loss.npy", "grads.safetensors"):
        def s(ctx, f_=f_):
            os.makedirs(ctx.W("g", f_, "x"))
        yield Case("allornone", "model grads", mg.argv, names=[f_], setup=s, outputs=[],
                   what="--out-dir with %s a directory: nothing written" % f_,
                   post=lambda ctx, res, f_=f_: ["%s committed" % g for g in ("logits.npy", "loss.npy",
                                                                             "grads.safetensors")
                                                 if g != f_ and os.path.exists(ctx.W("g", g))])
    # model train: the checkpoint and the losses
    mt = CMD["model train"]
    yield Case("allornone", "model train", setv(mt.argv, "--losses", "{W}/nodir/l.npy"), names=["nodir"],
               outputs=["mt.safetensors"], what="--losses unwritable: no checkpoint committed",
               post=lambda ctx, res: ["mt.safetensors committed"] if os.path.exists(ctx.W("mt.safetensors")) else [])


# ---- permissions ------------------------------------------------------------------------------
def gen_perms():
    for c in CMDS:
        if not c.ok:
            continue
        yield Case("perms", c.name, c.argv, expect="ok", setup=setup_for(c), outputs=out_rels(c), perms=True,
                   what="umask 022: outputs 0644, directories 0755")
        if c.outputs:
            yield Case("perms", c.name, c.argv, expect="ok", setup=setup_for(c), outputs=out_rels(c), perms=True,
                       umask=0o077, what="umask 077: outputs 0600, directories 0700")
    yield Case("perms", "train", ["train", "--config", "{F}/tiny.conf", "--out", "{W}/run", "--force"], expect="ok",
               outputs=["run"], perms=True, umask=0o027, setup=lambda ctx: os.mkdir(ctx.W("run")),
               what="umask 027 over an existing run directory")


def spec_arrays(ctx, d="d", x=None):
    """W/d: a valid npy dataset (x uint8 [40, 4, 4], y [40]); x replaced by a setup of its own if given"""
    os.makedirs(ctx.W(d), exist_ok=True)
    rng = np.random.default_rng(0)
    np.save(ctx.W(d, "y.npy"), rng.integers(0, 2, 40))
    if x is None:
        np.save(ctx.W(d, "x.npy"), rng.integers(0, 255, (40, 4, 4)).astype(np.uint8))
    else:
        x(ctx, ctx.W(d, "x.npy"))


def npy_bytes(a):
    import io
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


SPEC_TRAIN = ["--dim", "8", "--depth", "1", "--heads", "1", "--mlp-dim", "8", "--epochs", "1", "--progress", "none"]


def gen_specs():
    """the user's datasets (issue 43): spec files that are FIFOs, devices, directories, symlinks
    to endless inputs, cut archives; `data inspect` and `train --data` refuse them (or, for a FIFO
    holding the valid content, may read it) and `train` creates no run directory"""
    xs = npy_bytes(np.random.default_rng(0).integers(0, 255, (40, 4, 4)).astype(np.uint8))

    def fifo_x(ctx, p):
        fifo_writer(ctx, make_fifo(ctx, os.path.relpath(p, ctx.w)), xs)

    def dir_x(ctx, p):
        os.mkdir(p)

    def zero_x(ctx, p):
        os.symlink("/dev/zero", p)

    def cut_x(ctx, p):
        open(p, "wb").write(xs[:len(xs) // 2])
    for what, mk, expect in (("x.npy a FIFO holding a valid array", fifo_x, "either"),
                             ("x.npy a directory", dir_x, "refuse"),
                             ("x.npy a symlink to /dev/zero", zero_x, "refuse"),
                             ("x.npy cut in half", cut_x, "refuse")):
        st = lambda ctx, mk=mk: spec_arrays(ctx, x=mk)  # noqa: E731
        yield Case("specs", "data inspect", ["data", "inspect", "npy:{W}/d"], expect=expect, names=["x.npy"],
                   setup=st, timeout=60, what=what)
        yield Case("specs", "train", ["train", "--data", "npy:{W}/d", *SPEC_TRAIN, "--out", "{W}/run"],
                   expect=expect, names=["x.npy"], outputs=["run"], setup=st, timeout=120, what=what)
    def npz_cut(n):
        def s(ctx):
            import io
            b = io.BytesIO()
            np.savez(b, x=np.zeros((8, 4, 4), np.float32), y=np.arange(8) % 2)
            raw = b.getvalue()
            open(ctx.W("a.npz"), "wb").write(raw[:max(1, int(len(raw) * n))])
        return s
    for frac in (0.1, 0.5, 0.97):
        yield Case("specs", "data inspect", ["data", "inspect", "npz:{W}/a.npz"], names=["a.npz"], setup=npz_cut(frac),
                   timeout=60, what="an .npz cut at %d %%" % int(frac * 100))
    text = b"".join(b"%s\tsome text number %d\n" % (b"ab"[i % 2:i % 2 + 1], i) for i in range(60))

    def zero_t(ctx):
        os.symlink("/dev/zero", ctx.W("t.tsv"))

    def dir_t(ctx):
        os.mkdir(ctx.W("t.tsv"))

    def fifo_t(ctx):
        fifo_writer(ctx, make_fifo(ctx, "t.tsv"), text)
    for what, st, expect in (("a TSV that is /dev/zero", zero_t, "refuse"), ("a TSV that is a directory", dir_t, "refuse"),
                             ("a TSV that is a FIFO holding valid text", fifo_t, "either")):
        yield Case("specs", "data inspect", ["data", "inspect", "tsv:{W}/t.tsv", "--spm-vocab", "300"], expect=expect,
                   names=["t.tsv"], setup=st, timeout=60, what=what)
        yield Case("specs", "train", ["train", "--data", "tsv:{W}/t.tsv", "--spm-vocab", "300", *SPEC_TRAIN, "--out",
                                      "{W}/run"], expect=expect, names=["t.tsv"], outputs=["run"], setup=st,
                   timeout=120, what=what)

    def par(ctx):
        open(ctx.W("a.src"), "w").write("uno\ndos\n")
        os.mkdir(ctx.W("a.tgt"))
    yield Case("specs", "train", ["train", "--data", "parallel:{W}/a.src,{W}/a.tgt", *SPEC_TRAIN, "--out", "{W}/run"],
               names=["a.tgt"], outputs=["run"], setup=par, timeout=60, what="a parallel side that is a directory")


GENERATORS = {"missing": gen_missing, "empty": gen_empty, "truncated": gen_truncated, "huge": gen_huge,
              "nonregular": gen_nonregular, "symlink": gen_symlink, "device": gen_device, "readonly": gen_readonly,
              "nonutf8": gen_nonutf8, "nul": gen_nul, "intrange": gen_intrange, "float": gen_float,
              "killed": gen_killed, "allornone": gen_allornone, "perms": gen_perms, "specs": gen_specs}


# ---------------------------------------------------------------------------------------------
def shown(argv):
    out = []
    for a in argv:
        s = a if isinstance(a, str) else a.decode("utf-8", "backslashreplace")
        s = s.replace(F, "F").replace("{F}", "F").replace("{W}", "W").replace("{V}", "V")
        s = "".join(ch if ch.isprintable() else "\\x%02x" % ord(ch) for ch in s)
        out.append(s if s and " " not in s else repr(s))
    return " ".join(out)


def tail(b, n=300):
    """stderr shown: its start and its end (a usage text after a message), control bytes escaped"""
    s = b.decode("utf-8", "backslashreplace").strip()
    s = "".join(ch if ch.isprintable() or ch == "\n" else "\\x%02x" % ord(ch) for ch in s)
    return s if len(s) <= n else s[:n // 2] + " [...] " + s[-n // 2:]


def main():
    global FSNAP
    t_start = time.time()
    make_fixtures()
    FSNAP = snapshot(F)
    classes = A.only or list(CLASSES)
    cases = [c for k in classes for c in GENERATORS[k]()]
    stats = {k: [0, 0, 0, 0.0] for k in classes}
    slow = []
    failures = []
    parallel = [(i, c) for i, c in enumerate(cases) if not c.serial]
    serial = [(i, c) for i, c in enumerate(cases) if c.serial]
    lock = threading.Lock()

    def record(case, res, problems):
        with lock:
            s = stats[case.cls]
            s[0] += 1
            ok = not problems
            s[1 if ok else 2] += 1
            s[3] += case.seconds
            slow.append((case.seconds, case))
            name = "%s | %s | %s" % (case.cls, case.cmd, case.what)
            detail = "; ".join(problems)
            if res is not None and problems:
                detail += " [rc %s, %.1f s] birkhoff %s\n    stderr: %s" % (res.rc, res.elapsed, shown(case.argv),
                                                                         tail(res.err, 240))
            check(ok, name, detail)
            if A.v and ok:
                print("ok   %s [%.2f s]" % (name, res.elapsed if res else 0))
            if not ok:
                failures.append((case, res, problems))

    with cf.ThreadPoolExecutor(max_workers=max(1, A.jobs)) as ex:
        futs = [ex.submit(execute, c, i) for i, c in parallel]
        for f_ in cf.as_completed(futs):
            record(*f_.result())
    for i, c in serial:
        record(*execute(c, i))

    print()
    if A.v:
        print("slowest cases:")
        for sec, case in sorted(slow, key=lambda x: -x[0])[:12]:
            print("  %5.1f s  %s | %s | %s" % (sec, case.cls, case.cmd, case.what))
    if INCONCLUSIVE:
        print("note: %d killed cases ended before their SIGKILL (nothing to check)" % len(INCONCLUSIVE))
    print("%-12s %8s %7s %7s %9s" % ("class", "attempts", "passed", "failed", "case-s"))
    tot = [0, 0, 0, 0.0]
    for k in classes:
        s = stats[k]
        print("%-12s %8d %7d %7d %9.0f" % (k, *s))
        tot = [a + b for a, b in zip(tot, s)]
    print("%-12s %8d %7d %7d %9.0f" % ("total", *tot))
    print("(%.0f s wall, %d at once; case-s: the seconds of each class's cases, setup and checks included)"
          % (time.time() - t_start, A.jobs))
    if A.list_failures:
        with open(A.list_failures, "w", errors="backslashreplace") as f:
            f.write("# birkhoff hostile-input suite: %d of %d cases fail (%s)\n" % (len(failures), tot[0], BK))
            f.write("# class | command | case | what went wrong\n")
            for case, res, problems in sorted(failures, key=lambda x: (x[0].cls, x[0].cmd)):
                f.write("%s | %s | %s\n" % (case.cls, case.cmd, case.what))
                f.write("    argv: birkhoff %s\n" % shown(case.argv))
                for p in problems:
                    f.write("    problem: %s\n" % p.replace("\n", " "))
                if res is not None:
                    f.write("    status: %s (%.1f s)\n    stderr: %s\n" % (res.rc, res.elapsed,
                                                                        tail(res.err).replace("\n", "\n            ")))
    if not A.keep:
        shutil.rmtree(BASE, ignore_errors=True)
    else:
        print("kept", BASE)
    return check.summary(" (hostile inputs)")


if __name__ == "__main__":
    try:
        status = main()
    finally:
        if not A.keep:
            shutil.rmtree(BASE, ignore_errors=True)
    sys.exit(status)
