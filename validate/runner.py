"""How a check process ended -> a status, and one check in a process of its own (``--isolate``).

Standard library only: the parent process never imports torch, so nothing a check does
(a segfault, an abort, an illegal memory access, a hang) can take the run down.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.names import CHECK_STATUSES, FAILING
from validate import forkserver

STATUSES = CHECK_STATUSES
STDERR_TAIL_LINES = 20

# Text that means the device faulted, even when torch turned it into a Python exception
# (CUDA "illegal memory access" is raised as RuntimeError; HIP's memory access fault aborts).
DEVICE_FAULT_PATTERNS = (
    r"illegal memory access",
    r"misaligned address",
    r"unspecified launch failure",
    r"device-side assert",
    r"memory access fault",
    r"page not present",
    r"hipErrorIllegalAddress",
    r"hipErrorLaunchFailure",
    r"HSA_STATUS_ERROR",
    r"cudaErrorIllegalAddress",
    r"an illegal instruction was encountered",
)
_FAULT_RE = re.compile("|".join(DEVICE_FAULT_PATTERNS), re.IGNORECASE)


def is_device_fault(text: str) -> bool:
    """Whether an error text reports a GPU fault (the process state is no longer trustworthy)."""
    return bool(_FAULT_RE.search(text or ""))


# Set by every launcher to its own pid: the child compares its parent with it, so a parent that
# died while the child was still importing torch is noticed too.
PARENT_ENV = "VALIDATE_PARENT_PID"


def watch_parent(interval: float = 0.5) -> None:
    """In a check or worker process: kill this process group when the validate process that
    started it is gone (SIGKILLed, timed out, a cancelled CI job, `docker stop`), so no check
    goes on holding the GPU. A thread that polls the parent pid rather than PR_SET_PDEATHSIG,
    which fires when the forking *thread* exits, and the pool starts workers from threads."""
    import threading

    parent = int(os.environ.get(PARENT_ENV) or os.getppid())

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                try:
                    os.killpg(os.getpgrp(), signal.SIGKILL)
                finally:
                    os._exit(137)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def signal_name(signum: int) -> str:
    """SIGSEGV for 11, and so on; 'signal N' where Python does not know the number."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def tail(text: str, lines: int = STDERR_TAIL_LINES) -> list[str]:
    """The last non-empty lines of a text."""
    kept = [ln.rstrip() for ln in (text or "").splitlines() if ln.strip()]
    return kept[-lines:]


@dataclass
class Outcome:
    """How a check's subprocess ended, as the classifier needs it."""

    returncode: int | None
    timed_out: bool
    payload: dict[str, Any] | None
    stderr: str = ""
    progress: list[str] = field(default_factory=list)


def classify(outcome: Outcome) -> tuple[str, str]:
    """Map a subprocess outcome to (status, message). Pure: no I/O."""
    stage = f" during {outcome.progress[-1]}" if outcome.progress else ""
    last = tail(outcome.stderr, 1)
    last_line = f": {last[0]}" if last else ""
    if outcome.timed_out:
        return "timeout", f"no result before the timeout{stage}; the process was killed"
    rc = outcome.returncode
    if rc is not None and rc < 0:
        name = signal_name(-rc)
        fault = " (GPU memory fault)" if is_device_fault(outcome.stderr) else ""
        return "crash", f"killed by {name}{fault}{stage}{last_line}"
    payload = outcome.payload
    if payload is not None:
        status = payload.get("status")
        message = str(payload.get("message", ""))
        if status not in STATUSES:
            return "crash", f"the check returned an unknown status {status!r}"
        if rc not in (0, None) and status == "pass":
            return "crash", f"result written, then the process exited with status {rc}{last_line}"
        return status, message
    if rc is not None and rc > 128 and rc - 128 in {int(s) for s in signal.Signals}:
        # A shell or launcher in between reports a signal as 128+N.
        name = signal_name(rc - 128)
        return "crash", f"killed by {name} (exit status {rc}){stage}{last_line}"
    fault = " (GPU memory fault)" if is_device_fault(outcome.stderr) else ""
    return "crash", f"exited with status {rc} without a result{fault}{stage}{last_line}"


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the check's process group (it leads its own session); gone already is fine."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if proc.poll() is None:
            proc.kill()


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a check process: this package importable, unbuffered output, the pid it
    watches (watch_parent), and one Triton cache for every process of the run (a user's
    TRITON_CACHE_DIR is kept)."""
    package_parent = str(Path(__file__).resolve().parent.parent)
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, out.get("PYTHONPATH", "")) if p)
    out.setdefault("PYTHONUNBUFFERED", "1")
    out[PARENT_ENV] = str(os.getpid())
    cache = triton_cache_dir(out)
    if cache:
        out["TRITON_CACHE_DIR"] = cache
    return out


def _writable_dir(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def triton_cache_dir(
    environ: dict[str, str], writable: Callable[[str], bool] = _writable_dir
) -> str | None:
    """Where every check process of a run keeps Triton's compiled kernels.

    A user's TRITON_CACHE_DIR wins. Otherwise Triton's own default (``$TRITON_HOME`` or
    ``$HOME``, then ``.triton/cache``) when it can be written, else a per-user folder in the
    temporary directory: an image run as another user, or with a read-only home, still compiles
    each kernel once per run instead of once per process. None when nothing is writable.
    """
    if environ.get("TRITON_CACHE_DIR"):
        return environ["TRITON_CACHE_DIR"]
    home = environ.get("TRITON_HOME") or environ.get("HOME")
    candidates = [os.path.join(home, ".triton", "cache")] if home else []
    uid = os.getuid() if hasattr(os, "getuid") else 0
    candidates.append(os.path.join(tempfile.gettempdir(), f"attnforge-triton-cache-{uid}"))
    for path in candidates:
        if writable(path):
            return path
    return None


def make_record(
    check: dict[str, Any], outcome: Outcome, duration: float, stderr: str
) -> dict[str, Any]:
    """The report record of one check from how its process (or its turn in a worker) ended;
    ``stderr`` is the check's own standard error, whose last lines a failure records."""
    status, message = classify(outcome)
    rc = outcome.returncode
    timed_out = outcome.timed_out
    payload = outcome.payload
    record: dict[str, Any] = {
        "id": check["id"],
        "group": check.get("group", check["id"].split(".")[0]),
        "title": check.get("title", check["id"]),
        "required": bool(check.get("required", True)),
        "status": status,
        "message": message,
        "duration_s": round(duration, 3),
        "returncode": None if timed_out else rc,
        "signal": signal_name(-rc) if (rc or 0) < 0 and not timed_out else None,
        "progress": outcome.progress[-5:],
        "observations": {},
        "details": {},
        "metrics": {},
    }
    if payload is not None:
        for key in ("observations", "details", "metrics"):
            if isinstance(payload.get(key), dict):
                record[key] = payload[key]
    if status in FAILING:
        record["stderr_tail"] = tail(stderr)
    return record


def read_result(path: Path) -> dict[str, Any] | None:
    """A check's result file, or None when it is missing or cut short."""
    if not path.exists():
        return None
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, OSError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


def read_progress(path: Path) -> list[str]:
    """The stages a check reported, in order."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    return [ln for ln in text.splitlines() if ln.strip()]


def run_isolated(
    check: dict[str, Any],
    timeout: float,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``check`` (a JSON-able spec) in a process of its own; return its record."""
    child = child_env(env)
    with tempfile.TemporaryDirectory(prefix="validate-") as tmp:
        spec_path = Path(tmp, "spec.json")
        result_path = Path(tmp, "result.json")
        progress_path = Path(tmp, "progress.txt")
        spec_path.write_text(json.dumps(check), encoding="utf-8")
        out_path = Path(tmp, "stdout.txt")
        err_path = Path(tmp, "stderr.txt")
        started = time.monotonic()
        # Output goes to files, not pipes: a helper process the check leaves behind (a
        # compile worker, say) would hold a pipe open and make a finished check look hung.
        with open(out_path, "wb") as out_fh, open(err_path, "wb") as err_fh:
            proc = forkserver.popen_module(
                "validate._worker",
                [str(spec_path), str(result_path), str(progress_path)],
                env=child,
                stdout=out_fh,
                stderr=err_fh,
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            kill_group(proc)  # the check's leftovers too, not only a hung check
            proc.wait()
        duration = time.monotonic() - started
        payload = read_result(result_path)
        progress = read_progress(progress_path)
        stdout = out_path.read_bytes().decode("utf-8", "replace")
        stderr = err_path.read_bytes().decode("utf-8", "replace")
    outcome = Outcome(proc.returncode, timed_out, payload, stderr + stdout[-2000:], progress)
    return make_record(check, outcome, duration, stderr)
