"""Install as a PyTorch user would (`make check-pip`, part of `make check`).

In the virtual environment that has torch from pip (`make venv-torch2`: build/venv-torch2, torch
2.13.0 and numpy from the registry, not Debian's packages), with pip's machine configuration
ignored and no index (PIP_NO_INDEX=1: nothing may be fetched):
  - the environment's torch is pip's (under the venv, version 2.x), birkhoff not installed;
  - the README's section "Using it from Python and PyTorch" runs as written there: its `sh`
    blocks in the source tree with the environment activated (PATH, VIRTUAL_ENV): `pip install
    torch numpy` (already satisfied), `pip install .` (builds and installs), `python -m birkhoff
    version` (the CLI bundled in the package, core.h's version); its `python` blocks, in order,
    as files run from a directory outside the source tree; the values they leave are checked
    (the autograd Function equals the numpy call, gradients finite and nonzero, the padded
    MultiheadAttention output finite, the saved checkpoint loads back with the same parameters);
  - the package imported there is the installed one, `birkhoff.torch` and `birkhoff.models` import
    under this torch, and the bundled CLI reads the README's checkpoint (`model show`: the
    configuration and the parameter count torch has);
  - the supported torch versions: pyproject.toml's extra `torch` is the range that
    birkhoff._torch_support enforces; versions outside it raise ImportError naming the version
    and the range (BIRKHOFF_ANY_TORCH=1: a warning instead);
  - `pip uninstall -y birkhoff` leaves the environment as it was.
BIRKHOFF_BUILD_DIR (passed through to the build backend) reuses a build's objects.
Usage: /usr/bin/python3 tests/packaging/test_pip_torch2.py --python build/venv-torch2/bin/python
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tests"))
from checklib import Checks  # noqa: E402

check = Checks()
SECTION = "## Using it from Python and PyTorch"


def core_version():
    text = open(os.path.join(SRC, "include", "birkhoff", "core.h")).read()
    return ".".join(re.search(r"#define BK_VERSION_%s (\d+)" % k, text).group(1) for k in ("MAJOR", "MINOR", "PATCH"))


def readme_blocks():
    """[(language, code)] of the README section SECTION (up to the next level-2 heading)"""
    text = open(os.path.join(SRC, "README.md")).read()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    body = text[start:end if end >= 0 else len(text)]
    # the "### pip" subsection is Debian's offline route (test_pip.py runs it): not this test's
    body = body.split("\n### pip\n")[0]
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", body, re.M | re.S)]


def venv_env(venv, **extra):
    """the environment of a shell with `venv` activated; nothing from pip's machine configuration
    and no index"""
    env = dict(os.environ)
    for k in ("PYTHONPATH", "BIRKHOFF_LIB", "BIRKHOFF_CLI", "PYTHONHOME", "PIP_USER", "PIP_INDEX_URL",
              "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "BIRKHOFF_ANY_TORCH"):
        env.pop(k, None)
    env["VIRTUAL_ENV"] = venv
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_NO_INDEX"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env.update(extra)
    return env


def run(cmd, cwd, env):
    r = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return r.returncode, r.stdout.decode(errors="replace")


def site_files(venv):
    out = set()
    for d, _dirs, files in os.walk(venv):
        for f in files:
            p = os.path.relpath(os.path.join(d, f), venv)
            if "__pycache__" not in p:
                out.add(p)
    return out


# runs one README python block as a file (as `python block.py` would) and checks the values it
# leaves behind; prints one line per finding ("ok ..." or "FAIL ...")
HARNESS = r"""
import math, os, runpy, sys
g = runpy.run_path(sys.argv[1], run_name="__main__")
import numpy as np, torch
import birkhoff
def say(ok, what):
    print(("ok " if ok else "FAIL ") + what)
say(os.path.realpath(birkhoff.__file__).startswith(os.path.realpath(sys.prefix) + os.sep),
    "birkhoff is the installed package (%s)" % birkhoff.__file__)
say(torch.__file__.startswith(os.path.realpath(sys.prefix)) or torch.__file__.startswith(sys.prefix),
    "torch is the environment's %s" % torch.__version__)
if "y" in g and "out" in g:
    y, out, q = g["y"], g["out"], g["q"]
    diff = float(np.abs(y.detach().numpy() - out.out).max())
    say(tuple(y.shape) == out.out.shape and diff <= 1e-6, "sinkhorn_attention equals birkhoff.sinkhorn (max diff %.2g)" % diff)
    say(out.attn is not None and np.allclose(out.attn.sum(-1), 1, atol=1e-4), "the plan's rows sum to 1")
    say(q.grad is not None and bool(torch.isfinite(q.grad).all()) and float(q.grad.abs().max()) > 0,
        "q.grad is finite and nonzero")
if "z" in g and "pad" in g:
    z = g["z"]
    say(tuple(z.shape) == (2, 16, 64) and bool(torch.isfinite(z).all()), "MultiheadAttention output [2, 16, 64], finite")
if "model" in g and os.path.exists("tuned.safetensors"):
    import birkhoff.models as bm
    m2 = bm.load("tuned.safetensors")
    a, b = dict(g["model"].named_parameters()), dict(m2.named_parameters())
    same = set(a) == set(b) and all(torch.equal(a[n].detach(), b[n].detach()) for n in a)
    say(same, "tuned.safetensors loads back with the trained parameters (%d tensors)" % len(a))
    say(math.isfinite(float(g["loss"])), "the loss is finite (%.4f)" % float(g["loss"]))
"""


def check_support(py, env, tmp):
    """pyproject's torch range == _torch_support's; outside it, ImportError with the range"""
    text = open(os.path.join(SRC, "pyproject.toml")).read()
    m = re.search(r'^torch\s*=\s*\["torch([^"]*)"\]', text, re.M)
    code = r"""
import sys, types, warnings, os
sys.path.insert(0, %r)
import _torch_support as S
print("spec", S.TORCH_SPEC)
for v in ("1.12.1", "0.4.1", "3.0.0", "not-a-version", "1.13.0a0", "1.13.1", "2.13.0+cpu", "2.14.0a0+git123"):
    fake = types.SimpleNamespace(__version__=v, __file__="/x/torch/__init__.py")
    try:
        S.check(fake)
        print("accept", v)
    except ImportError as e:
        print("refuse", v, "|", e)
os.environ["BIRKHOFF_ANY_TORCH"] = "1"
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    S.check(types.SimpleNamespace(__version__="3.1.0"))
    print("anytorch", len(w), w and str(w[0].message))
""" % os.path.join(SRC, "python", "birkhoff")
    st, out = run([py, "-c", code], cwd=tmp, env=env)
    if not check(st == 0, "the supported-version check runs", out):
        return
    spec = re.search(r"^spec (.*)$", out, re.M).group(1)
    check(m is not None and m.group(1) == spec, "pyproject.toml's extra torch is _torch_support's range %s" % spec,
          m and m.group(1))
    for v in ("1.12.1", "0.4.1", "3.0.0", "not-a-version"):
        line = re.search(r"^refuse %s \| (.*)$" % re.escape(v), out, re.M)
        check(line is not None and spec in line.group(1) and ("torch " + v) in line.group(1),
              "torch %s is refused with a message naming it and the range" % v, out)
    for v in ("1.13.0a0", "1.13.1", "2.13.0+cpu", "2.14.0a0+git123"):
        check(re.search(r"^accept %s$" % re.escape(v), out, re.M) is not None, "torch %s is accepted" % v, out)
    check(re.search(r"^anytorch 1 .*3\.1\.0", out, re.M) is not None, "BIRKHOFF_ANY_TORCH=1: a warning, no error", out)
    # pip's reading of the range (its own vendored packaging) admits the two torches make check
    # uses, as their metadata name them: the venv's and Debian's (1.13.0a0+gitunknown)
    versions = []
    for p in (py, "/usr/bin/python3"):
        st, out = run([p, "-c", "import importlib.metadata as m; print(m.version('torch'))"], cwd=tmp, env=env)
        if st == 0:
            versions.append(out.strip().splitlines()[-1])
        elif p == py:
            check(False, "the venv's torch metadata", out)
    code = ("import sys; from pip._vendor.packaging.specifiers import SpecifierSet as S; s = S(%r)\n"
            "for v in sys.argv[1:]: print(v, s.contains(v, prereleases=True))" % spec)
    st, out = run([py, "-c", code] + versions + ["1.12.1", "3.0.0", "3.0.0a0"], cwd=tmp, env=env)
    for v in versions:
        check(st == 0 and re.search(r"^%s True$" % re.escape(v), out, re.M) is not None,
              "pip admits torch %s under torch%s" % (v, spec), out)
    for v in ("1.12.1", "3.0.0", "3.0.0a0"):
        check(st == 0 and re.search(r"^%s False$" % re.escape(v), out, re.M) is not None,
              "pip refuses torch %s under torch%s" % (v, spec), out)
    # the modules themselves refuse it at import (a stand-in torch 1.12.1 in sys.modules)
    for mod in ("birkhoff.torch", "birkhoff.models"):
        code = ("import sys, types; sys.path.insert(0, %r); t = types.ModuleType('torch'); t.__version__ = '1.12.1'; "
                "sys.modules['torch'] = t\ntry:\n import %s\nexcept ImportError as e:\n print('refused:', e)"
                % (os.path.join(SRC, "python"), mod))
        st, out = run([py, "-c", code], cwd=tmp, env=env)
        check(st == 0 and ("refused: %s supports PyTorch" % mod) in out and spec in out and "torch 1.12.1" in out,
              "import %s under torch 1.12.1: ImportError naming both" % mod, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True, help="the torch-from-pip venv's interpreter (make venv-torch2)")
    args = ap.parse_args()
    venv = os.path.dirname(os.path.dirname(os.path.abspath(args.python)))
    py = os.path.join(venv, "bin", "python")
    version = core_version()
    env = venv_env(venv)
    tmp = tempfile.mkdtemp(prefix="bk-pip-torch2-")
    try:
        # a run stopped half-way may have left birkhoff installed: start from the venv without it
        run([py, "-m", "pip", "uninstall", "-y", "birkhoff"], cwd=tmp, env=env)
        st, out = run([py, "-c", "import os, torch, numpy; print(torch.__version__, os.path.realpath(torch.__file__), "
                       "numpy.__version__)"], cwd=tmp, env=env)
        if not check(st == 0, "the venv imports torch and numpy", out):
            return check.summary(" (tests/packaging/test_pip_torch2.py)")
        tv, tfile, nv = out.split()[-3:]
        check(tv.startswith("2.") and tfile.startswith(os.path.realpath(venv) + os.sep),
              "torch %s is pip's, in the venv (not Debian's)" % tv, out)
        print("venv %s: torch %s, numpy %s" % (venv, tv, nv))
        st, out = run([py, "-c", "import birkhoff"], cwd=tmp, env=env)
        check(st != 0, "before the install the venv has no birkhoff", out)
        before = site_files(venv)

        check_support(py, env, tmp)

        blocks = readme_blocks()
        sh = [c for lang, c in blocks if lang == "sh"]
        pyb = [c for lang, c in blocks if lang == "python"]
        check(len(sh) >= 1 and len(pyb) >= 2, "the README section has its sh and python blocks (%d, %d)"
              % (len(sh), len(pyb)), blocks)
        check(any("pip install ." in c for c in sh) and any("python -m birkhoff" in c for c in sh),
              "the README's sh block installs with pip install . and runs python -m birkhoff", sh)

        # the sh blocks, as written, in the source tree with the venv activated
        for i, code in enumerate(sh):
            st, out = run(["bash", "-euo", "pipefail", "-c", code], cwd=SRC, env=env)
            if not check(st == 0, "README sh block %d runs as written" % (i + 1), out[-3000:]):
                return check.summary(" (tests/packaging/test_pip_torch2.py)")
            for line in out.splitlines():
                if line.startswith(("Successfully installed", "Requirement already satisfied: torch")) or \
                        line.startswith("birkhoff "):
                    print("  " + line[:160])
            if "python -m birkhoff version" in code:
                check(re.search(r"^birkhoff %s " % re.escape(version), out, re.M) is not None,
                      "python -m birkhoff version prints core.h's %s" % version, out[-500:])
            if "pip install torch" in code:
                check("Requirement already satisfied: torch" in out and "Collecting torch" not in out,
                      "pip install torch: the venv's torch is kept (nothing fetched)", out[-2000:])

        # the python blocks, as written, each a file run from outside the source tree
        harness = os.path.join(tmp, "harness.py")
        with open(harness, "w") as f:
            f.write(HARNESS)
        for i, code in enumerate(pyb):
            path = os.path.join(tmp, "readme_block_%d.py" % (i + 1))
            with open(path, "w") as f:
                f.write(code)
            st, out = run([py, harness, path], cwd=tmp, env=env)
            oks = [ln for ln in out.splitlines() if ln.startswith("ok ")]
            fails = [ln for ln in out.splitlines() if ln.startswith("FAIL ")]
            if check(st == 0 and not fails and len(oks) >= 3, "README python block %d runs as written" % (i + 1),
                     out[-3000:]):
                for o in oks:
                    print("  block %d: %s" % (i + 1, o[3:]))

        # the bundled CLI reads the checkpoint the README saved
        ck = os.path.join(tmp, "tuned.safetensors")
        if check(os.path.isfile(ck), "the README's bm.save wrote tuned.safetensors"):
            st, out = run([os.path.join(venv, "bin", "birkhoff"), "model", "show", "--ckpt", ck], cwd=tmp, env=env)
            m = re.search(r"^# (\d+) parameters, (\d+) tensors", out, re.M)
            st2, out2 = run([py, "-c", "import birkhoff.models as bm; m = bm.load('tuned.safetensors'); "
                             "p = list(m.parameters()); print(sum(t.numel() for t in p), len(p))"], cwd=tmp, env=env)
            check(st == 0 and st2 == 0 and re.search(r"^attn=sinkhorn$", out, re.M) and m is not None
                  and "%s %s" % m.groups() == out2.strip(),
                  "the venv's birkhoff program reads it (model show: attn=sinkhorn, %s parameters in %s tensors, "
                  "as torch counts them)" % (m.groups() if m else ("?", "?")), (out[-1500:], out2))

        # uninstall: the venv as it was
        st, out = run([py, "-m", "pip", "uninstall", "-y", "birkhoff"], cwd=tmp, env=env)
        check(st == 0, "pip uninstall -y birkhoff", out)
        left = site_files(venv) - before
        check(not left, "pip uninstall: the venv is as it was before the install", sorted(left)[:20])
    finally:
        run([py, "-m", "pip", "uninstall", "-y", "birkhoff"], cwd=tmp, env=env)
        shutil.rmtree(tmp, ignore_errors=True)
    return check.summary(" (tests/packaging/test_pip_torch2.py)")


if __name__ == "__main__":
    sys.exit(main())
