"""Checks for the worker pool tests (run as ``file:`` targets; top level is stdlib only).

Each returns the id of the process it ran in, so a test can tell which checks shared a worker.
"""

import ctypes
import os
import sys
import time
import warnings

FLAG = "POOL_TEST_FLAG"


def _pid(extra=None):
    return {"status": "pass", "message": "ok", "details": {"pid": os.getpid(), **(extra or {})}}


def pid(params, ctx):
    return _pid()


def change_state(params, ctx):
    """Everything a careless check might leave behind in a shared worker."""
    import torch

    os.environ[FLAG] = "set by change_state"
    os.environ.pop("POOL_TEST_PRESET", None)
    os.chdir("/")
    warnings.simplefilter("error")
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_math_sdp(False)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.nn.functional.scaled_dot_product_attention = lambda *a, **k: None
    torch.rand(1000)  # moves the random state on
    return _pid()


def observe_state(params, ctx):
    import torch

    return _pid(
        {
            "flag": os.environ.get(FLAG),
            "preset": os.environ.get("POOL_TEST_PRESET"),
            "cwd": os.getcwd(),
            "warnings_error": any(f[0] == "error" for f in warnings.filters),
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
            "dtype": str(torch.get_default_dtype()),
            "grad": torch.is_grad_enabled(),
            "sdpa": torch.nn.functional.scaled_dot_product_attention.__module__,
            "rand": float(torch.rand(1)),
        }
    )


def noisy_fail(params, ctx):
    print(f"noise from {params['tag']}", file=sys.stderr, flush=True)
    raise ValueError(f"failing on purpose ({params['tag']})")


def segfault(params, ctx):
    ctx.progress("dereferencing NULL")
    ctypes.string_at(0)


def hang(params, ctx):
    ctx.progress("sleeping forever")
    while True:
        time.sleep(60)


def gpu_fault_text(params, ctx):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def triton_cache(params, ctx):
    return _pid({"TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR")})


# Warm-up steps (validate/_worker.py warm_up): called with params only, before any check.
WARMED = "POOL_TEST_WARMED"


def warm(params):
    os.environ[WARMED] = str(os.getpid())


def warm_fails(params):
    raise RuntimeError("a warm-up step failing on purpose")


def warmed(params, ctx):
    return _pid({"warmed": os.environ.get(WARMED)})
