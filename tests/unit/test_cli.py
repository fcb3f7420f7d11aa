"""The command line as a user meets it: clear sentences, exit 2, no traceback for their mistakes."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.conftest import REPO, no_engine_env, outputs_env, run_invoke


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
            "unknown stack 'fast'; valid stacks: cpu, dao, default, ",
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
            "--wheelhouse /nonexistent: no such folder",
        ),
        (["validate", "--arch", "gfx1151"], "not found: this host has no ROCm GPU driver"),
        (["build", "--jobs", "abc", "--dry-run"], "--jobs 'abc': expected a whole number"),
        (["build", "--jobs", "-1", "--dry-run"], "--jobs -1: must be at least 1"),
        (["build", "--jobs", "0", "--dry-run"], "--jobs 0: must be at least 1"),
        (["validate", "--timeout", "soon"], "--timeout 'soon': expected a whole number"),
        (
            ["build", "--engine", "nope", "--dry-run"],
            "unknown engine 'nope'; valid engines: docker, podman",
        ),
        (["validate", "--engine", "nope"], "unknown engine 'nope'"),
        (["pins.check", "--engine", "nope"], "unknown engine 'nope'"),
        (["build", "--set", "nope", "--dry-run"], "e.g. pytorch-wheels.TORCH_VERSION=2.13.0"),
        (
            ["build", "--arch", "cpu", "--set", "triton.TRITON_VERSION=", "--dry-run"],
            "bad --set 'triton.TRITON_VERSION=': TRITON_VERSION pins a version",
        ),
        (
            ["build", "--arch", "cpu", "--ca-cert", "/nonexistent", "--dry-run"],
            "--ca-cert /nonexistent: no such file (give a CA bundle, or 'none')",
        ),
        # checked with the options, before any work: not after the image was found and probed
        (
            ["export", "--arch", "cpu", "--ca-cert", "/nonexistent"],
            "--ca-cert /nonexistent: no such file (give a CA bundle, or 'none')",
        ),
        (["doctor", "--arch", "gfx1151;reboot"], "--arch 'gfx1151;reboot': not an arch name"),
        (
            ["verify-env", "--against", "x", "--python", "/etc/passwd"],
            "--python /etc/passwd: no such file, or",
        ),
        (
            ["verify", "--image", "r/x:1", "--key", "/etc/passwd"],
            "--key /etc/passwd: not a PEM",
        ),
        (["validate", "--bench-backend", "kernels"], "--bench-backend goes with --bench"),
        (["build", "--json"], "--json goes with --dry-run"),
        (["build", "--explain", "base"], "--explain goes with --dry-run"),
        (
            ["build", "-a", "gfx1151", "--dry-run", "--explain", "ck"],
            "unknown layer of stack default 'ck'",
        ),
        (["report", "--arch", "cpu"], "no such report"),
    ],
)
def test_user_mistakes_are_sentences_without_tracebacks(args, message):
    proc = invoke(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


def created_labels(plan_json: str) -> set[str]:
    """The created labels of a dry run's build commands, one per distinct value."""
    commands = " ".join(str(s["command"]) for s in json.loads(plan_json)["steps"])
    return set(re.findall(r"org\.opencontainers\.image\.created=([0-9T:Z-]+)", commands))


def test_source_date_epoch_is_the_images_created_time_and_a_bad_one_is_refused(tmp_path):
    """The created label of every layer follows SOURCE_DATE_EPOCH (reproducible builds; under
    Podman a time that differs between builds gives the layers above no cache), else now. Planned
    with no engine, so that every layer has its build command whatever the engine holds."""
    env = no_engine_env({**os.environ, "SOURCE_DATE_EPOCH": "1767225600"})
    proc = invoke("build", "--arch", "cpu", "--dry-run", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert created_labels(proc.stdout) == {"2026-01-01T00:00:00Z"}
    for bad in ("yesterday", "-1", "1e9", "99999999999999", "2\u00b2"):  # 2 squared: not ASCII
        proc = invoke("build", "--arch", "cpu", "--dry-run", env={**env, "SOURCE_DATE_EPOCH": bad})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert f"SOURCE_DATE_EPOCH={bad!r} is not a time" in " ".join(proc.stderr.split())
    unset = {k: v for k, v in env.items() if k != "SOURCE_DATE_EPOCH"}
    proc = invoke("build", "--arch", "cpu", "--dry-run", "--json", env=unset)
    created = created_labels(proc.stdout)
    assert len(created) == 1 and created != {"2026-01-01T00:00:00Z"}


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
    assert plan["steps"][2]["args"]["AOTRITON_EXPERIMENTAL"] == "0"  # AOTriton 0.13b
    assert plan["steps"][1]["args"]["THEROCK_EXTRA"] == "device-gfx1151"


def test_dry_run_table_names_unsupported_layers_and_why():
    proc = invoke("build", "-a", "gfx1151", "--set", "flash-attention.variant=ck", "--dry-run")
    assert proc.returncode == 0
    assert "flash-attention is unsupported on gfx1151: ck:" in " ".join(proc.stdout.split())


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


@pytest.mark.parametrize("args", [["build", "--help"], ["--list"]])
def test_output_cut_short_by_a_pipe_ends_quietly(args):
    """`invoke build --help | head -1`: the reader closes the pipe after one line; the task must
    end without a BrokenPipeError traceback on stderr."""
    import subprocess
    import sys

    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO, stdout=reader.stdin, stderr=subprocess.PIPE, text=True, env=outputs_env(),
        timeout=120,
    )  # fmt: skip
    reader.stdin.close()
    reader.wait()
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_an_unanswering_docker_host_is_named_and_not_suggested_again():
    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent/docker.sock")
    proc = invoke("build", "--arch", "cpu", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert "no Docker engine is reachable at unix:///nonexistent/docker.sock" in err
    assert (
        "DOCKER_HOST is set to unix:///nonexistent/docker.sock, and that engine did not answer"
        in err
    )
    assert "point DOCKER_HOST" not in err and "Traceback" not in proc.stderr


def test_without_docker_host_the_hint_says_how_to_start_an_engine():
    from attnforge.engine import HOW_TO_START, no_engine_hint

    assert no_engine_hint(None) == HOW_TO_START and "systemctl start docker" in HOW_TO_START
    assert "point DOCKER_HOST" not in no_engine_hint("tcp://gpu-box:2375")


def test_a_missing_attnforge_docker_cli_is_a_sentence():
    env = dict(os.environ, ATTNFORGE_DOCKER="/nonexistent")
    proc = invoke("build", "--arch", "cpu", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ATTNFORGE_DOCKER=/nonexistent is not an executable file" in proc.stderr
    assert "Traceback" not in proc.stderr


def _all_tasks():
    import tasks

    found = []

    def walk(coll):
        for t in coll.tasks.values():
            found.append(t)
        for sub in coll.collections.values():
            walk(sub)

    walk(tasks.ns)
    return found


def test_one_short_flag_means_one_option_across_every_task():
    meaning: dict[str, set[str]] = {}
    for t in _all_tasks():
        for arg in t.get_arguments():
            for short in (n for n in arg.names if len(n) == 1):
                meaning.setdefault(short, set()).add(arg.name)
    assert {k: v for k, v in meaning.items() if len(v) > 1} == {}
    assert meaning["a"] == {"arch"} and meaning["s"] == {"stack"}


def test_no_task_option_is_cast_by_invokes_parser():
    """invoke turns a bad int into a traceback before a task runs; numbers are checked by us."""
    cast = [(t.name, a.name) for t in _all_tasks() for a in t.get_arguments() if a.kind is int]
    assert cast == []


def test_help_renders_every_option_with_its_name():
    for t in _all_tasks():
        for arg in t.get_arguments():
            assert all(n and n.strip("-") for n in arg.names), (t.name, arg.names)
    proc = invoke("build", "--help")
    assert proc.returncode == 0 and "--=" not in proc.stdout and "--ca-cert" in proc.stdout


def test_report_finds_the_report_by_arch_and_stack_as_the_readme_shows(tmp_path):
    import shutil

    env = outputs_env(tmp_path)
    where = tmp_path / "reports/gfx1151/default"
    where.mkdir(parents=True)
    shutil.copy(REPO / "tests/validate/fixtures/h200_report.json", where / "report.json")
    proc = invoke("report", "--arch", "gfx1151", "--stack", "default", "--html", env=env)
    assert proc.returncode == 0, proc.stderr
    assert (where / "report.md").read_text().strip()
    assert (where / "report.html").read_text().lstrip().lower().startswith("<!doctype html")


def test_report_help_is_help():
    proc = invoke("report", "--help")
    assert proc.returncode == 0 and "--arch" in proc.stdout and "error" not in proc.stderr


def test_report_renders_a_real_report_to_markdown_and_html(tmp_path):
    import shutil

    report = tmp_path / "report.json"
    shutil.copy(REPO / "tests/validate/fixtures/h200_report.json", report)
    proc = invoke("report", "--path", str(report), "--html")
    assert proc.returncode == 0, proc.stderr
    assert "cudnn" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "report.html").read_text().lstrip().lower().startswith("<!doctype html")


def test_report_of_a_missing_file_is_a_clear_error(tmp_path):
    proc = invoke("report", "--path", str(tmp_path / "nope.json"))
    assert proc.returncode == 2 and "no such report" in proc.stderr


def test_a_tasks_option_checks_read_the_recipes_once_and_the_next_task_afresh(
    monkeypatch, tmp_path
):
    import attnforge.recipes
    import tasks
    from attnforge.errors import UserError

    monkeypatch.setenv("ATTNFORGE_BUILD_DIR", str(tmp_path / "build"))
    real, loads = attnforge.recipes.load_recipes, []
    monkeypatch.setattr(attnforge.recipes, "load_recipes", lambda root: loads.append(root) or real(root))  # fmt: skip
    build = tasks.ns.tasks["build"]
    assert build.check({"arch": "cpu", "stack": "cpu"}) == {"arch": "cpu", "stack": "cpu"}
    assert len(loads) == 1  # --arch and --stack, one load
    with pytest.raises(UserError, match="--stack"):
        build.check({"arch": "cpu", "stack": "no-such-stack"})
    assert len(loads) == 2  # the next checks read the recipes again
