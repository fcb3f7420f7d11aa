"""Child side of one stress run: ``python -m validate._stress_child SPEC RESULT PROGRESS``.

Runs one backend over the spec's shapes for N iterations, checks every output for NaN/Inf and
every K-th (and the first and last) against the fp32 math reference, and appends its progress
to PROGRESS as it goes, so the parent can say at which iteration a crash or hang happened:

    setup <what>              before each preparation step
    iter <i> <shape>          before the call for that shape in iteration i (1-based)
    done <i> <ms>             iteration i finished and was checked; ms is its call time

``--env OUT`` writes the environment block of the JSON documents instead; ``--pipeline SPEC
RESULT PROGRESS`` runs the real Qwen-Image pipeline (diffusers) image by image.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from contract import names
from validate.runner import is_device_fault, watch_parent

# Testing hook (not user interface): plant a fault, e.g. "segfault@3", "nan@2:sdpa.math",
# several separated by commas. Kinds: segfault, abort, exit, hang, error, devicefault (a
# Python exception carrying a GPU fault's text), nan, inf, mismatch (the output plus 1).
FAULT_ENV = "VALIDATE_STRESS_FAULT"
FAULT_KINDS = (
    "segfault",
    "abort",
    "exit",
    "hang",
    "error",
    "devicefault",
    "nan",
    "inf",
    "mismatch",
)
# Bytes of fp32 scores one reference chunk may hold; the reference runs per batch and head group.
REFERENCE_CHUNK_BYTES = 1 << 30
SDPA_FORCED = {b.name: b.sdpa for b in names.BACKENDS if b.sdpa}
GPU_ONLY_SDPA = ("efficient", "cudnn")


class Progress:
    def __init__(self, path: str):
        # Line-buffered appends: a line written before a crash is in the kernel's page cache and
        # survives the process; no fsync per iteration.
        self._fh = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - lives as long as the run

    def __call__(self, line: str) -> None:
        self._fh.write(line.replace("\n", " ") + "\n")


class Unsupported(Exception):
    """The backend cannot run anything here; the message says why."""


def parse_faults(text: str | None, backend: str) -> dict[int, str]:
    """'segfault@3,nan@5:sdpa.math' -> {iteration: kind} for ``backend``."""
    found: dict[int, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        spec, _, only = part.partition(":")
        kind, _, when = spec.partition("@")
        if kind not in FAULT_KINDS or not when.isdigit():
            raise ValueError(f"{FAULT_ENV}: {part!r} is not KIND@ITERATION[:BACKEND]")
        if only and only != backend:
            continue
        found[int(when)] = kind
    return found


def plant_before(kind: str | None) -> None:
    """Faults that replace the call."""
    if kind == "segfault":
        import ctypes

        ctypes.string_at(0)
    elif kind == "abort":
        os.abort()
    elif kind == "exit":
        os._exit(3)
    elif kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "error":
        raise RuntimeError("planted error (testing hook)")
    elif kind == "devicefault":
        raise RuntimeError("CUDA error: an illegal memory access was encountered (planted)")


def plant_after(kind: str | None, out):
    """Faults that spoil the output."""
    if kind in ("nan", "inf"):
        out = out.clone()
        out.view(-1)[0] = float(kind)
    elif kind == "mismatch":
        out = out + 1
    return out


def env_info() -> dict[str, Any]:
    """The "env" block: torch, triton, device, arch, hip, cuda."""
    import importlib.metadata

    import torch

    triton = None
    for dist in ("triton", "pytorch-triton-rocm", "pytorch-triton"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            triton = importlib.metadata.version(dist)
            break
    device, arch = "cpu", None
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
        props = torch.cuda.get_device_properties(0)
        gcn = getattr(props, "gcnArchName", "")
        if getattr(torch.version, "hip", None) and gcn:
            arch = gcn.split(":")[0]
        else:
            arch = f"sm_{props.major}{props.minor}"
    return {
        "torch": torch.__version__,
        "triton": triton,
        "device": device,
        "arch": arch,
        "hip": getattr(torch.version, "hip", None),
        "cuda": getattr(torch.version, "cuda", None),
    }


def _case(s: dict):
    from validate.grid import Case

    return Case(
        s["name"], s["dtype"], s["causal"], s["d"], s["h"], s["hkv"], s["sq"], s["sk"], s["b"]
    )


def reference(q, k, v, causal: bool):
    """(fp32 reference, input-dtype reference) as validate.checks.numerics computes them, in
    chunks of batch and head groups so that the scores of one chunk stay near 1 GiB."""
    import torch

    from validate.checks.numerics import attention_math

    b, h, sq, _ = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    rep = h // hkv
    groups = max(1, min(hkv, REFERENCE_CHUNK_BYTES // max(1, rep * sq * sk * 4)))
    ref = torch.empty_like(q)
    ref_lp = torch.empty_like(q)
    for bi in range(b):
        for g0 in range(0, hkv, groups):
            g1 = min(hkv, g0 + groups)
            qs = q[bi : bi + 1, g0 * rep : g1 * rep]
            ks, vs = k[bi : bi + 1, g0:g1], v[bi : bi + 1, g0:g1]
            ref[bi : bi + 1, g0 * rep : g1 * rep] = attention_math(qs, ks, vs, causal, upcast=True)
            ref_lp[bi : bi + 1, g0 * rep : g1 * rep] = attention_math(
                qs, ks, vs, causal, upcast=False
            )
    return ref, ref_lp


class Backend:
    """One backend: ``problem(shape)`` says why a shape cannot run (None when it can), ``call``
    runs q, k, v in (batch, heads, seq, head_dim) and returns the output in the same layout."""

    def __init__(self, name: str, torch, device: str, tiny: bool):
        self.name, self.torch, self.device = name, torch, device
        self.shim = None
        if name == "sdpa.default":
            self.call = self._sdpa
        elif name in SDPA_FORCED:
            b = SDPA_FORCED[name]
            if device == "cpu" and b in GPU_ONLY_SDPA:
                raise Unsupported(
                    f"PyTorch has no CPU kernel for {name}; it needs a CUDA/ROCm device"
                )
            from validate.checks.sdpa import forced

            self.forced = lambda: forced(torch, b)
            self.call = self._sdpa_forced
        elif name == "flash_attn":
            try:
                from flash_attn import flash_attn_func
            except ModuleNotFoundError as exc:
                if exc.name and exc.name.split(".")[0] == "flash_attn":
                    raise Unsupported("flash_attn is not installed") from None
                raise
            if device == "cpu":
                raise Unsupported("flash_attn runs on CUDA/ROCm devices only")
            self.fn = flash_attn_func
            self.call = self._bshd
        elif name in ("kernels", "kernels.sdpa_shim"):
            if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
                if not tiny:
                    raise Unsupported(
                        "no GPU: the bundled kernels would run in Triton's CPU interpreter, which "
                        "is only practical at --tiny shapes"
                    )
                # Read when the kernels are defined, so before the import; this process only.
                os.environ["TRITON_INTERPRET"] = "1"
            try:
                import attnforge_kernels
            except ImportError as exc:
                raise Unsupported(
                    f"the kernels package is not importable ({type(exc).__name__}: {exc})"
                ) from None
            if name == "kernels":
                self.fn = attnforge_kernels.flash_attn_func
                self.call = self._bshd
            else:
                self.shim = attnforge_kernels.sdpa_shim
                self.shim.enable()
                self.shim.reset_stats()
                self.call = self._sdpa
        else:
            raise Unsupported(f"unknown backend {name!r}")

    def problem(self, s: dict) -> str | None:
        torch = self.torch
        if s["h"] != s["hkv"] and self.name.startswith(("sdpa", "kernels.sdpa_shim")):
            from validate.checks.sdpa import supports_gqa

            if not supports_gqa(torch):
                return "GQA needs scaled_dot_product_attention(enable_gqa=...) (torch >= 2.5)"
        if self.name in ("flash_attn", "kernels"):
            if s["dtype"] == "fp32":
                return f"{self.name} takes fp16/bf16 only"
            if s["d"] > 256:
                return f"{self.name} takes head dims up to 256"
            if s["causal"] and s["sq"] != s["sk"]:
                return (
                    f"{self.name}'s causal mask is bottom-right aligned and SDPA's (the reference) "
                    "top-left; with Sq != Sk they differ"
                )
        if self.name in SDPA_FORCED and self.device == "cuda":
            b = SDPA_FORCED[self.name]
            if b != "math":
                from validate.checks.numerics import make_inputs
                from validate.checks.sdpa import can_use, sdpa_params

                small = {**s, "b": 1, "sq": min(s["sq"], 16), "sk": min(s["sk"], 16)}
                q, k, v = make_inputs(_case(small), self.device)
                with contextlib.suppress(Exception):
                    ok, reasons = can_use(torch, b, sdpa_params(torch, q, k, v, _case(small)))
                    if ok is False:
                        return f"can_use_{b}: " + ("; ".join(reasons) or "no reason given")
        return None

    def _sdpa(self, q, k, v, s):
        f = self.torch.nn.functional.scaled_dot_product_attention  # looked up: the shim may be on
        if s["h"] != s["hkv"]:
            return f(q, k, v, is_causal=s["causal"], enable_gqa=True)
        return f(q, k, v, is_causal=s["causal"])

    def _sdpa_forced(self, q, k, v, s):
        with self.forced():
            return self._sdpa(q, k, v, s)

    def _bshd(self, q, k, v, s):
        t = (x.transpose(1, 2) for x in (q, k, v))
        return self.fn(*t, causal=s["causal"]).transpose(1, 2)


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return (text.splitlines() or [type(exc).__name__])[0][:400]


def _refused(exc: BaseException) -> bool:
    """An error on the first call that means 'this backend does not take this shape here'."""
    torch = sys.modules.get("torch")
    oom = torch is not None and isinstance(exc, getattr(torch, "OutOfMemoryError", ()))
    return oom or "No available kernel" in str(exc)


def _failure(iteration: int, kind: str, message: str) -> dict[str, Any]:
    return {"iteration": iteration, "kind": kind, "message": message}


def stress(spec: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """One backend's stress run: its shapes prepared, iterated and judged, as one result."""
    import torch

    name = spec["backend"]
    faults = parse_faults(os.environ.get(FAULT_ENV), name)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    progress(f"setup {name} on {device}")
    try:
        backend = Backend(name, torch, device, bool(spec.get("tiny")))
    except Unsupported as exc:
        return {"status": "unsupported", "iters_completed": 0, "message": str(exc)}
    skipped: dict[str, str] = {}
    cases = _prepare_cases(spec, backend, device, sync, progress, skipped)
    times: list[float] = []
    completed, failure = 0, None
    if cases:
        cases, times, completed, failure = _iterate(
            torch, backend, cases, spec, faults, sync, progress, skipped
        )
    if not cases:
        return {"status": "unsupported", "iters_completed": 0, "message": _skipped_text(skipped)}
    return _result(backend, cases, skipped, times, completed, failure)


def _prepare_cases(spec, backend, device, sync, progress, skipped: dict[str, str]) -> list:
    """(shape, q, k, v, fp32 reference, its low-precision twin) of each shape the backend
    takes; the others go into `skipped` with why."""
    from validate.checks.numerics import make_inputs

    cases = []
    for s in spec["shapes"]:
        progress(f"setup {s['name']}: support")
        why = backend.problem(s)
        if why:
            skipped[s["name"]] = why
            continue
        progress(f"setup {s['name']}: inputs and fp32 reference")
        q, k, v = make_inputs(_case(s), device, seed=int(spec.get("seed", 0)))
        ref, ref_lp = reference(q, k, v, s["causal"])
        sync()
        cases.append((s, q, k, v, ref, ref_lp))
    return cases


def _iterate(torch, backend, cases, spec, faults, sync, progress, skipped: dict[str, str]):
    """Every iteration over every case until the first failure: (the cases still run, ms per
    iteration, iterations completed, the first failure or None). A shape refused at the first
    iteration moves to `skipped`; with none left the cases come back empty."""
    iters, every = int(spec["iters"]), max(1, int(spec["check_every"]))
    times: list[float] = []
    completed, failure = 0, None
    for i in range(1, iters + 1):
        check = i == 1 or i == iters or i % every == 0
        elapsed = 0.0
        for case in list(cases):
            s = case[0]
            progress(f"iter {i} {s['name']}")
            fault = faults.get(i) if s is cases[0][0] else None
            spent, skip, failure = _call_once(torch, backend, case, i, fault, check, sync)
            elapsed += spent
            if skip is not None:
                skipped[s["name"]] = skip
                cases = [c for c in cases if c[0] is not s]
                continue
            if failure is not None:
                break
        if failure is not None or not cases:
            break
        times.append(elapsed * 1000)
        completed = i
        progress(f"done {i} {elapsed * 1000:.4f}")
    return cases, times, completed, failure


def _call_once(torch, backend, case, i: int, fault, check: bool, sync):
    """One call of one case at iteration i: (seconds it took, why the shape is skipped or None,
    the failure or None). A call that raised took no time that counts."""
    s, q, k, v, ref, ref_lp = case
    routed_before = backend.shim.stats()["routed"] if backend.shim else 0
    t0 = time.perf_counter()
    try:
        plant_before(fault)
        out = backend.call(q, k, v, s)
        sync()
    except Exception as exc:  # noqa: BLE001 - every error is a result
        text = _first_line(exc)
        if is_device_fault(f"{exc}"):
            return 0.0, None, _failure(i, "crash", f"GPU fault at {s['name']}: {text}")
        if i == 1 and _refused(exc):
            return 0.0, text, None
        return 0.0, None, _failure(i, "error", f"{s['name']} raised {text}")
    elapsed = time.perf_counter() - t0
    if backend.shim is not None and i == 1 and backend.shim.stats()["routed"] == routed_before:
        reasons = ", ".join(backend.shim.stats()["reasons"]) or "?"
        return elapsed, f"the shim fell back to SDPA ({reasons})", None
    return elapsed, None, _judged(torch, plant_after(fault, out), ref, ref_lp, s, i, check)


def _judged(torch, out, ref, ref_lp, s: dict, i: int, check: bool) -> dict | None:
    """The failure of one output (NaN/Inf every iteration; against the reference when
    `check`), or None."""
    from validate.checks.numerics import judge

    finite = torch.isfinite(out)
    if not bool(finite.all()):
        nans = int(torch.isnan(out).sum())
        kind = "nan" if nans else "inf"
        bad = int((~finite).sum())
        return _failure(i, kind, f"{bad} non-finite values ({nans} NaN) in {s['name']}")
    if check:
        j = judge(out, ref, ref_lp)
        if not j.ok:
            return _failure(i, "mismatch", f"{s['name']}: {j.message}")
    return None


def _result(backend, cases, skipped, times, completed: int, failure) -> dict[str, Any]:
    result: dict[str, Any] = {
        "iters_completed": completed,
        "ms_per_iter": _median(times),
        "first_failure": failure,
        "shapes_run": [c[0]["name"] for c in cases],
        "shapes_skipped": skipped,
    }
    notes = []
    if skipped:
        notes.append(_skipped_text(skipped))
    if backend.shim is not None:
        st = backend.shim.stats()
        notes.append(f"shim routed {st['routed']} call(s), fell back {st['fallback']}")
    if failure is None:
        result["status"] = "pass"
        head = f"{completed} iteration(s) of {len(cases)} shape(s), no NaN/Inf, within tolerance"
    else:
        result["status"] = "crash" if failure["kind"] == "crash" else "fail"
        head = f"iteration {failure['iteration']}: {failure['kind']}: {failure['message']}"
    result["message"] = "; ".join([head, *notes])
    return result


def _skipped_text(skipped: dict[str, str]) -> str:
    return "not run: " + "; ".join(f"{n}: {why}" for n, why in skipped.items())


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    v = sorted(values)
    mid = len(v) // 2
    return round(v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2, 4)


# --- the real Qwen-Image pipeline (not in CI: needs diffusers and the weights) ------------------

PIPELINE_PROMPT = "A coffee shop entrance with a chalkboard sign that reads 'attnforge', photo"


def pipeline(spec: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Generate ``iters`` images with the local Qwen-Image weights; each must be finite and not
    constant. With ``shim`` the kernels' SDPA shim is on (its routed/fallback counts reported)."""
    import numpy as np
    import torch

    progress("setup import diffusers")
    from diffusers import DiffusionPipeline

    shim = None
    if spec.get("shim"):
        progress("setup attnforge_kernels.sdpa_shim")
        import attnforge_kernels

        shim = attnforge_kernels.sdpa_shim
        shim.enable()
        shim.reset_stats()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    progress("setup load the pipeline from the local cache")
    pipe = DiffusionPipeline.from_pretrained(
        spec["model_dir"], torch_dtype=torch.bfloat16, local_files_only=True
    ).to(device)
    width, height = spec["resolution"]
    times, completed, failure = [], 0, None
    for i in range(1, int(spec["iters"]) + 1):
        progress(f"iter {i} image")
        t0 = time.perf_counter()
        try:
            image = pipe(
                prompt=PIPELINE_PROMPT,
                width=width,
                height=height,
                num_inference_steps=int(spec["steps"]),
                generator=torch.Generator(device=device).manual_seed(i),
                output_type="np",
            ).images[0]
        except Exception as exc:  # noqa: BLE001
            kind = "crash" if is_device_fault(str(exc)) else "error"
            failure = _failure(i, kind, _first_line(exc))
            break
        ms = (time.perf_counter() - t0) * 1000
        arr = np.asarray(image, dtype=np.float32)
        if not np.isfinite(arr).all():
            failure = _failure(i, "nan", "the image has non-finite pixels")
            break
        if float(arr.std()) == 0.0:
            failure = _failure(
                i, "mismatch", "the image is one flat colour (a NaN latent decodes so)"
            )
            break
        times.append(ms)
        completed = i
        progress(f"done {i} {ms:.4f}")
    notes = []
    if shim is not None:
        st = shim.stats()
        notes.append(
            f"shim routed {st['routed']} call(s), fell back {st['fallback']} {st['reasons']}"
        )
    status = "pass" if failure is None else ("crash" if failure["kind"] == "crash" else "fail")
    if shim is not None and status == "pass" and shim.stats()["routed"] == 0:
        status = "unsupported"  # shim on, but every call fell back: no comparison was made
    head = (
        f"{completed} image(s) at {width}x{height}, {spec['steps']} steps, finite and not flat"
        if failure is None
        else f"image {failure['iteration']}: {failure['kind']}: {failure['message']}"
    )
    return {
        "status": status,
        "iters_completed": completed,
        "ms_per_iter": _median(times),
        "first_failure": failure,
        "message": "; ".join([head, *notes]),
    }


def _write_json(value: Any, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(value, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> None:
    watch_parent()
    if argv[:1] == ["--env"]:
        _write_json(env_info(), argv[1])
        os._exit(0)
    func = stress
    if argv[:1] == ["--pipeline"]:
        func, argv = pipeline, argv[1:]
    spec_path, result_path, progress_path = argv
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    progress = Progress(progress_path)
    try:
        result = func(spec, progress)
    except Exception as exc:  # noqa: BLE001 - a failure in set-up is this run's result
        fault = is_device_fault(str(exc))
        result = {
            "status": "crash" if fault else "fail",
            "iters_completed": 0,
            "first_failure": _failure(
                0, "crash" if fault else "error", f"set-up raised {_first_line(exc)}"
            ),
            "message": f"set-up raised {_first_line(exc)}",
            "traceback": traceback.format_exc().splitlines()[-12:],
        }
    _write_json(result, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: after a GPU fault, freeing the device context can hang or abort.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
