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
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

# Triton 3.6's interpreter multiplies bf16 tiles wrongly; fp32 operands are exact there (a product
# of two bf16/fp16 values is exact in fp32), so the CPU path upcasts and keeps GPU numerics.
_UPCAST_DOT = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _dot(a, b, acc):
    if _UPCAST_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _mm(a, b):
    if _UPCAST_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b)


@triton.jit
def _tanh(x):
    # exp2-based tanh: portable across the CUDA and HIP backends and the interpreter.
    e = tl.exp2(x * 2.8853900817779268)
    return 1.0 - 2.0 / (e + 1.0)


@triton.jit
def _load_rows(
    ptrs, rows, limit, offs_d, HEAD_DIM: tl.constexpr, ROW_MASK: tl.constexpr, EVEN_D: tl.constexpr
):
    """Load a [rows, BLOCK_D] tile, masking rows >= limit (when ROW_MASK) and padded head dims."""
    if ROW_MASK:
        if EVEN_D:
            t = tl.load(ptrs, mask=rows[:, None] < limit, other=0.0)
        else:
            t = tl.load(
                ptrs, mask=(rows[:, None] < limit) & (offs_d[None, :] < HEAD_DIM), other=0.0
            )
    else:
        if EVEN_D:
            t = tl.load(ptrs)
        else:
            t = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return t


@triton.jit
def _mm_chunked(
    acc,
    a_rows,
    a_idx,
    a_lim,
    A_MASK: tl.constexpr,
    b_rows,
    b_idx,
    b_lim,
    B_MASK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    D_CHUNK: tl.constexpr,
    EVEN_D: tl.constexpr,
):
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
            acc = _dot(a, tl.trans(b), acc)
    return acc


@triton.jit
def _scores(
    qk,
    rel,
    key_ok,
    qk_scale,
    cap_in,
    cap_out,
    alibi2,
    left,
    right,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    MASK: tl.constexpr,
):
    """Base-2 scores of a tile: scale (or softcap), ALiBi, then the visibility mask."""
    if HAS_SOFTCAP:
        s = _tanh(qk * cap_in) * cap_out
    else:
        s = qk * qk_scale
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
def _key_ranges(
    m0,
    seqlen_q,
    seqlen_k,
    left,
    right,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
):
    """For query rows [m0, m0+BLOCK_M): key ranges [lo, full_lo) masked, [full_lo, full_hi) full, [full_hi, hi) masked."""
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
def _query_ranges(
    n0,
    seqlen_q,
    seqlen_k,
    left,
    right,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
):
    """For key columns [n0, n0+BLOCK_N): query ranges [lo, full_lo) masked, [full_lo, full_hi) full, [full_hi, hi) masked."""
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
def _fwd_loop(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    sk_s,
    sv_s,
    start,
    end,
    offs_m,
    offs_d,
    seqlen_k,
    diag,
    qk_scale,
    cap_in,
    cap_out,
    alibi2,
    left,
    right,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    MASK: tl.constexpr,
):
    offs_n0 = tl.arange(0, BLOCK_N)
    for n0 in tl.range(start, end, BLOCK_N):
        offs_n = n0 + offs_n0
        k = _load_rows(
            k_base + offs_n[:, None] * sk_s + offs_d[None, :],
            offs_n,
            seqlen_k,
            offs_d,
            HEAD_DIM,
            MASK,
            EVEN_D,
        )
        qk = _mm(q, tl.trans(k))
        rel = offs_n[None, :] - offs_m[:, None] - diag
        s = _scores(
            qk,
            rel,
            offs_n[None, :] < seqlen_k,
            qk_scale,
            cap_in,
            cap_out,
            alibi2,
            left,
            right,
            HAS_SOFTCAP,
            HAS_ALIBI,
            HAS_LEFT,
            HAS_RIGHT,
            MASK,
        )
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASK:
            # A row with nothing visible yet keeps m = -inf; shift by 0 to avoid inf - inf.
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_use = m_new
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        acc = acc * alpha[:, None]
        v = _load_rows(
            v_base + offs_n[:, None] * sv_s + offs_d[None, :],
            offs_n,
            seqlen_k,
            offs_d,
            HEAD_DIM,
            MASK,
            EVEN_D,
        )
        acc = _dot(p.to(v.dtype), v, acc)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "left", "right"])
def _attn_fwd(
    Q,
    K,
    V,
    Out,
    LSE,
    CuQ,
    CuK,
    Slopes,
    sq_b,
    sq_s,
    sq_h,
    sk_b,
    sk_s,
    sk_h,
    sv_b,
    sv_s,
    sv_h,
    so_b,
    so_s,
    so_h,
    sl_b,
    sl_h,
    sa_b,
    sa_h,
    seqlen_q,
    seqlen_k,
    num_heads_q,
    group,
    qk_scale,
    cap_in,
    cap_out,
    left,
    right,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    REVERSE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    if REVERSE:
        # Causal: the longest rows first, so the tail of the grid is short blocks.
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads_q
    h = pid_bh % num_heads_q
    hk = h // group
    q_start, seqlen_q, k_start, seqlen_k = _seq_bounds(CuQ, CuK, b, seqlen_q, seqlen_k, IS_VARLEN)
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    b64 = b.to(tl.int64)
    q_base = Q + b64 * sq_b + h.to(tl.int64) * sq_h + q_start.to(tl.int64) * sq_s
    k_base = K + b64 * sk_b + hk.to(tl.int64) * sk_h + k_start.to(tl.int64) * sk_s
    v_base = V + b64 * sv_b + hk.to(tl.int64) * sv_h + k_start.to(tl.int64) * sv_s
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_rows(
        q_base + offs_m[:, None] * sq_s + offs_d[None, :],
        offs_m,
        seqlen_q,
        offs_d,
        HEAD_DIM,
        True,
        EVEN_D,
    )
    alibi2 = 0.0
    if HAS_ALIBI:
        alibi2 = tl.load(Slopes + b * sa_b + h * sa_h).to(tl.float32) * 1.4426950408889634
    diag = seqlen_k - seqlen_q
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    lo, full_lo, full_hi, hi = _key_ranges(
        m0, seqlen_q, seqlen_k, left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT
    )
    if HAS_LEFT:
        acc, l_i, m_i = _fwd_loop(
            acc,
            l_i,
            m_i,
            q,
            k_base,
            v_base,
            sk_s,
            sv_s,
            lo,
            full_lo,
            offs_m,
            offs_d,
            seqlen_k,
            diag,
            qk_scale,
            cap_in,
            cap_out,
            alibi2,
            left,
            right,
            HEAD_DIM,
            BLOCK_N,
            EVEN_D,
            HAS_SOFTCAP,
            HAS_ALIBI,
            HAS_LEFT,
            HAS_RIGHT,
            True,
        )
    acc, l_i, m_i = _fwd_loop(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        sk_s,
        sv_s,
        full_lo,
        full_hi,
        offs_m,
        offs_d,
        seqlen_k,
        diag,
        qk_scale,
        cap_in,
        cap_out,
        alibi2,
        left,
        right,
        HEAD_DIM,
        BLOCK_N,
        EVEN_D,
        HAS_SOFTCAP,
        HAS_ALIBI,
        HAS_LEFT,
        HAS_RIGHT,
        False,
    )
    acc, l_i, m_i = _fwd_loop(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        sk_s,
        sv_s,
        full_hi,
        hi,
        offs_m,
        offs_d,
        seqlen_k,
        diag,
        qk_scale,
        cap_in,
        cap_out,
        alibi2,
        left,
        right,
        HEAD_DIM,
        BLOCK_N,
        EVEN_D,
        HAS_SOFTCAP,
        HAS_ALIBI,
        HAS_LEFT,
        HAS_RIGHT,
        True,
    )
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("inf"), (m_i + tl.log2(l_safe)) * 0.6931471805599453)
    o_base = Out + b64 * so_b + h.to(tl.int64) * so_h + q_start.to(tl.int64) * so_s
    row_ok = offs_m < seqlen_q
    o_ptrs = o_base + offs_m[:, None] * so_s + offs_d[None, :]
    if EVEN_D:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(
            o_ptrs,
            out.to(Out.dtype.element_ty),
            mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM),
        )
    l_base = LSE + b64 * sl_b + h.to(tl.int64) * sl_h + q_start
    tl.store(l_base + offs_m, lse, mask=row_ok)


# --------------------------------------------------------------------------------------------
# backward
# --------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["seqlen_q"])
def _attn_bwd_delta(
    Out,
    DO,
    Delta,
    CuQ,
    so_b,
    so_s,
    so_h,
    sd_b,
    sd_s,
    sd_h,
    sl_b,
    sl_h,
    seqlen_q,
    num_heads_q,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """delta = rowsum(O * dO) in fp32, laid out like the LSE."""
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
    o_base = Out + b64 * so_b + h.to(tl.int64) * so_h + q_start.to(tl.int64) * so_s
    do_base = DO + b64 * sd_b + h.to(tl.int64) * sd_h + q_start.to(tl.int64) * sd_s
    o = _load_rows(
        o_base + offs_m[:, None] * so_s + offs_d[None, :],
        offs_m,
        seqlen_q,
        offs_d,
        HEAD_DIM,
        True,
        EVEN_D,
    )
    do = _load_rows(
        do_base + offs_m[:, None] * sd_s + offs_d[None, :],
        offs_m,
        seqlen_q,
        offs_d,
        HEAD_DIM,
        True,
        EVEN_D,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(
        Delta + b64 * sl_b + h.to(tl.int64) * sl_h + q_start + offs_m, delta, mask=offs_m < seqlen_q
    )


@triton.jit
def _dkdv_loop(
    dk,
    dv,
    k,
    v,
    k_ptrs,
    v_ptrs,
    k_rows,
    v_rows,
    q_base,
    do_base,
    lse_base,
    delta_base,
    dq_base,
    sq_s,
    sdo_s,
    sdq_s,
    start,
    end,
    offs_n,
    offs_d,
    seqlen_q,
    seqlen_k,
    diag,
    qk_scale,
    cap_in,
    cap_out,
    alibi2,
    left,
    right,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    EVEN_D: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    RELOAD: tl.constexpr,
    MASK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    D_CHUNK: tl.constexpr,
):
    offs_m0 = tl.arange(0, BLOCK_M)
    for m0 in tl.range(start, end, BLOCK_M):
        offs_m = m0 + offs_m0
        if D_CHUNK > 0:
            # Head-dim contractions in column chunks straight from memory (see _mm_chunked); the
            # zero, loop-dependent offset keeps the resident K/V chunk loads inside the loop.
            # Q and dO are loaded whole only for the dK/dV products, where WMMA splits their
            # columns across the warps.
            bump = m0 // 1073741824
            q_rows = q_base + offs_m[:, None] * sq_s
            do_rows = do_base + offs_m[:, None] * sdo_s
            qk_t = _mm_chunked(
                tl.zeros([BLOCK_N, BLOCK_M], tl.float32),
                k_rows + bump,
                offs_n,
                seqlen_k,
                True,
                q_rows,
                offs_m,
                seqlen_q,
                MASK,
                HEAD_DIM,
                BLOCK_D,
                D_CHUNK,
                EVEN_D,
            )
        else:
            if RELOAD:
                # RDNA3's WMMA keeps a whole K row of an operand per lane, so a resident d=128
                # tile costs 64 VGPRs; re-read it each step (from cache) instead. The offset is
                # zero but depends on the loop variable, so the load is not hoisted again.
                bump = m0 // 1073741824
                k = _load_rows(k_ptrs + bump, offs_n, seqlen_k, offs_d, HEAD_DIM, True, EVEN_D)
                v = _load_rows(v_ptrs + bump, offs_n, seqlen_k, offs_d, HEAD_DIM, True, EVEN_D)
            q = _load_rows(
                q_base + offs_m[:, None] * sq_s + offs_d[None, :],
                offs_m,
                seqlen_q,
                offs_d,
                HEAD_DIM,
                MASK,
                EVEN_D,
            )
        if MASK:
            row_ok = offs_m < seqlen_q
            lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * 1.4426950408889634
            delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        else:
            lse2 = tl.load(lse_base + offs_m) * 1.4426950408889634
            delta = tl.load(delta_base + offs_m)
        if D_CHUNK == 0:
            qk_t = _mm(k, tl.trans(q))  # [BLOCK_N, BLOCK_M]
        rel = offs_n[:, None] - offs_m[None, :] - diag
        s = _scores(
            qk_t,
            rel,
            offs_n[:, None] < seqlen_k,
            qk_scale,
            cap_in,
            cap_out,
            alibi2,
            left,
            right,
            HAS_SOFTCAP,
            HAS_ALIBI,
            HAS_LEFT,
            HAS_RIGHT,
            MASK,
        )
        p_t = tl.exp2(s - lse2[None, :])
        if D_CHUNK > 0:
            dp_t = _mm_chunked(
                tl.zeros([BLOCK_N, BLOCK_M], tl.float32),
                v_rows + bump,
                offs_n,
                seqlen_k,
                True,
                do_rows,
                offs_m,
                seqlen_q,
                MASK,
                HEAD_DIM,
                BLOCK_D,
                D_CHUNK,
                EVEN_D,
            )
            ds_t = p_t * (dp_t - delta[None, :])
            if HAS_SOFTCAP:
                t = _tanh(qk_t * cap_in)
                ds_t = ds_t * (1.0 - t * t)
            do = _load_rows(
                do_rows + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, MASK, EVEN_D
            )
            dv = _dot(p_t.to(do.dtype), do, dv)
            q = _load_rows(
                q_rows + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, MASK, EVEN_D
            )
            ds_lo = ds_t.to(q.dtype)
            dk = _dot(ds_lo, q, dk)
            if ATOMIC_DQ:
                k = _load_rows(k_ptrs + bump, offs_n, seqlen_k, offs_d, HEAD_DIM, True, EVEN_D)
        else:
            do = _load_rows(
                do_base + offs_m[:, None] * sdo_s + offs_d[None, :],
                offs_m,
                seqlen_q,
                offs_d,
                HEAD_DIM,
                MASK,
                EVEN_D,
            )
            dv = _dot(p_t.to(do.dtype), do, dv)
            dp_t = _mm(v, tl.trans(do))
            ds_t = p_t * (dp_t - delta[None, :])
            if HAS_SOFTCAP:
                t = _tanh(qk_t * cap_in)
                ds_t = ds_t * (1.0 - t * t)
            ds_lo = ds_t.to(q.dtype)
            dk = _dot(ds_lo, q, dk)
        if ATOMIC_DQ:
            dq = _mm(tl.trans(ds_lo), k) * sm_scale
            dq_ptrs = dq_base + offs_m[:, None] * sdq_s + offs_d[None, :]
            tl.atomic_add(
                dq_ptrs,
                dq,
                mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM),
                sem="relaxed",
            )
    return dk, dv


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "left", "right"])
def _attn_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    DK,
    DV,
    DQ,
    LSE,
    Delta,
    CuQ,
    CuK,
    Slopes,
    sq_b,
    sq_s,
    sq_h,
    sk_b,
    sk_s,
    sk_h,
    sv_b,
    sv_s,
    sv_h,
    sdo_b,
    sdo_s,
    sdo_h,
    sdk_b,
    sdk_s,
    sdk_h,
    sdv_b,
    sdv_s,
    sdv_h,
    sdq_b,
    sdq_s,
    sdq_h,
    sl_b,
    sl_h,
    sa_b,
    sa_h,
    seqlen_q,
    seqlen_k,
    num_heads_k,
    group,
    sm_scale,
    qk_scale,
    cap_in,
    cap_out,
    left,
    right,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    RELOAD: tl.constexpr,
    D_CHUNK: tl.constexpr,
):
    """One program per (key block, batch, kv head); loops over the GQA group's query heads."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads_k
    hk = pid_bh % num_heads_k
    q_start, seqlen_q, k_start, seqlen_k = _seq_bounds(CuQ, CuK, b, seqlen_q, seqlen_k, IS_VARLEN)
    n0 = pid_n * BLOCK_N
    if n0 >= seqlen_k:
        return
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    b64 = b.to(tl.int64)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_base = K + b64 * sk_b + hk.to(tl.int64) * sk_h + k_start.to(tl.int64) * sk_s
    v_base = V + b64 * sv_b + hk.to(tl.int64) * sv_h + k_start.to(tl.int64) * sv_s
    k_rows = k_base + offs_n[:, None] * sk_s
    k_ptrs = k_rows + offs_d[None, :]
    v_rows = v_base + offs_n[:, None] * sv_s
    v_ptrs = v_rows + offs_d[None, :]
    k = _load_rows(k_ptrs, offs_n, seqlen_k, offs_d, HEAD_DIM, True, EVEN_D)
    v = _load_rows(v_ptrs, offs_n, seqlen_k, offs_d, HEAD_DIM, True, EVEN_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    diag = seqlen_k - seqlen_q
    lo, full_lo, full_hi, hi = _query_ranges(
        n0, seqlen_q, seqlen_k, left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT
    )
    for g in range(0, group):
        h = hk * group + g
        h64 = h.to(tl.int64)
        q_base = Q + b64 * sq_b + h64 * sq_h + q_start.to(tl.int64) * sq_s
        do_base = DO + b64 * sdo_b + h64 * sdo_h + q_start.to(tl.int64) * sdo_s
        dq_base = DQ + b64 * sdq_b + h64 * sdq_h + q_start.to(tl.int64) * sdq_s
        lse_base = LSE + b64 * sl_b + h64 * sl_h + q_start
        delta_base = Delta + b64 * sl_b + h64 * sl_h + q_start
        alibi2 = 0.0
        if HAS_ALIBI:
            alibi2 = tl.load(Slopes + b * sa_b + h * sa_h).to(tl.float32) * 1.4426950408889634
        if HAS_RIGHT:
            dk, dv = _dkdv_loop(
                dk,
                dv,
                k,
                v,
                k_ptrs,
                v_ptrs,
                k_rows,
                v_rows,
                q_base,
                do_base,
                lse_base,
                delta_base,
                dq_base,
                sq_s,
                sdo_s,
                sdq_s,
                lo,
                full_lo,
                offs_n,
                offs_d,
                seqlen_q,
                seqlen_k,
                diag,
                qk_scale,
                cap_in,
                cap_out,
                alibi2,
                left,
                right,
                sm_scale,
                HEAD_DIM,
                BLOCK_M,
                EVEN_D,
                HAS_SOFTCAP,
                HAS_ALIBI,
                HAS_LEFT,
                HAS_RIGHT,
                ATOMIC_DQ,
                RELOAD,
                True,
                BLOCK_N,
                BLOCK_D,
                D_CHUNK,
            )
        dk, dv = _dkdv_loop(
            dk,
            dv,
            k,
            v,
            k_ptrs,
            v_ptrs,
            k_rows,
            v_rows,
            q_base,
            do_base,
            lse_base,
            delta_base,
            dq_base,
            sq_s,
            sdo_s,
            sdq_s,
            full_lo,
            full_hi,
            offs_n,
            offs_d,
            seqlen_q,
            seqlen_k,
            diag,
            qk_scale,
            cap_in,
            cap_out,
            alibi2,
            left,
            right,
            sm_scale,
            HEAD_DIM,
            BLOCK_M,
            EVEN_D,
            HAS_SOFTCAP,
            HAS_ALIBI,
            HAS_LEFT,
            HAS_RIGHT,
            ATOMIC_DQ,
            RELOAD,
            False,
            BLOCK_N,
            BLOCK_D,
            D_CHUNK,
        )
        dk, dv = _dkdv_loop(
            dk,
            dv,
            k,
            v,
            k_ptrs,
            v_ptrs,
            k_rows,
            v_rows,
            q_base,
            do_base,
            lse_base,
            delta_base,
            dq_base,
            sq_s,
            sdo_s,
            sdq_s,
            full_hi,
            hi,
            offs_n,
            offs_d,
            seqlen_q,
            seqlen_k,
            diag,
            qk_scale,
            cap_in,
            cap_out,
            alibi2,
            left,
            right,
            sm_scale,
            HEAD_DIM,
            BLOCK_M,
            EVEN_D,
            HAS_SOFTCAP,
            HAS_ALIBI,
            HAS_LEFT,
            HAS_RIGHT,
            ATOMIC_DQ,
            RELOAD,
            True,
            BLOCK_N,
            BLOCK_D,
            D_CHUNK,
        )
    dk = dk * sm_scale
    row_ok = offs_n < seqlen_k
    if EVEN_D:
        st_mask = row_ok[:, None]
    else:
        st_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    dk_base = DK + b64 * sdk_b + hk.to(tl.int64) * sdk_h + k_start.to(tl.int64) * sdk_s
    dv_base = DV + b64 * sdv_b + hk.to(tl.int64) * sdv_h + k_start.to(tl.int64) * sdv_s
    tl.store(
        dk_base + offs_n[:, None] * sdk_s + offs_d[None, :],
        dk.to(DK.dtype.element_ty),
        mask=st_mask,
    )
    tl.store(
        dv_base + offs_n[:, None] * sdv_s + offs_d[None, :],
        dv.to(DV.dtype.element_ty),
        mask=st_mask,
    )


@triton.jit
def _dq_loop(
    dq,
    q,
    do,
    q_ptrs,
    do_ptrs,
    q_rows,
    do_rows,
    seqlen_q,
    lse2,
    delta,
    k_base,
    v_base,
    sk_s,
    sv_s,
    start,
    end,
    offs_m,
    offs_d,
    seqlen_k,
    diag,
    qk_scale,
    cap_in,
    cap_out,
    alibi2,
    left,
    right,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    RELOAD: tl.constexpr,
    MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    D_CHUNK: tl.constexpr,
):
    offs_n0 = tl.arange(0, BLOCK_N)
    for n0 in tl.range(start, end, BLOCK_N):
        offs_n = n0 + offs_n0
        if D_CHUNK > 0:
            bump = n0 // 1073741824  # zero, but loop-dependent: see _dkdv_loop
            k_rows = k_base + offs_n[:, None] * sk_s
            qk = _mm_chunked(
                tl.zeros([BLOCK_M, BLOCK_N], tl.float32),
                q_rows + bump,
                offs_m,
                seqlen_q,
                True,
                k_rows,
                offs_n,
                seqlen_k,
                MASK,
                HEAD_DIM,
                BLOCK_D,
                D_CHUNK,
                EVEN_D,
            )
        else:
            if RELOAD:
                bump = n0 // 1073741824  # zero, but loop-dependent: see _dkdv_loop
                q = _load_rows(q_ptrs + bump, offs_m, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)
                do = _load_rows(do_ptrs + bump, offs_m, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)
            k = _load_rows(
                k_base + offs_n[:, None] * sk_s + offs_d[None, :],
                offs_n,
                seqlen_k,
                offs_d,
                HEAD_DIM,
                MASK,
                EVEN_D,
            )
            v = _load_rows(
                v_base + offs_n[:, None] * sv_s + offs_d[None, :],
                offs_n,
                seqlen_k,
                offs_d,
                HEAD_DIM,
                MASK,
                EVEN_D,
            )
            qk = _mm(q, tl.trans(k))
        rel = offs_n[None, :] - offs_m[:, None] - diag
        s = _scores(
            qk,
            rel,
            offs_n[None, :] < seqlen_k,
            qk_scale,
            cap_in,
            cap_out,
            alibi2,
            left,
            right,
            HAS_SOFTCAP,
            HAS_ALIBI,
            HAS_LEFT,
            HAS_RIGHT,
            MASK,
        )
        p = tl.exp2(s - lse2[:, None])
        if D_CHUNK > 0:
            dp = _mm_chunked(
                tl.zeros([BLOCK_M, BLOCK_N], tl.float32),
                do_rows + bump,
                offs_m,
                seqlen_q,
                True,
                v_base + offs_n[:, None] * sv_s,
                offs_n,
                seqlen_k,
                MASK,
                HEAD_DIM,
                BLOCK_D,
                D_CHUNK,
                EVEN_D,
            )
        else:
            dp = _mm(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            t = _tanh(qk * cap_in)
            ds = ds * (1.0 - t * t)
        if D_CHUNK > 0:
            k = _load_rows(
                k_rows + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM, MASK, EVEN_D
            )
        dq = _dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "left", "right"])
def _attn_bwd_dq(
    Q,
    K,
    V,
    DO,
    DQ,
    LSE,
    Delta,
    CuQ,
    CuK,
    Slopes,
    sq_b,
    sq_s,
    sq_h,
    sk_b,
    sk_s,
    sk_h,
    sv_b,
    sv_s,
    sv_h,
    sdo_b,
    sdo_s,
    sdo_h,
    sdq_b,
    sdq_s,
    sdq_h,
    sl_b,
    sl_h,
    sa_b,
    sa_h,
    seqlen_q,
    seqlen_k,
    num_heads_q,
    group,
    sm_scale,
    qk_scale,
    cap_in,
    cap_out,
    left,
    right,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    REVERSE: tl.constexpr,
    RELOAD: tl.constexpr,
    D_CHUNK: tl.constexpr,
):
    """One program per (query block, batch, query head): dQ without atomics."""
    pid_m = tl.program_id(0)
    if REVERSE:
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
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
    q_base = Q + b64 * sq_b + h64 * sq_h + q_start.to(tl.int64) * sq_s
    do_base = DO + b64 * sdo_b + h64 * sdo_h + q_start.to(tl.int64) * sdo_s
    k_base = K + b64 * sk_b + hk.to(tl.int64) * sk_h + k_start.to(tl.int64) * sk_s
    v_base = V + b64 * sv_b + hk.to(tl.int64) * sv_h + k_start.to(tl.int64) * sv_s
    q_rows = q_base + offs_m[:, None] * sq_s
    q_ptrs = q_rows + offs_d[None, :]
    do_rows = do_base + offs_m[:, None] * sdo_s
    do_ptrs = do_rows + offs_d[None, :]
    q = _load_rows(q_ptrs, offs_m, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)
    do = _load_rows(do_ptrs, offs_m, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)
    lse_base = LSE + b64 * sl_b + h64 * sl_h + q_start
    delta_base = Delta + b64 * sl_b + h64 * sl_h + q_start
    lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * 1.4426950408889634
    delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
    alibi2 = 0.0
    if HAS_ALIBI:
        alibi2 = tl.load(Slopes + b * sa_b + h * sa_h).to(tl.float32) * 1.4426950408889634
    diag = seqlen_k - seqlen_q
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, full_lo, full_hi, hi = _key_ranges(
        m0, seqlen_q, seqlen_k, left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT
    )
    if HAS_LEFT:
        dq = _dq_loop(
            dq,
            q,
            do,
            q_ptrs,
            do_ptrs,
            q_rows,
            do_rows,
            seqlen_q,
            lse2,
            delta,
            k_base,
            v_base,
            sk_s,
            sv_s,
            lo,
            full_lo,
            offs_m,
            offs_d,
            seqlen_k,
            diag,
            qk_scale,
            cap_in,
            cap_out,
            alibi2,
            left,
            right,
            HEAD_DIM,
            BLOCK_N,
            EVEN_D,
            HAS_SOFTCAP,
            HAS_ALIBI,
            HAS_LEFT,
            HAS_RIGHT,
            RELOAD,
            True,
            BLOCK_M,
            BLOCK_D,
            D_CHUNK,
        )
    dq = _dq_loop(
        dq,
        q,
        do,
        q_ptrs,
        do_ptrs,
        q_rows,
        do_rows,
        seqlen_q,
        lse2,
        delta,
        k_base,
        v_base,
        sk_s,
        sv_s,
        full_lo,
        full_hi,
        offs_m,
        offs_d,
        seqlen_k,
        diag,
        qk_scale,
        cap_in,
        cap_out,
        alibi2,
        left,
        right,
        HEAD_DIM,
        BLOCK_N,
        EVEN_D,
        HAS_SOFTCAP,
        HAS_ALIBI,
        HAS_LEFT,
        HAS_RIGHT,
        RELOAD,
        False,
        BLOCK_M,
        BLOCK_D,
        D_CHUNK,
    )
    dq = _dq_loop(
        dq,
        q,
        do,
        q_ptrs,
        do_ptrs,
        q_rows,
        do_rows,
        seqlen_q,
        lse2,
        delta,
        k_base,
        v_base,
        sk_s,
        sv_s,
        full_hi,
        hi,
        offs_m,
        offs_d,
        seqlen_k,
        diag,
        qk_scale,
        cap_in,
        cap_out,
        alibi2,
        left,
        right,
        HEAD_DIM,
        BLOCK_N,
        EVEN_D,
        HAS_SOFTCAP,
        HAS_ALIBI,
        HAS_LEFT,
        HAS_RIGHT,
        RELOAD,
        True,
        BLOCK_M,
        BLOCK_D,
        D_CHUNK,
    )
    dq = dq * sm_scale
    dq_base = DQ + b64 * sdq_b + h64 * sdq_h + q_start.to(tl.int64) * sdq_s
    dq_ptrs = dq_base + offs_m[:, None] * sdq_s + offs_d[None, :]
    if EVEN_D:
        tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(
            dq_ptrs, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
        )
