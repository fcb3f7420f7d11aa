"""End to end on a real Docker engine: `invoke validate --bench --stress` on the cpu stack.

The session's one validation of the cpu stack (`invoke validate --quick --bench --stress llm
--stress-iters 2`, tests/e2e/conftest.py's `validated_cpu_stack`) is checked here: the report and
every document beside it. Then an image whose bench-train is broken is validated in this module's
copy of those reports: the run fails naming it, and the last good bench_train.json stays.
The tests in this module run in order and share one tree and namespace.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import cpu_stack_tree
from tests.e2e.test_cpu_stack import image_id, invoke

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAMESPACE = f"attnforge-e2e-bench-{uuid.uuid4().hex[:8]}"
BROKEN = f"{NAMESPACE}/broken-bench-train:cpu"


tree = cpu_stack_tree("e2e-bench", NAMESPACE, validated=True)


def _doc(path: Path, kind: str) -> dict:
    doc = json.loads(path.read_text())
    assert (doc["kind"], doc["version"]) == (kind, 1)
    assert doc["env"]["device"] == "cpu" and doc["env"]["torch"].endswith("+cpu")
    return doc


def test_validate_with_bench_and_stress_writes_every_document_beside_the_report(
    tree, validated_cpu_stack
):
    reports = tree / "reports/cpu/cpu"
    report = json.loads((reports / "report.json").read_text())
    assert "schema_version" in report and report["summary"]["status"] == "pass"
    assert (reports / "report.md").read_text().strip()
    expect = json.loads((reports / "expect.json").read_text())
    assert expect["expect"]["torch.hip"] is False
    # the host's thread caps reach the image (make test sets OMP_NUM_THREADS=1), or none is set
    seen = report["environment"]["env"]
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        assert seen.get(var) == (os.environ.get(var) or None), var

    bench = _doc(reports / "bench.json", "attnforge.bench")
    assert bench["size"] == "tiny" and bench["quick"]  # --quick: the one-shape tiny sweep
    assert {r["shape"]["name"] for r in bench["results"]} == {"sweep-b1-h1-s64-d128-fp16"}
    by = {(r["backend"], r["mode"]): r for r in bench["results"]}
    for mode in ("fwd", "bwd", "fwd_bwd"):
        assert by["sdpa.math", mode]["status"] == "ok" and by["sdpa.math", mode]["ms"] > 0
        assert by["kernels", mode]["status"] == "ok"  # in Triton's interpreter, in the image
        assert by["sdpa.efficient", mode]["status"] == "unsupported"
        assert by["flash_attn", mode]["status"] == "unsupported"  # not in the cpu stack

    train = _doc(reports / "bench_train.json", "attnforge.bench_train")
    assert train["loss_check"]["ok"] and train["loss_check"]["reference"] == "sdpa.math"
    ran = {r["backend"] for r in train["results"] if r["status"] == "ok"}
    assert {"sdpa.math", "sdpa.flash", "kernels"} <= ran

    stress = _doc(reports / "stress-llm.json", "attnforge.stress")
    assert stress["workload"] == "llm"
    assert {r["backend"]: r["status"] for r in stress["runs"]}["sdpa.math"] == "pass"

    stamp = json.loads((reports / "validated.json").read_text())
    assert stamp["passed"] is True
    assert stamp["tools"] == {"bench": 0, "bench-train": 0, "stress llm": 0}
    # the stamp names the shared tag; this module's tag is the same image (what publish checks)
    assert stamp["image"] == f"{validated_cpu_stack.namespace}/cpu:cpu"
    assert stamp["image_id"] == image_id(f"{NAMESPACE}/cpu:cpu")
    assert set(stamp["documents"]) >= {"report.json", "bench.json", "bench_train.json"}
    assert (reports / "baseline" / "bench.json").is_file()  # the first passing run is kept
    assert not list(validated_cpu_stack.reports.glob(".run-*"))


def test_a_broken_bench_train_fails_the_run_and_keeps_the_last_good_document(tree):
    reports = tree / "reports/cpu/cpu"
    last_train = (reports / "bench_train.json").read_bytes()
    last_bench = json.loads((reports / "bench.json").read_text())
    # The same image, with bench-train aborting (SIGABRT) as soon as it starts.
    dockerfile = (
        f"FROM {NAMESPACE}/cpu:cpu\n"
        "RUN sed -i 's/^def main(args: argparse.Namespace) -> int:$/&\\n    os.abort()/' "
        "/opt/attnforge/src/validate/bench_train.py && grep -q 'os.abort()' "
        "/opt/attnforge/src/validate/bench_train.py\n"
    )
    made = subprocess.run(
        ["docker", "build", "-q", "-t", BROKEN, "-"],
        input=dockerfile, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert made.returncode == 0 and image_id(BROKEN), made.stderr

    # sdpa.math alone: the run's bench must still write its document (it does not share
    # bench-train's fate), and timing every backend again here would add a minute, not coverage.
    proc = invoke(
        tree, "validate", "--arch", "cpu", "--namespace", NAMESPACE, "--image", BROKEN,
        "--quick", "--bench", "--bench-backend", "sdpa.math", timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = " ".join(proc.stdout.split())
    assert (
        "bench-train wrote no bench_train.json" in said and "previous one, if any, is kept" in said
    )
    assert (reports / "bench_train.json").read_bytes() == last_train
    new_bench = json.loads((reports / "bench.json").read_text())
    assert new_bench["created"] >= last_bench["created"] and new_bench != last_bench
    stamp = json.loads((reports / "validated.json").read_text())
    assert stamp["image"] == BROKEN and stamp["passed"] is False and stamp["exit"] == 0
    assert stamp["tools"]["bench-train"] != 0 and stamp["tools"]["bench"] == 0
