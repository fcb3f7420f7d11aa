"""invoke validate / invoke report: run the in-image suite with the right device flags, keep its report."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from invoke.exceptions import Exit

from ..console import out, user_errors
from ..errors import UserError
from ..workspace import REPORTS_DIR_ENV, Workspace
from . import (
    ARCH,
    ENGINE,
    NAMESPACE,
    STACK,
    Opt,
    choose_target,
    command,
    nonempty,
    number,
    text,
    writable_folder,
)

if TYPE_CHECKING:  # the library is imported where a task uses it (attnforge/cli/__init__.py)
    from ..baseline import store as baseline_store


def workload_names(root: Path) -> list[str]:
    """The stress workloads, read from the tree's contract/workloads.py (standard library only),
    so that the names are the ones the tree's images carry."""
    path = root / "contract" / "workloads.py"
    spec = importlib.util.spec_from_file_location("_attnforge_workloads", path)
    if spec is None or spec.loader is None:
        raise UserError(f"{path}: cannot be loaded, so --stress cannot check workload names")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    return list(module.names())


def stress_workloads(values: list[str], known: list[str]) -> list[str]:
    """--stress values (repeatable, comma lists) -> workloads in the order given, once each."""
    picked: list[str] = []
    for value in values:
        for name in (v.strip() for v in value.split(",")):
            if not name:
                continue
            if name not in known:
                raise UserError(
                    f"--stress {name}: no such workload",
                    hint=f"choose from {', '.join(w for w in known if w != 'custom')}",
                )
            if name == "custom":
                raise UserError(
                    "--stress custom needs a shape, which invoke validate does not take",
                    hint="run `python -m validate stress --workload custom --shape ...` in the image",
                )
            if name not in picked:
                picked.append(name)
    return picked


def _stress(flag: str, value: str) -> str:
    """One --stress value (a workload or a comma list of them), checked against the tree's."""
    nonempty(flag, value)
    stress_workloads([value], workload_names(Workspace.discover().root))
    return value


def _bench_backend(flag: str, value: str) -> str:
    nonempty(flag, value)
    bench_backends([value])
    return value


def _baseline(flag: str, value: str) -> str:
    """--baseline: a report folder, report.json or bench.json is read now; an image is looked up
    by the task, which asks the engine."""
    from ..baseline import gate
    from ..baseline import store as baseline_store

    nonempty(flag, value)
    if not baseline_store.looks_like_image(value):
        try:
            gate.load_bench(gate.bench_file(value))
        except gate.BaselineError as exc:
            raise UserError(f"{flag}: {exc}") from None
    return value


BENCH_ONLY = ", which runs the benchmark it is about"


def print_summary(report_path: Path) -> None:
    """Print the suite's Markdown summary up to its first collapsed details block (the full text,
    which CI puts in a step summary, stays in report.md)."""
    md = report_path.with_name("report.md")
    if md.exists():
        text = md.read_text().split("<details>", 1)[0].rstrip()
        out.print(text, markup=False, highlight=False)
        out.print(f"(full summary: {md})")


@command(
    options={
        "arch": ARCH,
        "stack": STACK,
        "image": text("IMAGE"),
        "timeout": number("SECONDS"),
        "engine": ENGINE,
        "namespace": NAMESPACE,
        "stress": Opt("WORKLOAD[,WORKLOAD...]", _stress, repeatable=True),
        "stress_iters": number("N"),
        "baseline": Opt("PATH|IMAGE", _baseline),
        "bench_backend": Opt("BACKEND[,BACKEND...]", _bench_backend, repeatable=True),
    },  # fmt: skip
    writes=("reports",),
    goes_with={"baseline": ("bench", BENCH_ONLY), "bench_backend": ("bench", BENCH_ONLY)},
    help={
        "arch": "arch of the image to validate (default: the host's AMD GPU, else cpu)",
        "stack": "stack whose final image to validate (default: as for build)",
        "image": "validate this image instead of the stack's final tag",
        "local": "run the suite with this Python on this host instead of in an image",
        "quick": "fewer cases (a smoke-level run)",
        "timeout": "seconds each check may run before it counts as a timeout",
        "engine": "container engine: docker (default) or podman",
        "namespace": "image name prefix the stack was built under (default: attnforge)",
        "bench": "after the suite, time every backend (python -m validate bench and bench-train; "
        "smaller with --quick): bench.json, bench_train.json",
        "stress": "after the suite, stress every backend at a workload's shapes: qwen-image, "
        "sd15, sdxl or llm (repeatable, or a comma list): stress-<workload>.json",
        "stress_iters": "iterations per backend for --stress (default 100; 10 with --quick)",
        "baseline": "with --bench: compare the benchmark with this one and apply the stack's "
        "bench_gates: a report folder, report.json, bench.json, or an image published with "
        "`invoke publish` (default: the kept last passing run, reports/<arch>/<stack>/baseline/)",
        "bench_backend": "with --bench: time only this backend (repeatable, or a comma list; "
        "default all), e.g. kernels",
        "debug": "show tracebacks",
    },
)
@user_errors
def validate(
    c, arch=None, stack=None, image=None, local=False, quick=False, timeout=None, engine="docker",
    namespace="attnforge", bench=False, stress=None, stress_iters=None, baseline=None,
    bench_backend=None, debug=False,
):  # fmt: skip
    """Run the validation suite in the stack's image; writes reports/<arch>/<stack>/report.{json,md}.

    With --bench and --stress, the benchmarks and stress runs follow in the same image and land
    beside the report; --bench compares with the baseline and fails below the stack's gates. The
    last report stays in place until this run has written a complete new one; so do the last
    bench and stress documents, and the kept baseline moves only after a run that passed."""
    from ..recipes import load_recipes
    from ..validation import execute, tool_runs

    ws = Workspace.discover()
    recipes = load_recipes(ws.root)
    arch, stack = choose_target(recipes, arch, stack)
    timeout = timeout or 0
    workloads = stress_workloads(list(stress or []), workload_names(ws.root) if stress else [])
    runs = tool_runs(
        bench, workloads, quick, tiny=recipes.arches[arch].vendor == "cpu", timeout=timeout,
        stress_iters=stress_iters or (10 if quick else 100),
        backends=bench_backends(list(bench_backend or [])),
    )  # fmt: skip
    v, eng, ref = _planned(ws, recipes, arch, stack, image, local, engine, namespace, quick,
                           timeout, runs, bench, baseline)  # fmt: skip
    if local:
        out.print(f"running the suite on this host: {' '.join(eng.argv(v.suite))}")
    else:
        out.print(f"validating {ref} ({arch}, stack {stack})")

    def progress(event: str, detail: str) -> None:
        if event == "tool":
            out.print(f"running {detail}")
        else:
            out.print(f"  {detail}", markup=False, highlight=False)

    result = execute(v, eng, progress)
    _print_outcome(result, v.reports, runs, ws.root)
    if not result.passed:
        raise Exit(code=result.code or 1)


def _planned(ws, recipes, arch, stack, image, local, engine, namespace, quick, timeout, runs,
             bench, baseline):  # fmt: skip
    """(the Validation, its engine, the image) with everything that can fail checked before a
    file is touched: the plan, the engine, the image, the baseline."""
    from ..engine import LocalEngine, connect
    from ..plan import Options, resolve
    from ..validation import device_flags, plan_validation, report_target, stack_gates, thread_env

    plan = resolve(recipes, arch, stack, Options(namespace=namespace))
    if plan.blocked_by and not (local or image):
        first = plan.blocked_by[0]
        raise UserError(
            f"stack {stack} has no image for {arch}: layer {first.layer} is unsupported: {first.reason}"
        )
    eng = LocalEngine(ws.root) if local else None
    ref, flags = None, None
    if not local:
        flags = device_flags(recipes.arches[arch].vendor)
        eng = connect(engine)
        ref = image or plan.final_tag
        if not ref or eng.image_id(ref) is None:
            raise UserError(
                f"image {ref} not found",
                hint=f"build it first: invoke build --arch {arch} --stack {stack}",
            )
    reports, expect = report_target(recipes, plan, ws.reports_for(arch, stack), in_image=not local)
    base = find_baseline(baseline, reports, ws, engine) if bench else None
    gates, min_ratio = stack_gates(recipes, stack)
    from validate.report import new_run_id  # the suite's own: stdlib only

    # In an image: the engine's name, and the host's thread caps (--local inherits them anyway).
    env = {} if local else {"ATTNFORGE_ENGINE": eng.describe(), **thread_env()}
    v = plan_validation(
        reports, expect, image=ref, quick=quick, timeout=timeout, runs=runs, flags=flags, env=env,
        bench=bench, base=base, gates=gates, min_ratio=min_ratio, run_id=new_run_id(),
    )  # fmt: skip
    return v, eng, ref


def _print_outcome(result, reports: Path, runs, root: Path) -> None:
    """The report, the tools' documents, the baseline's comparison and the verdict."""
    from ..baseline import store as baseline_store

    report = reports / "report.json"
    refresh_page(report, root)
    print_summary(report)
    out.print(f"report: {report}")
    for t in runs:
        if (reports / t.output).exists():
            out.print(f"{t.name}: {reports / t.output}")
    if result.compared:
        print_comparison(result.compared, reports)
    if result.benched:
        if result.kept:
            out.print(f"kept as the baseline of the next --bench run: {result.kept}", markup=False)
        elif baseline_store.kept_dir(reports) is not None:
            out.print("the kept baseline is unchanged: this run did not pass", markup=False)
    if result.code != 0:
        out.print(f"[bold red]validation failed[/] (exit {result.code})")
    for sentence in result.failures:
        out.print(sentence, style="bold red", markup=False, highlight=False)


def render(report: Path, root: Path, html: bool) -> subprocess.CompletedProcess:
    """`python -m validate render` (the suite's own renderer) of report.json into report.md and,
    with `html`, report.html beside it."""
    argv = [sys.executable, "-m", "validate", "render", str(report), "--md",
            str(report.with_suffix(".md"))]  # fmt: skip
    if html:
        argv += ["--html", str(report.with_suffix(".html"))]
    return subprocess.run(argv, cwd=root, capture_output=True, text=True)


def refresh_page(report: Path, root: Path) -> None:
    """A report.html older than the report.json beside it (drawn by `invoke report --html` for
    an earlier run) is drawn again, so that the page never shows another run than the report;
    where it cannot be drawn it is removed, and both are said."""
    page = report.with_suffix(".html")
    if not page.is_file() or page.stat().st_mtime >= report.stat().st_mtime:
        return
    proc = render(report, root, html=True)
    if proc.returncode == 0:
        out.print(f"page: {page} (drawn again for this run)", markup=False, highlight=False)
        return
    page.unlink(missing_ok=True)
    why = (proc.stderr.strip() or f"exit {proc.returncode}").splitlines()[-1]
    out.print(f"removed {page}, which showed the previous run: it could not be drawn again "
              f"({why}); `invoke report --html` draws it", style="yellow", markup=False,
              highlight=False)  # fmt: skip


def bench_backends(values: list[str]) -> tuple[str, ...]:
    """--bench-backend values (repeatable, comma lists) -> backend names, checked against the
    bench's own list when the validate package is importable here."""
    from ..recipes import known_bench_backends

    known = known_bench_backends()
    picked: list[str] = []
    for name in (v.strip() for value in values for v in value.split(",")):
        if not name:
            continue
        if known is not None and name not in known:
            raise UserError(f"--bench-backend {name}: no such backend",
                            hint=f"choose from {', '.join(known)}")  # fmt: skip
        if name not in picked:
            picked.append(name)
    return tuple(picked)


def find_baseline(
    given: str | None, reports: Path, ws: Workspace, engine: str
) -> baseline_store.Baseline | None:
    """--baseline's benchmark, else the kept one of this arch and stack, else None (said)."""
    from ..baseline import gate
    from ..baseline import store as baseline_store
    from ..engine import connect

    if given:
        engines: dict[str, object] = {}

        def eng():
            if "engine" not in engines:
                engines["engine"] = connect(engine)
            return engines["engine"]

        found = baseline_store.resolve(
            given, ws.reports_dir, image_id=lambda ref: eng().image_id(ref),
            registry_digest=lambda ref: eng().registry_digest(ref),
        )  # fmt: skip
        out.print(f"baseline: {found.source}", markup=False, highlight=False)
        return found
    kept = baseline_store.kept_dir(reports)
    if kept is None:
        out.print(f"no baseline for this arch and stack yet ({reports / baseline_store.KEPT}): "
                  "this run's benchmark becomes it if the run passes", markup=False)  # fmt: skip
        return None
    try:
        bench_doc = gate.load_bench(kept)
    except gate.BaselineError as exc:
        out.print(f"the kept baseline cannot be read ({exc}); comparing with nothing, and a "
                  "passing run replaces it", style="yellow", markup=False)  # fmt: skip
        return None
    out.print(f"baseline: the last passing run, {kept}", markup=False, highlight=False)
    return baseline_store.Baseline(bench_doc, f"the kept baseline ({kept})", kept)


def print_comparison(doc: dict, reports: Path) -> None:
    from ..baseline import gate
    from ..validation import COMPARE_OUTPUTS

    if "rows" not in doc:
        return
    out.print("\n".join(gate.table_lines(doc)), markup=False, highlight=False, soft_wrap=True)
    for note in doc["notes"]:
        out.print(f"note: {note}", style="yellow", markup=False, highlight=False)
    for unmatched in doc["unmatched_gates"]:
        out.print(f"note: the gate {unmatched} matched no result of this run", style="yellow",
                  markup=False, highlight=False)  # fmt: skip
    out.print(gate.headline(doc), style="green" if doc["passed"] else "bold red", markup=False,
              highlight=False)  # fmt: skip
    out.print(f"comparison: {reports / COMPARE_OUTPUTS[0]} (and .md)", markup=False)


@command(
    options={"path": text("FILE", positional=True), "arch": ARCH, "stack": STACK},
    help={
        "path": "the report.json to render, also given without the flag: invoke report FILE "
        "(default: the one of --arch and --stack)",
        "arch": "find the report under reports/<arch>/<stack>/ (default: as for validate)",
        "stack": "with --arch (default: the arch's default stack)",
        "html": "also write report.html next to it",
        "debug": "show tracebacks",
    },
)
@user_errors
def report(c, path=None, arch=None, stack=None, html=False, debug=False):
    """Render a validation report to Markdown (and HTML) with the suite's own renderer."""
    from ..recipes import load_recipes

    ws = Workspace.discover()
    if path is None:
        arch, stack = choose_target(load_recipes(ws.root), arch, stack)
        path = ws.reports_for(arch, stack) / "report.json"
        if not path.is_file():
            raise UserError(
                f"{path}: no such report",
                hint=f"run `invoke validate --arch {arch} --stack {stack}` first "
                f"(reports live under ${REPORTS_DIR_ENV}, default reports/)",
            )
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such report")
    writable_folder(path.parent, "the report's folder")
    proc = render(path, ws.root, html)
    if proc.returncode != 0:
        raise UserError(f"rendering {path} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    for line in proc.stderr.strip().splitlines():  # siblings left out, pictures not drawn
        out.print(line, style="yellow", markup=False, highlight=False)
    if html:  # the page is what was asked for: its path, not the Markdown again
        out.print(f"wrote {path.with_suffix('.html')} (and {path.with_suffix('.md')})",
                  markup=False, highlight=False)  # fmt: skip
        return
    out.print(path.with_suffix(".md").read_text(), markup=False, highlight=False)
