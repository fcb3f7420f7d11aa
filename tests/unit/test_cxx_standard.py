"""The C++ standard per torch: a layer that compiles C++ against torch's headers with an older
standard than that torch requires is refused at --dry-run, with the reason, and never planned."""

from __future__ import annotations

import pytest
from packaging.version import Version

from attnforge.errors import RecipeError
from attnforge.plan import Options, parse_overrides, resolve, stacks_for
from attnforge.recipes import load_recipes
from tests.conftest import REPO, run_invoke

# The upstream fact these tests hold the recipes to, written out here and not read from
# recipes/torch.yaml: since pytorch#178150 (torch 2.14) torch's headers stop with #error below C++20.
CXX20_FROM = Version("2.14")
# A nightly's versions (ROCm/Quartz nightly/20261010: torch nightly branch, ROCm 10.2.0a).
NIGHTLY_SETS = [
    "rocm-sdk.ROCM_VERSION=10.2.0a20261010",
    "pytorch-wheels.TORCH_VERSION=2.15.0a0+rocm10.2.0a20261010",
    "pytorch-wheels.TORCHVISION_VERSION=0.30.0a0+rocm10.2.0a20261010",
    "pytorch-wheels.TORCHAUDIO_VERSION=2.11.0.4+rocm10.2.0a20261010",
]


@pytest.fixture(scope="module")
def recipes():
    return load_recipes(REPO)


def _torch_version(recipes, plan) -> Version:
    for step in plan.chain:
        layer = recipes.layers[step.layer]
        if "torch" in layer.provides:
            return Version(Version(step.pins[layer.torch_version_pin]).base_version)
    raise AssertionError(f"no torch in {plan.stack} for {plan.arch}")


def _cxx_std(recipes, step) -> str | None:
    decl = recipes.layers[step.layer].torch_cxx_for(step.variant)
    return decl.std if decl else None


PLANTED_LAYER = """
name: ext17
description: a torch C++ extension whose setup.py hard-codes -std=c++17
follows: a test of the planner's C++ standard check
dockerfile: dockerfiles/validate.Dockerfile
needs: [torch]
torch_cxx: {std: c++17, source: "setup.py:1 -std=c++17 (planted by a test)"}
"""
PLANTED_STACK = """
  planted:
    description: a C++17 extension over the cpu stack's torch
    arches: [cpu]
    base_image: debian:bookworm-slim
    layers: [base:minimal, torch-cpu, ext17, validate]
"""


@pytest.fixture
def planted(repo_copy):
    (repo_copy / "recipes/layers/ext17.yaml").write_text(PLANTED_LAYER)
    stacks = repo_copy / "recipes/stacks.yaml"
    stacks.write_text(stacks.read_text() + PLANTED_STACK)
    return repo_copy


def test_a_cxx17_extension_over_a_cxx20_torch_is_refused_at_dry_run(planted):
    res = run_invoke(
        planted, "build", "--arch", "cpu", "--stack", "planted", "--dry-run",
        "--set", "torch-cpu.TORCH_VERSION=2.14.0+cpu",
    )  # fmt: skip
    text = " ".join(res.stdout.split())
    assert res.returncode == 0, res.stderr
    assert "ext17 is unsupported on cpu" in text
    assert "torch 2.14.0+cpu requires c++20" in text and "setup.py:1 -std=c++17" in text
    assert "pytorch#178150" in text
    # the layers above it are blocked, not planned
    plan = resolve(load_recipes(planted), "cpu", "planted",
                   Options(overrides={"torch-cpu": {"TORCH_VERSION": "2.14.0+cpu"}}))  # fmt: skip
    assert {s.layer: s.status for s in plan.steps} == {
        "base": "build", "torch-cpu": "build", "ext17": "unsupported", "validate": "blocked"
    }  # fmt: skip
    assert plan.final_tag is None


def test_the_same_extension_over_a_cxx17_torch_is_planned(planted):
    plan = resolve(load_recipes(planted), "cpu", "planted")  # torch-cpu's pin: 2.13.0+cpu
    assert plan.step("ext17").status == "build" and not plan.blocked_by


def test_a_torch_no_rule_covers_is_refused_as_unknown_not_guessed(planted):
    torch_yaml = planted / "recipes/torch.yaml"
    torch_yaml.write_text(torch_yaml.read_text().replace('">=2.14"', '">=2.14,<2.20"'))
    sets = {"torch-cpu": {"TORCH_VERSION": "2.20.0+cpu"}}
    step = resolve(load_recipes(planted), "cpu", "planted", Options(overrides=sets)).step("ext17")
    assert step.status == "unsupported"
    assert "the C++ standard torch 2.20.0+cpu requires is unknown" in step.reason


def test_a_preferred_variant_torch_refuses_falls_back_and_says_why(recipes):
    # the source stack prefers flash-attention:ck (-std=c++17) on CDNA; over a torch 2.14 it
    # builds the Triton variant, which compiles no C++, and the plan says why
    sets = parse_overrides(["pytorch-source.PYTORCH_BUILD_VERSION=2.14.0"], recipes)
    step = resolve(recipes, "gfx942", "source", Options(overrides=sets)).step("flash-attention")
    assert (step.status, step.variant) == ("build", "triton")
    assert step.reason.startswith("not ck: flash-attention:ck compiles against torch's headers")
    assert "requires c++20" in step.reason
    # asked for by name, the CK variant is refused with the same reason
    sets = parse_overrides(["pytorch-source.PYTORCH_BUILD_VERSION=2.14.0",
                            "flash-attention.variant=ck"], recipes)  # fmt: skip
    step = resolve(recipes, "gfx942", "source", Options(overrides=sets)).step("flash-attention")
    assert step.status == "unsupported" and "requires c++20" in step.reason


@pytest.mark.parametrize(
    ("arch", "stack", "sets", "expected"),
    [
        # the FA3 fork builds as C++17, so its stack sits on the rocm10.0 channel's torch 2.13
        ("gfx942", "rocm-fa3", [], ("build", None)),
        ("gfx942", "rocm-fa3", ["pytorch-wheels.variant=stable"], ("unsupported", None)),
        # Dao-AILab's CK backend builds as C++20: fine on torch 2.14
        ("gfx942", "dao", ["flash-attention-dao.variant=ck"], ("build", "ck")),
        # JIT-built with cpp_extension's default, which follows torch
        ("gfx1151", "rdna3-minimal", [], ("build", None)),
        # the Triton variants compile no C++
        ("gfx1151", "default", [], ("build", "triton")),
        ("gfx942", "nightly", NIGHTLY_SETS, ("build", "triton")),
    ],
)  # fmt: skip
def test_each_stack_gets_the_treatment_the_upstream_facts_give_it(
    recipes, arch, stack, sets, expected
):
    plan = resolve(recipes, arch, stack, Options(overrides=parse_overrides(sets, recipes)))
    attention = next(s for s in plan.steps if s.layer.startswith("flash-attention"))
    assert (attention.status, attention.variant) == expected, attention.reason


def _walk(recipes):
    for arch, spec in recipes.arches.items():
        if spec.vendor != "amd":
            continue
        for stack in stacks_for(recipes, arch):
            sets = NIGHTLY_SETS if stack == "nightly" else []
            yield arch, stack, sets
            for layer in recipes.stacks[stack].entries():  # every other variant a user may --set
                for variant in recipes.layers[layer.layer].variants:
                    if layer.layer in ("rocm-sdk", "pytorch-wheels"):
                        continue  # the channels are stacks of their own
                    yield arch, stack, [*sets, f"{layer.layer}.variant={variant}"]


def test_every_amd_arch_and_stack_plans_a_build_that_works_or_refuses_with_a_reason(recipes):
    walked = refused = 0
    for arch, stack, sets in _walk(recipes):
        plan = resolve(recipes, arch, stack, Options(overrides=parse_overrides(sets, recipes)))
        walked += 1
        where = f"{stack} for {arch} {sets}"
        if plan.blocked_by:
            refused += 1
            assert all(s.reason for s in plan.blocked_by), where
            assert plan.final_tag is None, where
            continue
        torch = _torch_version(recipes, plan)
        for step in plan.chain:
            std = _cxx_std(recipes, step)
            if "torch" in recipes.layers[step.layer].needs:
                assert std is not None, f"{where}: {step.layer} does not say how it uses torch"
            if torch >= CXX20_FROM:
                assert std != "c++17", f"{where}: {step.layer} builds C++17 over torch {torch}"
    assert walked > 100 and 0 < refused < walked


def test_every_layer_on_torch_says_how_it_compiles_against_it(recipes):
    for name, layer in recipes.layers.items():
        if "torch" in layer.provides:
            assert layer.torch_version_pin, f"{name} provides torch but names no torch_version_pin"
        if "torch" in layer.needs:
            for variant in layer.variants or [None]:
                assert layer.torch_cxx_for(variant), f"{name}:{variant} has no torch_cxx"


@pytest.mark.parametrize(
    ("rel", "old", "new", "message"),
    [
        ("recipes/torch.yaml", '">=2.14"', '"two point fourteen"', "is not a version specifier"),
        ("recipes/torch.yaml", "std: c++20", "std: c++23", "std"),
        ("recipes/layers/torch-cpu.yaml", "torch_version_pin: TORCH_VERSION",
         "torch_version_pin: TORCH_VER", "torch_version_pin 'TORCH_VER' is not a pin"),
        ("recipes/layers/flash-attention-rocm-fa3.yaml", "std: c++17", "std: c++14", "torch_cxx"),
    ],
)  # fmt: skip
def test_bad_cxx_facts_are_recipe_errors_naming_the_file(repo_copy, rel, old, new, message):
    path = repo_copy / rel
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))
    with pytest.raises(RecipeError) as info:
        load_recipes(repo_copy)
    assert rel in str(info.value) and message in str(info.value)


def test_the_stacks_table_offers_only_variants_that_build_over_that_stacks_torch(recipes):
    from attnforge.plan import stack_options

    options = {o.stack: o for o in stack_options(recipes, "gfx942")}
    assert options["default"].attention == ("flash-attention:triton",)  # torch 2.14: no CK
    assert options["rocm10.0"].attention == ("flash-attention:triton (or ck)",)  # torch 2.13
