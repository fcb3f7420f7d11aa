"""What one AOT compile's result depends on, as a digest: the per-kernel key of the compile cache.

``source_key(fn)`` is what Triton's ``JITFunction.cache_key`` hashes for a kernel (triton
``python/triton/runtime/jit.py``, ``JITCallable.cache_key`` and ``DependenciesFinder``, 3.6-3.9):
the kernel's source, the same key of every jit function it calls (with its ``noinline``), and
the values of the ``tl.constexpr`` globals it reads, less one input: Triton adds each function's
starting line number (its line table goes into the binary), so with ``cache_key`` itself an
edit that adds a line to one kernel would move, and recompile, every kernel below it in the
file. Line numbers change no VGPR count, spill, LDS size or occupancy, which is what the check
judges (a kernel moved down 7 lines compiled the same for gfx1151); the debug line info can move
the SGPR count, which it only reports, by one (compile_check.CompileCache).

The source is the function's text with its decorator (``do_not_specialize``, ``noinline``: so a
callee's ``noinline`` is in its key, as Triton adds it); no
file name or module path enters, so moving a file or editing host code beside a kernel changes
no key. The walk reads the Python function a jit object wraps (``.fn``), so it gives the same
key for a compiled and an interpreted (``TRITON_INTERPRET=1``) jit function.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import re
import textwrap
from types import ModuleType


def jit_body(obj):
    """The Python function a Triton or Gluon jit object wraps (compiled or interpreted), else
    None."""
    fn = getattr(obj, "fn", None)
    if inspect.isfunction(fn) and type(obj).__module__.startswith("triton."):
        return fn
    return None


def source_key(fn) -> str:
    """The digest of ``fn``'s source, its jit callees' (recursively) and the constexpr globals
    it reads (module docstring)."""
    return _source_key(fn, {})


def _source_key(obj, seen: dict) -> str:
    py = jit_body(obj)
    if id(py) in seen:  # a function that calls itself, directly or not, as Triton marks it
        return seen[id(py)]
    seen[id(py)] = f"recursion:{py.__qualname__}"
    h = hashlib.sha256(textwrap.dedent(inspect.getsource(py)).encode())
    for name, val in _references(py):
        if jit_body(val) is not None:
            h.update(f"\0{name}:{_source_key(val, seen)}".encode())
        elif getattr(val, "__triton_aggregate__", False):
            parts = [_source_key(a, seen) for a in val.hash_attrs if jit_body(a) is not None]
            h.update(f"\0{name}:{parts}".encode())
        elif _is_value(val):
            h.update(f"\0{name}={stable_repr(val)}".encode())
    seen[id(py)] = h.hexdigest()
    return seen[id(py)]


def _references(py) -> list[tuple[str, object]]:
    """(dotted name, object) for every global or closure name ``py``'s body reads, and every
    attribute reached from a module of the project (``flash.dot_acc``), sorted by name; Triton's own
    modules (``tl``, ``gl``, ``triton``) are its builtins, as Triton skips them."""
    scope = {**py.__globals__, **inspect.getclosurevars(py).nonlocals}
    found: dict[str, object] = {}
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(py)))):
        chain = _dotted(node)
        if not chain or chain[0] not in scope:
            continue
        val = scope[chain[0]]
        for i, attr in enumerate(chain[1:], 1):
            if not isinstance(val, ModuleType) or _is_triton(val):
                break
            val = getattr(val, attr, None)
            found[".".join(chain[: i + 1])] = val
        found[chain[0]] = scope[chain[0]]
    return sorted(found.items(), key=lambda kv: kv[0])


def _dotted(node) -> list[str]:
    """``a.b.c`` read by ``node`` as ["a", "b", "c"], or [] for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        return [node.id, *reversed(parts)]
    return []


def _is_triton(module: ModuleType) -> bool:
    return module.__name__.split(".")[0] == "triton"


def _is_value(val) -> bool:
    """A constant a kernel can read: a ``tl.constexpr`` (Triton hashes those) or a plain number,
    string or tuple of them (Triton rejects other globals in a kernel)."""
    if type(val).__name__ == "constexpr":
        return True
    return isinstance(val, (bool, int, float, str)) or (
        isinstance(val, tuple) and all(_is_value(v) for v in val)
    )


def stable_repr(value) -> str:
    """``value`` as text that is the same in every process (no object addresses)."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))
