"""Packed-input and KV-cache cases of the kernels' correctness checks (``kernels.check`` runs them).

Names encode everything a case runs, as in ``kernels.check``:

* ``packed-<dtype>-<qkv|kv|varqkv|varkv>-b..-sq..-sk..-h<hq>x<hk>-d..-<full|causal|window>``:
  forward and backward through ``flash_attn_{,varlen_}{qkv,kv}packed_func``; out and the packed
  gradient (one tensor of the pack's shape) against the fp32 reference with flash-attention's
  rule (2x for the output, 3x for gradients). ``qkv`` packs need sq = sk and hq = hk.
* ``kvcache-<dtype>-b..-sq..-sk..-h<hq>x<hk>-d..-<full|causal|window|alibi|softcap>-<contig|
  page<N>|leftpad|bidx>-new<N>-rope<0|1|2>-s<splits>``: ``flash_attn_with_kvcache`` on a cache
  of sk rows per sequence (paged: pages of N rows in shuffled blocks; leftpad / bidx: a contiguous
  cache with ``cache_leftpad`` / ``cache_batch_idx``), ragged ``cache_seqlens``, ``new`` keys
  appended in place, rotary embedding (1: GPT-NeoX halves, 2: interleaved pairs over half the
  head dim), ``splits`` KV splits (0: the heuristic). The output and LSE against the fp32
  reference on the cache as it must be after the append; the cache itself against that
  expectation (keys within one rounding of the rotary, values exact, other rows untouched).
* ``pagedvarlen-<dtype>-b..-sq..-sk..-h<hq>x<hk>-d..-<mask>-page<N>``: ``flash_attn_varlen_func``
  with ``block_table`` (paged prefill) against the reference per sequence.

The reference follows flash-attention's tests (tests/test_flash_attn.py,
test_flash_attn_kvcache): keys are the rows [leftpad, cache_seqlens + new), masks bottom-right.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from contract import tolerance

PACKED_RE = re.compile(
    r"^packed-(?P<dtype>fp16|bf16)-(?P<kind>qkv|kv|varqkv|varkv)-b(?P<b>\d+)-sq(?P<sq>\d+)"
    r"-sk(?P<sk>\d+)-h(?P<hq>\d+)x(?P<hk>\d+)-d(?P<d>\d+)-(?P<mask>full|causal|window)$"
)
KV_RE = re.compile(
    r"^kvcache-(?P<dtype>fp16|bf16)-b(?P<b>\d+)-sq(?P<sq>\d+)-sk(?P<sk>\d+)-h(?P<hq>\d+)x"
    r"(?P<hk>\d+)-d(?P<d>\d+)-(?P<mask>full|causal|window|alibi|softcap)"
    r"-(?P<layout>contig|page\d+|leftpad|bidx)-new(?P<new>\d+)-rope(?P<rope>[012])-s(?P<splits>\d+)$"
)
PV_RE = re.compile(
    r"^pagedvarlen-(?P<dtype>fp16|bf16)-b(?P<b>\d+)-sq(?P<sq>\d+)-sk(?P<sk>\d+)-h(?P<hq>\d+)x"
    r"(?P<hk>\d+)-d(?P<d>\d+)-(?P<mask>full|causal|window|alibi|softcap)-page(?P<page>\d+)$"
)
PREFIXES = ("packed-", "kvcache-", "pagedvarlen-")
WINDOW = (96, 32)  # kernels.check's window case
SOFTCAP = 30.0


@dataclass(frozen=True)
class PackedCase:
    dtype: str
    kind: str
    b: int
    sq: int
    sk: int
    hq: int
    hk: int
    d: int
    mask: str = "full"

    @property
    def name(self) -> str:
        return (
            f"packed-{self.dtype}-{self.kind}-b{self.b}-sq{self.sq}-sk{self.sk}"
            f"-h{self.hq}x{self.hk}-d{self.d}-{self.mask}"
        )


@dataclass(frozen=True)
class KVCacheCase:
    dtype: str
    b: int
    sq: int
    sk: int
    hq: int
    hk: int
    d: int
    mask: str = "causal"
    layout: str = "contig"
    new: int = 0
    rope: int = 0
    splits: int = 0

    @property
    def name(self) -> str:
        return (
            f"kvcache-{self.dtype}-b{self.b}-sq{self.sq}-sk{self.sk}-h{self.hq}x{self.hk}"
            f"-d{self.d}-{self.mask}-{self.layout}-new{self.new}-rope{self.rope}-s{self.splits}"
        )


@dataclass(frozen=True)
class PagedVarlenCase:
    dtype: str
    b: int
    sq: int
    sk: int
    hq: int
    hk: int
    d: int
    mask: str = "causal"
    page: int = 16

    @property
    def name(self) -> str:
        return (
            f"pagedvarlen-{self.dtype}-b{self.b}-sq{self.sq}-sk{self.sk}-h{self.hq}x{self.hk}"
            f"-d{self.d}-{self.mask}-page{self.page}"
        )


def parse(name: str):
    for regex, cls in ((PACKED_RE, PackedCase), (KV_RE, KVCacheCase), (PV_RE, PagedVarlenCase)):
        m = regex.match(name)
        if m:
            g = m.groupdict()
            return cls(**{k: (v if k in ("dtype", "kind", "mask", "layout") else int(v))
                          for k, v in g.items()})  # fmt: skip
    raise ValueError(f"not a packed/kv-cache case name: {name!r}")


def grid(quick: bool) -> list:
    """The GPU grid: every packed form; decoding and chunked prefill against contiguous and
    paged caches (pages of 16 and 256 rows), with and without append and rotary, each mask,
    GQA/MQA, split counts 1, the heuristic and 7; paged varlen prefill."""
    if quick:
        return [
            PackedCase("bf16", "qkv", 2, 1000, 1000, 4, 4, 128, "causal"),
            PackedCase("bf16", "varkv", 3, 700, 900, 8, 2, 64, "causal"),
            KVCacheCase("bf16", 4, 1, 4096, 32, 8, 128, "causal", "page256", 1, 1, 0),
            KVCacheCase("fp16", 2, 64, 800, 8, 2, 128, "causal", "contig", 64, 2, 1),
            PagedVarlenCase("bf16", 3, 300, 900, 8, 2, 128, "causal", 16),
        ]
    cases: list = []
    for d in (64, 128):
        for mask in ("full", "causal", "window"):
            cases.append(PackedCase("bf16", "qkv", 2, 1000, 1000, 4, 4, d, mask))
            cases.append(PackedCase("bf16", "kv", 2, 777, 1000, 8, 2, d, mask))
            cases.append(PackedCase("fp16", "varqkv", 3, 700, 700, 4, 4, d, mask))
            cases.append(PackedCase("fp16", "varkv", 3, 700, 900, 8, 1, d, mask))
    cases.append(PackedCase("bf16", "qkv", 1, 129, 129, 2, 2, 80, "causal"))
    cases.append(PackedCase("bf16", "kv", 1, 129, 4096, 4, 2, 256, "full"))
    for layout in ("contig", "page16", "page256"):
        for sk in (128, 339, 4096, 16384):
            for new, rope in ((0, 0), (1, 1), (1, 2)):
                cases.append(KVCacheCase("bf16", 4, 1, sk, 32, 8, 128, "causal", layout, new, rope))
        cases.append(KVCacheCase("fp16", 2, 3, 1024, 16, 16, 64, "causal", layout, 3, 1, 1))
        cases.append(KVCacheCase("bf16", 2, 64, 800, 8, 2, 128, "causal", layout, 64, 2, 0))
        cases.append(KVCacheCase("bf16", 2, 16, 20000, 8, 1, 128, "window", layout, 16, 1, 7))
        for mask in ("full", "alibi", "softcap"):
            cases.append(KVCacheCase("bf16", 3, 4, 2048, 8, 2, 64, mask, layout, 4, 0, 0))
    for layout in ("leftpad", "bidx"):
        cases.append(KVCacheCase("bf16", 4, 1, 4096, 32, 8, 128, "causal", layout, 1, 1, 0))
        cases.append(KVCacheCase("fp16", 2, 5, 700, 8, 2, 64, "window", layout, 5, 2, 3))
    for d in (40, 80, 96, 256):
        cases.append(KVCacheCase("bf16", 2, 1, 2048, 8, 2, d, "causal", "page16", 1, 0, 0))
    for s in (1, 7, 64):
        cases.append(KVCacheCase("bf16", 1, 1, 16384, 8, 8, 128, "causal", "page256", 0, 0, s))
    for mask in ("causal", "window", "alibi", "softcap"):
        cases.append(PagedVarlenCase("bf16", 3, 300, 900, 8, 2, 128, mask, 16))
        cases.append(PagedVarlenCase("fp16", 2, 1000, 1000, 4, 4, 64, mask, 256))
    return cases


def grid_boundary() -> list:
    """Small shapes for compute-sanitizer: partial pages and tiles, length 1, every layout."""
    cases: list = [
        PackedCase("bf16", "qkv", 1, 17, 17, 2, 2, 40, "causal"),
        PackedCase("bf16", "kv", 1, 17, 129, 4, 1, 72, "full"),
        PackedCase("bf16", "varqkv", 3, 129, 129, 2, 2, 128, "causal"),
        PackedCase("bf16", "varkv", 3, 33, 77, 4, 2, 256, "window"),
    ]
    for sk in (1, 17, 129):
        for layout in ("contig", "page16", "leftpad", "bidx"):
            new = 1 if sk > 1 else 0
            cases.append(KVCacheCase("bf16", 3, 1, sk, 4, 1, 72, "causal", layout, new, 1, 3))
        cases.append(KVCacheCase("bf16", 2, 3, sk + 3, 4, 2, 256, "window", "page16", 3, 2, 0))
    cases += [
        KVCacheCase("bf16", 2, 7, 300, 8, 2, 40, "alibi", "page256", 7, 0, 5),
        PagedVarlenCase("bf16", 3, 17, 129, 4, 2, 72, "causal", 16),
        PagedVarlenCase("bf16", 3, 129, 77, 2, 2, 256, "softcap", 16),
    ]
    return cases


def _mask_args(mask: str):
    """(causal, window_size, softcap, alibi?) in flash_attn's arguments."""
    return {
        "full": (False, (-1, -1), 0.0, False),
        "causal": (True, (-1, -1), 0.0, False),
        "window": (False, WINDOW, 0.0, False),
        "alibi": (True, (-1, -1), 0.0, True),
        "softcap": (False, (-1, -1), SOFTCAP, False),
    }[mask]


def _ref_lr(causal: bool, window):
    """(left, right) of kernels.reference for flash_attn's arguments."""
    left = window[0] if window[0] >= 0 else None
    right = 0 if causal else (window[1] if window[1] >= 0 else None)
    return left, right


def _judge(name, mine, ref, pt, eps, factor, worst, bounds) -> bool:
    import torch

    mine, ref, pt = mine.float(), ref.float(), pt.float()
    if not torch.isfinite(mine).all():
        worst[name] = float("inf")
        return False
    err = (mine - ref).abs().max().item() if mine.numel() else 0.0
    pt_err = (pt - ref).abs().max().item() if mine.numel() else 0.0
    ok, bound = tolerance.within(err, pt_err, ref.abs().max().item(), eps, factor)
    if err >= worst.get(name, 0.0):
        worst[name], bounds[name] = err, bound
    return ok


def _judge_lse(mine, ref, worst) -> bool:
    import torch

    fin = torch.isfinite(ref)
    if not torch.equal(fin, torch.isfinite(mine)):
        worst["lse"] = float("inf")
        return False
    if fin.any():
        e = (mine[fin] - ref[fin]).abs().max().item()
        worst["lse"] = max(worst.get("lse", 0.0), e)
        return e <= 1e-2
    return True


def _lengths(n: int, max_len: int) -> list[int]:
    # Ragged on purpose: the max, 1, something in between (kernels.check's pattern).
    base = [max_len, 1, max(1, max_len // 3 + 7), max(1, max_len - 13)]
    return [min(base[i % 4], max_len) for i in range(n)]


def compare_packed(case: PackedCase, device, seed: int = 0) -> dict:
    import torch

    from . import packed
    from .reference import attention_ref

    dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float16
    eps = torch.finfo(dtype).eps
    g = torch.Generator().manual_seed(seed)
    causal, window, _, _ = _mask_args(case.mask)
    left, right = _ref_lr(causal, window)
    varlen = case.kind.startswith("var")
    lq = _lengths(case.b, case.sq) if varlen else [case.sq] * case.b
    lk = (lq if case.kind == "varqkv" else _lengths(case.b, case.sk)[::-1]) if varlen else None
    lk = lk or [case.sk] * case.b

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    if varlen:
        tq, tk = sum(lq), sum(lk)
        cu_q = torch.tensor([0] + lq, device=device).cumsum(0).to(torch.int32)
        cu_k = torch.tensor([0] + lk, device=device).cumsum(0).to(torch.int32)
        do = rnd(tq, case.hq, case.d)
        if case.kind == "varqkv":
            pack = rnd(tq, 3, case.hq, case.d).requires_grad_()
            out = packed.flash_attn_varlen_qkvpacked_func(
                pack, cu_q, max(lq), causal=causal, window_size=window
            )
            q_all, k_all, v_all = pack.detach().unbind(1)
        else:
            q = rnd(tq, case.hq, case.d).requires_grad_()
            pack = rnd(tk, 2, case.hk, case.d).requires_grad_()
            out = packed.flash_attn_varlen_kvpacked_func(
                q, pack, cu_q, cu_k, max(lq), max(lk), causal=causal, window_size=window
            )
            q_all = q.detach()
            k_all, v_all = pack.detach().unbind(1)
        out.backward(do)
        q_spans = list(zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True))
        k_spans = list(zip(cu_k[:-1].tolist(), cu_k[1:].tolist(), strict=True))
    else:
        do = rnd(case.b, case.sq, case.hq, case.d)
        if case.kind == "qkv":
            pack = rnd(case.b, case.sq, 3, case.hq, case.d).requires_grad_()
            out = packed.flash_attn_qkvpacked_func(pack, causal=causal, window_size=window)
            q_all, k_all, v_all = pack.detach().unbind(2)
        else:
            q = rnd(case.b, case.sq, case.hq, case.d).requires_grad_()
            pack = rnd(case.b, case.sk, 2, case.hk, case.d).requires_grad_()
            out = packed.flash_attn_kvpacked_func(q, pack, causal=causal, window_size=window)
            q_all = q.detach()
            k_all, v_all = pack.detach().unbind(2)
        out.backward(do)
        q_spans = k_spans = [(i, i + 1) for i in range(case.b)]

    ok = pack.grad is not None and pack.grad.shape == pack.shape
    worst: dict = {}
    bounds: dict = {}
    for (a, z), (ka, kz) in zip(q_spans, k_spans, strict=True):

        def seq(t, lo, hi):
            return t[lo:hi].unsqueeze(0) if varlen else t[lo:hi]

        res = {}
        for upcast in (True, False):
            qi, ki, vi = (
                seq(t, lo, hi).clone().requires_grad_()
                for t, lo, hi in ((q_all, a, z), (k_all, ka, kz), (v_all, ka, kz))
            )
            o, _ = attention_ref(qi, ki, vi, left=left, right=right, upcast=upcast)
            o.backward(seq(do, a, z))
            res[upcast] = (o.detach(), qi.grad, ki.grad, vi.grad)
        if case.kind in ("qkv", "varqkv"):
            g_pack = seq(pack.grad, a, z)
            grads = [g_pack.select(2, j) for j in range(3)]
        else:
            g_kv = seq(pack.grad, ka, kz)
            grads = [seq(q.grad, a, z), g_kv.select(2, 0), g_kv.select(2, 1)]
        mine = [seq(out, a, z)] + grads
        for key, m, r, p in zip(
            ("out", "dq", "dk", "dv"), mine, res[True], res[False], strict=True
        ):
            factor = tolerance.FACTOR if key == "out" else tolerance.GRAD_FACTOR
            ok &= _judge(key, m.reshape(r.shape), r, p, eps, factor, worst, bounds)
    metrics = {f"err_{k}": v for k, v in worst.items()}
    metrics.update({f"bound_{k}": v for k, v in bounds.items()})
    return {"ok": bool(ok), "metrics": metrics}


def _rotary_ref(x, cos, sin, pos, interleaved: bool):
    """flash_attn.layers.rotary.apply_rotary_emb_torch at positions ``pos`` (b, s), fp32."""
    import torch

    rd = cos.shape[1] * 2
    c, s = cos[pos].float(), sin[pos].float()
    rep = (
        (lambda t: t.repeat_interleave(2, -1)) if interleaved else (lambda t: torch.cat((t, t), -1))
    )
    c, s = rep(c)[:, :, None], rep(s)[:, :, None]
    xr = x[..., :rd].float()
    if interleaved:
        half = torch.stack((-xr[..., 1::2], xr[..., 0::2]), -1).flatten(-2)
    else:
        x1, x2 = xr.chunk(2, -1)
        half = torch.cat((-x2, x1), -1)
    return torch.cat(((xr * c + half * s).to(x.dtype), x[..., rd:]), -1)


def compare_kvcache(case: KVCacheCase, device, seed: int = 0) -> dict:
    import torch

    from .kvcache import flash_attn_with_kvcache
    from .reference import attention_ref

    dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float16
    eps = torch.finfo(dtype).eps
    g = torch.Generator().manual_seed(seed)
    causal, window, softcap, use_alibi = _mask_args(case.mask)
    b, sk, hk, d = case.b, case.sk, case.hk, case.d

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    page = int(case.layout[4:]) if case.layout.startswith("page") else 0
    cap = -(-sk // page) * page if page else sk  # rows per sequence the cache holds
    lens = [max(0, min(n, sk) - case.new) for n in _lengths(b, sk)]
    n_cache = b + 1 if case.layout == "bidx" else b
    kc, vc = rnd(n_cache, cap, hk, d), rnd(n_cache, cap, hk, d)
    q = rnd(b, case.sq, case.hq, d)
    k_new = rnd(b, case.new, hk, d) if case.new else None
    v_new = rnd(b, case.new, hk, d) if case.new else None
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    slopes = (torch.rand(b, case.hq, generator=g) * 0.3).to(device) if use_alibi else None
    rows = list(range(b))
    extra: dict = {}
    if case.layout == "bidx":
        rows = torch.randperm(n_cache, generator=g)[:b].tolist()
        extra["cache_batch_idx"] = torch.tensor(rows, dtype=torch.int32, device=device)
    leftpad = [0] * b
    if case.layout == "leftpad":
        leftpad = [n // 3 for n in lens]
        extra["cache_leftpad"] = torch.tensor(leftpad, dtype=torch.int32, device=device)
    cos = sin = None
    interleaved = case.rope == 2
    if case.rope and case.new:
        rd = d // 16 * 16 if case.rope == 1 else (d // 2) // 16 * 16  # flash_attn: multiples of 16
        angle = torch.rand(cap, rd // 2, generator=g) * 6.2832
        cos, sin = angle.cos().to(device, dtype), angle.sin().to(device, dtype)

    # Expected cache after the append, and the reference attention on it.
    k_exp, v_exp = kc.clone(), vc.clone()
    q_ref = q
    if case.new:
        start = seqlens.long()[:, None]
        k_app = k_new
        if cos is not None:
            k_app = _rotary_ref(k_new, cos, sin, start + torch.arange(case.new, device=device),
                                interleaved)  # fmt: skip
            # Queries move with the keys under causal or a window narrower than the cache
            # (flash_api.cpp turns wider windows off before choosing).
            moving = causal or any(0 <= w < cap for w in window)
            q_pos = start + torch.arange(case.sq, device=device) * int(moving)
            q_ref = _rotary_ref(q, cos, sin, q_pos, interleaved)
        for i in range(b):
            k_exp[rows[i], lens[i] : lens[i] + case.new] = k_app[i]
            v_exp[rows[i], lens[i] : lens[i] + case.new] = v_new[i]

    k_in, v_in, block_table = kc, vc, None
    if page:
        per_seq = cap // page
        n_blocks = 2 * b * per_seq
        perm = torch.randperm(n_blocks, generator=g)[: b * per_seq]
        block_table = perm.reshape(b, per_seq).to(device=device, dtype=torch.int32)
        k_in, v_in = rnd(n_blocks, page, hk, d), rnd(n_blocks, page, hk, d)
        for i in range(b):
            k_in[block_table[i].long()] = kc[i].reshape(per_seq, page, hk, d)
            v_in[block_table[i].long()] = vc[i].reshape(per_seq, page, hk, d)
    out, lse = flash_attn_with_kvcache(
        q, k_in, v_in, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
        block_table=block_table, causal=causal, window_size=window, softcap=softcap,
        rotary_interleaved=interleaved, alibi_slopes=slopes, num_splits=case.splits,
        return_softmax_lse=True, **extra,
    )  # fmt: skip
    if page:
        k_after = torch.stack([k_in[block_table[i].long()].reshape(cap, hk, d) for i in range(b)])
        v_after = torch.stack([v_in[block_table[i].long()].reshape(cap, hk, d) for i in range(b)])
        k_want, v_want = k_exp, v_exp
    else:
        k_after, v_after, k_want, v_want = k_in, v_in, k_exp, v_exp

    ok = True
    worst: dict = {}
    bounds: dict = {}
    cache_err = (k_after.float() - k_want.float()).abs().max().item()
    cache_ok = cache_err <= eps * max(1.0, k_want.float().abs().max().item())
    cache_ok &= torch.equal(v_after, v_want)
    worst["cache"] = cache_err
    left, right = _ref_lr(causal, window)
    for i in range(b):
        lo, hi = leftpad[i], lens[i] + case.new
        ki, vi = k_exp[rows[i], lo:hi][None], v_exp[rows[i], lo:hi][None]
        al = slopes[i : i + 1] if slopes is not None else None
        kw = dict(scale=d**-0.5, left=left, right=right, softcap=softcap, alibi_slopes=al)
        ref, ref_lse = attention_ref(q_ref[i : i + 1], ki, vi, upcast=True, **kw)
        pt, _ = attention_ref(q_ref[i : i + 1], ki, vi, upcast=False, **kw)
        ok &= _judge("out", out[i : i + 1], ref, pt, eps, tolerance.FACTOR, worst, bounds)
        ok &= _judge_lse(lse[i : i + 1].float(), ref_lse, worst)
    metrics = {f"err_{k}": v for k, v in worst.items()}
    metrics.update({f"bound_{k}": v for k, v in bounds.items()})
    return {"ok": bool(ok and cache_ok), "metrics": metrics}


def compare_paged_varlen(case: PagedVarlenCase, device, seed: int = 0) -> dict:
    import torch

    from .interface import flash_attn_varlen_func
    from .reference import attention_ref

    dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float16
    eps = torch.finfo(dtype).eps
    g = torch.Generator().manual_seed(seed)
    causal, window, softcap, use_alibi = _mask_args(case.mask)
    lq, lk = _lengths(case.b, case.sq), _lengths(case.b, case.sk)[::-1]

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    per_seq = -(-case.sk // case.page)
    n_blocks = 2 * case.b * per_seq
    kc, vc = rnd(n_blocks, case.page, case.hk, case.d), rnd(n_blocks, case.page, case.hk, case.d)
    perm = torch.randperm(n_blocks, generator=g)[: case.b * per_seq]
    bt = perm.reshape(case.b, per_seq).to(device=device, dtype=torch.int32)
    q = rnd(sum(lq), case.hq, case.d)
    cu_q = torch.tensor([0] + lq, device=device).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lk, device=device).cumsum(0).to(torch.int32)
    slopes = (torch.rand(case.b, case.hq, generator=g) * 0.3).to(device) if use_alibi else None
    out, lse, _ = flash_attn_varlen_func(
        q, kc, vc, cu_q, cu_k, max(lq), max(lk), causal=causal, window_size=window,
        softcap=softcap, alibi_slopes=slopes, return_attn_probs=True, block_table=bt,
    )  # fmt: skip
    ok = True
    worst: dict = {}
    bounds: dict = {}
    left, right = _ref_lr(causal, window)
    for i in range(case.b):
        a, z = cu_q[i].item(), cu_q[i + 1].item()
        ki = kc[bt[i].long()].reshape(-1, case.hk, case.d)[: lk[i]][None]
        vi = vc[bt[i].long()].reshape(-1, case.hk, case.d)[: lk[i]][None]
        al = slopes[i : i + 1] if slopes is not None else None
        kw = dict(scale=case.d**-0.5, left=left, right=right, softcap=softcap, alibi_slopes=al)
        ref, ref_lse = attention_ref(q[a:z][None], ki, vi, upcast=True, **kw)
        pt, _ = attention_ref(q[a:z][None], ki, vi, upcast=False, **kw)
        ok &= _judge("out", out[a:z][None], ref, pt, eps, tolerance.FACTOR, worst, bounds)
        ok &= _judge_lse(lse[:, a:z][None].float(), ref_lse, worst)
    metrics = {f"err_{k}": v for k, v in worst.items()}
    metrics.update({f"bound_{k}": v for k, v in bounds.items()})
    return {"ok": bool(ok), "metrics": metrics}


def run(name: str, device) -> dict:
    """One named case as ``kernels.check.run_case`` reports it (without the timing)."""
    case = parse(name)
    if isinstance(case, PackedCase):
        res = compare_packed(case, device)
    elif isinstance(case, KVCacheCase):
        res = compare_kvcache(case, device)
    else:
        res = compare_paged_varlen(case, device)
    m = res["metrics"]
    keys = [k[4:] for k in m if k.startswith("err_") and f"bound_{k[4:]}" in m]
    errs = ", ".join(f"{k}={m['err_' + k]:.2e}/{m['bound_' + k]:.2e}" for k in keys)
    extra = "".join(f", {k}={m['err_' + k]:.1e}" for k in ("lse", "cache") if f"err_{k}" in m)
    msg = f"{name}: max err/bound {errs}{extra}"
    return {"status": "pass" if res["ok"] else "fail", "message": msg, "metrics": m}
