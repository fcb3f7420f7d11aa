"""SDPA at real workloads' shapes: which backend the default call picks, the kernel the profiler
sees, whether it is fused, and whether every backend that accepts the shape gets it right.

A silent fallback to the math path is the slow-down users report most (ViT head dim 72 on gfx1151
about 21x slower: ROCm/ATOM#1357, aiter#4065). For each shape of contract/workloads.py this records
``torch._fused_sdp_choice``, ``can_use_*`` with PyTorch's reasons, and one default call under the
profiler; a stack's recipe promises ``sdpa.workload.<name>.fused`` per arch (recipes/stacks.yaml
``fused:``), and a promise that breaks says which shape fell back and why (validate/expect.py).

Black (NaN) images came from bf16 SDPA through the efficient backend on gfx1151 and gfx1201
while the default pick elsewhere was fine (Comfy-Org/ComfyUI#14249, #14379), so every backend that
accepts a shape is also forced once, and each output (the default's too) is judged by the grid's
rule against a reference computed a few heads at a time (numerics.judge_in_chunks), with NaN/Inf
named per backend. The diffusion workloads whose contract dtype is fp16 (SD 1.5, SDXL) run in bf16
as well, as ComfyUI runs them on these GPUs.
"""

from __future__ import annotations

from typing import Any

from contract import workloads
from validate.checks.sdpa import (
    CAN_USE,
    ENUM_NAMES,
    GPU_ONLY,
    backend_from_ops,
    can_use,
    captured_warnings,
    forced,
    fused_choice,
    probe,
    profile_kernels,
    sdpa_call,
    sdpa_params,
    sync_device,
)
from validate.gate import KNOB
from validate.gate import apply as apply_gate
from validate.grid import BACKENDS, Case
from validate.runner import is_device_fault

# A math fallback at a large shape is not run: its scores alone would need this much memory.
MATH_RUN_LIMIT_BYTES = 2 << 30
# Workloads whose shapes also run in bf16 (their contract dtype is fp16): ComfyUI's bf16 NaN.
BF16_TOO = ("sd15", "sdxl")


def selected_shapes(quick: bool, device: str) -> list[dict[str, Any]]:
    """Every workload's shapes (the first of each with ``quick``), shrunk on CPU."""
    out = []
    for name in workloads.WORKLOADS:
        shapes = workloads.shapes(name)
        chosen = shapes[:1] if quick else shapes
        if name in BF16_TOO:
            chosen = chosen + [{**s, "name": f"{s['name']}-bf16", "dtype": "bf16"} for s in chosen]
        for s in chosen:
            s = workloads.tiny(s) if device == "cpu" else s
            out.append({**s, "workload": name})
    return out


def _case(s: dict[str, Any]) -> Case:
    return Case(s["name"], s["dtype"], s["causal"], s["d"], s["h"], s["hkv"], s["sq"], s["sk"],
                batch=s["b"])  # fmt: skip


def _inputs(torch, s: dict[str, Any], device: str):
    """Normal q, k, v made on the device (a CPU generator would take seconds at 4k x 64 heads)."""
    from validate.checks.numerics import torch_dtype

    torch.manual_seed(0)
    dt = torch_dtype(s["dtype"])

    def rnd(h: int, n: int):
        return torch.randn(s["b"], h, n, s["d"], device=device, dtype=dt)

    return rnd(s["h"], s["sq"]), rnd(s["hkv"], s["sk"]), rnd(s["hkv"], s["sk"])


def _pick_and_reasons(torch, s: dict[str, Any], c: Case, ins: tuple, row: dict[str, Any]) -> None:
    """can_use_* with PyTorch's reasons, then the default pick."""
    q, k, v = ins
    try:
        p = sdpa_params(torch, q, k, v, c)
        for b in CAN_USE:
            ok, reasons = can_use(torch, b, p)
            row["can_use"][b] = ok
            row["reasons"][b] = [] if ok else reasons
    except Exception as exc:  # noqa: BLE001 - recorded
        row["reasons_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    with captured_warnings():
        pick, how = fused_choice(torch, q, k, v, c)
    row["default_backend"], row["default_backend_source"] = pick, how


class DeferredFault(Exception):
    """The checked op after a run failed: the run left the device faulted."""


def _probe(torch, device: str, what: str) -> None:
    """A checked op after a run; a fault it finds is charged to that run and ends the check."""
    deferred = probe(torch, device)
    if deferred:
        raise DeferredFault(
            f"the checked op after the {what} (deferred, charged to it): {deferred}"
        )


def _math_too_big(s: dict[str, Any]) -> str | None:
    scores = s["b"] * s["h"] * s["sq"] * s["sk"] * 4
    if scores > MATH_RUN_LIMIT_BYTES:
        return f"not run: math here would hold {scores / 2**30:.1f} GiB of scores"
    return None


def _default_call(torch, s, c: Case, ins: tuple, device: str, row: dict[str, Any]):
    """One default call under the profiler: its output, or None (not run, or it raised)."""
    q, k, v = ins
    row["kernels"], row["profiler_backend"] = [], None
    too_big = _math_too_big(s) if row["default_backend"] == "math" else None
    if too_big:
        row["run"] = too_big
        return None
    box: list = []
    try:
        with captured_warnings():
            kernels, ops = profile_kernels(
                torch, lambda: box.append(sdpa_call(torch, q, k, v, c)), device
            )
        sync_device(torch, device)
    except Exception as exc:  # noqa: BLE001
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
        if is_device_fault(text):
            raise
        row["run"] = f"error: {text}"
        return None
    row["kernels"], row["profiler_backend"] = kernels, backend_from_ops(ops)
    _probe(torch, device, f"default run at {s['name']}")
    return box[0]


def _forced_call(torch, s, c: Case, ins: tuple, device: str, b: str, row: dict[str, Any]):
    """One forced run of backend ``b`` where it accepts the shape: its output, or None with the
    reason in ``row['backends'][b]``. A fault it leaves behind is charged to it (probe)."""
    entry = row["backends"].setdefault(b, {})
    if device == "cpu" and b in GPU_ONLY:
        entry.update(run="skip", error=f"{ENUM_NAMES[b]} has no CPU kernel in PyTorch")
        return None
    too_big = _math_too_big(s) if b == "math" else None
    if too_big:
        entry["run"] = too_big
        return None
    try:
        with forced(torch, b):
            out = sdpa_call(torch, *ins, c)
            sync_device(torch, device)
    except Exception as exc:  # noqa: BLE001
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
        if is_device_fault(text):
            raise
        # Refusing is honest when can_use_* said no; math must always run.
        usable = b == "math" or row["can_use"].get(b) is True
        entry.update(run="fail" if usable else "unsupported", error=text)
        return None
    _probe(torch, device, f"forced {b} run at {s['name']}")
    return out


def _judge_outputs(row: dict[str, Any], ins: tuple, causal: bool, outs: dict[str, Any]) -> None:
    """Every output against one reference pass; NaN/Inf and wrong values named per backend."""
    from validate.checks.numerics import judge_in_chunks

    for name, j in judge_in_chunks(outs, *ins, causal).items():
        if name == "default":
            row["run"] = "ok" if j.ok else j.message
            row["default_judgement"] = j.to_json()
            continue
        entry = row["backends"][name]
        entry.update(run="pass" if j.ok else "fail", judgement=j.to_json())
        if not j.ok:
            entry["error"] = j.message


def observe_shape(torch, s: dict[str, Any], device: str) -> dict[str, Any]:
    """One shape: PyTorch's pick and reasons, what one default call ran, and each backend that
    accepts the shape forced once, all judged."""
    c = _case(s)
    ins = _inputs(torch, s, device)
    row: dict[str, Any] = {"shape": s["name"], "workload": s["workload"], "reasons": {},
                           "can_use": {}, "backends": {}}  # fmt: skip
    row["params"] = {key: s[key] for key in ("b", "h", "hkv", "sq", "sk", "d", "causal", "dtype")}
    _pick_and_reasons(torch, s, c, ins, row)
    outs = {}
    default = _default_call(torch, s, c, ins, device, row)
    if default is not None:
        outs["default"] = default
    for b in BACKENDS:
        out = _forced_call(torch, s, c, ins, device, b, row)
        if out is not None:
            outs[b] = out
    if outs:
        _judge_outputs(row, ins, s["causal"], outs)
    ran = row["profiler_backend"] or row["default_backend"]
    row["fused"] = ran is not None and ran != "math"
    return row


def _broken(rows: list[dict[str, Any]]) -> list[str]:
    """'shape (backend): what went wrong' for each wrong default run and each failed backend."""
    out = []
    for r in rows:
        if r["run"] != "ok" and not r["run"].startswith("not run"):
            out.append(f"{r['shape']} ({r['default_backend'] or '?'}): {r['run']}")
        for b, e in r["backends"].items():
            if e.get("run") == "fail":
                out.append(f"{r['shape']} (forced {b}): {e.get('error')}")
    return out


def _observations(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """sdpa.workload.<name>.fused per workload, and the shapes that fell back to math."""
    obs: dict[str, Any] = {}
    for name in workloads.WORKLOADS:
        mine = [r for r in rows if r["workload"] == name]
        if not mine:
            continue
        obs[f"sdpa.workload.{name}.fused"] = all(r["fused"] for r in mine)
        fallbacks = [
            {k: r[k] for k in ("shape", "params", "default_backend", "reasons")}
            for r in mine
            if not r["fused"]
        ]
        if fallbacks:
            obs[f"sdpa.workload.{name}.fallbacks"] = fallbacks
    return obs


def run(params: dict[str, Any], ctx) -> dict[str, Any]:
    """Every workload shape: default pick, profiler kernel, fused or not, each backend judged."""
    gate = apply_gate(params)  # before this process's first SDPA call (torch reads it once)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows: list[dict[str, Any]] = []
    details: dict[str, Any] = {"device": device, "shapes": rows}
    if gate:
        details["gate"] = {"variable": KNOB, "state": gate}
    try:
        for s in selected_shapes(bool(params.get("quick")), device):
            ctx.progress(f"workload shape {s['name']}")
            rows.append(observe_shape(torch, s, device))
    except DeferredFault as exc:
        return {"status": "crash", "message": f"GPU fault in {exc}", "details": details}
    # The other gate state's copy observes nothing: the image's own state makes the promises.
    obs = {} if gate else _observations(rows)
    math = [r["shape"] for r in rows if not r["fused"]]
    msg = f"{len(rows) - len(math)}/{len(rows)} workload shapes fused"
    if math:
        msg += "; math: " + ", ".join(math)
    broken = _broken(rows)
    if broken:
        return {"status": "fail", "message": msg + " | " + "; ".join(broken),
                "observations": obs, "details": details}  # fmt: skip
    return {"status": "pass", "message": msg, "observations": obs, "details": details}
