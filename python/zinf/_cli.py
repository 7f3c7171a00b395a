"""The ``zinf`` console script of a pip-installed zinf: runs the native command line.

The wheel carries the ``zinf`` binary inside the package as ``zinf/bin/zinf`` (Note [Wheel
layout] in python/CMakeLists.txt); this replaces the Python process with it, so that signals,
exit codes and ``zinf run``'s process tree are the binary's own. ``python -m zinf._cli ARGS``
does the same.
"""

import os
import sys


def binary_path():
    """The path of the native ``zinf`` binary installed with this package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "zinf")


def main():
    exe = binary_path()
    if not os.access(exe, os.X_OK):
        sys.stderr.write(
            f"zinf: the command line is not installed with this package (no executable {exe}); "
            "a `cmake --install` puts it in <prefix>/bin/zinf instead\n")
        return 127
    os.execv(exe, ["zinf"] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
