"""Forward and backward against an fp32 reference, flash-attention's 2x rule (CPU interpreter)."""

import json

import pytest
import torch

from attnforge_kernels.checks.attention import compare
from attnforge_kernels.checks.case import attn
from attnforge_kernels.checks.grids import cpu_grid
from attnforge_kernels.device.configs import config_for, for_tensors

# Interpreter time grows with the work: the cases under this bound (length 1, one-tile heads,
# d=160/256 on one head, SDPA's causal) took 0.1-0.35 s each, the rest 0.4-2 s (2-core CPU), so
# only the small ones stay in the quick run (-m "not slow").
QUICK_WORK = 90_000
CASES = [
    c if c.b * c.hq * c.sq * c.sk * c.d <= QUICK_WORK else pytest.param(c, marks=pytest.mark.slow)
    for c in cpu_grid()
]


def _all_match_reference(monkeypatch, tiles: str, cases, seed: int) -> None:
    """Every case against the fp32 reference under the config override ``tiles``."""
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", tiles)
    for case in cases:
        res = compare(case, torch.device("cpu"), seed=seed)
        assert res["ok"], (case.name, res["metrics"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_and_backward_match_fp32_reference(case):
    res = compare(case, torch.device("cpu"), seed=1)
    m = res["metrics"]
    assert res["ok"], {k: v for k, v in m.items() if k.startswith(("err_", "bound_"))}


@pytest.mark.slow
@pytest.mark.parametrize(
    "override",
    [
        '{"reload": true}',
        '{"atomic_dq": true}',
        '{"chunk_kv": 16, "chunk_q": 16}',
        '{"chunk_kv": 16, "atomic_dq": true}',
    ],
)
def test_alternative_backward_paths_match_reference(monkeypatch, override):
    # RDNA3 configs re-read resident tiles or chunk the head-dim contractions; atomic dQ is an
    # opt-in path: all must stay correct (d=40 pads to 64: a partial and a skipped chunk).
    cases = (
        attn("bf16", 1, 37, 45, 4, 2, 40, "causal"),
        attn("fp16", 3, 30, 30, 2, 1, 32, "window", "varlen"),
    )
    _all_match_reference(monkeypatch, override, cases, seed=2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "tiles",
    [
        '{"fwd": [32, 16, 1, 1], "bwd_kv": [16, 32, 1, 1], "bwd_q": [32, 16, 1, 1]}',
        '{"fwd": [16, 32, 1, 1], "bwd_kv": [32, 16, 1, 1], "bwd_q": [16, 32, 1, 1]}',
    ],
)
def test_unequal_tile_shapes_keep_masks_right(monkeypatch, tiles):
    # The GPU defaults use BLOCK_M != BLOCK_N; the block-range arithmetic must not assume equal.
    cases = (
        attn("bf16", 1, 45, 70, 2, 1, 32, "causal"),
        attn("fp16", 1, 70, 45, 2, 2, 32, "window"),
        attn("bf16", 2, 50, 33, 2, 2, 32, "sdpacausal"),
    )
    _all_match_reference(monkeypatch, tiles, cases, seed=3)


def _tiles_json(cfg) -> str:
    def t(x):
        return [x.block_m, x.block_n, x.num_warps, x.num_stages, x.waves_per_eu]

    return json.dumps(
        {
            "fwd": t(cfg.fwd),
            "bwd_kv": t(cfg.bwd_kv),
            "bwd_q": t(cfg.bwd_q),
            "atomic_dq": cfg.atomic_dq,
            "reload": cfg.reload,
            "chunk_kv": cfg.chunk_kv,
            "chunk_q": cfg.chunk_q,
            "chunk_fwd": cfg.chunk_fwd,
        }
    )


def _rdna_tiles(families: tuple[str, ...], head_dim: int) -> list:
    """The families' launch configs at ``head_dim``, each distinct one once (ids name the
    families that share it): families with the same tiles and chunking would run the same
    launches twice."""
    by_tiles: dict[str, list[str]] = {}
    for family in families:
        by_tiles.setdefault(_tiles_json(config_for(family, head_dim)), []).append(family)
    return [pytest.param(tiles, id="+".join(fams)) for tiles, fams in by_tiles.items()]


@pytest.mark.slow
@pytest.mark.parametrize("tiles", _rdna_tiles(("rdna3", "rdna3.5"), 128))
def test_rdna_d128_backward_config_matches_reference(monkeypatch, tiles):
    # The RDNA3/3.5 d=128 defaults (16-column chunked backward contractions) under the
    # interpreter: full head dim, padded head dims (96, 72) and every mask kind the chunked loops
    # branch on (masked and unmasked ranges, softcap, ALiBi, varlen, GQA).
    cfg = json.loads(tiles)
    assert cfg["chunk_kv"] and cfg["chunk_q"]
    cases = (
        attn("bf16", 1, 45, 37, 4, 2, 128, "causal"),
        attn("fp16", 2, 33, 40, 2, 1, 96, "window", "varlen"),
        attn("bf16", 1, 37, 21, 2, 2, 72, "softcap"),
        attn("fp16", 1, 21, 37, 2, 2, 128, "alibi", "bhsd"),
    )
    _all_match_reference(monkeypatch, tiles, cases, seed=4)


@pytest.mark.slow
@pytest.mark.parametrize("tiles", _rdna_tiles(("rdna3", "rdna3.5", "rdna4"), 256))
def test_rdna_wide_head_config_matches_reference(monkeypatch, tiles):
    # RDNA above d=128: the forward's Q.K^T in 16-column chunks (``chunk_fwd``) beside the
    # chunked backward, at SD 1.5's d=160 (ten chunks of a 256-wide tile, six skipped) and
    # d=256; the single-block path (keys <= the tile's 16), the key loop with its masked
    # blocks, the folded and the unfolded scale (softcap), queries past the last tile row.
    cfg = json.loads(tiles)
    assert cfg["chunk_fwd"] and cfg["chunk_kv"] and cfg["chunk_q"]
    cases = (
        attn("bf16", 1, 45, 37, 2, 1, 160, "causal"),
        attn("fp16", 2, 21, 13, 2, 2, 160, "full", "varlen"),
        attn("bf16", 1, 19, 40, 2, 2, 256, "softcap", "bhsd"),
        attn("fp16", 1, 33, 9, 1, 1, 256),
    )
    _all_match_reference(monkeypatch, tiles, cases, seed=6)


def test_chunked_backward_is_off_above_2gib():
    # Above 2 GiB Triton's HIP JIT uses 64-bit addresses, where chunking spills more (docs).
    cfg = config_for("rdna3.5", 128)
    assert for_tensors(cfg, True) == cfg
    off = for_tensors(cfg, False)
    assert off.chunk_kv == off.chunk_q == 0 and off.reload and off.bwd_kv == cfg.bwd_kv
    nv = config_for("hopper", 128)
    assert nv.chunk_kv == nv.chunk_q == 0 and for_tensors(nv, False) == nv
    wide = for_tensors(config_for("rdna3.5", 256), False)
    assert wide.chunk_fwd == wide.chunk_kv == wide.chunk_q == 0 and wide.reload


def test_launcher_drops_chunking_above_the_buffer_limit(monkeypatch):
    # With the 2 GiB limit lowered to nothing, the launcher must launch the re-read fallback.
    from attnforge_kernels.device import configs

    seen = []
    real = configs.for_tensors

    def spy(cfg, within_2gib):
        out = real(cfg, within_2gib)
        seen.append((within_2gib, out.chunk_kv, out.chunk_q, out.chunk_fwd))
        return out

    monkeypatch.setattr(configs, "MAX_BUFFER_BYTES", 1)
    monkeypatch.setattr(configs, "for_tensors", spy)
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", _tiles_json(config_for("rdna3.5", 256)))
    res = compare(attn("bf16", 1, 33, 33, 2, 1, 160, "causal"), torch.device("cpu"), seed=5)
    assert res["ok"], res["metrics"]
    # The forward's and the backward's launches each, re-read, unchunked.
    assert len(seen) >= 2 and all(s == (False, 0, 0, 0) for s in seen), seen


@pytest.mark.slow
@pytest.mark.parametrize("d", [40, 128])
def test_chunked_forward_matches_reference(monkeypatch, d):
    # ``chunk_fwd`` on its own, on the interpreter's tiles: a padded head dim (40: a partial and
    # a skipped chunk), windows, ALiBi, GQA and varlen; the chunks of rows past a sequence's end
    # read its last row.
    cases = (
        attn("bf16", 1, 37, 45, 4, 2, d, "causal"),
        attn("fp16", 3, 30, 30, 2, 1, d, "window", "varlen"),
        attn("bf16", 1, 21, 37, 2, 2, d, "alibi"),
    )
    _all_match_reference(monkeypatch, '{"chunk_fwd": 16}', cases, seed=7)


def test_a_chunk_wider_than_the_head_dim_contracts_it_whole(monkeypatch):
    # A chunk of 64 at d=32 (a 32-column tile): the contractions take BLOCK_D // D_CHUNK steps,
    # so the launch's chunk is at most the padded head dim (flash.head_chunk). Passed as is, the
    # forward's scores and the backward's products were silently zero (out error 1.8, dQ 12.7).
    cases = (attn("bf16", 1, 37, 45, 4, 2, 32, "causal"),)
    _all_match_reference(monkeypatch, '{"chunk_fwd": 64, "tma": false}', cases, seed=8)
    _all_match_reference(monkeypatch, '{"chunk_kv": 64, "chunk_q": 64, "split_kv": false}', cases,
                         seed=8)  # fmt: skip


def test_chunk_fwd_is_refused_with_a_tma_forward_tile():
    from attnforge_kernels.device import configs

    cfg = config_for("hopper", 64)
    assert configs.override(cfg, '{"chunk_fwd": 32}').chunk_fwd == 32
    with pytest.raises(ValueError, match="chunk_fwd runs without the forward tile's tma"):
        configs.override(cfg, '{"chunk_fwd": 16, "tma": true}')
    # d=128's default forward streams by TMA: a chunk needs its tile's pointer loads named too.
    with pytest.raises(ValueError, match="chunk_fwd runs without the forward tile's tma"):
        configs.override(config_for("hopper", 128), '{"chunk_fwd": 32}')
    assert configs.override(config_for("hopper", 128), '{"chunk_fwd": 32, "tma": false}').chunk_fwd
    with pytest.raises(ValueError, match="chunk_fwd must be 0 or a power of two >= 16"):
        configs.override(cfg, '{"chunk_fwd": 24}')
