"""The SDPA grid's layouts, masks, head dim 512 and large magnitudes (issue 25 §1).

The table is checked for what each case claims; then each new kind of case runs through the real
``sdpa.case`` check on CPU torch, honest and with a planted defect of the kind users met in 2026:
a backend that reads a strided V as if it were contiguous (ROCm/pytorch#3230), one that returns
NaN on large bf16 values (ROCm/aotriton#54), one that refuses head dim 512 (pytorch#194280).
The defects are planted only in forced fused runs (math disabled), as a real backend's would be.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from validate import grid
from validate.checks import numerics, sdpa

CTX = types.SimpleNamespace(progress=lambda stage: None)
BY_NAME = {c.name: c for c in grid.GRID}


def run_case(name: str, limits: dict | None = None) -> dict:
    c = BY_NAME[name]
    params = {"case": {k: v for k, v in c.to_json().items() if k != "gqa"}, "reference": False}
    return sdpa.case({**params, "limits": limits or {}}, CTX)


@pytest.fixture
def planted(monkeypatch):
    """Install ``defect(q, k, v, out) -> out`` into SDPA's fused runs (math switched off)."""

    def install(defect):
        real = torch.nn.functional.scaled_dot_product_attention

        def sdpa_with_defect(q, k, v, *args, **kwargs):
            out = real(q, k, v, *args, **kwargs)
            if torch.backends.cuda.math_sdp_enabled():
                return out  # the default run and the forced math run stay honest
            return defect(q, k, v, args, kwargs, real, out)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa_with_defect)

    return install


# --- the table --------------------------------------------------------------------------------


def test_every_case_says_why_it_is_there_and_names_are_unique():
    assert len({c.name for c in grid.GRID}) == len(grid.GRID)
    assert all(len(c.why) > 20 for c in grid.GRID), [c.name for c in grid.GRID if not c.why]


def test_the_grid_covers_the_layouts_masks_and_values_apps_pass():
    assert {c.layout for c in grid.GRID} == set(grid.LAYOUTS)
    assert {c.mask for c in grid.GRID} - {None} == set(grid.MASKS)
    assert {c.values for c in grid.GRID} == set(grid.VALUES)
    assert 512 in {c.head_dim for c in grid.GRID}
    assert any(c.gqa for c in grid.GRID)  # enable_gqa=True
    expanded = [c for c in grid.GRID if c.layout == "kv-expanded"]
    assert expanded and not any(c.gqa for c in expanded)  # stride 0, no enable_gqa
    big = [c for c in grid.GRID if c.values != "normal"]
    assert big and all(c.dtype == "bf16" for c in big)


def test_quick_keeps_the_reference_and_one_case_of_each_silent_failure():
    quick = grid.grid(quick=True)
    assert grid.REFERENCE_CASE in {c.name for c in quick}
    assert any(c.gqa for c in quick)
    assert any(c.layout == "v-strided" for c in quick)
    assert any(c.mask for c in quick)
    assert any(c.head_dim > 256 for c in quick)  # above gfx11's limit: judged or refused
    assert any(c.values != "normal" for c in quick)
    assert any(c.causal and c.seqlen_q <= 16 for c in quick)  # tiny causal: deferred faults
    assert len(quick) <= 8  # the lead times --quick on the GPU: a bounded count


def test_a_case_with_an_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="unknown layout"):
        grid.Case("x", "fp16", False, 64, 1, 1, 8, 8, layout="sbhd")


# --- inputs as apps make them ------------------------------------------------------------------


def test_layouts_give_the_strides_apps_pass():
    q, k, v = numerics.make_inputs(BY_NAME["bf16-d64-s384-bshd"], "cpu")
    for t in (q, k, v):
        assert not t.is_contiguous() and t.stride()[2] == 8 * 64  # (B,S,H,D) seen as (B,H,S,D)
    q, k, v = numerics.make_inputs(BY_NAME["fp16-d128-s256-v-strided"], "cpu")
    assert q.is_contiguous() and k.is_contiguous() and not v.is_contiguous()
    c = BY_NAME["bf16-d128-s256-mqa-expanded-causal"]
    q, k, v = numerics.make_inputs(c, "cpu")
    assert k.shape == q.shape and k.stride()[1] == 0 and v.stride()[1] == 0


def test_masks_pad_batch_one_and_leave_every_row_something_to_attend():
    c = BY_NAME["fp16-d64-s256-bool-padding"]
    m = numerics.make_mask(c, "cpu")
    assert m.dtype == torch.bool and m.shape == (2, 1, 1, 256)
    assert m[0].all() and m[1, ..., :192].all() and not m[1, ..., 192:].any()
    f = numerics.make_mask(BY_NAME["bf16-d64-q1024-k77-float-mask"], "cpu")
    assert f.dtype == torch.bfloat16 and f.shape == (2, 1, 1024, 77)
    assert (f[1, ..., 58:] == torch.finfo(torch.bfloat16).min).all()


def test_big_logits_reach_about_1e4():
    c = BY_NAME["bf16-d128-s512-big-logits"]
    q, k, _ = numerics.make_inputs(c, "cpu")
    logits = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(c.head_dim)
    assert 5e3 < logits.abs().max().item() < 1e5


@pytest.mark.parametrize("name", ["fp16-d64-s256-bool-padding", "bf16-d64-q1024-k77-float-mask"])
def test_the_reference_applies_masks_as_sdpa_does(name):
    c = grid.for_cpu(BY_NAME[name])
    q, k, v = (t.float() for t in numerics.make_inputs(c, "cpu"))
    mask = numerics.make_mask(c, "cpu")
    mask = mask if mask.dtype == torch.bool else mask.float()
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = numerics.attention_math(q, k, v, False, upcast=True, attn_mask=mask)
    assert torch.allclose(got, want, atol=1e-5)


# --- the check, honest and with planted defects ------------------------------------------------


@pytest.mark.parametrize("name", [c.name for c in grid.GRID if c.layout != "bhsd" or c.mask])
def test_the_layout_and_mask_cases_pass_on_honest_torch(name):
    rec = run_case(name)
    assert rec["status"] == "pass", rec["message"]
    assert rec["details"]["backends"]["flash"]["run"] == "pass"


def _v_read_as_contiguous(q, k, v, args, kwargs, real, out):
    # The ROCm/pytorch#3230 kind: V's storage read with contiguous strides.
    if v.is_contiguous():
        return out
    wrong = torch.as_strided(v.contiguous().transpose(1, 2).contiguous(), v.shape,
                             torch.empty(v.shape).stride())  # fmt: skip
    return real(q, k, wrong, *args, **kwargs)


def test_a_backend_that_reads_a_strided_v_as_contiguous_fails_the_strided_case(planted):
    planted(_v_read_as_contiguous)
    rec = run_case("fp16-d128-s256-v-strided")
    assert rec["status"] == "fail"
    assert "flash: max|err|" in rec["message"] and "> tolerance" in rec["message"]
    assert rec["details"]["backends"]["math"]["run"] == "pass"
    # The contiguous grid alone would not have seen it.
    assert run_case(grid.REFERENCE_CASE)["status"] == "pass"


def _nan_on_large_values(q, k, v, args, kwargs, real, out):
    # The ROCm/aotriton#54 kind: NaN once bf16 inputs are large.
    return out.masked_fill(torch.ones_like(out, dtype=torch.bool), math.nan) if (
        v.abs().max() > 1000 or q.abs().max() > 100
    ) else out  # fmt: skip


@pytest.mark.parametrize("name", ["bf16-d128-s512-big-v", "bf16-d128-s512-big-logits"])
def test_nan_from_a_backend_fails_naming_it(planted, name):
    assert run_case(name)["status"] == "pass"
    planted(_nan_on_large_values)
    rec = run_case(name)
    assert rec["status"] == "fail"
    assert "flash: " in rec["message"] and "non-finite values (NaN/inf)" in rec["message"]


def _refuse_beyond_256(q, k, v, args, kwargs, real, out):
    if q.shape[-1] > 256:
        raise RuntimeError("No available kernel. Aborting execution.")
    return out


GFX11_LIMITS = {"head_dim_max": 256, "backends": ["flash", "efficient"],
                "source": "pytorch#194280"}  # fmt: skip


def test_head_dim_512_refused_where_the_arch_table_expects_it_is_recorded_as_expected(planted):
    planted(_refuse_beyond_256)
    rec = run_case("bf16-d512-s256", GFX11_LIMITS)
    assert rec["status"] == "pass", rec["message"]
    flash = rec["details"]["backends"]["flash"]
    assert flash["run"] == "unsupported" and flash["expected_refusal"] is True
    assert flash["note"].startswith("refused, as expected on this arch: head dim 512 > 256")
    assert flash["reasons"]  # PyTorch's own words from can_use_flash_attention
    assert rec["details"]["expected_refusal"]["backends"] == ["flash", "efficient"]


def test_head_dim_512_accepted_is_judged_and_wrong_values_fail(planted):
    planted(lambda q, k, v, a, kw, real, out: out.clamp(max=0.5))  # pytorch#189849's saturation
    rec = run_case("bf16-d512-s256", GFX11_LIMITS)
    assert rec["status"] == "fail"
    assert "flash: max|err|" in rec["message"]
    assert "accepted although a refusal is expected" in rec["details"]["backends"]["flash"]["note"]
