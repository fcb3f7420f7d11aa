"""The forward at the small shapes of diffusion models (issue 30): the single-block path for short
key sequences (``SHORT_KV``, configs.SHORT_KV_FWD) and the stride alignment that head dims such
as 40 need (``STRIDE_ALIGN``), in Triton's interpreter."""

import pytest
import torch

from attnforge_kernels import flash_attn_func, flash_attn_varlen_func
from attnforge_kernels.api import flash_attn as interface
from attnforge_kernels.checks.reference import attention_ref
from attnforge_kernels.device import configs
from attnforge_kernels.device.configs import Tile
from attnforge_kernels.device.flash import stride_align
from attnforge_kernels.tools import compile_check as aot
from tests.kernels.standins import LaunchSpy

TOL = 2e-2


@pytest.fixture
def spy(monkeypatch):
    s = LaunchSpy(interface.attn_fwd)
    monkeypatch.setattr(interface, "attn_fwd", s)
    return s


@pytest.fixture
def short_tile(monkeypatch):
    """A 32-key single-block tile for the interpreter's d=32 (its default tile is 16x16)."""
    tile = Tile(16, 32, 1, 1)
    monkeypatch.setitem(configs.SHORT_KV_FWD, ("interpreter", 32), tile)
    return tile


def _qkv(sq, sk, hq=2, hk=2, d=32, seed=0, layout="bshd", b=2):
    g = torch.Generator().manual_seed(seed)

    def make(s, h):
        if layout == "bshd":
            return torch.randn(b, s, h, d, generator=g).to(torch.bfloat16)
        return torch.randn(b, h, s, d, generator=g).to(torch.bfloat16).transpose(1, 2)

    return make(sq, hq), make(sk, hk), make(sk, hk)


def _check(out, q, k, v, **ref_kw):
    rep = q.shape[2] // k.shape[2]
    ref, _ = attention_ref(q, k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2), **ref_kw)
    assert (out.float() - ref.float()).abs().max().item() <= TOL


@pytest.mark.parametrize(
    "strides, expected",
    [
        ((1310720, 320, 40), 8),  # d=40 BSHD, 8 heads: the head stride is 40
        ((1310720, 40, 163840), 8),  # the same stored BHSD: the row stride is 40
        ((524288, 512, 64), 1),  # every stride a multiple of 16: Triton proves it itself
        ((0, 320, 40), 8),  # varlen: the zero batch stride says nothing
        ((0, 0), 1),
        ((72 * 3, 72), 8),
        ((36, 36 * 5), 4),
        ((7 * 9, 7), 1),
    ],
)
def test_stride_align_is_the_power_of_two_the_strides_share(strides, expected):
    assert stride_align(*strides) == expected


def test_a_short_key_tile_applies_only_when_every_key_fits_its_block(short_tile, monkeypatch):
    assert configs.short_kv_fwd("interpreter", 32, 32) == short_tile
    assert configs.short_kv_fwd("interpreter", 24, 7) == short_tile  # keyed by the padded dim
    assert configs.short_kv_fwd("interpreter", 32, 33) is None
    assert configs.short_kv_fwd("interpreter", 64, 8) is None
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", '{"fwd": [16, 16, 1, 1]}')
    assert configs.short_kv_fwd("interpreter", 32, 8) is None


def test_seventy_seven_keys_take_the_single_block_path_of_a_long_enough_tile(monkeypatch, spy):
    # CLIP's 77 text tokens in one 128-key block, as SD 1.5's cross-attention; 129 keys loop.
    monkeypatch.setitem(configs.SHORT_KV_FWD, ("interpreter", 32), Tile(16, 128, 1, 1))
    q, k, v = _qkv(40, 77)
    _check(flash_attn_func(q, k, v), q, k, v)
    assert spy.calls[-1]["SHORT_KV"] and spy.calls[-1]["BLOCK_N"] == 128
    q, k, v = _qkv(40, 129)
    _check(flash_attn_func(q, k, v), q, k, v)
    assert not spy.calls[-1]["SHORT_KV"] and spy.calls[-1]["BLOCK_N"] == 16


# Each case runs the single-block path and, with the same tile, the loop (short_kv off).
SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])
FEATURES = {
    "plain": (dict(), dict()),
    "causal, fewer keys than queries": (dict(causal=True), dict(right=0)),
    "window": (dict(window_size=(5, 3)), dict(left=5, right=3)),
    "softcap": (dict(softcap=2.0), dict(softcap=2.0)),
    "alibi": (dict(alibi_slopes=SLOPES), dict(alibi_slopes=SLOPES)),
}


@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("short", [True, False])
def test_the_single_block_path_matches_the_reference_with_every_mask(
    short_tile, spy, monkeypatch, feature, short
):
    if not short:
        monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", '{"fwd": [16, 32, 1, 1], "short_kv": false}')
    call_kw, ref_kw = FEATURES[feature]
    q, k, v = _qkv(37, 29, hq=4, hk=2)
    out = flash_attn_func(q, k, v, **call_kw)
    assert spy.calls[-1]["SHORT_KV"] == short and spy.calls[-1]["BLOCK_N"] == 32
    _check(out, q, k, v, **ref_kw)


def test_rows_that_see_no_key_get_zero_and_an_infinite_lse_in_the_single_block_path(
    short_tile, spy
):
    # Causal aligned bottom-right with 30 queries on 9 keys: the first 21 rows see nothing.
    q, k, v = _qkv(30, 9)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert spy.calls[-1]["SHORT_KV"]
    assert torch.isinf(lse[:, :, :21]).all() and torch.isfinite(lse[:, :, 21:]).all()
    assert (out[:, :21] == 0).all()
    _check(out, q, k, v, right=0)


def test_varlen_takes_the_single_block_path_when_its_longest_key_sequence_fits(short_tile, spy):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, 2, 32, generator=g).to(torch.bfloat16) for n in (50, 40, 40))
    cu_q = torch.tensor([0, 20, 50], dtype=torch.int32)
    cu_k = torch.tensor([0, 13, 40], dtype=torch.int32)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 30, 27)
    assert spy.calls[-1]["SHORT_KV"]
    for i in range(2):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        _check(out[qs][None], q[qs][None], k[ks][None], v[ks][None])


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("d, align", [(40, 8), (24, 8), (64, 1)])
def test_head_dims_off_the_16_grid_launch_with_their_stride_alignment(spy, layout, d, align):
    q, k, v = _qkv(45, 77, d=d, layout=layout)
    out = flash_attn_func(q, k, v)
    assert spy.calls[-1]["STRIDE_ALIGN"] == align
    _check(out, q, k, v)


def test_the_aot_check_compiles_the_forward_as_the_launcher_passes_d40():
    """At d=40 the forward job gets STRIDE_ALIGN 8 and its q/k/v/out stride quotients no
    divisibility hint (they need not be multiples of 16); the LSE strides keep theirs."""
    cfg = configs.config_for("cdna3", 40)
    name, fn, ptrs, consts, _ = aot._kernels(40, cfg)[0]
    assert name == "fwd" and consts["STRIDE_ALIGN"] == 8
    _, attrs = aot._signature(fn, ptrs, consts)
    hinted = {fn.arg_names[i] for (i,) in attrs}
    assert not hinted & {f"s{t}_{x}" for t in "qkvo" for x in "bsh"}
    assert {"sl_b", "sl_h", "Q", "K", "V", "Out"} <= hinted
    consts64 = aot._kernels(64, configs.config_for("cdna3", 64))[0][3]
    _, attrs64 = aot._signature(fn, ptrs, consts64)
    assert consts64["STRIDE_ALIGN"] == 1
    assert {"sq_s", "sk_h", "so_b"} <= {fn.arg_names[i] for (i,) in attrs64}


def test_every_short_key_tile_takes_clips_77_tokens_in_one_block():
    for (family, d), tile in configs.SHORT_KV_FWD.items():
        assert tile.block_n >= 77, (family, d)
        assert configs.short_kv_fwd(family, d, 77) == tile


def test_short_keys_take_precedence_over_a_head_dims_own_tile():
    cfg = configs.config_for("hopper", 40)
    short, own = configs.SHORT_KV_FWD[("hopper", 64)], configs.HEAD_DIM_FWD[("hopper", 40)]
    # SD 1.5's first level: cross-attention to 77 tokens, self-attention over 4096.
    assert configs.forward_config(cfg, "hopper", 40, 4096, 77, 16, None).fwd == short
    assert configs.forward_config(cfg, "hopper", 40, 4096, 4096, 16, None).fwd == own


@pytest.mark.parametrize("family", ["cdna3", "rdna3", "hopper"])
def test_the_aot_check_compiles_the_backward_as_the_launcher_passes_d40(family):
    """The dK/dV and dQ jobs at d=40 get STRIDE_ALIGN 8 and no divisibility hint on their tensor
    strides, as the backward launches them; the LSE strides keep theirs; d=64 is unchanged."""
    jobs = {j[0]: j for j in aot._kernels(40, configs.config_for(family, 40))}
    jobs64 = {j[0]: j for j in aot._kernels(64, configs.config_for(family, 64))}
    for name in ("bwd_dkdv", "bwd_dq"):
        _, fn, ptrs, consts, _ = jobs[name]
        assert consts["STRIDE_ALIGN"] == 8
        _, attrs = aot._signature(fn, ptrs, consts)
        hinted = {fn.arg_names[i] for (i,) in attrs}
        strides = {a for a in fn.arg_names if a[0] == "s" and a[-2:] in ("_b", "_s", "_h")}
        assert strides - {"sl_b", "sl_h", "sa_b", "sa_h"}, name
        assert not hinted & (strides - {"sl_b", "sl_h"}), name
        assert {"sl_b", "sl_h", "Q", "K", "DO"} <= hinted, name
        _, fn, ptrs, consts64, _ = jobs64[name]
        assert consts64["STRIDE_ALIGN"] == 1
        _, attrs64 = aot._signature(fn, ptrs, consts64)
        assert strides - {"sa_b", "sa_h"} <= {fn.arg_names[i] for (i,) in attrs64}, name
