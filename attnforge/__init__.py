"""attnforge: layered, validated container images for AMD ROCm attention stacks."""

__version__ = "0.1.0"
