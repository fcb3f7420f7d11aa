"""End to end on a real Docker engine: build, cache, change, fail, interrupt, resume.

Runs `invoke` as a user would, in a copy of the tree (so tests may edit files) under a fresh image
namespace. Inputs come from the environment that .ci/run prepares:
  ATTNFORGE_E2E_BASE_IMAGE  a local base image (debootstrap + docker import; no registry here)
  ATTNFORGE_E2E_WHEELHOUSE  local wheels (torch CPU, triton, numpy) offered to pip in builds
  ATTNFORGE_E2E_CA_CERT     the host CA bundle, handed to builds as a BuildKit secret
  ATTNFORGE_E2E_REGISTRY    a local registry (host:port) for the push test
  ATTNFORGE_REQUIRE_E2E=1   fail, not skip, when no engine is reachable (CI sets it)
The tests in this module run in order and share one tree and namespace; the stack in it is the
session's one build (tests/e2e/conftest.py, `shared_cpu_stack`), tagged into that namespace. Validating and publishing
the stack are test_cpu_stack_publish.py's, the registry as the next runner's build cache is
test_registry_cache.py's (their own modules, so that xdist spreads them over the workers).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import NoReturn

import pytest

from tests.conftest import COPY_IGNORE, REPO, outputs_env, run_invoke

pytestmark = pytest.mark.e2e

BASE = os.environ.get("ATTNFORGE_E2E_BASE_IMAGE", "attnforge-local/debian:bookworm")
WHEELHOUSE = os.environ.get("ATTNFORGE_E2E_WHEELHOUSE", str(REPO / "build" / "wheelhouse"))
CA_CERT = os.environ.get("ATTNFORGE_E2E_CA_CERT", "/etc/ssl/certs/ca-certificates.crt")
REGISTRY = os.environ.get("ATTNFORGE_E2E_REGISTRY", "")
NAMESPACE = f"attnforge-e2e-{uuid.uuid4().hex[:8]}"
CPU_LAYERS = ["base", "torch-cpu", "cpp-extension", "apps", "triton", "validate"]


def _engine_problem() -> str | None:
    try:
        from attnforge.engine import DockerEngine

        engine = DockerEngine()
    except Exception as exc:  # noqa: BLE001 - any reason is a reason to skip or fail
        return str(exc)
    if engine.image_id(BASE) is None:
        return f"base image {BASE} is missing (make it with `tools/setup.sh base-image`)"
    return None


def unavailable(required: str, skipped: str) -> NoReturn:
    """What an end-to-end test does when what it needs is missing: skip with ``skipped``, or
    fail with ``required`` where ATTNFORGE_REQUIRE_E2E=1 (make test, CI) requires it to run."""
    if os.environ.get("ATTNFORGE_REQUIRE_E2E") == "1":
        pytest.fail(required)
    pytest.skip(skipped)


def require_engine() -> None:
    """Skip without a Docker engine and base image; fail instead where CI requires them."""
    problem = _engine_problem()
    if problem:
        unavailable(
            f"end-to-end tests are required here but cannot run: {problem}",
            f"no container engine for end-to-end tests: {problem}",
        )


@pytest.fixture(scope="module")
def engine_ready():
    require_engine()


def copy_tree(tmp_path_factory, label: str) -> Path:
    """A copy of the checkout for one module's tests (they may edit files), with the wheelhouse
    where tools/setup.sh puts it, so that plain builds find it."""
    return copy_tree_to(tmp_path_factory.mktemp(label) / "tree")


def copy_tree_to(dest: Path) -> Path:
    """`copy_tree` into the folder ``dest`` (which must not exist yet)."""
    shutil.copytree(REPO, dest, ignore=COPY_IGNORE)
    if Path(WHEELHOUSE).is_dir():
        (dest / "build").mkdir()
        (dest / "build" / "wheelhouse").symlink_to(Path(WHEELHOUSE).resolve())
    return dest


def remove_images(namespace: str, engine: str = "docker") -> None:
    """Every image tagged under ``namespace`` in ``engine``'s storage (docker or podman): what one
    module's builds left."""
    tags = subprocess.run(
        [engine, "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True
    ).stdout.split()
    mine = [t for t in tags if namespace in t]
    if mine:
        subprocess.run([engine, "rmi", "-f", *mine], capture_output=True)


@pytest.fixture(scope="module")
def tree(tmp_path_factory, engine_ready, tag_shared_stack) -> Path:
    """The module's tree copy, with the session's one build of the stack tagged into NAMESPACE
    (tests/e2e/conftest.py, `tag_shared_stack`)."""
    dest = copy_tree(tmp_path_factory, "e2e")
    try:
        tag_shared_stack(NAMESPACE, dest)
        yield dest
    finally:
        remove_images(NAMESPACE)


def build_args(*extra: str, namespace: str = NAMESPACE) -> list[str]:
    args = ["build", "--arch", "cpu", "--base-image", BASE, "--namespace", namespace]
    if Path(WHEELHOUSE).is_dir():
        # the wheelhouse holds torch's CPU wheel, so pip need not reach download.pytorch.org
        args += ["--wheelhouse", WHEELHOUSE, "--set", "torch-cpu.TORCH_INDEX_URL="]
    if Path(CA_CERT).is_file():
        args += ["--ca-cert", CA_CERT]
    return [*args, *extra]


def invoke(
    tree: Path, *args: str, timeout: int = 1800, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """invoke in the tree copy, with its build and report folders inside that copy."""
    return run_invoke(tree, *args, timeout=timeout, env=outputs_env(tree, env))


def outcomes(stdout: str) -> dict[str, str]:
    """layer -> built/cached from the summary table."""
    found = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.replace("┃", "│").split("│") if c.strip()]
        if len(cells) >= 2 and cells[1] in {"built", "cached", "pulled", "failed", "skipped"}:
            found[cells[0]] = cells[1]
    return found


def image_id(ref: str) -> str | None:
    proc = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True
    )
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def docker_run(image: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "run", "--rm", image, *cmd], capture_output=True, text=True, timeout=300
    )


def _need_registry() -> None:
    if not REGISTRY:
        unavailable(
            "ATTNFORGE_E2E_REGISTRY is not set",
            "no local registry (set ATTNFORGE_E2E_REGISTRY=host:port)",
        )


def test_the_cpu_stack_builds_and_every_layer_passes_its_smoke_checks(
    tree, shared_cpu_stack, shared_cpu_stack_build
):
    """The session's one `invoke build` of the stack (a fresh namespace: every layer built and
    smoke-checked); this module's tests go on from its images, tagged into NAMESPACE."""
    stdout, built_in = shared_cpu_stack_build, shared_cpu_stack[1]
    assert outcomes(stdout) == dict.fromkeys(CPU_LAYERS, "built")
    assert "smoke ok" in stdout and "FAIL" not in stdout
    assert image_id(f"{NAMESPACE}/cpu:cpu") == image_id(f"{NAMESPACE}/validate:cpu") is not None
    assert (built_in / "build/logs/cpu/torch-cpu.log").read_text().strip()


def test_the_image_carries_its_versions_manifest_as_file_and_label(tree):
    final = f"{NAMESPACE}/cpu:cpu"
    manifest = json.loads(docker_run(final, "cat", "/opt/attnforge/versions.json").stdout)
    assert manifest["torch-cpu"]["TORCH_VERSION"] == "2.13.0+cpu"
    assert manifest["triton"]["TRITON_VERSION"] == "3.9.0"
    assert manifest["base_image"]["ref"] == BASE and manifest["base_image"]["digest"].startswith(
        "sha256:"
    )
    labels = json.loads(
        subprocess.run(
            ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", final],
            capture_output=True,
            text=True,
        ).stdout
    )
    assert json.loads(labels["org.attnforge.versions"]) == manifest
    assert labels["org.attnforge.layer"] == "validate"


def test_the_build_time_ca_bundle_is_in_no_layer(tree):
    if not Path(CA_CERT).is_file():
        pytest.skip("no CA bundle was handed to the build")
    size = Path(CA_CERT).stat().st_size
    digest = __import__("hashlib").sha256(Path(CA_CERT).read_bytes()).hexdigest()
    script = (
        "import hashlib, os, sys\n"
        f"size, digest = {size}, {digest!r}\n"
        "hits = []\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ('/proc', '/sys', '/dev')]\n"
        "    for f in files:\n"
        "        p = os.path.join(root, f)\n"
        "        try:\n"
        "            if os.path.getsize(p) == size and hashlib.sha256(open(p, 'rb').read()).hexdigest() == digest:\n"
        "                hits.append(p)\n"
        "        except OSError:\n"
        "            pass\n"
        "print(hits); sys.exit(1 if hits else 0)\n"
    )
    proc = docker_run(f"{NAMESPACE}/cpu:cpu", "python3", "-c", script)
    assert proc.returncode == 0, f"the host CA bundle was found in the image: {proc.stdout}"


def test_a_rebuild_with_nothing_changed_is_all_cached(tree):
    started = time.monotonic()
    proc = invoke(tree, *build_args())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outcomes(proc.stdout) == dict.fromkeys(CPU_LAYERS, "cached")
    print(
        f"no-op rebuild took {time.monotonic() - started:.1f}s"
    )  # the number lives in docs/benchmarks.md


def test_the_plain_readme_command_builds_offline_from_the_local_defaults(tree):
    """`invoke build --arch cpu` with no flags: the local base image, the wheelhouse and the host
    CA bundle are its defaults, so it is the very build above (all cached), with no registry."""
    if image_id("debian:bookworm-slim") is not None or BASE != "attnforge-local/debian:bookworm":
        pytest.skip("the engine has debian:bookworm-slim, or the base image is not the local one")
    proc = invoke(tree, "build", "--arch", "cpu", "--namespace", NAMESPACE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    notes = " ".join(proc.stderr.split())  # notes on the defaults it chose
    assert f"base image: {BASE}" in notes and "wheelhouse:" in notes
    assert outcomes(proc.stdout) == dict.fromkeys(CPU_LAYERS, "cached")
    # The same defaults under --dry-run --json: the notes are on stderr, stdout stays JSON.
    proc = invoke(tree, "build", "--arch", "cpu", "--namespace", NAMESPACE, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"base image: {BASE}" in " ".join(proc.stderr.split())
    assert json.loads(proc.stdout)["steps"]


def test_changing_one_file_of_the_validate_layer_rebuilds_only_that_layer(tree):
    path = tree / "validate" / "__init__.py"
    path.write_text(path.read_text() + "\n# touched by the e2e test\n")
    plan = json.loads(invoke(tree, *build_args("--dry-run", "--json")).stdout)
    why = {s["layer"]: (s["status"], s["changes"]) for s in plan["steps"]}
    assert why["validate"] == ("build", ["validate/__init__.py changed"])
    assert why["triton"] == ("cached", [])
    before = image_id(f"{NAMESPACE}/triton:cpu")
    proc = invoke(tree, *build_args())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outcomes(proc.stdout) == {**dict.fromkeys(CPU_LAYERS, "cached"), "validate": "built"}
    assert image_id(f"{NAMESPACE}/triton:cpu") == before
    assert (
        "touched by the e2e test"
        in docker_run(
            f"{NAMESPACE}/cpu:cpu", "cat", "/opt/attnforge/src/validate/__init__.py"
        ).stdout
    )


def test_a_failing_layer_names_itself_its_log_and_its_tail_and_moves_no_tag(tree):
    moving = {ref: image_id(ref) for ref in (f"{NAMESPACE}/triton:cpu", f"{NAMESPACE}/cpu:cpu")}
    proc = invoke(tree, *build_args("--set", "triton.TRITON_VERSION=0.0.1"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert "layer 'triton' failed to build" in err
    assert "build/logs/cpu/triton.log" in err
    assert "triton==0.0.1" in err  # the tail of the log shows pip's complaint
    assert "Traceback" not in proc.stderr
    assert {ref: image_id(ref) for ref in moving} == moving


def test_a_conflicting_patch_series_fails_the_build_with_the_engines_message(tree):
    recipe = tree / "recipes/layers/triton.yaml"
    original = recipe.read_text()
    recipe.write_text(original.replace(
        "patches: [patches/selftest/cpu-demo]",
        "patches: [patches/selftest/cpu-demo, tests/patches/fixtures/selftest-conflict]",
    ))  # fmt: skip
    try:
        proc = invoke(tree, *build_args())
    finally:
        recipe.write_text(original)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert "layer 'triton' failed to build" in err
    assert (
        "triton/errors.py" in err and "hunk" in err
    )  # the patch engine's own words, from the log tail
    assert "Traceback" not in proc.stderr


def _triton_build_in_flight(tree: Path, args: list[str], **popen) -> subprocess.Popen:
    """Start `invoke ARGS` and return once the triton layer's pip install is running. A nonce in
    the layer's context keeps BuildKit's own cache from finishing the step before the test acts
    (a warm machine has built these numpy versions before)."""
    patch = next((tree / "patches/selftest/cpu-demo").glob("0001-*.patch"))
    patch.write_text(patch.read_text().replace("Subject:", f"X-Nonce: {uuid.uuid4()}\nSubject:", 1))
    log = tree / "build/logs/cpu/triton.log"
    log.unlink(missing_ok=True)
    # SIGINT as a terminal's Ctrl-C finds it: a test run started in the background (`cmd &` in a
    # script, as CI runners and nohup do) inherits it ignored, and invoke would build on through
    # the test's interrupt and exit 0.
    popen.setdefault("preexec_fn", lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    proc = subprocess.Popen(
        [sys.executable, "-m", "invoke", *args], cwd=tree, env=outputs_env(tree), **popen
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and "pip install" in log.read_text(errors="replace"):
            break
        time.sleep(0.5)
    assert proc.poll() is None, "the build ended before the test could act on it"
    time.sleep(2)  # mid-RUN
    return proc


def test_an_interrupted_build_leaves_no_tag_and_continue_finishes_it(tree):
    args = build_args("--set", "triton.NUMPY_VERSION=2.3.5")
    proc = _triton_build_in_flight(
        tree, args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "--continue" in stderr
    state = json.loads((tree / "build/state/last-build.json").read_text())
    assert state["failed"] == "triton" and state["interrupted"] is True

    plan = json.loads(invoke(tree, *args, "--dry-run", "--json").stdout)
    triton = next(s for s in plan["steps"] if s["layer"] == "triton")
    assert (
        triton["status"] == "build" and image_id(triton["tag"]) is None
    )  # no tag on a partial image

    resumed = invoke(tree, "build", "--continue")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert (
        "continuing the last build" in resumed.stdout
        and "stopped at layer triton" in resumed.stdout
    )
    assert outcomes(resumed.stdout) == {
        **dict.fromkeys(CPU_LAYERS, "cached"), "triton": "built", "validate": "built"
    }  # fmt: skip
    assert image_id(triton["tag"]) is not None
    assert (
        "2.3.5"
        in docker_run(
            f"{NAMESPACE}/cpu:cpu", "python3", "-c", "import numpy; print(numpy.__version__)"
        ).stdout
    )


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in argv:
            found.append(argv)
    return found


def test_after_sigkill_the_build_client_stops_and_continue_names_the_layer(tree):
    args = build_args("--set", "triton.NUMPY_VERSION=2.3.4")
    proc = _triton_build_in_flight(tree, args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staging = tree / "build/staging/cpu"
    assert _processes_mentioning(str(staging)), "no build client was running"
    proc.kill()  # SIGKILL: no handler of ours runs
    proc.wait()
    deadline = time.monotonic() + 30
    while _processes_mentioning(str(staging)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_mentioning(str(staging)) == [], "the build client outlived invoke by 30 s"
    assert [p.name.split("-")[0] for p in staging.iterdir()] == ["triton"]  # left by the kill
    state = json.loads((tree / "build/state/last-build.json").read_text())
    assert state["in_progress"] == "triton"

    resumed = invoke(tree, "build", "--continue")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "stopped at layer triton" in " ".join(resumed.stdout.split())
    assert list(staging.iterdir()) == []  # the dead build's folder was swept


def test_a_registry_cache_that_does_not_answer_is_one_sentence_and_a_fallback(tree):
    proc = invoke(tree, *build_args("--dry-run"), "--cache-from", "127.0.0.1:9/nothing-here")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "registry 127.0.0.1:9 did not answer" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr
    refused = invoke(
        tree,
        *build_args("--dry-run"),
        "--cache-from",
        "127.0.0.1:9/nothing-here",
        "--require-cache",
    )
    assert refused.returncode == 2 and "did not answer" in refused.stderr
