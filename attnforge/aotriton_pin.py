"""The AOTriton version and commit a PyTorch source tree pins.

PyTorch pins AOTriton in ``cmake/External/aotriton.cmake`` (since pytorch#137443, Oct
2024)::

    set(__AOTRITON_VER "0.12.1b")
    if(DEFINED ENV{PYTORCH_AOTRITON_COMMIT})
      set(__AOTRITON_CI_COMMIT "$ENV{PYTORCH_AOTRITON_COMMIT}")
    else()
      set(__AOTRITON_CI_COMMIT "8fdb4a4353f95b88c9542f5e5637efc1e1e0e530")
    endif()

Older files set ``__AOTRITON_CI_COMMIT`` directly; some ROCm/pytorch branches name the
version ``__AOTRITON_RELEASE_PAGE``; the oldest trees read ``.ci/docker/aotriton_version.txt``
(line 1 version, line 4 commit). Reading is pure: text in, ``AotritonPin`` out.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

CMAKE_FILE = Path("cmake/External/aotriton.cmake")
VERSION_TXT = Path(".ci/docker/aotriton_version.txt")
ENV_OVERRIDE = "PYTORCH_AOTRITON_COMMIT"

_SET_RE = re.compile(r'^\s*set\(\s*(__AOTRITON_[A-Z0-9_]+)\s+"([^"]*)"', re.MULTILINE)
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")


class AotritonPinError(Exception):
    """The pin cannot be read; str() names the file and the variable."""


@dataclasses.dataclass(frozen=True)
class AotritonPin:
    version: str  # release name, e.g. "0.12b"
    commit: str  # full ROCm/aotriton commit SHA
    source: Path  # the file the pin was read from
    env_override: bool  # PYTORCH_AOTRITON_COMMIT can replace the commit at build time

    @property
    def release_url(self) -> str:
        return f"https://github.com/ROCm/aotriton/releases/tag/{self.version}"


def _strip_comments(text: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def parse_cmake(text: str, source: Path = CMAKE_FILE) -> AotritonPin:
    """Read the pin from the text of cmake/External/aotriton.cmake."""
    values: dict[str, list[str]] = {}
    for name, value in _SET_RE.findall(_strip_comments(text)):
        values.setdefault(name, []).append(value)
    version_var = "__AOTRITON_VER" if "__AOTRITON_VER" in values else "__AOTRITON_RELEASE_PAGE"
    if version_var not in values:
        raise AotritonPinError(
            f'{source}: no set(__AOTRITON_VER "...") (nor __AOTRITON_RELEASE_PAGE); '
            "cannot tell which AOTriton release PyTorch pins."
        )
    commits = [v for v in values.get("__AOTRITON_CI_COMMIT", []) if "$ENV{" not in v]
    if not commits:
        raise AotritonPinError(
            f'{source}: no literal set(__AOTRITON_CI_COMMIT "<sha>"); cannot tell which '
            "AOTriton commit PyTorch pins."
        )
    if len(set(commits)) > 1:
        raise AotritonPinError(
            f"{source}: __AOTRITON_CI_COMMIT is set to several commits ({', '.join(commits)})."
        )
    commit = commits[0].strip().lower()
    if not _SHA_RE.match(commit):
        raise AotritonPinError(
            f"{source}: __AOTRITON_CI_COMMIT is {commits[0]!r}, not a full 40-hex commit SHA."
        )
    override = f"ENV{{{ENV_OVERRIDE}}}" in text
    return AotritonPin(values[version_var][0].strip(), commit, Path(source), override)


def parse_version_txt(text: str, source: Path = VERSION_TXT) -> AotritonPin:
    """Read the pin from the old .ci/docker/aotriton_version.txt (version, ..., commit)."""
    lines = [line.strip() for line in text.splitlines()]
    if len(lines) < 4 or not lines[0]:
        raise AotritonPinError(
            f"{source}: expected at least 4 lines (version, manylinux, rocm, commit); "
            f"found {len(lines)}."
        )
    commit = lines[3].lower()
    if not _SHA_RE.match(commit):
        raise AotritonPinError(f"{source}: line 4 is {lines[3]!r}, not a full commit SHA.")
    return AotritonPin(lines[0], commit, Path(source), False)


def pin_from(read: Callable[[Path], str | None], where: str) -> AotritonPin:
    """The AOTriton pin of a PyTorch tree (either era), its files read through ``read`` (a path
    relative to the tree -> its text, None when absent): a checkout, or ``git show`` of a commit.
    ``where`` names the tree in errors."""
    cmake = f"{where}/{CMAKE_FILE}"
    text = read(CMAKE_FILE)
    if text is None:
        raise AotritonPinError(
            f"{cmake} does not exist: {where} is not a PyTorch source tree with AOTriton "
            "support (PyTorch >= 2.3)."
        )
    sets_version = any(
        name in ("__AOTRITON_VER", "__AOTRITON_RELEASE_PAGE")
        for name, _ in _SET_RE.findall(_strip_comments(text))
    )
    if not sets_version and "aotriton_version.txt" in text:
        txt = read(VERSION_TXT)
        if txt is None:
            raise AotritonPinError(
                f"{cmake} reads {VERSION_TXT}, and {where}/{VERSION_TXT} does not exist."
            )
        return parse_version_txt(txt, Path(where) / VERSION_TXT)
    return parse_cmake(text, Path(cmake))


def read_aotriton_pin(pytorch_src: Path) -> AotritonPin:
    """The AOTriton pin of a PyTorch source tree (either era)."""
    src = Path(pytorch_src)

    def read(rel: Path) -> str | None:
        path = src / rel
        return path.read_text(encoding="utf-8") if path.is_file() else None

    return pin_from(read, str(src))
