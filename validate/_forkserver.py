"""The fork server (validate/forkserver.py starts it): import torch, then fork check processes.

``python -m validate._forkserver FD``: FD is a SOCK_SEQPACKET socket to the parent. The server
imports torch (nothing else: no device is touched, so a fork is safe), says ``{"ready": true}``,
then for each request ``{"id", "module", "args", "targets"}`` with its fds attached forks a child
that leads a session of its own, puts those fds on ``targets`` (0, 1, 2, then the fds the caller
passes on), names itself after the module (``ps -o comm``: ``_worker``, ``_stress_child``) and
runs ``python -m module args`` as ``__main__``; the server answers
``{"id", "pid"}`` and, when the child ends, ``{"exit": pid, "rc": status}`` (``-N`` for a
signal, as ``subprocess.Popen`` says it). It ends when the parent closes the socket or dies.
"""

from __future__ import annotations

import json
import os
import runpy
import select
import socket
import sys
import traceback
import warnings

from validate.runner import PARENT_ENV, watch_parent

REAP_S = 0.05  # how often the server reaps children between requests
FD_FLOOR = 256  # received fds are moved above the targets before they are put in place


def _name(name: str) -> None:
    """Show the module in ps and top (its process name; the command line stays the server's)."""
    try:
        with open("/proc/self/comm", "w", encoding="ascii", errors="replace") as comm:
            comm.write(name[:15])
    except OSError:
        pass


def _child(sock: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: become ``python -m module args``; never returns."""
    code = 1
    try:
        os.setsid()
        sock.close()
        _name(request["module"].rsplit(".", 1)[-1])
        high = [os.dup2(fd, FD_FLOOR + i) for i, fd in enumerate(fds)]
        for fd in fds:
            if fd not in high:
                os.close(fd)
        for fd, target in zip(high, request["targets"], strict=True):
            os.dup2(fd, target)
        for fd in high:
            if fd not in request["targets"]:
                os.close(fd)
        # The child watches the server, its parent now (the server watches the run's parent).
        os.environ[PARENT_ENV] = str(os.getppid())
        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends `python -m`
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - a closed stream: nothing to flush
                pass
        os._exit(code)


def _send(sock: socket.socket, message: dict) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        os._exit(0)  # the parent is gone; its children see this process go and end themselves


def serve(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    os.set_inheritable(fd, False)
    watch_parent()
    # Python 3.12 warns at every fork of a process with more than one thread: here the parent
    # watch above (a sleep loop that holds no lock) and whatever torch's import started; the
    # server runs no torch op and holds no lock when it forks, which is what the warning is about.
    warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
    try:
        import torch  # noqa: F401 - the point of the server
    except Exception:  # noqa: BLE001, S110 - each check imports it again and reports the error
        pass
    _send(sock, {"ready": True})
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([sock], [], [], REAP_S)
        if ready:
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 16)
            except OSError:
                data, fds = b"", []
            if not data:
                os._exit(0)
            request = json.loads(data)
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            try:
                pid = os.fork()
            except OSError as exc:
                pid = -1
                _send(sock, {"id": request["id"], "error": str(exc)})
            if pid == 0:
                _child(sock, request, fds)
            for received in fds:
                os.close(received)
            if pid > 0:
                children.add(pid)
                _send(sock, {"id": request["id"], "pid": pid})
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            _send(sock, {"exit": pid, "rc": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    serve(int(sys.argv[1]))
