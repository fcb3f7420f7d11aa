"""invoke tasks for the bundled kernels: the AOT compile check and the GPU benchmark.

kernels.aot runs `python -m attnforge_kernels.aot`'s main in this process, with a progress line per
arch and kernel and the compile cache under the build folder (ATTNFORGE_BUILD_DIR); kernels.bench is
a thin wrapper over `python -m attnforge_kernels.bench`.
"""

from __future__ import annotations

import shlex
import sys

from invoke.exceptions import Exit

from ..console import KernelProgress
from ..workspace import Workspace
from . import ARCHES, OUT_DIR, command, out_file, text


@command(
    options={"arch": ARCHES, "head_dims": text("D[,D...]"), "cache_dir": OUT_DIR},
    writes=("build",),
    help={
        "arch": "arch name(s) from recipes/arches.yaml, comma-separated (e.g. gfx1151; default: "
        "every GPU arch)",
        "all": "every GPU arch in recipes/arches.yaml",
        "head_dims": "comma-separated head dims (default 64,128)",
        "all_head_dims": "check 40,64,72,80,96,128,160,256",
        "json": "print JSON instead of a table",
        "over_2gib": "AMD: compile for tensors over 2 GiB (64-bit addresses, no buffer loads)",
        "no_cache": "compile every kernel again instead of reading unchanged results from the "
        "cache (<build folder>/aot-cache)",
        "cache_dir": "keep the compile results in this folder instead of <build folder>/aot-cache "
        "(e.g. one folder for every clone: the keys hold no paths)",
        "debug": "show tracebacks",
    },
)
def aot(c, arch=None, all=False, head_dims=None, all_head_dims=False, json=False, over_2gib=False,
        no_cache=False, cache_dir=None, debug=False):  # fmt: skip
    """Compile the kernels for AMD/NVIDIA targets on the CPU; report registers, spills, LDS, occupancy.

    Fails on a register spill or LDS overflow, except the spills attnforge_kernels/device/configs.py
    accepts (ACCEPTED_SPILLS: measured faster), which are reported as accepted while they do not
    grow. A kernel whose sources, Triton, arch and config are unchanged is read from the cache.
    """
    from attnforge_kernels import aot as check

    args = []
    names = [a.strip() for a in (arch or "").split(",") if a.strip()]
    for a in names:
        args += ["--arch", a]
    if all or not names:
        args = ["--all"]
    if head_dims:
        args += ["--head-dims", head_dims]
    args += ["--all-head-dims"] if all_head_dims else []
    args += ["--json"] if json else []
    args += ["--over-2gib"] if over_2gib else []
    cache = cache_dir or Workspace.discover().build_dir / "aot-cache"
    args += ["--no-cache"] if no_cache else ["--cache-dir", str(cache)]
    code = check.main(args, progress=KernelProgress)
    if code:
        raise Exit(code=code)


@command(
    options={"json": out_file()},
    help={"quick": "four shapes only", "json": "write the results to this file"},
)
def bench(c, quick=False, json=None):
    """Benchmark the kernels against PyTorch SDPA's flash and cuDNN backends on this GPU."""
    args = [sys.executable, "-m", "attnforge_kernels.bench"]
    if quick:
        args.append("--quick")
    if json:
        args += ["--json", json]
    result = c.run(shlex.join(args), pty=False, warn=True)
    if result.exited:
        raise Exit(code=result.exited)
