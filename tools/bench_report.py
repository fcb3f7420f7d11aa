"""Markdown tables and PNG plots from `python -m attnforge_kernels.bench --json FILE` output.

    python tools/bench_report.py --out docs/benchmarks [--page docs/benchmarks.md]
                                 [--date YYYY-MM-DD] [--peak TFLOPS] FILE.json [FILE.json ...]

Each FILE is what one `python -m attnforge_kernels.bench ... --json FILE` wrote: the sweep (`rows`,
with `memory`), `--workloads` (`workload_rows`), `--decode` (`decode_rows`; `gpu_time` says whether
it timed the GPU alone) or `--host` (`host_us`). For each, OUT gets NAME.md (the tables) and, for
the workload and decode files, NAME.png (the plot), where NAME is sweep, workloads, decode,
decode-gpu or host. With --page, the block between `<!-- bench_report:NAME -->` and
`<!-- /bench_report:NAME -->` in that page is replaced by NAME.md's tables. --date is the day the
figures were measured (default: the JSON file's modification date, UTC); --peak the device's dense
16-bit TFLOP/s, for the workload rows' shares of it (default: DENSE_PEAKS by the device's name).
Every file is written aside first and all are renamed into place at the end, so a failed run
leaves the last good tables, plots and page as they were.
Host side only: the standard library and matplotlib.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import tempfile
from pathlib import Path


class ReportError(Exception):
    """A bad input file, option or page, in one sentence."""


KINDS = {"rows": "sweep", "workload_rows": "workloads", "decode_rows": "decode", "host_us": "host"}
NAMES = {"ours": "ours", "sdpa-flash": "SDPA-flash", "sdpa-cudnn": "SDPA-cuDNN",
         "sdpa-efficient": "SDPA-efficient"}  # fmt: skip


def label(provider: str) -> str:
    return NAMES.get(provider, provider)


def load(path: Path, date: str | None, peak: float | None = None) -> tuple[str, dict]:
    """(NAME, the document with `_date`, `_file` and `_peak` (--peak, or None) added) of one
    bench JSON file."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: cannot read it as JSON ({e}).") from None
    kind = next((KINDS[k] for k in KINDS if isinstance(doc, dict) and k in doc), None)
    if kind is None:
        raise ReportError(
            f"{path}: not the JSON of `python -m attnforge_kernels.bench --json` (it has none of "
            f"{', '.join(KINDS)})."
        )
    if kind == "decode" and doc.get("gpu_time"):
        kind = "decode-gpu"
    if date is None:
        mtime = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)
        date = mtime.strftime("%Y-%m-%d")
    return kind, {**doc, "_date": date, "_file": path.name, "_peak": peak}


def provenance(doc: dict) -> str:
    device = doc.get("device", "device not recorded")
    soft = ", ".join(f"{k} {doc[k]}" for k in ("torch", "triton") if doc.get(k))
    rounds = doc.get("rounds", 1)
    best = f"; each time the best of {rounds} rounds, every provider in turn" if rounds > 1 else ""
    return f"*{doc['_date']}, {device}{', ' + soft if soft else ''}{best}; from `{doc['_file']}`.*"


def fmt(value, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def ratio(a, b) -> float | None:
    return a / b if a and b else None


def cell(r: float | None) -> str:
    """A speed ratio, bold at or above 1.00."""
    if r is None:
        return "n/a"
    return f"**{r:.2f}**" if round(r, 2) >= 1.0 else f"{r:.2f}"


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def sweep_tables(doc: dict) -> str:
    """TFLOP/s at the sweep shapes with ours over each SDPA backend, and the memory peaks."""
    rows = doc["rows"]
    names = list(rows[0]["tflops"]) if rows else []
    head = ["shape (b,h,s,d)", "causal", "mode", *map(label, names), "ours/flash", "ours/cuDNN"]
    body = [
        [f"({', '.join(map(str, r['shape']))})", "yes" if r["causal"] else "no", r["mode"],
         *(fmt(r["tflops"][n]) for n in names),
         cell(ratio(r["tflops"].get("ours"), r["tflops"].get("sdpa-flash"))),
         cell(ratio(r["tflops"].get("ours"), r["tflops"].get("sdpa-cudnn")))]
        for r in rows
    ]  # fmt: skip
    out = [provenance(doc), "", headline(rows), "", "TFLOP/s:", "", table(head, body)]
    mem = doc.get("memory")
    if mem:
        probes = {n: m for n, m in mem.items() if isinstance(m, dict)}
        flash = probes.get("sdpa-flash", {}).get("peak_bytes")
        mrows = [
            [label(n), f"{m['peak_bytes'] / 2**20:.0f} MiB", fmt(ratio(m["peak_bytes"], flash), 2)]
            if "peak_bytes" in m
            else [label(n), f"error: {m.get('error', 'not measured')}", "n/a"]
            for n, m in probes.items()
        ]
        shape = ",".join(map(str, mem["shape"]))
        out += ["", f"Peak memory, {mem['mode']} at ({shape}) bf16, inputs included:", "",
                table(["", "peak", "ratio to SDPA-flash"], mrows)]  # fmt: skip
    return "\n".join(out)


def headline(rows: list[dict]) -> str:
    """The figures README quotes: ours over SDPA-flash at the first shape, not causal, per mode."""
    if not rows:
        return "No rows."
    shape = rows[0]["shape"]
    picks = [r for r in rows if r["shape"] == shape and not r["causal"]]
    cells = ", ".join(
        f"{r['mode']} {fmt(ratio(r['tflops'].get('ours'), r['tflops'].get('sdpa-flash')), 2)}x"
        for r in picks
    )
    return f"At ({', '.join(map(str, shape))}), not causal, ours over SDPA-flash: {cells}."


def workload_grid(doc: dict) -> tuple[list[str], list[tuple[str, str]], dict]:
    """(shape names in order, (mode, layout) columns in order, {(name, mode, layout): tflops})."""
    shapes, cols, cells = [], [], {}
    for r in doc["workload_rows"]:
        if r["name"] not in shapes:
            shapes.append(r["name"])
        if (r["mode"], r["layout"]) not in cols:
            cols.append((r["mode"], r["layout"]))
        cells[(r["name"], r["mode"], r["layout"])] = r["tflops"]
    cols.sort(key=lambda c: c[0] != "fwd")  # stable: the layouts in the order they ran
    return shapes, cols, cells


def ours_providers(doc: dict) -> list[str]:
    """The workload file's providers that are ours: the default path, then each --variant."""
    rows = doc["workload_rows"]
    return [n for n in (rows[0]["tflops"] if rows else {}) if n.startswith("ours")]


def workload_ratios(doc: dict, provider: str, baseline: str) -> tuple[list[list[str]], dict]:
    """Table rows of provider/baseline per shape and column, and the count at or above 1.00."""
    shapes, cols, cells = workload_grid(doc)
    counts = {mode: [0, 0] for mode, _ in cols}
    rows = []
    for name in shapes:
        row = [name]
        for mode, layout in cols:
            tf = cells.get((name, mode, layout), {})
            r = ratio(tf.get(provider), tf.get(baseline))
            row.append(cell(r))
            counts[mode][1] += 1
            counts[mode][0] += r is not None and round(r, 2) >= 1.0
        rows.append(row)
    return rows, counts


def workload_tables(doc: dict) -> str:
    """A table of ratios per ours provider against SDPA-flash and against cuDNN, then the
    all-Triton path's and cuDNN's shares of the device's dense peak (the document's `_peak`
    TFLOP/s, else DENSE_PEAKS's figure for the device)."""
    _, cols, _ = workload_grid(doc)
    head = ["shape", *(f"{m} {lay}" for m, lay in cols)]
    out = [provenance(doc)]
    pairs = [(p, base) for base in ("sdpa-flash", "sdpa-cudnn") for p in ours_providers(doc)]
    for provider, baseline in pairs:
        rows, counts = workload_ratios(doc, provider, baseline)
        tally = ", ".join(f"{m}: {a} of {n}" for m, (a, n) in counts.items())
        out += ["", f"{label(provider)} / {label(baseline)} (TFLOP/s over TFLOP/s; bold: at or "
                f"above 1.00; {tally} at or above):", "", table(head, rows)]  # fmt: skip
    out.append(workload_peak_shares(doc, doc.get("_peak") or dense_peak(doc.get("device"))))
    return "\n".join(out)


# Dense (no sparsity) 16-bit tensor-core throughput in TFLOP/s, by what the device's name holds
# (the first match counts, so the PCIe and NVL parts come before their SXM names). NVIDIA's
# datasheets give BF16/FP16 with sparsity, twice these: H100 SXM 1,979, PCIe 1,513, NVL 1,671
# (https://www.nvidia.com/en-us/data-center/h100/; the H100 architecture whitepaper gives SXM5's
# dense figure as 989.4); H200 SXM 1,979, NVL 1,671 (https://www.nvidia.com/en-us/data-center/h200/).
# AMD Instinct MI300X and MI325X: 1,307.4 dense BF16
# (https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html, .../mi325x.html).
DENSE_PEAKS = [
    ("H100 PCIe", 756.5), ("H100 NVL", 835.5), ("H200 NVL", 835.5), ("H100", 989.4),
    ("H200", 989.4), ("MI300X", 1307.4), ("MI325X", 1307.4),
]  # fmt: skip


def dense_peak(device: str | None) -> float | None:
    """The dense 16-bit peak of a device by its name, None where the table has none."""
    return next((tf for key, tf in DENSE_PEAKS if key in (device or "")), None)


def workload_peak_shares(doc: dict, peak: float | None) -> str:
    """Each workload cell of the all-Triton path (where run) and SDPA-cuDNN as a percentage of the
    device's dense 16-bit peak."""
    device = doc.get("device", "device not recorded")
    if peak is None:
        return (f"No dense 16-bit peak is known for {device} (tools/bench_report.py DENSE_PEAKS; "
                "--peak gives one), so no shares of it.")  # fmt: skip
    shapes, cols, cells = workload_grid(doc)
    ours = [p for p in ours_providers(doc) if p != "ours"] or ["ours"]
    out = []
    for provider in (ours[0], "sdpa-cudnn"):
        rows = [
            [name, *(fmt(100 * t / peak if (t := cells.get((name, m, lay), {}).get(provider))
                         else None, 0) for m, lay in cols)]
            for name in shapes
        ]  # fmt: skip
        out += ["", f"{label(provider)} as % of the dense 16-bit peak ({peak:g} TFLOP/s, "
                f"{device}):", "", table(["shape", *(f"{m} {lay}" for m, lay in cols)], rows)]  # fmt: skip
    return "\n".join(out)


def workload_tflops(doc: dict) -> str:
    """Every workload row in TFLOP/s, as measured (the ratio tables' inputs)."""
    rows = doc["workload_rows"]
    names = list(rows[0]["tflops"]) if rows else []
    body = [
        [r["name"], r["layout"], r["mode"], *(fmt(r["tflops"][n]) for n in names)] for r in rows
    ]
    return "\n".join(
        [provenance(doc), "", table(["shape", "layout", "mode", *map(label, names)], body)]
    )


def best_sdpa(us: dict) -> tuple[str | None, float | None]:
    sdpa = {n: t for n, t in us.items() if not n.startswith("ours") and t is not None}
    best = min(sdpa, key=sdpa.get) if sdpa else None
    return best, sdpa.get(best)


def decode_tables(doc: dict) -> str:
    """µs per decoding step per provider, the best SDPA backend and its time over ours."""
    rows = doc["decode_rows"]
    names = list(rows[0]["us"]) if rows else []
    head = ["batch", "cache", *(f"{label(n)} µs" for n in names), "best SDPA",
            "best SDPA / ours"]  # fmt: skip
    body, ahead = [], 0
    for r in rows:
        best, best_us = best_sdpa(r["us"])
        speed = ratio(best_us, r["us"].get("ours"))
        ahead += speed is not None and round(speed, 2) >= 1.0
        body.append([str(r["batch"]), str(r["cache"]), *(fmt(r["us"][n]) for n in names),
                     label(best) if best else "n/a", cell(speed)])  # fmt: skip
    timing = (
        "GPU time alone (`--gpu-time`: CUDA graphs of flushed steps less the flushes)"
        if doc.get("gpu_time")
        else "medians of `do_bench` with the L2 flushed before each step, host time included"
    )
    heads = doc.get("heads", [])
    gqa = f"GQA {heads[0]}/{heads[1]}, d={heads[2]}, " if len(heads) == 3 else ""
    return "\n".join([
        provenance(doc), "",
        f"µs per step ({gqa}bf16, one query token; {timing}); bold: ours at or above the best "
        f"SDPA backend, {ahead} of {len(rows)} rows:", "", table(head, body),
    ])  # fmt: skip


def host_table(doc: dict) -> str:
    rows = [[name, fmt(us)] for name, us in doc["host_us"].items()]
    return "\n".join([provenance(doc), "", table(["call", "µs per call"], rows)])


def pyplot():
    """matplotlib's pyplot on the Agg backend: files only, no display needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_workloads(doc: dict, path: Path) -> None:
    """Horizontal bars of every ours provider over SDPA-flash, one panel per mode."""
    plt = pyplot()
    shapes, cols, cells = workload_grid(doc)
    modes = list(dict.fromkeys(m for m, _ in cols))
    series = [(p, lay) for p in ours_providers(doc) for lay in
              dict.fromkeys(lay for _, lay in cols)]  # fmt: skip
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 0.45 * len(shapes) + 2),
                             sharey=True, squeeze=False)  # fmt: skip
    height = 0.8 / max(len(series), 1)
    for ax, mode in zip(axes[0], modes, strict=True):
        for i, (prov, lay) in enumerate(series):
            vals = [ratio(cells.get((s, mode, lay), {}).get(prov),
                          cells.get((s, mode, lay), {}).get("sdpa-flash")) or 0 for s in shapes]  # fmt: skip
            ys = [y + i * height for y in range(len(shapes))]
            ax.barh(ys, vals, height=height, label=f"{label(prov)}, {lay}")
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_title(f"{mode}: over SDPA-flash (TFLOP/s ratio)")
        ax.set_yticks([y + 0.4 - height / 2 for y in range(len(shapes))], shapes)
    axes[0][0].invert_yaxis()  # the panels share the axis: the table's first shape on top
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", ncol=len(series))
    fig.suptitle(f"Workload shapes, {doc.get('device', '')}, {doc['_date']}")
    save(fig, path, bottom=0.9 / (0.45 * len(shapes) + 2))


def plot_decode(doc: dict, path: Path) -> None:
    """Best SDPA over ours per cache length, one line per batch, and ours' µs per step."""
    plt = pyplot()
    by_batch: dict = {}
    for r in doc["decode_rows"]:
        _, best_us = best_sdpa(r["us"])
        by_batch.setdefault(r["batch"], []).append((r["cache"], ratio(best_us, r["us"].get("ours")),
                                                    r["us"].get("ours")))  # fmt: skip
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for batch, pts in by_batch.items():
        xs = [c for c, _, _ in pts]
        left.plot(xs, [s or 0 for _, s, _ in pts], marker="o", label=f"batch {batch}")
        right.plot(xs, [u or 0 for _, _, u in pts], marker="o", label=f"batch {batch}")
    left.axhline(1.0, color="black", linewidth=1)
    left.set_title("best SDPA backend's time over ours (above 1: ours faster)")
    right.set_title("ours, µs per step")
    right.set_yscale("log")
    caches = sorted({r["cache"] for r in doc["decode_rows"]})
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(caches, [f"{c // 1024}k" if c % 1024 == 0 else str(c) for c in caches])
        ax.set_xlabel("cache length (keys)")
    left.legend(fontsize="small")
    timing = "GPU time alone" if doc.get("gpu_time") else "do_bench, host time included"
    fig.suptitle(f"Decoding, {doc.get('device', '')}, {doc['_date']} ({timing})")
    save(fig, path)


def save(fig, path: Path, bottom: float = 0.0) -> None:
    plt = pyplot()
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def staged(path: Path) -> Path:
    """A new temporary file beside ``path``, to be renamed onto it once everything is written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    # mkstemp makes it private (0600); the page and plots are docs, readable as any file is
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    return Path(tmp)


def write_all(out: Path, blocks: dict, docs: dict, page: tuple[Path, str] | None) -> None:
    """NAME.md and NAME.png for every block, and the page: each written beside its place first,
    then all renamed into place, so an error on the way leaves every old file as it was."""
    out.mkdir(parents=True, exist_ok=True)
    moves: list[tuple[Path, Path]] = []
    try:
        for name, text in blocks.items():
            extra = "\n\n" + workload_tflops(docs[name]) if name == "workloads" else ""
            moves.append((staged(out / f"{name}.md"), out / f"{name}.md"))
            moves[-1][0].write_text(with_plot(text, f"{name}.png") + extra + "\n")
            if name in PLOTS:
                moves.append((staged(out / f"{name}.png"), out / f"{name}.png"))
                PLOTS[name](docs[name], moves[-1][0])
        if page is not None:
            moves.append((staged(page[0]), page[0]))
            moves[-1][0].write_text(page[1])
    except BaseException:
        for tmp, _ in moves:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, final in moves:
        os.replace(tmp, final)


RENDER = {"sweep": sweep_tables, "workloads": workload_tables, "decode": decode_tables,
          "decode-gpu": decode_tables, "host": host_table}  # fmt: skip
PLOTS = {"workloads": plot_workloads, "decode": plot_decode, "decode-gpu": plot_decode}


def with_plot(block: str, link: str) -> str:
    """The block with its plot's image after the first line (the provenance), where it has one."""
    name = Path(link).stem
    if name not in PLOTS:
        return block
    first, _, rest = block.partition("\n")
    return f"{first}\n\n![{name}: the table below as a plot]({link})\n{rest}"


def splice(page: str, blocks: dict[str, str], page_name: str) -> str:
    """The page with each named block's text between its two markers."""
    for name, text in blocks.items():
        pattern = re.compile(
            rf"(<!-- bench_report:{re.escape(name)} -->\n).*?(\n<!-- /bench_report:{re.escape(name)} -->)",
            re.S,
        )
        if not pattern.search(page):
            raise ReportError(
                f"{page_name}: no `<!-- bench_report:{name} -->` ... "
                f"`<!-- /bench_report:{name} -->` block to put the {name} tables in."
            )
        page = pattern.sub(lambda m, t=text: m.group(1) + t + m.group(2), page, count=1)
    return page


def build(
    files: list[Path], date: str | None, peak: float | None = None
) -> tuple[dict[str, str], dict[str, dict]]:
    """({NAME: markdown}, {NAME: document}) of the input files; one file per NAME. ``peak``: the
    device's dense 16-bit TFLOP/s for the workload tables (None: DENSE_PEAKS by its name)."""
    blocks, docs = {}, {}
    for path in files:
        name, doc = load(path, date, peak)
        if name in docs:
            raise ReportError(f"{path}: a second {name} file ({docs[name]['_file']} is the first).")
        docs[name] = doc
        blocks[name] = RENDER[name](doc)
    return blocks, docs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python tools/bench_report.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument(
        "files", nargs="+", type=Path, help="JSON files of python -m attnforge_kernels.bench --json"
    )
    ap.add_argument("--out", type=Path, required=True, help="folder for NAME.md and NAME.png")
    ap.add_argument("--page", type=Path, help="markdown page whose bench_report blocks to replace")
    ap.add_argument("--date", help="the day the figures were measured, YYYY-MM-DD")
    ap.add_argument(
        "--peak",
        type=float,
        metavar="TFLOPS",
        help="the device's dense 16-bit peak for the workload shares (default: a table by the "
        "device's name; without one the shares are left out)",
    )
    args = ap.parse_args(argv)
    try:
        if args.date and not re.fullmatch(r"\d{4}-\d\d-\d\d", args.date):
            raise ReportError(f"--date {args.date!r}: expected YYYY-MM-DD.")
        if args.peak is not None and not args.peak > 0:
            raise ReportError(f"--peak {args.peak:g}: expected a positive TFLOP/s figure.")
        blocks, docs = build(args.files, args.date, args.peak)
        page = None
        if args.page:
            rel = os.path.relpath(args.out.resolve(), args.page.resolve().parent)
            linked = {n: with_plot(t, f"{rel}/{n}.png") for n, t in blocks.items()}
            try:
                page = splice(args.page.read_text(), linked, str(args.page))
            except OSError as e:
                raise ReportError(f"--page {args.page}: cannot read it ({e.strerror}).") from None
        write_all(args.out, blocks, docs, (args.page, page) if page is not None else None)
    except ReportError as e:
        print(f"bench_report: {e}", file=sys.stderr)
        return 2
    for name in blocks:
        print(f"{args.out / name}.md" + (f", {args.out / name}.png" if name in PLOTS else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
