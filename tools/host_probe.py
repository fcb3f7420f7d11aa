"""Where the host time of one bundled-kernel call goes, on a CUDA GPU (issue 30 §2).

    python tools/host_probe.py [--calls N] [--json FILE]

Run from a checkout's root: it imports that checkout's ``attnforge_kernels``. Each row is host
microseconds per call: many back-to-back calls timed with ``time.perf_counter`` and one
synchronize at the end, the best of three rounds. The rows take one forward apart, from SDPA's
flash backend and ``flash_attn_func`` down to the compiled kernel's C launcher called with
arguments built beforehand, then the backward's two launches the same way, and print cProfile's
top entries for 1000 Triton launches of the forward. A one-off measurement, not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction, compute_cache_key  # noqa: E402

from attnforge_kernels.api import flash_attn as interface  # noqa: E402


def per_call(fn, calls: int, rounds: int = 3) -> float:
    """Best of ``rounds`` of ``calls`` back-to-back calls, µs per call."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


class Recorder:
    """Records each JITFunction.run (the kernel, grid, arguments) while active."""

    def __init__(self):
        self.calls = []
        self._orig = JITFunction.run

    def __enter__(self):
        rec, orig = self.calls, self._orig

        def run(fn, *args, grid, warmup, **kwargs):
            rec.append((fn, grid, args, dict(kwargs)))
            return orig(fn, *args, grid=grid, warmup=warmup, **kwargs)

        JITFunction.run = run
        return self

    def __exit__(self, *exc):
        JITFunction.run = self._orig


def launch_rows(prefix: str, fn, grid, args, kwargs, calls: int, rows: dict) -> None:
    """The rows of one Triton launch taken apart (arguments built beforehand)."""
    kernel = fn[grid](*args, **kwargs)
    torch.cuda.synchronize()
    dev = driver.active.get_current_device()
    stream = driver.active.get_current_stream(dev)
    _, key_cache, _, _, binder = fn.device_caches[dev]
    kw = dict(kwargs)
    kw["debug"] = kw.get("debug", fn.debug) or triton.knobs.runtime.debug
    kw["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
    bound, spec, options = binder(*args, **kw)
    vals = tuple(bound.values())
    g = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
    run = kernel.run
    launch = run.launch
    meta = kernel.packed_metadata
    func = kernel.function
    coop, pdl = run.launch_cooperative_grid, run.launch_pdl
    scratch = (run.global_scratch_size, run.profile_scratch_size)
    ints = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in vals)
    const = [p.is_constexpr for p in fn.params]
    slim = tuple(None if c else a for a, c in zip(ints, const, strict=True))
    print(
        f"{prefix}: grid {g}, {len(vals)} parameters ({sum(const)} constexpr), "
        f"{sum(isinstance(a, torch.Tensor) for a in vals)} tensors, scratch {scratch}",
        flush=True,
    )

    def jit_launch():
        fn[grid](*args, **kwargs)

    def direct():
        run(*g, stream, func, meta, None, None, None, *vals)

    def c_only():
        launch(*g, stream, func, coop, pdl, None, None, meta, None, None, None, *vals)

    def c_ints():
        launch(*g, stream, func, coop, pdl, None, None, meta, None, None, None, *ints)

    def c_slim():
        launch(*g, stream, func, coop, pdl, None, None, meta, None, None, None, *slim)

    rows[f"{prefix}: fn[grid](...) (Triton's launch path)"] = per_call(jit_launch, calls)
    rows[f"{prefix}: binder(*args) (bind + specialise)"] = per_call(
        lambda: binder(*args, **kw), calls
    )
    rows[f"{prefix}: compute_cache_key (hit)"] = per_call(
        lambda: compute_cache_key(key_cache, spec, options), calls
    )
    rows[f"{prefix}: current device + stream"] = per_call(
        lambda: driver.active.get_current_stream(driver.active.get_current_device()), calls
    )
    raw_stream = torch._C._cuda_getCurrentRawStream
    cur = torch.cuda.current_device
    rows[f"{prefix}: torch current device + raw stream"] = per_call(
        lambda: raw_stream(cur()), calls
    )
    rows[f"{prefix}: a per-argument key (a5e71ab's _spec over the runtime args)"] = per_call(
        lambda: tuple(map(_spec, args)), calls
    )
    rows[f"{prefix}: kernel.run(...) (CudaLauncher, tensors)"] = per_call(direct, calls)
    if scratch == (0, 0):
        rows[f"{prefix}: C launch(...) (tensors)"] = per_call(c_only, calls)
        rows[f"{prefix}: C launch(...) (int pointers)"] = per_call(c_ints, calls)
        rows[f"{prefix}: C launch(...) (int pointers, constexprs None)"] = per_call(c_slim, calls)
    rows[f"{prefix}: tuple(t.data_ptr() ...) of its tensors"] = per_call(
        lambda: tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in vals), calls
    )
    return jit_launch


def _spec(a):
    """a5e71ab's key of one runtime argument (what Triton's specialisation reads)."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool) or a is None:
        return a
    if isinstance(a, int):
        return (a == 1, a % 16 == 0, -(2**31) <= a < 2**31, 0 <= a < 2**63)
    if isinstance(a, float):
        return float
    return a


def profile(fn, n: int, top: int = 22) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def count_replays() -> dict:
    """{"fwd": n, "bwd": n}: how many times a Python plan replayed, counted from now on."""
    hits = {"fwd": 0, "bwd": 0}
    for cls, kind in ((interface.PyForwardPlan, "fwd"), (interface.PyBackwardPlan, "bwd")):
        orig = cls.__call__

        def counted(self, *a, _orig=orig, _kind=kind):
            hits[_kind] += 1
            return _orig(self, *a)

        cls.__call__ = counted

    return hits


def verify_inputs(c, seed):
    """q, k, v and cu_seqlens (or None) of one of VERIFY_CASES, from ``seed``."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, sq, sk, hq, hk, d, dt, layout = c["shape"]
    if c.get("varlen"):
        cu = torch.tensor(c["varlen"], dtype=torch.int32, device="cuda")
        tot = int(cu[-1])
        q, k, v = (torch.randn(tot, h, d, generator=g, device="cuda", dtype=dt)
                   for h in (hq, hk, hk))  # fmt: skip
        return q, k, v, cu
    shp = [(b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, d)]
    if layout == "bhsd":
        q, k, v = (torch.randn(x[0], x[2], x[1], x[3], generator=g, device="cuda", dtype=dt)
                   .transpose(1, 2) for x in shp)  # fmt: skip
    else:
        q, k, v = (torch.randn(*x, generator=g, device="cuda", dtype=dt) for x in shp)
    if c.get("alias"):
        k = v = q
    return q, k, v, None


def verify_step(c, seed):
    """out and the gradients of one call of a VERIFY_CASES case through flash_attn's API."""
    q, k, v, cu = verify_inputs(c, seed)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    if c.get("alias"):
        leaves = [leaves[0]] * 3
    q, k, v = leaves
    kw = c.get("kw", {})
    if cu is not None:
        mx = int((cu[1:] - cu[:-1]).max())
        out = interface.flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, **kw)
    else:
        out = interface.flash_attn_func(q, k, v, **kw)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    do = torch.randn(out.shape, generator=g, device="cuda", dtype=out.dtype)
    if c.get("do_t"):
        do = do.transpose(0, 1).contiguous().transpose(0, 1)
    grads = torch.autograd.grad(out, list(dict.fromkeys(leaves)), do)
    return [out.detach(), *grads]


BF16, FP16 = torch.bfloat16, torch.float16
# The calls verify() replays: (shape: b, sq, sk, hq, hk, d, dtype, layout) and what else each has.
VERIFY_CASES = [
    {"shape": (2, 128, 128, 4, 4, 64, BF16, "bshd")},
    {"shape": (2, 256, 77, 8, 8, 80, FP16, "bshd")},
    {"shape": (2, 256, 77, 8, 8, 80, FP16, "bhsd")},
    {"shape": (1, 200, 300, 8, 2, 40, BF16, "bhsd"), "kw": {"causal": True}},
    {"shape": (2, 100, 64, 4, 4, 40, BF16, "bshd")},
    {"shape": (2, 64, 64, 4, 4, 160, FP16, "bshd"), "do_t": True},
    {"shape": (2, 128, 128, 4, 4, 128, BF16, "bshd"), "kw": {"causal": True}},
    {
        "shape": (2, 96, 96, 4, 4, 96, BF16, "bshd"),
        "kw": {"window_size": (16, 8), "softcap": 20.0},
    },
    {"shape": (2, 64, 64, 4, 4, 64, BF16, "bshd"), "alias": True},
    {"shape": (2, 64, 64, 4, 4, 64, BF16, "bshd")},
    {"shape": (3, 0, 0, 4, 2, 64, BF16, "bshd"), "varlen": [0, 50, 170, 171]},
    {"shape": (3, 0, 0, 4, 2, 64, BF16, "bshd"), "varlen": [0, 60, 170, 171]},
    # Hopper runs its Gluon forward and dK/dV kernel here (d=128 from 2048 tokens,
    # attnforge_kernels.device.configs.GLUON_MIN_SEQ); other GPUs, the Triton kernels.
    {"shape": (1, 4096, 4096, 4, 2, 128, BF16, "bshd")},
    {"shape": (1, 4096, 4096, 4, 2, 128, BF16, "bshd"), "kw": {"causal": True}},
]


def verify() -> int:
    """Planned calls (attnforge_kernels.launch.plans) against the full path, bitwise, on fresh
    inputs: the first call of each signature records, the second and third replay (natively, forward
    and backward, where the native launch path is active). Returns the number of failures."""
    from attnforge_kernels.launch import plans as launch
    from attnforge_kernels.launch import replay as native

    hits = count_replays()
    fails = 0
    launch.clear()
    print(f"verify: native launch path {native.status()}", flush=True)
    natives = [0, 0, 0, 0]
    for i, c in enumerate(VERIFY_CASES):
        before = dict(hits)
        native.counts()
        # Records, then replays (natively where the native path is active: its forward and
        # backward; the Python plans where it is not), then once more.
        got = [verify_step(c, 10 * i + s) for s in (1, 2, 3)]
        n = native.counts()
        natives = [a + b for a, b in zip(natives, n, strict=True)]
        launch.ENABLED, enabled = False, launch.ENABLED
        try:
            want = [verify_step(c, 10 * i + s) for s in (1, 2, 3)]
        finally:
            launch.ENABLED = enabled
        ok = all(torch.equal(a, b) for g, w in zip(got, want, strict=True)
                 for a, b in zip(g, w, strict=True))  # fmt: skip
        fails += not ok
        shape = c["shape"][:6] + (str(c["shape"][6]).removeprefix("torch."), c["shape"][7])
        extra = {k: v for k, v in c.items() if k != "shape"}
        print(f"verify {shape} {extra}: {'ok' if ok else 'FAIL'}, replays fwd "
              f"{hits['fwd'] - before['fwd']} bwd {hits['bwd'] - before['bwd']}, native fwd "
              f"{n[0]} bwd {n[1]} back to Python {n[2]}", flush=True)  # fmt: skip
    print(f"verify: {len(VERIFY_CASES) - fails}/{len(VERIFY_CASES)} cases bitwise equal to the full path; "
          f"plans fwd {len(launch.FORWARD.plans)}, bwd {len(launch.BACKWARD.plans)} + "
          f"{sum(len(p.backward.plans) for p in launch.FORWARD.plans.values() if p)} "
          f"in forward plans; native replays fwd {natives[0]} bwd {natives[1]}, backwards sent "
          f"back to Python {natives[2]}")  # fmt: skip
    return fails + verify_decode()


def decode_inputs(i: int, case: tuple):
    """q, the two caches and the keyword arguments of verify_decode's case ``i``."""
    b, rows, hq, hk, d, dt, sq, new, opts = case
    g = torch.Generator(device="cuda").manual_seed(100 + i)

    def rnd(*shape, g=g, dt=dt):
        return torch.randn(*shape, generator=g, device="cuda", dtype=dt)

    page = opts.get("page")
    n_cache = b + 1 if opts.get("bidx") else b
    kc, vc = (rnd(2 * b * rows // page, page, hk, d) if page else rnd(n_cache, rows, hk, d)
              for _ in range(2))  # fmt: skip
    q = rnd(b, sq, hq, d)
    kw = {"num_splits": opts.get("num_splits", 0), "causal": opts.get("causal", False)}
    kw["return_softmax_lse"] = opts.get("lse", False)
    for name in ("window_size", "softcap"):
        if name in opts:
            kw[name] = opts[name]
    if opts.get("lens"):
        lens = [rows - new - 7 * j for j in range(b)]
        kw["cache_seqlens"] = torch.tensor(lens, dtype=torch.int32, device="cuda")
    if new:
        kw["k"], kw["v"] = rnd(b, new, hk, d), rnd(b, new, hk, d)
    if opts.get("rotary"):
        angle = torch.rand(rows, d // 4, generator=g, device="cuda") * 6.2832
        kw["rotary_cos"], kw["rotary_sin"] = angle.cos().to(dt), angle.sin().to(dt)
    if opts.get("bidx"):
        kw["cache_batch_idx"] = torch.tensor([2, 0, 1][:b], dtype=torch.int32, device="cuda")
    if opts.get("leftpad"):
        kw["cache_leftpad"] = torch.tensor([5 * j for j in range(b)], dtype=torch.int32,
                                           device="cuda")  # fmt: skip
    if page:
        perm = torch.randperm(2 * b * rows // page, generator=g, device="cuda")
        kw["block_table"] = perm[: b * rows // page].reshape(b, -1).to(torch.int32)
    return q, kc, vc, kw


def verify_decode() -> int:
    """flash_attn_with_kvcache's plans against its full path, bitwise (out, LSE and the caches
    after an append), on copies of one cache: a call records (and hands a step on a contiguous
    cache to the native launch path), the next two replay, natively where it took the step.
    Returns the number of failures."""
    from attnforge_kernels.api import kvcache
    from attnforge_kernels.launch import plans as launch
    from attnforge_kernels.launch import replay as native

    bf, fp = torch.bfloat16, torch.float16
    # (batch, cache rows, query heads, KV heads, head dim, dtype, seqlen_q, new keys, kwargs)
    cases = [
        (1, 4096, 32, 8, 128, bf, 1, 0, {}),  # attnforge_kernels.bench --decode's batch-1 step
        (2, 1000, 8, 2, 64, fp, 1, 0, {"lens": True, "lse": True, "window_size": (64, 0)}),
        (3, 700, 8, 8, 128, bf, 2, 0, {"lens": True, "bidx": True, "softcap": 30.0}),
        (2, 333, 16, 4, 128, bf, 1, 0, {"lens": True, "num_splits": 3, "lse": True}),
        (2, 1024, 8, 2, 128, bf, 1, 1, {"lens": True, "rotary": True, "causal": True}),
        (2, 512, 8, 2, 64, bf, 1, 0, {"lens": True, "page": 256}),
        (2, 900, 8, 2, 64, fp, 3, 3, {"lens": True, "leftpad": True, "causal": True}),
    ]
    fails, natives = 0, 0
    for i, (b, rows, hq, hk, d, dt, sq, new, opts) in enumerate(cases):
        q, kc, vc, kw = decode_inputs(i, cases[i])

        def call(kc=kc, vc=vc, q=q, kw=kw):
            k2, v2 = kc.clone(), vc.clone()
            res = kvcache.flash_attn_with_kvcache(q, k2, v2, **kw)
            res = res if isinstance(res, tuple) else (res,)
            return [*res, k2, v2]

        native.counts()
        start = kvcache.KVPlan.replays
        got = [call() for _ in range(3)]
        n = native.counts()[3]
        replays = kvcache.KVPlan.replays - start
        natives += n
        launch.ENABLED, enabled = False, launch.ENABLED
        try:
            want = call()
        finally:
            launch.ENABLED = enabled
        ok = all(torch.equal(a, w) for g_ in got for a, w in zip(g_, want, strict=True))
        fails += not ok
        print(f"verify decode {(b, rows, hq, hk, d, str(dt).removeprefix('torch.'), sq, new)} "
              f"{opts}: {'ok' if ok else 'FAIL'}, plan replays {replays}, native {n}",
              flush=True)  # fmt: skip
    print(
        f"verify decode: {len(cases) - fails}/{len(cases)} cases bitwise equal to the full "
        f"path; plans {len(launch.KVCACHE.plans)}, native replays {natives}",
        flush=True,
    )
    return fails


def forward_rows(calls: int, rows: dict) -> tuple[str, str]:
    """Host time of the tiny forward each way into ``rows``; the cProfiles of run_forward and of
    the bare attn_fwd launch."""
    dev = "cuda"
    # Forward at bench --host's tiny shape (1, 16, 1, 64) bf16, BSHD.
    q, k, v = (torch.randn(1, 16, 1, 64, device=dev, dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def sdpa():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt)

    scale = 64**-0.5
    mask = interface.Mask()
    fargs = (q, k, v, None, None, 16, 16, 1, scale, mask, None, False)
    with torch.no_grad(), Recorder() as rec:
        interface.run_forward(*fargs)
    torch.cuda.synchronize()
    with torch.no_grad():
        rows["fwd: SDPA-flash"] = per_call(sdpa, calls)
        rows["fwd: flash_attn_func"] = per_call(lambda: interface.flash_attn_func(q, k, v), calls)
        rows["fwd: run_forward"] = per_call(lambda: interface.run_forward(*fargs), calls)
        rows["fwd: two torch.empty"] = per_call(
            lambda: (
                torch.empty((1, 16, 1, 64), dtype=torch.bfloat16, device=dev),
                torch.empty((1, 1, 16), dtype=torch.float32, device=dev),
            ),
            calls,
        )
        fwd = [c for c in rec.calls if c[0].fn.__name__ == "attn_fwd"]
        if fwd:
            fn, grid, args, kwargs = fwd[0]
            jit_fwd = launch_rows("fwd attn_fwd", fn, grid, args, kwargs, calls, rows)
        else:
            print("the forward did not launch attn_fwd through Triton: no launch rows")
            jit_fwd = None
        prof_fwd = profile(lambda: interface.run_forward(*fargs), 1000)
        prof_launch = profile(jit_fwd, 1000) if jit_fwd else ""
    return prof_fwd, prof_launch


def step_rows(calls: int, rows: dict, no_profile: bool) -> str:
    """Host time of the small training step each way into ``rows``; run_backward's cProfile."""
    dev, mask = "cuda", interface.Mask()
    # Forward + backward at (2, 1024, 8, 80) fp16, BSHD (docs/benchmarks.md's small step).
    b, s, h, d = 2, 1024, 8, 80
    q, k, v = (
        torch.randn(b, s, h, d, device=dev, dtype=torch.float16, requires_grad=True)
        for _ in range(3)
    )
    do = torch.randn_like(q)

    def step():
        interface.flash_attn_func(q, k, v).backward(do)
        q.grad = k.grad = v.grad = None

    qt, kt, vt = (t.detach().transpose(1, 2).clone().requires_grad_() for t in (q, k, v))
    dot = do.transpose(1, 2)

    def sdpa_step():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(qt, kt, vt).backward(dot)
        qt.grad = kt.grad = vt.grad = None

    scale = d**-0.5
    fargs = (q.detach(), k.detach(), v.detach(), None, None, s, s, b, scale, mask, None, False)
    out, lse = interface.run_forward(*fargs)
    bargs = (do, *fargs[:3], out, lse, None, None, s, s, b, scale, mask, None, False)
    with Recorder() as rec:
        interface.run_backward(*bargs)
    torch.cuda.synchronize()
    rows["step: SDPA-flash fwd+bwd"] = per_call(sdpa_step, calls // 4)
    rows["step: flash_attn_func fwd+bwd"] = per_call(step, calls // 4)
    rows["bwd: run_backward"] = per_call(lambda: interface.run_backward(*bargs), calls // 2)
    for fn, grid, args, kwargs in rec.calls:
        name = fn.fn.__name__
        launch_rows(f"bwd {name}", fn, grid, args, kwargs, calls // 2, rows)
    prof_bwd = "" if no_profile else profile(lambda: interface.run_backward(*bargs), 500)
    return prof_bwd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", default="")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--verify", action="store_true", help="planned calls against the full path")
    a = ap.parse_args()
    if a.verify:
        return 1 if verify() else 0
    rows: dict[str, float] = {}
    prof_fwd, prof_launch = forward_rows(a.calls, rows)
    prof_bwd = step_rows(a.calls, rows, a.no_profile)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}, Python {sys.version.split()[0]}")  # fmt: skip
    print("| what | host µs per call |\n|---|---|")
    for name, us in rows.items():
        print(f"| {name} | {us:.1f} |")
    if not a.no_profile:
        print("\ncProfile, 1000 run_forward calls:\n" + prof_fwd)
        print("\ncProfile, 1000 attn_fwd[grid] launches:\n" + prof_launch)
        print("\ncProfile, 500 run_backward calls:\n" + prof_bwd)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
