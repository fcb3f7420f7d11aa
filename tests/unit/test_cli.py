"""The command line as a user meets it: clear sentences, exit 2, no traceback for their mistakes."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_invoke


def invoke(*args, cwd=REPO, env=None):
    return run_invoke(cwd, *args, env=env)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["build", "--arch", "gfx9000", "--dry-run"],
            "unknown arch 'gfx9000'; valid arches: cpu, gfx1100",
        ),
        (
            ["build", "--arch", "cpu", "--stack", "fast", "--dry-run"],
            "unknown stack 'fast'; valid stacks: cpu, default, source",
        ),
        (
            ["build", "--arch", "cpu", "--only", "ck", "--dry-run"],
            "unknown layer of stack cpu 'ck'",
        ),
        (
            ["build", "--arch", "cpu", "--set", "triton.X=1", "--dry-run"],
            "layer 'triton' has no setting 'X'",
        ),
        (
            ["build", "--arch", "cpu", "--wheelhouse", "/nonexistent", "--dry-run"],
            "--wheelhouse /nonexistent: no such file",
        ),
        (["validate", "--arch", "gfx1151"], "not found: this host has no ROCm GPU driver"),
    ],
)
def test_user_mistakes_are_sentences_without_tracebacks(args, message):
    proc = invoke(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


def test_debug_shows_the_traceback():
    proc = invoke("build", "--arch", "gfx9000", "--dry-run", "--debug")
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_a_broken_recipe_is_reported_with_file_and_line(repo_copy):
    path = repo_copy / "recipes/layers/triton.yaml"
    path.write_text(path.read_text().replace("wheelhouse: true", "wheelhouse: true\ncolour: blue"))
    proc = invoke("build", "--arch", "cpu", "--dry-run", cwd=repo_copy)
    assert proc.returncode == 2
    assert "recipes/layers/triton.yaml:" in proc.stderr and "colour: unknown key" in proc.stderr


def test_dry_run_json_is_the_plan(tmp_path):
    proc = invoke("build", "--arch", "gfx1151", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert [s["layer"] for s in plan["steps"]] == [
        "base",
        "rocm-sdk",
        "pytorch-wheels",
        "flash-attention",
        "validate",
    ]
    assert plan["steps"][2]["args"]["AOTRITON_EXPERIMENTAL"] == "1"
    assert plan["steps"][1]["args"]["THEROCK_EXTRA"] == "device-gfx1151"


def test_dry_run_table_names_unsupported_layers_and_why():
    proc = invoke("build", "--arch", "gfx90a", "--stack", "default", "--dry-run")
    assert proc.returncode == 0
    assert "rocm-sdk is unsupported on gfx90a" in " ".join(proc.stdout.split())


def test_schema_task_prints_a_json_schema():
    proc = invoke("schema")
    assert proc.returncode == 0
    assert "Layer" in json.loads(proc.stdout)["$defs"]


def test_every_task_has_help():
    proc = invoke("--list")
    for name in ("build", "validate", "report", "publish", "schema", "arches"):
        line = next(
            (row for row in proc.stdout.splitlines() if row.strip().startswith(name + " ")), ""
        )
        assert len(line.split()) > 1, f"{name} has no one-line help in --list"


def test_no_reachable_engine_says_how_to_start_one():
    import os

    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent/docker.sock")
    proc = invoke("build", "--arch", "cpu", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert "no Docker engine is reachable at unix:///nonexistent/docker.sock" in err
    assert "systemctl start docker" in err and "Traceback" not in proc.stderr


def test_report_renders_a_real_report_to_markdown_and_html(tmp_path):
    import shutil

    report = tmp_path / "report.json"
    shutil.copy(REPO / "tests/validate/fixtures/h200_report.json", report)
    proc = invoke("report", str(report), "--html")
    assert proc.returncode == 0, proc.stderr
    assert "cudnn" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "report.html").read_text().lstrip().lower().startswith("<!doctype html")


def test_report_of_a_missing_file_is_a_clear_error(tmp_path):
    proc = invoke("report", str(tmp_path / "nope.json"))
    assert proc.returncode == 2 and "no such report" in proc.stderr
