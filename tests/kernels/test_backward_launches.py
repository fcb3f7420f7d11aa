"""The backward's launches (issue 30: small shapes are bound by host time per launch), in Triton's
interpreter: the dQ kernel computes delta itself, so the default path launches two kernels; the
delta kernel runs only before the atomic-dQ dK/dV kernel; the gradients come back in their
inputs' layouts."""

import pytest
import torch

from attnforge_kernels.api import flash_attn as interface
from attnforge_kernels.checks.reference import attention_ref


class _Count:
    """Counts the launches of one kernel, in order, and runs it."""

    def __init__(self, fn, name: str, log: list):
        self.fn, self.name, self.log = fn, name, log

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(self.name)
            return self.fn[grid](*args, **kwargs)

        return launch


@pytest.fixture
def launches(monkeypatch) -> list:
    log: list = []
    for name in ("attn_bwd_delta", "attn_bwd_dkdv", "attn_bwd_dq"):
        monkeypatch.setattr(interface, name, _Count(getattr(interface, name), name, log))
    return log


def _grads(q, k, v, do, **kw):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = interface.flash_attn_func(q, k, v, **kw)
    out.backward(do)
    return out, q.grad, k.grad, v.grad


def _reference(q, k, v, do, causal):
    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    out, _ = attention_ref(qr, kr, vr, right=0 if causal else None)
    out.backward(do.float())
    return qr.grad, kr.grad, vr.grad


def _assert_close(grads, refs):
    for name, got, ref in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        torch.testing.assert_close(got.float(), ref, atol=2e-2, rtol=2e-2, msg=name)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (None, ["attn_bwd_dq", "attn_bwd_dkdv"]),
        ('{"atomic_dq": true}', ["attn_bwd_delta", "attn_bwd_dkdv"]),
    ],
    ids=["default", "atomic_dq"],
)
def test_the_backward_launches_and_gradients(monkeypatch, launches, override, expected):
    if override:
        monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", override)
    torch.manual_seed(0)
    # 40 queries on 24 keys, causal: the last query block is partial and the first queries see
    # no key at all (their delta must still be written before the dK/dV kernel reads it).
    q = torch.randn(2, 40, 4, 32, dtype=torch.float16)
    k, v = (torch.randn(2, 24, 2, 32, dtype=torch.float16) for _ in range(2))
    do = torch.randn_like(q)
    _, dq, dk, dv = _grads(q, k, v, do, causal=True)
    assert launches == expected
    _assert_close((dq, dk, dv), _reference(q, k, v, do, True))


def test_gradients_come_back_in_the_inputs_layout():
    # (b, h, s, d) storage handed over as (b, s, h, d) views: the gradients have the views'
    # strides, which autograd's accumulation into the leaves keeps without a copy.
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 33, 16, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    do = torch.randn(1, 33, 2, 16, dtype=torch.bfloat16)
    scale = 16**-0.5
    mask = interface.Mask()
    out, lse = interface.run_forward(q, k, v, None, None, 33, 33, 1, scale, mask, None, False)
    dq, dk, dv = interface.run_backward(
        do, q, k, v, out, lse, None, None, 33, 33, 1, scale, mask, None, False
    )
    assert (dq.stride(), dk.stride(), dv.stride()) == (q.stride(), k.stride(), v.stride())
    _assert_close((dq, dk, dv), _reference(q, k, v, do, False))


class _Record(_Count):
    """Also keeps each launch's STRIDE_ALIGN."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append((self.name, kwargs.get("STRIDE_ALIGN")))
            return self.fn[grid](*args, **kwargs)

        return launch


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize(
    ("override", "first"), [(None, "attn_bwd_dq"), ('{"atomic_dq": true}', "attn_bwd_delta")]
)
@pytest.mark.parametrize(("d", "align"), [(40, 8), (24, 8), (32, 1)])
def test_head_dims_off_the_16_grid_take_the_backward_with_their_stride_alignment(
    monkeypatch, layout, override, first, d, align
):
    # d=40 (SD 1.5): every q/k/v/dO/dQ/dK/dV stride is a multiple of 8 elements, not 16; each
    # backward kernel gets them divided by 8 and multiplies them back by its constexpr.
    log: list = []
    for name in ("attn_bwd_delta", "attn_bwd_dkdv", "attn_bwd_dq"):
        monkeypatch.setattr(interface, name, _Record(getattr(interface, name), name, log))
    if override:
        monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", override)
    torch.manual_seed(2)

    def make(s, h):
        if layout == "bshd":
            return torch.randn(2, s, h, d, dtype=torch.float16)
        return torch.randn(2, h, s, d, dtype=torch.float16).transpose(1, 2)

    q, k, v, do = make(37, 4), make(29, 2), make(29, 2), make(37, 4)
    _, dq, dk, dv = _grads(q, k, v, do, causal=True)
    assert log == [(first, align), ("attn_bwd_dkdv", align)]
    _assert_close((dq, dk, dv), _reference(q, k, v, do, True))
