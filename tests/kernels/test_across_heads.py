"""Causal grids launched longest first across heads (``AttnConfig.across_heads``, flash.py
``_grid_order``): only the order in which the programs launch changes, every (block, head) runs
once with the same code, so in Triton's interpreter the outputs and gradients must equal the
head-after-head launch's bit for bit: GQA, fewer and more keys than queries, one block, varlen
sequences of different block counts, dropout, the split dK/dV launches and the paired ones. The
order itself is read off a kernel that records what ``_grid_order`` gives each launch index."""

import json

import pytest
import torch
import triton
import triton.language as tl

from attnforge_kernels import flash_attn_func, flash_attn_varlen_func
from attnforge_kernels.api import flash_attn as interface
from attnforge_kernels.device import configs, flash
from tests.kernels.standins import LaunchSpy, grads_under

OPEN = [0, 1e9]  # every grid in the window

# The interpreter's tiles are 16 x 16: 70 tokens are 5 blocks.
CASES = {
    "causal-gqa": (70, 70, dict(causal=True), {}),
    "one-block": (16, 16, dict(causal=True), {}),
    "fewer-keys": (70, 45, dict(causal=True), {}),
    "more-keys": (45, 83, dict(causal=True), {}),
    "dropout": (70, 70, dict(dropout_p=0.3, causal=True), {}),
    "split": (70, 70, dict(causal=True), {"split_kv": True}),
    "paired": (70, 70, dict(causal=True), {"paired_kv": True}),
}


def _spec(across: bool, extra: dict) -> str:
    return json.dumps({"across_heads": across, "across_waves": OPEN, **extra})


@pytest.mark.parametrize("case", CASES)
def test_across_heads_computes_what_the_head_order_does(monkeypatch, case):
    spies = {}
    for name in ("attn_fwd", "attn_bwd_dq", "attn_bwd_dkdv"):
        spies[name] = LaunchSpy(getattr(interface, name))
        monkeypatch.setattr(interface, name, spies[name])
    sq, sk, kw, extra = CASES[case]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, sq, 4, 32, generator=g).to(torch.float16)  # 4 query heads on 2 KV heads
    k, v = (torch.randn(2, sk, 2, 32, generator=g).to(torch.float16) for _ in range(2))
    call = lambda *t: flash_attn_func(*t, **kw)  # noqa: E731
    heads = grads_under(monkeypatch, _spec(False, extra), call, (q, k, v), with_out=True)
    across = grads_under(monkeypatch, _spec(True, extra), call, (q, k, v), with_out=True)
    for name in ("attn_fwd", "attn_bwd_dq"):
        flags = spies[name].values("ACROSS_HEADS")
        assert flags == [False] * (len(flags) // 2) + [True] * (len(flags) // 2), name
    # The paired dK/dV grid keeps its own order: its programs weigh alike.
    dkdv = spies["attn_bwd_dkdv"].values("ACROSS_HEADS")
    paired = extra.get("paired_kv", False)
    assert dkdv == [False] * (len(dkdv) // 2) + [not paired] * (len(dkdv) // 2)
    for name, a, b in zip(("out", "dq", "dk", "dv"), heads, across, strict=True):
        assert torch.equal(a, b), name
    assert all(bool(t.abs().sum() > 0) for t in across)


def test_across_heads_varlen_computes_what_the_head_order_does(monkeypatch):
    # 17 and 70 tokens: 2 and 5 blocks on a grid of 5 a sequence; the short one's last three
    # programs have no block, wherever the order puts them.
    g = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 17, 87], dtype=torch.int32)
    q, k, v = (torch.randn(87, 2, 64, generator=g).to(torch.float16) for _ in range(3))

    def call(q, k, v):
        return flash_attn_varlen_func(q, k, v, cu, cu, 70, 70, causal=True)

    heads = grads_under(monkeypatch, _spec(False, {}), call, (q, k, v), with_out=True)
    across = grads_under(monkeypatch, _spec(True, {}), call, (q, k, v), with_out=True)
    for name, a, b in zip(("out", "dq", "dk", "dv"), heads, across, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("kw", [{}, dict(window_size=(5, 3))], ids=["no-mask", "two-sided"])
def test_only_causal_launches_order_across_heads(monkeypatch, kw):
    spies = {}
    for name in ("attn_fwd", "attn_bwd_dq", "attn_bwd_dkdv"):
        spies[name] = LaunchSpy(getattr(interface, name))
        monkeypatch.setattr(interface, name, spies[name])
    q, k, v = (torch.randn(1, 40, 2, 32).to(torch.float16) for _ in range(3))
    grads_under(monkeypatch, _spec(True, {}), lambda *t: flash_attn_func(*t, **kw), (q, k, v))
    for name, spy in spies.items():
        assert spy.values("ACROSS_HEADS") == [False], name


@triton.jit
def _record_order(Out, REVERSE: tl.constexpr, ACROSS_HEADS: tl.constexpr):
    pid_m, pid_bh = flash._grid_order(REVERSE, ACROSS_HEADS)
    launch_idx = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    tl.store(Out + 2 * launch_idx, pid_m)
    tl.store(Out + 2 * launch_idx + 1, pid_bh)


def _order(blocks: int, heads: int, reverse: bool, across: bool) -> list[tuple[int, int]]:
    """(block, head) of each program, in launch order (the grid's first dimension fastest), on
    the grid the launcher gives (flash_attn.py ``_ordered_grid``)."""
    out = torch.full((blocks * heads * 2,), -1, dtype=torch.int32)
    grid = (heads, blocks) if across else (blocks, heads)
    _record_order[grid](out, REVERSE=reverse, ACROSS_HEADS=across)
    return [tuple(p) for p in out.view(-1, 2).tolist()]


@pytest.mark.parametrize("blocks,heads", [(5, 3), (1, 4), (4, 1), (8, 6)])
def test_grid_order_runs_every_block_once_longest_first_across_heads(blocks, heads):
    every = sorted((m, bh) for m in range(blocks) for bh in range(heads))
    # Forward and dQ: the last query block sees the most keys (REVERSE).
    order = _order(blocks, heads, reverse=True, across=True)
    assert sorted(order) == every
    assert [m for m, _ in order] == sorted((m for m, _ in order), reverse=True)
    assert [bh for _, bh in order[:heads]] == list(range(heads))  # every head's longest first
    # dK/dV: key block 0 sees the most queries.
    order = _order(blocks, heads, reverse=False, across=True)
    assert sorted(order) == every and [m for m, _ in order] == sorted(m for m, _ in order)
    # Head after head, as before: each head's blocks from the longest.
    assert _order(blocks, heads, reverse=True, across=False) == [
        (blocks - 1 - m, bh) for bh in range(heads) for m in range(blocks)
    ]


def test_the_window_bounds_the_grids_that_order_across_heads():
    cfg = configs.override(configs.config_for("hopper", 128), '{"across_heads": true}')
    low, high = cfg.across_waves
    assert (low, high) == configs.ACROSS_WAVES
    units = 132
    assert cfg.across_heads_at(True, int(high * units) - 1, units)
    assert not cfg.across_heads_at(True, int(high * units), units)  # the head order's tail is short
    assert not cfg.across_heads_at(False, 1, units)  # not causal
    assert cfg.across_heads_at(True, 1, 0)  # the interpreter: units unknown
    every = configs.override(cfg, '{"across_waves": [0, 1e9]}')
    assert every.across_heads_at(True, 10**8, units)
    off = configs.override(cfg, '{"across_heads": false}')
    assert not off.across_heads_at(True, 1, units)
    for bad in ("[2, 1]", "[-1, 4]", "[1]", '"wide"'):
        with pytest.raises(ValueError, match="across_waves"):
            configs.override(cfg, f'{{"across_waves": {bad}}}')


@pytest.mark.parametrize("arch", ["gfx1151", "sm90"])
def test_the_aot_check_compiles_the_ordered_kernels_where_a_config_launches_them(monkeypatch, arch):
    from attnforge_kernels.tools import compile_check as aot

    spec = aot.load_arches()[arch]
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", '{"across_heads": true}')
    jobs = {job[0]: job[3] for _, job in aot.jobs_for(arch, spec, [128])}
    for name in ("fwd", "bwd_dq", "bwd_dkdv"):
        assert jobs[name]["ACROSS_HEADS"] is False
        assert jobs[f"{name}_across"] == dict(jobs[name], ACROSS_HEADS=True)
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", '{"across_heads": false}')
    assert not [n for _, (n, *_) in aot.jobs_for(arch, spec, [128]) if n.endswith("_across")]


def test_an_ordered_kernel_is_held_to_its_kernels_accepted_spill():
    from attnforge_kernels.tools import compile_check as aot

    def report(kernel, spills):
        r = aot.KernelReport(arch="sm90", family="hopper", head_dim=128, kernel=kernel,
                             tile="64x64 w4 s2 tma", vgprs=255, spills=spills,
                             scratch_bytes=120, lds_bytes=99328)  # fmt: skip
        aot.judge(r, 232448)
        return r

    assert report("bwd_dkdv_across", 132).accepted and not report("bwd_dkdv_across", 132).problems
    assert report("bwd_dkdv_across", 300).problems  # more than the accepted 244
    assert report("bwd_dq_across", 8).problems  # no entry for the dQ kernel


def test_a_grid_too_tall_for_its_second_dimension_keeps_the_head_order():
    cfg = configs.override(configs.config_for("interpreter", 64), '{"across_waves": [0, 1e9]}')
    causal, t = interface.Mask(right=0), torch.zeros(1)
    assert interface._ordered_grid(cfg, causal, 8, 6, t) == ((6, 8), True)
    tall = interface.MAX_GRID_Y + 1  # blocks: the second dimension when swapped
    assert interface._ordered_grid(cfg, causal, tall, 2, t) == ((tall, 2), False)
    assert interface._ordered_grid(cfg, interface.Mask(), 8, 6, t) == ((8, 6), False)
