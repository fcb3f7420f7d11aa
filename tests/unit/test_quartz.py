"""Nightlies chosen by AMD's qualification feed (ROCm/Quartz status.json), not by index recency:
`pins.update --channel nightly --offline DIR` reads saved status files laid out by URL.

The status files are written here in the shape ROCm/Quartz docs/status-json/README.md and
status_json_reference.jsonc (schema 2.0, read 2026-11-25 at c584fbd5) document, as the real
release-nightly/20260822/status.json has it: a PyTorch build per (py, torch branch) variant and
per-leaf test variants, leaves named for an arch (gfx1151) or a family (gfx94X-dcgpu)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge.errors import UserError
from attnforge.pins import quartz
from attnforge.pins import update as pins_update
from tests.unit.conftest import pins_update_cmd as update
from tests.unit.conftest import propose, proposed

FEED = "raw.githubusercontent.com/ROCm/Quartz/main/release-nightly"


def status(date: str, leaves: dict[str, str], branch: str = "nightly", build: str = "success"):
    def variant(state: str) -> dict:
        return {"py": "3.12", "torch": branch, "run_id": 1000 + int(date[-2:]),
                "run_attempt": 1, "status": state}  # fmt: skip

    return {
        "schema_version": "2.0",
        "release_type": "nightly",
        "rocm_version": f"10.2.0a{date}",
        "build_date": date,
        "summary": {"overall_status": "failure", "linux": {"status": "failure"}},
        "pipelines": {
            "pytorch": {
                "build": {"linux": {"status": build, "variants": [variant(build)]}},
                "test": {
                    "linux": {
                        leaf: {"run_id": 1, "status": state, "variants": [variant(state)]}
                        for leaf, state in leaves.items()
                    }
                },
            }
        },
    }


def save(offline: Path, data: dict | str, date: str) -> Path:
    path = offline / FEED / date / "status.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("arch", "leaves", "leaf"),
    [
        ("gfx1151", ["gfx94X-dcgpu", "gfx1151", "gfx115X-all"], "gfx1151"),
        ("gfx942", ["gfx94X-dcgpu", "gfx110X-all"], "gfx94X-dcgpu"),
        ("gfx1101", ["gfx94X-dcgpu", "gfx110X-all"], "gfx110X-all"),
        ("gfx950", ["gfx950-dcgpu"], "gfx950-dcgpu"),
        ("gfx1201", ["gfx110X-all"], None),
    ],
)  # fmt: skip
def test_an_arch_is_tested_under_its_own_leaf_or_its_familys(arch, leaves, leaf):
    assert quartz.leaf_for(arch, leaves) == leaf


def test_the_newest_nightly_whose_arch_failed_is_skipped_for_the_one_that_passed(tree, offline):
    # the index's newest complete nightly is 20261119 (test_pins_update); the feed says gfx1151's
    # tests of it failed, while 20261118 passed on the family leaf
    save(offline, status("20261119", {"gfx1151": "failure", "gfx94X-dcgpu": "success"}), "20261119")
    save(offline, status("20261118", {"gfx115X-all": "success"}), "20261118")
    proc = update(tree, "--channel", "nightly", "--offline", str(offline), "--torch-branch",
                  "nightly")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--set rocm-sdk.ROCM_VERSION=10.2.0a20261118" in proc.stdout
    assert "--set pytorch-wheels.TORCH_VERSION=2.15.0a0+rocm10.2.0a20261118" in proc.stdout
    err = " ".join(proc.stderr.split())
    assert "ROCm 10.2.0a20261119: Quartz 20261119: gfx1151 tests of torch nightly, Python 3.12:" \
        " failure" in err  # fmt: skip
    assert f"trusted the Quartz record {offline / FEED}/20261118/status.json" in err
    assert "gfx115X-all tests passed for torch nightly, Python 3.12 (test run 1018)" in err


def test_a_branch_the_feed_never_built_leaves_no_nightly_and_says_why(tree, offline):
    for date in ("20261118", "20261119"):
        save(offline, status(date, {"gfx1151": "success"}, branch="release/2.15"), date)
    with pytest.raises(UserError) as info:
        feed = pins_update.read_feed(offline)
        propose(tree, offline, "nightly", feed=feed, torch_branch="release/2.99")
    assert "no Linux PyTorch build of torch release/2.99, Python 3.12" in info.value.message


def test_a_failed_pytorch_build_is_not_trusted_whatever_the_tests_say(tree, offline):
    save(offline, status("20261119", {"gfx1151": "success"}, build="failure"), "20261119")
    save(offline, status("20261118", {"gfx1151": "success"}), "20261118")
    feed = pins_update.read_feed(offline)
    picks = proposed(propose(tree, offline, "nightly", feed=feed, torch_branch="nightly"))
    assert picks["ROCM_VERSION"] == "10.2.0a20261118"


def test_a_malformed_status_file_is_a_one_sentence_error_naming_it(tree, offline):
    bad = save(offline, '{"schema_version": "2.0", "pipelines": {', "20261119")
    proc = update(tree, "--channel", "nightly", "--offline", str(offline))
    assert proc.returncode == 2
    assert str(bad) in proc.stderr and "not valid JSON" in proc.stderr
    assert "Traceback" not in proc.stderr
    bad.write_text(json.dumps({"schema_version": "2.0"}))
    proc = update(tree, "--channel", "nightly", "--offline", str(offline))
    assert proc.returncode == 2 and "no 'rocm_version'" in proc.stderr and str(bad) in proc.stderr


def test_without_a_saved_feed_the_proposal_says_it_was_not_gated(tree, offline):
    notes = propose(tree, offline, "nightly").notes
    assert any("no Quartz feed was read" in n for n in notes)


def test_the_stack_follows_the_stable_channels_torch_branch_by_default(tree):
    from attnforge.recipes import load_recipes

    assert pins_update.torch_branch_of(load_recipes(tree)) == "release/2.13"
