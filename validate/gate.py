"""The AOTriton experimental gate as applications see it (standard library only).

On an arch whose AOTriton calls it experimental, ROCm torch runs flash and memory-efficient SDPA
only with ``TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1`` and falls back to math without it
(aten/src/ATen/native/transformers/cuda/sdp_utils.cpp reads it once per process into a static).
Applications set it themselves on import (unslothai/unsloth#8821; Comfy-Org/ComfyUI#10168 turns
it on by default), so a stack validated in one gate state runs other kernels in the other. Where
the recipes (recipes/arches.yaml ``aotriton.experimental``, handed in by the expect file) call the
arch experimental, the suite runs the grid and the workload check in the other state too, each
in a fresh process that sets the variable before its first SDPA call, and ``compare`` states the
difference. Elsewhere it is a no-op that says why.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

KNOB = "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"
# c10::utils::check_env's spellings of true.
_TRUE = ("1", "y", "yes", "true", "on")
SUFFIX = {"on": "@gate-on", "off": "@gate-off"}
COMPARE_ID = "sdpa.aotriton_gate"
NOT_ROCM = (
    f"{KNOB} is read only by ROCm torch's AOTriton: this torch is not a ROCm build "
    "(torch.hip is false), so the other gate state would run the same kernels"
)


def state_of(environ: Mapping[str, str]) -> str:
    """'on' when ``environ`` enables the gate, else 'off'."""
    return "on" if environ.get(KNOB, "").strip().lower() in _TRUE else "off"


def other(state: str) -> str:
    return "off" if state == "on" else "on"


def apply(params: Mapping[str, Any]) -> str | None:
    """Set this process's gate to ``params['gate']`` ('on'/'off') before its first SDPA call;
    the worker puts the environment back after the check. Returns the state, or None."""
    state = params.get("gate")
    if state == "on":
        os.environ[KNOB] = "1"
    elif state == "off":
        os.environ.pop(KNOB, None)
    return state


def why_not(aotriton: Mapping[str, Any] | None, arch: str | None = None) -> str | None:
    """Why the other gate state is not run here, or None when the recipes call the arch's
    AOTriton experimental."""
    if not aotriton:
        return (
            "no AOTriton facts for this run (no expect file from the recipes, or a torch without "
            f"AOTriton: the cpu stack, NVIDIA), so {KNOB} changes nothing here"
        )
    if not aotriton.get("experimental"):
        return (
            f"recipes/arches.yaml does not call {arch or 'this arch'} experimental in AOTriton "
            f"{aotriton.get('version')}: {KNOB} changes nothing here"
        )
    return None


def _case_view(rec: Mapping[str, Any]) -> dict[str, Any]:
    d = rec.get("details") or {}
    runs = {b: e.get("run") for b, e in (d.get("backends") or {}).items() if e.get("run")}
    return {"status": rec.get("status"), "default": d.get("default_backend"), "runs": runs}


def _workload_view(rec: Mapping[str, Any]) -> dict[str, Any]:
    rows = (rec.get("details") or {}).get("shapes") or []
    shapes = {r["shape"]: ("fused" if r.get("fused") else "math", r.get("run")) for r in rows}
    return {"status": rec.get("status"), "shapes": shapes}


def _differences(name: str, a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What changed between two views of one check (image state ``a``, other state ``b``)."""
    out = []
    if a["status"] != b["status"]:
        out.append(f"{name}: {a['status']} -> {b['status']}")
    if a.get("default") != b.get("default"):
        out.append(f"{name}: default {a.get('default')} -> {b.get('default')}")
    for key in ("runs", "shapes"):
        for item in sorted(set(a.get(key, {})) | set(b.get(key, {}))):
            x, y = a.get(key, {}).get(item), b.get(key, {}).get(item)
            if x != y:
                out.append(f"{name}: {item} {_text(x)} -> {_text(y)}")
    return out


def _text(v: Any) -> str:
    return "/".join(map(str, v)) if isinstance(v, tuple) else str(v)


def compare(params: Mapping[str, Any], records: Mapping[str, Mapping[str, Any]],
            seen: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]]:  # fmt: skip
    """(status, message, details) of the comparison: each check of the image's gate state
    against its copy in the other state (``params['pairs']``: [image id, other id])."""
    state, value = params.get("image_state", "off"), params.get("image_value")
    said = (f"the image's environment sets {KNOB}={value} (gate {state})" if value is not None
            else f"the image's environment leaves {KNOB} unset (gate off)")  # fmt: skip
    details: dict[str, Any] = {"image_state": state, "image_value": value,
                               "other_state": other(state), "pairs": []}  # fmt: skip
    reason = params.get("why_not") or (NOT_ROCM if seen.get("torch.hip") is False else None)
    if reason:
        return "skip", f"{said}; not compared: {reason}", details
    diffs: list[str] = []
    for mine, theirs in params.get("pairs", []):
        a, b = records.get(mine), records.get(theirs)
        if a is None or b is None:
            continue
        view = _workload_view if mine.startswith("sdpa.workloads") else _case_view
        found = _differences(mine.split(".", 2)[-1], view(a), view(b))
        details["pairs"].append({"image": mine, "other": theirs, "differences": found})
        diffs += found
    details["differences"] = diffs
    n = len(details["pairs"])
    if not diffs:
        return "pass", f"{said}; with it {other(state)}: no difference in {n} checks", details
    shown = "; ".join(diffs[:8]) + (f"; ... {len(diffs) - 8} more" if len(diffs) > 8 else "")
    return (
        "pass",
        f"{said}; with it {other(state)}, {len(diffs)} differences in {n} checks: {shown}",
        details,
    )
