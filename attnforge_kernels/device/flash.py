"""Triton FlashAttention-2 kernels: forward (with LSE), backward (dK/dV, dQ), one source for AMD and NVIDIA.

Conventions shared by every kernel here:

* Tensors are addressed through (batch, sequence, head) strides with a unit stride on the head
  dimension, so BSHD, BHSD-transposed views and varlen (total, heads, dim) packs need no copy.
  Varlen passes a batch stride of 0 and per-sequence row offsets from ``cu_seqlens``.
* Scores live in the base-2 domain: ``s2 = qk * scale * log2(e)``, so the softmax uses ``exp2``.
  The stored LSE is natural-log (flash_attn's ``softmax_lse``); rows with no visible key get
  ``LSE = +inf`` and ``O = 0``, which makes their backward contribution exactly zero.
* A key j is visible to query i when ``j < seqlen_k`` and, with ``rel = j - i - (seqlen_k - seqlen_q)``
  (flash_attn's bottom-right alignment), ``rel <= right`` (causal is right = 0) and ``rel >= -left``.
  The SDPA shim passes ``right = seqlen_q - seqlen_k`` to get SDPA's top-left causal mask.
* Every loop over key (or query) blocks is split into masked ranges and one unmasked middle range
  whose tiles are provably full; every load of a partial tile is masked (out-of-bounds reads were
  the Qwen-Image crash).
* Dropout and FP8 are constexpr variants (``HAS_DROPOUT``, ``RETURN_SDMASK``, ``IS_FP8``) whose
  extra arguments are ``None`` when off; Triton makes a ``None`` argument a constexpr, so the
  default kernels keep their signature and compile to the same code as without the variants.
  Dropout keeps score (b, h, i, j) iff word 0 of Philox4x32-10 with counter (j, i, b * Hq + h,
  offset) and key seed is >= ``floor(p * 2**32)`` (i, j: positions within the sequence); the
  backward regenerates the same bits. ``attnforge_kernels.checks.dropout_ref`` is that rule in plain
  PyTorch.
"""

from __future__ import annotations

import math
import os

import triton
import triton.language as tl

# The launcher scales with these Python floats; jit code may read only constexpr globals, so the
# kernels get the same values as constexprs (a literal in jit code is one too: same IR).
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
LOG2E_C = tl.constexpr(LOG2E)
LN2_C = tl.constexpr(LN2)
_TWO_LOG2E = tl.constexpr(2 * LOG2E)

# Families whose matrix units multiply e4m3 natively, and the Triton type they take: CDNA3's MFMA
# the FNUZ variant (torch.float8_e4m3fnuz), CDNA4/RDNA4/Hopper the OCP one (float8_e4m3fn), as in
# ROCm/flash-attention's Triton backend (flash_attn/flash_attn_triton_amd/utils.py,
# get_recommended_fp8_dtype; fwd_prefill.py IS_FP8 path, commit 0218cd2c, read 2026-11-24). Triton
# would emulate fp8 elsewhere (RDNA3, CDNA2, Ampere); the launcher refuses those instead.
FP8_DOT = {"cdna3": "fp8e4b8", "cdna4": "fp8e4nv", "rdna4": "fp8e4nv", "hopper": "fp8e4nv"}


def head_chunk(chunk: int, block_d: int, fp8: bool = False, hip: bool = True) -> int:
    """A launch's ``D_CHUNK`` for a config's ``chunk_fwd``, ``chunk_kv`` or ``chunk_q`` (0: the
    tiles stay resident) at the padded head dim ``block_d``. At most ``block_d``: the chunked
    contraction (``_mm_chunked``) takes ``BLOCK_D // D_CHUNK`` steps, so a wider chunk would
    contract nothing. An FP8 forward's is at least 32 on NVIDIA, whose FP8 MMA takes K=32 a step
    (Triton refuses an FP8 ``tl.dot`` with K < 32 there; FP8's padded head dim is 32 or more);
    AMD's FP8 WMMA and MFMA take 16 (gfx1201 compiles the chunked FP8 forward at 16)."""
    if not chunk:
        return 0
    if fp8 and not hip:
        chunk = max(chunk, 32)
    return min(chunk, block_d)


def stride_align(*strides: int) -> int:
    """The factor ``attn_fwd`` and the backward kernels get their tensor strides divided by
    (STRIDE_ALIGN, see ``_aligned``): 1 where every stride is a multiple of 16 elements (Triton
    proves those itself), else the largest power of two dividing all of them (8 for d=40's
    strides)."""
    g = math.gcd(*strides)  # zeros (varlen's batch stride) leave it unchanged
    return 1 if g % 16 == 0 else g & -g


# Triton 3.6's interpreter multiplies bf16 tiles wrongly; fp32 operands are exact there (a product
# of two bf16/fp16 values is exact in fp32), so the CPU path upcasts and keeps GPU numerics.
_UPCAST_DOT = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")

# The kernels' long argument lists are kept a few to a line by hand: the formatter would put each
# on its own line and double the file.
# fmt: off


@triton.jit
def dot_acc(a, b, acc):
    if _UPCAST_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def mm(a, b):
    if _UPCAST_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b)


@triton.jit
def _rne_e4m3(x):
    """Non-negative fp32 ``x`` rounded to the nearest e4m3 value, ties to even, still in fp32:
    Triton 3.6's interpreter truncates when it converts fp32 to fp8 (GPUs round to nearest)."""
    bits = x.to(tl.int32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)
    # Below 2**-6 the e4m3 grid is multiples of 2**-9; adding 1.5 * 2**23 rounds to an integer.
    sub = ((x * 512.0 + 12582912.0) - 12582912.0) / 512.0
    return tl.where(x < 0.015625, sub, normal)


@triton.jit
def _to_operand(p, dtype: tl.constexpr):
    """``p`` as a matrix operand of ``dtype``, rounded to nearest in the interpreter too."""
    if _UPCAST_DOT and dtype.is_fp8():
        return _rne_e4m3(p).to(dtype)
    else:
        return p.to(dtype)


@triton.jit
def _tanh(x):
    # exp2-based tanh: portable across the CUDA and HIP backends and the interpreter.
    e = tl.exp2(x * _TWO_LOG2E)
    return 1.0 - 2.0 / (e + 1.0)


@triton.jit
def _base(P, b64, h, start, s_b, s_h, s_s):
    """Row 0 of head ``h`` of sequence ``b`` (row ``start`` of a varlen pack), 64-bit offsets."""
    return P + b64 * s_b + h.to(tl.int64) * s_h + start.to(tl.int64) * s_s


@triton.jit
def _row_base(P, b64, h, start, s_b, s_h):
    """The same for the per-row LSE and delta, laid out (b, h, seq) or (h, total)."""
    return P + b64 * s_b + h.to(tl.int64) * s_h + start


@triton.jit
def _tile(base, idx, stride, offs_d):
    """Pointers to the [rows, BLOCK_D] tile of rows ``idx``."""
    return base + idx[:, None] * stride + offs_d[None, :]


@triton.jit
def _desc(base, rows, stride, HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr,
          BLOCK_D: tl.constexpr):
    """A TMA tensor descriptor over ``rows`` x HEAD_DIM elements at ``base`` (row stride
    ``stride``, unit column stride), read in [BLOCK_ROWS, BLOCK_D] boxes: reads past either bound
    return zeros, like the masked loads they replace. The launcher checks the 16-byte alignment
    of the base and the strides that TMA needs. An empty sequence (no tile is read from it)
    still gets a valid one-row descriptor."""
    return tl.make_tensor_descriptor(base, shape=[tl.maximum(rows, 1), HEAD_DIM],
                                     strides=[stride, 1], block_shape=[BLOCK_ROWS, BLOCK_D])


@triton.jit
def _streams(a_base, a_stride, b_base, b_stride, rows, USE_TMA: tl.constexpr,
             HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """What a loop streams its two tiles from: descriptors (``_desc``) with USE_TMA, else the
    base pointers themselves."""
    if USE_TMA:
        return (_desc(a_base, rows, a_stride, HEAD_DIM, BLOCK_ROWS, BLOCK_D),
                _desc(b_base, rows, b_stride, HEAD_DIM, BLOCK_ROWS, BLOCK_D))
    else:
        return a_base, b_base


@triton.jit
def _loop_zero(i):
    """0 for offsets below 2**30, yet computed from the loop variable ``i``: a load offset by it
    is not hoisted out of the loop, which is how the backward re-reads tiles it should not hold."""
    return i // 1073741824


@triton.jit
def _alibi2(Slopes, b, h, sa_b, sa_h):
    """The ALiBi slope of (b, h) in the base-2 score domain."""
    return tl.load(Slopes + b * sa_b + h * sa_h).to(tl.float32) * LOG2E_C


@triton.jit
def _rng_state(Rng):
    """Philox key words, counter word 3 and keep threshold from the launcher's int64
    ``[seed, offset, threshold]`` tensor (flash_attn's rng_state plus the threshold)."""
    seed = tl.load(Rng)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c3 = (tl.load(Rng + 1) & 0xFFFFFFFF).to(tl.uint32)
    thresh = tl.load(Rng + 2).to(tl.uint32)
    return k0, k1, c3, thresh


@triton.jit
def _keep(k0, k1, c3, thresh, bh, rows, cols):
    """Dropout keep mask of the scores (rows, cols) of head row ``bh`` = b * Hq + h: word 0 of
    Philox4x32-10 (Triton's tl.philox_impl, as tl.rand uses it) at counter (col, row, bh, c3)."""
    zero = (rows + cols) * 0
    c0 = (cols + zero).to(tl.uint32, bitcast=True)
    c1 = (rows + zero).to(tl.uint32, bitcast=True)
    c2 = (zero + bh).to(tl.uint32, bitcast=True)
    r, _, _, _ = tl.philox_impl(c0, c1, c2, zero.to(tl.uint32, bitcast=True) + c3, k0, k1, 10)
    return r >= thresh


@triton.jit
def _load_rows(ptrs, rows, limit, offs_d, HEAD_DIM: tl.constexpr, ROW_MASK: tl.constexpr,
               EVEN_D: tl.constexpr):
    """Load a [rows, BLOCK_D] tile, masking rows >= limit (when ROW_MASK) and padded head dims."""
    if ROW_MASK:
        if EVEN_D:
            t = tl.load(ptrs, mask=rows[:, None] < limit, other=0.0)
        else:
            ok = (rows[:, None] < limit) & (offs_d[None, :] < HEAD_DIM)
            t = tl.load(ptrs, mask=ok, other=0.0)
    else:
        if EVEN_D:
            t = tl.load(ptrs)
        else:
            t = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return t


@triton.jit
def _load_tile(base, idx, stride, limit, offs_d, HEAD_DIM: tl.constexpr, ROW_MASK: tl.constexpr,
               EVEN_D: tl.constexpr):
    """``_load_rows`` of rows ``idx`` of the tensor at ``base`` with row stride ``stride``."""
    ptrs = _tile(base, idx, stride, offs_d)
    return _load_rows(ptrs, idx, limit, offs_d, HEAD_DIM, ROW_MASK, EVEN_D)


@triton.jit
def _tile_mask(row_ok, offs_d, HEAD_DIM: tl.constexpr, EVEN_D: tl.constexpr):
    """Store mask of a [rows, BLOCK_D] tile: the rows in ``row_ok``, not the padded head dims."""
    if EVEN_D:
        return row_ok[:, None]
    else:
        return row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)


@triton.jit
def _row_stats(lse_base, delta_base, offs_m, seqlen_q, MASK: tl.constexpr):
    """Base-2 LSE and delta of query rows ``offs_m``; rows past the end read +inf and 0 (p = 0)."""
    if MASK:
        row_ok = offs_m < seqlen_q
        lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * LOG2E_C
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
    else:
        lse2 = tl.load(lse_base + offs_m) * LOG2E_C
        delta = tl.load(delta_base + offs_m)
    return lse2, delta


@triton.jit
def _mm_chunked(acc, a_rows, a_idx, a_lim, A_MASK: tl.constexpr, b_rows, b_idx, b_lim,
                B_MASK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                D_CHUNK: tl.constexpr, EVEN_D: tl.constexpr):
    """``acc + a @ b^T`` over the head dim, a and b loaded from memory D_CHUNK columns at a time.

    ``a_rows``/``b_rows`` point at column 0 of each row ([rows, 1]). RDNA3's WMMA keeps a whole
    K row of both operands per lane, so one d=128 contraction from resident tiles holds 2 x 64
    VGPRs of operands; 16-column chunks hold 2 x 8 at a time (the RDNA3/3.5 backward configs).
    """
    for c in tl.static_range(BLOCK_D // D_CHUNK):
        if c * D_CHUNK < HEAD_DIM:
            offs_c = c * D_CHUNK + tl.arange(0, D_CHUNK)
            a = _load_rows(a_rows + offs_c[None, :], a_idx, a_lim, offs_c, HEAD_DIM, A_MASK, EVEN_D)
            b = _load_rows(b_rows + offs_c[None, :], b_idx, b_lim, offs_c, HEAD_DIM, B_MASK, EVEN_D)
            acc = dot_acc(a, tl.trans(b), acc)
    return acc


@triton.jit
def scores_tile(qk, rel, key_ok, qk_scale, cap_in, cap_out, alibi2, left, right,
            HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr,
            HAS_RIGHT: tl.constexpr, MASK: tl.constexpr, SCALE: tl.constexpr = True):
    """Base-2 scores of a tile: scale (or softcap), ALiBi, then the visibility mask. SCALE=False
    (no softcap, no ALiBi): the raw products, masked, for a caller that folds the scale."""
    if HAS_SOFTCAP:
        s = _tanh(qk * cap_in) * cap_out
    elif SCALE:
        s = qk * qk_scale
    else:
        s = qk
    if HAS_ALIBI:
        s = s - alibi2 * tl.abs(rel).to(tl.float32)
    if MASK:
        ok = key_ok
        if HAS_RIGHT:
            ok = ok & (rel <= right)
        if HAS_LEFT:
            ok = ok & (rel >= -left)
        s = tl.where(ok, s, float("-inf"))
    return s


@triton.jit
def _key_ranges(m0, seqlen_q, seqlen_k, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """For query rows [m0, m0+BLOCK_M): key ranges [lo, full_lo) masked, [full_lo, full_hi) full,
    [full_hi, hi) masked."""
    diag = seqlen_k - seqlen_q
    m1 = m0 + BLOCK_M
    hi = seqlen_k
    full_hi = (seqlen_k // BLOCK_N) * BLOCK_N
    if HAS_RIGHT:
        hi = tl.minimum(hi, m1 + diag + right)
        lim = m0 + diag + right + 1
        full_hi = tl.minimum(full_hi, (tl.maximum(lim, 0) // BLOCK_N) * BLOCK_N)
    hi = tl.maximum(hi, 0)
    lo = 0
    full_lo = 0
    if HAS_LEFT:
        lo = (tl.maximum(m0 + diag - left, 0) // BLOCK_N) * BLOCK_N
        first = tl.maximum(m1 - 1 + diag - left, 0)
        full_lo = ((first + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    lo = tl.minimum(lo, hi)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.maximum(full_hi, full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def _query_ranges(n0, seqlen_q, seqlen_k, left, right, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """For key columns [n0, n0+BLOCK_N): query ranges [lo, full_lo) masked, [full_lo, full_hi)
    full, [full_hi, hi) masked."""
    diag = seqlen_k - seqlen_q
    n1 = n0 + BLOCK_N
    lo = 0
    full_lo = 0
    if HAS_RIGHT:
        lo = (tl.maximum(n0 - diag - right, 0) // BLOCK_M) * BLOCK_M
        first = tl.maximum(n1 - 1 - diag - right, 0)
        full_lo = ((first + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    hi = seqlen_q
    full_hi = (seqlen_q // BLOCK_M) * BLOCK_M
    if HAS_LEFT:
        hi = tl.minimum(hi, n1 - diag + left)
        lim = n0 - diag + left + 1
        full_hi = tl.minimum(full_hi, (tl.maximum(lim, 0) // BLOCK_M) * BLOCK_M)
    hi = tl.maximum(hi, 0)
    # A partial key block is masked everywhere (its padded columns must score -inf).
    full_hi = tl.where(n1 > seqlen_k, 0, full_hi)
    lo = tl.minimum(lo, hi)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.maximum(full_hi, full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def _seq_bounds(CuQ, CuK, b, seqlen_q, seqlen_k, IS_VARLEN: tl.constexpr):
    if IS_VARLEN:
        q_start = tl.load(CuQ + b)
        q_end = tl.load(CuQ + b + 1)
        k_start = tl.load(CuK + b)
        k_end = tl.load(CuK + b + 1)
        return q_start, q_end - q_start, k_start, k_end - k_start
    else:
        zero = tl.program_id(1) * 0  # a tensor zero, so .to(tl.int64) works like the varlen path
        return zero, seqlen_q, zero, seqlen_k


# --------------------------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------------------------


@triton.jit
def _grid_order(REVERSE: tl.constexpr, ACROSS_HEADS: tl.constexpr):
    """(block, batch x head) of this program. The grid is (blocks, batch x heads), or with
    ACROSS_HEADS (``AttnConfig.across_heads``, causal) (batch x heads, blocks): the GPU launches
    a grid's first dimension fastest, so every (batch, head)'s first block then launches before
    any's second, and the grid ends on the shortest blocks of every head (longest-first list
    scheduling), where head after head it ends on the last heads' longest ones with most compute
    units idle. Swapping the dimensions, not dividing a launch index, keeps both numbers reads
    of the program id, which the compiler re-reads instead of holding in registers (a division's
    results spilled 8-16 bytes more in Hopper's d=256 kernels). REVERSE (causal forward and dQ):
    the blocks from the last, whose rows see the most keys."""
    if ACROSS_HEADS:
        pid_m = tl.program_id(1)
        pid_bh = tl.program_id(0)
        blocks = tl.num_programs(1)
    else:
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        blocks = tl.num_programs(0)
    if REVERSE:
        pid_m = blocks - 1 - pid_m
    return pid_m, pid_bh


@triton.jit
def _tail_order(tail, SPLIT: tl.constexpr):
    """(block, batch x head, part, slot) of a forward program whose grid splits its last heads'
    tiles along the keys (``attn_fwd``'s SPLIT). The grid is (blocks, tail + SPLIT x split
    heads): rows below ``tail`` take their (batch x head)'s tiles whole (part -1); the SPLIT rows
    after each take one split head's tiles, part 0..SPLIT-1 of its keys each, and write partial
    results to scratch ``slot`` for ``attn_fwd_merge``. Every number is the program id's and the
    arguments' without a division by a runtime value, so the compiler re-reads it instead of
    holding it through the key loop (the same mapping from a 1-D grid spilled 104 bytes at
    Hopper's d=128)."""
    pid_m = tl.program_id(0)
    row = tl.program_id(1)
    split = row >= tail
    over = tl.maximum(row - tail, 0)
    pid_bh = tl.where(split, tail + over // SPLIT, row)
    part = tl.where(split, over % SPLIT, -1)
    return pid_m, pid_bh, part, over * tl.num_programs(0) + pid_m


@triton.jit
def _part_ranges(lo, full_lo, full_hi, hi, part, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr):
    """``_key_ranges``' ranges cut to key part ``part`` of SPLIT (equal runs of whole key blocks;
    part -1: all of them)."""
    per = tl.cdiv(tl.cdiv(hi - lo, BLOCK_N), SPLIT) * BLOCK_N
    p_lo = tl.where(part < 0, lo, lo + part * per)
    p_hi = tl.where(part < 0, hi, tl.minimum(p_lo + per, hi))
    return (tl.minimum(tl.maximum(lo, p_lo), p_hi), tl.minimum(tl.maximum(full_lo, p_lo), p_hi),
            tl.minimum(tl.maximum(full_hi, p_lo), p_hi), tl.minimum(tl.maximum(hi, p_lo), p_hi))


@triton.jit
def _fwd_step(acc, l_i, m_i, q, k_base, v_base, sk_s, sv_s, n0, offs_m, offs_d, seqlen_k, diag,
              qk_scale, cap_in, cap_out, alibi2, left, right, k0, k1, c3, thresh, bh,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr,
              HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr,
              HAS_RIGHT: tl.constexpr, MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr,
              USE_TMA: tl.constexpr, FIRST: tl.constexpr, FOLD: tl.constexpr,
              D_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """One key block [n0, n0 + BLOCK_N) of the online softmax. FIRST: the block is the first
    one this program reads (acc and l_i are 0, m_i is -inf), so nothing is rescaled.
    D_CHUNK (``AttnConfig.chunk_fwd``): ``q`` is the query rows' pointers ([BLOCK_M, 1], see
    ``attn_fwd``) and Q.K^T is taken D_CHUNK head-dim columns at a time from memory
    (``_mm_chunked``), as the RDNA3/3.5 backward does: a resident d=256 Q tile and K block hold
    2 x 128 VGPRs of WMMA operands there.
    FOLD (no softcap, ALiBi or FP8 descale, and ``qk_scale > 0``): the row maximum is taken of
    the raw products and scaled once per row, so each score costs one FMA, ``qk * qk_scale - m``,
    where it cost a multiply and a subtract (the maximum commutes with a positive scale and
    rounding is monotonic, so m is the same number)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    if D_CHUNK > 0:
        # The loop-dependent zero keeps the query chunks' loads in the key loop (not hoisted
        # out of it, which would make the Q tile resident again).
        qk = _mm_chunked(tl.zeros([BLOCK_M, BLOCK_N], tl.float32), q + _loop_zero(n0), offs_m,
                         0, False, k_base + offs_n[:, None] * sk_s, offs_n, seqlen_k, MASK,
                         HEAD_DIM, BLOCK_D, D_CHUNK, EVEN_D)
    else:
        if USE_TMA:
            k = k_base.load([n0, 0])  # a tensor descriptor: rows past seqlen_k read as zeros
        else:
            k = _load_tile(k_base, offs_n, sk_s, seqlen_k, offs_d, HEAD_DIM, MASK, EVEN_D)
        qk = mm(q, tl.trans(k))
    rel = offs_n[None, :] - offs_m[:, None] - diag
    # FOLD: s holds the raw products (masked: -inf, which stays -inf once scaled by qk_scale > 0).
    s = scores_tile(qk, rel, offs_n[None, :] < seqlen_k, qk_scale, cap_in, cap_out, alibi2, left,
                right, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT, MASK, not FOLD)
    if FOLD:
        s_max = tl.max(s, 1) * qk_scale
    else:
        s_max = tl.max(s, 1)
    if FIRST:
        m_new = s_max
    else:
        m_new = tl.maximum(m_i, s_max)
    if MASK:
        # A row with nothing visible yet keeps m = -inf; shift by 0 to avoid inf - inf.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    if FOLD:
        p = tl.exp2(s * qk_scale - m_use[:, None])
    else:
        p = tl.exp2(s - m_use[:, None])
    if FIRST:
        alpha = 0.0  # unused
    else:
        alpha = tl.exp2(m_i - m_use)
        acc = acc * alpha[:, None]
    if USE_TMA:
        v = v_base.load([n0, 0])
    else:
        v = _load_tile(v_base, offs_n, sv_s, seqlen_k, offs_d, HEAD_DIM, MASK, EVEN_D)
    if HAS_DROPOUT:
        # The softmax sum counts every score; only the product with V sees the dropped ones
        # as 0 (the 1/(1-p) scale is applied to the output once).
        l_i = _row_sum(l_i, alpha, p, FIRST)
        keep = _keep(k0, k1, c3, thresh, bh, offs_m[:, None], offs_n[None, :])
        acc = dot_acc(tl.where(keep, p, 0.0).to(v.dtype), v, acc)
    else:
        acc = dot_acc(_to_operand(p, v.dtype), v, acc)
        l_i = _row_sum(l_i, alpha, p, FIRST)
    return acc, l_i, m_new


@triton.jit
def _row_sum(l_i, alpha, p, FIRST: tl.constexpr):
    """The softmax denominator after a block: rescaled and summed, or only summed for the first."""
    if FIRST:
        return tl.sum(p, 1)
    else:
        return l_i * alpha + tl.sum(p, 1)


@triton.jit
def _fwd_loop(acc, l_i, m_i, q, k_base, v_base, sk_s, sv_s, start, end, offs_m, offs_d, seqlen_k,
              diag, qk_scale, cap_in, cap_out, alibi2, left, right, k0, k1, c3, thresh, bh,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr,
              HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr,
              HAS_RIGHT: tl.constexpr, MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr,
              USE_TMA: tl.constexpr, FOLD: tl.constexpr, D_CHUNK: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    for n0 in tl.range(start, end, BLOCK_N):
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, k_base, v_base, sk_s, sv_s, n0, offs_m, offs_d,
                                  seqlen_k, diag, qk_scale, cap_in, cap_out, alibi2, left, right,
                                  k0, k1, c3, thresh, bh, HEAD_DIM, BLOCK_N, EVEN_D, HAS_SOFTCAP,
                                  HAS_ALIBI, HAS_LEFT, HAS_RIGHT, MASK, HAS_DROPOUT, USE_TMA,
                                  False, FOLD, D_CHUNK, BLOCK_M, BLOCK_D)
    return acc, l_i, m_i


@triton.jit
def _fwd_sdmask(SDMask, bh, max_q, max_k, q, k_base, sk_s, start, end, offs_m, offs_d, seqlen_q,
                seqlen_k, diag, qk_scale, cap_in, cap_out, alibi2, left, right, lse2, k0, k1, c3,
                thresh, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr,
                HAS_RIGHT: tl.constexpr):
    """flash_attn's S_dmask for tests (return_attn_probs with dropout): the normalised
    probability of every visible score, negated where dropout drops it, into a (b, Hq, max_q,
    max_k) fp32 tensor; a second pass over the keys once the LSE is known."""
    offs_n0 = tl.arange(0, BLOCK_N)
    row_base = SDMask + (bh.to(tl.int64) * max_q + offs_m[:, None]) * max_k
    for n0 in tl.range(start, end, BLOCK_N):
        offs_n = n0 + offs_n0
        k = _load_tile(k_base, offs_n, sk_s, seqlen_k, offs_d, HEAD_DIM, True, EVEN_D)
        qk = mm(q, tl.trans(k))
        rel = offs_n[None, :] - offs_m[:, None] - diag
        s = scores_tile(qk, rel, offs_n[None, :] < seqlen_k, qk_scale, cap_in, cap_out, alibi2, left,
                    right, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT, True)
        p = tl.exp2(s - lse2[:, None])
        keep = _keep(k0, k1, c3, thresh, bh, offs_m[:, None], offs_n[None, :])
        ok = (offs_m[:, None] < seqlen_q) & (offs_n[None, :] < seqlen_k)
        tl.store(row_base + offs_n[None, :], tl.where(keep, p, -p), mask=ok)


@triton.jit
def _aligned(s_b, s_s, s_h, ALIGN: tl.constexpr):
    """Strides the launcher divided by ALIGN, multiplied back. Triton proves a stride a multiple
    of 16 only when its value is one, so a head dim such as 40 (its head stride in BSHD, its row
    stride in BHSD) left every q/k/v address unaligned to the compiler: element-wise loads, no
    multi-stage pipelining on NVIDIA (255 registers and 25 KiB of shared memory at d=40 on an
    H100 against 57 KiB at d=64). A constexpr factor gives the compiler the alignment back."""
    if ALIGN > 1:
        return s_b * ALIGN, s_s * ALIGN, s_h * ALIGN
    else:
        return s_b, s_s, s_h


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "left", "right"])
def attn_fwd(
    Q, K, V, Out, LSE, CuQ, CuK, Slopes,
    sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, so_b, so_s, so_h, sl_b, sl_h, sa_b, sa_h,
    seqlen_q, seqlen_k, num_heads_q, group, qk_scale, cap_in, cap_out, left, right,
    Rng, drop_scale, SDMask, DescQ, DescK, DescV,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, REVERSE: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, RETURN_SDMASK: tl.constexpr, IS_FP8: tl.constexpr,
    USE_TMA: tl.constexpr = False, SHORT_KV: tl.constexpr = False,
    STRIDE_ALIGN: tl.constexpr = 1, POS_SCALE: tl.constexpr = True,
    ACROSS_HEADS: tl.constexpr = False, D_CHUNK: tl.constexpr = 0,
    tail=0, Part=None, PartL=None, SPLIT: tl.constexpr = 0,
):
    """Rng/drop_scale (dropout), SDMask (S_dmask) and DescQ/K/V (FP8: fp32 (batch, Hk) descale
    factors, Q's per KV head as flash_attn 3 has them) are None when their variant is off.
    USE_TMA (Hopper): K and V stream through tensor descriptors (TMA) bounded by this sequence's
    rows and HEAD_DIM, whose zero fill replaces the masked loads.
    SHORT_KV: every sequence has at most BLOCK_N keys (the launcher checks the longest), as in
    cross-attention to 77 text tokens: one masked K/V block, no loop, no rescale.
    STRIDE_ALIGN: the q/k/v/out strides arrive divided by it (see ``_aligned``).
    POS_SCALE: ``qk_scale > 0``, so the loop may fold it (``_fwd_step``'s FOLD; the launcher
    passes False for a zero or negative scale, which keeps a multiply per score).
    D_CHUNK (``AttnConfig.chunk_fwd``, RDNA above d=128): Q.K^T D_CHUNK head-dim columns
    at a time from memory (``_fwd_step``); not with USE_TMA."""
    tl.static_assert(D_CHUNK == 0 or not USE_TMA)
    tl.static_assert(SPLIT == 0 or not (IS_VARLEN or HAS_DROPOUT or RETURN_SDMASK or SHORT_KV))
    sq_b, sq_s, sq_h = _aligned(sq_b, sq_s, sq_h, STRIDE_ALIGN)
    sk_b, sk_s, sk_h = _aligned(sk_b, sk_s, sk_h, STRIDE_ALIGN)
    sv_b, sv_s, sv_h = _aligned(sv_b, sv_s, sv_h, STRIDE_ALIGN)
    so_b, so_s, so_h = _aligned(so_b, so_s, so_h, STRIDE_ALIGN)
    if SPLIT > 0:
        pid_m, pid_bh, part, slot = _tail_order(tail, SPLIT)
    else:
        pid_m, pid_bh = _grid_order(REVERSE, ACROSS_HEADS)
        part, slot = -1, 0
    b = pid_bh // num_heads_q
    h = pid_bh % num_heads_q
    hk = h // group
    max_q = seqlen_q
    max_k = seqlen_k
    q_start, seqlen_q, k_start, seqlen_k = _seq_bounds(CuQ, CuK, b, seqlen_q, seqlen_k, IS_VARLEN)
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    b64 = b.to(tl.int64)
    if HAS_DROPOUT:
        k0, k1, c3, thresh = _rng_state(Rng)
    else:
        k0, k1, c3, thresh = 0, 0, 0, 0
    if IS_FP8:
        # Descaling Q and K is one factor on the scores: folded into the scale (and softcap).
        d_idx = b * (num_heads_q // group) + hk
        qk_descale = tl.load(DescQ + d_idx) * tl.load(DescK + d_idx)
        qk_scale = qk_scale * qk_descale
        cap_in = cap_in * qk_descale
    q_base = _base(Q, b64, h, q_start, sq_b, sq_h, sq_s)
    k_base = _base(K, b64, hk, k_start, sk_b, sk_h, sk_s)
    v_base = _base(V, b64, hk, k_start, sv_b, sv_h, sv_s)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    if D_CHUNK > 0:
        # The query rows' pointers, for chunks loaded in the key loop; rows past the sequence
        # read its last row (their results are never stored), so those loads need no row mask.
        q = q_base + tl.minimum(offs_m, seqlen_q - 1)[:, None] * sq_s
    else:
        q = _load_tile(q_base, offs_m, sq_s, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)
    # The scale folding (``_fwd_step``): not with dropout nor in the single-block path, where it
    # saves little and made AMD kernels spill (Triton 3.8, gfx942/gfx950 d=128).
    FOLD: tl.constexpr = (POS_SCALE and not HAS_SOFTCAP and not HAS_ALIBI and not IS_FP8
                          and not HAS_DROPOUT and not SHORT_KV)
    alibi2 = _alibi2(Slopes, b, h, sa_b, sa_h) if HAS_ALIBI else 0.0
    diag = seqlen_k - seqlen_q
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    k_src, v_src = _streams(k_base, sk_s, v_base, sv_s, seqlen_k, USE_TMA, HEAD_DIM, BLOCK_N,
                            BLOCK_D)
    if SHORT_KV:
        lo = 0
        hi = seqlen_k
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, k_src, v_src, sk_s, sv_s, 0, offs_m, offs_d,
                                  seqlen_k, diag, qk_scale, cap_in, cap_out, alibi2, left, right,
                                  k0, k1, c3, thresh, pid_bh, HEAD_DIM, BLOCK_N, EVEN_D,
                                  HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT, True, HAS_DROPOUT,
                                  USE_TMA, True, FOLD, D_CHUNK, BLOCK_M, BLOCK_D)
    else:
        lo, full_lo, full_hi, hi = _key_ranges(m0, seqlen_q, seqlen_k, left, right, BLOCK_M,
                                               BLOCK_N, HAS_LEFT, HAS_RIGHT)
        if SPLIT > 0:
            lo, full_lo, full_hi, hi = _part_ranges(lo, full_lo, full_hi, hi, part, SPLIT, BLOCK_N)
        if HAS_LEFT:
            acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, k_src, v_src, sk_s, sv_s, lo, full_lo,
                                      offs_m, offs_d, seqlen_k, diag, qk_scale, cap_in, cap_out,
                                      alibi2, left, right, k0, k1, c3, thresh, pid_bh, HEAD_DIM,
                                      BLOCK_N, EVEN_D, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT,
                                      True, HAS_DROPOUT, USE_TMA, FOLD, D_CHUNK, BLOCK_M,
                                      BLOCK_D)
        acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, k_src, v_src, sk_s, sv_s, full_lo, full_hi,
                                  offs_m, offs_d, seqlen_k, diag, qk_scale, cap_in, cap_out,
                                  alibi2, left, right, k0, k1, c3, thresh, pid_bh, HEAD_DIM,
                                  BLOCK_N, EVEN_D, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT,
                                  False, HAS_DROPOUT, USE_TMA, FOLD, D_CHUNK, BLOCK_M,
                                  BLOCK_D)
        acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, k_src, v_src, sk_s, sv_s, full_hi, hi,
                                  offs_m, offs_d, seqlen_k, diag, qk_scale, cap_in, cap_out,
                                  alibi2, left, right, k0, k1, c3, thresh, pid_bh, HEAD_DIM,
                                  BLOCK_N, EVEN_D, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT,
                                  True, HAS_DROPOUT, USE_TMA, FOLD, D_CHUNK, BLOCK_M,
                                  BLOCK_D)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    if SPLIT > 0:
        # Read again from the program id, not kept from the top (as timed; the same spills).
        part, slot = _tail_order(tail, SPLIT)[2:]
        if part >= 0:  # a key part: normalised output and log2-LSE to scratch, merged after
            rows = slot.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
            tl.store(_tile(Part, rows, BLOCK_D, offs_d), acc / l_safe[:, None])
            tl.store(PartL + rows, tl.where(empty, float("-inf"), m_i + tl.log2(l_safe)))
            return
    if HAS_DROPOUT:
        out = acc * (drop_scale / l_safe)[:, None]
    elif IS_FP8:
        out = acc * (tl.load(DescV + b * (num_heads_q // group) + hk) / l_safe)[:, None]
    else:
        out = acc / l_safe[:, None]
    lse = tl.where(empty, float("inf"), (m_i + tl.log2(l_safe)) * LN2_C)
    if RETURN_SDMASK:
        lse2 = tl.where(empty, float("inf"), m_i + tl.log2(l_safe))
        if D_CHUNK > 0:  # the tests' S_dmask pass takes the whole tile
            q = _load_tile(q_base, offs_m, sq_s, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)
        _fwd_sdmask(SDMask, pid_bh, max_q, max_k, q, k_base, sk_s, lo, hi, offs_m, offs_d, seqlen_q,
                    seqlen_k, diag, qk_scale, cap_in, cap_out, alibi2, left, right, lse2, k0, k1,
                    c3, thresh, HEAD_DIM, BLOCK_N, EVEN_D, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT,
                    HAS_RIGHT)
    o_base = _base(Out, b64, h, q_start, so_b, so_h, so_s)
    row_ok = offs_m < seqlen_q
    o_ptrs = _tile(o_base, offs_m, so_s, offs_d)
    o_mask = _tile_mask(row_ok, offs_d, HEAD_DIM, EVEN_D)
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=o_mask)
    tl.store(_row_base(LSE, b64, h, q_start, sl_b, sl_h) + offs_m, lse, mask=row_ok)


@triton.jit(do_not_specialize=["seqlen_q", "tail"])
def attn_fwd_merge(
    Out, LSE, Part, PartL, so_b, so_s, so_h, sl_b, sl_h, seqlen_q, num_heads_q, tail,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT: tl.constexpr,
    STRIDE_ALIGN: tl.constexpr = 1,
):
    """The split heads of an ``attn_fwd`` launch with SPLIT (``_tail_order``): program (block,
    j) merges the SPLIT key parts of (batch x head) ``tail + j``'s tile ``block`` (normalised
    outputs and log2-LSEs in Part/PartL) into Out and LSE, as the whole tile would have written
    them. A row no part saw (all -inf) gets 0 and LSE +inf."""
    so_b, so_s, so_h = _aligned(so_b, so_s, so_h, STRIDE_ALIGN)
    pid_m = tl.program_id(0)
    j = tl.program_id(1)
    blocks = tl.num_programs(0)
    pid_bh = tail + j
    b64 = (pid_bh // num_heads_q).to(tl.int64)
    h = pid_bh % num_heads_q
    offs_r = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    # Part p of this tile is at slot (j x SPLIT + p) x blocks + block (``_tail_order``).
    first = ((j * SPLIT).to(tl.int64) * blocks + pid_m) * BLOCK_M
    step = blocks.to(tl.int64) * BLOCK_M
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for p in tl.static_range(SPLIT):
        m = tl.maximum(m, tl.load(PartL + first + p * step + offs_r))
    m_use = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    for p in tl.static_range(SPLIT):
        rows = first + p * step + offs_r
        w = tl.exp2(tl.load(PartL + rows) - m_use)
        acc += tl.load(_tile(Part, rows, BLOCK_D, offs_d)) * w[:, None]
        l_i += w
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    offs_m = pid_m * BLOCK_M + offs_r
    row_ok = offs_m < seqlen_q
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    o_ptrs = _tile(Out + b64 * so_b + h.to(tl.int64) * so_h, offs_m, so_s, offs_d)
    tl.store(o_ptrs, (acc / l_safe[:, None]).to(Out.dtype.element_ty),
             mask=_tile_mask(row_ok, offs_d, HEAD_DIM, EVEN_D))
    lse = tl.where(empty, float("inf"), (m_use + tl.log2(l_safe)) * LN2_C)
    tl.store(_row_base(LSE, b64, h, 0, sl_b, sl_h) + offs_m, lse, mask=row_ok)


# --------------------------------------------------------------------------------------------
# backward
# --------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["seqlen_q"])
def attn_bwd_delta(
    Out, DO, Delta, CuQ, so_b, so_s, so_h, sd_b, sd_s, sd_h, sl_b, sl_h, seqlen_q, num_heads_q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, IS_VARLEN: tl.constexpr,
    STRIDE_ALIGN: tl.constexpr = 1,
):
    """delta = rowsum(O * dO) in fp32, laid out like the LSE: for the dK/dV kernel when dQ is
    accumulated inside it (``ATOMIC_DQ``); otherwise the dQ kernel computes delta itself.
    STRIDE_ALIGN: the O/dO strides arrive divided by it (see ``_aligned``)."""
    so_b, so_s, so_h = _aligned(so_b, so_s, so_h, STRIDE_ALIGN)
    sd_b, sd_s, sd_h = _aligned(sd_b, sd_s, sd_h, STRIDE_ALIGN)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads_q
    h = pid_bh % num_heads_q
    q_start, seqlen_q, _, _ = _seq_bounds(CuQ, CuQ, b, seqlen_q, seqlen_q, IS_VARLEN)
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    b64 = b.to(tl.int64)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o_base = _base(Out, b64, h, q_start, so_b, so_h, so_s)
    do_base = _base(DO, b64, h, q_start, sd_b, sd_h, sd_s)
    o = _load_tile(o_base, offs_m, so_s, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)
    do = _load_tile(do_base, offs_m, sd_s, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(_row_base(Delta, b64, h, q_start, sl_b, sl_h) + offs_m, delta, mask=offs_m < seqlen_q)


@triton.jit
def _dkdv_loop(dk, dv, k, v, k_ptrs, v_ptrs, k_rows, v_rows, q_base, do_base, lse_base,
               delta_base, dq_base, sq_s, sdo_s, sdq_s, start, end, offs_n, offs_d, seqlen_q,
               seqlen_k, diag, qk_scale, cap_in, cap_out, alibi2, left, right, sm_scale,
               k0, k1, c3, thresh, bh, drop_scale,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_D: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr,
               HAS_RIGHT: tl.constexpr, ATOMIC_DQ: tl.constexpr, RELOAD: tl.constexpr,
               MASK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               D_CHUNK: tl.constexpr, HAS_DROPOUT: tl.constexpr, q_src, do_src,
               USE_TMA: tl.constexpr, PART: tl.constexpr, gap_from=0, gap_to=0,
               GAP: tl.constexpr = False):
    """Query blocks [start, end) against the resident key block; with GAP, less [gap_from,
    gap_to) (a whole number of blocks), so that one loop covers the masked blocks on both sides
    of the full ones."""
    offs_m0 = tl.arange(0, BLOCK_M)
    if GAP:
        end = end - (gap_to - gap_from)
    for m0 in tl.range(start, end, BLOCK_M):
        if GAP:
            m0 = m0 + tl.where(m0 >= gap_from, gap_to - gap_from, 0)
        offs_m = m0 + offs_m0
        if D_CHUNK > 0:
            # Head-dim contractions in column chunks straight from memory (see _mm_chunked); the
            # loop-dependent zero keeps the resident K/V chunk loads inside the loop. Q and dO
            # are loaded whole only for the dK/dV products, where WMMA splits their columns
            # across the warps.
            bump = _loop_zero(m0)
            q_rows = q_base + offs_m[:, None] * sq_s
            do_rows = do_base + offs_m[:, None] * sdo_s
            qk_t = _mm_chunked(tl.zeros([BLOCK_N, BLOCK_M], tl.float32), k_rows + bump, offs_n,
                               seqlen_k, True, q_rows, offs_m, seqlen_q, MASK, HEAD_DIM, BLOCK_D,
                               D_CHUNK, EVEN_D)
        else:
            if RELOAD:
                # RDNA3's WMMA keeps a whole K row of an operand per lane, so a resident d=128
                # tile costs 64 VGPRs; re-read it each step (from cache) instead.
                bump = _loop_zero(m0)
                k = _load_rows(k_ptrs + bump, offs_n, seqlen_k, offs_d, HEAD_DIM, True, EVEN_D)
                v = _load_rows(v_ptrs + bump, offs_n, seqlen_k, offs_d, HEAD_DIM, True, EVEN_D)
            if USE_TMA:
                q = q_src.load([m0, 0])
            else:
                q = _load_tile(q_base, offs_m, sq_s, seqlen_q, offs_d, HEAD_DIM, MASK, EVEN_D)
        lse2, delta = _row_stats(lse_base, delta_base, offs_m, seqlen_q, MASK)
        if D_CHUNK == 0:
            qk_t = mm(k, tl.trans(q))  # [BLOCK_N, BLOCK_M]
        rel = offs_n[:, None] - offs_m[None, :] - diag
        s = scores_tile(qk_t, rel, offs_n[:, None] < seqlen_k, qk_scale, cap_in, cap_out, alibi2, left,
                    right, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT, MASK)
        p_t = tl.exp2(s - lse2[None, :])
        if D_CHUNK > 0:
            dp_t = _mm_chunked(tl.zeros([BLOCK_N, BLOCK_M], tl.float32), v_rows + bump, offs_n,
                               seqlen_k, True, do_rows, offs_m, seqlen_q, MASK, HEAD_DIM, BLOCK_D,
                               D_CHUNK, EVEN_D)
            if HAS_DROPOUT:
                keep_t = _keep(k0, k1, c3, thresh, bh, offs_m[None, :], offs_n[:, None])
                dp_t = tl.where(keep_t, dp_t * drop_scale, 0.0)
            ds_t = p_t * (dp_t - delta[None, :])
            if HAS_SOFTCAP:
                t = _tanh(qk_t * cap_in)
                ds_t = ds_t * (1.0 - t * t)
            do = _load_rows(do_rows + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, MASK,
                            EVEN_D)
            if HAS_DROPOUT:
                dv = dot_acc(tl.where(keep_t, p_t * drop_scale, 0.0).to(do.dtype), do, dv)
            else:
                dv = dot_acc(p_t.to(do.dtype), do, dv)
            q = _load_rows(q_rows + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, MASK,
                           EVEN_D)
            ds_lo = ds_t.to(q.dtype)
            dk = dot_acc(ds_lo, q, dk)
            if ATOMIC_DQ:
                k = _load_rows(k_ptrs + bump, offs_n, seqlen_k, offs_d, HEAD_DIM, True, EVEN_D)
        else:
            if USE_TMA:
                do = do_src.load([m0, 0])
            else:
                do = _load_tile(do_base, offs_m, sdo_s, seqlen_q, offs_d, HEAD_DIM, MASK, EVEN_D)
            # PART (see attn_bwd_dkdv): 1 accumulates dV alone, 2 dK alone, 0 both.
            if HAS_DROPOUT:
                # With Z = keep / (1 - p): dV = (P o Z)^T dO and dP = (dO V^T) o Z; delta =
                # rowsum(O o dO) is unchanged because O already carries Z.
                keep_t = _keep(k0, k1, c3, thresh, bh, offs_m[None, :], offs_n[:, None])
                if PART != 2:
                    dv = dot_acc(tl.where(keep_t, p_t * drop_scale, 0.0).to(do.dtype), do, dv)
                if PART != 1:
                    dp_t = tl.where(keep_t, mm(v, tl.trans(do)) * drop_scale, 0.0)
            else:
                if PART != 2:
                    dv = dot_acc(p_t.to(do.dtype), do, dv)
                if PART != 1:
                    dp_t = mm(v, tl.trans(do))
            if PART != 1:
                ds_t = p_t * (dp_t - delta[None, :])
                if HAS_SOFTCAP:
                    t = _tanh(qk_t * cap_in)
                    ds_t = ds_t * (1.0 - t * t)
                ds_lo = ds_t.to(q.dtype)
                dk = dot_acc(ds_lo, q, dk)
        if ATOMIC_DQ:
            dq = mm(tl.trans(ds_lo), k) * sm_scale
            dq_ptrs = _tile(dq_base, offs_m, sdq_s, offs_d)
            dq_mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
            tl.atomic_add(dq_ptrs, dq, mask=dq_mask, sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_tile(Q, K, V, DO, DK, DV, DQ, LSE, Delta, Slopes,
               sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, sdo_b, sdo_s, sdo_h,
               sdk_b, sdk_s, sdk_h, sdv_b, sdv_s, sdv_h, sdq_b, sdq_s, sdq_h, sl_b, sl_h, sa_b, sa_h,
               b, hk, n0, q_start, seqlen_q, k_start, seqlen_k, num_heads_k, group, sm_scale,
               qk_scale, cap_in, cap_out, left, right, Rng, drop_scale,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, ATOMIC_DQ: tl.constexpr,
               RELOAD: tl.constexpr, D_CHUNK: tl.constexpr, HAS_DROPOUT: tl.constexpr,
               USE_TMA: tl.constexpr, PART: tl.constexpr, MASKED_LAST: tl.constexpr):
    """attn_bwd_dkdv's work on the key block from key ``n0`` (strides already divided): dK and
    dV of its BLOCK_N keys over the GQA group's query heads, stored."""
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    b64 = b.to(tl.int64)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_base = _base(K, b64, hk, k_start, sk_b, sk_h, sk_s)
    v_base = _base(V, b64, hk, k_start, sv_b, sv_h, sv_s)
    k_rows = k_base + offs_n[:, None] * sk_s
    k_ptrs = k_rows + offs_d[None, :]
    v_rows = v_base + offs_n[:, None] * sv_s
    v_ptrs = v_rows + offs_d[None, :]
    k = _load_rows(k_ptrs, offs_n, seqlen_k, offs_d, HEAD_DIM, True, EVEN_D)
    if PART == 1:
        v = k  # unused: the dV part needs no dO.V^T
    else:
        v = _load_rows(v_ptrs, offs_n, seqlen_k, offs_d, HEAD_DIM, True, EVEN_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    if HAS_DROPOUT:
        k0, k1, c3, thresh = _rng_state(Rng)
    else:
        k0, k1, c3, thresh = 0, 0, 0, 0
    diag = seqlen_k - seqlen_q
    lo, full_lo, full_hi, hi = _query_ranges(n0, seqlen_q, seqlen_k, left, right, BLOCK_M, BLOCK_N,
                                             HAS_LEFT, HAS_RIGHT)
    for g in range(0, group):
        h = hk * group + g
        h64 = h.to(tl.int64)
        q_base = _base(Q, b64, h64, q_start, sq_b, sq_h, sq_s)
        do_base = _base(DO, b64, h64, q_start, sdo_b, sdo_h, sdo_s)
        dq_base = _base(DQ, b64, h64, q_start, sdq_b, sdq_h, sdq_s)
        lse_base = _row_base(LSE, b64, h64, q_start, sl_b, sl_h)
        delta_base = _row_base(Delta, b64, h64, q_start, sl_b, sl_h)
        alibi2 = _alibi2(Slopes, b, h, sa_b, sa_h) if HAS_ALIBI else 0.0
        bh = b * (num_heads_k * group) + h
        q_src, do_src = _streams(q_base, sq_s, do_base, sdo_s, seqlen_q, USE_TMA, HEAD_DIM,
                                 BLOCK_M, BLOCK_D)
        # The masked blocks below the full ones (a causal or right-window diagonal) come first,
        # or with MASKED_LAST last, in one loop with those above them (GAP steps over the full).
        GAP: tl.constexpr = HAS_RIGHT and MASKED_LAST
        if HAS_RIGHT and not MASKED_LAST:
            dk, dv = _dkdv_loop(dk, dv, k, v, k_ptrs, v_ptrs, k_rows, v_rows, q_base, do_base,
                                lse_base, delta_base, dq_base, sq_s, sdo_s, sdq_s, lo, full_lo,
                                offs_n, offs_d, seqlen_q, seqlen_k, diag, qk_scale, cap_in, cap_out,
                                alibi2, left, right, sm_scale, k0, k1, c3, thresh, bh, drop_scale,
                                HEAD_DIM, BLOCK_M, EVEN_D, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT,
                                HAS_RIGHT, ATOMIC_DQ, RELOAD, True, BLOCK_N, BLOCK_D, D_CHUNK, HAS_DROPOUT,
                                q_src, do_src, USE_TMA, PART)
        dk, dv = _dkdv_loop(dk, dv, k, v, k_ptrs, v_ptrs, k_rows, v_rows, q_base, do_base,
                            lse_base, delta_base, dq_base, sq_s, sdo_s, sdq_s, full_lo, full_hi,
                            offs_n, offs_d, seqlen_q, seqlen_k, diag, qk_scale, cap_in, cap_out,
                            alibi2, left, right, sm_scale, k0, k1, c3, thresh, bh, drop_scale,
                            HEAD_DIM, BLOCK_M, EVEN_D, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT,
                            HAS_RIGHT, ATOMIC_DQ, RELOAD,
                            False, BLOCK_N, BLOCK_D, D_CHUNK, HAS_DROPOUT, q_src, do_src,
                            USE_TMA, PART)
        dk, dv = _dkdv_loop(dk, dv, k, v, k_ptrs, v_ptrs, k_rows, v_rows, q_base, do_base,
                            lse_base, delta_base, dq_base, sq_s, sdo_s, sdq_s,
                            lo if GAP else full_hi, hi,
                            offs_n, offs_d, seqlen_q, seqlen_k, diag, qk_scale, cap_in, cap_out,
                            alibi2, left, right, sm_scale, k0, k1, c3, thresh, bh, drop_scale,
                            HEAD_DIM, BLOCK_M, EVEN_D, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT,
                            HAS_RIGHT, ATOMIC_DQ, RELOAD,
                            True, BLOCK_N, BLOCK_D, D_CHUNK, HAS_DROPOUT, q_src, do_src,
                            USE_TMA, PART, full_lo, full_hi, GAP)
    dk = dk * sm_scale
    st_mask = _tile_mask(offs_n < seqlen_k, offs_d, HEAD_DIM, EVEN_D)
    dk_base = _base(DK, b64, hk, k_start, sdk_b, sdk_h, sdk_s)
    dv_base = _base(DV, b64, hk, k_start, sdv_b, sdv_h, sdv_s)
    if PART != 1:
        tl.store(_tile(dk_base, offs_n, sdk_s, offs_d), dk.to(DK.dtype.element_ty), mask=st_mask)
    if PART != 2:
        tl.store(_tile(dv_base, offs_n, sdv_s, offs_d), dv.to(DV.dtype.element_ty), mask=st_mask)


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "left", "right"])
def attn_bwd_dkdv(
    Q, K, V, DO, DK, DV, DQ, LSE, Delta, CuQ, CuK, Slopes,
    sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, sdo_b, sdo_s, sdo_h,
    sdk_b, sdk_s, sdk_h, sdv_b, sdv_s, sdv_h, sdq_b, sdq_s, sdq_h, sl_b, sl_h, sa_b, sa_h,
    seqlen_q, seqlen_k, num_heads_k, group, sm_scale, qk_scale, cap_in, cap_out, left, right,
    Rng, drop_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    RELOAD: tl.constexpr, D_CHUNK: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    USE_TMA: tl.constexpr = False, STRIDE_ALIGN: tl.constexpr = 1, PART: tl.constexpr = 0,
    MASKED_LAST: tl.constexpr = False, PAIRED: tl.constexpr = False,
    ACROSS_HEADS: tl.constexpr = False,
):
    """One program per (key block, batch, kv head); loops over the GQA group's query heads.
    USE_TMA (Hopper): Q and dO stream through tensor descriptors (see ``attn_fwd``).
    STRIDE_ALIGN: the q/k/v/dO/dK/dV/dQ strides arrive divided by it (see ``_aligned``).
    PART: 0 computes dK and dV; 1 dV alone and 2 dK alone (two launches, ``AttnConfig.split_kv``):
    each program then holds one fp32 accumulator instead of two, for one product more per step
    (Q.K^T in both launches); above d=128 on Hopper the registers this frees let Q/dO stream
    through a two-stage TMA pipeline. Not with D_CHUNK or ATOMIC_DQ.
    MASKED_LAST (``AttnConfig.masked_last``): the full query blocks first, then the masked ones
    of both sides in one loop; else a causal (right-window) diagonal's masked blocks come first,
    the full ones, then the masked tail. On Hopper the causal kernel spilled less this way and
    ran 10-14% faster; on AMD its register use rose (see configs.AttnConfig).
    PAIRED (``AttnConfig.paired_kv``, causal only): each program takes key block ``pid_n`` and its
    mirror from the sequence's end, whose query ranges add up to about the same for every
    program; the grid has half the key blocks. Without it the programs of a causal call run
    from the longest to the shortest in each (batch, kv head), and the last heads' longest ones
    finish alone. ACROSS_HEADS (``AttnConfig.across_heads``, unpaired causal grids): every
    (batch, kv head)'s longest key block launches before any's next one (``_grid_order``)."""
    tl.static_assert(PART == 0 or (D_CHUNK == 0 and not ATOMIC_DQ))
    sq_b, sq_s, sq_h = _aligned(sq_b, sq_s, sq_h, STRIDE_ALIGN)
    sk_b, sk_s, sk_h = _aligned(sk_b, sk_s, sk_h, STRIDE_ALIGN)
    sv_b, sv_s, sv_h = _aligned(sv_b, sv_s, sv_h, STRIDE_ALIGN)
    sdo_b, sdo_s, sdo_h = _aligned(sdo_b, sdo_s, sdo_h, STRIDE_ALIGN)
    sdk_b, sdk_s, sdk_h = _aligned(sdk_b, sdk_s, sdk_h, STRIDE_ALIGN)
    sdv_b, sdv_s, sdv_h = _aligned(sdv_b, sdv_s, sdv_h, STRIDE_ALIGN)
    sdq_b, sdq_s, sdq_h = _aligned(sdq_b, sdq_s, sdq_h, STRIDE_ALIGN)
    pid_n, pid_bh = _grid_order(False, ACROSS_HEADS)  # key block 0 sees the most queries
    b = pid_bh // num_heads_k
    hk = pid_bh % num_heads_k
    q_start, seqlen_q, k_start, seqlen_k = _seq_bounds(CuQ, CuK, b, seqlen_q, seqlen_k, IS_VARLEN)
    if PAIRED:
        # Key blocks pid_n and its mirror from the end: a causal diagonal's longest and shortest
        # query ranges in one program, so that programs weigh alike (the grid is half the key
        # blocks of the longest sequence, rounded up; a middle block runs once).
        mirror = tl.cdiv(seqlen_k, BLOCK_N) - 1 - pid_n
        for j in tl.static_range(2):
            if pid_n + j <= mirror:
                _dkdv_tile(Q, K, V, DO, DK, DV, DQ, LSE, Delta, Slopes,
                           sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, sdo_b, sdo_s,
                           sdo_h, sdk_b, sdk_s, sdk_h, sdv_b, sdv_s, sdv_h, sdq_b, sdq_s, sdq_h,
                           sl_b, sl_h, sa_b, sa_h, b, hk, (pid_n + j * (mirror - pid_n)) * BLOCK_N,
                           q_start, seqlen_q, k_start, seqlen_k, num_heads_k, group, sm_scale,
                           qk_scale, cap_in, cap_out, left, right, Rng, drop_scale,
                           HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                           HAS_ALIBI, ATOMIC_DQ, RELOAD, D_CHUNK, HAS_DROPOUT, USE_TMA, PART,
                           MASKED_LAST)
    else:
        n0 = pid_n * BLOCK_N
        if n0 >= seqlen_k:
            return
        _dkdv_tile(Q, K, V, DO, DK, DV, DQ, LSE, Delta, Slopes,
                   sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, sdo_b, sdo_s, sdo_h,
                   sdk_b, sdk_s, sdk_h, sdv_b, sdv_s, sdv_h, sdq_b, sdq_s, sdq_h, sl_b, sl_h,
                   sa_b, sa_h, b, hk, n0, q_start, seqlen_q, k_start, seqlen_k, num_heads_k,
                   group, sm_scale, qk_scale, cap_in, cap_out, left, right, Rng, drop_scale,
                   HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                   HAS_ALIBI, ATOMIC_DQ, RELOAD, D_CHUNK, HAS_DROPOUT, USE_TMA, PART,
                   MASKED_LAST)


@triton.jit
def _dq_loop(dq, q, do, q_ptrs, do_ptrs, q_rows, do_rows, seqlen_q, lse2, delta, k_base, v_base,
             sk_s, sv_s, start, end, offs_m, offs_d, seqlen_k, diag, qk_scale, cap_in, cap_out,
             alibi2, left, right, k0, k1, c3, thresh, bh, drop_scale,
             HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr,
             HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr,
             HAS_RIGHT: tl.constexpr, RELOAD: tl.constexpr, MASK: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, D_CHUNK: tl.constexpr,
             HAS_DROPOUT: tl.constexpr, k_src, v_src, USE_TMA: tl.constexpr):
    offs_n0 = tl.arange(0, BLOCK_N)
    for n0 in tl.range(start, end, BLOCK_N):
        offs_n = n0 + offs_n0
        if D_CHUNK > 0:
            bump = _loop_zero(n0)
            k_rows = k_base + offs_n[:, None] * sk_s
            qk = _mm_chunked(tl.zeros([BLOCK_M, BLOCK_N], tl.float32), q_rows + bump, offs_m,
                             seqlen_q, True, k_rows, offs_n, seqlen_k, MASK, HEAD_DIM, BLOCK_D,
                             D_CHUNK, EVEN_D)
        else:
            if RELOAD:
                bump = _loop_zero(n0)
                q = _load_rows(q_ptrs + bump, offs_m, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)
                do = _load_rows(do_ptrs + bump, offs_m, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)
            if USE_TMA:
                k = k_src.load([n0, 0])
                v = v_src.load([n0, 0])
            else:
                k = _load_tile(k_base, offs_n, sk_s, seqlen_k, offs_d, HEAD_DIM, MASK, EVEN_D)
                v = _load_tile(v_base, offs_n, sv_s, seqlen_k, offs_d, HEAD_DIM, MASK, EVEN_D)
            qk = mm(q, tl.trans(k))
        rel = offs_n[None, :] - offs_m[:, None] - diag
        s = scores_tile(qk, rel, offs_n[None, :] < seqlen_k, qk_scale, cap_in, cap_out, alibi2, left,
                    right, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT, MASK)
        p = tl.exp2(s - lse2[:, None])
        if D_CHUNK > 0:
            dp = _mm_chunked(tl.zeros([BLOCK_M, BLOCK_N], tl.float32), do_rows + bump, offs_m,
                             seqlen_q, True, v_base + offs_n[:, None] * sv_s, offs_n, seqlen_k,
                             MASK, HEAD_DIM, BLOCK_D, D_CHUNK, EVEN_D)
        else:
            dp = mm(do, tl.trans(v))
        if HAS_DROPOUT:
            keep = _keep(k0, k1, c3, thresh, bh, offs_m[:, None], offs_n[None, :])
            dp = tl.where(keep, dp * drop_scale, 0.0)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            t = _tanh(qk * cap_in)
            ds = ds * (1.0 - t * t)
        if D_CHUNK > 0:
            k = _load_rows(k_rows + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM, MASK,
                           EVEN_D)
        dq = dot_acc(ds.to(k.dtype), k, dq)
    return dq


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "left", "right"])
def attn_bwd_dq(
    Q, K, V, DO, DQ, LSE, Delta, Out, CuQ, CuK, Slopes,
    sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, sdo_b, sdo_s, sdo_h,
    sdq_b, sdq_s, sdq_h, so_b, so_s, so_h, sl_b, sl_h, sa_b, sa_h,
    seqlen_q, seqlen_k, num_heads_q, group, sm_scale, qk_scale, cap_in, cap_out, left, right,
    Rng, drop_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, REVERSE: tl.constexpr,
    RELOAD: tl.constexpr, D_CHUNK: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    USE_TMA: tl.constexpr = False, STRIDE_ALIGN: tl.constexpr = 1,
    ACROSS_HEADS: tl.constexpr = False,
):
    """One program per (query block, batch, query head): dQ without atomics. It also computes
    delta = rowsum(O * dO) of its query rows from the O and dO tiles it loads anyway and stores
    it for the dK/dV kernel launched after it (one launch fewer than a delta kernel: the small
    shapes are bound by host time per launch). USE_TMA (Hopper): K and V stream through tensor
    descriptors (see ``attn_fwd``). STRIDE_ALIGN: the q/k/v/dO/dQ/O strides arrive divided by
    it (see ``_aligned``)."""
    sq_b, sq_s, sq_h = _aligned(sq_b, sq_s, sq_h, STRIDE_ALIGN)
    sk_b, sk_s, sk_h = _aligned(sk_b, sk_s, sk_h, STRIDE_ALIGN)
    sv_b, sv_s, sv_h = _aligned(sv_b, sv_s, sv_h, STRIDE_ALIGN)
    sdo_b, sdo_s, sdo_h = _aligned(sdo_b, sdo_s, sdo_h, STRIDE_ALIGN)
    sdq_b, sdq_s, sdq_h = _aligned(sdq_b, sdq_s, sdq_h, STRIDE_ALIGN)
    so_b, so_s, so_h = _aligned(so_b, so_s, so_h, STRIDE_ALIGN)
    pid_m, pid_bh = _grid_order(REVERSE, ACROSS_HEADS)
    b = pid_bh // num_heads_q
    h = pid_bh % num_heads_q
    hk = h // group
    q_start, seqlen_q, k_start, seqlen_k = _seq_bounds(CuQ, CuK, b, seqlen_q, seqlen_k, IS_VARLEN)
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < seqlen_q
    q_base = _base(Q, b64, h64, q_start, sq_b, sq_h, sq_s)
    do_base = _base(DO, b64, h64, q_start, sdo_b, sdo_h, sdo_s)
    k_base = _base(K, b64, hk, k_start, sk_b, sk_h, sk_s)
    v_base = _base(V, b64, hk, k_start, sv_b, sv_h, sv_s)
    q_rows = q_base + offs_m[:, None] * sq_s
    q_ptrs = q_rows + offs_d[None, :]
    do_rows = do_base + offs_m[:, None] * sdo_s
    do_ptrs = do_rows + offs_d[None, :]
    do = _load_rows(do_ptrs, offs_m, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)
    # Rows past the end load O = dO = 0 (delta 0, not stored), as the delta kernel's do.
    o_base = _base(Out, b64, h64, q_start, so_b, so_h, so_s)
    o = _load_tile(o_base, offs_m, so_s, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(_row_base(Delta, b64, h64, q_start, sl_b, sl_h) + offs_m, delta, mask=row_ok)
    q = _load_rows(q_ptrs, offs_m, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)
    lse_base = _row_base(LSE, b64, h64, q_start, sl_b, sl_h)
    lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * LOG2E_C
    alibi2 = _alibi2(Slopes, b, h, sa_b, sa_h) if HAS_ALIBI else 0.0
    diag = seqlen_k - seqlen_q
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if HAS_DROPOUT:
        k0, k1, c3, thresh = _rng_state(Rng)
    else:
        k0, k1, c3, thresh = 0, 0, 0, 0
    k_src, v_src = _streams(k_base, sk_s, v_base, sv_s, seqlen_k, USE_TMA, HEAD_DIM, BLOCK_N,
                            BLOCK_D)
    lo, full_lo, full_hi, hi = _key_ranges(m0, seqlen_q, seqlen_k, left, right, BLOCK_M, BLOCK_N,
                                           HAS_LEFT, HAS_RIGHT)
    if HAS_LEFT:
        dq = _dq_loop(dq, q, do, q_ptrs, do_ptrs, q_rows, do_rows, seqlen_q, lse2, delta, k_base,
                      v_base, sk_s, sv_s, lo, full_lo, offs_m, offs_d, seqlen_k, diag, qk_scale,
                      cap_in, cap_out, alibi2, left, right, k0, k1, c3, thresh, pid_bh, drop_scale,
                      HEAD_DIM, BLOCK_N, EVEN_D, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT,
                      RELOAD, True, BLOCK_M, BLOCK_D, D_CHUNK, HAS_DROPOUT, k_src, v_src, USE_TMA)
    dq = _dq_loop(dq, q, do, q_ptrs, do_ptrs, q_rows, do_rows, seqlen_q, lse2, delta, k_base,
                  v_base, sk_s, sv_s, full_lo, full_hi, offs_m, offs_d, seqlen_k, diag, qk_scale,
                  cap_in, cap_out, alibi2, left, right, k0, k1, c3, thresh, pid_bh, drop_scale,
                  HEAD_DIM, BLOCK_N, EVEN_D, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT, RELOAD,
                  False, BLOCK_M, BLOCK_D, D_CHUNK, HAS_DROPOUT, k_src, v_src, USE_TMA)
    dq = _dq_loop(dq, q, do, q_ptrs, do_ptrs, q_rows, do_rows, seqlen_q, lse2, delta, k_base,
                  v_base, sk_s, sv_s, full_hi, hi, offs_m, offs_d, seqlen_k, diag, qk_scale,
                  cap_in, cap_out, alibi2, left, right, k0, k1, c3, thresh, pid_bh, drop_scale,
                  HEAD_DIM, BLOCK_N, EVEN_D, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT, RELOAD,
                  True, BLOCK_M, BLOCK_D, D_CHUNK, HAS_DROPOUT, k_src, v_src, USE_TMA)
    dq = dq * sm_scale
    dq_base = _base(DQ, b64, h64, q_start, sdq_b, sdq_h, sdq_s)
    dq_ptrs = _tile(dq_base, offs_m, sdq_s, offs_d)
    dq_mask = _tile_mask(row_ok, offs_d, HEAD_DIM, EVEN_D)
    tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=dq_mask)
