"""Where this package's native parts may be (internal), in search order: the copy
bundled in the package by `pip install` (birkhoff/_native/, tools/pybuild), the
source tree's build/ directory when the package sits in one, and the prefix
recorded by `make install` (_install.py). birkhoff._lib (the library) and
birkhoff.__main__ (the program) search the same places."""
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def candidates(kind):
    """paths of the shared library (kind "lib") or of the birkhoff program
    (kind "cli"), in search order; the bundled copy only when it exists"""
    name = "libbirkhoff.so" if kind == "lib" else "birkhoff"
    out = []
    bundled = os.path.join(_HERE, "_native", name)
    if os.path.exists(bundled):
        out.append(bundled)
    if os.path.exists(os.path.join(_HERE, "..", "..", "include", "birkhoff.h")):
        out.append(os.path.normpath(os.path.join(_HERE, "..", "..", "build", name)))
    try:
        from . import _install  # written by `make install`
        libdir = _install.LIBDIR
        out.append(os.path.join(libdir, "libbirkhoff.so.0") if kind == "lib" else
                   os.path.join(os.path.dirname(libdir.rstrip("/")), "bin", "birkhoff"))
    except ImportError:
        pass
    return out
