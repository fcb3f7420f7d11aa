"""Tools over the kernels: the ahead-of-time compile check and its per-kernel cache key, and the
GPU benchmark (``python -m attnforge_kernels.aot``, ``python -m attnforge_kernels.bench``)."""
