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


class Spy:
    """a stand-in for a ctypes library that records which C functions are
    called (the Python tests check that bad arguments are refused before C)"""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.real, name)
