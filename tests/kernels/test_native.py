"""attnforge_kernels/launch/replay.py and attnforge_kernels/launch/replay.cpp, the native launch path (issue 30 §2), on the CPU.

The extension is compiled for real with the host's C++ compiler against the installed torch
(once per machine: the build cache outlives the run, as the AOT tests' does) and loaded. On the
CPU it runs in its test mode, where a replayed launch is noted (kernel, grid, block and every
parameter's bytes) instead of handed to the driver; everything else is the code a GPU runs: the
keys, the plans, the C++ autograd node, the backward's way back to Python. A GPU checks the
launches themselves: ``attnforge_kernels.check``'s attn cases compare the native replays bitwise
with the Python path where it is active, and tools/host_probe.py --verify does the same.
"""

import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attnforge_kernels.api import flash_attn as interface
from attnforge_kernels.api.flash_attn import Mask
from attnforge_kernels.launch import params as launch_params
from attnforge_kernels.launch import plans as launch
from attnforge_kernels.launch import replay as _native
from tests.kernels.standins import Fill

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(_native.__file__))))


@pytest.fixture(scope="module")
def ext():
    mod = _native.load(_native.build(quiet=True))
    mod.init(hip=False, noting=True)
    mod.clear()
    mod.take_noted()
    mod.counts()
    yield mod
    mod.clear()


FWD_FN, DQ_FN, DKDV_FN = 0xF0, 0xD0, 0xDD
SCALE = 0.125


def fwd_desc(nparams=12):
    """A forward launch: pointer parameters 0-4 take q, k, v, out, lse (call tensors 0, 1, 2,
    5, 6); the rest are scalars, then the two scratch pointers."""
    params = [0] * nparams
    params[5] = 64  # an i32
    params[6] = struct.unpack("<I", struct.pack("<f", SCALE))[0]  # an fp32
    params[7] = (-3) & 0xFFFFFFFF  # a negative i32
    fills = [(0, 0), (1, 1), (2, 2), (3, 5), (4, 6)]
    return (FWD_FN, (4, 2, 1), 128, 1024, params, fills, 0, nparams - 2)


# Backward tensors: do, q, k, v, out, lse, cu_q, cu_k, dq, dk, dv, delta.
BWD_DESCS = [
    (DQ_FN, (4, 2, 1), 256, 0, [0] * 8, [(0, 0), (1, 1), (2, 8), (3, 11), (4, 4)], 0, 6),
    (DKDV_FN, (1, 2, 1), 256, 0, [0] * 7, [(0, 9), (1, 10), (2, 11)], 0, 5),
]


def qkv(shape=(2, 64, 4, 16), grad=True):
    return tuple(torch.randn(shape, requires_grad=grad) for _ in range(3))


def args(q, k, v, cu_q=None, cu_k=None, max_q=64, max_k=64, batch=2, scale=SCALE, left=None,
         right=None, softcap=0.0, varlen=False, token=1):  # fmt: skip
    return (q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, left, right, softcap, varlen, token)


def plan_for(ext, q, k, v, **kw):
    a = args(q, k, v, **kw)
    out = torch.empty(q.shape)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1])
    return ext.put_forward(*a, fwd_desc(), out, lse), a


class Fallback:
    """The Python backward the node calls without a native plan: notes the call, answers with
    ones (so the test sees its gradients), and hands BWD_DESCS over unless told not to."""

    def __init__(self, ext, hand_over=True):
        self.ext, self.hand_over, self.calls = ext, hand_over, []

    def __call__(self, plan, same, do, q, k, v, out, lse, cu_q, cu_k, *values):
        self.calls.append((plan.id, same, values, cu_q))
        if self.hand_over and same:
            self.ext.put_backward(plan, do, q, k, v, out, lse, BWD_DESCS)
        return torch.ones_like(q), torch.ones_like(k), torch.ones_like(v)


def ptr(t):
    return t.data_ptr()


def fresh(ext, hand_over=True):
    """No plans, a noting Python backward, and one planned call: (fallback, q, k, v, plan,
    the call's arguments)."""
    ext.clear()
    fb = Fallback(ext, hand_over)
    ext.set_fallback(fb)
    q, k, v = qkv()
    plan, a = plan_for(ext, q, k, v)
    return fb, q, k, v, plan, a


def test_a_planned_call_launches_its_plan_with_the_calls_tensors(ext):
    q, k, v = qkv()
    plan, a = plan_for(ext, q, k, v)
    ext.take_noted()
    out = ext.flash(*a)
    (fn, grid, block, shared, params), = ext.take_noted()  # fmt: skip
    assert (fn, grid, block, shared) == (FWD_FN, (4, 2, 1), 128, 1024)
    assert params[:3] == [ptr(q), ptr(k), ptr(v)]
    assert params[3] == ptr(out) and params[4] not in (0, ptr(out))  # the LSE, allocated
    assert params[5:8] == fwd_desc()[4][5:8]  # scalars as recorded
    assert params[-2:] == [0, 0]  # no scratch
    assert out.shape == q.shape and out.dtype == q.dtype
    assert "Flash" in out.grad_fn.name()  # the C++ node
    assert ext.counts()[0] == 1


def test_an_empty_grid_launches_nothing(ext):
    ext.clear()
    q, k, v = qkv((2, 0, 4, 16))
    desc = list(fwd_desc())
    desc[1] = (0, 8, 1)  # no query blocks: Triton's launchers make no launch
    out, lse = torch.empty(q.shape), torch.empty(2, 4, 0)
    ext.put_forward(*args(q, k, v, max_q=0), tuple(desc), out, lse)
    ext.take_noted()
    assert ext.flash(*args(q, k, v, max_q=0)).shape == q.shape
    assert ext.take_noted() == []


def test_the_key_separates_what_the_python_key_does(ext):
    ext.clear()
    q, k, v = qkv()
    plan_for(ext, q, k, v)
    assert ext.flash(*args(q, k, v)) is not None
    misses = {
        "strides": args(q.transpose(1, 2).contiguous().transpose(1, 2), k, v),
        "dtype": args(q.half(), k, v),
        "shape": args(*qkv((2, 64, 4, 8))),
        "max_k": args(q, k, v, max_k=65),
        "scale": args(q, k, v, scale=0.25),
        "causal": args(q, k, v, right=0),
        "left": args(q, k, v, left=8),
        "softcap": args(q, k, v, softcap=30.0),
        "process state": args(q, k, v, token=2),
        "q is k": args(q, q, v),
        "alignment": args(torch.randn(2 * 64 * 4 * 16 + 1)[1:].view(2, 64, 4, 16), k, v),
    }
    for what, a in misses.items():
        assert ext.flash(*a) is None, what


def test_the_backward_goes_to_python_once_then_replays(ext):
    fb, q, k, v, plan, a = fresh(ext)
    do = torch.randn(q.shape)
    out = ext.flash(*a)
    out.backward(do)
    assert fb.calls == [(plan.id, True, (64, 64, 2, SCALE, None, None, 0.0, False), None)]
    assert torch.equal(q.grad, torch.ones_like(q))  # the fallback's answer reached the leaf
    assert plan.backward_plans() == 1
    q.grad = k.grad = v.grad = None
    ext.take_noted()
    out = ext.flash(*a)
    out.backward(do)
    assert len(fb.calls) == 1  # replayed natively
    fwd, dq, dkdv = ext.take_noted()
    assert (dq[0], dkdv[0]) == (DQ_FN, DKDV_FN)
    assert dq[4][0] == ptr(do) and dq[4][1] == ptr(q) and dq[4][4] == ptr(out)
    assert dq[4][2] == ptr(q.grad)  # dQ is the gradient autograd hands the leaf
    assert dkdv[4][:2] == [ptr(k.grad), ptr(v.grad)]
    assert dq[4][3] == dkdv[4][2]  # one delta, written by dQ, read by dK/dV
    assert ext.counts()[1:3] == (1, 1)


def test_another_do_layout_goes_to_python(ext):
    fb, q, k, v, plan, a = fresh(ext)
    ext.flash(*a).backward(torch.randn(q.shape))
    ext.flash(*a).backward(torch.randn(2, 4, 64, 16).transpose(1, 2))
    assert len(fb.calls) == 2 and plan.backward_plans() == 2


def test_a_replaced_data_goes_to_python_without_a_hand_over(ext):
    fb, q, k, v, plan, a = fresh(ext)
    out = ext.flash(*a)
    with torch.no_grad():
        q.data = torch.randn(q.shape)
    out.backward(torch.randn(q.shape))
    assert [c[1] for c in fb.calls] == [False]
    assert plan.backward_plans() == 0


def test_autograd_refuses_what_it_refuses_for_python_functions(ext):
    _, q, k, v, plan, a = fresh(ext)
    out = ext.flash(*a)
    out.mul_(2)  # the saved output changed in place
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(torch.randn(q.shape))
    out = ext.flash(*a)
    out.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.sum().backward()
    out = ext.flash(*a)
    out.sum().backward(retain_graph=True)
    out.sum().backward()  # retain_graph keeps the saved tensors
    with torch.no_grad():
        assert ext.flash(*a).grad_fn is None
    qn, kn, vn = (t.detach() for t in (q, k, v))
    plan_for(ext, qn, kn, vn)
    assert ext.flash(*args(qn, kn, vn)).grad_fn is None  # nothing requires grad


def test_varlen_cu_seqlens_are_saved_and_checked(ext):
    ext.clear()
    fb = Fallback(ext, hand_over=False)
    ext.set_fallback(fb)
    q, k, v = qkv((96, 4, 16))
    cu = torch.tensor([0, 40, 96], dtype=torch.int32)
    out_ = torch.empty(q.shape)
    lse = torch.empty(4, 96)
    a = args(q, k, v, cu, cu, 56, 56, 2, varlen=True)
    ext.put_forward(*a, fwd_desc(), out_, lse)
    ext.flash(*a).sum().backward()
    assert fb.calls[0][3] is cu
    out = ext.flash(*a)
    cu.add_(0)  # bumps the version: the saved cu_seqlens changed in place
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_clear_forgets_every_plan(ext):
    ext.clear()
    q, k, v = qkv()
    plan_for(ext, q, k, v)
    assert ext.size() == 1
    ext.clear()
    assert ext.size() == 0 and ext.flash(*args(q, k, v)) is None


def test_a_bad_description_is_refused(ext):
    q, k, v = qkv()
    out, lse = torch.empty(q.shape), torch.empty(2, 4, 64)
    bad = list(fwd_desc())
    bad[5] = [(12, 0)]  # a parameter past the end
    with pytest.raises(RuntimeError, match="out of range"):
        ext.put_forward(*args(q, k, v), tuple(bad), out, lse)
    bad = list(fwd_desc())
    bad[5] = [(0, 7)]  # a forward has 7 tensors
    with pytest.raises(RuntimeError, match="reads tensor 7"):
        ext.put_forward(*args(q, k, v), tuple(bad), out, lse)


def _kernel(signature: dict, **meta):
    md = dict(num_ctas=1, launch_cooperative_grid=False, launch_pdl=False, profile_scratch_size=0,
              global_scratch_size=0, global_scratch_align=1, num_warps=4, shared=4096,
              warp_size=32)  # fmt: skip
    md.update(meta)
    return SimpleNamespace(src=SimpleNamespace(signature=signature), metadata=SimpleNamespace(**md))


def test_launch_params_pack_as_tritons_launcher_does():
    sig = {"Q": "*bf16", "Out": "*bf16", "n": "i32", "m": "i64", "s": "fp32", "h": "fp16",
           "flag": "i1", "BLOCK": "constexpr", "neg": "i32"}  # fmt: skip
    got = launch_params.launch_params(_kernel(sig), (None, None, 7, 2**40, 0.5, 1.5, True, 64, -2),
                                (3, 0))  # fmt: skip
    params, fills, scratch, scratch_param, block, shared = got
    assert fills == [(0, 3), (1, 0)]
    assert params == [0, 0, 7, 2**40, 0x3F000000, 0x3E00, 1, 0xFFFFFFFE, 0, 0]
    assert (scratch, scratch_param, block, shared) == (0, 8, 128, 4096)
    amd = launch_params.launch_params(_kernel({"Q": "*fp16"}, warp_size=64, global_scratch_size=128),
                                (None,), (0,))  # fmt: skip
    assert amd[2] == 128 and amd[4] == 256  # scratch per program; 64-wide waves


@pytest.mark.parametrize(
    "sig,meta",
    [
        ({"d": "tensordesc<bf16[64, 64]>"}, {}),  # host-side TMA descriptors
        ({"Q": "*bf16"}, {"num_ctas": 2}),  # clusters
        ({"Q": "*bf16"}, {"profile_scratch_size": 64}),  # instrumentation
        ({"Q": "*bf16"}, {"launch_pdl": True}),
        ({"Q": "*bf16", "x": "u128"}, {}),  # a type it does not know
    ],
)
def test_launches_a_replay_cannot_rebuild_are_not_handed_over(sig, meta):
    values = (None,) * len(sig)
    assert launch_params.launch_params(_kernel(sig, **meta), values, (0,)) is None


def test_a_pointer_parameter_that_is_not_a_call_tensor_is_not_handed_over():
    sig = {"Q": "*bf16", "n": "i32", "P": "*fp32"}
    assert launch_params.launch_params(_kernel(sig), (None, 1, None), (0,)) is None


def test_the_interpreter_keeps_the_python_path():
    assert not launch.ENABLED
    assert _native.status().startswith("off")
    q, k, v = qkv((1, 16, 1, 16))
    call = (None, None, 16, 16, 1, 0.25, Mask(), None, False, None)
    assert _native.forward(q.half(), k.half(), v.half(), call) is None
    out = interface.flash_attn_func(q.half(), k.half(), v.half())
    assert out.grad_fn.name() == "FlashAttnOutFunctionBackward"


def test_a_failed_build_leaves_nothing_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNFORGE_NATIVE_DIR", str(tmp_path / "cache"))
    cxx = tmp_path / "cxx"
    cxx.write_text("#!/bin/sh\necho 'native.cpp:1:1: error: no such thing' >&2\nexit 1\n")
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    with pytest.raises(RuntimeError, match="error: no such thing"):
        _native.build(quiet=True)
    left = sorted(p.suffix for p in (tmp_path / "cache").iterdir() if p.suffix != ".lock")
    assert left == [".failed"]  # no partial module; the failure, for the next processes
    cxx.write_text("#!/bin/sh\necho compiled >> " + str(tmp_path / "calls") + "\nexit 1\n")
    with pytest.raises(RuntimeError, match="an earlier build"):
        _native.build(quiet=True)  # not compiled again
    assert not (tmp_path / "calls").exists()
    with pytest.raises(RuntimeError, match="failed"):
        _native.build(quiet=True, again=True)  # python -m attnforge_kernels.native build
    assert (tmp_path / "calls").read_text() == "compiled\n"
    monkeypatch.setenv("CXX", str(tmp_path / "absent"))
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        _native.build(quiet=True)


def _fake_cxx(tmp_path, pause: int = 0) -> Path:
    """A compiler that logs each call to tmp_path/calls, waits ``pause`` seconds and writes a
    module file where -o points."""
    cxx = tmp_path / "cxx"
    cxx.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo x >> {tmp_path / "calls"}
        sleep {pause}
        for a; do [ "$prev" = -o ] && echo built > "$a"; prev=$a; done
    """))  # fmt: skip
    cxx.chmod(0o755)
    return cxx


def test_concurrent_builds_compile_once(tmp_path):
    """Two processes asking at once: one compiles (under the lock), the other waits for it."""
    log = tmp_path / "calls"
    cxx = _fake_cxx(tmp_path, pause=1)
    env = {**os.environ, "CXX": str(cxx), "ATTNFORGE_NATIVE_DIR": str(tmp_path / "cache")}
    code = "from attnforge_kernels.launch import replay; print(replay.build(quiet=True))"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              text=True, cwd=ROOT) for _ in range(2)]  # fmt: skip
    outs = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(outs) == 1 and log.read_text().count("x") == 1
    built = [p for p in (tmp_path / "cache").iterdir() if p.suffix == ".so"]
    assert [p.read_text() for p in built] == ["built\n"]  # renamed whole; no temporary left


def test_the_command_line_says_why_it_is_off():
    env = {**os.environ, "ATTNFORGE_NATIVE": "0"}
    r = subprocess.run([sys.executable, "-m", "attnforge_kernels.native", "status"], capture_output=True,
                       text=True, env=env, cwd=ROOT)  # fmt: skip
    assert r.returncode == 1 and r.stdout.strip() == "off (ATTNFORGE_NATIVE=0)"
    assert "RuntimeWarning" not in r.stderr


def test_the_python_path_hands_its_plans_over(ext, monkeypatch):
    """The glue in attnforge_kernels/api/flash_attn.py and attnforge_kernels/launch/replay.py, with stand-in Python launches:
    a call the native path misses takes the Python plan and hands it over; the next is native;
    its backward goes back to Python once (through the forward's Python plan, whose backward
    plan is handed over too) and then replays natively."""
    monkeypatch.setattr(launch, "ENABLED", True)
    monkeypatch.setattr(interface, "_stream", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv("ATTNFORGE_KERNELS_AUTOTUNE", raising=False)
    monkeypatch.setattr(_native, "_mod", ext)
    monkeypatch.setattr(_native, "_state", "active")
    ext.set_fallback(interface.native_fallback)
    ext.clear()
    launch.clear()
    ext.take_noted()
    ext.counts()
    try:
        shape = (1, 16, 2, 16)
        q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
        scale = shape[-1] ** -0.5
        out0, lse0 = torch.empty_like(q), torch.empty(1, 2, 16)
        fwd = Fill(fwd_desc(), t5=2.0, t6=0.0)
        fplan = interface.PyForwardPlan(fwd, out0, lse0)
        key = launch.call_key("fwd", (q, k, v, None, None),
                              (16, 16, 1, scale, Mask(), False, None))  # fmt: skip
        launch.FORWARD.put(key, fplan)
        do = torch.ones(shape)
        dq_l, dkdv_l = Fill(BWD_DESCS[0], t8=3.0), Fill(BWD_DESCS[1], t9=4.0, t10=5.0)
        fplan.backward.put(launch.backward_key(do, q, k, v, out0, lse0),
                           interface.PyBackwardPlan((dq_l, dkdv_l)))  # fmt: skip

        out = interface.flash_attn_func(q, k, v)  # native misses; the Python plan replays
        assert fwd.calls == 1 and torch.all(out == 2.0) and fplan.native
        assert out.grad_fn.name() == "FlashAttnOutFunctionBackward" and ext.size() == 1
        out.backward(do)  # Python's backward, from the forward plan's table; handed over
        assert dq_l.calls == 1 and fplan.native.backward_plans() == 0  # not on a Python hit

        out = interface.flash_attn_func(q, k, v)  # native
        assert fwd.calls == 1 and "Flash" in out.grad_fn.name()
        out.backward(do)  # no native backward plan: back to Python, which hands it over
        assert dq_l.calls == 2 and fplan.native.backward_plans() == 1
        assert ext.counts()[:3] == (1, 0, 1)

        q.grad = k.grad = v.grad = None
        ext.take_noted()
        interface.flash_attn_func(q, k, v).backward(do)  # native both ways
        assert dq_l.calls == 2 and ext.counts()[:3] == (1, 1, 0)
        assert [n[0] for n in ext.take_noted()] == [FWD_FN, DQ_FN, DKDV_FN]

        launch.clear()  # Python's plans and the native ones go together
        assert ext.size() == 0 and not _native._PLANS
    finally:
        launch.clear()


# --- flash_attn_with_kvcache (attnforge_kernels/api/kvcache.py): decoding steps on a contiguous cache --------

KV_FN, APPEND_FN = 0xC0, 0xA0
# A parameter per pointer a launch passes (Triton makes an unused one, None, a constexpr), in
# the order of kv_fwd's 13 pointers (q, k_cache, v_cache, out, lse, part, count, cu_q,
# seqlens_k, k_start, block_table, batch_idx, slopes) and kv_append's (q, k, v, k_cache,
# v_cache, q_out, cache_seqlens, lengths, k_start, block_table, batch_idx, cos, sin).


def kv_desc(lse=False, split=True, bidx=False, leftpad=False):
    used = [0, 1, 2, 3] + [4] * lse + [5, 6] * split + [8] + [9] * leftpad + [11] * bidx
    n = len(used) + 4  # two scalars, then the two scratch pointers
    return (KV_FN, (1, 8, 4), 128, 2048, [0] * n, list(enumerate(used)), 0, n - 2)


def append_desc(rotary=False, bidx=False, leftpad=False):
    used = [0, 1, 2, 3, 4] + [5] * rotary + [6, 7] + [8] * leftpad + [10] * bidx
    used += [11, 12] * rotary
    n = len(used) + 3
    return (APPEND_FN, (2, 2, 1), 32, 0, [0] * n, list(enumerate(used)), 0, n - 2)


def kv_inputs(b=2, rows=64, hq=8, hk=2, d=16):
    q = torch.randn(b, 1, hq, d)
    return q, torch.randn(b, rows, hk, d), torch.randn(b, rows, hk, d)


def kv_args(q, kc, vc, k=None, v=None, cos=None, sin=None, seqlens=None, bidx=None,
            leftpad=None, scale=None, causal=False, left=-1, right=-1, softcap=0.0,
            interleaved=True, splits=0, lse=False, token=1):  # fmt: skip
    return (q, kc, vc, k, v, cos, sin, seqlens, bidx, leftpad, scale, causal, left, right,
            softcap, interleaved, splits, lse, token)  # fmt: skip


def put_kv(ext, *a, splits=4, tiles=4, append=None):
    q, kc, k, cos, bidx, leftpad, lse = a[0], a[1], a[3], a[5], a[8], a[9], a[17]
    lse_shape = [q.shape[0], q.shape[2], q.shape[1]] if lse else []
    part = splits * tiles * (16 * 16 + 16) if splits > 1 else 0
    desc = kv_desc(lse, splits > 1, bidx is not None, leftpad is not None)
    if append is None and k is not None:
        append = append_desc(cos is not None, bidx is not None, leftpad is not None)
    return ext.put_kv(*a, append, desc, list(q.shape), lse_shape, part, tiles, kc.shape[1])


def int32s(ptr: int, n: int) -> list[int]:
    """``n`` int32 at a host address (a kept CPU tensor's, in the test mode)."""
    import ctypes

    return list((ctypes.c_int32 * n).from_address(ptr))


def test_a_planned_decoding_step_launches_with_the_calls_tensors(ext):
    ext.clear()
    ext.take_noted()
    ext.counts()
    q, kc, vc = kv_inputs()
    lens = torch.tensor([10, 20], dtype=torch.int32)
    bidx = torch.tensor([1, 0], dtype=torch.int32)
    a = kv_args(q, kc, vc, seqlens=lens, bidx=bidx)
    assert ext.kv(*a) is None  # no plan yet
    assert put_kv(ext, *a) is True and ext.kv_size() == 1
    out = ext.kv(*a)
    assert out.shape == q.shape and out.dtype == q.dtype
    (fn, grid, block, shared, params), = ext.take_noted()  # fmt: skip
    assert (fn, grid, block, shared) == (KV_FN, (1, 8, 4), 128, 2048)
    assert params[:3] == [ptr(q), ptr(kc), ptr(vc)] and params[3] == ptr(out)
    assert params[4] != 0 and params[5] != 0  # the split partials and counters
    assert params[6] == ptr(lens) and params[7] == ptr(bidx)  # the call's own, unconverted
    assert ext.counts()[3] == 1
    assert ext.kv(*kv_args(q, kc, vc, seqlens=lens, bidx=bidx, lse=True)) is None  # another key
    put_kv(ext, *kv_args(q, kc, vc, seqlens=lens, bidx=bidx, lse=True))
    out, lse = ext.kv(*kv_args(q, kc, vc, seqlens=lens, bidx=bidx, lse=True))
    assert lse.shape == (2, 8, 1) and lse.dtype == torch.float32
    assert ext.take_noted()[0][4][4] == ptr(lse)


def test_a_step_with_new_keys_updates_the_cache_then_attends(ext):
    """The update's launch gets the new keys, the rotary tables, the call's lengths and fresh
    rotated queries and lengths; the attention's then reads those two."""
    ext.clear()
    ext.take_noted()
    q, kc, vc = kv_inputs()
    k, v = torch.randn(2, 1, 2, 16), torch.randn(2, 1, 2, 16)
    cos, sin = torch.randn(64, 8), torch.randn(64, 8)
    lens = torch.tensor([10, 20], dtype=torch.int32)
    pad = torch.tensor([2, 0], dtype=torch.int32)
    a = kv_args(q, kc, vc, k, v, cos, sin, seqlens=lens, leftpad=pad, causal=True)
    assert put_kv(ext, *a) is True
    out = ext.kv(*a)
    (fa, *_, pa), (fk, *_, pk) = ext.take_noted()  # fmt: skip
    assert (fa, fk) == (APPEND_FN, KV_FN)
    assert pa[:5] == [ptr(q), ptr(k), ptr(v), ptr(kc), ptr(vc)]
    q_rot, lengths = pa[5], pa[7]
    assert q_rot not in (0, ptr(q)) and pa[6] == ptr(lens) and pa[8] == ptr(pad)
    assert lengths not in (0, ptr(lens)) and pa[9:11] == [ptr(cos), ptr(sin)]
    assert pk[0] == q_rot and pk[3] == ptr(out) and pk[6] == lengths and pk[7] == ptr(pad)
    ext.kv(*a)  # fresh rotated queries and lengths each step
    (_, *_, pa2), _ = ext.take_noted()  # fmt: skip
    assert pa2[7] != 0
    without = kv_args(q, kc, vc, k, v, seqlens=lens, causal=True)
    assert put_kv(ext, *without) is True
    ext.kv(*without)
    (_, *_, pa), (_, *_, pk) = ext.take_noted()  # fmt: skip
    assert pk[0] == ptr(q) and pk[6] == pa[6]  # no rotary: the call's q; the fresh lengths


def test_whole_cache_lengths_and_split_scratch_are_kept(ext):
    """Without cache_seqlens every sequence is the whole cache: a kept int32 tensor of the rows
    count; the split partials and the zeroed counters are kept too, so a decoding loop allocates
    and fills them once (attnforge_kernels/api/kvcache.py's _SCRATCH does the same for the Python
    path)."""
    ext.clear()
    ext.take_noted()
    q, kc, vc = kv_inputs(b=3, rows=48)
    a = kv_args(q, kc, vc)
    put_kv(ext, *a, splits=4, tiles=6)
    ext.kv(*a)
    ext.kv(*a)
    first, second = (n[4] for n in ext.take_noted())
    assert first[4:7] == second[4:7] and 0 not in first[4:7]  # part, count, lengths kept
    assert int32s(first[6], 3) == [48, 48, 48]
    assert int32s(first[5], 6) == [0] * 6
    other = kv_inputs(b=3, rows=96)
    put_kv(ext, *kv_args(*other), splits=4, tiles=6)
    ext.kv(*kv_args(*other))
    (_, _, _, _, third), = ext.take_noted()  # fmt: skip
    assert third[4:6] == first[4:6]  # the same scratch shape: the same buffers
    assert int32s(third[6], 3) == [96, 96, 96]


def test_the_kv_key_separates_what_the_python_key_does(ext):
    ext.clear()
    q, kc, vc = kv_inputs()
    lens = torch.tensor([10, 20], dtype=torch.int32)
    k, v = torch.randn(2, 1, 2, 16), torch.randn(2, 1, 2, 16)
    cos, sin = torch.randn(64, 8), torch.randn(64, 8)
    put_kv(ext, *kv_args(q, kc, vc, seqlens=lens))
    put_kv(ext, *kv_args(q, kc, vc, k, v, cos, sin, seqlens=lens))
    assert ext.kv(*kv_args(q, kc, vc, seqlens=lens)) is not None
    assert ext.kv(*kv_args(q, kc, vc, k, v, cos, sin, seqlens=lens)) is not None
    misses = [
        kv_args(q, kc, vc),  # whole cache against given lengths
        kv_args(q, kc, vc, seqlens=lens, scale=0.5),
        kv_args(q, kc, vc, seqlens=lens, causal=True),
        kv_args(q, kc, vc, seqlens=lens, left=8),
        kv_args(q, kc, vc, seqlens=lens, softcap=30.0),
        kv_args(q, kc, vc, seqlens=lens, splits=3),
        kv_args(q, kc, vc, seqlens=lens, token=2),
        kv_args(q.half(), kc.half(), vc.half(), seqlens=lens),
        kv_args(q, kc[:, :32], vc[:, :32], seqlens=lens),  # strides the same, rows fewer
        kv_args(q, kc, kc, seqlens=lens),  # one tensor twice
        kv_args(q, kc, vc, k, v, seqlens=lens),  # no rotary
        kv_args(q, kc, vc, k, v, cos, sin, seqlens=lens, interleaved=False),
        kv_args(q, kc, vc, k[:, :, :1], v[:, :, :1], cos, sin, seqlens=lens),
    ]
    for a in misses:
        assert ext.kv(*a) is None
    ext.take_noted()


def test_put_kv_refuses_steps_python_would_pass_other_tensors(ext):
    ext.clear()
    q, kc, vc = kv_inputs()
    lens = torch.tensor([10, 20], dtype=torch.int32)
    k, v = torch.randn(2, 1, 2, 16), torch.randn(2, 1, 2, 16)
    strided = torch.randn(2, 1, 8, 32)[..., ::2]
    refused = [
        kv_args(q, kc, vc, seqlens=lens.long()),  # Python converts it to int32
        kv_args(strided, kc, vc),  # Python makes q contiguous
        kv_args(q, kc, vc, seqlens=lens, leftpad=lens),  # Python subtracts the padding
        kv_args(q, kc, vc, torch.randn(2, 1, 2, 32)[..., ::2], v, seqlens=lens),
    ]
    for a in refused:
        assert put_kv(ext, *a) is False
    assert ext.kv_size() == 0
    bad = list(kv_desc())
    bad[5] = [(0, 9)]  # k_start where the step has no padding
    with pytest.raises(RuntimeError, match="reads tensor 9"):
        ext.put_kv(*kv_args(q, kc, vc), None, tuple(bad), list(q.shape), [], 0, 0, 64)
    bad = list(append_desc())
    bad[5] = [(0, 11)]  # cos where the step has no rotary
    with pytest.raises(RuntimeError, match="update reads tensor 11"):
        ext.put_kv(*kv_args(q, kc, vc, k, v, seqlens=lens), tuple(bad), kv_desc(split=False),
                   list(q.shape), [], 0, 0, 64)  # fmt: skip


def test_the_decoding_path_hands_its_plans_over(ext, monkeypatch):
    """The glue in attnforge_kernels/api/kvcache.py: a step the native path misses replays the
    Python plan and hands it over; the next is native; a step with new keys likewise, with its
    update."""
    from attnforge_kernels.api import kvcache

    monkeypatch.setattr(launch, "ENABLED", True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv("ATTNFORGE_KERNELS_AUTOTUNE", raising=False)
    monkeypatch.setattr(_native, "_mod", ext)
    monkeypatch.setattr(_native, "_state", "active")
    ext.clear()
    launch.clear()
    ext.take_noted()
    ext.counts()
    try:
        q, kc, vc = (t.half() for t in kv_inputs())
        lens = torch.tensor([10, 20], dtype=torch.int32)

        def plan_for(**kw):
            tensors = (q, kc, vc, kw.get("k"), kw.get("v"), None, None, lens, None, None, None)
            values = (None, None, False, (-1, -1), 0.0, True, 0, False)
            call = kvcache._decide(*tensors, None, False, (-1, -1), 0.0, True, None, 0, False)
            fill = Fill(kv_desc(), t3=2.0)
            plan = kvcache.KVPlan(call, fill, (4, 4, 16, 256), ())
            launch.KVCACHE.put(launch.call_key("kv", tensors, values), plan)
            return plan, fill

        plan, fill = plan_for()
        monkeypatch.setattr(kvcache.KVPlan, "replay", _replay_with(fill))
        out = kvcache.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
        assert fill.calls == 1 and torch.all(out == 2.0) and plan.native is True
        assert ext.kv_size() == 1 and ext.counts()[3] == 0
        out = kvcache.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
        assert fill.calls == 1 and ext.counts()[3] == 1  # native
        assert ext.take_noted()[0][4][3] == ptr(out)

        k_new, v_new = (torch.randn(2, 1, 2, 16).half() for _ in range(2))
        plan2, fill2 = plan_for(k=k_new, v=v_new)
        update = Fill(append_desc(), t3=5.0)  # a stand-in cache update: fills the key cache
        plan2.append = update
        monkeypatch.setattr(kvcache.KVPlan, "replay", _replay_with(fill2))
        monkeypatch.setattr(kvcache.KVPlan, "replay_append", _replay_append)
        kvcache.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens)
        assert update.calls == fill2.calls == 1 and torch.all(kc == 5.0) and plan2.native
        assert ext.counts()[3] == 0
        kvcache.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens)
        assert update.calls == fill2.calls == 1 and ext.counts()[3] == 1  # native
        assert [n[0] for n in ext.take_noted()] == [APPEND_FN, KV_FN]
    finally:
        launch.clear()
        ext.clear()


def _replay_with(fill):
    """KVPlan.replay with the stand-in launch: the call's 13 pointer tensors, as the real one
    builds them (the split scratch is Python's own, not the native path's)."""

    def replay(self, q, k_cache, v_cache, out, lse, seqlens_k, k_start, block_table, batch_idx):
        fill(None, (q, k_cache, v_cache, out, lse, None, None, None, seqlens_k, k_start,
                    block_table, batch_idx, None))  # fmt: skip
        return True

    return replay


def _replay_append(self, pointers):
    self.append(None, pointers)
    return True


def test_the_build_runs_as_a_file_beside_the_source_and_the_loader_finds_its_module(tmp_path):
    # dockerfiles/validate.Dockerfile compiles the extension before the packages are in the image:
    # native_build.py run as a file, with replay.cpp beside it and nothing else.
    alone = tmp_path / "native-src"
    alone.mkdir()
    launch_dir = Path(ROOT) / "attnforge_kernels" / "launch"
    for name in ("native_build.py", "replay.cpp"):
        shutil.copy(launch_dir / name, alone / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(CXX=str(_fake_cxx(tmp_path)), ATTNFORGE_NATIVE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, str(alone / "native_build.py")], capture_output=True,
                       text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    built = Path(r.stdout.strip())
    assert built.parent == tmp_path / "cache" and built.read_text() == "built\n"
    # The packages' loader, later in the image, asks for the same module and compiles nothing.
    code = "from attnforge_kernels.launch import replay; print(replay.build(quiet=True))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(env, PYTHONPATH=ROOT), cwd=ROOT)  # fmt: skip
    assert r.returncode == 0 and Path(r.stdout.strip()) == built, r.stderr
    assert (tmp_path / "calls").read_text() == "x\n"
    # A compiler that fails: exit status 1 and the compiler's error line, as the layer's echo expects.
    bad = tmp_path / "bad"
    bad.write_text("#!/bin/sh\necho 'replay.cpp:1:1: error: planted' >&2\nexit 1\n")
    bad.chmod(0o755)
    env.update(CXX=str(bad), ATTNFORGE_NATIVE_DIR=str(tmp_path / "cache2"))
    r = subprocess.run([sys.executable, str(alone / "native_build.py")], capture_output=True,
                       text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 1 and "error: planted" in r.stderr and not r.stdout


def test_the_build_needs_nothing_of_the_packages_and_the_layer_builds_before_copying_them():
    import ast

    tree = ast.parse((Path(ROOT) / "attnforge_kernels/launch/native_build.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}  # fmt: skip
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and not n.level}  # fmt: skip
    relative = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    assert not relative and imported - set(sys.stdlib_module_names) == {"torch"}, imported
    dockerfile = (Path(ROOT) / "dockerfiles/validate.Dockerfile").read_text()
    build = dockerfile.index("python3 /opt/attnforge/native-src/native_build.py")
    assert dockerfile.index("COPY attnforge_kernels/launch/native_build.py") < build
    assert build < dockerfile.index("COPY attnforge_kernels /opt/attnforge/src/attnforge_kernels")
    assert build < dockerfile.index("COPY validate ")
