"""In-image validation of attention stacks: ``python -m validate [command] [options]``.

Imports only the standard library at package level; torch, triton, flash_attn and the
sibling ``kernels`` package are imported inside the check subprocesses.
"""

__version__ = "0.1.0"
SCHEMA_VERSION = "1.2"
