"""Recipe loading: the shipped recipes are valid, and every malformed input gets a precise error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge.errors import RecipeError
from attnforge.recipes import json_schema, load_recipes
from tests.conftest import REPO


def test_shipped_recipes_load_and_cover_the_required_arches_and_stacks():
    recipes = load_recipes(REPO)
    for arch in (
        "gfx1151",
        "gfx1150",
        "gfx1100",
        "gfx1101",
        "gfx1201",
        "gfx90a",
        "gfx942",
        "gfx950",
        "cpu",
    ):
        assert arch in recipes.arches
    assert {"default", "source", "cpu"} <= set(recipes.stacks)
    assert recipes.arches["gfx1151"].therock_extra == "device-gfx1151"
    assert (
        recipes.arches["gfx942"].wave_size == 64 and recipes.arches["gfx942"].matrix_unit == "mfma"
    )


@pytest.mark.parametrize(
    ("version", "status"),
    [
        ("0.11.2b", "experimental"),  # torch 2.11's AOTriton still gates gfx1151
        ("0.12b", "supported"),  # aotriton 26903689 moved gfx1151 out of experimental
        ("0.9.2b", "none"),  # before gfx1151 support landed (0.10b)
        (None, "none"),
    ],
)
def test_aotriton_status_of_gfx1151_follows_the_aotriton_version(version, status):
    assert load_recipes(REPO).arches["gfx1151"].aotriton_status(version) == status


def _edit(tree: Path, rel: str, old: str, new: str) -> None:
    path = tree / rel
    text = path.read_text()
    assert old in text, f"{old!r} not in {rel}"
    path.write_text(text.replace(old, new, 1))


def _line_of(tree: Path, rel: str, needle: str) -> int:
    return next(
        i for i, line in enumerate((tree / rel).read_text().splitlines(), 1) if needle in line
    )


def test_unknown_key_names_file_line_field_and_valid_keys(repo_copy):
    _edit(
        repo_copy,
        "recipes/layers/triton.yaml",
        "wheelhouse: true",
        "wheelhouse: true\nwheelhose: false",
    )
    with pytest.raises(RecipeError) as exc:
        load_recipes(repo_copy)
    line = _line_of(repo_copy, "recipes/layers/triton.yaml", "wheelhose")
    msg = str(exc.value)
    assert msg.startswith(f"recipes/layers/triton.yaml:{line}: wheelhose: unknown key")
    assert "wheelhouse" in msg and "dockerfile" in msg  # the valid choices are listed


def test_unknown_key_in_a_nested_smoke_check_lists_that_models_keys(repo_copy):
    _edit(
        repo_copy,
        "recipes/layers/triton.yaml",
        "    dist: triton\n",
        "    dist: triton\n    versoin: x\n",
    )
    with pytest.raises(RecipeError) as exc:
        load_recipes(repo_copy)
    assert "smoke.0.versoin: unknown key" in str(exc.value)
    assert "absent" in str(exc.value) and "torch_build" in str(exc.value)


def test_malformed_yaml_names_the_line(repo_copy):
    (repo_copy / "recipes/layers/triton.yaml").write_text("name: triton\nargs: [unclosed\n")
    with pytest.raises(RecipeError, match=r"recipes/layers/triton.yaml:\d+: malformed YAML"):
        load_recipes(repo_copy)


def test_unknown_arch_selector_lists_valid_selectors(repo_copy):
    _edit(
        repo_copy,
        "recipes/layers/ck.yaml",
        "arches: [gfx90a, family:cdna3]",
        "arches: [gfx90a, family:cdna9]",
    )
    with pytest.raises(RecipeError) as exc:
        load_recipes(repo_copy)
    assert "unknown arch selector 'family:cdna9'" in str(exc.value)
    assert "family:cdna3" in str(exc.value)


def test_stack_naming_an_unknown_layer_is_an_error_with_the_layers(repo_copy):
    _edit(
        repo_copy,
        "recipes/stacks.yaml",
        "[base:minimal, torch-cpu, triton, validate]",
        "[base:minimal, torch-gpu, triton, validate]",
    )
    with pytest.raises(RecipeError) as exc:
        load_recipes(repo_copy)
    assert "unknown layer 'torch-gpu'" in str(exc.value) and "torch-cpu" in str(exc.value)


def test_stack_naming_an_unknown_variant_lists_the_variants(repo_copy):
    _edit(repo_copy, "recipes/stacks.yaml", "base:minimal", "base:tiny")
    with pytest.raises(RecipeError, match="has no variant 'tiny'.*devel, minimal"):
        load_recipes(repo_copy)


def test_unknown_template_variable_is_an_error(repo_copy):
    _edit(repo_copy, "recipes/layers/ck.yaml", 'GPU_TARGETS: "{arch}"', 'GPU_TARGETS: "{gpu}"')
    with pytest.raises(RecipeError, match=r"args.GPU_TARGETS: unknown template variable \{gpu\}"):
        load_recipes(repo_copy)


def test_layer_name_must_match_its_file(repo_copy):
    _edit(repo_copy, "recipes/layers/triton.yaml", "name: triton", "name: triton2")
    with pytest.raises(RecipeError, match="must match the file name 'triton'"):
        load_recipes(repo_copy)


def test_missing_dockerfile_is_an_error(repo_copy):
    (repo_copy / "dockerfiles/triton.Dockerfile").unlink()
    with pytest.raises(RecipeError, match="triton.Dockerfile does not exist"):
        load_recipes(repo_copy)


def test_smoke_check_needs_exactly_one_kind(repo_copy):
    _edit(
        repo_copy,
        "recipes/layers/triton.yaml",
        "    absent: pytorch-triton-rocm",
        "    absent: pytorch-triton-rocm\n    dist: x",
    )
    with pytest.raises(RecipeError, match="exactly one of dist, absent, torch_build, python"):
        load_recipes(repo_copy)


def test_unknown_expectation_key_is_an_error(repo_copy):
    pytest.importorskip("validate.expect")
    _edit(
        repo_copy,
        "recipes/stacks.yaml",
        "      torch.cuda: false",
        "      torch.cuda: false\n      sdpa.favourite: flash",
    )
    with pytest.raises(RecipeError, match="sdpa.favourite: unknown expectation key"):
        load_recipes(repo_copy)


def test_json_schema_describes_layers_stacks_and_arches():
    schema = json_schema()
    json.dumps(schema)  # serialisable
    layer = schema["$defs"]["Layer"]
    assert {"name", "dockerfile", "pins", "hint_args", "smoke", "variants"} <= set(
        layer["properties"]
    )
    assert layer.get("additionalProperties") is False  # unknown keys are errors for editors too
