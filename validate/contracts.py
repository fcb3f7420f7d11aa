"""What apps too heavy to install here (ComfyUI, vLLM) expect of the image's flash_attn and SDPA,
written down as data with the source each probe was read from (one table, ``CONTRACTS``), and
checked against what the image provides (standard library only; torch and flash_attn are
imported where a probe needs them).

Probe kinds: ``import`` (a module, optionally an attribute of it, imports), ``find_spec`` (the
module is found without importing it, as an app's availability check does), ``env`` (a variable
the app's check reads has the value it needs), ``params`` (a callable has these parameters: the
keywords the app passes), ``bind`` (the app's call binds to the callable's signature: its
positional count and keywords), ``attrs`` (an object has these names). ``when`` says where a probe
applies: ``flash_attn`` (the image has flash_attn), ``rocm`` (a ROCm torch), ``gpu`` (a GPU is
visible); elsewhere
it is "n/a", with the reason.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import pkgutil
from typing import Any

COMFY = "Comfy-Org/ComfyUI@a125cd84b054a57729b5eecab930ca9408719832"
VLLM = "vllm-project/vllm"

CONTRACTS: tuple[dict[str, Any], ...] = (
    {
        "id": "comfyui.flash_attn.import",
        "app": "ComfyUI",
        "call": "from flash_attn import flash_attn_func",
        "kind": "import", "module": "flash_attn", "attr": "flash_attn_func",
        "when": ["flash_attn"],
        "source": f"{COMFY}:comfy/ldm/modules/attention.py (FLASH_ATTENTION_IS_AVAILABLE)",
        "effect": "without it --use-flash-attention exits and attention_flash is not offered",
    },
    {
        "id": "comfyui.flash_attn.call",
        "app": "ComfyUI",
        "call": "flash_attn_func(q, k, v, dropout_p=0.0, causal=False)",
        "kind": "bind", "module": "flash_attn", "attr": "flash_attn_func",
        "positional": 3, "keywords": ["dropout_p", "causal"],
        "when": ["flash_attn"],
        "source": f"{COMFY}:comfy/ldm/modules/attention.py (flash_attn_wrapper)",
        "effect": "a call that does not bind is caught and logged as 'Flash Attention failed, "
        "using default SDPA' (the ComfyUI#14865 symptom): a silent fallback",
    },
    {
        "id": "comfyui.custom_op",
        "app": "ComfyUI",
        "call": "@torch.library.custom_op('flash_attention::flash_attn', mutates_args=())",
        "kind": "params", "module": "torch.library", "attr": "custom_op",
        "params": ["mutates_args"],
        "when": ["flash_attn"],
        "source": f"{COMFY}:comfy/ldm/modules/attention.py (flash_attn_wrapper)",
        "effect": "an AttributeError here makes flash_attn_wrapper assert False on every call",
    },
    {
        "id": "comfyui.sdpa_priority",
        "app": "ComfyUI",
        "call": "sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH], "
        "set_priority=True)",
        "kind": "params", "module": "torch.nn.attention", "attr": "sdpa_kernel",
        "params": ["set_priority"],
        "when": ["gpu"],
        "source": f"{COMFY}:comfy/ops.py (scaled_dot_product_attention)",
        "effect": "without set_priority ComfyUI warns 'Torch version too old to set sdpa backend "
        "priority' and leaves SDPA's own order",
    },
    {
        "id": "comfyui.sdpa_backends",
        "app": "ComfyUI",
        "call": "SDPBackend.CUDNN_ATTENTION / FLASH_ATTENTION / EFFICIENT_ATTENTION / MATH",
        "kind": "attrs", "module": "torch.nn.attention", "attr": "SDPBackend",
        "names": ["CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"],
        "when": ["gpu"],
        "source": f"{COMFY}:comfy/ops.py (SDPA_BACKEND_PRIORITY)",
        "effect": "a missing name raises at import of comfy.ops",
    },
    {
        "id": "comfyui.sdpa.call",
        "app": "ComfyUI",
        "call": "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, "
        "dropout_p=0.0, is_causal=False)",
        "kind": "bind", "module": "torch.nn.functional", "attr": "scaled_dot_product_attention",
        "positional": 3, "keywords": ["attn_mask", "dropout_p", "is_causal"],
        "when": [],
        "source": f"{COMFY}:comfy/ldm/modules/attention.py (attention_pytorch, attention_flash)",
        "effect": "ComfyUI's default attention and every fallback go through this call",
    },
    {
        "id": "vllm.vit.flash_attn.find_spec",
        "app": "vLLM",
        "call": "find_spec('flash_attn') is not None",
        "kind": "find_spec", "module": "flash_attn",
        "when": ["rocm", "flash_attn"],
        "source": f"{VLLM}@e2a00c7b342ab1fd0da0d249d75d2fd9741b58a0:vllm/platforms/rocm.py "
        "(RocmPlatform.get_vit_attn_backend)",
        "effect": "otherwise ViT attention runs TORCH_SDPA",
    },
    {
        "id": "vllm.vit.triton_amd.find_spec",
        "app": "vLLM",
        "call": "find_spec('flash_attn.flash_attn_triton_amd') is not None",
        "kind": "find_spec", "module": "flash_attn.flash_attn_triton_amd",
        "when": ["rocm", "flash_attn"],
        "source": f"{VLLM} pull 32944 (merged 2026-01-23): vllm/platforms/rocm.py "
        "flash_attn_triton_available(), used for RDNA (gfx1x) ViT attention",
        "effect": "flash-attn releases whose Triton backend moved to aiter lack this private "
        "module, so vLLM falls back to TORCH_SDPA without an error (vllm#50449)",
    },
    {
        "id": "vllm.vit.triton_amd.env",
        "app": "vLLM",
        "call": "os.environ.get('FLASH_ATTENTION_TRITON_AMD_ENABLE') == 'TRUE'",
        "kind": "env", "variable": "FLASH_ATTENTION_TRITON_AMD_ENABLE", "value": "TRUE",
        "when": ["rocm", "flash_attn"],
        "source": f"{VLLM} pull 32944: vllm/platforms/rocm.py flash_attn_triton_available()",
        "effect": "unset, vLLM logs 'Set FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE …' once and "
        "uses TORCH_SDPA",
    },
)  # fmt: skip


def _facts() -> dict[str, Any]:
    """What decides whether a probe applies here."""
    facts: dict[str, Any] = {"flash_attn": importlib.util.find_spec("flash_attn") is not None}
    try:
        import torch

        facts["rocm"] = bool(getattr(torch.version, "hip", None))
        facts["gpu"] = bool(torch.cuda.is_available())
    except ImportError:
        facts["rocm"] = facts["gpu"] = False
    return facts


def _resolve(module: str, attr: str | None) -> Any:
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


def _offers(module: str) -> str:
    """What the image has instead, for a failure message: the package's submodules."""
    top = module.split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None:
        return f"{top} is not installed"
    subs = sorted(m.name for m in pkgutil.iter_modules(spec.submodule_search_locations or []))
    version = ""
    try:
        from importlib import metadata

        version = " " + metadata.version(top.replace("_", "-"))
    except Exception:  # noqa: BLE001 - the version is only context
        pass
    return f"{top}{version} has {', '.join(subs) or 'no submodules'}"


def signature(fn: Any) -> inspect.Signature:
    """A callable's signature; for a builtin without one (torch's scaled_dot_product_attention)
    the one its docstring opens with, which is what users and apps read."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        pass
    name = getattr(fn, "__name__", "")
    doc = " ".join((getattr(fn, "__doc__", None) or "").split())
    at = doc.find(f"{name}(")
    if not name or at < 0:
        raise ValueError(f"{name or fn!r} has no signature")
    depth, end = 0, at + len(name)
    for end in range(at + len(name), len(doc)):
        depth += {"(": 1, ")": -1}.get(doc[end], 0)
        if depth == 0:
            break
    params = doc[at + len(name) : end + 1]
    tree = ast.parse(f"def _f{params}: pass")  # parsed, never run: defaults must be literals
    for default in [*tree.body[0].args.defaults, *tree.body[0].args.kw_defaults]:
        if default is not None and not isinstance(default, ast.Constant):
            raise ValueError(f"{name}'s documented signature has a non-literal default")
    namespace: dict[str, Any] = {}
    exec(compile(tree, "<signature>", "exec"), {"__builtins__": {}}, namespace)  # noqa: S102
    return inspect.signature(namespace["_f"])


def _signature_text(fn: Any) -> str:
    try:
        return f"{getattr(fn, '__name__', 'it')}{signature(fn)}"
    except (TypeError, ValueError, SyntaxError):
        return repr(fn)


def probe(contract: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """One probe's result: status pass/fail/n/a and a sentence."""
    out = {k: contract[k] for k in ("id", "app", "call", "source")}
    missing = [w for w in contract.get("when", []) if not facts.get(w)]
    if missing:
        why = {
            "flash_attn": "flash_attn is not installed",
            "rocm": "torch is not a ROCm build",
            "gpu": "no GPU (ComfyUI sets SDPA's priority only where torch.cuda.is_available())",
        }
        out.update(status="n/a", message="; ".join(why[w] for w in missing))
        return out
    kind = contract["kind"]
    app, call = contract["app"], contract["call"]
    try:
        if kind == "find_spec":
            found = importlib.util.find_spec(contract["module"]) is not None
            ok, seen = found, ("found" if found else f"not found; {_offers(contract['module'])}")
        elif kind == "env":
            value = os.environ.get(contract["variable"])
            ok, seen = value == contract["value"], f"{contract['variable']}={value!r}"
        else:
            target = _resolve(contract["module"], contract.get("attr"))
            if kind == "import":
                ok, seen = True, "imports"
            elif kind == "attrs":
                absent = [n for n in contract["names"] if not hasattr(target, n)]
                ok = not absent
                seen = f"lacks {', '.join(absent)}" if absent else "has all"
            elif kind == "params":
                params = signature(target).parameters
                absent = [p for p in contract["params"] if p not in params]
                ok = not absent
                seen = _signature_text(target)
            elif kind == "bind":
                args = [None] * contract["positional"]
                kwargs = dict.fromkeys(contract["keywords"])
                try:
                    signature(target).bind(*args, **kwargs)
                    ok, seen = True, _signature_text(target)
                except TypeError as exc:
                    ok, seen = False, f"{exc}; the image has {_signature_text(target)}"
            else:
                raise ValueError(f"unknown probe kind {kind!r}")
    except (ImportError, AttributeError) as exc:
        ok, seen = False, f"{type(exc).__name__}: {exc}; {_offers(contract['module'])}"
    if ok:
        out.update(status="pass", message=seen)
    else:
        out.update(
            status="fail",
            message=f"{app}'s `{call}` does not hold here: {seen} ({contract['effect']})",
        )
    return out


def run(params: dict[str, Any], ctx) -> dict[str, Any]:
    """Every contract probe against this image."""
    facts = _facts()
    results = []
    for contract in CONTRACTS:
        ctx.progress(f"probe {contract['id']}")
        results.append(probe(contract, facts))
    failed = [r for r in results if r["status"] == "fail"]
    applied = [r for r in results if r["status"] != "n/a"]
    details = {"facts": facts, "probes": results}
    obs = {"apps.contracts.works": not failed}
    if failed:
        return {
            "status": "fail",
            "message": "; ".join(r["message"] for r in failed),
            "observations": obs,
            "details": details,
        }
    return {
        "status": "pass",
        "message": f"{len(applied)} of {len(results)} probes apply here and hold "
        f"({len(results) - len(applied)} n/a: no flash_attn, ROCm torch or GPU here)"
        if len(applied) < len(results)
        else f"all {len(results)} probes hold",
        "observations": obs,
        "details": details,
    }
