"""The suite for real on this machine's CPU torch: what it observes, and the report it writes."""

import json
import shutil
import textwrap

import pytest

CPU_EXPECT = {
    "stack": "cpu",
    "arch": "cpu",
    "expect": {
        "torch.hip": False,
        "torch.cuda": False,
        "torch.gpu_available": False,
        "sdpa.default_backend": "flash",
        "sdpa.flash.works": True,
        "sdpa.math.works": True,
        "sdpa.efficient.works": False,
        "flash_attn.backend": "absent",
    },
}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, run_validate):
    tmp = tmp_path_factory.mktemp("quick")
    expect = tmp / "expect.json"
    expect.write_text(json.dumps(CPU_EXPECT))
    # The bundled kernels' cases and the apps' models belong to their own tests
    # (test_without_a_gpu_the_bundled_kernels_run_in_the_interpreter, test_apps.py); here they
    # are left out.
    proc = run_validate(
        "--quick",
        "--skip",
        "kernels.case.*",
        "--skip",
        "apps.*",
        "--json",
        str(tmp / "r.json"),
        "--md",
        str(tmp / "r.md"),
        "--expect",
        str(expect),
    )
    report = json.loads((tmp / "r.json").read_text())
    return proc, report, (tmp / "r.md").read_text()


@pytest.mark.slow
def test_quick_run_on_cpu_torch_passes(quick_run):
    proc, report, _ = quick_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["summary"]["status"] == "pass"
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_report_matches_schema(quick_run, schema_errors):
    assert schema_errors(quick_run[1]) == []


@pytest.mark.slow
def test_env_observes_cpu_torch(quick_run):
    obs = quick_run[1]["observations"]
    import torch

    assert obs["torch.version"] == torch.__version__
    assert obs["torch.hip"] is False and obs["torch.cuda"] is False
    assert obs["torch.gpu_available"] is False
    assert "torch.device_arch" not in obs


@pytest.mark.slow
def test_cpu_sdpa_is_reported_honestly(quick_run):
    report = quick_run[1]
    rows = {r["case"]: r for r in report["backend_matrix"]}
    from validate import grid

    assert set(rows) == set(grid.QUICK)
    for row in rows.values():
        assert row["device"] == "cpu"
        # torch picks its CPU flash kernel, and the profiler sees the same aten op
        assert row["default_backend"] == "flash"
        assert row["profiler_backend"] == "flash"
        assert row["backends"]["flash"]["run"] == "pass"
        assert row["backends"]["math"]["run"] == "pass"
        for b in ("efficient", "cudnn"):
            assert row["backends"][b]["run"] == "skip"
            assert "no CPU kernel" in row["backends"][b]["error"]
        assert row["backends"]["flash"]["can_use"] is False
        assert row["backends"]["flash"]["reasons"]
    assert rows["fp16-d64-s512"]["params"]["seqlen_q"] <= 256  # capped on CPU


@pytest.mark.slow
def test_rocm_only_apis_are_a_skip_with_reason(quick_run):
    rec = next(c for c in quick_run[1]["checks"] if c["id"] == "sdpa.rocm")
    assert rec["status"] == "skip"
    assert "not a ROCm build" in rec["message"]


@pytest.mark.slow
def test_expectations_are_evaluated(quick_run):
    exp = quick_run[1]["expectations"]
    assert exp["stack"] == "cpu"
    assert all(r["status"] == "met" for r in exp["results"]), exp["results"]
    assert "### Expectations" in quick_run[2]


@pytest.mark.slow
def test_disabling_flash_changes_the_pick_and_a_broken_promise_fails_the_run_with_a_sentence(
    tmp_path, run_validate
):
    # One run for two promises: the prelude's change reaches the pick (math, not flash), and a
    # promise the run does not keep fails it with one sentence and counts in the summary.
    prelude = tmp_path / "prelude.py"
    prelude.write_text("import torch\ntorch.backends.cuda.enable_flash_sdp(False)\n")
    expect = tmp_path / "e.json"
    expect.write_text(json.dumps({"expect": {"sdpa.default_backend": "flash"}}))
    proc = run_validate(
        "backends",
        "--only",
        "env",
        "--only",
        "sdpa.config",
        "--only",
        "sdpa.case.fp16-d64-s512",
        "--expect",
        str(expect),
        "--json",
        str(tmp_path / "r.json"),
        env={"VALIDATE_PRELUDE": str(prelude)},
    )
    assert proc.returncode == 1
    assert (
        "The stack promised sdpa.default_backend = flash, but validation saw math." in proc.stdout
    )
    assert "enable_flash_sdp(False)" in proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["summary"]["broken_expectations"] == 1
    assert report["summary"]["failed_required"] == []


@pytest.mark.slow
def test_expectation_on_a_check_not_run_names_the_command(tmp_path, run_validate):
    expect = tmp_path / "e.json"
    expect.write_text(json.dumps({"expect": {"flash_attn.backend": "triton"}}))
    proc = run_validate("env", "--expect", str(expect))
    assert proc.returncode == 1
    assert "check flash_attn.info is not part of command 'env'" in proc.stdout


FAKE_CHECK = textwrap.dedent(
    """
    import os

    def list_cases(quick):
        return ["good", "bad", "skipped", "segv"] if quick else ["good"]

    def run_case(name):
        if name == "segv":
            import ctypes
            ctypes.string_at(0)
        status = {"good": "pass", "bad": "fail", "skipped": "skip"}[name]
        return {"status": status, "message": name, "metrics": {"err": 0.5, "flag": True}}
    """
)
FAKE_SHIM = "def stats():\n    return {'routed': 3, 'fallback': 1, 'reasons': {'dtype': 1}}\n"


def _image_tree(tmp_path, repo):
    """What validate.Dockerfile copies beside each other, less attnforge_kernels/."""
    for pkg in ("validate", "contract"):
        shutil.copytree(repo / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))


def _fake_tree(tmp_path, repo, check_src=FAKE_CHECK):
    """validate/ and contract/ beside a stand-in attnforge_kernels package, as in an image."""
    _image_tree(tmp_path, repo)
    (tmp_path / "attnforge_kernels").mkdir()
    (tmp_path / "attnforge_kernels" / "__init__.py").write_text("")
    (tmp_path / "attnforge_kernels" / "check.py").write_text(check_src)
    (tmp_path / "attnforge_kernels" / "sdpa_shim.py").write_text(FAKE_SHIM)
    return tmp_path


@pytest.mark.slow
def test_kernels_cases_report_their_own_status_and_a_segfault_is_that_cases_crash(
    tmp_path, repo, run_validate
):
    root = _fake_tree(tmp_path, repo)
    proc = run_validate("kernels", "--quick", "--json", "r.json", cwd=root)
    report = json.loads((root / "r.json").read_text())
    by_id = {c["id"]: c for c in report["checks"]}
    assert by_id["kernels.list"]["status"] == "pass"
    assert by_id["kernels.case.good"]["status"] == "pass"
    assert by_id["kernels.case.good"]["metrics"] == {
        "err": 0.5,
        "shim.routed": 3.0,
        "shim.fallback": 1.0,
    }
    assert by_id["kernels.case.bad"]["status"] == "fail"
    assert by_id["kernels.case.skipped"]["status"] == "skip"
    assert by_id["kernels.case.segv"]["status"] == "crash"
    assert by_id["kernels.case.segv"]["signal"] == "SIGSEGV"
    assert report["observations"]["kernels.works"] is False
    assert proc.returncode == 1


@pytest.mark.slow
def test_kernels_absent_is_a_skip(tmp_path, repo, run_validate):
    _image_tree(tmp_path, repo)
    proc = run_validate("kernels", "--json", "r.json", cwd=tmp_path)
    report = json.loads((tmp_path / "r.json").read_text())
    rec = next(c for c in report["checks"] if c["id"] == "kernels.list")
    assert rec["status"] == "skip" and "not importable" in rec["message"]
    assert report["observations"]["kernels.present"] is False
    assert proc.returncode == 0


@pytest.mark.slow
def test_without_a_gpu_the_bundled_kernels_run_in_the_interpreter(tmp_path, run_validate):
    # The cpu stack's promise (recipes/stacks.yaml): the kernels' cases run and pass on CPU,
    # with TRITON_INTERPRET unset as in the image (run_validate drops it).
    promise = {"kernels.present": True, "kernels.works": True}
    expect = tmp_path / "expect.json"
    expect.write_text(json.dumps({"stack": "cpu", "arch": "cpu", "expect": promise}))
    proc = run_validate(
        "kernels", "--json", str(tmp_path / "r.json"), "--expect", str(expect),
        env={"CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    report = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = next(c for c in report["checks"] if c["id"] == "kernels.list")
    assert listed["status"] == "pass" and listed["details"]["interpreter"] is True
    cases = [c for c in report["checks"] if c["id"].startswith("kernels.case.")]
    assert len(cases) == len(listed["details"]["cases"]) >= 5
    assert all(c["status"] == "pass" for c in cases), [(c["id"], c["message"]) for c in cases]
    ids = " ".join(c["id"] for c in cases)
    for feature in ("causal", "window", "varlen", "alibi", "softcap", "shim-routing"):
        assert feature in ids
    assert report["observations"]["kernels.works"] is True
