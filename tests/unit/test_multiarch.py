"""One image for several arches, at plan level: which arches a set holds, what its layers are
built with, its cache key, its per-arch checks and expectations, and when it may be published.
(Building and validating a set needs AMD's indexes and each arch's GPU: not here.)"""

from __future__ import annotations

import json

import pytest

from attnforge import multiarch
from attnforge.errors import UserError
from attnforge.plan import Options, resolve
from attnforge.recipes import load_recipes
from tests.conftest import REPO, run_invoke


@pytest.fixture
def recipes():
    return load_recipes(REPO)  # fresh: register() adds the set to its arches


def plan_for(recipes, spec: str, stack: str = "default", **kw):
    return resolve(recipes, multiarch.register(recipes, spec), stack, Options(**kw))


def step(plan, layer):
    return next(s for s in plan.steps if s.layer == layer)


@pytest.mark.parametrize(
    "spec, members",
    [
        ("gfx1151,gfx1100", ["gfx1100", "gfx1151"]),
        ("gfx1100, gfx1151", ["gfx1100", "gfx1151"]),  # order and spaces do not matter
        ("gfx1100_gfx1151", ["gfx1100", "gfx1151"]),  # the set's own name, as tags carry it
        ("family:rdna3", ["gfx1100", "gfx1101"]),
        ("family:cdna3,gfx1100", ["gfx1100", "gfx942"]),
    ],
)
def test_a_set_lists_its_arches_sorted(recipes, spec, members):
    assert multiarch.members_of(recipes, spec) == members


@pytest.mark.parametrize(
    "spec, words",
    [
        ("gfx1151,gfx9999", "unknown arch 'gfx9999'; valid arches: "),
        ("family:rdna9", "unknown family 'rdna9'; valid AMD families: cdna2, "),
        ("gfx1151,gfx1151", "names one arch (gfx1151); give it alone, or list several"),
        ("gfx1151,,gfx1100", "an empty arch name between commas"),
        ("gfx1151,cpu", "one image for several arches is for AMD arches only (cpu is cpu)"),
    ],
)
def test_a_bad_set_is_one_sentence(recipes, spec, words):
    with pytest.raises(UserError) as err:
        multiarch.members_of(recipes, spec)
    assert words in str(err.value)


def test_the_set_plan_builds_every_arch_device_extra_into_one_image(recipes):
    plan = plan_for(recipes, "gfx1151,gfx1100")
    assert plan.arch == "gfx1100_gfx1151"
    assert plan.final_tag == "attnforge/default:gfx1100_gfx1151"
    wheels = step(plan, "pytorch-wheels")
    assert wheels.args["THEROCK_EXTRA"] == "device-gfx1100,device-gfx1151"  # torch[a,b]
    assert step(plan, "rocm-sdk").args["THEROCK_EXTRA"] == "device-gfx1100,device-gfx1151"
    assert step(plan, "flash-attention").args["GPU_ARCHS"] == "gfx1100;gfx1151"
    assert all(s.hash_tag.startswith(f"attnforge/{s.layer}:gfx1100_gfx1151-") for s in plan.steps)


def test_the_source_stack_compiles_for_every_arch_of_the_set(recipes):
    plan = plan_for(recipes, "gfx90a,gfx942", stack="source")
    assert step(plan, "pytorch-source").args["PYTORCH_ROCM_ARCH"] == "gfx90a;gfx942"
    assert step(plan, "aotriton").args["GPU_ARCH"] == "gfx90a;gfx942"
    assert step(plan, "ck").args["GPU_TARGETS"] == "gfx90a;gfx942"
    # the fork's CK extension is C++17, which torch 2.14.1's headers refuse: Triton for both
    assert step(plan, "flash-attention").variant == "triton"
    assert step(plan, "flash-attention").args["GPU_ARCHS"] == "gfx90a;gfx942"


def test_a_layer_joins_a_set_only_where_every_arch_supports_it(recipes):
    plan = plan_for(recipes, "gfx942,gfx1100", stack="source")
    assert step(plan, "ck").status == "skipped"  # CK's fused MHA is CDNA only
    assert step(plan, "flash-attention").variant == "triton"  # the variant both arches have


def test_the_arch_set_is_in_the_cache_key(recipes):
    one = plan_for(recipes, "gfx1151,gfx1100")
    same = plan_for(recipes, "gfx1100,gfx1151")
    other = plan_for(recipes, "gfx1151,gfx1201")
    alone = resolve(recipes, "gfx1151", "default")
    assert step(one, "pytorch-wheels").input.arch == "gfx1100_gfx1151"
    assert step(one, "pytorch-wheels").hash == step(same, "pytorch-wheels").hash
    assert step(one, "pytorch-wheels").hash != step(other, "pytorch-wheels").hash
    assert step(one, "pytorch-wheels").hash != step(alone, "pytorch-wheels").hash


@pytest.mark.parametrize(
    "spec, knob",
    [
        ("gfx1100,gfx1151", "0"),  # AOTriton 0.13b supports both
        ("gfx1150,gfx1151", "1"),  # 0.13b calls gfx1150 experimental: the image sets the knob
    ],
)
def test_the_aotriton_knob_is_set_where_any_arch_needs_it(recipes, spec, knob):
    assert step(plan_for(recipes, spec), "pytorch-wheels").args["AOTRITON_EXPERIMENTAL"] == knob


def test_the_device_code_check_requires_each_arch_code(recipes):
    smoke = step(plan_for(recipes, "gfx1151,gfx1100"), "pytorch-wheels").smoke
    device = [c for c in smoke if "device_code" in c]
    assert sorted(c["arch"] for c in device) == ["gfx1100", "gfx1151"]
    assert all(c["name"].endswith(f"[{c['arch']}]") for c in device)
    extras = sorted(c["extras"] for c in smoke if "extras" in c)
    assert extras == ["torch[device-gfx1100] torchvision[device-gfx1100]",
                      "torch[device-gfx1151] torchvision[device-gfx1151]"]  # fmt: skip
    # a check that does not name the arch runs once
    assert sum(c["name"].startswith("torchaudio's ops load") for c in smoke) == 1


def test_each_arch_is_validated_against_its_own_expectations(recipes):
    plan = plan_for(recipes, "gfx1151,gfx1100")
    assert "torch.device_arch" not in plan.expect  # differs per arch
    assert plan.expect["sdpa.default_backend"] == "flash"
    for member in ("gfx1100", "gfx1151"):
        expect = multiarch.member_expect(recipes, plan, member)
        assert expect["torch.device_arch"] == member
        assert expect["flash_attn.backend"] == "triton"


def test_a_host_validates_the_set_as_its_own_arch(recipes):
    arch = recipes.arches[multiarch.register(recipes, "gfx1151,gfx1100")]
    assert multiarch.host_member(arch, "gfx1151") == "gfx1151"
    with pytest.raises(UserError) as err:
        multiarch.host_member(arch, "gfx942")
    assert (
        "validated on a GPU of each of its arches (gfx1100, gfx1151); this host's is gfx942"
        in str(err.value)
    )


IMAGE = "sha256:" + "1" * 64
PASSED = {"image_id": IMAGE, "passed": True, "exit": 0}


@pytest.mark.parametrize(
    "stamps, why",
    [
        ({"gfx1100": PASSED, "gfx1151": PASSED}, []),
        ({"gfx1100": PASSED, "gfx1151": None}, ["gfx1151 was never validated on it"]),
        ({"gfx1100": {**PASSED, "image_id": "sha256:" + "2" * 64}, "gfx1151": PASSED},
         ["gfx1100 was validated on another image (sha256:222222222222)"]),
        ({"gfx1100": PASSED, "gfx1151": {**PASSED, "passed": False, "exit": 1}},
         ["gfx1151 failed validation (exit 1)"]),
    ],
)  # fmt: skip
def test_a_set_is_published_only_when_every_arch_passed_on_that_image(stamps, why):
    assert multiarch.publish_refusals(IMAGE, stamps) == why


def test_build_plans_a_set_from_the_command_line(tmp_path):
    proc = run_invoke(REPO, "build", "--arch", "gfx1151,gfx1100", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["arch"] == "gfx1100_gfx1151"
    assert plan["final_tag"] == "attnforge/default:gfx1100_gfx1151"
    bad = run_invoke(REPO, "build", "--arch", "gfx1151,gfx9", "--dry-run")
    assert bad.returncode == 2 and "unknown arch 'gfx9'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_publish_reads_every_arch_stamp_of_the_set(recipes, tmp_path):
    from attnforge.validation import set_validation
    from attnforge.workspace import Workspace

    ws = Workspace(REPO, tmp_path / "build", tmp_path / "reports")
    arch = recipes.arches[multiarch.register(recipes, "gfx1151,gfx1100")]
    final = "attnforge/default:gfx1100_gfx1151"
    where = ws.reports_for(arch.name, "default")
    (where / "gfx1151").mkdir(parents=True)
    (where / "gfx1151" / "validated.json").write_text(json.dumps(PASSED))
    with pytest.raises(UserError) as err:
        set_validation(ws, arch, "default", final, IMAGE)
    assert f"{final} is not published: gfx1100 was never validated on it" in str(err.value)
    (where / "gfx1100").mkdir()
    (where / "gfx1100" / "validated.json").write_text(json.dumps(PASSED))
    record = set_validation(ws, arch, "default", final, IMAGE)
    assert record["passed"] and set(record["members"]) == {"gfx1100", "gfx1151"}
