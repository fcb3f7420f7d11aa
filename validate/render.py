"""Render a report as Markdown (CI step summary) or as a self-contained HTML page."""

from __future__ import annotations

import html
from typing import Any

from validate.grid import BACKENDS
from validate.runner import FAILING

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
    if fp:
        gpus = ", ".join(g["arch"] for g in fp.get("gpus") or []) or "none seen"
        hsa = fp.get("hsa_override_gfx_version") or {}
        hsa_text = hsa.get("state", "?") + (f" ({hsa['value']!r})" if "value" in hsa else "")
        kfd = next((d for d in fp.get("devices") or [] if d["path"].endswith("/kfd")), {})
        access = ("readable" if kfd.get("readable") else "not readable") if kfd.get("exists") \
            else "absent"  # fmt: skip
        out.append(
            f"- host: Linux {fp.get('kernel')}, GPUs {gpus}, amdgpu {fp.get('amdgpu_driver') or '?'}, "
            f"HSA_OVERRIDE_GFX_VERSION {hsa_text}, /dev/kfd {access}, groups "
            f"{', '.join(fp.get('groups') or []) or '-'}"
            + (f", engine {fp['engine']}" if fp.get("engine") else "")
        )
    return [*out, ""] if out else []


def to_markdown(report: dict[str, Any]) -> str:
    s = report.get("summary") or {}
    status = str(s.get("status", "?")).upper()
    title = f"## {ICON.get(s.get('status'), '')} Validation {status}"
    if report.get("stack") or report.get("arch"):
        title += f": stack `{report.get('stack')}` on `{report.get('arch')}`"
    out = [title, "", headline(report), ""]
    counts = s.get("counts") or {}
    out.append(
        "Checks: "
        + ", ".join(f"{n} {k}" for k, n in counts.items() if n)
        + f" · exit status {s.get('exit_code')}"
    )
    out.append("")

    out += _host_lines(report)

    exp = report.get("expectations")
    if exp:
        out += [
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
        out.append("")

    out += ["### Checks", "", "| status | check | time | message |", "|---|---|---|---|"]
    for r in report.get("checks", []):
        req = "" if r.get("required", True) else " (optional)"
        suspect = " · host-suspect" if r.get("host_suspect") else ""
        out.append(
            f"| {ICON.get(r['status'], '')} {r['status']}{suspect} | `{r['id']}`{req} | "
            f"{r.get('duration_s', 0):.1f}s | {_md(r.get('message'))} |"
        )
    out.append("")

    matrix = report.get("backend_matrix") or []
    if matrix:
        out += [
            "### SDPA backends",
            "",
            "Forced run per backend: ✅/❌ max|err| / tolerance (flash-attention rule: 2× the "
            "same-dtype math error + rounding floor); — = refused; 💥 = GPU fault; 💥 deferred = "
            "the run returned, but the checked op after it failed.",
            "",
            "| case | default pick | profiler | " + " | ".join(BACKENDS) + " |",
            "|---|---|---|" + "---|" * len(BACKENDS),
        ]
        for row in matrix:
            cells = [backend_cell(row["backends"].get(b)) for b in BACKENDS]
            out.append(
                f"| {row['case']} | {row.get('default_backend') or '?'} | "
                f"{row.get('profiler_backend') or ''} | " + " | ".join(cells) + " |"
            )
        out.append("")
        ref = next(
            (r for r in matrix if any(b.get("reasons") for b in r["backends"].values())), None
        )
        if ref:
            out += ["<details><summary>Why backends were refused (PyTorch's reasons)</summary>", ""]
            for row in matrix:
                for b, e in row["backends"].items():
                    if e.get("reasons"):
                        out.append(f"- {row['case']} / {b}: " + _md("; ".join(e["reasons"]), 600))
            out += ["", "</details>", ""]
        kern = [r for r in matrix if r.get("default_kernels")]
        if kern:
            out += ["<details><summary>Kernels the profiler saw (default pick)</summary>", ""]
            for row in kern:
                out.append(
                    f"- {row['case']}: "
                    + ", ".join(f"`{_md(k, 120)}`" for k in row["default_kernels"][:6])
                )
            out += ["", "</details>", ""]

    bad = [r for r in report.get("checks", []) if r["status"] in FAILING]
    if bad:
        out += ["### Failures", ""]
        for r in bad:
            out.append(f"- **{r['id']}** {r['status']}: {_md(r.get('message'), 1000)}")
            lines = r.get("stderr_tail") or []
            if lines:
                out += ["  <details><summary>last stderr lines</summary>", "", "  ```"]
                out += [f"  {ln}" for ln in lines[-12:]]
                out += ["  ```", "  </details>"]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _h(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _table(head: list[str], rows: list[list[str]], raw: bool = False) -> str:
    th = "".join(f"<th>{_h(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{c if raw else _h(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def to_html(report: dict[str, Any]) -> str:
    s = report.get("summary") or {}
    status = str(s.get("status", "?"))
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Validation {_h(status)} {_h(report.get('stack') or '')} {_h(report.get('arch') or '')}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}"
        ".pass{color:#070}.fail,.crash,.timeout,.broken{color:#b00}.skip{color:#777}"
        "pre{background:#f5f5f5;padding:8px;overflow:auto}</style></head><body>",
        f"<h1 class='{_h(status)}'>Validation {_h(status.upper())}</h1>",
        f"<p>{_h(headline(report))}</p>",
    ]
    if report.get("stack") or report.get("arch"):
        parts.append(
            f"<p>stack <code>{_h(report.get('stack'))}</code> on <code>{_h(report.get('arch'))}</code></p>"
        )
    exp = report.get("expectations")
    if exp:
        parts.append(f"<h2>Expectations</h2><p>{_h(exp.get('file'))}</p>")
        rows = [
            [
                f"<span class='{_h(e['status'])}'>{_h(e['status'])}</span>",
                f"<code>{_h(e['key'])}</code>",
                _h(_value(e["expected"])),
                _h(_value(e["observed"])),
                _h(e["message"]),
            ]
            for e in exp.get("results", [])
        ]
        parts.append(_table(["status", "key", "promised", "seen", "message"], rows, raw=True))
    rows = [
        [
            f"<span class='{_h(r['status'])}'>{_h(r['status'])}</span>",
            f"<code>{_h(r['id'])}</code>",
            f"{r.get('duration_s', 0):.1f}s",
            _h(r.get("message")),
        ]
        for r in report.get("checks", [])
    ]
    parts += ["<h2>Checks</h2>", _table(["status", "check", "time", "message"], rows, raw=True)]
    matrix = report.get("backend_matrix") or []
    if matrix:
        rows = [
            [row["case"], row.get("default_backend") or "?", row.get("profiler_backend") or ""]
            + [backend_cell(row["backends"].get(b)) for b in BACKENDS]
            for row in matrix
        ]
        parts += [
            "<h2>SDPA backends</h2>",
            _table(["case", "default pick", "profiler", *BACKENDS], rows),
        ]
        reasons = [
            f"<li>{_h(row['case'])} / {_h(b)}: {_h('; '.join(e['reasons']))}</li>"
            for row in matrix
            for b, e in row["backends"].items()
            if e.get("reasons")
        ]
        if reasons:
            parts.append("<h3>Why backends were refused</h3><ul>" + "".join(reasons) + "</ul>")
        kern = [
            f"<li>{_h(row['case'])}: {_h(', '.join(row['default_kernels'][:6]))}</li>"
            for row in matrix
            if row.get("default_kernels")
        ]
        if kern:
            parts.append("<h3>Kernels the profiler saw</h3><ul>" + "".join(kern) + "</ul>")
    bad = [r for r in report.get("checks", []) if r["status"] in FAILING]
    if bad:
        parts.append("<h2>Failures</h2>")
        for r in bad:
            parts.append(
                f"<h3 class='{_h(r['status'])}'>{_h(r['id'])}: {_h(r['status'])}</h3><p>{_h(r.get('message'))}</p>"
            )
            if r.get("stderr_tail"):
                parts.append("<pre>" + _h("\n".join(r["stderr_tail"])) + "</pre>")
    env = report.get("environment") or {}
    if env.get("env"):
        rows = [[k, v] for k, v in env["env"].items()]
        parts += ["<h2>Attention-related environment</h2>", _table(["variable", "value"], rows)]
    parts.append(
        f"<p><small>schema {_h(report.get('schema_version'))}, {_h(report.get('started_at'))}</small></p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
