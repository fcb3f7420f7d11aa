"""The ``attn`` cases: forward and backward through the kernels' autograd function, every
output and gradient against :func:`~attnforge_kernels.checks.reference.attention_ref`; where the
native launch path is active (attnforge_kernels/launch/replay.py, a GPU), the same call three times
through ``flash_attn_func``'s entry, bitwise against the first run; and the SDPA shim's routing
case."""

from __future__ import annotations

from .case import Case, ragged
from .judge import Judge, summary

SHIM_CASE = "shim-routing"


def compare(case: Case, device, seed: int = 0) -> dict:
    """Run one ``attn`` case; ``{"ok": bool, "metrics": {...}}``."""
    import torch

    from ..api.flash_attn import Mask
    from .reference import attention_ref, both_precisions

    dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float16
    g = torch.Generator(device="cpu").manual_seed(seed)
    left, right, softcap, use_alibi = case.mask_args()
    scale = case.d**-0.5
    if case.layout == "varlen":
        lq = ragged(case.b, case.sq)
        lk = ragged(case.b, case.sk)[::-1]
    else:
        lq, lk = [case.sq] * case.b, [case.sk] * case.b

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    qs = [rnd(1, n, case.hq, case.d) for n in lq]
    ks = [rnd(1, n, case.hk, case.d) for n in lk]
    vs = [rnd(1, n, case.hk, case.d) for n in lk]
    dos = [rnd(1, n, case.hq, case.d) for n in lq]
    alibi = (torch.rand(case.b, case.hq, generator=g) * 0.3).to(device) if use_alibi else None
    mask = Mask(left=left, right=right, softcap=softcap)

    if case.layout == "varlen":
        ran = _kernel_varlen(case, qs, ks, vs, dos, lq, lk, scale, mask, alibi)
    else:
        ran = _kernel_fixed(case, qs, ks, vs, dos, scale, mask, alibi)
    outs, grads, lses, poisoned, native = ran
    judge = Judge(torch.finfo(dtype).eps, ("out", "dq", "dk", "dv", "lse"))
    judge.ok = not poisoned
    for i in range(case.b):
        al = alibi[i : i + 1] if alibi is not None else None
        kw = dict(scale=scale, left=left, right=right, softcap=softcap, alibi_slopes=al)
        res = both_precisions(attention_ref, qs[i], ks[i], vs[i], dos[i], **kw)
        ref, pt = res[True], res[False]
        mine = (outs[i], grads[0][i], grads[1][i], grads[2][i])
        for key, a, r, p in zip(("out", "dq", "dk", "dv"), mine, ref[:4], pt[:4], strict=True):
            judge.tensor(key, a, r, p)
        judge.lse(lses[i], ref[4])
    metrics = judge.metrics()
    if native is not None:
        metrics.update(native)
    ok = judge.ok and (native is None or native["native_equal"] == 1.0)
    return {"ok": ok, "metrics": metrics}


def _kernel_varlen(case: Case, qs, ks, vs, dos, lq, lk, scale, mask, alibi):
    """The kernel on the sequences packed end to end (varlen): per sequence, its out, dq, dk,
    dv and LSE, whether the output holds a NaN, and the native replays' metrics."""
    import torch

    from ..api.flash_attn import FlashAttnFunction

    device = qs[0].device
    cat = [torch.cat([t[0] for t in ts]).requires_grad_() for ts in (qs, ks, vs)]
    cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32, device=device)
    out, lse = FlashAttnFunction.apply(
        *cat, cu_q, cu_k, max(lq), max(lk), case.b, scale, mask, alibi, True
    )
    poisoned = False
    do_cat = torch.cat([t[0] for t in dos])
    out.backward(do_cat)
    call = (cu_q, cu_k, max(lq), max(lk), case.b, scale, mask, alibi, True, None)
    native = _native_replays(cat, do_cat, call, (out, *(t.grad for t in cat)))
    outs = list(out.split(lq))
    grads = [list(t.grad.split(lens)) for t, lens in zip(cat, (lq, lk, lk), strict=False)]
    lses = [
        lse[:, a:b]
        for a, b in zip(
            [0] + list(torch.tensor(lq).cumsum(0)[:-1]),
            torch.tensor(lq).cumsum(0),
            strict=False,
        )
    ]
    return outs, grads, lses, poisoned, native


def _kernel_fixed(case: Case, qs, ks, vs, dos, scale, mask, alibi):
    """The kernel on the batch in one (BSHD, or BHSD storage viewed as BSHD): as
    :func:`_kernel_varlen`."""
    import torch

    from ..api.flash_attn import FlashAttnFunction

    q, k, v, do = (torch.cat(ts) for ts in (qs, ks, vs, dos))
    if case.layout == "bhsd":
        # BHSD storage viewed as BSHD: exercised through strides, without a copy.
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = FlashAttnFunction.apply(
        q, k, v, None, None, case.sq, case.sk, case.b, scale, mask, alibi, False
    )
    poisoned = bool(torch.isnan(out).any())
    out.backward(do)
    call = (None, None, case.sq, case.sk, case.b, scale, mask, alibi, False, None)
    native = _native_replays((q, k, v), do, call, (out, q.grad, k.grad, v.grad))
    outs = list(out.split(1))
    grads = [list(t.grad.split(1)) for t in (q, k, v)]
    lses = list(lse.split(1))

    return outs, grads, lses, poisoned, native


def _native_replays(leaves, do, call: tuple, want: tuple) -> dict | None:
    """Where the native launch path is active and takes this call (no ALiBi): the call three
    times through flash_attn_func's entry (``interface.call_entry``; the first hands the plans over
    where the Python path recorded them, the others replay them natively), each output and
    gradient bitwise against ``want`` (the checked run's); metrics, or None where not run."""
    import torch

    from ..api.flash_attn import call_entry
    from ..launch import replay as native

    if call[7] is not None or native.status() != "active":
        return None
    native.counts()
    equal = True
    for _ in range(3):
        q, k, v = (t.detach().clone().requires_grad_() for t in leaves)
        out = call_entry(q, k, v, call, False)
        got = (out, *torch.autograd.grad(out, (q, k, v), do))
        equal = equal and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    fwd, bwd, back, _ = native.counts()
    return {"native_equal": float(equal), "native_fwd": float(fwd), "native_bwd": float(bwd),
            "native_to_python": float(back)}  # fmt: skip


def run(case: Case, device) -> dict:
    """One ``attn`` case as ``run_case`` reports it (without the timing)."""
    res = compare(case, device)
    m = res["metrics"]
    worst = summary(m, ("out", "dq", "dk", "dv"))
    native = ""
    if "native_equal" in m:
        native = (f", native {'bitwise equal' if m['native_equal'] else 'DIFFERS'} (replays fwd "
                  f"{m['native_fwd']:.0f} bwd {m['native_bwd']:.0f}, back to Python "
                  f"{m['native_to_python']:.0f})")  # fmt: skip
    return {
        "status": "pass" if res["ok"] else "fail",
        "message": f"{case.name}: max err/bound {worst}, lse={m['err_lse']:.1e}{native}",
        "metrics": m,
    }


def run_shim(device) -> dict:
    """The SDPA shim routes the calls it can take and falls back on the others."""
    import torch
    import torch.nn.functional as F

    from ..api import sdpa as sdpa_shim

    sdpa_shim.reset_stats()
    was = sdpa_shim.enabled()
    sdpa_shim.enable()
    try:
        dt = torch.bfloat16 if device.type == "cuda" else torch.float16
        q = torch.randn(1, 2, 33, 64, device=device, dtype=dt)
        k = torch.randn(1, 2, 40, 64, device=device, dtype=dt)
        v = torch.randn(1, 2, 40, 64, device=device, dtype=dt)
        F.scaled_dot_product_attention(q, k, v)  # routed
        F.scaled_dot_product_attention(q, k, v, is_causal=True)  # routed (top-left)
        F.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.ones(33, 40, dtype=torch.bool, device=device)
        )
        F.scaled_dot_product_attention(q.float(), k.float(), v.float())  # fallback: dtype
        st = sdpa_shim.stats()
    finally:
        if not was:
            sdpa_shim.disable()
    good = st["routed"] == 2 and st["fallback"] == 2
    return {
        "status": "pass" if good else "fail",
        "message": f"routed={st['routed']} fallback={st['fallback']} reasons={st['reasons']}",
        "metrics": {"routed": float(st["routed"]), "fallback": float(st["fallback"])},
    }
