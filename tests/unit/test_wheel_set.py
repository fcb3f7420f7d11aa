"""The coupled ROCm wheel set is one build: the wheel_set smoke check, against real installs.

Fake wheels (a few hundred bytes each, with real METADATA, WHEEL and RECORD) are built in a temp
wheelhouse and installed with `pip install --no-index --find-links` into throwaway venvs made by
this host's python3; the smoke runner then runs in each venv exactly as build.smoke sends it
(`python - <checks-json>`, source on stdin), with the check pytorch-wheels.yaml renders for
gfx1151. No network: every pip call is --no-index.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attnforge.image import smoke_runner
from attnforge.plan import resolve
from attnforge.recipes import load_recipes

REPO = Path(__file__).resolve().parents[2]
LABEL = "rocm10.1.0"
TORCH, VISION, AUDIO = f"2.14.0+{LABEL}", f"0.29.0a0+{LABEL}", f"2.11.0.3+{LABEL}"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def make_wheel(
    where: Path,
    name: str,
    version: str,
    requires: list[str] = (),
    extras: dict[str, list[str]] | None = None,
    files: dict[str, bytes] | None = None,
) -> Path:
    """A minimal but valid wheel: METADATA (Requires-Dist, Provides-Extra), WHEEL, RECORD."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    for extra, reqs in (extras or {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    content = dict(files or {f"{dist}/__init__.py": b""})
    content[f"{info}/METADATA"] = ("\n".join(lines) + "\n").encode()
    content[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: attnforge-test\n"
    content[f"{info}/WHEEL"] += b"Root-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in content.items())
    record += f"{info}/RECORD,,\n"
    path = where / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, d in content.items():
            zf.writestr(p, d)
        zf.writestr(f"{info}/RECORD", record)
    return path


def _torch_side(label: str, torch_v: str, vision_v: str, audio_v: str) -> list[tuple]:
    rel = label.removeprefix("rocm")
    return [
        # torch depends on rocm[libraries] (TheRock RELEASES.md); its device extra names the
        # arch wheel and the family wheel, as AMD's device-all names amd-torch-device-gfx11
        # (TheRock#6223).
        ("torch", torch_v, [f"rocm[libraries]=={rel}"], {
            "device-gfx1151": [f"amd-torch-device-gfx1151=={torch_v}",
                               f"amd-torch-device-gfx115x=={torch_v}"],
        }, {"torch/__init__.py": b""}),
        ("torchvision", vision_v, [f"torch=={torch_v}"], {
            "device-gfx1151": [f"amd-torchvision-device-gfx1151=={vision_v}"],
        }, {"torchvision/__init__.py": b""}),
        ("torchaudio", audio_v, [f"torch=={torch_v}"], {}, {"torchaudio/__init__.py": b""}),
        ("amd-torch-device-gfx1151", torch_v, [f"rocm-sdk-device-gfx1151=={rel}"], {},
         {"torch/.kpack/torch_gfx1151.kpack": b"KPACK"}),
        # The family wheel carries AOTriton's images for gfx1150-1153 (unsloth#8821).
        ("amd-torch-device-gfx115x", torch_v, [], {},
         {"torch/lib/aotriton.images/amd-gfx115x/flash/attn_fwd.aks2": b"AKS2"}),
        ("amd-torchvision-device-gfx1151", vision_v, [], {},
         {"torchvision/.kpack/torchvision_gfx1151.kpack": b"KPACK"}),
    ]  # fmt: skip


def _sdk_side(rel: str) -> list[tuple]:
    return [
        ("rocm", rel, [f"rocm-sdk-core=={rel}"], {
            "libraries": [f"rocm-sdk-libraries=={rel}"],
            "devel": [f"rocm-sdk-devel=={rel}"],
            "device-gfx1151": [f"rocm-sdk-device-gfx1151=={rel}"],
        }, {"rocm/__init__.py": b""}),
        ("rocm-sdk-core", rel, [], {}, {"_rocm_sdk_core/__init__.py": b""}),
        ("rocm-sdk-libraries", rel, [], {}, {"_rocm_sdk_libraries/__init__.py": b""}),
        ("rocm-sdk-devel", rel, [], {}, {"_rocm_sdk_devel/__init__.py": b""}),
        ("rocm-sdk-device-gfx1151", rel, [f"rocm-sdk-libraries=={rel}"], {},
         {"_rocm_sdk_libraries/.kpack/blas_lib_gfx1151.kpack": b"KPACK"}),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("wheelhouse")
    specs = _torch_side(LABEL, TORCH, VISION, AUDIO) + _sdk_side("10.1.0")
    # Another channel's builds: ROCm 7.14.0 and a 10.0.0 torchvision (TheRock#7183, #5374).
    specs += _sdk_side("7.14.0")
    # A later patch of the same release, and the next minor release (TheRock#7347).
    specs += _sdk_side("10.1.1") + _sdk_side("10.2.0")
    specs += [("torchvision", "0.28.0+rocm10.0.0", [], {
        "device-gfx1151": ["amd-torchvision-device-gfx1151==0.28.0+rocm10.0.0"],
    }, {"torchvision/__init__.py": b""})]  # fmt: skip
    for name, version, requires, extras, files in specs:
        make_wheel(where, name, version, requires, extras, files)
    return where


def _pip(py: Path, wheelhouse: Path, *args: str) -> subprocess.CompletedProcess:
    # This session's pip drives the temp venv (`pip --python`), so the venv needs no pip of
    # its own; --no-index keeps it offline.
    cmd = [sys.executable, "-m", "pip", "--python", str(py), "--disable-pip-version-check",
           "install", "--no-index", "--find-links", str(wheelhouse), *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _venv(tmp_path: Path) -> Path:
    python3 = shutil.which("python3")
    assert python3, "the tests need this host's python3"
    subprocess.run([python3, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    return tmp_path / "venv" / "bin" / "python"


def _install(tmp_path: Path, wheelhouse: Path, *reqs: str) -> Path:
    py = _venv(tmp_path)
    proc = _pip(py, wheelhouse, "--no-deps", *reqs)
    assert proc.returncode == 0, proc.stderr
    return py


@pytest.fixture(scope="module")
def check() -> dict:
    """The wheel_set check pytorch-wheels.yaml renders for gfx1151 on the default stack."""
    plan = resolve(load_recipes(REPO), "gfx1151", "default")
    step = next(s for s in plan.steps if s.layer == "pytorch-wheels")
    return next(c for c in step.smoke if "wheel_set" in c)


def run_checks(py: Path, checks: list[dict]) -> list[dict]:
    """The smoke runner in the venv, sent the way build.smoke sends it."""
    source = Path(smoke_runner.__file__).read_text()
    proc = subprocess.run(
        [str(py), "-", json.dumps(checks)], input=source, capture_output=True, text=True
    )
    assert proc.returncode in (0, 1), proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


MATCHING = [
    f"torch=={TORCH}", f"torchvision=={VISION}", f"torchaudio=={AUDIO}",
    f"amd-torch-device-gfx1151=={TORCH}", f"amd-torch-device-gfx115x=={TORCH}",
    f"amd-torchvision-device-gfx1151=={VISION}", "rocm==10.1.0", "rocm-sdk-core==10.1.0",
    "rocm-sdk-libraries==10.1.0", "rocm-sdk-devel==10.1.0", "rocm-sdk-device-gfx1151==10.1.0",
]  # fmt: skip


def _but(**swap: str) -> list[str]:
    """MATCHING with some wheels swapped for another version (or left out, with '')."""
    out = []
    for req in MATCHING:
        name = req.split("==")[0]
        key = name.replace("-", "_")
        if key not in swap:
            out.append(req)
        elif swap[key]:
            out.append(f"{name}=={swap[key]}")
    return out


def test_the_recipe_check_covers_the_coupled_set(check):
    words = check["wheel_set"].split()
    assert words[0] == f"torch=={TORCH}"
    for name in ("amd-torch-device-gfx1151", "amd-torchvision-device-gfx1151",
                 "rocm-sdk-core", "rocm-sdk-libraries", "rocm-sdk-device-gfx1151"):  # fmt: skip
        assert name in words
    assert check["extras"] == "torch[device-gfx1151] torchvision[device-gfx1151]"
    assert check["aotriton_arch"] == "gfx1151"


def test_the_recipes_one_resolver_call_installs_a_matching_set_that_passes(
    tmp_path, wheelhouse, check
):
    # The shape of dockerfiles/pytorch-wheels.Dockerfile's single pip call, with deps resolved.
    py = _venv(tmp_path)
    proc = _pip(
        py, wheelhouse,
        "rocm[libraries,devel,device-gfx1151]==10.1.0", f"torch[device-gfx1151]=={TORCH}",
        f"torchvision[device-gfx1151]=={VISION}", f"torchaudio=={AUDIO}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [result] = run_checks(py, [check])
    assert result["ok"], result["detail"]
    assert "of ROCm build +rocm10.1.0" in result["detail"]
    assert "amd-torch-device-gfx115x" in result["detail"]


def test_pinning_another_rocm_in_the_same_call_fails_in_the_resolver(tmp_path, wheelhouse):
    # torch==2.14.0+rocm10.1.0 requires rocm[libraries]==10.1.0: asking for ROCm 7.14.0 in the
    # same call must stop pip, not quietly install either build (TheRock#7183).
    py = _venv(tmp_path)
    proc = _pip(
        py, wheelhouse,
        "rocm[libraries,devel,device-gfx1151]==7.14.0", f"torch[device-gfx1151]=={TORCH}",
        f"torchvision[device-gfx1151]=={VISION}", f"torchaudio=={AUDIO}",
    )  # fmt: skip
    assert proc.returncode != 0
    assert "ResolutionImpossible" in proc.stderr or "conflict" in proc.stderr.lower()
    assert "rocm" in proc.stderr
    listed = subprocess.run(
        [str(py), "-c", "import importlib.metadata as m; print([d.metadata['Name'] for d in m.distributions()])"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "torch" not in listed and "rocm-sdk-core" not in listed, listed


def test_a_missing_family_wheel_fails_naming_it(tmp_path, wheelhouse, check):
    py = _install(tmp_path, wheelhouse, *_but(amd_torch_device_gfx115x=""))
    [result] = run_checks(py, [check])
    assert not result["ok"]
    assert (
        "the family device wheel amd-torch-device-gfx115x is not installed, but "
        "torch[device-gfx1151] requires it" in result["detail"]
    )
    # The images it would carry are missing too, said as such.
    assert "no installed wheel carries AOTriton kernel images for gfx1151" in result["detail"]
    assert "amd-gfx115x or amd-gfx11xx" in result["detail"]


def test_rocm_7_sdk_beside_a_rocm_10_torch_fails(tmp_path, wheelhouse, check):
    py = _install(tmp_path, wheelhouse, *_but(rocm_sdk_core="7.14.0"))
    [result] = run_checks(py, [check])
    assert not result["ok"]
    assert (
        "rocm-sdk-core is 7.14.0, from another ROCm build than torch 2.14.0+rocm10.1.0 "
        "(torch requires rocm ~=10.1.0, so 10.1.x from 10.1.0 on (TheRock#7347))"
        in result["detail"]
    )
    assert "rocm-sdk-libraries" not in result["detail"]  # only the wheel that is off is named


def test_a_torchvision_of_another_build_fails(tmp_path, wheelhouse, check):
    py = _install(tmp_path, wheelhouse, *_but(torchvision="0.28.0+rocm10.0.0"))
    [result] = run_checks(py, [check])
    assert not result["ok"]
    assert result["detail"].startswith(
        "torchvision is 0.28.0+rocm10.0.0, from another ROCm build than torch "
        "2.14.0+rocm10.1.0 (expected +rocm10.1.0)"
    )


def test_a_torch_without_the_device_extra_is_not_a_multi_arch_wheel(tmp_path, check):
    # A torch from another channel (PyPI's, or a per-family index) offers no [device-gfx1151].
    where = tmp_path / "wh"
    where.mkdir()
    make_wheel(where, "torch", TORCH, [], {}, {"torch/__init__.py": b""})
    py = _install(tmp_path, where, f"torch=={TORCH}")
    [result] = run_checks(py, [check])
    assert not result["ok"]
    assert "torch 2.14.0+rocm10.1.0 offers no [device-gfx1151] extra" in result["detail"]


def test_a_cpu_torch_is_no_rocm_build(tmp_path, check):
    where = tmp_path / "wh"
    where.mkdir()
    make_wheel(where, "torch", "2.14.0+cpu", [], {}, {"torch/__init__.py": b""})
    py = _install(tmp_path, where, "torch==2.14.0+cpu")
    [result] = run_checks(py, [dict(check, wheel_set="torch rocm-sdk-core")])
    assert not result["ok"]
    assert result["detail"] == "torch is 2.14.0+cpu, which is no ROCm build (no +rocm local label)"


def test_a_stray_device_wheel_of_another_build_is_caught_by_the_glob(tmp_path, wheelhouse, check):
    where = tmp_path / "wh"
    where.mkdir()
    make_wheel(where, "amd-torch-device-gfx11", "2.12.0+rocm7.14.0", [], {},
               {"torch/.kpack/torch_gfx11.kpack": b"K"})  # fmt: skip
    py = _install(tmp_path, wheelhouse, *MATCHING)
    assert _pip(py, where, "--no-deps", "amd-torch-device-gfx11").returncode == 0
    [result] = run_checks(py, [check])
    assert not result["ok"]
    assert (
        "amd-torch-device-gfx11 is 2.12.0+rocm7.14.0, from another ROCm build" in result["detail"]
    )


SDK = ("rocm", "rocm_sdk_core", "rocm_sdk_libraries", "rocm_sdk_devel", "rocm_sdk_device_gfx1151")


def test_a_later_patch_sdk_under_the_torch_label_is_valid(tmp_path, wheelhouse, check):
    # Stable torch requires rocm ~=X.Y.Z (TheRock#7347, pytorch#194102): 10.1.1 under
    # +rocm10.1.0 is what `pip install --upgrade rocm` gives, and it loads.
    py = _install(tmp_path, wheelhouse, *_but(**dict.fromkeys(SDK, "10.1.1")))
    [result] = run_checks(py, [check])
    assert result["ok"], result["detail"]
    assert "ROCm SDK 10.1.1, a later patch that torch's rocm ~=10.1.0 allows" in result["detail"]


def test_the_next_minor_sdk_under_the_torch_label_is_invalid(tmp_path, wheelhouse, check):
    py = _install(tmp_path, wheelhouse, *_but(**dict.fromkeys(SDK, "10.2.0")))
    [result] = run_checks(py, [check])
    assert not result["ok"]
    assert (
        "rocm-sdk-core is 10.2.0, from another ROCm build than torch 2.14.0+rocm10.1.0 "
        "(torch requires rocm ~=10.1.0" in result["detail"]
    )


def test_sdk_wheels_of_two_patches_are_not_one_release(tmp_path, wheelhouse, check):
    # Each fits torch's ~=10.1.0, but rocm pins its rocm-sdk-* parts exactly.
    py = _install(tmp_path, wheelhouse, *_but(rocm_sdk_core="10.1.1"))
    [result] = run_checks(py, [check])
    assert not result["ok"]
    assert "the ROCm SDK wheels are not one release (" in result["detail"]
    assert "rocm-sdk-core 10.1.1" in result["detail"]


@pytest.mark.parametrize(
    "version, release, fits",
    [
        ("10.1.0", "10.1.0", True),
        ("10.1.1", "10.1.0", True),
        ("10.1.12", "10.1.3", True),
        ("10.1.0", "10.1.1", False),  # an earlier patch than torch was built with
        ("10.2.0", "10.1.0", False),
        ("11.1.0", "10.1.0", False),
        ("10.2.0a20261007", "10.2.0a20261006", False),  # nightlies stay coupled exactly
        ("10.2.0a20261006", "10.2.0a20261006", True),
    ],
)
def test_the_sdk_rule_is_pep440_compatible_release(version, release, fits):
    assert smoke_runner._sdk_fits(version, release) is fits


# ------------------------------------------------------------------ pytorch.org's ROCm wheels
#
# The pytorch-org stack's shape (recipes/layers/pytorch-org.yaml): torch and torchvision carry
# the ROCm minor only (+rocm7.14), torch requires rocm[libraries,device-all]==7.14.* and
# triton-rocm (pytorch#190276, RFC pytorch#191688), and the rocm meta package 7.14.0.post1 is
# 7.14.0 without its self-dependency over rocm-sdk-* 7.14.0 wheels (TheRock#7461, #7362).

ORG_TORCH, ORG_VISION = "2.14.1+rocm7.14", "0.29.1+rocm7.14"


def _org_specs(rocm: str, sdk: str, self_edge: bool = False) -> list[tuple]:
    devices = [f"rocm-sdk-device-{a}=={sdk}" for a in ("gfx1151", "gfx942")]
    return [
        ("rocm", rocm, [f"rocm-sdk-core=={sdk}"] + ([f"rocm=={rocm}"] if self_edge else []), {
            "libraries": [f"rocm-sdk-libraries=={sdk}"],
            "device-all": devices,
        }, {"rocm/__init__.py": b""}),
        ("rocm-sdk-core", sdk, [], {}, {"_rocm_sdk_core/__init__.py": b""}),
        ("rocm-sdk-libraries", sdk, [], {}, {"_rocm_sdk_libraries/__init__.py": b""}),
        *[(d.split("==")[0], sdk, [], {}, {f"_{d.split('==')[0]}/x.kpack".replace("-", "_"): b"K"})
          for d in devices],
    ]  # fmt: skip


@pytest.fixture(scope="module")
def org_wheelhouse(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("org_wheelhouse")
    specs = [
        ("torch", ORG_TORCH, ["rocm[libraries,device-all]==7.14.*", "triton-rocm==3.8.0"], {},
         {"torch/__init__.py": b"",
          "torch/lib/aotriton.images/amd-gfx115x/flash/attn_fwd.aks2": b"AKS2"}),
        ("torchvision", ORG_VISION, [f"torch=={ORG_TORCH}"], {}, {"torchvision/__init__.py": b""}),
        ("triton-rocm", "3.8.0", [], {}, {"triton/__init__.py": b""}),
    ]  # fmt: skip
    specs += _org_specs("7.14.0.post1", "7.14.0")
    specs += _org_specs("7.15.0", "7.15.0")
    for name, version, requires, extras, files in specs:
        make_wheel(where, name, version, requires, extras, files)
    return where


@pytest.fixture(scope="module")
def org_check() -> dict:
    """The wheel_set check pytorch-org.yaml renders for gfx1151."""
    plan = resolve(load_recipes(REPO), "gfx1151", "pytorch-org")
    step = next(s for s in plan.steps if s.layer == "pytorch-org")
    return next(c for c in step.smoke if "wheel_set" in c)


def test_the_pytorch_org_check_holds_its_own_set(org_check):
    words = org_check["wheel_set"].split()
    assert words[:3] == [f"torch=={ORG_TORCH}", f"torchvision=={ORG_VISION}", "rocm==7.14.0.post1"]
    assert {"rocm-sdk-core", "rocm-sdk-libraries", "rocm-sdk-device-gfx1151"} <= set(words)
    assert "extras" not in org_check  # pytorch.org's torch has no device extras
    assert org_check["aotriton_arch"] == "gfx1151"


def test_the_pytorch_org_resolver_call_installs_a_set_that_passes(
    tmp_path, org_wheelhouse, org_check
):
    # The shape of dockerfiles/pytorch-org.Dockerfile's pip call, with deps resolved: torch's
    # device-all brings every SDK device wheel, and the post1 meta package sits over 7.14.0.
    py = _venv(tmp_path)
    proc = _pip(py, org_wheelhouse, f"torchvision=={ORG_VISION}", f"torch=={ORG_TORCH}",
                "rocm==7.14.0.post1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [result] = run_checks(py, [org_check])
    assert result["ok"], result["detail"]
    assert "of ROCm build +rocm7.14" in result["detail"]
    assert "ROCm SDK 7.14.0, which torch's rocm==7.14.* takes" in result["detail"]


def test_an_sdk_of_another_minor_under_a_pytorch_org_torch_fails(
    tmp_path, org_wheelhouse, org_check
):
    py = _install(tmp_path, org_wheelhouse, f"torch=={ORG_TORCH}", f"torchvision=={ORG_VISION}",
                  "rocm==7.15.0", "rocm-sdk-core==7.15.0", "rocm-sdk-libraries==7.15.0",
                  "rocm-sdk-device-gfx1151==7.15.0")  # fmt: skip
    [result] = run_checks(py, [org_check])
    assert not result["ok"]
    assert (
        "rocm-sdk-core is 7.15.0, from another ROCm build than torch 2.14.1+rocm7.14 "
        "(torch requires rocm==7.14.* (RFC pytorch#191688))" in result["detail"]
    )
    assert "rocm is 7.15.0" in result["detail"]


@pytest.mark.parametrize(
    "version, release, fits",
    [
        ("7.14.0", "7.14", True),  # pytorch.org's +rocm7.14 takes ==7.14.*
        ("7.14.1", "7.14", True),
        ("7.14.0.post1", "7.14", True),
        ("7.15.0", "7.14", False),
        ("7.14.0.post1", "7.14.0", True),  # a .postN is its release republished
        ("10.2.0a20261006", "7.14", False),
    ],
)
def test_the_sdk_rule_for_a_minor_label_and_post_releases(version, release, fits):
    assert smoke_runner._sdk_fits(version, release) is fits
