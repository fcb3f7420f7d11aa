"""Rendering: Markdown for CI summaries, HTML for `invoke report`, and the JSON schema."""

import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from tests.validate.conftest import FIXTURES, REPO
from validate import plots, render

FIXTURE_NAMES = [
    "h200_report.json",
    "h200_flash_disabled.json",
    "h200_triton_oob.json",
    "h200_kernels.json",
    "h200_cudnn_off.json",
    "h200_cudnn_flash_off.json",
]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_gpu_fixtures_match_the_schema(name, fixtures_dir, schema_errors):
    assert schema_errors(json.loads((fixtures_dir / name).read_text())) == []


def test_schema_check_can_fail(fixture_report, schema_errors):
    fixture_report["checks"][0]["status"] = "exploded"
    del fixture_report["summary"]
    errors = schema_errors(fixture_report)
    assert any("exploded" in e for e in errors) and any("missing summary" in e for e in errors)


def test_markdown_of_the_gpu_run(fixture_report):
    md = render.to_markdown(fixture_report)
    assert md.startswith("## ❌ Validation FAIL: stack `host-nvidia` on `sm_90`")
    assert "torch 2.11.0+cu130 (CUDA 13.0) · NVIDIA H200 (sm_90)" in md
    # one matrix row per case, with the default pick and the profiler's opinion
    for row in fixture_report["backend_matrix"]:
        assert f"| {row['case']} | {row['default_backend']} | {row['profiler_backend']} |" in md
    assert "| ❌ | `sdpa.default_backend` | flash | cudnn |" in md
    assert "SDPA ranks cudnn above it" in md
    assert "head_dim should be a multiple of 8" in md  # PyTorch's reason, captured from TORCH_WARN
    assert "cudnn_generated_fort_native_sdpa_sm90" in md


def test_markdown_shows_a_crash_with_its_cause(fixtures_dir):
    report = json.loads((fixtures_dir / "h200_triton_oob.json").read_text())
    md = render.to_markdown(report)
    assert "| 💥 crash | `fault.triton_oob` |" in md
    assert "illegal memory access" in md
    assert "### Failures" in md
    assert "| ✅ pass | `fault.triton_ok` |" in md


def test_markdown_escapes_table_breakers(fixture_report):
    fixture_report["checks"][0]["message"] = "a | b\nc"
    md = render.to_markdown(fixture_report)
    assert "a \\| b c" in md


def test_html_is_escaped_and_complete(fixture_report):
    fixture_report["checks"][0]["message"] = "<script>alert(1)</script>"
    page = render.to_html(fixture_report)
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert "SDPA backends" in page and "Expectations" in page


def test_render_cli_writes_both(fixtures_dir, tmp_path, run_validate):
    md, page = tmp_path / "out" / "r.md", tmp_path / "r.html"
    proc = run_validate(
        "render", str(fixtures_dir / "h200_report.json"), "--md", str(md), "--html", str(page)
    )
    assert proc.returncode == 0, proc.stderr
    assert md.read_text().startswith("## ❌ Validation FAIL")
    assert "<table>" in page.read_text()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('{"schema_version": "9.0"}', "schema_version 9.0 is not supported"),
        ("{not json", "not valid JSON"),
        ('{"checks": []}', "not a validate report"),
    ],
)
def test_render_rejects_bad_reports_without_traceback(content, fragment, tmp_path, run_validate):
    p = tmp_path / "r.json"
    p.write_text(content)
    proc = run_validate("render", str(p), "--md", "-")
    assert proc.returncode == 2
    assert fragment in proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------- the HTML page and its plots

SIBLING_FILES = ["bench.json", "bench_train.json", "stress-llm.json", "stress-sdxl.json"]


def report_folder(fixtures_dir, dest, siblings=SIBLING_FILES):
    """A reports/<arch>/<stack>/ folder: the H200 report and the synthetic sibling documents."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(fixtures_dir / "h200_report.json", dest / "report.json")
    for name in siblings:
        shutil.copy(fixtures_dir / "siblings" / name, dest / name)
    return dest / "report.json"


def hide_matplotlib(tmp_path):
    """PYTHONPATH that makes `import matplotlib` fail, as in an image without it."""
    fake = tmp_path / "no-mpl" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    return {"PYTHONPATH": str(fake.parent)}


class PageParts(HTMLParser):
    """Tags, ids and anything that could make the browser fetch something."""

    def __init__(self):
        super().__init__()
        self.ids, self.tags, self.fetches = [], [], []
        self.figures, self.figure_svgs, self._in_figure = 0, 0, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "figure" and "plot" in (a.get("class") or "").split():
            self.figures += 1
            self._in_figure = 1
        elif tag == "svg" and self._in_figure:
            self.figure_svgs += 1
            self._in_figure = 0
        for name in ("src", "href", "xlink:href", "srcset", "data", "action"):
            value = a.get(name)
            if value is not None and not value.startswith("#"):
                self.fetches.append(f"<{tag} {name}={value!r}>")
        if tag in ("script", "link", "iframe", "object", "embed", "img", "base"):
            self.fetches.append(f"<{tag}>")


@pytest.fixture(scope="module")
def full_page():
    """The page for the H200 report with every sibling (drawn once: matplotlib takes ~2 s)."""
    pytest.importorskip("matplotlib", reason="the dev extra brings matplotlib")
    fixtures = FIXTURES
    siblings = {
        "bench": json.loads((fixtures / "siblings" / "bench.json").read_text()),
        "bench_train": json.loads((fixtures / "siblings" / "bench_train.json").read_text()),
        "stress": [json.loads((fixtures / "siblings" / n).read_text())
                   for n in ("stress-llm.json", "stress-sdxl.json")],
    }  # fmt: skip
    report = json.loads((fixtures / "h200_report.json").read_text())
    return render.to_html(report, siblings), siblings


PLOTS = ["sdpa-grid", "workloads-fused", "sweep-tflops", "sweep-memory", "workload-tflops",
         "train-ratio"]  # fmt: skip


def figure_ids(page: str) -> list[str]:
    return re.findall(r"<figure class='plot' id='plot-([^']+)'>", page)


def test_every_plot_is_an_inline_svg(full_page):
    page, _ = full_page
    parts = PageParts()
    parts.feed(page)
    # the grid's heat map, the sweep's and the workloads' small multiples, the training step
    assert figure_ids(page) == PLOTS
    assert parts.figures == parts.figure_svgs == len(PLOTS)
    for title in ("SDPA grid: error / tolerance per backend and case",
                  "flash-attention's sweep: TFLOP/s per backend",
                  "workload shapes: TFLOP/s per backend", "training step · width 1024"):  # fmt: skip
        assert title in page
    assert "Not plotted: sdpa.math error at sweep-d128-s8192" in page


def test_the_sweep_is_small_multiples_with_every_backend_on_each_chart(full_page):
    _, siblings = full_page
    results = siblings["bench"]["results"]
    drawn = {p.key: p for p in plots.bench_plots(siblings["bench"])}
    svg = drawn["sweep-tflops"].svg
    panels = plots.sweep_panels(results)
    columns = list(dict.fromkeys(k[:3] for k in panels))
    modes = [m for m in plots.MODES if any(k[3] == m for k in panels)]
    assert (len(modes), len(columns)) == (2, 3)  # fwd and fwd_bwd x (d128, d128 causal, d64)
    assert svg.count('id="sweep-tflops-axes_') == len(modes) * len(columns)
    for i, mode in enumerate(modes):
        for j, column in enumerate(columns):
            timed = {r["backend"] for r in panels[(*column, mode)]
                     if r["status"] == "ok" and r.get("tflops")}  # fmt: skip
            lines = set(re.findall(rf'id="sweep-tflops-line-{i}-{j}-([a-z0-9-]+)"', svg))
            assert lines == {plots._slug(b) for b in timed} and len(lines) >= 4, (mode, column)
    # the workload family: one chart per mode, every backend's bars on each
    assert drawn["workload-tflops"].svg.count('id="workload-tflops-axes_') == 2


def test_the_page_fetches_nothing(full_page):
    page, _ = full_page
    parts = PageParts()
    parts.feed(page)
    assert parts.fetches == []
    assert "@import" not in page and "url(http" not in page


def test_ids_are_unique_across_plots(full_page):
    # matplotlib names clip paths and markers by content hash: two figures share names unless
    # each figure's ids are prefixed
    page, _ = full_page
    parts = PageParts()
    parts.feed(page)
    dupes = {i for i in parts.ids if parts.ids.count(i) > 1}
    assert len(parts.ids) > 100 and not dupes
    refs = set(re.findall(r'(?:url\(#|href="#)([^)"]+)', page))
    assert refs <= set(parts.ids)


def test_page_shows_matrix_kernels_stress_and_markdown(full_page):
    page, _ = full_page
    # a refused backend is grey with PyTorch's own reason in it; a passing one green
    assert "<td class='cell-off'>refused <span class='small'>(can_use: no)</span><details>" in page
    assert "head_dim should be a multiple of 8" in page
    assert page.count("<td class='cell-pass'>") == 29
    # the profiler's kernels and the aten ops they came from (check details, not the matrix)
    assert "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma" in page
    assert "aten::_cudnn_attention_forward" in page
    # stress: the first failure of each run, per workload
    assert "iteration 1411: mismatch — max|err| 0.031 &gt; tolerance 0.0078" in page
    assert "<h3>sdxl at 1024x1024</h3>" in page
    # training: the ratio to the loss check's reference
    assert "<th>× sdpa.math</th>" in page
    # bench runs without a time are listed with their reason
    assert "all 36 runs" in page and "torch.OutOfMemoryError" in page
    # and the Markdown summary CI shows
    assert "## ❌ Validation FAIL: stack `host-nvidia` on `sm_90`" in page


def test_a_page_without_siblings_still_has_the_grid_and_says_how_to_make_the_rest(
    fixture_report,
):
    pytest.importorskip("matplotlib", reason="the dev extra brings matplotlib")
    page = render.to_html(fixture_report)
    assert figure_ids(page) == ["sdpa-grid"]
    assert "python -m validate bench --json bench.json" in page
    assert "python -m validate stress --workload W" in page


def test_sweep_panels_group_by_dtype_head_dim_causal_and_mode():
    def r(backend, d, causal, mode, status="ok", family="sweep", s=512):
        shape = {"name": f"x{d}{s}", "family": family, "b": 1, "h": 1, "hkv": 1, "sq": s, "sk": s,
                 "d": d, "causal": causal, "dtype": "bf16"}  # fmt: skip
        return {"backend": backend, "shape": shape, "mode": mode, "status": status}

    results = [
        r("a", 64, False, "fwd"), r("b", 64, False, "fwd", s=1024), r("a", 128, True, "fwd"),
        r("a", 64, False, "bwd"), r("a", 64, True, "bwd", status="crash"),
        r("a", 64, False, "fwd", family="workload"),
    ]  # fmt: skip
    panels = plots.sweep_panels(results)
    assert list(panels) == [("bf16", 64, False, "fwd"), ("bf16", 128, True, "fwd"),
                            ("bf16", 64, False, "bwd")]  # fmt: skip
    assert len(panels[("bf16", 64, False, "fwd")]) == 2  # a panel without a time is left out
    assert list(plots.workload_panels(results)) == ["fwd"]


@pytest.mark.parametrize(
    ("reference", "expected"),
    [("sdpa.math", ("sdpa.math", [2.0, 1.0])), ("gone", ("sdpa.flash", [1.0, 0.5])),
     (None, ("sdpa.flash", [1.0, 0.5]))],
)  # fmt: skip
def test_training_ratios_are_relative_to_the_loss_checks_reference(reference, expected):
    doc = {"results": [
        {"backend": "sdpa.flash", "status": "ok", "median_step_ms": 200.0},
        {"backend": "flash_attn", "status": "unsupported", "median_step_ms": None},
        {"backend": "sdpa.math", "status": "ok", "median_step_ms": 100.0},
    ], "loss_check": {"reference": reference}}  # fmt: skip
    ref, ratios = plots.train_ratios(doc)
    assert (ref, [x for _, _, x in ratios]) == expected


@pytest.mark.slow  # a subprocess that imports matplotlib and draws nine figures: ~3 s on 2 cores
def test_render_cli_draws_the_siblings(fixtures_dir, tmp_path, run_validate):
    report = report_folder(fixtures_dir, tmp_path / "reports" / "sm_90" / "host-nvidia")
    page = report.with_suffix(".html")
    proc = run_validate("render", str(report), "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    parts = PageParts()
    parts.feed(page.read_text())
    assert parts.figure_svgs == len(PLOTS)
    assert [p.name for p in report.parent.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("bench.json", {"kind": "attnforge.stress", "version": 1, "runs": []},
         "bench.json: expected kind 'attnforge.bench' but it is a document of kind "
         "'attnforge.stress'"),
        ("bench_train.json", {"kind": "attnforge.bench_train", "version": 2, "results": []},
         "bench_train.json: attnforge.bench_train version 2 is not supported"),
        ("stress-sdxl.json", {"schema_version": "1.1"}, "not an attnforge document (no kind)"),
        ("bench.json", {"kind": "attnforge.bench", "version": 1},
         "attnforge.bench document without a 'results' list"),
        ("stress-llm.json", "{oops", "stress-llm.json:1:2: not valid JSON"),
    ],
)  # fmt: skip
def test_a_wrong_sibling_is_one_sentence_and_the_old_page_stays(
    name, content, fragment, fixtures_dir, tmp_path, run_validate
):
    report = report_folder(fixtures_dir, tmp_path / "r", siblings=[])
    (report.parent / name).write_text(content if isinstance(content, str) else json.dumps(content))
    page = report.with_suffix(".html")
    page.write_text("the last good page")
    proc = run_validate("render", str(report), "--html", str(page), "--md", "-")
    assert proc.returncode == 2
    assert fragment in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert page.read_text() == "the last good page"


def test_without_matplotlib_the_page_keeps_its_tables_and_says_where_pictures_belong(
    fixtures_dir, tmp_path, run_validate
):
    env = hide_matplotlib(tmp_path)  # as in an image: the in-image Python has no matplotlib
    report = report_folder(fixtures_dir, tmp_path / "r", siblings=["bench.json"])
    page = tmp_path / "p.html"
    proc = run_validate("render", str(report), "--html", str(page), "--md", "-", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("## ❌ Validation FAIL")
    note = proc.stderr.strip().splitlines()
    assert len(note) == 1 and "matplotlib" in note[0] and "without its pictures" in note[0]
    text = page.read_text()
    assert "<figure" not in text and text.count("A picture belongs here") == 3  # grid, fused, bench
    assert "<td class='cell-pass'>" in text and "Runs without a time" in text


def test_the_renderer_does_not_import_matplotlib_until_it_plots(run_validate, tmp_path):
    # the in-image suite writes Markdown only: it never pays for importing matplotlib
    code = ("import sys, json, validate.cli, validate.render as r; "
            "r.to_markdown(json.load(open(sys.argv[1]))); "
            "print('matplotlib' in sys.modules)")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, str(FIXTURES / "h200_report.json")],
                          cwd=REPO, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_a_run_without_memory_figures_draws_speed_only(full_page):
    _, siblings = full_page
    results = [{**r, "peak_mem_mb": None} for r in siblings["bench"]["results"]]
    drawn = plots.bench_plots({**siblings["bench"], "results": results})
    assert [p.key for p in drawn] == ["sweep-tflops", "workload-tflops"]
    assert all("peak MB" not in p.svg for p in drawn)
    train = siblings["bench_train"]
    cpu = plots.train_plot(
        {**train, "results": [{**r, "peak_mem_mb": None} for r in train["results"]]}
    )
    gpu = plots.train_plot(train)
    assert (
        cpu.svg.count('id="train-ratio-axes_') == 1 and gpu.svg.count('id="train-ratio-axes_') == 2
    )
