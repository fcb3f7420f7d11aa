"""attnforge_kernels.launch.plans: the keys of the forward's and backward's launch plans (issue 30
§2), on the CPU. The replay itself needs a GPU (tools/host_probe.py --verify checks it bitwise
against the full path); here: what the key separates, that equal keys mean Triton specialises
equally, and that the interpreter never plans."""

import pytest
import torch
import triton
from triton._C.libtriton import native_specialize_impl
from triton.backends.amd.compiler import HIPBackend
from triton.backends.nvidia.compiler import CUDABackend

from attnforge_kernels.api import flash_attn as interface
from attnforge_kernels.api.flash_attn import Mask
from attnforge_kernels.launch import plans as launch
from tests.kernels.standins import Fill

_NO_MASK = Mask()


@pytest.fixture
def fwd_key(monkeypatch):
    """The key run_forward computes, as a function of its arguments (CPU tensors, device 0)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv("ATTNFORGE_KERNELS_AUTOTUNE", raising=False)

    def key(q, k, v, cu_q=None, cu_k=None, max_q=64, max_k=64, batch=2, scale=0.125,
            mask=_NO_MASK, varlen=False, out_dtype=None):  # fmt: skip
        return launch.call_key(
            "fwd", (q, k, v, cu_q, cu_k), (max_q, max_k, batch, scale, mask, varlen, out_dtype)
        )

    return key


def _qkv(shape=(2, 64, 4, 64), dtype=torch.bfloat16):
    return tuple(torch.randn(shape).to(dtype) for _ in range(3))


def test_the_interpreter_takes_the_full_path():
    launch.clear()
    assert not launch.ENABLED
    q, k, v = _qkv((1, 16, 1, 16), torch.float16)
    interface.flash_attn_func(q, k, v)
    assert not launch.FORWARD.plans and not launch.BACKWARD.plans


def test_the_same_signature_gets_the_same_key(fwd_key):
    a, b = _qkv(), _qkv()
    assert fwd_key(*a) == fwd_key(*b)
    assert launch.find(launch.FORWARD, fwd_key(*a))[0] is not None


def test_a_stride_that_changes_divisibility_misses(fwd_key):
    q, k, v = _qkv((2, 64, 4, 40))
    # The same shape as a view of rows padded to 48 elements: strides 48*4... instead of 40*4...
    padded = torch.randn(2, 64, 4, 48).to(torch.bfloat16)[..., :40]
    assert padded.shape == q.shape and padded.stride() != q.stride()
    assert fwd_key(q, k, v) != fwd_key(padded, k, v)
    # BHSD storage seen as BSHD: same shape, other strides.
    bhsd = torch.randn(2, 4, 64, 40).to(torch.bfloat16).transpose(1, 2)
    assert fwd_key(q, k, v) != fwd_key(bhsd, k, v)


def test_a_different_dtype_misses(fwd_key):
    q, k, v = _qkv(dtype=torch.bfloat16)
    assert fwd_key(q, k, v) != fwd_key(q.half(), k.half(), v.half())
    assert fwd_key(q, k, v) != fwd_key(q, k, v, out_dtype=torch.float32)


def test_varlen_and_fixed_length_miss_each_other(fwd_key):
    q, k, v = _qkv((128, 4, 64))
    cu = torch.tensor([0, 64, 128], dtype=torch.int32)
    fixed = fwd_key(q, k, v)
    varlen = fwd_key(q, k, v, cu, cu, varlen=True)
    assert fixed != varlen
    assert varlen != fwd_key(q, k, v, cu.long(), cu.long(), varlen=True)  # cu_seqlens dtype


def test_pointer_alignment_misses_like_tritons_specialisation(fwd_key):
    q, k, v = _qkv()
    flat = torch.empty(q.numel() + 8, dtype=q.dtype)
    off = flat[1 : 1 + q.numel()].view(q.shape)  # 2 bytes past a 16-byte boundary
    assert off.data_ptr() % 16 and not q.data_ptr() % 16
    assert fwd_key(q, k, v) != fwd_key(off, k, v)


def test_integer_arguments_key_by_value(fwd_key):
    q, k, v = _qkv()
    keys = {fwd_key(q, k, v, max_k=n) for n in (1, 2, 16, 77, 2**31)}
    assert len(keys) == 5  # == 1, neither, a multiple of 16, 32 against 64 bits
    assert fwd_key(q, k, v, mask=Mask(right=0)) != fwd_key(q, k, v)
    assert fwd_key(q, k, v, scale=0.1) != fwd_key(q, k, v)


def test_the_same_tensor_passed_twice_is_part_of_the_key(fwd_key):
    x, k, v = _qkv()
    y = x.clone()
    assert fwd_key(x, x, x) == fwd_key(y, y, y)
    assert fwd_key(x, x, x) != fwd_key(x, k, v)
    assert fwd_key(x, x, v) != fwd_key(x, k, x)


def test_autotuning_and_launch_hooks_are_not_planned(fwd_key, monkeypatch):
    q, k, v = _qkv()
    hook = triton.knobs.runtime.launch_enter_hook
    hook.add(print)
    try:
        assert fwd_key(q, k, v) is None
    finally:
        hook.remove(print)
    monkeypatch.setenv("ATTNFORGE_KERNELS_AUTOTUNE", "1")
    assert fwd_key(q, k, v) is None


def test_the_backward_key_holds_what_the_backward_adds_to_the_forwards(fwd_key, monkeypatch):
    """A backward under a forward plan keys dO's layout, dtype and alignment, the fresh output's
    and LSE's alignment and which input dO is; the rest is the forward's key."""
    q, k, v = _qkv()
    out, lse = torch.empty_like(q), torch.empty(2, 4, 64)
    do = torch.randn(q.shape).to(q.dtype)
    base = launch.backward_key(do, q, k, v, out, lse)
    assert base == launch.backward_key(do.clone(), q, k, v, out, lse)
    bhsd = do.transpose(1, 2).contiguous().transpose(1, 2)
    flat = torch.empty(q.numel() + 8, dtype=q.dtype)
    shifted = flat[1 : 1 + q.numel()].view(q.shape)
    others = [
        launch.backward_key(bhsd, q, k, v, out, lse),
        launch.backward_key(do.half(), q, k, v, out, lse),
        launch.backward_key(shifted, q, k, v, out, lse),
        launch.backward_key(do, q, k, v, shifted, lse),
        launch.backward_key(q, q, k, v, out, lse),  # dO is q: the plan maps pointers by position
    ]
    assert base not in others and len(set(others)) == len(others)
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", "fwd=64x64")
    assert launch.backward_key(do, q, k, v, out, lse) != base
    monkeypatch.setenv("ATTNFORGE_KERNELS_AUTOTUNE", "1")
    assert launch.backward_key(do, q, k, v, out, lse) is None


def test_a_planned_forwards_backward_is_planned_in_the_forwards_plan(fwd_key, monkeypatch):
    """The replay's wiring, with stand-in launches on the CPU: a step whose forward replays a
    plan takes its backward from that plan's table, keyed by launch.backward_key; a dO that
    misses it takes the full path (here the interpreter) and notes the miss there, not in
    launch.BACKWARD; inputs whose data moved after the forward take launch.BACKWARD's full
    key."""
    monkeypatch.setattr(launch, "ENABLED", True)
    monkeypatch.setattr(interface, "_stream", lambda: None)
    launch.clear()
    try:
        shape = (1, 16, 2, 16)
        q, k, v = (x.requires_grad_() for x in _qkv(shape, torch.float32))
        scale = shape[-1] ** -0.5
        out0, lse0 = torch.empty_like(q), torch.empty(1, 2, 16)
        fwd = Fill(t5=2.0, t6=0.0)  # (q, k, v, cu_q, cu_k, out, lse): finite for the backward
        fplan = interface.PyForwardPlan(fwd, out0, lse0)
        launch.FORWARD.put(fwd_key(q, k, v, max_q=16, max_k=16, batch=1, scale=scale), fplan)
        do = torch.ones(shape)
        dq_launch, dkdv_launch = Fill(t8=3.0), Fill(t9=4.0, t10=5.0)  # ..., dq, dk, dv, delta
        bkey = launch.backward_key(do, q, k, v, out0, lse0)
        fplan.backward.put(bkey, interface.PyBackwardPlan((dq_launch, dkdv_launch)))

        out = interface.flash_attn_func(q, k, v)
        assert fwd.calls == 1 and torch.all(out == 2.0)
        out.backward(do)
        assert (dq_launch.calls, dkdv_launch.calls) == (1, 1)
        assert [float(t.grad.unique()) for t in (q, k, v)] == [3.0, 4.0, 5.0]

        # Another dO layout: not this plan's; the full path runs and its key is noted as not
        # replayable here (the interpreter records nothing), in the forward plan's table.
        q.grad = k.grad = v.grad = None
        out = interface.flash_attn_func(q, k, v)
        bhsd = do.transpose(1, 2).contiguous().transpose(1, 2)
        out.backward(bhsd)
        assert dq_launch.calls == 1 and q.grad is not None and not launch.BACKWARD.plans
        assert fplan.backward.plans[launch.backward_key(bhsd, q, k, v, out0, lse0)] is False

        # An input whose .data was replaced after the forward (autograd does not see that):
        # the plan's recorded strides may not fit the new data, so the full key is used.
        q.grad = k.grad = v.grad = None
        out = interface.flash_attn_func(q, k, v)
        k.data = k.detach().clone()
        out.backward(do)
        assert dq_launch.calls == 1 and k.grad is not None
        assert list(launch.BACKWARD.plans.values()) == [False]  # noted there, by all tensors
    finally:
        launch.clear()


def test_not_tensors_and_unhashable_values_are_not_planned(fwd_key):
    q, k, v = _qkv()
    assert fwd_key([1.0], k, v) is None
    assert launch.find(launch.FORWARD, fwd_key(q, k, v, scale=[0.1])) == (None, None)


def test_a_key_that_cannot_be_replayed_is_remembered():
    table = launch.Table()
    table.put(("k",), False)
    assert launch.find(table, ("k",)) == (None, None)  # no plan and nothing to record
    assert launch.find(table, ("other",)) == (("other",), None)  # record this one


def test_the_table_is_bounded(monkeypatch):
    monkeypatch.setattr(launch, "MAX_PLANS", 4)
    table = launch.Table()
    for i in range(5):
        table.put(i, "plan")
    assert list(table.plans) == [4]


@pytest.mark.parametrize("backend", [CUDABackend, HIPBackend])
def test_equal_tensor_keys_mean_equal_triton_specialisation(backend):
    """Over views of a buffer at every element offset, in several dtypes and layouts: where
    the plan's key of two tensors is equal, so is what Triton 3.6 specialises them to."""
    views = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        buf = torch.empty(4096, dtype=dtype)
        for off in range(0, 17):  # elements: 2 or 4 bytes each
            views.append(buf[off : off + 128].view(8, 16))
            views.append(buf[off : off + 128].view(16, 8).t())
    seen: dict = {}
    for t in views:
        spec = native_specialize_impl(backend, t, False, True, True)
        key = (launch.tensor_key(t), launch._storage_key(t))
        assert seen.setdefault(key, spec) == spec
    assert len(seen) > 6  # the keys do separate alignments and dtypes


def test_a_launch_maps_its_pointer_parameters_to_the_calls_tensors():
    q, k, v = _qkv()
    out = torch.empty_like(q)
    tensors = (q, k, v, None, None, out)
    values = (q, k, v, out, out, 7, 1, None, 0.5, 64)
    assert launch.sources_of(values, tensors) == ((0, 1, 2, 5, 5), (7, 1, None, 0.5, 64))
    copy = q.contiguous().clone()
    assert launch.sources_of((copy, k, v, 3), tensors) is None  # a tensor of its own
    assert launch.sources_of((q, k, 3, v), tensors) is None  # a tensor after the pointers
