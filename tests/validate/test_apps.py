"""`python -m validate apps` for real on this machine's CPU torch with the apps layer's pins of
transformers and diffusers (the dev extra): the honest run passes and reports every
implementation; planted defects (SDPA returning wrong values, the bundled kernels diverging
behind the SDPA shim, SDPA refusing) fail, naming the app model and the implementation. The
defects are planted with the suite's prelude hook, which runs in the check process first."""

from __future__ import annotations

import json
import textwrap
from importlib import metadata

import pytest

from validate import contracts, render, suite

# The transformers the runs import (the dev extra's pin, the apps layer's in images).
TRANSFORMERS = metadata.version("transformers")

pytest.importorskip("transformers")
pytest.importorskip("diffusers")

pytestmark = pytest.mark.slow


# What the apps layer's image sets (dockerfiles/apps.Dockerfile).
IMAGE_ENV = {"USE_HUB_KERNELS": "NO"}


def run_apps(run_validate, tmp_path, *only: str, prelude: str | None = None, env=IMAGE_ENV):
    env = dict(env)
    if prelude:
        path = tmp_path / "prelude.py"
        path.write_text(textwrap.dedent(prelude))
        env["VALIDATE_PRELUDE"] = str(path)
    args = ["apps", "--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md")]
    for o in only:
        args += ["--only", o]
    proc = run_validate(*args, env=env, timeout=600)
    report = json.loads((tmp_path / "r.json").read_text())
    return proc, report


@pytest.fixture(scope="module")
def honest(tmp_path_factory, run_validate):
    tmp = tmp_path_factory.mktemp("apps")
    proc, report = run_apps(run_validate, tmp)
    return proc, report, (tmp / "r.md").read_text()


def rows(report, model):
    return {r["impl"]: r for r in report["apps"]["models"] if r["model"] == model}


def test_the_honest_run_passes_with_every_model_and_matches_the_schema(honest, schema_errors):
    proc, report, _ = honest
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert schema_errors(report) == []
    assert {r["model"] for r in report["apps"]["models"]} == set(suite.APP_MODELS)
    assert [c["id"] for c in report["checks"]] == [
        "env", "apps.contracts", *(f"apps.{m}" for m in suite.APP_MODELS)
    ]  # fmt: skip


def test_sdpa_and_the_shim_run_and_match_eager_in_transformers(honest):
    for model in ("llama-gqa", "vit"):
        got = rows(honest[1], model)
        assert got["eager"]["reference"] and got["eager"]["ran"]
        assert got["sdpa"]["ran"] and got["sdpa"]["correct"] is True
        assert got["sdpa"]["kernel"].startswith("SDPA flash")  # torch's CPU flash kernel
        assert got["sdpa+shim"]["correct"] is True
        assert "bundled kernels: 2 call(s) routed, 0 fell back" in got["sdpa+shim"]["kernel"]


def test_flash_attention_2_is_refused_with_transformers_reason_without_flash_attn(honest):
    fa2 = rows(honest[1], "llama-gqa")["flash_attention_2"]
    assert fa2["ran"] is False and fa2["must_run"] is False
    assert "FlashAttention2" in fa2["reason"] and "installed" in fa2["reason"]


def test_diffusers_backends_and_processors_run_or_say_why_not(honest):
    qwen = rows(honest[1], "qwen-image")
    assert qwen["_native_math"]["reference"] and qwen["native"]["correct"] is True
    assert "routed" in qwen["native+shim"]["kernel"] and qwen["native+shim"]["correct"] is True
    assert "flash-attn" in qwen["flash"]["reason"]  # diffusers' own requirement message
    unet = rows(honest[1], "unet-attn")
    assert unet["AttnProcessor2_0"]["correct"] is True and unet["AttnProcessor"]["reference"]


def test_the_markdown_report_has_the_apps_section(honest):
    md = honest[2]
    assert "### Apps: their own attention code" in md
    assert f"| transformers {TRANSFORMERS} | llama-gqa | sdpa+shim | ✅ | ✅ |" in md
    assert "`comfyui.sdpa.call`" in md


# Three planted defects in one run, each in one app model's calls only (told apart by the model's
# module on the call stack), so each failure names its own model: llama-gqa's SDPA computes with
# the wrong softmax scale (wrong values, no error, as the silent failures of 2026 were:
# ROCm/pytorch#3230, pytorch#189849); qwen-image's bundled kernels diverge behind the SDPA shim;
# vit's SDPA refuses.
PLANTED = """
    import os
    import sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch.nn.functional as F
    import attnforge_kernels.api.flash_attn as ki

    def called_from(module):
        frame = sys._getframe(2)
        while frame is not None:
            if module in frame.f_globals.get("__name__", ""):
                return True
            frame = frame.f_back
        return False

    _sdpa = F.scaled_dot_product_attention

    def planted_sdpa(*a, **k):
        if called_from("modeling_vit"):
            raise RuntimeError("planted: no SDPA kernel for these inputs")
        if called_from("modeling_llama"):
            k = {**k, "scale": 1.0}
        return _sdpa(*a, **k)

    F.scaled_dot_product_attention = planted_sdpa
    _attention = ki.attention

    def planted_kernels(*a, **k):
        out, lse = _attention(*a, **k)
        return (out * 1.1 if called_from("transformer_qwenimage") else out), lse

    ki.attention = planted_kernels
"""


@pytest.fixture(scope="module")
def planted(tmp_path_factory, run_validate):
    tmp = tmp_path_factory.mktemp("apps-planted")
    only = ("apps.llama-gqa", "apps.qwen-image", "apps.vit")
    proc, report = run_apps(run_validate, tmp, *only, prelude=PLANTED)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return {c["id"]: c for c in report["checks"]}, report


def test_an_sdpa_that_returns_wrong_values_fails_naming_the_app_and_implementation(planted):
    checks, report = planted
    check = checks["apps.llama-gqa"]
    assert check["status"] == "fail"
    assert check["message"].startswith(
        f"transformers {TRANSFORMERS} llama-gqa: sdpa diverges from eager"
    )
    got = rows(report, "llama-gqa")
    assert got["sdpa"]["correct"] is False
    # the shim routes to the bundled kernels, which the planted wrapper does not touch here
    assert got["sdpa+shim"]["correct"] is True


def test_bundled_kernels_that_diverge_behind_the_shim_fail(planted):
    checks, report = planted
    assert "native+shim diverges from _native_math" in checks["apps.qwen-image"]["message"]
    assert rows(report, "qwen-image")["native"]["correct"] is True


def test_an_sdpa_that_refuses_fails_where_it_must_run(planted):
    checks, report = planted
    assert (
        "sdpa refused where it must run: RuntimeError: planted: no SDPA kernel"
        in checks["apps.vit"]["message"]
    )
    assert rows(report, "vit")["flash_attention_2"]["must_run"] is False


# ---------------------------------------------------------------------------- contracts
# These need no app: a planted flash_attn package in a temp dir stands in for the image's.


def _fake_flash_attn(root, signature="q, k, v, dropout_p=0.0, softmax_scale=None, causal=False",
                     submodules=("flash_attn_interface", "flash_attn_triton_amd")):  # fmt: skip
    pkg = root / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"def flash_attn_func({signature}):\n    return q\n")
    for name in submodules:
        (pkg / f"{name}.py").write_text("")
    return root


def _probe(contract_id, facts):
    [contract] = [c for c in contracts.CONTRACTS if c["id"] == contract_id]
    return contracts.probe(contract, facts)


ALL_FACTS = {"flash_attn": True, "rocm": True, "gpu": True}


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
    import importlib
    import sys

    def make(**kw):
        root = _fake_flash_attn(tmp_path, **kw)
        monkeypatch.syspath_prepend(str(root))
        for name in [m for m in sys.modules if m.split(".")[0] == "flash_attn"]:
            monkeypatch.delitem(sys.modules, name)
        importlib.invalidate_caches()
        return root

    return make


def test_every_contract_names_its_app_call_and_source():
    for c in contracts.CONTRACTS:
        assert c["app"] in ("ComfyUI", "vLLM") and c["call"] and c["effect"]
        assert c["source"].startswith(("Comfy-Org/ComfyUI@", "vllm-project/vllm")), c["id"]


def test_comfyuis_flash_attn_call_binds_to_flash_attns_signature(fake_site):
    fake_site()
    assert _probe("comfyui.flash_attn.call", ALL_FACTS)["status"] == "pass"
    assert _probe("vllm.vit.triton_amd.find_spec", ALL_FACTS)["status"] == "pass"


def test_a_flash_attn_whose_signature_drifted_fails_naming_comfyui_and_what_it_has(fake_site):
    fake_site(signature="q, k, v, causal=False")
    result = _probe("comfyui.flash_attn.call", ALL_FACTS)
    assert result["status"] == "fail"
    assert result["message"].startswith(
        "ComfyUI's `flash_attn_func(q, k, v, dropout_p=0.0, causal=False)` does not hold here: "
        "got an unexpected keyword argument 'dropout_p'; the image has "
        "flash_attn_func(q, k, v, causal=False)"
    )


def test_vllms_private_module_probe_fails_where_flash_attn_lacks_it(fake_site):
    fake_site(submodules=("flash_attn_interface",))  # the Triton backend moved to aiter
    result = _probe("vllm.vit.triton_amd.find_spec", ALL_FACTS)
    assert result["status"] == "fail"
    assert "vLLM's `find_spec('flash_attn.flash_attn_triton_amd') is not None`" in result["message"]
    assert "flash_attn has flash_attn_interface" in result["message"]
    assert "vllm#50449" in result["message"]


def test_probes_that_need_flash_attn_or_rocm_are_not_applicable_elsewhere():
    result = _probe("vllm.vit.triton_amd.env", {"flash_attn": False, "rocm": False, "gpu": False})
    assert result["status"] == "n/a"
    assert result["message"] == "torch is not a ROCm build; flash_attn is not installed"


def test_sdpas_documented_signature_is_read_where_the_builtin_has_none():
    import torch

    sig = contracts.signature(torch.nn.functional.scaled_dot_product_attention)
    assert list(sig.parameters)[:6] == ["query", "key", "value", "attn_mask", "dropout_p",
                                        "is_causal"]  # fmt: skip


def test_the_suite_plans_every_model_of_the_table_and_quick_keeps_one_per_app():
    from validate.checks import apps

    assert suite.APP_MODELS == tuple(m.name for m in apps.MODELS)
    ids = [c["id"] for c in suite.plan("all", quick=False)]
    assert "apps.contracts" in ids and all(f"apps.{m}" in ids for m in suite.APP_MODELS)
    quick = [c["params"].get("model") for c in suite.plan("apps", quick=True)]
    assert {apps.BY_NAME[m].app for m in quick if m} == {"transformers", "diffusers"}


def test_a_refused_must_run_implementation_renders_as_a_failure():
    report = {"apps": {"contracts": [], "models": [
        {"app": "transformers", "model": "vit", "impl": "sdpa", "status": "fail", "ran": False,
         "correct": None, "must_run": True, "kernel": None, "reason": "RuntimeError: x"}]}}  # fmt: skip
    [row] = [ln for ln in render.apps_markdown(report) if "| vit |" in ln]
    assert "| sdpa | ❌ |  | RuntimeError: x |" in row


# ---------------------------------------------------------------------------- kernels from the Hub


def test_every_implementation_says_where_its_kernel_came_from(honest):
    _, report, md = honest
    got = rows(report, "llama-gqa")
    assert got["sdpa"]["source"].startswith("torch's SDPA (torch ")
    assert (
        got["sdpa+shim"]["source"]
        == "the bundled kernels (attnforge_kernels.sdpa_shim) behind torch's SDPA"
    )
    assert got["eager"]["source"] == "transformers eager attention (matmul + softmax)"
    assert got["flash_attention_2"]["source"] == "none (refused)"
    assert "| kernel from |" in md


# transformers 5.25 falls back from flash_attention_2 to kernels.get_kernel("kernels-community/
# flash-attn2") where flash_attn is missing and USE_HUB_KERNELS is yes. Planted on the venv's
# transformers: a stand-in for Hugging Face's `kernels` API (get_kernel on the module named
# `kernels`: Hugging Face's where it is installed, else an empty module made here) whose body
# would download, and set_attn_implementation calling it as 5.25 does. Without the check's
# watch, the stand-in raises, transformers refuses flash_attention_2, and the refusal alone
# would not fail the check.
HUB_FALLBACK = """
    import importlib.machinery
    import sys
    import types

    try:
        import kernels
    except ModuleNotFoundError:
        kernels = sys.modules["kernels"] = types.ModuleType("kernels")
        kernels.__spec__ = importlib.machinery.ModuleSpec("kernels", None)
    import transformers.modeling_utils as mu

    def get_kernel(repo_id, *args, **kwargs):
        raise RuntimeError(f"stand-in kernels.get_kernel would download {repo_id}")

    kernels.get_kernel = get_kernel
    _select = mu.PreTrainedModel.set_attn_implementation

    def set_attn_implementation(self, name, *args, **kwargs):
        if name == "flash_attention_2":
            from kernels import get_kernel as fetch

            fetch("kernels-community/flash-attn2")
        return _select(self, name, *args, **kwargs)

    mu.PreTrainedModel.set_attn_implementation = set_attn_implementation
"""


def test_a_hub_kernel_fallback_fails_naming_the_switch(tmp_path, run_validate):
    proc, report = run_apps(run_validate, tmp_path, "apps.llama-gqa", prelude=HUB_FALLBACK, env={})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [check] = [c for c in report["checks"] if c["id"] == "apps.llama-gqa"]
    assert check["status"] == "fail"
    assert (
        "flash_attention_2 fell back to a Hub kernel (kernels-community/flash-attn2) instead of "
        "the image's: set USE_HUB_KERNELS=NO in the image's environment" in check["message"]
    )
    fa2 = rows(report, "llama-gqa")["flash_attention_2"]
    assert fa2["source"] == "a Hub kernel (kernels-community/flash-attn2)"
    assert "refused to fetch the Hub kernel" in fa2["reason"]
    assert rows(report, "llama-gqa")["sdpa"]["correct"] is True  # the rest ran as before
