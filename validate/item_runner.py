"""Run a backend's work items in child processes: per-item timeout, a fresh process after a crash.

Standard library only (the bench tools' parents never import torch). The child is
``python -m MODULE --child SPEC EVENTS``: it reads the spec (``{"backend", "items", ...}``) and
appends one JSON line per event to EVENTS:

    {"event": "env", "env": {...}}                       once, when torch is imported
    {"event": "start", "index": i}                       before item i
    {"event": "result", "index": i, "result": {...}}     after item i

The parent polls EVENTS. An item running longer than the timeout gets ``timeout`` and its
process group is killed; a process that dies inside an item (a signal, a GPU fault, an exit)
charges that item with ``crash``. Either way a fresh process takes the items still left, so one
bad shape never costs the others. A process that dies outside any item (torch does not import,
say) charges every item left, since a new process would only die the same way; so does one
that makes no progress outside any item for longer than the timeout (``timeout``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from validate import forkserver, runner
from validate.runner import is_device_fault, kill_group, signal_name, tail

POLL_S = 0.1
# A child that ends on purpose after a GPU fault (its device state is no longer trustworthy).
EXIT_DEVICE_FAULT = 3


@dataclass
class ItemOutcome:
    """How one item ended when its process did not report a result for it."""

    status: str  # "crash" | "timeout"
    message: str


@dataclass
class _Events:
    path: Path
    offset: int = 0
    env: dict[str, Any] | None = None
    started: dict[int, float] = field(default_factory=dict)
    results: dict[int, dict[str, Any]] = field(default_factory=dict)
    last_event: float = field(default_factory=time.monotonic)

    def read(self, on_result: Callable[[int, dict[str, Any]], None]) -> None:
        """Consume the complete lines written since the last read."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        for raw in data[: end + 1].splitlines():
            try:
                ev = json.loads(raw)
            except json.JSONDecodeError:
                continue
            kind = ev.get("event")
            self.last_event = time.monotonic()
            if kind == "env" and self.env is None:
                self.env = ev.get("env")
            elif kind == "start":
                self.started[int(ev["index"])] = time.monotonic()
            elif kind == "result":
                i = int(ev["index"])
                self.results[i] = ev["result"]
                on_result(i, ev["result"])


def _how_it_ended(rc: int | None, stderr: str) -> str:
    last = tail(stderr, 1)
    last_line = f": {last[0]}" if last else ""
    fault = " (GPU memory fault)" if is_device_fault(stderr) else ""
    if rc is not None and rc < 0:
        return f"killed by {signal_name(-rc)}{fault}{last_line}"
    if rc == EXIT_DEVICE_FAULT:
        return f"GPU fault; the process ended so the next item gets a fresh device{last_line}"
    return f"the process exited with status {rc} without a result{fault}{last_line}"


def run_items(
    module: str,
    spec: dict[str, Any],
    count: int,
    timeout: float,
    on_result: Callable[[int, dict[str, Any]], None],
    on_outcome: Callable[[int, ItemOutcome], None],
    env: dict[str, str] | None = None,
) -> dict[str, Any] | None:
    """Run ``count`` items of ``spec`` through ``python -m module --child``; return the env event.

    ``on_result(index, result)`` gets each item the child reported; ``on_outcome(index,
    outcome)`` each item the child could not report (crash or timeout).
    """
    # This package importable, the pid the child watches (it ends its group when this process
    # is gone), one Triton cache for the run.
    child_env = runner.child_env(env)
    remaining = list(range(count))
    env_seen: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="validate-items-") as tmp:
        attempt = 0
        while remaining:
            attempt += 1
            end = _attempt(module, {**spec, "indices": remaining}, Path(tmp), attempt, child_env,
                           timeout, on_result)  # fmt: skip
            env_seen = env_seen or end.events.env
            remaining = [i for i in remaining if i not in end.events.results]
            remaining = _charge(end, remaining, timeout, on_outcome)
    return env_seen


@dataclass
class _End:
    """How one child process ended: what it reported, and what it was killed for."""

    events: _Events
    timed_out: int | None  # the item that ran past the timeout
    stalled: bool  # no progress between items for the timeout
    returncode: int | None
    stderr: str


def _attempt(
    module: str, spec: dict[str, Any], tmp: Path, attempt: int, child_env: dict[str, str],
    timeout: float, on_result: Callable[[int, dict[str, Any]], None],
) -> _End:  # fmt: skip
    """One child process over the items `spec` lists, watched until it ends or is killed."""
    spec_path = tmp / f"spec-{attempt}.json"
    events = _Events(tmp / f"events-{attempt}.jsonl")
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    err_path = tmp / f"stderr-{attempt}.txt"
    with open(err_path, "wb") as err_fh:
        # Output to files, not pipes: a helper the child leaves behind (a compile
        # worker) would hold a pipe open and make a finished child look hung.
        proc = forkserver.popen_module(
            module,
            ["--child", str(spec_path), str(events.path)],
            env=child_env,
            stdout=err_fh,
            stderr=err_fh,
        )
        timed_out, stalled = _watch(proc, events, timeout, on_result)
        kill_group(proc)
        proc.wait()
    events.read(on_result)
    stderr = err_path.read_bytes().decode("utf-8", "replace")
    return _End(events, timed_out, stalled, proc.returncode, stderr)


def _watch(proc, events: _Events, timeout: float, on_result) -> tuple[int | None, bool]:
    """Wait for the child, reading its events: (the item that timed out, or None; whether it
    stalled between items)."""
    while True:
        try:
            proc.wait(timeout=POLL_S)
            return None, False
        except subprocess.TimeoutExpired:
            pass
        events.read(on_result)
        running = [i for i in events.started if i not in events.results]
        if running and time.monotonic() - events.started[running[-1]] > timeout:
            return running[-1], False
        if not running and time.monotonic() - events.last_event > timeout:
            return None, True  # between items: importing torch, say


def _charge(
    end: _End, remaining: list[int], timeout: float, on_outcome: Callable[[int, ItemOutcome], None]
) -> list[int]:
    """Charge the items a child left unreported with its end; the ones to run again."""
    if not remaining:
        return []
    if end.timed_out is not None:
        on_outcome(
            end.timed_out,
            ItemOutcome("timeout", f"no result within {timeout:g} s; the process was killed"),
        )
        return [i for i in remaining if i != end.timed_out]
    if end.stalled:
        for i in remaining:  # a new process would most likely hang the same way
            on_outcome(
                i,
                ItemOutcome(
                    "timeout",
                    f"before this item started: no progress outside any item for "
                    f"{timeout:g} s; the process was killed",
                ),
            )
        return []
    in_flight = [i for i in remaining if i in end.events.started]
    how = _how_it_ended(end.returncode, end.stderr)
    if in_flight:
        on_outcome(in_flight[0], ItemOutcome("crash", how))
        return [i for i in remaining if i != in_flight[0]]
    for i in remaining:  # it died outside any item: a new process would too
        on_outcome(i, ItemOutcome("crash", f"before this item started: {how}"))
    return []


class EventWriter:
    """Child side: append events to the parent's file, each line flushed to disk at once.
    Creating one also starts watching the parent (runner.watch_parent)."""

    def __init__(self, path: str):
        runner.watch_parent()  # a killed bench leaves nothing running on the GPU
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the child

    def emit(self, event: dict[str, Any]) -> None:
        self._fh.write(json.dumps(event, default=str) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())


def env_info() -> dict[str, Any]:
    """Child side: versions and device, as the bench documents' ``env`` block."""
    import torch

    try:
        import triton

        triton_version: str | None = str(triton.__version__)
    except Exception:  # noqa: BLE001 - absent or broken: recorded as null
        triton_version = None
    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    device, arch = "cpu", None
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
        props = torch.cuda.get_device_properties(0)
        if hip:
            arch = str(getattr(props, "gcnArchName", "")).split(":", 1)[0] or None
        else:
            arch = f"sm_{props.major}{props.minor}"
    return {
        "torch": str(torch.__version__),
        "triton": triton_version,
        "device": device,
        "arch": arch,
        "hip": str(hip) if hip else None,
        "cuda": str(cuda) if cuda and not hip else None,
    }


UNKNOWN_ENV = {
    "torch": "unknown",
    "triton": None,
    "device": "unknown",
    "arch": None,
    "hip": None,
    "cuda": None,
}


def write_json(doc: dict[str, Any], path: str) -> None:
    """Write beside the target, then replace it: a reader never sees half a document."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


if __name__ == "__main__":
    if sys.argv[1:] == ["--env"]:
        print(json.dumps(env_info()))
        sys.exit(0)
    print("internal entry point: python -m validate.item_runner --env", file=sys.stderr)
    sys.exit(2)
