"""The native launch path: attnforge_kernels/launch/plans.py's plans replayed from C++, under a C++ autograd node
(attnforge_kernels/launch/replay.cpp; issue 30 §2).

At the small shapes users train, what is left of a ``flash_attn_func`` step's host time after
the Python plans is Python's ``autograd.Function``: the ``.apply`` around a Python forward and
a Python backward on autograd's device thread, 85-100 µs a step for a Function that only
allocates, on an H100 host (docs/history/benchmarks-2026.md, "The training step's host time").
PyTorch's own attention ops make their launches and their autograd node in C++. So does this
module, for the calls the Python path has planned already:

- ``flash_attn_func`` and ``flash_attn_varlen_func`` (without dropout, ALiBi or
  ``return_attn_probs``) first ask :func:`forward`. A call whose key (the tensors' dtypes,
  shapes, strides, devices and 16-byte alignment, the call's values and the process state
  ``launch._process`` reads) has a plan here allocates its outputs, launches the recorded
  kernel and, where a gradient will be asked for, gets a C++ node; any other call gets None and
  takes the Python path, which records the plan and hands it here (:func:`put_forward`).
- The node's backward replays the backward plan its forward's plan holds for dO's layout. One
  it does not hold goes back to Python (the backward registered with :func:`on_python_backward`,
  under the GIL), which records it and
  hands it here (:func:`put_backward`); so does a backward whose saved inputs' data moved.
- ``flash_attn_with_kvcache`` steps on a contiguous cache first ask :func:`kv`: the cache
  update's launch (new keys, rotary) and the attention's, from the plan
  attnforge_kernels/api/kvcache.py recorded for a step with the same key and handed over
  (:func:`put_kv`).
- Every decision stays Python's: a plan is what the Python path launched, with the same
  parameters, for a call with the same key. Launches whose parameters a replay cannot rebuild
  (Hopper's Gluon kernels with host-side TMA descriptors, cluster launches, profiling scratch)
  are not handed over, and their calls keep the Python path.

The extension is compiled once per source, torch, Python and compiler, into
``$ATTNFORGE_NATIVE_DIR`` (default ``~/.cache/attnforge/native``), with the host's C++
compiler (``$CXX``, else ``c++``) against the installed torch's headers (C++20, as torch 2.13's
need), by
``python -m attnforge_kernels.native build`` (an image's build step runs the build,
attnforge_kernels/launch/native_build.py, as a file) or at the first planned call,
which says so on stderr. No compiler, a failed build, ``ATTNFORGE_NATIVE=0``, the CPU interpreter or
a Triton other than 3.6: the Python path, as before; ``python -m attnforge_kernels.native status``
says which and why.

Unverified on AMD: the ROCm launch (``hipModuleLaunchKernel``, Triton 3.6's AMD launcher's
parameters) follows triton's third_party/amd/backend/driver.py; no AMD GPU ran it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

from ..device import configs
from . import plans as launch
from .native_build import SOURCE, build, cache_dir  # noqa: F401 - the loader's public names
from .native_build import main as build_main

_ENV = "ATTNFORGE_NATIVE"

_mod = None  # the loaded extension, once active
_python_backward = None  # on_python_backward's function
_loaded = None  # the extension once loaded, whether calls use it now or not (set_active)
_state: str | None = None  # None: not tried; "active"; else why the Python path is used
_PLANS: dict[int, object] = {}  # Python PyForwardPlan by native plan id (for the backward)


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _activate() -> None:
    """Load (building where needed) and initialise the extension once a process; on any failure
    note why and keep the Python path."""
    global _mod, _loaded, _state
    if os.environ.get(_ENV) == "0":
        _state = f"off ({_ENV}=0)"
        return
    if not launch.ENABLED:
        _state = "off (the CPU interpreter, or a Triton without launch plans)"
        return
    if not torch.cuda.is_available():
        _state = "off (no CUDA or ROCm device)"
        return
    try:
        mod = load(build())
        mod.init(hip=configs.is_hip())
        # The stream the node launches on is the one torch (and Triton) would use.
        probe = torch.empty(0, device="cuda")
        if mod.stream_of(probe) != torch.cuda.current_stream().cuda_stream:
            raise RuntimeError("c10's native stream handle differs from torch.cuda's")
        mod.set_fallback(_fallback)
    except Exception as err:  # noqa: BLE001 - any failure keeps the Python path
        _state = f"unavailable: {err}"
        return
    _mod = _loaded = mod
    _state = "active"


def set_active(on: bool) -> None:
    """Calls use the loaded extension (``on``) or take the Python path, in this process: a
    benchmark compares both (tools/step_probe.py). Nothing changes where it never loaded."""
    global _mod
    _mod = _loaded if on else None


def status() -> str:
    """'active', or why calls take the Python path (activating first where not tried)."""
    if _state is None:
        _activate()
    return _state


def _activated(q) -> bool:
    """Whether the extension is active, activating it at the first call on a GPU tensor."""
    if _state is not None or not q.is_cuda:
        return False
    _activate()
    return _mod is not None


def forward(q, k, v, call: tuple):
    """``out`` of a planned flash_attn call (with a C++ autograd node where a gradient will be
    asked for), or None: no plan here (the Python path records one), or the native path is off.
    ``call``: attnforge_kernels/api/flash_attn.py's tuple (cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi,
    varlen, drop)."""
    if _mod is None and not _activated(q):
        return None
    cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop = call
    if alibi is not None or drop is not None or not launch.ENABLED:
        return None
    token = launch.process_token()
    if token is None:
        return None
    return _mod.flash(
        q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask.left, mask.right, mask.softcap,
        varlen, token,
    )  # fmt: skip


def put_forward(pyplan, q, k, v, cu_q, cu_k, values: tuple, out, lse) -> None:
    """Hand a Python forward plan (attnforge_kernels/api/flash_attn.py's ``PyForwardPlan``; FP8, the
    only call with an output dtype of its own, is never planned) over, under the key :func:`forward`
    computes for the same call, unless it was handed over already or the extension is not
    active (then a later replay may hand it over); ``pyplan.native`` becomes the native plan,
    or False where its launch cannot be replayed here."""
    if pyplan.native is not None or _mod is None:
        return
    desc = pyplan.launch.native
    token = launch.process_token()
    if desc is None or token is None:
        pyplan.native = False
        return
    max_q, max_k, batch, scale, mask, varlen = values
    plan = _mod.put_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask.left, mask.right, mask.softcap,
        varlen, token, desc, out, lse,
    )  # fmt: skip
    if len(_PLANS) >= 2 * launch.MAX_PLANS:
        _PLANS.clear()
    _PLANS[plan.id] = pyplan
    pyplan.native = plan


def put_backward(native_plan, launches: tuple | None, do, q, k, v, out, lse) -> None:
    """Hand a backward plan's launches (``launch.Launch``) over to its forward's native plan,
    keyed by dO's layout. None (no plan), or launches a replay cannot rebuild, are handed over
    as None: that key's calls go back to Python each time."""
    descs = None if launches is None else [x.native for x in launches]
    _mod.put_backward(
        native_plan, do, q, k, v, out, lse, None if descs is None or None in descs else descs
    )


def kv(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
       cache_leftpad, softmax_scale, causal, window_size, softcap, rotary_interleaved,
       num_splits, return_softmax_lse):  # fmt: skip
    """A planned ``flash_attn_with_kvcache`` step on a contiguous cache (the caller passes no
    block table, and lengths as a tensor or None): out, or (out, LSE); None where this step has
    no plan here (the Python path then hands one over) or the native path is off."""
    if _mod is None and not _activated(q):
        return None
    token = launch.process_token()
    if token is None:
        return None
    try:
        return _mod.kv(*_step(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, softmax_scale, causal, window_size, softcap, rotary_interleaved,
            num_splits, return_softmax_lse,
        ), token)  # fmt: skip
    except (TypeError, ValueError):
        return None  # arguments of other types: Python's path says what is wrong, or plans


def _step(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
          cache_leftpad, softmax_scale, causal, window_size, softcap, rotary_interleaved,
          num_splits, return_softmax_lse) -> tuple:  # fmt: skip
    """A decoding step's arguments as native.cpp's ``kv`` and ``put_kv`` take them (the window
    as two ints, softcap None as 0); TypeError or ValueError for values of other types."""
    left, right = window_size
    return (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, softmax_scale, bool(causal), int(left), int(right),
            float(softcap or 0.0), bool(rotary_interleaved), num_splits,
            bool(return_softmax_lse))  # fmt: skip


def put_kv(pyplan, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
           cache_batch_idx, cache_leftpad, softmax_scale, causal, window_size, softcap,
           rotary_interleaved, num_splits, return_softmax_lse) -> None:  # fmt: skip
    """Hand a Python decoding plan (attnforge_kernels/api/kvcache.py's ``KVPlan``) over under the
    key :func:`kv` computes for the same step, once; ``pyplan.native`` becomes True, or False where
    a replay here could not pass the kernels the tensors Python passes."""
    if pyplan.native is not None or _mod is None:
        return
    desc = pyplan.launch.native
    append = pyplan.append.native if pyplan.append is not None else None
    token = launch.process_token()
    ok = False
    if desc is not None and token is not None and (pyplan.append is None or append is not None):
        call = pyplan.call
        splits, tiles, tile_rows, tile_elems = pyplan.scratch or (0, 0, 0, 0)
        lse_shape = [call.batch, q.shape[2], call.seqlen_q] if call.lse else []
        try:
            step = _step(
                q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                cache_batch_idx, cache_leftpad, softmax_scale, causal, window_size, softcap,
                rotary_interleaved, num_splits, return_softmax_lse,
            )  # fmt: skip
            ok = _mod.put_kv(*step, token, append, desc, list(q.shape), lse_shape,
                             splits * tiles * (tile_elems + tile_rows), tiles,
                             call.seqlen_cache)  # fmt: skip
        except (TypeError, ValueError):
            ok = False
    pyplan.native = ok


def counts() -> tuple[int, int, int, int]:
    """(forwards replayed, backwards replayed, backwards sent back to Python, decoding steps
    replayed) since the last call; zeros where the extension is not active."""
    return _mod.counts() if _mod is not None else (0, 0, 0, 0)


def clear() -> None:
    """Forget every native plan (with launch.clear and when Python's forward table fills)."""
    if _mod is not None:
        _mod.clear()
    _PLANS.clear()


launch.FORWARD.on_clear = clear


def on_python_backward(fn) -> None:
    """Register the Python backward a native node falls back to where it has no plan for dO's
    layout (attnforge_kernels/api/flash_attn.py registers ``native_fallback`` when it loads): this
    module never imports the API, which imports it."""
    global _python_backward
    _python_backward = fn


def python_plan(plan_id: int):
    """The Python forward plan handed over with native plan ``plan_id``, or None."""
    return _PLANS.get(plan_id)


def _fallback(*args):
    """What the extension calls without a plan (set at activation): the registered backward."""
    if _python_backward is None:
        raise RuntimeError(
            "no Python backward registered (import attnforge_kernels.api.flash_attn)"
        )
    return _python_backward(*args)


def main(argv: list[str] | None = None) -> int:
    """``python -m attnforge_kernels.native build|status``."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m attnforge_kernels.native",
        description="Build or check attnforge's native launch path (attnforge_kernels/launch/replay.cpp).",
    )
    ap.add_argument("action", choices=["build", "status"],
                    help="build: compile it into the cache now (an image's build step); status: "
                         "whether calls use it, and why not")  # fmt: skip
    args = ap.parse_args(argv)
    if args.action == "build":
        return build_main("attnforge_kernels.native")
    state = status()
    print(state)
    return 0 if state == "active" else 1
