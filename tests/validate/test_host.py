"""The host fingerprint, read from fake /sys, /proc and /dev trees, and the known-bad host rules."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.fakehost import fake_host
from validate.host import fingerprint, host_warnings, hsa_override

STRIX_HALO = 110501  # KFD gfx_target_version of gfx1151
RULES = [
    {"id": "strix-halo-kernel", "arches": ["gfx1151"], "kernel_below": "6.18.4",
     "warning": "old kernel", "fix": "Linux 6.18.4", "source": "TheRock docs/faq.md"},
    {"id": "empty-override", "hsa_override": "empty", "warning": "empty override",
     "fix": "unset it", "source": "rocm-systems#5686"},
    {"id": "cross-major", "hsa_override": "crosses_major", "warning": "other generation",
     "fix": "match the GPU", "source": "ROCm docs"},
    {"id": "no-kfd", "device_access": "missing", "warning": "no /dev/kfd", "fix": "--device",
     "source": "container-toolkit#86"},
]  # fmt: skip


def host(tmp_path: Path, kernel="6.18.2-arch1", gfx=STRIX_HALO, kfd=True, driver=None) -> Path:
    return fake_host(tmp_path / "root", gfx, kernel, kfd=kfd, driver=driver)


def test_the_fingerprint_reads_kernel_gpu_driver_devices_and_groups(tmp_path):
    fp = fingerprint(host(tmp_path, driver="6.12.12"), environ={"ATTNFORGE_ENGINE": "docker"})
    assert fp["kernel"] == "6.18.2-arch1"
    assert fp["gpus"] == [{"arch": "gfx1151", "fw_version": "42", "node": "1"}]
    assert fp["amdgpu_driver"] == "6.12.12"
    assert fp["hsa_override_gfx_version"] == {"state": "unset"}
    kfd = fp["devices"][0]
    assert kfd["path"].endswith("/dev/kfd") and kfd["exists"] and kfd["mode"].startswith("-rw")
    assert [d["path"].rsplit("/", 1)[1] for d in fp["devices"]] == ["kfd", "renderD128"]
    assert fp["engine"] == "docker" and fp["uid"] == os.getuid()
    assert isinstance(fp["groups"], list)


def test_the_fingerprint_of_this_machine_reads_without_a_gpu():
    fp = fingerprint()
    assert fp["kernel"] == os.uname().release and isinstance(fp["gpus"], list)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, {"state": "unset"}),
        ("", {"state": "empty", "value": ""}),
        ("11.5.1", {"state": "set", "value": "11.5.1", "crosses_major": False}),
        ("11.0.0", {"state": "set", "value": "11.0.0", "crosses_major": False}),
        ("10.3.0", {"state": "set", "value": "10.3.0", "crosses_major": True}),
    ],
)
def test_hsa_override_is_unset_empty_or_a_value_flagged_when_it_crosses_a_major(value, expected):
    environ = {} if value is None else {"HSA_OVERRIDE_GFX_VERSION": value}
    assert hsa_override(environ, [{"arch": "gfx1151"}]) == expected


@pytest.mark.parametrize(
    ("kwargs", "environ", "ids"),
    [
        ({}, {}, ["strix-halo-kernel"]),
        ({"kernel": "6.18.4"}, {}, []),
        ({"kernel": "6.19.0-rc1"}, {}, []),
        ({"gfx": 110000}, {}, []),  # gfx1100 is not affected by the Strix Halo bug
        ({"kernel": "6.18.4"}, {"HSA_OVERRIDE_GFX_VERSION": ""}, ["empty-override"]),
        ({"kernel": "6.18.4"}, {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}, ["cross-major"]),
        ({"kernel": "6.18.4", "kfd": False}, {}, ["no-kfd"]),
    ],
)
def test_known_bad_hosts_are_warned_about_with_the_fix(tmp_path, kwargs, environ, ids):
    fp = fingerprint(host(tmp_path, **kwargs), environ=environ)
    warnings = host_warnings(fp, RULES)
    assert [w["id"] for w in warnings] == ids
    assert all(w["fix"] and w["source"] for w in warnings)


def test_a_rule_without_conditions_never_matches(tmp_path):
    fp = fingerprint(host(tmp_path))
    assert host_warnings(fp, [{"id": "x", "warning": "w", "fix": "f", "source": "s"}]) == []


def test_a_crash_on_a_known_bad_host_is_marked_host_suspect_in_the_report(tmp_path):
    from tests.validate.conftest import REPO, run_validate, schema_errors

    expect = tmp_path / "expect.json"
    expect.write_text(json.dumps({
        "stack": "cpu", "arch": "cpu", "expect": {},
        "host_rules": [{"id": "any-kernel", "kernel_below": "999", "warning": "every kernel is old",
                        "fix": "a newer one", "source": "this test"}],
        "aotriton": {"version": "0.13b", "experimental": True, "image_sets_knob": False},
    }))  # fmt: skip
    proc = run_validate(
        "env", "--only", "env", "--only", "fault.segfault", "--expect", str(expect),
        "--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md"),
        env={"VALIDATE_EXTRA_CHECKS": str(REPO / "tests/validate/fault_checks.py")},
    )  # fmt: skip
    doc = json.loads((tmp_path / "r.json").read_text())
    assert schema_errors(doc) == [], proc.stderr
    assert [w["id"] for w in doc["host"]["warnings"]] == ["any-kernel"]
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["fault.segfault"]["status"] == "crash"
    assert checks["fault.segfault"]["host_suspect"] == ["any-kernel"]
    assert "host_suspect" not in checks["env"]
    assert doc["aotriton_knob"]["needed"] is True and doc["aotriton_knob"]["ok"] is False
    md = (tmp_path / "r.md").read_text()
    assert "crash · host-suspect" in md and "every kernel is old. Fix: a newer one" in md
    assert "does not set `TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL`; this arch needs it" in md
    assert "HOST  every kernel is old" in proc.stdout
