"""The forward's last-wave split (configs.tail_split, flash.py attn_fwd's SPLIT and
attn_fwd_merge): the rule, and the split launch against the reference and the whole-tile launch
in Triton's interpreter."""

import pytest
import torch

from attnforge_kernels import flash_attn_func, flash_attn_varlen_func
from attnforge_kernels.api import flash_attn as interface
from attnforge_kernels.checks.reference import attention_ref
from attnforge_kernels.device import configs
from attnforge_kernels.device.configs import Tile
from tests.kernels.standins import LaunchSpy, grads_under

# A 16x16 forward tile two of which a compute unit holds, on a device of 8 units: 16 slots.
SPLIT_TILE = '{"fwd": {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1, "per_sm": 2}}'
WHOLE_TILE = '{"fwd": {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1}}'


def test_the_rule_splits_the_heads_of_a_partial_last_wave_only():
    t = Tile(128, 64, 4, 2, per_sm=2)
    # Qwen-Image 1664x928 (24 heads, 6132 tokens: 48 tiles a head) on 132 SMs, two programs an
    # SM: 1152 tiles = 4 waves of 264 and 96 more, the last 2 heads', cut in two along 96 key
    # blocks.
    assert configs.tail_split(t, 48, 24, 96, 132) == (2, 2)
    # Whole waves, less than one wave, a tile without per_sm, an unknown device: no split.
    assert configs.tail_split(t, 48, 22, 96, 132) is None
    assert configs.tail_split(t, 48, 4, 96, 132) is None
    assert configs.tail_split(Tile(128, 64, 4, 2), 48, 24, 96, 132) is None
    assert configs.tail_split(t, 48, 24, 96, 0) is None
    # The last wave's tiles round up to whole heads: 100 tiles over -> 3 heads of 48 -> 144
    # tiles, which fill more than half the slots: halves gain nothing.
    assert configs.tail_split(t, 48, 24 + 3, 96, 132) is None
    # A few tiles over: as many parts as fill the wave, at most TAIL_SPLIT_MAX, each of at least
    # TAIL_SPLIT_MIN_BLOCKS key blocks.
    assert configs.tail_split(t, 8, 34, 96, 132) == (configs.TAIL_SPLIT_MAX, 1)
    assert configs.tail_split(t, 8, 34, 12, 132) == (3, 1)
    assert configs.tail_split(t, 8, 34, 7, 132) is None
    # One head's tiles are more than the last wave's: splitting would cut the whole grid.
    assert configs.tail_split(t, 300, 1, 96, 132) is None


def test_only_hoppers_d128_forward_tile_says_its_programs_per_sm():
    # Its compile figures (255 registers x 128 threads, 96 KiB of shared memory) allow two an
    # SM: test_aot checks the figure against the compile.
    assert configs.config_for("hopper", 128).fwd.per_sm == 2
    assert configs.config_for("hopper", 128).fwd.no_tma.per_sm == 0
    for family in ("hopper", "rdna3.5", "cdna3", "ampere"):
        for d in (64, 256):
            assert configs.config_for(family, d).fwd.per_sm == 0


def _spied(monkeypatch, override=SPLIT_TILE, units=8):
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", override)
    monkeypatch.setattr(configs, "compute_units", lambda device=None: units)
    fwd, merge = LaunchSpy(interface.attn_fwd), LaunchSpy(interface.attn_fwd_merge)
    monkeypatch.setattr(interface, "attn_fwd", fwd)
    monkeypatch.setattr(interface, "attn_fwd_merge", merge)
    return fwd, merge


def _qkv(b, sq, sk, hq, hk, d, g):
    return (torch.randn(b, n, h, d, generator=g).to(torch.bfloat16)
            for n, h in ((sq, hq), (sk, hk), (sk, hk)))  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        # (batch, q rows, keys, q heads, kv heads, head dim), (parts, split heads), on 16
        # slots: 6 heads of 3 tiles, 2 over, the last head in 5 parts of 5 key blocks; GQA at
        # an odd head dim (b2 x 6 heads of 2 tiles, 8 over) with a partial key block; bhsd
        # views (9 heads of 2 tiles); softcap and ALiBi.
        dict(shape=(1, 48, 400, 6, 6, 32), parts=(5, 1)),
        dict(shape=(2, 28, 200, 6, 3, 40), parts=(2, 4)),
        dict(shape=(1, 20, 130, 9, 3, 64), bhsd=True, parts=(2, 1)),
        dict(shape=(1, 48, 160, 6, 6, 32), softcap=5.0, parts=(2, 1)),
        dict(shape=(1, 48, 160, 6, 6, 32), alibi=True, parts=(2, 1)),
    ],
    ids=["one-tile", "gqa-d40", "bhsd", "softcap", "alibi"],
)
def test_the_split_forward_matches_the_reference_and_the_whole_tile(monkeypatch, case):
    b, sq, sk, hq, hk, d = case["shape"]
    g = torch.Generator().manual_seed(1)
    if case.get("bhsd"):
        q, k, v = (
            torch.randn(b, h, n, d, generator=g).to(torch.bfloat16).transpose(1, 2)
            for n, h in ((sq, hq), (sk, hk), (sk, hk))
        )
    else:
        q, k, v = _qkv(b, sq, sk, hq, hk, d, g)
    softcap = case.get("softcap", 0.0)
    slopes = torch.rand(hq, generator=g) if case.get("alibi") else None
    kw = dict(softcap=softcap, alibi_slopes=slopes, return_attn_probs=True)
    fwd, merge = _spied(monkeypatch)
    out, lse, _ = flash_attn_func(q, k, v, **kw)
    blocks, heads = -(-sq // 16), b * hq
    parts, split = configs.tail_split(Tile(16, 16, 4, 1, per_sm=2), blocks, heads, -(-sk // 16), 8)
    assert (parts, split) == case["parts"]
    assert fwd.values("SPLIT") == [parts]
    assert fwd.grids == [(blocks, heads - split + split * parts)]
    assert merge.grids == [(blocks, split)]
    ref, ref_lse = attention_ref(q, k, v, softcap=softcap, alibi_slopes=slopes)
    assert (out.float() - ref.float()).abs().max().item() <= 2e-2
    assert (lse - ref_lse).abs().max().item() <= 1e-3
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", WHOLE_TILE)
    whole, whole_lse, _ = flash_attn_func(q, k, v, **kw)
    assert "SPLIT" not in fwd.calls[1]
    assert len(merge.grids) == 1
    assert (out.float() - whole.float()).abs().max().item() <= 1e-2
    assert (lse - whole_lse).abs().max().item() <= 1e-4


def test_the_backward_of_a_split_forward_matches_the_whole_tiles(monkeypatch):
    fwd, merge = _spied(monkeypatch)
    g = torch.Generator().manual_seed(2)
    q, k, v = _qkv(1, 48, 160, 6, 3, 32, g)
    split = grads_under(monkeypatch, SPLIT_TILE, flash_attn_func, (q, k, v), with_out=True)
    assert fwd.values("SPLIT")[:1] == [2] and len(merge.grids) == 1
    whole = grads_under(monkeypatch, WHOLE_TILE, flash_attn_func, (q, k, v), with_out=True)
    assert len(merge.grids) == 1
    for a, b in zip(split, whole, strict=True):
        assert (a.float() - b.float()).abs().max().item() <= 2e-2


@pytest.mark.parametrize("form", ["causal", "window", "varlen", "dropout"])
def test_calls_of_more_than_one_key_range_a_row_are_not_split(monkeypatch, form):
    fwd, merge = _spied(monkeypatch)
    g = torch.Generator().manual_seed(3)
    q, k, v = _qkv(1, 48, 160, 6, 6, 32, g)
    if form == "varlen":
        cu = torch.tensor([0, 48], dtype=torch.int32)
        cu_k = torch.tensor([0, 160], dtype=torch.int32)
        flash_attn_varlen_func(q[0], k[0], v[0], cu, cu_k, 48, 160)
    else:
        kw = {"causal": dict(causal=True), "window": dict(window_size=(32, 32)),
              "dropout": dict(dropout_p=0.1)}[form]  # fmt: skip
        flash_attn_func(q, k, v, **kw)
    assert "SPLIT" not in fwd.calls[0] and merge.grids == []
