"""A report page shows one run and says so: sibling documents carry the run's id and those of
another run are named and left out; a stale page is drawn again; the page speaks in pictures
(grid heat map, workloads fused or not, speed against the baseline) and in HTML, never in
literal Markdown; a CPU or --local report says nothing of /dev/kfd or of a container."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.conftest import REPO, outputs_env, run_invoke
from tests.validate.conftest import FIXTURES
from validate import grid, plots, render, report, stress

SIBLINGS = FIXTURES / "siblings"


def folder_with(tmp_path, run_id: str | None = "run-A", **stamps: str | None):
    """reports/<arch>/<stack>/: the H200 report stamped `run_id`, and each sibling stamped as
    `stamps` says (file name with - for _ and . dropped: stress_llm=...), else as the report."""
    dest = tmp_path / "reports" / "sm_90" / "host-nvidia"
    dest.mkdir(parents=True)
    doc = json.loads((FIXTURES / "h200_report.json").read_text())
    if run_id:
        doc["run_id"] = run_id
    (dest / "report.json").write_text(json.dumps(doc))
    for p in SIBLINGS.iterdir():
        sib = json.loads(p.read_text())
        key = p.stem.replace("-", "_")
        stamp = stamps.get(key, run_id)
        if stamp:
            sib["run_id"] = stamp
        (dest / p.name).write_text(json.dumps(sib))
    return dest / "report.json"


def test_a_sibling_of_another_run_is_named_and_left_out(tmp_path):
    path = folder_with(tmp_path, stress_llm="run-OLD")
    rep = report.load(path)
    found = report.load_siblings(path, rep)
    assert [d["workload"] for d in found["stress"]] == ["sdxl"]
    assert found["bench"] is not None and found["bench_train"] is not None
    assert found["left_out"] == [
        ("stress-llm.json", "it is of run run-OLD, the report of run run-A")
    ]
    page = render.to_html(rep, {**found, "bench": None, "bench_train": None})
    assert "Left out of this page, not of this report's run" in page
    assert "<code>stress-llm.json</code>: it is of run run-OLD" in page
    assert "<h3>llm" not in page and "<h3>sdxl at 1024x1024</h3>" in page


@pytest.mark.parametrize(
    ("created", "kept"),
    [("2026-11-21T23:00:00Z", False), ("2026-11-22T00:25:18Z", True),
     ("2026-11-24T10:40:00+00:00", True)],
)  # fmt: skip
def test_an_unstamped_sibling_belongs_when_written_after_the_run_started(tmp_path, created, kept):
    # documents written by hand (`python -m validate stress --json ...`) or before run ids carry
    # none: one older than the report's run is stale
    path = folder_with(tmp_path, stress_llm=None)
    doc = json.loads((path.parent / "stress-llm.json").read_text())
    (path.parent / "stress-llm.json").write_text(json.dumps({**doc, "created": created}))
    found = report.load_siblings(path, report.load(path))
    assert ("llm" in [d["workload"] for d in found["stress"]]) is kept
    if not kept:
        [(name, why)] = found["left_out"]
        assert name == "stress-llm.json" and "before this report's run started" in why


def test_the_render_command_says_what_it_left_out(tmp_path, run_validate):
    path = folder_with(tmp_path, bench="run-OLD", bench_train="run-OLD", stress_llm="run-OLD",
                       stress_sdxl="run-OLD")  # fmt: skip
    proc = run_validate("render", str(path), "--html", str(tmp_path / "p.html"))
    assert proc.returncode == 0, proc.stderr
    said = proc.stderr.strip().splitlines()
    assert said == [f"render: left out {n}: it is of run run-OLD, the report of run run-A"
                    for n in ("bench.json", "bench_train.json", "stress-llm.json",
                              "stress-sdxl.json")]  # fmt: skip
    assert "No bench.json next to this report" in (tmp_path / "p.html").read_text()


def test_every_document_of_a_run_is_stamped_with_its_id(monkeypatch):
    monkeypatch.setenv(report.RUN_ID_ENV, "run-42")
    assert stress.document({}, "llm", None, [], [])["run_id"] == "run-42"
    built = report.build(command="all", argv=[], quick=True, started_at=report.now(),
                         duration_s=1.0, records=[], observations={}, expectations=None,
                         exit_code=0)  # fmt: skip
    assert built["run_id"] == "run-42"
    monkeypatch.delenv(report.RUN_ID_ENV)
    assert stress.document({}, "llm", None, [], [])["run_id"] is None  # written by hand
    first = report.build(command="all", argv=[], quick=True, started_at=report.now(),
                         duration_s=1.0, records=[], observations={}, expectations=None,
                         exit_code=0)["run_id"]  # fmt: skip
    second = report.new_run_id()
    assert first and first != second and sorted([second, first]) == [first, second]


def test_bench_and_bench_train_stamp_the_run_id():
    # both build their document inline in main(); the stamp is read where `created` is
    for name in ("bench.py", "bench_train.py"):
        text = (REPO / "validate" / name).read_text()
        assert '"run_id": current_run_id(),' in text, name


def test_a_stale_page_is_drawn_again_or_removed(tmp_path):
    from attnforge.cli.validate import refresh_page

    pytest.importorskip("matplotlib", reason="the dev extra brings matplotlib")
    path = folder_with(tmp_path)
    page = path.with_suffix(".html")
    page.write_text("the page of the previous run")
    old = time.time() - 60
    os.utime(page, (old, old))
    refresh_page(path, REPO)
    assert page.read_text().startswith("<!doctype html>") and "run-A" in page.read_text()
    before = page.read_text()
    refresh_page(path, REPO)  # a page newer than its report is left alone
    assert page.read_text() == before
    # a page that cannot be drawn again is removed rather than left showing another run
    (path.parent / "bench.json").write_text(json.dumps({"kind": "attnforge.stress"}))
    os.utime(page, (old, old))
    refresh_page(path, REPO)
    assert not page.exists()


def test_invoke_report_html_prints_the_path_not_the_markdown(tmp_path):
    pytest.importorskip("matplotlib", reason="the dev extra brings matplotlib")
    path = folder_with(tmp_path)
    proc = run_invoke(REPO, "report", "--path", str(path), "--html", env=outputs_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {path.with_suffix('.html')}" in " ".join(proc.stdout.split())
    assert "Validation FAIL" not in proc.stdout and "| case |" not in proc.stdout
    assert path.with_suffix(".html").read_text().startswith("<!doctype html>")


# ---------------------------------------------------------------- what the page says, and how


def test_host_warnings_reach_the_page_as_html_not_markdown(fixture_report):
    fixture_report["host"]["warnings"] = [{"id": "x", "warning": "a `knob` is wrong",
                                           "fix": "unset it", "source": "somewhere"}]  # fmt: skip
    page = render.to_html(fixture_report)
    assert "<b>host</b>: a <code>knob</code> is wrong" in page
    body = page.split("<section id='markdown'>")[0]  # the Markdown summary is shown as such
    assert "**" not in body and "`" not in body


@pytest.mark.parametrize(("arch", "gpus", "shown"), [
    ("cpu", [], False), ("sm_90", [], False), ("gfx1151", [], True),
    (None, [{"arch": "gfx942"}], True)])  # fmt: skip
def test_the_host_line_speaks_of_dev_kfd_only_where_rocm_is(fixture_report, arch, gpus, shown):
    fixture_report["arch"] = arch
    fixture_report["host"]["fingerprint"] = {
        "kernel": "6.18.5", "gpus": gpus, "groups": ["users"],
        "devices": [{"path": "/dev/kfd", "exists": False}],
        "hsa_override_gfx_version": {"state": "unset"},
    }  # fmt: skip
    md = render.to_markdown(fixture_report)
    assert ("/dev/kfd" in md) is shown and ("amdgpu" in md) is shown
    assert "host: Linux 6.18.5" in md


def test_the_grid_cells_say_pass_fail_fault_and_refused():
    matrix = [{"case": "c1", "backends": {
        "flash": {"run": "pass", "max_abs_err": 0.001, "tolerance": 0.004},
        "efficient": {"run": "unsupported"},
        "cudnn": {"run": "crash", "max_abs_err": None},
        "math": {"run": "fail", "max_abs_err": 0.01, "tolerance": 0.004}}},
        {"case": "c2", "backends": {"flash": {"run": "deferred-fault"},
                                    "efficient": {"run": "skip"}}}]  # fmt: skip
    cells = plots.grid_cells(matrix, grid.BACKENDS)
    assert cells == [[("pass", 0.25), ("refused", None), ("fault", None), ("fail", 2.5)],
                     [("fault", None), ("skip", None), ("", None), ("", None)]]  # fmt: skip
    pytest.importorskip("matplotlib", reason="the dev extra brings matplotlib")
    svg = plots.grid_heatmap(matrix, grid.BACKENDS).svg
    for text in (">0.25<", ">2.50<", ">—<", ">✗ fault<", ">skip<", ">·<", ">c1<", ">cudnn<"):
        assert text in svg, text
    assert "<image" not in svg  # vector cells and colour bar: nothing embedded


def test_workloads_are_shown_fused_or_not_from_the_report_or_the_bench():
    report_doc = {"checks": [{"id": "sdpa.workload.vit-d72", "status": "pass", "details": {
        "workload": "vit-d72", "default_backend": "math"}}]}  # fmt: skip
    bench = {"results": [
        {"backend": "sdpa.default", "mode": "fwd", "status": "ok", "message": "SDPA picks flash",
         "shape": {"name": "sdxl-1024", "family": "workload"}},
        {"backend": "sdpa.default", "mode": "fwd", "status": "ok", "message": "",
         "shape": {"name": "llm-8b", "family": "workload"}},
        {"backend": "sdpa.flash", "mode": "fwd", "status": "ok", "message": "SDPA picks math",
         "shape": {"name": "sd15", "family": "workload"}},
        {"backend": "sdpa.default", "mode": "fwd", "status": "ok", "message": "SDPA picks math",
         "shape": {"name": "sweep-x", "family": "sweep"}}]}  # fmt: skip
    picks = plots.workload_picks(report_doc, bench)
    assert [(p["workload"], p["pick"], p["fused"]) for p in picks] == [
        ("vit-d72", "math", False),
        ("sdxl-1024", "flash", True),
        ("llm-8b", None, None),
    ]
    pytest.importorskip("matplotlib", reason="the dev extra brings matplotlib")
    shape = {"b": 1, "h": 8, "hkv": 8, "sq": 64, "sk": 64, "d": 64, "causal": False,
             "dtype": "bf16"}  # fmt: skip
    full = {"results": [{**r, "ms": 1.0, "tflops": 1.0, "shape": {**shape, **r["shape"]}}
                        for r in bench["results"]]}  # fmt: skip
    page = render.to_html({**report_doc, "summary": {}}, {"bench": full})
    assert "id='plot-workloads-fused'" in page
    svg = plots.workload_plot(picks).svg
    assert ">NOT fused: math<" in svg and ">fused: flash<" in svg and ">not recorded: ?<" in svg


def test_the_baseline_comparison_is_a_bar_chart_with_the_gate_line():
    from attnforge.baseline import gate

    pytest.importorskip("matplotlib", reason="the dev extra brings matplotlib")
    now = json.loads((SIBLINGS / "bench.json").read_text())
    slower = json.loads(json.dumps(now))
    for r in slower["results"]:
        if r["backend"] == "kernels" and r.get("ms"):
            r["ms"] /= 2  # the baseline was twice as fast: kernels now 0.5x
            r["ms_all"] = [x / 2 for x in r["ms_all"]]
    doc = gate.compare(slower, now, [gate.Gate("kernels", "sweep-d128-s4096", "fwd")], 0.9)
    rows = plots.ratio_rows(doc)
    assert rows[0]["backend"] == "kernels" and rows[0]["verdict"] == "fail"
    assert len(rows) == 12 and rows[1]["ratio"] <= rows[-1]["ratio"]  # then slowest first
    svg = plots.baseline_plot(doc).svg
    assert "gate 0.9× (gated rows)" in svg and ">kernels · sweep-d128-s4096 · fwd<" in svg
    page = render.to_html({"summary": {}}, {"baseline_compare": doc})
    assert "id='plot-baseline-ratio'" in page and "Baseline gate: FAIL" in page
