"""A validate run that is killed (timeout, a cancelled CI job, `docker stop`) leaves no check,
worker or stress process behind holding the GPU: each watches its parent and ends its group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.add(int(entry.name))
    return found


def _descendants(pid: int) -> set[int]:
    """Children, and theirs: a check process forked from the run's fork server is its grandchild."""
    found, todo = set(), [pid]
    while todo:
        kids = _children(todo.pop())
        todo.extend(kids - found)
        found |= kids
    return found


def _names(pid: int) -> str:
    """The command line and the process name: a forked check process names its module in the
    latter (validate/_forkserver.py), its command line is the server's."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        comm = ""
    return f"{_cmdline(pid)} [{comm}]"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for(pred, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VALIDATE_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def _kill_parent_and_check(proc: subprocess.Popen, kids: set[int]) -> None:
    assert kids, "the run started no child process"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _wait_for(lambda: not any(_alive(k) for k in kids), 10), (
        f"still running after the validate process was killed: {[k for k in kids if _alive(k)]}"
    )


@pytest.mark.slow
def test_a_killed_run_takes_its_hanging_check_worker_with_it(tmp_path):
    marker = tmp_path / "started"
    checks = tmp_path / "hang_checks.py"
    checks.write_text(
        textwrap.dedent(f"""
        import time
        CHECKS = [{{"id": "fault.hang_here", "func": "hang", "position": "first"}}]
        def hang(params, ctx):
            open({str(marker)!r}, "w").close()
            while True:
                time.sleep(60)
    """)
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "validate", "env", "--only", "fault.hang_here", "--timeout", "600"],
        cwd=tmp_path, env=_env(VALIDATE_EXTRA_CHECKS=str(checks)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert _wait_for(marker.exists, 120), "the hanging check never started"
        kids = _descendants(proc.pid)
        assert any("[_worker]" in _names(k) or "validate._worker" in _names(k) for k in kids)
        _kill_parent_and_check(proc, kids)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_a_killed_stress_run_takes_its_backend_process_with_it(tmp_path):
    progress_seen = tmp_path / "unused"
    proc = subprocess.Popen(
        [sys.executable, "-m", "validate", "stress", "--workload", "sd15", "--tiny",
         "--backend", "sdpa.math", "--iters", "1000", "--timeout", "600",
         "--json", str(tmp_path / "stress.json")],
        cwd=tmp_path, env=_env(VALIDATE_STRESS_FAULT="hang@1"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # The backend's process, not the environment probe that runs (and ends) before it, nor a
        # child caught between fork and exec (its command line is still the parent's).
        def backend() -> set[int]:
            return {
                k
                for k in _descendants(proc.pid)
                if ("validate._stress_child" in (cmd := _names(k)) or "[_stress_child]" in cmd)
                and "--env" not in cmd
            }

        assert _wait_for(lambda: bool(backend()), 120), "no backend process started"
        _kill_parent_and_check(proc, backend())
        assert not progress_seen.exists()
        assert not (tmp_path / "stress.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
