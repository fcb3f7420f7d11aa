"""Where attnforge works: the tree it reads recipes from, and where it writes builds and reports.

One home for every path a task reads or writes, so that the tasks agree on them and tests can
point the outputs at a temporary directory (ATTNFORGE_BUILD_DIR, ATTNFORGE_REPORTS_DIR) instead
of the checkout.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

BUILD_DIR_ENV = "ATTNFORGE_BUILD_DIR"
# Beside a report: which image id passed validation; what `invoke publish` trusts.
VALIDATED = "validated.json"
REPORTS_DIR_ENV = "ATTNFORGE_REPORTS_DIR"


def find_root(start: Path | None = None) -> Path:
    """The attnforge tree to work on: the nearest folder at or above `start` (default: the working
    directory) that holds recipes/stacks.yaml, so a copy of the tree works on itself; else the tree
    this code was installed from."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "recipes" / "stacks.yaml").is_file():
            return folder
    return Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Workspace:
    root: Path  # recipes/, dockerfiles/, patches/, validate/ ...
    build_dir: Path  # logs, state, staging, the default wheelhouse
    reports_dir: Path  # reports/<arch>/<stack>/

    @classmethod
    def discover(cls, start: Path | None = None, env: Mapping[str, str] = os.environ) -> Workspace:
        root = find_root(start)
        build = Path(env[BUILD_DIR_ENV]) if env.get(BUILD_DIR_ENV) else root / "build"
        reports = Path(env[REPORTS_DIR_ENV]) if env.get(REPORTS_DIR_ENV) else root / "reports"
        return cls(root, build.resolve(), reports.resolve())

    def reports_for(self, arch: str, stack: str) -> Path:
        return self.reports_dir / arch / stack

    def validated_stamp(self, arch: str, stack: str) -> Path:
        return self.reports_for(arch, stack) / VALIDATED

    def logs_for(self, arch: str) -> Path:
        return self.build_dir / "logs" / arch

    @property
    def state_dir(self) -> Path:
        return self.build_dir / "state"

    @property
    def staging_dir(self) -> Path:
        return self.build_dir / "staging"

    @property
    def wheelhouse(self) -> Path:
        """Where `tools/setup.sh wheelhouse` puts the cpu stack's wheels."""
        return self.build_dir / "wheelhouse"
