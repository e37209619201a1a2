"""The PEP 517 build backend of the birkhoff Python package (in-tree, standard library only).

pyproject.toml names it with `backend-path = ["tools/pybuild"]` and `requires = []`, so
`pip install .` and `pip wheel .` need nothing from a package index, with or without
build isolation (pip's isolated build environment would have to fetch setuptools or
hatchling from an index: Debian's packages of them are not visible there). What it does:

  build_wheel    runs the Makefile (`make BUILD=<dir> all`: libbirkhoff and the birkhoff
                 CLI) and writes a wheel of python/birkhoff with the shared library and the
                 CLI inside the package (birkhoff/_native/), tagged py3-none-<platform>
                 (ctypes: no dependence on the Python ABI, only on the machine);
  build_sdist    a .tar.gz of the source tree (git's tracked and unignored files, or a walk
                 of the tree when there is no git), without build directories, runs or data;
  build_editable a wheel whose .pth puts python/ on sys.path (the package then loads
                 build/libbirkhoff.so from the source tree; it runs `make all` there).

The wheel's libbirkhoff.so links the system libraries the Makefile names (OpenBLAS, LAPACKE,
zlib, SentencePiece: Debian libopenblas0, liblapacke, zlib1g, libsentencepiece0, which
scripts/deps.sh installs with their -dev packages), as DT_NEEDED entries resolved at load time
(tests/packaging/test_pip.py checks them with ldd); they are not copied into the wheel.

The version is the C library's (BK_VERSION_MAJOR/MINOR/PATCH in include/birkhoff/core.h);
the rest of the metadata is pyproject.toml's [project] table.

Environment and config settings (`pip ... --config-settings make-args="CUDA=0"`):
  BIRKHOFF_BUILD_DIR   the make BUILD directory of build_wheel (default: build-wheel in
                       the source tree); pointing it at an existing build reuses its objects
                       (make rebuilds only what is out of date)
  BIRKHOFF_MAKE_ARGS   extra make arguments (e.g. "CUDA=0"), also config setting make-args
  BIRKHOFF_JOBS        make's -j (default: the CPUs this process may run on)
"""
import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "birkhoff"
PKG_SRC = os.path.join(ROOT, "python", NAME)
NATIVE = "_native"          # birkhoff/_native/: libbirkhoff.so and the birkhoff CLI
LIB_FILE = "libbirkhoff.so"
CLI_FILE = "birkhoff"
# never in an sdist, whatever git says (build outputs, runs, data, local caches)
EXCLUDE_TOP = re.compile(r"^(build[^/]*|dist|runs|data|gpu-out|\.devpack|\.devlibs|\.devdata|\.git|"
                         r"\.venv|venv)(/|$)")
EXCLUDE_ANY = re.compile(r"(^|/)(__pycache__|[^/]*\.pyc|[^/]*\.o|[^/]*\.egg-info)(/|$)")


# --------------------------------------------------------------------------- metadata

def _version():
    """MAJOR.MINOR.PATCH from include/birkhoff/core.h (the one place the version lives)"""
    with open(os.path.join(ROOT, "include", "birkhoff", "core.h")) as f:
        text = f.read()
    parts = []
    for k in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"^\s*#\s*define\s+BK_VERSION_%s\s+(\d+)\s*$" % k, text, re.M)
        if not m:
            raise RuntimeError("birkhoff build: BK_VERSION_%s not found in include/birkhoff/core.h" % k)
        parts.append(m.group(1))
    return ".".join(parts)


def _project():
    """pyproject.toml's [project] table"""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        try:
            import tomli as tomllib
        except ImportError:
            raise RuntimeError("birkhoff build: reading pyproject.toml needs Python >= 3.11 (tomllib) or tomli")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f).get("project", {})


def _dist_name(version):
    return "%s-%s" % (NAME, version)


def _metadata(version):
    """the METADATA / PKG-INFO text (core metadata 2.1)"""
    p = _project()
    if p.get("name", NAME) != NAME:
        raise RuntimeError("birkhoff build: pyproject.toml names the project %r" % p.get("name"))
    lines = ["Metadata-Version: 2.1", "Name: " + NAME, "Version: " + version]
    if "description" in p:
        lines.append("Summary: " + p["description"])
    if "requires-python" in p:
        lines.append("Requires-Python: " + p["requires-python"])
    for url_name, url in p.get("urls", {}).items():
        lines.append("Project-URL: %s, %s" % (url_name, url))
    if p.get("keywords"):
        lines.append("Keywords: " + ",".join(p["keywords"]))
    for c in p.get("classifiers", []):
        lines.append("Classifier: " + c)
    for d in p.get("dependencies", []):
        lines.append("Requires-Dist: " + d)
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append("Provides-Extra: " + extra)
        for d in deps:
            req, _, marker = d.partition(";")
            marker = ("(%s) and " % marker.strip() if marker.strip() else "") + 'extra == "%s"' % extra
            lines.append("Requires-Dist: %s; %s" % (req.strip(), marker))
    body = ""
    readme = p.get("readme")
    if isinstance(readme, str):
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            body = f.read()
        lines.append("Description-Content-Type: " +
                     ("text/markdown" if readme.endswith(".md") else "text/plain"))
    return "\n".join(lines) + "\n\n" + body


def _entry_points():
    scripts = _project().get("scripts", {})
    if not scripts:
        return None
    return "[console_scripts]\n" + "".join("%s = %s\n" % kv for kv in scripts.items())


def _tag():
    """py3-none-<platform>: ctypes, no Python ABI; the platform of this interpreter"""
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "py3-none-" + plat


def _wheel_file(tag):
    return ("Wheel-Version: 1.0\nGenerator: birkhoff_build (tools/pybuild)\n"
            "Root-Is-Purelib: false\nTag: %s\n" % tag)


def _dist_info_files(version, tag):
    """{name: bytes} of the .dist-info directory, RECORD excepted"""
    files = {"METADATA": _metadata(version).encode("utf-8"), "WHEEL": _wheel_file(tag).encode()}
    ep = _entry_points()
    if ep:
        files["entry_points.txt"] = ep.encode()
    return files


# --------------------------------------------------------------------------- building

def _make(build_dir, config_settings, target="all"):
    """make BUILD=build_dir target in the source tree; returns the build directory"""
    args = shlex.split(os.environ.get("BIRKHOFF_MAKE_ARGS", ""))
    cs = (config_settings or {}).get("make-args")
    if cs:
        args += shlex.split(cs) if isinstance(cs, str) else list(cs)
    jobs = os.environ.get("BIRKHOFF_JOBS") or str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                                   else (os.cpu_count() or 1))
    env = dict(os.environ)
    for k in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):  # a calling make's jobserver is not ours
        env.pop(k, None)
    cmd = [os.environ.get("MAKE", "make"), "-C", ROOT, "-j" + jobs, "BUILD=" + build_dir] + args + [target]
    print("birkhoff build: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    # make's output goes to stderr: a frontend may read the backend's stdout
    try:
        out = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        out = None
    r = subprocess.run(cmd, env=env, stdout=out)
    if r.returncode:
        raise RuntimeError("birkhoff build: make failed (exit status %d): %s" % (r.returncode, " ".join(cmd)))
    return build_dir


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def _zip_time():
    """SOURCE_DATE_EPOCH when set (reproducible wheels), else now"""
    t = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    return max(time.gmtime(t)[:6], (1980, 1, 1, 0, 0, 0))


def _write_wheel(path, entries, dist_info, dist_files):
    """entries: [(arcname, bytes, executable)] plus the dist-info files; writes RECORD last"""
    stamp = _zip_time()
    record = []
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        def add(arcname, data, executable=False):
            zi = zipfile.ZipInfo(arcname, date_time=stamp)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = ((0o755 if executable else 0o644) | 0o100000) << 16
            z.writestr(zi, data)
            record.append(_record_line(arcname, data))
        for arcname, data, exe in entries:
            add(arcname, data, exe)
        for name, data in dist_files.items():
            add(dist_info + "/" + name, data)
        rec = "\n".join(record + [dist_info + "/RECORD,,"]) + "\n"
        zi = zipfile.ZipInfo(dist_info + "/RECORD", date_time=stamp)
        zi.compress_type = zipfile.ZIP_DEFLATED
        zi.external_attr = (0o644 | 0o100000) << 16
        z.writestr(zi, rec)


def _package_sources():
    """the package's .py files: [(arcname, bytes)]"""
    out = []
    for name in sorted(os.listdir(PKG_SRC)):
        if name.endswith(".py") and name != "_install.py":   # _install.py is make install's
            with open(os.path.join(PKG_SRC, name), "rb") as f:
                out.append(("%s/%s" % (NAME, name), f.read()))
    return out


# --------------------------------------------------------------------------- PEP 517 hooks

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    version = _version()
    dist_info = _dist_name(version) + ".dist-info"
    d = os.path.join(metadata_directory, dist_info)
    os.makedirs(d, exist_ok=True)
    for name, data in _dist_info_files(version, _tag()).items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return dist_info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    build_dir = os.path.abspath(os.environ.get("BIRKHOFF_BUILD_DIR") or os.path.join(ROOT, "build-wheel"))
    _make(build_dir, config_settings)
    entries = [(a, d, False) for a, d in _package_sources()]
    for fname, exe in ((LIB_FILE, True), (CLI_FILE, True)):
        with open(os.path.join(build_dir, fname), "rb") as f:
            entries.append(("%s/%s/%s" % (NAME, NATIVE, fname), f.read(), exe))
    tag = _tag()
    dist_info = _dist_name(version) + ".dist-info"
    wheel = "%s-%s.whl" % (_dist_name(version), tag)
    os.makedirs(wheel_directory, exist_ok=True)
    _write_wheel(os.path.join(wheel_directory, wheel), entries, dist_info, _dist_info_files(version, tag))
    return wheel


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """a .pth to python/ in the source tree; the library is the tree's build/libbirkhoff.so
    (the package's source-tree lookup), built here by `make all`"""
    version = _version()
    _make(os.path.join(ROOT, "build"), config_settings)
    tag = _tag()
    dist_info = _dist_name(version) + ".dist-info"
    wheel = "%s-%s.whl" % (_dist_name(version), tag)
    pth = (os.path.join(ROOT, "python") + "\n").encode()
    os.makedirs(wheel_directory, exist_ok=True)
    _write_wheel(os.path.join(wheel_directory, wheel), [("__editable__.%s.pth" % NAME, pth, False)],
                 dist_info, _dist_info_files(version, tag))
    return wheel


def _source_files():
    """relative paths of the sdist: git's tracked and unignored files, or a walk of the tree"""
    paths = None
    if os.path.isdir(os.path.join(ROOT, ".git")) and shutil.which("git"):
        r = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if r.returncode == 0:
            paths = [p for p in r.stdout.decode().split("\0") if p]
    if paths is None:
        paths = []
        for d, dirs, files in os.walk(ROOT):
            rel = os.path.relpath(d, ROOT)
            rel = "" if rel == "." else rel + "/"
            dirs[:] = sorted(x for x in dirs if not EXCLUDE_TOP.match(rel + x) and not EXCLUDE_ANY.search(rel + x))
            paths += [rel + f for f in files]
    return sorted(p for p in paths if not EXCLUDE_TOP.match(p) and not EXCLUDE_ANY.search(p)
                  and os.path.isfile(os.path.join(ROOT, p)))


def build_sdist(sdist_directory, config_settings=None):
    version = _version()
    base = _dist_name(version)
    stamp = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    os.makedirs(sdist_directory, exist_ok=True)
    out = os.path.join(sdist_directory, base + ".tar.gz")
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        def add_bytes(name, data, mode=0o644):
            ti = tarfile.TarInfo(base + "/" + name)
            ti.size, ti.mode, ti.mtime = len(data), mode, stamp
            tar.addfile(ti, io.BytesIO(data))
        for rel in _source_files():
            full = os.path.join(ROOT, rel)
            ti = tar.gettarinfo(full, base + "/" + rel)
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            if ti.isfile():
                with open(full, "rb") as f:
                    tar.addfile(ti, f)
            else:
                tar.addfile(ti)
        add_bytes("PKG-INFO", _metadata(version).encode("utf-8"))
    return os.path.basename(out)
