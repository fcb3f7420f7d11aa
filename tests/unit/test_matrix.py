"""invoke matrix: reports -> rows and cells (attnforge/matrix.py, pure), the Markdown and HTML
writers, and the task on real report files (H200 runs in tests/validate/fixtures, a synthetic
bench.json beside one, publish.json as `invoke publish` writes it)."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest

from attnforge import matrix
from attnforge.matrix import Entry, Reference
from tests.conftest import REPO, outputs_env, run_invoke

FIXTURES = REPO / "tests" / "validate" / "fixtures"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def bench() -> dict:
    return json.loads((FIXTURES / "siblings" / "bench.json").read_text())


def sdpa_report(runs: dict[str, list[dict]]) -> dict:
    """A report whose backend matrix has one row per case: {backend: [entry per case]}."""
    cases = max(len(v) for v in runs.values())
    rows = []
    for i in range(cases):
        rows.append({
            "case": f"case{i}", "status": "pass", "default_backend": "flash",
            "backends": {b: entries[i] for b, entries in runs.items() if i < len(entries)},
        })  # fmt: skip
    return {"backend_matrix": rows, "checks": [], "observations": {}}


def run(state: str, *, can_use=True, reasons=(), error=None) -> dict:
    return {"can_use": can_use, "reasons": list(reasons), "run": state, "error": error}


# --- cells --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entries, state, text, reason",
    [
        pytest.param([run("pass"), run("pass")], "works", "works", "", id="every-run-passed"),
        pytest.param(
            [run("pass"), run("unsupported", can_use=False, reasons=["head_dim should be a multiple of 8"])],
            "partial", "1/2 cases", "case1 refused: head_dim should be a multiple of 8",
            id="some-refused-with-pytorchs-reason",
        ),
        pytest.param(
            [run("pass"), run("crash", error="SIGSEGV in the kernel")],
            "fails", "fails 1/2 cases", "case1 crash: SIGSEGV in the kernel", id="a-crash-fails",
        ),
        pytest.param(
            [run("deferred-fault", error="illegal memory access")], "fails", "fails",
            "case0 deferred-fault: illegal memory access", id="a-deferred-fault-fails",
        ),
        pytest.param(
            [run("unsupported", can_use=False, reasons=["Flash attention was not compiled for "
             "current AMD GPU architecture"])] * 3,
            "refused", "refused",
            "case0 refused: Flash attention was not compiled for current AMD GPU architecture "
            "(and 2 more case(s))", id="all-refused",
        ),
        pytest.param(
            [run("pass", can_use=False, reasons=["Flash attention has been runtime disabled."])],
            "works", "works when forced",
            "case0 can_use says no: Flash attention has been runtime disabled.",
            id="passes-forced-but-disabled",
        ),
    ],
)  # fmt: skip
def test_an_sdpa_cell_says_whether_the_backend_works_and_why_not(entries, state, text, reason):
    cell = matrix.sdpa_cell(sdpa_report({"flash": entries}), "flash")
    assert (cell.state, cell.text, cell.reason) == (state, text, reason)


def test_a_backend_without_a_case_is_not_checked():
    cell = matrix.sdpa_cell(sdpa_report({"math": [run("pass")]}), "cudnn")
    assert (cell.state, cell.text) == ("unknown", "not checked")


def test_the_h200_report_cells_carry_pytorchs_reasons():
    cells = matrix.row(Entry(source="r", report=fixture("h200_report")), Reference()).cells
    assert (cells["flash"].state, cells["math"].state) == ("works", "works")
    assert (cells["efficient"].state, cells["efficient"].text) == ("partial", "6/8 cases")
    assert "Mem efficient attention requires last dimension of inputs to be divisible by 8" in (
        cells["efficient"].reason
    )
    assert cells["cudnn"].text == "7/8 cases"
    assert cells["cudnn"].reason == "fp16-d33-s77 refused: head_dim should be a multiple of 8"
    assert (cells["flash_attn"].state, cells["flash_attn"].text) == ("absent", "not installed")
    # 108 kernel cases were listed but none ran in that report: not a verdict either way
    assert (cells["kernels"].state, cells["kernels"].text) == ("unknown", "listed, not run")


def test_a_runtime_disabled_backend_is_flagged_although_its_forced_run_passed():
    cell = matrix.row(Entry(source="r", report=fixture("h200_flash_disabled")), Reference()).cells[
        "flash"
    ]
    assert cell.text == "works when forced"
    assert "Flash attention has been runtime disabled." in cell.reason


def test_kernel_cases_decide_the_kernels_cell():
    report = fixture("h200_kernels")
    assert matrix.kernels_cell(report).text == "works (2 cases)"
    broken = copy.deepcopy(report)
    broken["checks"][2].update(status="crash", message="SIGSEGV (signal 11); last stage: bwd")
    cell = matrix.kernels_cell(broken)
    assert (cell.state, cell.text) == ("fails", "fails 1/2 cases")
    assert (
        cell.reason
        == "attn-bf16-b1-sq129-sk129-h2x2-d128-full-bshd crash: SIGSEGV (signal 11); last stage: bwd"
    )


@pytest.mark.parametrize(
    "info, run_check, backend, state, text",
    [
        (None, None, None, "unknown", "not checked"),
        ("skip:flash_attn is not installed", "skip:flash_attn.info is skip", None, "absent", "not installed"),
        ("pass:flash_attn 2.8.3, backend triton", "pass:max err 1e-3", "triton", "works", "works (triton)"),
        ("pass:flash_attn 2.8.3, backend ck", "crash:SIGABRT in fmha_bwd", "ck", "fails", "crash (ck)"),
    ],
)  # fmt: skip
def test_the_flash_attn_cell_follows_its_checks(info, run_check, backend, state, text):
    checks = []
    for cid, spec in (("flash_attn.info", info), ("flash_attn.run", run_check)):
        if spec:
            status, message = spec.split(":", 1)
            checks.append({"id": cid, "status": status, "message": message})
    report = {"checks": checks, "observations": {"flash_attn.backend": backend}}
    cell = matrix.flash_attn_cell(report)
    assert (cell.state, cell.text) == (state, text)
    if state == "fails":
        assert cell.reason == "SIGABRT in fmha_bwd"


# --- speed ---------------------------------------------------------------------------------


def test_speed_is_the_reference_shapes_tflops_from_bench_json():
    entry = Entry(source="r", report=fixture("h200_report"), bench=bench())
    r = matrix.row(entry, Reference())
    # bench.json (fixtures/siblings): sweep-d128-s4096, bf16, not causal, fwd
    assert r.cells["flash"].tflops == 460.2 and r.cells["cudnn"].tflops == 498.6
    assert r.cells["kernels"].tflops == 354.09
    assert r.cells["flash_attn"].tflops is None
    assert r.cells["flash_attn"].speed_note == (
        "bench: unsupported: flash_attn is not installed (No module named 'flash_attn')"
    )
    causal = matrix.row(entry, Reference(causal=True, mode="fwd_bwd"))
    assert causal.cells["flash"].tflops == 295.57


def test_speed_by_shape_name_and_its_absence():
    entry = Entry(source="r", report=fixture("h200_report"), bench=bench())
    named = matrix.row(entry, Reference(name="llm-8b-gqa-4k"))
    assert named.cells["flash"].tflops == 397.91
    assert named.cells["cudnn"].tflops is None
    assert named.cells["cudnn"].speed_note.startswith("bench: unsupported: cuDNN attention does")
    missing = matrix.row(entry, Reference(name="no-such-shape"))
    assert missing.cells["flash"].speed_note == (
        "bench.json has no sdpa.flash result at the reference shape"
    )
    alone = matrix.row(Entry(source="r", report=fixture("h200_report")), Reference())
    assert alone.cells["flash"].tflops is None
    assert alone.cells["flash"].speed_note == "no bench.json beside the report"


def test_bf16_is_preferred_where_several_dtypes_ran():
    doc = bench()
    base = next(
        r for r in doc["results"]
        if r["backend"] == "sdpa.flash" and r["mode"] == "fwd" and Reference().matches(r["shape"])
    )  # fmt: skip
    fp16 = copy.deepcopy(base)
    fp16["shape"]["dtype"], fp16["tflops"] = "fp16", 999.0
    doc["results"].insert(0, fp16)
    assert Reference().result(doc, "sdpa.flash")["tflops"] == base["tflops"] == 460.2


# --- rows ----------------------------------------------------------------------------------


def rocm_report() -> dict:
    """The H200 report reshaped as a ROCm run would write it (schema 1.1 fields)."""
    r = fixture("h200_report")
    r["arch"], r["stack"], r["started_at"] = "gfx1151", "default", "2026-11-20T10:00:00Z"
    env = r["environment"]
    env["torch"].update(version="2.14.0+rocm10.1.0", hip="10.1.25", cuda=None)
    env["rocm_version"] = None
    env["rocm_python_packages"] = {"rocm-sdk-core": "10.1.0"}
    env["aotriton_libs"] = ["libaotriton_v2.so.0.13.0"]
    r["observations"]["aotriton.present"] = True  # what the env check says of those libraries
    env["flash_attn"] = {"present": True, "version": "2.8.3", "error": None}
    env["image_versions"] = {
        "flash-attention": {
            "variant": "triton",
            "SOURCE_REF": "16d5154aef39e627c4456c8d205e6985e1e67fdc",
        }
    }
    r["aotriton_knob"] = {
        "variable": "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL",
        "value": "1",
        "set": True,
        "aotriton": "0.13b",
        "needed": False,
        "ok": True,
    }
    r["host"]["fingerprint"] = {"kernel": "6.17.0-1011-oem"}
    return r  # fmt: skip


def test_versions_of_a_rocm_row():
    v = matrix.versions(Entry(source="r", report=rocm_report()))
    assert v == {
        "rocm": "10.1.0", "torch": "2.14.0+rocm10.1.0", "aotriton": "0.13b",
        "flash_attn": "2.8.3 @16d5154aef39", "kernel": "6.17.0-1011-oem",
    }  # fmt: skip


def test_versions_of_the_h200_row():
    v = matrix.versions(Entry(source="r", report=fixture("h200_report")))
    assert v == {
        "rocm": "none (CUDA 13.0)", "torch": "2.11.0+cu130", "aotriton": "none",
        "flash_attn": "not installed", "kernel": "6.18.44-fc-v657-gpu",
    }  # fmt: skip


@pytest.mark.parametrize(
    "platform, kernel",
    [
        ("Linux-6.18.44-fc-v657-gpu-x86_64-with-glibc2.39", "6.18.44-fc-v657-gpu"),
        ("Linux-6.8.0-49-generic-x86_64-with-glibc2.39", "6.8.0-49-generic"),
        ("Linux-6.1.0-28-arm64-aarch64-with-glibc2.36", "6.1.0-28-arm64"),
        ("macOS-15.1-arm64-arm-64bit", None),
        (None, None),
    ],
)
def test_the_host_kernel_is_read_from_pythons_platform_string(platform, kernel):
    assert matrix.kernel_release(platform) == kernel


@pytest.mark.parametrize(
    "source, report, key",
    [
        ("x/fixtures/h200_report.json", {"arch": "sm_90", "stack": "host-nvidia"}, ("sm_90", "host-nvidia")),
        ("reports/cpu/cpu/report.json", {"environment": {"torch": {"version": "2.13.0+cpu"}}}, ("cpu", "cpu")),
        ("x/h200_kernels.json", {"environment": {"devices": [{"arch": "sm_90"}]}}, ("sm_90", "unknown")),
    ],
)  # fmt: skip
def test_a_rows_arch_and_stack(source, report, key):
    assert matrix.row_key(Entry(source=source, report=report)) == key


def publish_doc(passed: bool = True) -> dict:
    """publish.json as attnforge/cli/publish.py writes it."""
    return {
        "arch": "gfx942", "stack": "default", "to": "ghcr.io/you/attnforge",
        "image": "attnforge/default:gfx942", "image_id": "sha256:1234",
        "versions": {
            "rocm-sdk": {"variant": "stable", "ROCM_VERSION": "10.1.0"},
            "pytorch-wheels": {"variant": "stable", "TORCH_VERSION": "2.14.0+rocm10.1.0"},
            "flash-attention": {"variant": "ck", "SOURCE_REF": "16d5154aef39e627c4456c8d205e6985e1e67fdc"},
        },
        "validation": {"image": "attnforge/default:gfx942", "image_id": "sha256:1234", "exit": 0,
                       "passed": passed, "tools": {}},
        "refs": [
            {"ref": "ghcr.io/you/attnforge/validate:gfx942", "digest": "sha256:aaa"},
            {"ref": "ghcr.io/you/attnforge/default:gfx942", "digest": "sha256:bbb"},
        ],
    }  # fmt: skip


def test_a_publish_json_alone_is_a_row_with_its_verdict_and_no_backend_verdicts():
    r = matrix.row(Entry(source="p/publish.json", publish=publish_doc()), Reference())
    assert (r.arch, r.stack, r.status) == ("gfx942", "default", "pass")
    assert r.versions["rocm"] == "10.1.0" and r.versions["torch"] == "2.14.0+rocm10.1.0"
    assert r.versions["flash_attn"] == "@16d5154aef39"
    assert {c.state for c in r.cells.values()} == {"unknown"}
    assert r.cells["flash"].reason == matrix.NO_REPORT
    assert r.published == ("ghcr.io/you/attnforge/default@sha256:bbb",)
    failed = matrix.row(Entry(source="p", publish=publish_doc(passed=False)), Reference())
    assert failed.status == "fail"


def test_a_pytorch_org_publish_json_reads_its_versions_from_the_one_layer():
    doc = publish_doc()
    doc["stack"] = "pytorch-org"
    doc["versions"] = {"pytorch-org": {"TORCH_VERSION": "2.14.1+rocm7.14",
                                       "ROCM_VERSION": "7.14.0.post1"}}  # fmt: skip
    r = matrix.row(Entry(source="p/publish.json", publish=doc), Reference())
    assert r.versions["rocm"] == "7.14.0.post1" and r.versions["torch"] == "2.14.1+rocm7.14"


def test_the_newest_report_of_an_arch_and_stack_is_shown():
    old = Entry(source="old.json", report=fixture("h200_flash_disabled"))  # 2026-11-22T00:21
    new = Entry(source="new.json", report=fixture("h200_report"))
    cpu = Entry(source="reports/cpu/cpu/report.json", report={
        "started_at": "2026-11-24T07:00:00Z", "summary": {"status": "pass"},
        "environment": {"torch": {"version": "2.13.0+cpu"}}})  # fmt: skip
    m = matrix.build([old, cpu, new], "2026-11-24T00:00:00Z")
    assert [(r.arch, r.stack, r.source) for r in m.rows] == [
        ("cpu", "cpu", "reports/cpu/cpu/report.json"), ("sm_90", "host-nvidia", "new.json"),
    ]  # fmt: skip
    assert len(m.left_out) == 1 and m.left_out[0].startswith("old.json (sm_90 host-nvidia")


# --- writers -------------------------------------------------------------------------------


def sample() -> matrix.Matrix:
    h200 = Entry(source="a", report=fixture("h200_report"), bench=bench(),
                 link="reports/sm_90/host-nvidia/report.html")  # fmt: skip
    rocm = Entry(source="b", report=rocm_report(), link="reports/gfx1151/default/report.html")
    rocm.report["backend_matrix"][0]["backends"]["flash"].update(
        run="crash", error="HIP error: <unspecified launch failure> | code 719"
    )
    return matrix.build([h200, rocm], "2026-11-24T08:00:00Z")


def test_the_markdown_table_has_a_row_per_stack_and_numbered_reasons():
    md = matrix.to_markdown(sample())
    lines = md.splitlines()
    table = [ln for ln in lines if ln.startswith("| `")]
    assert len(table) == 2
    assert table[0].startswith("| `gfx1151` | `default` | ❌ fail [1] | NVIDIA H200 | 10.1.0 |")
    # a failed row names what broke
    assert "1. broke sdpa.default_backend: promised flash, saw cudnn" in lines
    assert "❌ fails 1/8 cases [2]" in table[0]
    assert "✅ works · 460 TFLOP/s" in table[1] and "◐ 6/8 cases · 244 TFLOP/s [" in table[1]
    assert "[report](reports/sm_90/host-nvidia/report.html)" in table[1]
    # a reason with a pipe does not break the table
    assert "2. fp16-d64-s512 crash: HIP error: <unspecified launch failure> \\| code 719" in lines
    assert all(ln.count(" | ") == table[0].count(" | ") for ln in table)


def test_the_page_is_self_contained_and_escapes_what_it_shows():
    page = matrix.to_html(sample())
    assert page.startswith("<!doctype html>") and "<style>" in page
    names = re.sub(r'xmlns(:\w+)?="[^"]*"', "", page)  # SVG namespaces name, never fetch
    for outside in ("<script", "<link", "<img", "<image", "src=", "@import", "http://",
                    "https://"):  # fmt: skip
        assert outside not in names, outside
    assert re.findall(r"url\((?!#)", page) == []  # the chart's clip paths are in the page
    assert "HIP error: &lt;unspecified launch failure&gt; | code 719" in page
    assert "<unspecified" not in page
    assert page.count("<a href='reports/") == 2
    assert "<td class='fails'>" in page and "460 TFLOP/s" in page


def test_an_empty_matrix_still_renders():
    m = matrix.build([], "2026-11-24T08:00:00Z")
    assert "no report" in matrix.to_html(m)
    assert matrix.to_markdown(m).count("\n| ") == 1  # the heading row only


# --- the task ------------------------------------------------------------------------------


def reports_tree(base: Path) -> Path:
    """reports/<arch>/<stack>/ as invoke validate and invoke publish leave them."""
    h200 = base / "sm_90" / "host-nvidia"
    h200.mkdir(parents=True)
    shutil.copy(FIXTURES / "h200_report.json", h200 / "report.json")
    shutil.copy(FIXTURES / "siblings" / "bench.json", h200 / "bench.json")
    published = base / "gfx942" / "default"
    published.mkdir(parents=True)
    (published / "publish.json").write_text(json.dumps(publish_doc()))
    return base


def test_the_task_writes_the_page_the_markdown_and_a_copy_of_each_report(tmp_path):
    given = reports_tree(tmp_path / "ci")
    out = tmp_path / "site"
    proc = run_invoke(REPO, "matrix", "--reports", str(given), "-o", str(out),
                      "--no-html-reports", env=outputs_env(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "sm_90 host-nvidia: fail, SDPA picks cudnn; SDPA flash ✅ 460 TFLOP/s" in proc.stdout
    md, page = (out / "matrix.md").read_text(), (out / "matrix.html").read_text()
    assert "| `gfx942` | `default` | ✅ pass |" in md
    assert "[report](reports/sm_90/host-nvidia/report.md)" in md
    assert "reports/gfx942/default/publish.json" in page
    copied = out / "reports" / "sm_90" / "host-nvidia"
    assert sorted(p.name for p in copied.iterdir()) == ["bench.json", "report.json", "report.md"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging left behind


@pytest.mark.slow
def test_by_default_it_reads_the_reports_folder_and_never_its_own_copies(tmp_path):
    env = outputs_env(tmp_path)
    reports_tree(tmp_path / "reports")
    for _ in range(2):
        proc = run_invoke(REPO, "matrix", "--no-html-reports", env=env)
        assert proc.returncode == 0, proc.stderr
        assert "(2 row(s))" in proc.stdout and "left out" not in proc.stdout
    assert (tmp_path / "reports" / "matrix" / "matrix.html").is_file()


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda d: d / "nowhere", "no such file or folder"),
        (lambda d: d, "no report.json or publish.json in this folder"),
        (lambda d: Path(shutil.copy(FIXTURES / "siblings" / "bench.json", d / "b.json")),
         "not a validate report (no schema_version)"),
        (lambda d: _write(d / "r.json", "{oops"), "not valid JSON"),
    ],
    ids=["missing", "empty-folder", "a-bench-json", "broken-json"],
)  # fmt: skip
def test_a_path_that_is_not_a_report_is_one_sentence(tmp_path, make, words):
    given = reports_tree(tmp_path / "ok")
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    proc = run_invoke(REPO, "matrix", "--reports", f"{given},{make(bad_dir)}",
                      env=outputs_env(tmp_path))  # fmt: skip
    assert proc.returncode == 2
    assert words in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    assert "hint:" in proc.stderr
    assert not (tmp_path / "reports" / "matrix").exists()


@pytest.mark.slow
def test_a_failed_run_leaves_the_last_page_as_it_was(tmp_path):
    out, given = tmp_path / "site", reports_tree(tmp_path / "ok")
    good = run_invoke(REPO, "matrix", "--reports", str(given), "-o", str(out),
                      "--no-html-reports", env=outputs_env(tmp_path))  # fmt: skip
    assert good.returncode == 0, good.stderr
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (given / "sm_90" / "host-nvidia" / "bench.json").write_text('{"kind": "attnforge.stress"}')
    proc = run_invoke(REPO, "matrix", "--reports", str(given), "-o", str(out),
                      env=outputs_env(tmp_path))  # fmt: skip
    assert proc.returncode == 2 and "expected kind 'attnforge.bench'" in proc.stderr
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before


def test_a_wrong_mode_is_a_usage_error(tmp_path):
    proc = run_invoke(REPO, "matrix", "--mode", "sideways", env=outputs_env(tmp_path))
    assert proc.returncode == 2 and "--mode 'sideways': choose fwd, bwd or fwd_bwd" in proc.stderr


def test_the_env_check_records_the_images_versions_manifest(tmp_path):
    from validate.checks import env

    manifest = tmp_path / "versions.json"
    manifest.write_text(json.dumps(publish_doc()["versions"]))
    assert env.image_versions(str(manifest))["flash-attention"]["variant"] == "ck"
    assert env.image_versions(str(tmp_path / "absent.json")) is None
    (tmp_path / "bad.json").write_text("[1, 2")
    assert env.image_versions(str(tmp_path / "bad.json")) is None


# --- the matrix tells the truth (issue 28) -------------------------------------------------


def test_a_kept_baseline_copy_never_wins_over_the_current_report_whatever_the_order():
    current = Entry(source="reports/sm_90/host-nvidia/report.json", report=fixture("h200_report"))
    copy_ = Entry(source="reports/sm_90/host-nvidia/baseline/report.json",
                  report={**fixture("h200_report"), "summary": {"status": "pass"}})  # fmt: skip
    published = Entry(source="reports/sm_90/host-nvidia/published/0123456789ab/report.json",
                      report=fixture("h200_report"))  # fmt: skip
    for entries in ([current, copy_, published], [published, copy_, current]):
        kept, _ = matrix.newest(entries)
        assert [e.source for e in kept] == [current.source]
    assert matrix.is_copy(copy_.source) and matrix.is_copy(published.source)
    assert not matrix.is_copy(current.source)


def test_ties_on_time_go_to_the_newest_run_in_any_input_order():
    def at(source: str, run_id: str | None, duration: float = 98.2) -> Entry:
        r = {**fixture("h200_report"), "duration_s": duration}
        if run_id:
            r["run_id"] = run_id
        return Entry(source=source, report=r)

    later_run = at("b/report.json", "20261122T002518.900000Z-7")
    earlier_run = at("a/report.json", "20261122T002518.100000Z-9")
    for entries in ([earlier_run, later_run], [later_run, earlier_run]):
        assert [e.source for e in matrix.newest(entries)[0]] == ["b/report.json"]
    # no run id: the run that ended last, then the path, so the answer never depends on order
    long_run, short_run = at("x/report.json", None, 200.0), at("y/report.json", None, 10.0)
    for entries in ([long_run, short_run], [short_run, long_run]):
        assert [e.source for e in matrix.newest(entries)[0]] == ["x/report.json"]
    same_a, same_b = at("p/report.json", None), at("q/report.json", None)
    for entries in ([same_a, same_b], [same_b, same_a]):
        assert [e.source for e in matrix.newest(entries)[0]] == ["q/report.json"]


def test_the_task_reads_no_baseline_or_published_copy(tmp_path):
    given = reports_tree(tmp_path / "ci")
    current = given / "sm_90" / "host-nvidia"
    for copy_dir, meta in ((current / "baseline", "baseline.json"),
                           (current / "published" / "0123456789ab", "publish.json")):  # fmt: skip
        copy_dir.mkdir(parents=True)
        passed = {**fixture("h200_report"), "summary": {"status": "pass", "exit_code": 0}}
        (copy_dir / "report.json").write_text(json.dumps(passed))
        (copy_dir / meta).write_text(json.dumps(publish_doc() if meta == "publish.json" else {}))
    proc = run_invoke(REPO, "matrix", "--reports", str(given), "-o", str(tmp_path / "site"),
                      "--no-html-reports", env=outputs_env(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "sm_90 host-nvidia: fail" in proc.stdout and "left out" not in proc.stdout
    assert "baseline" not in (tmp_path / "site" / "matrix.md").read_text()


def test_a_cell_shows_only_what_the_report_observed():
    r = rocm_report()
    r["observations"]["aotriton.present"] = False  # the recipes promise 0.13b; none was found
    r["environment"]["flash_attn"] = {"present": False, "error": "No module named 'flash_attn'"}
    v = matrix.versions(Entry(source="r", report=r))
    assert v["aotriton"] == "none" and v["flash_attn"] == "not installed"
    # nothing observed at all (publish.json alone): the image's manifest is all there is
    alone = matrix.versions(Entry(source="p", publish=publish_doc()))
    assert alone["rocm"] == "10.1.0" and alone["flash_attn"] == "@16d5154aef39"


def test_a_failed_row_names_the_expectations_that_broke():
    r = matrix.row(Entry(source="r", report=fixture("h200_report")), Reference())
    assert r.broken == ("sdpa.default_backend: promised flash, saw cudnn",)
    page = matrix.to_html(matrix.build([Entry(source="r", report=fixture("h200_report"))], "t"))
    assert "<ul class='broke'><li>sdpa.default_backend: promised flash, saw cudnn</li>" in page
    passed = {**fixture("h200_report"), "summary": {"status": "pass"}}
    assert matrix.row(Entry(source="r", report=passed), Reference()).broken == ()


def test_a_shape_that_no_bench_has_is_an_error(tmp_path):
    from attnforge.errors import UserError

    entry = Entry(source="r", report=fixture("h200_report"), bench=bench())
    with pytest.raises(UserError, match="--shape sweep-d99: no report's bench.json has a result"):
        matrix.build([entry], "t", Reference(name="sweep-d99"))
    assert matrix.build([entry], "t", Reference(name="llm-8b-gqa-4k")).rows
    proc = run_invoke(REPO, "matrix", "--reports", str(reports_tree(tmp_path / "ci")),
                      "--shape", "sweep-d99", "-o", str(tmp_path / "site"),
                      env=outputs_env(tmp_path))  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
    assert "--shape sweep-d99: no report's bench.json has a result at that shape" in proc.stderr
    assert "llm-8b-gqa-4k" in proc.stderr and not (tmp_path / "site" / "matrix.html").exists()


def test_without_the_reference_shape_the_speed_is_the_nearest_benched_one_and_says_so():
    doc = bench()
    doc["results"] = [r for r in doc["results"] if r["shape"]["sk"] != 4096]
    r = matrix.row(Entry(source="r", report=fixture("h200_report"), bench=doc), Reference())
    assert r.speed_at == "sweep-d128-s2048"  # not causal, d 128, seqlen 2048 (log2: 1 away)
    at = next(x for x in doc["results"] if x["backend"] == "sdpa.flash" and x["mode"] == "fwd"
              and x["shape"]["name"] == "sweep-d128-s2048")  # fmt: skip
    assert r.cells["flash"].tflops == at["tflops"]
    m = matrix.build([Entry(source="r", report=fixture("h200_report"), bench=doc)], "t")
    assert ("speeds of sm_90 host-nvidia are at sweep-d128-s2048, the benched shape nearest "
            "to the reference") in matrix.to_markdown(m)  # fmt: skip
    assert "speed at <code>sweep-d128-s2048</code> (nearest benched shape)" in matrix.to_html(m)
    exact = matrix.row(Entry(source="r", report=fixture("h200_report"), bench=bench()),
                       Reference())  # fmt: skip
    assert exact.speed_at == ""


def test_versions_wrap_between_words_never_inside_one():
    page = matrix.to_html(sample())
    assert "overflow-wrap:anywhere" not in page.split("td.ver")[1].split("}")[0]
    assert "td.ver span{white-space:nowrap}" in page
    assert "<td class='ver'><span>none</span> <span>(CUDA</span> <span>13.0)</span></td>" in page
    assert "<td class='ver'><span>6.18.44-fc-v657-gpu</span></td>" in page


def test_the_page_charts_tflops_per_backend_across_rows():
    pytest.importorskip("matplotlib", reason="the dev extra brings matplotlib")
    rocm = Entry(source="b", report=rocm_report(), bench=bench())
    h200 = Entry(source="a", report=fixture("h200_report"), bench=bench())
    page = matrix.to_html(matrix.build([h200, rocm], "t"))
    chart = page.split("<figure class='plot chart' id='plot-speed'>")[1].split("</figure>")[0]
    for label in ("gfx1151 · default", "sm_90 · host-nvidia", "SDPA flash", "SDPA cuDNN",
                  "bundled kernels", "TFLOP/s per backend at sweep shape at seqlen 4096"):  # fmt: skip
        assert label in chart, label
    assert " 460<" in chart and " 499<" in chart  # flash and cuDNN at the reference shape
    none = matrix.to_html(matrix.build([Entry(source="a", report=fixture("h200_report"))], "t"))
    assert "No row has a speed at the reference shape" in none


def test_the_chart_turns_logarithmic_when_a_cpu_row_sits_beside_a_gpu_row():
    pytest.importorskip("matplotlib", reason="the dev extra brings matplotlib")
    slow = bench()
    for r in slow["results"]:
        r["tflops"] = r["tflops"] / 1e5 if r.get("tflops") else r.get("tflops")
    cpu = {**fixture("h200_report"), "arch": "cpu", "stack": "cpu"}
    rows = [Entry(source="a", report=fixture("h200_report"), bench=bench()),
            Entry(source="c", report=cpu, bench=slow)]  # fmt: skip
    assert "TFLOP/s (log scale)" in matrix.to_html(matrix.build(rows, "t"))
    assert "(log scale)" not in matrix.to_html(matrix.build(rows[:1], "t"))
