"""The resolver traps of AMD's wheels, rehearsed with real pip (`pip install --dry-run --report`)
on a local PEP 503 index (attnforge/mirror/layout.py) of metadata-only wheels of the real shape
(tests/rehearsal.py), resolving the very requirement lines the Dockerfiles hold
(attnforge/mirror/needs.py):

- a `+rocm10.x` torch beside `+rocm7.x` builds on one index: local labels compare segment by
  segment, and "rocm7" sorts above "rocm10" as a string (ROCm/TheRock#7183), so an unpinned
  `pip install --upgrade torch` moves to +rocm7.x; the layer's exact pins do not;
- the `rocm` meta package that lists itself (rocm[devel] requires rocm[libraries]; pytorch#193979,
  TheRock#7461) resolves;
- torchvision listed after torch (pytorch/test-infra#8564) resolves to the same set as before it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.mirror.layout import Manifest, sha256_of, write_index
from attnforge.mirror.needs import layer_needs
from attnforge.plan import Options, resolve
from attnforge.recipes import load_recipes
from tests.conftest import REPO
from tests.rehearsal import make_wheel

pytestmark = pytest.mark.slow

ARCH = "gfx1151"


def channel(dest: Path, rocm: str, torch: str, vision: str, audio: str) -> None:
    """Metadata-only wheels of one channel, with the Requires-Dist AMD's carry."""
    dev = f"device-{ARCH}"
    make_wheel(dest, "rocm", rocm, {"rocm_sdk/__init__.py": b""}, extras=["libraries", "devel", dev],
               requires=[f"rocm-sdk-core=={rocm}", f'rocm-sdk-libraries=={rocm} ; extra == "libraries"',
                         f'rocm-sdk-devel=={rocm} ; extra == "devel"', f'rocm[libraries]=={rocm} ; extra == "devel"',
                         f'rocm-sdk-device-{ARCH}=={rocm} ; extra == "{dev}"'])  # fmt: skip
    for part in ("core", "libraries", "devel", f"device-{ARCH}"):
        make_wheel(
            dest, f"rocm-sdk-{part}", rocm, {f"_rocm_sdk_{part.replace('-', '_')}/__init__.py": b""}
        )
    make_wheel(dest, "torch", torch, {"torch/__init__.py": b""}, extras=[dev],
               requires=[f"rocm[libraries]=={rocm}", f'amd-torch-device-{ARCH}=={torch} ; extra == "{dev}"'])  # fmt: skip
    make_wheel(dest, f"amd-torch-device-{ARCH}", torch, {"torch/.kpack/x": b""})
    make_wheel(dest, "torchvision", vision, {"torchvision/__init__.py": b""}, extras=[dev],
               requires=[f"torch=={torch}", f'amd-torchvision-device-{ARCH}=={vision} ; extra == "{dev}"'])  # fmt: skip
    make_wheel(dest, f"amd-torchvision-device-{ARCH}", vision, {"torchvision/.kpack/x": b""})
    make_wheel(
        dest, "torchaudio", audio, {"torchaudio/__init__.py": b""}, requires=[f"torch=={torch}"]
    )


@pytest.fixture(scope="module")
def shared_index(tmp_path_factory) -> Path:
    """One index holding a ROCm 10.0 and a ROCm 7.14 channel whose torch has the same release."""
    mirror = tmp_path_factory.mktemp("index")
    files = mirror / "files"
    files.mkdir()
    channel(files, "10.0.0", "2.13.0+rocm10.0.0", "0.28.0+rocm10.0.0", "2.11.0.2+rocm10.0.0")
    channel(files, "7.14.0", "2.13.0+rocm7.14.0", "0.28.0+rocm7.14.0", "2.11.0+rocm7.14.0")
    write_index(mirror, Manifest(files={p.name: sha256_of(p) for p in files.iterdir()}))
    return mirror


def resolved(index: Path, *reqs: str) -> dict[str, str]:
    """name -> version that pip would install for ``reqs`` from the index alone."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--disable-pip-version-check", "--report", "-", "--index-url", (index / "simple").as_uri(), *reqs],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    return {i["metadata"]["name"]: i["metadata"]["version"] for i in report["install"]}


def layer_lines() -> list[str]:
    """The rocm10.0 stack's pytorch-wheels requirements, read from its Dockerfile."""
    plan = resolve(load_recipes(REPO), ARCH, "rocm10.0", Options(base_image="img"))
    return layer_needs(REPO, plan.step("pytorch-wheels")).requirements


def test_an_unpinned_upgrade_moves_a_rocm10_torch_to_rocm7(shared_index):
    """The trap is real on a shared index: the string comparison of local labels prefers +rocm7."""
    assert resolved(shared_index, "torch")["torch"] == "2.13.0+rocm7.14.0"


def test_the_layers_exact_pins_keep_every_coupled_wheel_on_rocm10(shared_index):
    got = resolved(shared_index, *layer_lines())
    assert got["torch"] == "2.13.0+rocm10.0.0" and got["torchvision"] == "0.28.0+rocm10.0.0"
    assert got["torchaudio"] == "2.11.0.2+rocm10.0.0"
    assert {got[n] for n in got if n.startswith("rocm")} == {"10.0.0"}, got
    assert got[f"amd-torch-device-{ARCH}"] == "2.13.0+rocm10.0.0"


def test_the_rocm_meta_package_that_lists_itself_resolves(shared_index):
    got = resolved(shared_index, f"rocm[libraries,devel,device-{ARCH}]==10.0.0")
    assert set(got) == {
        "rocm",
        "rocm-sdk-core",
        "rocm-sdk-libraries",
        "rocm-sdk-devel",
        f"rocm-sdk-device-{ARCH}",
    }


def test_torchvision_after_torch_resolves_as_before_it(shared_index):
    lines = layer_lines()
    torch = next(i for i, r in enumerate(lines) if r.startswith("torch["))
    vision = next(i for i, r in enumerate(lines) if r.startswith("torchvision["))
    assert torch < vision  # the Dockerfile's order: torchvision after torch
    swapped = list(lines)
    swapped[torch], swapped[vision] = swapped[vision], swapped[torch]
    assert resolved(shared_index, *lines) == resolved(shared_index, *swapped)
