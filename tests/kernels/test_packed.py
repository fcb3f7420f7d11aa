"""flash_attn's packed entry points (CPU interpreter): results, packed gradients, errors."""

import pytest
import torch

from attnforge_kernels import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from attnforge_kernels.api import packed as packed_mod
from attnforge_kernels.checks.case import packed
from attnforge_kernels.checks.layouts import compare_packed


def _rand(*shape, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


@pytest.mark.parametrize(
    "case",
    [
        packed("fp16", "qkv", 2, 21, 21, 2, 2, 32, "causal"),
        packed("fp16", "kv", 1, 13, 30, 4, 2, 32, "causal"),  # GQA
        packed("fp16", "varqkv", 3, 20, 20, 2, 2, 16, "causal"),  # lengths 20, 1, 13
    ],
    ids=lambda c: c.name,
)
def test_packed_forms_match_the_reference_forward_and_backward(case):
    # The packed gradient is one tensor of the pack's shape; out and each part of it are judged
    # against the checks' fp32 reference of every sequence.
    res = compare_packed(case, torch.device("cpu"), seed=1)
    assert res["ok"], res["metrics"]


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
    real = packed_mod.run_backward

    def spy(*args, grads, **kw):
        seen.append([(g.untyped_storage().data_ptr(), g.data_ptr()) for g in grads])
        return real(*args, grads=grads, **kw)

    monkeypatch.setattr(packed_mod, "run_backward", spy)
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
