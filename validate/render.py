"""Render a report as Markdown (CI step summary) or as a self-contained HTML page."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

from contract.names import FAILING, SDPA_BACKENDS
from validate import plots
from validate.plots import PlotsUnavailable

__all__ = ["PlotsUnavailable", "to_html", "to_markdown"]

ICON = {"pass": "✅", "fail": "❌", "crash": "💥", "timeout": "⏱️", "skip": "⏭️"}
RUN_CELL = {
    "pass": "✅", "fail": "❌", "crash": "💥", "deferred-fault": "💥 deferred",
    "unsupported": "—", "skip": "skip",
}  # fmt: skip


def _value(x: Any) -> str:
    """JSON spelling for values shown to users: true/false/null, lists joined by 'or'."""
    if isinstance(x, bool):
        return "true" if x else "false"
    if x is None:
        return "null"
    if isinstance(x, list):
        return " or ".join(_value(v) for v in x)
    return str(x)


def _md(text: Any, limit: int = 300) -> str:
    s = "" if text is None else str(text)
    s = " ".join(s.split())
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return s.replace("|", "\\|")


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.2g}"
    return "" if x is None else str(x)


def headline(report: dict[str, Any]) -> str:
    env = report.get("environment") or {}
    t = env.get("torch") or {}
    parts = []
    if t:
        build = (
            f"HIP {t['hip']}" if t.get("hip") else f"CUDA {t['cuda']}" if t.get("cuda") else "CPU"
        )
        parts.append(f"torch {t.get('version')} ({build})")
    devs = env.get("devices") or []
    if devs:
        parts.append(f"{devs[0].get('name')} ({devs[0].get('arch')})")
    elif t:
        parts.append("no GPU")
    parts.append(f"command `{report.get('command')}`" + (" --quick" if report.get("quick") else ""))
    parts.append(f"{report.get('duration_s', 0):.1f} s")
    return " · ".join(parts)


def backend_cell(entry: dict[str, Any] | None) -> str:
    if not entry:
        return ""
    run = entry.get("run") or ""
    cell = RUN_CELL.get(run, run)
    if run in ("pass", "fail") and entry.get("max_abs_err") is not None:
        cell += f" {_fmt(entry['max_abs_err'])}/{_fmt(entry.get('tolerance'))}"
    if entry.get("can_use") is False:
        cell += " (can_use: no)"
    return cell


def _host_lines(report: dict[str, Any]) -> list[str]:
    """Known-bad host warnings first (they explain crashes), then the AOTriton knob, then what
    the host is: kernel, GPUs, driver, HSA override, device access, engine."""
    host = report.get("host") or {}
    fp = host.get("fingerprint") or {}
    out: list[str] = []
    for w in host.get("warnings") or []:
        out.append(f"- ⚠️ **host**: {_md(w['warning'], 400)}. Fix: {_md(w['fix'], 400)} "
                   f"({_md(w['source'], 200)})")  # fmt: skip
    knob = report.get("aotriton_knob") or {}
    if "needed" in knob:
        state = "sets" if knob.get("set") else "does not set"
        need = "needs it" if knob["needed"] else "does not need it"
        icon = "✅" if knob.get("ok") else "❌"
        out.append(f"- {icon} the image {state} `{knob['variable']}`; this arch {need} with "
                   f"AOTriton {knob.get('aotriton')}")  # fmt: skip
    out += observed_lines(report, knob.get("aotriton"))
    if fp:
        gpus = ", ".join(g["arch"] for g in fp.get("gpus") or []) or "none seen"
        hsa = fp.get("hsa_override_gfx_version") or {}
        hsa_text = hsa.get("state", "?") + (f" ({hsa['value']!r})" if "value" in hsa else "")
        kfd = next((d for d in fp.get("devices") or [] if d["path"].endswith("/kfd")), {})
        access = ("readable" if kfd.get("readable") else "not readable") if kfd.get("exists") \
            else "absent"  # fmt: skip
        # ROCm's device node and driver matter only where an AMD GPU is expected or seen
        amd = bool(fp.get("gpus")) or str(report.get("arch") or "").startswith("gfx")
        rocm = (f", amdgpu {fp.get('amdgpu_driver') or '?'}, HSA_OVERRIDE_GFX_VERSION {hsa_text}, "
                f"/dev/kfd {access}") if amd else ""  # fmt: skip
        out.append(
            f"- host: Linux {fp.get('kernel')}, GPUs {gpus}{rocm}, groups "
            f"{', '.join(fp.get('groups') or []) or '-'}"
            + (f", engine {fp['engine']}" if fp.get("engine") else "")
        )
    return [*out, ""] if out else []


def to_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown, section by section."""
    out = _summary_lines(report) + _host_lines(report) + _expectation_lines(report)
    out += _check_lines(report) + _matrix_lines(report)
    out += layouts_markdown(report)
    out += workloads_markdown(report)
    out += apps_markdown(report)
    out += _failure_lines(report)
    return "\n".join(out).rstrip() + "\n"


def _summary_lines(report: dict[str, Any]) -> list[str]:
    s = report.get("summary") or {}
    status = str(s.get("status", "?")).upper()
    title = f"## {ICON.get(s.get('status'), '')} Validation {status}"
    if report.get("stack") or report.get("arch"):
        title += f": stack `{report.get('stack')}` on `{report.get('arch')}`"
    counts = s.get("counts") or {}
    checks = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    return [title, "", headline(report), "", f"Checks: {checks} · exit status {s.get('exit_code')}",
            ""]  # fmt: skip


def _expectation_lines(report: dict[str, Any]) -> list[str]:
    exp = report.get("expectations")
    if not exp:
        return []
    out = [
        f"### Expectations ({exp.get('file')})",
        "",
        "| | key | promised | seen |",
        "|---|---|---|---|",
    ]
    for e in exp.get("results", []):
        icon = "✅" if e["status"] == "met" else "❌"
        out.append(
            f"| {icon} | `{e['key']}` | {_md(_value(e['expected']))} | "
            f"{_md(_value(e['observed']))} |"
        )
    broken = [e for e in exp.get("results", []) if e["status"] == "broken"]
    if broken:
        out.append("")
        out += [f"- ❌ {_md(e['message'], 1000)}" for e in broken]
    return [*out, ""]


def _check_lines(report: dict[str, Any]) -> list[str]:
    out = ["### Checks", "", "| status | check | time | message |", "|---|---|---|---|"]
    for r in report.get("checks", []):
        req = "" if r.get("required", True) else " (optional)"
        suspect = " · host-suspect" if r.get("host_suspect") else ""
        out.append(
            f"| {ICON.get(r['status'], '')} {r['status']}{suspect} | `{r['id']}`{req} | "
            f"{r.get('duration_s', 0):.1f}s | {_md(r.get('message'))} |"
        )
    return [*out, ""]


def _matrix_lines(report: dict[str, Any]) -> list[str]:
    matrix = report.get("backend_matrix") or []
    if not matrix:
        return []
    out = [
        "### SDPA backends",
        "",
        "Forced run per backend: ✅/❌ max|err| / tolerance (flash-attention rule: 2× the "
        "same-dtype math error + rounding floor); — = refused; 💥 = GPU fault; 💥 deferred = "
        "the run returned, but the checked op after it failed.",
        "",
        "| case | default pick | profiler | " + " | ".join(SDPA_BACKENDS) + " |",
        "|---|---|---|" + "---|" * len(SDPA_BACKENDS),
    ]
    for row in matrix:
        cells = [backend_cell(row["backends"].get(b)) for b in SDPA_BACKENDS]
        out.append(
            f"| {row['case']} | {row.get('default_backend') or '?'} | "
            f"{row.get('profiler_backend') or ''} | " + " | ".join(cells) + " |"
        )
    out.append("")
    reasons = [
        f"- {row['case']} / {b}: " + _md("; ".join(e["reasons"]), 600)
        for row in matrix for b, e in row["backends"].items() if e.get("reasons")
    ]  # fmt: skip
    out += _details("Why backends were refused (PyTorch's reasons)", reasons)
    kernels = [
        f"- {row['case']}: " + ", ".join(f"`{_md(k, 120)}`" for k in row["default_kernels"][:6])
        for row in matrix if row.get("default_kernels")
    ]  # fmt: skip
    out += _details("Kernels the profiler saw (default pick)", kernels)
    return out


def _details(summary: str, lines: list[str]) -> list[str]:
    """A collapsed block of lines, or nothing when there are none."""
    if not lines:
        return []
    return [f"<details><summary>{summary}</summary>", "", *lines, "", "</details>", ""]


def _failure_lines(report: dict[str, Any]) -> list[str]:
    bad = [r for r in report.get("checks", []) if r["status"] in FAILING]
    if not bad:
        return []
    out = ["### Failures", ""]
    for r in bad:
        out.append(f"- **{r['id']}** {r['status']}: {_md(r.get('message'), 1000)}")
        lines = r.get("stderr_tail") or []
        if lines:
            out += ["  <details><summary>last stderr lines</summary>", "", "  ```"]
            out += [f"  {ln}" for ln in lines[-12:]]
            out += ["  ```", "  </details>"]
    return [*out, ""]


def apps_markdown(report: dict[str, Any]) -> list[str]:
    """The apps section (issue 25 §3): per app model and attention implementation whether it
    ran, whether it matched the eager/math reference, which kernel ran or why it refused; then
    the ComfyUI/vLLM contract probes. Empty when no apps check ran."""
    apps = report.get("apps") or {}
    rows, probes = apps.get("models") or [], apps.get("contracts") or []
    if not rows and not probes:
        return []
    out = ["### Apps: their own attention code", ""]
    if rows:
        out += ["| app | model | implementation | ran | correct | kernel, or why it refused | "
                "kernel from |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in rows:
            ran = "✅" if r.get("ran") else ("❌" if r.get("must_run") else "—")
            correct = {True: "✅", False: "❌"}.get(r.get("correct"), "")
            if r.get("reference"):
                correct = "reference"
            why = r.get("kernel") if r.get("ran") else r.get("reason")
            out.append(f"| {_md(r.get('app'))} {_md(r.get('app_version') or '')} | "
                       f"{_md(r.get('model'))} | {_md(r.get('impl') or '')} | {ran} | {correct} | "
                       f"{_md(why, 400)} | {_md(r.get('source') or '', 200)} |")  # fmt: skip
        out.append("")
    if probes:
        out += ["| contract | app's call | status | what the image has | source |",
                "|---|---|---|---|---|"]  # fmt: skip
        for p in probes:
            icon = {"pass": "✅", "fail": "❌"}.get(p.get("status"), "n/a")
            out.append(f"| `{_md(p.get('id'))}` | `{_md(p.get('call'), 160)}` | {icon} | "
                       f"{_md(p.get('message'), 400)} | {_md(p.get('source'), 200)} |")  # fmt: skip
        out.append("")
    return out


# ------------------------------------------------------------------------------------ HTML
# One self-contained page: no script, no external stylesheet, font or image; the plots are
# inline SVG drawn by matplotlib (validate/plots.py, imported only here).

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1240px;
 padding:1em 2em;color:#222;line-height:1.4}
h1{margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
nav a{margin-right:1em}code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em}
table{border-collapse:collapse;margin:.6em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.pass,.met,.ok{color:#0a6b1f}.fail,.crash,.timeout,.broken,.error,.deferred-fault{color:#b00020}
.skip,.unsupported{color:#666}
td.cell-pass{background:#dcf2df}td.cell-bad{background:#f8d7da}td.cell-off{background:#eee;color:#555}
h1.pass{color:#0a6b1f}h1.fail{color:#b00020}
.small{font-size:.85em;color:#555}pre{background:#f6f6f6;padding:8px;overflow:auto}
figure.plot{margin:1em 0;border:1px solid #e4e4e4;padding:4px}
figure.plot svg{max-width:100%;height:auto;display:block}
figcaption{font-size:.85em;color:#444;padding:2px 6px}
details{margin:.4em 0}summary{cursor:pointer}ul.kern{margin:0;padding-left:1.2em}
td{overflow-wrap:break-word}table.fixed{table-layout:fixed;width:100%}
table.fixed td{overflow-wrap:anywhere}
"""


def _h(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _inline(text: Any) -> str:
    """Escaped text whose Markdown emphasis and code spans (the Markdown summary's lines reused
    in the page) become HTML, so that no literal ** or ` reaches the reader."""
    out = _h(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def _table(
    head: list[str], rows: list[list[str]], raw: bool = False, widths: list[int] | None = None
) -> str:
    """A table; `raw` cells are HTML (a cell may be a whole <td>); `widths` (percent per column)
    fix the layout so that long unbroken names (kernels) wrap instead of widening the page."""
    cols = ""
    if widths:
        cols = "<colgroup>" + "".join(f"<col style='width:{w}%'>" for w in widths) + "</colgroup>"
    th = "".join(f"<th>{_h(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(
            c if raw and c.startswith("<td") else f"<td>{c if raw else _h(c)}</td>" for c in row
        )
        + "</tr>"  # fmt: skip
        for row in rows
    )
    css = " class='fixed'" if widths else ""
    return f"<table{css}>{cols}<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _status(s: Any) -> str:
    return f"<span class='{_h(s)}'>{_h(s)}</span>"


def _num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "<td class='num'></td>"
    return f"<td class='num'>{_h(f'{x:.{digits}g}' if isinstance(x, float) else x)}</td>"


def observed_lines(report: dict[str, Any], said: str | None) -> list[str]:
    """What the image read from its own files (the versions manifest's "observed", written by
    attnforge/observe.py) against what the recipe inferred: AOTriton in torch."""
    versions = (report.get("environment") or {}).get("image_versions") or {}
    aot = ((versions.get("observed") or {}) if isinstance(versions, dict) else {}).get("aotriton")
    seen = (aot or {}).get("tag")
    if not seen:
        return []
    where = str((aot or {}).get("file") or "").rsplit("/", 1)[-1]
    if said and _release(said) != _release(seen):
        return [f"- ⚠️ the image contradicts the recipe: AOTriton in torch is {_md(seen)} "
                f"({_md(where)}), the recipe inferred {_md(said)} (`invoke pins.update "
                "--observed` proposes the correction)"]  # fmt: skip
    return [f"- AOTriton in torch, read from the image: {_md(seen)} ({_md(where)})"]


def _release(tag: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", tag)[:3])


def _section(sid: str, body: list[str]) -> list[str]:
    title = next(t for i, t, _ in SECTIONS if i == sid)
    return [f"<section id='{sid}'><h2>{_h(title)}</h2>", *body, "</section>"]


def _environment(report: dict[str, Any]) -> list[str]:
    env = report.get("environment") or {}
    t = env.get("torch") or {}
    rows: list[list[str]] = []

    def add(name: str, value: Any) -> None:
        if value not in (None, "", [], {}):
            rows.append([name, _value(value)])

    add("python", env.get("python") and f"{env['python']} ({env.get('executable', '')})")
    add("torch", t.get("version") and f"{t['version']} (git {str(t.get('git_version'))[:12]})")
    add("HIP", t.get("hip"))
    add("CUDA", t.get("cuda"))
    add("cuDNN", env.get("cudnn_version"))
    add("ROCm", env.get("rocm_version"))
    for pkg in ("triton", "flash_attn"):
        info = env.get(pkg) or {}
        if info:
            add(pkg, info.get("version") if info.get("present") else f"absent: {info.get('error')}")
    add("AOTriton libraries", ", ".join(env.get("aotriton_libs") or []))
    for d in env.get("devices") or []:
        mem = d.get("total_memory_bytes")
        add(f"device {d.get('index', '')}".strip(),
            f"{d.get('name')} ({d.get('arch')}"
            + (f", {mem / 2**30:.0f} GiB" if mem else "") + ")")  # fmt: skip
    add("CPU capability", env.get("cpu_capability"))
    add("platform", env.get("platform"))
    host = report.get("host") or {}
    add("host", host.get("hostname") and f"{host['hostname']} ({host.get('platform')})")
    out = [_table(["what", "value"], rows)] if rows else ["<p>The env check recorded nothing.</p>"]
    lines = _host_lines(report)
    if lines:
        out.append("<ul>" + "".join(f"<li>{_inline(ln[2:])}</li>" for ln in lines if ln) + "</ul>")
    if env.get("env"):
        out += ["<h3>Attention-related environment variables</h3>",
                _table(["variable", "value"], [[k, v] for k, v in env["env"].items()])]  # fmt: skip
    else:
        out.append("<p class='small'>No attention-related environment variable was set.</p>")
    return _section("environment", out)


def _expectations(report: dict[str, Any]) -> list[str]:
    exp = report.get("expectations")
    if not exp:
        return _section("expectations", ["<p>No expect file: nothing was promised.</p>"])
    rows = [
        [_status(e["status"]), f"<code>{_h(e['key'])}</code>", _h(_value(e["expected"])),
         _h(_value(e["observed"])), _h(e["message"])]
        for e in exp.get("results", [])
    ]  # fmt: skip
    return _section("expectations", [
        f"<p>From <code>{_h(exp.get('file'))}</code>.</p>",
        _table(["status", "key", "promised", "seen", "message"], rows, raw=True),
    ])  # fmt: skip


HTML_RUN = {"deferred-fault": "deferred fault", "unsupported": "refused", "": "not run"}


def _backend_td(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "<td></td>"
    run = entry.get("run") or ""
    css = ("cell-pass" if run == "pass" else "cell-off" if run in ("unsupported", "skip", "")
           else "cell-bad")  # fmt: skip
    body = _h(HTML_RUN.get(run, run))
    if run in ("pass", "fail") and entry.get("max_abs_err") is not None:
        body += f" {_h(_fmt(entry['max_abs_err']))} / {_h(_fmt(entry.get('tolerance')))}"
    if entry.get("can_use") is False:
        body += " <span class='small'>(can_use: no)</span>"
    why = list(entry.get("reasons") or [])
    if entry.get("error"):
        why.append(entry["error"])
    if why:
        body += ("<details><summary>why</summary><ul>"
                 + "".join(f"<li>{_h(w)}</li>" for w in why) + "</ul></details>")  # fmt: skip
    return f"<td class='{css}'>{body}</td>"


def _backends(report: dict[str, Any]) -> list[str]:
    matrix = report.get("backend_matrix") or []
    if not matrix:
        return _section("backends", ["<p>No SDPA case ran.</p>"])
    rows = [
        [_h(row["case"]), _h(row.get("default_backend") or "?"), _h(row.get("profiler_backend"))]
        + [_backend_td(row["backends"].get(b)) for b in SDPA_BACKENDS]
        for row in matrix
    ]
    return _section("backends", [
        "<p>Each backend forced on each case and judged against an fp32 reference: green passed "
        "(max|err| / tolerance, flash-attention's rule), red failed or faulted, grey refused "
        "— open <i>why</i> for PyTorch's own reasons.</p>",
        *_draw(lambda: plots.grid_heatmap(matrix, SDPA_BACKENDS)),
        _table(["case", "default pick", "profiler", *SDPA_BACKENDS], rows, raw=True),
    ])  # fmt: skip


def _workloads(report: dict[str, Any], bench: dict[str, Any] | None) -> list[str]:
    """Each workload shape fused or not: SDPA's default pick (plots.workload_picks says where
    it comes from)."""
    picks = plots.workload_picks(report, bench)
    if not picks:
        return _section("workloads", [
            "<p>No workload shape recorded SDPA's default pick (the bench's <code>sdpa.default"
            "</code> runs at the workload shapes record it: <code>python -m validate bench "
            "--backend sdpa.default --json bench.json</code>).</p>"])  # fmt: skip
    rows = [[_h(p["workload"]), _h(p.get("pick") or "?"),
             (f"<span class='{'pass' if p['fused'] else 'fail'}'>"
              f"{'yes' if p['fused'] else 'no: math fallback'}</span>")
             if p["fused"] is not None else "not recorded",
             _h(p.get("where"))] for p in picks]  # fmt: skip
    return _section("workloads", [
        "<p>Whether SDPA's default pick at each workload shape is a fused kernel (anything but "
        "math, the slow fallback).</p>",
        *_draw(lambda: plots.workload_plot(picks)),
        _table(["workload", "SDPA picks", "fused", "recorded by"], rows, raw=True),
    ])  # fmt: skip


def _kernel_li(name: str, limit: int = 240) -> str:
    """A kernel name; C++ template names run to thousands of characters: the start is shown,
    the whole name is the tooltip."""
    if len(name) <= limit:
        return f"<li><code>{_h(name)}</code></li>"
    return f"<li><code title='{_h(name)}'>{_h(name[: limit - 1])}…</code></li>"


def _kernels(report: dict[str, Any]) -> list[str]:
    details = {c["id"]: c.get("details") or {} for c in report.get("checks", [])}
    rows = []
    for row in report.get("backend_matrix") or []:
        d = details.get(f"sdpa.case.{row['case']}", {})
        kern = row.get("default_kernels") or d.get("default_kernels") or []
        ops = d.get("default_aten_ops") or []
        if not kern and not ops:
            continue
        rows.append([
            _h(row["case"]),
            _h(row.get("default_backend") or "?")
            + (f"<br><span class='small'>{_h(row['default_backend_source'])}</span>"
               if row.get("default_backend_source") else ""),
            _h(row.get("profiler_backend")),
            "<ul class='kern'>" + "".join(_kernel_li(k) for k in kern) + "</ul>",
            "<ul class='kern'>" + "".join(f"<li><code>{_h(o)}</code></li>" for o in ops) + "</ul>",
        ])  # fmt: skip
    if not rows:
        return _section("kernels", ["<p>The profiler recorded no kernels.</p>"])
    return _section("kernels", [
        "<p>What <code>torch.profiler</code> saw for SDPA's default pick in each case: the GPU "
        "kernels and the aten ops they came from.</p>",
        _table(["case", "default pick", "profiler says", "kernels", "aten ops"], rows, raw=True,
               widths=[13, 13, 8, 44, 22]),
    ])  # fmt: skip


def _env_line(doc: dict[str, Any]) -> str:
    env = doc.get("env") or {}
    build = (
        f"HIP {env['hip']}"
        if env.get("hip")
        else f"CUDA {env['cuda']}"
        if env.get("cuda")
        else "CPU"
    )
    arch = f" ({env['arch']})" if env.get("arch") else ""
    return (f"Measured {_h(doc.get('created'))} on {_h(env.get('device'))}{_h(arch)}, "
            f"torch {_h(env.get('torch'))} ({_h(build)}), triton {_h(env.get('triton'))}.")  # fmt: skip


def _figures(plots: list[Any]) -> list[str]:
    return [
        f"<figure class='plot' id='plot-{_h(p.key)}'>{p.svg}"
        + (f"<figcaption>{_h(p.caption)}</figcaption>" if p.caption else "")
        + "</figure>"
        for p in plots
    ]


def _draw(make: Callable[[], Any]) -> list[str]:
    """The figures `make` draws (a Plot, a list of them or None); where matplotlib is missing (the
    in-image Python) one line says so in their place and the tables below stay."""
    try:
        drawn = make()
    except PlotsUnavailable:
        return ["<p class='small noplot'>(A picture belongs here: this page was rendered by a "
                "Python without matplotlib; <code>invoke report --html</code> on the host draws "
                "it.)</p>"]  # fmt: skip
    if drawn is None:
        return []
    return _figures(drawn if isinstance(drawn, list) else [drawn])


def _shape_text(s: dict[str, Any]) -> str:
    heads = f"{s['h']}" + (f"/{s['hkv']}" if s.get("hkv") not in (None, s["h"]) else "")
    return (f"{s['name']}: b {s['b']}, heads {heads}, q {s['sq']} × k {s['sk']}, d {s['d']}, "
            f"{s['dtype']}{', causal' if s['causal'] else ''}")  # fmt: skip


def _bench(doc: dict[str, Any] | None) -> list[str]:
    if doc is None:
        return _section("bench", [
            "<p>No bench.json next to this report (<code>python -m validate bench --json "
            "bench.json</code> makes one).</p>"])  # fmt: skip
    results = doc.get("results") or []
    out = [f"<p>{_env_line(doc)} TFLOP/s counts flash-attention's FLOPs (4·b·sq·sk·h·d, half "
           "when causal; ×2.5 backward, ×3.5 forward+backward); times are medians.</p>"]  # fmt: skip
    out += _draw(lambda: plots.bench_plots(doc))
    groups: dict[tuple, list[str]] = {}
    for r in results:
        if r["status"] != "ok":
            key = (r["backend"], r["status"], r.get("message") or "")
            groups.setdefault(key, []).append(f"{r['shape']['name']} {r['mode']}")
    runs = {b: sum(r["backend"] == b for r in results) for b in {r["backend"] for r in results}}
    if groups:
        rows = [[_h(b), _status(st), _h(msg),
                 _h(f"all {len(where)} runs" if len(where) == runs[b] > 1 else ", ".join(where))]
                for (b, st, msg), where in groups.items()]  # fmt: skip
        out += ["<h3>Runs without a time</h3>",
                _table(["backend", "status", "message", "where"], rows, raw=True)]  # fmt: skip
    ok = [r for r in results if r["status"] == "ok"]
    if ok:
        rows = [[_h(r["backend"]), _h(_shape_text(r["shape"])), _h(r["mode"]), _num(r["ms"]),
                 _num(r.get("tflops")), _num(r.get("peak_mem_mb")), _h(len(r.get("ms_all") or []))]
                for r in ok]  # fmt: skip
        out += ["<details><summary>All timings</summary>",
                _table(["backend", "shape", "mode", "ms", "TFLOP/s", "peak MB", "repeats"],
                       rows, raw=True), "</details>"]  # fmt: skip
    return _section("bench", out)


def _baseline(doc: dict[str, Any] | None) -> list[str]:
    """The benchmark against its baseline (baseline-compare.json, written by `invoke validate
    --bench`): the verdict, what fell below a gate, and the gated rows; every row collapsed."""
    if doc is None:
        return _section("baseline", [
            "<p>No baseline-compare.json next to this report (<code>invoke validate --bench</code> "
            "writes one when there is a baseline to compare with).</p>"])  # fmt: skip
    rows, base, now = doc.get("rows") or [], doc.get("baseline") or {}, doc.get("now") or {}
    passed = bool(doc.get("passed"))
    out = [f"<p class='{'pass' if passed else 'fail'}'>Baseline gate: "
           f"{'PASS' if passed else 'FAIL'}. Baseline {_h(base.get('source'))} "
           f"({_h(base.get('created'))}); this run {_h(now.get('created'))}. Times are medians "
           "of each result's repeats; ratio = baseline ms / now ms (above 1: faster now).</p>"]  # fmt: skip
    if doc.get("failures"):
        out.append("<ul class='fail'>" + "".join(f"<li>{_h(f)}</li>" for f in doc["failures"])
                   + "</ul>")  # fmt: skip
    notes = [*(doc.get("notes") or []),
             *(f"the gate {g} matched no result of this run" for g in doc.get("unmatched_gates") or [])]  # fmt: skip
    if notes:
        out.append("<ul class='small'>" + "".join(f"<li>{_h(n)}</li>" for n in notes) + "</ul>")
    out += _draw(lambda: plots.baseline_plot(doc))

    def table(picked: list[dict[str, Any]]) -> str:
        cells = [[_h(r["backend"]), _h(r["shape"]), _h(r["mode"]), _num(r.get("baseline_ms"), 4),
                  _num(r.get("now_ms"), 4),
                  _h(f"{r['ratio']:.2f}×" if r.get("ratio") is not None else "—"),
                  _h(f"≥ {r['min_ratio']:g}×" if r.get("gated") else ""),
                  _status("fail" if r["verdict"] == "fail" else "pass")
                  if r["verdict"] in ("pass", "fail") else _h(r["verdict"]), _h(r.get("message"))]
                 for r in picked]  # fmt: skip
        return _table(["backend", "shape", "mode", "baseline ms", "now ms", "ratio", "gate",
                       "verdict", "message"], cells, raw=True)  # fmt: skip

    gated = [r for r in rows if r.get("gated") or r["verdict"] == "fail"]
    if gated:
        out.append(table(gated))
    if rows:
        out += [f"<details><summary>All {len(rows)} rows</summary>", table(rows), "</details>"]
    return _section("baseline", out)


def _training(doc: dict[str, Any] | None) -> list[str]:
    if doc is None:
        return _section("training", [
            "<p>No bench_train.json next to this report (<code>python -m validate bench-train "
            "--json bench_train.json</code> makes one).</p>"])  # fmt: skip
    ref, ratios = plots.train_ratios(doc)
    ratio = {b: x for b, _, x in ratios}
    c = doc.get("config") or {}
    out = [f"<p>{_env_line(doc)} {c.get('steps')} steps after {c.get('warmup')} warm-up, "
           f"seed {c.get('seed')}; the ratio is each backend's median step time over "
           f"{_h(ref)}'s.</p>"]  # fmt: skip
    out += _draw(lambda: plots.train_plot(doc))
    rows = [[_h(r["backend"]), _status(r["status"]), _num(r.get("median_step_ms")),
             _num(ratio.get(r["backend"])), _num(r.get("tokens_per_s"), 4),
             _num(r.get("peak_mem_mb"), 4), _num(r.get("first_loss"), 6), _h(r.get("message"))]
            for r in doc.get("results") or []]  # fmt: skip
    out.append(_table(["backend", "status", "median step ms", f"× {ref}", "tokens/s", "peak MB",
                       "first loss", "message"], rows, raw=True))  # fmt: skip
    lc = doc.get("loss_check")
    if lc:
        out.append(f"<p>Loss check against {_h(lc.get('reference'))} (tolerance "
                   f"{_h(lc.get('tolerance'))}, largest relative difference "
                   f"{_h(_fmt(lc.get('max_rel_diff')))}): {_status('pass' if lc.get('ok') else 'fail')} "
                   f"— {_h(lc.get('message'))}</p>")  # fmt: skip
    return _section("training", out)


def _stress(docs: list[dict[str, Any]]) -> list[str]:
    if not docs:
        return _section("stress", [
            "<p>No stress-*.json next to this report (<code>python -m validate stress "
            "--workload W --json stress-W.json</code> makes one).</p>"])  # fmt: skip
    out = []
    for doc in docs:
        res = f" at {doc['resolution']}" if doc.get("resolution") else ""
        out.append(f"<h3>{_h(doc.get('workload'))}{_h(res)}</h3><p class='small'>{_env_line(doc)} "
                   + "; ".join(_h(_shape_text(s)) for s in doc.get("shapes") or []) + "</p>")  # fmt: skip
        rows = []
        for r in doc.get("runs") or []:
            f = r.get("first_failure")
            first = (f"iteration {f.get('iteration')}: {f.get('kind')} — {f.get('message')}"
                     if f else "")  # fmt: skip
            rows.append([_h(r["backend"]), _status(r["status"]),
                         _h(f"{r.get('iters_completed')}/{r.get('iters_requested')}"),
                         _num(r.get("ms_per_iter")), _h(first),
                         _h("yes" if r.get("serialize") else "no"), _h(r.get("message"))])  # fmt: skip
        out.append(_table(["backend", "status", "iterations", "ms/iter", "first failure",
                           "serialized", "message"], rows, raw=True))  # fmt: skip
    return _section("stress", out)


def _checks(report: dict[str, Any]) -> list[str]:
    rows = [
        [_status(r["status"]) + (" <span class='small'>host-suspect</span>"
                                 if r.get("host_suspect") else ""),
         f"<code>{_h(r['id'])}</code>" + ("" if r.get("required", True) else " (optional)"),
         f"{r.get('duration_s', 0):.1f}s", _h(r.get("message"))]
        for r in report.get("checks", [])
    ]  # fmt: skip
    return _section("checks", [_table(["status", "check", "time", "message"], rows, raw=True)])


def _failures(report: dict[str, Any]) -> list[str]:
    bad = [r for r in report.get("checks", []) if r["status"] in FAILING]
    if not bad:
        return _section("failures", ["<p>No check failed, crashed or timed out.</p>"])
    out = []
    for r in bad:
        out.append(f"<h3 class='{_h(r['status'])}'>{_h(r['id'])}: {_h(r['status'])}</h3>"
                   f"<p>{_h(r.get('message'))}</p>")  # fmt: skip
        if r.get("stderr_tail"):
            out.append("<pre>" + _h("\n".join(r["stderr_tail"])) + "</pre>")
    return _section("failures", out)


def apps_html(report: dict[str, Any]) -> list[str]:
    """The apps section as HTML (its own heading; empty when no apps check ran)."""
    apps = report.get("apps") or {}
    rows, probes = apps.get("models") or [], apps.get("contracts") or []
    if not rows and not probes:
        return []
    out = ["<h2 id='apps'>Apps: their own attention code</h2>",
           "<p>Tiny models built from configs, one forward (and backward where training "
           "matters) per attention implementation, judged against the app's eager/math path by "
           "the grid's rule.</p>"]  # fmt: skip
    if rows:
        body = []
        for r in rows:
            state = "pass" if r.get("ran") else ("fail" if r.get("must_run") else "skip")
            correct = (
                "reference"
                if r.get("reference")
                else {True: "yes", False: "no"}.get(r.get("correct"), "")
            )
            why = r.get("kernel") if r.get("ran") else r.get("reason")
            body.append([_h(f"{r.get('app')} {r.get('app_version') or ''}"), _h(r.get("model")),
                         _h(r.get("impl") or ""),
                         f"<span class='{state}'>{'ran' if r.get('ran') else 'refused'}</span>",
                         _h(correct), _num(r.get("max_abs_err")), _h(why),
                         _h(r.get("source") or "")])  # fmt: skip
        out.append(_table(["app", "model", "implementation", "ran", "correct", "max|err|",
                           "kernel, or why it refused", "kernel from"], body, raw=True))  # fmt: skip
    if probes:
        body = [[f"<code>{_h(p.get('id'))}</code>", f"<code>{_h(p.get('call'))}</code>",
                 _status(p.get("status")), _h(p.get("message")), _h(p.get("source"))]
                for p in probes]  # fmt: skip
        out.append(_table(["contract", "app's call", "status", "what the image has", "source"],
                          body, raw=True))  # fmt: skip
    return out


def _summary(report: dict[str, Any], siblings: dict[str, Any]) -> list[str]:
    s = report.get("summary") or {}
    counts = ", ".join(f"{n} {k}" for k, n in (s.get("counts") or {}).items() if n)
    body = [
        f"<p>{_inline(headline(report))}</p>",
        f"<p>Checks: {_h(counts)} · exit status {_h(s.get('exit_code'))}"
        + (f" · broken expectations: {_h(s['broken_expectations'])}"
           if s.get("broken_expectations") else "") + "</p>",
    ]  # fmt: skip
    if s.get("failed_required"):
        body.append(f"<p class='fail'>Failed required checks: "
                    f"{_h(', '.join(s['failed_required']))}</p>")  # fmt: skip
    broken = [e for e in (report.get("expectations") or {}).get("results", [])
              if e.get("status") == "broken"]  # fmt: skip
    if broken:
        body.append("<p class='fail'>Broken expectations: "
                    + ", ".join(f"<code>{_h(e['key'])}</code>" for e in broken) + "</p>")  # fmt: skip
    left = siblings.get("left_out") or []
    if left:
        body.append("<p class='fail'>Left out of this page, not of this report's run:</p><ul>"
                    + "".join(f"<li><code>{_h(name)}</code>: {_h(why)}</li>" for name, why in left)
                    + "</ul>")  # fmt: skip
    return _section("summary", body)


def _markdown(report: dict[str, Any]) -> list[str]:
    return _section("markdown", [
        "<details><summary>The Markdown summary (report.md, what CI shows)</summary>",
        f"<pre>{_h(to_markdown(report))}</pre></details>",
    ])  # fmt: skip


Section = Callable[[dict[str, Any], dict[str, Any]], list[str]]
# The page, in order: (id, heading, function of the report and its siblings -> HTML lines, the
# first being _section(id, ...)'s). A new section is one function and one entry here.
SECTIONS: list[tuple[str, str, Section]] = [
    ("summary", "Summary", _summary),
    ("environment", "Environment", lambda r, s: _environment(r)),
    ("expectations", "Expectations", lambda r, s: _expectations(r)),
    ("backends", "SDPA backends", lambda r, s: _backends(r)),
    ("layouts", "Layouts, masks and values", lambda r, s: layouts_html(r)),
    ("workloads", "Workloads", lambda r, s: _workloads(r, s.get("bench"))),
    ("workload-fused", "Fused or math at workload shapes", lambda r, s: workloads_html(r)),
    ("kernels", "Kernels seen", lambda r, s: _kernels(r)),
    ("apps", "Apps: their own attention code", lambda r, s: apps_html(r)),
    ("bench", "Benchmark", lambda r, s: _bench(s.get("bench"))),
    ("baseline", "Baseline", lambda r, s: _baseline(s.get("baseline_compare"))),
    ("training", "Training step", lambda r, s: _training(s.get("bench_train"))),
    ("stress", "Stress", lambda r, s: _stress(s.get("stress") or [])),
    ("checks", "Checks", lambda r, s: _checks(r)),
    ("failures", "Failures", lambda r, s: _failures(r)),
    ("markdown", "Markdown summary", lambda r, s: _markdown(r)),
]


def to_html(report: dict[str, Any], siblings: dict[str, Any] | None = None) -> str:
    """The whole page. `siblings`: report.load_siblings()'s bench, bench_train, stress and
    baseline documents (and "left_out", those of another run). Where matplotlib is missing, each
    picture's place says so and the tables stay."""
    siblings = siblings or {}
    s = report.get("summary") or {}
    status = str(s.get("status", "?"))
    target = ""
    if report.get("stack") or report.get("arch"):
        target = f": stack {report.get('stack')} on {report.get('arch')}"
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>Validation {_h(status.upper())}{_h(target)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1 class='{_h(status)}'>Validation {_h(status.upper())}{_h(target)}</h1>",
        "<nav></nav>",  # filled below with the sections that have something to show
    ]
    nav_at = len(parts) - 1
    shown = []
    for sid, title, make in SECTIONS:
        lines = make(report, siblings)
        if lines:  # the sections of other checks (layouts, fused or math, apps) only where they ran
            shown.append((sid, title))
            parts += lines
    parts[nav_at] = (
        "<nav>" + "".join(f"<a href='#{sid}'>{_h(t)}</a>" for sid, t in shown) + "</nav>"
    )
    parts.append(
        f"<footer class='small'><p>Report schema {_h(report.get('schema_version'))}, run "
        f"{_h(report.get('run_id') or '(no run id)')} started {_h(report.get('started_at'))}, "
        f"{_h((report.get('tool') or {}).get('name'))} "
        f"{_h((report.get('tool') or {}).get('version'))}.</p></footer>"
    )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------ layouts and workloads (issue 25)
# Self-contained sections: each reads the report dict and returns its lines.


def _grid_extras(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Backend-matrix rows of the cases beyond contiguous inputs: layouts, masks, head dims over
    256 and large magnitudes."""
    rows = []
    for row in report.get("backend_matrix") or []:
        p = row.get("params") or {}
        if (p.get("layout", "bhsd") != "bhsd" or p.get("mask") or p.get("values", "normal")
                != "normal" or (p.get("head_dim") or 0) > 256):  # fmt: skip
            rows.append(row)
    return rows


def _inputs_text(p: dict[str, Any]) -> str:
    bits = [p.get("layout", "bhsd")]
    if p.get("mask"):
        bits.append(f"mask {p['mask']}")
    if p.get("values", "normal") != "normal":
        bits.append(p["values"])
    bits.append(f"d{p.get('head_dim')} {p.get('dtype')}")
    return ", ".join(bits)


def _notes(rows: list[dict[str, Any]]) -> list[str]:
    return [
        f"{row['case']} / {b}: {e['note']}"
        for row in rows
        for b, e in row["backends"].items()
        if e.get("note")
    ]


def layouts_markdown(report: dict[str, Any]) -> list[str]:
    """'Layouts, masks and values': the grid cases apps' inputs add, per backend."""
    rows = _grid_extras(report)
    if not rows:
        return []
    out = [
        "### Layouts, masks and values apps pass",
        "",
        "| case | inputs | why | " + " | ".join(SDPA_BACKENDS) + " |",
        "|---|---|---|" + "---|" * len(SDPA_BACKENDS),
    ]
    for row in rows:
        p = row.get("params") or {}
        cells = [backend_cell(row["backends"].get(b)) for b in SDPA_BACKENDS]
        out.append(
            f"| {row['case']} | {_md(_inputs_text(p))} | {_md(p.get('why'), 200)} | "
            + " | ".join(cells) + " |"
        )  # fmt: skip
    notes = _notes(rows)
    if notes:
        out += [""] + [f"- {_md(n, 600)}" for n in notes]
    return out + [""]


def layouts_html(report: dict[str, Any]) -> list[str]:
    rows = _grid_extras(report)
    if not rows:
        return []
    body = [
        [_h(row["case"]), _h(_inputs_text(row.get("params") or {})),
         _h((row.get("params") or {}).get("why"))]
        + [_backend_td(row["backends"].get(b)) for b in SDPA_BACKENDS]
        for row in rows
    ]  # fmt: skip
    notes = "".join(f"<li>{_h(n)}</li>" for n in _notes(rows))
    return [
        "<section id='layouts'><h2>Layouts, masks and values apps pass</h2>",
        "<p>Strided views, masks, head dim 512 and large bf16 magnitudes, each backend forced and "
        "judged like the grid above; NaN/Inf fails naming the backend.</p>",
        _table(["case", "inputs", "why", *SDPA_BACKENDS], body, raw=True),
        f"<ul>{notes}</ul>" if notes else "",
        "</section>",
    ]


def _workload_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    rec = next((r for r in report.get("checks", []) if r["id"] == "sdpa.workloads"), None)
    return list(((rec or {}).get("details") or {}).get("shapes") or [])


def _dims(p: dict[str, Any]) -> str:
    return (
        f"b{p.get('b')} h{p.get('h')}/{p.get('hkv')} sq{p.get('sq')} sk{p.get('sk')} "
        f"d{p.get('d')} {p.get('dtype')}{' causal' if p.get('causal') else ''}"
    )


def workloads_markdown(report: dict[str, Any]) -> list[str]:
    """'Fused or math at workload shapes': SDPA's default pick and kernel per workload shape."""
    rows = _workload_rows(report)
    if not rows:
        return []
    out = [
        "### Fused or math at workload shapes",
        "",
        "| workload | shape | dims | default pick | profiler | fused | kernel | run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        kern = (r.get("kernels") or [""])[0]
        out.append(
            f"| {r.get('workload')} | {r.get('shape')} | {_dims(r.get('params') or {})} | "
            f"{r.get('default_backend') or '?'} | {r.get('profiler_backend') or ''} | "
            f"{'✅' if r.get('fused') else '❌ math'} | {_md(kern, 80)} | {_md(r.get('run'), 120)} |"
        )
    return out + [""]


def workloads_html(report: dict[str, Any]) -> list[str]:
    rows = _workload_rows(report)
    if not rows:
        return []
    body = [
        [_h(r.get("workload")), _h(r.get("shape")), _h(_dims(r.get("params") or {})),
         _h(r.get("default_backend") or "?"), _h(r.get("profiler_backend")),
         f"<td class='{'cell-pass' if r.get('fused') else 'cell-bad'}'>"
         f"{'fused' if r.get('fused') else 'math'}</td>",
         _h((r.get("kernels") or [""])[0]), _h(r.get("run"))]
        for r in rows
    ]  # fmt: skip
    return [
        "<section id='workload-fused'><h2>Fused or math at workload shapes</h2>",
        "<p>SDPA's default call at each workload's shapes (shrunk on CPU): the backend PyTorch "
        "picks, the one the profiler saw, and its first kernel. A stack that promised "
        "<code>sdpa.workload.&lt;name&gt;.fused</code> fails where one ran math.</p>",
        _table(
            ["workload", "shape", "dims", "default pick", "profiler", "fused", "kernel", "run"],
            body,
            raw=True,
        ),  # fmt: skip
        "</section>",
    ]
