"""Kernel tests run on the CPU through Triton's interpreter.

TRITON_INTERPRET must be set before ``kernels`` (and Triton's lazily imported modules) load, and
Triton checks it again while kernels run, so it is set when pytest loads this file and restored
when the session ends. Other test folders of the same session that import ``kernels`` therefore
see interpreter-mode kernels too; on CI's CPU-only machine that is the only mode there is.
"""

import os

_PREVIOUS = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"


def pytest_sessionfinish(session, exitstatus):
    if _PREVIOUS is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _PREVIOUS
