"""`invoke pins.update`: the newest pins a ROCm release channel's index serves, proposed for a
person to review and commit. Nothing here writes a file.

* stable: the newest ROCm release on the `stable` variants' index for which torch, torchvision
  and torchaudio builds with its local label (`+rocm10.1.0`) exist, as a unified diff of the
  recipe files' `stable:` variant blocks (only the quoted values on the pin lines change).
* nightly: the newest date (`10.2.0a20261120`, `+rocm10.2.0a20261120`) for which all of them
  exist, as the `--set` flags for `invoke build --stack nightly` (a recipe cannot pin a daily
  build: the nightly variants take those values with `from_set`).

Only versions with a wheel for the image's Python and, where the index has a page for it, the
arch's TheRock device package at the same version count. Index pages are read through pins.py
(`IndexSource`: online, or the saved pages of `--offline DIR`); a page that cannot be read is an
error, never a guess.

ROCm versions are compared as versions, never through the torch wheels' local labels: PEP 440
compares an alphanumeric local segment as a string, so `2.11.0+rocm7.14.0` sorts above
`2.11.0+rocm10.1.0` (the trap of ROCm/TheRock#7183).
"""

from __future__ import annotations

import difflib
import email.parser
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .. import yamlsrc
from ..errors import UserError, unknown
from ..recipes import Recipes, Variant
from .channels import CHANNELS, DEFAULT_ARCH
from .upstream import (
    DEVICE_PACKAGES,
    DistFile,
    IndexSource,
    Unavailable,
    distro_python,
    match_files,
    parse_dist_filename,
    project_of,
    url_path,
)

ROCM_LAYER, TORCH_LAYER = "rocm-sdk", "pytorch-wheels"
# pytorch.org's ROCm channel is one layer with top-level pins (recipes/layers/pytorch-org.yaml):
# torch and torchvision labelled with the index's ROCm minor (+rocm7.14) and the rocm meta
# package that torch requires (==7.14.*).
ORG = "pytorch-org"
ORG_INDEX_KEY = "TORCH_INDEX_URL"
VISION_KEY = "TORCHVISION_VERSION"
ROCM_KEY, TORCH_KEY = "ROCM_VERSION", "TORCH_VERSION"
# The `rocm` meta package carries the SDK's version; an index without a page for it is read
# through rocm-sdk-core, which every ROCm install pulls at the same version (TheRock RELEASES.md).
ROCM_PROJECTS = ("rocm", "rocm-sdk-core")
EXPECT_TORCH = "torch.version"
_DATE = re.compile(r"\d{8}")


@dataclass(frozen=True)
class Pick:
    """One pin's proposed value and the index file that shows it is served."""

    layer: str
    key: str
    project: str
    current: str | None  # the recipe's value (None for a nightly: given with --set)
    proposed: str
    file: str

    @property
    def changed(self) -> bool:
        return self.current != self.proposed


@dataclass
class Proposal:
    channel: str
    stack: str
    arch: str
    python: str
    indexes: dict[str, str]  # layer -> index URL
    rocm: str
    picks: list[Pick]
    expect: tuple[str, str] | None = None  # torch.version (current, proposed), stable only
    diff: str = ""  # stable only
    notes: list[str] = field(default_factory=list)

    @property
    def current(self) -> bool:
        """True when the recipes already pin what the index offers (stable)."""
        return not self.diff

    @property
    def set_flags(self) -> list[str]:
        return [f"--set {p.layer}.{p.key}={p.proposed}" for p in self.picks]

    @property
    def command(self) -> str:
        return " ".join(
            ["invoke build", f"--stack {self.stack}", f"--arch {self.arch}"] + self.set_flags
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "channel": self.channel,
            "stack": self.stack,
            "arch": self.arch,
            "python": self.python,
            "indexes": self.indexes,
            "rocm": self.rocm,
            "pins": [
                {
                    "layer": p.layer,
                    "key": p.key,
                    "project": p.project,
                    "current": p.current,
                    "proposed": p.proposed,
                    "file": p.file,
                }
                for p in self.picks
            ],
            "notes": self.notes,
        }
        if self.channel == "nightly":
            data["set"] = self.set_flags
            data["command"] = self.command
        else:
            data["current"] = self.current
            data["diff"] = self.diff
            data["expect"] = (
                {EXPECT_TORCH: {"current": self.expect[0], "proposed": self.expect[1]}}
                if self.expect
                else {}
            )
        return data


# ---------------------------------------------------------------------------- what the recipes say


@dataclass(frozen=True)
class _Layer:
    name: str
    index: str
    keys: list[str]  # the *_VERSION pins the channel's variant pins or takes with --set
    variant: Variant


def _channel_layer(recipes: Recipes, layer: str, channel: str) -> _Layer:
    spec = recipes.layers.get(layer)
    if spec is None or channel not in spec.variants:
        raise UserError(f"recipes/layers/{layer}.yaml has no {channel!r} variant to update")
    variant = spec.variants[channel]
    index = {**spec.hint_args, **spec.args, **variant.args, **variant.hint_args}.get(
        "ROCM_INDEX_URL"
    )
    if not index:
        raise UserError(f"the {channel!r} variant of {layer} names no ROCM_INDEX_URL to read")
    keys = [k for k in (*variant.pins, *variant.from_set) if k.endswith("_VERSION")]
    return _Layer(layer, index, list(dict.fromkeys(keys)), variant)


def _channel_stack(recipes: Recipes, channel: str) -> str:
    """The first stack that builds the channel's torch (`default` for stable)."""
    for name, stack in recipes.stacks.items():
        for entry in stack.entries():
            first = entry.variant[0] if isinstance(entry.variant, list) else entry.variant
            if entry.layer == TORCH_LAYER and first == channel:
                return name
    raise UserError(f"no stack in recipes/stacks.yaml uses {TORCH_LAYER}:{channel}")


# ---------------------------------------------------------------------------- reading the index


def by_version(files: list[DistFile], project: str) -> dict[Version, list[DistFile]]:
    """The page's files of `project`, grouped by version; yanked files do not count (PEP 592:
    an installer skips them unless pinned exactly, and a proposal should not pin one)."""
    out: dict[Version, list[DistFile]] = {}
    for f in files:
        if f.yanked:
            continue
        parsed = parse_dist_filename(f.filename)
        if parsed is None:
            continue
        name, version, _ = parsed
        if name == project:
            out.setdefault(version, []).append(f)
    return out


def fitting(files: list[DistFile], project: str, python: str) -> dict[Version, str]:
    """version -> a file of it that installs on `python` (x86_64 Linux), as pins.check judges."""
    out = {}
    for version, group in by_version(files, project).items():
        fits, _ = match_files(group, project, str(version), python)
        if fits:
            out[version] = fits[0]
    return out


class _Reader:
    def __init__(self, index: IndexSource, channel: str) -> None:
        self.index, self.channel = index, channel

    def failed(self, exc: Unavailable) -> UserError:
        return UserError(
            f"cannot read the {self.channel} index, so nothing is proposed: {exc}",
            hint="run it where the index is reachable, or pass --offline DIR with saved pages "
            "(docs/pins.md)",
        )

    def files(self, url: str, project: str) -> list[DistFile]:
        try:
            return self.index.files(url, project)
        except Unavailable as exc:
            raise self.failed(exc) from None

    def rocm_page(self, url: str) -> tuple[str, list[DistFile]]:
        """(project, files) of the ROCm SDK's version: the rocm page, else rocm-sdk-core's."""
        first: Unavailable | None = None
        for project in ROCM_PROJECTS:
            try:
                files = self.index.files(url, project)
            except Unavailable as exc:
                first = first or exc
                continue
            if files:
                return project, files
        if first is not None:  # a page that could not be read may be the one with the versions
            raise self.failed(first)
        return ROCM_PROJECTS[0], []

    def device(self, url: str, project: str, notes: list[str]) -> set[Version] | None:
        """The versions of a device package, or None when the index has no page for it (then it
        is not a condition; said in the notes)."""
        try:
            files = self.index.files(url, project)
        except Unavailable as exc:
            if self.index.offline is None:  # online, a failed read is not "no page"
                raise self.failed(exc) from None
            notes.append(f"{project} is not saved in the offline folder: not checked ({exc})")
            return None
        if not files:
            notes.append(f"the index has no {project} page: not checked")
            return None
        return set(by_version(files, project))


# ---------------------------------------------------------------------------- choosing


def _rocm_key(version: Version, channel: str) -> tuple[Any, ...] | None:
    """Sort key of a ROCm version of the channel, None for one the channel does not publish:
    stable takes releases (10.1.0: no pre-, dev- or local part), nightly the dated alphas
    TheRock publishes (10.2.0a20261120), newest date first."""
    if version.local or version.is_devrelease or version.is_postrelease:
        return None
    if channel == "stable":
        return None if version.is_prerelease else (version,)
    pre = version.pre
    if pre is None or pre[0] != "a" or not _DATE.fullmatch(str(pre[1])):
        return None
    return (pre[1], version)


def torch_branch_of(recipes: Recipes) -> str:
    """The torch branch the nightly stack follows: the stable channel's torch line (the nightly
    stack is the default stack on a nightly), as Quartz names it (release/2.14)."""
    stable = recipes.layers[TORCH_LAYER].variants.get("stable")
    version = Version((stable.pins if stable else {}).get(TORCH_KEY, "0"))
    return f"release/{version.major}.{version.minor}"


def read_feed(offline: Path | None, *, days: int = 21) -> list[tuple[str, dict[str, Any]]] | None:
    """The Quartz nightly status files, newest first, as (where, content): saved under
    OFFLINE/raw.githubusercontent.com/ROCm/Quartz/main/release-nightly/<date>/status.json, or
    fetched (latest.json, then the `days` dates before it). None when an offline folder has no
    saved feed."""
    from . import quartz

    found = []
    if offline is not None:
        folder = offline / url_path(quartz.FEED)
        if not folder.is_dir():
            return None
        for path in sorted(folder.glob("*/status.json"), reverse=True):
            found.append(
                (str(path), quartz.parse_status(path.read_text(encoding="utf-8"), str(path)))
            )
        return found
    import datetime
    import urllib.error
    import urllib.request

    def get(url: str) -> str | None:
        try:
            with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - https feed
                return resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise UserError(f"GET {url}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise UserError(f"GET {url}: {getattr(exc, 'reason', exc)}") from None

    latest = (get(quartz.FEED + "latest.json") or "").strip()
    if not _DATE.match(latest):
        raise UserError(f"{quartz.FEED}latest.json does not name a nightly: {latest[:80]!r}")
    newest = datetime.date(int(latest[:4]), int(latest[4:6]), int(latest[6:8]))
    for back in range(days):
        date = (newest - datetime.timedelta(days=back)).strftime("%Y%m%d")
        url = f"{quartz.FEED}{date}/status.json"
        text = get(url)
        if text is not None:
            found.append((url, quartz.parse_status(text, url)))
    return found


def propose(
    recipes: Recipes,
    channel: str,
    index: IndexSource,
    *,
    python: str | None = None,
    arch: str | None = None,
    feed: list[tuple[str, dict[str, Any]]] | None = None,
    torch_branch: str | None = None,
    feed_problem: str = "none saved under --offline",
) -> Proposal:
    """The newest complete set of pins the channel's index serves, with a diff of the recipes
    (stable, pytorch-org) or the --set flags (nightly). Reads index pages only; writes nothing."""
    if channel not in CHANNELS:
        raise UserError(f"--channel {channel!r}: expected one of {', '.join(CHANNELS)}")
    arch = arch or DEFAULT_ARCH
    if arch not in recipes.arches:
        raise unknown("arch", arch, recipes.arches)
    stack = _org_stack(recipes) if channel == ORG else _channel_stack(recipes, channel)
    python = _stack_python(recipes, stack, python)
    if channel == ORG:
        return _propose_org(recipes, stack, index, python, arch)
    search = _Search(recipes, channel, index, python, arch)
    if channel == "nightly":
        search.trust_feed(feed, torch_branch or torch_branch_of(recipes), feed_problem)
    proposal = search.first_complete(stack)
    if channel == "stable":
        _stable_diff(recipes, proposal)
    return proposal


class _Search:
    """One channel's search for the newest ROCm release (or nightly) for which every pinned
    wheel is on the index, in steps: the ROCm versions, the Quartz records (nightly), then
    each version newest first until one is complete."""

    def __init__(
        self, recipes: Recipes, channel: str, index: IndexSource, python: str, arch: str
    ) -> None:
        self.channel, self.python, self.arch = channel, python, arch
        self.rocm_layer = _channel_layer(recipes, ROCM_LAYER, channel)
        self.torch_layer = _channel_layer(recipes, TORCH_LAYER, channel)
        if ROCM_KEY not in self.rocm_layer.keys or TORCH_KEY not in self.torch_layer.keys:
            raise UserError(
                f"the {channel!r} variants must pin (or take with --set) {ROCM_LAYER}.{ROCM_KEY} "
                f"and {TORCH_LAYER}.{TORCH_KEY}"
            )
        self.reader = _Reader(index, channel)
        self.notes: list[str] = []
        self.extra = recipes.arches[arch].therock_extra
        if self.extra is None:
            self.notes.append(f"{arch} has no TheRock device extra: device packages not checked")
        self.rocm_project, files = self.reader.rocm_page(self.rocm_layer.index)
        self.rocms = fitting(files, self.rocm_project, python)
        self.rocm_device = self.device(self.rocm_layer, "rocm")
        # torch first: the companions are paired with it by their shared local label.
        self.keys = [TORCH_KEY, *(k for k in self.torch_layer.keys if k != TORCH_KEY)]
        self.builds = {
            k: by_version(self.reader.files(self.torch_layer.index, project_of(k)), project_of(k))
            for k in self.keys
        }
        self.device_of = {TORCH_KEY: self.device(self.torch_layer, "torch")}
        self.feed_used = False
        self.trusted: dict[Version, str] = {}
        self.refused: dict[Version, str] = {}
        self.torch_release: tuple[int, ...] | None = None

    def device(self, layer: _Layer, project: str) -> set[Version] | None:
        pattern = DEVICE_PACKAGES.get(project)
        if self.extra is None or pattern is None:
            return None
        return self.reader.device(layer.index, pattern.format(arch=self.arch), self.notes)

    def trust_feed(self, feed, branch: str, problem: str) -> None:
        """nightly: only dates whose Quartz record says the PyTorch build and the arch's tests
        of the stack's torch branch passed (attnforge/pins/quartz.py), and only that branch's
        torch."""
        from . import quartz

        if feed is None:
            self.notes.append(f"no Quartz feed was read ({problem}): the newest nightly on the "
                              "index is proposed, not one AMD's feed shows tested")  # fmt: skip
            return
        self.feed_used = True
        if branch.startswith("release/"):
            self.torch_release = tuple(int(x) for x in branch.removeprefix("release/").split("."))
        for where, status in feed:
            v = quartz.judge(status, self.arch, branch, self.python)
            try:
                rocm = Version(v.rocm)
            except InvalidVersion:
                continue
            if v.ok:
                self.trusted.setdefault(rocm, f"{where}: {v.why}")
            else:
                self.refused.setdefault(rocm, f"Quartz {v.date}: {v.why}")

    def candidates(self) -> list[Version]:
        """The channel's ROCm versions, newest first; a stable search says why pre-releases
        newer than every release lost."""
        keyed = [(key, v) for v in self.rocms if (key := _rocm_key(v, self.channel)) is not None]
        if self.channel == "stable":
            top = max((k[0] for k, _ in keyed), default=None)
            pres = sorted(v for v in self.rocms if v.is_prerelease and (top is None or v > top))
            if pres:
                self.notes.append(
                    f"not releases, so not proposed: ROCm {', '.join(map(str, pres))}"
                )
        return [v for _, v in sorted(keyed, reverse=True)]

    def why_not(self, rocm: Version) -> str | None:
        if self.feed_used and rocm not in self.trusted:
            return f"ROCm {rocm}: {self.refused.get(rocm, 'not in the Quartz feed')}"
        if self.rocm_device is not None and rocm not in self.rocm_device:
            return f"ROCm {rocm}: no {DEVICE_PACKAGES['rocm'].format(arch=self.arch)} {rocm}"
        return None

    def pair(
        self, key: str, torch: Version, fits: dict[Version, str]
    ) -> tuple[Version, str] | None:
        """The newest build of a companion whose wheel's Requires-Dist admits `torch`; None
        where a wheel's metadata (PEP 658) cannot be read: the pairing is then left to a note."""
        project, index = project_of(key), self.torch_layer.index
        files = {f.filename: f for f in self.reader.files(index, project)}

        def requires(version: Version) -> SpecifierSet | None:
            return torch_requirement(
                self.reader.index.metadata(index, project, files[fits[version]])
            )

        try:
            chosen, passed = vision_for(torch, list(fits), requires)
        except Unavailable:
            return None
        if chosen is None:
            return None
        why = f"; passed over: {'; '.join(passed)}" if passed else ""
        return (
            chosen,
            f"{project} {chosen} chosen by its wheel's Requires-Dist (admits torch {torch}){why}",
        )

    def first_complete(self, stack: str) -> Proposal:
        skipped: list[str] = []
        for rocm in self.candidates():
            why = self.why_not(rocm)
            chosen, why_builds, found = ({}, None, []) if why else _builds_for(
                f"rocm{rocm}", self.keys, self.builds, self.device_of, self.python, self.arch,
                self.torch_release, self.pair,
            )  # fmt: skip
            if why or why_builds:
                skipped.append(why or f"ROCm {rocm}: {why_builds}")
                continue
            return self.proposal(stack, rocm, chosen, found, skipped)
        raise self.nothing_complete(skipped)

    def proposal(self, stack, rocm, chosen, found, skipped) -> Proposal:
        kinds = "releases" if self.channel == "stable" else "nightlies"
        notes = self.notes
        if skipped:
            notes.insert(0, f"newer {kinds} skipped: " + "; ".join(skipped))
        notes.extend(found)
        if rocm in self.trusted:
            notes.append(f"trusted the Quartz record {self.trusted[rocm]}")
        rocm_file = self.rocms[rocm]
        picks = [
            _pick(self.rocm_layer, ROCM_KEY, self.rocm_project, str(rocm), rocm_file, self.channel),
            *(
                _pick(self.torch_layer, k, project_of(k), str(v), f, self.channel)
                for k, (v, f) in chosen.items()
            ),
        ]
        return Proposal(
            channel=self.channel, stack=stack, arch=self.arch, python=self.python,
            indexes={ROCM_LAYER: self.rocm_layer.index, TORCH_LAYER: self.torch_layer.index},
            rocm=str(rocm), picks=picks, notes=notes,
        )  # fmt: skip

    def nothing_complete(self, skipped: list[str]) -> UserError:
        kind = "release" if self.channel == "stable" else "nightly"
        device_note = f" and {self.arch}'s device packages" if self.extra else ""
        names = ", ".join([self.rocm_project, *(project_of(k) for k in self.torch_layer.keys)])
        why = (
            f" ({'; '.join(skipped[:3])})"
            if skipped
            else f" (its {self.rocm_project} page lists no ROCm {kind})"
        )
        return UserError(
            f"the {self.channel} index {self.torch_layer.index} has no ROCm {kind} with {names} "
            f"for Python {self.python}{device_note}{why}"
        )


def _stack_python(recipes: Recipes, stack: str, python: str | None) -> str:
    if python is None:
        base = recipes.stacks[stack].base_image
        python = distro_python(base)
        if python is None:
            raise UserError(
                f"cannot tell the Python of stack {stack}'s base image {base}; pass --python 3.X"
            )
    elif not re.fullmatch(r"3\.\d+", python):
        raise UserError(f"--python {python!r}: expected a CPython version such as 3.12")
    return python


# ---------------------------------------------------------------------------- torchvision


def torch_requirement(metadata: str) -> SpecifierSet | None:
    """What a wheel's METADATA (`Requires-Dist: torch (>=2.14.0)`) asks of torch on Linux, or
    None where it names no torch."""
    message = email.parser.HeaderParser().parsestr(metadata)
    for line in message.get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != "torch":
            continue
        env = {"platform_system": "Linux", "sys_platform": "linux", "extra": ""}
        if req.marker is None or req.marker.evaluate(env):
            return req.specifier
    return None


def vision_for(
    torch: Version, candidates: list[Version], requires: Callable[[Version], SpecifierSet | None]
) -> tuple[Version | None, list[str]]:
    """The newest torchvision whose own wheel admits `torch` (its `Requires-Dist: torch`), and
    why each newer one was passed over. No version formula: torchvision 0.29.1 and 0.29.2
    (stable ABI, `torch>=2.14.0`) serve torch 2.14 and 2.15 alike, and no 0.30 exists on PyPI for
    torch 2.15.0 (PyPI, read 2026-12-04)."""
    passed = []
    for version in sorted(candidates, reverse=True):
        spec = requires(version)
        if spec is not None and spec.contains(torch, prereleases=True):
            return version, passed
        passed.append(
            f"{version} requires torch{spec}" if spec else f"{version} names no torch requirement"
        )
    return None, passed


# ---------------------------------------------------------------------------- pytorch.org


@dataclass(frozen=True)
class _OrgBlock:
    """One set of pins of the pytorch-org layer: its own (where=()) or a variant's."""

    name: str  # pytorch-org, or pytorch-org:<variant>
    where: tuple[str, ...]
    url: str
    pins: dict[str, str]
    expect: str | None  # torch.version where this block states it


def _org_stack(recipes: Recipes) -> str:
    for name, stack in recipes.stacks.items():
        if any(entry.layer == ORG for entry in stack.entries()):
            return name
    raise UserError(f"no stack in recipes/stacks.yaml uses the {ORG} layer")


def org_blocks(recipes: Recipes) -> list[_OrgBlock]:
    """The layer's own pins, then each variant that pins its own (torch 2.15's)."""
    layer, keys = recipes.layers[ORG], (TORCH_KEY, VISION_KEY, ROCM_KEY)
    shared = {**layer.args, **layer.hint_args}
    sets = [(ORG, (), shared, layer.pins, layer.expect)] if layer.pins else []
    sets += [
        (f"{ORG}:{name}", ("variants", name), {**shared, **v.args, **v.hint_args}, v.pins, v.expect)
        for name, v in layer.variants.items()
        if v.pins
    ]
    blocks = []
    for name, where, args, pins, expect in sets:
        missing = [k for k in keys if k not in pins]
        if not args.get(ORG_INDEX_KEY) or missing:
            block = ".".join(("recipes/layers/pytorch-org.yaml", *where[1:]))
            raise UserError(f"{block} must name {ORG_INDEX_KEY} and pin {', '.join(keys)}")
        blocks.append(_OrgBlock(name, where, args[ORG_INDEX_KEY], dict(pins),
                                expect.get(EXPECT_TORCH)))  # fmt: skip
    if not blocks:
        raise UserError(f"recipes/layers/{ORG}.yaml pins no torch")
    return blocks


def _org_releases(reader: _Reader, url: str, project: str, python: str, keep) -> dict[Version, str]:
    found = fitting(reader.files(url, project), project, python)
    return {v: f for v, f in found.items() if not (v.is_prerelease or v.is_devrelease) and keep(v)}


def _org_torch(reader: _Reader, block: _OrgBlock, python: str) -> tuple[Version, str, list[str]]:
    """The newest torch of the block's release line (2.14.x) with its label (+rocm7.14); a
    newer line on the index is named, not proposed: it is a variant of its own."""
    current = _version(block, TORCH_KEY)
    label, line = current.local, current.release[:2]
    torches = _org_releases(reader, block.url, "torch", python, lambda v: v.local == label)
    ours = {v: f for v, f in torches.items() if v.release[:2] == line}
    if not ours:
        raise UserError(
            f"the {ORG} index {block.url} has no torch {line[0]}.{line[1]}.x +{label} for "
            f"Python {python}"
        )
    newer = sorted({v.release[:2] for v in torches if v.release[:2] > line})
    notes = [
        f"{block.name}: the index also serves torch {', '.join('.'.join(map(str, n)) for n in newer)}"
        f" +{label}; a newer torch line is a variant of its own (recipes/layers/{ORG}.yaml)"
    ] if newer else []  # fmt: skip
    torch = max(ours)
    return torch, ours[torch], notes


def _org_vision(
    reader: _Reader, block: _OrgBlock, torch: Version, python: str
) -> tuple[Version, str, list[str]]:
    """The newest torchvision +label whose wheel's Requires-Dist admits the proposed torch."""
    label = torch.local
    found = _org_releases(reader, block.url, "torchvision", python, lambda v: v.local == label)
    files = {f.filename: f for f in reader.files(block.url, "torchvision")}

    def requires(version: Version) -> SpecifierSet | None:
        try:
            return torch_requirement(
                reader.index.metadata(block.url, "torchvision", files[found[version]])
            )
        except Unavailable as exc:
            raise reader.failed(exc) from None

    vision, passed = vision_for(torch, list(found), requires)
    if vision is None:
        why = f" ({'; '.join(passed[:3])})" if passed else ""
        raise UserError(
            f"the {ORG} index {block.url} has no torchvision +{label} for Python {python} whose "
            f"Requires-Dist admits torch {torch}{why}"
        )
    notes = (
        [f"{block.name}: torchvision {'; '.join(passed)}: not for torch {torch}"] if passed else []
    )
    return vision, found[vision], notes


def _org_rocm(reader: _Reader, block: _OrgBlock, python: str) -> tuple[Version, str, list[str]]:
    """The newest republication (.postN) of the pinned rocm release; other patch releases the
    label would take (7.14.1) are named, not proposed: which one torch runs on is the recipe's
    decision (its comments say why)."""
    current = _version(block, ROCM_KEY)
    release = current.release
    rocms = _org_releases(reader, block.url, "rocm", python,
                          lambda v: v.release == release and not v.local)  # fmt: skip
    if not rocms:
        raise UserError(
            f"the {ORG} index {block.url} no longer serves rocm {current.base_version} "
            "(nor a .postN of it)"
        )
    others = sorted(
        v
        for v in _org_releases(
            reader,
            block.url,
            "rocm",
            python,
            lambda v: v.release[:2] == release[:2] and not v.local,
        )  # fmt: skip
        if v.release != release
    )
    notes = [
        f"not proposed: rocm {', '.join(map(str, others))}, other releases torch "
        f"+{_version(block, TORCH_KEY).local} would take; pinning one is a decision for the "
        "recipe (its comments), after a validation run"
    ] if others else []  # fmt: skip
    rocm = max(rocms)
    return rocm, rocms[rocm], notes


def _version(block: _OrgBlock, key: str) -> Version:
    try:
        return Version(block.pins[key])
    except InvalidVersion as exc:
        raise UserError(f"recipes/layers/{ORG}.yaml {block.name} {key}: {exc}") from None


def _propose_org(
    recipes: Recipes, stack: str, index: IndexSource, python: str, arch: str
) -> Proposal:
    """Per block of the pytorch-org layer: the newest torch of its line and label, the newest
    torchvision that admits it, the newest .postN of its rocm; one diff of the layer file."""
    reader = _Reader(index, ORG)
    picks: list[Pick] = []
    notes: list[str] = []
    rocms, indexes = [], {}
    for block in org_blocks(recipes):
        torch, torch_file, torch_notes = _org_torch(reader, block, python)
        vision, vision_file, vision_notes = _org_vision(reader, block, torch, python)
        rocm, rocm_file, rocm_notes = _org_rocm(reader, block, python)
        notes += torch_notes + vision_notes + rocm_notes
        rocms.append(str(rocm))
        indexes[block.name] = block.url
        picks += [
            Pick(block.name, TORCH_KEY, "torch", block.pins[TORCH_KEY], str(torch), torch_file),
            Pick(block.name, VISION_KEY, "torchvision", block.pins[VISION_KEY], str(vision),
                 vision_file),
            Pick(block.name, ROCM_KEY, "rocm", block.pins[ROCM_KEY], str(rocm), rocm_file),
        ]  # fmt: skip
    proposal = Proposal(channel=ORG, stack=stack, arch=arch, python=python, indexes=indexes,
                        rocm=", ".join(dict.fromkeys(rocms)), picks=picks, notes=notes)  # fmt: skip
    _org_diff(recipes, proposal)
    return proposal


def _new_expect(expect: str, current: str | None, proposed: str) -> str:
    """validate/expect.py matches torch.version as a prefix: a prefix the new torch still starts
    with stays, a full version (or a stale prefix) follows the pin."""
    return expect if expect != current and proposed.startswith(expect) else proposed


def _org_diff(recipes: Recipes, proposal: Proposal) -> None:
    edits: dict[tuple[str, ...], dict[tuple[str, str], str]] = {}
    for block in org_blocks(recipes):
        mine = [p for p in proposal.picks if p.layer == block.name]
        changes = {("pins", p.key): p.proposed for p in mine if p.changed}
        torch = next(p for p in mine if p.key == TORCH_KEY)
        if isinstance(block.expect, str):
            new = _new_expect(block.expect, torch.current, torch.proposed)
            proposal.expect = proposal.expect or (block.expect, new)
            if new != block.expect:
                changes[("expect", EXPECT_TORCH)] = new
        if changes:
            edits[block.where] = changes
    if edits:
        rel = recipes.layer_files[ORG]
        old, new_text = edit_blocks(recipes.root / rel, rel, edits)
        proposal.diff = _unified(old, new_text, rel)


def _unified(old: str, new: str, rel: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True),
            fromfile=f"a/{rel}", tofile=f"b/{rel}",
        )
    )  # fmt: skip


def _builds_for(
    label: str,
    keys: list[str],
    builds: dict[str, dict[Version, list[DistFile]]],
    device_of: dict[str, set[Version] | None],
    python: str,
    arch: str,
    torch_release: tuple[int, ...] | None = None,
    pair: Callable[[str, Version, dict[Version, str]], tuple[Version, str] | None] | None = None,
) -> tuple[dict[str, tuple[Version, str]], str | None, list[str]]:
    """For one ROCm label (rocm10.1.0): key -> (the newest version of its project with that
    local label that fits, a file of it); else why not; and notes on ambiguous pairings. Where
    a companion has several builds, `pair(key, torch, fits)` may choose by the wheels' own
    Requires-Dist: (version, note), or None where their metadata cannot be read."""
    chosen: dict[str, tuple[Version, str]] = {}
    notes = []
    for key in keys:
        project = project_of(key)
        labelled = {v: g for v, g in builds[key].items() if v.local == label}
        if key == TORCH_KEY and torch_release is not None:
            labelled = {v: g for v, g in labelled.items() if v.release[:2] == torch_release}
            if not labelled:
                line = ".".join(map(str, torch_release))
                return chosen, f"no {project} {line} +{label}", notes
        if not labelled:
            return chosen, f"no {project} +{label}", notes
        fits = {}
        for version, group in labelled.items():
            ok, _ = match_files(group, project, str(version), python)
            if ok:
                fits[version] = ok[0]
        if not fits:
            return chosen, f"no {project} +{label} for Python {python}", notes
        allowed = device_of.get(key)
        if allowed is not None:
            fits = {v: f for v, f in fits.items() if v in allowed}
            if not fits:
                package = DEVICE_PACKAGES[project].format(arch=arch)
                return chosen, f"no {project} +{label} with {package}", notes
        newest = max(fits)
        chosen[key] = (newest, fits[newest])
        paired = pair(key, chosen[TORCH_KEY][0], fits) if pair and key != TORCH_KEY else None
        if paired is not None and len(fits) > 1:
            chosen[key] = (paired[0], fits[paired[0]])
            notes.append(paired[1])
        elif key != TORCH_KEY and len(fits) > 1:
            others = ", ".join(str(v) for v in sorted(fits) if v != newest)
            notes.append(
                f"ambiguous: {project} has {len(fits)} builds for +{label} ({others} besides "
                f"{newest}); proposing the newest: confirm that {newest} was built for torch "
                f"{chosen[TORCH_KEY][0]} (its wheel's Requires-Dist)"
            )
    return chosen, None, notes


def _pick(layer: _Layer, key: str, project: str, version: str, file: str, channel: str) -> Pick:
    current = layer.variant.pins.get(key) if channel == "stable" else None
    return Pick(layer.name, key, project, current, version, file)


# ---------------------------------------------------------------------------- the diff


def _replace_value(line: str, key: str, value: str) -> str | None:
    """`  KEY: "old"  # why` with the new value, quoting and comment kept; None if not that
    shape."""
    m = re.fullmatch(
        rf"(\s*['\"]?{re.escape(key)}['\"]?\s*:\s*)(['\"]?)([^'\"#\s]*)\2(\s*(?:#.*)?)(\r?\n?)",
        line,
    )
    if m is None:
        return None
    quote = m.group(2) or '"'  # an unquoted value is quoted: 10.10 must not read as a float
    return f"{m.group(1)}{quote}{value}{quote}{m.group(4)}{m.group(5)}"


def edit_variant(
    path: Path, rel: str, channel: str, changes: dict[tuple[str, str], str]
) -> tuple[str, str]:
    """(old text, new text) of a layer file with values of the `channel` variant replaced:
    changes maps (section, key) -> value, e.g. ("pins", "TORCH_VERSION"). Only those lines
    change; the result is read back to prove it says what was meant."""
    return edit_layer(path, rel, ("variants", channel), changes)


def edit_layer(
    path: Path, rel: str, where: tuple[str, ...], changes: dict[tuple[str, str], str]
) -> tuple[str, str]:
    """edit_variant for any block of a layer file: `where` is the path to the block holding
    the sections (("variants", "stable"), or () for the layer's own pins)."""
    return edit_blocks(path, rel, {where: changes})


def edit_blocks(
    path: Path, rel: str, edits: dict[tuple[str, ...], dict[tuple[str, ...], str]]
) -> tuple[str, str]:
    """(old text, new text) of a layer file with the values of several blocks replaced (block
    path -> key path within it, ("pins", "TORCH_VERSION") or ("aotriton",) -> value); only
    those lines change, and the result is read back to prove it says what was meant."""
    src = yamlsrc.load(path, rel)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    for where, changes in edits.items():
        for keys, value in changes.items():
            number = src.lines.get((*where, *keys))
            new = _replace_value(lines[number - 1], keys[-1], value) if number else None
            if new is None:
                raise UserError(
                    f"{rel}:{number or '?'}: cannot edit {_shown(where, *keys)} as one "
                    f"line; set it to {value!r} by hand"
                )
            lines[number - 1] = new
    edited = "".join(lines)
    data = yaml.safe_load(edited)
    for where, changes in edits.items():
        for keys, value in changes.items():
            block = data
            for part in (*where, *keys):
                block = block[part]
            if block != value:
                raise UserError(f"{rel}: editing {_shown(where, *keys)} went wrong; set it by hand")
    return text, edited


def _shown(where: tuple[str, ...], *keys: str) -> str:
    return ".".join(filter(None, (*where[1:], *keys)))


def _stable_diff(recipes: Recipes, proposal: Proposal) -> None:
    edits: dict[str, dict[tuple[str, str], str]] = {}
    for p in proposal.picks:
        if p.changed:
            edits.setdefault(p.layer, {})[("pins", p.key)] = p.proposed
    torch = next(p for p in proposal.picks if p.key == TORCH_KEY)
    expect = recipes.layers[TORCH_LAYER].variants[proposal.channel].expect.get(EXPECT_TORCH)
    if isinstance(expect, str):
        new = _new_expect(expect, torch.current, torch.proposed)
        proposal.expect = (expect, new)
        if new != expect:
            edits.setdefault(TORCH_LAYER, {})[("expect", EXPECT_TORCH)] = new
    chunks = []
    for layer in (ROCM_LAYER, TORCH_LAYER):
        if layer in edits:
            rel = recipes.layer_files[layer]
            old, new_text = edit_variant(recipes.root / rel, rel, proposal.channel, edits[layer])
            chunks.append(_unified(old, new_text, rel))
    proposal.diff = "".join(chunks)


# ---------------------------------------------------------------------------- for people


def reminders(proposal: Proposal, recipes: Recipes) -> list[str]:
    """What the index cannot tell: the AOTriton the proposed torch bundles, and prose that names
    the old release."""
    torch = next(p for p in proposal.picks if p.key == TORCH_KEY)
    out = []
    if proposal.channel == ORG:
        return _org_reminders(proposal, recipes)
    variant = recipes.layers[TORCH_LAYER].variants[proposal.channel]
    aot = recipes.layers[TORCH_LAYER].aotriton_for(proposal.channel)
    if proposal.channel == "stable":
        if torch.changed:
            out.append(
                f"re-check the AOTriton torch {torch.proposed} bundles: the stable variant says "
                f'aotriton: "{aot}"; after applying, `invoke pins.check --stack {proposal.stack}` '
                "reads it from PyTorch's release tag, and arches.yaml's experimental facts "
                "follow it"
            )
        if proposal.expect and proposal.expect[0] != proposal.expect[1]:
            out.append(
                f'expect {EXPECT_TORCH}: "{proposal.expect[0]}" -> "{proposal.expect[1]}" '
                "(in the diff)"
            )
        if not proposal.current:
            out.append(
                "the comments in the stable blocks and the layers' `follows:` may name the old "
                "release: edit them by hand"
            )
    else:
        out.append(
            f'the nightly variant says its torch bundles AOTriton "{aot}"; a nightly torch may '
            "carry a newer one: check its validation report (`invoke validate`)"
            if aot
            else "the AOTriton a nightly torch bundles is not checked"
        )
        if variant.pins:
            out.append(f"the nightly variant also pins {', '.join(variant.pins)}")
    return out


def _org_reminders(proposal: Proposal, recipes: Recipes) -> list[str]:
    layer, out = recipes.layers[ORG], []
    for p in proposal.picks:
        if p.key != TORCH_KEY or not p.changed:
            continue
        variant = p.layer.partition(":")[2] or None
        stack = _org_stack_of(recipes, variant) or proposal.stack
        out.append(
            f"re-check the AOTriton torch {p.proposed} bundles: the {p.layer} layer says "
            f'aotriton: "{layer.aotriton_for(variant)}"; after applying, `invoke pins.check '
            f"--stack {stack}` reads it from PyTorch's release tag"
        )
    if proposal.expect and proposal.expect[0] != proposal.expect[1]:
        out.append(
            f'expect {EXPECT_TORCH}: "{proposal.expect[0]}" -> "{proposal.expect[1]}" (in the diff)'
        )
    if not proposal.current:
        out.append(f"the comments above the {ORG} layer's pins name their sources: edit them")
    return out


def _org_stack_of(recipes: Recipes, variant: str | None) -> str | None:
    """The stack that builds the pytorch-org layer as `variant` (None: the layer's own pins)."""
    for name, stack in recipes.stacks.items():
        for entry in stack.entries():
            chosen = entry.variant[0] if isinstance(entry.variant, list) else entry.variant
            if entry.layer == ORG and (variant is None or chosen == variant):
                return name
    return None


# ---------------------------------------------------------------------------- what an image read


def observed_in(document: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the versions manifest, its "observed" facts) from an image's manifest
    (/opt/attnforge/versions.json) or a validation report, whose env check records it."""
    manifest = document
    if "checks" in document:  # a report: the env check's details.image_versions
        env = next((c for c in document.get("checks", []) if c.get("id") == "env"), {})
        manifest = (env.get("details") or {}).get("image_versions") or {}
    observed = manifest.get("observed") if isinstance(manifest, dict) else None
    if not isinstance(observed, dict):
        raise UserError(
            f"--observed {source}: no observed facts in it (an image's /opt/attnforge/"
            "versions.json, or a validation report of an image built with them)"
        )
    return manifest, observed


def observed_diff(recipes: Recipes, document: dict[str, Any], source: str) -> tuple[str, list[str]]:
    """The recipe corrected by what an image read from its own files: the `aotriton:` of the
    torch layer (or its variant) the image was built from. (diff, notes); an empty diff when
    the recipe already says what the image has."""
    manifest, observed = observed_in(document, source)
    seen = (observed.get("aotriton") or {}).get("tag")
    for name, entry in manifest.items():
        layer = recipes.layers.get(name)
        if layer is None or "torch" not in layer.provides or not isinstance(entry, dict):
            continue
        variant = entry.get("variant")
        said = layer.aotriton_for(variant)
        notes = [f"{name}{':' + variant if variant else ''}: the recipe says AOTriton {said}, "
                 f"the image has {seen or 'none'} ({(observed.get('aotriton') or {}).get('file')})"]  # fmt: skip
        if not seen or not said or _aot_release(seen) == _aot_release(said):
            return "", notes
        own = variant and layer.variants.get(variant) and layer.variants[variant].aotriton
        where = ("variants", variant) if own else ()
        rel = recipes.layer_files[name]
        old, new = edit_blocks(recipes.root / rel, rel, {where: {("aotriton",): seen}})
        notes.append(
            "the comments beside aotriton: say it was inferred: say it was read, and from where"
        )
        return _unified(old, new, rel), notes
    raise UserError(f"--observed {source}: names no layer of these recipes that provides torch")


def _aot_release(tag: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", tag)[:3])
