"""invoke mirror, and what `invoke build --mirror DIR` adds to a build: argument handling and
printing only; the work is in attnforge/mirror."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..console import err, out
from ..errors import UserError
from ..workspace import Workspace
from . import ARCH, HOST_CA_BUNDLE, OUT_DIR, STACK, Opt, choose_target, command, text

if TYPE_CHECKING:
    from ..build import Invocation


def with_mirror(inv: Invocation, mirror: str | None, given_wheelhouse: bool) -> Invocation:
    """The invocation building from ``mirror`` only: no wheelhouse is offered beside it."""
    if not mirror:
        return inv
    if given_wheelhouse:
        raise UserError("--wheelhouse and --mirror exclude each other: a mirror build reads the "
                        "mirror only (add the wheels to it with `invoke mirror --add`)")  # fmt: skip
    if inv.wheelhouse:
        err.print(
            f"[dim]wheelhouse: {inv.wheelhouse} not offered: --mirror builds from the mirror only[/]"
        )
    return dataclasses.replace(inv, mirror=str(Path(mirror).resolve()), wheelhouse=None)


def mirror_lines(plan: Any, root: Path, mirror: str, layer: str | None) -> list[str]:
    from ..mirror.use import replacement_lines

    lines = replacement_lines(plan, root, Path(mirror))
    return [ln for ln in lines if layer is None or not ln.startswith("  ")
            or ln.startswith(f"  {layer}:")]  # fmt: skip


class MirrorBuild:
    """`--mirror` during a build: checked and served before the first layer, stopped after."""

    def __init__(self, mirror: str, plan: Any, root: Path) -> None:
        self.mirror, self.root = Path(mirror), root
        self.session: Any = None
        self.report: list[str] = []

    def apply(self, plan: Any, requests: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The plan (a rehearsal's cut at its stop point and without its not-rehearsable smoke
        checks) and the requests pointed at the mirror, which is checked against that plan."""
        from ..mirror.rehearsal import report_lines, split_smoke, stop_at
        from ..mirror.use import Session, load

        rehearsal = load(self.mirror).rehearsal
        if rehearsal is not None:
            plan, stop = stop_at(plan)
            plan, left = split_smoke(plan)
            self.report = report_lines(rehearsal, [*left, *([stop] if stop else [])])
        self.session = Session(self.mirror, plan, self.root)
        out.print(f"mirror: {self.mirror}, checked ({len(self.session.manifest.files)} files), "
                  f"served at {self.session.base}")  # fmt: skip
        for line in self.report:
            out.print(line, markup=False)
        return plan, self.session.requests(plan, requests)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        for line in self.report[:1]:  # said again at the end: the last lines are the ones read
            out.print(line, markup=False)


def _local_repos(items: list[str]) -> dict[str, str]:
    repos = {}
    for item in items:
        url, sep, path = item.partition("=")
        if not sep or not url or not Path(path).is_dir():
            raise UserError(f"--add-repo {item}: give URL=PATH, PATH a git repository folder")
        repos[url] = str(Path(path).resolve())
    return repos


def _local_wheels(items: list[str]) -> list[Path]:
    found: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found += sorted(
                p for p in path.iterdir() if p.suffix == ".whl" or p.name.endswith(".tar.gz")
            )
        elif path.is_file():
            found.append(path)
        else:
            raise UserError(f"--add {item}: no such file or folder")
    return found


@command(
    options={
        "arch": ARCH,
        "stack": STACK,
        "only": text("LAYER"),
        "to": Opt(
            "DIR",
            OUT_DIR.check,
            required=True,
            kind="out_dir",
            needs="--to DIR is needed: the folder the mirror is written to",
        ),  # fmt: skip
        "set_": text("LAYER.KEY=VALUE", repeatable=True),
        "add": text("FILE|DIR", repeatable=True),
        "add_repo": text("URL=PATH", repeatable=True),
        "index_url": text("URL"),
        "python_version": text("X.Y"),
        "ca_cert": text("FILE"),
        "rehearsal": text("WHY"),
    },  # fmt: skip
    help={
        "arch": "GPU arch whose plan is mirrored (default: the host's AMD GPU, else cpu)",
        "stack": "stack from recipes/stacks.yaml (default: 'default', or the arch's only stack)",
        "only": "only this layer and the layers it sits on",
        "set_": "override a recipe value, as for invoke build (repeatable)",
        "to": "the mirror folder (replaced only once the new mirror is complete)",
        "add": "local wheels (files, or folders of them) put in the mirror before pip resolves "
        "(repeatable): wheels of an index this host cannot reach",
        "add_repo": "URL=PATH: mirror the repository URL from the local repository PATH (repeatable)",
        "index_url": "resolve every layer's wheels against this index instead of the layer's own "
        "(PyPI stays the extra index)",
        "python_version": "the images' Python, for which pip picks wheels (default: 3.12)",
        "ca_cert": "CA bundle pip trusts (default: the host's, as for invoke build)",
        "rehearsal": "mark the mirror as a rehearsal whose --add wheels are stand-ins (WHY says "
        "what they are): its images can be neither published nor exported",
        "debug": "show tracebacks",
    },
)
def mirror(
    c, arch=None, stack=None, only=None, set_=None, to=None, add=None, add_repo=None, index_url=None,
    python_version="3.12", ca_cert=None, rehearsal=None, debug=False,
):  # fmt: skip
    """Gather the wheels and source repositories a plan fetches into one folder.

    The pinned wheels with their dependencies as pip resolves them, and each source repository at
    its pinned commit: a PEP 503 index, bare git repositories and a manifest of hashes."""
    from ..mirror.gather import assemble
    from ..mirror.use import fetching_steps
    from ..plan import Options, parse_overrides, resolve
    from ..recipes import load_recipes

    ws = Workspace.discover()
    recipes = load_recipes(ws.root)
    arch, stack = choose_target(recipes, arch, stack)
    wheels, repos = _local_wheels(list(add or [])), _local_repos(list(add_repo or []))
    overrides = parse_overrides(list(set_ or []), recipes)
    options = Options(base_image="(mirror)", only=only, overrides=overrides)
    plan = resolve(recipes, arch, stack, options)
    if rehearsal:  # a rehearsal builds up to its stop point: nothing above it is fetched
        from ..mirror.rehearsal import stop_at

        plan, stop = stop_at(plan)
        if stop is not None:
            out.print(f"rehearsal stops before {stop.layer}: {stop.reason}")
    needs = [n for _, n in fetching_steps(plan, ws.root)]
    for n in needs:
        for sentence in n.unknown:
            out.print(f"[yellow]{n.layer}: not mirrored, resolved in the build:[/] {sentence}")
    cert = Path(ca_cert) if ca_cert else (HOST_CA_BUNDLE if HOST_CA_BUNDLE.is_file() else None)
    marked = {"why": rehearsal, "stand_ins": sorted(w.name for w in wheels)} if rehearsal else None
    dest = Path(to)
    dest.parent.mkdir(parents=True, exist_ok=True)
    log_path = dest.with_name(dest.name + ".log")
    with log_path.open("w") as log:
        manifest = assemble(dest, needs, local_wheels=wheels, local_repos=repos,
                            python_version=python_version, index=index_url, ca_cert=cert,
                            rehearsal=marked, log=log)  # fmt: skip
    out.print(f"mirror of {stack} for {arch}: {dest} ({len(manifest.files)} files, "
              f"{len(manifest.repos)} repositories; log: {log_path})")  # fmt: skip
    if rehearsal:
        out.print(f"a rehearsal mirror: stand-ins {', '.join(marked['stand_ins'])}")
