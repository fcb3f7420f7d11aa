"""Run one check in its own subprocess and turn how it ended into a status.

Standard library only: the parent process never imports torch, so nothing a check does
(a segfault, an abort, an illegal memory access, a hang) can take the run down.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("pass", "fail", "skip", "crash", "timeout")
FAILING = ("fail", "crash", "timeout")  # what a required check must not end as
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


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the check's process group (it leads its own session); gone already is fine."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if proc.poll() is None:
            proc.kill()


def run_isolated(
    check: dict[str, Any],
    timeout: float,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``check`` (a JSON-able spec) via ``python -m validate._worker``; return its record."""
    package_parent = str(Path(__file__).resolve().parent.parent)
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_parent, child_env.get("PYTHONPATH", "")) if p
    )
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory(prefix="validate-") as tmp:
        spec_path = Path(tmp, "spec.json")
        result_path = Path(tmp, "result.json")
        progress_path = Path(tmp, "progress.txt")
        spec_path.write_text(json.dumps(check), encoding="utf-8")
        cmd = [
            sys.executable,
            "-m",
            "validate._worker",
            str(spec_path),
            str(result_path),
            str(progress_path),
        ]
        out_path = Path(tmp, "stdout.txt")
        err_path = Path(tmp, "stderr.txt")
        started = time.monotonic()
        # Output goes to files, not pipes: a helper process the check leaves behind (a
        # compile worker, say) would hold a pipe open and make a finished check look hung.
        with open(out_path, "wb") as out_fh, open(err_path, "wb") as err_fh:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out_fh,
                stderr=err_fh,
                env=child_env,
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(proc)  # the check's leftovers too, not only a hung check
            proc.wait()
        duration = time.monotonic() - started
        payload = None
        if result_path.exists():
            try:
                payload = json.loads(result_path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, OSError):
                payload = None
        progress = []
        if progress_path.exists():
            progress = [
                ln for ln in progress_path.read_text(encoding="utf-8").splitlines() if ln.strip()
            ]
        out = out_path.read_bytes()
        err = err_path.read_bytes()
    stderr = err.decode("utf-8", "replace")
    stdout = out.decode("utf-8", "replace")
    outcome = Outcome(proc.returncode, timed_out, payload, stderr + stdout[-2000:], progress)
    status, message = classify(outcome)
    record: dict[str, Any] = {
        "id": check["id"],
        "group": check.get("group", check["id"].split(".")[0]),
        "title": check.get("title", check["id"]),
        "required": bool(check.get("required", True)),
        "status": status,
        "message": message,
        "duration_s": round(duration, 3),
        "returncode": None if timed_out else proc.returncode,
        "signal": signal_name(-proc.returncode)
        if (proc.returncode or 0) < 0 and not timed_out
        else None,
        "progress": progress[-5:],
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
