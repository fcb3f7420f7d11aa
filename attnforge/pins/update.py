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
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
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
    _distro_python,
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


def _by_version(files: list[DistFile], project: str) -> dict[Version, list[DistFile]]:
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


def _fitting(files: list[DistFile], project: str, python: str) -> dict[Version, str]:
    """version -> a file of it that installs on `python` (x86_64 Linux), as pins.check judges."""
    out = {}
    for version, group in _by_version(files, project).items():
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
        return set(_by_version(files, project))


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
    (stable) or the --set flags (nightly). Reads index pages only; writes nothing."""
    if channel not in CHANNELS:
        raise UserError(f"--channel {channel!r}: expected one of {', '.join(CHANNELS)}")
    arch = arch or DEFAULT_ARCH
    if arch not in recipes.arches:
        raise unknown("arch", arch, recipes.arches)
    stack = _org_stack(recipes) if channel == ORG else _channel_stack(recipes, channel)
    python = _stack_python(recipes, stack, python)
    if channel == ORG:
        return _propose_org(recipes, stack, index, python, arch)
    rocm_layer = _channel_layer(recipes, ROCM_LAYER, channel)
    torch_layer = _channel_layer(recipes, TORCH_LAYER, channel)
    if ROCM_KEY not in rocm_layer.keys or TORCH_KEY not in torch_layer.keys:
        raise UserError(
            f"the {channel!r} variants must pin (or take with --set) {ROCM_LAYER}.{ROCM_KEY} "
            f"and {TORCH_LAYER}.{TORCH_KEY}"
        )
    reader = _Reader(index, channel)
    notes: list[str] = []
    extra = recipes.arches[arch].therock_extra
    if extra is None:
        notes.append(f"{arch} has no TheRock device extra: device packages not checked")

    def device(layer: _Layer, project: str) -> set[Version] | None:
        pattern = DEVICE_PACKAGES.get(project)
        if extra is None or pattern is None:
            return None
        return reader.device(layer.index, pattern.format(arch=arch), notes)

    rocm_project, rocm_files = reader.rocm_page(rocm_layer.index)
    rocms = _fitting(rocm_files, rocm_project, python)
    rocm_device = device(rocm_layer, "rocm")
    # torch first: the companions are paired with it by their shared local label.
    keys = [TORCH_KEY, *(k for k in torch_layer.keys if k != TORCH_KEY)]
    builds = {
        k: _by_version(reader.files(torch_layer.index, project_of(k)), project_of(k)) for k in keys
    }
    device_of = {TORCH_KEY: device(torch_layer, "torch")}

    # nightly: only dates whose Quartz record says the PyTorch build and the arch's tests of the
    # stack's torch branch passed (attnforge/pins/quartz.py), and only that branch's torch
    trusted: dict[Version, str] = {}
    refused: dict[Version, str] = {}
    torch_release = None
    if channel == "nightly":
        from . import quartz

        branch = torch_branch or torch_branch_of(recipes)
        if feed is None:
            notes.append(f"no Quartz feed was read ({feed_problem}): the newest nightly on the "
                         "index is proposed, not one AMD's feed shows tested")  # fmt: skip
        else:
            if branch.startswith("release/"):
                torch_release = tuple(int(x) for x in branch.removeprefix("release/").split("."))
            for where, status in feed:
                v = quartz.judge(status, arch, branch, python)
                try:
                    rocm_v = Version(v.rocm)
                except InvalidVersion:
                    continue
                if v.ok:
                    trusted.setdefault(rocm_v, f"{where}: {v.why}")
                else:
                    refused.setdefault(rocm_v, f"Quartz {v.date}: {v.why}")
    kind, kinds = ("release", "releases") if channel == "stable" else ("nightly", "nightlies")
    keyed = [(key, v) for v in rocms if (key := _rocm_key(v, channel)) is not None]
    if channel == "stable":  # pre-releases newer than every release: say why they lost
        top = max((k[0] for k, _ in keyed), default=None)
        pres = sorted(v for v in rocms if v.is_prerelease and (top is None or v > top))
        if pres:
            notes.append(f"not releases, so not proposed: ROCm {', '.join(map(str, pres))}")
    skipped: list[str] = []
    for _, rocm in sorted(keyed, reverse=True):
        if channel == "nightly" and feed is not None and rocm not in trusted:
            skipped.append(f"ROCm {rocm}: {refused.get(rocm, 'not in the Quartz feed')}")
            continue
        if rocm_device is not None and rocm not in rocm_device:
            skipped.append(f"ROCm {rocm}: no {DEVICE_PACKAGES['rocm'].format(arch=arch)} {rocm}")
            continue
        label = f"rocm{rocm}"
        chosen, why, found = _builds_for(
            label, keys, builds, device_of, python, arch, torch_release
        )
        if why:
            skipped.append(f"ROCm {rocm}: {why}")
            continue
        if skipped:
            notes.insert(0, f"newer {kinds} skipped: " + "; ".join(skipped))
        notes.extend(found)
        if rocm in trusted:
            notes.append(f"trusted the Quartz record {trusted[rocm]}")
        picks = [
            _pick(rocm_layer, ROCM_KEY, rocm_project, str(rocm), rocms[rocm], channel),
            *(
                _pick(torch_layer, k, project_of(k), str(v), f, channel)
                for k, (v, f) in chosen.items()
            ),
        ]
        proposal = Proposal(
            channel=channel,
            stack=stack,
            arch=arch,
            python=python,
            indexes={ROCM_LAYER: rocm_layer.index, TORCH_LAYER: torch_layer.index},
            rocm=str(rocm),
            picks=picks,
            notes=notes,
        )
        if channel == "stable":
            _stable_diff(recipes, proposal)
        return proposal
    device_note = f" and {arch}'s device packages" if extra else ""
    names = ", ".join([rocm_project, *(project_of(k) for k in torch_layer.keys)])
    raise UserError(
        f"the {channel} index {torch_layer.index} has no ROCm {kind} with {names} for Python "
        f"{python}{device_note}"
        + (
            f" ({'; '.join(skipped[:3])})"
            if skipped
            else f" (its {rocm_project} page lists no ROCm {kind})"
        )
    )


def _stack_python(recipes: Recipes, stack: str, python: str | None) -> str:
    if python is None:
        base = recipes.stacks[stack].base_image
        python = _distro_python(base)
        if python is None:
            raise UserError(
                f"cannot tell the Python of stack {stack}'s base image {base}; pass --python 3.X"
            )
    elif not re.fullmatch(r"3\.\d+", python):
        raise UserError(f"--python {python!r}: expected a CPython version such as 3.12")
    return python


# ---------------------------------------------------------------------------- pytorch.org


def _org_stack(recipes: Recipes) -> str:
    for name, stack in recipes.stacks.items():
        if any(entry.layer == ORG for entry in stack.entries()):
            return name
    raise UserError(f"no stack in recipes/stacks.yaml uses the {ORG} layer")


def _propose_org(
    recipes: Recipes, stack: str, index: IndexSource, python: str, arch: str
) -> Proposal:
    """The newest torch release the pytorch.org index serves with the pinned torch's label
    (+rocm7.14), the torchvision of its line, and the newest republication (.postN) of the
    pinned rocm release. Another rocm patch the label would take (7.14.1) is named, not
    proposed: which ROCm patch torch runs on is the recipe's decision (its comments say why)."""
    layer = recipes.layers[ORG]
    url = {**layer.args, **layer.hint_args}.get(ORG_INDEX_KEY)
    missing = [k for k in (TORCH_KEY, VISION_KEY, ROCM_KEY) if k not in layer.pins]
    if not url or missing:
        raise UserError(
            f"recipes/layers/{ORG}.yaml must name {ORG_INDEX_KEY} and pin "
            f"{', '.join([TORCH_KEY, VISION_KEY, ROCM_KEY])}"
        )
    reader = _Reader(index, ORG)
    try:
        current_torch = Version(layer.pins[TORCH_KEY])
        current_rocm = Version(layer.pins[ROCM_KEY])
    except InvalidVersion as exc:
        raise UserError(f"recipes/layers/{ORG}.yaml: {exc}") from None
    label = current_torch.local
    notes: list[str] = []

    def releases(project: str, keep) -> dict[Version, str]:
        found = _fitting(reader.files(url, project), project, python)
        return {
            v: f for v, f in found.items() if not (v.is_prerelease or v.is_devrelease) and keep(v)
        }

    torches = releases("torch", lambda v: v.local == label)
    if not torches:
        raise UserError(f"the {ORG} index {url} has no torch release +{label} for Python {python}")
    torch = max(torches)
    # torchvision 0.N pairs with torch 2.(N-15): pytorch/vision README, "Installation" table
    # (torch 2.14 <-> torchvision 0.29, 2.13 <-> 0.28).
    line = (0, torch.minor + 15)
    visions = releases("torchvision", lambda v: v.local == label and v.release[:2] == line)
    if not visions:
        raise UserError(
            f"the {ORG} index {url} has no torchvision {line[0]}.{line[1]}.x +{label} for "
            f"Python {python}, the line of torch {torch}"
        )
    vision = max(visions)
    if len(visions) > 1:
        notes.append(
            f"torchvision has {len(visions)} releases of its {line[0]}.{line[1]} line +{label}; "
            f"proposing the newest: confirm that {vision} requires torch {torch} (its wheel's "
            "Requires-Dist)"
        )
    release = current_rocm.release
    rocms = releases("rocm", lambda v: v.release == release and not v.local)
    if not rocms:
        raise UserError(
            f"the {ORG} index {url} no longer serves rocm {current_rocm.base_version} "
            f"(nor a .postN of it)"
        )
    rocm = max(rocms)
    others = sorted(
        v
        for v in releases("rocm", lambda v: v.release[:2] == release[:2] and not v.local)
        if v.release != release
    )
    if others:
        notes.append(
            f"not proposed: rocm {', '.join(map(str, others))}, other releases torch "
            f"+{label} would take; pinning one is a decision for the recipe (its comments), "
            "after a validation run"
        )
    picks = [
        Pick(ORG, TORCH_KEY, "torch", layer.pins[TORCH_KEY], str(torch), torches[torch]),
        Pick(ORG, VISION_KEY, "torchvision", layer.pins[VISION_KEY], str(vision), visions[vision]),
        Pick(ORG, ROCM_KEY, "rocm", layer.pins[ROCM_KEY], str(rocm), rocms[rocm]),
    ]
    proposal = Proposal(
        channel=ORG,
        stack=stack,
        arch=arch,
        python=python,
        indexes={ORG: url},
        rocm=str(rocm),
        picks=picks,
        notes=notes,
    )
    _org_diff(recipes, proposal)
    return proposal


def _org_diff(recipes: Recipes, proposal: Proposal) -> None:
    edits = {("pins", p.key): p.proposed for p in proposal.picks if p.changed}
    torch = next(p for p in proposal.picks if p.key == TORCH_KEY)
    expect = recipes.layers[ORG].expect.get(EXPECT_TORCH)
    if isinstance(expect, str):
        new = expect if expect != torch.current and torch.proposed.startswith(expect) else None
        new = new or torch.proposed
        proposal.expect = (expect, new)
        if new != expect:
            edits[("expect", EXPECT_TORCH)] = new
    if not edits:
        return
    rel = recipes.layer_files[ORG]
    old, new_text = edit_layer(recipes.root / rel, rel, (), edits)
    proposal.diff = "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new_text.splitlines(keepends=True),
            fromfile=f"a/{rel}",
            tofile=f"b/{rel}",
        )
    )


def _builds_for(
    label: str,
    keys: list[str],
    builds: dict[str, dict[Version, list[DistFile]]],
    device_of: dict[str, set[Version] | None],
    python: str,
    arch: str,
    torch_release: tuple[int, ...] | None = None,
) -> tuple[dict[str, tuple[Version, str]], str | None, list[str]]:
    """For one ROCm label (rocm10.1.0): key -> (the newest version of its project with that
    local label that fits, a file of it); else why not; and notes on ambiguous pairings."""
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
        if key != TORCH_KEY and len(fits) > 1:
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
    src = yamlsrc.load(path, rel)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    shown = ".".join(where[1:])
    for (section, key), value in changes.items():
        loc = (*where, section, key)
        number = src.lines.get(loc)
        new = _replace_value(lines[number - 1], key, value) if number else None
        name = ".".join(filter(None, (shown, section, key)))
        if new is None:
            raise UserError(
                f"{rel}:{number or '?'}: cannot edit {name} as one line; set it to {value!r} "
                "by hand"
            )
        lines[number - 1] = new
    edited = "".join(lines)
    data = yaml.safe_load(edited)
    for (section, key), value in changes.items():
        block = data
        for part in where:
            block = block[part]
        if block[section][key] != value:
            name = ".".join(filter(None, (shown, section, key)))
            raise UserError(f"{rel}: editing {name} went wrong; set it by hand")
    return text, edited


def _stable_diff(recipes: Recipes, proposal: Proposal) -> None:
    edits: dict[str, dict[tuple[str, str], str]] = {}
    for p in proposal.picks:
        if p.changed:
            edits.setdefault(p.layer, {})[("pins", p.key)] = p.proposed
    torch = next(p for p in proposal.picks if p.key == TORCH_KEY)
    expect = recipes.layers[TORCH_LAYER].variants[proposal.channel].expect.get(EXPECT_TORCH)
    if isinstance(expect, str):
        # validate/expect.py matches torch.version as a prefix: a prefix the new torch still
        # starts with stays, a full version (or a stale prefix) follows the pin.
        new = expect if expect != torch.current and torch.proposed.startswith(expect) else None
        new = new or torch.proposed
        proposal.expect = (expect, new)
        if new != expect:
            edits.setdefault(TORCH_LAYER, {})[("expect", EXPECT_TORCH)] = new
    chunks = []
    for layer in (ROCM_LAYER, TORCH_LAYER):
        if layer not in edits:
            continue
        rel = recipes.layer_files[layer]
        old, new_text = edit_variant(recipes.root / rel, rel, proposal.channel, edits[layer])
        chunks.append(
            "".join(
                difflib.unified_diff(
                    old.splitlines(keepends=True),
                    new_text.splitlines(keepends=True),
                    fromfile=f"a/{rel}",
                    tofile=f"b/{rel}",
                )
            )
        )
    proposal.diff = "".join(chunks)


# ---------------------------------------------------------------------------- for people


def reminders(proposal: Proposal, recipes: Recipes) -> list[str]:
    """What the index cannot tell: the AOTriton the proposed torch bundles, and prose that names
    the old release."""
    torch = next(p for p in proposal.picks if p.key == TORCH_KEY)
    out = []
    if proposal.channel == ORG:
        aot = recipes.layers[ORG].aotriton
        if torch.changed:
            out.append(
                f"re-check the AOTriton torch {torch.proposed} bundles: the {ORG} layer says "
                f'aotriton: "{aot}"; after applying, `invoke pins.check --stack '
                f"{proposal.stack}` reads it from PyTorch's release tag"
            )
        if proposal.expect and proposal.expect[0] != proposal.expect[1]:
            out.append(
                f'expect {EXPECT_TORCH}: "{proposal.expect[0]}" -> "{proposal.expect[1]}" '
                "(in the diff)"
            )
        if not proposal.current:
            out.append(f"the comments above the {ORG} layer's pins name their sources: edit them")
        return out
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
