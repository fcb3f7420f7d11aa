"""Paired key blocks in the causal dK/dV kernel (``AttnConfig.paired_kv``, flash.py ``PAIRED``):
each program takes a key block and its mirror from the sequence's end, on a grid of half the key
blocks. Every key block is still computed by the same code in the same order, so in Triton's
interpreter the gradients must equal the unpaired launch's bit for bit: an even and an odd number
of key blocks (a middle block runs once), one block, diagonals shifted both ways, each loop
order, the split launches, dropout, softcap, ALiBi, and varlen sequences of different block
counts. Only causal launches (a right window without a left one) pair."""

import pytest
import torch

from attnforge_kernels import flash_attn_func, flash_attn_varlen_func
from attnforge_kernels.api import flash_attn as interface
from attnforge_kernels.device import configs
from tests.kernels.standins import LaunchSpy, grads_under

# The head order, so that the unpaired grid is (key blocks, batch x kv heads) as the paired one
# (``across_heads`` swaps an unpaired grid's dimensions: tests/kernels/test_across_heads.py).
PAIRED = '{"paired_kv": true, "across_heads": false}'
UNPAIRED = '{"paired_kv": false, "across_heads": false}'

# The interpreter's tiles are 16 x 16: 70 keys are 5 key blocks (the middle one unpaired), 64
# are 4, 16 one.
CASES = {
    "causal-gqa-odd": (70, 70, dict(causal=True), {}),
    "causal-gqa-even": (64, 64, dict(causal=True), {}),
    "one-block": (16, 16, dict(causal=True), {}),
    "fewer-keys": (70, 45, dict(causal=True), {}),
    "more-keys": (45, 83, dict(causal=True), {}),
    "right-window": (70, 70, dict(window_size=(-1, 3)), {}),
    "masked-first": (70, 70, dict(causal=True), {"masked_last": False}),
    "masked-last": (70, 70, dict(causal=True), {"masked_last": True}),
    "split": (70, 70, dict(causal=True), {"split_kv": True}),
    "dropout": (70, 70, dict(dropout_p=0.3, causal=True), {}),
    "softcap-alibi": (
        70, 70, dict(softcap=3.0, causal=True,
                     alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625])), {},
    ),
}  # fmt: skip


def _spec(paired: bool, extra: dict) -> str:
    import json

    return json.dumps({"paired_kv": paired, "across_heads": False, **extra})


@pytest.mark.parametrize("case", CASES)
def test_paired_gradients_equal_the_unpaired_launchs(monkeypatch, case):
    spy = LaunchSpy(interface.attn_bwd_dkdv)
    monkeypatch.setattr(interface, "attn_bwd_dkdv", spy)
    sq, sk, kw, extra = CASES[case]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, sq, 4, 32, generator=g).to(torch.float16)  # 4 query heads on 2 KV heads
    k, v = (torch.randn(2, sk, 2, 32, generator=g).to(torch.float16) for _ in range(2))
    call = lambda *t: flash_attn_func(*t, **kw)  # noqa: E731
    single = grads_under(monkeypatch, _spec(False, extra), call, (q, k, v))
    paired = grads_under(monkeypatch, _spec(True, extra), call, (q, k, v))
    launches = 2 if extra.get("split_kv") else 1
    assert spy.values("PAIRED") == [False] * launches + [True] * launches
    blocks = -(-sk // 16)
    assert [grid[0] for grid in spy.grids] == [blocks] * launches + [-(-blocks // 2)] * launches
    for name, a, b in zip(("dq", "dk", "dv"), single, paired, strict=True):
        assert torch.equal(a, b), name
    assert all(bool(t.abs().sum() > 0) for t in paired)


def test_paired_varlen_gradients_equal_the_unpaired_launchs(monkeypatch):
    # 17 and 70 tokens: 2 and 5 key blocks on a grid of 3; the short sequence's third program
    # has no block.
    g = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 17, 87], dtype=torch.int32)
    q, k, v = (torch.randn(87, 2, 64, generator=g).to(torch.float16) for _ in range(3))

    def call(q, k, v):
        return flash_attn_varlen_func(q, k, v, cu, cu, 70, 70, causal=True)

    single = grads_under(monkeypatch, UNPAIRED, call, (q, k, v))
    paired = grads_under(monkeypatch, PAIRED, call, (q, k, v))
    for name, a, b in zip(("dq", "dk", "dv"), single, paired, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("kw", [{}, dict(window_size=(5, 3))], ids=["no-mask", "two-sided"])
def test_only_causal_launches_pair(monkeypatch, kw):
    spy = LaunchSpy(interface.attn_bwd_dkdv)
    monkeypatch.setattr(interface, "attn_bwd_dkdv", spy)
    q, k, v = (torch.randn(1, 40, 2, 32).to(torch.float16) for _ in range(3))
    grads_under(monkeypatch, PAIRED, lambda *t: flash_attn_func(*t, **kw), (q, k, v))
    assert spy.values("PAIRED") == [False]
    assert spy.grids[0][0] == 3


def test_pairing_needs_a_grid_in_the_paired_window():
    cfg = configs.override(configs.config_for("hopper", 128), PAIRED)
    low, high = cfg.paired_waves
    assert (low, high) == configs.PAIRED_WAVES
    units = 132
    assert cfg.paired_kv_at(True, int(low * units), units)
    assert not cfg.paired_kv_at(True, int(low * units) - 1, units)  # too few to halve
    assert cfg.paired_kv_at(True, int(high * units) - 1, units)
    assert not cfg.paired_kv_at(True, int(high * units), units)  # the unpaired tail is short
    assert not cfg.paired_kv_at(False, int(low * units), units)  # not causal
    assert cfg.paired_kv_at(True, 1, 0)  # the interpreter: units unknown
    assert not configs.override(cfg, UNPAIRED).paired_kv_at(True, int(low * units), units)


def test_paired_waves_override_sets_the_window():
    cfg = configs.override(configs.config_for("hopper", 128), PAIRED)
    every = configs.override(cfg, '{"paired_waves": [0, 1e9]}')  # how the device check forced it
    assert every.paired_waves == (0.0, 1e9)
    assert every.paired_kv_at(True, 1, 132) and not cfg.paired_kv_at(True, 1, 132)
    for bad in ("[2, 1]", "[-1, 4]", "[1]", '"wide"', "[1, null]"):
        with pytest.raises(ValueError, match="paired_waves"):
            configs.override(cfg, f'{{"paired_waves": {bad}}}')


def test_no_config_pairs_by_default():
    # On an H100 the unpaired kernel ordered across heads ran as fast or faster (docs/benchmarks.md,
    # "Causal grids ordered across heads"); on AMD the paired kernel compiled worse
    # (docs/kernels.md, "Paired causal key blocks").
    for family in configs.FAMILIES:
        for d in (64, 128, 256):
            assert not configs.config_for(family, d).paired_kv, (family, d)
            assert not configs.config_for(family, d, dropout=True).paired_kv, (family, d)
