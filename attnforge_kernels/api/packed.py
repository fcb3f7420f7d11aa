"""flash_attn's packed entry points: q, k, v (or k, v) stacked in one tensor.

``flash_attn_qkvpacked_func``, ``flash_attn_kvpacked_func``, ``flash_attn_varlen_qkvpacked_func``
and ``flash_attn_varlen_kvpacked_func`` with flash_attn 2.x's signatures and gradient layout
(Dao-AILab/flash-attention, flash_attn/flash_attn_interface.py, read 2026-11-24). The forward
reads q, k and v as strided views of the packed tensor (no copy); the backward allocates one
packed gradient and the backward kernels write dQ, dK and dV straight into its views, so the
gradient comes back packed without a stack or cat.
"""

from __future__ import annotations

import math

import torch

from .arguments import AttnResult
from .errors import ArgumentError
from .flash_attn import dropout_state, mask_from_flash_args, run_backward, run_forward

__all__ = [
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
]


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    # The kernels address every tensor with a unit head-dim stride; views of such a pack keep it.
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_pack(t: torch.Tensor, name: str, dim: int, n: int, shape: str) -> None:
    if t.dim() != dim or t.shape[dim - 3] != n:
        raise ArgumentError(f"{name} must be {shape}, got shape {tuple(t.shape)}")


class _QKVPacked(torch.autograd.Function):
    """Attention over a (b, s, 3, h, d) or (total, 3, h, d) pack; the gradient is one pack."""

    @staticmethod
    def forward(ctx, qkv, cu, max_s, batch, scale, mask, alibi, varlen, drop):
        q, k, v = qkv.unbind(-3)
        out, lse = run_forward(
            q, k, v, cu, cu, max_s, max_s, batch, scale, mask, alibi, varlen, drop=drop
        )
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(qkv, out, lse, cu, alibi)
        ctx.meta = (max_s, batch, scale, mask, varlen, drop)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        qkv, out, lse, cu, alibi = ctx.saved_tensors
        max_s, batch, scale, mask, varlen, drop = ctx.meta
        dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
        q, k, v = qkv.unbind(-3)
        run_backward(
            dout, q, k, v, out, lse, cu, cu, max_s, max_s, batch, scale, mask, alibi, varlen,
            grads=dqkv.unbind(-3), drop=drop,
        )  # fmt: skip
        return dqkv, None, None, None, None, None, None, None, None


class _KVPacked(torch.autograd.Function):
    """Attention of q against a (b, s, 2, hk, d) or (total, 2, hk, d) pack; dK/dV one pack."""

    @staticmethod
    def forward(ctx, q, kv, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop):
        k, v = kv.unbind(-3)
        out, lse = run_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop=drop
        )
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, kv, out, lse, cu_q, cu_k, alibi)
        ctx.meta = (max_q, max_k, batch, scale, mask, varlen, drop)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, kv, out, lse, cu_q, cu_k, alibi = ctx.saved_tensors
        max_q, max_k, batch, scale, mask, varlen, drop = ctx.meta
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dkv = torch.empty(kv.shape, dtype=kv.dtype, device=kv.device)
        k, v = kv.unbind(-3)
        dk, dv = dkv.unbind(-3)
        run_backward(
            dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen,
            grads=(dq, dk, dv), drop=drop,
        )  # fmt: skip
        return dq, dkv, None, None, None, None, None, None, None, None, None, None


def _scale(softmax_scale, d: int) -> float:
    return softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)


def _result(out, lse, drop, return_attn_probs: bool):
    """flash_attn's return: out, or (out, softmax_lse, S_dmask) with S_dmask None without dropout."""
    if return_attn_probs:
        return out, lse, drop.sdmask if drop is not None else None
    return out


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> AttnResult:
    """flash_attn.flash_attn_qkvpacked_func: qkv (B, S, 3, H, D) -> out (B, S, H, D).

    The gradient of ``qkv`` is one (B, S, 3, H, D) tensor. For MQA/GQA use the kvpacked form.
    """
    _check_pack(qkv, "qkv", 5, 3, "(batch, seqlen, 3, heads, head_dim)")
    qkv = _unit_last(qkv)
    b, s, h = qkv.shape[0], qkv.shape[1], qkv.shape[3]
    mask = mask_from_flash_args(causal, window_size, softcap)
    scale = _scale(softmax_scale, qkv.shape[-1])
    drop = dropout_state(qkv, dropout_p, b, h, s, s, return_attn_probs)
    out, lse = _QKVPacked.apply(qkv, None, s, b, scale, mask, alibi_slopes, False, drop)
    return _result(out, lse, drop, return_attn_probs)


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> AttnResult:
    """flash_attn.flash_attn_kvpacked_func: q (B, Sq, Hq, D), kv (B, Sk, 2, Hk, D) -> out
    (B, Sq, Hq, D); MQA/GQA when Hk divides Hq. The gradient of ``kv`` is one pack."""
    _check_pack(kv, "kv", 5, 2, "(batch, seqlen_k, 2, heads_k, head_dim)")
    q, kv = _unit_last(q), _unit_last(kv)
    mask = mask_from_flash_args(causal, window_size, softcap)
    scale = _scale(softmax_scale, q.shape[-1])
    b, sq, hq, sk = q.shape[0], q.shape[1], q.shape[2], kv.shape[1]
    drop = dropout_state(q, dropout_p, b, hq, sq, sk, return_attn_probs)
    out, lse = _KVPacked.apply(q, kv, None, None, sq, sk, b, scale, mask, alibi_slopes, False, drop)
    return _result(out, lse, drop, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> AttnResult:
    """flash_attn.flash_attn_varlen_qkvpacked_func: qkv (total, 3, H, D), int32 cu_seqlens
    (batch + 1,) -> out (total, H, D); with ``return_attn_probs`` the LSE is (H, total)."""
    _check_pack(qkv, "qkv", 4, 3, "(total, 3, heads, head_dim)")
    qkv = _unit_last(qkv)
    cu = cu_seqlens.to(torch.int32)
    mask = mask_from_flash_args(causal, window_size, softcap)
    scale = _scale(softmax_scale, qkv.shape[-1])
    batch, max_s = cu.numel() - 1, int(max_seqlen)
    drop = dropout_state(qkv, dropout_p, batch, qkv.shape[2], max_s, max_s, return_attn_probs)
    out, lse = _QKVPacked.apply(qkv, cu, max_s, batch, scale, mask, alibi_slopes, True, drop)
    return _result(out, lse, drop, return_attn_probs)


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> AttnResult:
    """flash_attn.flash_attn_varlen_kvpacked_func: q (total_q, Hq, D), kv (total_k, 2, Hk, D),
    int32 cu_seqlens_q/k -> out (total_q, Hq, D); the gradient of ``kv`` is one pack."""
    _check_pack(kv, "kv", 4, 2, "(total_k, 2, heads_k, head_dim)")
    q, kv = _unit_last(q), _unit_last(kv)
    cu_q, cu_k = cu_seqlens_q.to(torch.int32), cu_seqlens_k.to(torch.int32)
    mask = mask_from_flash_args(causal, window_size, softcap)
    scale = _scale(softmax_scale, q.shape[-1])
    batch, max_q, max_k = cu_q.numel() - 1, int(max_seqlen_q), int(max_seqlen_k)
    drop = dropout_state(q, dropout_p, batch, q.shape[1], max_q, max_k, return_attn_probs)
    out, lse = _KVPacked.apply(
        q, kv, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi_slopes, True, drop
    )
    return _result(out, lse, drop, return_attn_probs)
