"""The forward's small-grid tile (configs.SMALL_GRID_FWD) and the no-autograd inference path, in
Triton's interpreter."""

import pytest
import torch

from attnforge_kernels import flash_attn_func
from attnforge_kernels.api import flash_attn as interface
from attnforge_kernels.checks.reference import attention_ref
from attnforge_kernels.device import configs
from attnforge_kernels.device.configs import Tile
from tests.kernels.standins import LaunchSpy


def test_small_grids_take_the_small_tile_and_large_ones_keep_the_default():
    cfg = configs.config_for("hopper", 64)
    small = configs.SMALL_GRID_FWD[("hopper", 64)]
    # SDXL's 1024-token level, b2 h20 d64 on 132 SMs: 8 x 40 = 320 programs < 4 x 132.
    assert configs.small_grid_fwd(cfg, "hopper", 64, 1024, 40, 132) == small
    # Its 4096-token level, b2 h10: 32 x 20 = 640 programs fill the GPU.
    assert configs.small_grid_fwd(cfg, "hopper", 64, 4096, 20, 132) is None
    # The boundary: exactly SMALL_GRID_WAVES programs per unit is not small.
    rows = cfg.fwd.block_m * configs.SMALL_GRID_WAVES
    assert configs.small_grid_fwd(cfg, "hopper", 64, rows, 132, 132) is None
    assert configs.small_grid_fwd(cfg, "hopper", 64, rows - cfg.fwd.block_m, 132, 132) == small
    # d=40 runs the padded d=64 tiles; the interpreter has no entry; 0 units (unknown) never.
    assert configs.small_grid_fwd(cfg, "hopper", 40, 1024, 16, 132) == small
    assert configs.small_grid_fwd(cfg, "interpreter", 128, 1, 1, 132) is None
    assert configs.small_grid_fwd(cfg, "hopper", 64, 1, 1, 0) is None


def test_a_non_causal_small_grid_runs_its_own_tile_where_the_family_has_one():
    # Hopper d=128: the 64-row tile balanced causal grids' uneven programs, and ran slower than
    # the 8-warp tile where every program has the same work; the default 4-warp tile needs two
    # programs an SM, which a small grid does not have.
    cfg = configs.config_for("hopper", 128)
    small = configs.SMALL_GRID_FWD[("hopper", 128)]
    full = configs.SMALL_GRID_FULL_FWD[("hopper", 128)]
    assert full == configs.HOPPER_FWD_8_WARPS != cfg.fwd and small != full
    # LLM prefill b1 h32 s1024 on 132 SMs: 8 x 32 = 256 programs < 4 x 132.
    assert configs.small_grid_fwd(cfg, "hopper", 128, 1024, 32, 132, causal=True) == small
    assert configs.small_grid_fwd(cfg, "hopper", 128, 1024, 32, 132) == full
    # d=80 runs the padded d=128 rows; a large grid keeps the default, causal or not.
    assert configs.small_grid_fwd(cfg, "hopper", 80, 1024, 16, 132, causal=True) == small
    assert configs.small_grid_fwd(cfg, "hopper", 80, 1024, 16, 132) == full
    assert configs.small_grid_fwd(cfg, "hopper", 128, 6132, 24, 132, causal=True) is None
    assert configs.small_grid_fwd(cfg, "hopper", 128, 6132, 24, 132) is None
    # A family without a row of its own serves both with SMALL_GRID_FWD's tile.
    assert (
        configs.small_grid_fwd(cfg, "hopper", 64, 1024, 32, 132)
        == configs.SMALL_GRID_FWD[("hopper", 64)]
    )


def test_forward_config_passes_causal_to_the_small_grid_choice(monkeypatch):
    monkeypatch.setattr(configs, "compute_units", lambda device=None: 132)
    cfg = configs.config_for("hopper", 128)
    small = configs.SMALL_GRID_FWD[("hopper", 128)]
    causal = configs.forward_config(cfg, "hopper", 128, 1024, 1024, 32, None, causal=True)
    # 1024 tokens: below the Gluon forward's threshold, the small tile runs on the Triton path.
    assert causal.fwd == small and not causal.gluon_fwd_at(128, 1024, causal=True)
    full = configs.SMALL_GRID_FULL_FWD[("hopper", 128)]
    assert configs.forward_config(cfg, "hopper", 128, 1024, 1024, 32, None).fwd == full
    # A causal small grid of 4096 tokens (b1 h16): the small tile for the Triton forward, and the
    # Gluon forward stays on from its threshold (it measured 1.17-1.23x the small tile there).
    causal = configs.forward_config(cfg, "hopper", 128, 4096, 4096, 16, None, causal=True)
    assert causal.fwd == small and causal.gluon_fwd_at(128, 4096, causal=True)
    # A non-causal small grid of 4096 tokens (b1 h16: 32 x 16 = 512 programs < 4 x 132): the
    # 8-warp tile for the Triton forward, and the Gluon forward takes it from its own threshold
    # (GLUON_MIN_SEQ).
    assert cfg.gluon_fwd and cfg.gluon_fwd_min_seq <= 4096
    full_grid = configs.forward_config(cfg, "hopper", 128, 4096, 4096, 16, None)
    assert full_grid.fwd == full and full_grid.gluon_fwd_at(128, 4096)
    # A GPU-filling grid keeps the config whole.
    assert configs.forward_config(cfg, "hopper", 128, 4096, 4096, 64, None) is cfg


def test_every_small_tile_is_smaller_than_the_default_forward_tile():
    for (family, d), tile in configs.SMALL_GRID_FWD.items():
        default = configs.config_for(family, d).fwd
        assert tile.block_m * tile.block_n < default.block_m * default.block_n, (family, d)
        assert tile.num_warps <= default.num_warps, (family, d)


def test_a_forward_tile_named_in_the_override_wins(monkeypatch):
    cfg = configs.config_for("hopper", 64)
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", '{"fwd": [128, 64, 8, 3]}')
    assert configs.small_grid_fwd(cfg, "hopper", 64, 1024, 40, 132) is None
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", '{"atomic_dq": false}')
    assert configs.small_grid_fwd(cfg, "hopper", 64, 1024, 40, 132) is not None


def _small_grid_spy(monkeypatch) -> LaunchSpy:
    """The interpreter's d=32 small tile 32x16 on a device of 8 compute units, launches spied."""
    monkeypatch.setitem(configs.SMALL_GRID_FWD, ("interpreter", 32), Tile(32, 16, 1, 1))
    monkeypatch.setattr(configs, "compute_units", lambda device=None: 8)
    spy = LaunchSpy(interface.attn_fwd)
    monkeypatch.setattr(interface, "attn_fwd", spy)
    return spy


@pytest.mark.parametrize("grad", [False, True])
def test_a_small_grid_launches_the_small_tile_and_stays_correct(monkeypatch, grad):
    spy = _small_grid_spy(monkeypatch)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, 2, 32, generator=g).to(torch.bfloat16) for n in (45, 77, 77))
    if grad:
        q.requires_grad_()
    out = flash_attn_func(q, k, v, causal=True)
    # 45 rows in 16-row default tiles x 2 heads = 6 programs < 4 x 8 units: the 32-row tile.
    assert spy.values("BLOCK_M") == [32]
    assert (out.grad_fn is not None) == grad
    ref, _ = attention_ref(q.detach(), k, v, right=0)
    assert (out.float() - ref.float()).abs().max().item() <= 2e-2


def test_a_grid_of_four_programs_per_unit_keeps_the_default_tile(monkeypatch):
    spy = _small_grid_spy(monkeypatch)
    g = torch.Generator().manual_seed(0)
    # 256 rows in 16-row tiles x 2 heads: 32 programs = 4 x 8 units, not small (the rule is
    # fewer than 4 per unit; the 600 rows this checked before were 76 programs).
    q, k, v = (torch.randn(1, n, 2, 32, generator=g).to(torch.bfloat16) for n in (256, 77, 77))
    flash_attn_func(q, k, v)
    assert spy.values("BLOCK_M") == [16]


def test_a_head_dims_own_forward_tile_wins_over_the_grid_rule(monkeypatch):
    # Hopper d=40 has its own tile; d=64 (same padded width) and the interpreter do not.
    assert configs.head_dim_fwd("hopper", 40) == configs.HEAD_DIM_FWD[("hopper", 40)]
    assert configs.head_dim_fwd("hopper", 64) is None
    assert configs.head_dim_fwd("interpreter", 40) is None
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", '{"fwd": [128, 64, 8, 3]}')
    assert configs.head_dim_fwd("hopper", 40) is None


def test_a_head_dim_tile_is_launched_at_that_head_dim_only(monkeypatch):
    monkeypatch.setitem(configs.HEAD_DIM_FWD, ("interpreter", 24), Tile(32, 16, 1, 1))
    spy = LaunchSpy(interface.attn_fwd)
    monkeypatch.setattr(interface, "attn_fwd", spy)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, 2, 24, generator=g).to(torch.bfloat16) for n in (45, 77, 77))
    out = flash_attn_func(q, k, v)
    assert spy.values("BLOCK_M") == [32]
    ref, _ = attention_ref(q, k, v)
    assert (out.float() - ref.float()).abs().max().item() <= 2e-2
    q32, k32, v32 = (torch.randn(1, n, 2, 32, generator=g).to(torch.bfloat16) for n in (45, 77, 77))
    flash_attn_func(q32, k32, v32)
    assert spy.values("BLOCK_M")[-1] == 16
