"""Command line: ``python -m validate [env|backends|flash-attn|kernels|all|render] ...``."""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from validate import __version__, argtypes, host, plots, render, report, suite
from validate.expect import KNOWN_KEYS, ExpectError, evaluate, load_expect

DESCRIPTION = """\
Validate the attention stack of this Python environment: which SDPA backend really runs,
whether it is right, flash_attn and the bundled kernels. Checks run in long-lived worker
processes that import torch once; a crash or hang becomes that check's result, its worker is
replaced, and the run goes on (--isolate: one process per check).

exit status: 0 every required check passed (or skipped) and every expectation held;
1 a required check failed/crashed/timed out or an expectation was broken; 2 usage error."""

RUN_EPILOG = "\n".join(
    [
        '--expect FILE is JSON: {"stack": "default", "arch": "gfx1151",',
        '  "expect": {"sdpa.default_backend": "flash", "rocm.effective_fa_library": "aotriton"}}',
        textwrap.fill("keys: " + ", ".join(KNOWN_KEYS), 88, subsequent_indent="  "),
        "(one-line meanings: validate/expect.py KNOWN_KEYS, docs/validation.md)",
    ]
)

COMMAND_HELP = {
    "env": "versions, device, attention-related environment variables",
    "backends": "SDPA backends over the case grid (+ env)",
    "flash-attn": "the flash_attn package (+ env)",
    "kernels": "the bundled kernels package (+ env)",
    "apps": "transformers/diffusers attention implementations on tiny models, and the ComfyUI "
    "and vLLM contract probes (+ env)",
    "all": "everything (default)",
}


# Commands that are not check runs: each module has HELP (one line), add_arguments(parser)
# and main(args) -> exit status, and imports only the standard library at module level (the
# parser is built before anything knows whether torch is installed).
TOOLS = {
    "stress": "validate.stress",
    "bench": "validate.bench",
    "bench-train": "validate.bench_train",
}


def _tool(modname: str):
    import importlib

    return importlib.import_module(modname)


class UsageError(Exception):
    """A mistake in how the tool was called; reported in one sentence with exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2; keep that, add a hint
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\nTry '{self.prog} --help'.\n")


def _positive(text: str) -> float:
    return argtypes.seconds(text, "the timeout must be more than 0 seconds")


def _workers(text: str) -> int:
    return argtypes.positive_int(text, "at least 1 worker is needed")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m validate",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"validate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in suite.COMMANDS:
        p = sub.add_parser(
            name,
            help=COMMAND_HELP[name],
            description=COMMAND_HELP[name],
            epilog=RUN_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--json", metavar="PATH", help="write the report as JSON")
        p.add_argument("--md", metavar="PATH", help="write the report as Markdown")
        p.add_argument("--expect", metavar="FILE", help="JSON expectations to hold the stack to")
        p.add_argument("--quick", action="store_true", help="fewer cases, for CI and smoke tests")
        p.add_argument(
            "--timeout",
            type=_positive,
            default=300.0,
            metavar="SECONDS",
            help="per-check timeout (default 300)",
        )
        p.add_argument(
            "--workers",
            type=_workers,
            default=1,
            metavar="N",
            help="check workers running at once (default 1: on one GPU a second worker rarely "
            "helps and skews timings)",
        )
        p.add_argument(
            "--isolate",
            action="store_true",
            help="run every check in a fresh process of its own, as before the worker pool "
            "(slower; for debugging a check that behaves differently in a shared worker)",
        )
        p.add_argument(
            "--only",
            metavar="GLOB",
            action="append",
            help="run only checks whose id matches (repeatable), e.g. 'sdpa.case.*'",
        )
        p.add_argument(
            "--skip",
            metavar="GLOB",
            action="append",
            help="leave out checks whose id matches (repeatable), e.g. 'kernels.case.*'",
        )
    for name, modname in TOOLS.items():
        try:
            mod = _tool(modname)
        except ModuleNotFoundError as exc:
            if exc.name != modname:
                raise
            continue
        t = sub.add_parser(
            name,
            help=mod.HELP,
            description=getattr(mod, "DESCRIPTION", mod.HELP),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(t)
    r = sub.add_parser(
        "render",
        help="render a report.json as Markdown and/or HTML",
        description="Render a report.json as Markdown and/or a self-contained HTML page. The "
        "page also draws bench.json, bench_train.json, stress-*.json and baseline-compare.json "
        "found next to the report when they are of the report's run (the others are named and "
        "left out). Pictures need matplotlib; without it the page keeps its tables.",
    )
    r.add_argument("report", metavar="REPORT_JSON")
    r.add_argument("--md", metavar="PATH", help="write Markdown here ('-' for stdout)")
    r.add_argument("--html", metavar="PATH", help="write HTML here ('-' for stdout)")
    return parser


def _write(text: str, path: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")  # the old file stays until this one is whole
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)


def check_writable(path: str | None, flag: str) -> None:
    """Refuse an output path that cannot be written before spending minutes on checks."""
    if not path or path == "-":
        return
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name.")
    probe = target.parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{flag} {path}: {probe} is not a directory.")
    if not os.access(probe, os.W_OK):
        raise UsageError(f"{flag} {path}: directory {probe} is not writable.")


def cmd_render(args: argparse.Namespace) -> int:
    if not args.md and not args.html:
        raise UsageError("render needs --md PATH and/or --html PATH.")
    try:
        data = report.load(args.report)
        siblings = report.load_siblings(args.report, data) if args.html else {}
    except report.ReportError as exc:
        raise UsageError(str(exc)) from None
    check_writable(args.md, "--md")
    check_writable(args.html, "--html")
    try:
        if args.md:
            _write(render.to_markdown(data), args.md)
        if args.html:
            _write(render.to_html(data, siblings), args.html)
    except OSError as exc:
        raise UsageError(f"cannot write: {exc}") from None
    if args.html:
        for name, why in siblings.get("left_out") or []:
            print(f"render: left out {name}: {why}", file=sys.stderr)
        try:
            plots.available()
        except plots.PlotsUnavailable as exc:
            print(f"render: wrote {args.html} without its pictures: {exc}", file=sys.stderr)
    return 0


def _print_record(rec: dict[str, Any]) -> None:
    req = "" if rec.get("required", True) else " (optional)"
    line = f"{rec['status']:>7}  {rec['id']}{req}  ({rec.get('duration_s', 0):.1f}s)  {rec.get('message', '')}"
    print(line[:400], flush=True)


def cmd_run(args: argparse.Namespace, argv: list[str]) -> int:
    """`python -m validate all|sdpa|...`: plan the checks, run them, judge the expectations,
    write the report; the exit status says how it went."""
    check_writable(args.json, "--json")
    check_writable(args.md, "--md")
    spec = _load_spec(args.expect)
    try:
        checks = suite.plan(
            args.command,
            args.quick,
            *((spec.sdpa_limits, spec.aotriton, spec.arch) if spec else ()),
        )
    except (OSError, ValueError, SyntaxError, KeyError) as exc:
        raise UsageError(f"{suite.EXTRA_CHECKS_ENV}: {exc}") from None
    started_at = report.now()
    t0 = time.monotonic()
    records = _run_checks(args, checks, _selection(args.only, args.skip))
    obs = suite.observations(records)
    expectations, broken = _judge(spec, obs, records, args.command)
    code = suite.exit_code(records, broken)
    fp = host.fingerprint()
    warnings = host.host_warnings(fp, list(spec.host_rules) if spec else [], spec and spec.arch)
    for w in warnings:
        print(f"   HOST  {w['warning']}; fix: {w['fix']} ({w['source']})", flush=True)
    doc = report.build(
        host={"fingerprint": fp, "warnings": warnings},
        aotriton=spec.aotriton if spec else None,
        command=args.command,
        argv=argv,
        quick=args.quick,
        started_at=started_at,
        duration_s=time.monotonic() - t0,
        records=records,
        observations=obs,
        expectations=expectations,
        exit_code=code,
    )
    _write_reports(doc, args.json, args.md)
    s = doc["summary"]
    counts = ", ".join(f"{n} {k}" for k, n in s["counts"].items() if n)
    print(f"validate: {s['status'].upper()} ({counts}; {broken} broken expectation(s))", flush=True)
    return code


def _load_spec(path: str | None):
    """--expect's expectations, or None; a bad file is a usage error."""
    if not path:
        return None
    try:
        return load_expect(path)
    except ExpectError as exc:
        raise UsageError(str(exc)) from None


def _selection(include: list[str] | None, exclude: list[str] | None):
    """--only/--skip as a predicate on check ids, or None when every check runs."""
    if not include and not exclude:
        return None
    include, exclude = list(include or ["*"]), list(exclude or [])

    def only(cid: str) -> bool:
        return any(fnmatch.fnmatchcase(cid, p) for p in include) and not any(
            fnmatch.fnmatchcase(cid, p) for p in exclude
        )

    return only


def _run_checks(args: argparse.Namespace, checks: list, only) -> list:
    """Run the checks: one subprocess each (--isolate), or on a pool of check workers whose
    slow imports start early."""
    how = (
        "one subprocess per check (--isolate)"
        if args.isolate
        else f"{args.workers} check worker{'s' if args.workers > 1 else ''}"
    )
    print(f"validate {args.command}{' --quick' if args.quick else ''}: {how}", flush=True)
    if args.isolate:
        return suite.execute(
            checks, args.timeout, only=only, on_record=_print_record, workers=args.workers
        )
    from validate.pool import Pool

    with Pool(workers=args.workers) as pool:
        for key, steps in suite.early_starts([c for c in checks if only is None or only(c["id"])]):
            pool.start_early(key, steps)
        return suite.execute(
            checks,
            args.timeout,
            only=only,
            on_record=_print_record,
            runner=pool.run,
            workers=args.workers,
        )


def _judge(spec, obs: dict, records: list, command: str) -> tuple[dict | None, int]:
    """(the expectations section of the report, how many broke); (None, 0) without --expect."""
    if spec is None:
        return None, 0
    results = evaluate(spec.expect, obs, suite.missing_reasons(records, command),
                       in_image=spec.in_image, aotriton=spec.aotriton)  # fmt: skip
    for r in results:
        print(f"{'met' if r.met else 'BROKEN':>7}  expect {r.key}: {r.message}", flush=True)
    section = {
        "file": spec.name,
        "stack": spec.stack,
        "arch": spec.arch,
        "results": [r.to_json() for r in results],
    }
    return section, sum(not r.met for r in results)


def _write_reports(doc: dict, json_path: str | None, md_path: str | None) -> None:
    try:
        if json_path:
            report.write_json(doc, json_path)
        if md_path:
            _write(render.to_markdown(doc), md_path)
    except OSError as exc:
        raise UsageError(f"cannot write the report: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    full = argv
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        full = ["all", *argv]
    parser = build_parser()
    args = parser.parse_args(full)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "render":
            return cmd_render(args)
        if args.command in TOOLS:
            return _tool(TOOLS[args.command]).main(args)
        return cmd_run(args, argv)
    except UsageError as exc:
        print(f"python -m validate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("python -m validate: interrupted", file=sys.stderr)
        return 130
