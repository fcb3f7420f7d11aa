"""The host is part of the result: a fingerprint of what the GPU runs on, and known-bad hosts.

Many 2026 ROCm failures were the host's, not the stack's: gfx1151 page faults and hangs fixed in
Linux 6.18.4, an empty HSA_OVERRIDE_GFX_VERSION that breaks device detection, containers without
/dev/kfd or the render group. Every report carries this fingerprint; rules (the `host_rules` of
the expect file, from recipes/hosts.yaml) turn a known-bad combination into a warning that names
the fix, and a crash on such a host is marked host-suspect.

Stdlib only: it runs inside images and on bare hosts, with no GPU needed to read it.
"""

from __future__ import annotations

import grp
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

KFD_NODES = "sys/class/kfd/kfd/topology/nodes"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _gfx(target_version: int) -> str | None:
    """KFD's gfx_target_version (major*10000 + minor*100 + stepping) -> 'gfx1151'."""
    if target_version <= 0:
        return None
    major, minor, step = (
        target_version // 10000,
        (target_version // 100) % 100,
        target_version % 100,
    )
    return f"gfx{major}{minor}{step:x}"


def kfd_gpus(root: Path) -> list[dict[str, Any]]:
    """The GPUs the kernel driver exposes: arch, firmware version, driver node id."""
    gpus = []
    for props in sorted((root / KFD_NODES).glob("*/properties")):
        fields = {}
        for line in (_read(props) or "").splitlines():
            key, _, value = line.partition(" ")
            fields[key] = value
        arch = _gfx(int(fields.get("gfx_target_version", "0") or 0))
        if arch:
            gpus.append({"arch": arch, "fw_version": fields.get("fw_version"),
                         "node": props.parent.name})  # fmt: skip
    return gpus


def _device_node(path: Path) -> dict[str, Any]:
    try:
        st = path.stat()
    except OSError:
        return {"path": str(path), "exists": False}
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return {
        "path": str(path),
        "exists": True,
        "mode": stat.filemode(st.st_mode),
        "group": group,
        "readable": os.access(path, os.R_OK | os.W_OK),
    }


def hsa_override(environ: Mapping[str, str], gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """HSA_OVERRIDE_GFX_VERSION: unset, empty, or a value; whether it crosses a major version
    (e.g. 10.3.0 on a gfx11 GPU), which makes the runtime load code for another generation."""
    if "HSA_OVERRIDE_GFX_VERSION" not in environ:
        return {"state": "unset"}
    value = environ["HSA_OVERRIDE_GFX_VERSION"]
    if not value.strip():
        return {"state": "empty", "value": value}
    info: dict[str, Any] = {"state": "set", "value": value, "crosses_major": False}
    m = re.match(r"^(\d+)\.", value.strip())
    majors = {major for major in map(_gfx_major, (g["arch"] for g in gpus)) if major is not None}
    if m and majors:
        info["crosses_major"] = int(m.group(1)) not in majors
    return info


def _gfx_major(arch: str) -> int | None:
    """gfx1151 -> 11, gfx942 -> 9, gfx90a -> 9: the last two characters are minor and stepping."""
    m = re.fullmatch(r"gfx(\d+)[0-9a-f]{2}", arch)
    return int(m.group(1)) if m else None


def fingerprint(root: Path = Path("/"), environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What the checks ran on. `root` lets tests point at a fake /sys, /proc and /dev tree."""
    environ = os.environ if environ is None else environ
    gpus = kfd_gpus(root)
    kernel = _read(root / "proc/sys/kernel/osrelease") or os.uname().release
    dev = root / "dev"
    renders = sorted((dev / "dri").glob("renderD*")) if (dev / "dri").is_dir() else []
    try:
        groups = sorted({grp.getgrgid(g).gr_name for g in os.getgroups()})
    except KeyError:
        groups = sorted(str(g) for g in os.getgroups())
    return {
        "kernel": kernel,
        "amdgpu_driver": _read(root / "sys/module/amdgpu/version")
        or ("in-tree" if (root / "sys/module/amdgpu").is_dir() else None),
        "gpus": gpus,
        "hsa_override_gfx_version": hsa_override(environ, gpus),
        "devices": [_device_node(dev / "kfd"), *(_device_node(p) for p in renders)],
        "groups": groups,
        "uid": os.getuid(),
        "engine": environ.get("ATTNFORGE_ENGINE"),  # set by `invoke validate`: name, rootless
    }


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("-", 1)[0])[:3])


def _matches(rule: Mapping[str, Any], fp: Mapping[str, Any], arch: str | None) -> bool:
    """Whether every condition of a rule holds for this host (a rule with none never matches)."""
    conditions = 0
    if "arches" in rule:
        conditions += 1
        archs = {g["arch"] for g in fp.get("gpus", [])} | ({arch} if arch else set())
        if not archs & set(rule["arches"]):
            return False
    if "kernel_below" in rule:
        conditions += 1
        have = _version_tuple(str(fp.get("kernel") or ""))
        if not have or have >= _version_tuple(str(rule["kernel_below"])):
            return False
    if "hsa_override" in rule:
        conditions += 1
        hsa = fp.get("hsa_override_gfx_version", {})
        want = rule["hsa_override"]
        if want == "crosses_major":
            if not hsa.get("crosses_major"):
                return False
        elif hsa.get("state") != want:
            return False
    if "device_access" in rule:
        conditions += 1
        kfd = next((d for d in fp.get("devices", []) if d["path"].endswith("/kfd")), None)
        missing = kfd is None or not kfd.get("exists") or not kfd.get("readable")
        if (rule["device_access"] == "missing") != missing:
            return False
    return conditions > 0


def host_warnings(
    fp: Mapping[str, Any], rules: list[Mapping[str, Any]], arch: str | None = None
) -> list[dict[str, str]]:
    """The known-bad combinations this host matches, each with its fix and source."""
    return [
        {"id": r["id"], "warning": r["warning"], "fix": r["fix"], "source": r["source"]}
        for r in rules
        if _matches(r, fp, arch)
    ]
