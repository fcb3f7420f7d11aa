"""flash_attn-compatible entry points (``flash_attn_func``, ``flash_attn_varlen_func``) with autograd."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from . import autotune, configs
from ._compat import patch_interpreter
from .flash import LOG2E, _attn_bwd_delta, _attn_bwd_dkdv, _attn_bwd_dq, _attn_fwd

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "attention"]

patch_interpreter()


@dataclass(frozen=True)
class Mask:
    """Visibility parameters: ``rel = j - i - (sk - sq)``; visible when -left <= rel <= right."""

    left: int | None = None
    right: int | None = None
    softcap: float = 0.0


class _Seq:
    """A q/k/v-like tensor seen as (batch, seq, head) strides + unit head-dim stride."""

    def __init__(self, t: torch.Tensor, varlen: bool):
        if t.stride(-1) != 1:
            t = t.contiguous()
        self.t = t
        if varlen:
            self.strides = (0, t.stride(0), t.stride(1))
        else:
            self.strides = (t.stride(0), t.stride(1), t.stride(2))


def _buffer_loads(*tensors) -> bool:
    """Whether Triton's HIP JIT gives these tensors 32-bit buffer-load offsets (<= 2 GiB each)."""
    amd = getattr(getattr(triton, "knobs", None), "amd", None)
    if amd is not None and not getattr(amd, "use_buffer_ops", True):
        return False
    return all(
        t.untyped_storage().nbytes() <= configs.MAX_BUFFER_BYTES for t in tensors if t is not None
    )


def _slopes(alibi_slopes, batch: int, heads: int, device):
    if alibi_slopes is None:
        return None, 0, 0
    a = alibi_slopes.to(device=device, dtype=torch.float32)
    if a.dim() == 1:
        if a.shape[0] != heads:
            raise ValueError(f"alibi_slopes has {a.shape[0]} entries, expected {heads}")
        return a, 0, a.stride(0)
    if tuple(a.shape) != (batch, heads):
        raise ValueError(f"alibi_slopes shape {tuple(a.shape)}, expected ({batch}, {heads})")
    return a, a.stride(0), a.stride(1)


def _common(q, k, v, mask: Mask, scale: float):
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"q must be float16 or bfloat16, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError("q, k and v must share a dtype")
    d = q.shape[-1]
    if d > 256 or k.shape[-1] != d or v.shape[-1] != d:
        raise ValueError(
            f"head dims must match and be <= 256, got {q.shape[-1]}, {k.shape[-1]}, {v.shape[-1]}"
        )
    hq, hk = q.shape[-2], k.shape[-2]
    if hq % hk != 0 or v.shape[-2] != hk:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk})")
    family = configs.device_family(q.device)
    cfg = configs.config_for(family, d)
    hip = configs.is_hip()
    softcap = float(mask.softcap or 0.0)
    if softcap > 0:
        cap_in, cap_out = scale / softcap, softcap * LOG2E
    else:
        cap_in, cap_out = 0.0, 0.0
    return d, hq, hk, cfg, hip, softcap, cap_in, cap_out


def _forward(q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask: Mask, alibi, varlen):
    qs, ks, vs = _Seq(q, varlen), _Seq(k, varlen), _Seq(v, varlen)
    d, hq, hk, cfg, hip, softcap, cap_in, cap_out = _common(qs.t, ks.t, vs.t, mask, scale)
    out = torch.empty(qs.t.shape, dtype=q.dtype, device=q.device)
    os_ = _Seq(out, varlen).strides
    if varlen:
        lse = torch.empty((hq, q.shape[0]), dtype=torch.float32, device=q.device)
        lse_strides = (0, lse.stride(0))
    else:
        lse = torch.empty((batch, hq, max_q), dtype=torch.float32, device=q.device)
        lse_strides = (lse.stride(0), lse.stride(1))
    slopes, sa_b, sa_h = _slopes(alibi, batch, hq, q.device)
    bd = configs.padded_head_dim(d)
    dummy = cu_q if cu_q is not None else out

    def launch(c: configs.AttnConfig):
        t = c.fwd
        grid = (triton.cdiv(max_q, t.block_m), batch * hq)
        _attn_fwd[grid](
            qs.t,
            ks.t,
            vs.t,
            out,
            lse,
            cu_q if varlen else dummy,
            cu_k if varlen else dummy,
            slopes if slopes is not None else lse,
            *qs.strides,
            *ks.strides,
            *vs.strides,
            *os_,
            *lse_strides,
            sa_b,
            sa_h,
            max_q,
            max_k,
            hq,
            hq // hk,
            scale * LOG2E,
            cap_in,
            cap_out,
            mask.left or 0,
            mask.right or 0,
            HEAD_DIM=d,
            BLOCK_D=bd,
            BLOCK_M=t.block_m,
            BLOCK_N=t.block_n,
            IS_VARLEN=varlen,
            HAS_LEFT=mask.left is not None,
            HAS_RIGHT=mask.right is not None,
            HAS_SOFTCAP=softcap > 0,
            HAS_ALIBI=slopes is not None,
            REVERSE=mask.right is not None,
            **t.launch_options(hip),
        )

    key = autotune.key("fwd", q, d, mask, softcap > 0, slopes is not None, varlen)
    launch(autotune.choose(key, cfg, launch))
    return out, lse


def _backward(
    do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, batch, scale, mask: Mask, alibi, varlen,
    grads=None,
):  # fmt: skip
    """dQ, dK, dV; ``grads`` = (dq, dk, dv) to write into (views of one pack: kernels/packed.py)."""
    qs, ks, vs = _Seq(q, varlen), _Seq(k, varlen), _Seq(v, varlen)
    dos, outs = _Seq(do, varlen), _Seq(out, varlen)
    d, hq, hk, cfg, hip, softcap, cap_in, cap_out = _common(qs.t, ks.t, vs.t, mask, scale)
    bd = configs.padded_head_dim(d)
    lse_strides = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    delta = torch.empty_like(lse)
    dk = torch.empty(ks.t.shape, dtype=k.dtype, device=k.device) if grads is None else grads[1]
    dv = torch.empty(vs.t.shape, dtype=v.dtype, device=v.device) if grads is None else grads[2]
    slopes, sa_b, sa_h = _slopes(alibi, batch, hq, q.device)
    dummy = cu_q if cu_q is not None else lse
    cuq = cu_q if varlen else dummy
    cuk = cu_k if varlen else dummy
    sl = slopes if slopes is not None else lse
    flags = dict(
        HEAD_DIM=d,
        BLOCK_D=bd,
        IS_VARLEN=varlen,
        HAS_LEFT=mask.left is not None,
        HAS_RIGHT=mask.right is not None,
        HAS_SOFTCAP=softcap > 0,
        HAS_ALIBI=slopes is not None,
    )
    pre_m = 64
    _attn_bwd_delta[(triton.cdiv(max_q, pre_m), batch * hq)](
        outs.t,
        dos.t,
        delta,
        cuq,
        *outs.strides,
        *dos.strides,
        *lse_strides,
        max_q,
        hq,
        HEAD_DIM=d,
        BLOCK_D=bd,
        BLOCK_M=pre_m,
        IS_VARLEN=varlen,
        num_warps=4 if not configs.device_family(q.device) == "interpreter" else 1,
    )
    dks, dvs = _Seq(dk, varlen).strides, _Seq(dv, varlen).strides
    common = (max_q, max_k)
    scal = (scale, scale * LOG2E, cap_in, cap_out, mask.left or 0, mask.right or 0)

    def launch(c: configs.AttnConfig):
        if c.atomic_dq:
            dq_acc = torch.zeros(qs.t.shape, dtype=torch.float32, device=q.device)
        elif grads is None:
            dq_acc = torch.empty(qs.t.shape, dtype=q.dtype, device=q.device)
        else:
            dq_acc = grads[0]
        if c.chunk_kv or c.chunk_q:  # RDNA3/3.5: chunked only where buffer loads apply
            tensors = (qs.t, ks.t, vs.t, dos.t, dk, dv, dq_acc, lse, delta)
            c = configs.for_tensors(c, _buffer_loads(*tensors))
        dqs = _Seq(dq_acc, varlen).strides
        tk = c.bwd_kv
        _attn_bwd_dkdv[(triton.cdiv(max_k, tk.block_n), batch * hk)](
            qs.t,
            ks.t,
            vs.t,
            dos.t,
            dk,
            dv,
            dq_acc,
            lse,
            delta,
            cuq,
            cuk,
            sl,
            *qs.strides,
            *ks.strides,
            *vs.strides,
            *dos.strides,
            *dks,
            *dvs,
            *dqs,
            *lse_strides,
            sa_b,
            sa_h,
            *common,
            hk,
            hq // hk,
            *scal,
            BLOCK_M=tk.block_m,
            BLOCK_N=tk.block_n,
            ATOMIC_DQ=c.atomic_dq,
            RELOAD=c.reload,
            D_CHUNK=c.chunk_kv,
            **flags,
            **tk.launch_options(hip),
        )
        if c.atomic_dq:
            dq = dq_acc.to(q.dtype) if grads is None else grads[0].copy_(dq_acc)
        else:
            tq = c.bwd_q
            _attn_bwd_dq[(triton.cdiv(max_q, tq.block_m), batch * hq)](
                qs.t,
                ks.t,
                vs.t,
                dos.t,
                dq_acc,
                lse,
                delta,
                cuq,
                cuk,
                sl,
                *qs.strides,
                *ks.strides,
                *vs.strides,
                *dos.strides,
                *dqs,
                *lse_strides,
                sa_b,
                sa_h,
                *common,
                hq,
                hq // hk,
                *scal,
                BLOCK_M=tq.block_m,
                BLOCK_N=tq.block_n,
                REVERSE=mask.right is not None,
                RELOAD=c.reload,
                D_CHUNK=c.chunk_q,
                **flags,
                **tq.launch_options(hip),
            )
            dq = dq_acc
        return dq

    key = autotune.key("bwd", q, d, mask, softcap > 0, slopes is not None, varlen)
    dq = launch(autotune.choose(key, cfg, launch))
    return dq, dk, dv


class _FlashAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen):
        out, lse = _forward(q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi)
        ctx.meta = (max_q, max_k, batch, scale, mask, varlen)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k, alibi = ctx.saved_tensors
        max_q, max_k, batch, scale, mask, varlen = ctx.meta
        dq, dk, dv = _backward(
            dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen
        )
        return dq, dk, dv, None, None, None, None, None, None, None, None, None


def _mask_from_flash_args(causal: bool, window_size, softcap: float) -> Mask:
    left, right = window_size if window_size is not None else (-1, -1)
    left = None if left is None or left < 0 else int(left)
    right = None if right is None or right < 0 else int(right)
    if causal:
        right = 0
    return Mask(left=left, right=right, softcap=float(softcap or 0.0))


def _check_dropout(dropout_p: float):
    if dropout_p and dropout_p > 0.0:
        raise NotImplementedError(
            "attnforge kernels do not implement dropout (dropout_p must be 0)"
        )


def attention(q, k, v, *, scale: float, mask: Mask, alibi_slopes=None):
    """Fixed-length attention on BSHD views with an explicit :class:`Mask`; returns (out, lse)."""
    b, sq = q.shape[0], q.shape[1]
    sk = k.shape[1]
    return _FlashAttn.apply(q, k, v, None, None, sq, sk, b, scale, mask, alibi_slopes, False)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn.flash_attn_func: q (B, Sq, Hq, D), k/v (B, Sk, Hk, D) -> out (B, Sq, Hq, D).

    With ``return_attn_probs`` returns (out, softmax_lse, None): attention probabilities are
    never materialised. ``deterministic`` is accepted; the default dQ path has no atomics.
    """
    _check_dropout(dropout_p)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    mask = _mask_from_flash_args(causal, window_size, softcap)
    out, lse = attention(q, k, v, scale=scale, mask=mask, alibi_slopes=alibi_slopes)
    if return_attn_probs:
        return out, lse, None
    return out


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    """flash_attn.flash_attn_varlen_func: q (total_q, Hq, D), k/v (total_k, Hk, D), int32 cu_seqlens."""
    _check_dropout(dropout_p)
    if block_table is not None:  # paged KV: forward only, through the KV-cache kernel
        from .kvcache import paged_varlen_forward

        return paged_varlen_forward(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
            alibi_slopes=alibi_slopes, return_attn_probs=return_attn_probs, block_table=block_table,
        )  # fmt: skip
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    mask = _mask_from_flash_args(causal, window_size, softcap)
    cu_q = cu_seqlens_q.to(torch.int32)
    cu_k = cu_seqlens_k.to(torch.int32)
    batch = cu_q.numel() - 1
    out, lse = _FlashAttn.apply(
        q,
        k,
        v,
        cu_q,
        cu_k,
        int(max_seqlen_q),
        int(max_seqlen_k),
        batch,
        scale,
        mask,
        alibi_slopes,
        True,
    )
    if return_attn_probs:
        return out, lse, None
    return out
