"""The ``tensorhub`` console script of the wheel: runs the C++ command line
the wheel carries (tensorhub/_bin/tensorhub), in place of this process."""

from __future__ import annotations

import os
import sys


def main() -> None:
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "tensorhub")
    if not os.access(exe, os.X_OK):
        sys.stderr.write(
            f"tensorhub: {exe} is missing: this tensorhub package was installed without its "
            f"command line (a source checkout on PYTHONPATH?); build it with scripts/build.sh "
            f"and run build/tools/tensorhub\n")
        sys.exit(1)
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
