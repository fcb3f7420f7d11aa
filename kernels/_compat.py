"""Work-arounds applied only under TRITON_INTERPRET=1 (the CPU test path)."""

from __future__ import annotations

import os


def patch_interpreter() -> None:
    """Let loops take tensor bounds in Triton 3.6's interpreter under NumPy >= 2.

    The interpreter turns a scalar tensor into an index with ``int(ndarray)``, which NumPy 2
    refuses for its 1-element arrays; ``tl.range(lo, hi)`` with computed bounds then fails.
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
    interpreter._attnforge_patched = True
