"""GPU scenario (VALIDATE_PRELUDE): a real deferred CUDA error after the first forced flash run.

Right after SDPA returns, a runtime call with an invalid argument (cudaMemset on a bogus
pointer) leaves cudaErrorInvalidValue in the CUDA runtime's last-error slot, as a fused kernel
whose launch failed unchecked does (on ROCm: pytorch#194498's deferred hipErrorInvalidValue).
synchronize() does not report it; the next kernel launch that checks the last error does. The
suite must charge it to flash, not to whatever ran next. Only the first process that runs a
forced flash call is hit (DEFERRED_FAULT_MARKER names a marker file).
"""

import ctypes
import os

import torch

MARKER = os.environ["DEFERRED_FAULT_MARKER"]
_sdpa = torch.nn.functional.scaled_dot_product_attention


def _cudart():
    """The CUDA runtime library torch itself loaded, so the error lands in its last-error slot."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libcudart.so" in line:
                return ctypes.CDLL(line.split()[-1])
    raise RuntimeError("torch loaded no shared libcudart; this scenario cannot plant the error")


def _planted(*args, **kwargs):
    out = _sdpa(*args, **kwargs)
    only_flash = torch.backends.cuda.flash_sdp_enabled() and not (
        torch.backends.cuda.math_sdp_enabled() or torch.backends.cuda.mem_efficient_sdp_enabled()
    )
    if only_flash and out.is_cuda and not os.path.exists(MARKER):
        open(MARKER, "w").close()
        rc = _cudart().cudaMemset(ctypes.c_void_p(8), 0, ctypes.c_size_t(1 << 20))
        with open(MARKER, "w") as fh:
            fh.write(f"cudaMemset returned {rc}\n")
    return out


torch.nn.functional.scaled_dot_product_attention = _planted
