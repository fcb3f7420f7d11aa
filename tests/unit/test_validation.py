"""Validation's promises, against a scripted engine: the requests are made before anything runs
and are exactly what the engine receives; the last report survives until a new complete one is
in place; the image stamp is written only for an image, and says whether the run passed; the
kept baseline is replaced only by a passing --bench run. --local is the same requests on this
host's Python (`LocalEngine`), run for real here. tests/e2e runs `invoke validate` on a real
Docker engine."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from attnforge import hostinfo, multiarch
from attnforge.baseline import gate
from attnforge.baseline import store as baseline_store
from attnforge.engine import LocalEngine, RunRequest
from attnforge.errors import UserError
from attnforge.plan import Options, resolve
from attnforge.recipes import load_recipes
from attnforge.validation import (
    COMPARE_OUTPUTS,
    Validation,
    device_flags,
    execute,
    plan_validation,
    report_target,
    tool_runs,
)
from attnforge.workspace import VALIDATED
from tests.conftest import REPO

IMAGE = "t/cpu:cpu"
SHAPE = "sweep-b1-h1-s64-d128-fp16"


def bench_doc(ms: float, created: str) -> dict:
    row = {"backend": "sdpa.math", "mode": "fwd", "status": "ok", "ms": ms, "ms_all": [ms] * 3,
           "shape": {"name": SHAPE, "family": "sweep", "b": 1, "h": 1, "hkv": 1, "sq": 64,
                     "sk": 64, "d": 128, "causal": False, "dtype": "fp16"},
           "tflops": None, "peak_mem_mb": None, "message": ""}  # fmt: skip
    return {"kind": "attnforge.bench", "version": 1, "created": created,
            "env": {"torch": "2.13.0+cpu", "triton": "3.6.0", "device": "cpu", "arch": None,
                    "hip": None, "cuda": None},
            "size": "tiny", "warmup": 1, "repeats": 3, "results": [row]}  # fmt: skip


@dataclass
class ScriptedEngine:
    """Records every request; writes what the suite and each tool would write into the folder
    mounted at /out, with scripted exit codes. `seen` records what the report folder held while
    the suite ran."""

    suite_exit: int = 0
    suite_writes: bool = True
    tool_exit: dict[str, int] = field(default_factory=dict)  # "bench" -> exit code
    bench_ms: float = 1.0
    images: dict[str, str] = field(default_factory=lambda: {IMAGE: "sha256:validated-image"})
    requests: list[RunRequest] = field(default_factory=list)
    seen: list[str | None] = field(default_factory=list)
    name: str = "scripted"

    def image_id(self, ref: str) -> str | None:
        return self.images.get(ref)

    def run_streaming(self, req: RunRequest, log, on_line=None) -> int:
        self.requests.append(req)
        (host, target, _ro), *_ = req.mounts
        out = Path(host)
        assert target == "/out" and out.is_dir() and out.name.startswith(".run-")
        tool = req.command[3]  # python3 -m validate <tool>
        log.write(f"{tool} ran\n")
        if on_line:
            on_line(f"{tool} ran")
        if tool == "all":
            report = out.parent / "report.json"
            self.seen.append(report.read_text() if report.exists() else None)
            assert (out / "expect.json").is_file()
            if self.suite_writes:
                (out / "report.json").write_text(json.dumps({"run": "new"}))
                (out / "report.md").write_text("# new\n")
            return self.suite_exit
        code = self.tool_exit.get(tool, 0)
        if tool == "bench":
            doc = bench_doc(self.bench_ms, "new")
            (out / "bench.json").write_text(json.dumps(doc))
        elif tool == "bench-train":
            (out / "bench_train.json").write_text("{}")
        return code


@pytest.fixture
def reports(tmp_path: Path) -> Path:
    """A report folder with a last run in it: report, stamp, bench and a kept baseline."""
    folder = tmp_path / "reports" / "cpu" / "cpu"
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps({"run": "old"}))
    (folder / "report.md").write_text("# old\n")
    (folder / VALIDATED).write_text(json.dumps({"image": IMAGE, "passed": True, "old": True}))
    (folder / "bench.json").write_text(json.dumps(bench_doc(1.0, "old")))
    baseline_store.keep(folder, {"kind": "attnforge.baseline", "version": 1, "old": True})
    return folder


def planned(reports: Path, *, image: str | None = IMAGE, bench: bool = False, base=None, gates=()):
    runs = tool_runs(bench, [], quick=True, tiny=True, timeout=0, stress_iters=10)
    return plan_validation(
        reports, {"stack": "cpu", "arch": "cpu"}, image=image, quick=True, timeout=0, runs=runs,
        env={"ATTNFORGE_ENGINE": "scripted"}, bench=bench, base=base, gates=gates,
    )  # fmt: skip


def kept_meta(reports: Path) -> dict:
    return json.loads((reports / baseline_store.KEPT / baseline_store.KEPT_META).read_text())


def test_the_requests_are_made_from_the_plan_and_are_what_the_engine_receives(reports):
    flags = device_flags("amd", dev_root=_fake_dev(reports.parent))
    runs = tool_runs(True, ["sd15"], quick=False, tiny=False, timeout=60, stress_iters=5)
    v = plan_validation(reports, {}, image=IMAGE, quick=False, timeout=60, runs=runs, flags=flags,
                        env={"ATTNFORGE_ENGINE": "scripted"})  # fmt: skip
    assert [r.command[3] for r in v.requests] == ["all", "bench", "bench-train", "stress"]
    assert v.suite.command == ["python3", "-m", "validate", "all", "--json", "/out/report.json",
                               "--md", "/out/report.md", "--expect", "/out/expect.json",
                               "--timeout", "60"]  # fmt: skip
    for req in v.requests:
        assert req.image == IMAGE
        assert req.devices == ["/dev/kfd", "/dev/dri"] and req.groups == ["video", "render"]
        assert req.mounts == [(v.run_dir.resolve(), "/out", False)]
        assert req.env == {"ATTNFORGE_ENGINE": "scripted"}
    engine = ScriptedEngine()
    execute(v, engine)
    assert engine.requests == v.requests


def _fake_dev(root: Path) -> Path:
    dev = root / "dev"
    dev.mkdir()
    (dev / "kfd").touch()
    (dev / "dri").mkdir()
    return dev


def test_the_new_report_replaces_the_last_only_once_complete(reports):
    engine = ScriptedEngine()
    progress: list[tuple[str, str]] = []
    result = execute(
        planned(reports), engine, lambda event, detail: progress.append((event, detail))
    )
    assert engine.seen == [json.dumps({"run": "old"})]  # the last report stayed while the suite ran
    assert json.loads((reports / "report.json").read_text()) == {"run": "new"}
    assert (reports / "report.md").read_text() == "# new\n"
    assert json.loads((reports / "expect.json").read_text()) == {"stack": "cpu", "arch": "cpu"}
    assert (reports / "validate.log").read_text() == "all ran\n"
    assert ("line", "all ran") in progress
    assert result.passed and result.code == 0
    assert not list(reports.glob(".run-*"))


def test_a_suite_that_writes_no_report_leaves_the_last_report_and_stamp(reports):
    before = {p.name: p.read_bytes() for p in reports.iterdir() if p.is_file()}
    engine = ScriptedEngine(suite_exit=3, suite_writes=False)
    with pytest.raises(
        UserError, match=r"the suite wrote no report \(exit 3\); see .*validate.log"
    ):
        execute(planned(reports, bench=True), engine)
    after = {p.name: p.read_bytes() for p in reports.iterdir() if p.is_file()}
    assert after == {**before, "validate.log": b"all ran\n"}
    assert [r.command[3] for r in engine.requests] == ["all"]  # no tool ran without a report
    assert not list(reports.glob(".run-*"))


@pytest.mark.parametrize(("suite_exit", "tool_exit", "passed"),
                         [(0, {}, True), (1, {}, False), (0, {"bench-train": 2}, False)])  # fmt: skip
def test_the_stamp_names_the_image_and_says_whether_the_run_passed(
    reports, suite_exit, tool_exit, passed
):
    engine = ScriptedEngine(suite_exit=suite_exit, tool_exit=tool_exit)
    result = execute(planned(reports, bench=True), engine)
    stamp = json.loads((reports / VALIDATED).read_text())
    assert result.passed is passed and stamp["passed"] is passed
    assert stamp["image"] == IMAGE and stamp["image_id"] == "sha256:validated-image"
    assert stamp["exit"] == suite_exit
    assert stamp["tools"] == {"bench": 0, "bench-train": tool_exit.get("bench-train", 0)}
    assert stamp["documents"]["report.json"] == baseline_store.sha256_file(reports / "report.json")
    assert stamp["documents"]["bench.json"] == baseline_store.sha256_file(reports / "bench.json")


def test_a_local_run_stamps_no_image(reports):
    stamp = (reports / VALIDATED).read_text()
    result = execute(planned(reports, image=None, bench=True), ScriptedEngine())
    assert result.passed
    assert (reports / VALIDATED).read_text() == stamp  # what publish trusts is untouched
    assert kept_meta(reports)["local"] is True and kept_meta(reports)["image"] is None


def test_only_a_passing_bench_run_replaces_the_kept_baseline(reports):
    failing = execute(planned(reports, bench=True), ScriptedEngine(tool_exit={"bench": 1}))
    assert not failing.passed and failing.kept is None
    assert kept_meta(reports)["old"] is True
    passing = execute(planned(reports, bench=True), ScriptedEngine())
    assert passing.passed and passing.kept == reports / baseline_store.KEPT
    meta = kept_meta(reports)
    assert "old" not in meta and meta["image_id"] == "sha256:validated-image"
    assert json.loads((passing.kept / "bench.json").read_text())["created"] == "new"


def test_a_run_below_the_baseline_fails_and_keeps_the_baseline(reports):
    kept = baseline_store.kept_dir(reports)
    base = baseline_store.Baseline(bench_doc(1.0, "old"), "the kept baseline", kept)
    v = planned(reports, bench=True, base=base, gates=[gate.Gate("sdpa.math")])
    result = execute(v, ScriptedEngine(bench_ms=100.0))
    assert not result.passed and result.kept is None
    assert any(f.startswith("below the baseline: ") for f in result.failures)
    assert kept_meta(reports)["old"] is True
    for name in COMPARE_OUTPUTS:
        assert (reports / name).is_file()
    stamp = json.loads((reports / VALIDATED).read_text())
    assert stamp["baseline"] == {"source": "the kept baseline", "passed": False}
    # a later bench run with nothing to compare with drops the comparison of the replaced bench
    execute(planned(reports, bench=True), ScriptedEngine())
    assert not any((reports / name).exists() for name in COMPARE_OUTPUTS)


def test_the_local_engine_runs_the_same_request_with_this_python(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    req = RunRequest(
        image="", mounts=[(out, "/out", False)], env={"GREETING": "hi"},
        command=["python3", "-c", "import os, sys; open(sys.argv[1], 'w').write("
                 "os.environ['GREETING'] + ' ' + os.environ['PYTHONPATH']); print('done')",
                 "/out/said.txt"],
    )  # fmt: skip
    (tmp_path / "tree").mkdir()
    engine = LocalEngine(tmp_path / "tree")
    assert engine.argv(req) == [sys.executable, *req.command[1:3], f"{out}/said.txt"]
    lines: list[str] = []
    log = tmp_path / "log"
    with log.open("w") as fh:
        assert engine.run_streaming(req, fh, on_line=lines.append) == 0
    assert (out / "said.txt").read_text() == f"hi {tmp_path / 'tree'}"
    assert lines == ["done"] and log.read_text() == "done\n"
    assert engine.image_id("anything") is None


def test_a_validation_is_a_value(reports):
    v = planned(reports)
    assert isinstance(v, Validation) and v.run_dir.parent == reports
    assert v.requests == planned(reports).requests  # the same plan, the same requests


def test_a_multi_arch_set_is_validated_into_this_hosts_member_folder(tmp_path, monkeypatch):
    recipes = load_recipes(REPO)  # fresh: register() adds the set to its arches
    name = multiarch.register(recipes, "gfx1151,gfx1100")
    plan = resolve(recipes, name, "default", Options())
    monkeypatch.setattr(hostinfo, "default_arch", lambda: ("gfx1100", "detected AMD GPU gfx1100"))
    where, expect = report_target(recipes, plan, tmp_path / name / "default")
    assert where == multiarch.member_reports(tmp_path / name / "default", "gfx1100")
    assert expect["arch"] == "gfx1100"
    assert expect["expect"] == multiarch.member_expect(recipes, plan, "gfx1100")
    assert expect["stack"] == "default" and "host_rules" in expect
    monkeypatch.setattr(hostinfo, "default_arch", lambda: ("gfx942", "detected AMD GPU gfx942"))
    with pytest.raises(UserError, match="this host's is gfx942"):
        report_target(recipes, plan, tmp_path / name / "default")


def test_a_single_arch_is_validated_into_its_own_folder():
    recipes = load_recipes(REPO)
    plan = resolve(recipes, "cpu", "cpu", Options())
    where, expect = report_target(recipes, plan, Path("reports/cpu/cpu"))
    assert where == Path("reports/cpu/cpu")
    assert (expect["arch"], expect["stack"], expect["expect"]) == ("cpu", "cpu", plan.expect)
