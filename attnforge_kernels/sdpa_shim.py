"""``attnforge_kernels.sdpa_shim``: ``F.scaled_dot_product_attention`` routed to the bundled kernels
on request (``enable()``, or ``ATTNFORGE_SDPA_SHIM=1`` at import); ``stats()`` counts what it
routed and what fell back, and why.

The code is attnforge_kernels/api/sdpa.py; this module is the shim's public name (validation
backends, images and docs use it) and holds none.
"""

from .api.sdpa import disable, enable, enabled, reset_stats, stats

__all__ = ["disable", "enable", "enabled", "reset_stats", "stats"]
