"""invoke pins.check: argument handling and printing only; the checks are in attnforge/pins.py."""

from __future__ import annotations

import json as jsonlib
from pathlib import Path

from invoke.exceptions import Exit
from rich.markup import escape
from rich.table import Table

from .. import pins as pinlib
from ..console import out, user_errors
from ..errors import UserError
from ..recipes import load_recipes
from ..workspace import Workspace
from . import command

STYLE = {
    pinlib.OK: "green",
    pinlib.FLOATING: "yellow",
    pinlib.UNKNOWN: "magenta",
    pinlib.MISSING: "bold red",
    pinlib.MISMATCH: "bold red",
}


def findings_table(findings: list[pinlib.Finding], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("pin", "value", "source", "status", "evidence", "used by"):
        table.add_column(col, overflow="fold")
    for f in findings:
        plans = ", ".join(f.used_by[:3]) + (f" +{len(f.used_by) - 3}" if len(f.used_by) > 3 else "")
        table.add_row(
            escape(f.pin),
            escape(f.value),
            escape(f.source),
            f"[{STYLE.get(f.status, '')}]{f.status}[/]",
            escape(f.evidence),
            escape(plans),
        )
    return table


@command(
    help={
        "arch": "check only the plans for this arch (default: every arch of each stack)",
        "stack": "check only this stack's plans (default: every stack)",
        "offline": "read git mirrors and saved index pages from this folder (layout: docs/pins.md)",
        "python": "the image's Python, for wheel tags (default: from the stack's base image)",
        "json": "print the findings as JSON",
        "debug": "show tracebacks",
    }
)
@user_errors
def check(c, arch=None, stack=None, offline=None, python=None, json=False, debug=False):
    """Check every pin the plans use against its source; exit 1 on a missing or mismatched pin."""
    ws = Workspace.discover()
    recipes = load_recipes(ws.root)
    if offline is not None and not Path(offline).is_dir():
        raise UserError(f"--offline {offline}: no such folder (layout: docs/pins.md)")
    sources = pinlib.Sources(Path(offline) if offline else None, cache=ws.build_dir / "pins-cache")
    pairs = pinlib.targets(recipes, arch, stack)
    findings = pinlib.check(recipes, pairs, sources, python=python)
    failed = pinlib.failed(findings)
    if json:
        print(
            jsonlib.dumps(
                {
                    "ok": not failed,
                    "mode": f"offline {offline}" if offline else "online",
                    "plans": [f"{a}/{s}" for a, s in pairs],
                    "findings": [f.to_json() for f in findings],
                },
                indent=2,
            )
        )
    else:
        mode = f"offline ({offline})" if offline else "online"
        out.print(findings_table(findings, f"pins of {len(pairs)} plans, {mode}"))
        counts = {s: sum(f.status == s for f in findings) for s in STYLE}
        out.print(", ".join(f"{n} {s}" for s, n in counts.items() if n))
    if failed:
        raise Exit(code=1)
