"""Shared pieces of the unit tests: the recipes, a workspace, a recording engine, and pins.update's
fixture tree and saved index.

Test modules take the fixtures by name and import the helpers from here (``from
tests.unit.conftest import RecordingEngine``) rather than from one another.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from attnforge.engine import BuildFailed, BuildRequest, RegistryUnavailable, RunRequest
from attnforge.pins import update as pins_update
from attnforge.pins import upstream as pins
from attnforge.recipes import load_recipes
from attnforge.workspace import Workspace
from tests.conftest import REPO, run_invoke


@pytest.fixture(scope="module")
def recipes():
    """The repository's recipes, loaded once a module (tests that change them load their own)."""
    return load_recipes(REPO)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    """A workspace on the repository with its build and report folders in tmp_path."""
    return Workspace(REPO, tmp_path / "build", tmp_path / "reports")


# -- the recording engine (tests of the executor, the builders and bisect) ---------------------


@dataclass
class RecordingEngine:
    """Records every call; `fail_build`/`fail_smoke`/`interrupt` script what a layer does."""

    images: dict[str, str] = field(default_factory=dict)  # ref -> image id
    fail_build: set[str] = field(default_factory=set)
    fail_smoke: set[str] = field(default_factory=set)
    interrupt: set[str] = field(default_factory=set)
    calls: list[tuple] = field(default_factory=list)
    name: str = "recording"
    registry: dict[str, str] | None = None  # ref -> image id; None: the registry does not answer

    def describe(self) -> str:
        return "recording engine"

    def build_argv(self, req: BuildRequest) -> list[str]:
        return req.argv(["docker"], "buildx")

    def build(self, req, log, on_line=None) -> str:
        layer = req.labels["org.attnforge.layer"]
        # the context is staged before the engine is called: what the build would send
        assert (req.context / "Dockerfile").is_file()
        self.calls.append(("build", layer, req))
        if layer in self.interrupt:
            raise KeyboardInterrupt
        if layer in self.fail_build:
            log.write(
                "#7 0.1 ERROR: no matching distribution\n#7 ERROR: process did not complete\n"
            )
            raise BuildFailed(1)
        return f"sha256:{layer}-image"

    def image_id(self, ref: str) -> str | None:
        return self.images.get(ref)

    def existing(self, refs) -> set[str]:
        return {r for r in refs if r in self.images}

    def tag(self, image: str, ref: str) -> None:
        self.calls.append(("tag", image, ref))
        self.images[ref] = image

    def run(self, req: RunRequest, input=None, timeout=None):
        self.calls.append(("run", req.image))
        layer = req.image.split(":")[1].removesuffix("-image")
        checks = json.loads(req.command[-1])
        ok = layer not in self.fail_smoke
        lines = [json.dumps({"name": c["name"], "ok": ok, "detail": "scripted"}) for c in checks]
        return subprocess.CompletedProcess(
            req.argv(["docker"]), 0 if ok else 1, "\n".join(lines), ""
        )

    def run_streaming(self, req, log, on_line=None) -> int:
        raise AssertionError("the executor streams no runs")

    def push(self, ref, log) -> None:
        raise AssertionError("the executor pushes nothing")

    def labels(self, ref: str) -> dict[str, str]:
        return {}

    def remote_has(self, ref: str) -> bool:
        self.calls.append(("lookup", ref))
        if self.registry is None:
            raise RegistryUnavailable(f"registry 127.0.0.9:5000 did not answer for {ref}: refused")
        return ref in self.registry

    def pull(self, ref: str, log) -> str:
        self.calls.append(("pull", ref))
        self.images[ref] = self.registry[ref]
        return self.registry[ref]

    def tags_moved(self) -> list[str]:
        return [c[2] for c in self.calls if c[0] == "tag"]

    def built(self) -> list[str]:
        return [c[1] for c in self.calls if c[0] == "build"]


# -- pins.update's fixture tree and saved index pages (tests/pins/update) ----------------------

PINS_FIXTURES = REPO / "tests" / "pins" / "update"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """pins.update's fixture tree (stable torch 2.13, a nightly variant taking --set), a copy."""
    dest = tmp_path / "tree"
    shutil.copytree(PINS_FIXTURES / "tree", dest)
    return dest


@pytest.fixture
def offline(tmp_path: Path) -> Path:
    """pins.update's saved index pages (complete nightlies: 20261118 and 20261119), a copy."""
    dest = tmp_path / "offline"
    shutil.copytree(PINS_FIXTURES / "index", dest)
    return dest


def pins_update_cmd(tree: Path, *args: str, env=None) -> subprocess.CompletedProcess[str]:
    """`invoke pins.update ARGS` in ``tree``, finding the project's tasks in the checkout."""
    return run_invoke(tree, "--search-root", str(REPO), "pins.update", *args, env=env)


def propose(tree: Path, offline: Path, channel: str, **kwargs) -> pins_update.Proposal:
    """pins_update.propose on ``tree``'s recipes against the saved index ``offline``."""
    index = pins.IndexSource(offline)
    return pins_update.propose(load_recipes(tree), channel, index, **kwargs)


def proposed(proposal: pins_update.Proposal) -> dict[str, str]:
    """{pin key: proposed value} of a proposal."""
    return {p.key: p.proposed for p in proposal.picks}
