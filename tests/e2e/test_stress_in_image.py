"""End to end: `python -m validate stress` inside the built cpu image, on a real Docker engine.

The cpu stack is built (in its own copy of the tree and image namespace) by the `tree` fixture
(tests/e2e/conftest.py); the stress run then happens in a container of that image, as a user runs it,
with a crash planted mid-run through the VALIDATE_STRESS_FAULT testing hook.
"""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from tests.e2e.conftest import cpu_stack_tree

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAMESPACE = f"attnforge-e2e-stress-{uuid.uuid4().hex[:8]}"
tree = cpu_stack_tree("e2e-stress", NAMESPACE)


def test_stress_in_the_cpu_image_reports_a_planted_crash_at_its_iteration(tree, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [
            "docker", "run", "--rm", "-v", f"{out}:/out",
            "-e", "VALIDATE_STRESS_FAULT=segfault@2:sdpa.default",
            f"{NAMESPACE}/cpu:cpu",
            "python3", "-m", "validate", "stress", "--workload", "qwen-image", "--tiny",
            "--backend", "sdpa.default,sdpa.math,kernels.sdpa_shim", "--iters", "3",
            "--json", "/out/stress-qwen-image.json",
        ],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads((out / "stress-qwen-image.json").read_text())
    assert doc["kind"] == "attnforge.stress" and doc["env"]["device"] == "cpu"
    assert [s["sq"] for s in doc["shapes"]] == [64, 64]  # both presets, shrunk
    by = {r["backend"]: r for r in doc["runs"]}
    crashed = by["sdpa.default"]
    assert crashed["status"] == "crash" and crashed["iters_completed"] == 1
    assert crashed["first_failure"]["iteration"] == 2
    assert "SIGSEGV during iteration 2" in crashed["first_failure"]["message"]
    assert by["sdpa.math"]["status"] == "pass" and by["sdpa.math"]["iters_completed"] == 3
    # the image's triton runs the bundled kernels in its CPU interpreter, through the shim
    shim = by["kernels.sdpa_shim"]
    assert shim["status"] == "pass", shim
    assert "shim routed 6 call(s), fell back 0" in shim["message"]
