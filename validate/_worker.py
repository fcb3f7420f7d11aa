"""Child side of one isolated check: ``python -m validate._worker SPEC RESULT PROGRESS``.

Calls the check function named by the spec's ``target`` and writes its result as JSON.
A Python exception becomes ``fail`` (or ``crash`` when its text reports a GPU fault); a
signal or a hang is seen by the parent, which never gets a result file then.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from validate.runner import is_device_fault

# Testing hook: a Python file run in every check process before the check (for example
# to call torch.backends.cuda.enable_flash_sdp(False)). Not part of the user interface.
PRELUDE_ENV = "VALIDATE_PRELUDE"


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


def run(spec: dict[str, Any], progress_path: str) -> dict[str, Any]:
    ctx = Context(progress_path, bool(spec.get("quick")))
    try:
        prelude = os.environ.get(PRELUDE_ENV)
        if prelude:
            exec(compile(Path(prelude).read_text(), prelude, "exec"), {"__name__": "__prelude__"})
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
        text = f"{type(exc).__name__}: {exc}".strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        fault = is_device_fault(text)
        return {
            "status": "crash" if fault else "fail",
            "message": ("GPU fault: " if fault else "raised ") + first[:500],
            "details": {"traceback": traceback.format_exc().splitlines()[-15:]},
        }


def main(argv: list[str]) -> None:
    spec_path, result_path, progress_path = argv
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    result = _json_safe(run(spec, progress_path))
    tmp = result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: after a GPU fault, freeing the device context can hang or
    # abort, and the result is already safe on disk.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
