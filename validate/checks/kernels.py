"""Bundled kernels: list the cases of ``attnforge_kernels.check`` and run each in its own process.

Contract with the kernels package: ``attnforge_kernels.check.list_cases(quick) -> list[str]``,
``attnforge_kernels.check.run_case(name) -> {"status", "message", "metrics"}``, optionally
``attnforge_kernels.check.unavailable() -> str`` (why no case can run here, '' when they can), and
``attnforge_kernels.sdpa_shim.stats() -> {"routed", "fallback", "reasons"}``.

Without a GPU the cases run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set in the
check's own process), where ``list_cases`` names a few tiny ones: the cpu stack then shows that
the bundled kernels work instead of skipping them.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from contract.names import CASE_STATUSES


def _interpret_without_gpu(ctx) -> bool:
    """Whether the kernels run in Triton's interpreter here, switching it on when there is no
    GPU. Triton reads the variable when the kernels are defined, so this runs before they are
    imported; each check is its own process, so no other check sees it."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    ctx.progress("torch.cuda.is_available()")
    try:
        import torch
    except ImportError:
        return False  # then kernels cannot be imported either, and say so
    if torch.cuda.is_available():
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def _import_check():
    try:
        return importlib.import_module("attnforge_kernels.check"), None
    except ImportError as exc:
        return None, f"the kernels package is not importable ({type(exc).__name__}: {exc})"


def warm_up(params: dict[str, Any]) -> None:
    """Run ahead in the kernels checks' worker while the checks before them use the device
    (validate/pool.py ``start_early``): the interpreter switch as the checks make it, the
    kernels' import, the device context and Triton's driver module. What fails here is left to
    the checks, which report it.

    Not Triton's per-kernel hashes (``JITFunction.cache_key``): for these kernels the hash
    depends on the order in which a process first computes them (two processes that hash
    them in opposite orders disagree on six, ``_attn_fwd`` among them: triton 3.6, 2026-11-26;
    made order-independent upstream by triton-lang/triton#10494), so computing them ahead
    keyed the on-disk cache differently from every other process, and on an H100 a run after
    an 8-worker run recompiled every kernel.

    On a GPU it then runs the first case of the list, when that is a plain attention case (the
    first the checks would run anyway, so the kernels are hashed in the checks' own order): its
    kernel's load or compile and Triton's first launch (3 s on an H100 with a warm cache) move
    off the run's path. Its result is dropped; the check runs the case again and reports it."""
    import torch

    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ["TRITON_INTERPRET"] = "1"
    check = importlib.import_module("attnforge_kernels.check")
    importlib.import_module("attnforge_kernels.api.flash_attn")
    if not gpu or os.environ.get("TRITON_INTERPRET") == "1":
        return
    torch.zeros(1, device="cuda")
    from triton.runtime import driver

    driver.active.get_current_target()
    if getattr(check, "unavailable", lambda: "")():
        return
    cases = [str(c) for c in check.list_cases(bool(params.get("quick")))]
    if cases and cases[0].startswith("attn-"):
        # Named first: should the case crash the worker, the crash is reported against the
        # first kernels check, whose stderr tail then says which case did it.
        print(f"validate: kernels warm-up runs {cases[0]} (its result is dropped)", file=sys.stderr)
        sys.stderr.flush()
        check.run_case(cases[0])


def list_cases(params: dict[str, Any], ctx) -> dict[str, Any]:
    interpreter = _interpret_without_gpu(ctx)
    ctx.progress("import attnforge_kernels.check")
    mod, why = _import_check()
    if mod is None:
        return {"status": "skip", "message": why, "observations": {"kernels.present": False}}
    fn = getattr(mod, "list_cases", None)
    if fn is None:
        return {
            "status": "fail",
            "message": "attnforge_kernels.check has no list_cases(quick)",
            "observations": {"kernels.present": True},
        }
    ctx.progress("attnforge_kernels.check.list_cases")
    cases = [str(c) for c in fn(bool(ctx.quick))]
    # Optional in the contract: unavailable() -> "" or why the cases cannot run on this machine.
    why_not = getattr(mod, "unavailable", lambda: "")()
    if why_not:
        # Say it once instead of starting a process per case only for it to skip.
        return {
            "status": "skip",
            "message": f"{len(cases)} case(s) not run: {why_not}",
            "observations": {"kernels.present": True},
            "details": {"cases_not_run": cases},
        }
    where = " in Triton's CPU interpreter (no GPU)" if interpreter else ""
    return {
        "status": "pass",
        "message": f"{len(cases)} case(s){where}",
        "observations": {"kernels.present": True},
        "details": {"cases": cases, "interpreter": interpreter},
    }


def run_case(params: dict[str, Any], ctx) -> dict[str, Any]:
    name = params["name"]
    _interpret_without_gpu(ctx)
    mod, why = _import_check()
    if mod is None:
        return {"status": "skip", "message": why}
    ctx.progress(f"attnforge_kernels.check.run_case({name!r})")
    res = mod.run_case(name)
    if not isinstance(res, dict) or res.get("status") not in CASE_STATUSES:
        return {
            "status": "fail",
            "message": f"run_case returned {res!r:.200}, not a status in {CASE_STATUSES}",
        }
    metrics = {
        str(k): float(v)
        for k, v in (res.get("metrics") or {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    details: dict[str, Any] = {}
    try:
        shim = importlib.import_module("attnforge_kernels.sdpa_shim")
        stats = shim.stats()
        details["shim_stats"] = stats
        for key in ("routed", "fallback"):
            if isinstance(stats.get(key), int):
                metrics[f"shim.{key}"] = float(stats[key])
    except Exception as exc:  # noqa: BLE001 - the shim is optional for a case
        details["shim_stats_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return {
        "status": res["status"],
        "message": str(res.get("message", "")),
        "metrics": metrics,
        "details": details,
    }
