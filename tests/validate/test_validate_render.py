"""Rendering: Markdown for CI summaries, HTML for `invoke report`, and the JSON schema."""

import json

import pytest

from validate import render

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
