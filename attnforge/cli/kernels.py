"""invoke tasks for the bundled kernels: the AOT compile check and the GPU benchmark.

Thin wrappers over ``python -m kernels.aot`` / ``python -m kernels.bench``; the lead wires them
into tasks.py as the ``kernels`` collection.
"""

from __future__ import annotations

import shlex
import sys

from . import command


@command(
    help={
        "arch": "arch name(s) from recipes/arches.yaml, comma-separated (e.g. gfx1151)",
        "all": "every GPU arch in recipes/arches.yaml",
        "head_dims": "comma-separated head dims (default 64,128)",
        "all_head_dims": "check 40,64,72,80,96,128,160,256",
        "json": "print JSON instead of a table",
        "over_2gib": "AMD: compile for tensors over 2 GiB (64-bit addresses, no buffer loads)",
    }
)
def aot(c, arch="", all=False, head_dims="", all_head_dims=False, json=False, over_2gib=False):
    """Compile the kernels for AMD/NVIDIA targets on the CPU; report registers, spills, LDS, occupancy.

    Fails on a register spill or LDS overflow, except the spills kernels/configs.py accepts
    (ACCEPTED_SPILLS: measured faster), which are reported as accepted while they do not grow.
    """
    args = [sys.executable, "-m", "kernels.aot"]
    if all:
        args.append("--all")
    for a in filter(None, arch.split(",")):
        args += ["--arch", a]
    if not all and not arch:
        args.append("--all")
    if head_dims:
        args += ["--head-dims", head_dims]
    if all_head_dims:
        args.append("--all-head-dims")
    if json:
        args.append("--json")
    if over_2gib:
        args.append("--over-2gib")
    c.run(shlex.join(args), pty=False)


@command(help={"quick": "four shapes only", "json": "write the results to this file"})
def bench(c, quick=False, json=""):
    """Benchmark the kernels against PyTorch SDPA's flash and cuDNN backends on this GPU."""
    args = [sys.executable, "-m", "kernels.bench"]
    if quick:
        args.append("--quick")
    if json:
        args += ["--json", json]
    c.run(shlex.join(args), pty=False)
