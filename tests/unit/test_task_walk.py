"""Every task in `invoke --list`, walked: its --help, and a bad value for each of its options.

The tasks run in this process through invoke's own Program (the parser a user's `invoke` runs),
with the build and report folders in a temporary directory; the table of bad values is per kind
of option (attnforge/cli `Opt.kind`), so a new task or option is walked without a new test.
Every bad value must be refused before any work: exit status 1 (invoke's parser) or 2 (a
sentence), no traceback, and the message names the option or the value.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from invoke import Program

import tasks
from attnforge.cli import _Task

TASKS = {name: tasks.ns[name] for name in tasks.ns.task_names}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = 0
    try:
        Program(namespace=tasks.ns, binary="invoke").run(["invoke", *argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(autouse=True)
def outputs(tmp_path, monkeypatch):
    """Build and report folders of this test, and the working directory: nothing in the checkout."""
    monkeypatch.setenv("ATTNFORGE_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("ATTNFORGE_REPORTS_DIR", str(tmp_path / "reports"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not a folder\n")
    return tmp_path


def test_every_task_is_an_attnforge_command():
    assert TASKS and all(isinstance(t, _Task) for t in TASKS.values())


@pytest.mark.parametrize("name", sorted(TASKS))
def test_help_shows_every_option_with_its_placeholder(capsys, name):
    code, out, err = _run(capsys, name, "--help")
    assert code == 0 and not err, err
    assert out.startswith(f"Usage: invoke {name}")
    assert "STRING" not in out and "Traceback" not in out
    t = TASKS[name]
    for option, opt in t.options.items():
        flag = "--" + option.rstrip("_").replace("_", "-")
        assert f"{flag}={opt.metavar}" in out, (flag, out)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_list_descriptions_are_whole_sentences(name):
    lines = inspect.getdoc(TASKS[name]).splitlines()
    # `invoke --list` shows the first line: it must be the whole first sentence.
    assert lines[0].endswith("."), lines[0]
    assert len(lines) == 1 or not lines[1].strip(), lines[:2]


def _required(name: str, tmp: Path, but: str = "") -> list[str]:
    """Good values for a task's required options (but the one under test), so that the option
    under test is reached."""
    good = {"in_dir": str(tmp), "out_dir": str(tmp / "out"), "text": "x",
            "namespace": "localhost:5000/ns"}  # fmt: skip
    found = []
    for option, opt in TASKS[name].options.items():
        if opt.required and option != but:
            value = opt.choices[0] if opt.choices else good[opt.kind]
            found += ["--" + option.replace("_", "-"), value]
    return found


def _bad_values(kind: str, tmp: Path) -> list[tuple[str, str]]:
    """(value, what the message must name besides the flag: the value, or "" for the flag)."""
    table = {
        "text": [("", "")],
        "number": [("abc", "abc"), ("0", "0"), ("", "")],
        "choice": [("sideways", "sideways"), ("", "")],
        "arch": [("gfx9999", "gfx9999"), ("", "")],
        "stack": [("no-such-stack", "no-such-stack"), ("", "")],
        "engine": [("nerdctl", "nerdctl"), ("", "")],
        "namespace": [("Team/X", "not a registry namespace"), ("a//b", "a//b"), ("", "")],
        "out_file": [
            (str(tmp / "a-file" / "out.json"), "is a file"),  # its folder is a file
            (str(tmp), "is a folder"),
            (str(tmp / "ro" / "out.json"), "not writable"),
            ("", ""),
        ],
        "out_dir": [(str(tmp / "a-file"), "is a file"), (str(tmp / "ro" / "x"), "not writable")],
        "in_dir": [(str(tmp / "missing"), "no such folder"), (str(tmp / "a-file"), "no such")],
        "in_file": [(str(tmp / "missing"), "no such file")],
    }
    return table[kind]


def _cases():
    for name, t in sorted(TASKS.items()):
        for option in t.options:
            yield pytest.param(name, option, id=f"{name}--{option}")


@pytest.mark.parametrize(("name", "option"), list(_cases()))
def test_bad_values_are_refused_naming_the_option(capsys, outputs, name, option):
    opt = TASKS[name].options[option]
    flag = "--" + option.rstrip("_").replace("_", "-")
    ro = outputs / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        for value, named in _bad_values(opt.kind, outputs):
            if "not writable" in named and _root():
                continue  # root writes anywhere: the mode bits cannot make this case
            code, out, err = _run(capsys, name, *_required(name, outputs, option), flag, value)
            said = " ".join((out + err).split())
            assert code in (1, 2), (name, flag, value, code, said)
            assert "Traceback" not in said, said
            assert flag in said and named in said, (flag, value, said)
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize(
    ("name", "option"),
    [(n, o) for n, t in sorted(TASKS.items()) for o, opt in t.options.items() if opt.repeatable],
)
def test_a_repeatable_option_without_a_value_is_refused(capsys, outputs, name, option):
    flag = "--" + option.rstrip("_").replace("_", "-")
    for argv in ([flag], [flag, "--debug"]):  # at the end, and before another flag
        code, out, err = _run(capsys, name, *argv)
        assert code == 1 and flag in err and "needed value" in err, (argv, out, err)


@pytest.mark.parametrize(
    "name", [n for n, t in sorted(TASKS.items()) if t.writes and t.name != "aot"]
)
def test_a_workspace_folder_that_is_a_file_is_named(capsys, outputs, monkeypatch, name):
    monkeypatch.setenv("ATTNFORGE_BUILD_DIR", str(outputs / "a-file"))
    monkeypatch.setenv("ATTNFORGE_REPORTS_DIR", str(outputs / "a-file"))
    code, out, err = _run(capsys, name, *_required(name, outputs))
    said = " ".join(err.split())
    assert code == 2 and "is a file, not a folder" in said and "$ATTNFORGE_" in said, said


def test_kernels_aot_refuses_a_build_folder_that_is_a_file_before_compiling(
    capsys, outputs, monkeypatch
):
    monkeypatch.setenv("ATTNFORGE_BUILD_DIR", str(outputs / "a-file"))
    code, _, err = _run(capsys, "kernels.aot", "--arch", "gfx1151")
    assert code == 2 and "$ATTNFORGE_BUILD_DIR" in err


def test_kernels_aot_refuses_a_cache_dir_that_is_a_file_before_compiling(capsys, outputs):
    code, _, err = _run(capsys, "kernels.aot", "--arch", "gfx1151", "--cache-dir",
                        str(outputs / "a-file"))  # fmt: skip
    assert code == 2 and "--cache-dir" in err and "is a file" in err


def test_positional_paths_are_taken_as_users_type_them(capsys, outputs):
    # invoke matrix FILE...: every path is taken (a missing one is named with the options, before
    # any is read)
    code, _, err = _run(capsys, "matrix", str(outputs), str(outputs / "missing"))
    assert code == 2 and "--reports" in err and "missing: no such file or folder" in err
    code, _, err = _run(capsys, "matrix", str(outputs / "missing"), str(outputs))
    assert code == 2 and "missing: no such file or folder" in err
    code, _, err = _run(capsys, "matrix", str(outputs))
    assert code == 2 and "no report.json" in err  # a folder without reports
    # invoke report FILE
    code, _, err = _run(capsys, "report", str(outputs / "missing.json"))
    assert code == 2 and "missing.json: no such report" in err


def test_a_required_positional_is_named_when_missing(capsys):
    code, _, err = _run(capsys, "patches.apply")
    assert code == 2 and "COMPONENT is needed" in err and "--component" in err


def test_interrupting_a_task_that_is_not_a_build_does_not_offer_build_continue(capsys, monkeypatch):
    from attnforge import doctor

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(doctor, "gather", interrupted)
    code, _, err = _run(capsys, "doctor")
    assert code == 130 and "interrupted" in err and "--continue" not in err


def _root() -> bool:
    import os

    return os.geteuid() == 0


def test_a_git_failure_says_what_git_said_not_its_advice(capsys, outputs):
    code, _, err = _run(capsys, "bisect", "--arch", "gfx942", "--stack", "source", "--layer",
                        "pytorch-source", "--check", "validate", "--bad", "abc",
                        "--repo", str(outputs / "missing"))  # fmt: skip
    said = " ".join(err.split())
    assert code == 2 and "does not appear to be a git repository" in said, said
    assert "the repository exists" not in said


def test_a_file_the_system_refuses_after_the_checks_is_one_sentence(capsys, outputs):
    # /proc takes no new file: refused by the checks (not writable), or for root, who passes
    # them, by the system when the file is written
    code, _, err = _run(capsys, "schema", "--output", "/proc/attnforge-schema.json")
    said = " ".join(err.split())
    assert code in (1, 2) and "Traceback" not in said and "/proc/" in said, said
    assert not list(Path("/proc").glob(".attnforge-schema.json*"))
