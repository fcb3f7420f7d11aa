"""AMD's qualification feed for TheRock nightlies (ROCm/Quartz), read to choose a nightly.

Quartz publishes one `status.json` per nightly at `release-nightly/<YYYYMMDD>/status.json` (older
copies: `nightly/<date>/`), with `latest.json` naming the newest (ROCm/Quartz
docs/status-json/README.md and status_json_reference.jsonc, schema 2.0, read 2026-11-25 at
c584fbd5). What this module trusts, per the reference layout:

* `rocm_version` (`10.1.0a20260822`): the wheels' ROCm version of that nightly;
* `pipelines.pytorch.build.linux.variants[]` `{py, torch, status}`: the PyTorch build of one
  (Python, torch branch) cell; the platform `status` is a worst-of rollup over all branches;
* `pipelines.pytorch.test.linux.<leaf>.variants[]`: the tests of that cell on one GPU target.
  Leaves are arches (`gfx1151`) or families (`gfx94X-dcgpu`, `gfx110X-all`: `X` is any digit).

`summary.overall_status` is not used: it is a worst-of over every pipeline, arch and branch (the
2026-08-22 nightly reads "failure" although gfx1151 passed its release/2.11 py3.10 tests), and
`latest_good.json` is documented as "currently unavailable". Pure: text in, verdicts out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..errors import UserError

FEED = "https://raw.githubusercontent.com/ROCm/Quartz/main/release-nightly/"
SUCCESS = "success"


@dataclass(frozen=True)
class Verdict:
    date: str
    rocm: str  # rocm_version
    ok: bool
    why: str  # what passed (ok) or what did not


def parse_status(text: str, where: str) -> dict[str, Any]:
    """A status.json's content, checked for the fields used; a clear error naming the file."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{where}: the top level must be an object (a Quartz status.json)")
    for key in ("rocm_version", "build_date", "pipelines"):
        if key not in data:
            raise UserError(f"{where}: no {key!r}; not a Quartz status.json (schema 2.0)")
    if not isinstance(data["pipelines"], dict):
        raise UserError(f"{where}: 'pipelines' must be an object")
    return data


def leaf_for(arch: str, leaves: list[str]) -> str | None:
    """The test leaf that covers an arch: its own name, else a family (gfx94X-dcgpu: X = digit)."""
    if arch in leaves:
        return arch
    for leaf in leaves:
        pattern = leaf.split("-", 1)[0].replace("X", "[0-9a-f]")
        if re.fullmatch(pattern, arch):
            return leaf
    return None


def _cells(entry: Any, branch: str, python: str) -> list[dict[str, Any]]:
    variants = entry.get("variants", []) if isinstance(entry, dict) else []
    return [
        v for v in variants
        if isinstance(v, dict) and v.get("torch") == branch and v.get("py") == python
    ]  # fmt: skip


def judge(status: dict[str, Any], arch: str, branch: str, python: str) -> Verdict:
    """Did this nightly's PyTorch build, and the arch's PyTorch tests, pass for (branch, python)?"""
    date, rocm = str(status["build_date"]), str(status["rocm_version"])
    cell = f"torch {branch}, Python {python}"
    pytorch = status["pipelines"].get("pytorch", {})
    builds = _cells(pytorch.get("build", {}).get("linux"), branch, python)
    if not builds:
        return Verdict(date, rocm, False, f"no Linux PyTorch build of {cell}")
    if any(b.get("status") != SUCCESS for b in builds):
        return Verdict(date, rocm, False, f"PyTorch build of {cell}: {builds[0].get('status')}")
    tests = pytorch.get("test", {}).get("linux", {})
    leaf = leaf_for(arch, list(tests) if isinstance(tests, dict) else [])
    if leaf is None:
        return Verdict(date, rocm, False, f"no PyTorch test leaf covers {arch}")
    ran = _cells(tests[leaf], branch, python)
    if not ran:
        return Verdict(date, rocm, False, f"{leaf} did not test {cell}")
    bad = [t.get("status") for t in ran if t.get("status") != SUCCESS]
    if bad:
        return Verdict(date, rocm, False, f"{leaf} tests of {cell}: {bad[0]}")
    run = ran[0].get("run_id", "?")
    return Verdict(
        date, rocm, True,
        f"PyTorch build and {leaf} tests passed for {cell} (test run {run})",
    )  # fmt: skip
