"""birkhoff: doubly-stochastic (optimal-transport) attention from Python.

A ctypes binding of the C library libbirkhoff (no compiler or build step on
the Python side). Three parts:

  birkhoff.ops    numpy API: forward and backward of softmax, Sinkhorn,
                  unbalanced Sinkhorn, ESP, LOT and OTK on float32 arrays,
                  ASAP calibration and compiled layers, OTK K-means fitting
                  (also re-exported here);
  birkhoff.data   the library's datasets (verified readers, generated sets,
                  batches, epoch order);
  birkhoff.torch  PyTorch API: autograd Functions and nn.Modules (imported
                  on demand: numpy users do not need torch).

The library is found through BIRKHOFF_LIB, the copy bundled by `pip install`,
the source tree, the directory recorded by `make install`, or the dynamic
loader (see birkhoff._lib); `python -m birkhoff` runs the command-line tool.
Threads: set_num_threads(n) (results do not depend on it); the default is
BIRKHOFF_NUM_THREADS or the process's CPU affinity, never torch's setting.
"""
from ._lib import LIBRARY_PATH, BirkhoffError, check as _check, check_int as _check_int, lib as _c
from .ops import *  # noqa: F401,F403
from .ops import __all__ as _ops_all
from . import data  # noqa: F401,E402  birkhoff.data: the library's datasets as numpy arrays

__version__ = _c.bk_version().decode()


def version():
    """the C library's version string"""
    return _c.bk_version().decode()


def set_num_threads(n):
    """Threads used by the C kernels, n in [1, 4096] (n <= 0: back to the
    default, which is BIRKHOFF_NUM_THREADS or the CPUs of this process's
    affinity mask; torch's and OpenMP's settings do not change it). Results
    are bitwise independent of it. n > 4096 or not an integer: ValueError /
    TypeError, and the count is left as it was."""
    import ctypes
    _check(_c.bk_set_num_threads(_check_int(n, ctypes.c_int, "set_num_threads: n", hi=4096)))


def get_num_threads():
    """the C kernels' thread count in force"""
    return _c.bk_get_num_threads()


def isa():
    """the kernels' instruction set: "avx512" or "avx2" """
    return _c.bk_isa().decode()


__all__ = ["BirkhoffError", "LIBRARY_PATH", "version", "set_num_threads", "get_num_threads", "isa"] + list(_ops_all)
