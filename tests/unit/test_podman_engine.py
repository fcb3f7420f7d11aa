"""Where Podman differs from Docker, as pure functions of what podman prints (docs/engines.md).

The engine itself is exercised against a real Podman in tests/e2e/test_podman.py.
"""

from __future__ import annotations

import io
import stat
from pathlib import Path

import pytest

from attnforge.engine import (
    BuildRequest,
    PodmanEngine,
    RegistryUnavailable,
    RunRequest,
    podman_build_argv,
    podman_image_id,
    podman_left_behind,
    podman_remote_verdict,
)
from attnforge.errors import UserError

# podman 4.3.1's words, copied from runs against the registry at 127.0.0.1:5000 (2026-11-24)
OCI_SINGLE_IMAGE = (
    'Error: parsing manifest blob "{\\"schemaVersion\\":2,\\"mediaType\\":\\"application/vnd.oci.'
    'image.manifest.v1+json\\"}" as a "application/vnd.oci.image.manifest.v1+json": Treating single'
    " images as manifest lists is not implemented"
)
MISSING_TAG = (
    'Error: reading image "docker://127.0.0.1:5000/ns/cpu:nope": reading manifest nope in '
    "127.0.0.1:5000/ns/cpu: manifest unknown: manifest unknown"
)
PLAIN_HTTP = (
    'Error: reading image "docker://127.0.0.1:5000/ns/cpu:cpu": pinging container registry '
    '127.0.0.1:5000: Get "https://127.0.0.1:5000/v2/": http: server gave HTTP response to HTTPS client'
)
REFUSED = (
    'Error: reading image "docker://127.0.0.1:9/x/base:cpu-1": pinging container registry '
    '127.0.0.1:9: Get "https://127.0.0.1:9/v2/": dial tcp 127.0.0.1:9: connect: connection refused'
)
RUNC_RLIMIT = (
    "Error: runc: runc create failed: unable to start container process: error during container "
    "init: error setting rlimits for ready process: error setting rlimit type 7: operation not "
    "permitted: OCI permission denied"
)


def test_podman_builds_in_dockers_image_format_and_keeps_its_layers():
    req = BuildRequest(
        context=Path("/ctx"), dockerfile=Path("/ctx/Dockerfile"), build_args={"A": "1"},
        labels={"org.attnforge.hash": "h"}, iidfile=Path("/s/iid"), secrets={"ca": Path("/ca.crt")},
    )  # fmt: skip
    argv = podman_build_argv(req, "/usr/bin/podman")
    # the OCI format would drop SHELL, which every Dockerfile here sets
    assert argv[:5] == ["/usr/bin/podman", "build", "--format", "docker", "--layers"]
    assert "--force-rm" in argv  # a failed build leaves no working container
    assert argv[argv.index("--secret") + 1] == "id=ca,src=/ca.crt"
    assert argv[argv.index("--iidfile") + 1] == "/s/iid"
    assert "--progress=plain" not in argv and argv[-1] == "/ctx"


@pytest.mark.parametrize(
    ("printed", "expected"),
    [
        ("fcad8e88\n", "sha256:fcad8e88"),  # podman image inspect --format {{.Id}}
        ("sha256:fcad8e88", "sha256:fcad8e88"),  # the iidfile already says it Docker's way
        ("", None),
        ("\n", None),
    ],
)
def test_podman_image_ids_are_written_as_docker_writes_them(printed, expected):
    assert podman_image_id(printed) == expected


@pytest.mark.parametrize(
    ("returncode", "output", "found"),
    [
        (0, "{}", True),
        (125, OCI_SINGLE_IMAGE, True),  # podman fetched the manifest, then would not show it
        (125, MISSING_TAG, False),
        (125, "Error: ... name unknown: repository name not known to registry", False),
    ],
)
def test_whether_the_registry_has_a_ref_is_read_from_podmans_answer(returncode, output, found):
    assert podman_remote_verdict("127.0.0.1:5000/ns/cpu:nope", returncode, output) is found


@pytest.mark.parametrize(
    ("ref", "output", "registry"),
    [("127.0.0.1:5000/ns/cpu:cpu", PLAIN_HTTP, "127.0.0.1:5000"), ("127.0.0.1:9/x/base:cpu-1", REFUSED, "127.0.0.1:9")],
)  # fmt: skip
def test_a_registry_that_does_not_say_is_one_sentence_naming_it(ref, output, registry):
    with pytest.raises(RegistryUnavailable) as err:
        podman_remote_verdict(ref, 125, output)
    assert err.value.message.startswith(f"registry {registry} did not answer for {ref}: ")
    assert "\n" not in err.value.message


@pytest.fixture
def podman_that_runc_refuses(tmp_path: Path) -> PodmanEngine:
    """A PodmanEngine whose CLI answers every run as runc does without CAP_SYS_RESOURCE."""
    cli = tmp_path / "podman"
    cli.write_text(f"#!/bin/sh\necho 'starting'\necho '{RUNC_RLIMIT}' >&2\nexit 126\n")
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    engine = PodmanEngine.__new__(PodmanEngine)  # no `podman info`: the CLI is the fake above
    engine.cli, engine.mode, engine.env, engine._pushed = str(cli), "podman", {}, {}
    return engine


def test_runc_refusing_the_containers_rlimits_is_a_sentence_with_the_fix(podman_that_runc_refuses):
    req = RunRequest(image="img", command=["true"])
    with pytest.raises(UserError) as err:
        podman_that_runc_refuses.run(req)
    assert "cannot start containers here" in err.value.message
    assert "default_ulimits" in err.value.hint and "tools/setup.sh podman" in err.value.hint
    with pytest.raises(UserError):
        podman_that_runc_refuses.run_streaming(req, io.StringIO())


def test_a_registry_digest_is_only_what_podmans_own_push_wrote(podman_that_runc_refuses):
    engine = podman_that_runc_refuses
    with pytest.raises(RegistryUnavailable):
        engine.registry_digest("127.0.0.1:5000/ns/cpu:cpu")
    engine._pushed["127.0.0.1:5000/ns/cpu:cpu"] = "sha256:" + "a" * 64
    assert engine.registry_digest("127.0.0.1:5000/ns/cpu:cpu") == "sha256:" + "a" * 64


def test_the_working_containers_an_interrupted_build_left_are_the_new_ones_buildah_named():
    """`podman ps -a --external` before and after an interrupted build (podman 4.3's listing):
    only Buildah's working containers that appeared are the build's; a container of the user's
    and a working container that was there before are not."""
    before = "aaa111 apps-working-container\nbbb222 my-dev-box\n"
    after = (
        "aaa111 apps-working-container\nbbb222 my-dev-box\nccc333 apps-working-container-1\n"
        "ddd444 debian-working-container\neee555 webserver\nfff666 working-container-notes\n"
    )
    assert podman_left_behind(before, after) == ["ccc333", "ddd444"]
    assert podman_left_behind(after, after) == []
