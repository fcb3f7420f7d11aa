"""flash_attn-compatible entry points (``flash_attn_func``, ``flash_attn_varlen_func``) with autograd,
the forward-only FP8 entry points (``flash_attn_fp8_func`` and its varlen and qkv-packed forms)
and flash_attn's ``_get_block_size_n`` (the S_dmask encoding)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
from triton.runtime import _allocation

from ..device import configs, flash
from ..device.flash import (
    FP8_DOT,
    LOG2E,
    attn_bwd_delta,
    attn_bwd_dkdv,
    attn_bwd_dq,
    attn_fwd,
    attn_fwd_merge,
    head_chunk,
)
from ..device.interpreter import patch_interpreter
from ..launch import autotune
from ..launch import plans as launch
from ..launch import replay as native
from . import arguments
from .arguments import AttnResult, Descale
from .errors import ArgumentError, ArgumentTypeError
from .kvcache import paged_varlen_forward

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_fp8_func",
    "flash_attn_varlen_fp8_func",
    "flash_attn_qkvpacked_fp8_func",
    "flash_attn_varlen_qkvpacked_fp8_func",
    "attention",
]

patch_interpreter()


@dataclass(frozen=True)
class Mask:
    """Visibility parameters: ``rel = j - i - (sk - sq)``; visible when -left <= rel <= right."""

    left: int | None = None
    right: int | None = None
    softcap: float = 0.0


@dataclass(frozen=True)
class Dropout:
    """The dropout of one call: probability, the int64 ``[seed, offset, threshold]`` tensor the
    kernels read (kept for the backward, like flash_attn's ``rng_state``) and, when
    ``return_attn_probs`` asks for it, the S_dmask tensor the forward fills."""

    p: float
    rng: torch.Tensor
    sdmask: torch.Tensor | None = None

    @property
    def scale(self) -> float:
        return 1.0 / (1.0 - self.p)


def philox_seed_offset(device: torch.device, increment: int) -> tuple[int, int]:
    """(seed, offset) for one dropout call from torch's default generator of ``device``.

    On a GPU this is flash_attn's rule (csrc/flash_attn/flash_api.cpp: the generator's Philox seed
    and offset, the offset then advanced by ``increment`` = batch * heads * 32), so
    ``torch.manual_seed`` reproduces a run and later draws see the generator where flash_attn
    would leave it. The CPU generator of Triton's interpreter has no Philox offset: both numbers
    are drawn from it, which ``torch.manual_seed`` reproduces too.
    """
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "dropout cannot be captured in a CUDA graph by attnforge's kernels (the Philox "
                "offset is read on the host); capture with dropout_p=0 or run eagerly"
            )
        index = device.index if device.index is not None else torch.cuda.current_device()
        gen = torch.cuda.default_generators[index]
        seed, offset = gen.initial_seed(), gen.get_offset()
        gen.set_offset(offset + increment)
        return seed, offset
    seed, offset = torch.randint(0, 2**62, (2,)).tolist()
    return seed, offset


def keep_threshold(p: float) -> int:
    """A score is kept when its 32-bit Philox word is >= this: P(keep) = 1 - threshold / 2**32."""
    return min(int(p * 2**32), 2**32 - 1)


def dropout_state(q, p: float, batch: int, hq: int, max_q: int, max_k: int, sdmask: bool):
    """The :class:`Dropout` of a call (None when ``p`` is 0), advancing torch's generator."""
    if not p:
        return None
    p = float(p)
    if not 0.0 < p < 1.0:
        raise ArgumentError(f"dropout_p must be in [0, 1), got {p}")
    seed, offset = philox_seed_offset(q.device, batch * hq * 32)
    seed = seed - 2**64 if seed >= 2**63 else seed  # the uint64 seed's bits in an int64
    rng = torch.tensor([seed, offset, keep_threshold(p)], dtype=torch.int64, device=q.device)
    probs = None
    if sdmask:
        probs = torch.zeros((batch, hq, max_q, max_k), dtype=torch.float32, device=q.device)
    return Dropout(p, rng, probs)


def _get_block_size_n(
    device: torch.device | str | None, head_dim: int, is_dropout: bool, is_causal: bool
) -> int:
    """The width of the key blocks in which S_dmask's rows are encoded (flash_attn's
    ``flash_attn.flash_attn_interface._get_block_size_n``, same arguments, same values).

    flash_attn 2.x returns S_dmask unnormalised: entry (i, j) in key block
    ``j // block_n`` is ``exp(s_ij - m)`` with ``m`` the row's largest score in that block and
    every later one (its CUDA kernels walk the key blocks last to first), negated where dropout
    dropped it; its tests recover the probabilities with ``normalize_flash_attn_S``, which
    splits the keys by this width. Ours encode the same way with the same widths, flash_attn's
    table for its CUDA kernels (Dao-AILab/flash-attention ``flash_attn/flash_attn_interface.py``,
    commit 0251105a, read 2026-11-25; sm86/sm89 differ at head dims 97-128), so either copy of
    the function decodes ours.
    """
    if head_dim > 256:
        raise ArgumentError(f"head_dim must be <= 256, got {head_dim}")
    dev = torch.device(device)
    sm8x = False
    if dev.type == "cuda" and not configs.is_hip():
        major, minor = torch.cuda.get_device_capability(dev)
        sm8x = major == 8 and minor > 0
    if head_dim <= 32:
        return 128
    if head_dim <= 64:
        return 64 if is_dropout else 128
    if head_dim <= 96:
        return 64
    if head_dim <= 128:
        if sm8x:
            return 64 if (not is_dropout and is_causal) else 32
        return 32 if is_dropout else 64
    return 64


def _unnormalise_sdmask(s: torch.Tensor, block_n: int) -> None:
    """Turn the kernel's S_dmask (softmax probabilities, negated where dropped) into flash_attn's
    encoding (:func:`_get_block_size_n`), in place: each key block divided by the largest
    probability of that block and every later one, ``exp(s - lse) / exp(m - lse) = exp(s - m)``.
    Blocks with nothing visible from there on stay 0."""
    sk = s.shape[-1]
    blocks = -(-sk // block_n)
    a = torch.nn.functional.pad(s.abs(), (0, blocks * block_n - sk))
    top = a.unflatten(-1, (blocks, block_n)).amax(-1)
    later = top.flip(-1).cummax(-1).values.flip(-1)
    inv = torch.where(later > 0, later.reciprocal(), torch.zeros_like(later))
    s.mul_(inv.repeat_interleave(block_n, dim=-1)[..., :sk])


class _Seq:
    """A q/k/v-like tensor seen as (batch, seq, head) strides + unit head-dim stride."""

    __slots__ = ("t", "strides")

    def __init__(self, t: torch.Tensor, varlen: bool):
        st = t.stride()  # once: each call is a trip into torch (host time at small shapes)
        if st[-1] != 1:
            t = t.contiguous()
            st = t.stride()
        self.t = t
        self.strides = (0, st[0], st[1]) if varlen else (st[0], st[1], st[2])


def _buffer_loads(*tensors) -> bool:
    """Whether Triton's HIP JIT gives these tensors 32-bit buffer-load offsets (<= 2 GiB each)."""
    amd = getattr(getattr(triton, "knobs", None), "amd", None)
    if amd is not None and not getattr(amd, "use_buffer_ops", True):
        return False
    return all(
        t.untyped_storage().nbytes() <= configs.MAX_BUFFER_BYTES for t in tensors if t is not None
    )


def tma_ok(*tensors) -> bool:
    """Whether TMA tensor descriptors can address these tensors (the kernels' ``USE_TMA``):
    bf16/fp16, a 16-byte aligned start and 16-byte multiples for every stride but the unit last
    one, so that each (batch, head, first row) base of a tile is aligned as TMA requires."""
    return all(_tma_layout(t.dtype, t.shape, t.stride()) and not t.data_ptr() % 16 for t in tensors)


@functools.lru_cache(maxsize=1024)
def _tma_layout(dtype: torch.dtype, shape: tuple, strides: tuple) -> bool:
    """tma_ok's checks of dtype, shape and strides (cached: asked for several tensors a call)."""
    if dtype not in (torch.float16, torch.bfloat16) or strides[-1] != 1:
        return False
    return not any(n > 1 and (s * 2) % 16 for n, s in zip(shape[:-1], strides[:-1], strict=True))


def _tma_config(c: configs.AttnConfig, kernels: tuple, *tensors) -> configs.AttnConfig:
    """``c`` with TMA off where the tensors do not allow it, and Triton's scratch allocator set
    for the in-kernel descriptors (128 bytes each) where one of the tiles ``kernels`` (names of
    AttnConfig fields) about to launch uses them; nothing is checked when none does."""
    if not any(getattr(c, k).tma for k in kernels):
        return c
    if not tma_ok(*tensors):
        return c.without_tma()
    _tma_allocator()
    return c


def _tma_allocator() -> None:
    """Set Triton's scratch allocator for in-kernel descriptors unless one is set already (in
    this thread: autograd runs the backward in its own)."""
    if not configs.INTERPRET and isinstance(
        _allocation._allocator.get(), _allocation.NullAllocator
    ):
        triton.set_allocator(_tma_scratch)


def _gluon_scope(q, mask: Mask, softcap: float, slopes, varlen: bool, drop, *tensors) -> bool:
    """What both warp-specialised Gluon kernels (attnforge_kernels/device/flash_sm90.py) need of a call, head dims
    aside: fixed-length batches, no mask or causal aligned bottom-right (``right == 0``, no
    ``left``), no softcap, ALiBi or dropout, tensors of q's dtype that TMA can address, and not
    the CPU interpreter (Gluon has none)."""
    return (
        not configs.INTERPRET
        and not varlen
        and mask.left is None
        and mask.right in (None, 0)
        and softcap == 0
        and slopes is None
        and drop is None
        and all(t.dtype == q.dtype for t in tensors)
        and tma_ok(q, *tensors)
    )


def _shorter_sequence(q, k) -> int:
    """The fewer of a call's query and key rows per sequence ((b, s, h, d) tensors; varlen calls
    are outside the Gluon kernels' scope)."""
    return min(q.shape[-3], k.shape[-3])


def gluon_forward_ok(
    cfg: configs.AttnConfig, q, k, v, out, mask: Mask, softcap: float, slopes, varlen: bool,
    drop, fp8: bool,
) -> bool:  # fmt: skip
    """Whether a forward call runs the Gluon forward: the config asks for it at this head dim and
    sequence length (Hopper; exactly 128, long enough: ``AttnConfig.gluon_fwd_at``, a causal call
    by its own threshold), it is not FP8, its output has q's dtype, and it is in
    ``_gluon_scope``."""
    return (
        cfg.gluon_fwd_at(q.shape[-1], _shorter_sequence(q, k), causal=mask.right == 0)
        and not fp8
        and _gluon_scope(q, mask, softcap, slopes, varlen, drop, k, v, out)
    )


def gluon_backward_ok(
    cfg: configs.AttnConfig, q, k, v, do, dk, dv, mask: Mask, softcap: float, slopes,
    varlen: bool, drop,
) -> bool:  # fmt: skip
    """Whether a backward call's dK and dV come from the Gluon dK/dV kernel: the config asks for
    it at this head dim (Hopper; exactly 64 or 128, with dQ reduced in its own kernel,
    ``AttnConfig.gluon_bwd_at``), and the call is in ``_gluon_scope``, the gradients included."""
    return cfg.gluon_bwd_at(q.shape[-1], _shorter_sequence(q, k)) and _gluon_scope(
        q, mask, softcap, slopes, varlen, drop, k, v, do, dk, dv
    )


def _tma_scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


# The launch paths' name for the shared check.
_slopes = arguments.alibi_slopes

FP8_TYPES = arguments.FP8_TYPES


def _common(q, k, v, mask: Mask, scale: float, fp8: bool = False):
    d, hq, hk = arguments.check_qkv(q, k, v, fp8=fp8)
    family = configs.device_family(q.device)
    cfg = configs.config_for(family, d)
    hip = configs.is_hip()
    softcap = float(mask.softcap or 0.0)
    if softcap > 0:
        cap_in, cap_out = scale / softcap, softcap * LOG2E
    else:
        cap_in, cap_out = 0.0, 0.0
    return d, hq, hk, cfg, hip, softcap, cap_in, cap_out


@dataclass
class _Forward:
    """What one forward call's launch takes (:func:`run_forward` fills it once; each config
    autotuning tries launches from it)."""

    qs: object
    ks: object
    vs: object
    out: object
    lse: object
    cu_q: object
    cu_k: object
    varlen: object
    dummy: object
    slopes: object
    strides: object
    lse_strides: object
    sa_b: object
    sa_h: object
    max_q: object
    max_k: object
    batch: object
    hq: object
    hk: object
    scale: object
    cap_in: object
    cap_out: object
    mask: object
    drop: object
    desc_q: object
    desc_k: object
    desc_v: object
    d: object
    bd: object
    softcap: object
    fp8: object
    align: object
    hip: object
    launched: object


# A launch grid's second dimension: at most 65535 programs (CUDA; HIP's is larger).
MAX_GRID_Y = 65535


def _ordered_grid(c: configs.AttnConfig, mask: Mask, blocks: int, heads: int, t):
    """(grid, ACROSS_HEADS) of a launch of ``blocks`` x ``heads`` (batch x heads) programs:
    (heads, blocks) where its programs launch longest first across heads (flash.py
    ``_grid_order``: causal, a right window without a left one, in the config's window), else
    (blocks, heads)."""
    causal = mask.left is None and mask.right is not None
    units = configs.compute_units(t.device)
    if blocks <= MAX_GRID_Y and c.across_heads_at(causal, blocks * heads, units):
        return (heads, blocks), True
    return (blocks, heads), False


def _launch_forward(f: _Forward, c: configs.AttnConfig) -> None:
    """The forward kernel with config ``c``."""
    (
        qs, ks, vs, out, lse, cu_q, cu_k, varlen, dummy, slopes, strides, lse_strides, sa_b, sa_h,
        max_q, max_k, batch, hq, hk, scale, cap_in, cap_out, mask, drop, desc_q, desc_k, desc_v, d,
        bd, softcap, fp8, align, hip, launched
    ) = (
        f.qs, f.ks, f.vs, f.out, f.lse, f.cu_q, f.cu_k, f.varlen, f.dummy, f.slopes, f.strides,
        f.lse_strides, f.sa_b, f.sa_h, f.max_q, f.max_k, f.batch, f.hq, f.hk, f.scale, f.cap_in,
        f.cap_out, f.mask, f.drop, f.desc_q, f.desc_k, f.desc_v, f.d, f.bd, f.softcap, f.fp8,
        f.align, f.hip, f.launched
    )  # fmt: skip
    if c.chunk_fwd:  # RDNA above d=128: chunked only where buffer loads apply
        c = configs.for_tensors(c, _buffer_loads(qs.t, ks.t, vs.t, out))
    c = _tma_config(c, ("fwd",), qs.t, ks.t, vs.t)
    t = c.fwd
    grid, across = _ordered_grid(c, mask, _cdiv(max_q, t.block_m), batch * hq, qs.t)
    short_kv = c.short_kv and max_k <= t.block_n  # the kernel's single-block path
    split = _tail_split(f, t, grid, c, short_kv)
    tail_args = {}
    if split is not None:  # (blocks, heads - split + split x parts): flash.py _tail_order
        parts, heads = split
        tail = grid[1] - heads
        rows = heads * parts * grid[0] * t.block_m
        part = torch.empty((rows, bd), dtype=torch.float32, device=out.device)
        part_l = torch.empty(rows, dtype=torch.float32, device=out.device)
        grid = (grid[0], tail + heads * parts)
        tail_args = dict(tail=tail, Part=part, PartL=part_l, SPLIT=parts)
    launch.recording(attn_fwd, launched)[grid](
        qs.t, ks.t, vs.t, out, lse, cu_q if varlen else dummy, cu_k if varlen else dummy,
        slopes if slopes is not None else lse, *strides, *lse_strides, sa_b, sa_h, max_q, max_k, hq,
        hq // hk, scale * LOG2E, cap_in, cap_out, mask.left or 0, mask.right or 0,
        drop.rng if drop else None, drop.scale if drop else None, drop.sdmask if drop else None,
        desc_q, desc_k, desc_v, HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
        IS_VARLEN=varlen, HAS_LEFT=mask.left is not None, HAS_RIGHT=mask.right is not None,
        HAS_SOFTCAP=softcap > 0, HAS_ALIBI=slopes is not None, REVERSE=mask.right is not None,
        HAS_DROPOUT=drop is not None, RETURN_SDMASK=drop is not None and drop.sdmask is not None,
        IS_FP8=fp8, USE_TMA=t.tma, SHORT_KV=short_kv, STRIDE_ALIGN=align,
        POS_SCALE=scale > 0, ACROSS_HEADS=across, D_CHUNK=head_chunk(c.chunk_fwd, bd, fp8, hip),
        **tail_args, **t.launch_options(hip),
    )  # fmt: skip
    if split is not None:  # strides[9:12]: out's (q, k, v, out, each (b, s, h))
        launch.recording(attn_fwd_merge, launched)[(grid[0], heads)](
            out, lse, part, part_l, *strides[9:12], *lse_strides, max_q, hq, tail, HEAD_DIM=d,
            BLOCK_D=bd, BLOCK_M=t.block_m, SPLIT=parts, STRIDE_ALIGN=align,
            **configs.merge_tile(t).launch_options(hip),
        )  # fmt: skip


def _tail_split(f: _Forward, t: configs.Tile, grid: tuple, c, short_kv: bool) -> tuple | None:
    """(SPLIT, split heads) where the forward launch splits its last tiles along the keys
    (``configs.tail_split``), else None: a tile that says ``per_sm``, calls of one key range a
    row (no causal mask or window, so never a grid ordered across heads; no varlen, dropout,
    FP8, head-dim chunks or the single-block path ``short_kv``), on a grid whose second
    dimension has room for the parts."""
    if (
        not t.per_sm or f.varlen or f.drop is not None or f.fp8 or c.chunk_fwd
        or f.mask.left is not None or f.mask.right is not None
        or short_kv
    ):  # fmt: skip
        return None
    units = configs.compute_units(f.out.device)
    split = configs.tail_split(t, grid[0], grid[1], _cdiv(f.max_k, t.block_n), units)
    if split is not None and grid[1] + split[1] * (split[0] - 1) > MAX_GRID_Y:
        return None
    return split


def run_forward(
    q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask: Mask, alibi, varlen,
    drop: Dropout | None = None, descale=None, out_dtype=None, planned: list | None = None,
):  # fmt: skip
    """(out, lse). ``drop``: dropout (fills ``drop.sdmask`` when it has one); ``descale``: FP8
    (q/k/v e4m3 with fp32 (batch, Hk) descale tensors (dq, dk, dv)), output in ``out_dtype``.

    A call whose key (``attnforge_kernels.launch.plans``) an earlier call recorded replays that
    call's launch; others take the full path below and, where it can be replayed, record it.
    ``planned``: a list that gets the call's :class:`PyForwardPlan` where it replayed or recorded
    one (the autograd Functions hand it to :func:`run_backward`)."""
    key = None
    if launch.ENABLED and alibi is None and drop is None and descale is None:
        values = (max_q, max_k, batch, scale, mask, varlen)
        key, plan = launch.find(
            launch.FORWARD, launch.call_key("fwd", (q, k, v, cu_q, cu_k), (*values, out_dtype))
        )
        if plan is not None:
            res = plan(q, k, v, cu_q, cu_k)
            if res is not None:
                native.put_forward(plan, q, k, v, cu_q, cu_k, values, *res)
                if planned is not None:
                    planned.append(plan)
                return res
    qs, ks, vs = _Seq(q, varlen), _Seq(k, varlen), _Seq(v, varlen)
    fp8 = descale is not None
    d, hq, hk, cfg, hip, softcap, cap_in, cap_out = _common(qs.t, ks.t, vs.t, mask, scale, fp8)
    family = configs.device_family(q.device)
    if drop is not None:  # the dropout forward's tile, where a Triton line gives it one
        cfg = configs.config_for(family, d, dropout=True)
    # Short keys, a head dim's own tile, or a grid too small to fill the GPU.
    cfg = configs.forward_config(
        cfg, family, d, max_q, max_k, batch * hq, q.device, causal=mask.right == 0
    )
    out = torch.empty(qs.t.shape, dtype=out_dtype or q.dtype, device=q.device)
    os_ = _Seq(out, varlen).strides
    lse_shape = (hq, q.shape[0]) if varlen else (batch, hq, max_q)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    lse_strides = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    slopes, sa_b, sa_h = _slopes(alibi, batch, hq, q.device)
    bd = configs.padded_head_dim(d)
    if fp8:
        bd = max(bd, 32)  # fp8 dots take K >= 32 on some targets (wgmma k32)
    dummy = cu_q if cu_q is not None else out
    desc_q, desc_k, desc_v = descale if fp8 else (None, None, None)
    launched = [] if key is not None else None
    if gluon_forward_ok(cfg, qs.t, ks.t, vs.t, out, mask, softcap, slopes, varlen, drop, fp8):
        from ..device import flash_sm90  # Hopper only: Gluon's NVIDIA modules, not elsewhere

        _tma_allocator()
        blocks = _cdiv(max_q, flash_sm90.BLOCK_M)
        across = _ordered_grid(cfg, mask, blocks, batch * hq, q)[1]
        flash_sm90.launch(qs.t, ks.t, vs.t, out, lse, scale * LOG2E, causal=mask.right == 0,
                          across=across, wrap=functools.partial(launch.recording, into=launched))  # fmt: skip
    else:
        strides = (*qs.strides, *ks.strides, *vs.strides, *os_)
        align = flash.stride_align(*strides)
        strides = _divided(strides, align)
        f = _Forward(
            qs=qs, ks=ks, vs=vs, out=out, lse=lse, cu_q=cu_q, cu_k=cu_k, varlen=varlen,
            dummy=dummy, slopes=slopes, strides=strides, lse_strides=lse_strides, sa_b=sa_b,
            sa_h=sa_h, max_q=max_q, max_k=max_k, batch=batch, hq=hq, hk=hk, scale=scale,
            cap_in=cap_in, cap_out=cap_out, mask=mask, drop=drop, desc_q=desc_q, desc_k=desc_k,
            desc_v=desc_v, d=d, bd=bd, softcap=softcap, fp8=fp8, align=align, hip=hip,
            launched=launched,
        )  # fmt: skip
        run = functools.partial(_launch_forward, f)
        tune = autotune.key("fwd", q, d, mask, softcap > 0, slopes is not None, varlen)
        run(autotune.choose(tune + "|dropout" if tune and drop else tune, cfg, run))
    if launched is not None:
        _record_forward(key, launched, (q, k, v, cu_q, cu_k), values, out, lse, planned)
    if drop is not None and drop.sdmask is not None:
        causal = mask.left is None and mask.right == 0
        _unnormalise_sdmask(drop.sdmask, _get_block_size_n(q.device, d, True, causal))
    return out, lse


def _record_forward(key, launched: list, call: tuple, values: tuple, out, lse, planned) -> None:
    """Record the forward's plan under ``key``: one launch (Triton's, or Hopper's Gluon forward;
    not autotuning's several), handed to the native path and appended to ``planned``; else False,
    so that the key is not tried again. ``call``: q, k, v, cu_q, cu_k."""
    rec = launch.record(*launched[0], (*call, out, lse)) if len(launched) == 1 else None
    plan = PyForwardPlan(rec, out, lse) if rec is not None else False
    launch.FORWARD.put(key, plan)
    if plan:
        native.put_forward(plan, *call, values, out, lse)
    if plan and planned is not None:
        planned.append(plan)


class PyForwardPlan:
    """A recorded forward launch (``attnforge_kernels.launch.plans``): allocates out and LSE as the
    full path does, then launches; None when a fresh output is not 16-byte aligned (then the full
    path). ``backward``: the plans of the backward calls of this forward's outputs, by
    ``launch.backward_key``. ``native``: this plan handed to attnforge_kernels/launch/replay.py (its
    native plan), False where it cannot be, None before."""

    __slots__ = ("launch", "out_shape", "out_dtype", "lse_shape", "device", "backward", "native")

    def __init__(self, rec: launch.Launch, out: torch.Tensor, lse: torch.Tensor):
        self.launch = rec
        self.out_shape, self.out_dtype, self.device = out.shape, out.dtype, out.device
        self.lse_shape = lse.shape
        self.backward = launch.Table(limit=16)
        self.native = None

    def __call__(self, q, k, v, cu_q, cu_k):
        out = torch.empty(self.out_shape, dtype=self.out_dtype, device=self.device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        if out.data_ptr() % 16 or lse.data_ptr() % 16:
            return None
        if self.launch.scratch:
            _tma_allocator()
        self.launch(_stream(), (q, k, v, cu_q, cu_k, out, lse))
        return out, lse


class PyBackwardPlan:
    """Recorded backward launches (dQ with delta, then dK/dV): allocates dQ, dK, dV and delta as
    the full path does, then launches; None when a fresh buffer is not 16-byte aligned."""

    __slots__ = ("launches", "scratch")

    def __init__(self, recs: tuple):
        self.launches = recs
        self.scratch = any(r.scratch for r in recs)

    def __call__(self, do, q, k, v, out, lse, cu_q, cu_k):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        delta = torch.empty_like(lse)
        if dq.data_ptr() % 16 or dk.data_ptr() % 16 or dv.data_ptr() % 16 or delta.data_ptr() % 16:
            return None
        if self.scratch:
            _tma_allocator()
        stream = _stream()
        tensors = (do, q, k, v, out, lse, cu_q, cu_k, dq, dk, dv, delta)
        for rec in self.launches:
            rec(stream, tensors)
        return dq, dk, dv


def _stream():
    """The current device's current stream, as Triton's launch path reads it."""
    return triton.runtime.driver.active.get_current_stream(torch.cuda.current_device())


def _divided(strides: tuple, align: int) -> tuple:
    """``strides`` divided by ``flash.stride_align``'s factor (the kernels' STRIDE_ALIGN)."""
    return strides if align == 1 else tuple(s // align for s in strides)


def _cdiv(a: int, b: int) -> int:
    """``triton.cdiv`` without its host-side constexpr wrapper (microseconds a call)."""
    return -(-a // b)


@dataclass
class _Backward:
    """What one backward call's launches share (:func:`run_backward` fills it once; each config
    autotuning tries launches from it)."""

    q: object
    qs: object
    ks: object
    vs: object
    dos: object
    outs: object
    dk: object
    dv: object
    lse: object
    delta: object
    grads: object
    varlen: object
    family: object
    hip: object
    batch: object
    hq: object
    hk: object
    max_q: object
    max_k: object
    d: object
    bd: object
    cuq: object
    cuk: object
    sl: object
    lse_strides: object
    sa_b: object
    sa_h: object
    common: object
    scal: object
    drop_args: object
    flags: object
    qkvdo: object
    dks: object
    dvs: object
    mask: object
    softcap: object
    slopes: object
    drop: object
    scale: object
    launched: object


def _backward_launches(b: _Backward, c: configs.AttnConfig):
    """The backward's launches with config ``c``; dQ (dK, dV are b.dk, b.dv)."""
    q, qs, ks, vs, dos, dk, dv, lse, delta, grads, varlen = (
        b.q, b.qs, b.ks, b.vs, b.dos, b.dk, b.dv, b.lse, b.delta, b.grads, b.varlen
    )  # fmt: skip
    if c.atomic_dq:
        dq_acc = torch.zeros_like(qs.t, dtype=torch.float32)
    elif grads is None:
        dq_acc = torch.empty_like(qs.t)
    else:
        dq_acc = grads[0]
    if c.chunk_kv or c.chunk_q:  # RDNA: chunked only where buffer loads apply
        tensors = (qs.t, ks.t, vs.t, dos.t, dk, dv, dq_acc, lse, delta)
        c = configs.for_tensors(c, _buffer_loads(*tensors))
    c = _tma_config(c, ("bwd_kv", "bwd_q"), qs.t, ks.t, vs.t, dos.t)
    dqs = _Seq(dq_acc, varlen).strides
    if c.atomic_dq:
        _launch_delta(b)
    else:  # dQ first: it writes the delta the dK/dV kernel reads
        _launch_dq(b, c, dq_acc, dqs)
    _launch_dkdv(b, c, dq_acc, dqs)
    if c.atomic_dq:
        return dq_acc.to(q.dtype) if grads is None else grads[0].copy_(dq_acc)
    return dq_acc


def _launch_delta(b: _Backward):
    """The atomic-dQ path's delta = rowsum(O * dO) kernel."""
    dos, outs, delta, varlen, family, batch, hq, max_q, d, bd, cuq, lse_strides = (
        b.dos, b.outs, b.delta, b.varlen, b.family, b.batch, b.hq, b.max_q, b.d, b.bd, b.cuq,
        b.lse_strides
    )  # fmt: skip
    pre_m = 64
    st = (*outs.strides, *dos.strides)
    align = flash.stride_align(*st)
    attn_bwd_delta[(_cdiv(max_q, pre_m), batch * hq)](
        outs.t, dos.t, delta, cuq, *_divided(st, align), *lse_strides, max_q, hq, HEAD_DIM=d,
        BLOCK_D=bd, BLOCK_M=pre_m, IS_VARLEN=varlen, STRIDE_ALIGN=align,
        num_warps=4 if family != "interpreter" else 1, enable_fp_fusion=configs.FP_FUSION,
    )  # fmt: skip


def _launch_dq(b: _Backward, c: configs.AttnConfig, dq_acc, dqs):
    """The dQ kernel, which also writes delta."""
    (
        qs, ks, vs, dos, outs, lse, delta, hip, batch, hq, hk, max_q, cuq, cuk, sl, lse_strides, sa_b,
        sa_h, common, scal, drop_args, flags, qkvdo, mask, launched
    ) = (
        b.qs, b.ks, b.vs, b.dos, b.outs, b.lse, b.delta, b.hip, b.batch, b.hq, b.hk, b.max_q,
        b.cuq, b.cuk, b.sl, b.lse_strides, b.sa_b, b.sa_h, b.common, b.scal, b.drop_args, b.flags,
        b.qkvdo, b.mask, b.launched
    )  # fmt: skip
    tq = c.bwd_q
    st = (*qkvdo, *dqs, *outs.strides)
    align = flash.stride_align(*st)
    grid, across = _ordered_grid(c, mask, _cdiv(max_q, tq.block_m), batch * hq, qs.t)
    launch.recording(attn_bwd_dq, launched)[grid](
        qs.t, ks.t, vs.t, dos.t, dq_acc, lse, delta, outs.t, cuq, cuk, sl, *_divided(st, align),
        *lse_strides, sa_b, sa_h, *common, hq, hq // hk, *scal, *drop_args, BLOCK_M=tq.block_m,
        BLOCK_N=tq.block_n, REVERSE=mask.right is not None, RELOAD=c.reload,
        D_CHUNK=head_chunk(c.chunk_q, flags["BLOCK_D"]),
        USE_TMA=tq.tma, STRIDE_ALIGN=align, ACROSS_HEADS=across, **flags,
        **tq.launch_options(hip),
    )  # fmt: skip


def _launch_dkdv(b: _Backward, c: configs.AttnConfig, dq_acc, dqs):
    """The dK/dV kernel: Triton's, or on Hopper Gluon's warp-specialised one."""
    (
        qs, ks, vs, dos, dk, dv, lse, delta, varlen, hip, batch, hq, hk, max_k, cuq, cuk, sl,
        lse_strides, sa_b, sa_h, common, scal, drop_args, flags, qkvdo, dks, dvs, mask, softcap,
        slopes, drop, scale, launched
    ) = (
        b.qs, b.ks, b.vs, b.dos, b.dk, b.dv, b.lse, b.delta, b.varlen, b.hip, b.batch, b.hq, b.hk,
        b.max_k, b.cuq, b.cuk, b.sl, b.lse_strides, b.sa_b, b.sa_h, b.common, b.scal, b.drop_args,
        b.flags, b.qkvdo, b.dks, b.dvs, b.mask, b.softcap, b.slopes, b.drop, b.scale, b.launched
    )  # fmt: skip
    tk = c.bwd_kv
    if gluon_backward_ok(c, qs.t, ks.t, vs.t, dos.t, dk, dv, mask, softcap, slopes, varlen, drop):
        from ..device import flash_sm90  # Hopper only, as in run_forward

        _tma_allocator()
        blocks = _cdiv(max_k, configs.GLUON_BWD_TILES[ks.t.shape[-1]][1])
        flash_sm90.launch_bwd_dkdv(
            qs.t, ks.t, vs.t, dos.t, dk, dv, lse, delta, scale, causal=mask.right == 0,
            wrap=functools.partial(launch.recording, into=launched),
            across=_ordered_grid(c, mask, blocks, batch * hk, qs.t)[1],
        )  # fmt: skip
    else:
        st = (*qkvdo, *dks, *dvs, *dqs)
        align = flash.stride_align(*st)
        blocks = _cdiv(max_k, tk.block_n)
        causal = mask.left is None and mask.right is not None
        paired = c.paired_kv_at(causal, blocks * batch * hk, configs.compute_units(qs.t.device))
        if paired:  # its programs weigh alike: the head order stays
            grid, across = (_cdiv(blocks, 2), batch * hk), False
        else:
            grid, across = _ordered_grid(c, mask, blocks, batch * hk, qs.t)
        for part in (1, 2) if c.split_kv else (0,):  # split: dV, then dK (flash.py's PART)
            launch.recording(attn_bwd_dkdv, launched)[grid](
                qs.t, ks.t, vs.t, dos.t, dk, dv, dq_acc, lse, delta, cuq, cuk, sl,
                *_divided(st, align), *lse_strides, sa_b, sa_h, *common, hk, hq // hk, *scal,
                *drop_args, BLOCK_M=tk.block_m, BLOCK_N=tk.block_n, ATOMIC_DQ=c.atomic_dq,
                RELOAD=c.reload, D_CHUNK=head_chunk(c.chunk_kv, flags["BLOCK_D"]),
                USE_TMA=tk.tma, STRIDE_ALIGN=align,
                PART=part, MASKED_LAST=c.masked_last, PAIRED=paired, ACROSS_HEADS=across,
                **flags, **tk.launch_options(hip),
            )  # fmt: skip


def run_backward(
    do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, batch, scale, mask: Mask, alibi, varlen,
    grads=None, drop: Dropout | None = None, fplan: tuple | None = None, native_plan=None,
):  # fmt: skip
    """dQ, dK, dV; ``grads`` = (dq, dk, dv) to write into (views of one pack: attnforge_kernels/api/packed.py);
    ``drop``: the forward's dropout, whose mask the kernels regenerate; ``fplan``: what
    :func:`saved_plan` kept of the forward of ``out``: the plan it replayed or recorded, whose
    own table keys this call's plan by what the backward adds to the forward's key
    (``launch.backward_key``), while the saved inputs still hold the forward's data; its plan
    is handed to the forward plan's native plan (attnforge_kernels/launch/replay.py) when recorded.
    ``native_plan``: the native plan of a native node whose backward came back here for want
    of a native plan (attnforge_kernels/launch/replay.py's ``run_backward``); a replayed plan is handed to it too.

    Two launches (dQ, which also computes delta = rowsum(O * dO), then dK/dV) except with
    ``atomic_dq`` (delta kernel, then dK/dV accumulating dQ). The small shapes are bound by host
    time, most of it per launch (docs/benchmarks.md, issue 30), so this path does no argument
    checks (the forward did them), reads each tensor's strides once and allocates the gradients
    in their inputs' layouts (autograd then keeps them instead of copying them into the leaves'
    layout). A call whose key an earlier call recorded replays its two launches, as in
    :func:`run_forward`."""
    key = None
    export = None  # the native plan this call's backward plan is handed to
    if launch.ENABLED and alibi is None and grads is None and drop is None:
        if fplan is not None and fplan[1] == launch.pointers(q, k, v, cu_q, cu_k):
            table = fplan[0].backward
            key = launch.backward_key(do, q, k, v, out, lse)
            export = native_plan or fplan[0].native or None
        else:
            table = launch.BACKWARD
            key = launch.call_key(
                "bwd",
                (do, q, k, v, out, lse, cu_q, cu_k),
                (max_q, max_k, batch, scale, mask, varlen),
            )
        key, plan = launch.find(table, key)
        if plan is not None:
            res = plan(do, q, k, v, out, lse, cu_q, cu_k)
            if res is not None:
                if native_plan is not None and export is not None:
                    native.put_backward(export, plan.launches, do, q, k, v, out, lse)
                return res
    qs, ks, vs = _Seq(q, varlen), _Seq(k, varlen), _Seq(v, varlen)
    dos, outs = _Seq(do, varlen), _Seq(out, varlen)
    d, hq, hk = q.shape[-1], q.shape[-2], k.shape[-2]
    family = configs.device_family(q.device)
    cfg = configs.config_for(family, d, dropout=drop is not None)
    cfg = configs.backward_config(cfg, family, d, max_k, batch * hk, q.device)
    hip = configs.is_hip()
    softcap = float(mask.softcap or 0.0)
    cap_in, cap_out = (scale / softcap, softcap * LOG2E) if softcap > 0 else (0.0, 0.0)
    bd = configs.padded_head_dim(d)
    lse_strides = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    delta = torch.empty_like(lse)
    dk, dv = (torch.empty_like(ks.t), torch.empty_like(vs.t)) if grads is None else grads[1:]
    slopes, sa_b, sa_h = _slopes(alibi, batch, hq, q.device)
    dummy = cu_q if cu_q is not None else lse
    cuq, cuk = (cu_q, cu_k) if varlen else (dummy, dummy)
    sl = slopes if slopes is not None else lse
    flags = dict(HEAD_DIM=d, BLOCK_D=bd, IS_VARLEN=varlen, HAS_LEFT=mask.left is not None,
                 HAS_RIGHT=mask.right is not None, HAS_SOFTCAP=softcap > 0,
                 HAS_ALIBI=slopes is not None, HAS_DROPOUT=drop is not None)  # fmt: skip
    drop_args = (drop.rng, drop.scale) if drop else (None, None)
    dks, dvs = _Seq(dk, varlen).strides, _Seq(dv, varlen).strides
    qkvdo = (*qs.strides, *ks.strides, *vs.strides, *dos.strides)
    common = (max_q, max_k)
    scal = (scale, scale * LOG2E, cap_in, cap_out, mask.left or 0, mask.right or 0)
    launched = [] if key is not None else None
    b = _Backward(q=q, qs=qs, ks=ks, vs=vs, dos=dos, outs=outs, dk=dk, dv=dv, lse=lse, delta=delta,
        grads=grads, varlen=varlen, family=family, hip=hip, batch=batch, hq=hq, hk=hk, max_q=max_q,
        max_k=max_k, d=d, bd=bd, cuq=cuq, cuk=cuk, sl=sl, lse_strides=lse_strides, sa_b=sa_b,
        sa_h=sa_h, common=common, scal=scal, drop_args=drop_args, flags=flags, qkvdo=qkvdo,
        dks=dks, dvs=dvs, mask=mask, softcap=softcap, slopes=slopes, drop=drop, scale=scale,
        launched=launched)  # fmt: skip
    run = functools.partial(_backward_launches, b)
    tune = autotune.key("bwd", q, d, mask, softcap > 0, slopes is not None, varlen)
    dq = run(autotune.choose(tune + "|dropout" if tune and drop else tune, cfg, run))
    if launched is not None:
        call = (do, q, k, v, out, lse, cu_q, cu_k)
        _record_backward(table, key, launched, export, call, (dq, dk, dv, delta))
    return dq, dk, dv


def _record_backward(table, key, launched: list, export, call: tuple, made: tuple) -> None:
    """Record the backward's plan under ``key`` in ``table`` (and hand it to the native plan
    ``export``): dQ, then dK/dV (Triton's, Gluon's on Hopper, or ``split_kv``'s dV and dK
    launches), and nothing else (not the atomic-dQ path, whose delta kernel is not recorded);
    else False, so that the key is not tried again. ``call``: do, q, k, v, out, lse, cu_q, cu_k;
    ``made``: dq, dk, dv, delta."""
    recs = (None,)
    if len(launched) >= 2 and launched[0][0] is attn_bwd_dq:
        recs = tuple(launch.record(*x, (*call, *made)) for x in launched)
    table.put(key, PyBackwardPlan(recs) if None not in recs else False)
    if export is not None:
        native.put_backward(export, None if None in recs else recs, *call[:6])


def saved_plan(planned: list, q, k, v, cu_q, cu_k) -> tuple | None:
    """For ``ctx``: the forward's plan (``run_forward``'s ``planned``) and its inputs' data
    pointers, or None. Autograd refuses a saved input changed in place, metadata included, but
    not one whose ``.data`` was replaced; a backward whose inputs no longer point where the
    forward's did takes the full key instead of the plan's table."""
    return (planned[0], launch.pointers(q, k, v, cu_q, cu_k)) if planned else None


def native_fallback(plan, same, do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, batch, scale, left,
                    right, softcap, varlen):  # fmt: skip
    """A native node's backward without a native plan for dO's layout: the Python path, with its
    forward's Python plan where the saved inputs still hold the forward's data (``same``), which
    records the backward's plan and hands it to ``plan``."""
    pyplan = native.python_plan(plan.id) if same else None
    fplan = saved_plan([pyplan] if pyplan is not None else [], q, k, v, cu_q, cu_k)
    mask = Mask(left=left, right=right, softcap=softcap)
    return run_backward(
        do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, batch, scale, mask, None, varlen,
        fplan=fplan, native_plan=plan if same else None,
    )  # fmt: skip


native.on_python_backward(native_fallback)


class FlashAttnFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop=None
    ):
        planned = []
        out, lse = run_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop=drop,
            planned=planned,
        )  # fmt: skip
        ctx.mark_non_differentiable(lse)
        # No zero-filled gradient for the LSE (or an unused output): one GPU fill less a step.
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi)
        ctx.meta = (max_q, max_k, batch, scale, mask, varlen, drop)
        ctx.fplan = saved_plan(planned, q, k, v, cu_q, cu_k)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        if dout is None:  # only the LSE was used: no gradient flows
            return (None,) * 13
        q, k, v, out, lse, cu_q, cu_k, alibi = ctx.saved_tensors
        max_q, max_k, batch, scale, mask, varlen, drop = ctx.meta
        dq, dk, dv = run_backward(
            dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen,
            drop=drop, fplan=ctx.fplan,
        )  # fmt: skip
        # One gradient per forward input; autograd drops the trailing None when ``drop`` was not
        # passed.
        return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


class FlashAttnOutFunction(torch.autograd.Function):
    """:class:`FlashAttnFunction` for the calls that return only ``out`` (flash_attn_func and
    flash_attn_varlen_func without ``return_attn_probs``): four inputs (q, k, v and one tuple of
    the rest), one output, and only the tensors that exist saved (q, k, v, out, LSE, and
    cu_seqlens and ALiBi slopes where given). The same gradients and the same checks (a saved
    tensor modified in place, a second backward without ``retain_graph``); a few microseconds
    less of autograd's host time a step than the 13 inputs, two outputs and 8 saved slots of
    :class:`FlashAttnFunction` (docs/history/benchmarks-2026.md, "The training step's host
    time")."""

    @staticmethod
    def forward(ctx, q, k, v, call):
        cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop = call
        planned = []
        out, lse = run_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen, drop=drop,
            planned=planned,
        )  # fmt: skip
        ctx.set_materialize_grads(False)
        if cu_q is None and cu_k is None and alibi is None:
            ctx.save_for_backward(q, k, v, out, lse)
        else:
            ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi)
        ctx.call = call
        ctx.fplan = saved_plan(planned, q, k, v, cu_q, cu_k)
        return out

    @staticmethod
    def backward(ctx, dout):
        if dout is None:
            return None, None, None, None
        saved = ctx.saved_tensors
        q, k, v, out, lse = saved[:5]
        cu_q, cu_k, alibi = saved[5:] if len(saved) > 5 else (None, None, None)
        _, _, max_q, max_k, batch, scale, mask, _, varlen, drop = ctx.call
        dq, dk, dv = run_backward(
            dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi, varlen,
            drop=drop, fplan=ctx.fplan,
        )  # fmt: skip
        return dq, dk, dv, None


def _inference(*tensors) -> bool:
    """No gradient will be asked for: the forward runs without autograd's Function machinery
    (tens of microseconds a call, which small launch-bound shapes feel)."""
    return not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors)


def mask_from_flash_args(causal: bool, window_size, softcap: float) -> Mask:
    left, right = window_size if window_size is not None else (-1, -1)
    left = None if left is None or left < 0 else int(left)
    right = None if right is None or right < 0 else int(right)
    if causal:
        right = 0
    return Mask(left=left, right=right, softcap=float(softcap or 0.0))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    mask: Mask,
    alibi_slopes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed-length attention on BSHD views with an explicit :class:`Mask`; returns (out, lse)."""
    b, sq = q.shape[0], q.shape[1]
    sk = k.shape[1]
    return FlashAttnFunction.apply(q, k, v, None, None, sq, sk, b, scale, mask, alibi_slopes, False)


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> AttnResult:
    """flash_attn.flash_attn_func: q (B, Sq, Hq, D), k/v (B, Sk, Hk, D) -> out (B, Sq, Hq, D).

    ``dropout_p > 0`` drops attention probabilities with a Philox mask seeded from torch's
    generator (``torch.manual_seed`` reproduces it) and regenerated in the backward. With
    ``return_attn_probs`` returns (out, softmax_lse, S_dmask): S_dmask is None without dropout
    (as in flash_attn); with dropout it is (B, Hq, Sq, Sk) fp32, the attention probabilities
    negated where dropped (kept: ``S_dmask >= 0``), 0 where a key is not visible; it holds the
    whole score matrix, so it is for small shapes (tests). ``deterministic`` is accepted; the
    default dQ path has no atomics.
    """
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    mask = mask_from_flash_args(causal, window_size, softcap)
    b, sq, hq = q.shape[0], q.shape[1], q.shape[2]
    sk = k.shape[1]
    drop = dropout_state(q, dropout_p, b, hq, sq, sk, return_attn_probs)
    call = (None, None, sq, sk, b, scale, mask, alibi_slopes, False, drop)
    return call_entry(q, k, v, call, return_attn_probs)


def call_entry(q, k, v, call: tuple, return_attn_probs: bool) -> AttnResult:
    """The forward of flash_attn_func and flash_attn_varlen_func: without autograd where no
    gradient will be asked for, through :class:`FlashAttnOutFunction` where only ``out`` is returned,
    else through :class:`FlashAttnFunction` (``out`` and the LSE as outputs). A call that
    attnforge_kernels/launch/replay.py has a plan for (one returning only ``out``) is launched
    there, under a C++ autograd node."""
    if not return_attn_probs:
        out = native.forward(q, k, v, call)
        if out is not None:
            return out
    if _inference(q, k, v):
        out, lse = run_forward(q, k, v, *call)
    elif not return_attn_probs:
        return FlashAttnOutFunction.apply(q, k, v, call)
    else:
        out, lse = FlashAttnFunction.apply(q, k, v, *call)
    if return_attn_probs:
        drop = call[-1]
        return out, lse, drop.sdmask if drop else None
    return out


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
) -> AttnResult:
    """flash_attn.flash_attn_varlen_func: q (total_q, Hq, D), k/v (total_k, Hk, D), int32 cu_seqlens.

    Dropout as in :func:`flash_attn_func`; S_dmask is (batch, Hq, max_seqlen_q, max_seqlen_k),
    each sequence's scores at its own positions from (0, 0).
    """
    if block_table is not None:  # paged KV: forward only, through the KV-cache kernel
        if dropout_p:
            raise NotImplementedError(
                "dropout is not implemented for paged KV (block_table); pass dropout_p=0"
            )
        return paged_varlen_forward(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
            alibi_slopes=alibi_slopes, return_attn_probs=return_attn_probs, block_table=block_table,
        )  # fmt: skip
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    mask = mask_from_flash_args(causal, window_size, softcap)
    cu_q = cu_seqlens_q.to(torch.int32)
    cu_k = cu_seqlens_k.to(torch.int32)
    batch = cu_q.numel() - 1
    max_q, max_k = int(max_seqlen_q), int(max_seqlen_k)
    drop = dropout_state(q, dropout_p, batch, q.shape[1], max_q, max_k, return_attn_probs)
    call = (cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi_slopes, True, drop)
    return call_entry(q, k, v, call, return_attn_probs)


def fp8_dtype_for(device: torch.device) -> torch.dtype:
    """The e4m3 type the device's matrix units multiply natively, or a NotImplementedError that
    names the arch when they have none (Triton would emulate fp8 there: RDNA3, CDNA2, Ampere)."""
    family = configs.device_family(device)
    if family == "interpreter":
        return torch.float8_e4m3fn  # the interpreter has no FNUZ types
    if configs.is_hip():
        arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
        name = FP8_DOT.get(family)
    else:
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm{major}{minor}"
        name = "fp8e4nv" if (major, minor) >= (8, 9) else None
    if name is None:
        raise NotImplementedError(
            f"FP8 attention needs fp8 matrix instructions, which {arch} ({family}) does not have; "
            "run it on gfx942, gfx950, gfx12xx or NVIDIA sm89+, or use flash_attn_func in bf16"
        )
    return torch.float8_e4m3fnuz if name == "fp8e4b8" else torch.float8_e4m3fn


def _descale(d, name: str, batch: int, hk: int, device) -> torch.Tensor:
    """A descale factor as the kernel reads it: fp32 (batch, Hk), contiguous."""
    t = torch.ones(1) if d is None else torch.as_tensor(d)
    t = t.to(device=device, dtype=torch.float32)
    if t.numel() == 1:
        t = t.reshape(1, 1)
    elif tuple(t.shape) == (hk,):
        t = t.reshape(1, hk)
    elif tuple(t.shape) != (batch, hk):
        raise ArgumentError(
            f"{name} must be one number (per tensor), ({hk},) or ({batch}, {hk}) (per batch and "
            f"key/value head), got shape {tuple(t.shape)}"
        )
    return t.expand(batch, hk).contiguous()


def flash_attn_fp8_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    descale_q: Descale = None,
    descale_k: Descale = None,
    descale_v: Descale = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    return_attn_probs: bool = False,
) -> AttnResult:
    """FP8 attention forward: e4m3 q (B, Sq, Hq, D), k/v (B, Sk, Hk, D) -> out (B, Sq, Hq, D).

    The real inputs are ``q * descale_q`` etc.: descale factors are one number per tensor or
    one per (batch, key/value head), shaped (Hk,) or (B, Hk) as flash_attn 3 takes them (Q's
    too are per key/value head); None means 1. Scores and the softmax accumulate in fp32, P is
    rounded to e4m3 for the P.V product (as ROCm's Triton backend does), and ``out_dtype`` is
    bfloat16 or float16. Forward only (no autograd). The dtype must be the one the GPU
    multiplies natively (:func:`fp8_dtype_for`: float8_e4m3fnuz on gfx942, float8_e4m3fn on
    gfx950, gfx12xx and sm89+); other GPUs raise NotImplementedError naming the arch. With
    ``return_attn_probs`` returns (out, softmax_lse, None).
    """
    b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    return _fp8_call(
        q, k, v, None, None, sq, sk, b, (descale_q, descale_k, descale_v), softmax_scale,
        causal, window_size, softcap, alibi_slopes, out_dtype, return_attn_probs,
    )  # fmt: skip


def _fp8_call(
    q, k, v, cu_q, cu_k, max_q, max_k, batch, descales, softmax_scale, causal, window_size,
    softcap, alibi_slopes, out_dtype, return_attn_probs,
):  # fmt: skip
    """The checks and the forward launch all four FP8 entry points share (``cu_q`` None: fixed
    length)."""
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise ArgumentTypeError(
            f"out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}"
        )
    if q.dtype not in FP8_TYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ArgumentTypeError(
            f"q, k and v must share an e4m3 dtype (float8_e4m3fn or float8_e4m3fnuz), got "
            f"{q.dtype}, {k.dtype}, {v.dtype}"
        )
    native = fp8_dtype_for(q.device)
    if q.dtype != native:
        raise ArgumentTypeError(
            f"this GPU multiplies {native} natively, got {q.dtype}; quantise to {native} "
            f"(its largest value is {torch.finfo(native).max:g})"
        )
    hk = k.shape[-2]
    descale = tuple(
        _descale(t, name, batch, hk, q.device)
        for t, name in zip(descales, ("descale_q", "descale_k", "descale_v"), strict=True)
    )
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    mask = mask_from_flash_args(causal, window_size, softcap)
    varlen = cu_q is not None
    with torch.no_grad():
        out, lse = run_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, mask, alibi_slopes, varlen,
            descale=descale, out_dtype=out_dtype,
        )  # fmt: skip
    if return_attn_probs:
        return out, lse, None
    return out


def _cu_seqlens(cu, name: str, device) -> torch.Tensor:
    """An int32 cu_seqlens on ``device`` (flash_attn takes int32; int64 is converted)."""
    if cu.dim() != 1 or cu.numel() < 2 or cu.dtype not in (torch.int32, torch.int64):
        raise ArgumentError(
            f"{name} must be a 1-D integer tensor of batch + 1 offsets, got shape "
            f"{tuple(cu.shape)} and dtype {cu.dtype}"
        )
    return cu.to(device=device, dtype=torch.int32)


def flash_attn_varlen_fp8_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    descale_q: Descale = None,
    descale_k: Descale = None,
    descale_v: Descale = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    return_attn_probs: bool = False,
) -> AttnResult:
    """FP8 varlen forward: e4m3 q (total_q, Hq, D), k/v (total_k, Hk, D) with int32
    ``cu_seqlens_q``/``cu_seqlens_k`` -> out (total_q, Hq, D) in ``out_dtype``.

    As :func:`flash_attn_fp8_func` (descale factors one number, (Hk,) or (batch, Hk); forward
    only; the GPU's native e4m3 type), with :func:`flash_attn_varlen_func`'s sequence layout;
    ``return_attn_probs`` returns (out, softmax_lse (Hq, total_q), None).
    """
    cu_q = _cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.device)
    cu_k = _cu_seqlens(cu_seqlens_k, "cu_seqlens_k", q.device)
    if cu_k.numel() != cu_q.numel():
        raise ArgumentError(
            f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
            f"{cu_q.numel()} and {cu_k.numel()}"
        )
    return _fp8_call(
        q, k, v, cu_q, cu_k, int(max_seqlen_q), int(max_seqlen_k), cu_q.numel() - 1,
        (descale_q, descale_k, descale_v), softmax_scale, causal, window_size, softcap,
        alibi_slopes, out_dtype, return_attn_probs,
    )  # fmt: skip


def _unpack_qkv(qkv, dims: int, shape: str):
    if qkv.dim() != dims or qkv.shape[-3] != 3:
        raise ArgumentError(f"qkv must be {shape}, got shape {tuple(qkv.shape)}")
    return qkv.unbind(dim=-3)


def flash_attn_qkvpacked_fp8_func(
    qkv: torch.Tensor,
    descale_q: Descale = None,
    descale_k: Descale = None,
    descale_v: Descale = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    return_attn_probs: bool = False,
) -> AttnResult:
    """:func:`flash_attn_fp8_func` on e4m3 qkv (B, S, 3, H, D) -> out (B, S, H, D)."""
    q, k, v = _unpack_qkv(qkv, 5, "(batch, seqlen, 3, heads, head_dim)")
    return flash_attn_fp8_func(
        q, k, v, descale_q, descale_k, descale_v, softmax_scale, causal, window_size, softcap,
        alibi_slopes, out_dtype, return_attn_probs,
    )  # fmt: skip


def flash_attn_varlen_qkvpacked_fp8_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    descale_q: Descale = None,
    descale_k: Descale = None,
    descale_v: Descale = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    return_attn_probs: bool = False,
) -> AttnResult:
    """:func:`flash_attn_varlen_fp8_func` on e4m3 qkv (total, 3, H, D) with one ``cu_seqlens``
    -> out (total, H, D)."""
    q, k, v = _unpack_qkv(qkv, 4, "(total, 3, heads, head_dim)")
    return flash_attn_varlen_fp8_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, descale_q, descale_k,
        descale_v, softmax_scale, causal, window_size, softcap, alibi_slopes, out_dtype,
        return_attn_probs,
    )  # fmt: skip
