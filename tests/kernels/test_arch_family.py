"""The kernels' config family of an AMD arch comes from recipes/arches.yaml, not from its name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.build import render_arch_facts
from attnforge_kernels.device import configs
from contract import arches


@pytest.mark.parametrize(
    "target, family",
    [
        ("gfx1151", "rdna3.5"),
        ("gfx1150", "rdna3.5"),
        ("gfx1100", "rdna3"),
        ("gfx1201", "rdna4"),
        ("gfx90a", "cdna2"),
        ("gfx942:sramecc+:xnack-", "cdna3"),
        ("gfx950", "cdna4"),
        ("gfx1103", "rdna3"),  # a neighbour the recipes lack: its family from arches.yaml
        ("gfx1200", "rdna4"),
        ("gfx1032", "rdna3"),  # rdna2 has no config of its own: the closest wave32 one
        ("gfx1199", configs.UNKNOWN_AMD_FAMILY),  # unknown to the facts: no guess from the name
    ],
)
def test_amd_family_reads_the_arch_facts(target, family):
    assert configs.amd_family(target) == family
    assert configs.amd_family(target) in configs.FAMILIES


def test_a_fact_changed_in_the_data_changes_the_family():
    facts = arches.from_mapping({"arches": {"gfx1151": {"family": "cdna4"}}})
    assert configs.amd_family("gfx1151", facts) == "cdna4"
    assert configs.amd_family("gfx1103", facts) == configs.UNKNOWN_AMD_FAMILY


def test_an_image_layout_reads_the_facts_without_pyyaml_or_recipes(tmp_path):
    """As validate.Dockerfile lays them out: contract/ (with the staged arches.json) beside
    attnforge_kernels/, no recipes/ folder, and an interpreter where PyYAML cannot be imported."""
    repo = Path(__file__).resolve().parents[2]
    ignore = shutil.ignore_patterns("__pycache__", arches.JSON_NAME)
    for pkg in ("contract", "attnforge_kernels"):
        shutil.copytree(repo / pkg, tmp_path / pkg, ignore=ignore)
    (tmp_path / "recipes").mkdir()
    shutil.copy(repo / "recipes" / "arches.yaml", tmp_path / "recipes" / "arches.yaml")
    assert render_arch_facts(tmp_path) == tmp_path / "contract" / arches.JSON_NAME
    shutil.rmtree(tmp_path / "recipes")
    code = (
        "import sys; sys.modules['yaml'] = None\n"
        "from attnforge_kernels.device import configs\n"
        "print(configs.amd_family('gfx1151'), configs.amd_family('gfx1103'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != arches.ENV}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, env={**env, "PYTHONPATH": str(tmp_path)}, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["rdna3.5", "rdna3"]
