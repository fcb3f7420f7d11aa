"""The kernels' checks as the validation suite and ``python -m attnforge_kernels.check`` call them.

``list_cases(quick)`` names the cases; ``run_case(name)`` runs one and returns
``{"status": "pass"|"fail"|"skip", "message": str, "metrics": {str: float}}``. A case name
encodes everything it runs (:mod:`attnforge_kernels.checks.case`), so a case re-runs from its name
alone (the validator runs each in its own subprocess). ``python -m attnforge_kernels.check
[--quick|--boundary] [--json FILE]`` runs a list in-process.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time

from . import grids
from .attention import SHIM_CASE
from .case import Case

# The module that runs each kind of case (``run(case, device)``), imported when a case runs.
RUNNERS = {
    "attn": "attention",
    "dropout": "variants",
    "fp8": "variants",
    "packed": "layouts",
    "kvcache": "layouts",
    "pagedvarlen": "layouts",
}


def list_cases(quick: bool = False, every_feature_grid: bool = False) -> list[str]:
    """Names of the correctness cases (and the shim routing case).

    The validation suite calls ``list_cases(quick)``: the attention grid (quick or full) plus the
    short grids of dropout/FP8 and packed/kv-cache, so that ``validate all`` stays about a minute
    on a warm GPU (269 cases took 7+ minutes cold on an H100). ``python -m attnforge_kernels.check``
    runs the full feature grids too (``every_feature_grid``).

    Under TRITON_INTERPRET=1 the list is :func:`grids.interpreter_grid` (its first case when
    ``quick``): the GPU grid's long sequences would take hours in the interpreter, and each case
    costs the validation suite a process of about 2 s (the CPU tests run :func:`grids.cpu_grid`).
    """
    from ..device.configs import INTERPRET

    if INTERPRET:
        cases = grids.interpreter_grid()[:1] if quick else grids.interpreter_grid()
    else:
        cases = grids.attention_grid(quick)
        full = every_feature_grid and not quick
        cases += grids.variant_grid(not full) + grids.kvcache_grid(not full)
    return [c.name for c in cases] + [SHIM_CASE]


def boundary_cases() -> list[Case]:
    """Every kind's small boundary shapes, for compute-sanitizer (``--boundary``)."""
    return grids.attention_boundary() + grids.variant_boundary() + grids.kvcache_boundary()


def unavailable() -> str:
    """Why no case can run on this machine, or '' when they can (the validation suite asks)."""
    return _device()[1]


def _device():
    """The torch device to run on, or None with the reason to skip."""
    import torch

    from ..device.configs import INTERPRET

    if INTERPRET:
        return torch.device("cpu"), ""
    if torch.cuda.is_available():
        return torch.device("cuda"), ""
    return None, "no GPU (CUDA/ROCm) device and TRITON_INTERPRET is not 1"


def run_case(name: str) -> dict:
    """Run one named case on the device at hand."""
    device, why = _device()
    if device is None:
        return {"status": "skip", "message": why, "metrics": {}}
    t0 = time.perf_counter()
    if name == SHIM_CASE:
        from .attention import run_shim

        return run_shim(device)
    case = Case.parse(name)
    runner = importlib.import_module(f"{__package__}.{RUNNERS[case.kind]}")
    r = runner.run(case, device)
    r["metrics"]["seconds"] = time.perf_counter() - t0
    return r


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N such as 0/4, got {text!r}") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"need 0 <= I < N, got {text!r}")
    return i, n


def main(argv: list[str] | None = None) -> int:
    """``python -m attnforge_kernels.check``: run a list of cases, print a line each, exit 1 on a
    failure."""
    ap = argparse.ArgumentParser(
        prog="python -m attnforge_kernels.check",
        description="Correctness checks of the kernels, as the validation suite calls them.",
    )
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="the short list")
    group.add_argument("--boundary", action="store_true", help="small boundary shapes (memcheck)")
    ap.add_argument("--case", action="append", help="run only these case names")
    ap.add_argument("--json", help="write all results to this file")
    ap.add_argument(
        "--shard",
        type=_shard,
        metavar="I/N",
        help="run every Nth case of the list from the Ith (0-based): N processes share a GPU",
    )
    args = ap.parse_args(argv)
    if args.case:
        names = args.case
    elif args.boundary:
        names = [c.name for c in boundary_cases()]
    else:
        names = list_cases(quick=args.quick, every_feature_grid=True)
    if args.shard:
        i, n = args.shard
        names = names[i::n]
    results = {}
    failed = 0
    for name in names:
        try:
            r = run_case(name)
        except Exception as e:  # a case that raises is a failure, the rest still run
            r = {"status": "fail", "message": f"{name}: {type(e).__name__}: {e}", "metrics": {}}
        results[name] = r
        failed += r["status"] == "fail"
        print(f"{r['status']:5s} {r['message']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(f"{len(names) - failed}/{len(names)} not failed", flush=True)
    return 1 if failed else 0
