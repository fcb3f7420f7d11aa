"""The FP8 forward (``flash_attn_fp8_func``) in Triton's interpreter on tiny shapes.

Triton 3.6's interpreter multiplies float8_e4m3fn tiles (it has no FNUZ types, so gfx942's
float8_e4m3fnuz is covered by the GPU check only) but truncates when it converts fp32 to fp8;
the kernel rounds P to nearest there itself (``flash._rne_e4m3``), tested first. The numerics
are judged against the fp32 reference on the de-quantised inputs, with the same math rounding P
to e4m3 as the yardstick (``attnforge_kernels.checks.variants``).
"""

import os
import types

import pytest
import torch
import triton
import triton.language as tl

from attnforge_kernels import flash_attn_fp8_func
from attnforge_kernels.api import flash_attn as interface
from attnforge_kernels.checks import variants
from attnforge_kernels.checks.case import fp8
from attnforge_kernels.device import configs, flash

CPU = torch.device("cpu")
E4M3 = torch.float8_e4m3fn


@triton.jit
def _round_kernel(X, Y, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Y + i, flash._rne_e4m3(tl.load(X + i)))


def test_interpreter_fp8_operands_round_to_nearest_even_like_torch():
    assert os.environ.get("TRITON_INTERPRET") == "1"
    g = torch.Generator().manual_seed(0)
    grid = torch.arange(0, 127, dtype=torch.uint8).view(E4M3).float()  # every e4m3 value >= 0
    grid = grid[grid <= 1.0]
    midpoints = (grid[1:] + grid[:-1]) / 2  # ties go to the even neighbour
    x = torch.cat([torch.rand(4096, generator=g), torch.rand(1024, generator=g) * 0.02, midpoints])
    n = triton.next_power_of_2(x.numel())
    xp, yp = torch.zeros(n), torch.empty(n)
    xp[: x.numel()] = x
    _round_kernel[(1,)](xp, yp, N=n)
    y, expected = yp[: x.numel()], x.to(E4M3).float()
    assert torch.equal(y, expected), (x[y != expected][:5], y[y != expected][:5])


CASES = [
    fp8("bf16", 2, 37, 45, 4, 2, 64, "causal", "head"),
    fp8("fp16", 1, 20, 33, 2, 2, 40, "full", "tensor"),
    fp8("bf16", 1, 45, 17, 2, 1, 16, "window", "head"),  # d=16 runs with a 32-wide tile
    fp8("bf16", 1, 1, 30, 2, 2, 32, "causal", "tensor"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fp8_forward_matches_the_dequantised_fp32_reference(case):
    res = variants.compare_fp8(case, CPU, seed=5)
    assert res["ok"], res["metrics"]


def _fp8_inputs(b=1, sq=19, sk=21, hq=2, hk=2, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        (torch.randn(b, n, h, d, generator=g) * 4).to(E4M3)
        for n, h in ((sq, hq), (sk, hk), (sk, hk))
    )


def test_descaling_q_is_scaling_the_softmax_and_descaling_v_scales_the_output():
    q, k, v = _fp8_inputs()
    one = torch.tensor(1.0)
    base = flash_attn_fp8_func(q, k, v, one, one, one, softmax_scale=0.1)
    assert torch.equal(
        flash_attn_fp8_func(q, k, v, torch.tensor(2.0), one, one, softmax_scale=0.1),
        flash_attn_fp8_func(q, k, v, one, one, one, softmax_scale=0.2),
    )
    assert torch.equal(flash_attn_fp8_func(q, k, v, one, one, torch.tensor(2.0), softmax_scale=0.1),
                       base * 2)  # fmt: skip


def test_per_head_descale_shapes_agree_and_heads_get_their_own_factor():
    q, k, v = _fp8_inputs(b=2, hq=4, hk=2)
    per_head = torch.tensor([0.5, 2.0])
    a = flash_attn_fp8_func(q, k, v, None, None, per_head)
    b = flash_attn_fp8_func(q, k, v, None, None, per_head.expand(2, 2))
    plain = flash_attn_fp8_func(q, k, v)
    assert torch.equal(a, b)
    # V's descale scales the output of the query heads of each KV head (heads 0-1 and 2-3).
    assert torch.equal(a[:, :, :2], (plain[:, :, :2].float() * 0.5).to(torch.bfloat16))
    assert torch.equal(a[:, :, 2:], (plain[:, :, 2:].float() * 2.0).to(torch.bfloat16))


def test_output_dtype_and_no_autograd():
    q, k, v = _fp8_inputs()
    out = flash_attn_fp8_func(q, k, v, out_dtype=torch.float16)
    assert out.dtype == torch.float16 and out.grad_fn is None
    out, lse, probs = flash_attn_fp8_func(q, k, v, return_attn_probs=True)
    assert lse.shape == (1, 2, 19) and probs is None


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"out_dtype": torch.float32}, TypeError, "out_dtype"),
        ({"descale_q": torch.ones(3)}, ValueError, "descale_q"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, match):
    q, k, v = _fp8_inputs()
    with pytest.raises(error, match=match):
        flash_attn_fp8_func(q, k, v, **kwargs)


def test_non_fp8_or_mixed_inputs_are_refused():
    q, k, v = _fp8_inputs()
    with pytest.raises(TypeError, match="e4m3"):
        flash_attn_fp8_func(q.float().to(torch.bfloat16), k, v)
    with pytest.raises(TypeError, match="e4m3"):
        flash_attn_fp8_func(q, k.float().to(torch.float8_e5m2), v)


def test_the_non_native_e4m3_variant_is_refused_with_the_native_one_named():
    q, k, v = (t.float().to(torch.float8_e4m3fnuz) for t in _fp8_inputs())
    with pytest.raises(TypeError, match="float8_e4m3fn natively"):
        flash_attn_fp8_func(q, k, v)


def _gpu(monkeypatch, hip: bool, family: str, arch: str = "", capability=(9, 0)):
    """Pretend to be a GPU for the pure arch lookup (no kernel runs)."""
    monkeypatch.setattr(configs, "device_family", lambda device=None: family)
    monkeypatch.setattr(configs, "is_hip", lambda: hip)
    props = types.SimpleNamespace(gcnArchName=f"{arch}:sramecc+:xnack-")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


@pytest.mark.parametrize(
    "hip, family, arch, capability, expected",
    [
        (True, "cdna3", "gfx942", None, torch.float8_e4m3fnuz),
        (True, "cdna4", "gfx950", None, torch.float8_e4m3fn),
        (True, "rdna4", "gfx1201", None, torch.float8_e4m3fn),
        (False, "hopper", "", (9, 0), torch.float8_e4m3fn),
        (False, "ampere", "", (8, 9), torch.float8_e4m3fn),  # Ada
    ],
)
def test_fp8_type_per_arch(monkeypatch, hip, family, arch, capability, expected):
    _gpu(monkeypatch, hip, family, arch, capability)
    assert interface.fp8_dtype_for(torch.device("cuda", 0)) == expected


@pytest.mark.parametrize(
    "hip, family, arch, capability, named",
    [
        (True, "rdna3.5", "gfx1151", None, "gfx1151"),
        (True, "rdna3", "gfx1100", None, "gfx1100"),
        (True, "cdna2", "gfx90a", None, "gfx90a"),
        (False, "ampere", "", (8, 0), "sm80"),
    ],
)
def test_a_gpu_without_fp8_matrix_instructions_is_refused_by_name(
    monkeypatch, hip, family, arch, capability, named
):
    _gpu(monkeypatch, hip, family, arch, capability)
    with pytest.raises(NotImplementedError, match=named):
        interface.fp8_dtype_for(torch.device("cuda", 0))


def test_the_gpu_check_skips_fp8_cases_where_the_arch_has_no_fp8(monkeypatch):
    def refuse(device):
        raise NotImplementedError("FP8 attention needs fp8 matrix instructions, gfx1151 ...")

    monkeypatch.setattr(interface, "fp8_dtype_for", refuse)
    res = variants.run(fp8("bf16", 1, 17, 17, 2, 2, 64), CPU)
    assert res["status"] == "skip" and "gfx1151" in res["message"]


def test_a_kernel_that_ignores_the_descale_fails_the_check(monkeypatch):
    real = interface._descale
    monkeypatch.setattr(interface, "_descale", lambda t, *a: real(None, *a))
    res = variants.compare_fp8(fp8("bf16", 1, 17, 19, 2, 2, 32, "full", "head"), CPU)
    assert not res["ok"]
