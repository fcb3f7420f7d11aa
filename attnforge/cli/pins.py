"""invoke pins.check and pins.update: argument handling and printing only; the work is in
attnforge/pins/upstream.py and attnforge/pins/update.py."""

from __future__ import annotations

import functools
import json as jsonlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from invoke.exceptions import Exit

from ..console import out, user_errors
from ..errors import UserError
from ..pins.channels import CHANNELS, DEFAULT_ARCH
from ..workspace import Workspace
from . import ARCH, ENGINE, IN_DIR, IN_FILE, STACK, Opt, command, text

if TYPE_CHECKING:  # the library is imported where a task uses it (attnforge/cli/__init__.py)
    from rich.table import Table

    from ..pins import upstream as pinlib


def _channel(flag: str, value: str) -> str:
    if value not in CHANNELS:
        raise UserError(f"{flag} {value}: expected one of {', '.join(CHANNELS)}")
    return value


def status_style() -> dict[str, str]:
    from ..pins import upstream as pinlib

    return {
        pinlib.OK: "green",
        pinlib.FLOATING: "yellow",
        pinlib.UNKNOWN: "magenta",
        pinlib.MISSING: "bold red",
        pinlib.MISMATCH: "bold red",
    }


def findings_table(findings: list[pinlib.Finding], title: str) -> Table:
    from rich.markup import escape
    from rich.table import Table

    style = status_style()
    table = Table(title=title, title_justify="left")
    for col in ("pin", "value", "source", "status", "evidence", "used by"):
        table.add_column(col, overflow="fold")
    for f in findings:
        plans = ", ".join(f.used_by[:3]) + (f" +{len(f.used_by) - 3}" if len(f.used_by) > 3 else "")
        table.add_row(
            escape(f.pin),
            escape(f.value),
            escape(f.source),
            f"[{style.get(f.status, '')}]{f.status}[/]",
            escape(f.evidence),
            escape(plans),
        )
    return table


@command(
    options={
        "arch": ARCH,
        "stack": STACK,
        "offline": IN_DIR,
        "python": text("X.Y"),
        "engine": ENGINE,
    },  # fmt: skip
    writes=("build",),
    help={
        "arch": "check only the plans for this arch (default: every arch of each stack)",
        "stack": "check only this stack's plans (default: every stack)",
        "offline": "read git mirrors and saved index pages from this folder (layout: docs/pins.md)",
        "python": "the image's Python, for wheel tags (default: from the stack's base image)",
        "engine": "container engine whose pulled base images give their digests: docker "
        "(default) or podman",
        "json": "print the findings as JSON",
        "debug": "show tracebacks",
    },
)
@user_errors
def check(c, arch=None, stack=None, offline=None, python=None, engine="docker", json=False,
          debug=False):  # fmt: skip
    """Check every pin the plans use against its source; exit 1 on a missing or mismatched pin."""
    from ..engine import check_engine_name
    from ..pins import upstream as pinlib
    from ..recipes import load_recipes

    ws = Workspace.discover()
    recipes = load_recipes(ws.root)
    digest_of = pinlib.engine_digest(check_engine_name(engine))
    sources = pinlib.Sources(Path(offline) if offline else None, cache=ws.build_dir / "pins-cache")
    pairs = pinlib.targets(recipes, arch, stack)
    findings = pinlib.check(recipes, pairs, sources, python=python, digest_of=digest_of)
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
        counts = {s: sum(f.status == s for f in findings) for s in status_style()}
        out.print(", ".join(f"{n} {s}" for s, n in counts.items() if n))
    if failed:
        raise Exit(code=1)


NEEDS_CHANNEL = f"--channel (not given): expected one of {', '.join(CHANNELS)}"


@command(
    options={
        "channel": Opt(
            "|".join(CHANNELS).upper(),
            _channel,
            kind="choice",
            choices=CHANNELS,
        ),
        "offline": IN_DIR,
        "python": text("X.Y"),
        "arch": text("ARCH"),
        "torch_branch": text("BRANCH"),
        "observed": IN_FILE,
    },
    help={
        "channel": "the release channel to read: stable or pytorch-org (a diff of the "
        "recipes) or nightly (--set flags for invoke build)",
        "offline": "read saved index pages from this folder (layout: docs/pins.md)",
        "python": "the image's Python, for wheel tags (default: from the stack's base image)",
        "arch": f"count only versions with this arch's device packages (default: "
        f"{DEFAULT_ARCH}); nightly: and whose tests AMD's Quartz feed says passed",
        "torch_branch": "nightly: the torch branch the Quartz feed must show passing (default: "
        "the stable channel's, e.g. release/2.14)",
        "observed": "instead of an index: an image's /opt/attnforge/versions.json or its "
        "validation report; propose the recipe corrected by what the image read from its own "
        "files (the AOTriton in torch)",
        "json": "print the proposal as JSON",
        "debug": "show tracebacks",
    },
)
@user_errors
def update(
    c, channel=None, offline=None, python=None, arch=None, torch_branch=None, observed=None,
    json=False, debug=False,
):  # fmt: skip
    """Propose the newest pins a channel's index serves; writes no file (docs/pins.md)."""
    from ..pins import update as pin_update
    from ..pins import upstream as pinlib
    from ..recipes import load_recipes

    if observed is not None:
        return _update_observed(Path(observed), json)
    if channel is None:  # needed unless --observed, so not a required option
        raise UserError(NEEDS_CHANNEL)
    ws = Workspace.discover()
    recipes = load_recipes(ws.root)
    index = pinlib.IndexSource(Path(offline) if offline else None)
    feed, problem = None, "none saved under --offline"
    if channel == "nightly":
        try:
            feed = pin_update.read_feed(Path(offline) if offline else None)
        except UserError as exc:
            if offline:  # a saved file that is not a status.json: the user's to fix
                raise
            problem = exc.message  # no network to GitHub: said in the notes, not a guess
    proposal = pin_update.propose(recipes, channel, index, python=python, arch=arch, feed=feed,
                                  torch_branch=torch_branch, feed_problem=problem)  # fmt: skip
    reminders = pin_update.reminders(proposal, recipes)
    if json:
        data = proposal.to_json()
        data["mode"] = f"offline {offline}" if offline else "online"
        data["reminders"] = reminders
        print(jsonlib.dumps(data, indent=2))
        return
    # stdout carries only what is to be used (the diff, or the command), so `> stable.diff`
    # then `git apply stable.diff` works; what a person reads goes to stderr.
    mode = f"offline {offline}" if offline else "online"
    say = functools.partial(print, file=sys.stderr, flush=True)
    indexes = sorted(set(proposal.indexes.values()))
    say(f"{channel}: {', '.join(indexes)} ({mode}), Python {proposal.python}, {proposal.arch}")
    diff = channel in ("stable", pin_update.ORG)  # the channels the recipes pin
    say(f"newest complete {'nightly' if not diff else 'release'}: ROCm {proposal.rocm}")
    for p in proposal.picks:
        now = f"{p.current} -> " if p.current is not None and p.changed else ""
        say(f"  {p.layer}.{p.key}: {now}{p.proposed}  ({p.file})")
    for note in proposal.notes:
        say(f"note: {note}")
    if diff:
        if proposal.current:
            print(f"{channel} pins are current", flush=True)
        else:
            print(proposal.diff, end="", flush=True)
    else:
        flags = [f"invoke build --stack {proposal.stack} --arch {proposal.arch}"]
        print(" \\\n    ".join(flags + proposal.set_flags), flush=True)
    for line in reminders:
        say(f"check: {line}")
    done = "nothing was written"
    if diff and not proposal.current:
        done += "; review the diff, then apply it: save stdout and `git apply` it"
    say(done)


def _update_observed(path: Path, json: bool) -> None:
    """`pins.update --observed FILE`: the diff to stdout (for `git apply`), notes to stderr."""
    from ..pins import update as pin_update
    from ..recipes import load_recipes

    try:
        document = jsonlib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"--observed {path}: not a JSON file ({exc})") from None
    if not isinstance(document, dict):
        raise UserError(f"--observed {path}: not a versions manifest or a report")
    recipes = load_recipes(Workspace.discover().root)
    diff, notes = pin_update.observed_diff(recipes, document, str(path))
    if json:
        print(jsonlib.dumps({"observed": str(path), "current": not diff, "diff": diff,
                             "notes": notes}, indent=2))  # fmt: skip
        return
    for note in notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    print(diff if diff else "the recipes say what the image read", end="" if diff else "\n")
    print("nothing was written" + ("; review the diff, then `git apply` it" if diff else ""),
          file=sys.stderr)  # fmt: skip
