"""`invoke build --mirror DIR`: check the mirror against the plan, show what it replaces, and build
from it and from nothing else.

Each layer that fetches (pip or git lines) builds with the network `host`, so that it reaches the
mirror served on 127.0.0.1, and with every other URL sent to a proxy that refuses (BuildKit's
predefined proxy args, which every RUN line sees): a Dockerfile line that still reaches for an
outside index or repository fails the build instead of quietly downloading. Layers that fetch
nothing build as they always do; distribution packages (apt) are the base image's, not mirrored.

A rehearsal mirror (stand-in wheels, manifest key `rehearsal`) marks every layer's inputs (a
hashed arg) and image (the label org.attnforge.rehearsal), so its images never share a cache key
with real ones, and publish and export refuse them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ..errors import UserError
from .layout import MANIFEST, Manifest, damaged_files, missing_pins, repo_path
from .needs import SUBMODULES, layer_needs, replacements, submodule_rewrite
from .serve import served
from .submodules import has_commit, walk

REHEARSAL_ARG = "ATTNFORGE_REHEARSAL"
REHEARSAL_LABEL = "org.attnforge.rehearsal"
_REFUSE = "http://127.0.0.1:9"  # nothing listens on the discard port: a refused connection


def refuse_rehearsal(labels: Mapping[str, str], image: str, done: str) -> None:
    """A rehearsal image (stand-in wheels) is never published or exported."""
    mark = labels.get(REHEARSAL_LABEL)
    if mark:
        raise UserError(
            f"{image} is a rehearsal image, built from a mirror of stand-in wheels (mark {mark}); "
            f"it is not {done}",
            hint="build from AMD's indexes, or from a mirror of AMD's own wheels",
        )


def load(folder: Path) -> Manifest:
    if not (folder / MANIFEST).is_file():
        raise UserError(f"--mirror {folder}: no {MANIFEST} there (make one with `invoke mirror`)")
    return Manifest.load(folder)


def rehearsal_mark(folder: str | None) -> str | None:
    """The hashed arg value that keeps a rehearsal mirror's images apart (None: a real mirror)."""
    if not folder:
        return None
    manifest = load(Path(folder))
    return manifest.digest[:16] if manifest.rehearsal is not None else None


def fetching_steps(plan: Any, root: Path, statuses=("build",)) -> list[tuple[Any, Any]]:
    """(step, its needs) for every step that will build (or has one of ``statuses``) and fetches
    something."""
    out = []
    for step in plan.steps:
        if step.status in statuses:
            needs = layer_needs(root, step)
            if needs.requirements or needs.repo:
                out.append((step, needs))
    return out


def _bare(folder: Path, url: str) -> Path | None:
    bare = folder / repo_path(url)
    return bare if bare.is_dir() else None


def _has_commit(folder: Path, url: str, commit: str) -> bool:
    bare = _bare(folder, url)
    return bare is not None and has_commit(bare, commit)


def check(folder: Path, plan: Any, root: Path) -> Manifest:
    """The mirror is intact (every file's sha256) and holds every pin and pinned commit the
    plan's layers fetch; else one UserError listing each problem as a sentence."""
    manifest = load(folder)
    fetching = fetching_steps(plan, root)
    problems = missing_pins(manifest, {s.layer: n.requirements for s, n in fetching})
    for step, needs in fetching:
        if needs.repo is None:
            continue
        url, commit = needs.repo
        if not _has_commit(folder, url, commit):
            problems.append(f"layer {step.layer} needs {url} at {commit}, and the mirror lacks it")
            continue
        for sub in walk(url, commit, lambda u: _bare(folder, u)):
            if not _has_commit(folder, sub.url, sub.commit):
                problems.append(
                    f"layer {step.layer} needs {sub.url} at {sub.commit} (the submodule "
                    f"{sub.path} of {sub.parent}), and the mirror lacks it"
                )
    problems += damaged_files(folder, manifest)
    if problems:
        head = (
            problems[0]
            if len(problems) == 1
            else f"{len(problems)} problems: " + "; ".join(problems)
        )
        raise UserError(f"mirror {folder}: {head}",
                        hint="add what is missing with `invoke mirror ... --to` that folder")  # fmt: skip
    return manifest


def replacement_lines(plan: Any, root: Path, folder: Path) -> list[str]:
    """What `--dry-run` prints: per fetching layer, each URL it would have used and the mirror
    path that replaced it."""
    lines = [f"mirror {folder}: served on 127.0.0.1 to the layers that fetch; other URLs refused"]
    for step, _ in fetching_steps(plan, root, ("build", "cached", "pull")):
        for r in replacements(step):
            lines.append(f"  {step.layer}: {r.arg} {r.upstream} -> {folder}/{r.mirror_path}")
    return lines


def _request(req: Any, step: Any, base: str) -> Any:
    args = dict(req.build_args)
    for r in replacements(step):
        if r.arg == SUBMODULES:  # git's url.<base>.insteadOf, through its environment
            args.update(submodule_rewrite(f"{base}/{r.mirror_path}"))
        else:
            args[r.arg] = f"{base}/{r.mirror_path}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        args[name] = _REFUSE
    args["NO_PROXY"] = args["no_proxy"] = "127.0.0.1,localhost"
    labels = dict(req.labels)
    if REHEARSAL_ARG in step.args:
        labels[REHEARSAL_LABEL] = step.args[REHEARSAL_ARG]
    return dataclasses.replace(req, build_args=args, labels=labels, network="host")


class Session:
    """A checked mirror served for one build (close() stops it)."""

    def __init__(self, folder: Path, plan: Any, root: Path) -> None:
        self.folder, self.root = folder.resolve(), root
        self.manifest = check(self.folder, plan, root)
        self._stack = ExitStack()
        self.base = self._stack.enter_context(served(self.folder, self.manifest.digest[:16]))

    def requests(self, plan: Any, requests: Mapping[str, Any]) -> dict[str, Any]:
        """The build requests, those of fetching layers pointed at the mirror."""
        fetching = {s.layer: s for s, _ in fetching_steps(plan, self.root)}
        out = dict(requests)
        for layer, step in fetching.items():
            if layer in out:
                out[layer] = _request(out[layer], step, self.base)
        for step in plan.steps:  # a rehearsal image says so even where the layer fetches nothing
            if step.layer not in fetching and step.layer in out and REHEARSAL_ARG in step.args:
                req = out[step.layer]
                out[step.layer] = dataclasses.replace(
                    req, labels={**req.labels, REHEARSAL_LABEL: step.args[REHEARSAL_ARG]}
                )
        return out

    def close(self) -> None:
        self._stack.close()
