"""``python -m validate stress``: attention backends for many iterations at real workload shapes.

Standard library only at module level: each backend runs in its own child process
(``validate._stress_child``), which imports torch; this parent only launches, watches the child's
progress file, kills a child that stops making progress, and classifies how each one ended.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract import names, workloads
from validate import forkserver
from validate.argtypes import positive_int, seconds
from validate.report import current_run_id
from validate.runner import Outcome, child_env, classify, kill_group, signal_name, tail

HELP = "run backends for many iterations at real workload shapes; report the first failure"
DESCRIPTION = """\
Stress attention backends with synthetic tensors at the shapes of real workloads (no weights):
Qwen-Image's joint attention, SD1.5, SDXL, an LLM's causal GQA prefill, or a shape of your own.
Each backend runs in its own process for --iters iterations; every output is checked for
NaN/Inf and every --check-every iterations (and the first and last) against the fp32 math
reference. A crash or hang is reported with the iteration it happened in.

backends: sdpa.default (what F.scaled_dot_product_attention picks), sdpa.math, sdpa.flash,
sdpa.efficient, sdpa.cudnn (each forced with sdpa_kernel), flash_attn, kernels (the bundled
kernels' flash_attn_func) and kernels.sdpa_shim (F.scaled_dot_product_attention with the shim
on); one that cannot run here is 'unsupported' with the reason.

exit status: 0 every run passed (or was unsupported); 1 a run failed, crashed or timed out,
or nothing could run; 2 usage error."""

BACKENDS = names.BACKEND_NAMES
ALL = "all"
PIPELINES = ("qwen-image",)
PIPELINE_REPO = "Qwen/Qwen-Image"
SERIALIZE_ENV = {"AMD_SERIALIZE_KERNEL": "3", "CUDA_LAUNCH_BLOCKING": "1"}
RUN_STATUSES = names.RUN_STATUSES
FAILING = names.FAILING
POLL_S = 0.2


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`python -m validate stress`'s options, in --help's order: what is stressed, how often it
    is judged, at which shapes, and how a run is watched (or the real pipeline run instead)."""
    _add_targets(p)
    _add_iterations(p)
    _add_shapes(p)
    _add_run(p)


def _add_targets(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload",
        choices=workloads.names(),
        default="qwen-image",
        help="whose attention shapes to run (default qwen-image); docs/validation.md lists them",
    )
    p.add_argument(
        "--backend",
        action="append",
        metavar="NAME",
        help=f"a backend to stress (repeatable, or comma-separated): {', '.join(BACKENDS)}, "
        "or all (default all)",
    )


def _add_iterations(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--iters",
        type=positive_int,
        default=100,
        metavar="N",
        help="iterations per backend (default 100)",
    )
    p.add_argument(
        "--check-every",
        type=positive_int,
        default=10,
        metavar="K",
        help="compare with the fp32 math reference every K iterations, and at the first and last "
        "(default 10); NaN/Inf is checked every iteration",
    )
    p.add_argument(
        "--serialize",
        action="store_true",
        help="set AMD_SERIALIZE_KERNEL=3 and CUDA_LAUNCH_BLOCKING=1 in each run, so a GPU fault "
        "surfaces at the kernel that caused it (slower)",
    )


def _add_shapes(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resolution",
        metavar="WxH",
        help="image size for qwen-image, sd15 and sdxl, e.g. 1664x928 (default: qwen-image runs "
        "1664x928 and 1328x1328, sd15 512x512, sdxl 1024x1024)",
    )
    p.add_argument(
        "--shape",
        metavar="b,h,hkv,sq,sk,d[,causal]",
        help="the shape of --workload custom: batch, query heads, key/value heads, query and key "
        "lengths, head dim, and 1 for causal",
    )
    p.add_argument(
        "--dtype",
        choices=workloads.DTYPES,
        help="override the workload's dtype (bf16 or fp16 per workload)",
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="shrink every shape (batch 1, 2 heads or 1 key/value head, sequences <= 64; head dims "
        "kept) for CPU runs and tests",
    )


def _add_run(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=seconds,
        default=300.0,
        metavar="SECONDS",
        help="kill a run that makes no progress for this long and report it as a hang (default 300; "
        "the first iteration includes compiling kernels)",
    )
    p.add_argument("--json", metavar="PATH", help="write the stress-<workload>.json document here")
    p.add_argument(
        "--pipeline",
        choices=PIPELINES,
        help="run the real diffusers pipeline with the kernels' SDPA shim off and on instead of "
        "synthetic tensors (needs diffusers and the weights in the local Hugging Face cache; "
        "--iters images, --resolution)",
    )
    p.add_argument(
        "--pipeline-steps",
        type=positive_int,
        default=20,
        metavar="N",
        help="denoising steps per image with --pipeline (default 20)",
    )


# --- pure parts ---------------------------------------------------------------------------------


def select_backends(values: list[str] | None) -> list[str]:
    """--backend values (repeatable, comma-separated, 'all') -> backends in table order."""
    wanted: list[str] = []
    for value in values or [ALL]:
        for name in (v.strip() for v in value.split(",")):
            if not name:
                continue
            if name == ALL:
                wanted += BACKENDS
            elif name in BACKENDS:
                wanted.append(name)
            else:
                raise ValueError(
                    f"unknown backend {name!r}; choose from {', '.join(BACKENDS)} or all."
                )
    return [b for b in BACKENDS if b in wanted]


@dataclass
class Progress:
    """What a child's progress file says: iterations finished, where it was last, their times."""

    completed: int = 0
    current: str | None = None  # the last step begun and not finished
    iter_ms: list[float] = field(default_factory=list)
    started_iterations: bool = False


def read_progress(lines: list[str]) -> Progress:
    p = Progress()
    for line in lines:
        tag, _, rest = line.strip().partition(" ")
        if tag == "done":
            num, _, ms = rest.partition(" ")
            if num.isdigit():
                p.completed = int(num)
                try:
                    p.iter_ms.append(float(ms))
                except ValueError:
                    pass
            p.current = None
        elif tag == "iter":
            num, _, shape_name = rest.partition(" ")
            p.started_iterations = True
            p.current = f"iteration {num} ({shape_name})"
        elif tag == "setup":
            p.current = f"set-up: {rest}"
    return p


def median_ms(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def run_record(
    backend: str,
    iters: int,
    serialize: bool,
    outcome: Outcome,
    progress: Progress,
    stall_s: float | None = None,
) -> dict[str, Any]:
    """One entry of "runs": the child's own result when it wrote one and exited cleanly, else a
    crash or timeout placed at the iteration its progress file shows. Pure."""
    payload = outcome.payload
    base = {"backend": backend, "iters_requested": iters, "serialize": serialize}
    if payload is not None and not outcome.timed_out and outcome.returncode == 0:
        status = payload.get("status")
        if status not in RUN_STATUSES:
            status, payload = "crash", {"message": f"the run returned an unknown status {status!r}"}
        return {
            **base,
            "status": status,
            "iters_completed": int(payload.get("iters_completed") or 0),
            "ms_per_iter": payload.get("ms_per_iter"),
            "first_failure": payload.get("first_failure"),
            "message": str(payload.get("message", "")),
        }
    iteration = progress.completed + 1 if progress.started_iterations else 0
    stage = [progress.current] if progress.current else []
    _, message = classify(
        Outcome(outcome.returncode, outcome.timed_out, None, outcome.stderr, stage)
    )
    if outcome.timed_out:
        status = kind = "timeout"
        where = f" during {progress.current}" if progress.current else ""
        quiet = f"{stall_s:g} s" if stall_s else "the timeout"
        message = f"no progress for {quiet}{where} (a hang); the process group was killed"
    else:
        status = kind = "crash"
    return {
        **base,
        "status": status,
        "iters_completed": progress.completed,
        "ms_per_iter": median_ms(progress.iter_ms),
        "first_failure": {"iteration": iteration, "kind": kind, "message": message},
        "message": f"iteration {iteration}: {message}" if iteration else message,
    }


def exit_status(runs: list[dict[str, Any]]) -> int:
    """1 when a run failed, crashed or timed out, or when none ran at all; else 0."""
    if any(r["status"] in FAILING for r in runs):
        return 1
    return 0 if any(r["status"] == "pass" for r in runs) else 1


def table(runs: list[dict[str, Any]]) -> str:
    rows = [("backend", "status", "iterations", "ms/iter", "first failure / note")]
    for r in runs:
        ms = f"{r['ms_per_iter']:.3f}" if isinstance(r.get("ms_per_iter"), (int, float)) else "-"
        ff = r.get("first_failure")
        note = (
            f"iter {ff['iteration']} {ff['kind']}: {ff['message']}" if ff else r.get("message", "")
        )
        rows.append(
            (
                r["backend"],
                r["status"],
                f"{r['iters_completed']}/{r['iters_requested']}",
                ms,
                note[:160],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
        for row in rows
    )


def document(
    env: dict[str, Any], workload: str, resolution: str | None, shapes: list[dict], runs
) -> dict:
    return {
        "kind": names.STRESS,
        "version": 1,
        "run_id": current_run_id(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "env": env,
        "workload": workload,
        "resolution": resolution,
        "shapes": shapes,
        "runs": runs,
    }


# --- processes ---------------------------------------------------------------------------------


def _child_env(serialize: bool) -> dict[str, str]:
    env = child_env()
    if serialize:
        env.update(SERIALIZE_ENV)
    return env


def launch(args: list[str], stall_s: float, env: dict[str, str]) -> tuple[Outcome, list[str]]:
    """Run ``python -m validate._stress_child ARGS... RESULT PROGRESS`` in its own session; kill
    its process group when the progress file stops growing for ``stall_s``. Returns the outcome
    and the progress lines."""
    with tempfile.TemporaryDirectory(prefix="validate-stress-") as tmp:
        result, progress = Path(tmp, "result.json"), Path(tmp, "progress.txt")
        progress.touch()
        err_path = Path(tmp, "stderr.txt")
        # Output to files, not pipes: a helper the child leaves behind would hold a pipe open.
        with open(err_path, "wb") as err:
            proc = forkserver.popen_module(
                "validate._stress_child", [*args, str(result), str(progress)],
                env=env, stdout=err, stderr=subprocess.STDOUT,
            )  # fmt: skip
            size, last = 0, time.monotonic()
            timed_out = False
            while proc.poll() is None:
                time.sleep(POLL_S)
                now_size = progress.stat().st_size
                if now_size != size:
                    size, last = now_size, time.monotonic()
                elif time.monotonic() - last > stall_s:
                    timed_out = True
                    break
            kill_group(proc)  # leftovers too (a compile worker pool), not only a hung child
            proc.wait()
        payload = None
        if result.exists():
            try:
                payload = json.loads(result.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, OSError):
                payload = None
        lines = progress.read_text(encoding="utf-8", errors="replace").splitlines()
        stderr = err_path.read_bytes().decode("utf-8", "replace")
    rc = None if timed_out else proc.returncode
    return Outcome(rc, timed_out, payload, stderr, []), lines


def probe_env() -> tuple[dict[str, Any] | None, str]:
    """The env block, read in a child (this process never imports torch); (None, why) on failure."""
    with tempfile.TemporaryDirectory(prefix="validate-stress-env-") as tmp:
        out = Path(tmp, "env.json")
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "validate._stress_child", "--env", str(out)],
                env=_child_env(False), capture_output=True, text=True, timeout=600,
                start_new_session=True,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return None, "reading torch's versions and device took over 600 s"
        if out.exists():
            return json.loads(out.read_text(encoding="utf-8")), ""
    last = tail(proc.stderr, 1)
    if proc.returncode < 0:
        why = f"killed by {signal_name(-proc.returncode)}"
    else:
        why = last[0] if last else f"exit status {proc.returncode}"
    return None, why


def hub_cache() -> Path:
    """Where huggingface_hub keeps models: HF_HUB_CACHE, else $HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def cached_snapshot(repo_id: str, hub: Path) -> Path | None:
    """A complete-looking local snapshot of ``repo_id`` (one with model_index.json), or None."""
    snaps = hub / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    found = (
        sorted(snaps.glob("*/model_index.json"), key=lambda p: p.stat().st_mtime)
        if snaps.is_dir()
        else []
    )
    return found[-1].parent if found else None


# --- the command ---------------------------------------------------------------------------------


def _check_writable(path: str | None) -> None:
    from validate.cli import UsageError

    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"--json {path}: is a directory; give a file name.")
    probe = target.parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        raise UsageError(f"--json {path}: directory {probe} is not writable.")


def _write_json(doc: dict[str, Any], path: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, target)  # the last good document stays until this one is complete


def main(args: argparse.Namespace) -> int:
    from validate.cli import UsageError

    try:
        backends = select_backends(args.backend)
        shapes = workloads.shapes(
            args.workload, args.resolution, custom=args.shape, dtype=args.dtype
        )
    except (ValueError, workloads.WorkloadError) as exc:
        raise UsageError(str(exc)) from None
    _check_writable(args.json)
    if args.pipeline:
        if args.workload != args.pipeline or args.shape or args.tiny:
            raise UsageError(
                f"--pipeline {args.pipeline} runs the real model; leave out --workload, --shape and --tiny."
            )
        return pipeline_main(args)
    if args.tiny:
        shapes = [workloads.tiny(s) for s in shapes]
    env, why = probe_env()
    if env is None:
        raise UsageError(f"torch does not load in this Python ({sys.executable}): {why}.")
    print(
        f"stress {args.workload}: {len(shapes)} shape(s) on {env['device']}, {args.iters} iteration(s) "
        f"per backend, reference every {args.check_every}"
        + (", serialized" if args.serialize else ""),
        flush=True,
    )
    for s in shapes:
        gqa = f"/{s['hkv']}" if s["hkv"] != s["h"] else ""
        print(
            f"  {s['name']}: b{s['b']} h{s['h']}{gqa} q{s['sq']} k{s['sk']} d{s['d']} "
            f"{'causal ' if s['causal'] else ''}{s['dtype']}",
            flush=True,
        )
    runs = []
    run_env = _child_env(args.serialize)
    for backend in backends:
        spec = {
            "backend": backend,
            "shapes": shapes,
            "iters": args.iters,
            "check_every": args.check_every,
            "tiny": bool(args.tiny),
            "seed": 0,
        }
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
            json.dump(spec, fh)
        try:
            outcome, lines = launch([fh.name], args.timeout, run_env)
        finally:
            os.unlink(fh.name)
        run = run_record(
            backend, args.iters, args.serialize, outcome, read_progress(lines), args.timeout
        )
        if run["status"] in ("crash", "timeout"):
            run["stderr_tail"] = tail(outcome.stderr)
        runs.append(run)
        print(f"{run['status']:>11}  {backend}  {run['iters_completed']}/{args.iters}", flush=True)
    doc = document(env, args.workload, args.resolution, shapes, runs)
    print()
    print(table(runs))
    return _finish(doc, args)


def _finish(doc: dict[str, Any], args: argparse.Namespace) -> int:
    from validate.cli import UsageError

    if args.json:
        try:
            _write_json(doc, args.json)
        except OSError as exc:
            raise UsageError(f"cannot write {args.json}: {exc}") from None
        print(f"wrote {args.json}")
    code = exit_status(doc["runs"])
    counts = {s: sum(r["status"] == s for r in doc["runs"]) for s in RUN_STATUSES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    print(f"stress: {'FAIL' if code else 'PASS'} ({summary})")
    return code


def pipeline_main(args: argparse.Namespace) -> int:
    """--pipeline qwen-image: the real pipeline, shim off then on, one process each."""
    import importlib.util

    from validate.cli import UsageError

    hub = hub_cache()
    snapshot = cached_snapshot(PIPELINE_REPO, hub)
    missing = []
    if importlib.util.find_spec("diffusers") is None:
        missing.append("diffusers is not installed (pip install diffusers transformers accelerate)")
    if snapshot is None:
        missing.append(
            f"the {PIPELINE_REPO} weights are not in the local Hugging Face cache {hub} "
            f"(get them with `hf download {PIPELINE_REPO}`, or point HF_HOME at a cache that has them)"
        )
    if missing:
        raise UsageError("--pipeline qwen-image cannot run: " + "; and ".join(missing) + ".")
    width, height = (
        workloads.parse_resolution(args.resolution)
        if args.resolution
        else workloads.WORKLOADS["qwen-image"].resolutions[0]
    )
    env, why = probe_env()
    if env is None:
        raise UsageError(f"torch does not load in this Python ({sys.executable}): {why}.")
    runs = []
    for name, shim in (("pipeline:sdpa.default", False), ("pipeline:kernels.sdpa_shim", True)):
        spec = {
            "model_dir": str(snapshot),
            "resolution": [width, height],
            "iters": args.iters,
            "steps": args.pipeline_steps,
            "shim": shim,
        }
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
            json.dump(spec, fh)
        try:
            outcome, lines = launch(
                ["--pipeline", fh.name], args.timeout, _child_env(args.serialize)
            )
        finally:
            os.unlink(fh.name)
        run = run_record(
            name, args.iters, args.serialize, outcome, read_progress(lines), args.timeout
        )
        runs.append(run)
        print(f"{run['status']:>11}  {name}  {run['iters_completed']}/{args.iters}", flush=True)
    shapes = workloads.shapes("qwen-image", (width, height))
    doc = document(env, "qwen-image", f"{width}x{height}", shapes, runs)
    print()
    print(table(runs))
    return _finish(doc, args)
