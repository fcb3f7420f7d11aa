"""``python -m attnforge_kernels.check``: the kernels' correctness checks (the harness is
attnforge_kernels/checks/).

The validation suite imports this module by name for ``list_cases(quick)``, ``run_case(name)``
and ``unavailable()``; the command line is :func:`attnforge_kernels.checks.suite.main`.
"""

from __future__ import annotations

import sys

from .checks.suite import SHIM_CASE, list_cases, main, run_case, unavailable

__all__ = ["SHIM_CASE", "list_cases", "main", "run_case", "unavailable"]

if __name__ == "__main__":
    sys.exit(main())
