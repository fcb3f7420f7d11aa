"""``python -m validate bench``: op-level attention timings for every backend this stack offers.

Forward, backward and forward+backward over flash-attention's benchmark sweep and the workload
shapes, each backend in its own process (a crash is that item's result, and a fresh process
takes the rest). The sweep is flash-attention's ``benchmarks/benchmark_flash_attention.py``
(Dao-AILab/flash-attention, read 2026-11-24): batch*seqlen = 16k, heads*head_dim = 2048, head
dims 64 and 128, causal or not, seqlen 512..16k; its FLOP count: forward 4*b*sq*sk*h*d, halved
when causal, backward 2.5x that, forward+backward 3.5x.

Standard library only at module level: torch is imported in the child processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from contract import names, workloads
from validate import item_runner
from validate.argtypes import positive_int, seconds

HELP = "time every attention backend: fwd, bwd, fwd+bwd over flash-attention's sweep and workloads"
DESCRIPTION = """\
Time every attention backend this Python environment offers (SDPA's math, flash, efficient,
cuDNN and default pick, flash_attn, the bundled kernels directly and through their SDPA shim)
in forward, backward and forward+backward, over flash-attention's benchmark sweep (b*s = 16k,
h*d = 2048, d 64/128, causal or not, s 512..16k) and the workload shapes. Each backend runs in
its own process; a shape a backend refuses is 'unsupported' with PyTorch's reason.

Timing: on a GPU CUDA/HIP events around each repeat after the warm-up, peak memory from
torch.cuda.max_memory_allocated over the repeats (inputs included); on a CPU wall-clock
(time.perf_counter) and no memory figure. Without a GPU the tiny shapes are used (--tiny).

exit status: 0 every item ran or was refused; 1 an item errored, crashed or timed out;
2 usage error."""

BACKENDS = names.BACKEND_NAMES
MODES = names.MODES
DTYPES = names.DTYPES
STATUSES = names.BENCH_STATUSES
FAILING = names.FAILING

# flash-attention benchmarks/benchmark_flash_attention.py: bs_seqlen_vals, headdim_vals, dim.
SWEEP_BATCH_SEQLEN = ((32, 512), (16, 1024), (8, 2048), (4, 4096), (2, 8192), (1, 16384))
SWEEP_HEAD_DIMS = (64, 128)
SWEEP_MODEL_DIM = 2048
QUICK_BATCH_SEQLEN = ((4, 4096),)
# CPU-sized (and Triton-interpreter-sized): the same construction, b*s = 64 and h*d = 128.
TINY_BATCH_SEQLEN = ((2, 32), (1, 64))
TINY_MODEL_DIM = 128

SIZES = ("full", "quick", "tiny")
DEFAULTS = {  # (warm-up, repeats) per size
    "full": (5, 30),
    "quick": (3, 10),
    "tiny": (1, 3),
}


# --- shapes and numbers (pure) ------------------------------------------------------------


def shape_name(s: dict[str, Any]) -> str:
    heads = f"h{s['h']}" if s["hkv"] == s["h"] else f"h{s['h']}kv{s['hkv']}"
    seq = f"s{s['sq']}" if s["sq"] == s["sk"] else f"q{s['sq']}k{s['sk']}"
    causal = "-causal" if s["causal"] else ""
    return f"b{s['b']}-{heads}-{seq}-d{s['d']}{causal}-{s['dtype']}"


def sweep(size: str, dtype: str, quick: bool = False) -> list[dict[str, Any]]:
    """flash-attention's sweep: every (batch, seqlen) x head dim x causal, heads = dim / d.

    ``quick`` keeps (4, 4096) at full size; at tiny size it keeps one shape (b1, s64, d128,
    one head: the Triton interpreter's quickest)."""
    pairs, dims, causals = SWEEP_BATCH_SEQLEN, SWEEP_HEAD_DIMS, (False, True)
    dim = SWEEP_MODEL_DIM
    if size == "tiny":
        pairs, dim = TINY_BATCH_SEQLEN, TINY_MODEL_DIM
        if quick:
            pairs, dims, causals = pairs[-1:], dims[-1:], (False,)
    elif quick:
        pairs = QUICK_BATCH_SEQLEN
    shapes = []
    for causal in causals:
        for d in dims:
            for b, s in pairs:
                h = dim // d
                shape = {"b": b, "h": h, "hkv": h, "sq": s, "sk": s, "d": d, "causal": causal}
                shape["dtype"] = dtype
                shapes.append({"name": "", "family": "sweep", **shape})
    for shape in shapes:
        shape["name"] = "sweep-" + shape_name(shape)
    return shapes


def result_row(
    backend: str, shape: dict[str, Any], mode: str, child: dict[str, Any]
) -> dict[str, Any]:
    """The document's result entry from what the child measured."""
    status = child.get("status", "error")
    ms_all = [float(x) for x in child.get("ms_all") or []] if status == "ok" else []
    ms = item_runner.median(ms_all)
    return {
        "backend": backend,
        "shape": shape,
        "mode": mode,
        "status": status,
        "ms": ms,
        "ms_all": ms_all,
        "tflops": workloads.flops(shape, mode) / (ms * 1e-3) / 1e12 if ms else None,
        "peak_mem_mb": child.get("peak_mem_mb") if status == "ok" else None,
        "message": str(child.get("message", "")),
    }


def exit_code(results: list[dict[str, Any]]) -> int:
    return 1 if any(r["status"] in FAILING for r in results) else 0


# --- command line (parent: standard library only) ------------------------------------------


def picked_names(values: list[str] | None, known: tuple[str, ...], what: str) -> list[str]:
    """Repeatable, comma-separated choices; 'all' (or nothing) is every one."""
    from validate.cli import UsageError

    picked: list[str] = []
    for value in values or []:
        for name in (v.strip() for v in value.split(",")):
            if not name:
                continue
            if name == "all":
                picked.extend(known)
            elif name not in known:
                raise UsageError(f"unknown {what} {name!r}; choose from: {', '.join(known)}, all.")
            else:
                picked.append(name)
    return list(dict.fromkeys(picked or known))


def add_common_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """--json, --backend, --timeout, shared by bench and bench-train."""
    parser.add_argument("--json", metavar="PATH", help=f"write the {what} document here (JSON)")
    parser.add_argument(
        "--backend",
        metavar="NAME",
        action="append",
        help="backend to time (repeatable or comma list; default all): " + ", ".join(BACKENDS),
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=300.0,
        metavar="SECONDS",
        help="how long one item may run before it counts as a timeout (default 300)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, "bench")
    parser.add_argument(
        "--mode",
        metavar="MODE",
        action="append",
        help="fwd, bwd or fwd_bwd (repeatable or comma list; default all three)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a few sweep shapes and each workload's first shape"
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="CPU-sized shapes (b*s = 64, h*d = 128, workloads shrunk); the default when there is no GPU",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="fp16",
        help="dtype of the sweep (default fp16, as upstream)",
    )
    parser.add_argument(
        "--workload",
        metavar="NAME",
        action="append",
        help="workload whose shapes to add (repeatable or comma list; default: every workload, "
        "none with --tiny; 'none' for the sweep only)",
    )
    parser.add_argument(
        "--resolution",
        metavar="WxH",
        help="image size for the image workloads (their default if unset)",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        metavar="N",
        help="timed repeats per item; the median is reported (default 30, --quick 10, --tiny 3)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        metavar="N",
        help="untimed calls before the repeats (default 5, --quick 3, --tiny 1)",
    )


def probe_env(timeout: float = 120.0) -> tuple[dict[str, Any] | None, str]:
    """(env block, '') from a child that imports torch, or (None, why it could not)."""
    import subprocess

    cmd = [sys.executable, "-m", "validate.item_runner", "--env"]
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"importing torch took more than {timeout:g} s"
    if proc.returncode != 0:
        last = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:] or ["no output"]
        return None, f"torch does not import here ({last[0].strip()})"
    return json.loads(proc.stdout.strip().splitlines()[-1]), ""


def workload_shapes(
    names: list[str] | None, resolution: str | None, tiny: bool, quick: bool = False
) -> list[dict[str, Any]]:
    """Shapes of the named workloads (contract.workloads; default all but custom, none with
    ``tiny``), shrunk with ``tiny``, only each one's first with ``quick``."""
    from contract import workloads
    from validate.cli import UsageError

    flat = [n.strip() for v in names or [] for n in v.split(",") if n.strip()]
    if flat == ["none"] or (tiny and not flat):
        return []
    known = tuple(n for n in workloads.names() if n != workloads.CUSTOM)
    shapes: list[dict[str, Any]] = []
    for name in picked_names(flat, known, "workload"):
        # --resolution is for the image workloads; the others' shapes are fixed.
        res = resolution if workloads.WORKLOADS[name].resolutions else None
        try:
            got = workloads.shapes(name, res)
        except workloads.WorkloadError as exc:
            raise UsageError(str(exc)) from None
        for s in got[:1] if quick else got:
            shapes.append(workloads.tiny(s) if tiny else s)
    return shapes


def fmt(x: float | None, spec: str) -> str:
    """``format(x, spec)``, or a dash as wide as the spec asks for None."""
    if x is None:
        width = spec.split(".")[0]
        return "-".rjust(int(width) if width.isdigit() else 0)
    return format(x, spec)


def print_row(r: dict[str, Any]) -> None:
    cells = (
        f"{r['status']:>11}  {r['backend']:<17} {r['shape']['name']:<40} {r['mode']:<7} "
        f"{fmt(r['ms'], '10.3f')} ms {fmt(r['tflops'], '8.3g')} TFLOP/s "
        f"{fmt(r['peak_mem_mb'], '8.0f')} MB"
    )
    msg = f"  {r['message']}" if r["message"] else ""
    print((cells + msg)[:300], flush=True)


def table(results: list[dict[str, Any]]) -> str:
    """TFLOP/s per (shape, mode) row and backend column; '-' for anything but ok."""
    backends = list(dict.fromkeys(r["backend"] for r in results))
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for r in results:
        cell = fmt(r["tflops"], ".3g") if r["status"] == "ok" else r["status"][:5]
        rows.setdefault((r["shape"]["name"], r["mode"]), {})[r["backend"]] = cell
    width = max([len(b) for b in backends] + [7])
    head = f"{'shape':<40} {'mode':<7} " + " ".join(f"{b:>{width}}" for b in backends)
    lines = ["TFLOP/s (flash-attention's FLOP count):", head]
    for (name, mode), cells in rows.items():
        lines.append(
            f"{name:<40} {mode:<7} " + " ".join(f"{cells.get(b, ''):>{width}}" for b in backends)
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from validate.cli import UsageError, check_writable
    from validate.report import current_run_id, now

    check_writable(args.json, "--json")
    backends = picked_names(args.backend, BACKENDS, "backend")
    modes = picked_names(args.mode, MODES, "mode")
    if args.warmup is not None and args.warmup < 0:
        raise UsageError("--warmup must be 0 or more.")
    env, why = probe_env()
    if env is None:
        print(f"python -m validate bench: {why}; nothing was timed.", file=sys.stderr)
        return 1
    size = "tiny" if args.tiny else ("quick" if args.quick else "full")
    if env["device"] == "cpu" and size != "tiny":
        print("no GPU here: timing the tiny shapes (--tiny); the sweep would take hours on a CPU")
        size = "tiny"
    shapes = sweep(size, args.dtype, args.quick)
    shapes += workload_shapes(args.workload, args.resolution, size == "tiny", args.quick)
    warmup, repeats = DEFAULTS[size]
    warmup = warmup if args.warmup is None else args.warmup
    repeats = repeats if args.repeats is None else args.repeats
    items = [(shape, mode) for shape in shapes for mode in modes]
    print(
        f"bench: {len(shapes)} shape(s) x {len(modes)} mode(s) x {len(backends)} backend(s) on "
        f"{env['device']} (torch {env['torch']}); warm-up {warmup}, median of {repeats}; "
        "one process per backend",
        flush=True,
    )
    created = now()
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    for backend in backends:
        got: dict[int, dict[str, Any]] = {}

        def on_result(i: int, child: dict[str, Any], backend: str = backend, got=got) -> None:
            got[i] = row = result_row(backend, items[i][0], items[i][1], child)
            print_row(row)

        def on_outcome(i: int, outcome, backend: str = backend, got=got) -> None:
            child = {"status": outcome.status, "message": outcome.message}
            got[i] = row = result_row(backend, items[i][0], items[i][1], child)
            print_row(row)

        spec = {
            "backend": backend,
            "items": [{"shape": s, "mode": m} for s, m in items],
            "warmup": warmup,
            "repeats": repeats,
        }
        item_runner.run_items(
            "validate.bench", spec, len(items), args.timeout, on_result, on_outcome
        )
        results.extend(got[i] for i in sorted(got))
    doc = {
        "kind": names.BENCH,
        "version": 1,
        "run_id": current_run_id(),
        "created": created,
        "env": env,
        "size": size,
        "quick": bool(args.quick),  # at the tiny size: the one-shape sweep
        "warmup": warmup,
        "repeats": repeats,
        "duration_s": round(time.monotonic() - started, 3),
        "results": results,
    }
    if args.json:
        try:
            item_runner.write_json(doc, args.json)
        except OSError as exc:
            raise UsageError(f"cannot write {args.json}: {exc}") from None
    print(table(results))
    counts = {s: sum(r["status"] == s for r in results) for s in STATUSES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    code = exit_code(results)
    print(f"bench: {'FAIL' if code else 'PASS'} ({summary or 'nothing to time'})", flush=True)
    return code


# --- child: one backend's items (imports torch) --------------------------------------------

NO_KERNEL = ("No available kernel", "No viable backend")
SDPA_ENUM = {
    "sdpa.math": "MATH",
    "sdpa.flash": "FLASH_ATTENTION",
    "sdpa.efficient": "EFFICIENT_ATTENTION",
    "sdpa.cudnn": "CUDNN_ATTENTION",
}


class Refused(Exception):
    """The backend cannot run this item; the message says why (PyTorch's words where it has them)."""


def one_line(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return (text.splitlines() or [type(exc).__name__])[0][:400]


class Attention:
    """One backend's attention call on tensors in its native layout (BHSD or BSHD)."""

    def __init__(self, torch, backend: str, device: str):
        self.torch, self.backend, self.device = torch, backend, device
        self.bshd = backend in ("flash_attn", "kernels")
        self.forced = None
        self.fn = None
        if backend in SDPA_ENUM:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            self.forced = lambda: sdpa_kernel([getattr(SDPBackend, SDPA_ENUM[backend])])
        elif backend == "flash_attn":
            try:
                from flash_attn import flash_attn_func
            except Exception as exc:  # noqa: BLE001 - absent or broken: refused, with the reason
                raise Refused(f"flash_attn does not import: {one_line(exc)}") from None
            self.fn = flash_attn_func
        elif backend == "kernels":
            try:
                from attnforge_kernels import flash_attn_func
            except Exception as exc:  # noqa: BLE001
                raise Refused(f"the bundled kernels do not import: {one_line(exc)}") from None
            self.fn = flash_attn_func
        elif backend == "kernels.sdpa_shim":
            try:
                from attnforge_kernels import sdpa_shim
            except Exception as exc:  # noqa: BLE001
                raise Refused(f"the bundled kernels do not import: {one_line(exc)}") from None
            sdpa_shim.enable()
            self.shim = sdpa_shim

    def context(self):
        import contextlib

        return self.forced() if self.forced else contextlib.nullcontext()

    def __call__(self, q, k, v, causal: bool, gqa: bool):
        if self.fn is not None:
            return self.fn(q, k, v, causal=causal)
        # Looked up at call time: the shim replaces the module attribute.
        sdpa = self.torch.nn.functional.scaled_dot_product_attention
        if gqa:
            return sdpa(q, k, v, is_causal=causal, enable_gqa=True)
        return sdpa(q, k, v, is_causal=causal)


def _case(shape: dict[str, Any]):
    from validate.grid import Case

    return Case(
        shape["name"], shape["dtype"], shape["causal"], shape["d"], shape["h"], shape["hkv"],
        shape["sq"], shape["sk"], shape["b"],
    )  # fmt: skip


def _refusal(torch, attn: Attention, shape: dict[str, Any], q, k, v, exc, warned: list[str]) -> str:
    """Why SDPA refused a forced backend: its warnings, else can_use_* reasons, else the error."""
    from validate.checks import sdpa

    reasons = [w for w in dict.fromkeys(warned) if w and "No available kernel" not in w]
    name = attn.backend.split(".", 1)[1]
    if not reasons and attn.device == "cpu" and name in sdpa.GPU_ONLY:
        return f"{sdpa.ENUM_NAMES[name]} has no CPU kernel in PyTorch; needs a CUDA/ROCm device"
    if not reasons and name in sdpa.CAN_USE:
        try:
            params = sdpa.sdpa_params(torch, q, k, v, _case(shape))
            _, reasons = sdpa.can_use(torch, name, params)
        except Exception:  # noqa: BLE001 - then the error text is all there is
            reasons = []
    return "; ".join(reasons)[:600] or one_line(exc)


def _inputs(torch, attn: Attention, shape: dict[str, Any], device: str, grad: bool):
    from validate.checks.numerics import torch_dtype

    dt = torch_dtype(shape["dtype"])
    b, sq, sk, d = shape["b"], shape["sq"], shape["sk"], shape["d"]

    def rnd(h: int, s: int):
        dims = (b, s, h, d) if attn.bshd else (b, h, s, d)
        return torch.randn(*dims, device=device, dtype=dt, requires_grad=grad)

    return rnd(shape["h"], sq), rnd(shape["hkv"], sk), rnd(shape["hkv"], sk)


def timer(torch, device: str):
    """(start(), stop() -> ms) pairs: device events on a GPU, perf_counter on a CPU."""
    if device == "cuda":

        def start():
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e

        def stop(begin):
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return (begin, e)

        def read(pairs):
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in pairs]

        return start, stop, read

    def start_cpu():
        return time.perf_counter()

    def stop_cpu(begin):
        return (time.perf_counter() - begin) * 1e3

    return start_cpu, stop_cpu, lambda values: list(values)


SLOWDOWN_ENV = "VALIDATE_BENCH_SLOWDOWN"


def slowdown_factor(backend: str, spec: str | None) -> float:
    """Testing hook (docs/validation.md, "Testing hooks"): VALIDATE_BENCH_SLOWDOWN=BACKEND:FACTOR
    (comma list) makes that backend's timed calls FACTOR times as long."""
    for item in (spec or "").split(","):
        name, _, factor = item.strip().rpartition(":")
        if name == backend:
            return float(factor)
    return 1.0


def _planted_slowdown(torch, attn: Attention, timed):
    """`timed`, or `timed` followed by a wait of (factor - 1) times its own duration: the planted
    slowdown the baseline gate's tests catch. On a GPU the wait sits between the timing events."""
    factor = slowdown_factor(attn.backend, os.environ.get(SLOWDOWN_ENV))
    if factor <= 1:
        return timed

    def slowed(state):
        begin = time.perf_counter()
        timed(state)
        if attn.device == "cuda":
            torch.cuda.synchronize()
        time.sleep((factor - 1) * (time.perf_counter() - begin))

    return slowed


def run_item(torch, attn: Attention, item: dict[str, Any], warmup: int, repeats: int) -> dict:
    """Warm-up, then ``repeats`` timed calls of one (shape, mode): {"status", "ms_all", ...}."""
    shape, mode = item["shape"], item["mode"]
    device = attn.device
    causal, gqa = shape["causal"], shape["hkv"] != shape["h"]
    grad = mode != "fwd"
    torch.manual_seed(0)
    try:
        q, k, v = _inputs(torch, attn, shape, device, grad)
    except torch.cuda.OutOfMemoryError as exc:
        raise Refused(f"out of memory for the inputs: {one_line(exc)}") from None
    prepare, timed = _steps(mode, lambda: attn(q, k, v, causal, gqa), (q, k, v),
                            torch.randn_like(q) if grad else None)  # fmt: skip
    # The planted slowdown (tests only) stretches the timed repeats alone: the first call and the
    # warm-up hold one-time costs (lazy imports, first dispatch) that a multiple would turn into
    # minutes of sleep on a loaded machine.
    slowed = _planted_slowdown(torch, attn, timed)
    message = ""
    with attn.context(), torch.set_grad_enabled(grad):
        _first_call(torch, attn, shape, (q, k, v), prepare, timed)
        if attn.backend == "sdpa.default":
            from validate.checks.sdpa import fused_choice

            pick, _ = fused_choice(torch, q, k, v, _case(shape))
            message = f"SDPA picks {pick}" if pick else ""
        ms_all, peak = _timed_repeats(torch, device, prepare, timed, slowed, warmup, repeats)
    return {"status": "ok", "ms_all": ms_all, "peak_mem_mb": peak, "message": message}


def _steps(mode: str, forward: Callable[[], Any], inputs: tuple, dout) -> tuple:
    """(prepare, timed) of a mode: what runs before each timed call (untimed) and the call."""

    def clear():
        for t in inputs:
            t.grad = None

    if mode == "fwd":
        return (lambda: None), (lambda state: forward())
    if mode == "bwd":

        def prepare():
            clear()
            return forward()

        return prepare, (lambda out: out.backward(dout))
    return clear, (lambda state: forward().backward(dout))


def _first_call(torch, attn: Attention, shape: dict, qkv: tuple, prepare, timed) -> None:
    """The first call, which decides whether the backend takes this shape at all: a refusal
    (no kernel, out of memory, the shim falling back) raises Refused; other errors propagate."""
    from validate.checks.sdpa import captured_warnings

    with captured_warnings() as warned:
        try:
            timed(prepare())
            if attn.device == "cuda":
                torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError as exc:
            raise Refused(f"out of memory at this shape: {one_line(exc)}") from None
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
            text = str(exc)
            if attn.backend in SDPA_ENUM and any(n in text for n in NO_KERNEL):
                raise Refused(_refusal(torch, attn, shape, *qkv, exc, warned)) from None
            if attn.fn is not None and not isinstance(exc, RuntimeError):
                raise Refused(one_line(exc)) from None  # flash_attn's / kernels' own checks
            raise
    if attn.backend == "kernels.sdpa_shim":
        stats = attn.shim.stats()
        if not stats.get("routed"):
            why = ", ".join(stats.get("reasons") or {}) or "unknown"
            raise Refused(f"the shim did not route this call to the kernels (fell back: {why})")


def _timed_repeats(torch, device: str, prepare, timed, slowed, warmup: int, repeats: int):
    """The rest of the warm-up, then the timed repeats: (ms of each, peak MiB or None)."""
    start, stop, read = timer(torch, device)
    for _ in range(max(0, warmup - 1)):
        timed(prepare())
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    marks = []
    for _ in range(repeats):
        state = prepare()
        begin = start()
        slowed(state)
        marks.append(stop(begin))
    ms_all = read(marks)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    return ms_all, peak


def child(spec_path: str, events_path: str) -> None:
    """Run this process's share of one backend's items, writing an event per step."""
    from validate.runner import is_device_fault

    spec = json.loads(open(spec_path, encoding="utf-8").read())
    out = item_runner.EventWriter(events_path)
    backend = spec["backend"]
    if backend.startswith("kernels") and os.environ.get("TRITON_INTERPRET") != "1":
        import torch

        if not torch.cuda.is_available():  # the kernels run in Triton's interpreter then
            os.environ["TRITON_INTERPRET"] = "1"
    import torch

    out.emit({"event": "env", "env": item_runner.env_info()})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        attn = Attention(torch, backend, device)
        refused = None
    except Refused as exc:
        attn, refused = None, str(exc)
    for i in spec["indices"]:
        out.emit({"event": "start", "index": i})
        if refused is not None:
            result = {"status": "unsupported", "message": refused}
        else:
            try:
                result = run_item(torch, attn, spec["items"][i], spec["warmup"], spec["repeats"])
            except Refused as exc:
                result = {"status": "unsupported", "message": str(exc)}
            except Exception as exc:  # noqa: BLE001 - the item's result
                text = one_line(exc)
                if is_device_fault(f"{exc}"):
                    out.emit(
                        {
                            "event": "result",
                            "index": i,
                            "result": {"status": "crash", "message": f"GPU fault: {text}"},
                        }
                    )
                    sys.stdout.flush()
                    os._exit(item_runner.EXIT_DEVICE_FAULT)
                result = {"status": "error", "message": text}
            finally:
                if device == "cuda":
                    torch.cuda.empty_cache()
        out.emit({"event": "result", "index": i, "result": result})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip teardown: a device context can hang on exit after a fault


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    print("internal entry point; run `python -m validate bench`", file=sys.stderr)
    sys.exit(2)
