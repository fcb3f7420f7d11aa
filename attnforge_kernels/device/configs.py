"""Per-family tile configurations, chosen without autotuning.

A family comes from the device (``gcnArchName`` on ROCm, compute capability on CUDA) or is named
by the AOT check. Configs depend on the family and the padded head dimension only, so a new
sequence length never recompiles a kernel. Opt-in autotuning lives in
``attnforge_kernels.launch.autotune``.

Why these numbers (the AOT check in docs/kernels.md shows their registers, spills and LDS):

* RDNA (wave32, WMMA 16x16x16, 64 KiB LDS per workgroup, 128 KiB per WGP): small tiles, 4 waves,
  one stage (Triton's HIP backend does no useful multi-stage pipelining on RDNA), and
  ``waves_per_eu=2`` as AITER tuned for gfx1151 (perf.md 2c); bigger tiles spill.
* CDNA (wave64, MFMA): 128x64 forward tiles like the ROCm Triton backend's gfx942/gfx950 defaults,
  ``waves_per_eu=2``; the backward uses 64x64-ish tiles that do not spill at d=128.
* Hopper: 128-row forward tiles, 8 warps, 3 stages (perf.md 1d); Ampere: same shapes, 2 stages.
"""

from __future__ import annotations

import functools
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from contract import arches

# Triton decides at decoration time whether kernels run in its CPU interpreter; remember that
# mode here so that later changes of the environment cannot split the two.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# Floating-point fusion (``a * b + c`` contracted to one FMA) in every kernel this package launches
# or AOT-compiles: on, as Triton 3.6-3.9 default to and as every figure in docs/benchmarks.md and
# the AOT tables was measured. Triton 3.9 warns that 3.10 turns its default off
# (``TRITON_DEFAULT_FP_FUSION``, triton/knobs.py; triton/_utils.py), so the kernels say it
# themselves and that flip changes nothing. ``ATTNFORGE_FP_FUSION=0`` compiles them without it: the
# kernel checks run under both settings (tests/kernels/test_fp_fusion.py).
FP_FUSION_ENV = "ATTNFORGE_FP_FUSION"


def fp_fusion_from(env=os.environ) -> bool:
    """The fusion setting ``env`` asks for (``1``, the default, or ``0``)."""
    value = env.get(FP_FUSION_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{FP_FUSION_ENV}={value!r}: expected 1 (fuse, the default) or 0")
    return value == "1"


FP_FUSION = fp_fusion_from()

FAMILIES = (
    "rdna3",
    "rdna3.5",
    "rdna4",
    "cdna2",
    "cdna3",
    "cdna4",
    "hopper",
    "ampere",
    "nvidia",
    "interpreter",
)


@dataclass(frozen=True)
class Tile:
    """Launch shape of one kernel: BLOCK_M query rows x BLOCK_N key rows."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    waves_per_eu: int = 0  # HIP only; 0 leaves the compiler's choice
    # Hopper: the streamed tiles (K/V in the forward and dQ kernels, Q/dO in the dK/dV kernel)
    # come through TMA tensor descriptors instead of pointer loads, where the tensors' alignment
    # allows it (attnforge_kernels.api.flash_attn.tma_ok; bf16/fp16 only).
    tma: bool = False
    maxnreg: int = 0  # NVIDIA only: cap registers per thread (ptxas); 0 leaves ptxas' choice
    # A TMA tile's stand-in where TMA cannot address a call's tensors (FP8, misaligned views;
    # ``AttnConfig.without_tma``); None: this tile with pointer loads. For a tile that is only
    # fast with TMA: Hopper's d=128 forward (4 warps) holds 255 registers with TMA and spills
    # 448 bytes with pointer loads (Triton 3.9).
    no_tma: Tile | None = None
    # The forward: programs of this tile one SM (CU) holds at once, where known (0: not known).
    # With it the launcher splits the tiles of a grid's last, partial wave along the keys
    # (``tail_split``).
    per_sm: int = 0

    def launch_options(self, hip: bool) -> dict:
        opts = {
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "enable_fp_fusion": FP_FUSION,
        }
        if hip and self.waves_per_eu:
            opts["waves_per_eu"] = self.waves_per_eu
        if not hip and self.maxnreg:
            opts["maxnreg"] = self.maxnreg
        return opts


# AttnConfig.paired_kv's window: the unpaired dK/dV grid's programs per compute unit from which,
# and below which, the key blocks pair up. On an H100 (two dK/dV programs an SM) pairing took
# 0.92 of the time at 1.9 programs an SM, 0.73-0.75 at 3.9 and 0.92 at 7.8; 1.33 at 0.97, and
# 1.01-1.09 at 31 and more (docs/benchmarks.md, "Paired causal key blocks"). A config's own
# window (``AttnConfig.paired_waves``, an override key) replaces it.
PAIRED_WAVES = (1.5, 8.0)
# AttnConfig.across_heads's window: the causal grid's programs per compute unit below which its
# programs launch longest first across heads (flash.py ``_grid_order``). On an H100 (2026-12-06,
# docs/benchmarks.md "Causal grids ordered across heads") the all-Triton forward ran 1.07-1.45x
# inside it (LLM GQA prefill of one sequence, 1-4k tokens, d=64-256); forced onto grids of 15.5
# programs an SM it ran 0.98-1.05x, at 124 0.99x: above it a grid's tail is a small part of its
# time, and head after head keeps the programs that run at once on few heads' keys and values
# (L2). A config's own window (``AttnConfig.across_waves``, an override key) replaces it.
ACROSS_WAVES = (0.0, 8.0)


@dataclass(frozen=True)
class AttnConfig:
    """Tiles for the forward, the dK/dV kernel, the dQ kernel, and how dQ is reduced."""

    fwd: Tile
    bwd_kv: Tile  # block_n keys stay resident, block_m query rows stream
    bwd_q: Tile  # block_m query rows stay resident, block_n keys stream
    atomic_dq: bool = False  # dQ by fp32 atomics inside the dK/dV kernel instead of a dQ kernel
    reload: bool = False  # backward re-reads its resident tiles each step (RDNA: no spills)
    # Backward: compute the head-dim contractions (Q.K^T, dO.V^T) this many columns at a time,
    # loading each chunk from memory (0: whole tiles). dK/dV kernel and dQ kernel. RDNA3/3.5, and
    # every RDNA family above d=128.
    chunk_kv: int = 0
    chunk_q: int = 0
    # The forward's Q.K^T the same way (flash.py attn_fwd's D_CHUNK): RDNA above d=128, where
    # a resident Q tile and K block hold 2 x 128 VGPRs of WMMA operands. Not with TMA.
    chunk_fwd: int = 0
    # dK and dV from two launches of the dK/dV kernel, one accumulator each (flash.py
    # attn_bwd_dkdv's PART): Hopper above d=128, where two keys x head-dim fp32 accumulators do
    # not fit a 64-key block. Not with atomic_dq or chunk_kv.
    split_kv: bool = False
    # The dK/dV kernel's loop order (flash.py attn_bwd_dkdv's MASKED_LAST): the full query blocks
    # first, then every masked block in one loop, instead of a causal diagonal's masked blocks
    # ahead of the full ones. Hopper: the causal kernel spills 244 bytes instead of 468 at d=128,
    # 24 instead of 212 at d=64 (Triton 3.6), and its dK/dV time fell 10-14% on an H100
    # (docs/benchmarks.md, "The causal dK/dV loop order"). Off elsewhere: on AMD (Triton 3.9) the
    # order raised RDNA3/3.5's d=128 VGPRs by 29-34 (occupancy 12 -> 10 on gfx1151), halved CDNA3/4's
    # d=64 occupancy and spilled gfx942's d=128 dropout kernel; Ampere is untimed.
    masked_last: bool = False
    # Causal dK/dV: each program takes a key block and its mirror from the sequence's end
    # (flash.py attn_bwd_dkdv's PAIRED), so that every program runs about as many query blocks,
    # where the unpaired grid has PAIRED_WAVES programs per compute unit (paired_kv_at). Hopper:
    # the dK/dV kernel took 0.73-0.92 of the time at 1.9-7.8 programs an SM (docs/benchmarks.md,
    # "Paired causal key blocks"), but the unpaired kernel ordered across heads (``across_heads``)
    # ran forward + backward 0-6% faster at those shapes and spills less, so no config pairs
    # now; an override key for experiments.
    paired_kv: bool = False
    paired_waves: tuple[float, float] = PAIRED_WAVES
    # Causal forward, dQ and (unpaired) dK/dV grids, Triton's and Gluon's: the programs launch
    # longest first across every (batch, head), not head after head (flash.py ``_grid_order``),
    # where the grid has ACROSS_WAVES programs per compute unit (across_heads_at): head after
    # head, a grid of a few programs per unit ends on its last heads' longest programs with most
    # units idle. Every family: the kernels compile to the same registers, spills and occupancy
    # either way (only which program id names the block changes); timed on an H100 only.
    across_heads: bool = True
    across_waves: tuple[float, float] = ACROSS_WAVES
    # Hopper: the forward (head dim 128) and the dK/dV kernel (64 and 128) run the
    # warp-specialised Gluon kernels (attnforge_kernels/device/flash_sm90.py) where the call is in
    # their scope (attnforge_kernels.api.flash_attn.gluon_forward_ok, gluon_backward_ok); fwd /
    # bwd_kv are then unused.
    gluon_fwd: bool = False
    gluon_bwd: bool = False
    # The shortest sequence (the fewer of a call's queries and keys) at which the Gluon kernels
    # run where the config asks for them; shorter calls run the Triton kernels, which measured
    # as fast or faster there (GLUON_MIN_SEQ below). 0: at any length. A causal call's forward
    # takes gluon_fwd_causal_min_seq instead.
    gluon_fwd_min_seq: int = 0
    gluon_fwd_causal_min_seq: int = 0
    gluon_bwd_min_seq: int = 0
    # The forward's single-block path (``SHORT_KV``) where every key of every sequence fits one
    # key block of the forward tile; off only to measure the loop against it.
    short_kv: bool = True

    def gluon_fwd_at(self, head_dim: int, seqlen: int | None = None, causal: bool = False) -> bool:
        """Whether the config runs the Gluon forward at this (unpadded) head dim and, given the
        call's shorter sequence, at that length, a causal call's own threshold for a causal one
        (the compile check asks without a length)."""
        least = self.gluon_fwd_causal_min_seq if causal else self.gluon_fwd_min_seq
        long_enough = seqlen is None or seqlen >= least
        return self.gluon_fwd and head_dim == GLUON_FWD_HEAD_DIM and long_enough

    def gluon_bwd_at(self, head_dim: int, seqlen: int | None = None) -> bool:
        """Whether the config runs the Gluon dK/dV kernel at this (unpadded) head dim: it has a
        tile for it, dQ is reduced in its own kernel (no ``atomic_dq``), and the call's shorter
        sequence, where given, is long enough."""
        long_enough = seqlen is None or seqlen >= self.gluon_bwd_min_seq
        return self.gluon_bwd and not self.atomic_dq and head_dim in GLUON_BWD_TILES and long_enough

    def paired_kv_at(self, causal: bool, programs: int, units: int) -> bool:
        """Whether a dK/dV launch of ``programs`` (key blocks x batch x kv heads, unpaired) on
        ``units`` compute units (0: unknown, as under the interpreter, where it pairs) pairs its
        key blocks: the config asks for it, the keys' query ranges end at a diagonal
        (``causal``: a right window without a left one), and the grid has PAIRED_WAVES programs
        per unit (``paired_waves``): fewer, and halving them idles units; more, and the unpaired
        tail is short."""
        return self.paired_kv and causal and _in_window(self.paired_waves, programs, units)

    def across_heads_at(self, causal: bool, programs: int, units: int) -> bool:
        """Whether a causal launch of ``programs`` on ``units`` compute units (0: unknown, as
        under the interpreter, where it does) orders its programs across heads: the config asks
        for it and the grid has ``across_waves`` programs per unit."""
        return self.across_heads and causal and _in_window(self.across_waves, programs, units)

    def without_tma(self) -> AttnConfig:
        """The config with pointer loads in every tile (a TMA tile's ``no_tma`` where it has one)."""
        return replace(self, **{k: pointer_tile(getattr(self, k)) for k in TILE_KEYS})


def pointer_tile(t: Tile) -> Tile:
    """``t`` where TMA cannot serve it: its ``no_tma`` stand-in, else itself with pointer loads."""
    if not t.tma:
        return t
    return t.no_tma or replace(t, tma=False)


TILE_KEYS = ("fwd", "bwd_kv", "bwd_q")


def _in_window(waves: tuple[float, float], programs: int, units: int) -> bool:
    """Whether a grid of ``programs`` has ``waves`` ([low, high)) programs per compute unit; any
    grid where the units are unknown (0: the interpreter)."""
    low, high = waves
    return not units or low * units <= programs < high * units


# The head dims the warp-specialised Gluon kernels (attnforge_kernels/device/flash_sm90.py) are
# built for. They live here, not there, because the routing rule and the AOT report read them in
# processes that must not import Gluon (the CPU interpreter, AMD). The forward: d=128 only. The
# dK/dV kernel, by head dim: (query rows per streamed block, keys per program, stages), as measured
# on an H100 (docs/history/benchmarks-2026.md, "Warp-specialised Gluon dK/dV"). Both split 128 keys
# over the two consumers. d=128: 64-row Q and dO blocks through three stages (165 KiB of shared
# memory with K and V; two stages measured the same at 4096 and 2% slower at 6889). d=64: 128-row
# blocks through two stages (98 KiB), whose S^T and dP^T fit beside the smaller dK and dV (dK/dV
# 1.96 ms at (4,32,4096,64) against 2.02 for 64-row blocks, causal 1.16 against 1.31).
GLUON_FWD_HEAD_DIM = 128
GLUON_BWD_TILES = {64: (128, 128, 2), 128: (64, 128, 3)}
# The dK/dV kernel's loader warp gets 24 registers (setmaxnreg; the consumers 240), except where a
# Triton line's ptxas spills there, by (Triton line, head dim, causal): Triton 3.9 (its
# ptxas-blackwell of CUDA 13.4) spills 8 bytes in the d=64 kernel without a causal mask at 24 and
# none at 32, where the causal kernel spills 56 (tests/kernels/test_sm90.py compiles both; 2026-12-04).
# Compile-checked only: the kernels were timed on Triton 3.6.
GLUON_BWD_LOADER_REGS = {((3, 9), 64, False): 32}


@functools.lru_cache(maxsize=32)
def gluon_bwd_loader_regs(
    head_dim: int, causal: bool, release: tuple[int, int] | None = None
) -> int:
    """The Gluon dK/dV kernel's loader registers on this (or ``release``'s) Triton line."""
    release = triton_release() if release is None else release
    return GLUON_BWD_LOADER_REGS.get((release, head_dim, causal), 24)


# Where the Gluon kernels pay, by head dim: the shortest sequence each runs at (the Hopper
# configs' gluon_fwd_min_seq, gluon_fwd_causal_min_seq and gluon_bwd_min_seq). Measured on an H200
# (docs/benchmarks.md, "Hopper dispatch"; `python -m attnforge_kernels.bench --dispatch`): bf16, GQA
# 1/4/7/8, causal and not, 512-32k tokens, two sweeps. The d=128 Gluon forward took 0.70-1.01 of
# the Triton forward's time from 4096 tokens, 0.81-1.20 at 2048 and 0.94-2.23 below: it ran from
# 4096 at first. The d=128 Gluon dK/dV kernel made a forward+backward 0.79-0.97 of the time from
# 2048 tokens and 0.67-1.79 below: it runs from 2048. The d=64 one: 0.77-0.95 from 1024 tokens,
# 0.81-1.21 at 512 (16 heads, no GQA, was the slow one): it runs from 1024. The Gluon forward's
# kernel is faster from 2048 tokens since the causal grids were ordered across heads and its
# launch is replayed by the launch plans (H100, 2026-12-07, docs/benchmarks.md "One sequence a
# shape"; the unreplayed launch read 1.35x forward at 2048 by do_bench): the forward of 8192
# tokens took 0.84-0.88 of the Triton forward's time at 2048 tokens without a mask and 0.93-1.00
# causal, one sequence 0.87-0.88 and 0.98-1.03 (GQA 7 causal, 28/4 heads: 1.03 by do_bench and by
# GPU time), and from 2560 tokens 0.79-0.98 either way: it runs from 2048, a causal call from 2560.
GLUON_MIN_SEQ = {"fwd": {128: 2048}, "fwd_causal": {128: 2560}, "bwd": {64: 1024, 128: 2048}}


# Triton's HIP JIT compiles tensors of at most 2 GiB with 32-bit buffer-load offsets; larger ones
# get 64-bit addresses, whose per-element address registers make the chunked backward spill far
# more than the whole-tile re-read. Above 2 GiB the chunking is switched off (``for_tensors``).
MAX_BUFFER_BYTES = 2**31 - 1


def for_tensors(cfg: AttnConfig, within_2gib: bool) -> AttnConfig:
    """The config to launch: chunked contractions (forward and backward) only where buffer
    loads apply."""
    if within_2gib or not (cfg.chunk_kv or cfg.chunk_q or cfg.chunk_fwd):
        return cfg
    return replace(cfg, chunk_kv=0, chunk_q=0, chunk_fwd=0)


def padded_head_dim(d: int) -> int:
    p = 16
    while p < d:
        p *= 2
    return p


def _rdna(d: int, family: str) -> AttnConfig:
    if d <= 64:
        return AttnConfig(Tile(64, 64, 4, 1, 2), Tile(16, 32, 8, 1, 1), Tile(32, 32, 4, 1, 1))
    # RDNA3/3.5 WMMA holds a whole K row of an operand per lane: resident d>=128 tiles in the
    # backward cost 64+ VGPRs each. Re-reading them per step cuts the spills but does not remove
    # them; computing Q.K^T and dO.V^T 16 head-dim columns (one WMMA K step) at a time does
    # (gfx1151 d=128: dK/dV 235 VGPRs, dQ 116, no spills; the >2 GiB fallback re-reads).
    # RDNA4's WMMA layout needs neither at d=128.
    rdna3 = family != "rdna4"
    chunk = 16 if rdna3 else 0
    if d <= 128:
        return AttnConfig(
            Tile(64, 32, 4, 1, 2),
            Tile(16, 16, 8, 1, 1),
            Tile(32, 16, 8, 1, 1),
            reload=rdna3,
            chunk_kv=chunk,
            chunk_q=chunk,
        )
    # d > 128 (160 and 256 pad to 256), every RDNA family, RDNA4 too: resident 256-column
    # operands spill every kernel but dQ on the Tritons the stacks ship (gfx1151 on 3.9: forward
    # 190 VGPRs, dK/dV 137-140; gfx1201's dK/dV 82-154 on 3.7-3.9). All three contractions over
    # the head dim go 16 columns at a time (the forward's too, ``chunk_fwd``), with 32x16 forward
    # tiles over 8 waves: no spill on 3.7.1, 3.8.0 or 3.9.0, and 5-16 waves per SIMD where they
    # had 4-7 (docs/kernels.md, "Head dims above 128 on RDNA"). Compile-checked; no AMD GPU has
    # timed either. Over 2 GiB (``for_tensors``) the re-read fallback spills as it did.
    return AttnConfig(
        Tile(32, 16, 8, 1, 1),
        Tile(16, 16, 8, 1, 1),
        Tile(16, 16, 8, 1, 1),
        reload=rdna3,  # the fallback's, as before
        chunk_kv=16,
        chunk_q=16,
        chunk_fwd=16,
    )


def _cdna(d: int, family: str) -> AttnConfig:
    # 128x64 forward tiles (the ROCm Triton backend's gfx942 default) spill 7-137 VGPRs with
    # this kernel under waves_per_eu=2; 128x32 does not.
    if d <= 64:
        return AttnConfig(Tile(128, 32, 4, 1, 2), Tile(32, 128, 4, 1, 1), Tile(128, 32, 4, 1, 1))
    if d <= 128:
        return AttnConfig(Tile(128, 32, 4, 1, 2), Tile(32, 64, 4, 1, 1), Tile(64, 32, 4, 1, 1))
    return AttnConfig(Tile(64, 16, 4, 1, 1), Tile(16, 32, 4, 1, 1), Tile(32, 16, 4, 1, 1))


# Hopper's d=128 Triton forward tile until 2026-12-07: 8 warps, pointer loads. It still serves
# the calls the 4-warp TMA tile does not suit (see _hopper).
HOPPER_FWD_8_WARPS = Tile(128, 64, 8, 3)


def _hopper(d: int) -> AttnConfig:
    # The dK/dV tile 64x64 with 4 warps spills (ptxas) yet measured fastest on an H200:
    # fwd+bwd 362 vs 277 TFLOP/s for the spill-free 16x128/8 warps (docs/benchmarks.md). The
    # backward streams Q/dO (dK/dV) and K/V (dQ) by TMA, which frees registers (dK/dV spills
    # 1204 -> 468 bytes at d=128) and allows a third dQ stage: fwd+bwd 370 -> 416 TFLOP/s on an
    # H100 at (4,16,4096,128). The d=64 Triton forward measured slower with TMA and keeps pointer
    # loads. The d=128 one runs 128 query rows on one warp group (4 warps) with K/V by TMA, two
    # programs an SM (docs/kernels.md, "One warp group a program", reads why): on an H100
    # (2026-12-07, docs/benchmarks.md "One warp group a program") 3-12% faster without a mask at
    # 512-8192 tokens, causal within 3%; grids of fewer than SMALL_GRID_WAVES programs an SM,
    # dropout and calls TMA cannot address keep the 8-warp tile (SMALL_GRID_FULL_FWD,
    # _DROPOUT_TILES, Tile.no_tma). At d=128 the warp-specialised Gluon forward replaces it where
    # it applies (577 vs 470 TFLOP/s at (4,16,4096,128); at d=64 it measured slower than the
    # Triton kernel), and the
    # Gluon dK/dV kernel replaces the spilling dK/dV tile at d=64 and d=128 (1.55 vs 1.80 ms at
    # (4,16,4096,128), fwd+bwd 460 vs 419 TFLOP/s; 1.96 vs 2.45 ms at (4,32,4096,64)). The Triton
    # tiles stay the fallback for calls outside their scope.
    if d <= 64:
        return AttnConfig(
            Tile(128, 64, 8, 4),
            Tile(64, 64, 4, 2, tma=True),
            Tile(128, 64, 8, 3, tma=True),
            gluon_bwd=True,
            gluon_bwd_min_seq=GLUON_MIN_SEQ["bwd"][64],
            masked_last=True,
        )
    if d <= 128:
        # The Triton forward tile stays the fallback (odd head dims, varlen, windows, short
        # sequences, ...).
        return AttnConfig(
            Tile(128, 64, 4, 2, tma=True, no_tma=HOPPER_FWD_8_WARPS, per_sm=2),
            Tile(64, 64, 4, 2, tma=True),
            Tile(128, 64, 8, 3, tma=True),
            gluon_fwd=True,
            gluon_bwd=True,
            gluon_fwd_min_seq=GLUON_MIN_SEQ["fwd"][128],
            gluon_fwd_causal_min_seq=GLUON_MIN_SEQ["fwd_causal"][128],
            gluon_bwd_min_seq=GLUON_MIN_SEQ["bwd"][128],
            masked_last=True,
        )
    # d > 128 (160, 192 and 256 pad to 256): tiles whose products are wgmma's (64 rows a warp
    # group) where they fit. On an H100 (2026-12-06, Triton 3.6): the forward's 64x32 w4 s2 ran
    # 1.5-1.6x the 64x64 w8 s2 it replaced (388 against 253 TFLOP/s at (4,16,4096,256)) and 1.8-2.3x
    # the 32x32 small-grid tile (mma.sync) it also replaced; dK/dV 64x32 w8 s1 (was 16x32 w8 s1)
    # and dQ 64x32 w4 s1 (was 32x32 w4 s1) took fwd+bwd 2.1-2.5x, the dQ tile 1.25-1.36x of that
    # (it spills on Triton 3.6-3.8: an accepted spill, below). The dK/dV kernel's two keys x 256
    # fp32 accumulators spill in every tile wider than 32 keys, so dK and dV come from two
    # launches of one accumulator each (split_kv; one Q.K^T product more), 64x32 w4 s2 with Q/dO
    # by TMA: fwd+bwd 1.1-1.2x the joint kernel at GPU-bound shapes, still below SDPA's at these
    # head dims (docs/benchmarks.md, "Split dK/dV launches above d=128").
    return AttnConfig(
        Tile(64, 32, 4, 2),
        Tile(64, 32, 4, 2, tma=True),
        Tile(64, 32, 4, 1),
        split_kv=True,
        masked_last=True,
    )


@dataclass(frozen=True)
class AcceptedSpill:
    """A default config that spills registers and is kept: it measured faster than the
    spill-free alternatives. The AOT check reports it as accepted instead of failing, as long as
    it spills no more than measured here; another tile, head dim or arch is not covered."""

    arch: str
    head_dim: int
    kernel: str  # fwd, bwd_dkdv, bwd_dq (the AOT check's names)
    tile: str  # as the AOT check prints it
    spills: int  # AMD: VGPRs spilled; NVIDIA: ptxas spill-store bytes
    scratch_bytes: int
    reason: str
    # Triton lines, (major, minor), on which this tile compiles without a spill (measured), so the
    # AOT check of such a line must not find it spilling (tests/kernels/test_aot.py).
    spill_free_on: tuple[tuple[int, int], ...] = ()

    def spills_on(self, release: tuple[int, int]) -> bool:
        return release not in self.spill_free_on


_HOPPER_DKDV = (
    "fastest dK/dV tile on an H100 despite the ptxas spills (TMA cut them from {} bytes): fwd+bwd "
    "{} TFLOP/s at {} against {} for the spill-free 16x128 w8 s2 tile on an H200 "
    "(docs/benchmarks.md, 'How the Hopper defaults were chosen' and 'TMA backward')"
)
# Spills measured by ``python -m attnforge_kernels.aot --all`` (triton 3.6.0); docs/kernels.md
# "Known spills". With the dK/dV kernel's masked blocks last (``masked_last``, 2026-12-06) these
# are the causal kernels' (the check compiles the causal variant): d=64 24 bytes on 3.6.0, none on
# 3.7.1-3.9.0 (212 on 3.6.0 before); d=128 244, 104, 108, 132 on 3.6.0, 3.7.1, 3.8.0, 3.9.0
# (468 on 3.6.0 and 156 on 3.9.0 before).
ACCEPTED_SPILLS = (
    AcceptedSpill(
        arch="sm90",
        head_dim=64,
        kernel="bwd_dkdv",
        tile="64x64 w4 s2 tma",
        spills=24,
        scratch_bytes=24,
        reason=_HOPPER_DKDV.format(588, 351, "(4,32,4096,64)", 267)
        + "; it now serves only the calls outside the spill-free Gluon dK/dV kernel's scope "
        "(attnforge_kernels/device/flash_sm90.py: varlen, windows, ALiBi, softcap, strides TMA cannot address)",
        spill_free_on=((3, 7), (3, 8), (3, 9)),
    ),
    AcceptedSpill(
        arch="sm90",
        head_dim=128,
        kernel="bwd_dkdv",
        tile="64x64 w4 s2 tma",
        spills=244,
        scratch_bytes=240,
        reason=_HOPPER_DKDV.format(1204, 416, "(4,16,4096,128)", 277)
        + "; it now serves only the calls outside the spill-free Gluon dK/dV kernel's scope "
        "(attnforge_kernels/device/flash_sm90.py: varlen, windows, ALiBi, softcap, strides TMA cannot address)",
    ),
    # Hopper's d=128 forward (4 warps, K/V by TMA): ptxas spill-store bytes / scratch 116 / 112 on
    # Triton 3.6.0, 124 / 120 on 3.7.1, 76 / 48 on 3.8.0 (the across-heads form 68 / 56), none on
    # 3.9.0 (`python -m attnforge_kernels.aot --arch sm90 --head-dims 128`, 2026-12-07).
    AcceptedSpill(
        arch="sm90",
        head_dim=128,
        kernel="fwd",
        tile="128x64 w4 s2 tma",
        spills=124,
        scratch_bytes=120,
        reason="the 4-warp forward with K/V by TMA (two programs an SM) ran 3-12% faster than "
        "the spill-free 8-warp 128x64 w8 s3 without a mask at 512-8192 tokens on an H100 with "
        "Triton 3.6, where it spills (Qwen-Image 1328x1328: 522 against 498 TFLOP/s), causal "
        "within 3%, with softcap, ALiBi or a window 5-12% faster (docs/benchmarks.md, 'One warp "
        "group a program'); spill-free on Triton 3.9",
        spill_free_on=((3, 9),),
    ),
    AcceptedSpill(
        arch="sm90",
        head_dim=128,
        kernel="fwd_split",
        tile="128x64 w4 s2 tma",
        spills=60,
        scratch_bytes=56,
        reason="the forward with its last wave's tiles split along the keys (tail_split) holds "
        "the part's key range beside the 4-warp tile's 255 registers; with these spills it ran "
        "4-6% faster than the whole-tile launch where it applies on an H100 with Triton 3.6 "
        "(Qwen-Image 1664x928: 502-506 against 481-483 TFLOP/s; docs/benchmarks.md, 'The last "
        "wave split along the keys'); 16-60 bytes on Triton 3.7-3.9",
    ),
)


_HOPPER_DQ_256 = (
    "dQ 64x32 w4 s1 (wgmma) ran fwd+bwd {} TFLOP/s at {} on an H100 with Triton 3.6, where it spills, "
    "against {} for the spill-free 32x32 w4 s1 (mma.sync) beside the same forward and dK/dV tiles "
    "(docs/benchmarks.md, 'Small grids and head dims above 128 on Hopper'); spill-free on Triton 3.9"
)
# Spill-store bytes by Triton line (`python -m attnforge_kernels.aot --arch sm90 --head-dims
# 160,256` over each): d=256 3.6.0 444, 3.7.1 496, 3.8.0 456; d=160 444, 492, 432; none on 3.9.0.
# The entries accept up to the largest.
ACCEPTED_SPILLS += tuple(
    AcceptedSpill(
        arch="sm90",
        head_dim=d,
        kernel="bwd_dq",
        tile="64x32 w4 s1",
        spills=496,
        scratch_bytes=496,
        reason=_HOPPER_DQ_256.format(*figures),
        spill_free_on=((3, 9),),
    )
    for d, figures in (
        (160, (119.0, "(2,8,4096,160) fp16", 87.6)),
        (256, (187.8, "(2,16,4096,256) bf16", 139.7)),
    )
)


_HOPPER_SPLIT = (
    "the split dK/dV launches (split_kv: dV alone, then dK alone, one fp32 accumulator each) "
    "with 64x32 w4 s2 tma ran fwd+bwd {} TFLOP/s at {} on an H100 with Triton 3.6, where they "
    "spill a few bytes, against {} for the spill-free joint 64x32 w8 s1 kernel "
    "(docs/benchmarks.md, 'Split dK/dV launches above d=128')"
)
# Spill-store bytes / scratch by Triton line (`python -m attnforge_kernels.aot --arch sm90
# --head-dims 160,256` over each, 2026-12-06, with ``masked_last``; the same at both head dims):
# bwd_dv none on 3.6.0-3.9.0 (12 bytes on three lines before); bwd_dk 16 (3.6.0), 8 (3.7.1-3.9.0);
# with dropout (untimed: the same tiles with the mask live) bwd_dv 24, 20, 20, 24 and bwd_dk 56,
# 44, 56, 44 on 3.6.0, 3.7.1, 3.8.0, 3.9.0 (56, 32, 24, 20 and 40, 48, 48, 48 before). The
# entries accept up to the largest.
_SPLIT_SPILLS = {
    "bwd_dk": (16, 16, ()),
    "bwd_dv_dropout": (24, 24, ()),
    "bwd_dk_dropout": (56, 56, ()),
}
ACCEPTED_SPILLS += tuple(
    AcceptedSpill(
        arch="sm90",
        head_dim=d,
        kernel=kernel,
        tile="64x32 w4 s2 tma",
        spills=spills,
        scratch_bytes=scratch,
        reason=_HOPPER_SPLIT.format(*figures)
        + ("; the dropout kernels are the same tiles, untimed" if "dropout" in kernel else ""),
        spill_free_on=free,
    )
    for kernel, (spills, scratch, free) in _SPLIT_SPILLS.items()
    for d, figures in (
        (160, (134.6, "(2,8,4096,160) fp16", 119.3)),
        (256, (215.8, "(2,16,4096,256) bf16", 184.5)),
    )
)


def _ampere(d: int) -> AttnConfig:
    if d <= 64:
        return AttnConfig(Tile(128, 64, 8, 2), Tile(16, 32, 4, 2), Tile(64, 64, 4, 2))
    if d <= 128:
        return AttnConfig(Tile(64, 64, 4, 2), Tile(16, 64, 8, 2), Tile(64, 64, 4, 2))
    return AttnConfig(Tile(64, 32, 8, 2), Tile(16, 32, 8, 1), Tile(32, 32, 4, 1))


def _interpreter(d: int) -> AttnConfig:
    # Small tiles so that CPU tests with short sequences still cross block boundaries.
    t = Tile(16, 16, 1, 1)
    return AttnConfig(t, t, t)


# Dropout keeps the Philox mask live in the backward (and at sm90 d=256 the forward): with the
# shared tiles ptxas spills there (sm90 dK/dV 64x64 w4: 564 / 1720 bytes at d=64 / 128; sm80 dK/dV
# and dQ: 16-232 bytes). These tiles compile without spills with dropout (python -m
# attnforge_kernels.aot --arch sm90 --arch sm80); AMD's shared tiles already do. Their speed is
# not measured yet.
_DROPOUT_TILES = {
    ("hopper", 64): {"bwd_kv": Tile(16, 128, 8, 2)},
    # d=128's forward: the 4-warp default spills 736 bytes with the mask live (Triton 3.9).
    ("hopper", 128): {"fwd": HOPPER_FWD_8_WARPS, "bwd_kv": Tile(16, 128, 8, 2)},
    # d=256's forward 64x32 w4 s2 spills with the mask live on Triton 3.6-3.8 (28-72 bytes) and
    # its dQ 64x32 w4 s1 on 3.9 too (32-64); 64x32 w8 s2 and 32x32 w4 s1 do not on 3.6-3.9.
    ("hopper", 256): {"fwd": Tile(64, 32, 8, 2), "bwd_q": Tile(32, 32, 4, 1)},
    ("ampere", 64): {"bwd_kv": Tile(16, 32, 4, 1), "bwd_q": Tile(64, 64, 8, 2)},
    ("ampere", 128): {"bwd_kv": Tile(16, 64, 8, 1), "bwd_q": Tile(64, 64, 8, 2)},
}


# Forward tiles for grids too small to fill the GPU: when the default tile gives fewer than
# SMALL_GRID_WAVES programs per compute unit (SM / CU), the forward runs this smaller tile instead
# (more programs, shorter critical path). The shapes diffusion and LLM users run are mostly such
# grids (SD 1.5 at 512x512, SDXL's 1024-token level, a single LLM prefill of 1024 tokens). Hopper
# re-picked on an H100 on 2026-12-06 (docs/benchmarks.md, "Small grids and head dims above 128 on
# Hopper"): d=64 keeps 64x64 w4 s3; d=128's 64x64 w4 s3 (was 64x32 w4 s4) runs causal grids 4-17%
# faster than that and 1-7% faster than the default tile, but non-causal grids 4-6% slower than the
# default of then (128x64 w8 s3), which serves them (SMALL_GRID_FULL_FWD); d=256 has no entry
# (its default 64x32 w4 s2 ran 1.8-2.3x the 32x32 tile there). The AMD rows halve the default BLOCK_M and are compile-checked
# only (python -m attnforge_kernels.aot: 0 spills, occupancy no lower than the default's): untuned
# on AMD hardware, they are the table an AMD runner's bench should refine (timing
# ATTNFORGE_KERNELS_CONFIG='{"fwd": [...]}' at the workload shapes, attnforge_kernels.bench
# --workloads). Keys: (family, padded head dim). Families and head dims not listed keep the default
# tile.
SMALL_GRID_WAVES = 4
SMALL_GRID_FWD = {
    ("hopper", 64): Tile(64, 64, 4, 3),
    ("hopper", 128): Tile(64, 64, 4, 3),
    ("cdna2", 64): Tile(64, 32, 4, 1, 2),
    # d=128 asks for 3 waves per EU: with 2 the forward's folded scale (flash.py _fwd_step) took
    # gfx90a to 177 VGPRs and gfx942 to 171, occupancy 2 (Triton 3.9); with 3, 161 and 168 and
    # occupancy 3, no spills on 3.7-3.9 (docs/kernels.md, "Scale folding in the forward").
    ("cdna2", 128): Tile(64, 32, 4, 1, 3),
    ("cdna3", 64): Tile(64, 32, 4, 1, 2),
    ("cdna3", 128): Tile(64, 32, 4, 1, 3),
    ("cdna4", 64): Tile(64, 32, 4, 1, 2),
    ("cdna4", 128): Tile(64, 32, 4, 1, 2),
    # RDNA3/3.5 at d=128: 32x32 w4 wpe2 spills 2 VGPRs (gfx1100/1101/1150/1151), so it keeps the
    # default 64x32 tile there.
    ("rdna3", 64): Tile(32, 64, 4, 1, 2),
    ("rdna3.5", 64): Tile(32, 64, 4, 1, 2),
    ("rdna4", 64): Tile(32, 64, 4, 1, 2),
    ("rdna4", 128): Tile(32, 32, 4, 1, 2),
}
# A non-causal small grid's tile where SMALL_GRID_FWD's serves causal grids only (key ranges
# ending at the diagonal, so the programs' work is uneven and more, shorter programs balance it).
# Hopper d=128: the 8-warp tile, as the default 4-warp one needs two programs an SM to overlap
# their softmax and products (on an H100, SD 1.5's d=80 level, 128 programs: 144 TFLOP/s against
# 203). Keys: (family, padded head dim).
SMALL_GRID_FULL_FWD = {("hopper", 128): HOPPER_FWD_8_WARPS}


# Forward tiles for head dims that are not a power of two (the kernels compute the padded width),
# where one measured faster than both the default and the small-grid tile. Keys: (family,
# unpadded head dim); the tile replaces the forward tile for every grid size. Hopper d=40 (SD 1.5's
# first level, padded to 64): 128x64 with 4 warps and 3 stages measured 124 TFLOP/s at
# (2, 4096, 8, 40) against 79 for the default 128x64 w8 s4 and the small-grid 64x64 w4 s3, and
# 27 against 22 for its 77-key cross-attention (docs/benchmarks.md, issue 30 section 2); measured
# before the forward's strides were aligned (STRIDE_ALIGN), which took it to 221-231 TFLOP/s (the
# d=64 default 128x64 w8 s4 then ran 4% faster in kernel time: not yet adopted; on 2026-12-07 it
# ran 230 against this tile's 233). The same tile with K/V by TMA (2026-12-07, H100, Triton 3.6,
# three rounds at (2, 4096, 8, 40) fp16) ran 245 against 234-236 TFLOP/s stored bshd but 222-223
# against 244-245 stored bhsd, so pointer loads stay (docs/benchmarks.md, "d=64 forward tiles and
# d=40 by TMA"). AMD has no entry: untuned there; an AMD runner's
# ``attnforge_kernels.bench --workloads --variant`` would fill it.
HEAD_DIM_FWD = {
    ("hopper", 40): Tile(128, 64, 4, 3),
}


# Forward tiles for short key sequences: cross-attention to CLIP's 77 text tokens (SD 1.5, SDXL) and
# self-attention at the smallest latent levels. When the longest key sequence fits one key block of
# the tile (max_k <= block_n), the forward runs it through the kernel's single-block path (SHORT_KV:
# one K/V load, no loop, no rescale of the accumulator), whatever the grid size; it takes precedence
# over HEAD_DIM_FWD and SMALL_GRID_FWD. Keys: (family, padded head dim). Hopper: from one sweep at
# the workload shapes with 77 keys on an H100 (kernel time by CUDA graph,
# docs/history/benchmarks-2026.md "Short keys and d=40"): SDXL cross-attention 14.1 against 16.7 us
# (4096 queries, d=64) and 8.1 against 10.0 (1024), SD 1.5 d=80 6.1 against 6.7, d=160 6.3 against
# 7.7 for the loop with the default or small-grid tile (d=256: 8 warps, as 4 spill 8 bytes).
# CDNA3/CDNA4: 64x128 where it compiles without spills at no lower occupancy than the default
# forward on Triton 3.6 to 3.9 (python -m attnforge_kernels.aot, gfx942/gfx950); not cdna4 at d=64,
# whose default has one wave more, nor d=256 anywhere, nor CDNA2 (gfx90a d=128 spills 2-6 VGPRs on
# Triton 3.7/3.9, d=64 loses a wave on 3.8/3.9). RDNA: every 128-key tile tried spills
# (gfx1100/gfx1151 40-843 VGPRs, gfx1201 27-344 above d=64) or lowers occupancy (gfx1201 d=64: 8 ->
# 5), so RDNA keeps the loop. The AMD rows are compile-checked only: untimed on AMD hardware, they
# are for an AMD runner's `attnforge_kernels.bench --workloads --variant 'NAME={"fwd": [...]}'` to
# confirm or replace.
SHORT_KV_FWD: dict[tuple[str, int], Tile] = {
    ("hopper", 64): Tile(64, 128, 4, 1),
    ("hopper", 128): Tile(64, 128, 4, 1),
    ("hopper", 256): Tile(32, 128, 8, 1),
    ("cdna3", 64): Tile(64, 128, 4, 1, 2),
    ("cdna3", 128): Tile(64, 128, 4, 1, 2),
    ("cdna4", 128): Tile(64, 128, 4, 1, 2),
}


# The joint dK/dV kernel's tile for backward grids of fewer programs (key blocks x batch x KV
# heads) than the device has compute units, where the config splits dK and dV (split_kv): there
# the backward is bound by launches and latency, not by the products, and the second launch and
# product cost more than the split saves. Hopper d > 128, measured on an H100 (2026-12-06,
# docs/benchmarks.md "Split dK/dV launches above d=128"): SD 1.5's d=160 level (2, 8, 256),
# 128 programs, fwd+bwd 27.8 TFLOP/s joint against 18.6 split; (2, 8, 1024), 512 programs, 99.6
# against 109.8. Keys: (family, padded head dim).
SMALL_GRID_JOINT_KV = {("hopper", 256): Tile(64, 32, 8, 1)}


def backward_config(cfg: AttnConfig, family: str, head_dim: int, max_k: int, heads: int,
                    device) -> AttnConfig:  # fmt: skip
    """``cfg`` for one backward call of ``heads`` (batch x KV heads) x ``max_k`` keys: the joint
    dK/dV kernel with SMALL_GRID_JOINT_KV's tile where ``cfg`` splits dK and dV and the split's
    grid is smaller than ``device``'s compute units; ``cfg`` otherwise (also whenever
    ATTNFORGE_KERNELS_CONFIG names bwd_kv or split_kv)."""
    if not cfg.split_kv or _names_kv(os.environ.get(OVERRIDE_ENV)):
        return cfg
    tile = SMALL_GRID_JOINT_KV.get((family, padded_head_dim(head_dim)))
    if tile is None or -(-max_k // cfg.bwd_kv.block_n) * heads >= compute_units(device):
        return cfg
    return _joint(cfg, tile)


@functools.lru_cache(maxsize=64)
def _joint(cfg: AttnConfig, tile: Tile) -> AttnConfig:
    return replace(cfg, bwd_kv=tile, split_kv=False)


def short_kv_fwd(family: str, head_dim: int, max_k: int) -> Tile | None:
    """The SHORT_KV_FWD tile of this family and (unpadded) head dim when ``max_k`` keys fit its
    key block; None otherwise, where there is none, or when ATTNFORGE_KERNELS_CONFIG names a
    forward tile."""
    tile = SHORT_KV_FWD.get((family, padded_head_dim(head_dim)))
    if tile is None or max_k > tile.block_n or _env_names_fwd():
        return None
    return tile


def head_dim_fwd(family: str, head_dim: int) -> Tile | None:
    """The HEAD_DIM_FWD tile of this family and unpadded head dim; None where there is none or
    ATTNFORGE_KERNELS_CONFIG names a forward tile."""
    tile = HEAD_DIM_FWD.get((family, head_dim))
    if tile is None or _env_names_fwd():
        return None
    return tile


def small_grid_fwd(cfg: AttnConfig, family: str, head_dim: int, rows: int, heads: int,
                   units: int, causal: bool = False) -> Tile | None:  # fmt: skip
    """The forward tile for a grid of ``heads`` (batch x query heads) times ``rows`` query rows
    (the longest sequence) on ``units`` compute units, when it differs from ``cfg.fwd``: the
    SMALL_GRID_FWD tile where the default tile leaves fewer than SMALL_GRID_WAVES programs per
    unit (SMALL_GRID_FULL_FWD's where it has a row and the call is not ``causal``); None
    otherwise (and whenever ATTNFORGE_KERNELS_CONFIG names a forward tile)."""
    key = (family, padded_head_dim(head_dim))
    tile = SMALL_GRID_FWD.get(key)
    if not causal:
        tile = SMALL_GRID_FULL_FWD.get(key, tile)
    if tile is None or units <= 0 or _env_names_fwd():
        return None
    programs = -(-rows // cfg.fwd.block_m) * heads
    return tile if programs < SMALL_GRID_WAVES * units else None


def forward_config(cfg: AttnConfig, family: str, head_dim: int, max_q: int, max_k: int,
                   heads: int, device, causal: bool = False) -> AttnConfig:  # fmt: skip
    """``cfg`` with the forward tile of one call: SHORT_KV_FWD's where the longest key sequence
    fits its key block, else HEAD_DIM_FWD's, else SMALL_GRID_FWD's for a grid of ``heads``
    (batch x query heads) x ``max_q`` rows too small for ``device`` (``causal``: the call's key
    ranges end at the diagonal), else cfg's own (also whenever ATTNFORGE_KERNELS_CONFIG names a
    forward tile)."""
    if _env_names_fwd():
        return cfg
    tile = SHORT_KV_FWD.get((family, padded_head_dim(head_dim)))
    if tile is None or max_k > tile.block_n:
        tile = HEAD_DIM_FWD.get((family, head_dim))
    if tile is None:
        tile = small_grid_fwd(cfg, family, head_dim, max_q, heads, compute_units(device), causal)
        if tile is not None:
            # The Triton forward's tile only: where the Gluon forward runs (Hopper d=128 from
            # GLUON_MIN_SEQ), it stays on, as it measured 1.15-1.23x the small tile there.
            return with_triton_fwd(cfg, tile)
    return cfg if tile is None else with_fwd(cfg, tile)


# Tiles for newer Tritons. Triton 3.7's, 3.8's and 3.9's AMD backends keep more values live than
# 3.6's: some tiles above spill there (`python -m attnforge_kernels.aot`, 2026-11-26; gfx1151: 3.7
# the d=128 dropout forward, 72 VGPRs; 3.8 the dropout forward, 40/57 at d=64/128, the d=64 dropout
# dQ 6 and the d=128 paged prefill 14; 3.9 also the plain forward, 31/78, and the d=64 dQ 48. gfx942
# and gfx90a: 3.7 the d=128 dK/dV, 4 and 1). A row replaces them on one Triton line, for (family, padded head dim);
# Triton 3.6 (the dev extra's and the cpu stack's) and lines without rows keep the tiles above.
# Spill-free and at no lower occupancy than 3.6's figures where measured (docs/kernels.md, "On
# every Triton a stack ships"); compile-checked only, untimed on AMD hardware. Keys of a row:
# AttnConfig tile fields (fwd, bwd_kv, bwd_q), the same with ``dropout_`` before them (that tile
# where dropout is on, e.g. ``dropout_fwd``) and ``kv_prefill``
# (attnforge_kernels/device/decode.py).
_RDNA3 = ("rdna3", "rdna3.5")
NEWER_TRITON_TILES = {
    **{((3, 7), f, 128): {"fwd": Tile(32, 16, 4, 1, 2)} for f in _RDNA3},
    **{((3, 7), f, 128): {"bwd_kv": Tile(16, 64, 4, 1, 1)} for f in ("cdna2", "cdna3")},
    **{
        ((3, 8), f, 64): {"fwd": Tile(128, 32, 8, 1, 2), "bwd_q": Tile(32, 16, 4, 1, 1)}
        for f in _RDNA3
    },
    # 3.9: the d=64 dropout dQ spills 2 VGPRs with 4 warps; 8 do not. The d=64 forward keeps the
    # 64x64 tile's area (8 warps), so SMALL_GRID_FWD's 32x64 tile stays the smaller one.
    **{
        ((3, 9), f, 64): {"fwd": Tile(128, 32, 8, 1, 2), "bwd_q": Tile(32, 16, 8, 1, 1)}
        for f in _RDNA3
    },
    **{
        (line, f, 128): {"fwd": Tile(32, 16, 4, 1, 2), "kv_prefill": Tile(32, 32, 4, 1, 2)}
        for line in ((3, 8), (3, 9))
        for f in _RDNA3
    },
    # 3.9 keeps the Philox dropout state live beside the d=128 forward's 128x32 tile on CDNA3/4:
    # 2 (gfx942) and 3 (gfx950) VGPRs spilled at the 256-VGPR cap of waves_per_eu=2; the plain
    # forward does not spill. The dropout forward alone gets the same tile over 8 waves (188/187
    # VGPRs, no spill, the same 2 waves per SIMD; 128x16 with 4 waves also fits, 204/200).
    **{((3, 9), f, 128): {"dropout_fwd": Tile(128, 32, 8, 1, 2)} for f in ("cdna3", "cdna4")},
    ((3, 8), "cdna2", 128): {"dropout_bwd_kv": Tile(16, 64, 4, 1, 1)},
    # 3.7.1 (`attnforge_kernels.aot --all`, 2026-12-04): gfx950's d=128 dropout dK/dV kernel (32x64
    # w4: 3 VGPRs spilled; 16x64: 192, none, 2 waves where it had 1), and on sm80 the d=64 dK/dV
    # kernel (16x32 w4 s2: 8 bytes of ptxas spill stores; one stage: none, 128 registers, the same
    # occupancy) and the d=128 paged prefill (64x64 w8 s2: 8 bytes; one stage: none, 172, the same).
    ((3, 7), "cdna4", 128): {"dropout_bwd_kv": Tile(16, 64, 4, 1, 1)},
    ((3, 7), "ampere", 64): {"bwd_kv": Tile(16, 32, 4, 1)},
    ((3, 7), "ampere", 128): {"kv_prefill": Tile(64, 64, 8, 1)},
}
# 3.8 spills the dropout dK/dV kernel on gfx1150 at d=64 (16x32 w8: 256 VGPRs, 2 spilled; gfx1151,
# the same family with the larger register file, 229 and none) and on gfx90a at d=128 (32x64 w4,
# 9 spilled; the row above). 16x16 w8 there: gfx1150 249 VGPRs, gfx1151 228 at the same 6 waves;
# 3.7's 16x64 CDNA tile on gfx90a: 206 VGPRs, 2 waves where the spilling tile had 1 (`python -m
# attnforge_kernels.aot --all` on 3.8.0, 2026-12-04).
NEWER_TRITON_TILES[(3, 8), "rdna3.5", 64] = {
    **NEWER_TRITON_TILES[(3, 8), "rdna3.5", 64],
    "dropout_bwd_kv": Tile(16, 16, 8, 1, 1),
}


def triton_release(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of a Triton version, by default the one in use: 3.8.0+rocm10.1.0 -> (3, 8)."""
    if version is None:
        import triton

        version = triton.__version__
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def newer_triton_tiles(family: str, head_dim: int, release: tuple[int, int] | None = None) -> dict:
    """The NEWER_TRITON_TILES row for a family and (padded) head dim on this Triton line, or {}."""
    release = triton_release() if release is None else release
    return NEWER_TRITON_TILES.get((release, family, head_dim), {})


# A JSON config override for one-off experiments and benchmarks (``override``).
OVERRIDE_ENV = "ATTNFORGE_KERNELS_CONFIG"


@contextmanager
def overridden(spec: str | None):
    """ATTNFORGE_KERNELS_CONFIG set to ``spec`` (unset for None) inside the block, restored
    after: a benchmark's way to time a config override in its own process."""
    old = os.environ.get(OVERRIDE_ENV)
    if spec is None:
        os.environ.pop(OVERRIDE_ENV, None)
    else:
        os.environ[OVERRIDE_ENV] = spec
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(OVERRIDE_ENV, None)
        else:
            os.environ[OVERRIDE_ENV] = old


def _env_names_fwd() -> bool:
    return _names_fwd(os.environ.get(OVERRIDE_ENV))


@functools.lru_cache(maxsize=16)
def _names_kv(spec: str | None) -> bool:
    """Whether an override names the dK/dV tile or split (cached, as ``_names_fwd``)."""
    return bool(spec) and bool({"bwd_kv", "split_kv"} & json.loads(spec).keys())


@functools.lru_cache(maxsize=16)
def _names_fwd(spec: str | None) -> bool:
    """Whether an override names a forward tile (cached: the entry points ask on every call)."""
    return bool(spec) and "fwd" in json.loads(spec)


@functools.lru_cache(maxsize=256)
def with_fwd(cfg: AttnConfig, tile: Tile) -> AttnConfig:
    """``cfg`` running the Triton forward with ``tile`` (no Gluon forward); cached per pair."""
    return replace(cfg, fwd=tile, gluon_fwd=False)


@functools.lru_cache(maxsize=256)
def with_triton_fwd(cfg: AttnConfig, tile: Tile) -> AttnConfig:
    """``cfg`` with ``tile`` for the Triton forward, the Gluon forward's choice unchanged."""
    return replace(cfg, fwd=tile)


def config_for(family: str, head_dim: int, dropout: bool = False) -> AttnConfig:
    """The default config of a family for a (padded) head dimension; no device needed.
    ``dropout``: the tiles of the dropout kernels where they differ (the backward's, and on some
    Triton lines the forward's)."""
    return _config_for(family, padded_head_dim(head_dim), dropout,
                       os.environ.get(OVERRIDE_ENV))  # fmt: skip


@functools.lru_cache(maxsize=256)
def _config_for(family: str, d: int, dropout: bool, spec: str | None) -> AttnConfig:
    """config_for, cached: it runs on every call of the entry points (AttnConfig is frozen)."""
    if family in ("rdna3", "rdna3.5", "rdna4"):
        cfg = _rdna(d, family)
    elif family in ("cdna2", "cdna3", "cdna4"):
        cfg = _cdna(d, family)
    elif family == "hopper":
        cfg = _hopper(d)
    elif family in ("ampere", "nvidia"):
        cfg = _ampere(d)
    elif family == "interpreter":
        cfg = _interpreter(d)
    else:
        raise ValueError(f"unknown family {family!r}; valid: {', '.join(FAMILIES)}")
    newer = newer_triton_tiles(family, d) if family != "interpreter" else {}
    cfg = replace(cfg, **{k: t for k, t in newer.items() if k in TILE_KEYS})
    if dropout:
        group = "ampere" if family == "nvidia" else family
        cfg = replace(cfg, **_DROPOUT_TILES.get((group, d), {}))
        cfg = replace(
            cfg, **{k: newer[f"dropout_{k}"] for k in TILE_KEYS if f"dropout_{k}" in newer}
        )
    return override(cfg, spec)


def tile_of(t) -> Tile:
    """A tile of a JSON override: ``[block_m, block_n, num_warps, num_stages(, waves_per_eu)]``
    or an object with Tile's field names (its ``no_tma`` a tile of either form, or null)."""
    try:
        if isinstance(t, dict):
            stand_in = t.get("no_tma")
            return Tile(**{**t, "no_tma": tile_of(stand_in) if stand_in is not None else None})
        return Tile(*t)
    except TypeError as e:
        raise ValueError(
            f"a tile is [block_m, block_n, num_warps, num_stages(, waves_per_eu)] or an object "
            f"with Tile's fields, got {t!r}: {e}"
        ) from None


def _waves(key: str, value) -> tuple[float, float]:
    """An override's ``[low, high]`` window of programs per compute unit."""
    try:
        low, high = (float(x) for x in value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{key} is [low, high], programs per compute unit, got {value!r}"
        ) from None
    if not 0 <= low < high:
        raise ValueError(f"{key} needs 0 <= low < high, got [{low}, {high}]")
    return low, high


def override(cfg: AttnConfig, spec: str | None) -> AttnConfig:
    """Apply a JSON override such as ``{"fwd": [128, 64, 8, 3], "atomic_dq": true}``.

    Tiles are ``[block_m, block_n, num_warps, num_stages(, waves_per_eu)]`` or objects with
    Tile's field names; keys fwd, bwd_kv, bwd_q, atomic_dq, reload, gluon_fwd, gluon_bwd,
    gluon_fwd_min_seq, gluon_fwd_causal_min_seq, gluon_bwd_min_seq (0 or more), short_kv,
    masked_last, paired_kv, across_heads, paired_waves and across_waves ([low, high] programs per
    compute unit), split_kv (not with atomic_dq or chunk_kv), chunk_kv, chunk_q, chunk_fwd
    (head-dim chunk: 0 or a power of two >= 16, launched at most as wide as the padded head dim,
    ``flash.head_chunk``; chunk_fwd not with a forward tile's TMA), and ``tma``: true/false for
    every tile or a list of the tiles (``["bwd_kv", "bwd_q"]``) that use TMA, the others not.
    Set through ``ATTNFORGE_KERNELS_CONFIG`` for one-off experiments.
    """
    if not spec:
        return cfg
    data = json.loads(spec)
    changes = {}
    for key in TILE_KEYS:
        if key in data:
            changes[key] = tile_of(data[key])
    if "tma" in data:
        on = data["tma"]
        for key in TILE_KEYS:
            use = key in on if isinstance(on, list) else bool(on)
            changes[key] = replace(changes.get(key, getattr(cfg, key)), tma=use)
    for key in (
        "atomic_dq",
        "reload",
        "gluon_fwd",
        "gluon_bwd",
        "short_kv",
        "split_kv",
        "masked_last",
        "paired_kv",
        "across_heads",
    ):
        if key in data:
            changes[key] = bool(data[key])
    for key in ("gluon_fwd_min_seq", "gluon_fwd_causal_min_seq", "gluon_bwd_min_seq"):
        if key in data:
            n = int(data[key])
            if n < 0:
                raise ValueError(f"{key} must be 0 or more, got {n}")
            changes[key] = n
    for key in ("paired_waves", "across_waves"):
        if key in data:
            changes[key] = _waves(key, data[key])
    for key in ("chunk_kv", "chunk_q", "chunk_fwd"):
        if key in data:
            n = int(data[key])
            if n and (n < 16 or n & (n - 1)):
                raise ValueError(f"{key} must be 0 or a power of two >= 16, got {n}")
            changes[key] = n
    out = replace(cfg, **changes)
    if out.split_kv and (out.atomic_dq or out.chunk_kv):
        raise ValueError("split_kv runs without atomic_dq and chunk_kv")
    if out.chunk_fwd and out.fwd.tma:
        raise ValueError("chunk_fwd runs without the forward tile's tma")
    return out


# recipes/arches.yaml in a source tree (images carry its JSON rendering: contract/arches.py).
ARCHES_YAML = Path(__file__).resolve().parents[2] / "recipes" / "arches.yaml"
# A family the facts give that has no config of its own: RDNA1/2 have no WMMA, and the rdna3
# config (wave32, small tiles) is the closest.
CONFIG_FAMILY = {"rdna2": "rdna3"}
# An AMD arch the facts do not know at all.
UNKNOWN_AMD_FAMILY = "cdna3"


def read_arches_yaml(path: Path = ARCHES_YAML) -> arches.ArchFacts:
    """The facts of an arches.yaml (PyYAML is imported here: a source tree on a host)."""
    try:
        import yaml
    except ImportError:
        raise RuntimeError(
            f"reading {path} needs PyYAML (pip install pyyaml); or set ${arches.ENV} to its JSON "
            "rendering, as the images carry it"
        ) from None
    with open(path, encoding="utf-8") as f:
        return arches.from_mapping(yaml.safe_load(f))


@functools.lru_cache(maxsize=1)
def arch_facts() -> arches.ArchFacts:
    """recipes/arches.yaml's facts: the rendering an image carries, else the source tree's YAML."""
    facts = arches.load()
    if facts is not None:
        return facts
    if not ARCHES_YAML.is_file():
        raise RuntimeError(
            f"no arch facts: neither {arches.rendered_path()} (the images carry it) nor "
            f"{ARCHES_YAML} (a source tree) exists"
        )
    return read_arches_yaml()


def amd_family(gfx: str, facts: arches.ArchFacts | None = None) -> str:
    """Config family of an AMD target id (``gfx1151``, ``gfx942:sramecc+:xnack-``), from
    recipes/arches.yaml (the arch's entry or its neighbour's)."""
    family = (facts or arch_facts()).family(gfx)
    if family is None:
        return UNKNOWN_AMD_FAMILY
    return CONFIG_FAMILY.get(family, family)


def _index(device) -> int:
    import torch

    if device is None:
        return 0
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def device_family(device=None) -> str:
    """Family of the current torch device (``interpreter`` under TRITON_INTERPRET=1)."""
    if INTERPRET:
        return "interpreter"
    return _family_of(_index(device))


def compute_units(device=None) -> int:
    """SMs (NVIDIA) or CUs (AMD) of a device; 0 under the interpreter."""
    if INTERPRET:
        return 0
    return _units_of(_index(device))


def memory_gbs(device=None) -> float:
    """Peak memory bandwidth of a device in GB/s, from its memory clock and bus width (what
    tells an H200, 4.8 TB/s, from an H100, 3.35, both 132 SMs); 0.0 where the driver does not
    say, and under the interpreter."""
    if INTERPRET:
        return 0.0
    return _gbs_of(_index(device))


@functools.lru_cache(maxsize=64)
def _gbs_of(index: int) -> float:
    import torch

    props = torch.cuda.get_device_properties(index)
    khz = getattr(props, "memory_clock_rate", 0) or 0
    bits = getattr(props, "memory_bus_width", 0) or 0
    return 2.0 * khz * 1e3 * bits / 8 / 1e9  # double data rate


@functools.lru_cache(maxsize=64)
def _units_of(index: int) -> int:
    import torch

    return int(torch.cuda.get_device_properties(index).multi_processor_count)


@functools.lru_cache(maxsize=64)
def _family_of(index: int) -> str:
    """device_family of a device index, cached: it runs on every call of the entry points."""
    import torch

    props = torch.cuda.get_device_properties(index)
    if getattr(torch.version, "hip", None):
        return amd_family(getattr(props, "gcnArchName", ""))
    major = props.major
    if major == 9:
        return "hopper"
    if major == 8:
        return "ampere"
    return "nvidia"


def is_hip() -> bool:
    import torch

    return bool(getattr(torch.version, "hip", None)) and not INTERPRET


# tail_split: the most key parts a tile of the last wave is cut into, and the fewest key blocks
# a part runs.
TAIL_SPLIT_MAX = 8
TAIL_SPLIT_MIN_BLOCKS = 4


def merge_tile(tile: Tile) -> Tile:
    """The launch shape of ``attn_fwd_merge`` after a split forward of tile ``tile``: its rows on
    8 warps (block_n unused; with 4, a 128 x 128 fp32 tile spilled 80 bytes at Hopper's d=128)."""
    return Tile(tile.block_m, 0, 8, 1)


def tail_split(tile: Tile, blocks: int, heads: int, key_blocks: int, units: int):
    """(SPLIT, split heads) for a forward grid of ``blocks`` x ``heads`` (batch x heads) equal
    programs (one key range a row) of ``key_blocks`` key blocks each on ``units`` SMs/CUs, else
    None. A grid of several waves whose last wave is partial ends with most SMs idle while its
    last programs run. Cutting the programs of the last heads that hold that wave's tiles into
    SPLIT parts of the keys each (merged after: flash.py ``_tail_order``, ``attn_fwd_merge``)
    spreads that work over the idle SMs. Only for a tile that says how many of its programs an
    SM holds (``Tile.per_sm``)."""
    slots = units * tile.per_sm
    tiles = blocks * heads
    if not slots or tiles <= slots or not tiles % slots:
        return None
    split_heads = -(-(tiles % slots) // blocks)
    parts = min(
        slots // (split_heads * blocks), TAIL_SPLIT_MAX, key_blocks // TAIL_SPLIT_MIN_BLOCKS
    )
    if parts < 2 or split_heads >= heads:
        return None
    return parts, split_heads
