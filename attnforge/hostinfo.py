"""Facts about the host: which AMD GPU it has, and how many build jobs its memory allows."""

from __future__ import annotations

import os
from pathlib import Path

KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
# PyTorch's and CK's heaviest translation units take 2-4 GiB each under hipcc; flash-attention's
# README warns that too many ninja jobs exhaust RAM (MAX_JOBS). 4 GiB a job keeps clear of that.
GIB_PER_JOB = 4


def gfx_from_target_version(value: int) -> str | None:
    """KFD's gfx_target_version (major*10000 + minor*100 + stepping) -> 'gfx1151'; 0 is a CPU node."""
    if value <= 0:
        return None
    major, minor, step = value // 10000, (value // 100) % 100, value % 100
    return f"gfx{major}{minor}{step:x}"


def detect_amd_arches(nodes: Path = KFD_NODES) -> list[str]:
    """The gfx arches of the AMD GPUs the kernel driver exposes, in node order, deduplicated."""
    found: list[str] = []
    for props in sorted(nodes.glob("*/properties")):
        try:
            text = props.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "gfx_target_version":
                arch = gfx_from_target_version(int(value))
                if arch and arch not in found:
                    found.append(arch)
    return found


def memory_gib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1024 * 1024)
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_jobs(mem_gib: float | None = None, cpus: int | None = None) -> int:
    """Build parallelism: one job per GIB_PER_JOB of memory, at most one per CPU, at least one."""
    mem_gib = memory_gib() if mem_gib is None else mem_gib
    cpus = cpus or os.cpu_count() or 1
    by_memory = int(mem_gib // GIB_PER_JOB) if mem_gib else cpus
    return max(1, min(cpus, by_memory))


def default_arch(nodes: Path = KFD_NODES) -> tuple[str, str]:
    """(arch, why): the host's AMD GPU if the driver exposes one, else the cpu reference arch."""
    found = detect_amd_arches(nodes)
    if found:
        also = f" (also {', '.join(found[1:])})" if found[1:] else ""
        return found[0], f"detected AMD GPU {found[0]}{also}"
    return "cpu", "no AMD GPU detected (no /sys/class/kfd nodes); using the cpu reference stack"
