"""The KV-cache kernels and their configs: ``kv_fwd`` (attention against a cache, split-KV
decoding merged by the last split, paged prefill) and ``kv_append`` (a step's cache update);
attnforge_kernels/api/kvcache.py calls them (``flash_attn_with_kvcache``, paged-KV prefill). The AOT
compile cache keys each kernel by its own source and its jit callees'
(``attnforge_kernels.tools.compile_key``), so host code here or in attnforge_kernels/api/kvcache.py
compiles nothing again when it changes.

The kernel (``kv_fwd``) packs the query heads of one KV head's GQA group into the rows of a tile
(row ``r`` is query position ``r // group`` of head ``hk * group + r % group``), so a decoding step
(seqlen_q = 1) still fills 16-row matrix tiles, and reads K/V either from a contiguous cache row
or, paged, through the block table one key row at a time (any page size). Split-KV: with
``num_splits > 1`` each program handles one slice of the keys and writes an fp32 partial output
and its LSE; the last program of a tile to finish (an atomic counter) merges the slices in the
same launch. ``num_splits=0`` picks the count so that short batches of decoding still fill the
GPU: from tables measured per GPU (``DECODE_SPLIT_WAVES``, by family and memory bandwidth), else
with flash_attn's heuristic
(``num_splits_heuristic`` in flash_api.cpp).
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, replace

import triton
import triton.language as tl

from . import configs
from .configs import Tile
from .flash import LN2_C, LOG2E_C, dot_acc, mm, scores_tile
from .interpreter import patch_interpreter

patch_interpreter()

# fmt: off


@triton.jit(do_not_specialize=["seqlen_q", "kv_rows", "left", "right", "num_splits"])
def kv_fwd(
    Q, K, V, Out, LSE, Part, Count, CuQ, SeqlensK, KStart, BlockTable, BatchIdx, Slopes,
    sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, so_b, so_s, so_h, sl_b, sl_h,
    sbt_b, sa_b, sa_h, seqlen_q, kv_rows, num_heads_k, group, qk_scale, cap_in, cap_out, left, right, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr, IS_VARLEN_Q: tl.constexpr, PAGED: tl.constexpr,
    HAS_BATCH_IDX: tl.constexpr, HAS_KSTART: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    SPLIT: tl.constexpr, STORE_LSE: tl.constexpr, MERGE_D: tl.constexpr,
    MERGE_M: tl.constexpr, MERGE_S: tl.constexpr,
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
        alibi2 = tl.load(Slopes + b * sa_b + h * sa_h, mask=row_ok, other=0.0) * LOG2E_C
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
        qk = mm(q, tl.trans(k))
        rel = offs_n[None, :] - qi[:, None] - diag
        s = scores_tile(qk, rel, key_ok[None, :], qk_scale, cap_in, cap_out, alibi2, left, right,
                    HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT, True)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no inf - inf on empty rows
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        acc = acc * alpha[:, None]
        v = tl.load(v_base + v_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = dot_acc(p.to(v.dtype), v, acc)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse_ln = (m_i + tl.log2(l_safe)) * LN2_C
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
            # The merge is the tail every split waits for. It reads MERGE_M rows x MERGE_S splits
            # x MERGE_D columns of partials (and their LSEs) in one load, over the rows that
            # exist, with a running maximum across chunks of splits: a decoding step's GQA group
            # (4 of the tile's 16 rows) with up to MERGE_S splits takes one L2 round trip, not
            # one a split; a tile of 16 real rows takes 4 a chunk of splits.
            n_real = tl.minimum(n_rows - m0, BLOCK_M)  # the tile's rows that exist
            mr = tl.arange(0, MERGE_M)
            ms = tl.arange(0, MERGE_S)
            md = tl.arange(0, MERGE_D)
            for r0 in range(0, n_real, MERGE_M):
                r = r0 + mr
                r_ok = r < n_real
                g_rows = m0 + r
                g_qi = g_rows // group
                g_h = hk * group + (g_rows - g_qi * group)
                g_out = b64 * so_b + (q_start + g_qi).to(tl.int64) * so_s + g_h * so_h
                for d0 in range(0, BLOCK_D, MERGE_D):
                    cols = d0 + md
                    c_ok = cols < HEAD_DIM
                    m = tl.full([MERGE_M], float("-inf"), dtype=tl.float32)
                    total = tl.zeros([MERGE_M], dtype=tl.float32)
                    macc = tl.zeros([MERGE_M, MERGE_D], dtype=tl.float32)
                    for s0 in range(0, num_splits, MERGE_S):
                        s = s0 + ms
                        rs_ok = r_ok[:, None] & (s[None, :] < num_splits)
                        lse_s = tl.load(Part + l_at + s[None, :] * l_step + r[:, None],
                                        mask=rs_ok, other=float("-inf"))
                        o_s = tl.load(Part + o_at + s[None, :, None] * o_step
                                      + (r[:, None, None] * BLOCK_D + cols[None, None, :]),
                                      mask=rs_ok[:, :, None] & c_ok[None, None, :], other=0.0)
                        m_new = tl.maximum(m, tl.max(lse_s, 1))
                        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                        alpha = tl.exp2((m - m_use) * LOG2E_C)
                        w = tl.exp2((lse_s - m_use[:, None]) * LOG2E_C)
                        macc = macc * alpha[:, None] + tl.sum(w[:, :, None] * o_s, 1)
                        total = total * alpha + tl.sum(w, 1)
                        m = m_new
                    m_use = tl.where(m == float("-inf"), 0.0, m)
                    none = total == 0.0
                    t_safe = tl.where(none, 1.0, total)
                    tl.store(Out + g_out[:, None] + cols[None, :],
                             (macc / t_safe[:, None]).to(Out.dtype.element_ty),
                             mask=r_ok[:, None] & c_ok[None, :])
                    if STORE_LSE:
                        lse = tl.where(none, float("inf"), m_use + tl.log(t_safe))
                        tl.store(LSE + b64 * sl_b + g_h * sl_h + q_start + g_qi, lse,
                                 mask=r_ok & (d0 == 0))
    else:
        tl.store(Out + o_rows[:, None] + offs_d[None, :], out.to(Out.dtype.element_ty),
                 mask=o_mask)
        if STORE_LSE:
            lse = tl.where(empty, float("inf"), lse_ln)
            tl.store(LSE + b64 * sl_b + h * sl_h + q_start + qi, lse, mask=row_ok)


@triton.jit
def _rotary_row(
    Src, Dst, Cos, Sin, pos, seqlen_ro, s_ro_cos, s_ro_sin,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, ROT_HALF: tl.constexpr,
    BLOCK_R: tl.constexpr, INTERLEAVED: tl.constexpr,
):
    """Dst[:HEAD_DIM] = Src[:HEAD_DIM] with its first 2 * ROT_HALF dims rotated by the angle of
    row ``pos`` of cos/sin (flash_attn's rotary: GPT-NeoX halves, or interleaved pairs; fp32,
    then cast to the nearest; unrotated at positions past the tables). ROT_HALF 0: a copy."""
    offs = tl.arange(0, BLOCK_D)
    if ROT_HALF > 0:
        r = tl.arange(0, BLOCK_R)
        r_ok = r < ROT_HALF
        # The tables' row: the first ROT_HALF entries where pos is inside them, else none. One
        # comparison, not r_ok & (pos < seqlen_ro): Triton 3.9's interpreter gives a tensor-and-
        # scalar `&` an int32 mask, which its loads refuse (the compiled kernels were unaffected).
        t_ok = r < tl.where(pos < seqlen_ro, ROT_HALF, 0)
        pos64 = pos.to(tl.int64)
        c = tl.load(Cos + pos64 * s_ro_cos + r, mask=t_ok, other=1.0).to(tl.float32)
        s = tl.load(Sin + pos64 * s_ro_sin + r, mask=t_ok, other=0.0).to(tl.float32)
        if INTERLEAVED:
            i0 = 2 * r
            i1 = 2 * r + 1
        else:
            i0 = r
            i1 = r + ROT_HALF
        x0 = tl.load(Src + i0, mask=r_ok, other=0.0).to(tl.float32)
        x1 = tl.load(Src + i1, mask=r_ok, other=0.0).to(tl.float32)
        tl.store(Dst + i0, (x0 * c - x1 * s).to(Dst.dtype.element_ty), mask=r_ok)
        tl.store(Dst + i1, (x0 * s + x1 * c).to(Dst.dtype.element_ty), mask=r_ok)
        rest = (offs >= 2 * ROT_HALF) & (offs < HEAD_DIM)
    else:
        rest = offs < HEAD_DIM
    tl.store(Dst + offs, tl.load(Src + offs, mask=rest), mask=rest)


@triton.jit(do_not_specialize=["seqlen_new", "seqlen_q", "cache_rows", "seqlen_ro"])
def kv_append(
    Q, K, V, KCache, VCache, QOut, CacheSeqlens, SeqlensK, KStart, BlockTable, BatchIdx, Cos, Sin,
    sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, skc_b, skc_s, skc_h, svc_b, svc_s,
    svc_h, sqo_b, sqo_s, sqo_h, sbt_b, s_ro_cos, s_ro_sin,
    seqlen_new, seqlen_q, num_heads_k, num_heads_q, cache_rows, seqlen_ro,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, ROT_HALF: tl.constexpr,
    BLOCK_R: tl.constexpr, INTERLEAVED: tl.constexpr, LOCAL: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr,
    HAS_KSTART: tl.constexpr,
):
    """A step's cache update in one launch, before ``kv_fwd``: one program per (batch, token,
    head). Tokens below ``seqlen_new`` write the new key (rotated at cache_seqlens + token) and
    value of a KV head into the cache; with rotary, the next ``seqlen_q`` tokens write query
    heads rotated into QOut (at cache_seqlens + token under a causal mask or a window, else at
    cache_seqlens). Token 0 of head 0 writes the lengths ``kv_fwd`` reads: cache_seqlens +
    seqlen_new, less the left padding. A key past its sequence's cache rows is not written, and
    the lengths stop at those rows (lengths given as a tensor are not checked on the host: that
    would wait for the GPU every step)."""
    if ROT_HALF > 0:
        tokens = seqlen_new + seqlen_q
    else:
        tokens = seqlen_new
    pid = tl.program_id(0)
    h = tl.program_id(1)
    b = pid // tokens
    t = pid - b * tokens
    b64 = b.to(tl.int64)
    start = tl.load(CacheSeqlens + b)
    if (t == 0) & (h == 0):
        n = tl.minimum(start + seqlen_new, cache_rows)  # what the cache holds of them
        if HAS_KSTART:
            n -= tl.load(KStart + b)
        tl.store(SeqlensK + b, n)
    if t < seqlen_new:
        pos = start + t
        if (h < num_heads_k) & (pos < cache_rows):
            if PAGED:
                block = tl.load(BlockTable + b64 * sbt_b + pos // PAGE_SIZE).to(tl.int64)
                seq, row = block, (pos % PAGE_SIZE).to(tl.int64)
            else:
                if HAS_BATCH_IDX:
                    seq = tl.load(BatchIdx + b).to(tl.int64)
                else:
                    seq = b64
                row = pos.to(tl.int64)
            src = b64 * sk_b + t.to(tl.int64) * sk_s + h * sk_h
            _rotary_row(K + src, KCache + seq * skc_b + row * skc_s + h * skc_h, Cos, Sin,
                        pos, seqlen_ro, s_ro_cos, s_ro_sin, HEAD_DIM, BLOCK_D, ROT_HALF,
                        BLOCK_R, INTERLEAVED)
            src = b64 * sv_b + t.to(tl.int64) * sv_s + h * sv_h
            _rotary_row(V + src, VCache + seq * svc_b + row * svc_s + h * svc_h, Cos, Sin,
                        pos, seqlen_ro, s_ro_cos, s_ro_sin, HEAD_DIM, BLOCK_D, 0, BLOCK_R,
                        INTERLEAVED)
    elif ROT_HALF > 0:  # (no query tokens without rotary)
        i = t - seqlen_new
        if h < num_heads_q:
            if LOCAL:
                pos = start + i
            else:
                pos = start
            i64 = i.to(tl.int64)
            _rotary_row(Q + b64 * sq_b + i64 * sq_s + h * sq_h,
                        QOut + b64 * sqo_b + i64 * sqo_s + h * sqo_h, Cos, Sin, pos, seqlen_ro,
                        s_ro_cos, s_ro_sin, HEAD_DIM, BLOCK_D, ROT_HALF, BLOCK_R, INTERLEAVED)


# fmt: on


# --------------------------------------------------------------------------------------------
# configs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVConfig:
    """Tiles of the cache kernel: ``decode`` when a GQA group's rows (seqlen_q x group) fit 16
    rows, ``prefill`` otherwise. The last split merges ``merge_rows`` rows x ``merge_splits``
    splits x ``merge_d`` head-dim columns (0: all) of partials at a time."""

    decode: Tile
    prefill: Tile
    merge_d: int = 0
    merge_rows: int = 4
    merge_splits: int = 8
    # The decode tile of a launch that fills one wave of the GPU (``decode_tile``) and whose
    # programs each read at least ``long_keys`` keys (None: ``decode`` throughout).
    decode_long: Tile | None = None
    long_keys: int = 0

    def merge(self, padded_head_dim: int) -> dict[str, int]:
        """The merge's constexprs for a launch at this padded head dim."""
        return dict(MERGE_M=self.merge_rows, MERGE_S=self.merge_splits,
                    MERGE_D=min(self.merge_d or padded_head_dim, padded_head_dim))  # fmt: skip

    def decode_tile(self, num_splits: int, seqlen_cache: int, programs: int, num_sms: int) -> Tile:
        """The decode tile of a launch of ``programs`` programs (``num_splits`` splits over
        ``seqlen_cache`` keys) on ``num_sms`` SMs / CUs: ``decode_long`` where the programs fill
        one wave (80-100% of the SMs, as ``num_splits_heuristic`` counts a full grid) and each
        reads at least ``long_keys`` keys."""
        if self.decode_long is None or seqlen_cache // num_splits < self.long_keys:
            return self.decode
        return self.decode_long if 0.8 * num_sms <= programs <= num_sms else self.decode


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
    return replace(kc, **DECODE_ON_NEWER_TRITON.get((configs.triton_release(), family, d), {}))


# The split decode's KVConfig fields where a newer Triton line (recipes/tritons.yaml) compiles it
# to more registers than the kernel it replaced on that line (attnforge_kernels.aot, 2026-11-26):
# each row keeps the line's spills at 0 and its occupancy at the old kernel's or above.
# - ``decode``: tiles where the merge in the last split cost a wave against the two-launch kernel
#   (the comments: waves with the row's tile, then the old kernel's and the 3.6 tile's).
# - ``merge_d``: fewer columns a merge load where the merge of 4 rows x 8 splits cost a wave
#   against the merge one split at a time (the comments: that merge's registers and waves, then
#   4 x 8 x the row's, then the row's).
DECODE_ON_NEWER_TRITON = {
    ((3, 7), "cdna4", 64): dict(
        decode=Tile(16, 32, 4, 1, 2),  # gfx950: 8 waves (7; 16x64: 6)
        merge_d=32,  # gfx950: 60 VGPRs, 8 waves (76, 6); 4 x 8 x 32: 60, 8
    ),
    ((3, 8), "cdna4", 64): dict(
        decode=Tile(16, 32, 4, 1, 2),  # gfx950: 7 waves (7; 16x64: 6)
        merge_d=32,  # gfx950: 68, 7 (78, 6); 67, 7
    ),
    ((3, 8), "cdna3", 64): dict(decode=Tile(16, 64, 4, 1, 2)),  # gfx942: 4 waves (4; wpe5 spills 54)
    ((3, 8), "cdna2", 64): dict(decode=Tile(16, 64, 4, 1, 2)),  # gfx90a: 4 waves (4; wpe5 spills 5)
    ((3, 8), "cdna2", 128): dict(decode=Tile(16, 64, 4, 1, 3)),  # gfx90a: 3 waves (3; wpe2: 2)
    ((3, 9), "cdna3", 128): dict(decode=Tile(16, 64, 4, 1, 3)),  # gfx942: 3 waves (3; wpe2: 2)
    ((3, 9), "rdna4", 64): dict(decode=Tile(16, 64, 4, 1, 8)),  # gfx1201: 9 waves (8; wpe2: 7)
    ((3, 9), "rdna4", 128): dict(decode=Tile(16, 16, 4, 1, 2)),  # gfx1201: 10 waves (9; 16x32: 8)
    ((3, 8), "hopper", 128): dict(merge_d=64),  # sm90: 164 registers, 3 blocks (191, 2); 165, 3
    ((3, 9), "hopper", 64): dict(merge_d=16),  # sm90: 93, 5 (128, 4); 4 x 8 x 16: 96, 5
    ((3, 9), "hopper", 128): dict(merge_d=64),  # sm90: 164, 3 (193, 2); 165, 3
}  # fmt: skip


def _kv_config(family: str, d: int) -> KVConfig:
    if family == "interpreter":
        t = Tile(16, 16, 1, 1)
        # several chunks of rows, splits and columns in the CPU tests
        return KVConfig(t, t, merge_d=16, merge_rows=2, merge_splits=2)
    # AMD: the split merge 64 columns at a time; whole 16 x 256 fp32 tiles (three live) cost
    # gfx1150 spills and gfx942/gfx1201 a wave of occupancy at d=256 (attnforge_kernels.aot).
    if family in ("rdna3", "rdna3.5", "rdna4"):
        # d=128 decoding with 64-key tiles spills 93 VGPRs on gfx1151; 32-key tiles do not.
        if d <= 64:
            return KVConfig(Tile(16, 64, 4, 1, 2), Tile(64, 32, 4, 1, 2), 64)
        if d <= 128:
            return KVConfig(Tile(16, 32, 4, 1, 2), Tile(64, 32, 4, 1, 2), 64)
        return KVConfig(Tile(16, 16, 4, 1, 1), Tile(16, 16, 4, 1, 1), 64)
    if family in ("cdna2", "cdna3", "cdna4"):
        if d <= 64:
            # waves_per_eu 5 kept gfx942's split decode at 5 waves while the merge read one
            # split at a time (99 VGPRs and 4 waves without); with the merge in one load, 92 (96
            # without), 5 waves either way
            return KVConfig(Tile(16, 64, 4, 1, 5), Tile(128, 32, 4, 1, 2), 64)
        if d <= 128:
            return KVConfig(Tile(16, 64, 4, 1, 2), Tile(128, 32, 4, 1, 2), 64)
        return KVConfig(Tile(16, 32, 4, 1, 1), Tile(64, 16, 4, 1, 1), 64)
    if family == "hopper":
        if d == 128:
            # Programs of 4096 keys or more read faster with 64-key tiles where they fill one
            # wave (batch 1 at 16 splits, batch 16 at 1), slower at half a wave (batch 4 x 16k at
            # 2 splits: 122.2 against 100.0 us) or at two and more (batch 64: 12.0 against 11.1
            # ms); shorter splits keep 128 (docs/history/benchmarks-2026.md, "The long-split
            # tile where a launch fills one wave").
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


# Split counts measured per GPU, for ``num_splits=0``. A family's tables are keyed by the GPU's
# memory bandwidth (``configs.memory_gbs``: two GPUs of one family with the same SM count, an H100
# and an H200, want different counts); a GPU takes the table with the highest ``min_gbs`` it
# reaches. A row, the first whose cache bound holds (the last row's bound is None), gives the
# programs a decoding step aims for in waves of the GPU's SMs / CUs: ``few`` where the batch's
# (row block, batch, KV head) tiles fill less than ``FEW_TILES_WAVES`` of the GPU, ``many``
# otherwise; the splits are those waves' programs over the tiles, rounded down. Families not
# listed take flash_attn's heuristic.
FEW_TILES_WAVES = 0.4


@dataclass(frozen=True)
class SplitTable:
    """One GPU's measured split counts (see DECODE_SPLIT_WAVES): rows of (cache keys up to,
    waves with few tiles, waves with many), for GPUs reading at least ``min_gbs`` GB/s; and
    ``long_tile``, this GPU's own tile for the launches that take the family's long-split tile
    (``KVConfig.decode_long``; None: the family's), measured with these counts."""

    min_gbs: float
    rows: tuple[tuple[int | None, float, float], ...]
    long_tile: Tile | None = None

    def waves(self, seqlen_cache: int, work_blocks: int, num_sms: int) -> float:
        few, many = next(
            (f, m) for bound, f, m in self.rows if bound is None or seqlen_cache <= bound
        )
        return few if work_blocks < FEW_TILES_WAVES * num_sms else many


# Hopper.
# - H100 (3.35 TB/s), from two sweeps of 4-64 splits (docs/history/benchmarks-2026.md, "Decoding
#   at batch 1 with long caches"): batch 1 (8 tiles) runs fastest with 8 splits up to 16k keys
#   (4k: 18.9 us against 22.1 at 16; 16k: 41.3 against 43.8 at 16 and 44.4 at flash_attn's 15) and
#   with 16, one full wave, at 64k-128k (109.7 / 195.7 against 111.9 / 201.6 at flash_attn's 14,
#   whose unfilled SMs stay idle; 24 or 33 splits cost 5-10 us more); batch 8 (64 tiles) with 1
#   split up to 16k keys (60.4 / 188.1 against 61.6 / 189.4 at 2); a grid that fills 0.8 of the
#   GPU, 1 split.
# - H200 (4.8 TB/s), from a sweep of 1-32 splits at batch 1-32 and 4k-128k keys in GPU time
#   (2026-12-05, ``attnforge_kernels.bench --decode --gpu-time --splits 1,2,3,4,6,8,12,16,24,32``;
#   docs/history/benchmarks-2026.md, "Decode splits on an H200"): up to 16k keys one full wave
#   (batch 8 x 16k: 134.6 us at 2 splits against 166.8 at the H100's 1; cuDNN 131.6); past 16k,
#   0.75 of a wave while the batch's tiles are few (batch 1-4: 12, 6 and 3 splits; 1 wave cost
#   2-5%) and one wave once they are many. Its long-split tile is 16x64 with 4 stages (the H100's
#   3 left batch 8 x 16k at 136.8 us and batch 16 x 16k at 255.6, 0.97-0.98 of cuDNN; with 4:
#   132.5 and 248.3), and with it one wave beat the 4 waves measured with the old tile (batch 8 x
#   128k: 948.7 us at 2 splits against 960.3 at 8; batch 16 x 128k: 1882.0 at 1 against 1895.8
#   at 4; batch 32 x 64k: 1916.0 at 1 against 1899.4 at 2, the one row where more splits won,
#   within 2%). 2026-12-06, three runs a row in GPU time (docs/history/benchmarks-2026.md, "The
#   H200's long-split tile"). Every row's count is within 2% of the row's fastest.
# AMD: untimed, flash_attn's heuristic; an AMD runner would time ``attnforge_kernels.bench
# --decode --gpu-time --splits ...`` and add its table here.
DECODE_SPLIT_WAVES: dict[str, tuple[SplitTable, ...]] = {
    "hopper": (
        SplitTable(0, ((16384, 0.5, 0.5), (None, 1.0, 1.0))),
        SplitTable(4000, ((16384, 1.0, 1.0), (None, 0.75, 1.0)), long_tile=Tile(16, 64, 4, 4)),
    ),
}


def split_table(family: str, gbs: float = 0.0) -> SplitTable | None:
    """The family's split table for a GPU reading ``gbs`` GB/s (0: unknown, the family's first)."""
    tables = DECODE_SPLIT_WAVES.get(family, ())
    fitting = [t for t in tables if t.min_gbs <= gbs] or list(tables[:1])
    return max(fitting, key=lambda t: t.min_gbs, default=None)


# The cache kernels' keys of a config override (``ATTNFORGE_KERNELS_CONFIG``, as
# ``configs.override`` reads it for the attention kernels): the KVConfig field each one sets.
KV_TILE_KEYS = {"kv_decode": "decode", "kv_decode_long": "decode_long", "kv_prefill": "prefill"}


def call_config(family: str, head_dim: int, gbs: float = 0.0) -> KVConfig:
    """The cache kernels' config of a call on a GPU reading ``gbs`` GB/s: the family's tiles
    (``kv_config``), the GPU's own long-split tile (``for_gpu``), then the cache-kernel keys of
    ``ATTNFORGE_KERNELS_CONFIG`` (``kv_override``), as the attention kernels take theirs."""
    kc = for_gpu(kv_config(family, head_dim), family, gbs)
    return kv_override(kc, os.environ.get(configs.OVERRIDE_ENV))


@functools.lru_cache(maxsize=64)
def kv_override(kc: KVConfig, spec: str | None) -> KVConfig:
    """``kc`` with the cache-kernel keys of a JSON override such as ``{"kv_decode_long": [16,
    64, 4, 4]}``: ``kv_decode``, ``kv_decode_long`` (null: no long-split tile), ``kv_prefill``
    (tiles as ``configs.override`` takes them) and ``kv_long_keys`` (0 or more); other keys are
    the attention kernels'. For timing tiles on a GPU (``attnforge_kernels.bench --decode
    --variant``), as an AMD runner would to fill its family's tables."""
    if not spec:
        return kc
    data = json.loads(spec)
    changes: dict = {}
    for key, field in KV_TILE_KEYS.items():
        if key in data:
            t = data[key]
            if t is None and field != "decode_long":
                raise ValueError(f"{key} needs a tile; only kv_decode_long may be null")
            changes[field] = None if t is None else configs.tile_of(t)
    if "kv_long_keys" in data:
        n = int(data["kv_long_keys"])
        if n < 0:
            raise ValueError(f"kv_long_keys must be 0 or more, got {n}")
        changes["long_keys"] = n
    return replace(kc, **changes) if changes else kc


@functools.lru_cache(maxsize=256)
def for_gpu(kc: KVConfig, family: str, gbs: float = 0.0) -> KVConfig:
    """``kc`` with the long-split tile of the GPU reading ``gbs`` GB/s (its SplitTable's
    ``long_tile``) where the family's config has such a tile; otherwise ``kc``."""
    table = split_table(family, gbs)
    if kc.decode_long is None or table is None or table.long_tile is None:
        return kc
    return replace(kc, decode_long=table.long_tile)


@functools.lru_cache(maxsize=1024)
def auto_num_splits(
    work_blocks: int, num_sms: int, seqlen_cache: int, block_n: int, family: str = "",
    gbs: float = 0.0,
) -> int:  # fmt: skip
    """Splits for ``num_splits=0``: the GPU's ``DECODE_SPLIT_WAVES`` table (by family and memory
    bandwidth, ``gbs``), else flash_attn's heuristic over the cache's key tiles; at most one split
    per ``MIN_SPLIT_KEYS`` keys."""
    table = split_table(family, gbs)
    if table is None:
        n = num_splits_heuristic(work_blocks, num_sms, -(-seqlen_cache // block_n))
    else:
        n = int(num_sms * table.waves(seqlen_cache, work_blocks, num_sms)) // work_blocks
    return max(1, min(n, seqlen_cache // MIN_SPLIT_KEYS))


# One warp a (token, head) row: the update moves a few hundred bytes a program.
APPEND_TILE = Tile(1, 1, 1, 1)


def aot_kernels(
    head_dim: int, family: str, dtype: str = "bf16", page_size: int = 16
) -> list[tuple]:
    """(name, jit fn, pointer types, constexprs, tile) of the cache kernels for
    ``attnforge_kernels.aot``: split-KV decoding from a paged cache (causal; the last split merges
    them all), with the long splits' tile where the family has one (``kv_decode_long``), and paged
    varlen prefill."""
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
        STORE_LSE=True, **kc.merge(bd),
    )  # fmt: skip

    def tiles(t):
        return dict(BLOCK_M=t.block_m, BLOCK_N=t.block_n)

    decode = [("kv_decode", kc.decode)]
    if kc.decode_long is not None:
        decode.append(("kv_decode_long", kc.decode_long))
        # A GPU of the family with its own long-split tile (an H200's), named by its table.
        for t in DECODE_SPLIT_WAVES.get(family, ()):
            if t.long_tile is not None and t.long_tile != kc.decode_long:
                decode.append((f"kv_decode_long_{int(t.min_gbs)}gbs", t.long_tile))
    # A step's cache update with rotary over the whole head dim (the most it does), paged.
    append_ptrs = dict(
        Q=p, K=p, V=p, KCache=p, VCache=p, QOut=p, CacheSeqlens="*i32", SeqlensK="*i32",
        KStart="*i32", BlockTable="*i32", BatchIdx="*i32", Cos=p, Sin=p,
    )  # fmt: skip
    half = head_dim // 2 // 8 * 8
    append = dict(
        HEAD_DIM=head_dim, BLOCK_D=bd, ROT_HALF=half, BLOCK_R=triton.next_power_of_2(half),
        INTERLEAVED=False, LOCAL=True, PAGE_SIZE=page_size, PAGED=True, HAS_BATCH_IDX=False,
        HAS_KSTART=False, KStart=None, BatchIdx=None,
    )  # fmt: skip
    return [
        *((name, kv_fwd, ptrs, dict(flags, IS_VARLEN_Q=False, SPLIT=True, **tiles(t)), t)
          for name, t in decode),
        ("kv_prefill", kv_fwd, ptrs,
         dict(flags, IS_VARLEN_Q=True, SPLIT=False, **tiles(kc.prefill)), kc.prefill),
        ("kv_append", kv_append, append_ptrs, append, APPEND_TILE),
    ]  # fmt: skip
