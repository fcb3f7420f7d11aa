"""The rocWMMA FlashAttention-2 kernel for gfx11 (flash-attention-rdna3-minimal layer) against SDPA.

Upstream (Repeerc/flash-attention-v2-RDNA3-minimal@76d4433f bench_with_sdpa.py) compares
``FlashAttentionFunction.apply(q, k, v, mask, causal, scale, BNHD_fmt)`` with SDPA's math backend,
forward and backward; this does the same for the reference case and judges the difference with
the flash-attention rule of validate.checks.numerics.

validate.suite plans it (with ``flash-attn`` and ``all``) wherever ``rocwmma_fattn`` is installed.
Observations: ``rdna3_minimal.present`` and ``rdna3_minimal.works`` (expectation keys).
"""

from __future__ import annotations

import importlib
from typing import Any

MODULE = "rocwmma_fattn.FlashAttn"


def run(params: dict[str, Any], ctx) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from validate.checks.numerics import judge, make_inputs
    from validate.grid import Case

    if not torch.cuda.is_available():
        return {
            "status": "skip",
            "message": "no GPU: the kernel runs on gfx11 only",
            "observations": {},
        }
    ctx.progress(f"import {MODULE} (loads the extension built in the image)")
    try:
        mod = importlib.import_module(MODULE)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "rocwmma_fattn":
            return {
                "status": "skip",
                "message": f"{MODULE} is not installed",
                "observations": {"rdna3_minimal.present": False},
            }
        raise
    cases = [Case("fp16-d64-s512", "fp16", False, 64, 8, 8, 512, 512)]
    if not ctx.quick:
        cases.append(Case("fp16-d64-s512-causal", "fp16", True, 64, 8, 8, 512, 512))
    results, fails = {}, []
    for c in cases:
        ctx.progress(f"rdna3_minimal {c.name}")
        base = make_inputs(c, "cuda")  # (batch, heads, seqlen, head_dim): the kernel's default
        q, k, v = (t.clone().requires_grad_(True) for t in base)
        out = mod.FlashAttentionFunction.apply(q, k, v, None, c.causal, None, False)
        g = torch.randn_like(out)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
        with sdpa_kernel(SDPBackend.MATH):
            qf, kf, vf = (t.float().requires_grad_(True) for t in base)
            ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=c.causal)
            rq, rk, rv = torch.autograd.grad(ref, (qf, kf, vf), g.float())
            ql, kl, vl = (t.clone().requires_grad_(True) for t in base)
            lp = F.scaled_dot_product_attention(ql, kl, vl, is_causal=c.causal)
            lq, lk, lv = torch.autograd.grad(lp, (ql, kl, vl), g)
        verdicts = {
            "out": judge(out.detach(), ref.detach(), lp.detach()),
            "dq": judge(dq, rq, lq),
            "dk": judge(dk, rk, lk),
            "dv": judge(dv, rv, lv),
        }
        results[c.name] = {n: j.to_json() for n, j in verdicts.items()}
        fails += [f"{c.name} {n}: {j.message}" for n, j in verdicts.items() if not j.ok]
    obs = {"rdna3_minimal.present": True, "rdna3_minimal.works": not fails}
    return {
        "status": "fail" if fails else "pass",
        "message": "; ".join(fails)
        or f"forward+backward within tolerance on {len(results)} case(s)",
        "observations": obs,
        "details": {"cases": results, "file": getattr(mod, "__file__", None)},
    }
