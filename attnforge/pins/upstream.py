"""`invoke pins.check`: does every pin a plan uses exist upstream, and do the pins agree?

For each runnable step of each plan (arch x stack) it checks, against the real sources:

* git pins: a commit (SOURCE_REF, *_COMMIT) exists in its repository; a tag (source.tag, *_TAG)
  exists and points at the commit the recipe records;
* wheel pins: a *_VERSION pin of a layer that installs from an index is served by that index
  (PEP 503 HTML or PEP 691 JSON "simple" pages) for the image's Python, and for the arch's
  TheRock device package when the layer installs a device extra;
* the AOTriton chain: the pinned PyTorch commit's cmake/External/aotriton.cmake names the
  recipe's AOTriton version and the aotriton layer's commit; a torch wheel's release pins the
  AOTriton the layer says it bundles; and AOTriton's own isArchExperimentallySupported() at that
  tag agrees with recipes/arches.yaml's `aotriton.experimental` facts;
* floating inputs (a base image by moving tag) are warnings, with the digest to pin when known.

Where facts come from is a `Sources`: online (git ls-remote / shallow partial fetches, HTTP
GETs of index pages) or offline (a folder of git mirrors and saved index pages, laid out by URL:
docs/pins.md). A source that cannot be read gives `unknown`, never `ok`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from .. import aotriton_pin
from ..errors import UserError
from ..plan import Options, Plan, Step, resolve
from ..recipes import Recipes, pin_kind, selector_matches

OK, FLOATING, UNKNOWN, MISSING, MISMATCH = "ok", "floating", "unknown", "missing", "mismatch"
FAILING = (MISSING, MISMATCH)

PYPI_SIMPLE = "https://pypi.org/simple/"
# Used when no layer of the recipes names these repositories in a `source:`.
PYTORCH_REPO = "https://github.com/pytorch/pytorch.git"
AOTRITON_REPO = "https://github.com/ROCm/aotriton.git"
# TheRock's device extras pull one package per arch at the same version: rocm[device-gfx1151]
# needs rocm-sdk-device-gfx1151 and torch[device-gfx1151] needs amd-torch-device-gfx1151
# (pip's resolution shown in ROCm/TheRock#5347; RELEASES.md "Installing releases using pip").
DEVICE_PACKAGES = {"rocm": "rocm-sdk-device-{arch}", "torch": "amd-torch-device-{arch}"}
# The python3 a base image's distro installs (base.Dockerfile builds the venv with it):
# packages.ubuntu.com/noble/python3 (3.12), /jammy (3.10); packages.debian.org/bookworm/python3
# (3.11), /trixie (3.13).
DISTRO_PYTHON = {
    "ubuntu:24.04": "3.12",
    "ubuntu:22.04": "3.10",
    "debian:bookworm": "3.11",
    "debian:bookworm-slim": "3.11",
    "debian:trixie": "3.13",
    "debian:trixie-slim": "3.13",
}
# AMD's per-family indexes (repo.amd.com/rocm/whl/<family>/) stopped at ROCm 7.13.0 and the
# whl-multi-arch/<family>/ paths answer 403 (ROCm/rocm-cli#271, 2026-08-17): a recipe naming one
# would pin a release that never moves again, so pins.check rejects them.
FROZEN_FAMILY_INDEX = re.compile(r"^https?://repo\.amd\.com/rocm/(whl|whl-multi-arch)/[^/]+/?$")
FROZEN_WHY = (
    "AMD's per-family index, frozen at ROCm 7.13.0 (ROCm/rocm-cli#271, 2026-08-17); use the "
    "channel's multi-arch index (https://stable.repo.amd.com/rocm/whl-next/, or "
    "https://repo.amd.com/rocm/whl-multi-arch/ for 7.x)"
)
# TheRock's release builds drop the legacy `a0` of a version (0.29.0a0+rocm10.1.0 -> 0.29+rocm10.1.0:
# ROCm/TheRock external-builds/pytorch/tests/build_prod_wheels_version_test.py,
# test_release_strips_only_legacy_a0), so AMD's docs and its index may disagree on a pin.
LEGACY_A0 = ("a", 0)
# Where AOTriton defines isArchExperimentallySupported(), newest layout first.
AOTRITON_UTIL = ("v3src/util.cc", "v2src/util.cc")


class Unavailable(Exception):
    """A source could not be read (no mirror, no network, no such file): the pin is `unknown`."""


@dataclass
class Finding:
    pin: str  # what is checked, e.g. "aotriton SOURCE_REF"
    value: str
    source: str  # where the truth was looked up
    status: str  # ok | floating | unknown | missing | mismatch
    evidence: str
    used_by: list[str] = field(default_factory=list)  # "arch/stack" plans that use it

    def to_json(self) -> dict[str, Any]:
        return {
            "pin": self.pin,
            "value": self.value,
            "source": self.source,
            "status": self.status,
            "evidence": self.evidence,
            "used_by": self.used_by,
        }


# ---------------------------------------------------------------------------- git


def run_git(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """git with no prompts and file:// transports allowed (mirrors are local folders)."""
    env_free = ["-c", "protocol.file.allow=always", "-c", "core.askPass=true"]
    return subprocess.run(
        ["git", *env_free, *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def url_path(url: str) -> Path:
    """host/path of a URL as a relative path: the offline layout of mirrors and index pages."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    rel = [p for p in parts.path.split("/") if p not in ("", ".", "..")]
    return Path(host, *rel) if host else Path(*rel)


class GitRepo:
    """Read-only questions about one repository: its tags, its commits, a file at a commit."""

    def __init__(self, url: str, path: Path, *, online: bool) -> None:
        self.url, self.path, self.online = url, path, online
        self._tags: dict[str, str] | None = None

    def tags(self) -> dict[str, str]:
        """tag -> the commit it points at (annotated tags peeled)."""
        if self._tags is None:
            if self.online:
                proc = run_git(["ls-remote", "--tags", self.url])
                if proc.returncode != 0:
                    raise Unavailable(f"git ls-remote {self.url} failed: {_last_line(proc)}")
                lines = proc.stdout
            else:
                fmt = "%(objectname) refs/tags/%(refname:strip=2)%0a%(*objectname) %(refname)^{}"
                proc = run_git(["for-each-ref", f"--format={fmt}", "refs/tags"], cwd=self.path)
                if proc.returncode != 0:
                    raise Unavailable(f"{self.path} is not a readable git repository")
                lines = proc.stdout
            tags: dict[str, str] = {}
            peeled: dict[str, str] = {}
            for line in lines.splitlines():
                parts = line.split(None, 1)  # ls-remote: "<sha>\t<ref>"; ours: "<sha> <ref>"
                if len(parts) != 2 or not parts[1].startswith("refs/tags/"):
                    continue
                sha, ref = parts
                name = ref.removeprefix("refs/tags/")
                if name.endswith("^{}"):
                    peeled[name[:-3]] = sha
                else:
                    tags[name] = sha
            self._tags = {name: peeled.get(name, sha) for name, sha in tags.items()}
        return self._tags

    def has_commit(self, sha: str) -> bool:
        """True if the commit is in the repository, False if the repository says it is not."""
        if self.path.is_dir() and self._local_has(sha):
            return True
        if not self.online:
            return False
        self._init_cache()
        # --filter=blob:none: the commit and its trees only; blobs come later, one by one, if a
        # file is read (a partial clone: git-clone(1) --filter, gitrepository-layout "promisor").
        proc = run_git(
            ["fetch", "-q", "--depth=1", "--filter=blob:none", "origin", sha], cwd=self.path
        )
        if proc.returncode == 0:
            return True
        text = proc.stderr
        if "not our ref" in text or "couldn't find remote ref" in text or "no such" in text:
            return False
        raise Unavailable(f"git fetch {self.url} {sha[:12]} failed: {_last_line(proc)}")

    def show(self, sha: str, path: str) -> str | None:
        """The text of `path` at commit `sha`, or None when the commit has no such file."""
        if not self.has_commit(sha):
            raise Unavailable(f"{self.url} has no commit {sha[:12]}")
        if run_git(["cat-file", "-e", f"{sha}:{path}"], cwd=self.path).returncode != 0:
            return None
        proc = run_git(["show", f"{sha}:{path}"], cwd=self.path)
        if proc.returncode != 0:
            raise Unavailable(f"cannot read {path} at {sha[:12]}: {_last_line(proc)}")
        return proc.stdout

    def _local_has(self, sha: str) -> bool:
        proc = run_git(["cat-file", "-e", f"{sha}^{{commit}}"], cwd=self.path)
        return proc.returncode == 0

    def _init_cache(self) -> None:
        if (self.path / "HEAD").is_file():
            return
        self.path.mkdir(parents=True, exist_ok=True)
        for args in (
            ["init", "-q", "--bare"],
            ["config", "core.repositoryformatversion", "1"],
            ["config", "extensions.partialClone", "origin"],
            ["remote", "add", "origin", self.url],
            ["config", "remote.origin.promisor", "true"],
            ["config", "remote.origin.partialclonefilter", "blob:none"],
        ):
            proc = run_git(args, cwd=self.path)
            if proc.returncode != 0:
                raise Unavailable(f"cannot set up {self.path}: {_last_line(proc)}")


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit {proc.returncode}"


# ---------------------------------------------------------------------------- index pages


@dataclass(frozen=True)
class DistFile:
    filename: str
    requires_python: str | None
    yanked: bool
    # the link as the page gives it (relative to the page), for PEP 658 metadata; not identity
    href: str = field(default="", compare=False)


class _AnchorParser(HTMLParser):
    """PEP 503: each file is an <a> whose text is the filename; PEP 503 data-requires-python and
    PEP 592 data-yanked ride along as attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.files: list[DistFile] = []
        self._attrs: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._attrs, self._text = dict(attrs), []

    def handle_data(self, data: str) -> None:
        if self._attrs is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._attrs is not None:
            href = self._attrs.get("href") or ""
            name = "".join(self._text).strip() or urllib.parse.unquote(
                href.split("#", 1)[0].rsplit("/", 1)[-1]
            )
            self.files.append(
                DistFile(
                    name,
                    self._attrs.get("data-requires-python"),
                    "data-yanked" in self._attrs,
                    href,
                )
            )
            self._attrs = None


def parse_index_page(body: str, content_type: str) -> list[DistFile]:
    """The files of a project page: PEP 691 JSON (application/vnd.pypi.simple.v1+json) or
    PEP 503 HTML."""
    if "json" in content_type:
        data = json.loads(body)
        return [
            DistFile(
                f["filename"], f.get("requires-python"), bool(f.get("yanked")), f.get("url", "")
            )
            for f in data.get("files", [])
        ]
    parser = _AnchorParser()
    parser.feed(body)
    return parser.files


class IndexSource:
    """Project pages of simple indexes: fetched (online) or read from saved files (offline)."""

    # PEP 691 content negotiation: JSON preferred, HTML accepted.
    ACCEPT = (
        "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
        "text/html;q=0.01"
    )

    def __init__(self, offline: Path | None) -> None:
        self.offline = offline
        self._cache: dict[str, list[DistFile]] = {}

    def page_url(self, index: str, project: str) -> str:
        return index.rstrip("/") + "/" + canonicalize_name(project) + "/"

    def files(self, index: str, project: str) -> list[DistFile]:
        url = self.page_url(index, project)
        if url not in self._cache:
            self._cache[url] = self._read(url)
        return self._cache[url]

    def metadata(self, index: str, project: str, file: DistFile) -> str:
        """A wheel's METADATA without downloading the wheel: PEP 658's `<file URL>.metadata`
        online, `<saved page folder>/<filename>.metadata` offline."""
        page = self.page_url(index, project)
        if self.offline is not None:
            saved = self.offline / url_path(page) / f"{file.filename}.metadata"
            if saved.is_file():
                return saved.read_text(encoding="utf-8")
            raise Unavailable(f"no saved metadata {saved}")
        url = urllib.parse.urljoin(page, (file.href or file.filename).split("#", 1)[0])
        try:
            with urllib.request.urlopen(url + ".metadata", timeout=60) as resp:  # noqa: S310
                return resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            raise Unavailable(f"GET {url}.metadata: HTTP {exc.code} (PEP 658)") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise Unavailable(f"GET {url}.metadata: {getattr(exc, 'reason', exc)}") from None

    def _read(self, url: str) -> list[DistFile]:
        if self.offline is not None:
            folder = self.offline / url_path(url)
            for name, ctype in (("index.json", "json"), ("index.html", "html")):
                if (folder / name).is_file():
                    return parse_index_page((folder / name).read_text(encoding="utf-8"), ctype)
            raise Unavailable(f"no saved page {folder}/index.json or index.html")
        req = urllib.request.Request(url, headers={"Accept": self.ACCEPT})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - https index
                ctype = resp.headers.get("Content-Type", "text/html")
                return parse_index_page(resp.read().decode("utf-8", "replace"), ctype)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []  # PEP 503: an unknown project has no page; it serves nothing
            raise Unavailable(f"GET {url}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise Unavailable(f"GET {url}: {getattr(exc, 'reason', exc)}") from None


def _supported_tags(python: str) -> set[Tag]:
    """Wheel tags pip accepts on CPython `python` on x86_64 Linux (any glibc manylinux)."""
    major, minor = (int(x) for x in python.split(".")[:2])
    platforms = [f"manylinux_2_{n}_x86_64" for n in range(45, 4, -1)] + [
        "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64",
    ]  # fmt: skip
    interp = f"cp{major}{minor}"
    return set(cpython_tags((major, minor), platforms=platforms)) | set(
        compatible_tags((major, minor), interpreter=interp, platforms=platforms)
    )


def parse_dist_filename(filename: str):
    """(name, version, wheel tags or None for an sdist) of a distribution file's name, or None
    where the name is neither a wheel's nor an sdist's."""
    try:
        if filename.endswith(".whl"):
            name, ver, _, tags = parse_wheel_filename(filename)
            return name, ver, tags
        name, ver = parse_sdist_filename(filename)
        return name, ver, None
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def match_files(
    files: Iterable[DistFile], project: str, version: str, python: str | None
) -> tuple[list[str], list[str]]:
    """(files that install `project==version` on `python`, other files of that version)."""
    spec = SpecifierSet(f"=={version}")
    tags = _supported_tags(python) if python else None
    fits, others = [], []
    for f in files:
        parsed = parse_dist_filename(f.filename)
        if parsed is None:
            continue
        name, ver, wtags = parsed
        if name != canonicalize_name(project) or not spec.contains(ver, prereleases=True):
            continue
        ok = tags is None or wtags is None or bool(wtags & tags)
        if ok and python and f.requires_python:
            try:
                ok = SpecifierSet(f.requires_python).contains(python, prereleases=True)
            except InvalidSpecifier:
                pass
        (fits if ok else others).append(f.filename + (" (yanked)" if f.yanked else ""))
    return fits, others


def legacy_a0_twin(files: Iterable[DistFile], project: str, version: str) -> str | None:
    """A version the page serves that differs from `version` only by a legacy `a0`
    (0.29.0a0+rocm10.1.0 vs 0.29+rocm10.1.0), which PEP 440 holds to be different versions."""
    try:
        want = Version(version)
    except InvalidVersion:
        return None
    for f in files:
        parsed = parse_dist_filename(f.filename)
        if parsed is None:
            continue
        name, ver, _ = parsed
        if (
            name == canonicalize_name(project)
            and {ver.pre, want.pre} == {None, LEGACY_A0}
            and Version(ver.base_version) == Version(want.base_version)
            and (ver.local, ver.post, ver.dev) == (want.local, want.post, want.dev)
        ):
            return str(ver)
    return None


# ---------------------------------------------------------------------------- sources


class Sources:
    """Where pins.check reads the truth: online, or from an offline folder (docs/pins.md)."""

    def __init__(self, offline: Path | None, cache: Path | None = None) -> None:
        self.offline = Path(offline) if offline else None
        self.cache = cache
        self.index = IndexSource(self.offline)
        self._repos: dict[str, GitRepo] = {}

    def describe(self, url: str) -> str:
        return url

    def repo(self, url: str) -> GitRepo:
        if url not in self._repos:
            rel = url_path(url)
            if self.offline is not None:
                bare = rel.with_name(rel.name.removesuffix(".git"))
                candidates = [self.offline / rel, self.offline / f"{bare}.git", self.offline / bare]
                path = next((p for p in candidates if p.is_dir()), None)
                if path is None:
                    raise Unavailable(f"no mirror at {self.offline / bare}(.git)")
                self._repos[url] = GitRepo(url, path, online=False)
            else:
                if shutil.which("git") is None:
                    raise Unavailable("git is not installed")
                base = self.cache or Path.cwd() / "build" / "pins-cache"
                name = rel.name if rel.name.endswith(".git") else f"{rel.name}.git"
                self._repos[url] = GitRepo(url, base / rel.with_name(name), online=True)
        return self._repos[url]


# ---------------------------------------------------------------------------- checks


def targets(recipes: Recipes, arch: str | None, stack: str | None) -> list[tuple[str, str]]:
    """(arch, stack) pairs to check: the given ones, else every arch of every stack."""
    stacks = [stack] if stack else list(recipes.stacks)
    out = []
    for s in stacks:
        if s not in recipes.stacks:
            raise UserError(f"unknown stack {s!r}; valid stacks: {', '.join(recipes.stacks)}")
        for a, spec in recipes.arches.items():
            if arch and a != arch:
                continue
            if any(selector_matches(sel, spec) for sel in recipes.stacks[s].arches):
                out.append((a, s))
    if arch and arch not in recipes.arches:
        raise UserError(f"unknown arch {arch!r}; valid arches: {', '.join(recipes.arches)}")
    if not out:
        raise UserError(f"stack {stack!r} is not for arch {arch!r}")
    return out


Verdict = tuple[str, str]  # (status, evidence)


@dataclass
class _Checker:
    recipes: Recipes
    sources: Sources
    python: str | None
    digest_of: Callable[[str], str | None]
    found: dict[tuple[Any, ...], Finding] = field(default_factory=dict)

    def add(
        self,
        key: tuple[Any, ...],
        used_by: str,
        pin: str,
        value: str,
        source: str,
        verdict: Callable[[], Verdict],
    ) -> None:
        """Judge a subject once, however many plans use it; remember every plan that does."""
        if key not in self.found:
            try:
                status, evidence = verdict()
            except Unavailable as exc:
                status, evidence = UNKNOWN, str(exc)
            self.found[key] = Finding(pin, value, source, status, evidence)
        if used_by not in self.found[key].used_by:
            self.found[key].used_by.append(used_by)

    # -- per plan

    def plan(self, plan: Plan) -> None:
        where = f"{plan.arch}/{plan.stack}"
        steps = [s for s in plan.steps if s.runs]
        aot = next((s for s in steps if "aotriton" in self.recipes.layers[s.layer].provides), None)
        python = self.python or distro_python(steps[0].base_ref if steps else "")
        for step in steps:
            self.step(step, where, python, aot)
            for line in step.floating:
                self.floating(step, line, where)

    def step(self, step: Step, where: str, python: str | None, aot: Step | None) -> None:
        layer = self.recipes.layers[step.layer]
        repo = step.pins.get("SOURCE_REPO")
        ref = step.pins.get("SOURCE_REF")
        tags = {"source.tag": layer.source.tag} if layer.source and layer.source.tag else {}
        for key, value in step.pins.items():
            kind, pin = pin_kind(key), f"{step.layer} {key}"
            if kind == "commit":
                self.add(
                    ("commit", repo, value),
                    where,
                    pin,
                    value,
                    repo or "-",
                    lambda repo=repo, value=value: self._commit(repo, value),
                )
            elif kind == "tag":
                tags[key] = value
            elif kind == "version" and _installs_from_index(step):
                self.wheel(step, where, pin, key, value, python)
        for key, tag in tags.items():
            self.add(
                ("tag", repo, tag, ref),
                where,
                f"{step.layer} {key}",
                tag,
                repo or "-",
                lambda tag=tag: self._tag(repo, tag, ref),
            )
        if layer.aotriton_for(step.variant):
            self.aotriton(step, where, aot)

    def wheel(
        self, step: Step, where: str, pin: str, key: str, version: str, python: str | None
    ) -> None:
        project = project_of(key)
        extra = self.recipes.arches[step.arch].therock_extra
        device = DEVICE_PACKAGES.get(project)
        wanted = [(project, pin, None)]
        if device and extra and extra in step.args.values():  # installs project[device-<arch>]
            wanted.append((device.format(arch=step.arch), f"{pin} [{extra}]", project))
        for index in step_indexes(step):
            if FROZEN_FAMILY_INDEX.match(index):
                self.add(("frozen-index", index), where, f"{step.layer} index", index, index,
                         lambda: (MISMATCH, FROZEN_WHY))  # fmt: skip
                continue
            for name, label, parent in wanted:
                page = self.sources.index.page_url(index, name)
                self.add(
                    ("wheel", page, version, python),
                    where,
                    label,
                    version,
                    page,
                    lambda i=index, n=name, p=parent: self._wheel(i, n, version, python, p),
                )

    def aotriton(self, step: Step, where: str, aot: Step | None) -> None:
        layer = self.recipes.layers[step.layer]
        version = layer.aotriton_for(step.variant) or ""
        pin = f"{step.layer} -> AOTriton"
        if layer.source is not None:  # a PyTorch source tree: its aotriton.cmake is the pin
            url, ref = step.pins["SOURCE_REPO"], step.pins["SOURCE_REF"]
            commit = aot.pins.get("SOURCE_REF") if aot else None
            aot_source = self.recipes.layers[aot.layer].source if aot else None
            tag = aot_source.tag if aot_source else None
            source = f"{url} {ref[:12]}:{aotriton_pin.CMAKE_FILE}"
            self.add(
                ("chain", url, ref, version, commit, tag),
                where,
                pin,
                version,
                source,
                lambda: self._chain_source(url, ref, version, commit, tag),
            )
        else:
            torch = step.pins.get("TORCH_VERSION")
            if torch:
                url = self._known_repo("pytorch") or PYTORCH_REPO
                try:
                    tag = f"v{Version(torch).base_version}"
                except InvalidVersion:
                    tag = f"v{torch}"
                source = f"{url} {tag}:{aotriton_pin.CMAKE_FILE}"
                self.add(
                    ("chain-wheel", url, tag, version),
                    where,
                    pin,
                    version,
                    source,
                    lambda: self._chain_wheel(url, tag, torch, version),
                )
        arch = self.recipes.arches[step.arch]
        url = self._known_repo("aotriton") or AOTRITON_REPO
        said = arch.aotriton is not None and version in arch.aotriton.experimental
        value = f"{version}: {'experimental' if said else 'not experimental'}"
        self.add(
            ("experimental", url, version, arch.name),
            where,
            f"arches.yaml {arch.name} aotriton.experimental",
            value,
            url,
            lambda: self._experimental(url, version, arch.name, said),
        )

    def floating(self, step: Step, line: str, where: str) -> None:
        key, _, why = line.partition(": ")
        if key == "BASE_IMAGE":
            ref = step.base_ref
            digest = self.digest_of(ref)
            hint = (
                f"pin to {digest}"
                if digest
                else (f"digest unknown here; read it with `docker buildx imagetools inspect {ref}`")
            )
            self.add(
                ("floating", ref),
                where,
                f"{step.layer} BASE_IMAGE",
                ref,
                "image registry",
                lambda: (FLOATING, f"a moving tag; {hint}"),
            )
        else:
            value = step.pins.get(key, "")
            self.add(
                ("floating", step.layer, key),
                where,
                f"{step.layer} {key}",
                value,
                "recipe",
                lambda: (FLOATING, why),
            )

    def _known_repo(self, component: str) -> str | None:
        """The repository of the recipes' source layer for a component, if there is one."""
        for layer in self.recipes.layers.values():
            if layer.source is None:
                continue
            if component == "aotriton" and "aotriton" in layer.provides:
                return layer.source.repo
            if component == "pytorch" and layer.aotriton and "torch" in layer.provides:
                return layer.source.repo
        return None

    # -- verdicts

    def _commit(self, url: str | None, sha: str) -> Verdict:
        if not url:
            raise Unavailable("no SOURCE_REPO names the repository of this commit")
        if self.sources.repo(url).has_commit(sha):
            return OK, "the commit exists"
        return MISSING, f"{url} has no commit {sha}"

    def _tag(self, url: str | None, tag: str, ref: str | None) -> Verdict:
        if not url:
            raise Unavailable("no SOURCE_REPO names the repository of this tag")
        tags = self.sources.repo(url).tags()
        if tag not in tags:
            return MISSING, f"{url} has no tag {tag}"
        if ref and tags[tag] != ref:
            return MISMATCH, f"tag {tag} points at {tags[tag]}, but the recipe builds {ref}"
        return OK, f"tag {tag} -> {tags[tag][:12]}" + (" = SOURCE_REF" if ref else "")

    def _wheel(
        self, index: str, project: str, version: str, python: str | None, parent: str | None
    ) -> Verdict:
        files = self.sources.index.files(index, project)
        fits, others = match_files(files, project, version, python)
        py = f"Python {python}" if python else "any Python (the base image's is unknown)"
        what = f"{project}=={version}" + (f" (the device package of {parent})" if parent else "")
        if fits:
            return OK, f"{what} for {py}: {fits[0]}"
        if others:
            return MISMATCH, f"{what} is served, not for {py} x86_64 Linux: {', '.join(others[:3])}"
        twin = legacy_a0_twin(files, project, version)
        if twin:
            return MISSING, (
                f"the index serves no {what}, but serves {project}=={twin}, the same build with "
                "or without the legacy a0 that TheRock strips from release versions: pin what "
                f"the index serves ({twin})"
            )
        return MISSING, f"the index serves no {what} ({len(files)} files on the page)"

    def _pytorch_pin(self, repo: GitRepo, sha: str) -> aotriton_pin.AotritonPin:
        """PyTorch's AOTriton pin at a commit, in either shape (attnforge/aotriton_pin.py)."""
        try:
            return aotriton_pin.pin_from(lambda rel: repo.show(sha, str(rel)), sha[:12])
        except aotriton_pin.AotritonPinError as exc:
            raise Unavailable(str(exc)) from None

    def _chain_source(
        self, url: str, ref: str, version: str, commit: str | None, tag: str | None
    ) -> Verdict:
        found = self._pytorch_pin(self.sources.repo(url), ref)
        wrong = []
        if found.version != version:
            wrong.append(f"PyTorch names AOTriton {found.version}, the recipe says {version}")
        if tag and found.version != tag:
            wrong.append(f"the aotriton layer's source.tag is {tag}")
        if commit and found.commit != commit:
            wrong.append(
                f"PyTorch pins AOTriton {found.commit}, the aotriton layer builds {commit}"
            )
        if wrong:
            return MISMATCH, "; ".join(wrong)
        return OK, f"names AOTriton {found.version} at {found.commit[:12]}"

    def _chain_wheel(self, url: str, tag: str, torch: str, version: str) -> Verdict:
        repo = self.sources.repo(url)
        sha = repo.tags().get(tag)
        if sha is None:
            raise Unavailable(
                f"{url} has no tag {tag}: cannot tell which AOTriton torch {torch} bundles"
            )
        found = self._pytorch_pin(repo, sha)
        if found.version != version:
            return MISMATCH, f"torch {tag} pins AOTriton {found.version}, the recipe says {version}"
        return OK, f"torch {tag} pins AOTriton {version}"

    def _experimental(self, url: str, version: str, arch: str, said: bool) -> Verdict:
        repo = self.sources.repo(url)
        sha = repo.tags().get(version)
        if sha is None:
            return MISSING, f"{url} has no tag {version}"
        for path in AOTRITON_UTIL:
            text = repo.show(sha, path)
            listed = experimental_arches(text) if text is not None else None
            if listed is None:
                continue
            names = ", ".join(sorted(listed)) or "no arch"
            upstream = f"{version}:{path} isArchExperimentallySupported(): {names}"
            if (arch in listed) != said:
                return MISMATCH, f"upstream disagrees: {upstream}"
            return OK, upstream
        raise Unavailable(
            f"no isArchExperimentallySupported() in {' or '.join(AOTRITON_UTIL)} at {version}"
        )


def experimental_arches(util_cc: str) -> set[str] | None:
    """The arches AOTriton's isArchExperimentallySupported() returns true for, read from
    util.cc; None when the file does not define it. Two shapes exist upstream:
    `vendor_arch == CAT32(GpuVendor::kAMD, 0x1151)` and `arch == "gfx950"`."""
    m = re.search(r"bool\s+isArchExperimentallySupported\s*\([^)]*\)\s*\{(.*?)\n\}", util_cc, re.S)
    if m is None:
        return None
    body = "\n".join(line.split("//", 1)[0] for line in m.group(1).splitlines())
    hexes = {f"gfx{h.lower()}" for h in re.findall(r"kAMD\s*,\s*0x([0-9a-fA-F]+)", body)}
    return hexes | set(re.findall(r'"(gfx[0-9a-z]+)"', body))


def project_of(key: str) -> str:
    """The index project a *_VERSION pin names: TORCH_VERSION -> torch, ROCM_VERSION -> rocm."""
    return key.removesuffix("_VERSION").lower().replace("_", "-")


def _installs_from_index(step: Step) -> bool:
    """A layer installs wheels when it names an index (a *_INDEX_URL) or takes a wheelhouse."""
    return step.wheelhouse or any(k.endswith("_INDEX_URL") for k in (*step.hint_args, *step.args))


def step_indexes(step: Step) -> list[str]:
    """The package indexes a layer installs from (its *_INDEX_URL values), else PyPI."""
    urls = [v for k, v in {**step.args, **step.hint_args}.items() if k.endswith("_INDEX_URL")]
    return [u for u in urls if u] or [PYPI_SIMPLE]


def distro_python(base_ref: str) -> str | None:
    """The Python version a known base image's distribution ships, or None."""
    name = base_ref.split("@", 1)[0]
    return DISTRO_PYTHON.get(name) or DISTRO_PYTHON.get(name.removeprefix("docker.io/library/"))


def engine_digest(engine: str = "docker") -> Callable[[str], str | None]:
    """The repo digest of a base image the engine has pulled (no network), if any: asked through
    engine.py (so DOCKER_HOST, the docker context and --engine podman count), connecting at the
    first question; no reachable engine knows no digest."""
    from ..engine import connect

    connected: dict[str, object] = {}

    def digest_of(ref: str) -> str | None:
        if "engine" not in connected:
            try:
                connected["engine"] = connect(engine)
            except UserError:
                connected["engine"] = None
        eng = connected["engine"]
        digests = eng.repo_digests(ref) if eng is not None else []
        return digests[0] if digests else None

    return digest_of


def check(
    recipes: Recipes,
    pairs: list[tuple[str, str]],
    sources: Sources,
    *,
    python: str | None = None,
    digest_of: Callable[[str], str | None] | None = None,
) -> list[Finding]:
    """Every distinct pin of the plans for (arch, stack) pairs, checked against `sources`; base
    image digests come from `digest_of` (default: the docker engine's, `engine_digest`)."""
    digest_of = digest_of or engine_digest("docker")
    checker = _Checker(recipes, sources, python, digest_of)
    for arch, stack in pairs:
        checker.plan(resolve(recipes, arch, stack, Options()))
    order = {s: i for i, s in enumerate((MISMATCH, MISSING, UNKNOWN, FLOATING, OK))}
    return sorted(checker.found.values(), key=lambda f: (order[f.status], f.pin, f.value))


def failed(findings: Iterable[Finding]) -> bool:
    return any(f.status in FAILING for f in findings)
