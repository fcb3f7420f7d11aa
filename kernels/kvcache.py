"""Attention against a KV cache: ``flash_attn_with_kvcache`` and paged-KV prefill, forward only.

flash_attn's semantics (Dao-AILab/flash-attention, flash_attn/flash_attn_interface.py
``flash_attn_with_kvcache`` and csrc/flash_attn/flash_api.cpp ``mha_fwd_kvcache``, read
2026-11-24): new keys/values are written into the cache in place at ``cache_seqlens`` (after
rotary embedding of the keys), then the queries attend to the first ``cache_seqlens + seqlen_new``
cache rows; causal masks and windows are aligned bottom-right on that length; ``cache_leftpad``
drops the first rows of a sequence; ``block_table`` maps a sequence's pages to cache blocks.

The kernel (``_kv_fwd``) packs the query heads of one KV head's GQA group into the rows of a tile
(row ``r`` is query position ``r // group`` of head ``hk * group + r % group``), so a decoding step
(seqlen_q = 1) still fills 16-row matrix tiles, and reads K/V either from a contiguous cache row
or, paged, through the block table one key row at a time (any page size). Split-KV: with
``num_splits > 1`` each program handles one slice of the keys and writes an fp32 partial output
and its LSE; the last program of a tile to finish (an atomic counter) merges the slices in the
same launch. ``num_splits=0`` picks the count so that short batches of decoding still fill the
GPU: from a table measured per family (``DECODE_SPLIT_WAVES``), else with flash_attn's heuristic
(``num_splits_heuristic`` in flash_api.cpp).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from . import _native as native
from . import arguments, configs, launch
from ._compat import patch_interpreter
from .arguments import AttnResult, KVCacheResult
from .configs import Tile
from .errors import ArgumentError, ArgumentTypeError
from .flash import _LN2, _LOG2E, LOG2E, _dot, _mm, _scores

__all__ = [
    "flash_attn_with_kvcache",
    "paged_varlen_forward",
    "apply_rotary",
    "num_splits_heuristic",
    "auto_num_splits",
]

patch_interpreter()

# fmt: off


@triton.jit(do_not_specialize=["seqlen_q", "kv_rows", "left", "right", "num_splits"])
def _kv_fwd(
    Q, K, V, Out, LSE, Part, Count, CuQ, SeqlensK, KStart, BlockTable, BatchIdx, Slopes,
    sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, so_b, so_s, so_h, sl_b, sl_h,
    sbt_b, sa_b, sa_h, seqlen_q, kv_rows, num_heads_k, group, qk_scale, cap_in, cap_out, left, right, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr, IS_VARLEN_Q: tl.constexpr, PAGED: tl.constexpr,
    HAS_BATCH_IDX: tl.constexpr, HAS_KSTART: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    SPLIT: tl.constexpr, STORE_LSE: tl.constexpr, MERGE_D: tl.constexpr,
):
    """One program per (row block of a GQA group, batch, kv head, key split). Split, the last
    program of a (row block, batch, kv head) to finish merges every split's partial."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    split = tl.program_id(2)
    b = pid_bh // num_heads_k
    hk = pid_bh % num_heads_k
    if IS_VARLEN_Q:
        q_start = tl.load(CuQ + b)
        seqlen_q = tl.load(CuQ + b + 1) - q_start
    else:
        q_start = pid_bh * 0
    n_rows = seqlen_q * group
    m0 = pid_m * BLOCK_M
    if m0 >= n_rows:  # only varlen grids (never split) have such programs
        return
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    b64 = b.to(tl.int64)
    seqlen_k = tl.load(SeqlensK + b)  # keys after the left padding
    if HAS_KSTART:
        k_start = tl.load(KStart + b)
    else:
        k_start = 0
    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    qi = rows // group  # query position
    h = hk * group + (rows - qi * group)  # query head
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    q_rows = b64 * sq_b + (q_start + qi).to(tl.int64) * sq_s + h * sq_h
    if EVEN_D:
        q_mask = row_ok[:, None]
    else:
        q_mask = row_ok[:, None] & d_ok
    q = tl.load(Q + q_rows[:, None] + offs_d[None, :], mask=q_mask, other=0.0)
    if HAS_ALIBI:
        alibi2 = tl.load(Slopes + b * sa_b + h * sa_h, mask=row_ok, other=0.0) * _LOG2E
        alibi2 = alibi2[:, None]
    else:
        alibi2 = 0.0
    diag = seqlen_k - seqlen_q
    # This split's keys, whole BLOCK_N tiles, narrowed to what the block's rows can see.
    if SPLIT:
        chunk = tl.cdiv(tl.cdiv(seqlen_k, num_splits), BLOCK_N) * BLOCK_N
        lo = split * chunk
        hi = tl.minimum(lo + chunk, seqlen_k)
    else:
        lo = 0
        hi = seqlen_k
    qi_lo = m0 // group
    qi_hi = (tl.minimum(m0 + BLOCK_M, n_rows) - 1) // group
    if HAS_RIGHT:
        hi = tl.minimum(hi, qi_hi + diag + right + 1)
    if HAS_LEFT:
        lo = tl.maximum(lo, (tl.maximum(qi_lo + diag - left, 0) // BLOCK_N) * BLOCK_N)
    if PAGED:
        bt_row = BlockTable + b64 * sbt_b
        k_base = K + hk * sk_h
        v_base = V + hk * sv_h
    else:
        if HAS_BATCH_IDX:
            cb = tl.load(BatchIdx + b).to(tl.int64)
        else:
            cb = b64
        k_base = K + cb * sk_b + hk * sk_h
        v_base = V + cb * sv_b + hk * sv_h
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    offs_n0 = tl.arange(0, BLOCK_N)
    for n0 in tl.range(lo, hi, BLOCK_N):
        offs_n = n0 + offs_n0
        pos = offs_n + k_start  # row of the sequence in the cache
        # Rows past what the cache (or block table) holds are never read, whatever the lengths.
        key_ok = (offs_n < seqlen_k) & (pos < kv_rows)
        if PAGED:
            blk = tl.load(bt_row + pos // PAGE_SIZE, mask=key_ok, other=0).to(tl.int64)
            in_page = pos % PAGE_SIZE
            k_rows = blk * sk_b + in_page * sk_s
            v_rows = blk * sv_b + in_page * sv_s
        else:
            k_rows = pos * sk_s
            v_rows = pos * sv_s
        if EVEN_D:
            kv_mask = key_ok[:, None]
        else:
            kv_mask = key_ok[:, None] & d_ok
        k = tl.load(k_base + k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        qk = _mm(q, tl.trans(k))
        rel = offs_n[None, :] - qi[:, None] - diag
        s = _scores(qk, rel, key_ok[None, :], qk_scale, cap_in, cap_out, alibi2, left, right,
                    HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT, True)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no inf - inf on empty rows
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        acc = acc * alpha[:, None]
        v = tl.load(v_base + v_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = _dot(p.to(v.dtype), v, acc)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse_ln = (m_i + tl.log2(l_safe)) * _LN2
    if EVEN_D:
        o_mask = row_ok[:, None]
    else:
        o_mask = row_ok[:, None] & d_ok
    o_rows = b64 * so_b + (q_start + qi).to(tl.int64) * so_s + h * so_h
    if SPLIT:
        # Partial result of this slice (an empty slice has LSE -inf and weighs nothing), as
        # the tile's rows: split s of tile t at Part[s][t] (BLOCK_M x BLOCK_D), its LSEs after
        # all of those. One buffer, 32-bit offsets (the host keeps it under 2**31 values) and
        # no strides: AMD's scalar registers run out first in the merge below (a buffer
        # resource is 4 SGPRs a base pointer).
        n_tiles = tl.num_programs(0) * tl.num_programs(1)
        tile = pid_bh * tl.num_programs(0) + pid_m
        o_step = n_tiles * (BLOCK_M * BLOCK_D)
        l_step = n_tiles * BLOCK_M
        t_rows = tl.arange(0, BLOCK_M)
        o_offs = t_rows[:, None] * BLOCK_D + offs_d[None, :]
        o_at = tile * (BLOCK_M * BLOCK_D)
        l_at = num_splits * o_step + tile * BLOCK_M  # the LSE partials follow the outputs
        tl.store(Part + (o_at + split * o_step) + o_offs, out, mask=o_mask)
        tl.store(Part + (l_at + split * l_step) + t_rows, tl.where(empty, float("-inf"), lse_ln),
                 mask=row_ok)
        # One launch instead of a second, combine kernel ("split-K with a semaphore"): every
        # thread's stores come before the barrier, the barrier before one acquire-release
        # increment of this row block's counter; the program that counts last sees every
        # partial, merges them with LSE weights, and resets the counter for the next call.
        tl.debug_barrier()
        count = Count + tile
        if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
            tl.store(count, 0)
            # MERGE_D columns at a time (the merge's tiles stay small beside the main loop's),
            # one pass with a running maximum; each split's loads are issued one split ahead
            # of their use, so the L2 round trips overlap instead of adding up.
            for d0 in range(0, BLOCK_D, MERGE_D):
                offs_m = d0 + tl.arange(0, MERGE_D)
                m_offs = t_rows[:, None] * BLOCK_D + offs_m[None, :]
                m_mask = row_ok[:, None] & (offs_m[None, :] < HEAD_DIM)
                o_at_s = o_at
                l_at_s = l_at
                m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
                macc = tl.zeros([BLOCK_M, MERGE_D], dtype=tl.float32)
                total = tl.zeros([BLOCK_M], dtype=tl.float32)
                lse_n = tl.load(Part + l_at_s + t_rows, mask=row_ok, other=float("-inf"))
                o_n = tl.load(Part + o_at_s + m_offs, mask=m_mask, other=0.0)
                for s in range(1, num_splits + 1):
                    lse_s = lse_n
                    o_s = o_n
                    more = t_rows < (num_splits - s) * BLOCK_M  # all rows while splits remain
                    l_at_s += l_step
                    o_at_s += o_step
                    lse_n = tl.load(Part + l_at_s + t_rows, mask=row_ok & more,
                                    other=float("-inf"))
                    o_n = tl.load(Part + o_at_s + m_offs, mask=m_mask & more[:, None], other=0.0)
                    m_new = tl.maximum(m, lse_s)
                    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                    alpha = tl.exp2((m - m_use) * _LOG2E)
                    w = tl.exp2((lse_s - m_use) * _LOG2E)
                    macc = macc * alpha[:, None] + w[:, None] * o_s
                    total = total * alpha + w
                    m = m_new
                m_use = tl.where(m == float("-inf"), 0.0, m)
                none = total == 0.0
                t_safe = tl.where(none, 1.0, total)
                tl.store(Out + o_rows[:, None] + offs_m[None, :],
                         (macc / t_safe[:, None]).to(Out.dtype.element_ty), mask=m_mask)
                if STORE_LSE:
                    lse = tl.where(none, float("inf"), m_use + tl.log(t_safe))
                    tl.store(LSE + b64 * sl_b + h * sl_h + q_start + qi, lse,
                             mask=row_ok & (d0 == 0))
    else:
        tl.store(Out + o_rows[:, None] + offs_d[None, :], out.to(Out.dtype.element_ty),
                 mask=o_mask)
        if STORE_LSE:
            lse = tl.where(empty, float("inf"), lse_ln)
            tl.store(LSE + b64 * sl_b + h * sl_h + q_start + qi, lse, mask=row_ok)


# fmt: on


# --------------------------------------------------------------------------------------------
# configs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVConfig:
    """Tiles of the cache kernel: ``decode`` when a GQA group's rows (seqlen_q x group) fit 16
    rows, ``prefill`` otherwise; ``merge_d``: head-dim columns the last split merges at a time
    (0: all at once)."""

    decode: Tile
    prefill: Tile
    merge_d: int = 0
    # The decode tile of a split launch whose splits each read at least ``long_keys`` keys
    # (None: ``decode`` throughout).
    decode_long: Tile | None = None
    long_keys: int = 0

    def merge_columns(self, padded_head_dim: int) -> int:
        return min(self.merge_d or padded_head_dim, padded_head_dim)

    def decode_tile(self, num_splits: int, seqlen_cache: int) -> Tile:
        """The decode tile of a launch of ``num_splits`` splits over ``seqlen_cache`` keys."""
        if self.decode_long is not None and num_splits > 1:
            if seqlen_cache // num_splits >= self.long_keys:
                return self.decode_long
        return self.decode


@functools.lru_cache(maxsize=256)
def kv_config(family: str, head_dim: int) -> KVConfig:
    """Default tiles per family and (padded) head dim; docs/kernels.md has the AOT figures."""
    d = configs.padded_head_dim(head_dim)
    kc = _kv_config(family, d)
    if family == "interpreter":
        return kc
    newer = configs.newer_triton_tiles(family, d)
    if "kv_prefill" in newer:
        kc = replace(kc, prefill=newer["kv_prefill"])
    decode = DECODE_ON_NEWER_TRITON.get((configs.triton_release(), family, d))
    return replace(kc, decode=decode) if decode is not None else kc


# Decode tiles where a newer Triton line (recipes/tritons.yaml) compiles the split decode with
# the merge in the last split to more registers than the two-launch kernel it replaced: each row
# keeps that line's spills at 0 and its occupancy at the old kernel's or above (kernels.aot,
# 2026-11-26; the old kernel's waves in the comments).
DECODE_ON_NEWER_TRITON = {
    ((3, 7), "cdna4", 64): Tile(16, 32, 4, 1, 2),  # gfx950: 8 waves (7; 16x64: 6)
    ((3, 8), "cdna4", 64): Tile(16, 32, 4, 1, 2),  # gfx950: 7 waves (7; 16x64: 6)
    ((3, 8), "cdna3", 64): Tile(16, 64, 4, 1, 2),  # gfx942: 4 waves (4; wpe5 spills 54)
    ((3, 8), "cdna2", 64): Tile(16, 64, 4, 1, 2),  # gfx90a: 4 waves (4; wpe5 spills 5)
    ((3, 8), "cdna2", 128): Tile(16, 64, 4, 1, 3),  # gfx90a: 3 waves (3; wpe2: 2)
    ((3, 9), "cdna3", 128): Tile(16, 64, 4, 1, 3),  # gfx942: 3 waves (3; wpe2: 2)
    ((3, 9), "rdna4", 64): Tile(16, 64, 4, 1, 8),  # gfx1201: 9 waves (8; wpe2: 7)
    ((3, 9), "rdna4", 128): Tile(16, 16, 4, 1, 2),  # gfx1201: 10 waves (9; 16x32: 8)
}


def _kv_config(family: str, d: int) -> KVConfig:
    if family == "interpreter":
        t = Tile(16, 16, 1, 1)
        return KVConfig(t, t, merge_d=16)  # several merge chunks in the CPU tests
    # AMD: the split merge 64 columns at a time; whole 16 x 256 fp32 tiles (three live) cost
    # gfx1150 spills and gfx942/gfx1201 a wave of occupancy at d=256 (kernels.aot).
    if family in ("rdna3", "rdna3.5", "rdna4"):
        # d=128 decoding with 64-key tiles spills 93 VGPRs on gfx1151; 32-key tiles do not.
        if d <= 64:
            return KVConfig(Tile(16, 64, 4, 1, 2), Tile(64, 32, 4, 1, 2), 64)
        if d <= 128:
            return KVConfig(Tile(16, 32, 4, 1, 2), Tile(64, 32, 4, 1, 2), 64)
        return KVConfig(Tile(16, 16, 4, 1, 1), Tile(16, 16, 4, 1, 1), 64)
    if family in ("cdna2", "cdna3", "cdna4"):
        if d <= 64:
            # waves_per_eu 5 keeps gfx942's split decode at 94 VGPRs (5 waves; 99 and 4 without)
            return KVConfig(Tile(16, 64, 4, 1, 5), Tile(128, 32, 4, 1, 2), 64)
        if d <= 128:
            return KVConfig(Tile(16, 64, 4, 1, 2), Tile(128, 32, 4, 1, 2), 64)
        return KVConfig(Tile(16, 32, 4, 1, 1), Tile(64, 16, 4, 1, 1), 64)
    if family == "hopper":
        if d == 128:
            # Splits of 4096 keys or more (batch 1 with 64k-128k keys) read faster with 64-key
            # tiles: 108.7 / 193.1 against 109.7 / 195.7 us at 16 splits (docs/benchmarks.md,
            # "Decoding at batch 1 with long caches"); shorter splits keep 128 (4k: 18.9 / 19.6).
            return KVConfig(Tile(16, 128, 4, 3), Tile(128, 64, 8, 3),
                            decode_long=Tile(16, 64, 4, 3), long_keys=4096)  # fmt: skip
        if d <= 128:
            return KVConfig(Tile(16, 128, 4, 3), Tile(128, 64, 8, 3))
        return KVConfig(Tile(16, 64, 4, 2), Tile(64, 64, 8, 2), 64)
    if d <= 128:  # ampere and other NVIDIA; 4-warp 64x64 prefill spills 32 bytes at d=128
        return KVConfig(Tile(16, 128, 4, 2), Tile(64, 64, 8, 2))
    # d=256: whole-row merging spills 4 bytes on sm80; 64 columns at a time does not.
    return KVConfig(Tile(16, 64, 4, 2), Tile(64, 32, 8, 2), 64)


@functools.lru_cache(maxsize=1024)
def num_splits_heuristic(
    work_blocks: int, num_sms: int, num_key_blocks: int, max_splits: int = 128
) -> int:
    """flash_attn's ``num_splits_heuristic`` (csrc/flash_attn/flash_api.cpp): the fewest splits
    that reach 85% of the best wave efficiency, 1 when the grid nearly fills the GPU already."""
    if work_blocks >= 0.8 * num_sms:
        return 1
    max_splits = min(max_splits, num_sms, num_key_blocks)
    eff = {}
    for n in range(1, max_splits + 1):
        # A split count with the same keys per split as n - 1 is that count in disguise.
        if n > 1 and -(-num_key_blocks // n) == -(-num_key_blocks // (n - 1)):
            continue
        waves = work_blocks * n / num_sms
        eff[n] = waves / math.ceil(waves)
    best = max(eff.values(), default=0.0)
    for n in sorted(eff):
        if eff[n] >= 0.85 * best:
            return n
    return 1


# Keys a split reads at least when the count is picked for the caller: the last split merges
# every split's partial in turn (about 0.5 µs a split on an H100), so a split should carry
# several times that in reads. On an H100 (docs/benchmarks.md, issue 30 decode), batch 1 with
# 4096 keys: 16 splits of 256 keys 21.8 µs, 8 of 512 18.3 µs, 4 of 1024 19.7 µs.
MIN_SPLIT_KEYS = 512


# Split counts measured per family, for ``num_splits=0``: ((cache keys up to, waves), ...), the
# first row whose bound holds gives the programs a decoding step aims for, ``waves`` x the GPU's
# SMs / CUs (rounded down to whole splits of every (row block, batch, KV head) tile), and the
# last row's bound is None. Families not listed take flash_attn's heuristic.
# Hopper, from two sweeps of 4-64 splits on an H100 (docs/benchmarks.md, "Decoding at batch 1
# with long caches"): batch 1 (8 tiles) runs fastest with 8 splits up to 16k keys (4k: 18.9 us
# against 22.1 at 16; 16k: 41.3 against 43.8 at 16 and 44.4 at flash_attn's 15) and with 16, one
# full wave, at 64k-128k (109.7 / 195.7 against 111.9 / 201.6 at flash_attn's 14, whose
# unfilled SMs stay idle; 24 or 33 splits cost 5-10 us more); batch 8 (64 tiles) with 1 split
# up to 16k keys (60.4 / 188.1 against 61.6 / 189.4 at 2). AMD: untimed, flash_attn's heuristic
# as before; an AMD runner would time ``kernels.bench --decode --splits`` and add its row here.
DECODE_SPLIT_WAVES: dict[str, tuple[tuple[int | None, float], ...]] = {
    "hopper": ((16384, 0.5), (None, 1.0)),
}


@functools.lru_cache(maxsize=1024)
def auto_num_splits(
    work_blocks: int, num_sms: int, seqlen_cache: int, block_n: int, family: str = ""
) -> int:
    """Splits for ``num_splits=0``: the family's row of ``DECODE_SPLIT_WAVES``, else flash_attn's
    heuristic over the cache's key tiles; at most one split per ``MIN_SPLIT_KEYS`` keys."""
    table = DECODE_SPLIT_WAVES.get(family)
    if table is None:
        n = num_splits_heuristic(work_blocks, num_sms, -(-seqlen_cache // block_n))
    elif work_blocks >= 0.8 * num_sms:
        n = 1  # the grid nearly fills the GPU already (as flash_attn's heuristic)
    else:
        waves = next(w for bound, w in table if bound is None or seqlen_cache <= bound)
        n = int(num_sms * waves) // work_blocks
    return max(1, min(n, seqlen_cache // MIN_SPLIT_KEYS))


def _num_sms(device) -> int:
    if configs.INTERPRET or device.type != "cuda":
        return 1
    return configs.compute_units(device)  # cached per device: decoding asks on every step


# --------------------------------------------------------------------------------------------
# rotary, append
# --------------------------------------------------------------------------------------------


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    interleaved: bool,
) -> torch.Tensor:
    """flash_attn's rotary embedding (flash_attn/layers/rotary.py, ops/triton/rotary.py) of the
    first ``2 * cos.shape[1]`` dims of ``x`` (b, s, h, d) at ``positions`` (b, s).

    Computed in fp32 and cast back, like flash_attn's Triton kernel; positions at or past
    ``cos.shape[0]`` are left unrotated (that kernel loads cos = 1, sin = 0 there).
    """
    rd = cos.shape[1] * 2
    inside = positions < cos.shape[0]
    idx = positions.clamp(max=cos.shape[0] - 1).long()
    c = torch.where(inside[..., None], cos[idx].float(), 1.0)[:, :, None, :]  # (b, s, 1, rd/2)
    s = torch.where(inside[..., None], sin[idx].float(), 0.0)[:, :, None, :]
    xr = x[..., :rd].float()
    if interleaved:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
        rot = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    else:
        x0, x1 = xr[..., : rd // 2], xr[..., rd // 2 :]
        rot = torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    return torch.cat((rot.to(x.dtype), x[..., rd:]), dim=-1)


def _append(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table):
    """Write k/v (b, s_new, hk, d) into the caches at rows cache_seqlens[b] + t, in place.

    Indexing is per dimension, so a write past a sequence's cache (or its block table) raises
    an index error instead of landing in another sequence.
    """
    b, s_new = k.shape[0], k.shape[1]
    pos = cache_seqlens.long()[:, None] + torch.arange(s_new, device=k.device)[None, :]
    if block_table is not None:
        page = k_cache.shape[1]
        rows = torch.arange(b, device=k.device)[:, None].expand(b, s_new)
        blocks = block_table.long()[rows, pos // page]
        k_cache[blocks, pos % page] = k
        v_cache[blocks, pos % page] = v
    else:
        bidx = torch.arange(b, device=k.device) if cache_batch_idx is None else cache_batch_idx
        rows = bidx.long()[:, None].expand(b, s_new)
        k_cache[rows, pos] = k
        v_cache[rows, pos] = v


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
    q, k_cache, v_cache, out, lse, *, tile, merge_d, cu_q, seqlens_k, k_start, block_table, batch_idx,
    slopes, sa, batch, seqlen_q, max_rows, kv_rows, scale, left, right, softcap, num_splits,
    varlen, launched: list | None = None,
):  # fmt: skip
    """Run the cache kernel into ``out`` (and ``lse`` unless it is None): one launch, split or
    not. Pointers a launch does not use go as None (nothing for the launcher to convert).
    ``launched``: a list that gets the launch, its 13 pointer arguments and its split scratch's
    shape (for :class:`_KVPlan`)."""
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
    launch.recording(_kv_fwd, noted)[(m_blocks, batch * hk, num_splits)](
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
        STORE_LSE=lse is not None, MERGE_D=min(merge_d or bd, bd), **_launch_options(tile),
    )  # fmt: skip
    if noted:
        pointers = (q, k_cache, v_cache, out, lse, part, count, cu_q, seqlens_k, k_start,
                    block_table, batch_idx, slopes)  # fmt: skip
        launched.append((*noted[0], pointers, scratch))


@torch.no_grad()
def _update_cache(
    q, k, v, k_cache, v_cache, cache_seqlens, cache_batch_idx, block_table, rotary_cos,
    rotary_sin, interleaved: bool, local: bool,
):  # fmt: skip
    """Rotate the new keys (and q) if rotary tables are given, write k/v into the caches; the
    (rotated) q. No autograd: the caches are written in place, as flash_attn's kernel does."""
    if rotary_cos is not None:
        start = cache_seqlens.long()[:, None]
        k_pos = start + torch.arange(k.shape[1], device=q.device)
        q_pos = start + torch.arange(q.shape[1], device=q.device) * int(local)
        k = apply_rotary(k, rotary_cos, rotary_sin, k_pos, interleaved)
        q = apply_rotary(q, rotary_cos, rotary_sin, q_pos, interleaved)
    _append(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table)
    return q


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
    (``kernels.launch.call_key``: each tensor's dtype, shape, strides, device and alignment, the
    values) an earlier call recorded skips that call's checks and choices and replays its launch
    (:class:`_KVPlan`); the cache update and the lengths are computed from this call's tensors
    each time, as on the full path.
    """
    tensors = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
               cache_batch_idx, cache_leftpad, block_table)  # fmt: skip
    if not launch.ENABLED or alibi_slopes is not None:
        call = _decide(*tensors, softmax_scale, causal, window_size, softcap,
                       rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse)  # fmt: skip
        return _run(call, *tensors, alibi_slopes)
    given = isinstance(cache_seqlens, torch.Tensor)
    # A step that reads the cache as it is passes the kernel the call's own tensors: the native
    # launch path (kernels/_native.py) replays it from C++ where it has its plan.
    reads = (
        k is None and v is None and rotary_cos is None and rotary_sin is None
        and cache_leftpad is None and block_table is None and (given or cache_seqlens is None)
    )  # fmt: skip
    native_args = (q, k_cache, v_cache, cache_seqlens, cache_batch_idx, softmax_scale, causal,
                   window_size, softcap, num_splits, return_softmax_lse)  # fmt: skip
    if reads:
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
        plan = _KVPlan.of(call, launched) if len(launched) == 1 else None
        launch.KVCACHE.put(key, plan if plan is not None else False)
        if plan is None:
            return res
    else:
        res = _run(plan.call, *tensors, None, plan)
    if reads and plan.native is None:
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
    tile: Tile
    merge_d: int
    rows: int
    num_splits: int
    lse: bool


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
    if k is not None or v is not None:
        if k is None or v is None:
            raise ArgumentError("new keys need new values (pass both k and v, or neither)")
        if cache_seqlens is None:
            raise ArgumentError("appending k/v needs cache_seqlens (where each sequence ends)")
        if k.dtype != q.dtype or v.dtype != q.dtype:
            raise ArgumentTypeError("k and v must have q's dtype")
        if k.dim() != 4 or k.shape != v.shape or (k.shape[0], *k.shape[2:]) != (batch, hk, d):
            raise ArgumentError(f"k and v must be (batch={batch}, seqlen_new, {hk}, {d})")
    if cache_seqlens is not None and not isinstance(cache_seqlens, int):
        _int32(cache_seqlens, "cache_seqlens", batch, device)
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    if seqlen_q == 1 and alibi_slopes is None:
        causal = False  # one query row at the bottom sees every key anyway (flash_api.cpp)
    left, right, cap = _window(causal, window_size, softcap, seqlen_cache)
    if rotary_cos is not None or rotary_sin is not None:
        if rotary_cos is None or rotary_sin is None or k is None:
            raise ArgumentError(
                "rotary embedding needs rotary_cos, rotary_sin and new k/v to append"
            )
        rd = rotary_cos.shape[-1] * 2
        if rotary_cos.shape != rotary_sin.shape or rd > d or rd % 16:
            raise ArgumentError(
                f"rotary_cos/sin must be (seqlen_ro, rotary_dim / 2) with rotary_dim <= {d} and a "
                f"multiple of 16, got {tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}"
            )
    arguments.alibi_slopes(alibi_slopes, batch, hq, device)  # its shape error, before writing
    rows = seqlen_q * (hq // hk)
    family = configs.device_family(device)
    kc = kv_config(family, d)
    decoding = rows <= kc.decode.block_m
    tile = kc.decode if decoding else kc.prefill
    if num_splits is None or num_splits < 1:
        work = batch * hk * _cdiv(rows, tile.block_m)
        num_splits = auto_num_splits(work, _num_sms(device), seqlen_cache, tile.block_n, family)
    num_splits = max(1, min(int(num_splits), 128, _cdiv(seqlen_cache, tile.block_n)))
    if decoding:
        tile = kc.decode_tile(num_splits, seqlen_cache)
    return _KVCall(
        batch, seqlen_q, seqlen_cache, k.shape[1] if k is not None else 0, paged, scale, left,
        right, cap, left is not None or right is not None, bool(rotary_interleaved), tile,
        kc.merge_d, rows,
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
    if k is not None:
        # Queries move along with the keys under a causal mask or a window; otherwise every
        # query sits at the first new position (flash_attn's docstring).
        q = _update_cache(
            q, k, v, k_cache, v_cache, cache_seqlens, cache_batch_idx, block_table,
            rotary_cos, rotary_sin, call.interleaved, call.local,
        )  # fmt: skip
    # A decoding step without new keys reads the lengths as given (no extra GPU launch).
    seqlens_k = cache_seqlens + call.seqlen_new if call.seqlen_new else cache_seqlens
    if k_start is not None:
        seqlens_k = seqlens_k - k_start
    if seqlens_k.dtype != torch.int32 or not seqlens_k.is_contiguous():
        seqlens_k = seqlens_k.to(torch.int32).contiguous()
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    lse = None
    if call.lse:
        lse = torch.empty((batch, q.shape[2], call.seqlen_q), dtype=torch.float32, device=device)
    if plan is None or not plan.replay(q, k_cache, v_cache, out, lse, seqlens_k, k_start,
                                       block_table, cache_batch_idx):  # fmt: skip
        slopes, sa_b, sa_h = arguments.alibi_slopes(alibi_slopes, batch, q.shape[2], device)
        _launch(
            q, k_cache, v_cache, out, lse, tile=call.tile, merge_d=call.merge_d, cu_q=None,
            seqlens_k=seqlens_k, k_start=k_start, block_table=block_table,
            batch_idx=cache_batch_idx, slopes=slopes, sa=(sa_b, sa_h), batch=batch,
            seqlen_q=call.seqlen_q, max_rows=call.rows, kv_rows=call.seqlen_cache,
            scale=call.scale, left=call.left, right=call.right, softcap=call.softcap,
            num_splits=call.num_splits, varlen=False, launched=launched,
        )  # fmt: skip
    return (out, lse) if call.lse else out


class _KVPlan:
    """A recorded cache-kernel launch (``kernels.launch``) and the call's decisions. A replay
    takes the split scratch of its own stream, and its 13 pointer arguments (in ``_kv_fwd``'s
    order; unused ones None) must be 16-byte aligned as the recording's were (Triton
    specialises on it); else the full launch runs."""

    __slots__ = ("call", "launch", "scratch", "aligns", "native")
    replays = 0  # replays made in this process (kernels.check reports them)

    def __init__(self, call: _KVCall, rec, scratch, aligns: tuple):
        self.call, self.launch, self.scratch, self.aligns = call, rec, scratch, aligns
        # Handed over to kernels/_native.py: True, False where it cannot be, None before.
        self.native = None

    @classmethod
    def of(cls, call: _KVCall, launched: list):
        """The plan of a call's one noted launch, or None where it cannot be replayed."""
        fn, grid, args, kwargs, kernel, pointers, scratch = launched[0]
        rec = launch.record(fn, grid, args, kwargs, kernel, pointers)
        if rec is None:
            return None
        return cls(call, rec, scratch, _aligns(pointers))

    def replay(self, q, k_cache, v_cache, out, lse, seqlens_k, k_start, block_table, batch_idx):
        part = count = None
        if self.scratch is not None:
            part, count = _split_scratch(q.device, *self.scratch)
        pointers = (q, k_cache, v_cache, out, lse, part, count, None, seqlens_k, k_start,
                    block_table, batch_idx, None)  # fmt: skip
        if _aligns(pointers) != self.aligns:
            return False
        self.launch(_stream_of(q.device), pointers)
        _KVPlan.replays += 1
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
    kc = kv_config(configs.device_family(device), d)
    max_rows = int(max_seqlen_q) * (hq // hk)
    _launch(
        q, k_cache, v_cache, out, lse, cu_q=cu_q, seqlens_k=seqlens_k, k_start=None,
        tile=kc.decode if max_rows <= kc.decode.block_m else kc.prefill, merge_d=kc.merge_d,
        block_table=block_table, batch_idx=None, slopes=slopes, sa=(sa_b, sa_h), batch=batch,
        seqlen_q=int(max_seqlen_q), max_rows=max_rows,
        kv_rows=seqlen_cache, scale=scale,
        left=left, right=right, softcap=cap, num_splits=1, varlen=True,
    )  # fmt: skip
    return (out, lse, None) if return_attn_probs else out


def aot_kernels(
    head_dim: int, family: str, dtype: str = "bf16", page_size: int = 16
) -> list[tuple]:
    """(name, jit fn, pointer types, constexprs, tile) of the cache kernels for ``kernels.aot``:
    split-KV decoding from a paged cache (causal; the last split merges them all), with the long
    splits' tile where the family has one (``kv_decode_long``), and paged varlen prefill."""
    kc = kv_config(family, head_dim)
    bd = configs.padded_head_dim(head_dim)
    p = f"*{dtype}"
    ptrs = dict(
        Q=p, K=p, V=p, Out=p, LSE="*fp32", Part="*fp32", Count="*i32", CuQ="*i32",
        SeqlensK="*i32", KStart="*i32", BlockTable="*i32", BatchIdx="*i32", Slopes="*fp32",
    )  # fmt: skip
    flags = dict(
        HEAD_DIM=head_dim, BLOCK_D=bd, PAGE_SIZE=page_size, PAGED=True, HAS_BATCH_IDX=False,
        HAS_KSTART=False, HAS_LEFT=False, HAS_RIGHT=True, HAS_SOFTCAP=False, HAS_ALIBI=False,
        STORE_LSE=True, MERGE_D=kc.merge_columns(bd),
    )  # fmt: skip

    def tiles(t):
        return dict(BLOCK_M=t.block_m, BLOCK_N=t.block_n)

    decode = [("kv_decode", kc.decode)]
    if kc.decode_long is not None:
        decode.append(("kv_decode_long", kc.decode_long))
    return [
        *((name, _kv_fwd, ptrs, dict(flags, IS_VARLEN_Q=False, SPLIT=True, **tiles(t)), t)
          for name, t in decode),
        ("kv_prefill", _kv_fwd, ptrs,
         dict(flags, IS_VARLEN_Q=True, SPLIT=False, **tiles(kc.prefill)), kc.prefill),
    ]  # fmt: skip
