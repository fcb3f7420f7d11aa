"""What a plan's layers fetch from outside, and which build arguments a mirror replaces (pure).

A layer's requirements are read from its Dockerfile's `pip install` / `pip wheel` lines with the
plan's args filled in, so the mirror follows the Dockerfiles as they are: a requirement added to a
Dockerfile is a requirement the next mirror holds. A shell variable on such a line (e.g.
`${rocm_version}`, set from `rocm-sdk version`) is the upper-case pin of a layer below (the
image's versions manifest). What cannot be known before the build (a requirements file of the
source tree, a `$(...)`) is said, not guessed.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from .layout import repo_path

PYPI = "https://pypi.org/simple/"
_VALUE_OPTIONS = {
    "-f", "--find-links", "-i", "--index-url", "--extra-index-url", "-w", "--wheel-dir",
    "-c", "--constraint", "-d", "--dest", "-t", "--target", "--platform", "--python-version",
}  # fmt: skip
_FILE_OPTIONS = {"-r", "--requirement"}
_PIP = re.compile(r"\bpip3? (?:install|wheel|download)\b(.*?)(?=&&|\|\||;|$)", re.S)
_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass
class LayerNeeds:
    layer: str
    requirements: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # sentences: what is resolved in the build
    repo: tuple[str, str] | None = None  # (url, commit)
    index: str = PYPI  # the index the layer's pip lines name, where the wheels come from


def run_text(dockerfile: str) -> list[str]:
    """The RUN instructions of a Dockerfile, continuation lines joined, comments dropped."""
    lines = [ln for ln in dockerfile.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [ln.strip()[4:] for ln in joined.splitlines() if ln.strip().startswith("RUN ")]


def _fill(text: str, values: Mapping[str, str]) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        for key in (name, name.upper()):
            if key in values:
                return values[key]
        return m.group(0)

    return _VAR.sub(sub, text)


def _is_requirement(text: str) -> bool:
    try:
        Requirement(text)
    except InvalidRequirement:
        return False
    return True


def _lock_lines(root: Path | None, path: str) -> list[str] | None:
    """The requirements of a requirements file the build context holds (bound at /ctx)."""
    if root is None or not path.startswith("/ctx/") or not (root / path[5:]).is_file():
        return None
    lines = (ln.split("#")[0].strip() for ln in (root / path[5:]).read_text().splitlines())
    return [ln for ln in lines if ln and not ln.startswith("-")]


def pip_requirements(
    dockerfile: str, values: Mapping[str, str], root: Path | None = None
) -> tuple[list[str], list[str]]:
    """(requirements, sentences about what is only known in the build) of a Dockerfile's pip
    lines, with ``values`` (args, then pins of layers below) filled in; a requirements file of the
    build context (``root``) is read."""
    reqs: list[str] = []
    unknown: list[str] = []
    for run in run_text(dockerfile):
        for m in _PIP.finditer(run):
            try:
                tokens = shlex.split(_fill(m.group(1), values))
            except ValueError:
                unknown.append(f"a pip line shlex cannot read: {m.group(0).strip()[:80]}")
                continue
            skip = False
            for i, tok in enumerate(tokens):
                if skip:
                    skip = False
                    continue
                if tok in _VALUE_OPTIONS or tok in _FILE_OPTIONS:
                    skip = True
                    if tok in _FILE_OPTIONS and i + 1 < len(tokens):
                        lock = _lock_lines(root, tokens[i + 1])
                        if lock is None:
                            unknown.append(
                                f"the requirements file {tokens[i + 1]} of the source tree"
                            )
                        reqs.extend(r for r in lock or () if r not in reqs)
                    continue
                if tok.startswith(("-", "/", ".")) or tok.endswith(".whl") or "[@]" in tok:
                    continue
                if "$" in tok:
                    unknown.append(f"{tok} (a value only the build knows)")
                    continue
                if "/" in tok and "://" not in tok:  # a path in the source tree (pip wheel DIR)
                    continue
                if not _is_requirement(tok):  # e.g. the value of an option pip will refuse
                    unknown.append(f"{tok} (not a requirement: left to pip in the build)")
                    continue
                if tok not in reqs:
                    reqs.append(tok)
    return reqs, unknown


def _below(manifest: Mapping[str, Any], layer: str) -> dict[str, str]:
    """The pins of the layers below ``layer`` in its image's versions manifest."""
    values: dict[str, str] = {}
    for name, pins in manifest.items():
        if name != layer and isinstance(pins, Mapping):
            values.update({k: str(v) for k, v in pins.items() if isinstance(v, str | int)})
    return values


def layer_needs(root: Path, step: Any) -> LayerNeeds:
    """What one planned step (attnforge.plan.Step) fetches from outside."""
    values = {**_below(step.manifest, step.layer), **step.hint_args, **step.args}
    text = (root / step.dockerfile).read_text()
    reqs, unknown = pip_requirements(text, values, root)
    needs = LayerNeeds(step.layer, reqs, unknown)
    if "SOURCE_REPO" in step.args and "SOURCE_REF" in step.args:
        needs.repo = (step.args["SOURCE_REPO"], step.args["SOURCE_REF"])
    index = next((v for k, v in {**step.hint_args, **step.args}.items() if k.endswith("INDEX_URL")
                  and v), None)  # fmt: skip
    needs.index = index or PYPI
    return needs


@dataclass(frozen=True)
class Replacement:
    arg: str
    upstream: str  # what the layer would have used
    mirror_path: str  # what replaced it, relative to the mirror folder


# The submodules a layer's `git submodule update` fetches name their own URLs (.gitmodules): a
# layer that clones gets git's `url.<mirror>/git/.insteadOf https://` through git's environment
# (GIT_CONFIG_COUNT, GIT_CONFIG_KEY_0, GIT_CONFIG_VALUE_0; git 2.31+), which its Dockerfile
# declares as ARGs, so https://<host>/<path> is fetched from the mirror's git/<host>/<path>.
SUBMODULES = "GIT_CONFIG (submodules)"


def submodule_rewrite(mirror_git: str) -> dict[str, str]:
    """The build args that send every https:// repository URL to ``mirror_git`` (…/git/)."""
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": f"url.{mirror_git}.insteadOf",
        "GIT_CONFIG_VALUE_0": "https://",
    }


def replacements(step: Any) -> list[Replacement]:
    """Every build argument of a step that names an outside source, with its mirror path. Every
    layer is also given PIP_INDEX_URL (its Dockerfile declares it where a pip line names no index);
    a layer that clones, the rewrite of its submodules' URLs."""
    out = []
    for arg, value in sorted({**step.hint_args, **step.args}.items()):
        if arg.endswith("INDEX_URL"):
            out.append(Replacement(arg, value or "(none)", "simple/"))
        elif arg == "SOURCE_REPO":
            out.append(Replacement(arg, value, repo_path(value)))
            out.append(Replacement(SUBMODULES, "https://", "git/"))
    if not any(r.arg == "PIP_INDEX_URL" for r in out):
        out.append(Replacement("PIP_INDEX_URL", PYPI + " (pip's default)", "simple/"))
    return out
