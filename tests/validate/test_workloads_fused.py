"""Fused or math at the workloads' shapes (issue 25 §2), on CPU torch: the honest run is fused at
every shape, and a planted math fallback breaks the stack's promise with the shape, PyTorch's
reasons and the likely fix; plus how recipes turn `fused:` into promises per arch."""

from __future__ import annotations

import math
import types
from pathlib import Path

import pytest
import torch

from attnforge.plan import resolve
from attnforge.recipes import load_recipes
from attnforge.validation import expect_document
from contract import workloads
from validate.checks import workloads as fused_check
from validate.expect import ExpectError, evaluate, parse_expect

REPO = Path(__file__).resolve().parents[2]
CTX = types.SimpleNamespace(progress=lambda stage: None)


def run(quick: bool = True) -> dict:
    return fused_check.run({"quick": quick}, CTX)


@pytest.fixture
def flash_off():
    torch.backends.cuda.enable_flash_sdp(False)
    yield
    torch.backends.cuda.enable_flash_sdp(True)


def test_every_workload_shape_records_the_pick_and_the_profiler_backend():
    rec = run(quick=False)
    assert rec["status"] == "pass", rec["message"]
    rows = rec["details"]["shapes"]
    bf16_too = sum(len(workloads.shapes(n)) for n in fused_check.BF16_TOO)
    assert len(rows) == sum(len(workloads.shapes(n)) for n in workloads.WORKLOADS) + bf16_too
    vit = [r["shape"] for r in rows if r["workload"] == "vit"]
    assert {"vit-224x224-siglip-so400m-d72-tiny", "vit-336x336-vit-h14-d80-tiny"} <= set(vit)
    for r in rows:
        assert r["default_backend"] == "flash" and r["profiler_backend"] == "flash"
        assert r["fused"] and r["run"] == "ok"
    assert all(rec["observations"][f"sdpa.workload.{n}.fused"] for n in workloads.WORKLOADS)


def test_the_cpu_stacks_promises_hold_on_honest_torch():
    plan = resolve(load_recipes(REPO), "cpu", "cpu")
    promised = {k: v for k, v in plan.expect.items() if k.startswith("sdpa.workload.")}
    assert set(promised) == {f"sdpa.workload.{n}.fused" for n in workloads.WORKLOADS}
    results = evaluate(promised, run()["observations"])
    assert all(r.met for r in results), [r.message for r in results]


def test_a_math_fallback_where_fused_was_promised_breaks_naming_shape_reasons_and_fix(flash_off):
    rec = run()
    assert rec["status"] == "pass"  # observing is not failing: the promise decides
    obs = rec["observations"]
    assert obs["sdpa.workload.vit.fused"] is False
    [fb] = obs["sdpa.workload.vit.fallbacks"]
    assert fb["shape"] == "vit-224x224-siglip-so400m-d72-tiny" and fb["default_backend"] == "math"
    [result] = evaluate({"sdpa.workload.vit.fused": True}, {**obs, "sdpa.flash.enabled": False})
    assert not result.met
    msg = result.message
    assert msg.startswith(
        "The stack promised sdpa.workload.vit.fused = true, but validation saw false."
    )
    assert "vit-224x224-siglip-so400m-d72-tiny (b1 h2/2 sq64 sk64 d72 fp16) ran math" in msg
    assert "PyTorch says flash: " in msg
    assert "Flash SDPA is disabled in this process" in msg


def test_on_rocm_the_fix_names_the_experimental_knob_and_the_shim():
    obs = {"torch.hip": True, "sdpa.workload.vit.fused": False, "sdpa.workload.vit.fallbacks": [
        {"shape": "vit-224x224-siglip-so400m-d72", "default_backend": "math",
         "params": {"b": 1, "h": 16, "hkv": 16, "sq": 256, "sk": 256, "d": 72, "dtype": "fp16"},
         "reasons": {"flash": ["Flash attention does not support head_dim 72 on gfx1151"]}}]}  # fmt: skip
    [result] = evaluate({"sdpa.workload.vit.fused": True}, obs)
    assert "PyTorch says flash: Flash attention does not support head_dim 72" in result.message
    assert "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1" in result.message
    assert "ATTNFORGE_SDPA_SHIM=1" in result.message and "ROCm/ATOM#1357" in result.message


def test_math_at_a_large_shape_is_recorded_but_not_run(flash_off, monkeypatch):
    monkeypatch.setattr(fused_check, "MATH_RUN_LIMIT_BYTES", 1)
    row = run()["details"]["shapes"][0]
    assert row["run"].startswith("not run: math here would hold") and not row["fused"]


def test_nan_at_a_workload_shape_fails_naming_shape_and_backend(monkeypatch):
    real = torch.nn.functional.scaled_dot_product_attention

    def nan_for_d128(q, k, v, *a, **kw):
        out = real(q, k, v, *a, **kw)
        return out.fill_(math.nan) if q.shape[-1] == 128 else out

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", nan_for_d128)
    rec = run()
    assert rec["status"] == "fail"
    assert "qwen-image-1664x928-joint-tiny (flash): " in rec["message"]
    assert "non-finite values (NaN/inf) in the output" in rec["message"]


def test_recipes_promise_fused_per_arch_and_workload():
    recipes = load_recipes(REPO)
    rdna = resolve(recipes, "gfx1151", "default").expect
    cdna = resolve(recipes, "gfx942", "default").expect
    assert rdna["sdpa.workload.sd15.fused"] is True and "sdpa.workload.vit.fused" not in rdna
    assert cdna["sdpa.workload.vit.fused"] is True


def test_the_expect_document_carries_the_arch_sdpa_limits():
    recipes = load_recipes(REPO)
    doc = expect_document(recipes, resolve(recipes, "gfx1151", "default"))
    assert doc["sdpa_limits"]["head_dim_max"] == 256
    assert "pytorch#194280" in doc["sdpa_limits"]["source"]
    assert parse_expect(doc).sdpa_limits == doc["sdpa_limits"]
    assert "sdpa_limits" not in expect_document(recipes, resolve(recipes, "gfx942", "default"))
    with pytest.raises(ExpectError, match="'sdpa_limits' must be an object"):
        parse_expect({"expect": {}, "sdpa_limits": {"head_dim_max": "256"}})
