"""``python -m attnforge_kernels.native build|status``: attnforge's native launch path compiled now,
or whether calls use it and why not

The code is attnforge_kernels/launch/replay.py (the loader) and attnforge_kernels/launch/replay.cpp
(the extension); this module is the command's public name and holds none.
"""

import sys

from .launch.replay import build, main, status  # noqa: F401 - the public names

if __name__ == "__main__":
    sys.exit(main())
