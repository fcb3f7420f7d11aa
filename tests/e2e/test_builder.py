"""`invoke build --builder` for real, on the one BuildKit builder this machine has: buildx's
`default` builder (the docker driver, the local engine's BuildKit), driven by Debian 13's docker
CLI and buildx plugin taken out of the image `tools/setup.sh buildx-tools` makes.

The builder is local, so this does not show that a remote one works (none is available here:
docs/ci.md); it does run the whole `--builder` path for real: `docker buildx build --builder`,
with --push the result sent straight to the registry beside its content tag, pulled back for the
smoke checks, then tagged and pushed layer by layer, and the state a second build finds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.conftest import COPY_IGNORE, REPO, outputs_env, run_invoke
from tests.e2e.test_bake_buildx import BUILDX_IMAGE, _missing
from tests.e2e.test_cpu_stack import (
    BASE,
    CA_CERT,
    REGISTRY,
    WHEELHOUSE,
    _need_registry,
    outcomes,
    remove_images,
    unavailable,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAMESPACE = f"attnforge-builder-{uuid.uuid4().hex[:8]}"
LAYERS = ["base", "torch-cpu", "cpp-extension", "apps", "triton", "validate"]


@pytest.fixture(scope="module")
def buildx_env(tmp_path_factory) -> dict[str, str]:
    """ATTNFORGE_DOCKER and DOCKER_CONFIG for a docker CLI with the buildx plugin."""
    problem = _missing()
    if problem:
        unavailable(
            f"the builder tests are required here but cannot run: {problem}",
            f"no buildx for the builder tests: {problem}",
        )
    where = tmp_path_factory.mktemp("buildx")
    (where / "cli-plugins").mkdir()
    ctr = subprocess.run(
        ["docker", "create", BUILDX_IMAGE], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        for src, dst in (
            ("/usr/bin/docker", where / "docker"),
            (
                "/usr/libexec/docker/cli-plugins/docker-buildx",
                where / "cli-plugins" / "docker-buildx",
            ),
        ):
            subprocess.run(
                ["docker", "cp", f"{ctr}:{src}", str(dst)], check=True, capture_output=True
            )
    finally:
        subprocess.run(["docker", "rm", ctr], capture_output=True)
    env = {**os.environ, "ATTNFORGE_DOCKER": str(where / "docker"), "DOCKER_CONFIG": str(where)}
    runs = subprocess.run([env["ATTNFORGE_DOCKER"], "buildx", "version"], env=env,
                          capture_output=True, text=True)  # fmt: skip
    if runs.returncode != 0:  # e.g. a host whose C library is older than Debian 13's
        pytest.skip(f"Debian 13's docker CLI does not run on this host: {runs.stderr.strip()}")
    yield env
    remove_images(NAMESPACE)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the tree: the plan of a later step must see the files the build saw."""
    dest = tmp_path_factory.mktemp("builder") / "tree"
    shutil.copytree(REPO, dest, ignore=COPY_IGNORE)
    return dest


def build(tree: Path, out: Path, env: dict[str, str], namespace: str, *extra: str):
    args = ["build", "--arch", "cpu", "--base-image", BASE, "--namespace", namespace,
            "--builder", "default", *extra]  # fmt: skip
    if Path(WHEELHOUSE).is_dir():
        args += ["--wheelhouse", WHEELHOUSE, "--set", "torch-cpu.TORCH_INDEX_URL="]
    args += ["--ca-cert", CA_CERT if Path(CA_CERT).is_file() else "none"]
    return run_invoke(tree, *args, env=outputs_env(out, env), timeout=1800)


def registry_tags(repo: str) -> set[str]:
    with urllib.request.urlopen(f"http://{REGISTRY}/v2/{repo}/tags/list", timeout=30) as resp:
        return set(json.load(resp)["tags"] or [])


def test_with_push_each_layer_goes_through_the_registry_and_is_checked_before_its_tags(
    buildx_env, tree, tmp_path
):
    _need_registry()
    namespace = f"{REGISTRY}/{NAMESPACE}"
    proc = build(tree, tmp_path, buildx_env, namespace, "--push")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert outcomes(proc.stdout) == dict.fromkeys(LAYERS, "built")
    plan = json.loads(
        build(tree, tmp_path, buildx_env, namespace, "--dry-run", "--json").stdout or "{}"
    )
    for step in plan["steps"]:
        layer, tag = step["layer"], step["tag"]
        log = (tmp_path / "build/logs/cpu" / f"{layer}.log").read_text()
        first = log.splitlines()[0]
        assert " buildx build --builder default --output " in first
        assert f"type=image,name={tag}-unchecked,push=true" in first
        assert "$ smoke checks in" in log  # the pulled image was checked
        key = tag.rsplit(":", 1)[1]
        assert {key, f"{key}-unchecked", "cpu"} <= registry_tags(f"{NAMESPACE}/{layer}")
        assert step["status"] == "cached"  # the second plan finds every content tag
    assert "cpu" in registry_tags(f"{NAMESPACE}/cpu")


def test_without_push_the_result_is_loaded_into_the_engine(buildx_env, tree, tmp_path):
    proc = build(tree, tmp_path, buildx_env, f"{NAMESPACE}-load", "--only", "base")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert outcomes(proc.stdout) == {"base": "built"}
    # the note for remote builders
    assert "can only pull from a registry" in " ".join(proc.stdout.split())
    first = (tmp_path / "build/logs/cpu/base.log").read_text().splitlines()[0]
    assert " buildx build --builder default --load " in first
