"""End to end on a real Docker engine: `invoke bisect` names the commit that broke a check.

A copy of the tree gets a test stack (base:minimal + a tiny layer) whose layer builds from a local
git repository made here: 9 commits, c0 good, c5 plants the failure the check finds, c6 does not
build (a skip). The bisector must name c5 in at most ceil(log2 8) + 1 probes, with the base layer
cached in every probe, and continue a bisect stopped after its first probe without redoing it.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from attnforge.bisection.search import BisectState, state_path
from tests.conftest import COPY_IGNORE, REPO
from tests.e2e.test_cpu_stack import BASE, CA_CERT, engine_ready, image_id, invoke  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAMESPACE = f"attnforge-bisect-{uuid.uuid4().hex[:8]}"
FIRST_BAD, UNBUILDABLE, COMMITS = 5, 6, 9
CHECK = "cmd:cd /opt/probe && python3 -c 'import probe, sys; sys.exit(0 if probe.ok() else 1)'"

DOCKERFILE = """\
# attnforge test layer: a source tree from a git repository sent as build context (as a bundle:
# a repository's empty folders, such as refs/, are not staged)
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG SOURCE_REPO
ARG SOURCE_REF
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN --mount=type=bind,source=.,target=/ctx \\
    git clone -q --no-checkout /ctx/bisect-src.bundle /opt/probe \\
 && git -C /opt/probe checkout -q "${SOURCE_REF}" \\
 && rm -rf /opt/probe/.git \\
 && if [ -e /opt/probe/BREAKS_THE_BUILD ]; then echo "this commit does not build" >&2; exit 1; fi
# the validation suite, and the repository's own check for it (check:probe.*)
COPY validate /opt/attnforge/validate
COPY contract /opt/attnforge/contract
ENV PYTHONPATH=/opt/attnforge VALIDATE_EXTRA_CHECKS=/opt/probe/checks.py
COPY attnforge-manifest.json /opt/attnforge/versions.json
"""

CHECKS_PY = """\
import sys

sys.path.insert(0, "/opt/probe")


def probe_ok(params, ctx):
    import probe

    if not probe.ok():
        return {"status": "fail", "message": "probe.ok() is False"}
    return {"status": "pass", "message": "probe.ok() holds"}


CHECKS = [{"id": "probe.ok", "func": "probe_ok", "title": "the planted module works"}]
"""

STACK = """
  bisect-test:
    description: invoke bisect's test stack, base plus a layer built from a local git repository
    arches: [cpu]
    base_image: debian:bookworm-slim
    local_base_image: attnforge-local/debian:bookworm
    layers: [base:minimal, bisect-probe]
"""


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", *args], cwd=cwd, check=True,
        capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


def make_history(work: Path) -> list[str]:
    """c0..c8; probe.ok() is False from c5 on; c6 alone carries BREAKS_THE_BUILD."""
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    shas = []
    for i in range(COMMITS):
        (work / "probe.py").write_text(f"def ok():\n    return {i < FIRST_BAD}\n")
        (work / "version.txt").write_text(f"{i}\n")
        (work / "checks.py").write_text(CHECKS_PY)
        marker = work / "BREAKS_THE_BUILD"
        if i == UNBUILDABLE:
            marker.write_text("planted\n")
        else:
            marker.unlink(missing_ok=True)
        git(work, "add", "-A")
        git(work, "commit", "-q", "-m", f"c{i}")
        shas.append(git(work, "rev-parse", "HEAD"))
    return shas


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, engine_ready):  # noqa: F811
    """A copy of the tree with the test stack, its layer and its repository; base is built (or
    found cached) before any probe."""
    tree = tmp_path_factory.mktemp("bisect") / "tree"
    shutil.copytree(REPO, tree, ignore=COPY_IGNORE)
    shas = make_history(tree.parent / "work")
    subprocess.run(["git", "clone", "-q", "--bare", str(tree.parent / "work"),
                    str(tree / "bisect-src.git")], check=True)  # fmt: skip
    subprocess.run(["git", "-C", str(tree / "bisect-src.git"), "bundle", "create", "-q",
                    str(tree / "bisect-src.bundle"), "--all"], check=True)  # fmt: skip
    (tree / "dockerfiles" / "bisect-probe.Dockerfile").write_text(DOCKERFILE)
    (tree / "recipes" / "layers" / "bisect-probe.yaml").write_text(
        "name: bisect-probe\n"
        "description: a tiny source tree from a local git repository (invoke bisect's test)\n"
        "dockerfile: dockerfiles/bisect-probe.Dockerfile\n"
        "follows: nothing upstream; a test layer\n"
        "needs: [python]\n"
        "arches: [cpu]\n"
        f"source: {{repo: 'file://{tree / 'bisect-src.git'}', ref: {shas[0]}}}\n"
        "context: [bisect-src.bundle, validate, contract]\n"
        "smoke:\n"
        "  - name: the probe module is there\n"
        "    python: \"import os; assert os.path.isfile('/opt/probe/probe.py')\"\n"
    )
    with (tree / "recipes" / "stacks.yaml").open("a") as fh:
        fh.write(STACK)
    common = ["--arch", "cpu", "--stack", "bisect-test", "--base-image", BASE, "--namespace",
              NAMESPACE] + (["--ca-cert", CA_CERT] if Path(CA_CERT).is_file() else [])  # fmt: skip
    _seed_base(tree, common)
    proc = invoke(tree, "build", *common, "--only", "base", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield tree, shas, common
    tags = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                          capture_output=True, text=True).stdout.split()  # fmt: skip
    mine = [t for t in tags if NAMESPACE in t]
    if mine:
        subprocess.run(["docker", "rmi", "-f", *mine], capture_output=True)


def _seed_base(tree: Path, common: list[str]) -> None:
    """The base layer's content tag is the same in any namespace: when the default namespace
    already has that very image, tag it here instead of building it again."""
    proc = invoke(tree, "build", *common, "--only", "base", "--dry-run", "--json")
    if proc.returncode != 0:
        return
    tag = json.loads(proc.stdout)["steps"][0]["tag"]
    there = "attnforge/" + tag.split("/", 1)[1]
    if image_id(there):
        subprocess.run(["docker", "tag", there, tag], check=True)


def bisect(tree: Path, shas: list[str], common: list[str], *extra: str, check: str = CHECK):
    return invoke(tree, "bisect", *common, "--layer", "bisect-probe", "--good", shas[0],
                  "--bad", shas[-1], "--check", check, *extra, timeout=1200)  # fmt: skip


def test_bisect_names_the_planted_commit_in_log2_probes_with_the_base_cached_and_resumes(workspace):
    tree, shas, common = workspace
    path = state_path(tree / "build" / "state", "cpu", "bisect-test", "bisect-probe")

    first = bisect(tree, shas, common, "--max-probes", "1")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "stopped after 1 probe(s)" in first.stdout
    after_one = BisectState.load(path)
    assert [p.pin for p in after_one.probes] == [shas[4]] and after_one.in_progress is None
    assert after_one.probes[0].verdict == "good"

    second = bisect(tree, shas, common)
    assert second.returncode == 0, second.stdout + second.stderr
    out = " ".join(second.stdout.split())
    assert "continuing the bisect recorded in" in out and "1 probe(s) done" in out
    assert f"first bad SOURCE_REF: {shas[FIRST_BAD]}" in out
    assert f"last good SOURCE_REF: {shas[FIRST_BAD - 1]}" in out
    # the resumed run did not probe c4 again: its probes are numbered from 2
    assert "probe 1 " not in out and "probe 2 " in out

    state = BisectState.load(path)
    probes = {p.pin: p for p in state.probes}
    assert len(state.probes) <= math.ceil(math.log2(COMMITS - 1)) + 1
    assert list(probes) == [shas[4], shas[UNBUILDABLE], shas[FIRST_BAD]]
    assert probes[shas[UNBUILDABLE]].verdict == "skip"
    assert "failed to build" in probes[shas[UNBUILDABLE]].reason
    assert probes[shas[FIRST_BAD]].verdict == "bad"
    for probe in state.probes:
        assert probe.build["base"] == "cached", probe
    assert probes[shas[4]].build["bisect-probe"] == "built"
    assert probes[shas[UNBUILDABLE]].build["bisect-probe"] == "failed"

    # the evidence: both probes' folders, the check's output of each, side by side
    good_dir, bad_dir = Path(probes[shas[4]].report), Path(probes[shas[FIRST_BAD]].report)
    assert good_dir.name == shas[4][:12] and bad_dir.name == shas[FIRST_BAD][:12]
    assert json.loads((bad_dir / "probe.json").read_text())["verdict"] == "bad"
    assert (Path(probes[shas[UNBUILDABLE]].report) / "build-bisect-probe.log").is_file()
    assert "evidence: last good vs first bad" in out
    assert str(good_dir) in out and str(bad_dir) in out
    # probes move no moving tag: the stack's tag is not the last probed image
    assert image_id(f"{NAMESPACE}/bisect-test:cpu") is None

    again = bisect(tree, shas, common)
    assert again.returncode == 0 and "probe 4" not in again.stdout
    assert f"first bad SOURCE_REF: {shas[FIRST_BAD]}" in " ".join(again.stdout.split())


def test_a_validation_check_decides_and_the_evidence_is_the_two_real_reports(workspace):
    """check:probe.* runs `python -m validate all --only 'probe.*'` in each probe's image (the
    suite and the check come with the layer); --verify probes both ends first. The pins the first
    test built are in the engine by content tag, so for them only the check runs again."""
    tree, shas, common = workspace
    proc = bisect(tree, shas, common, "--reset", "--verify", check="check:probe.*")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "forgot the recorded bisect" in out
    assert f"first bad SOURCE_REF: {shas[FIRST_BAD]}" in out
    state = BisectState.load(state_path(tree / "build/state", "cpu", "bisect-test", "bisect-probe"))
    assert [p.pin for p in state.probes] == [shas[0], shas[-1], shas[4], shas[UNBUILDABLE],
                                             shas[FIRST_BAD]]  # fmt: skip
    probes = {p.pin: p for p in state.probes}
    assert probes[shas[FIRST_BAD]].reason == "probe.ok fail: probe.ok() is False"
    assert probes[shas[4]].reason == "1 matching check(s) passed or skipped"
    # the pins the first test built are images by content tag now: not built again
    assert probes[shas[4]].build == probes[shas[FIRST_BAD]].build == {"base": "cached", "bisect-probe": "cached"}  # fmt: skip
    assert probes[shas[0]].build == {"base": "cached", "bisect-probe": "built"}

    good = json.loads((Path(probes[shas[4]].report) / "report.json").read_text())
    bad = json.loads((Path(probes[shas[FIRST_BAD]].report) / "report.json").read_text())
    assert [(c["id"], c["status"]) for c in good["checks"]] == [("probe.ok", "pass")]
    assert [(c["id"], c["status"]) for c in bad["checks"]] == [("probe.ok", "fail")]
    assert "probe.ok │ pass: probe.ok() holds │ fail: probe.ok() is False" in out
    assert f"first bad: {probes[shas[FIRST_BAD]].report}/report.json" in out
