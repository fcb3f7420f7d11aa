"""kernels.launch: the cached launch path's key and argument tail (the GPU path itself runs in
kernels.check on a GPU; under the interpreter every launch takes Triton's own path)."""

import torch
import triton

from kernels import configs, launch
from kernels.flash import _attn_fwd


def test_the_interpreter_takes_tritons_own_path():
    assert configs.INTERPRET and not launch.ENABLED


def test_the_key_separates_what_triton_specialises_on():
    spec = launch._spec
    assert spec(1) != spec(2) != spec(16)  # == 1, neither, a multiple of 16
    assert spec(32) == spec(48)
    assert spec(2**31) != spec(2**31 - 16)  # 64-bit against 32-bit
    assert spec(1.5) is spec(2.0) is float
    assert spec(None) is None
    t = torch.zeros(64, dtype=torch.float16)
    assert spec(t) == (torch.float16, True)
    assert spec(t[1:]) == (torch.float16, False)  # 2 bytes off: unaligned
    assert spec(t.to(torch.bfloat16)) != spec(t)


def test_the_tail_is_the_constexprs_and_defaults_in_parameter_order():
    # The GPU's JITFunction of the forward (the interpreter wraps the same Python function).
    fn = triton.runtime.jit.JITFunction(_attn_fwd.fn)
    names = [p.name for p in fn.params]
    n = names.index("HEAD_DIM")
    given = {name: i for i, name in enumerate(names[n:-1])}  # USE_TMA left to its default
    tail = launch._tail(fn, n, {**given, "num_warps": 4})
    assert tail == (*given.values(), False)
