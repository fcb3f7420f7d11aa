"""End to end on a real Docker engine and registry: publish the validated cpu stack, its SBOM
and provenance, and the bench published with it as the baseline `--baseline IMAGE` finds.

The stack is the session's one build, tagged into this module's namespace, with the session's one
validation (`invoke validate --quick --bench --stress llm --stress-iters 2`) copied into this
module's tree by the `tree` fixture (tests/e2e/conftest.py; test_validate_bench.py checks that
validation's documents). A validate run that fails early keeps them; publish refuses an image
that changed since; the stack is published once to the local registry (the digests it serves,
the snapshot of the validated bench); its SBOM and provenance are fetched back by digest and a
forged SBOM fails `invoke verify`; last, `invoke validate --baseline` finds the published bench by
tag and by digest. test_cpu_stack.py builds, caches, changes, fails, interrupts and resumes the
stack in a namespace of its own. The tests in this module run in order and share one tree.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest

from attnforge.publish import ociregistry
from attnforge.publish.ociregistry import Ref
from tests.e2e.conftest import cpu_stack_tree
from tests.e2e.test_cpu_stack import CPU_LAYERS, REGISTRY, _need_registry, invoke

pytestmark = pytest.mark.e2e

NAMESPACE = f"attnforge-e2e-publish-{uuid.uuid4().hex[:8]}"
BENCH = ["--quick", "--bench", "--bench-backend", "sdpa.math"]


tree = cpu_stack_tree("e2e-publish", NAMESPACE, validated=True)


def said(proc: subprocess.CompletedProcess[str]) -> str:
    return " ".join((proc.stdout + proc.stderr).split())


def validate(tree: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return invoke(tree, "validate", "--arch", "cpu", "--namespace", NAMESPACE, *BENCH, *extra,
                  timeout=1800)  # fmt: skip


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
    # what was validated is kept beside the publish record, by the final image's digest
    digest = next(r["digest"] for r in manifest["refs"] if r["ref"] == f"{target}/cpu:cpu")
    snapshot = tree / "reports/cpu/cpu/published" / digest.removeprefix("sha256:")[:12]
    assert f"kept in {snapshot}" in " ".join(proc.stdout.split())
    reports = tree / "reports/cpu/cpu"
    assert (snapshot / "bench.json").read_bytes() == (reports / "bench.json").read_bytes()
    assert json.loads((snapshot / "publish.json").read_text())["snapshot_left_out"] == []
    pull = (tree / "reports/cpu/cpu/publish.md").read_text()
    assert f"docker pull {target}/cpu@sha256:" in pull
    labels = json.loads(subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", f"{target}/cpu:cpu"],
        capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert labels["org.opencontainers.image.created"].endswith("Z")
    assert "numpy=" in labels["org.opencontainers.image.version"]


def test_the_published_sbom_and_provenance_verify_and_a_forged_one_fails(tree):
    """The validated image, published to the local registry: its SBOM and provenance are fetched
    back by digest, name that digest, and a tampered attachment fails `invoke verify`."""
    _need_registry()
    target = f"{REGISTRY}/{NAMESPACE}"
    manifest = json.loads((tree / "reports/cpu/cpu/publish.json").read_text())
    final = f"{target}/cpu:cpu"
    digest = next(r["digest"] for r in manifest["refs"] if r["ref"] == final)
    subject = Ref.parse(final)
    sbom = ociregistry.fetch_attachment(subject, digest, "sbom")
    prov = ociregistry.fetch_attachment(subject, digest, "att")
    assert sbom["digest"] == manifest["attestations"]["sbom"]["digest"]
    assert prov["digest"] == manifest["attestations"]["provenance"]["digest"]
    assert sbom["manifest"]["subject"]["digest"] == digest
    doc = json.loads(sbom["payload"])
    assert doc["metadata"]["component"]["version"] == digest
    purls = {c.get("purl", "") for c in doc["components"]}
    assert any(p.startswith("pkg:pypi/torch@2.13.0") for p in purls)
    assert any(p.startswith("pkg:deb/debian/python3@") for p in purls)
    statement = json.loads(base64.b64decode(json.loads(prov["payload"])["payload"]))
    assert statement["subject"][0]["digest"] == {"sha256": digest.removeprefix("sha256:")}
    layers = [
        i["layer"]
        for i in statement["predicate"]["buildDefinition"]["internalParameters"]["layers"]
    ]
    assert layers == CPU_LAYERS

    for ref in (final, f"{target}/cpu@{digest}"):
        ok = invoke(tree, "verify", "--image", ref)
        assert ok.returncode == 0, said(ok)[-2000:]
        assert "verified" in said(ok)

    # Tampered: an SBOM that claims another image, pushed over the attachment's tag.
    forged = json.dumps({**doc, "metadata": {**doc["metadata"], "component": {
        **doc["metadata"]["component"], "version": "sha256:" + "0" * 64}}}).encode()  # fmt: skip
    ociregistry.attach(subject, digest, "sbom", "application/vnd.cyclonedx+json",
                       "application/vnd.cyclonedx+json", forged)  # fmt: skip
    bad = invoke(tree, "verify", "--image", final)
    assert bad.returncode == 1, said(bad)[-2000:]
    assert f"the SBOM describes sha256:{'0' * 64}, not {digest}" in said(bad)


def test_baseline_image_by_tag_and_by_digest_finds_the_published_bench(tree):
    _need_registry()
    reports = tree / "reports/cpu/cpu"
    manifest = json.loads((reports / "publish.json").read_text())
    target = f"{REGISTRY}/{NAMESPACE}"
    digest = next(r["digest"] for r in manifest["refs"] if r["ref"] == f"{target}/cpu:cpu")
    snapshot = reports / "published" / digest.removeprefix("sha256:")[:12]
    for ref in (f"{target}/cpu:cpu", f"{target}/cpu@{digest}"):
        proc = validate(tree, "--baseline", ref)
        text = " ".join(proc.stdout.split())
        assert proc.returncode == 0, text[-3000:] + proc.stderr[-2000:]
        assert f"baseline: {ref} (published; {snapshot})" in text
        compared = json.loads((reports / "baseline-compare.json").read_text())
        assert compared["baseline"]["source"] == f"{ref} (published; {snapshot})"
        assert compared["counts"]["ungated"] > 0  # the cpu stack gates nothing: shown, not judged

    missing = validate(tree, "--baseline", f"{target}/cpu@sha256:{'0' * 64}")
    assert missing.returncode == 2
    assert "no report published with that image is kept" in " ".join(missing.stderr.split())
