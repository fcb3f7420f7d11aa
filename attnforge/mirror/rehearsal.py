"""A rehearsal: an AMD stack built from a mirror of stand-in wheels (AMD's names, versions, local
labels, extras and Requires-Dist; CPU or metadata-only contents), so that every RUN line of its
Dockerfiles executes where no AMD index or GPU is.

Each smoke check is classified once, here: a check listed in NOT_REHEARSABLE needs AMD's own
payload (device code, compiled ops) and is reported with its reason, never run; every other check
runs and must pass. A check that would pass vacuously on a stand-in is listed too, so that a
rehearsal never counts it as shown. A device-code check that reads code objects (offload bundles,
AMDGPU ELF) runs on a stand-in library compiled by a real hipcc for the arch (tests/rehearsal.py),
so it shows the check reading real AMD code, not AMD's torch having it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# smoke check name (recipes/layers/*.yaml) -> why a rehearsal cannot show it
NOT_REHEARSABLE = {
    "torch's GPU code for the arch is on disk (AOTriton images, .kpack)": (
        "the stand-in device wheels carry placeholder files where AMD's carry code objects, so "
        "the check would pass on names alone"
    ),
    "AOTriton's kernel images for the arch are in the torch wheel": (
        "the stand-in torch carries placeholder AOTriton images: the check reads their folders' "
        "names and sizes, so it would pass on names alone"
    ),
    "torchvision's compiled ops load beside torch": (
        "torchvision's compiled ops exist only in pytorch.org's wheel (the stand-in is metadata only)"
    ),
    "torch was compiled for the arch": (
        "a CPU torch has no arch flags, so the check would pass vacuously"
    ),
    "torchvision's compiled ops load beside torch (TheRock#5374)": (
        "torchvision's compiled ops exist only in AMD's wheel (the stand-in is metadata only)"
    ),
    "torchaudio's ops load beside torch": (
        "torchaudio's ops exist only in AMD's wheel (the stand-in is metadata only)"
    ),
    "one HIP runtime in the process, the one rocm_sdk names (Triton 3.9)": (
        "it reads the libamdhip64 a ROCm torch maps and the one TheRock's rocm_sdk names: the "
        "stand-in torch is a CPU build that loads no HIP runtime, and the stand-in SDK ships none"
    ),
}


# layer -> why a rehearsal stops before it (that layer and every layer above are not built)
STOP_POINTS = {
    "flash-attention-rdna3-minimal": (
        "it compiles rocWMMA FlashAttention kernels with hipcc against ROCm torch's headers and "
        "libraries: the stand-in SDK's hipcc cannot compile, and a CPU torch has no HIP libraries"
    ),
    "aotriton": "it compiles AOTriton's GPU kernels with its own Triton for AMD targets",
    "pytorch-source": "it compiles PyTorch for HIP with the ROCm SDK's compilers and libraries",
    "ck": "it compiles Composable Kernel with the ROCm SDK's compilers",
    "flash-attention-rocm-fa3": "it compiles CK's FMHA kernels with the ROCm SDK's compilers",
}


@dataclasses.dataclass(frozen=True)
class Unrehearsed:
    layer: str
    check: str
    reason: str


def split_smoke(plan: Any) -> tuple[Any, list[Unrehearsed]]:
    """The plan with its not-rehearsable smoke checks taken out, and those checks."""
    left: list[Unrehearsed] = []
    steps = []
    for step in plan.steps:
        keep = []
        for check in step.smoke:
            reason = NOT_REHEARSABLE.get(check.get("name", ""))
            if reason is None:
                keep.append(check)
            else:
                left.append(Unrehearsed(step.layer, check["name"], reason))
        steps.append(dataclasses.replace(step, smoke=tuple(keep)))
    return dataclasses.replace(plan, steps=tuple(steps)), left


def stop_at(plan: Any) -> tuple[Any, Unrehearsed | None]:
    """The plan without the first layer that is a stop point and every layer above it (skipped,
    with the reason), and that stop point."""
    stop: Unrehearsed | None = None
    steps = []
    for step in plan.steps:
        if stop is None and step.runs and step.layer in STOP_POINTS:
            stop = Unrehearsed(step.layer, "stop point", STOP_POINTS[step.layer])
        if stop is not None and step.runs:
            why = f"rehearsal stop point at {stop.layer}: {stop.reason}"
            step = dataclasses.replace(step, status="skipped", reason=why)
        steps.append(step)
    final = plan.final_tag if stop is None else None
    return dataclasses.replace(plan, steps=tuple(steps), final_tag=final), stop


def report_lines(manifest_rehearsal: dict[str, Any], left: list[Unrehearsed]) -> list[str]:
    """What a rehearsal build prints first and last: that it is one, and what it did not show."""
    lines = [
        "REHEARSAL: built from stand-in wheels, not AMD's; its images can be neither published "
        "nor exported",
        f"  why: {manifest_rehearsal.get('why') or '-'}",
        "  stand-ins: " + ", ".join(manifest_rehearsal.get("stand_ins", [])),
    ]
    for u in left:
        what = "stops before" if u.check == "stop point" else "not rehearsable:"
        lines.append(f"  {what} {u.layer}: {u.reason}" if u.check == "stop point"
                     else f"  {what} {u.layer}: {u.check}: {u.reason}")  # fmt: skip
    return lines
