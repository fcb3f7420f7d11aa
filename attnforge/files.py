"""Writing a user's outputs so that the last good one survives until the new one is complete.

Every file attnforge writes for a user goes through `write_aside`, every folder it replaces
through `swap_folder`: the new content is written beside the target under a dot name, then
renamed over it (a rename within a folder is atomic), so an interrupt or a failure leaves the
old output or the new one, never half of either, and no stray temporary file.

validate/ and attnforge_kernels/ run inside images without attnforge (DESIGN.md), so they keep their
own few lines of the same rule: validate/cli.py `_write` (and its workers' result files),
attnforge_kernels/tools/compile_check.py `CompileCache.put`, attnforge_kernels/tools/benchmark.py
`_write` (the bench's `--json`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def aside(path: Path, tag: str = "tmp") -> Path:
    """The dot name beside `path` that a new version is written under (one per process)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{tag}")


def write_aside(path: Path, data: str | bytes) -> None:
    """Write `data` beside `path`, then rename it over `path`; the folder is made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = aside(path)
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def swap_folder(new: Path, final: Path) -> None:
    """Replace the folder `final` with the complete folder `new`: the old one is renamed aside
    first and removed only once the new one is in place."""
    old = aside(final, "old")
    if final.exists():
        os.replace(final, old)
    os.replace(new, final)
    shutil.rmtree(old, ignore_errors=True)
