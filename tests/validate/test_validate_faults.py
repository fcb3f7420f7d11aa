"""Fault injection: each way a check can die is classified, and the rest of the run completes."""

import json

import pytest


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory, run_validate, repo):
    tmp = tmp_path_factory.mktemp("faults")
    checks = repo / "tests" / "validate" / "fault_checks.py"
    proc = run_validate(
        "env",
        "--timeout",
        "60",
        "--json",
        str(tmp / "r.json"),
        "--md",
        str(tmp / "r.md"),
        env={"VALIDATE_EXTRA_CHECKS": str(checks)},
    )
    return proc, json.loads((tmp / "r.json").read_text()), (tmp / "r.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("check_id", "status", "fragment"),
    [
        ("fault.segfault", "crash", "killed by SIGSEGV during dereferencing NULL"),
        ("fault.abort", "crash", "killed by SIGABRT during calling abort()"),
        ("fault.hang", "timeout", "no result before the timeout during sleeping forever"),
        ("fault.raise", "fail", "raised ValueError: deliberate failure from a test check"),
        ("fault.nan", "fail", "non-finite values (NaN/inf) in the output"),
        ("fault.exit", "crash", "exited with status 3 without a result"),
        (
            "fault.gpu_fault_text",
            "crash",
            "GPU fault: RuntimeError: CUDA error: an illegal memory access",
        ),
        ("fault.leaves_child", "pass", "left a child behind"),
        ("fault.optional_fail", "fail", "deliberate failure"),
        ("fault.ok", "pass", "fine"),
        ("env", "pass", "torch"),
    ],
)
def test_each_fault_is_classified(fault_run, check_id, status, fragment):
    rec = next(c for c in fault_run[1]["checks"] if c["id"] == check_id)
    assert rec["status"] == status
    assert fragment in rec["message"]


@pytest.mark.slow
def test_the_run_completes_in_order_and_fails(fault_run):
    proc, report, _ = fault_run
    ids = [c["id"] for c in report["checks"]]
    assert ids[0] == "env" and ids[-1] == "fault.ok"
    assert len(ids) == 11
    assert proc.returncode == 1
    assert report["summary"]["counts"] == {
        "pass": 3,
        "fail": 3,
        "skip": 0,
        "crash": 4,
        "timeout": 1,
    }
    assert "fault.optional_fail" not in report["summary"]["failed_required"]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_signal_and_progress_are_recorded(fault_run):
    segv = next(c for c in fault_run[1]["checks"] if c["id"] == "fault.segfault")
    assert segv["signal"] == "SIGSEGV" and segv["returncode"] == -11
    assert segv["progress"] == ["dereferencing NULL"]
    hang = next(c for c in fault_run[1]["checks"] if c["id"] == "fault.hang")
    assert 2.5 < hang["duration_s"] < 30  # its own 3 s timeout, not the run's 60 s


@pytest.mark.slow
def test_a_leftover_child_process_does_not_make_a_check_hang(fault_run):
    rec = next(c for c in fault_run[1]["checks"] if c["id"] == "fault.leaves_child")
    assert rec["duration_s"] < 20  # the child sleeps 120 s holding the check's stdout


@pytest.mark.slow
def test_markdown_lists_the_failures(fault_run):
    md = fault_run[2]
    assert "| 💥 crash | `fault.segfault` |" in md
    assert "| ⏱️ timeout | `fault.hang` |" in md
    assert "`fault.optional_fail` (optional)" in md


def test_an_optional_failure_does_not_fail_the_run(run_validate, repo):
    checks = repo / "tests" / "validate" / "fault_checks.py"
    proc = run_validate(
        "env",
        "--only",
        "fault.optional_fail",
        "--only",
        "fault.ok",
        env={"VALIDATE_EXTRA_CHECKS": str(checks)},
    )
    assert proc.returncode == 0, proc.stdout
    assert "fail  fault.optional_fail (optional)" in proc.stdout
