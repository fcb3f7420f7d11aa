"""``python -m attnforge_kernels.aot``: the ahead-of-time compile check (registers, spills, LDS,
occupancy of every kernel for every arch, on the CPU)

The code is attnforge_kernels/tools/compile_check.py; this module is the command's public name and
holds none.
"""

import sys

from .tools.compile_check import main  # noqa: F401 - the public names

if __name__ == "__main__":
    sys.exit(main())
