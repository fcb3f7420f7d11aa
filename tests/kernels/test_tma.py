"""The Hopper TMA path (tensor descriptors instead of pointer loads): config, alignment rule, and
the same results as the reference under the CPU interpreter, boundaries included."""

import json
from dataclasses import asdict, replace

import pytest
import torch

from attnforge_kernels.api import flash_attn as interface
from attnforge_kernels.checks.attention import compare
from attnforge_kernels.checks.case import attn
from attnforge_kernels.device import configs
from attnforge_kernels.device.configs import Tile, config_for, override


def test_hopper_streams_the_backward_by_tma_and_the_d128_forward_with_a_pointer_stand_in():
    for d in (64, 128):
        cfg = config_for("hopper", d)
        assert cfg.bwd_kv.tma and cfg.bwd_q.tma
    assert not config_for("hopper", 64).fwd.tma
    # d=128: the 4-warp forward streams K/V by TMA; where TMA cannot serve a call (FP8, a
    # misaligned view) the 8-warp pointer tile does, not the 4-warp tile's spilling pointer form.
    cfg = config_for("hopper", 128)
    assert cfg.fwd.tma and cfg.fwd.num_warps == 4 and cfg.fwd.no_tma == configs.HOPPER_FWD_8_WARPS
    off = cfg.without_tma()
    assert off.fwd == configs.HOPPER_FWD_8_WARPS and not off.fwd.tma
    assert off.bwd_kv == replace(cfg.bwd_kv, tma=False)
    assert off.without_tma() == off
    # The dropout tiles stay spill-free without TMA (the forward's 4-warp tile spills with the
    # mask live); other families never use it.
    drop = config_for("hopper", 128, dropout=True)
    assert not drop.bwd_kv.tma and drop.fwd == configs.HOPPER_FWD_8_WARPS
    for family in ("rdna3.5", "cdna3", "ampere", "interpreter"):
        cfg = config_for(family, 128)
        assert not (cfg.fwd.tma or cfg.bwd_kv.tma or cfg.bwd_q.tma), family


def test_override_sets_tma_for_all_tiles_or_the_listed_ones():
    base = config_for("interpreter", 32)
    on = override(base, '{"tma": true}')
    assert on.fwd.tma and on.bwd_kv.tma and on.bwd_q.tma
    some = override(base, '{"tma": ["bwd_q"], "bwd_kv": [32, 16, 1, 1]}')
    assert (some.fwd.tma, some.bwd_kv.tma, some.bwd_q.tma) == (False, False, True)
    assert some.bwd_kv.block_m == 32
    obj = override(base, json.dumps({"fwd": {"block_m": 64, "block_n": 32, "num_warps": 4,
                                             "num_stages": 2, "tma": True, "maxnreg": 128}}))  # fmt: skip
    assert obj.fwd == Tile(64, 32, 4, 2, tma=True, maxnreg=128)
    assert obj.fwd.launch_options(hip=False) == {
        "num_warps": 4, "num_stages": 2, "enable_fp_fusion": True, "maxnreg": 128
    }  # fmt: skip
    assert "maxnreg" not in obj.fwd.launch_options(hip=True)
    assert on.without_tma() == base
    # A stand-in round-trips through the override's (and the autotune cache's) object form.
    stand_in = {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2, "tma": True,
                "no_tma": [32, 32, 4, 1]}  # fmt: skip
    assert override(base, json.dumps({"fwd": stand_in})).fwd == Tile(
        64, 32, 4, 2, tma=True, no_tma=Tile(32, 32, 4, 1)
    )
    assert configs.tile_of(asdict(config_for("hopper", 128).fwd)) == config_for("hopper", 128).fwd


def test_tma_needs_16_byte_aligned_starts_and_strides():
    bf = torch.zeros(2, 8, 3, 64, dtype=torch.bfloat16)
    assert interface.tma_ok(bf, bf.transpose(1, 2).contiguous().transpose(1, 2))
    # d=36: rows 72 bytes apart; a view one element in; fp8 and fp32 are not streamed by TMA.
    assert not interface.tma_ok(torch.zeros(2, 8, 3, 36, dtype=torch.bfloat16))
    n = bf.numel()
    assert not interface.tma_ok(torch.zeros(n + 8, dtype=torch.bfloat16)[1 : n + 1].view(bf.shape))
    assert not interface.tma_ok(torch.zeros(2, 8, 3, 64, dtype=torch.float32))
    assert not interface.tma_ok(bf.to(torch.float8_e4m3fn))
    # A size-1 dimension's stride is never used for an address.
    one = torch.zeros(1, 8, 3, 64, dtype=torch.bfloat16).as_strided((1, 8, 3, 64), (7, 192, 64, 1))
    assert interface.tma_ok(one)


def _spy(monkeypatch):
    seen = []
    real = interface._tma_config

    def spy(c, kernels, *tensors):
        out = real(c, kernels, *tensors)
        seen.append(tuple(getattr(out, k).tma for k in kernels))
        return out

    monkeypatch.setattr(interface, "_tma_config", spy)
    return seen


QUICK = [attn("bf16", 1, 37, 45, 4, 2, 40, "causal")]  # padded head dim, partial tiles, GQA
SLOW = [
    attn("fp16", 3, 30, 30, 2, 1, 64, "window", "varlen"),  # each sequence bounds its descriptor
    attn("bf16", 1, 45, 21, 2, 2, 72, "softcap"),
    attn("fp16", 1, 21, 37, 2, 2, 128, "alibi", "bhsd"),
    attn("bf16", 2, 50, 33, 2, 2, 32, "sdpacausal"),
]


@pytest.mark.parametrize(
    "case", QUICK + [pytest.param(c, marks=pytest.mark.slow) for c in SLOW], ids=lambda c: c.name
)
def test_tma_tiles_match_the_reference(monkeypatch, case):
    # Every kernel through descriptors: their zero fill past a sequence's rows and HEAD_DIM must
    # do what the masked loads did (rows of the next varlen sequence must not leak in).
    seen = _spy(monkeypatch)
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", '{"tma": true}')
    res = compare(case, torch.device("cpu"), seed=6)
    assert res["ok"], (case.name, res["metrics"])
    assert sorted(set(seen)) == [(True,), (True, True)], seen


def test_unaligned_tensors_fall_back_to_pointer_loads(monkeypatch):
    seen = _spy(monkeypatch)
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", '{"tma": true}')
    res = compare(attn("fp16", 1, 20, 20, 2, 2, 36, "causal"), torch.device("cpu"), seed=7)
    assert res["ok"], res["metrics"]
    assert sorted(set(seen)) == [(False,), (False, False)], seen
    assert configs.INTERPRET
