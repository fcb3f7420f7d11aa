"""End to end on a real Docker engine and registry: the registry is the next runner's build cache.

Builds and pushes the cpu stack to a registry namespace (BuildKit's cache holds the session's
first build, so this costs the push), forgets those images, and builds again from the registry.
The images of the session's shared build (tests/e2e/conftest.py) are never touched: this module
builds and removes images under its own namespaces only.
"""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from tests.e2e.test_cpu_stack import (
    CPU_LAYERS,
    REGISTRY,
    _need_registry,
    build_args,
    copy_tree,
    image_id,
    invoke,
    outcomes,
    remove_images,
    require_engine,
)

pytestmark = pytest.mark.e2e

NAMESPACE = f"attnforge-e2e-regcache-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    require_engine()
    yield copy_tree(tmp_path_factory, "e2e-regcache")
    remove_images(NAMESPACE)


def test_the_registry_is_the_build_cache_of_the_next_runner(tree):
    """Push every layer to a registry namespace, forget every local image of the stack, build
    again with --cache-from: each layer is pulled (and smoke-checked), none is built, and the
    image ids and content tags are the first build's."""
    _need_registry()
    cache = f"{REGISTRY}/{NAMESPACE}-cache"
    pushed = invoke(tree, *build_args("--push", namespace=cache))
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    plan = json.loads(invoke(tree, *build_args("--dry-run", "--json", namespace=cache)).stdout)
    assert [s["status"] for s in plan["steps"]] == ["cached"] * len(
        CPU_LAYERS
    )  # what the push build made
    first = {s["layer"]: (s["tag"].split(":")[-1], image_id(s["tag"])) for s in plan["steps"]}

    ids = {image for _, image in first.values()}
    listed = subprocess.run(
        ["docker", "images", "--no-trunc", "--format", "{{.ID}} {{.Repository}}"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    elsewhere = {line.split()[0] for line in listed if not line.split()[1].startswith(f"{cache}/")}
    assert not ids & elsewhere  # removing them by id must not untag another namespace's images
    subprocess.run(["docker", "rmi", "-f", *ids], capture_output=True, check=True)
    assert all(image_id(s["tag"]) is None for s in plan["steps"])

    again_ns = f"{NAMESPACE}-again"
    dry = json.loads(
        invoke(
            tree, *build_args("--dry-run", "--json", "--cache-from", cache, namespace=again_ns)
        ).stdout
    )
    assert [s["status"] for s in dry["steps"]] == ["pull"] * len(CPU_LAYERS)
    proc = invoke(tree, *build_args("--cache-from", cache, namespace=again_ns))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outcomes(proc.stdout) == dict.fromkeys(CPU_LAYERS, "pulled")
    assert "smoke ok" in proc.stdout and "building" not in proc.stdout
    for layer, (content_tag, image) in first.items():
        assert image_id(f"{again_ns}/{layer}:{content_tag}") == image, layer
