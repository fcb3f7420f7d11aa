"""A recorded launch's parameters packed as the native replay reads them (attnforge_kernels/launch/replay.cpp):
plans.py records them with each planned launch, the extension rebuilds the launch from them."""

from __future__ import annotations

import struct


def launch_params(kernel, values: tuple, sources: tuple):
    """A recorded launch's parameters for the native replay: (params, fills, scratch_bytes,
    scratch_param, block, shared), or None where it cannot rebuild them. ``values``: the bound
    arguments in parameter order, ``sources``: the call-tensor indices of the leading tensors.
    Each non-constexpr parameter is 8 bytes holding its value's own bytes (Triton 3.6's
    launchers: ``params`` of make_launcher), then the global and profile scratch pointers."""
    try:
        sig = list(kernel.src.signature.values())
        md = kernel.metadata
        if (
            len(sig) != len(values)
            or getattr(md, "num_ctas", 1) != 1
            or getattr(md, "launch_cooperative_grid", False)
            or getattr(md, "launch_pdl", False)
            or getattr(md, "profile_scratch_size", 0)
            or getattr(md, "global_scratch_align", 1) > 256
        ):
            return None
        params, fills = [], []
        for i, (ty, value) in enumerate(zip(sig, values, strict=True)):
            if ty == "constexpr":
                continue
            if not isinstance(ty, str):
                return None
            if ty.startswith("*"):
                if i >= len(sources):
                    return None
                fills.append((len(params), sources[i]))
                params.append(0)
                continue
            pack = _PACK.get(ty)
            if pack is None:
                return None
            params.append(pack(value))
        scratch_param = len(params)
        params += [0, 0]  # global scratch (allocated per launch where needed), profile scratch
        warp = getattr(md, "warp_size", None) or md.target.warp_size
        scratch = int(getattr(md, "global_scratch_size", 0) or 0)
        return params, fills, scratch, scratch_param, md.num_warps * warp, md.shared
    except (AttributeError, TypeError, ValueError, struct.error):
        return None


def _int(bits_: int):
    mask = (1 << bits_) - 1
    return lambda x: int(x) & mask


def _float(fmt: str, width: str):
    return lambda x: struct.unpack(width, struct.pack(fmt, float(x)))[0]


def _bf16(x) -> int:
    return struct.unpack("<I", struct.pack("<f", float(x)))[0] >> 16


_PACK = {
    "i1": _int(8), "u1": _int(8), "i8": _int(8), "u8": _int(8),
    "i16": _int(16), "u16": _int(16), "i32": _int(32), "u32": _int(32),
    "i64": _int(64), "u64": _int(64),
    "fp16": _float("<e", "<H"), "bf16": _bf16,
    "fp32": _float("<f", "<I"), "f32": _float("<f", "<I"), "fp64": _float("<d", "<Q"),
}  # fmt: skip
