"""The hip_runtime smoke kind: one HIP runtime per process (Triton 3.9 refuses to mix ROCm
installations). The in-image logic is read on planted trees and /proc/<pid>/maps texts; the
files are not ELF (the check reads paths, links and contents, never loads them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.image import smoke_runner as sr
from attnforge.plan import resolve, stack_fits
from attnforge.recipes import load_recipes
from tests.conftest import REPO

STEM = "amdhip64"


def _lib(path: Path, content: bytes = b"runtime A") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def _link(path: Path, target: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


@pytest.fixture
def image(tmp_path):
    """An image's tree: TheRock's SDK wheel in site-packages and /opt/rocm linked at its root,
    as the rocm-sdk layer makes it."""
    site = tmp_path / "usr/lib/python3/site-packages"
    sdk = _lib(site / "_rocm_sdk_core/lib/libamdhip64.so.7.2.0")
    _link(site / "_rocm_sdk_core/lib/libamdhip64.so.7", sdk)
    _link(site / "_rocm_sdk_core/lib/libamdhip64.so", sdk)
    _link(tmp_path / "opt/rocm", site / "_rocm_sdk_core")
    _lib(site / "torch/lib/libtorch_hip.so", b"not a runtime")
    return tmp_path, site, sdk


def _scan(root: Path, site: Path):
    dirs = sr.runtime_dirs([str(site)], {"ROCM_PATH": str(root / "opt/rocm")})
    return sr.merge_identical(sr.runtimes_on_disk(dirs, STEM), sr.file_digest)


def test_maps_text_names_each_mapped_runtime_once():
    maps = (
        "7f00-7f10 r--p 00000000 08:01 12 /sp/_rocm_sdk_core/lib/libamdhip64.so.7.2.0\n"
        "7f10-7f20 r-xp 00010000 08:01 12 /sp/_rocm_sdk_core/lib/libamdhip64.so.7.2.0\n"
        "7f20-7f30 r--p 00000000 08:01 13 /opt/rocm-7.14.0/lib/libamdhip64.so.7 (deleted)\n"
        "7f30-7f40 r--p 00000000 08:01 14 /sp/torch/lib/libamdhip64_helper.so\n"
        "7f40-7f50 rw-p 00000000 00:00 0 [heap]\n"
        "7f50-7f60 r--p 00000000 08:01 15 /usr/lib/libhiprtc.so.7\n"
    )
    assert sr.mapped_libraries(maps, STEM) == [
        "/sp/_rocm_sdk_core/lib/libamdhip64.so.7.2.0",
        "/opt/rocm-7.14.0/lib/libamdhip64.so.7",
    ]


def test_one_sdk_reached_by_links_is_one_runtime(image):
    root, site, sdk = image
    on_disk = _scan(root, site)
    assert list(on_disk) == [str(sdk)]
    ok, detail = sr.judge_hip_runtime(STEM, on_disk, [str(sdk)], str(sdk), None)
    assert ok, detail
    assert detail == (
        f"one libamdhip64: {sdk} (the file rocm_sdk names); no GPU here, no Triton kernel launched"
    )


def test_two_runtimes_in_one_image_fail_naming_both_paths(image):
    root, site, sdk = image
    # /opt/rocm-7.14.0 beside the wheels, with ROCM_PATH at it: a second SDK Triton can find
    other = _lib(root / "opt/rocm-7.14.0/lib/libamdhip64.so.7", b"runtime B")
    dirs = sr.runtime_dirs([str(site)], {"ROCM_PATH": str(root / "opt/rocm-7.14.0")})
    on_disk = sr.merge_identical(sr.runtimes_on_disk(dirs, STEM), sr.file_digest)
    assert sorted(on_disk) == sorted([str(sdk), str(other)])
    ok, detail = sr.judge_hip_runtime(STEM, on_disk, [str(sdk)], str(sdk), None)
    assert not ok
    assert detail.startswith("two different libamdhip64 where torch and Triton could each load one")
    assert str(other) in detail and str(site / "_rocm_sdk_core/lib") in detail
    assert "refuses to mix ROCm installations" in detail


def test_a_byte_identical_copy_is_the_same_runtime(image):
    root, site, sdk = image
    copy = _lib(root / "opt/rocm-copy/lib/libamdhip64.so", sdk.read_bytes())
    dirs = sr.runtime_dirs([str(site)], {"ROCM_PATH": str(root / "opt/rocm-copy")})
    on_disk = sr.merge_identical(sr.runtimes_on_disk(dirs, STEM), sr.file_digest)
    assert len(on_disk) == 1 and str(copy) in next(iter(on_disk.values()))


def test_torch_loading_another_runtime_than_rocm_sdk_names_fails():
    on_disk = {
        "/sp/_rocm_sdk_core/lib/libamdhip64.so.7": ["/sp/_rocm_sdk_core/lib/libamdhip64.so.7"]
    }
    ok, detail = sr.judge_hip_runtime(
        STEM,
        on_disk,
        ["/sp/torch/lib/libamdhip64.so"],
        "/sp/_rocm_sdk_core/lib/libamdhip64.so.7",
        None,
    )
    assert not ok
    assert detail == (
        "torch loaded /sp/torch/lib/libamdhip64.so but rocm_sdk.find_libraries('amdhip64') names "
        "/sp/_rocm_sdk_core/lib/libamdhip64.so.7: Triton 3.9 then refuses to mix ROCm installations"
    )


@pytest.mark.parametrize(
    ("mapped", "launch", "expected"),
    [
        ([], None, "import torch mapped no libamdhip64: not a ROCm torch, or it failed to load"),
        (["/a/libamdhip64.so", "/b/libamdhip64.so"], None,
         "2 libamdhip64 mapped into one process: /a/libamdhip64.so and /b/libamdhip64.so"),
        (["/a/libamdhip64.so"], "RuntimeError: refusing to mix ROCm installations",
         "a Triton kernel after import torch failed: RuntimeError: refusing to mix ROCm installations"),
    ],
)  # fmt: skip
def test_what_the_process_shows_fails_in_one_sentence(mapped, launch, expected):
    ok, detail = sr.judge_hip_runtime(STEM, {}, mapped, None, launch)
    assert (ok, detail) == (False, expected)


def test_a_launched_kernel_on_the_sdks_runtime_passes():
    ok, detail = sr.judge_hip_runtime(STEM, {"/a/libamdhip64.so": ["/a/libamdhip64.so"]},
                                      ["/a/libamdhip64.so"], "/a/libamdhip64.so", "ok")  # fmt: skip
    assert ok and detail.endswith("; one Triton kernel ran")


def test_the_runner_runs_the_kind_in_a_real_process():
    """This venv's CPU torch maps no HIP runtime: the check runs `import torch` in its own
    process and fails, naming why (the wiring the image uses, minus a ROCm torch)."""
    spec = [{"name": "one HIP runtime", "hip_runtime": STEM}]
    proc = subprocess.run(
        [sys.executable, "-", json.dumps(spec)],
        input=Path(sr.__file__).read_text(), capture_output=True, text=True, timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["ok"] is False
    assert result["detail"].startswith("import torch mapped no libamdhip64")


def test_every_amd_stack_checks_for_one_hip_runtime():
    recipes = load_recipes(REPO)
    amd = [n for n, s in recipes.stacks.items() if stack_fits(s, recipes.arches["gfx1151"])]
    assert {"default", "source", "pytorch-org", "pytorch-org2.15", "nightly"} <= set(amd)
    for name in amd:
        layers = [e.layer for e in recipes.stacks[name].entries()]
        checks = [c.hip_runtime for layer in layers for c in recipes.layers[layer].smoke]
        assert STEM in checks, name
    # and the plan hands it to the image's runner as rendered
    plan = resolve(recipes, "gfx1151", "pytorch-org2.15")
    assert {"name": "one HIP runtime in the process, the one rocm_sdk names (Triton 3.9)",
            "hip_runtime": STEM} in plan.step("pytorch-org").smoke  # fmt: skip
