"""Plain PyTorch attention with the kernels' semantics: the reference of every correctness check."""

from __future__ import annotations

import math

import torch


def visible(sq: int, sk: int, left, right, device=None) -> torch.Tensor:
    """[sq, sk] bool: key j visible to query i (bottom-right aligned window, as flash_attn)."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    rel = j - i - (sk - sq)
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right is not None:
        ok &= rel <= right
    if left is not None:
        ok &= rel >= -left
    return ok


def attention_ref(
    q, k, v, *, scale=None, left=None, right=None, softcap=0.0, alibi_slopes=None, upcast=True
):
    """q (B, Sq, Hq, D), k/v (B, Sk, Hk, D) -> (out (B, Sq, Hq, D), lse (B, Hq, Sq)).

    ``upcast=True`` computes in fp32 (the "ref"); ``upcast=False`` in the input dtype (the "pt"
    reference whose error sets the tolerance). Rows with no visible key give 0 and LSE=+inf.
    """
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    if hq != hk:
        k = k.repeat_interleave(hq // hk, dim=2)
        v = v.repeat_interleave(hq // hk, dim=2)
    s = torch.einsum("bshd,bthd->bhst", q * scale if not softcap else q, k)
    if softcap:
        s = softcap * torch.tanh(s * (scale / softcap))
    s = s.float() if upcast else s
    if alibi_slopes is not None:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        dist = (j - i - (sk - sq)).abs().to(s.dtype)
        sl = alibi_slopes.to(s.dtype)
        sl = sl[None, :, None, None] if sl.dim() == 1 else sl[:, :, None, None]
        s = s - sl * dist
    ok = visible(sq, sk, left, right, q.device)
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s.float(), dim=-1)
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)
    out = torch.einsum("bhst,bthd->bshd", p.to(v.dtype), v)
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
    return out.to(dtype), lse
