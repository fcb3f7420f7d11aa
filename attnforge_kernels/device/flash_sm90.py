"""Hopper kernels in Gluon: FlashAttention-3's warp-specialised schedule for the common cases,
the forward and the dK/dV kernel of the backward.

Triton 3.6 waits on every wgmma as soon as it is issued, so ``attnforge_kernels.device.flash``'s kernels run the
elementwise work and the tensor cores one after the other and stay near 0.8x cuDNN on Hopper
(docs/benchmarks.md). Gluon (``triton.experimental.gluon``) exposes asynchronous wgmma, mbarriers
and warp specialisation. Both kernels use them the way FlashAttention-3 does (Shah et al. 2024,
sections 3.1-3.2): a producer warp streams the tiles that change by TMA into a ring of ``STAGES``
shared-memory stages, each with a "ready" barrier and an "empty" barrier (one arrival per
consumer), and two consumer warpgroups, separate partitions, share them without waiting for each
other, so one's elementwise work overlaps the other's products. ``setmaxnreg`` gives the
consumers 240 registers and the producer 24.

* Forward (``attn_fwd_sm90``): 128 query rows, 64 per consumer, K and V streamed. In each
  consumer Q.K_j^T and P_{j-1}.V_{j-1} are issued together, and the softmax of block j runs while
  P.V is still on the tensor cores (``warpgroup_mma_wait(1)``). In a causal tile both consumers
  walk the key blocks that the tile's last row sees; the first 64 rows walk at most one block more
  than they need, which their causal mask zeroes.
* dK/dV (``attn_bwd_dkdv_sm90``): 128 keys, 64 per consumer, with K and V resident; Q, dO and
  their LSE and delta rows streamed in 64-row blocks over the GQA group's query heads. Each
  consumer computes S^T and dP^T (its keys as rows), so P^T and dS^T come out of the wgmma in
  registers as the A operands of dV += P^T dO and dK += dS^T Q; the row statistics start those
  accumulators, and dV's product runs while dS^T is computed. dQ stays with
  ``attnforge_kernels.device.flash.attn_bwd_dq``, which runs first and also writes the delta rows
  read here.

Scope: bf16/fp16, head dim 128, fixed-length batches, no mask or bottom-right causal, no ALiBi,
softcap, dropout or FP8, tensors TMA can address (``attnforge_kernels.api.flash_attn.tma_ok``).
``attnforge_kernels.api.flash_attn.gluon_forward_ok`` and ``gluon_backward_ok`` decide, and everything else runs
the Triton kernels. Conventions are ``attnforge_kernels.device.flash``'s: base-2 scores, causal
aligned bottom-right, LSE = +inf and O = 0 for rows with no visible key (their P is 0 in the
backward).

Gluon has no CPU interpreter. These kernels are compiled for sm90 on the CPU by the tests
(tests/kernels/test_sm90.py) and checked on an NVIDIA GPU by ``python -m attnforge_kernels.check``,
whose d=128 cases they serve on Hopper.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .configs import FP_FUSION, GLUON_BWD_TILES, GLUON_FWD_HEAD_DIM, gluon_bwd_loader_regs

# TMA copies by the names each Triton has: 3.6 and 3.7 only async_copy_global_to_shared /
# async_copy_shared_to_global, 3.8 adds async_load / async_store beside them, 3.9 keeps only the
# new names (the old ones raise "has been removed").
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

LN2_C = gl.constexpr(0.6931471805599453)
_LOG2E_C = gl.constexpr(1.4426950408889634)

# Measured on an H100 (docs/history/benchmarks-2026.md, "Warp-specialised Gluon forward"): 128-row
# tiles split over two consumer warpgroups, 128-key blocks, three K/V stages (224 KiB of shared
# memory with Q), consumers raised to 240 registers and the producer warp lowered to 24
# (setmaxnreg). Its head dim (128) is configs.GLUON_FWD_HEAD_DIM.
BLOCK_M = 128
BLOCK_N = 128
STAGES = 3
CONSUMER_REGS = 240
# The dK/dV kernel's tiles by head dim, and why they were chosen: configs.GLUON_BWD_TILES.

# The kernels' long argument lists are kept a few to a line by hand, as in
# attnforge_kernels/device/flash.py.
# fmt: off


@gluon.jit
def _barriers(STAGES: gl.constexpr, READY_ARRIVALS: gl.constexpr):
    """The mbarriers of a kernel: one for its resident tiles, and each stage's "ready" (TMA bytes
    plus READY_ARRIVALS arrivals) and "empty" (one arrival per consumer) barriers, initialised."""
    once = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(once, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=READY_ARRIVALS)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()
    return once, ready, empty


@gluon.jit
def _softmax_step(s, m_i, l_i, n0, offs_m, qk_scale, mask_from, seqlen_k, diag,
                  CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """One block's scores -> (P, new m, new l, alpha), masking only blocks at or past mask_from."""
    s = s * qk_scale
    if n0 + BLOCK_N > mask_from:
        offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        ok = offs_n[None, :] < seqlen_k
        if CAUSAL:
            ok = ok & (offs_n[None, :] <= offs_m[:, None] + diag)
        s = gl.where(ok, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    # A row with nothing visible yet keeps m = -inf; shift by 0 to avoid inf - inf.
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _ws_loader(k_desc, v_desc, k_smem, v_smem, ready, empty, n_blocks,
               BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    for j in range(n_blocks):
        st = j % STAGES
        if j >= STAGES:
            mbarrier.wait(empty.index(st), ((j // STAGES) - 1) & 1)
        mbarrier.expect(ready.index(st), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        _tma_load(k_desc, [j * BLOCK_N, 0], ready.index(st), k_smem.index(st))
        _tma_load(v_desc, [j * BLOCK_N, 0], ready.index(st), v_smem.index(st))


@gluon.jit
def _ws_consumer(q_smem, k_smem, v_smem, ready, empty, o_desc, lse_ptr, n_blocks, r0, seqlen_q,
                 seqlen_k, diag, qk_scale, HEAD_DIM: gl.constexpr, HALF_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    mask_from = (seqlen_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        mask_from = gl.minimum(mask_from, gl.maximum(r0 + diag + 1, 0) // BLOCK_N * BLOCK_N)
    offs_m = r0 + gl.arange(0, HALF_M, layout=row_s)
    m_i = gl.full([HALF_M], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.full([HALF_M], 0.0, gl.float32, layout=row_s)
    acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([HALF_M, BLOCK_N], gl.float32, layout=s_layout)
    if n_blocks > 0:
        mbarrier.wait(ready.index(0), 0)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, 0, offs_m, qk_scale, mask_from, seqlen_k,
                                           diag, CAUSAL, BLOCK_N, s_layout)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        for j in range(1, n_blocks):
            st = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(ready.index(st), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)
            o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_tok,))
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, j * BLOCK_N, offs_m, qk_scale,
                                               mask_from, seqlen_k, diag, CAUSAL, BLOCK_N,
                                               s_layout)
            acc, p_old = warpgroup_mma_wait(0, deps=(o_tok, p_op))
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            mbarrier.arrive(empty.index(prev))
        last = (n_blocks - 1) % STAGES
        acc = warpgroup_mma(p_op, v_smem.index(last), acc)
    empty_row = l_i == 0.0
    l_safe = gl.where(empty_row, 1.0, l_i)
    out = acc / gl.convert_layout(l_safe, row_o)[:, None]
    lse = gl.where(empty_row, float("inf"), (m_i + gl.log2(l_safe)) * LN2_C)
    gl.store(lse_ptr + offs_m, lse, mask=offs_m < seqlen_q)
    q_smem.store(out.to(dtype))
    fence_async_shared()
    _tma_store(o_desc, [r0, 0], q_smem)
    tma.store_wait(0)


@gluon.jit(do_not_specialize=["seqlen_q", "seqlen_k"])
def attn_fwd_sm90(
    Q, K, V, Out, LSE,
    sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, so_b, so_s, so_h, sl_b, sl_h,
    seqlen_q, seqlen_k, num_heads_q, group, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, q_layout: gl.constexpr, kv_layout: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr, ACROSS_HEADS: gl.constexpr = False,
):
    HALF_M: gl.constexpr = BLOCK_M // 2
    # ACROSS_HEADS: a (batch x heads, blocks) grid, longest blocks first across heads (flash.py
    # ``_grid_order``).
    if ACROSS_HEADS:
        pid_m = gl.program_id(1)
        pid_bh = gl.program_id(0)
        blocks = gl.num_programs(1)
    else:
        pid_m = gl.program_id(0)
        pid_bh = gl.program_id(1)
        blocks = gl.num_programs(0)
    if CAUSAL:
        pid_m = blocks - 1 - pid_m
    b = pid_bh // num_heads_q
    h = pid_bh % num_heads_q
    hk = h // group
    m0 = pid_m * BLOCK_M
    dtype: gl.constexpr = Q.dtype.element_ty
    b64 = b.to(gl.int64)
    q_base = Q + b64 * sq_b + h.to(gl.int64) * sq_h
    k_base = K + b64 * sk_b + hk.to(gl.int64) * sk_h
    v_base = V + b64 * sv_b + hk.to(gl.int64) * sv_h
    diag = seqlen_k - seqlen_q
    hi = seqlen_k
    if CAUSAL:
        hi = gl.minimum(hi, m0 + BLOCK_M + diag)
    hi = gl.maximum(hi, 0)
    n_blocks = gl.cdiv(hi, BLOCK_N)
    q_desc = tma.make_tensor_descriptor(q_base, [seqlen_q, HEAD_DIM], [sq_s, 1],
                                        [HALF_M, HEAD_DIM], q_layout)
    k_desc = tma.make_tensor_descriptor(k_base, [seqlen_k, HEAD_DIM], [sk_s, 1],
                                        [BLOCK_N, HEAD_DIM], kv_layout)
    v_desc = tma.make_tensor_descriptor(v_base, [seqlen_k, HEAD_DIM], [sv_s, 1],
                                        [BLOCK_N, HEAD_DIM], kv_layout)
    o_desc = tma.make_tensor_descriptor(Out + b64 * so_b + h.to(gl.int64) * so_h,
                                        [seqlen_q, HEAD_DIM], [so_s, 1], [HALF_M, HEAD_DIM],
                                        q_layout)
    q0 = gl.allocate_shared_memory(dtype, [HALF_M, HEAD_DIM], q_layout)
    q1 = gl.allocate_shared_memory(dtype, [HALF_M, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    q_bar, ready, empty = _barriers(STAGES, 1)
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    _tma_load(q_desc, [m0, 0], q_bar, q0)
    _tma_load(q_desc, [m0 + HALF_M, 0], q_bar, q1)
    mbarrier.wait(q_bar, 0)
    lse_ptr = LSE + b64 * sl_b + h.to(gl.int64) * sl_h
    gl.warp_specialize([
        (_ws_consumer, (q0, k_smem, v_smem, ready, empty, o_desc, lse_ptr, n_blocks, m0, seqlen_q,
                        seqlen_k, diag, qk_scale, HEAD_DIM, HALF_M, BLOCK_N, STAGES, CAUSAL)),
        (_ws_consumer, (q1, k_smem, v_smem, ready, empty, o_desc, lse_ptr, n_blocks, m0 + HALF_M,
                        seqlen_q, seqlen_k, diag, qk_scale, HEAD_DIM, HALF_M, BLOCK_N, STAGES,
                        CAUSAL)),
        (_ws_loader, (k_desc, v_desc, k_smem, v_smem, ready, empty, n_blocks, BLOCK_N, STAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])




# --------------------------------------------------------------------------------------------
# backward: dK and dV
# --------------------------------------------------------------------------------------------


@gluon.jit
def _bwd_loader(Q, DO, LSE, Delta, q_smem, do_smem, stats, ready, empty, b64, hk, group, sq_b,
                sq_s, sq_h, sdo_b, sdo_s, sdo_h, sl_b, sl_h, seqlen_q, lo, n_m,
                HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                q_layout: gl.constexpr):
    """Streams the group's (Q, dO) blocks by TMA and their LSE and delta rows into ``stats``;
    a stage is ready after the TMA bytes and this warp's arrival (after its stats stores)."""
    stat_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    for g in range(group):
        h = (hk * group + g).to(gl.int64)
        q_desc = tma.make_tensor_descriptor(Q + b64 * sq_b + h * sq_h, [seqlen_q, HEAD_DIM],
                                            [sq_s, 1], [BLOCK_M, HEAD_DIM], q_layout)
        do_desc = tma.make_tensor_descriptor(DO + b64 * sdo_b + h * sdo_h, [seqlen_q, HEAD_DIM],
                                             [sdo_s, 1], [BLOCK_M, HEAD_DIM], q_layout)
        for i in range(n_m):
            t = g * n_m + i
            st = t % STAGES
            if t >= STAGES:
                mbarrier.wait(empty.index(st), ((t // STAGES) - 1) & 1)
            mbarrier.expect(ready.index(st), 2 * q_desc.block_type.nbytes)
            m0 = lo + i * BLOCK_M
            _tma_load(q_desc, [m0, 0], ready.index(st), q_smem.index(st))
            _tma_load(do_desc, [m0, 0], ready.index(st), do_smem.index(st))
            # Rows past the end, which TMA zero-fills, read LSE = +inf (P = 0) and delta = 0.
            offs = m0 + gl.arange(0, BLOCK_M, layout=stat_layout)
            ok = offs < seqlen_q
            row0 = b64 * sl_b + h * sl_h
            stats.index(2 * st).store(gl.load(LSE + row0 + offs, mask=ok, other=float("inf")))
            stats.index(2 * st + 1).store(gl.load(Delta + row0 + offs, mask=ok, other=0.0))
            mbarrier.arrive(ready.index(st))


@gluon.jit
def _bwd_consumer(k_smem, v_smem, q_smem, do_smem, stats, ready, empty, dk_desc, dv_desc, n_steps,
                  n_m, lo, n0, diag, qk_scale, sm_scale, HEAD_DIM: gl.constexpr,
                  HALF_N: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr):
    """dK and dV of this consumer's HALF_N keys (from row n0), over the loader's n_steps
    (query head, query block) stages."""
    dtype: gl.constexpr = q_smem.dtype
    # Transposed scores: this consumer's HALF_N keys are the rows, so P^T and dS^T come out of
    # the wgmma in registers, ready to be the A operands of dV += P^T dO and dK += dS^T Q.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    col: gl.constexpr = gl.SliceLayout(0, s_layout)
    row: gl.constexpr = gl.SliceLayout(1, s_layout)
    dk = gl.zeros([HALF_N, HEAD_DIM], gl.float32, layout=acc_layout)
    dv = gl.zeros([HALF_N, HEAD_DIM], gl.float32, layout=acc_layout)
    s_zero = gl.zeros([HALF_N, BLOCK_M], gl.float32, layout=s_layout)
    offs_n = n0 + gl.arange(0, HALF_N, layout=row)
    inv_scale = 1.0 / sm_scale
    # Query blocks starting before this row hold rows that do not see all of these keys.
    mask_below = n0 + HALF_N - diag
    # One flat loop over (query head of the group, query block), as the loader streams them.
    for t in range(n_steps):
        st = t % STAGES
        m0 = lo + (t % n_m) * BLOCK_M
        mbarrier.wait(ready.index(st), (t // STAGES) & 1)
        # The row statistics start the accumulators, so they hold no registers of their own
        # while the products run: S^T - LSE / scale, and dP^T - delta.
        s_acc = s_zero - (stats.index(2 * st).load(col) * inv_scale)[None, :]
        dp_acc = s_zero - stats.index(2 * st + 1).load(col)[None, :]
        s_tok = warpgroup_mma(k_smem, q_smem.index(st).permute((1, 0)), s_acc, is_async=True)
        dp_tok = warpgroup_mma(v_smem, do_smem.index(st).permute((1, 0)), dp_acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        p = gl.exp2(s * qk_scale)
        if CAUSAL:
            if m0 < mask_below:
                offs_m = m0 + gl.arange(0, BLOCK_M, layout=col)
                p = gl.where(offs_n[:, None] <= offs_m[None, :] + diag, p, 0.0)
        p_op = gl.convert_layout(p.to(dtype), op_layout)
        # dV += P^T dO runs on the tensor cores while dS^T is computed.
        dv_tok = warpgroup_mma(p_op, do_smem.index(st), dv, is_async=True)
        dp = warpgroup_mma_wait(1, deps=(dp_tok,))
        ds_op = gl.convert_layout((p * dp).to(dtype), op_layout)
        dk_tok = warpgroup_mma(ds_op, q_smem.index(st), dk, is_async=True)
        dv, dk, _p, _ds = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, p_op, ds_op))
        mbarrier.arrive(empty.index(st))
    dk = dk * sm_scale
    # This consumer's K and V halves are read by nothing else now: they stage dK and dV out.
    k_smem.store(dk.to(dtype))
    v_smem.store(dv.to(dtype))
    fence_async_shared()
    _tma_store(dk_desc, [n0, 0], k_smem)
    _tma_store(dv_desc, [n0, 0], v_smem)
    tma.store_wait(0)


@gluon.jit(do_not_specialize=["seqlen_q", "seqlen_k"])
def attn_bwd_dkdv_sm90(
    Q, K, V, DO, DK, DV, LSE, Delta,
    sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, sdo_b, sdo_s, sdo_h,
    sdk_b, sdk_s, sdk_h, sdv_b, sdv_s, sdv_h, sl_b, sl_h,
    seqlen_q, seqlen_k, num_heads_k, group, sm_scale, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, q_layout: gl.constexpr, kv_layout: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr, num_warps: gl.constexpr,
    ACROSS_HEADS: gl.constexpr = False,
):
    """One program per (BLOCK_N keys, batch, kv head), walking the GQA group's query heads.
    ACROSS_HEADS: a (batch x kv heads, key blocks) grid (flash.py ``_grid_order``)."""
    HALF_N: gl.constexpr = BLOCK_N // 2
    if ACROSS_HEADS:
        pid_n = gl.program_id(1)
        pid_bh = gl.program_id(0)
    else:
        pid_n = gl.program_id(0)
        pid_bh = gl.program_id(1)
    b = pid_bh // num_heads_k
    hk = pid_bh % num_heads_k
    n0 = pid_n * BLOCK_N
    dtype: gl.constexpr = Q.dtype.element_ty
    b64 = b.to(gl.int64)
    hk64 = hk.to(gl.int64)
    diag = seqlen_k - seqlen_q
    lo = 0
    if CAUSAL:
        # Query row m sees key n when n <= m + diag: rows before n0 - diag see none of these.
        lo = gl.maximum(n0 - diag, 0) // BLOCK_M * BLOCK_M
    n_m = gl.cdiv(gl.maximum(seqlen_q - lo, 0), BLOCK_M)
    k_desc = tma.make_tensor_descriptor(K + b64 * sk_b + hk64 * sk_h, [seqlen_k, HEAD_DIM],
                                        [sk_s, 1], [HALF_N, HEAD_DIM], kv_layout)
    v_desc = tma.make_tensor_descriptor(V + b64 * sv_b + hk64 * sv_h, [seqlen_k, HEAD_DIM],
                                        [sv_s, 1], [HALF_N, HEAD_DIM], kv_layout)
    dk_desc = tma.make_tensor_descriptor(DK + b64 * sdk_b + hk64 * sdk_h, [seqlen_k, HEAD_DIM],
                                         [sdk_s, 1], [HALF_N, HEAD_DIM], kv_layout)
    dv_desc = tma.make_tensor_descriptor(DV + b64 * sdv_b + hk64 * sdv_h, [seqlen_k, HEAD_DIM],
                                         [sdv_s, 1], [HALF_N, HEAD_DIM], kv_layout)
    k0 = gl.allocate_shared_memory(dtype, [HALF_N, HEAD_DIM], kv_layout)
    k1 = gl.allocate_shared_memory(dtype, [HALF_N, HEAD_DIM], kv_layout)
    v0 = gl.allocate_shared_memory(dtype, [HALF_N, HEAD_DIM], kv_layout)
    v1 = gl.allocate_shared_memory(dtype, [HALF_N, HEAD_DIM], kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    stats = gl.allocate_shared_memory(gl.float32, [2 * STAGES, BLOCK_M],
                                      gl.SwizzledSharedLayout(1, 1, 1, [0]))
    # A stage is ready after its TMA bytes and the loader's arrival (after its stats stores).
    kv_bar, ready, empty = _barriers(STAGES, 2)
    mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes)
    _tma_load(k_desc, [n0, 0], kv_bar, k0)
    _tma_load(k_desc, [n0 + HALF_N, 0], kv_bar, k1)
    _tma_load(v_desc, [n0, 0], kv_bar, v0)
    _tma_load(v_desc, [n0 + HALF_N, 0], kv_bar, v1)
    mbarrier.wait(kv_bar, 0)
    gl.warp_specialize([
        (_bwd_consumer, (k0, v0, q_smem, do_smem, stats, ready, empty, dk_desc, dv_desc,
                         group * n_m, n_m, lo, n0, diag, qk_scale, sm_scale, HEAD_DIM, HALF_N,
                         BLOCK_M, STAGES, CAUSAL)),
        (_bwd_consumer, (k1, v1, q_smem, do_smem, stats, ready, empty, dk_desc, dv_desc,
                         group * n_m, n_m, lo, n0 + HALF_N, diag, qk_scale, sm_scale, HEAD_DIM,
                         HALF_N, BLOCK_M, STAGES, CAUSAL)),
        (_bwd_loader, (Q, DO, LSE, Delta, q_smem, do_smem, stats, ready, empty, b64, hk, group,
                       sq_b, sq_s, sq_h, sdo_b, sdo_s, sdo_h, sl_b, sl_h, seqlen_q, lo, n_m,
                       HEAD_DIM, BLOCK_M, STAGES, q_layout)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


# fmt: on


def smem_layouts(dtype) -> tuple:
    """The kernel's ``q_layout`` (a consumer's half of Q, and its O) and ``kv_layout`` (one K or
    V stage) for a Gluon dtype: what ``launch`` passes and ``attnforge_kernels.aot`` compiles
    with."""
    return (
        gl.NVMMASharedLayout.get_default_for([BLOCK_M // 2, GLUON_FWD_HEAD_DIM], dtype),
        gl.NVMMASharedLayout.get_default_for([BLOCK_N, GLUON_FWD_HEAD_DIM], dtype),
    )


def launch(
    q, k, v, out, lse, scale_log2: float, causal: bool, across: bool = False, wrap=None
) -> None:
    """Run the kernel on BSHD tensors ``q`` (b, sq, hq, 128), ``k``/``v`` (b, sk, hk, 128), writing
    ``out`` (like q) and ``lse`` (b, hq, sq) fp32. The caller has checked the scope (module
    docstring) and set Triton's allocator for the in-kernel descriptors. ``across``: the
    programs launch longest first across heads (``ACROSS_HEADS``). ``wrap``: applied to the
    kernel before its ``[grid](...)`` launch (the caller records the launch for
    ``attnforge_kernels.launch.plans``' plans), as ``launch_bwd_dkdv``'s."""
    b, sq, hq, _ = q.shape
    sk, hk = k.shape[1], k.shape[2]
    q_layout, kv_layout = smem_layouts(gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16)
    grid = (b * hq, triton.cdiv(sq, BLOCK_M)) if across else (triton.cdiv(sq, BLOCK_M), b * hq)
    kernel = attn_fwd_sm90 if wrap is None else wrap(attn_fwd_sm90)
    kernel[grid](
        q, k, v, out, lse,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1), sq, sk, hq, hq // hk, scale_log2,
        HEAD_DIM=GLUON_FWD_HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGES=STAGES,
        CAUSAL=causal, q_layout=q_layout, kv_layout=kv_layout, CONSUMER_REGS=CONSUMER_REGS,
        num_warps=4, enable_fp_fusion=FP_FUSION, ACROSS_HEADS=across,
    )  # fmt: skip


def bwd_layouts(dtype, head_dim: int) -> tuple:
    """The dK/dV kernel's ``q_layout`` (one Q or dO stage) and ``kv_layout`` (a consumer's half
    of K, V, dK or dV) for a Gluon dtype and a head dim of ``GLUON_BWD_TILES``."""
    block_m, block_n, _ = GLUON_BWD_TILES[head_dim]
    return (
        gl.NVMMASharedLayout.get_default_for([block_m, head_dim], dtype),
        gl.NVMMASharedLayout.get_default_for([block_n // 2, head_dim], dtype),
    )


def launch_bwd_dkdv(
    q, k, v, do, dk, dv, lse, delta, scale: float, causal: bool, wrap=None, across: bool = False
) -> None:
    """Write ``dk`` and ``dv`` (like k, v) from BSHD ``q``/``do`` (b, sq, hq, d), ``k``/``v``
    (b, sk, hk, d), d in ``GLUON_BWD_TILES``, and the forward's ``lse`` with
    ``delta`` = rowsum(O * dO) (b, hq, sq) fp32. Same preconditions as ``launch``. ``wrap``:
    applied to the kernel before its ``[grid](...)`` launch (the caller records the launch for
    ``attnforge_kernels.launch.plans``'s plans). ``across``: as ``launch``'s."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    block_m, block_n, stages = GLUON_BWD_TILES[d]
    dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    q_layout, kv_layout = bwd_layouts(dtype, d)
    grid = (b * hk, triton.cdiv(sk, block_n)) if across else (triton.cdiv(sk, block_n), b * hk)
    kernel = attn_bwd_dkdv_sm90 if wrap is None else wrap(attn_bwd_dkdv_sm90)
    kernel[grid](
        q, k, v, do, dk, dv, lse, delta,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
        dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
        lse.stride(0), lse.stride(1), sq, sk, hk, hq // hk, scale, scale * 1.4426950408889634,
        HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
        q_layout=q_layout, kv_layout=kv_layout, CONSUMER_REGS=CONSUMER_REGS,
        LOADER_REGS=gluon_bwd_loader_regs(d, causal), num_warps=4, enable_fp_fusion=FP_FUSION,
        ACROSS_HEADS=across,
    )  # fmt: skip
