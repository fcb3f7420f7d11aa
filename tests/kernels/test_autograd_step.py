"""The training step's autograd Function (issue 30 §2): flash_attn_func and flash_attn_varlen_func
without ``return_attn_probs`` go through ``FlashAttnOutFunction`` (4 inputs, one output, only existing
tensors saved); everything autograd lets a user see must match ``FlashAttnFunction``, the Function the
``return_attn_probs`` calls, ``attention`` and attnforge_kernels.check keep using."""

import pytest
import torch

from attnforge_kernels import flash_attn_func, flash_attn_varlen_func
from attnforge_kernels.api import flash_attn as interface


def _qkv(b=1, sq=17, sk=19, hq=2, hk=1, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(b, s, h, d, generator=g).half() for s, h in ((sq, hq), (sk, hk), (sk, hk))
    )


def _grads(fn, leaves, seed=1):
    """fn() -> out; (out, [grad of each leaf]) after out.backward(dout)."""
    for t in leaves:
        t.grad = None
    out = fn()
    g = torch.Generator().manual_seed(seed)
    out.backward(torch.randn(out.shape, generator=g).to(out.dtype))
    return out.detach(), [None if t.grad is None else t.grad.clone() for t in leaves]


def _equal(a, b):
    return all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
        for x, y in zip(a, b, strict=True)
    )


def _old(q, k, v, causal=False):
    """The same call through FlashAttnFunction (13 inputs, out and LSE)."""
    b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    mask = interface.mask_from_flash_args(causal, (-1, -1), 0.0)
    scale = q.shape[-1] ** -0.5
    return interface.FlashAttnFunction.apply(
        q, k, v, None, None, sq, sk, b, scale, mask, None, False
    )[0]


def test_the_step_uses_the_one_output_function_and_return_attn_probs_the_other():
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = flash_attn_func(q, k, v)
    assert type(out.grad_fn).__name__ == "FlashAttnOutFunctionBackward"
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert type(out.grad_fn).__name__ == "FlashAttnFunctionBackward"
    assert not lse.requires_grad and lse.grad_fn is None


@pytest.mark.parametrize("needs", [(1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1)])
def test_gradients_equal_the_two_output_function_for_each_requires_grad_combination(needs):
    base = _qkv()
    new = [t.clone().requires_grad_(bool(n)) for t, n in zip(base, needs, strict=True)]
    old = [t.clone().requires_grad_(bool(n)) for t, n in zip(base, needs, strict=True)]
    got = _grads(lambda: flash_attn_func(*new, causal=True), new)
    want = _grads(lambda: _old(*old, causal=True), old)
    assert torch.equal(got[0], want[0]) and _equal(got[1], want[1])
    assert all((t.grad is None) == (not n) for t, n in zip(new, needs, strict=True))


def test_inputs_that_do_not_require_grad_give_an_output_without_grad_fn():
    q, k, v = _qkv()
    out = flash_attn_func(q, k, v)
    assert not out.requires_grad and out.grad_fn is None


def test_views_of_one_packed_leaf_accumulate_into_it_as_before():
    g = torch.Generator().manual_seed(3)
    packed = torch.randn(1, 17, 3, 2, 32, generator=g).half()
    new, old = packed.clone().requires_grad_(), packed.clone().requires_grad_()
    got = _grads(lambda: flash_attn_func(*new.unbind(2)), [new])
    want = _grads(lambda: _old(*old.unbind(2)), [old])
    assert torch.equal(got[0], want[0]) and _equal(got[1], want[1])


def test_transposed_views_of_bhsd_leaves():
    base = [t.transpose(1, 2).contiguous() for t in _qkv(hk=2)]
    new = [t.clone().requires_grad_() for t in base]
    old = [t.clone().requires_grad_() for t in base]
    got = _grads(lambda: flash_attn_func(*(t.transpose(1, 2) for t in new)), new)
    want = _grads(lambda: _old(*(t.transpose(1, 2) for t in old)), old)
    assert torch.equal(got[0], want[0]) and _equal(got[1], want[1])


def test_q_is_k_is_v():
    (x,) = [_qkv(hk=2, sk=17)[0].requires_grad_()]
    y = x.detach().clone().requires_grad_()
    got = _grads(lambda: flash_attn_func(x, x, x), [x])
    want = _grads(lambda: _old(y, y, y), [y])
    assert torch.equal(got[0], want[0]) and _equal(got[1], want[1])


def test_a_second_backward_needs_retain_graph_and_then_accumulates():
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = flash_attn_func(q, k, v)
    dout = torch.ones_like(out)
    out.backward(dout, retain_graph=True)
    first = q.grad.clone()
    out.backward(dout)
    assert torch.equal(q.grad, 2 * first)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward(dout)


def test_modifying_an_input_in_place_after_the_forward_is_refused_at_backward():
    q, k, v = (t.requires_grad_() for t in _qkv())
    q2 = q * 1  # a non-leaf that can be modified in place
    out = flash_attn_func(q2, k, v)
    q2.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_modifying_the_output_in_place_is_refused_at_backward():
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = flash_attn_func(q, k, v)
    out.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_double_backward_is_refused_as_before():
    for fn in (flash_attn_func, _old):
        q, k, v = (t.requires_grad_() for t in _qkv())
        out = fn(q, k, v)
        (dq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
        assert not dq.requires_grad
        with pytest.raises(RuntimeError, match="does not require grad"):
            torch.autograd.grad(dq.sum(), q)


def test_varlen_saves_cu_seqlens_and_matches_the_two_output_function():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(30, 2, 32, generator=g).half() for _ in range(3))
    cu = torch.tensor([0, 11, 30], dtype=torch.int32)
    new = [t.clone().requires_grad_() for t in (q, k, v)]
    old = [t.clone().requires_grad_() for t in (q, k, v)]
    got = _grads(lambda: flash_attn_varlen_func(*new, cu, cu, 19, 19, causal=True), new)
    want = _grads(
        lambda: flash_attn_varlen_func(*old, cu, cu, 19, 19, causal=True, return_attn_probs=True)[
            0
        ],
        old,
    )
    assert torch.equal(got[0], want[0]) and _equal(got[1], want[1])
    out = flash_attn_varlen_func(*new, cu, cu, 19, 19)
    cu.add_(0)  # an in-place op on a saved cu_seqlens bumps its version, as with FlashAttnFunction
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_alibi_slopes_and_dropout_pass_through():
    q, k, v = _qkv(hk=2)
    slopes = torch.tensor([0.5, 0.25])
    new = [t.clone().requires_grad_() for t in (q, k, v)]
    old = [t.clone().requires_grad_() for t in (q, k, v)]
    got = _grads(lambda: flash_attn_func(*new, alibi_slopes=slopes), new)
    want = _grads(
        lambda: flash_attn_func(*old, alibi_slopes=slopes, return_attn_probs=True)[0], old
    )
    assert torch.equal(got[0], want[0]) and _equal(got[1], want[1])
    torch.manual_seed(7)
    got = _grads(lambda: flash_attn_func(*new, dropout_p=0.3), new)
    torch.manual_seed(7)
    want = _grads(lambda: flash_attn_func(*old, dropout_p=0.3, return_attn_probs=True)[0], old)
    assert torch.equal(got[0], want[0]) and _equal(got[1], want[1])
