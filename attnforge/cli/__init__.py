"""The invoke tasks: argument handling and printing only; the work is in the attnforge library.

Every task is declared with `command`, which gives one short flag one meaning across all tasks
(invoke would otherwise pick letters per task: -e was --set in build and --engine in validate).
Numbers are taken as strings and checked here, so `--jobs abc` is a sentence, not a traceback
from invoke's parser.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from invoke import Task, task

from .. import hostinfo, multiarch
from ..console import out
from ..errors import UserError
from ..plan import default_stack
from ..recipes import Recipes

# The only short flags, the same in every task that has the option.
SHORT_FLAGS = {"arch": "a", "stack": "s", "jobs": "j", "output": "o"}


class _Task(Task):
    def arg_opts(self, name: str, default: Any, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            opts["names"] = [*opts["names"], SHORT_FLAGS[name]]
        return opts


def command(**kwargs: Any) -> Callable[[Callable[..., Any]], Task]:
    """`@invoke.task` with attnforge's flag rules."""
    return task(klass=_Task, auto_shortflags=False, **kwargs)


def whole_number(flag: str, value: Any, minimum: int = 1) -> int:
    """A user's number option, or a UserError that names the flag."""
    try:
        number = int(str(value).strip())
    except ValueError:
        raise UserError(f"{flag} {value!r}: expected a whole number") from None
    if number < minimum:
        raise UserError(f"{flag} {number}: must be at least {minimum}")
    return number


def choose_target(recipes: Recipes, arch: str | None, stack: str | None) -> tuple[str, str]:
    """(arch, stack) for a task: the given ones, else the host's default arch (saying why) and
    that arch's default stack."""
    if arch is None:
        arch, why = hostinfo.default_arch()
        out.print(f"[dim]--arch not given: {why}[/]")
    elif multiarch.is_set(arch):  # one image for several arches: an arch from here on
        arch = multiarch.register(recipes, arch)
    return arch, stack or default_stack(recipes, arch)
