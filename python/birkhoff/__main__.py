"""`python -m birkhoff ARGS` (and the `birkhoff` script pip installs): runs the birkhoff
command-line tool with ARGS, replacing this process, so its output and exit status are
the tool's own.

The program is found, in this order:
  1. the environment variable BIRKHOFF_CLI (a path to the program);
  2. the copy bundled in the package by `pip install` (birkhoff/_native/birkhoff);
  3. the source tree this package sits in (python/birkhoff -> build/birkhoff);
  4. the bin directory next to the library directory recorded by `make install`.
PATH is not searched: the `birkhoff` found there may be this script itself.
"""
import os
import sys

from ._layout import candidates


def cli_path():
    """the birkhoff program this module runs (None when there is none)"""
    env = os.environ.get("BIRKHOFF_CLI")
    if env:
        return env
    for c in candidates("cli"):
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    cli = cli_path()
    if cli is None:
        sys.stderr.write("birkhoff: the birkhoff program is not in this installation (pip install, make, "
                         "make install, or set BIRKHOFF_CLI to its path)\n")
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(cli, ["birkhoff"] + args)
    except OSError as e:
        sys.stderr.write("birkhoff: cannot run %s: %s\n" % (cli, e))
        return 126


if __name__ == "__main__":
    sys.exit(main())
