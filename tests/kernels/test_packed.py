"""flash_attn's packed entry points (CPU interpreter): results, packed gradients, errors."""

import pytest
import torch

from contract import tolerance
from kernels import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from kernels import packed as packed_mod


def _rand(*shape, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _reference(q, k, v, causal=False, window=(-1, -1)):
    """fp32 attention of one sequence, q (sq, hq, d), k/v (sk, hk, d), bottom-right masks."""
    sq, hq, d = q.shape
    sk, hk = k.shape[0], k.shape[1]
    k = k.float().repeat_interleave(hq // hk, 1)
    v = v.float().repeat_interleave(hq // hk, 1)
    s = torch.einsum("qhd,khd->hqk", q.float() * d**-0.5, k)
    rel = torch.arange(sk)[None, :] - torch.arange(sq)[:, None] - (sk - sq)
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        ok &= rel <= 0
    if window[0] >= 0:
        ok &= rel >= -window[0]
    if window[1] >= 0:
        ok &= rel <= window[1]
    p = torch.softmax(s.masked_fill(~ok, float("-inf")), -1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v)


def _fwd_bwd_reference(q, k, v, do, **mask):
    """(out, dq, dk, dv) of the fp32 reference for one sequence."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = _reference(q, k, v, **mask)
    out.backward(do.float())
    return out.detach(), q.grad, k.grad, v.grad


def _assert_close(mine, ref, pt_err=0.0, factor=tolerance.GRAD_FACTOR):
    err = (mine.float() - ref).abs().max().item()
    ok, bound = tolerance.within(err, pt_err, ref.abs().max().item(), 2**-10, factor)
    assert ok, (err, bound)


def test_qkvpacked_matches_the_reference_forward_and_backward():
    b, s, h, d = 2, 21, 2, 32
    qkv = _rand(b, s, 3, h, d).requires_grad_()
    do = _rand(b, s, h, d, seed=1)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    out.backward(do)
    assert qkv.grad.shape == qkv.shape
    for i in range(b):
        q, k, v = qkv[i].detach().unbind(1)
        ref = _fwd_bwd_reference(q, k, v, do[i], causal=True)
        _assert_close(out[i], ref[0], factor=tolerance.FACTOR)
        for j in range(3):
            _assert_close(qkv.grad[i, :, j], ref[j + 1])


def test_qkvpacked_equals_the_unpacked_call_exactly():
    qkv = _rand(1, 19, 3, 2, 16, dtype=torch.bfloat16).requires_grad_()
    do = _rand(1, 19, 2, 16, dtype=torch.bfloat16, seed=2)
    out, lse, none = flash_attn_qkvpacked_func(
        qkv, window_size=(4, 1), softcap=20.0, return_attn_probs=True
    )
    out.backward(do)
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv.detach().unbind(2))
    out2, lse2, _ = flash_attn_func(
        q, k, v, window_size=(4, 1), softcap=20.0, return_attn_probs=True
    )
    out2.backward(do)
    assert none is None and lse.shape == (1, 2, 19)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    assert torch.equal(qkv.grad, torch.stack((q.grad, k.grad, v.grad), dim=2))


def test_packed_gradient_is_the_buffer_the_kernels_wrote(monkeypatch):
    # The backward hands the kernels views of one allocation and returns that allocation: no
    # stack/cat copy of dQ, dK, dV. (The spy keeps addresses only: holding the views would make
    # autograd copy the gradient into .grad.)
    seen = []
    real = packed_mod._backward

    def spy(*args, grads, **kw):
        seen.append([(g.untyped_storage().data_ptr(), g.data_ptr()) for g in grads])
        return real(*args, grads=grads, **kw)

    monkeypatch.setattr(packed_mod, "_backward", spy)
    qkv = _rand(1, 17, 3, 2, 16).requires_grad_()
    flash_attn_qkvpacked_func(qkv).sum().backward()
    storages, views = zip(*seen[0], strict=True)
    assert len(set(storages)) == 1
    assert qkv.grad.untyped_storage().data_ptr() == storages[0]
    assert list(views) == [qkv.grad[:, :, j].data_ptr() for j in range(3)]

    q = _rand(1, 9, 4, 16).requires_grad_()
    kv = _rand(1, 17, 2, 2, 16, seed=3).requires_grad_()
    flash_attn_kvpacked_func(q, kv).sum().backward()
    (dq_st, dq_ptr), (dk_st, dk_ptr), (dv_st, dv_ptr) = seen[1]
    assert dk_st == dv_st == kv.grad.untyped_storage().data_ptr()
    assert (dk_ptr, dv_ptr) == (kv.grad[:, :, 0].data_ptr(), kv.grad[:, :, 1].data_ptr())
    assert q.grad.data_ptr() == dq_ptr


def test_kvpacked_gqa_matches_the_reference():
    q = _rand(1, 13, 4, 32).requires_grad_()
    kv = _rand(1, 30, 2, 2, 32, seed=4).requires_grad_()
    do = _rand(1, 13, 4, 32, seed=5)
    out = flash_attn_kvpacked_func(q, kv, causal=True)
    out.backward(do)
    k, v = kv[0].detach().unbind(1)
    ref = _fwd_bwd_reference(q[0].detach(), k, v, do[0], causal=True)
    _assert_close(out[0], ref[0], factor=tolerance.FACTOR)
    _assert_close(q.grad[0], ref[1])
    _assert_close(kv.grad[0, :, 0], ref[2])
    _assert_close(kv.grad[0, :, 1], ref[3])


def test_varlen_qkvpacked_equals_each_sequence_alone():
    lens = [7, 20, 1]
    cu = torch.tensor([0, 7, 27, 28], dtype=torch.int32)
    qkv = _rand(28, 3, 2, 16).requires_grad_()
    do = _rand(28, 2, 16, seed=6)
    out, lse, _ = flash_attn_varlen_qkvpacked_func(
        qkv, cu, max(lens), causal=True, return_attn_probs=True
    )
    out.backward(do)
    assert lse.shape == (2, 28) and qkv.grad.shape == qkv.shape
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        q, k, v = qkv[a:b].detach().unbind(1)
        ref = _fwd_bwd_reference(q, k, v, do[a:b], causal=True)
        _assert_close(out[a:b], ref[0], factor=tolerance.FACTOR)
        for j in range(3):
            _assert_close(qkv.grad[a:b, j], ref[j + 1])


def test_varlen_kvpacked_equals_the_unpacked_varlen_call():
    cu_q = torch.tensor([0, 5, 17], dtype=torch.int32)
    cu_k = torch.tensor([0, 22, 31], dtype=torch.int32)
    q = _rand(17, 4, 16, dtype=torch.bfloat16).requires_grad_()
    kv = _rand(31, 2, 1, 16, dtype=torch.bfloat16, seed=7).requires_grad_()
    do = _rand(17, 4, 16, dtype=torch.bfloat16, seed=8)
    args = (cu_q, cu_k, 12, 22)
    out = flash_attn_varlen_kvpacked_func(q, kv, *args, window_size=(6, 0))
    out.backward(do)
    q2 = q.detach().clone().requires_grad_()
    k2, v2 = (t.detach().clone().requires_grad_() for t in kv.detach().unbind(1))
    out2 = flash_attn_varlen_func(q2, k2, v2, *args, window_size=(6, 0))
    out2.backward(do)
    assert torch.equal(out, out2) and torch.equal(q.grad, q2.grad)
    assert torch.equal(kv.grad, torch.stack((k2.grad, v2.grad), dim=1))


@pytest.mark.parametrize(
    "call",
    [
        lambda: flash_attn_qkvpacked_func(_rand(1, 8, 2, 2, 16)),  # two, not three
        lambda: flash_attn_kvpacked_func(_rand(1, 8, 2, 16), _rand(1, 8, 3, 2, 16)),
        lambda: flash_attn_varlen_qkvpacked_func(
            _rand(8, 2, 16), torch.tensor([0, 8], dtype=torch.int32), 8
        ),
    ],
)
def test_a_pack_of_the_wrong_shape_is_refused(call):
    with pytest.raises(ValueError, match="must be"):
        call()


def test_packed_dropout_is_the_unpacked_dropout_for_the_same_seed():
    qkv = _rand(1, 17, 3, 2, 16).requires_grad_()
    do = _rand(1, 17, 2, 16, seed=9)
    torch.manual_seed(5)
    out, _, sdmask = flash_attn_qkvpacked_func(
        qkv, dropout_p=0.3, causal=True, return_attn_probs=True
    )
    out.backward(do)
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv.detach().unbind(2))
    torch.manual_seed(5)
    out2, _, sdmask2 = flash_attn_func(q, k, v, dropout_p=0.3, causal=True, return_attn_probs=True)
    out2.backward(do)
    assert (sdmask < 0).any() and torch.equal(sdmask, sdmask2)  # something was dropped
    assert torch.equal(out, out2)
    assert torch.equal(qkv.grad, torch.stack((q.grad, k.grad, v.grad), dim=2))
