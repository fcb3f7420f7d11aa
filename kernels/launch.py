"""A cached launch path for the jit kernels: Triton's specialisation work once per call signature.

``fn[grid](*args, **kwargs)`` spends tens of microseconds of host time per launch in Triton's
Python launcher (binding the arguments, specialising each one, the cache key, launch metadata)
before the C launcher runs; the small shapes diffusion and LLM users run are bound by that (an
H100 measured 60-90 µs per launch under cProfile, four launches per training step;
docs/benchmarks.md, issue 30). :func:`run` keys the compiled kernel by what Triton specialises on
(each tensor's dtype and 16-byte alignment, each integer's value class: 1, a multiple of 16, the
32-bit range; constexprs and launch options) and, on a hit, calls the compiled kernel's C launcher
directly with the same arguments Triton would pass it. A miss, the interpreter, a launch hook
(profilers) or a Triton whose launcher is not the one this was written against (3.6) take
Triton's own path, and so does every launch with ``ATTNFORGE_KERNELS_LAUNCH_CACHE=0``.
"""

from __future__ import annotations

import os

import torch
import triton

from . import configs

# The launcher call below is JITFunction.run's in triton 3.6 (triton/runtime/jit.py): other
# versions take Triton's own path until checked.
_CHECKED = ("3.6",)
ENABLED = (
    os.environ.get("ATTNFORGE_KERNELS_LAUNCH_CACHE", "1") != "0"
    and not configs.INTERPRET
    and triton.__version__.startswith(_CHECKED)
    and hasattr(getattr(triton, "knobs", None), "runtime")
)

_cache: dict = {}


def _spec(a):
    """What Triton's specialisation reads of one runtime argument."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool) or a is None:
        return a
    if isinstance(a, int):
        return (a == 1, a % 16 == 0, -(2**31) <= a < 2**31, 0 <= a < 2**63)
    if isinstance(a, float):
        return float
    return a  # anything else (constexpr-like objects) keys by value


def _tail(fn, n_args: int, kwargs: dict) -> tuple:
    """The values Triton binds to the parameters after the positional ones, in order: the
    keyword arguments (constexprs), else the parameter's default."""
    return tuple(kwargs[p.name] if p.name in kwargs else p.default for p in fn.params[n_args:])


def run(fn, grid, *args, **kwargs):
    """``fn[grid](*args, **kwargs)``: runtime arguments positional, constexprs and Triton's launch
    options (num_warps, ...) as keywords."""
    if not ENABLED:
        return fn[grid](*args, **kwargs)
    knobs = triton.knobs.runtime
    if knobs.launch_enter_hook is not None or knobs.launch_exit_hook is not None:
        return fn[grid](*args, **kwargs)
    driver = triton.runtime.driver.active
    device = driver.get_current_device()
    key = (fn, device, tuple(map(_spec, args)), tuple(kwargs.items()))
    hit = _cache.get(key)
    if hit is None:
        kernel = fn[grid](*args, **kwargs)
        if kernel is not None and not hasattr(kernel, "result"):  # no asynchronous compile
            _cache[key] = (kernel, _tail(fn, len(args), kwargs))
        return kernel
    kernel, tail = hit
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    kernel.run(grid[0], g1, g2, driver.get_current_stream(device), kernel.function,
               kernel.packed_metadata, None, None, None, *args, *tail)  # fmt: skip
    return kernel
