"""The fork server: check processes forked from a process that imported torch, with what a
process of its own gave them (argv, output files, passed fds, a session, the exit status and
signal a Popen reports), the chain of parent watches, and the fallback to a process of its own.

Real processes throughout: a probe module in a temporary package is run as ``python -m``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from validate import forkserver
from validate.runner import child_env

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, os, signal, sys, time
what = sys.argv[1]
if what == "report":
    json.dump({"argv": sys.argv, "torch_loaded_at_start": TORCH_AT_START, "pid": os.getpid(),
               "sid": os.getsid(0), "ppid": os.getppid(), "name": __name__,
               "parent_env": os.environ.get("VALIDATE_PARENT_PID")}, sys.stdout)
    print("to stderr", file=sys.stderr)
elif what == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
elif what == "exit":
    sys.exit(int(sys.argv[2]))
elif what == "raise":
    raise RuntimeError("planted")
elif what == "fd":
    os.write(int(sys.argv[2]), b"through the passed fd")
elif what == "hang":
    from validate.runner import watch_parent
    watch_parent(0.1)
    print(os.getpid(), flush=True)
    time.sleep(600)
"""


@pytest.fixture
def probe_env(tmp_path):
    pkg = tmp_path / "probepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "probe.py").write_text(
        "import sys\nTORCH_AT_START = 'torch' in sys.modules\n" + textwrap.dedent(PROBE)
    )
    env = child_env({k: v for k, v in os.environ.items() if k != "VALIDATE_PRELUDE"})
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    env.pop(forkserver.DISABLE_ENV, None)
    yield env
    forkserver.close_all()


def run_probe(tmp_path: Path, env: dict, *args: str, timeout: float = 120):
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "wb") as out_fh, open(err, "wb") as err_fh:
        proc = forkserver.popen_module(
            "probepkg.probe", list(args), env=env, stdout=out_fh, stderr=err_fh
        )
    rc = proc.wait(timeout=timeout)
    return proc, rc, out.read_text(), err.read_text()


@pytest.mark.slow
def test_a_forked_check_process_gets_what_a_process_of_its_own_did(tmp_path, probe_env):
    proc, rc, out, err = run_probe(tmp_path, probe_env, "report", "x y")
    assert isinstance(proc, forkserver.ForkedProcess)
    seen = json.loads(out)
    assert rc == 0 and err == "to stderr\n"
    assert seen["torch_loaded_at_start"] is True  # the import was paid once, by the server
    assert seen["argv"][1:] == ["report", "x y"] and seen["name"] == "__main__"
    assert seen["sid"] == seen["pid"] == proc.pid  # a session of its own, as before
    assert seen["parent_env"] == str(seen["ppid"])  # it watches the server, its parent

    # exit statuses and signals read as subprocess.Popen reports them
    assert run_probe(tmp_path, probe_env, "exit", "3")[1] == 3
    assert run_probe(tmp_path, probe_env, "segv")[1] == -signal.SIGSEGV
    _, rc, _, err = run_probe(tmp_path, probe_env, "raise")
    assert rc == 1 and "RuntimeError: planted" in err

    read, write = os.pipe()
    with open(tmp_path / "o", "wb") as fh:
        proc = forkserver.popen_module(
            "probepkg.probe", ["fd", str(write)], env=probe_env, stdout=fh, stderr=fh,
            pass_fds=(write,),
        )  # fmt: skip
    os.close(write)
    assert proc.wait(timeout=60) == 0
    assert os.read(read, 100) == b"through the passed fd"
    os.close(read)


@pytest.mark.slow
def test_a_killed_group_and_a_dead_parent_leave_nothing_running(tmp_path, probe_env):
    out = tmp_path / "hang.txt"
    with open(out, "wb") as fh:
        proc = forkserver.popen_module("probepkg.probe", ["hang"], env=probe_env, stdout=fh,
                                       stderr=fh)  # fmt: skip
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # what the callers' _kill_group does
    assert proc.wait(timeout=30) == -signal.SIGKILL

    # A parent SIGKILLed mid-run: its server ends, and the server's child after it.
    script = (
        "import sys, time\n"
        "from validate import forkserver\n"
        f"env = {probe_env!r}\n"
        "env['VALIDATE_PARENT_PID'] = str(__import__('os').getpid())\n"
        f"fh = open({str(out)!r}, 'wb')\n"
        "proc = forkserver.popen_module('probepkg.probe', ['hang'], env=env, stdout=fh, stderr=fh)\n"
        "server = next(iter(forkserver._servers.values())).proc.pid\n"
        "print(server, proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                              text=True, env=probe_env)  # fmt: skip
    server, child = map(int, parent.stdout.readline().split())
    deadline = time.monotonic() + 60
    while not out.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.1)
    parent.kill()
    parent.wait()
    gone = {server: False, child: False}
    while not all(gone.values()) and time.monotonic() < deadline:
        for pid in gone:
            gone[pid] = not _alive(pid)
        time.sleep(0.1)
    assert all(gone.values()), f"still running after the parent died: {gone}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_without_a_usable_server_each_child_is_a_process_of_its_own(tmp_path, probe_env):
    off = {**probe_env, forkserver.DISABLE_ENV: "0"}
    proc, rc, out, _ = run_probe(tmp_path, off, "report")
    assert isinstance(proc, subprocess.Popen) and rc == 0
    assert json.loads(out)["torch_loaded_at_start"] is False

    with_prelude = {**probe_env, forkserver.PRELUDE_ENV: str(tmp_path / "prelude.py")}
    assert not forkserver.usable(with_prelude)  # a prelude runs before torch's import

    # A server that died (killed here; a torch that crashes on import alike) serves nobody:
    # the next child starts as a process of its own and still runs.
    first = run_probe(tmp_path, probe_env, "report")[0]
    assert isinstance(first, forkserver.ForkedProcess)
    server = next(iter(forkserver._servers.values()))
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    deadline = time.monotonic() + 30
    while not server.dead and time.monotonic() < deadline:
        time.sleep(0.05)
    proc, rc, out, _ = run_probe(tmp_path, probe_env, "report")
    assert isinstance(proc, subprocess.Popen) and rc == 0, out
