"""Fault-injection checks for the tests (loaded through VALIDATE_EXTRA_CHECKS).

Top level is standard library only: the parent process reads CHECKS without torch.
"""

import ctypes
import os
import time

CHECKS = [
    {"id": "fault.segfault", "func": "segfault", "position": "first"},
    {"id": "fault.abort", "func": "abort", "position": "first"},
    {"id": "fault.hang", "func": "hang", "position": "first", "timeout": 3},
    {"id": "fault.raise", "func": "raise_error", "position": "first"},
    {"id": "fault.nan", "func": "nan_output", "position": "first"},
    {"id": "fault.exit", "func": "exit_without_result", "position": "first"},
    {"id": "fault.gpu_fault_text", "func": "gpu_fault_text", "position": "first"},
    {"id": "fault.leaves_child", "func": "leaves_child", "position": "first"},
    {"id": "fault.optional_fail", "func": "raise_error", "required": False},
    {"id": "fault.ok", "func": "ok"},
]


def segfault(params, ctx):
    ctx.progress("dereferencing NULL")
    ctypes.string_at(0)
    return {"status": "pass", "message": "unreachable"}


def abort(params, ctx):
    ctx.progress("calling abort()")
    os.abort()


def hang(params, ctx):
    ctx.progress("sleeping forever")
    while True:
        time.sleep(60)


def raise_error(params, ctx):
    raise ValueError("deliberate failure from a test check")


def nan_output(params, ctx):
    from validate.checks.numerics import attention_math, judge, make_inputs
    from validate.grid import Case

    case = Case("nan", "fp16", False, 16, 2, 2, 8, 8, batch=1)
    q, k, v = make_inputs(case, "cpu")
    ref = attention_math(q, k, v, False, upcast=True)
    ref_lp = attention_math(q, k, v, False, upcast=False)
    out = ref_lp.clone()
    out[0, 0, 0, 0] = float("nan")
    j = judge(out, ref, ref_lp)
    return {"status": "pass" if j.ok else "fail", "message": j.message}


def exit_without_result(params, ctx):
    os._exit(3)


def gpu_fault_text(params, ctx):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def leaves_child(params, ctx):
    import subprocess
    import sys

    # A straggler that inherits stdout/stderr, as compile worker pools do.
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    return {"status": "pass", "message": "left a child behind"}


def ok(params, ctx):
    return {"status": "pass", "message": "fine", "metrics": {"answer": 42.0}}
