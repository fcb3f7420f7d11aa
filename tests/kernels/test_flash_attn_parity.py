"""flash_attn parity of the entry points in Triton's interpreter: the exception types of
argument errors and the FP8 varlen and qkv-packed forms (seed 002's four-function FP8 API)."""

import pytest
import torch

from attnforge_kernels import (
    flash_attn_fp8_func,
    flash_attn_func,
    flash_attn_qkvpacked_fp8_func,
    flash_attn_varlen_fp8_func,
    flash_attn_varlen_qkvpacked_fp8_func,
    flash_attn_with_kvcache,
)
from attnforge_kernels.api.errors import ArgumentError, ArgumentTypeError
from attnforge_kernels.checks import variants
from attnforge_kernels.checks.case import fp8

E4M3 = torch.float8_e4m3fn


def test_a_block_table_too_short_for_cache_seqlens_raises_runtime_error_like_flash_attn():
    # flash-attention tests/test_flash_attn.py::test_flash_attn_kvcache_paged_block_table_bounds
    page, d = 16, 16
    cache = torch.randn(4, page, 1, d, dtype=torch.float16)
    table = torch.zeros(1, 1, dtype=torch.int32)
    q = torch.randn(1, 1, 1, d, dtype=torch.float16)
    new = torch.randn(1, 1, 1, d, dtype=torch.float16)
    full = torch.full((1,), page, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="block_table"):
        flash_attn_with_kvcache(q, cache, cache, cache_seqlens=full + 1, block_table=table)
    with pytest.raises(RuntimeError, match="block_table"):
        flash_attn_with_kvcache(
            q, cache.clone(), cache.clone(), k=new, v=new, cache_seqlens=full, block_table=table
        )
    out = flash_attn_with_kvcache(q, cache, cache, cache_seqlens=full, block_table=table)
    assert out.shape == (1, 1, 1, d) and not out.isnan().any()


@pytest.mark.parametrize(
    "make, kind",
    [
        # flash_api.cpp: "FlashAttention only support fp16 and bf16 data type"
        (lambda q, k, v: flash_attn_func(q.float(), k.float(), v.float()), ArgumentTypeError),
        # "Number of heads in key/value must divide number of heads in query"
        (lambda q, k, v: flash_attn_func(q, k[:, :, :1].expand(-1, -1, 3, -1), v), ArgumentError),
        # "FlashAttention forward only supports head dimension at most 256"
        (
            lambda q, k, v: flash_attn_func(*(t.repeat(1, 1, 1, 10) for t in (q, k, v))),
            ArgumentError,
        ),
    ],
)
def test_argument_errors_are_runtime_errors_as_flash_attns_checks_raise(make, kind):
    q, k, v = (torch.randn(1, 5, 2, 32, dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises(RuntimeError) as info:
        make(q, k, v)
    assert isinstance(info.value, kind)
    # And still the Python type their meaning has.
    assert isinstance(info.value, TypeError if kind is ArgumentTypeError else ValueError)


def _quantised(b, s, h, d, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, s, h, d, generator=g) * 3).to(E4M3)


@pytest.mark.parametrize("causal", [False, True])
def test_fp8_varlen_is_the_fixed_length_kernel_on_each_sequence(causal):
    lens_q, lens_k, hq, hk, d = [7, 1, 20], [9, 13, 20], 4, 2, 32
    qs = [_quantised(1, n, hq, d, i) for i, n in enumerate(lens_q)]
    ks = [_quantised(1, n, hk, d, 10 + i) for i, n in enumerate(lens_k)]
    vs = [_quantised(1, n, hk, d, 20 + i) for i, n in enumerate(lens_k)]
    descale_v = torch.tensor([[0.5, 2.0], [1.0, 1.5], [0.25, 1.0]])  # (batch, Hk)
    cu_q = torch.tensor([0, 7, 8, 28], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 22, 42])  # int64 is taken, as int32
    out, lse, probs = flash_attn_varlen_fp8_func(
        *(torch.cat([t[0].float() for t in ts]).to(E4M3) for ts in (qs, ks, vs)),
        cu_q, cu_k, 20, 20, descale_v=descale_v, causal=causal, return_attn_probs=True,
    )  # fmt: skip
    assert out.shape == (28, hq, d) and out.dtype == torch.bfloat16 and probs is None
    assert lse.shape == (hq, 28)
    for b in range(3):
        o, l_b, _ = flash_attn_fp8_func(
            qs[b], ks[b], vs[b], descale_v=descale_v[b], causal=causal, return_attn_probs=True
        )
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        assert torch.equal(out[rows], o[0])
        assert torch.equal(lse[:, rows], l_b[0])


def test_fp8_qkvpacked_forms_are_the_unpacked_functions():
    qkv = torch.stack([_quantised(2, 11, 2, 32, i).float() for i in range(3)], dim=2).to(E4M3)
    descale = torch.tensor([0.5, 2.0])
    packed = flash_attn_qkvpacked_fp8_func(qkv, descale, None, descale, causal=True)
    q, k, v = qkv.unbind(2)
    assert torch.equal(packed, flash_attn_fp8_func(q, k, v, descale, None, descale, causal=True))
    flat = qkv.reshape(22, 3, 2, 32)
    cu = torch.tensor([0, 11, 22], dtype=torch.int32)
    varlen = flash_attn_varlen_qkvpacked_fp8_func(flat, cu, 11, descale, None, descale, causal=True)
    assert torch.equal(varlen, packed.reshape(22, 2, 32))


def test_fp8_varlen_matches_the_dequantised_reference_like_the_fixed_length_form():
    # The fixed-length form's judge (attnforge_kernels.checks.variants.compare_fp8) on the varlen
    # layout: one sequence, so the varlen call must agree with it bit for bit.
    case = fp8("bf16", 1, 37, 45, 4, 2, 64, "causal", "head")
    res = variants.compare_fp8(case, torch.device("cpu"), seed=5)
    assert res["ok"], res["metrics"]
    q, k, v = (_quantised(1, n, h, 64, i) for i, (n, h) in enumerate(((37, 4), (45, 2), (45, 2))))
    fixed = flash_attn_fp8_func(q, k, v, causal=True)
    cu_q, cu_k = torch.tensor([0, 37], dtype=torch.int32), torch.tensor([0, 45], dtype=torch.int32)
    varlen = flash_attn_varlen_fp8_func(q[0], k[0], v[0], cu_q, cu_k, 37, 45, causal=True)
    assert torch.equal(varlen, fixed[0])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda qkv: flash_attn_qkvpacked_fp8_func(qkv[:, :, :2]), "qkv must be"),
        (lambda qkv: flash_attn_varlen_qkvpacked_fp8_func(qkv, torch.tensor([0, 4]), 4), "qkv"),
        (
            lambda qkv: flash_attn_varlen_fp8_func(
                qkv[0, :, 0],
                qkv[0, :, 1],
                qkv[0, :, 2],
                torch.tensor([0.0, 4.0]),
                torch.tensor([0, 4]),
                4,
                4,
            ),
            "cu_seqlens_q",
        ),  # fmt: skip
        (
            lambda qkv: flash_attn_varlen_fp8_func(
                qkv[0, :, 0],
                qkv[0, :, 1],
                qkv[0, :, 2],
                torch.tensor([0, 4]),
                torch.tensor([0, 2, 4]),
                4,
                4,
            ),
            "same length",
        ),  # fmt: skip
    ],
)
def test_fp8_packed_and_varlen_argument_errors(call, match):
    qkv = _quantised(1, 4, 6, 32, 0).reshape(1, 4, 3, 2, 32)
    with pytest.raises(ValueError, match=match):
        call(qkv)


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (dict(q_dtype=torch.float32), ArgumentTypeError, "q must be float16 or bfloat16"),
        (dict(k_dtype=torch.bfloat16), ArgumentTypeError, "must share a dtype"),
        (
            dict(hk=3),
            ArgumentError,
            r"query heads \(4\) must be a multiple of key/value heads \(3\)",
        ),
        (dict(d_kv=48), ArgumentError, "head dims must match and be <= 256"),
        (
            dict(slopes=(3,)),
            ArgumentError,
            r"alibi_slopes shape \(3,\), expected \(4,\) or \(2, 4\)",
        ),
    ],
)
def test_the_fixed_length_and_kv_cache_calls_refuse_bad_inputs_in_the_same_words(bad, error, match):
    # One check (attnforge_kernels/api/arguments.py) behind both entry points: same type, same
    # sentence.
    q = torch.randn(2, 5, 4, 32).to(bad.get("q_dtype", torch.float16))
    hk, d_kv = bad.get("hk", 2), bad.get("d_kv", 32)
    k = torch.randn(2, 9, hk, d_kv).to(bad.get("k_dtype", torch.float16))
    v = torch.randn(2, 9, hk, d_kv, dtype=torch.float16)
    slopes = torch.rand(*bad["slopes"]) if "slopes" in bad else None
    with pytest.raises(error, match=match):
        flash_attn_func(q, k, v, alibi_slopes=slopes)
    with pytest.raises(error, match=match):
        flash_attn_with_kvcache(q, k, v, alibi_slopes=slopes)


def test_every_public_entry_point_is_typed():
    import inspect
    import typing

    import attnforge_kernels
    from attnforge_kernels import sdpa_shim
    from attnforge_kernels.api import kvcache

    funcs = [
        getattr(attnforge_kernels, n)
        for n in attnforge_kernels.__all__
        if inspect.isfunction(getattr(attnforge_kernels, n))
    ]
    funcs += [kvcache.paged_varlen_forward, sdpa_shim.enable, sdpa_shim.stats]
    assert len(funcs) >= 12
    for f in funcs:
        hints = typing.get_type_hints(f)  # resolvable, not just written
        missing = [p for p in inspect.signature(f).parameters if p not in hints]
        assert "return" in hints and not missing, (f.__name__, missing)
