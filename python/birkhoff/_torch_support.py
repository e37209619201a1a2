"""The PyTorch versions birkhoff.torch and birkhoff.models support, checked at their import.

Supported: torch 1.13 to 2.x (pyproject.toml's extra `birkhoff[torch]`: torch>=1.13.0a0,<3).
Tested by `make check` (tests/python under both): Debian 12's python3-torch 1.13.1 and torch
2.13.0 from pip (the CPU wheel). Older versions are untested (the oldest tested is Debian 12's
1.13), and a torch 3 would be a new major version, free to break the APIs used.
Both are refused at import with ImportError naming the version found and the
range; BIRKHOFF_ANY_TORCH=1 lets any version through (with a warning) to try one anyway.
"""
import os
import re
import warnings

TORCH_MIN = (1, 13)        # the oldest torch supported (Debian 12's python3-torch is 1.13.1)
TORCH_BELOW = (3, 0)       # the first torch not supported (untested major version)
# the same range as a pip requirement (pyproject.toml's extra "torch"): Debian's python3-torch
# 1.13.1 calls itself 1.13.0a0 (its egg-info and torch.__version__), a pre-release that a plain
# ">=1.13" would not admit
TORCH_SPEC = ">=1.13.0a0,<3"
TORCH_RANGE = "1.13 to 2.x"
TORCH_TESTED = ("1.13.1 (Debian 12, torch.__version__ 1.13.0a0)", "2.13.0 (pip)")


def parse_version(text):
    """(major, minor) of a torch version string ("2.13.0+cpu", "1.13.1", "2.14.0a0+git1234");
    None when it does not start with two dotted numbers"""
    m = re.match(r"\s*(\d+)\.(\d+)", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else None


def supported(text):
    """whether torch version `text` is in the supported range"""
    v = parse_version(text)
    return v is not None and TORCH_MIN <= v < TORCH_BELOW


def check(torch_module, who="birkhoff.torch"):
    """raises ImportError (naming the version, the range and what to do) unless
    torch_module.__version__ is supported or BIRKHOFF_ANY_TORCH=1 is set"""
    found = getattr(torch_module, "__version__", "(no __version__)")
    if supported(found):
        return
    where = getattr(torch_module, "__file__", None) or "?"
    msg = ("%s supports PyTorch %s (tested: %s); this Python imports torch %s from %s. "
           "Install a supported one (pip install 'torch%s'), or set BIRKHOFF_ANY_TORCH=1 to try this one "
           "anyway." % (who, TORCH_RANGE, " and ".join(TORCH_TESTED), found, where, TORCH_SPEC))
    if os.environ.get("BIRKHOFF_ANY_TORCH") == "1":
        warnings.warn(msg.split(" Install")[0] + " (BIRKHOFF_ANY_TORCH=1: going on)", RuntimeWarning, stacklevel=3)
        return
    raise ImportError(msg)
