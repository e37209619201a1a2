"""Loads birkhoff's pure-PyTorch modules from the source tree's python/birkhoff
without loading libbirkhoff (internal to bench/peers).

The model twin (birkhoff.models) and the operator ports (birkhoff._port_*)
live in the Python package; the old names in this directory (model_torch,
sinkformer_torch, espformer_torch, lotformer_torch, otk_torch, diff_torch)
are those same files, imported here under the package name "_birkhoff_twin"
whose search path is python/birkhoff but whose __init__ (which loads the C
library) never runs. So the references the oracle holds the C code to do not
depend on a built or loadable library, and `python3 bench/peers/X_torch.py`
keeps running X's self-check.

In a process that also imports `birkhoff.models` the classes are distinct
objects (the same source loaded twice under two names); nothing here mixes
them.
"""
import importlib
import importlib.machinery
import importlib.util
import os
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

PACKAGE = "_birkhoff_twin"
SOURCE = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                       "python", "birkhoff"))


def module(name):
    """The package module `name` (e.g. "models", "_port_otk") from python/birkhoff."""
    if PACKAGE not in sys.modules:
        spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
        spec.submodule_search_locations = [SOURCE]
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = pkg
    return importlib.import_module(PACKAGE + "." + name)


def alias(old_name, name):
    """Make the module imported as old_name be the package module `name`; when
    old_name is run as a script, run the module's main() and exit with it."""
    mod = module(name)
    if old_name == "__main__":
        sys.exit(mod.main())
    sys.modules[old_name] = mod
    return mod
