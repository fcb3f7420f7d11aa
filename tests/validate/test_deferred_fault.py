"""A fault that surfaces at the next op is charged to the backend that caused it (issue 16 §3)."""

from __future__ import annotations

import json

from tests.validate.conftest import REPO, run_validate


def test_a_deferred_fault_is_the_forced_backends_and_the_other_checks_still_run(tmp_path):
    marker = tmp_path / "poisoned"
    proc = run_validate(
        "backends", "--only", "sdpa.case.fp16-d64-s512", "--only", "sdpa.case.fp16-d33-s77",
        "--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md"),
        env={"VALIDATE_PRELUDE": str(REPO / "tests/validate/deferred_fault_prelude.py"),
             "DEFERRED_FAULT_MARKER": str(marker)},
    )  # fmt: skip
    assert marker.exists(), proc.stdout + proc.stderr  # the plant went off
    doc = json.loads((tmp_path / "r.json").read_text())
    checks = {c["id"]: c for c in doc["checks"]}
    first, second = checks["sdpa.case.fp16-d64-s512"], checks["sdpa.case.fp16-d33-s77"]
    assert first["status"] == "crash"
    assert first["message"].startswith(
        "GPU fault in the checked op after the forced flash run (deferred, charged to flash)"
    )
    assert "planted deferred fault" in first["message"]
    flash = first["details"]["backends"]["flash"]
    assert flash["run"] == "deferred-fault" and "invalid argument" in flash["error"]
    assert "run" not in first["details"]["backends"]["math"]  # the poisoned process stopped
    assert second["status"] == "pass"  # a fresh process: the fault did not leak
    row = next(r for r in doc["backend_matrix"] if r["case"] == "fp16-d64-s512")
    assert row["backends"]["flash"]["run"] == "deferred-fault"
    assert "💥 deferred" in (tmp_path / "r.md").read_text()
    assert proc.returncode == 1


def test_the_grid_covers_the_vit_sd_and_largest_head_dims():
    from validate.grid import GRID

    assert {80, 96, 256} <= {c.head_dim for c in GRID}
