"""Expectations: the key vocabulary, parsing, matching and the broken-promise sentences."""

import json
import subprocess
import sys

import pytest

from validate.expect import (
    KNOWN_KEYS,
    ExpectError,
    evaluate,
    likely_fix,
    load_expect,
    matches,
    parse_expect,
)


def test_known_keys_import_without_torch(repo):
    code = "import sys, validate.expect as e; assert e.KNOWN_KEYS; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'yaml', 'attnforge')))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_known_keys_are_documented_one_liners():
    for key, text in KNOWN_KEYS.items():
        assert key.count(".") >= 1 and text and "\n" not in text, key
    for key in (
        "sdpa.default_backend",
        "sdpa.flash.works",
        "rocm.preferred_fa_library",
        "flash_attn.backend",
        "torch.hip",
        "torch.device_arch",
        "kernels.works",
    ):
        assert key in KNOWN_KEYS


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ([], "top level must be a JSON object"),
        (
            {"expect": {"sdpa.default": "flash"}},
            "unknown expectation key(s) sdpa.default; valid keys:",
        ),
        ({"expect": {"torch.hip": {"a": 1}}}, "must be a string, boolean, number"),
        ({"expect": {"torch.hip": []}}, "non-empty list"),
        ({"expect": {}, "stacks": "x"}, "unknown top-level field(s) stacks"),
        ({"expect": [], "stack": "x"}, "'expect' must be an object"),
        ({"expect": {}, "arch": 1151}, "'arch' must be a string"),
    ],
)
def test_parse_rejects_with_a_sentence(doc, fragment):
    with pytest.raises(ExpectError) as err:
        parse_expect(doc, "recipes/x.json")
    assert fragment in str(err.value)
    assert str(err.value).startswith("recipes/x.json")


def test_load_reports_json_position(tmp_path):
    p = tmp_path / "e.json"
    p.write_text('{"expect": {"torch.hip": tru}}')
    with pytest.raises(ExpectError, match=r"e\.json:1:\d+: not valid JSON"):
        load_expect(p)


def test_load_missing_file(tmp_path):
    with pytest.raises(ExpectError, match="cannot read expect file"):
        load_expect(tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("key", "expected", "observed", "ok"),
    [
        ("sdpa.default_backend", "flash", "flash", True),
        ("sdpa.default_backend", "FLASH", "flash", True),
        ("sdpa.default_backend", "flash", "math", False),
        ("sdpa.default_backend", ["flash", "cudnn"], "cudnn", True),
        ("torch.hip", True, True, True),
        ("torch.hip", "true", True, True),
        ("torch.hip", True, False, False),
        ("torch.hip", 1, True, False),
        ("torch.version", "2.9", "2.9.1+rocm7.1", True),
        ("torch.version", "2.9", "2.10.0", False),
        ("torch.version", "2.1", "2.13.0", False),
        ("triton.version", "3.6", "3.6.0", True),
        ("torch.device_arch", "gfx1151", "gfx1151", True),
        ("torch.device_arch", "gfx115", "gfx1151", False),
    ],
)
def test_matches(key, expected, observed, ok):
    assert matches(key, expected, observed) is ok


def test_evaluate_met_and_broken():
    res = evaluate(
        {"sdpa.default_backend": "flash", "torch.hip": True},
        {"sdpa.default_backend": "math", "torch.hip": True},
    )
    assert [r.met for r in res] == [False, True]
    assert res[0].message.startswith(
        "The stack promised sdpa.default_backend = flash, but validation saw math."
    )
    assert res[0].to_json()["status"] == "broken"


def test_missing_observation_says_which_check_and_why():
    res = evaluate(
        {"flash_attn.works": True}, {}, {"flash_attn.works": "check flash_attn.run is skip: no GPU"}
    )
    assert not res[0].met
    assert "not observed (check flash_attn.run is skip: no GPU)" in res[0].message


def test_rocm_flash_fix_names_the_experimental_knob_and_pytorch_reason():
    ctx = {
        "torch.hip": True,
        "sdpa.flash.available": True,
        "sdpa.flash.enabled": True,
        "sdpa.flash.reasons": [
            "Flash attention support on Navi31 GPU is still experimental. Enable it with TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1."
        ],
    }
    msg = evaluate({"sdpa.default_backend": "flash"}, {**ctx, "sdpa.default_backend": "math"})[
        0
    ].message
    assert "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1" in msg
    assert "PyTorch says: Flash attention support on Navi31 GPU is still experimental" in msg


@pytest.mark.parametrize(
    ("key", "expected", "observed", "ctx", "fragment"),
    [
        ("sdpa.flash.works", True, False, {"sdpa.flash.available": False}, "USE_FLASH_ATTENTION=1"),
        (
            "sdpa.default_backend",
            "flash",
            "efficient",
            {"sdpa.flash.enabled": False},
            "enable_flash_sdp(False)",
        ),
        (
            "sdpa.default_backend",
            "flash",
            "cudnn",
            {"sdpa.flash.can_use": True, "sdpa.flash.enabled": True},
            "enable_cudnn_sdp(False)",
        ),
        (
            "rocm.preferred_fa_library",
            "ck",
            "aotriton",
            {"torch.hip": True},
            "TORCH_ROCM_FA_PREFER_CK=1",
        ),
        ("rocm.effective_fa_library", "ck", "aotriton", {"torch.hip": True}, "USE_ROCM_CK_SDPA=1"),
        (
            "rocm.preferred_fa_library",
            "aotriton",
            "ck",
            {"torch.hip": True},
            "Unset TORCH_ROCM_FA_PREFER_CK",
        ),
        ("flash_attn.backend", "triton", "ck", {}, 'FLASH_ATTENTION_TRITON_AMD_ENABLE="TRUE"'),
        ("flash_attn.backend", "triton", "absent", {}, "does not import"),
        ("torch.gpu_available", True, False, {}, "/dev/kfd"),
        (
            "sdpa.efficient.works",
            True,
            False,
            {"sdpa.efficient.reasons": ["needs sm80"]},
            "needs sm80",
        ),
    ],
)
def test_likely_fix(key, expected, observed, ctx, fragment):
    assert fragment in likely_fix(key, expected, observed, ctx)


def test_cpu_recipe_shape_round_trips(tmp_path):
    p = tmp_path / "cpu.json"
    p.write_text(
        json.dumps(
            {
                "stack": "cpu",
                "arch": "cpu",
                "expect": {"torch.hip": False, "sdpa.default_backend": "flash"},
            }
        )
    )
    spec = load_expect(p)
    assert (spec.stack, spec.arch, spec.expect["sdpa.default_backend"]) == ("cpu", "cpu", "flash")


@pytest.mark.parametrize(
    "aotriton, fragment",
    [
        ({"version": "0.11.2b", "experimental": True},
         "AOTriton 0.11.2b is experimental on this arch (recipes/arches.yaml): set "
         "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1"),
        ({"version": "0.12b", "experimental": False},
         "AOTriton 0.12b is not experimental on this arch (recipes/arches.yaml), so "
         "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1 is not the cause"),
        (None, "On an arch that recipes/arches.yaml marks AOTriton-experimental"),
    ],
)  # fmt: skip
def test_the_experimental_advice_follows_the_recipes_facts_not_a_list_of_arches(aotriton, fragment):
    obs = {"torch.hip": True, "sdpa.default_backend": "math"}
    msg = evaluate({"sdpa.default_backend": "flash"}, obs, aotriton=aotriton)[0].message
    assert fragment in msg and "gfx" not in msg
