"""Expectations: what a stack promises, checked against what validation observed.

Standard library only: the host's recipe checker imports ``KNOWN_KEYS`` without torch.

An expect file is JSON::

    {"stack": "default", "arch": "gfx1151",
     "expect": {"sdpa.default_backend": "flash", "rocm.preferred_fa_library": "aotriton"}}

A value may be a list, meaning "any of these". Keys whose description says *prefix* match
when the observed string starts with the expected one (``"2.9"`` matches ``"2.9.1+rocm7.0"``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract import workloads

KNOWN_KEYS: dict[str, str] = {
    "torch.version": "torch version string (prefix match: '2.9' matches '2.9.1+rocm7.1')",
    "torch.hip": "torch is a ROCm/HIP build (true/false)",
    "torch.cuda": "torch is a CUDA build (true/false)",
    "torch.gpu_available": "torch sees at least one GPU (true/false)",
    "torch.device_arch": "GPU arch: gfx name without features (gfx1151) or sm_XY on NVIDIA",
    "triton.present": "the triton package imports (true/false)",
    "triton.version": "triton version string (prefix match)",
    "aotriton.present": "torch ships an AOTriton runtime library, libaotriton* (true/false)",
    "sdpa.default_backend": "backend SDPA picks for the reference case: flash|efficient|cudnn|math|overrideable",
    "sdpa.flash.available": "torch.backends.cuda.is_flash_attention_available() (true/false)",
    "sdpa.flash.enabled": "torch.backends.cuda.flash_sdp_enabled() in a fresh process (true/false)",
    "sdpa.flash.can_use": "can_use_flash_attention() for the reference case (true/false)",
    "sdpa.flash.works": "forced FLASH_ATTENTION run of the reference case ran and matched the reference",
    "sdpa.efficient.can_use": "can_use_efficient_attention() for the reference case (true/false)",
    "sdpa.efficient.works": "forced EFFICIENT_ATTENTION run of the reference case ran and matched",
    "sdpa.cudnn.can_use": "can_use_cudnn_attention() for the reference case (true/false)",
    "sdpa.cudnn.works": "forced CUDNN_ATTENTION run of the reference case ran and matched",
    "sdpa.math.works": "forced MATH run of the reference case ran and matched",
    "rocm.preferred_fa_library": "torch.backends.cuda.preferred_rocm_fa_library() at start: aotriton|ck|default",
    "rocm.effective_fa_library": "library flash attention uses on ROCm: aotriton|ck ('default' resolved)",
    "rocm.ck_sdpa_available": "torch.backends.cuda.is_ck_sdpa_available() (true/false)",
    "flash_attn.backend": "backend of the flash_attn package: triton|ck|cuda|absent",
    "flash_attn.version": "flash_attn version string (prefix match)",
    "flash_attn.works": "flash_attn forward+backward matched the reference (true/false)",
    "rdna3_minimal.present": "the rocWMMA RDNA3 FA2 kernel (rocwmma_fattn) is installed (true/false)",
    "rdna3_minimal.works": "its forward+backward matched SDPA's math reference (true/false)",
    "kernels.present": "the bundled kernels package imports (true/false)",
    "kernels.works": "every bundled kernel case that ran passed, and at least one ran (true/false)",
    **{
        f"sdpa.workload.{name}.fused": f"SDPA's default call ran a fused backend (not math) at "
        f"every {name} shape (true/false)"
        for name in workloads.WORKLOADS
    },
}

TOP_LEVEL = (
    "stack", "arch", "expect", "host_rules", "aotriton", "sdpa_limits", "shown_as", "in_image",
)  # fmt: skip
PREFIX_KEYS = frozenset({"torch.version", "triton.version", "flash_attn.version"})


class ExpectError(Exception):
    """A user's expect file is unusable; the message is a sentence for them."""


@dataclass(frozen=True)
class ExpectSpec:
    """A parsed expect file."""

    path: str
    stack: str | None
    arch: str | None
    expect: dict[str, Any]
    # Known-bad host rules (recipes/hosts.yaml) and what the recipes say of the torch's AOTriton:
    # {version, experimental (for this arch), image_sets_knob}. Both optional.
    host_rules: tuple[dict[str, Any], ...] = ()
    aotriton: dict[str, Any] | None = None
    # What this arch's torch refuses by design (recipes/arches.yaml sdpa_limits): {head_dim_max,
    # backends, source}. A refusal there is the expected outcome, not a gap.
    sdpa_limits: dict[str, Any] | None = None
    # The name the user has for this file (the host path where `invoke validate` keeps it; in the
    # image it is /out/expect.json), and whether the suite runs in an image (False: on the host).
    shown_as: str | None = None
    in_image: bool | None = None

    @property
    def name(self) -> str:
        """The file as the report names it: the user's path, not the image's."""
        return self.shown_as or self.path


@dataclass(frozen=True)
class ExpectationResult:
    """One promise, what was seen, and whether it held."""

    key: str
    expected: Any
    observed: Any
    met: bool
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "expected": self.expected,
            "observed": self.observed,
            "status": "met" if self.met else "broken",
            "message": self.message,
        }


def parse_expect(data: Any, path: str = "<expect>") -> ExpectSpec:
    """Validate the structure of an expect document; raise ExpectError with a sentence."""
    if not isinstance(data, dict):
        raise ExpectError(f"{path}: the top level must be a JSON object with 'expect'.")
    unknown_top = sorted(set(data) - set(TOP_LEVEL))
    if unknown_top:
        raise ExpectError(
            f"{path}: unknown top-level field(s) {', '.join(unknown_top)}; "
            f"valid fields: {', '.join(TOP_LEVEL)}."
        )
    limits = data.get("sdpa_limits")
    if limits is not None and not (
        isinstance(limits, dict)
        and isinstance(limits.get("head_dim_max"), int)
        and isinstance(limits.get("backends", []), list)
    ):
        raise ExpectError(
            f"{path}: 'sdpa_limits' must be an object with an integer head_dim_max "
            "(and optionally a backends list and a source)."
        )
    if data.get("in_image") is not None and not isinstance(data["in_image"], bool):
        raise ExpectError(f"{path}: 'in_image' must be true or false.")
    rules = data.get("host_rules", [])
    if not isinstance(rules, list) or not all(
        isinstance(r, dict) and {"id", "warning", "fix", "source"} <= set(r) for r in rules
    ):
        raise ExpectError(
            f"{path}: 'host_rules' must be a list of objects with id, warning, fix and source."
        )
    aotriton = data.get("aotriton")
    if aotriton is not None and not isinstance(aotriton, dict):
        raise ExpectError(f"{path}: 'aotriton' must be an object.")
    expect = data.get("expect", {})
    if not isinstance(expect, dict):
        raise ExpectError(f"{path}: 'expect' must be an object mapping keys to values.")
    for field in ("stack", "arch", "shown_as"):
        if data.get(field) is not None and not isinstance(data[field], str):
            raise ExpectError(f"{path}: '{field}' must be a string.")
    unknown = sorted(k for k in expect if k not in KNOWN_KEYS)
    if unknown:
        raise ExpectError(
            f"{path}: unknown expectation key(s) {', '.join(unknown)}; "
            f"valid keys: {', '.join(sorted(KNOWN_KEYS))}."
        )
    for key, value in expect.items():
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, (str, bool, int, float)) for v in values):
            raise ExpectError(
                f"{path}: expectation {key!r} must be a string, boolean, number, "
                "or a non-empty list of them."
            )
    return ExpectSpec(
        path=path, stack=data.get("stack"), arch=data.get("arch"), expect=expect,
        host_rules=tuple(rules), aotriton=aotriton, sdpa_limits=limits, shown_as=data.get("shown_as"),
        in_image=data.get("in_image"),
    )  # fmt: skip


def load_expect(path: str | Path) -> ExpectSpec:
    """Read and validate an expect file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ExpectError(f"cannot read expect file {p}: {exc.strerror or exc}.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ExpectError(f"{p}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg}).") from None
    return parse_expect(data, str(p))


def _norm(value: Any) -> Any:
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        return low
    return value


def matches(key: str, expected: Any, observed: Any) -> bool:
    """Whether one observed value satisfies an expected value (or any of a list)."""
    candidates = expected if isinstance(expected, list) else [expected]
    obs = _norm(observed)
    for cand in candidates:
        exp = _norm(cand)
        if key in PREFIX_KEYS and isinstance(obs, str) and isinstance(exp, str):
            if obs == exp or obs.startswith(exp + ".") or obs.startswith(exp + "+"):
                return True
            if obs.startswith(exp) and not exp[-1:].isdigit():
                return True
        elif isinstance(exp, bool) or isinstance(obs, bool):
            if exp is obs:
                return True
        elif exp == obs:
            return True
    return False


def _show(value: Any) -> str:
    if isinstance(value, list):
        return " or ".join(_show(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _reasons(context: dict[str, Any], backend: str) -> str:
    reasons = context.get(f"sdpa.{backend}.reasons") or []
    if not reasons:
        return ""
    text = "; ".join(str(r).strip().rstrip(".") for r in reasons[:3])
    return f" PyTorch says: {text}."


# Context keys (not observations): False when the suite runs on the host (`--local`); what the
# recipes say of this torch's AOTriton on this arch (ExpectSpec.aotriton).
IN_IMAGE = "run.in_image"
AOTRITON = "recipes.aotriton"


def _experimental(context: dict[str, Any]) -> str:
    """The AOTriton-experimental advice, from the recipes' facts (recipes/arches.yaml
    aotriton.experimental) where the expect file carries them."""
    facts = context.get(AOTRITON) or {}
    knob, where = "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1", "(recipes/arches.yaml)"
    if facts.get("experimental") is True:
        return f"AOTriton {facts.get('version')} is experimental on this arch {where}: set {knob}"
    if facts.get("experimental") is False:
        return (f"AOTriton {facts.get('version')} is not experimental on this arch {where}, so "
                f"{knob} is not the cause")  # fmt: skip
    return (f"On an arch that recipes/arches.yaml marks AOTriton-experimental for this torch's "
            f"AOTriton, set {knob}")  # fmt: skip


def likely_fix(key: str, expected: Any, observed: Any, context: dict[str, Any]) -> str:
    """The most likely remedy for a broken expectation, as a sentence (may be empty): the first
    row of _FIXES whose key (and expected value) matches says it."""
    hip = context.get("torch.hip") is True
    exp = _norm(expected if not isinstance(expected, list) else expected[0])
    obs = _norm(observed)
    for matches, fix in _FIXES:
        if matches(key, exp):
            return fix(key, exp, obs, context, hip)
    return ""


def _flash_fix(key: str, exp: Any, obs: Any, context: dict[str, Any], hip: bool) -> str:
    parts = [_reasons(context, "flash").strip()]
    if (
        key == "sdpa.default_backend"
        and obs in ("cudnn", "efficient")
        and context.get("sdpa.flash.can_use") is True
        and context.get("sdpa.flash.enabled") is not False
    ):
        parts.append(
            f"Flash is usable here (can_use_flash_attention is true), but SDPA ranks {obs} "
            "above it for this GPU and torch version: promise that backend, or disable it "
            f"(torch.backends.cuda.enable_{'cudnn' if obs == 'cudnn' else 'mem_efficient'}_sdp(False))."
            + (
                " Recent torch puts cuDNN first on sm90/sm100 with cuDNN > 9.15; "
                "TORCH_CUDNN_SDPA_DEPRIORITIZED=1 restores flash first."
                if obs == "cudnn"
                else ""
            )
        )
    if context.get("sdpa.flash.enabled") is False:
        parts.append(
            "Flash SDPA is disabled in this process: something calls "
            "torch.backends.cuda.enable_flash_sdp(False) (or sdpa_kernel without FLASH_ATTENTION)."
        )
    if context.get("sdpa.flash.available") is False:
        parts.append(
            "This torch has no flash attention compiled in: rebuild it with "
            "USE_FLASH_ATTENTION=1 (and USE_MEM_EFF_ATTENTION=1)."
        )
    if hip:
        parts.append(
            _experimental(context) + "; check that PYTORCH_ROCM_ARCH at build time included "
            "this GPU's arch."
        )
    return " ".join(p for p in parts if p)


def _backend_fix(key: str, exp: Any, obs: Any, context: dict[str, Any], hip: bool) -> str:
    backend = key.split(".")[1]
    flag = {
        "efficient": "USE_MEM_EFF_ATTENTION=1",
        "cudnn": "a CUDA build with cuDNN >= 9",
        "math": "nothing (math always exists): this is a torch bug",
    }.get(backend, "")
    return (_reasons(context, backend) + (f" Needs {flag}." if flag else "")).strip()


def _rocm_library_fix(key: str, exp: Any, obs: Any, context: dict[str, Any], hip: bool) -> str:
    if exp == "ck":
        return (
            "Set TORCH_ROCM_FA_PREFER_CK=1 and build torch with USE_ROCM_CK_SDPA=1 for an arch "
            "that CK SDPA supports (gfx90a/gfx942/gfx950); otherwise torch falls back to AOTriton."
        )
    if obs == "ck":
        return "Unset TORCH_ROCM_FA_PREFER_CK (it makes CK the preferred library)."
    if not hip:
        return "torch is not a ROCm build, so there is no ROCm flash-attention library."
    return ""


def _flash_attn_fix(key: str, exp: Any, obs: Any, context: dict[str, Any], hip: bool) -> str:
    if obs == "absent":
        return "flash_attn does not import: install the flash-attention layer into this image."
    if exp == "triton":
        return (
            'Set FLASH_ATTENTION_TRITON_AMD_ENABLE="TRUE" (exact string) both when building '
            "and when running flash_attn."
        )
    if exp == "ck":
        return (
            "Unset FLASH_ATTENTION_TRITON_AMD_ENABLE and build flash_attn's CK extension "
            "(GPU_ARCHS=<arch>)."
        )
    return ""


def _gpu_fix(key: str, exp: Any, obs: Any, context: dict[str, Any], hip: bool) -> str:
    if context.get(IN_IMAGE) is False:  # --local: the suite ran on the host itself
        return (
            "No GPU is visible to this process: check that the GPU driver is loaded "
            "(ROCm: /dev/kfd and /dev/dri readable, the user in the video and render groups; "
            "NVIDIA: nvidia-smi) and HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES."
        )
    return (
        "No GPU is visible: pass the devices to the container (ROCm: --device /dev/kfd "
        "--device /dev/dri; NVIDIA: --gpus all) and check HIP_VISIBLE_DEVICES."
    )


def _said(sentence: str) -> Callable[..., str]:
    return lambda *_: sentence


# (does the row match (key, expected), its remedy): the first matching row answers.
_FIXES: list[tuple[Callable[[str, Any], bool], Callable[..., str]]] = [
    (lambda k, e: k in ("sdpa.default_backend", "sdpa.flash.works", "sdpa.flash.can_use")
     and e in ("flash", True), _flash_fix),
    (lambda k, e: k.startswith("sdpa.workload.") and k.endswith(".fused") and e is True,
     lambda key, exp, obs, context, hip: _workload_fix(key, context, hip)),
    (lambda k, e: k.startswith("sdpa.") and k.endswith((".works", ".can_use")), _backend_fix),
    (lambda k, e: k in ("rocm.preferred_fa_library", "rocm.effective_fa_library"),
     _rocm_library_fix),
    (lambda k, e: k == "rocm.ck_sdpa_available" and e is True, _said(
        "Build torch with USE_ROCM_CK_SDPA=1 and PYTORCH_ROCM_ARCH containing gfx942 or gfx950.")),
    (lambda k, e: k == "flash_attn.backend", _flash_attn_fix),
    (lambda k, e: k == "torch.hip" and e is True, _said(
        "Install a ROCm build of torch (TheRock or download.pytorch.org/whl/rocmX.Y).")),
    (lambda k, e: k == "torch.device_arch", _said(
        "The image was built for another GPU: build for this arch, or check "
        "HSA_OVERRIDE_GFX_VERSION / HIP_VISIBLE_DEVICES.")),
    (lambda k, e: k == "torch.gpu_available" and e is True, _gpu_fix),
    (lambda k, e: k == "aotriton.present" and e is True, _said(
        "Build torch with USE_FLASH_ATTENTION=1 so AOTriton is downloaded or built.")),
    (lambda k, e: k.startswith("kernels."), _said(
        "See the kernels.case.* checks for the failing cases.")),
    (lambda k, e: k == "flash_attn.works", _said("See the flash_attn.run check for the error.")),
]  # fmt: skip


def _workload_fix(key: str, context: dict[str, Any], hip: bool) -> str:
    """Which shapes of the workload ran math, PyTorch's reasons, and the likely remedy."""
    name = key[len("sdpa.workload.") : -len(".fused")]
    parts = []
    for fb in (context.get(f"sdpa.workload.{name}.fallbacks") or [])[:3]:
        p = fb.get("params") or {}
        dims = (
            f"b{p.get('b')} h{p.get('h')}/{p.get('hkv')} sq{p.get('sq')} sk{p.get('sk')} "
            f"d{p.get('d')} {p.get('dtype')}{' causal' if p.get('causal') else ''}"
        )
        said = "; ".join(
            f"{b}: {str(r[0]).strip().rstrip('.')}"
            for b, r in (fb.get("reasons") or {}).items()
            if r
        )
        parts.append(
            f"{fb.get('shape')} ({dims}) ran {fb.get('default_backend') or 'math'}"
            + (f"; PyTorch says {said}" if said else "")
        )
    text = ("Shapes that fell back: " + ". ".join(parts) + ".") if parts else ""
    fix = []
    if context.get("sdpa.flash.enabled") is False:
        fix.append("Flash SDPA is disabled in this process (torch.backends.cuda.enable_flash_sdp).")
    if hip:
        fix.append(
            _experimental(context)
            + "; a head dim AOTriton does not serve on this arch (ViT's 72 on gfx1151: ROCm/ATOM#1357) needs "
            "a kernel that does (aiter#4065) or the bundled kernels through the SDPA shim "
            "(ATTNFORGE_SDPA_SHIM=1)."
        )
    elif not fix:
        fix.append(
            "Check that this torch was built with USE_FLASH_ATTENTION=1 and that the shape's head "
            "dim and dtype are ones its fused backends take."
        )
    return " ".join(p for p in (text, *fix) if p)


def evaluate(
    expect: dict[str, Any],
    observations: dict[str, Any],
    sources: dict[str, str] | None = None,
    in_image: bool | None = None,
    aotriton: dict[str, Any] | None = None,
) -> list[ExpectationResult]:
    """Compare each promise with the observations; ``sources`` explains missing keys;
    ``in_image`` False words the fixes for a suite run on the host itself; ``aotriton``: what the
    recipes say of the torch's AOTriton on this arch (its fixes name the facts)."""
    sources = sources or {}
    context = {**observations, IN_IMAGE: in_image, AOTRITON: aotriton}
    results = []
    for key, expected in expect.items():
        if key not in observations:
            why = sources.get(key, "no check produced it")
            results.append(
                ExpectationResult(
                    key,
                    expected,
                    None,
                    False,
                    f"The stack promised {key} = {_show(expected)}, but it was not observed "
                    f"({why}).",
                )
            )
            continue
        observed = observations[key]
        if matches(key, expected, observed):
            results.append(
                ExpectationResult(
                    key, expected, observed, True, f"{key} = {_show(observed)} as promised."
                )
            )
            continue
        fix = likely_fix(key, expected, observed, context)
        msg = f"The stack promised {key} = {_show(expected)}, but validation saw {_show(observed)}."
        if fix:
            msg += f" Likely fix: {fix}"
        results.append(ExpectationResult(key, expected, observed, False, msg))
    return results
