"""Child side of the checks.

``python -m validate._worker SPEC RESULT PROGRESS`` runs one check and exits (``--isolate``).
``python -m validate._worker --serve REQUEST_FD REPLY_FD`` is a long-lived worker of the pool
(validate/pool.py): it imports torch once, then reads one JSON request a line from REQUEST_FD
(``{"seq", "spec", "result", "progress"}``), runs the check, writes its result file and answers
``done SEQ`` on REPLY_FD. Before each check it puts back the process-wide state a check may
have changed (environment variables, SDPA backend flags, ...); after each check it synchronizes
the device, so an asynchronous fault is charged to the check that launched it; after a crash or
a device fault it exits, since the device context is no longer trustworthy.

A Python exception becomes ``fail`` (or ``crash`` when its text reports a GPU fault); a signal
or a hang is seen by the parent, which never gets a result then.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

# PRELUDE_ENV: a testing hook, a Python file run in every check process before its first check
# (for example to call torch.backends.cuda.enable_flash_sdp(False)). Not part of the user
# interface. A worker with one starts as a process of its own (validate/forkserver.py).
from validate.forkserver import PRELUDE_ENV
from validate.runner import is_device_fault, watch_parent


class Context:
    """What a check function gets besides its params."""

    def __init__(self, progress_path: str, quick: bool):
        self._progress_path = progress_path
        self.quick = quick

    def progress(self, stage: str) -> None:
        """Record what the check is doing now, so a crash can say where it happened."""
        with open(self._progress_path, "a", encoding="utf-8") as fh:
            fh.write(stage.replace("\n", " ") + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def resolve(target: str) -> Callable[..., dict[str, Any]]:
    """``pkg.mod:func`` or ``file:/path/to/mod.py:func`` -> the function."""
    if target.startswith("file:"):
        path, _, func = target[len("file:") :].rpartition(":")
        spec = importlib.util.spec_from_file_location(Path(path).stem + "_extra_checks", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load checks from {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        modname, _, func = target.partition(":")
        module = importlib.import_module(modname)
    return getattr(module, func)


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        return value
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def _error_result(exc: BaseException) -> dict[str, Any]:
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    fault = is_device_fault(text)
    return {
        "status": "crash" if fault else "fail",
        "message": ("GPU fault: " if fault else "raised ") + first[:500],
        "details": {"traceback": traceback.format_exc().splitlines()[-15:]},
    }


def run_prelude() -> None:
    prelude = os.environ.get(PRELUDE_ENV)
    if prelude:
        exec(compile(Path(prelude).read_text(), prelude, "exec"), {"__name__": "__prelude__"})


def run(spec: dict[str, Any], progress_path: str, prelude: bool = True) -> dict[str, Any]:
    """Call the check named by ``spec['target']``; anything it raises is its result."""
    ctx = Context(progress_path, bool(spec.get("quick")))
    try:
        if prelude:
            run_prelude()
        func = resolve(spec["target"])
        result = func(spec.get("params", {}), ctx)
        if not isinstance(result, dict) or "status" not in result:
            return {
                "status": "fail",
                "message": f"check returned {type(result).__name__}, not a result dict",
            }
        return result
    except BaseException as exc:  # noqa: BLE001 - anything a check raises is its result
        if isinstance(exc, KeyboardInterrupt):
            raise
        return _error_result(exc)


def device_error() -> str | None:
    """After a check: the device error it left behind, or None.

    Kernels run asynchronously, and a failed launch may only leave an error in the runtime's
    last-error slot; either surfaces at the next synchronize or launch, which in a shared
    worker would belong to the next check. A synchronize, one tiny kernel and another
    synchronize here charge it to the check that launched it. Only where the check itself
    initialized the device: this never creates a device context.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            return None
        cuda.synchronize()
        one = torch.ones(1, device="cuda")
        one.add_(1)
        cuda.synchronize()
        if float(one.item()) != 2.0:
            return "a one-element add after the check gave a wrong result (the device state is corrupt)"
    except Exception as exc:  # noqa: BLE001 - any error here is the device's
        return f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:400]
    return None


def settle(result: dict[str, Any]) -> dict[str, Any]:
    """The check's result, turned into a crash when the device reports a fault after it."""
    err = device_error()
    if err is None or result.get("status") == "crash":
        return result
    details = dict(result.get("details") or {})
    details["result_before_device_check"] = {
        "status": result.get("status"),
        "message": result.get("message"),
    }
    return {
        **result,
        "status": "crash",
        "message": f"GPU fault after the check returned (found by the end-of-check "
        f"synchronize, so charged to this check): {err}",
        "details": details,
    }


def poisoned(result: dict[str, Any]) -> bool:
    """Whether the process must not run another check after this result."""
    return result.get("status") == "crash" or is_device_fault(str(result.get("message", "")))


def write_result(result: dict[str, Any], result_path: str) -> None:
    tmp = result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(_json_safe(result), fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, result_path)


# --- process-wide state a check may change, put back before the next check -------------

# (getter, setter) names on torch.backends.cuda: SDPA backend switches, as sdpa_kernel and
# enable_*_sdp change them.
_SDPA_FLAGS = (
    ("flash_sdp_enabled", "enable_flash_sdp"),
    ("mem_efficient_sdp_enabled", "enable_mem_efficient_sdp"),
    ("math_sdp_enabled", "enable_math_sdp"),
    ("cudnn_sdp_enabled", "enable_cudnn_sdp"),
    ("fp16_bf16_reduction_math_sdp_allowed", "allow_fp16_bf16_reduction_math_sdp"),
)


_Setting = tuple[str, Callable[[], Any], Callable[[Any], None]]


def _torch_state(torch) -> list[_Setting]:
    """(name, read, write) for the torch settings a check may switch process-wide."""
    out: list[_Setting] = []
    bc = torch.backends.cuda
    for getter, setter in _SDPA_FLAGS:
        if hasattr(bc, getter) and hasattr(bc, setter):
            out.append((setter, getattr(bc, getter), getattr(bc, setter)))
    # Not preferred_rocm_fa_library: its getter may state a warn-once reason, which the check
    # that reads it (sdpa.rocm) must see first; that check runs alone and puts it back itself.
    for getter, setter in (
        ("get_default_dtype", "set_default_dtype"),
        ("is_grad_enabled", "set_grad_enabled"),
        ("are_deterministic_algorithms_enabled", "use_deterministic_algorithms"),
        ("get_float32_matmul_precision", "set_float32_matmul_precision"),
        ("get_num_threads", "set_num_threads"),
    ):
        if hasattr(torch, getter) and hasattr(torch, setter):
            out.append((setter, getattr(torch, getter), getattr(torch, setter)))
    for obj, name in (
        (bc.matmul, "torch.backends.cuda.matmul.allow_tf32"),
        (torch.backends.cudnn, "torch.backends.cudnn.allow_tf32"),
        (torch.backends.cudnn, "torch.backends.cudnn.enabled"),
        (torch.backends.cudnn, "torch.backends.cudnn.benchmark"),
        (torch.backends.cudnn, "torch.backends.cudnn.deterministic"),
    ):
        attr = name.rpartition(".")[2]
        out.append(
            (name, lambda o=obj, a=attr: getattr(o, a), lambda v, o=obj, a=attr: setattr(o, a, v))
        )
    functional = torch.nn.functional
    out.append(
        (
            "torch.nn.functional.scaled_dot_product_attention",
            lambda: functional.scaled_dot_product_attention,
            lambda f: setattr(functional, "scaled_dot_product_attention", f),
        )
    )
    return out


class StateGuard:
    """Process-wide state as it was when the worker became ready, put back before each check.

    Environment variables, the working directory, warning filters, and where torch is loaded:
    SDPA backend flags, default dtype, grad mode,
    determinism, TF32 and cuDNN switches, the thread count, ``F.scaled_dot_product_attention``
    itself (a shim may replace it) and the random state (reseeded with the worker's own seed, so
    no check depends on what the one before it drew). Only values that differ are written back, so a clean check costs nothing
    and sets off no deprecation warning. What cannot be put back (a module imported with other
    variables set, C++ warn-once messages already shown) is why some checks ask for a worker of
    their own (``isolate``).
    """

    def __init__(self) -> None:
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.filters = list(warnings.filters)
        self.torch_settings: list[tuple[str, Callable[[Any], None], Callable[[], Any], Any]] = []
        self.seed: int | None = None
        torch = sys.modules.get("torch")
        if torch is not None:
            for name, read, write in _safe_settings(torch):
                try:
                    self.torch_settings.append((name, write, read, read()))
                except Exception:  # noqa: BLE001, S112 - a setting this torch lacks stays alone
                    continue
            try:
                self.seed = int(torch.initial_seed())
            except Exception:  # noqa: BLE001
                self.seed = None

    def restore(self) -> list[str]:
        """Put the state back; returns what had to be restored (for tests and debugging)."""
        changed: list[str] = []
        for key in [k for k in os.environ if k not in self.environ]:
            del os.environ[key]
            changed.append(f"env {key}")
        for key, value in self.environ.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
                changed.append(f"env {key}")
        if os.getcwd() != self.cwd:
            os.chdir(self.cwd)
            changed.append("cwd")
        if warnings.filters != self.filters:
            warnings.filters[:] = self.filters
            changed.append("warning filters")
        for name, write, read, value in self.torch_settings:
            try:
                if read() is not value and read() != value:
                    write(value)
                    changed.append(name)
            except Exception:  # noqa: BLE001, S112 - best effort; a broken setter stays broken
                continue
        torch = sys.modules.get("torch")
        if torch is not None and self.seed is not None:
            try:
                torch.manual_seed(self.seed)  # CPU now, CUDA lazily: no check inherits a draw
            except Exception:  # noqa: BLE001
                pass
        return changed


def _safe_settings(torch) -> list[_Setting]:
    try:
        return _torch_state(torch)
    except Exception:  # noqa: BLE001 - an odd torch build: guard what can be guarded
        return []


def _preload() -> None:
    """Import torch once for all the checks this worker will run (the cost the pool saves).
    An import that fails is left to the checks, which report it as their result."""
    try:
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001, S110
        pass


def warm_up(steps: list[dict[str, Any]]) -> str | None:
    """Run a worker's warm-up steps (``{"target", "params"}``: imports and first-use costs of the
    checks it will get, validate/suite.py ``warm_up``) before its first check arrives. A step
    that raises is only noted on stderr: the check that needs the same thing meets the error
    and reports it as its result. Returns the device error a step left behind, or None."""
    for step in steps:
        try:
            resolve(step["target"])(step.get("params") or {})
        except Exception as exc:  # noqa: BLE001 - the check reports it, see above
            first = (f"{type(exc).__name__}: {exc}".strip().splitlines() or ["?"])[0]
            print(f"validate: warm-up {step['target']} raised {first[:300]}", file=sys.stderr)
    return device_error()


def serve(request_fd: int, reply_fd: int) -> None:
    os.set_inheritable(request_fd, False)
    os.set_inheritable(reply_fd, False)
    requests = os.fdopen(request_fd, "r", encoding="utf-8")
    replies = os.fdopen(reply_fd, "w", encoding="utf-8", buffering=1)
    prelude_error: dict[str, Any] | None = None
    try:
        run_prelude()
    except Exception as exc:  # noqa: BLE001 - every check of this worker reports it
        prelude_error = _error_result(exc)
        prelude_error["message"] += f" (in {PRELUDE_ENV})"
    _preload()
    guard = StateGuard()
    replies.write("ready\n")
    for line in requests:
        if not line.strip():
            continue
        req = json.loads(line)
        if "warm_up" in req:
            # Sent right after the worker starts, before its first check; no reply.
            if prelude_error is None:
                err = warm_up(req["warm_up"])
                sys.stderr.flush()
                if err is not None:
                    print(f"validate: GPU error after the worker's warm-up: {err}", file=sys.stderr)
                    sys.stderr.flush()
                    os._exit(3)  # its first check reports the crash: never a poisoned context
                guard = StateGuard()  # what the warm-up set (TRITON_INTERPRET, ...) stays
            continue
        guard.restore()
        if prelude_error is not None:
            result = dict(prelude_error)
        else:
            result = settle(run(req["spec"], req["progress"], prelude=False))
        write_result(result, req["result"])
        sys.stdout.flush()
        sys.stderr.flush()
        replies.write(f"done {req['seq']}\n")
        if poisoned(result):
            break
    # Skip interpreter teardown: after a GPU fault, freeing the device context can hang or
    # abort, and every result is already safe on disk.
    os._exit(0)


def main(argv: list[str]) -> None:
    watch_parent()
    if argv[:1] == ["--serve"]:
        serve(int(argv[1]), int(argv[2]))
        return
    spec_path, result_path, progress_path = argv
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    write_result(settle(run(spec, progress_path)), result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
