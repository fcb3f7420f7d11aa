"""argparse types the tool commands share (standard library only: the parser has no torch)."""

from __future__ import annotations

import argparse


def positive_int(text: str, too_small: str = "must be at least 1") -> int:
    """A whole number of at least 1 (iterations, repeats, steps, workers); ``too_small`` is the
    message for 0 and below."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(too_small)
    return value


def seconds(text: str, too_small: str = "must be more than 0 seconds") -> float:
    """A number of seconds above 0 (timeouts); ``too_small`` is the message for 0 and below."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(too_small)
    return value
