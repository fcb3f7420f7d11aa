"""SDPA checks: backend flags, ROCm flash-attention library, and the per-case backend matrix.

Every torch API used here is looked up with getattr first: one that this torch lacks makes
that observation a skip with the reason, never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

from validate.checks.numerics import attention_math, judge, make_inputs, make_mask
from validate.grid import BACKENDS, Case, for_cpu
from validate.runner import is_device_fault

ENUM_NAMES = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}
CAN_USE = {
    "flash": "can_use_flash_attention",
    "efficient": "can_use_efficient_attention",
    "cudnn": "can_use_cudnn_attention",
}
ENABLED = {
    "flash": "flash_sdp_enabled",
    "efficient": "mem_efficient_sdp_enabled",
    "cudnn": "cudnn_sdp_enabled",
    "math": "math_sdp_enabled",
}
# The aten op each backend dispatches to; the profiler sees these names.
ATEN_OPS = {
    "flash": ("_scaled_dot_product_flash_attention", "_flash_attention_forward"),
    "efficient": ("_scaled_dot_product_efficient_attention", "_efficient_attention_forward"),
    "cudnn": ("_scaled_dot_product_cudnn_attention",),
    "math": ("_scaled_dot_product_attention_math",),
}
ATTENTION_KERNEL_RE = re.compile(r"flash|fmha|attn|attention|sdpa|aotriton|softmax", re.I)
GPU_ONLY = ("efficient", "cudnn")


_TORCH_WARN_RE = re.compile(r"^\[W[^\]]*\]\s*(?:Warning:\s*)?(.*?)(?:\s*\(function [^)]*\))?\s*$")


def clean_warning(line: str) -> str:
    """'[W1122 ... sdp_utils.cpp:42] Warning: X (function f)' -> 'X'."""
    m = _TORCH_WARN_RE.match(line.strip())
    return (m.group(1) if m else line).strip()


@contextlib.contextmanager
def captured_warnings() -> Iterator[list[str]]:
    """Collect TORCH_WARN text (C++ writes it to fd 2) and Python warnings in a block."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace")
            lines.extend(clean_warning(ln) for ln in text.splitlines() if ln.strip())
            lines.extend(str(w.message) for w in caught)


def _device(torch) -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def probe(torch, device: str) -> str | None:
    """After a backend ran and synchronized: a small matmul and elementwise op, checked against
    the CPU. A fused kernel that fails asynchronously, or whose failed launch only sets the
    runtime's last error, surfaces at the *next* op (pytorch#194498: a deferred
    hipErrorInvalidValue); running one here charges it to the backend that caused it instead of
    a later, unrelated check. Returns the device's error text, or None when the op was right."""
    try:
        a = torch.arange(64, dtype=torch.float32).reshape(8, 8) / 64
        want = (a @ a) * 2 + 1
        got = ((a.to(device) @ a.to(device)) * 2 + 1).cpu()
        _sync(torch, device)
    except Exception as exc:  # noqa: BLE001 - any error here is the deferred one
        return f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:400]
    if not torch.allclose(got, want, rtol=1e-3, atol=1e-3):
        return "a checked matmul after it gave wrong results (the device state is corrupt)"
    return None


def backend_enum(torch, name: str):
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, ENUM_NAMES[name])


def enum_to_name(value: Any) -> str:
    """SDPBackend.FLASH_ATTENTION (or its int) -> 'flash'; unknown -> lower-case name."""
    text = str(getattr(value, "name", value)).split(".")[-1]
    for short, long in ENUM_NAMES.items():
        if text == long:
            return short
    return text.lower()


def fused_choice(torch, q, k, v, case: Case, mask=None) -> tuple[str | None, str]:
    """Backend SDPA would pick, via torch._fused_sdp_choice; (None, reason) if unavailable."""
    fn = getattr(torch, "_fused_sdp_choice", None)
    if fn is None:
        return None, "torch._fused_sdp_choice is missing in this torch"
    from torch.nn.attention import SDPBackend

    try:
        if case.gqa:
            idx = fn(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=case.causal, enable_gqa=True)
        else:
            idx = fn(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=case.causal)
    except Exception as exc:  # noqa: BLE001 - recorded as the reason
        return None, f"torch._fused_sdp_choice raised {type(exc).__name__}: {exc}".splitlines()[0]
    by_value = {int(v): k for k, v in SDPBackend.__members__.items()}
    name = by_value.get(int(idx), str(idx))
    return enum_to_name(name), "torch._fused_sdp_choice"


def sdpa_params(torch, q, k, v, case: Case, mask=None):
    """SDPAParams for the can_use_* checks (the enable_gqa argument arrived in torch 2.5)."""
    cls = torch.backends.cuda.SDPAParams
    try:
        return cls(q, k, v, mask, 0.0, case.causal, case.gqa)
    except TypeError:
        if case.gqa:
            raise
        return cls(q, k, v, mask, 0.0, case.causal)


def can_use(torch, backend: str, params) -> tuple[bool | None, list[str]]:
    """(answer, PyTorch's stated reasons) from can_use_*(params, debug=True)."""
    fn = getattr(torch.backends.cuda, CAN_USE[backend], None)
    if fn is None:
        return None, [f"torch.backends.cuda.{CAN_USE[backend]} is missing in this torch"]
    with captured_warnings() as lines:
        try:
            answer = bool(fn(params, True))
        except Exception as exc:  # noqa: BLE001 - the raise is PyTorch's answer, stated as one
            # torch 2.15's can_use_cudnn_attention raises (cudaErrorInsufficientDriver) where a
            # CUDA build has no GPU, instead of answering False: that is no crash of the case.
            text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
            return None, [f"{CAN_USE[backend]} raised {text}"]
    reasons = [ln for ln in lines if ln]
    if not answer and not reasons and not torch.backends.cuda.is_built():
        reasons = [
            f"{CAN_USE[backend]} answers False without a reason in a torch built without CUDA/HIP"
        ]
    return answer, reasons


def sdpa_call(torch, q, k, v, case: Case, mask=None):
    f = torch.nn.functional.scaled_dot_product_attention
    kw = {"attn_mask": mask} if mask is not None else {}
    if case.gqa:
        return f(q, k, v, is_causal=case.causal, enable_gqa=True, **kw)
    return f(q, k, v, is_causal=case.causal, **kw)


def forced(torch, backend: str):
    """A context manager that allows only ``backend``."""
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel([backend_enum(torch, backend)])


def profile_kernels(torch, fn, device: str) -> tuple[list[str], list[str]]:
    """(device kernel names, aten attention ops) that the profiler sees while ``fn`` runs."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(ProfilerActivity.CUDA)
    with profile(activities=acts) as prof:
        fn()
        _sync(torch, device)
    kernels: list[str] = []
    ops: list[str] = []
    for evt in prof.events():
        name = evt.name
        dev = str(getattr(evt, "device_type", "")).split(".")[-1]
        if dev in ("CUDA", "HIP", "PrivateUse1") and name not in kernels:
            kernels.append(name)
        elif "attention" in name and name not in ops:
            ops.append(name)
    # Attention kernels first; fills, copies and memsets after them.
    kernels.sort(key=lambda n: 0 if ATTENTION_KERNEL_RE.search(n) else 1)
    return kernels[:12], ops


def warm_up(params: dict[str, Any]) -> None:
    """Run ahead in the SDPA checks' worker while ``env`` runs (validate/pool.py
    ``start_early``): the device context, the profiler's start-up, and on CUDA the default and
    the cuDNN SDPA on a tiny input (cuDNN loads its engines on first use), so the first case
    no longer carries them. Not on ROCm: PyTorch states some refusal reasons only once per
    process, and the cases must be the ones to see them."""
    import torch

    device = _device(torch)
    x = torch.ones(
        1, 1, 16, 64, device=device, dtype=torch.float16 if device == "cuda" else torch.float32
    )
    rocm = bool(getattr(torch.version, "hip", None))

    def run() -> None:
        (x @ x.transpose(-1, -2)).sum()
        if device == "cuda" and not rocm:
            f = torch.nn.functional.scaled_dot_product_attention
            f(x, x, x)
            if torch.backends.cuda.cudnn_sdp_enabled():
                with contextlib.suppress(RuntimeError), forced(torch, "cudnn"):
                    f(x, x, x)  # refused here is fine: only its libraries' start-up matters

    profile_kernels(torch, run, device)


def backend_from_ops(ops: list[str]) -> str | None:
    """The backend whose aten op appears in a profile (the most specific one wins)."""
    for backend in BACKENDS:
        for op in ATEN_OPS[backend]:
            if any(o.split("::")[-1].startswith(op) for o in ops):
                return backend
    return None


# --- checks -----------------------------------------------------------------------------


def config(params: dict[str, Any], ctx) -> dict[str, Any]:
    """Which SDPA backends are compiled and enabled, and which APIs this torch has."""
    import torch

    bc = torch.backends.cuda
    api_names = (
        "is_flash_attention_available",
        "can_use_flash_attention",
        "can_use_efficient_attention",
        "can_use_cudnn_attention",
        "preferred_rocm_fa_library",
        "is_ck_sdpa_available",
        "SDPAParams",
    )
    api = {f"torch.backends.cuda.{n}": hasattr(bc, n) for n in api_names}
    api["torch._fused_sdp_choice"] = hasattr(torch, "_fused_sdp_choice")
    try:
        import torch.nn.attention as tna

        api["torch.nn.attention.sdpa_kernel"] = hasattr(tna, "sdpa_kernel")
    except ImportError:
        api["torch.nn.attention.sdpa_kernel"] = False
    enabled = {}
    for b, fn in ENABLED.items():
        getter = getattr(bc, fn, None)
        enabled[b] = bool(getter()) if getter else None
    obs: dict[str, Any] = {"sdpa.flash.enabled": enabled["flash"]}
    details: dict[str, Any] = {
        "api": api,
        "enabled": enabled,
        "built_with_cuda_or_hip": bc.is_built(),
    }
    if hasattr(bc, "is_flash_attention_available"):
        obs["sdpa.flash.available"] = bool(bc.is_flash_attention_available())
    details["flash_available"] = obs.get("sdpa.flash.available")
    off = [b for b, on in enabled.items() if on is False]
    msg = "enabled: " + ", ".join(b for b, on in enabled.items() if on)
    if off:
        msg += "; disabled: " + ", ".join(off)
    missing = [n for n, ok in api.items() if not ok]
    if missing:
        msg += "; missing APIs: " + ", ".join(missing)
    return {"status": "pass", "message": msg, "observations": obs, "details": details}


def _rocm_name(value: Any) -> str:
    return str(getattr(value, "name", value)).split(".")[-1].lower()


def rocm(params: dict[str, Any], ctx) -> dict[str, Any]:
    """preferred_rocm_fa_library for each preference, and is_ck_sdpa_available (ROCm only)."""
    import torch

    bc = torch.backends.cuda
    has_pref = hasattr(bc, "preferred_rocm_fa_library")
    has_ck = hasattr(bc, "is_ck_sdpa_available")
    details: dict[str, Any] = {
        "api": {"preferred_rocm_fa_library": has_pref, "is_ck_sdpa_available": has_ck}
    }
    if not getattr(torch.version, "hip", None):
        return {
            "status": "skip",
            "message": "torch is not a ROCm build (torch.version.hip is None); "
            "preferred_rocm_fa_library and is_ck_sdpa_available only mean something on ROCm",
            "details": details,
        }
    obs: dict[str, Any] = {}
    notes = []
    if has_ck:
        ctx.progress("is_ck_sdpa_available")
        with captured_warnings() as lines:
            obs["rocm.ck_sdpa_available"] = bool(bc.is_ck_sdpa_available())
        details["ck_sdpa_warnings"] = lines
    else:
        notes.append("is_ck_sdpa_available is missing (it arrived after preferred_rocm_fa_library)")
    if not has_pref:
        notes.append("preferred_rocm_fa_library is missing in this torch (added in 2.7)")
        return {
            "status": "skip",
            "message": "; ".join(notes),
            "observations": obs,
            "details": details,
        }
    with captured_warnings() as lines:
        start = bc.preferred_rocm_fa_library()
    start_name = _rocm_name(start)
    obs["rocm.preferred_fa_library"] = start_name
    obs["rocm.effective_fa_library"] = "ck" if start_name == "ck" else "aotriton"
    details["start_warnings"] = lines
    per_pref = {}
    device = _device(torch)
    case = Case("rocm-pref", "fp16", False, 64, 4, 4, 256, 256)
    q, k, v = make_inputs(case, device)
    ref = attention_math(q, k, v, False, upcast=True)
    ref_lp = attention_math(q, k, v, False, upcast=False)
    failed = []
    try:
        for pref in ("default", "aotriton", "ck"):
            ctx.progress(f"preferred_rocm_fa_library({pref!r})")
            entry: dict[str, Any] = {}
            with captured_warnings() as lines:
                try:
                    got = bc.preferred_rocm_fa_library(pref)
                    entry["set"] = "ok"
                    entry["read_back"] = _rocm_name(got)
                except Exception as exc:  # noqa: BLE001 - upstream raises when CK is unusable
                    entry["set"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            entry["warnings"] = lines
            if entry["set"] == "ok" and device == "cuda":
                ctx.progress(f"forced flash run with preference {pref!r}")
                try:
                    with forced(torch, "flash"):
                        out_box: list = []
                        kernels, ops = profile_kernels(
                            torch,
                            lambda box=out_box: box.append(sdpa_call(torch, q, k, v, case)),
                            device,
                        )
                    j = judge(out_box[0], ref, ref_lp)
                    entry.update(run="pass" if j.ok else "fail", judgement=j.to_json())
                    entry.update(kernels=kernels, aten_ops=ops)
                    if not j.ok:
                        failed.append(pref)
                except Exception as exc:  # noqa: BLE001
                    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    if is_device_fault(text):
                        raise
                    entry.update(run="error", error=text)
            per_pref[pref] = entry
    finally:
        with contextlib.suppress(Exception):
            bc.preferred_rocm_fa_library(start)
    details["preferences"] = per_pref
    msg = f"preferred at start: {start_name}"
    if "rocm.ck_sdpa_available" in obs:
        msg += f"; CK SDPA available: {obs['rocm.ck_sdpa_available']}"
    if notes:
        msg += "; " + "; ".join(notes)
    if failed:
        return {
            "status": "fail",
            "message": msg + f"; wrong flash output with preference {', '.join(failed)}",
            "observations": obs,
            "details": details,
        }
    return {"status": "pass", "message": msg, "observations": obs, "details": details}


def case(params: dict[str, Any], ctx) -> dict[str, Any]:
    """One grid case: can_use_* with reasons, default pick, and a forced run per backend."""
    import torch

    device = _device(torch)
    c = Case(**params["case"])
    if device == "cpu":
        c = for_cpu(c)
    details: dict[str, Any] = {"case": c.to_json(), "device": device, "backends": {}}
    obs: dict[str, Any] = {}
    if c.gqa and not _supports_gqa(torch):
        return {
            "status": "skip",
            "message": "GQA needs scaled_dot_product_attention(enable_gqa=...) (torch >= 2.5)",
            "details": details,
        }
    ctx.progress("inputs and references")
    q, k, v = make_inputs(c, device)
    mask = make_mask(c, device)
    ref = attention_math(q, k, v, c.causal, upcast=True, attn_mask=mask)
    ref_lp = attention_math(q, k, v, c.causal, upcast=False, attn_mask=mask)
    details["strides"] = {n: list(t.stride()) for n, t in (("q", q), ("k", k), ("v", v))}
    # Where recipes/arches.yaml says this torch refuses the case on this arch (head dim 512 on
    # gfx11: pytorch#194280), a refusal is the expected outcome, stated with PyTorch's reason.
    refusal = _expected_refusal(params, c)
    if refusal:
        details["expected_refusal"] = refusal

    # can_use_* first: ROCm's "still experimental" reason is a TORCH_WARN_ONCE, so the
    # first call in the process is the only one that states it.
    try:
        params_obj = sdpa_params(torch, q, k, v, c, mask)
    except Exception as exc:  # noqa: BLE001
        params_obj = None
        details["sdpa_params_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    for b in BACKENDS:
        entry: dict[str, Any] = {}
        details["backends"][b] = entry
        if b in CAN_USE:
            if params_obj is None:
                entry["can_use"], entry["reasons"] = None, [details["sdpa_params_error"]]
            else:
                ctx.progress(f"can_use {b}")
                entry["can_use"], entry["reasons"] = can_use(torch, b, params_obj)

    ctx.progress("default pick")
    with captured_warnings() as pick_warnings:
        pick, how = fused_choice(torch, q, k, v, c, mask)
    details["default_backend"] = pick
    details["default_backend_source"] = how
    ctx.progress("default run under the profiler")
    try:
        out_box: list = []
        with captured_warnings() as run_warnings:
            kernels, ops = profile_kernels(
                torch, lambda: out_box.append(sdpa_call(torch, q, k, v, c, mask)), device
            )
        details["default_kernels"] = kernels
        details["default_aten_ops"] = ops
        details["profiler_backend"] = backend_from_ops(ops)
        details["default_run"] = judge(out_box[0], ref, ref_lp).to_json()
    except Exception as exc:  # noqa: BLE001
        text = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if is_device_fault(text):
            raise
        details["default_run"] = {"ok": False, "message": text}
        run_warnings = []
    details["default_warnings"] = [
        w for w in pick_warnings + run_warnings if "profiler" not in w.lower()
    ][:10]
    if pick is None:
        pick = details.get("profiler_backend")
        if pick:
            details["default_backend_source"] = "profiler (aten op name)"

    fails, crashed = [], None
    if not details["default_run"].get("ok"):
        fails.append(f"default run ({pick or '?'}): {details['default_run'].get('message')}")
    for b in BACKENDS:
        entry = details["backends"][b]
        if device == "cpu" and b in GPU_ONLY:
            entry["run"] = "skip"
            entry["error"] = (
                f"{ENUM_NAMES[b]} has no CPU kernel in PyTorch; needs a CUDA/ROCm device"
            )
            continue
        ctx.progress(f"forced {b} run")
        try:
            with forced(torch, b):
                out = sdpa_call(torch, q, k, v, c, mask)
                _sync(torch, device)
        except Exception as exc:  # noqa: BLE001
            text = f"{type(exc).__name__}: {exc}".strip()
            first = text.splitlines()[0][:400]
            if is_device_fault(text):
                entry.update(run="crash", error=first)
                crashed = f"forced {b} run: {first}"
                break
            entry["error"] = first
            # Refusing is honest when can_use_* said no; math must always run.
            if entry.get("can_use") is True or b == "math":
                entry["run"] = "fail"
                fails.append(f"{b} raised although usable: {first}")
            else:
                entry["run"] = "unsupported"
                if refusal and b in refusal["backends"]:
                    entry["expected_refusal"] = True
                    entry["note"] = f"refused, as expected on this arch: {refusal['reason']}"
            continue
        ctx.progress(f"probe after forced {b} run")
        deferred = probe(torch, device)
        if deferred:
            entry.update(run="deferred-fault", error=deferred)
            crashed = (
                f"the checked op after the forced {b} run (deferred, charged to {b}): {deferred}"
            )
            break
        j = judge(out, ref, ref_lp)
        entry["judgement"] = j.to_json()
        entry["run"] = "pass" if j.ok else "fail"
        if refusal and b in refusal["backends"]:
            entry["note"] = (
                f"accepted although a refusal is expected on this arch ({refusal['reason']}): "
                "judged as any other run (a torch without that change?)"
            )
        if not j.ok:
            fails.append(f"{b}: {j.message}")

    if params.get("reference"):
        obs["sdpa.default_backend"] = pick
        for b in BACKENDS:
            e = details["backends"][b]
            obs[f"sdpa.{b}.works"] = e.get("run") == "pass"
            if b in CAN_USE and e.get("can_use") is not None:
                obs[f"sdpa.{b}.can_use"] = e["can_use"]
            if e.get("reasons"):
                obs[f"sdpa.{b}.reasons"] = e["reasons"]
    if obs.get("sdpa.default_backend") is None:
        obs.pop("sdpa.default_backend", None)

    summary = ", ".join(f"{b} {details['backends'][b].get('run', '-')}" for b in BACKENDS)
    summary = f"default {pick or '?'}; {summary}"
    if crashed:
        return {
            "status": "crash",
            "message": f"GPU fault in {crashed}",
            "observations": obs,
            "details": details,
        }
    if fails:
        return {
            "status": "fail",
            "message": summary + " | " + "; ".join(fails),
            "observations": obs,
            "details": details,
        }
    return {"status": "pass", "message": summary, "observations": obs, "details": details}


def _expected_refusal(params: dict[str, Any], c: Case) -> dict[str, Any] | None:
    """{backends, reason} when the arch's limits (from the expect file) say this torch refuses
    the case, else None."""
    limit = params.get("limits") or {}
    most = limit.get("head_dim_max")
    if most is None or c.head_dim <= int(most):
        return None
    return {
        "backends": list(limit.get("backends") or ("flash", "efficient")),
        "reason": f"head dim {c.head_dim} > {most}: {limit.get('source', 'recipes/arches.yaml')}",
    }


def _supports_gqa(torch) -> bool:
    import inspect

    try:
        sig = inspect.signature(torch.nn.functional.scaled_dot_product_attention)
        return "enable_gqa" in sig.parameters
    except (TypeError, ValueError):
        return True
