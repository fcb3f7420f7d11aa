"""The git submodules of a pinned commit, as `git submodule update --init --recursive` would fetch
them: each one's path, URL (a relative URL resolved against its parent's, as git does) and the
commit the parent's tree pins (its gitlink). Read from a repository's own objects, so a mirror
can be filled and checked without a work tree."""

from __future__ import annotations

import posixpath
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit


@dataclass(frozen=True)
class Submodule:
    parent: str  # the URL of the repository that pins it
    path: str  # where it lives in the parent's tree
    url: str  # absolute
    commit: str


def resolve_url(parent: str, url: str) -> str:
    """``url`` of a parent's .gitmodules, absolute: ``../aiter.git`` of
    https://github.com/ROCm/flash-attention.git is https://github.com/ROCm/aiter.git."""
    if not url.startswith(("./", "../")):
        return url
    parts = urlsplit(parent)
    base = parts.path.rstrip("/")
    joined = posixpath.normpath(posixpath.join(base, url))
    return urlunsplit(parts._replace(path=joined))


def has_commit(repo: Path, commit: str) -> bool:
    """Whether ``repo`` (bare or not) holds the commit ``commit``."""
    return _git(repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def submodules_at(repo: Path, commit: str, parent_url: str) -> list[Submodule]:
    """The submodules ``commit`` of ``repo`` (a bare or normal repository holding it) pins; none
    where it has no .gitmodules. A .gitmodules entry whose path the tree does not pin as a gitlink
    (a stale entry) is left out, as git leaves it."""
    listed = _git(repo, "config", "--blob", f"{commit}:.gitmodules", "--get-regexp",
                  r"^submodule\..*\.(path|url)$")  # fmt: skip
    if listed.returncode != 0:  # no .gitmodules at that commit (or no submodule section)
        return []
    paths: dict[str, str] = {}
    urls: dict[str, str] = {}
    for line in listed.stdout.splitlines():
        key, _, value = line.partition(" ")
        name, field = key[len("submodule.") :].rsplit(".", 1)
        (paths if field == "path" else urls)[name] = value.strip()
    out = []
    for name, path in sorted(paths.items(), key=lambda kv: kv[1]):
        if name not in urls:
            continue
        tree = _git(repo, "ls-tree", commit, "--", path).stdout.split()
        if len(tree) >= 3 and tree[0] == "160000" and tree[1] == "commit":
            out.append(Submodule(parent_url, path, resolve_url(parent_url, urls[name]), tree[2]))
    return out


def walk(url: str, commit: str, repo_of: Callable[[str], Path | None]) -> Iterator[Submodule]:
    """Every submodule of ``url`` at ``commit``, recursively (depth first, each (url, commit) once);
    ``repo_of(url)`` is a local repository holding that URL's objects, or None where there is
    none (its own submodules are then unknown: the caller reports the submodule missing)."""
    seen: set[tuple[str, str]] = set()
    stack = [(url, commit)]
    while stack:
        parent, at = stack.pop()
        repo = repo_of(parent)
        if repo is None:
            continue
        for sub in submodules_at(repo, at, parent):
            if (sub.url, sub.commit) in seen:
                continue
            seen.add((sub.url, sub.commit))
            yield sub
            stack.append((sub.url, sub.commit))
