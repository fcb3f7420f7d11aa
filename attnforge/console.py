"""Printing for people: plan tables, per-layer progress, summaries, and user errors."""

from __future__ import annotations

import functools
import sys
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from invoke.exceptions import Exit

from .errors import UserError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from .build import Outcome
    from .plan import Plan, StackOption, Step


class _OnFirstUse:
    """A rich Console made when first used: every invoke run imports this module (through
    tasks.py), and rich's import is 40-50 ms that --help and --list never need."""

    def __init__(self, **options: Any) -> None:
        self.__dict__["_options"] = options

    def __getattr__(self, name: str) -> Any:  # only for what the instance itself lacks
        console = self.__dict__.get("_console")
        if console is None:
            from rich.console import Console

            options = dict(self.__dict__["_options"])
            if options.pop("width_from_stdout", False):
                options["width"] = None if sys.stdout.isatty() else 150
            console = self.__dict__["_console"] = Console(**options)
        return getattr(console, name)


out: Console = _OnFirstUse(highlight=False, width_from_stdout=True)  # type: ignore[assignment]
err: Console = _OnFirstUse(stderr=True, highlight=False)  # type: ignore[assignment]

STATUS_STYLE = {
    "build": "yellow",
    "built": "green",
    "cached": "cyan",
    "pull": "magenta",
    "pulled": "magenta",
    "unsupported": "red",
    "blocked": "red",
    "failed": "bold red",
    "interrupted": "bold red",
    "skipped": "dim",
    "not run": "dim",
}


def say_error(exc: UserError, debug: bool = False) -> None:
    """A user's mistake as one red sentence (and its hint) on stderr; --debug adds the traceback."""
    from rich.markup import escape

    if debug:
        traceback.print_exc()
    err.print(f"[bold red]error:[/] {escape(exc.message)}", markup=True, soft_wrap=True)
    if exc.hint:
        err.print(f"[yellow]hint:[/] {escape(exc.hint)}", soft_wrap=True)


def user_errors(
    fn: Callable[..., Any] | None = None, *, resume: str | None = None
) -> Callable[..., Any]:
    """Turn UserError into a red sentence and exit status 2 (1 for failed work); --debug adds the
    traceback. `resume` says how to go on after Ctrl-C, for the tasks that can (build)."""
    if fn is None:
        return functools.partial(user_errors, resume=resume)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = kwargs.get("debug", False)
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            say_error(exc, debug)
            raise Exit(code=getattr(exc, "exit_code", 2)) from None
        except OSError as exc:
            if exc.filename is None:
                raise
            # The system refused a file the checks before the work could not foresee (a full
            # disk, /proc): one sentence; the write-aside helper left no partial file behind.
            say_error(UserError(f"{exc.filename}: {exc.strerror or exc}"), debug)
            raise Exit(code=1) from None
        except KeyboardInterrupt:
            err.print("[bold red]interrupted[/]" + (f"; {resume}" if resume else ""))
            raise Exit(code=130) from None

    return wrapper


def plan_table(plan: Plan, *, cache_known: bool) -> Table:
    from rich.table import Table

    table = Table(title=f"plan: stack {plan.stack} for {plan.arch}", title_justify="left")
    for col in ("#", "layer", "status", "tag", "why"):
        table.add_column(col, overflow="fold")
    for i, s in enumerate(plan.steps, 1):
        name = f"{s.layer}:{s.variant}" if s.variant else s.layer
        why = s.reason
        if s.changes:
            shown = "; ".join(s.changes[:3])
            more = len(s.changes) - 3
            why = shown + (f"; +{more} more (--explain {s.layer})" if more > 0 else "")
        if s.floating:
            why = (why + "; " if why else "") + "floating pin: " + "; ".join(s.floating)
        status = s.status if cache_known or s.status != "build" else "build?"
        style = STATUS_STYLE.get(s.status, "")
        table.add_row(str(i), name, f"[{style}]{status}[/]", s.hash_tag or "-", why or "")
    return table


def stacks_table(options: list[StackOption], arch: str, current: str) -> Table:
    """Every stack for the arch with its attention layers: what else `--stack` could build here."""
    from rich.table import Table

    table = Table(title=f"stacks for {arch} (--stack NAME)", title_justify="left")
    for col in ("stack", "builds", "attention", "why not"):
        table.add_column(col, overflow="fold")
    for o in options:
        if not o.builds and o.reason.startswith("for "):
            continue  # a stack for other hardware altogether: not worth a row
        name = f"{o.stack} (this plan)" if o.stack == current else o.stack
        mark = "[green]yes[/]" if o.builds else "[red]no[/]"
        table.add_row(name, mark, ", ".join(o.attention) or "-", o.reason)
    return table


def summary_table(outcomes: list[Outcome], total_s: float) -> Table:
    from rich.table import Table

    table = Table(title=f"build summary ({total_s:.1f}s)", title_justify="left")
    for col in ("layer", "result", "time", "tag / reason"):
        table.add_column(col, overflow="fold")
    for o in outcomes:
        style = STATUS_STYLE.get(o.status, "")
        table.add_row(
            o.layer,
            f"[{style}]{o.status}[/]",
            f"{o.seconds:.0f}s" if o.seconds else "",
            o.tag or o.detail,
        )
    return table


class LayerProgress:
    """Per-layer progress: a live line on a terminal, start/end lines in CI logs."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.index = 0
        self.status = None
        self.started = 0.0
        self.last_beat = 0.0
        self.tty = out.is_terminal

    def __call__(self, event: str, step: Step, detail: str) -> None:
        name = f"{step.layer}:{step.variant}" if step.variant else step.layer
        if event == "cached":
            self.index += 1
            out.print(f"[{self.index}/{self.total}] [cyan]cached[/] {name}  {detail}")
        elif event == "start":
            self.index += 1
            self.started = self.last_beat = time.monotonic()
            out.print(f"[{self.index}/{self.total}] [yellow]building[/] {name}  (log: {detail})")
            if self.tty:
                self.status = out.status(f"{name}: starting")
                self.status.start()
        elif event == "line":
            elapsed = time.monotonic() - self.started
            if self.status is not None:
                self.status.update(f"{name} {elapsed:5.0f}s  {detail[-100:]}")
            elif time.monotonic() - self.last_beat > 30:  # a heartbeat for non-terminal logs
                self.last_beat = time.monotonic()
                out.print(f"    … {name} {elapsed:.0f}s: {detail[-100:]}", markup=False)
        elif event == "pull":
            self.index += 1
            self.started = time.monotonic()
            out.print(f"[{self.index}/{self.total}] [magenta]pulling[/] {name}  from {detail}")
        elif event == "pulled":
            out.print(f"    [magenta]pulled[/] {name} in {detail}")
        elif event == "smoke":
            self._stop()
            out.print(f"    smoke {detail}", markup=False)
        elif event == "built":
            self._stop()
            out.print(f"    [green]built[/] {name} in {detail}")

    def _stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def close(self) -> None:
        self._stop()


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


class KernelProgress:
    """`invoke kernels.aot`'s progress: a live line on a terminal (arch, head dim, kernel, count),
    a line per arch when it is done; on a log, a line per kernel. On stderr: stdout is the table
    or the JSON."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.arch = total, 0, ""
        self.compiled = self.cached = 0
        self.started = self.arch_started = time.monotonic()
        self.status = None
        if err.is_terminal:
            self.status = err.status(f"compiling {total} kernels")
            self.status.start()

    def __call__(self, arch: str, head_dim: int, kernel: str, seconds: float | None) -> None:
        if arch != self.arch:
            self._arch_done()
            self.arch, self.arch_started = arch, time.monotonic()
        self.done += 1
        if seconds is None:
            self.cached += 1
        else:
            self.compiled += 1
        took = "cached" if seconds is None else f"{seconds:.1f}s"
        line = f"[{self.done}/{self.total}] {arch} d={head_dim} {kernel} {took}"
        if self.status is not None:
            self.status.update(line)
        else:
            err.print(line, markup=False, highlight=False)

    def _arch_done(self) -> None:
        if self.arch and self.status is not None:
            spent = time.monotonic() - self.arch_started
            err.print(f"{self.arch}: done in {spent:.0f}s ({self.done}/{self.total})")

    def close(self) -> None:
        self._arch_done()
        if self.status is not None:
            self.status.stop()
            self.status = None
