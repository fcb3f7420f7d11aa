"""The device-code smoke check on real AMDGPU code: shared libraries compiled by a real hipcc
(Debian experimental's ROCm 7.2.4, in the image `tools/setup.sh hip-tools` makes) with offload
bundles for chosen arches, read by the check as it runs inside an image (attnforge/image/
smoke_runner.py, which reads ELF and clang offload bundles without a GPU or ROCm tools).

The rehearsals' pytorch.org torch carries such a library as its libtorch_hip.so (tests/rehearsal.py);
here the check's verdicts on it are pinned down, planted defects included: the arch missing from
the bundle, and a variant recipes/arches.yaml marks harmful.
"""

from __future__ import annotations

import subprocess

import pytest

from attnforge.image import smoke_runner
from tests.e2e.test_cpu_stack import require_engine, unavailable
from tests.rehearsal import HIP_TOOLS_IMAGE, device_library

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def hipcc():
    require_engine()
    found = subprocess.run(["docker", "image", "inspect", HIP_TOOLS_IMAGE], capture_output=True)
    if found.returncode != 0:
        unavailable(f"no {HIP_TOOLS_IMAGE} image (tools/setup.sh hip-tools)",
                    f"no {HIP_TOOLS_IMAGE} image: run tools/setup.sh hip-tools")  # fmt: skip


def library(tmp_path, *arches: str):
    lib = tmp_path / "lib" / "libtorch_hip.so"
    lib.parent.mkdir()
    lib.write_bytes(device_library(tmp_path / "hip", list(arches)))
    return lib


def check(lib, arch: str, harmful: str = "") -> tuple[bool, str]:
    return smoke_runner.check_device_code(
        {"device_code": str(lib), "arch": arch, "harmful": harmful}
    )


def test_the_arch_in_the_bundle_passes_and_names_every_target(hipcc, tmp_path):
    lib = library(tmp_path, "gfx1151", "gfx1100")
    assert check(lib, "gfx1151") == (True, "libtorch_hip.so: gfx1100, gfx1151")
    assert check(lib, "gfx1100")[0]


def test_an_arch_missing_from_the_bundle_fails_naming_what_it_holds(hipcc, tmp_path):
    lib = library(tmp_path, "gfx1100")
    assert check(lib, "gfx1151") == (False, f"{lib} holds device code for gfx1100, not gfx1151")


def test_a_harmful_variant_in_the_bundle_fails(hipcc, tmp_path):
    lib = library(tmp_path, "gfx90a:xnack+")
    ok, detail = check(lib, "gfx90a", harmful="gfx90a:xnack+ gfx90a:xnack-")
    assert not ok and "is a gfx90a:xnack+ variant" in detail and "harmful" in detail, detail
