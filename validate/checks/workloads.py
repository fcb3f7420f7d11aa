"""SDPA at real workloads' shapes: which backend the default call picks, the kernel the profiler
sees, and whether it is fused (issue 25 §2).

A silent fallback to the math path is the slow-down users report most (ViT head dim 72 on gfx1151
about 21x slower: ROCm/ATOM#1357, aiter#4065). For each shape of contract/workloads.py this records
``torch._fused_sdp_choice``, ``can_use_*`` with PyTorch's reasons, and one default call under the
profiler; a stack's recipe promises ``sdpa.workload.<name>.fused`` per arch (recipes/stacks.yaml
``fused:``), and a promise that breaks says which shape fell back and why (validate/expect.py).
Outputs are only checked for NaN/Inf here (an fp32 reference at 7k tokens x 24 heads would cost
more than the rest of the suite); correctness at these head dims is the grid's job.
"""

from __future__ import annotations

from typing import Any

from contract import workloads
from validate.checks.sdpa import (
    CAN_USE,
    backend_from_ops,
    can_use,
    captured_warnings,
    fused_choice,
    profile_kernels,
)
from validate.grid import Case
from validate.runner import is_device_fault

# A math fallback at a large shape is not run: its scores alone would need this much memory.
MATH_RUN_LIMIT_BYTES = 2 << 30


def selected_shapes(quick: bool, device: str) -> list[dict[str, Any]]:
    """Every workload's shapes (the first of each with ``quick``), shrunk on CPU."""
    out = []
    for name in workloads.WORKLOADS:
        shapes = workloads.shapes(name)
        for s in shapes[:1] if quick else shapes:
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


def observe_shape(torch, s: dict[str, Any], device: str) -> dict[str, Any]:
    """One shape: PyTorch's pick and reasons, and what one default call ran."""
    from validate.checks.sdpa import _sync, sdpa_call, sdpa_params

    c = _case(s)
    q, k, v = _inputs(torch, s, device)
    row: dict[str, Any] = {"shape": s["name"], "workload": s["workload"], "reasons": {}}
    row["params"] = {key: s[key] for key in ("b", "h", "hkv", "sq", "sk", "d", "causal", "dtype")}
    try:
        p = sdpa_params(torch, q, k, v, c)
        for b in CAN_USE:
            ok, reasons = can_use(torch, b, p)
            row["reasons"][b] = [] if ok else reasons
    except Exception as exc:  # noqa: BLE001 - recorded
        row["reasons_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    with captured_warnings():
        pick, how = fused_choice(torch, q, k, v, c)
    row["default_backend"], row["default_backend_source"] = pick, how
    scores = s["b"] * s["h"] * s["sq"] * s["sk"] * 4
    if pick == "math" and scores > MATH_RUN_LIMIT_BYTES:
        row["run"] = f"not run: math here would hold {scores / 2**30:.1f} GiB of scores"
        row["kernels"], row["profiler_backend"] = [], None
    else:
        box: list = []
        try:
            with captured_warnings():
                kernels, ops = profile_kernels(
                    torch, lambda: box.append(sdpa_call(torch, q, k, v, c)), device
                )
            _sync(torch, device)
        except Exception as exc:  # noqa: BLE001
            text = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
            if is_device_fault(text):
                raise
            row["run"] = f"error: {text}"
            kernels, ops = [], []
        else:
            bad = int((~torch.isfinite(box[0].float())).sum().item())
            row["run"] = f"{bad} non-finite values (NaN/inf) in the output" if bad else "ok"
        row["kernels"], row["profiler_backend"] = kernels, backend_from_ops(ops)
    ran = row["profiler_backend"] or pick
    row["fused"] = ran is not None and ran != "math"
    return row


def run(params: dict[str, Any], ctx) -> dict[str, Any]:
    """Every workload shape: default pick, profiler kernel, fused or not."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for s in selected_shapes(bool(params.get("quick")), device):
        ctx.progress(f"workload shape {s['name']}")
        rows.append(observe_shape(torch, s, device))
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
    broken = [f"{r['shape']} ({r['default_backend'] or '?'}): {r['run']}" for r in rows
              if r["run"] != "ok" and not r["run"].startswith("not run")]  # fmt: skip
    math = [r["shape"] for r in rows if not r["fused"]]
    msg = f"{len(rows) - len(math)}/{len(rows)} workload shapes fused"
    if math:
        msg += "; math: " + ", ".join(math)
    details = {"device": device, "shapes": rows}
    if broken:
        return {"status": "fail", "message": msg + " | " + "; ".join(broken),
                "observations": obs, "details": details}  # fmt: skip
    return {"status": "pass", "message": msg, "observations": obs, "details": details}
