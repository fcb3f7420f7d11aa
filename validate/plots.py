"""Plots for the HTML report, drawn with matplotlib and inlined as SVG.

matplotlib is imported only when a plot is drawn (`render --html`), never at module level: the
in-image suite has no matplotlib and still renders Markdown. Grouping the results into panels is
plain Python (`sweep_panels`, `workload_panels`, `train_ratios`), testable without matplotlib.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any

# Fixed colours so a backend looks the same in every plot of a page (matplotlib's tab10).
KNOWN_BACKENDS = [
    "sdpa.flash", "sdpa.cudnn", "sdpa.efficient", "sdpa.math", "sdpa.default",
    "flash_attn", "kernels", "kernels.sdpa_shim",
]  # fmt: skip
PALETTE = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#7f7f7f", "#9467bd",
    "#d62728", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
]  # fmt: skip
MODES = ["fwd", "bwd", "fwd_bwd"]


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


def _sweep_plot(key: tuple, rows: list[dict[str, Any]], col: dict[str, str]) -> Plot:
    has_mem = _has_memory(rows)
    fig, axes = _figure(9.0 if has_mem else 6.0, 3.1, ncols=2 if has_mem else 1)
    speed, memory = axes[0], axes[-1]
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    seqs = sorted({_seq(r["shape"]) for r in rows})
    for b in backends:
        ok = sorted((r for r in rows if r["backend"] == b and r["status"] == "ok"),
                    key=lambda r: _seq(r["shape"]))  # fmt: skip
        if ok:
            xs = [_seq(r["shape"]) for r in ok]
            speed.plot(xs, [r["tflops"] for r in ok], marker="o", ms=3, color=col[b], label=b)
            mem = [r for r in ok if r.get("peak_mem_mb")]
            if mem and has_mem:
                memory.plot([_seq(r["shape"]) for r in mem], [r["peak_mem_mb"] for r in mem],
                            marker="o", ms=3, color=col[b], label=b)  # fmt: skip
        failed = [_seq(r["shape"]) for r in rows
                  if r["backend"] == b and r["status"] in ("error", "crash", "timeout")]  # fmt: skip
        if failed:  # an x on the axis where a backend crashed, errored or hung
            speed.plot(failed, [0.03] * len(failed), "x", ms=7, mew=2, color=col[b],
                       transform=speed.get_xaxis_transform(), clip_on=False)  # fmt: skip
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(seqs, [str(s) for s in seqs])
        ax.minorticks_off()
        ax.set_xlabel("sequence length (keys)")
    speed.set_ylabel("TFLOP/s")
    speed.set_ylim(bottom=0)
    if has_mem:
        memory.set_ylabel("peak memory (MB)")
        memory.set_yscale("log")
    _legend(fig, speed)
    title = panel_title(key)
    fig.suptitle(title, fontsize=10)
    slug = _slug(f"sweep-{key[0]}-d{key[1]}-{'causal' if key[2] else 'full'}-{key[3]}")
    caption = _not_plotted(rows)
    if caption:
        caption += " (x on the axis)."
    return Plot(slug, title, _svg(fig, slug), _join(caption, _no_memory(has_mem)))


def _workload_plot(mode: str, rows: list[dict[str, Any]], col: dict[str, str]) -> Plot:
    names = list(dict.fromkeys(r["shape"]["name"] for r in rows))
    backends = list(dict.fromkeys(r["backend"] for r in rows if r["status"] == "ok"))
    has_mem = _has_memory(rows)
    fig, axes = _figure(9.0 if has_mem else 6.0,
                        0.9 + 0.45 * len(names) * max(1, len(backends)) / 3, 2 if has_mem else 1)  # fmt: skip
    speed, memory = axes[0], axes[-1]
    height = 0.8 / max(1, len(backends))
    for i, b in enumerate(backends):
        by_name = {r["shape"]["name"]: r for r in rows if r["backend"] == b and r["status"] == "ok"}
        ys = [n + (i - (len(backends) - 1) / 2) * height for n in range(len(names))]
        speed.barh(ys, [(by_name.get(n) or {}).get("tflops") or 0 for n in names], height,
                   color=col[b], label=b)  # fmt: skip
        if has_mem:
            memory.barh(ys, [(by_name.get(n) or {}).get("peak_mem_mb") or 0 for n in names],
                        height, color=col[b], label=b)  # fmt: skip
    for ax in axes:
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()
    speed.set_xlabel("TFLOP/s")
    if has_mem:
        memory.set_xlabel("peak memory (MB)")
        memory.set_yticklabels([])
    _legend(fig, speed)
    title = f"{mode} · workload shapes"
    fig.suptitle(title, fontsize=10)
    slug = _slug(f"workload-{mode}")
    caption = _not_plotted(rows)
    return Plot(slug, title, _svg(fig, slug), _join(caption and caption + ".", _no_memory(has_mem)))


def bench_plots(bench: dict[str, Any]) -> list[Plot]:
    """TFLOP/s and peak memory vs sequence length, one figure per sweep panel, then one per mode
    for the workload shapes."""
    results = bench.get("results") or []
    col = colours([r["backend"] for r in results])
    plots = [_sweep_plot(k, rows, col) for k, rows in sweep_panels(results).items()]
    plots += [_workload_plot(m, rows, col) for m, rows in workload_panels(results).items()]
    return plots


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


def available() -> None:
    """Raise PlotsUnavailable (one sentence) when matplotlib cannot be imported."""
    _mpl()
