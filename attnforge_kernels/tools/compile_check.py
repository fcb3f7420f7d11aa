"""Ahead-of-time compile check: build the kernels for every arch in recipes/arches.yaml on the CPU.

    python -m attnforge_kernels.aot --arch gfx1151 | --all
                                    [--head-dims 64,128 | --all-head-dims] [--json] [--over-2gib]
                                    [--cache-dir DIR | --no-cache] [--kernel NAME ...]

For each arch, head dim and kernel (forward; backward delta, dK/dV and dQ; the KV-cache decode,
paged prefill and split-KV combine) it compiles the family's default config with Triton's HIP
or CUDA target and reports VGPRs/registers, SGPRs, spills, scratch, LDS bytes, occupancy and the
matrix instructions in the ISA. Exit status 1 when a default config spills registers to memory
(VGPR spills, scratch, ptxas spill stores) or needs more LDS than the arch allows; SGPRs
spilled into VGPR lanes cost no memory traffic and are reported, not failed. Spills listed in
``configs.ACCEPTED_SPILLS`` (kept because they measured faster) are reported as accepted and do
not fail either, unless they grew past the recorded size.

Each compile's measurements are cached per kernel (``CompileCache.key``): by the kernel's own
source and the jit functions it calls (what Triton's ``cache_key`` hashes, less line numbers:
attnforge_kernels/tools/compile_key.py), the Triton version, the arch and its arches.yaml entry, and
the signature, constexprs and options of the compile. An unchanged re-run reads them back in seconds
instead of compiling for minutes; editing host code or moving a file compiles nothing again, and
editing one kernel compiles that kernel (and the kernels that call an edited jit function). No
key holds a path, so another clone or venv finds the same entries. The cache lives in
``--cache-dir``, else ``$ATTNFORGE_BUILD_DIR/aot-cache``, else ``$XDG_CACHE_HOME/attnforge/aot``
(``~/.cache/attnforge/aot``); ``--no-cache`` compiles all.
Progress (one line per kernel, with its time or "cached") goes to stderr.

AMD kernels are specialized like the HIP JIT specializes them for tensors of at most 2 GiB
(``tt.pointer_range = 32`` on the pointers: buffer loads with 32-bit offsets); ``--over-2gib``
compiles the 64-bit-address variant the JIT builds for larger tensors.

Occupancy (waves per SIMD; warps per SM sub-partition on NVIDIA) is the smaller of a register
limit and an LDS limit:

* AMD registers: ``min(max_waves, floor(vgprs_per_simd / roundup(vgprs, granule)))``, with, per
  LLVM's AMDGPU target (AMDGPUBaseInfo.cpp getTotalNumVGPRs / getVGPRAllocGranule /
  getMaxWavesPerEU): CDNA (gfx90a/gfx942/gfx950) 512 unified VGPR+AGPR per lane (the
  metadata's ``.vgpr_count`` already counts both), granule 8, 8 waves; RDNA3/3.5/4 wave32 1536 VGPRs with granule 24 on parts with the full register file
  and 1024 / granule 16 otherwise, 16 waves: recipes/arches.yaml's ``registers`` of each arch.
* AMD LDS: ``floor(lds_pool / lds_per_workgroup) * waves_per_workgroup / 4`` where the pool is
  what the 4 SIMDs that share it have: one CDNA CU (``lds_bytes``: 64 KiB, 160 KiB on gfx950) or
  one RDNA WGP in WGP mode (2 x ``lds_bytes`` = 128 KiB).
* NVIDIA: 65536 registers per SM allocated per warp in units of 256, 64 warps per SM, shared
  memory 228 KiB (sm90) / 164 KiB (sm80) per SM, whole blocks; reported per SM sub-partition (/4).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .compile_key import source_key, stable_repr

DEFAULT_HEAD_DIMS = (64, 128)
ALL_HEAD_DIMS = (40, 64, 72, 80, 96, 128, 160, 256)
REPO = Path(__file__).resolve().parents[2]
ARCHES_YAML = REPO / "recipes" / "arches.yaml"


@dataclass
class KernelReport:
    arch: str
    family: str
    head_dim: int
    kernel: str
    tile: str
    vgprs: int = 0
    agprs: int = 0
    sgprs: int = 0
    spills: int = 0  # registers spilled to memory (AMD: VGPR spills; NVIDIA: ptxas spill bytes)
    sgpr_spills: int = 0  # AMD SGPRs spilled into VGPR lanes (v_writelane): no memory traffic
    scratch_bytes: int = 0
    lds_bytes: int = 0
    occupancy: float = 0.0
    matrix_instrs: dict = field(default_factory=dict)
    # Floating-point fusion as compiled (configs.FP_FUSION) and the fused multiply-adds it gave
    # (AMD: v_fma*/v_fmac*/v_pk_fma* in the AMDGCN; NVIDIA: fma.rn in the PTX), so a report shows
    # the setting reached the code.
    fp_fusion: bool = True
    fmas: int = 0
    problems: list = field(default_factory=list)
    accepted: str = ""  # why a spill does not fail the check (configs.ACCEPTED_SPILLS)


def load_arches(path: Path = ARCHES_YAML) -> dict:
    """The ``arches:`` mapping of recipes/arches.yaml (read as the kernels read it: configs)."""
    from ..device.configs import read_arches_yaml

    return dict(read_arches_yaml(path).arches)


def _signature(fn, ptr_types: dict, constexprs: dict, pointer_range: bool = False):
    """Signature and divisibility attrs for a kernel, like the JIT would specialize them.

    ``pointer_range``: tensors whose storage is at most 2 GiB, which Triton's HIP JIT marks
    ``tt.pointer_range = 32`` (its "S" specialization, with ``AMDGCN_USE_BUFFER_OPS`` on, the
    default) so that loads become buffer loads with 32-bit offsets instead of 64-bit addresses.
    """
    sig, attrs = {}, {}
    ptr_attrs = [["tt.divisibility", 16]] + ([["tt.pointer_range", 32]] if pointer_range else [])
    floats = {"qk_scale", "cap_in", "cap_out", "sm_scale", "drop_scale"}
    # The kernels' tensor strides (all but the LSE's and the ALiBi slopes') arrive divided by
    # STRIDE_ALIGN where one of them is not a multiple of 16 (attnforge_kernels.device.flash.stride_align): the
    # quotients get no divisibility hint.
    divided = constexprs.get("STRIDE_ALIGN", 1) > 1
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ptr_types:
            sig[name] = ptr_types[name]
            attrs[(i,)] = list(ptr_attrs)
        elif name in floats:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            # Strides of contiguous BSHD tensors are multiples of 16 for the usual head counts.
            if re.match(r"^s[a-z]*_[bsh]$", name) and not name.startswith("sa_"):
                if not (divided and not name.startswith("sl_")):
                    attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


# The dropout and FP8 variants' extra arguments, None (a constexpr) where a variant is off, as the
# launcher passes them: the default kernels compile as they did before the variants existed.
_FWD_OFF = dict(
    Rng=None, drop_scale=None, SDMask=None, DescQ=None, DescK=None, DescV=None,
    HAS_DROPOUT=False, RETURN_SDMASK=False, IS_FP8=False, Part=None, PartL=None, SPLIT=0,
)  # fmt: skip
_BWD_OFF = dict(Rng=None, drop_scale=None, HAS_DROPOUT=False)
_DROPOUT = dict(Rng="*i64", drop_scale="fp32")


def _variants(dropout_base, base, fp8: str | None, hip: bool):
    """The dropout variant of each kernel of ``dropout_base`` (the default kernels with the
    dropout config's tiles) as ``<name>_dropout`` and, where the arch multiplies ``fp8``
    natively, the FP8 forward of ``base`` (``fwd_fp8``: e4m3 q/k/v, bf16 output; and
    ``fwd_fp8_varlen``, its varlen form) with the tile's pointer loads, whose head-dim chunk is
    the launcher's (``flash.head_chunk``)."""
    from ..device.configs import pointer_tile
    from ..device.flash import head_chunk

    out = []
    for name, fn, ptrs, consts, tile in dropout_base:
        c = {k: v for k, v in consts.items() if k not in _DROPOUT}
        out.append((f"{name}_dropout", fn, dict(ptrs, Rng="*i64"), dict(c, HAS_DROPOUT=True), tile))
    if fp8:
        name, fn, ptrs, consts, tile = base[0]
        c = {k: v for k, v in consts.items() if k not in ("DescQ", "DescK", "DescV")}
        # TMA streams bf16/fp16 only (flash_attn.tma_ok): FP8 runs the tile's pointer stand-in.
        tile = pointer_tile(tile)
        c.update(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, USE_TMA=False)
        c["D_CHUNK"] = head_chunk(c["D_CHUNK"], c["BLOCK_D"], True, hip)
        p8 = dict(ptrs, Q=f"*{fp8}", K=f"*{fp8}", V=f"*{fp8}", DescQ="*fp32", DescK="*fp32",
                  DescV="*fp32")  # fmt: skip
        out.append(("fwd_fp8", fn, p8, dict(c, IS_FP8=True), tile))
        # flash_attn_varlen_fp8_func and its qkv-packed form: the same kernel over cu_seqlens.
        out.append(("fwd_fp8_varlen", fn, p8, dict(c, IS_FP8=True, IS_VARLEN=True), tile))
    return out


def _switched(jobs, on: bool, flag: str, suffix: str):
    """The jobs that take the constexpr ``flag``, compiled with it set, as ``<name><suffix>``,
    where the config launches them so (``on``): the causal dK/dV launches with paired key blocks
    (``configs.AttnConfig.paired_kv``, flash.py ``PAIRED``: ``_paired``) and the causal launches
    ordered across heads (``across_heads``, ``ACROSS_HEADS``: ``_across``). Either runs only on
    grids of a few programs per compute unit; the others run the job as it is."""
    if not on:
        return []
    return [(f"{name}{suffix}", fn, ptrs, dict(consts, **{flag: True}), tile)
            for name, fn, ptrs, consts, tile in jobs if flag in consts]  # fmt: skip


# The suffix of an ordered kernel's name (``_switched``): the same code on a grid of swapped
# dimensions, held to its kernel's accepted spill (``judge``).
ORDERED = "_across"


def accepted_as(kernel: str) -> str:
    """The kernel name whose ``configs.ACCEPTED_SPILLS`` entry covers ``kernel``."""
    return kernel.removesuffix(ORDERED)


def _small_grid(base, family: str, head_dim: int):
    """The forward with the family's small-grid tile (``configs.SMALL_GRID_FWD``), as
    ``fwd_small``, where it has one."""
    from ..device.configs import SMALL_GRID_FWD, padded_head_dim

    tile = SMALL_GRID_FWD.get((family, padded_head_dim(head_dim)))
    if tile is None:
        return []
    name, fn, ptrs, consts, _ = base[0]
    c = dict(consts, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, USE_TMA=tile.tma)
    return [("fwd_small", fn, ptrs, c, tile)]


def _small_grid_kv(base, family: str, head_dim: int):
    """The joint dK/dV kernel with the family's small-grid tile (``configs.SMALL_GRID_JOINT_KV``),
    as ``bwd_dkdv_small``, where the default config splits dK and dV and the table has one."""
    from ..device.configs import SMALL_GRID_JOINT_KV, padded_head_dim

    tile = SMALL_GRID_JOINT_KV.get((family, padded_head_dim(head_dim)))
    split = [job for job in base if job[0] == "bwd_dv"]
    if tile is None or not split:
        return []
    _, fn, ptrs, consts, _ = split[0]
    c = dict(consts, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, USE_TMA=tile.tma, PART=0)
    return [("bwd_dkdv_small", fn, ptrs, c, tile)]


def _tail_split(base, cfg):
    """The forward as the launcher runs it with its last tiles split along the keys
    (``configs.tail_split``: non-causal, a tile that says ``per_sm``), as ``fwd_split``, and its
    merge kernel, as ``fwd_merge``."""
    from ..device import flash
    from ..device.configs import merge_tile

    if not cfg.fwd.per_sm:
        return []
    name, fn, ptrs, consts, tile = base[0]
    c = {k: v for k, v in consts.items() if k not in ("Part", "PartL")}
    c.update(HAS_RIGHT=False, REVERSE=False, SPLIT=2)
    p = dict(ptrs, Part="*fp32", PartL="*fp32")
    merge = dict(HEAD_DIM=c["HEAD_DIM"], BLOCK_D=c["BLOCK_D"], BLOCK_M=c["BLOCK_M"], SPLIT=2,
                 STRIDE_ALIGN=c["STRIDE_ALIGN"])  # fmt: skip
    mp = dict(Out=ptrs["Out"], LSE="*fp32", Part="*fp32", PartL="*fp32")
    return [("fwd_split", fn, p, c, tile),
            ("fwd_merge", flash.attn_fwd_merge, mp, merge, merge_tile(tile))]  # fmt: skip


def _head_dim_fwd(base, family: str, head_dim: int):
    """The forward with the family's tile for this exact head dim (``configs.HEAD_DIM_FWD``), as
    ``fwd_hd``, where it has one."""
    from ..device.configs import HEAD_DIM_FWD

    tile = HEAD_DIM_FWD.get((family, head_dim))
    if tile is None:
        return []
    name, fn, ptrs, consts, _ = base[0]
    c = dict(consts, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, USE_TMA=tile.tma)
    return [("fwd_hd", fn, ptrs, c, tile)]


def _short_kv(base, family: str, head_dim: int):
    """The forward's single-block path with the family's short-key tile
    (``configs.SHORT_KV_FWD``), as ``fwd_short``, where it has one."""
    from ..device.configs import SHORT_KV_FWD, padded_head_dim

    tile = SHORT_KV_FWD.get((family, padded_head_dim(head_dim)))
    if tile is None:
        return []
    name, fn, ptrs, consts, _ = base[0]
    c = dict(consts, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, USE_TMA=tile.tma, SHORT_KV=True)
    return [("fwd_short", fn, ptrs, c, tile)]


def _kernels(head_dim: int, cfg, dtype: str = "bf16"):
    """(name, jit fn, pointer types, constexprs, tile) for the fwd and the three bwd kernels."""
    from ..device.configs import padded_head_dim

    flags = dict(
        HEAD_DIM=head_dim,
        BLOCK_D=padded_head_dim(head_dim),
        IS_VARLEN=False,
        HAS_LEFT=False,
        HAS_RIGHT=True,
        HAS_SOFTCAP=False,
        HAS_ALIBI=False,
    )
    return [
        _fwd_job(head_dim, cfg, flags, f"*{dtype}"),
        *_bwd_jobs(head_dim, cfg, flags, f"*{dtype}"),
    ]


def _fwd_job(head_dim: int, cfg, flags: dict, p: str) -> Job:
    """The forward of ``_kernels`` (``p``: the pointer type of q, k, v and out)."""
    from ..device import flash

    ptrs = dict(Q=p, K=p, V=p, Out=p, LSE="*fp32", CuQ="*i32", CuK="*i32", Slopes="*fp32")
    consts = dict(
        flags,
        BLOCK_M=cfg.fwd.block_m,
        BLOCK_N=cfg.fwd.block_n,
        REVERSE=True,
        USE_TMA=cfg.fwd.tma,
        # As the launcher passes contiguous tensors of this head dim (d=40: 8).
        STRIDE_ALIGN=flash.stride_align(head_dim),
        SHORT_KV=False,  # a constexpr: left out, it would compile as a runtime argument
        POS_SCALE=True,  # as the launcher passes for every positive softmax scale
        ACROSS_HEADS=False,  # the launcher's choice by grid: ``_switched`` compiles the other
        D_CHUNK=flash.head_chunk(cfg.chunk_fwd, flags["BLOCK_D"]),
        **_FWD_OFF,
    )
    return ("fwd", flash.attn_fwd, ptrs, consts, cfg.fwd)


def _bwd_jobs(head_dim: int, cfg, flags: dict, p: str) -> list[Job]:
    """The dK/dV kernel and, unless dQ is accumulated by atomics in it, the dQ kernel."""
    from ..device import flash

    ptrs = dict(Q=p, K=p, V=p, DO=p, DK=p, DV=p, DQ="*fp32" if cfg.atomic_dq else p,
                LSE="*fp32", Delta="*fp32", CuQ="*i32", CuK="*i32", Slopes="*fp32")  # fmt: skip
    align = flash.stride_align(head_dim)  # as for the forward
    kv, q = cfg.bwd_kv, cfg.bwd_q
    # split_kv: the dV and the dK launches of the one kernel (its PART), each a kernel here.
    parts = (("bwd_dv", 1), ("bwd_dk", 2)) if cfg.split_kv else (("bwd_dkdv", 0),)
    out = [(
        name, flash.attn_bwd_dkdv, ptrs,
        dict(flags, BLOCK_M=kv.block_m, BLOCK_N=kv.block_n, ATOMIC_DQ=cfg.atomic_dq,
             RELOAD=cfg.reload, D_CHUNK=flash.head_chunk(cfg.chunk_kv, flags["BLOCK_D"]),
             USE_TMA=kv.tma, STRIDE_ALIGN=align,
             PART=part, MASKED_LAST=cfg.masked_last, PAIRED=False, ACROSS_HEADS=False,
             **_BWD_OFF),
        kv,
    ) for name, part in parts]  # fmt: skip
    if not cfg.atomic_dq:
        out.append((
            "bwd_dq", flash.attn_bwd_dq, dict(ptrs, Out=p),  # it also computes delta from O, dO
            dict(flags, BLOCK_M=q.block_m, BLOCK_N=q.block_n, REVERSE=True, RELOAD=cfg.reload,
                 D_CHUNK=flash.head_chunk(cfg.chunk_q, flags["BLOCK_D"]), USE_TMA=q.tma,
                 STRIDE_ALIGN=align, ACROSS_HEADS=False,
                 **_BWD_OFF),
            q,
        ))  # fmt: skip
    return out


def _gluon_kernels(head_dim: int, cfg):
    """The warp-specialised Gluon kernels (attnforge_kernels/device/flash_sm90.py) where the config
    uses them, causal as the other kernels are compiled (``HAS_RIGHT``). The forward (d=128): 128
    query rows over two consumer warpgroups (4 warps each, plus a producer warp) x 128 keys, 3
    stages. The dK/dV kernel (the head dims of ``configs.GLUON_BWD_TILES``): block_n keys over the
    two consumers x block_m streamed query rows."""
    from triton.experimental.gluon import language as gl

    from ..device import flash_sm90 as f
    from ..device.configs import GLUON_BWD_TILES, Tile

    def consts(block_m: int, block_n: int, stages: int, layouts) -> dict:
        q_layout, kv_layout = layouts
        return dict(
            HEAD_DIM=head_dim,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            STAGES=stages,
            CAUSAL=True,
            q_layout=q_layout,
            kv_layout=kv_layout,
            CONSUMER_REGS=f.CONSUMER_REGS,
            ACROSS_HEADS=False,  # ``_switched`` compiles the other where the config launches it
        )

    p = "*bf16"
    out = []
    if cfg.gluon_fwd_at(head_dim):
        c = consts(f.BLOCK_M, f.BLOCK_N, f.STAGES, f.smem_layouts(gl.bfloat16))
        ptrs = dict(Q=p, K=p, V=p, Out=p, LSE="*fp32")
        out.append(("fwd_gluon", f.attn_fwd_sm90, ptrs, c, Tile(f.BLOCK_M, f.BLOCK_N, 4, f.STAGES)))
    if cfg.gluon_bwd_at(head_dim):
        block_m, block_n, stages = GLUON_BWD_TILES[head_dim]
        c = consts(block_m, block_n, stages, f.bwd_layouts(gl.bfloat16, head_dim))
        c["LOADER_REGS"] = f.gluon_bwd_loader_regs(head_dim, c["CAUSAL"])
        ptrs = dict(Q=p, K=p, V=p, DO=p, DK=p, DV=p, LSE="*fp32", Delta="*fp32")
        tile = Tile(block_m, block_n, 4, stages)
        out.append(("bwd_dkdv_gluon", f.attn_bwd_dkdv_sm90, ptrs, c, tile))
    return out


def _meta_int(asm: str, key: str) -> int:
    m = re.search(rf"\.{key}:\s+(\d+)", asm)
    return int(m.group(1)) if m else 0


def _amd_occupancy(arch: str, spec: dict, vgprs: int, agprs: int, lds: int, waves_per_wg: int):
    family = spec["family"]
    # arches.yaml's registers; on gfx90a+ the metadata's .vgpr_count is already the unified
    # VGPR+AGPR total (NumVGPRsForWavesPerEU in LLVM's metadata streamer).
    regs = spec["registers"]
    total, granule, max_waves = regs["vgprs"], regs["granule"], regs["max_waves"]
    used = vgprs
    if family.startswith("cdna"):
        pool = spec["lds_bytes"]
    else:
        pool = 2 * spec["lds_bytes"]
    used = max(granule, -(-used // granule) * granule)
    by_regs = min(max_waves, total // used)
    by_lds = max_waves if lds == 0 else (pool // lds) * waves_per_wg / 4
    return min(by_regs, by_lds)


def _compile_amd(
    arch: str, spec: dict, name, fn, ptrs, consts, tile, over_2gib: bool = False
) -> KernelReport:
    import triton
    from triton.backends.compiler import GPUTarget

    sig, attrs = _signature(fn, ptrs, consts, pointer_range=not over_2gib)
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    opts = tile.launch_options(hip=True)
    k = triton.compile(src, target=GPUTarget("hip", arch, spec["wave_size"]), options=opts)
    asm = k.asm["amdgcn"]
    r = KernelReport(arch, spec["family"], consts["HEAD_DIM"], name, _tile_str(tile))
    r.vgprs = _meta_int(asm, "vgpr_count")
    r.agprs = _meta_int(asm, "agpr_count")
    r.sgprs = _meta_int(asm, "sgpr_count")
    r.spills = _meta_int(asm, "vgpr_spill_count")
    r.sgpr_spills = _meta_int(asm, "sgpr_spill_count")
    r.scratch_bytes = _meta_int(asm, "private_segment_fixed_size")
    r.lds_bytes = max(_meta_int(asm, "group_segment_fixed_size"), int(k.metadata.shared))
    r.occupancy = _amd_occupancy(arch, spec, r.vgprs, r.agprs, r.lds_bytes, tile.num_warps)
    r.matrix_instrs = _count(asm, r"\b(v_wmma_\w+|v_mfma_\w+|v_smfmac_\w+)")
    r.fp_fusion = opts["enable_fp_fusion"]
    r.fmas = sum(_count(asm, r"\b(v_(?:pk_)?fmac?_\w+)").values())
    return r


def _ptxas(cc: int = 90) -> str:
    """The ptxas Triton itself assembles for ``cc`` with: Triton 3.9 emits PTX 9.x for sm90,
    which only its newer bundled ptxas (``ptxas-blackwell``) reads."""
    import triton

    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return get_ptxas(cc).path
    except (ImportError, AttributeError, RuntimeError):
        return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas")


def _compile_nvidia(arch: str, spec: dict, name, fn, ptrs, consts, tile) -> KernelReport:
    import triton
    from triton.backends.compiler import GPUTarget

    cc = int(arch.removeprefix("sm"))
    sig, attrs = _signature(fn, ptrs, consts)
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource

        src = GluonASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    else:
        src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    opts = tile.launch_options(hip=False)
    k = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=opts)
    ptx = k.asm["ptx"]
    r = KernelReport(arch, spec["family"], consts["HEAD_DIM"], name, _tile_str(tile))
    r.lds_bytes = int(k.metadata.shared)
    gpu = "sm_90a" if cc == 90 else f"sm_{cc}"
    # As Triton assembles it (backends/nvidia/compiler.py make_cubin): no fmad without fusion.
    fmad = [] if opts["enable_fp_fusion"] else ["--fmad=false"]
    with tempfile.TemporaryDirectory() as tmp:
        src_ptx = Path(tmp) / "k.ptx"
        src_ptx.write_text(ptx)
        res = subprocess.run(
            [_ptxas(cc), f"-arch={gpu}", "-v", *fmad, str(src_ptx), "-o", str(Path(tmp) / "k.o")],
            capture_output=True,
            text=True,
        )
    if res.returncode:  # no registers to read: a failure of the check, not 0 registers
        raise RuntimeError(f"ptxas: {' '.join(res.stderr.split())[:200]}")
    info = res.stderr
    m = re.search(r"Used (\d+) registers", info)
    r.vgprs = int(m.group(1)) if m else 0
    m = re.search(r"(\d+) bytes spill stores", info)
    r.spills = int(m.group(1)) if m else 0
    m = re.search(r"(\d+) bytes stack frame", info)
    r.scratch_bytes = int(m.group(1)) if m else 0
    regs_per_warp = max(256, -(-r.vgprs * 32 // 256) * 256)
    smem_sm = 233472 if cc >= 90 else 167936
    blocks = min(
        64 // tile.num_warps,
        65536 // (regs_per_warp * tile.num_warps),
        smem_sm // r.lds_bytes if r.lds_bytes else 64,
    )
    r.occupancy = blocks * tile.num_warps / 4
    r.matrix_instrs = _count(ptx, r"\b(wgmma\.mma_async\.[\w.]+|mma\.sync\.[\w.]+)")
    r.fp_fusion = opts["enable_fp_fusion"]
    r.fmas = sum(_count(ptx, r"\b(fma\.rn\.[\w.]+)").values())
    return r


def _count(text: str, pattern: str) -> dict:
    counts: dict[str, int] = {}
    for m in re.finditer(pattern, text):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


# The functions that compile a kernel and read its measurements: their source is in every cache
# key, so a change to what a result holds compiles again.
MEASURE = (_compile_amd, _amd_occupancy, _meta_int, _compile_nvidia, _ptxas, _count)


def _tile_str(t) -> str:
    s = f"{t.block_m}x{t.block_n} w{t.num_warps} s{t.num_stages}"
    s += f" wpe{t.waves_per_eu}" if t.waves_per_eu else ""
    s += f" r{t.maxnreg}" if t.maxnreg else ""
    return s + (" tma" if t.tma else "")


# One compile of the check: (name, jit fn, pointer types, constexprs, tile).
Job = tuple


def jobs_for(arch: str, spec: dict, head_dims, over_2gib: bool = False) -> list[tuple[int, Job]]:
    """(head dim, kernel) for every kernel of the family's default config on one arch."""
    from ..device.configs import config_for, for_tensors
    from ..device.decode import aot_kernels
    from ..device.flash import FP8_DOT

    found = []
    for d in head_dims:
        cfg = for_tensors(config_for(spec["family"], d), not over_2gib)
        base = _kernels(d, cfg)
        dcfg = for_tensors(config_for(spec["family"], d, dropout=True), not over_2gib)
        variants = _variants(
            _kernels(d, dcfg), base, FP8_DOT.get(spec["family"]), spec["vendor"] == "amd"
        )
        variants = (
            variants
            + _switched(base, cfg.paired_kv, "PAIRED", "_paired")
            + _switched(variants, dcfg.paired_kv, "PAIRED", "_paired")
            + _switched(base, cfg.across_heads, "ACROSS_HEADS", ORDERED)
        )
        variants += _small_grid(base, spec["family"], d)
        variants += _tail_split(base, cfg)
        variants += _small_grid_kv(base, spec["family"], d)
        variants += _head_dim_fwd(base, spec["family"], d)
        variants += _short_kv(base, spec["family"], d)
        # The KV-cache kernels (attnforge_kernels/device/decode.py: split-KV decode with its merge,
        # paged prefill, the cache update).
        gluon = _gluon_kernels(d, cfg) if spec["vendor"] == "nvidia" else []
        gluon += _switched(gluon, cfg.across_heads, "ACROSS_HEADS", ORDERED)
        found += [(d, job) for job in base + variants + aot_kernels(d, spec["family"]) + gluon]
    return found


class CompileCache:
    """Measurements of earlier compiles, one JSON file per key.

    The key is everything one compile's result depends on (``key``): the kernel's own source key
    (``compile_key.source_key``: its source and its jit callees', Triton's ``cache_key`` less
    line numbers), the Triton version, the arch and its arches.yaml entry, the signature,
    constexprs and launch options given to ``triton.compile``, the source of the functions
    here that compile and measure (``MEASURE``), and the environment variables Triton's own cache
    key holds that are set (``triton_env``: ``TRITON_DISABLE_LINE_INFO=1`` took gfx1151 d=64
    ``bwd_dkdv`` from 83 SGPRs to 82 on Triton 3.9; absent when none is set, so a plain
    environment's keys are what they were). Host code, other kernels and file moves are in
    no key, so they compile nothing again; nothing in it depends on where the repository or
    Triton is installed, so a fresh clone or venv reads the same entries. Only successful
    compiles are kept, so a failure is always tried again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._measure = None

    def measure_digest(self) -> str:
        """The digest of ``MEASURE``'s sources: a change to how a result is read is a new one."""
        if self._measure is None:
            texts = [inspect.getsource(f) for f in MEASURE]
            self._measure = hashlib.sha256("\0".join(texts).encode()).hexdigest()
        return self._measure

    def key(self, arch: str, spec: dict, d: int, job: Job, over_2gib: bool) -> str:
        import triton

        name, fn, ptrs, consts, tile = job
        amd = spec["vendor"] == "amd"
        sig, attrs = _signature(fn, ptrs, consts, pointer_range=amd and not over_2gib)
        doc = {
            "source": source_key(fn), "measure": self.measure_digest(),
            "triton": triton.__version__, "arch": arch, "spec": spec, "head_dim": d,
            "kernel": name, "fn": getattr(fn, "__name__", str(fn)), "signature": sig,
            "attrs": sorted((list(k), v) for k, v in attrs.items()),
            "consts": {k: stable_repr(v) for k, v in sorted(consts.items())},
            "options": tile.launch_options(hip=amd), "tile": _tile_str(tile),
            "over_2gib": over_2gib,
        }  # fmt: skip
        env = triton_env()
        if env:
            doc["triton_env"] = env
        text = json.dumps(doc, sort_keys=True, default=stable_repr)
        return hashlib.sha256(text.encode()).hexdigest()

    def get(self, key: str) -> KernelReport | None:
        try:
            return KernelReport(**json.loads((self.folder / f"{key}.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None  # absent, or written by another version of this file: compile again

    def put(self, key: str, report: KernelReport) -> None:
        # Written aside, then renamed: a reader never sees half a file (validate/ and
        # attnforge_kernels/ run in images without attnforge, so they keep their own copy of this
        # rule).
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f".{key}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(asdict(report)))
            os.replace(tmp, self.folder / f"{key}.json")
        except OSError:
            pass  # a cache that cannot be written costs time, not the result


def triton_env() -> dict[str, str]:
    """The environment variables set now that Triton's own compile cache keys on
    (``get_cache_invalidating_env_vars``, Triton 3.6-3.9: ``TRITON_DISABLE_LINE_INFO``,
    ``AMDGCN_USE_BUFFER_OPS``, ...), by name."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return dict(sorted(get_cache_invalidating_env_vars().items()))


def default_cache_dir(env=os.environ) -> Path:
    if env.get("ATTNFORGE_BUILD_DIR"):
        return Path(env["ATTNFORGE_BUILD_DIR"]) / "aot-cache"
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "attnforge" / "aot"


# progress(arch, head_dim, kernel, seconds or None when it came from the cache), after each one
Progress = Callable[[str, int, str, "float | None"], None]


def check_arch(
    arch: str, spec: dict, head_dims, over_2gib: bool = False,
    cache: CompileCache | None = None, progress: Progress | None = None,
    only: frozenset[str] = frozenset(),
) -> list[KernelReport]:  # fmt: skip
    """Compile every kernel of the family's default config for one arch (those named in
    ``only``, when it names any).

    AMD kernels are compiled as the HIP JIT specializes them for tensors of at most 2 GiB
    (buffer loads with 32-bit offsets); ``over_2gib`` compiles the 64-bit-address variant that
    the JIT builds for larger tensors instead.
    """
    os.environ.pop("TRITON_INTERPRET", None)
    reports = []
    for d, job in jobs_for(arch, spec, head_dims, over_2gib):
        name, fn, ptrs, consts, tile = job
        if only and name not in only:
            continue
        key = cache.key(arch, spec, d, job, over_2gib) if cache else None
        r = cache.get(key) if cache else None
        started = time.monotonic()
        if r is None:
            try:
                if spec["vendor"] == "amd":
                    r = _compile_amd(arch, spec, name, fn, ptrs, consts, tile, over_2gib)
                else:
                    r = _compile_nvidia(arch, spec, name, fn, ptrs, consts, tile)
                if cache:
                    cache.put(key, r)
            except Exception as e:  # a compile failure is a result, not a crash of the check
                r = KernelReport(arch, spec["family"], d, name, _tile_str(tile))
                r.problems.append(
                    f"compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                )
            seconds = time.monotonic() - started
        else:
            seconds = None
        if consts.get("D_CHUNK"):
            r.tile += f" c{consts['D_CHUNK']}"  # head-dim chunk of the contractions
        judge(r, spec["lds_bytes"])
        holds(r, tile)
        reports.append(r)
        if progress is not None:
            progress(arch, d, name, seconds)
    return reports


def judge(r: KernelReport, lds_limit: int, accepted=None) -> None:
    """Add ``r``'s spills and LDS overflow to its problems, or record why a spill is accepted.

    ``accepted`` defaults to ``configs.ACCEPTED_SPILLS``; an entry covers one arch, head dim,
    kernel and tile, up to the spills and scratch it records, and the kernel's ordered form
    (``accepted_as``).
    """
    from ..device.configs import ACCEPTED_SPILLS

    if r.spills or r.scratch_bytes:
        kernel = accepted_as(r.kernel)
        ok = next(
            (
                a
                for a in (ACCEPTED_SPILLS if accepted is None else accepted)
                if (a.arch, a.head_dim, a.kernel, a.tile) == (r.arch, r.head_dim, kernel, r.tile)
            ),
            None,
        )
        if ok is not None and r.spills <= ok.spills and r.scratch_bytes <= ok.scratch_bytes:
            r.accepted = ok.reason
        else:
            if r.spills:
                r.problems.append(f"{r.spills} spilled registers")
            else:  # SGPRs that found no free VGPR lane went to scratch memory
                r.problems.append(f"{r.scratch_bytes} bytes of scratch")
            if ok is not None:
                r.problems.append(
                    f"more than the accepted {ok.spills} spilled / {ok.scratch_bytes} bytes of "
                    "scratch (configs.ACCEPTED_SPILLS)"
                )
    if r.lds_bytes > lds_limit:
        r.problems.append(f"LDS {r.lds_bytes} > {lds_limit}")


def holds(r: KernelReport, tile) -> None:
    """Add to ``r``'s problems where its tile says more programs an SM/CU (``Tile.per_sm``, which
    the forward's last-wave split counts on) than the compile allows: occupancy (warps a
    scheduler or SIMD) x 4 / the tile's warps."""
    if tile.per_sm and r.occupancy and r.occupancy * 4 / tile.num_warps < tile.per_sm:
        r.problems.append(
            f"holds {r.occupancy * 4 / tile.num_warps:g} programs an SM, the tile says "
            f"{tile.per_sm} (Tile.per_sm)"
        )


def exit_status(reports) -> int:
    """1 when any kernel has a problem (a spill not accepted, LDS overflow, no compile), else 0."""
    return 1 if any(r.problems for r in reports) else 0


def format_table(reports) -> str:
    lines = [
        "| arch | family | d | kernel | tile | VGPR | AGPR | SGPR | spills | scratch | LDS | occupancy | matrix instrs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        mi = ", ".join(f"{k} x{v}" for k, v in sorted(r.matrix_instrs.items())) or "none"
        occ = f"{r.occupancy:g}"
        prob = f" **{'; '.join(r.problems)}**" if r.problems else ""
        prob += " *accepted spill (configs.ACCEPTED_SPILLS)*" if r.accepted else ""
        spills = f"{r.spills} (+{r.sgpr_spills} sgpr>vgpr)" if r.sgpr_spills else str(r.spills)
        lines.append(
            f"| {r.arch} | {r.family} | {r.head_dim} | {r.kernel} | {r.tile} | {r.vgprs} | {r.agprs} | "
            f"{r.sgprs} | {spills} | {r.scratch_bytes} | {r.lds_bytes} | {occ} | {mi}{prob} |"
        )
    return "\n".join(lines)


def line_progress(total: int, stream=sys.stderr) -> Progress:
    """A line per kernel on ``stream``: ``[12/96] gfx942 d=128 bwd_dkdv 5.1s`` (or ``cached``)."""
    done = [0]

    def report(arch: str, d: int, kernel: str, seconds: float | None) -> None:
        done[0] += 1
        took = "cached" if seconds is None else f"{seconds:.1f}s"
        print(f"[{done[0]}/{total}] {arch} d={d} {kernel} {took}", file=stream, flush=True)

    return report


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m attnforge_kernels.aot", description=__doc__.splitlines()[0]
    )
    sel = ap.add_mutually_exclusive_group(required=True)
    sel.add_argument(
        "--arch", action="append", help="arch name from recipes/arches.yaml (repeatable)"
    )
    sel.add_argument("--all", action="store_true", help="every GPU arch in recipes/arches.yaml")
    ap.add_argument(
        "--head-dims",
        default=",".join(map(str, DEFAULT_HEAD_DIMS)),
        help="comma-separated head dims (default 64,128)",
    )
    ap.add_argument(
        "--all-head-dims", action="store_true", help=f"check {','.join(map(str, ALL_HEAD_DIMS))}"
    )
    ap.add_argument(
        "--over-2gib",
        action="store_true",
        help="AMD: compile for tensors over 2 GiB (64-bit addresses, no buffer loads)",
    )
    ap.add_argument("--arches-file", default=str(ARCHES_YAML))
    ap.add_argument(
        "--cache-dir",
        help="keep compile results here (default: $ATTNFORGE_BUILD_DIR/aot-cache, else "
        "$XDG_CACHE_HOME/attnforge/aot)",
    )
    ap.add_argument("--no-cache", action="store_true", help="compile every kernel again")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument(
        "--kernel",
        action="append",
        default=[],
        help="only this kernel, e.g. fwd_gluon (repeatable)",
    )
    return ap


def _selection(args) -> tuple[dict, list[str], tuple[int, ...]] | int:
    """(arches.yaml's arches, the arches to compile, the head dims) from the command line, or
    the exit status 2 after one sentence on stderr naming the bad option."""
    arches = load_arches(Path(args.arches_file))
    if args.all:
        names = [n for n, s in arches.items() if s.get("vendor") in ("amd", "nvidia")]
    else:
        unknown = [a for a in args.arch if a not in arches]
        if unknown:
            valid = ", ".join(n for n, s in arches.items() if s.get("vendor") != "cpu")
            print(
                f"unknown arch {', '.join(unknown)} (recipes/arches.yaml has: {valid})",
                file=sys.stderr,
            )
            return 2
        names = args.arch
        cpu = [a for a in names if arches[a].get("vendor") not in ("amd", "nvidia")]
        if cpu:
            print(f"{', '.join(cpu)}: not a GPU arch, nothing to compile", file=sys.stderr)
            return 2
    try:
        dims = (
            ALL_HEAD_DIMS
            if args.all_head_dims
            else tuple(int(x) for x in args.head_dims.split(",") if x.strip())
        )
    except ValueError:
        print(f"--head-dims {args.head_dims!r}: expected whole numbers, e.g. 64,128",
              file=sys.stderr)  # fmt: skip
        return 2
    if not dims or min(dims) < 1:
        print(f"--head-dims {args.head_dims!r}: expected head dims of 1 or more", file=sys.stderr)
        return 2
    return arches, names, dims


def main(argv=None, progress: Callable[[int], Progress] = line_progress) -> int:
    """The command line; ``progress(total)`` makes the per-kernel callback (default: lines on
    stderr; `invoke kernels.aot` passes a live one), closed by its ``close()`` if it has one."""
    args = _parser().parse_args(argv)
    chosen = _selection(args)
    if isinstance(chosen, int):
        return chosen
    arches, names, dims = chosen
    cache = None if args.no_cache else CompileCache(
        Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    )  # fmt: skip
    os.environ.pop("TRITON_INTERPRET", None)
    only = frozenset(args.kernel)
    jobs = [job[0] for n in names for _, job in jobs_for(n, arches[n], dims, args.over_2gib)]
    if only - set(jobs):
        print(f"--kernel {', '.join(sorted(only - set(jobs)))}: no such kernel on these arches "
              f"and head dims (they have: {', '.join(sorted(set(jobs)))})", file=sys.stderr)  # fmt: skip
        return 2
    total = sum(1 for j in jobs if not only or j in only)
    shown, from_cache = progress(total), []

    def tick(arch: str, d: int, kernel: str, seconds: float | None) -> None:
        from_cache.extend([1] if seconds is None else [])
        shown(arch, d, kernel, seconds)

    started = time.monotonic()
    reports = []
    try:
        for name in names:
            reports += check_arch(name, arches[name], dims, args.over_2gib, cache, tick, only)
    finally:
        getattr(shown, "close", lambda: None)()  # a live progress line ends before the table
    where = f" (cache: {cache.folder})" if cache else " (no cache)"
    print(f"{len(reports)} kernel(s), {len(from_cache)} from the cache, in "
          f"{time.monotonic() - started:.1f}s{where}", file=sys.stderr)  # fmt: skip
    if args.json:
        print(json.dumps([asdict(r) for r in reports], indent=1))
    else:
        print(format_table(reports))
    for r in reports:
        if r.accepted:
            print(f"accepted: {r.arch} d={r.head_dim} {r.kernel}: {r.accepted}", file=sys.stderr)
    bad = [r for r in reports if r.problems]
    if bad:
        print(f"{len(bad)} kernel(s) with problems", file=sys.stderr)
    return exit_status(reports)


if __name__ == "__main__":
    sys.exit(main())
