"""flash_attn package checks: version, which backend it uses and why, forward+backward."""

from __future__ import annotations

import importlib
import os
from typing import Any

from validate.checks.numerics import fwd_bwd_case
from validate.grid import Case

TRITON_ENV = "FLASH_ATTENTION_TRITON_AMD_ENABLE"


def classify_backend(module_name: str, hip: bool) -> str:
    """The backend implied by the module flash_attn_interface bound as its GPU implementation.

    Upstream binds ``flash_attn_gpu`` to ``flash_attn_2_cuda`` (CUDA, or CK when built for
    ROCm), to ``flash_attn.flash_attn_triton_amd.interface_fa`` (ROCm fork, Triton) or to
    ``aiter.ops.triton._triton_kernels.flash_attn_triton_amd.flash_attn_2`` (Dao-AILab
    after the 2026 migration to aiter, Triton).
    """
    name = module_name.lower()
    if "triton" in name:
        return "triton"
    if "flash_attn_2_cuda" in name or name.endswith("_cuda"):
        return "ck" if hip else "cuda"
    return "unknown"


def warm_up(params: dict[str, Any]) -> None:
    """Run ahead in the flash_attn checks' worker while the checks before them use the device
    (validate/pool.py ``start_early``): torch, the device context and flash_attn's import where
    it is installed (with the environment :func:`info` reads). A failed import is left to
    :func:`info`, which reports it."""
    import importlib.util

    import torch

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
    if importlib.util.find_spec("flash_attn") is not None:
        importlib.import_module("flash_attn.flash_attn_interface")


def info(params: dict[str, Any], ctx) -> dict[str, Any]:
    import torch

    hip = bool(getattr(torch.version, "hip", None))
    details: dict[str, Any] = {"env": {TRITON_ENV: os.environ.get(TRITON_ENV)}}
    ctx.progress("import flash_attn")
    try:
        fa = importlib.import_module("flash_attn")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "flash_attn":
            return {
                "status": "skip",
                "message": "flash_attn is not installed",
                "observations": {"flash_attn.backend": "absent"},
                "details": details,
            }
        raise
    obs: dict[str, Any] = {"flash_attn.version": str(getattr(fa, "__version__", "unknown"))}
    details["file"] = getattr(fa, "__file__", None)
    ctx.progress("import flash_attn.flash_attn_interface")
    iface = importlib.import_module("flash_attn.flash_attn_interface")
    gpu = getattr(iface, "flash_attn_gpu", None) or getattr(iface, "flash_attn_cuda", None)
    if gpu is None:
        obs["flash_attn.backend"] = "unknown"
        how = "flash_attn_interface has neither flash_attn_gpu nor flash_attn_cuda"
    else:
        mod_name = getattr(gpu, "__name__", type(gpu).__name__)
        obs["flash_attn.backend"] = classify_backend(mod_name, hip)
        how = (
            f"flash_attn.flash_attn_interface.flash_attn_gpu is {mod_name} "
            f"({getattr(gpu, '__file__', '?')}); torch is a {'ROCm' if hip else 'CUDA/CPU'} build; "
            f"{TRITON_ENV}={os.environ.get(TRITON_ENV)!r}"
        )
    details["backend_determined_by"] = how
    return {
        "status": "pass",
        "message": f"flash_attn {obs['flash_attn.version']}, backend {obs['flash_attn.backend']}",
        "observations": obs,
        "details": details,
    }


_CASES = (
    Case("fa-fp16-d64-s256-causal", "fp16", True, 64, 8, 8, 256, 256),
    Case("fa-bf16-d128-s512", "bf16", False, 128, 8, 8, 512, 512),
)


def run(params: dict[str, Any], ctx) -> dict[str, Any]:
    """Forward and backward of flash_attn_func against the fp32 reference."""
    import torch

    if not torch.cuda.is_available():
        return {
            "status": "skip",
            "message": "no GPU: flash_attn runs on CUDA/ROCm devices only",
            "observations": {},
        }
    from flash_attn import flash_attn_func

    def flash(q, k, v, causal):  # flash_attn takes (batch, seqlen, heads, head_dim)
        t = (x.transpose(1, 2) for x in (q, k, v))
        return flash_attn_func(*t, causal=causal).transpose(1, 2)

    results, fails = {}, []
    for c in _CASES[: 1 if ctx.quick else None]:
        ctx.progress(f"flash_attn {c.name}")
        verdicts = fwd_bwd_case(flash, c, "cuda")
        results[c.name] = {n: j.to_json() for n, j in verdicts.items()}
        fails += [f"{c.name} {n}: {j.message}" for n, j in verdicts.items() if not j.ok]
    obs = {"flash_attn.works": not fails}
    if fails:
        return {
            "status": "fail",
            "message": "; ".join(fails),
            "observations": obs,
            "details": {"cases": results},
        }
    return {
        "status": "pass",
        "message": f"forward+backward within tolerance on {len(results)} case(s)",
        "observations": obs,
        "details": {"cases": results},
    }
