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

    from validate.checks.numerics import fwd_bwd_case
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

    def kernel(q, k, v, causal):  # (batch, heads, seqlen, head_dim): the kernel's default
        return mod.FlashAttentionFunction.apply(q, k, v, None, causal, None, False)

    def sdpa_math(q, k, v, causal, upcast):  # upstream's reference; q's dtype sets the precision
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    results, fails = {}, []
    for c in cases:
        ctx.progress(f"rdna3_minimal {c.name}")
        verdicts = fwd_bwd_case(kernel, c, "cuda", reference=sdpa_math)
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
