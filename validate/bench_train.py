"""``python -m validate bench-train``: a small transformer's training step under each backend.

A pre-norm decoder built from torch.nn modules (token embedding, LayerNorm, a fused qkv Linear,
causal attention, a 4x GELU MLP, an untied output head), forward + cross-entropy + backward +
AdamW, with the attention done by one backend per process: SDPA forced with sdpa_kernel (or its
default pick), flash_attn, the bundled kernels directly or through their SDPA shim. Every
process builds the model and the batch from the same seed on the CPU, so the first step's loss
must agree across backends (within 1e-2 relative for bf16/fp16, 1e-4 for fp32): a sanity check
that they compute the same model.

Standard library only at module level: torch is imported in the child processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from contract import names
from validate import bench, item_runner
from validate.argtypes import positive_int

HELP = "time a small transformer's training step (fwd+bwd+AdamW) under every attention backend"
DESCRIPTION = """\
Time a small pre-norm transformer's training step (forward, cross-entropy, backward, AdamW)
with its attention done by each backend in turn, each in its own process with the same seed:
warm-up steps, then timed steps; median step time, tokens/s and peak memory. The first step's
loss must be the same under every backend that ran (relative tolerance 1e-2 for bf16/fp16,
1e-4 for fp32), measured against sdpa.math where it ran.

The model runs under autocast in bf16/fp16 (fp32 weights, as mixed-precision training does) or
plainly in fp32. Timing as in `bench`: device events on a GPU, wall-clock on a CPU (no memory
figure there). Without a GPU the tiny model is used (--tiny).

exit status: 0 every backend ran or was refused and the first losses agree; 1 a backend
errored, crashed or timed out, or the losses disagree; 2 usage error."""

DTYPES = names.DTYPES
TOLERANCE = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}
STATUSES = names.BENCH_STATUSES
FAILING = names.FAILING
CONFIG_KEYS = ("width", "heads", "layers", "seq", "batch", "dtype", "steps", "warmup", "seed")
PRESETS: dict[str, dict[str, Any]] = {
    # head dim 128, 8 layers, 16k tokens a step: about 110M parameters
    "full": {"width": 1024, "heads": 8, "layers": 8, "seq": 2048, "batch": 8, "vocab": 8192,
             "steps": 20, "warmup": 5},
    "quick": {"width": 512, "heads": 4, "layers": 4, "seq": 1024, "batch": 4, "vocab": 8192,
              "steps": 10, "warmup": 3},
    # CPU-sized; the bundled kernels run in Triton's interpreter there
    # (two layers: with one, a wrong mask moves the fp32 first loss by only 5e-5)
    "tiny": {"width": 64, "heads": 2, "layers": 2, "seq": 32, "batch": 2, "vocab": 256,
             "steps": 2, "warmup": 1},
}  # fmt: skip
DEFAULT_DTYPE = "bf16"
REFERENCE = "sdpa.math"


# --- pure parts ---------------------------------------------------------------------------


def config_for(size: str, args: argparse.Namespace) -> dict[str, Any]:
    """The preset of ``size`` with every option the user gave laid over it."""
    from validate.cli import UsageError

    cfg = dict(PRESETS[size], dtype=DEFAULT_DTYPE, seed=0)
    for key in (*CONFIG_KEYS, "vocab"):
        value = getattr(args, key, None)
        if value is not None:
            cfg[key] = value
    if cfg["width"] % cfg["heads"]:
        raise UsageError(f"--width {cfg['width']} is not a multiple of --heads {cfg['heads']}.")
    if cfg["width"] // cfg["heads"] > 256:
        raise UsageError(
            f"head dim {cfg['width'] // cfg['heads']} (width / heads) is over 256, "
            "which no flash kernel takes; use more heads."
        )
    return cfg


def loss_check(
    results: list[dict[str, Any]], dtype: str, tolerance: float | None = None
) -> dict[str, Any]:
    """Whether every backend that ran saw the same first-step loss as the reference."""
    tol = TOLERANCE[dtype] if tolerance is None else tolerance
    ran = [r for r in results if r["status"] == "ok" and r.get("first_loss") is not None]
    if not ran:
        return {"reference": REFERENCE, "tolerance": tol, "max_rel_diff": None, "ok": False,
                "message": "no backend ran, so there is no loss to compare"}  # fmt: skip
    ref = next((r for r in ran if r["backend"] == REFERENCE), ran[0])
    if len(ran) == 1:
        return {"reference": ref["backend"], "tolerance": tol, "max_rel_diff": None, "ok": True,
                "message": f"only {ref['backend']} ran: nothing to compare"}  # fmt: skip
    base = ref["first_loss"]
    diffs = {
        r["backend"]: abs(r["first_loss"] - base) / max(abs(base), 1e-12)
        for r in ran
        if r is not ref
    }
    worst = max(diffs, key=lambda b: diffs[b])
    ok = all(d <= tol for d in diffs.values())
    off = [b for b, d in diffs.items() if d > tol]
    message = (
        f"first-step losses agree with {ref['backend']} ({base:.6g}) within {tol:g}: "
        f"largest difference {diffs[worst]:.2e} ({worst})"
        if ok
        else f"first-step loss of {', '.join(off)} differs from {ref['backend']} ({base:.6g}) by "
        f"more than {tol:g} (largest {diffs[worst]:.2e}, {worst}): that backend computes a "
        "different attention"
    )
    return {"reference": ref["backend"], "tolerance": tol, "max_rel_diff": diffs[worst],
            "ok": ok, "message": message}  # fmt: skip


def result_row(backend: str, cfg: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    status = child.get("status", "error")
    ok = status == "ok"
    step_ms = [float(x) for x in child.get("step_ms") or []] if ok else []
    med = item_runner.median(step_ms)
    return {
        "backend": backend,
        "status": status,
        "median_step_ms": med,
        "tokens_per_s": cfg["batch"] * cfg["seq"] / (med * 1e-3) if med else None,
        "peak_mem_mb": child.get("peak_mem_mb") if ok else None,
        "first_loss": child.get("first_loss") if ok else None,
        "first_grad_norm": child.get("first_grad_norm") if ok else None,
        "last_loss": child.get("last_loss") if ok else None,
        "step_ms": step_ms,
        "message": str(child.get("message", "")),
    }


def exit_code(results: list[dict[str, Any]], check: dict[str, Any]) -> int:
    return 1 if any(r["status"] in FAILING for r in results) or not check["ok"] else 0


# --- command line (parent: standard library only) ------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    bench.add_common_arguments(parser, "bench_train")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smaller model (512 wide, 4 layers, seq 1024, batch 4; 10 steps)",
    )
    parser.add_argument("--tiny", action="store_true", help="a CPU-sized model (64 wide, 2 layers, seq 32); the default when there is no GPU")  # fmt: skip
    for key, meta, what in (
        ("width", "N", "model width"),
        ("heads", "N", "attention heads (head dim = width / heads)"),
        ("layers", "N", "transformer blocks"),
        ("seq", "N", "sequence length"),
        ("batch", "N", "sequences per step"),
        ("vocab", "N", "vocabulary size"),
        ("steps", "N", "timed steps"),
    ):
        full, quick, tiny = (PRESETS[p][key] for p in ("full", "quick", "tiny"))
        parser.add_argument(
            f"--{key}",
            type=positive_int,
            metavar=meta,
            help=f"{what} (default {full}; --quick {quick}, --tiny {tiny})",
        )
    parser.add_argument(
        "--warmup",
        type=int,
        metavar="N",
        help="untimed steps first (default 5, --quick 3, --tiny 1)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        help=f"autocast dtype, or fp32 for none (default {DEFAULT_DTYPE})",
    )
    parser.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="seed of the weights and the batch, the same in every process (default 0)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        metavar="REL",
        help="largest relative difference of a first-step loss from the reference's "
        "(default 1e-2 for bf16/fp16, 1e-4 for fp32)",
    )


def table(results: list[dict[str, Any]]) -> str:
    fmt = bench.fmt
    lines = [
        f"{'backend':<18} {'status':>11} {'step ms':>10} {'tokens/s':>10} {'peak MB':>9} {'first loss':>11}"
    ]
    for r in results:
        lines.append(
            f"{r['backend']:<18} {r['status']:>11} {fmt(r['median_step_ms'], '10.3f')} "
            f"{fmt(r['tokens_per_s'], '10.4g')} {fmt(r['peak_mem_mb'], '9.0f')} "
            f"{fmt(r['first_loss'], '11.6g')}"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from validate.cli import UsageError, check_writable
    from validate.report import current_run_id, now

    check_writable(args.json, "--json")
    backends = bench.picked_names(args.backend, bench.BACKENDS, "backend")
    if args.warmup is not None and args.warmup < 0:
        raise UsageError("--warmup must be 0 or more.")
    size = "tiny" if args.tiny else ("quick" if args.quick else "full")
    cfg = config_for(size, args)  # a usage error before torch is loaded
    env, why = bench.probe_env()
    if env is None:
        print(f"python -m validate bench-train: {why}; nothing was timed.", file=sys.stderr)
        return 1
    if env["device"] == "cpu" and size != "tiny":
        print("no GPU here: training the tiny model (--tiny)")
        cfg = config_for("tiny", args)
    print(
        f"bench-train: {cfg['layers']} layer(s), width {cfg['width']}, {cfg['heads']} head(s), "
        f"seq {cfg['seq']}, batch {cfg['batch']}, {cfg['dtype']}; {cfg['warmup']} warm-up + "
        f"{cfg['steps']} timed step(s) on {env['device']}; one process per backend, seed {cfg['seed']}",
        flush=True,
    )
    created = now()
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    for backend in backends:
        got: dict[str, Any] = {}

        def on_result(i: int, child: dict[str, Any], got=got) -> None:
            got.update(child)

        def on_outcome(i: int, outcome, got=got) -> None:
            got.update(status=outcome.status, message=outcome.message)

        # The whole run is one item: the timeout covers every step.
        item_runner.run_items(
            "validate.bench_train",
            {"backend": backend, "items": [cfg]},
            1,
            args.timeout,
            on_result,
            on_outcome,
        )
        row = result_row(backend, cfg, got)
        results.append(row)
        msg = f"  {row['message']}" if row["message"] else ""
        print(
            f"{row['status']:>11}  {backend:<17} {bench.fmt(row['median_step_ms'], '10.3f')} ms/step"
            f"  first loss {bench.fmt(row['first_loss'], '.6g')}{msg}"[:300],
            flush=True,
        )
    check = loss_check(results, cfg["dtype"], args.tolerance)
    doc = {
        "kind": names.BENCH_TRAIN,
        "version": 1,
        "run_id": current_run_id(),
        "created": created,
        "env": env,
        "config": {k: cfg[k] for k in CONFIG_KEYS},
        "vocab": cfg["vocab"],
        "duration_s": round(time.monotonic() - started, 3),
        "results": results,
        "loss_check": check,
    }
    if args.json:
        try:
            item_runner.write_json(doc, args.json)
        except OSError as exc:
            raise UsageError(f"cannot write {args.json}: {exc}") from None
    print(table(results))
    print(f"loss check: {'ok' if check['ok'] else 'FAILED'}: {check['message']}")
    counts = {s: sum(r["status"] == s for r in results) for s in STATUSES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    code = exit_code(results, check)
    print(f"bench-train: {'FAIL' if code else 'PASS'} ({summary})", flush=True)
    return code


# --- child: one backend's training run (imports torch) --------------------------------------


def build_model(torch, cfg: dict[str, Any], attend):
    """The pre-norm decoder; ``attend(q, k, v)`` takes and returns (batch, seq, heads, dim)."""
    nn = torch.nn
    width, heads = cfg["width"], cfg["heads"]
    dim = width // heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.qkv = nn.Linear(width, 3 * width, bias=False)
            self.proj = nn.Linear(width, width, bias=False)
            self.ln2 = nn.LayerNorm(width)
            self.mlp = nn.Sequential(
                nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
            )

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, dim).unbind(2)
            x = x + self.proj(attend(q, k, v).reshape(b, s, width))
            return x + self.mlp(self.ln2(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(cfg["vocab"], width)
            self.pos = nn.Parameter(torch.randn(cfg["seq"], width) * 0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.ln = nn.LayerNorm(width)
            self.head = nn.Linear(width, cfg["vocab"], bias=False)

        def forward(self, tokens):
            x = self.embed(tokens) + self.pos[: tokens.shape[1]]
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return Decoder()


def train(torch, attn: bench.Attention, cfg: dict[str, Any]) -> dict[str, Any]:
    """Warm-up and timed steps; {"status": "ok", "step_ms", "first_loss", ...}."""
    step = _training_step(torch, attn, cfg)
    with attn.context():
        first_loss, grad_norm = _first_step(torch, attn, step)
        for _ in range(max(0, cfg["warmup"] - 1)):
            step()
        step_ms, peak, losses = _timed_steps(torch, attn.device, step, cfg["steps"])
    last = float(losses[-1]) if losses else first_loss
    return {
        "status": "ok",
        "step_ms": step_ms,
        "peak_mem_mb": peak,
        "first_loss": first_loss,
        "first_grad_norm": grad_norm,
        "last_loss": last,
        "message": "",
    }


def _training_step(torch, attn: bench.Attention, cfg: dict[str, Any]):
    """The model, batch and optimizer of the run, as `step(norm=False) -> (loss, grad norm)`:
    one optimizer step (the gradient norm measured only when asked)."""
    import contextlib

    from validate.checks.numerics import torch_dtype

    device = attn.device

    def attend(q, k, v):
        if attn.bshd:
            return attn(q, k, v, True, False)
        out = attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True, False)
        return out.transpose(1, 2)

    # Weights and batch from the seed on the CPU: the same numbers in every process.
    torch.manual_seed(cfg["seed"])
    model = build_model(torch, cfg, attend).to(device)
    gen = torch.Generator(device="cpu").manual_seed(cfg["seed"] + 1)
    data = torch.randint(cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=gen).to(device)
    inputs, targets = data[:, :-1], data[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    dtype = cfg["dtype"]
    amp = (
        torch.autocast(device_type=device, dtype=torch_dtype(dtype))
        if dtype != "fp32"
        else contextlib.nullcontext()
    )
    scaler = (
        torch.amp.GradScaler("cuda") if dtype == "fp16" and device == "cuda" else None
    )  # fp16 training needs loss scaling; bf16 and fp32 do not

    def step(norm: bool = False) -> tuple[float, float | None]:
        opt.zero_grad(set_to_none=True)
        with amp:
            logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, cfg["vocab"]), targets.reshape(-1)
        )
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        grad_norm = None
        if norm:
            grads = [p.grad.float().norm() for p in model.parameters() if p.grad is not None]
            grad_norm = float(torch.stack(grads).norm())
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        return loss, grad_norm

    return step


def _first_step(torch, attn: bench.Attention, step) -> tuple[float, float | None]:
    """The first step, which decides whether the backend trains at all: (its loss, the
    gradient norm); a refusal (no kernel, out of memory, the shim falling back) raises
    Refused, other errors propagate."""
    from validate.checks.sdpa import captured_warnings

    with captured_warnings() as warned:
        try:
            loss, grad_norm = step(norm=True)
            first_loss = float(loss)
        except torch.cuda.OutOfMemoryError as exc:
            raise bench.Refused(f"out of memory: {bench.one_line(exc)}") from None
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
            text = str(exc)
            if attn.backend in bench.SDPA_ENUM and any(n in text for n in bench.NO_KERNEL):
                raise bench.Refused(_no_kernel(attn, warned, exc)) from None
            if attn.fn is not None and not isinstance(exc, RuntimeError):
                raise bench.Refused(bench.one_line(exc)) from None
            raise
    if attn.backend == "kernels.sdpa_shim" and not attn.shim.stats().get("routed"):
        why = ", ".join(attn.shim.stats().get("reasons") or {}) or "unknown"
        raise bench.Refused(f"the shim routed no call to the kernels (fell back: {why})")
    return first_loss, grad_norm


def _no_kernel(attn: bench.Attention, warned: list[str], exc: Exception) -> str:
    """Why an SDPA backend had no kernel for the step: PyTorch's warnings, else the error."""
    from validate.checks import sdpa

    name = attn.backend.split(".", 1)[1]
    reasons = [w for w in dict.fromkeys(warned) if w and "No available" not in w]
    if not reasons and attn.device == "cpu" and name in sdpa.GPU_ONLY:
        reasons = [f"{sdpa.ENUM_NAMES[name]} has no CPU kernel in PyTorch"]
    return "; ".join(reasons)[:600] or bench.one_line(exc)


def _timed_steps(torch, device: str, step, steps: int):
    """`steps` timed steps: (ms of each, peak MiB or None, their losses)."""
    start, stop, read = bench.timer(torch, device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    marks, losses = [], []
    for _ in range(steps):
        begin = start()
        loss, _ = step()
        marks.append(stop(begin))
        losses.append(loss)
    step_ms = read(marks)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    return step_ms, peak, losses


def child(spec_path: str, events_path: str) -> None:
    """One backend's training run, reported as one item."""
    from validate.runner import is_device_fault

    spec = json.loads(open(spec_path, encoding="utf-8").read())
    out = item_runner.EventWriter(events_path)
    backend = spec["backend"]
    import torch

    if backend.startswith("kernels") and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are defined, on import
    out.emit({"event": "env", "env": item_runner.env_info()})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out.emit({"event": "start", "index": 0})
    try:
        result = train(torch, bench.Attention(torch, backend, device), spec["items"][0])
    except bench.Refused as exc:
        result = {"status": "unsupported", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the run's result
        text = bench.one_line(exc)
        if is_device_fault(str(exc)):
            result = {"status": "crash", "message": f"GPU fault: {text}"}
        else:
            result = {"status": "error", "message": text}
    out.emit({"event": "result", "index": 0, "result": result})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip teardown: a device context can hang on exit after a fault


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    print("internal entry point; run `python -m validate bench-train`", file=sys.stderr)
    sys.exit(2)
