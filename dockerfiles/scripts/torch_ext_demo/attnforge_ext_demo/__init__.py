"""A tiny torch C++ extension: ``torch.ops.attnforge_ext_demo.twice(x)`` returns ``2 * x``."""

from pathlib import Path

import torch

torch.ops.load_library(next(Path(__file__).parent.glob("_C*.so")))
twice = torch.ops.attnforge_ext_demo.twice
