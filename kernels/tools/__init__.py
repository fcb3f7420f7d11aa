"""Tools over the kernels: the ahead-of-time compile check and its per-kernel cache key, and the
GPU benchmark (``python -m kernels.aot``, ``python -m kernels.bench``)."""
