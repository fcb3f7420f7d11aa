"""A planted deferred fault (loaded through VALIDATE_PRELUDE): the first forced flash run
"succeeds", and the next matmul in that process raises the error a fused backend leaves behind on
ROCm (pytorch#194498), as a real deferred hipErrorInvalidValue does. Only the first process that
runs a forced flash call is poisoned (a marker file says it happened), so later checks are clean.
"""

import os

import torch

MARKER = os.environ["DEFERRED_FAULT_MARKER"]
_sdpa = torch.nn.functional.scaled_dot_product_attention
_matmul = torch.Tensor.__matmul__
_poisoned = []


def _planted_sdpa(*args, **kwargs):
    out = _sdpa(*args, **kwargs)
    forced_flash = (
        torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.math_sdp_enabled()
    )
    if forced_flash and not os.path.exists(MARKER):
        open(MARKER, "w").close()
        _poisoned.append(True)
    return out


def _planted_matmul(self, other):
    if _poisoned:
        raise RuntimeError("HIP error: invalid argument (planted deferred fault)")
    return _matmul(self, other)


torch.nn.functional.scaled_dot_product_attention = _planted_sdpa
torch.Tensor.__matmul__ = _planted_matmul
