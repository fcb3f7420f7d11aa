"""The image confirms what the recipe inferred: attnforge/observe.py reads a torch tree's
own files into the versions manifest, the `observe` smoke check says in one sentence where the
image contradicts the recipe, and `invoke pins.update --observed` proposes the corrected recipe.
Planted: a torch whose lib/ holds AOTriton 0.13.0 where the recipe inferred 0.14.2b."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge import observe
from attnforge.image import smoke_runner as sr
from attnforge.pins import update as pins_update
from attnforge.recipes import load_recipes
from tests.conftest import REPO, run_invoke

OBSERVE = REPO / "attnforge/observe.py"
BUNDLE = (
    b"\x7fELF...__CLANG_OFFLOAD_BUNDLE__\x02\x00\x00\x00host-x86_64-unknown-linux-gnu-\x00"
    b"hipv4-amdgcn-amd-amdhsa--gfx1151\x00\x00hipv4-amdgcn-amd-amdhsa--gfx1100\x00"
)


def _torch_tree(site: Path, aotriton: str = "0.13.0") -> Path:
    torch = site / "torch"
    (torch / "lib").mkdir(parents=True)
    (torch / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.15.0'\n"
        "hip: Optional[str] = '7.14.60850'\ncuda: Optional[str] = None\n"
    )
    real = torch / "lib" / f"libaotriton_v2.so.{aotriton}"
    real.write_bytes(b"not an ELF")
    (torch / "lib" / "libaotriton_v2.so").symlink_to(real.name)
    (torch / "lib" / "libtorch_hip.so").write_bytes(b"\x00" * 100 + BUNDLE + b"\x00" * 100)
    return torch


@pytest.fixture
def image(tmp_path):
    """A torch tree and the manifest a pytorch-source build wrote, after observe.py ran."""
    site = tmp_path / "site-packages"
    _torch_tree(site)
    manifest = tmp_path / "versions.json"
    manifest.write_text(json.dumps({"pytorch-source": {"PYTORCH_BUILD_VERSION": "2.15.0"}}))
    proc = subprocess.run(
        [sys.executable, str(OBSERVE), str(manifest)], capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=str(site)), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return manifest


def test_the_facts_are_read_from_the_files(tmp_path):
    torch = _torch_tree(tmp_path / "site")
    facts = observe.read_facts(str(torch))
    assert facts["aotriton"] == {
        "version": "0.13.0", "tag": "0.13b",
        "file": str(torch / "lib" / "libaotriton_v2.so.0.13.0"),
    }  # fmt: skip
    assert facts["torch_gfx_targets"] == ["gfx1100", "gfx1151"]
    assert facts["hip"] == "7.14.60850"
    assert facts["triton"] is None or facts["triton"].split()[0] in observe.TRITONS


@pytest.mark.parametrize(("version", "tag"), [("0.13.0", "0.13b"), ("0.14.2", "0.14.2b"),
                                              ("0.11.2", "0.11.2b")])  # fmt: skip
def test_a_runtime_version_names_its_release_tag(version, tag):
    assert observe.aotriton_tag(version) == tag


def test_the_manifest_gains_the_observed_facts_and_keeps_the_plans(image):
    data = json.loads(image.read_text())
    assert data["pytorch-source"] == {"PYTORCH_BUILD_VERSION": "2.15.0"}
    assert data["observed"]["aotriton"]["tag"] == "0.13b"
    assert not Path(str(image) + ".new").exists()  # written aside, then renamed


def test_the_smoke_check_says_the_contradiction_in_one_sentence(image):
    ok, detail = sr.check_observe({"observe": "aotriton=0.14.2b arch=gfx1151"}, str(image))
    assert ok  # said, not failed: the image is the better reading
    assert detail.startswith(
        "the image contradicts the recipe: AOTriton in torch is 0.13b (libaotriton_v2.so.0.13.0), "
        "the recipe inferred 0.14.2b; `invoke pins.update --observed` proposes the correction; "
    )
    assert detail.endswith("read: AOTriton 0.13b, libtorch_hip targets gfx1100, gfx1151, "
                           + (json.loads(image.read_text())["observed"]["triton"] or "no triton")
                           + ", HIP 7.14.60850")  # fmt: skip


def test_an_image_that_agrees_is_only_read(image):
    ok, detail = sr.check_observe({"observe": "aotriton=0.13b arch=gfx1151"}, str(image))
    assert ok and detail.startswith("read: AOTriton 0.13b")


def test_an_arch_missing_from_libtorch_hip_is_said():
    said = sr.compare_observed({"aotriton": {"tag": "0.13b"}, "torch_gfx_targets": ["gfx942"]},
                               {"aotriton": "0.13b", "arch": "gfx1151"})  # fmt: skip
    assert said == ["libtorch_hip.so's offload bundles name gfx942, not gfx1151"]


def test_a_manifest_without_observed_facts_fails(tmp_path):
    path = tmp_path / "versions.json"
    path.write_text("{}")
    assert sr.check_observe({"observe": "aotriton=0.13b"}, str(path)) == (
        False, f"{path} records no observed facts (attnforge/observe.py)",
    )  # fmt: skip


def test_pins_update_proposes_the_corrected_recipe(image):
    proc = run_invoke(REPO, "pins.update", "--observed", str(image))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("--- a/recipes/layers/pytorch-source.yaml\n")
    assert '-aotriton: "0.14.2b"\n+aotriton: "0.13b"\n' in proc.stdout
    assert "pytorch-source: the recipe says AOTriton 0.14.2b, the image has 0.13b" in proc.stderr


def test_a_variant_is_corrected_in_its_own_block_and_an_agreeing_one_not_at_all(image):
    recipes = load_recipes(REPO)
    observed = json.loads(image.read_text())["observed"]
    doc = {"pytorch-org": {"variant": "torch2.15-rocm10.0"}, "observed": observed}
    diff, _ = pins_update.observed_diff(recipes, doc, "x")
    assert '-    aotriton: "0.14.2b"\n+    aotriton: "0.13b"\n' in diff
    agrees = {"pytorch-org": {"variant": "rocm7.14"}, "observed": observed}  # 0.13b, inferred
    assert pins_update.observed_diff(recipes, agrees, "x")[0] == ""


def test_a_validation_report_carries_the_manifest(image):
    manifest = json.loads(image.read_text())
    report = {"checks": [{"id": "env", "details": {"image_versions": manifest}}]}
    assert pins_update.observed_in(report, "r.json") == (manifest, manifest["observed"])
    with pytest.raises(Exception, match="no observed facts in it"):
        pins_update.observed_in({"checks": []}, "r.json")


def test_the_report_shows_the_contradiction(image):
    from validate import render

    manifest = json.loads(image.read_text())
    report = {"environment": {"image_versions": manifest},
              "aotriton_knob": {"aotriton": "0.14.2b"}}  # fmt: skip
    assert render.observed_lines(report, "0.14.2b") == [
        "- ⚠️ the image contradicts the recipe: AOTriton in torch is 0.13b "
        "(libaotriton_v2.so.0.13.0), the recipe inferred 0.14.2b (`invoke pins.update "
        "--observed` proposes the correction)"
    ]
    assert render.observed_lines(report, "0.13b") == [
        "- AOTriton in torch, read from the image: 0.13b (libaotriton_v2.so.0.13.0)"
    ]
    assert render.observed_lines({}, "0.13b") == []  # no manifest: nothing said
