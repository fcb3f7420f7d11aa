"""Work-arounds applied only under TRITON_INTERPRET=1 (the CPU test path)."""

from __future__ import annotations

import os


def patch_interpreter() -> None:
    """Make Triton 3.6's interpreter do two things as a GPU does.

    - Loops take tensor bounds under NumPy >= 2. The interpreter turns a scalar tensor into an
      index with ``int(ndarray)``, which NumPy 2 refuses for its 1-element arrays;
      ``tl.range(lo, hi)`` with computed bounds then fails.
    - fp32 casts to bf16 round to the nearest (ties to even). The interpreter truncates them,
      which moved rotated cache keys by one bf16 step from the GPU's (and from torch's) results.
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
    interpreter._attnforge_patched = True


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
