"""Recipe loading: the shipped recipes are valid, and every malformed input gets a precise error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge.errors import RecipeError
from attnforge.recipes import check_pin, json_schema, load_recipes
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


# Plain, quoted, block and tagged scalars of each YAML 1.1 type the safe loader builds.
YAML_VALUES = [
    "", "~", "null", "yes", "off", "True", "0o17", "017", "0x1F", "1_000", "+12", "-0", ".5",
    "1e3", ".inf", "-.Inf", "190:20:30", "2002-12-14", "2001-12-14t21:59:43.10-05:00",
    "2026-11-26 10:00:00", "!!binary aGVsbG8=", "!!str 12", "!!int '12'", "!!float 1",
    "'quoted'", '"\\u00e9 \\t x"', "|\n  a\n  b\n", ">\n  a\n  b\n", "'multi\n  line'",
    "plain\n  continued", "[1, x, {k: v}]", "{1: x, 2.5: y, null: z, false: w}",
]  # fmt: skip


@pytest.mark.parametrize("value", YAML_VALUES)
def test_a_recipe_value_is_what_yaml_safe_load_reads(tmp_path, value):
    import yaml

    from attnforge import yamlsrc

    for text in (f"k: {value}\n", f"- {value}\n"):
        (tmp_path / "v.yaml").write_text(text)
        got, expected = yamlsrc.load(tmp_path / "v.yaml").data, yaml.safe_load(text)
        assert repr(got) == repr(expected), text


def test_an_empty_value_is_a_sentence_naming_its_line_not_a_traceback(repo_copy):
    _edit(repo_copy, "recipes/layers/aotriton.yaml", "description: ", "description:\nx: ")
    with pytest.raises(RecipeError, match=r"recipes/layers/aotriton.yaml:2: description"):
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
        "[base:minimal, torch-cpu, cpp-extension, apps, triton, validate]",
        "[base:minimal, torch-gpu, cpp-extension, apps, triton, validate]",
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


# ------------------------------------------------------------------ pin formats (issue 9)

INJECTION = "; rm -rf / #"


@pytest.mark.parametrize(
    ("rel", "old", "new", "needle", "field", "reason"),
    [
        # the issue's own example: a source pin that is a shell command
        (
            "recipes/layers/aotriton.yaml",
            "ref: c11b5b886a10a00f925f74133d38b3505e67ccd9",
            f'ref: "{INJECTION}"',
            "ref: ",
            "source.ref",
            "must be 40 lowercase hex digits",
        ),
        (
            "recipes/layers/ck.yaml",
            "ref: 8e22e1ae31bbf7086f69d8724e027676791d351a",
            f'ref: "{INJECTION}"',
            "ref: ",
            "source.ref",
            "must be 40 lowercase hex digits",
        ),
        # an abbreviated commit cannot be fetched by `git fetch <repo> <commit>`
        (
            "recipes/layers/ck.yaml",
            "ref: 8e22e1ae31bbf7086f69d8724e027676791d351a",
            "ref: 8e22e1ae",
            "ref: ",
            "source.ref",
            "40 lowercase hex digits",
        ),
        (
            "recipes/layers/ck.yaml",
            "repo: https://github.com/ROCm/composable_kernel.git",
            "repo: github.com/ROCm/composable_kernel.git",
            "repo: ",
            "source.repo",
            "https://, http://, git://, ssh:// or file://",
        ),
        (
            "recipes/layers/aotriton.yaml",
            'tag: "0.14.2b"',
            'tag: "0.14.2b..x"',
            "tag: ",
            "source.tag",
            "may not contain '..'",
        ),
        (
            "recipes/layers/pytorch-wheels.yaml",
            'TORCH_VERSION: "2.14.0+rocm10.1.0"',
            'TORCH_VERSION: "2.14.x"',
            "TORCH_VERSION:",
            "variants.stable.pins.TORCH_VERSION",
            "PEP 440 version",
        ),
        (
            "recipes/layers/triton.yaml",
            'NUMPY_VERSION: "2.4.6"',
            'NUMPY_VERSION: "2.4.6"\n  NUMPY_SHA256: "deadbeef"',
            "NUMPY_SHA256",
            "pins.NUMPY_SHA256",
            "64 lowercase hex digits",
        ),
        (
            "recipes/layers/triton.yaml",
            'NUMPY_VERSION: "2.4.6"',
            'NUMPY_VERSION: "2.4.6"\n  TRITON_TAG: "v3.6.0.lock"',
            "TRITON_TAG",
            "pins.TRITON_TAG",
            "is not one",
        ),
        # values of no particular kind are held to a shell-safe character set
        (
            "recipes/layers/ck.yaml",
            'DTYPES: "fp16,bf16"',
            f'DTYPES: "fp16{INJECTION}"',
            "DTYPES:",
            "args.DTYPES",
            "';'",
        ),
        (
            "recipes/layers/rocm-sdk.yaml",
            "ROCM_INDEX_URL: https://repo.amd.com/rocm/whl-multi-arch/",
            'ROCM_INDEX_URL: "https://repo.amd.com/$(id)/"',
            "$(id)",
            "variants.rocm7.14.hint_args.ROCM_INDEX_URL",
            "https://",
        ),
        (
            "recipes/layers/flash-attention.yaml",
            'FLASH_ATTENTION_TRITON_AMD_ENABLE: "TRUE"',
            'FLASH_ATTENTION_TRITON_AMD_ENABLE: "TRUE`reboot`"',
            'FLASH_ATTENTION_TRITON_AMD_ENABLE: "TRUE`',
            "variants.triton.args.FLASH_ATTENTION_TRITON_AMD_ENABLE",
            "'`'",
        ),
        (
            "recipes/layers/base.yaml",
            "APT_PACKAGES: python3 python3-venv",
            "APT_PACKAGES: python3 --allow-unauthenticated",
            "APT_PACKAGES: python3 --",
            "variants.minimal.args.APT_PACKAGES",
            "would read as an option",
        ),
        (
            "recipes/stacks.yaml",
            "base_image: debian:bookworm-slim",
            "base_image: debian:bookworm-slim$(id)",
            "debian:bookworm-slim",
            "stacks.cpu.base_image",
            "not an image reference",
        ),
        (
            "recipes/arches.yaml",
            "therock_extra: device-gfx1151",
            'therock_extra: "device-gfx1151 && id"',
            "device-gfx1151",
            "arches.gfx1151.therock_extra",
            "not a valid therock_extra",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and "." in v and " " not in v else None,
)
def test_a_malformed_or_unsafe_value_names_file_line_and_key(
    repo_copy, rel, old, new, needle, field, reason
):
    _edit(repo_copy, rel, old, new)
    with pytest.raises(RecipeError) as exc:
        load_recipes(repo_copy)
    line = _line_of(repo_copy, rel, needle)
    msg = str(exc.value)
    assert msg.startswith(f"{rel}:{line}: {field}: "), msg
    assert reason in msg, msg
    assert "\n" not in msg  # one sentence, no traceback


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("SOURCE_REF", "269036897bcee4292f4e928767df1e3dd0e3c8bd"),
        ("AOTRITON_COMMIT", "8fdb4a4353f95b88c9542f5e5637efc1e1e0e530"),
        ("TORCH_VERSION", "2.11.0+rocm7.13.0"),
        ("ROCM_VERSION", "10.0.0rc1"),
        ("AOTRITON_TAG", "0.12b"),
        ("RELEASE_TAG", "release/v2.13.0"),
        ("WHEEL_SHA256", "a" * 64),
        ("BASE_DIGEST", "sha256:" + "0" * 64),
        ("SOURCE_REPO", "https://github.com/ROCm/aotriton.git"),
        ("TORCH_INDEX_URL", ""),  # torch-cpu.yaml: empty means "no index, wheelhouse only"
        ("APT_PACKAGES", "python3 python3-venv git"),
        ("GPU_TARGETS", "gfx942"),
        ("PATCH_SERIES", ""),
    ],
)
def test_check_pin_accepts_well_formed_values(key, value):
    assert check_pin(key, value) is None


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("SOURCE_REF", INJECTION, "40 lowercase hex digits"),
        ("SOURCE_REF", "v2.13.0", "40 lowercase hex digits"),  # a tag is not a commit
        ("SOURCE_REF", "269036897BCEE4292F4E928767DF1E3DD0E3C8BD", "lowercase"),
        ("TORCH_VERSION", "latest", "PEP 440"),
        ("TORCH_VERSION", "2.13.0; id", "PEP 440"),
        ("TORCH_VERSION", " 2.13.0", "PEP 440"),  # packaging would strip it; pip args would not
        ("AOTRITON_TAG", "-0.12b", "is not one"),
        ("AOTRITON_TAG", "0.12b;id", "is not one"),
        ("AOTRITON_TAG", "a/.b", "is not one"),
        ("WHEEL_SHA256", "a" * 63, "64 lowercase hex digits"),
        ("BASE_DIGEST", "0" * 64, "sha256:<64"),
        ("SOURCE_REPO", "", "URL"),
        ("SOURCE_REPO", "--upload-pack=touch /tmp/x", "URL"),
        ("TORCH_INDEX_URL", "https://x/simple?a=1&b=2", "URL"),
        ("GPU_TARGETS", "gfx942 $(reboot)", "'$', '(', ')'"),
        ("GPU_TARGETS", 'gfx942" x="', "'\"'"),  # would end a Python string in a smoke snippet
        ("GPU_TARGETS", "gfx942\nid", "'\\n'"),
        ("GPU_TARGETS", "{arch}", "'{', '}'"),  # --set values are not templates
        ("APT_PACKAGES", "git -y", "option"),
        ("BAD-KEY", "x", "key 'BAD-KEY'"),
    ],
)
def test_check_pin_explains_what_is_wrong(key, value, reason):
    why = check_pin(key, value)
    assert why is not None and reason in why, why
    assert key in why  # the reason names the key, for `--set LAYER.KEY=VALUE` errors too


def test_every_shipped_value_passes_check_pin():
    """The recipe loader and check_pin (which the planner uses for --set) agree on the shipped
    pins."""
    recipes = load_recipes(REPO)
    for layer in recipes.layers.values():
        for section in (layer.pins, *(v.pins for v in layer.variants.values())):
            for key, value in section.items():
                assert check_pin(key, value) is None, (layer.name, key)
        if layer.source:
            assert check_pin("SOURCE_REF", layer.source.ref) is None
            assert check_pin("SOURCE_REPO", layer.source.repo) is None


def test_a_yaml_merge_key_is_a_sentence_not_a_traceback(repo_copy):
    path = repo_copy / "recipes/stacks.yaml"
    text = path.read_text()
    path.write_text(
        text.replace("    expect: *rocm_expect", "    expect:\n      <<: *rocm_expect", 1)
    )
    with pytest.raises(RecipeError, match=r"recipes/stacks.yaml:\d+: .*merge keys \(<<\) are not"):
        load_recipes(repo_copy)


def test_aotritons_tech_preview_tier_needs_no_experimental_knob():
    # pytorch#188612: gfx1250 is "tech preview" (aotriton::isArchTechPreview), run without
    # TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL, unlike the experimental tier
    from attnforge.plan import template_vars
    from attnforge.recipes import Arch, Layer

    arch = Arch(
        name="gfx1250", description="t", vendor="amd", family="gfx12.5",
        aotriton={"since": "0.12.1b", "experimental": ["0.12.1b"], "tech_preview": ["0.13b"]},
    )  # fmt: skip
    assert [arch.aotriton_status(v) for v in ("0.12b", "0.12.1b", "0.13b")] == [
        "none", "experimental", "tech-preview"
    ]  # fmt: skip
    layer = Layer(name="t", description="t", dockerfile="x", follows="t", aotriton="0.13b")
    tvars = template_vars(arch, None, layer, jobs=1)
    assert (tvars["aotriton_status"], tvars["aotriton_experimental"]) == ("tech-preview", "0")
