"""Work-arounds applied only under TRITON_INTERPRET=1 (the CPU test path)."""

from __future__ import annotations

import os


def patch_interpreter() -> None:
    """Make Triton's interpreter (3.6-3.9) do two things as a GPU does, and one thing faster.

    - Loops take tensor bounds under NumPy >= 2. The interpreter turns a scalar tensor into an
      index with ``int(ndarray)``, which NumPy 2 refuses for its 1-element arrays;
      ``tl.range(lo, hi)`` with computed bounds then fails.
    - fp32 casts to bf16 round to the nearest (ties to even). The interpreter truncates them,
      which moved rotated cache keys by one bf16 step from the GPU's (and from torch's) results.
    - A call of one jit function from another inside a launch does not patch the language again
      (``_patch_device_calls_once``).
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter

    if getattr(interpreter, "_attnforge_patched", False):
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
    builder = interpreter.InterpreterBuilder
    builder.cast_impl = _rounding_cast(builder.cast_impl, interpreter.TensorHandle)
    _patch_device_calls_once(interpreter)
    interpreter._attnforge_patched = True


def _patch_device_calls_once(interpreter) -> None:
    """Patch the language once a launch, not once a device-function call.

    A launch (``GridExecutor.__call__``) swaps every builtin of ``triton.language`` (and of its
    ``math`` module and tensor class) for an interpreted one, and puts the originals back when it
    ends. Every call of a jit function from inside the kernel (``InterpretedFunction.__call__``)
    then swaps them all again (``_patch_lang``: ``inspect.getmembers`` of each), although the
    launch's swap is still in place: the same modules, set to the same interpreted members. The
    kernels here are built of small jit helpers (a tile load, a softmax step), so that repeat was
    half the interpreter's time (cProfile of one causal forward and backward: 12.8 s of 27 s in
    ``_patch_lang``). Inside a launch, a function whose language modules the launch has already
    swapped gets an empty scope; one whose module names a language module the launch did not
    swap (``triton.language.core`` beside ``triton.language``) is patched as before. Outside a
    launch nothing changes. tests/kernels/test_interpreter_patches.py holds it to that."""
    import inspect

    import triton.language as tl

    langs = (tl, tl.core)
    real_patch, real_launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    state = {"depth": 0, "swapped": set()}  # launches running; ids of the modules they swapped

    def _patch_lang(fn):
        named = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in langs}
        if state["depth"] and named and named <= state["swapped"]:
            return interpreter._LangPatchScope()
        scope = real_patch(fn)
        if state["depth"]:
            state["swapped"] |= named
        return scope

    def launch(self, *args, **kwargs):
        outer = state["swapped"]
        state["depth"] += 1
        state["swapped"] = set()
        try:
            return real_launch(self, *args, **kwargs)
        finally:
            state["depth"] -= 1
            state["swapped"] = outer

    interpreter._patch_lang = _patch_lang
    interpreter.GridExecutor.__call__ = launch


def _rounding_cast(cast_impl, handle):
    """The interpreter's cast, with fp32 to bf16 rounded to the nearest by torch's cast."""
    import numpy as np
    import torch
    import triton.language as tl

    def cast(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
            return handle(rounded.view(torch.int16).numpy().view(np.uint16), dst_type.scalar)
        return cast_impl(self, src, dst_type)

    return cast
