"""invoke doctor: what on this machine blocks building or validating, and the fix for each."""

from __future__ import annotations

import json as jsonlib
import re
from typing import TYPE_CHECKING

from invoke.exceptions import Exit

from ..console import out, user_errors
from ..errors import UserError
from ..workspace import Workspace
from . import ENGINE, Opt, command, nonempty, text

if TYPE_CHECKING:  # the library is imported where a task uses it (attnforge/cli/__init__.py)
    from rich.table import Table

    from .. import doctor as core

ARCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]*")


def _arch_name(flag: str, value: str) -> str:
    if not ARCH_NAME.fullmatch(nonempty(flag, value)):
        raise UserError(
            f"{flag} {value!r}: not an arch name (letters, digits and _ . : + -, e.g. gfx1151)"
        )
    return value


STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "info": "dim"}


def rows_table(rows: list[core.Row]) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="attnforge doctor", title_justify="left")
    for col in ("check", "status", "found", "fix"):
        table.add_column(col, overflow="fold")
    for r in rows:
        # Found and fix hold what the host said (paths, env values): text, never markup.
        table.add_row(Text(r.check), Text(r.status, style=STYLE[r.status]), Text(r.found),
                      Text(r.fix))  # fmt: skip
    return table


@command(
    # --arch is not checked against the recipes: an arch they do not know is one of doctor's own
    # findings; a value that cannot be an arch name at all is refused like any other bad option
    options={"arch": Opt("ARCH", _arch_name), "engine": ENGINE, "registry": text("HOST")},
    writes=("build",),
    help={
        "arch": "also check this arch: do the recipes build it, does it match the host's GPU",
        "engine": "container engine to check: docker (default) or podman",
        "registry": "check that the engine's client has a login for this registry host",
        "json": "print the rows, the verdict and the facts as JSON",
        "debug": "show tracebacks",
    },
)
@user_errors
def doctor(c, arch=None, engine="docker", registry=None, json=False, debug=False):
    """Check this machine for building and validating: engine, GPU, devices, kernel, disk.

    Exits 1 when something blocks building or validating; no GPU alone does not."""
    from rich.markup import escape

    from .. import doctor as core
    from ..recipes import load_recipes

    ws = Workspace.discover()
    recipes = core.RecipeFacts.of(load_recipes(ws.root))
    facts = core.gather(engine, ws.build_dir, registry)
    rows = core.diagnose(facts, recipes, arch)
    text, code = core.verdict(facts, rows, recipes)
    if json:
        print(jsonlib.dumps(core.to_json(facts, rows, text, code), indent=2, sort_keys=True))
    else:
        out.print(rows_table(rows))
        style = "bold red" if code else "bold green"
        out.print(f"[{style}]verdict:[/] {escape(text)}", soft_wrap=True)
    if code:
        raise Exit(code=code)
