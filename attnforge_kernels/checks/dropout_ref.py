"""The kernels' dropout rule in plain PyTorch: the independent reference of their dropout mask.

A score (b, h, i, j) of a call is kept when word 0 of Philox4x32-10 (Salmon et al., "Parallel
random numbers: as easy as 1, 2, 3", SC'11; the Random123 constants Triton's ``tl.philox`` uses)
with counter (j, i, b * Hq + h, offset mod 2**32) and key (seed mod 2**32, seed >> 32) is at least
``floor(p * 2**32)``; i and j are positions within the sequence (varlen: from its start). Kept
probabilities are scaled by 1 / (1 - p). This module reimplements that rule with int64 tensor
arithmetic (no Triton) on any device, so the tests can regenerate the mask a kernel used from
the seed and offset alone.
"""

from __future__ import annotations

import torch

from .reference import visible

M32 = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57  # multipliers of counter words 0 and 2
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85  # Weyl increments of the two key words


def _mul_hi_lo(a: int, x: torch.Tensor):
    """(high, low) 32-bit halves of ``a * x`` for 32-bit ``x`` in int64 (the product wraps
    modulo 2**64 in two's complement, which keeps all 64 bits)."""
    prod = x * a
    return (prod >> 32) & M32, prod & M32


def philox4x32(c0, c1, c2, c3, k0: int, k1: int, rounds: int = 10):
    """Philox4x32-``rounds`` of int64 tensors holding 32-bit counter words; returns 4 words."""
    k0, k1 = k0 & M32, k1 & M32
    for _ in range(rounds):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & M32, (k1 + _KEY_B) & M32
    return c0, c1, c2, c3


def keep_mask(seed: int, offset: int, threshold: int, batch: int, heads: int, sq: int, sk: int,
              device=None) -> torch.Tensor:  # fmt: skip
    """(batch, heads, sq, sk) bool: the scores a kernel call with this rng state keeps."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    j = torch.arange(sk, device=dev, dtype=torch.int64).view(1, 1, 1, sk)
    i = torch.arange(sq, device=dev, dtype=torch.int64).view(1, 1, sq, 1)
    bh = torch.arange(batch * heads, device=dev, dtype=torch.int64).view(batch, heads, 1, 1)
    shape = (batch, heads, sq, sk)
    c0 = j.expand(shape)
    c1 = i.expand(shape)
    c2 = bh.expand(shape)
    c3 = torch.full(shape, offset & M32, device=dev, dtype=torch.int64)
    seed &= 2**64 - 1
    word, _, _, _ = philox4x32(c0, c1, c2, c3, seed & M32, seed >> 32)
    return word >= threshold


def attention_dropout_ref(q, k, v, keep, p: float, *, scale=None, left=None, right=None,
                          upcast=True):  # fmt: skip
    """q (B, Sq, Hq, D), k/v (B, Sk, Hk, D), keep (B, Hq, Sq, Sk) -> (out, probs (B, Hq, Sq, Sk)).

    flash_attn's ``attention_ref`` with a dropout mask: softmax over visible keys, dropped
    probabilities zeroed, kept ones scaled by 1 / (1 - p); ``probs`` is the softmax before
    dropout. ``upcast=False`` computes in the input dtype (the error yardstick).
    """
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = scale if scale is not None else d**-0.5
    if hq != hk:
        k = k.repeat_interleave(hq // hk, dim=2)
        v = v.repeat_interleave(hq // hk, dim=2)
    s = torch.einsum("bshd,bthd->bhst", q * scale, k)
    ok = visible(sq, sk, left, right, q.device)
    s = s.masked_fill(~ok, float("-inf"))
    probs = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    dropped = probs.masked_fill(~keep, 0.0) * (1.0 / (1.0 - p))
    out = torch.einsum("bhst,bthd->bshd", dropped.to(v.dtype), v)
    return out.to(dtype), probs.float()


def normalize_sdmask(encoded, q, k, block_n: int, *, scale=None, left=None, right=None):
    """flash_attn's S_dmask decoded to the softmax probabilities, as its tests decode it
    (Dao-AILab/flash-attention ``tests/test_flash_attn.py::normalize_flash_attn_S``, commit
    0251105a, read 2026-11-25): ``encoded`` (B, Hq, Sq, Sk) holds ``|exp(s - m_j)|`` with ``m_j``
    the row's largest score in key block ``j`` (``block_n`` wide) and every later one; q
    (B, Sq, Hq, D), k (B, Sk, Hk, D) give the scores in fp32. Returns (B, Hq, Sq, Sk)."""
    q, k = q.float(), k.float()
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = scale if scale is not None else d**-0.5
    k = k.repeat_interleave(hq // hk, dim=2)
    s = torch.einsum("bshd,bthd->bhst", q * scale, k)
    s = s.masked_fill(~visible(sq, sk, left, right, q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    lse = torch.where(lse == float("-inf"), float("inf"), lse)
    blocks = s.split(block_n, dim=-1)
    top = torch.stack([blk.amax(-1) for blk in blocks], dim=-1)
    later = top.flip(-1).cummax(-1).values.flip(-1)
    parts = encoded.abs().split(block_n, dim=-1)
    return torch.cat(
        [a * torch.exp(later[..., j] - lse)[..., None] for j, a in enumerate(parts)], dim=-1
    )
