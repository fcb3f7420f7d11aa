"""Kernel tests run on the CPU through Triton's interpreter.

TRITON_INTERPRET must be set before ``attnforge_kernels`` (and Triton's lazily imported modules)
load, and Triton checks it again while kernels run, so it is set when pytest loads this file and
restored when the session ends. Other test folders of the same session that import
``attnforge_kernels`` therefore see interpreter-mode kernels too; on CI's CPU-only machine that is
the only mode there is.

The AOT tests (test_aot.py, test_triton_versions.py) read and write one compile cache that
outlives the run (``aot_cache``), and each still compiles a few kernels cold every run.
"""

import os
from pathlib import Path

import pytest

_PREVIOUS = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"


def pytest_sessionfinish(session, exitstatus):
    if _PREVIOUS is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _PREVIOUS


def persistent_aot_cache() -> Path:
    """The AOT compile cache the kernels tests share across runs and clones (attnforge_kernels/tools/compile_check.py
    CompileCache; its keys hold each kernel's source key, Triton version, arch and config, no
    paths): $ATTNFORGE_TEST_AOT_CACHE, else attnforge_kernels.aot's per-user default outside any
    build folder, $XDG_CACHE_HOME/attnforge/aot (~/.cache/attnforge/aot). An unchanged kernel
    compiles once per machine; a fresh machine pays the cold compile once."""
    if os.environ.get("ATTNFORGE_TEST_AOT_CACHE"):
        return Path(os.environ["ATTNFORGE_TEST_AOT_CACHE"])
    from attnforge_kernels.tools.compile_check import default_cache_dir

    return default_cache_dir({k: v for k, v in os.environ.items() if k != "ATTNFORGE_BUILD_DIR"})


@pytest.fixture(scope="session")
def aot_cache() -> Path:
    return persistent_aot_cache()
