"""The compatibility matrix: validation reports in, one table out (issue 17).

Rows are arch x stack with the versions that matter (ROCm, torch, AOTriton, flash-attention,
host kernel); columns are SDPA's backends, flash_attn and the bundled kernels, each cell saying
whether it works, why not in PyTorch's own words, and how fast it ran at a reference shape (from
the bench.json beside the report, when there is one). Pure: `build` takes documents the caller
loaded (attnforge/cli/matrix.py reads the files) and `to_markdown` / `to_html` return text; the
HTML page is self-contained (inline CSS, no script, no outside resource).
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from contract import names

from .errors import UserError

# (key, heading): SDPA's backends as validate/grid.py names them, then flash_attn and kernels;
# SDPA's own pick has the column "pick" before them (contract/names.py says which has a column).
SDPA_BACKENDS = names.SDPA_BACKENDS
PICK = "pick"
COLUMNS = tuple((b.column, b.label) for b in names.BACKENDS if b.column and b.column != PICK)
# Column -> the backend name bench.json uses (docs/validation.md, the bench document).
BENCH_NAMES = {b.column: b.name for b in names.BACKENDS if b.column}
VERSIONS = (
    ("rocm", "ROCm"),
    ("torch", "torch"),
    ("aotriton", "AOTriton"),
    ("flash_attn", "flash-attention"),
    ("kernel", "host kernel"),
)
# "pick" is the SDPA-picks column: a name, not a verdict.
STATES = ("works", "partial", "fails", "refused", "absent", "unknown", "pick")
ICON = {"works": "✅", "partial": "◐", "fails": "❌", "refused": "—", "absent": "∅", "unknown": "?",
        "pick": ""}  # fmt: skip
NOTED = ("works", "partial", "fails", "refused")  # states whose reason is shown (else a tooltip)
RUN_BAD = ("fail", "crash", "deferred-fault")
CHECK_BAD = names.FAILING
DTYPE_PREFERENCE = names.DTYPES  # the contract lists them in the order a row prefers them
NO_REPORT = "publish.json holds the validation verdict only; the full report was not given"


@dataclass(frozen=True)
class Reference:
    """The shape whose TFLOP/s the matrix shows. Default: flash-attention's benchmark sweep at
    seqlen 4096, head dim 128, not causal, forward (b=4, h=16 in `validate bench`'s sweep: the
    shape docs/benchmarks.md times the kernels at); bf16 where several dtypes ran. `name` picks
    one bench shape by its exact name instead."""

    seqlen: int = 4096
    head_dim: int = 128
    causal: bool = False
    mode: str = "fwd"
    family: str = "sweep"
    name: str | None = None

    def describe(self) -> str:
        if self.name:
            return f"bench shape {self.name}, {self.mode}"
        causal = "causal" if self.causal else "not causal"
        return (f"{self.family} shape at seqlen {self.seqlen}, head dim {self.head_dim}, "
                f"{causal}, {self.mode}")  # fmt: skip

    def matches(self, shape: dict[str, Any]) -> bool:
        if self.name:
            return shape.get("name") == self.name
        return (
            shape.get("family") == self.family
            and shape.get("sq") == self.seqlen
            and shape.get("sk") == self.seqlen
            and shape.get("d") == self.head_dim
            and bool(shape.get("causal")) == self.causal
        )

    def result(self, bench: dict[str, Any], backend: str) -> dict[str, Any] | None:
        """The bench result of `backend` at this shape and mode (bf16 first), or None."""
        found = [
            r for r in bench.get("results") or []
            if r.get("backend") == backend and r.get("mode") == self.mode
            and self.matches(r.get("shape") or {})
        ]  # fmt: skip

        def rank(r: dict[str, Any]) -> int:
            dtype = (r.get("shape") or {}).get("dtype")
            return DTYPE_PREFERENCE.index(dtype) if dtype in DTYPE_PREFERENCE else 99

        return min(found, key=rank) if found else None

    def nearest(self, bench: dict[str, Any]) -> Reference | None:
        """The benched shape closest to this one (same family and mode; then causal, head dim,
        sequence length on a log scale), as a Reference by name; None when this one was benched
        or nothing of its family and mode was (a named reference has no nearest)."""
        results = [r for r in bench.get("results") or [] if r.get("mode") == self.mode]
        if self.name or any(self.matches(r.get("shape") or {}) for r in results):
            return None
        shapes = {(r.get("shape") or {}).get("name"): r.get("shape") or {} for r in results
                  if (r.get("shape") or {}).get("family") == self.family
                  and r.get("status") == "ok"}  # fmt: skip

        def distance(item: tuple[str, dict[str, Any]]) -> tuple:
            name, s = item
            seq = max(int(s.get("sk") or 1), 1)
            return (bool(s.get("causal")) != self.causal, s.get("d") != self.head_dim,
                    abs(math.log2(seq / self.seqlen)), str(name))  # fmt: skip

        if not shapes:
            return None
        name, _ = min(shapes.items(), key=distance)
        return Reference(mode=self.mode, family=self.family, name=name)


@dataclass(frozen=True)
class Cell:
    """One backend on one arch x stack."""

    state: str  # one of STATES
    text: str  # a few words: "works", "2/3 cases", "refused", "not installed"
    reason: str = ""  # PyTorch's reason, the error, or why nothing is known
    tflops: float | None = None
    speed_note: str = ""  # why there is no speed figure ("" when there is one)


@dataclass(frozen=True)
class Entry:
    """What the caller loaded for one row: a report (or only a publish.json), its bench.json and
    publish.json when they lie beside it, where the row links to, and where it came from."""

    source: str
    report: dict[str, Any] | None = None
    bench: dict[str, Any] | None = None
    publish: dict[str, Any] | None = None
    link: str | None = None


@dataclass(frozen=True)
class Row:
    arch: str
    stack: str
    status: str  # pass | fail (the report's verdict, or publish.json's when that is all there is)
    device: str
    versions: dict[str, str]
    pick: Cell  # the backend SDPA picks by default, and its speed (bench's sdpa.default)
    cells: dict[str, Cell]
    link: str | None
    source: str
    validated_at: str
    published: tuple[str, ...] = ()  # pull references by digest
    broken: tuple[str, ...] = ()  # the expectations a failed report broke, and failed checks
    speed_at: str = ""  # the benched shape the speeds are of, where the reference was not benched


@dataclass(frozen=True)
class Matrix:
    rows: tuple[Row, ...]
    reference: Reference
    created: str
    left_out: tuple[str, ...] = field(default=())  # older reports of an arch x stack shown


# --- reports -> rows ----------------------------------------------------------------------


def row_key(entry: Entry) -> tuple[str, str]:
    """(arch, stack) of an entry: the report's own (from the stack's expect file), else its GPU's
    arch (or cpu) and the folder it sits in, reports/<arch>/<stack>/ (else "unknown")."""
    if entry.report is None:
        pub = entry.publish or {}
        return str(pub.get("arch") or "unknown"), str(pub.get("stack") or "unknown")
    r = entry.report
    devices = (r.get("environment") or {}).get("devices") or []
    arch = r.get("arch") or (devices[0].get("arch") if devices else None)
    if not arch and (r.get("environment") or {}).get("torch"):
        arch = "cpu"
    stack = r.get("stack") or (entry.publish or {}).get("stack")
    if not stack:
        parts = re.split(r"[\\/]", entry.source)
        stack = parts[-2] if len(parts) >= 2 and parts[-1] == "report.json" else None
    return str(arch or "unknown"), str(stack or "unknown")


def _manifest(entry: Entry) -> dict[str, Any]:
    """The image's versions manifest (/opt/attnforge/versions.json, as the env check records it,
    or the org.attnforge.versions label that publish.json copies)."""
    env = (entry.report or {}).get("environment") or {}
    found = env.get("image_versions") or (entry.publish or {}).get("versions") or {}
    return found if isinstance(found, dict) else {}


def kernel_release(platform_string: str | None) -> str | None:
    """'Linux-6.18.44-fc-v657-x86_64-with-glibc2.36' -> '6.18.44-fc-v657' (Python's
    platform.platform(): system-release-machine[-with-libc]; a container shares the host's
    kernel, so the suite's platform names the host's)."""
    if not platform_string:
        return None
    m = re.match(r"^Linux-(.+?)-(x86_64|aarch64|arm64|ppc64le|s390x|riscv64)(-with-.*)?$",
                 platform_string)  # fmt: skip
    return m.group(1) if m else None


def versions(entry: Entry) -> dict[str, str]:
    """The versions of a row that matter, as short strings ("—" when unknown or absent). What
    the report observed wins over what the image's manifest or the recipes claim: no AOTriton
    version where the env check found no AOTriton, no flash-attention commit where flash_attn
    does not import, no ROCm where torch is not a ROCm build."""
    r = entry.report or {}
    env = r.get("environment") or {}
    obs = r.get("observations") or {}
    t = env.get("torch") or {}
    man = _manifest(entry)
    pkgs = env.get("rocm_python_packages") or {}
    rocm = env.get("rocm_version") or pkgs.get("rocm-sdk-core") or pkgs.get("rocm")
    if not rocm and not t:  # nothing observed: the manifest's word
        rocm = (man.get("rocm-sdk") or man.get("pytorch-org") or {}).get("ROCM_VERSION")
    if not rocm and t.get("hip"):
        rocm = f"HIP {t['hip']}"
    if not rocm and t.get("cuda"):
        rocm = f"none (CUDA {t['cuda']})"
    if not rocm and t:
        rocm = "none"
    torch = t.get("version")
    if not torch:
        for layer in ("pytorch-wheels", "pytorch-org", "torch-cpu"):
            torch = torch or (man.get(layer) or {}).get("TORCH_VERSION")
        torch = torch or (man.get("pytorch-source") or {}).get("PYTORCH_BUILD_VERSION")
    knob = r.get("aotriton_knob") or {}
    aot_ref = (man.get("aotriton") or {}).get("SOURCE_REF")
    aotriton = knob.get("aotriton") or (f"source @{aot_ref[:12]}" if aot_ref else None)
    if not aotriton and env.get("aotriton_libs"):
        aotriton = "bundled (version not recorded)"
    elif not aotriton and entry.report is not None and env:
        aotriton = "none"
    if obs.get("aotriton.present") is False:  # the env check found no AOTriton library
        aotriton = "none"
    fa = env.get("flash_attn") or {}
    fa_ref = (man.get("flash-attention") or {}).get("SOURCE_REF")
    fa_text = fa.get("version") if fa.get("present") else None
    if fa_ref and (fa.get("present") or not fa):
        fa_text = f"{fa_text or ''} @{fa_ref[:12]}".strip()
    if not fa_text and fa:
        fa_text = "not installed"
    fp = (r.get("host") or {}).get("fingerprint") or {}
    kernel = fp.get("kernel") or kernel_release(
        env.get("platform") or (r.get("host") or {}).get("platform")
    )
    found = {"rocm": rocm, "torch": torch, "aotriton": aotriton, "flash_attn": fa_text,
             "kernel": kernel}  # fmt: skip
    return {k: str(v) if v else "—" for k, v in found.items()}


def _first_line(text: Any, limit: int = 400) -> str:
    s = " ".join(str(text or "").split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _why(entry: dict[str, Any]) -> str:
    """An SDPA backend's reason in PyTorch's words (can_use_* warnings), else its error."""
    reasons = [r for r in entry.get("reasons") or [] if r]
    if reasons:
        return "; ".join(reasons)
    return str(entry.get("error") or "")


def sdpa_cell(report: dict[str, Any], backend: str) -> Cell:
    """Whether one SDPA backend works over the report's cases: every forced run passed (works),
    some ran and the rest were refused (partial), any failed or faulted (fails), none ran
    (refused), each with the first case's reason."""
    runs = [
        (row["case"], row["backends"][backend])
        for row in report.get("backend_matrix") or []
        if backend in (row.get("backends") or {})
    ]
    if not runs:
        return Cell("unknown", "not checked", "the report has no SDPA case for this backend")
    bad = [(c, e) for c, e in runs if e.get("run") in RUN_BAD]
    passed = [c for c, e in runs if e.get("run") == "pass"]
    refused = [(c, e) for c, e in runs if e.get("run") not in RUN_BAD and e.get("run") != "pass"]

    def reason(items: list[tuple[str, dict[str, Any]]], verb: str) -> str:
        case, e = items[0]
        why = _why(e) or f"run: {e.get('run') or 'not run'}"
        more = f" (and {len(items) - 1} more case(s))" if len(items) > 1 else ""
        return _first_line(f"{case} {verb}: {why}{more}")

    if bad:
        text = "fails" if len(bad) == len(runs) else f"fails {len(bad)}/{len(runs)} cases"
        return Cell("fails", text, reason(bad, bad[0][1].get("run") or "failed"))
    if len(passed) == len(runs):
        # A forced run passes where the backend is switched off in the process (can_use_* says
        # "runtime disabled"): it works, but SDPA will not choose it.
        doubted = [(c, e) for c, e in runs if e.get("can_use") is False]
        if doubted:
            return Cell("works", "works when forced", reason(doubted, "can_use says no"))
        return Cell("works", "works", "")
    if passed:
        return Cell("partial", f"{len(passed)}/{len(runs)} cases", reason(refused, "refused"))
    return Cell("refused", "refused", reason(refused, "refused"))


def _checks(report: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return [c for c in report.get("checks") or [] if str(c.get("id", "")).startswith(prefix)]


def flash_attn_cell(report: dict[str, Any]) -> Cell:
    """The flash_attn package: its forward+backward check (flash_attn.run) and which backend."""
    info = next(iter(_checks(report, "flash_attn.info")), None)
    run = next(iter(_checks(report, "flash_attn.run")), None)
    if info is None and run is None:
        return Cell("unknown", "not checked", "the report has no flash_attn check")
    backend = (report.get("observations") or {}).get("flash_attn.backend")
    label = f" ({backend})" if backend and backend != "absent" else ""
    if run is not None and run.get("status") == "pass":
        return Cell("works", "works" + label, "")
    for check in (run, info):
        if check is not None and check.get("status") in CHECK_BAD:
            return Cell("fails", f"{check['status']}{label}", _first_line(check.get("message")))
    if info is not None and info.get("status") == "skip":
        if "not installed" in str(info.get("message", "")):
            return Cell("absent", "not installed", "")
        return Cell("unknown", "not run", _first_line(info.get("message")))
    why = (run or info or {}).get("message")
    return Cell("unknown", "not run", _first_line(why))


def kernels_cell(report: dict[str, Any]) -> Cell:
    """The bundled kernels: every kernels.case.* check, or why none ran."""
    cases = _checks(report, "kernels.case.")
    ran = [c for c in cases if c.get("status") != "skip"]
    bad = [c for c in ran if c.get("status") in CHECK_BAD]
    if bad:
        first = bad[0]
        return Cell("fails", f"fails {len(bad)}/{len(ran)} cases",
                    _first_line(f"{first['id'][len('kernels.case.'):]} {first['status']}: "
                                f"{first.get('message', '')}"))  # fmt: skip
    if ran:
        return Cell("works", f"works ({len(ran)} cases)", "")
    listing = next(iter(_checks(report, "kernels.list")), None)
    if listing is None:
        return Cell("unknown", "not checked", "the report has no kernels check")
    if listing.get("status") in CHECK_BAD:
        return Cell("fails", str(listing["status"]), _first_line(listing.get("message")))
    if listing.get("status") == "skip":
        return Cell("absent", "not present", _first_line(listing.get("message")))
    return Cell("unknown", "listed, not run",
                _first_line(f"kernels.list: {listing.get('message')}; no case ran in this "
                            "report"))  # fmt: skip


def with_speed(cell: Cell, bench: dict[str, Any] | None, backend: str, ref: Reference) -> Cell:
    """The cell with the TFLOP/s of `backend` at the reference shape, or why there is none."""
    if bench is None:
        return _replace(cell, speed_note="no bench.json beside the report")
    found = ref.result(bench, backend)
    if found is None:
        return _replace(cell, speed_note=f"bench.json has no {backend} result at the reference "
                                         "shape")  # fmt: skip
    if found.get("status") != "ok" or found.get("tflops") is None:
        note = f"bench: {found.get('status')}"
        if found.get("message"):
            note += f": {_first_line(found['message'], 200)}"
        return _replace(cell, speed_note=note)
    return _replace(cell, tflops=float(found["tflops"]), speed_note="")


def _replace(cell: Cell, **changes: Any) -> Cell:
    return Cell(**{**cell.__dict__, **changes})


def pick_cell(report: dict[str, Any]) -> Cell:
    """The backend SDPA picks by default (the reference case's), as the suite observed it."""
    obs = report.get("observations") or {}
    pick = obs.get("sdpa.default_backend")
    if not pick:
        picks = [r.get("default_backend") for r in report.get("backend_matrix") or []]
        pick = next((p for p in picks if p), None)
    if not pick:
        return Cell("unknown", "not checked", "the report has no SDPA case")
    return Cell("pick", str(pick), "")


def row(entry: Entry, ref: Reference) -> Row:
    arch, stack = row_key(entry)
    pub = entry.publish or {}
    published = tuple(
        f"{r['ref'].rsplit(':', 1)[0]}@{r['digest']}"
        for r in pub.get("refs") or []
        if r.get("digest") and str(r.get("ref", "")).endswith(f"/{stack}:{arch}")
    )
    if entry.report is None:
        passed = (pub.get("validation") or {}).get("passed")
        unknown = Cell("unknown", "no report", NO_REPORT)
        return Row(
            arch=arch, stack=stack, status="pass" if passed else "fail", device="—",
            versions=versions(entry), pick=unknown, cells={k: unknown for k, _ in COLUMNS},
            link=entry.link, source=entry.source, validated_at="—", published=published,
        )  # fmt: skip
    r = entry.report
    near = ref.nearest(entry.bench) if entry.bench else None
    at = near or ref  # the reference, or the benched shape nearest to it (said in the row)
    cells = {b: sdpa_cell(r, b) for b in SDPA_BACKENDS}
    cells["flash_attn"] = flash_attn_cell(r)
    cells["kernels"] = kernels_cell(r)
    cells = {k: with_speed(c, entry.bench, BENCH_NAMES[k], at) for k, c in cells.items()}
    devices = (r.get("environment") or {}).get("devices") or []
    device = str(devices[0].get("name")) if devices else "CPU"
    status = str((r.get("summary") or {}).get("status") or "fail")
    return Row(
        arch=arch, stack=stack, status=status, device=device, versions=versions(entry),
        pick=with_speed(pick_cell(r), entry.bench, BENCH_NAMES["pick"], at),
        cells=cells, link=entry.link, source=entry.source,
        validated_at=str(r.get("started_at") or "—"), published=published,
        broken=what_broke(r) if status != "pass" else (), speed_at=near.name if near else "",
    )  # fmt: skip


def what_broke(report: dict[str, Any]) -> tuple[str, ...]:
    """Why a report failed, in short: each broken expectation (key: promised, seen), then each
    required check that failed, crashed or timed out."""
    out = []
    for e in (report.get("expectations") or {}).get("results") or []:
        if e.get("status") == "broken":
            out.append(f"{e.get('key')}: promised {_plain(e.get('expected'))}, "
                       f"saw {_plain(e.get('observed'))}")  # fmt: skip
    out += [f"check {c}" for c in (report.get("summary") or {}).get("failed_required") or []]
    return tuple(out)


def _plain(value: Any) -> str:
    if isinstance(value, list):
        return " or ".join(_plain(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def _started(entry: Entry) -> str:
    return str((entry.report or {}).get("started_at") or "")


# Copies of a report that attnforge keeps beside the current one (attnforge/baseline/store.py):
# reports/<arch>/<stack>/baseline/ (the last passing --bench run) and published/<digest>/.
COPY_FOLDERS = ("baseline", "published")


def is_copy(source: str) -> bool:
    """Whether a report is one of attnforge's kept copies, never an arch x stack's current
    result: reports/<arch>/<stack>/baseline/report.json or .../published/<digest>/report.json."""
    parts = re.split(r"[\\/]", source)
    return (len(parts) >= 2 and parts[-2] == COPY_FOLDERS[0]) or (
        len(parts) >= 3 and parts[-3] == COPY_FOLDERS[1])  # fmt: skip


def _recency(entry: Entry) -> tuple:
    """Newest first, deterministically: a current report before a kept copy, then the run's
    start, its id (time to the microsecond), its end, and last the path."""
    r = entry.report or {}
    started = _started(entry)
    end = ""
    try:
        begun = datetime.fromisoformat(started.replace("Z", "+00:00"))
        end = (begun + timedelta(seconds=float(r.get("duration_s") or 0))).isoformat()
    except ValueError:
        pass
    return (not is_copy(entry.source), started, str(r.get("run_id") or ""), end, entry.source)


def newest(entries: list[Entry]) -> tuple[list[Entry], list[tuple[Entry, Entry]]]:
    """The newest entry of each arch x stack (see _recency: a kept baseline or published copy
    never wins over the current report, and equal times are settled the same way whatever the
    input order), in input order, and (older, newer) for each one left out."""
    best: dict[tuple[str, str], Entry] = {}
    for e in sorted(entries, key=_recency, reverse=True):
        best.setdefault(row_key(e), e)
    kept = [e for e in entries if best[row_key(e)] is e]
    left = [(e, best[row_key(e)]) for e in entries if best[row_key(e)] is not e]
    return kept, left


def build(entries: list[Entry], created: str, ref: Reference | None = None) -> Matrix:
    """One row per arch x stack, sorted by arch and stack; where several reports name the same
    pair, the newest is shown and the others are listed in `left_out`."""
    ref = ref or Reference()
    if ref.name and not any(
        (r.get("shape") or {}).get("name") == ref.name
        for e in entries for r in (e.bench or {}).get("results") or []
    ):  # fmt: skip
        names = sorted({(r.get("shape") or {}).get("name") for e in entries
                        for r in (e.bench or {}).get("results") or []} - {None})  # fmt: skip
        raise UserError(
            f"--shape {ref.name}: no report's bench.json has a result at that shape",
            hint=(f"choose one of {', '.join(names[:12])}" + (", ..." if len(names) > 12 else ""))
            if names else "no report given has a bench.json beside it",
        )  # fmt: skip
    kept, left = newest(entries)
    rows = sorted((row(e, ref) for e in kept), key=lambda r: (r.arch, r.stack))
    left_out = tuple(
        f"{old.source} ({' '.join(row_key(old))}, {_started(old) or 'no date'}): "
        f"{new.source} is newer"
        for old, new in left
    )
    return Matrix(rows=tuple(rows), reference=ref, created=created, left_out=left_out)


# --- writers ------------------------------------------------------------------------------

LEGEND = (
    ("works", "every forced run passed against the fp32 reference"),
    ("partial", "passed on some cases; PyTorch refused the others"),
    ("fails", "a run failed, crashed or faulted"),
    ("refused", "PyTorch refused every case (its reason is given)"),
    ("absent", "not installed in this stack"),
    ("unknown", "not checked in this report"),
)


def _speed(cell: Cell) -> str:
    return f"{cell.tflops:.0f} TFLOP/s" if cell.tflops is not None and cell.tflops >= 10 else (
        f"{cell.tflops:.3g} TFLOP/s" if cell.tflops is not None else "")  # fmt: skip


def _md(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def to_markdown(m: Matrix) -> str:
    """A Markdown table (a CI step summary or a README), the reasons as numbered notes."""
    notes: list[str] = []

    def cell_md(cell: Cell) -> str:
        text = f"{ICON[cell.state]} {cell.text}".strip()
        if cell.tflops is not None:
            text += f" · {_speed(cell)}"
        if cell.reason and cell.state in NOTED:
            notes.append(cell.reason)
            text += f" [{len(notes)}]"
        return _md(text)

    head = ["arch", "stack", "status", "device", *(h for _, h in VERSIONS), "SDPA picks",
            *(h for _, h in COLUMNS), "report"]  # fmt: skip
    out = [
        "# Compatibility matrix",
        "",
        f"Speed: TFLOP/s at the reference shape ({m.reference.describe()}) from each report's "
        "bench.json; none where no bench ran. Generated " + m.created + ".",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]

    def noted(text: str, note: str) -> str:
        if not note:
            return text
        notes.append(note)
        return f"{text} [{len(notes)}]"

    for r in m.rows:
        link = f"[report]({r.link})" if r.link else _md(r.source)
        status = "✅ pass" if r.status == "pass" else "❌ fail"
        status = noted(status, "broke " + "; ".join(r.broken) if r.broken else "")
        pick = cell_md(r.pick)
        pick = noted(pick, f"speeds of {r.arch} {r.stack} are at {r.speed_at}, the benched shape "
                     "nearest to the reference" if r.speed_at else "")  # fmt: skip
        cells = [
            f"`{_md(r.arch)}`", f"`{_md(r.stack)}`", _md(status), _md(r.device),
            *(_md(r.versions[k]) for k, _ in VERSIONS), _md(pick),
            *(cell_md(r.cells[k]) for k, _ in COLUMNS), link,
        ]  # fmt: skip
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append("Legend: " + "; ".join(f"{ICON[s]} {s}: {d}" for s, d in LEGEND) + ".")
    if notes:
        out += ["", "Reasons:", ""]
        out += [f"{i}. {_md(n)}" for i, n in enumerate(notes, 1)]
    published = [(r, p) for r in m.rows for p in r.published]
    if published:
        out += ["", "Published (pull by digest):", ""]
        out += [f"- {r.arch} {r.stack}: `{p}`" for r, p in published]
    if m.left_out:
        out += ["", "Older reports of an arch and stack shown above, left out:", ""]
        out += [f"- {_md(x)}" for x in m.left_out]
    return "\n".join(out) + "\n"


# The page uses text symbols that common fonts carry (emoji fonts are not everywhere).
HTML_ICON = {"works": "✓", "partial": "◐", "fails": "✗", "refused": "—", "absent": "∅",
             "unknown": "?", "pick": ""}  # fmt: skip

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1600px;
 padding:1em 1.5em;color:#222;line-height:1.3}
h1{margin-bottom:.2em}code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.92em}
div.scroll{overflow-x:auto}
table{border-collapse:collapse;margin:.8em 0;font-size:.84em}
td,th{border:1px solid #ccc;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4}thead tr.group th{background:#e8e8e8;text-align:center}
td.works{background:#dcf2df}td.partial{background:#fff3cd}td.fails{background:#f8d7da}
td.refused,td.absent{background:#eee;color:#444}td.unknown{background:#fff;color:#666}
td.pick{background:#f7f9ff}td.ver{font-size:.9em}
td.ver span{white-space:nowrap}td.row{min-width:11em;max-width:13em;overflow-wrap:anywhere}ul.broke{margin:.2em 0;padding-left:1.1em;color:#b00020;
 font-size:.85em;max-width:13em;overflow-wrap:anywhere}figure.chart{margin:1em 0}figure.chart svg{max-width:100%;height:auto}
.state{font-weight:600}
.speed{display:block;font-variant-numeric:tabular-nums;font-weight:600;white-space:nowrap}
.why{display:block;font-size:.85em;color:#444;min-width:7em;max-width:11em;overflow-wrap:anywhere}
.nospeed{display:block;font-size:.85em;color:#777;white-space:nowrap}
.pass{color:#0a6b1f;font-weight:600}.fail{color:#b00020;font-weight:600}
.small{font-size:.85em;color:#555}ul.legend{padding-left:1.2em}
.legend span{display:inline-block;width:1.2em;height:1em;border:1px solid #bbb;
 vertical-align:middle;margin-right:.4em}
span.works{background:#dcf2df}span.partial{background:#fff3cd}span.fails{background:#f8d7da}
span.refused,span.absent{background:#eee}span.unknown{background:#fff}
"""


def _h(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _td(cell: Cell, limit: int = 110) -> str:
    """A backend cell: state, speed (or why none, on hover), and the reason (the whole text on
    hover where it is cut)."""
    label = f"{HTML_ICON[cell.state]} {cell.text}".strip()
    body = f"<span class='state'>{_h(label)}</span>"
    if cell.tflops is not None:
        body += f"<span class='speed'>{_h(_speed(cell))}</span>"
    elif cell.speed_note and cell.state in ("works", "partial", "pick"):
        body += f"<span class='nospeed' title='{_h(cell.speed_note)}'>speed —</span>"
    if cell.reason and cell.state in NOTED:
        short = cell.reason if len(cell.reason) <= limit else cell.reason[: limit - 1] + "…"
        body += f"<span class='why' title='{_h(cell.reason)}'>{_h(short)}</span>"
    title = f" title='{_h(cell.reason)}'" if cell.reason and cell.state not in NOTED else ""
    return f"<td class='{cell.state}'{title}>{body}</td>"


def _version(text: str) -> str:
    """A version cell: it wraps between words only, never inside a version or a commit."""
    return " ".join(f"<span>{_h(t)}</span>" for t in text.split())


def speed_chart(m: Matrix) -> str:
    """TFLOP/s per backend across the rows (arch x stack) at the reference shape, as a figure
    (inline SVG drawn by matplotlib, validate/plots.py's colours), or a sentence why not."""
    from validate import plots  # the suite's own plotting: stdlib at import, matplotlib to draw

    keys = [(PICK, names.backend(BENCH_NAMES[PICK]).label), *COLUMNS]
    rows = [r for r in m.rows
            if any(c.tflops for c in (r.pick, *r.cells.values()))]  # fmt: skip
    if not rows:
        return "<p class='small'>No row has a speed at the reference shape: no chart.</p>"
    try:
        fig, axes = plots.small_multiples(1, 1, 9.0, 1.0 + 0.5 * len(rows) * 1.6)
    except plots.PlotsUnavailable:
        return ("<p class='small'>(The speed chart belongs here: this page was written by a "
                "Python without matplotlib.)</p>")  # fmt: skip
    ax = axes[0][0]
    col = plots.colours([BENCH_NAMES[k] for k, _ in keys])
    shown = [(k, head) for k, head in keys
             if any((r.pick if k == "pick" else r.cells[k]).tflops for r in rows)]  # fmt: skip
    height = 0.8 / max(1, len(shown))
    for i, (k, head) in enumerate(shown):
        ys = [n + (i - (len(shown) - 1) / 2) * height for n in range(len(rows))]
        xs = [(r.pick if k == "pick" else r.cells[k]).tflops or 0 for r in rows]
        ax.barh(ys, xs, height, color=col[BENCH_NAMES[k]], label=head)
        for y, x in zip(ys, xs, strict=True):
            if x:
                ax.text(x, y, f" {x:.0f}" if x >= 10 else f" {x:.2g}", va="center", fontsize=6)
    labels = [f"{r.arch} · {r.stack}" + (f"\n(at {r.speed_at})" if r.speed_at else "")
              for r in rows]  # fmt: skip
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    speeds = [c.tflops for r in rows for c in (r.pick, *r.cells.values()) if c.tflops]
    log = min(speeds) < max(speeds) / 1000  # a CPU row beside a GPU row: both readable
    if log:
        ax.set_xscale("log")
        ax.set_xlim(left=min(speeds) / 3, right=max(speeds) * 4)
    ax.set_xlabel("TFLOP/s" + (" (log scale)" if log else ""), fontsize=8)
    fig.legend(loc="outside right upper", fontsize=8)
    fig.suptitle(f"TFLOP/s per backend at {m.reference.describe()}", fontsize=10)
    return f"<figure class='plot chart' id='plot-speed'>{plots.inline_svg(fig, 'speed')}</figure>"


def _first_td(r: Row) -> str:
    """arch and stack, the verdict, the device and date, and the links."""
    name = f"<code>{_h(r.arch)}</code> · <code>{_h(r.stack)}</code>"
    verdict = "pass" if r.status == "pass" else "fail"
    cell = (f"<b>{name}</b><br><span class='{verdict}'>{verdict}</span> · {_h(r.device)}"
            + ("<ul class='broke'>" + "".join(f"<li>{_h(b)}</li>" for b in r.broken) + "</ul>"
               if r.broken else "<br>")
            + f"<span class='small'>{_h(r.validated_at)}</span><br>")  # fmt: skip
    if r.speed_at:
        cell += (f"<span class='small'>speed at <code>{_h(r.speed_at)}</code> (nearest benched "
                 "shape)</span><br>")  # fmt: skip
    cell += (f"<a href='{_h(r.link)}'>full report</a>" if r.link
             else f"<span class='small'>{_h(r.source)}</span>")  # fmt: skip
    cell += "".join(f"<br><code class='small'>{_h(p)}</code>" for p in r.published)
    return f"<td class='row'>{cell}</td>"


def to_html(m: Matrix) -> str:
    """One self-contained page: inline CSS, no script, nothing fetched."""
    version_heads = "".join(f"<th>{_h(h)}</th>" for _, h in VERSIONS)
    backend_heads = "".join(f"<th>{_h(h)}</th>" for _, h in COLUMNS)
    head = (
        "<thead><tr class='group'><th></th>"
        f"<th colspan='{len(VERSIONS)}'>versions</th>"
        f"<th colspan='{len(COLUMNS) + 1}'>attention backends</th></tr>"
        f"<tr><th>arch · stack</th>{version_heads}<th>SDPA picks</th>{backend_heads}</tr></thead>"
    )
    body = [
        "<tr>" + _first_td(r)
        + "".join(f"<td class='ver'>{_version(r.versions[k])}</td>" for k, _ in VERSIONS)
        + _td(r.pick) + "".join(_td(r.cells[k]) for k, _ in COLUMNS) + "</tr>"
        for r in m.rows
    ]  # fmt: skip
    legend = "".join(
        f"<li><span class='{s}'></span>{HTML_ICON[s]} <b>{_h(s)}</b>: {_h(d)}</li>"
        for s, d in LEGEND
    )
    extra = ""
    if m.left_out:
        extra = ("<h2>Left out</h2><p>Older reports of an arch and stack shown above:</p><ul>"
                 + "".join(f"<li>{_h(x)}</li>" for x in m.left_out) + "</ul>")  # fmt: skip
    rows_html = "".join(body) or (
        f"<tr><td colspan='{2 + len(VERSIONS) + len(COLUMNS)}'>no report</td></tr>"
    )
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>attnforge compatibility matrix</title><style>{CSS}</style></head><body>"
        "<section id='matrix'><h1>Compatibility matrix</h1>"
        f"<p class='small'>{len(m.rows)} arch × stack row(s), generated {_h(m.created)} by "
        "<code>invoke matrix</code> from validation reports. Each backend cell: whether it works "
        "in the stack (forced runs judged against an fp32 reference), PyTorch's reason where it "
        f"does not, and TFLOP/s at the reference shape ({_h(m.reference.describe())}) from the "
        "report's bench.json (hover <i>speed —</i> for why there is none).</p>"
        f"<div class='scroll'><table>{head}<tbody>{rows_html}</tbody></table></div></section>"
        f"<section id='speed'><h2>Speed</h2>{speed_chart(m)}</section>"
        f"<section id='legend'><h2>Legend</h2><ul class='legend'>{legend}</ul>{extra}</section>"
        "</body></html>\n"
    )
