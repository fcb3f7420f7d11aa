"""Plain PyTorch attention with the kernels' semantics: the one reference family of the checks.

:func:`attention_ref` (fp32 or the input dtype; masks bottom-right as flash_attn, ALiBi, softcap,
GQA), :func:`rotary_ref` (flash_attn's rotary embedding) and :func:`fp8_emulation` (the FP8
kernel's math); the dropout rule is :mod:`attnforge_kernels.checks.dropout_ref`. The kernels' check
grid, its variants, its kv-cache cases and the tests all compare against these.
"""

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


def flash_window(causal: bool, window_size) -> tuple[int | None, int | None]:
    """(left, right) of :func:`attention_ref` for flash_attn's ``causal`` and ``window_size``
    (-1: unbounded); causal caps the right side at 0."""
    left = window_size[0] if window_size[0] >= 0 else None
    right = window_size[1] if window_size[1] >= 0 else None
    if causal:
        right = 0 if right is None else min(right, 0)
    return left, right


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


def both_precisions(ref, q, k, v, do, **kw) -> dict:
    """``ref(q, k, v, upcast=..., **kw)`` (returning ``(out, extra)``) run in fp32 (True) and in
    the inputs' dtype (False), each on its own copies of q, k, v with its backward of ``do``:
    ``{upcast: (out, dq, dk, dv, extra)}``, the reference and its precision floor for a judge."""
    res = {}
    for upcast in (True, False):
        qi, ki, vi = (t.detach().clone().requires_grad_() for t in (q, k, v))
        o, extra = ref(qi, ki, vi, upcast=upcast, **kw)
        o.backward(do)
        res[upcast] = (o.detach(), qi.grad, ki.grad, vi.grad, extra)
    return res


def rotary_ref(x, cos, sin, pos, interleaved: bool):
    """flash_attn.layers.rotary.apply_rotary_emb_torch at per-row positions ``pos`` (b, s), in
    fp32: x (b, s, h, d), cos/sin (positions, rotary_dim / 2); GPT-NeoX halves or, with
    ``interleaved``, pairs; the head dims past the rotary dim pass through."""
    rd = cos.shape[1] * 2
    c, s = cos[pos].float(), sin[pos].float()
    if interleaved:
        c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
    else:
        c, s = torch.cat((c, c), -1), torch.cat((s, s), -1)
    c, s = c[:, :, None], s[:, :, None]
    xr = x[..., :rd].float()
    if interleaved:
        half = torch.stack((-xr[..., 1::2], xr[..., 0::2]), -1).flatten(-2)
    else:
        x1, x2 = xr.chunk(2, -1)
        half = torch.cat((-x2, x1), -1)
    return torch.cat(((xr * c + half * s).to(x.dtype), x[..., rd:]), -1)


def fp8_emulation(q, k, v, fp8, *, scale, left, right, out_dtype):
    """The FP8 kernel's math in PyTorch: fp32 scores of the de-quantised inputs, P = exp(s - max)
    rounded to ``fp8`` for the P.V product, fp32 normalisation, output in ``out_dtype``."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(hq // hk, dim=2)
    v = v.repeat_interleave(hq // hk, dim=2)
    s = torch.einsum("bshd,bthd->bhst", q * scale, k)
    s = s.masked_fill(~visible(sq, sk, left, right, q.device), float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    l_sum = p.sum(-1, keepdim=True)
    pv = torch.einsum("bhst,bthd->bshd", p.to(fp8).float(), v)
    return (pv / l_sum.permute(0, 2, 1, 3).clamp_min(1e-30)).to(out_dtype)
