"""Causal prefill of one or a few sequences (``python -m attnforge_kernels.bench --prefill``): the
grids of a few programs per compute unit, where the order the programs launch in decides how
long the last of them runs alone (``configs.AttnConfig.paired_kv`` and ``across_heads``), and
two GPU-filling shapes beside them, to see what a change costs where it should change nothing.

Ours on the default config and under each ``--variant``, forward and forward + backward in bf16,
each path timed there and back (``dispatch.time_paths``) and reported as TFLOP/s, and
whether each other path's output and gradients equal the reference path's bit for bit (a change
of launch order alone must keep them equal): the first variant's where two or more are given
(on Hopper the default path runs the Gluon kernels, whose results differ from Triton's by
summation order, so the all-Triton path named first is the reference for the others), else the
default path's.
"""

from __future__ import annotations

import json

# (batch, query heads, kv heads, tokens, head dim): LLM GQA prefill of one or two sequences at
# 1-8k tokens (their causal grids hold 1-8 programs an SM on a 132-SM GPU), then two grids of 31
# an SM (the reference shape, causal, and the workload table's GQA prefill of 8 sequences).
SHAPES = (
    (1, 32, 8, 1024, 128),
    (1, 32, 8, 2048, 128),
    (1, 32, 8, 4096, 128),
    (2, 32, 4, 4096, 128),
    (1, 32, 8, 8192, 128),
    (1, 32, 8, 2048, 64),
    (1, 32, 8, 4096, 64),
    (1, 8, 8, 4096, 256),
    (4, 16, 16, 4096, 128),
    (8, 64, 8, 4096, 128),
)
MODES = ("fwd", "fwd+bwd")


def flops(b: int, hq: int, s: int, d: int, mode: str) -> float:
    """Causal attention's FLOPs as flash-attention counts them (the bench's ``flops``)."""
    f = 2 * b * hq * s * s * d  # 4*b*h*s*s*d, halved for the causal mask
    return f * (3.5 if mode == "fwd+bwd" else 1.0)


def _results(q, k, v, do, spec: str | None):
    """(out, dq, dk, dv) of one causal call under a config override."""
    from ..api.flash_attn import flash_attn_func
    from ..device import configs

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with configs.overridden(spec):
        out = flash_attn_func(*leaves, causal=True)
        out.backward(do)
    return [out.detach(), *(t.grad for t in leaves)]


def run_prefill(variants: dict, shapes=SHAPES, rounds: int = 2, device: str = "cuda") -> dict:
    """Every shape's times per path (``default`` and each of ``variants``: name -> JSON override)
    and each variant's bitwise equality with the default path, printed as it goes."""
    import torch

    from .dispatch import time_paths

    paths = {"default": None, **{name: spec or None for name, spec in variants.items()}}
    reference = list(variants)[0] if len(variants) > 1 else "default"
    rows = []
    for b, hq, hk, s, d in shapes:
        torch.manual_seed(0)
        q = torch.randn(b, s, hq, d, device=device, dtype=torch.bfloat16)
        k, v = (torch.randn(b, s, hk, d, device=device, dtype=q.dtype) for _ in "kv")
        do = torch.randn_like(q)
        ref = _results(q, k, v, do, paths[reference])
        equal = {}
        for name, spec in paths.items():
            if name != reference:
                got = _results(q, k, v, do, spec)
                equal[name] = all(torch.equal(a, c) for a, c in zip(ref, got, strict=True))
        # An untimed call of every path first (the dispatch sweep makes one of its default path).
        ms = time_paths(q, k, v, do, True, paths, rounds, warm=paths.values())
        row = {"shape": [b, hq, hk, s, d], "ms": ms, "reference": reference, "equal": equal}
        rows.append(row)
        print(_line(row), flush=True)
    return {"prefill_rows": rows, "variants": {n: json.loads(s) if s else None
                                               for n, s in paths.items()}}  # fmt: skip


def tflops(row: dict, mode: str, path: str) -> float:
    b, hq, _, s, d = row["shape"]
    return flops(b, hq, s, d, mode) / (row["ms"][mode][path] * 1e-3) / 1e12


def _line(row: dict) -> str:
    b, hq, hk, s, d = row["shape"]
    cells = "; ".join(
        f"{mode} " + " ".join(f"{p}={tflops(row, mode, p):.1f}" for p in row["ms"][mode])
        for mode in MODES
    )
    same = " ".join(f"{n}={'equal' if ok else 'DIFFERS'}" for n, ok in row["equal"].items())
    return f"({b}, {hq}/{hk}, {s}, {d}) TFLOP/s {cells}; against {row['reference']}: {same}"


def prefill_table(result: dict) -> str:
    """Markdown: TFLOP/s per shape, path and mode, each variant's time over the default path's,
    and whether each path's results equal the reference path's."""
    rows = result["prefill_rows"]
    paths = list(rows[0]["ms"]["fwd"])
    variants = paths[1:]
    compared = list(rows[0]["equal"])
    head = ["shape (b, hq/hk, s, d), causal bf16"]
    for mode in MODES:
        head += [f"{mode} {p}" for p in paths] + [f"{mode} {v}/default" for v in variants]
    head += [f"{p} = {rows[0]['reference']}" for p in compared]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        b, hq, hk, s, d = row["shape"]
        cells = [f"({b}, {hq}/{hk}, {s}, {d})"]
        for mode in MODES:
            ms = row["ms"][mode]
            cells += [f"{tflops(row, mode, p):.1f}" for p in paths]
            cells += [f"{ms[v] / ms['default']:.3f}" for v in variants]
        cells += ["yes" if row["equal"][p] else "**no**" for p in compared]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
