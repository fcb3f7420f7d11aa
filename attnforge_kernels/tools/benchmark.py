"""Benchmark: the kernels against PyTorch SDPA's flash and cuDNN backends, on one GPU, in one run.

FLOPs are counted as flash-attention does (perf.md section 0): forward 4*b*h*sq*sk*d, halved when
causal; forward+backward 3.5x that. Times are medians of ``triton.testing.do_bench``; with
``--rounds N`` every provider is timed in turn N times and keeps its fastest median, so that a GPU
clock that moves during the run (minutes of full load) costs every provider alike.

    python -m attnforge_kernels.bench [--quick] [--json FILE] [--variant NAME=JSON ...] [--rounds N]
    python -m attnforge_kernels.bench --workloads [--layout bshd|bhsd|both] [--mode fwd|fwd+bwd]
                                                  [--rounds N]
    python -m attnforge_kernels.bench --decode [--quick] [--splits N,N,...] [--batches N,...]
                                               [--caches N,...] [--gpu-time] [--variant NAME=JSON]
                                               [--rounds N]
    python -m attnforge_kernels.bench --host
    python -m attnforge_kernels.bench --breakdown [--variant NAME=JSON ...] [--quick]
    python -m attnforge_kernels.bench --dispatch [--seqs N,...] [--head-dims 64,128] [--gqa 1,4,7,8]
                                                 [--tokens N] [--gpu-time]

The sweep shapes are made as (b, h, s, d) tensors and handed to the kernels as BSHD views (SDPA's
layout, transposed). ``--workloads`` times the shapes of ``contract/workloads.py`` (SD 1.5, SDXL,
Qwen-Image, LLM GQA prefill) in either storage: ``bshd`` (contiguous (b, s, h, d), what
flash_attn callers and diffusers' projections give; SDPA gets the transposed view) or ``bhsd``
(contiguous (b, h, s, d); the kernels get the transposed view).

``--decode`` times one decoding step through ``flash_attn_with_kvcache`` (GQA 32/8 heads, d=128,
bf16, one query token, the whole cache visible) against every SDPA backend fed the same cache:
the (b, s, h, d) cache transposed to SDPA's (b, h, s, d) view with ``enable_gqa=True``, no copy.
``--splits`` times ours at those ``num_splits`` too (``ours-sN``), the data for a GPU's table in
``attnforge_kernels.device.decode.DECODE_SPLIT_WAVES``; ``--variant NAME=JSON`` times ours under a
config override of the cache kernels' tiles (``ours[NAME]``; ``kv_decode``, ``kv_decode_long``, ...:
``attnforge_kernels.device.decode.kv_override``). ``--gpu-time`` times each step as the GPU's
work alone (CUDA graphs of flushed steps less the flushes), without the launch gaps ``do_bench``
includes. ``--host`` times back-to-back calls with no L2 flush (the larger of host and GPU time per
call): a forward at a tiny shape, and a decoding step at batch 1 with 4096 keys, without and with a
new key appended (flash_attn's decoding loop), ours also unplanned (the full path every call).
``--dispatch`` times the default path against the all-Triton path and Gluon on Hopper
(attnforge_kernels/tools/dispatch.py); ``--seqs``, ``--head-dims`` and ``--gqa`` time a part of
that sweep, to fit a time limit, and ``--tokens`` sets its batch (batch x sequence; default 8192,
which fills the GPU; the sequence length alone, one sequence a shape, times the small grids of a
single prompt or image); ``--gpu-time`` times it as the GPU's work alone, as for decoding.
``--breakdown`` first prints the GPU time of each kernel in a fwd+bwd step at (4, 16, 4096,
128), causal and not, for ours, each variant and the SDPA backends, with the TFLOP/s of the
matrix products each attention kernel issues (``KERNEL_PRODUCTS``): where a path's time goes, and
how many products it spends (ours: 2 forward, 3 + 4 backward; cuDNN and FlashAttention 2: 2 and
5). Then it runs the sweep as without it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path

SHAPES = [
    # (b, h, s, d, causal, mode)
    (4, 16, 4096, 128, False, "fwd"),
    (4, 16, 4096, 128, True, "fwd"),
    (4, 16, 4096, 128, False, "fwd+bwd"),
    (4, 16, 4096, 128, True, "fwd+bwd"),
    (1, 24, 6032, 128, False, "fwd"),
    (1, 24, 6889, 128, False, "fwd"),
    (1, 24, 6889, 128, False, "fwd+bwd"),
    (4, 32, 4096, 64, False, "fwd"),
    (4, 32, 4096, 64, True, "fwd"),
    (4, 32, 4096, 64, False, "fwd+bwd"),
    (16, 32, 1024, 64, False, "fwd"),
    (2, 10, 4096, 64, False, "fwd"),  # SDXL 1024^2, 640-ch level
]
QUICK = [SHAPES[0], SHAPES[1], SHAPES[2], SHAPES[4]]
MEMORY_SHAPE = (1, 16, 32768, 128)
BREAKDOWN_SHAPE = (4, 16, 4096, 128)


def flops(b, h, s, d, causal, mode) -> float:
    f = 4.0 * b * h * s * s * d / (2 if causal else 1)
    return f if mode == "fwd" else 3.5 * f


def _providers(variants: dict):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..api.flash_attn import flash_attn_func

    def ours(spec):
        def run(q, k, v, causal):
            return flash_attn_func(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal
            ).transpose(1, 2)

        # The config override must cover the backward too, which runs outside this call:
        # _time and breakdown hold it around the whole step (_override_for).
        run.config_override = spec or ""
        return run

    def sdpa(backend):
        def run(q, k, v, causal):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return run

    provs = {"ours": ours(None)}
    for name, spec in variants.items():
        provs[f"ours[{name}]"] = ours(spec)
    provs["sdpa-flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
    provs["sdpa-cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
    return provs


def _time_each(provs: dict, time_ms, work: float, rounds: int = 1):
    """``time_ms(fn)`` for every provider, and the rate ``work / ms`` (work in the rate's unit
    times a millisecond: TFLOP/s from flops / 1e9, GB/s from bytes / 1e6): (ms and rate, each by
    name, and what a row adds: ``ms_rounds``, every round's ms, with ``rounds`` above 1, and
    ``errors`` where a provider failed). A backend that cannot run a shape gets None and its
    error, never fatal. With ``rounds`` above 1 the providers are timed in turn that many times (each
    once, then each again) and each keeps its fastest round: a GPU whose clock moves between
    consecutive timings then costs every provider alike (an H100 ran one fwd+bwd call, ours and
    cuDNN's alike, 10-13% apart in alternate timings minutes into a run: docs/benchmarks.md,
    "Run-to-run spread and rounds")."""
    runs: dict = {name: [] for name in provs}
    errors: dict = {}
    for _ in range(rounds):
        for name, fn in provs.items():
            if name in errors:
                continue
            try:
                runs[name].append(time_ms(fn))
            except Exception as e:  # reported, not fatal
                errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
    times = {name: None if name in errors else min(runs[name]) for name in provs}
    rates = {name: None if ms is None else work / ms for name, ms in times.items()}
    notes = {"ms_rounds": runs} if rounds > 1 else {}
    return times, rates, {**notes, "errors": errors} if errors else notes


def _override_for(fn):
    """The config override a provider's step runs under: ours (and each variant) its own
    ``config_override`` ("" for none), an SDPA provider none to set."""
    spec = getattr(fn, "config_override", None)
    if spec is None:
        return nullcontext()
    from ..device import configs

    return configs.overridden(spec or None)


def _time(fn, q, k, v, causal, mode):
    with _override_for(fn):
        return _time_inner(fn, q, k, v, causal, mode)


def _time_inner(fn, q, k, v, causal, mode):
    import torch
    from triton.testing import do_bench

    if mode == "fwd":
        with torch.no_grad():
            return do_bench(lambda: fn(q, k, v, causal), warmup=25, rep=200, return_mode="median")
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    do = torch.randn_like(q)

    def step():
        fn(qg, kg, vg, causal).backward(do)

    return do_bench(step, warmup=25, rep=200, grad_to_none=[qg, kg, vg], return_mode="median")


def _peak(fn, shape):
    import torch

    b, h, s, d = shape
    torch.cuda.empty_cache()
    q, k, v = (
        torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    do = torch.randn_like(q)
    fn(q, k, v, False).backward(do)  # warm-up: compile, workspaces
    q.grad = k.grad = v.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(q, k, v, False).backward(do)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del q, k, v, do
    return base, peak


WORKLOADS = ("sd15", "sdxl", "qwen-image", "llm")


def workload_shapes() -> list[dict]:
    """Every default shape of the workloads (contract.workloads), in their dtypes."""
    from contract import workloads

    return [sh for name in WORKLOADS for sh in workloads.shapes(name, None)]


def workload_flops(sh: dict, mode: str) -> float:
    """flash-attention's count, with the causal half for sq == sk (the workloads' causal case)."""
    f = 4.0 * sh["b"] * sh["h"] * sh["sq"] * sh["sk"] * sh["d"] / (2 if sh["causal"] else 1)
    return f if mode == "fwd" else 3.5 * f


def _workload_providers(variants: dict):
    """(name -> fn(q, k, v, causal) on BSHD-shaped views); SDPA gets the BHSD transpose."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..api.flash_attn import flash_attn_func

    def ours(spec):
        def run(q, k, v, causal):
            return flash_attn_func(q, k, v, causal=causal)

        run.config_override = spec or ""
        return run

    def sdpa(backend):
        def run(q, k, v, causal):
            gqa = {"enable_gqa": True} if k.shape[2] != q.shape[2] else {}
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                    **gqa,
                )  # fmt: skip
            return o.transpose(1, 2)

        return run

    provs = {"ours": ours(None)}
    for name, spec in variants.items():
        provs[f"ours[{name}]"] = ours(spec)
    provs["sdpa-flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
    provs["sdpa-cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
    return provs


def _make(b, s, h, d, dtype, layout: str):
    """A (b, s, h, d)-shaped tensor stored as ``layout`` (bshd contiguous, or a bhsd transpose)."""
    import torch

    if layout == "bshd":
        return torch.randn(b, s, h, d, device="cuda", dtype=dtype)
    return torch.randn(b, h, s, d, device="cuda", dtype=dtype).transpose(1, 2)


def run_workloads(layouts, modes, variants: dict, rounds: int = 1) -> dict:
    """TFLOP/s of the workload shapes, per storage layout and mode; each provider's best of
    ``rounds`` interleaved timings (:func:`_time_each`)."""
    import torch

    torch.manual_seed(0)
    provs = _workload_providers(variants)
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
    rows = []
    for sh in workload_shapes():
        b, h, hkv, sq, sk, d = (sh[k] for k in ("b", "h", "hkv", "sq", "sk", "d"))
        dt = dtypes[sh["dtype"]]
        for layout in layouts:
            q, k, v = (
                _make(b, n, heads, d, dt, layout) for n, heads in ((sq, h), (sk, hkv), (sk, hkv))
            )
            for mode in modes:
                times, rates, notes = _time_each(
                    provs,
                    lambda fn, a=(q, k, v, sh["causal"], mode): _time(fn, *a),
                    workload_flops(sh, mode) / 1e9,
                    rounds,
                )
                row = {"name": sh["name"], "layout": layout, "mode": mode, "tflops": rates,
                       "ms": times, **notes}  # fmt: skip
                rows.append(row)
                cells = " ".join(
                    f"{n}={t:7.1f}" if t is not None else f"{n}=   n/a"
                    for n, t in row["tflops"].items()
                )
                print(f"{sh['name']:40s} {layout} {mode:8s} {cells}", flush=True)
            del q, k, v
    return {"workload_rows": rows, "rounds": rounds}


def workload_table(result) -> str:
    """Markdown table of the workload rows: TFLOP/s and ours / SDPA-flash."""
    rows = result["workload_rows"]
    names = list(rows[0]["tflops"]) if rows else []
    lines = [
        "| shape | layout | mode | " + " | ".join(names) + " | ours/flash |",
        "|" + "---|" * (len(names) + 4),
    ]
    for r in rows:
        tf = r["tflops"]
        ratio = (
            f"{tf['ours'] / tf['sdpa-flash']:.2f}"
            if tf.get("ours") and tf.get("sdpa-flash")
            else "n/a"
        )
        cells = " | ".join(f"{tf[n]:.1f}" if tf[n] is not None else "n/a" for n in names)
        lines.append(f"| {r['name']} | {r['layout']} | {r['mode']} | {cells} | {ratio} |")
    return "\n".join(lines)


DECODE_BATCHES = (1, 8, 32, 64)
DECODE_CACHES = (4096, 16384, 65536, 131072)
DECODE_HEADS = (32, 8, 128)  # query heads, KV heads, head dim


def _decode_providers(splits=(), variants=None):
    """ours (also at each of ``splits`` and under each of ``variants``, NAME -> JSON config
    override, e.g. ``{"kv_decode_long": [16, 64, 4, 4]}``) and each SDPA backend."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..api.kvcache import flash_attn_with_kvcache
    from ..device import configs

    def ours(q, kc, vc):
        return flash_attn_with_kvcache(q, kc, vc)

    def sdpa(backend):
        def run(q, kc, vc):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(
                    q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2), enable_gqa=True
                )

        return run

    def ours_at(n):
        return lambda q, kc, vc: flash_attn_with_kvcache(q, kc, vc, num_splits=n)

    def ours_with(spec):
        def run(q, kc, vc):
            with configs.overridden(spec):
                return flash_attn_with_kvcache(q, kc, vc)

        return run

    return {
        "ours": ours,
        **{f"ours-s{n}": ours_at(n) for n in splits},
        **{f"ours[{name}]": ours_with(spec) for name, spec in (variants or {}).items()},
        "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa-efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
        "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }


def run_decode(
    batches=DECODE_BATCHES, caches=DECODE_CACHES, splits=(), gpu_time: bool = False,
    variants=None, rounds: int = 1,
) -> dict:  # fmt: skip
    """Microseconds per decoding step and the K/V read rate (GB/s), per batch and cache length:
    medians of ``do_bench`` (with the host's launch gaps), or with ``gpu_time`` the GPU's time
    alone (:func:`attnforge_kernels.tools.timing.graph_ms`); ours also under each config override
    of ``variants``; each provider's best of ``rounds`` interleaved timings (:func:`_time_each`)."""
    import torch
    from triton.testing import do_bench

    from .timing import graph_ms

    torch.manual_seed(0)
    hq, hk, d = DECODE_HEADS
    provs = _decode_providers(splits, variants)
    rows = []
    for b in batches:
        for s in caches:
            q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
            kc, vc = (
                torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2)
            )
            kv_bytes = 2 * kc.numel() * kc.element_size()

            def step_ms(fn, a=(q, kc, vc)):
                with torch.no_grad():
                    if gpu_time:
                        return graph_ms(lambda: fn(*a))
                    return do_bench(lambda: fn(*a), warmup=25, rep=100, return_mode="median")

            times, rates, notes = _time_each(provs, step_ms, kv_bytes / 1e6, rounds)
            row = {"batch": b, "cache": s,
                   "us": {n: None if ms is None else ms * 1e3 for n, ms in times.items()},
                   "gbps": rates, **notes}  # fmt: skip
            rows.append(row)
            cells = " ".join(
                f"{n}={t:8.1f}us" if t is not None else f"{n}=     n/a"
                for n, t in row["us"].items()
            )
            print(f"decode b={b:3d} cache={s:6d} {cells}", flush=True)
            del q, kc, vc, step_ms  # step_ms holds the cache too: free it before the next
            torch.cuda.empty_cache()
    return {
        "decode_rows": rows,
        "heads": list(DECODE_HEADS),
        "gpu_time": gpu_time,
        "rounds": rounds,
    }


def decode_table(result) -> str:
    """Markdown table of the decode rows: µs per step, K/V GB/s, ours against the best SDPA."""
    rows = result["decode_rows"]
    names = list(rows[0]["us"]) if rows else []
    lines = [
        "| batch | cache | " + " | ".join(f"{n} µs" for n in names)
        + " | ours GB/s | best SDPA | ours/best |",
        "|" + "---|" * (len(names) + 5),
    ]  # fmt: skip
    for r in rows:
        us = r["us"]
        sdpa = {n: t for n, t in us.items() if not n.startswith("ours") and t is not None}
        best = min(sdpa, key=sdpa.get) if sdpa else None
        ratio = f"{sdpa[best] / us['ours']:.2f}" if best and us.get("ours") else "n/a"
        cells = " | ".join(f"{us[n]:.1f}" if us[n] is not None else "n/a" for n in names)
        gb = r["gbps"].get("ours")
        lines.append(
            f"| {r['batch']} | {r['cache']} | {cells} | {f'{gb:.0f}' if gb else 'n/a'} | "
            f"{best or 'n/a'} | {ratio} |"
        )
    return "\n".join(lines)


def host_time(calls: int = 2000) -> dict:
    """Microseconds per call, back to back with no L2 flush between them (the larger of the
    host's and the GPU's time per call): the forward at a tiny shape (1, 16, 1, 64), and one
    decoding step at batch 1 with 4096 keys (the ``--decode`` table's first row, where the GPU
    takes about 20 µs and the flush in ``do_bench`` hides a host time below about 80 µs),
    without and with a new key appended at ``cache_seqlens``; ours also with the launch plans
    off (``launch.ENABLED``: the checks, choices and Triton's launch path every call)."""
    import time

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..api.flash_attn import flash_attn_func

    q, k, v = (torch.randn(1, 16, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def sdpa():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt)

    hq, hk, d = DECODE_HEADS
    dq = torch.randn(1, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(1, 4096, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    decode = _decode_providers()
    fns = {"ours": lambda: flash_attn_func(q, k, v), "sdpa-flash": sdpa}
    for name in ("ours", "sdpa-flash", "sdpa-cudnn"):
        fns[f"decode b1 x 4096: {name}"] = lambda fn=decode[name]: fn(dq, kc, vc)
    # A loop's step as flash_attn's API is meant for: the new token's key and value appended at
    # cache_seqlens (the same row every call here), attention over the cache up to it.
    from ..api.kvcache import flash_attn_with_kvcache
    from ..launch import plans as launch

    kn, vn = (torch.randn(1, 1, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((1,), 4000, dtype=torch.int32, device="cuda")

    def append():
        return flash_attn_with_kvcache(dq, kc, vc, kn, vn, cache_seqlens=lens, causal=True)

    def unplanned(fn):
        def go():
            launch.ENABLED, enabled = False, launch.ENABLED
            try:
                return fn()
            finally:
                launch.ENABLED = enabled

        return go

    fns["decode b1 x 4096 + append: ours"] = append
    fns["decode b1 x 4096 + append: ours, unplanned"] = unplanned(append)
    fns["decode b1 x 4096: ours, unplanned"] = unplanned(lambda: decode["ours"](dq, kc, vc))
    out = {}
    for name, fn in fns.items():
        with torch.no_grad():
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        out[name] = (time.perf_counter() - t0) / calls * 1e6
        print(f"host {name}: {out[name]:.1f} us per call", flush=True)
    return out


# Matrix products per launch, by a part of the kernel's name, for the rate the breakdown prints:
# ours (the dK/dV kernel computes Q.K^T, dO.V^T, dV and dK; the dQ kernel Q.K^T, dO.V^T and dQ),
# SDPA-cuDNN's (fprop, bprop) and SDPA-flash's (FlashAttention 2, whose dK/dV kernel adds dQ by
# atomics). The first match counts, so a longer name comes before a part of it.
KERNEL_PRODUCTS = (
    ("attn_bwd_dkdv", 4),
    ("attn_bwd_dq", 3),
    ("attn_fwd", 2),
    ("flash_bprop", 5),
    ("flash_fprop", 2),
    ("flash_bwd_dq_dk_dv", 5),
    ("flash_fwd", 2),
)


def kernel_products(name: str) -> int | None:
    """How many (s x s x d) matrix products one launch of kernel ``name`` issues; None for a
    kernel not listed (elementwise, conversions)."""
    return next((n for part, n in KERNEL_PRODUCTS if part in name), None)


def product_rate(name: str, ms: float, launches: float, shape, causal: bool) -> float | None:
    """TFLOP/s of the matrix products kernel ``name`` issues in ``ms`` a step, each product
    2*b*h*s*s*d FLOPs (halved when causal, as ``flops`` counts); None where the kernel is not
    listed or runs other than once a step (the split dK/dV launches differ in products)."""
    products = kernel_products(name)
    if products is None or launches != 1 or ms <= 0:
        return None
    return products * flops(*shape, causal, "fwd") / 2 / ms / 1e9  # the forward is 2 products


def breakdown(shape=BREAKDOWN_SHAPE, causal=False, variants=None, iters=10) -> dict:
    """GPU time per kernel in a fwd+bwd step (torch.profiler, ``iters`` steps), for ours, each
    variant (a config override) and the SDPA backends: ``{provider: {"kernels": [{"name", "ms",
    "launches", "tflops"}], "total_ms"}}``, or ``{"error"}`` where a provider cannot run the
    shape. bf16, (b, h, s, d) tensors as ``run`` makes them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = {}
    for name, fn in _providers(variants or {}).items():
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        do = torch.randn_like(q)

        def step(fn=fn, qg=qg, kg=kg, vg=vg, do=do):
            fn(qg, kg, vg, causal).backward(do)
            qg.grad = kg.grad = vg.grad = None

        try:
            with _override_for(fn):
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(iters):
                        step()
                    torch.cuda.synchronize()
        except Exception as e:  # reported, not fatal
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            continue
        kernels = []
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if t:
                ms, launches = t / iters / 1000.0, e.count / iters
                kernels.append({"name": e.key[:80], "ms": ms, "launches": launches,
                                "tflops": product_rate(e.key, ms, launches, shape, causal)})  # fmt: skip
        kernels.sort(key=lambda r: -r["ms"])
        out[name] = {"kernels": kernels, "total_ms": sum(r["ms"] for r in kernels)}
    return out


def breakdown_text(result: dict, shape, causal: bool) -> str:
    """``breakdown``'s result as the lines the command prints."""
    lines = [
        f"per-kernel GPU time a fwd+bwd step at {tuple(shape)}, causal={causal} (torch.profiler; "
        "TFLOP/s: of the matrix products a kernel issues, each 2*b*h*s*s*d FLOPs, halved when "
        "causal):"
    ]
    for name, r in result.items():
        if "error" in r:
            lines.append(f"  {name}: {r['error']}")
            continue
        lines.append(f"  {name}: {r['total_ms']:.3f} ms of kernels")
        for k in r["kernels"]:
            rate = f"{k['tflops']:7.1f} TFLOP/s" if k["tflops"] else " " * 14
            lines.append(f"    {k['ms']:8.3f} ms  x{k['launches']:g}  {rate}  {k['name']}")
    return "\n".join(lines)


def run(shapes, variants: dict, memory: bool = True, rounds: int = 1) -> dict:
    import torch

    torch.manual_seed(0)
    provs = _providers(variants)
    rows = []
    for b, h, s, d, causal, mode in shapes:
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        times, rates, notes = _time_each(
            provs,
            lambda fn, a=(q, k, v, causal, mode): _time(fn, *a),
            flops(b, h, s, d, causal, mode) / 1e9,
            rounds,
        )
        row = {"shape": [b, h, s, d], "causal": causal, "mode": mode, "tflops": rates,
               "ms": times, **notes}  # fmt: skip
        rows.append(row)
        print(_fmt_row(row), flush=True)
        del q, k, v
    result = {"rows": rows, "rounds": rounds}
    if memory:
        mem = {}
        for name in ("ours", "sdpa-flash", "sdpa-cudnn"):
            try:
                base, peak = _peak(provs[name], MEMORY_SHAPE)
                mem[name] = {"inputs_bytes": base, "peak_bytes": peak}
            except Exception as e:
                mem[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        result["memory"] = {"shape": list(MEMORY_SHAPE), "mode": "fwd+bwd", "bf16": True, **mem}
    return result


def _fmt_row(row) -> str:
    b, h, s, d = row["shape"]
    tf = row["tflops"]
    cells = " ".join(f"{k}={v:7.1f}" if v is not None else f"{k}=   n/a" for k, v in tf.items())
    return f"({b},{h},{s},{d}) {'causal' if row['causal'] else 'full  '} {row['mode']:8s} {cells}"


def table(result) -> str:
    """Markdown table of TFLOP/s with ratios against SDPA-flash and cuDNN."""
    rows = result["rows"]
    names = list(rows[0]["tflops"]) if rows else []
    head = (
        "| shape (b,h,s,d) | causal | mode | " + " | ".join(names) + " | ours/flash | ours/cuDNN |"
    )
    lines = [head, "|" + "---|" * (len(names) + 5)]
    for r in rows:
        tf = r["tflops"]

        def ratio(other, tf=tf):
            return f"{tf['ours'] / tf[other]:.2f}" if tf.get("ours") and tf.get(other) else "n/a"

        cells = " | ".join(f"{tf[n]:.1f}" if tf[n] is not None else "n/a" for n in names)
        lines.append(
            f"| {tuple(r['shape'])} | {'yes' if r['causal'] else 'no'} | {r['mode']} | {cells} | "
            f"{ratio('sdpa-flash')} | {ratio('sdpa-cudnn')} |"
        )
    mem = result.get("memory")
    if mem:
        lines.append("")
        lines.append(
            f"Memory, fwd+bwd at {tuple(mem['shape'])} bf16 (peak allocated, inputs included):"
        )
        for name in ("ours", "sdpa-flash", "sdpa-cudnn"):
            m = mem.get(name, {})
            if "peak_bytes" in m:
                lines.append(
                    f"- {name}: peak {m['peak_bytes'] / 2**20:.0f} MiB (before the call: "
                    f"{m['inputs_bytes'] / 2**20:.0f} MiB)"
                )
            else:
                lines.append(f"- {name}: {m.get('error')}")
    return "\n".join(lines)


def _ints(value: str) -> tuple[int, ...]:
    return tuple(int(n) for n in value.split(","))


def _add_dispatch(ap: argparse.ArgumentParser) -> None:
    """--dispatch and the options that select a part of its sweep."""
    ap.add_argument(
        "--dispatch",
        action="store_true",
        help="the Hopper dispatch sweep: default path against all-Triton and Gluon "
        "(GQA 1/4/7/8, causal, 512-32k tokens, d=64/128)",
    )
    ap.add_argument(
        "--seqs",
        type=_ints,
        help="--dispatch: only these sequence lengths (comma-separated; default 512-32768)",
    )
    ap.add_argument(
        "--head-dims", type=_ints, help="--dispatch: only these head dims (comma-separated: 64,128)"
    )
    ap.add_argument(
        "--gqa", type=_ints, help="--dispatch: only these GQA ratios (comma-separated: 1,4,7,8)"
    )
    ap.add_argument(
        "--tokens",
        type=int,
        help="--dispatch: batch x sequence of each shape (default 8192; at most a sequence's "
        "length: one sequence, a small grid)",
    )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m attnforge_kernels.bench", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--quick", action="store_true", help="four shapes only")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--mode", choices=("fwd", "fwd+bwd"), help="only shapes of this mode")
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="per-kernel GPU times of a fwd+bwd step at (4,16,4096,128), causal and not: ours, "
        "each --variant and the SDPA backends, with the TFLOP/s of the matrix products each "
        "attention kernel issues",
    )
    ap.add_argument(
        "--workloads", action="store_true", help="the shapes of contract/workloads.py instead"
    )
    ap.add_argument(
        "--layout",
        choices=("bshd", "bhsd", "both"),
        default="both",
        help="--workloads: storage of q/k/v (default both)",
    )
    ap.add_argument(
        "--decode", action="store_true", help="flash_attn_with_kvcache decoding against SDPA"
    )
    ap.add_argument(
        "--splits",
        type=_ints,
        default=(),
        help="--decode: also time ours at these num_splits (comma-separated)",
    )
    ap.add_argument("--batches", type=_ints, help="--decode: these batch sizes (comma-separated)")
    ap.add_argument("--caches", type=_ints, help="--decode: these cache lengths (comma-separated)")
    ap.add_argument(
        "--gpu-time",
        action="store_true",
        help="--decode and --dispatch: the GPU's time per step alone (CUDA graphs of flushed "
        "steps) instead of do_bench's, which includes the host's launch gaps",
    )
    ap.add_argument(
        "--host",
        action="store_true",
        help="back-to-back time per call: a tiny forward, a batch-1 decoding step (and with an "
        "appended key)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="the sweep, --workloads and --decode: time the providers in turn this many times "
        "and keep each one's fastest (default 1), so that a GPU clock that moves during the run "
        "costs every provider alike",
    )
    _add_dispatch(ap)
    ap.add_argument(
        "--prefill",
        action="store_true",
        help="causal prefill of one or a few sequences (grids of 1-8 programs an SM) and two "
        "GPU-filling shapes: ours and each --variant, with each path's results against the "
        "first --variant's where two or more are given, else against ours",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=JSON config override to time as well: the attention kernels' keys "
        "(attnforge_kernels.device.configs.override) with the sweep, --workloads, "
        "--breakdown and --prefill, the cache kernels' "
        "(kv_decode, kv_decode_long, kv_prefill, kv_long_keys: "
        "attnforge_kernels.device.decode.kv_override) with --decode",
    )
    return ap


def _write(result: dict, path: str | None) -> None:
    """``result`` as JSON at ``path``: serialised first, written beside it under a dot name, then
    renamed over it, so a failure or an interrupt leaves the last run's file whole (the rule of
    attnforge/files.py, which this package cannot import inside an image)."""
    if not path:
        return
    text = json.dumps(result, indent=1)
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _report(result: dict, args, render) -> int:
    """Stamp ``result`` with the device and torch, write it to ``--json`` and print
    ``render(result)``."""
    import torch

    result["device"] = torch.cuda.get_device_name()
    result["torch"] = torch.__version__
    _write(result, args.json)
    print(render(result))
    return 0


def _decode(args, variants: dict) -> int:
    sizes = dict(batches=(1, 64), caches=(4096, 131072)) if args.quick else {}
    if args.batches:
        sizes["batches"] = args.batches
    if args.caches:
        sizes["caches"] = args.caches
    return _report(run_decode(splits=args.splits, gpu_time=args.gpu_time, variants=variants,
                              rounds=args.rounds, **sizes), args, decode_table)  # fmt: skip


def _dispatch_selection(ap: argparse.ArgumentParser, args) -> dict:
    """run_dispatch's keyword arguments from --seqs, --head-dims, --gqa (a part of the sweep, to
    fit a time limit) and --tokens; a bad value or one of them without --dispatch is an error."""
    from .dispatch import HEAD_DIMS, RATIOS

    chosen = {"seqs": args.seqs, "head_dims": args.head_dims, "gqa": args.gqa,
              "tokens": args.tokens}  # fmt: skip
    given = {k: v for k, v in chosen.items() if v is not None}
    if given and not args.dispatch:
        ap.error("--seqs, --head-dims, --gqa and --tokens select a part of the --dispatch sweep")
    if any(n < 1 for n in given.get("seqs", ())):
        ap.error("--seqs: lengths are 1 or more")
    if given.get("tokens", 1) < 1:
        ap.error("--tokens: 1 or more (batch x sequence; a shape runs at least one sequence)")
    if not set(given.get("head_dims", ())) <= set(HEAD_DIMS):
        ap.error(f"--head-dims: the sweep has {', '.join(map(str, HEAD_DIMS))}")
    if not set(given.get("gqa", ())) <= set(RATIOS):
        ap.error(f"--gqa: the sweep has ratios {', '.join(map(str, RATIOS))}")
    return given


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    sweep = _dispatch_selection(ap, args)
    if args.rounds < 1:
        ap.error("--rounds: 1 or more")
    if args.rounds > 1 and (args.host or args.dispatch or args.prefill):
        ap.error(
            "--rounds times the sweep, --workloads and --decode (not --host, --dispatch "
            "or --prefill)"
        )
    import torch

    if not torch.cuda.is_available():
        print("no GPU: nothing to benchmark", file=sys.stderr)
        return 2
    variants = dict(v.split("=", 1) for v in args.variant)
    if args.host:
        _write({"host_us": host_time()}, args.json)
        return 0
    if args.decode:
        return _decode(args, variants)
    if args.dispatch:
        from .dispatch import dispatch_table, run_dispatch

        return _report(run_dispatch(**sweep, gpu_time=args.gpu_time), args, dispatch_table)
    if args.prefill:
        from .prefill import prefill_table, run_prefill

        return _report(run_prefill(variants), args, prefill_table)
    if args.workloads:
        layouts = ("bshd", "bhsd") if args.layout == "both" else (args.layout,)
        modes = (args.mode,) if args.mode else ("fwd", "fwd+bwd")
        return _report(run_workloads(layouts, modes, variants, args.rounds), args, workload_table)
    parts = {}
    if args.breakdown:
        for causal in (False, True):
            parts[f"causal={causal}"] = bd = breakdown(BREAKDOWN_SHAPE, causal, variants)
            print(breakdown_text(bd, BREAKDOWN_SHAPE, causal), flush=True)
    shapes = QUICK if args.quick else SHAPES
    if args.mode:
        shapes = [s for s in shapes if s[5] == args.mode]
    result = run(shapes, variants, memory=not args.no_memory, rounds=args.rounds)
    if parts:
        result["breakdown"] = {"shape": list(BREAKDOWN_SHAPE), **parts}
    return _report(result, args, table)


if __name__ == "__main__":
    sys.exit(main())
