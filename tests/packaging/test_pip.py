"""The Python package by the standard route (`make check-pip`, part of `make check`).

In a fresh virtual environment of this Python (--system-site-packages: numpy and torch
come from Debian, nothing can be downloaded), from outside the source tree:
  - `pip install --no-index SRC` with build isolation (pyproject.toml's requires = []);
  - `import birkhoff` loads the library bundled in the installed package, its version is
    core.h's, an operator runs; the bundled library's dependencies all resolve (ldd);
  - `python -m birkhoff` and the `birkhoff` script run the bundled CLI with its exit status;
  - `pip wheel SRC`: the wheel's RECORD lists every file with the right sha256 and size,
    executables keep their mode, nothing outside the package; the metadata's version;
  - the backend's sdist holds the sources and no build directory, run or data set, and a
    wheel builds from it (`pip wheel SDIST`);
  - as an unprivileged user (nobody, through setpriv, when this runs as root): a venv of
    its own, the wheel installed into it, import and CLI;
  - `pip uninstall -y birkhoff` leaves the environment as it was.
BIRKHOFF_BUILD_DIR (passed through to the backend) reuses a build's objects; without it
each build compiles the library from source. BIRKHOFF_TEST_FRESH=1 makes the unprivileged
user build from the sdist from scratch instead of installing the wheel.
Usage: /usr/bin/python3 tests/packaging/test_pip.py
"""
import base64
import csv
import hashlib
import io
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tests"))
from checklib import Checks  # noqa: E402

check = Checks()


def core_version():
    text = open(os.path.join(SRC, "include", "birkhoff", "core.h")).read()
    return ".".join(re.search(r"#define BK_VERSION_%s (\d+)" % k, text).group(1) for k in ("MAJOR", "MINOR", "PATCH"))


VERSION = core_version()
MAJOR = VERSION.split(".")[0]


def clean_env(**extra):
    env = dict(os.environ)
    for k in ("PYTHONPATH", "BIRKHOFF_LIB", "BIRKHOFF_CLI", "PYTHONHOME", "PIP_USER", "PIP_INDEX_URL",
              "PIP_FIND_LINKS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
        env.pop(k, None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env["PIP_CONFIG_FILE"] = os.devnull   # this machine's pip configuration (find-links, indexes) is not the test's
    env.update(extra)
    return env


def run(cmd, cwd, env=None, user=None):
    """runs cmd (as `user` through setpriv when given); returns (status, stdout+stderr)"""
    if user is not None:
        pw = pwd.getpwnam(user)
        cmd = ["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--clear-groups", "--"] + cmd
    r = subprocess.run(cmd, cwd=cwd, env=env or clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return r.returncode, r.stdout.decode(errors="replace")


def snapshot(root):
    """the files and links under root"""
    out = set()
    for d, dirs, files in os.walk(root):
        for f in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            out.add(os.path.relpath(os.path.join(d, f), root))
    return out


PROBE = r"""
import json, os, sys, numpy as np
import birkhoff
x = np.ones((1, 1, 2, 2), np.float32)
out = birkhoff.sinkhorn(x, x, x).out
print(json.dumps({"lib": os.path.realpath(birkhoff.LIBRARY_PATH), "file": os.path.realpath(birkhoff.__file__),
                  "version": birkhoff.__version__, "ok": bool(np.allclose(out, 1)), "prefix": sys.prefix}))
"""


def unprivileged_ok(tmp):
    """whether the unprivileged case can run here (says why not)"""
    why = None
    if not shutil.which("setpriv"):
        why = "setpriv is missing"
    else:
        try:
            pwd.getpwnam("nobody")
        except KeyError:
            why = "there is no user nobody"
    d = os.path.dirname(tmp)
    while why is None and d != os.path.dirname(d):
        if not os.stat(d).st_mode & stat.S_IXOTH:
            why = "%s is closed to other users (set TMPDIR)" % d
        d = os.path.dirname(d)
    if why:
        print("note: the unprivileged install is not tested: " + why)
    return why is None


def check_env(tag, py, venv, tmp, user=None):
    """import, version, an operator, the CLI through python -m and the script, from tmp"""
    st, out = run([py, "-c", PROBE], cwd=tmp, user=user)
    if not check(st == 0, tag + ": import birkhoff", out):
        return
    info = json.loads(out.strip().splitlines()[-1])
    venv = os.path.realpath(venv)
    check(info["file"].startswith(venv + os.sep), tag + ": the package imported is the venv's", info)
    check(info["lib"].startswith(venv + os.sep) and "/birkhoff/_native/" in info["lib"],
          tag + ": LIBRARY_PATH is the library bundled in the venv's package", info)
    check(info["version"] == VERSION, tag + ": birkhoff.__version__ is core.h's %s" % VERSION, info)
    check(info["ok"], tag + ": sinkhorn on ones gives ones", info)
    st, out = run(["ldd", info["lib"]], cwd=tmp)
    check(st == 0 and "not found" not in out, tag + ": ldd finds every library the bundled .so needs", out)

    cli = os.path.join(os.path.dirname(info["lib"]), "birkhoff")
    st, out = run([py, "-m", "birkhoff", "--version"], cwd=tmp, user=user)
    check(st == 0 and out.startswith("birkhoff %s " % VERSION), tag + ": python -m birkhoff --version", (st, out))
    st, out = run([py, "-m", "birkhoff", "--help"], cwd=tmp, user=user)
    check(st == 0 and "usage: birkhoff COMMAND" in out, tag + ": python -m birkhoff --help", (st, out))
    st_direct, _ = run([cli, "no-such-command"], cwd=tmp, user=user)
    st, out = run([py, "-m", "birkhoff", "no-such-command"], cwd=tmp, user=user)
    check(st != 0 and st == st_direct and "unknown command" in out,
          tag + ": python -m birkhoff no-such-command fails with the CLI's status %d" % st_direct, (st, out))
    script = os.path.join(venv, "bin", "birkhoff")
    st, out = run([script, "version"], cwd=tmp, user=user)
    check(st == 0 and out.startswith("birkhoff %s " % VERSION), tag + ": the birkhoff script", (st, out))
    st, out = run([script, "attn", "--no-such-option"], cwd=tmp, user=user)
    st_direct, _ = run([cli, "attn", "--no-such-option"], cwd=tmp, user=user)
    check(st == st_direct != 0, tag + ": the birkhoff script passes the CLI's exit status (%d)" % st_direct, (st, out))


def check_wheel(path):
    """RECORD against the contents; modes; no stray paths; metadata"""
    name = os.path.basename(path)
    check(re.match(r"birkhoff-%s-py3-none-linux_[a-z0-9_]+\.whl$" % re.escape(VERSION), name) is not None,
          "wheel name %s" % name)
    di = "birkhoff-%s.dist-info/" % VERSION
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        check(len(names) == len(set(names)), "wheel: no duplicate entries")
        rows = list(csv.reader(io.StringIO(z.read(di + "RECORD").decode())))
        listed = {r[0]: r for r in rows}
        check(set(listed) == set(names), "wheel: RECORD lists exactly the files of the wheel",
              set(listed) ^ set(names))
        bad = []
        for r in rows:
            if r[0] == di + "RECORD":
                if r[1:] != ["", ""]:
                    bad.append(r)
                continue
            data = z.read(r[0])
            digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if r[1] != digest or r[2] != str(len(data)):
                bad.append(r[0])
        check(not bad, "wheel: every RECORD hash and size verifies (%d files)" % len(rows), bad)
        stray = [n for n in names if not (n.startswith("birkhoff/") or n.startswith(di))]
        check(not stray, "wheel: nothing outside birkhoff/ and its dist-info", stray)
        check(not [n for n in names if "__pycache__" in n or n.endswith(".pyc")], "wheel: no bytecode")
        for n in ("birkhoff/__init__.py", "birkhoff/__main__.py", "birkhoff/_lib.py",
                  "birkhoff/_native/libbirkhoff.so", "birkhoff/_native/birkhoff"):
            check(n in names, "wheel has " + n)
        for n in ("birkhoff/_native/libbirkhoff.so", "birkhoff/_native/birkhoff"):
            if n in names:
                mode = z.getinfo(n).external_attr >> 16
                check(stat.S_ISREG(mode) and mode & 0o111, "wheel: %s is executable" % n, oct(mode))
        meta = z.read(di + "METADATA").decode()
        check(re.search(r"^Version: %s$" % re.escape(VERSION), meta, re.M) is not None, "METADATA version", meta[:300])
        check("Requires-Dist: numpy" in meta and 'Requires-Dist: torch>=1.13.0a0,<3; extra == "torch"' in meta,
              "METADATA dependencies (numpy; torch>=1.13.0a0,<3 as an extra)", meta[:600])
        wheel = z.read(di + "WHEEL").decode()
        check("Root-Is-Purelib: false" in wheel and "Tag: py3-none-linux_" in wheel, "WHEEL file", wheel)
        ep = z.read(di + "entry_points.txt").decode()
        check("birkhoff = birkhoff.__main__:main" in ep, "entry_points.txt has the birkhoff script", ep)


def check_sdist(path):
    base = "birkhoff-%s/" % VERSION
    with tarfile.open(path) as t:
        names = t.getnames()
    check(all(n.startswith(base) for n in names), "sdist: everything under " + base)
    rel = [n[len(base):] for n in names]
    for need in ("pyproject.toml", "PKG-INFO", "Makefile", "README.md", "birkhoff.pc.in", "include/birkhoff/core.h",
                 "tools/pybuild/birkhoff_build.py", "python/birkhoff/__init__.py", "python/birkhoff/__main__.py",
                 "cmake/birkhoffConfig.cmake.in", "src/core/status.c", "tools/main.c"):
        check(need in rel, "sdist has " + need)
    junk = [r for r in rel if re.match(r"(build[^/]*|runs|data|gpu-out|\.devpack|\.devlibs|\.devdata|\.git|dist)(/|$)", r)
            or "__pycache__" in r or r.endswith((".o", ".pyc", ".so", ".whl"))]
    check(not junk, "sdist: no build directory, run, data set, object or bytecode", junk[:20])


def main():
    tmp = tempfile.mkdtemp(prefix="bk-pip-")
    os.chmod(tmp, 0o755)
    try:
        venv = os.path.join(tmp, "venv")
        py = os.path.join(venv, "bin", "python")
        st, out = run([sys.executable, "-m", "venv", "--system-site-packages", venv], cwd=tmp)
        if not check(st == 0, "python -m venv", out):
            return check.summary()
        before = snapshot(venv)

        # pip install . (with build isolation: requires = [] needs nothing fetched)
        st, out = run([py, "-m", "pip", "install", "--no-index", "--no-cache-dir", SRC], cwd=tmp)
        if not check(st == 0, "pip install --no-index SRC", out):
            return check.summary()
        print("pip install --no-index %s: %s" % (SRC, out.strip().splitlines()[-1]))
        check_env("venv", py, venv, tmp)

        # pip wheel .
        dist = os.path.join(tmp, "dist")
        st, out = run([py, "-m", "pip", "wheel", "--no-index", "--no-deps", "--no-cache-dir", "-w", dist, SRC], cwd=tmp)
        wheels = [os.path.join(dist, f) for f in os.listdir(dist)] if os.path.isdir(dist) else []
        if check(st == 0 and len(wheels) == 1, "pip wheel SRC", out):
            check_wheel(wheels[0])
            print("pip wheel: %s, %.1f MB" % (os.path.basename(wheels[0]), os.path.getsize(wheels[0]) / 1e6))

        # the sdist (the backend's hook, as a frontend calls it), and a wheel built from it
        sdir = os.path.join(tmp, "sdist")
        st, out = run([py, "-c", "import sys; sys.path.insert(0, %r); import birkhoff_build as b; "
                       "print(b.build_sdist(%r))" % (os.path.join(SRC, "tools", "pybuild"), sdir)], cwd=tmp)
        sdist = os.path.join(sdir, out.strip().splitlines()[-1]) if st == 0 else None
        if check(st == 0 and os.path.isfile(sdist), "build_sdist", out):
            check_sdist(sdist)
            os.chmod(sdir, 0o755)
            st, out = run([py, "-m", "pip", "wheel", "--no-index", "--no-deps", "--no-cache-dir",
                           "-w", os.path.join(tmp, "dist-sdist"), sdist], cwd=tmp)
            check(st == 0 and len(os.listdir(os.path.join(tmp, "dist-sdist"))) == 1, "pip wheel SDIST", out)

        # an unprivileged user: its own venv, the wheel (or, with BIRKHOFF_TEST_FRESH=1, the sdist
        # built from scratch) installed into it
        if os.geteuid() != 0:
            print("running as uid %d: the installation above was an unprivileged one" % os.geteuid())
        elif not unprivileged_ok(tmp):
            pass
        elif wheels:
            home = os.path.join(tmp, "nobody")
            os.mkdir(home)
            pw = pwd.getpwnam("nobody")
            os.chown(home, pw.pw_uid, pw.pw_gid)
            for d in (dist, sdir):
                if os.path.isdir(d):
                    os.chmod(d, 0o755)
            env = clean_env(HOME=home, TMPDIR=home)
            env.pop("BIRKHOFF_BUILD_DIR", None)
            nvenv = os.path.join(home, "venv")
            st, out = run([sys.executable, "-m", "venv", "--system-site-packages", nvenv], cwd=home, env=env, user="nobody")
            what = sdist if os.environ.get("BIRKHOFF_TEST_FRESH") == "1" and sdist else wheels[0]
            if check(st == 0, "nobody: python -m venv", out):
                st, out = run([os.path.join(nvenv, "bin", "python"), "-m", "pip", "install", "--no-index",
                               "--no-cache-dir", what], cwd=home, env=env, user="nobody")
                if check(st == 0, "nobody: pip install " + os.path.basename(what), out):
                    print("as nobody: pip install %s: %s" % (os.path.basename(what), out.strip().splitlines()[-1]))
                    check_env("nobody", os.path.join(nvenv, "bin", "python"), nvenv, home, user="nobody")

        # pip uninstall leaves the venv as it was
        st, out = run([py, "-m", "pip", "uninstall", "-y", "birkhoff"], cwd=tmp)
        check(st == 0, "pip uninstall -y birkhoff", out)
        left = snapshot(venv) - before
        check(not left, "pip uninstall: no file of the installation is left in the venv", sorted(left)[:20])
        st, out = run([py, "-c", "import birkhoff, os; print(os.path.realpath(birkhoff.__file__))"], cwd=tmp)
        check(st != 0 or not out.strip().startswith(os.path.realpath(venv)), "after uninstall the venv has no birkhoff",
              out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return check.summary(" (tests/packaging/test_pip.py)")


if __name__ == "__main__":
    sys.exit(main())
