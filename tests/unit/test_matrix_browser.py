"""invoke matrix on a real report of this machine (the cpu stack, `invoke validate --arch cpu
--local` plus a tiny `python -m validate bench`) and an H200 run's report (fixture, with its
bench.json), and the page in a real browser: headless Chromium loads matrix.html and every full
report it links, with no console error and nothing fetched (tools/report_page.py drives it over
the DevTools pipe). Without Chromium the browser test skips, except in CI (ATTNFORGE_REQUIRE_E2E=1
or CI=true), where `tools/setup.sh registry` installs it and its absence is a failure."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, outputs_env, run_invoke

pytestmark = pytest.mark.slow

FIXTURES = REPO / "tests" / "validate" / "fixtures"
TINY_SHAPE = "sweep-b1-h1-s64-d128-fp16"  # validate bench --tiny --quick's one sweep shape

spec = importlib.util.spec_from_file_location("report_page", REPO / "tools" / "report_page.py")
report_page = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report_page)


@pytest.fixture(scope="module")
def chromium() -> str:
    found = report_page.find_browser()
    if found:
        return found
    if os.environ.get("ATTNFORGE_REQUIRE_E2E") == "1" or os.environ.get("CI") == "true":
        pytest.fail("Chromium is missing, and CI must open the matrix in a browser: "
                    "run `tools/setup.sh registry` (it installs Debian's chromium)")  # fmt: skip
    pytest.skip("Chromium is not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    """A reports folder with this machine's cpu report (+ a tiny bench) and the H200 one."""
    pytest.importorskip("torch", reason="the cpu report needs torch in the venv (dev extra)")
    base = tmp_path_factory.mktemp("matrix-real")
    proc = run_invoke(REPO, "validate", "--arch", "cpu", "--local", "--quick",
                      env=outputs_env(base), timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cpu = base / "reports" / "cpu" / "cpu"
    bench = subprocess.run(
        [sys.executable, "-m", "validate", "bench", "--tiny", "--quick", "--mode", "fwd",
         "--backend", "sdpa.math,sdpa.flash,sdpa.default", "--json", str(cpu / "bench.json")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
    h200 = base / "reports" / "sm_90" / "host-nvidia"
    h200.mkdir(parents=True)
    shutil.copy(FIXTURES / "h200_report.json", h200 / "report.json")
    for sibling in (FIXTURES / "siblings").iterdir():
        shutil.copy(sibling, h200 / sibling.name)
    return base


def rows(md: str) -> dict[str, list[str]]:
    """The Markdown table's rows by `arch` `stack`, split into cells."""
    found = {}
    for line in md.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            found[f"{cells[0]} {cells[1]}".replace("`", "")] = cells
    return found


def test_a_real_cpu_report_and_an_h200_report_make_a_matrix(outputs, tmp_path):
    proc = run_invoke(REPO, "matrix", "--shape", TINY_SHAPE, "-o", str(tmp_path / "site"),
                      "--no-html-reports", env=outputs_env(outputs))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    table = rows((tmp_path / "site" / "matrix.md").read_text())
    assert set(table) == {"cpu cpu", "sm_90 host-nvidia"}
    cpu = table["cpu cpu"]
    head = ["arch", "stack", "status", "device", "ROCm", "torch", "AOTriton", "flash-attention",
            "host kernel", "SDPA picks", "SDPA flash", "SDPA efficient", "SDPA cuDNN",
            "SDPA math", "flash_attn", "bundled kernels", "report"]  # fmt: skip
    cell = dict(zip(head, cpu, strict=True))
    import torch

    assert cell["status"] == "✅ pass" and cell["device"] == "CPU" and cell["ROCm"] == "none"
    assert cell["torch"] == torch.__version__
    assert cell["host kernel"] == os.uname().release
    # CPU torch runs flash and math; its can_use_* APIs answer no off CUDA/HIP, so "when forced"
    assert re.fullmatch(r"✅ works when forced · [0-9.e-]+ TFLOP/s \[\d+\]", cell["SDPA flash"])
    assert re.fullmatch(r"✅ works · [0-9.e-]+ TFLOP/s", cell["SDPA math"]), cell["SDPA math"]
    assert cell["SDPA efficient"].startswith("— refused [")
    assert cell["flash_attn"] == "∅ not installed"
    assert re.fullmatch(r"✅ works \(\d+ cases\)", cell["bundled kernels"])
    assert cell["report"] == "[report](reports/cpu/cpu/report.md)"
    # the H200 fixture's bench has no tiny shape: no speed, and the cells still say what works
    h200 = dict(zip(head, table["sm_90 host-nvidia"], strict=True))
    assert h200["SDPA flash"] == "✅ works" and h200["SDPA picks"] == "cudnn"
    assert (tmp_path / "site" / "reports" / "cpu" / "cpu" / "bench.json").is_file()


def test_the_matrix_page_renders_in_chromium(chromium, outputs, tmp_path):
    pytest.importorskip("matplotlib", reason="the full reports' plots need matplotlib (dev extra)")
    site = tmp_path / "site"
    proc = run_invoke(REPO, "matrix", "-o", str(site), env=outputs_env(outputs), timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "was not drawn" not in proc.stdout
    shot = tmp_path / "matrix.png"
    # every full report the matrix links opens too, in the same Chromium
    links = re.findall(r"<a href='([^']+)'>full report</a>", (site / "matrix.html").read_text())
    seen, *pages = report_page.inspect_all(
        [(site / "matrix.html", shot), *((site / link, None) for link in links)]
    )
    assert report_page.problems(seen) == [] and seen["console"] == []
    assert seen["requests"] == [seen["url"]] and seen["external"] == []
    assert seen["title"] == "attnforge compatibility matrix"
    assert seen["sections"] == ["matrix", "speed", "legend"]
    # the speed chart: the cpu row at its nearest benched shape, the H200 row at the reference
    assert [p["id"] for p in seen["plots"]] == ["plot-speed"]
    assert "speed at <code>sweep-" in (site / "matrix.html").read_text()
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == 1280
    # the full reports the matrix links; the H200 one draws its bench plots
    assert sorted(links) == ["reports/cpu/cpu/report.html",
                             "reports/sm_90/host-nvidia/report.html"]  # fmt: skip
    for link, page in zip(links, pages, strict=True):
        assert report_page.problems(page) == [], link
        assert page["sections"][:2] == ["summary", "environment"]
        assert page["plots"][0]["id"] == "plot-sdpa-grid"  # every page has its grid's heat map
