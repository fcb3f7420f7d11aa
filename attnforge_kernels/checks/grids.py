"""The kernels' check grids: every case list, as data (standard library only).

The GPU grids (``attention``, ``variants``, ``kvcache``; ``quick`` the short lists the
validation suite runs), the small boundary shapes for compute-sanitizer (``*_boundary``), and the
interpreter's (``cpu`` for the tests, ``interpreter`` for the validation suite without a GPU).
"""

from __future__ import annotations

from .case import Case, attn, dropout, fp8, kvcache, packed, paged_varlen


def attention_grid(quick: bool) -> list[Case]:
    """The GPU grid's forward+backward cases (the short list when ``quick``)."""
    if quick:
        return [
            attn("bf16", 1, 129, 129, 2, 2, 128, "full"),
            attn("bf16", 1, 129, 129, 2, 2, 128, "causal"),
            attn("fp16", 2, 17, 1000, 4, 2, 64, "causal"),
            attn("bf16", 1, 1000, 17, 4, 1, 80, "causal"),
            attn("bf16", 1, 6889, 6889, 1, 1, 128, "full", "bhsd"),
            attn("fp16", 2, 127, 255, 2, 2, 40, "full"),
            attn("bf16", 1, 300, 300, 2, 2, 256, "causal"),
            attn("bf16", 3, 300, 500, 4, 2, 128, "causal", "varlen"),
            attn("bf16", 2, 500, 400, 2, 2, 64, "window"),
            attn("bf16", 1, 333, 333, 2, 2, 64, "alibi"),
            attn("bf16", 1, 333, 333, 2, 2, 128, "softcap"),
        ]
    cases: list[Case] = []
    for s in (1, 17, 127, 128, 129, 1000, 4096, 6032, 6889):
        for d in (64, 128):
            for mask in ("full", "causal"):
                cases.append(attn("bf16", 1, s, s, 2, 2, d, mask))
    for d in (40, 72, 80, 96, 160, 256):
        for mask in ("full", "causal"):
            cases.append(attn("bf16", 2, 129, 129, 2, 2, d, mask))
            cases.append(attn("fp16", 1, 1000, 1000, 2, 1, d, mask))
    for hq, hk in ((8, 1), (8, 2), (6, 3), (4, 4)):
        cases.append(attn("bf16", 2, 257, 1000, hq, hk, 128, "causal"))
        cases.append(attn("bf16", 1, 1000, 257, hq, hk, 64, "causal"))
    for sq, sk in ((1, 1000), (1000, 1), (17, 4096), (4096, 17), (6032, 6889)):
        for mask in ("full", "causal"):
            cases.append(attn("bf16", 1, sq, sk, 2, 1, 128, mask))
    for d in (64, 128, 72):
        for mask in ("full", "causal", "window"):
            cases.append(attn("bf16", 4, 700, 900, 4, 2, d, mask, "varlen"))
    for mask in ("window", "alibi", "softcap", "sdpacausal"):
        for d in (64, 128):
            cases.append(attn("bf16", 2, 1000, 777, 4, 2, d, mask))
            cases.append(attn("fp16", 1, 129, 1000, 2, 2, d, mask))
    for mask in ("full", "causal"):
        cases.append(attn("bf16", 2, 1000, 1000, 4, 2, 128, mask, "bhsd"))
        cases.append(attn("fp16", 1, 6889, 6889, 2, 2, 128, mask, "bhsd"))
    # Grids whose last wave the Triton forward splits along the keys on a GPU of 132 SMs (H100,
    # H200; configs.tail_split), with softcap or ALiBi, which Hopper's Gluon forward leaves to
    # it: Qwen-Image 1664x928's 24 heads (2 heads in 2 parts), 68 heads of 16 tiles (2 heads in
    # 8 parts) in bhsd.
    cases.append(attn("bf16", 1, 6132, 6132, 24, 24, 128, "softcap"))
    cases.append(attn("bf16", 4, 2048, 2048, 17, 1, 128, "alibi", "bhsd"))
    return cases


def attention_boundary() -> list[Case]:
    """Small boundary shapes for compute-sanitizer: every partial-tile path, short runtime."""
    cases = []
    for s in (1, 17, 127, 129):
        for d in (40, 72, 128, 256):
            cases.append(attn("bf16", 1, s, s + 3, 2, 1, d, "causal"))
            cases.append(attn("bf16", 1, s + 5, s, 2, 2, d, "full"))
    cases += [
        attn("bf16", 1, 6032, 6032, 1, 1, 128, "full"),
        attn("bf16", 1, 6889, 6889, 1, 1, 128, "full", "bhsd"),
        attn("bf16", 3, 129, 200, 2, 1, 128, "window", "varlen"),
        attn("bf16", 3, 129, 200, 2, 1, 80, "causal", "varlen"),
        attn("bf16", 1, 129, 77, 2, 2, 64, "alibi"),
        attn("bf16", 1, 129, 77, 2, 2, 64, "softcap"),
        # The Triton forward's last wave split along the keys on 132 SMs (2 heads in 8 parts).
        attn("bf16", 4, 2048, 2048, 17, 1, 128, "softcap"),
    ]
    return cases


def cpu_grid() -> list[Case]:
    """Small shapes for Triton's CPU interpreter that still cross its 16x16 tile boundaries:
    odd lengths, Sq != Sk both ways, length 1, GQA/MQA, padded head dims, every mask and layout."""
    return [
        attn("bf16", 2, 37, 37, 2, 2, 64, "full"),
        attn("fp16", 1, 37, 37, 2, 2, 64, "causal"),
        attn("bf16", 1, 17, 70, 4, 2, 32, "causal"),
        attn("fp16", 1, 70, 17, 4, 1, 32, "causal"),
        attn("bf16", 1, 1, 1, 2, 2, 16, "causal"),
        attn("fp16", 1, 1, 45, 2, 1, 40, "full"),
        attn("bf16", 1, 45, 1, 2, 2, 72, "full"),
        attn("fp16", 1, 33, 33, 2, 2, 80, "causal", "bhsd"),
        attn("bf16", 1, 20, 20, 1, 1, 160, "full"),
        attn("fp16", 1, 18, 18, 1, 1, 256, "causal"),
        attn("bf16", 3, 40, 50, 4, 2, 32, "causal", "varlen"),
        attn("fp16", 3, 40, 50, 4, 1, 40, "window", "varlen"),
        attn("bf16", 2, 50, 40, 2, 2, 32, "window"),
        attn("fp16", 1, 45, 33, 2, 2, 32, "alibi"),
        attn("bf16", 1, 45, 33, 2, 2, 32, "softcap"),
        attn("fp16", 1, 20, 45, 2, 2, 32, "sdpacausal"),
        attn("bf16", 1, 45, 20, 2, 2, 32, "sdpacausal"),
    ]


def interpreter_grid() -> list[Case]:
    """What the validation suite runs in the interpreter (no GPU: the cpu stack), a few seconds
    in all: causal with GQA, varlen with a window, MQA and a padded head dim, ALiBi, softcap;
    forward and backward, lengths that leave a partial 16-row tile."""
    return [
        attn("bf16", 1, 19, 23, 4, 2, 32, "causal"),
        attn("fp16", 2, 17, 21, 2, 1, 40, "window", "varlen"),
        attn("bf16", 1, 17, 19, 2, 2, 16, "alibi"),
        attn("fp16", 1, 19, 17, 2, 2, 16, "softcap"),
    ]


def variant_grid(quick: bool) -> list[Case]:
    """The GPU grid's dropout and FP8 cases (the short list when ``quick``)."""
    if quick:
        return [
            dropout("bf16", 0.17, 2, 257, 257, 4, 2, 128, "causal"),
            dropout("fp16", 0.1, 3, 200, 300, 2, 1, 64, "window", "varlen"),
            fp8("bf16", 2, 1000, 1000, 4, 2, 128, "causal", "head"),
            fp8("fp16", 1, 129, 77, 2, 2, 64, "full", "tensor"),
        ]
    cases: list[Case] = []
    for s in (1, 17, 128, 129, 1000, 2048):
        for d in (64, 128):
            for mask in ("full", "causal"):
                cases.append(dropout("bf16", 0.17, 2, s, s, 2, 2, d, mask))
    for d in (40, 80, 256):
        cases.append(dropout("fp16", 0.17, 1, 300, 300, 2, 1, d, "causal"))
    for sq, sk in ((1, 500), (500, 1), (129, 777), (777, 129)):
        cases.append(dropout("bf16", 0.3, 1, sq, sk, 4, 2, 128, "causal"))
    for mask in ("full", "causal", "window"):
        cases.append(dropout("bf16", 0.17, 4, 700, 900, 4, 2, 128, mask, "varlen"))
    cases.append(dropout("bf16", 0.5, 2, 1000, 1000, 8, 1, 64, "window"))
    for s in (1, 17, 128, 1000, 4096):
        for d in (64, 128):
            for mask in ("full", "causal"):
                cases.append(fp8("bf16", 1, s, s, 4, 2, d, mask, "head"))
    for d in (40, 96, 256):
        cases.append(fp8("fp16", 2, 333, 500, 2, 2, d, "causal", "tensor"))
    for sq, sk in ((1, 1000), (1000, 1), (777, 129)):
        cases.append(fp8("bf16", 2, sq, sk, 8, 2, 128, "causal", "head"))
    cases.append(fp8("bf16", 2, 1000, 777, 4, 2, 64, "window", "tensor"))
    return cases


def variant_boundary() -> list[Case]:
    """Small boundary shapes for compute-sanitizer: partial tiles of every variant kernel."""
    cases: list[Case] = []
    for s in (1, 17, 129):
        for d in (40, 128):
            cases.append(dropout("bf16", 0.17, 1, s, s + 3, 2, 1, d, "causal"))
            cases.append(dropout("bf16", 0.17, 1, s + 5, s, 2, 2, d, "full"))
            cases.append(fp8("bf16", 1, s, s + 3, 2, 1, d, "causal", "head"))
            cases.append(fp8("fp16", 1, s + 5, s, 2, 2, d, "full", "tensor"))
    cases.append(dropout("bf16", 0.17, 3, 129, 200, 2, 1, 80, "window", "varlen"))
    return cases


def kvcache_grid(quick: bool) -> list[Case]:
    """The GPU grid: every packed form; decoding and chunked prefill against contiguous and
    paged caches (pages of 16 and 256 rows), with and without append and rotary, each mask,
    GQA/MQA, split counts 1, the heuristic and 7; paged varlen prefill."""
    if quick:
        return [
            packed("bf16", "qkv", 2, 1000, 1000, 4, 4, 128, "causal"),
            packed("bf16", "varkv", 3, 700, 900, 8, 2, 64, "causal"),
            kvcache("bf16", 4, 1, 4096, 32, 8, 128, "causal", "page256", 1, 1, 0),
            kvcache("fp16", 2, 64, 800, 8, 2, 128, "causal", "contig", 64, 2, 1),
            paged_varlen("bf16", 3, 300, 900, 8, 2, 128, "causal", 16),
        ]
    cases: list[Case] = []
    for d in (64, 128):
        for mask in ("full", "causal", "window"):
            cases.append(packed("bf16", "qkv", 2, 1000, 1000, 4, 4, d, mask))
            cases.append(packed("bf16", "kv", 2, 777, 1000, 8, 2, d, mask))
            cases.append(packed("fp16", "varqkv", 3, 700, 700, 4, 4, d, mask))
            cases.append(packed("fp16", "varkv", 3, 700, 900, 8, 1, d, mask))
    cases.append(packed("bf16", "qkv", 1, 129, 129, 2, 2, 80, "causal"))
    cases.append(packed("bf16", "kv", 1, 129, 4096, 4, 2, 256, "full"))
    for layout in ("contig", "page16", "page256"):
        for sk in (128, 339, 4096, 16384):
            for new, rope in ((0, 0), (1, 1), (1, 2)):
                cases.append(kvcache("bf16", 4, 1, sk, 32, 8, 128, "causal", layout, new, rope))
        cases.append(kvcache("fp16", 2, 3, 1024, 16, 16, 64, "causal", layout, 3, 1, 1))
        cases.append(kvcache("bf16", 2, 64, 800, 8, 2, 128, "causal", layout, 64, 2, 0))
        cases.append(kvcache("bf16", 2, 16, 20000, 8, 1, 128, "window", layout, 16, 1, 7))
        for mask in ("full", "alibi", "softcap"):
            cases.append(kvcache("bf16", 3, 4, 2048, 8, 2, 64, mask, layout, 4, 0, 0))
    for layout in ("leftpad", "bidx"):
        cases.append(kvcache("bf16", 4, 1, 4096, 32, 8, 128, "causal", layout, 1, 1, 0))
        cases.append(kvcache("fp16", 2, 5, 700, 8, 2, 64, "window", layout, 5, 2, 3))
    for d in (40, 80, 96, 256):
        cases.append(kvcache("bf16", 2, 1, 2048, 8, 2, d, "causal", "page16", 1, 0, 0))
    for s in (1, 7, 64):
        cases.append(kvcache("bf16", 1, 1, 16384, 8, 8, 128, "causal", "page256", 0, 0, s))
    for mask in ("causal", "window", "alibi", "softcap"):
        cases.append(paged_varlen("bf16", 3, 300, 900, 8, 2, 128, mask, 16))
        cases.append(paged_varlen("fp16", 2, 1000, 1000, 4, 4, 64, mask, 256))
    return cases


def kvcache_boundary() -> list[Case]:
    """Small shapes for compute-sanitizer: partial pages and tiles, length 1, every layout."""
    cases: list[Case] = [
        packed("bf16", "qkv", 1, 17, 17, 2, 2, 40, "causal"),
        packed("bf16", "kv", 1, 17, 129, 4, 1, 72, "full"),
        packed("bf16", "varqkv", 3, 129, 129, 2, 2, 128, "causal"),
        packed("bf16", "varkv", 3, 33, 77, 4, 2, 256, "window"),
    ]
    for sk in (1, 17, 129):
        for layout in ("contig", "page16", "leftpad", "bidx"):
            new = 1 if sk > 1 else 0
            cases.append(kvcache("bf16", 3, 1, sk, 4, 1, 72, "causal", layout, new, 1, 3))
        cases.append(kvcache("bf16", 2, 3, sk + 3, 4, 2, 256, "window", "page16", 3, 2, 0))
    cases += [
        kvcache("bf16", 2, 7, 300, 8, 2, 40, "alibi", "page256", 7, 0, 5),
        paged_varlen("bf16", 3, 17, 129, 4, 2, 72, "causal", 16),
        paged_varlen("bf16", 3, 129, 77, 2, 2, 256, "softcap", 16),
    ]
    return cases
