"""The ``env`` check: versions, device and every attention-related environment knob."""

from __future__ import annotations

import glob
import importlib
import json
import os
import platform
import sys
from typing import Any

ENV_KNOBS = (
    "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL",
    "TORCH_ROCM_FA_PREFER_CK",
    "PYTORCH_ROCM_ARCH",
    "HSA_OVERRIDE_GFX_VERSION",
    "AMD_SERIALIZE_KERNEL",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "FLASH_ATTENTION_TRITON_AMD_ENABLE",
    "FLASH_ATTENTION_TRITON_AMD_AUTOTUNE",
    "FLASH_ATTENTION_TRITON_AMD_DEBUG",
    "FLASH_ATTENTION_FWD_TRITON_AMD_CONFIG_JSON",
    "ROCM_PATH",
    "HIP_PATH",
    "HSA_NO_SCRATCH_RECLAIM",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "TORCH_BLAS_PREFER_HIPBLASLT",
    "TORCH_CUDNN_SDPA_DEPRIORITIZED",
    # transformers' switch for kernels fetched from the Hub at run time (validate apps)
    "USE_HUB_KERNELS",
    # CPU thread caps: they set what a CPU benchmark measures (invoke validate passes the host's
    # into the image: attnforge/validation.py THREAD_ENV)
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)
ENV_PREFIXES = ("TRITON_", "AOTRITON_", "ATTNFORGE_")


def attention_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The attention-related variables that are set, named or by prefix."""
    environ = dict(os.environ if environ is None else environ)
    return {
        k: v for k, v in sorted(environ.items()) if k in ENV_KNOBS or k.startswith(ENV_PREFIXES)
    }


def base_arch(gcn_arch_name: str) -> str:
    """'gfx1151:sramecc-:xnack-' -> 'gfx1151'."""
    return gcn_arch_name.split(":", 1)[0].strip()


def _version(modname: str) -> tuple[bool, str | None, str | None]:
    try:
        mod = importlib.import_module(modname)
    except Exception as exc:  # noqa: BLE001 - a broken package is an observation
        return False, None, f"{type(exc).__name__}: {exc}".splitlines()[0]
    return True, str(getattr(mod, "__version__", "unknown")), None


def rocm_version() -> str | None:
    """The ROCm release of /opt/rocm (or ROCM_PATH), if one is installed."""
    root = os.environ.get("ROCM_PATH", "/opt/rocm")
    for name in (".info/version", ".info/version-dev"):
        path = os.path.join(root, name)
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError:
            continue
    return None


ROCM_PYTHON_PACKAGES = ("rocm", "rocm-sdk-core", "rocm-sdk-libraries", "rocm-sdk-devel")


def python_package_versions(names: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of the named distributions (TheRock ships ROCm as pip packages)."""
    from importlib import metadata

    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


# Written into every attnforge image by its layers (the plan's versions manifest: each layer's
# pins, e.g. flash-attention's SOURCE_REF); absent on a bare host.
IMAGE_VERSIONS = "/opt/attnforge/versions.json"


def image_versions(path: str = IMAGE_VERSIONS) -> dict[str, Any] | None:
    """The image's versions manifest, or None where there is none (or it is unreadable)."""
    try:
        with open(path, encoding="utf-8") as fh:
            found = json.load(fh)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def aotriton_libs(torch_dir: str) -> list[str]:
    return sorted(
        os.path.basename(p) for p in glob.glob(os.path.join(torch_dir, "lib", "libaotriton*"))
    )


def run(params: dict[str, Any], ctx) -> dict[str, Any]:
    details: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "env": attention_env(),
        "rocm_version": rocm_version(),
        "rocm_python_packages": python_package_versions(ROCM_PYTHON_PACKAGES),
        "image_versions": image_versions(),
    }
    obs: dict[str, Any] = {}
    ctx.progress("import torch")
    import torch

    details["torch"] = {
        "version": torch.__version__,
        "git_version": getattr(torch.version, "git_version", None),
        "hip": getattr(torch.version, "hip", None),
        "cuda": getattr(torch.version, "cuda", None),
        "debug": getattr(torch.version, "debug", None),
        "path": os.path.dirname(torch.__file__),
    }
    obs["torch.version"] = torch.__version__
    obs["torch.hip"] = bool(getattr(torch.version, "hip", None))
    obs["torch.cuda"] = bool(getattr(torch.version, "cuda", None))
    libs = aotriton_libs(os.path.dirname(torch.__file__))
    details["aotriton_libs"] = libs
    obs["aotriton.present"] = bool(libs)

    for mod, key in (("triton", "triton"), ("flash_attn", "flash_attn")):
        ctx.progress(f"import {mod}")
        ok, ver, err = _version(mod)
        details[key] = {"present": ok, "version": ver, "error": err}
        if key == "triton":
            obs["triton.present"] = ok
            if ver:
                obs["triton.version"] = ver
        elif ver:
            obs["flash_attn.version"] = ver

    ctx.progress("query devices")
    available = bool(torch.cuda.is_available())
    obs["torch.gpu_available"] = available
    devices = []
    if available:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gcn = getattr(p, "gcnArchName", None)
            dev = {
                "index": i,
                "name": p.name,
                "total_memory_bytes": int(p.total_memory),
                "multi_processor_count": getattr(p, "multi_processor_count", None),
            }
            if obs["torch.hip"] and gcn:
                dev["gcn_arch_name"] = gcn
                dev["arch"] = base_arch(gcn)
            else:
                dev["arch"] = f"sm_{p.major}{p.minor}"
                dev["compute_capability"] = f"{p.major}.{p.minor}"
            devices.append(dev)
        obs["torch.device_arch"] = devices[0]["arch"]
    details["devices"] = devices
    details["cpu_capability"] = _cpu_capability(torch)
    try:
        details["cudnn_version"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001 - no cuDNN/MIOpen in this build
        details["cudnn_version"] = None
    name = devices[0]["name"] if devices else f"CPU ({details['machine']})"
    msg = f"torch {torch.__version__}"
    msg += f", HIP {details['torch']['hip']}" if obs["torch.hip"] else ""
    msg += f", CUDA {details['torch']['cuda']}" if obs["torch.cuda"] else ""
    msg += f"; device: {name}"
    if devices:
        msg += f" ({devices[0]['arch']})"
    return {"status": "pass", "message": msg, "observations": obs, "details": details}


def _cpu_capability(torch) -> str | None:
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - older torch
        return None
