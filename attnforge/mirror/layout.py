"""A mirror folder's shape, its manifest and its checks (pure: files in, sentences out).

DIR/manifest.json          {"files": {name: sha256}, "repos": {url: {path, commits}},
                            "requirements": {layer: [req...]}, "rehearsal": {...} or absent}
DIR/files/<wheel or sdist>
DIR/simple/index.html      PEP 503: one link per project
DIR/simple/<project>/index.html   one link per file, with #sha256=
DIR/git/<host>/<path>.git  bare repositories (git clone --mirror), served by git's smart HTTP
"""

from __future__ import annotations

import hashlib
import html
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

MANIFEST = "manifest.json"
FILES, SIMPLE, GIT = "files", "simple", "git"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dist_of(filename: str) -> tuple[str, Version] | None:
    """(canonical project name, version) of a wheel or sdist file name; None for anything else."""
    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
            return name, version
        if filename.endswith((".tar.gz", ".zip")):
            return parse_sdist_filename(filename)
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return None


def repo_path(url: str) -> str:
    """Where a repository URL lives in a mirror: git/<host>/<path>.git."""
    parts = urlsplit(url)
    path = parts.path.strip("/").removesuffix(".git")
    host = parts.netloc or "local"
    return f"{GIT}/{host}/{path}.git"


@dataclass
class Manifest:
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    repos: dict[str, dict[str, Any]] = field(default_factory=dict)  # url -> {path, commits}
    requirements: dict[str, list[str]] = field(default_factory=dict)  # layer -> its pip lines
    rehearsal: dict[str, Any] | None = None  # stand-in wheels: never a real build's inputs

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"files": self.files, "repos": self.repos,
                                "requirements": self.requirements}  # fmt: skip
        if self.rehearsal is not None:
            data["rehearsal"] = self.rehearsal
        return data

    @classmethod
    def load(cls, folder: Path) -> Manifest:
        data = json.loads((folder / MANIFEST).read_text())
        return cls(data.get("files", {}), data.get("repos", {}), data.get("requirements", {}),
                   data.get("rehearsal"))  # fmt: skip

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()


def project_pages(files: Mapping[str, str]) -> dict[str, str]:
    """PEP 503 pages, keyed by path under simple/: the root page and one page per project whose
    links carry each file's sha256 (pip checks it on download)."""
    by_project: dict[str, list[str]] = {}
    for name in sorted(files):
        dist = dist_of(name)
        if dist is not None:
            by_project.setdefault(dist[0], []).append(name)

    def page(title: str, links: Iterable[tuple[str, str]]) -> str:
        body = "\n".join(f'<a href="{html.escape(h)}">{html.escape(t)}</a><br/>' for h, t in links)
        return (f"<!DOCTYPE html>\n<html><head><title>{html.escape(title)}</title></head>"
                f"<body>\n{body}\n</body></html>\n")  # fmt: skip

    pages = {"index.html": page("Simple index", ((f"{p}/", p) for p in sorted(by_project)))}
    for project, names in by_project.items():
        links = ((f"../../{FILES}/{n}#sha256={files[n]}", n) for n in names)
        pages[f"{project}/index.html"] = page(f"Links for {project}", links)
    return pages


def write_index(folder: Path, manifest: Manifest) -> None:
    """Write simple/ and manifest.json for the files manifest lists (the folder is new: a
    mirror is assembled aside and renamed into place, see gather)."""
    for rel, text in project_pages(manifest.files).items():
        path = folder / SIMPLE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (folder / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2, sort_keys=True) + "\n")


def pinned(req_text: str) -> tuple[str, str] | None:
    """(canonical name, version) of an exact `name[extras]==version` requirement, else None."""
    try:
        req = Requirement(req_text)
    except InvalidRequirement:
        return None
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "==="):
        return canonicalize_name(req.name), specs[0].version
    return None


def missing_pins(manifest: Manifest, requirements: Mapping[str, Iterable[str]]) -> list[str]:
    """One sentence per exact pin (per layer) that no file in the mirror satisfies."""
    have: dict[str, set[Version]] = {}
    for name in manifest.files:
        dist = dist_of(name)
        if dist is not None:
            have.setdefault(dist[0], set()).add(dist[1])
    problems = []
    for layer, reqs in requirements.items():
        for text in reqs:
            pin = pinned(text)
            if pin is not None and Version(pin[1]) not in have.get(pin[0], set()):
                problems.append(f"layer {layer} pins {text}, and the mirror has no wheel of it")
            elif pin is None and canonicalize_name(Requirement(text).name) not in have:
                problems.append(f"layer {layer} needs {text}, and the mirror has none")
    return problems


def damaged_files(folder: Path, manifest: Manifest) -> list[str]:
    """One sentence per listed file that is missing or whose sha256 is not the manifest's."""
    problems = []
    for name, want in sorted(manifest.files.items()):
        path = folder / FILES / name
        if not path.is_file():
            problems.append(f"{FILES}/{name} is listed in {MANIFEST} but missing")
        elif sha256_of(path) != want:
            problems.append(f"{FILES}/{name} does not match its sha256 in {MANIFEST}")
    return problems
