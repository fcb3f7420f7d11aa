"""End to end on a real Podman: the cpu stack built, smoke-checked, interrupted and resumed,
validated and published with `--engine podman`, as a Strix Halo toolbox user would.

One build, reused by every test in this module (they run in order and share a tree copy and an
image namespace): it is stopped by Ctrl-C in the middle of the triton layer's pip install and
finished by `invoke build --continue`, so the interrupt costs no second build of the top layers. Inputs are test_cpu_stack's (ATTNFORGE_E2E_*); Podman needs what
`tools/setup.sh podman` prepares: podman and buildah, the base image in Podman's own storage, the
loopback registry allowed over plain HTTP, and (where runc may not raise rlimits) default ulimits.
With ATTNFORGE_REQUIRE_E2E=1 (make test, CI) a Podman that cannot build is a failure, not a skip.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import COPY_IGNORE, REPO
from tests.e2e.test_cpu_stack import (
    BASE,
    CA_CERT,
    REGISTRY,
    _need_registry,
    _triton_build_in_flight,
    build_args,
    invoke,
    outcomes,
    unavailable,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAMESPACE = f"attnforge-podman-{uuid.uuid4().hex[:8]}"
LAYERS = ["base", "torch-cpu", "cpp-extension", "apps", "triton", "validate"]
MANIFEST_TYPES = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"


def podman(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


def podman_id(ref: str) -> str | None:
    """The image id as Docker writes it, read from Podman (which prints the bare hex)."""
    proc = podman("image", "inspect", "--format", "{{.Id}}", ref)
    return f"sha256:{proc.stdout.strip()}" if proc.returncode == 0 and proc.stdout.strip() else None


# Every build in the module: the --set is the interrupted invocation's, which --continue replays
PIN = ("--set", "triton.NUMPY_VERSION=2.3.5")


def podman_build(*extra: str, namespace: str = NAMESPACE) -> list[str]:
    return build_args("--engine", "podman", *PIN, *extra, namespace=namespace)


def _podman_problem() -> str | None:
    if not shutil.which("podman"):
        return "podman is not installed (tools/setup.sh podman installs it)"
    try:
        from attnforge.engine import PodmanEngine

        PodmanEngine()
    except Exception as exc:  # noqa: BLE001 - any reason is a reason to skip or fail
        return str(exc)
    if podman_id(BASE) is None:
        return f"base image {BASE} is not in Podman's storage (tools/setup.sh podman copies it)"
    ran = podman("run", "--rm", BASE, "true")
    if ran.returncode != 0:
        return f"podman cannot run {BASE}: {ran.stderr.strip()[-300:]} (see tools/setup.sh podman)"
    return None


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    problem = _podman_problem()
    if problem:
        unavailable(
            f"Podman end-to-end tests are required here but cannot run: {problem}",
            f"no Podman for end-to-end tests: {problem}",
        )
    dest = tmp_path_factory.mktemp("podman") / "tree"
    shutil.copytree(REPO, dest, ignore=COPY_IGNORE)
    before = os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = EPOCH  # every invoke of the module, subprocesses included
    keys: dict[str, str] = {}
    try:
        keys = lower_layer_keys(dest)
        drop_stale_cache(keys)
        yield dest
    finally:
        if before is None:
            os.environ.pop("SOURCE_DATE_EPOCH", None)
        else:
            os.environ["SOURCE_DATE_EPOCH"] = before
        keep_lower_layers(NAMESPACE, keys)
        remove_images_of(NAMESPACE)


# Podman's layer cache is its image storage: the images a build made are what the next build
# finds (`--layers`), where Docker keeps BuildKit's cache apart from its images. The run's lower
# layers (base to apps, whose inputs a run does not change) stay as CACHE/LAYER:CONTENT-TAG, so
# the next run builds them from Podman's cache as the Docker modules build theirs from BuildKit's;
# `podman rmi` them for a cold build. The triton and validate layers, which the test's nonce
# changes every run, go with the namespace.
# - Buildah writes the labels into each image's history, which the layers above compare: the
#   created label is the same in every run (EPOCH, through SOURCE_DATE_EPOCH), or each run's base
#   would give its torch-cpu layer no cache.
# - Buildah 1.28 leaves bind-mounted files out of a RUN step's cache key (docs/engines.md, "Known
#   problem"), so a layer whose inputs changed could be answered from the old inputs' steps: the
#   module starts by removing every cached layer whose content tag is not the current one, and
#   with it the steps it was built from. It also removes what a killed run of this module left
#   (its namespace's images; Buildah would answer the next run's nonce-changed triton step from
#   them), so one run of the module at a time per Podman storage.
CACHE = "localhost/attnforge-test-cache"
EPOCH, CREATED = "1767225600", "2026-01-01T00:00:00Z"
NAMESPACE_PREFIX = NAMESPACE.rsplit("-", 1)[0] + "-"


def lower_layer_keys(tree: Path) -> dict[str, str]:
    """LAYER -> its content tag (`cpu-KEY12`) for the module's build, from a dry run."""
    plan = json.loads(invoke(tree, *podman_build("--dry-run", "--json")).stdout)
    return {
        s["layer"]: s["tag"].rsplit(":", 1)[1] for s in plan["steps"] if s["layer"] in LAYERS[:4]
    }


def drop_stale_cache(keys: dict[str, str]) -> None:
    """Before the module's build: what killed runs of the module left (their namespaces' names;
    the images too, unless the cache holds them), then every cached layer of another content tag."""
    listed = podman("images", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}").stdout
    rows = [line.split() for line in listed.splitlines() if len(line.split()) == 2]
    remove_images_of(NAMESPACE_PREFIX)  # this run's namespace has no image yet
    for layer in reversed(LAYERS[:4]):  # the top first: Podman refuses an image another is built on
        for _, name in rows:
            if name.startswith(f"{CACHE}/{layer}:") and name != f"{CACHE}/{layer}:{keys[layer]}":
                podman("rmi", name)  # the name; the image too when it was its only one


def keep_lower_layers(namespace: str, keys: dict[str, str]) -> None:
    """Name the namespace's lower layers CACHE/LAYER:CONTENT-TAG (`keys`)."""
    for layer, content_tag in keys.items():
        image = podman_id(f"{namespace}/{layer}:{content_tag}")
        if image:
            podman("tag", image.removeprefix("sha256:"), f"{CACHE}/{layer}:{content_tag}")


def remove_images_of(namespace: str) -> None:
    """Every image whose names are all in the namespace, by id (an image pulled by digest has no
    tag); an image with a name elsewhere too (CACHE's) loses only its names in the namespace."""
    listed = podman("images", "--no-trunc", "--format", "{{.ID}} {{.Repository}}").stdout
    rows = [
        (i.removeprefix("sha256:"), repo)
        for i, repo in (line.split() for line in listed.splitlines() if len(line.split()) == 2)
    ]
    mine = {i for i, repo in rows if namespace in repo}
    shared = {i for i, repo in rows if namespace not in repo and repo != "<none>"} & mine
    if mine - shared:
        podman("rmi", "-f", *sorted(mine - shared))
    for image in sorted(shared):
        names = podman("image", "inspect", "--format", "{{json .RepoTags}}", image).stdout
        names = [n for n in json.loads(names or "[]") if namespace in n]
        if names:  # `podman untag IMAGE` with no name would take every name
            podman("untag", image, *names)


@dataclass
class Built:
    """The module's one build: the run Ctrl-C stopped, what it left behind, and the resume."""

    interrupted: subprocess.CompletedProcess[str]
    state: dict
    plan: dict  # the same build's dry run between the interrupt and --continue
    triton_id: str | None  # what the triton layer's content tag named then
    resumed: subprocess.CompletedProcess[str] | None
    left: list[str]  # Buildah working containers the interrupt left behind
    triton_log: str  # the interrupted run's build log of the triton layer


def working_containers() -> set[str]:
    """`ID NAME` of every container Podman lists, Buildah's working containers included."""
    listed = podman("ps", "-a", "--external", "--no-trunc", "--format", "{{.ID}} {{.Names}}")
    return set(listed.stdout.splitlines())


def _ctrl_c_not_ignored() -> None:
    """SIGINT as a terminal's Ctrl-C finds it: a test run started in the background (`cmd &` in
    a script, as CI runners and nohup do) inherits SIGINT ignored, and so would invoke, which then
    builds on through the interrupt and exits 0."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def built(tree: Path) -> Built:
    """The one Podman build of the cpu stack the tests below share: Ctrl-C in the middle of the
    triton layer's pip install, then `invoke build --continue`."""
    args = podman_build()
    containers_before = working_containers()
    out, err = tree.parent / "interrupted.out", tree.parent / "interrupted.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        try:
            proc = _triton_build_in_flight(
                tree, args, stdout=stdout, stderr=stderr, start_new_session=True,
                preexec_fn=_ctrl_c_not_ignored,
            )  # fmt: skip
        except AssertionError:  # it ended before the triton layer: a lower layer failed
            pytest.fail(
                f"the Podman build of the cpu stack ended before its triton layer:\n"
                f"{out.read_text()}{err.read_text()}"
            )
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    interrupted = subprocess.CompletedProcess(
        proc.args, proc.returncode, out.read_text(), err.read_text()
    )
    state = json.loads((tree / "build/state/last-build.json").read_text())
    left = sorted(working_containers() - containers_before)
    triton_log = (tree / "build/logs/cpu/triton.log").read_text(
        errors="replace"
    )  # --continue rewrites it
    plan = json.loads(invoke(tree, *args, "--dry-run", "--json").stdout)
    triton = next(s for s in plan["steps"] if s["layer"] == "triton")
    found = Built(interrupted, state, plan, podman_id(triton["tag"]), None, left, triton_log)
    if interrupted.returncode == 0:
        return found  # the build ended before Ctrl-C: the interrupt test says so
    found.resumed = invoke(tree, "build", "--continue")
    if found.resumed.returncode != 0:
        pytest.fail(
            f"the Podman build of the cpu stack failed after --continue:\n"
            f"{found.resumed.stdout}{found.resumed.stderr}"
        )
    return found


def built_lines(stdout: str) -> set[str]:
    """The layers a build's progress says it built (`built LAYER[:VARIANT] in 12.3s`)."""
    return {
        words[1].split(":")[0] for words in (line.split() for line in stdout.splitlines())
        if len(words) >= 4 and words[0] == "built" and words[2] == "in"
    }  # fmt: skip


def test_the_cpu_stack_builds_with_podman_and_every_layer_passes_its_smoke_checks(tree, built):
    """Each layer is built once by Podman and smoke-checked: the layers below triton by the
    interrupted run, triton and validate by --continue."""
    interrupted, resumed = built.interrupted, built.resumed
    assert resumed is not None, "the build ended before Ctrl-C (see the interrupt test)"
    assert "engine: podman version" in interrupted.stdout
    assert built_lines(interrupted.stdout) == set(LAYERS[:4]), interrupted.stdout
    assert outcomes(resumed.stdout) == {
        **dict.fromkeys(LAYERS[:4], "cached"), "triton": "built", "validate": "built",
    }  # fmt: skip
    for proc in (interrupted, resumed):
        assert "smoke ok" in proc.stdout and "FAIL" not in proc.stdout, proc.stdout
    assert podman_id(f"{NAMESPACE}/cpu:cpu") == podman_id(f"{NAMESPACE}/validate:cpu") is not None
    for layer in ("torch-cpu", "triton"):  # one layer of each run
        command = (tree / f"build/logs/cpu/{layer}.log").read_text().splitlines()[0]
        assert " build --format docker --layers " in command  # the OCI format would drop SHELL
        assert "--secret id=ca,src=" in command or not Path(CA_CERT).is_file()


def test_every_layer_has_its_content_tag_in_podman_and_a_rebuild_is_all_cached(tree, built):
    plan = json.loads(invoke(tree, *podman_build("--dry-run", "--json")).stdout)
    assert [s["status"] for s in plan["steps"]] == ["cached"] * len(LAYERS)
    for step in plan["steps"]:
        assert step["tag"].startswith(f"{NAMESPACE}/{step['layer']}:cpu-")
        assert podman_id(step["tag"]) is not None, step["tag"]
    again = invoke(tree, *podman_build())
    assert again.returncode == 0, again.stdout + again.stderr
    assert outcomes(again.stdout) == dict.fromkeys(LAYERS, "cached")


def test_the_content_keys_are_the_same_under_docker_and_podman(tree, built):
    """The base image has one id in both engines (Podman's bare hex is written sha256:HEX), so
    the same inputs give the same content tags: a cache filled by one engine serves the other."""
    docker = invoke(tree, *build_args(*PIN, "--dry-run", "--json", namespace=NAMESPACE))
    if docker.returncode != 0:
        pytest.skip(f"no Docker engine to compare with: {docker.stderr.strip()[-200:]}")
    under_podman = json.loads(invoke(tree, *podman_build("--dry-run", "--json")).stdout)
    tags = [s["tag"] for s in json.loads(docker.stdout)["steps"]]
    assert tags == [s["tag"] for s in under_podman["steps"]]


def test_the_podman_image_carries_its_versions_manifest_as_file_and_label(tree, built):
    final = f"{NAMESPACE}/cpu:cpu"
    ran = podman("run", "--rm", final, "cat", "/opt/attnforge/versions.json")
    assert ran.returncode == 0, ran.stderr
    manifest = json.loads(ran.stdout)
    assert manifest["torch-cpu"]["TORCH_VERSION"] == "2.13.0+cpu"
    assert manifest["base_image"]["digest"] == podman_id(BASE)  # sha256:HEX, as under Docker
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", final).stdout)
    assert json.loads(labels["org.attnforge.versions"]) == manifest
    assert labels["org.attnforge.layer"] == "validate"
    assert labels["org.opencontainers.image.created"] == CREATED  # SOURCE_DATE_EPOCH's
    # Docker's image format (Buildah's OCI one drops SHELL: the base layer's bash-only RUN would fail)
    kind = podman("image", "inspect", "--format", "{{.ManifestType}}", final).stdout.strip()
    assert kind == "application/vnd.docker.distribution.manifest.v2+json"


def test_the_ca_bundle_handed_to_buildah_as_a_secret_is_in_no_layer(tree, built):
    if not Path(CA_CERT).is_file():
        pytest.skip("no CA bundle was handed to the build")
    size, digest = (
        Path(CA_CERT).stat().st_size,
        hashlib.sha256(Path(CA_CERT).read_bytes()).hexdigest(),
    )
    script = (
        "import hashlib, os, sys\n"
        "hits = []\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ('/proc', '/sys', '/dev')]\n"
        "    for f in files:\n"
        "        p = os.path.join(root, f)\n"
        "        try:\n"
        f"            if os.path.getsize(p) == {size} and hashlib.sha256(open(p, 'rb').read()).hexdigest() == {digest!r}:\n"
        "                hits.append(p)\n"
        "        except OSError:\n"
        "            pass\n"
        "print(hits); sys.exit(1 if hits else 0)\n"
    )  # fmt: skip
    ran = podman("run", "--rm", f"{NAMESPACE}/cpu:cpu", "python3", "-c", script)
    assert ran.returncode == 0, (
        f"the host CA bundle was found in the image: {ran.stdout}{ran.stderr}"
    )


def test_an_interrupted_podman_build_leaves_no_tag_and_continue_finishes_it(tree, built):
    interrupted, state = built.interrupted, built.state
    assert interrupted.returncode != 0, "the build ended before Ctrl-C"
    assert "--continue" in interrupted.stderr
    assert state["failed"] == "triton" and state["interrupted"] is True
    assert state["invocation"]["engine"] == "podman"
    triton = next(s for s in built.plan["steps"] if s["layer"] == "triton")
    assert triton["status"] == "build" and built.triton_id is None  # no tag on a partial image
    # podman keeps the working container of a build stopped by a signal; the engine removed it
    assert built.left == [], built.left
    assert "removed the interrupted build's working container" in built.triton_log

    resumed = built.resumed
    assert "stopped at layer triton" in " ".join(resumed.stdout.split())
    assert "engine: podman version" in resumed.stdout
    assert outcomes(resumed.stdout) == {
        **dict.fromkeys(LAYERS, "cached"), "triton": "built", "validate": "built",
    }  # fmt: skip
    assert podman_id(triton["tag"]) is not None
    numpy = podman(
        "run", "--rm", f"{NAMESPACE}/cpu:cpu", "python3", "-c", "import numpy; print(numpy.__version__)"
    )  # fmt: skip
    assert numpy.stdout.strip() == "2.3.5", numpy.stderr  # the interrupted run's --set, replayed


def test_validate_with_podman_runs_the_suite_in_the_image_and_stamps_its_id(tree, built):
    proc = invoke(
        tree, "validate", "--arch", "cpu", "--namespace", NAMESPACE, "--quick",
        "--engine", "podman", timeout=1200,
    )  # fmt: skip
    report = tree / "reports/cpu/cpu/report.json"
    assert report.exists(), proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "schema_version" in json.loads(report.read_text())
    stamp = json.loads((tree / "reports/cpu/cpu/validated.json").read_text())
    assert stamp["passed"] is True and stamp["image_id"] == podman_id(f"{NAMESPACE}/cpu:cpu")


def _registry_digest(repo: str, tag: str) -> str:
    req = urllib.request.Request(
        f"http://{REGISTRY}/v2/{repo}/manifests/{tag}", method="HEAD",
        headers={"Accept": MANIFEST_TYPES},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.headers["Docker-Content-Digest"]


def test_publish_with_podman_records_the_digests_the_registry_serves(tree, built):
    _need_registry()
    target = f"{REGISTRY}/{NAMESPACE}"
    proc = invoke(
        tree, "publish", "--arch", "cpu", "--namespace", NAMESPACE, "--to", target,
        "--engine", "podman",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((tree / "reports/cpu/cpu/publish.json").read_text())
    assert manifest["image_id"] == podman_id(f"{NAMESPACE}/cpu:cpu")
    pushed = {r["ref"] for r in manifest["refs"]}
    assert f"{target}/cpu:cpu" in pushed
    for layer in LAYERS:
        assert f"{target}/{layer}:cpu" in pushed
        assert any(r.startswith(f"{target}/{layer}:cpu-") for r in pushed), layer
    for r in manifest["refs"]:
        repo, tag = r["ref"].removeprefix(f"{REGISTRY}/").rsplit(":", 1)
        # not the local image's .Digest: podman re-serializes the manifest when it pushes
        assert _registry_digest(repo, tag) == r["digest"], r["ref"]
    final = next(r for r in manifest["refs"] if r["ref"] == f"{target}/cpu:cpu")
    pulled = podman("pull", f"{target}/cpu@{final['digest']}")
    assert pulled.returncode == 0, pulled.stderr


def test_the_registry_is_podmans_build_cache_too(tree, built):
    """What publish pushed is a cache for the next Podman runner: each layer is pulled by its
    content tag and smoke-checked, none built, and the image ids are this build's."""
    _need_registry()
    cache, again = f"{REGISTRY}/{NAMESPACE}", f"{NAMESPACE}-again"
    published = ("--cache-from", cache)
    dry = json.loads(
        invoke(tree, *podman_build("--dry-run", "--json", *published, namespace=again)).stdout
    )
    assert [s["status"] for s in dry["steps"]] == ["pull"] * len(LAYERS)
    proc = invoke(tree, *podman_build(*published, namespace=again))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outcomes(proc.stdout) == dict.fromkeys(LAYERS, "pulled")
    assert "smoke ok" in proc.stdout
    for step in dry["steps"]:
        content_tag = step["tag"].split(":")[-1]
        assert podman_id(step["tag"]) == podman_id(f"{NAMESPACE}/{step['layer']}:{content_tag}")
