"""Performance baselines that gate: compare a benchmark (bench.json) with a baseline's.

Pure: two `attnforge.bench` documents and the gates go in; rows {backend, shape, mode,
baseline_ms, now_ms, ratio, gated, min_ratio, verdict} and a pass/fail come out. A row's time is
the median of its repeats (`ms_all`), so one noisy repeat moves nothing; the ratio is
baseline_ms / now_ms, a speed ratio (above 1 this run is faster, 0.8 means it runs at 80% of the
baseline's speed), and a gate fails when that median ratio is below its `min_ratio`.

Where the gates come from (a stack's `bench_gates:` in recipes/stacks.yaml), where the baseline
comes from (a report folder, the kept last passing run, a published image) and what is written
is attnforge/baseline/store.py and attnforge/validation.py. Standard library only, so that
`python -m attnforge.baseline BASELINE NOW --gate ...` runs on a bare GPU host with nothing but
Python (docs/validation.md, "Baselines").
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract import documents, names

from .. import files

KIND = names.BASELINE_COMPARE
VERSION = names.KIND_VERSIONS[KIND]
DEFAULT_MIN_RATIO = 0.9
MODES = names.MODES
ANY_MODE = "all"
# verdicts: pass/fail for gated rows timed on both sides; ungated for the others timed on both;
# no-baseline when the baseline has no time for it; not-run when this run has none.
PASS, FAIL, UNGATED, NO_BASELINE, NOT_RUN = "pass", "fail", "ungated", "no-baseline", "not-run"
VERDICTS = (PASS, FAIL, UNGATED, NO_BASELINE, NOT_RUN)


class BaselineError(ValueError):
    """A gate or a document that cannot be used; the message is one sentence for the user."""


# ---------------------------------------------------------------------------- gates


@dataclass(frozen=True)
class Gate:
    """Which results must keep their speed: backend and shape are names or shell-style globs,
    mode is fwd, bwd, fwd_bwd or all; min_ratio None takes the default threshold."""

    backend: str
    shape: str = "*"
    mode: str = ANY_MODE
    min_ratio: float | None = None

    def matches(self, backend: str, shape: str, mode: str) -> bool:
        return (
            fnmatch.fnmatchcase(backend, self.backend)
            and fnmatch.fnmatchcase(shape, self.shape)
            and self.mode in (ANY_MODE, mode)
        )

    def threshold(self, default: float) -> float:
        return self.min_ratio if self.min_ratio is not None else default

    def describe(self, default: float = DEFAULT_MIN_RATIO) -> str:
        return f"{self.backend} {self.shape} {self.mode} >= {self.threshold(default):g}x"

    def to_json(self, default: float = DEFAULT_MIN_RATIO) -> dict[str, Any]:
        return {"backend": self.backend, "shape": self.shape, "mode": self.mode,
                "min_ratio": self.threshold(default)}  # fmt: skip


GATE_SYNTAX = "BACKEND[,shape=GLOB][,mode=fwd|bwd|fwd_bwd|all][,min_ratio=R]"


def parse_gate(text: str) -> Gate:
    """'kernels,shape=sweep-*,mode=fwd,min_ratio=0.9' -> Gate; BaselineError for a bad one."""
    backend, *rest = [part.strip() for part in text.split(",")]
    if not backend or "=" in backend:
        raise BaselineError(f"gate {text!r}: expected {GATE_SYNTAX}, e.g. kernels,mode=fwd")
    fields: dict[str, Any] = {}
    for item in rest:
        key, eq, value = (p.strip() for p in item.partition("="))
        if key not in ("shape", "mode", "min_ratio") or not eq or not value:
            raise BaselineError(f"gate {text!r}: {item!r} is not shape=GLOB, mode=MODE or "
                                "min_ratio=R")  # fmt: skip
        fields[key] = value
    if "min_ratio" in fields:
        fields["min_ratio"] = parse_ratio(fields["min_ratio"], f"gate {text!r}")
    gate = Gate(backend, **fields)
    check_gate(gate, f"gate {text!r}")
    return gate


def parse_ratio(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise BaselineError(f"{where}: min_ratio {text!r} is not a number") from None
    if not value > 0:
        raise BaselineError(f"{where}: min_ratio must be more than 0, not {text}")
    return value


def check_gate(gate: Gate, where: str) -> None:
    if gate.mode not in (*MODES, ANY_MODE):
        raise BaselineError(f"{where}: mode {gate.mode!r} is not one of "
                            f"{', '.join((*MODES, ANY_MODE))}")  # fmt: skip
    if gate.min_ratio is not None and not gate.min_ratio > 0:
        raise BaselineError(f"{where}: min_ratio must be more than 0")


def gate_for(gates: Sequence[Gate], backend: str, shape: str, mode: str) -> Gate | None:
    """The first gate that matches a result (gates are read in order, so a specific one listed
    before a broad one sets its own threshold)."""
    return next((g for g in gates if g.matches(backend, shape, mode)), None)


# ---------------------------------------------------------------------------- documents


def median_ms(result: Mapping[str, Any] | None) -> float | None:
    """A result's time: the median of its repeats, else its recorded `ms`; None unless ok."""
    if not result or result.get("status") != names.OK:
        return None
    repeats = [float(x) for x in result.get("ms_all") or [] if x is not None]
    if repeats:
        return statistics.median(repeats)
    ms = result.get("ms")
    return float(ms) if ms else None


def _key(result: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(result["backend"]), str(result["shape"]["name"]), str(result["mode"]))


def _index(doc: Mapping[str, Any]) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    return {_key(r): r for r in doc.get("results") or []}


def _said(result: Mapping[str, Any]) -> str:
    message = str(result.get("message") or "").strip().splitlines()
    return str(result.get("status")) + (f": {message[0][:160]}" if message else "")


# ---------------------------------------------------------------------------- the comparison


def compare_rows(
    baseline: Mapping[str, Any],
    now: Mapping[str, Any],
    gates: Sequence[Gate],
    default_min_ratio: float = DEFAULT_MIN_RATIO,
) -> list[dict[str, Any]]:
    """One row per (backend, shape, mode) in either document: this run's order, then what only
    the baseline has. Nothing missing or refused on either side raises; it is a verdict."""
    base, cur = _index(baseline), _index(now)
    rows = []
    for key in [*cur, *(k for k in base if k not in cur)]:
        backend, shape, mode = key
        b, n = base.get(key), cur.get(key)
        gate = gate_for(gates, backend, shape, mode)
        min_ratio = gate.threshold(default_min_ratio) if gate else None
        b_ms, n_ms = median_ms(b), median_ms(n)
        ratio = b_ms / n_ms if b_ms and n_ms else None
        if ratio is not None:
            if gate is None:
                verdict, message = UNGATED, ""
            elif ratio >= min_ratio:
                verdict, message = PASS, ""
            else:
                verdict = FAIL
                message = (f"{ratio_text(ratio)} the baseline's speed ({b_ms:.4g} ms -> "
                           f"{n_ms:.4g} ms, medians), below the gate's {min_ratio:g}x")  # fmt: skip
        elif b_ms is None and n_ms is not None:
            verdict = NO_BASELINE
            message = f"baseline: {_said(b)}" if b else "not in the baseline"
        elif n is None:
            verdict, message = NOT_RUN, "not in this run"
        elif b_ms is not None and gate is not None:
            # it ran in the baseline and no longer does: worse than slow
            verdict = FAIL
            message = f"ran in the baseline ({b_ms:.4g} ms), now {_said(n)}"
        else:
            verdict = NOT_RUN
            message = f"now {_said(n)}" + (f"; baseline {_said(b)}" if b else "")
        rows.append({
            "backend": backend, "shape": shape, "mode": mode,
            "baseline_ms": b_ms, "now_ms": n_ms, "ratio": ratio,
            "baseline_repeats": len((b or {}).get("ms_all") or []),
            "now_repeats": len((n or {}).get("ms_all") or []),
            "gated": gate is not None, "min_ratio": min_ratio, "verdict": verdict,
            "message": message,
        })  # fmt: skip
    return rows


def failure_sentence(row: Mapping[str, Any]) -> str:
    return f"{row['backend']} at {row['shape']} {row['mode']}: {row['message']}"


def _side(doc: Mapping[str, Any], source: str) -> dict[str, Any]:
    return {"source": source, "created": doc.get("created"), "env": doc.get("env") or {},
            "size": doc.get("size"), "repeats": doc.get("repeats")}  # fmt: skip


def _notes(baseline: Mapping[str, Any], now: Mapping[str, Any], rows: list[dict]) -> list[str]:
    notes = []
    be, ne = baseline.get("env") or {}, now.get("env") or {}
    for field in ("device", "torch", "triton", "hip", "cuda"):
        if be.get(field) != ne.get(field):
            notes.append(f"{field} differs: baseline {be.get(field)}, now {ne.get(field)}")
    if baseline.get("size") != now.get("size"):
        notes.append(f"the baseline is a {baseline.get('size')} bench, this run a "
                     f"{now.get('size')} one: only the shapes both have are compared")  # fmt: skip
    if rows and not any(r["ratio"] is not None for r in rows):
        notes.append("no result was timed in both runs: nothing could be compared")
    return notes


def compare(
    baseline: Mapping[str, Any],
    now: Mapping[str, Any],
    gates: Sequence[Gate] = (),
    default_min_ratio: float = DEFAULT_MIN_RATIO,
    *,
    baseline_source: str = "",
    now_source: str = "",
    created: str = "",
) -> dict[str, Any]:
    """The comparison document (kind attnforge.baseline_compare, version 1)."""
    rows = compare_rows(baseline, now, gates, default_min_ratio)
    keys = [(r["backend"], r["shape"], r["mode"]) for r in rows if r["verdict"] != NOT_RUN]
    unmatched = [g for g in gates if not any(g.matches(*k) for k in keys)]
    failures = [failure_sentence(r) for r in rows if r["verdict"] == FAIL]
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    return {
        "kind": KIND, "version": VERSION, "created": created,
        "baseline": _side(baseline, baseline_source), "now": _side(now, now_source),
        "default_min_ratio": default_min_ratio,
        "gates": [g.to_json(default_min_ratio) for g in gates],
        "unmatched_gates": [g.describe(default_min_ratio) for g in unmatched],
        "rows": rows, "counts": counts, "passed": not failures, "failures": failures,
        "notes": _notes(baseline, now, rows),
    }  # fmt: skip


# ---------------------------------------------------------------------------- text


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def ratio_text(x: float) -> str:
    """0.91x, 1.20x; two significant digits below 0.1x (0.0074x, not 0.00x)."""
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def _ratio(x: float | None) -> str:
    return "-" if x is None else ratio_text(x)


def _gate(row: Mapping[str, Any]) -> str:
    return f">= {row['min_ratio']:g}x" if row["gated"] else ""


def headline(doc: Mapping[str, Any]) -> str:
    c = doc["counts"]
    timed = [r for r in doc["rows"] if r["ratio"] is not None]
    parts = [f"{c[PASS] + c[FAIL]} gated ({c[FAIL]} below the threshold)", f"{c[UNGATED]} ungated"]
    parts += [f"{c[v]} {v}" for v in (NO_BASELINE, NOT_RUN) if c[v]]
    if timed:
        gmean = statistics.geometric_mean([r["ratio"] for r in timed])
        parts.append(f"geometric mean speed ratio {gmean:.2f}x")
    return f"baseline gate: {'PASS' if doc['passed'] else 'FAIL'} ({', '.join(parts)})"


def table_lines(doc: Mapping[str, Any], limit: int | None = 60) -> list[str]:
    """The comparison as fixed-width lines: every row up to `limit`, else the gated and failing
    rows and the slowest others (the whole table is in the Markdown)."""
    rows = list(doc["rows"])
    shown, left = rows, 0
    if limit is not None and len(rows) > limit:
        keep = [r for r in rows if r["gated"] or r["verdict"] == FAIL]
        others = sorted((r for r in rows if r not in keep and r["ratio"] is not None),
                        key=lambda r: r["ratio"])[: max(0, limit - len(keep))]  # fmt: skip
        shown = [r for r in rows if r in keep or r in others]
        left = len(rows) - len(shown)
    width = max([len(r["shape"]) for r in shown] + [5])
    lines = [f"{'backend':<18} {'shape':<{width}} {'mode':<7} {'baseline ms':>12} {'now ms':>10} "
             f"{'ratio':>7} {'gate':>8}  verdict"]  # fmt: skip
    for r in shown:
        msg = f"  {r['message']}" if r["message"] and r["verdict"] != FAIL else ""
        lines.append(
            f"{r['backend']:<18} {r['shape']:<{width}} {r['mode']:<7} "
            f"{_ms(r['baseline_ms']):>12} {_ms(r['now_ms']):>10} {_ratio(r['ratio']):>7} "
            f"{_gate(r):>8}  {r['verdict']}{msg}"
        )
    if left:
        lines.append(f"({left} more ungated rows; the whole table is in the Markdown)")
    return lines


def to_markdown(doc: Mapping[str, Any]) -> str:
    b, n = doc["baseline"], doc["now"]
    lines = [f"### {headline(doc)}", "",
             f"Baseline: `{b['source']}` ({b['created']}, {b['env'].get('device')}, torch "
             f"{b['env'].get('torch')}); now: `{n['source']}` ({n['created']}, "
             f"{n['env'].get('device')}, torch {n['env'].get('torch')}). Times are medians of "
             "each result's repeats; ratio = baseline ms / now ms (above 1: faster now).", ""]  # fmt: skip
    if doc["failures"]:
        lines += ["**Below the threshold:**", ""]
        lines += [f"- {s}" for s in doc["failures"]] + [""]
    for note in doc["notes"]:
        lines.append(f"- note: {note}")
    for gate in doc["unmatched_gates"]:
        lines.append(f"- note: the gate `{gate}` matched no result of this run")
    if doc["notes"] or doc["unmatched_gates"]:
        lines.append("")
    lines += ["| backend | shape | mode | baseline ms | now ms | ratio | gate | verdict |",
              "|---|---|---|---:|---:|---:|---|---|"]  # fmt: skip
    for r in doc["rows"]:
        verdict = f"**{r['verdict']}**" if r["verdict"] == FAIL else r["verdict"]
        extra = f": {r['message']}" if r["message"] else ""
        lines.append(f"| {r['backend']} | `{r['shape']}` | {r['mode']} | {_ms(r['baseline_ms'])} "
                     f"| {_ms(r['now_ms'])} | {_ratio(r['ratio'])} | {_gate(r)} | "
                     f"{verdict}{extra.replace('|', '/')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- files


# Documents whose bench.json lies beside them (a report folder, a published snapshot).
BESIDE = ("report.json", "report.md", "publish.json", "validated.json", "baseline.json")


def bench_file(path: str | Path) -> Path:
    """The bench.json a user means: the file itself, or the bench.json beside a report.json or
    publish.json, or inside a folder (a report folder, a kept baseline)."""
    p = Path(path)
    if p.is_dir():
        p = p / "bench.json"
    elif p.name in BESIDE:
        p = p.with_name("bench.json")
    if not p.is_file():
        raise BaselineError(f"{path}: no benchmark there ({p} does not exist); run the bench "
                            "with `python -m validate bench --json` or `invoke validate --bench`")  # fmt: skip
    return p


def load_bench(path: str | Path) -> dict[str, Any]:
    """The benchmark document a user means (bench_file), read by the one reader of bench.json."""
    try:
        return documents.load_sibling(bench_file(path), names.BENCH)
    except documents.DocumentError as exc:
        raise BaselineError(str(exc).rstrip(".")) from None


def write_aside(path: Path, text: str) -> None:
    """Write beside the target, then rename: an interrupted write never leaves half a file."""
    files.write_aside(path, text)


def write(doc: Mapping[str, Any], json_path: Path | None, md_path: Path | None) -> None:
    if json_path:
        write_aside(Path(json_path), json.dumps(doc, indent=2) + "\n")
    if md_path:
        write_aside(Path(md_path), to_markdown(doc))


# ---------------------------------------------------------------------------- command line


def now_iso() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def main(argv: Iterable[str] | None = None) -> int:
    """`python -m attnforge.baseline BASELINE NOW [--gate SPEC ...]`: exit 0 pass, 1 a gate
    failed, 2 usage error."""
    parser = argparse.ArgumentParser(
        prog="python -m attnforge.baseline",
        description="Compare a benchmark (python -m validate bench --json) with a baseline's: a "
        "row per backend, shape and mode with both median times and the speed ratio "
        "(baseline ms / now ms); fail when a gated row falls below its threshold.",
    )
    parser.add_argument("baseline", help="the baseline: a bench.json, or a folder or report.json "
                        "with bench.json beside it")  # fmt: skip
    parser.add_argument("now", help="this run: a bench.json, folder or report.json, as above")
    parser.add_argument("--gate", action="append", default=[], metavar="SPEC",
                        help=f"a gate, repeatable: {GATE_SYNTAX} (globs allowed; the first gate "
                        "that matches a row decides); without one every row is ungated")  # fmt: skip
    parser.add_argument("--min-ratio", default=str(DEFAULT_MIN_RATIO), metavar="R",
                        help=f"threshold of gates that give none (default {DEFAULT_MIN_RATIO})")  # fmt: skip
    parser.add_argument("--json", metavar="PATH", help="write the comparison document here")
    parser.add_argument("--md", metavar="PATH", help="write the comparison as Markdown here")
    parser.add_argument("--all", action="store_true", help="print every row, however many")
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        default = parse_ratio(args.min_ratio, "--min-ratio")
        gates = [parse_gate(text) for text in args.gate]
        baseline, now = load_bench(args.baseline), load_bench(args.now)
        doc = compare(baseline, now, gates, default, baseline_source=str(args.baseline),
                      now_source=str(args.now), created=now_iso())  # fmt: skip
        write(doc, args.json, args.md)
    except (BaselineError, OSError) as exc:
        print(f"python -m attnforge.baseline: {exc}", file=sys.stderr)
        return 2
    print("\n".join(table_lines(doc, None if args.all else 60)))
    for note in doc["notes"]:
        print(f"note: {note}")
    for gate in doc["unmatched_gates"]:
        print(f"note: the gate {gate} matched no result of this run")
    for sentence in doc["failures"]:
        print(f"below the threshold: {sentence}")
    print(headline(doc))
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
