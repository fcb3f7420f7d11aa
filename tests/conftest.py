"""Shared fixtures: the repository root and disposable copies of it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COPY_IGNORE = shutil.ignore_patterns(
    ".venv", ".git", "build", "reports", "__pycache__", "*.pyc", ".pytest_cache"
)


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A copy of the tree (recipes, Dockerfiles, packages) that a test may change freely."""
    dest = tmp_path / "tree"
    shutil.copytree(REPO, dest, ignore=COPY_IGNORE)
    return dest


def run_invoke(
    cwd: Path, *args: str, env=None, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m invoke ARGS` in cwd, as a user runs it: its own process, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout,
    )  # fmt: skip
