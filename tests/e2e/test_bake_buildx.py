"""`invoke bake` against a real `docker buildx` (Debian 13's docker-buildx, in the image that
`tools/setup.sh buildx-tools` makes) talking to the real engine through its socket.

- `buildx bake --print` reads the generated file and resolves it: the targets, their content tags,
  args and named contexts are the ones `invoke build --dry-run --json` plans.
- Building the cpu stack with bake needs named contexts (`contexts: target:<parent>`), a BuildKit
  0.10 frontend capability (moby.buildkit.frontend.contexts). Debian 12's dockerd 20.10 has
  BuildKit 0.8 and refuses it, and no newer frontend image can be pulled here; that test then
  skips with the engine's own words. On an engine with a newer BuildKit it builds the stack and
  checks that `invoke build` finds every layer already built: bake made the same content tags.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import COPY_IGNORE, REPO, outputs_env, run_invoke
from tests.e2e.test_cpu_stack import (
    BASE,
    CA_CERT,
    WHEELHOUSE,
    _engine_problem,
    outcomes,
    remove_images,
    unavailable,
)

pytestmark = pytest.mark.e2e

BUILDX_IMAGE = os.environ.get("ATTNFORGE_E2E_BUILDX_IMAGE", "attnforge-local/buildx-tools:trixie")
SOCKET = "/var/run/docker.sock"
NAMESPACE = f"attnforge-bake-{uuid.uuid4().hex[:8]}"
NO_NAMED_CONTEXTS = "moby.buildkit.frontend.contexts"


def _missing() -> str | None:
    problem = _engine_problem()
    if problem:
        return problem
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return f"DOCKER_HOST={host}: the buildx container reaches the engine through {SOCKET} only"
    found = subprocess.run(["docker", "image", "inspect", BUILDX_IMAGE], capture_output=True)
    if found.returncode != 0:
        return f"no {BUILDX_IMAGE} (make it with `tools/setup.sh buildx-tools`)"
    return None


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    problem = _missing()
    if problem:
        unavailable(
            f"the bake tests are required here but cannot run: {problem}",
            f"no buildx for the bake tests: {problem}",
        )
    base = tmp_path_factory.mktemp("bake")
    # a copy of the tree, so that every step plans from the same files
    shutil.copytree(REPO, base / "tree", ignore=COPY_IGNORE)
    yield base
    remove_images(NAMESPACE)


def plan_args() -> list[str]:
    args = ["--arch", "cpu", "--base-image", BASE, "--namespace", NAMESPACE]
    if Path(WHEELHOUSE).is_dir():
        args += ["--wheelhouse", WHEELHOUSE, "--set", "torch-cpu.TORCH_INDEX_URL="]
    return [*args, "--ca-cert", CA_CERT if Path(CA_CERT).is_file() else "none"]


def invoke(out: Path, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return run_invoke(out / "tree", *args, env=outputs_env(out), timeout=timeout)


def buildx(out: Path, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    """`docker buildx ARGS` in the tools image: the engine's socket, the bake folder and the CA
    bundle mounted at the paths the bake file names."""
    mounts = ["-v", f"{SOCKET}:{SOCKET}", "-v", f"{out}:{out}"]
    if Path(CA_CERT).is_file():
        mounts += ["-v", f"{CA_CERT}:{CA_CERT}:ro"]
    return subprocess.run(
        ["docker", "run", "--rm", *mounts, BUILDX_IMAGE, "buildx", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture(scope="module")
def bake_file(out: Path) -> Path:
    path = out / "docker-bake.json"
    proc = invoke(out, "bake", *plan_args(), "-o", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return path


def test_buildx_resolves_the_file_to_the_layers_invoke_build_plans(out, bake_file):
    printed = buildx(out, "bake", "-f", str(bake_file), "--print")
    assert printed.returncode == 0, printed.stderr
    resolved = json.loads(printed.stdout)
    dry = invoke(out, "build", *plan_args(), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    steps = [s for s in json.loads(dry.stdout)["steps"] if s["tag"]]
    assert resolved["group"]["default"]["targets"] == [s["layer"] for s in steps]
    for step in steps:
        target = resolved["target"][step["layer"]]
        assert target["tags"] == [step["tag"], *step["moving_tags"]]
        assert target["args"] == {
            "BASE_IMAGE": step["base_ref"],
            **step["args"],
            **step["hint_args"],
        }
        assert target["labels"]["org.attnforge.hash"] == step["hash"]
        if step["parent"]:
            assert target["contexts"] == {step["base_ref"]: f"target:{step['parent']}"}
        assert Path(target["context"], "Dockerfile").is_file()


@pytest.mark.slow
def test_bake_builds_the_cpu_stack_under_invoke_builds_content_tags(out, bake_file):
    built = buildx(out, "bake", "-f", str(bake_file), "--load", "--progress=plain")
    if built.returncode != 0 and NO_NAMED_CONTEXTS in built.stdout + built.stderr:
        line = next(x for x in (built.stdout + built.stderr).splitlines() if NO_NAMED_CONTEXTS in x)
        pytest.skip(f"this engine's BuildKit has no named contexts: {line.strip()}")
    assert built.returncode == 0, built.stderr[-3000:]
    proc = invoke(out, "build", *plan_args())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outcomes(proc.stdout) == dict.fromkeys(
        ["base", "torch-cpu", "cpp-extension", "apps", "triton", "validate"], "cached"
    )
