"""The pass/fail counter shared by the Python test scripts (tests/tools/test_cli.py,
tests/tools/test_train_cli.py, tests/python/*.py)."""


class Checks:
    """check(ok, name, detail) counts a check and prints "FAIL name: detail"
    (the detail's last `limit` characters) when ok is false; returns ok."""

    def __init__(self, limit=3000):
        self.passed = self.failed = 0
        self.limit = limit

    def __call__(self, ok, name, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL %s: %s" % (name, str(detail)[-self.limit:]))
        return bool(ok)

    def summary(self, suffix=""):
        """prints "N passed, M failed" and returns the exit status"""
        print("%d passed, %d failed%s" % (self.passed, self.failed, suffix))
        return 1 if self.failed else 0


def oracle_missing(what, error, hint):
    """An oracle's import failed: with BK_REQUIRE_ORACLE=1 or CI=true print a
    FAIL and exit 1, else a SKIP and exit 0 (what: the module, hint: how to
    install it)"""
    import os
    import sys
    if os.environ.get("BK_REQUIRE_ORACLE") == "1" or os.environ.get("CI") == "true":
        print("FAIL: %s is required (%s): %s" % (what, hint, error))
        print("0 passed, 1 failed")
        sys.exit(1)
    print("SKIP: %s not importable (%s); %s" % (what, error, hint))
    sys.exit(0)


class Spy:
    """a stand-in for a ctypes library that records which C functions are
    called (the Python tests check that bad arguments are refused before C)"""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.real, name)
