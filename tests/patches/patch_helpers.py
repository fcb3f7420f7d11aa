"""Helpers for the patch series tests: real git repositories and plain trees, no mocks."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
from pathlib import Path

GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}
_counter = itertools.count()


def git(
    cwd: Path, *args: str, check: bool = True, isolated: bool = True
) -> subprocess.CompletedProcess:
    """git in cwd; isolated: without the caller's GIT_* variables and user config."""
    env = dict(os.environ)
    if isolated:
        env = {k: v for k, v in env.items() if not k.startswith("GIT_")}
        env.update(GIT_ENV)
        env["HOME"] = str(cwd)  # no user config leaks in
    return subprocess.run(
        ["git", "-c", "commit.gpgsign=false", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        check=check,
    )


def write_files(root: Path, files: dict[str, bytes | None]) -> None:
    for rel, data in files.items():
        path = root / rel
        if data is None:
            if path.exists():
                path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def make_repo(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q")
    write_files(root, files)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    return root


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root (outside .git), with its executable bit."""
    out = {}
    for path in sorted(root.rglob("*")):
        if ".git" in path.relative_to(root).parts or not path.is_file():
            continue
        flag = "x" if os.access(path, os.X_OK) else "-"
        out[str(path.relative_to(root))] = flag + hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def diff_of(
    scratch: Path, before: dict[str, bytes], after: dict[str, bytes | None], fmt: bool = False
) -> bytes:
    """Real git output for the change before -> after: `git diff`, or format-patch if fmt."""
    repo = make_repo(scratch / f"diff{next(_counter)}", before)
    write_files(repo, after)
    git(repo, "add", "-A")
    if fmt:
        git(repo, "commit", "-qm", "a change\n\nWhy it is needed.")
        return git(repo, "format-patch", "-1", "--stdout", "--no-renames").stdout
    return git(repo, "diff", "--cached", "--no-renames").stdout


def make_series(
    root: Path,
    component: str,
    name: str,
    patches: list[bytes],
    *,
    links: tuple[str, ...] = ("https://example.com/upstream/issue/1",),
    extra: dict | None = None,
) -> Path:
    folder = root / component / name
    folder.mkdir(parents=True)
    names = []
    for i, data in enumerate(patches, 1):
        fname = f"{i:04d}-change-{i}.patch"
        (folder / fname).write_bytes(data)
        names.append(fname)
    meta = {
        "component": component,
        "summary": "test series",
        "upstream": {"repo": "https://example.com/upstream", "refs": ["v1.0"]},
        "links": list(links),
        "checked_against": {n: "0" * 40 for n in names},
    }
    meta.update(extra or {})
    (folder / "series.json").write_text(json.dumps(meta))
    return folder
