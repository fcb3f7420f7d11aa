"""The SDPA case grid (standard library only, so the parent can plan without torch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

# SDPA's backends, most specific first (a profile showing several ops names the first).
BACKENDS = ("flash", "efficient", "cudnn", "math")


@dataclass(frozen=True)
class Case:
    """One SDPA input configuration: (batch, heads, seqlen, head_dim) tensors."""

    name: str
    dtype: str
    causal: bool
    head_dim: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    batch: int = 2

    @property
    def gqa(self) -> bool:
        return self.heads_q != self.heads_kv

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "gqa": self.gqa}


# fp16/bf16, causal or not, head dims 64/128 plus odd ones, GQA, aligned and unaligned seqlens.
GRID = (
    Case("fp16-d64-s512", "fp16", False, 64, 8, 8, 512, 512),
    Case("bf16-d64-s512-causal", "bf16", True, 64, 8, 8, 512, 512),
    Case("fp16-d128-s1024-causal", "fp16", True, 128, 8, 8, 1024, 1024),
    Case("bf16-d128-s1000", "bf16", False, 128, 8, 8, 1000, 1000),
    Case("fp16-d72-s384", "fp16", False, 72, 8, 8, 384, 384),
    Case("fp16-d33-s77", "fp16", False, 33, 4, 4, 77, 77),
    Case("bf16-d128-s512-gqa4-causal", "bf16", True, 128, 8, 2, 512, 512),
    Case("fp16-d64-q129-k257", "fp16", False, 64, 8, 8, 129, 257),
    # ViT (80) and SD (96) head dims, reported slow or failing on gfx1151; 256, the largest
    # flash-attention supports (Gemma, some diffusion models).
    Case("fp16-d80-s1024", "fp16", False, 80, 12, 12, 1024, 1024),
    Case("bf16-d96-s512", "bf16", False, 96, 8, 8, 512, 512),
    Case("bf16-d256-s512-causal", "bf16", True, 256, 4, 4, 512, 512),
)
QUICK = ("fp16-d64-s512", "bf16-d128-s512-gqa4-causal", "fp16-d33-s77")
REFERENCE_CASE = "fp16-d64-s512"
CPU_MAX_SEQLEN = 256


def grid(quick: bool) -> list[Case]:
    """The cases to run; ``quick`` keeps the reference, a GQA and an odd-head-dim case."""
    return [c for c in GRID if not quick or c.name in QUICK]


def for_cpu(case: Case) -> Case:
    """The same case with sequence lengths capped, so CPU torch stays quick."""
    longest = max(case.seqlen_q, case.seqlen_k)
    if longest <= CPU_MAX_SEQLEN:
        return case
    ratio = CPU_MAX_SEQLEN / longest
    return replace(
        case,
        seqlen_q=max(1, int(case.seqlen_q * ratio)),
        seqlen_k=max(1, int(case.seqlen_k * ratio)),
    )
