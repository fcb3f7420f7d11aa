"""Fill a mirror: the wheels a plan's layers pin, as pip resolves them, and each source repository
at its pinned commit. Local wheels and repositories can be added (an index this host cannot
reach, stand-ins). The new mirror is assembled beside DIR and renamed into place when complete."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from ..errors import UserError
from .layout import FILES, Manifest, dist_of, repo_path, sha256_of, write_index
from .needs import PYPI, LayerNeeds
from .submodules import has_commit, walk


def _run(argv: list[str], log: IO[str], what: str, env: dict[str, str] | None = None) -> None:
    log.write("$ " + " ".join(argv) + "\n")
    log.flush()
    proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    if proc.returncode != 0:
        raise UserError(f"{what} failed (exit {proc.returncode}); its output is in {log.name}")


def download_wheels(
    needs: LayerNeeds, files: Path, python_version: str, index: str | None,
    ca_cert: Path | None, log: IO[str],
) -> None:  # fmt: skip
    """pip download one layer's requirements with their dependencies into ``files`` (the files
    already there, local ones included, are offered first through --find-links). pip runs
    --isolated and with PIP_CONFIG_FILE=/dev/null: this host's pip configuration (PIP_* variables,
    every pip.conf, a machine-wide constraint) does not choose what the mirror holds, as it does
    not inside the images."""
    first = index or needs.index
    argv = [sys.executable, "-m", "pip", "--isolated", "download", "--disable-pip-version-check", "--dest", str(files),
            "--find-links", str(files), "--index-url", first, "--only-binary=:all:",
            "--python-version", python_version, "--retries", "1", "--timeout", "30"]  # fmt: skip
    if first.rstrip("/") != PYPI.rstrip("/"):
        argv += ["--extra-index-url", PYPI]
    if ca_cert is not None:
        argv += ["--cert", str(ca_cert)]
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    _run([*argv, *needs.requirements], log, f"pip download for layer {needs.layer}", env)


def mirror_repo(
    url: str, commit: str, source: str, dest: Path, log: IO[str], pinned_by: str = "the plan"
) -> None:
    """A bare copy of ``source`` (the URL, or a local repository standing in for it) at
    dest/git/...; the pinned commit must be in it. Fetching it by id is allowed (the Dockerfiles
    run `git fetch --depth 1 URL COMMIT`, and `git submodule update --depth 1` fetches a
    submodule's commit by id)."""
    bare = dest / repo_path(url)
    if not bare.exists():
        bare.parent.mkdir(parents=True, exist_ok=True)
        _run(["git", "clone", "--quiet", "--mirror", source, str(bare)], log, f"git clone {source}")
        _run(["git", "-C", str(bare), "config", "uploadpack.allowAnySHA1InWant", "true"], log,
             "git config")  # fmt: skip
    if not has_commit(bare, commit):
        raise UserError(f"{source} has no commit {commit}, which {pinned_by} pins for {url}")


def _source(url: str, local_repos: Mapping[str, str]) -> str:
    """The local repository standing in for ``url`` (matched as the mirror files it: with or
    without .git), else the URL itself."""
    want = repo_path(url)
    return next((src for u, src in local_repos.items() if repo_path(u) == want), url)


def _mirror_with_submodules(
    url: str, commit: str, local_repos: Mapping[str, str], work: Path,
    repos: dict[str, dict[str, Any]], log: IO[str],
) -> None:  # fmt: skip
    """``url`` at ``commit`` and, recursively, every submodule that commit pins (each at its
    gitlink commit), as a layer's `git submodule update --init [--recursive]` would fetch them."""

    def record(u: str, c: str) -> None:
        entry = repos.setdefault(u, {"path": repo_path(u), "commits": []})
        if c not in entry["commits"]:
            entry["commits"].append(c)

    mirror_repo(url, commit, _source(url, local_repos), work, log)
    record(url, commit)

    def local(u: str) -> Path | None:
        bare = work / repo_path(u)
        return bare if bare.is_dir() else None

    for sub in walk(url, commit, local):
        log.write(f"submodule {sub.path} of {sub.parent}: {sub.url} at {sub.commit}\n")
        mirror_repo(sub.url, sub.commit, _source(sub.url, local_repos), work, log,
                    pinned_by=f"{sub.parent} (its submodule {sub.path})")  # fmt: skip
        record(sub.url, sub.commit)


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link where ``source`` is on the mirror's file system (no second copy of a
    multi-GB wheel set; the manifest's hashes still catch a later change to either name), else a
    copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def assemble(
    dest: Path, needs: Iterable[LayerNeeds], *, local_wheels: Iterable[Path] = (),
    local_repos: Mapping[str, str] | None = None, python_version: str = "3.12",
    index: str | None = None, ca_cert: Path | None = None, rehearsal: dict[str, Any] | None = None,
    log: IO[str],
) -> Manifest:  # fmt: skip
    """Make the mirror ``dest`` for ``needs``; an earlier mirror there is replaced only once the
    new one is complete."""
    needs = list(needs)
    work = dest.with_name(dest.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    files = work / FILES
    files.mkdir(parents=True)
    for wheel in local_wheels:
        if dist_of(wheel.name) is None:
            raise UserError(f"--add {wheel}: not a wheel or sdist file name")
        _link_or_copy(wheel, files / wheel.name)
    repos: dict[str, dict[str, Any]] = {}
    for n in needs:
        if n.requirements:
            download_wheels(n, files, python_version, index, ca_cert, log)
        if n.repo is not None:
            url, commit = n.repo
            _mirror_with_submodules(url, commit, local_repos or {}, work, repos, log)
    manifest = Manifest(
        files={p.name: sha256_of(p) for p in sorted(files.iterdir()) if dist_of(p.name)},
        repos=repos, requirements={n.layer: n.requirements for n in needs if n.requirements},
        rehearsal=rehearsal,
    )  # fmt: skip
    write_index(work, manifest)
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    work.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return manifest
