"""Plan the checks of a command and run them one subprocess each (standard library only)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from validate import grid
from validate.runner import FAILING, run_isolated

COMMANDS = ("env", "backends", "flash-attn", "kernels", "all")
GROUPS = {
    "env": ("env",),
    "backends": ("env", "backends"),
    "flash-attn": ("env", "flash-attn"),
    "kernels": ("env", "kernels"),
    "all": ("env", "backends", "flash-attn", "kernels"),
}
# Testing hook: os.pathsep-separated .py files whose CHECKS list adds checks (fault injection).
EXTRA_CHECKS_ENV = "VALIDATE_EXTRA_CHECKS"

# Which check produces each expectation key (to explain a key that was not observed).
PROVIDERS = {
    "torch.": "env",
    "triton.": "env",
    "aotriton.": "env",
    "sdpa.flash.available": "sdpa.config",
    "sdpa.flash.enabled": "sdpa.config",
    "sdpa.": f"sdpa.case.{grid.REFERENCE_CASE}",
    "rocm.": "sdpa.rocm",
    "flash_attn.works": "flash_attn.run",
    "flash_attn.": "flash_attn.info",
    "kernels.present": "kernels.list",
    "kernels.works": "kernels.case.*",
    "rdna3_minimal.": "rdna3_minimal.run",
}


def provider(key: str) -> str:
    """The id of the check that observes ``key`` (longest matching prefix)."""
    best = ""
    for prefix in PROVIDERS:
        if key.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    return PROVIDERS.get(best, "?")


def _spec(cid: str, target: str, title: str, **kw: Any) -> dict[str, Any]:
    return {
        "id": cid,
        "group": kw.pop("group", cid.split(".")[0]),
        "title": title,
        "target": target,
        "params": kw.pop("params", {}),
        "required": kw.pop("required", True),
        **kw,
    }


def plan(command: str, quick: bool) -> list[dict[str, Any]]:
    """The static checks of a command (kernels cases are added once they are listed)."""
    groups = GROUPS[command]
    checks = [_spec("env", "validate.checks.env:run", "Environment and device")]
    if "backends" in groups:
        checks.append(
            _spec("sdpa.config", "validate.checks.sdpa:config", "SDPA backends compiled/enabled")
        )
        checks.append(
            _spec("sdpa.rocm", "validate.checks.sdpa:rocm", "ROCm flash-attention library")
        )
        for case in grid.grid(quick):
            checks.append(
                _spec(
                    f"sdpa.case.{case.name}",
                    "validate.checks.sdpa:case",
                    f"SDPA {case.name}",
                    group="sdpa",
                    params={
                        "case": {k: v for k, v in case.to_json().items() if k != "gqa"},
                        "reference": case.name == grid.REFERENCE_CASE,
                    },
                )
            )
    if "flash-attn" in groups:
        checks.append(
            _spec("flash_attn.info", "validate.checks.flash_attn:info", "flash_attn package")
        )
        checks.append(
            _spec("flash_attn.run", "validate.checks.flash_attn:run", "flash_attn fwd+bwd")
        )
        # The rocWMMA RDNA3 kernel ships only in its own layer's images: planned where it is
        # installed (found without importing it, so the parent still needs no torch).
        if importlib.util.find_spec("rocwmma_fattn") is not None:
            checks.append(
                _spec(
                    "rdna3_minimal.run",
                    "validate.checks.rdna3_minimal:run",
                    "rocWMMA FA2 (RDNA3 minimal) fwd+bwd vs SDPA math",
                )  # fmt: skip
            )
    if "kernels" in groups:
        checks.append(
            _spec("kernels.list", "validate.checks.kernels:list_cases", "Bundled kernels")
        )
    extras = extra_checks()
    # An extra check may ask to run right after env, so that real checks follow it.
    checks[1:1] = [c for c in extras if c.get("position") == "first"]
    checks += [c for c in extras if c.get("position") != "first"]
    for c in checks:
        c["quick"] = quick
    return checks


def extra_checks(environ: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Checks from the files named by VALIDATE_EXTRA_CHECKS (for tests only)."""
    environ = os.environ if environ is None else environ
    specs = []
    for path in filter(None, environ.get(EXTRA_CHECKS_ENV, "").split(os.pathsep)):
        p = Path(path).resolve()
        mod_spec = importlib.util.spec_from_file_location(f"_validate_extra_{p.stem}", p)
        if mod_spec is None or mod_spec.loader is None:
            raise ValueError(f"{EXTRA_CHECKS_ENV}: cannot load {p}")
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
        for entry in getattr(module, "CHECKS", []):
            entry = dict(entry)
            func = entry.pop("func")
            specs.append(
                _spec(
                    entry.pop("id"),
                    f"file:{p}:{func}",
                    entry.pop("title", func),
                    **entry,
                )
            )
    return specs


def _skip(spec: dict[str, Any], message: str) -> dict[str, Any]:
    return {
        "id": spec["id"],
        "group": spec["group"],
        "title": spec["title"],
        "required": spec["required"],
        "status": "skip",
        "message": message,
        "duration_s": 0.0,
        "returncode": None,
        "signal": None,
        "progress": [],
        "observations": {},
        "details": {},
        "metrics": {},
    }


def execute(
    checks: list[dict[str, Any]],
    timeout: float,
    only: Callable[[str], bool] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    runner: Callable[..., dict[str, Any]] = run_isolated,
) -> list[dict[str, Any]]:
    """Run the planned checks in order; kernels cases are discovered from kernels.list."""
    records: list[dict[str, Any]] = []
    queue = list(checks)
    by_id: dict[str, dict[str, Any]] = {}
    while queue:
        spec = queue.pop(0)
        if only is not None and not only(spec["id"]):
            continue
        if spec["id"] == "flash_attn.run":
            info = by_id.get("flash_attn.info")
            if info is not None and info["status"] != "pass":
                rec = _skip(spec, f"flash_attn.info is {info['status']}: {info['message']}")
                records.append(rec)
                by_id[rec["id"]] = rec
                if on_record:
                    on_record(rec)
                continue
        rec = runner(spec, timeout=float(spec.get("timeout", timeout)))
        records.append(rec)
        by_id[rec["id"]] = rec
        if on_record:
            on_record(rec)
        if spec["id"] == "kernels.list" and rec["status"] == "pass":
            names = rec["details"].get("cases", [])
            new = [
                _spec(
                    f"kernels.case.{name}",
                    "validate.checks.kernels:run_case",
                    f"kernel {name}",
                    group="kernels",
                    params={"name": name},
                    quick=spec.get("quick", False),
                )
                for name in names
            ]
            queue[0:0] = new
    return records


def observations(records: list[dict[str, Any]]) -> dict[str, Any]:
    """All observations of all checks, plus the ones derived across checks."""
    obs: dict[str, Any] = {}
    for rec in records:
        obs.update(rec.get("observations") or {})
    kcases = [r for r in records if r["id"].startswith("kernels.case.")]
    if kcases:
        ran = [r for r in kcases if r["status"] != "skip"]
        obs["kernels.works"] = bool(ran) and all(r["status"] == "pass" for r in ran)
    return obs


def missing_reasons(records: list[dict[str, Any]], command: str) -> dict[str, str]:
    """For each expectation key a sentence on why it may be missing."""
    from validate.expect import KNOWN_KEYS

    by_id = {r["id"]: r for r in records}
    reasons = {}
    for key in KNOWN_KEYS:
        pid = provider(key)
        if pid == "kernels.case.*":
            lst = by_id.get("kernels.list")
            if lst is None:
                reasons[key] = f"the kernels checks are not part of command '{command}'"
            elif lst["status"] != "pass":
                reasons[key] = f"kernels.list is {lst['status']}: {lst['message']}"
            else:
                reasons[key] = "no kernels case ran"
            continue
        rec = by_id.get(pid)
        if rec is None:
            reasons[key] = f"check {pid} is not part of command '{command}'"
        else:
            reasons[key] = f"check {pid} is {rec['status']}: {rec['message']}"
    return reasons


def exit_code(records: list[dict[str, Any]], broken_expectations: int) -> int:
    """0 when every required check passed or skipped and every promise held, else 1."""
    bad = [r for r in records if r["required"] and r["status"] in FAILING]
    return 1 if bad or broken_expectations else 0


def python_info() -> dict[str, str]:
    return {"python": sys.version.split()[0], "executable": sys.executable}
