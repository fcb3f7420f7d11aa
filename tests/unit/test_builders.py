"""`invoke build --builder`: the engine commands for a named buildx builder or a standalone
buildkitd (buildctl), and the flow that brings a remote result back before any tag moves.

No BuildKit builder other than the local engine's can run here (Debian packages no buildkitd or
buildctl), so the flow is checked with recorded clients: small scripts standing in for `docker`
and `buildctl` that log their argv and write what the real ones write (iidfile, metadata file,
tarball). docs/ci.md says what was not run against a real remote builder.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from attnforge.build import BuildState, Invocation, build_requests, execute, plan_build
from attnforge.engine import BuildFailed, BuildRequest, DockerEngine
from attnforge.errors import UserError
from tests.conftest import REPO, run_invoke
from tests.unit.conftest import RecordingEngine


def request(**kw) -> BuildRequest:
    base = dict(
        context=Path("/stage/context"), dockerfile=Path("/stage/context/Dockerfile"),
        build_args={"BASE_IMAGE": "ns/base:cpu-aaa", "A": "1"}, labels={"org.attnforge.hash": "h"},
        iidfile=Path("/stage/iid"), secrets={"ca": Path("/etc/ca.crt")},
    )  # fmt: skip
    base.update(kw)
    return BuildRequest(**base)


def test_a_buildx_builder_builds_there_and_loads_the_result_into_the_engine():
    argv = request(builder="k8s").argv(["docker"], "buildx")
    assert argv[:7] == [
        "docker",
        "buildx",
        "build",
        "--builder",
        "k8s",
        "--load",
        "--progress=plain",
    ]
    assert ["--iidfile", "/stage/iid"] == argv[
        argv.index("--iidfile") : argv.index("--iidfile") + 2
    ]
    assert "BASE_IMAGE=ns/base:cpu-aaa" in argv and "org.attnforge.hash=h" in argv
    assert "id=ca,src=/etc/ca.crt" in argv and argv[-1] == "/stage/context"


def test_a_buildx_builder_with_push_sends_the_result_to_the_registry_not_the_engine():
    argv = request(builder="k8s", push_to="reg:5000/ns/base:cpu-aaa-unchecked").argv(
        ["docker"], "buildx"
    )
    assert "--load" not in argv
    out = argv[argv.index("--output") + 1]
    assert out == "type=image,name=reg:5000/ns/base:cpu-aaa-unchecked,push=true"


def test_the_engine_mode_does_not_matter_once_a_builder_is_named():
    """The Debian 20.10 CLI ('classic') cannot, but the argv is buildx's either way."""
    assert request(builder="k8s").argv(["docker"], "classic")[1:3] == ["buildx", "build"]


def test_a_buildkitd_address_builds_through_buildctl_with_the_same_inputs():
    req = request(builder="tcp://buildkitd:1234")
    argv = req.argv(["docker"], "buildx")
    assert argv[:5] == ["buildctl", "--addr", "tcp://buildkitd:1234", "build", "--progress=plain"]
    pairs = {(argv[i], argv[i + 1]) for i in range(len(argv) - 1)}
    assert ("--frontend", "dockerfile.v0") in pairs
    assert ("--local", "context=/stage/context") in pairs
    assert ("--local", "dockerfile=/stage/context") in pairs
    assert ("--opt", "filename=Dockerfile") in pairs
    assert ("--opt", "build-arg:BASE_IMAGE=ns/base:cpu-aaa") in pairs
    assert ("--opt", "label:org.attnforge.hash=h") in pairs
    assert ("--secret", "id=ca,src=/etc/ca.crt") in pairs
    assert ("--metadata-file", "/stage/metadata.json") in pairs
    # an unnamed docker tarball: loading it into the engine moves no tag before the smoke checks
    assert argv[-2:] == ["--output", "type=docker,dest=/stage/image.tar"]


def test_buildctl_with_push_sends_the_result_to_the_registry():
    argv = request(builder="tcp://b:1234", push_to="r/ns/x:cpu-aaa-unchecked").buildctl_argv()
    assert argv[-1] == "type=image,name=r/ns/x:cpu-aaa-unchecked,push=true"


def test_podman_cannot_use_a_buildkit_builder():
    with pytest.raises(UserError, match="podman cannot use"):
        request(builder="k8s").argv(["podman"], "podman")


def _plan(ws, recipes, engine=None, **inv):
    invocation = Invocation(arch="cpu", stack="cpu", namespace="reg:5000/ns", **inv)
    plan, _ = plan_build(invocation, recipes, ws, engine)
    return invocation, plan


def test_with_a_builder_and_push_each_layer_goes_beside_its_content_tag_never_on_it(ws, recipes):
    _, plan = _plan(ws, recipes)
    reqs = build_requests(plan, ws, builder="k8s", push=True)
    for step in plan.chain:
        req = reqs[step.layer]
        assert req.builder == "k8s"
        assert req.push_to == f"{step.hash_tag}-unchecked"
        assert req.push_to not in (step.hash_tag, *step.moving_tags)
    assert all(r.push_to is None for r in build_requests(plan, ws, builder="k8s").values())
    assert all(r.builder is None for r in build_requests(plan, ws).values())


def test_after_layer_runs_once_tags_moved_and_before_the_next_layer_builds(ws, recipes):
    """What lets a remote builder start a layer: its parent was pushed by then."""
    engine = RecordingEngine()
    inv, plan = _plan(ws, recipes, engine)
    order: list[tuple[str, str]] = []
    real_build = engine.build

    def build(req, log, on_line=None):
        order.append(("build", req.labels["org.attnforge.layer"]))
        return real_build(req, log, on_line)

    engine.build = build  # type: ignore[method-assign]

    def after(step):
        assert engine.images.get(step.hash_tag), "after_layer ran before the content tag moved"
        order.append(("pushed", step.layer))

    execute(
        plan, engine, ws=ws, state=BuildState(inv),
        requests=build_requests(plan, ws, builder="k8s", push=True), after_layer=after,
    )  # fmt: skip
    layers = [s.layer for s in plan.chain]
    assert order == [(kind, layer) for layer in layers for kind in ("build", "pushed")]


def test_a_cached_layer_is_handed_to_after_layer_too(ws, recipes):
    engine = RecordingEngine()
    inv, plan = _plan(ws, recipes, engine)
    base = plan.chain[0]
    engine.images[base.hash_tag] = "sha256:old-base"
    inv, plan = _plan(ws, recipes, engine)
    seen: list[str] = []
    execute(
        plan, engine, ws=ws, state=BuildState(inv), requests=build_requests(plan, ws),
        after_layer=lambda step: seen.append(step.layer),
    )  # fmt: skip
    assert plan.chain[0].status == "cached" and seen == [s.layer for s in plan.chain]


# ----------------------------------------------------------------- the engine's side, recorded


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch):
    """A DockerEngine whose `docker` and `buildctl` are recording scripts, and a staged request."""
    log = tmp_path / "argv.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # buildctl: log argv, then write the metadata file and the tarball it was asked for
    _script(
        bin_dir / "buildctl",
        f'echo "buildctl $*" >> {log}\n'
        'while [ $# -gt 0 ]; do case "$1" in\n'
        '  --metadata-file) echo \'{"containerimage.config.digest": "sha256:remote"}\' > "$2";;\n'
        '  --output) case "$2" in type=docker,dest=*) echo tar > "${2#type=docker,dest=}";; esac;;\n'
        "esac; shift; done\n",
    )
    docker = _script(bin_dir / "docker", f'echo "docker $*" >> {log}\nexit "${{FAIL:-0}}"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    engine = DockerEngine.__new__(DockerEngine)
    engine.cli, engine.mode, engine.env = str(docker), "buildx", dict(os.environ)
    local: dict[str, str] = {}
    engine.image_id = lambda ref: local.get(ref)  # type: ignore[method-assign]

    def pull(ref, out):
        local[ref] = "sha256:pulled"
        return local[ref]

    engine.pull = pull  # type: ignore[method-assign]
    stage = tmp_path / "stage"
    (stage / "context").mkdir(parents=True)
    req = request(context=stage / "context", dockerfile=stage / "context" / "Dockerfile",
                  iidfile=stage / "iid")  # fmt: skip
    return engine, req, log, local


def test_buildctl_result_is_loaded_and_its_reported_id_is_the_image(recorded, tmp_path):
    engine, req, log, local = recorded
    local["sha256:remote"] = "sha256:remote"  # what `docker load` made
    req = BuildRequest(**{**req.__dict__, "builder": "tcp://b:1234"})
    with (tmp_path / "build.log").open("w") as out:
        assert engine.build(req, out) == "sha256:remote"
    calls = log.read_text().splitlines()
    assert calls[0].startswith("buildctl --addr tcp://b:1234 build")
    assert calls[1] == f"docker load -i {req.tarball}"


def test_buildctl_result_that_did_not_load_is_a_failed_build(recorded, tmp_path):
    engine, req, _, _ = recorded  # nothing named sha256:remote appears in the engine
    req = BuildRequest(**{**req.__dict__, "builder": "tcp://b:1234"})
    with (tmp_path / "build.log").open("w") as out, pytest.raises(BuildFailed):
        engine.build(req, out)


def test_a_pushed_result_is_pulled_back_for_the_smoke_checks(recorded, tmp_path):
    engine, req, log, local = recorded
    req = BuildRequest(**{**req.__dict__, "builder": "k8s", "push_to": "r/ns/x:cpu-a-unchecked"})
    with (tmp_path / "build.log").open("w") as out:
        assert engine.build(req, out) == "sha256:pulled"
    assert local == {"r/ns/x:cpu-a-unchecked": "sha256:pulled"}
    assert log.read_text().startswith("docker buildx build --builder k8s --output")


def test_a_failing_builder_is_a_failed_build(recorded, tmp_path, monkeypatch):
    engine, req, _, _ = recorded
    monkeypatch.setitem(engine.env, "FAIL", "3")
    req = BuildRequest(**{**req.__dict__, "builder": "k8s"})
    with (tmp_path / "build.log").open("w") as out, pytest.raises(BuildFailed, match="status 3"):
        engine.build(req, out)


def test_a_buildkitd_address_needs_buildctl(recorded, monkeypatch):
    engine = recorded[0]
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UserError, match="buildctl is not installed"):
        engine.check_builder("tcp://b:1234")


def test_a_builder_name_needs_the_buildx_plugin(recorded):
    engine = recorded[0]
    engine.mode = "classic"
    with pytest.raises(UserError, match="no buildx plugin"):
        engine.check_builder("k8s")


# ----------------------------------------------------------------- the command line


def test_builder_goes_with_the_docker_engine_only(tmp_path):
    proc = run_invoke(REPO, "build", "--arch", "cpu", "--engine", "podman", "--builder", "k8s")
    assert proc.returncode == 2
    assert "--builder goes with --engine docker" in proc.stderr and "Traceback" not in proc.stderr


def test_the_dry_run_shows_the_builders_command(tmp_path):
    proc = run_invoke(
        REPO, "build", "--arch", "cpu", "--dry-run", "--json", "--builder", "tcp://b:1234",
        "--namespace", "reg:5000/ns", "--push", "--ca-cert", "none",
        "--base-image", "attnforge-local/debian:bookworm",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    steps = [s for s in json.loads(proc.stdout)["steps"] if s["command"]]
    assert steps, "some layer should build in a fresh build folder"
    for s in steps:
        cmd = s["command"]
        assert cmd[1:4] == ["--addr", "tcp://b:1234", "build"]
        assert cmd[-1] == f"type=image,name={s['tag']}-unchecked,push=true"
