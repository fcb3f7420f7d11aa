"""Where the host time of one forward + backward step goes, on a CUDA GPU (issue 30 §2).

    python tools/step_probe.py [--steps N] [--json FILE]
    python tools/step_probe.py --stub --device cpu    # the probe's own code, kernels stubbed
    python tools/step_probe.py --backward-key         # the backward's key under a planned forward
    python tools/step_probe.py --native               # the native launch path against Python's

Run from a checkout's root: it imports that checkout's ``attnforge_kernels``. A step is
``flash_attn_func(q, k, v).backward(do)`` on leaves, then their gradients set to None (what
``triton.testing.do_bench``'s ``grad_to_none`` does between the bench's steps). Rows are host
microseconds per step: back-to-back steps timed with ``time.perf_counter`` and one synchronize
at the end, the best of three rounds. Per shape: SDPA-flash's step and ours; ours taken apart
with timestamps (the entry function's Python before ``.apply``, ``apply`` up to our forward, our
forward body, ``apply`` after it, the engine's hand-over to its device thread, our backward body,
the accumulations and the hand-back); and ``autograd.Function`` variants around the same
``run_forward``/``run_backward``, side by side, so that what the Function's shape costs shows. A
one-off measurement, not a test. ``--stub`` replaces the kernels with allocations (to try the
probe where no GPU is).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attnforge_kernels.api import flash_attn as interface  # noqa: E402
from attnforge_kernels.launch import plans as launch

perf = time.perf_counter


def per_step(fn, steps: int, sync, rounds: int = 3) -> float:
    for _ in range(30):
        fn()
    sync()
    best = float("inf")
    for _ in range(rounds):
        t0 = perf()
        for _ in range(steps):
            fn()
        sync()
        best = min(best, (perf() - t0) / steps * 1e6)
    return best


def interleaved(fns: dict, steps: int, sync, rounds: int = 5) -> dict:
    """Each function's best of ``rounds``, the rounds taken in turn (A B C, A B C, ...)."""
    for fn in fns.values():
        for _ in range(30):
            fn()
    sync()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = perf()
            for _ in range(steps):
                fn()
            sync()
            best[name] = min(best[name], (perf() - t0) / steps * 1e6)
    return best


# --- Function variants around the same run_forward / run_backward ---------------------------------


class Packed(torch.autograd.Function):
    """4 inputs (q, k, v, one tuple of the rest), 2 outputs (LSE non-differentiable), the same
    8 saved tensors."""

    @staticmethod
    def forward(ctx, q, k, v, call):
        cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop = call
        out, lse = interface.run_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop=drop
        )
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi)
        ctx.meta = (max_q, max_k, batch, scale, mask, varlen, drop)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k, alibi = ctx.saved_tensors
        max_q, max_k, batch, scale, mask, varlen, drop = ctx.meta
        dq, dk, dv = interface.run_backward(
            dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi,
            varlen, drop=drop,
        )  # fmt: skip
        return dq, dk, dv, None


class OneOut(torch.autograd.Function):
    """13 inputs as now, one output (LSE saved as an intermediate), the same saved tensors."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop):
        out, lse = interface.run_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop=drop
        )
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi)
        ctx.meta = (max_q, max_k, batch, scale, mask, varlen, drop)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, cu_q, cu_k, alibi = ctx.saved_tensors
        max_q, max_k, batch, scale, mask, varlen, drop = ctx.meta
        dq, dk, dv = interface.run_backward(
            dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi,
            varlen, drop=drop,
        )  # fmt: skip
        return dq, dk, dv, *(None,) * 10


def _lean(save_lse: bool):
    class Lean(torch.autograd.Function):
        """4 inputs, one output, q/k/v/out saved (and LSE, or LSE on ctx)."""

        @staticmethod
        def forward(ctx, q, k, v, call):
            cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop = call
            out, lse = interface.run_forward(
                q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop=drop
            )
            ctx.set_materialize_grads(False)
            if save_lse:
                ctx.save_for_backward(q, k, v, out, lse)
            else:
                ctx.save_for_backward(q, k, v, out)
                ctx.lse = lse
            ctx.call = call
            return out

        @staticmethod
        def backward(ctx, dout):
            if save_lse:
                q, k, v, out, lse = ctx.saved_tensors
            else:
                q, k, v, out = ctx.saved_tensors
                lse = ctx.lse
            cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop = ctx.call
            dq, dk, dv = interface.run_backward(
                dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi,
                varlen, drop=drop,
            )  # fmt: skip
            return dq, dk, dv, None

    return Lean


LeanSaved = _lean(True)
LeanCtx = _lean(False)


class Trivial(torch.autograd.Function):
    """The autograd floor: 3 inputs, one output, 3 saved, allocations only."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# --- the current Function, timestamped --------------------------------------------------------

STAMPS: list = []
# The Function a flash_attn_func training step goes through: FlashAttnOutFunction where this checkout
# has it, else FlashAttnFunction.
STEP_FN = (
    "FlashAttnOutFunction" if hasattr(interface, "FlashAttnOutFunction") else "FlashAttnFunction"
)


def _timed(cls):
    class Timed(cls):
        @classmethod
        def apply(cls_, *args):
            STAMPS.append(("apply", perf()))
            r = super().apply(*args)
            STAMPS.append(("applied", perf()))
            return r

        @staticmethod
        def forward(ctx, *args):
            STAMPS.append(("fwd_in", perf()))
            r = cls.forward(ctx, *args)
            STAMPS.append(("fwd_out", perf()))
            return r

        @staticmethod
        def backward(ctx, *grads):
            STAMPS.append(("bwd_in", perf()))
            r = cls.backward(ctx, *grads)
            STAMPS.append(("bwd_out", perf()))
            return r

    return Timed


def breakdown(q, k, v, do, steps: int, sync, causal: bool) -> dict:
    """Median µs of each piece of the current step, from timestamps."""
    orig = getattr(interface, STEP_FN)
    setattr(interface, STEP_FN, _timed(orig))
    spans: dict = {}
    try:
        for i in range(steps + 30):
            STAMPS.clear()
            t0 = perf()
            out = interface.flash_attn_func(q, k, v, causal=causal)
            t1 = perf()
            STAMPS.append(("bwd_call", perf()))
            out.backward(do)
            t2 = perf()
            q.grad = k.grad = v.grad = None
            t3 = perf()
            if i < 30:
                continue
            s = dict(STAMPS)
            for name, a, b in (
                ("entry's Python before .apply", t0, s["apply"]),
                ("apply until forward", s["apply"], s["fwd_in"]),
                ("forward body (run_forward, saving)", s["fwd_in"], s["fwd_out"]),
                ("apply after forward", s["fwd_out"], s["applied"]),
                ("entry after .apply", s["applied"], t1),
                ("backward() until our backward (hand-over)", s["bwd_call"], s["bwd_in"]),
                ("our backward body (saved tensors, run_backward)", s["bwd_in"], s["bwd_out"]),
                ("our backward's end until backward() returns", s["bwd_out"], t2),
                ("grads to None", t2, t3),
                ("whole step", t0, t3),
            ):
                spans.setdefault(name, []).append((b - a) * 1e6)
        sync()
    finally:
        setattr(interface, STEP_FN, orig)
    return {k: statistics.median(v) for k, v in spans.items()}


def single_threaded_rows(p: str, sdpa_step, ours_step, steps, sync) -> dict:
    """Both steps with autograd's device threads off (the backward on the calling thread)."""
    torch.autograd.set_multithreading_enabled(False)
    try:
        return interleaved(
            {
                p + "SDPA-flash step, multithreading off": sdpa_step,
                p + "ours: step, multithreading off": ours_step,
            },
            steps,
            sync,
        )
    finally:
        torch.autograd.set_multithreading_enabled(True)


def piece_rows(p: str, tensors: tuple, call: tuple, causal, dev, steps, sync) -> dict:
    """The step's pieces without autograd, each timed alone: run_forward, run_backward, the
    launch plans' keys (on a GPU) and mask_from_flash_args."""
    (q, k, v, do), (sq, sk, b, scale, mask) = tensors, call
    rows: dict = {}
    with torch.no_grad():
        out, lse = interface.run_forward(q, k, v, None, None, sq, sk, b, scale, mask, None, False)
        rows[p + "run_forward alone"] = per_step(
            lambda: interface.run_forward(q, k, v, None, None, sq, sk, b, scale, mask, None, False),
            steps,
            sync,
        )
        bargs = (do, q, k, v, out, lse, None, None, sq, sk, b, scale, mask, None, False)
        rows[p + "run_backward alone"] = per_step(
            lambda: interface.run_backward(*bargs), steps, sync
        )
    if dev == "cuda":
        rows[p + "launch.call_key of the forward (5 tensors)"] = per_step(
            lambda: launch.call_key(
                "fwd", (q, k, v, None, None), (sq, sk, b, scale, mask, False, None)
            ),
            steps,
            sync,
        )
        rows[p + "launch.call_key of the backward (8 tensors)"] = per_step(
            lambda: launch.call_key(
                "bwd", (do, q, k, v, out, lse, None, None), (sq, sk, b, scale, mask, False)
            ),
            steps,
            sync,
        )
    rows[p + "mask_from_flash_args"] = per_step(
        lambda: interface.mask_from_flash_args(causal, (-1, -1), 0.0), steps, sync
    )
    return rows


def shape_rows(name, b, sq, sk, hq, hk, d, dtype, causal, steps, dev, sync) -> dict:
    rows: dict = {}
    mk = lambda s, h: torch.randn(b, s, h, d, device=dev, dtype=dtype)  # noqa: E731
    q, k, v = (t.requires_grad_() for t in (mk(sq, hq), mk(sk, hk), mk(sk, hk)))
    do = torch.randn_like(q)
    qt, kt, vt = (t.detach().transpose(1, 2).clone().requires_grad_() for t in (q, k, v))
    dot = do.transpose(1, 2)
    gqa = {"enable_gqa": True} if hk != hq else {}

    def sdpa_step():
        if dev == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, **gqa)
        else:
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, **gqa)
        o.backward(dot)
        qt.grad = kt.grad = vt.grad = None

    def ours_step():
        interface.flash_attn_func(q, k, v, causal=causal).backward(do)
        q.grad = k.grad = v.grad = None

    def ours_grad():
        torch.autograd.grad(interface.flash_attn_func(q, k, v, causal=causal), (q, k, v), do)

    scale = d**-0.5
    mask = interface.mask_from_flash_args(causal, (-1, -1), 0.0)
    call = (None, None, sq, sk, b, scale, mask, None, False, None)

    def variant(fn, *args):
        def go():
            out = fn.apply(*args)
            out = out[0] if isinstance(out, tuple) else out
            out.backward(do)
            q.grad = k.grad = v.grad = None

        return go

    fl = interface.FlashAttnFunction
    p = f"{name}: "
    print(f"{name}: the step goes through {STEP_FN}", flush=True)
    allargs = (q, k, v, None, None, sq, sk, b, scale, mask, None, False, None)
    # Interleaved rounds (each row's best), so that the machine's drift hits every row alike.
    rows.update(
        interleaved(
            {
                p + "SDPA-flash step": sdpa_step,
                p + "ours: flash_attn_func step": ours_step,
                p + "ours: forward + autograd.grad (no accumulation)": ours_grad,
                p + "FlashAttnFunction.apply (13 inputs, 2 outputs, 8 saved)": variant(
                    fl, *allargs
                ),
                p + "Packed (4 inputs, 2 outputs, 8 saved)": variant(Packed, q, k, v, call),
                p + "OneOut (13 inputs, 1 output, 8 saved)": variant(OneOut, *allargs),
                p + "LeanSaved (4 inputs, 1 output, 5 saved)": variant(LeanSaved, q, k, v, call),
                p + "LeanCtx (4 inputs, 1 output, 4 saved, LSE on ctx)": variant(
                    LeanCtx, q, k, v, call
                ),
            },
            steps,
            sync,
        )
    )
    rows.update(single_threaded_rows(p, sdpa_step, ours_step, steps, sync))
    rows[p + "Trivial Function (3 in, 1 out, 3 saved, no kernels)"] = per_step(
        variant(Trivial, q, k, v), steps, sync
    )
    rows.update(piece_rows(p, (q, k, v, do), (sq, sk, b, scale, mask), causal, dev, steps, sync))
    for what, us in breakdown(q, k, v, do, steps, sync, causal).items():
        rows[p + "in the step: " + what] = us
    return rows


SHAPES = (
    # name, b, sq, sk, hq, hk, d, dtype, causal
    ("tiny d80", 1, 64, 64, 2, 2, 80, torch.float16, False),
    ("sd15-l2-self (2,1024,8,80)", 2, 1024, 1024, 8, 8, 80, torch.float16, False),
    ("sd15-l2-cross (2,1024/77,8,80)", 2, 1024, 77, 8, 8, 80, torch.float16, False),
    ("sd15-l3-self (2,256,8,160)", 2, 256, 256, 8, 8, 160, torch.float16, False),
    ("sdxl-l3-self (2,1024,20,64)", 2, 1024, 1024, 20, 20, 64, torch.float16, False),
    ("llm-gqa-b1 (1,1024,32/8,128) causal", 1, 1024, 1024, 32, 8, 128, torch.bfloat16, True),
)


def backward_key_rows(name, b, sq, sk, hq, hk, d, dtype, causal, steps, dev, sync) -> dict:
    """The backward's plan key under a planned forward (``launch.backward_key``) against the
    eight-tensor key (``launch.call_key``) alone, and the step with and without the hand-over
    from the forward's plan (``run_backward``'s ``fplan`` dropped), interleaved in one process."""
    q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=dtype, requires_grad=True)
               for s, h in ((sq, hq), (sk, hk), (sk, hk)))  # fmt: skip
    do = torch.randn(b, sq, hq, d, device=dev, dtype=dtype)
    mask = interface.mask_from_flash_args(causal, (-1, -1), 0.0)
    scale = d**-0.5
    out, lse = interface.run_forward(q, k, v, None, None, sq, sk, b, scale, mask, None, False)
    ptrs = launch.pointers(q, k, v, None, None)
    full = interface.run_backward

    def dropped(*args, fplan=None, **kw):
        return full(*args, **kw)

    def kept(*args, **kw):  # the same extra call, so that only the hand-over differs
        return full(*args, **kw)

    def step_with(backward):
        def step():
            interface.run_backward = backward
            o = interface.flash_attn_func(q, k, v, causal=causal)
            o.backward(do)
            q.grad = k.grad = v.grad = None

        return step

    try:
        best = interleaved(
            {
                "eight-tensor key": lambda: launch.call_key(
                    "bwd", (do, q, k, v, out, lse, None, None), (sq, sk, b, scale, mask, False)
                ),
                "backward_key, with the pointer check": lambda: (
                    launch.pointers(q, k, v, None, None) == ptrs
                    and launch.backward_key(do, q, k, v, out, lse)
                ),
            },
            steps * 5,
            sync,
            rounds=7,
        )
        best.update(
            interleaved(
                {
                    "step, eight-tensor key": step_with(dropped),
                    "step, keyed in the forward's plan": step_with(kept),
                },
                steps,
                sync,
                rounds=7,
            )
        )
    finally:
        interface.run_backward = full
    return {f"{name}: {what}": us for what, us in best.items()}


def native_rows(name, b, sq, sk, hq, hk, d, dtype, causal, steps, dev, sync) -> dict:
    """The step through the native launch path (attnforge_kernels/launch/replay.py: the C++ node and
    launches) against the same step through the Python path and SDPA-flash's, interleaved in one
    process; then the forward alone under no_grad, both ways."""
    from attnforge_kernels.launch import replay as native

    q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=dtype, requires_grad=True)
               for s, h in ((sq, hq), (sk, hk), (sk, hk)))  # fmt: skip
    do = torch.randn(b, sq, hq, d, device=dev, dtype=dtype)
    qt, kt, vt = (t.detach().transpose(1, 2).clone().requires_grad_() for t in (q, k, v))
    dot = do.transpose(1, 2)
    gqa = {"enable_gqa": True} if hk != hq else {}

    def sdpa_step():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, **gqa)
        o.backward(dot)
        qt.grad = kt.grad = vt.grad = None

    def ours(on: bool, grad: bool):
        def step():
            native.set_active(on)
            if grad:
                interface.flash_attn_func(q, k, v, causal=causal).backward(do)
                q.grad = k.grad = v.grad = None
            else:
                with torch.no_grad():
                    interface.flash_attn_func(q, k, v, causal=causal)

        return step

    try:
        best = interleaved(
            {
                "SDPA-flash step": sdpa_step,
                "ours: step, native": ours(True, True),
                "ours: step, Python path": ours(False, True),
            },
            steps,
            sync,
            rounds=7,
        )
        best.update(
            interleaved(
                {
                    "ours: forward (no_grad), native": ours(True, False),
                    "ours: forward (no_grad), Python path": ours(False, False),
                },
                steps * 2,
                sync,
                rounds=7,
            )
        )
    finally:
        native.set_active(True)
    return {f"{name}: {what}": us for what, us in best.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--json", default="")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--stub", action="store_true", help="kernels replaced by allocations")
    ap.add_argument("--only", default="", help="shapes whose name contains this")
    ap.add_argument(
        "--backward-key",
        action="store_true",
        help="only the backward's key under a planned forward against the eight-tensor key",
    )
    ap.add_argument(
        "--native",
        action="store_true",
        help="the step through the native launch path against the Python path and SDPA-flash",
    )
    a = ap.parse_args()
    dev = a.device
    if a.native:
        from attnforge_kernels.launch import replay as native

        print(f"native launch path: {native.status()}", flush=True)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    if a.stub:

        def fwd(q, k, v, cu_q, cu_k, max_q, max_k, batch, *rest, **kw):
            lse = torch.empty((batch, q.shape[2], max_q), dtype=torch.float32, device=q.device)
            return torch.empty_like(q), lse

        def bwd(do, q, k, v, *rest, **kw):
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        interface.run_forward, interface.run_backward = fwd, bwd
    rows: dict = {}
    for sh in SHAPES:
        if a.only in sh[0]:
            fn = native_rows if a.native else backward_key_rows if a.backward_key else shape_rows
            rows.update(fn(*sh, a.steps, dev, sync))
    if dev == "cuda":
        import triton

        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
              f"{triton.__version__}, Python {sys.version.split()[0]}")  # fmt: skip
    print("| what | host µs per step |\n|---|---|")
    for name, us in rows.items():
        print(f"| {name} | {us:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
