"""The packed-input, kv-cache and paged-varlen cases of the kernels' checks (kinds ``packed``,
``kvcache``, ``pagedvarlen``).

* ``packed`` (pack ``qkv|kv|varqkv|varkv``): forward and backward through
  ``flash_attn_{,varlen_}{qkv,kv}packed_func``; out and the packed gradient (one tensor of the
  pack's shape) against the fp32 reference with flash-attention's rule (2x for the output, 3x
  for gradients). ``qkv`` packs need sq = sk and hq = hk.
* ``kvcache`` (layout ``contig|page<N>|leftpad|bidx``, ``-new<N>-rope<0|1|2>-s<splits>``):
  ``flash_attn_with_kvcache`` on a cache of sk rows per sequence (paged: pages of N rows in
  shuffled blocks; leftpad / bidx: a contiguous cache with ``cache_leftpad`` /
  ``cache_batch_idx``), ragged ``cache_seqlens``, ``new`` keys appended in place, rotary
  embedding (1: GPT-NeoX halves, 2: interleaved pairs over half the head dim), ``splits`` KV
  splits (0: the heuristic). The output and LSE against the fp32 reference on the cache as it
  must be after the append; the cache itself against that expectation (keys within one rounding
  of the rotary, values exact, other rows untouched).
* ``pagedvarlen`` (layout ``page<N>``): ``flash_attn_varlen_func`` with ``block_table`` (paged
  prefill) against the reference per sequence.

The reference follows flash-attention's tests (tests/test_flash_attn.py,
test_flash_attn_kvcache): keys are the rows [leftpad, cache_seqlens + new), masks bottom-right.
"""

from __future__ import annotations

from .case import Case, ragged
from .judge import Judge, summary


def compare_packed(case: Case, device, seed: int = 0) -> dict:
    """Run one ``packed`` case; ``{"ok": bool, "metrics": {...}}``."""
    import torch

    from ..api import packed
    from .reference import attention_ref, both_precisions

    dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float16
    g = torch.Generator().manual_seed(seed)
    causal, window, _, _ = case.flash_args()
    left, right, _, _ = case.mask_args()
    pack_kind = case.layout
    varlen = case.varlen
    lq = ragged(case.b, case.sq) if varlen else [case.sq] * case.b
    lk = (lq if pack_kind == "varqkv" else ragged(case.b, case.sk)[::-1]) if varlen else None
    lk = lk or [case.sk] * case.b

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    if varlen:
        tq, tk = sum(lq), sum(lk)
        cu_q = torch.tensor([0] + lq, device=device).cumsum(0).to(torch.int32)
        cu_k = torch.tensor([0] + lk, device=device).cumsum(0).to(torch.int32)
        do = rnd(tq, case.hq, case.d)
        if pack_kind == "varqkv":
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
        if pack_kind == "qkv":
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

    judge = Judge(torch.finfo(dtype).eps)
    judge.ok = pack.grad is not None and pack.grad.shape == pack.shape
    for (a, z), (ka, kz) in zip(q_spans, k_spans, strict=True):

        def seq(t, lo, hi):
            return t[lo:hi].unsqueeze(0) if varlen else t[lo:hi]

        qi, ki, vi = (seq(q_all, a, z), seq(k_all, ka, kz), seq(v_all, ka, kz))
        res = both_precisions(attention_ref, qi, ki, vi, seq(do, a, z), left=left, right=right)
        if pack_kind in ("qkv", "varqkv"):
            g_pack = seq(pack.grad, a, z)
            grads = [g_pack.select(2, j) for j in range(3)]
        else:
            g_kv = seq(pack.grad, ka, kz)
            grads = [seq(q.grad, a, z), g_kv.select(2, 0), g_kv.select(2, 1)]
        mine = [seq(out, a, z)] + grads
        for key, m, r, p in zip(
            ("out", "dq", "dk", "dv"), mine, res[True][:4], res[False][:4], strict=True
        ):
            judge.tensor(key, m, r, p)
    return {"ok": judge.ok, "metrics": judge.metrics()}


def _paged(kc, vc, b: int, page: int, g, rnd):
    """The caches ``kc``, ``vc`` (batch, rows, hk, d) as pages of ``page`` rows, scattered at
    random over twice as many pages as they need (filled with noise): (k pages, v pages, block
    table)."""
    import torch

    cap, hk, d = kc.shape[1], kc.shape[2], kc.shape[3]
    per_seq = cap // page
    n_blocks = 2 * b * per_seq
    perm = torch.randperm(n_blocks, generator=g)[: b * per_seq]
    block_table = perm.reshape(b, per_seq).to(device=kc.device, dtype=torch.int32)
    k_in, v_in = rnd(n_blocks, page, hk, d), rnd(n_blocks, page, hk, d)
    for i in range(b):
        k_in[block_table[i].long()] = kc[i].reshape(per_seq, page, hk, d)
        v_in[block_table[i].long()] = vc[i].reshape(per_seq, page, hk, d)
    return k_in, v_in, block_table


def _unpaged(k_in, v_in, block_table, cap: int):
    """The paged caches read back through the block table as (batch, cap, hk, d)."""
    import torch

    hk, d = k_in.shape[2], k_in.shape[3]
    rows = range(block_table.shape[0])
    k = torch.stack([k_in[block_table[i].long()].reshape(cap, hk, d) for i in rows])
    v = torch.stack([v_in[block_table[i].long()].reshape(cap, hk, d) for i in rows])
    return k, v


def _judge_kvcache(case: Case, got: tuple, want: tuple, eps, where: tuple, slopes) -> Judge:
    """The caches after the call against the expected ones, and each sequence's out and LSE
    against the reference on its expected cache rows (``where``: the cache row of each sequence,
    its length before the append, its left padding)."""
    import torch

    from .reference import attention_ref

    out, lse, k_after, v_after = got
    q_ref, k_exp, v_exp = want
    rows, lens, leftpad = where
    b, d, softcap = case.b, case.d, case.flash_args()[2]
    judge = Judge(eps)
    cache_err = (k_after.float() - k_exp.float()).abs().max().item()
    cache_ok = cache_err <= eps * max(1.0, k_exp.float().abs().max().item())
    judge.value("cache", cache_err, cache_ok and torch.equal(v_after, v_exp))
    left, right, _, _ = case.mask_args()
    for i in range(b):
        lo, hi = leftpad[i], lens[i] + case.new
        ki, vi = k_exp[rows[i], lo:hi][None], v_exp[rows[i], lo:hi][None]
        al = slopes[i : i + 1] if slopes is not None else None
        kw = dict(scale=d**-0.5, left=left, right=right, softcap=softcap, alibi_slopes=al)
        ref, ref_lse = attention_ref(q_ref[i : i + 1], ki, vi, upcast=True, **kw)
        pt, _ = attention_ref(q_ref[i : i + 1], ki, vi, upcast=False, **kw)
        judge.tensor("out", out[i : i + 1], ref, pt)
        judge.lse(lse[i : i + 1], ref_lse)
    return judge


def compare_kvcache(case: Case, device, seed: int = 0) -> dict:
    """Run one ``kvcache`` case; ``{"ok": bool, "metrics": {...}}``."""
    import torch

    from ..api.kvcache import flash_attn_with_kvcache
    from .reference import rotary_ref

    dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float16
    eps = torch.finfo(dtype).eps
    g = torch.Generator().manual_seed(seed)
    causal, window, softcap, use_alibi = case.flash_args()
    b, sk, hk, d = case.b, case.sk, case.hk, case.d

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    page = case.page
    cap = -(-sk // page) * page if page else sk  # rows per sequence the cache holds
    lens = [max(0, min(n, sk) - case.new) for n in ragged(b, sk)]
    n_cache = b + 1 if case.layout == "bidx" else b
    kc, vc = rnd(n_cache, cap, hk, d), rnd(n_cache, cap, hk, d)
    q = rnd(b, case.sq, case.hq, d)
    k_new, v_new = (rnd(b, case.new, hk, d), rnd(b, case.new, hk, d)) if case.new else (None, None)
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
            k_app = rotary_ref(k_new, cos, sin, start + torch.arange(case.new, device=device),
                                interleaved)  # fmt: skip
            # Queries move with the keys under causal or a window narrower than the cache
            # (flash_api.cpp turns wider windows off before choosing).
            moving = causal or any(0 <= w < cap for w in window)
            q_pos = start + torch.arange(case.sq, device=device) * int(moving)
            q_ref = rotary_ref(q, cos, sin, q_pos, interleaved)
        for i in range(b):
            k_exp[rows[i], lens[i] : lens[i] + case.new] = k_app[i]
            v_exp[rows[i], lens[i] : lens[i] + case.new] = v_new[i]

    k_in, v_in, block_table = (kc, vc, None) if not page else _paged(kc, vc, b, page, g, rnd)
    call_kw = dict(
        rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens, block_table=block_table,
        causal=causal, window_size=window, softcap=softcap, rotary_interleaved=interleaved,
        alibi_slopes=slopes, num_splits=case.splits, return_softmax_lse=True, **extra,
    )  # fmt: skip
    before = (k_in.clone(), v_in.clone()) if _replayed(slopes) else None
    out, lse = flash_attn_with_kvcache(q, k_in, v_in, k_new, v_new, **call_kw)
    replays = None
    if before is not None:
        replays = _replays(flash_attn_with_kvcache, q, before, k_new, v_new, call_kw,
                           (out, lse, k_in, v_in))  # fmt: skip
    k_after, v_after = (k_in, v_in) if not page else _unpaged(k_in, v_in, block_table, cap)

    judge = _judge_kvcache(case, (out, lse, k_after, v_after), (q_ref, k_exp, v_exp), eps,
                           (rows, lens, leftpad), slopes)  # fmt: skip
    metrics = judge.metrics()
    if replays is not None:
        metrics.update(replays)
    ok = judge.ok and (replays is None or replays["replays_equal"] == 1.0)
    return {"ok": ok, "metrics": metrics}


def _replayed(slopes) -> bool:
    """Whether a call like this one is planned (attnforge_kernels/launch/plans.py; ALiBi is not)."""
    from ..launch import plans as launch

    return launch.ENABLED and slopes is None


def _replays(fn, q, before, k_new, v_new, kw: dict, want: tuple) -> dict:
    """The checked call three times more on copies of the caches as they were before it,
    replaying the plan the checked call recorded (natively where the native launch path took
    it: a contiguous cache). Each output, LSE and cache bitwise against ``want`` (the checked
    run's); how many replays each path made."""
    import torch

    from ..api.kvcache import KVPlan
    from ..launch import replay as native

    native.counts()
    start = KVPlan.replays
    equal = True
    for _ in range(3):
        kc, vc = before[0].clone(), before[1].clone()
        out, lse = fn(q, kc, vc, k_new, v_new, **kw)
        got = (out, lse, kc, vc)
        equal = equal and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    return {
        "replays_equal": float(equal),
        "plan_replays": float(KVPlan.replays - start),
        "native_replays": float(native.counts()[3]),
    }


def compare_paged_varlen(case: Case, device, seed: int = 0) -> dict:
    """Run one ``pagedvarlen`` case; ``{"ok": bool, "metrics": {...}}``."""
    import torch

    from ..api.flash_attn import flash_attn_varlen_func
    from .reference import attention_ref

    dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float16
    g = torch.Generator().manual_seed(seed)
    causal, window, softcap, use_alibi = case.flash_args()
    lq, lk = ragged(case.b, case.sq), ragged(case.b, case.sk)[::-1]

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
    judge = Judge(torch.finfo(dtype).eps)
    left, right, _, _ = case.mask_args()
    for i in range(case.b):
        a, z = cu_q[i].item(), cu_q[i + 1].item()
        ki = kc[bt[i].long()].reshape(-1, case.hk, case.d)[: lk[i]][None]
        vi = vc[bt[i].long()].reshape(-1, case.hk, case.d)[: lk[i]][None]
        al = slopes[i : i + 1] if slopes is not None else None
        kw = dict(scale=case.d**-0.5, left=left, right=right, softcap=softcap, alibi_slopes=al)
        ref, ref_lse = attention_ref(q[a:z][None], ki, vi, upcast=True, **kw)
        pt, _ = attention_ref(q[a:z][None], ki, vi, upcast=False, **kw)
        judge.tensor("out", out[a:z][None], ref, pt)
        judge.lse(lse[:, a:z][None], ref_lse)
    return {"ok": judge.ok, "metrics": judge.metrics()}


COMPARE = {
    "packed": compare_packed,
    "kvcache": compare_kvcache,
    "pagedvarlen": compare_paged_varlen,
}


def run(case: Case, device) -> dict:
    """One ``packed``, ``kvcache`` or ``pagedvarlen`` case as ``run_case`` reports it (without
    the timing)."""
    res = COMPARE[case.kind](case, device)
    m = res["metrics"]
    extra = "".join(f", {k}={m['err_' + k]:.1e}" for k in ("lse", "cache") if f"err_{k}" in m)
    msg = f"{case.name}: max err/bound {summary(m, ('out', 'dq', 'dk', 'dv'))}{extra}"
    return {"status": "pass" if res["ok"] else "fail", "message": msg, "metrics": m}
