"""attnforge_kernels/device/interpreter.py's change to Triton's interpreter: a launch swaps the
language for interpreted builtins once, and a call of one jit function from another inside it
does not swap it again, unless the callee's module names a language module the launch did not
swap. What a kernel computes, and the language after a launch, are unchanged."""

import importlib.util
import textwrap

import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

import attnforge_kernels.api.flash_attn  # noqa: F401  (applies the interpreter's patches)


@triton.jit
def _twice(x):
    return x * 2.0


@triton.jit
def _no_calls(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) * 8.0)


@triton.jit
def _three_calls(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(out_ptr + offs, _twice(_twice(_twice(tl.load(x_ptr + offs)))))


def _swaps(monkeypatch, kernel) -> tuple[int, torch.Tensor]:
    calls = []
    real = interpreter._patch_builtin

    def counted(pkg, builder, scope):
        calls.append(pkg)
        return real(pkg, builder, scope)

    monkeypatch.setattr(interpreter, "_patch_builtin", counted)
    x = torch.arange(64, dtype=torch.float32)
    out = torch.empty_like(x)
    kernel[(4,)](x, out, N=16)
    return len(calls), out


def test_device_calls_inside_a_launch_swap_the_language_no_more_than_the_launch(monkeypatch):
    plain, want = _swaps(monkeypatch, _no_calls)
    nested, got = _swaps(monkeypatch, _three_calls)
    assert plain > 0  # the launch's own swap is counted ...
    assert nested == plain  # ... and 12 device calls (3 in each of 4 programs) add none
    assert torch.equal(got, want) and torch.equal(want, torch.arange(64.0) * 8)


def test_the_language_is_restored_after_a_launch(monkeypatch):
    before = (tl.load, tl.core.load, tl.tensor.__add__, tl.math.exp, tl.range)
    _swaps(monkeypatch, _three_calls)
    assert (tl.load, tl.core.load, tl.tensor.__add__, tl.math.exp, tl.range) == before


def test_a_callee_naming_another_language_module_is_still_patched(tmp_path, monkeypatch):
    # The kernel's module names triton.language only; the helper's names triton.language.core,
    # whose builtins the launch did not swap: the helper's call swaps them, as before.
    path = tmp_path / "core_helper.py"
    path.write_text(
        textwrap.dedent("""
        import triton
        import triton.language.core as tlc


        @triton.jit
        def ones_like(x):
            return tlc.full(x.shape, 1.0, tlc.float32) + x
        """)
    )
    spec = importlib.util.spec_from_file_location("core_helper", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(globals(), "_core_helper", module.ones_like)
    _, out = _swaps(monkeypatch, _calls_core_helper)
    assert torch.equal(out, torch.arange(64.0) + 1)


@triton.jit
def _calls_core_helper(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(out_ptr + offs, _core_helper(tl.load(x_ptr + offs)))  # noqa: F821 (set by the test)
