"""The argument checks the entry points share (interface, packed, kvcache), worded once.

Each raises the flash_attn-compatible types of ``attnforge_kernels.api.errors``: a bad dtype is an
``ArgumentTypeError`` (TypeError and RuntimeError), a bad shape or value an ``ArgumentError``
(ValueError and RuntimeError).
"""

from __future__ import annotations

from typing import TypeAlias

import torch

from .errors import ArgumentError, ArgumentTypeError

HALF_TYPES = (torch.float16, torch.bfloat16)
FP8_TYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
MAX_HEAD_DIM = 256

# What the entry points return: flash_attn's out, or (out, softmax_lse, S_dmask or None) with
# return_attn_probs; with_kvcache: out, or (out, softmax_lse) with return_softmax_lse.
AttnResult: TypeAlias = "torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]"
KVCacheResult: TypeAlias = "torch.Tensor | tuple[torch.Tensor, torch.Tensor]"
# An FP8 descale factor: a number, or a tensor of 1, (heads_k,) or (batch, heads_k) values.
Descale: TypeAlias = "float | torch.Tensor | None"


def check_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    names: tuple[str, str, str] = ("q", "k", "v"),
    fp8: bool = False,
    contiguous_kv: bool = False,
) -> tuple[int, int, int]:
    """(head_dim, query heads, key/value heads) of q (..., Hq, D) and k/v (..., Hk, D) after
    checking their dtypes (float16/bfloat16, or e4m3 with ``fp8``), head dims and head counts;
    ``contiguous_kv``: k and v also need a unit-stride last dimension."""
    nq, nk, nv = names
    allowed = FP8_TYPES if fp8 else HALF_TYPES
    if q.dtype not in allowed:
        kinds = " or ".join(str(t).removeprefix("torch.") for t in allowed)
        raise ArgumentTypeError(f"{nq} must be {kinds}, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ArgumentTypeError(
            f"{nq}, {nk} and {nv} must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    d = q.shape[-1]
    if d > MAX_HEAD_DIM or k.shape[-1] != d or v.shape[-1] != d:
        raise ArgumentError(
            f"head dims must match and be <= {MAX_HEAD_DIM}, got {d}, {k.shape[-1]}, {v.shape[-1]}"
        )
    if contiguous_kv and (k.stride(-1) != 1 or v.stride(-1) != 1):
        raise ArgumentError(f"{nk} and {nv} need a contiguous last dimension (stride 1)")
    hq, hk = q.shape[-2], k.shape[-2]
    if hq % hk != 0 or v.shape[-2] != hk:
        raise ArgumentError(f"query heads ({hq}) must be a multiple of key/value heads ({hk})")
    return d, hq, hk


def alibi_slopes(
    slopes: torch.Tensor | None, batch: int, heads: int, device: torch.device
) -> tuple[torch.Tensor | None, int, int]:
    """(fp32 slopes on ``device``, batch stride, head stride) of ALiBi slopes of shape (heads,)
    or (batch, heads); (None, 0, 0) without slopes."""
    if slopes is None:
        return None, 0, 0
    a = slopes.to(device=device, dtype=torch.float32)
    if a.dim() == 1 and a.shape[0] == heads:
        return a, 0, a.stride(0)
    if tuple(a.shape) == (batch, heads):
        return a, a.stride(0), a.stride(1)
    raise ArgumentError(
        f"alibi_slopes shape {tuple(a.shape)}, expected ({heads},) or ({batch}, {heads})"
    )
