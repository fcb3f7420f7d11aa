"""attnforge's bundled Triton FlashAttention kernels (needs only torch and triton).

``flash_attn_func`` / ``flash_attn_varlen_func`` follow flash_attn's API;
``attnforge_kernels.sdpa_shim`` routes ``F.scaled_dot_product_attention`` to them on request
(``ATTNFORGE_SDPA_SHIM=1``).
"""

from __future__ import annotations

import os

from . import sdpa_shim
from .api.flash_attn import (
    _get_block_size_n,
    flash_attn_fp8_func,
    flash_attn_func,
    flash_attn_qkvpacked_fp8_func,
    flash_attn_varlen_fp8_func,
    flash_attn_varlen_func,
    flash_attn_varlen_qkvpacked_fp8_func,
)
from .api.kvcache import flash_attn_with_kvcache
from .api.packed import (
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "flash_attn_fp8_func",
    "flash_attn_varlen_fp8_func",
    "flash_attn_qkvpacked_fp8_func",
    "flash_attn_varlen_qkvpacked_fp8_func",
    "_get_block_size_n",
    "sdpa_shim",
]

if os.environ.get("ATTNFORGE_SDPA_SHIM") == "1":
    sdpa_shim.enable()
