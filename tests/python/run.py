"""Runs one test module of tests/python with unittest, as a CTest test.

Exit codes: 0 passed, 1 failed, 77 skipped (CTest's SKIP_RETURN_CODE): the Python package was not
built, PyTorch is missing for this interpreter (and the module imports it), or every test in the
module skipped; the reason is printed.
Usage: run.py MODULE (e.g. test_optim), with PYTHONPATH holding the built package.
"""

import importlib
import os
import sys
import unittest

SKIP = 77


def main():
    name = sys.argv[1]
    reason = os.environ.get("ZINF_PYTHON_SKIP_REASON")
    if reason:
        print(f"SKIPPED: the zinf Python package was not built: {reason}")
        return SKIP
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        # Imported here, not by the loader, which would turn a missing PyTorch into a failure.
        # Modules that need no PyTorch (test_binding_errors) do not import it.
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        print(f"SKIPPED: PyTorch is not installed for {sys.executable} ({e}); "
              f"on Debian: apt-get install python3-torch")
        return SKIP
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    if not result.wasSuccessful():
        return 1
    if result.testsRun == 0:
        print(f"FAILED: {name} holds no tests")
        return 1
    # A skipped subtest is listed too (a _SubTest, with its test_case), but only a test skipped
    # as a whole means nothing of it ran.
    whole = [(test, why) for test, why in result.skipped if not hasattr(test, "test_case")]
    if len(whole) == result.testsRun:
        for test, why in whole:
            print(f"SKIPPED: {test.id()}: {why}")
        return SKIP
    return 0


if __name__ == "__main__":
    sys.exit(main())
