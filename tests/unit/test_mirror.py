"""The mirror's pure parts (what a plan fetches, the folder's index and checks, what a build's
arguments become) and its server with real git and pip-style requests on loopback."""

from __future__ import annotations

import hashlib
import subprocess
import urllib.request
from pathlib import Path

import pytest

from attnforge.engine import BuildRequest
from attnforge.errors import UserError
from attnforge.mirror.gather import mirror_repo
from attnforge.mirror.layout import (
    Manifest,
    damaged_files,
    missing_pins,
    project_pages,
    repo_path,
    write_index,
)
from attnforge.mirror.needs import layer_needs, pip_requirements, replacements
from attnforge.mirror.serve import served
from attnforge.mirror.use import REHEARSAL_ARG, REHEARSAL_LABEL, Session, check
from attnforge.plan import Options, resolve
from attnforge.recipes import load_recipes
from tests.conftest import REPO, run_invoke

FA_REPO = "https://github.com/ROCm/flash-attention.git"


def plan_of(arch: str, stack: str, **kw):
    return resolve(load_recipes(REPO), arch, stack, Options(base_image="img", **kw))


def needs_of(plan) -> dict:
    return {s.layer: layer_needs(REPO, s) for s in plan.steps if s.status == "build"}


def test_the_default_stack_fetches_its_pins_as_the_dockerfiles_name_them():
    needs = needs_of(plan_of("gfx1151", "default"))
    assert needs["rocm-sdk"].requirements == ["rocm[libraries,devel,device-gfx1151]==10.1.0"]
    assert needs["rocm-sdk"].index == "https://stable.repo.amd.com/rocm/whl-next/"
    # ${rocm_version} (from `rocm-sdk version`) is the rocm-sdk layer's pin
    assert needs["pytorch-wheels"].requirements == [
        "rocm[libraries,devel,device-gfx1151]==10.1.0",
        "torch[device-gfx1151]==2.14.0+rocm10.1.0",
        "torchvision[device-gfx1151]==0.29.0a0+rocm10.1.0",
        "torchaudio==2.11.0.3+rocm10.1.0",
    ]
    fa = needs["flash-attention"]
    assert fa.requirements == ["einops==0.8.1", "packaging==25.0", "ninja==1.13.0", "psutil==7.0.0"]
    assert fa.repo == (FA_REPO, "16d5154aef39e627c4456c8d205e6985e1e67fdc")
    assert not needs["base"].requirements and not needs["validate"].requirements


def test_a_requirements_file_of_the_context_is_read_and_one_of_the_source_tree_is_said():
    apps = needs_of(plan_of("cpu", "cpu"))["apps"]
    lock = (REPO / "dockerfiles/scripts/apps-lock.txt").read_text()
    assert "transformers==" in lock and any(
        r.startswith("transformers==") for r in apps.requirements
    )
    source = needs_of(plan_of("gfx942", "source"))["pytorch-source"]
    assert any("requirements.txt" in s for s in source.unknown)
    assert any("triton==$(cat" in s for s in source.unknown)


def test_pip_lines_skip_options_paths_and_arrays():
    text = ('RUN pip install --find-links /wheelhouse "${index[@]}" -w /out "x==${V}" . \\\n'
            " && pip wheel third_party/triton -w /tmp/t && echo pip install-not\n")  # fmt: skip
    assert pip_requirements(text, {"V": "1.0"}) == (["x==1.0"], [])


def wheel(folder: Path, name: str, body: bytes = b"wheel") -> str:
    (folder / name).write_bytes(body)
    return hashlib.sha256(body).hexdigest()


def test_the_index_links_every_file_under_its_normalised_project_with_its_hash(tmp_path):
    files = {"typing_extensions-4.16.0-py3-none-any.whl": "ab" * 32,
             "torch-2.14.0+rocm10.1.0-cp312-cp312-linux_x86_64.whl": "cd" * 32}  # fmt: skip
    pages = project_pages(files)
    assert 'href="typing-extensions/"' in pages["index.html"]
    page = pages["torch/index.html"]
    assert (
        "../../files/torch-2.14.0+rocm10.1.0-cp312-cp312-linux_x86_64.whl#sha256=" + "cd" * 32
        in page
    )


def test_a_missing_pin_is_one_sentence_naming_it():
    manifest = Manifest(files={"torch-2.14.0+rocm10.1.0-cp312-cp312-linux_x86_64.whl": "0" * 64})
    reqs = {
        "pytorch-wheels": [
            "torch[device-gfx1151]==2.14.0+rocm10.1.0",
            "torchaudio==2.11.0.3+rocm10.1.0",
        ]
    }
    assert missing_pins(manifest, reqs) == [
        "layer pytorch-wheels pins torchaudio==2.11.0.3+rocm10.1.0, and the mirror has no wheel of it"
    ]
    # a +rocm7.x build is not the +rocm10.x pin (local labels are part of the version)
    other = Manifest(files={"torch-2.14.0+rocm7.14.0-cp312-cp312-linux_x86_64.whl": "0" * 64})
    assert missing_pins(other, {"l": ["torch==2.14.0+rocm10.1.0"]})


def test_a_damaged_or_missing_file_is_found_by_its_hash(tmp_path):
    (tmp_path / "files").mkdir()
    good = wheel(tmp_path / "files", "a-1.0-py3-none-any.whl")
    manifest = Manifest(files={"a-1.0-py3-none-any.whl": good, "b-1.0-py3-none-any.whl": good})
    assert damaged_files(tmp_path, manifest) == [
        "files/b-1.0-py3-none-any.whl is listed in manifest.json but missing"
    ]
    (tmp_path / "files/a-1.0-py3-none-any.whl").write_bytes(b"changed")
    assert "does not match its sha256" in damaged_files(tmp_path, manifest)[0]


def test_a_layer_names_what_the_mirror_replaces():
    plan = plan_of("gfx1151", "default")
    by_layer = {s.layer: {r.arg: r for r in replacements(s)} for s in plan.steps}
    fa = by_layer["flash-attention"]
    assert fa["SOURCE_REPO"].upstream == FA_REPO
    assert (
        fa["SOURCE_REPO"].mirror_path
        == "git/github.com/ROCm/flash-attention.git"
        == repo_path(FA_REPO)
    )
    assert fa["PIP_INDEX_URL"].mirror_path == "simple/"
    assert (
        by_layer["rocm-sdk"]["ROCM_INDEX_URL"].upstream
        == "https://stable.repo.amd.com/rocm/whl-next/"
    )


def test_a_rehearsal_mark_changes_every_layers_key():
    real, rehearsal = plan_of("gfx1151", "default"), plan_of("gfx1151", "default", rehearsal="abc")
    assert all(a.hash != b.hash for a, b in zip(real.steps, rehearsal.steps, strict=True))
    assert rehearsal.step("rocm-sdk").input.args[REHEARSAL_ARG] == "abc"


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def small_repo(path: Path) -> str:
    path.mkdir()
    git("init", "-q", cwd=path)
    (path / "setup.py").write_text("print('hi')\n")
    git("add", ".", cwd=path)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one", cwd=path)
    first = git("rev-parse", "HEAD", cwd=path)
    (path / "setup.py").write_text("print('two')\n")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two", cwd=path)
    return first  # not a branch tip: fetched by id, as the Dockerfiles do


def test_the_server_gives_pip_its_pages_and_git_a_shallow_fetch_by_commit(tmp_path):
    mirror = tmp_path / "m"
    (mirror / "files").mkdir(parents=True)
    manifest = Manifest(
        files={"a-1.0-py3-none-any.whl": wheel(mirror / "files", "a-1.0-py3-none-any.whl")}
    )
    write_index(mirror, manifest)
    commit = small_repo(tmp_path / "src")
    with (tmp_path / "log").open("w") as log:
        mirror_repo(FA_REPO, commit, str(tmp_path / "src"), mirror, log)
    with served(mirror) as base:
        page = urllib.request.urlopen(f"{base}/simple/a/").read().decode()
        assert "../../files/a-1.0-py3-none-any.whl#sha256=" in page
        out = tmp_path / "out"
        git("init", "-q", str(out))
        git("fetch", "-q", "--depth", "1", f"{base}/{repo_path(FA_REPO)}", commit, cwd=out)
        git("checkout", "-q", "FETCH_HEAD", cwd=out)
    assert (out / "setup.py").read_text() == "print('hi')\n"
    assert git("rev-parse", "HEAD", cwd=out) == commit


def test_the_check_names_each_missing_pin_and_commit(tmp_path):
    plan = plan_of("gfx1151", "default")
    mirror = tmp_path / "m"
    (mirror / "files").mkdir(parents=True)
    write_index(
        mirror,
        Manifest(
            files={
                "einops-0.8.1-py3-none-any.whl": wheel(
                    mirror / "files", "einops-0.8.1-py3-none-any.whl"
                )
            }
        ),
    )
    with pytest.raises(UserError) as err:
        check(mirror, plan, REPO)
    message = err.value.message
    assert (
        "layer rocm-sdk pins rocm[libraries,devel,device-gfx1151]==10.1.0, and the mirror has no wheel of it"
        in message
    )
    assert (
        f"layer flash-attention needs {FA_REPO} at 16d5154aef39e627c4456c8d205e6985e1e67fdc"
        in message
    )
    assert "einops" not in message


def test_a_mirror_build_request_reaches_the_mirror_and_nothing_else(tmp_path):
    plan = plan_of("cpu", "cpu", only="torch-cpu", rehearsal="r1")
    mirror = tmp_path / "m"
    (mirror / "files").mkdir(parents=True)
    name = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    write_index(
        mirror, Manifest(files={name: wheel(mirror / "files", name)}, rehearsal={"why": "t"})
    )
    req = BuildRequest(context=tmp_path, dockerfile=tmp_path / "D", build_args={"TORCH_INDEX_URL": "u"},
                       labels={}, iidfile=tmp_path / "iid")  # fmt: skip
    session = Session(mirror, plan, REPO)
    try:
        got = session.requests(plan, {"torch-cpu": req, "base": req})
    finally:
        session.close()
    torch = got["torch-cpu"]
    assert torch.network == "host" and "--network" in torch.argv(["docker"], "classic")
    assert (
        torch.build_args["TORCH_INDEX_URL"]
        == torch.build_args["PIP_INDEX_URL"]
        == f"{session.base}/simple/"
    )
    assert (
        torch.build_args["HTTPS_PROXY"] == "http://127.0.0.1:9"
        and "127.0.0.1" in torch.build_args["NO_PROXY"]
    )
    assert torch.labels[REHEARSAL_LABEL] == "r1" == got["base"].labels[REHEARSAL_LABEL]
    assert got["base"].network is None  # the base layer fetches nothing from pip or git


def test_build_refuses_a_wheelhouse_beside_a_mirror_and_a_folder_without_manifest(tmp_path):
    env_tree = REPO
    both = run_invoke(env_tree, "build", "--arch", "cpu", "--dry-run", "--mirror", str(tmp_path),
                      "--wheelhouse", str(tmp_path))  # fmt: skip
    assert (
        both.returncode != 0
        and "--wheelhouse and --mirror exclude each other" in both.stderr + both.stdout
    )
    none = run_invoke(env_tree, "build", "--arch", "cpu", "--dry-run", "--mirror", str(tmp_path))
    assert (
        none.returncode != 0
        and f"--mirror {tmp_path}: no manifest.json there" in none.stderr + none.stdout
    )


def test_every_not_rehearsable_check_is_a_smoke_check_of_an_amd_layer():
    """The classification names real checks: a renamed check would otherwise run unclassified."""
    from attnforge.mirror.rehearsal import NOT_REHEARSABLE, STOP_POINTS, split_smoke

    assert set(STOP_POINTS) <= set(load_recipes(REPO).layers)

    names = {c.name for layer in load_recipes(REPO).layers.values() for c in layer.smoke}
    assert set(NOT_REHEARSABLE) <= names
    seen = set()
    for stack in ("default", "pytorch-org"):
        plan, left = split_smoke(plan_of("gfx1151", stack))
        seen |= {u.check for u in left}
        assert not any(c["name"] in NOT_REHEARSABLE for s in plan.steps for c in s.smoke)
    assert seen == set(NOT_REHEARSABLE)


def test_a_real_mirror_keeps_the_cache_keys_and_a_rehearsal_mirror_changes_them(tmp_path):
    """The same pins from a mirror make the same image: a real mirror leaves every key alone (and
    the dry run says what it replaces); a rehearsal mirror's stand-ins never share a key."""
    import json as jsonlib

    def keys(*extra: str) -> dict[str, str]:
        proc = run_invoke(REPO, "build", "--arch", "gfx1151", "--dry-run", "--json", "--base-image", "img",
                          *extra)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        return {s["layer"]: s["hash"] for s in jsonlib.loads(proc.stdout)["steps"]}

    real, rehearsal = tmp_path / "real", tmp_path / "rehearsal"
    write_index(real, Manifest())
    write_index(rehearsal, Manifest(rehearsal={"why": "test"}))
    plain = keys()
    assert keys("--mirror", str(real)) == plain
    changed = keys("--mirror", str(rehearsal))
    assert all(changed[layer] != plain[layer] for layer in plain)
    shown = run_invoke(REPO, "build", "--arch", "gfx1151", "--dry-run", "--base-image", "img",
                       "--mirror", str(real), "--explain", "flash-attention")  # fmt: skip
    said = " ".join(shown.stdout.split())
    assert (
        f"flash-attention: SOURCE_REPO {FA_REPO} -> {real}/git/github.com/ROCm/flash-attention.git"
        in said
    )
    assert "rocm-sdk:" not in said  # --explain shows that layer's lines only


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--add", "/nonexistent/wheels"], "--add /nonexistent/wheels: no such file or folder"),
        (
            ["--add-repo", "https://example.org/x.git"],
            "--add-repo https://example.org/x.git: give URL=PATH",
        ),
        ([], None),
    ],
)
def test_invoke_mirror_says_what_is_wrong_with_its_options_in_one_sentence(tmp_path, args, said):
    to = [] if said is None else ["--to", str(tmp_path / "m")]
    proc = run_invoke(REPO, "mirror", "--arch", "cpu", *to, *args)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0 and "Traceback" not in out
    assert (said or "--to DIR is needed: the folder the mirror is written to") in out
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.partial").exists()
