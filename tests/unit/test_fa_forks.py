"""The flash-attention forks AMD users build (issue 10): each planned and gated per arch as its
upstream says, each pinned to a full commit, each with checks and expectations.

The arch tables restate what docs/flash-attention-forks.md cites: Dao-AILab/flash-attention@0251105a
setup.py allowed_archs (CK) and ROCm/aiter@9bab8388 CDNA_ARCHS/RDNA_ARCHS (Triton); ROCm's FA3 tag
v3.0.0.r1-cktile: gfx942 FAv3 code objects; Repeerc's rocWMMA kernel: gfx11 wave32.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnforge.plan import Options, parse_overrides, resolve
from tests.conftest import REPO, run_invoke
from validate.expect import KNOWN_KEYS

ARCHES = ("gfx1151", "gfx1100", "gfx942", "gfx950", "gfx90a")
BUILD, NO = "build", "unsupported"

# (stack, layer, variant or None) -> status per arch, in ARCHES order.
TABLE = {
    ("default", "flash-attention", "triton"): (BUILD, BUILD, BUILD, BUILD, BUILD),
    # the fork's CK build is C++17: refused over torch 2.14 (C++20 headers,
    # tests/unit/test_cxx_standard.py), the default stack's wheels and the source stack's v2.14.1
    ("default", "flash-attention", "ck"): (NO, NO, NO, NO, NO),
    ("source", "flash-attention", "ck"): (NO, NO, NO, NO, NO),
    ("dao", "flash-attention-dao", "triton"): (BUILD, BUILD, BUILD, BUILD, BUILD),
    ("dao", "flash-attention-dao", "ck"): (BUILD, BUILD, BUILD, BUILD, BUILD),
    ("rocm-fa3", "flash-attention-rocm-fa3", None): (NO, NO, BUILD, NO, NO),
    ("rdna3-minimal", "flash-attention-rdna3-minimal", None): (BUILD, BUILD, NO, NO, NO),
}
CASES = [
    (stack, layer, variant, arch, status)
    for (stack, layer, variant), row in TABLE.items()
    for arch, status in zip(ARCHES, row, strict=True)
]
NEW_LAYERS = ("flash-attention-dao", "flash-attention-rocm-fa3", "flash-attention-rdna3-minimal")


def _plan(recipes, arch, stack, layer, variant):
    sets = [f"{layer}.variant={variant}"] if variant else []
    return resolve(recipes, arch, stack, Options(overrides=parse_overrides(sets, recipes)))


@pytest.mark.parametrize(
    ("stack", "layer", "variant", "arch", "status"),
    CASES,
    ids=[f"{c[1]}:{c[2] or '-'}@{c[3]}" for c in CASES],
)
def test_each_fork_is_gated_per_arch_as_upstream_says(recipes, stack, layer, variant, arch, status):
    step = _plan(recipes, arch, stack, layer, variant).step(layer)
    assert step.status == status, step.reason
    if status == BUILD:
        assert step.variant == variant
        assert re.fullmatch(r"[0-9a-f]{40}", step.pins["SOURCE_REF"])
        assert step.pins["SOURCE_REPO"] == recipes.layers[layer].source.repo
    else:
        # the reason printed is the recipe's own, which names the upstream file it comes from
        assert step.reason and any(s in step.reason for s in (".py", ".cpp", "setup.py"))


def test_nvidia_and_cpu_are_gated_too(recipes):
    for layer in NEW_LAYERS:
        spec = recipes.layers[layer]
        assert spec.gated_because
        for arch in ("sm90", "cpu"):
            assert not any(
                s == arch or s in ("all", f"vendor:{recipes.arches[arch].vendor}")
                for s in spec.arches
            ), (layer, arch)


def test_source_pins_are_full_commits_and_variants_keep_them(recipes):
    for layer in ("flash-attention", *NEW_LAYERS):
        spec = recipes.layers[layer]
        assert re.fullmatch(r"[0-9a-f]{40}", spec.source.ref), layer
        for name, variant in spec.variants.items():
            for key, value in variant.pins.items():
                if key == "SOURCE_REF" or key.endswith("_COMMIT"):
                    assert re.fullmatch(r"[0-9a-f]{40}", value), (layer, name, key)


def test_each_fork_has_smoke_checks_and_known_expectations(recipes):
    for layer in NEW_LAYERS:
        spec = recipes.layers[layer]
        assert spec.smoke, layer
        assert spec.follows and "@" in spec.follows  # names the upstream commit it follows
        for expect in [spec.expect, *(v.expect for v in spec.variants.values())]:
            assert set(expect) <= set(KNOWN_KEYS), (layer, sorted(set(expect) - set(KNOWN_KEYS)))
    dao = recipes.layers["flash-attention-dao"]
    assert {n: v.expect["flash_attn.backend"] for n, v in dao.variants.items()} == {
        "triton": "triton",
        "ck": "ck",
    }
    assert recipes.layers["flash-attention-rocm-fa3"].expect["flash_attn.backend"] == "ck"


def test_existing_flash_attention_variants_are_unchanged(recipes):
    fa = recipes.layers["flash-attention"]
    assert list(fa.variants) == ["triton", "ck"]
    assert fa.source.repo == "https://github.com/ROCm/flash-attention.git"
    assert fa.patches == ["patches/flash-attention/rdna35-arch-list"]


def test_the_rdna3_kernel_gets_its_arch_and_its_patch(recipes):
    step = _plan(recipes, "gfx1101", "rdna3-minimal", "", None).step(
        "flash-attention-rdna3-minimal"
    )
    assert step.args["GPU_ARCH"] == "gfx1101"
    assert step.args["PATCH_SERIES"] == "patches/flash-attention-rdna3-minimal/arch-from-env"
    assert "attnforge/patches.py" in {c.path for c in step.context}


def test_the_rdna3_sdpa_check_is_planned_where_the_kernel_is_installed(tmp_path, monkeypatch):
    from validate import suite

    def ids():
        return [c["id"] for c in suite.plan("all", quick=True)]

    assert "rdna3_minimal.run" not in ids()  # not installed here
    pkg = tmp_path / "rocwmma_fattn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "rdna3_minimal.run" in ids()
    from validate.expect import KNOWN_KEYS

    assert {"rdna3_minimal.present", "rdna3_minimal.works"} <= set(KNOWN_KEYS)


@pytest.mark.parametrize(
    ("arch", "stack", "sets", "needle"),
    [
        ("gfx1151", "dao", "flash-attention-dao.variant=triton", "flash-attention-dao:triton"),
        ("gfx1151", "dao", "flash-attention-dao.variant=ck", "flash-attention-dao:ck"),
        ("gfx1151", "rocm-fa3", None, "flash-attention-rocm-fa3 is unsupported on gfx1151"),
        ("gfx1151", "rdna3-minimal", None, "flash-attention-rdna3-minimal"),
        ("gfx1151", "default", "flash-attention.variant=ck", "builds CK kernels only for"),
    ],
)
def test_dry_run_plans_each_fork(tmp_path: Path, arch, stack, sets, needle):
    args = ["build", "--arch", arch, "--stack", stack, "--dry-run"]
    if sets:
        args += ["--set", sets]
    proc = run_invoke(REPO, *args)
    out = re.sub(r"\s+", " ", proc.stdout + proc.stderr)
    assert needle in out, out[-2000:]
