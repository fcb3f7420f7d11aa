"""The dropout and FP8 cases of the kernels' checks (kinds ``dropout`` and ``fp8``).

* ``dropout``: forward and backward with ``dropout_p = p`` and ``return_attn_probs``. The mask
  the kernel used (the sign of S_dmask, as flash_attn's tests read it) must equal the Philox rule
  recomputed in PyTorch (``attnforge_kernels.checks.dropout_ref``) from the generator's seed and
  offset; the dropped fraction must be p within sampling noise (flash_attn's 0.98-1.02 ratio where
  the sample is large); out, dQ, dK, dV and the probabilities follow flash-attention's error rule
  against the fp32 reference that applies that same mask.
* ``fp8`` (layout: ``tensor`` or ``head``): the FP8 forward on inputs quantised to the device's
  e4m3 type with per-tensor or per-(batch, KV head) descale factors, against the fp32 reference
  on the de-quantised inputs. The yardstick is the same math with P rounded to e4m3 (what the
  kernel feeds the P.V product) and the output to the output dtype: the kernel may be off by
  twice its error plus one unit of the output dtype. A device without fp8 matrix instructions
  skips the case with the kernel's own error message.
"""

from __future__ import annotations

import math

from .case import Case, ragged
from .judge import LSE_BOUND, Judge, summary


def _peek_seed_offset(device, increment: int) -> tuple[int, int]:
    """The (seed, offset) the next dropout call on ``device`` will take, leaving torch's
    generator as it was (so the call itself takes the same ones)."""
    import torch

    from ..api.flash_attn import philox_seed_offset

    if device.type == "cuda":
        gen = torch.cuda.default_generators[device.index or 0]
        state = gen.get_state()
        seed_offset = philox_seed_offset(device, increment)
        gen.set_state(state)
    else:
        state = torch.get_rng_state()
        seed_offset = philox_seed_offset(device, increment)
        torch.set_rng_state(state)
    return seed_offset


def _delta_rounding(q, k, v, keep, probs, do, p: float, scale: float, dtype):
    """max |change| of dQ and of dK when the backward's delta = rowsum(O * dO) reads O rounded
    to ``dtype``, as flash_attn's backward and the kernels do (the output is stored in ``dtype``).

    Without dropout a one-key row has O = V exactly, so dQ = dK = 0 exactly; with dropout O =
    V / (1 - p) is rounded and that rounding, not the kernel, sets dQ and dK there. The fp32 and
    same-dtype references differentiate through the graph and never see it: this is the part of
    the kernel's error they cannot account for, added to their yardstick.
    """
    import torch

    hq, hk = q.shape[2], k.shape[2]
    q, k, v, do = q.float(), k.float(), v.float(), do.float()
    k = k.repeat_interleave(hq // hk, dim=2)
    v = v.repeat_interleave(hq // hk, dim=2)
    o = torch.einsum("bhst,bthd->bshd", probs * keep / (1.0 - p), v)
    delta_err = ((o.to(dtype).float() - o) * do).sum(-1).transpose(1, 2)  # (b, h, sq)
    ddq = scale * delta_err[..., None] * torch.einsum("bhst,bthd->bhsd", probs, k)
    ddk = scale * torch.einsum("bhst,bshd->bthd", probs * delta_err[..., None], q)
    ddk = ddk.reshape(ddk.shape[0], ddk.shape[1], hk, hq // hk, -1).sum(3)
    return ddq.abs().max().item() if ddq.numel() else 0.0, (
        ddk.abs().max().item() if ddk.numel() else 0.0
    )


def _dropout_kernel(case: Case, seqs: tuple, lq, lk, window, device):
    """The dropout call through flash_attn_func or, varlen, flash_attn_varlen_func, with its
    backward: per sequence, its out and dq, dk, dv, and the returned S_dmask."""
    import torch

    from ..api.flash_attn import flash_attn_func, flash_attn_varlen_func

    qs, ks, vs, dos = seqs
    varlen = case.varlen
    if varlen:
        q, k, v = (torch.cat([t[0] for t in ts]).requires_grad_() for ts in (qs, ks, vs))
        cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32)
        cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32)
        out, _, sdm = flash_attn_varlen_func(
            q, k, v, cu_q.to(device), cu_k.to(device), max(lq), max(lk), dropout_p=case.p,
            window_size=window, return_attn_probs=True,
        )  # fmt: skip
        out.backward(torch.cat([t[0] for t in dos]))
        outs = list(out.split(lq))
        grads = [list(t.grad.split(n)) for t, n in zip((q, k, v), (lq, lk, lk), strict=True)]
    else:
        q, k, v = (torch.cat(ts).requires_grad_() for ts in (qs, ks, vs))
        out, _, sdm = flash_attn_func(
            q, k, v, dropout_p=case.p, window_size=window, return_attn_probs=True
        )
        out.backward(torch.cat(dos))
        outs = list(out.split(1))
        grads = [list(t.grad.split(1)) for t in (q, k, v)]
    return outs, grads, sdm


def compare_dropout(case: Case, device, seed: int = 0) -> dict:
    """Run one ``dropout`` case; ``{"ok": bool, "metrics": {...}}``."""
    import torch

    from ..api.flash_attn import _get_block_size_n, keep_threshold
    from .dropout_ref import attention_dropout_ref, keep_mask, normalize_sdmask
    from .reference import both_precisions, visible

    dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float16
    g = torch.Generator(device="cpu").manual_seed(seed)
    left, right, _, _ = case.mask_args()
    window = (left if left is not None else -1, right if right is not None else -1)
    varlen = case.varlen
    lq = ragged(case.b, case.sq) if varlen else [case.sq] * case.b
    lk = ragged(case.b, case.sk)[::-1] if varlen else [case.sk] * case.b

    def rnd(n, h):
        return torch.randn(1, n, h, case.d, generator=g).to(device=device, dtype=dtype)

    qs = [rnd(n, case.hq) for n in lq]
    ks = [rnd(n, case.hk) for n in lk]
    vs = [rnd(n, case.hk) for n in lk]
    dos = [rnd(n, case.hq) for n in lq]
    torch.manual_seed(seed + 1)
    rng_seed, rng_offset = _peek_seed_offset(device, case.b * case.hq * 32)
    outs, grads, sdm = _dropout_kernel(case, (qs, ks, vs, dos), lq, lk, window, device)
    threshold = keep_threshold(case.p)
    keep_all = keep_mask(
        rng_seed, rng_offset, threshold, case.b, case.hq, max(lq), max(lk), device=device
    )
    judge = Judge(torch.finfo(dtype).eps, ("out", "dq", "dk", "dv", "probs"))
    mismatched = dropped = visible_n = 0
    for i in range(case.b):
        vis = visible(lq[i], lk[i], left, right, device)
        keep = keep_all[i : i + 1, :, : lq[i], : lk[i]]
        mine = sdm[i : i + 1, :, : lq[i], : lk[i]]
        # The sign bit, so that a dropped probability that underflowed to -0.0 still reads as
        # dropped (flash_attn's tests read ``S_dmask >= 0``, the same for every nonzero value).
        kept = ~torch.signbit(mine)
        mismatched += int((kept != keep)[..., vis].sum())
        dropped += int((~kept)[..., vis].sum())
        visible_n += int(vis.sum()) * case.hq
        res = both_precisions(
            lambda *t, keep=keep, **kw: attention_dropout_ref(*t, keep, case.p, **kw),
            qs[i], ks[i], vs[i], dos[i], left=left, right=right,
        )  # fmt: skip
        ref, pt = res[True], res[False]
        ddq, ddk = _delta_rounding(
            qs[i], ks[i], vs[i], keep, ref[4], dos[i], case.p, case.d**-0.5, dtype
        )
        # flash_attn's S_dmask is unnormalised: decoded as its tests decode it.
        probs_mine = normalize_sdmask(
            mine, qs[i], ks[i], _get_block_size_n(device, case.d, True, case.mask == "causal"),
            left=left, right=right,
        )  # fmt: skip
        mine_all = (outs[i], grads[0][i], grads[1][i], grads[2][i], probs_mine)
        keys = ("out", "dq", "dk", "dv", "probs")
        for n, (key, a) in enumerate(zip(keys, mine_all, strict=True)):
            judge.tensor(key, a, ref[n], pt[n], extra={"dq": ddq, "dk": ddk}.get(key, 0.0))
    frac = dropped / visible_n if visible_n else 0.0
    # flash_attn asserts 0.98 <= fraction / p <= 1.02 on its large tests; small samples get
    # 5 binomial standard deviations instead.
    slack = max(0.02 * case.p, 5 * math.sqrt(case.p * (1 - case.p) / max(visible_n, 1)))
    frac_ok = visible_n == 0 or abs(frac - case.p) <= slack
    metrics = judge.metrics()
    metrics.update(
        mask_mismatch=float(mismatched),
        drop_fraction=frac,
        drop_slack=slack,
        visible=float(visible_n),
    )
    return {"ok": judge.ok and mismatched == 0 and frac_ok, "metrics": metrics}


def _quantise(x, fp8, per_head: bool):
    """(x as ``fp8``, fp32 descale) with the descale per tensor or per (batch, head)."""
    import torch

    amax = x.abs().amax(dim=(1, 3)) if per_head else x.abs().amax()
    descale = amax.clamp_min(1e-12) / torch.finfo(fp8).max
    div = descale[:, None, :, None] if per_head else descale
    return (x / div).to(fp8), descale


def _dequantise(x8, descale, per_head: bool):
    return x8.float() * (descale[:, None, :, None] if per_head else descale)


def compare_fp8(case: Case, device, seed: int = 0) -> dict:
    """Run one ``fp8`` case; ``{"ok": bool, "metrics": {...}}`` or ``{"skip": reason}``."""
    import torch

    from ..api.flash_attn import flash_attn_fp8_func, fp8_dtype_for
    from .reference import attention_ref, fp8_emulation

    try:
        fp8 = fp8_dtype_for(device)
    except NotImplementedError as e:
        return {"skip": str(e)}
    out_dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float16
    g = torch.Generator(device="cpu").manual_seed(seed)
    per_head = case.layout == "head"
    left, right, _, _ = case.mask_args()
    window = (left if left is not None else -1, right if right is not None else -1)

    def rnd(n, h, spread):
        # Heads of different magnitude, so per-head descales differ.
        x = torch.randn(case.b, n, h, case.d, generator=g)
        return (x * torch.linspace(0.5, spread, h).view(1, 1, h, 1)).to(device)

    qf, kf, vf = rnd(case.sq, case.hq, 2.0), rnd(case.sk, case.hk, 3.0), rnd(case.sk, case.hk, 1.5)
    # flash_attn 3's layout: Q's descale is per KV head, so Q is quantised per KV-head group.
    grp = case.hq // case.hk
    qg = qf.reshape(case.b, case.sq, case.hk, grp * case.d)
    q8, dq = _quantise(qg, fp8, per_head)
    q8 = q8.reshape(qf.shape)
    k8, dk = _quantise(kf, fp8, per_head)
    v8, dv = _quantise(vf, fp8, per_head)
    scale = case.d**-0.5
    out, lse, _ = flash_attn_fp8_func(
        q8, k8, v8, dq, dk, dv, causal=case.mask == "causal",
        window_size=window if case.mask == "window" else (-1, -1), out_dtype=out_dtype,
        return_attn_probs=True,
    )  # fmt: skip
    qd = _dequantise(q8.reshape(qg.shape), dq, per_head).reshape(qf.shape)
    kd, vd = _dequantise(k8, dk, per_head), _dequantise(v8, dv, per_head)
    ref, lse_ref = attention_ref(qd, kd, vd, scale=scale, left=left, right=right)
    emu = fp8_emulation(qd, kd, vd, fp8, scale=scale, left=left, right=right, out_dtype=out_dtype)
    judge = Judge(torch.finfo(out_dtype).eps, ("out",))
    judge.tensor("out", out, ref, emu)
    judge.lse(lse, lse_ref, bound=LSE_BOUND + _fp8_score_slack(qd, kd, scale))
    metrics = judge.metrics()
    metrics["err_emulation"] = (emu.float() - ref).abs().max().item() if ref.numel() else 0.0
    return {"ok": judge.ok, "metrics": metrics, "fp8": str(fp8)}


# Hopper's FP8 tensor cores keep about 14 bits of the running sum ("limited accumulation
# precision", DeepSeek-V3 technical report, arXiv 2412.19437 section 3.3.2), so each 32-deep MMA
# step may lose about 2^-13 of the magnitude it adds. The H100 measured LSE errors of 1.1e-2 to
# 1.7e-2 at 4096 keys with per-head scales (2026-11-24), over the fixed 1e-2 this replaced.
FP8_MMA_K = 32
FP8_ACC_EPS = 2.0**-13


def _fp8_score_slack(qd, kd, scale: float) -> float:
    """How far a score (hence the LSE) may move under reduced-precision FP8 accumulation:
    (d / 32) * 2^-13 * scale * max over (query, key) of sum_d |q||k|."""
    import torch

    hq, hk, d = qd.shape[2], kd.shape[2], qd.shape[3]
    ka = kd.abs().repeat_interleave(hq // hk, dim=2)
    mag = torch.einsum("bshd,bthd->bhst", qd.abs(), ka).amax().item() if qd.numel() else 0.0
    return -(-d // FP8_MMA_K) * FP8_ACC_EPS * scale * mag


def run(case: Case, device) -> dict:
    """One ``dropout`` or ``fp8`` case as ``run_case`` reports it (without the timing)."""
    if case.kind == "dropout":
        res = compare_dropout(case, device)
        m = res["metrics"]
        msg = (
            f"{case.name}: max err/bound {summary(m, ('out', 'dq', 'dk', 'dv', 'probs'))}, "
            f"mask mismatches {m['mask_mismatch']:.0f}, "
            f"dropped {m['drop_fraction']:.4f} (p={case.p}, +-{m['drop_slack']:.4f})"
        )
        return {"status": "pass" if res["ok"] else "fail", "message": msg, "metrics": m}
    res = compare_fp8(case, device)
    if "skip" in res:
        return {"status": "skip", "message": f"{case.name}: {res['skip']}", "metrics": {}}
    m = res["metrics"]
    msg = (
        f"{case.name} ({res['fp8'].removeprefix('torch.')}): max err/bound "
        f"{m['err_out']:.2e}/{m['bound_out']:.2e} (P-in-fp8 emulation {m['err_emulation']:.2e}), "
        f"lse={m['err_lse']:.1e}/{m['bound_lse']:.1e}"
    )
    return {"status": "pass" if res["ok"] else "fail", "message": msg, "metrics": m}
