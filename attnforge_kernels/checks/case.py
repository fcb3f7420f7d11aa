"""The one case type of the kernels' checks, and its name grammar (standard library only).

A case name encodes everything a case runs, so a case re-runs from its name alone (the
validation suite runs each in its own subprocess). Every kind shares one grammar:

    <kind>-<dtype>[-p<p>][-<pack>]-b<B>-sq<Sq>-sk<Sk>-h<Hq>x<Hk>-d<D>-<mask>[-<layout>]
        [-new<N>-rope<0|1|2>-s<splits>]

and :data:`KINDS` says, per kind, which masks and layouts it takes and which optional parts it
has: ``attn`` (forward+backward), ``dropout`` (with ``-p``), ``fp8`` (layout: the descale,
``tensor`` or ``head``), ``packed`` (the pack, ``qkv|kv|varqkv|varkv``, before ``-b``),
``kvcache`` (with ``-new-rope-s``) and ``pagedvarlen`` (layout ``page<N>``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DTYPES = ("fp16", "bf16")
WINDOW = (96, 32)  # the window mask: (left, right) in flash_attn's bottom-right convention
SOFTCAP = 30.0


@dataclass(frozen=True)
class Kind:
    """What one kind of case takes: its masks, its layouts (a regex), the name's optional parts."""

    masks: tuple[str, ...]
    layouts: str
    dropout: bool = False  # a ``-p<p>`` part after the dtype
    layout_first: bool = False  # the layout comes before ``-b`` (the pack of ``packed``)
    decode: bool = False  # a ``-new<N>-rope<R>-s<S>`` tail


_FLASH = ("full", "causal", "window")
_CACHE = ("full", "causal", "window", "alibi", "softcap")
KINDS: dict[str, Kind] = {
    "attn": Kind((*_CACHE, "sdpacausal"), "bshd|bhsd|varlen"),
    "dropout": Kind(_FLASH, "bshd|varlen", dropout=True),
    "fp8": Kind(_FLASH, "tensor|head"),
    "packed": Kind(_FLASH, "qkv|kv|varqkv|varkv", layout_first=True),
    "kvcache": Kind(_CACHE, r"contig|page\d+|leftpad|bidx", decode=True),
    "pagedvarlen": Kind(_CACHE, r"page\d+"),
}


def _pattern(kind: str, spec: Kind) -> re.Pattern[str]:
    layout = rf"-(?P<layout>{spec.layouts})"
    return re.compile(
        rf"^{kind}-(?P<dtype>{'|'.join(DTYPES)})"
        + (r"-p(?P<p>0\.\d+)" if spec.dropout else "")
        + (layout if spec.layout_first else "")
        + r"-b(?P<b>\d+)-sq(?P<sq>\d+)-sk(?P<sk>\d+)-h(?P<hq>\d+)x(?P<hk>\d+)-d(?P<d>\d+)"
        + rf"-(?P<mask>{'|'.join(spec.masks)})"
        + ("" if spec.layout_first else layout)
        + (r"-new(?P<new>\d+)-rope(?P<rope>[012])-s(?P<splits>\d+)" if spec.decode else "")
        + "$"
    )


_PATTERNS = {kind: _pattern(kind, spec) for kind, spec in KINDS.items()}


@dataclass(frozen=True)
class Case:
    """One check of the kernels: a kind (:data:`KINDS`), the shape, the mask and the layout."""

    kind: str
    dtype: str
    b: int
    sq: int
    sk: int
    hq: int
    hk: int
    d: int
    mask: str
    layout: str
    p: float = 0.0  # dropout probability (``dropout``)
    new: int = 0  # keys appended to the cache (``kvcache``)
    rope: int = 0  # rotary: 0 off, 1 GPT-NeoX halves, 2 interleaved pairs (``kvcache``)
    splits: int = 0  # KV splits, 0 the heuristic (``kvcache``)

    def __post_init__(self) -> None:
        spec = KINDS.get(self.kind)
        if spec is None:
            raise ValueError(f"unknown case kind {self.kind!r}; kinds: {', '.join(KINDS)}")
        if self.dtype not in DTYPES or self.mask not in spec.masks:
            raise ValueError(
                f"a {self.kind} case takes dtype {'|'.join(DTYPES)} and mask "
                f"{'|'.join(spec.masks)}, got {self.dtype!r} and {self.mask!r}"
            )
        if not re.fullmatch(spec.layouts, self.layout):
            raise ValueError(f"a {self.kind} case takes layout {spec.layouts}, got {self.layout!r}")

    @property
    def name(self) -> str:
        spec = KINDS[self.kind]
        shape = f"b{self.b}-sq{self.sq}-sk{self.sk}-h{self.hq}x{self.hk}-d{self.d}-{self.mask}"
        parts = [self.kind, self.dtype]
        if spec.dropout:
            parts.append(f"p{self.p:g}")
        if spec.layout_first:
            parts += [self.layout, shape]
        else:
            parts += [shape, self.layout]
        if spec.decode:
            parts.append(f"new{self.new}-rope{self.rope}-s{self.splits}")
        return "-".join(parts)

    @classmethod
    def parse(cls, name: str) -> Case:
        """The case a name describes (ValueError for a name of no kind)."""
        kind = name.split("-", 1)[0]
        m = _PATTERNS[kind].match(name) if kind in _PATTERNS else None
        if not m:
            raise ValueError(
                f"not a kernel check case name: {name!r} (kinds: {', '.join(KINDS)}; "
                "see attnforge_kernels/checks/case.py for the grammar)"
            )
        g = {k: v for k, v in m.groupdict().items() if v is not None}
        text = ("kind", "dtype", "mask", "layout")
        fields = {k: (v if k in text else float(v) if k == "p" else int(v)) for k, v in g.items()}
        return cls(kind=kind, **fields)

    @property
    def page(self) -> int:
        """Rows per page of a paged layout (``page<N>``), 0 for any other layout."""
        return int(self.layout[4:]) if self.layout.startswith("page") else 0

    @property
    def varlen(self) -> bool:
        """Whether the sequences are packed along one axis with ragged lengths."""
        return self.layout in ("varlen", "varqkv", "varkv")

    def mask_args(self) -> tuple[int | None, int | None, float, bool]:
        """(left, right, softcap, alibi?) in flash_attn's bottom-right convention; ``None``
        is an unbounded side."""
        if self.mask == "sdpacausal":
            return None, self.sq - self.sk, 0.0, False  # SDPA's top-left causal
        return {
            "full": (None, None, 0.0, False),
            "causal": (None, 0, 0.0, False),
            "window": (*WINDOW, 0.0, False),
            "alibi": (None, 0, 0.0, True),
            "softcap": (None, None, SOFTCAP, False),
        }[self.mask]

    def flash_args(self) -> tuple[bool, tuple[int, int], float, bool]:
        """(causal, window_size, softcap, alibi?) as flash_attn's functions take them."""
        left, right, softcap, alibi = self.mask_args()
        causal = self.mask in ("causal", "alibi")
        window = (-1, -1) if causal else (_side(left), _side(right))
        return causal, window, softcap, alibi


def _side(n: int | None) -> int:
    return -1 if n is None else n


def ragged(n: int, max_len: int) -> list[int]:
    """``n`` sequence lengths up to ``max_len``, ragged on purpose: the max, 1, something in
    between, the max minus 13 (the varlen layouts take ``ragged(b, sq)`` and the reversed
    ``ragged(b, sk)``)."""
    base = [max_len, 1, max(1, max_len // 3 + 7), max(1, max_len - 13)]
    return [min(base[i % 4], max_len) for i in range(n)]


# One constructor a kind, positional as the grids write them.


def attn(dtype, b, sq, sk, hq, hk, d, mask="full", layout="bshd") -> Case:
    return Case("attn", dtype, b, sq, sk, hq, hk, d, mask, layout)


def dropout(dtype, p, b, sq, sk, hq, hk, d, mask="full", layout="bshd") -> Case:
    return Case("dropout", dtype, b, sq, sk, hq, hk, d, mask, layout, p=p)


def fp8(dtype, b, sq, sk, hq, hk, d, mask="full", scale="tensor") -> Case:
    """``dtype`` is the output's; ``scale`` the descale, per ``tensor`` or per (batch, KV head)."""
    return Case("fp8", dtype, b, sq, sk, hq, hk, d, mask, scale)


def packed(dtype, pack, b, sq, sk, hq, hk, d, mask="full") -> Case:
    return Case("packed", dtype, b, sq, sk, hq, hk, d, mask, pack)


def kvcache(dtype, b, sq, sk, hq, hk, d, mask="causal", layout="contig", new=0, rope=0, splits=0):
    return Case("kvcache", dtype, b, sq, sk, hq, hk, d, mask, layout, new=new, rope=rope,
                splits=splits)  # fmt: skip


def paged_varlen(dtype, b, sq, sk, hq, hk, d, mask="causal", page=16) -> Case:
    return Case("pagedvarlen", dtype, b, sq, sk, hq, hk, d, mask, f"page{page}")
