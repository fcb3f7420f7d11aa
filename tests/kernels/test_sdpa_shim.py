"""The SDPA shim: what it routes, what it falls back on, and that SDPA's semantics hold."""

import pytest
import torch
import torch.nn.functional as F

from attnforge_kernels import sdpa_shim

ORIGINAL = F.scaled_dot_product_attention


@pytest.fixture
def shim():
    sdpa_shim.reset_stats()
    sdpa_shim.enable()
    yield sdpa_shim
    sdpa_shim.disable()
    sdpa_shim.reset_stats()


def _qkv(sq, sk, hq=2, hk=2, d=32, dtype=torch.float16):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(1, hq, sq, d, generator=g).to(dtype),
        torch.randn(1, hk, sk, d, generator=g).to(dtype),
        torch.randn(1, hk, sk, d, generator=g).to(dtype),
    )


def _ref(q, k, v, **kw):
    return ORIGINAL(q.float(), k.float(), v.float(), **kw)


@pytest.mark.parametrize("sq,sk", [(20, 20), (20, 45), (45, 20)])
def test_is_causal_keeps_sdpa_top_left_alignment(shim, sq, sk):
    q, k, v = _qkv(sq, sk)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert shim.stats()["routed"] == 1
    assert (out.float() - _ref(q, k, v, is_causal=True)).abs().max() < 3e-3


def test_scale_and_enable_gqa_are_honoured(shim):
    q, k, v = _qkv(30, 30, hq=4, hk=2)
    out = F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True)
    ref = _ref(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), scale=0.3)
    assert shim.stats() == {"routed": 1, "fallback": 0, "reasons": {}}
    assert (out.float() - ref).abs().max() < 3e-3


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        ({"attn_mask": "bool"}, "attn_mask"),
        ({"dropout_p": 0.5}, "dropout"),
        ({"dtype": torch.float32}, "dtype"),
        ({"hk": 1}, "heads"),  # GQA shapes without enable_gqa: SDPA's own error path
    ],
)
def test_unsupported_calls_fall_back_with_a_reason(shim, kwargs, reason):
    kwargs = dict(kwargs)
    q, k, v = _qkv(16, 16, hk=kwargs.pop("hk", 2), dtype=kwargs.pop("dtype", torch.float16))
    if kwargs.get("attn_mask") == "bool":
        kwargs["attn_mask"] = torch.ones(16, 16, dtype=torch.bool)
    try:
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    except RuntimeError:
        pass  # the original SDPA may itself reject the call; the shim still counted it
    st = shim.stats()
    assert st["routed"] == 0 and st["fallback"] == 1 and st["reasons"] == {reason: 1}


def test_disable_restores_the_original_function(shim):
    shim.disable()
    assert F.scaled_dot_product_attention is ORIGINAL and not shim.enabled()


def test_routed_call_has_gradients(shim):
    q, k, v = (t.requires_grad_() for t in _qkv(17, 17))
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None


@pytest.mark.slow
def test_environment_variable_enables_the_shim_at_import():
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, ATTNFORGE_SDPA_SHIM="1", TRITON_INTERPRET="1")
    code = "import attnforge_kernels, torch.nn.functional as F; print(F.scaled_dot_product_attention is attnforge_kernels.api.sdpa._shim)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip() == "True", out.stderr
