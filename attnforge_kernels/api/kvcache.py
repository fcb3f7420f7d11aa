"""Attention against a KV cache: ``flash_attn_with_kvcache`` and paged-KV prefill, forward only.

flash_attn's semantics (Dao-AILab/flash-attention, flash_attn/flash_attn_interface.py
``flash_attn_with_kvcache`` and csrc/flash_attn/flash_api.cpp ``mha_fwd_kvcache``, read
2026-11-24): new keys/values are written into the cache in place at ``cache_seqlens`` (after
rotary embedding of the keys), then the queries attend to the first ``cache_seqlens + seqlen_new``
cache rows; causal masks and windows are aligned bottom-right on that length; ``cache_leftpad``
drops the first rows of a sequence; ``block_table`` maps a sequence's pages to cache blocks.

The kernels and their configs are attnforge_kernels/device/decode.py's; this module checks a call,
makes its choices, keeps the split scratch, and plans and launches: a step with new keys is two
launches (``kv_append``, then ``kv_fwd``), one without is one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from ..device import configs
from ..device.configs import Tile
from ..device.decode import (  # noqa: F401 - the configs' names, as this module had them
    APPEND_TILE,
    DECODE_SPLIT_WAVES,
    FEW_TILES_WAVES,
    MIN_SPLIT_KEYS,
    KVConfig,
    SplitTable,
    auto_num_splits,
    call_config,
    kv_append,
    kv_config,
    kv_fwd,
    num_splits_heuristic,
    split_table,
)
from ..device.flash import LOG2E
from ..launch import plans as launch
from ..launch import replay as native
from . import arguments
from .arguments import AttnResult, KVCacheResult
from .errors import ArgumentError, ArgumentTypeError

__all__ = [
    "flash_attn_with_kvcache",
    "paged_varlen_forward",
    "num_splits_heuristic",
    "auto_num_splits",
]


def _num_sms(device) -> int:
    if configs.INTERPRET or device.type != "cuda":
        return 1
    return configs.compute_units(device)  # cached per device: decoding asks on every step


def _memory_gbs(device) -> float:
    if configs.INTERPRET or device.type != "cuda":
        return 0.0
    return configs.memory_gbs(device)  # cached per device


# --------------------------------------------------------------------------------------------
# entry points
# --------------------------------------------------------------------------------------------


def _check_inputs(q, k_cache, v_cache):
    return arguments.check_qkv(
        q, k_cache, v_cache, names=("q", "k_cache", "v_cache"), contiguous_kv=True
    )


def _int32(t, name: str, batch: int, device):
    t = torch.as_tensor(t, device=device)
    if t.dtype not in (torch.int32, torch.int64) or tuple(t.shape) != (batch,):
        raise ArgumentError(f"{name} must be an integer tensor of shape ({batch},)")
    return t.to(torch.int32).contiguous()


def _window(causal: bool, window_size, softcap: float, seqlen_cache: int):
    """(left, right, softcap) as the kernel takes them; windows wider than the cache are off."""
    left, right = window_size if window_size is not None else (-1, -1)
    left = None if left is None or left < 0 or left >= seqlen_cache else int(left)
    right = None if right is None or right < 0 or right >= seqlen_cache else int(right)
    if causal:
        right = 0
    return left, right, float(softcap or 0.0)


# Per (device, stream) and shape: split-KV scratch (partials and the row blocks' counters) and
# the lengths of a whole cache. The kernel leaves the counters at zero, so a decoding loop
# allocates and zero-fills them once, not every step; keyed by stream because steps on two
# streams may run at once. A few entries of at most 16 MiB each; larger ones are not kept.
_SCRATCH: dict = {}
_SCRATCH_ENTRIES = 8
_SCRATCH_BYTES = 16 << 20
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream_of(device) -> int:
    if device.type != "cuda":
        return 0
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def _keep(key, value, nbytes: int):
    """Remember ``value`` under ``key`` unless it is large or made while a CUDA graph captures
    (its zero fill would then run only on replay)."""
    if nbytes > _SCRATCH_BYTES or (
        key[0].type == "cuda" and torch.cuda.is_current_stream_capturing()
    ):
        return value
    if len(_SCRATCH) >= _SCRATCH_ENTRIES:
        _SCRATCH.pop(next(iter(_SCRATCH), None), None)  # the oldest; threads may race here
    _SCRATCH[key] = value
    return value


def _split_scratch(device, splits: int, tiles: int, tile_rows: int, tile_elems: int):
    """(partials, zeroed int32 counters) of a split launch over ``tiles`` programs a split of
    ``tile_rows`` rows of ``tile_elems`` values: outputs, then LSEs (the kernel's layout)."""
    key = (device, _stream_of(device), "split", splits, tiles, tile_rows, tile_elems)
    got = _SCRATCH.get(key)
    if got is not None:
        return got
    part = torch.empty(
        (splits * tiles * (tile_elems + tile_rows),), dtype=torch.float32, device=device
    )
    count = torch.zeros((tiles,), dtype=torch.int32, device=device)
    return _keep(key, (part, count), 4 * (part.numel() + tiles))


def _full_lengths(device, batch: int, rows: int) -> torch.Tensor:
    """cache_seqlens for a whole cache: ``rows`` for each of ``batch`` sequences (read only)."""
    key = (device, _stream_of(device), "lengths", batch, rows)
    got = _SCRATCH.get(key)
    if got is not None:
        return got
    return _keep(key, torch.full((batch,), rows, dtype=torch.int32, device=device), 4 * batch)


@functools.lru_cache(maxsize=64)
def _launch_options(tile: Tile) -> dict:
    return tile.launch_options(configs.is_hip())  # cached: decoding launches on every step


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # triton.cdiv is a jit function: about 10 µs a call from the host


def _launch(
    q, k_cache, v_cache, out, lse, *, tile, config, cu_q, seqlens_k, k_start, block_table, batch_idx,
    slopes, sa, batch, seqlen_q, max_rows, kv_rows, scale, left, right, softcap, num_splits,
    varlen, launched: list | None = None,
):  # fmt: skip
    """Run the cache kernel into ``out`` (and ``lse`` unless it is None): one launch, split or
    not. Pointers a launch does not use go as None (nothing for the launcher to convert).
    ``config``: the KV config whose merge shape a split launch takes. ``launched``: a list that
    gets the launch, its 13 pointer arguments and its split scratch's shape (for
    :class:`KVPlan`)."""
    d, hq, hk = q.shape[-1], q.shape[-2], k_cache.shape[-2]
    if softcap > 0:
        cap_in, cap_out = scale / softcap, softcap * LOG2E
    else:
        cap_in, cap_out = 0.0, 0.0
    if varlen:
        qst = (0, *q.stride()[:2])
        ost = (0, *out.stride()[:2])
        lst = (0, lse.stride(0)) if lse is not None else (0, 0)
    else:
        qst = q.stride()[:3]
        ost = out.stride()[:3]
        lst = lse.stride()[:2] if lse is not None else (0, 0)
    m_blocks = _cdiv(max_rows, tile.block_m)
    bd = configs.padded_head_dim(d)
    part = count = scratch = None
    tiles = m_blocks * batch * hk
    # The kernel addresses the partials with 32-bit offsets.
    num_splits = min(num_splits, (2**31 - 1) // (tiles * tile.block_m * (bd + 1)))
    if num_splits > 1:
        scratch = (num_splits, tiles, tile.block_m, tile.block_m * bd)
        part, count = _split_scratch(q.device, *scratch)
    noted = [] if launched is not None else None
    launch.recording(kv_fwd, noted)[(m_blocks, batch * hk, num_splits)](
        q, k_cache, v_cache, out, lse, part, count, cu_q, seqlens_k, k_start,
        block_table, batch_idx, slopes,
        *qst, *k_cache.stride()[:3], *v_cache.stride()[:3], *ost, *lst,
        block_table.stride(0) if block_table is not None else 0, *sa,
        seqlen_q, kv_rows, hk, hq // hk, scale * LOG2E, cap_in, cap_out, left or 0, right or 0,
        num_splits,
        HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n, PAGE_SIZE=k_cache.shape[1] if block_table is not None else 1,
        IS_VARLEN_Q=varlen, PAGED=block_table is not None, HAS_BATCH_IDX=batch_idx is not None,
        HAS_KSTART=k_start is not None, HAS_LEFT=left is not None, HAS_RIGHT=right is not None,
        HAS_SOFTCAP=softcap > 0, HAS_ALIBI=slopes is not None, SPLIT=part is not None,
        STORE_LSE=lse is not None, **config.merge(bd), **_launch_options(tile),
    )  # fmt: skip
    if noted:
        pointers = (q, k_cache, v_cache, out, lse, part, count, cu_q, seqlens_k, k_start,
                    block_table, batch_idx, slopes)  # fmt: skip
        launched.append((*noted[0], pointers, scratch))


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | int | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> KVCacheResult:
    """flash_attn.flash_attn_with_kvcache: q (B, Sq, Hq, D) against k_cache/v_cache
    (B_cache, S_cache, Hk, D), or (num_blocks, page_size, Hk, D) with ``block_table``
    (B, max_blocks) int32. With ``k``/``v`` (B, S_new, Hk, D) the caches are updated in place at
    ``cache_seqlens`` first (keys rotated when ``rotary_cos``/``rotary_sin`` are given). Returns
    out (B, Sq, Hq, D), and the LSE (B, Hq, Sq) with ``return_softmax_lse``. Forward only.

    A decoding loop calls this with the same kinds of arguments every step, so a call whose key
    (``attnforge_kernels.launch.plans.call_key``: each tensor's dtype, shape, strides, device and alignment, the
    values) an earlier call recorded skips that call's checks and choices and replays its launch
    (:class:`KVPlan`); the cache update and the lengths are computed from this call's tensors
    each time, as on the full path.
    """
    tensors = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
               cache_batch_idx, cache_leftpad, block_table)  # fmt: skip
    if not launch.ENABLED or alibi_slopes is not None:
        call = _decide(*tensors, softmax_scale, causal, window_size, softcap,
                       rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse)  # fmt: skip
        return _run(call, *tensors, alibi_slopes)
    given = isinstance(cache_seqlens, torch.Tensor)
    # A step on a contiguous cache: the native launch path (attnforge_kernels/launch/replay.py) replays it from
    # C++ where it has its plan (paged steps read the lengths on the host, to check them).
    native_ok = block_table is None and (given or cache_seqlens is None)
    native_args = (
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, softmax_scale, causal, window_size, softcap, rotary_interleaved,
        num_splits, return_softmax_lse,
    )  # fmt: skip
    if native_ok:
        res = native.kv(*native_args)
        if res is not None:
            return res
    values = (
        None if given else cache_seqlens, softmax_scale, causal, window_size, softcap,
        rotary_interleaved, num_splits, return_softmax_lse,
    )  # fmt: skip
    key, plan = launch.find(launch.KVCACHE, launch.call_key("kv", tensors, values))
    if plan is None:
        call = _decide(*tensors, softmax_scale, causal, window_size, softcap,
                       rotary_interleaved, None, num_splits, return_softmax_lse)  # fmt: skip
        launched = [] if key is not None else None
        res = _run(call, *tensors, None, None, launched)
        if launched is None:
            return res
        plan = KVPlan.of(call, launched)
        launch.KVCACHE.put(key, plan if plan is not None else False)
        if plan is None:
            return res
    else:
        res = _run(plan.call, *tensors, None, plan)
    if native_ok and plan.native is None:
        native.put_kv(plan, *native_args)
    return res


@dataclass(frozen=True)
class _KVCall:
    """What one call's checks and choices decided: everything its plan key fixes."""

    batch: int
    seqlen_q: int
    seqlen_cache: int
    seqlen_new: int
    paged: bool
    scale: float
    left: int | None
    right: int | None
    softcap: float
    local: bool  # queries move with the new keys (rotary)
    interleaved: bool
    update: bool  # a cache update launch: new keys, or rotary for q
    tile: Tile
    config: KVConfig  # the split merge's shape (``tile`` is the launch's tile)
    rows: int
    num_splits: int
    lse: bool


def _check_new_keys(q, k, v, cache_seqlens, batch: int, hk: int, d: int) -> None:
    """The keys and values a call appends: both or neither, with cache_seqlens, q's dtype and
    (batch, seqlen_new, hk, d)."""
    if k is None and v is None:
        return
    if k is None or v is None:
        raise ArgumentError("new keys need new values (pass both k and v, or neither)")
    if cache_seqlens is None:
        raise ArgumentError("appending k/v needs cache_seqlens (where each sequence ends)")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ArgumentTypeError("k and v must have q's dtype")
    if k.dim() != 4 or k.shape != v.shape or (k.shape[0], *k.shape[2:]) != (batch, hk, d):
        raise ArgumentError(f"k and v must be (batch={batch}, seqlen_new, {hk}, {d})")


def _check_rotary(rotary_cos, rotary_sin, k, d: int) -> None:
    """Rotary embedding's tables: both, with keys to rotate, (seqlen_ro, rotary_dim / 2)."""
    if rotary_cos is None and rotary_sin is None:
        return
    if rotary_cos is None or rotary_sin is None or k is None:
        raise ArgumentError("rotary embedding needs rotary_cos, rotary_sin and new k/v to append")
    rd = rotary_cos.shape[-1] * 2
    if rotary_cos.shape != rotary_sin.shape or rd > d or rd % 16:
        raise ArgumentError(
            f"rotary_cos/sin must be (seqlen_ro, rotary_dim / 2) with rotary_dim <= {d} and a "
            f"multiple of 16, got {tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}"
        )


def _decide(
    q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
    cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved,
    alibi_slopes, num_splits, return_softmax_lse,
) -> _KVCall:  # fmt: skip
    """Check a call's arguments (raising flash_attn's errors, before anything is written) and
    make its choices: tiles, splits, mask."""
    if q.dim() != 4:
        raise ArgumentError(
            f"q must be (batch, seqlen_q, heads, head_dim), got shape {tuple(q.shape)}"
        )
    d, hq, hk = _check_inputs(q, k_cache, v_cache)
    batch, seqlen_q = q.shape[0], q.shape[1]
    device = q.device
    paged = block_table is not None
    if paged:
        if cache_batch_idx is not None:
            raise ArgumentError("cache_batch_idx cannot be combined with block_table (paged KV)")
        if cache_leftpad is not None:
            raise ArgumentError("cache_leftpad cannot be combined with block_table (paged KV)")
        seqlen_cache = _block_table(block_table, batch, device).shape[1] * k_cache.shape[1]
    else:
        seqlen_cache = k_cache.shape[1]
        if cache_batch_idx is not None:
            _int32(cache_batch_idx, "cache_batch_idx", batch, device)
        elif k_cache.shape[0] < batch:
            raise ArgumentError(f"k_cache holds {k_cache.shape[0]} sequences, q has {batch}")
    if cache_leftpad is not None:
        _int32(cache_leftpad, "cache_leftpad", batch, device)
    _check_new_keys(q, k, v, cache_seqlens, batch, hk, d)
    seqlen_new = k.shape[1] if k is not None else 0
    if isinstance(cache_seqlens, int):
        if cache_seqlens + seqlen_new > seqlen_cache and not paged:  # paged: _run's check
            raise ArgumentError(
                f"cache_seqlens {cache_seqlens} + {seqlen_new} new keys is past the cache's "
                f"{seqlen_cache} rows"
            )
    elif cache_seqlens is not None:
        _int32(cache_seqlens, "cache_seqlens", batch, device)
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    if seqlen_q == 1 and alibi_slopes is None:
        causal = False  # one query row at the bottom sees every key anyway (flash_api.cpp)
    left, right, cap = _window(causal, window_size, softcap, seqlen_cache)
    _check_rotary(rotary_cos, rotary_sin, k, d)
    arguments.alibi_slopes(alibi_slopes, batch, hq, device)  # its shape error, before writing
    rows = seqlen_q * (hq // hk)
    family = configs.device_family(device)
    gbs = _memory_gbs(device)
    kc = call_config(family, d, gbs)
    decoding = rows <= kc.decode.block_m
    tile = kc.decode if decoding else kc.prefill
    work = batch * hk * _cdiv(rows, tile.block_m)
    sms = _num_sms(device)
    if num_splits is None or num_splits < 1:
        num_splits = auto_num_splits(work, sms, seqlen_cache, tile.block_n, family, gbs)
    num_splits = max(1, min(int(num_splits), 128, _cdiv(seqlen_cache, tile.block_n)))
    if decoding:
        tile = kc.decode_tile(num_splits, seqlen_cache, work * num_splits, sms)
    return _KVCall(
        batch, seqlen_q, seqlen_cache, seqlen_new, paged, scale, left, right, cap,
        left is not None or right is not None, bool(rotary_interleaved),
        k is not None and (seqlen_new > 0 or rotary_cos is not None), tile, kc, rows,
        num_splits, bool(return_softmax_lse),
    )  # fmt: skip


def _run(
    call: _KVCall, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
    cache_batch_idx, cache_leftpad, block_table, alibi_slopes, plan=None, launched=None,
):  # fmt: skip
    """The tensor work of a decided call: the lengths, the cache update, the launch (``plan``'s
    where given and this call's pointers are aligned as its recording's were)."""
    device, batch = q.device, call.batch
    if call.paged:
        block_table = _block_table(block_table, batch, device)
    elif cache_batch_idx is not None:
        cache_batch_idx = _int32(cache_batch_idx, "cache_batch_idx", batch, device)
    if cache_seqlens is None:
        cache_seqlens = _full_lengths(device, batch, call.seqlen_cache)
    elif isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    else:
        cache_seqlens = _int32(cache_seqlens, "cache_seqlens", batch, device)
    k_start = None
    if cache_leftpad is not None:
        k_start = _int32(cache_leftpad, "cache_leftpad", batch, device)
    if call.paged:
        # flash_attn checks this too: keys past the block table would be read from nowhere.
        longest = int(cache_seqlens.max().item()) + call.seqlen_new
        if longest > call.seqlen_cache:
            raise ArgumentError(
                f"cache_seqlens + new keys reach {longest} rows, past the {call.seqlen_cache} "
                "that block_table addresses; give block_table more columns"
            )
    if q.stride(-1) != 1:
        q = q.contiguous()
    if call.update:
        # One launch writes the new keys (rotated) and values into the cache, the rotated
        # queries and the lengths the attention reads.
        pointers = _append_pointers(q, k, v, k_cache, v_cache, cache_seqlens, k_start,
                                    block_table, cache_batch_idx, rotary_cos, rotary_sin)  # fmt: skip
        if plan is None or not plan.replay_append(pointers):
            _launch_append(call, pointers, launched)
        q = pointers[5] if pointers[5] is not None else q
        seqlens_k = pointers[7]
    else:
        # A decoding step without new keys reads the lengths as given (no extra GPU launch).
        seqlens_k = cache_seqlens if k_start is None else (cache_seqlens - k_start)
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    lse = None
    if call.lse:
        lse = torch.empty((batch, q.shape[2], call.seqlen_q), dtype=torch.float32, device=device)
    if plan is None or not plan.replay(q, k_cache, v_cache, out, lse, seqlens_k, k_start,
                                       block_table, cache_batch_idx):  # fmt: skip
        slopes, sa_b, sa_h = arguments.alibi_slopes(alibi_slopes, batch, q.shape[2], device)
        _launch(
            q, k_cache, v_cache, out, lse, tile=call.tile, config=call.config, cu_q=None,
            seqlens_k=seqlens_k, k_start=k_start, block_table=block_table,
            batch_idx=cache_batch_idx, slopes=slopes, sa=(sa_b, sa_h), batch=batch,
            seqlen_q=call.seqlen_q, max_rows=call.rows, kv_rows=call.seqlen_cache,
            scale=call.scale, left=call.left, right=call.right, softcap=call.softcap,
            num_splits=call.num_splits, varlen=False, launched=launched,
        )  # fmt: skip
    return (out, lse) if call.lse else out


def _append_pointers(
    q, k, v, k_cache, v_cache, cache_seqlens, k_start, block_table, batch_idx, cos, sin
) -> tuple:
    """``kv_append``'s 13 pointer arguments (None where unused): new keys, values and rotary
    tables with a unit-stride last dimension, and the fresh rotated queries and lengths."""
    k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
    q_out = None
    if cos is not None:
        cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (cos, sin))
        q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lengths = torch.empty((q.shape[0],), dtype=torch.int32, device=q.device)
    return (q, k, v, k_cache, v_cache, q_out, cache_seqlens, lengths, k_start, block_table,
            batch_idx, cos, sin)  # fmt: skip


def _launch_append(call: _KVCall, pointers: tuple, launched: list | None) -> None:
    """Launch ``kv_append`` on ``pointers`` (:func:`_append_pointers`); ``launched`` gets it
    as ``_launch`` notes its launch."""
    q, k, v, k_cache, v_cache, q_out, _, _, _, block_table, batch_idx, cos, sin = pointers
    batch, s_new, hk, d = k.shape
    hq = q.shape[2]
    rotary = cos is not None
    tokens = s_new + (call.seqlen_q if rotary else 0)
    bd = configs.padded_head_dim(d)
    rot_half = cos.shape[1] if rotary else 0
    noted = [] if launched is not None else None
    launch.recording(kv_append, noted)[(batch * tokens, max(hk, hq) if rotary else hk)](
        *pointers,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *k_cache.stride()[:3],
        *v_cache.stride()[:3], *(q_out.stride()[:3] if rotary else (0, 0, 0)),
        block_table.stride(0) if block_table is not None else 0,
        cos.stride(0) if rotary else 0, sin.stride(0) if rotary else 0,
        s_new, call.seqlen_q, hk, hq, call.seqlen_cache, cos.shape[0] if rotary else 0,
        HEAD_DIM=d, BLOCK_D=bd, ROT_HALF=rot_half,
        BLOCK_R=triton.next_power_of_2(rot_half) if rotary else 1,
        INTERLEAVED=call.interleaved, LOCAL=call.local,
        PAGE_SIZE=k_cache.shape[1] if block_table is not None else 1,
        PAGED=block_table is not None, HAS_BATCH_IDX=batch_idx is not None,
        HAS_KSTART=pointers[8] is not None, **APPEND_TILE.launch_options(configs.is_hip()),
    )  # fmt: skip
    if noted:
        launched.append((*noted[0], pointers, None))


class KVPlan:
    """A call's decisions and recorded launches (``attnforge_kernels.launch.plans``): the cache update's, where
    the call has one, and the attention's. A replay takes the split scratch of its own stream,
    and each launch's 13 pointer arguments (in the kernel's order; unused ones None) must be
    16-byte aligned as the recording's were (Triton specialises on it); else that launch runs
    the full way."""

    __slots__ = ("call", "launch", "scratch", "aligns", "append", "append_aligns", "native")
    replays = 0  # replays made in this process (attnforge_kernels.check reports them)

    def __init__(self, call: _KVCall, rec, scratch, aligns: tuple, append=None, append_aligns=()):
        self.call, self.launch, self.scratch, self.aligns = call, rec, scratch, aligns
        # The cache update's launch (kv_append) of a step with new keys, else None.
        self.append, self.append_aligns = append, append_aligns
        # Handed over to attnforge_kernels/launch/replay.py: True, False where it cannot be, None
        # before.
        self.native = None

    @classmethod
    def of(cls, call: _KVCall, launched: list):
        """The plan of a call's noted launches (the cache update's, where it had new keys, then
        the attention's), or None where they cannot be replayed."""
        if len(launched) != (2 if call.update else 1):
            return None
        recs = [launch.record(*x[:5], x[5]) for x in launched]
        if None in recs:
            return None
        fn, grid, args, kwargs, kernel, pointers, scratch = launched[-1]
        if len(recs) == 1:
            return cls(call, recs[0], scratch, _aligns(pointers))
        return cls(call, recs[1], scratch, _aligns(pointers), recs[0], _aligns(launched[0][5]))

    def replay_append(self, pointers: tuple) -> bool:
        if self.append is None or _aligns(pointers) != self.append_aligns:
            return False
        self.append(_stream_of(pointers[0].device), pointers)
        return True

    def replay(self, q, k_cache, v_cache, out, lse, seqlens_k, k_start, block_table, batch_idx):
        part = count = None
        if self.scratch is not None:
            part, count = _split_scratch(q.device, *self.scratch)
        pointers = (q, k_cache, v_cache, out, lse, part, count, None, seqlens_k, k_start,
                    block_table, batch_idx, None)  # fmt: skip
        if _aligns(pointers) != self.aligns:
            return False
        self.launch(_stream_of(q.device), pointers)
        KVPlan.replays += 1
        return True


def _aligns(tensors) -> tuple:
    return tuple(-1 if t is None else t.data_ptr() % 16 for t in tensors)


def _block_table(block_table, batch: int, device):
    bt = torch.as_tensor(block_table, device=device)
    if bt.dim() != 2 or bt.shape[0] != batch or bt.dtype not in (torch.int32, torch.int64):
        raise ArgumentError(f"block_table must be an int32 tensor of shape ({batch}, max_blocks)")
    bt = bt.to(torch.int32)
    return bt if bt.stride(-1) == 1 else bt.contiguous()


@torch.no_grad()
def paged_varlen_forward(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *,
    softmax_scale: float | None = None, causal: bool = False,
    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None, return_attn_probs: bool = False,
    block_table: torch.Tensor,
) -> AttnResult:  # fmt: skip
    """``flash_attn_varlen_func(..., block_table=...)``: varlen queries (total_q, Hq, D) against a
    paged cache (num_blocks, page_size, Hk, D); sequence b's keys are its first
    ``cu_seqlens_k[b+1] - cu_seqlens_k[b]`` cache rows through ``block_table[b]``. Forward only:
    the result carries no gradient. Returns out, or (out, lse (Hq, total_q), None)."""
    if q.dim() != 3:
        raise ArgumentError(f"q must be (total_q, heads, head_dim), got shape {tuple(q.shape)}")
    d, hq, hk = _check_inputs(q, k_cache, v_cache)
    device = q.device
    cu_q = cu_seqlens_q.to(device=device, dtype=torch.int32).contiguous()
    cu_k = cu_seqlens_k.to(device=device, dtype=torch.int32)
    batch = cu_q.numel() - 1
    block_table = _block_table(block_table, batch, device)
    seqlen_cache = block_table.shape[1] * k_cache.shape[1]
    if int(max_seqlen_k) > seqlen_cache:
        raise ArgumentError(
            f"max_seqlen_k {int(max_seqlen_k)} is past the {seqlen_cache} rows that block_table "
            "addresses; give block_table more columns"
        )
    seqlens_k = (cu_k[1:] - cu_k[:-1]).contiguous()
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    left, right, cap = _window(causal, window_size, softcap, seqlen_cache)
    if q.stride(-1) != 1:
        q = q.contiguous()
    slopes, sa_b, sa_h = arguments.alibi_slopes(alibi_slopes, batch, hq, device)
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    lse = None
    if return_attn_probs:
        lse = torch.empty((hq, q.shape[0]), dtype=torch.float32, device=device)
    kc = call_config(configs.device_family(device), d, _memory_gbs(device))
    max_rows = int(max_seqlen_q) * (hq // hk)
    _launch(
        q, k_cache, v_cache, out, lse, cu_q=cu_q, seqlens_k=seqlens_k, k_start=None,
        tile=kc.decode if max_rows <= kc.decode.block_m else kc.prefill, config=kc,
        block_table=block_table, batch_idx=None, slopes=slopes, sa=(sa_b, sa_h), batch=batch,
        seqlen_q=int(max_seqlen_q), max_rows=max_rows,
        kv_rows=seqlen_cache, scale=scale,
        left=left, right=right, softcap=cap, num_splits=1, varlen=True,
    )  # fmt: skip
    return (out, lse, None) if return_attn_probs else out
