"""Usage errors: exit status 2 and one sentence, never a traceback."""

import json

import pytest


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["all", "--timeout", "-1"], "the timeout must be more than 0 seconds"),
        (["all", "--timeout", "soon"], "not a number of seconds"),
        (["all", "--bogus"], "unrecognized arguments: --bogus"),
        (
            ["--expect", "/nonexistent/expect.json"],
            "cannot read expect file /nonexistent/expect.json",
        ),
        (["render", "x.json"], "render needs --md PATH and/or --html PATH"),
        (["render", "/nonexistent/r.json", "--md", "-"], "cannot read report"),
        (["env", "--json", "/proc/version/r.json"], "--json /proc/version/r.json"),
    ],
)
def test_usage_errors(args, fragment, run_validate):
    proc = run_validate(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert fragment in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_expectation_key_lists_the_valid_ones(tmp_path, run_validate):
    p = tmp_path / "expect.json"
    p.write_text(json.dumps({"stack": "s", "arch": "gfx1151", "expect": {"sdpa.backend": "flash"}}))
    proc = run_validate("--expect", str(p))
    assert proc.returncode == 2
    assert "unknown expectation key(s) sdpa.backend; valid keys:" in proc.stderr
    assert "sdpa.default_backend" in proc.stderr


def test_help_lists_commands_and_exit_codes(run_validate):
    proc = run_validate("--help")
    assert proc.returncode == 0
    for word in ("env", "backends", "flash-attn", "kernels", "all", "render", "exit status"):
        assert word in proc.stdout
    assert "VALIDATE_EXTRA_CHECKS" not in proc.stdout  # the testing hook stays out of user help
    sub = run_validate("all", "--help")
    for flag in ("--json", "--md", "--expect", "--quick", "--timeout", "--only", "--skip"):
        assert flag in sub.stdout


def test_broken_extra_checks_file_is_a_usage_error(tmp_path, run_validate):
    bad = tmp_path / "bad.py"
    bad.write_text("CHECKS = [{'id': 'x'}]\n")  # no 'func'
    proc = run_validate("env", env={"VALIDATE_EXTRA_CHECKS": str(bad)})
    assert proc.returncode == 2
    assert "VALIDATE_EXTRA_CHECKS" in proc.stderr and "Traceback" not in proc.stderr
