"""Patch series (attnforge/patches.py over git apply), on real git checkouts and plain trees."""

from __future__ import annotations

import json
import os
import stat
import tarfile
from pathlib import Path

import pytest
from patch_helpers import diff_of, git, make_repo, make_series, tree_digest, write_files

from attnforge import patches

A = b"".join(b"line %d of a\n" % i for i in range(1, 31))
B = b"".join(b"line %d of b\n" % i for i in range(1, 31))
BASE = {"src/a.txt": A, "src/b.txt": B}


def edit(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1, old
    return data.replace(old, new)


def chain(scratch: Path, base: dict, steps: list[dict]) -> list[bytes]:
    """Patches that take base through each step in turn (patch n is made on top of n-1)."""
    out, state = [], dict(base)
    for step in steps:
        after = {**state, **step}
        out.append(diff_of(scratch, state, step))
        state = {k: v for k, v in after.items() if v is not None}
    return out


def four_patches(scratch: Path) -> list[bytes]:
    a1 = edit(A, b"line 3 of a\n", b"line 3 of a, patched\n")
    a2 = edit(a1, b"line 20 of a\n", b"line 20 of a, patched\n")
    b3 = edit(B, b"line 5 of b\n", b"line 5 of b, patched\n")
    b4 = edit(b3, b"line 25 of b\n", b"line 25 of b, patched\n")
    return chain(
        scratch,
        BASE,
        [{"src/a.txt": a1}, {"src/a.txt": a2}, {"src/b.txt": b3}, {"src/b.txt": b4}],
    )


def load(folder: Path) -> list[patches.Series]:
    return [patches.load_series(folder)]


def test_apply_twice_gives_identical_tree_and_second_run_skips_all(tmp_path, scratch):
    repo = make_repo(tmp_path / "repo", BASE)
    series = load(make_series(tmp_path / "patches", "comp", "s", four_patches(scratch)))

    first = patches.apply(series, repo)
    after_first = tree_digest(repo)
    second = patches.apply(series, repo)

    assert [r.action for r in first] == ["apply"] * 4
    assert all(r.written for r in first)
    assert [r.action for r in second] == ["skip"] * 4
    assert not any(r.written for r in second)
    assert tree_digest(repo) == after_first
    assert after_first != tree_digest(make_repo(tmp_path / "pristine", BASE))


def test_drifted_tree_is_a_conflict_leaves_tree_untouched_and_names_the_hunk(tmp_path, scratch):
    repo = make_repo(tmp_path / "repo", BASE)
    series = load(make_series(tmp_path / "patches", "comp", "s", four_patches(scratch)))
    write_files(repo, {"src/a.txt": edit(A, b"line 21 of a\n", b"line 21 CHANGED UPSTREAM\n")})
    before = tree_digest(repo)

    with pytest.raises(patches.PatchConflict) as info:
        patches.apply(series, repo)

    message = str(info.value)
    assert tree_digest(repo) == before
    assert "0002-change-2.patch" in message
    assert "file: src/a.txt" in message
    assert "hunk #1 (@@ -17,7 +17,7 @@ line 16 of a): matches neither the old nor" in message
    assert "error: while searching for:" in message  # git apply's own words, with the lines
    assert "The tree looks drifted" in message
    assert "https://example.com/upstream/issue/1" in message
    assert "Nothing was written (0001-change-1.patch would have been applied first)" in message


def test_first_patch_applied_by_hand_is_skipped_and_the_rest_applied(tmp_path, scratch):
    repo = make_repo(tmp_path / "repo", BASE)
    folder = make_series(tmp_path / "patches", "comp", "s", four_patches(scratch))
    git(repo, "apply", str(folder / "0001-change-1.patch"))

    results = patches.apply(load(folder), repo)

    assert [r.action for r in results] == ["skip", "apply", "apply", "apply"]
    expected = make_repo(tmp_path / "expected", BASE)
    for p in sorted(folder.glob("*.patch")):
        git(expected, "apply", str(p))
    assert tree_digest(repo) == tree_digest(expected)


def test_failure_in_patch_3_of_4_rolls_back_patches_1_and_2(tmp_path, scratch):
    repo = make_repo(tmp_path / "repo", BASE)
    series = load(make_series(tmp_path / "patches", "comp", "s", four_patches(scratch)))
    write_files(repo, {"src/b.txt": edit(B, b"line 6 of b\n", b"line 6 drifted\n")})
    before = tree_digest(repo)

    with pytest.raises(patches.PatchConflict) as info:
        patches.apply(series, repo)

    assert tree_digest(repo) == before
    assert [r.action for r in info.value.results] == ["apply", "apply", "conflict"]
    assert not any(r.written for r in info.value.results)
    assert "Patch 0003-change-3.patch" in str(info.value)
    assert git(repo, "status", "--porcelain").stdout.decode().split() == ["M", "src/b.txt"]


def test_partly_applied_patch_is_reported_as_partly_applied(tmp_path, scratch):
    a_both = edit(
        edit(A, b"line 3 of a\n", b"line 3 of a, patched\n"),
        b"line 20 of a\n",
        b"line 20 of a, patched\n",
    )
    patch = diff_of(scratch, BASE, {"src/a.txt": a_both})
    repo = make_repo(tmp_path / "repo", BASE)
    write_files(repo, {"src/a.txt": edit(A, b"line 3 of a\n", b"line 3 of a, patched\n")})
    series = load(make_series(tmp_path / "patches", "comp", "s", [patch]))

    with pytest.raises(patches.PatchConflict) as info:
        patches.apply(series, repo)

    assert "partly applied" in str(info.value)
    assert "hunk #1" in str(info.value)


def test_new_deleted_and_executable_files(tmp_path, scratch):
    base = {**BASE, "old/gone.txt": b"to be deleted\n"}
    step = {"old/gone.txt": None, "new/deep/added.txt": b"fresh\n", "new/run.sh": b"#!/bin/sh\n"}
    repo = make_repo(tmp_path / "repo", base)
    expected = make_repo(scratch / "exec", base)
    write_files(expected, step)
    os.chmod(expected / "new/run.sh", 0o755)
    git(expected, "add", "-A")
    patch = git(expected, "diff", "--cached").stdout
    assert b"new file mode 100755" in patch and b"deleted file mode" in patch
    series = load(make_series(tmp_path / "patches", "comp", "s", [patch]))

    patches.apply(series, repo)

    assert not (repo / "old").exists()  # an emptied folder goes, as with git apply
    assert (repo / "new/deep/added.txt").read_bytes() == b"fresh\n"
    assert os.stat(repo / "new/run.sh").st_mode & stat.S_IXUSR
    assert tree_digest(repo) == tree_digest(expected)
    assert [r.action for r in patches.apply(series, repo)] == ["skip"]
    assert [r.state for r in patches.status(series, repo)] == [patches.APPLIED]


def test_crlf_files_keep_their_line_endings(tmp_path, scratch):
    crlf = b"".join(b"row %d\r\n" % i for i in range(1, 12))
    patched = edit(crlf, b"row 6\r\n", b"row 6, patched\r\n")
    patch = diff_of(scratch, {"win.txt": crlf}, {"win.txt": patched})
    assert b"\r\n" in patch
    series = load(make_series(tmp_path / "patches", "comp", "s", [patch]))
    for tree in (make_repo(tmp_path / "repo", {"win.txt": crlf}), tmp_path / "plain"):
        write_files(tree, {"win.txt": crlf})

        patches.apply(series, tree)

        assert (tree / "win.txt").read_bytes() == patched
        assert [r.action for r in patches.apply(series, tree)] == ["skip"]


def test_missing_newline_at_end_of_file(tmp_path, scratch):
    before, after = b"one\ntwo\nthree", b"one\ntwo\nthree\nfour"
    patch = diff_of(scratch, {"f.txt": before}, {"f.txt": after})
    assert b"\\ No newline at end of file" in patch
    tree = tmp_path / "tree"
    write_files(tree, {"f.txt": before})
    series = load(make_series(tmp_path / "patches", "comp", "s", [patch]))

    patches.apply(series, tree)

    assert (tree / "f.txt").read_bytes() == after
    assert [r.action for r in patches.check(series, tree)] == ["skip"]


def test_plain_tree_from_a_tarball_without_git(tmp_path, scratch):
    repo = make_repo(tmp_path / "repo", BASE)
    archive = tmp_path / "src.tar"
    with open(archive, "wb") as fh:
        fh.write(git(repo, "archive", "--format=tar", "--prefix=src-1.0/", "HEAD").stdout)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "unpacked")
    tree = tmp_path / "unpacked" / "src-1.0"
    assert not (tree / ".git").exists()
    series = load(make_series(tmp_path / "patches", "comp", "s", four_patches(scratch)))

    patches.apply(series, tree)
    patches.apply(series, repo)

    assert tree_digest(tree) == tree_digest(repo)


def test_plain_tree_nested_in_an_unrelated_git_repo(tmp_path, scratch):
    outer = make_repo(tmp_path / "outer", {"README": b"outer\n"})
    tree = outer / "vendor" / "src"
    write_files(tree, BASE)
    series = load(make_series(tmp_path / "patches", "comp", "s", four_patches(scratch)))
    # Plain `git apply` there finds the outer repository and skips every file, exit 0.
    plain = git(tree, "apply", "-v", str(series[0].patches[0].path))
    assert plain.returncode == 0 and b"Skipped patch 'src/a.txt'" in plain.stderr
    assert (tree / "src/a.txt").read_bytes() == A

    results = patches.apply(series, tree)

    assert [r.action for r in results] == ["apply"] * 4
    assert b"line 3 of a, patched" in (tree / "src/a.txt").read_bytes()


def test_format_patch_output_with_header_and_signature(tmp_path, scratch):
    patch = diff_of(
        scratch, BASE, {"src/a.txt": edit(A, b"line 9 of a\n", b"line 9 of a, patched\n")}, True
    )
    assert patch.startswith(b"From ") and b"\n-- \n" in patch
    tree = tmp_path / "tree"
    write_files(tree, BASE)

    patches.apply(load(make_series(tmp_path / "patches", "comp", "s", [patch])), tree)

    assert b"line 9 of a, patched" in (tree / "src/a.txt").read_bytes()


def test_a_series_for_another_component_is_refused(tmp_path, scratch):
    folder = make_series(tmp_path / "patches", "pytorch", "s", four_patches(scratch))
    tree = tmp_path / "tree"
    write_files(tree, BASE)
    before = tree_digest(tree)

    with pytest.raises(patches.PatchError, match="is for component 'pytorch'.*not 'flash-att"):
        patches.load_series(folder, component="flash-attention")
    with pytest.raises(patches.PatchError, match="wrong source tree"):
        patches.apply([patches.load_series(folder)], tree, component="flash-attention")
    assert tree_digest(tree) == before


def test_status_reports_a_conflict_without_raising(tmp_path, scratch):
    repo = make_repo(tmp_path / "repo", BASE)
    series = load(make_series(tmp_path / "patches", "comp", "s", four_patches(scratch)))
    git(repo, "apply", str(series[0].patches[0].path))
    write_files(repo, {"src/b.txt": b"rewritten\n"})

    states = [r.state for r in patches.status(series, repo)]

    assert states == [patches.APPLIED, patches.PENDING, patches.CONFLICT, patches.CONFLICT]


@pytest.mark.parametrize(
    ("state", "verdict"),
    [
        ("pristine", patches.PENDING),
        ("applied", patches.APPLIED),
        ("drifted", patches.CONFLICT),
        ("partly applied", patches.CONFLICT),
    ],
)
def test_verdicts_agree_with_git_apply_check(tmp_path, scratch, state, verdict):
    a2 = edit(
        edit(A, b"line 3 of a\n", b"line 3 of a, patched\n"),
        b"line 25 of a\n",
        b"line 25 of a, patched\n",
    )
    patch = diff_of(scratch, BASE, {"src/a.txt": a2})
    content = {
        "pristine": A,
        "applied": a2,
        "drifted": edit(A, b"line 24 of a\n", b"drift\n"),
        "partly applied": edit(A, b"line 3 of a\n", b"line 3 of a, patched\n"),
    }[state]
    repo = make_repo(tmp_path / "repo", {**BASE, "src/a.txt": content})
    folder = make_series(tmp_path / "patches", "comp", "s", [patch])
    p = str(folder / "0001-change-1.patch")
    forward = git(repo, "apply", "--check", p, check=False).returncode == 0
    reverse = git(repo, "apply", "-R", "--check", p, check=False).returncode == 0
    git_verdict = patches.APPLIED if reverse else patches.PENDING if forward else patches.CONFLICT

    assert git_verdict == verdict
    assert [r.state for r in patches.status(load(folder), repo)] == [verdict]


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (lambda f, m: m.pop("links"), "missing field"),
        (lambda f, m: m.update(colour="red"), "unknown field"),
        (lambda f, m: m["checked_against"].clear(), "checked_against must name exactly"),
        (lambda f, m: (f / "0001-change-1.patch").rename(f / "fix.diff"), "not named NNNN-name"),
        (lambda f, m: m.update(upstream="https://x"), "field upstream must be"),
        (lambda f, m: m.update(links="https://x"), "field links must be"),
        (lambda f, m: (f / "0002-x.patch").write_bytes(b"not a diff\n"), "cannot read it"),
        (lambda f, m: (f / "0002-x.patch").write_bytes(CORRUPT), "cannot read it.*corrupt"),
        (lambda f, m: (f / "0002-x.patch").write_bytes(ESCAPE), "outside the tree"),
        (lambda f, m: (f / "0002-x.patch").write_bytes(INTO_GIT), "outside the tree"),
        (lambda f, m: (f / "0002-x.patch").write_bytes(SUBMODULE), "submodule bumps"),
        (lambda f, m: (f / "0002-x.patch").write_bytes(RENAME), "renames"),
    ],
    ids=[
        *("missing", "unknown", "unchecked", "badname", "upstream", "links", "notdiff"),
        *("corrupt", "escape", "into-git", "submodule", "rename"),
    ],
)
def test_bad_series_folders_are_clear_errors(tmp_path, scratch, mutate, error):
    folder = make_series(tmp_path / "patches", "comp", "s", four_patches(scratch)[:1])
    meta = json.loads((folder / "series.json").read_text())
    mutate(folder, meta)
    if (folder / "0002-x.patch").exists():
        meta["checked_against"]["0002-x.patch"] = "0" * 40
    (folder / "series.json").write_text(json.dumps(meta))

    with pytest.raises(patches.PatchError, match=error):
        patches.load_series(folder)


def test_a_file_where_a_patch_needs_a_folder_is_a_conflict_and_nothing_is_written(
    tmp_path, scratch
):
    # git apply checks content before writing, but only finds out that zz is a file while it
    # writes zz/new.txt, after src/a.txt; the replay in a scratch copy meets it first.
    diffs = chain(
        scratch,
        BASE,
        [{"src/a.txt": edit(A, b"line 3 of a\n", b"3!\n")}, {"zz/new.txt": b"n\n"}],
    )
    tree = tmp_path / "tree"
    write_files(tree, {**BASE, "zz": b"a file, not a folder\n"})
    series = load(make_series(tmp_path / "patches", "comp", "s", diffs))
    before = tree_digest(tree)

    with pytest.raises(
        patches.PatchConflict, match="(?s)0002-change-2.patch.*unable to write file 'zz/new.txt'"
    ):
        patches.apply(series, tree)

    assert tree_digest(tree) == before


def test_patches_editing_the_same_lines_are_skipped_together_once_applied(tmp_path, scratch):
    # Patch 2 rewrites the line patch 1 adds: neither reverse-applies on its own on the
    # patched tree, and `git apply -R` of both in one input does not chain them.
    a1 = edit(A, b"line 3 of a\n", b"line 3 of a, once\n")
    diffs = chain(scratch, BASE, [{"src/a.txt": a1}, {"src/a.txt": edit(a1, b"once", b"twice")}])
    repo = make_repo(tmp_path / "repo", BASE)
    series = load(make_series(tmp_path / "patches", "comp", "s", diffs))

    assert [r.action for r in patches.apply(series, repo)] == ["apply", "apply"]
    assert b"line 3 of a, twice\n" in (repo / "src/a.txt").read_bytes()
    assert [r.action for r in patches.apply(series, repo)] == ["skip", "skip"]
    first = str(series[0].patches[0].path)
    assert git(repo, "apply", "-R", "--check", first, check=False).returncode != 0


def test_a_later_patch_without_the_earlier_one_is_a_conflict_not_a_skip(tmp_path, scratch):
    repo = make_repo(tmp_path / "repo", BASE)
    folder = make_series(tmp_path / "patches", "comp", "s", four_patches(scratch)[1:3])
    git(repo, "apply", str(folder / "0002-change-2.patch"))  # b.txt; 0001 (a.txt) is not in
    before = tree_digest(repo)

    states = [r.state for r in patches.status(load(folder), repo)]
    with pytest.raises(patches.PatchConflict, match="already in the tree, but an earlier"):
        patches.apply(load(folder), repo)

    assert states == [patches.PENDING, patches.CONFLICT]
    assert tree_digest(repo) == before


def test_config_attributes_and_git_env_around_the_tree_change_nothing(
    tmp_path, scratch, monkeypatch
):
    # A repository with autocrlf and eol attributes, a user config and attributes file, and
    # GIT_DIR naming another repository: git apply left to them would write CRLF (or skip).
    lf = b"".join(b"row %d\n" % i for i in range(1, 12))
    patched = edit(lf, b"row 6\n", b"row 6, patched \n")  # trailing space: whitespace rules
    patch = diff_of(scratch, {"t.txt": lf}, {"t.txt": patched})
    repo = make_repo(tmp_path / "repo", {"t.txt": lf, ".gitattributes": b"* text eol=crlf\n"})
    git(repo, "config", "core.autocrlf", "true")
    git(repo, "config", "apply.whitespace", "error")
    home = tmp_path / "home"
    write_files(
        home,
        {
            ".gitconfig": b"[core]\n\tautocrlf = true\n[apply]\n\twhitespace = error\n",
            ".config/git/attributes": b"* text eol=crlf\n",
        },
    )
    other = make_repo(tmp_path / "other", {"x": b"x\n"})
    for key, value in {
        "HOME": home,
        "XDG_CONFIG_HOME": home / ".config",
        "GIT_DIR": other / ".git",
    }.items():
        monkeypatch.setenv(key, str(value))
    folder = make_series(tmp_path / "patches", "comp", "s", [patch])
    assert git(
        repo, "apply", "--check", str(folder / "0001-change-1.patch"), check=False, isolated=False
    ).returncode

    assert [r.action for r in patches.apply(load(folder), repo)] == ["apply"]

    assert (repo / "t.txt").read_bytes() == patched
    assert [r.action for r in patches.apply(load(folder), repo)] == ["skip"]


def test_no_git_on_path_is_a_clear_error(tmp_path, scratch, monkeypatch):
    folder = make_series(tmp_path / "patches", "comp", "s", four_patches(scratch)[:1])
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))

    with pytest.raises(patches.PatchError, match="git is not on PATH"):
        patches.load_series(folder)


CORRUPT = b"--- a/src/a.txt\n+++ b/src/a.txt\n@@ -1,3 +1,3 @@\n line 1 of a\n-line 2 of a\n"
ESCAPE = b"--- a/x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n"
INTO_GIT = b"--- a/.git/config\n+++ b/.git/config\n@@ -1 +1 @@\n-a\n+b\n"
SUBMODULE = (
    b"diff --git a/third_party/ck b/third_party/ck\n"
    b"index 1111111..2222222 160000\n"
    b"--- a/third_party/ck\n+++ b/third_party/ck\n"
    b"@@ -1 +1 @@\n-Subproject commit 1111111\n+Subproject commit 2222222\n"
)
RENAME = b"diff --git a/a b/b\nsimilarity index 100%\nrename from a\nrename to b\n"
BLOCK_OLD = [b"ctx 1\n", b"ctx 2\n", b"ctx 3\n", b"v = 2\n", b"ctx 4\n", b"ctx 5\n", b"ctx 6\n"]
BLOCK_NEW = [line.replace(b"v = 2", b"v = 3") for line in BLOCK_OLD]


def fill(tag: str, n: int) -> list[bytes]:
    return [f"{tag} filler {i}\n".encode() for i in range(n)]


def test_a_patch_whose_result_also_occurs_elsewhere_is_applied_not_skipped(tmp_path, scratch):
    # The "new" text already exists further down, so the reverse patch fits there too;
    # the forward fit lands exactly where the patch says, so it wins.
    before = b"".join(fill("a", 9) + BLOCK_OLD + fill("b", 20) + BLOCK_NEW)
    after = before.replace(b"v = 2", b"v = 3", 1)
    patch = diff_of(scratch, {"f.txt": before}, {"f.txt": after})
    tree = tmp_path / "tree"
    write_files(tree, {"f.txt": before})
    series = load(make_series(tmp_path / "patches", "comp", "s", [patch]))

    assert [r.action for r in patches.apply(series, tree)] == ["apply"]
    assert (tree / "f.txt").read_bytes() == after
    assert [r.action for r in patches.apply(series, tree)] == ["skip"]


def test_a_patch_that_fits_both_ways_equally_is_a_conflict(tmp_path, scratch):
    patch = diff_of(
        scratch,
        {"f.txt": b"".join(fill("a", 9) + BLOCK_OLD + fill("b", 5))},
        {"f.txt": b"".join(fill("a", 9) + BLOCK_NEW + fill("b", 5))},
    )
    # The new block sits 5 lines above where the patch expects, the old one 5 lines below.
    tree = tmp_path / "tree"
    content = b"".join(fill("x", 4) + BLOCK_NEW + fill("y", 3) + BLOCK_OLD + fill("z", 5))
    write_files(tree, {"f.txt": content})
    series = load(make_series(tmp_path / "patches", "comp", "s", [patch]))

    with pytest.raises(patches.PatchConflict, match="both applies and reverse-applies"):
        patches.apply(series, tree)
    assert (tree / "f.txt").read_bytes() == content


def test_a_hard_linked_copy_of_a_patched_file_is_left_alone(tmp_path, scratch):
    tree, other = tmp_path / "tree", tmp_path / "pristine-copy"
    write_files(tree, BASE)
    other.mkdir()
    os.link(tree / "src/a.txt", other / "a.txt")
    series = load(make_series(tmp_path / "patches", "comp", "s", four_patches(scratch)[:1]))

    patches.apply(series, tree)

    assert (other / "a.txt").read_bytes() == A
    assert (tree / "src/a.txt").read_bytes() != A
