"""Plan the checks of a command and run them in check workers (standard library only).

Each spec says where it may run: ``worker`` is a sharing key (consecutive checks with the same
key share a long-lived worker process, validate/pool.py), ``isolate`` asks for a worker of its
own, and ``batch`` groups kernels cases that compile the same kernel (with several workers, a
worker that compiled it gets the next one)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from contract.names import FAILING
from validate import grid
from validate.runner import run_isolated

COMMANDS = ("env", "backends", "flash-attn", "kernels", "apps", "all")
GROUPS = {
    "env": ("env",),
    "backends": ("env", "backends"),
    "flash-attn": ("env", "flash-attn"),
    "kernels": ("env", "kernels"),
    "apps": ("env", "apps"),
    "all": ("env", "backends", "flash-attn", "kernels", "apps"),
}
# The apps' models (validate/checks/apps.py MODELS), by name; read here without importing torch.
# --quick keeps one of each app: transformers with GQA and a backward, diffusers' backends.
APP_MODELS = ("llama-gqa", "vit", "unet-attn", "qwen-image")
APP_MODELS_QUICK = ("llama-gqa", "qwen-image")
# Testing hook: os.pathsep-separated .py files whose CHECKS list adds checks (fault injection).
EXTRA_CHECKS_ENV = "VALIDATE_EXTRA_CHECKS"

# Which check produces each expectation key (to explain a key that was not observed).
PROVIDERS = {
    "torch.": "env",
    "triton.": "env",
    "aotriton.": "env",
    "sdpa.flash.available": "sdpa.config",
    "sdpa.flash.enabled": "sdpa.config",
    "sdpa.workload.": "sdpa.workloads",
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


# Sharing keys. The SDPA flags and the SDPA cases touch nothing the others would see
# (sdpa_kernel puts the backend flags back, and the worker's StateGuard does too), so they share
# one worker; flash_attn, the rocWMMA kernel and the bundled kernels each import a package whose
# import reads environment variables (FLASH_ATTENTION_TRITON_AMD_ENABLE, TRITON_INTERPRET), so
# each group starts a fresh worker. env runs first in a worker of its own (MAIN) while the SDPA,
# flash_attn, kernels and apps workers start and warm up (their specs' ``warm_up``, early_starts()): the
# imports and first-use costs of a run, about 15 s on an H100, overlap instead of adding up.
MAIN = "main"
SDPA = "sdpa"
# Checks that run where the kernels.list check stood, and checks that wait for another.
DEPENDS = {"flash_attn.run": "flash_attn.info"}
_KERNEL_SHAPE_RE = re.compile(r"-b\d+-sq\d+-sk\d+-h\d+x\d+")


def _spec(cid: str, target: str, title: str, **kw: Any) -> dict[str, Any]:
    group = kw.pop("group", cid.split(".")[0])
    return {
        "id": cid,
        "group": group,
        "title": title,
        "target": target,
        "params": kw.pop("params", {}),
        "required": kw.pop("required", True),
        "worker": kw.pop("worker", group),
        "isolate": bool(kw.pop("isolate", False)),
        **kw,
    }


def kernel_batch(name: str) -> str:
    """Kernels cases that differ only in batch, lengths and head counts compile one kernel:
    'attn-bf16-b1-sq129-sk129-h2x2-d128-full-bshd' -> 'attn-bf16-d128-full-bshd'."""
    return _KERNEL_SHAPE_RE.sub("", name)


def placement(spec: dict[str, Any], observations: dict[str, Any]) -> dict[str, Any]:
    """The spec as it will run, given what earlier checks observed.

    On ROCm each SDPA case gets a worker of its own: PyTorch states some of its reasons
    ("Flash attention support on Navi31 GPU is still experimental") with TORCH_WARN_ONCE,
    which only the first case in a process would show.
    """
    if spec["id"].startswith(("sdpa.case.", "sdpa.workloads")) and observations.get("torch.hip"):
        return {**spec, "isolate": True}
    return spec


def plan(command: str, quick: bool, limits: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The static checks of a command (kernels cases are added once they are listed).
    ``limits``: what the arch's torch refuses by design (the expect file's sdpa_limits)."""
    groups = GROUPS[command]
    checks = [_spec("env", "validate.checks.env:run", "Environment and device", worker=MAIN)]
    if "backends" in groups:
        checks.append(
            _spec(
                "sdpa.config",
                "validate.checks.sdpa:config",
                "SDPA backends compiled/enabled",
                worker=SDPA,
                warm_up=[{"target": "validate.checks.sdpa:warm_up"}],
            )
        )
        # Alone: it sets the preferred ROCm library and runs flash under each, and a refused
        # forced run would use up PyTorch's warn-once reasons before the cases state them.
        checks.append(
            _spec(
                "sdpa.rocm",
                "validate.checks.sdpa:rocm",
                "ROCm flash-attention library",
                isolate=True,
            )
        )
        for case in grid.grid(quick):
            checks.append(
                _spec(
                    f"sdpa.case.{case.name}",
                    "validate.checks.sdpa:case",
                    f"SDPA {case.name}",
                    group="sdpa",
                    worker=SDPA,
                    params={
                        "case": {k: v for k, v in case.to_json().items() if k != "gqa"},
                        "reference": case.name == grid.REFERENCE_CASE,
                        "limits": limits or {},
                    },
                )
            )
        # After the grid: the default pick at real workloads' shapes (fused or math).
        checks.append(
            _spec(
                "sdpa.workloads",
                "validate.checks.workloads:run",
                "SDPA at workload shapes: fused or math",
                group="sdpa",
                worker=SDPA,
                params={"quick": quick},
            )
        )
    if "flash-attn" in groups:
        installed = importlib.util.find_spec("flash_attn") is not None
        checks.append(
            _spec(
                "flash_attn.info",
                "validate.checks.flash_attn:info",
                "flash_attn package",
                # Its own worker, started early, only where there is something to import (the
                # package reads FLASH_ATTENTION_TRITON_AMD_ENABLE as it loads). Without it the
                # check only meets ModuleNotFoundError, which the warm SDPA worker answers at
                # once instead of a fresh process (1.8 s on an H100) that imports nothing.
                warm_up=[{"target": "validate.checks.flash_attn:warm_up"}] if installed else [],
                **({} if installed else {"worker": SDPA}),
            )
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
            _spec(
                "kernels.list",
                "validate.checks.kernels:list_cases",
                "Bundled kernels",
                warm_up=[{"target": "validate.checks.kernels:warm_up", "params": {"quick": quick}}],
            )
        )
    if "apps" in groups:
        # One worker for them all: transformers and diffusers are imported once.
        checks.append(
            _spec(
                "apps.contracts",
                "validate.contracts:run",
                "ComfyUI and vLLM contract probes (flash_attn, SDPA)",
                worker="apps",
            )
        )
        for model in APP_MODELS_QUICK if quick else APP_MODELS:
            checks.append(
                _spec(
                    f"apps.{model}",
                    "validate.checks.apps:run",
                    f"app model {model}, every attention implementation",
                    worker="apps",
                    params={"model": model},
                    warm_up=[
                        {"target": "validate.checks.apps:warm_up", "params": {"models": [model]}}
                    ],
                )
            )
    extras = extra_checks()
    # An extra check may ask to run right after env, so that real checks follow it.
    checks[1:1] = [c for c in extras if c.get("position") == "first"]
    checks += [c for c in extras if c.get("position") != "first"]
    for c in checks:
        c["quick"] = quick
    return checks


def early_starts(checks: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(sharing key, warm-up steps) of the workers to start at once, in plan order: every key
    whose checks name ``warm_up`` steps, except the first check's (its worker starts anyway)
    and isolated checks'. The pool runs the steps there while the checks before them run."""
    keys: dict[str, list[dict[str, Any]]] = {}
    first = checks[0].get("worker") if checks else None
    for spec in checks:
        key = spec.get("worker")
        if spec.get("isolate") or not key or key == first or not spec.get("warm_up"):
            continue
        steps = keys.setdefault(key, [])
        steps += [s for s in spec["warm_up"] if s not in steps]
    return list(keys.items())


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


def _kernel_cases(list_spec: dict[str, Any], names: list[str]) -> list[dict[str, Any]]:
    return [
        _spec(
            f"kernels.case.{name}",
            "validate.checks.kernels:run_case",
            f"kernel {name}",
            group="kernels",
            params={"name": name},
            quick=list_spec.get("quick", False),
            worker=list_spec.get("worker", "kernels"),
            batch=kernel_batch(name),
        )
        for name in names
    ]


def _now(runner: Callable[..., dict[str, Any]], spec: dict[str, Any], timeout: float) -> Future:
    """Run in this thread (one worker: no threads, and Ctrl-C stops the run at once)."""
    fut: Future = Future()
    fut.set_result(runner(spec, timeout=timeout))
    return fut


def execute(
    checks: list[dict[str, Any]],
    timeout: float,
    only: Callable[[str], bool] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    runner: Callable[..., dict[str, Any]] = run_isolated,
    workers: int = 1,
) -> list[dict[str, Any]]:
    """Run the planned checks, up to ``workers`` at a time, and return their records in plan
    order (``on_record`` sees them in that order too). Kernels cases are discovered from
    kernels.list and take its place in the order; flash_attn.run waits for flash_attn.info and
    is a skip when that did not pass."""
    order = [s for s in checks if only is None or only(s["id"])]
    done: dict[str, dict[str, Any]] = {}
    started: set[str] = set()
    running: dict[Future, dict[str, Any]] = {}
    seen: dict[str, Any] = {}  # observations so far, for placement()
    emitted = 0
    threads = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None

    def finish(spec: dict[str, Any], rec: dict[str, Any]) -> None:
        nonlocal emitted
        done[spec["id"]] = rec
        seen.update(rec.get("observations") or {})
        if spec["id"] == "kernels.list" and rec["status"] == "pass":
            new = _kernel_cases(spec, list(rec["details"].get("cases", [])))
            new = [s for s in new if only is None or only(s["id"])]
            at = next(i for i, s in enumerate(order) if s["id"] == spec["id"]) + 1
            order[at:at] = new
        while emitted < len(order) and order[emitted]["id"] in done:
            if on_record:
                on_record(done[order[emitted]["id"]])
            emitted += 1

    try:
        while True:
            for spec in list(order):
                if len(running) >= workers:
                    break
                if spec["id"] in started:
                    continue
                dep = DEPENDS.get(spec["id"])
                if dep in started and dep not in done:
                    continue  # it is running; another check may go first
                started.add(spec["id"])
                info = done.get(dep) if dep else None
                if info is not None and info["status"] != "pass":
                    finish(spec, _skip(spec, f"{dep} is {info['status']}: {info['message']}"))
                    continue
                placed = placement(spec, seen)
                limit = float(spec.get("timeout", timeout))
                if threads is None:
                    fut = _now(runner, placed, limit)
                else:
                    fut = threads.submit(runner, placed, timeout=limit)
                running[fut] = spec
            if not running:
                if all(s["id"] in started for s in order):
                    break
                continue
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                finish(running.pop(fut), fut.result())
    finally:
        if threads is not None:
            # On an error or Ctrl-C do not wait for the checks in flight: the caller closes
            # the pool, which kills their workers.
            threads.shutdown(wait=not running, cancel_futures=True)
    return [done[s["id"]] for s in order]


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
