"""invoke matrix: the compatibility matrix of many validation reports, as one page (issue 17)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract import names

from ..console import out, user_errors
from ..errors import UserError
from ..files import swap_folder, write_aside
from ..workspace import REPORTS_DIR_ENV, Workspace
from . import OUT_DIR, Opt, choice, command, nonempty, text, writable_folder

if TYPE_CHECKING:  # the library is imported where a task uses it (attnforge/cli/__init__.py)
    from .. import matrix

PAGE, MARKDOWN, FOLDER = "matrix.html", "matrix.md", "reports"
# Copied beside each report (what `python -m validate render --html` draws, and the verdicts).
BESIDE = ("report.md", "bench.json", "bench_train.json", "stress-*.json", "publish.json",
          "publish.md", "validated.json")  # fmt: skip
WHAT = (
    "give report.json files, folders that hold them (reports/<arch>/<stack>/) or publish.json files"
)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})",
                        hint=WHAT) from None  # fmt: skip


def is_publish(doc: Any) -> bool:
    """A publish.json, as `invoke publish` writes it (attnforge/cli/publish.py)."""
    return isinstance(doc, dict) and {"arch", "stack", "refs", "validation"} <= set(doc)


def load_report(path: Path) -> dict[str, Any]:
    from contract import documents

    try:
        return documents.load_report(path)
    except documents.DocumentError as exc:
        raise UserError(str(exc).rstrip("."), hint=WHAT) from None


def load_bench(folder: Path, report: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The bench.json beside a report, if it is of the report's run (else said, and None)."""
    from contract import documents

    path = folder / "bench.json"
    if not path.is_file():
        return None
    try:
        doc = documents.load_sibling(path, names.BENCH)
    except documents.DocumentError as exc:
        raise UserError(str(exc).rstrip(".")) from None
    why = documents.other_run(report, doc) if report is not None else None
    if why:
        out.print(f"left out {path}: {why}", style="yellow", markup=False, highlight=False)
        return None
    return doc


def _hidden(path: Path, base: Path) -> bool:
    """Inside a dot folder (validate's .run-<pid> work folders, the matrix's staging)."""
    return any(part.startswith(".") for part in path.relative_to(base).parts[:-1])


def kept_copy(path: Path) -> bool:
    """A report or publish record that attnforge keeps as a copy beside the current one: the
    kept baseline (baseline/ with its baseline.json) or a published snapshot
    (published/<digest>/ inside a report folder); see attnforge/baseline/store.py."""
    from ..baseline import store as baseline_store

    folder = path.parent
    if folder.name == baseline_store.KEPT and (folder / baseline_store.KEPT_META).is_file():
        return True
    return folder.parent.name == baseline_store.PUBLISHED and any(
        (folder.parent.parent / name).is_file() for name in ("report.json", "publish.json"))  # fmt: skip


def _existing_paths(flag: str, value: str) -> str:
    """One --reports value (a comma list of files or folders): every one exists."""
    for part in (p.strip() for p in nonempty(flag, value).split(",")):
        if part and not Path(part).exists():
            raise UserError(f"{flag} {part}: no such file or folder", hint=WHAT)
    return value


def find(paths: list[Path], skip: Path | None = None) -> list[tuple[Path | None, Path | None]]:
    """(report.json, publish.json beside it or alone) for every input; folders are searched
    recursively, leaving out `skip` (the matrix's own output), dot folders, and the copies
    attnforge keeps beside a report (baseline/, published/<digest>/: never a current result)."""
    found: list[tuple[Path | None, Path | None]] = []
    for path in paths:
        if path.is_dir():
            base = path.resolve()

            def wanted(p: Path, base: Path = base) -> bool:
                inside_skip = skip is not None and p.resolve().is_relative_to(skip)
                return (p.is_file() and not inside_skip and not _hidden(p.resolve(), base)
                        and not kept_copy(p))  # fmt: skip

            reports = sorted(p for p in path.rglob("report.json") if wanted(p))
            alone = sorted(p for p in path.rglob("publish.json")
                           if wanted(p) and not (p.parent / "report.json").is_file())  # fmt: skip
            if not reports and not alone:
                raise UserError(f"{path}: no report.json or publish.json in this folder",
                                hint=WHAT)  # fmt: skip
            found += [(p, p.parent / "publish.json") for p in reports]
            found += [(None, p) for p in alone]
        elif path.is_file():
            if is_publish(_json(path)):
                beside = path.parent / "report.json"
                found.append((beside if beside.is_file() else None, path))
            else:
                found.append((path, path.parent / "publish.json"))
        else:
            raise UserError(f"{path}: no such file or folder", hint=WHAT)
    unique, seen = [], set()
    for rep, pub in found:
        key = (rep or pub).resolve()
        if key not in seen:
            seen.add(key)
            unique.append((rep, pub if pub is not None and pub.is_file() else None))
    return unique


def load_entries(found: list[tuple[Path | None, Path | None]]) -> list[matrix.Entry]:
    from .. import matrix

    entries = []
    for rep, pub in found:
        publish = _json(pub) if pub is not None else None
        if publish is not None and not is_publish(publish):
            publish = None  # a file named publish.json that invoke publish did not write
        if rep is None:
            entries.append(matrix.Entry(source=str(pub), publish=publish))
            continue
        doc = load_report(rep)
        entries.append(matrix.Entry(source=str(rep), report=doc,
                                    bench=load_bench(rep.parent, doc), publish=publish))  # fmt: skip
    return entries


def safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


def copy_report(entry: matrix.Entry, dest: Path, root: Path, html: bool) -> tuple[str, str]:
    """Copy a row's documents to `dest` and render its full page there; (link file, a sentence
    when the page could not be drawn, else "")."""
    dest.mkdir(parents=True)
    src = Path(entry.source)
    if entry.report is None:
        shutil.copy2(src, dest / "publish.json")
        return "publish.json", ""
    shutil.copy2(src, dest / "report.json")
    for pattern in BESIDE:
        for p in sorted(src.parent.glob(pattern)):
            if p.is_file() and p.resolve() != src.resolve():
                shutil.copy2(p, dest / p.name)
    argv = [sys.executable, "-m", "validate", "render", str(dest / "report.json"),
            "--md", str(dest / "report.md")]  # fmt: skip
    if html:
        argv += ["--html", str(dest / "report.html")]
    proc = subprocess.run(argv, cwd=root, capture_output=True, text=True)
    if proc.returncode == 0 and not html:
        return "report.md", ""
    if proc.returncode == 0 and (dest / "report.html").is_file():
        return "report.html", ""
    why = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()
    fallback = "report.md" if (dest / "report.md").is_file() else "report.json"
    return fallback, f"{src}: its page was not drawn ({why[-1]}); the matrix links {fallback}"


def summary_line(r: matrix.Row) -> str:
    """One row for the terminal: arch, stack, verdict, and each column's state and speed."""
    from .. import matrix

    cells = []
    for key, head in matrix.COLUMNS:
        cell = r.cells[key]
        speed = f" {cell.tflops:.3g} TFLOP/s" if cell.tflops is not None else ""
        cells.append(f"{head} {matrix.ICON[cell.state]}{speed}")
    return f"{r.arch} {r.stack}: {r.status}, SDPA picks {r.pick.text}; " + ", ".join(cells)


def reference(shape: str | None, mode: str) -> matrix.Reference:
    from .. import matrix

    if mode not in names.MODES:
        raise UserError(
            f"--mode {mode!r}: choose {', '.join(names.MODES[:-1])} or {names.MODES[-1]}"
        )
    return matrix.Reference(mode=mode, name=shape or None)


def write(output: Path, page: str, markdown: str, staged_reports: Path | None) -> None:
    """Put the new page in place only once everything is written: the report copies first (the
    old folder is swapped out, then removed), then matrix.md, then matrix.html."""
    if staged_reports is not None:
        swap_folder(staged_reports, output / FOLDER)
    for name, content in ((MARKDOWN, markdown), (PAGE, page)):
        write_aside(output / name, content)


@command(
    options={
        "reports": Opt("FILE", _existing_paths, positional=True, repeatable=True),
        "output": OUT_DIR,
        "shape": text("SHAPE"),
        "mode": choice("MODE", names.MODES),
    },  # fmt: skip
    help={
        "reports": "report.json files, folders holding them (searched recursively) or publish.json "
        "files, given without the flag (invoke matrix FILE...), repeated, or as a comma list "
        "(default: the reports folder, ATTNFORGE_REPORTS_DIR or reports/)",
        "output": "folder for matrix.html, matrix.md and a copy of each report (default: "
        "<reports folder>/matrix)",
        "shape": "bench shape name whose TFLOP/s the cells show (default: the sweep's seqlen "
        "4096, head dim 128, non-causal shape)",
        "mode": "bench mode for the speed figures: fwd (default), bwd or fwd_bwd",
        "html_reports": "draw each report's own HTML page next to its copy and link it (default "
        "on; --no-html-reports draws and links its Markdown only)",
        "debug": "show tracebacks",
    },
    name="matrix",
)
@user_errors
def matrix_task(c, reports=None, output=None, shape=None, mode="fwd", html_reports=True,
                debug=False):  # fmt: skip
    """Write a compatibility matrix of validation reports: matrix.html and matrix.md.

    Rows are arch x stack; columns are the SDPA backends, flash_attn and the bundled kernels;
    matrix.html is self-contained."""
    from .. import matrix

    ws = Workspace.discover()
    ref = reference(shape, mode)
    dest = Path(output) if output else ws.reports_dir / "matrix"
    given = [Path(p.strip()) for value in reports or [] for p in value.split(",") if p.strip()]
    if not given:
        if not ws.reports_dir.is_dir():
            raise UserError(
                f"{ws.reports_dir}: no reports folder",
                hint=f"run `invoke validate` first, or pass --reports (reports live under "
                f"${REPORTS_DIR_ENV}, default reports/)",
            )
        given = [ws.reports_dir]
    writable_folder(dest, "--output" if output else "the matrix folder")
    entries = load_entries(find(given, skip=dest.resolve()))
    kept, _ = matrix.newest(entries)
    dest.mkdir(parents=True, exist_ok=True)
    staging = dest / f".{FOLDER}-new-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        linked = []
        for entry in entries:
            if not any(entry is k for k in kept):
                linked.append(entry)
                continue
            arch, stack = matrix.row_key(entry)
            where = Path(safe(arch)) / safe(stack)
            name, problem = copy_report(entry, staging / where, ws.root, html_reports)
            if problem:
                out.print(problem, style="yellow", markup=False, highlight=False)
            linked.append(replace(entry, link=f"{FOLDER}/{where.as_posix()}/{name}"))
        created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        m = matrix.build(linked, created, ref)
        write(dest, matrix.to_html(m), matrix.to_markdown(m), staging if kept else None)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for line in m.left_out:
        out.print(f"left out (older): {line}", markup=False, highlight=False)
    for r in m.rows:
        out.print(summary_line(r), markup=False, highlight=False)
    out.print(f"wrote {dest / PAGE} and {dest / MARKDOWN} ({len(m.rows)} row(s))")
