"""Correctness checks of the kernels, as the validation suite calls them.

``list_cases(quick)`` names the cases; ``run_case(name)`` runs one and returns
``{"status": "pass"|"fail"|"skip", "message": str, "metrics": {str: float}}``. A case name encodes
everything it runs, so a case re-runs from its name alone (the validator runs each in its own
subprocess). ``python -m kernels.check [--quick|--boundary] [--json FILE]`` runs a list in-process.

The rule is flash-attention's: the kernel's max error against an fp32 reference is at most twice
the error of the same computation in the input dtype (three times for gradients), plus a small
floor (perf.md section 6). It lives in ``contract.tolerance``, shared with the validation suite's
SDPA and flash_attn checks; the contract package travels with both.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass

from contract import tolerance

from . import check_variants

CASE_RE = re.compile(
    r"^attn-(?P<dtype>fp16|bf16)-b(?P<b>\d+)-sq(?P<sq>\d+)-sk(?P<sk>\d+)-h(?P<hq>\d+)x(?P<hk>\d+)"
    r"-d(?P<d>\d+)-(?P<mask>full|causal|window|alibi|softcap|sdpacausal)-(?P<layout>bshd|bhsd|varlen)$"
)
SHIM_CASE = "shim-routing"


@dataclass(frozen=True)
class Case:
    """One forward+backward comparison."""

    dtype: str
    b: int
    sq: int
    sk: int
    hq: int
    hk: int
    d: int
    mask: str = "full"
    layout: str = "bshd"

    @property
    def name(self) -> str:
        return (
            f"attn-{self.dtype}-b{self.b}-sq{self.sq}-sk{self.sk}-h{self.hq}x{self.hk}"
            f"-d{self.d}-{self.mask}-{self.layout}"
        )

    @classmethod
    def parse(cls, name: str) -> Case:
        m = CASE_RE.match(name)
        if not m:
            raise ValueError(f"not a kernel case name: {name!r}")
        g = m.groupdict()
        ints = {k: int(g[k]) for k in ("b", "sq", "sk", "hq", "hk", "d")}
        return cls(dtype=g["dtype"], mask=g["mask"], layout=g["layout"], **ints)


def _grid_full() -> list[Case]:
    cases: list[Case] = []
    for s in (1, 17, 127, 128, 129, 1000, 4096, 6032, 6889):
        for d in (64, 128):
            for mask in ("full", "causal"):
                cases.append(Case("bf16", 1, s, s, 2, 2, d, mask))
    for d in (40, 72, 80, 96, 160, 256):
        for mask in ("full", "causal"):
            cases.append(Case("bf16", 2, 129, 129, 2, 2, d, mask))
            cases.append(Case("fp16", 1, 1000, 1000, 2, 1, d, mask))
    for hq, hk in ((8, 1), (8, 2), (6, 3), (4, 4)):
        cases.append(Case("bf16", 2, 257, 1000, hq, hk, 128, "causal"))
        cases.append(Case("bf16", 1, 1000, 257, hq, hk, 64, "causal"))
    for sq, sk in ((1, 1000), (1000, 1), (17, 4096), (4096, 17), (6032, 6889)):
        for mask in ("full", "causal"):
            cases.append(Case("bf16", 1, sq, sk, 2, 1, 128, mask))
    for d in (64, 128, 72):
        for mask in ("full", "causal", "window"):
            cases.append(Case("bf16", 4, 700, 900, 4, 2, d, mask, "varlen"))
    for mask in ("window", "alibi", "softcap", "sdpacausal"):
        for d in (64, 128):
            cases.append(Case("bf16", 2, 1000, 777, 4, 2, d, mask))
            cases.append(Case("fp16", 1, 129, 1000, 2, 2, d, mask))
    for mask in ("full", "causal"):
        cases.append(Case("bf16", 2, 1000, 1000, 4, 2, 128, mask, "bhsd"))
        cases.append(Case("fp16", 1, 6889, 6889, 2, 2, 128, mask, "bhsd"))
    return cases


def _grid_quick() -> list[Case]:
    return [
        Case("bf16", 1, 129, 129, 2, 2, 128, "full"),
        Case("bf16", 1, 129, 129, 2, 2, 128, "causal"),
        Case("fp16", 2, 17, 1000, 4, 2, 64, "causal"),
        Case("bf16", 1, 1000, 17, 4, 1, 80, "causal"),
        Case("bf16", 1, 6889, 6889, 1, 1, 128, "full", "bhsd"),
        Case("fp16", 2, 127, 255, 2, 2, 40, "full"),
        Case("bf16", 1, 300, 300, 2, 2, 256, "causal"),
        Case("bf16", 3, 300, 500, 4, 2, 128, "causal", "varlen"),
        Case("bf16", 2, 500, 400, 2, 2, 64, "window"),
        Case("bf16", 1, 333, 333, 2, 2, 64, "alibi"),
        Case("bf16", 1, 333, 333, 2, 2, 128, "softcap"),
    ]


def _grid_boundary() -> list[Case]:
    """Small boundary shapes for compute-sanitizer: every partial-tile path, short runtime."""
    cases = []
    for s in (1, 17, 127, 129):
        for d in (40, 72, 128, 256):
            cases.append(Case("bf16", 1, s, s + 3, 2, 1, d, "causal"))
            cases.append(Case("bf16", 1, s + 5, s, 2, 2, d, "full"))
    cases += [
        Case("bf16", 1, 6032, 6032, 1, 1, 128, "full"),
        Case("bf16", 1, 6889, 6889, 1, 1, 128, "full", "bhsd"),
        Case("bf16", 3, 129, 200, 2, 1, 128, "window", "varlen"),
        Case("bf16", 3, 129, 200, 2, 1, 80, "causal", "varlen"),
        Case("bf16", 1, 129, 77, 2, 2, 64, "alibi"),
        Case("bf16", 1, 129, 77, 2, 2, 64, "softcap"),
    ]
    return cases


def grid_cpu() -> list[Case]:
    """Small shapes for Triton's CPU interpreter that still cross its 16x16 tile boundaries:
    odd lengths, Sq != Sk both ways, length 1, GQA/MQA, padded head dims, every mask and layout."""
    return [
        Case("bf16", 2, 37, 37, 2, 2, 64, "full"),
        Case("fp16", 1, 37, 37, 2, 2, 64, "causal"),
        Case("bf16", 1, 17, 70, 4, 2, 32, "causal"),
        Case("fp16", 1, 70, 17, 4, 1, 32, "causal"),
        Case("bf16", 1, 1, 1, 2, 2, 16, "causal"),
        Case("fp16", 1, 1, 45, 2, 1, 40, "full"),
        Case("bf16", 1, 45, 1, 2, 2, 72, "full"),
        Case("fp16", 1, 33, 33, 2, 2, 80, "causal", "bhsd"),
        Case("bf16", 1, 20, 20, 1, 1, 160, "full"),
        Case("fp16", 1, 18, 18, 1, 1, 256, "causal"),
        Case("bf16", 3, 40, 50, 4, 2, 32, "causal", "varlen"),
        Case("fp16", 3, 40, 50, 4, 1, 40, "window", "varlen"),
        Case("bf16", 2, 50, 40, 2, 2, 32, "window"),
        Case("fp16", 1, 45, 33, 2, 2, 32, "alibi"),
        Case("bf16", 1, 45, 33, 2, 2, 32, "softcap"),
        Case("fp16", 1, 20, 45, 2, 2, 32, "sdpacausal"),
        Case("bf16", 1, 45, 20, 2, 2, 32, "sdpacausal"),
    ]


def grid_interpreter() -> list[Case]:
    """What the validation suite runs in the interpreter (no GPU: the cpu stack), a few seconds
    in all: causal with GQA, varlen with a window, MQA and a padded head dim, ALiBi, softcap;
    forward and backward, lengths that leave a partial 16-row tile."""
    return [
        Case("bf16", 1, 19, 23, 4, 2, 32, "causal"),
        Case("fp16", 2, 17, 21, 2, 1, 40, "window", "varlen"),
        Case("bf16", 1, 17, 19, 2, 2, 16, "alibi"),
        Case("fp16", 1, 19, 17, 2, 2, 16, "softcap"),
    ]


def list_cases(quick: bool = False, every_feature_grid: bool = False) -> list[str]:
    """Names of the correctness cases (and the shim routing case).

    The validation suite calls ``list_cases(quick)``: the attention grid (quick or full) plus the
    short grids of dropout/FP8 and packed/kv-cache, so that ``validate all`` stays about a minute
    on a warm GPU (269 cases took 7+ minutes cold on an H100). ``python -m kernels.check`` runs
    the full feature grids too (``every_feature_grid``).

    Under TRITON_INTERPRET=1 the list is :func:`grid_interpreter` (its first case when
    ``quick``): the GPU grid's long sequences would take hours in the interpreter, and each case
    costs the validation suite a process of about 2 s (the CPU tests run :func:`grid_cpu`).
    """
    from . import check_kvcache
    from .configs import INTERPRET

    if INTERPRET:
        cases = grid_interpreter()[:1] if quick else grid_interpreter()
    else:
        cases = _grid_quick() if quick else _grid_full()
        full = every_feature_grid and not quick
        cases += check_variants.grid(not full)  # dropout and FP8 (kernels/check_variants.py)
        cases += check_kvcache.grid(not full)  # packed and kv-cache (kernels/check_kvcache.py)
    return [c.name for c in cases] + [SHIM_CASE]


def unavailable() -> str:
    """Why no case can run on this machine, or '' when they can (the validation suite asks)."""
    return _device()[1]


def _device():
    """The torch device to run on, or None with the reason to skip."""
    import torch

    from .configs import INTERPRET

    if INTERPRET:
        return torch.device("cpu"), ""
    if torch.cuda.is_available():
        return torch.device("cuda"), ""
    return None, "no GPU (CUDA/ROCm) device and TRITON_INTERPRET is not 1"


def _varlen_lengths(n: int, max_len: int) -> list[int]:
    # Ragged on purpose: 1, a prime, the max, and something in between.
    base = [max_len, 1, max(1, max_len // 3 + 7), max(1, max_len - 13)]
    return [base[i % 4] for i in range(n)]


def _mask_args(case: Case):
    """(left, right, softcap, alibi?) for the case, in flash_attn's bottom-right convention."""
    if case.mask == "causal":
        return None, 0, 0.0, False
    if case.mask == "window":
        return 96, 32, 0.0, False
    if case.mask == "alibi":
        return None, 0, 0.0, True
    if case.mask == "softcap":
        return None, None, 30.0, False
    if case.mask == "sdpacausal":
        return None, case.sq - case.sk, 0.0, False  # SDPA's top-left causal
    return None, None, 0.0, False


def compare(case: Case, device, seed: int = 0) -> dict:
    """Run one case; returns metrics and the per-tensor verdicts."""
    import torch

    from .interface import Mask, _FlashAttn
    from .reference import attention_ref

    dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float16
    g = torch.Generator(device="cpu").manual_seed(seed)
    left, right, softcap, use_alibi = _mask_args(case)
    scale = case.d**-0.5
    if case.layout == "varlen":
        lq = _varlen_lengths(case.b, case.sq)
        lk = _varlen_lengths(case.b, case.sk)[::-1]
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

    # Kernel
    if case.layout == "varlen":
        cat = [torch.cat([t[0] for t in ts]).requires_grad_() for ts in (qs, ks, vs)]
        cu_q = torch.tensor(
            [0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device=device
        )
        cu_k = torch.tensor(
            [0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32, device=device
        )
        out, lse = _FlashAttn.apply(
            *cat, cu_q, cu_k, max(lq), max(lk), case.b, scale, mask, alibi, True
        )
        poisoned = False
        out.backward(torch.cat([t[0] for t in dos]))
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
    else:
        q, k, v, do = (torch.cat(ts) for ts in (qs, ks, vs, dos))
        if case.layout == "bhsd":
            # BHSD storage viewed as BSHD: exercised through strides, without a copy.
            q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out, lse = _FlashAttn.apply(
            q, k, v, None, None, case.sq, case.sk, case.b, scale, mask, alibi, False
        )
        poisoned = bool(torch.isnan(out).any())
        out.backward(do)
        outs = list(out.split(1))
        grads = [list(t.grad.split(1)) for t in (q, k, v)]
        lses = list(lse.split(1))

    metrics: dict[str, float] = {}
    worst = {"out": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0, "lse": 0.0}
    bounds = {key: 0.0 for key in worst}
    ok = not poisoned
    for i in range(case.b):
        al = alibi[i : i + 1] if alibi is not None else None
        res = {}
        for upcast in (True, False):
            qi, ki, vi = (t.detach().clone().requires_grad_() for t in (qs[i], ks[i], vs[i]))
            o, lse_r = attention_ref(
                qi,
                ki,
                vi,
                scale=scale,
                left=left,
                right=right,
                softcap=softcap,
                alibi_slopes=al,
                upcast=upcast,
            )
            o.backward(dos[i])
            res[upcast] = (o.detach(), qi.grad, ki.grad, vi.grad, lse_r)
        ref, pt = res[True], res[False]
        mine = (outs[i], grads[0][i], grads[1][i], grads[2][i])
        for key, a, r, p in zip(("out", "dq", "dk", "dv"), mine, ref[:4], pt[:4], strict=False):
            a, r, p = a.reshape(r.shape).float(), r.float(), p.float()
            if not torch.isfinite(a).all():
                ok = False
                worst[key] = float("inf")
                continue
            err = (a - r).abs().max().item() if a.numel() else 0.0
            pt_err = (p - r).abs().max().item() if a.numel() else 0.0
            ref_max = r.abs().max().item() if a.numel() else 0.0
            factor = tolerance.FACTOR if key == "out" else tolerance.GRAD_FACTOR
            good, bound = tolerance.within(err, pt_err, ref_max, torch.finfo(dtype).eps, factor)
            ok &= good
            if err >= worst[key]:
                worst[key], bounds[key] = err, bound
        # LSE: finite rows must agree tightly; empty rows must be +inf on both sides.
        mine_lse = lses[i].reshape(ref[4].shape).float()
        fin = torch.isfinite(ref[4])
        if not torch.equal(fin, torch.isfinite(mine_lse)):
            ok = False
            worst["lse"] = float("inf")
        elif fin.any():
            e = (mine_lse[fin] - ref[4][fin]).abs().max().item()
            worst["lse"] = max(worst["lse"], e)
            ok &= e <= 1e-2
    for key in worst:
        metrics[f"err_{key}"] = worst[key]
        metrics[f"bound_{key}"] = bounds[key]
    return {"ok": bool(ok), "metrics": metrics}


def _run_shim(device) -> dict:
    import torch
    import torch.nn.functional as F

    from . import sdpa_shim

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


def run_case(name: str) -> dict:
    """Run one named case on the device at hand."""
    device, why = _device()
    if device is None:
        return {"status": "skip", "message": why, "metrics": {}}
    t0 = time.perf_counter()
    if name == SHIM_CASE:
        return _run_shim(device)
    if name.startswith(check_variants.PREFIXES):
        r = check_variants.run(name, device)
        r["metrics"]["seconds"] = time.perf_counter() - t0
        return r
    from . import check_kvcache

    if name.startswith(check_kvcache.PREFIXES):
        r = check_kvcache.run(name, device)
        r["metrics"]["seconds"] = time.perf_counter() - t0
        return r
    case = Case.parse(name)
    res = compare(case, device)
    m = res["metrics"]
    m["seconds"] = time.perf_counter() - t0
    worst = ", ".join(
        f"{k}={m['err_' + k]:.2e}/{m['bound_' + k]:.2e}" for k in ("out", "dq", "dk", "dv")
    )
    return {
        "status": "pass" if res["ok"] else "fail",
        "message": f"{name}: max err/bound {worst}, lse={m['err_lse']:.1e}",
        "metrics": m,
    }


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N such as 0/4, got {text!r}") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"need 0 <= I < N, got {text!r}")
    return i, n


def main(argv=None) -> int:
    from . import check_kvcache

    ap = argparse.ArgumentParser(
        prog="python -m kernels.check", description=__doc__.splitlines()[0]
    )
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="the short list")
    group.add_argument("--boundary", action="store_true", help="small boundary shapes (memcheck)")
    ap.add_argument("--case", action="append", help="run only these case names")
    ap.add_argument("--json", help="write all results to this file")
    ap.add_argument(
        "--shard",
        type=_shard,
        metavar="I/N",
        help="run every Nth case of the list from the Ith (0-based): N processes share a GPU",
    )
    args = ap.parse_args(argv)
    if args.case:
        names = args.case
    elif args.boundary:
        names = [c.name for c in _grid_boundary() + check_variants.grid_boundary()]
        names += [c.name for c in check_kvcache.grid_boundary()]
    else:
        names = list_cases(quick=args.quick, every_feature_grid=True)
    if args.shard:
        i, n = args.shard
        names = names[i::n]
    results = {}
    failed = 0
    for name in names:
        try:
            r = run_case(name)
        except Exception as e:  # a case that raises is a failure, the rest still run
            r = {"status": "fail", "message": f"{name}: {type(e).__name__}: {e}", "metrics": {}}
        results[name] = r
        failed += r["status"] == "fail"
        print(f"{r['status']:5s} {r['message']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(f"{len(names) - failed}/{len(names)} not failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
