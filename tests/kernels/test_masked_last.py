"""The dK/dV kernel's loop order (``AttnConfig.masked_last``, flash.py ``MASKED_LAST``): the full
query blocks first, then the masked blocks of both sides in one loop that skips the full ones.
In Triton's interpreter the gradients must be the three-loop order's up to summation order, with
shapes whose masked blocks lie on both sides of the full ones (a causal diagonal and a partial
last block, a wide window) and on one side only."""

import pytest
import torch

from attnforge_kernels import flash_attn_func, flash_attn_varlen_func
from attnforge_kernels.api import flash_attn as interface
from tests.kernels.standins import LaunchSpy, assert_only_hopper_sets, grads_under

LAST = '{"masked_last": true}'
FIRST = '{"masked_last": false}'


# The interpreter's tiles are 16 x 16. 70 queries on 70 keys, causal: key block 0 has masked
# query blocks [0, 16) and [64, 70) around the full [16, 64). 70 on 61: the diagonal shifts by 9.
# Window (40, 3): key block 0 sees masked [0, 16) and [32, 56) around the full [16, 32).
CASES = {
    "causal-gqa": (70, 70, dict(causal=True)),
    "causal-fewer-keys": (70, 61, dict(causal=True)),
    "causal-more-keys": (45, 83, dict(causal=True)),
    "wide-window": (70, 70, dict(window_size=(40, 3))),
    "narrow-window": (70, 70, dict(window_size=(5, 3))),
    "no-mask": (70, 70, {}),
    "dropout": (70, 70, dict(dropout_p=0.3, causal=True)),
    "softcap": (70, 70, dict(softcap=3.0, causal=True)),
    "alibi": (70, 70, dict(alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625]), causal=True)),
}


@pytest.mark.parametrize("case", CASES)
def test_masked_last_gives_the_three_loop_orders_gradients(monkeypatch, case):
    spy = LaunchSpy(interface.attn_bwd_dkdv)
    monkeypatch.setattr(interface, "attn_bwd_dkdv", spy)
    sq, sk, kw = CASES[case]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, sq, 4, 32, generator=g).to(torch.float16)  # 4 query heads on 2 KV heads
    k, v = (torch.randn(2, sk, 2, 32, generator=g).to(torch.float16) for _ in range(2))
    before = grads_under(monkeypatch, FIRST, lambda *t: flash_attn_func(*t, **kw), (q, k, v))
    after = grads_under(monkeypatch, LAST, lambda *t: flash_attn_func(*t, **kw), (q, k, v))
    assert spy.values("MASKED_LAST") == [False, True]
    for name, a, b in zip(("dq", "dk", "dv"), before, after, strict=True):
        torch.testing.assert_close(b, a, rtol=2e-3, atol=2e-3, msg=name)
    assert all(bool(t.abs().sum() > 0) for t in after)


def test_masked_last_varlen_gradients(monkeypatch):
    g = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 17, 87], dtype=torch.int32)  # 17 and 70 tokens
    q, k, v = (torch.randn(87, 2, 64, generator=g).to(torch.float16) for _ in range(3))

    def call(q, k, v):
        return flash_attn_varlen_func(q, k, v, cu, cu, 70, 70, causal=True)

    before = grads_under(monkeypatch, FIRST, call, (q, k, v))
    after = grads_under(monkeypatch, LAST, call, (q, k, v))
    for name, a, b in zip(("dq", "dk", "dv"), before, after, strict=True):
        torch.testing.assert_close(b, a, rtol=2e-3, atol=2e-3, msg=name)


def test_only_hopper_puts_the_masked_blocks_last():
    # Measured on an H100 (docs/benchmarks.md, "The causal dK/dV loop order"); on AMD the order
    # raised register use and lowered occupancy (configs.AttnConfig.masked_last), so AMD keeps
    # the order its compile figures were taken with.
    assert_only_hopper_sets("masked_last")
