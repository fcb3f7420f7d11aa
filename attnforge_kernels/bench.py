"""``python -m attnforge_kernels.bench``: the kernels against PyTorch SDPA's flash and cuDNN
backends on this GPU

The code is attnforge_kernels/tools/benchmark.py; this module is the command's public name and holds
none.
"""

import sys

from .tools.benchmark import main  # noqa: F401 - the public names

if __name__ == "__main__":
    sys.exit(main())
