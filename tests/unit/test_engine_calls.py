"""Every container engine call goes through attnforge/engine.py, so DOCKER_HOST, the docker
context and --engine podman hold everywhere: the doctor's and pins.check's questions are asked
of the engine `connect` gives, never of a `docker` found on PATH."""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass, field

import pytest

from attnforge import doctor, engine
from attnforge.pins import upstream as pins
from tests.conftest import REPO

# a docker/podman command line, the Docker SDK, or a look for either client on PATH
DIRECT = re.compile(
    r"""\[\s*["'](docker|podman)["']|^\s*(import|from)\s+docker\b|which\(\s*["'](docker|podman)["']"""
    r"""|\.client\.(info|images|containers|version|ping)\b"""
)


def test_no_module_but_engine_py_calls_docker_or_podman():
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in sorted((REPO / "attnforge").rglob("*.py"))
        if path.name != "engine.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if DIRECT.search(line) and 'argv(["docker"]' not in line.replace(" ", "")
    ]
    assert found == []


def test_the_pattern_catches_what_it_is_for():
    for line in ('subprocess.run(["docker", "image", "inspect", ref])', "import docker",
                 'shutil.which("podman")', "eng.client.info().get('DockerRootDir')"):  # fmt: skip
        assert DIRECT.search(line), line


@dataclass
class FakeEngine:
    """What `connect` returns, recorded: the questions asked of it."""

    name: str = "docker"
    digests: dict[str, list[str]] = field(default_factory=dict)
    root: str | None = "/srv/docker"
    cli: str = "/usr/bin/docker"
    mode: str = "buildx"
    env: dict[str, str] = field(default_factory=dict)
    asked: list[tuple[str, str]] = field(default_factory=list)

    def describe(self) -> str:
        return f"{self.name} (fake)"

    def repo_digests(self, ref: str) -> list[str]:
        self.asked.append(("repo_digests", ref))
        return self.digests.get(ref, [])

    def data_root(self) -> str | None:
        self.asked.append(("data_root", ""))
        return self.root


@pytest.fixture
def connected(monkeypatch):
    """engine.connect by name -> a FakeEngine; the names asked for are recorded."""
    made: dict[str, FakeEngine] = {}

    def connect(name: str) -> FakeEngine:
        made[name] = made.get(name) or FakeEngine(
            name, {"ubuntu:24.04": ["ubuntu@sha256:" + "a" * 64, "docker.io/ubuntu@sha256:b"]}
        )
        return made[name]

    monkeypatch.setattr(engine, "connect", connect)
    monkeypatch.setattr(engine, "pick_docker_cli", lambda: ("/usr/bin/docker", "buildx"))
    return made


@pytest.mark.parametrize("name", ["docker", "podman"])
def test_pins_asks_the_chosen_engine_for_a_base_images_digest(connected, name):
    digest_of = pins.engine_digest(name)
    assert connected == {}  # nothing is connected until a digest is asked for
    assert digest_of("ubuntu:24.04") == "ubuntu@sha256:" + "a" * 64
    assert digest_of("debian:bookworm") is None
    assert list(connected) == [name]
    assert connected[name].asked == [("repo_digests", "ubuntu:24.04"),
                                     ("repo_digests", "debian:bookworm")]  # fmt: skip


def test_pins_without_a_reachable_engine_knows_no_digest(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nothing.sock")
    digest_of = pins.engine_digest("docker")
    assert digest_of("ubuntu:24.04") is None  # the engine DOCKER_HOST names did not answer


@pytest.mark.parametrize("name", ["docker", "podman"])
def test_the_doctor_reads_the_data_root_from_the_engine(connected, name):
    facts = doctor.gather_engine(name, {})
    assert facts.reachable and facts.description == f"{name} (fake)"
    assert facts.data_root == "/srv/docker"
    assert ("data_root", "") in connected[name].asked


def test_the_doctor_names_the_docker_host_that_did_not_answer(monkeypatch, tmp_path):
    where = f"unix://{tmp_path}/nothing.sock"
    monkeypatch.setenv("DOCKER_HOST", where)
    facts = doctor.gather_engine("docker", {"DOCKER_HOST": where})
    assert not facts.reachable and where in facts.description
    assert f"DOCKER_HOST is set to {where}" in facts.hint


def test_podman_version_asks_the_podman_on_the_given_path(tmp_path):
    assert engine.podman_version(str(tmp_path)) is None  # not installed there
    fake = tmp_path / "podman"
    fake.write_text("#!/bin/sh\necho 'podman version 9.9.9'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    assert engine.podman_version(str(tmp_path)) == "podman version 9.9.9"
    assert doctor.podman_version({"PATH": str(tmp_path)}) == "podman version 9.9.9"
