"""The report document (schema ``validate/report.schema.json``, version SCHEMA_VERSION)."""

from __future__ import annotations

import json
import os
import platform
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from contract import documents
from contract.names import CHECK_STATUSES, FAILING, SDPA_BACKENDS
from validate import SCHEMA_VERSION, __version__


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# One validation run writes several documents (report.json, bench.json, bench_train.json,
# stress-*.json, baseline-compare.json), each by its own process; `invoke validate` hands them
# one id in this variable, and each stamps it as "run_id", so that a renderer can tell this
# run's documents from a stale one left beside it by an earlier run.
RUN_ID_ENV = "ATTNFORGE_RUN_ID"


def new_run_id() -> str:
    """A fresh run id: UTC time to the microsecond (ids sort as the runs started), then the pid."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ") + f"-{os.getpid()}"


def current_run_id() -> str | None:
    """The run id this process was started under ($ATTNFORGE_RUN_ID), if any."""
    return os.environ.get(RUN_ID_ENV) or None


def backend_matrix(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per SDPA case: default pick, kernels seen, and each backend's verdict."""
    rows = []
    for rec in records:
        if not rec["id"].startswith("sdpa.case."):
            continue
        d = rec.get("details") or {}
        row: dict[str, Any] = {
            "case": rec["id"][len("sdpa.case.") :],
            "status": rec["status"],
            "params": d.get("case"),
            "device": d.get("device"),
            "default_backend": d.get("default_backend"),
            "default_backend_source": d.get("default_backend_source"),
            "profiler_backend": d.get("profiler_backend"),
            "default_kernels": d.get("default_kernels", []),
            "backends": {},
        }
        for b in SDPA_BACKENDS:
            e = (d.get("backends") or {}).get(b)
            if e is None:
                continue
            j = e.get("judgement") or {}
            row["backends"][b] = {
                "can_use": e.get("can_use"),
                "reasons": e.get("reasons", []),
                "run": e.get("run"),
                "error": e.get("error"),
                "max_abs_err": j.get("max_abs_err"),
                "tolerance": j.get("tolerance"),
                **({"note": e["note"]} if e.get("note") else {}),
            }
        rows.append(row)
    return rows


def apps_section(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The apps' attention implementations (one row per app model x implementation) and the
    contract probes, from the apps checks; None when no apps check ran."""
    rows: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    seen = False
    for rec in records:
        if not rec["id"].startswith("apps."):
            continue
        seen = True
        d = rec.get("details") or {}
        if rec["id"] == "apps.contracts":
            probes = list(d.get("probes") or [])
            continue
        if not d.get("implementations"):
            rows.append({"app": d.get("app"), "model": d.get("model") or rec["id"][5:],
                         "impl": None, "status": rec["status"], "ran": False, "correct": None,
                         "kernel": None, "reason": rec.get("message")})  # fmt: skip
            continue
        for impl in d["implementations"]:
            rows.append({
                "app": d.get("app"), "app_version": d.get("app_version"), "model": d.get("model"),
                "impl": impl.get("impl"), "status": rec["status"], "ran": impl.get("ran"),
                "correct": impl.get("correct"), "reference": impl.get("reference"),
                "must_run": impl.get("must_run"), "kernel": impl.get("kernel"),
                "source": impl.get("source"), "reason": impl.get("reason"),
                "max_abs_err": max((j.get("max_abs_err") for j in (impl.get("judgements") or {}).values()
                                    if isinstance(j.get("max_abs_err"), (int, float))), default=None),
            })  # fmt: skip
    return {"models": rows, "contracts": probes} if seen else None


def build(
    *,
    command: str,
    argv: list[str],
    quick: bool,
    started_at: str,
    duration_s: float,
    records: list[dict[str, Any]],
    observations: dict[str, Any],
    expectations: dict[str, Any] | None,
    exit_code: int,
    host: dict[str, Any] | None = None,
    aotriton: dict[str, Any] | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Assemble the report document. `host`: the fingerprint and the known-bad rules it matched
    (validate/host.py); a crash or timeout on such a host is marked host_suspect."""
    counts = {s: 0 for s in CHECK_STATUSES}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    env_rec = next((r for r in records if r["id"] == "env"), None)
    suspects = [w["id"] for w in (host or {}).get("warnings", [])]
    if suspects:
        records = [
            {**r, "host_suspect": suspects} if r["status"] in ("crash", "timeout") else r
            for r in records
        ]
    broken = [e for e in (expectations or {}).get("results", []) if e["status"] == "broken"]
    failed = [r["id"] for r in records if r["required"] and r["status"] in FAILING]
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "attnforge-validate", "version": __version__},
        "run_id": run_id or current_run_id() or new_run_id(),
        "command": command,
        "argv": argv,
        "quick": quick,
        "started_at": started_at,
        "duration_s": round(duration_s, 3),
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(), **(host or {})},
        "aotriton_knob": aotriton_knob(aotriton, (env_rec or {}).get("details", {})),
        "stack": (expectations or {}).get("stack"),
        "arch": (expectations or {}).get("arch"),
        "environment": (env_rec or {}).get("details", {}),
        "observations": observations,
        "checks": records,
        "backend_matrix": backend_matrix(records),
        "apps": apps_section(records),
        "expectations": expectations,
        "summary": {
            "status": "pass" if exit_code == 0 else "fail",
            "exit_code": exit_code,
            "counts": counts,
            "failed_required": failed,
            "broken_expectations": len(broken),
        },
    }


KNOB = "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"


def aotriton_knob(facts: dict[str, Any] | None, env_details: dict[str, Any]) -> dict[str, Any]:
    """Whether the image sets TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL, and whether this arch
    needs it with the AOTriton the torch bundles (per the recipes), so a silent math fallback on
    an experimental arch has its reason in the report."""
    value = (env_details.get("env") or {}).get(KNOB)
    found = {"variable": KNOB, "value": value, "set": value == "1"}
    if facts:
        found.update(aotriton=facts.get("version"), needed=bool(facts.get("experimental")))
        found["ok"] = found["set"] or not found["needed"]
    return found


# One reader of the report and of the documents beside it, shared with the host (contract/).
ReportError = documents.DocumentError
load = documents.load_report
load_sibling, load_siblings, other_run = (
    documents.load_sibling, documents.load_siblings, documents.other_run)  # fmt: skip


def write_json(report: dict[str, Any], path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
