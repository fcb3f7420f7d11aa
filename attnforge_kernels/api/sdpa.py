"""Opt-in shim: route ``F.scaled_dot_product_attention`` calls the kernels support to them.

Enable with ``ATTNFORGE_SDPA_SHIM=1`` in the environment when ``attnforge_kernels`` is imported, or
with
:func:`enable`. The shim replaces the attribute ``torch.nn.functional.scaled_dot_product_attention``;
code that bound the original function earlier (``from torch.nn.functional import ...``) is not
affected. A call is routed only when the kernels compute exactly SDPA's function, keeping SDPA's
semantics (``is_causal`` top-left aligned when Sq != Sk, ``scale``, ``enable_gqa``); anything else
falls back to the original, and :func:`stats` says how many calls went where and why.
"""

from __future__ import annotations

import math
import threading
from collections import Counter

import torch
import torch.nn.functional as F

from ..device.configs import INTERPRET

_ORIGINAL = F.scaled_dot_product_attention
_lock = threading.Lock()
_routed = 0
_reasons: Counter = Counter()


def _unsupported(
    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
) -> str | None:
    """The reason a call cannot be routed, or None when the kernels match SDPA exactly."""
    if attn_mask is not None:
        return "attn_mask"
    if dropout_p:
        return "dropout"
    ts = (query, key, value)
    if not all(isinstance(t, torch.Tensor) for t in ts) or any(t.is_nested for t in ts):
        return "nested_or_not_tensor"
    if any(t.dim() != 4 for t in ts):
        return "rank_not_4"
    if (
        query.dtype not in (torch.float16, torch.bfloat16)
        or key.dtype != query.dtype
        or value.dtype != query.dtype
    ):
        return "dtype"
    if not INTERPRET and not all(t.is_cuda for t in ts):
        return "device"
    if hasattr(torch, "compiler") and torch.compiler.is_compiling():
        return "compiling"
    b, hq, sq, d = query.shape
    if key.shape[0] != b or value.shape[0] != b or key.shape[2] != value.shape[2]:
        return "shape"
    if key.shape[-1] != d or value.shape[-1] != d or d > 256:
        return "head_dim"
    hk = key.shape[1]
    if value.shape[1] != hk:
        return "shape"
    if hq != hk and not (enable_gqa and hq % hk == 0):
        return "heads"
    if sq == 0 or key.shape[2] == 0 or b == 0 or hq == 0:
        return "empty"
    return None


def _shim(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    global _routed
    reason = _unsupported(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if reason is not None:
        with _lock:
            _reasons[reason] += 1
        kwargs = {
            "attn_mask": attn_mask,
            "dropout_p": dropout_p,
            "is_causal": is_causal,
            "scale": scale,
        }
        if enable_gqa:
            kwargs["enable_gqa"] = enable_gqa
        return _ORIGINAL(query, key, value, **kwargs)
    from .flash_attn import Mask, attention

    sq, sk = query.shape[2], key.shape[2]
    # SDPA's causal mask is tril(ones(sq, sk)): key j visible to query i iff j <= i, i.e.
    # rel = j - i - (sk - sq) <= sq - sk in the kernels' bottom-right convention.
    mask = Mask(right=sq - sk if is_causal else None)
    s = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    out, _ = attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), scale=s, mask=mask
    )
    with _lock:
        _routed += 1
    return out.transpose(1, 2)


def enable() -> None:
    """Route supported ``F.scaled_dot_product_attention`` calls to the kernels."""
    F.scaled_dot_product_attention = _shim


def disable() -> None:
    """Restore the original ``F.scaled_dot_product_attention``."""
    F.scaled_dot_product_attention = _ORIGINAL


def enabled() -> bool:
    return F.scaled_dot_product_attention is _shim


def stats() -> dict:
    """{"routed": int, "fallback": int, "reasons": {reason: count}} since the last reset."""
    with _lock:
        return {"routed": _routed, "fallback": sum(_reasons.values()), "reasons": dict(_reasons)}


def reset_stats() -> None:
    global _routed
    with _lock:
        _routed = 0
        _reasons.clear()
