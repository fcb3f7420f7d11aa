"""In-image validation of attention stacks: ``python -m validate [command] [options]``.

Imports only the standard library and the sibling ``contract`` package at package level; torch,
triton, flash_attn and the sibling ``attnforge_kernels`` package are imported inside the check
subprocesses.
"""

from contract.names import REPORT_SCHEMA_VERSION as SCHEMA_VERSION

__version__ = "0.1.0"
__all__ = ["SCHEMA_VERSION", "__version__"]
