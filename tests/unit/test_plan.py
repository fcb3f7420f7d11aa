"""The planner: gating from data, ordering, hashing, tags, overrides and floating pins."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.errors import RecipeError, UserError
from attnforge.plan import (
    UNCHANGED,
    BuildInput,
    Options,
    classify_pin,
    explain,
    input_changes,
    mark_cached,
    parse_overrides,
    resolve,
    stack_options,
    topo_sort,
)
from attnforge.recipes import load_recipes
from tests.conftest import REPO, no_engine_env, run_invoke


def statuses(plan):
    return {s.layer: s.status for s in plan.steps}


# ------------------------------------------------------------------ gating (table-driven)


@pytest.mark.parametrize(
    ("arch", "stack", "expected"),
    [
        # the reference stack builds every layer on cpu
        (
            "cpu",
            "cpu",
            {"base": "build", "torch-cpu": "build", "triton": "build", "validate": "build"},
        ),
        # RDNA: CK's fused MHA is CDNA-only upstream -> the optional ck layer is skipped, FA falls back to triton
        (
            "gfx1151",
            "source",
            {"ck": "skipped", "flash-attention": "build", "pytorch-source": "build"},
        ),
        # CDNA3 gets CK and flash-attention's CK variant
        ("gfx942", "source", {"ck": "build", "flash-attention": "build"}),
        # gfx90a has AMD's device wheels since ROCm 7.14 -> the default stack builds
        ("gfx90a", "default", {"rocm-sdk": "build", "pytorch-wheels": "build"}),
        # a nightly without its versions: both wheel layers unsupported, the rest blocked
        (
            "gfx1151",
            "nightly",
            {
                "rocm-sdk": "unsupported",
                "pytorch-wheels": "unsupported",
                "flash-attention": "blocked",
                "validate": "blocked",
            },
        ),
    ],
)
def test_layers_are_gated_by_the_arch_data(recipes, arch, stack, expected):
    got = statuses(resolve(recipes, arch, stack))
    assert {k: got[k] for k in expected} == expected


def test_variant_choice_prefers_ck_where_supported_and_falls_back_to_triton(recipes):
    # over a torch 2.13 source build the fork's C++17 CK extension builds on CDNA; over the
    # shipped v2.14.1 (C++20 headers) it falls back to Triton and says why
    older = Options(
        overrides=parse_overrides(["pytorch-source.PYTORCH_BUILD_VERSION=2.13.0"], recipes)
    )
    fa = {
        a: resolve(recipes, a, "source", older).step("flash-attention")
        for a in ("gfx942", "gfx1151")
    }
    assert fa["gfx942"].variant == "ck" and fa["gfx1151"].variant == "triton"
    shipped = resolve(recipes, "gfx942", "source").step("flash-attention")
    assert shipped.variant == "triton" and "requires c++20" in shipped.reason


def test_unsupported_layer_reason_comes_from_the_recipe(recipes):
    ck = next(s for s in resolve(recipes, "gfx1151", "source").steps if s.layer == "ck")
    assert "gfx94 or gfx90a" in ck.reason
    sdk = resolve(recipes, "gfx1151", "nightly").step("rocm-sdk")
    assert "--set rocm-sdk.ROCM_VERSION=" in sdk.reason


def test_a_nightly_builds_from_the_versions_given_on_the_command_line(recipes):
    sets = parse_overrides(
        ["rocm-sdk.ROCM_VERSION=10.2.0a20261120", "pytorch-wheels.TORCH_VERSION=2.15.0a0+rocm10.2.0a20261120",
         "pytorch-wheels.TORCHVISION_VERSION=0.30.0a0+rocm10.2.0a20261120",
         "pytorch-wheels.TORCHAUDIO_VERSION=2.11.0.4+rocm10.2.0a20261120"],
        recipes,
    )  # fmt: skip
    plan = resolve(recipes, "gfx1151", "nightly", Options(overrides=sets))
    assert plan.blocked_by == []
    assert plan.step("rocm-sdk").pins["ROCM_VERSION"] == "10.2.0a20261120"
    wheels = plan.step("pytorch-wheels")
    assert wheels.pins["TORCH_VERSION"] == "2.15.0a0+rocm10.2.0a20261120"
    assert wheels.hint_args["ROCM_INDEX_URL"] == "https://nightly.repo.amd.com/rocm/whl-next/"


@pytest.mark.parametrize(
    ("stack", "torch", "index"),
    [
        ("default", "2.14.0+rocm10.1.0", "https://stable.repo.amd.com/rocm/whl-next/"),
        ("rocm10.0", "2.13.0+rocm10.0.0", "https://stable.repo.amd.com/rocm/whl-next/"),
        ("rocm7.14", "2.12.0+rocm7.14.0", "https://repo.amd.com/rocm/whl-multi-arch/"),
    ],
)
def test_each_channel_pins_its_own_coupled_wheels_and_expects_its_torch(
    recipes, stack, torch, index
):
    plan = resolve(recipes, "gfx1151", stack)
    wheels = plan.step("pytorch-wheels")
    assert wheels.pins["TORCH_VERSION"] == torch == plan.expect["torch.version"]
    assert {"TORCHVISION_VERSION", "TORCHAUDIO_VERSION"} <= set(wheels.pins)
    label = torch.split("+")[1]
    assert all(v.endswith("+" + label) for v in wheels.pins.values())
    assert plan.step("rocm-sdk").pins["ROCM_VERSION"] == label.removeprefix("rocm")
    assert (
        wheels.hint_args["ROCM_INDEX_URL"]
        == plan.step("rocm-sdk").hint_args["ROCM_INDEX_URL"]
        == index
    )


@pytest.mark.parametrize(("arch", "knob"), [("gfx1151", "0"), ("gfx1150", "1"), ("gfx942", "0")])
def test_the_pytorch_org_stack_installs_pytorch_orgs_wheels_with_no_rocm_sdk_layer(
    recipes, arch, knob
):
    plan = resolve(recipes, arch, "pytorch-org")
    assert plan.blocked_by == []
    assert [s.layer for s in plan.chain] == ["base", "pytorch-org", "flash-attention", "validate"]
    step = plan.step("pytorch-org")
    assert step.hint_args == {"TORCH_INDEX_URL": "https://download.pytorch.org/whl/rocm7.14"}
    # the index's label is the ROCm minor; rocm is the republished 7.14.0 (pytorch#193979)
    assert step.pins == {
        "TORCH_VERSION": "2.14.1+rocm7.14",
        "TORCHVISION_VERSION": "0.29.1+rocm7.14",
        "ROCM_VERSION": "7.14.0.post1",
    }
    assert plan.expect["torch.version"] == step.pins["TORCH_VERSION"]
    # AOTriton 0.13b (inferred for v2.14.x) calls gfx1150 experimental, gfx1151 not
    assert step.args["AOTRITON_EXPERIMENTAL"] == knob


def test_a_stack_for_another_arch_is_refused_with_the_stacks_that_fit(recipes):
    with pytest.raises(
        UserError, match="stack 'default' is not for arch 'cpu'.*stacks for cpu: cpu"
    ):
        resolve(recipes, "cpu", "default")


@pytest.mark.parametrize(
    ("kind", "call"), [("arch", ("gfx9999", "cpu")), ("stack", ("cpu", "fast"))]
)
def test_unknown_arch_or_stack_lists_the_valid_ones(recipes, kind, call):
    with pytest.raises(UserError, match=f"unknown {kind} .*valid {kind}e?s: "):
        resolve(recipes, *call)


def test_aotriton_experimental_env_follows_the_torch_aotriton_version(recipes):
    def knob(arch):
        return (
            resolve(recipes, arch, "default").step("pytorch-wheels").args["AOTRITON_EXPERIMENTAL"]
        )

    assert knob("gfx1151") == "0"  # AOTriton 0.13b: gfx1151 no longer experimental
    assert knob("gfx1150") == "1"  # ... but gfx1150 still is
    assert knob("gfx942") == "0"


# ------------------------------------------------------------------ ordering


def test_layers_are_ordered_parent_first_and_chained(recipes):
    plan = resolve(recipes, "cpu", "cpu")
    assert [s.layer for s in plan.chain] == [
        "base", "torch-cpu", "cpp-extension", "apps", "triton", "validate"
    ]  # fmt: skip
    for parent, child in zip(plan.chain, plan.chain[1:], strict=False):
        assert child.parent == parent.layer and child.base_ref == parent.hash_tag


@pytest.mark.parametrize(
    ("graph", "order"),
    [
        ({"a": [], "b": ["a"], "c": ["b"]}, ["a", "b", "c"]),  # a chain
        ({"c": ["a"], "b": [], "a": []}, ["b", "a", "c"]),  # stable: ties keep input order
        ({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}, ["a", "b", "c", "d"]),  # a diamond
    ],
)
def test_topo_sort_puts_dependencies_first(graph, order):
    keys = list(graph)
    assert topo_sort(graph, key=keys.index) == order


def test_a_dependency_cycle_is_named():
    with pytest.raises(UserError, match="dependency cycle: a -> b -> c -> a"):
        topo_sort({"a": ["b"], "b": ["c"], "c": ["a"]})


def test_a_need_nobody_provides_is_an_error(repo_copy):
    text = (
        (repo_copy / "recipes/layers/triton.yaml")
        .read_text()
        .replace("needs: [torch]", "needs: [cuda]")
    )
    (repo_copy / "recipes/layers/triton.yaml").write_text(text)
    with pytest.raises(
        UserError, match="layer 'triton' needs 'cuda', which no layer of stack 'cpu' provides"
    ):
        resolve(load_recipes(repo_copy), "cpu", "cpu")


def test_only_stops_at_the_layer_and_keeps_what_it_sits_on(recipes):
    plan = resolve(recipes, "cpu", "cpu", Options(only="torch-cpu"))
    assert [s.layer for s in plan.chain] == ["base", "torch-cpu"]
    assert plan.final_tag is None  # a partial chain is not the stack's image


# ------------------------------------------------------------------ hashing


def hashes(root: Path, arch="cpu", stack="cpu", **opts):
    return {
        s.layer: s.hash for s in resolve(load_recipes(root), arch, stack, Options(**opts)).chain
    }


def test_hashes_are_the_same_in_another_process_with_another_hash_seed(recipes):
    """Keys are shared between machines and runs: nothing process-local (set order, id()) may
    leak into them."""
    code = (
        "import json; from pathlib import Path; from attnforge.recipes import load_recipes; "
        "from attnforge.plan import resolve; "
        f"r = load_recipes(Path({str(REPO)!r})); "
        "print(json.dumps({s.layer: s.hash for s in resolve(r, 'gfx1151', 'source').chain}))"
    )
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True,
                env=dict(os.environ, PYTHONHASHSEED=seed), cwd=REPO,
            ).stdout
        )
        for seed in ("1", "2")
    ]  # fmt: skip
    assert runs[0] == runs[1] == hashes(REPO, "gfx1151", "source")


def test_one_byte_in_a_context_file_changes_that_layer_and_its_descendants_only(repo_copy):
    before = hashes(repo_copy)
    target = next(p for p in sorted((repo_copy / "validate").rglob("*.py")))
    target.write_bytes(target.read_bytes() + b"#")
    after = hashes(repo_copy)
    assert [k for k in before if before[k] != after[k]] == ["validate"]


def test_a_dockerfile_change_rebuilds_from_that_layer_down(repo_copy):
    before = hashes(repo_copy)
    path = repo_copy / "dockerfiles/torch-cpu.Dockerfile"
    path.write_text(path.read_text() + "\n# a comment\n")
    after = hashes(repo_copy)
    assert [k for k in before if before[k] != after[k]] == [
        "torch-cpu", "cpp-extension", "apps", "triton", "validate"
    ]  # fmt: skip


def test_hint_args_such_as_jobs_stay_out_of_the_hash(recipes):
    assert hashes(REPO, jobs=1) == hashes(REPO, jobs=64)


def test_a_set_override_changes_the_hash_of_that_layer_and_below(recipes):
    base = hashes(REPO)
    changed = hashes(REPO, overrides=parse_overrides(["triton.NUMPY_VERSION=2.3.5"], recipes))
    # the layers above triton (cpp-extension, apps) keep their hashes
    assert [k for k in base if base[k] != changed[k]] == ["triton", "validate"]


def test_the_base_image_digest_is_part_of_the_root_hash(recipes):
    a, b = (
        hashes(REPO, base_digest="sha256:" + "a" * 64),
        hashes(REPO, base_digest="sha256:" + "b" * 64),
    )
    assert all(a[k] != b[k] for k in a)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("triton", "expected LAYER.KEY=VALUE"),
        ("triton.NUMPY_VERSION", "expected LAYER.KEY=VALUE"),
        ("tritn.NUMPY_VERSION=1", "unknown layer 'tritn'"),
        (
            "triton.NUMPY=1",
            "layer 'triton' has no setting 'NUMPY'; valid: NUMPY_VERSION, TRITON_VERSION, variant",
        ),
        ("base.variant=huge", "unknown variant of base 'huge'"),
        # an empty pin is malformed like any other, never planned as a floating one
        ("triton.TRITON_VERSION=", "TRITON_VERSION pins a version, which must be a PEP 440"),
        ("pytorch-source.SOURCE_REF=", "SOURCE_REF pins a git commit"),
    ],
)
def test_bad_set_overrides_say_what_is_valid(recipes, item, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        parse_overrides([item], recipes)


# ------------------------------------------------------------------ tags, pins, cache


def test_tags_are_content_addressed_plus_moving_and_stack_tags(recipes):
    plan = resolve(recipes, "cpu", "cpu", Options(namespace="reg.example/team"))
    first, last = plan.chain[0], plan.chain[-1]
    assert first.hash_tag == f"reg.example/team/base:cpu-{first.hash[:12]}"
    assert first.moving_tags == ("reg.example/team/base:cpu",)
    assert last.moving_tags == ("reg.example/team/validate:cpu", "reg.example/team/cpu:cpu")


@pytest.mark.parametrize(
    ("value", "floats"),
    [
        ("2.13.0+cpu", False),
        ("0123456789abcdef0123456789abcdef01234567", False),
        ("sha256:" + "0" * 64, False),
        ("ubuntu@sha256:" + "0" * 64, False),
        ("main", True),
        ("latest", True),
        (">=2.9", True),
        ("", True),
    ],
)
def test_classify_pin(value, floats):
    assert (classify_pin(value) is not None) == floats


def test_a_moving_base_tag_is_flagged_floating_until_its_digest_is_known(recipes):
    plan = resolve(recipes, "cpu", "cpu")
    assert any("BASE_IMAGE" in f for f in plan.chain[0].floating)
    plan = resolve(recipes, "cpu", "cpu", Options(base_digest="sha256:" + "c" * 64))
    assert not plan.chain[0].floating


def test_every_shipped_pin_is_exact_apart_from_the_base_image(recipes):
    floating = {}
    for arch in ("gfx1151", "gfx942", "cpu"):
        for stack in recipes.stacks:
            try:
                plan = resolve(recipes, arch, stack, Options(base_digest="sha256:" + "d" * 64))
            except UserError:
                continue
            for s in plan.chain:
                if s.floating:
                    floating[f"{stack}/{arch}/{s.layer}"] = s.floating
    assert floating == {}


def test_mark_cached_flags_steps_whose_hash_tag_exists(recipes):
    plan = resolve(recipes, "cpu", "cpu")
    cached = mark_cached(plan, {plan.chain[0].hash_tag, plan.chain[1].hash_tag})
    assert [s.status for s in cached.chain] == ["cached", "cached"] + ["build"] * 4


def test_plan_json_is_what_dry_run_json_prints(recipes):
    data = resolve(recipes, "gfx1151", "default").to_json()
    assert data["arch"] == "gfx1151" and data["final_tag"] == "attnforge/default:gfx1151"
    assert data["expect"]["sdpa.default_backend"] == "flash"
    assert data["expect"]["torch.device_arch"] == "gfx1151"
    proc = run_invoke(
        REPO, "build", "--arch", "gfx1151", "--dry-run", "--json", env=no_engine_env()
    )
    printed = json.loads(proc.stdout)
    commands = {s["layer"]: s.pop("command") for s in printed["steps"]}
    for mine, theirs in zip(data["steps"], printed["steps"], strict=True):
        differ = {k: (mine[k], theirs.get(k)) for k in mine if mine[k] != theirs.get(k)}
        assert differ == {}, mine["layer"]
    assert printed == data
    assert commands["rocm-sdk"][:2] == ["docker", "buildx"]
    assert "THEROCK_EXTRA=device-gfx1151" in commands["rocm-sdk"]


def test_dry_run_plans_the_pytorch_org_stack_with_its_index_and_pins():
    proc = run_invoke(
        REPO, "build", "--arch", "gfx1151", "--stack", "pytorch-org", "--dry-run", "--json",
        env=no_engine_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert printed["final_tag"] == "attnforge/pytorch-org:gfx1151"
    commands = {s["layer"]: s["command"] for s in printed["steps"]}
    org = " ".join(commands["pytorch-org"])
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/rocm7.14" in org
    assert "ROCM_VERSION=7.14.0.post1" in org and "TORCH_VERSION=2.14.1+rocm7.14" in org
    assert "rocm-sdk" not in commands  # torch brings TheRock's SDK wheels itself


# ------------------------------------------------------------------ the key is a value


def test_the_key_is_the_hash_of_the_build_inputs_json(recipes):
    for step in resolve(recipes, "gfx942", "source").chain:
        blob = json.dumps(step.input.to_json(), sort_keys=True, separators=(",", ":"))
        assert step.hash == hashlib.sha256(blob.encode()).hexdigest()
        assert step.input.layer == step.layer and step.input.args == step.args


def _with(old: BuildInput, **changes) -> dict:
    return {**old.to_json(), **changes}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda j: {**j, "args": {**j["args"], "NUMPY_VERSION": "2.3.5"}},
         ["arg NUMPY_VERSION 2.3.5 -> 2.4.6"]),
        (lambda j: {**j, "args": {k: v for k, v in j["args"].items() if k != "NUMPY_VERSION"}},
         ["arg NUMPY_VERSION added: 2.4.6"]),
        (lambda j: {**j, "dockerfile": "0" * 64}, ["dockerfiles/triton.Dockerfile changed"]),
        (lambda j: {**j, "context": {**j["context"], "attnforge/patches.py": "0" * 64}},
         ["attnforge/patches.py changed"]),
        (lambda j: {**j, "context": {**j["context"], "gone.txt": "0" * 64}},
         ["gone.txt removed from the context"]),
        (lambda j: {**j, "parent": "f" * 64}, ["parent apps rebuilt"]),
        (lambda j: {**j, "epoch": 0}, ["attnforge's build epoch 0 -> 1"]),
        (lambda j: j, [UNCHANGED]),
    ],
)  # fmt: skip
def test_what_changed_since_the_last_build_is_said_in_words(recipes, change, expected):
    triton = resolve(recipes, "cpu", "cpu").step("triton")
    old = change(triton.input.to_json())
    assert input_changes(old, triton.input, triton.dockerfile, triton.parent) == expected


def test_a_new_base_image_digest_is_named_in_the_root_layers_changes(recipes):
    a = resolve(recipes, "cpu", "cpu", Options(base_digest="sha256:" + "a" * 64)).step("base")
    b = resolve(recipes, "cpu", "cpu", Options(base_digest="sha256:" + "b" * 64)).step("base")
    changes = input_changes(a.input.to_json(), b.input, b.dockerfile, None)
    assert changes == [
        "base image debian:bookworm-slim (sha256:aaaaaaaaaaaa) -> debian:bookworm-slim (sha256:bbbbbbbbbbbb)"
    ]


def test_explain_leaves_cached_steps_and_first_builds_without_changes(recipes):
    plan = resolve(recipes, "cpu", "cpu")
    first = plan.step("base")
    plan = mark_cached(plan, {first.hash_tag})
    explained = explain(plan, {"triton": {"args": {}}})
    assert explained.step("base").changes == ()  # cached
    assert explained.step("torch-cpu").changes == ()  # no record
    assert "arg NUMPY_VERSION added: 2.4.6" in explained.step("triton").changes


# ------------------------------------------------------------------ in-memory recipes


TINY = {
    "recipes/arches.yaml": """
arches:
  cpu: {description: cpu, vendor: cpu, family: cpu}
  gfx1151: {description: strix halo, vendor: amd, family: rdna3.5, wave_size: 32}
  gfx942: {description: mi300, vendor: amd, family: cdna3, wave_size: 64}
""",
    "recipes/stacks.yaml": """
stacks:
  s:
    description: a tiny stack
    arches: [all]
    base_image: img@sha256:%s
    layers: [root, {layer: fa, variant: [ck, triton]}, {layer: extra, optional: true}]
"""
    % ("0" * 64),
    "recipes/layers/root.yaml": """
name: root
follows: a test of the planner
description: the root
dockerfile: dockerfiles/root.Dockerfile
provides: [python]
""",
    "recipes/layers/fa.yaml": """
name: fa
follows: a test of the planner
description: flash attention
dockerfile: dockerfiles/fa.Dockerfile
needs: [python]
arches: [vendor:amd]
gated_because: only AMD here
args: {WAVE: "{wave_size}"}
variants:
  ck: {arches: [family:cdna3], gated_because: CK is CDNA-only, args: {BACKEND: ck}}
  triton: {args: {BACKEND: triton}}
""",
    "recipes/layers/extra.yaml": """
name: extra
follows: a test of the planner
description: gated optional layer
dockerfile: dockerfiles/root.Dockerfile
arches: [gfx942]
gated_because: only gfx942
""",
    "dockerfiles/root.Dockerfile": "FROM scratch\n",
    "dockerfiles/fa.Dockerfile": "FROM scratch\n",
}


@pytest.fixture
def tiny(tmp_path):
    for rel, text in TINY.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return load_recipes(tmp_path)


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("gfx942", {"root": ("build", None), "fa": ("build", "ck"), "extra": ("build", None)}),
        ("gfx1151", {"root": ("build", None), "fa": ("build", "triton"), "extra": ("skipped", None)}),
        ("cpu", {"root": ("build", None), "fa": ("unsupported", None), "extra": ("skipped", None)}),
    ],
)  # fmt: skip
def test_variant_choice_and_gating_on_in_memory_recipes(tiny, arch, expected):
    plan = resolve(tiny, arch, "s")
    assert {s.layer: (s.status, s.variant) for s in plan.steps} == expected


def test_templates_render_per_arch_and_a_set_wins(tiny):
    assert resolve(tiny, "gfx1151", "s").step("fa").args == {"WAVE": "32", "BACKEND": "triton"}
    sets = {"fa": {"variant": "triton", "BACKEND": "custom"}}
    step = resolve(tiny, "gfx942", "s", Options(overrides=sets)).step("fa")
    assert step.variant == "triton" and step.args["BACKEND"] == "custom"


def test_a_pinned_base_digest_is_not_floating(tiny):
    assert resolve(tiny, "gfx942", "s").step("root").floating == ()


def test_an_invalid_patch_series_fails_the_plan_not_the_build(repo_copy):
    series = repo_copy / "patches/selftest/cpu-demo/series.json"
    data = json.loads(series.read_text())
    del data["upstream"]
    series.write_text(json.dumps(data))
    with pytest.raises(
        RecipeError, match="recipes/layers/triton.yaml.*patch series patches/selftest/cpu-demo"
    ):
        resolve(load_recipes(repo_copy), "cpu", "cpu")


def test_every_attention_line_an_arch_can_have_is_listed_with_its_gating(recipes):
    options = {o.stack: o for o in stack_options(recipes, "gfx1151")}
    assert options["dao"].builds and options["dao"].attention == (
        "flash-attention-dao:triton (or ck)",
    )
    assert options["rdna3-minimal"].builds
    assert not options["rocm-fa3"].builds and "gfx942" in options["rocm-fa3"].reason
    assert (
        not options["nightly"].builds and "--set rocm-sdk.ROCM_VERSION" in options["nightly"].reason
    )
    assert options["cpu"].reason == "for cpu"
    gfx942 = {o.stack: o for o in stack_options(recipes, "gfx942")}
    assert gfx942["rocm-fa3"].builds and not gfx942["rdna3-minimal"].builds
    # torch 2.14.1's C++20 headers refuse the fork's C++17 CK extension (recipes/torch.yaml)
    assert gfx942["source"].attention == ("flash-attention:triton",)


@pytest.mark.parametrize(
    ("stack", "arch", "knob"),
    [("default", "gfx1151", "0"), ("rocm10.0", "gfx1151", "0"), ("rocm7.14", "gfx1151", "1"),
     ("default", "gfx1150", "1"), ("default", "gfx1101", "1"), ("default", "gfx1100", "0")],
)  # fmt: skip
def test_the_experimental_aotriton_knob_follows_each_channels_aotriton(recipes, stack, arch, knob):
    assert (
        resolve(recipes, arch, stack).step("pytorch-wheels").args["AOTRITON_EXPERIMENTAL"] == knob
    )


@pytest.mark.parametrize(
    ("arch", "stack", "facts"),
    [
        ("gfx1150", "default", {"version": "0.13b", "experimental": True, "image_sets_knob": True}),
        ("gfx1151", "default", {"version": "0.13b", "experimental": False, "image_sets_knob": False}),
        ("gfx1151", "rocm7.14", {"version": "0.11.2b", "experimental": True, "image_sets_knob": True}),
        ("cpu", "cpu", None),
    ],
)  # fmt: skip
def test_the_validation_suite_is_told_what_the_recipes_say_of_aotriton(recipes, arch, stack, facts):
    from attnforge.validation import expect_document

    doc = expect_document(recipes, resolve(recipes, arch, stack))
    assert doc["aotriton"] == facts
    if arch == "cpu":  # the rules are about ROCm hosts: a CPU stack is never warned of /dev/kfd
        assert doc["host_rules"] == []
        return
    assert {r["id"] for r in doc["host_rules"]} >= {"strix-halo-kernel", "empty-hsa-override"}
    assert all(r["source"] and r["fix"] for r in doc["host_rules"])


def test_the_suite_names_the_users_expect_file_and_words_fixes_for_where_it_runs(recipes, tmp_path):
    from attnforge.validation import expect_document

    plan = resolve(recipes, "gfx1151", "default")
    kept = tmp_path / "reports" / "gfx1151" / "default" / "expect.json"
    image = expect_document(recipes, plan, shown_as=kept)
    local = expect_document(recipes, plan, shown_as=kept, in_image=False)
    assert image["shown_as"] == local["shown_as"] == str(kept)
    assert (image["in_image"], local["in_image"]) == (True, False)
    fixes = {d: {r["id"]: r["fix"] for r in doc["host_rules"]}
             for d, doc in (("image", image), ("local", local))}  # fmt: skip
    assert "--device=/dev/kfd" in fixes["image"]["no-kfd-access"]
    assert "container" not in fixes["local"]["no-kfd-access"]
    assert "video and render groups" in fixes["local"]["no-kfd-access"]
    assert all("fix_on_host" not in r for r in local["host_rules"])
    # what the suite reads back: the user's path, and the wording of a run on the host
    from validate.expect import evaluate, parse_expect

    spec = parse_expect(local, "/out/expect.json")
    assert spec.name == str(kept)
    [broken] = evaluate({"torch.gpu_available": True}, {"torch.gpu_available": False},
                        in_image=spec.in_image)  # fmt: skip
    assert "container" not in broken.message and "driver" in broken.message
    [in_image] = evaluate({"torch.gpu_available": True}, {"torch.gpu_available": False})
    assert "pass the devices to the container" in in_image.message
