"""Check processes forked from one that has imported torch already: each starts in milliseconds.

Standard library only, like the rest of the parent side. Every check process (a pool worker, a
bench or stress item runner, a ``--isolate`` check) used to be ``python -m MODULE`` of its own and
paid torch's import, about a CPU-second here and more on a cold ROCm install, before its first
line ran; a run of the suite starts a dozen or more of them. Now the parent starts one fork
server per child environment, ``python -m validate._forkserver``, which imports torch and waits
(it never initialises a device, so forking it is safe on CUDA and ROCm), and each check process
is forked from it. The isolation promise is unchanged: every child is a process of its own in a
session of its own, with the output files and pipes its caller gave, and its exit status (a
signal as ``-N``) comes back as ``subprocess.Popen``'s would. The server watches the parent as
the children do, and the children watch the server, so no check outlives the run.

The children come from ``popen_module``, which falls back to a plain ``subprocess.Popen`` (the
process of its own of before) when the server cannot serve: no ``fork`` or fd passing here,
``VALIDATE_FORKSERVER=0`` in the child environment, a ``VALIDATE_PRELUDE`` (which runs before
torch's import in a worker of its own, so it keeps one), or a server that died or did not get
through torch's import within ``READY_S``. A torch that crashes on import therefore still crashes
each check's own process, and each check reports it as before.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any

DISABLE_ENV = "VALIDATE_FORKSERVER"  # "0": every check process starts from scratch
PRELUDE_ENV = "VALIDATE_PRELUDE"  # validate/_worker.py runs it before torch's import
READY_S = 300.0  # torch's import on a cold ROCm install can take a minute; a hang is not served
MESSAGE_MAX = 1 << 16


def usable(env: dict[str, str]) -> bool:
    """Whether children with environment ``env`` may come from a fork server."""
    return (
        os.name == "posix"
        and hasattr(socket, "send_fds")
        and hasattr(os, "fork")
        and env.get(DISABLE_ENV, "1") != "0"
        and not env.get(PRELUDE_ENV)
    )


class ForkedProcess:
    """A child of the fork server, with the part of ``subprocess.Popen`` the callers use."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]):
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._server = server

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._server.wait_for_exit(min(left, 0.5) if left is not None else 0.5)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkServer:
    """One ``validate._forkserver`` process and the children it forked for this process."""

    def __init__(self, env: dict[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "validate._forkserver", str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                # torch's import warnings, once; each check's own output goes to its own files
                stderr=None,
                env=env,
                start_new_session=True,
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        self._sock = ours
        self._cond = threading.Condition()
        self._send = threading.Lock()
        self._ids = itertools.count(1)
        self._replies: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, int] = {}
        self._ready = False
        self.dead = False
        threading.Thread(target=self._read, name="forkserver-replies", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(MESSAGE_MAX)
            except OSError:
                data = b""
            with self._cond:
                if not data:
                    self.dead = True
                    self._cond.notify_all()
                    return
                message = json.loads(data)
                if message.get("ready"):
                    self._ready = True
                elif "exit" in message:
                    self._exits[message["exit"]] = message["rc"]
                elif "id" in message:
                    self._replies[message["id"]] = message
                self._cond.notify_all()

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + READY_S
        with self._cond:
            while not self._ready and not self.dead:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if not self._ready and not self.dead:
                self.close()  # stuck in torch's import: the checks' own processes will show how
            return self._ready and not self.dead

    def spawn(
        self, module: str, args: list[str], fds: list[int], targets: list[int]
    ) -> ForkedProcess | None:
        """Fork ``python -m module args`` with ``fds`` as its ``targets`` (0, 1, 2 and the fds
        it is passed); None when this server cannot (the caller starts a process instead)."""
        if not self._wait_ready():
            return None
        ident = next(self._ids)
        request = json.dumps({"id": ident, "module": module, "args": args, "targets": targets})
        try:
            with self._send:
                socket.send_fds(self._sock, [request.encode()], fds)
        except OSError:
            return None
        with self._cond:
            while ident not in self._replies and not self.dead:
                self._cond.wait()
            reply = self._replies.pop(ident, None)
        if not reply or "pid" not in reply:
            return None
        return ForkedProcess(self, int(reply["pid"]), [module, *args])

    def exit_status(self, pid: int) -> int | None:
        """The child's exit status once the server reaped it; None while it runs."""
        with self._cond:
            if pid in self._exits:
                return self._exits[pid]
            if not self.dead:
                return None
        # The server is gone, so nobody reports this child: it ends itself when it sees that
        # (runner.watch_parent) and is reaped by whoever adopted it (this process, as PID 1 of
        # a container). Killed is what that looks like.
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped == pid:
                return os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return -signal.SIGKILL
        return None

    def wait_for_exit(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait(timeout)

    def close(self) -> None:
        """Kill the server (children it forked see it go and end themselves)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        with self._cond:
            self.dead = True
            self._cond.notify_all()
        try:
            self._sock.close()
        except OSError:
            pass


_servers: dict[tuple[tuple[str, str], ...], ForkServer] = {}
_servers_lock = threading.Lock()


def _server_for(env: dict[str, str]) -> ForkServer | None:
    if not usable(env):
        return None
    key = tuple(sorted(env.items()))
    with _servers_lock:
        server = _servers.get(key)
        if server is None:
            server = _servers[key] = ForkServer(env)
    # A server that died stays in the table: the next child starts as a process of its own
    # rather than paying for a server that may crash the same way.
    return None if server.dead else server


def _fileno(stream: int | IO[Any] | None, default: int) -> int:
    if stream is None:
        return default
    return stream if isinstance(stream, int) else stream.fileno()


def popen_module(
    module: str,
    args: list[str],
    *,
    env: dict[str, str],
    stdout: IO[Any] | int,
    stderr: IO[Any] | int,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen | ForkedProcess:
    """``python -m module args`` in a session of its own with stdin from /dev/null: forked from
    the fork server of ``env`` where there is one, started as a new process otherwise.
    ``stderr=subprocess.STDOUT`` sends it to ``stdout``'s file."""
    server = _server_for(env)
    if server is not None:
        with open(os.devnull, "rb") as devnull:
            out = _fileno(stdout, 1)
            err = out if stderr == subprocess.STDOUT else _fileno(stderr, 2)
            proc = server.spawn(
                module, args, [devnull.fileno(), out, err, *pass_fds], [0, 1, 2, *pass_fds]
            )
        if proc is not None:
            return proc
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        env=env,
        start_new_session=True,
        pass_fds=pass_fds,
    )


@atexit.register
def close_all() -> None:
    """Kill every fork server this process started (at exit; tests call it too)."""
    with _servers_lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        if not server.dead:
            server.close()
