"""The kernels' config family of an AMD arch comes from recipes/arches.yaml, not from its name."""

from __future__ import annotations

import pytest

from contract import arches
from kernels import configs


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
