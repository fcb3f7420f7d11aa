"""The exception types of the flash_attn-compatible entry points.

flash_attn's C++ extension checks its arguments with ``TORCH_CHECK``, which raises
``RuntimeError`` (Dao-AILab/flash-attention ``csrc/flash_attn/flash_api.cpp``; its tests expect
``pytest.raises(RuntimeError, match="block_table")``). Ours are more specific and keep the
Python meaning too: a bad value is a ``ValueError`` and a ``RuntimeError``, a bad dtype a
``TypeError`` and a ``RuntimeError``, so code written against either catches them.
``NotImplementedError`` (a feature we lack) is a ``RuntimeError`` already.
"""

from __future__ import annotations


class ArgumentError(ValueError, RuntimeError):
    """A bad argument value (shape, size, range): flash_attn raises RuntimeError for these."""


class ArgumentTypeError(TypeError, RuntimeError):
    """A bad argument dtype: flash_attn raises RuntimeError for these."""
