"""invoke doctor: rows from fake /sys, /proc and /dev trees, and a run on this very machine."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

from attnforge import doctor
from attnforge.doctor import (
    GIB,
    ArchInfo,
    Disk,
    EngineFacts,
    Facts,
    RecipeFacts,
    arches_from_tools,
    auth_files,
    diagnose,
    gfx_of_override,
    registry_auth,
    verdict,
)
from attnforge.recipes import load_recipes
from tests.conftest import REPO, run_invoke
from tests.fakehost import fake_host
from validate.host import fingerprint

RECIPES = RecipeFacts.of(load_recipes(REPO))
# KFD gfx_target_version: major*10000 + minor*100 + stepping.
TARGET = {"gfx1151": 110501, "gfx1100": 110000, "gfx942": 90402, "gfx1036": 100306,
          "gfx1152": 110502}  # fmt: skip
ENGINE_OK = EngineFacts("docker", True, "Docker 27.5.1 via /usr/bin/docker (buildx)",
                        cli="/usr/bin/docker", mode="buildx",
                        data_root="/var/lib/docker")  # fmt: skip


def host(tmp_path: Path, arch: str | None, kernel: str = "6.18.5", kfd: bool = True) -> Path:
    """A fake root: a CPU node, and a GPU node with its device nodes when arch is given."""
    return fake_host(tmp_path / "root", TARGET[arch] if arch else None, kernel,
                     kfd=kfd and bool(arch), render=bool(arch), fw_version="9")  # fmt: skip


def facts_for(tmp_path, arch, env=None, engine=ENGINE_OK, free_gib=500, **host_kw) -> Facts:
    fp = fingerprint(host(tmp_path, arch, **host_kw), environ=env or {})
    return Facts(
        fingerprint=fp, engine=engine,
        engine_disk=Disk("/var/lib/docker", int(free_gib * GIB), 1),
        build_disk=Disk("/tmp/build", int(free_gib * GIB), 1),
    )  # fmt: skip


def by_check(rows):
    return {r.check: r for r in rows}


def run(facts, arch=None, recipes=RECIPES):
    rows = diagnose(facts, recipes, arch)
    return by_check(rows), *verdict(facts, rows, recipes)


# ---------------------------------------------------------------------------- GPUs and arches


def test_strix_halo_on_an_old_kernel_builds_and_validates_with_a_kernel_warning(tmp_path):
    rows, text, code = run(facts_for(tmp_path, "gfx1151", kernel="6.18.2-arch1"))
    assert rows["gpu"].status == "ok" and "gfx1151 (KFD node 1, firmware 9)" in rows["gpu"].found
    arch = rows["arch gfx1151"]
    assert arch.status == "ok" and "rdna3.5" in arch.found and "default" in arch.found
    assert "source" in arch.found
    kernel = rows["kernel"]
    assert kernel.status == "warn" and "strix-halo-kernel" in kernel.found
    assert "6.18.4" in kernel.fix and "TheRock" in kernel.fix
    assert rows["/dev/kfd"].status == "ok" and rows["/dev/dri/renderD128"].status == "ok"
    assert rows["HSA_OVERRIDE_GFX_VERSION"].status == "ok"
    assert code == 0 and text.startswith("ready: you can build and validate stacks for gfx1151")


def test_a_fixed_kernel_matches_no_rule(tmp_path):
    rows, _, code = run(facts_for(tmp_path, "gfx1151", kernel="6.18.4"))
    assert rows["kernel"].status == "ok" and "no known-bad kernel rule" in rows["kernel"].found
    assert code == 0


def test_gfx1100_with_its_own_override_is_told_it_is_not_needed(tmp_path):
    env = {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}
    rows, _, code = run(facts_for(tmp_path, "gfx1100", env=env))
    hsa = rows["HSA_OVERRIDE_GFX_VERSION"]
    assert hsa.status == "warn" and "the GPU's own version: not needed" in hsa.found
    assert rows["kernel"].status == "ok"  # the Strix Halo rule is not about gfx1100
    assert code == 0


def test_gfx1100_with_another_arches_override_is_warned(tmp_path):
    env = {"HSA_OVERRIDE_GFX_VERSION": "11.0.1"}
    rows, _, _ = run(facts_for(tmp_path, "gfx1100", env=env))
    hsa = rows["HSA_OVERRIDE_GFX_VERSION"]
    assert hsa.status == "warn" and "loads gfx1101 code on gfx1100" in hsa.found
    assert "supported natively" in hsa.found and hsa.fix.startswith("unset it")


def test_gfx942_with_an_rdna_override_fails_with_the_rules_fix(tmp_path):
    env = {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}
    rows, text, code = run(facts_for(tmp_path, "gfx942", env=env))
    arch = rows["arch gfx942"]
    assert arch.status == "ok" and "cdna3" in arch.found
    # rocm-fa3 is MI300-only and builds here; the RDNA3 stack is made for AMD but not for CDNA.
    assert (
        "rocm-fa3" in arch.found.split("(not as")[0]
        and "rdna3-minimal" in arch.found.split("(not as")[1]
    )
    hsa = rows["HSA_OVERRIDE_GFX_VERSION"]
    assert hsa.status == "fail" and "hsa-override-crosses-major" in hsa.found
    assert "unset HSA_OVERRIDE_GFX_VERSION" in hsa.fix
    assert code == 1 and text.startswith(
        "you can build here, but not validate on this GPU (gfx942)"
    )


def test_an_empty_override_fails_on_a_gpu_host_citing_rocm_systems_5686(tmp_path):
    rows, _, code = run(facts_for(tmp_path, "gfx942", env={"HSA_OVERRIDE_GFX_VERSION": ""}))
    hsa = rows["HSA_OVERRIDE_GFX_VERSION"]
    assert hsa.status == "fail" and "empty" in hsa.found and "rocm-systems#5686" in hsa.fix
    assert code == 1


def test_an_empty_override_without_a_gpu_only_warns(tmp_path):
    rows, _, code = run(facts_for(tmp_path, None, env={"HSA_OVERRIDE_GFX_VERSION": ""}))
    assert rows["HSA_OVERRIDE_GFX_VERSION"].status == "warn" and code == 0


def test_an_unknown_rdna2_arch_is_unsupported_since_the_recipes_lack_gfx1030(tmp_path):
    rows, text, code = run(facts_for(tmp_path, "gfx1036"))
    arch = rows["arch gfx1036"]
    assert arch.status == "fail" and "unsupported" in arch.found
    assert "10.3.0" in arch.found and "no stack for gfx1030" in arch.found
    assert "ollama/ollama docs/gpu.md" in arch.found
    assert rows["HSA_OVERRIDE_GFX_VERSION"].status == "ok"  # no override would help
    assert code == 1 and "not validate on this GPU (gfx1036)" in text


def with_gfx1030(recipes: RecipeFacts) -> RecipeFacts:
    arches = dict(recipes.arches, gfx1030=ArchInfo("rdna2", "amd", "Navi 21", ("default",)))
    return dataclasses.replace(recipes, arches=arches)


def test_an_override_is_suggested_only_when_the_recipes_build_the_documented_neighbour(tmp_path):
    recipes = with_gfx1030(RECIPES)
    rows, _, code = run(facts_for(tmp_path, "gfx1036"), recipes=recipes)
    arch = rows["arch gfx1036"]
    assert arch.status == "warn" and "HSA_OVERRIDE_GFX_VERSION=10.3.0" in arch.fix
    assert "--arch gfx1030" in arch.fix
    hsa = rows["HSA_OVERRIDE_GFX_VERSION"]
    assert hsa.status == "warn" and "10.3.0" in hsa.found and code == 0
    rows, text, code = run(facts_for(tmp_path / "v", "gfx1036"), recipes=recipes)
    assert text == (
        "you can build here; this gfx1036 runs gfx1030 images only with "
        "HSA_OVERRIDE_GFX_VERSION=10.3.0, which AMD does not support"
    )
    env = {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
    rows, _, _ = run(facts_for(tmp_path / "set", "gfx1036", env=env), recipes=recipes)
    assert rows["HSA_OVERRIDE_GFX_VERSION"].status == "ok"


def test_gfx1152_is_unsupported_with_no_override_suggested(tmp_path):
    rows, _, code = run(facts_for(tmp_path, "gfx1152"))
    arch = rows["arch gfx1152"]
    assert arch.status == "fail" and "AMD publishes device-gfx1152 wheels" in arch.found
    assert "HSA_OVERRIDE_GFX_VERSION=" not in arch.fix and code == 1


def test_an_arch_nothing_is_documented_for_is_plainly_unsupported():
    row = doctor.arch_row("gfx1010", RECIPES, label="--arch")
    assert row.status == "fail" and "no documented override" in row.found


def test_an_nvidia_arch_is_a_fact_not_a_failure():
    row = doctor.arch_row("sm90", RECIPES, label="--arch")
    assert row.status == "info" and "stacks: none" in row.found


def test_every_documented_override_names_its_target_and_a_source():
    assert RECIPES.neighbours  # recipes/arches.yaml's neighbours reach the doctor
    for n in RECIPES.neighbours:
        assert n.source
        if n.override:
            assert gfx_of_override(n.override) == n.target
    assert gfx_of_override("9.0.10") == "gfx90a" and gfx_of_override("eleven") is None


def test_arch_option_on_another_gpu_says_validation_needs_that_host(tmp_path):
    rows, _, _ = run(facts_for(tmp_path, "gfx1151"), arch="gfx942")
    assert rows["arch gfx942"].status == "ok"
    assert rows["--arch"].status == "warn" and "needs a gfx942 host" in rows["--arch"].found


# ---------------------------------------------------------------------------- devices & groups


def test_a_gpu_without_dev_kfd_fails_with_the_device_flags(tmp_path):
    rows, text, code = run(facts_for(tmp_path, "gfx1151", kfd=False))
    kfd = rows["/dev/kfd"]
    assert kfd.status == "fail" and "--device=/dev/kfd" in kfd.fix
    assert code == 1 and "/dev/kfd" in text


def test_devices_the_user_cannot_open_and_missing_groups_are_named(tmp_path):
    facts = facts_for(tmp_path, "gfx1151")
    fp = facts.fingerprint
    fp["devices"] = [dict(d, readable=False, group="render") for d in fp["devices"]]
    fp["groups"], fp["uid"] = ["users"], 1000
    rows, _, _ = run(facts)
    kfd = rows["/dev/kfd"]
    assert kfd.status == "warn" and "not read/write for you (uid 1000)" in kfd.found
    assert "usermod -aG render" in kfd.fix
    groups = rows["groups"]
    assert groups.status == "warn" and "render: no" in groups.found
    fp["groups"] = ["render", "users"]
    assert run(facts)[0]["groups"].status == "ok"


def test_root_needs_no_group(tmp_path):
    facts = facts_for(tmp_path, "gfx1151")
    facts.fingerprint.update(groups=["root"], uid=0)
    facts.fingerprint["devices"] = [dict(d, group="render") for d in facts.fingerprint["devices"]]
    assert run(facts)[0]["groups"].status == "ok"


def test_real_device_modes_are_read_from_the_fake_tree(tmp_path):
    facts = facts_for(tmp_path, "gfx1151")
    kfd = next(d for d in facts.fingerprint["devices"] if d["path"].endswith("/kfd"))
    mode = stat.filemode(os.stat(kfd["path"]).st_mode)
    assert mode in run(facts)[0]["/dev/kfd"].found


# ---------------------------------------------------------------------------- no GPU, engine, disk


def test_no_gpu_and_a_working_engine_can_build_everything_and_validate_cpu(tmp_path):
    rows, text, code = run(facts_for(tmp_path, None))
    assert rows["gpu"].status == "warn" and "no AMD GPU" in rows["gpu"].found
    assert rows["/dev/kfd"].status == "info" and rows["groups"].status == "info"
    assert code == 0
    assert text == (
        "no AMD GPU: /sys/class/kfd has no GPU nodes; you can build and validate the cpu stack, "
        "and build (not validate) ROCm stacks"
    )


def test_no_gpu_is_fine_for_the_cpu_arch(tmp_path):
    rows, _, code = run(facts_for(tmp_path, None), arch="cpu")
    assert rows["gpu"].status == "info" and code == 0


def test_no_engine_means_nothing_can_be_built(tmp_path):
    down = EngineFacts("docker", False, "no Docker engine is reachable at the default socket",
                       hint="start one with `sudo systemctl start docker`")  # fmt: skip
    rows, text, code = run(facts_for(tmp_path, None, engine=down))
    assert rows["engine"].status == "fail" and "systemctl start docker" in rows["engine"].fix
    assert code == 1 and text.startswith("nothing can be built here: engine: docker not reachable")
    assert "no AMD GPU either" in text
    assert "the engine did not say where its own is" in rows["disk: engine"].found
    assert "did not say" not in run(facts_for(tmp_path / "up", None))[0]["disk: engine"].found


def test_a_docker_cli_without_buildkit_blocks_building(tmp_path):
    eng = dataclasses.replace(ENGINE_OK, cli=None, mode=None, cli_error="no docker CLI here "
                              "can use BuildKit", cli_hint="install docker-buildx")  # fmt: skip
    rows, text, code = run(facts_for(tmp_path, "gfx1151", engine=eng))
    assert rows["buildkit"].status == "fail" and rows["buildkit"].fix == "install docker-buildx"
    assert code == 1 and text.startswith("nothing can be built here")


def test_buildkit_host_and_podman_are_reported(tmp_path):
    facts = facts_for(tmp_path, None)
    facts.buildkit_host, facts.podman = "tcp://buildkitd:1234", "podman version 4.3.1"
    rows = run(facts)[0]
    assert rows["buildkit"].status == "ok" and "buildx plugin present" in rows["buildkit"].found
    assert "tcp://buildkitd:1234" in rows["BUILDKIT_HOST"].found
    assert '--builder "$BUILDKIT_HOST"' in rows["BUILDKIT_HOST"].found
    assert rows["podman"].found.startswith("installed: podman version 4.3.1")


@pytest.mark.parametrize(
    ("free", "arch", "status", "code"),
    [(10, None, "fail", 1), (50, None, "warn", 0), (50, "cpu", "ok", 0), (150, None, "ok", 0)],
)
def test_disk_fails_under_20_gib_and_warns_under_100_where_source_builds(
    tmp_path, free, arch, status, code
):
    rows, text, got = run(facts_for(tmp_path, "gfx1151", free_gib=free), arch=arch)
    assert rows["disk: engine"].status == status and got == code
    assert rows["disk: build dir"].status == "info"  # same filesystem: judged once
    if status == "fail":
        assert text.startswith("nothing can be built here: disk: engine")


def test_a_build_dir_on_another_filesystem_is_judged_on_its_own(tmp_path):
    facts = facts_for(tmp_path, None)
    facts.build_disk = Disk("/scratch/build", 5 * GIB, 2)
    rows, _, code = run(facts)
    assert rows["disk: engine"].status == "ok" and rows["disk: build dir"].status == "fail"
    assert code == 1


def test_a_remote_engines_disk_is_not_measured_here(tmp_path):
    facts = facts_for(
        tmp_path, None, engine=dataclasses.replace(ENGINE_OK, remote="tcp://gpu:2375")
    )
    rows = run(facts)[0]
    assert rows["disk: engine"].status == "info" and "tcp://gpu:2375" in rows["disk: engine"].found


def test_free_disk_measures_the_nearest_existing_parent(tmp_path):
    disk = doctor.free_disk(tmp_path / "not/yet/made")
    assert disk.free_bytes is not None and disk.free_bytes > 0
    assert disk.path.endswith("not/yet/made")


# ---------------------------------------------------------------------------- GPU tools, registry


def test_rocminfo_is_asked_when_sysfs_shows_no_gpu(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "rocminfo"
    tool.write_text("#!/bin/sh\necho '  Name:                    gfx1100'\n"
                    "echo '  Name:  amdgcn-amd-amdhsa--gfx1100'\necho 'gfx11-generic'\n")  # fmt: skip
    tool.chmod(0o755)
    arches, name = arches_from_tools({"PATH": str(bin_dir)})
    assert (arches, name) == (["gfx1100"], "rocminfo")
    facts = facts_for(tmp_path, None)
    facts.tool_arches, facts.tool = arches, name
    rows = run(facts)[0]
    assert rows["gpu"].status == "warn" and "rocminfo reports gfx1100" in rows["gpu"].found
    assert rows["arch gfx1100"].status == "ok"
    assert arches_from_tools({"PATH": str(tmp_path / "empty")}) == ([], None)


SECRET = "dXNlcjpodW50ZXIy"  # base64 of user:hunter2; must never be printed


@pytest.mark.parametrize(
    ("config", "host", "how", "detail"),
    [
        ({"credHelpers": {"123.dkr.ecr.us-east-1.amazonaws.com": "ecr-login"}},
         "123.dkr.ecr.us-east-1.amazonaws.com", "credHelper", "ecr-login"),
        ({"auths": {"https://index.docker.io/v1/": {"auth": SECRET}}}, "docker.io", "auth", None),
        ({"auths": {"ghcr.io": {}}, "credsStore": "pass"}, "ghcr.io", "credsStore", "pass"),
        ({"auths": {"ghcr.io": {"auth": SECRET}}}, "quay.io", "none", None),
    ],
)  # fmt: skip
def test_registry_logins_are_described_without_credentials(tmp_path, config, host, how, detail):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    auth = registry_auth(host, [path])
    assert auth.how == how and SECRET not in repr(auth)
    if detail:
        assert auth.detail == detail
    row = doctor.registry_row(auth)
    assert row.status == ("warn" if how == "none" else "ok") and SECRET not in repr(row)


def test_an_unreadable_registry_config_is_a_warning(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    auth = registry_auth("ghcr.io", [path])
    assert auth.how == "unreadable" and doctor.registry_row(auth).status == "warn"


def test_auth_files_follow_each_engines_lookup_order(tmp_path):
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": "/run/user/1000"}
    assert auth_files("docker", env) == [tmp_path / ".docker/config.json"]
    assert auth_files("docker", dict(env, DOCKER_CONFIG="/cfg")) == [Path("/cfg/config.json")]
    assert auth_files("podman", dict(env, REGISTRY_AUTH_FILE="/a.json")) == [
        Path("/a.json"), Path("/run/user/1000/containers/auth.json"),
        tmp_path / ".config/containers/auth.json", tmp_path / ".docker/config.json",
    ]  # fmt: skip


# ---------------------------------------------------------------------------- on this machine


def test_doctor_on_this_machine_says_what_it_found(tmp_path):
    """No GPU here: the verdict says so. The engine may or may not run: the row must agree with
    what connecting to it says, and the exit status with the rows."""
    from attnforge.engine import connect
    from attnforge.errors import UserError
    from attnforge.hostinfo import detect_amd_arches

    config = tmp_path / "docker"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"auths": {"ghcr.io": {"auth": SECRET}}}))
    env = dict(os.environ, DOCKER_CONFIG=str(config))
    proc = run_invoke(REPO, "doctor", "--json", "--registry", "ghcr.io", env=env)
    assert "Traceback" not in proc.stderr and SECRET not in proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    rows = {r["check"]: r for r in doc["rows"]}
    try:
        connect("docker")
        reachable = True
    except UserError:
        reachable = False
    assert rows["engine"]["status"] == ("ok" if reachable else "fail")
    assert rows["engine"]["found"].startswith("docker " + ("reachable" if reachable else "not"))
    assert rows["registry ghcr.io"]["found"].startswith("auth entry present")
    fails = [r for r in doc["rows"] if r["status"] == "fail"]
    assert proc.returncode == doc["exit_code"] == (1 if fails else 0)
    if not detect_amd_arches():
        # "no AMD GPU: ..." when it can build; "... no AMD GPU either (...)" after a blocker
        # such as a full disk, which this machine's own state may be.
        assert "/sys/class/kfd has no GPU nodes" in doc["verdict"]
        assert "no AMD GPU" in doc["verdict"]
        assert rows["gpu"]["status"] == "warn"
        if reachable and not fails:
            assert "build (not validate) ROCm stacks" in doc["verdict"]


def test_doctor_prints_a_table_and_the_verdict():
    proc = run_invoke(REPO, "doctor", "--arch", "cpu")
    assert "Traceback" not in proc.stderr
    text = " ".join(proc.stdout.split())
    assert "check" in text and "status" in text and "verdict:" in text
    assert "arch cpu" in text and "HSA_OVERRIDE_GFX_VERSION" in text


def test_an_unknown_engine_is_a_sentence():
    proc = run_invoke(REPO, "doctor", "--engine", "nope")
    assert proc.returncode == 2 and "unknown engine 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------- a torch in a venv


def test_a_torch_in_the_active_venv_points_at_verify_env(tmp_path):
    venv = tmp_path / "venv"
    (venv / "lib/python3.12/site-packages/torch-2.14.0+rocm10.1.0.dist-info").mkdir(parents=True)
    found = doctor.venv_torch({"VIRTUAL_ENV": str(venv)})
    assert found == doctor.VenvTorch(str(venv / "bin/python"), "2.14.0+rocm10.1.0")
    facts = dataclasses.replace(facts_for(tmp_path, "gfx1151"), venv_torch=found)
    rows, text, code = run(facts)
    row = rows["venv torch"]
    assert row.status == "info" and "torch 2.14.0+rocm10.1.0" in row.found
    assert row.fix.startswith(f"invoke verify-env --python {venv / 'bin/python'} --against ")
    assert code == 0  # information, never a failure


def test_no_venv_or_a_venv_without_torch_adds_no_row(tmp_path):
    (tmp_path / "venv/lib/python3.12/site-packages").mkdir(parents=True)
    assert doctor.venv_torch({}) is None
    assert doctor.venv_torch({"VIRTUAL_ENV": str(tmp_path / "venv")}) is None
    rows, _, _ = run(facts_for(tmp_path, "gfx1151"))
    assert "venv torch" not in rows
