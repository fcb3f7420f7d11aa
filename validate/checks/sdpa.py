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
from dataclasses import dataclass, field
from typing import Any

from validate.checks.numerics import attention_math, judge, make_inputs, make_mask
from validate.gate import KNOB
from validate.gate import apply as apply_gate
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


def sync_device(torch, device: str) -> None:
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
        sync_device(torch, device)
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
        sync_device(torch, device)
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


def _rocm_start(
    torch, ctx
) -> tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any], list[str]]:
    """Which ROCm APIs this torch has, and is_ck_sdpa_available: (a skip result where the check
    cannot go on, else None; observations; details; notes)."""
    bc = torch.backends.cuda
    has_pref = hasattr(bc, "preferred_rocm_fa_library")
    has_ck = hasattr(bc, "is_ck_sdpa_available")
    obs: dict[str, Any] = {}
    details: dict[str, Any] = {
        "api": {"preferred_rocm_fa_library": has_pref, "is_ck_sdpa_available": has_ck}
    }
    if not getattr(torch.version, "hip", None):
        message = ("torch is not a ROCm build (torch.version.hip is None); "
                   "preferred_rocm_fa_library and is_ck_sdpa_available only mean something on ROCm")  # fmt: skip
        return {"status": "skip", "message": message, "details": details}, obs, details, []
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
        skip = {"status": "skip", "message": "; ".join(notes), "observations": obs,
                "details": details}  # fmt: skip
        return skip, obs, details, notes
    return None, obs, details, notes


def _rocm_forced_flash(torch, ins: tuple, device: str) -> tuple[dict[str, Any], bool]:
    """A forced flash run of the small ROCm case under the profiler: (entry fields, ok)."""
    c, q, k, v, ref, ref_lp = ins
    try:
        with forced(torch, "flash"):
            box: list = []
            kernels, ops = profile_kernels(
                torch, lambda: box.append(sdpa_call(torch, q, k, v, c)), device
            )
        j = judge(box[0], ref, ref_lp)
        fields = {"run": "pass" if j.ok else "fail", "judgement": j.to_json(),
                  "kernels": kernels, "aten_ops": ops}  # fmt: skip
        return fields, j.ok
    except Exception as exc:  # noqa: BLE001
        text = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if is_device_fault(text):
            raise
        return {"run": "error", "error": text}, True


def _rocm_preference(torch, pref: str, ins: tuple, device: str, ctx) -> tuple[dict[str, Any], bool]:
    """Set one preferred library, read it back with PyTorch's warnings, and run flash under it."""
    bc = torch.backends.cuda
    ctx.progress(f"preferred_rocm_fa_library({pref!r})")
    entry: dict[str, Any] = {}
    with captured_warnings() as lines:
        try:
            entry["read_back"] = _rocm_name(bc.preferred_rocm_fa_library(pref))
            entry["set"] = "ok"
        except Exception as exc:  # noqa: BLE001 - upstream raises when CK is unusable
            entry["set"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    entry["warnings"] = lines
    ok = True
    if entry["set"] == "ok" and device == "cuda":
        ctx.progress(f"forced flash run with preference {pref!r}")
        fields, ok = _rocm_forced_flash(torch, ins, device)
        entry.update(fields)
    return entry, ok


def rocm(params: dict[str, Any], ctx) -> dict[str, Any]:
    """preferred_rocm_fa_library for each preference, and is_ck_sdpa_available (ROCm only)."""
    import torch

    bc = torch.backends.cuda
    skip, obs, details, notes = _rocm_start(torch, ctx)
    if skip is not None:
        return skip
    with captured_warnings() as lines:
        start = bc.preferred_rocm_fa_library()
    start_name = _rocm_name(start)
    obs["rocm.preferred_fa_library"] = start_name
    obs["rocm.effective_fa_library"] = "ck" if start_name == "ck" else "aotriton"
    details["start_warnings"] = lines
    device = _device(torch)
    c = Case("rocm-pref", "fp16", False, 64, 4, 4, 256, 256)
    q, k, v = make_inputs(c, device)
    ins = (c, q, k, v, attention_math(q, k, v, False, upcast=True),
           attention_math(q, k, v, False, upcast=False))  # fmt: skip
    per_pref, failed = {}, []
    try:
        for pref in ("default", "aotriton", "ck"):
            per_pref[pref], ok = _rocm_preference(torch, pref, ins, device, ctx)
            if not ok:
                failed.append(pref)
    finally:
        with contextlib.suppress(Exception):
            bc.preferred_rocm_fa_library(start)
    details["preferences"] = per_pref
    msg = f"preferred at start: {start_name}"
    if "rocm.ck_sdpa_available" in obs:
        msg += f"; CK SDPA available: {obs['rocm.ck_sdpa_available']}"
    if notes:
        msg += "; " + "; ".join(notes)
    status = "pass"
    if failed:
        status, msg = "fail", msg + f"; wrong flash output with preference {', '.join(failed)}"
    return {"status": status, "message": msg, "observations": obs, "details": details}


@dataclass
class CaseRun:
    """One grid case in flight: its inputs, references and what the steps found so far."""

    torch: Any
    device: str
    case: Case
    params: dict[str, Any]
    details: dict[str, Any]
    q: Any = None
    k: Any = None
    v: Any = None
    mask: Any = None
    ref: Any = None
    ref_lp: Any = None
    refusal: dict[str, Any] | None = None
    pick: str | None = None
    fails: list[str] = field(default_factory=list)
    crashed: str | None = None

    def call(self):
        return sdpa_call(self.torch, self.q, self.k, self.v, self.case, self.mask)

    def result(self, status: str, message: str, obs: dict[str, Any]) -> dict[str, Any]:
        return {"status": status, "message": message, "observations": obs, "details": self.details}


def _prepare(run: CaseRun, ctx) -> None:
    """Inputs as the case lays them out, its mask, the fp32 and same-dtype references, and
    whether the arch's limits (recipes/arches.yaml, via the expect file) expect a refusal."""
    ctx.progress("inputs and references")
    c, device = run.case, run.device
    run.q, run.k, run.v = make_inputs(c, device)
    run.mask = make_mask(c, device)
    run.ref = attention_math(run.q, run.k, run.v, c.causal, upcast=True, attn_mask=run.mask)
    run.ref_lp = attention_math(run.q, run.k, run.v, c.causal, upcast=False, attn_mask=run.mask)
    run.details["strides"] = {n: list(t.stride()) for n, t in (("q", run.q), ("k", run.k),
                                                              ("v", run.v))}  # fmt: skip
    # Where recipes/arches.yaml says this torch refuses the case on this arch (head dim 512 on
    # gfx11: pytorch#194280), a refusal is the expected outcome, stated with PyTorch's reason.
    run.refusal = _expected_refusal(run.params, c)
    if run.refusal:
        run.details["expected_refusal"] = run.refusal


def _can_use_all(run: CaseRun, ctx) -> None:
    """can_use_* with PyTorch's reasons, first in the process: ROCm's "still experimental" reason
    is a TORCH_WARN_ONCE, so the first call in the process is the only one that states it."""
    details = run.details
    try:
        params_obj = sdpa_params(run.torch, run.q, run.k, run.v, run.case, run.mask)
    except Exception as exc:  # noqa: BLE001
        params_obj = None
        details["sdpa_params_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    for b in BACKENDS:
        entry: dict[str, Any] = {}
        details["backends"][b] = entry
        if b not in CAN_USE:
            continue
        if params_obj is None:
            entry["can_use"], entry["reasons"] = None, [details["sdpa_params_error"]]
        else:
            ctx.progress(f"can_use {b}")
            entry["can_use"], entry["reasons"] = can_use(run.torch, b, params_obj)


def _default_run(run: CaseRun, ctx) -> None:
    """The default pick, one default call under the profiler judged against the reference, and
    a checked op after it: a fault it leaves behind (ROCm/TheRock#7407: a deferred
    hipErrorInvalidValue after causal bf16 SDPA at tiny lengths) is charged to it."""
    torch, details = run.torch, run.details
    ctx.progress("default pick")
    with captured_warnings() as pick_warnings:
        pick, how = fused_choice(torch, run.q, run.k, run.v, run.case, run.mask)
    details["default_backend"], details["default_backend_source"] = pick, how
    ctx.progress("default run under the profiler")
    run_warnings: list[str] = []
    try:
        box: list = []
        with captured_warnings() as run_warnings:
            kernels, ops = profile_kernels(torch, lambda: box.append(run.call()), run.device)
        details.update(default_kernels=kernels, default_aten_ops=ops,
                       profiler_backend=backend_from_ops(ops))  # fmt: skip
        details["default_run"] = judge(box[0], run.ref, run.ref_lp).to_json()
    except Exception as exc:  # noqa: BLE001
        text = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if is_device_fault(text):
            raise
        details["default_run"] = {"ok": False, "message": text}
    details["default_warnings"] = [
        w for w in pick_warnings + run_warnings if "profiler" not in w.lower()
    ][:10]
    if pick is None:
        pick = details.get("profiler_backend")
        if pick:
            details["default_backend_source"] = "profiler (aten op name)"
    run.pick = pick
    if not details["default_run"].get("ok"):
        fails_msg = details["default_run"].get("message")
        run.fails.append(f"default run ({pick or '?'}): {fails_msg}")
    ctx.progress("probe after the default run")
    deferred = probe(torch, run.device)
    if deferred:
        details["default_run"].update(ok=False, deferred_fault=deferred)
        run.crashed = (
            f"the checked op after the default run (deferred, charged to the default run, "
            f"{pick or '?'}): {deferred}"
        )


def _refused(run: CaseRun, b: str, entry: dict[str, Any], first: str) -> None:
    """A forced run that raised: honest when can_use_* said no (math must always run)."""
    entry["error"] = first
    if entry.get("can_use") is True or b == "math":
        entry["run"] = "fail"
        run.fails.append(f"{b} raised although usable: {first}")
        return
    entry["run"] = "unsupported"
    if run.refusal and b in run.refusal["backends"]:
        entry["expected_refusal"] = True
        entry["note"] = f"refused, as expected on this arch: {run.refusal['reason']}"


def _forced_one(run: CaseRun, b: str, ctx) -> bool:
    """One forced backend run, its probe and its judgement; False when the case must stop."""
    torch, entry = run.torch, run.details["backends"][b]
    if run.device == "cpu" and b in GPU_ONLY:
        entry.update(run="skip", error=f"{ENUM_NAMES[b]} has no CPU kernel in PyTorch; needs a "
                     "CUDA/ROCm device")  # fmt: skip
        return True
    ctx.progress(f"forced {b} run")
    try:
        with forced(torch, b):
            out = run.call()
            sync_device(torch, run.device)
    except Exception as exc:  # noqa: BLE001
        text = f"{type(exc).__name__}: {exc}".strip()
        first = text.splitlines()[0][:400]
        if is_device_fault(text):
            entry.update(run="crash", error=first)
            run.crashed = f"forced {b} run: {first}"
            return False
        _refused(run, b, entry, first)
        return True
    ctx.progress(f"probe after forced {b} run")
    deferred = probe(torch, run.device)
    if deferred:
        entry.update(run="deferred-fault", error=deferred)
        run.crashed = (
            f"the checked op after the forced {b} run (deferred, charged to {b}): {deferred}"
        )
        return False
    j = judge(out, run.ref, run.ref_lp)
    entry.update(judgement=j.to_json(), run="pass" if j.ok else "fail")
    if run.refusal and b in run.refusal["backends"]:
        entry["note"] = (
            f"accepted although a refusal is expected on this arch ({run.refusal['reason']}): "
            "judged as any other run (a torch without that change?)"
        )
    if not j.ok:
        run.fails.append(f"{b}: {j.message}")
    return True


def _reference_observations(run: CaseRun) -> dict[str, Any]:
    """The sdpa.* observations the stack's expectations are read from (reference case only)."""
    obs: dict[str, Any] = {}
    if not run.params.get("reference"):
        return obs
    if run.pick is not None:
        obs["sdpa.default_backend"] = run.pick
    for b in BACKENDS:
        e = run.details["backends"][b]
        obs[f"sdpa.{b}.works"] = e.get("run") == "pass"
        if b in CAN_USE and e.get("can_use") is not None:
            obs[f"sdpa.{b}.can_use"] = e["can_use"]
        if e.get("reasons"):
            obs[f"sdpa.{b}.reasons"] = e["reasons"]
    return obs


def case(params: dict[str, Any], ctx) -> dict[str, Any]:
    """One grid case: can_use_* with reasons, default pick, and a forced run per backend."""
    gate = apply_gate(params)  # before this process's first SDPA call (torch reads it once)
    import torch

    device = _device(torch)
    c = Case(**params["case"])
    if device == "cpu":
        c = for_cpu(c)
    details: dict[str, Any] = {"case": c.to_json(), "device": device, "backends": {}}
    if gate:
        details["gate"] = {"variable": KNOB, "state": gate}
    if c.gqa and not supports_gqa(torch):
        return {
            "status": "skip",
            "message": "GQA needs scaled_dot_product_attention(enable_gqa=...) (torch >= 2.5)",
            "details": details,
        }
    run = CaseRun(torch, device, c, params, details)
    _prepare(run, ctx)
    _can_use_all(run, ctx)
    _default_run(run, ctx)
    for b in BACKENDS if run.crashed is None else ():
        if not _forced_one(run, b, ctx):
            break
    obs = _reference_observations(run)
    summary = ", ".join(f"{b} {details['backends'][b].get('run', '-')}" for b in BACKENDS)
    summary = f"default {run.pick or '?'}; {summary}"
    if run.crashed:
        return run.result("crash", f"GPU fault in {run.crashed}", obs)
    if run.fails:
        return run.result("fail", summary + " | " + "; ".join(run.fails), obs)
    return run.result("pass", summary, obs)


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


def supports_gqa(torch) -> bool:
    import inspect

    try:
        sig = inspect.signature(torch.nn.functional.scaled_dot_product_attention)
        return "enable_gqa" in sig.parameters
    except (TypeError, ValueError):
        return True
