"""Engine requests are values: what a build or run would execute, before anything executes."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.engine import BuildRequest, RunRequest
from attnforge.errors import UserError
from attnforge.validation import device_flags


def request(**kw):
    base = dict(
        context=Path("/ctx"), dockerfile=Path("/ctx/Dockerfile"), build_args={"B": "2", "A": "1"},
        labels={"org.attnforge.hash": "h"}, iidfile=Path("/tmp/iid"), secrets={"ca": Path("/etc/ca.crt")},
    )  # fmt: skip
    base.update(kw)
    return BuildRequest(**base)


def test_classic_buildkit_build_argv():
    argv = request().argv(["/usr/bin/docker"], "classic")
    assert argv[:3] == ["/usr/bin/docker", "build", "--progress=plain"]
    assert argv[-1] == "/ctx"
    # sorted args, the label, and the CA as a BuildKit secret rather than a file in the context
    assert argv[argv.index("--build-arg") + 1] == "A=1"
    assert "--secret" in argv and "id=ca,src=/etc/ca.crt" in argv
    assert "--iidfile" in argv


def test_buildx_loads_the_result_into_the_engine():
    argv = request().argv(["docker"], "buildx")
    assert argv[:4] == ["docker", "buildx", "build", "--load"]


def test_podman_build_argv():
    assert request(secrets={}).argv(["podman"], "podman")[:2] == ["podman", "build"]


def test_run_request_renders_rocm_device_access():
    req = RunRequest(
        image="img", command=["python3", "-m", "validate"], devices=["/dev/kfd", "/dev/dri"],
        groups=["video", "render"], extra=["--ipc=host"], mounts=[(Path("/r"), "/out", False)],
    )  # fmt: skip
    argv = req.argv(["docker"])
    assert argv[:3] == ["docker", "run", "--rm"]
    assert ["--device", "/dev/kfd"] == argv[3:5] and "--group-add" in argv
    assert argv[-4:] == ["img", "python3", "-m", "validate"]
    assert "/r:/out" in argv


def test_rocm_without_kfd_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="/dev/kfd.*not found.*no ROCm GPU driver"):
        device_flags("amd", dev_root=tmp_path)


def test_rocm_with_kfd_gets_devices_groups_and_ipc(tmp_path):
    (tmp_path / "kfd").touch()
    (tmp_path / "dri").mkdir()
    flags = device_flags("amd", dev_root=tmp_path)
    assert flags["devices"] == ["/dev/kfd", "/dev/dri"] and "render" in flags["groups"]
    assert "--ipc=host" in flags["extra"]


def test_nvidia_gets_gpus_and_cpu_gets_nothing():
    assert "--gpus" in device_flags("nvidia")["extra"]
    assert device_flags("cpu") == {"devices": [], "groups": [], "extra": []}


def test_publish_pushes_each_layer_of_the_lineage_and_the_stack_tag_last():
    from attnforge.cli.publish import publish_refs

    refs = publish_refs([["base", "aaa"], ["validate", "bbb"]], "cpu", "cpu", "ns")
    assert refs == [
        ("ns/base:cpu-aaa", ["base:cpu-aaa", "base:cpu"]),
        ("ns/validate:cpu-bbb", ["validate:cpu-bbb", "validate:cpu", "cpu:cpu"]),
    ]


def test_a_failed_buildkit_log_is_cut_to_the_failing_steps_own_output():
    from attnforge.build import failure_tail

    log = "\n".join(
        [
            "#5 [1/2] FROM base",
            "#5 0.1 ok",
            "#6 [2/2] RUN pip install x",
            "#6 0.4 Collecting x",
            "#6 1.2 ERROR: No matching distribution found for x==0.0.1",
            "#6 ERROR: executor failed running [/bin/sh -c pip install x]: exit code: 1",
            "------",
            " > [2/2] RUN pip install x:",
        ]
    )
    assert failure_tail(log) == [
        "Collecting x",
        "ERROR: No matching distribution found for x==0.0.1",
    ]
    assert failure_tail("plain\nlog\nlines", n=2) == ["log", "lines"]
