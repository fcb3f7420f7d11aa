"""The one reader of each document a validation run writes (standard library only).

report.json (validate/report.schema.json; its major schema version must match) and the
documents beside it: bench.json, bench_train.json, stress-*.json and baseline-compare.json, each
a ``{"kind": ..., "version": ..., <list>: [...]}`` of its own version (docs/validation.md,
"Report"). validate's renderer, the host's baseline gates, bisect and the stacks' matrix all
read them here.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from contract import names


class DocumentError(Exception):
    """A document is unusable; the message is a sentence for the user."""


# File name pattern -> the kind each must declare.
SIBLINGS = {
    "bench": ("bench.json", names.BENCH),
    "bench_train": ("bench_train.json", names.BENCH_TRAIN),
    "stress": ("stress-*.json", names.STRESS),
    # written on the host by `invoke validate --bench` (attnforge/baseline/gate.py)
    "baseline_compare": ("baseline-compare.json", names.BASELINE_COMPARE),
}
# The list each sibling kind carries its rows in.
SIBLING_LISTS = {names.BENCH: "results", names.BENCH_TRAIN: "results", names.STRESS: "runs",
                 names.BASELINE_COMPARE: "rows"}  # fmt: skip
# What writes each again ({name}: the file's name).
SIBLING_TOOLS = {names.BENCH: "python -m validate bench --json {name}",
                 names.BENCH_TRAIN: "python -m validate bench-train --json {name}",
                 names.STRESS: "python -m validate stress --json {name}",
                 names.BASELINE_COMPARE: "invoke validate --bench"}  # fmt: skip


def read_json(p: Path, what: str = "") -> Any:
    """The parsed JSON of a file, or a DocumentError naming the file (and line, column)."""
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DocumentError(f"cannot read {what}{p}: {exc.strerror or exc}.") from None
    except json.JSONDecodeError as exc:
        raise DocumentError(f"{p}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg}).") from None


def load_report(path: str | Path) -> dict[str, Any]:
    """Read a report.json, checking that it is one this contract's schema version describes."""
    p = Path(path)
    data = read_json(p, "report ")
    if not isinstance(data, dict) or "schema_version" not in data:
        raise DocumentError(f"{p}: not a validate report (no schema_version).")
    major, ours = (
        str(data["schema_version"]).split(".")[0],
        names.REPORT_SCHEMA_VERSION.split(".")[0],
    )
    if major != ours:
        raise DocumentError(
            f"{p}: schema_version {data['schema_version']} is not supported; "
            f"this renderer reads {ours}.x."
        )
    return data


def load_sibling(path: str | Path, kind: str) -> dict[str, Any]:
    """Read one sibling document, checking that it is the `kind` its file name promises."""
    p = Path(path)
    data = read_json(p)
    found = data.get("kind") if isinstance(data, dict) else None
    if found != kind:
        what = f"a document of kind {found!r}" if found else "not an attnforge document (no kind)"
        raise DocumentError(
            f"{p}: expected kind {kind!r} but it is {what}; move it away or write it again "
            f"with `{SIBLING_TOOLS[kind].format(name=p.name)}`."
        )
    version = names.KIND_VERSIONS[kind]
    if data.get("version") != version:
        raise DocumentError(
            f"{p}: {kind} version {data.get('version')!r} is not supported; this renderer "
            f"reads version {version}."
        )
    if not isinstance(data.get(SIBLING_LISTS[kind]), list):
        raise DocumentError(f"{p}: {kind} document without a {SIBLING_LISTS[kind]!r} list.")
    return data


def _stamp_time(text: Any) -> datetime | None:
    """A document's UTC time ("2026-11-24T10:12:00Z" or with +00:00), or None."""
    try:
        found = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return found if found.tzinfo else found.replace(tzinfo=timezone.utc)


def other_run(report: dict[str, Any], doc: dict[str, Any]) -> str | None:
    """Why a sibling document is not of the report's run (None: it is). Both stamped: the ids
    must be equal. A document without an id (written by hand with `python -m validate bench`,
    or before run ids) belongs when it was made after the report's run started."""
    mine, theirs = report.get("run_id"), doc.get("run_id")
    if mine and theirs:
        return None if mine == theirs else f"it is of run {theirs}, the report of run {mine}"
    started, created = _stamp_time(report.get("started_at")), _stamp_time(doc.get("created"))
    if started and created and created < started:
        return (f"it was written {doc.get('created')}, before this report's run started "
                f"({report.get('started_at')})")  # fmt: skip
    return None


def load_siblings(report_path: str | Path, report: dict[str, Any] | None = None) -> dict[str, Any]:
    """The bench, training, stress and baseline documents next to a report.json (absent ones:
    None/[]). With `report`, those of another run are left out and listed in "left_out" as
    (file name, why) pairs, so that a page never mixes two runs without saying so."""
    folder = Path(report_path).parent
    found: dict[str, Any] = {"left_out": []}
    for key, (pattern, kind) in SIBLINGS.items():
        docs = []
        for p in sorted(folder.glob(pattern)):
            if not p.is_file():
                continue
            doc = load_sibling(p, kind)
            why = other_run(report, doc) if report is not None else None
            if why:
                found["left_out"].append((p.name, why))
            else:
                docs.append(doc)
        found[key] = docs if "*" in pattern else (docs[0] if docs else None)
    return found
