"""Per-call plans for the attention forward's and backward's Triton launches (issue 30 §2).

At the small shapes diffusion and LLM users run, a call is bound by host time: on an H100 host
one tiny forward took 68-70 µs, of which 29-31 µs were Triton's launch path (binding and
specialising the kernel's 55 parameters, 11-12 µs; its cache key, launch metadata and hooks;
a 6 µs C launch) and most of the rest our own Python deriving configs, strides and flags
(docs/history/benchmarks-2026.md, "Launch plans: a call's host time taken apart").

A plan is what one call through the full path launched, keyed by everything that call's
decisions read: the device, each input's dtype, shape, strides, device and data pointer modulo
16, the integer and float arguments as values, the mask, the config override and the Triton
knobs that change a compile (``debug``, ``instrumentation_mode``). A later call with the same
key would make every decision the same way and give Triton the same arguments, so it allocates
the outputs and calls the compiled kernel's launcher directly (the call ``JITFunction.run``
ends in, Triton 3.6). Because the key holds exact values, any argument whose specialisation
(``== 1``, a multiple of 16, 32 or 64 bits, pointer alignment, AMD's 2 GiB buffer range) could
differ misses the plan: a new shape or sequence length takes the full path once and adds a
plan. The fresh outputs a replay passes are checked 16-byte aligned, as they were recorded.

Not planned, always the full path: the CPU interpreter, a Triton other than 3.6, dropout,
ALiBi, FP8, autotuning, paths that are not exactly the planned kernels (atomic dQ, strided
head dims copied contiguous), and any call while a launch hook is set (profilers). The
forward's plan holds its one launch, Triton's or Hopper's Gluon forward; the backward's its dQ
launch and its dK/dV launch, Triton's or Hopper's Gluon kernel. A backward whose forward was
planned keys its plan in that forward plan's own table by what it adds to the forward's key
(:func:`backward_key`); others use ``BACKWARD`` with a key of all their tensors.
"""

from __future__ import annotations

import os
from operator import itemgetter

import torch
import triton

from ..device import configs
from .params import launch_params

# JITFunction.run's launcher call and the binder are Triton 3.6's (triton/runtime/jit.py,
# CompiledKernel.run in triton/compiler/compiler.py); other versions take the full path.
ENABLED = not configs.INTERPRET and triton.__version__.startswith("3.6")
# ROCm's keys add Triton's buffer-op facts; a process constant, as the build of torch is.
_HIP = configs.is_hip()

MAX_PLANS = 256  # per kind; a full table is emptied (new shapes rebuild their plans)
_INT32 = 2**31 - 1


class Table:
    """Plans by key, bounded (``limit``: MAX_PLANS where not given). ``on_clear``: called when the
    table empties itself or is cleared (FORWARD's: attnforge_kernels/launch/replay.py's plans go
    with it)."""

    __slots__ = ("plans", "limit", "on_clear")

    def __init__(self, limit: int | None = None):
        self.plans: dict = {}
        self.limit = limit
        self.on_clear = None

    def get(self, key):
        return self.plans.get(key)

    def put(self, key, plan) -> None:
        """``plan``: a plan, or False for a key whose calls cannot be replayed (the same key
        makes the same decisions, so none of its calls can)."""
        if len(self.plans) >= (self.limit or MAX_PLANS):
            self.clear()
        self.plans[key] = plan

    def clear(self) -> None:
        self.plans.clear()
        if self.on_clear is not None:
            self.on_clear()


FORWARD = Table()
BACKWARD = Table()
KVCACHE = Table()  # flash_attn_with_kvcache's (attnforge_kernels/api/kvcache.py)


def clear() -> None:
    """Forget every plan (tests; the next calls take the full path once)."""
    FORWARD.clear()
    BACKWARD.clear()
    KVCACHE.clear()


def hooks_set() -> bool:
    """Whether a launch hook is registered (profilers): then every launch goes through Triton."""
    rt = triton.knobs.runtime
    return bool(rt.launch_enter_hook.calls or rt.launch_exit_hook.calls)


def tensor_key(t: torch.Tensor) -> tuple:
    """What a call's decisions and Triton's specialisation read of one input tensor."""
    return (t.dtype, t.shape, t.stride(), t.get_device(), t.data_ptr() % 16)


def _storage_key(t: torch.Tensor) -> bool:
    """AMD: Triton's buffer-load specialisation (storage within 2 GiB; backends/amd/compiler.py
    ``is_within_2gb``), the same bound as ``configs.MAX_BUFFER_BYTES``."""
    return t.untyped_storage().nbytes() <= _INT32


def _process() -> tuple | None:
    """What every plan key reads of the process: the current device, the config override,
    Triton's compile knobs (``debug``, ``instrumentation_mode``) and, on ROCm, its buffer-ops
    switch. None where no call is to be planned: autotuning, or a launch hook set (profilers)."""
    if os.environ.get("ATTNFORGE_KERNELS_AUTOTUNE") == "1" or hooks_set():
        return None
    process = (
        torch.cuda.current_device(),
        os.environ.get("ATTNFORGE_KERNELS_CONFIG"),
        triton.knobs.runtime.debug,
        triton.knobs.compilation.instrumentation_mode,
    )
    if _HIP:
        process += (triton.knobs.amd.use_buffer_ops,)
    return process


_TOKENS: dict = {}


def process_token() -> int | None:
    """:func:`_process` as a small int (the same state, the same int, within a process), for
    attnforge_kernels/launch/replay.py's keys; None where nothing is to be planned."""
    process = _process()
    if process is None:
        return None
    token = _TOKENS.get(process)
    if token is None:
        token = _TOKENS[process] = len(_TOKENS) + 1
    return token


def call_key(kind: str, tensors: tuple, values: tuple):
    """The key of one call: ``tensors`` (None allowed), ``values`` (hashable scalars and frozen
    dataclasses). None when the call is not to be planned (autotuning, hooks, not tensors)."""
    try:
        process = _process()
        if process is None:
            return None
        key = (
            kind,
            *process,
            *(None if t is None else tensor_key(t) for t in tensors),
            *values,
        )
        if _HIP:
            key += tuple(None if t is None else _storage_key(t) for t in tensors)
    except (AttributeError, TypeError, RuntimeError):
        return None  # not tensors: the full path reports what is wrong
    # The same tensor passed twice (q is k): a plan maps its pointer parameters to the call's
    # tensors by position, so which positions share one object is part of the key.
    ids = [id(t) for t in tensors if t is not None]
    if len(set(ids)) != len(ids):
        key += (tuple(ids.index(i) for i in ids),)
    return key


def backward_key(do: torch.Tensor, q, k, v, out, lse):
    """The key of a backward call whose forward was planned (its plan's ``backward`` table):
    what the backward reads beyond the forward's key. The saved q, k, v, cu_seqlens and the
    call's values are the forward's: autograd refuses a saved tensor modified in place, which
    metadata changes such as ``transpose_`` count as, and the caller checks that the inputs'
    data pointers are the forward's (a replaced ``.data``: :func:`pointers`). ``out`` and the
    LSE were allocated from shapes the forward's key fixed. So the key holds dO's
    :func:`tensor_key` (and on ROCm its 2 GiB bit), the output's and LSE's pointer alignment,
    which input dO is, and what every key reads of the process (:func:`_process`): 4-8 µs with
    the pointer check, against 7-13 for the eight-tensor key, on an H100 host.
    None where nothing is to be planned, as in :func:`call_key`."""
    try:
        process = _process()
        if process is None:
            return None
        key = (
            *process,
            tensor_key(do),
            out.data_ptr() % 16,
            lse.data_ptr() % 16,
            do is q,
            do is k,
            do is v,
            do is out,
        )
        if _HIP:
            key += (_storage_key(do),)
    except (AttributeError, TypeError, RuntimeError):
        return None
    return key


def pointers(*tensors) -> tuple:
    """The data pointers of ``tensors`` (0 for None): a planned forward's inputs, compared again
    at its backward (``interface.saved_plan``)."""
    return tuple(0 if t is None else t.data_ptr() for t in tensors)


def find(table: Table, key):
    """(key, plan) for a call's key: plan is the recorded one or None; key becomes None where
    no plan is to be recorded (an earlier call of this key could not be replayed, or the key
    holds an unhashable value)."""
    if key is None:
        return None, None
    try:
        plan = table.plans.get(key)
    except TypeError:
        return None, None
    if plan is False:
        return None, None
    return key, plan


class Launch:
    """One recorded launch: the compiled kernel and every bound argument but the tensors, which
    a hit takes from its own call (``sources``: indices into the call's tensors, in the
    kernel's leading pointer parameters)."""

    __slots__ = ("run", "grid", "function", "meta", "pick", "rest", "scratch", "native")

    def __init__(self, kernel, grid, sources: tuple, rest: tuple, native: tuple | None = None):
        self.run = kernel.run
        self.function = kernel.function
        self.meta = kernel.packed_metadata
        self.grid = grid
        self.pick = itemgetter(*sources) if len(sources) > 1 else lambda t: (t[sources[0]],)
        self.rest = rest
        self.scratch = getattr(self.run, "global_scratch_size", 0) > 0
        # attnforge_kernels/launch/replay.cpp's description of this launch, or None where it cannot
        # replay it.
        self.native = native

    def __call__(self, stream, tensors: tuple) -> None:
        picked = self.pick(tensors)
        self.run(*self.grid, stream, self.function, self.meta, None, None, None, *picked,
                 *self.rest)  # fmt: skip


def sources_of(values: tuple, tensors: tuple):
    """(sources, rest) when ``values`` (a launch's bound arguments in parameter order) start
    with tensors that are all among ``tensors`` (by identity) and hold no other tensor; else
    None (the launch passed something a later call would not have: a copy, a slopes tensor).
    A None among the leading pointers (a pointer the launch does not use, which Triton makes a
    constexpr) is taken from a position of ``tensors`` that holds None, where one does."""
    ids: dict = {}
    for i, t in enumerate(tensors):
        ids.setdefault(id(t), i)
    n = 0
    while n < len(values) and (
        isinstance(values[n], torch.Tensor) or (values[n] is None and id(None) in ids)
    ):
        n += 1
    if n == 0 or any(isinstance(x, torch.Tensor) for x in values[n:]):
        return None
    sources = tuple(ids.get(id(x)) for x in values[:n])
    if None in sources:
        return None
    return sources, tuple(values[n:])


def recording(fn, into: list | None):
    """``fn``, or where ``into`` is a list, ``fn`` with each ``[grid](*args, **kwargs)`` launch
    noted there with the compiled kernel it returned (for :func:`record`)."""
    if into is None:
        return fn
    return Noting(fn, into)


class Noting:
    __slots__ = ("fn", "into")

    def __init__(self, fn, into: list):
        self.fn, self.into = fn, into

    def __getitem__(self, grid):
        def go(*args, **kwargs):
            kernel = self.fn[grid](*args, **kwargs)
            self.into.append((self.fn, grid, args, kwargs, kernel))
            return kernel

        return go


def record(fn, grid, args: tuple, kwargs: dict, kernel, tensors: tuple):
    """The :class:`Launch` of ``fn[grid](*args, **kwargs)`` that returned ``kernel``, with its
    tensors taken from ``tensors``; None where it cannot be replayed."""
    if kernel is None or hasattr(kernel, "result"):  # asynchronous compile
        return None
    try:
        device = torch.cuda.current_device()
        binder = fn.device_caches[device][4]
        kw = dict(kwargs)
        # As JITFunction.run binds them (they are options, not kernel parameters).
        kw["debug"] = kw.get("debug", fn.debug) or triton.knobs.runtime.debug
        kw["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
        bound, _, _ = binder(*args, **kw)
    except (AttributeError, KeyError, TypeError, IndexError):
        return None
    found = sources_of(tuple(bound.values()), tensors)
    if found is None:
        return None
    g = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
    p = launch_params(kernel, tuple(bound.values()), found[0])
    desc = None
    if p is not None:
        params, fills, scratch, scratch_param, block, shared = p
        desc = (kernel.function, g, block, shared, params, fills, scratch, scratch_param)
    return Launch(kernel, g, *found, native=desc)
