"""The in-build script path (python3 patches.py ...) and the invoke tasks."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Context
from invoke.exceptions import Exit
from patch_helpers import diff_of, git, make_repo, make_series, tree_digest, write_files

from attnforge import patches
from attnforge.cli import patches as tasks

MODULE = Path(patches.__file__)
OLD = b"".join(b"value %d\n" % i for i in range(20))
NEW = OLD.replace(b"value 10\n", b"value 10 patched\n")


def script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run a copy of patches.py as a build's RUN step would: a lone file, no attnforge."""
    return subprocess.run(
        [sys.executable, "-I", str(cwd / "patches.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def context(tmp_path: Path, scratch: Path) -> Path:
    """A build context: patches.py and one series, next to a source tree."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    shutil.copy(MODULE, ctx / "patches.py")
    make_series(ctx / "patches", "comp", "fix", [diff_of(scratch, {"v.txt": OLD}, {"v.txt": NEW})])
    write_files(tmp_path / "src", {"v.txt": OLD})
    return ctx


def test_script_applies_then_skips_then_reports_applied(context, tmp_path):
    args = ("--src", str(tmp_path / "src"), "patches/comp/fix")

    first = script("apply", "--component", "comp", *args, cwd=context)
    second = script("apply", *args, cwd=context)
    state = script("status", *args, cwd=context)

    assert first.returncode == 0, first.stderr
    assert "0001-change-1.patch: applied" in first.stdout
    assert "skipped (already applied)" in second.stdout and second.returncode == 0
    assert "already applied" in state.stdout and state.returncode == 0
    assert (tmp_path / "src" / "v.txt").read_bytes() == NEW


def test_script_conflict_exits_1_with_the_message_and_writes_nothing(context, tmp_path):
    write_files(tmp_path / "src", {"v.txt": OLD.replace(b"value 9\n", b"drift\n")})
    before = tree_digest(tmp_path / "src")

    proc = script("apply", "--src", str(tmp_path / "src"), "patches/comp/fix", cwd=context)

    assert proc.returncode == 1
    assert "Patch 0001-change-1.patch of series comp/fix does not apply" in proc.stderr
    assert "file: v.txt" in proc.stderr and "hunk #1" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert tree_digest(tmp_path / "src") == before


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (("apply", "patches/comp/fix"), 2, "--src"),  # usage
        (("explode", "--src", ".", "patches/comp/fix"), 2, "invalid choice"),
        (("apply", "--component", "other", "--src", "SRC", "patches/comp/fix"), 1, "not 'other'"),
        (("check", "--src", "SRC", "patches/comp/none"), 1, "does not exist"),
        (("check", "--src", "SRC/missing", "patches/comp/fix"), 1, "does not exist"),
    ],
    ids=["no-src", "bad-command", "wrong-component", "no-series", "no-tree"],
)
def test_script_usage_and_user_errors(context, tmp_path, args, code, text):
    args = tuple(a.replace("SRC", str(tmp_path / "src")) for a in args)

    proc = script(*args, cwd=context)

    assert proc.returncode == code
    assert text in proc.stderr
    assert "Traceback" not in proc.stderr


def test_invoke_tasks_check_apply_status(context, tmp_path, capsys):
    c, src, root = Context(), str(tmp_path / "src"), str(context / "patches")

    tasks.check(c, component="comp", src=src, root=root)
    tasks.apply(c, component="comp", src=src, root=root)
    tasks.status(c, component="comp", src=src, series="fix", root=root)

    out = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[1].split(" [")[0] for line in out] == [
        "would apply",
        "applied",
        "already applied",
    ]


@pytest.mark.parametrize(
    ("kwargs", "code", "text"),
    [
        ({"component": "nope"}, 2, "components: comp"),
        ({"component": "comp", "series": "nope"}, 2, "choices: fix"),
    ],
)
def test_invoke_tasks_name_the_valid_choices(context, tmp_path, kwargs, code, text):
    with pytest.raises(Exit) as info:
        tasks.apply(Context(), src=str(tmp_path / "src"), root=str(context / "patches"), **kwargs)

    assert info.value.code == code
    assert text in str(info.value.message)


def test_invoke_apply_conflict_is_an_exit_1_with_the_message(context, tmp_path):
    write_files(tmp_path / "src", {"v.txt": b"rewritten\n"})

    with pytest.raises(Exit) as info:
        tasks.apply(
            Context(), component="comp", src=str(tmp_path / "src"), root=str(context / "patches")
        )

    assert info.value.code == 1
    assert "does not apply" in info.value.message


def test_new_makes_the_next_patch_on_top_of_the_applied_series(tmp_path, scratch):
    root = tmp_path / "patches"
    repo = make_repo(tmp_path / "repo", {"v.txt": OLD, "w.txt": b"w\n"})
    make_series(root, "comp", "fix", [diff_of(scratch, {"v.txt": OLD}, {"v.txt": NEW})])
    tasks.apply(Context(), component="comp", src=str(repo), root=str(root))
    write_files(repo, {"w.txt": b"w changed\n", "added/file.txt": b"brand new\n"})
    edited = tree_digest(repo)

    tasks.new(
        Context(), component="comp", series="fix", src=str(repo), name="Change W!", root=str(root)
    )

    patch = root / "comp" / "fix" / "0002-change-w.patch"
    text = patch.read_text()
    assert "Subject: [PATCH] Change W!" in text
    assert "v.txt" not in text  # only the change beyond patch 0001
    meta = json.loads((root / "comp" / "fix" / "series.json").read_text())
    head = git(repo, "rev-parse", "HEAD").stdout.decode().strip()
    assert meta["checked_against"]["0002-change-w.patch"] == head
    # The series now rebuilds the edited tree from a clean checkout, and is idempotent.
    clean = make_repo(tmp_path / "clean", {"v.txt": OLD, "w.txt": b"w\n"})
    series = [patches.load_series(root / "comp" / "fix")]
    assert [r.action for r in patches.apply(series, clean)] == ["apply", "apply"]
    assert tree_digest(clean) == edited
    assert [r.state for r in patches.status(series, repo)] == [patches.APPLIED] * 2
    # And git itself reads the generated patch the same way.
    by_git = make_repo(tmp_path / "by-git", {"v.txt": OLD, "w.txt": b"w\n"})
    for p in series[0].patches:
        git(by_git, "apply", str(p.path))
    assert tree_digest(by_git) == edited


def test_new_starts_a_series_with_metadata(tmp_path):
    root = tmp_path / "patches"
    repo = make_repo(tmp_path / "repo", {"v.txt": OLD})
    write_files(repo, {"v.txt": NEW})

    path = patches.new_patch("comp", "fresh", repo, "first fix", root)

    assert path.name == "0001-first-fix.patch"
    series = patches.load_series(path.parent, "comp")
    assert series.upstream_refs == (git(repo, "rev-parse", "HEAD").stdout.decode().strip(),)


@pytest.mark.parametrize(
    ("prepare", "text"),
    [
        ("clean", "no uncommitted change"),
        ("series-not-applied", "are not applied"),
        ("plain-tree", "not the top of its git checkout|not a git repository"),
    ],
)
def test_new_refuses_with_a_clear_sentence(tmp_path, scratch, prepare, text):
    root = tmp_path / "patches"
    repo = make_repo(tmp_path / "repo", {"v.txt": OLD})
    if prepare == "series-not-applied":
        make_series(root, "comp", "fix", [diff_of(scratch, {"v.txt": OLD}, {"v.txt": NEW})])
        write_files(repo, {"other.txt": b"x\n"})
    if prepare == "plain-tree":
        repo = tmp_path / "plain"
        write_files(repo, {"v.txt": NEW})

    with pytest.raises(Exit) as info:
        tasks.new(
            Context(), component="comp", series="fix", src=str(repo), name="x", root=str(root)
        )

    assert info.value.code == 1
    assert re.search(text, info.value.message)


def test_invoke_command_line_runs_the_tasks_in_a_subprocess(context, tmp_path):
    # The lead wires these tasks into tasks.py as the `patches` collection; a stand-in
    # tasks.py does the same here so the real invoke argument parsing is exercised.
    (tmp_path / "tasks.py").write_text(
        "from invoke import Collection\n"
        "from attnforge.cli import patches\n"
        "ns = Collection()\n"
        "ns.add_collection(Collection.from_module(patches), 'patches')\n"
    )
    base = [sys.executable, "-m", "invoke", "--search-root", str(tmp_path)]
    flags = [
        "--component",
        "comp",
        "--src",
        str(tmp_path / "src"),
        "--root",
        str(context / "patches"),
    ]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *args], capture_output=True, text=True, check=False)

    applied = run("patches.apply", *flags)
    again = run("patches.apply", *flags)
    write_files(tmp_path / "src", {"v.txt": b"rewritten\n"})
    conflict = run("patches.check", *flags)
    unknown = run("patches.status", "--component", "nope", *flags[2:])

    assert applied.returncode == 0 and "applied" in applied.stdout, applied.stderr
    assert again.returncode == 0 and "skipped (already applied)" in again.stdout
    assert conflict.returncode == 1 and "does not apply" in conflict.stderr
    assert unknown.returncode == 2 and "components: comp" in unknown.stderr
    assert "Traceback" not in conflict.stderr + unknown.stderr
