"""Plots for the HTML report, drawn with matplotlib and inlined as SVG.

matplotlib is imported only when a plot is drawn (`render --html`), never at module level: the
in-image suite has no matplotlib and still renders Markdown. Grouping the results into panels is
plain Python (`sweep_panels`, `workload_panels`, `train_ratios`), testable without matplotlib.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass
from typing import Any

from contract import names

# Fixed colours so a backend looks the same in every plot of a page (matplotlib's tab10, in the
# contract's backend order: sdpa.flash blue, sdpa.efficient green, sdpa.cudnn orange, sdpa.math
# grey, ...; a new backend takes the next unused one).
KNOWN_BACKENDS = list(names.BACKEND_NAMES)
PALETTE = [
    "#1f77b4", "#2ca02c", "#ff7f0e", "#7f7f7f", "#9467bd",
    "#d62728", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
]  # fmt: skip
MODES = list(names.MODES)


class PlotsUnavailable(Exception):
    """matplotlib is missing; the message is a sentence for the user."""


@dataclass(frozen=True)
class Plot:
    """One inline figure: `key` is unique in a page (it prefixes the SVG's ids)."""

    key: str
    title: str
    svg: str
    caption: str = ""


def _mpl():
    """matplotlib with the Agg backend and deterministic SVG output, or PlotsUnavailable."""
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable(
            "the HTML report draws its plots with matplotlib, which this Python lacks; "
            "install it (`pip install matplotlib`, or `pip install -e '.[dev]'` in the host venv)."
        ) from None
    matplotlib.use("Agg")
    return matplotlib


def colours(backends: list[str]) -> dict[str, str]:
    order = [b for b in KNOWN_BACKENDS if b in backends] + sorted(
        b for b in set(backends) if b not in KNOWN_BACKENDS
    )
    fixed = {b: PALETTE[i % len(PALETTE)] for i, b in enumerate(KNOWN_BACKENDS)}
    extra = iter(PALETTE[len(KNOWN_BACKENDS) :] + PALETTE)
    return {b: fixed.get(b) or next(extra) for b in order}


def _svg(fig, key: str) -> str:
    """The figure as an inline <svg> element whose ids are prefixed with `key`, so that several
    figures in one page never share an id (matplotlib's ids are hashes of their content)."""
    mpl = _mpl()
    buf = io.StringIO()
    with mpl.rc_context({"svg.hashsalt": "attnforge", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"\s*<metadata>.*?</metadata>", "", text, flags=re.S)  # RDF boilerplate
    text = re.sub(r'\bid="([^"]+)"', rf'id="{key}-\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{key}-\1)", text)
    text = re.sub(r'href="#([^"]+)"', rf'href="#{key}-\1"', text)
    return text.replace("<svg ", f'<svg data-plot="{key}" role="img" ', 1).strip()


def _figure(width: float, height: float, ncols: int = 1):
    _mpl()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    for ax in axes:
        ax.grid(True, alpha=0.3)
    return fig, list(axes)


def _legend(fig, ax) -> None:
    """One legend per figure, outside the axes, so it never hides a line or a bar."""
    fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", fontsize=8)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _seq(shape: dict[str, Any]) -> int:
    return int(shape["sk"])


# ---------------------------------------------------------------- bench.json


def sweep_panels(results: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """The sweep family's results per (dtype, d, causal, mode) panel, in the documents' order;
    a panel exists when at least one of its results has a time."""
    panels: dict[tuple, list[dict[str, Any]]] = {}
    for r in results:
        s = r["shape"]
        if s.get("family") != "sweep":
            continue
        key = (s["dtype"], s["d"], bool(s["causal"]), r["mode"])
        panels.setdefault(key, []).append(r)
    return {k: v for k, v in panels.items() if any(r["status"] == "ok" for r in v)}


def workload_panels(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The workload family's results per mode (modes without a single time are left out)."""
    panels: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r["shape"].get("family") == "workload":
            panels.setdefault(r["mode"], []).append(r)
    order = {m: i for i, m in enumerate(MODES)}
    return {
        m: panels[m]
        for m in sorted(panels, key=lambda m: order.get(m, len(order)))
        if any(r["status"] == "ok" for r in panels[m])
    }


def panel_title(key: tuple) -> str:
    dtype, d, causal, mode = key
    return f"{mode} · {dtype} · head dim {d} · {'causal' if causal else 'not causal'}"


def _has_memory(rows: list[dict[str, Any]]) -> bool:
    return any(r["status"] == "ok" and r.get("peak_mem_mb") for r in rows)


def _no_memory(has_mem: bool) -> str:
    return "" if has_mem else "No peak memory was recorded (a CPU run has none)."


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _not_plotted(rows: list[dict[str, Any]]) -> str:
    bad = [r for r in rows if r["status"] not in ("ok", "unsupported")]
    if not bad:
        return ""
    return "Not plotted: " + "; ".join(
        f"{r['backend']} {r['status']} at {r['shape']['name']}" for r in bad
    )


def _grid(nrows: int, ncols: int, width: float, height: float):
    """A figure of nrows x ncols small multiples sharing their y axis scale per row."""
    _mpl()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=7)
    return fig, axes


def _fig_legend(fig, col: dict[str, str], backends: list[str], bars: bool = False) -> None:
    """One legend for a figure of small multiples: every backend once, in a fixed order."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color=col[b], label=b) if bars else
               Line2D([], [], color=col[b], marker="o", ms=4, label=b) for b in backends]  # fmt: skip
    fig.legend(handles=handles, loc="outside right upper", fontsize=8)


def _sweep_grid(panels: dict[tuple, list[dict[str, Any]]], col: dict[str, str], what: str) -> Plot:
    """The sweep family as small multiples: a row per mode, a column per (dtype, head dim,
    causal), every backend on each chart; `what` is "tflops" or "peak_mem_mb"."""
    cols = list(dict.fromkeys(k[:3] for k in panels))
    modes = [m for m in MODES if any(k[3] == m for k in panels)]
    modes += sorted({k[3] for k in panels} - set(modes))
    fig, axes = _grid(len(modes), len(cols), 2.3 * len(cols) + 1.6, 2.0 * len(modes) + 0.7)
    rows_all = [r for rows in panels.values() for r in rows]
    backends = [b for b in col if any(r["backend"] == b and r["status"] == "ok" for r in rows_all)]
    failed_text: list[str] = []
    for i, mode in enumerate(modes):
        for j, c in enumerate(cols):
            ax = axes[i][j]
            rows = panels.get((*c, mode), [])
            seqs = sorted({_seq(r["shape"]) for r in rows})
            for b in backends:
                ok = sorted((r for r in rows if r["backend"] == b and r["status"] == "ok"
                             and r.get(what)), key=lambda r: _seq(r["shape"]))  # fmt: skip
                if ok:
                    ax.plot([_seq(r["shape"]) for r in ok], [r[what] for r in ok], marker="o",
                            ms=2.5, lw=1.2, color=col[b], label=b,
                            gid=f"line-{i}-{j}-{_slug(b)}")  # the page's tests find each line  # fmt: skip
                failed = [_seq(r["shape"]) for r in rows
                          if r["backend"] == b and r["status"] in names.FAILING]  # fmt: skip
                if failed and what == "tflops":  # an x on the axis where a backend failed
                    ax.plot(failed, [0.04] * len(failed), "x", ms=6, mew=2, color=col[b],
                            transform=ax.get_xaxis_transform(), clip_on=False)  # fmt: skip
            if seqs:
                ax.set_xscale("log", base=2)
                ax.set_xticks(seqs, [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqs])
                ax.minorticks_off()
            if what == "tflops":
                ax.set_ylim(bottom=0)
            else:
                ax.set_yscale("log")
            dtype, d, causal = c
            if i == 0:
                ax.set_title(f"{dtype} · d {d} · {'causal' if causal else 'full'}", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{mode}\n{'TFLOP/s' if what == 'tflops' else 'peak MB'}",
                              fontsize=8)  # fmt: skip
            if i == len(modes) - 1:
                ax.set_xlabel("sequence length", fontsize=8)
        failed_text.append(_not_plotted([r for c in cols for r in panels.get((*c, mode), [])]))
    _fig_legend(fig, col, backends)
    if what == "tflops":
        title, key = "flash-attention's sweep: TFLOP/s per backend", "sweep-tflops"
    else:
        title, key = "flash-attention's sweep: peak memory per backend", "sweep-memory"
    fig.suptitle(title, fontsize=10)
    caption = "; ".join(t for t in failed_text if t)
    if caption and what == "tflops":
        caption += " (x on the axis)."
    return Plot(key, title, _svg(fig, key), caption if what == "tflops" else "")


def _workload_grid(panels: dict[str, list[dict[str, Any]]], col: dict[str, str]) -> Plot:
    """The workload family as small multiples: a chart per mode, every backend's bar on each
    workload shape."""
    modes = list(panels)
    rows_all = [r for rows in panels.values() for r in rows]
    names = list(dict.fromkeys(r["shape"]["name"] for r in rows_all))
    backends = [b for b in col if any(r["backend"] == b and r["status"] == "ok" for r in rows_all)]
    height = 0.8 / max(1, len(backends))
    fig, axes = _grid(1, len(modes), 2.9 * len(modes) + 1.8,
                      0.9 + 0.16 * len(names) * max(1, len(backends)))  # fmt: skip
    for j, mode in enumerate(modes):
        ax = axes[0][j]
        for i, b in enumerate(backends):
            by_name = {r["shape"]["name"]: r for r in panels[mode]
                       if r["backend"] == b and r["status"] == "ok"}  # fmt: skip
            ys = [n + (i - (len(backends) - 1) / 2) * height for n in range(len(names))]
            ax.barh(ys, [(by_name.get(n) or {}).get("tflops") or 0 for n in names], height,
                    color=col[b], label=b)  # fmt: skip
        ax.set_yticks(range(len(names)), names if j == 0 else [""] * len(names), fontsize=7)
        ax.invert_yaxis()
        ax.set_title(mode, fontsize=8)
        ax.set_xlabel("TFLOP/s", fontsize=8)
    _fig_legend(fig, col, backends, bars=True)
    title = "workload shapes: TFLOP/s per backend"
    fig.suptitle(title, fontsize=10)
    caption = _not_plotted(rows_all)
    return Plot("workload-tflops", title, _svg(fig, "workload-tflops"),
                caption and caption + ".")  # fmt: skip


def bench_plots(bench: dict[str, Any]) -> list[Plot]:
    """One figure of small multiples per shape family, every backend on each chart: the sweep's
    TFLOP/s (a row per mode, a column per dtype x head dim x causal) and, where the run recorded
    it, its peak memory; the workload shapes' TFLOP/s (a chart per mode)."""
    results = bench.get("results") or []
    col = colours([r["backend"] for r in results])
    plots = []
    sweep = sweep_panels(results)
    if sweep:
        plots.append(_sweep_grid(sweep, col, "tflops"))
        if _has_memory([r for rows in sweep.values() for r in rows]):
            plots.append(_sweep_grid(sweep, col, "peak_mem_mb"))
    work = workload_panels(results)
    if work:
        plots.append(_workload_grid(work, col))
    return plots


# ---------------------------------------------------------------- report.json


def _number(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def grid_cells(matrix: list[dict[str, Any]], backends: tuple[str, ...]) -> list[list[tuple]]:
    """The SDPA grid as (state, error / tolerance) per case and backend: state is "pass", "fail",
    "fault" (crash, deferred fault), "refused", "skip" (not forced: can_use said no, as on CPU
    torch for efficient and cuDNN) or "" (not run); the ratio only where judged."""
    out = []
    for row in matrix:
        cells = []
        for b in backends:
            e = (row.get("backends") or {}).get(b) or {}
            run = e.get("run") or ""
            state = {"pass": "pass", "fail": "fail", "crash": "fault", "deferred-fault": "fault",
                     "unsupported": "refused", "skip": "skip"}.get(run, "")  # fmt: skip
            err, tol = _number(e.get("max_abs_err")), e.get("tolerance")
            # a non-finite error ("nan" in the report: JSON has no NaN) is a fail with no ratio
            judged = state in ("pass", "fail") and err is not None and math.isfinite(err)
            ratio = err / tol if judged and tol else None
            cells.append((state, ratio))
        out.append(cells)
    return out


def grid_heatmap(matrix: list[dict[str, Any]], backends: tuple[str, ...]) -> Plot | None:
    """A heat map of max|err| / tolerance per case (rows) and backend (columns): green well
    inside the tolerance, yellow near it, red above; refused cells grey (—), faults dark (✗)."""
    if not matrix:
        return None
    _mpl()
    import numpy as np  # matplotlib's own dependency
    from matplotlib.colors import LinearSegmentedColormap

    cells = grid_cells(matrix, backends)
    cases = [r["case"] for r in matrix]
    cmap = LinearSegmentedColormap.from_list("err", ["#1a9850", "#fee08b", "#fdae61", "#d73027"])
    fig, axes = _grid(1, 1, 1.6 + 1.25 * len(backends), 0.9 + 0.27 * len(cases))
    ax = axes[0][0]
    ax.grid(False)
    data = np.full((len(cases), len(backends)), np.nan)
    for i, row in enumerate(cells):
        for j, (_state, ratio) in enumerate(row):
            if ratio is not None:
                data[i, j] = min(ratio, 2.0)
    # pcolormesh, not imshow: vector cells, no embedded raster image in the page
    img = ax.pcolormesh(np.arange(len(backends) + 1) - 0.5, np.arange(len(cases) + 1) - 0.5,
                        np.ma.masked_invalid(data), cmap=cmap, vmin=0.0, vmax=2.0,
                        edgecolors="white", linewidth=1.5)  # fmt: skip
    ax.set_xlim(-0.5, len(backends) - 0.5)
    ax.set_ylim(len(cases) - 0.5, -0.5)
    ax.set_facecolor("#e6e6e6")
    for i, row in enumerate(cells):
        for j, (state, ratio) in enumerate(row):
            text = {"refused": "—", "fault": "✗ fault", "skip": "skip", "": "·"}.get(state)
            if text is None:
                text = f"{ratio:.2f}" if ratio is not None else state
            if state == "fault":
                ax.add_patch(_rect(j, i, "#5c0011"))
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="white" if state == "fault" else "#222")  # fmt: skip
    ax.set_xticks(range(len(backends)), backends, fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(cases)), cases, fontsize=7)
    bar = fig.colorbar(
        img, ax=ax, shrink=0.8, ticks=[0, 0.5, 1, 1.5, 2], boundaries=np.linspace(0, 2, 41)
    )
    bar.solids.set_rasterized(False)  # vector, like the rest: the page embeds no image
    bar.ax.set_yticklabels(["0", "0.5", "1 (limit)", "1.5", "≥ 2"], fontsize=7)
    bar.set_label("max|err| / tolerance", fontsize=8)
    title = "SDPA grid: error / tolerance per backend and case"
    fig.suptitle(title, fontsize=10)
    caption = ("Each backend forced on each case against an fp32 reference; above 1 fails. "
               "— refused by PyTorch, ✗ a GPU fault, skip: not forced (can_use said no), "
               "· not run.")  # fmt: skip
    return Plot("sdpa-grid", title, _svg(fig, "sdpa-grid"), caption)


def _rect(x: float, y: float, colour: str):
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1, 1, color=colour)


def _pick_from_message(message: str) -> str | None:
    m = re.match(r"SDPA picks (\S+)", message or "")
    return m.group(1) if m else None


def workload_picks(report: dict[str, Any], bench: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per workload shape, SDPA's default pick and whether it is fused (not math): from the
    report's checks that record a workload (details "workload" and "default_backend"), else from
    bench.json's sdpa.default runs at the workload shapes ("SDPA picks X"). Each: workload, pick,
    fused (True, False, None when nothing was recorded), where (what said so)."""
    found: dict[str, dict[str, Any]] = {}
    for c in report.get("checks") or []:  # the sdpa.workloads check: one row per shape
        if c.get("id") != "sdpa.workloads":
            continue
        for row in (c.get("details") or {}).get("shapes") or []:
            pick = row.get("default_backend")
            name = str(row.get("shape") or row.get("workload"))
            found.setdefault(name, {
                "workload": name, "pick": pick,
                "fused": None if not pick else bool(row.get("fused")), "where": c.get("id")})  # fmt: skip
    for c in report.get("checks") or []:
        d = c.get("details") or {}
        if d.get("workload") and "default_backend" in d:
            pick = d.get("default_backend")
            found.setdefault(str(d["workload"]), {
                "workload": str(d["workload"]), "pick": pick,
                "fused": None if not pick else pick != "math", "where": c.get("id")})  # fmt: skip
    for r in (bench or {}).get("results") or []:
        shape = r.get("shape") or {}
        if r.get("backend") != "sdpa.default" or shape.get("family") != "workload":
            continue
        pick = _pick_from_message(r.get("message") or "")
        name = str(shape.get("name"))
        if name not in found or (found[name]["pick"] is None and pick):
            found[name] = {"workload": name, "pick": pick,
                           "fused": None if not pick else pick != "math",
                           "where": f"bench.json, {r.get('mode')}"}  # fmt: skip
    return list(found.values())


def workload_plot(picks: list[dict[str, Any]]) -> Plot | None:
    """Each workload shape as fused or not: SDPA's default pick, green where it is a fused
    kernel, red where it falls back to math, grey where nothing was recorded."""
    if not picks:
        return None
    fig, axes = _grid(1, 1, 7.0, 0.7 + 0.3 * len(picks))
    ax = axes[0][0]
    ax.grid(False)
    colour = {True: "#1a9850", False: "#d73027", None: "#bdbdbd"}
    for i, p in enumerate(picks):
        ax.barh(i, 1, color=colour[p.get("fused")], height=0.8)
        label = ("fused" if p.get("fused") else "NOT fused" if p.get("fused") is False
                 else "not recorded")  # fmt: skip
        ax.text(0.02, i, f"{label}: {p.get('pick') or '?'}", va="center", fontsize=8,
                color="white" if p.get("fused") is not None else "#222")  # fmt: skip
        ax.text(1.02, i, p.get("where") or "", va="center", fontsize=7, color="#555")
    ax.set_xlim(0, 2.2)
    ax.set_xticks([])
    ax.set_yticks(range(len(picks)), [p["workload"] for p in picks], fontsize=8)
    ax.invert_yaxis()
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    title = "workload shapes: does SDPA's default pick a fused kernel?"
    fig.suptitle(title, fontsize=10)
    return Plot("workloads-fused", title, _svg(fig, "workloads-fused"),
                "math is the unfused fallback; any other backend is a fused kernel.")  # fmt: skip


def ratio_rows(doc: dict[str, Any], limit: int = 12) -> list[dict[str, Any]]:
    """The baseline comparison's rows worth a bar: gated and failing ones first, then the rest
    with a ratio, slowest first, up to `limit` bars."""
    rows = [r for r in doc.get("rows") or [] if r.get("ratio") is not None]
    first = [r for r in rows if r.get("gated") or r.get("verdict") == "fail"]
    rest = sorted((r for r in rows if r not in first), key=lambda r: r["ratio"])
    return (first + rest)[: max(limit, len(first))]


def baseline_plot(doc: dict[str, Any]) -> Plot | None:
    """This run's speed over the baseline's (ratio, above 1 faster now) as bars, with the
    gate's line: red bars fell below their gate."""
    rows = ratio_rows(doc)
    if not rows:
        return None
    gate = float(doc.get("default_min_ratio") or 0) or None
    fig, axes = _grid(1, 1, 8.0, 0.9 + 0.24 * len(rows))
    ax = axes[0][0]
    labels = [f"{r['backend']} · {r['shape']} · {r['mode']}" for r in rows]
    colours_ = ["#d73027" if r.get("verdict") == "fail" else
                "#4575b4" if r.get("gated") else "#9ecae1" for r in rows]  # fmt: skip
    ax.barh(range(len(rows)), [r["ratio"] for r in rows], color=colours_)
    for i, r in enumerate(rows):
        ax.text(r["ratio"], i, f" {r['ratio']:.2f}×", va="center", fontsize=7)
        if r.get("gated") and r.get("min_ratio") and r["min_ratio"] != gate:
            ax.plot([r["min_ratio"]] * 2, [i - 0.4, i + 0.4], color="black", lw=1.5)
    if gate:
        ax.axvline(gate, color="black", lw=1.2, ls="--", label=f"gate {gate:g}× (gated rows)")
    ax.axvline(1.0, color="#777", lw=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(1.2, max(r["ratio"] for r in rows) * 1.18))
    ax.set_xlabel("baseline ms / now ms (above 1: faster now)", fontsize=8)
    if gate:
        ax.legend(fontsize=7, loc="lower right")
    title = "speed against the baseline"
    fig.suptitle(title, fontsize=10)
    shown = len(rows)
    total = sum(r.get("ratio") is not None for r in doc.get("rows") or [])
    caption = ("Dark blue: gated rows; red: below their gate; light: ungated rows, slowest first"
               + (f" ({shown} of {total} shown)." if shown < total else "."))  # fmt: skip
    return Plot("baseline-ratio", title, _svg(fig, "baseline-ratio"), caption)


# ---------------------------------------------------------------- bench_train.json


def train_ratios(doc: dict[str, Any]) -> tuple[str | None, list[tuple[str, float, float]]]:
    """(reference backend, [(backend, median step ms, ratio to the reference)]) over the
    backends that finished; the reference is the loss check's, else the first that finished."""
    ok = [r for r in doc.get("results") or [] if r["status"] == "ok" and r.get("median_step_ms")]
    if not ok:
        return None, []
    named = (doc.get("loss_check") or {}).get("reference")
    ref = next((r for r in ok if r["backend"] == named), ok[0])
    base = ref["median_step_ms"]
    return ref["backend"], [
        (r["backend"], r["median_step_ms"], r["median_step_ms"] / base) for r in ok
    ]


def train_plot(doc: dict[str, Any]) -> Plot | None:
    """Step time relative to the reference backend, and peak memory, per backend."""
    ref, ratios = train_ratios(doc)
    if not ratios:
        return None
    col = colours([b for b, _, _ in ratios])
    mem = {r["backend"]: r.get("peak_mem_mb") or 0 for r in doc["results"]}
    has_mem = _has_memory(doc["results"])
    fig, axes = _figure(9.0 if has_mem else 6.0, 0.9 + 0.32 * len(ratios), 2 if has_mem else 1)
    speed, memory = axes[0], axes[-1]
    names = [b for b, _, _ in ratios]
    speed.barh(names, [x for _, _, x in ratios], color=[col[b] for b in names])
    for i, (_, ms, x) in enumerate(ratios):
        speed.text(x, i, f" {x:.2f}× ({ms:.1f} ms)", va="center", fontsize=8)
    speed.axvline(1.0, color="black", lw=0.8)
    speed.set_xlim(0, max(x for _, _, x in ratios) * 1.45)
    speed.set_xlabel(f"median step time / {ref}'s (lower is faster)")
    if has_mem:
        memory.barh(names, [mem.get(b, 0) for b in names], color=[col[b] for b in names])
        memory.set_xlabel("peak memory (MB)")
        memory.set_yticklabels([])
    for ax in axes:
        ax.invert_yaxis()
    c = doc.get("config") or {}
    title = (f"training step · width {c.get('width')}, {c.get('layers')} layers, "
             f"{c.get('heads')} heads, seq {c.get('seq')}, batch {c.get('batch')}, {c.get('dtype')}")  # fmt: skip
    fig.suptitle(title, fontsize=10)
    return Plot("train-ratio", title, _svg(fig, "train-ratio"), _no_memory(has_mem))


# For the compatibility matrix's chart (attnforge/matrix.py), drawn in the same style.
small_multiples = _grid
inline_svg = _svg


def available() -> None:
    """Raise PlotsUnavailable (one sentence) when matplotlib cannot be imported."""
    _mpl()
