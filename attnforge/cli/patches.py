"""Invoke tasks for patch series: check, apply, status, new (the `patches` collection)."""

from __future__ import annotations

from pathlib import Path

from invoke.exceptions import Exit

from attnforge import patches
from attnforge.cli import IN_DIR, Opt, command, text
from attnforge.console import user_errors
from attnforge.workspace import Workspace


def _patches_root() -> Path:
    return Workspace.discover().root / "patches"


def _series_dirs(root: Path, component: str, series: str | None) -> list[Path]:
    base = root / component
    components = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not base.is_dir():
        raise Exit(
            f"No patch series for component {component!r} under {root}; "
            f"components: {', '.join(components) or 'none'}.",
            code=2,
        )
    available = sorted(p.name for p in base.iterdir() if (p / patches.SERIES_FILE).is_file())
    if not series:
        if not available:
            note = " (see README.md there)" if (base / "README.md").is_file() else ""
            print(f"{component}: no patch series under {base}{note}; nothing to do.")
        return [base / name for name in available]
    chosen = [s.strip() for s in series.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in available]
    if unknown:
        raise Exit(
            f"No series {', '.join(unknown)} for component {component!r}; "
            f"choices: {', '.join(available) or 'none'}.",
            code=2,
        )
    return [base / name for name in chosen]


def _run(command: str, component: str, src: str, series: str | None, root: str | None) -> None:
    dirs = _series_dirs(Path(root) if root else _patches_root(), component, series)
    if not dirs:
        return
    action = {"check": patches.check, "apply": patches.apply, "status": patches.status}[command]
    try:
        loaded = [patches.load_series(d, component) for d in dirs]
        results = action(loaded, Path(src), component=component)
    except patches.PatchConflict as exc:
        if exc.results[:-1]:
            print(patches.format_results(exc.results[:-1], command))
        raise Exit(f"error: {exc}", code=1) from None
    except patches.PatchError as exc:
        raise Exit(f"error: {exc}", code=1) from None
    print(patches.format_results(results, command))
    conflicts = [r for r in results if r.state == patches.CONFLICT]
    if conflicts:
        raise Exit("error: " + "\n".join(r.detail for r in conflicts), code=1)


# COMPONENT and SRC are positional (invoke patches.apply COMPONENT SRC) or flags.
_OPTIONS = {
    "component": text("COMPONENT", positional=True, required=True),
    "src": Opt("SRC", IN_DIR.check, positional=True, required=True, kind="in_dir"),
    "series": text("SERIES[,SERIES...]"),
    "root": text("DIR"),
}
_HELP = {
    "component": "component whose series to use (a folder under patches/)",
    "src": "source tree to patch",
    "series": "comma-separated series names (default: every series of the component)",
    "root": "patches folder (default: the repository's patches/)",
}


@command(options=_OPTIONS, help=_HELP)
def check(c, component, src, series=None, root=None):
    """Show what apply would do, per patch; fail on a conflict."""
    _run("check", component, src, series, root)


@command(options=_OPTIONS, help=_HELP)
def apply(c, component, src, series=None, root=None):
    """Apply the component's patch series to a source tree, all or nothing."""
    _run("apply", component, src, series, root)


@command(options=_OPTIONS, help=_HELP)
def status(c, component, src, series=None, root=None):
    """Show whether each patch is applied, not applied or conflicting."""
    _run("status", component, src, series, root)


@command(
    options={
        "component": text("COMPONENT", positional=True, required=True),
        "series": text("SERIES", positional=True, required=True),
        "src": Opt("SRC", IN_DIR.check, positional=True, required=True, kind="in_dir"),
        "name": text("NAME", positional=True, required=True),
        "root": text("DIR"),
    },
    help={
        "component": _HELP["component"],
        "series": "series to add the patch to (created if missing)",
        "src": "git checkout holding the uncommitted change",
        "name": "what the patch does, in a few words (becomes NNNN-<name>.patch)",
        "root": _HELP["root"],
    },
)
def new(c, component, series, src, name, root=None):
    """Turn a checkout's uncommitted change into the series' next numbered patch."""
    try:
        path = patches.new_patch(
            component, series, Path(src), name, Path(root) if root else _patches_root()
        )
    except patches.PatchError as exc:
        raise Exit(f"error: {exc}", code=1) from None
    print(f"wrote {path}")
    print(f"Now edit its header (why, upstream links) and {path.parent / patches.SERIES_FILE}.")


@command(
    options={"layer": text("LAYER"), "ref": text("REF"), "offline": IN_DIR},
    help={
        "layer": "only this layer's patches (default: every layer that applies a series)",
        "ref": "judge at this upstream commit (or a mirror's branch) instead of the pinned ref",
        "offline": "read git mirrors from this folder (layout: docs/pins.md)",
        "json": "print the verdicts as JSON",
        "debug": "show tracebacks",
    },
)
@user_errors
def ledger(c, layer=None, ref=None, offline=None, json=False, debug=False):
    """For each patch the recipes apply: still needed, droppable (with the evidence) or unknown."""
    import json as jsonlib

    from attnforge import patch_ledger
    from attnforge.pins.upstream import Sources
    from attnforge.recipes import load_recipes

    found = patch_ledger.status(
        load_recipes(Workspace.discover().root), Sources(Path(offline) if offline else None),
        layer=layer, ref=ref,
    )  # fmt: skip
    if json:
        print(jsonlib.dumps([f.to_json() for f in found], indent=2))
        return
    for f in found:
        print(f"{f.layer}: {f.patch} at {f.ref[:12]}: {f.status}")
        for line in ([f"why: {f.why}"] if f.why else []) + f.evidence:
            print(f"    {line}")
        if f.status == patch_ledger.DROPPABLE:
            print(f"    the fix is upstream ({', '.join(f.upstream) or 'see the evidence'}): "
                  f"drop it from {f.series}")  # fmt: skip
