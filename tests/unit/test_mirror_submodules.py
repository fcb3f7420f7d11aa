"""Submodules in a mirror: every submodule a pinned commit pins (recursively) is mirrored at its
gitlink commit, checked before a build, and fetched from the mirror by the layer's own
`git submodule update`, with real git repositories and the mirror served over loopback."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from attnforge.errors import UserError
from attnforge.mirror import gather
from attnforge.mirror.layout import Manifest, repo_path, write_index
from attnforge.mirror.needs import LayerNeeds, replacements, submodule_rewrite
from attnforge.mirror.serve import served
from attnforge.mirror.submodules import resolve_url, submodules_at, walk
from attnforge.mirror.use import check
from attnforge.plan import Options, parse_overrides, resolve
from attnforge.recipes import load_recipes
from tests.conftest import REPO

DAO = "https://github.com/Dao-AILab/flash-attention.git"
AITER = "https://github.com/ROCm/aiter.git"
CK = "https://github.com/ROCm/composable_kernel.git"
ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip


def git(*args: str, cwd: Path | None = None, env: dict | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **ENV, **(env or {})})  # fmt: skip
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout.strip()


def repo(path: Path, files: dict[str, str]) -> str:
    path.mkdir(parents=True)
    git("init", "-q", cwd=path)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git("add", "-A", cwd=path)
    git("commit", "-qm", "one", cwd=path)
    return git("rev-parse", "HEAD", cwd=path)


def with_submodule(parent: Path, sub_path: str, url: str, commit: str) -> str:
    """Commit a gitlink at ``sub_path`` pinning ``commit`` and a .gitmodules naming ``url``, as
    `git submodule add` leaves them (without cloning anything)."""
    git("update-index", "--add", "--cacheinfo", f"160000,{commit},{sub_path}", cwd=parent)
    git("config", "-f", ".gitmodules", f"submodule.{sub_path}.path", sub_path, cwd=parent)
    git("config", "-f", ".gitmodules", f"submodule.{sub_path}.url", url, cwd=parent)
    git("add", ".gitmodules", cwd=parent)
    git("commit", "-qm", f"submodule {sub_path}", cwd=parent)
    return git("rev-parse", "HEAD", cwd=parent)


@pytest.fixture
def trees(tmp_path):
    """Dao's stand-in with third_party/aiter (a relative URL), whose tree pins CK (nested)."""
    ck = repo(tmp_path / "ck", {"include/ck.hpp": "// ck\n"})
    repo(tmp_path / "aiter", {"aiter/__init__.py": "# aiter\n"})
    aiter = with_submodule(tmp_path / "aiter", "3rdparty/composable_kernel", CK, ck)
    repo(tmp_path / "dao", {"setup.py": "print('dao')\n"})
    dao = with_submodule(tmp_path / "dao", "third_party/aiter", "../../ROCm/aiter.git", aiter)
    local = {DAO: str(tmp_path / "dao"), AITER.removesuffix(".git"): str(tmp_path / "aiter"),
             CK: str(tmp_path / "ck")}  # fmt: skip
    return tmp_path, {"dao": dao, "aiter": aiter, "ck": ck}, local


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("../../ROCm/aiter.git", AITER),
        ("../cutlass.git", "https://github.com/Dao-AILab/cutlass.git"),
        ("./sub", "https://github.com/Dao-AILab/flash-attention.git/sub"),
        (CK, CK),
    ],
)
def test_a_relative_url_is_resolved_against_the_parents_as_git_does(url, want):
    assert resolve_url(DAO, url) == want


def test_the_submodules_of_a_commit_are_read_from_its_objects(trees):
    tmp, commits, _ = trees
    (sub,) = submodules_at(tmp / "dao", commits["dao"], DAO)
    assert (sub.path, sub.url, sub.commit) == ("third_party/aiter", AITER, commits["aiter"])
    first = git("rev-list", "--max-parents=0", "HEAD", cwd=tmp / "dao")
    assert submodules_at(tmp / "dao", first, DAO) == []  # no .gitmodules at that commit
    nested = list(walk(DAO, commits["dao"], {DAO: tmp / "dao", AITER: tmp / "aiter"}.get))
    assert [(s.path, s.commit) for s in nested] == [
        ("third_party/aiter", commits["aiter"]), ("3rdparty/composable_kernel", commits["ck"])
    ]  # fmt: skip


def test_a_mirror_holds_every_submodule_and_a_layer_fetches_them_from_it(trees):
    tmp, commits, local = trees
    mirror = tmp / "mirror"
    with (tmp / "log").open("w") as log:
        manifest = gather.assemble(
            mirror, [LayerNeeds("flash-attention-dao", repo=(DAO, commits["dao"]))],
            local_repos=local, log=log,
        )  # fmt: skip
    assert {u: e["commits"] for u, e in manifest.repos.items()} == {
        DAO: [commits["dao"]], AITER: [commits["aiter"]], CK: [commits["ck"]]
    }  # fmt: skip
    assert f"submodule third_party/aiter of {DAO}" in (tmp / "log").read_text()
    # What the Dockerfile runs, with the build args the mirror gives a layer that clones, and
    # every other URL unreachable (a proxy that refuses, as builds from a mirror get).
    out = tmp / "out"
    with served(mirror) as base:
        env = {**submodule_rewrite(f"{base}/git/"), "HTTPS_PROXY": "http://127.0.0.1:9",
               "NO_PROXY": "127.0.0.1"}  # fmt: skip
        git("init", "-q", str(out))
        # as the Dockerfiles fetch: through the remote origin, which relative URLs resolve against
        git("remote", "add", "origin", f"{base}/{repo_path(DAO)}", cwd=out)
        git("fetch", "-q", "--depth", "1", "origin", commits["dao"], cwd=out)
        git("checkout", "-q", "FETCH_HEAD", cwd=out)
        git("submodule", "update", "-q", "--init", "--recursive", "--depth", "1", cwd=out, env=env)
    assert (out / "third_party/aiter/aiter/__init__.py").read_text() == "# aiter\n"
    ck = out / "third_party/aiter/3rdparty/composable_kernel"
    assert (ck / "include/ck.hpp").is_file()
    assert git("rev-parse", "HEAD", cwd=ck) == commits["ck"]


def test_a_submodule_the_source_lacks_is_one_sentence_naming_who_pins_it(trees):
    tmp, commits, local = trees
    del local[CK]  # CK's URL is unreachable here: aiter's submodule cannot be mirrored
    local[CK] = str(tmp / "aiter")  # a repository without CK's commit stands in for it
    with (tmp / "log").open("w") as log, pytest.raises(UserError) as err:
        gather.assemble(tmp / "mirror", [LayerNeeds("l", repo=(DAO, commits["dao"]))],
                        local_repos=local, log=log)  # fmt: skip
    assert err.value.message == (
        f"{tmp / 'aiter'} has no commit {commits['ck']}, which {AITER} (its submodule "
        f"3rdparty/composable_kernel) pins for {CK}"
    )
    assert not (tmp / "mirror").exists()  # nothing half-written where the mirror goes


def test_the_check_before_a_build_names_a_missing_submodule(trees):
    tmp, commits, local = trees
    recipes = load_recipes(REPO)
    sets = parse_overrides([f"flash-attention-dao.SOURCE_REF={commits['dao']}"], recipes)
    plan = resolve(recipes, "gfx1151", "dao", Options(overrides=sets))
    mirror = tmp / "mirror"
    with (tmp / "log").open("w") as log:
        gather.assemble(mirror, [LayerNeeds("x", repo=(DAO, commits["dao"]))], local_repos=local,
                        log=log)  # fmt: skip
    # the mirror lost aiter: dao's commit is there, its submodule is not
    shutil.rmtree(mirror / repo_path(AITER))
    write_index(mirror, Manifest.load(mirror))
    with pytest.raises(UserError) as err:
        check(mirror, plan, REPO)
    assert (
        f"layer flash-attention-dao needs {AITER} at {commits['aiter']} (the submodule "
        f"third_party/aiter of {DAO}), and the mirror lacks it"
    ) in err.value.message


def test_a_layer_that_clones_shows_the_submodule_rewrite_and_declares_its_args():
    plan = resolve(load_recipes(REPO), "gfx1151", "dao", Options())
    for step in plan.steps:
        shown = {r.arg: r for r in replacements(step)}
        if "SOURCE_REPO" not in step.args:
            assert "GIT_CONFIG (submodules)" not in shown
            continue
        assert (shown["GIT_CONFIG (submodules)"].upstream, shown["GIT_CONFIG (submodules)"]
                .mirror_path) == ("https://", "git/")  # fmt: skip
        text = (REPO / step.dockerfile).read_text()
        for arg in submodule_rewrite("x"):
            assert f"\nARG {arg}\n" in text, (step.dockerfile, arg)
