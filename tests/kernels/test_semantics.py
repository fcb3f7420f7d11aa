"""flash_attn API semantics: masks, layouts, varlen, GQA, empty rows, errors."""

import pytest
import torch

from attnforge_kernels import flash_attn_func, flash_attn_varlen_func
from attnforge_kernels.checks.reference import attention_ref


def _qkv(b, sq, sk, hq, hk, d, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, hq, d, generator=g).to(dtype)
    k = torch.randn(b, sk, hk, d, generator=g).to(dtype)
    v = torch.randn(b, sk, hk, d, generator=g).to(dtype)
    return q, k, v


def _close(a, b, tol=2e-3):
    return (a.float() - b.float()).abs().max().item() <= tol


def test_causal_is_bottom_right_aligned_when_sq_differs_from_sk():
    q, k, v = _qkv(1, 20, 45, 2, 2, 32)
    out = flash_attn_func(q, k, v, causal=True)
    bottom_right, _ = attention_ref(q, k, v, right=0)
    top_left, _ = attention_ref(q, k, v, right=20 - 45)
    assert _close(out, bottom_right)
    assert not _close(out, top_left, tol=1e-2)


def test_rows_without_visible_keys_give_zero_output_and_infinite_lse():
    q, k, v = _qkv(1, 40, 10, 2, 2, 32)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    # Bottom-right causal with Sq > Sk: the first Sq - Sk queries see no key.
    assert torch.count_nonzero(out[:, :30]) == 0
    assert torch.isinf(lse[:, :, :30]).all() and torch.isfinite(lse[:, :, 30:]).all()


def test_bhsd_view_gives_the_same_result_as_contiguous_bshd():
    q, k, v = _qkv(2, 33, 33, 2, 2, 32)
    as_bhsd = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    assert as_bhsd[0].stride(1) == 32  # really strided, not a copy
    assert torch.equal(
        flash_attn_func(*as_bhsd, causal=True), flash_attn_func(q, k, v, causal=True)
    )


def test_varlen_equals_running_each_sequence_alone():
    lens_q, lens_k = [5, 33, 17], [40, 9, 17]
    seqs = [
        _qkv(1, a, b, 2, 1, 32, seed=i)
        for i, (a, b) in enumerate(zip(lens_q, lens_k, strict=False))
    ]
    q = torch.cat([s[0][0] for s in seqs])
    k = torch.cat([s[1][0] for s in seqs])
    v = torch.cat([s[2][0] for s in seqs])
    cu_q = torch.tensor([0, 5, 38, 55], dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 49, 66], dtype=torch.int32)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 33, 40, causal=True)
    ref = torch.cat([flash_attn_func(*s, causal=True)[0] for s in seqs])
    assert torch.equal(out, ref)


def test_gqa_equals_repeating_kv_heads():
    q, k, v = _qkv(1, 30, 30, 4, 2, 32)
    rep = [t.repeat_interleave(2, dim=2) for t in (k, v)]
    assert _close(flash_attn_func(q, k, v), flash_attn_func(q, *rep), tol=0)


def test_sliding_window_ignores_keys_outside_the_window():
    q, k, v = _qkv(1, 40, 40, 1, 1, 32)
    out = flash_attn_func(q, k, v, window_size=(3, 0))
    k2, v2 = k.clone(), v.clone()
    k2[:, :30] = 100.0  # keys 0..29 are outside every window of queries 33..39
    v2[:, :30] = 100.0
    out2 = flash_attn_func(q, k2, v2, window_size=(3, 0))
    assert torch.equal(out[:, 33:], out2[:, 33:])


def test_softmax_scale_is_applied():
    q, k, v = _qkv(1, 20, 20, 1, 1, 32)
    ref, _ = attention_ref(q, k, v, scale=0.05)
    assert _close(flash_attn_func(q, k, v, softmax_scale=0.05), ref)


@pytest.mark.parametrize("scale", [-0.2, 0.0])
@pytest.mark.parametrize("mask", ["none", "causal", "window"])
def test_negative_and_zero_softmax_scale_match_the_reference(scale, mask):
    # The forward takes each row's maximum of the raw products and scales it after, which holds
    # only for a positive scale: the kernel moves a negative one's sign onto q and makes a zero
    # one tiny. A zero scale with a mask is where 0 * -inf would give NaN. 40 queries, 45 keys:
    # rows without a visible key (causal), partial key blocks and a window all meet it.
    q, k, v = (t.requires_grad_() for t in _qkv(1, 40, 45, 2, 1, 32))
    window = {"none": (-1, -1), "causal": (-1, 0), "window": (5, 3)}[mask]
    left, right = (None if w < 0 else w for w in window)
    out = flash_attn_func(q, k, v, softmax_scale=scale, window_size=window)
    ref, _ = attention_ref(q, k, v, scale=scale, left=left, right=right)
    assert torch.isfinite(out).all()
    assert _close(out, ref)
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.float().square().sum(), (q, k, v))
    assert all(_close(g, r, tol=1e-2) for g, r in zip(grads, ref_grads, strict=True))


def test_dropout_probability_outside_0_1_is_refused():
    q, k, v = _qkv(1, 8, 8, 1, 1, 16)
    with pytest.raises(ValueError, match="dropout_p"):
        flash_attn_func(q, k, v, dropout_p=1.0)


def test_head_dim_over_256_is_refused():
    q, k, v = _qkv(1, 8, 8, 1, 1, 272)
    with pytest.raises(ValueError, match="256"):
        flash_attn_func(q, k, v)


def test_gradients_flow_to_all_inputs():
    q, k, v = (t.requires_grad_() for t in _qkv(1, 17, 19, 2, 1, 32))
    flash_attn_func(q, k, v, causal=True).sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
