"""Long-lived check workers: import torch once, run many checks, keep the isolation promise.

Standard library only, like the rest of the parent side. A worker is
``python -m validate._worker --serve`` in a session of its own; it gets one check at a time over
a pipe and answers when the check's result file is written. The parent enforces each check's
own timeout. When a worker dies (a signal, an exit without a result) or overruns, its whole
process group is killed, only the check it was running is marked (``crash``/``timeout``), and
the next check gets a fresh worker. A worker whose check crashed or reported a device fault is
retired too: a poisoned CUDA/HIP context must not reach the next check.

Which checks share a worker is the spec's business (suite.py): ``worker`` names a key, and
consecutive checks with the same key share one; ``isolate`` gives a check a worker of its own,
retired after it. A spare worker is started ahead of need, so a fresh worker has usually
already imported torch when a check asks for one; ``start_early`` starts the worker of a later
sharing key at once, with warm-up steps (its checks' imports: transformers, diffusers, Triton),
so that those run while the checks before them use the device.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from validate import forkserver
from validate.runner import (
    Outcome,
    child_env,
    is_device_fault,
    make_record,
    read_progress,
    read_result,
)

STARTUP_STAGE = "worker start (VALIDATE_PRELUDE, import torch)"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


class Worker:
    """One ``validate._worker --serve`` process, its pipes and its output files."""

    def __init__(self, env: dict[str, str], spool: Path, name: str):
        self.name = name
        self.key: str | None = None  # the sharing key of the checks it ran
        self.batch: str | None = None
        self.served = 0
        self.ready = False
        self.out_path = spool / f"{name}.out"
        self.err_path = spool / f"{name}.err"
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        # Output goes to files, not pipes: a helper process a check leaves behind (a compile
        # worker, say) would hold a pipe open; the files also let each check's slice be read.
        with open(self.out_path, "wb") as out_fh, open(self.err_path, "wb") as err_fh:
            self.proc = forkserver.popen_module(
                "validate._worker",
                ["--serve", str(req_r), str(rep_w)],
                env=env,
                stdout=out_fh,
                stderr=err_fh,
                pass_fds=(req_r, rep_w),
            )
        os.close(req_r)
        os.close(rep_w)
        self._requests = os.fdopen(req_w, "w", encoding="utf-8", buffering=1)
        self._replies = rep_r
        self._buffer = b""
        self._eof = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, message: dict[str, Any]) -> bool:
        """Hand the worker one request; False when it is gone."""
        try:
            self._requests.write(json.dumps(message) + "\n")
            self._requests.flush()
        except (BrokenPipeError, OSError, ValueError):
            return False
        return True

    def _read_lines(self, wait: float) -> list[str]:
        if self._eof:
            time.sleep(min(wait, 0.05))
            return []
        ready, _, _ = select.select([self._replies], [], [], wait)
        if not ready:
            return []
        chunk = os.read(self._replies, 65536)
        if not chunk:
            self._eof = True
            return []
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        return [ln.decode("utf-8", "replace").strip() for ln in lines]

    def wait_done(self, seq: int, deadline: float) -> str:
        """Wait for ``done SEQ``: 'done', 'died' (the process ended without it) or 'timeout'."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            for line in self._read_lines(min(remaining, 0.2)):
                if line == "ready":
                    self.ready = True
                elif line == f"done {seq}":
                    return "done"
            if self.proc.poll() is not None:
                # It is gone: read what it wrote before it went, then decide.
                for line in self._read_lines(0):
                    if line == f"done {seq}":
                        return "done"
                return "died"

    def kill(self) -> None:
        """SIGKILL the worker's process group (the checks' leftovers too); gone already is fine."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if self.proc.poll() is None:
                self.proc.kill()
        self.proc.wait()
        for close in (self._requests.close, lambda: os.close(self._replies)):
            try:
                close()
            except OSError:
                pass


class Pool:
    """Runs checks in long-lived workers; ``pool.run`` has the signature of ``run_isolated``.

    Thread-safe: suite.execute may call ``run`` from up to ``workers`` threads at once. At most
    ``workers`` workers stay alive between checks (plus the spare and isolated ones), so on one
    GPU the default of 1 never runs two checks at the same time.
    """

    def __init__(self, workers: int = 1, env: dict[str, str] | None = None, spare: bool = True):
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.workers = workers
        self.env = child_env(env)
        self.spool = Path(tempfile.mkdtemp(prefix="validate-pool-"))
        self._spare_wanted = spare
        self._lock = threading.Lock()
        self._idle: list[Worker] = []  # live workers between checks, most recently used last
        self._spares: list[Worker] = []
        self._early: dict[str, Worker] = {}  # started ahead for a later sharing key
        self._busy: set[Worker] = set()
        self._names = itertools.count(1)
        self._seqs = itertools.count(1)
        self._closed = False
        self.started = 0  # workers started, for tests and the benchmark

    # -- workers ---------------------------------------------------------------------------

    def _start(self) -> Worker:
        self.started += 1
        return Worker(self.env, self.spool, f"worker-{next(self._names)}")

    def _fresh(self) -> Worker:
        """A new worker: the spare if there is one (it has imported torch by now, usually).

        A spare that died while starting is handed out all the same: the check it gets reports
        how it died, as that check would have in a process of its own."""
        worker = self._spares.pop(0) if self._spares else self._start()
        if self._spare_wanted and not self._spares:
            self._spares.append(self._start())
        return worker

    def start_early(self, key: str, steps: list[dict[str, Any]]) -> None:
        """Start the worker for sharing key ``key`` now and have it run ``steps`` (warm-up
        targets, validate/_worker.py ``warm_up``) while earlier checks run; the first check
        with that key gets it. It runs no check before then, so with one worker still only
        one check runs at a time. Not counted against ``workers`` until it is taken."""
        with self._lock:
            if self._closed or key in self._early:
                return
            worker = self._start()
            worker.key = key
            worker.send({"warm_up": steps})
            self._early[key] = worker

    def _take(self, key: str | None, batch: str | None) -> Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool is closed")
            if key is not None:
                same = [w for w in self._idle if w.key == key and w.alive()]
                if same:
                    pick = next((w for w in same if w.batch == batch), same[-1])
                    self._idle.remove(pick)
                    self._busy.add(pick)
                    return pick
                # The new worker takes the place of the least recently used idle one.
                keyed_busy = sum(1 for w in self._busy if w.key is not None)
                while self._idle and len(self._idle) + keyed_busy >= self.workers:
                    self._idle.pop(0).kill()
                early = self._early.pop(key, None)
                if early is not None:
                    # Handed out even when it died warming up: its check reports how.
                    self._busy.add(early)
                    return early
            worker = self._fresh()
            worker.key = key
            self._busy.add(worker)
            return worker

    def _give_back(self, worker: Worker, keep: bool) -> None:
        with self._lock:
            self._busy.discard(worker)
            if keep and not self._closed and worker.alive():
                self._idle.append(worker)
                return
        worker.kill()

    def close(self) -> None:
        """Kill every worker (and what their checks left behind); remove the spool folder."""
        with self._lock:
            self._closed = True
            everyone = self._idle + self._spares + list(self._early.values()) + list(self._busy)
            self._idle, self._spares, self._early = [], [], {}
        for worker in everyone:
            worker.kill()
        shutil.rmtree(self.spool, ignore_errors=True)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one check -------------------------------------------------------------------------

    def run(self, check: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Run ``check`` in a worker; return its record (the fields run_isolated gives)."""
        isolate = bool(check.get("isolate"))
        key = None if isolate else str(check.get("worker") or check.get("group") or "")
        worker = self._take(key, check.get("batch"))
        keep = False
        try:
            record, keep = self._run_on(worker, check, timeout)
        finally:
            self._give_back(worker, keep and not isolate)
        return record

    def _run_on(
        self, worker: Worker, check: dict[str, Any], timeout: float
    ) -> tuple[dict[str, Any], bool]:
        seq = next(self._seqs)
        result_path = self.spool / f"check-{seq}.result.json"
        progress_path = self.spool / f"check-{seq}.progress.txt"
        # A worker's first check owns its start-up output too (as in a process of its own).
        first = worker.served == 0
        err_from = 0 if first else _size(worker.err_path)
        out_from = 0 if first else _size(worker.out_path)
        worker.served += 1
        worker.batch = check.get("batch")
        started = time.monotonic()
        request = {
            "seq": seq,
            "spec": check,
            "result": str(result_path),
            "progress": str(progress_path),
        }
        state = worker.wait_done(seq, started + timeout) if worker.send(request) else "died"
        duration = time.monotonic() - started
        if state != "done":
            worker.kill()
        timed_out = state == "timeout"
        returncode = 0 if state == "done" else worker.proc.returncode
        payload = read_result(result_path)
        progress = read_progress(progress_path)
        if not progress and not worker.ready and state != "done":
            progress = [STARTUP_STAGE]
        stderr = _read_from(worker.err_path, err_from)
        stdout = _read_from(worker.out_path, out_from)
        outcome = Outcome(returncode, timed_out, payload, stderr + stdout[-2000:], progress)
        record = make_record(check, outcome, duration, stderr)
        for path in (result_path, progress_path):
            path.unlink(missing_ok=True)
        keep = (
            state == "done"
            and record["status"] != "crash"
            and not is_device_fault(record["message"])
            and worker.alive()
        )
        return record, keep
