from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A folder for throw-away repositories that make real git diffs."""
    path = tmp_path / "scratch"
    path.mkdir()
    return path
