"""GPU scenario: a Triton kernel that reads far out of bounds, then a correct one.

Loaded through VALIDATE_EXTRA_CHECKS on the NVIDIA machine; top level is stdlib only.
"""

CHECKS = [
    {"id": "fault.triton_oob", "func": "triton_oob", "position": "first", "timeout": 120},
    {"id": "fault.triton_ok", "func": "triton_ok", "position": "first", "timeout": 120},
]


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def copy(x_ptr, y_ptr, n, shift, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        # No mask and a huge shift: every lane reads unmapped memory when shift != 0.
        x = tl.load(x_ptr + offs + shift)
        tl.store(y_ptr + offs, x, mask=offs < n)

    return copy


def _run(shift):
    import torch

    copy = _kernel()
    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    copy[(x.numel() // 1024,)](x, y, x.numel(), shift, BLOCK=1024)
    torch.cuda.synchronize()
    return x, y


def triton_oob(params, ctx):
    ctx.progress("launching an out-of-bounds Triton kernel")
    _run(1 << 40)
    return {"status": "pass", "message": "the out-of-bounds read did not fault"}


def triton_ok(params, ctx):
    ctx.progress("launching a correct Triton kernel")
    x, y = _run(0)
    ok = bool((x == y).all().item())
    return {
        "status": "pass" if ok else "fail",
        "message": "copy kernel matches" if ok else "copy mismatch",
    }
