"""End to end on a real Docker engine and registry: validate the cpu stack in its image, then
publish it.

The stack is the session's one build, tagged into this module's namespace by the `tree` fixture
(tests/e2e/conftest.py); test_cpu_stack.py builds, caches, changes, fails, interrupts and resumes
it in a namespace of its own. The tests in this module run in order and share one tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid

import pytest

from tests.e2e.conftest import cpu_stack_tree
from tests.e2e.test_cpu_stack import CPU_LAYERS, REGISTRY, _need_registry, invoke

pytestmark = pytest.mark.e2e

NAMESPACE = f"attnforge-e2e-publish-{uuid.uuid4().hex[:8]}"


tree = cpu_stack_tree("e2e-publish", NAMESPACE)


def test_validate_runs_the_suite_in_the_image_and_writes_the_report(tree):
    proc = invoke(
        tree, "validate", "--arch", "cpu", "--namespace", NAMESPACE, "--quick", timeout=1200
    )
    report = tree / "reports/cpu/cpu/report.json"
    assert report.exists(), proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert "schema_version" in data
    assert (tree / "reports/cpu/cpu/report.md").read_text().strip()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expect = json.loads((tree / "reports/cpu/cpu/expect.json").read_text())
    assert expect["expect"]["torch.hip"] is False


def test_a_validate_run_that_fails_early_keeps_the_last_report_and_stamp(tree):
    reports = tree / "reports/cpu/cpu"
    names = ("report.json", "report.md", "validated.json", "expect.json")
    before = {n: (reports / n).read_bytes() for n in names}
    no_engine = dict(os.environ, DOCKER_HOST="unix:///nonexistent/docker.sock")
    for env, extra in ((no_engine, []), (None, ["--image", "attnforge-e2e-missing:none"])):
        proc = invoke(tree, "validate", "--arch", "cpu", "--namespace", NAMESPACE, *extra, env=env)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert {n: (reports / n).read_bytes() for n in names} == before
    assert not list(reports.glob(".run-*"))


def test_publish_refuses_an_image_that_changed_since_validation(tree):
    stamp = tree / "reports/cpu/cpu/validated.json"
    record = json.loads(stamp.read_text())
    stamp.write_text(json.dumps({**record, "image_id": "sha256:" + "0" * 64}))
    try:
        proc = invoke(
            tree,
            "publish",
            "--arch",
            "cpu",
            "--namespace",
            NAMESPACE,
            "--to",
            f"{REGISTRY or '127.0.0.1:5000'}/{NAMESPACE}",
        )
    finally:
        stamp.write_text(json.dumps(record))
    assert proc.returncode == 2 and "changed since it was validated" in " ".join(
        proc.stderr.split()
    )


def test_publish_pushes_the_validated_stack_to_a_real_registry(tree):
    _need_registry()
    target = f"{REGISTRY}/{NAMESPACE}"
    proc = invoke(tree, "publish", "--arch", "cpu", "--namespace", NAMESPACE, "--to", target)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    def tags(repo):
        with urllib.request.urlopen(
            f"http://{REGISTRY}/v2/{NAMESPACE}/{repo}/tags/list", timeout=30
        ) as resp:
            return sorted(json.load(resp)["tags"])

    # beside its tag, the final image's SBOM and provenance (cosign-style: sha256-<hex>.sbom/.att)
    final_tags = tags("cpu")
    assert [t for t in final_tags if not t.startswith("sha256-")] == ["cpu"]
    assert sorted(t.rsplit(".", 1)[1] for t in final_tags if t.startswith("sha256-")) == [
        "att",
        "sbom",
    ]
    for layer in CPU_LAYERS:
        got = tags(layer)
        assert "cpu" in got and any(t.startswith("cpu-") for t in got), (layer, got)
    subprocess.run(["docker", "pull", f"{target}/cpu:cpu"], capture_output=True, check=True)

    # the digests in publish.json are the ones the registry serves (asked here over HTTP)
    manifest = json.loads((tree / "reports/cpu/cpu/publish.json").read_text())
    assert manifest["validation"]["passed"] is True and manifest["versions"]["triton"]
    for r in manifest["refs"]:
        repo, tag = r["ref"].removeprefix(f"{REGISTRY}/").rsplit(":", 1)
        req = urllib.request.Request(
            f"http://{REGISTRY}/v2/{repo}/manifests/{tag}", method="HEAD",
            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.headers["Docker-Content-Digest"] == r["digest"], r["ref"]
    pull = (tree / "reports/cpu/cpu/publish.md").read_text()
    assert f"docker pull {target}/cpu@sha256:" in pull
    labels = json.loads(subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", f"{target}/cpu:cpu"],
        capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert labels["org.opencontainers.image.created"].endswith("Z")
    assert "numpy=" in labels["org.opencontainers.image.version"]
