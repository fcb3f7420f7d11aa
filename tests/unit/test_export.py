"""The export's pure core: which wheel file is the one installed, the files an installer reads,
and each way an environment can differ from a validated stack."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attnforge import export as core
from attnforge.image import envprobe
from tests.conftest import REPO


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    info = f"{name}-{version}.dist-info"
    rows = [f"{p},{_hash(d)},{len(d)}" for p, d in files.items()] + [f"{info}/RECORD,,"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, d in files.items():
            zf.writestr(p, d)
        zf.writestr(f"{info}/RECORD", "\n".join(rows) + "\n")
    return path


def manifest(*wheels: tuple[str, str], env: dict | None = None) -> dict:
    return {
        "arch": "cpu", "stack": "cpu", "image": "ns/cpu:cpu", "image_id": "sha256:" + "a" * 64,
        "validation": {"passed": True}, "env": env or {},
        "python": {"version": "3.11.2", "tag": "cp311", "platform": "linux-x86_64"},
        "wheels": [{"name": n, "version": v, "local": core.local_label(v),
                    "filename": f"{n}-{v}-py3-none-any.whl", "sha256": "b" * 64,
                    "source": "https://example.invalid/simple"} for n, v in wheels],
    }  # fmt: skip


def probe(*dists: tuple[str, str], problems: dict | None = None, env: dict | None = None) -> dict:
    return {
        "python": {"executable": "/u/venv/bin/python"},
        "env": env or {},
        "dists": [{"name": n, "version": v, "dist_info": f"/site/{n}-{v}.dist-info",
                   "record_problems": (problems or {}).get(n, [])} for n, v in dists],
    }  # fmt: skip


# ------------------------------------------------------------------ the wheel that was installed


def test_a_wheel_matches_the_installed_files_only_when_every_hash_agrees(tmp_path):
    files = {"pkg/__init__.py": b"x = 1\n", "pkg/core.py": b"y = 2\n"}
    wheel = make_wheel(tmp_path, "pkg", "1.0", files)
    installed = [[p, _hash(d)] for p, d in files.items()] + [
        ["pkg-1.0.dist-info/INSTALLER", _hash(b"pip\n")]
    ]
    assert core.wheel_matches(wheel, installed)
    installed[1][1] = _hash(b"y = 3\n")  # the same name and version, other bytes
    assert not core.wheel_matches(wheel, installed)


def test_candidate_wheels_go_by_normalised_name_and_version(tmp_path):
    make_wheel(tmp_path, "typing_extensions", "4.12.2", {"typing_extensions.py": b""})
    make_wheel(tmp_path, "typing_extensions", "4.12.1", {"typing_extensions.py": b""})
    found = core.candidate_wheels("Typing-Extensions", "4.12.2", [tmp_path])
    assert [p.name for p in found] == ["typing_extensions-4.12.2-py3-none-any.whl"]


def test_the_kernels_wheel_is_reproducible_and_labelled_by_its_sources(tmp_path):
    first = core.kernels_wheel(REPO, tmp_path / "a")
    second = core.kernels_wheel(REPO, tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()
    assert first.name.startswith("attnforge_kernels-0.1.0+src") and first.name.endswith(
        "-py3-none-any.whl"
    )
    with zipfile.ZipFile(first) as zf:
        names = zf.namelist()
    assert "attnforge_kernels/__init__.py" in names and "validate/__main__.py" in names
    assert not any("__pycache__" in n for n in names)


# ------------------------------------------------------------------ what an installer reads


def test_requirements_pin_every_wheel_with_its_hash():
    m = manifest(("torch", "2.13.0+cpu"), ("numpy", "2.4.6"))
    text = core.requirements_text(m)
    assert "torch==2.13.0+cpu \\\n    --hash=sha256:" + "b" * 64 in text
    assert "numpy==2.4.6 \\\n    --hash=sha256:" in text
    assert core.install_command(m) in text


def test_pylock_lists_each_wheel_by_path_and_sha256():
    lock = pytest.importorskip("tomllib").loads(core.pylock_text(manifest(("torch", "2.13.0+cpu"))))
    assert lock["lock-version"] == "1.0" and lock["requires-python"] == "==3.11.*"
    (pkg,) = lock["packages"]
    assert pkg["name"] == "torch" and pkg["version"] == "2.13.0+cpu"
    assert pkg["wheels"][0]["path"] == "wheels/torch-2.13.0+cpu-py3-none-any.whl"
    assert pkg["wheels"][0]["hashes"] == {"sha256": "b" * 64}


def test_the_env_file_exports_the_image_knobs_quoted():
    text = core.env_text(
        manifest(env={"TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": "1", "X_Y": "a b"})
    )
    assert "export TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1\n" in text
    assert "export X_Y='a b'\n" in text


# ------------------------------------------------------------------ verify-env's differences

VALIDATED = manifest(("torch", "2.14.0+rocm10.1.0"), ("rocm-sdk-device-gfx1151", "10.1.0"),
                     env={"TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": "1"})  # fmt: skip
KNOB = {"TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": "1"}


def test_the_probe_carries_knobs_but_not_the_images_native_build_folder(monkeypatch):
    """ATTNFORGE_NATIVE_DIR names where the validated image keeps its build of the kernels'
    native launch path: a venv keeps its own, so the export must not point it there."""
    monkeypatch.setenv("ATTNFORGE_NATIVE_DIR", "/opt/attnforge/native")
    monkeypatch.setenv("ATTNFORGE_NATIVE", "0")
    monkeypatch.setenv("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL", "1")
    env = envprobe.probe()["env"]
    assert env["ATTNFORGE_NATIVE"] == "0" and env["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] == "1"
    assert "ATTNFORGE_NATIVE_DIR" not in env


@pytest.mark.parametrize(
    "case, env_probe, kinds, words",
    [
        ("the same environment", probe(("torch", "2.14.0+rocm10.1.0"), ("rocm-sdk-device-gfx1151", "10.1.0"), env=KNOB),
         [], []),
        ("the installer's own tools are not compared", probe(("torch", "2.14.0+rocm10.1.0"), ("rocm-sdk-device-gfx1151", "10.1.0"), ("pip", "26.3"), ("setuptools", "80"), env=KNOB),
         [], []),
        ("a missing family device wheel", probe(("torch", "2.14.0+rocm10.1.0"), env=KNOB),
         ["missing"], ["rocm-sdk-device-gfx1151==10.1.0 is missing; fix: /u/venv/bin/python -m pip install --no-deps"]),
        ("a +rocm7 torch beside +rocm10 wheels", probe(("torch", "2.14.0+rocm7.13.0"), ("rocm-sdk-device-gfx1151", "10.1.0"), env=KNOB),
         ["local"], ["torch has local label +rocm7.13.0 where the validated stack has +rocm10.1.0", "--force-reinstall"]),
        ("another version", probe(("torch", "2.13.0+rocm10.1.0"), ("rocm-sdk-device-gfx1151", "10.1.0"), env=KNOB),
         ["version"], ["torch is 2.13.0+rocm10.1.0 where the validated stack has 2.14.0+rocm10.1.0"]),
        ("another arch's device wheel", probe(("torch", "2.14.0+rocm10.1.0"), ("rocm-sdk-device-gfx1151", "10.1.0"), ("rocm-sdk-device-gfx1100", "10.1.0"), env=KNOB),
         ["extra"], ["rocm-sdk-device-gfx1100 10.1.0 is installed but not in the validated stack; fix: /u/venv/bin/python -m pip uninstall -y rocm-sdk-device-gfx1100"]),
        ("damaged metadata", probe(("torch", "2.14.0+rocm10.1.0"), ("rocm-sdk-device-gfx1151", "10.1.0"), problems={"torch": ["torch/version.py does not match its recorded hash"]}, env=KNOB),
         ["record"], ["torch 2.14.0+rocm10.1.0: its dist-info RECORD does not match the files on disk (torch/version.py does not match its recorded hash)"]),
        ("the knob unset", probe(("torch", "2.14.0+rocm10.1.0"), ("rocm-sdk-device-gfx1151", "10.1.0")),
         ["knob"], ["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL is unset where the validated image sets '1'; fix: export TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1"]),
    ],
)  # fmt: skip
def test_each_difference_is_a_sentence_with_its_fix(case, env_probe, kinds, words):
    found = core.compare(VALIDATED, env_probe)
    assert [d.kind for d in found] == kinds, case
    text = " ".join(d.sentence for d in found)
    for w in words:
        assert w in text, case


def test_a_dist_info_without_readable_metadata_is_damaged():
    p = probe(("torch", "2.14.0+rocm10.1.0"), ("rocm-sdk-device-gfx1151", "10.1.0"), env=KNOB)
    p["dists"].append(
        {"name": None, "version": None, "dist_info": "/site/rocm_sdk_core-10.1.0.dist-info"}
    )
    (found,) = core.compare(VALIDATED, p)
    assert (
        found.kind == "metadata"
        and "/site/rocm_sdk_core-10.1.0.dist-info has no readable" in found.sentence
    )


def test_fixes_point_pip_at_the_export_wheels_when_there_is_an_export(tmp_path):
    (found,) = core.compare(VALIDATED, probe(("torch", "2.14.0+rocm10.1.0"), env=KNOB), tmp_path)
    assert (
        f"--no-index --find-links {tmp_path / 'wheels'} 'rocm-sdk-device-gfx1151==10.1.0'"
        in found.sentence
    )


# ------------------------------------------------------------------ the probe, on a real venv


@pytest.mark.slow
def test_a_real_venv_installs_from_the_pylock_and_its_damage_is_seen(tmp_path):
    """pip (26.3 here) installs the export's pylock.toml offline; the probe then finds the
    installed wheel, and a file changed on disk after installation."""
    wheels = tmp_path / "export" / core.WHEELS
    wheel = core.kernels_wheel(REPO, wheels)
    m = manifest()
    m["wheels"] = [{"name": core.KERNELS_DIST, "version": wheel.name.split("-")[1],
                    "filename": wheel.name, "sha256": core.sha256_file(wheel)}]  # fmt: skip
    (tmp_path / "export" / core.PYLOCK).write_text(core.pylock_text(m))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    env = {k: v for k, v in env.items() if not k.startswith("PIP_") or k == "PIP_CONFIG_FILE"}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install",
         "--no-index", "-r", core.PYLOCK], cwd=tmp_path / "export", env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr

    def probed() -> dict:
        run = subprocess.run([str(venv / "bin/python"), "-", "--verify", "--records"],
                             input=Path(envprobe.__file__).read_text(), capture_output=True,
                             text=True, cwd=tmp_path, check=True)  # fmt: skip
        return json.loads(run.stdout)

    p = probed()
    (dist,) = core.dists_of(p)[0]
    assert core.wheel_matches(wheel, dist.record)
    assert core.compare(m, p) == []
    site = Path(dist.dist_info).parent
    (site / "attnforge_kernels" / "device" / "configs.py").write_text(
        "# changed after installation\n"
    )
    (found,) = core.compare(m, probed())
    assert (
        found.kind == "record"
        and "attnforge_kernels/device/configs.py does not match its recorded hash" in found.sentence
    )


def test_the_readme_shows_the_install_command_the_export_prints():
    shown = core.install_command(manifest(), "~/attn-venv/bin/python", "build/export/cpu/cpu/")
    assert shown in (REPO / "README.md").read_text()


def test_a_wheel_built_in_the_image_comes_with_its_python_and_pip_command():
    m = manifest(("torch", "2.14.0a0+rocm"))
    m["python"]["version"] = "3.12.3"
    m["wheels"][0].update(filename="torch-2.14.0a0+rocm-cp312-cp312-linux_x86_64.whl",
                          source="built in the image (/opt/attnforge/wheels)")  # fmt: skip
    text = core.built_here(m)
    assert "# torch 2.14.0a0+rocm: cp312, linux_x86_64" in text
    assert (
        f"echo '{'b' * 64}  wheels/torch-2.14.0a0+rocm-cp312-cp312-linux_x86_64.whl' | sha256sum -c"
        in text
    )
    assert (
        "python3.12 -m pip install --no-deps wheels/torch-2.14.0a0+rocm-cp312-cp312-linux_x86_64.whl"
        in text
    )
    assert core.built_here(manifest(("numpy", "2.4.6"))) == ""  # from an index: nothing to add
