"""A fake host root (/sys KFD topology, /proc kernel release, /dev nodes) for fingerprint tests."""

from __future__ import annotations

from pathlib import Path


def fake_host(
    root: Path,
    gfx_target: int | None,
    kernel: str,
    *,
    kfd: bool = True,
    render: bool = True,
    driver: str | None = None,
    fw_version: str = "42",
) -> Path:
    """A CPU node plus, with `gfx_target` (KFD's major*10000 + minor*100 + stepping), a GPU node;
    the kernel release; /dev/dri/renderD128 and /dev/kfd as asked; an amdgpu module version."""
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    (nodes / "0").mkdir(parents=True)
    (nodes / "0/properties").write_text("cpu_cores_count 16\ngfx_target_version 0\n")
    if gfx_target:
        (nodes / "1").mkdir()
        (nodes / "1/properties").write_text(
            f"gfx_target_version {gfx_target}\nfw_version {fw_version}\n"
        )
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text(kernel + "\n")
    if render:
        (root / "dev/dri").mkdir(parents=True)
        (root / "dev/dri/renderD128").write_text("")
    if kfd:
        (root / "dev").mkdir(exist_ok=True)
        (root / "dev/kfd").write_text("")
    if driver:
        (root / "sys/module/amdgpu").mkdir(parents=True)
        (root / "sys/module/amdgpu/version").write_text(driver + "\n")
    return root
