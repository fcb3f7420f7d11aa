"""Attention references and the flash-attention error rule (``contract.tolerance``) on tensors."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from contract import tolerance
from validate.grid import Case

__all__ = [
    "Case",
    "attention_math",
    "fwd_bwd_case",
    "judge",
    "judge_in_chunks",
    "judge_maxima",
    "make_inputs",
    "make_mask",
]


def torch_dtype(name: str) -> torch.dtype:
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


# Scales of the large-magnitude cases (validate.grid.VALUES): q and k by 50 makes the scaled
# logits about 2500 x N(0, 1), reaching about 1e4 over a 512 x 512 case; V by 1e4.
BIG_QK = 50.0
BIG_V = 1e4


def make_inputs(case: Case, device: str, seed: int = 0):
    """Deterministic q, k, v of shape (batch, heads, seqlen, head_dim), laid out as the case's
    ``layout`` says (strided views, an expanded K/V) and scaled as its ``values`` say."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dt = torch_dtype(case.dtype)
    scale_qk = BIG_QK if case.values == "big-logits" else 1.0
    scale_v = BIG_V if case.values == "big-v" else 1.0

    def rnd(h: int, s: int, scale: float, strided: bool) -> torch.Tensor:
        if strided:  # made (B, S, H, D), seen as a (B, H, S, D) view
            t = torch.randn(case.batch, s, h, case.head_dim, generator=gen) * scale
            return t.to(device=device, dtype=dt).transpose(1, 2)
        t = torch.randn(case.batch, h, s, case.head_dim, generator=gen) * scale
        return t.to(device=device, dtype=dt)

    bshd = case.layout == "bshd"
    q = rnd(case.heads_q, case.seqlen_q, scale_qk, bshd)
    k = rnd(case.heads_kv, case.seqlen_k, scale_qk, bshd)
    v = rnd(case.heads_kv, case.seqlen_k, scale_v, bshd or case.layout == "v-strided")
    if case.layout == "kv-expanded":
        shape = (case.batch, case.heads_q, case.seqlen_k, case.head_dim)
        k, v = k.expand(shape), v.expand(shape)  # stride 0 over the heads
    return q, k, v


def make_mask(case: Case, device: str, seed: int = 1) -> torch.Tensor | None:
    """The case's attention mask (validate.grid.MASKS), or None. Batch 1 pads its last quarter
    of keys, so no row is fully masked."""
    if case.mask is None:
        return None
    pad = torch.zeros(case.batch, case.seqlen_k, dtype=torch.bool)
    if case.batch > 1:
        pad[1, case.seqlen_k - case.seqlen_k // 4 :] = True
    if case.mask == "bool-padding":
        return (~pad).view(case.batch, 1, 1, case.seqlen_k).to(device)
    dt = torch_dtype(case.dtype)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    bias = torch.randn(case.batch, 1, case.seqlen_q, case.seqlen_k, generator=gen)
    bias = bias.masked_fill(pad.view(case.batch, 1, 1, case.seqlen_k), torch.finfo(dt).min)
    return bias.to(device=device, dtype=dt)


def attention_math(q, k, v, causal: bool, upcast: bool, attn_mask=None) -> torch.Tensor:
    """Plain attention (no SDPA), in fp32 when ``upcast`` else in the input dtype; ``mask`` is
    SDPA's attn_mask (boolean: True attends; float: added to the scaled logits).

    Either way the output comes back in the input dtype, as flash-attention's
    ``attention_ref`` returns it (pass fp32 inputs for an fp32 result).

    The low-precision variant scales k rather than q, as flash-attention's ``reorder_ops``
    does, to estimate the error that reordering alone causes.
    """
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1])
    if upcast:
        scores = (q * scale) @ k.transpose(-2, -1)
    else:
        scores = q @ (k * scale).transpose(-2, -1)
    if causal:
        sq, sk = q.shape[-2], k.shape[-2]
        # Top-left aligned mask, as torch SDPA's is_causal uses.
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=0)
        scores = scores.masked_fill(~mask, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(scores.dtype)
    probs = torch.softmax(scores.float(), dim=-1).to(scores.dtype)
    out = probs @ v
    return out.to(dtype)


@dataclass(frozen=True)
class Judgement:
    """Whether an output is within the rule, with the numbers that decided it."""

    ok: bool
    max_abs_err: float
    ref_err: float
    tolerance: float
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "max_abs_err": self.max_abs_err,
            "ref_err": self.ref_err,
            "tolerance": self.tolerance,
            "message": self.message,
        }


def judge_maxima(
    err: float, ref_err: float, ref_max: float, nonfinite: int, eps: float
) -> Judgement:
    """The rule on its maxima: max|out - ref|, max|ref_lowp - ref|, max|ref| and the count of
    non-finite values in the output (so that an output judged in pieces is judged as one)."""
    tol = tolerance.tolerance(ref_err, ref_max, eps)
    if nonfinite:
        return Judgement(
            False, math.nan, ref_err, tol, f"{nonfinite} non-finite values (NaN/inf) in the output"
        )
    ok, tol = tolerance.within(err, ref_err, ref_max, eps)
    floor = tol - tolerance.FACTOR * ref_err
    msg = (
        f"max|err| {err:.3g} {'<=' if ok else '>'} tolerance {tol:.3g} "
        f"({tolerance.FACTOR:g} x ref err {ref_err:.3g} + {floor:.3g})"
    )
    return Judgement(ok, err, ref_err, tol, msg)


def _maxima(out: torch.Tensor, ref: torch.Tensor, ref_lowp: torch.Tensor) -> list[float]:
    outf, reff = out.float(), ref.float()
    nonfinite = int((~torch.isfinite(outf)).sum().item())
    err = (outf - reff).abs().max().item() if not nonfinite else math.nan
    return [err, (ref_lowp.float() - reff).abs().max().item(), reff.abs().max().item(), nonfinite]


def judge(out: torch.Tensor, ref: torch.Tensor, ref_lowp: torch.Tensor) -> Judgement:
    """Apply the flash-attention rule to ``out`` against ``ref``, with ``ref_lowp`` the same
    math in ``out``'s dtype (whose machine epsilon sets the rule's floor)."""
    if out.shape != ref.shape:
        return Judgement(
            False, math.inf, math.nan, math.nan, f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
        )
    err, ref_err, ref_max, nonfinite = _maxima(out, ref, ref_lowp)
    return judge_maxima(err, ref_err, ref_max, int(nonfinite), torch.finfo(out.dtype).eps)


def judge_in_chunks(outs: dict[str, torch.Tensor], q, k, v, causal: bool,
                    chunk_bytes: int = 256 << 20) -> dict[str, Judgement]:  # fmt: skip
    """Judge several outputs of one (q, k, v) against the reference computed a few heads at a time
    (whole groups of query heads per key/value head), so that the fp32 scores of a workload's
    long sequences never exist at once; the maxima of the pieces decide, as one ``judge`` would."""
    b, h, sq, _ = q.shape
    rep = h // k.shape[1]
    per_head = sq * k.shape[-2] * 4
    step = max(rep, (chunk_bytes // max(per_head, 1)) // rep * rep)
    acc = {name: [0.0, 0.0, 0.0, 0] for name in outs}
    for i in range(b):
        for h0 in range(0, h, step):
            sl = slice(h0, min(h, h0 + step))
            kv = slice(h0 // rep, (sl.stop + rep - 1) // rep)
            qc, kc, vc = q[i : i + 1, sl], k[i : i + 1, kv], v[i : i + 1, kv]
            ref = attention_math(qc, kc, vc, causal, upcast=True)
            ref_lp = attention_math(qc, kc, vc, causal, upcast=False)
            for name, out in outs.items():
                got = _maxima(out[i : i + 1, sl], ref, ref_lp)
                a = acc[name]
                a[:3] = [
                    x if math.isnan(x) or x >= y else y for x, y in zip(got[:3], a[:3], strict=True)
                ]
                a[3] += got[3]
    eps = torch.finfo(q.dtype).eps
    return {n: judge_maxima(a[0], a[1], a[2], int(a[3]), eps) for n, a in acc.items()}


def fwd_bwd_case(attn, case: Case, device: str, reference=attention_math) -> dict[str, Judgement]:
    """Forward and backward of ``attn(q, k, v, causal) -> out`` (all (batch, heads, seqlen,
    head_dim)) against ``reference(q, k, v, causal, upcast)`` on fp32 inputs, each of out, dq, dk,
    dv judged by the rule, with the reference in the input dtype setting its floor."""
    base = make_inputs(case, device)
    q, k, v = (t.clone().requires_grad_(True) for t in base)
    out = attn(q, k, v, case.causal)
    g = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    qf, kf, vf = (t.float().requires_grad_(True) for t in base)
    ref = reference(qf, kf, vf, case.causal, upcast=True)
    rq, rk, rv = torch.autograd.grad(ref, (qf, kf, vf), g.float())
    ql, kl, vl = (t.clone().requires_grad_(True) for t in base)
    ref_lp = reference(ql, kl, vl, case.causal, upcast=False)
    lq, lk, lv = torch.autograd.grad(ref_lp, (ql, kl, vl), g)
    return {
        "out": judge(out.detach(), ref.detach(), ref_lp.detach()),
        "dq": judge(dq, rq, lq),
        "dk": judge(dk, rk, lk),
        "dv": judge(dv, rv, lv),
    }
