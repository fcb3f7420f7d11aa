"""End to end on a real Docker engine and registry: the benchmark published with an image is the
baseline `--baseline IMAGE` finds.

Builds the cpu stack in a copy of the tree under its own namespace, validates it with a small
bench (sdpa.math only), publishes it to the local registry, then validates again against the
published image by tag and by digest. The tests in this module run in order and share one tree.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import cpu_stack_tree
from tests.e2e.test_cpu_stack import REGISTRY, invoke

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAMESPACE = f"attnforge-e2e-baseline-{uuid.uuid4().hex[:8]}"
BENCH = ["--quick", "--bench", "--bench-backend", "sdpa.math"]


tree = cpu_stack_tree("e2e-baseline", NAMESPACE, registry=True)


def validate(tree: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return invoke(tree, "validate", "--arch", "cpu", "--namespace", NAMESPACE, *BENCH, *extra,
                  timeout=1800)  # fmt: skip


def test_publish_keeps_the_validated_report_and_bench_by_digest(tree):
    first = validate(tree)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    reports = tree / "reports/cpu/cpu"
    stamp = json.loads((reports / "validated.json").read_text())
    assert set(stamp["documents"]) >= {"report.json", "bench.json", "bench_train.json"}
    assert (reports / "baseline" / "bench.json").is_file()  # the first passing run is kept

    target = f"{REGISTRY}/{NAMESPACE}"
    published = invoke(tree, "publish", "--arch", "cpu", "--namespace", NAMESPACE, "--to", target)
    assert published.returncode == 0, published.stdout + published.stderr
    manifest = json.loads((reports / "publish.json").read_text())
    digest = next(r["digest"] for r in manifest["refs"] if r["ref"] == f"{target}/cpu:cpu")
    snapshot = reports / "published" / digest.removeprefix("sha256:")[:12]
    assert f"kept in {snapshot}" in " ".join(published.stdout.split())
    assert (snapshot / "bench.json").read_bytes() == (reports / "bench.json").read_bytes()
    assert json.loads((snapshot / "publish.json").read_text())["snapshot_left_out"] == []


def test_baseline_image_by_tag_and_by_digest_finds_the_published_bench(tree):
    reports = tree / "reports/cpu/cpu"
    manifest = json.loads((reports / "publish.json").read_text())
    target = f"{REGISTRY}/{NAMESPACE}"
    digest = next(r["digest"] for r in manifest["refs"] if r["ref"] == f"{target}/cpu:cpu")
    snapshot = reports / "published" / digest.removeprefix("sha256:")[:12]
    for ref in (f"{target}/cpu:cpu", f"{target}/cpu@{digest}"):
        proc = validate(tree, "--baseline", ref)
        said = " ".join(proc.stdout.split())
        assert proc.returncode == 0, said[-3000:] + proc.stderr[-2000:]
        assert f"baseline: {ref} (published; {snapshot})" in said
        compared = json.loads((reports / "baseline-compare.json").read_text())
        assert compared["baseline"]["source"] == f"{ref} (published; {snapshot})"
        assert compared["counts"]["ungated"] > 0  # the cpu stack gates nothing: shown, not judged

    missing = validate(tree, "--baseline", f"{target}/cpu@sha256:{'0' * 64}")
    assert missing.returncode == 2
    assert "no report published with that image is kept" in " ".join(missing.stderr.split())
