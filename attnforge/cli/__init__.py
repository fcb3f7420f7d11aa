"""The invoke tasks: argument handling and printing only; the work is in the attnforge library.

Every task is declared with `command`, which gives one short flag one meaning across all tasks
(invoke would otherwise pick letters per task: -e was --set in build and --engine in validate)
and one way to declare and check options: each option that takes a value names an `Opt` (its
placeholder in --help, how its value is checked), and every value is checked before the task
runs, so `--jobs abc`, an empty `--set`, an unknown `--arch` or an `--output` in a folder that
cannot be written is one sentence naming the option, never a traceback or half-done work.

What invoke does not offer, and this module adds to its parser (docs/cli.md):
- placeholders: `--arch=ARCH` in --help instead of invoke's `--arch=STRING`;
- `--help` after a task with positional arguments (`invoke patches.apply --help`), which invoke
  would take as the first argument's value;
- optional and repeated positional arguments (`invoke report [FILE]`, `invoke matrix FILE...`):
  invoke's positionals are all required and single;
- a repeatable option given without a value (`--set` at the end of the line) is an error,
  where invoke would quietly take no value and run the task.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke import Task, task
from invoke import collection as invoke_collection
from invoke.exceptions import Exit
from invoke.parser import Argument, ParserContext

from ..console import out, user_errors
from ..errors import UserError, unknown

if TYPE_CHECKING:
    from ..recipes import Recipes

# The library (recipes and pydantic, plans, engines, rich) is imported inside the checks and
# tasks that use it: invoke imports every task module on each run, so what this package and the
# task modules import at their top is paid by `invoke --list` and every task alike.

# The only short flags, the same in every task that has the option.
SHORT_FLAGS = {"arch": "a", "stack": "s", "jobs": "j", "output": "o"}


@dataclass(frozen=True)
class Opt:
    """How one option's value is shown (`metavar`) and checked: `check(flag, value)` returns the
    value the task gets, or raises a UserError that names the flag."""

    metavar: str
    check: Callable[[str, Any], Any] = field(default=lambda flag, value: value)
    repeatable: bool = False  # given several times (or as a comma list, where the task says so)
    positional: bool = False  # also taken without its flag: `invoke report FILE`
    required: bool = False  # checked by the task wrapper, after --help had its chance
    needs: str = ""  # a required option's refusal when it is missing (default: it names it)
    choices: tuple[str, ...] = ()  # a choice's valid values
    kind: str = "text"  # what sort of value: text, number, choice, arch, stack, out_file ...


def whole_number(flag: str, value: Any, minimum: int = 1) -> int:
    """A user's number option, or a UserError that names the flag."""
    try:
        number = int(str(value).strip())
    except ValueError:
        raise UserError(f"{flag} {value!r}: expected a whole number") from None
    if number < minimum:
        raise UserError(f"{flag} {number}: must be at least {minimum}")
    return number


def nonempty(flag: str, value: Any) -> str:
    """A value that is not empty, or a UserError naming the flag."""
    if not str(value).strip():
        raise UserError(f"{flag}: given an empty value")
    return str(value)


# The recipes the option checks of one task read: --arch, --stack and each arch of a list would
# load them once each (about 60 ms a load); one load serves a task's checks and is dropped when
# they end, so the task itself reads the recipes afresh.
_checked_recipes: dict[Path, Recipes] | None = None


def _recipes() -> Recipes:
    from ..recipes import load_recipes
    from ..workspace import Workspace

    root = Workspace.discover().root
    if _checked_recipes is None:
        return load_recipes(root)
    if root not in _checked_recipes:
        _checked_recipes[root] = load_recipes(root)
    return _checked_recipes[root]


def _arch(flag: str, value: Any) -> str:
    from .. import multiarch

    value = nonempty(flag, value)
    arches = _recipes().arches
    if multiarch.is_set(value) and value not in arches:
        try:  # one image for several arches: each member must exist
            multiarch.members_of(_recipes(), value)
        except UserError as exc:
            raise _named(flag, exc) from None
        return value
    if value not in arches:
        raise _named(flag, unknown("arch", value, arches))
    return value


def _arch_list(flag: str, value: Any) -> str:
    """A comma list of arches (kernels.aot)."""
    for name in filter(None, (a.strip() for a in nonempty(flag, value).split(","))):
        _arch(flag, name)
    return value


def _stack(flag: str, value: Any) -> str:
    value = nonempty(flag, value)
    stacks = _recipes().stacks
    if value not in stacks:
        raise _named(flag, unknown("stack", value, stacks))
    return value


def _engine(flag: str, value: Any) -> str:
    from ..engine import check_engine_name

    try:
        check_engine_name(value)
    except UserError as exc:
        raise _named(flag, exc) from None
    return value


def _named(flag: str, exc: UserError) -> UserError:
    return UserError(f"{flag}: {exc.message}", hint=exc.hint)


def choice(metavar: str, choices: Iterable[str]) -> Opt:
    """A value from a fixed list."""
    allowed = tuple(choices)

    def check(flag: str, value: Any) -> str:
        if value not in allowed:
            listed = (
                ", ".join(allowed[:-1]) + f" or {allowed[-1]}" if len(allowed) > 1 else allowed[0]
            )
            raise UserError(f"{flag} {value!r}: choose {listed}")
        return value

    return Opt(metavar, check, kind="choice", choices=allowed)


def number(metavar: str = "N", minimum: int = 1) -> Opt:
    return Opt(metavar, lambda flag, value: whole_number(flag, value, minimum), kind="number")


def text(metavar: str, *, repeatable: bool = False, positional: bool = False,
         required: bool = False) -> Opt:  # fmt: skip
    return Opt(metavar, nonempty, repeatable=repeatable, positional=positional, required=required)


def _folder_problem(path: Path) -> str | None:
    """Why no file could be written into the folder `path` (made first if missing), or None."""
    if path.exists() and not path.is_dir():
        return f"{path} is a file, not a folder"
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, so the folder {path} cannot be made"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def writable_folder(path: Path, what: str) -> None:
    """UserError unless `path` is a folder this process can write, or can be made as one."""
    problem = _folder_problem(path)
    if problem:
        raise UserError(f"{what} {path}: {problem}")


def writable_file(path: Path, what: str) -> None:
    """UserError unless a file can be written (aside, then renamed) at `path`."""
    if path.is_dir():
        raise UserError(f"{what} {path}: is a folder; give a file name")
    problem = _folder_problem(path.parent)
    if problem:
        raise UserError(f"{what} {path}: {problem}")


def _out_file(flag: str, value: Any) -> str:
    writable_file(Path(nonempty(flag, value)), flag)
    return value


def _out_dir(flag: str, value: Any) -> str:
    writable_folder(Path(nonempty(flag, value)), flag)
    return value


def _existing(kind: str) -> Callable[[str, Any], str]:
    def check(flag: str, value: Any) -> str:
        path = Path(nonempty(flag, value))
        ok = {"file": path.is_file, "folder": path.is_dir, "path": path.exists}[kind]()
        if not ok:
            raise UserError(
                f"{flag} {path}: no such {'file or folder' if kind == 'path' else kind}"
            )
        return value

    return check


def _ca_cert(flag: str, value: Any) -> str:
    """A CA bundle pip is to trust: an existing file, or 'none' for pip's own."""
    if nonempty(flag, value) == "none":
        return value
    if not Path(value).is_file():
        raise UserError(f"{flag} {value}: no such file (give a CA bundle, or 'none')")
    return value


def _interpreter(flag: str, value: Any) -> str:
    path = Path(nonempty(flag, value))
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UserError(f"{flag} {value}: no such file, or not an executable interpreter")
    return value


REFERENCE_PART = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
REGISTRY_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]+)?")


def _registry_namespace(flag: str, value: str) -> str:
    """--to as the engines read an image name (the distribution reference grammar): an optional
    host[:port], then lowercase path components; checked before anything is tagged or pushed."""
    parts = value.strip().rstrip("/").split("/")
    host = parts[0] if len(parts) > 1 and ("." in parts[0] or ":" in parts[0]
                                           or parts[0] == "localhost") else None  # fmt: skip
    bad = [p for p in (parts[1:] if host else parts) if not REFERENCE_PART.fullmatch(p)]
    if (host and not REGISTRY_HOST.fullmatch(host)) or bad or not value.strip():
        raise UserError(
            f"{flag} {value!r}: not a registry namespace; expected [HOST[:PORT]/]PATH with "
            "lowercase letters, digits and . _ - in each part, e.g. ghcr.io/org/attnforge"
        )
    return value.strip()


ARCH = Opt("ARCH", _arch, kind="arch")
ARCHES = Opt("ARCH[,ARCH...]", _arch_list, kind="arch")
STACK = Opt("STACK", _stack, kind="stack")
ENGINE = Opt("ENGINE", lambda flag, value: _engine(flag, value), kind="engine")
OUT_FILE = Opt("FILE", _out_file, kind="out_file")
OUT_DIR = Opt("DIR", _out_dir, kind="out_dir")
# The host's CA bundle, handed to pip inside builds as a BuildKit secret (never stored in an
# image) by build, bake and mirror where it exists.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
IN_FILE = Opt("FILE", _existing("file"), kind="in_file")
IN_DIR = Opt("DIR", _existing("folder"), kind="in_dir")
NAMESPACE = Opt("NAMESPACE", _registry_namespace, kind="namespace")
CA_CERT = Opt("FILE|none", _ca_cert, kind="in_file")
INTERPRETER = Opt("PYTHON", _interpreter, kind="in_file")


def out_file(metavar: str = "FILE") -> Opt:
    return Opt(metavar, _out_file, kind="out_file")


class _Value(Argument):
    """An option that takes a value: shows its placeholder, and a repeatable one given without
    a value is an error (invoke starts lists with a value, so a bare `--set` passed silently)."""

    def __init__(self, *args: Any, metavar: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.metavar = metavar
        if self.kind is list:
            self.raw_value = None  # no value seen yet; the list itself stays empty

    def __repr__(self) -> str:  # what invoke's "needed value" error prints
        return f"'--{self.name.replace('_', '-')}'"


class _Variadic(_Value):
    """A repeated positional argument (`invoke matrix FILE...`): always ready for one more."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.collected: list[str] = []

    @property
    def value(self) -> Any:
        return None  # invoke gives a positional token to the first argument whose value is None

    @value.setter
    def value(self, token: Any) -> None:
        self.raw_value = token
        self.collected.append(token)


class _Help(Argument):
    """A task's own --help / -h: read before a positional argument could take it as a value."""

    task_name = ""


class _Context(ParserContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for arg in self.args.values():
            if isinstance(arg, _Help):
                arg.task_name = self.name

    def help_for(self, flag: str) -> tuple[str, str]:
        names, text_ = super().help_for(flag)
        arg = self.flags[flag]
        metavar = getattr(arg, "metavar", "")
        if metavar and arg.kind is list:  # invoke shows a list option like a bool flag
            names = ", ".join(
                f"{n} {metavar}" if len(n) == 2 else f"{n}={metavar}" for n in names.split(", ")
            )
        elif metavar:
            names = names.replace("STRING", metavar).replace("INT", metavar)
        return names, text_

    def help_tuples(self) -> list[tuple[str, str | None]]:
        return [t for t in super().help_tuples() if not t[0].startswith("-h, --help")]

    @property
    def missing_positional_args(self) -> list[Argument]:
        # invoke asks this twice: while reading tokens (an empty positional takes the next one)
        # and when the task's tokens end (an empty one is an error). attnforge's positionals are
        # optional or repeated, and the required ones are checked by the task itself, after
        # --help had its say: so the end never fails here.
        if sys._getframe(1).f_code.co_name == "complete_context":
            return []
        return [a for a in self.positional_args if a.value is None]

    @property
    def as_kwargs(self) -> dict[str, Any]:
        found = super().as_kwargs
        for arg in self.args.values():
            if isinstance(arg, _Variadic):
                found[arg.name] = list(arg.collected)
            if isinstance(arg, _Help) and arg.value:
                found[arg.name] = arg.task_name  # the task prints its help under this name
        return found


# invoke's loader copies tasks.py's collection into a plain Collection, whose to_contexts makes
# invoke's ParserContext by this module-level name: the one place to hand it attnforge's (a
# Collection subclass in tasks.py would be copied away). Placeholders and --help concern only
# attnforge's arguments; the positional rule above holds for every task, all of them attnforge's.
invoke_collection.ParserContext = _Context


def _flag(name: str) -> str:
    return "--" + name.rstrip("_").replace("_", "-")


def _missing(flag: str, opt: Opt) -> str:
    if opt.positional:
        return f"{opt.metavar} is needed: give it after the task's name, or as {flag}"
    return f"{flag} is needed: {opt.metavar}"


class _Task(Task):
    options: dict[str, Opt]
    writes: tuple[str, ...]
    goes_with: dict[str, tuple[str, str]]

    def arg_opts(self, name: str, default: Any, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            opts["names"] = [*opts["names"], SHORT_FLAGS[name]]
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        args, kept = [], dict(self.help)  # invoke empties self.help as it reads it
        found = super().get_arguments(ignore_unknown_help)
        self.help = kept
        for arg in found:
            opt = self.options.get(arg.name)
            if opt is None:
                args.append(arg)
                continue
            cls = _Variadic if opt.positional and opt.repeatable else _Value
            args.append(cls(names=arg.names, kind=arg.kind, default=arg.default, help=arg.help,
                            positional=arg.positional, optional=arg.optional,
                            attr_name=arg.attr_name,
                            metavar=opt.metavar + ("..." if opt.repeatable else "")))  # fmt: skip
        # Before any positional argument could take it as its value (invoke's core --help does not
        # work after a task's positional arguments).
        args.append(_Help(names=("help", "h"), kind=bool, default=False, help="show this help"))
        return args

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = kwargs.pop("help", False)
        if name:
            print_help(self, name if isinstance(name, str) else self.name)
            return None
        return super().__call__(*args, **kwargs)

    def check(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The task's option values, checked and converted; a UserError names the first bad one."""
        from ..workspace import BUILD_DIR_ENV, REPORTS_DIR_ENV, Workspace

        for name, (needed, why) in self.goes_with.items():  # the combination before the values
            if kwargs.get(name) not in (None, False, []) and not kwargs.get(needed):
                raise UserError(f"{_flag(name)} goes with {_flag(needed)}{why}")
        global _checked_recipes
        _checked_recipes = {}
        try:
            for name, opt in self.options.items():
                flag = _flag(name)
                value = kwargs.get(name)
                if opt.required and value in (None, [], ""):
                    raise UserError(opt.needs or _missing(flag, opt))
                if value is None or value == []:
                    continue
                if opt.repeatable:
                    kwargs[name] = [opt.check(flag, v) for v in value]
                else:
                    kwargs[name] = opt.check(flag, value)
        finally:
            _checked_recipes = None
        ws = Workspace.discover() if self.writes else None
        for where in self.writes:
            env = {"build": BUILD_DIR_ENV, "reports": REPORTS_DIR_ENV}[where]
            path = ws.build_dir if where == "build" else ws.reports_dir
            writable_folder(path, f"the {where} folder (${env})")
        return kwargs


def print_help(t: _Task, name: str) -> None:
    """`invoke TASK --help`, also where invoke would take --help as a positional value."""
    ctx = _Context(name=name, args=t.get_arguments())
    positionals = " ".join(
        f"[{getattr(a, 'metavar', a.name.upper())}]" for a in ctx.positional_args
    )
    print(f"Usage: invoke {ctx.name} [--options] {positionals}".rstrip())
    print("\nDocstring:")
    for line in (inspect.getdoc(t) or "none").splitlines():
        print(f"  {line}" if line.strip() else "")
    print("\nOptions:")
    tuples = ctx.help_tuples()
    width = max((len(n) for n, _ in tuples), default=0) + 4
    columns = shutil.get_terminal_size((100, 20)).columns
    for names, text_ in tuples or [("none", "")]:
        body = textwrap.wrap(text_ or "", max(30, columns - width - 2)) or [""]
        print(f"  {names.ljust(width)}{body[0]}")
        for more in body[1:]:
            print(" " * (width + 2) + more)
    print()


def command(
    *,
    options: dict[str, Opt] | None = None,
    writes: tuple[str, ...] = (),
    positional: list[str] | None = None,
    goes_with: dict[str, str | tuple[str, str]] | None = None,
    **kwargs: Any,
) -> Callable[[Callable[..., Any]], Task]:
    """`@invoke.task` with attnforge's flag rules.

    `options` declares each option that takes a value (every one must be declared: a task's
    values are all checked before it runs); `writes` names the workspace folders ("build",
    "reports") it writes, checked writable first. Options marked repeatable are invoke's
    `iterable`, positional ones its `positional`; a bool default makes a plain flag.
    `goes_with` names, for an option or flag, the flag it needs (and optionally why, as the
    rest of the sentence): `--json` without `--dry-run` is refused before the task runs."""
    options = options or {}

    def wrap(fn: Callable[..., Any]) -> Task:
        params = inspect.signature(fn).parameters
        undeclared = [n for n, p in list(params.items())[1:]
                      if not isinstance(p.default, bool) and n not in options]  # fmt: skip
        if undeclared:  # a programming error, found when tasks.py is imported
            raise TypeError(f"{fn.__name__}: options without an Opt: {', '.join(undeclared)}")

        @functools.wraps(fn)  # invoke reads the signature through __wrapped__
        def checked(*args: Any, **kw: Any) -> Any:
            return fn(*args, **t.check(kw))

        t = task(
            klass=_Task,
            auto_shortflags=False,
            iterable=[n for n, o in options.items() if o.repeatable],
            positional=positional or [n for n, o in options.items() if o.positional],
            **kwargs,
        )(user_errors(checked))
        t.options, t.writes = options, writes
        t.goes_with = {
            k: (v, "") if isinstance(v, str) else v for k, v in (goes_with or {}).items()
        }
        return t

    return wrap


def choose_target(recipes: Recipes, arch: str | None, stack: str | None) -> tuple[str, str]:
    """(arch, stack) for a task: the given ones, else the host's default arch (saying why) and
    that arch's default stack."""
    from .. import hostinfo, multiarch
    from ..plan import default_stack

    if arch is None:
        arch, why = hostinfo.default_arch()
        out.print(f"[dim]--arch not given: {why}[/]")
    elif multiarch.is_set(arch):  # one image for several arches: an arch from here on
        arch = multiarch.register(recipes, arch)
    return arch, stack or default_stack(recipes, arch)


__all__ = ["Exit", "Opt", "choice", "command", "number", "text", "whole_number"]
