"""The HTML report in a real browser: headless Chromium loads the page, every plot is drawn, the
console stays quiet and nothing is fetched (tools/report_page.py drives it over the DevTools
pipe). Without Chromium these tests skip, except in CI (ATTNFORGE_REQUIRE_E2E=1 or CI=true),
where `tools/setup.sh registry` installs it and its absence is a failure."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.validate.conftest import FIXTURES, REPO

pytestmark = pytest.mark.slow

spec = importlib.util.spec_from_file_location("report_page", REPO / "tools" / "report_page.py")
report_page = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report_page)


@pytest.fixture(scope="module")
def chromium() -> str:
    found = report_page.find_browser()
    if found:
        return found
    if os.environ.get("ATTNFORGE_REQUIRE_E2E") == "1" or os.environ.get("CI") == "true":
        pytest.fail("Chromium is missing, and CI must open the report in a browser: "
                    "run `tools/setup.sh registry` (it installs Debian's chromium)")  # fmt: skip
    pytest.skip("Chromium is not installed (apt-get install chromium); the report's browser "
                "check needs it")  # fmt: skip


def page_tool(*args: str, cwd=REPO):
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "report_page.py"), *args],
        cwd=cwd, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def test_the_report_page_renders_in_chromium(chromium, tmp_path):
    pytest.importorskip("matplotlib", reason="the dev extra brings matplotlib")
    folder = tmp_path / "reports" / "sm_90" / "host-nvidia"
    folder.mkdir(parents=True)
    shutil.copy(FIXTURES / "h200_report.json", folder / "report.json")
    for sibling in (FIXTURES / "siblings").iterdir():
        shutil.copy(sibling, folder / sibling.name)
    shot = tmp_path / "shot.png"
    proc = page_tool(str(folder), "--screenshot", str(shot))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    seen = json.loads(proc.stdout)
    assert seen["problems"] == [] and seen["console"] == []
    # every plot the renderer drew is an SVG the browser laid out, text and all
    assert (
        seen["figures"] == 6 and seen["svgs"] == 6
    )  # grid, fused, sweep, memory, workloads, train
    assert all(p["svg"] and p["width"] > 300 and p["height"] > 150 for p in seen["plots"])
    assert all(p["texts"] > 5 for p in seen["plots"])
    # the page asked for itself only
    assert seen["requests"] == [seen["url"]] and seen["external"] == []
    assert seen["sections"][:4] == ["summary", "environment", "expectations", "backends"]
    assert seen["title"] == "Validation FAIL: stack host-nvidia on sm_90"
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width == 1280 and height == seen["height"] > 3000


def test_the_browser_check_catches_a_broken_page(chromium, tmp_path):
    page = tmp_path / "broken.html"
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>broken</title>"
        "<script src='http://127.0.0.1:9/plot.js'></script></head><body>"
        "<figure class='plot' id='plot-empty'><p>no svg here</p></figure>"
        "<figure class='plot' id='plot-ok'><svg width='400' height='200'><text x='9' y='9'>a"
        "</text></svg></figure>"
        "<script>console.error('plot failed'); undefinedFunction();</script></body></html>"
    )
    proc = page_tool(str(page))
    assert proc.returncode == 1, proc.stderr
    seen = json.loads(proc.stdout)
    problems = "\n".join(seen["problems"])
    assert "console.error: plot failed" in problems
    assert "undefinedFunction is not defined" in problems
    assert "the page asked for http://127.0.0.1:9/plot.js" in problems
    assert "plot plot-empty has no visible <svg>" in problems
    assert "plot-ok" not in problems
    assert seen["figures"] == 2 and seen["svgs"] == 1


def test_a_missing_report_is_a_usage_error(tmp_path):
    proc = page_tool(str(tmp_path / "nowhere"))
    assert proc.returncode == 2
    assert "no such file" in proc.stderr and "Traceback" not in proc.stderr
