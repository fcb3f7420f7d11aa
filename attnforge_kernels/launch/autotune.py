"""Opt-in autotuning of the tile configs, cached on disk. Off by default.

Enable with ``ATTNFORGE_KERNELS_AUTOTUNE=1`` (or :func:`enable`). The first call of a kind
(forward or backward) for a key times each candidate config of the device's family on the
call's own inputs and keeps the fastest; the choice is stored in a JSON file
(``ATTNFORGE_KERNELS_CACHE``, default ``~/.cache/attnforge/kernels-autotune.json``) and reused by
later processes. The key is (device name, family, kind, head dim, dtype, mask kind, flags) and
not the sequence lengths, so a new length never retunes. Autotuning is opt-in because upstream
autotuning crashed on gfx1151; a candidate that fails to compile or launch is skipped.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, fields, replace
from pathlib import Path

from ..device import configs
from ..device.configs import AttnConfig, Tile

_lock = threading.Lock()
_memory: dict[str, dict] = {}
_forced: bool | None = None

# Candidate tiles per family and kind: [block_m, block_n, num_warps, num_stages(, waves_per_eu)].
CANDIDATES = {
    "hopper": {
        "fwd": [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3), (64, 64, 4, 3)],
        "bwd_kv": [(64, 64, 4, 2), (64, 128, 8, 2), (32, 128, 8, 2), (16, 128, 8, 2)],
    },
    "ampere": {
        "fwd": [(128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 4, 2)],
        "bwd_kv": [(16, 64, 8, 2), (64, 64, 4, 2), (32, 64, 4, 2)],
    },
    "cdna": {
        "fwd": [(128, 32, 4, 1, 2), (128, 64, 4, 1, 2), (64, 64, 4, 1, 2), (128, 64, 4, 2, 1)],
        "bwd_kv": [(32, 64, 4, 1, 1), (32, 128, 4, 1, 1), (16, 64, 4, 1, 1)],
    },
    "rdna": {
        "fwd": [(64, 32, 4, 1, 2), (64, 64, 4, 1, 2), (32, 32, 4, 1, 2), (32, 32, 2, 1, 4)],
        "bwd_kv": [(16, 16, 8, 1, 1), (16, 32, 8, 1, 1), (16, 32, 4, 1, 1)],
    },
}


def enable() -> None:
    global _forced
    _forced = True


def disable() -> None:
    global _forced
    _forced = False


def enabled() -> bool:
    if _forced is not None:
        return _forced
    return os.environ.get("ATTNFORGE_KERNELS_AUTOTUNE") == "1"


def cache_path() -> Path:
    env = os.environ.get("ATTNFORGE_KERNELS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "attnforge" / "kernels-autotune.json"


def _group(family: str) -> str:
    if family.startswith("rdna"):
        return "rdna"
    if family.startswith("cdna"):
        return "cdna"
    return family if family in CANDIDATES else "ampere"


def key(kind: str, q, head_dim: int, mask, softcap: bool, alibi: bool, varlen: bool) -> str:
    """The cache key of one call (no sequence lengths: see the module docstring)."""
    if not enabled():
        return ""
    import torch

    family = configs.device_family(q.device)
    name = "cpu" if configs.INTERPRET else torch.cuda.get_device_name(q.device)
    flags = "".join(
        c
        for c, on in (
            ("L", mask.left is not None),
            ("R", mask.right is not None),
            ("S", softcap),
            ("A", alibi),
            ("V", varlen),
        )
        if on
    )
    return f"{name}|{family}|{kind}|d{head_dim}|{str(q.dtype).removeprefix('torch.')}|{flags}"


def _load() -> dict:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _store(k: str, cfg: AttnConfig) -> None:
    path = cache_path()
    data = _load()
    data[k] = asdict(cfg)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache only costs a retune in the next process


def _from_dict(d: dict) -> AttnConfig:
    """An AttnConfig from its cached ``asdict`` form: every field round-trips (the Gluon switches
    included); fields an older cache lacks take their defaults, unknown ones are ignored. JSON
    gives a tuple field (``paired_waves``) back as a list, made a tuple again: the config is
    hashed and compared."""
    names = {f.name for f in fields(AttnConfig)}
    rest = {
        k: tuple(v) if isinstance(v, list) else v
        for k, v in d.items()
        if k in names and k not in configs.TILE_KEYS
    }
    return AttnConfig(**{k: configs.tile_of(d[k]) for k in configs.TILE_KEYS}, **rest)


def candidates(default: AttnConfig, family: str, kind: str) -> list[AttnConfig]:
    """The default first, then the family's other candidates for the tile that ``kind`` uses."""
    field = "fwd" if kind == "fwd" else "bwd_kv"
    out = [default]
    for t in CANDIDATES[_group(family)][field]:
        # A candidate keeps the default tile's TMA choice and its stand-in for calls TMA cannot
        # address (Tile.no_tma): only the shape is searched.
        base = getattr(default, field)
        c = replace(default, **{field: replace(Tile(*t), tma=base.tma, no_tma=base.no_tma)})
        if c not in out:
            out.append(c)
    return out


def _time(fn) -> float:
    """Median milliseconds of ``fn``: device events on a GPU, the host clock in the interpreter."""
    if configs.INTERPRET:
        import time

        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[0]
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=20, return_mode="median")


def choose(k: str, default: AttnConfig, launch) -> AttnConfig:
    """The config to launch with: ``default`` unless autotuning is on (``k`` non-empty)."""
    if not k:
        return default
    with _lock:
        if k in _memory:
            return _from_dict(_memory[k])
        stored = _load().get(k)
        if stored:
            _memory[k] = stored
            return _from_dict(stored)
    family, kind = k.split("|")[1], k.split("|")[2]
    best, best_ms = default, float("inf")
    for cand in candidates(default, family, kind):
        try:
            ms = _time(lambda c=cand: launch(c))
        except Exception:  # a candidate the compiler or device rejects is skipped
            continue
        if ms < best_ms:
            best, best_ms = cand, ms
    with _lock:
        _memory[k] = asdict(best)
    _store(k, best)
    return best
