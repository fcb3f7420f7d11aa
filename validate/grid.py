"""The SDPA case grid (standard library only, so the parent can plan without torch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from contract.names import SDPA_BACKENDS

# SDPA's backends, most specific first (a profile showing several ops names the first).
BACKENDS = SDPA_BACKENDS


# How a case's tensors are laid out in memory (validate.checks.numerics.make_inputs).
LAYOUTS = {
    "bhsd": "contiguous (batch, heads, seqlen, head_dim)",
    "bshd": "q, k, v made as (batch, seqlen, heads, head_dim) and transposed to (B, H, S, D) "
    "views, as diffusers' and transformers' attention modules pass them",
    "v-strided": "only V is a transposed (B, S, H, D) view; q and k are contiguous",
    "kv-expanded": "one key/value head expanded (stride 0) to every query head, passed without "
    "enable_gqa, as code that broadcasts K/V for grouped-query attention does",
}
# The attention mask a case passes (validate.checks.numerics.make_mask); None: is_causal only.
MASKS = {
    "bool-padding": "a boolean (B, 1, 1, Sk) key-padding mask, True = attend; batch 1 pads its "
    "last quarter of keys (text encoders' padded prompts)",
    "float-additive": "an additive (B, 1, Sq, Sk) mask in the input dtype: a random bias, and the "
    "dtype's most negative value on batch 1's last quarter of keys (transformers' convention)",
}
# Input magnitudes (validate.checks.numerics.make_inputs).
VALUES = {
    "normal": "standard normal q, k, v",
    "big-logits": "q and k scaled so that the scaled logits q.k/sqrt(d) reach about 1e4",
    "big-v": "V scaled to a norm of about 1e4 per element",
}


@dataclass(frozen=True)
class Case:
    """One SDPA input configuration: (batch, heads, seqlen, head_dim) tensors, their layout,
    mask and magnitudes, and why the case is in the grid."""

    name: str
    dtype: str
    causal: bool
    head_dim: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    batch: int = 2
    layout: str = "bhsd"
    mask: str | None = None
    values: str = "normal"
    why: str = ""

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS or self.values not in VALUES:
            raise ValueError(f"case {self.name}: unknown layout or values")
        if self.mask is not None and self.mask not in MASKS:
            raise ValueError(f"case {self.name}: unknown mask {self.mask!r}")
        if self.layout == "kv-expanded" and self.heads_kv != 1:
            raise ValueError(f"case {self.name}: kv-expanded expands one key/value head")

    @property
    def gqa(self) -> bool:
        """Whether SDPA is called with enable_gqa=True (fewer key/value heads than query heads)."""
        return self.heads_q != self.heads_kv and self.layout != "kv-expanded"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "gqa": self.gqa}


def _case(name: str, dtype: str, causal: bool, d: int, hq: int, hkv: int, sq: int, sk: int,
          why: str, **kw: Any) -> Case:  # fmt: skip
    return Case(name, dtype, causal, d, hq, hkv, sq, sk, why=why, **kw)


# Sequence lengths of the tiny causal cases (ROCm/TheRock#7407 reported 8): one token (a decode
# step), the reported 8, and 16, the end of the range below any tile.
TINY_CAUSAL_SEQLENS = (1, 8, 16)

# The one table of SDPA cases: each says why it is here. Cases with an upstream report name it.
GRID = (
    _case(
        "fp16-d64-s512",
        "fp16",
        False,
        64,
        8,
        8,
        512,
        512,
        "the reference case: the stack's expectations (sdpa.*) are read from it",
    ),
    _case(
        "bf16-d64-s512-causal",
        "bf16",
        True,
        64,
        8,
        8,
        512,
        512,
        "bf16 with the causal mask at a tile-aligned length",
    ),
    _case(
        "fp16-d128-s1024-causal",
        "fp16",
        True,
        128,
        8,
        8,
        1024,
        1024,
        "head dim 128, the LLM and MMDiT size, causal at a longer sequence",
    ),
    _case(
        "bf16-d128-s1000",
        "bf16",
        False,
        128,
        8,
        8,
        1000,
        1000,
        "a sequence length off every tile boundary",
    ),
    _case(
        "fp16-d72-s384",
        "fp16",
        False,
        72,
        8,
        8,
        384,
        384,
        "ViT head dim 72, which falls back to math on gfx1151 (ROCm/ATOM#1357, aiter#4065)",
    ),
    _case(
        "fp16-d33-s77",
        "fp16",
        False,
        33,
        4,
        4,
        77,
        77,
        "an odd head dim and CLIP's 77 tokens: fused backends must refuse or pad correctly",
    ),
    _case(
        "bf16-d128-s512-gqa4-causal",
        "bf16",
        True,
        128,
        8,
        2,
        512,
        512,
        "grouped-query attention through enable_gqa=True (Llama-style 4:1)",
    ),
    _case(
        "fp16-d64-q129-k257",
        "fp16",
        False,
        64,
        8,
        8,
        129,
        257,
        "different query and key lengths, neither a tile multiple",
    ),
    _case(
        "fp16-d80-s1024",
        "fp16",
        False,
        80,
        12,
        12,
        1024,
        1024,
        "ViT-L head dim 80, reported slow or failing on gfx1151",
    ),
    _case(
        "bf16-d96-s512",
        "bf16",
        False,
        96,
        8,
        8,
        512,
        512,
        "head dim 96 (SD 2.x), not a power of two",
    ),
    _case(
        "bf16-d256-s512-causal",
        "bf16",
        True,
        256,
        4,
        4,
        512,
        512,
        "256, the largest head dim flash-attention supports (Gemma, some diffusion models)",
    ),
    # Layouts apps pass (issue: wrong values arrive with strides, not with contiguous tensors).
    _case(
        "bf16-d64-s384-bshd",
        "bf16",
        False,
        64,
        8,
        8,
        384,
        384,
        "q, k, v as (B,S,H,D) transposed to (B,H,S,D) views, as diffusers and transformers "
        "pass them",
        layout="bshd",
    ),
    _case(
        "fp16-d128-s256-v-strided",
        "fp16",
        False,
        128,
        8,
        8,
        256,
        256,
        "a non-contiguous V alone, which gave wrong values on MI300X (ROCm/pytorch#3230)",
        layout="v-strided",
    ),
    _case(
        "bf16-d128-s256-mqa-expanded-causal",
        "bf16",
        True,
        128,
        8,
        1,
        256,
        256,
        "one K/V head expanded to every query head (stride 0), without enable_gqa",
        layout="kv-expanded",
    ),
    # Masks: which backends accept them is recorded; the ones that accept are judged.
    _case(
        "fp16-d64-s256-bool-padding",
        "fp16",
        False,
        64,
        8,
        8,
        256,
        256,
        "a boolean key-padding mask (padded prompts in text encoders)",
        mask="bool-padding",
    ),
    _case(
        "bf16-d64-q1024-k77-float-mask",
        "bf16",
        False,
        64,
        8,
        8,
        1024,
        77,
        "an additive float mask on SD-style cross-attention to 77 text tokens",
        mask="float-additive",
    ),
    # Head dim 512: torch refuses it on gfx11 (pytorch#194280) since it silently saturated to
    # 512.0 on gfx1151 (pytorch#189849); where recipes/arches.yaml says so the refusal is expected.
    _case(
        "bf16-d512-s256",
        "bf16",
        False,
        512,
        4,
        4,
        256,
        256,
        "head dim 512: refused on gfx11 (pytorch#194280) after silent saturation on gfx1151 "
        "(pytorch#189849); judged wherever a backend accepts it",
    ),
    # Head dim 384: Wan 2.2's VAE attention came out silently corrupted on gfx1100
    # (vllm-project/vllm-omni#7484). Above gfx11's 256 (recipes/arches.yaml sdpa_limits), so a
    # torch with pytorch#194280 refuses it there as expected; anywhere a backend accepts it, it is
    # judged.
    _case(
        "bf16-d384-s1024-h1",
        "bf16",
        False,
        384,
        1,
        1,
        1024,
        1024,
        "head dim 384, the single-head attention of Wan 2.2's VAE, silently corrupted on gfx1100 "
        "(vllm-project/vllm-omni#7484); refused on gfx11 as head dim 512 is, judged elsewhere",
    ),
    # Tiny causal sequences: a deferred hipErrorInvalidValue after causal bf16 SDPA at
    # (1,16,8,128) and (1,16,512,64) with the experimental AOTriton gate on (ROCm/TheRock#7407).
    # Every case runs a checked op after its default and forced runs, so such a fault is
    # charged to the case (and the backend) that left it.
    *(
        _case(
            f"bf16-d128-s{n}-b1-h16-causal",
            "bf16",
            True,
            128,
            16,
            16,
            n,
            n,
            f"causal bf16 at sequence length {n}: a deferred hipErrorInvalidValue followed causal "
            "bf16 SDPA at (1,16,8,128) (ROCm/TheRock#7407)",
            batch=1,
        )
        for n in TINY_CAUSAL_SEQLENS
    ),
    _case(
        "bf16-d64-s512-b1-h16-causal",
        "bf16",
        True,
        64,
        16,
        16,
        512,
        512,
        "the (1,16,512,64) neighbour of the tiny causal cases, reported with them "
        "(ROCm/TheRock#7407)",
        batch=1,
    ),
    # Large magnitudes: NaN/Inf anywhere fails, naming the backend.
    _case(
        "bf16-d128-s512-big-logits",
        "bf16",
        False,
        128,
        8,
        8,
        512,
        512,
        "bf16 logits of about 1e4: softmax's running maximum must keep them finite",
        values="big-logits",
    ),
    _case(
        "bf16-d128-s512-big-v",
        "bf16",
        True,
        128,
        8,
        8,
        512,
        512,
        "large-norm V in bf16, which gave NaN from AOTriton (ROCm/aotriton#54)",
        values="big-v",
    ),
)
# --quick: coverage per second. The reference case, GQA through enable_gqa, an odd head dim, and
# one case each for the silent failures of 2026 that are cheapest to hit: a strided V, a mask, a
# head dim above gfx11's limit (384 rather than 512: the newer report, and not a power of two),
# large bf16 values, and a tiny causal sequence (the cheapest case of all) for deferred faults.
QUICK = (
    "fp16-d64-s512",
    "bf16-d128-s512-gqa4-causal",
    "fp16-d33-s77",
    "fp16-d128-s256-v-strided",
    "fp16-d64-s256-bool-padding",
    "bf16-d384-s1024-h1",
    "bf16-d128-s512-big-v",
    "bf16-d128-s8-b1-h16-causal",
)
REFERENCE_CASE = "fp16-d64-s512"
CPU_MAX_SEQLEN = 256


def grid(quick: bool) -> list[Case]:
    """The cases to run; ``quick`` keeps the QUICK ones."""
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
