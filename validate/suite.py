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
from validate import gate, grid
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


def _backend_specs(quick: bool, limits: dict[str, Any] | None) -> list[dict[str, Any]]:
    """sdpa.config, sdpa.rocm, the grid's cases and the workload check."""
    specs = [
        _spec(
            "sdpa.config",
            "validate.checks.sdpa:config",
            "SDPA backends compiled/enabled",
            worker=SDPA,
            warm_up=[{"target": "validate.checks.sdpa:warm_up"}],
        ),  # fmt: skip
        # Alone: it sets the preferred ROCm library and runs flash under each, and a refused
        # forced run would use up PyTorch's warn-once reasons before the cases state them.
        _spec(
            "sdpa.rocm", "validate.checks.sdpa:rocm", "ROCm flash-attention library", isolate=True
        ),  # fmt: skip
    ]
    for case in grid.grid(quick):
        params = {
            "case": {k: v for k, v in case.to_json().items() if k != "gqa"},
            "reference": case.name == grid.REFERENCE_CASE,
            "limits": limits or {},
        }
        specs.append(_spec(f"sdpa.case.{case.name}", "validate.checks.sdpa:case",
                           f"SDPA {case.name}", group="sdpa", worker=SDPA, params=params))  # fmt: skip
    # After the grid: the default pick at real workloads' shapes (fused or math).
    specs.append(_spec("sdpa.workloads", "validate.checks.workloads:run",
                       "SDPA at workload shapes: fused or math", group="sdpa", worker=SDPA,
                       params={"quick": quick}))  # fmt: skip
    return specs


def gate_specs(sdpa_specs: list[dict[str, Any]], aotriton: dict[str, Any] | None = None,
               arch: str | None = None, environ: dict[str, str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """The AOTriton gate as apps see it (validate/gate.py): where the recipes call the arch's
    AOTriton experimental, a copy of each case and of the workload check in the gate state the
    environment does not set, each in a fresh process (torch reads the variable once), then the
    comparison, computed in the parent; elsewhere the comparison alone, a skip saying why."""
    environ = os.environ if environ is None else environ
    state = gate.state_of(environ)
    why = gate.why_not(aotriton, arch)
    flip = gate.other(state)
    copies = []
    for spec in [] if why else sdpa_specs:
        if not spec["id"].startswith(("sdpa.case.", "sdpa.workloads")):
            continue
        params = {**spec["params"], "gate": flip, "reference": False}
        copies.append({**spec, "id": spec["id"] + gate.SUFFIX[flip], "params": params,
                       "title": f"{spec['title']} ({gate.KNOB} {flip})", "isolate": True,
                       "skip_when": ["torch.hip", False, gate.NOT_ROCM]})  # fmt: skip
    pairs = [[c["id"][: -len(gate.SUFFIX[flip])], c["id"]] for c in copies]
    compare = _spec(gate.COMPARE_ID, "parent:validate.gate:compare",
                    f"{gate.KNOB} as apps set it: both states compared", group="sdpa",
                    required=False, parent=True,
                    params={"image_state": state, "image_value": environ.get(gate.KNOB), "why_not": why,
                            "pairs": pairs})  # fmt: skip
    return [*copies, compare]


def _flash_attn_specs() -> list[dict[str, Any]]:
    installed = importlib.util.find_spec("flash_attn") is not None
    specs = [
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
        ),
        _spec("flash_attn.run", "validate.checks.flash_attn:run", "flash_attn fwd+bwd"),
    ]
    # The rocWMMA RDNA3 kernel ships only in its own layer's images: planned where it is
    # installed (found without importing it, so the parent still needs no torch).
    if importlib.util.find_spec("rocwmma_fattn") is not None:
        specs.append(_spec("rdna3_minimal.run", "validate.checks.rdna3_minimal:run",
                           "rocWMMA FA2 (RDNA3 minimal) fwd+bwd vs SDPA math"))  # fmt: skip
    return specs


def _app_specs(quick: bool) -> list[dict[str, Any]]:
    # One worker for them all: transformers and diffusers are imported once.
    specs = [_spec("apps.contracts", "validate.contracts:run",
                   "ComfyUI and vLLM contract probes (flash_attn, SDPA)", worker="apps")]  # fmt: skip
    for model in APP_MODELS_QUICK if quick else APP_MODELS:
        warm = [{"target": "validate.checks.apps:warm_up", "params": {"models": [model]}}]
        specs.append(_spec(f"apps.{model}", "validate.checks.apps:run",
                           f"app model {model}, every attention implementation", worker="apps",
                           params={"model": model}, warm_up=warm))  # fmt: skip
    return specs


def plan(command: str, quick: bool, limits: dict[str, Any] | None = None,
         aotriton: dict[str, Any] | None = None, arch: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """The static checks of a command (kernels cases are added once they are listed).
    ``limits``: what the arch's torch refuses by design (the expect file's sdpa_limits);
    ``aotriton``: what the recipes say of its AOTriton (the expect file's aotriton), which decides
    whether the SDPA checks also run in the other experimental-gate state."""
    groups = GROUPS[command]
    checks = [_spec("env", "validate.checks.env:run", "Environment and device", worker=MAIN)]
    if "backends" in groups:
        sdpa_specs = _backend_specs(quick, limits)
        checks += sdpa_specs + gate_specs(sdpa_specs, aotriton, arch)
    if "flash-attn" in groups:
        checks += _flash_attn_specs()
    if "kernels" in groups:
        warm = [{"target": "validate.checks.kernels:warm_up", "params": {"quick": quick}}]
        checks.append(_spec("kernels.list", "validate.checks.kernels:list_cases",
                            "Bundled kernels", warm_up=warm))  # fmt: skip
    if "apps" in groups:
        checks += _app_specs(quick)
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


def decided_record(
    spec: dict[str, Any], status: str, message: str, **fields: Any
) -> dict[str, Any]:
    """A record for a check decided in the parent (a skip, the gate comparison)."""
    return {
        "id": spec["id"],
        "group": spec["group"],
        "title": spec["title"],
        "required": spec["required"],
        "status": status,
        "message": message,
        "duration_s": 0.0,
        "returncode": None,
        "signal": None,
        "progress": [],
        "observations": fields.get("observations") or {},
        "details": fields.get("details") or {},
        "metrics": {},
    }


def _skip(spec: dict[str, Any], message: str) -> dict[str, Any]:
    return decided_record(spec, "skip", message)


def _precondition(spec: dict[str, Any], done: dict[str, Any], seen: dict[str, Any]) -> str | None:
    """Why ``spec`` is a skip without running, from what ran before it; None to run it."""
    dep = DEPENDS.get(spec["id"])
    info = done.get(dep) if dep else None
    if info is not None and info["status"] != "pass":
        return f"{dep} is {info['status']}: {info['message']}"
    when = spec.get("skip_when")
    if when and when[0] in seen and seen[when[0]] == when[1]:
        return when[2]
    return None


def _waits(spec: dict[str, Any], order_ids: set[str], started: set[str], done: dict) -> bool:
    """Whether ``spec`` must wait: a check it depends on is running, or (the gate comparison) one
    of the checks it compares has not finished."""
    dep = DEPENDS.get(spec["id"])
    if dep in started and dep not in done:
        return True
    inputs = [i for pair in spec.get("params", {}).get("pairs", []) for i in pair]
    return bool(spec.get("parent")) and any(i in order_ids and i not in done for i in inputs)


def _in_parent(spec: dict[str, Any], done: dict[str, Any], seen: dict[str, Any]) -> dict[str, Any]:
    """The gate comparison (validate/gate.py), from the records of both states."""
    status, message, details = gate.compare(spec["params"], done, seen)
    obs = {"sdpa.aotriton_gate.image_state": details["image_state"]}
    if status != "skip":
        obs["sdpa.aotriton_gate.differences"] = details.get("differences", [])
    return decided_record(spec, status, message, details=details, observations=obs)


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


class _Execution:
    """The state of one ``execute``: the order (which grows by the listed kernels cases), the
    records so far, the checks in flight and the observations placement() reads."""

    def __init__(self, order, only, on_record, runner, workers, timeout):  # noqa: ANN001
        self.order, self.only, self.on_record = order, only, on_record
        self.runner, self.workers, self.timeout = runner, workers, timeout
        self.done: dict[str, dict[str, Any]] = {}
        self.started: set[str] = set()
        self.running: dict[Future, dict[str, Any]] = {}
        self.seen: dict[str, Any] = {}  # observations so far, for placement()
        self.emitted = 0
        self.threads = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None

    def finish(self, spec: dict[str, Any], rec: dict[str, Any]) -> None:
        self.done[spec["id"]] = rec
        self.seen.update(rec.get("observations") or {})
        if spec["id"] == "kernels.list" and rec["status"] == "pass":
            new = _kernel_cases(spec, list(rec["details"].get("cases", [])))
            new = [s for s in new if self.only is None or self.only(s["id"])]
            at = next(i for i, s in enumerate(self.order) if s["id"] == spec["id"]) + 1
            self.order[at:at] = new
        while self.emitted < len(self.order) and self.order[self.emitted]["id"] in self.done:
            if self.on_record:
                self.on_record(self.done[self.order[self.emitted]["id"]])
            self.emitted += 1

    def start_ready(self) -> None:
        """Start every check that may start now, in plan order, up to ``workers`` at a time."""
        ids = {s["id"] for s in self.order}
        for spec in list(self.order):
            if len(self.running) >= self.workers:
                break
            if spec["id"] in self.started or _waits(spec, ids, self.started, self.done):
                continue
            self.started.add(spec["id"])
            reason = _precondition(spec, self.done, self.seen)
            if reason is not None:
                self.finish(spec, _skip(spec, reason))
            elif spec.get("parent"):
                self.finish(spec, _in_parent(spec, self.done, self.seen))
            else:
                placed = placement(spec, self.seen)
                limit = float(spec.get("timeout", self.timeout))
                if self.threads is None:
                    fut = _now(self.runner, placed, limit)
                else:
                    fut = self.threads.submit(self.runner, placed, timeout=limit)
                self.running[fut] = spec

    def loop(self) -> None:
        while True:
            self.start_ready()
            if not self.running:
                if all(s["id"] in self.started for s in self.order):
                    return
                continue
            finished, _ = wait(self.running, return_when=FIRST_COMPLETED)
            for fut in finished:
                self.finish(self.running.pop(fut), fut.result())


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
    is a skip when that did not pass; the gate comparison waits for the checks it compares and
    is computed here, in the parent."""
    order = [s for s in checks if only is None or only(s["id"])]
    run = _Execution(order, only, on_record, runner, workers, timeout)
    try:
        run.loop()
    finally:
        if run.threads is not None:
            # On an error or Ctrl-C do not wait for the checks in flight: the caller closes
            # the pool, which kills their workers.
            run.threads.shutdown(wait=not run.running, cancel_futures=True)
    return [run.done[s["id"]] for s in order]


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
